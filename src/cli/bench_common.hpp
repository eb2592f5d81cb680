// What the bench commands share: seeded inputs, medians, rounding for JSON.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "attn/tensor.hpp"

namespace attn::cli {

// Uniform in [-1, 1), the same for a seed.
inline Tensor<float> random_tensor(const Shape& shape, uint32_t seed) {
  Tensor<float> t(shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = u(rng);
  return t;
}

inline double median(std::vector<double> x) {
  std::nth_element(x.begin(), x.begin() + x.size() / 2, x.end());
  return x[x.size() / 2];  // the upper middle one of an even count
}

inline double rounded(double x, int digits) {
  const double f = std::pow(10.0, digits);
  return std::round(x * f) / f;
}

}  // namespace attn::cli
