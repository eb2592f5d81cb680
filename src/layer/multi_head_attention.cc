#include "attn/multi_head_attention.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cmath>
#include <optional>
#include <random>
#include <tuple>
#include <utility>

#include "attn/attention.hpp"
#include "attn/io.hpp"
#include "attention_problem.hpp"
#include "attn/positional.hpp"
#include "attn/rope_scaling.hpp"
#include "kernels/linear.hpp"
#include "layer/random.hpp"

namespace attn {
namespace {

[[noreturn]] void fail(const std::string& msg) {
  throw ValueError("MultiHeadAttention: " + msg);
}

// The backward computes in float32 (attention_backward): a forward meant
// for it must too.
template <class T>
void check_backward_precision(const MhaForwardOptions<T>& opt) {
  if (opt.attention.precision != Precision::Float32)
    fail("the backward computes in float32: attention.precision must be f32 for backward and "
         "save_for_backward, got " + precision_name(opt.attention.precision));
}

// Keys [begin, end) of a (batch, heads, n, row) view (axis 2).
template <class KV>
TensorView<const KV> key_slots(TensorView<const KV> x, int64_t begin, int64_t end) {
  return TensorView<const KV>(x.data() + begin * x.stride(2), {x.dim(0), x.dim(1), end - begin, x.dim(3)},
                              x.strides());
}
template <class T>
TensorView<T> query_rows(TensorView<T> x, int64_t begin, int64_t end) {
  return TensorView<T>(x.data() + begin * x.stride(2), {x.dim(0), x.dim(1), end - begin, x.dim(3)}, x.strides());
}

// Query rows handled together by the sink keys' part of streaming_attention:
// its output (and log-sum-exp) for this many rows at a time, not the
// chunk's, is what it holds beside the window's.
constexpr int64_t kSinkRows = 1024;

// A streaming cache's rule (StreamingLLM; StreamingCache) for the chunk's
// queries q (batch, heads, n_q, head_dim) against the keys and values the
// cache holds, in slots 0 .. n_k - 1: token t attends the key at stream
// position j iff j <= t and (j < sink_tokens or j > t - window). The sink
// keys are the first `sinks` slots (position = slot); the others hold
// consecutive positions from `first_window_position`. The rule is two
// attention calls, each a causal offset (and a window) the kernels skip
// tiles by: the window's keys, and the sink keys; their results are merged
// by their log-sum-exps (FlashInfer's merge_state). No mask of n_q × n_k is
// built: at 30k tokens one took 918 MiB, and 200k did not fit. The sink
// logits of gpt-oss (options.sinks) join the window's part.
template <class T, class KV>
void streaming_attention(TensorView<const T> q, TensorView<const KV> k, TensorView<const KV> v,
                         AttentionOptions options, int64_t sinks, int64_t t0, int64_t first_window_position,
                         int64_t window, TensorView<T> out, TensorView<T> weights) {
  const int64_t B = q.dim(0), H = q.dim(1), n_q = q.dim(2), n_k = k.dim(2), dv = out.dim(3);
  const auto weight_cols = [&](TensorView<T> w, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    return weights.empty_view() ? TensorView<T>()
                                : TensorView<T>(w.data() + i0 * w.stride(2) + j0 * w.stride(3),
                                                {B, H, i1 - i0, j1 - j0}, w.strides());
  };
  // The window's keys: slot s holds position first_window_position + (s - sinks).
  Tensor<T> window_lse({B, H, n_q});
  AttentionOptions in_window = options;
  in_window.causal = Causal::offset(t0 - first_window_position);
  in_window.window = {window - 1, -1};
  AttentionExtras<T> extras;
  extras.lse = window_lse.view();
  extras.weights = weight_cols(weights, 0, n_q, sinks, n_k);
  detail::PreparedAttention<T, KV>(q, key_slots(k, sinks, n_k), key_slots(v, sinks, n_k), in_window, {})
      .run(out, extras);
  if (sinks == 0) return;
  AttentionOptions sink_keys = options;
  sink_keys.sinks.clear();
  sink_keys.window = {};
  const auto ks = key_slots(k, 0, sinks), vs = key_slots(v, 0, sinks);
  for (int64_t i0 = 0; i0 < n_q; i0 += kSinkRows) {
    const int64_t i1 = std::min(n_q, i0 + kSinkRows);
    sink_keys.causal = Causal::offset(t0 + i0);
    Tensor<T> sink_out({B, H, i1 - i0, dv}), sink_lse({B, H, i1 - i0});
    AttentionExtras<T> sink_extras;
    sink_extras.lse = sink_lse.view();
    sink_extras.weights = weight_cols(weights, i0, i1, 0, sinks);
    detail::PreparedAttention<T, KV>(query_rows(q, i0, i1), ks, vs, sink_keys, {}).run(sink_out.view(), sink_extras);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = i0; i < i1; ++i) {
          const double la = window_lse.at({b, h, i}), lb = sink_lse.at({b, h, i - i0});
          const double top = std::max(la, lb);
          if (top == -std::numeric_limits<double>::infinity()) continue;  // no key: zeros
          // (A NaN in either carries: the row is NaN.)
          const double fa = la == top ? 1.0 : std::exp(la - top), fb = lb == top ? 1.0 : std::exp(lb - top);
          const double sum = fa + fb;
          T* o = &out.at({b, h, i, 0});
          const T* ob = &sink_out.at({b, h, i - i0, 0});
          for (int64_t c = 0; c < dv; ++c)
            o[c * out.stride(3)] = static_cast<T>((fa * o[c * out.stride(3)] + fb * ob[c]) / sum);
          if (weights.empty_view()) continue;
          T* w = &weights.at({b, h, i, 0});
          for (int64_t j = 0; j < n_k; ++j) w[j * weights.stride(3)] *= static_cast<T>((j < sinks ? fb : fa) / sum);
        }
  }
}

// The machine's memory in bytes (0 if unknown).
int64_t physical_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? int64_t{pages} * page : 0;
}

std::string gib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", bytes / double(int64_t{1} << 30));
  return text;
}

uint64_t new_layer_id() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

using detail::uniform;

// Xavier-uniform, as torch.nn.init.xavier_uniform_: bound sqrt(6 / (fan_in + fan_out)).
template <class T>
Tensor<T> xavier(int64_t rows, int64_t cols, std::mt19937_64& rng) {
  return uniform<T>({rows, cols}, std::sqrt(6.0 / double(rows + cols)), rng);
}

// y (B, n, out) = x (B, n, in) Wᵀ + b. x is read in place when its rows are
// evenly strided with unit column stride, else through a contiguous copy.
template <class T>
Tensor<T> project(TensorView<const T> x, const Tensor<T>& w, const Tensor<T>& b) {
  const int64_t B = x.dim(0), n = x.dim(1), in = x.dim(2), out = w.dim(0);
  Tensor<T> y({B, n, out});
  Tensor<T> xc;
  const int64_t row_stride = n == 1 ? x.stride(0) : x.stride(1);
  const bool even = (x.stride(2) == 1 || in <= 1) &&
                    (B == 1 || n == 1 || x.stride(0) == n * x.stride(1));
  const TensorView<const T> rows =
      even ? TensorView<const T>(x.data(), {B * n, in}, {row_stride, 1})
           : TensorView<const T>((xc = contiguous(x)).data(), {B * n, in});
  detail::linear(rows, w.data(), b.rank() ? b.data() : nullptr,
                 TensorView<T>(y.data(), {B * n, out}));
  return y;
}

// (B, n, H*dh) seen as (B, H, n, dh) without copying.
template <class T>
TensorView<T> heads_view(Tensor<T>& t, int64_t heads) {
  const int64_t B = t.dim(0), n = t.dim(1), width = t.dim(2), dh = heads ? width / heads : 0;
  return TensorView<T>(t.data(), {B, heads, n, dh}, {n * width, dh, width, 1});
}
template <class T>
TensorView<const T> heads_view(const Tensor<T>& t, int64_t heads) {
  return heads_view(const_cast<Tensor<T>&>(t), heads);  // (a view that only reads)
}

// A (batch, n, width) view of an input: unbatched (n, width) gets batch 1.
template <class T>
TensorView<const T> batched(const TensorView<const T>& x) {
  if (x.rank() == 3) return x;
  Shape s{1, x.dim(0), x.dim(1)};
  Strides st{0, x.stride(0), x.stride(1)};
  return TensorView<const T>(x.data(), s, st);
}

// A mask as a view of other shape and strides over the same elements.
Mask restrided(const Mask& mask, const Shape& shape, const Strides& strides) {
  return std::visit([&](const auto& m) -> Mask {
    if constexpr (std::is_same_v<std::decay_t<decltype(m)>, std::monostate>) return m;
    else return std::decay_t<decltype(m)>(m.data(), shape, strides);
  }, mask);
}

Shape shape_of(const Mask& mask) {
  return std::visit([](const auto& m) -> Shape {
    if constexpr (std::is_same_v<std::decay_t<decltype(m)>, std::monostate>) return {};
    else return m.shape();
  }, mask);
}

Strides strides_of(const Mask& mask) {
  return std::visit([](const auto& m) -> Strides {
    if constexpr (std::is_same_v<std::decay_t<decltype(m)>, std::monostate>) return {};
    else return m.strides();
  }, mask);
}

// The layer's attn_mask and key_padding_mask as views that broadcast to the
// logits (B, H, n_q, n_k), read in place; ValueError for any other shape.
std::pair<Mask, Mask> mask_views(const Mask& attn_mask, const Mask& key_padding_mask,
                                 bool is_batched, int64_t B, int64_t H, int64_t n_q, int64_t n_k) {
  std::pair<Mask, Mask> views;
  if (has_mask(attn_mask)) {
    const Shape s = shape_of(attn_mask);
    const Strides st = strides_of(attn_mask);
    if (s.size() == 3 && s[0] == B * H && s[1] == n_q && s[2] == n_k)
      views.first = restrided(attn_mask, {B, H, n_q, n_k}, {H * st[0], st[0], st[1], st[2]});
    else if (s.size() == 2 && s[0] == n_q && s[1] == n_k)
      views.first = attn_mask;
    else
      fail("attn_mask must be (n_q, n_k) = (" + std::to_string(n_q) + ", " +
           std::to_string(n_k) + ") or (batch * num_heads, n_q, n_k) = (" +
           std::to_string(B * H) + ", " + std::to_string(n_q) + ", " + std::to_string(n_k) +
           "), got " + shape_str(s));
  }
  if (has_mask(key_padding_mask)) {
    const Shape s = shape_of(key_padding_mask);
    const Strides st = strides_of(key_padding_mask);
    if (is_batched && s.size() == 2 && s[0] == B && s[1] == n_k)
      views.second = restrided(key_padding_mask, {B, 1, 1, n_k}, {st[0], 0, 0, st[1]});
    else if (!is_batched && s.size() == 1 && s[0] == n_k)
      views.second = key_padding_mask;
    else
      fail("key_padding_mask must be " +
           (is_batched ? "(batch, n_k) = (" + std::to_string(B) + ", " : std::string("(")) +
           std::to_string(n_k) + (is_batched ? ")" : ",)") + ", got " + shape_str(s));
  }
  return views;
}

// A (batch, n, width) input given as (n, batch, width) seen batch first,
// without copying.
template <class T>
TensorView<const T> batch_major(const TensorView<const T>& x) {
  return TensorView<const T>(x.data(), {x.dim(1), x.dim(0), x.dim(2)},
                             {x.stride(1), x.stride(0), x.stride(2)});
}

// A (batch, n, width) tensor as (n, batch, width), copied.
template <class T>
Tensor<T> seq_major(const Tensor<T>& x) {
  const int64_t B = x.dim(0), n = x.dim(1), w = x.dim(2);
  Tensor<T> y({n, B, w});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(x.data() + (b * n + i) * w, w, y.data() + (i * B + b) * w);
  return y;
}

// A mask extended by `extra` allowed keys at the end of its last axis (false
// for a boolean mask in PyTorch's convention, 0 for an additive one), as
// nn.MultiheadAttention pads its masks for add_bias_kv and add_zero_attn.
// The copy has the mask's own shape (its broadcast axes stay size 1).
struct PaddedMask {
  Tensor<bool> b;
  Tensor<float> f;
  Tensor<double> d;
  Mask mask;

  PaddedMask(const Mask& m, int64_t extra) {
    std::visit([&](const auto& v) {
      using V = std::decay_t<decltype(v)>;
      if constexpr (!std::is_same_v<V, std::monostate>) {
        using E = std::remove_const_t<std::remove_pointer_t<decltype(v.data())>>;
        const Tensor<E> src = contiguous(v);
        Shape shape = src.shape();
        const int64_t n_k = shape.back(), rows = n_k ? src.numel() / n_k : 0;
        shape.back() += extra;
        Tensor<E> t(shape);  // zero-filled: false / 0, allowed
        for (int64_t r = 0; r < rows; ++r)
          std::copy_n(src.data() + r * n_k, n_k, t.data() + r * (n_k + extra));
        auto& keep = storage<E>();
        keep = std::move(t);
        mask = TensorView<const E>(keep.view());
      }
    }, m);
  }

 private:
  template <class E>
  Tensor<E>& storage() {
    if constexpr (std::is_same_v<E, bool>) return b;
    else if constexpr (std::is_same_v<E, float>) return f;
    else return d;
  }
};

// Keys or values (batch, n, width) followed by the rows add_bias_kv and
// add_zero_attn append: `bias` (1, 1, width) when given, then zeros.
template <class T>
Tensor<T> with_extra_keys(const Tensor<T>& x, const Tensor<T>& bias, bool zero) {
  const int64_t B = x.dim(0), n = x.dim(1), w = x.dim(2);
  const int64_t m = n + (bias.rank() ? 1 : 0) + (zero ? 1 : 0);
  Tensor<T> y({B, m, w});
  for (int64_t b = 0; b < B; ++b) {
    T* row = std::copy_n(x.data() + b * n * w, n * w, y.data() + b * m * w);
    if (bias.rank()) std::copy_n(bias.data(), w, row);
  }
  return y;
}

}  // namespace

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
    w.bias_k = detail::normal<T>({1, 1, kv}, std::sqrt(1.0 / double(kv)), rng);
    w.bias_v = detail::normal<T>({1, 1, kv}, std::sqrt(1.0 / double(kv)), rng);
  }
  if (config_.sinks) w.sinks = Tensor<T>({config_.num_heads});  // zeros
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
struct MultiHeadAttention<T>::Activations {
  TensorView<const T> q_in, k_in, v_in;  // the inputs as (batch, n, width)
  bool key_is_query, value_is_key;       // key (value) was not given: it defaulted
  bool is_batched;
  Tensor<T> q, k, v;                     // projections (batch, n, heads * head_dim); q, k rotated
  TensorView<const T> K, V;              // this call's keys and values (heads, rotated)
  int64_t n_k;                           // keys attended: with a cache, all it holds
  Mask attn_mask, key_padding_mask;      // views that broadcast to (batch, heads, n_q, n_k)
  std::optional<PaddedMask> padded_attn_mask, padded_key_padding_mask;  // with extra keys
  AttentionOptions attention;
  RopeOptions rope;
  Tensor<T> ctx;                         // the heads' outputs concatenated, in query's layout
  Tensor<T> weights;                     // (batch, heads, n_q, n_k) when need_weights
  Tensor<T> lse;                         // (batch, heads, n_q) without a cache: the backward's

  // In PyTorch's convention: a boolean true blocks.
  detail::MaskInput mask() const { return {attn_mask, true}; }
  detail::MaskInput padding() const { return {key_padding_mask, true}; }
};

template <class T>
typename MultiHeadAttention<T>::Activations MultiHeadAttention<T>::forward_activations(
    const Parameters& w, TensorView<const T> query, TensorView<const T> key, TensorView<const T> value,
    const MhaForwardOptions<T>& opt) const {
  const auto& c = config_;
  Activations a;
  a.key_is_query = key.empty_view(), a.value_is_key = value.empty_view();
  if (key.empty_view()) key = query;
  if (value.empty_view()) value = key;
  const auto shapes = "query " + shape_str(query.shape()) + ", key " + shape_str(key.shape()) +
                      ", value " + shape_str(value.shape());
  if (query.rank() != 2 && query.rank() != 3)
    fail(std::string("query must be ") +
         (c.batch_first ? "(batch, n, embed_dim)" : "(n, batch, embed_dim) (batch_first=false)") +
         " or unbatched (n, embed_dim), got " + shape_str(query.shape()));
  if (key.rank() != query.rank() || value.rank() != query.rank())
    fail("query, key and value must all be batched or all unbatched, got " + shapes);
  if (query.rank() == 3 && !c.batch_first)
    query = batch_major(query), key = batch_major(key), value = batch_major(value);
  if (query.dim(-1) != c.embed_dim)
    fail("query's last axis must be embed_dim=" + std::to_string(c.embed_dim) + ", got " + shapes);
  if (key.dim(-1) != c.key_dim())
    fail("key's last axis must be kdim=" + std::to_string(c.key_dim()) + ", got " + shapes);
  if (value.dim(-1) != c.value_dim())
    fail("value's last axis must be vdim=" + std::to_string(c.value_dim()) + ", got " + shapes);
  if (key.dim(-2) != value.dim(-2))
    fail("key and value must have the same length (axis -2), got " + shapes);
  const bool is_batched = query.rank() == 3;
  if (is_batched && (key.dim(0) != query.dim(0) || value.dim(0) != query.dim(0)))
    fail("query, key and value must have the same batch size, got " + shapes);

  a.is_batched = is_batched;
  a.q_in = batched(query), a.k_in = batched(key), a.v_in = batched(value);
  const int64_t B = a.q_in.dim(0), n_q = a.q_in.dim(1), H = c.num_heads, Hkv = c.kv_heads();
  KVCache<T>* cache = opt.cache;
  std::optional<detail::CacheUser::Hold> held;  // until the chunk is appended and attended
  if (cache) held.emplace(cache->use("forward"));
  const int64_t extra = c.extra_keys();
  if (extra && cache) fail("a KV cache with add_bias_kv or add_zero_attn is not supported");
  if (extra && (opt.attention.causal != Causal::None || opt.attention.window.left >= 0 ||
                opt.attention.window.right >= 0))
    fail("causal and window with add_bias_kv or add_zero_attn: give the pattern as attn_mask, "
         "as nn.MultiheadAttention does (the appended keys take part in every row)");
  const bool streaming = cache && cache->is_streaming();
  // Keys at their cache slots (StreamingCache positions Cache), rotated each call.
  const bool by_slot = c.rope && cache && cache->streaming().positions == CachePositions::Cache;
  if (streaming) {
    if (opt.attention.causal != Causal::BottomRight)
      fail("a streaming cache (sink_tokens, window) attends causally: pass causal=True");
    if (opt.attention.window.left >= 0 || opt.attention.window.right >= 0)
      fail("a streaming cache sets the window itself: pass no window");
    if (has_mask(opt.attn_mask) || has_mask(opt.key_padding_mask))
      fail("a streaming cache takes no attn_mask or key_padding_mask (they would cover evicted tokens)");
    if (c.alibi || !opt.attention.alibi_slopes.empty())
      fail("ALiBi with a streaming cache is not supported: its distances would count cache slots");
  }
  // Checked before anything is computed or appended to the cache.
  const int64_t n_k = (cache ? cache->length() : 0) + a.k_in.dim(1);
  std::tie(a.attn_mask, a.key_padding_mask) =
      mask_views(opt.attn_mask, opt.key_padding_mask, is_batched, B, H, n_q, n_k);
  if (extra) {
    a.attn_mask = a.padded_attn_mask.emplace(a.attn_mask, extra).mask;
    a.key_padding_mask = a.padded_key_padding_mask.emplace(a.key_padding_mask, extra).mask;
  }

  a.q = project(a.q_in, w.wq, w.bq), a.k = project(a.k_in, w.wk, w.bk), a.v = project(a.v_in, w.wv, w.bv);
  if (extra) {
    a.k = with_extra_keys(a.k, w.bias_k, c.add_zero_attn);
    a.v = with_extra_keys(a.v, w.bias_v, c.add_zero_attn);
  }
  auto qh = heads_view(a.q, H), kh = heads_view(a.k, Hkv), vh = heads_view(a.v, Hkv);

  if (c.rope) {
    a.rope.base = c.rope_base;
    a.rope.interleaved = c.rope_interleaved;
    a.rope.scaling = c.rope_scaling;
    // Stream positions: the tokens seen so far, or with positions "cache"
    // the slots the chunk takes (its keys are rotated by slot at each call).
    a.rope.offset = !cache ? 0 : by_slot ? cache->length() : cache->seen();
    apply_rope(TensorView<const T>(qh), qh, a.rope);
    if (!by_slot) apply_rope(TensorView<const T>(kh), kh, a.rope);
  }
  a.K = kh, a.V = vh;
  a.n_k = n_k + extra;
  a.ctx = seq_first(a) ? Tensor<T>({n_q, B, c.embed_dim}) : Tensor<T>({B, n_q, c.embed_dim});
  if (opt.need_weights) {
    // Checked before the allocation: at n = 65536 the weights take 64 GiB,
    // and the failure said nothing of need_weights.
    const Shape shape{B, H, n_q, a.n_k};
    const int64_t bytes = checked_numel(shape, sizeof(T), "MultiHeadAttention: the attention weights") *
                          static_cast<int64_t>(sizeof(T));
    if (const int64_t memory = physical_memory(); memory > 0 && bytes > memory)
      throw MemoryError("MultiHeadAttention: the attention weights " + shape_str(shape) + " would take " +
                        gib(double(bytes)) + ", more than this machine's " + gib(double(memory)) +
                        " of memory: pass need_weights=False (the output does not need them)");
    a.weights = Tensor<T>(shape);
  }
  a.attention = opt.attention;
  if (c.alibi) {
    if (!a.attention.alibi_slopes.empty())
      fail("this layer has alibi on, which sets the slopes: pass no alibi_slopes of your own");
    a.attention.alibi_slopes = alibi_slopes(H);
  }
  if (c.sinks) {
    if (!a.attention.sinks.empty())
      fail("this layer has sinks on, which are its parameter: pass no sinks of your own");
    a.attention.sinks.assign(w.sinks.data(), w.sinks.data() + H);
  }
  AttentionExtras<T> extras;
  if (opt.need_weights) extras.weights = a.weights.view();
  if (!cache) extras.lse = (a.lse = Tensor<T>({B, H, n_q})).view();  // (free: the kernels keep it anyway)
  const auto attend = [&](auto K, auto V) {
    using KV = std::remove_const_t<std::remove_reference_t<decltype(*K.data())>>;
    if constexpr (AttentionTypes<T, KV>)  // (a float64 cache holds float64 only)
      detail::PreparedAttention<T, KV>(qh, K, V, a.attention, a.mask(), a.padding())
          .run(ctx_heads(a.ctx, a), extras);
  };
  if (cache) {
    // The chunk's keys and values are read back from the cache, stored as
    // the past tokens are (quantized, for a compact cache).
    detail::check_options<T>(a.attention, H);  // nothing is appended for a call that fails
    const int64_t t0 = cache->seen();
    cache->append(kh, vh);
    const auto run = [&](auto K, auto V) {
      using KV = std::remove_const_t<std::remove_reference_t<decltype(*K.data())>>;
      if (!streaming) return attend(K, V);
      const std::vector<int64_t>& positions = cache->positions();
      const StreamingCache& s = cache->streaming();
      int64_t sinks = 0;
      while (sinks < n_k && positions[sinks] < s.sink_tokens) ++sinks;
      if constexpr (AttentionTypes<T, KV>)
        streaming_attention<T, KV>(qh, K, V, a.attention, sinks, t0, sinks < n_k ? positions[sinks] : t0, s.window,
                                   ctx_heads(a.ctx, a), extras.weights);
    };
    if (by_slot) {
      RopeOptions slots = a.rope;  // every cached key at its slot
      slots.offset = 0;
      const Tensor<T> keys = apply_rope(cache->keys(), slots);
      run(keys.view(), cache->values());
    } else {
      cache->visit(run);
    }
    cache->evict();
  } else {
    attend(a.K, a.V);
  }
  return a;
}

template <class T>
bool MultiHeadAttention<T>::seq_first(const Activations& a) const {
  return a.is_batched && !config_.batch_first;
}

// The heads' outputs (batch, heads, n_q, head_dim) as a view of t, which has
// ctx's layout: (batch, n_q, E), or (n_q, batch, E) with batch_first=false.
template <class T>
TensorView<T> MultiHeadAttention<T>::ctx_heads(Tensor<T>& t, const Activations& a) const {
  if (!seq_first(a)) return heads_view(t, config_.num_heads);
  const int64_t n = t.dim(0), B = t.dim(1), E = t.dim(2), dh = config_.head_dim();
  return TensorView<T>(t.data(), {B, config_.num_heads, n, dh}, {E, dh, B * E, 1});
}
template <class T>
TensorView<const T> MultiHeadAttention<T>::ctx_heads(const Tensor<T>& t, const Activations& a) const {
  return ctx_heads(const_cast<Tensor<T>&>(t), a);  // (a view that only reads)
}

// A forward's state for its backward (multi_head_attention.hpp).
template <class T>
struct MhaSaved {
  uint64_t layer_id;  // the layer whose forward this is (MultiHeadAttention::id_)
  std::shared_ptr<const typename MultiHeadAttention<T>::Parameters> params;
  typename MultiHeadAttention<T>::Activations activations;
};

template <class T>
MhaOutput<T> MultiHeadAttention<T>::forward(TensorView<const T> query, TensorView<const T> key,
                                            TensorView<const T> value,
                                            const MhaForwardOptions<T>& opt) const {
  if (opt.save_for_backward && opt.cache)
    fail("save_for_backward with a KV cache is not supported (train on whole sequences)");
  if (opt.save_for_backward) check_backward_precision(opt);
  const auto w = snapshot();
  Activations a = forward_activations(*w, query, key, value, opt);
  const int64_t B = a.q_in.dim(0), n_q = a.q_in.dim(1), n_k = a.n_k, H = config_.num_heads;
  Tensor<T>& weights = a.weights;
  MhaOutput<T> result;
  result.out = project(TensorView<const T>(a.ctx.view()), w->wo, w->bo);  // ctx's layout
  if (!a.is_batched) result.out = std::move(result.out).reshape({n_q, config_.embed_dim});
  if (opt.need_weights) {
    if (opt.average_attn_weights) {
      Tensor<T> avg({B, n_q, n_k});
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < n_q * n_k; ++i)
            avg[b * n_q * n_k + i] += weights[(b * H + h) * n_q * n_k + i] / static_cast<T>(H);
      weights = std::move(avg);
    }
    if (!a.is_batched) {
      Shape s(weights.shape().begin() + 1, weights.shape().end());
      weights = std::move(weights).reshape(s);
    }
    result.weights = std::move(weights);
  }
  if (opt.save_for_backward) result.saved = std::make_shared<const MhaSaved<T>>(MhaSaved<T>{id_, w, std::move(a)});
  return result;
}

template <class T>
std::vector<const Tensor<T>*> MultiHeadAttention<T>::Parameters::list(
    const MultiHeadAttentionConfig& c) const {
  std::vector<const Tensor<T>*> l{&wq, &wk, &wv, &wo};
  if (c.bias) l.insert(l.end(), {&bq, &bk, &bv, &bo});
  if (c.add_bias_kv) l.insert(l.end(), {&bias_k, &bias_v});
  if (c.sinks) l.push_back(&sinks);
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

template <class T>
MhaGradients<T> MultiHeadAttention<T>::backward(TensorView<const T> dout,
                                                TensorView<const T> query,
                                                TensorView<const T> key,
                                                TensorView<const T> value,
                                                const MhaForwardOptions<T>& opt) const {
  if (opt.cache) fail("backward: a KV cache is not supported (train on whole sequences)");
  check_backward_precision(opt);
  MhaForwardOptions<T> fwd = opt;
  fwd.need_weights = false;
  const auto w = snapshot();
  return gradients(*w, forward_activations(*w, query, key, value, fwd), dout);
}

template <class T>
MhaGradients<T> MultiHeadAttention<T>::backward(TensorView<const T> dout, const MhaSaved<T>& saved) const {
  if (saved.layer_id != id_)
    fail("backward: `saved` comes from another layer's forward (or from before this layer was assigned to)");
  return gradients(*saved.params, saved.activations, dout);
}

// The backward's steps, each undoing a line of the forward, last first.
template <class T>
MhaGradients<T> MultiHeadAttention<T>::gradients(const Parameters& params, const Activations& a,
                                                 TensorView<const T> dout) const {
  const Parameters* w = &params;
  const auto& c = config_;
  const int64_t B = a.q_in.dim(0), n_q = a.q_in.dim(1), n_k = a.K.dim(2);
  const int64_t H = c.num_heads, Hkv = c.kv_heads(), E = c.embed_dim, kv = Hkv * c.head_dim();
  const Shape out_shape = a.ctx.shape();
  if (dout.shape() != (a.is_batched ? out_shape : Shape{n_q, E}))
    fail("backward: dout has shape " + shape_str(dout.shape()) + ", expected the output's shape " +
         shape_str(a.is_batched ? out_shape : Shape{n_q, E}));
  const Tensor<T> dy = contiguous(dout);

  MhaGradients<T> g;
  for (const Tensor<T>* p : w->list(c)) g.parameters.emplace_back(p->shape());
  Tensor<T>&dwq = g.parameters[0], &dwk = g.parameters[1], &dwv = g.parameters[2],
  &dwo = g.parameters[3];
  const auto bias_grad = [&](int i) { return c.bias ? g.parameters[4 + i].data() : nullptr; };

  // forward: out = ctx Woᵀ + bo (rows in ctx's layout)
  Tensor<T> dctx(out_shape);
  detail::linear_backward(a.ctx.data(), w->wo.data(), dy.data(), B * n_q, E, E, dctx.data(),
                          dwo.data(), bias_grad(3));
  // forward: ctx = attention(q, k, v) per head
  Tensor<T> dq({B, n_q, E}), dk({B, n_k, kv}), dv({B, n_k, kv});
  auto dqh = heads_view(dq, H), dkh = heads_view(dk, Hkv);
  detail::masked_attention_backward(TensorView<const T>(heads_view(a.q, H)), a.K, a.V,
                                    TensorView<const T>(ctx_heads(dctx, a)), dqh, dkh,
                                    heads_view(dv, Hkv), a.attention, a.mask(), a.padding(),
                                    c.sinks ? g.parameters.back().view() : TensorView<T>(),
                                    SavedForward<T>{TensorView<const T>(ctx_heads(a.ctx, a)), a.lse.view()});
  // forward: bias_k, bias_v (add_bias_kv) and zeros (add_zero_attn) appended
  // after the n_in keys the inputs gave
  if (const int64_t n_in = a.k_in.dim(1); n_in != n_k) {
    if (c.add_bias_kv) {
      T* dbk = g.parameters[c.bias ? 8 : 4].data();
      T* dbv = g.parameters[c.bias ? 9 : 5].data();
      for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < kv; ++j) {
          dbk[j] += dk[(b * n_k + n_in) * kv + j];
          dbv[j] += dv[(b * n_k + n_in) * kv + j];
        }
    }
    const auto first_rows = [&](const Tensor<T>& t) {
      Tensor<T> r({B, n_in, kv});
      for (int64_t b = 0; b < B; ++b) std::copy_n(t.data() + b * n_k * kv, n_in * kv, r.data() + b * n_in * kv);
      return r;
    };
    dk = first_rows(dk), dv = first_rows(dv);
    dkh = heads_view(dk, Hkv);
  }
  // forward: q, k rotated by RoPE
  if (c.rope) {
    rope_backward(TensorView<const T>(dqh), dqh, a.rope);
    rope_backward(TensorView<const T>(dkh), dkh, a.rope);
  }
  // forward: q = q_in Wqᵀ + bq;  k = k_in Wkᵀ + bk;  v = v_in Wvᵀ + bv
  const auto input_grad = [&](TensorView<const T> x, const Tensor<T>& w, const Tensor<T>& dproj,
                              Tensor<T>& dw, T* db) {
    const Tensor<T> xc = contiguous(x);
    Tensor<T> dx(xc.shape());
    detail::linear_backward(xc.data(), w.data(), dproj.data(), x.dim(0) * x.dim(1), x.dim(2),
                            w.dim(0), dx.data(), dw.data(), db);
    return dx;
  };
  Tensor<T> dq_in = input_grad(a.q_in, w->wq, dq, dwq, bias_grad(0));
  Tensor<T> dk_in = input_grad(a.k_in, w->wk, dk, dwk, bias_grad(1));
  Tensor<T> dv_in = input_grad(a.v_in, w->wv, dv, dwv, bias_grad(2));
  // forward: value defaults to key and key to query, so their gradients add up there
  const auto add = [](Tensor<T>& to, const Tensor<T>& from) {
    for (int64_t i = 0; i < to.numel(); ++i) to[i] += from[i];
  };
  if (a.value_is_key) add(dk_in, dv_in), dv_in = Tensor<T>();
  if (a.key_is_query) add(dq_in, dk_in), dk_in = Tensor<T>();
  // back to the inputs' layout
  const auto unbatch = [&](Tensor<T>&& t) {
    if (t.rank() == 0) return std::move(t);
    if (seq_first(a)) return seq_major(t);
    if (a.is_batched) return std::move(t);
    return std::move(t).reshape({t.dim(1), t.dim(2)});
  };
  g.query = unbatch(std::move(dq_in));
  g.key = unbatch(std::move(dk_in));
  g.value = unbatch(std::move(dv_in));
  return g;
}

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
                    : name == "sinks" ? "; build the layer with sinks=True" : ""));
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

template class MultiHeadAttention<float>;
template class MultiHeadAttention<double>;

}  // namespace attn
