// `attn experiment order|heads`: run an experiment of the library
// (attn/experiments.hpp), print its table (or JSON), write its weights.
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "attn/attn.hpp"
#include "companion/experiments.hpp"
#include "attn/file.hpp"
#include "attn/io.hpp"
#include "cli/commands.hpp"
#include "cli/files.hpp"

namespace attn::cli {

int run_order_experiment(const OrderArgs& args) {
  OrderExperimentOptions o;
  if (args.steps) o.steps = *args.steps;
  o.num_heads = args.heads;
  o.seed = args.seed;
  o.dtype = parse_dtype(args.dtype);
  // Before training: a bad folder must not cost the run.
  if (!args.out.empty()) make_folder(args.out, "experiment order");
  const auto r = attn::run_order_experiment(o);

  // Each variant's heads on the two display sentences, (heads, 3, 3), only
  // where asked for: not into the current folder of whoever runs it.
  std::vector<std::string> files;
  Outputs outputs;  // written after the table (or JSON) is printed
  if (!args.out.empty()) {
    for (const auto& v : r.variants)
      for (const auto& [name, w] : {std::pair{"cat_bites_dog", &v.weights_cat_bites_dog},
                                    std::pair{"dog_bites_cat", &v.weights_dog_bites_cat}}) {
        const auto path = std::filesystem::path(args.out) /
                          ("order_" + positional_name(v.positional) + "_" + name + ".npy");
        outputs.add(path.string(), encode_npy(w->view()));
        files.push_back(path.string());
      }
  }

  if (args.json) {
    nlohmann::json j;
    for (const auto& v : r.variants)
      j["variants"][positional_name(v.positional)] = {{"accuracy", v.accuracy}, {"loss", v.loss}};
    j["test_sentences"] = r.test_sentences;
    j["heads"] = o.num_heads;
    j["dtype"] = args.dtype;
    j["weights"] = files;
    std::printf("%s\n", j.dump(2).c_str());
    outputs.write();
    return 0;
  }
  std::printf("Who does the action? Sentences \"A VERB B\" over %zu nouns and %zu verbs, "
              "answered from the mean over the tokens (%lld heads, %s).\n"
              "Trained on %lld noun pairs; tested on %lld sentences of held-out pairs, "
              "each also mirrored (\"B VERB A\").\n\n",
              r.nouns.size(), r.verbs.size(), static_cast<long long>(o.num_heads), args.dtype.c_str(),
              static_cast<long long>(r.train_pairs),
              static_cast<long long>(r.test_sentences));
  std::printf("%-22s %9s %12s\n", "positional encoding", "accuracy", "train loss");
  for (const auto& v : r.variants)
    std::printf("%-22s %8.1f%% %12.4f\n", positional_name(v.positional).c_str(),
                100 * v.accuracy, v.loss);
  if (files.empty()) {
    std::printf("\n(--out FOLDER writes each head's weights on 猫 咬 狗 and 狗 咬 猫.)\n");
  } else {
    std::printf("\nEach head's weights on 猫 咬 狗 and 狗 咬 猫, (heads, 3, 3) rows = queries:\n");
    for (const auto& f : files) std::printf("  %s\n", f.c_str());
  }
  outputs.write();
  return 0;
}

int run_heads_experiment(const HeadsArgs& args) {
  HeadsExperimentOptions o;
  if (args.steps) o.steps = *args.steps;
  o.seed = args.seed;
  o.dtype = parse_dtype(args.dtype);
  o.positional = parse_positional(args.positional);
  const auto r = attn::run_heads_experiment(o);
  if (args.json) {
    nlohmann::json j;
    for (const auto& h : r.results)
      j["heads"][std::to_string(h.heads)] = {{"accuracy", h.accuracy},
                                            {"loss", h.loss},
                                            {"parameters", h.parameters},
                                            {"top_positions", h.top_position},
                                            {"top_weights", h.top_weight}};
    j["dtype"] = args.dtype;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("Sequences of %lld random tokens (%lld symbols); the class is (first token, "
              "previous token), read out at the last position (%lld classes, chance %.1f%%; %s).\n"
              "The last position is %lld, its previous token %lld.\n\n",
              static_cast<long long>(r.seq_len), static_cast<long long>(r.vocab_size),
              static_cast<long long>(r.vocab_size * r.vocab_size),
              100.0 / double(r.vocab_size * r.vocab_size), args.dtype.c_str(), static_cast<long long>(r.seq_len - 1),
              static_cast<long long>(r.seq_len - 2));
  std::printf("%-6s %10s %9s %11s   %s\n", "heads", "parameters", "accuracy", "train loss",
              "position each head's last query attends to most (mean weight)");
  for (const auto& h : r.results) {
    std::printf("%-6lld %10lld %8.1f%% %11.4f  ", static_cast<long long>(h.heads),
                static_cast<long long>(h.parameters), 100 * h.accuracy, h.loss);
    for (size_t k = 0; k < h.top_position.size(); ++k)
      std::printf(" h%zu:%lld (%.2f)", k, static_cast<long long>(h.top_position[k]),
                  h.top_weight[k]);
    std::printf("\n");
  }
  return 0;
}

}  // namespace attn::cli
