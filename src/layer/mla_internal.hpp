// Internal to the layer room: what the MultiHeadLatentAttention files
// (mla.cc: configuration and state, mla_forward.cc) share.
#pragma once

#include <map>
#include <string>

#include "attn/error.hpp"
#include "attn/tensor.hpp"
#include "attn/multi_head_latent_attention.hpp"

namespace attn::detail::mla {

[[noreturn]] inline void fail(const std::string& msg) { throw ValueError("MultiHeadLatentAttention: " + msg); }

// RoPE on the query rows' q_pe parts (every head) and the latent rows'
// k_pe, (B, n) tokens: at offset + t, or at positions (n,) or (B, n).
void rotate(const MultiHeadLatentAttentionConfig& c, Tensor<float>& q, Tensor<float>& kv, int64_t B, int64_t n,
            int64_t offset, TensorView<const int64_t> positions);

}  // namespace attn::detail::mla

namespace attn {

// A parameter set under Hugging Face's keys, with what the absorbed form
// derives from it once: W_UKᵀ per head, (H, kv_lora_rank, qk_nope_head_dim)
// contiguous, so folding W_UK into a query is one product per head.
struct MultiHeadLatentAttention::Parameters {
  std::map<std::string, Tensor<float>> named;
  Tensor<float> w_uk_t;

  Parameters(const MultiHeadLatentAttentionConfig& c, std::map<std::string, Tensor<float>> state)
      : named(std::move(state)) {
    const int64_t H = c.num_attention_heads, r = c.kv_lora_rank, nope = c.qk_nope_head_dim, v = c.v_head_dim;
    const Tensor<float>& kv_b = named.at("kv_b_proj.weight");  // (H (nope + v), r)
    w_uk_t = Tensor<float>({H, r, nope});
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < nope; ++i)
        for (int64_t j = 0; j < r; ++j) w_uk_t[(h * r + j) * nope + i] = kv_b[(h * (nope + v) + i) * r + j];
  }
  const Tensor<float>& operator[](const std::string& name) const { return named.at(name); }
  bool has(const std::string& name) const { return named.count(name) > 0; }
  TensorView<const float> bias_of(const std::string& name) const {
    return has(name) ? named.at(name).view() : TensorView<const float>();
  }

  // What both forwards (mla_forward.cc, mla_serve.cc) compute, on token rows:
  // the query rows (N, H · qk_head_dim) and the normalised latent rows
  // (N, r + p) of x (N, hidden_size), RoPE not yet applied;
  void project(const MultiHeadLatentAttentionConfig& c, TensorView<const float> x, Tensor<float>& q,
               Tensor<float>& kv) const;
  // q_nope · W_UK per head for n query rows (as project lays them out): (n, H, r);
  Tensor<float> absorb(const MultiHeadLatentAttentionConfig& c, const float* q, int64_t n) const;
  // latent outputs (n, H, r) · W_UVᵀ per head into context rows (n, H · v_head_dim).
  void expand_values(const MultiHeadLatentAttentionConfig& c, const float* latent, int64_t n, float* ctx) const;
};

}  // namespace attn
