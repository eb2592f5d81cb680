#include "attn/mask.hpp"

#include <algorithm>

namespace attn {

Causal parse_causal(const std::string& name) {
  if (name == "none") return Causal::None;
  if (name == "bottom_right") return Causal::BottomRight;
  if (name == "top_left") return Causal::TopLeft;
  throw ValueError("causal must be 'none', 'bottom_right' or 'top_left', got '" + name + "'");
}

KeyRange allowed_keys(int64_t i, int64_t n_q, int64_t n_k, Causal causal,
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

}  // namespace attn
