// Pictures: heat maps of a positional-encoding table or of attention weights,
// a grid of them sharing one colour scale, written as PNG (through stb) or SVG
// (written directly).
//
// Colours come from viridis, a perceptually uniform map: equal steps in value
// look like equal steps in colour, and it stays readable in grey and for
// colour-blind readers. Both formats draw a colour bar with the scale's ends.
//
// SVG carries everything: a title per map, UTF-8 labels on both axes (the
// font-family list names CJK fonts, so Chinese tokens render), and each
// cell's value in a <title> tooltip. PNG draws the titles and the colour
// bar's numbers with stb's built-in ASCII font (characters outside ASCII show
// as '?'); axis labels are drawn in SVG only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attn/tensor.hpp"

namespace attn {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
  friend bool operator==(const Rgb&, const Rgb&) = default;
};

// viridis at t in [0, 1] (clamped; NaN gives grey).
Rgb viridis(double t);

// One heat map: values (rows, cols); row 0 is drawn at the top.
struct HeatMap {
  std::string title;                       // e.g. "head 0"
  Tensor<double> values;                   // (rows, cols), rows and cols >= 1
  std::vector<std::string> row_labels;     // none, or one per row (e.g. query tokens)
  std::vector<std::string> col_labels;     // none, or one per column (e.g. key tokens)
  std::string row_axis = "row";            // names used in tooltips: "query", "position"
  std::string col_axis = "column";
};

struct PictureOptions {
  int64_t columns = 0;   // heat maps per row of the grid; 0: about square
  int64_t cell_px = 0;   // size of one cell; 0: chosen from the largest map
  // The colour scale, shared by all maps (so they compare); by default the
  // range of the finite values. vmin must not exceed vmax.
  std::optional<double> vmin, vmax;
};

// Where write_png puts things, in pixels: the image size, the top-left corner
// of each map's first cell, and the colour bar (top = vmax, bottom = vmin).
struct PngLayout {
  int64_t width = 0, height = 0, cell_px = 0;
  std::vector<std::pair<int64_t, int64_t>> map_origin;  // (x, y) per map
  int64_t bar_x = 0, bar_y = 0, bar_width = 0, bar_height = 0;
};
PngLayout png_layout(const std::vector<HeatMap>& maps, const PictureOptions& options = {});

// Throw ValueError for empty or mismatched input (naming the map and the
// shapes), IOError when the file cannot be written (attn::write_file: a
// failed write leaves the old file as it was).
void write_png(const std::string& path, const std::vector<HeatMap>& maps,
               const PictureOptions& options = {});
void write_svg(const std::string& path, const std::vector<HeatMap>& maps,
               const PictureOptions& options = {});

// Picks the format by the extension of path, ".png" or ".svg" (any case);
// another extension is a ValueError.
void write_picture(const std::string& path, const std::vector<HeatMap>& maps,
                   const PictureOptions& options = {});

// The bytes the writers above write, validated the same way but not written:
// a program with several outputs can check every one before writing any.
std::string encode_png(const std::vector<HeatMap>& maps, const PictureOptions& options = {});
std::string encode_svg(const std::vector<HeatMap>& maps, const PictureOptions& options = {});
std::string encode_picture(const std::string& path, const std::vector<HeatMap>& maps,
                           const PictureOptions& options = {});

}  // namespace attn
