// Which bf16 unit bf16 precision (and int8's P·V) uses: the CPU's, where a measurement says
// it outruns the float32 FMAs; and the switch that forces the choice for tests.
#include "kernels/bf16_unit.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>

#include "kernels/attention_kernel.hpp"
#include "kernels/config.hpp"

namespace attn::kernels {
namespace {
std::atomic<BF16UnitUse> unit_use{BF16UnitUse::Measured};

// FLOP/s of one short run of `loop` (about 0.1 ms).
double rate(double (*loop)(int64_t, float*)) {
  float sink;
  const auto start = std::chrono::steady_clock::now();
  const double flops = loop(20'000, &sink);
  const std::chrono::duration<double> s = std::chrono::steady_clock::now() - start;
  return flops / std::max(s.count(), 1e-9);
}
}  // namespace

const BF16Unit* cpu_bf16_unit() {
  if (const BF16Unit* unit = avx512_bf16_unit()) return unit;
  return arm_bf16_unit();
}

double bf16_unit_speedup() {
  // Each loop's best of runs taken in turns: a run that a context switch,
  // the other SMT thread or a clock still ramping up slowed is dropped.
  // About 1 ms, once per process.
  static const double speedup = [] {
    const BF16Unit* unit = cpu_bf16_unit();
    if (!unit) return 0.0;
    double fma = 0, dot = 0;
    for (int run = 0; run < 7; ++run) {
      fma = std::max(fma, rate(fma_loop));
      dot = std::max(dot, rate(unit->peak_loop));
    }
    return dot / fma;
  }();
  return speedup;
}

const BF16Unit* bf16_unit() {
  switch (unit_use.load(std::memory_order_relaxed)) {
    case BF16UnitUse::Never: return nullptr;
    case BF16UnitUse::Always: return cpu_bf16_unit();
    case BF16UnitUse::Measured: break;
  }
  return bf16_unit_speedup() >= kBF16UnitMinSpeedup ? cpu_bf16_unit() : nullptr;
}

void set_bf16_unit_use(BF16UnitUse use) { unit_use.store(use, std::memory_order_relaxed); }

double bf16_peak_loop(int64_t iterations, float* sink) {
  const BF16Unit* unit = cpu_bf16_unit();
  return unit ? unit->peak_loop(iterations, sink) : 0.0;
}

}  // namespace attn::kernels
