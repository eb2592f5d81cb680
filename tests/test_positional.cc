// Sinusoidal encoding against the article's formula; RoPE's defining
// properties and its accuracy at long positions.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "helpers.hpp"

namespace attn {
namespace {

using test::cast;
using test::max_abs_diff;
using test::random_tensor;

TEST(Sinusoidal, MatchesTheArticlesFormula) {
  for (auto [n, d] : std::vector<std::pair<int64_t, int64_t>>{
           {5, 8}, {1, 1}, {7, 3}, {50, 17}, {128, 64}, {3, 2}}) {
    const auto pe32 = sinusoidal_encoding<float>(n, d);
    const auto pe64 = sinusoidal_encoding<double>(n, d);
    ASSERT_EQ(pe32.shape(), (Shape{n, d}));
    for (int64_t p = 0; p < n; ++p)
      for (int64_t i = 0; i < d; ++i) {
        const long double angle = p / std::pow(10000.0L, (2 * (i / 2)) / (long double)d);
        const long double e = i % 2 == 0 ? std::sin(angle) : std::cos(angle);
        EXPECT_NEAR(pe64[p * d + i], (double)e, 1e-13) << p << "," << i;
        EXPECT_NEAR(pe32[p * d + i], (double)e, 1e-7) << p << "," << i;
      }
  }
  EXPECT_EQ(sinusoidal_encoding<float>(0, 4).shape(), (Shape{0, 4}));
}

TEST(Sinusoidal, BaseAndErrors) {
  const auto pe = sinusoidal_encoding<double>(4, 4, 100.0);
  EXPECT_NEAR(pe[3 * 4 + 2], std::sin(3.0 / 10.0), 1e-15);  // 100^(2/4) = 10
  EXPECT_THROW_MSG(sinusoidal_encoding<float>(-1, 4), ValueError, "n must be >= 0, got -1");
  EXPECT_THROW_MSG(sinusoidal_encoding<float>(4, 0), ValueError, "d must be >= 1, got 0");
  EXPECT_THROW_MSG(sinusoidal_encoding<float>(4, 4, -2), ValueError, "base");
  EXPECT_THROW_MSG(sinusoidal_encoding<float>(int64_t{1} << 40, int64_t{1} << 40), ValueError,
                   "refusing to allocate");
}

// ---------------------------------------------------------------------------
// RoPE

TEST(Rope, TwoDimensionsIsARotationByThePosition) {
  const Tensor<double> x({4, 2}, {1, 0, 1, 0, 1, 0, 1, 0});
  const auto y = apply_rope(x.view());
  for (int64_t p = 0; p < 4; ++p) {
    EXPECT_NEAR(y[p * 2], std::cos(double(p)), 1e-15);
    EXPECT_NEAR(y[p * 2 + 1], std::sin(double(p)), 1e-15);
  }
}

TEST(Rope, PreservesNorms) {
  std::mt19937 rng(30);
  const auto x = random_tensor({2, 3, 9, 16}, rng);
  for (bool inter : {false, true}) {
    RopeOptions o;
    o.interleaved = inter;
    const auto y = apply_rope(cast<float>(x).view(), o);
    for (int64_t r = 0; r < x.numel() / 16; ++r) {
      double a = 0, b = 0;
      for (int64_t c = 0; c < 16; ++c) a += x[r * 16 + c] * x[r * 16 + c], b += y[r * 16 + c] * y[r * 16 + c];
      EXPECT_NEAR(std::sqrt(b), std::sqrt(a), 1e-6);
    }
  }
}

// q·k after RoPE depends only on the difference of positions.
TEST(Rope, ScoresDependOnlyOnRelativePosition) {
  std::mt19937 rng(31);
  const auto q = cast<float>(random_tensor({6, 64}, rng)), k = cast<float>(random_tensor({6, 64}, rng));
  for (bool inter : {false, true}) {
    RopeOptions o;
    o.interleaved = inter;
    const auto scores = [&](int64_t shift_q, int64_t shift_k) {
      o.offset = shift_q;
      const auto qr = apply_rope(q.view(), o);
      o.offset = shift_k;
      const auto kr = apply_rope(k.view(), o);
      Tensor<float> s({6, 6});
      for (int64_t i = 0; i < 6; ++i)
        for (int64_t j = 0; j < 6; ++j) {
          float acc = 0;
          for (int64_t c = 0; c < 64; ++c) acc += qr[i * 64 + c] * kr[j * 64 + c];
          s[i * 6 + j] = acc;
        }
      return s;
    };
    const auto s0 = scores(0, 0);
    EXPECT_LT(max_abs_diff(s0, scores(1000, 1000)), 1e-5);
    EXPECT_GT(max_abs_diff(s0, scores(0, 1)), 1e-2) << "shifting only the keys must matter";
  }
}

// Half-split pairs (k, k + r/2) and interleaved pairs (2k, 2k + 1) are the same
// rotation up to a permutation of the features.
TEST(Rope, PairingsAgreeAfterPermutingFeatures) {
  std::mt19937 rng(32);
  for (int64_t r : {16, 10}) {
    const int64_t d = 16, half = r / 2;
    const auto x = random_tensor({5, d}, rng);
    Tensor<double> xp(x.shape());  // interleaved layout -> half-split layout
    for (int64_t t = 0; t < 5; ++t) {
      for (int64_t k = 0; k < half; ++k) {
        xp[t * d + k] = x[t * d + 2 * k];
        xp[t * d + k + half] = x[t * d + 2 * k + 1];
      }
      for (int64_t c = r; c < d; ++c) xp[t * d + c] = x[t * d + c];
    }
    RopeOptions o;
    o.rotary_dim = r;
    o.offset = 3;
    const auto yh = apply_rope(xp.view(), o);
    o.interleaved = true;
    const auto yi = apply_rope(x.view(), o);
    for (int64_t t = 0; t < 5; ++t) {
      for (int64_t k = 0; k < half; ++k) {
        EXPECT_NEAR(yh[t * d + k], yi[t * d + 2 * k], 1e-14);
        EXPECT_NEAR(yh[t * d + k + half], yi[t * d + 2 * k + 1], 1e-14);
      }
      for (int64_t c = r; c < d; ++c) {  // beyond rotary_dim: untouched
        EXPECT_EQ(yi[t * d + c], x[t * d + c]);
        EXPECT_EQ(yh[t * d + c], xp[t * d + c]);
      }
    }
  }
}

TEST(Rope, LongPositionsAreAccurate) {
  std::mt19937 rng(33);
  const int64_t d = 128;
  const auto x = random_tensor({3, d}, rng);
  const Tensor<int64_t> pos({3}, {1000000, 131071, -999999});
  const auto y64 = apply_rope(x.view(), {}, pos.view());
  const auto y32 = apply_rope(cast<float>(x).view(), {}, pos.view());
  double err64 = 0, err32 = 0;
  for (int64_t t = 0; t < 3; ++t)
    for (int64_t k = 0; k < d / 2; ++k) {
      const long double theta = (long double)pos[t] * std::pow(10000.0L, -2.0L * k / d);
      const long double c = std::cos(theta), s = std::sin(theta);
      const long double a = x[t * d + k], b = x[t * d + k + d / 2];
      const long double ea = a * c - b * s, eb = b * c + a * s;
      err64 = std::fmax(err64, (double)std::fabs(ea - y64[t * d + k]));
      err64 = std::fmax(err64, (double)std::fabs(eb - y64[t * d + k + d / 2]));
      err32 = std::fmax(err32, (double)std::fabs(ea - y32[t * d + k]));
      err32 = std::fmax(err32, (double)std::fabs(eb - y32[t * d + k + d / 2]));
    }
  // The angle 1e6 carries ~1e6 * 2^-53 ≈ 1e-10 absolute error in double.
  EXPECT_LT(err64, 1e-9);
  // float32: only the input and output roundings (inputs in [-1, 1]).
  EXPECT_LT(err32, 1e-6);
}

TEST(Rope, ExplicitPositionsOffsetsAndInverse) {
  std::mt19937 rng(34);
  const auto x = random_tensor({2, 3, 4, 8}, rng);
  RopeOptions o;
  o.offset = 7;
  const auto by_offset = apply_rope(x.view(), o);
  const Tensor<int64_t> pos({4}, {7, 8, 9, 10});
  EXPECT_EQ(max_abs_diff(apply_rope(x.view(), {}, pos.view()), by_offset), 0.0);
  // (2, 1, 4) positions broadcast over heads; negative positions undo.
  Tensor<int64_t> p2({2, 1, 4}), neg({2, 1, 4});
  for (int64_t i = 0; i < 8; ++i) p2[i] = int64_t(rng() % 5000) - 2500, neg[i] = -p2[i];
  const auto y = apply_rope(x.view(), {}, p2.view());
  const auto back = apply_rope(y.view(), {}, neg.view());
  EXPECT_LT(max_abs_diff(back, x), 1e-12);
  // each row uses its batch's position
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 4; ++t) {
      Tensor<double> one({1, 8});
      std::copy(x.data() + (b * 12 + t) * 8, x.data() + (b * 12 + t + 1) * 8, one.data());
      RopeOptions at;
      at.offset = p2[b * 4 + t];
      const auto e = apply_rope(one.view(), at);
      for (int64_t c = 0; c < 8; ++c) EXPECT_NEAR(y[(b * 12 + t) * 8 + c], e[c], 1e-15);
    }
}

// rotary_dim 0 rotates nothing (a fuzzer found the angle table indexed when
// empty; this is its regression test).
TEST(Rope, RotaryDimZeroIsTheIdentity) {
  std::mt19937 rng(36);
  const auto x = random_tensor({2, 3, 5, 6}, rng);
  RopeOptions o;
  o.rotary_dim = 0;
  EXPECT_EQ(max_abs_diff(apply_rope(x.view(), o), x), 0.0);
  const Tensor<int64_t> pos({5}, {4, 3, 2, 1, 0});
  EXPECT_EQ(max_abs_diff(apply_rope(x.view(), o, pos.view()), x), 0.0);
}

TEST(Rope, InPlace) {
  std::mt19937 rng(35);
  auto x = cast<float>(random_tensor({4, 6}, rng));
  const auto expected = apply_rope(x.view());
  apply_rope(x.view(), x.view());
  EXPECT_EQ(max_abs_diff(x, expected), 0.0);
}

TEST(Rope, Errors) {
  Tensor<float> x({4, 6}), odd({4, 5});
  RopeOptions o;
  o.rotary_dim = 3;
  EXPECT_THROW_MSG(apply_rope(x.view(), o), ValueError, "rotary_dim must be even and in [0, d=6], got 3");
  o.rotary_dim = 8;
  EXPECT_THROW_MSG(apply_rope(x.view(), o), ValueError, "got 8");
  EXPECT_THROW_MSG(apply_rope(odd.view()), ValueError, "pass an even rotary_dim");
  const Tensor<int64_t> pos({3}, {0, 1, 2});
  EXPECT_THROW_MSG(apply_rope(x.view(), {}, pos.view()), ValueError,
                   "positions of shape (3,) does not broadcast to (4,)");
  Tensor<float> flat({6});
  EXPECT_THROW_MSG(apply_rope(flat.view()), ValueError, "(..., n, d)");
  o = {};
  o.base = 0;
  EXPECT_THROW_MSG(apply_rope(x.view(), o), ValueError, "base");
  // Found by fuzz_rope (signed overflow computing the positions): refused.
  o = {};
  o.offset = std::numeric_limits<int64_t>::max() - 2;
  EXPECT_THROW_MSG(apply_rope(x.view(), o), ValueError, "overflow int64");
  o.offset = std::numeric_limits<int64_t>::max() - 3;  // the last position just fits
  EXPECT_EQ(apply_rope(x.view(), o).shape(), x.shape());
}

}  // namespace
}  // namespace attn
