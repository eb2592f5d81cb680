// Which bf16 unit this CPU has, and the switch that turns it off for tests.
#include "kernels/bf16_unit.hpp"

#include <atomic>
#include <cstring>

#include "kernels/attention_kernel.hpp"

namespace attn::detail {
namespace {
std::atomic<bool> unit_enabled{true};
}  // namespace

const BF16Unit* bf16_unit() {
  if (!unit_enabled.load(std::memory_order_relaxed)) return nullptr;
  if (const BF16Unit* unit = avx512_bf16_unit()) return unit;
  return arm_bf16_unit();
}

void set_bf16_unit_enabled(bool enabled) { unit_enabled.store(enabled, std::memory_order_relaxed); }

double bf16_peak_loop(int64_t iterations, float* sink) {
  // (Only where the prefill uses the unit: not on a SIMD target it does not fit.)
  const BF16Unit* unit = bf16_unit();
  return unit && std::strcmp(bf16_prefill_unit(), unit->name) == 0 ? unit->peak_loop(iterations, sink) : 0.0;
}

}  // namespace attn::detail
