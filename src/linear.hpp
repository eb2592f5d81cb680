// Internal: y = x Wᵀ + b, the projections of the multi-head layer.
#pragma once

#include "attn/tensor.hpp"

namespace attn::detail {

// x (rows, in) with unit column stride, w (out, in) contiguous, b (out) or
// null, y (rows, out) with unit column stride.
void linear(TensorView<const float> x, const float* w, const float* b, TensorView<float> y);
void linear(TensorView<const double> x, const double* w, const double* b, TensorView<double> y);

}  // namespace attn::detail
