// A small sequence classifier and its trainer, to show by experiment what
// the article claims: token embeddings, an optional positional encoding, one
// or two MultiHeadAttention layers (with residual connections), a pooled
// summary, a linear read-out, cross-entropy, Adam. In float32 (the fast
// kernels, forward and backward) or float64 (exact gradients, checked
// against finite differences); seeded and deterministic.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "attn/multi_head_attention.hpp"
#include "attn/tensor.hpp"

namespace attn {

enum class Positional {
  None,        // attention alone: blind to order
  Sinusoidal,  // the article's table, added to the embeddings (fixed)
  Learned,     // a learned absolute table, added to the embeddings
  Rope,        // q and k rotated in every layer
  Alibi,       // ALiBi's bias on every layer's logits (BLOOM's slopes)
};
// "none", "sinusoidal", "learned", "rope", "alibi"
Positional parse_positional(const std::string& name);
std::string positional_name(Positional p);

enum class Readout {
  Mean,  // mean over the tokens: a summary that has no position of its own
  Last,  // the last token's vector
};

struct ClassifierConfig {
  int64_t vocab_size = 0, max_len = 0, num_classes = 0;
  int64_t embed_dim = 32, num_heads = 2, num_layers = 1;
  Positional positional = Positional::None;
  Readout readout = Readout::Mean;
};

// Sequences of one length and their classes.
struct Batch {
  Tensor<int64_t> tokens;       // (batch, n)
  std::vector<int64_t> labels;  // (batch)
};

// The element type of a model's parameters and arithmetic: "f32" or "f64".
enum class Dtype { Float32, Float64 };
Dtype parse_dtype(const std::string& name);  // ValueError naming both otherwise
std::string dtype_name(Dtype d);

template <class T = double>
class Classifier {
 public:
  // Embeddings uniform(±1), layers as MultiHeadAttention initialises them,
  // read-out uniform(±1/sqrt(E)); all from `seed`.
  Classifier(const ClassifierConfig& config, uint64_t seed);
  const ClassifierConfig& config() const { return config_; }

  // logits (batch, num_classes) for tokens (batch, n), n <= max_len.
  Tensor<T> logits(TensorView<const int64_t> tokens) const;
  // The attention weights of every layer, each (batch, heads, n, n).
  std::vector<Tensor<T>> attention_weights(TensorView<const int64_t> tokens) const;
  // The mean cross-entropy over the batch, and (when asked) its gradient for
  // every parameter, in the order of parameters().
  double loss(const Batch& batch, std::vector<Tensor<T>>* gradients = nullptr) const;
  // The fraction of the batch whose largest logit is its label.
  double accuracy(const Batch& batch) const;

  // Token table, learned positions (Positional::Learned only), every
  // layer's parameters, read-out weight and bias.
  std::vector<Tensor<T>*> parameters();
  std::vector<const Tensor<T>*> parameters() const;
  int64_t parameter_count() const;

 private:
  struct Forward;  // the activations the backward needs
  Forward forward(TensorView<const int64_t> tokens, bool need_weights, bool save_for_backward) const;

  ClassifierConfig config_;
  Tensor<T> tokens_;                // (vocab, E)
  Tensor<T> positions_;             // (max_len, E): sinusoidal or learned; empty otherwise
  std::vector<MultiHeadAttention<T>> layers_;
  Tensor<T> readout_w_, readout_b_;  // (classes, E), (classes)
};
extern template class Classifier<float>;
extern template class Classifier<double>;

// A progress bar on stderr, redrawn in place while stderr is a terminal
// (logs and pipes stay clean): "heads  [######.....]  2400/6000  loss 0.41".
// Trainings that run at once may share one: each step adds one to it.
// An observer, where given, is called at the same steps (terminal or not)
// with the steps done and in all.
class Progress {
 public:
  using Observer = std::function<void(int64_t done, int64_t total)>;
  Progress(std::string label, int64_t total_steps, Observer observer = {});
  ~Progress();  // clears the line
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  void step(double loss);

 private:
  std::mutex mutex_;
  std::string label_;
  Observer observer_;
  int64_t total_, done_ = 0;
  bool on_, drawn_ = false;
};

struct TrainOptions {
  int64_t steps = 1000;
  int64_t batch_size = 64;
  double learning_rate = 3e-3;
  uint64_t seed = 0;   // the batches' random stream
  std::string label;   // shown in the progress bar
  Progress* progress = nullptr;  // a bar shared with other trainings; else train draws its own
};

// Draws a training batch of the given size.
using Sampler = std::function<Batch(int64_t batch_size, std::mt19937_64& rng)>;

// Trains with Adam on fresh batches from `sample`; returns the mean loss of
// the last tenth of the steps. Shows its steps on options.progress, or on a
// bar of its own labelled options.label.
template <class T>
double train(Classifier<T>& model, const Sampler& sample, const TrainOptions& options);

}  // namespace attn
