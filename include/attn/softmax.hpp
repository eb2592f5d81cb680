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
template <Real T>
void softmax(TensorView<const T> a, TensorView<T> out, int64_t axis = -1);
template <Real T>
Tensor<T> softmax(TensorView<const T> a, int64_t axis = -1);

}  // namespace attn
