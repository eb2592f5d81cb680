// Which bf16 unit this CPU has, and the switch that turns it off for tests.
#include "kernels/bf16_unit.hpp"

#include <atomic>

#include "kernels/attention_kernel.hpp"

namespace attn::detail {
namespace {
std::atomic<bool> unit_enabled{true};
}  // namespace

const BF16Unit* bf16_unit() {
  if (!unit_enabled.load(std::memory_order_relaxed)) return nullptr;
#if defined(__x86_64__)
  return avx512_bf16_unit();
#else
  return nullptr;
#endif
}

void set_bf16_unit_enabled(bool enabled) { unit_enabled.store(enabled, std::memory_order_relaxed); }

double bf16_peak_loop(int64_t iterations, float* sink) {
  const BF16Unit* unit = bf16_unit();
  return unit ? unit->peak_loop(iterations, sink) : 0.0;
}

}  // namespace attn::detail
