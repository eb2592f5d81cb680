// Internal to the layer room: what the MultiHeadLatentAttention files
// (mla.cc: configuration and state, mla_forward.cc) share.
#pragma once

#include <map>
#include <string>

#include "attn/error.hpp"
#include "attn/multi_head_latent_attention.hpp"

namespace attn::detail::mla {

[[noreturn]] inline void fail(const std::string& msg) { throw ValueError("MultiHeadLatentAttention: " + msg); }

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
};

}  // namespace attn
