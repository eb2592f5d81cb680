// The backward of y = x Wᵀ + b as two more products of the forward's packed
// kernel (linear.cc), so it runs at its speed and on its threads:
//   dx = dy W     = linear(dy, Wᵀ)
//   dW += dyᵀ x   = linear(dyᵀ, xᵀ)
// The transposed copies cost O(rows · (in + out)) against the products'
// O(rows · in · out). Each output element is one dot product in a fixed
// order, so results do not depend on the thread count.
#include <algorithm>
#include <vector>

#include "kernels/linear.hpp"

namespace attn::detail {
namespace {

// a (rows, cols) contiguous, transposed into (cols, rows).
template <class T>
Tensor<T> transposed(const T* a, int64_t rows, int64_t cols) {
  Tensor<T> t({cols, rows});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = a[r * cols + c];
  return t;
}

}  // namespace

template <class T>
void linear_backward(const T* x, const T* w, const T* dy, int64_t rows, int64_t in, int64_t out,
                     T* dx, T* dw, T* db) {
  const TensorView<const T> dy_view(dy, {rows, out});
  if (dx) {
    const Tensor<T> wt = transposed(w, out, in);  // (in, out)
    linear(dy_view, wt.data(), static_cast<const T*>(nullptr), TensorView<T>(dx, {rows, in}));
  }
  const Tensor<T> dyt = transposed(dy, rows, out), xt = transposed(x, rows, in);
  Tensor<T> product({out, in});
  linear(TensorView<const T>(dyt.view()), xt.data(), static_cast<const T*>(nullptr), product.view());
  for (int64_t e = 0; e < out * in; ++e) dw[e] += product[e];
  if (db)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = 0; o < out; ++o) db[o] += dy[r * out + o];
}

template void linear_backward<float>(const float*, const float*, const float*, int64_t, int64_t,
                                     int64_t, float*, float*, float*);
template void linear_backward<double>(const double*, const double*, const double*, int64_t,
                                      int64_t, int64_t, double*, double*, double*);

}  // namespace attn::detail
