// The page-table metadata of a batch of requests, validated once for
// batch_attention and the paged sparse_attention.
#include "api/paged_requests.hpp"

#include <algorithm>

namespace attn::detail {

std::vector<int32_t> int32s(const std::string& who, TensorView<const int32_t> t, const char* name) {
  if (t.rank() != 1) throw ValueError(who + ": " + name + " must be 1-D, got shape " + shape_str(t.shape()));
  std::vector<int32_t> out(static_cast<size_t>(t.dim(0)));
  for (int64_t i = 0; i < t.dim(0); ++i) out[static_cast<size_t>(i)] = t.at({i});
  return out;
}

void check_indptr(const std::string& who, const std::vector<int32_t>& indptr, const char* name, size_t entries,
                  const char* entries_of) {
  const auto fail = [&](const std::string& msg) { throw ValueError(who + ": " + name + msg); };
  if (indptr.size() != entries)
    fail(" must have " + std::to_string(entries) + " entries (" + entries_of + "), got " + std::to_string(indptr.size()));
  if (indptr.empty() || indptr[0] != 0)
    fail("[0] must be 0, got " + (indptr.empty() ? std::string("no entry") : std::to_string(indptr[0])));
  for (size_t i = 1; i < indptr.size(); ++i)
    if (indptr[i] < indptr[i - 1])
      fail(" must not decrease, got " + std::to_string(indptr[i - 1]) + " then " + std::to_string(indptr[i]) +
           " at " + std::to_string(i));
}

PagedRequests::PagedRequests(const std::string& who, TensorView<const int32_t> qo, TensorView<const int32_t> kv,
                             TensorView<const int32_t> indices, TensorView<const int32_t> last_page_len,
                             int64_t page_size)
    : qo_indptr(int32s(who, qo, "qo_indptr")), kv_indptr(int32s(who, kv, "kv_indptr")),
      kv_indices(int32s(who, indices, "kv_indices")) {
  const auto fail = [&](const std::string& msg) { throw ValueError(who + ": " + msg); };
  if (page_size < 1) fail("page_size must be >= 1, got " + std::to_string(page_size));
  if (qo_indptr.empty()) fail("qo_indptr must have batch + 1 >= 1 entries, got none");
  check_indptr(who, qo_indptr, "qo_indptr", qo_indptr.size(), "batch + 1");
  const size_t batch = qo_indptr.size() - 1;
  check_indptr(who, kv_indptr, "kv_indptr", batch + 1, "batch + 1, as qo_indptr");
  if (static_cast<size_t>(kv_indptr.back()) != kv_indices.size())
    fail("kv_indptr must end at kv_indices' length " + std::to_string(kv_indices.size()) + ", got " +
         std::to_string(kv_indptr.back()));
  for (size_t i = 0; i < kv_indices.size(); ++i) {
    if (kv_indices[i] < 0)
      fail("kv_indices must be page numbers >= 0, got " + std::to_string(kv_indices[i]) + " at " + std::to_string(i));
    max_page = std::max(max_page, kv_indices[i]);
  }
  const std::vector<int32_t> last = int32s(who, last_page_len, "kv_last_page_len");
  if (last.size() != batch)
    fail("kv_last_page_len must have one entry per request (" + std::to_string(batch) + "), got " +
         std::to_string(last.size()));
  for (size_t r = 0; r < batch; ++r) {
    const int64_t pages = kv_indptr[r + 1] - kv_indptr[r];
    const bool ok = pages == 0 ? last[r] == 0 : last[r] >= 1 && last[r] <= page_size;
    if (!ok)
      fail("kv_last_page_len[" + std::to_string(r) + "] must be " +
           (pages == 0 ? std::string("0 for a request with no page")
                       : "in [1, page_size = " + std::to_string(page_size) + "]") +
           ", got " + std::to_string(last[r]));
    kv_len.push_back(pages == 0 ? 0 : (pages - 1) * page_size + last[r]);
  }
}

Shape pool_shape(PageLayout layout, int64_t pages, int64_t page_size, int64_t heads, int64_t d) {
  return layout == PageLayout::NHD ? Shape{pages, page_size, heads, d} : Shape{pages, heads, page_size, d};
}

}  // namespace attn::detail
