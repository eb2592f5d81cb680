// Internal: the softmax of one row by its definition and its limits, the one
// statement of its rules at the numeric edges (docs/semantics.md "Numeric edge cases"):
//   a NaN entry          the whole row is NaN
//   every entry −∞       zeros, not NaN (a row with nothing allowed)
//   a +∞ maximum         the +∞ entries share the weight equally, the rest 0
//   otherwise            e^(x − max) / Σ e^(x − max), the max subtracted first
// and of its log-sum-exp, log Σ e^x (the log of the denominator): NaN, −∞,
// +∞ and max + log Σ e^(x − max) in the same four cases. An attention sink
// is one more entry of the denominator that gets no weight of its own.
// Two softmax results over disjoint keys merge by their log-sum-exps
// (merge_lse) under the same rules. The reference (reference.cc),
// attn::softmax's plain rows (softmax.cc) and merge_state (cascade.cc) call
// them; the SIMD kernels' copy of the rules (SoftmaxStep and the
// kernels' merges, kernels/attention-inl.h) is tested against it on every
// target (tests/test_kernels.cc, Kernels.SoftmaxRulesOnEveryTarget).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace attn::core {

// x[0 .. n) := softmax(x), in place; returns the log-sum-exp of x (and the
// sink, a finite logit or −∞ for none).
template <class T>
T softmax_by_definition(T* x, int64_t n, T sink = -std::numeric_limits<T>::infinity()) {
  const T inf = std::numeric_limits<T>::infinity();
  T max = sink;
  bool nan = false;  // fmax skips NaN
  for (int64_t j = 0; j < n; ++j) {
    max = std::fmax(max, x[j]);
    nan = nan || std::isnan(x[j]);
  }
  if (nan) {
    std::fill(x, x + n, std::numeric_limits<T>::quiet_NaN());
    return std::numeric_limits<T>::quiet_NaN();
  }
  T sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    if (max == -inf) x[j] = 0;
    else if (max == inf) x[j] = x[j] == inf ? 1 : 0;
    else x[j] = std::exp(x[j] - max);
    sum += x[j];
  }
  if (max != -inf && max != inf) sum += std::exp(sink - max);
  for (int64_t j = 0; j < n; ++j) x[j] = sum > 0 ? x[j] / sum : 0;
  return max == -inf || max == inf ? max : max + std::log(sum);
}

// The merge of two softmax results over disjoint sets of keys, by their
// log-sum-exps a and b: the merged log-sum-exp and the weights of each
// side's normalised output. A side with −∞ (no key) or below the other's
// +∞ gets weight 0 exactly, and its output is not read (take_a / take_b:
// it may be anything, NaN included); two +∞, or a NaN, give NaN.
template <class T>
struct LseMerge {
  T lse, weight_a, weight_b;
  bool take_a, take_b;
};
template <class T>
LseMerge<T> merge_lse(T a, T b) {
  const T inf = std::numeric_limits<T>::infinity();
  if (b == -inf || (a == inf && b < inf)) return {a, 1, 0, true, false};
  if (a == -inf || (b == inf && a < inf)) return {b, 0, 1, false, true};
  const T lse = std::max(a, b) + std::log1p(std::exp(-std::abs(a - b)));  // NaN for two +∞ or a NaN
  return {lse, std::exp(a - lse), std::exp(b - lse), true, true};
}

}  // namespace attn::core
