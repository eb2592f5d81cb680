// BatchAttentionPlan and batch_attention: the page-table metadata validated
// once; per run, each request's pages read in place: the decode-sized
// requests as one batch of the decode kernel, the others one by one through
// the prefill kernel.
#include "attn/batch_attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>

#include "api/paged_requests.hpp"
#include "api/prepared_attention.hpp"
#include "attention_problem.hpp"
#include "kernels/attention_kernel.hpp"

namespace attn {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw ValueError("batch_attention: " + msg); }

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
    : heads_q_(num_qo_heads), heads_kv_(num_kv_heads), d_(head_dim), d_v_(value_head_dim.value_or(head_dim)),
      page_size_(page_size), layout_(layout) {
  detail::PagedRequests requests("batch_attention", qo_indptr, kv_indptr, kv_indices, kv_last_page_len, page_size);
  qo_indptr_ = std::move(requests.qo_indptr);
  kv_indptr_ = std::move(requests.kv_indptr);
  kv_indices_ = std::move(requests.kv_indices);
  kv_len_ = std::move(requests.kv_len);
  max_page_ = requests.max_page;
  const size_t batch = kv_len_.size();
  if (num_kv_heads < 1 || num_qo_heads < 1 || num_qo_heads % num_kv_heads != 0)
    fail("num_qo_heads must be a positive multiple of num_kv_heads, got " + std::to_string(num_qo_heads) +
         " and " + std::to_string(num_kv_heads));
  if (head_dim < 0 || d_v_ < 0)
    fail("head dims must be >= 0, got " + std::to_string(head_dim) + " and " + std::to_string(d_v_));

  options_.causal = options.causal ? Causal::BottomRight : Causal::None;
  options_.window = options.window;
  options_.softcap = options.softcap;
  options_.scale = options.scale;
  options_.alibi_slopes = options.alibi_slopes;
  options_.sinks = options.sinks;
  options_.precision = options.precision;
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
  const std::vector<int32_t> bytes_at = detail::int32s("batch_attention", options.mask_indptr, "mask_indptr");
  detail::check_indptr("batch_attention", bytes_at, "mask_indptr", batch + 1, "batch + 1, as qo_indptr");
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
  requires ForwardTypes<float, KV>
void BatchAttentionPlan::run(TensorView<const float> q, TensorView<const KV> k_pages, TensorView<const KV> v_pages,
                             TensorView<float> out, TensorView<float> lse) const {
  // int4's keys: a row of head_dim blocks per group of 32 tokens.
  constexpr bool key_groups = std::is_same_v<KV, block_int4>;
  if (key_groups && page_size_ % kInt4Group != 0)
    fail("int4 pages hold keys in groups of 32 tokens: page_size must be a multiple of 32, got " +
         std::to_string(page_size_));
  const int64_t k_page_rows = key_groups ? page_size_ / kInt4Group : page_size_;
  const auto pool_shape = [&](int64_t rows, int64_t d) {
    return detail::pool_shape(layout_, k_pages.rank() == 4 ? k_pages.dim(0) : 0, rows, heads_kv_, d);
  };
  const auto check = [&](const char* name, const Shape& got, const Shape& want, const char* what) {
    if (got != want)
      fail(std::string(name) + " must be " + what + " " + shape_str(want) + ", got " + shape_str(got));
  };
  check("q", q.shape(), {nnz_q(), heads_q_, d_}, "(nnz_q, num_qo_heads, head_dim)");
  const char* pool_what = layout_ == PageLayout::NHD ? "(num_pages, page_size, num_kv_heads, D) (NHD)"
                                                     : "(num_pages, num_kv_heads, page_size, D) (HND)";
  if constexpr (key_groups)
    check("k_pages", k_pages.shape(), pool_shape(k_page_rows, d_),
          layout_ == PageLayout::NHD ? "int4 key groups (num_pages, page_size / 32, num_kv_heads, head_dim) (NHD)"
                                     : "int4 key groups (num_pages, num_kv_heads, page_size / 32, head_dim) (HND)");
  else
    check("k_pages", core::logical_shape(k_pages), pool_shape(page_size_, d_), pool_what);
  check("v_pages", core::logical_shape(v_pages), pool_shape(page_size_, d_v_), pool_what);
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
    const core::Operand<const KV> k_op = detail::paged_operand(k_pages, layout_, pages, k_page_rows);
    const core::Operand<const KV> v_op = detail::paged_operand(v_pages, layout_, pages, page_size_);
    const TensorView<float> lse_r =
        lse.empty_view() ? TensorView<float>()
                         : TensorView<float>(lse.data() + begin * lse.stride(0), {heads_q_, n_q},
                                             {lse.stride(1), lse.stride(0)});
    const bool* mask = mask_.numel() > 0 ? mask_.data() + mask_offset_[static_cast<size_t>(r)] : nullptr;
    core::AttentionProblem<float> p;
    p.heads_q = heads_q_;
    p.heads_kv = heads_kv_;
    p.n_q = n_q;
    p.n_k = n_k;
    p.d = d_;
    p.d_v = d_v_;
    p.q = core::operand(detail::rows_of(q, begin, n_q), {}, 1);
    if constexpr (std::is_same_v<KV, float>) {
      p.k = k_op;
      p.v = v_op;
    } else {
      p.kv = core::storage_of<KV>();
      p.k_stored = detail::as_bytes(k_op);
      p.v_stored = detail::as_bytes(v_op);
    }
    p.out = core::operand(detail::rows_of(out, begin, n_q), {}, 1);
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
    p.precision = options_.precision;
    // A longer request now, its tiles over every thread; decode's below, all as one set of chunks.
    if (kernels::decode_suits(n_q, options_.precision)) decode.push_back(std::move(p));
    else kernels::flash_forward(p);
  }
  std::vector<const core::AttentionProblem<float>*> problems;
  for (const auto& p : decode) problems.push_back(&p);
  kernels::decode_forward_batch(problems);
  if (out_staged.numel() > 0) copy<float, float>(out_staged.view(), out_given);
}

Tensor<block_int4> quantize_int4_key_pages(TensorView<const float> k_pages, PageLayout layout) {
  const auto refuse = [](const std::string& msg) { throw ValueError("quantize_int4_key_pages: " + msg); };
  const bool nhd = layout == PageLayout::NHD;
  if (k_pages.rank() != 4) refuse("k_pages must be a 4-D pool, got shape " + shape_str(k_pages.shape()));
  const int64_t pages = k_pages.dim(0), size = k_pages.dim(nhd ? 1 : 2), heads = k_pages.dim(nhd ? 2 : 1),
                d = k_pages.dim(3), groups = size / kInt4Group;
  if (size % kInt4Group != 0)
    refuse("int4 pages hold keys in groups of 32 tokens: page_size must be a multiple of 32, got " +
           std::to_string(size));
  Tensor<block_int4> out(detail::pool_shape(layout, pages, groups, heads, d));
  std::vector<float> keys(static_cast<size_t>(kInt4Group * d));
  for (int64_t p = 0; p < pages; ++p)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t g = 0; g < groups; ++g) {
        for (int64_t t = 0; t < kInt4Group; ++t)
          for (int64_t c = 0; c < d; ++c) {
            const int64_t slot = g * kInt4Group + t;
            keys[static_cast<size_t>(t * d + c)] = nhd ? k_pages.at({p, slot, h, c}) : k_pages.at({p, h, slot, c});
          }
        try {
          const int64_t row = nhd ? (p * groups + g) * heads + h : (p * heads + h) * groups + g;
          quantize_int4_key_rows(keys.data(), kInt4Group, d, out.data() + row * d, g * kInt4Group);
        } catch (const ValueError& e) {
          refuse(std::string(e.what()) + " (page " + std::to_string(p) + ", head " + std::to_string(h) + ")");
        }
      }
  return out;
}

template <class KV>
  requires ForwardTypes<float, KV>
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
  // (int4's keys: head_dim blocks per group; its values give the page size.)
  const int64_t head_dim = std::is_same_v<KV, block_int4> ? k_pages.dim(3) : core::logical_shape(k_pages)[3];
  const BatchAttentionPlan plan(qo_indptr, kv_indptr, kv_indices, kv_last_page_len, q.dim(1),
                                k_pages.dim(nhd ? 2 : 1), head_dim, v_pages.dim(nhd ? 1 : 2), options,
                                core::logical_shape(v_pages)[3], layout);
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
ATTN_BATCH_INSTANTIATE(float, block_int4)
#undef ATTN_BATCH_INSTANTIATE_IF_double
#undef ATTN_BATCH_INSTANTIATE_IF_float
#undef ATTN_BATCH_INSTANTIATE_FLOAT
#undef ATTN_BATCH_INSTANTIATE

}  // namespace attn
