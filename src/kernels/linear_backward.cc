// The backward of y = x Wᵀ + b as products of the forward's packed kernel
// (linear.cc), so it runs at its speed and on its threads:
//   dx = dy W      W (out, in) row-major is the right operand as it is
//   dW += dyᵀ x    x (rows, in) likewise; dyᵀ, the left one, is a copy
// (O(rows · out) against the products' O(rows · in · out)). Each output
// element is one dot product in a fixed order, so results do not depend on
// the thread count.
#include "kernels/linear.hpp"

#include <algorithm>

namespace attn::kernels {

template <class T>
void linear_backward(const T* x, const T* w, const T* dy, int64_t rows, int64_t in, int64_t out,
                     T* dx, T* dw, T* db) {
  if (dx) matmul(TensorView<const T>(dy, {rows, out}), w, in, TensorView<T>(dx, {rows, in}), false);
  // dyᵀ in blocks: one column of dy at a time wrote 4·rows bytes apart, onto
  // a few cache sets (most of linear_backward's time at rows = 512, out = 32).
  constexpr int64_t kBlock = 16;
  Tensor<T> dyt({out, rows});
  for (int64_t r0 = 0; r0 < rows; r0 += kBlock)
    for (int64_t o0 = 0; o0 < out; o0 += kBlock)
      for (int64_t o = o0; o < std::min(out, o0 + kBlock); ++o)
        for (int64_t r = r0; r < std::min(rows, r0 + kBlock); ++r) dyt[o * rows + r] = dy[r * out + o];
  matmul(TensorView<const T>(dyt.view()), x, in, TensorView<T>(dw, {out, in}), true);
  if (db)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = 0; o < out; ++o) db[o] += dy[r * out + o];
}

template void linear_backward<float>(const float*, const float*, const float*, int64_t, int64_t,
                                     int64_t, float*, float*, float*);
template void linear_backward<double>(const double*, const double*, const double*, int64_t,
                                      int64_t, int64_t, double*, double*, double*);

}  // namespace attn::kernels
