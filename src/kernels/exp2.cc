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
namespace attn::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// out[i] = step(x[i]), a vector at a time (the last one partial).
template <class Step>
void Elementwise(const float* x, float* out, int64_t n, const Step& step) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t i = 0; i < n; i += N) {
    const int64_t m = std::min(N, n - i);
    StorePart(d, step(d, LoadPart(d, x + i, m, 0.0f)), out + i, m);
  }
}

void Exp2Array(const float* x, float* out, int64_t n, bool for_bf16) {
  if (for_bf16) Elementwise(x, out, n, [](auto d, auto v) HWY_ATTR { return SoftmaxExp2<true>(d, v); });
  else Elementwise(x, out, n, [](auto d, auto v) HWY_ATTR { return SoftmaxExp2(d, v); });
}

void RoundArray(const float* x, float* out, int64_t n) {
  Elementwise(x, out, n, [](auto d, auto v) HWY_ATTR { return RoundToBF16(d, v); });
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::kernels {
HWY_EXPORT(Exp2Array);
void softmax_exp2(const float* x, float* out, int64_t n, bool for_bf16) {
  HWY_DYNAMIC_DISPATCH(Exp2Array)(x, out, n, for_bf16);
}
HWY_EXPORT(RoundArray);
void round_to_bf16(const float* x, float* out, int64_t n) { HWY_DYNAMIC_DISPATCH(RoundArray)(x, out, n); }
}  // namespace attn::kernels
#endif
