// The training loop: Adam on fresh batches, and the progress bar people
// watching a terminal see.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <optional>

#include "companion/adam.hpp"
#include "companion/train.hpp"

namespace attn {
Progress::Progress(std::string label, int64_t total_steps, Observer observer)
    : label_(std::move(label)), observer_(std::move(observer)), total_(total_steps), on_(isatty(STDERR_FILENO) == 1) {}

Progress::~Progress() {
  if (on_ && drawn_) std::fputs("\r\033[K", stderr);
}

void Progress::step(double loss) {
  if (!on_ && !observer_) return;
  std::lock_guard lock(mutex_);
  const int64_t done = ++done_, every = total_ / 100 + 1;
  if (done % every != 0 && done != total_) return;
  if (observer_) observer_(done, total_);
  if (!on_) return;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(kWidth * std::min(done, total_) / (total_ ? total_ : 1));
  std::fprintf(stderr, "\r%-20s [%.*s%.*s] %6lld/%lld  loss %.4f", label_.c_str(), filled,
               "##############################", kWidth - filled, "..............................",
               static_cast<long long>(done), static_cast<long long>(total_), loss);
  std::fflush(stderr);
  drawn_ = true;
}

template <class T>
double train(Classifier<T>& model, const Sampler& sample, const TrainOptions& options) {
  if (options.steps < 0 || options.batch_size < 1)
    throw ValueError("train: steps must be >= 0 and batch_size >= 1, got " +
                     std::to_string(options.steps) + ", " + std::to_string(options.batch_size));
  AdamOptions ao;
  ao.learning_rate = options.learning_rate;
  Adam<T> adam(model.parameters(), ao);
  std::mt19937_64 rng(options.seed);
  std::optional<Progress> own;
  Progress& progress = options.progress ? *options.progress : own.emplace(options.label, options.steps);
  std::vector<Tensor<T>> gradients;
  const int64_t tail = std::max<int64_t>(1, options.steps / 10);
  double tail_loss = 0;
  for (int64_t step = 0; step < options.steps; ++step) {
    const double loss = model.loss(sample(options.batch_size, rng), &gradients);
    adam.step(gradients);
    if (step >= options.steps - tail) tail_loss += loss / double(tail);
    progress.step(loss);
  }
  return tail_loss;
}

template double train(Classifier<float>&, const Sampler&, const TrainOptions&);
template double train(Classifier<double>&, const Sampler&, const TrainOptions&);

}  // namespace attn
