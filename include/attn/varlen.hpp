// Packed variable-length batches: sequences of different lengths laid end to
// end, FlashAttention's varlen layout (flash_attn_varlen_func). Sequence b's
// queries q[cu_seqlens_q[b] : cu_seqlens_q[b+1]] attend only its keys
// k[cu_seqlens_k[b] : cu_seqlens_k[b+1]], with every option of attention()
// (causal alignments, windows, softcap, scale, ALiBi, sinks) applied within
// the sequence. Nothing is padded: no work is spent on other sequences' keys.
#pragma once

#include <cstdint>

#include "attn/attention.hpp"

namespace attn {

// q (total_q, Hq, d), k (total_k, Hkv, d), v (total_k, Hkv, d_v); cu_seqlens_q
// and cu_seqlens_k (batch + 1,), starting at 0, non-decreasing, ending at
// total_q and total_k (empty sequences allowed). Writes out (total_q, Hq,
// d_v), and lse (Hq, total_q) unless it is an empty view (FlashAttention's
// layout). T is float (the kernels) or double (the reference); k and v may
// be stored as attention() reads them (KV: bfloat16, float16 or q8_0 blocks
// with float32 q, the last axis of a q8_0 view counting blocks).
template <class T, class KV>
  requires AttentionTypes<T, KV>
void attention_varlen(TensorView<const T> q, TensorView<const KV> k, TensorView<const KV> v,
                      TensorView<const int64_t> cu_seqlens_q, TensorView<const int64_t> cu_seqlens_k,
                      TensorView<T> out, const AttentionOptions& options = {}, TensorView<T> lse = {});

template <class T>
struct VarlenResult {
  Tensor<T> out;  // (total_q, Hq, d_v)
  Tensor<T> lse;  // (Hq, total_q) when asked for; empty otherwise
};
template <class T, class KV>
  requires AttentionTypes<T, KV>
VarlenResult<T> attention_varlen(TensorView<const T> q, TensorView<const KV> k, TensorView<const KV> v,
                                 TensorView<const int64_t> cu_seqlens_q,
                                 TensorView<const int64_t> cu_seqlens_k,
                                 const AttentionOptions& options = {}, bool return_lse = false);

}  // namespace attn
