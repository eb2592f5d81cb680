// Internal to the api room: what the functions over paged keys and values
// (batch_attention, the paged sparse_attention) share: FlashInfer's
// page-table metadata validated, and a pool's pages seen as a problem's
// K or V operand.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "attention_problem.hpp"
#include "attn/batch_attention.hpp"

namespace attn::detail {

// A 1-D int32 argument's values; an indptr from 0, non-decreasing, of
// `entries` entries (ValueError "<who>: ..." naming it).
std::vector<int32_t> int32s(const std::string& who, TensorView<const int32_t> t, const char* name);
void check_indptr(const std::string& who, const std::vector<int32_t>& indptr, const char* name, size_t entries,
                  const char* entries_of);

// qo_indptr, kv_indptr, kv_indices and kv_last_page_len checked (ValueError
// "<who>: ..." naming the argument), and each request's key count.
struct PagedRequests {
  std::vector<int32_t> qo_indptr, kv_indptr, kv_indices;
  std::vector<int64_t> kv_len;
  int32_t max_page = -1;  // the largest page number named; -1: none

  PagedRequests(const std::string& who, TensorView<const int32_t> qo_indptr, TensorView<const int32_t> kv_indptr,
                TensorView<const int32_t> kv_indices, TensorView<const int32_t> kv_last_page_len, int64_t page_size);

  int64_t batch_size() const { return static_cast<int64_t>(kv_len.size()); }
  int64_t qo_len(int64_t r) const { return qo_indptr[r + 1] - qo_indptr[r]; }
  int64_t nnz_q() const { return qo_indptr.back(); }
  const int32_t* pages_of(int64_t r) const { return kv_indices.data() + kv_indptr[r]; }
};

// A pool's shape for `heads` heads of D columns (a block type's last axis
// counts blocks: compare core::logical_shape).
Shape pool_shape(PageLayout layout, int64_t pages, int64_t page_size, int64_t heads, int64_t d);

// A pool's view of request pages as the problem's K or V operand (a page
// (page_size, heads, D) for NHD, (heads, page_size, D) for HND).
template <class KV>
core::Operand<const KV> paged_operand(const TensorView<const KV>& pool, PageLayout layout, const int32_t* pages,
                                      int64_t page_size) {
  core::Operand<const KV> o;
  o.data = pool.data();
  o.batch_offset = {0};
  o.head_stride = pool.stride(layout == PageLayout::NHD ? 2 : 1);
  o.row_stride = pool.stride(layout == PageLayout::NHD ? 1 : 2);
  o.col_stride = pool.stride(3);
  o.pages = pages;
  o.page_size = page_size;
  o.page_stride = pool.stride(0);
  return o;
}

// The same as bytes (stored K and V: core::AttentionProblem::k_stored).
template <class KV>
core::Operand<const std::byte> as_bytes(const core::Operand<const KV>& o) {
  constexpr auto size = static_cast<int64_t>(sizeof(KV));
  core::Operand<const std::byte> b;
  b.data = reinterpret_cast<const std::byte*>(o.data);
  b.batch_offset = {0};
  b.head_stride = o.head_stride * size;
  b.row_stride = o.row_stride * size;
  b.col_stride = o.col_stride * size;
  b.pages = o.pages;
  b.page_size = o.page_size;
  b.page_stride = o.page_stride * size;
  return b;
}

// Rows [begin, begin + n) of a packed (total, heads, width) view as (heads, n, width).
template <class T>
TensorView<T> rows_of(TensorView<T> x, int64_t begin, int64_t n) {
  return TensorView<T>(x.data() + begin * x.stride(0), {x.dim(1), n, x.dim(2)},
                       {x.stride(1), x.stride(0), x.stride(2)});
}

}  // namespace attn::detail
