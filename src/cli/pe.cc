// `attn pe`: the sinusoidal table as an array (.npy, .csv) or a picture
// (.png, .svg).
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "attn/attn.hpp"
#include "cli/commands.hpp"
#include "cli/files.hpp"
#include "cli/heat_maps.hpp"

namespace attn::cli {
namespace {

// One row per position, d comma-separated values, each read back as the same float (np.loadtxt(f, delimiter=",")).
void write_csv(const std::string& path, const Tensor<float>& table) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) throw IOError("pe: cannot open '" + path + "' for writing: " + std::strerror(errno));
  for (int64_t p = 0; p < table.dim(0); ++p)
    for (int64_t i = 0; i < table.dim(1); ++i)
      std::fprintf(f, "%.9g%c", double(table[p * table.dim(1) + i]), i + 1 < table.dim(1) ? ',' : '\n');
  if (std::fclose(f) != 0) throw IOError("pe: cannot write '" + path + "': " + std::strerror(errno));
}

}  // namespace

int run_pe(const PeArgs& args) {
  // float32, as attn.positional_encoding gives by default (angles in double).
  const auto table = sinusoidal_encoding<float>(args.n, args.d, args.base);
  const std::string ext = lower_extension(args.out);
  if (ext == ".npy")
    write_npy(args.out, table.view());
  else if (ext == ".csv")
    write_csv(args.out, table);
  else
    draw_encoding(args.out, table);
  return 0;
}

}  // namespace attn::cli
