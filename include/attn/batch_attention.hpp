// Batch attention over paged keys and values: one call for many requests of
// different lengths, each reading its keys and values from pages of a
// shared pool through a page table (FlashInfer's BatchPrefillWithPagedKV-
// CacheWrapper, vLLM's PagedAttention). The metadata is FlashInfer's, int32:
//   qo_indptr (batch + 1,)        request r's queries are rows
//                                 [qo_indptr[r], qo_indptr[r + 1]) of q
//   kv_indptr (batch + 1,)        its pages are kv_indices[kv_indptr[r] ..
//                                 kv_indptr[r + 1])
//   kv_indices (kv_indptr[-1],)   page numbers into the pool, any order
//   kv_last_page_len (batch,)     tokens in its last page: in [1, page_size],
//                                 0 for a request with no page
// so request r holds kv_len = (pages − 1) · page_size + last_page_len keys,
// in page-table order. Its queries are its last qo_len positions: query i
// sits at p = i + kv_len − qo_len, causal is bottom-right, and windows and
// ALiBi measure from p, as attention() does with a cache.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attn/attention.hpp"
#include "attn/quantize.hpp"
#include "attn/tensor.hpp"

namespace attn {

// How a page holds its tokens: NHD (page_size, kv_heads, D), FlashInfer's
// default, or HND (kv_heads, page_size, D). A pool is (num_pages, ...).
enum class PageLayout { NHD, HND };
// Parses "NHD" or "HND"; ValueError naming both otherwise.
PageLayout parse_page_layout(const std::string& name);
std::string page_layout_name(PageLayout layout);

// The options of attention() per request, and custom masks.
struct BatchAttentionOptions {
  bool causal = false;           // bottom-right per request
  Window window;                 // attn's (left, right), from p
  double softcap = 0;
  std::optional<double> scale;   // default 1/sqrt(head_dim)
  std::vector<double> alibi_slopes;  // one per query head, or none
  std::vector<double> sinks;         // one logit per query head, or none
  // attention()'s (docs/semantics.md "Precision"): bf16 and int8 for the
  // prefill-sized requests' products; int8 also for decode over q8_0 pages
  // (Q·K in integers, the queries rounded to q8_0).
  Precision precision = Precision::Float32;
  // Custom masks, true = may attend (tree masks of speculative decoding):
  // every request's (qo_len, kv_len) block, row-major, concatenated
  // (custom_mask); or packed bits, FlashInfer's packed_custom_mask: each
  // block as np.packbits(block.ravel(), bitorder="little"), padded to whole
  // bytes, mask_indptr (batch + 1,) its offsets in bytes. At most one of
  // the two; the plan copies it.
  TensorView<const bool> custom_mask;
  TensorView<const uint8_t> packed_custom_mask;
  TensorView<const int32_t> mask_indptr;
};

// The metadata of one batch, validated once, and its work partition: every
// layer of a model step runs the same plan (FlashInfer's plan/run split).
// run() is bitwise the one-shot batch_attention's, for any thread count.
//
// Requests of at most a few queries (decode, draft verification) read
// their pages in place, split into fixed chunks of keys that all threads
// share and that merge in a fixed order; each chunk reads its keys and
// values once for every query row and every query head of a GQA group.
// Longer requests (prefill) run the prefill kernel's tiles, packed from
// their pages in place as attention() packs them from one array: the same
// output, bit for bit.
class BatchAttentionPlan {
 public:
  // ValueError naming the argument: qo_indptr, kv_indptr, kv_indices or
  // kv_last_page_len (not starting at 0, decreasing, lengths that disagree,
  // a page number below 0, a last page length out of range), the head
  // counts, the options or the masks.
  BatchAttentionPlan(TensorView<const int32_t> qo_indptr, TensorView<const int32_t> kv_indptr,
                     TensorView<const int32_t> kv_indices, TensorView<const int32_t> kv_last_page_len,
                     int64_t num_qo_heads, int64_t num_kv_heads, int64_t head_dim, int64_t page_size,
                     const BatchAttentionOptions& options = {}, std::optional<int64_t> value_head_dim = {},
                     PageLayout layout = PageLayout::NHD);

  // q (nnz_q, num_qo_heads, head_dim); k_pages and v_pages the pools,
  // (num_pages, page_size, num_kv_heads, D) for NHD or (num_pages,
  // num_kv_heads, page_size, D) for HND, D = head_dim for K and
  // value_head_dim for V, of float32, bfloat16, float16, or q8_0, q4_0 or
  // int4 blocks (a block pool's last axis counts blocks); any strides. int4
  // (KIVI's, attn/quantize.hpp) holds keys per channel in groups of 32
  // tokens, page_size / 32 groups a page (page_size a multiple of 32):
  // k_pages (num_pages, page_size / 32, num_kv_heads, head_dim) blocks for
  // NHD, (num_pages, num_kv_heads, page_size / 32, head_dim) for HND; a
  // request's last partial group holds its last keys. Writes out (nnz_q,
  // num_qo_heads, value_head_dim) and, unless an empty view, lse (nnz_q,
  // num_qo_heads): the natural log of each row's softmax denominator,
  // FlashInfer's layout (its lse is base 2: lse / ln 2). A row with no
  // allowed key gives zeros and lse −∞ (the sink's logit with sinks).
  template <class KV>
    requires ForwardTypes<float, KV>
  void run(TensorView<const float> q, TensorView<const KV> k_pages, TensorView<const KV> v_pages,
           TensorView<float> out, TensorView<float> lse = {}) const;

  int64_t batch_size() const { return static_cast<int64_t>(kv_len_.size()); }
  int64_t qo_len(int64_t r) const { return qo_indptr_[r + 1] - qo_indptr_[r]; }
  int64_t kv_len(int64_t r) const { return kv_len_[static_cast<size_t>(r)]; }
  int64_t nnz_q() const { return qo_indptr_.back(); }
  Shape output_shape() const { return {nnz_q(), heads_q_, d_v_}; }
  Shape lse_shape() const { return {nnz_q(), heads_q_}; }

 private:
  std::vector<int32_t> qo_indptr_, kv_indptr_, kv_indices_;
  std::vector<int64_t> kv_len_, mask_offset_;  // mask_offset_: request r's block in mask_
  Tensor<bool> mask_;                          // the custom masks, unpacked; empty: none
  int64_t heads_q_, heads_kv_, d_, d_v_, page_size_;
  int32_t max_page_ = -1;
  PageLayout layout_;
  AttentionOptions options_;
};

// A float32 key pool (num_pages, page_size, num_kv_heads, head_dim) for NHD
// or (num_pages, num_kv_heads, page_size, head_dim) for HND, any strides, as
// int4 key pages: each page's groups of 32 slots quantized per channel
// (quantize_int4_keys), (num_pages, page_size / 32, num_kv_heads, head_dim)
// or (num_pages, num_kv_heads, page_size / 32, head_dim) blocks. Values are
// per token: quantize_int4_values of their pool. ValueError for a pool that
// is not 4-D, a page_size that is not a multiple of 32, or a value int4
// cannot hold (naming its page, head and channel).
Tensor<block_int4> quantize_int4_key_pages(TensorView<const float> k_pages, PageLayout layout = PageLayout::NHD);

// One call: the plan, run once. out (and lse when return_lse) allocated.
struct BatchAttentionResult {
  Tensor<float> out;  // (nnz_q, num_qo_heads, value_head_dim)
  Tensor<float> lse;  // (nnz_q, num_qo_heads) with return_lse; empty otherwise
};
template <class KV>
  requires ForwardTypes<float, KV>
BatchAttentionResult batch_attention(TensorView<const float> q, TensorView<const int32_t> qo_indptr,
                                     TensorView<const KV> k_pages, TensorView<const KV> v_pages,
                                     TensorView<const int32_t> kv_indptr, TensorView<const int32_t> kv_indices,
                                     TensorView<const int32_t> kv_last_page_len,
                                     const BatchAttentionOptions& options = {}, PageLayout layout = PageLayout::NHD,
                                     bool return_lse = false);

}  // namespace attn
