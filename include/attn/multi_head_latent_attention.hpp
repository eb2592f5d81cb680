// Multi-head latent attention as a layer: DeepSeek-V2/V3's attention block
// (Hugging Face's DeepseekV3Attention), with its configuration names and
// state_dict keys, a latent cache (attn/latent_cache.hpp) and the absorbed
// decode (attn/latent_attention.hpp).
//
// Per token x (hidden_size):
//   q       = q_b_proj(RMSNorm(q_a_proj(x)))   or q_proj(x) when q_lora_rank is None
//             per head: [q_nope (qk_nope_head_dim) | q_pe (qk_rope_head_dim)]
//   [c | k_pe] = kv_a_proj_with_mqa(x);  c = RMSNorm(c) (kv_a_layernorm)
//   q_pe, k_pe rotated (RoPE at the token's position; k_pe one head for all)
//   per head: k = [W_UK c | k_pe], v = W_UV c, with kv_b_proj's rows for the
//             head being [W_UK (qk_nope_head_dim) ; W_UV (v_head_dim)]
//   causal attention with softmax_scale(), heads concatenated, o_proj.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "attn/kv_cache.hpp"
#include "attn/latent_cache.hpp"
#include "attn/paged_kv_cache.hpp"
#include "attn/rope_scaling.hpp"
#include "attn/tensor.hpp"

namespace attn {

// Hugging Face's DeepseekV3Config names.
struct MultiHeadLatentAttentionConfig {
  int64_t hidden_size = 0;
  int64_t num_attention_heads = 1;
  std::optional<int64_t> q_lora_rank;  // none: q_proj instead of q_a_proj, q_a_layernorm, q_b_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  double rope_theta = 10000.0;
  // Hugging Face's rope_scaling (default type: none). With YaRN's
  // mscale_all_dim the softmax scale changes too (softmax_scale()).
  RopeScaling rope_scaling;
  bool rope_interleave = true;   // RoPE on pairs (2i, 2i + 1), DeepSeek's checkpoints
  bool attention_bias = false;   // biases on q_a_proj (or none on q_proj), kv_a_proj_with_mqa, o_proj
  double rms_norm_eps = 1e-6;    // the two latents' RMSNorm (Hugging Face's attention fixes 1e-6)

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // qk_head_dim^-0.5, times mscale² where YaRN's mscale_all_dim is set and
  // nonzero: mscale = 0.1 · mscale_all_dim · ln(factor) + 1 (1 for factor ≤ 1),
  // factor as the rope scaling derives it.
  double softmax_scale() const;
  // Throws ValueError naming the field.
  void validate() const;
  // The state_dict's names and shapes (Hugging Face's keys, `<name>.weight`).
  std::map<std::string, Shape> state_dict_shapes() const;
};

// A Hugging Face config (config.json's text, a DeepseekV3Config): the fields
// above by name, others ignored. rope_scaling takes "type" or "rope_type";
// transformers v5's rope_parameters (with rope_theta inside) is read too.
// The config's max_position_embeddings joins the rope scaling where its type
// takes that key, so YaRN's factor, when the dict gives none, is
// max_position_embeddings / original_max_position_embeddings.
MultiHeadLatentAttentionConfig mla_config_from_json(const std::string& hf_config_json);

// How forward attends: the absorbed form (W_UK folded into the query, W_UV
// into the output, MQA over the latent rows, each row read once for all
// heads), or the expanded form (per head keys of qk_head_dim and values of
// v_head_dim, as Hugging Face computes). Auto: expanded for a call that
// starts a sequence (a prompt: no cached tokens), absorbed otherwise.
enum class LatentForm { Auto, Absorbed, Expanded };

// float32 parameters and arithmetic. Threads: as MultiHeadAttention, every
// call works on the parameter set current when it started.
class MultiHeadLatentAttention {
 public:
  // Weights as nn.Linear's (uniform ±1/sqrt(fan_in)), biases zero, the
  // RMSNorm weights one; reproducible from `seed`.
  explicit MultiHeadLatentAttention(const MultiHeadLatentAttentionConfig& config, uint64_t seed = 0);
  MultiHeadLatentAttention(const MultiHeadLatentAttention& other);
  MultiHeadLatentAttention& operator=(const MultiHeadLatentAttention& other);

  const MultiHeadLatentAttentionConfig& config() const { return config_; }

  // x (batch, n, hidden_size) or unbatched (n, hidden_size) -> the same
  // shape. Causal. positions (n,) or (batch, n), int64: the RoPE positions
  // (default: cache length + 0..n-1). With a cache, this call's latents are
  // appended (stored as the cache stores them, then read back) and the
  // queries attend everything it holds; its batch must match the cache's.
  Tensor<float> forward(TensorView<const float> x, LatentCache* cache = nullptr,
                        TensorView<const int64_t> positions = {}, LatentForm form = LatentForm::Auto) const;

  // Serving many sequences over one paged latent cache (new_paged_cache):
  // x (total, hidden_size) packs their new tokens, sequence seq_ids[i]'s
  // rows cu_seqlens[i] .. cu_seqlens[i + 1] (int64). Each sequence's tokens
  // sit at its next positions (length + 0..n-1), are appended, and attend
  // it causally in the absorbed form: one batch_attention over the pages
  // for every sequence, prompts and decodes alike (a q8_0 cache: each
  // sequence through a float32 copy of its rows). Returns (total,
  // hidden_size). ValueError for a cache of other rows, KeyError for an
  // unknown id: nothing appended.
  Tensor<float> forward(TensorView<const float> x, PagedKVCache& cache, const std::vector<int64_t>& seq_ids,
                        TensorView<const int64_t> cu_seqlens) const;

  LatentCache new_cache(KVDtype dtype = KVDtype::F32) const;
  // An empty PagedKVCache::latent of this layer's rows.
  PagedKVCache new_paged_cache(int64_t num_pages, int64_t page_size, KVDtype dtype = KVDtype::F32) const;

  std::map<std::string, Tensor<float>> state_dict() const;
  // Every expected key with its shape and no other; ValueError naming it.
  void load_state_dict(const std::map<std::string, Tensor<float>>& state);
  // A safetensors file holding this layer's tensors under its keys, with an
  // optional prefix (a checkpoint's "model.layers.0.self_attn."): only the
  // keys under the prefix are read, and every expected one must be there.
  void load_safetensors(const std::string& path, const std::string& prefix = "");

 private:
  struct Parameters;
  std::shared_ptr<const Parameters> snapshot() const;

  MultiHeadLatentAttentionConfig config_;
  mutable std::mutex mutex_;
  std::shared_ptr<const Parameters> params_;
};

}  // namespace attn
