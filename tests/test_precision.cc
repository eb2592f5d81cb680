// bf16 precision (AttentionOptions::precision): Q, K, V and P rounded to
// bfloat16, products summed in float32. Against the double reference on the
// unrounded inputs, within the tolerances: relative Frobenius error
// <= 4e-3 (cosine >= 0.99999) on N(0, 1) inputs, <= 1e-2 with a ×30 outlier
// channel in Q and K. Each input's rounding is a relative error of up to
// 2^-9 = 2e-3; summed over d = 64 terms of random sign it averages out to a
// few 1e-4 in the scores, and V's and P's rounding to a few 1e-4 in the
// output: 4e-3 leaves room for the worst rows.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "attn/attention.hpp"
#include "attn/quantize.hpp"
#include "helpers.hpp"

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
      {"odd_head_dim", 2, 2, 70, 90, 40, {}},
      {"one_query", 4, 2, 1, 700, 64, {}},       // the shape decode takes in float32
  };
}

// attention in bf16 precision, and the double reference on the same inputs.
void expect_within(const PrecisionCase& c, const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                   double bound) {
  AttentionOptions bf16 = c.options;
  bf16.precision = Precision::BF16;
  const auto out = attention(q.view(), k.view(), v.view(), bf16);
  const auto exact = attention(cast<double>(q).view(), cast<double>(k).view(), cast<double>(v).view(), c.options);
  const double error = rel_error(out, exact);
  EXPECT_LE(error, bound);
  EXPECT_GE(cosine(out, exact), bound > 4e-3 ? 0.9999 : 0.99999);
  // The rounding happened: float32's error on the same inputs is below 1e-5.
  EXPECT_GT(error, 1e-5);
  EXPECT_LE(rel_error(attention(q.view(), k.view(), v.view(), c.options), exact), 1e-5);
}

TEST(Precision, BF16WithinItsToleranceOnEveryTarget) {
  std::mt19937 rng(2301);
  for (const auto& c : cases()) {
    SCOPED_TRACE(c.name);
    const auto q = normal({2, c.heads_q, c.n_q, c.d}, rng);
    const auto k = normal({2, c.heads_kv, c.n_k, c.d}, rng), v = normal({2, c.heads_kv, c.n_k, c.d}, rng);
    test::on_every_simd_target([&] { expect_within(c, q, k, v, 4e-3); });
  }
}

// One channel of Q, or of K, 30 times the others (the outliers of trained
// models' activations): its products dominate the logits. (With both at
// once, the logits' spread is 30² times the others' and rounding the inputs
// alone, computed exactly afterwards, is a 1.7e-2 error: no bf16 input can
// do better; docs/semantics.md "Precision".)
TEST(Precision, BF16WithAnOutlierChannel) {
  std::mt19937 rng(2302);
  const PrecisionCase c{"outlier", 4, 2, 300, 333, 64, {}};
  for (const bool in_q : {true, false}) {
    SCOPED_TRACE(in_q ? "in q" : "in k");
    auto q = normal({2, 4, 300, 64}, rng), k = normal({2, 2, 333, 64}, rng);
    const auto v = normal({2, 2, 333, 64}, rng);
    Tensor<float>& outlier = in_q ? q : k;
    for (int64_t i = 5; i < outlier.numel(); i += 64) outlier[i] *= 30;
    test::on_every_simd_target([&] { expect_within(c, q, k, v, 1e-2); });
  }
}

// K and V stored in 16 or 8 bits: the same rounding of the values the kernel
// reads (their float32 widening), against the reference on those values.
TEST(Precision, BF16WithCompactKV) {
  std::mt19937 rng(2303);
  const auto q = normal({1, 4, 200, 64}, rng), k = normal({1, 2, 250, 64}, rng), v = normal({1, 2, 250, 64}, rng);
  AttentionOptions bf16;
  bf16.precision = Precision::BF16;
  bf16.causal = Causal::BottomRight;
  const auto check = [&](auto ks, auto vs) {
    const auto out = attention(q.view(), ks.view(), vs.view(), bf16);
    AttentionOptions exact_options = bf16;
    exact_options.precision = Precision::Float32;
    const auto exact = attention(cast<double>(q).view(), cast<double>(dequantize(ks.view())).view(),
                                 cast<double>(dequantize(vs.view())).view(), exact_options);
    EXPECT_LE(rel_error(out, exact), 4e-3);
    EXPECT_GT(rel_error(out, exact), 1e-5);
  };
  check(to_bfloat16(k.view()), to_bfloat16(v.view()));
  check(to_float16(k.view()), to_float16(v.view()));
  check(quantize_q8_0(k.view()), quantize_q8_0(v.view()));
}

TEST(Precision, ParsedAndRefusedWhereItDoesNotApply) {
  EXPECT_EQ(parse_precision("bf16"), Precision::BF16);
  EXPECT_EQ(parse_precision("f32"), Precision::Float32);
  EXPECT_EQ(precision_name(Precision::BF16), "bf16");
  EXPECT_THROW_MSG(parse_precision("fp8"), ValueError, "precision must be 'f32' or 'bf16', got 'fp8'");
  AttentionOptions bf16;
  bf16.precision = Precision::BF16;
  const Tensor<double> q({2, 3, 8}), k({2, 5, 8});
  EXPECT_THROW_MSG(attention(q.view(), k.view(), k.view(), bf16), ValueError, "pass float32 q, k, v");
  const Tensor<float> qf({2, 3, 8}), kf({2, 5, 8}), dout({2, 3, 8});
  EXPECT_THROW_MSG(attention_backward(qf.view(), kf.view(), kf.view(), dout.view(), bf16), ValueError,
                   "the backward computes in float32: precision must be f32, got bf16");
}

}  // namespace
}  // namespace attn
