// y = x Wᵀ + b with the packed-panel product of matmul-inl.h: W is packed
// once per call into panels of 64 output columns ([panel][in][64], O(out·in)
// work against the O(rows·out·in) product), x rows are read in place, and
// items of (64 rows × 1 panel) run on the thread pool. Each output element is
// one dot product in a fixed order, so results do not depend on threads.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/linear.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <hwy/aligned_allocator.h>

#include <algorithm>
#include <string>

#include "kernels/matmul-inl.h"
#include "kernels/scratch.hpp"
#include "linear.hpp"
#include "thread_pool.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr int64_t kRowBlock = 64;


template <class T>
void LinearT(const TensorView<const T>& x, const T* w, const T* b, const TensorView<T>& y) {
  const hn::ScalableTag<T> d;
  const int64_t rows = x.dim(0), in = x.dim(1), out = y.dim(1);
  const int64_t panels = (out + kPanel - 1) / kPanel;
  thread_local Scratch<T> packed;
  T* wp = packed.get(static_cast<size_t>(std::max<int64_t>(panels * in * kPanel, 1)));
  parallel_for(panels, [&](int64_t p) {
    T* dst = wp + p * in * kPanel;
    const int64_t cols = std::min(kPanel, out - p * kPanel);
    for (int64_t c = 0; c < in; ++c) {
      for (int64_t j = 0; j < cols; ++j) dst[c * kPanel + j] = w[(p * kPanel + j) * in + c];
      std::fill(dst + c * kPanel + cols, dst + (c + 1) * kPanel, T(0));
    }
  });
  const int64_t row_blocks = (rows + kRowBlock - 1) / kRowBlock;
  parallel_for(row_blocks * panels, [&](int64_t item) {
    const int64_t r_begin = (item / panels) * kRowBlock, p = item % panels;
    const int64_t r_end = std::min(rows, r_begin + kRowBlock);
    const int64_t col0 = p * kPanel, cols = std::min(kPanel, out - col0);
    alignas(64) T tile[kRows * kPanel];
    const T* a[kRows];
    for (int64_t r0 = r_begin; r0 < r_end; r0 += kRows) {
      const int mr = static_cast<int>(std::min<int64_t>(kRows, r_end - r0));
      for (int r = 0; r < mr; ++r) a[r] = x.data() + (r0 + r) * x.stride(0);
      MatmulPanel(d, a, mr, in, wp + p * in * kPanel, T(1), tile, kPanel);
      for (int r = 0; r < mr; ++r) {
        T* yr = y.data() + (r0 + r) * y.stride(0) + col0;
        for (int64_t j = 0; j < cols; ++j) yr[j] = tile[r * kPanel + j] + (b ? b[col0 + j] : T(0));
      }
    }
  });
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
