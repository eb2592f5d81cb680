// The MultiHeadAttention layer's state: its parameters under PyTorch's
// names (state_dict, load_state_dict, the gradients' names), the
// configuration as safetensors metadata, and its files (save, load).
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "attn/io.hpp"
#include "attn/rope_scaling.hpp"
#include "layer/mha_internal.hpp"

namespace attn {
using namespace detail::mha;

template <class T>
std::map<std::string, Tensor<T>> MultiHeadAttention<T>::state_dict() const {
  return named(*snapshot());
}

template <class T>
std::map<std::string, Tensor<T>> MultiHeadAttention<T>::gradient_dict(
    const MhaGradients<T>& gradients) const {
  Parameters g;
  auto slots = g.list(config_);
  if (gradients.parameters.size() != slots.size())
    fail("gradient_dict: " + std::to_string(gradients.parameters.size()) +
         " gradients for a layer of " + std::to_string(slots.size()) + " parameters");
  for (size_t i = 0; i < slots.size(); ++i)
    *const_cast<Tensor<T>*>(slots[i]) = gradients.parameters[i];
  return named(g);
}

template <class T>
std::map<std::string, Tensor<T>> MultiHeadAttention<T>::named(const Parameters& p) const {
  const Parameters* w = &p;
  std::map<std::string, Tensor<T>> s;
  const auto cat = [](std::initializer_list<const Tensor<T>*> parts, Shape shape) {
    Tensor<T> t(std::move(shape));
    T* p = t.data();
    for (const auto* part : parts) p = std::copy(part->data(), part->data() + part->numel(), p);
    return t;
  };
  if (config_.packed()) {
    s["in_proj_weight"] = cat({&w->wq, &w->wk, &w->wv}, {3 * config_.embed_dim, config_.embed_dim});
  } else {
    s["q_proj_weight"] = w->wq;
    s["k_proj_weight"] = w->wk;
    s["v_proj_weight"] = w->wv;
  }
  if (config_.bias) {
    s["in_proj_bias"] =
        cat({&w->bq, &w->bk, &w->bv}, {w->bq.numel() + w->bk.numel() + w->bv.numel()});
    s["out_proj.bias"] = w->bo;
  }
  s["out_proj.weight"] = w->wo;
  if (config_.add_bias_kv) {
    s["bias_k"] = w->bias_k;
    s["bias_v"] = w->bias_v;
  }
  if (config_.sinks) s["sinks"] = w->sinks;
  if (config_.gate != Gate::None) s["gate_proj.weight"] = w->wg;
  if (config_.gate != Gate::None && config_.bias) s["gate_proj.bias"] = w->bg;
  return s;
}

template <class T>
void MultiHeadAttention<T>::load_state_dict(const std::map<std::string, Tensor<T>>& state) {
  const auto expected = config_.state_dict_shapes();
  for (const auto& [name, t] : state)
    if (!expected.count(name)) {
      std::string names;
      for (const auto& [n, e] : expected) names += (names.empty() ? "" : ", ") + n;
      const bool bias_kv = name == "bias_k" || name == "bias_v";
      fail("load_state_dict: unexpected key '" + name + "' (expected " + names + ")" +
           (bias_kv ? "; it comes from nn.MultiheadAttention(add_bias_kv=True): build the layer "
                      "with add_bias_kv=True"
                    : name == "sinks" ? "; build the layer with sinks=True"
                    : name.rfind("gate_proj.", 0) == 0 ? "; build the layer with gate='headwise' or 'elementwise'"
                                                       : ""));
    }
  for (const auto& [name, e] : expected) {
    const auto it = state.find(name);
    if (it == state.end()) fail("load_state_dict: missing key '" + name + "'");
    if (it->second.shape() != e)
      fail("load_state_dict: '" + name + "' has shape " + shape_str(it->second.shape()) +
           ", expected " + shape_str(e));
  }
  // A new set, built whole and then swapped in: forwards running meanwhile
  // keep the old one.
  auto w = std::make_shared<Parameters>();
  // Consecutive pieces of a packed tensor, each with its target's shape.
  const auto split = [](const Tensor<T>& src, std::initializer_list<std::pair<Tensor<T>*, Shape>> parts) {
    const T* p = src.data();
    for (const auto& [part, shape] : parts) {
      *part = Tensor<T>(shape);
      std::copy_n(p, part->numel(), part->data());
      p += part->numel();
    }
  };
  const int64_t E = config_.embed_dim, kv = config_.kv_heads() * config_.head_dim();
  if (config_.packed()) {
    split(state.at("in_proj_weight"), {{&w->wq, {E, E}}, {&w->wk, {E, E}}, {&w->wv, {E, E}}});
  } else {
    w->wq = state.at("q_proj_weight");
    w->wk = state.at("k_proj_weight");
    w->wv = state.at("v_proj_weight");
  }
  if (config_.bias) {
    split(state.at("in_proj_bias"), {{&w->bq, {E}}, {&w->bk, {kv}}, {&w->bv, {kv}}});
    w->bo = state.at("out_proj.bias");
  }
  w->wo = state.at("out_proj.weight");
  if (config_.add_bias_kv) {
    w->bias_k = state.at("bias_k");
    w->bias_v = state.at("bias_v");
  }
  if (config_.sinks) w->sinks = state.at("sinks");
  if (config_.gate != Gate::None) w->wg = state.at("gate_proj.weight");
  if (config_.gate != Gate::None && config_.bias) w->bg = state.at("gate_proj.bias");
  std::lock_guard lock(mutex_);
  params_ = std::move(w);
}

std::map<std::string, std::string> to_metadata(const MultiHeadAttentionConfig& c) {
  std::map<std::string, std::string> m{
      {"format", "attn.MultiHeadAttention"},
      {"embed_dim", std::to_string(c.embed_dim)},
      {"num_heads", std::to_string(c.num_heads)},
      {"kdim", std::to_string(c.key_dim())},
      {"vdim", std::to_string(c.value_dim())},
      {"bias", c.bias ? "true" : "false"},
      {"rope", c.rope ? "true" : "false"},
      {"rope_interleaved", c.rope_interleaved ? "true" : "false"},
      {"alibi", c.alibi ? "true" : "false"},
      {"sinks", c.sinks ? "true" : "false"},
      {"gate", gate_name(c.gate)},
      {"add_bias_kv", c.add_bias_kv ? "true" : "false"},
      {"add_zero_attn", c.add_zero_attn ? "true" : "false"},
      {"batch_first", c.batch_first ? "true" : "false"},
  };
  const auto number = [](double x) {
    char text[64];
    std::snprintf(text, sizeof text, "%.17g", x);
    return std::string(text);
  };
  m["rope_base"] = number(c.rope_base);
  m["dropout"] = number(c.dropout);
  if (c.num_kv_heads) m["num_kv_heads"] = std::to_string(*c.num_kv_heads);
  if (!(c.rope_scaling == RopeScaling{})) m["rope_scaling"] = rope_scaling_json(c.rope_scaling);
  return m;
}

MultiHeadAttentionConfig from_metadata(const std::string& path,
                                       const std::map<std::string, std::string>& m) {
  const auto bad = [&](const std::string& what) {
    throw ValueError(path + ": " + what);
  };
  const auto get_int = [&](const char* key) -> std::optional<int64_t> {
    const auto it = m.find(key);
    if (it == m.end()) return std::nullopt;
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(it->second, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != it->second.size())
      bad("metadata '" + std::string(key) + "' is not an integer: '" + it->second + "'");
    return v;
  };
  const auto get_bool = [&](const char* key, bool dflt) {
    const auto it = m.find(key);
    if (it == m.end()) return dflt;
    if (it->second == "true" || it->second == "True" || it->second == "1") return true;
    if (it->second == "false" || it->second == "False" || it->second == "0") return false;
    bad("metadata '" + std::string(key) + "' is not a boolean: '" + it->second + "'");
    return dflt;
  };
  MultiHeadAttentionConfig c;
  const auto e = get_int("embed_dim"), h = get_int("num_heads");
  if (!e || !h)
    bad("no embed_dim and num_heads in the safetensors __metadata__; write the file with "
        "MultiHeadAttention.save or tools/export_torch_mha.py");
  c.embed_dim = *e;
  c.num_heads = *h;
  c.num_kv_heads = get_int("num_kv_heads");
  const auto kd = get_int("kdim"), vd = get_int("vdim");
  if (kd && *kd != c.embed_dim) c.kdim = kd;
  if (vd && *vd != c.embed_dim) c.vdim = vd;
  c.bias = get_bool("bias", true);
  c.rope = get_bool("rope", false);
  c.rope_interleaved = get_bool("rope_interleaved", false);
  c.alibi = get_bool("alibi", false);
  c.sinks = get_bool("sinks", false);
  if (const auto it = m.find("gate"); it != m.end()) {
    try {
      c.gate = parse_gate(it->second);
    } catch (const ValueError& e) {
      bad(std::string("metadata 'gate': ") + e.what());
    }
  }
  if (const auto it = m.find("rope_scaling"); it != m.end()) {
    try {
      c.rope_scaling = parse_rope_scaling(it->second);
    } catch (const ValueError& e) {
      bad(std::string("metadata 'rope_scaling': ") + e.what());
    }
  }
  c.add_bias_kv = get_bool("add_bias_kv", false);
  c.add_zero_attn = get_bool("add_zero_attn", false);
  c.batch_first = get_bool("batch_first", true);
  const auto get_number = [&](const char* key, double dflt) {
    const auto it = m.find(key);
    if (it == m.end()) return dflt;
    char* end = nullptr;
    const double x = std::strtod(it->second.c_str(), &end);
    if (end == it->second.c_str() || *end) bad("metadata '" + std::string(key) + "' is not a number");
    return x;
  };
  c.rope_base = get_number("rope_base", c.rope_base);
  c.dropout = get_number("dropout", 0.0);
  return c;
}

template <class T>
void MultiHeadAttention<T>::save(const std::string& path, StorageDtype dtype) const {
  std::map<std::string, Tensor<float>> f32;
  for (auto& [name, t] : state_dict()) {
    Tensor<float> f(t.shape());
    std::copy(t.data(), t.data() + t.numel(), f.data());
    f32.emplace(name, std::move(f));
  }
  std::map<std::string, TensorView<const float>> views;
  for (const auto& [name, t] : f32) views.emplace(name, t.view());
  write_safetensors(path, views, to_metadata(config_), dtype);
}

template <class T>
MultiHeadAttention<T> MultiHeadAttention<T>::load(const std::string& path) {
  Safetensors file = read_safetensors(path);
  const MultiHeadAttentionConfig config = from_metadata(path, file.metadata);
  try {
    config.validate();
  } catch (const ValueError& e) {
    throw ValueError(path + ": its metadata: " + e.what());
  }
  // The metadata against the file's own tensors, before a layer of the size
  // it claims is built: 1.8 KB that claimed embed_dim 16384 made 4.2 GB.
  for (const auto& [name, shape] : config.state_dict_shapes()) {
    const auto it = file.tensors.find(name);
    const std::string claims = "its metadata (embed_dim " + std::to_string(config.embed_dim) + ", num_heads " +
                               std::to_string(config.num_heads) + ") needs a tensor '" + name + "' of shape " +
                               shape_str(shape);
    if (it == file.tensors.end()) throw ValueError(path + ": " + claims + ", which the file does not hold");
    if (it->second.shape() != shape)
      throw ValueError(path + ": " + claims + "; the file's is " + shape_str(it->second.shape()));
  }
  MultiHeadAttention layer(config);
  std::map<std::string, Tensor<T>> state;
  for (auto& [name, t] : file.tensors) {
    Tensor<T> c(t.shape());
    std::copy(t.data(), t.data() + t.numel(), c.data());
    state.emplace(name, std::move(c));
  }
  try {
    layer.load_state_dict(state);
  } catch (const ValueError& e) {
    throw ValueError(path + ": " + e.what());
  }
  return layer;
}

#define ATTN_MHA_STATE(T)                                                                                        \
  template std::map<std::string, Tensor<T>> MultiHeadAttention<T>::state_dict() const;                          \
  template std::map<std::string, Tensor<T>> MultiHeadAttention<T>::gradient_dict(const MhaGradients<T>&) const; \
  template std::map<std::string, Tensor<T>> MultiHeadAttention<T>::named(const Parameters&) const;              \
  template void MultiHeadAttention<T>::load_state_dict(const std::map<std::string, Tensor<T>>&);               \
  template void MultiHeadAttention<T>::save(const std::string&, StorageDtype) const;                            \
  template MultiHeadAttention<T> MultiHeadAttention<T>::load(const std::string&);
ATTN_MHA_STATE(float)
ATTN_MHA_STATE(double)
#undef ATTN_MHA_STATE

}  // namespace attn
