#include "attn/positional.hpp"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace attn {
namespace {

void check_base(double base, const char* what) {
  if (!(base > 0) || !std::isfinite(base))
    throw ValueError(std::string(what) + ": base must be a finite number > 0, got " +
                     std::to_string(base));
}

// Validates apply_rope's arguments; returns the rotated width r.
template <class T>
int64_t check_rope(const TensorView<const T>& x, const TensorView<T>& out, const RopeOptions& opt,
                   const TensorView<const int64_t>& positions) {
  if (x.rank() < 2)
    throw ValueError("rope: x must have shape (..., n, d), got " + shape_str(x.shape()));
  if (out.shape() != x.shape())
    throw ValueError("rope: out has shape " + shape_str(out.shape()) +
                     ", expected x's shape " + shape_str(x.shape()));
  check_base(opt.base, "rope");
  const int64_t d = x.dim(-1);
  const int64_t r = opt.rotary_dim.value_or(d);
  if (r < 0 || r > d || r % 2 != 0)
    throw ValueError("rope: rotary_dim must be even and in [0, d=" + std::to_string(d) +
                     "], got " + std::to_string(r) +
                     (opt.rotary_dim ? "" : " (the default, all of d); pass an even rotary_dim"));
  const int64_t n = x.dim(-2);
  if (positions.empty_view() && n > 0 &&
      opt.offset > std::numeric_limits<int64_t>::max() - (n - 1))
    throw ValueError("rope: positions offset + 0.." + std::to_string(n - 1) + " overflow int64 (offset " +
                     std::to_string(opt.offset) + ")");
  return r;
}

// Rotates pair k of each row by direction * angle: +1 is RoPE, -1 its
// backward (a rotation's transpose is the rotation by -angle).
template <class T>
void rope_impl(TensorView<const T> x, TensorView<T> out, const RopeOptions& opt,
               TensorView<const int64_t> positions, double direction) {
  const int64_t r = check_rope(x, out, opt, positions), d = x.dim(-1), n = x.dim(-2);
  // Positions are read through a view broadcast to x's shape minus the last axis.
  const Shape rows_shape(x.shape().begin(), x.shape().end() - 1);
  TensorView<const int64_t> pos;
  if (!positions.empty_view())
    pos = TensorView<const int64_t>(
        positions.data(), rows_shape,
        broadcast_strides(positions.shape(), positions.strides(), rows_shape,
                          "rope: positions"));

  // Angles in double: exact enough at position 1e6 and beyond.
  const int64_t half = r / 2;
  std::vector<double> inv_freq(half);
  for (int64_t k = 0; k < half; ++k)
    inv_freq[k] = std::pow(opt.base, -2.0 * double(k) / double(r));

  const int lead = x.rank() - 1;
  const int64_t rows = numel_of(rows_shape);
  const int64_t sx = x.stride(-1), so = out.stride(-1);
  const auto fill_angles = [&](int64_t position, double* c, double* s) {
    for (int64_t k = 0; k < half; ++k) {
      const double theta = double(position) * inv_freq[k];
      c[k] = std::cos(theta);
      s[k] = direction * std::sin(theta);
    }
  };
  // Default positions offset + t repeat for every head and batch entry: one
  // table of n rows of cos/sin serves them all. Given positions are computed
  // per row (reused while consecutive rows share a position).
  std::vector<double> table_c, table_s;
  if (!pos.data()) {
    table_c.resize(static_cast<size_t>(n * half));
    table_s.resize(static_cast<size_t>(n * half));
    for (int64_t t = 0; t < n; ++t)
      fill_angles(opt.offset + t, table_c.data() + t * half, table_s.data() + t * half);
  }
  std::vector<double> row_c(half), row_s(half);
  std::vector<int64_t> index(lead + 1, 0);
  bool have_angles = false;
  int64_t last = 0;
  for (int64_t row = 0; row < rows; ++row) {
    const double* c = row_c.data();
    const double* s = row_s.data();
    if (!pos.data()) {
      c = table_c.data() + index[lead - 1] * half;  // (half may be 0: no element)
      s = table_s.data() + index[lead - 1] * half;
    } else if (const int64_t p = pos.at(index.data()); !have_angles || p != last) {
      fill_angles(p, row_c.data(), row_s.data());
      have_angles = true;
      last = p;
    }
    const T* xr = &x.at(index.data());
    T* yr = &out.at(index.data());
    for (int64_t k = 0; k < half; ++k) {
      const int64_t a = opt.interleaved ? 2 * k : k;
      const int64_t b = opt.interleaved ? 2 * k + 1 : k + half;
      const double xa = xr[a * sx], xb = xr[b * sx];
      yr[a * so] = static_cast<T>(xa * c[k] - xb * s[k]);
      yr[b * so] = static_cast<T>(xb * c[k] + xa * s[k]);
    }
    for (int64_t f = r; f < d; ++f) yr[f * so] = xr[f * sx];
    for (int a = lead - 1; a >= 0; --a) {
      if (++index[a] < x.dim(a)) break;
      index[a] = 0;
    }
  }
}

template <class T>
Tensor<T> rope_alloc(TensorView<const T> x, const RopeOptions& opt,
                     TensorView<const int64_t> positions, double direction) {
  Tensor<T> out(x.shape());
  rope_impl<T>(x, out.view(), opt, positions, direction);
  return out;
}

}  // namespace

template <class T>
Tensor<T> sinusoidal_encoding(int64_t n, int64_t d, double base) {
  if (n < 0) throw ValueError("positional_encoding: n must be >= 0, got " + std::to_string(n));
  if (d < 1) throw ValueError("positional_encoding: d must be >= 1, got " + std::to_string(d));
  check_base(base, "positional_encoding");
  Tensor<T> pe({n, d});
  sinusoidal_encoding(pe.view(), base);
  return pe;
}

template <class T>
void sinusoidal_encoding(TensorView<T> out, double base) {
  if (out.rank() != 2 || out.dim(1) < 1)
    throw ValueError("positional_encoding: out must be (n, d) with d >= 1, got shape " +
                     shape_str(out.shape()));
  check_base(base, "positional_encoding");
  const int64_t n = out.dim(0), d = out.dim(1);
  for (int64_t i = 0; i < d; ++i) {
    const double denom = std::pow(base, double(2 * (i / 2)) / double(d));
    for (int64_t p = 0; p < n; ++p) {
      const double angle = double(p) / denom;
      out.data()[p * out.stride(0) + i * out.stride(1)] =
          static_cast<T>(i % 2 == 0 ? std::sin(angle) : std::cos(angle));
    }
  }
}
template void sinusoidal_encoding<float>(TensorView<float>, double);
template void sinusoidal_encoding<double>(TensorView<double>, double);
template Tensor<float> sinusoidal_encoding<float>(int64_t, int64_t, double);
template Tensor<double> sinusoidal_encoding<double>(int64_t, int64_t, double);

template <Real T>
void apply_rope(TensorView<const T> x, TensorView<T> out, const RopeOptions& options,
                TensorView<const int64_t> positions) {
  rope_impl<T>(x, out, options, positions, 1);
}
template <Real T>
Tensor<T> apply_rope(TensorView<const T> x, const RopeOptions& options,
                     TensorView<const int64_t> positions) {
  return rope_alloc<T>(x, options, positions, 1);
}
template <Real T>
void rope_backward(TensorView<const T> dy, TensorView<T> dx, const RopeOptions& options,
                   TensorView<const int64_t> positions) {
  rope_impl<T>(dy, dx, options, positions, -1);
}
template <Real T>
Tensor<T> rope_backward(TensorView<const T> dy, const RopeOptions& options,
                        TensorView<const int64_t> positions) {
  return rope_alloc<T>(dy, options, positions, -1);
}

#define ATTN_INSTANTIATE(T)                                                                     \
  template void apply_rope(TensorView<const T>, TensorView<T>, const RopeOptions&,             \
                           TensorView<const int64_t>);                                         \
  template Tensor<T> apply_rope(TensorView<const T>, const RopeOptions&, TensorView<const int64_t>); \
  template void rope_backward(TensorView<const T>, TensorView<T>, const RopeOptions&,          \
                              TensorView<const int64_t>);                                      \
  template Tensor<T> rope_backward(TensorView<const T>, const RopeOptions&,                    \
                                   TensorView<const int64_t>);
ATTN_INSTANTIATE(float)
ATTN_INSTANTIATE(double)
#undef ATTN_INSTANTIATE

}  // namespace attn
