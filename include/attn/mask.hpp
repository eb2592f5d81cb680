// Which keys a query may attend: masks, causal alignment and sliding windows.
//
// Convention (PyTorch scaled_dot_product_attention, ONNX Attention): a boolean
// mask is true where the query MAY attend; a float mask is added to the scaled
// logits. The MultiHeadAttention layer uses nn.MultiheadAttention's opposite
// boolean convention, and says so with each mask (AttentionMask).
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <string>
#include <utility>
#include <variant>

#include "attn/tensor.hpp"

namespace attn {

// Causal masking: which keys a query may see, by its position. Query i sits
// at key position p = i + diagonal (np.tril's k, torch.tril's diagonal) and
// attends key j iff j <= p. With n_q == n_k both named alignments are the
// lower triangle.
class Causal {
 public:
  enum class Kind {
    None,
    BottomRight,  // diagonal n_k - n_q: the queries are the last n_q keys (a KV cache)
    TopLeft,      // diagonal 0: PyTorch's is_causal
    Offset,       // diagonal k, given: ONNX's "past length + i" when the keys are padded
  };
  static const Causal None, BottomRight, TopLeft;
  // Key j is allowed for query i iff j <= i + k (any k, |k| <= kMaxOffset).
  static constexpr Causal offset(int64_t k) { return Causal(Kind::Offset, k); }
  static constexpr int64_t kMaxOffset = int64_t{1} << 62;  // so that i + k cannot overflow

  constexpr Kind kind() const { return kind_; }
  constexpr bool masks() const { return kind_ != Kind::None; }
  // The diagonal of query 0 (the row index's offset): see above.
  constexpr int64_t diagonal(int64_t n_q, int64_t n_k) const {
    return kind_ == Kind::TopLeft ? 0 : kind_ == Kind::Offset ? k_ : n_k - n_q;
  }
  // The key position of query 0 that windows and ALiBi measure distances
  // from: the given offset, else bottom-right (n_k - n_q) whatever the
  // alignment of the causal mask (docs/semantics.md "Which keys take part").
  constexpr int64_t position(int64_t n_q, int64_t n_k) const {
    return kind_ == Kind::Offset ? k_ : n_k - n_q;
  }
  constexpr int64_t offset_value() const { return k_; }  // k of offset(k); 0 otherwise
  friend constexpr bool operator==(const Causal&, const Causal&) = default;

 private:
  constexpr explicit Causal(Kind kind, int64_t k = 0) : kind_(kind), k_(k) {}
  Kind kind_;
  int64_t k_;
};
inline constexpr Causal Causal::None{Causal::Kind::None};
inline constexpr Causal Causal::BottomRight{Causal::Kind::BottomRight};
inline constexpr Causal Causal::TopLeft{Causal::Kind::TopLeft};

// Parses "none", "bottom_right" or "top_left" (the names the Python API uses
// beside False and True); ValueError naming the three otherwise.
Causal parse_causal(const std::string& name);
// The name of a causal mode: "none", "bottom_right", "top_left" or "offset(k)".
std::string causal_name(Causal causal);

// Sliding window (left, right); -1 means unbounded on that side. With p the
// query's position (Causal::position: i + (n_k - n_q) unless an offset is
// given), key j is allowed iff p - left <= j <= p + right.
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
  const int64_t p = i + causal.position(n_q, n_k);
  int64_t begin = 0;
  int64_t end = n_k;
  // (Offsets are bounded by kMaxOffset and i by n_q: no sum here overflows.)
  if (causal.masks()) end = std::clamp(i + causal.diagonal(n_q, n_k) + 1, int64_t{0}, end);
  // Written so that huge window sizes cannot overflow.
  if (window.left >= 0 && p - begin > window.left) begin = std::min(p - window.left, n_k);
  if (window.right >= 0 && end - 1 - p > window.right) end = std::max(p + window.right + 1, int64_t{0});
  return {begin, std::max(begin, end)};
}

// An optional mask: boolean (true = may attend) or additive (float or double).
// Its view must broadcast to the logits' shape (..., heads, n_q, n_k).
using Mask = std::variant<std::monostate, TensorView<const bool>,
                          TensorView<const float>, TensorView<const double>>;

inline bool has_mask(const Mask& m) {
  return !std::holds_alternative<std::monostate>(m);
}

// What a boolean mask's true means. PyTorch has both: scaled_dot_product_attention
// (and ONNX's Attention) let a query attend where the mask is true,
// nn.MultiheadAttention's attn_mask and key_padding_mask block it there.
// Additive masks are added to the logits either way.
enum class MaskConvention { TrueAllows, TrueBlocks };

// A mask and the convention of its booleans.
struct AttentionMask {
  Mask mask;
  MaskConvention convention = MaskConvention::TrueAllows;
};

// The masks of one call: none, one, or two combined, each broadcasting to
// the logits' shape on its own. A key a boolean mask excludes takes no part;
// additive masks add up. attention() is usually given one in PyTorch's
// scaled_dot_product_attention sense (any Mask converts to that); the layer
// gives two (its attn_mask and key_padding_mask, TrueBlocks), ONNX's operator
// two (attn_mask and the padding past nonpad_kv_seqlen). In errors the first
// is "mask", the second "key_padding_mask".
struct AttentionMasks {
  AttentionMasks() = default;
  template <class M>
    requires std::constructible_from<Mask, M&&>
  AttentionMasks(M&& mask) : first{Mask(std::forward<M>(mask))} {}
  AttentionMasks(AttentionMask first_mask, AttentionMask second_mask = {})
      : first(std::move(first_mask)), second(std::move(second_mask)) {}

  AttentionMask first, second;
};

}  // namespace attn
