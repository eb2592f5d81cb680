// The MultiHeadLatentAttention layer's configuration (Hugging Face's
// DeepseekV3Config names, and its config.json), parameters and state
// (Hugging Face's keys, safetensors). The forward is in mla_forward.cc.
#include <cmath>
#include <random>
#include <utility>

#include <nlohmann/json.hpp>

#include "attn/io.hpp"
#include "attn/random.hpp"
#include "layer/mla_internal.hpp"

namespace attn {
using detail::mla::fail;

double MultiHeadLatentAttentionConfig::softmax_scale() const {
  double scale = 1.0 / std::sqrt(double(qk_head_dim()));
  const RopeScaling& s = rope_scaling;
  if (s.rope_type == RopeType::Yarn && s.mscale_all_dim.value_or(0) != 0) {
    const double factor = rope_frequencies(qk_rope_head_dim, rope_theta, s).factor;  // given, or the ratio
    const double mscale = factor <= 1 ? 1.0 : 0.1 * *s.mscale_all_dim * std::log(factor) + 1.0;
    scale *= mscale * mscale;
  }
  return scale;
}

void MultiHeadLatentAttentionConfig::validate() const {
  const auto at_least = [](int64_t v, int64_t low, const char* name) {
    if (v < low) fail(std::string(name) + " must be >= " + std::to_string(low) + ", got " + std::to_string(v));
  };
  at_least(hidden_size, 1, "hidden_size");
  at_least(num_attention_heads, 1, "num_attention_heads");
  if (q_lora_rank) at_least(*q_lora_rank, 1, "q_lora_rank");
  at_least(kv_lora_rank, 1, "kv_lora_rank");
  at_least(qk_nope_head_dim, 0, "qk_nope_head_dim");
  at_least(qk_rope_head_dim, 0, "qk_rope_head_dim");
  at_least(v_head_dim, 1, "v_head_dim");
  if (qk_rope_head_dim % 2 != 0) fail("qk_rope_head_dim must be even (RoPE turns pairs), got " + std::to_string(qk_rope_head_dim));
  if (qk_head_dim() < 1) fail("qk_nope_head_dim + qk_rope_head_dim must be >= 1");
  if (!(rope_theta > 0) || !std::isfinite(rope_theta))
    fail("rope_theta must be a finite number > 0, got " + std::to_string(rope_theta));
  if (!(rms_norm_eps >= 0) || !std::isfinite(rms_norm_eps))
    fail("rms_norm_eps must be a finite number >= 0, got " + std::to_string(rms_norm_eps));
  if (rope_scaling.partial_rotary_factor != 1.0 || !rope_scaling.mrope_section.empty())
    fail("rope_scaling: MLA rotates the whole qk_rope_head_dim: no partial_rotary_factor or mrope_section");
  try {
    rope_frequencies(qk_rope_head_dim, rope_theta, rope_scaling);  // every key checked now
  } catch (const ValueError& e) {
    fail(std::string("rope_scaling: ") + e.what());
  }
}

std::map<std::string, Shape> MultiHeadLatentAttentionConfig::state_dict_shapes() const {
  const int64_t E = hidden_size, H = num_attention_heads, r = kv_lora_rank, p = qk_rope_head_dim;
  std::map<std::string, Shape> s;
  if (q_lora_rank) {
    s["q_a_proj.weight"] = {*q_lora_rank, E};
    s["q_a_layernorm.weight"] = {*q_lora_rank};
    s["q_b_proj.weight"] = {H * qk_head_dim(), *q_lora_rank};
    if (attention_bias) s["q_a_proj.bias"] = {*q_lora_rank};
  } else {
    s["q_proj.weight"] = {H * qk_head_dim(), E};
  }
  s["kv_a_proj_with_mqa.weight"] = {r + p, E};
  s["kv_a_layernorm.weight"] = {r};
  s["kv_b_proj.weight"] = {H * (qk_nope_head_dim + v_head_dim), r};
  s["o_proj.weight"] = {E, H * v_head_dim};
  if (attention_bias) {
    s["kv_a_proj_with_mqa.bias"] = {r + p};
    s["o_proj.bias"] = {E};
  }
  return s;
}

MultiHeadLatentAttentionConfig mla_config_from_json(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(std::string("from_config: not JSON: ") + e.what());
  }
  if (!j.is_object()) fail("from_config: expected a config dict, got " + j.dump());
  const auto integer = [&](const char* key) -> std::optional<int64_t> {
    if (!j.contains(key) || j[key].is_null()) return std::nullopt;
    if (!j[key].is_number_integer()) fail(std::string("from_config: '") + key + "' must be an integer, got " + j[key].dump());
    return j[key].get<int64_t>();
  };
  const auto required = [&](const char* key) {
    const auto v = integer(key);
    if (!v) fail(std::string("from_config: the config has no '") + key + "'");
    return *v;
  };
  const auto boolean = [&](const char* key, bool dflt) {
    if (!j.contains(key) || j[key].is_null()) return dflt;
    if (!j[key].is_boolean()) fail(std::string("from_config: '") + key + "' must be true or false, got " + j[key].dump());
    return j[key].get<bool>();
  };
  MultiHeadLatentAttentionConfig c;
  c.hidden_size = required("hidden_size");
  c.num_attention_heads = required("num_attention_heads");
  c.q_lora_rank = integer("q_lora_rank");
  c.kv_lora_rank = required("kv_lora_rank");
  c.qk_nope_head_dim = required("qk_nope_head_dim");
  c.qk_rope_head_dim = required("qk_rope_head_dim");
  c.v_head_dim = required("v_head_dim");
  c.rope_interleave = boolean("rope_interleave", true);
  c.attention_bias = boolean("attention_bias", false);
  // transformers v5's rope_parameters (rope_theta inside), or rope_scaling
  nlohmann::json rope = nullptr;
  if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) rope = j["rope_parameters"];
  else if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) rope = j["rope_scaling"];
  if (!rope.is_null() && !rope.is_object()) fail("from_config: rope_scaling must be a dict or null, got " + rope.dump());
  nlohmann::json theta = j.contains("rope_theta") ? j["rope_theta"] : nlohmann::json(nullptr);
  if (rope.is_object() && rope.contains("rope_theta")) theta = rope["rope_theta"], rope.erase("rope_theta");
  if (!theta.is_null()) {
    if (!theta.is_number()) fail("from_config: 'rope_theta' must be a number, got " + theta.dump());
    c.rope_theta = theta.get<double>();
  }
  if (rope.is_object()) {
    const nlohmann::json type = rope.contains("rope_type") ? rope["rope_type"] : rope.value("type", nlohmann::json("default"));
    const bool takes_max = type == "yarn" || type == "longrope" || type == "dynamic";
    if (takes_max && !rope.contains("max_position_embeddings"))
      if (const auto m = integer("max_position_embeddings")) rope["max_position_embeddings"] = *m;
    if (type != "default") {
      try {
        c.rope_scaling = parse_rope_scaling(rope.dump());
      } catch (const ValueError& e) {
        fail(std::string("from_config: rope_scaling: ") + e.what());
      }
    }
  }
  c.validate();
  return c;
}

MultiHeadLatentAttention::MultiHeadLatentAttention(const MultiHeadLatentAttentionConfig& config, uint64_t seed)
    : config_(config) {
  config_.validate();
  std::mt19937_64 rng(seed);
  std::map<std::string, Tensor<float>> state;
  for (const auto& [name, shape] : config_.state_dict_shapes()) {
    Tensor<float> t(shape);
    if (name.find("layernorm") != std::string::npos) std::fill(t.data(), t.data() + t.numel(), 1.0f);
    else if (shape.size() == 2) t = uniform<float>(shape, 1.0 / std::sqrt(double(shape[1])), rng);
    state.emplace(name, std::move(t));  // biases: zero
  }
  params_ = std::make_shared<const Parameters>(config_, std::move(state));
}

MultiHeadLatentAttention::MultiHeadLatentAttention(const MultiHeadLatentAttention& other)
    : config_(other.config_), params_(other.snapshot()) {}

MultiHeadLatentAttention& MultiHeadLatentAttention::operator=(const MultiHeadLatentAttention& other) {
  if (this == &other) return *this;
  auto p = other.snapshot();
  std::lock_guard lock(mutex_);
  config_ = other.config_;
  params_ = std::move(p);
  return *this;
}

std::shared_ptr<const MultiHeadLatentAttention::Parameters> MultiHeadLatentAttention::snapshot() const {
  std::lock_guard lock(mutex_);
  return params_;
}

LatentCache MultiHeadLatentAttention::new_cache(KVDtype dtype) const {
  return LatentCache(dtype, config_.kv_lora_rank, config_.qk_rope_head_dim);
}

PagedKVCache MultiHeadLatentAttention::new_paged_cache(int64_t num_pages, int64_t page_size, KVDtype dtype) const {
  return PagedKVCache::latent(num_pages, page_size, config_.kv_lora_rank, config_.qk_rope_head_dim, dtype);
}

std::map<std::string, Tensor<float>> MultiHeadLatentAttention::state_dict() const { return snapshot()->named; }

void MultiHeadLatentAttention::load_state_dict(const std::map<std::string, Tensor<float>>& state) {
  const auto expected = config_.state_dict_shapes();
  std::string names;
  for (const auto& [n, e] : expected) names += (names.empty() ? "" : ", ") + n;
  for (const auto& [name, t] : state)
    if (!expected.count(name)) fail("load_state_dict: unexpected key '" + name + "' (expected " + names + ")");
  for (const auto& [name, e] : expected) {
    const auto it = state.find(name);
    if (it == state.end()) fail("load_state_dict: missing key '" + name + "'");
    if (it->second.shape() != e)
      fail("load_state_dict: '" + name + "' has shape " + shape_str(it->second.shape()) + ", expected " + shape_str(e));
  }
  auto p = std::make_shared<const Parameters>(config_, state);
  std::lock_guard lock(mutex_);
  params_ = std::move(p);
}

void MultiHeadLatentAttention::load_safetensors(const std::string& path, const std::string& prefix) {
  Safetensors file = read_safetensors(path);
  std::map<std::string, Tensor<float>> state;
  for (auto& [name, t] : file.tensors)
    if (name.compare(0, prefix.size(), prefix) == 0) state.emplace(name.substr(prefix.size()), std::move(t));
  try {
    load_state_dict(state);
  } catch (const ValueError& e) {
    throw ValueError(path + (prefix.empty() ? "" : " (prefix '" + prefix + "')") + ": " + e.what());
  }
}

}  // namespace attn
