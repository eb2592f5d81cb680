// multi_head() and the article's claim that attention is blind to word order.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "helpers.hpp"

namespace attn {
namespace {

using test::cast;
using test::max_abs_diff;
using test::random_tensor;

// Columns [h*dh, (h+1)*dh) of x (n, d), copied out.
Tensor<double> head_slice(const Tensor<double>& x, int64_t h, int64_t dh) {
  const int64_t n = x.dim(0), d = x.dim(1);
  Tensor<double> s({n, dh});
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < dh; ++c) s[i * dh + c] = x[i * d + h * dh + c];
  return s;
}

// The article's loop: slice columns, attention(s, s, s), concatenate.
Tensor<double> multi_head_by_slices(const Tensor<double>& x, int64_t heads) {
  const int64_t n = x.dim(0), d = x.dim(1), dh = d / heads;
  Tensor<double> out({n, d});
  for (int64_t h = 0; h < heads; ++h) {
    const auto s = head_slice(x, h, dh);
    const auto o = attention(s.view(), s.view(), s.view());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < dh; ++c) out[i * d + h * dh + c] = o[i * dh + c];
  }
  return out;
}

TEST(MultiHead, ArticleShape) {
  std::mt19937 rng(20);
  const auto x = cast<float>(random_tensor({5, 8}, rng, 0, 1));
  EXPECT_EQ(multi_head(x.view(), 4).shape(), (Shape{5, 8}));
}

TEST(MultiHead, EqualsAttentionOnEachSlice) {
  std::mt19937 rng(21);
  for (auto [n, d, heads] : std::vector<std::array<int64_t, 3>>{
           {5, 8, 4}, {1, 6, 3}, {7, 12, 1}, {4, 10, 10}, {9, 32, 8}}) {
    const auto x = random_tensor({n, d}, rng, 0, 1);
    const auto expected = multi_head_by_slices(x, heads);
    EXPECT_LT(test::rel_error(multi_head(x.view(), heads), expected), 1e-14);
    EXPECT_LT(test::rel_error(multi_head(cast<float>(x).view(), heads), expected), 1e-5);
  }
}

TEST(MultiHead, BatchAxesAreIndependent) {
  std::mt19937 rng(22);
  const auto x = random_tensor({3, 5, 8}, rng);
  const auto y = multi_head(x.view(), 2);
  for (int64_t b = 0; b < 3; ++b) {
    Tensor<double> xb({5, 8});
    std::copy(x.data() + b * 40, x.data() + (b + 1) * 40, xb.data());
    const auto yb = multi_head_by_slices(xb, 2);
    for (int64_t i = 0; i < 40; ++i) EXPECT_NEAR(y[b * 40 + i], yb[i], 1e-14);
  }
}

TEST(MultiHead, WeightsAreEachSlicesAttentionWeights) {
  std::mt19937 rng(25);
  for (auto [n, d, heads] : std::vector<std::array<int64_t, 3>>{
           {3, 8, 4}, {5, 6, 3}, {1, 4, 1}, {7, 12, 2}}) {
    const auto x = random_tensor({n, d}, rng);
    for (bool causal : {false, true}) {
      AttentionOptions opt;
      if (causal) opt.causal = Causal::BottomRight;
      const auto r = multi_head_with_weights(x.view(), heads, opt);
      EXPECT_EQ(r.weights.shape(), (Shape{heads, n, n}));
      EXPECT_LE(max_abs_diff(r.out, multi_head(x.view(), heads, opt)), 0);
      for (int64_t h = 0; h < heads; ++h) {
        const auto s = head_slice(x, h, d / heads);
        const auto ref = test::forward_with_weights(s.view(), s.view(), s.view(), opt).weights;
        for (int64_t i = 0; i < n * n; ++i)
          EXPECT_NEAR(r.weights[h * n * n + i], ref[i], 1e-12) << "head " << h << " n " << n;
      }
    }
    const auto r32 = multi_head_with_weights(cast<float>(x).view(), heads);
    for (int64_t row = 0; row < heads * n; ++row) {  // each row a distribution
      double sum = 0;
      for (int64_t j = 0; j < n; ++j) sum += r32.weights[row * n + j];
      EXPECT_NEAR(sum, 1.0, 1e-5);
    }
  }
}

TEST(MultiHead, WeightsOfBatchedInputAreBatched) {
  std::mt19937 rng(26);
  const auto x = random_tensor({2, 5, 8}, rng);
  const auto r = multi_head_with_weights(x.view(), 2);
  EXPECT_EQ(r.weights.shape(), (Shape{2, 2, 5, 5}));
  Tensor<double> second({5, 8});
  std::copy(x.data() + 40, x.data() + 80, second.data());
  const auto ref = multi_head_with_weights(second.view(), 2).weights;
  for (int64_t i = 0; i < ref.numel(); ++i) EXPECT_EQ(r.weights[ref.numel() + i], ref[i]);
}

TEST(MultiHead, RopePerHeadRotatesEachSliceOnItsOwn) {
  std::mt19937 rng(27);
  const int64_t n = 6, d = 12, heads = 3, dh = 4;
  const auto x = random_tensor({n, d}, rng);
  const auto y = apply_rope_per_head(x.view(), heads);
  for (int64_t h = 0; h < heads; ++h) {
    const auto ref = apply_rope(head_slice(x, h, dh).view());
    EXPECT_LE(max_abs_diff(head_slice(y, h, dh), ref), 0) << "head " << h;
  }
  EXPECT_THROW_MSG(apply_rope_per_head(x.view(), 4), ValueError,
                   "head dimension d / heads = 12 / 4 must be even");
  EXPECT_THROW_MSG(apply_rope_per_head(x.view(), 5), ValueError,
                   "heads (5) must divide the model dimension d (12)");
}

TEST(MultiHead, HeadsMustDivideTheModelDimension) {
  Tensor<float> x({5, 8});
  EXPECT_THROW_MSG(multi_head(x.view(), 3), ValueError,
                   "heads (3) must divide the model dimension d (8) of x (5, 8)");
  EXPECT_THROW_MSG(multi_head(x.view(), 0), ValueError, "heads must be >= 1");
  Tensor<float> flat({8});
  EXPECT_THROW_MSG(multi_head(flat.view(), 2), ValueError, "(..., n, d)");
  EXPECT_THROW_MSG(multi_head_with_weights(x.view(), 3), ValueError,
                   "heads (3) must divide the model dimension d (8) of x (5, 8)");
}

// ---------------------------------------------------------------------------
// The article: attention is blind to order; positional encoding fixes it.

Tensor<float> permute_rows(const Tensor<float>& x, const std::vector<int64_t>& perm) {
  const int64_t d = x.dim(1);
  Tensor<float> y(x.shape());
  for (size_t i = 0; i < perm.size(); ++i)
    std::copy(x.data() + perm[i] * d, x.data() + (perm[i] + 1) * d, y.data() + i * d);
  return y;
}

// max |multi_head(P x) - P multi_head(x)| after `encode` is applied to both inputs.
template <class Encode>
double equivariance_error(const Tensor<float>& x, const std::vector<int64_t>& perm,
                          Encode encode) {
  const auto y = multi_head(encode(x).view(), 4);
  const auto y_perm = multi_head(encode(permute_rows(x, perm)).view(), 4);
  return max_abs_diff(y_perm, permute_rows(y, perm));
}

Tensor<float> add_sinusoidal(Tensor<float> x) {
  const auto pe = sinusoidal_encoding<float>(x.dim(0), x.dim(1));
  for (int64_t i = 0; i < x.numel(); ++i) x[i] += pe[i];
  return x;
}

Tensor<float> rope_per_head(const Tensor<float>& x) {
  const int64_t n = x.dim(0), d = x.dim(1), dh = d / 4;
  Tensor<float> out(x.shape());
  const Shape shape{4, n, dh};
  const Strides strides{dh, d, 1};
  apply_rope(TensorView<const float>(x.data(), shape, strides),
             TensorView<float>(out.data(), shape, strides));
  return out;
}

TEST(ArticleClaims, WithoutPositionsPermutingRowsPermutesOutputs) {
  std::mt19937 rng(23);
  for (int64_t n : {3, 5, 16}) {
    const auto x = cast<float>(random_tensor({n, 8}, rng, 0, 1));
    std::vector<int64_t> perm(n);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::reverse(perm.begin(), perm.end());
    const auto identity = [](Tensor<float> t) { return t; };
    EXPECT_LE(equivariance_error(x, perm, identity), 1e-6);
    EXPECT_GT(equivariance_error(x, perm, add_sinusoidal), 1e-3);
    EXPECT_GT(equivariance_error(x, perm, rope_per_head), 1e-3);
  }
}

TEST(ArticleClaims, CatBitesDogDiffersFromDogBitesCatOnlyWithPositions) {
  // Word vectors for 猫 (cat), 咬 (bite), 狗 (dog); sentences are row orders.
  std::mt19937 rng(24);
  const auto words = cast<float>(random_tensor({3, 8}, rng, 0, 1));
  const std::vector<int64_t> reversed{2, 1, 0};  // 猫咬狗 -> 狗咬猫
  const auto identity = [](Tensor<float> t) { return t; };
  EXPECT_LE(equivariance_error(words, reversed, identity), 1e-6);
  EXPECT_GT(equivariance_error(words, reversed, add_sinusoidal), 1e-3);
  EXPECT_GT(equivariance_error(words, reversed, rope_per_head), 1e-3);
}

}  // namespace
}  // namespace attn
