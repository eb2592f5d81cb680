// float32 softmax of a contiguous row with a finite maximum, vectorised; the
// rows with NaN or an infinite maximum keep the plain rules of softmax.cc.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/softmax.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/exp2-inl.h"
#include "kernels/partial-inl.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/attention_kernel.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

bool SoftmaxRow(const float* x, float* y, int64_t n) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto part = [&](int64_t j) { return std::min(N, n - j); };
  const float ninf = -std::numeric_limits<float>::infinity();
  VF vmax = hn::Set(d, ninf);
  auto nan = hn::FirstN(d, 0);
  for (int64_t j = 0; j < n; j += N) {
    const VF v = LoadPart(d, x + j, part(j), ninf);
    vmax = hn::Max(vmax, v);
    nan = hn::Or(nan, hn::IsNaN(v));
  }
  const float max = hn::GetLane(hn::MaxOfLanes(d, vmax));
  if (!hn::AllFalse(d, nan) || !std::isfinite(max)) return false;
  // e^(x - max) = 2^((x - max)·log2 e); subtracting first keeps large
  // logits exact where they matter (near the max). Padding lanes are -inf: 0.
  const VF vm = hn::Set(d, max), log2e = hn::Set(d, 1.44269504088896341f);
  VF vsum = hn::Zero(d);
  for (int64_t j = 0; j < n; j += N) {
    const VF e = SoftmaxExp2(d, hn::Mul(hn::Sub(LoadPart(d, x + j, part(j), ninf), vm), log2e));
    StorePart(d, e, y + j, part(j));
    vsum = hn::Add(vsum, e);
  }
  // sum >= 1 (the max contributes 2^0)
  const VF inv = hn::Set(d, 1.0f / hn::GetLane(hn::SumOfLanes(d, vsum)));
  for (int64_t j = 0; j < n; j += N) StorePart(d, hn::Mul(LoadPart(d, y + j, part(j), 0.0f), inv), y + j, part(j));
  return true;
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::kernels {
HWY_EXPORT(SoftmaxRow);
bool softmax_row(const float* x, float* y, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(SoftmaxRow)(x, y, n);
}
}  // namespace attn::kernels
#endif
