// exp2_nonpositive over an array: the softmax's exponential (exp2-inl.h) on
// its own, so that tests can check it against std::exp2 on every SIMD target
// and benchmarks can time it.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/exp2.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/exp2-inl.h"

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
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(Exp2NonPositive(d, hn::LoadU(d, x + i)), d, out + i);
  if (i < n) {  // the tail through one vector's worth of stack
    alignas(HWY_MAX_BYTES) float buf[HWY_MAX_BYTES / sizeof(float)] = {};
    std::copy(x + i, x + n, buf);
    hn::Store(Exp2NonPositive(d, hn::Load(d, buf)), d, buf);
    std::copy(buf, buf + (n - i), out + i);
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
}  // namespace attn::detail
#endif
