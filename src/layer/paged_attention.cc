// Attention over a PagedKVCache: its pools and page table read under one
// hold of the cache as a reader, so that no writer changes them between.
#include <string>
#include <type_traits>

#include "attn/paged_kv_cache.hpp"

namespace attn {

void PagedKVCache::run(const BatchAttentionPlan& plan, TensorView<const float> q, TensorView<float> out,
                       TensorView<float> lse) const {
  read_pools("run", [&](auto k, auto v) { plan.run(q, k, v, out, lse); });
}

BatchAttentionResult batch_attention(TensorView<const float> q, TensorView<const int32_t> qo_indptr,
                                     const PagedKVCache& cache, const std::vector<int64_t>& seq_ids,
                                     const BatchAttentionOptions& options, bool return_lse) {
  if (q.rank() != 3)
    throw ValueError("batch_attention: q must be (nnz_q, num_qo_heads, head_dim), got shape " + shape_str(q.shape()));
  // The page table and the pools under one read: no writer between them.
  return cache.read_pools("batch_attention", [&](auto k, auto v) {
    const PageTable t = cache.page_table(seq_ids);
    const BatchAttentionPlan plan(qo_indptr, t.kv_indptr.view(), t.kv_indices.view(), t.kv_last_page_len.view(),
                                  q.dim(1), cache.kv_heads(), cache.head_dim(), cache.page_size(), options,
                                  cache.value_head_dim(), cache.layout());
    BatchAttentionResult r{Tensor<float>(plan.output_shape()),
                           return_lse ? Tensor<float>(plan.lse_shape()) : Tensor<float>()};
    plan.run(q, k, v, r.out.view(), return_lse ? r.lse.view() : TensorView<float>());
    return r;
  });
}

SparseAttentionResult<float> sparse_attention(TensorView<const float> q, TensorView<const int32_t> qo_indptr,
                                              const PagedKVCache& cache, const std::vector<int64_t>& seq_ids,
                                              TensorView<const int32_t> indices,
                                              const SparseAttentionOptions& options) {
  // The page table and the pools under one read: no writer between them.
  return cache.read_pools("sparse_attention", [&](auto k, auto v) -> SparseAttentionResult<float> {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(*k.data())>, block_int4>) {
      throw TypeError("sparse_attention: an int4 cache's keys are quantized per channel over groups of 32 tokens, "
                      "and sparse_attention reads keys token by token: serve it with batch_attention, or use q4_0");
    } else {
      const PageTable t = cache.page_table(seq_ids);
      return sparse_attention(q, qo_indptr, k, v, t.kv_indptr.view(), t.kv_indices.view(), t.kv_last_page_len.view(),
                              indices, options, cache.layout());
    }
  });
}

}  // namespace attn
