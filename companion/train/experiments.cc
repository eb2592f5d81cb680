// The order and heads experiments (companion/experiments.hpp).
#include "companion/experiments.hpp"

#include <algorithm>
#include <array>
#include <exception>

#include "attn/threads.hpp"

namespace attn {
namespace {

// The training settings both experiments take from their options.
template <class Options>
TrainOptions training(const Options& o, Progress& progress) {
  TrainOptions t;
  t.steps = o.steps;
  t.batch_size = o.batch_size;
  t.learning_rate = o.learning_rate;
  t.seed = o.seed + 1;
  t.progress = &progress;
  return t;
}

// run(i) for the experiment's count models, trained at once, one per thread
// of attn's threads (parallel_for): the kernel calls inside a model's steps then run on
// its thread. (Models this small keep one core busy each: two cores train
// two at a time, where a model's own calls gained little from a second
// core.) They start last first: the later models are the larger ones (more
// heads), and the largest should not run alone at the end. The results do
// not depend on any of this: the kernels give the same bits on any number of
// threads. An error from any model is rethrown here.
template <class Result, class Run>
std::vector<Result> train_models(int64_t count, const Run& run) {
  std::vector<Result> results(static_cast<size_t>(count));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(count));
  parallel_for(count, [&](int64_t item) {
    const int64_t i = count - 1 - item;
    try {
      results[i] = run(i);
    } catch (...) {
      errors[i] = std::current_exception();
    }
  });
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  return results;
}

// Vocabulary of the order experiment: nouns first (猫 and 狗 the first two),
// then verbs (咬 the first).
const std::vector<std::string> kNouns{"猫", "狗", "鸟", "鱼", "马", "牛", "羊", "猪",
                                      "鸡", "鸭", "虎", "狮", "熊", "狼", "狐", "兔",
                                      "鼠", "蛇", "猴", "鹿", "象", "龟"};
const std::vector<std::string> kVerbs{"咬", "追", "看", "抓", "推", "踢"};

struct Pair {
  int64_t a, b;
};

// Sentences "A VERB B" with the subject A as the label.
Batch sentences(const std::vector<std::array<int64_t, 3>>& rows) {
  Batch batch;
  batch.tokens = Tensor<int64_t>({static_cast<int64_t>(rows.size()), 3});
  for (size_t r = 0; r < rows.size(); ++r) {
    std::copy(rows[r].begin(), rows[r].end(), batch.tokens.data() + 3 * r);
    batch.labels.push_back(rows[r][0]);
  }
  return batch;
}

// The first layer's attention weights (batch, heads, n, n) on tokens, in double.
template <class T>
Tensor<double> first_layer_weights(const Classifier<T>& model, TensorView<const int64_t> tokens) {
  const Tensor<T> w = std::move(model.attention_weights(tokens).front());
  Tensor<double> wide(w.shape());
  std::copy(w.data(), w.data() + w.numel(), wide.data());
  return wide;
}

// (heads, n, n): the one layer's weights on one sentence.
template <class T>
Tensor<double> head_weights(const Classifier<T>& model, std::array<int64_t, 3> sentence) {
  const Tensor<int64_t> tokens({1, 3}, {sentence[0], sentence[1], sentence[2]});
  Tensor<double> w = first_layer_weights(model, tokens.view());
  const int64_t H = w.dim(1);
  return std::move(w).reshape({H, 3, 3});
}

// f(T()) with T the element type `dtype` names.
template <class F>
auto with_dtype(Dtype dtype, const F& f) {
  return dtype == Dtype::Float64 ? f(double()) : f(float());
}

}  // namespace

OrderExperimentResult run_order_experiment(const OrderExperimentOptions& o) {
  const int64_t N = static_cast<int64_t>(kNouns.size()), V = static_cast<int64_t>(kVerbs.size());
  OrderExperimentResult result;
  result.nouns = kNouns;
  result.verbs = kVerbs;

  // Unordered noun pairs, a fifth held out (猫/狗 among them, for the display).
  std::vector<Pair> pairs;
  for (int64_t a = 0; a < N; ++a)
    for (int64_t b = a + 1; b < N; ++b) pairs.push_back({a, b});
  std::mt19937_64 split(o.seed);
  std::shuffle(pairs.begin() + 1, pairs.end(), split);  // pairs[0] is {猫, 狗}
  const size_t n_test = pairs.size() / 5;
  const std::vector<Pair> test(pairs.begin(), pairs.begin() + n_test),
      train_pairs(pairs.begin() + n_test, pairs.end());
  result.train_pairs = static_cast<int64_t>(train_pairs.size());

  // Every held-out pair with every verb, in both orders: a sentence and its mirror.
  std::vector<std::array<int64_t, 3>> test_rows;
  for (const Pair& p : test)
    for (int64_t v = 0; v < V; ++v) {
      test_rows.push_back({p.a, N + v, p.b});
      test_rows.push_back({p.b, N + v, p.a});
    }
  const Batch test_batch = sentences(test_rows);
  result.test_sentences = static_cast<int64_t>(test_rows.size());

  const Sampler sample = [&](int64_t size, std::mt19937_64& rng) {
    std::vector<std::array<int64_t, 3>> rows;
    for (int64_t i = 0; i < size; ++i) {
      const Pair& p = train_pairs[rng() % train_pairs.size()];
      const bool mirrored = rng() % 2;
      rows.push_back({mirrored ? p.b : p.a, N + static_cast<int64_t>(rng() % V), mirrored ? p.a : p.b});
    }
    return sentences(rows);
  };

  Progress progress("order", o.steps * static_cast<int64_t>(o.variants.size()), o.on_progress);
  result.variants = train_models<OrderVariantResult>(static_cast<int64_t>(o.variants.size()), [&](int64_t i) {
    const Positional pos = o.variants[i];
    ClassifierConfig c;
    c.vocab_size = N + V;
    c.max_len = 3;
    c.num_classes = N;
    c.embed_dim = o.embed_dim;
    c.num_heads = o.num_heads;
    c.positional = pos;
    c.readout = Readout::Mean;
    return with_dtype(o.dtype, [&](auto type) {
      Classifier<decltype(type)> model(c, o.seed);
      const TrainOptions t = training(o, progress);
      OrderVariantResult r;
      r.positional = pos;
      r.loss = train(model, sample, t);
      r.accuracy = model.accuracy(test_batch);
      r.weights_cat_bites_dog = head_weights(model, {0, N, 1});
      r.weights_dog_bites_cat = head_weights(model, {1, N, 0});
      return r;
    });
  });
  return result;
}

HeadsExperimentResult run_heads_experiment(const HeadsExperimentOptions& o) {
  if (o.seq_len < 3 || o.vocab_size < 2)
    throw ValueError("heads experiment: seq_len must be >= 3 and vocab_size >= 2, got " +
                     std::to_string(o.seq_len) + ", " + std::to_string(o.vocab_size));
  const int64_t n = o.seq_len, V = o.vocab_size;
  // Random sequences; the class is (first token, previous token) of the last position.
  const Sampler sample = [&](int64_t size, std::mt19937_64& rng) {
    Batch batch;
    batch.tokens = Tensor<int64_t>({size, n});
    for (int64_t i = 0; i < size * n; ++i) batch.tokens[i] = static_cast<int64_t>(rng() % V);
    for (int64_t b = 0; b < size; ++b)
      batch.labels.push_back(batch.tokens.at({b, 0}) * V + batch.tokens.at({b, n - 2}));
    return batch;
  };
  std::mt19937_64 test_rng(o.seed + 1000);
  const Batch test = sample(o.test_size, test_rng);

  HeadsExperimentResult result;
  result.seq_len = n;
  result.vocab_size = V;
  Progress progress("heads", o.steps * static_cast<int64_t>(o.head_counts.size()));
  result.results = train_models<HeadsResult>(static_cast<int64_t>(o.head_counts.size()), [&](int64_t i) {
    const int64_t heads = o.head_counts[i];
    ClassifierConfig c;
    c.vocab_size = V;
    c.max_len = n;
    c.num_classes = V * V;
    c.embed_dim = o.embed_dim;
    c.num_heads = heads;
    c.positional = o.positional;
    c.readout = Readout::Last;
    HeadsResult r;
    r.heads = heads;
    const Tensor<double> w = with_dtype(o.dtype, [&](auto type) {
      Classifier<decltype(type)> model(c, o.seed);
      r.parameters = model.parameter_count();
      r.loss = train(model, sample, training(o, progress));
      r.accuracy = model.accuracy(test);
      return first_layer_weights(model, test.tokens.view());
    });
    // The last query's mean weight on each key position, per head.
    for (int64_t h = 0; h < heads; ++h) {
      std::vector<double> mean(n, 0.0);
      for (int64_t b = 0; b < test.tokens.dim(0); ++b)
        for (int64_t j = 0; j < n; ++j)
          mean[j] += w.at({b, h, n - 1, j}) / double(test.tokens.dim(0));
      const auto top = std::max_element(mean.begin(), mean.end());
      r.top_position.push_back(top - mean.begin());
      r.top_weight.push_back(*top);
    }
    return r;
  });
  return result;
}

}  // namespace attn
