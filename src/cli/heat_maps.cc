#include "cli/heat_maps.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <sstream>

namespace attn::cli {
namespace {

std::string picture_in(const std::string& format, const std::vector<HeatMap>& maps, const PictureOptions& options) {
  return format == ".svg" ? encode_svg(maps, options) : encode_png(maps, options);
}

// Cells for `columns` columns about 640 pixels wide in all (pictures of
// positions along a line of text).
int64_t wide_cells(int64_t columns) { return std::clamp<int64_t>(640 / std::max<int64_t>(columns, 1), 1, 40); }

// A number as a label: 4 significant digits.
std::string number_text(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.4g", x);
  return text;
}

}  // namespace

std::string encoding_picture(const std::string& format, const Tensor<float>& table) {
  HeatMap map;
  map.title = "sinusoidal encoding, n=" + std::to_string(table.dim(0)) +
              ", d=" + std::to_string(table.dim(1));
  map.values = Tensor<double>(table.shape());
  copy<float, double>(table.view(), map.values.view());
  map.row_axis = "position";
  map.col_axis = "dimension";
  PictureOptions options;
  options.vmin = -1;
  options.vmax = 1;
  options.scale_title = "sin or cos";
  return picture_in(format, {map}, options);
}

std::string rope_picture(const std::string& format, const Tensor<double>& plain, double base,
                         const RopeScaling& scaling, double attention_factor,
                         const Tensor<double>& scaled) {
  const int64_t n = plain.dim(0), pairs = plain.dim(1);
  // Drawn one pair per row, positions along it: a wide picture, as a page wants.
  const auto turned = [&](const Tensor<double>& angles, std::string title) {
    HeatMap map;
    map.title = std::move(title);
    map.values = Tensor<double>({pairs, n});
    const double turn = 2 * std::numbers::pi;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t k = 0; k < pairs; ++k) {
        const double a = angles[t * pairs + k];
        map.values[k * n + t] = a - turn * std::floor(a / turn);
      }
    map.row_axis = "frequency pair";
    map.col_axis = "position";
    return map;
  };
  char text[160];
  std::snprintf(text, sizeof text, "RoPE, d=%lld, base %g", static_cast<long long>(2 * pairs), base);
  std::vector<HeatMap> maps{turned(plain, text)};
  if (scaled.rank()) {
    const std::string factor = scaling.factor ? ", factor " + number_text(*scaling.factor) : "";
    std::snprintf(text, sizeof text, "%s scaling%s, attention factor %.4g", rope_type_name(scaling.rope_type).c_str(),
                  factor.c_str(), attention_factor);
    maps.push_back(turned(scaled, text));
  }
  PictureOptions options;
  options.columns = 1;  // one above the other: positions line up
  options.cell_px = wide_cells(n);
  options.vmin = 0;
  options.vmax = 2 * std::numbers::pi;
  options.scale_title = "angle mod 2π (radians)";
  return picture_in(format, maps, options);
}

std::string alibi_picture(const std::string& format, const Tensor<double>& bias,
                          const std::vector<double>& slopes) {
  HeatMap map;
  map.title = "ALiBi, " + std::to_string(bias.dim(0)) + " heads";
  map.values = bias;
  for (double s : slopes) map.row_labels.push_back(number_text(s));
  map.row_axis = "head (its slope)";
  map.col_axis = "distance p - j";
  PictureOptions options;
  options.cell_px = wide_cells(bias.dim(1));
  options.scale_title = "bias added to the logit";
  return picture_in(format, {map}, options);
}

PictureOptions probability_scale() {
  PictureOptions options;
  options.vmin = 0;
  options.vmax = 1;
  options.scale_title = "attention weight";
  return options;
}

template <class T>
std::string weights_picture(const std::string& format, const Tensor<T>& weights,
                            const std::vector<std::string>& tokens, const std::string& caption,
                            PictureOptions options) {
  const bool batched = weights.rank() == 4;
  const int64_t heads = weights.dim(-3), n = weights.dim(-1);
  std::vector<HeatMap> maps(n == 0 ? 0 : static_cast<size_t>(weights.numel() / (n * n)));
  for (size_t m = 0; m < maps.size(); ++m) {
    const auto b = static_cast<int64_t>(m) / heads, h = static_cast<int64_t>(m) % heads;
    maps[m].title = (caption.empty() ? "" : caption + ", ") +
                    (batched ? "batch " + std::to_string(b) + ", " : "") + "head " +
                    std::to_string(h);
    maps[m].values = Tensor<double>({n, n});
    for (int64_t i = 0; i < n * n; ++i)
      maps[m].values[i] = weights[static_cast<int64_t>(m) * n * n + i];
    maps[m].row_labels = maps[m].col_labels = tokens;
    maps[m].row_axis = "query";
    maps[m].col_axis = "key";
  }
  options.columns = heads;
  return picture_in(format, maps, options);
}
template std::string weights_picture(const std::string&, const Tensor<float>&,
                                     const std::vector<std::string>&, const std::string&,
                                     PictureOptions);
template std::string weights_picture(const std::string&, const Tensor<double>&,
                                     const std::vector<std::string>&, const std::string&,
                                     PictureOptions);

std::string join_tokens(const std::vector<std::string>& tokens) {
  std::string text;
  for (const auto& t : tokens) text += (text.empty() ? "" : " ") + t;
  return text;
}

std::vector<std::string> split_tokens(const std::string& text) {
  std::istringstream words(text);
  std::vector<std::string> tokens;
  for (std::string w; words >> w;) tokens.push_back(w);
  return tokens;
}

}  // namespace attn::cli
