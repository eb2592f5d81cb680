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
Tensor<T> multi_head_impl(TensorView<const T> x, int64_t heads,
                          const AttentionOptions& options) {
  if (x.rank() < 2)
    throw ValueError("multi_head: x must have shape (..., n, d), got " + shape_str(x.shape()));
  if (heads < 1)
    throw ValueError("multi_head: heads must be >= 1, got " + std::to_string(heads));
  if (x.dim(-1) % heads != 0)
    throw ValueError("multi_head: heads (" + std::to_string(heads) +
                     ") must divide the model dimension d (" + std::to_string(x.dim(-1)) +
                     ") of x " + shape_str(x.shape()));
  Tensor<T> out(x.shape());
  const auto s = split_heads(x, heads);
  attention(s, s, s, split_heads(out.view(), heads), options);
  return out;
}

}  // namespace

Tensor<float> multi_head(TensorView<const float> x, int64_t heads,
                         const AttentionOptions& options) {
  return multi_head_impl<float>(x, heads, options);
}
Tensor<double> multi_head(TensorView<const double> x, int64_t heads,
                          const AttentionOptions& options) {
  return multi_head_impl<double>(x, heads, options);
}

}  // namespace attn
