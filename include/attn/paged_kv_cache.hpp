// A paged key/value cache for serving many sequences at once (vLLM's
// PagedAttention, FlashInfer's paged KV cache): one pool of num_pages pages
// of page_size tokens, for keys and for values, each token holding
// kv_heads × head_dim (value_head_dim for values). A sequence holds a list
// of pages; its last page may be partly filled. Sequences share pages by
// reference count (fork: a shared prefix, beam search, parallel sampling),
// and a shared partial last page is copied when either sequence next
// appends. Keys are stored as given (rotated, as in KVCache: the layer
// rotates them before appending).
//
// int4 (KIVI, attn/quantize.hpp) stores values per token and keys per
// channel in groups of 32 tokens: a page of page_size tokens (a multiple of
// 32) holds page_size / 32 groups of keys. As in KVCache, each sequence's
// last partial group is also kept in float32 (its key tail) and its blocks
// are quantized again at each append, so a sequence's keys are always
// quantize_int4_keys of every key it holds.
//
// Threading: any number of concurrent readers (length, positions,
// page_table, pages, batch attention over the cache) or one writer
// (add_sequence, append, fork, truncate, remove). A call that overlaps a
// writer, or a writer that overlaps any call, raises RuntimeError ("in use
// by another thread"), never a race.
//
// Every refused call (ValueError, KeyError for an unknown id, RuntimeError
// for too few free pages) leaves the cache exactly as it was.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <variant>
#include <vector>

#include "attn/batch_attention.hpp"
#include "attn/quantize.hpp"
#include "attn/sparse_attention.hpp"
#include "attn/tensor.hpp"

namespace attn {

// FlashInfer's page-table metadata of some sequences (int32).
struct PageTable {
  Tensor<int32_t> kv_indptr;         // (n + 1,)
  Tensor<int32_t> kv_indices;        // (kv_indptr[n],)
  Tensor<int32_t> kv_last_page_len;  // (n,): in [1, page_size]; 0 for an empty sequence
};

namespace detail {

// Any number of readers or one writer; an overlap with a writer throws.
class ReadersOrWriter {
 public:
  ReadersOrWriter() = default;
  ReadersOrWriter(const ReadersOrWriter&) {}
  ReadersOrWriter& operator=(const ReadersOrWriter&) { return *this; }

  class Hold {
   public:
    Hold(const ReadersOrWriter& rw, bool writer) : rw_(&rw), writer_(writer) {}
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    ~Hold() { rw_->state_.fetch_add(writer_ ? 1 : -1, std::memory_order_release); }

   private:
    const ReadersOrWriter* rw_;
    bool writer_;
  };
  // RuntimeError naming `who` on an overlap.
  [[nodiscard]] Hold read(const char* who) const;
  [[nodiscard]] Hold write(const char* who) const;

 private:
  mutable std::atomic<int64_t> state_{0};  // readers inside; -1: a writer
};

}  // namespace detail

class PagedKVCache {
 public:
  // ValueError for a size below 1 (num_pages, page_size, kv_heads) or below
  // 0 (the head dims), a q8_0, q4_0 or int4 head dim that is not a multiple
  // of 32, or an int4 page_size that is not.
  PagedKVCache(int64_t num_pages, int64_t page_size, int64_t kv_heads, int64_t head_dim,
               std::optional<int64_t> value_head_dim = {}, KVDtype dtype = KVDtype::F32,
               PageLayout layout = PageLayout::NHD);

  // MLA's latent cache in pages (vLLM's MLA cache: head dim 576 and one KV
  // head in DeepSeek-V3): each token's row [c | k_pe] of kv_lora_rank +
  // rope_dim values is its key, and the row's first kv_lora_rank columns
  // its value, read in place: there is no value pool, and append takes no v
  // (an empty view). F32, BF16 and F16 store whole rows; Q8_0 stores c as
  // q8_0 blocks and k_pe in bfloat16 (LatentCache's layout, FlashMLA's
  // idea), rows of two types that attention reads through latent_rows' float32
  // copy: read_pools, run, the pools and batch_attention refuse them
  // (TypeError). ValueError for a kv_lora_rank below 1, a rope_dim below 0,
  // q8_0 with a kv_lora_rank that is not a multiple of 32, q4_0 or int4.
  static PagedKVCache latent(int64_t num_pages, int64_t page_size, int64_t kv_lora_rank, int64_t rope_dim,
                             KVDtype dtype = KVDtype::F32);
  // A latent cache's kv_lora_rank; 0 for a cache of keys and values apart.
  int64_t latent_rank() const { return latent_rank_; }
  // A latent cache's rows of seq as float32, (length, head_dim): as stored
  // (rounded or quantised), widened. ValueError for a cache of keys and
  // values apart.
  Tensor<float> latent_rows(int64_t seq) const;

  int64_t num_pages() const { return num_pages_; }
  int64_t page_size() const { return page_size_; }
  int64_t kv_heads() const { return kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t value_head_dim() const { return value_head_dim_; }
  KVDtype dtype() const { return dtype_; }
  PageLayout layout() const { return layout_; }

  // A new, empty sequence's id.
  int64_t add_sequence();
  // Frees the pages no other sequence uses.
  void remove(int64_t seq);
  // Appends to each seq_ids[i] the tokens append_indptr[i] .. append_indptr[i
  // + 1] of k (nnz, kv_heads, head_dim) and v (nnz, kv_heads,
  // value_head_dim), any strides; distinct ids (a latent cache: its rows as
  // k (nnz, 1, head_dim), v an empty view). RuntimeError naming the pages
  // needed and free when the pool is short.
  void append(const std::vector<int64_t>& seq_ids, TensorView<const float> k, TensorView<const float> v,
              TensorView<const int64_t> append_indptr);
  // A new sequence holding seq's tokens, sharing its pages.
  int64_t fork(int64_t seq);
  // Keeps the first `length` tokens (0 <= length <= length(seq)). int4:
  // the group `length` ends inside becomes the key tail, its keys taken from
  // the float32 tail when it was the last group already, else as its blocks
  // hold them (a full group's float32 keys are not kept), and its blocks are
  // quantized again from them; RuntimeError when that group's page is shared
  // and no page is free for its copy.
  void truncate(int64_t seq, int64_t length);

  int64_t length(int64_t seq) const;
  // The positions of seq's tokens: 0 .. length - 1 (a fork continues its
  // parent's; after truncate(seq, n), 0 .. n - 1).
  std::vector<int64_t> positions(int64_t seq) const;
  // The live sequences' ids, ascending.
  std::vector<int64_t> sequences() const;
  // Distinct pages the live sequences reference, and pages free.
  int64_t pages_in_use() const;
  int64_t free_pages() const;
  // pages_in_use() × the bytes of a page's keys and values, and an int4
  // cache's key tails (float32).
  int64_t nbytes() const;
  // The pages of seq, in order.
  std::vector<int32_t> pages_of(int64_t seq) const;

  // FlashInfer's metadata for these sequences, in this order.
  PageTable page_table(const std::vector<int64_t>& seq_ids) const;
  // The float32 pools, (num_pages, page_size, kv_heads, D) for NHD or
  // (num_pages, kv_heads, page_size, D) for HND; TypeError naming the dtype
  // for other storage. Valid while the cache lives; a writer changes them.
  // A latent cache's v_pages is the first kv_lora_rank columns of k_pages.
  TensorView<const float> k_pages() const;
  TensorView<const float> v_pages() const;

  // plan.run over the pools (as a reader): plan built from page_table()'s
  // metadata of the sequences the step attends.
  void run(const BatchAttentionPlan& plan, TensorView<const float> q, TensorView<float> out,
           TensorView<float> lse = {}) const;

  // f(k_pages, v_pages): the pools as views of their storage type (float,
  // bfloat16, float16, block_q8_0, block_q4_0 or block_int4, whose last axis
  // counts blocks; int4's keys (num_pages, page_size / 32, kv_heads,
  // head_dim) for NHD, (num_pages, kv_heads, page_size / 32, head_dim) for
  // HND), for the kernels over pages; as a reader, the views valid while f
  // runs.
  // A latent cache's value pool is the first kv_lora_rank columns of its
  // key pool (q8_0's two-type rows: TypeError).
  template <class F>
  decltype(auto) read_pools(const char* who, F&& f) const {
    const auto held = access_.read(who);
    return std::visit([&](const auto& k_pool) -> decltype(auto) {
      using S = std::remove_cvref_t<decltype(*k_pool.data())>;
      const TensorView<const S> k = k_pool.view();
      if (latent_rank_ == 0) return f(k, std::get<Tensor<S>>(v_).view());
      refuse_two_type_rows(who);
      return f(k, TensorView<const S>(k.data(), {k.dim(0), k.dim(1), k.dim(2), latent_rank_}, k.strides()));
    }, k_);
  }

  // The pools as bytes (pickling); restore puts back pools of the same
  // size and the sequences (each id's pages and length, and an int4
  // cache's key tails) with the next id. restore: ValueError naming what
  // does not fit, the cache then as before.
  struct Sequences {
    std::vector<int64_t> ids, lengths;
    std::vector<std::vector<int32_t>> pages;
    int64_t next_id = 0;
    // int4: each sequence's key tail, (length % 32, kv_heads, head_dim)
    // float32; none given to restore: the keys as their blocks hold them.
    std::vector<std::vector<float>> key_tails;
  };
  std::vector<uint8_t> k_bytes() const;
  std::vector<uint8_t> v_bytes() const;
  Sequences sequences_state() const;
  void restore(const std::vector<uint8_t>& k_bytes, const std::vector<uint8_t>& v_bytes, const Sequences& state);

 private:
  using Pool = std::variant<Tensor<float>, Tensor<bfloat16>, Tensor<float16>, Tensor<block_q8_0>, Tensor<block_q4_0>,
                            Tensor<block_int4>>;
  struct Sequence {
    std::vector<int32_t> pages;
    int64_t length = 0;
    std::vector<float> key_tail;  // int4: the last partial group's keys, (length % 32, kv_heads, head_dim)
  };
  const Sequence& find(int64_t seq, const char* who) const;
  int32_t take_page();
  void release(int32_t page);
  // Copies every slot of page `from` to page `to`, keys and values.
  void copy_page(int32_t from, int32_t to);
  int64_t bytes_per_page() const;
  // TypeError naming `who` for a q8_0 latent cache (whose rows are two types).
  void refuse_two_type_rows(const char* who) const;

  int64_t num_pages_, page_size_, kv_heads_, head_dim_, value_head_dim_;
  KVDtype dtype_;
  PageLayout layout_;
  // Keys and values; a latent cache's rows in k_ and v_ empty, or for q8_0
  // its c blocks in k_ and its bfloat16 k_pe in v_.
  Pool k_, v_;
  int64_t latent_rank_ = 0;
  std::map<int64_t, Sequence> sequences_;
  std::vector<int32_t> refs_;       // per page: the sequences holding it
  std::vector<int32_t> free_list_;  // free pages, the next to take last
  int64_t next_id_ = 0;
  detail::ReadersOrWriter access_;
};

// batch_attention over a paged cache: request r is sequence seq_ids[r],
// whose queries are rows qo_indptr[r] .. qo_indptr[r + 1] of q (nnz_q,
// num_qo_heads, head_dim).
BatchAttentionResult batch_attention(TensorView<const float> q, TensorView<const int32_t> qo_indptr,
                                     const PagedKVCache& cache, const std::vector<int64_t>& seq_ids,
                                     const BatchAttentionOptions& options = {}, bool return_lse = false);

// sparse_attention over a paged cache (DeepSeek Sparse Attention at
// serving): request r is sequence seq_ids[r], whose queries are rows
// qo_indptr[r] .. qo_indptr[r + 1] of q (nnz_q, num_qo_heads, head_dim) and
// whose indices (nnz_q, kv_heads or 1, topk) name positions in that
// sequence; the pools' form (sparse_attention.hpp) over its pages. An
// int4 cache: TypeError (sparse_attention reads keys token by token).
SparseAttentionResult<float> sparse_attention(TensorView<const float> q, TensorView<const int32_t> qo_indptr,
                                              const PagedKVCache& cache, const std::vector<int64_t>& seq_ids,
                                              TensorView<const int32_t> indices,
                                              const SparseAttentionOptions& options = {});

}  // namespace attn
