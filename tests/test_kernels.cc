// The float32 kernels (flash and decode) against the double reference, on
// shapes that force every tile case, for every SIMD target this CPU can run
// (forced one at a time), and at several thread counts.
#include <gtest/gtest.h>


#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attn/threads.hpp"
#include "helpers.hpp"
#include "kernels/attention_kernel.hpp"
#include "kernels/config.hpp"
#include "softmax_rules.hpp"

namespace attn {
namespace {

using test::cast;
using test::describe;
using test::KernelCase;
using test::random_tensor;
using test::rel_error;

// ||a - b|| / ||b|| over the entries where b is finite, which must be -inf
// (or +inf) exactly where b is: logits and log-sum-exps hold -inf for the
// keys and rows that take no part.
double finite_rel_error(const Tensor<float>& a, const Tensor<double>& b) {
  EXPECT_EQ(a.shape(), b.shape());
  long double num = 0, den = 0;
  for (int64_t e = 0; e < b.numel(); ++e) {
    if (std::isinf(b[e])) {
      EXPECT_EQ(double(a[e]), b[e]) << "entry " << e;
      continue;
    }
    const long double diff = static_cast<long double>(a[e]) - b[e];
    num += diff * diff;
    den += static_cast<long double>(b[e]) * b[e];
  }
  return den == 0 ? std::sqrt(double(num)) : std::sqrt(double(num / den));
}

// Checks out against the reference, with the log-sum-exp; with `weights`
// also the weights and the logits (a stage chosen by the seed); returns out.
// Without against_reference, only computes out (for comparing two runs).
Tensor<float> check(const KernelCase& c, bool weights, uint32_t seed, bool against_reference = true) {
  SCOPED_TRACE(describe(c));
  std::mt19937 rng(seed);
  const auto q = random_tensor({c.batch, c.hq, c.n_q, c.d}, rng);
  const auto k = random_tensor({c.batch, c.hkv, c.n_k, c.d}, rng);
  const auto v = random_tensor({c.batch, c.hkv, c.n_k, c.d_v}, rng);
  const AttentionOptions o = test::options_of(c);
  Tensor<bool> mb({c.n_q, c.n_k});
  Tensor<double> md = random_tensor({c.hq, 1, c.n_k}, rng, -2, 1);
  for (int64_t i = 0; i < mb.numel(); ++i) mb[i] = rng() % 5 != 0;
  for (int64_t i = 0; i < md.numel(); i += 7) md[i] = -std::numeric_limits<double>::infinity();
  const Tensor<float> mf = cast<float>(md);
  Mask m32, m64;
  if (c.mask == 1) m32 = m64 = TensorView<const bool>(mb.view());
  if (c.mask == 2) m32 = TensorView<const float>(mf.view()), m64 = TensorView<const double>(md.view());
  if (!against_reference)
    return attention(cast<float>(q).view(), cast<float>(k).view(), cast<float>(v).view(), o, m32);
  test::Returns returns;
  returns.weights = weights;
  returns.lse = true;
  if (weights) returns.logits = std::array{Logits::Scaled, Logits::Softcapped, Logits::Masked}[seed % 3];
  const auto ref = test::forward(q.view(), k.view(), v.view(), returns, o, m64);
  const auto got = test::forward(cast<float>(q).view(), cast<float>(k).view(),
                                         cast<float>(v).view(), returns, o, m32);
  EXPECT_LT(rel_error(got.out, ref.out), 1e-5);
  EXPECT_LT(finite_rel_error(got.lse, ref.lse), 1e-6);
  if (weights) {
    EXPECT_LT(rel_error(got.weights, ref.weights), 1e-5);
    EXPECT_LT(finite_rel_error(got.logits, ref.logits), 1e-6) << "stage " << int(*returns.logits);
  }
  return got.out;
}

std::vector<KernelCase> flash_cases() {
  // n_q and n_k straddle the 256-row query tiles, their row blocks and the
  // 64-key tiles.
  std::vector<KernelCase> cases;
  for (Causal causal : {Causal::None, Causal::BottomRight, Causal::TopLeft})
    cases.push_back({1, 2, 1, 300, 260, 64, 64, causal, {}, 0, 0});
  cases.push_back({2, 4, 2, 129, 65, 32, 48, Causal::BottomRight, {}, 0, 0});
  cases.push_back({1, 2, 2, 200, 333, 40, 24, Causal::None, {70, 10}, 0, 1});
  cases.push_back({1, 3, 3, 150, 150, 16, 20, Causal::TopLeft, {}, 30.0, 2});
  cases.push_back({1, 1, 1, 64, 64, 128, 128, Causal::None, {}, 0, 0});
  cases.push_back({1, 1, 1, 257, 500, 7, 5, Causal::BottomRight, {0, -1}, 0, 0});
  // ALiBi: BLOOM's slopes (6 heads: the interleaved extension), slopes of
  // larger magnitude, and negative ones, with every mask kind and alignment;
  // added as the scores are stored (no softcap, no mask), after softcap, or
  // with the masks.
  cases.push_back({1, 6, 2, 300, 260, 64, 64, Causal::None, {}, 0, 0, 8.0});
  cases.push_back({2, 4, 2, 129, 65, 32, 48, Causal::BottomRight, {}, 0, 1, -8.0});
  cases.push_back({1, 2, 2, 200, 333, 40, 24, Causal::TopLeft, {70, 10}, 30.0, 2, 16.0});
  cases.push_back({1, 2, 1, 150, 300, 32, 32, Causal::BottomRight, {}, 25.0, 0, 8.0});
  // Explicit causal offsets: a padded cache (the diagonal left of
  // bottom-right), rows with no key, one past every key, windows and ALiBi
  // measured from i + k.
  cases.push_back({1, 2, 1, 130, 400, 32, 32, Causal::offset(100), {}, 0, 0});
  cases.push_back({1, 2, 2, 300, 260, 16, 24, Causal::offset(-40), {}, 0, 1});
  cases.push_back({1, 2, 2, 70, 200, 32, 32, Causal::offset(500), {}, 0, 0});
  cases.push_back({2, 4, 2, 129, 333, 40, 24, Causal::offset(150), {60, 5}, 20.0, 2, 8.0});
  // Sinks: alone, with rows that have no key (the sink alone), with ALiBi
  // (whose anchor shifts the sink with the row), softcap and masks.
  cases.push_back({1, 3, 1, 300, 260, 64, 64, Causal::None, {}, 0, 0, 0, 4.0});
  cases.push_back({1, 6, 3, 200, 150, 32, 48, Causal::offset(-30), {}, 0, 1, 0, 2.0});
  cases.push_back({2, 6, 2, 129, 333, 40, 24, Causal::BottomRight, {60, 5}, 20.0, 2, 8.0, 3.0});
  return cases;
}

std::vector<KernelCase> decode_cases() {
  // n_q <= 32 and n_k beyond one 512-key chunk: the split-KV path.
  return {
      {1, 8, 8, 1, 1500, 128, 128, Causal::None, {}, 0, 0},
      {2, 8, 2, 3, 1025, 64, 64, Causal::BottomRight, {}, 0, 0},
      {1, 4, 1, 8, 2048, 32, 40, Causal::None, {600, -1}, 0, 1},
      {1, 2, 2, 2, 700, 20, 12, Causal::TopLeft, {}, 15.0, 2},
      {1, 2, 2, 1, 513, 64, 64, Causal::None, {100, 0}, 0, 0},
      // one row: value columns in double-width blocks, a half block and a
      // partial tail on 4-, 8- and 16-lane targets alike
      {1, 2, 2, 1, 600, 16, 221, Causal::None, {}, 0, 0},
      // ALiBi, keys of each chunk biased by their distance from the queries
      {1, 6, 3, 3, 1500, 64, 64, Causal::BottomRight, {}, 0, 0, 8.0},
      {1, 4, 1, 1, 1100, 32, 40, Causal::None, {600, -1}, 0, 2, -8.0},
      // a padded cache: the query sees the first 700 keys of 1500
      {1, 4, 2, 2, 1500, 64, 64, Causal::offset(698), {}, 0, 0, 8.0},
      {1, 2, 2, 3, 1200, 32, 32, Causal::offset(-5), {}, 0, 0},
      // sinks, merged once with the chunks' partial results
      {1, 6, 2, 2, 1500, 64, 64, Causal::BottomRight, {}, 0, 0, 8.0, 3.0},
      {1, 3, 3, 3, 1100, 32, 32, Causal::offset(-2), {300, 0}, 0, 1, 0, 1.0},
      // 32 rows per kv head and more (group × queries): scores by tiles
      // (kDecodePanelRows), with every option
      {1, 16, 2, 4, 1300, 65, 33, Causal::BottomRight, {}, 20.0, 2, 8.0, 2.0},
      {2, 8, 1, 8, 1030, 13, 7, Causal::offset(-3), {500, 2}, 0, 1},
      // up to kDecodeMaxQueries queries: a causal row range across chunks,
      // 9 rows per kv head key by key, 32 and 80 by tiles
      {1, 4, 4, 9, 1100, 64, 48, Causal::BottomRight, {}, 0, 0},
      {1, 2, 2, 32, 1300, 40, 40, Causal::offset(-3), {300, 0}, 15.0, 1, 8.0, 2.0},
      {1, 8, 2, 20, 1030, 64, 64, Causal::TopLeft, {}, 0, 2},
  };
}

// Head dims of real models and the awkward ones around vector and panel
// widths (issue 14), value dims differing from them.
constexpr int64_t kHeadDims[] = {1, 3, 16, 17, 31, 32, 33, 48, 63, 65, 80, 96, 112, 127, 129,
                                 160, 192, 256, 320};

// Prefill (straddling query blocks and key tiles, causal) and decode (a
// chunk and a half; key by key, and by tiles with 32 rows per kv head) at
// head dim d, value dim d_v.
void check_head_dim(int64_t d, int64_t d_v, uint32_t seed) {
  check({1, 2, 1, 70, 130, d, d_v, Causal::BottomRight, {}, 0, 0}, false, seed);
  check({1, 2, 2, 2, 770, d, d_v, Causal::None, {}, 0, 1}, false, seed + 1);
  check({1, 8, 1, 4, 600, d, d_v, Causal::BottomRight, {}, 0, 0}, false, seed + 2);
}

TEST(Kernels, EveryHeadDimOnEveryTarget) {
  test::on_every_simd_target([] {
    uint32_t seed = 700;
    for (int64_t d : kHeadDims) {
      check_head_dim(d, d, seed += 3);
      check_head_dim(d, d % 7 + 5, seed += 3);
    }
  });
}

// A value view sliced from a wider array (one head's columns of a fused
// projection) whose row stride is d_v rounded up to whole vectors: the
// kernels read its d_v columns only, never its neighbours' (here NaN) nor
// past the array's end (the second slice's last row; ASan). Bitwise the
// result of its contiguous copy, on every target (4, 8 and 16 lanes).
TEST(Kernels, ValueSlicesReadOnlyTheirOwnColumns) {
  std::mt19937 rng(41);
  const auto q = cast<float>(random_tensor({2, 70, 5}, rng));
  const auto k = cast<float>(random_tensor({2, 100, 5}, rng));
  test::on_every_simd_target([&] {
    for (int64_t width : {4, 8, 16}) {
      const int64_t d_v = width / 2;
      Tensor<float> wide = cast<float>(random_tensor({2, 100, width}, rng));
      for (int64_t half : {0, 1}) {
        SCOPED_TRACE("width " + std::to_string(width) + ", half " + std::to_string(half));
        const int64_t other = 1 - half;
        for (int64_t i = 0; i < wide.numel(); ++i)
          if (i % width / d_v == other) wide[i] = std::numeric_limits<float>::quiet_NaN();
        const TensorView<const float> v(wide.data() + half * d_v, {2, 100, d_v}, {100 * width, width, 1});
        const auto sliced = attention(q.view(), k.view(), v);
        const auto copied = attention(q.view(), k.view(), contiguous(v).view());
        EXPECT_EQ(std::memcmp(sliced.data(), copied.data(), sliced.numel() * sizeof(float)), 0);
      }
    }
  });
}

TEST(Kernels, FlashMatchesReferenceAcrossTiles) {
  uint32_t seed = 100;
  for (const auto& c : flash_cases()) check(c, false, seed++);
  for (const auto& c : flash_cases()) check(c, true, seed++);
}

TEST(Kernels, DecodeMatchesReference) {
  uint32_t seed = 200;
  for (const auto& c : decode_cases()) check(c, false, seed++);
}

// The targets the tests force one at a time on this CPU, best first, as one
// line that make test-arm shows per emulated CPU. With ATTN_EXPECT_TARGET set
// (make test-arm sets it per CPU), the best one must be that target: an
// emulator or library that silently fell back to a lesser target fails here.
TEST(Kernels, SimdTargetsOfThisCpu) {
  std::string names;
  for (int64_t t : hwy::SupportedAndGeneratedTargets())
    names += std::string(names.empty() ? "" : " ") + hwy::TargetName(t);
  std::printf("SIMD targets of this CPU: %s\n", names.c_str());
  ASSERT_FALSE(names.empty());
  if (const char* expected = std::getenv("ATTN_EXPECT_TARGET")) {
    EXPECT_EQ(names.substr(0, names.find(' ')), std::string(expected)) << "targets: " << names;
  }
}

TEST(Kernels, EverySimdTarget) {
  test::on_every_simd_target([] {
    uint32_t seed = 300;
    for (const auto& c : flash_cases()) check(c, false, seed++);
    for (const auto& c : decode_cases()) check(c, false, seed++);
  });
}

// The softmax's 2^x against std::exp2 in double, densely over the range where
// it is not flushed up to the lazy rescale's 2^8 (SoftmaxStep), and its
// edges, on every SIMD target. The bound: 2^f's polynomial is within 1e-7
// of 2^f; its float evaluation and the final product add a few half-ulps
// (6e-8 each).
TEST(Kernels, Exp2MatchesStdExp2OnEveryTarget) {
  std::vector<float> x;
  for (double t = -126.0; t <= 8.0; t += 1.0 / 1024) x.push_back(static_cast<float>(t));
  for (float t = -1e-30f; t > -1.0f; t *= 3.0f) x.push_back(t);
  x.push_back(-0.0f);
  x.push_back(-1e-40f);  // subnormal
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> flushed = {-126.001f, -127.0f, -150.0f, -1e30f, -inf};
  x.insert(x.end(), flushed.begin(), flushed.end());
  x.push_back(std::numeric_limits<float>::quiet_NaN());
  x.push_back(0.0f);
  test::on_every_simd_target([&] {
    // Odd lengths exercise the tail on every vector width.
    for (size_t n : {x.size(), size_t{7}, size_t{1}}) {
      const std::vector<float> in(x.end() - static_cast<std::ptrdiff_t>(n), x.end());
      std::vector<float> out(n, -1.0f);
      kernels::softmax_exp2(in.data(), out.data(), static_cast<int64_t>(n));
      double worst = 0;
      for (size_t i = 0; i < n; ++i) {
        if (std::isnan(in[i])) {
          EXPECT_TRUE(std::isnan(out[i]));
        } else if (in[i] < -126.0f) {
          EXPECT_EQ(out[i], 0.0f) << "2^" << in[i];
        } else {
          const double want = std::exp2(static_cast<double>(in[i]));
          worst = std::max(worst, std::abs(out[i] - want) / want);
        }
      }
      EXPECT_LE(worst, 2.5e-7);
    }
    float zero = 0.0f, one = 0.0f;
    kernels::softmax_exp2(&zero, &one, 1);
    EXPECT_EQ(one, 1.0f);  // the row's maximum weighs exactly 1
  });
}

// bf16 precision's 2^x (degree 3) against std::exp2 over the same range:
// its polynomial's 1.01e-4 (from its fit) plus float rounding, far below the
// 2^-9 = 2e-3 to which P is then rounded; 2^0 exactly 1.
TEST(Kernels, Exp2ForBF16WithinItsBoundOnEveryTarget) {
  std::vector<float> x;
  for (double t = -126.0; t <= 8.0; t += 1.0 / 1024) x.push_back(static_cast<float>(t));
  x.push_back(-126.5f);
  x.push_back(-std::numeric_limits<float>::infinity());
  x.push_back(std::numeric_limits<float>::quiet_NaN());
  test::on_every_simd_target([&] {
    std::vector<float> out(x.size());
    kernels::softmax_exp2(x.data(), out.data(), static_cast<int64_t>(x.size()), /*for_bf16=*/true);
    double worst = 0;
    for (size_t i = 0; i + 3 < x.size(); ++i) {
      const double want = std::exp2(static_cast<double>(x[i]));
      worst = std::max(worst, std::abs(out[i] - want) / want);
    }
    EXPECT_LE(worst, 1.03e-4);
    EXPECT_GT(worst, 1e-5);  // the cheaper polynomial, not the float32 one
    EXPECT_EQ(out[x.size() - 3], 0.0f);
    EXPECT_EQ(out[x.size() - 2], 0.0f);
    EXPECT_TRUE(std::isnan(out.back()));
    float zero = 0.0f, one = 0.0f;
    kernels::softmax_exp2(&zero, &one, 1, /*for_bf16=*/true);
    EXPECT_EQ(one, 1.0f);
  });
}

// A row's max rising across key tiles (of 64 keys, kBlockK) by less and by
// more than float32's lazy-rescale threshold (8 in base 2, 5.55 in natural
// units; SoftmaxStep): tile maxima rising by 1, 3, 5.5, 5.75, 20 and 2 times
// c, with query row q = ±c · e_0 and c from 0.5 to 1.4375 (c = 1: 5.5 just
// below the threshold, 5.75 just above; other rows cross it elsewhere, and
// the negative ones see falling maxima). Keys, values and c are exact in
// bf16, so bf16 precision's products are exact and only P's and V's
// rounding remain. Against the float64 reference: float32 within its error,
// bf16 (each path) within 4e-3.
TEST(Kernels, RisingMaxAcrossKeyTiles) {
  constexpr int64_t kTiles = 7, n_k = 64 * kTiles, n_q = 32, d = 2;
  const double rises[kTiles] = {0, 1, 3, 5.5, 5.75, 20, 2};
  std::mt19937 rng(2312);
  Tensor<double> q({1, 1, n_q, d}), k({1, 1, n_k, d}), v({1, 1, n_k, 16});
  for (int64_t i = 0; i < n_q; ++i) q[i * d] = (i % 2 ? -1.0 : 1.0) * (0.5 + 0.0625 * static_cast<double>(i / 2));
  double top = 0;
  for (int64_t t = 0; t < kTiles; ++t) {
    top += rises[t];
    for (int64_t j = 0; j < 64; ++j) k[(t * 64 + j) * d] = j == 17 ? top : top - 0.5 * static_cast<double>(rng() % 7);
  }
  std::uniform_int_distribution<int> steps(-64, 64);
  for (int64_t e = 0; e < v.numel(); ++e) v[e] = steps(rng) / 64.0;
  AttentionOptions options;
  options.scale = 1.0;
  test::Returns returns;
  returns.weights = true;
  returns.lse = true;
  const auto ref = test::forward(q.view(), k.view(), v.view(), returns, options);
  const auto q32 = cast<float>(q), k32 = cast<float>(k), v32 = cast<float>(v);
  test::on_every_simd_target([&] {
    const auto got = test::forward(q32.view(), k32.view(), v32.view(), returns, options);
    EXPECT_LT(rel_error(got.out, ref.out), 1e-5);
    EXPECT_LT(rel_error(got.lse, ref.lse), 1e-6);
    EXPECT_LT(rel_error(got.weights, ref.weights), 1e-5);
  });
  AttentionOptions bf16 = options;
  bf16.precision = Precision::BF16;
  for (const auto use : {kernels::BF16UnitUse::Always, kernels::BF16UnitUse::Never}) {
    const test::BF16UnitUseScope scope(use);
    test::on_every_simd_target([&] {
      EXPECT_LT(rel_error(attention(q32.view(), k32.view(), v32.view(), bf16), ref.out), 4e-3);
    });
  }
}

// Equal scores (Q = 0) give each of n keys the weight 1, so a row's output is
// the mean of its V column, here one float c in every row: exactly c. The
// kernels sum a tile's b keys from 0 and add each tile's sum to the row once
// (prefill: b = kBlockK; decode: b = kDecodeChunk, its chunks merged), so the
// output's relative error is at most that of summing ⌈n/b⌉ sums of b positive
// terms, (b - 1 + ⌈n/b⌉) units of roundoff u = 2^-24, and 2 more for the
// division by the weights' sum (its reciprocal and a product). One chain of
// n additions could err by n·u, and with equal terms it nearly does: before
// P·V's sums started from 0, prefill's error here was 1.7e-4, now 2.5e-6
// (measured; the bound is 1.9e-5).
// Value dims 64 (whole vectors) and 17 (a partial vector on every target).
TEST(Kernels, OutputErrorGrowsWithTilesNotKeys) {
  constexpr int64_t n_k = 16384;
  constexpr double u = 0x1p-24;
  struct Path {
    const char* name;
    int64_t n_q, b;
  };
  for (const Path path :
       {Path{"prefill", kernels::kDecodeMaxQueries + 1, kernels::kBlockK}, Path{"decode", 1, kernels::kDecodeChunk}}) {
    for (const int64_t d_v : {64, 17}) {
      SCOPED_TRACE(std::string(path.name) + ", d_v " + std::to_string(d_v));
      const Tensor<float> q({1, 1, path.n_q, 16}), k({1, 1, n_k, 16});
      Tensor<float> v({1, 1, n_k, d_v});
      for (int64_t e = 0; e < v.numel(); ++e) v[e] = 0.1f * static_cast<float>(e % d_v + 1);
      const double bound = static_cast<double>(path.b - 1 + (n_k + path.b - 1) / path.b + 2) * u;
      test::on_every_simd_target([&] {
        const auto out = attention(q.view(), k.view(), v.view());
        double worst = 0;
        for (int64_t e = 0; e < out.numel(); ++e) {
          const double c = v[e % d_v];
          worst = std::max(worst, std::abs(out[e] - c) / c);
        }
        EXPECT_LE(worst, bound);
      });
    }
  }
}

// The float32 softmax kernel against the plain double softmax on every target,
// with row lengths around each vector width (full vectors and partial tails).
TEST(Kernels, SoftmaxOnEveryTarget) {
  std::mt19937 rng(400);
  test::on_every_simd_target([&] {
    for (int64_t n : {1, 3, 4, 5, 8, 9, 16, 17, 33, 100}) {
      const auto a = random_tensor({3, n}, rng, -30, 30);
      const auto want = softmax(a.view());
      Tensor<float> got = cast<float>(a);
      softmax(got.view(), got.view());  // in place, as the header allows
      EXPECT_LT(rel_error(got, want), 1e-6) << "n = " << n;
    }
  });
}

// The kernels' copy of the softmax rules (SoftmaxStep, the decode merge, the
// weights sweep) against their one definition (softmax_rules.hpp), on every
// target: one query row with q = 1, d = 1 and scale 1, so key j's logit is
// k[j] exactly; V is the identity, so output column j is weight j. Through
// the prefill tiles (weights asked for: 10 tiles of 64 keys) and through
// decode (2 chunks of 512), with the special values spread over tiles and
// chunks. Logits stay below FLT_MAX / log2(e): the kernels keep scores in
// base 2, and a larger float32 logit overflows to +inf there.
TEST(Kernels, SoftmaxRulesOnEveryTarget) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int64_t n = 600;
  std::mt19937 rng(500);
  std::uniform_real_distribution<float> finite(-5, 5);
  using Special = std::vector<std::pair<int64_t, float>>;
  // Random finite logits, or every logit `fill`, then the special ones.
  const auto row = [&](std::optional<float> fill, const Special& special) {
    std::vector<float> x(n);
    for (auto& e : x) e = fill ? *fill : finite(rng);
    for (auto [j, value] : special) x[j] = value;
    return x;
  };
  const std::optional<float> random;
  const std::vector<std::pair<std::string, std::vector<float>>> rows = {
      {"finite", row(random, {})},
      {"a NaN", row(random, {{550, nan}})},
      {"a NaN among -inf", row(-inf, {{3, nan}})},
      {"a NaN beside +inf", row(random, {{10, inf}, {590, nan}})},
      {"one +inf", row(random, {{530, inf}})},
      {"+inf in two tiles and chunks", row(random, {{5, inf}, {599, inf}})},
      {"+inf and -inf", row(-inf, {{70, inf}, {71, -inf}})},
      {"some -inf", row(random, {{0, -inf}, {64, -inf}, {511, -inf}, {512, -inf}})},
      {"all -inf", row(-inf, {})},
      {"one finite among -inf", row(-inf, {{513, 2.5f}})},
      {"huge", row(-1e38f, {{100, 1e38f}, {101, 1e30f}})},
      {"huge ties", row(random, {{1, 2e38f}, {598, 2e38f}})},
  };
  Tensor<float> q({1, 1, 1});
  q[0] = 1;
  Tensor<float> v({1, n, n});
  for (int64_t j = 0; j < n; ++j) v[j * n + j] = 1;
  AttentionOptions o;
  o.scale = 1.0;
  test::on_every_simd_target([&] {
    for (const auto& [name, logits] : rows) {
      SCOPED_TRACE(name);
      std::vector<double> want(logits.begin(), logits.end());
      core::softmax_by_definition(want.data(), n);
      Tensor<float> k({1, n, 1});
      std::copy(logits.begin(), logits.end(), k.data());
      Tensor<float> out({1, 1, n}), weights({1, 1, n}), decoded({1, 1, n});
      AttentionPlan(q.view(), k.view(), v.view(), o).run(out.view(), {.weights = weights.view()});  // prefill
      AttentionPlan(q.view(), k.view(), v.view(), o).run(decoded.view());                            // decode
      for (const auto* got : {&out, &weights, &decoded})
        for (int64_t j = 0; j < n; ++j) {
          if (std::isnan(want[j])) {
            EXPECT_TRUE(std::isnan((*got)[j])) << "key " << j;
          } else {
            // float32 logits in base 2 and the kernels' 2^x: a few ulps of the
            // weight, relative to the row's largest weight (1 at most).
            EXPECT_NEAR((*got)[j], want[j], 1e-6) << "key " << j;
          }
        }
    }
  });
}

TEST(Kernels, BitwiseIdenticalForAnyThreadCount) {
  const int saved = num_threads();
  std::vector<KernelCase> cases = flash_cases();
  for (const auto& c : decode_cases()) cases.push_back(c);
  for (const auto& c : cases) {
    set_num_threads(1);
    const auto one = check(c, false, 7);
    for (int t : {2, 3, 8}) {
      set_num_threads(t);
      const auto many = check(c, false, 7, false);
      EXPECT_EQ(std::memcmp(one.data(), many.data(), one.numel() * sizeof(float)), 0)
          << describe(c) << " threads=" << t;
    }
  }
  set_num_threads(saved);
}

}  // namespace
}  // namespace attn

namespace attn {
namespace {

// A NaN or +inf value row of a key causal masking excludes from the first
// half of the rows, stored in 16 bits: those rows are untouched (the kernels'
// recomputation of a NaN row reads 16-bit values too), the others NaN or
// +inf, as in the reference on the same values. (Highway's emulated fp16
// conversion made inf and NaN finite on SSSE3, SSE4 and scalar.)
template <class H>
void check_16bit_poisoned(int64_t n_q, int64_t n_k, double poison, uint16_t (*to_bits)(float),
                          float (*from_bits)(uint16_t)) {
  SCOPED_TRACE("n_q " + std::to_string(n_q) + ", n_k " + std::to_string(n_k) + ", value " +
               std::to_string(poison));
  std::mt19937 rng(11);
  const auto q = random_tensor({2, n_q, 16}, rng), k = random_tensor({1, n_k, 16}, rng);
  auto v = random_tensor({1, n_k, 8}, rng);
  const int64_t poisoned = n_k - n_q / 2;
  for (int64_t c = 0; c < 8; ++c) v[poisoned * 8 + c] = poison;
  Tensor<H> k16(k.shape()), v16(v.shape());
  Tensor<double> k_rounded(k.shape()), v_rounded(v.shape());
  for (int64_t i = 0; i < k.numel(); ++i) k_rounded[i] = from_bits(k16[i].bits = to_bits(float(k[i])));
  for (int64_t i = 0; i < v.numel(); ++i) v_rounded[i] = from_bits(v16[i].bits = to_bits(float(v[i])));
  AttentionOptions o;
  o.causal = Causal::BottomRight;
  Tensor<float> out({2, n_q, 8});
  AttentionPlan(cast<float>(q).view(), TensorView<const H>(k16.view()), TensorView<const H>(v16.view()), o)
      .run(out.view());
  const auto ref = attention(q.view(), k_rounded.view(), v_rounded.view(), o);
  for (int64_t e = 0; e < out.numel(); ++e) {
    const int64_t row = e / 8 % n_q;
    ASSERT_EQ(std::isfinite(ref[e]), row < n_q / 2) << "the reference, row " << row;
    if (std::isnan(ref[e])) EXPECT_TRUE(std::isnan(out[e])) << "row " << row;
    else if (std::isinf(ref[e])) EXPECT_EQ(out[e], ref[e]) << "row " << row;
    else EXPECT_NEAR(out[e], ref[e], 1e-5) << "row " << row;
  }
}

TEST(Kernels, SixteenBitValuesOfExcludedKeysTakeNoPart) {
  test::on_every_simd_target([] {
    for (const auto& [n_q, n_k] : {std::pair<int64_t, int64_t>{40, 150}, {6, 1100}})  // prefill, decode
      for (double poison : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
        check_16bit_poisoned<bfloat16>(n_q, n_k, poison, float_to_bf16, bf16_to_float);
        check_16bit_poisoned<float16>(n_q, n_k, poison, float_to_fp16, fp16_to_float);
      }
  });
}

// The tests' random inputs (random_tensor) are what std::uniform_real_distribution
// draws, bit for bit, from the same engine, on every platform the kernel tests
// run on (Arm's under qemu too): helpers.hpp's uniform() only spares its
// per-draw logarithm.
TEST(Kernels, TestInputsAreTheStandardLibrarysUniformDraws) {
  for (const auto& [lo, hi] : {std::pair{-1.0, 1.0}, {-2.0, 1.0}, {0.0, 1.0}, {-0.5, 0.5}}) {
    std::mt19937 ours(7), theirs(7);
    std::uniform_real_distribution<double> u(lo, hi);
    for (int i = 0; i < 100000; ++i) {
      const double a = test::uniform(ours, lo, hi), b = u(theirs);
      ASSERT_EQ(std::memcmp(&a, &b, sizeof a), 0) << "draw " << i << " on [" << lo << ", " << hi << "): " << a << " vs " << b;
    }
  }
}

}  // namespace
}  // namespace attn
