// Which keys a query may attend: masks, causal alignment and sliding windows.
//
// Convention (PyTorch scaled_dot_product_attention, ONNX Attention): a boolean
// mask is true where the query MAY attend; a float mask is added to the scaled
// logits. The MultiHeadAttention layer uses nn.MultiheadAttention's opposite
// boolean convention and converts before calling attention().
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <variant>

#include "attn/tensor.hpp"

namespace attn {

// Causal masking. With n_q == n_k both alignments are the lower triangle.
enum class Causal {
  None,
  BottomRight,  // query i attends key j iff j <= i + (n_k - n_q): what a KV cache needs
  TopLeft,      // query i attends key j iff j <= i: PyTorch's is_causal
};

// Parses "none", "bottom_right" or "top_left" (the names the Python API uses
// beside False and True); ValueError naming the three otherwise.
Causal parse_causal(const std::string& name);

// Sliding window (left, right); -1 means unbounded on that side. With
// p = i + (n_k - n_q), key j is allowed iff p - left <= j <= p + right.
struct Window {
  int64_t left = -1;
  int64_t right = -1;
};

// The contiguous range [begin, end) of keys allowed for query i by causal
// masking and the window together (both are interval constraints). Empty
// (begin >= end) when no key is allowed. (Inline: the kernels ask for it per
// row and tile.)
struct KeyRange {
  int64_t begin;
  int64_t end;
};
inline KeyRange allowed_keys(int64_t i, int64_t n_q, int64_t n_k, Causal causal,
                             Window window) {
  const int64_t p = i + (n_k - n_q);  // bottom-right aligned position of query i
  int64_t begin = 0;
  int64_t end = n_k;
  if (causal == Causal::BottomRight) end = std::min(end, p + 1);
  if (causal == Causal::TopLeft) end = std::min(end, i + 1);
  // Written so that huge window sizes cannot overflow.
  if (window.left >= 0 && p - begin > window.left) begin = p - window.left;
  if (window.right >= 0 && end - 1 - p > window.right) end = p + window.right + 1;
  return {begin, std::max(begin, end)};
}

// An optional mask: boolean (true = may attend) or additive (float or double).
// Its view must broadcast to the logits' shape (..., heads, n_q, n_k).
using Mask = std::variant<std::monostate, TensorView<const bool>,
                          TensorView<const float>, TensorView<const double>>;

inline bool has_mask(const Mask& m) {
  return !std::holds_alternative<std::monostate>(m);
}

}  // namespace attn
