#include "attn/multi_head.hpp"

#include <string>

namespace attn {
namespace {

// x (..., n, d) seen as (..., heads, n, d/heads) without copying: head h is
// the column slice [h*dh, (h+1)*dh).
template <class T>
TensorView<T> split_heads(TensorView<T> x, int64_t heads) {
  Shape shape = x.shape();
  Strides strides = x.strides();
  const int64_t dh = x.dim(-1) / heads;
  const int64_t row = x.stride(-2), col = x.stride(-1);
  shape.resize(shape.size() - 2);
  strides.resize(strides.size() - 2);
  shape.insert(shape.end(), {heads, x.dim(-2), dh});
  strides.insert(strides.end(), {dh * col, row, col});
  return TensorView<T>(x.data(), shape, strides);
}

template <class T>
void check_heads(const char* what, TensorView<const T> x, int64_t heads) {
  const std::string w(what);
  if (x.rank() < 2)
    throw ValueError(w + ": x must have shape (..., n, d), got " + shape_str(x.shape()));
  if (heads < 1) throw ValueError(w + ": heads must be >= 1, got " + std::to_string(heads));
  if (x.dim(-1) % heads != 0)
    throw ValueError(w + ": heads (" + std::to_string(heads) +
                     ") must divide the model dimension d (" + std::to_string(x.dim(-1)) +
                     ") of x " + shape_str(x.shape()));
}

template <class T>
void multi_head_into(TensorView<const T> x, TensorView<T> out, int64_t heads,
                     const AttentionOptions& options) {
  check_heads("multi_head", x, heads);
  if (out.shape() != x.shape())
    throw ValueError("multi_head: out has shape " + shape_str(out.shape()) +
                     ", expected x's shape " + shape_str(x.shape()));
  check_outputs("multi_head", {{"out", MemorySpan::of(out)}},
                        {{"x", MemorySpan::of(x)}});
  const auto s = split_heads(x, heads);
  AttentionPlan<T>(s, s, s, options).run(split_heads(out, heads));
}

}  // namespace

template <Real T>
void multi_head(TensorView<const T> x, TensorView<T> out, int64_t heads,
                const AttentionOptions& options) {
  multi_head_into<T>(x, out, heads, options);
}

template <Real T>
Tensor<T> multi_head(TensorView<const T> x, int64_t heads, const AttentionOptions& options) {
  Tensor<T> out(x.shape());
  multi_head_into<T>(x, out.view(), heads, options);
  return out;
}

template <Real T>
MultiHeadResult<T> multi_head_with_weights(TensorView<const T> x, int64_t heads,
                                           const AttentionOptions& options) {
  check_heads("multi_head", x, heads);
  const auto s = split_heads(x, heads);
  const AttentionPlan<T> plan(s, s, s, options);
  MultiHeadResult<T> r{Tensor<T>(x.shape()), Tensor<T>(plan.weights_shape())};
  AttentionExtras<T> extras;
  extras.weights = r.weights.view();
  plan.run(split_heads(r.out.view(), heads), extras);
  return r;
}

template <Real T>
Tensor<T> apply_rope_per_head(TensorView<const T> x, int64_t heads, const RopeOptions& options) {
  check_heads("apply_rope_per_head", x, heads);
  if (!options.rotary_dim && x.dim(-1) / heads % 2 != 0)
    throw ValueError("apply_rope_per_head: RoPE rotates pairs, so the head dimension d / heads = " +
                     std::to_string(x.dim(-1)) + " / " + std::to_string(heads) +
                     " must be even");
  Tensor<T> out(x.shape());
  apply_rope(split_heads(x, heads), split_heads(out.view(), heads), options);
  return out;
}

#define ATTN_INSTANTIATE(T)                                                                   \
  template void multi_head(TensorView<const T>, TensorView<T>, int64_t, const AttentionOptions&); \
  template Tensor<T> multi_head(TensorView<const T>, int64_t, const AttentionOptions&);          \
  template MultiHeadResult<T> multi_head_with_weights(TensorView<const T>, int64_t,             \
                                                      const AttentionOptions&);                 \
  template Tensor<T> apply_rope_per_head(TensorView<const T>, int64_t, const RopeOptions&);
ATTN_INSTANTIATE(float)
ATTN_INSTANTIATE(double)
#undef ATTN_INSTANTIATE

}  // namespace attn
