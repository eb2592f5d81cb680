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

struct BenchArgs {
  std::string kind;  // "attention" or "decode"
  int64_t n = 4096, heads = 8, kv_heads = 0, head_dim = 64, batch = 1;
  int64_t kv_len = 32768, queries = 1;
  bool causal = false, json = false;
  int threads = 0;  // 0: the library's default
  std::string kv_dtype = "f32";
};
int run_bench(const BenchArgs& args);

}  // namespace attn::cli
