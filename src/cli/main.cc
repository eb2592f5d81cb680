// `attn`: the command-line tool. A thin layer over the library: parse flags
// (CLI11), call one subcommand, turn errors into one line on stderr.
// Exit status: 0 ok, 1 runtime error, 2 usage error.
#include <CLI/CLI.hpp>

#include <malloc.h>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <limits>
#include <type_traits>
#include <utility>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/file.hpp"
#include "attn/threads.hpp"
#include "attn/version.h"
#include "cli/commands.hpp"
#include "cli/files.hpp"

namespace {

// A usage error (exit 2) unless the file name ends in one of `extensions`
// (a device or FIFO, such as /dev/stdout, takes the first: output_format).
CLI::Validator extension_in(const std::vector<std::string>& extensions) {
  std::string list;
  for (const auto& e : extensions) list += (list.empty() ? "" : ", ") + e;
  return CLI::Validator(
      [extensions, list](std::string& path) -> std::string {
        if (!attn::cli::output_format(path, extensions).empty()) return "";
        return "'" + path + "' must end in " + list;
      },
      "FILE (" + list + ")");
}

// A usage error (exit 2) unless the text is a whole number in [lo, hi]. The
// text is checked, not CLI11's conversion of it, which clamps an overflowing
// number to INT64_MAX, wraps -1 to 2^64 - 1 and prints the range as doubles.
template <class Int>
CLI::Validator integer_in(Int lo, Int hi) {
  const std::string range = std::to_string(lo) + ".." + std::to_string(hi);
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        Int value{};
        const char* end = text.data() + text.size();
        const auto [stop, error] = std::from_chars(text.data(), end, value);
        const bool negative_unsigned = std::is_unsigned_v<Int> && !text.empty() && text[0] == '-';
        if (negative_unsigned || error == std::errc::result_out_of_range ||
            (error == std::errc() && stop == end && (value < lo || value > hi)))
          return text + " is not in " + range;
        if (error != std::errc() || stop != end) return "'" + text + "' is not a whole number";
        return "";
      },
      range);
}

// A usage error unless the text is a number that `ok` accepts; `what` names
// them ("a finite number > 0").
CLI::Validator number_where(bool (*ok)(double), const std::string& what) {
  return CLI::Validator(
      [ok, what](std::string& text) -> std::string {
        double value = 0;
        const char* end = text.data() + text.size();
        const auto [stop, error] = std::from_chars(text.data(), end, value);
        if (error != std::errc() || stop != end || !ok(value)) return text + " is not " + what;
        return "";
      },
      what);
}
CLI::Validator positive_finite() {
  return number_where([](double v) { return std::isfinite(v) && v > 0; }, "a finite number > 0");
}
CLI::Validator finite_number() {
  return number_where([](double v) { return std::isfinite(v); }, "a finite number");
}

// --causal on a subcommand, into options.causal (bottom-right: what a KV
// cache needs; with n_q == n_k the lower triangle).
void add_causal(CLI::App* sub, attn::AttentionOptions& options, const std::string& help) {
  sub->add_flag_callback("--causal", [&options] { options.causal = attn::Causal::BottomRight; }, help);
}

// Every option of attention() on a subcommand, parsed into one
// AttentionOptions: --causal, --window LEFT,RIGHT, --softcap C, --scale S.
void add_attention_options(CLI::App* sub, attn::AttentionOptions& options,
                           const std::string& causal_help) {
  add_causal(sub, options, causal_help);
  sub->add_option_function<std::vector<int64_t>>(
         "--window", [&options](const std::vector<int64_t>& w) { options.window = {w[0], w[1]}; },
         "sliding window LEFT,RIGHT around each query's position (-1: unbounded)")
      ->expected(2)
      ->delimiter(',')
      ->check(integer_in<int64_t>(-1, std::numeric_limits<int64_t>::max()));
  sub->add_option_function<double>(
         "--softcap", [&options](double c) { options.softcap = c; },
         "logits = C * tanh(logits / C) after scaling")
      ->check(positive_finite());
  sub->add_option_function<double>(
         "--scale", [&options](double s) { options.scale = s; }, "logit scale (default 1/sqrt(d))")
      ->check(finite_number());
}

// Bounds of the numbers on the command line: far beyond any real use, small
// enough that sizes built from them stay meaningful (the library then checks
// what they allocate).
constexpr int64_t kMaxPositions = 100'000'000;  // --n of pe, --n and --kv-len of bench
constexpr int64_t kMaxDim = 1'000'000;           // --d of pe, --heads of attend
constexpr int64_t kMaxBenchAxis = 4096;          // bench --heads, --kv-heads, --head-dim, --batch
constexpr int64_t kMaxSteps = 10'000'000;        // experiment --steps (about a day of training)

// The subcommand the command line chose, ready to run once parsing is done.
using Command = std::function<int()>;

// Each add_* registers one subcommand: its flags parse into an Args struct it
// owns, and when the subcommand is given, `chosen` becomes its run_* call.
template <class Args>
std::shared_ptr<Args> on_chosen(CLI::App* sub, Command& chosen, int (*run)(const Args&)) {
  auto args = std::make_shared<Args>();
  sub->callback([&chosen, args, run] { chosen = [args, run] { return run(*args); }; });
  return args;
}

void add_demo(CLI::App& app, Command& chosen) {
  auto* demo = app.add_subcommand("demo", "walk through the article, step by step");
  auto args = on_chosen(demo, chosen, attn::cli::run_demo);
  demo->add_option("--out", args->out,
                   "also write the walkthrough's pictures (.png and .svg) into this folder");
}

void add_pe(CLI::App& app, Command& chosen) {
  auto* pe = app.add_subcommand(
      "pe", "write a positional encoding: the sinusoidal table, RoPE's angles or ALiBi's biases");
  auto args = on_chosen(pe, chosen, attn::cli::run_pe);
  pe->add_option("--encoding", args->encoding,
                 "sinusoidal (the article's table), rope (each frequency pair's angle by position) "
                 "or alibi (each head's bias by distance)")
      ->capture_default_str()
      ->check(CLI::IsMember({"sinusoidal", "rope", "alibi"}));
  pe->add_option("--n", args->n, "number of positions (rows; alibi: distances 0..n-1)")
      ->required()
      ->check(integer_in<int64_t>(0, kMaxPositions));
  auto* d = pe->add_option("--d", args->d, "model dimension (sinusoidal) or rotated dimension, even (rope)")
                ->check(integer_in<int64_t>(1, kMaxDim));
  auto* heads = pe->add_option("--heads", args->heads, "alibi: number of heads")
                    ->capture_default_str()
                    ->check(integer_in<int64_t>(1, kMaxDim));
  auto* base = pe->add_option("--base", args->base, "base of the wavelengths (sinusoidal, rope)")
                   ->capture_default_str()
                   ->check(positive_finite());
  auto* scaling = pe->add_option("--scaling", args->scaling,
                                 "rope: a rope_scaling dict as JSON (Hugging Face's form), e.g. "
                                 "'{\"rope_type\": \"linear\", \"factor\": 8}'; pictures show the "
                                 "angles without and with it side by side");
  pe->add_option("--out", args->out,
                 "output file: .npy, .csv (the table, the angles in radians, the biases), "
                 ".png or .svg (a heat map)")
      ->required()
      ->check(extension_in({".npy", ".csv", ".png", ".svg"}));
  // Which flags go with which encoding: a usage error otherwise.
  pe->parse_complete_callback([args, d, heads, base, scaling] {
    const std::string& e = args->encoding;
    const auto refuse = [&](CLI::Option* o, const char* why) {
      if (o->count()) throw CLI::ValidationError(o->get_name(), why);
    };
    if (e == "alibi") {
      refuse(d, "does not apply to --encoding alibi (its size is --heads)");
      refuse(base, "does not apply to --encoding alibi");
    } else {
      if (!d->count()) throw CLI::ValidationError("--d", "is required for --encoding " + e);
      refuse(heads, "applies to --encoding alibi only");
    }
    if (e != "rope") refuse(scaling, "applies to --encoding rope only");
  });
}

void add_attend(CLI::App& app, Command& chosen) {
  auto* attend = app.add_subcommand(
      "attend", "run the article's multi_head on a .npy array; draw the weights per head");
  auto args = on_chosen(attend, chosen, attn::cli::run_attend);
  attend->add_option("input", args->input, "input .npy, (n, d) or (batch, n, d)")->required();
  attend->add_option("--heads", args->heads, "number of heads; must divide d")
      ->capture_default_str()
      ->check(integer_in<int64_t>(1, kMaxDim));
  attend->add_option_function<std::string>(
         "--pe", [args](const std::string& pe) { args->pe = attn::cli::kPositionalEncodings.at(pe); },
         "positions: none, sinusoidal (the table added) or rope (per head)")
      ->default_str("none")
      ->check(CLI::IsMember(attn::cli::kPositionalEncodings));
  add_attention_options(attend, args->attention,
                        "each word attends only to itself and earlier ones");
  attend->add_option("--out", args->out, "output .npy, the input's shape and dtype")
      ->required()
      ->check(extension_in({".npy"}));
  attend->add_option("--weights", args->weights,
                     "draw the attention weights, one heat map per head (.png or .svg)")
      ->check(extension_in({".png", ".svg"}));
  attend->add_option("--tokens", args->tokens,
                     "labels for the n rows, separated by spaces, e.g. \"猫 咬 狗\"");
}

void add_mha(CLI::App& app, Command& chosen) {
  auto* mha = app.add_subcommand(
      "mha", "run a MultiHeadAttention layer (safetensors weights) on a .npy array");
  auto args = on_chosen(mha, chosen, attn::cli::run_mha);
  mha->add_option("input", args->input, "input .npy, (n, embed_dim) or (batch, n, embed_dim)")
      ->required();
  mha->add_option("--weights", args->weights,
                  "layer weights (.safetensors from MultiHeadAttention.save or "
                  "tools/export_torch_mha.py)")
      ->required();
  mha->add_option("--out", args->out, "output .npy, the input's shape and dtype")
      ->required()
      ->check(extension_in({".npy"}));
  add_attention_options(mha, args->attention, "causal self-attention");
}

// --steps, --seed, --dtype and --json, which both experiments take.
template <class Args>
void add_training_flags(CLI::App* sub, Args& args, const char* steps_help, const char* seed_help) {
  sub->add_option("--steps", args.steps, steps_help)->check(integer_in<int64_t>(0, kMaxSteps));
  sub->add_option("--seed", args.seed, seed_help)
      ->capture_default_str()
      ->check(integer_in<uint64_t>(0, UINT64_MAX));
  sub->add_option("--dtype", args.dtype, "the models' parameters and arithmetic: f32 (the fast kernels) or f64")
      ->check(CLI::IsMember({"f32", "f64"}))
      ->capture_default_str();
  sub->add_flag("--json", args.json, "print the results as JSON");
}

void add_experiment(CLI::App& app, Command& chosen) {
  auto* experiment = app.add_subcommand(
      "experiment", "the article's claims as experiments (see docs/experiments.md)");
  experiment->require_subcommand(1);
  auto* order = experiment->add_subcommand(
      "order", "attention alone cannot tell 猫咬狗 from 狗咬猫; positional encoding can");
  auto order_args = on_chosen(order, chosen, attn::cli::run_order_experiment);
  add_training_flags(order, *order_args, "training steps per variant (default 600)",
                     "seed of data split, weights and batches");
  order->add_option("--heads", order_args->heads,
                    "heads of the layer (embed_dim 32: a divisor of it); ALiBi's slopes depend on it")
      ->capture_default_str()
      ->check(CLI::IsMember({1, 2, 4, 8, 16, 32}));
  order->add_option("--out", order_args->out,
                    "write each variant's head weights on 猫 咬 狗 / 狗 咬 猫 (.npy) into this "
                    "folder (none are written without it)");
  auto* heads = experiment->add_subcommand(
      "heads", "1, 2, 4, 8 heads on a task that needs two relations at once");
  auto heads_args = on_chosen(heads, chosen, attn::cli::run_heads_experiment);
  add_training_flags(heads, *heads_args, "training steps per head count (default 1500)",
                     "seed of weights, batches and test set");
  heads->add_option("--positional", heads_args->positional,
                    "positional encoding: none, sinusoidal, learned, rope or alibi")
      ->check(CLI::IsMember({"none", "sinusoidal", "learned", "rope", "alibi"}))
      ->capture_default_str();
}

// The flags the bench subcommands of one shape take.
void add_bench_flags(CLI::App* sub, attn::cli::BenchArgs& args) {
  sub->add_option("--heads", args.heads, "query heads")
      ->check(integer_in<int64_t>(1, kMaxBenchAxis));
  sub->add_option("--kv-heads", args.kv_heads, "key/value heads (default: --heads)")
      ->check(integer_in<int64_t>(1, kMaxBenchAxis));
  sub->add_option("--head-dim", args.head_dim, "head dimension")
      ->check(integer_in<int64_t>(1, kMaxBenchAxis));
  sub->add_option("--batch", args.batch, "batch size")
      ->check(integer_in<int64_t>(1, kMaxBenchAxis));
  sub->add_option("--threads", args.threads, "threads (default: all cores)")
      ->check(integer_in<int>(1, attn::max_num_threads()));
  sub->add_option("--kv-dtype", args.kv_dtype,
                  "key/value storage (q8_0, q4_0: GGUF's 8- and 4-bit blocks; int4: KIVI's 4-bit groups)")
      ->check(CLI::IsMember({"f32", "bf16", "f16", "q8_0", "q4_0", "int4"}));
  sub->add_flag("--alibi", args.alibi,
                "ALiBi with BLOOM's slopes, timed against the same call without it");
  sub->add_flag("--sinks", args.sinks, "a sink logit per head, timed against the same call without them");
  sub->add_flag("--json", args.json, "print one JSON object");
}

// attn bench batch-decode, mixed and serve (bench_serve.cc).
void add_serve_benches(CLI::App* bench, Command& chosen) {
  const auto shape = [](CLI::App* sub, attn::cli::ServeBenchArgs& a) {
    sub->add_option("--heads", a.heads, "query heads")->check(integer_in<int64_t>(1, kMaxBenchAxis))->capture_default_str();
    sub->add_option("--kv-heads", a.kv_heads, "key/value heads")
        ->check(integer_in<int64_t>(1, kMaxBenchAxis))->capture_default_str();
    sub->add_option("--head-dim", a.head_dim, "head dimension")
        ->check(integer_in<int64_t>(1, kMaxBenchAxis))->capture_default_str();
    sub->add_option("--page-size", a.page_size, "tokens per page")
        ->check(integer_in<int64_t>(1, 1 << 20))->capture_default_str();
    sub->add_option("--kv-dtype", a.kv_dtype, "key/value storage (int4: --page-size a multiple of 32)")
        ->check(CLI::IsMember({"f32", "bf16", "f16", "q8_0", "q4_0", "int4"}))->capture_default_str();
    sub->add_option("--threads", a.threads, "threads (default: all cores)")
        ->check(integer_in<int>(1, attn::max_num_threads()));
    sub->add_flag("--json", a.json, "print one JSON object");
  };
  const auto lengths = [](CLI::App* sub, attn::cli::ServeBenchArgs& a, const char* what) {
    sub->add_option("--requests", a.requests, "requests")->check(integer_in<int64_t>(1, 1 << 16))->capture_default_str();
    sub->add_option("--min-len", a.min_len, what)->check(integer_in<int64_t>(1, kMaxPositions))->capture_default_str();
    sub->add_option("--max-len", a.max_len, what)->check(integer_in<int64_t>(1, kMaxPositions))->capture_default_str();
  };
  auto* batch = bench->add_subcommand("batch-decode",
                                      "decode requests of log-spaced lengths in one call over pages, against "
                                      "separate calls and a single long decode");
  auto b = on_chosen(batch, chosen, attn::cli::run_serve_bench);
  b->kind = "batch-decode";
  lengths(batch, *b, "the requests' cached tokens, log-spaced from --min-len to --max-len");
  shape(batch, *b);
  auto* mixed = bench->add_subcommand("mixed",
                                      "a prefill, decodes of log-spaced lengths and 8 drafts verified in one "
                                      "call, against its prefill and decode parts");
  auto m = on_chosen(mixed, chosen, attn::cli::run_serve_bench);
  m->kind = "mixed";
  m->requests = 31, m->min_len = 100;
  lengths(mixed, *m, "the decodes' cached tokens, log-spaced from --min-len to --max-len");
  mixed->add_option("--prefill-len", m->prefill_len, "the prefill's tokens")
      ->check(integer_in<int64_t>(1, kMaxPositions))->capture_default_str();
  shape(mixed, *m);
  auto* serve = bench->add_subcommand("serve", "continuous batching over a PagedKVCache, simulated from a seed");
  auto s = on_chosen(serve, chosen, attn::cli::run_serve_bench);
  s->kind = "serve";
  s->min_len = 32, s->max_len = 2048;
  lengths(serve, *s, "prompt lengths, log-uniform from --min-len to --max-len");
  shape(serve, *s);
  serve->add_option("--min-output", s->min_output, "output lengths, uniform from --min-output to --max-output")
      ->check(integer_in<int64_t>(1, kMaxPositions))->capture_default_str();
  serve->add_option("--max-output", s->max_output, "output lengths, uniform from --min-output to --max-output")
      ->check(integer_in<int64_t>(1, kMaxPositions))->capture_default_str();
  serve->add_option("--token-budget", s->token_budget, "tokens per step (decodes first, then prompt chunks)")
      ->check(integer_in<int64_t>(1, kMaxPositions))->capture_default_str();
  serve->add_option("--arrival-every", s->arrival_every, "mean steps between arrivals")
      ->check(CLI::Range(0.01, 1e6))->capture_default_str();
  serve->add_option("--seed", s->seed, "the simulation's seed")->capture_default_str();
  serve->add_option("--out", s->out, "pages held per request over the steps: .png or .svg");
}

void add_bench(CLI::App& app, Command& chosen) {
  auto* bench = app.add_subcommand("bench", "time the kernels against this machine's ceilings");
  bench->require_subcommand(1);
  // Its subcommands take it too (they inherit fallthrough).
  bench->fallthrough();
  bench->add_option("--min-time", attn::cli::bench_min_time_s,
                    "seconds of turns at least (at least 3 turns): 0 for a quick check of the output")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  auto* attention = bench->add_subcommand("attention", "prefill: n queries × n keys");
  auto a = on_chosen(attention, chosen, attn::cli::run_bench);
  a->kind = "attention";
  a->kv_len = 0;  // as many keys as queries unless --kv-len
  auto* n = attention->add_option("--n", a->n, "queries (and keys, unless --kv-len)")
      ->check(integer_in<int64_t>(1, kMaxPositions));
  auto* kv_len = attention->add_option("--kv-len", a->kv_len, "keys (default: --n): cross-attention, "
                                       "or a chunk of queries against a cache with --causal")
      ->check(integer_in<int64_t>(1, kMaxPositions));
  add_causal(attention, a->attention, "causal masking (aligned bottom-right, as against a cache)");
  add_bench_flags(attention, *a);
  attention->add_option("--precision", a->precision,
                        "the products' precision: f32, bf16 or int8 (timed against f32 in the same turns)")
      ->check(CLI::IsMember({"f32", "bf16", "int8"}))
      ->capture_default_str();
  auto* sweep = attention->add_flag(
      "--sweep", a->sweep,
      "a fixed grid of shapes (head dims 16-256 at n 128-8192, batch, GQA, cross-attention, causal, "
      "long, decode), one line each; --threads, --kv-dtype and --json apply");
  for (const char* shape : {"--causal", "--heads", "--kv-heads", "--head-dim", "--batch", "--alibi", "--sinks"})
    sweep->excludes(attention->get_option(shape));
  sweep->excludes(n)->excludes(kv_len);
  auto* backward = bench->add_subcommand(
      "backward", "attention_backward (given the forward's output and log-sum-exp) against the forward");
  auto bw = on_chosen(backward, chosen, attn::cli::run_bench);
  bw->kind = "backward";
  bw->kv_len = 0;
  backward->add_option("--n", bw->n, "queries (and keys, unless --kv-len)")
      ->check(integer_in<int64_t>(1, kMaxPositions));
  backward->add_option("--kv-len", bw->kv_len, "keys (default: --n)")
      ->check(integer_in<int64_t>(1, kMaxPositions));
  add_causal(backward, bw->attention, "causal masking (aligned bottom-right), also timed against non-causal");
  add_bench_flags(backward, *bw);
  auto* decode = bench->add_subcommand("decode", "a few queries against a long KV cache");
  auto d = on_chosen(decode, chosen, attn::cli::run_bench);
  d->kind = "decode";
  decode->add_option("--kv-len", d->kv_len, "cached keys")
      ->check(integer_in<int64_t>(1, kMaxPositions));
  decode->add_option("--queries", d->queries, "queries per head (1-8)")
      ->check(integer_in<int64_t>(1, 8));
  add_bench_flags(decode, *d);
  decode->add_option("--page-size", d->page_size,
                     "over pages of this many tokens (batch_attention), timed against the contiguous cache")
      ->check(integer_in<int64_t>(1, 1 << 20));
  decode->add_flag("--tree", d->tree, "with --page-size: the queries are a draft tree (a tree mask), "
                                      "timed against one query");
  decode->add_option("--precision", d->precision,
                     "int8: with --kv-dtype q8_0, the queries rounded to q8_0 and Q·K on the int8 unit "
                     "(timed against f32 in the same turns)")
      ->check(CLI::IsMember({"f32", "int8"}))
      ->capture_default_str();
  auto* mla = bench->add_subcommand("mla", "a decode step of multi-head latent attention (DeepSeek-V3's shape)");
  auto ml = on_chosen(mla, chosen, attn::cli::run_bench);
  ml->kind = "mla";
  ml->heads = 128;
  mla->add_option("--kv-len", ml->kv_len, "cached tokens")->check(integer_in<int64_t>(1, kMaxPositions))
      ->capture_default_str();
  mla->add_option("--heads", ml->heads, "query heads")->check(integer_in<int64_t>(1, kMaxBenchAxis))
      ->capture_default_str();
  mla->add_option("--queries", ml->queries, "queries per head (1-8)")->check(integer_in<int64_t>(1, 8));
  mla->add_option("--kv-dtype", ml->kv_dtype, "the latent cache's storage")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
  mla->add_option("--threads", ml->threads, "threads (default: all cores)")
      ->check(integer_in<int>(1, attn::max_num_threads()));
  mla->add_flag("--json", ml->json, "print one JSON object");
  auto* sparse = bench->add_subcommand("sparse", "top-k sparse attention at decode (DeepSeek-V3.2's DSA shape)");
  auto sp = on_chosen(sparse, chosen, attn::cli::run_bench);
  sp->kind = "sparse";
  sp->heads = 128, sp->kv_len = 65536, sp->queries = 16;
  sparse->add_option("--kv-len", sp->kv_len, "cached tokens")->check(integer_in<int64_t>(1, kMaxPositions))
      ->capture_default_str();
  sparse->add_option("--topk", sp->topk, "keys each query row picks (at most kv_len)")
      ->check(integer_in<int64_t>(1, kMaxPositions))->capture_default_str();
  sparse->add_option("--heads", sp->heads, "query heads")->check(integer_in<int64_t>(1, kMaxBenchAxis))
      ->capture_default_str();
  sparse->add_option("--queries", sp->queries, "query rows (a batch's tokens), each with its own picks")
      ->check(integer_in<int64_t>(1, 4096))->capture_default_str();
  sparse->add_option("--threads", sp->threads, "threads (default: all cores)")
      ->check(integer_in<int>(1, attn::max_num_threads()));
  sparse->add_flag("--json", sp->json, "print one JSON object");
  add_serve_benches(bench, chosen);
  auto* varlen = bench->add_subcommand(
      "varlen", "a packed batch of variable-length sequences, against one call per sequence and padding");
  auto v = on_chosen(varlen, chosen, attn::cli::run_bench);
  v->kind = "varlen";
  v->lengths = {4096, 512, 64, 64, 64, 64, 64, 64, 64, 64};
  varlen->add_option("--lengths", v->lengths, "the sequences' lengths (queries = keys)")
      ->check(integer_in<int64_t>(0, kMaxPositions))
      ->capture_default_str();
  add_causal(varlen, v->attention, "causal masking within each sequence");
  varlen->add_option("--heads", v->heads, "query (and key/value) heads")
      ->check(integer_in<int64_t>(1, kMaxBenchAxis));
  varlen->add_option("--head-dim", v->head_dim, "head dimension")
      ->check(integer_in<int64_t>(1, kMaxBenchAxis));
  varlen->add_option("--threads", v->threads, "threads (default: all cores)")
      ->check(integer_in<int>(1, attn::max_num_threads()));
  varlen->add_flag("--json", v->json, "print one JSON object");
#ifdef ATTN_WITH_MPI
  auto* ring = bench->add_subcommand(
      "ring", "context-parallel attention under mpirun -np W: per-rank compute, waiting and communication, "
              "and the speed against one process");
  auto r = on_chosen(ring, chosen, attn::cli::run_bench_ring);
  ring->add_option("--n", r->n, "the global sequence (queries = keys), split over the ranks")
      ->check(integer_in<int64_t>(1, kMaxPositions))
      ->capture_default_str();
  ring->add_option("--heads", r->heads, "query heads")->check(integer_in<int64_t>(1, kMaxBenchAxis));
  ring->add_option("--kv-heads", r->kv_heads, "key/value heads (default: --heads)")
      ->check(integer_in<int64_t>(1, kMaxBenchAxis));
  ring->add_option("--head-dim", r->head_dim, "head dimension")->check(integer_in<int64_t>(1, kMaxBenchAxis));
  ring->add_flag("--causal", r->causal, "causal masking on the global sequence");
  ring->add_option("--layout", r->layout, "how the sequence is split")
      ->check(CLI::IsMember({"contiguous", "zigzag"}))
      ->capture_default_str();
  ring->add_option("--strategy", r->strategy, "ring (K/V around the ring) or ulysses (all-to-all over heads)")
      ->check(CLI::IsMember({"ring", "ulysses"}))
      ->capture_default_str();
  ring->add_option("--threads", r->threads, "threads per rank")
      ->check(integer_in<int>(1, attn::max_num_threads()))
      ->capture_default_str();
  ring->add_option("--repeats", r->repeats, "timed calls (the median is reported)")
      ->check(integer_in<int>(1, 1000))
      ->capture_default_str();
  ring->add_flag("--json", r->json, "print one JSON object (rank 0)");
#endif
}

// The exit status: `status`, or 1 when some of what was printed did not
// reach standard output (`attn demo > /dev/full`), said on stderr, as
// coreutils do.
int finished(int status) {
  try {
    attn::cli::flush_standard_output();
    if (std::fclose(stdout) != 0)
      throw attn::IOError(std::string("standard output: write error: ") + std::strerror(errno));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn: error: %s\n", e.what());
    return 1;
  }
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  // Training (attn experiment) allocates and frees the same tensors every
  // step; by default glibc hands the freed top of the heap back to the
  // system each time and faults it in again, and maps larger blocks afresh
  // per call: a third of a step. The CLI keeps its freed memory for reuse.
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  CLI::App app{"attn: multi-head attention and positional encodings"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "attn " ATTN_VERSION);
  Command chosen;
  for (auto* add : {add_demo, add_pe, add_attend, add_mha, add_experiment, add_bench}) add(app, chosen);

  // CLI11 alone would only say that a subcommand is required: name the word.
  if (argc > 1 && argv[1][0] != '-') {
    std::string known;
    bool found = false;
    for (const CLI::App* sub : std::as_const(app).get_subcommands({})) {
      known += (known.empty() ? "" : ", ") + sub->get_name();
      found = found || sub->get_name() == argv[1];
    }
    if (!found) {
      std::fprintf(stderr, "attn: unknown subcommand '%s'; the subcommands are %s (see attn --help)\n",
                   argv[1], known.c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return finished(app.exit(e));
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "attn: %s (see attn --help)\n", e.what());
    return 2;
  }
  try {
    return finished(chosen ? chosen() : 2);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn: error: %s\n", e.what());
    return 1;  // (one line: the failure of standard output itself, maybe)
  }
}
