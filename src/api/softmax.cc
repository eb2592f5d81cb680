#include "attn/softmax.hpp"

#include <type_traits>
#include <vector>

#include "kernels/attention_kernel.hpp"
#include "softmax_rules.hpp"

namespace attn {
namespace {

// One row, x[j · sa] -> y[j · so], by the definition (softmax_rules.hpp); e
// is scratch of n entries.
template <class T>
void softmax_row_plain(const T* x, int64_t sa, T* y, int64_t so, int64_t n, T* e) {
  for (int64_t j = 0; j < n; ++j) e[j] = x[j * sa];
  core::softmax_by_definition(e, n);
  for (int64_t j = 0; j < n; ++j) y[j * so] = e[j];
}

}  // namespace

template <Real T>
void softmax(TensorView<const T> a, TensorView<T> out, int64_t axis) {
  if (a.shape() != out.shape())
    throw ValueError("softmax: out has shape " + shape_str(out.shape()) +
                     ", expected the input's " + shape_str(a.shape()));
  if (a.rank() == 0) throw ValueError("softmax: input must have rank >= 1, got a scalar");
  {
    const NamedSpan in[] = {{"a", MemorySpan::of(a)}}, o[] = {{"out", MemorySpan::of(out)}};
    check_outputs("softmax", o, std::span(in, same_elements(in[0].span, o[0].span) ? 0 : 1));  // (a itself: in place)
  }
  const int ax = normalize_axis(axis, a.rank(), "softmax: axis");
  // Move the softmax axis last, then walk every row.
  a = a.transpose(ax, a.rank() - 1);
  out = out.transpose(ax, out.rank() - 1);
  const int lead = a.rank() - 1;
  const int64_t n = a.dim(-1), sa = a.stride(-1), so = out.stride(-1);
  const int64_t rows = numel_of(Shape(a.shape().begin(), a.shape().end() - 1));
  if (n == 0) return;
  std::vector<int64_t> index(lead + 1, 0);
  std::vector<T> e(n);
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = &a.at(index.data());
    T* y = &out.at(index.data());
    // float32 rows in place in memory take the SIMD kernel unless they hold
    // NaN or infinities.
    bool done = false;
    if constexpr (std::is_same_v<T, float>) done = sa == 1 && so == 1 && kernels::softmax_row(x, y, n);
    if (!done) softmax_row_plain(x, sa, y, so, n, e.data());
    for (int d = lead - 1; d >= 0; --d) {
      if (++index[d] < a.dim(d)) break;
      index[d] = 0;
    }
  }
}

template <Real T>
Tensor<T> softmax(TensorView<const T> a, int64_t axis) {
  Tensor<T> out(a.shape());
  softmax<T>(a, out.view(), axis);
  return out;
}

template void softmax(TensorView<const float>, TensorView<float>, int64_t);
template void softmax(TensorView<const double>, TensorView<double>, int64_t);
template Tensor<float> softmax(TensorView<const float>, int64_t);
template Tensor<double> softmax(TensorView<const double>, int64_t);

}  // namespace attn
