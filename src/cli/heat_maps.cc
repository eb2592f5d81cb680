#include "cli/heat_maps.hpp"

#include <sstream>

namespace attn::cli {

std::string encoding_picture(const std::string& path, const Tensor<float>& table) {
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
  return encode_picture(path, {map}, options);
}

PictureOptions probability_scale() {
  PictureOptions options;
  options.vmin = 0;
  options.vmax = 1;
  options.scale_title = "attention weight";
  return options;
}

template <class T>
std::string weights_picture(const std::string& path, const Tensor<T>& weights,
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
  return encode_picture(path, maps, options);
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
