// merge_state, merge_state_in_place, merge_states: partial attention results
// combined by their log-sum-exps, row by row under core::merge_lse's rules.
#include "attn/cascade.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "softmax_rules.hpp"

namespace attn {
namespace {

template <class T>
void check_shapes(const char* fn, const char* v_name, const TensorView<const T>& v, const char* s_name,
                  const TensorView<const T>& s, const Shape& want_v) {
  const std::string shapes =
      std::string(v_name) + " " + shape_str(v.shape()) + ", " + s_name + " " + shape_str(s.shape());
  if (v.shape() != want_v)
    throw ValueError(std::string(fn) + ": " + v_name + " must have shape " + shape_str(want_v) + ", got " +
                     shapes);
  const Shape want_s(want_v.begin(), want_v.end() - 1);
  if (s.shape() != want_s)
    throw ValueError(std::string(fn) + ": " + s_name + " must have shape " + shape_str(want_s) + " (" + v_name +
                     "'s without its last axis), got " + shapes);
}

template <class T>
void check_state(const char* fn, const char* v_name, const TensorView<const T>& v, const char* s_name,
                 const TensorView<const T>& s) {
  if (v.rank() != 3)
    throw ValueError(std::string(fn) + ": " + v_name + " must be (n, heads, head_dim), got shape " +
                     shape_str(v.shape()));
  check_shapes(fn, v_name, v, s_name, s, v.shape());
}

// (acc, lse) := merge of (acc, lse) and (row, s), acc and row of d values
// (row's with its stride).
template <class T>
void merge_row(double* acc, double& lse, const T* row, int64_t stride, T s, int64_t d) {
  const auto m = core::merge_lse<double>(lse, static_cast<double>(s));
  lse = m.lse;
  if (!m.take_b) return;
  for (int64_t e = 0; e < d; ++e)
    acc[e] = (m.take_a ? m.weight_a * acc[e] : 0.0) + m.weight_b * static_cast<double>(row[e * stride]);
}

}  // namespace

template <Real T>
void merge_state_in_place(TensorView<T> v, TensorView<T> s, TensorView<const T> v_other,
                          TensorView<const T> s_other) {
  constexpr const char* fn = "merge_state_in_place";
  check_state<T>(fn, "v", v, "s", s);
  check_shapes<T>(fn, "v_other", v_other, "s_other", s_other, v.shape());
  const int64_t n = v.dim(0), heads = v.dim(1), d = v.dim(2);
  std::vector<double> acc(static_cast<size_t>(d));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < heads; ++h) {
      T* row = &v.at({i, h, 0});
      for (int64_t e = 0; e < d; ++e) acc[static_cast<size_t>(e)] = row[e * v.stride(2)];
      double lse = s.at({i, h});
      merge_row(acc.data(), lse, &v_other.at({i, h, 0}), v_other.stride(2), s_other.at({i, h}), d);
      for (int64_t e = 0; e < d; ++e) row[e * v.stride(2)] = static_cast<T>(acc[static_cast<size_t>(e)]);
      s.at({i, h}) = static_cast<T>(lse);
    }
}

template <Real T>
MergedState<T> merge_state(TensorView<const T> v_a, TensorView<const T> s_a, TensorView<const T> v_b,
                           TensorView<const T> s_b) {
  constexpr const char* fn = "merge_state";
  check_state<T>(fn, "v_a", v_a, "s_a", s_a);
  check_shapes<T>(fn, "v_b", v_b, "s_b", s_b, v_a.shape());
  MergedState<T> r{Tensor<T>(v_a.shape()), Tensor<T>(s_a.shape())};
  const int64_t rows = v_a.dim(0) * v_a.dim(1), heads = v_a.dim(1), d = v_a.dim(2);
  std::vector<double> acc(static_cast<size_t>(d));
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t i = row / heads, h = row % heads;
    double lse = s_a.at({i, h});
    for (int64_t e = 0; e < d; ++e) acc[static_cast<size_t>(e)] = v_a.at({i, h, e});
    merge_row(acc.data(), lse, &v_b.at({i, h, 0}), v_b.stride(2), s_b.at({i, h}), d);
    std::copy(acc.begin(), acc.end(), r.v.data() + row * d);
    r.s[row] = static_cast<T>(lse);
  }
  return r;
}

template <Real T>
MergedState<T> merge_states(TensorView<const T> vs, TensorView<const T> ss) {
  constexpr const char* fn = "merge_states";
  if (vs.rank() != 4)
    throw ValueError(std::string(fn) + ": vs must be (n, num_states, heads, head_dim), got shape " +
                     shape_str(vs.shape()));
  check_shapes<T>(fn, "vs", vs, "ss", ss, vs.shape());
  const int64_t n = vs.dim(0), states = vs.dim(1), heads = vs.dim(2), d = vs.dim(3);
  MergedState<T> r{Tensor<T>({n, heads, d}), Tensor<T>({n, heads})};
  std::vector<double> acc(static_cast<size_t>(d));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < heads; ++h) {
      // The first state as it is, then each next merged in (none: zeros, −∞).
      double lse = states > 0 ? static_cast<double>(ss.at({i, 0, h})) : -std::numeric_limits<double>::infinity();
      for (int64_t e = 0; e < d; ++e) acc[static_cast<size_t>(e)] = states > 0 ? vs.at({i, 0, h, e}) : 0.0;
      for (int64_t k = 1; k < states; ++k)
        merge_row(acc.data(), lse, &vs.at({i, k, h, 0}), vs.stride(3), ss.at({i, k, h}), d);
      std::copy(acc.begin(), acc.end(), r.v.data() + (i * heads + h) * d);
      r.s[i * heads + h] = static_cast<T>(lse);
    }
  return r;
}

#define ATTN_INSTANTIATE_CASCADE(T)                                                                         \
  template void merge_state_in_place<T>(TensorView<T>, TensorView<T>, TensorView<const T>,                 \
                                        TensorView<const T>);                                              \
  template MergedState<T> merge_state<T>(TensorView<const T>, TensorView<const T>, TensorView<const T>,    \
                                         TensorView<const T>);                                             \
  template MergedState<T> merge_states<T>(TensorView<const T>, TensorView<const T>);
ATTN_INSTANTIATE_CASCADE(float)
ATTN_INSTANTIATE_CASCADE(double)
#undef ATTN_INSTANTIATE_CASCADE

}  // namespace attn
