// ONNX Attention and RotaryEmbedding over attn::attention and apply_rope:
// reshape 3-D inputs to heads (views, no copies), concatenate the cache, pad
// the mask, turn ONNX's causal rule and nonpad_kv_seqlen into a causal
// offset and a key mask per batch entry, and widen 16-bit inputs to float32.
// All the computing is the core's.
#include "attn/onnx.hpp"

#include <array>
#include <limits>
#include <string>
#include <type_traits>

#include "attn/attention.hpp"
#include "attn/positional.hpp"

namespace attn::onnx {
namespace {

[[noreturn]] void fail(const char* op, const std::string& msg) {
  throw ValueError(std::string(op) + ": " + msg);
}

// An element of T as the compute type C, and back (16-bit: round to nearest even).
template <class C, class T>
C widen(const T& x) {
  if constexpr (std::is_same_v<T, float16>) return C(fp16_to_float(x.bits));
  else if constexpr (std::is_same_v<T, bfloat16>) return C(bf16_to_float(x.bits));
  else return C(x);
}
template <class T, class C>
T narrow(C x) {
  if constexpr (std::is_same_v<T, float16>) return T{float_to_fp16(static_cast<float>(x))};
  else if constexpr (std::is_same_v<T, bfloat16>) return T{float_to_bf16(static_cast<float>(x))};
  else return static_cast<T>(x);
}

// A view as the compute type C: itself when it already is C, else a copy.
template <class C>
struct Computed {
  Tensor<C> storage;
  TensorView<const C> view;
};
template <class C, class T>
Computed<C> as_compute(TensorView<const T> t) {
  if constexpr (std::is_same_v<C, T>) {
    return {{}, t};
  } else {
    Computed<C> c{Tensor<C>(t.shape()), {}};
    transform(t, c.storage.view(), widen<C, T>);
    c.view = c.storage.view();
    return c;
  }
}

// A (B, S, H·D) view as (B, H, S, D), without copying.
template <class T>
TensorView<T> heads_first(TensorView<T> x, int64_t heads, const char* op, const char* name,
                          const char* attribute) {
  if (heads <= 0 || x.dim(2) % heads != 0)
    fail(op, std::string(name) + " is 3-D " + shape_str(x.shape()) + ": " + attribute +
                 " must be a divisor > 0 of its last axis, got " + std::to_string(heads));
  const int64_t d = x.dim(2) / heads;
  return TensorView<T>(x.data(), {x.dim(0), heads, x.dim(1), d},
                       {x.stride(0), d * x.stride(2), x.stride(1), x.stride(2)});
}

// Batch entry b of a view, as a view of the remaining axes.
template <class T>
TensorView<T> at_batch(TensorView<T> x, int64_t b) {
  return TensorView<T>(x.data() + b * x.stride(0), Shape(x.shape().begin() + 1, x.shape().end()),
                       Strides(x.strides().begin() + 1, x.strides().end()));
}

// Axis 2 of a (B, H, n, c) tensor from `begin`, `count` long.
template <class T>
TensorView<T> rows(Tensor<T>& t, int64_t begin, int64_t count) {
  const Strides s = contiguous_strides(t.shape());
  return TensorView<T>(t.data() + begin * s[2], {t.dim(0), t.dim(1), count, t.dim(3)}, s);
}

// The mask as attention() takes it (C for an additive one), its last axis
// padded to `keys` with false / −∞.
template <class C>
struct PaddedMask {
  Tensor<bool> boolean;
  Tensor<C> additive;
  bool present = false, is_boolean = false;
  Shape shape;
};
template <class C, class M>
PaddedMask<C> padded(TensorView<const M> m, int64_t keys, const char* op) {
  if (m.rank() < 1 || m.rank() > 4)
    fail(op, "attn_mask must have rank 1 to 4, got shape " + shape_str(m.shape()));
  if (m.dim(-1) > keys)
    fail(op, "attn_mask " + shape_str(m.shape()) + " has more keys (last axis) than the " +
                 std::to_string(keys) + " of past_key and K together");
  using E = std::conditional_t<std::is_same_v<M, bool>, bool, C>;
  Shape shape = m.shape();
  shape.back() = keys;
  Tensor<E> t(shape);
  const E pad = std::is_same_v<M, bool> ? E(false) : E(-std::numeric_limits<C>::infinity());
  for (int64_t e = 0; e < t.numel(); ++e) t[e] = pad;
  const TensorView<E> head(t.data(), m.shape(), contiguous_strides(shape));
  transform(m, head, [](const M& x) {
    if constexpr (std::is_same_v<M, bool>) return x;
    else return widen<C, M>(x);
  });
  PaddedMask<C> p;
  p.present = true;
  p.is_boolean = std::is_same_v<M, bool>;
  p.shape = shape;
  if constexpr (std::is_same_v<M, bool>) p.boolean = std::move(t);
  else p.additive = std::move(t);
  return p;
}

// The mask of batch entry b: its batch axis (rank 4) indexed, or all of it.
template <class C>
Mask mask_at(const PaddedMask<C>& m, int64_t b) {
  if (!m.present) return {};
  const auto pick = [&](auto view) -> Mask {
    if (view.rank() < 4) return view;
    return at_batch(view, view.dim(0) == 1 ? 0 : b);
  };
  if (m.is_boolean) return pick(TensorView<const bool>(m.boolean.view()));
  return pick(TensorView<const C>(m.additive.view()));
}

// ONNX's causal rule and window, query i at key position p = offset + i, as
// attention's options. Causal: j <= p, Causal::offset(offset), whose
// position the window measures from. Without causal, attention measures a
// window from its causal offset or else from the bottom right, so the
// window's right side becomes the causal bound: j <= p + right is
// Causal::offset(offset + right), and j >= p − left, measured from there,
// a left side of left + right. A side wider than the keys and queries
// together (n_k + n_q) bounds nothing: taken at that width, no sum
// overflows.
void window_to_attn(int64_t offset, int64_t n_q, int64_t n_k, const AttentionAttributes& a,
                    AttentionOptions& options) {
  const int64_t open = n_k + n_q;
  const auto side = [&](int64_t w) { return w < 0 || w > open ? open : w; };
  const bool windowed = a.left_window_size >= 0 || a.right_window_size >= 0;
  if (a.is_causal) {
    options.causal = Causal::offset(offset);
    options.window = {a.left_window_size < 0 ? -1 : side(a.left_window_size),
                      a.right_window_size < 0 ? -1 : side(a.right_window_size)};
  } else if (windowed) {
    const int64_t right = side(a.right_window_size);
    options.causal = Causal::offset(offset + right);
    options.window = {a.left_window_size < 0 ? -1 : side(a.left_window_size) + right, -1};
  }
}

struct Sizes {
  int64_t batch, q_heads, kv_heads, queries, past, keys, d, d_v;
};

template <class C, class T>
void run_attention(const Sizes& z, TensorView<const T> q, const Tensor<T>& present_key,
                   const Tensor<T>& present_value, const PaddedMask<C>& mask,
                   TensorView<const int64_t> nonpad, const AttentionAttributes& a,
                   TensorView<T> y, TensorView<T> qk) {
  const Computed<C> qc = as_compute<C>(q), kc = as_compute<C>(present_key.view()),
                    vc = as_compute<C>(present_value.view());
  AttentionOptions options;
  options.scale = a.scale;
  options.softcap = a.softcap;
  Tensor<bool> valid({1, z.keys});  // nonpad_kv_seqlen's keys, per batch entry
  Tensor<C> y_b({z.q_heads, z.queries, z.d_v}), qk_b;
  if (!qk.empty_view()) qk_b = Tensor<C>({z.q_heads, z.queries, z.keys});
  for (int64_t b = 0; b < z.batch; ++b) {
    const int64_t limit = nonpad.empty_view() ? z.keys : nonpad.at({b});
    const int64_t offset = nonpad.empty_view() ? z.past : limit - z.queries;  // query 0's key position
    window_to_attn(offset, z.queries, z.keys, a, options);
    for (int64_t j = 0; j < z.keys; ++j) valid[j] = j < limit;
    // The keys past nonpad_kv_seqlen: a second mask, beside attn_mask.
    const attn::AttentionMask padding =
        nonpad.empty_view() ? attn::AttentionMask{} : attn::AttentionMask{TensorView<const bool>(valid.view())};
    AttentionExtras<C> extras;
    if (!qk.empty_view()) {
      if (a.qk_matmul_output_mode == 3) extras.weights = qk_b.view();
      else extras.logits = qk_b.view();
      extras.logits_stage = std::array{Logits::Scaled, Logits::Softcapped, Logits::Masked,
                                       Logits::Masked}[a.qk_matmul_output_mode];
    }
    AttentionPlan<C, C>(at_batch(qc.view, b), at_batch(kc.view, b), at_batch(vc.view, b), options,
                        {attn::AttentionMask{mask_at(mask, b)}, padding})
        .run(y_b.view(), extras);
    transform(TensorView<const C>(y_b.view()), at_batch(y, b), narrow<T, C>);
    if (!qk.empty_view()) transform(TensorView<const C>(qk_b.view()), at_batch(qk, b), narrow<T, C>);
  }
}

}  // namespace

template <OnnxType T>
AttentionOutputs<T> attention(TensorView<const T> Q, TensorView<const T> K, TensorView<const T> V,
                              const AttentionMask<T>& attn_mask, TensorView<const T> past_key,
                              TensorView<const T> past_value, TensorView<const int64_t> nonpad_kv_seqlen,
                              const AttentionAttributes& a, bool qk_matmul_output) {
  const char* op = "onnx.attention";
  const std::string shapes =
      "Q " + shape_str(Q.shape()) + ", K " + shape_str(K.shape()) + ", V " + shape_str(V.shape());
  if (Q.rank() != K.rank() || Q.rank() != V.rank() || (Q.rank() != 3 && Q.rank() != 4))
    fail(op, "Q, K and V must all be 4-D (batch, heads, sequence, head_size) or all 3-D (batch, "
             "sequence, heads * head_size), got " + shapes);
  if (a.is_causal != 0 && a.is_causal != 1) fail(op, "is_causal must be 0 or 1, got " + std::to_string(a.is_causal));
  if (a.opset < 23 || a.opset > 25)
    fail(op, "opset must be 23, 24 or 25 (Attention's versions), got " + std::to_string(a.opset));
  if (a.left_window_size < -1 || a.right_window_size < -1)
    fail(op, "left_window_size and right_window_size must be -1 (open) or >= 0, got " +
                 std::to_string(a.left_window_size) + " and " + std::to_string(a.right_window_size));
  if (a.opset < 25 && (a.left_window_size != -1 || a.right_window_size != -1))
    fail(op, "left_window_size and right_window_size are attributes from opset 25 on, got opset " +
                 std::to_string(a.opset));
  if (a.opset < 24 && !nonpad_kv_seqlen.empty_view())
    fail(op, "nonpad_kv_seqlen is an input from opset 24 on, got opset " + std::to_string(a.opset));
  if (a.qk_matmul_output_mode < 0 || a.qk_matmul_output_mode > 3)
    fail(op, "qk_matmul_output_mode must be 0, 1, 2 or 3, got " + std::to_string(a.qk_matmul_output_mode));
  const int64_t precision = a.softmax_precision;
  if (precision != 0 && precision != 1 && precision != 10 && precision != 11 && precision != 16)
    fail(op, "softmax_precision must be 0 (not given), 1 (FLOAT), 10 (FLOAT16), 11 (DOUBLE) or 16 "
             "(BFLOAT16), got " + std::to_string(precision));
  const bool three_d = Q.rank() == 3;
  if (three_d) {
    if (Q.dim(0) != K.dim(0) || Q.dim(0) != V.dim(0) || K.dim(1) != V.dim(1))
      fail(op, "Q, K and V must have one batch size, and K and V one sequence length, got " + shapes);
    Q = heads_first(Q, a.q_num_heads, op, "Q", "q_num_heads");
    K = heads_first(K, a.kv_num_heads, op, "K", "kv_num_heads");
    V = heads_first(V, a.kv_num_heads, op, "V", "kv_num_heads");
  } else if (a.opset >= 25 && (a.q_num_heads != 0 || a.kv_num_heads != 0)) {
    fail(op, "q_num_heads and kv_num_heads are for 3-D inputs only from opset 25 on, got " +
                 std::to_string(a.q_num_heads) + " and " + std::to_string(a.kv_num_heads) + " with " + shapes);
  } else {
    if (a.q_num_heads != 0 && a.q_num_heads != Q.dim(1))
      fail(op, "q_num_heads (" + std::to_string(a.q_num_heads) + ") differs from Q's heads, " + shapes);
    if (a.kv_num_heads != 0 && (a.kv_num_heads != K.dim(1) || a.kv_num_heads != V.dim(1)))
      fail(op, "kv_num_heads (" + std::to_string(a.kv_num_heads) + ") differs from K's or V's heads, " + shapes);
  }
  Sizes z{Q.dim(0), Q.dim(1), K.dim(1), Q.dim(2), 0, 0, K.dim(3), V.dim(3)};
  if (K.dim(0) != z.batch || V.dim(0) != z.batch || V.dim(1) != z.kv_heads || V.dim(2) != K.dim(2) ||
      Q.dim(3) != z.d)
    fail(op, "the shapes do not fit (batch, heads, sequence, head_size): " + shapes);
  if (past_key.empty_view() != past_value.empty_view())
    fail(op, "past_key and past_value go together: give both or neither");
  if (!past_key.empty_view() && !nonpad_kv_seqlen.empty_view())
    fail(op, "nonpad_kv_seqlen (an external cache) cannot come with past_key and past_value (the "
             "operator's own cache)");
  if (!past_key.empty_view()) {
    const Shape want_k{z.batch, z.kv_heads, past_key.rank() == 4 ? past_key.dim(2) : -1, z.d};
    const Shape want_v{z.batch, z.kv_heads, want_k[2], z.d_v};
    if (past_key.shape() != want_k || past_value.shape() != want_v)
      fail(op, "past_key and past_value must be (batch, kv_heads, past, head_size) and (batch, "
               "kv_heads, past, v_head_size) for " + shapes + ", got past_key " +
               shape_str(past_key.shape()) + ", past_value " + shape_str(past_value.shape()));
    z.past = want_k[2];
  }
  z.keys = z.past + K.dim(2);
  if (!nonpad_kv_seqlen.empty_view()) {
    if (nonpad_kv_seqlen.shape() != Shape{z.batch})
      fail(op, "nonpad_kv_seqlen must have shape (" + std::to_string(z.batch) + ",), got " +
                   shape_str(nonpad_kv_seqlen.shape()));
    for (int64_t b = 0; b < z.batch; ++b) {
      const int64_t n = nonpad_kv_seqlen.at({b});
      if (n < 0 || n > z.keys)
        fail(op, "nonpad_kv_seqlen[" + std::to_string(b) + "] = " + std::to_string(n) +
                     " is outside 0.." + std::to_string(z.keys) + " (the keys)");
    }
  }

  AttentionOutputs<T> out;
  out.present_key = Tensor<T>({z.batch, z.kv_heads, z.keys, z.d});
  out.present_value = Tensor<T>({z.batch, z.kv_heads, z.keys, z.d_v});
  if (z.past > 0) {
    copy<T>(past_key, rows(out.present_key, 0, z.past));
    copy<T>(past_value, rows(out.present_value, 0, z.past));
  }
  copy<T>(K, rows(out.present_key, z.past, K.dim(2)));
  copy<T>(V, rows(out.present_value, z.past, K.dim(2)));
  out.Y = three_d ? Tensor<T>({z.batch, z.queries, z.q_heads * z.d_v})
                  : Tensor<T>({z.batch, z.q_heads, z.queries, z.d_v});
  TensorView<T> y = out.Y.view();
  if (three_d) y = heads_first(y, z.q_heads, op, "Y", "q_num_heads");
  if (qk_matmul_output) out.qk_matmul_output = Tensor<T>({z.batch, z.q_heads, z.queries, z.keys});
  const TensorView<T> qk = qk_matmul_output ? out.qk_matmul_output.view() : TensorView<T>();

  const auto run = [&](auto compute) {
    using C = decltype(compute);
    PaddedMask<C> mask;
    if (const auto* m = std::get_if<TensorView<const bool>>(&attn_mask)) mask = padded<C>(*m, z.keys, op);
    if (const auto* m = std::get_if<TensorView<const T>>(&attn_mask)) mask = padded<C>(*m, z.keys, op);
    if (mask.present)  // (the error names ONNX's full shape, not a batch entry's)
      broadcast_strides(mask.shape, contiguous_strides(mask.shape),
                        {z.batch, z.q_heads, z.queries, z.keys}, "onnx.attention: attn_mask");
    run_attention<C, T>(z, Q, out.present_key, out.present_value, mask, nonpad_kv_seqlen, a, y, qk);
  };
  if (std::is_same_v<T, double> || precision == 11) run(double{});
  else run(float{});
  return out;
}

template <OnnxType T>
Tensor<T> rotary_embedding(TensorView<const T> X, TensorView<const T> cos_cache,
                           TensorView<const T> sin_cache, TensorView<const int64_t> position_ids,
                           const RotaryEmbeddingAttributes& a) {
  const char* op = "onnx.rotary_embedding";
  if (X.rank() != 3 && X.rank() != 4)
    fail(op, "X must be 4-D (batch, heads, sequence, head_size) or 3-D (batch, sequence, heads * "
             "head_size), got " + shape_str(X.shape()));
  if (a.interleaved != 0 && a.interleaved != 1)
    fail(op, "interleaved must be 0 or 1, got " + std::to_string(a.interleaved));
  Tensor<T> Y(X.shape());
  TensorView<const T> x = X;
  TensorView<T> y = Y.view();
  if (X.rank() == 3) {
    x = heads_first(x, a.num_heads, op, "X", "num_heads");
    y = heads_first(y, a.num_heads, op, "Y", "num_heads");
  } else if (a.num_heads != 0 && a.num_heads != X.dim(1)) {
    fail(op, "num_heads (" + std::to_string(a.num_heads) + ") differs from X's heads, X " +
                 shape_str(X.shape()));
  }
  const int64_t batch = x.dim(0), n = x.dim(2), d = x.dim(3);
  const int64_t r = a.rotary_embedding_dim == 0 ? d : a.rotary_embedding_dim;
  if (a.rotary_embedding_dim == 0 && d % 2 != 0)
    fail(op, "the head size " + std::to_string(d) + " (X " + shape_str(X.shape()) +
                 ") is odd, and rotary_embedding_dim 0 rotates all of it, in pairs: give an even "
                 "rotary_embedding_dim below " + std::to_string(d));
  if (r < 0 || r > d || r % 2 != 0)
    fail(op, "rotary_embedding_dim must be even, within 0.." + std::to_string(d) +
                 " (the head size; 0: all of it), got " + std::to_string(a.rotary_embedding_dim));
  const bool indexed = !position_ids.empty_view();
  const Shape want = indexed ? Shape{cos_cache.rank() == 2 ? cos_cache.dim(0) : -1, r / 2}
                             : Shape{batch, n, r / 2};
  if (cos_cache.shape() != want || sin_cache.shape() != want)
    fail(op, std::string("cos_cache and sin_cache must be ") +
                 (indexed ? "(max_position + 1, " : "without position_ids (batch, sequence, ") +
                 std::to_string(r / 2) + ") for X " + shape_str(X.shape()) + ", got " +
                 shape_str(cos_cache.shape()) + " and " + shape_str(sin_cache.shape()));
  TensorView<const int64_t> positions;
  if (indexed) {
    if (position_ids.shape() != Shape{batch, n})
      fail(op, "position_ids must be (batch, sequence) = " + shape_str({batch, n}) + ", got " +
                   shape_str(position_ids.shape()));
    positions = TensorView<const int64_t>(position_ids.data(), {batch, 1, n},
                                          {position_ids.stride(0), 0, position_ids.stride(1)});
  } else {  // (batch, sequence, r/2) broadcast over the heads
    const auto per_head = [&](TensorView<const T> t) {
      return TensorView<const T>(t.data(), {batch, 1, n, r / 2}, {t.stride(0), 0, t.stride(1), t.stride(2)});
    };
    cos_cache = per_head(cos_cache);
    sin_cache = per_head(sin_cache);
  }
  RopeOptions options;
  options.interleaved = a.interleaved == 1;
  options.rotary_dim = r;
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const Computed<C> xc = as_compute<C>(x), cc = as_compute<C>(cos_cache), sc = as_compute<C>(sin_cache);
  if constexpr (std::is_same_v<C, T>) {
    apply_rope<C>(xc.view, y, RopeTables<C>{cc.view, sc.view}, options, positions);
  } else {
    Tensor<C> yc(x.shape());
    apply_rope<C>(xc.view, yc.view(), RopeTables<C>{cc.view, sc.view}, options, positions);
    transform(TensorView<const C>(yc.view()), y, narrow<T, C>);
  }
  return Y;
}

#define ATTN_ONNX_INSTANTIATE(T)                                                                  \
  template AttentionOutputs<T> attention(TensorView<const T>, TensorView<const T>,                \
                                         TensorView<const T>, const AttentionMask<T>&,            \
                                         TensorView<const T>, TensorView<const T>,                \
                                         TensorView<const int64_t>, const AttentionAttributes&,   \
                                         bool);                                                   \
  template Tensor<T> rotary_embedding(TensorView<const T>, TensorView<const T>,                   \
                                      TensorView<const T>, TensorView<const int64_t>,             \
                                      const RotaryEmbeddingAttributes&);
ATTN_ONNX_INSTANTIATE(float)
ATTN_ONNX_INSTANTIATE(double)
ATTN_ONNX_INSTANTIATE(float16)
ATTN_ONNX_INSTANTIATE(bfloat16)
#undef ATTN_ONNX_INSTANTIATE

}  // namespace attn::onnx
