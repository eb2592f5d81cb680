// Positional encodings: attention is blind to word order, so position is
// added to (sinusoidal) or rotated into (RoPE) the vectors.
#pragma once

#include <cstdint>
#include <optional>

#include "attn/tensor.hpp"

namespace attn {

// The article's table, (n, d): angle[p, i] = p / base^(2*(i/2)/d),
// sin(angle) at even i, cos(angle) at odd i. Any n >= 0, d >= 1 (odd too);
// angles in double.
// T is float or double.
template <class T = float>
Tensor<T> sinusoidal_encoding(int64_t n, int64_t d, double base = 10000.0);
// The same table written into out (n, d), any strides: nothing else is
// allocated, so a table as large as memory allows fits.
template <class T>
void sinusoidal_encoding(TensorView<T> out, double base = 10000.0);

struct RopeOptions {
  double base = 10000.0;
  // false: half-split pairs (i, i + r/2), the rotate_half form of GPT-NeoX and
  // LLaMA in Hugging Face; true: pairs (2i, 2i+1), GPT-J and Meta's LLaMA.
  bool interleaved = false;
  std::optional<int64_t> rotary_dim;  // rotate the first r features; default all, even
  int64_t offset = 0;                 // positions are offset + 0..n-1 when none are given
};

// Rotary position embedding of x (..., n, d) into out (same shape; may alias
// x exactly). Pair k of the rotated features turns by pos * base^(-2k/r),
// angles in double. positions, when given, holds integers broadcastable to
// (..., n) (any sign); otherwise position of row t is options.offset + t.
template <Real T>
void apply_rope(TensorView<const T> x, TensorView<T> out, const RopeOptions& options = {},
                TensorView<const int64_t> positions = {});
template <Real T>
Tensor<T> apply_rope(TensorView<const T> x, const RopeOptions& options = {},
                     TensorView<const int64_t> positions = {});

// The backward of apply_rope: dx = dL/dx from dy = dL/dout (same shape; may
// alias exactly), for the same options and positions. RoPE is a rotation per
// pair, so its transpose is the rotation by -angle.
template <Real T>
void rope_backward(TensorView<const T> dy, TensorView<T> dx, const RopeOptions& options = {},
                   TensorView<const int64_t> positions = {});
template <Real T>
Tensor<T> rope_backward(TensorView<const T> dy, const RopeOptions& options = {},
                        TensorView<const int64_t> positions = {});

}  // namespace attn
