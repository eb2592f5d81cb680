// y = x Wᵀ + b and c (+)= a B with the packed-panel product of matmul-inl.h:
// the right operand is packed once per call into panels of 64 output
// columns ([panel][k][64], O(k·cols) work against the O(rows·k·cols)
// product), the rows of the left one are read in place, and items of (64
// rows × 1 panel) run on the thread pool. Each output element is one dot
// product in a fixed order, so results do not depend on threads.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/linear.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <hwy/aligned_allocator.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "kernels/matmul-inl.h"
#include "kernels/scratch.hpp"
#include "linear.hpp"
#include "thread_pool.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr int64_t kRowBlock = 64;


// c (rows × cols) = a · B (+ bias, or + c with accumulate), B given packed
// as panels of kPanel columns ([panel][k][kPanel], k < a's columns);
// items of (kRowBlock rows × 1 panel) on the thread pool.
template <class T>
void PanelProduct(const TensorView<const T>& a, const T* packed, const T* bias, const TensorView<T>& c,
                  bool accumulate) {
  const hn::ScalableTag<T> d;
  const int64_t rows = a.dim(0), K = a.dim(1), cols = c.dim(1);
  const int64_t panels = (cols + kPanel - 1) / kPanel;
  const int64_t row_blocks = (rows + kRowBlock - 1) / kRowBlock;
  parallel_for(row_blocks * panels, [&](int64_t item) {
    const int64_t r_begin = (item / panels) * kRowBlock, p = item % panels;
    const int64_t r_end = std::min(rows, r_begin + kRowBlock);
    const int64_t col0 = p * kPanel, n = std::min(kPanel, cols - col0);
    alignas(64) T tile[kRows * kPanel];
    const T* rows_of_a[kRows];
    for (int64_t r0 = r_begin; r0 < r_end; r0 += kRows) {
      const int mr = static_cast<int>(std::min<int64_t>(kRows, r_end - r0));
      for (int r = 0; r < mr; ++r) rows_of_a[r] = a.data() + (r0 + r) * a.stride(0);
#if !HWY_HAVE_FLOAT64
      // Targets without float64 vectors (Highway 1.0.3's WebAssembly, for
      // the web page) sum float64 in scalar code, each element over k in order.
      if constexpr (std::is_same_v<T, double>) {
        const T* panel = packed + p * K * kPanel;
        for (int r = 0; r < mr; ++r)
          for (int64_t j = 0; j < n; ++j) {
            T sum = 0;
            for (int64_t k = 0; k < K; ++k) sum += rows_of_a[r][k] * panel[k * kPanel + j];
            tile[r * kPanel + j] = sum;
          }
      } else
#endif
      MatmulPanel(d, rows_of_a, mr, K, packed + p * K * kPanel, T(1), tile, kPanel, Plain(), n);
      for (int r = 0; r < mr; ++r) {
        T* cr = c.data() + (r0 + r) * c.stride(0) + col0;
        for (int64_t j = 0; j < n; ++j)
          cr[j] = tile[r * kPanel + j] + (accumulate ? cr[j] : bias ? bias[col0 + j] : T(0));
      }
    }
  }, 2.0 * double(rows) * double(K) * double(cols));
}

// B (K × cols) as PanelProduct's panels, element (k, j) read by at(k, j);
// columns past cols are zero.
// The calling thread's packed right operand, one buffer per element type.
template <class T>
Scratch<T>& PackedPanels() {
  thread_local Scratch<T> packed;
  return packed;
}

template <class T, class At>
T* PackPanels(int64_t K, int64_t cols, const At& at) {
  Scratch<T>& packed = PackedPanels<T>();
  const int64_t panels = (cols + kPanel - 1) / kPanel;
  T* wp = packed.get(static_cast<size_t>(std::max<int64_t>(panels * K * kPanel, 1)));
  parallel_for(panels, [&](int64_t p) {
    T* dst = wp + p * K * kPanel;
    const int64_t n = std::min(kPanel, cols - p * kPanel);
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t j = 0; j < n; ++j) dst[k * kPanel + j] = at(k, p * kPanel + j);
      std::fill(dst + k * kPanel + n, dst + (k + 1) * kPanel, T(0));
    }
  }, double(panels * K * kPanel));
  return wp;
}

// y = x Wᵀ + b: B = Wᵀ, element (k, j) = w[j][k].
template <class T>
void LinearT(const TensorView<const T>& x, const T* w, const T* b, const TensorView<T>& y) {
  const int64_t in = x.dim(1);
  const T* packed = PackPanels<T>(in, y.dim(1), [&](int64_t k, int64_t j) { return w[j * in + k]; });
  PanelProduct(x, packed, b, y, false);
}

// c (+)= a B with B (K × cols) row-major, b_stride apart.
template <class T>
void MatmulT(const TensorView<const T>& a, const T* b, int64_t b_stride, const TensorView<T>& c, bool accumulate) {
  const T* packed = PackPanels<T>(a.dim(1), c.dim(1), [&](int64_t k, int64_t j) { return b[k * b_stride + j]; });
  PanelProduct(a, packed, static_cast<const T*>(nullptr), c, accumulate);
}

void LinearF32(const TensorView<const float>& x, const float* w, const float* b,
               const TensorView<float>& y) {
  LinearT(x, w, b, y);
}
void LinearF64(const TensorView<const double>& x, const double* w, const double* b,
               const TensorView<double>& y) {
  LinearT(x, w, b, y);
}
void MatmulF32(const TensorView<const float>& a, const float* b, int64_t b_stride, const TensorView<float>& c,
               bool accumulate) {
  MatmulT(a, b, b_stride, c, accumulate);
}
void MatmulF64(const TensorView<const double>& a, const double* b, int64_t b_stride, const TensorView<double>& c,
               bool accumulate) {
  MatmulT(a, b, b_stride, c, accumulate);
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::kernels {
HWY_EXPORT(LinearF32);
HWY_EXPORT(LinearF64);
HWY_EXPORT(MatmulF32);
HWY_EXPORT(MatmulF64);

void linear(TensorView<const float> x, const float* w, const float* b, TensorView<float> y) {
  HWY_DYNAMIC_DISPATCH(LinearF32)(x, w, b, y);
}
void linear(TensorView<const double> x, const double* w, const double* b, TensorView<double> y) {
  HWY_DYNAMIC_DISPATCH(LinearF64)(x, w, b, y);
}
void matmul(TensorView<const float> a, const float* b, int64_t b_stride, TensorView<float> c, bool accumulate) {
  HWY_DYNAMIC_DISPATCH(MatmulF32)(a, b, b_stride, c, accumulate);
}
void matmul(TensorView<const double> a, const double* b, int64_t b_stride, TensorView<double> c,
            bool accumulate) {
  HWY_DYNAMIC_DISPATCH(MatmulF64)(a, b, b_stride, c, accumulate);
}
}  // namespace attn::kernels
#endif
