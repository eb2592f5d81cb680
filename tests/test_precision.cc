// bf16 precision (AttentionOptions::precision): Q, K, V and P rounded to
// bfloat16, products summed in float32. Against the double reference on the
// unrounded inputs, within the tolerances: relative Frobenius error
// <= 4e-3 (cosine >= 0.99999) on N(0, 1) inputs, <= 1e-2 with a ×30 outlier
// channel in Q or in K. Each input's rounding is a relative error of up to
// 2^-9 = 2e-3; summed over d = 64 terms of random sign it averages out to a
// few 1e-4 in the scores, and V's and P's rounding to a few 1e-4 in the
// output: 4e-3 leaves room for the worst rows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#if defined(__aarch64__)
#include <sys/auxv.h>
#endif
#include <string>
#include <utility>
#include <vector>

#include "attn/attention.hpp"
#include "attn/multi_head_attention.hpp"
#include "attn/quantize.hpp"
#include "attn/threads.hpp"
#include "helpers.hpp"
#include "kernels/attention_kernel.hpp"
#include "kernels/config.hpp"
#include "kernels/int8_unit.hpp"

namespace attn {
namespace {

using test::cast;
using test::rel_error;

Tensor<float> normal(const Shape& shape, std::mt19937& rng) {
  Tensor<float> t(shape);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = n(rng);
  return t;
}

double cosine(const Tensor<float>& a, const Tensor<double>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < a.numel(); ++i) ab += a[i] * b[i], aa += double(a[i]) * a[i], bb += b[i] * b[i];
  return ab / std::sqrt(aa * bb);
}

// The int8 unit alone on or off, for a scope: the bf16 unit, which computes
// int8's P·V, stays as it is (the Highway path's P·V sums in another order).
class Int8UnitOn {
 public:
  explicit Int8UnitOn(bool on) { kernels::set_int8_unit_use(on); }
  ~Int8UnitOn() { kernels::set_int8_unit_use(true); }
  Int8UnitOn(const Int8UnitOn&) = delete;
  Int8UnitOn& operator=(const Int8UnitOn&) = delete;
};

// This CPU's bf16 and int8 units (where it has them; bf16's whether or not
// it outruns the FMAs here) on, or both off (the Highway path), for a scope.
class UnitsOn {
 public:
  explicit UnitsOn(bool on) : bf16_(on ? kernels::BF16UnitUse::Always : kernels::BF16UnitUse::Never), int8_(on) {}
  UnitsOn(const UnitsOn&) = delete;
  UnitsOn& operator=(const UnitsOn&) = delete;

 private:
  test::BF16UnitUseScope bf16_;
  Int8UnitOn int8_;
};

// The unit bf16 precision should run on, by the compiler's or the system's
// CPU check (not the library's): x86's where the CPU has AVX512_BF16 and
// the dispatcher's best target is AVX-512 (the unit's 16 lanes), Arm's
// where Linux reports BF16 and FP16 (4 lanes: every Arm target).
std::string expected_unit() {
#if defined(__x86_64__)
  const std::string best = hwy::TargetName(hwy::SupportedAndGeneratedTargets().front());  // best first
  const bool avx512 = best == "AVX3" || best == "AVX3_DL";
  return __builtin_cpu_supports("avx512bf16") && avx512 ? "avx512_bf16" : "highway";
#elif defined(__aarch64__)
  const bool bf16 = getauxval(AT_HWCAP2) & (1 << 14), fp16 = getauxval(AT_HWCAP) & (1 << 10);  // asm/hwcap.h
  return bf16 && fp16 ? "neon_bf16" : "highway";
#else
  return "highway";
#endif
}

// The unit int8 precision should run on: x86's VNNI where the CPU has
// AVX512_VNNI, Arm's SDOT where it has the dot product (on every target:
// only its scores' rows are the unit's).
std::string expected_int8_unit() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx512vnni") ? "avx512_vnni" : "highway";
#elif defined(__aarch64__)
  return getauxval(AT_HWCAP) & (1 << 20) ? "neon_dotprod" : "highway";  // asm/hwcap.h's HWCAP_ASIMDDP
#else
  return "highway";
#endif
}


// body() on every SIMD target with this CPU's unit for `precision` on,
// then off; only off where it has none (on would be the same path).
template <class Body>
void on_every_unit_and_target(Body body, Precision precision = Precision::BF16) {
  const std::string unit = precision == Precision::Int8 ? expected_int8_unit() : expected_unit();
  for (const bool on : {true, false}) {
    if (on && unit == "highway") continue;
    SCOPED_TRACE(on ? "the CPU's unit" : "the Highway path");
    const UnitsOn scope(on);
    test::on_every_simd_target(body);
  }
}

struct PrecisionCase {
  const char* name;
  int64_t heads_q, heads_kv, n_q, n_k, d;
  AttentionOptions options;
};

std::vector<PrecisionCase> cases() {
  AttentionOptions causal, windowed, alibi;
  causal.causal = Causal::BottomRight;
  windowed.window = {100, 20};
  windowed.softcap = 30;
  alibi.alibi_slopes = {0.5, 0.25, 0.125, 0.0625};
  alibi.sinks = {0.5, -1.0, 2.0, 0.0};
  alibi.causal = Causal::TopLeft;
  return {
      {"plain", 4, 2, 300, 333, 64, {}},         // GQA, partial tiles, several query tiles
      {"causal", 2, 2, 260, 260, 64, causal},
      {"window_softcap", 2, 1, 200, 300, 64, windowed},
      {"alibi_sinks", 4, 4, 130, 130, 64, alibi},
      {"head_dim_128", 2, 2, 130, 200, 128, {}},
      {"head_dim_40", 2, 2, 70, 90, 40, {}},   // not whole vectors of 16
      {"head_dim_16", 2, 2, 70, 90, 16, {}},   // blocks too narrow for the unit's latency: more sums each
      {"head_dim_80", 2, 2, 70, 90, 80, {}},   // value columns in blocks of 4 and 1 vectors
      {"odd_head_dim", 2, 2, 70, 90, 33, {}},
      {"one_query", 4, 2, 1, 300, 64, {}},       // keys within one decode chunk: the prefill kernel
  };
}

// The double reference on the case's inputs (once per case: not per unit
// and target, which under emulation costs minutes).
Tensor<double> reference(const PrecisionCase& c, const Tensor<float>& q, const Tensor<float>& k,
                         const Tensor<float>& v) {
  return attention(cast<double>(q).view(), cast<double>(k).view(), cast<double>(v).view(), c.options);
}

// attention in `precision` (bf16 unless said) against `exact`, the reference on the same inputs.
// Returns the error. (The rounding happened: expect_float32_exact checks
// float32's error on the same inputs is below 1e-5, once per case.)
double expect_within(const PrecisionCase& c, const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                     const Tensor<double>& exact, double bound, Precision precision = Precision::BF16) {
  AttentionOptions options = c.options;
  options.precision = precision;
  const auto out = attention(q.view(), k.view(), v.view(), options);
  const double error = rel_error(out, exact);
  EXPECT_LE(error, bound);
  EXPECT_GE(cosine(out, exact), bound > 4e-3 ? 0.9999 : 0.99999);
  EXPECT_GT(error, precision == Precision::Int8 ? 1e-3 : 1e-5);  // (int8's quantization: about 9e-3)
  return error;
}

void expect_float32_exact(const PrecisionCase& c, const Tensor<float>& q, const Tensor<float>& k,
                          const Tensor<float>& v, const Tensor<double>& exact) {
  EXPECT_LE(rel_error(attention(q.view(), k.view(), v.view(), c.options), exact), 1e-5);
}

// Every case of cases() on N(0, 1) inputs within `bound` in `precision`, on
// each unit and target.
void expect_every_case_within(uint32_t seed, Precision precision, double bound) {
  std::mt19937 rng(seed);
  for (const auto& c : cases()) {
    SCOPED_TRACE(c.name);
    const auto q = normal({2, c.heads_q, c.n_q, c.d}, rng);
    const auto k = normal({2, c.heads_kv, c.n_k, c.d}, rng), v = normal({2, c.heads_kv, c.n_k, c.d}, rng);
    const auto exact = reference(c, q, k, v);
    expect_float32_exact(c, q, k, v, exact);
    on_every_unit_and_target([&] { expect_within(c, q, k, v, exact, bound, precision); }, precision);
  }
}

TEST(Precision, BF16WithinItsToleranceOnEveryTarget) { expect_every_case_within(2301, Precision::BF16, 4e-3); }

// int8 precision: the 2e-2 on N(0, 1) inputs, in every case. (Its
// quantization of Q and K, one scale per row, is about 9e-3 there, against
// bf16's 3e-3; rows with a ×30 channel lose more, docs/semantics.md
// "Precision".)
TEST(Precision, Int8WithinItsToleranceOnEveryTarget) { expect_every_case_within(2311, Precision::Int8, 2e-2); }

// bf16 and int8 take the online softmax four key tiles at a time (config.hpp's
// kBF16StepTiles), in steps that start at the same keys for every work item.
// With a sliding window, query tiles start at an odd key tile (rows from 256
// see keys from 106, tile 1; rows from 512 from 362, tile 5), and several
// query tiles share one packing of K and V. One or two threads change the
// rows per item (one kv head: 512, or 256 when items would be too few): the
// results must not change. Within the tolerance on every unit and target.
TEST(Precision, SoftmaxStepsAlignedForEveryItem) {
  std::mt19937 rng(2321);
  const auto q = normal({1, 1, 1100, 64}, rng), k = normal({1, 1, 1100, 64}, rng), v = normal({1, 1, 1100, 64}, rng);
  AttentionOptions options;
  options.window = {150, 0};
  const auto exact = attention(cast<double>(q).view(), cast<double>(k).view(), cast<double>(v).view(), options);
  for (const Precision precision : {Precision::BF16, Precision::Int8}) {
    SCOPED_TRACE(precision == Precision::BF16 ? "bf16" : "int8");
    options.precision = precision;
    on_every_unit_and_target([&] {
      EXPECT_LE(rel_error(attention(q.view(), k.view(), v.view(), options), exact),
                precision == Precision::BF16 ? 4e-3 : 2e-2);
    }, precision);
    const int saved = num_threads();
    set_num_threads(1);
    const auto one = attention(q.view(), k.view(), v.view(), options);
    set_num_threads(2);
    const auto two = attention(q.view(), k.view(), v.view(), options);
    set_num_threads(saved);
    EXPECT_EQ(std::memcmp(one.data(), two.data(), sizeof(float) * one.numel()), 0);
  }
}

// Inputs int8's quantization keeps exactly: each query row integers with
// 127 or -127 among them (scale 1), each key 0.5 plus such integers in
// pairs of opposite sign (their mean 0.5, exact; each key less it, scale
// 1). bf16 keeps them too (at most 8 significant bits), so int8 is bf16's
// arithmetic on the same values: the outputs agree bit for bit, on every
// target. A wrong scale, a missing or wrong center, or codes not rounded
// from x / scale would change the values the products see.
TEST(Precision, Int8OnValuesItKeepsIsBF16) {
  std::mt19937 rng(2312);
  std::uniform_int_distribution<int> code(-127, 127);
  const int64_t d = 40, n_q = 70, n_k = 128;  // (the mean's 1/n_k exact)
  Tensor<float> q({1, 4, n_q, d}), k({1, 2, n_k, d});
  for (int64_t i = 0; i < q.numel(); ++i) q[i] = i % d == 3 ? 127.0f : static_cast<float>(code(rng));
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t j = 0; j < n_k; j += 2)
      for (int64_t c = 0; c < d; ++c) {
        const float x = c == j % d ? -127.0f : static_cast<float>(code(rng));
        k.at({0, h, j, c}) = 0.5f + x;
        k.at({0, h, j + 1, c}) = 0.5f - x;
      }
  const auto v = normal({1, 2, n_k, d}, rng);
  AttentionOptions int8, bf16;
  int8.precision = Precision::Int8;
  bf16.precision = Precision::BF16;
  int8.scale = bf16.scale = 1.0 / (127.0 * 127.0);  // (logits of order 1)
  const auto expect_bitwise_equal = [&] {
    test::on_every_simd_target([&] {
      const auto got = attention(q.view(), k.view(), v.view(), int8);
      const auto want = attention(q.view(), k.view(), v.view(), bf16);
      ASSERT_EQ(std::memcmp(got.data(), want.data(), sizeof(float) * got.numel()), 0);
    });
  };
  const UnitsOn highway(false);  // (the int8 unit scales its sums in another order)
  expect_bitwise_equal();
  // With the bf16 unit on, int8's P·V is the unit's as bf16's is (bf16's
  // scores on the unit are exact sums of these values too, so the same):
  // still bit for bit, where int8's P·V on FMAs would not be.
  if (expected_unit() == "highway") return;
  const test::BF16UnitUseScope bf16_unit(kernels::BF16UnitUse::Always);
  expect_bitwise_equal();
}

// A NaN or an infinity spoils only what it would spoil in float32: its own
// query row, or the rows that reach its key (causal, top-left: rows from
// the key's position on), not the rest of its row's or key's quantization
// group, nor the keys' mean (which counts it as 0: the clean run has 0 there).
// With the int8 unit off (P·V on the bf16 unit where there is one, as
// throughout); the int8 unit, which has no code for them, leaves such a
// call to that path: the same result bit for bit.
TEST(Precision, Int8KeepsANonFiniteValueToItsOwnRows) {
  const test::BF16UnitUseScope bf16_unit(kernels::BF16UnitUse::Always);  // (P·V's, where there is one)
  std::mt19937 rng(2313);
  const int64_t n = 80, d = 64, bad_key = 50, bad_query = 20;
  auto q = normal({1, 2, n, d}, rng), k = normal({1, 2, n, d}, rng);
  const auto v = normal({1, 2, n, d}, rng);
  k.at({0, 0, bad_key, 7}) = 0;
  AttentionOptions int8;
  int8.precision = Precision::Int8;
  int8.causal = Causal::TopLeft;
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    SCOPED_TRACE(bad);
    auto kb = k, qb = q;
    kb.at({0, 0, bad_key, 7}) = bad;
    qb.at({0, 1, bad_query, 9}) = bad;
    test::on_every_simd_target([&] {
      std::optional<Int8UnitOn> int8_unit(std::in_place, true);
      const auto on_unit = attention(qb.view(), kb.view(), v.view(), int8);
      int8_unit.emplace(false);
      const auto clean = attention(q.view(), k.view(), v.view(), int8);
      const auto out = attention(qb.view(), kb.view(), v.view(), int8);
      ASSERT_EQ(std::memcmp(on_unit.data(), out.data(), sizeof(float) * out.numel()), 0);
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t i = 0; i < n; ++i) {
          const bool spoilt = h == 0 ? i >= bad_key : i == bad_query;
          for (int64_t c = 0; c < d; ++c) {
            const float x = out.at({0, h, i, c});
            if (spoilt) {
              ASSERT_FALSE(std::isfinite(x) && x == clean.at({0, h, i, c})) << "h " << h << " row " << i;
            } else {
              ASSERT_EQ(x, clean.at({0, h, i, c})) << "h " << h << " row " << i << " col " << c;
            }
          }
        }
    });
  }
}

// One channel of Q, or of K, 30 times the others (the outliers of trained
// models' activations): its products dominate the logits, and rounding the
// inputs alone, computed exactly afterwards, is an error of 0.9e-2 to
// 1.35e-2, depending on the draw (docs/semantics.md "Precision"). So each
// draw is held to that error plus P's rounding (1e-3), and this one to the
// issue's 1e-2. (With the channel in both at once, the logits' spread is 30²
// times the others' and rounding the inputs alone is 1.7e-2: no bf16 input
// can meet 1e-2 there.)
TEST(Precision, BF16WithAnOutlierChannel) {
  std::mt19937 rng(2302);
  const PrecisionCase c{"outlier", 4, 2, 300, 333, 64, {}};
  const auto rounded = [](Tensor<float> x) {
    for (int64_t i = 0; i < x.numel(); ++i) x[i] = round_to_bf16(x[i]);
    return x;
  };
  for (const bool in_q : {true, false}) {
    SCOPED_TRACE(in_q ? "in q" : "in k");
    auto q = normal({2, 4, 300, 64}, rng), k = normal({2, 2, 333, 64}, rng);
    const auto v = normal({2, 2, 333, 64}, rng);
    Tensor<float>& outlier = in_q ? q : k;
    for (int64_t i = 5; i < outlier.numel(); i += 64) outlier[i] *= 30;
    const auto exact = reference(c, q, k, v);
    const double inputs_alone = rel_error(cast<float>(reference(c, rounded(q), rounded(k), rounded(v))), exact);
    expect_float32_exact(c, q, k, v, exact);
    on_every_unit_and_target([&] { EXPECT_LE(expect_within(c, q, k, v, exact, 1e-2), inputs_alone + 1e-3); });
  }
}

// K and V stored compactly (int4's keys by channel among them): the same
// rounding of the values the kernel reads (their float32 widening), against
// the reference on those values, in bf16 and in int8 (its keys' center and
// codes taken from the stored values).
TEST(Precision, BF16AndInt8WithCompactKV) {
  std::mt19937 rng(2303);
  const auto q = normal({1, 4, 200, 64}, rng), k = normal({1, 2, 250, 64}, rng), v = normal({1, 2, 250, 64}, rng);
  AttentionOptions exact_options;
  exact_options.causal = Causal::BottomRight;
  // Each storage's check, with its reference taken once (not per unit and target).
  const auto check_of = [&](auto ks, auto vs, const Tensor<float>& k_values, const Tensor<float>& v_values) {
    const auto exact = attention(cast<double>(q).view(), cast<double>(k_values).view(),
                                 cast<double>(v_values).view(), exact_options);
    return [&q, &exact_options, ks, vs, exact](Precision precision) {
      AttentionOptions options = exact_options;
      options.precision = precision;
      const auto out = attention(q.view(), ks.view(), vs.view(), options);
      EXPECT_LE(rel_error(out, exact), precision == Precision::Int8 ? 2e-2 : 4e-3);
      EXPECT_GT(rel_error(out, exact), precision == Precision::Int8 ? 1e-3 : 1e-5);
    };
  };
  const auto of = [&](auto ks, auto vs) { return check_of(ks, vs, dequantize(ks.view()), dequantize(vs.view())); };
  const auto int4_k = quantize_int4_keys(k.view()), int4_v = quantize_int4_values(v.view());
  const std::vector<std::pair<const char*, std::function<void(Precision)>>> checks = {
      {"bf16", of(to_bfloat16(k.view()), to_bfloat16(v.view()))},
      {"f16", of(to_float16(k.view()), to_float16(v.view()))},
      {"q8_0", of(quantize_q8_0(k.view()), quantize_q8_0(v.view()))},
      {"q4_0", of(quantize_q4_0(k.view()), quantize_q4_0(v.view()))},
      {"int4", check_of(int4_k, int4_v, dequantize_int4_keys(int4_k.view(), 250), dequantize_int4_values(int4_v.view()))},
  };
  for (const Precision precision : {Precision::BF16, Precision::Int8}) {
    SCOPED_TRACE(precision_name(precision));
    on_every_unit_and_target([&] {
      for (const auto& [name, check] : checks) {
        SCOPED_TRACE(name);
        check(precision);
      }
    }, precision);
  }
}

// A closed form: with one key its weight is 1, so each output row is v's
// row as the products see it, rounded to bf16, exactly (the row's maximum
// weighs exactly 1 in the softmax's sum as in P·V). Every unit and target,
// head dims across the vector widths, several heads of GQA.
TEST(Precision, OneKeyGivesItsValueRoundedToBF16) {
  std::mt19937 rng(2307);
  for (const int64_t d : {1, 7, 16, 40, 64, 130}) {
    SCOPED_TRACE("d = " + std::to_string(d));
    const auto q = normal({1, 4, 3, d}, rng), k = normal({1, 2, 1, d}, rng), v = normal({1, 2, 1, d}, rng);
    AttentionOptions bf16;
    bf16.precision = Precision::BF16;
    on_every_unit_and_target([&] {
      const auto out = attention(q.view(), k.view(), v.view(), bf16);
      for (int64_t h = 0; h < 4; ++h)
        for (int64_t i = 0; i < 3; ++i)
          for (int64_t c = 0; c < d; ++c)
            ASSERT_EQ(out.at({0, h, i, c}), bf16_to_float(float_to_bf16(v.at({0, h / 2, 0, c}))))
                << "head " << h << ", row " << i << ", column " << c;
    });
  }
}

// Returned weights are exact exponentials over the row's sum, which the
// online softmax took with bf16's cheaper 2^x (relative error 1.01e-4 per
// term, whatever the running max was when it was taken): each row sums to
// 1 within (1 + 1.01e-4) / (1 - 1.01e-4) - 1 = 2.03e-4. (The same 2^x for
// the weights does no better: the running max moves the polynomial's
// argument, so its errors do not cancel.)
TEST(Precision, WeightsSumToOne) {
  std::mt19937 rng(2308);
  const auto q = normal({1, 2, 70, 64}, rng), k = normal({1, 2, 300, 64}, rng), v = normal({1, 2, 300, 64}, rng);
  AttentionOptions bf16;
  bf16.precision = Precision::BF16;
  bf16.scale = 0.5;  // logits spread as in trained models
  on_every_unit_and_target([&] {
    const auto w = test::forward_with_weights(q.view(), k.view(), v.view(), bf16).weights;
    double worst = 0;
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 70; ++i) {
        double sum = 0;
        for (int64_t j = 0; j < 300; ++j) sum += w.at({0, h, i, j});
        worst = std::max(worst, std::abs(sum - 1));
      }
    EXPECT_LE(worst, 2.03e-4);
    EXPECT_GT(worst, 1e-6);  // (float32's exponentials would sum to 1 within rounding)
  });
}

// Logits beyond float32's range (q and k of 1e20): bf16's products overflow
// to NaN (+inf and -inf in one pair), and such a row is computed again in
// double. Its weights, logits and lse were the kernel's NaNs beside the
// double's finite output; they now describe the output: in every precision
// the output is the weights' mean of the values, the weights sum to 1, and
// nothing is NaN. (The logits themselves may differ between precisions:
// they overflow.)
TEST(Precision, ExtrasDescribeTheOutputWhenLogitsOverflow) {
  std::mt19937 rng(2346);
  Tensor<float> q = normal({2, 40, 64}, rng), k = normal({2, 70, 64}, rng);
  const Tensor<float> v = normal({2, 70, 16}, rng);
  for (int64_t i = 0; i < q.numel(); ++i) q[i] *= 1e20f;
  for (int64_t i = 0; i < k.numel(); ++i) k[i] *= 1e20f;
  for (Precision precision : {Precision::Float32, Precision::BF16, Precision::Int8}) {
    AttentionOptions o;
    o.precision = precision;
    test::Returns returns;
    returns.weights = true;
    returns.lse = true;
    returns.logits = Logits::Masked;
    on_every_unit_and_target([&] {
      const auto r = test::forward(q.view(), k.view(), v.view(), returns, o);
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t i = 0; i < 40; ++i) {
          double sum = 0;
          for (int64_t j = 0; j < 70; ++j) sum += r.weights.at({h, i, j});
          ASSERT_NEAR(sum, 1.0, 1e-5) << precision_name(precision) << " row " << i;
          ASSERT_FALSE(std::isnan(r.lse.at({h, i})));
          for (int64_t c = 0; c < 16; ++c) {
            // bf16 and int8 round P and V to bf16 for P·V (2^-9 each, relative)
            // but return the weights unrounded.
            double mean = 0, size = 0;
            for (int64_t j = 0; j < 70; ++j) {
              mean += r.weights.at({h, i, j}) * double(v.at({h, j, c}));
              size += r.weights.at({h, i, j}) * std::abs(double(v.at({h, j, c})));
            }
            const double bound = precision == Precision::Float32 ? 1e-5 : 0x1p-8 * size + 1e-6;
            ASSERT_NEAR(r.out.at({h, i, c}), mean, bound) << precision_name(precision) << " row " << i;
          }
        }
    });
  }
}

// A sink at 0 and one key whose logit c is above it by less than float32's
// lazy-rescale threshold (c from 1/16 to 4, exact in bf16; v = 1): the
// key's weight, the output, is e^c / (1 + e^c). bf16 moves the running max
// to the key, whose P is then 2^0 = 1, exact, and the sink's term is a
// float32 exponential: float32's error, within 1e-6. (Keeping the max at
// the sink, as float32's lazy rescale does, gives the key P = e^c, rounded
// to bf16 for P·V but not in the sum: measured 3.4e-3 off.)
TEST(Precision, KeyAboveASinkWeighsItsFormula) {
  constexpr int64_t n_q = 64;
  Tensor<float> q({1, 1, n_q, 1}), k({1, 1, 1, 1}), v({1, 1, 1, 1});
  k[0] = 1.0f;
  v[0] = 1.0f;
  for (int64_t i = 0; i < n_q; ++i) q[i] = static_cast<float>(i + 1) / 16.0f;
  AttentionOptions bf16;
  bf16.precision = Precision::BF16;
  bf16.scale = 1.0;
  bf16.sinks = {0.0};
  on_every_unit_and_target([&] {
    const auto out = attention(q.view(), k.view(), v.view(), bf16);
    double worst = 0;
    for (int64_t i = 0; i < n_q; ++i)
      worst = std::max(worst, std::abs(out[i] - 1.0 / (1.0 + std::exp(-double(q[i])))));
    EXPECT_LE(worst, 1e-6);
  });
}

// The unit is the CPU's (expected_unit), the Highway path when it is
// switched off. ATTN_EXPECT_UNIT (set by make test-arm per emulated CPU)
// names it independently of any check in this process. By default bf16
// precision takes the unit where it measured at least 1.25x the FMAs'
// throughput, and its measured speedup is a plausible ratio: the unit's
// instructions do twice an FMA's products, at a rate that differs by CPU.
TEST(Precision, UnitIsTheCPUs) {
  {
    const test::BF16UnitUseScope always(kernels::BF16UnitUse::Always);
    EXPECT_EQ(precision_unit(Precision::BF16), expected_unit());
    if (const char* unit = std::getenv("ATTN_EXPECT_UNIT")) {
      EXPECT_EQ(precision_unit(Precision::BF16), unit);
    }
    EXPECT_EQ(precision_unit(Precision::Float32), "highway");
  }
  EXPECT_EQ(precision_unit(Precision::Int8), expected_int8_unit());  // (by default, where there is one)
  if (const char* unit = std::getenv("ATTN_EXPECT_INT8_UNIT")) {
    EXPECT_EQ(precision_unit(Precision::Int8), unit);
  }
  {
    const UnitsOn never(false);
    EXPECT_EQ(precision_unit(Precision::BF16), "highway");
    EXPECT_EQ(precision_unit(Precision::Int8), "highway");
  }
  const double speedup = kernels::bf16_unit_speedup();
  if (expected_unit() == "highway") {
    EXPECT_EQ(precision_unit(Precision::BF16), "highway");
  } else {
    if (!test::emulated()) {  // (an emulator's timings say nothing about a CPU)
      EXPECT_GT(speedup, 0.05);
      EXPECT_LT(speedup, 8.0);
    }
    EXPECT_EQ(precision_unit(Precision::BF16), speedup >= kernels::kBF16UnitMinSpeedup ? expected_unit() : "highway");
  }
}

// A unit computes what the Highway path computes: the same rounded values
// (bf16) or codes (int8), summed in another order (bf16: pairs, then the
// unit's lanes, and Arm's BFDOT rounds its sums to odd; int8: exactly, in
// integers, scaled once). The logits and weights (from float32 scores) agree
// to float32 rounding, within 2e-6. The outputs differ more: a score a few
// ulps away can round a weight of P to the next bf16 value, 2^-8 away.
// Measured for bf16: at most 4.6e-5 on a Zen 5, 1.1e-4 under qemu's BFDOT,
// against 3.3e-3 for either against the exact result; not rounding P at all
// would differ by 1.4e-3 (NumPy, these shapes). Hence 3e-4. Every option
// that changes the scores or the values read: causal, boolean and additive
// masks, windows, softcap, ALiBi, sinks, odd and wide head dims, a partial
// tile of 1 key, returned weights and logits. On every target the unit fits.
void expect_unit_agrees_with_the_highway_path(Precision precision, uint32_t seed) {
  std::mt19937 rng(seed);
  auto list = cases();
  list.push_back({"one_key_past_a_tile", 2, 2, 40, 65, 33, {}});
  list.push_back({"wide", 1, 1, 20, 70, 300, {}});
  list.push_back({"boolean_mask", 2, 1, 50, 100, 64, {}});
  list.push_back({"additive_mask", 2, 1, 50, 100, 64, {}});
  for (const auto& c : list) {
    SCOPED_TRACE(c.name);
    const auto q = normal({1, c.heads_q, c.n_q, c.d}, rng);
    const auto k = normal({1, c.heads_kv, c.n_k, c.d}, rng), v = normal({1, c.heads_kv, c.n_k, c.d}, rng);
    AttentionOptions options = c.options;
    options.precision = precision;
    // Masks of (n_q, n_k), broadcast over the heads: a key in 3 blocked, or
    // N(0, 1) added.
    Tensor<bool> allowed({c.n_q, c.n_k});
    const Tensor<float> added = normal({c.n_q, c.n_k}, rng);
    for (int64_t i = 0; i < allowed.numel(); ++i) allowed[i] = rng() % 3 != 0;
    const std::string name = c.name;
    const Mask mask = name == "boolean_mask"    ? Mask(TensorView<const bool>(allowed.view()))
                      : name == "additive_mask" ? Mask(TensorView<const float>(added.view()))
                                                : Mask();
    const test::Returns returns{true, Logits::Scaled, false};  // (scaled: no -inf to compare)
    int compared = 0;
    test::on_every_simd_target([&] {
      std::optional<UnitsOn> units(std::in_place, true);
      if (precision_unit(precision) == "highway") return;  // (a target the unit does not fit)
      const auto unit = test::forward(q.view(), k.view(), v.view(), returns, options, mask);
      units.emplace(false);
      const auto fallback = test::forward(q.view(), k.view(), v.view(), returns, options, mask);
      units.reset();
      const double out_error = rel_error(unit.out, cast<double>(fallback.out));
      EXPECT_LE(out_error, 3e-4);
      EXPECT_GT(out_error, 0.0);  // two computations, not one
      EXPECT_LE(rel_error(unit.weights, cast<double>(fallback.weights)), 2e-6);
      EXPECT_LE(rel_error(unit.logits, cast<double>(fallback.logits)), 2e-6);
      ++compared;
    });
    EXPECT_GT(compared, 0);
  }
}

TEST(Precision, UnitAgreesWithTheHighwayPath) {
  if (expected_unit() == "highway") GTEST_SKIP() << "this CPU has no bf16 unit";
  expect_unit_agrees_with_the_highway_path(Precision::BF16, 2306);
}

TEST(Precision, Int8UnitAgreesWithTheHighwayPath) {
  if (expected_int8_unit() == "highway") GTEST_SKIP() << "this CPU has no int8 unit";
  expect_unit_agrees_with_the_highway_path(Precision::Int8, 2316);
}

// The unit's panel of codes takes a tile's place among the packed keys,
// which it fits from head dim 3 on; below that, and for a call with a
// magnitude past the unit's limit (2^32, kInt8UnitLimit), the call takes
// the Highway path: bitwise its result. Head dims 1 to 5, two batches and
// kv heads (the last tile at the end of the packed keys), several tiles and
// a partial one, every target.
TEST(Precision, Int8UnitAtItsEdges) {
  if (expected_int8_unit() == "highway") GTEST_SKIP() << "this CPU has no int8 unit";
  const test::BF16UnitUseScope bf16_unit(kernels::BF16UnitUse::Always);  // (P·V's, where there is one)
  std::mt19937 rng(2317);
  AttentionOptions int8;
  int8.precision = Precision::Int8;
  const auto compare = [&](const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v, bool unit) {
    test::on_every_simd_target([&] {
      std::optional<Int8UnitOn> int8_unit(std::in_place, true);
      const auto on = attention(q.view(), k.view(), v.view(), int8);
      int8_unit.emplace(false);
      const auto off = attention(q.view(), k.view(), v.view(), int8);
      if (unit) {
        const double difference = rel_error(on, cast<double>(off));
        EXPECT_LE(difference, 3e-4);
        EXPECT_GT(difference, 0.0);
      } else {
        ASSERT_EQ(std::memcmp(on.data(), off.data(), sizeof(float) * on.numel()), 0);
      }
    });
  };
  for (int64_t d = 1; d <= 5; ++d) {
    SCOPED_TRACE("head dim " + std::to_string(d));
    const auto q = normal({2, 4, 150, d}, rng), k = normal({2, 2, 200, d}, rng), v = normal({2, 2, 200, d}, rng);
    compare(q, k, v, d >= 3);
  }
  auto q = normal({1, 2, 100, 64}, rng), k = normal({1, 2, 100, 64}, rng);
  const auto v = normal({1, 2, 100, 64}, rng);
  k[77] = 8589934592.0f;  // 2^33
  compare(q, k, v, false);
  k[77] = 1, q[5] = -8589934592.0f;
  compare(q, k, v, false);
}

// The int8 unit's peak loop (precision_peak_loop, the bench's
// int8_peak_gops) does the operations it counts: 12 sums of its lanes, each
// starting at its index and adding four 1 · 1 byte products per round; 2
// operations per product.
TEST(Precision, Int8PeakLoopDoesWhatItCounts) {
  float sink = 0;
  const int64_t rounds = 1000;
  const double ops = precision_peak_loop(Precision::Int8, rounds, &sink);
  const kernels::Int8Unit* unit = kernels::cpu_int8_unit();
  ASSERT_EQ(unit != nullptr, expected_int8_unit() != "highway");
  if (!unit) {
    EXPECT_EQ(ops, 0.0);
    return;
  }
  const auto lanes = static_cast<float>(unit->lanes);
  EXPECT_EQ(lanes, expected_int8_unit() == "avx512_vnni" ? 16 : 4);
  EXPECT_EQ(ops, 2.0 * 4 * lanes * 12 * rounds);
  EXPECT_EQ(sink, lanes * (66 + 12 * 4 * rounds));  // lanes · Σ_i (i + 4 · rounds)
}

// precision_peak_loop runs each precision's unit: the FMAs for float32
// (some work on every CPU), the bf16 unit where the CPU has one (none: 0),
// and as many operations per round as the rounds ask.
TEST(Precision, PeakLoopIsEachPrecisionsUnit) {
  float sink = 0;
  const double fma = precision_peak_loop(Precision::Float32, 1000, &sink);
  EXPECT_GT(fma, 0);
  EXPECT_EQ(precision_peak_loop(Precision::Float32, 2000, &sink), 2 * fma);
  const double bf16 = precision_peak_loop(Precision::BF16, 1000, &sink);
  EXPECT_EQ(bf16 > 0, expected_unit() != "highway");
  EXPECT_EQ(precision_peak_loop(Precision::BF16, 2000, &sink), 2 * bf16);
}

// A few queries against more keys than one decode chunk take the decode
// kernel, which stays float32 (bound by memory, not arithmetic): float32's
// accuracy, not bf16's.
TEST(Precision, DecodeStaysFloat32) {
  std::mt19937 rng(2304);
  const auto q = normal({2, 4, 1, 64}, rng), k = normal({2, 2, 3000, 64}, rng), v = normal({2, 2, 3000, 64}, rng);
  AttentionOptions bf16;
  bf16.precision = Precision::BF16;
  const auto exact = attention(cast<double>(q).view(), cast<double>(k).view(), cast<double>(v).view());
  EXPECT_LE(rel_error(attention(q.view(), k.view(), v.view(), bf16), exact), 1e-5);
}

// int8 precision over q8_0 keys, in decode: each query row rounded to q8_0
// as quantize_q8_0 rounds it (llama.cpp's vec_dot_q8_0_q8_0), its products
// with the keys' codes exact in int32 on the int8 unit (or in float32 on
// the rounded values without one): float32's accuracy against the float64
// attention of the rounded queries, where float32 precision is q8_0's
// rounding away. Keys in every decode chunk (the last partial, its last
// 64-key tile not a whole 16), one query (GQA 4) and two (causal), head
// dims of one and of four blocks, heads apart and side by side (kv heads
// read together), every target, the unit on and off.
TEST(Precision, Int8DecodeOverQ8_0RoundsTheQueriesToQ8_0) {
  std::mt19937 rng(2318);
  AttentionOptions int8;
  int8.precision = Precision::Int8;
  // Query heads and queries: 1, 4, 7 and 8 rows per kv head (one row's
  // blocks folded, rows 4 at a time and the rest, the unit's panels).
  const std::pair<int64_t, int64_t> row_counts[] = {{2, 1}, {8, 1}, {14, 1}, {8, 2}};
  for (const int64_t d : {32, 128})
    for (const auto& [heads, n_q] : row_counts)
      for (const bool side_by_side : {false, true}) {
        SCOPED_TRACE("head dim " + std::to_string(d) + ", " + std::to_string(heads) + " query heads, " +
                     std::to_string(n_q) + " queries" + (side_by_side ? ", kv heads side by side" : ""));
        int8.causal = n_q == 2 ? Causal::BottomRight : Causal::None;
        const auto q = normal({2, heads, n_q, d}, rng);
        // (batch, key, kv head, d) read as (batch, kv head, key, d) when side by side
        const Shape kv_shape = side_by_side ? Shape{2, 1300, 2, d} : Shape{2, 2, 1300, d};
        const auto k = quantize_q8_0(normal(kv_shape, rng).view()), v = quantize_q8_0(normal(kv_shape, rng).view());
        const auto kv = [&](const Tensor<block_q8_0>& x) {
          return side_by_side ? TensorView<const block_q8_0>(x.view()).transpose(1, 2) : TensorView<const block_q8_0>(x.view());
        };
        const auto k64 = cast<double>(dequantize(kv(k))), v64 = cast<double>(dequantize(kv(v)));
        AttentionOptions exact_options = int8;
        exact_options.precision = Precision::Float32;
        const auto rounded = cast<double>(dequantize(TensorView<const block_q8_0>(quantize_q8_0(q.view()).view())));
        const auto exact = attention(rounded.view(), k64.view(), v64.view(), exact_options);
        const auto unrounded = attention(cast<double>(q).view(), k64.view(), v64.view(), exact_options);
        EXPECT_GT(rel_error(unrounded, exact), 1e-3);  // (what the test tells apart)
        for (const bool on : {true, false}) {
          if (on && expected_int8_unit() == "highway") continue;
          SCOPED_TRACE(on ? "the CPU's unit" : "the Highway path");
          const Int8UnitOn unit(on);
          test::on_every_simd_target([&] {
            EXPECT_LE(rel_error(attention(q.view(), kv(k), kv(v), int8), exact), 2e-6);
          });
        }
      }
}

// Decode takes the int8 unit from 8 query rows per KV head (the test above
// runs 1, 4, 7 and 8 rows, each with the unit on and off); other
// precisions' decode units are precision_unit's.
TEST(Precision, Int8DecodeTakesTheUnitFromEightRowsPerKVHead) {
  for (const int64_t rows : {1, 4, 7}) EXPECT_EQ(decode_precision_unit(Precision::Int8, rows), "highway") << rows;
  for (const int64_t rows : {8, 32})
    EXPECT_EQ(decode_precision_unit(Precision::Int8, rows), expected_int8_unit()) << rows;
  {
    const Int8UnitOn off(false);
    EXPECT_EQ(decode_precision_unit(Precision::Int8, 8), "highway");
  }
  for (const Precision p : {Precision::Float32, Precision::BF16})
    EXPECT_EQ(decode_precision_unit(p, 1), precision_unit(p));
}

// A query q8_0 cannot hold (past 65504 · 127, whose scale's fp16
// overflows) keeps the call's queries as they are: float32 precision's
// result, bit for bit.
TEST(Precision, Int8DecodeKeepsQueriesQ8_0CannotHold) {
  std::mt19937 rng(2319);
  auto q = normal({1, 4, 1, 64}, rng);
  const auto k = quantize_q8_0(normal({1, 2, 1000, 64}, rng).view()), v = quantize_q8_0(normal({1, 2, 1000, 64}, rng).view());
  q[70] = 1e7f;
  AttentionOptions int8;
  int8.precision = Precision::Int8;
  const auto kept = attention(q.view(), TensorView<const block_q8_0>(k.view()), TensorView<const block_q8_0>(v.view()), int8);
  const auto f32 = attention(q.view(), TensorView<const block_q8_0>(k.view()), TensorView<const block_q8_0>(v.view()));
  ASSERT_EQ(std::memcmp(kept.data(), f32.data(), sizeof(float) * kept.numel()), 0);
}

// The kernels' rounding, bit for bit float_to_bf16's, on every target: ties
// to even, overflow to infinity, signed zeros, subnormals, NaNs (quieted,
// top half kept), and random values over the whole range.
TEST(Precision, RoundingIsFloatToBF16s) {
  const auto of_bits = [](uint32_t b) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  };
  std::vector<float> x = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -(1.0f + 0x1p-8f), 3.0f,
                          std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                          of_bits(0x7f7f8000u), of_bits(0x7f7f7fffu), 0.0f, -0.0f, 1e-40f, -1e-45f,
                          std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          of_bits(0x7f800001u), of_bits(0xffc12345u), of_bits(0x7fffffffu)};
  std::mt19937 rng(2305);
  for (int i = 0; i < 5000; ++i) x.push_back(of_bits(static_cast<uint32_t>(rng())));
  test::on_every_simd_target([&] {
    for (const size_t n : {x.size(), x.size() - 3}) {  // a partial last vector on every width
      std::vector<float> out(n);
      kernels::round_to_bf16(x.data(), out.data(), static_cast<int64_t>(n));
      for (size_t i = 0; i < n; ++i) {
        const float want = bf16_to_float(float_to_bf16(x[i]));
        ASSERT_EQ(std::memcmp(&out[i], &want, 4), 0) << "x = " << x[i] << " (element " << i << ")";
      }
    }
  });
}

TEST(Precision, ParsedAndRefusedWhereItDoesNotApply) {
  EXPECT_EQ(parse_precision("bf16"), Precision::BF16);
  EXPECT_EQ(parse_precision("f32"), Precision::Float32);
  EXPECT_EQ(parse_precision("int8"), Precision::Int8);
  EXPECT_EQ(precision_name(Precision::BF16), "bf16");
  EXPECT_EQ(precision_name(Precision::Int8), "int8");
  EXPECT_THROW_MSG(parse_precision("fp8"), ValueError, "precision must be 'f32', 'bf16' or 'int8', got 'fp8'");
  AttentionOptions bf16;
  bf16.precision = Precision::BF16;
  const Tensor<double> q({2, 3, 8}), k({2, 5, 8});
  EXPECT_THROW_MSG(attention(q.view(), k.view(), k.view(), bf16), ValueError, "pass float32 q, k, v");
  const Tensor<float> qf({2, 3, 8}), kf({2, 5, 8}), dout({2, 3, 8});
  EXPECT_THROW_MSG(attention_backward(qf.view(), kf.view(), kf.view(), dout.view(), bf16), ValueError,
                   "the backward computes in float32: precision must be f32, got bf16");

  // The layer: a forward in bf16, but none saved for the float32 backward;
  // float64 with a cache is refused before the cache takes the chunk.
  MultiHeadAttentionConfig c;
  c.embed_dim = 8;
  c.num_heads = 2;
  const MultiHeadAttention<float> layer(c);
  MhaForwardOptions<float> o;
  o.attention.precision = Precision::BF16;
  const Tensor<float> x({2, 3, 8});
  EXPECT_EQ(layer.forward(x.view(), {}, {}, o).out.shape(), x.shape());
  const char* float32_backward = "attention.precision must be f32 for backward and save_for_backward, got bf16";
  EXPECT_THROW_MSG(layer.backward(x.view(), x.view(), {}, {}, o), ValueError, float32_backward);
  o.save_for_backward = true;
  EXPECT_THROW_MSG(layer.forward(x.view(), {}, {}, o), ValueError, float32_backward);
  const MultiHeadAttention<double> layer64(c);
  auto cache = layer64.new_cache();
  MhaForwardOptions<double> o64;
  o64.attention.precision = Precision::BF16;
  o64.cache = &cache;
  EXPECT_THROW_MSG(layer64.forward(Tensor<double>({2, 3, 8}).view(), {}, {}, o64), ValueError,
                   "pass float32 q, k, v");
  EXPECT_EQ(cache.length(), 0);
}

}  // namespace
}  // namespace attn
