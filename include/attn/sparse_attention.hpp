// Top-k sparse attention (DeepSeek-V3.2's DeepSeek Sparse Attention): each
// query row attends only the keys its row of `indices` names, an indexer's
// top-k picks. The keys are gathered by the kernel as it goes: the cost is
// O(n_q · topk · d), never a dense n_q × n_k mask.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "attn/batch_attention.hpp"
#include "attn/tensor.hpp"

namespace attn {

// The options of attention() that a row of picked keys keeps.
struct SparseAttentionOptions {
  std::optional<double> scale;  // default 1/sqrt(d)
  double softcap = 0;           // > 0: logits = softcap · tanh(logits / softcap)
  // One logit per query head, in every row's softmax denominator as a key of
  // value zero (attention()'s sinks). Empty: none.
  std::vector<double> sinks;
};

template <Real T>
struct SparseAttentionResult {
  Tensor<T> out;  // (..., Hq, n_q, Dv)
  Tensor<T> lse;  // (..., Hq, n_q): natural log of each row's softmax
                  // denominator; −∞ for a row with no key (the sink's
                  // logit with sinks)
};

// q (..., Hq, n_q, D), k (..., Hkv, n_k, D), v (..., Hkv, n_k, Dv), and
// indices int32 (..., Hkv or 1, n_q, topk): the key positions query row i
// attends, per KV head (a query head h reads KV head h / (Hq / Hkv) and its
// indices) or one row for all heads; −1 anywhere in a row means no key. The
// leading axes are the same for all four. Equal to attention() with the
// boolean mask the indices describe, at float rounding. A row with no key
// gives zeros. ValueError naming the argument: shapes that do not fit, an
// index below −1 or at or beyond n_k, a key named twice in a row, options
// out of range (as attention's). float: SIMD kernels; double: the
// reference.
template <Real T>
SparseAttentionResult<T> sparse_attention(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                                          TensorView<const int32_t> indices,
                                          const SparseAttentionOptions& options = {});

// The same over paged keys and values (batch_attention's pools and
// FlashInfer's metadata, whose rules it checks as batch_attention does):
// request r's queries are rows qo_indptr[r] .. qo_indptr[r + 1] of q
// (nnz_q, Hq, D), its keys the kv_len tokens of its pages; indices int32
// (nnz_q, Hkv or 1, topk) name positions in the request's own sequence
// (0 .. kv_len − 1), −1 none. The pools are float32, bfloat16, float16 or
// q8_0 blocks, read in place. out (nnz_q, Hq, Dv), lse (nnz_q, Hq).
// attn::PagedKVCache has the form over a cache (paged_kv_cache.hpp).
template <class KV>
  requires AttentionTypes<float, KV>
SparseAttentionResult<float> sparse_attention(TensorView<const float> q, TensorView<const int32_t> qo_indptr,
                                              TensorView<const KV> k_pages, TensorView<const KV> v_pages,
                                              TensorView<const int32_t> kv_indptr, TensorView<const int32_t> kv_indices,
                                              TensorView<const int32_t> kv_last_page_len,
                                              TensorView<const int32_t> indices,
                                              const SparseAttentionOptions& options = {},
                                              PageLayout layout = PageLayout::NHD);

}  // namespace attn
