// BatchAttentionPlan and batch_attention: the page-table metadata validated
// once; per run, the decode-sized requests as one batch of the decode
// kernel over their pages in place, the others through AttentionPlan over a
// gathered copy of their pages.
#include "attn/batch_attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>

#include "api/prepared_attention.hpp"
#include "attention_problem.hpp"
#include "kernels/attention_kernel.hpp"

namespace attn {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw ValueError("batch_attention: " + msg); }

std::vector<int32_t> int32s(TensorView<const int32_t> t, const char* name) {
  if (t.rank() != 1) fail(std::string(name) + " must be 1-D, got shape " + shape_str(t.shape()));
  std::vector<int32_t> out(static_cast<size_t>(t.dim(0)));
  for (int64_t i = 0; i < t.dim(0); ++i) out[static_cast<size_t>(i)] = t.at({i});
  return out;
}

// indptr from 0, non-decreasing, of `entries` entries.
void check_indptr(const std::vector<int32_t>& indptr, const char* name, size_t entries, const char* entries_of) {
  if (indptr.size() != entries)
    fail(std::string(name) + " must have " + std::to_string(entries) + " entries (" + entries_of + "), got " +
         std::to_string(indptr.size()));
  if (indptr.empty() || indptr[0] != 0)
    fail(std::string(name) + "[0] must be 0, got " + (indptr.empty() ? "no entry" : std::to_string(indptr[0])));
  for (size_t i = 1; i < indptr.size(); ++i)
    if (indptr[i] < indptr[i - 1])
      fail(std::string(name) + " must not decrease, got " + std::to_string(indptr[i - 1]) + " then " +
           std::to_string(indptr[i]) + " at " + std::to_string(i));
}

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

// A request's keys or values gathered from its pages: (heads, kv_len, row).
template <class KV>
Tensor<KV> gather(const core::Operand<const KV>& pages, int64_t heads, int64_t n, int64_t row) {
  Tensor<KV> out({heads, n, row});
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t j = 0; j < n; ++j) {
      const KV* src = pages.row(0, h, j);
      KV* dst = out.data() + (h * n + j) * row;
      for (int64_t c = 0; c < row; ++c) dst[c] = src[c * pages.col_stride];
    }
  return out;
}

}  // namespace

PageLayout parse_page_layout(const std::string& name) {
  if (name == "NHD") return PageLayout::NHD;
  if (name == "HND") return PageLayout::HND;
  throw ValueError("layout must be 'NHD' or 'HND', got '" + name + "'");
}
std::string page_layout_name(PageLayout layout) { return layout == PageLayout::NHD ? "NHD" : "HND"; }

BatchAttentionPlan::BatchAttentionPlan(TensorView<const int32_t> qo_indptr, TensorView<const int32_t> kv_indptr,
                                       TensorView<const int32_t> kv_indices,
                                       TensorView<const int32_t> kv_last_page_len, int64_t num_qo_heads,
                                       int64_t num_kv_heads, int64_t head_dim, int64_t page_size,
                                       const BatchAttentionOptions& options, std::optional<int64_t> value_head_dim,
                                       PageLayout layout)
    : qo_indptr_(int32s(qo_indptr, "qo_indptr")),
      kv_indptr_(int32s(kv_indptr, "kv_indptr")),
      kv_indices_(int32s(kv_indices, "kv_indices")),
      heads_q_(num_qo_heads),
      heads_kv_(num_kv_heads),
      d_(head_dim),
      d_v_(value_head_dim.value_or(head_dim)),
      page_size_(page_size),
      layout_(layout) {
  if (page_size < 1) fail("page_size must be >= 1, got " + std::to_string(page_size));
  if (num_kv_heads < 1 || num_qo_heads < 1 || num_qo_heads % num_kv_heads != 0)
    fail("num_qo_heads must be a positive multiple of num_kv_heads, got " + std::to_string(num_qo_heads) +
         " and " + std::to_string(num_kv_heads));
  if (head_dim < 0 || d_v_ < 0)
    fail("head dims must be >= 0, got " + std::to_string(head_dim) + " and " + std::to_string(d_v_));
  if (qo_indptr_.empty()) fail("qo_indptr must have batch + 1 >= 1 entries, got none");
  check_indptr(qo_indptr_, "qo_indptr", qo_indptr_.size(), "batch + 1");
  const size_t batch = qo_indptr_.size() - 1;
  check_indptr(kv_indptr_, "kv_indptr", batch + 1, "batch + 1, as qo_indptr");
  if (static_cast<size_t>(kv_indptr_.back()) != kv_indices_.size())
    fail("kv_indptr must end at kv_indices' length " + std::to_string(kv_indices_.size()) + ", got " +
         std::to_string(kv_indptr_.back()));
  for (size_t i = 0; i < kv_indices_.size(); ++i) {
    if (kv_indices_[i] < 0)
      fail("kv_indices must be page numbers >= 0, got " + std::to_string(kv_indices_[i]) + " at " + std::to_string(i));
    max_page_ = std::max(max_page_, kv_indices_[i]);
  }
  const std::vector<int32_t> last = int32s(kv_last_page_len, "kv_last_page_len");
  if (last.size() != batch)
    fail("kv_last_page_len must have one entry per request (" + std::to_string(batch) + "), got " +
         std::to_string(last.size()));
  for (size_t r = 0; r < batch; ++r) {
    const int64_t pages = kv_indptr_[r + 1] - kv_indptr_[r];
    const bool ok = pages == 0 ? last[r] == 0 : last[r] >= 1 && last[r] <= page_size;
    if (!ok)
      fail("kv_last_page_len[" + std::to_string(r) + "] must be " +
           (pages == 0 ? std::string("0 for a request with no page") : "in [1, page_size = " + std::to_string(page_size) + "]") +
           ", got " + std::to_string(last[r]));
    kv_len_.push_back(pages == 0 ? 0 : (pages - 1) * page_size + last[r]);
  }

  options_.causal = options.causal ? Causal::BottomRight : Causal::None;
  options_.window = options.window;
  options_.softcap = options.softcap;
  options_.scale = options.scale;
  options_.alibi_slopes = options.alibi_slopes;
  options_.sinks = options.sinks;
  detail::check_options(options_, heads_q_, true);

  // The custom masks, one (qo_len, kv_len) block per request.
  const bool dense = !options.custom_mask.empty_view(), packed = !options.packed_custom_mask.empty_view();
  if (dense && packed) fail("pass custom_mask or packed_custom_mask, not both");
  if (!packed && !options.mask_indptr.empty_view()) fail("mask_indptr goes with packed_custom_mask");
  if (!dense && !packed) return;
  int64_t total = 0;
  for (size_t r = 0; r < batch; ++r) {
    mask_offset_.push_back(total);
    total += qo_len(static_cast<int64_t>(r)) * kv_len_[r];
  }
  mask_ = Tensor<bool>({total});
  if (dense) {
    const auto& m = options.custom_mask;
    if (m.rank() != 1 || m.dim(0) != total)
      fail("custom_mask must be the requests' (qo_len, kv_len) blocks flattened and concatenated: " +
           std::to_string(total) + " entries, got shape " + shape_str(m.shape()));
    for (int64_t i = 0; i < total; ++i) mask_[i] = m.at({i});
    return;
  }
  const std::vector<int32_t> bytes_at = int32s(options.mask_indptr, "mask_indptr");
  check_indptr(bytes_at, "mask_indptr", batch + 1, "batch + 1, as qo_indptr");
  const auto& bits = options.packed_custom_mask;
  if (bits.rank() != 1 || bits.dim(0) != bytes_at.back())
    fail("packed_custom_mask must have mask_indptr[-1] = " + std::to_string(bytes_at.back()) +
         " bytes, got shape " + shape_str(bits.shape()));
  for (size_t r = 0; r < batch; ++r) {
    const int64_t n = qo_len(static_cast<int64_t>(r)) * kv_len_[r];
    if (bytes_at[r + 1] - bytes_at[r] != (n + 7) / 8)
      fail("mask_indptr must give request " + std::to_string(r) + " ceil(qo_len · kv_len / 8) = " +
           std::to_string((n + 7) / 8) + " bytes, got " + std::to_string(bytes_at[r + 1] - bytes_at[r]));
    for (int64_t e = 0; e < n; ++e)
      mask_[mask_offset_[r] + e] = (bits.at({bytes_at[r] + e / 8}) >> (e % 8)) & 1;  // bitorder="little"
  }
}

template <class KV>
  requires AttentionTypes<float, KV>
void BatchAttentionPlan::run(TensorView<const float> q, TensorView<const KV> k_pages, TensorView<const KV> v_pages,
                             TensorView<float> out, TensorView<float> lse) const {
  constexpr int64_t kBlock = std::is_same_v<KV, block_q8_0> ? kQ8_0Block : 1;
  const auto pool_shape = [&](int64_t d) {
    const int64_t pages = k_pages.rank() == 4 ? k_pages.dim(0) : 0;
    return layout_ == PageLayout::NHD ? Shape{pages, page_size_, heads_kv_, d} : Shape{pages, heads_kv_, page_size_, d};
  };
  const auto check = [&](const char* name, const Shape& got, const Shape& want, const char* what) {
    if (got != want)
      fail(std::string(name) + " must be " + what + " " + shape_str(want) + ", got " + shape_str(got));
  };
  check("q", q.shape(), {nnz_q(), heads_q_, d_}, "(nnz_q, num_qo_heads, head_dim)");
  const char* pool_what = layout_ == PageLayout::NHD ? "(num_pages, page_size, num_kv_heads, D) (NHD)"
                                                     : "(num_pages, num_kv_heads, page_size, D) (HND)";
  check("k_pages", core::logical_shape(k_pages), pool_shape(d_), pool_what);
  check("v_pages", core::logical_shape(v_pages), pool_shape(d_v_), pool_what);
  if (max_page_ >= k_pages.dim(0))
    fail("kv_indices must be below num_pages = " + std::to_string(k_pages.dim(0)) + ", got page " +
         std::to_string(max_page_));
  check("out", out.shape(), output_shape(), "(nnz_q, num_qo_heads, value_head_dim)");
  if (!lse.empty_view()) check("lse", lse.shape(), lse_shape(), "(nnz_q, num_qo_heads)");
  check_outputs("batch_attention", {{"out", MemorySpan::of(out)}, {"lse", MemorySpan::of(lse)}},
                {{"q", MemorySpan::of(q)}, {"k_pages", MemorySpan::of(k_pages)}, {"v_pages", MemorySpan::of(v_pages)}});

  // The kernels read rows with unit stride: other layouts once through a copy.
  Tensor<float> q_copy, out_staged;
  Tensor<KV> k_copy, v_copy;
  if (!core::unit_rows(q)) q = (q_copy = contiguous(q)).view();
  if (!core::unit_rows(k_pages)) k_pages = (k_copy = contiguous(k_pages)).view();
  if (!core::unit_rows(v_pages)) v_pages = (v_copy = contiguous(v_pages)).view();
  const TensorView<float> out_given = out;
  if (!core::unit_rows(TensorView<const float>(out))) out = (out_staged = Tensor<float>(out.shape())).view();

  std::vector<core::AttentionProblem<float>> decode;
  decode.reserve(static_cast<size_t>(batch_size()));
  for (int64_t r = 0; r < batch_size(); ++r) {
    const int64_t n_q = qo_len(r), n_k = kv_len(r), begin = qo_indptr_[r];
    if (n_q == 0) continue;
    const int32_t* pages = kv_indices_.data() + kv_indptr_[r];
    const core::Operand<const KV> k_op = paged_operand(k_pages, layout_, pages, page_size_);
    const core::Operand<const KV> v_op = paged_operand(v_pages, layout_, pages, page_size_);
    const TensorView<float> lse_r =
        lse.empty_view() ? TensorView<float>()
                         : TensorView<float>(lse.data() + begin * lse.stride(0), {heads_q_, n_q},
                                             {lse.stride(1), lse.stride(0)});
    const bool* mask = mask_.numel() > 0 ? mask_.data() + mask_offset_[static_cast<size_t>(r)] : nullptr;
    if (!kernels::decode_suits(n_q)) {
      // Prefill: the plan of attention() over the request's pages gathered.
      const Tensor<KV> k = gather(k_op, heads_kv_, n_k, d_ / kBlock), v = gather(v_op, heads_kv_, n_k, d_v_ / kBlock);
      AttentionMasks masks;
      if (mask) masks.first = AttentionMask{TensorView<const bool>(mask, {n_q, n_k}), MaskConvention::TrueAllows};
      const AttentionPlan<float, KV> plan(rows_of(q, begin, n_q), k.view(), v.view(), options_, masks);
      AttentionExtras<float> extras;
      extras.lse = lse_r;
      plan.run(rows_of(out, begin, n_q), extras);
      continue;
    }
    core::AttentionProblem<float> p;
    p.heads_q = heads_q_;
    p.heads_kv = heads_kv_;
    p.n_q = n_q;
    p.n_k = n_k;
    p.d = d_;
    p.d_v = d_v_;
    p.q = core::operand(rows_of(q, begin, n_q), {}, 1);
    if constexpr (std::is_same_v<KV, float>) {
      p.k = k_op;
      p.v = v_op;
    } else {
      p.kv = std::is_same_v<KV, bfloat16> ? core::KVStorage::BF16
             : std::is_same_v<KV, float16> ? core::KVStorage::F16
                                           : core::KVStorage::Q8_0;
      p.k_stored = as_bytes(k_op);
      p.v_stored = as_bytes(v_op);
    }
    p.out = core::operand(rows_of(out, begin, n_q), {}, 1);
    if (!lse_r.empty_view())  // seen as rows of one column
      p.lse = core::operand(TensorView<float>(lse_r.data(), {heads_q_, n_q, 1}, {lse.stride(1), lse.stride(0), 1}), {}, 1);
    if (mask) {
      p.mask.terms[0].boolean = core::operand(TensorView<const bool>(mask, {n_q, n_k}), {}, 1);  // every head's
    }
    p.scale = options_.scale ? *options_.scale : (d_ > 0 ? 1.0 / std::sqrt(double(d_)) : 1.0);
    p.causal = options_.causal;
    p.window = options_.window;
    p.softcap = options_.softcap;
    p.alibi = options_.alibi_slopes;
    p.sinks = options_.sinks;
    decode.push_back(std::move(p));
  }
  std::vector<const core::AttentionProblem<float>*> problems;
  for (const auto& p : decode) problems.push_back(&p);
  kernels::decode_forward_batch(problems);
  if (out_staged.numel() > 0) copy<float, float>(out_staged.view(), out_given);
}

template <class KV>
  requires AttentionTypes<float, KV>
BatchAttentionResult batch_attention(TensorView<const float> q, TensorView<const int32_t> qo_indptr,
                                     TensorView<const KV> k_pages, TensorView<const KV> v_pages,
                                     TensorView<const int32_t> kv_indptr, TensorView<const int32_t> kv_indices,
                                     TensorView<const int32_t> kv_last_page_len, const BatchAttentionOptions& options,
                                     PageLayout layout, bool return_lse) {
  if (q.rank() != 3) fail("q must be (nnz_q, num_qo_heads, head_dim), got shape " + shape_str(q.shape()));
  if (k_pages.rank() != 4 || v_pages.rank() != 4)
    fail("k_pages and v_pages must be 4-D pools, got " + shape_str(core::logical_shape(k_pages)) + " and " +
         shape_str(core::logical_shape(v_pages)));
  const bool nhd = layout == PageLayout::NHD;
  const BatchAttentionPlan plan(qo_indptr, kv_indptr, kv_indices, kv_last_page_len, q.dim(1),
                                k_pages.dim(nhd ? 2 : 1), core::logical_shape(k_pages)[3],
                                k_pages.dim(nhd ? 1 : 2), options, core::logical_shape(v_pages)[3], layout);
  BatchAttentionResult r{Tensor<float>(plan.output_shape()), return_lse ? Tensor<float>(plan.lse_shape()) : Tensor<float>()};
  plan.run(q, k_pages, v_pages, r.out.view(), return_lse ? r.lse.view() : TensorView<float>());
  return r;
}

#define ATTN_BATCH_INSTANTIATE(T, KV)                                                                             \
  template void BatchAttentionPlan::run<KV>(TensorView<const float>, TensorView<const KV>, TensorView<const KV>,  \
                                            TensorView<float>, TensorView<float>) const;                          \
  template BatchAttentionResult batch_attention<KV>(                                                              \
      TensorView<const float>, TensorView<const int32_t>, TensorView<const KV>, TensorView<const KV>,             \
      TensorView<const int32_t>, TensorView<const int32_t>, TensorView<const int32_t>,                            \
      const BatchAttentionOptions&, PageLayout, bool);
#define ATTN_BATCH_INSTANTIATE_FLOAT(T, KV) ATTN_BATCH_INSTANTIATE_IF_##T(KV)
#define ATTN_BATCH_INSTANTIATE_IF_float(KV) ATTN_BATCH_INSTANTIATE(float, KV)
#define ATTN_BATCH_INSTANTIATE_IF_double(KV)
ATTN_FOR_EACH_ATTENTION_TYPE(ATTN_BATCH_INSTANTIATE_FLOAT)
#undef ATTN_BATCH_INSTANTIATE_IF_double
#undef ATTN_BATCH_INSTANTIATE_IF_float
#undef ATTN_BATCH_INSTANTIATE_FLOAT
#undef ATTN_BATCH_INSTANTIATE

}  // namespace attn
