// Internal to the picture room: the colour maps, as stops interpolated
// linearly (their public samples: attn::viridis and attn::blue_white_red).
#pragma once

#include <span>

#include "companion/picture.hpp"

namespace attn::detail {

// The stops of a colour map, from t = 0 to 1.
std::span<const Rgb> stops_of(ColourMap map);
// The colour at t in [0, 1] (clamped), linear between stops; NaN is grey.
Rgb interpolate(std::span<const Rgb> stops, double t);

}  // namespace attn::detail
