// attention_varlen: validates the packed layout once, then runs each
// sequence as the attention call it is (views into the packed arrays, no
// copies), so each takes the kernel that suits its shape: the split-KV
// decode kernel for a few queries against many keys, the tiled prefill
// otherwise, whose work items are the sequence's (head, query tile) pairs.
#include "attn/varlen.hpp"

#include <string>

#include "api/prepared_attention.hpp"
#include "attn/attention.hpp"

namespace attn {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw ValueError("attention_varlen: " + msg); }

// Checks cu (batch + 1,) from 0 to total, non-decreasing.
void check_offsets(TensorView<const int64_t> cu, const char* name, int64_t total, const char* of) {
  if (cu.rank() != 1 || cu.dim(0) < 1)
    fail(std::string(name) + " must be 1-D with batch + 1 >= 1 entries, got shape " + shape_str(cu.shape()));
  if (cu.at({0}) != 0) fail(std::string(name) + "[0] must be 0, got " + std::to_string(cu.at({0})));
  for (int64_t b = 1; b < cu.dim(0); ++b)
    if (cu.at({b}) < cu.at({b - 1}))
      fail(std::string(name) + " must not decrease, got " + std::to_string(cu.at({b - 1})) + " then " +
           std::to_string(cu.at({b})) + " at " + std::to_string(b));
  if (cu.at({cu.dim(0) - 1}) != total)
    fail(std::string(name) + " must end at " + of + "'s length " + std::to_string(total) + ", got " +
         std::to_string(cu.at({cu.dim(0) - 1})));
}

// Rows [begin, end) of a packed (total, heads, width) view as (heads, end - begin, width).
template <class T>
TensorView<T> sequence(TensorView<T> x, int64_t begin, int64_t end) {
  return TensorView<T>(x.data() + begin * x.stride(0), {x.dim(1), end - begin, x.dim(2)},
                       {x.stride(1), x.stride(0), x.stride(2)});
}

// The values in a packed K or V row (a block type's last axis counts blocks).
template <class KV>
int64_t row_values(const TensorView<const KV>& t) {
  return t.dim(2) * kBlockValues<KV>;
}

}  // namespace

template <class T, class KV>
  requires AttentionTypes<T, KV>
void attention_varlen(TensorView<const T> q, TensorView<const KV> k, TensorView<const KV> v,
                      TensorView<const int64_t> cu_q, TensorView<const int64_t> cu_k, TensorView<T> out,
                      const AttentionOptions& options, TensorView<T> lse) {
  const auto logical = [](const TensorView<const KV>& t) {
    Shape s = t.shape();
    if (t.rank() == 3) s[2] = row_values(t);
    return shape_str(s);
  };
  const std::string shapes = "q " + shape_str(q.shape()) + ", k " + logical(k) + ", v " + logical(v);
  if (q.rank() != 3 || k.rank() != 3 || v.rank() != 3)
    fail("q, k and v must be packed (total, heads, head_dim), got " + shapes);
  if (k.dim(0) != v.dim(0)) fail("k and v must have the same total length (axis 0), got " + shapes);
  check_attention_options<T>(options, q.dim(1));  // also when there is no sequence to run
  check_offsets(cu_q, "cu_seqlens_q", q.dim(0), "q");
  check_offsets(cu_k, "cu_seqlens_k", k.dim(0), "k");
  if (cu_q.dim(0) != cu_k.dim(0))
    fail("cu_seqlens_q and cu_seqlens_k must describe as many sequences, got " +
         std::to_string(cu_q.dim(0) - 1) + " and " + std::to_string(cu_k.dim(0) - 1));
  if (k.dim(1) != v.dim(1)) fail("k and v must have the same number of heads (axis 1), got " + shapes);
  if (k.dim(1) == 0 ? q.dim(1) != 0 : q.dim(1) % k.dim(1) != 0)
    fail("query heads (" + std::to_string(q.dim(1)) + ") must be a multiple of key/value heads (" +
         std::to_string(k.dim(1)) + "), got " + shapes);
  if (q.dim(2) != row_values(k)) fail("q and k must have the same head dimension (last axis), got " + shapes);
  const Shape out_shape = {q.dim(0), q.dim(1), row_values(v)}, lse_shape = {q.dim(1), q.dim(0)};
  if (out.shape() != out_shape)
    fail("out has shape " + shape_str(out.shape()) + ", expected " + shape_str(out_shape));
  if (!lse.empty_view() && lse.shape() != lse_shape)
    fail("lse has shape " + shape_str(lse.shape()) + ", expected " + shape_str(lse_shape));
  check_outputs("attention_varlen",
                        {{"out", MemorySpan::of(out)}, {"lse", MemorySpan::of(lse)}},
                        {{"q", MemorySpan::of(q)}, {"k", MemorySpan::of(k)}, {"v", MemorySpan::of(v)},
                         {"cu_seqlens_q", MemorySpan::of(cu_q)}, {"cu_seqlens_k", MemorySpan::of(cu_k)}});
  for (int64_t b = 0; b + 1 < cu_q.dim(0); ++b) {
    const int64_t q0 = cu_q.at({b}), q1 = cu_q.at({b + 1}), k0 = cu_k.at({b}), k1 = cu_k.at({b + 1});
    AttentionExtras<T> extras;
    if (!lse.empty_view())
      extras.lse = TensorView<T>(lse.data() + q0 * lse.stride(1), {lse.dim(0), q1 - q0},
                                 {lse.stride(0), lse.stride(1)});
    AttentionPlan<T, KV>(sequence(q, q0, q1), sequence(k, k0, k1), sequence(v, k0, k1), options)
        .run(sequence(out, q0, q1), extras);
  }
}

template <class T, class KV>
  requires AttentionTypes<T, KV>
VarlenResult<T> attention_varlen(TensorView<const T> q, TensorView<const KV> k, TensorView<const KV> v,
                                 TensorView<const int64_t> cu_q, TensorView<const int64_t> cu_k,
                                 const AttentionOptions& options, bool return_lse) {
  VarlenResult<T> r;
  if (q.rank() != 3 || v.rank() != 3)
    fail("q, k and v must be packed (total, heads, head_dim), got q " + shape_str(q.shape()) + ", v " +
         shape_str(v.shape()));
  r.out = Tensor<T>({q.dim(0), q.dim(1), row_values(v)});
  if (return_lse) r.lse = Tensor<T>({q.dim(1), q.dim(0)});
  attention_varlen(q, k, v, cu_q, cu_k, r.out.view(), options, return_lse ? r.lse.view() : TensorView<T>());
  return r;
}

#define ATTN_VARLEN_INSTANTIATE(T, KV)                                                                  \
  template void attention_varlen(TensorView<const T>, TensorView<const KV>, TensorView<const KV>,        \
                                 TensorView<const int64_t>, TensorView<const int64_t>, TensorView<T>,    \
                                 const AttentionOptions&, TensorView<T>);                               \
  template VarlenResult<T> attention_varlen(TensorView<const T>, TensorView<const KV>,                  \
                                            TensorView<const KV>, TensorView<const int64_t>,            \
                                            TensorView<const int64_t>, const AttentionOptions&, bool);
ATTN_FOR_EACH_ATTENTION_TYPE(ATTN_VARLEN_INSTANTIATE)
#undef ATTN_VARLEN_INSTANTIATE

}  // namespace attn
