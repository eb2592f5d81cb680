// RoPE's frequencies and the ways models rescale them to run past the
// context they were trained on: Hugging Face's rope_scaling (its rope_type
// and keys, with the same defaults: transformers' modeling_rope_utils.py),
// as Llama 3.x, Qwen2, Mistral, DeepSeek and Phi-3 configure it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace attn {

// Hugging Face's rope_type: how inv_freq is derived from the base.
enum class RopeType {
  Default,   // base^(-2k/r)
  Linear,    // position interpolation: inv_freq / factor
  Dynamic,   // NTK-aware: a larger base once the sequence outgrows the original context
  Yarn,      // per-pair blend of interpolation and extrapolation, and an attention factor
  LongRope,  // per-pair factors, short or long by the sequence length (Phi-3)
  Llama3,    // low frequencies / factor, high ones kept, a smooth ramp between
};

// "default", "linear", "dynamic", "yarn", "longrope", "llama3".
std::string rope_type_name(RopeType type);

// One rope_scaling dict. A key left unset takes Hugging Face's default or is
// derived as Hugging Face derives it; where Hugging Face reads a value from
// the model's config (max_position_embeddings, partial_rotary_factor), it is
// a key here.
struct RopeScaling {
  RopeType rope_type = RopeType::Default;
  std::optional<double> factor;
  // The context length the model was trained with, and (yarn, longrope) the
  // one it is extended to; yarn and longrope derive factor from their ratio
  // when factor is unset.
  std::optional<int64_t> original_max_position_embeddings;
  std::optional<int64_t> max_position_embeddings;
  std::optional<double> attention_factor;   // yarn, longrope: multiplies cos and sin
  std::optional<double> beta_fast, beta_slow;  // yarn: 32 and 1 when unset (or 0)
  std::optional<double> mscale, mscale_all_dim;  // yarn (DeepSeek): the attention factor's ratio
  bool truncate = true;                       // yarn: whole-pair correction range
  std::vector<double> short_factor, long_factor;  // longrope: one per pair
  std::optional<double> low_freq_factor, high_freq_factor;  // llama3
  // The rotated share of a head: rotary_dim = int(head_dim * factor), for
  // the functions that know a head dim (apply_rope's default, the layer).
  double partial_rotary_factor = 1.0;
  // M-RoPE (Qwen2-VL): pairs in consecutive sections, section s turning by
  // position row s (empty: one position per row). Hugging Face's type
  // "mrope" is the default type with this key.
  std::vector<int64_t> mrope_section;

  friend bool operator==(const RopeScaling&, const RopeScaling&) = default;
};

// Parses a rope_scaling dict written as JSON (Hugging Face's config.json
// form): "rope_type" (or the legacy "type") and that type's keys. An unknown
// rope_type, a missing or unknown key, or a value of the wrong kind or range
// is a ValueError naming it. Values are checked as rope_frequencies uses them.
RopeScaling parse_rope_scaling(const std::string& json);
// The dict back as JSON: rope_type and every key that is set, so that
// parse_rope_scaling(rope_scaling_json(s)) == s.
std::string rope_scaling_json(const RopeScaling& scaling);

// What Hugging Face's rope init functions return: inv_freq[k] for the
// rotary_dim / 2 pairs, and the factor that multiplies cos and sin.
struct RopeFrequencies {
  std::vector<double> inv_freq;
  double attention_factor = 1.0;
  double factor = 1.0;  // the scaling factor, given or derived (yarn, longrope: the context ratio)
};

// The frequencies of pairs k = 0 .. rotary_dim/2 - 1 for `base` and
// `scaling`, in double. seq_len, the current sequence length (the largest
// position + 1), selects dynamic's base and longrope's long or short
// factors; unset, it is the original context (no dynamic growth, short
// factors). rotary_dim must be even and in [0, kMaxRotaryDim] (> 2 for
// dynamic); a key the type needs and cannot derive is a ValueError naming it.
RopeFrequencies rope_frequencies(int64_t rotary_dim, double base = 10000.0,
                                 const RopeScaling& scaling = {},
                                 std::optional<int64_t> seq_len = std::nullopt);
// 2^24: far beyond any head dimension (tens to hundreds), small enough that
// the frequencies always fit in memory; larger is a ValueError naming the
// range, not a failed allocation.
inline constexpr int64_t kMaxRotaryDim = int64_t{1} << 24;

}  // namespace attn
