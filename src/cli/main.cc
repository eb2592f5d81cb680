// `attn`: the command-line tool. A thin layer over the library: parse flags
// (CLI11), call one subcommand, turn errors into one line on stderr.
// Exit status: 0 ok, 1 runtime error, 2 usage error.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>

#include "attn/error.hpp"
#include "cli/commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"attn: multi-head attention and positional encodings"};
  app.require_subcommand(1);

  auto* demo = app.add_subcommand("demo", "walk through the article, step by step");

  attn::cli::MhaArgs mha_args;
  auto* mha = app.add_subcommand(
      "mha", "run a MultiHeadAttention layer (safetensors weights) on a .npy array");
  mha->add_option("input", mha_args.input, "input .npy, (n, embed_dim) or (batch, n, embed_dim)")
      ->required();
  mha->add_option("--weights", mha_args.weights,
                  "layer weights (.safetensors from MultiHeadAttention.save or "
                  "tools/export_torch_mha.py)")
      ->required();
  mha->add_option("--out", mha_args.out, "output .npy, the input's shape and dtype")->required();
  mha->add_flag("--causal", mha_args.causal, "causal self-attention");

  attn::cli::BenchArgs bench_args;
  auto* bench = app.add_subcommand("bench", "time the kernels against this machine's ceilings");
  bench->require_subcommand(1);
  const auto common = [&](CLI::App* sub) {
    sub->add_option("--heads", bench_args.heads, "query heads")->check(CLI::PositiveNumber);
    sub->add_option("--kv-heads", bench_args.kv_heads, "key/value heads (default: --heads)")
        ->check(CLI::PositiveNumber);
    sub->add_option("--head-dim", bench_args.head_dim, "head dimension")->check(CLI::PositiveNumber);
    sub->add_option("--batch", bench_args.batch, "batch size")->check(CLI::PositiveNumber);
    sub->add_option("--threads", bench_args.threads, "threads (default: all cores)")
        ->check(CLI::PositiveNumber);
    sub->add_option("--kv-dtype", bench_args.kv_dtype, "key/value storage")
        ->check(CLI::IsMember({"f32", "bf16", "f16"}));
    sub->add_flag("--json", bench_args.json, "print one JSON object");
  };
  auto* bench_attention = bench->add_subcommand("attention", "prefill: n queries × n keys");
  bench_attention->add_option("--n", bench_args.n, "sequence length")->check(CLI::PositiveNumber);
  bench_attention->add_flag("--causal", bench_args.causal, "causal masking");
  common(bench_attention);
  auto* bench_decode = bench->add_subcommand("decode", "a few queries against a long KV cache");
  bench_decode->add_option("--kv-len", bench_args.kv_len, "cached keys")->check(CLI::PositiveNumber);
  bench_decode->add_option("--queries", bench_args.queries, "queries per head (1-8)")
      ->check(CLI::PositiveNumber);
  common(bench_decode);

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "attn: %s (see attn --help)\n", e.what());
    return 2;
  }
  try {
    if (*demo) return attn::cli::run_demo();
    if (*mha) return attn::cli::run_mha(mha_args);
    if (*bench) {
      bench_args.kind = *bench_attention ? "attention" : "decode";
      return attn::cli::run_bench(bench_args);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn: error: %s\n", e.what());
    return 1;
  }
  return 2;
}
