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
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn: error: %s\n", e.what());
    return 1;
  }
  return 2;
}
