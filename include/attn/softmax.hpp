// Numerically stable softmax: exp(a - max) / sum, as in the article's code.
// A row whose entries are all -inf (every choice masked) becomes all zeros,
// not NaN. A row holding +inf splits its weight evenly among the +inf entries
// (the limit of the softmax). A NaN entry makes its row NaN. float32 rows
// contiguous along the axis use a SIMD kernel (relative error ~1e-7).
#pragma once

#include <cstdint>

#include "attn/tensor.hpp"

namespace attn {

// out has the shape of a; axis may be negative. out may alias a exactly.
void softmax(TensorView<const float> a, TensorView<float> out, int64_t axis = -1);
void softmax(TensorView<const double> a, TensorView<double> out, int64_t axis = -1);

Tensor<float> softmax(TensorView<const float> a, int64_t axis = -1);
Tensor<double> softmax(TensorView<const double> a, int64_t axis = -1);

}  // namespace attn
