// `attn pe`: the sinusoidal table as an array (.npy, .csv) or a picture
// (.png, .svg).
#include <cstdio>
#include <string>

#include "attn/attn.hpp"
#include "attn/file.hpp"
#include "attn/io.hpp"
#include "cli/commands.hpp"
#include "cli/files.hpp"
#include "cli/heat_maps.hpp"

namespace attn::cli {
namespace {

// One row per position, d comma-separated values, each read back as the same float (np.loadtxt(f, delimiter=",")).
std::string csv(const Tensor<float>& table) {
  std::string text;
  char value[32];
  for (int64_t p = 0; p < table.dim(0); ++p)
    for (int64_t i = 0; i < table.dim(1); ++i) {
      std::snprintf(value, sizeof value, "%.9g%c", double(table[p * table.dim(1) + i]),
                    i + 1 < table.dim(1) ? ',' : '\n');
      text += value;
    }
  return text;
}

}  // namespace

int run_pe(const PeArgs& args) {
  // float32, as attn.positional_encoding gives by default (angles in double).
  const auto table = sinusoidal_encoding<float>(args.n, args.d, args.base);
  const std::string ext = lower_extension(args.out);
  if (ext == ".npy")
    write_npy(args.out, table.view());
  else if (ext == ".csv")
    write_file(args.out, {csv(table)});
  else
    write_file(args.out, {encoding_picture(args.out, table)});
  return 0;
}

}  // namespace attn::cli
