// The article's multi_head(x, heads): split the model dimension into `heads`
// slices, run attention on each slice with the slice itself as Q, K and V, and
// concatenate. No projections (those are the learnable layer's job).
#pragma once

#include <cstdint>

#include "attn/attention.hpp"
#include "attn/positional.hpp"

namespace attn {

// x (..., n, d) -> (..., n, d). d must be divisible by heads (the article's
// code silently drops the remainder columns; attn refuses instead). Each
// head is scaled by 1/sqrt(d / heads), as the article's attention() does.
// Into out, of x's shape (must not overlap x).
template <Real T>
void multi_head(TensorView<const T> x, TensorView<T> out, int64_t heads = 4,
                const AttentionOptions& options = {});
template <Real T>
Tensor<T> multi_head(TensorView<const T> x, int64_t heads = 4,
                     const AttentionOptions& options = {});

// The same, also returning each head's attention weights, (..., heads, n, n):
// weights[..., h, i, j] is how much word i attends to word j in head h.
template <class T>
struct MultiHeadResult {
  Tensor<T> out;      // x's shape
  Tensor<T> weights;  // (..., heads, n, n)
};
template <Real T>
MultiHeadResult<T> multi_head_with_weights(TensorView<const T> x, int64_t heads = 4,
                                           const AttentionOptions& options = {});

// RoPE as a multi-head model applies it: on each head's slice of x (..., n, d)
// separately (positions 0..n-1), so that every head sees rotated vectors of
// its own dimension d / heads (which must be even).
template <Real T>
Tensor<T> apply_rope_per_head(TensorView<const T> x, int64_t heads,
                              const RopeOptions& options = {});

}  // namespace attn
