// The float32 FMA's throughput loop: the ceiling `attn bench` measures
// kernels against, and the yardstick that decides whether a bf16 unit pays
// (bf16_unit.cc).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/fma_loop.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cstdint>

#include "kernels/attention_kernel.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Returns FLOPs done; `sink` keeps the result alive. The chains start from
// different values: equal chains were merged by the compiler into one
// latency-bound chain counted as 12, and the "peak" came out 1.5x too high.
double FmaLoop(int64_t iterations, float* sink) {
  const hn::ScalableTag<float> d;
  // 12 chains > 2 pipes x 4 cycles of FMA latency. Named, not an array:
  // sizeless SVE vectors cannot form arrays.
  auto a0 = hn::Set(d, 1.0f), a1 = hn::Set(d, 1.1f), a2 = hn::Set(d, 1.2f), a3 = hn::Set(d, 1.3f),
       a4 = hn::Set(d, 1.4f), a5 = hn::Set(d, 1.5f), a6 = hn::Set(d, 1.6f), a7 = hn::Set(d, 1.7f),
       a8 = hn::Set(d, 1.8f), a9 = hn::Set(d, 1.9f), a10 = hn::Set(d, 2.0f), a11 = hn::Set(d, 2.1f);
  const auto x = hn::Set(d, 0.999999f), y = hn::Set(d, 1e-7f);
  for (int64_t i = 0; i < iterations; ++i) {
    a0 = hn::MulAdd(a0, x, y); a1 = hn::MulAdd(a1, x, y); a2 = hn::MulAdd(a2, x, y);
    a3 = hn::MulAdd(a3, x, y); a4 = hn::MulAdd(a4, x, y); a5 = hn::MulAdd(a5, x, y);
    a6 = hn::MulAdd(a6, x, y); a7 = hn::MulAdd(a7, x, y); a8 = hn::MulAdd(a8, x, y);
    a9 = hn::MulAdd(a9, x, y); a10 = hn::MulAdd(a10, x, y); a11 = hn::MulAdd(a11, x, y);
  }
  const auto s = hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)),
                         hn::Add(hn::Add(hn::Add(a4, a5), hn::Add(a6, a7)),
                                 hn::Add(hn::Add(a8, a9), hn::Add(a10, a11))));
  *sink = hn::GetLane(hn::SumOfLanes(d, s));
  return 2.0 * 12 * static_cast<double>(hn::Lanes(d)) * static_cast<double>(iterations);
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::kernels {
HWY_EXPORT(FmaLoop);
double fma_loop(int64_t iterations, float* sink) { return HWY_DYNAMIC_DISPATCH(FmaLoop)(iterations, sink); }
}  // namespace attn::kernels
#endif
