// The MultiHeadAttention layer's forward: the inputs checked and
// projected, rotated (RoPE), attended with its masks, ALiBi, sinks and
// cache (a streaming cache by its rule), then projected out; what the
// backward needs is kept in the Activations.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <tuple>
#include <utility>

#include "attn/attention.hpp"
#include "layer/mha_internal.hpp"
#include "layer/streaming_attention.hpp"

namespace attn {
using namespace detail::mha;
namespace {

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
  if (c.gate != Gate::None) a.gate = gate_values(a.q_in, w.wg, w.bg);
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
    if constexpr (ForwardTypes<T, KV>)  // (a float64 cache holds float64 only)
      AttentionPlan<T, KV>(qh, K, V, a.attention, a.masks()).run(ctx_heads(a.ctx, a), extras);
  };
  if (cache) {
    // The chunk's keys and values are read back from the cache, stored as
    // the past tokens are (quantized, for a compact cache).
    check_attention_options<T>(a.attention, H);  // nothing is appended for a call that fails
    const int64_t t0 = cache->seen();
    cache->append(kh, vh);
    const auto run = [&](auto K, auto V) {
      using KV = std::remove_const_t<std::remove_reference_t<decltype(*K.data())>>;
      if (!streaming) return attend(K, V);
      if constexpr (AttentionTypes<T, KV>)  // (an int4 cache does not stream)
        detail::streaming_attention<T, KV>(qh, K, V, a.attention, cache->streaming(), cache->positions(), t0,
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
  const bool gated = config_.gate != Gate::None;
  result.out = project(TensorView<const T>(gated ? apply_gate(a.ctx, a.gate, seq_first(a)).view() : a.ctx.view()),
                       w->wo, w->bo);  // ctx's layout
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

#define ATTN_MHA_FORWARD(T)                                                                                    \
  template typename MultiHeadAttention<T>::Activations MultiHeadAttention<T>::forward_activations(             \
      const Parameters&, TensorView<const T>, TensorView<const T>, TensorView<const T>,                         \
      const MhaForwardOptions<T>&) const;                                                                       \
  template bool MultiHeadAttention<T>::seq_first(const Activations&) const;                                     \
  template TensorView<T> MultiHeadAttention<T>::ctx_heads(Tensor<T>&, const Activations&) const;                \
  template TensorView<const T> MultiHeadAttention<T>::ctx_heads(const Tensor<T>&, const Activations&) const;    \
  template MhaOutput<T> MultiHeadAttention<T>::forward(TensorView<const T>, TensorView<const T>,                \
                                                       TensorView<const T>, const MhaForwardOptions<T>&) const;
ATTN_MHA_FORWARD(float)
ATTN_MHA_FORWARD(double)
#undef ATTN_MHA_FORWARD

}  // namespace attn
