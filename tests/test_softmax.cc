#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "helpers.hpp"

namespace attn {
namespace {

using test::kInf;

// exp(x - max) / sum in long double: the textbook definition.
Tensor<double> softmax_ld(const Tensor<double>& a) {
  Tensor<double> out(a.shape());
  const int64_t n = a.dim(-1);
  for (int64_t r = 0; r < a.numel() / n; ++r) {
    long double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < n; ++j) m = std::fmax(m, (long double)a[r * n + j]);
    for (int64_t j = 0; j < n; ++j) s += std::exp((long double)a[r * n + j] - m);
    for (int64_t j = 0; j < n; ++j)
      out[r * n + j] = static_cast<double>(std::exp((long double)a[r * n + j] - m) / s);
  }
  return out;
}

TEST(Softmax, MatchesDefinitionAndRowsSumToOne) {
  std::mt19937 rng(1);
  for (const Shape& shape : {Shape{1}, Shape{7}, Shape{3, 5}, Shape{2, 3, 33}}) {
    const auto a = test::random_tensor(shape, rng, -20, 20);
    const auto expected = softmax_ld(a);
    const auto y64 = softmax(a.view());
    const auto y32 = softmax(test::cast<float>(a).view());
    EXPECT_LT(test::rel_error(y64, expected), 1e-14);
    EXPECT_LT(test::rel_error(y32, expected), 1e-6);
    const int64_t n = shape.back();
    for (int64_t r = 0; r < a.numel() / n; ++r) {
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += y64[r * n + j];
      EXPECT_NEAR(s, 1.0, 1e-14);
    }
  }
}

TEST(Softmax, AxisArgument) {
  std::mt19937 rng(2);
  const auto a = test::random_tensor({4, 3}, rng);
  const auto along0 = softmax(a.view(), 0);
  // softmax over axis 0 == softmax over the last axis of the transpose
  const auto t = contiguous(a.view().transpose(0, 1));
  const auto ref = softmax_ld(t);
  const auto back = contiguous(ref.view().transpose(0, 1));
  EXPECT_LT(test::rel_error(along0, back), 1e-14);
  EXPECT_THROW_MSG(softmax(a.view(), 2), ValueError, "axis 2 is out of range");
}

TEST(Softmax, LargeLogitsDoNotOverflow) {
  const Tensor<double> a({3}, {1e4, -1e4, 0});
  for (const auto& y : {softmax(a.view()), test::cast<double>(softmax(test::cast<float>(a).view()))}) {
    EXPECT_EQ(y[0], 1.0);
    EXPECT_EQ(y[1], 0.0);
    EXPECT_EQ(y[2], 0.0);
  }
  const Tensor<double> b({2}, {1e4, 1e4 - std::log(3.0)});
  EXPECT_NEAR(softmax(b.view())[0], 0.75, 1e-12);
}

TEST(Softmax, MinusInfinityIsMaskedAndAllMaskedRowIsZero) {
  const Tensor<double> a({2, 3}, {0, -kInf, 0, -kInf, -kInf, -kInf});
  for (const auto& y : {softmax(a.view()), test::cast<double>(softmax(test::cast<float>(a).view()))}) {
    EXPECT_EQ(y[0], 0.5);
    EXPECT_EQ(y[1], 0.0);
    EXPECT_EQ(y[2], 0.5);
    for (int j = 3; j < 6; ++j) EXPECT_EQ(y[j], 0.0);
  }
}

TEST(Softmax, PlusInfinityTakesAllTheWeight) {
  const Tensor<double> a({3}, {kInf, 5, kInf});
  const auto y = softmax(a.view());
  EXPECT_EQ(y[0], 0.5);
  EXPECT_EQ(y[1], 0.0);
  EXPECT_EQ(y[2], 0.5);
}

TEST(Softmax, NanMakesItsRowNan) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor<double> a({3, 3}, {1, nan, 2, 0, 0, 0, nan, -kInf, -kInf});
  for (const auto& y : {softmax(a.view()), test::cast<double>(softmax(test::cast<float>(a).view()))}) {
    for (int j : {0, 1, 2, 6, 7, 8}) EXPECT_TRUE(std::isnan(y[j])) << j;
    for (int j : {3, 4, 5}) EXPECT_NEAR(y[j], 1.0 / 3, 1e-7);
  }
}

TEST(Softmax, OutputShapeIsChecked) {
  Tensor<float> a({2, 3}), out({3, 2});
  EXPECT_THROW_MSG(softmax(a.view(), out.view()), ValueError, "out has shape (3, 2)");
}

}  // namespace
}  // namespace attn
