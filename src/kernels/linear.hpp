// Internal: the kernels' y = x Wᵀ + b (the layer's projections, the
// classifier's readout), the plain product it is made of, and its backward.
#pragma once

#include <cstdint>

#include "attn/tensor.hpp"

namespace attn::kernels {

// x (rows, in) with unit column stride, w (out, in) contiguous, b (out) or
// null, y (rows, out) with unit column stride.
void linear(TensorView<const float> x, const float* w, const float* b, TensorView<float> y);
void linear(TensorView<const double> x, const double* w, const double* b, TensorView<double> y);

// c (rows, cols) = a (rows, K) · B, or c += a · B with accumulate; a and c
// with unit column stride, B (K, cols) row-major, b_stride elements apart.
void matmul(TensorView<const float> a, const float* b, int64_t b_stride, TensorView<float> c, bool accumulate);
void matmul(TensorView<const double> a, const double* b, int64_t b_stride, TensorView<double> c,
            bool accumulate);

// The backward, all arrays contiguous: given dy (rows, out),
//   dx (rows, in) = dy W       (overwritten; skipped when null)
//   dw (out, in) += dyᵀ x
//   db (out)     += the sum of dy's rows (skipped when null)
template <class T>
void linear_backward(const T* x, const T* w, const T* dy, int64_t rows, int64_t in, int64_t out,
                     T* dx, T* dw, T* db);

}  // namespace attn::kernels
