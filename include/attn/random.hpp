// Reproducible random tensors: the same numbers on every platform and
// compiler from the same seed, as the std distributions' are not (their
// algorithms are each standard library's own). What MultiHeadAttention
// initialises its parameters with (PyTorch's schemes, on these numbers).
#pragma once

#include <cmath>
#include <random>

#include "attn/tensor.hpp"

namespace attn {

// Uniform in [0, 1) from the top 53 bits of a 64-bit Mersenne twister.
inline double uniform01(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

// A tensor of numbers uniform in [-bound, bound).
template <class T>
Tensor<T> uniform(Shape shape, double bound, std::mt19937_64& rng) {
  Tensor<T> t(std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = static_cast<T>((2 * uniform01(rng) - 1) * bound);
  return t;
}

// A tensor of normal(0, std) numbers (Box-Muller on two uniforms each).
template <class T>
Tensor<T> normal(Shape shape, double std, std::mt19937_64& rng) {
  Tensor<T> t(std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double u = 1 - uniform01(rng), v = uniform01(rng);  // u in (0, 1]
    t[i] = static_cast<T>(std * std::sqrt(-2 * std::log(u)) * std::cos(2 * M_PI * v));
  }
  return t;
}

}  // namespace attn
