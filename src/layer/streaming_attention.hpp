// Internal to the layer room: the rule of a streaming cache (StreamingLLM;
// attn/kv_cache.hpp's StreamingCache) as the kernels compute it.
#pragma once

#include <cstdint>
#include <vector>

#include "attn/attention.hpp"
#include "attn/kv_cache.hpp"

namespace attn::detail {

// The chunk's queries q (batch, heads, n_q, head_dim), at stream positions
// t0 .. t0 + n_q - 1, against the keys and values a streaming cache holds, k
// and v (batch, kv heads, n_k, row) at `positions` (ascending: the sink
// tokens first, then consecutive positions), by `rule`: token t attends the
// key at position j iff j <= t and (j < sink_tokens or j > t - window).
// Writes out (batch, heads, n_q, d_v) and, unless it is empty, weights
// (batch, heads, n_q, n_k). The options are attention()'s but for causal and
// window, which the rule sets; ALiBi is not taken.
template <class T, class KV>
void streaming_attention(TensorView<const T> q, TensorView<const KV> k, TensorView<const KV> v,
                         const AttentionOptions& options, const StreamingCache& rule,
                         const std::vector<int64_t>& positions, int64_t t0, TensorView<T> out, TensorView<T> weights);

}  // namespace attn::detail
