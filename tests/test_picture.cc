// Pictures: viridis against matplotlib's values, PNG files decoded back with
// stb_image, and the errors.
#include <gtest/gtest.h>
#include <stb_image.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>

#include "attn/picture.hpp"
#include "helpers.hpp"

namespace attn {
namespace {

namespace fs = std::filesystem;

// matplotlib's viridis(0), viridis(0.5) and viridis(1), as 8-bit sRGB.
constexpr Rgb kViridis0{68, 1, 84}, kViridisHalf{33, 145, 140}, kViridis1{253, 231, 37};

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("attn_picture_test_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

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
  const PngLayout l = png_layout(maps, opt);
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
  const PngLayout l = png_layout(maps);
  auto centre = [&](int64_t c) {
    return png.at(l.map_origin[0].first + c * l.cell_px + l.cell_px / 2,
                  l.map_origin[0].second + l.cell_px / 2);
  };
  EXPECT_EQ(centre(0), kViridis0);
  expect_near(centre(1), kViridisHalf, 3, "the middle of [-3, 7]");
  EXPECT_EQ(centre(2), kViridis1);
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
