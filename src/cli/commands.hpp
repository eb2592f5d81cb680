// The subcommands of the `attn` command-line tool.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "attn/attention.hpp"
#include "cli/positions.hpp"

namespace attn::cli {

struct DemoArgs {
  std::string out;  // folder for the walkthrough's pictures; empty: none
};
int run_demo(const DemoArgs& args);

struct MhaArgs {
  std::string weights, input, out;
  AttentionOptions attention;  // --causal, --window, --softcap, --scale
};
int run_mha(const MhaArgs& args);

struct PeArgs {
  std::string encoding = "sinusoidal";  // sinusoidal, rope or alibi
  int64_t n = 0;  // positions (alibi: distances)
  int64_t d = 0;  // sinusoidal: model dimension; rope: rotated dimension
  int64_t heads = 8;  // alibi
  double base = 10000.0;
  std::string scaling;  // rope: a rope_scaling dict as JSON; empty: none
  std::string out;  // .npy, .csv, .png or .svg
};
int run_pe(const PeArgs& args);

struct AttendArgs {
  std::string input, out, weights, tokens;
  int64_t heads = 4;
  PositionalEncoding pe = PositionalEncoding::None;
  AttentionOptions attention;  // --causal, --window, --softcap, --scale
};
int run_attend(const AttendArgs& args);

// attn bench --min-time, for every bench: the turns (bench_common.hpp's
// run_in_turns) last at least this long, in seconds, as Google Benchmark's
// --benchmark_min_time; 0 leaves the 3 turns alone, for tests that check what
// the command prints, not the machine.
inline double bench_min_time_s = 1.0;

struct BenchArgs {
  std::string kind;  // "attention", "backward", "decode", "mla", "sparse" or "varlen"
  int64_t n = 4096, heads = 8, kv_heads = 0, head_dim = 64, batch = 1;
  int64_t kv_len = 32768, queries = 1;  // keys (attention sets 0: as many as queries)
  AttentionOptions attention;  // --causal
  bool alibi = false;          // ALiBi with BLOOM's slopes, timed against the same call without
  bool sinks = false;          // a sink per head, timed against the same call without
  bool json = false;
  bool sweep = false;      // attention --sweep: a fixed grid of shapes
  bool baselines = true;   // also time the float32 K/V and non-causal baselines
  int threads = 0;  // 0: the library's default
  std::string kv_dtype = "f32";
  std::string precision = "f32";  // attention: the prefill's products (f32, bf16 or int8)
  std::vector<int64_t> lengths;  // varlen: the packed sequences' lengths
  int64_t page_size = 0;         // decode: over pages of this size (0: a contiguous cache)
  bool tree = false;             // decode over pages: the queries are a draft tree
  int64_t topk = 2048;           // sparse: keys each query row picks
};
int run_bench(const BenchArgs& args);

// attn bench batch-decode, mixed and serve, and decode over pages
// (bench_serve.cc): batch attention over a paged cache.
struct ServeBenchArgs {
  std::string kind;  // "decode", "batch-decode", "mixed" or "serve"
  int64_t heads = 32, kv_heads = 8, head_dim = 128, page_size = 16;
  int64_t batch = 1, kv_len = 32768, queries = 1;  // decode
  bool tree = false;                               // decode: a draft tree mask over the queries
  int64_t requests = 32, min_len = 512, max_len = 32768;  // batch-decode, mixed's decodes; serve's prompts
  int64_t prefill_len = 2048;                             // mixed
  int64_t min_output = 16, max_output = 256, token_budget = 512;  // serve
  double arrival_every = 2.0;  // serve: mean steps between arrivals
  uint64_t seed = 1;
  std::string kv_dtype = "f32", out;  // serve --out: pages held per request over the steps (.png/.svg)
  int threads = 0;
  bool json = false;
};
int run_serve_bench(const ServeBenchArgs& args);

// attn bench ring, under mpirun (built where Open MPI is found).
struct RingBenchArgs {
  int64_t n = 16384, heads = 8, kv_heads = 0, head_dim = 64;
  bool causal = false;  // top-left on the global sequence
  std::string layout = "contiguous", strategy = "ring";
  int threads = 1;  // per rank
  int repeats = 5;
  bool json = false;
};
int run_bench_ring(const RingBenchArgs& args);

struct OrderArgs {
  std::optional<int64_t> steps;
  int64_t heads = 2;
  uint64_t seed = 1;
  std::string out;  // folder for the weights; empty: none written
  std::string dtype = "f32";
  bool json = false;
};
int run_order_experiment(const OrderArgs& args);

struct HeadsArgs {
  std::optional<int64_t> steps;
  uint64_t seed = 1;
  std::string positional = "sinusoidal";
  std::string dtype = "f32";
  bool json = false;
};
int run_heads_experiment(const HeadsArgs& args);

}  // namespace attn::cli
