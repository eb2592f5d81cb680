// sparse_attention: the shapes, the indices and the options checked once,
// then the float32 kernel (kernels/sparse.cc) or the float64 reference.
#include "attn/sparse_attention.hpp"

#include <cmath>
#include <string>
#include <vector>

#include "attn/attention.hpp"
#include "kernels/attention_kernel.hpp"
#include "reference/reference.hpp"
#include "sparse_problem.hpp"

namespace attn {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw ValueError("sparse_attention: " + msg); }

// Each row's indices: −1, or a key below n_k named once. `seen[j]` holds
// the last row that named key j, so a row costs O(topk), not O(n_k).
void check_indices(const core::Operand<const int32_t>& idx, int64_t batch, int64_t heads, int64_t n_q,
                   int64_t topk, int64_t n_k) {
  std::vector<int64_t> seen(static_cast<size_t>(n_k), -1);
  int64_t row = 0;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < n_q; ++i, ++row) {
        const int32_t* r = idx.row(b, h, i);
        for (int64_t t = 0; t < topk; ++t) {
          const int32_t j = r[t * idx.col_stride];
          const auto where = [&] {
            return "indices at (batch entry " + std::to_string(b) + ", head " + std::to_string(h) + ", row " +
                   std::to_string(i) + ", slot " + std::to_string(t) + ")";
          };
          if (j < -1 || j >= n_k)
            fail(where() + " is " + std::to_string(j) + ": must be -1 (no key) or a key in 0.." +
                 std::to_string(n_k - 1));
          if (j < 0) continue;
          if (seen[static_cast<size_t>(j)] == row)
            fail(where() + " names key " + std::to_string(j) + " a second time in its row");
          seen[static_cast<size_t>(j)] = row;
        }
      }
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
  AttentionOptions checked;
  checked.scale = options.scale, checked.softcap = options.softcap, checked.sinks = options.sinks;
  check_attention_options<T>(checked, p.heads_q);
  p.scale = options.scale ? *options.scale : p.d == 0 ? 1.0 : 1.0 / std::sqrt(static_cast<double>(p.d));
  p.softcap = options.softcap, p.sinks = options.sinks;

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
  check_indices(p.indices, p.batch, indices.dim(-3), p.n_q, p.topk, p.n_k);
  p.out = core::operand(result.out.view(), lead, p.batch);
  Shape lse_rows = lse_shape;  // lse as rows of one column
  lse_rows.push_back(1);
  p.lse = core::operand(TensorView<T>(result.lse.data(), lse_rows, contiguous_strides(lse_rows)), lead, p.batch);
  if constexpr (std::is_same_v<T, float>) kernels::sparse_forward(p);
  else reference::reference_sparse_attention(p);
  return result;
}

template SparseAttentionResult<float> sparse_attention(TensorView<const float>, TensorView<const float>,
                                                       TensorView<const float>, TensorView<const int32_t>,
                                                       const SparseAttentionOptions&);
template SparseAttentionResult<double> sparse_attention(TensorView<const double>, TensorView<const double>,
                                                        TensorView<const double>, TensorView<const int32_t>,
                                                        const SparseAttentionOptions&);

}  // namespace attn
