#include "attn/mask.hpp"

namespace attn {

Causal parse_causal(const std::string& name) {
  if (name == "none") return Causal::None;
  if (name == "bottom_right") return Causal::BottomRight;
  if (name == "top_left") return Causal::TopLeft;
  throw ValueError("causal must be 'none', 'bottom_right' or 'top_left', got '" + name + "'");
}

}  // namespace attn
