// The subcommands of the `attn` command-line tool.
#pragma once

#include <string>

namespace attn::cli {

int run_demo();

struct MhaArgs {
  std::string weights, input, out;
  bool causal = false;
};
int run_mha(const MhaArgs& args);

}  // namespace attn::cli
