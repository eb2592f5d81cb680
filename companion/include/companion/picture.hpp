// Pictures: heat maps of a positional-encoding table or of attention weights,
// a grid of them sharing one colour scale, written as PNG (through stb) or SVG
// (written directly).
//
// Colours come from viridis, a perceptually uniform map: equal steps in value
// look like equal steps in colour, and it stays readable in grey and for
// colour-blind readers. Differences, on a scale symmetric about 0, use a
// diverging map instead: blue below 0, white at 0, red above.
//
// Both formats draw the same things in the same places: a title per map, the
// axis names as axis titles, the labels (one per row and column, or index
// ticks where a map has none, thinned out so that they do not overlap), and a
// colour bar with its ends, its middle and the scale's title. SVG text is
// UTF-8 (the font-family list names CJK fonts, so Chinese tokens render) and
// each cell carries its value in a <title> tooltip. PNG text is drawn with a
// TrueType font through stb_truetype, Debian's fonts-wqy-microhei by default,
// which covers Chinese; without that font file, PNGs fall back to stb's
// built-in ASCII font: labels it cannot draw show as their index, other
// characters as '?'.
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
// ColorBrewer's RdBu reversed (matplotlib's RdBu_r): dark blue at t = 0, near
// white at 0.5, dark red at 1 (clamped; NaN gives grey).
Rgb blue_white_red(double t);

enum class ColourMap { Viridis, BlueWhiteRed };

// One heat map: values (rows, cols); row 0 is drawn at the top.
struct HeatMap {
  std::string title;                       // e.g. "head 0"
  Tensor<double> values;                   // (rows, cols), rows and cols >= 1
  std::vector<std::string> row_labels;     // none, or one per row (e.g. query tokens)
  std::vector<std::string> col_labels;     // none, or one per column (e.g. key tokens)
  std::string row_axis = "row";            // axis titles, also in tooltips: "query", "position"
  std::string col_axis = "column";
};

// Debian's fonts-wqy-microhei (a BUILD_DEBS package of the Makefile).
inline constexpr const char* kPngFont = "/usr/share/fonts/truetype/wqy/wqy-microhei.ttc";

struct PictureOptions {
  int64_t columns = 0;   // heat maps per row of the grid; 0: about square
  int64_t cell_px = 0;   // size of one cell; 0: chosen from the largest map
  // The colour scale, shared by all maps (so they compare); by default the
  // range of the finite values. vmin must not exceed vmax.
  std::optional<double> vmin, vmax;
  ColourMap colour_map = ColourMap::Viridis;
  std::string scale_title;  // beside the colour bar: what its colours stand for
  // The TrueType font (or collection: its first face) of PNG text. A file that
  // is missing or cannot be parsed, or "", gives the built-in ASCII font.
  // Read as a trusted file: stb_truetype does not guard against malicious fonts.
  std::string png_font = kPngFont;
};

// A rectangle of the picture, in pixels: [x0, x1) x [y0, y1).
struct Box {
  int64_t x0 = 0, y0 = 0, x1 = 0, y1 = 0;
};

// Where write_png puts things: the image size, the top-left corner of each
// map's first cell, the boxes its texts are drawn in, and the colour bar
// (top = vmax, bottom = vmin).
struct PictureLayout {
  int64_t width = 0, height = 0, cell_px = 0;
  int64_t line_height = 0;  // of one line of text
  struct MapText {
    Box title, col_axis, row_axis, col_labels, row_labels;
  };
  std::vector<std::pair<int64_t, int64_t>> map_origin;  // (x, y) per map
  std::vector<MapText> map_text;
  int64_t bar_x = 0, bar_y = 0, bar_width = 0, bar_height = 0;
  Box scale_title;
};
PictureLayout png_layout(const std::vector<HeatMap>& maps, const PictureOptions& options = {});

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
