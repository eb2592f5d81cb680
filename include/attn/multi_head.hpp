// The article's multi_head(x, heads): split the model dimension into `heads`
// slices, run attention on each slice with the slice itself as Q, K and V, and
// concatenate. No projections (those are the learnable layer's job).
#pragma once

#include <cstdint>

#include "attn/attention.hpp"

namespace attn {

// x (..., n, d) -> (..., n, d). d must be divisible by heads (the article's
// code silently drops the remainder columns; attn refuses instead). Each
// head is scaled by 1/sqrt(d / heads), as the article's attention() does.
// Into out, of x's shape (must not overlap x).
void multi_head(TensorView<const float> x, TensorView<float> out, int64_t heads = 4,
                const AttentionOptions& options = {});
void multi_head(TensorView<const double> x, TensorView<double> out, int64_t heads = 4,
                const AttentionOptions& options = {});

Tensor<float> multi_head(TensorView<const float> x, int64_t heads = 4,
                         const AttentionOptions& options = {});
Tensor<double> multi_head(TensorView<const double> x, int64_t heads = 4,
                          const AttentionOptions& options = {});

}  // namespace attn
