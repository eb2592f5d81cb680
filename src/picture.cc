#include "attn/picture.hpp"

#include <stb_image_write.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "attn/file.hpp"

// stb's ASCII font: static functions, not all of them used here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include <stb_easy_font.h>
#pragma GCC diagnostic pop

namespace attn {
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
  Rgb colour(double v) const {
    if (std::isnan(v)) return viridis(v);
    return viridis(vmax > vmin ? (v - vmin) / (vmax - vmin) : 0.5);
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
  Scale s{opt.vmin.value_or(lo), opt.vmax.value_or(hi)};
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

// ---- PNG ----------------------------------------------------------------

constexpr int kTextScale = 2;                 // stb_easy_font units -> pixels
constexpr int64_t kLine = 12 * kTextScale;    // one line of stb_easy_font
constexpr int64_t kMargin = 10, kGap = 16, kBarWidth = 16;

// stb_easy_font draws ASCII only: other bytes become '?'.
std::string ascii(const std::string& s) {
  std::string out;
  for (unsigned char c : s)
    if (c < 0x80) out += (c >= 32 && c < 127) ? static_cast<char>(c) : ' ';
    else if ((c & 0xC0) != 0x80) out += '?';  // one '?' per UTF-8 character
  return out;
}

int64_t text_width(const std::string& s) {
  std::string text = ascii(s);
  return int64_t{stb_easy_font_width(text.data())} * kTextScale;
}

class Image {
 public:
  Image(int64_t width, int64_t height)
      : width_(width), height_(height), rgb_(static_cast<size_t>(width * height * 3), 255) {}

  void fill(int64_t x0, int64_t y0, int64_t x1, int64_t y1, Rgb c) {
    x0 = std::max<int64_t>(x0, 0), y0 = std::max<int64_t>(y0, 0);
    x1 = std::min(x1, width_), y1 = std::min(y1, height_);
    for (int64_t y = y0; y < y1; ++y)
      for (int64_t x = x0; x < x1; ++x) {
        uint8_t* p = &rgb_[static_cast<size_t>((y * width_ + x) * 3)];
        p[0] = c.r, p[1] = c.g, p[2] = c.b;
      }
  }

  // stb_easy_font builds each glyph from axis-aligned quads: fill them.
  void text(int64_t x, int64_t y, const std::string& s, Rgb c) {
    std::string t = ascii(s);
    std::vector<char> quads(t.size() * 1024 + 64);
    const int n = stb_easy_font_print(0, 0, t.data(), nullptr, quads.data(),
                                      static_cast<int>(quads.size()));
    for (int q = 0; q < n; ++q) {
      float v[2][2];  // top-left and bottom-right vertices (the 1st and 3rd of 16 bytes each)
      std::memcpy(v[0], &quads[q * 64], 2 * sizeof(float));
      std::memcpy(v[1], &quads[q * 64 + 32], 2 * sizeof(float));
      fill(x + std::lround(v[0][0] * kTextScale), y + std::lround(v[0][1] * kTextScale),
           x + std::lround(v[1][0] * kTextScale), y + std::lround(v[1][1] * kTextScale), c);
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
    "'Noto Sans CJK SC', 'Source Han Sans SC', 'WenQuanYi Zen Hei', 'PingFang SC', "
    "'Hiragino Sans GB', 'Microsoft YaHei', 'DejaVu Sans', sans-serif";

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  return out;
}

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

}  // namespace

Rgb viridis(double t) {
  if (std::isnan(t)) return {128, 128, 128};
  const double x = std::clamp(t, 0.0, 1.0) * (kViridis.size() - 1);
  const size_t k = std::min(static_cast<size_t>(x), kViridis.size() - 2);
  const double f = x - static_cast<double>(k);
  auto mix = [f](uint8_t a, uint8_t b) {
    return static_cast<uint8_t>(std::lround(a + (b - a) * f));
  };
  const Rgb a = kViridis[k], b = kViridis[k + 1];
  return {mix(a.r, b.r), mix(a.g, b.g), mix(a.b, b.b)};
}

PngLayout png_layout(const std::vector<HeatMap>& maps, const PictureOptions& options) {
  validate("write_png", maps, options);
  PngLayout l;
  l.cell_px = cell_size(maps, options);
  int64_t slot_w = 0, slot_h = 0;
  for (const HeatMap& m : maps) {
    slot_w = std::max({slot_w, cols_of(m) * l.cell_px, text_width(m.title)});
    slot_h = std::max(slot_h, kLine + rows_of(m) * l.cell_px);
  }
  const int64_t cols = grid_columns(maps, options);
  const int64_t rows = (static_cast<int64_t>(maps.size()) + cols - 1) / cols;
  const int64_t grid_w = cols * slot_w + (cols - 1) * kGap;
  const int64_t grid_h = rows * slot_h + (rows - 1) * kGap;
  for (size_t i = 0; i < maps.size(); ++i) {
    const auto r = static_cast<int64_t>(i) / cols, c = static_cast<int64_t>(i) % cols;
    l.map_origin.emplace_back(kMargin + c * (slot_w + kGap), kMargin + r * (slot_h + kGap) + kLine);
  }
  const Scale s = colour_scale("write_png", maps, options);
  l.bar_x = kMargin + grid_w + kGap;
  l.bar_y = kMargin + kLine;
  l.bar_width = kBarWidth;
  l.bar_height = std::max(grid_h - kLine, 2 * kLine);
  const int64_t labels_w =
      std::max(text_width(format_value(s.vmax)), text_width(format_value(s.vmin)));
  l.width = l.bar_x + l.bar_width + 6 + labels_w + kMargin;
  l.height = std::max(kMargin + grid_h, l.bar_y + l.bar_height + kLine / 2) + kMargin;
  if (l.width > kMaxPngSide || l.height > kMaxPngSide)
    throw ValueError("write_png: the picture would be " + std::to_string(l.width) + " x " +
                     std::to_string(l.height) + " pixels, more than " +
                     std::to_string(kMaxPngSide) + " on a side; draw fewer or smaller maps");
  return l;
}

std::string encode_png(const std::vector<HeatMap>& maps, const PictureOptions& options) {
  const PngLayout l = png_layout(maps, options);
  const Scale s = colour_scale("write_png", maps, options);
  Image img(l.width, l.height);
  for (size_t i = 0; i < maps.size(); ++i) {
    const HeatMap& m = maps[i];
    const auto [x0, y0] = l.map_origin[i];
    img.text(x0, y0 - kLine, m.title, kBlack);
    for (int64_t r = 0; r < rows_of(m); ++r)
      for (int64_t c = 0; c < cols_of(m); ++c)
        img.fill(x0 + c * l.cell_px, y0 + r * l.cell_px, x0 + (c + 1) * l.cell_px,
                 y0 + (r + 1) * l.cell_px, s.colour(m.values[r * cols_of(m) + c]));
  }
  // The bar runs from vmax (top row) to vmin (bottom row).
  for (int64_t j = 0; j < l.bar_height; ++j)
    img.fill(l.bar_x, l.bar_y + j, l.bar_x + l.bar_width, l.bar_y + j + 1,
             viridis(1.0 - static_cast<double>(j) / static_cast<double>(l.bar_height - 1)));
  const int64_t label_x = l.bar_x + l.bar_width + 6;
  img.text(label_x, l.bar_y, format_value(s.vmax), kBlack);
  img.text(label_x, l.bar_y + l.bar_height - kLine / 2, format_value(s.vmin), kBlack);
  return img.png();
}

std::string encode_svg(const std::vector<HeatMap>& maps, const PictureOptions& options) {
  validate("write_svg", maps, options);
  int64_t cells = 0;
  for (const HeatMap& m : maps) cells += m.values.numel();
  if (cells > kMaxSvgCells)
    throw ValueError("write_svg: " + std::to_string(cells) + " cells are more than " +
                     std::to_string(kMaxSvgCells) + " (one <rect> each); write a .png instead");
  const Scale s = colour_scale("write_svg", maps, options);
  const int64_t cell = cell_size(maps, options);
  const int64_t label_px = std::clamp<int64_t>(cell - 4, 8, kFontPx);

  // Every slot of the grid: title, column labels, then row labels beside the cells.
  int64_t label_w = 0, col_label_h = 0, slot_w = 0, grid_cells_h = 0;
  for (const HeatMap& m : maps) {
    for (const auto& t : m.row_labels) label_w = std::max(label_w, label_width(t, label_px) + 6);
    if (!m.col_labels.empty()) col_label_h = label_px + 6;
    grid_cells_h = std::max(grid_cells_h, rows_of(m) * cell);
  }
  for (const HeatMap& m : maps)
    slot_w = std::max({slot_w, label_w + cols_of(m) * cell, label_width(m.title, kFontPx)});
  const int64_t title_h = kFontPx + 8;
  const int64_t slot_h = title_h + col_label_h + grid_cells_h;
  const int64_t cols = grid_columns(maps, options);
  const int64_t rows = (static_cast<int64_t>(maps.size()) + cols - 1) / cols;
  const int64_t grid_w = cols * slot_w + (cols - 1) * kGap;
  const int64_t grid_h = rows * slot_h + (rows - 1) * kGap;
  const int64_t bar_x = kMargin + grid_w + kGap, bar_y = kMargin + title_h + col_label_h;
  const int64_t bar_h = std::max<int64_t>(grid_h - title_h - col_label_h, 3 * kFontPx);
  const std::string vmax = format_value(s.vmax), vmin = format_value(s.vmin);
  const int64_t width = bar_x + kBarWidth + 6 +
                        std::max(label_width(vmax, kFontPx), label_width(vmin, kFontPx)) + kMargin;
  const int64_t height = std::max(kMargin + grid_h, bar_y + bar_h) + kMargin;

  std::ostringstream o;
  o << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" viewBox=\"0 0 " << width << ' ' << height << "\" font-family=\"" << kFontFamily
    << "\" font-size=\"" << kFontPx << "\">\n"
    << "<defs><linearGradient id=\"viridis\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">";
  for (size_t k = 0; k < kViridis.size(); ++k)
    o << "<stop offset=\"" << format_value(double(k) / double(kViridis.size() - 1))
      << "\" stop-color=\"" << hex(kViridis[k]) << "\"/>";
  o << "</linearGradient></defs>\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  for (size_t i = 0; i < maps.size(); ++i) {
    const HeatMap& m = maps[i];
    const int64_t sx = kMargin + static_cast<int64_t>(i) % cols * (slot_w + kGap);
    const int64_t sy = kMargin + static_cast<int64_t>(i) / cols * (slot_h + kGap);
    const int64_t x0 = sx + label_w, y0 = sy + title_h + col_label_h;
    o << "<g class=\"heatmap\">\n<text class=\"title\" x=\"" << x0 << "\" y=\"" << sy + kFontPx
      << "\" font-weight=\"bold\">" << xml_escape(m.title) << "</text>\n";
    for (size_t c = 0; c < m.col_labels.size(); ++c)
      o << "<text class=\"col-label\" x=\"" << x0 + static_cast<int64_t>(c) * cell + cell / 2
        << "\" y=\"" << y0 - 6 << "\" font-size=\"" << label_px << "\" text-anchor=\"middle\">"
        << xml_escape(m.col_labels[c]) << "</text>\n";
    for (size_t r = 0; r < m.row_labels.size(); ++r)
      o << "<text class=\"row-label\" x=\"" << x0 - 6 << "\" y=\""
        << y0 + static_cast<int64_t>(r) * cell + cell / 2 << "\" font-size=\"" << label_px
        << "\" text-anchor=\"end\" dominant-baseline=\"central\">"
        << xml_escape(m.row_labels[r]) << "</text>\n";
    o << "<g shape-rendering=\"crispEdges\">\n";
    for (int64_t r = 0; r < rows_of(m); ++r)
      for (int64_t c = 0; c < cols_of(m); ++c) {
        const double v = m.values[r * cols_of(m) + c];
        o << "<rect class=\"cell\" x=\"" << x0 + c * cell << "\" y=\"" << y0 + r * cell
          << "\" width=\"" << cell << "\" height=\"" << cell << "\" fill=\""
          << hex(s.colour(v)) << "\"><title>" << xml_escape(cell_tooltip(m, r, c, v))
          << "</title></rect>\n";
      }
    o << "</g>\n</g>\n";
  }
  o << "<g class=\"colour-bar\">\n<rect x=\"" << bar_x << "\" y=\"" << bar_y << "\" width=\""
    << kBarWidth << "\" height=\"" << bar_h << "\" fill=\"url(#viridis)\"/>\n"
    << "<text x=\"" << bar_x + kBarWidth + 6 << "\" y=\"" << bar_y + kFontPx << "\">" << vmax
    << "</text>\n<text x=\"" << bar_x + kBarWidth + 6 << "\" y=\"" << bar_y + bar_h << "\">"
    << vmin << "</text>\n</g>\n</svg>\n";
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
