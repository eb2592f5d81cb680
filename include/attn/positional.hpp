// Positional encodings: attention is blind to word order, so position is
// added to (sinusoidal), rotated into (RoPE) the vectors, or biased into the
// logits (ALiBi: attention's alibi_slopes option).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "attn/rope_scaling.hpp"
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
  // Rotate the first r features (even): by default all of d, or
  // int(d · scaling.partial_rotary_factor), or twice the tables' width.
  std::optional<int64_t> rotary_dim;
  int64_t offset = 0;  // positions are offset + 0..n-1 when none are given
  // Hugging Face's rope_scaling (attn/rope_scaling.hpp): the frequencies'
  // type, with its attention factor multiplying cos and sin, and M-RoPE's
  // sections. The length-dependent types (dynamic, longrope) take the
  // largest position + 1 as the sequence length.
  RopeScaling scaling;
};

// Explicit cos and sin tables, used as given instead of computed angles (ONNX
// RotaryEmbedding's cos_cache and sin_cache, in which exporters bake any
// scaling): (max_position + 1, r/2) indexed by the positions, or without
// positions (..., n, r/2) broadcast against x's rows (..., n).
template <Real T>
struct RopeTables {
  TensorView<const T> cos, sin;
};

// Rotary position embedding of x (..., n, d) into out (same shape; may alias
// x exactly). Pair k of the r rotated features turns by pos · inv_freq[k]
// (rope_frequencies; by default base^(-2k/r)), cos and sin times the
// scaling's attention factor, angles in double. positions, when given, holds
// integers broadcastable to (..., n) (any sign), or with M-RoPE sections
// (S, ..., n): row s for the pairs of section s; otherwise position of row t
// is options.offset + t.
template <Real T>
void apply_rope(TensorView<const T> x, TensorView<T> out, const RopeOptions& options = {},
                TensorView<const int64_t> positions = {});
template <Real T>
Tensor<T> apply_rope(TensorView<const T> x, const RopeOptions& options = {},
                     TensorView<const int64_t> positions = {});
// The same with explicit tables: pair k of a row at position p turns by the
// angle whose cos and sin are tables.cos[p][k] and tables.sin[p][k]. base and
// scaling's frequencies are not used (scaling may only give M-RoPE sections);
// a position outside the tables is a ValueError, raised before anything is
// written.
template <Real T>
void apply_rope(TensorView<const T> x, TensorView<T> out, const RopeTables<T>& tables,
                const RopeOptions& options = {}, TensorView<const int64_t> positions = {});
template <Real T>
Tensor<T> apply_rope(TensorView<const T> x, const RopeTables<T>& tables,
                     const RopeOptions& options = {}, TensorView<const int64_t> positions = {});

// The backward of apply_rope: dx = dL/dx from dy = dL/dout (same shape; may
// alias exactly), for the same options, positions (and tables). RoPE is a
// rotation per pair (times the attention factor), so its transpose is the
// rotation by -angle (times the same factor).
template <Real T>
void rope_backward(TensorView<const T> dy, TensorView<T> dx, const RopeOptions& options = {},
                   TensorView<const int64_t> positions = {});
template <Real T>
Tensor<T> rope_backward(TensorView<const T> dy, const RopeOptions& options = {},
                        TensorView<const int64_t> positions = {});
template <Real T>
void rope_backward(TensorView<const T> dy, TensorView<T> dx, const RopeTables<T>& tables,
                   const RopeOptions& options = {}, TensorView<const int64_t> positions = {});
template <Real T>
Tensor<T> rope_backward(TensorView<const T> dy, const RopeTables<T>& tables,
                        const RopeOptions& options = {}, TensorView<const int64_t> positions = {});

// ALiBi's slopes, one per head (BLOOM's build_alibi_tensor; ggml's max_bias):
// with c the largest power of 2 <= num_heads, head h < c gets
// 2^(-max_bias (h + 1) / c) and the remaining heads the odd powers of
// 2^(-max_bias / 2c): 1, 3, 5, ... (the slopes of 2c heads that fall between
// the first c). 1 <= num_heads <= kMaxAlibiHeads; max_bias finite > 0 (8:
// the paper's 2^(-8h/H)).
std::vector<double> alibi_slopes(int64_t num_heads, double max_bias = 8.0);
// 2^24 heads: far beyond any model (hundreds), small enough that the slopes
// (8 bytes each) always fit in memory; a larger count is a ValueError
// naming the range, not a failed allocation.
inline constexpr int64_t kMaxAlibiHeads = int64_t{1} << 24;

}  // namespace attn
