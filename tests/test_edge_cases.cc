// The numeric edge cases of docs/semantics.md "Numeric edge cases": each in float64 (the
// reference) and float32 through both kernels (prefill: flash tiles; decode:
// n_q <= 32 against more than one 512-key chunk).
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "helpers.hpp"

namespace attn {
namespace {

using test::cast;
using test::random_tensor;
using test::rel_error;

using test::kInf;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Which implementation a case runs.
enum class Path { Reference, Prefill, Decode };
const char* name(Path p) {
  return p == Path::Reference ? "float64 reference" : p == Path::Prefill ? "float32 prefill" : "float32 decode";
}
constexpr Path kPaths[] = {Path::Reference, Path::Prefill, Path::Decode};

// Queries and keys for a path: decode needs n_q <= 32 and n_k > 512.
int64_t queries(Path p) { return p == Path::Decode ? 6 : 40; }
int64_t keys(Path p) { return p == Path::Decode ? 1100 : 150; }

// attention() on float64 data, through the path's implementation; the result
// in float64 (float32 results are exact in it).
Tensor<double> run(Path p, const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v,
                   const AttentionOptions& o = {}, const Mask& mask = {}) {
  if (p == Path::Reference) return attention(q.view(), k.view(), v.view(), o, mask);
  return cast<double>(attention(cast<float>(q).view(), cast<float>(k).view(), cast<float>(v).view(), o, mask));
}

struct Data {
  Tensor<double> q, k, v;
};
// Values rounded to float32, so that both precisions see the same numbers.
Data random_data(Path p, int64_t d, int64_t d_v, uint32_t seed) {
  std::mt19937 rng(seed);
  Data x{random_tensor({queries(p), d}, rng), random_tensor({keys(p), d}, rng),
         random_tensor({keys(p), d_v}, rng)};
  for (auto* t : {&x.q, &x.k, &x.v}) *t = cast<double>(cast<float>(*t));
  return x;
}

// Expects row i of `got` to be all NaN and every other row bitwise as in `clean`.
void expect_only_row_nan(const Tensor<double>& got, const Tensor<double>& clean, int64_t nan_row) {
  ASSERT_EQ(got.shape(), clean.shape());
  const int64_t w = got.dim(-1);
  for (int64_t e = 0; e < got.numel(); ++e) {
    if (e / w == nan_row) EXPECT_TRUE(std::isnan(got[e])) << "element " << e;
    else EXPECT_EQ(got[e], clean[e]) << "element " << e;
  }
}

TEST(EdgeCases, NanInOneQueryRowMakesOnlyThatRowNan) {
  for (Path p : kPaths) {
    SCOPED_TRACE(name(p));
    Data x = random_data(p, 16, 8, 1);
    const auto clean = run(p, x.q, x.k, x.v);
    x.q[3 * 16 + 5] = kNaN;  // row 3
    expect_only_row_nan(run(p, x.q, x.k, x.v), clean, 3);
  }
  // The weights too (the prefill kernel writes them; decode does not).
  Data x = random_data(Path::Prefill, 16, 8, 2);
  const auto clean64 = test::forward_with_weights(x.q.view(), x.k.view(), x.v.view());
  const auto clean32 = test::forward_with_weights(cast<float>(x.q).view(), cast<float>(x.k).view(),
                                              cast<float>(x.v).view());
  x.q[7 * 16] = kNaN;
  const auto got64 = test::forward_with_weights(x.q.view(), x.k.view(), x.v.view());
  const auto got32 = test::forward_with_weights(cast<float>(x.q).view(), cast<float>(x.k).view(),
                                            cast<float>(x.v).view());
  expect_only_row_nan(got64.weights, clean64.weights, 7);
  expect_only_row_nan(cast<double>(got32.weights), cast<double>(clean32.weights), 7);
}

// A key with one infinite feature: its logit is ±inf or NaN (0 · inf) by the
// sign of the query's feature. +inf logits share the row's weight equally (the
// softmax's limit), -inf ones get none, NaN makes the row NaN.
TEST(EdgeCases, InfiniteKeys) {
  for (Path p : kPaths) {
    for (double sign : {1.0, -1.0}) {
      SCOPED_TRACE(std::string(name(p)) + (sign > 0 ? ", +inf keys" : ", -inf keys"));
      Data x = random_data(p, 4, 3, 3);
      const int64_t a = keys(p) - 3, b = keys(p) / 2;  // the infinite keys
      for (int64_t j : {a, b}) {
        x.k[j * 4] = sign * kInf;
        for (int64_t c = 1; c < 4; ++c) x.k[j * 4 + c] = 0;
      }
      // Query 0 looks towards them, query 1 away, query 2 cannot tell.
      x.q[0] = sign;
      x.q[4] = -sign;
      x.q[8] = 0;
      const auto got = run(p, x.q, x.k, x.v);
      for (int64_t c = 0; c < 3; ++c)
        EXPECT_NEAR(got[c], (x.v[a * 3 + c] + x.v[b * 3 + c]) / 2, 1e-7);
      // Away: as if the two keys were not there (a false boolean mask).
      Tensor<bool> without({keys(p)});
      for (int64_t j = 0; j < keys(p); ++j) without[j] = j != a && j != b;
      Data finite = random_data(p, 4, 3, 3);
      finite.q[4] = -sign;
      const auto away = attention(finite.q.view(), finite.k.view(), finite.v.view(), {},
                                  TensorView<const bool>(without.view()));
      for (int64_t c = 0; c < 3; ++c) EXPECT_NEAR(got[3 + c], away[3 + c], 1e-6);
      for (int64_t c = 0; c < 3; ++c) EXPECT_TRUE(std::isnan(got[6 + c]));
    }
  }
}

// A NaN or infinite value row of a key that causal masking, a window or a
// false boolean mask excludes changes nothing: that key takes no part. (The
// kernels multiply every key of a tile by its weight, 0 for an excluded key,
// and 0·NaN is NaN.) An additive -inf is a value like any other: 0·NaN is
// NaN there, in float32 and float64 alike, as in PyTorch. Key `poisoned` sits
// in a prefill tile and a decode chunk that some rows see and some do not:
// causal masking hides it from the first half of the rows, the window from
// the last rows.
TEST(EdgeCases, ExcludedKeysTakeNoPartWhateverTheirValues) {
  enum Row { Clean, Poisoned };
  struct Case {
    const char* name;
    AttentionOptions options;
    bool boolean_mask, additive_mask;
  };
  AttentionOptions causal, window;
  causal.causal = Causal::BottomRight;
  window.window = {1, -1};
  const Case cases[] = {{"causal", causal, false, false},
                        {"window", window, false, false},
                        {"boolean mask", {}, true, false},
                        {"additive -inf", {}, false, true}};
  test::on_every_simd_target([&] {
    for (Path p : kPaths)
      for (const Case& c : cases)
        for (double poison : {kNaN, kInf, -kInf}) {
          SCOPED_TRACE(std::string(name(p)) + ", " + c.name + ", value " + std::to_string(poison));
          const int64_t n_q = queries(p), n_k = keys(p), d_v = 8;
          const int64_t poisoned = n_k - n_q / 2;  // the diagonal key of query n_q / 2
          Data x = random_data(p, 16, d_v, 9);
          // Row i's status: whether it reads the poisoned key.
          std::vector<Row> rows(n_q);
          Tensor<bool> allow({n_q, n_k});
          Tensor<double> added({n_q, n_k});
          for (int64_t i = 0; i < n_q; ++i) {
            const int64_t pos = i + n_k - n_q;
            for (int64_t j = 0; j < n_k; ++j) allow[i * n_k + j] = j != poisoned || i % 2 == 0;
            added[i * n_k + poisoned] = i % 2 ? -kInf : 0.0;
            const bool reads = c.boolean_mask ? i % 2 == 0
                               : c.additive_mask ? true
                               : c.options.causal != Causal::None ? poisoned <= pos
                                                                   : pos - poisoned <= 1;
            rows[i] = reads ? Poisoned : Clean;
          }
          const Mask mask = c.boolean_mask    ? Mask(TensorView<const bool>(allow.view()))
                            : c.additive_mask ? Mask(TensorView<const double>(added.view()))
                                              : Mask();
          const auto clean = run(p, x.q, x.k, x.v, c.options, mask);
          for (int64_t col = 0; col < d_v; ++col) x.v[poisoned * d_v + col] = poison;
          const auto got = run(p, x.q, x.k, x.v, c.options, mask);
          int poisoned_rows = 0;
          for (int64_t i = 0; i < n_q; ++i) {
            poisoned_rows += rows[i] == Poisoned;
            for (int64_t col = 0; col < d_v; ++col) {
              const double g = got[i * d_v + col];
              if (rows[i] == Clean) {
                EXPECT_NEAR(g, clean[i * d_v + col], 1e-6) << "row " << i;
              } else if (std::isnan(poison) || (c.additive_mask && i % 2)) {
                EXPECT_TRUE(std::isnan(g)) << "row " << i << " (0 or a weight times NaN or inf)";
              } else {
                EXPECT_EQ(g, poison) << "row " << i;
              }
            }
          }
          // Both kinds of rows occur (the additive case: every row reads it).
          EXPECT_GT(poisoned_rows, 0);
          if (!c.additive_mask) {
            EXPECT_LT(poisoned_rows, n_q);
          }
        }
  });
}

// Logits of ±1e30 after scaling: the softmax saturates to the arg max.
TEST(EdgeCases, HugeLogitsPickTheBestKey) {
  for (Path p : kPaths) {
    SCOPED_TRACE(name(p));
    const Data x = random_data(p, 8, 5, 4);
    AttentionOptions o;
    o.scale = 1e30;
    const auto got = run(p, x.q, x.k, x.v, o);
    for (int64_t i = 0; i < queries(p); ++i) {
      // The best key by a margin the float32 dot product cannot blur.
      std::vector<double> dots(keys(p));
      for (int64_t j = 0; j < keys(p); ++j)
        for (int64_t c = 0; c < 8; ++c) dots[j] += x.q[i * 8 + c] * x.k[j * 8 + c];
      const int64_t best = std::max_element(dots.begin(), dots.end()) - dots.begin();
      std::vector<double> sorted = dots;
      std::sort(sorted.rbegin(), sorted.rend());
      ASSERT_GT(sorted[0] - sorted[1], 1e-5) << "row " << i << ": pick another seed";
      for (int64_t c = 0; c < 5; ++c) EXPECT_EQ(got[i * 5 + c], x.v[best * 5 + c]) << "row " << i;
    }
    // With a softcap the same logits saturate at ±cap instead.
    o.softcap = 2;
    EXPECT_LT(rel_error(run(p, x.q, x.k, x.v, o), run(Path::Reference, x.q, x.k, x.v, o)), 1e-5);
  }
}

TEST(EdgeCases, RowsWithEveryKeyMaskedAreZero) {
  for (Path p : kPaths) {
    SCOPED_TRACE(name(p));
    const Data x = random_data(p, 8, 5, 5);
    Tensor<bool> mask({queries(p), keys(p)});
    for (int64_t e = 0; e < mask.numel(); ++e) mask[e] = e / keys(p) != 1;  // row 1: no key
    Tensor<double> additive({queries(p), keys(p)});
    for (int64_t e = 0; e < additive.numel(); ++e) additive[e] = mask[e] ? 0 : -kInf;
    const auto ref = run(Path::Reference, x.q, x.k, x.v);
    for (const Mask& m : {Mask(TensorView<const bool>(mask.view())),
                          Mask(TensorView<const double>(additive.view()))}) {
      const auto got = run(p, x.q, x.k, x.v, {}, m);
      for (int64_t e = 0; e < got.numel(); ++e) {
        if (e / 5 == 1) EXPECT_EQ(got[e], 0.0);
        else EXPECT_NEAR(got[e], ref[e], 1e-6);
      }
    }
  }
}

// PyTorch pads with finfo(float32).min rather than -inf: a row so masked
// everywhere still softmaxes over equal logits (the mean of the values), in
// float32 as in the reference. (The kernels scale logits to base 2; -FLT_MAX
// must not overflow to -inf there.)
TEST(EdgeCases, FloatMinimumMaskIsFinite) {
  for (Path p : kPaths) {
    SCOPED_TRACE(name(p));
    const Data x = random_data(p, 8, 5, 6);
    Tensor<float> additive({queries(p), keys(p)});
    for (int64_t e = 0; e < additive.numel(); ++e)
      additive[e] = e / keys(p) == 1 ? -std::numeric_limits<float>::max() : 0.0f;
    const Mask m = TensorView<const float>(additive.view());
    const auto got = run(p, x.q, x.k, x.v, {}, m);
    const auto ref = run(Path::Reference, x.q, x.k, x.v, {}, m);
    EXPECT_LT(rel_error(got, ref), 1e-6);
    for (int64_t c = 0; c < 5; ++c) {
      double mean = 0;
      for (int64_t j = 0; j < keys(p); ++j) mean += x.v[j * 5 + c] / keys(p);
      EXPECT_NEAR(got[5 + c], mean, 1e-6);
    }
  }
}

TEST(EdgeCases, EmptyAndZeroWidthInputs) {
  for (Path p : kPaths) {
    SCOPED_TRACE(name(p));
    const Data x = random_data(p, 8, 5, 6);
    // n_q = 0: an empty output.
    EXPECT_EQ(run(p, Tensor<double>({0, 8}), x.k, x.v).shape(), (Shape{0, 5}));
    // n_k = 0: no key for any row, zeros.
    const auto no_keys = run(p, x.q, Tensor<double>({0, 8}), Tensor<double>({0, 5}));
    EXPECT_EQ(no_keys.shape(), (Shape{queries(p), 5}));
    for (int64_t e = 0; e < no_keys.numel(); ++e) EXPECT_EQ(no_keys[e], 0.0);
    // d = 0: every logit is 0, so each row is the mean of the values.
    const auto no_features = run(p, Tensor<double>({queries(p), 0}), Tensor<double>({keys(p), 0}), x.v);
    for (int64_t c = 0; c < 5; ++c) {
      double mean = 0;
      for (int64_t j = 0; j < keys(p); ++j) mean += x.v[j * 5 + c] / double(keys(p));
      for (int64_t i = 0; i < queries(p); ++i) EXPECT_NEAR(no_features[i * 5 + c], mean, 1e-6);
    }
    // d_v = 0: rows of width 0.
    EXPECT_EQ(run(p, x.q, x.k, Tensor<double>({keys(p), 0})).shape(), (Shape{queries(p), 0}));
    // No heads, no batch.
    EXPECT_EQ(run(p, Tensor<double>({0, 3, 8}), Tensor<double>({0, 3, 8}), Tensor<double>({0, 3, 5})).shape(),
              (Shape{0, 3, 5}));
    EXPECT_EQ(run(p, Tensor<double>({0, 2, 3, 8}), Tensor<double>({0, 1, 3, 8}),
                  Tensor<double>({0, 1, 3, 5})).shape(), (Shape{0, 2, 3, 5}));
    // A batch no memory could hold beside an axis of 0 (a fuzzed C descriptor):
    // nothing to compute (a table of 2^62 batch offsets threw std::length_error).
    const int64_t huge = (int64_t{1} << 62) - 1;
    EXPECT_EQ(run(p, Tensor<double>({huge, 0, 0, 8}), Tensor<double>({huge, 0, 0, 8}),
                  Tensor<double>({huge, 0, 0, 5})).shape(), (Shape{huge, 0, 0, 5}));
  }
}

TEST(EdgeCases, OneQueryAndOneKey) {
  for (Path p : kPaths) {
    SCOPED_TRACE(name(p));
    const Data x = random_data(p, 8, 5, 7);
    const Tensor<double> q1({1, 8}, {0.1, -0.2, 0.3, 0.4, -0.5, 0.6, 0.7, -0.8});
    const Tensor<double> k1({1, 8}, {1, 1, 1, 1, 1, 1, 1, 1}), v1({1, 5}, {1, -2, 3, -4, 5});
    // One key: its value exactly, whatever the query.
    const auto one = run(p, x.q, k1, v1);
    for (int64_t i = 0; i < queries(p); ++i)
      for (int64_t c = 0; c < 5; ++c) EXPECT_EQ(one[i * 5 + c], v1[c]);
    // One query: the reference's answer.
    EXPECT_LT(rel_error(run(p, q1, x.k, x.v), run(Path::Reference, q1, x.k, x.v)), 1e-6);
  }
}

// Peak resident memory of this process so far, in bytes.
int64_t peak_rss() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

// 2^17 keys: memory grows with n, never with n_q · n_k. (Under ctest each
// test runs in its own process, so the peak before is this test's.)
TEST(EdgeCases, LongSequencesUseLinearMemory) {
  const int64_t n_k = int64_t{1} << (test::emulated() ? 15 : 17), d = 32;
  for (Path p : kPaths) {
    SCOPED_TRACE(name(p));
    const int64_t n_q = p == Path::Prefill ? 256 : 2;
    std::mt19937 rng(8);
    const auto q = random_tensor({n_q, d}, rng), k = random_tensor({n_k, d}, rng),
               v = random_tensor({n_k, d}, rng);
    const auto q32 = cast<float>(q), k32 = cast<float>(k), v32 = cast<float>(v);
    Tensor<double> out64({n_q, d});
    Tensor<float> out32({n_q, d});
    const int64_t before = peak_rss();
    if (p == Path::Reference) AttentionPlan(q.view(), k.view(), v.view()).run(out64.view());
    else AttentionPlan(q32.view(), k32.view(), v32.view()).run(out32.view());
    const int64_t grown = peak_rss() - before;
    // The weights alone would be n_q · n_k · 4 bytes: 128 MiB for prefill
    // (32 MiB emulated). Allowed: one packed copy of K (16 MiB; 4 MiB) and
    // small per-thread tiles (24 MiB).
    EXPECT_LT(grown, n_k * d * 4 + (24 << 20)) << grown << " bytes";
    // The first two rows against the reference.
    const Tensor<double> ref = attention(TensorView<const double>(q.data(), {2, d}), k.view(), v.view());
    for (int64_t e = 0; e < 2 * d; ++e)
      EXPECT_NEAR(p == Path::Reference ? out64[e] : out32[e], ref[e], 1e-6);
  }
}

}  // namespace
}  // namespace attn
