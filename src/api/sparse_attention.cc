// sparse_attention: the shapes, the indices and the options checked once,
// then the float32 kernel (kernels/sparse.cc) or the float64 reference.
#include "attn/sparse_attention.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "api/paged_requests.hpp"
#include "attn/attention.hpp"
#include "kernels/attention_kernel.hpp"
#include "reference/reference.hpp"
#include "sparse_problem.hpp"

namespace attn {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw ValueError("sparse_attention: " + msg); }

// Each row's indices: −1, or a key below n_k named once. `seen[j]` (at
// least n_k entries) holds the last row that named key j, rows numbered on
// from `row`, so a row costs O(topk), not O(n_k), and one `seen` serves
// many calls. where(b, h, i, t) names a slot in errors.
template <class Where>
void check_indices(const core::Operand<const int32_t>& idx, int64_t batch, int64_t heads, int64_t n_q, int64_t topk,
                   int64_t n_k, std::vector<int64_t>& seen, int64_t& row, const Where& where) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < n_q; ++i, ++row) {
        const int32_t* r = idx.row(b, h, i);
        for (int64_t t = 0; t < topk; ++t) {
          const int32_t j = r[t * idx.col_stride];
          if (j < -1 || j >= n_k)
            fail("indices at " + where(b, h, i, t) + " is " + std::to_string(j) + ": must be -1 (no key) or a key in 0.." +
                 std::to_string(n_k - 1));
          if (j < 0) continue;
          if (seen[static_cast<size_t>(j)] == row)
            fail("indices at " + where(b, h, i, t) + " names key " + std::to_string(j) + " a second time in its row");
          seen[static_cast<size_t>(j)] = row;
        }
      }
}

// The options checked as attention()'s, into p (the head dim set).
template <class T>
void set_options(core::SparseProblem<T>& p, const SparseAttentionOptions& options) {
  AttentionOptions checked;
  checked.scale = options.scale, checked.softcap = options.softcap, checked.sinks = options.sinks;
  check_attention_options<T>(checked, p.heads_q);
  p.scale = options.scale ? *options.scale : p.d == 0 ? 1.0 : 1.0 / std::sqrt(static_cast<double>(p.d));
  p.softcap = options.softcap, p.sinks = options.sinks;
}

}  // namespace

template <Real T>
SparseAttentionResult<T> sparse_attention(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                                          TensorView<const int32_t> indices, const SparseAttentionOptions& options) {
  const std::string shapes = "q " + shape_str(q.shape()) + ", k " + shape_str(k.shape()) + ", v " +
                             shape_str(v.shape()) + ", indices " + shape_str(indices.shape());
  const int r = q.rank();
  if (r < 3 || k.rank() != r || v.rank() != r || indices.rank() != r)
    fail("q, k, v and indices must have one rank, at least 3 ((..., heads, rows, columns)), got " + shapes);
  const Shape lead(q.shape().begin(), q.shape().end() - 3);
  for (const Shape& s : {k.shape(), v.shape(), indices.shape()})
    if (Shape(s.begin(), s.end() - 3) != lead) fail("the leading axes of q, k, v and indices differ: " + shapes);
  core::SparseProblem<T> p;
  p.heads_q = q.dim(-3), p.n_q = q.dim(-2), p.d = q.dim(-1);
  p.heads_kv = k.dim(-3), p.n_k = k.dim(-2), p.d_v = v.dim(-1), p.topk = indices.dim(-1);
  if (k.dim(-1) != p.d || v.dim(-3) != p.heads_kv || v.dim(-2) != p.n_k)
    fail("k must be (..., Hkv, n_k, d) and v (..., Hkv, n_k, d_v) for q (..., Hq, n_q, d), got " + shapes);
  if (p.heads_kv == 0 || p.heads_q % p.heads_kv != 0)
    fail("q's heads must be a multiple of k's (GQA), got " + shapes);
  if ((indices.dim(-3) != p.heads_kv && indices.dim(-3) != 1) || indices.dim(-2) != p.n_q)
    fail("indices must be (..., Hkv or 1, n_q, topk) = (..., " + std::to_string(p.heads_kv) + " or 1, " +
         std::to_string(p.n_q) + ", topk), got " + shapes);
  set_options(p, options);

  Shape out_shape = q.shape(), lse_shape(q.shape().begin(), q.shape().end() - 1);
  out_shape.back() = p.d_v;
  SparseAttentionResult<T> result{Tensor<T>(out_shape), Tensor<T>(lse_shape)};
  p.batch = numel_of(lead);
  if (p.batch == 0 || p.heads_q == 0 || p.n_q == 0) return result;
  // The kernels read rows of q, k and v as contiguous columns.
  const auto rows_of = [](TensorView<const T> t, Tensor<T>& copy) {
    if (t.stride(-1) == 1) return t;
    copy = contiguous(t);
    return TensorView<const T>(copy.view());
  };
  Tensor<T> q_copy, k_copy, v_copy;
  q = rows_of(q, q_copy), k = rows_of(k, k_copy), v = rows_of(v, v_copy);
  p.q = core::operand(q, lead, p.batch), p.k = core::operand(k, lead, p.batch), p.v = core::operand(v, lead, p.batch);
  p.indices = core::operand(indices, lead, p.batch);
  p.indices_per_head = indices.dim(-3) == p.heads_kv;
  std::vector<int64_t> seen(static_cast<size_t>(p.n_k), -1);
  int64_t row = 0;
  check_indices(p.indices, p.batch, indices.dim(-3), p.n_q, p.topk, p.n_k, seen, row,
                [](int64_t b, int64_t h, int64_t i, int64_t t) {
    return "(batch entry " + std::to_string(b) + ", head " + std::to_string(h) + ", row " + std::to_string(i) +
           ", slot " + std::to_string(t) + ")";
  });
  p.out = core::operand(result.out.view(), lead, p.batch);
  Shape lse_rows = lse_shape;  // lse as rows of one column
  lse_rows.push_back(1);
  p.lse = core::operand(TensorView<T>(result.lse.data(), lse_rows, contiguous_strides(lse_rows)), lead, p.batch);
  if constexpr (std::is_same_v<T, float>) kernels::sparse_forward({&p});
  else reference::reference_sparse_attention(p);
  return result;
}

template <class KV>
  requires AttentionTypes<float, KV>
SparseAttentionResult<float> sparse_attention(TensorView<const float> q, TensorView<const int32_t> qo_indptr,
                                              TensorView<const KV> k_pages, TensorView<const KV> v_pages,
                                              TensorView<const int32_t> kv_indptr, TensorView<const int32_t> kv_indices,
                                              TensorView<const int32_t> kv_last_page_len,
                                              TensorView<const int32_t> indices, const SparseAttentionOptions& options,
                                              PageLayout layout) {
  const Shape k_shape = core::logical_shape(k_pages), v_shape = core::logical_shape(v_pages);
  const std::string shapes = "q " + shape_str(q.shape()) + ", k_pages " + shape_str(k_shape) + ", v_pages " +
                             shape_str(v_shape) + ", indices " + shape_str(indices.shape());
  const bool nhd = layout == PageLayout::NHD;
  if (q.rank() != 3 || k_pages.rank() != 4 || v_pages.rank() != 4 || indices.rank() != 3)
    fail("over pages, q must be (nnz_q, Hq, D), k_pages and v_pages 4-D pools (" +
         std::string(nhd ? "(num_pages, page_size, Hkv, D): NHD" : "(num_pages, Hkv, page_size, D): HND") +
         ") and indices (nnz_q, Hkv or 1, topk), got " + shapes);
  core::SparseProblem<float> shape;  // what every request shares
  shape.heads_q = q.dim(1), shape.d = q.dim(2), shape.heads_kv = k_shape[nhd ? 2 : 1];
  shape.d_v = v_shape[3], shape.topk = indices.dim(2);
  const int64_t page_size = k_shape[nhd ? 1 : 2];
  const detail::PagedRequests req("sparse_attention", qo_indptr, kv_indptr, kv_indices, kv_last_page_len, page_size);
  if (k_shape != detail::pool_shape(layout, k_shape[0], page_size, shape.heads_kv, shape.d))
    fail("k_pages' head dim must be q's, got " + shapes);
  if (v_shape != detail::pool_shape(layout, k_shape[0], page_size, shape.heads_kv, shape.d_v))
    fail("v_pages must hold k_pages' pages, page size and heads, got " + shapes);
  if (q.dim(0) != req.nnz_q()) fail("q must have qo_indptr[-1] = " + std::to_string(req.nnz_q()) + " rows, got " + shapes);
  if (shape.heads_q % shape.heads_kv != 0) fail("q's heads must be a multiple of the pools' (GQA), got " + shapes);
  if (indices.dim(0) != q.dim(0) || (indices.dim(1) != shape.heads_kv && indices.dim(1) != 1))
    fail("indices must be (nnz_q, Hkv or 1, topk) = (" + std::to_string(q.dim(0)) + ", " +
         std::to_string(shape.heads_kv) + " or 1, topk), got " + shapes);
  if (req.max_page >= k_shape[0])
    fail("kv_indices must be below num_pages = " + std::to_string(k_shape[0]) + ", got page " +
         std::to_string(req.max_page));
  set_options(shape, options);
  shape.indices_per_head = indices.dim(1) == shape.heads_kv;

  SparseAttentionResult<float> result{Tensor<float>({q.dim(0), shape.heads_q, shape.d_v}),
                                      Tensor<float>({q.dim(0), shape.heads_q})};
  // The kernels read rows with unit stride: other layouts once through a copy.
  Tensor<float> q_copy;
  Tensor<KV> k_copy, v_copy;
  if (!core::unit_rows(q)) q = (q_copy = contiguous(q)).view();
  if (!core::unit_rows(k_pages)) k_pages = (k_copy = contiguous(k_pages)).view();
  if (!core::unit_rows(v_pages)) v_pages = (v_copy = contiguous(v_pages)).view();
  std::vector<core::SparseProblem<float>> problems;
  problems.reserve(static_cast<size_t>(req.batch_size()));
  // One `seen` for every request's check, of the longest sequence's keys.
  int64_t longest = 0;
  for (int64_t n : req.kv_len) longest = std::max(longest, n);
  std::vector<int64_t> seen(static_cast<size_t>(longest), -1);
  int64_t row = 0;
  for (int64_t r = 0; r < req.batch_size(); ++r) {
    const int64_t begin = req.qo_indptr[r], n_q = req.qo_len(r);
    core::SparseProblem<float> p = shape;
    p.n_q = n_q, p.n_k = req.kv_len[static_cast<size_t>(r)];
    p.q = core::operand(detail::rows_of(q, begin, n_q), {}, 1);
    p.indices = core::operand(detail::rows_of(indices, begin, n_q), {}, 1);
    check_indices(p.indices, 1, indices.dim(1), n_q, p.topk, p.n_k, seen, row, [&](int64_t, int64_t h, int64_t i, int64_t t) {
      return "(row " + std::to_string(begin + i) + " (request " + std::to_string(r) + ", of " +
             std::to_string(p.n_k) + " keys), head " + std::to_string(h) + ", slot " + std::to_string(t) + ")";
    });
    if (n_q == 0) continue;
    const auto k_op = detail::paged_operand(k_pages, layout, req.pages_of(r), page_size);
    const auto v_op = detail::paged_operand(v_pages, layout, req.pages_of(r), page_size);
    if constexpr (std::is_same_v<KV, float>) {
      p.k = k_op, p.v = v_op;
    } else {
      p.kv = core::storage_of<KV>();
      p.k_stored = detail::as_bytes(k_op), p.v_stored = detail::as_bytes(v_op);
    }
    p.out = core::operand(detail::rows_of(result.out.view(), begin, n_q), {}, 1);
    p.lse = core::operand(TensorView<float>(result.lse.data() + begin * shape.heads_q, {shape.heads_q, n_q, 1},
                                            {1, shape.heads_q, 1}), {}, 1);
    problems.push_back(std::move(p));
  }
  std::vector<const core::SparseProblem<float>*> pointers;
  for (const auto& p : problems) pointers.push_back(&p);
  kernels::sparse_forward(pointers);
  return result;
}

#define ATTN_SPARSE_PAGED_INSTANTIATE(KV)                                                                      \
  template SparseAttentionResult<float> sparse_attention<KV>(                                                  \
      TensorView<const float>, TensorView<const int32_t>, TensorView<const KV>, TensorView<const KV>,          \
      TensorView<const int32_t>, TensorView<const int32_t>, TensorView<const int32_t>, TensorView<const int32_t>, \
      const SparseAttentionOptions&, PageLayout);
ATTN_SPARSE_PAGED_INSTANTIATE(float)
ATTN_SPARSE_PAGED_INSTANTIATE(bfloat16)
ATTN_SPARSE_PAGED_INSTANTIATE(float16)
ATTN_SPARSE_PAGED_INSTANTIATE(block_q8_0)
ATTN_SPARSE_PAGED_INSTANTIATE(block_q4_0)
#undef ATTN_SPARSE_PAGED_INSTANTIATE

template SparseAttentionResult<float> sparse_attention(TensorView<const float>, TensorView<const float>,
                                                       TensorView<const float>, TensorView<const int32_t>,
                                                       const SparseAttentionOptions&);
template SparseAttentionResult<double> sparse_attention(TensorView<const double>, TensorView<const double>,
                                                        TensorView<const double>, TensorView<const int32_t>,
                                                        const SparseAttentionOptions&);

}  // namespace attn
