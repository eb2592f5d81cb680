#include "picture/png_text.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "companion/utf8.hpp"

// stb's ASCII font: static functions, not all of them used here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include <stb_easy_font.h>
#pragma GCC diagnostic pop

namespace attn::detail {
namespace {

constexpr int kBuiltinScale = 2;  // stb_easy_font units -> pixels
// A font file larger than this is not read (fonts with all of CJK are ~20 MB).
constexpr std::uintmax_t kMaxFontBytes = 64u << 20;

// stb_easy_font draws ASCII only: one '?' for each other character.
std::string builtin_text(const std::string& s) {
  std::string out;
  for (unsigned char c : s)
    if (c < 0x80)
      out += (c >= 32 && c < 127) ? static_cast<char>(c) : ' ';
    else if ((c & 0xC0) != 0x80)
      out += '?';
  return out;
}

int64_t builtin_width(std::string ascii) {
  return int64_t{stb_easy_font_width(ascii.data())} * kBuiltinScale;
}

std::vector<unsigned char> read_font(const std::string& file) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (file.empty() || !fs::is_regular_file(file, error)) return {};
  const std::uintmax_t size = fs::file_size(file, error);
  if (error || size == 0 || size > kMaxFontBytes) return {};
  std::vector<unsigned char> data(size);
  std::ifstream f(file, std::ios::binary);
  if (!f.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(size))) return {};
  return data;
}

}  // namespace

PngFont::PngFont(const std::string& file, int pixel_height) : data_(read_font(file)) {
  const int offset = data_.empty() ? -1 : stbtt_GetFontOffsetForIndex(data_.data(), 0);
  if (offset < 0 || !stbtt_InitFont(&info_, data_.data(), offset)) {
    data_.clear();
    line_ = 12 * kBuiltinScale;  // stb_easy_font's line
    return;
  }
  scale_ = stbtt_ScaleForPixelHeight(&info_, static_cast<float>(pixel_height));
  int ascent = 0, descent = 0, gap = 0;
  stbtt_GetFontVMetrics(&info_, &ascent, &descent, &gap);
  baseline_ = std::lround(ascent * scale_);
  line_ = std::lround((ascent - descent + gap) * scale_);
}

bool PngFont::covers(const std::string& utf8) const {
  std::vector<char32_t> text;
  if (!decode_utf8(utf8, text)) return false;
  return std::all_of(text.begin(), text.end(), [&](char32_t c) {
    return is_truetype() ? stbtt_FindGlyphIndex(&info_, static_cast<int>(c)) != 0
                         : c >= 32 && c < 127;
  });
}

int64_t PngFont::width(const std::string& utf8) const {
  if (!is_truetype()) return builtin_width(builtin_text(utf8));
  int64_t width = 0;
  place(utf8, width);
  return width;
}

std::vector<PngFont::Placed> PngFont::place(const std::string& utf8, int64_t& width) const {
  std::vector<char32_t> text;
  if (!decode_utf8(utf8, text)) {
    const std::string shown = builtin_text(utf8);
    text.assign(shown.begin(), shown.end());
  }
  std::vector<Placed> placed;
  float x = 0;
  width = 0;
  for (char32_t c : text) {
    Placed p{stbtt_FindGlyphIndex(&info_, static_cast<int>(c)), 0, 0, 0, 0, 0};
    if (!placed.empty())
      x += scale_ *
           static_cast<float>(stbtt_GetGlyphKernAdvance(&info_, placed.back().glyph, p.glyph));
    p.pen = x;
    stbtt_GetGlyphBitmapBoxSubpixel(&info_, p.glyph, scale_, scale_, x - std::floor(x), 0, &p.x0,
                                    &p.y0, &p.x1, &p.y1);
    int advance = 0, bearing = 0;
    stbtt_GetGlyphHMetrics(&info_, p.glyph, &advance, &bearing);
    x += scale_ * static_cast<float>(advance);
    width = std::max(width, static_cast<int64_t>(std::floor(p.pen)) + p.x1);
    placed.push_back(p);
  }
  width = std::max(width, static_cast<int64_t>(std::ceil(x)));
  return placed;
}

TextMask PngFont::render(const std::string& utf8) const {
  TextMask mask;
  mask.height = line_;
  if (!is_truetype()) {
    // stb_easy_font builds each glyph from axis-aligned quads: fill them.
    std::string text = builtin_text(utf8);
    mask.width = builtin_width(text);
    mask.coverage.assign(static_cast<size_t>(mask.width * mask.height), 0);
    std::vector<char> quads(text.size() * 1024 + 64);
    const int n = stb_easy_font_print(0, 0, text.data(), nullptr, quads.data(),
                                      static_cast<int>(quads.size()));
    for (int q = 0; q < n; ++q) {
      float v[2][2];  // top-left and bottom-right vertices (the 1st and 3rd of 16 bytes each)
      std::memcpy(v[0], &quads[q * 64], 2 * sizeof(float));
      std::memcpy(v[1], &quads[q * 64 + 32], 2 * sizeof(float));
      const auto x0 = std::max<int64_t>(std::lround(v[0][0] * kBuiltinScale), 0);
      const auto y0 = std::max<int64_t>(std::lround(v[0][1] * kBuiltinScale), 0);
      const auto x1 = std::min<int64_t>(std::lround(v[1][0] * kBuiltinScale), mask.width);
      const auto y1 = std::min<int64_t>(std::lround(v[1][1] * kBuiltinScale), mask.height);
      for (int64_t y = y0; y < y1; ++y)
        std::fill_n(&mask.coverage[static_cast<size_t>(y * mask.width + x0)],
                    std::max<int64_t>(x1 - x0, 0), 255);
    }
    return mask;
  }
  // Each glyph's bitmap at its sub-pixel offset, merged by the larger
  // coverage where glyphs touch.
  const std::vector<Placed> placed = place(utf8, mask.width);
  mask.coverage.assign(static_cast<size_t>(mask.width * mask.height), 0);
  std::vector<unsigned char> bitmap;
  for (const Placed& p : placed) {
    const int w = p.x1 - p.x0, h = p.y1 - p.y0;
    if (w <= 0 || h <= 0) continue;
    bitmap.assign(static_cast<size_t>(w) * h, 0);
    stbtt_MakeGlyphBitmapSubpixel(&info_, bitmap.data(), w, h, w, scale_, scale_,
                                  p.pen - std::floor(p.pen), 0, p.glyph);
    const int64_t left = static_cast<int64_t>(std::floor(p.pen)) + p.x0, top = baseline_ + p.y0;
    for (int r = 0; r < h; ++r)
      for (int c = 0; c < w; ++c) {
        const int64_t mx = left + c, my = top + r;
        if (mx < 0 || mx >= mask.width || my < 0 || my >= mask.height) continue;
        uint8_t& ink = mask.coverage[static_cast<size_t>(my * mask.width + mx)];
        ink = std::max(ink, bitmap[static_cast<size_t>(r) * w + c]);
      }
  }
  return mask;
}

}  // namespace attn::detail
