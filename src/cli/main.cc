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

  auto* experiment = app.add_subcommand(
      "experiment", "the article's claims as experiments (see docs/experiments.md)");
  experiment->require_subcommand(1);
  attn::cli::OrderArgs order_args;
  auto* order = experiment->add_subcommand(
      "order", "attention alone cannot tell 猫咬狗 from 狗咬猫; positional encoding can");
  order->add_option("--steps", order_args.steps, "training steps per variant (default 600)");
  order->add_option("--seed", order_args.seed, "seed of data split, weights and batches")
      ->capture_default_str();
  order->add_option("--out", order_args.out,
                    "folder for each variant's head weights on 猫 咬 狗 / 狗 咬 猫 (.npy)")
      ->capture_default_str();
  order->add_flag("--json", order_args.json, "print the results as JSON");
  attn::cli::HeadsArgs heads_args;
  auto* heads = experiment->add_subcommand(
      "heads", "1, 2, 4, 8 heads on a task that needs two relations at once");
  heads->add_option("--steps", heads_args.steps, "training steps per head count (default 1500)");
  heads->add_option("--seed", heads_args.seed, "seed of weights, batches and test set")
      ->capture_default_str();
  heads->add_option("--positional", heads_args.positional,
                    "positional encoding: none, sinusoidal, learned or rope")
      ->check(CLI::IsMember({"none", "sinusoidal", "learned", "rope"}))
      ->capture_default_str();
  heads->add_flag("--json", heads_args.json, "print the results as JSON");

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
    if (*order) return attn::cli::run_order_experiment(order_args);
    if (*heads) return attn::cli::run_heads_experiment(heads_args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn: error: %s\n", e.what());
    return 1;
  }
  return 2;
}
