// The article's two claims as experiments anyone can rerun (`attn
// experiment order`, `attn experiment heads`; docs/experiments.md).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "attn/tensor.hpp"
#include "companion/train.hpp"

namespace attn {

// "Attention alone cannot tell 猫咬狗 from 狗咬猫; positional encoding fixes
// that." Sentences "A VERB B" (nouns A != B); the question "who does the
// action?" (class: A) is read out from the mean over the tokens, a summary
// with no position of its own. One model per positional variant, evaluated
// on noun pairs never seen in training, each in both orders. (ALiBi's slopes
// follow the head count: 2 heads get 1/16 and 1/256, 8 heads 1/2 .. 1/256.)
struct OrderExperimentOptions {
  int64_t steps = 600, batch_size = 64, embed_dim = 32, num_heads = 2;
  double learning_rate = 3e-3;
  uint64_t seed = 1;
  Dtype dtype = Dtype::Float32;  // of the models: f32 (the fast kernels) or f64
  std::vector<Positional> variants{Positional::None, Positional::Sinusoidal, Positional::Learned,
                                   Positional::Rope, Positional::Alibi};
  // Called as training goes (each hundredth of it, and at the end) with the
  // steps done and the steps of all variants: the web page's progress bar.
  std::function<void(int64_t done, int64_t total)> on_progress;
};

struct OrderVariantResult {
  Positional positional;
  double accuracy;  // on the held-out sentences (every pair in both orders)
  double loss;      // training loss at the end
  // Every head's attention weights (heads, 3, 3) on the display sentences.
  Tensor<double> weights_cat_bites_dog, weights_dog_bites_cat;
};

struct OrderExperimentResult {
  std::vector<std::string> nouns, verbs;
  int64_t train_pairs = 0, test_sentences = 0;
  std::vector<OrderVariantResult> variants;
};

OrderExperimentResult run_order_experiment(const OrderExperimentOptions& options = {});

// "Several heads can attend to different relations at once." Random token
// sequences; the class is the pair (first token, previous token) read out
// at the last position, so the answer needs two relations at once. The same
// model (equal parameter count) with 1, 2, 4 and 8 heads.
struct HeadsExperimentOptions {
  int64_t steps = 1500, batch_size = 64, embed_dim = 32, seq_len = 8, vocab_size = 6;
  int64_t test_size = 2000;
  double learning_rate = 3e-3;
  uint64_t seed = 1;
  Dtype dtype = Dtype::Float32;
  Positional positional = Positional::Sinusoidal;
  std::vector<int64_t> head_counts{1, 2, 4, 8};
};

struct HeadsResult {
  int64_t heads;
  int64_t parameters;
  double accuracy;
  double loss;
  // Per head: the key position the last query attends to most, and its mean
  // weight over the test set.
  std::vector<int64_t> top_position;
  std::vector<double> top_weight;
};

struct HeadsExperimentResult {
  int64_t seq_len = 0, vocab_size = 0;
  std::vector<HeadsResult> results;
};

HeadsExperimentResult run_heads_experiment(const HeadsExperimentOptions& options = {});

}  // namespace attn
