// The MultiHeadAttention layer's configuration and parameters: the checks
// of a configuration, PyTorch's initialisation, copies, and the parameter
// set calls share. Its forward, backward and state dict are in mha_*.cc.
#include "attn/multi_head_attention.hpp"

#include <atomic>
#include <cmath>
#include <random>
#include <utility>

#include "layer/mha_internal.hpp"
#include "attn/random.hpp"

namespace attn {
using namespace detail::mha;
namespace {

uint64_t new_layer_id() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}


// Xavier-uniform, as torch.nn.init.xavier_uniform_: bound sqrt(6 / (fan_in + fan_out)).
template <class T>
Tensor<T> xavier(int64_t rows, int64_t cols, std::mt19937_64& rng) {
  return uniform<T>({rows, cols}, std::sqrt(6.0 / double(rows + cols)), rng);
}

}  // namespace

std::string gate_name(Gate gate) {
  return gate == Gate::Headwise ? "headwise" : gate == Gate::Elementwise ? "elementwise" : "none";
}

Gate parse_gate(const std::string& name) {
  for (Gate g : {Gate::None, Gate::Headwise, Gate::Elementwise})
    if (name == gate_name(g)) return g;
  fail("gate must be 'none', 'headwise' or 'elementwise', got '" + name + "'");
}

std::map<std::string, Shape> MultiHeadAttentionConfig::state_dict_shapes() const {
  const int64_t E = embed_dim, kv = kv_heads() * head_dim();
  std::map<std::string, Shape> s;
  if (packed()) {
    s["in_proj_weight"] = {3 * E, E};
  } else {
    s["q_proj_weight"] = {E, E};
    s["k_proj_weight"] = {kv, key_dim()};
    s["v_proj_weight"] = {kv, value_dim()};
  }
  if (bias) {
    s["in_proj_bias"] = {E + 2 * kv};
    s["out_proj.bias"] = {E};
  }
  s["out_proj.weight"] = {E, E};
  if (add_bias_kv) s["bias_k"] = s["bias_v"] = {1, 1, kv};
  if (sinks) s["sinks"] = {num_heads};
  if (gate != Gate::None) {
    s["gate_proj.weight"] = {gate_width(), E};
    if (bias) s["gate_proj.bias"] = {gate_width()};
  }
  return s;
}

void MultiHeadAttentionConfig::validate() const {
  if (embed_dim < 1) fail("embed_dim must be >= 1, got " + std::to_string(embed_dim));
  if (num_heads < 1) fail("num_heads must be >= 1, got " + std::to_string(num_heads));
  if (embed_dim % num_heads != 0)
    fail("embed_dim (" + std::to_string(embed_dim) + ") must be divisible by num_heads (" +
         std::to_string(num_heads) + ")");
  if (kv_heads() < 1 || num_heads % kv_heads() != 0)
    fail("num_kv_heads (" + std::to_string(kv_heads()) + ") must divide num_heads (" +
         std::to_string(num_heads) + ")");
  if (key_dim() < 1) fail("kdim must be >= 1, got " + std::to_string(key_dim()));
  if (value_dim() < 1) fail("vdim must be >= 1, got " + std::to_string(value_dim()));
  if (!(rope_base > 0) || !std::isfinite(rope_base))
    fail("rope_base must be a finite number > 0, got " + std::to_string(rope_base));
  if (rope) {
    const double share = rope_scaling.partial_rotary_factor;
    const auto rotary = static_cast<int64_t>(double(head_dim()) * share);
    if (rotary % 2 != 0)
      fail(share == 1 ? "rope needs an even head dim, got embed_dim / num_heads = " + std::to_string(head_dim())
                      : "rope needs an even rotary dim, got int(head_dim " + std::to_string(head_dim()) +
                            " * partial_rotary_factor " + std::to_string(share) + ") = " + std::to_string(rotary));
    int64_t sections = 0;
    for (int64_t s : rope_scaling.mrope_section) sections += s;
    if (!rope_scaling.mrope_section.empty() && sections != rotary / 2)
      fail("rope_scaling's mrope_section must add up to the rotary dim / 2 = " + std::to_string(rotary / 2) +
           ", got " + std::to_string(sections));
    try {
      rope_frequencies(rotary, rope_base, rope_scaling);  // every key checked now, not at the first forward
    } catch (const ValueError& e) {
      fail(e.what());
    }
  } else if (!(rope_scaling == RopeScaling{})) {
    fail("rope_scaling is given but rope is off: pass rope=true");
  }
  for (const auto& [on, name] : {std::pair{rope, "rope"}, {alibi, "alibi"}})
    if (on && extra_keys())
      fail(std::string(name) + " with add_bias_kv or add_zero_attn is not supported: the appended keys have no position");
  if (!(dropout >= 0 && dropout <= 1))
    fail("dropout must be in [0, 1], got " + std::to_string(dropout));
}

template <class T>
MultiHeadAttention<T>::MultiHeadAttention(const MultiHeadAttentionConfig& config, uint64_t seed)
    : config_(config), id_(new_layer_id()), params_(std::make_shared<Parameters>()) {
  config_.validate();
  Parameters& w = *params_;
  std::mt19937_64 rng(seed);
  const int64_t E = config_.embed_dim, kv = config_.kv_heads() * config_.head_dim();
  if (config_.packed()) {
    // one Xavier draw over the packed (3E, E) matrix, as PyTorch does
    Tensor<T> packed = xavier<T>(3 * E, E, rng);
    w.wq = Tensor<T>({E, E});
    w.wk = Tensor<T>({E, E});
    w.wv = Tensor<T>({E, E});
    std::copy(packed.data(), packed.data() + E * E, w.wq.data());
    std::copy(packed.data() + E * E, packed.data() + 2 * E * E, w.wk.data());
    std::copy(packed.data() + 2 * E * E, packed.data() + 3 * E * E, w.wv.data());
  } else {
    w.wq = xavier<T>(E, E, rng);
    w.wk = xavier<T>(kv, config_.key_dim(), rng);
    w.wv = xavier<T>(kv, config_.value_dim(), rng);
  }
  // out_proj: nn.Linear's default, kaiming_uniform(a=sqrt(5)) = uniform(±1/sqrt(fan_in))
  w.wo = uniform<T>({E, E}, 1.0 / std::sqrt(double(E)), rng);
  if (config_.bias) {
    w.bq = Tensor<T>({E});
    w.bk = Tensor<T>({kv});
    w.bv = Tensor<T>({kv});
    w.bo = Tensor<T>({E});
  }
  if (config_.add_bias_kv) {
    // xavier_normal_ on (1, 1, dkv), as PyTorch: fan_in = fan_out = dkv
    w.bias_k = normal<T>({1, 1, kv}, std::sqrt(1.0 / double(kv)), rng);
    w.bias_v = normal<T>({1, 1, kv}, std::sqrt(1.0 / double(kv)), rng);
  }
  if (config_.sinks) w.sinks = Tensor<T>({config_.num_heads});  // zeros
  if (config_.gate != Gate::None) {
    w.wg = uniform<T>({config_.gate_width(), E}, 1.0 / std::sqrt(double(E)), rng);
    if (config_.bias) w.bg = Tensor<T>({config_.gate_width()});
  }
}

template <class T>
MultiHeadAttention<T>::MultiHeadAttention(const MultiHeadAttention& other)
    : config_(other.config_), id_(new_layer_id()), params_(std::make_shared<Parameters>(*other.snapshot())) {}

template <class T>
MultiHeadAttention<T>::MultiHeadAttention(MultiHeadAttention&& other) noexcept
    : config_(other.config_), id_(new_layer_id()) {
  std::lock_guard lock(other.mutex_);
  params_ = std::move(other.params_);
}

template <class T>
MultiHeadAttention<T>& MultiHeadAttention<T>::operator=(const MultiHeadAttention& other) {
  if (this == &other) return *this;
  auto copy = std::make_shared<Parameters>(*other.snapshot());
  std::lock_guard lock(mutex_);
  config_ = other.config_;
  id_ = new_layer_id();
  params_ = std::move(copy);
  return *this;
}

template <class T>
MultiHeadAttention<T>& MultiHeadAttention<T>::operator=(MultiHeadAttention&& other) noexcept {
  if (this == &other) return *this;
  std::scoped_lock lock(mutex_, other.mutex_);
  config_ = other.config_;
  id_ = new_layer_id();
  params_ = std::move(other.params_);
  return *this;
}

template <class T>
std::shared_ptr<const typename MultiHeadAttention<T>::Parameters> MultiHeadAttention<T>::snapshot()
    const {
  std::lock_guard lock(mutex_);
  return params_;
}

template <class T>
std::vector<const Tensor<T>*> MultiHeadAttention<T>::Parameters::list(
    const MultiHeadAttentionConfig& c) const {
  std::vector<const Tensor<T>*> l{&wq, &wk, &wv, &wo};
  if (c.bias) l.insert(l.end(), {&bq, &bk, &bv, &bo});
  if (c.add_bias_kv) l.insert(l.end(), {&bias_k, &bias_v});
  if (c.sinks) l.push_back(&sinks);
  if (c.gate != Gate::None) l.push_back(&wg);
  if (c.gate != Gate::None && c.bias) l.push_back(&bg);
  return l;
}

template <class T>
std::vector<const Tensor<T>*> MultiHeadAttention<T>::parameters() const {
  std::lock_guard lock(mutex_);
  return params_->list(config_);
}

template <class T>
std::vector<Tensor<T>*> MultiHeadAttention<T>::parameters() {
  std::vector<Tensor<T>*> list;
  for (const Tensor<T>* p : std::as_const(*this).parameters()) list.push_back(const_cast<Tensor<T>*>(p));
  return list;
}

template class MultiHeadAttention<float>;
template class MultiHeadAttention<double>;

}  // namespace attn
