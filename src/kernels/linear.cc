// y = x Wᵀ + b as dot products of rows of x with rows of W (both contiguous),
// four rows of x per pass so each row of W is loaded once per four outputs.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/linear.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "linear.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class T>
void LinearT(const TensorView<const T>& x, const T* w, const T* b, const TensorView<T>& y) {
  const hn::ScalableTag<T> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t rows = x.dim(0), in = x.dim(1), out = y.dim(1);
  const int64_t sx = x.stride(0), sy = y.stride(0);
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    const T* x0 = x.data() + r * sx;
    for (int64_t o = 0; o < out; ++o) {
      const T* wo = w + o * in;
      auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
      int64_t c = 0;
      for (; c + N <= in; c += N) {
        const auto wv = hn::LoadU(d, wo + c);
        a0 = hn::MulAdd(hn::LoadU(d, x0 + c), wv, a0);
        a1 = hn::MulAdd(hn::LoadU(d, x0 + sx + c), wv, a1);
        a2 = hn::MulAdd(hn::LoadU(d, x0 + 2 * sx + c), wv, a2);
        a3 = hn::MulAdd(hn::LoadU(d, x0 + 3 * sx + c), wv, a3);
      }
      T s[4] = {hn::GetLane(hn::SumOfLanes(d, a0)), hn::GetLane(hn::SumOfLanes(d, a1)),
                hn::GetLane(hn::SumOfLanes(d, a2)), hn::GetLane(hn::SumOfLanes(d, a3))};
      for (; c < in; ++c)
        for (int k = 0; k < 4; ++k) s[k] += x0[k * sx + c] * wo[c];
      for (int k = 0; k < 4; ++k) y.data()[(r + k) * sy + o] = s[k] + (b ? b[o] : T(0));
    }
  }
  for (; r < rows; ++r) {
    const T* xr = x.data() + r * sx;
    for (int64_t o = 0; o < out; ++o) {
      const T* wo = w + o * in;
      auto a = hn::Zero(d);
      int64_t c = 0;
      for (; c + N <= in; c += N) a = hn::MulAdd(hn::LoadU(d, xr + c), hn::LoadU(d, wo + c), a);
      T s = hn::GetLane(hn::SumOfLanes(d, a));
      for (; c < in; ++c) s += xr[c] * wo[c];
      y.data()[r * sy + o] = s + (b ? b[o] : T(0));
    }
  }
}

void LinearF32(const TensorView<const float>& x, const float* w, const float* b,
               const TensorView<float>& y) {
  LinearT(x, w, b, y);
}
void LinearF64(const TensorView<const double>& x, const double* w, const double* b,
               const TensorView<double>& y) {
  LinearT(x, w, b, y);
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::detail {
HWY_EXPORT(LinearF32);
HWY_EXPORT(LinearF64);

void linear(TensorView<const float> x, const float* w, const float* b, TensorView<float> y) {
  HWY_DYNAMIC_DISPATCH(LinearF32)(x, w, b, y);
}
void linear(TensorView<const double> x, const double* w, const double* b, TensorView<double> y) {
  HWY_DYNAMIC_DISPATCH(LinearF64)(x, w, b, y);
}
}  // namespace attn::detail
#endif
