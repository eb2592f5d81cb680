// The kernels' elementwise steps over arrays, on their own, so that tests
// can check them on every SIMD target and benchmarks can time them: the
// softmax's exponential (exp2-inl.h) against std::exp2, bf16 precision's
// rounding (attention-inl.h) against float_to_bf16.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/exp2.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/attention-inl.h"
#include "kernels/exp2-inl.h"
#include "kernels/partial-inl.h"

#include <algorithm>
#include <cstdint>

#include "kernels/attention_kernel.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void Exp2Array(const float* x, float* out, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t i = 0; i < n; i += N) {
    const int64_t m = std::min(N, n - i);
    StorePart(d, Exp2NonPositive(d, LoadPart(d, x + i, m, 0.0f)), out + i, m);
  }
}

void RoundArray(const float* x, float* out, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t i = 0; i < n; i += N) {
    const int64_t m = std::min(N, n - i);
    StorePart(d, RoundToBF16(d, LoadPart(d, x + i, m, 0.0f)), out + i, m);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::detail {
HWY_EXPORT(Exp2Array);
void exp2_nonpositive(const float* x, float* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(Exp2Array)(x, out, n);
}
HWY_EXPORT(RoundArray);
void round_to_bf16(const float* x, float* out, int64_t n) { HWY_DYNAMIC_DISPATCH(RoundArray)(x, out, n); }
}  // namespace attn::detail
#endif
