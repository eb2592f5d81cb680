// Which int8 unit int8 precision uses: the CPU's, if it has one, and the
// switch that turns it off for tests.
#include "kernels/int8_unit.hpp"

#include <atomic>

#include "kernels/attention_kernel.hpp"

namespace attn::kernels {
namespace {
std::atomic<bool> int8_unit_on{true};
}  // namespace

const Int8Unit* cpu_int8_unit() {
  if (const Int8Unit* unit = avx512_vnni_unit()) return unit;
  return arm_dotprod_unit();
}

const Int8Unit* int8_unit() { return int8_unit_on.load(std::memory_order_relaxed) ? cpu_int8_unit() : nullptr; }

const char* int8_prefill_unit() {
  const Int8Unit* unit = int8_unit();
  return unit ? unit->name : "highway";
}

void set_int8_unit_use(bool use) { int8_unit_on.store(use, std::memory_order_relaxed); }

double int8_peak_loop(int64_t iterations, float* sink) {
  const Int8Unit* unit = cpu_int8_unit();
  return unit ? unit->peak_loop(iterations, sink) : 0.0;
}

}  // namespace attn::kernels
