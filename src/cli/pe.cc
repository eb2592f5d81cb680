// `attn pe`: a positional encoding as an array (.npy, .csv) or a picture
// (.png, .svg): the article's sinusoidal table, RoPE's angles (with and
// without a rope_scaling), ALiBi's biases.
#include <cstdio>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "attn/attn.hpp"
#include "attn/file.hpp"
#include "attn/io.hpp"
#include "cli/commands.hpp"
#include "cli/files.hpp"
#include "cli/heat_maps.hpp"

namespace attn::cli {
namespace {

// One row per line, comma-separated values, each read back as the same
// number (np.loadtxt(f, delimiter=",")): 9 digits for float32, 17 for float64.
template <class T>
std::string csv(const Tensor<T>& table) {
  std::string text;
  char value[40];
  const int digits = std::is_same_v<T, float> ? 9 : 17;
  for (int64_t p = 0; p < table.dim(0); ++p)
    for (int64_t i = 0; i < table.dim(1); ++i) {
      std::snprintf(value, sizeof value, "%.*g%c", digits, double(table[p * table.dim(1) + i]),
                    i + 1 < table.dim(1) ? ',' : '\n');
      text += value;
    }
  return text;
}

// The table as the file its extension names; picture(format) draws it.
template <class T, class Picture>
void write_table(const std::string& path, const Tensor<T>& table, Picture picture) {
  const std::string format = output_format(path, {".npy", ".csv", ".png", ".svg"});
  Outputs outputs;
  outputs.add(path, format == ".npy" ? encode_npy(table.view()) : format == ".csv" ? csv(table) : picture(format));
  outputs.write();
}

// RoPE's angle θ[t, k] = t · inv_freq[k] of pair k at position t (n, d/2),
// in double, for positions 0..n-1 (so the length-dependent scalings see n).
Tensor<double> rope_angles(int64_t n, const RopeFrequencies& f) {
  const auto half = static_cast<int64_t>(f.inv_freq.size());
  Tensor<double> angles({n, half});
  for (int64_t t = 0; t < n; ++t)
    for (int64_t k = 0; k < half; ++k) angles[t * half + k] = double(t) * f.inv_freq[k];
  return angles;
}

}  // namespace

int run_pe(const PeArgs& args) {
  if (args.encoding == "sinusoidal") {
    // float32, as attn.positional_encoding gives by default (angles in double).
    const auto table = sinusoidal_encoding<float>(args.n, args.d, args.base);
    write_table(args.out, table, [&](const std::string& format) { return encoding_picture(format, table); });
  } else if (args.encoding == "rope") {
    if (args.d % 2 != 0)
      throw ValueError("--d must be even for rope (it rotates pairs of features), got " + std::to_string(args.d));
    const RopeScaling scaling = args.scaling.empty() ? RopeScaling{} : parse_rope_scaling(args.scaling);
    const std::optional<int64_t> seq_len = args.n;
    const auto plain = rope_angles(args.n, rope_frequencies(args.d, args.base, {}, seq_len));
    const RopeFrequencies scaled = rope_frequencies(args.d, args.base, scaling, seq_len);
    const auto angles = rope_angles(args.n, scaled);
    write_table(args.out, angles, [&](const std::string& format) {
      return args.scaling.empty() ? rope_picture(format, plain, args.base, {}, 1.0, {})
                                  : rope_picture(format, plain, args.base, scaling, scaled.attention_factor, angles);
    });
  } else {
    const std::vector<double> slopes = alibi_slopes(args.heads);
    Tensor<double> bias({args.heads, args.n});
    for (int64_t h = 0; h < args.heads; ++h)
      for (int64_t t = 0; t < args.n; ++t) bias[h * args.n + t] = 0.0 - slopes[h] * double(t);  // +0 at t = 0
    write_table(args.out, bias, [&](const std::string& format) { return alibi_picture(format, bias, slopes); });
  }
  return 0;
}

}  // namespace attn::cli
