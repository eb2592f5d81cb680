// Internal: text in PNG pictures, as coverage masks to blend into the image.
// A TrueType font (through stb_truetype) draws any character it has, CJK
// included; without one, stb's built-in ASCII font draws ASCII only.
#pragma once

#include <stb_truetype.h>

#include <cstdint>
#include <string>
#include <vector>

namespace attn::detail {

// Ink of drawn text, 0 (none) to 255 (full), row-major.
struct TextMask {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> coverage;
};

class PngFont {
 public:
  // The first face of the TrueType font or collection in `file`, `pixel_height`
  // pixels high; the built-in font when `file` is empty or cannot be read or
  // parsed as a font (pictures then still come out, with ASCII text).
  PngFont(const std::string& file, int pixel_height);
  PngFont(const PngFont&) = delete;  // info_ points into data_
  PngFont& operator=(const PngFont&) = delete;

  bool is_truetype() const { return !data_.empty(); }
  int64_t line_height() const { return line_; }
  // Whether every character of the UTF-8 text has a glyph (invalid UTF-8: no).
  bool covers(const std::string& utf8) const;
  int64_t width(const std::string& utf8) const;
  // line_height() high, width() wide; a character without a glyph shows as
  // the font's missing-glyph box (the built-in font: '?').
  TextMask render(const std::string& utf8) const;

 private:
  // Where each glyph of a TrueType text goes, and the text's width.
  struct Placed {
    int glyph;
    float pen;           // its origin on the baseline
    int x0, y0, x1, y1;  // its bitmap's box, relative to the pen
  };
  std::vector<Placed> place(const std::string& utf8, int64_t& width) const;

  std::vector<unsigned char> data_;  // the font file; empty for the built-in font
  stbtt_fontinfo info_{};
  float scale_ = 0;
  int64_t line_ = 0, baseline_ = 0;
};

}  // namespace attn::detail
