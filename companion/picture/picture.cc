#include "companion/picture.hpp"

#include <stb_image_write.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <span>
#include <sstream>

#include "attn/file.hpp"
#include "picture/colour_map.hpp"
#include "picture/png_text.hpp"
#include "picture/xml_text.hpp"

namespace attn {
namespace {

constexpr Rgb kBlack{0, 0, 0};

// Sizes beyond these are refused before anything is allocated.
constexpr int64_t kMaxPngSide = 16384;
constexpr int64_t kMaxSvgCells = 1'000'000;

int64_t rows_of(const HeatMap& m) { return m.values.dim(0); }
int64_t cols_of(const HeatMap& m) { return m.values.dim(1); }

std::string map_name(const std::vector<HeatMap>& maps, size_t i) {
  return "heat map " + std::to_string(i) + " ('" + maps[i].title + "')";
}

void validate(const char* what, const std::vector<HeatMap>& maps, const PictureOptions& opt) {
  const std::string w(what);
  if (maps.empty()) throw ValueError(w + ": no heat maps to draw");
  for (size_t i = 0; i < maps.size(); ++i) {
    const HeatMap& m = maps[i];
    if (m.values.rank() != 2 || m.values.dim(0) < 1 || m.values.dim(1) < 1)
      throw ValueError(w + ": " + map_name(maps, i) + " has values of shape " +
                       shape_str(m.values.shape()) +
                       "; need (rows, cols) with at least one row and one column");
    if (!m.row_labels.empty() && static_cast<int64_t>(m.row_labels.size()) != rows_of(m))
      throw ValueError(w + ": " + map_name(maps, i) + " has " +
                       std::to_string(m.row_labels.size()) + " row labels for " +
                       std::to_string(rows_of(m)) + " rows");
    if (!m.col_labels.empty() && static_cast<int64_t>(m.col_labels.size()) != cols_of(m))
      throw ValueError(w + ": " + map_name(maps, i) + " has " +
                       std::to_string(m.col_labels.size()) + " column labels for " +
                       std::to_string(cols_of(m)) + " columns");
  }
  if (opt.columns < 0)
    throw ValueError(w + ": columns must be >= 0, got " + std::to_string(opt.columns));
  if (opt.cell_px < 0 || opt.cell_px > 1000)
    throw ValueError(w + ": cell_px must be in [0, 1000], got " + std::to_string(opt.cell_px));
}

// The colour scale: the options' ends, else the range of the finite values.
struct Scale {
  double vmin, vmax;
  std::span<const Rgb> stops;
  Rgb colour(double v) const {
    if (std::isnan(v)) return detail::interpolate(stops, v);
    return detail::interpolate(stops, vmax > vmin ? (v - vmin) / (vmax - vmin) : 0.5);
  }
};

Scale colour_scale(const char* what, const std::vector<HeatMap>& maps,
                   const PictureOptions& opt) {
  double lo = INFINITY, hi = -INFINITY;
  for (const HeatMap& m : maps)
    for (int64_t i = 0; i < m.values.numel(); ++i)
      if (std::isfinite(m.values[i])) {
        lo = std::min(lo, m.values[i]);
        hi = std::max(hi, m.values[i]);
      }
  if (lo > hi) lo = 0, hi = 1;  // no finite value at all
  Scale s{opt.vmin.value_or(lo), opt.vmax.value_or(hi), detail::stops_of(opt.colour_map)};
  if (!std::isfinite(s.vmin) || !std::isfinite(s.vmax) || s.vmin > s.vmax)
    throw ValueError(std::string(what) + ": the colour scale needs finite vmin <= vmax, got vmin " +
                     std::to_string(s.vmin) + ", vmax " + std::to_string(s.vmax));
  return s;
}

// Cells shrink as maps grow, so that a picture is a few hundred pixels wide.
int64_t cell_size(const std::vector<HeatMap>& maps, const PictureOptions& opt) {
  if (opt.cell_px > 0) return opt.cell_px;
  int64_t largest = 1;
  for (const HeatMap& m : maps) largest = std::max({largest, rows_of(m), cols_of(m)});
  return std::clamp<int64_t>(320 / largest, 1, 40);
}

int64_t grid_columns(const std::vector<HeatMap>& maps, const PictureOptions& opt) {
  const auto n = static_cast<int64_t>(maps.size());
  if (opt.columns > 0) return std::min(opt.columns, n);
  return static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(n))));
}

std::string format_value(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

bool has_extension(const std::string& path, const char* ext) {
  const size_t n = std::strlen(ext);
  if (path.size() < n) return false;
  for (size_t i = 0; i < n; ++i)
    if (std::tolower(static_cast<unsigned char>(path[path.size() - n + i])) != ext[i])
      return false;
  return true;
}

// ---- Layout, the same for PNG and SVG -------------------------------------

constexpr int64_t kMargin = 10, kGap = 16, kBarWidth = 16, kPad = 4;
constexpr int64_t kTickLength = 4, kTickGap = 2;  // tick marks, and their gap to the cells
constexpr int64_t kLabelGap = kTickGap + kTickLength + 2;  // from the labels to the cells

// How a format measures its text.
struct TextMeasure {
  int64_t line;                                     // the height of a line
  std::function<int64_t(const std::string&)> width;
  std::function<bool(const std::string&)> covers;   // can draw every character
};

enum class Anchor { Start, Middle, End };

// One line of text: `anchor` says which end (or the middle) is at x; y is the
// line's vertical centre. Vertical text reads upwards and is centred at (x, y).
struct Text {
  std::string text, css_class;
  int64_t map;  // the heat map it belongs to; -1: the colour bar
  int64_t x, y;
  Anchor anchor = Anchor::Start;
  bool vertical = false;
  Box box = {};  // where it is drawn, set by lay_out
};

// A tick mark beside the cells of a heat map.
struct TickMark {
  int64_t map;
  Box box;
};

struct Layout {
  Scale scale;
  PictureLayout picture;
  std::vector<Text> texts;
  std::vector<TickMark> tick_marks;
};

// Labels are drawn every `step` cells, the smallest of 1, 2, 5, 10, 20, 50...
// that leaves `spacing` pixels from one label's centre to the next.
int64_t label_step(int64_t cell_px, int64_t spacing) {
  for (int64_t decade = 1;; decade *= 10)
    for (int64_t k : {1, 2, 5})
      if (k * decade * cell_px >= spacing) return k * decade;
}

// The labels of one axis: the map's own, where the font can draw them (else
// the index), or index ticks, every step-th of them.
struct AxisLabels {
  std::vector<int64_t> at;  // cell indices
  std::vector<std::string> text;
  bool ticks = false;
};

AxisLabels axis_labels(const std::vector<std::string>& labels, int64_t count, int64_t cell_px,
                       bool rows, const TextMeasure& measure) {
  AxisLabels a;
  a.ticks = labels.empty();
  std::vector<std::string> text(static_cast<size_t>(count));
  int64_t extent = rows ? measure.line : 0;
  for (int64_t i = 0; i < count; ++i) {
    const bool own = !a.ticks && measure.covers(labels[i]);
    text[i] = own ? labels[i] : std::to_string(i);
    if (!rows) extent = std::max(extent, measure.width(text[i]));
  }
  // Numbers are spaced wider than tokens: a few ticks read better than many.
  const int64_t step = label_step(cell_px, a.ticks ? 2 * extent : extent + kPad);
  for (int64_t i = 0; i < count; i += step) {
    a.at.push_back(i);
    a.text.push_back(text[i]);
  }
  return a;
}

Box extent_of(const Text& t, const TextMeasure& measure) {
  const int64_t w = measure.width(t.text), line = measure.line;
  if (t.vertical) return {t.x - line / 2, t.y - w / 2, t.x - line / 2 + line, t.y - w / 2 + w};
  const int64_t x0 = t.anchor == Anchor::Start    ? t.x
                     : t.anchor == Anchor::Middle ? t.x - w / 2
                                                  : t.x - w;
  return {x0, t.y - line / 2, x0 + w, t.y - line / 2 + line};
}

void grow(Box& box, const Box& by) {
  if (box.x1 <= box.x0) {
    box = by;
    return;
  }
  box = {std::min(box.x0, by.x0), std::min(box.y0, by.y0), std::max(box.x1, by.x1),
         std::max(box.y1, by.y1)};
}

// The texts of map `map` around its cells at (x0, y0): the title, the column
// axis title and the column labels (or ticks) above, the row axis title
// (vertical) and the row labels (or ticks) left of them. `left` and `top` are
// the room they take beside and above the cells.
void lay_out_map(Layout& out, const HeatMap& m, int64_t map, int64_t x0, int64_t y0,
                 int64_t left, int64_t top, const AxisLabels& c, const AxisLabels& r,
                 const TextMeasure& measure) {
  PictureLayout& l = out.picture;
  const int64_t line = measure.line, cell = l.cell_px;
  const int64_t slot_top = y0 - top, cells_w = cols_of(m) * cell;
  l.map_origin.emplace_back(x0, y0);
  PictureLayout::MapText& boxes = l.map_text.emplace_back();
  auto add = [&](Text t, Box& box) {
    t.box = extent_of(t, measure);
    grow(box, t.box);
    out.texts.push_back(std::move(t));
  };
  add({m.title, "title", map, x0, slot_top + line / 2}, boxes.title);
  add({m.col_axis, "col-axis", map, x0 + cells_w / 2, slot_top + line + kPad + line / 2,
       Anchor::Middle},
      boxes.col_axis);
  add({m.row_axis, "row-axis", map, x0 - left + line / 2,
       y0 + std::max(rows_of(m) * cell, measure.width(m.row_axis)) / 2, Anchor::Middle, true},
      boxes.row_axis);
  for (size_t k = 0; k < c.at.size(); ++k) {
    const int64_t x = x0 + c.at[k] * cell + cell / 2;
    add({c.text[k], c.ticks ? "col-tick" : "col-label", map, x,
         slot_top + 2 * line + kPad + line / 2, Anchor::Middle},
        boxes.col_labels);
    if (c.ticks)
      out.tick_marks.push_back({map, {x, y0 - kTickGap - kTickLength, x + 1, y0 - kTickGap}});
  }
  for (size_t k = 0; k < r.at.size(); ++k) {
    const int64_t y = y0 + r.at[k] * cell + cell / 2;
    add({r.text[k], r.ticks ? "row-tick" : "row-label", map, x0 - kLabelGap, y, Anchor::End},
        boxes.row_labels);
    if (r.ticks)
      out.tick_marks.push_back({map, {x0 - kTickGap - kTickLength, y, x0 - kTickGap, y + 1}});
  }
}

// The colour bar right of the grid (grid_w x grid_h, its cells `top` below
// the margin), the scale's ends and middle beside it, its title; and so the
// picture's size.
void lay_out_colour_bar(Layout& out, const Scale& scale, const PictureOptions& opt,
                        int64_t grid_w, int64_t grid_h, int64_t top, const TextMeasure& measure) {
  PictureLayout& l = out.picture;
  const int64_t line = measure.line;
  l.bar_x = kMargin + grid_w + kGap;
  l.bar_y = kMargin + top;
  l.bar_width = kBarWidth;
  l.bar_height = std::max(grid_h - top - line / 2, 3 * line);
  const int64_t label_x = l.bar_x + kBarWidth + 6;
  int64_t labels_w = 0;
  Box bar_labels;
  for (const auto& [value, y] : {std::pair{scale.vmax, l.bar_y},
                                 {(scale.vmin + scale.vmax) / 2, l.bar_y + l.bar_height / 2},
                                 {scale.vmin, l.bar_y + l.bar_height - 1}}) {
    Text t{format_value(value), "bar-label", -1, label_x, y};
    t.box = extent_of(t, measure);
    grow(bar_labels, t.box);
    labels_w = std::max(labels_w, measure.width(t.text));
    out.texts.push_back(std::move(t));
  }
  int64_t right = label_x + labels_w, bottom = std::max(kMargin + grid_h, bar_labels.y1);
  if (!opt.scale_title.empty()) {
    const int64_t w = measure.width(opt.scale_title);
    Text t{opt.scale_title, "scale-title", -1, right + 6 + line / 2,
           std::max(l.bar_y + l.bar_height / 2, kMargin + w / 2), Anchor::Middle, true};
    l.scale_title = t.box = extent_of(t, measure);
    out.texts.push_back(std::move(t));
    right = l.scale_title.x1;
    bottom = std::max(bottom, l.scale_title.y1);
  }
  l.width = right + kMargin;
  l.height = bottom + kMargin;
}

// The maps in a grid of equal slots, each laid out by lay_out_map, the colour
// bar right of the grid.
Layout lay_out(const char* what, const std::vector<HeatMap>& maps, const PictureOptions& opt,
               const TextMeasure& measure) {
  validate(what, maps, opt);
  Layout out;
  out.scale = colour_scale(what, maps, opt);
  const Scale& scale = out.scale;
  PictureLayout& l = out.picture;
  l.cell_px = cell_size(maps, opt);
  l.line_height = measure.line;
  const int64_t line = measure.line, cell = l.cell_px;

  std::vector<AxisLabels> row_labels, col_labels;
  int64_t row_label_w = 0, cells_h = 0;
  for (const HeatMap& m : maps) {
    row_labels.push_back(axis_labels(m.row_labels, rows_of(m), cell, true, measure));
    col_labels.push_back(axis_labels(m.col_labels, cols_of(m), cell, false, measure));
    for (const auto& t : row_labels.back().text)
      row_label_w = std::max(row_label_w, measure.width(t));
    cells_h = std::max({cells_h, rows_of(m) * cell, measure.width(m.row_axis)});
  }
  const int64_t left = line + kPad + row_label_w + kLabelGap;
  const int64_t top = 3 * line + kPad + kLabelGap;
  int64_t slot_w = 0;
  for (const HeatMap& m : maps)
    slot_w = std::max({slot_w, left + cols_of(m) * cell, left + measure.width(m.title),
                       left + measure.width(m.col_axis)});
  const int64_t slot_h = top + cells_h + line / 2;  // room for the last row label
  const int64_t cols = grid_columns(maps, opt);
  const int64_t rows = (static_cast<int64_t>(maps.size()) + cols - 1) / cols;
  for (size_t i = 0; i < maps.size(); ++i) {
    const auto map = static_cast<int64_t>(i);
    lay_out_map(out, maps[i], map, kMargin + map % cols * (slot_w + kGap) + left,
                kMargin + map / cols * (slot_h + kGap) + top, left, top, col_labels[i],
                row_labels[i], measure);
  }
  lay_out_colour_bar(out, scale, opt, cols * slot_w + (cols - 1) * kGap,
                     rows * slot_h + (rows - 1) * kGap, top, measure);
  return out;
}

// ---- PNG ----------------------------------------------------------------

constexpr int kPngFontPx = 16;

TextMeasure png_measure(const detail::PngFont& font) {
  return {font.line_height(), [&font](const std::string& s) { return font.width(s); },
          [&font](const std::string& s) { return font.covers(s); }};
}

Layout png_lay_out(const std::vector<HeatMap>& maps, const PictureOptions& options,
                   const detail::PngFont& font) {
  Layout layout = lay_out("write_png", maps, options, png_measure(font));
  const PictureLayout& l = layout.picture;
  if (l.width > kMaxPngSide || l.height > kMaxPngSide)
    throw ValueError("write_png: the picture would be " + std::to_string(l.width) + " x " +
                     std::to_string(l.height) + " pixels, more than " +
                     std::to_string(kMaxPngSide) + " on a side; draw fewer or smaller maps");
  return layout;
}

class Image {
 public:
  Image(int64_t width, int64_t height)
      : width_(width), height_(height), rgb_(static_cast<size_t>(width * height * 3), 255) {}

  void fill(const Box& b, Rgb c) {
    for (int64_t y = std::max<int64_t>(b.y0, 0); y < std::min(b.y1, height_); ++y)
      for (int64_t x = std::max<int64_t>(b.x0, 0); x < std::min(b.x1, width_); ++x) {
        uint8_t* p = &rgb_[static_cast<size_t>((y * width_ + x) * 3)];
        p[0] = c.r, p[1] = c.g, p[2] = c.b;
      }
  }

  // Blends text in colour c over the image, its top-left corner at (x, y);
  // vertical text is turned a quarter left, to read upwards.
  void blend(const detail::TextMask& mask, int64_t x, int64_t y, bool vertical, Rgb c) {
    for (int64_t my = 0; my < mask.height; ++my)
      for (int64_t mx = 0; mx < mask.width; ++mx) {
        const int ink = mask.coverage[static_cast<size_t>(my * mask.width + mx)];
        const int64_t px = vertical ? x + my : x + mx,
                      py = vertical ? y + mask.width - 1 - mx : y + my;
        if (ink == 0 || px < 0 || px >= width_ || py < 0 || py >= height_) continue;
        uint8_t* p = &rgb_[static_cast<size_t>((py * width_ + px) * 3)];
        auto mix = [ink](uint8_t under, uint8_t over) {
          return static_cast<uint8_t>((under * (255 - ink) + over * ink + 127) / 255);
        };
        p[0] = mix(p[0], c.r), p[1] = mix(p[1], c.g), p[2] = mix(p[2], c.b);
      }
  }

  // The PNG file's bytes (stb writes them to memory; write_file saves them).
  std::string png() const {
    const auto w = static_cast<int>(width_), h = static_cast<int>(height_);
    std::string bytes;
    const auto append = [](void* out, void* data, int size) {
      static_cast<std::string*>(out)->append(static_cast<const char*>(data),
                                             static_cast<size_t>(size));
    };
    if (!stbi_write_png_to_func(append, &bytes, w, h, 3, rgb_.data(), w * 3))
      throw ValueError("write_png: stb could not encode the " + std::to_string(w) + " x " +
                       std::to_string(h) + " picture");
    return bytes;
  }

 private:
  int64_t width_, height_;
  std::vector<uint8_t> rgb_;
};

// ---- SVG ----------------------------------------------------------------

constexpr int64_t kFontPx = 14;
// Chinese (and Japanese, Korean) tokens need a CJK font: list the common
// ones on Linux, macOS and Windows before the generic family.
constexpr const char* kFontFamily =
    "'Noto Sans CJK SC', 'Source Han Sans SC', 'WenQuanYi Zen Hei', 'WenQuanYi Micro Hei', "
    "'PingFang SC', 'Hiragino Sans GB', 'Microsoft YaHei', 'DejaVu Sans', sans-serif";

std::string hex(Rgb c) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", c.r, c.g, c.b);
  return buf;
}

// Approximate width of a label: a wide (CJK) character takes about one em,
// an ASCII one about 0.6 em.
int64_t label_width(const std::string& s, int64_t font_px) {
  double em = 0;
  for (unsigned char c : s)
    if (c < 0x80) em += 0.6;
    else if ((c & 0xC0) != 0x80) em += 1.0;
  return static_cast<int64_t>(std::ceil(em * font_px));
}

std::string cell_tooltip(const HeatMap& m, int64_t r, int64_t c, double v) {
  auto part = [](const std::string& axis, int64_t i, const std::vector<std::string>& labels) {
    return axis + " " + std::to_string(i) + (labels.empty() ? "" : " " + labels[i]);
  };
  return part(m.row_axis, r, m.row_labels) + ", " + part(m.col_axis, c, m.col_labels) + ": " +
         format_value(v);
}

void svg_text(std::ostringstream& o, const Text& t) {
  const char* anchor = t.anchor == Anchor::Start    ? "start"
                       : t.anchor == Anchor::Middle ? "middle"
                                                    : "end";
  o << "<text class=\"" << t.css_class << "\" x=\"" << t.x << "\" y=\"" << t.y
    << "\" text-anchor=\"" << anchor << "\" dominant-baseline=\"central\"";
  if (t.vertical) o << " transform=\"rotate(-90 " << t.x << ' ' << t.y << ")\"";
  if (t.css_class == "title") o << " font-weight=\"bold\"";
  o << '>' << detail::xml_escape(t.text) << "</text>\n";
}

}  // namespace


PictureLayout png_layout(const std::vector<HeatMap>& maps, const PictureOptions& options) {
  const detail::PngFont font(options.png_font, kPngFontPx);
  return png_lay_out(maps, options, font).picture;
}

std::string encode_png(const std::vector<HeatMap>& maps, const PictureOptions& options) {
  const detail::PngFont font(options.png_font, kPngFontPx);
  const Layout layout = png_lay_out(maps, options, font);
  const PictureLayout& l = layout.picture;
  const Scale& s = layout.scale;
  Image img(l.width, l.height);
  for (size_t i = 0; i < maps.size(); ++i) {
    const HeatMap& m = maps[i];
    const auto [x0, y0] = l.map_origin[i];
    for (int64_t r = 0; r < rows_of(m); ++r)
      for (int64_t c = 0; c < cols_of(m); ++c)
        img.fill({x0 + c * l.cell_px, y0 + r * l.cell_px, x0 + (c + 1) * l.cell_px,
                  y0 + (r + 1) * l.cell_px},
                 s.colour(m.values[r * cols_of(m) + c]));
  }
  for (const TickMark& mark : layout.tick_marks) img.fill(mark.box, kBlack);
  for (const Text& t : layout.texts) img.blend(font.render(t.text), t.box.x0, t.box.y0, t.vertical, kBlack);
  // The bar runs from vmax (top row) to vmin (bottom row).
  for (int64_t j = 0; j < l.bar_height; ++j)
    img.fill({l.bar_x, l.bar_y + j, l.bar_x + l.bar_width, l.bar_y + j + 1},
             detail::interpolate(s.stops, 1.0 - static_cast<double>(j) / double(l.bar_height - 1)));
  return img.png();
}

std::string encode_svg(const std::vector<HeatMap>& maps, const PictureOptions& options) {
  validate("write_svg", maps, options);
  for (size_t i = 0; i < maps.size(); ++i) {
    const HeatMap& m = maps[i];
    const std::string of = " of heat map " + std::to_string(i);
    // The labels first: a title made of them then names the label itself.
    for (size_t r = 0; r < m.row_labels.size(); ++r)
      detail::check_xml_text("row label " + std::to_string(r) + of, m.row_labels[r]);
    for (size_t c = 0; c < m.col_labels.size(); ++c)
      detail::check_xml_text("column label " + std::to_string(c) + of, m.col_labels[c]);
    detail::check_xml_text("the title" + of, m.title);
    detail::check_xml_text("the row axis" + of, m.row_axis);
    detail::check_xml_text("the column axis" + of, m.col_axis);
  }
  detail::check_xml_text("the scale's title", options.scale_title);
  int64_t cells = 0;
  for (const HeatMap& m : maps) cells += m.values.numel();
  if (cells > kMaxSvgCells)
    throw ValueError("write_svg: " + std::to_string(cells) + " cells are more than " +
                     std::to_string(kMaxSvgCells) + " (one <rect> each); write a .png instead");
  const TextMeasure measure{kFontPx + 6,
                            [](const std::string& s) { return label_width(s, kFontPx); },
                            [](const std::string&) { return true; }};
  const Layout layout = lay_out("write_svg", maps, options, measure);
  const PictureLayout& l = layout.picture;
  const Scale& s = layout.scale;

  std::ostringstream o;
  o << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << l.width << "\" height=\""
    << l.height << "\" viewBox=\"0 0 " << l.width << ' ' << l.height << "\" font-family=\""
    << kFontFamily << "\" font-size=\"" << kFontPx << "\">\n"
    << "<defs><linearGradient id=\"colour-map\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">";
  for (size_t k = 0; k < s.stops.size(); ++k)
    o << "<stop offset=\"" << format_value(double(k) / double(s.stops.size() - 1))
      << "\" stop-color=\"" << hex(s.stops[k]) << "\"/>";
  o << "</linearGradient></defs>\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  for (size_t i = 0; i < maps.size(); ++i) {
    const HeatMap& m = maps[i];
    const auto [x0, y0] = l.map_origin[i];
    o << "<g class=\"heatmap\">\n";
    for (const Text& t : layout.texts)
      if (t.map == static_cast<int64_t>(i)) svg_text(o, t);
    o << "<g shape-rendering=\"crispEdges\">\n";
    for (const auto& [map, b] : layout.tick_marks)
      if (map == static_cast<int64_t>(i))
        o << "<rect class=\"tick\" x=\"" << b.x0 << "\" y=\"" << b.y0 << "\" width=\""
          << b.x1 - b.x0 << "\" height=\"" << b.y1 - b.y0 << "\"/>\n";
    for (int64_t r = 0; r < rows_of(m); ++r)
      for (int64_t c = 0; c < cols_of(m); ++c) {
        const double v = m.values[r * cols_of(m) + c];
        o << "<rect class=\"cell\" x=\"" << x0 + c * l.cell_px << "\" y=\"" << y0 + r * l.cell_px
          << "\" width=\"" << l.cell_px << "\" height=\"" << l.cell_px << "\" fill=\""
          << hex(s.colour(v)) << "\"><title>" << detail::xml_escape(cell_tooltip(m, r, c, v))
          << "</title></rect>\n";
      }
    o << "</g>\n</g>\n";
  }
  o << "<g class=\"colour-bar\">\n<rect x=\"" << l.bar_x << "\" y=\"" << l.bar_y << "\" width=\""
    << l.bar_width << "\" height=\"" << l.bar_height << "\" fill=\"url(#colour-map)\"/>\n";
  for (const Text& t : layout.texts)
    if (t.map < 0) svg_text(o, t);
  o << "</g>\n</svg>\n";
  return o.str();
}

std::string encode_picture(const std::string& path, const std::vector<HeatMap>& maps,
                           const PictureOptions& options) {
  if (has_extension(path, ".png")) return encode_png(maps, options);
  if (has_extension(path, ".svg")) return encode_svg(maps, options);
  throw ValueError("write_picture: '" + path + "' does not end in .png or .svg");
}

void write_png(const std::string& path, const std::vector<HeatMap>& maps,
               const PictureOptions& options) {
  write_file(path, {encode_png(maps, options)});
}

void write_svg(const std::string& path, const std::vector<HeatMap>& maps,
               const PictureOptions& options) {
  write_file(path, {encode_svg(maps, options)});
}

void write_picture(const std::string& path, const std::vector<HeatMap>& maps,
                   const PictureOptions& options) {
  write_file(path, {encode_picture(path, maps, options)});
}

}  // namespace attn
