// The input side of a model: token embeddings plus an additive positional
// table (sinusoidal or learned), and its backward.
#pragma once

#include <cstdint>

#include "attn/tensor.hpp"

namespace attn {

// x (batch, n, E) = table[tokens[b, t]] + positions[t] (positions (>= n, E),
// optional). tokens (batch, n) index rows of table (vocab, E).
template <Real T>
Tensor<T> embed(TensorView<const int64_t> tokens, TensorView<const T> table,
                TensorView<const T> positions = {});

// The backward, for dx = dL/dx (batch, n, E): adds row dx[b, t] into
// dtable[tokens[b, t]], and (when dpositions is given, for a learned table)
// the sum over the batch of dx[:, t] into dpositions[t].
template <Real T>
void embed_backward(TensorView<const int64_t> tokens, TensorView<const T> dx, TensorView<T> dtable,
                    TensorView<T> dpositions = {});

}  // namespace attn
