// Pictures: viridis against matplotlib's values, PNG files decoded back with
// stb_image, and the errors.
#include <gtest/gtest.h>
#include <stb_image.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "companion/picture.hpp"
#include "helpers.hpp"

namespace attn {
namespace {

namespace fs = std::filesystem;

// matplotlib's viridis(0), viridis(0.5) and viridis(1), as 8-bit sRGB.
constexpr Rgb kViridis0{68, 1, 84}, kViridisHalf{33, 145, 140}, kViridis1{253, 231, 37};

using test::TempDir;

// A PNG decoded by stb_image, RGB.
struct Decoded {
  int width = 0, height = 0, channels = 0;
  std::unique_ptr<unsigned char, decltype(&stbi_image_free)> rgb{nullptr, &stbi_image_free};
  Rgb at(int64_t x, int64_t y) const {
    const unsigned char* p = rgb.get() + (y * width + x) * 3;
    return {p[0], p[1], p[2]};
  }
};
Decoded decode(const std::string& path) {
  Decoded d;
  d.rgb.reset(stbi_load(path.c_str(), &d.width, &d.height, &d.channels, 3));
  EXPECT_NE(d.rgb, nullptr) << "stb_image cannot decode " << path << ": " << stbi_failure_reason();
  return d;
}

void expect_near(Rgb got, Rgb want, int tolerance, const std::string& where) {
  EXPECT_LE(std::abs(got.r - want.r), tolerance) << where;
  EXPECT_LE(std::abs(got.g - want.g), tolerance) << where;
  EXPECT_LE(std::abs(got.b - want.b), tolerance) << where;
}

HeatMap map_of(const std::string& title, Shape shape, std::initializer_list<double> values) {
  HeatMap m;
  m.title = title;
  m.values = Tensor<double>(std::move(shape), values);
  return m;
}

TEST(Viridis, MatchesMatplotlib) {
  EXPECT_EQ(viridis(0), kViridis0);
  EXPECT_EQ(viridis(1), kViridis1);
  expect_near(viridis(0.5), kViridisHalf, 3, "t = 0.5");
  EXPECT_EQ(viridis(-2), kViridis0);  // clamped
  EXPECT_EQ(viridis(7), kViridis1);
  EXPECT_EQ(viridis(NAN), (Rgb{128, 128, 128}));
}

TEST(Viridis, LightnessRisesSteadily) {
  // Perceptual maps grow brighter monotonically (luma as a stand-in for lightness).
  double last = -1;
  for (int k = 0; k <= 100; ++k) {
    const Rgb c = viridis(k / 100.0);
    const double luma = 0.2126 * c.r + 0.7152 * c.g + 0.0722 * c.b;
    EXPECT_GT(luma, last) << "t = " << k / 100.0;
    last = luma;
  }
}

// matplotlib's RdBu_r (ColorBrewer's RdBu reversed) at 0, 0.5 and 1.
constexpr Rgb kRdBuR0{5, 48, 97}, kRdBuRHalf{247, 247, 247}, kRdBuR1{103, 0, 31};

TEST(BlueWhiteRed, MatchesMatplotlibsRdBuR) {
  EXPECT_EQ(blue_white_red(0), kRdBuR0);
  EXPECT_EQ(blue_white_red(0.5), kRdBuRHalf);
  EXPECT_EQ(blue_white_red(1), kRdBuR1);
  EXPECT_EQ(blue_white_red(-1), kRdBuR0);  // clamped
  EXPECT_EQ(blue_white_red(3), kRdBuR1);
  EXPECT_EQ(blue_white_red(NAN), (Rgb{128, 128, 128}));
  const Rgb low = blue_white_red(0.25), high = blue_white_red(0.75);
  EXPECT_GT(low.b, low.r) << "below the middle is blue";
  EXPECT_GT(high.r, high.b) << "above it red";
}

TEST(BlueWhiteRed, LightestInTheMiddle) {
  // A diverging map: lightness (luma as a stand-in) rises to the middle, then falls.
  auto luma = [](Rgb c) { return 0.2126 * c.r + 0.7152 * c.g + 0.0722 * c.b; };
  for (int k = 0; k < 50; ++k) {
    EXPECT_LT(luma(blue_white_red(k / 100.0)), luma(blue_white_red((k + 1) / 100.0))) << k;
    EXPECT_GT(luma(blue_white_red((50 + k) / 100.0)), luma(blue_white_red((51 + k) / 100.0))) << k;
  }
}

TEST(Png, DecodesToTheLayoutWithTheExpectedColours) {
  TempDir dir;
  const std::vector<HeatMap> maps{map_of("head 0", {2, 3}, {1, 0.5, 0, 0.25, 0.75, NAN}),
                                  map_of("head 1", {2, 3}, {0, 0, 0, 0, 0, 1})};
  PictureOptions opt;
  opt.vmin = 0;
  opt.vmax = 1;
  opt.cell_px = 10;
  const auto path = dir.file("w.png");
  write_png(path, maps, opt);
  const Decoded png = decode(path);
  const PictureLayout l = png_layout(maps, opt);
  EXPECT_EQ(png.width, l.width);
  EXPECT_EQ(png.height, l.height);
  // Two 3-cell-wide maps side by side and a colour bar: wider than the cells alone.
  EXPECT_GE(l.width, 2 * 3 * 10 + l.bar_width);
  EXPECT_GE(l.height, 2 * 10);
  ASSERT_EQ(l.map_origin.size(), 2u);

  auto cell = [&](size_t map, int64_t r, int64_t c, int64_t dx = 5, int64_t dy = 5) {
    return png.at(l.map_origin[map].first + c * 10 + dx, l.map_origin[map].second + r * 10 + dy);
  };
  EXPECT_EQ(cell(0, 0, 0), kViridis1);
  EXPECT_EQ(cell(0, 0, 2), kViridis0);
  expect_near(cell(0, 0, 1), kViridisHalf, 3, "value 0.5");
  EXPECT_EQ(cell(0, 1, 2), (Rgb{128, 128, 128}));  // NaN
  EXPECT_EQ(cell(1, 1, 2), kViridis1);
  EXPECT_EQ(cell(1, 0, 0, 0, 0), kViridis0);       // a cell's first pixel
  EXPECT_EQ(cell(1, 0, 0, 9, 9), kViridis0);       // and its last
  EXPECT_EQ(cell(0, 0, 0, -1, 5), (Rgb{255, 255, 255}));  // the margin left of the map
  // The colour bar: vmax at the top, vmin at the bottom.
  EXPECT_EQ(png.at(l.bar_x + l.bar_width / 2, l.bar_y), kViridis1);
  EXPECT_EQ(png.at(l.bar_x + l.bar_width / 2, l.bar_y + l.bar_height - 1), kViridis0);
}

TEST(Png, DefaultScaleIsTheDataRange) {
  TempDir dir;
  const std::vector<HeatMap> maps{map_of("pe", {1, 3}, {-3, 2, 7})};
  const auto path = dir.file("range.png");
  write_picture(path, maps);  // chosen by the extension
  const Decoded png = decode(path);
  const PictureLayout l = png_layout(maps);
  auto centre = [&](int64_t c) {
    return png.at(l.map_origin[0].first + c * l.cell_px + l.cell_px / 2,
                  l.map_origin[0].second + l.cell_px / 2);
  };
  EXPECT_EQ(centre(0), kViridis0);
  expect_near(centre(1), kViridisHalf, 3, "the middle of [-3, 7]");
  EXPECT_EQ(centre(2), kViridis1);
}

// Whether any pixel of the box is not white (ink of text or a tick mark).
bool has_ink(const Decoded& png, const Box& b) {
  EXPECT_LT(b.x0, b.x1);
  EXPECT_LT(b.y0, b.y1);
  EXPECT_GE(b.x0, 0);
  EXPECT_GE(b.y0, 0);
  EXPECT_LE(b.x1, png.width);
  EXPECT_LE(b.y1, png.height);
  for (int64_t y = std::max<int64_t>(b.y0, 0); y < std::min<int64_t>(b.y1, png.height); ++y)
    for (int64_t x = std::max<int64_t>(b.x0, 0); x < std::min<int64_t>(b.x1, png.width); ++x)
      if (png.at(x, y) != Rgb{255, 255, 255}) return true;
  return false;
}

bool same_pixels(const Decoded& a, const Decoded& b) {
  return a.width == b.width && a.height == b.height &&
         std::equal(a.rgb.get(), a.rgb.get() + a.width * a.height * 3, b.rgb.get());
}

HeatMap weights_of(std::vector<std::string> tokens) {
  HeatMap m = map_of("猫 咬 狗, sinusoidal, head 0", {3, 3}, {0.2, 0.3, 0.5, 0.1, 0.8, 0.1, 0.3, 0.3, 0.4});
  m.row_labels = m.col_labels = std::move(tokens);
  m.row_axis = "query";
  m.col_axis = "key";
  return m;
}

void require_the_font() {
  ASSERT_TRUE(fs::exists(kPngFont)) << kPngFont << " is missing: install fonts-wqy-microhei "
                                    << "(make demo and make test do)";
}

TEST(Png, TitlesAxisTitlesAndTokenLabelsAreDrawn) {
  require_the_font();
  TempDir dir;
  PictureOptions opt;
  opt.scale_title = "attention weight";
  for (const std::vector<std::string>& tokens :
       {std::vector<std::string>{"the", "cat", "bit"}, std::vector<std::string>{"猫", "咬", "狗"}}) {
    const std::vector<HeatMap> maps{weights_of(tokens), weights_of(tokens)};
    write_png(dir.file("w.png"), maps, opt);
    const Decoded png = decode(dir.file("w.png"));
    const PictureLayout l = png_layout(maps, opt);
    ASSERT_EQ(l.map_text.size(), 2u);
    for (size_t i = 0; i < maps.size(); ++i) {
      const auto& text = l.map_text[i];
      const auto [x0, y0] = l.map_origin[i];
      EXPECT_TRUE(has_ink(png, text.title)) << tokens[0];
      EXPECT_TRUE(has_ink(png, text.row_axis)) << tokens[0];
      EXPECT_TRUE(has_ink(png, text.col_axis)) << tokens[0];
      EXPECT_TRUE(has_ink(png, text.row_labels)) << tokens[0];
      EXPECT_TRUE(has_ink(png, text.col_labels)) << tokens[0];
      // The labels sit beside the cells: left of them, and above them.
      EXPECT_LE(text.row_labels.x1, x0);
      EXPECT_LE(text.col_labels.y1, y0);
      EXPECT_LE(text.row_axis.x1, text.row_labels.x0);
      EXPECT_LE(text.col_axis.y1, text.col_labels.y0);
    }
    EXPECT_TRUE(has_ink(png, l.scale_title));
  }
}

TEST(Png, ChineseLabelsAreDrawnWithTheirGlyphs) {
  require_the_font();
  TempDir dir;
  auto draw = [&](const std::string& name, std::vector<std::string> tokens, const std::string& font) {
    PictureOptions opt;
    opt.png_font = font;
    write_png(dir.file(name), {weights_of(std::move(tokens))}, opt);
    return decode(dir.file(name));
  };
  // Each character its own glyph: neither the index nor one missing-glyph box.
  const Decoded chinese = draw("zh.png", {"猫", "咬", "狗"}, kPngFont);
  const Decoded indices = draw("idx.png", {"0", "1", "2"}, kPngFont);
  EXPECT_FALSE(same_pixels(chinese, indices));
  EXPECT_TRUE(same_pixels(indices, draw("utf8.png", {"\xe7\x8c", "1", "2"}, kPngFont)))
      << "a label of malformed UTF-8 is drawn as its index";
  EXPECT_FALSE(same_pixels(chinese, draw("swap.png", {"狗", "咬", "猫"}, kPngFont)));
  // Without the font: the built-in ASCII font, Chinese labels as their index.
  const Decoded builtin = draw("b.png", {"猫", "咬", "狗"}, "");
  EXPECT_TRUE(same_pixels(builtin, draw("b_idx.png", {"0", "1", "2"}, "")));
  EXPECT_TRUE(same_pixels(builtin, draw("missing.png", {"猫", "咬", "狗"}, dir.file("no-such-font.ttc"))));
  std::ofstream(dir.file("not-a-font.ttf")) << "not a font";
  EXPECT_TRUE(same_pixels(builtin, draw("bad.png", {"猫", "咬", "狗"}, dir.file("not-a-font.ttf"))));
  // ASCII labels stay themselves in the built-in font.
  EXPECT_FALSE(same_pixels(draw("b_en.png", {"the", "cat", "bit"}, ""), builtin));
}

TEST(Png, TheTableHasTicksEveryTenPositionsAndDimensions) {
  TempDir dir;
  HeatMap table;
  table.title = "sinusoidal encoding, n=50, d=64";
  table.values = Tensor<double>({50, 64});
  table.row_axis = "position";
  table.col_axis = "dimension";
  for (const std::string& font : {std::string(kPngFont), std::string()}) {
    PictureOptions opt;
    opt.png_font = font;
    write_png(dir.file("pe.png"), {table}, opt);
    const Decoded png = decode(dir.file("pe.png"));
    const PictureLayout l = png_layout({table}, opt);
    const int64_t x0 = l.map_origin[0].first, y0 = l.map_origin[0].second;
    const int64_t cell = l.cell_px, centre = cell / 2;
    EXPECT_TRUE(has_ink(png, l.map_text[0].row_labels));
    EXPECT_TRUE(has_ink(png, l.map_text[0].col_labels));
    // A tick mark (in the few pixels beside the cells) at each tenth cell, none between.
    auto col_tick = [&](int64_t c) {
      return has_ink(png, {x0 + c * cell + centre, y0 - 8, x0 + c * cell + centre + 1, y0});
    };
    auto row_tick = [&](int64_t r) {
      return has_ink(png, {x0 - 8, y0 + r * cell + centre, x0, y0 + r * cell + centre + 1});
    };
    for (int64_t c = 0; c < 64; ++c) EXPECT_EQ(col_tick(c), c % 10 == 0) << "dimension " << c;
    for (int64_t r = 0; r < 50; ++r) EXPECT_EQ(row_tick(r), r % 10 == 0) << "position " << r;
  }
}

TEST(Png, DifferencesUseTheDivergingMap) {
  TempDir dir;
  const std::vector<HeatMap> maps{map_of("d", {1, 3}, {-0.2, 0, 0.2})};
  PictureOptions opt;
  opt.colour_map = ColourMap::BlueWhiteRed;
  opt.vmin = -0.2;
  opt.vmax = 0.2;
  write_png(dir.file("d.png"), maps, opt);
  const Decoded png = decode(dir.file("d.png"));
  const PictureLayout l = png_layout(maps, opt);
  auto centre = [&](int64_t c) {
    return png.at(l.map_origin[0].first + c * l.cell_px + l.cell_px / 2,
                  l.map_origin[0].second + l.cell_px / 2);
  };
  EXPECT_EQ(centre(0), kRdBuR0);
  EXPECT_EQ(centre(1), kRdBuRHalf);
  EXPECT_EQ(centre(2), kRdBuR1);
  EXPECT_EQ(png.at(l.bar_x + l.bar_width / 2, l.bar_y), kRdBuR1);
  EXPECT_EQ(png.at(l.bar_x + l.bar_width / 2, l.bar_y + l.bar_height - 1), kRdBuR0);
}

// SVG is XML: labels with control characters or bytes that are not UTF-8
// gave a file no XML parser reads. They are refused, naming the label (the
// file is not written); what XML can hold is escaped (the Python tests
// parse the result with a real XML parser).
TEST(Picture, SvgRefusesTextThatXmlCannotHold) {
  TempDir dir;
  HeatMap m = map_of("h", {1, 2}, {0, 1});
  m.col_labels = {"ok", std::string("a\x01" "b")};
  EXPECT_THROW_MSG(write_svg(dir.file("a.svg"), {m}), ValueError,
                   "write_svg: column label 1 of heat map 0 'a\\x01b' holds U+0001, a character XML cannot hold");
  m.col_labels = {std::string("\xff"), "ok"};
  EXPECT_THROW_MSG(write_svg(dir.file("a.svg"), {m}), ValueError,
                   "write_svg: column label 0 of heat map 0 '\\xff' is not valid UTF-8 (at byte 0)");
  for (const std::string bad : {"\xc0\xaf" /* overlong '/' */, "\xed\xa0\x80" /* a surrogate */, "\xe7\x8c" /* cut short */,
                                "\xef\xbf\xbe" /* U+FFFE */, "\x7f\x1b"}) {
    m.col_labels = {"ok", bad};
    EXPECT_THROW(write_svg(dir.file("a.svg"), {m}), ValueError) << bad;
  }
  m.col_labels = {"ok", "ok"};
  m.title = std::string("tab\there");  // allowed, kept by a reference
  write_svg(dir.file("a.svg"), {m});
  EXPECT_NE(test::read_bytes(dir.file("a.svg")).find("tab&#9;here"), std::string::npos);
  EXPECT_EQ(test::names_in(dir.path), std::vector<std::string>{"a.svg"});
}

TEST(Picture, BadInputIsAClearError) {
  TempDir dir;
  const auto ok = map_of("h", {1, 2}, {0, 1});
  EXPECT_THROW_MSG(write_png(dir.file("a.png"), {}), ValueError, "no heat maps");
  HeatMap empty;
  empty.title = "head 3";
  empty.values = Tensor<double>({0, 4});
  EXPECT_THROW_MSG(write_svg(dir.file("a.svg"), {ok, empty}), ValueError,
                   "heat map 1 ('head 3') has values of shape (0, 4)");
  HeatMap labelled = ok;
  labelled.col_labels = {"猫"};
  EXPECT_THROW_MSG(write_png(dir.file("a.png"), {labelled}), ValueError,
                   "1 column labels for 2 columns");
  PictureOptions reversed;
  reversed.vmin = 1;
  reversed.vmax = 0;
  EXPECT_THROW_MSG(write_png(dir.file("a.png"), {ok}, reversed), ValueError,
                   "finite vmin <= vmax");
  EXPECT_THROW_MSG(write_picture(dir.file("a.jpg"), {ok}), ValueError,
                   "does not end in .png or .svg");
  EXPECT_THROW_MSG(write_png(dir.file("no/such/dir/a.png"), {ok}), IOError, "cannot write");
  EXPECT_THROW_MSG(write_svg(dir.file("no/such/dir/a.svg"), {ok}), IOError, "cannot open");
  HeatMap huge;
  huge.values = Tensor<double>({1, 20000});
  PictureOptions one_px;
  one_px.cell_px = 1;
  EXPECT_THROW_MSG(write_png(dir.file("a.png"), {huge}, one_px), ValueError,
                   "more than 16384 on a side");
  EXPECT_FALSE(fs::exists(dir.file("a.png")));
}

}  // namespace
}  // namespace attn
