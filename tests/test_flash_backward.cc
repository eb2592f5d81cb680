// The fused float32 backward (kernels/backward.cc) against the gradient of
// the double reference (itself checked against finite differences in
// test_backward.cc), on shapes that cross its key tiles and row blocks,
// with every option of the forward and every K/V storage type, on every SIMD
// target this CPU can run, and bitwise equal for any thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attn/threads.hpp"
#include "helpers.hpp"
#include "kernels/config.hpp"

namespace attn {
namespace {

using test::cast;
using test::describe;
using test::KernelCase;
using test::random_tensor;
using test::rel_error;

// 1e-4 relative (Frobenius), the bound: float32 products over a
// few hundred keys round at about 1e-6 relative; P recomputed from the
// saved log-sum-exp carries the rounding of S - lse (about 1e-6 · |S|).
constexpr double kFlashTol = 1e-4;

enum class Storage { F32, BF16, F16, Q8_0, Q4_0 };

struct Inputs {
  Tensor<double> q, k, v, dout;  // k, v: the values the kernel sees, as doubles
  Tensor<float> q32, k32, v32, dout32;
  Tensor<bfloat16> k16b, v16b;
  Tensor<float16> k16h, v16h;
  Tensor<block_q8_0> k8, v8;
  Tensor<block_q4_0> k4, v4;
  Tensor<bool> mb;
  Tensor<double> md;
  Tensor<float> mf;
  Mask m32, m64;
};

// Random inputs of case c (N(0, 1)), K and V rounded to `storage` (the
// reference sees the rounded values: the gradient is taken with respect to
// them).
Inputs make_inputs(const KernelCase& c, Storage storage, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  const auto gaussian = [&](const Shape& s) {
    Tensor<double> t(s);
    for (int64_t i = 0; i < t.numel(); ++i) t[i] = normal(rng);
    return t;
  };
  Inputs in;
  in.q = gaussian({c.batch, c.hq, c.n_q, c.d});
  in.k = gaussian({c.batch, c.hkv, c.n_k, c.d});
  in.v = gaussian({c.batch, c.hkv, c.n_k, c.d_v});
  in.dout = gaussian({c.batch, c.hq, c.n_q, c.d_v});
  in.q32 = cast<float>(in.q), in.k32 = cast<float>(in.k), in.v32 = cast<float>(in.v);
  in.dout32 = cast<float>(in.dout);
  switch (storage) {
    case Storage::F32: break;
    case Storage::BF16:
      in.k16b = to_bfloat16(in.k32.view()), in.v16b = to_bfloat16(in.v32.view());
      in.k32 = dequantize(TensorView<const bfloat16>(in.k16b.view()));
      in.v32 = dequantize(TensorView<const bfloat16>(in.v16b.view()));
      break;
    case Storage::F16:
      in.k16h = to_float16(in.k32.view()), in.v16h = to_float16(in.v32.view());
      in.k32 = dequantize(TensorView<const float16>(in.k16h.view()));
      in.v32 = dequantize(TensorView<const float16>(in.v16h.view()));
      break;
    case Storage::Q8_0:
      in.k8 = quantize_q8_0(in.k32.view()), in.v8 = quantize_q8_0(in.v32.view());
      in.k32 = dequantize(TensorView<const block_q8_0>(in.k8.view()));
      in.v32 = dequantize(TensorView<const block_q8_0>(in.v8.view()));
      break;
    case Storage::Q4_0:
      in.k4 = quantize_q4_0(in.k32.view()), in.v4 = quantize_q4_0(in.v32.view());
      in.k32 = dequantize(TensorView<const block_q4_0>(in.k4.view()));
      in.v32 = dequantize(TensorView<const block_q4_0>(in.v4.view()));
      break;
  }
  in.k = cast<double>(in.k32), in.v = cast<double>(in.v32);
  in.mb = Tensor<bool>({c.n_q, c.n_k});
  for (int64_t i = 0; i < in.mb.numel(); ++i) in.mb[i] = rng() % 5 != 0;
  in.md = random_tensor({c.hq, 1, c.n_k}, rng, -2, 1);
  for (int64_t i = 0; i < in.md.numel(); i += 7) in.md[i] = -std::numeric_limits<double>::infinity();
  in.mf = cast<float>(in.md);
  if (c.mask == 1) in.m32 = in.m64 = TensorView<const bool>(in.mb.view());
  if (c.mask == 2) in.m32 = TensorView<const float>(in.mf.view()), in.m64 = TensorView<const double>(in.md.view());
  return in;
}

// The float32 gradients with K and V in their storage type.
AttentionGradients<float> float_gradients(const Inputs& in, Storage storage, const AttentionOptions& o,
                                          const SavedForward<float>& saved = {}) {
  const auto run = [&](const auto& k, const auto& v) {
    return attention_backward(in.q32.view(), k.view(), v.view(), in.dout32.view(), o, in.m32, saved);
  };
  switch (storage) {
    case Storage::BF16: return run(in.k16b, in.v16b);
    case Storage::F16: return run(in.k16h, in.v16h);
    case Storage::Q8_0: return run(in.k8, in.v8);
    case Storage::Q4_0: return run(in.k4, in.v4);
    case Storage::F32: break;
  }
  return run(in.k32, in.v32);
}

AttentionGradients<float> check(const KernelCase& c, uint32_t seed, Storage storage = Storage::F32) {
  SCOPED_TRACE(describe(c) + " storage " + std::to_string(int(storage)));
  const Inputs in = make_inputs(c, storage, seed);
  const AttentionOptions o = test::options_of(c);
  const auto ref = attention_backward(in.q.view(), in.k.view(), in.v.view(), in.dout.view(), o, in.m64);
  const auto got = float_gradients(in, storage, o);
  EXPECT_LT(rel_error(got.dq, ref.dq), kFlashTol);
  EXPECT_LT(rel_error(got.dk, ref.dk), kFlashTol);
  EXPECT_LT(rel_error(got.dv, ref.dv), kFlashTol);
  if (!o.sinks.empty()) {
    EXPECT_LT(rel_error(got.dsinks, ref.dsinks), kFlashTol);
  }
  return got;
}

std::vector<KernelCase> backward_cases() {
  // n_q and n_k straddle the 32-row blocks and the 64-key tiles.
  std::vector<KernelCase> cases;
  for (Causal causal : {Causal::None, Causal::BottomRight, Causal::TopLeft})
    cases.push_back({1, 2, 1, 100, 130, 64, 64, causal, {}, 0, 0});
  cases.push_back({2, 4, 2, 70, 65, 32, 48, Causal::BottomRight, {}, 0, 1});    // GQA, bool mask
  cases.push_back({1, 2, 2, 90, 200, 40, 24, Causal::None, {50, 10}, 0, 2});   // window, additive mask
  cases.push_back({1, 3, 3, 80, 80, 16, 20, Causal::TopLeft, {}, 30.0, 2});    // softcap
  cases.push_back({1, 1, 1, 33, 64, 128, 128, Causal::None, {}, 0, 0});
  cases.push_back({1, 1, 1, 67, 150, 7, 5, Causal::BottomRight, {0, -1}, 0, 0});  // odd head dims
  // Rows with no allowed key (n_q > n_k bottom-right; an offset left of
  // every key), keys no row reaches (top-left with n_k > n_q).
  cases.push_back({1, 2, 1, 130, 70, 32, 32, Causal::BottomRight, {}, 0, 0});
  cases.push_back({1, 2, 2, 100, 90, 16, 24, Causal::offset(-40), {}, 0, 1});
  cases.push_back({1, 2, 2, 40, 200, 32, 32, Causal::TopLeft, {}, 0, 0});
  // ALiBi (positive and negative slopes, with masks and softcap), sinks.
  cases.push_back({1, 6, 2, 100, 130, 64, 64, Causal::None, {}, 0, 0, 8.0});
  cases.push_back({2, 4, 2, 70, 65, 32, 48, Causal::BottomRight, {}, 0, 1, -8.0});
  cases.push_back({1, 2, 2, 90, 200, 40, 24, Causal::offset(150), {60, 5}, 20.0, 2, 16.0});
  cases.push_back({1, 3, 1, 100, 130, 64, 64, Causal::None, {}, 0, 0, 0, 4.0});
  cases.push_back({1, 6, 3, 100, 75, 32, 48, Causal::offset(-30), {}, 0, 1, 0, 2.0});
  cases.push_back({2, 6, 2, 70, 133, 40, 24, Causal::BottomRight, {60, 5}, 20.0, 2, 8.0, 3.0});
  return cases;
}

TEST(FlashBackward, MatchesReferenceOnEveryTarget) {
  test::on_every_simd_target([] {
    uint32_t seed = 500;
    for (const auto& c : backward_cases()) check(c, seed++);
  });
}

TEST(FlashBackward, EveryKVStorageType) {
  uint32_t seed = 600;
  for (Storage s : {Storage::BF16, Storage::F16, Storage::Q8_0, Storage::Q4_0}) {
    check({1, 4, 2, 70, 130, 64, 32, Causal::BottomRight, {}, 0, 1}, seed++, s);
    check({1, 2, 1, 40, 100, 32, 64, Causal::None, {}, 10.0, 0, 8.0, 2.0}, seed++, s);
  }
}

// The bound at the length its benchmark uses (shorter under
// emulation and sanitizers, where the float64 reference would take minutes).
TEST(FlashBackward, MatchesReferenceAtLength4096) {
  const int64_t n = test::emulated() || test::sanitized() ? 1024 : 4096;
  check({1, 1, 1, n, n, 64, 64, Causal::None, {}, 0, 0}, 700);
  check({1, 1, 1, n / 2, n / 2, 64, 64, Causal::BottomRight, {}, 0, 0}, 701);
}

// dV_j = Σ_i P_ij dO_i. Equal scores (Q = 0) weigh each of n_k keys 1/n_k,
// so with dO's column one float c in every row and n_q = 256 · n_k, each key's
// dV is exactly 256 · c. The backward sums a block of b = kBackwardRows rows
// from 0 and adds the block's sum to dV once, so its relative error is at
// most (b - 1 + ⌈n_q/b⌉) units of roundoff u = 2^-24 for the sums, 1 for each
// product, and 8 for P recomputed from the saved log-sum-exp (ln 64 rounded
// and the exponential). Head dim 17: a partial vector on every target,
// whose column once summed all n_q rows in one chain (measured: 1.4e-4
// then, 5.2e-6 now; the bound is 3.3e-5).
TEST(FlashBackward, ValueGradientErrorGrowsWithBlocksNotRows) {
  constexpr int64_t n_k = 64, n_q = 256 * n_k, d = 17, b = kernels::kBackwardRows;
  constexpr double u = 0x1p-24;
  const Tensor<float> q({1, 1, n_q, d});
  Tensor<float> k({1, 1, n_k, d}), v({1, 1, n_k, d}), dout({1, 1, n_q, d});
  std::mt19937 rng(1700);
  std::normal_distribution<float> normal;
  for (int64_t e = 0; e < k.numel(); ++e) k[e] = normal(rng), v[e] = normal(rng);
  for (int64_t e = 0; e < dout.numel(); ++e) dout[e] = 0.1f * static_cast<float>(e % d + 1);
  const double bound = static_cast<double>(b - 1 + (n_q + b - 1) / b + 1 + 8) * u;
  test::on_every_simd_target([&] {
    const auto g = attention_backward(q.view(), std::as_const(k).view(), std::as_const(v).view(),
                                      std::as_const(dout).view());
    double worst = 0;
    for (int64_t e = 0; e < g.dv.numel(); ++e) {
      const double exact = 256.0 * dout[e % d];
      worst = std::max(worst, std::abs(g.dv[e] - exact) / exact);
    }
    EXPECT_LE(worst, bound);
  });
}

TEST(FlashBackward, BitwiseIdenticalForAnyThreadCount) {
  const int saved = num_threads();
  uint32_t seed = 800;
  // The cases, and one that the two-pass plan (a thread count above the
  // (batch, kv head) pairs) cuts into several key and row items.
  std::vector<KernelCase> cases = backward_cases();
  cases.push_back({1, 2, 1, 600, 700, 32, 32, Causal::BottomRight, {}, 0, 0, 8.0, 1.0});
  for (const auto& c : cases) {
    const Inputs in = make_inputs(c, Storage::F32, seed++);
    const AttentionOptions o = test::options_of(c);
    set_num_threads(1);
    const auto one = float_gradients(in, Storage::F32, o);
    for (int t : {2, 3, 8}) {
      set_num_threads(t);
      const auto many = float_gradients(in, Storage::F32, o);
      for (const auto& [a, b] : {std::pair{&one.dq, &many.dq}, {&one.dk, &many.dk}, {&one.dv, &many.dv}})
        EXPECT_EQ(std::memcmp(a->data(), b->data(), a->numel() * sizeof(float)), 0)
            << describe(c) << " threads=" << t;
    }
  }
  set_num_threads(saved);
}

// Given the forward's output and log-sum-exp, the backward does what it does
// when it runs the forward itself, bit for bit.
TEST(FlashBackward, SavedForwardGivesTheSameGradients) {
  const KernelCase c{2, 4, 2, 70, 130, 32, 32, Causal::BottomRight, {}, 0, 2, 8.0, 1.0};
  const Inputs in = make_inputs(c, Storage::F32, 900);
  const AttentionOptions o = test::options_of(c);
  test::Returns returns;
  returns.lse = true;
  const auto fwd = test::forward(in.q32.view(), in.k32.view(), in.v32.view(), returns, o, in.m32);
  const auto given = float_gradients(in, Storage::F32, o, {fwd.out.view(), fwd.lse.view()});
  const auto recomputed = float_gradients(in, Storage::F32, o);
  EXPECT_EQ(std::memcmp(given.dq.data(), recomputed.dq.data(), given.dq.numel() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(given.dk.data(), recomputed.dk.data(), given.dk.numel() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(given.dv.data(), recomputed.dv.data(), given.dv.numel() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(given.dsinks.data(), recomputed.dsinks.data(), given.dsinks.numel() * sizeof(float)), 0);

  EXPECT_THROW_MSG(float_gradients(in, Storage::F32, o, {fwd.out.view(), {}}), ValueError,
                   "needs both out and lse");
  const Tensor<float> short_lse({2, 4, 69});
  EXPECT_THROW_MSG(float_gradients(in, Storage::F32, o, {fwd.out.view(), short_lse.view()}), ValueError,
                   "saved lse has shape (2, 4, 69), expected (2, 4, 70)");
}

// No head, no row or no key: nothing to compute, zeros where there are
// gradients, never a crash (the group size of zero heads is no number).
TEST(FlashBackward, EmptyProblems) {
  for (const auto& [q, k, v] : {std::array<Shape, 3>{Shape{0, 3, 8}, Shape{0, 3, 8}, Shape{0, 3, 5}},
                                std::array<Shape, 3>{Shape{2, 0, 8}, Shape{1, 4, 8}, Shape{1, 4, 5}},
                                std::array<Shape, 3>{Shape{2, 3, 8}, Shape{1, 0, 8}, Shape{1, 0, 5}}}) {
    const Tensor<float> qt(q), kt(k), vt(v), dout(attention_output_shape(q, k, v));
    const auto g = attention_backward(qt.view(), kt.view(), vt.view(), dout.view());
    EXPECT_EQ(g.dq.shape(), q);
    EXPECT_EQ(g.dk.shape(), k);
    for (const Tensor<float>* t : {&g.dq, &g.dk, &g.dv})
      for (int64_t e = 0; e < t->numel(); ++e) EXPECT_EQ((*t)[e], 0.0f);
  }
}

// A NaN or infinity the kernel cannot settle (here in the value row of a key
// causal masking excludes from the first rows, and in one query row) goes to
// the reference, whose rules keep it out of the rows it does not reach.
TEST(FlashBackward, NonFiniteInputsFollowTheReference) {
  const KernelCase c{1, 2, 1, 40, 100, 16, 16, Causal::BottomRight, {}, 0, 0};
  for (double poison : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    Inputs in = make_inputs(c, Storage::F32, 950);
    for (int64_t col = 0; col < c.d_v; ++col) in.v[99 * c.d_v + col] = poison;
    in.v32 = cast<float>(in.v);
    const AttentionOptions o = test::options_of(c);
    const auto ref = attention_backward(in.q.view(), in.k.view(), in.v.view(), in.dout.view(), o);
    const auto got = float_gradients(in, Storage::F32, o);
    for (const auto& [g, r] : {std::pair{&got.dq, &ref.dq}, {&got.dk, &ref.dk}, {&got.dv, &ref.dv}})
      for (int64_t e = 0; e < r->numel(); ++e) {
        if (std::isnan((*r)[e])) EXPECT_TRUE(std::isnan((*g)[e])) << e;
        else if (std::isinf((*r)[e])) EXPECT_EQ((*g)[e], (*r)[e]) << e;
        else EXPECT_NEAR((*g)[e], (*r)[e], 1e-4 * (1 + std::fabs((*r)[e]))) << e;
      }
  }
}

}  // namespace
}  // namespace attn
