// The MultiHeadLatentAttention layer over a paged latent cache: a ragged
// batch of many sequences' new tokens, projected once, rotated at each
// sequence's positions, appended as latent rows, and attended in the
// absorbed form by one batch_attention over the pages (MQA: keys the rows
// [c | k_pe], values their c, read in place), then W_UV and o_proj.
#include <string>
#include <vector>

#include "attn/batch_attention.hpp"
#include "attn/latent_attention.hpp"
#include "attn/linear.hpp"
#include "attn/paged_kv_cache.hpp"
#include "layer/mla_internal.hpp"
#include "layer/packed_sequences.hpp"

namespace attn {
using detail::mla::fail;

Tensor<float> MultiHeadLatentAttention::forward(TensorView<const float> x, PagedKVCache& cache,
                                                const std::vector<int64_t>& seq_ids,
                                                TensorView<const int64_t> cu_seqlens) const {
  const auto& c = config_;
  const int64_t H = c.num_attention_heads, r = c.kv_lora_rank, p = c.qk_rope_head_dim, E = c.hidden_size;
  const int64_t dqk = c.qk_head_dim(), dv = c.v_head_dim, row = r + p;
  if (x.rank() != 2 || x.dim(1) != E)
    fail("with seq_ids the input is packed (total, hidden_size) = (total, " + std::to_string(E) + "), got " +
         shape_str(x.shape()));
  if (cache.latent_rank() != r || cache.head_dim() != row)
    fail("serving needs a PagedKVCache.latent of this layer's rows, " + std::to_string(r) + " + " + std::to_string(p) +
         (cache.latent_rank() == 0 ? std::string(", got a cache of keys and values apart")
                                   : ", got " + std::to_string(cache.latent_rank()) + " + " +
                                         std::to_string(cache.head_dim() - cache.latent_rank())));
  const int64_t total = x.dim(0), n = static_cast<int64_t>(seq_ids.size());
  const std::vector<int32_t> qo_indptr = detail::qo_indptr_of("MultiHeadLatentAttention", cu_seqlens, n, total);
  // Each token at its sequence's next position (KeyError for an unknown id, before anything changes).
  Tensor<int64_t> positions({total});
  for (int64_t i = 0; i < n; ++i) {
    const int64_t past = cache.length(seq_ids[static_cast<size_t>(i)]);
    for (int64_t t = qo_indptr[i]; t < qo_indptr[i + 1]; ++t) positions[t] = past + t - qo_indptr[i];
  }

  const auto w = snapshot();
  const Parameters& P = *w;
  const Tensor<float> xc = contiguous(x);
  Tensor<float> q, kv;
  P.project(c, xc.view(), q, kv);
  detail::mla::rotate(c, q, kv, 1, total, 0, positions.view());
  cache.append(seq_ids, TensorView<const float>(kv.data(), {total, 1, row}), {}, cu_seqlens);

  // The absorbed queries [q_nope · W_UK | q_pe] per token and head.
  const Tensor<float> q_lat = P.absorb(c, q.data(), total);
  Tensor<float> q_abs({total, H, row});
  for (int64_t t = 0; t < total; ++t)
    for (int64_t h = 0; h < H; ++h) {
      std::copy_n(q_lat.data() + (t * H + h) * r, r, q_abs.data() + (t * H + h) * row);
      std::copy_n(q.data() + t * H * dqk + h * dqk + c.qk_nope_head_dim, p, q_abs.data() + (t * H + h) * row + r);
    }
  Tensor<float> latent({total, H, r});
  if (cache.dtype() != KVDtype::Q8_0) {
    BatchAttentionOptions o;
    o.causal = true;
    o.scale = c.softmax_scale();
    latent = batch_attention(TensorView<const float>(q_abs.view()),
                             TensorView<const int32_t>(qo_indptr.data(), {n + 1}), cache, seq_ids, o)
                 .out;
  } else {
    // Rows of two types (q8_0 c, bfloat16 k_pe): each sequence through a float32 copy of its rows.
    for (int64_t i = 0; i < n; ++i) {
      const int64_t begin = qo_indptr[i], rows_q = qo_indptr[i + 1] - begin;
      if (rows_q == 0) continue;
      const Tensor<float> rows = cache.latent_rows(seq_ids[static_cast<size_t>(i)]);
      const int64_t n_k = rows.dim(0);
      const auto res = latent_attention<float, float>(
          TensorView<const float>(q_abs.data() + begin * H * row, {rows_q, H, r}, {H * row, row, 1}),
          TensorView<const float>(q_abs.data() + begin * H * row + r, {rows_q, H, p}, {H * row, row, 1}),
          TensorView<const float>(rows.data(), {n_k, r}, {row, 1}),
          TensorView<const float>(rows.data() + r, {n_k, p}, {row, 1}), c.softmax_scale(), /*causal=*/true);
      std::copy_n(res.out.data(), res.out.numel(), latent.data() + begin * H * r);
    }
  }
  Tensor<float> ctx({total, H * dv}), out({total, E});
  P.expand_values(c, latent.data(), total, ctx.data());
  linear(TensorView<const float>(ctx.view()), P["o_proj.weight"].view(), P.bias_of("o_proj.bias"), out.view());
  return out;
}

}  // namespace attn
