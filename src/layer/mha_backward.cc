// The MultiHeadAttention layer's backward: each step undoes a line of the
// forward, last first, from the Activations a forward kept (or computes
// again).
#include <algorithm>

#include "layer/mha_internal.hpp"

namespace attn {
using namespace detail::mha;

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
  const auto bias_grad = [&](int i) { return c.bias ? g.parameters[4 + i].view() : TensorView<T>(); };
  // The gradient in the slot of parameter p (parameters()' order).
  const auto list = w->list(c);
  const auto grad_of = [&](const Tensor<T>& p) -> Tensor<T>& {
    return g.parameters[static_cast<size_t>(std::find(list.begin(), list.end(), &p) - list.begin())];
  };
  const bool gated = c.gate != Gate::None;
  // A contiguous tensor of `rows` rows of `width` (the tokens of every batch
  // entry) as the matrix linear() takes.
  const auto matrix = [](auto& t, int64_t rows, int64_t width) {
    return TensorView<std::remove_pointer_t<decltype(t.data())>>(t.data(), {rows, width});
  };

  // forward: out = (ctx * gate) Woᵀ + bo (rows in ctx's layout)
  Tensor<T> dctx(out_shape);
  const Tensor<T> gated_ctx = gated ? apply_gate(a.ctx, a.gate, seq_first(a)) : Tensor<T>();
  linear_backward(matrix(gated ? gated_ctx : a.ctx, B * n_q, E), w->wo.view(), matrix(dy, B * n_q, E),
                  matrix(dctx, B * n_q, E), dwo.view(), bias_grad(3));
  // forward: gate = sigmoid(q_in Wgᵀ + bg)
  const Tensor<T> d_gate_logits = gated ? gate_backward(dctx, a.ctx, a.gate, seq_first(a)) : Tensor<T>();
  // forward: ctx = attention(q, k, v) per head
  Tensor<T> dq({B, n_q, E}), dk({B, n_k, kv}), dv({B, n_k, kv});
  auto dqh = heads_view(dq, H), dkh = heads_view(dk, Hkv);
  attention_backward(TensorView<const T>(heads_view(a.q, H)), a.K, a.V, TensorView<const T>(ctx_heads(dctx, a)),
                     dqh, dkh, heads_view(dv, Hkv), a.attention, a.masks(),
                     c.sinks ? grad_of(w->sinks).view() : TensorView<T>(),
                     SavedForward<T>{TensorView<const T>(ctx_heads(a.ctx, a)), a.lse.view()});
  // forward: bias_k, bias_v (add_bias_kv) and zeros (add_zero_attn) appended
  // after the n_in keys the inputs gave
  if (const int64_t n_in = a.k_in.dim(1); n_in != n_k) {
    if (c.add_bias_kv) {
      T* dbk = grad_of(w->bias_k).data();
      T* dbv = grad_of(w->bias_v).data();
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
  // forward: q = q_in Wqᵀ + bq (and the gate's logits q_in Wgᵀ + bg);  k = k_in Wkᵀ + bk;  v = v_in Wvᵀ + bv
  const auto input_grad = [&](TensorView<const T> x, const Tensor<T>& w, const Tensor<T>& dproj,
                              Tensor<T>& dw, TensorView<T> db) {
    const Tensor<T> xc = contiguous(x);
    Tensor<T> dx(xc.shape());
    const int64_t rows = x.dim(0) * x.dim(1);
    linear_backward(matrix(xc, rows, x.dim(2)), w.view(), matrix(dproj, rows, w.dim(0)), matrix(dx, rows, x.dim(2)),
                    dw.view(), db);
    return dx;
  };
  Tensor<T> dq_in = input_grad(a.q_in, w->wq, dq, dwq, bias_grad(0));
  const auto add = [](Tensor<T>& to, const Tensor<T>& from) {
    for (int64_t i = 0; i < to.numel(); ++i) to[i] += from[i];
  };
  if (gated)
    add(dq_in, input_grad(a.q_in, w->wg, d_gate_logits, grad_of(w->wg),
                          c.bias ? grad_of(w->bg).view() : TensorView<T>()));
  Tensor<T> dk_in = input_grad(a.k_in, w->wk, dk, dwk, bias_grad(1));
  Tensor<T> dv_in = input_grad(a.v_in, w->wv, dv, dwv, bias_grad(2));
  // forward: value defaults to key and key to query, so their gradients add up there
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

#define ATTN_MHA_BACKWARD(T)                                                                                      \
  template MhaGradients<T> MultiHeadAttention<T>::backward(TensorView<const T>, TensorView<const T>,             \
                                                           TensorView<const T>, TensorView<const T>,             \
                                                           const MhaForwardOptions<T>&) const;                   \
  template MhaGradients<T> MultiHeadAttention<T>::backward(TensorView<const T>, const MhaSaved<T>&) const;        \
  template MhaGradients<T> MultiHeadAttention<T>::gradients(const Parameters&, const Activations&,               \
                                                            TensorView<const T>) const;
ATTN_MHA_BACKWARD(float)
ATTN_MHA_BACKWARD(double)
#undef ATTN_MHA_BACKWARD

}  // namespace attn
