// The MultiHeadAttention layer over a paged cache: a ragged batch of many
// sequences' new tokens, projected once, rotated per sequence, appended and
// attended in one batch_attention call, then gated and projected out.
#include <string>
#include <vector>

#include "attn/batch_attention.hpp"
#include "attn/paged_kv_cache.hpp"
#include "layer/mha_internal.hpp"
#include "layer/packed_sequences.hpp"

namespace attn {
using namespace detail::mha;

template <class T>
Tensor<T> MultiHeadAttention<T>::forward(TensorView<const T> x, PagedKVCache& cache,
                                         const std::vector<int64_t>& seq_ids, TensorView<const int64_t> cu_seqlens,
                                         const AttentionOptions& attention) const {
  const auto& c = config_;
  if constexpr (!std::is_same_v<T, float>) {
    throw TypeError("MultiHeadAttention: a PagedKVCache holds float32 keys and values: serve with a float32 layer");
  } else {
    if (c.key_dim() != c.embed_dim || c.value_dim() != c.embed_dim || c.extra_keys())
      fail("serving over a PagedKVCache is for self-attention layers (no kdim, vdim, add_bias_kv or add_zero_attn)");
    if (x.rank() != 2 || x.dim(1) != c.embed_dim)
      fail("with seq_ids the input is packed (total, embed_dim) = (total, " + std::to_string(c.embed_dim) +
           "), got " + shape_str(x.shape()));
    const int64_t H = c.num_heads, Hkv = c.kv_heads(), dh = c.head_dim(), total = x.dim(0);
    if (cache.kv_heads() != Hkv || cache.head_dim() != dh || cache.value_head_dim() != dh)
      fail("the cache holds " + std::to_string(cache.kv_heads()) + " heads of " + std::to_string(cache.head_dim()) +
           " (values " + std::to_string(cache.value_head_dim()) + "), this layer " + std::to_string(Hkv) +
           " heads of " + std::to_string(dh));
    const auto n = static_cast<int64_t>(seq_ids.size());
    const std::vector<int32_t> qo_indptr = detail::qo_indptr_of("MultiHeadAttention", cu_seqlens, n, total);
    if (attention.causal != Causal::None && attention.causal != Causal::BottomRight)
      fail("over a PagedKVCache each sequence's tokens are its last: causal is bottom-right (True) or none, got " +
           causal_name(attention.causal));
    if (attention.precision != Precision::Float32)
      fail("serving over a PagedKVCache computes in float32, got precision " + precision_name(attention.precision));
    const auto w = snapshot();
    BatchAttentionOptions o;
    o.causal = attention.causal == Causal::BottomRight;
    o.window = attention.window;
    o.softcap = attention.softcap;
    o.scale = attention.scale;
    o.alibi_slopes = attention.alibi_slopes;
    o.sinks = attention.sinks;
    if (c.alibi) {
      if (!o.alibi_slopes.empty()) fail("this layer has alibi on, which sets the slopes: pass no alibi_slopes of your own");
      o.alibi_slopes = alibi_slopes(H);
    }
    if (c.sinks) {
      if (!o.sinks.empty()) fail("this layer has sinks on, which are its parameter: pass no sinks of your own");
      o.sinks.assign(w->sinks.data(), w->sinks.data() + H);
    }
    AttentionOptions checked = attention;
    checked.alibi_slopes = o.alibi_slopes;
    checked.sinks = o.sinks;
    check_attention_options<T>(checked, H);  // before anything is appended
    std::vector<int64_t> lengths;
    for (int64_t id : seq_ids) lengths.push_back(cache.length(id));  // (KeyError for an unknown id)

    const TensorView<const T> rows(x.data(), {1, total, c.embed_dim}, {0, x.stride(0), x.stride(1)});
    Tensor<T> q = project(rows, w->wq, w->bq), k = project(rows, w->wk, w->bk), v = project(rows, w->wv, w->bv);
    if (c.rope) {
      RopeOptions rope;
      rope.base = c.rope_base;
      rope.interleaved = c.rope_interleaved;
      rope.scaling = c.rope_scaling;
      for (int64_t i = 0; i < n; ++i) {  // each sequence at its own positions
        const int64_t begin = qo_indptr[i], len = qo_indptr[i + 1] - begin;
        rope.offset = lengths[static_cast<size_t>(i)];
        for (auto [t, heads] : {std::pair{&q, H}, std::pair{&k, Hkv}}) {
          const TensorView<T> part(t->data() + begin * heads * dh, {heads, len, dh}, {dh, heads * dh, 1});
          apply_rope(TensorView<const T>(part), part, rope);
        }
      }
    }
    const TensorView<const T> k_rows(k.data(), {total, Hkv, dh}), v_rows(v.data(), {total, Hkv, dh});
    cache.append(seq_ids, k_rows, v_rows, cu_seqlens);
    BatchAttentionResult r = batch_attention(TensorView<const T>(q.data(), {total, H, dh}),
                                                   TensorView<const int32_t>(qo_indptr.data(), {n + 1}), cache, seq_ids, o);
    Tensor<T> ctx = std::move(r.out).reshape({1, total, H * dh});
    if (c.gate != Gate::None) ctx = apply_gate(ctx, gate_values(rows, w->wg, w->bg), false);
    Tensor<T> out = project(TensorView<const T>(ctx.view()), w->wo, w->bo);
    return std::move(out).reshape({total, c.embed_dim});
  }
}

template Tensor<float> MultiHeadAttention<float>::forward(TensorView<const float>, PagedKVCache&,
                                                          const std::vector<int64_t>&, TensorView<const int64_t>,
                                                          const AttentionOptions&) const;
template Tensor<double> MultiHeadAttention<double>::forward(TensorView<const double>, PagedKVCache&,
                                                            const std::vector<int64_t>&, TensorView<const int64_t>,
                                                            const AttentionOptions&) const;

}  // namespace attn
