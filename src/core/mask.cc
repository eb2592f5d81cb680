#include "attn/mask.hpp"

namespace attn {

Causal parse_causal(const std::string& name) {
  if (name == "none") return Causal::None;
  if (name == "bottom_right") return Causal::BottomRight;
  if (name == "top_left") return Causal::TopLeft;
  throw ValueError("causal must be 'none', 'bottom_right' or 'top_left', got '" + name + "'");
}

std::string causal_name(Causal causal) {
  switch (causal.kind()) {
    case Causal::Kind::None: return "none";
    case Causal::Kind::BottomRight: return "bottom_right";
    case Causal::Kind::TopLeft: return "top_left";
    case Causal::Kind::Offset: return "offset(" + std::to_string(causal.offset_value()) + ")";
  }
  return "?";
}

}  // namespace attn
