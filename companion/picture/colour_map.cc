#include "picture/colour_map.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>

namespace attn {
namespace detail {
namespace {

// viridis (van der Walt and Smith, matplotlib's default map) sampled at
// t = k/9; interpolating linearly between these stays within a few units of
// the full 256-entry map.
constexpr std::array<Rgb, 10> kViridis{{{0x44, 0x01, 0x54},
                                        {0x48, 0x28, 0x78},
                                        {0x3e, 0x4a, 0x89},
                                        {0x31, 0x68, 0x8e},
                                        {0x26, 0x82, 0x8e},
                                        {0x1f, 0x9e, 0x89},
                                        {0x35, 0xb7, 0x79},
                                        {0x6d, 0xcd, 0x59},
                                        {0xb4, 0xde, 0x2c},
                                        {0xfd, 0xe7, 0x25}}};
// ColorBrewer's 11-class RdBu (Brewer, colorbrewer2.org) from blue to red, at
// t = k/10, as matplotlib's RdBu_r interpolates it.
constexpr std::array<Rgb, 11> kBlueWhiteRed{{{0x05, 0x30, 0x61},
                                             {0x21, 0x66, 0xac},
                                             {0x43, 0x93, 0xc3},
                                             {0x92, 0xc5, 0xde},
                                             {0xd1, 0xe5, 0xf0},
                                             {0xf7, 0xf7, 0xf7},
                                             {0xfd, 0xdb, 0xc7},
                                             {0xf4, 0xa5, 0x82},
                                             {0xd6, 0x60, 0x4d},
                                             {0xb2, 0x18, 0x2b},
                                             {0x67, 0x00, 0x1f}}};

}  // namespace

std::span<const Rgb> stops_of(ColourMap map) {
  if (map == ColourMap::BlueWhiteRed) return kBlueWhiteRed;
  return kViridis;
}

Rgb interpolate(std::span<const Rgb> stops, double t) {
  if (std::isnan(t)) return {128, 128, 128};
  const double x = std::clamp(t, 0.0, 1.0) * static_cast<double>(stops.size() - 1);
  const size_t k = std::min(static_cast<size_t>(x), stops.size() - 2);
  const double f = x - static_cast<double>(k);
  auto mix = [f](uint8_t a, uint8_t b) {
    return static_cast<uint8_t>(std::lround(a + (b - a) * f));
  };
  const Rgb a = stops[k], b = stops[k + 1];
  return {mix(a.r, b.r), mix(a.g, b.g), mix(a.b, b.b)};
}

}  // namespace detail

Rgb viridis(double t) { return detail::interpolate(detail::stops_of(ColourMap::Viridis), t); }
Rgb blue_white_red(double t) { return detail::interpolate(detail::stops_of(ColourMap::BlueWhiteRed), t); }

}  // namespace attn
