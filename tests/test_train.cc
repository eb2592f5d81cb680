// The trainer: the input side, the whole classifier against finite
// differences, Adam against its closed form, and short runs of both
// experiments asserting the article's qualitative claims.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <utility>
#include <vector>

#include "companion/adam.hpp"
#include "companion/embedding.hpp"
#include "companion/experiments.hpp"
#include "attn/threads.hpp"
#include "gradcheck.hpp"
#include "helpers.hpp"

namespace attn {
namespace {

using test::dot;
using test::numeric_gradient;
using test::random_tensor;
using test::rel_error;

TEST(Embedding, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(20);
  auto table = random_tensor({5, 4}, rng), positions = random_tensor({6, 4}, rng);
  const Tensor<int64_t> tokens({2, 3}, {0, 4, 4, 2, 0, 1});
  const auto dx = random_tensor({2, 3, 4}, rng);
  const auto loss = [&] { return dot(embed(tokens.view(), table.view(), positions.view()), dx); };
  Tensor<double> dtable({5, 4}), dpositions({6, 4});
  embed_backward(tokens.view(), dx.view(), dtable.view(), dpositions.view());
  EXPECT_LE(rel_error(dtable, numeric_gradient(table, loss)), 1e-6);
  EXPECT_LE(rel_error(dpositions, numeric_gradient(positions, loss)), 1e-6);
  const Tensor<int64_t> bad({1, 1}, {5});
  EXPECT_THROW_MSG(embed(bad.view(), table.view()), ValueError,
                   "token 5 at (0, 0) is outside the vocabulary [0, 5)");
}

struct ModelCase {
  const char* name;
  Positional positional;
  Readout readout;
  int64_t layers;
};
void PrintTo(const ModelCase& c, std::ostream* os) { *os << c.name; }

class ClassifierGradients : public ::testing::TestWithParam<ModelCase> {};

// The whole model (embeddings, positions, layers, residuals, pooling,
// read-out, cross-entropy) against finite differences of its loss.
// A small model of the case's kind, and a batch for it.
ClassifierConfig config_of(const ModelCase& m) {
  ClassifierConfig c;
  c.vocab_size = 7;
  c.max_len = 5;
  c.num_classes = 3;
  c.embed_dim = 8;
  c.num_heads = 2;
  c.num_layers = m.layers;
  c.positional = m.positional;
  c.readout = m.readout;
  return c;
}
Batch small_batch() {
  Batch batch;
  batch.tokens = Tensor<int64_t>({3, 4}, {0, 1, 2, 3, 6, 5, 4, 3, 1, 1, 0, 2});
  batch.labels = {2, 0, 1};
  return batch;
}

TEST_P(ClassifierGradients, MatchFiniteDifferences) {
  Classifier model(config_of(GetParam()), 4);
  const Batch batch = small_batch();
  std::vector<Tensor<double>> g;
  model.loss(batch, &g);
  const auto params = model.parameters();
  ASSERT_EQ(g.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const auto numeric = numeric_gradient(*params[i], [&] { return model.loss(batch); });
    if (test::max_abs_diff(numeric, Tensor<double>(numeric.shape())) < 1e-8)  // dL/dbk = 0
      EXPECT_LE(test::max_abs_diff(g[i], numeric), 1e-8) << "parameter " << i;
    else
      EXPECT_LE(rel_error(g[i], numeric), 1e-6) << "parameter " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, ClassifierGradients,
    ::testing::Values(ModelCase{"none_mean", Positional::None, Readout::Mean, 1},
                      ModelCase{"sinusoidal_last", Positional::Sinusoidal, Readout::Last, 1},
                      ModelCase{"learned_two_layers", Positional::Learned, Readout::Mean, 2},
                      ModelCase{"rope_two_layers", Positional::Rope, Readout::Last, 2},
                      ModelCase{"alibi_mean", Positional::Alibi, Readout::Mean, 1}),
    [](const auto& info) { return std::string(info.param.name); });

// The float32 model (the fast kernels forward and backward, float32
// embeddings, read-out and loss) against the float64 one from the same seed
// (its parameters the float64 ones rounded): the same gradients within
// float32's rounding.
TEST_P(ClassifierGradients, Float32MatchesFloat64) {
  const ClassifierConfig c = config_of(GetParam());
  const Classifier<double> wide(c, 4);
  const Classifier<float> narrow(c, 4);
  const Batch batch = small_batch();
  std::vector<Tensor<double>> g64;
  std::vector<Tensor<float>> g32;
  EXPECT_NEAR(narrow.loss(batch, &g32), wide.loss(batch, &g64), 1e-5);
  ASSERT_EQ(g32.size(), g64.size());
  for (size_t i = 0; i < g64.size(); ++i) {
    if (test::max_abs_diff(g64[i], Tensor<double>(g64[i].shape())) < 1e-8)  // dL/dbk = 0
      EXPECT_LE(test::max_abs_diff(g32[i], g64[i]), 1e-6) << "parameter " << i;
    else
      EXPECT_LE(rel_error(g32[i], g64[i]), 1e-4) << "parameter " << i;
  }
}

TEST(Adam, FirstStepsMatchTheClosedForm) {
  // Constant gradient g: m̂ = g and v̂ = g² at every step, so each step moves
  // by lr * g / (|g| + eps).
  Tensor<double> p({3}, {1.0, -2.0, 0.5});
  const Tensor<double> g({3}, {0.3, -4.0, 1e-3});
  AdamOptions o;
  o.learning_rate = 0.1;
  Adam<double> adam({&p}, o);
  for (int step = 0; step < 3; ++step) adam.step({g});
  const double start[3] = {1.0, -2.0, 0.5};
  for (int i = 0; i < 3; ++i)
    EXPECT_NEAR(p[i], start[i] - 3 * 0.1 * g[i] / (std::fabs(g[i]) + 1e-8), 1e-12);
  EXPECT_THROW_MSG(adam.step({}), ValueError, "0 gradients for 1 parameters");
  // An eps that float32 cannot hold would divide 0 by 0 for a zero gradient.
  Tensor<float> p32({1});
  AdamOptions tiny;
  tiny.eps = 1e-50;
  EXPECT_THROW_MSG(Adam<float>({&p32}, tiny), ValueError, "rounds to 0");
}

// The experiments in float32, their default (Float32ReachesFloat64sAccuracies
// compares them with float64).
TEST(Experiments, OrderNeedsPositionalEncoding) {
  OrderExperimentOptions o;
  o.steps = 150;
  // The mirror symmetry of the weights is exact up to float32's rounding
  // (weights near 1 round at 6e-8; sums of 3 keys).
  const double exact = 1e-6;
  const auto r = run_order_experiment(o);
  ASSERT_EQ(r.variants.size(), 5u);
  EXPECT_GE(r.nouns.size(), 20u);
  EXPECT_GE(r.verbs.size(), 5u);
  for (const auto& v : r.variants) {
    SCOPED_TRACE(positional_name(v.positional));
    if (v.positional == Positional::None) {
      // A sentence and its mirror get the same summary, so at most one is right.
      EXPECT_LE(v.accuracy, 0.6);
      // and its weights on 狗 咬 猫 are those on 猫 咬 狗 with rows and columns permuted
      const int64_t mirror[3] = {2, 1, 0};
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t i = 0; i < 3; ++i)
          for (int64_t j = 0; j < 3; ++j)
            EXPECT_NEAR(v.weights_dog_bites_cat.at({h, i, j}),
                        v.weights_cat_bites_dog.at({h, mirror[i], mirror[j]}), exact);
    } else if (v.positional == Positional::Alibi) {
      // A directional bias: the mirror's weights are not the mirrored ones.
      // (Its accuracy with 2 heads' gentle slopes: AlibiLearnsOrderWithSteepSlopes.)
      const int64_t mirror[3] = {2, 1, 0};
      double most = 0;
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t i = 0; i < 3; ++i)
          for (int64_t j = 0; j < 3; ++j)
            most = std::max(most, std::abs(v.weights_dog_bites_cat.at({h, i, j}) -
                                           v.weights_cat_bites_dog.at({h, mirror[i], mirror[j]})));
      EXPECT_GT(most, 1e-3);
    } else {
      EXPECT_GE(v.accuracy, 0.9);
    }
    EXPECT_EQ(v.weights_cat_bites_dog.shape(), (Shape{2, 3, 3}));
  }
}

// ALiBi tells a sentence from its mirror once its slopes are steep enough
// to be learned from: 8 heads (slopes 1/2 .. 1/256) reach 80% in 300 steps,
// where 2 heads (1/16, 1/256) stay at chance after 3000 (docs/experiments.md).
TEST(Experiments, AlibiLearnsOrderWithSteepSlopes) {
  OrderExperimentOptions o;
  o.steps = 300;
  o.num_heads = 8;
  o.variants = {Positional::Alibi};
  const auto r = run_order_experiment(o);
  EXPECT_GE(r.variants.at(0).accuracy, 0.75);
}

// The web page's progress bar: steps done out of all variants' steps, in
// order, ending at the total (two trainings at once share the count).
TEST(Experiments, OrderReportsItsProgress) {
  OrderExperimentOptions o;
  o.steps = 50;
  o.variants = {Positional::None, Positional::Sinusoidal};
  std::vector<std::pair<int64_t, int64_t>> calls;
  o.on_progress = [&](int64_t done, int64_t total) { calls.emplace_back(done, total); };
  run_order_experiment(o);
  ASSERT_GE(calls.size(), 10u);
  EXPECT_EQ(calls.back(), (std::pair<int64_t, int64_t>{100, 100}));
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].second, 100);
    if (i > 0) {
      EXPECT_GT(calls[i].first, calls[i - 1].first);
    }
  }
}

TEST(Experiments, HeadsShareTheWorkAtEqualParameterBudgets) {
  HeadsExperimentOptions o;
  o.steps = 150;
  o.test_size = 500;
  o.head_counts = {1, 4};
  const auto r = run_heads_experiment(o);
  ASSERT_EQ(r.results.size(), 2u);
  EXPECT_EQ(r.results[0].parameters, r.results[1].parameters);
  EXPECT_GE(r.results[0].accuracy, 5.0 / 36);  // far above chance (1/36)
  // Four heads: solved, and the heads split the two relations between them
  // (some attend most to the first token, others to the previous one).
  const auto& four = r.results[1];
  ASSERT_EQ(four.top_position.size(), 4u);
  EXPECT_GE(four.accuracy, 0.9);
  const auto has = [&](int64_t pos) {
    return std::count(four.top_position.begin(), four.top_position.end(), pos) > 0;
  };
  EXPECT_TRUE(has(0));
  EXPECT_TRUE(has(o.seq_len - 2));
}

// An experiment trains its models at once, on the threads there are; the
// results are, to the bit, those of one model at a time on one thread, in
// the order asked for. An error in one model is the experiment's error.
TEST(Experiments, ModelsTrainedAtOnceGiveTheSameResults) {
  HeadsExperimentOptions o;
  o.steps = 40;
  o.test_size = 200;
  o.head_counts = {2, 1, 4};
  const int threads = num_threads();
  set_num_threads(1);
  const auto one = run_heads_experiment(o);
  set_num_threads(3);
  const auto three = run_heads_experiment(o);
  set_num_threads(threads);
  ASSERT_EQ(one.results.size(), 3u);
  ASSERT_EQ(three.results.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(three.results[i].heads, o.head_counts[i]);
    EXPECT_EQ(three.results[i].loss, one.results[i].loss) << i;
    EXPECT_EQ(three.results[i].accuracy, one.results[i].accuracy) << i;
    EXPECT_EQ(three.results[i].top_weight, one.results[i].top_weight) << i;
    EXPECT_EQ(three.results[i].top_position, one.results[i].top_position) << i;
  }
  o.head_counts = {1, 3};
  EXPECT_THROW_MSG(run_heads_experiment(o), ValueError, "must be divisible by num_heads (3)");
}

// Trained in float32 and in float64 from the same seed, the models reach the
// same accuracies within 2 points (the order experiment's variants, the
// heads experiment's head counts).
TEST(Experiments, Float32ReachesFloat64sAccuracies) {
  OrderExperimentOptions order;
  order.steps = 150;
  order.variants = {Positional::None, Positional::Sinusoidal, Positional::Rope};
  HeadsExperimentOptions heads;
  heads.steps = 150;
  heads.test_size = 500;
  heads.head_counts = {4};
  std::vector<double> accuracy[2];
  for (Dtype dtype : {Dtype::Float32, Dtype::Float64}) {
    order.dtype = heads.dtype = dtype;
    for (const auto& v : run_order_experiment(order).variants) accuracy[int(dtype)].push_back(v.accuracy);
    for (const auto& h : run_heads_experiment(heads).results) accuracy[int(dtype)].push_back(h.accuracy);
  }
  ASSERT_EQ(accuracy[0].size(), accuracy[1].size());
  for (size_t i = 0; i < accuracy[0].size(); ++i) EXPECT_NEAR(accuracy[0][i], accuracy[1][i], 0.02) << i;
}

}  // namespace
}  // namespace attn
