// The training loop: Adam on fresh batches, a progress bar for people
// watching a terminal.
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "attn/adam.hpp"
#include "attn/train.hpp"

namespace attn {
namespace {

// "order/rope  [##########..........]  512/1000  loss 0.4132" redrawn in
// place; only when stderr is a terminal (logs and pipes stay clean).
class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total)
      : label_(std::move(label)), total_(total), on_(isatty(STDERR_FILENO) == 1) {}
  ~ProgressBar() {
    if (on_ && drawn_) std::fputs("\r\033[K", stderr);
  }
  void update(int64_t done, double loss) {
    const int64_t every = total_ / 100 + 1;
    if (!on_ || (done % every != 0 && done != total_)) return;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * done / (total_ ? total_ : 1));
    std::fprintf(stderr, "\r%-20s [%.*s%.*s] %6lld/%lld  loss %.4f", label_.c_str(), filled,
                 "##############################", kWidth - filled,
                 "..............................", static_cast<long long>(done),
                 static_cast<long long>(total_), loss);
    std::fflush(stderr);
    drawn_ = true;
  }

 private:
  std::string label_;
  int64_t total_;
  bool on_, drawn_ = false;
};

}  // namespace

template <class T>
double train(Classifier<T>& model, const Sampler& sample, const TrainOptions& options) {
  if (options.steps < 0 || options.batch_size < 1)
    throw ValueError("train: steps must be >= 0 and batch_size >= 1, got " +
                     std::to_string(options.steps) + ", " + std::to_string(options.batch_size));
  AdamOptions ao;
  ao.learning_rate = options.learning_rate;
  Adam<T> adam(model.parameters(), ao);
  std::mt19937_64 rng(options.seed);
  ProgressBar bar(options.label, options.steps);
  std::vector<Tensor<T>> gradients;
  const int64_t tail = std::max<int64_t>(1, options.steps / 10);
  double tail_loss = 0;
  for (int64_t step = 0; step < options.steps; ++step) {
    const double loss = model.loss(sample(options.batch_size, rng), &gradients);
    adam.step(gradients);
    if (step >= options.steps - tail) tail_loss += loss / double(tail);
    bar.update(step + 1, loss);
  }
  return tail_loss;
}

template double train(Classifier<float>&, const Sampler&, const TrainOptions&);
template double train(Classifier<double>&, const Sampler&, const TrainOptions&);

}  // namespace attn
