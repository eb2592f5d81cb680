// The subcommands of the `attn` command-line tool.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace attn::cli {

int run_demo();

struct MhaArgs {
  std::string weights, input, out;
  bool causal = false;
};
int run_mha(const MhaArgs& args);

struct OrderArgs {
  std::optional<int64_t> steps;
  uint64_t seed = 1;
  std::string out = "order_weights";
  bool json = false;
};
int run_order_experiment(const OrderArgs& args);

struct HeadsArgs {
  std::optional<int64_t> steps;
  uint64_t seed = 1;
  std::string positional = "sinusoidal";
  bool json = false;
};
int run_heads_experiment(const HeadsArgs& args);

}  // namespace attn::cli
