// What ring and Ulysses attention share: the checks of one rank's arrays,
// the description every rank must agree on, views of row ranges, and the
// exact merge of partial results.
#pragma once

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "attn/attention.hpp"
#include "attn/cascade.hpp"
#include "attn/dist.hpp"
#include "attn/error.hpp"
#include "collective.hpp"

namespace attn::dist {

// The rows [begin, begin + length) of axis `axis` of a view.
template <class T>
TensorView<T> slice(TensorView<T> view, int axis, int64_t begin, int64_t length) {
  const int a = axis < 0 ? axis + view.rank() : axis;
  Shape shape = view.shape();
  shape[static_cast<size_t>(a)] = length;
  return TensorView<T>(view.data() + begin * view.stride(a), shape, view.strides());
}

inline Shape with_rows(const Shape& shape, int64_t rows) {
  Shape s = shape;
  s[s.size() - 2] = rows;
  return s;
}

// This rank's arrays: q, k, v and the options as attention() takes them
// (the global causal alignment, windows and offsets are checked here as on
// one process), out (and lse when given) of the shapes they produce.
template <class T, class KV>
void check_local(TensorView<const T> q, TensorView<const KV> k, TensorView<const KV> v, TensorView<T> out,
                 TensorView<T> lse, const AttentionOptions& options) {
  const AttentionPlan<T, KV> plan(q, k, v, options);
  if (out.shape() != plan.output_shape())
    throw ValueError("out has shape " + shape_str(out.shape()) + ", expected " + shape_str(plan.output_shape()) +
                     " for q " + shape_str(q.shape()) + " and v " + shape_str(v.shape()));
  if (!lse.empty_view() && lse.shape() != plan.lse_shape())
    throw ValueError("lse has shape " + shape_str(lse.shape()) + ", expected " + shape_str(plan.lse_shape()));
  check_outputs("", {{"out", MemorySpan::of(out)}, {"lse", MemorySpan::of(lse)}},
                        {{"q", MemorySpan::of(q)}, {"k", MemorySpan::of(k)}, {"v", MemorySpan::of(v)}});
}

inline std::string exact(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", x);
  return text;
}

inline std::string list_text(const std::vector<double>& values) {
  std::string text = "[";
  for (double x : values) text += (text.size() > 1 ? ", " : "") + exact(x);
  return text + "]";
}

// A shape with its sequence axis (-2), which differs between ranks, as "n".
inline std::string shape_but_rows(const Shape& shape) {
  std::string text = "(";
  for (size_t a = 0; a < shape.size(); ++a)
    text += (a ? ", " : "") + (a + 2 == shape.size() ? std::string("n") : std::to_string(shape[a]));
  return text + ")";
}

template <class E>
const char* element_name() {
  if constexpr (std::is_same_v<E, float>) return "float32";
  if constexpr (std::is_same_v<E, double>) return "float64";
  if constexpr (std::is_same_v<E, bfloat16>) return "bfloat16";
  if constexpr (std::is_same_v<E, float16>) return "float16";
  if constexpr (std::is_same_v<E, block_q8_0>) return "q8_0";
  return "q4_0";
}

// What every rank must have alike.
template <class T, class KV>
std::vector<Field> describe(TensorView<const T> q, TensorView<const KV> k, TensorView<const KV> v,
                           TensorView<T> lse, const AttentionOptions& options, Layout layout) {
  return {
      {"q's shape", shape_but_rows(q.shape())},
      {"k's shape", shape_but_rows(k.shape())},
      {"v's shape", shape_but_rows(v.shape())},
      {"the element types of q and of k, v", std::string(element_name<T>()) + ", " + element_name<KV>()},
      {"whether lse is asked for", lse.empty_view() ? "no" : "yes"},
      {"options.scale", options.scale ? exact(*options.scale) : "default"},
      {"options.causal", causal_name(options.causal)},
      {"options.window", "(" + std::to_string(options.window.left) + ", " + std::to_string(options.window.right) + ")"},
      {"options.softcap", exact(options.softcap)},
      {"options.alibi_slopes", list_text(options.alibi_slopes)},
      {"options.sinks", list_text(options.sinks)},
      {"options.precision", precision_name(options.precision)},
      {"the layout", layout_name(layout)},
  };
}

// One rank's rows' running result, the normalised output and log-sum-exp
// in double, merged from the blocks' results in the order they are given
// (attn::merge_state_in_place, exact: with L = log(e^a + e^b),
// out = e^(a - L) out_a + e^(b - L) out_b).
class PartialResult {
 public:
  // out's shape (..., Hq, n, dv); heads: Hq (1 without a heads axis).
  PartialResult(const Shape& out_shape, int64_t heads)
      : out_(out_shape),
        lse_(Shape(out_shape.begin(), out_shape.end() - 1)),
        rows_(out_shape[out_shape.size() - 2]),
        dv_(out_shape.back()),
        heads_(heads) {
    std::fill(lse_.data(), lse_.data() + lse_.numel(), -kInf);
  }

  // A block's result for rows [row_begin, row_begin + length): out_b
  // (..., Hq, length, dv) and lse_b (..., Hq, length), contiguous, lse_b
  // plus lse_shift[h] for head h where given (ALiBi's, see ring.cc).
  template <class T>
  void merge(const Tensor<T>& out_b, const Tensor<T>& lse_b, int64_t row_begin,
             const std::vector<double>& lse_shift = {}) {
    const int64_t length = lse_b.dim(-1);
    const int64_t groups = length ? lse_b.numel() / length : 0;
    Tensor<double> o(Shape{groups, length, dv_}), s(Shape{groups, length});
    std::copy(out_b.data(), out_b.data() + o.numel(), o.data());
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t i = 0; i < length; ++i)
        s[g * length + i] =
            lse_b[g * length + i] + (lse_shift.empty() ? 0.0 : lse_shift[static_cast<size_t>(g % heads_)]);
    merge_state_in_place<double>(value_rows(out_.data(), groups, rows_, dv_, row_begin, length),
                                 lse_rows(lse_.data(), groups, rows_, row_begin, length),
                                 value_rows(o.data(), groups, length, dv_, 0, length),
                                 lse_rows(s.data(), groups, length, 0, length));
  }

  // Each head's sink enters every row's denominator once (attention()'s
  // sinks: a key of value zero with logit sinks[h]).
  void add_sinks(const std::vector<double>& sinks) {
    if (sinks.empty() || rows_ == 0) return;
    const int64_t groups = lse_.numel() / rows_;
    Tensor<double> s(Shape{groups, rows_});
    for (int64_t g = 0; g < groups; ++g) std::fill_n(s.data() + g * rows_, rows_, sinks[static_cast<size_t>(g % heads_)]);
    const double zero = 0.0;
    merge_state_in_place<double>(value_rows(out_.data(), groups, rows_, dv_, 0, rows_),
                                 lse_rows(lse_.data(), groups, rows_, 0, rows_),
                                 TensorView<const double>(&zero, {rows_, groups, dv_}, {0, 0, 0}),
                                 lse_rows(s.data(), groups, rows_, 0, rows_));
  }

  template <class T>
  void write(TensorView<T> out, TensorView<T> lse) const {
    copy<double, T>(out_.view(), out);
    if (!lse.empty_view()) copy<double, T>(lse_.view(), lse);
  }

 private:
  static constexpr double kInf = std::numeric_limits<double>::infinity();
  // Rows [begin, begin + length) of contiguous (groups, rows, dv) values
  // and (groups, rows) log-sum-exps as merge_state takes them: (length,
  // groups, dv) and (length, groups).
  static TensorView<double> value_rows(double* data, int64_t groups, int64_t rows, int64_t dv, int64_t begin,
                                       int64_t length) {
    return TensorView<double>(data + begin * dv, {length, groups, dv}, {dv, rows * dv, 1});
  }
  static TensorView<double> lse_rows(double* data, int64_t groups, int64_t rows, int64_t begin, int64_t length) {
    return TensorView<double>(data + begin, {length, groups}, {1, rows});
  }
  Tensor<double> out_;
  Tensor<double> lse_;
  int64_t rows_, dv_, heads_;
};

// Calls f<T, KV>() for every pair of types attention() takes: the explicit
// instantiations.
#define ATTN_DIST_FOR_EACH_TYPES(F) \
  F(float, float)                   \
  F(float, bfloat16)                \
  F(float, float16)                 \
  F(float, block_q8_0)              \
  F(float, block_q4_0)              \
  F(double, double)

}  // namespace attn::dist
