// Internal to the layer room: what the MultiHeadAttention layer's files
// (multi_head_attention.cc: configuration and parameters, mha_forward.cc,
// mha_backward.cc, mha_state.cc: state dict and files) share: the
// activations a forward keeps for its backward, and the reshapings both use.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>

#include "attn/linear.hpp"
#include "attn/multi_head_attention.hpp"
#include "attn/positional.hpp"

namespace attn::detail::mha {

[[noreturn]] inline void fail(const std::string& msg) { throw ValueError("MultiHeadAttention: " + msg); }

// The backward computes in float32 (attention_backward): a forward meant
// for it must too.
template <class T>
void check_backward_precision(const MhaForwardOptions<T>& opt) {
  if (opt.attention.precision != Precision::Float32)
    fail("the backward computes in float32: attention.precision must be f32 for backward and "
         "save_for_backward, got " + precision_name(opt.attention.precision));
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
  linear(rows, w.view(), b.rank() ? b.view() : TensorView<const T>(), TensorView<T>(y.data(), {B * n, out}));
  return y;
}

// The output gate sigmoid(x W_gᵀ + b_g) (B, n, gate width) of the query input x.
template <class T>
Tensor<T> gate_values(TensorView<const T> x, const Tensor<T>& wg, const Tensor<T>& bg) {
  Tensor<T> g = project(x, wg, bg);
  for (int64_t i = 0; i < g.numel(); ++i) g[i] = T(1) / (T(1) + std::exp(-g[i]));
  return g;
}

// The heads' outputs ctx (B, n, E), or (n, B, E) when seq_first, times the
// gate (B, n, G): element e of a token's row by its gate e / (E / G).
template <class T>
Tensor<T> apply_gate(const Tensor<T>& ctx, const Tensor<T>& gate, bool seq_first) {
  const int64_t B = gate.dim(0), n = gate.dim(1), G = gate.dim(2), E = ctx.dim(2), step = E / G;
  Tensor<T> y(ctx.shape());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = (seq_first ? i * B + b : b * n + i) * E;
      const T* g = gate.data() + (b * n + i) * G;
      for (int64_t e = 0; e < E; ++e) y[row + e] = ctx[row + e] * g[e / step];
    }
  return y;
}

// apply_gate's backward: d_gated (ctx's layout) becomes dL/d ctx in place;
// returns dL/d the gate's logits (B, n, G), through sigmoid' = g (1 - g).
template <class T>
Tensor<T> gate_backward(Tensor<T>& d_gated, const Tensor<T>& ctx, const Tensor<T>& gate, bool seq_first) {
  const int64_t B = gate.dim(0), n = gate.dim(1), G = gate.dim(2), E = ctx.dim(2), step = E / G;
  Tensor<T> d_logits(gate.shape());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = (seq_first ? i * B + b : b * n + i) * E, at = (b * n + i) * G;
      for (int64_t e = 0; e < E; ++e) {
        d_logits[at + e / step] += d_gated[row + e] * ctx[row + e];
        d_gated[row + e] *= gate[at + e / step];
      }
      for (int64_t k = 0; k < G; ++k) d_logits[at + k] *= gate[at + k] * (T(1) - gate[at + k]);
    }
  return d_logits;
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

}  // namespace attn::detail::mha

namespace attn {

template <class T>
struct MultiHeadAttention<T>::Activations {
  TensorView<const T> q_in, k_in, v_in;  // the inputs as (batch, n, width)
  bool key_is_query, value_is_key;       // key (value) was not given: it defaulted
  bool is_batched;
  Tensor<T> q, k, v;                     // projections (batch, n, heads * head_dim); q, k rotated
  TensorView<const T> K, V;              // this call's keys and values (heads, rotated)
  int64_t n_k;                           // keys attended: with a cache, all it holds
  Mask attn_mask, key_padding_mask;      // views that broadcast to (batch, heads, n_q, n_k)
  std::optional<detail::mha::PaddedMask> padded_attn_mask, padded_key_padding_mask;  // with extra keys
  AttentionOptions attention;
  RopeOptions rope;
  Tensor<T> ctx;                         // the heads' outputs concatenated, in query's layout
  Tensor<T> gate;                        // (batch, n_q, gate width) with a gate: sigmoid's values
  Tensor<T> weights;                     // (batch, heads, n_q, n_k) when need_weights
  Tensor<T> lse;                         // (batch, heads, n_q) without a cache: the backward's

  // Both in nn.MultiheadAttention's convention: a boolean true blocks.
  AttentionMasks masks() const {
    return {{attn_mask, MaskConvention::TrueBlocks}, {key_padding_mask, MaskConvention::TrueBlocks}};
  }
};

// A forward's state for its backward (multi_head_attention.hpp).
template <class T>
struct MhaSaved {
  uint64_t layer_id;  // the layer whose forward this is (MultiHeadAttention::id_)
  std::shared_ptr<const typename MultiHeadAttention<T>::Parameters> params;
  typename MultiHeadAttention<T>::Activations activations;
};

}  // namespace attn
