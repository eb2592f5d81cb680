// ONNX's Attention (opsets 23, 24 and 25) and RotaryEmbedding (opset 23)
// operators, exactly: their inputs, attributes, layouts, defaults and edge
// cases, as a thin adapter over attn::attention and attn::apply_rope (no
// second kernel). docs/semantics.md "ONNX operators" lists where attn's
// answer differs from ONNX's specification or its reference implementation,
// and why.
//
// T is the inputs' element type: float (computed by the float32 kernels),
// double (the double-precision reference), or float16 / bfloat16 (computed in
// float32 and rounded back, as ONNX Runtime's CPU kernels do).
#pragma once

#include <cstdint>
#include <optional>
#include <variant>

#include "attn/half.hpp"
#include "attn/tensor.hpp"

namespace attn::onnx {

template <class T>
concept OnnxType = std::same_as<T, float> || std::same_as<T, double> ||
                   std::same_as<T, float16> || std::same_as<T, bfloat16>;

// Attention's attributes, with ONNX's names and defaults.
struct AttentionAttributes {
  int64_t is_causal = 0;     // 1: causal, aligned as ONNX aligns it (below)
  int64_t kv_num_heads = 0;  // 3-D inputs: heads of K and V (required there)
  int64_t q_num_heads = 0;   // 3-D inputs: heads of Q (required there)
  // What qk_matmul_output holds: 0 the scaled logits, 1 after softcap, 2 after
  // the mask (with −∞ where excluded), 3 the softmax weights.
  int64_t qk_matmul_output_mode = 0;
  std::optional<double> scale;  // default 1/sqrt(head_size)
  double softcap = 0;           // > 0: softcap · tanh(logits / softcap), before the mask
  // The precision of the softmax, as an ONNX TensorProto data type: 0 (not
  // given), 1 FLOAT, 10 FLOAT16, 16 BFLOAT16 (all computed in float32 or, for
  // double inputs, float64) or 11 DOUBLE (float64: the reference).
  int64_t softmax_precision = 0;
  // Opset 25's sliding window: query i, at key position p = offset + i
  // (offset as for is_causal, below), sees keys p − left_window_size ..
  // p + right_window_size; −1 leaves that side open. Either way of causal.
  int64_t left_window_size = -1;
  int64_t right_window_size = -1;
  // The operator's version: 23, 24 (adds nonpad_kv_seqlen) or 25 (adds the
  // window, and refuses q_num_heads and kv_num_heads with 4-D inputs).
  int64_t opset = 25;
};

// attn_mask: none, boolean (true = takes part) or additive (Q's type).
template <class T>
using AttentionMask = std::variant<std::monostate, TensorView<const bool>, TensorView<const T>>;

template <class T>
struct AttentionOutputs {
  Tensor<T> Y;                 // (B, Hq, S, Dv), or (B, S, Hq·Dv) for 3-D inputs
  Tensor<T> present_key;       // (B, Hkv, P + L, D): past_key then K
  Tensor<T> present_value;     // (B, Hkv, P + L, Dv)
  Tensor<T> qk_matmul_output;  // (B, Hq, S, P + L); empty unless asked for
};

// Q (B, Hq, S, D), K (B, Hkv, L, D), V (B, Hkv, L, Dv), or all 3-D (B, S,
// H·D) with q_num_heads and kv_num_heads. Optional inputs are empty views.
//   attn_mask   broadcastable to (B, Hq, S, P + L); a last axis shorter than
//               P + L is padded with false / −∞
//   past_key, past_value  (B, Hkv, P, D) and (B, Hkv, P, Dv), both or neither
//   nonpad_kv_seqlen      (B,): keys j >= nonpad_kv_seqlen[b] take no part
// Causal (is_causal = 1): query i sees keys j <= i + offset, offset = P with
// a past, nonpad_kv_seqlen[b] − S with nonpad_kv_seqlen (which a past may
// not come with), and 0 (top-left) otherwise. qk_matmul_output is computed
// when asked for.
template <OnnxType T>
AttentionOutputs<T> attention(TensorView<const T> Q, TensorView<const T> K, TensorView<const T> V,
                              const AttentionMask<T>& attn_mask = {},
                              TensorView<const T> past_key = {}, TensorView<const T> past_value = {},
                              TensorView<const int64_t> nonpad_kv_seqlen = {},
                              const AttentionAttributes& attributes = {},
                              bool qk_matmul_output = false);

// RotaryEmbedding's attributes, with ONNX's names and defaults.
struct RotaryEmbeddingAttributes {
  int64_t interleaved = 0;           // 1: pairs (2i, 2i+1); 0: halves (i, i + r/2)
  int64_t num_heads = 0;             // 3-D input: heads (required there)
  int64_t rotary_embedding_dim = 0;  // r: the first r features of each head turn; 0: all
};

// X (B, H, S, D), or 3-D (B, S, H·D) with num_heads; cos_cache and sin_cache
// (max_position + 1, r/2) indexed by position_ids (B, S), or without
// position_ids (B, S, r/2). Returns Y, X's shape: pair k of row s turns by
// the angle whose cos and sin are the caches' entries.
template <OnnxType T>
Tensor<T> rotary_embedding(TensorView<const T> X, TensorView<const T> cos_cache,
                           TensorView<const T> sin_cache,
                           TensorView<const int64_t> position_ids = {},
                           const RotaryEmbeddingAttributes& attributes = {});

}  // namespace attn::onnx
