// Multi-head latent attention (MLA: DeepSeek-V2/V3, Kimi K2) in its absorbed
// form, the decode of a latent cache: each token's key and value are one
// compressed latent c (kv_lora_rank values, 512 in DeepSeek-V3) and one
// rotated RoPE key k_pe (qk_rope_head_dim, 64), shared by every head. With
// W_UK folded into the query (q_nope) and W_UV left for the output, the
// attention is MQA over one KV head: keys [c | k_pe], values c.
#pragma once

#include <cstdint>

#include "attn/attention.hpp"
#include "attn/tensor.hpp"

namespace attn {

template <Real T>
struct LatentAttentionResult {
  Tensor<T> out;  // (n_q, H, kv_lora_rank): the latent output, before W_UV
  Tensor<T> lse;  // (n_q, H), natural log
};

// q_nope (n_q, H, r) (the query's no-RoPE part times W_UK), q_pe (n_q, H,
// p), ckv (n_k, r), kpe (n_k, p): logits scale · (q_nope·c + q_pe·k_pe),
// the softmax over the keys (causal: bottom-right, query i seeing keys
// 0 .. n_k − n_q + i), out = Σ softmax · c. `scale` is the model's (DeepSeek:
// 1/sqrt(qk_nope_head_dim + qk_rope_head_dim), times YaRN's mscale²), so it
// is required. When ckv and kpe are the two parts of one cache's rows (kpe
// starts right after ckv's columns, rows one stride apart), those rows are
// read in place, values and all, once for every head; otherwise the keys are
// copied side by side first. KV: T, or with T = float also bfloat16 and
// float16. ValueError naming the argument for shapes that do not fit.
template <Real T, class KV = T>
  requires AttentionTypes<T, KV>
LatentAttentionResult<T> latent_attention(TensorView<const T> q_nope, TensorView<const T> q_pe,
                                          TensorView<const KV> ckv, TensorView<const KV> kpe, double scale,
                                          bool causal = false);

}  // namespace attn
