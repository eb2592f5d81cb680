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

// A frequency of 1e300 (base 1e-300, linear factor 1e-150) at position
// INT64_MAX: the angle overflows to infinity, whose cosine is NaN. Refused
// (it gave NaN on finite input; fuzz_rope found it), in place leaving x as it was.
TEST(Rope, AnglesBeyondDoubleAreRefused) {
  Tensor<double> x({1, 4});
  for (int64_t i = 0; i < 4; ++i) x[i] = 1;
  const Tensor<int64_t> far({1}, {std::numeric_limits<int64_t>::max()});
  RopeOptions o;
  o.base = 1e-300;
  o.scaling = parse_rope_scaling(R"({"rope_type": "linear", "factor": 1e-150})");
  EXPECT_THROW_MSG(apply_rope(TensorView<const double>(x.view()), x.view(), o, far.view()), ValueError,
                   "the angle position × frequency overflows: position 9223372036854775807");
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(x[i], 1.0);
  o.scaling = {};  // 1e150 at that position: finite angles
  const auto y = apply_rope(TensorView<const double>(x.view()), o, far.view());
  for (int64_t i = 0; i < 4; ++i) EXPECT_TRUE(std::isfinite(y[i]));
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

// ---------------------------------------------------------------------------
// RoPE scaling (Hugging Face's rope_scaling): each type against its closed
// form; tests/python/test_positional_encodings.py checks them against
// Hugging Face's formulas at real models' settings.

std::vector<double> plain_frequencies(int64_t r, double base) {
  std::vector<double> f(r / 2);
  for (int64_t k = 0; k < r / 2; ++k) f[k] = std::pow(base, -2.0 * double(k) / double(r));
  return f;
}

TEST(RopeScaling, EachTypeFollowsItsClosedForm) {
  const auto plain = plain_frequencies(64, 10000.0);
  RopeScaling s = parse_rope_scaling(R"({"rope_type": "linear", "factor": 4})");
  auto f = rope_frequencies(64, 10000.0, s);
  for (int64_t k = 0; k < 32; ++k) EXPECT_DOUBLE_EQ(f.inv_freq[k], plain[k] / 4);
  EXPECT_EQ(f.attention_factor, 1.0);

  // dynamic: unchanged up to the original context, then base · (f·s/o − f + 1)^(r/(r−2))
  s = parse_rope_scaling(R"({"type": "dynamic", "factor": 2, "original_max_position_embeddings": 1000})");
  f = rope_frequencies(64, 10000.0, s, 1000);
  for (int64_t k = 0; k < 32; ++k) EXPECT_DOUBLE_EQ(f.inv_freq[k], plain[k]);
  f = rope_frequencies(64, 10000.0, s, 3000);
  const auto grown = plain_frequencies(64, 10000.0 * std::pow(2.0 * 3 - 1, 64.0 / 62));
  for (int64_t k = 0; k < 32; ++k) EXPECT_DOUBLE_EQ(f.inv_freq[k], grown[k]);

  // yarn: the fastest pairs extrapolate (kept), the slowest interpolate (/ factor)
  s = parse_rope_scaling(R"({"rope_type": "yarn", "factor": 8, "original_max_position_embeddings": 4096})");
  f = rope_frequencies(64, 10000.0, s);
  EXPECT_DOUBLE_EQ(f.inv_freq[0], plain[0]);
  EXPECT_DOUBLE_EQ(f.inv_freq[31], plain[31] / 8);
  EXPECT_DOUBLE_EQ(f.attention_factor, 0.1 * std::log(8.0) + 1);
  s.attention_factor = 1.5;
  EXPECT_EQ(rope_frequencies(64, 10000.0, s).attention_factor, 1.5);

  // longrope: per-pair factors, short up to the original context, long beyond
  RopeScaling lr;
  lr.rope_type = RopeType::LongRope;
  lr.short_factor = {1, 2, 3, 4};
  lr.long_factor = {5, 6, 7, 8};
  lr.original_max_position_embeddings = 100;
  lr.max_position_embeddings = 400;
  const auto p8 = plain_frequencies(8, 10000.0);
  for (auto [seq, factors] : {std::pair{100, lr.short_factor}, {101, lr.long_factor}}) {
    f = rope_frequencies(8, 10000.0, lr, seq);
    for (int64_t k = 0; k < 4; ++k) EXPECT_DOUBLE_EQ(f.inv_freq[k], p8[k] / factors[k]);
    EXPECT_DOUBLE_EQ(f.attention_factor, std::sqrt(1 + std::log(4.0) / std::log(100.0)));
  }

  // llama3: wavelengths shorter than original / high_freq_factor kept,
  // longer than original / low_freq_factor divided by factor, a blend between
  s = parse_rope_scaling(R"({"rope_type": "llama3", "factor": 8, "low_freq_factor": 1,
                             "high_freq_factor": 4, "original_max_position_embeddings": 8192})");
  const auto p128 = plain_frequencies(128, 500000.0);
  f = rope_frequencies(128, 500000.0, s);
  for (int64_t k = 0; k < 64; ++k) {
    const double wavelen = 2 * M_PI / p128[k];
    if (wavelen < 2048) EXPECT_DOUBLE_EQ(f.inv_freq[k], p128[k]);
    else if (wavelen > 8192) EXPECT_DOUBLE_EQ(f.inv_freq[k], p128[k] / 8);
    else EXPECT_TRUE(f.inv_freq[k] < p128[k] && f.inv_freq[k] > p128[k] / 8) << k;
  }
}

TEST(RopeScaling, JsonRoundTrips) {
  for (const char* text : {
           R"({"rope_type": "default"})",
           R"({"type": "linear", "factor": 2.5})",
           R"({"rope_type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 0.707,
               "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096, "truncate": false})",
           R"({"rope_type": "longrope", "short_factor": [1, 1.5], "long_factor": [2, 4.25],
               "original_max_position_embeddings": 4096, "max_position_embeddings": 131072,
               "attention_factor": null, "partial_rotary_factor": 0.5})",
           R"({"type": "mrope", "mrope_section": [1, 2, 3]})"}) {
    SCOPED_TRACE(text);
    const RopeScaling s = parse_rope_scaling(text);
    EXPECT_EQ(parse_rope_scaling(rope_scaling_json(s)), s);
  }
  EXPECT_EQ(parse_rope_scaling(R"({"type": "mrope", "mrope_section": [16, 24, 24]})").rope_type,
            RopeType::Default);
}

TEST(RopeScaling, ErrorsNameTheKey) {
  EXPECT_THROW_MSG(parse_rope_scaling("{"), ValueError, "rope_scaling: not valid JSON");
  EXPECT_THROW_MSG(parse_rope_scaling("[1]"), ValueError, "must be a dict");
  EXPECT_THROW_MSG(parse_rope_scaling(R"({"rope_type": "su"})"), ValueError, "unknown rope_type 'su'");
  EXPECT_THROW_MSG(parse_rope_scaling(R"({"rope_type": "linear"})"), ValueError,
                   "rope_type 'linear' needs 'factor'");
  EXPECT_THROW_MSG(parse_rope_scaling(R"({"rope_type": "dynamic", "factor": 2})"), ValueError,
                   "needs 'original_max_position_embeddings'");
  EXPECT_THROW_MSG(parse_rope_scaling(R"({"rope_type": "linear", "factor": 2, "low_freq_factor": 1})"),
                   ValueError, "'low_freq_factor' is not a key of rope_type 'linear'");
  EXPECT_THROW_MSG(parse_rope_scaling(R"({"rope_type": "linear", "factor": 0})"), ValueError,
                   "'factor' must be a finite number > 0, got 0");
  EXPECT_THROW_MSG(parse_rope_scaling(R"({"rope_type": "default", "partial_rotary_factor": 1.5})"),
                   ValueError, "'partial_rotary_factor' must be in (0, 1]");
  EXPECT_THROW_MSG(parse_rope_scaling(R"({"rope_type": "default", "mrope_section": [1, "2"]})"),
                   ValueError, "'mrope_section' must be a number");
  // A struct built in C++ is checked the same way when it is used.
  RopeScaling s;
  s.rope_type = RopeType::Linear;
  EXPECT_THROW_MSG(rope_frequencies(8, 10000.0, s), ValueError, "needs 'factor'");
  s.factor = 2;
  s.beta_fast = 32;
  EXPECT_THROW_MSG(rope_frequencies(8, 10000.0, s), ValueError, "'beta_fast' is not a key");
  EXPECT_THROW_MSG(rope_frequencies(7, 10000.0, {}), ValueError, "rotary_dim must be even");
}

TEST(Rope, ScalingTurnsByItsFrequenciesTimesTheAttentionFactor) {
  std::mt19937 rng(40);
  const auto x = random_tensor({3, 5, 16}, rng);
  const Tensor<int64_t> pos({5}, {0, 7, 100000, 3, 999999});
  RopeOptions o;
  o.scaling = parse_rope_scaling(R"({"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 64})");
  const auto f = rope_frequencies(16, o.base, o.scaling);
  const auto y = apply_rope(x.view(), o, pos.view());
  for (int64_t h = 0; h < 3; ++h)
    for (int64_t t = 0; t < 5; ++t)
      for (int64_t k = 0; k < 8; ++k) {
        const double theta = double(pos[t]) * f.inv_freq[k];
        const double a = x.at({h, t, k}), b = x.at({h, t, k + 8});
        EXPECT_NEAR(y.at({h, t, k}), f.attention_factor * (a * std::cos(theta) - b * std::sin(theta)), 1e-14);
        EXPECT_NEAR(y.at({h, t, k + 8}), f.attention_factor * (b * std::cos(theta) + a * std::sin(theta)), 1e-14);
      }
}

// Tables holding the computed angles' cos and sin give the computed rotation
// exactly, for both pairings and in the backward.
TEST(Rope, TablesOfTheComputedAnglesGiveTheSameRotation) {
  std::mt19937 rng(41);
  const auto x = random_tensor({2, 6, 12}, rng);
  const Tensor<int64_t> pos({2, 6}, {5, 0, 3, 3, 9, 1, 2, 2, 8, 7, 6, 0});
  RopeOptions o;
  o.rotary_dim = 8;
  o.scaling = parse_rope_scaling(R"({"rope_type": "linear", "factor": 2})");
  const auto f = rope_frequencies(8, o.base, o.scaling);
  Tensor<double> c({10, 4}), s({10, 4});
  for (int64_t p = 0; p < 10; ++p)
    for (int64_t k = 0; k < 4; ++k) {
      c.at({p, k}) = f.attention_factor * std::cos(double(p) * f.inv_freq[k]);
      s.at({p, k}) = f.attention_factor * std::sin(double(p) * f.inv_freq[k]);
    }
  RopeOptions table_options;
  table_options.rotary_dim = 8;  // (tables of width 4 rotate 8 of the 12 features only when asked)
  for (bool inter : {false, true}) {
    o.interleaved = table_options.interleaved = inter;
    const RopeTables<double> tables{c.view(), s.view()};
    EXPECT_EQ(max_abs_diff(apply_rope(x.view(), tables, table_options, pos.view()),
                           apply_rope(x.view(), o, pos.view())), 0.0);
    EXPECT_EQ(max_abs_diff(rope_backward(x.view(), tables, table_options, pos.view()),
                           rope_backward(x.view(), o, pos.view())), 0.0);
  }
  const Tensor<int64_t> far({6}, {0, 1, 2, 3, 4, 10});
  EXPECT_THROW_MSG(apply_rope(x.view(), RopeTables<double>{c.view(), s.view()}, table_options, far.view()), ValueError,
                   "position 10 is outside the cos/sin tables, which hold positions 0..9");
  // Narrower than rotary_dim / 2 (the head dim by default): refused, as
  // ONNX's reference refuses it, naming both widths (it rotated 8 silently).
  EXPECT_THROW_MSG(apply_rope(x.view(), RopeTables<double>{c.view(), s.view()}, {}, pos.view()), ValueError,
                   "rope: the cos/sin tables are 4 wide, but rotary_dim / 2 is 6 (rotary_dim 12 (the default, all of "
                   "d)): they must match; pass tables of width 6, or rotary_dim=8 to rotate the first 8 features only");
}

// M-RoPE: pair k turns by the position of its section's row.
TEST(Rope, MropeSectionsTurnByTheirRow) {
  std::mt19937 rng(42);
  const auto x = random_tensor({4, 12}, rng);
  RopeOptions o;
  o.scaling.mrope_section = {1, 2, 3};
  const Tensor<int64_t> pos({3, 4}, {0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23});
  const auto y = apply_rope(x.view(), o, pos.view());
  const int64_t row_of[6] = {0, 1, 1, 2, 2, 2};
  for (int64_t t = 0; t < 4; ++t)
    for (int64_t k = 0; k < 6; ++k) {
      const double theta = double(pos.at({row_of[k], t})) * std::pow(10000.0, -2.0 * double(k) / 12);
      const double a = x.at({t, k}), b = x.at({t, k + 6});
      EXPECT_NEAR(y.at({t, k}), a * std::cos(theta) - b * std::sin(theta), 1e-14);
      EXPECT_NEAR(y.at({t, k + 6}), b * std::cos(theta) + a * std::sin(theta), 1e-14);
    }
  // every row at one position: plain RoPE
  const Tensor<int64_t> same({3, 4}, {4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7});
  const Tensor<int64_t> plain({4}, {4, 5, 6, 7});
  EXPECT_EQ(max_abs_diff(apply_rope(x.view(), o, same.view()), apply_rope(x.view(), {}, plain.view())), 0.0);
  o.scaling.mrope_section = {1, 2, 2};
  EXPECT_THROW_MSG(apply_rope(x.view(), o, pos.view()), ValueError, "must add up to rotary_dim / 2 = 6");
}

}  // namespace
}  // namespace attn
