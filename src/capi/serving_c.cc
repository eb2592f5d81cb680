// The C API's serving part (attn/attn.h): PagedKVCache and
// BatchAttentionPlan behind opaque handles.
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "attn/attn.h"
#include "attn/batch_attention.hpp"
#include "attn/paged_kv_cache.hpp"
#include "capi/c_views.hpp"

struct attn_paged_cache {
  attn::PagedKVCache cache;
};
struct attn_batch_plan {
  attn::BatchAttentionPlan plan;
  attn::PageLayout layout;  // (where INT4 key pools count their keys)
};

namespace {

using namespace attn::detail::capi;

attn::PageLayout layout_arg(int32_t layout, const char* fn) {
  if (layout != 0 && layout != 1) fail(fn, "layout", std::to_string(layout) + " is not 0 (NHD) or 1 (HND)");
  return layout == 0 ? attn::PageLayout::NHD : attn::PageLayout::HND;
}

// attn_options as a batch's options: causal 0 or 1 only, and the mask.
attn::BatchAttentionOptions batch_options(const attn_options* options, const attn_tensor* custom_mask,
                                          const char* fn) {
  const attn::AttentionOptions a = options_of(options, fn);
  if (a.causal != attn::Causal::None && a.causal != attn::Causal::BottomRight)
    fail(fn, "options", "causal must be 0 (none) or 1 (bottom-right per request)");
  attn::BatchAttentionOptions o;
  o.causal = a.causal == attn::Causal::BottomRight;
  o.window = a.window, o.softcap = a.softcap, o.scale = a.scale;
  o.alibi_slopes = a.alibi_slopes, o.sinks = a.sinks, o.precision = a.precision;
  if (custom_mask) {
    const Layout l = layout_of(custom_mask, fn, "custom_mask");
    if (l.dtype != ATTN_BOOL) unsupported(fn, std::string("custom_mask: dtype ") + dtype_name(l.dtype) + " is not BOOL");
    o.custom_mask = view_of<const bool>(custom_mask, l);
  }
  return o;
}

TensorView<const int32_t> ints(const int32_t* p, int64_t n, const char* fn, const char* name) {
  if (n < 0) fail(fn, name, "length " + std::to_string(n) + " is negative");
  if (n > 0) require(p, fn, name);
  return TensorView<const int32_t>(p ? p : reinterpret_cast<const int32_t*>(no_elements), {n});
}

// out and lse as F32 views (lse: none for NULL).
TensorView<float> f32_out(attn_tensor* t, const char* fn, const char* name) {
  if (!t) return {};
  const Layout l = layout_of(t, fn, name);
  if (l.dtype != ATTN_F32) unsupported(fn, std::string(name) + ": dtype " + dtype_name(l.dtype) + " is not F32");
  return view_of<float>(t, l);
}
TensorView<const float> f32_in(const attn_tensor* t, const char* fn, const char* name) {
  const Layout l = layout_of(t, fn, name);
  if (l.dtype != ATTN_F32) unsupported(fn, std::string(name) + ": dtype " + dtype_name(l.dtype) + " is not F32");
  return view_of<const float>(t, l);
}

}  // namespace

extern "C" {

int attn_paged_cache_new(int64_t num_pages, int64_t page_size, int64_t kv_heads, int64_t head_dim,
                         int64_t value_head_dim, attn_dtype dtype, int32_t layout, attn_paged_cache** cache) {
  constexpr const char* fn = "attn_paged_cache_new";
  return guarded([&] {
    require(cache, fn, "cache");
    *cache = nullptr;
    *cache = new attn_paged_cache{attn::PagedKVCache(num_pages, page_size, kv_heads, head_dim,
                                                     value_head_dim == 0 ? std::optional<int64_t>() : value_head_dim,
                                                     cache_dtype(dtype, fn), layout_arg(layout, fn))};
  });
}

int attn_paged_cache_add_sequence(attn_paged_cache* cache, int64_t* seq) {
  return guarded([&] {
    require(cache, "attn_paged_cache_add_sequence", "cache");
    require(seq, "attn_paged_cache_add_sequence", "seq");
    *seq = cache->cache.add_sequence();
  });
}

int attn_paged_cache_remove(attn_paged_cache* cache, int64_t seq) {
  return guarded([&] {
    require(cache, "attn_paged_cache_remove", "cache");
    cache->cache.remove(seq);
  });
}

int attn_paged_cache_fork(attn_paged_cache* cache, int64_t seq, int64_t* child) {
  return guarded([&] {
    require(cache, "attn_paged_cache_fork", "cache");
    require(child, "attn_paged_cache_fork", "child");
    *child = cache->cache.fork(seq);
  });
}

int attn_paged_cache_truncate(attn_paged_cache* cache, int64_t seq, int64_t length) {
  return guarded([&] {
    require(cache, "attn_paged_cache_truncate", "cache");
    cache->cache.truncate(seq, length);
  });
}

int attn_paged_cache_append(attn_paged_cache* cache, const int64_t* seq_ids, int64_t num_seqs,
                            const attn_tensor* k, const attn_tensor* v, const int64_t* append_indptr) {
  constexpr const char* fn = "attn_paged_cache_append";
  return guarded([&] {
    require(cache, fn, "cache");
    if (num_seqs < 0) fail(fn, "num_seqs", std::to_string(num_seqs) + " is negative");
    if (num_seqs > 0) require(seq_ids, fn, "seq_ids");
    require(append_indptr, fn, "append_indptr");
    const std::vector<int64_t> ids(seq_ids, seq_ids + num_seqs);
    cache->cache.append(ids, f32_in(k, fn, "k"), v ? f32_in(v, fn, "v") : TensorView<const float>(),
                        TensorView<const int64_t>(append_indptr, {num_seqs + 1}));
  });
}

int attn_paged_cache_length(const attn_paged_cache* cache, int64_t seq, int64_t* length) {
  return guarded([&] {
    require(cache, "attn_paged_cache_length", "cache");
    require(length, "attn_paged_cache_length", "length");
    *length = cache->cache.length(seq);
  });
}

int attn_paged_cache_pages_in_use(const attn_paged_cache* cache, int64_t* pages) {
  return guarded([&] {
    require(cache, "attn_paged_cache_pages_in_use", "cache");
    require(pages, "attn_paged_cache_pages_in_use", "pages");
    *pages = cache->cache.pages_in_use();
  });
}

int attn_paged_cache_page_table(const attn_paged_cache* cache, const int64_t* seq_ids, int64_t num_seqs,
                                int32_t* kv_indptr, int32_t* kv_indices, int64_t capacity,
                                int32_t* kv_last_page_len, int64_t* count) {
  constexpr const char* fn = "attn_paged_cache_page_table";
  return guarded([&] {
    require(cache, fn, "cache");
    require(kv_indptr, fn, "kv_indptr");
    require(count, fn, "count");
    if (num_seqs < 0) fail(fn, "num_seqs", std::to_string(num_seqs) + " is negative");
    if (num_seqs > 0) require(seq_ids, fn, "seq_ids"), require(kv_last_page_len, fn, "kv_last_page_len");
    const attn::PageTable t = cache->cache.page_table(std::vector<int64_t>(seq_ids, seq_ids + num_seqs));
    *count = t.kv_indices.numel();
    if (*count > capacity)
      fail(fn, "kv_indices", "needs " + std::to_string(*count) + " entries, capacity is " + std::to_string(capacity));
    if (*count > 0) require(kv_indices, fn, "kv_indices");
    std::copy(t.kv_indptr.data(), t.kv_indptr.data() + num_seqs + 1, kv_indptr);
    std::copy(t.kv_indices.data(), t.kv_indices.data() + *count, kv_indices);
    std::copy(t.kv_last_page_len.data(), t.kv_last_page_len.data() + num_seqs, kv_last_page_len);
  });
}

void attn_paged_cache_free(attn_paged_cache* cache) { delete cache; }

int attn_batch_plan_new(const int32_t* qo_indptr, const int32_t* kv_indptr, const int32_t* kv_indices,
                        const int32_t* kv_last_page_len, int64_t batch, int64_t num_qo_heads,
                        int64_t num_kv_heads, int64_t head_dim, int64_t value_head_dim, int64_t page_size,
                        int32_t layout, const attn_options* options, const attn_tensor* custom_mask,
                        attn_batch_plan** plan) {
  constexpr const char* fn = "attn_batch_plan_new";
  return guarded([&] {
    require(plan, fn, "plan");
    *plan = nullptr;
    require(kv_indptr, fn, "kv_indptr");
    const auto indptr = ints(kv_indptr, batch + 1, fn, "kv_indptr");
    *plan = new attn_batch_plan{attn::BatchAttentionPlan(
        ints(qo_indptr, batch + 1, fn, "qo_indptr"), indptr, ints(kv_indices, batch >= 0 ? kv_indptr[batch] : 0, fn, "kv_indices"),
        ints(kv_last_page_len, batch, fn, "kv_last_page_len"), num_qo_heads, num_kv_heads, head_dim, page_size,
        batch_options(options, custom_mask, fn), value_head_dim == 0 ? std::optional<int64_t>() : value_head_dim,
        layout_arg(layout, fn)), layout_arg(layout, fn)};
  });
}

int attn_batch_plan_run(const attn_batch_plan* plan, const attn_tensor* q, const attn_tensor* k_pages,
                        const attn_tensor* v_pages, attn_tensor* out, attn_tensor* lse) {
  constexpr const char* fn = "attn_batch_plan_run";
  return guarded([&] {
    require(plan, fn, "plan");
    // (INT4 keys: the logical pool, its page axis stored in groups of 32 keys.)
    const Layout lk = layout_of(k_pages, fn, "k_pages", plan->layout == attn::PageLayout::NHD ? 1 : -2),
                 lv = layout_of(v_pages, fn, "v_pages");
    if (lk.dtype != lv.dtype)
      unsupported(fn, std::string("k_pages and v_pages must be stored alike, got ") + dtype_name(lk.dtype) + " and " +
                          dtype_name(lv.dtype));
    const auto run = [&](auto zero) {
      using KV = decltype(zero);
      plan->plan.run<KV>(f32_in(q, fn, "q"), view_of<const KV>(k_pages, lk), view_of<const KV>(v_pages, lv),
                         f32_out(out, fn, "out"), f32_out(lse, fn, "lse"));
    };
    switch (lk.dtype) {
      case ATTN_F32: return run(float{});
      case ATTN_BF16: return run(attn::bfloat16{});
      case ATTN_F16: return run(attn::float16{});
      case ATTN_Q8_0: return run(attn::block_q8_0{});
      case ATTN_Q4_0: return run(attn::block_q4_0{});
      case ATTN_INT4: return run(attn::block_int4{});
      default:
        unsupported(fn, std::string("k_pages: dtype ") + dtype_name(lk.dtype) +
                            " is not F32, BF16, F16, Q8_0, Q4_0 or INT4");
    }
  });
}

int attn_batch_plan_run_cache(const attn_batch_plan* plan, const attn_tensor* q, const attn_paged_cache* cache,
                              attn_tensor* out, attn_tensor* lse) {
  constexpr const char* fn = "attn_batch_plan_run_cache";
  return guarded([&] {
    require(plan, fn, "plan");
    require(cache, fn, "cache");
    require(out, fn, "out");
    cache->cache.run(plan->plan, f32_in(q, fn, "q"), f32_out(out, fn, "out"), f32_out(lse, fn, "lse"));
  });
}

void attn_batch_plan_free(attn_batch_plan* plan) { delete plan; }

int attn_batch_attention(const attn_tensor* q, const int32_t* qo_indptr, int64_t batch,
                         const attn_paged_cache* cache, const int64_t* seq_ids, const attn_options* options,
                         const attn_tensor* custom_mask, attn_tensor* out, attn_tensor* lse) {
  constexpr const char* fn = "attn_batch_attention";
  return guarded([&] {
    require(cache, fn, "cache");
    require(out, fn, "out");
    if (batch < 0) fail(fn, "batch", std::to_string(batch) + " is negative");
    if (batch > 0) require(seq_ids, fn, "seq_ids");
    const TensorView<const float> qv = f32_in(q, fn, "q");
    if (qv.rank() != 3) fail(fn, "q", "must be (nnz_q, num_qo_heads, head_dim), got " + attn::shape_str(qv.shape()));
    const attn::PagedKVCache& c = cache->cache;
    const auto q_indptr = ints(qo_indptr, batch + 1, fn, "qo_indptr");
    const attn::BatchAttentionOptions o = batch_options(options, custom_mask, fn);
    // The page table and the pools under one read: no writer between them.
    c.read_pools(fn, [&](auto k, auto v) {
      const attn::PageTable t = c.page_table(std::vector<int64_t>(seq_ids, seq_ids + batch));
      const attn::BatchAttentionPlan plan(q_indptr, t.kv_indptr.view(), t.kv_indices.view(),
                                          t.kv_last_page_len.view(), qv.dim(1), c.kv_heads(), c.head_dim(),
                                          c.page_size(), o, c.value_head_dim(), c.layout());
      plan.run(qv, k, v, f32_out(out, fn, "out"), f32_out(lse, fn, "lse"));
    });
  });
}

int attn_mla_paged_cache_new(const attn_mla* layer, int64_t num_pages, int64_t page_size, attn_dtype dtype,
                             attn_paged_cache** cache) {
  constexpr const char* fn = "attn_mla_paged_cache_new";
  return guarded([&] {
    require(layer, fn, "layer");
    require(cache, fn, "cache");
    *cache = nullptr;
    *cache = new attn_paged_cache{layer->layer.new_paged_cache(num_pages, page_size, cache_dtype(dtype, fn))};
  });
}

int attn_mla_forward_paged(attn_mla* layer, const attn_tensor* x, attn_paged_cache* cache, const int64_t* seq_ids,
                           int64_t num_seqs, const int64_t* cu_seqlens, attn_tensor* out) {
  constexpr const char* fn = "attn_mla_forward_paged";
  return guarded([&] {
    require(layer, fn, "layer");
    require(cache, fn, "cache");
    require(cu_seqlens, fn, "cu_seqlens");
    if (num_seqs < 0) fail(fn, "num_seqs", std::to_string(num_seqs) + " is negative");
    if (num_seqs > 0) require(seq_ids, fn, "seq_ids");
    const TensorView<const float> input = f32_in(x, fn, "x");
    const Layout lo = layout_of(out, fn, "out");
    if (lo.dtype != ATTN_F32) unsupported(fn, std::string("out dtype ") + dtype_name(lo.dtype) + " is not supported: F32");
    const TensorView<float> o = view_of<float>(out, lo);
    // Checked before the forward, so that a refused call leaves the cache as it was.
    if (o.shape() != input.shape())
      fail(fn, "out", "shape " + attn::shape_str(o.shape()) + " is not x's shape " + attn::shape_str(input.shape()));
    attn::check_outputs(fn, {{"out", attn::MemorySpan::of(o)}}, {{"x", attn::MemorySpan::of(input)}});
    const std::vector<int64_t> ids(seq_ids, seq_ids + num_seqs);
    attn::copy<float>(
        layer->layer.forward(input, cache->cache, ids, TensorView<const int64_t>(cu_seqlens, {num_seqs + 1})).view(), o);
  });
}

}  // extern "C"
