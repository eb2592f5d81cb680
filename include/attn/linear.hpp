// The linear map y = x Wᵀ + b (PyTorch's torch.nn.functional.linear) and its
// backward: the learnable layer's projections, on the same packed-panel
// product as attention's Q·Kᵀ for float32 (the plain loops for float64).
// Results do not depend on the thread count.
#pragma once

#include "attn/tensor.hpp"

namespace attn {

// y (rows, out) = x (rows, in) · wᵀ + b, overwriting y.
//   x: rows of unit stride (any row stride); w (out, in): C-contiguous;
//   b (out,): contiguous, or an empty view for none; y: rows of unit stride.
// ValueError naming the argument whose shape or layout does not fit.
template <class T>
void linear(TensorView<const T> x, TensorView<const T> w, TensorView<const T> b, TensorView<T> y);

// The backward of y = x wᵀ + b, all arrays C-contiguous, given dy (rows, out):
//   dx (rows, in) = dy · w, overwritten (skipped when dx is an empty view),
//   dw (out, in) += dyᵀ · x, accumulated,
//   db (out,)    += the sum of dy's rows, accumulated (skipped when empty).
template <class T>
void linear_backward(TensorView<const T> x, TensorView<const T> w, TensorView<const T> dy, TensorView<T> dx,
                     TensorView<T> dw, TensorView<T> db);

}  // namespace attn
