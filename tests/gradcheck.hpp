// Gradient checks: central finite differences of a scalar loss.
#pragma once

#include <functional>

#include "attn/tensor.hpp"

namespace attn::test {

// dL/dx by central differences, (L(x + h e_i) - L(x - h e_i)) / 2h for every
// element i of x (restored afterwards).
inline Tensor<double> numeric_gradient(Tensor<double>& x, const std::function<double()>& loss,
                                       double h = 1e-5) {
  Tensor<double> g(x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double up = loss();
    x[i] = saved - h;
    const double down = loss();
    x[i] = saved;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

// sum(a * b): the loss whose gradient with respect to a is b.
inline double dot(const Tensor<double>& a, const Tensor<double>& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace attn::test
