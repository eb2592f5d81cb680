// attention(): the float32 kernel against the double reference over a sweep of
// shapes and options, and the reference itself against closed forms.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "helpers.hpp"

namespace attn {
namespace {

using test::cast;
using test::max_abs_diff;
using test::random_tensor;
using test::rel_error;

using test::kInf;

// ---------------------------------------------------------------------------
// The reference against closed forms.

TEST(Reference, OneKeyReturnsItsValue) {
  std::mt19937 rng(3);
  const auto q = random_tensor({4, 6}, rng), k = random_tensor({1, 6}, rng),
             v = random_tensor({1, 5}, rng);
  const auto r = test::forward_with_weights(q.view(), k.view(), v.view());
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(r.weights[i], 1.0);
    for (int64_t c = 0; c < 5; ++c) EXPECT_NEAR(r.out[i * 5 + c], v[c], 1e-15);
  }
}

TEST(Reference, TwoKeysGiveALogisticWeight) {
  // w0 = 1 / (1 + exp(s1 - s0)), s = q·k * scale, optionally softcapped.
  const Tensor<double> q({1, 2}, {0.3, -1.2}), k({2, 2}, {1.5, 0.5, -0.7, 2.0}),
      v({2, 1}, {10.0, -4.0});
  for (double cap : {0.0, 0.5}) {
    AttentionOptions o;
    o.scale = 0.8;
    o.softcap = cap;
    double s0 = (0.3 * 1.5 - 1.2 * 0.5) * 0.8, s1 = (0.3 * -0.7 - 1.2 * 2.0) * 0.8;
    if (cap > 0) s0 = cap * std::tanh(s0 / cap), s1 = cap * std::tanh(s1 / cap);
    const double w0 = 1.0 / (1.0 + std::exp(s1 - s0));
    const auto r = test::forward_with_weights(q.view(), k.view(), v.view(), o);
    EXPECT_NEAR(r.weights[0], w0, 1e-15);
    EXPECT_NEAR(r.out[0], w0 * 10.0 + (1 - w0) * -4.0, 1e-13);
  }
}

// With q = 0 every logit is 0, so the output is the plain mean of the values
// of the allowed keys: a closed form for causal masks and windows.
struct RangeCase {
  int64_t n_q, n_k;
  Causal causal;
  Window window;
};

// docs/semantics.md's table, written out: p is the query's position.
bool allowed_by_spec(const RangeCase& c, int64_t i, int64_t j) {
  const bool offset = c.causal.kind() == Causal::Kind::Offset;
  const int64_t p = i + (offset ? c.causal.offset_value() : c.n_k - c.n_q);
  bool ok = true;
  if (c.causal == Causal::BottomRight) ok = ok && j <= p;
  if (c.causal == Causal::TopLeft) ok = ok && j <= i;
  if (offset) ok = ok && j <= i + c.causal.offset_value();
  if (c.window.left >= 0) ok = ok && p - c.window.left <= j;
  if (c.window.right >= 0) ok = ok && j <= p + c.window.right;
  return ok;
}

TEST(Reference, CausalAndWindowSelectTheSpecifiedKeys) {
  std::mt19937 rng(4);
  const std::vector<RangeCase> cases = {
      {5, 5, Causal::BottomRight, {}}, {3, 7, Causal::BottomRight, {}},
      {7, 3, Causal::BottomRight, {}}, {3, 7, Causal::TopLeft, {}},
      {7, 3, Causal::TopLeft, {}},     {6, 6, Causal::None, {2, 1}},
      {4, 9, Causal::BottomRight, {3, -1}}, {4, 9, Causal::TopLeft, {-1, 0}},
      {9, 4, Causal::None, {0, 0}},    {5, 8, Causal::None, {-1, 2}},
      // explicit offsets: ONNX's padded caches (keys past i + k), rows with
      // no key (k < 0), every key (k past n_k), windows centred on i + k
      {4, 9, Causal::offset(2), {}},   {4, 9, Causal::offset(-2), {}},
      {4, 9, Causal::offset(20), {}},  {4, 9, Causal::offset(3), {1, 1}},
      {6, 3, Causal::offset(0), {-1, 0}}, {5, 5, Causal::offset(-7), {}},
  };
  for (const auto& c : cases) {
    const auto v = random_tensor({c.n_k, 3}, rng);
    const Tensor<double> q({c.n_q, 4}), k = random_tensor({c.n_k, 4}, rng);
    AttentionOptions o;
    o.causal = c.causal;
    o.window = c.window;
    const auto out = attention(q.view(), k.view(), v.view(), o);
    for (int64_t i = 0; i < c.n_q; ++i)
      for (int64_t ch = 0; ch < 3; ++ch) {
        double sum = 0;
        int count = 0;
        for (int64_t j = 0; j < c.n_k; ++j)
          if (allowed_by_spec(c, i, j)) sum += v[j * 3 + ch], ++count;
        const double expected = count ? sum / count : 0.0;  // no key: zeros
        EXPECT_NEAR(out[i * 3 + ch], expected, 1e-14)
            << "n_q=" << c.n_q << " n_k=" << c.n_k << " i=" << i;
      }
  }
}

TEST(Reference, BooleanMaskEqualsZeroMinusInfAdditiveMask) {
  std::mt19937 rng(5);
  const auto q = random_tensor({2, 3, 4, 5}, rng), k = random_tensor({2, 3, 6, 5}, rng),
             v = random_tensor({2, 3, 6, 2}, rng);
  Tensor<bool> allow({4, 6});
  Tensor<double> add({4, 6});
  for (int64_t i = 0; i < allow.numel(); ++i) {
    allow[i] = rng() % 3 != 0;
    add[i] = allow[i] ? 0.0 : -kInf;
  }
  const auto a = attention(q.view(), k.view(), v.view(), {}, TensorView<const bool>(allow.view()));
  const auto b = attention(q.view(), k.view(), v.view(), {}, TensorView<const double>(add.view()));
  EXPECT_EQ(max_abs_diff(a, b), 0.0);
}

TEST(Reference, BroadcastMaskEqualsExpandedMask) {
  std::mt19937 rng(6);
  const auto q = random_tensor({2, 3, 4, 5}, rng), k = random_tensor({2, 3, 6, 5}, rng),
             v = random_tensor({2, 3, 6, 2}, rng);
  const auto small = random_tensor({3, 1, 6}, rng, -2, 2);
  Tensor<double> full({2, 3, 4, 6});
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 3; ++h)
      for (int64_t i = 0; i < 4; ++i)
        for (int64_t j = 0; j < 6; ++j) full.at({b, h, i, j}) = small.at({h, 0, j});
  const auto a = attention(q.view(), k.view(), v.view(), {}, TensorView<const double>(small.view()));
  const auto b = attention(q.view(), k.view(), v.view(), {}, TensorView<const double>(full.view()));
  EXPECT_EQ(max_abs_diff(a, b), 0.0);
}

// ALiBi is an additive bias -slope[h] · (p - j), p = i + (n_k - n_q), the same
// for every batch entry: the reference with alibi_slopes equals the reference
// with that bias as a dense float mask, for each causal alignment, with GQA
// and a boolean mask beside it.
TEST(Reference, AlibiIsADenseAdditiveBias) {
  std::mt19937 rng(9);
  const int64_t hq = 6, hkv = 2;
  for (const auto& [n_q, n_k] : {std::pair<int64_t, int64_t>{4, 7}, {7, 4}, {5, 5}})
    for (Causal causal : {Causal::None, Causal::BottomRight, Causal::TopLeft, Causal::offset(2),
                          Causal::offset(-1)}) {
      SCOPED_TRACE("n_q " + std::to_string(n_q) + " n_k " + std::to_string(n_k) + " causal " +
                   causal_name(causal));
      // the query's position: the offset when one is given, else bottom-right
      const int64_t shift = causal.kind() == Causal::Kind::Offset ? causal.offset_value() : n_k - n_q;
      const auto q = random_tensor({2, hq, n_q, 5}, rng), k = random_tensor({2, hkv, n_k, 5}, rng),
                 v = random_tensor({2, hkv, n_k, 3}, rng);
      AttentionOptions o;
      o.causal = causal;
      o.alibi_slopes = {0.5, 0.25, -0.125, 2.0, 0.0, 1.0 / 3};
      Tensor<double> bias({hq, n_q, n_k});
      for (int64_t h = 0; h < hq; ++h)
        for (int64_t i = 0; i < n_q; ++i)
          for (int64_t j = 0; j < n_k; ++j)
            bias.at({h, i, j}) = -o.alibi_slopes[h] * double(i + shift - j);
      const auto got = test::forward_with_weights(q.view(), k.view(), v.view(), o);
      AttentionOptions plain = o;
      plain.alibi_slopes.clear();
      const auto want = test::forward_with_weights(q.view(), k.view(), v.view(), plain,
                                               TensorView<const double>(bias.view()));
      EXPECT_LT(max_abs_diff(got.out, want.out), 1e-15);
      EXPECT_LT(max_abs_diff(got.weights, want.weights), 1e-15);
    }
}

// The extras by their definitions, computed here densely: the logits after
// scale, softcap and mask (with a causal offset, a boolean and a float mask
// and ALiBi, GQA), the log-sum-exp of the masked row (-inf for row 0, which
// the offset leaves no key) and the weights as exp(masked - lse).
TEST(Reference, ExtrasFollowTheirDefinitions) {
  std::mt19937 rng(12);
  const int64_t hq = 4, hkv = 2, n_q = 4, n_k = 6, d = 5;
  const auto q = random_tensor({2, hq, n_q, d}, rng), k = random_tensor({2, hkv, n_k, d}, rng),
             v = random_tensor({2, hkv, n_k, 3}, rng);
  Tensor<double> add = random_tensor({n_q, n_k}, rng, -2, 1);
  Tensor<bool> allow({n_q, n_k});
  for (int64_t e = 0; e < add.numel(); ++e) allow[e] = e % 5 != 3;
  add[7] = -kInf;
  AttentionOptions o;
  o.scale = 0.7;
  o.softcap = 1.5;
  o.causal = Causal::offset(-1);
  o.alibi_slopes = {0.5, -0.25, 0.125, 1.0};
  Tensor<double> scaled({2, hq, n_q, n_k}), capped(scaled.shape()), masked(scaled.shape()),
      lse({2, hq, n_q}), weights(scaled.shape());
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < hq; ++h)
      for (int64_t i = 0; i < n_q; ++i) {
        double sum = 0;
        for (int64_t j = 0; j < n_k; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += q.at({b, h, i, c}) * k.at({b, h / 2, j, c});
          const double s = 0.7 * dot, cap = 1.5 * std::tanh(s / 1.5);
          const bool part = j <= i - 1 && allow.at({i, j});
          const double m = part ? cap + add.at({i, j}) - o.alibi_slopes[h] * double(i - 1 - j) : -kInf;
          scaled.at({b, h, i, j}) = s;
          capped.at({b, h, i, j}) = cap;
          masked.at({b, h, i, j}) = m;
          sum += std::exp(m);
        }
        lse.at({b, h, i}) = std::log(sum);  // log 0 = -inf
        for (int64_t j = 0; j < n_k; ++j)
          weights.at({b, h, i, j}) = sum > 0 ? std::exp(masked.at({b, h, i, j}) - lse.at({b, h, i})) : 0.0;
      }
  const auto expect_equal = [](const Tensor<double>& got, const Tensor<double>& want, const char* what) {
    ASSERT_EQ(got.shape(), want.shape()) << what;
    for (int64_t e = 0; e < want.numel(); ++e) {
      if (std::isinf(want[e])) EXPECT_EQ(got[e], want[e]) << what << " at " << e;
      else EXPECT_NEAR(got[e], want[e], 1e-13) << what << " at " << e;
    }
  };
  // The two masks as one: allow and add (the boolean wins, as documented).
  Tensor<double> both = add;
  for (int64_t e = 0; e < both.numel(); ++e)
    if (!allow[e]) both[e] = -kInf;
  const Mask mask = TensorView<const double>(both.view());
  const std::pair<Logits, const Tensor<double>*> stages[] = {
      {Logits::Scaled, &scaled}, {Logits::Softcapped, &capped}, {Logits::Masked, &masked}};
  for (const auto& [stage, want] : stages) {
    const auto r = test::forward(q.view(), k.view(), v.view(),
                                         {.weights = true, .logits = stage, .lse = true}, o, mask);
    expect_equal(r.logits, *want, "logits");
    expect_equal(r.lse, lse, "lse");
    expect_equal(r.weights, weights, "weights");
    EXPECT_EQ(max_abs_diff(r.out, attention(q.view(), k.view(), v.view(), o, mask)), 0.0);
  }
}

// Sinks by their definition (gpt-oss): one more term e^sink[h] in every
// row's denominator, no value; row 0, which the offset leaves no key, is
// the sink alone: zero output and weights, lse = the sink.
TEST(Reference, SinksJoinTheDenominator) {
  std::mt19937 rng(13);
  const int64_t hq = 2, n_q = 3, n_k = 4, d = 5;
  const auto q = random_tensor({hq, n_q, d}, rng), k = random_tensor({1, n_k, d}, rng),
             v = random_tensor({1, n_k, 2}, rng);
  AttentionOptions o;
  o.causal = Causal::offset(-1);
  o.softcap = 1.5;
  o.sinks = {0.75, -2.0};
  test::Returns returns;
  returns.weights = true;
  returns.lse = true;
  const auto r = test::forward(q.view(), k.view(), v.view(), returns, o);
  for (int64_t h = 0; h < hq; ++h)
    for (int64_t i = 0; i < n_q; ++i) {
      double denominator = std::exp(o.sinks[h]), out[2] = {0, 0};
      std::vector<double> e(n_k, 0.0);
      for (int64_t j = 0; j <= i - 1; ++j) {
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += q.at({h, i, c}) * k.at({0, j, c});
        e[j] = std::exp(1.5 * std::tanh(dot / std::sqrt(double(d)) / 1.5));  // the sink: not softcapped
        denominator += e[j];
        for (int64_t c = 0; c < 2; ++c) out[c] += e[j] * v.at({0, j, c});
      }
      for (int64_t c = 0; c < 2; ++c) EXPECT_NEAR(r.out.at({h, i, c}), out[c] / denominator, 1e-14);
      for (int64_t j = 0; j < n_k; ++j) EXPECT_NEAR(r.weights.at({h, i, j}), e[j] / denominator, 1e-15);
      EXPECT_NEAR(r.lse.at({h, i}), std::log(denominator), 1e-14);
    }
  EXPECT_EQ(r.lse.at({1, 0}), -2.0);
  AttentionOptions wrong;
  wrong.sinks = {1.0};
  EXPECT_THROW_MSG(attention(q.view(), k.view(), v.view(), wrong), ValueError,
                   "sinks must hold one logit per query head (2), got 1");
  wrong.sinks = {1.0, kInf};
  EXPECT_THROW_MSG(attention(q.view(), k.view(), v.view(), wrong), ValueError, "sinks must be finite");
}

// A packed batch (an empty sequence, a decode-sized one, one that crosses
// tiles) equals one attention call per sequence, bitwise, lse included, in
// float32 and float64, with causal masking, sinks and GQA.
template <class T>
void check_varlen() {
  std::mt19937 rng(14);
  const std::vector<int64_t> lens_q = {3, 0, 130, 2}, lens_k = {5, 4, 130, 700};
  const int64_t hq = 4, hkv = 2, d = 16, d_v = 8;
  Tensor<int64_t> cu_q({5}), cu_k({5});
  cu_q[0] = cu_k[0] = 0;
  for (size_t b = 0; b < 4; ++b) cu_q[b + 1] = cu_q[b] + lens_q[b], cu_k[b + 1] = cu_k[b] + lens_k[b];
  const auto q = cast<T>(random_tensor({cu_q[4], hq, d}, rng)), k = cast<T>(random_tensor({cu_k[4], hkv, d}, rng)),
             v = cast<T>(random_tensor({cu_k[4], hkv, d_v}, rng));
  AttentionOptions o;
  o.causal = Causal::BottomRight;
  o.sinks = {0.5, -1.0, 2.0, 0.0};
  const auto r = attention_varlen(q.view(), k.view(), v.view(), cu_q.view(), cu_k.view(), o, true);
  ASSERT_EQ(r.out.shape(), (Shape{cu_q[4], hq, d_v}));
  ASSERT_EQ(r.lse.shape(), (Shape{hq, cu_q[4]}));
  const auto rows = [](const Tensor<T>& t, int64_t begin, int64_t n) {  // (H, n, width)
    return contiguous(TensorView<const T>(t.data() + begin * t.dim(1) * t.dim(2), {t.dim(1), n, t.dim(2)},
                                          {t.dim(2), t.dim(1) * t.dim(2), 1}));
  };
  test::Returns lse;
  lse.lse = true;
  for (size_t b = 0; b < 4; ++b) {
    const auto want = test::forward(rows(q, cu_q[b], lens_q[b]).view(), rows(k, cu_k[b], lens_k[b]).view(),
                                            rows(v, cu_k[b], lens_k[b]).view(), lse, o);
    EXPECT_EQ(max_abs_diff(rows(r.out, cu_q[b], lens_q[b]), want.out), 0.0) << "sequence " << b;
    for (int64_t h = 0; h < hq; ++h)
      for (int64_t i = 0; i < lens_q[b]; ++i)
        EXPECT_EQ(r.lse.at({h, cu_q[b] + i}), want.lse.at({h, i})) << "sequence " << b;
  }
  Tensor<int64_t> bad({3}, {0, 2, 1});
  EXPECT_THROW_MSG(attention_varlen(q.view(), k.view(), v.view(), bad.view(), cu_k.view()), ValueError,
                   "cu_seqlens_q must not decrease, got 2 then 1 at 2");
  AttentionOptions bad_sinks;  // options are checked even with no sequence to run
  bad_sinks.sinks = {1.0};
  const Tensor<int64_t> none({1}, {0});
  const Tensor<T> q0({0, hq, d}), k0({0, hkv, d}), v0({0, hkv, d_v});
  EXPECT_THROW_MSG(attention_varlen(q0.view(), k0.view(), v0.view(), none.view(), none.view(), bad_sinks),
                   ValueError, "sinks must hold one logit per query head (4), got 1");
  Tensor<int64_t> short_k({5}, {0, 5, 9, 139, 838});
  EXPECT_THROW_MSG(attention_varlen(q.view(), k.view(), v.view(), cu_q.view(), short_k.view()), ValueError,
                   "cu_seqlens_k must end at k's length 839, got 838");
}

TEST(Varlen, EqualsOneCallPerSequence) {
  check_varlen<double>();
  check_varlen<float>();
}

TEST(Reference, ScaleMultipliesTheLogits) {
  std::mt19937 rng(7);
  auto q = random_tensor({3, 4}, rng);
  const auto k = random_tensor({5, 4}, rng), v = random_tensor({5, 2}, rng);
  AttentionOptions o;
  o.scale = 0.37;
  const auto a = attention(q.view(), k.view(), v.view(), o);
  for (int64_t i = 0; i < q.numel(); ++i) q[i] *= 0.37;
  o.scale = 1.0;
  EXPECT_LT(rel_error(a, attention(q.view(), k.view(), v.view(), o)), 1e-14);
  // default: 1/sqrt(d) with d = 4
  o.scale = 0.5;
  EXPECT_EQ(max_abs_diff(attention(q.view(), k.view(), v.view(), o),
                         attention(q.view(), k.view(), v.view())), 0.0);
}

TEST(Reference, GroupedQueryAttentionEqualsRepeatedHeads) {
  std::mt19937 rng(8);
  const int64_t hq = 6, hkv = 2;
  const auto q = random_tensor({2, hq, 3, 4}, rng), k = random_tensor({2, hkv, 5, 4}, rng),
             v = random_tensor({2, hkv, 5, 3}, rng);
  Tensor<double> kr({2, hq, 5, 4}), vr({2, hq, 5, 3});
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < hq; ++h)
      for (int64_t j = 0; j < 5; ++j) {
        for (int64_t c = 0; c < 4; ++c) kr.at({b, h, j, c}) = k.at({b, h / (hq / hkv), j, c});
        for (int64_t c = 0; c < 3; ++c) vr.at({b, h, j, c}) = v.at({b, h / (hq / hkv), j, c});
      }
  const auto a = attention(q.view(), k.view(), v.view());
  const auto b = attention(q.view(), kr.view(), vr.view());
  EXPECT_EQ(max_abs_diff(a, b), 0.0);
}

// ---------------------------------------------------------------------------
// The float32 kernel against the double reference.

enum class MaskKind { None, Bool, Float };

struct Case {
  Shape batch;  // leading axes; empty with heads < 0 means rank 2
  int64_t hq, hkv, n_q, n_k, d, d_v;
  Causal causal = Causal::None;
  Window window = {};
  double softcap = 0;
  std::optional<double> scale;
  MaskKind mask = MaskKind::None;
  Shape mask_shape = {};
};

Shape shape_of(const Case& c, int64_t h, int64_t n, int64_t d) {
  Shape s = c.batch;
  if (h >= 0) s.push_back(h);
  s.push_back(n);
  s.push_back(d);
  return s;
}

std::string describe(const Case& c) {
  return "batch " + shape_str(c.batch) + " hq=" + std::to_string(c.hq) +
         " hkv=" + std::to_string(c.hkv) + " n_q=" + std::to_string(c.n_q) +
         " n_k=" + std::to_string(c.n_k) + " d=" + std::to_string(c.d) +
         " d_v=" + std::to_string(c.d_v) + " causal=" + causal_name(c.causal) +
         " window=(" + std::to_string(c.window.left) + "," + std::to_string(c.window.right) +
         ") softcap=" + std::to_string(c.softcap) + " mask=" + std::to_string(int(c.mask)) +
         shape_str(c.mask_shape);
}

void check_against_reference(const Case& c, std::mt19937& rng) {
  SCOPED_TRACE(describe(c));
  const auto q = random_tensor(shape_of(c, c.hq, c.n_q, c.d), rng);
  const auto k = random_tensor(shape_of(c, c.hkv, c.n_k, c.d), rng);
  const auto v = random_tensor(shape_of(c, c.hkv, c.n_k, c.d_v), rng);
  AttentionOptions o;
  o.causal = c.causal;
  o.window = c.window;
  o.softcap = c.softcap;
  o.scale = c.scale;
  Tensor<bool> mb;
  Tensor<float> mf;
  Tensor<double> md;
  Mask m32, m64;
  if (c.mask == MaskKind::Bool) {
    mb = Tensor<bool>(c.mask_shape);
    for (int64_t i = 0; i < mb.numel(); ++i) mb[i] = rng() % 4 != 0;
    m32 = m64 = TensorView<const bool>(mb.view());
  } else if (c.mask == MaskKind::Float) {
    md = random_tensor(c.mask_shape, rng, -3, 1);
    for (int64_t i = 0; i < md.numel(); i += 5) md[i] = -kInf;
    mf = cast<float>(md);
    m32 = TensorView<const float>(mf.view());
    m64 = TensorView<const double>(md.view());
  }
  const auto ref = test::forward_with_weights(q.view(), k.view(), v.view(), o, m64);
  const auto fast = test::forward_with_weights(cast<float>(q).view(), cast<float>(k).view(),
                                           cast<float>(v).view(), o, m32);
  // float32 logits carry ~d·2^-24 relative error; outputs are convex
  // combinations, so 1e-5 relative (Frobenius) is ample and still catches
  // any wrong key, mask or scale.
  EXPECT_LT(rel_error(fast.out, ref.out), 1e-5);
  EXPECT_LT(rel_error(fast.weights, ref.weights), 1e-5);
  EXPECT_LT(max_abs_diff(fast.weights, ref.weights), 1e-5);
}

TEST(Attention, Float32KernelMatchesReferenceOnShapes) {
  std::mt19937 rng(10);
  const std::vector<Case> cases = {
      {{}, -1, -1, 1, 1, 1, 1},          // rank 2, single everything
      {{}, -1, -1, 5, 5, 8, 8},          // the article's size
      {{}, -1, -1, 3, 11, 7, 5},         // n_q != n_k, odd d
      {{}, -1, -1, 13, 2, 1, 3},         // d = 1
      {{}, 4, 4, 9, 9, 16, 16},          // heads
      {{2}, 3, 3, 4, 17, 33, 9},         // batch, d not a multiple of a vector
      {{2, 3}, 2, 2, 6, 5, 64, 64},      // two batch axes
      {{2}, 8, 2, 7, 19, 32, 16},        // GQA
      {{}, 6, 1, 5, 40, 24, 24},         // MQA
      {{1}, 2, 2, 1, 300, 128, 128},     // one query, many keys
  };
  for (const auto& c : cases) check_against_reference(c, rng);
}

TEST(Attention, Float32KernelMatchesReferenceOnOptions) {
  std::mt19937 rng(11);
  for (Causal causal : {Causal::None, Causal::BottomRight, Causal::TopLeft})
    for (Window w : {Window{}, Window{2, 0}, Window{3, 1}, Window{-1, 2}, Window{0, 0}})
      for (auto [n_q, n_k] : {std::pair<int64_t, int64_t>{6, 6}, {4, 9}, {9, 4}})
        for (double cap : {0.0, 0.75}) {
          Case c{{2}, 2, 1, n_q, n_k, 12, 10, causal, w, cap};
          check_against_reference(c, rng);
        }
}

TEST(Attention, Float32KernelMatchesReferenceOnMasks) {
  std::mt19937 rng(12);
  const std::vector<Shape> mask_shapes = {
      {7}, {5, 7}, {1, 7}, {5, 1}, {3, 5, 7}, {3, 1, 7}, {2, 1, 5, 7}, {2, 3, 5, 7}, {}};
  for (MaskKind kind : {MaskKind::Bool, MaskKind::Float})
    for (const Shape& ms : mask_shapes) {
      Case c{{2}, 3, 3, 5, 7, 8, 4};
      c.mask = kind;
      c.mask_shape = ms;
      check_against_reference(c, rng);
      c.causal = Causal::BottomRight;
      c.scale = 0.3;
      check_against_reference(c, rng);
    }
}

TEST(Attention, RowsWithNoAllowedKeyAreZero) {
  std::mt19937 rng(13);
  const auto q = random_tensor({5, 4}, rng), k = random_tensor({3, 4}, rng),
             v = random_tensor({3, 2}, rng);
  // top-left causal with n_q > n_k: fine; bottom-right: queries 0 and 1 see nothing.
  AttentionOptions o;
  o.causal = Causal::BottomRight;
  Tensor<bool> none({5, 3});  // all false: no key allowed anywhere
  for (bool use_mask : {false, true}) {
    const Mask m = use_mask ? Mask(TensorView<const bool>(none.view())) : Mask();
    const auto r64 = test::forward_with_weights(q.view(), k.view(), v.view(), o, m);
    const auto r32 = test::forward_with_weights(cast<float>(q).view(), cast<float>(k).view(),
                                            cast<float>(v).view(), o, m);
    const int64_t empty_rows = use_mask ? 5 : 2;
    for (int64_t i = 0; i < empty_rows; ++i) {
      for (int64_t c = 0; c < 2; ++c) {
        EXPECT_EQ(r64.out[i * 2 + c], 0.0);
        EXPECT_EQ(r32.out[i * 2 + c], 0.0f);
      }
      for (int64_t j = 0; j < 3; ++j) {
        EXPECT_EQ(r64.weights[i * 3 + j], 0.0);
        EXPECT_EQ(r32.weights[i * 3 + j], 0.0f);
      }
    }
  }
  // n_k = 0: every row is empty
  const Tensor<float> k0({0, 4}), v0({0, 2});
  const auto out = attention(cast<float>(q).view(), k0.view(), v0.view());
  EXPECT_EQ(out.shape(), (Shape{5, 2}));
  for (int64_t i = 0; i < out.numel(); ++i) EXPECT_EQ(out[i], 0.0f);
}

TEST(Attention, StridedViewsEqualContiguousCopies) {
  std::mt19937 rng(14);
  // (heads, n, d) stored as (n, heads, d): the layout multi_head() passes.
  const auto q = cast<float>(random_tensor({6, 3, 8}, rng));
  const auto k = cast<float>(random_tensor({6, 3, 8}, rng));
  const auto v = cast<float>(random_tensor({6, 3, 8}, rng));
  const auto qt = q.view().transpose(0, 1), kt = k.view().transpose(0, 1),
             vt = v.view().transpose(0, 1);
  const auto a = attention(qt, kt, vt);
  const auto b = attention(contiguous(qt).view(), contiguous(kt).view(), contiguous(vt).view());
  EXPECT_EQ(max_abs_diff(a, b), 0.0);
  // last axis strided: columns read backwards through a negative stride
  const TensorView<const float> qrev(q.data() + 7, {18, 8}, {8, -1});
  const TensorView<const float> krev(k.data() + 7, {18, 8}, {8, -1});
  const TensorView<const float> vflat(v.data(), {18, 8});
  Tensor<float> out_t({8, 18});
  AttentionPlan(qrev, krev, vflat).run(out_t.view().transpose(0, 1));
  const auto expect = attention(contiguous(qrev).view(), contiguous(krev).view(), vflat);
  EXPECT_EQ(max_abs_diff(contiguous(out_t.view().transpose(0, 1)), expect), 0.0);
}

// ---------------------------------------------------------------------------
// Errors name the argument and the shapes.

TEST(Attention, ErrorsNameTheArgumentAndShapes) {
  Tensor<float> q({2, 4, 5, 8}), k({2, 4, 6, 8}), v({2, 4, 6, 3}), out({2, 4, 5, 3});
  Tensor<float> k7({2, 4, 6, 7}), v5({2, 4, 5, 3}), k3h({2, 3, 6, 8}), v3h({2, 3, 6, 3});
  Tensor<float> kb({3, 4, 6, 8}), r3({4, 6, 8}), q1({8});
  EXPECT_THROW_MSG(attention(q.view(), k7.view(), v.view()), ValueError,
                   "same head dimension (last axis), got q (2, 4, 5, 8), k (2, 4, 6, 7)");
  EXPECT_THROW_MSG(attention(q.view(), k.view(), v5.view()), ValueError,
                   "same number of keys");
  EXPECT_THROW_MSG(attention(q.view(), k3h.view(), v3h.view()), ValueError,
                   "query heads (4) must be a multiple of key/value heads (3)");
  EXPECT_THROW_MSG(attention(q.view(), k.view(), v3h.view()), ValueError,
                   "k and v must have the same number of heads");
  EXPECT_THROW_MSG(attention(q.view(), kb.view(), v.view()), ValueError, "batch axes must match");
  EXPECT_THROW_MSG(attention(q.view(), r3.view(), v.view()), ValueError, "same rank");
  EXPECT_THROW_MSG(attention(q1.view(), q1.view(), q1.view()), ValueError, "rank >= 2");
  Tensor<float> bad_out({2, 4, 5, 4});
  EXPECT_THROW_MSG(AttentionPlan(q.view(), k.view(), v.view()).run(bad_out.view()), ValueError,
                   "out has shape (2, 4, 5, 4), expected (2, 4, 5, 3)");
  Tensor<float> bad_w({2, 4, 5, 5});
  EXPECT_THROW_MSG(AttentionPlan(q.view(), k.view(), v.view()).run(out.view(), {.weights = bad_w.view()}),
                   ValueError, "weights has shape (2, 4, 5, 5), expected (2, 4, 5, 6)");
  AttentionExtras<float> logits, lse;
  logits.logits = bad_w.view();
  EXPECT_THROW_MSG(AttentionPlan(q.view(), k.view(), v.view()).run(out.view(), logits), ValueError,
                   "logits has shape (2, 4, 5, 5), expected (2, 4, 5, 6)");
  Tensor<float> bad_lse({2, 4, 6});
  lse.lse = bad_lse.view();
  EXPECT_THROW_MSG(AttentionPlan(q.view(), k.view(), v.view()).run(out.view(), lse), ValueError,
                   "lse has shape (2, 4, 6), expected (2, 4, 5)");
  EXPECT_THROW_MSG(parse_logits("softmax"), ValueError, "'scaled', 'softcapped' or 'masked', got 'softmax'");
  // out is never optional: an empty view is the wrong shape (it was read as (rank 0) rows)
  EXPECT_THROW_MSG(AttentionPlan(q.view(), k.view(), v.view()).run(TensorView<float>(), lse), ValueError,
                   "out has shape (), expected (2, 4, 5, 3)");
}

TEST(Attention, MasksMustBroadcastNeverPad) {
  Tensor<float> q({4, 5, 8}), k({4, 6, 8}), v({4, 6, 3});
  Tensor<bool> short_mask({5, 5});  // one key short
  EXPECT_THROW_MSG(attention(q.view(), k.view(), v.view(), {}, TensorView<const bool>(short_mask.view())),
                   ValueError, "mask of shape (5, 5) does not broadcast to (4, 5, 6)");
  Tensor<double> too_many({2, 4, 5, 6});
  EXPECT_THROW_MSG(attention(q.view(), k.view(), v.view(), {}, TensorView<const double>(too_many.view())),
                   ValueError, "does not broadcast");
}

TEST(Attention, InvalidOptionsAreRefused) {
  Tensor<float> q({5, 8});
  AttentionOptions o;
  o.softcap = -1;
  EXPECT_THROW_MSG(attention(q.view(), q.view(), q.view(), o), ValueError, "softcap");
  o = {};
  o.softcap = std::nan("");
  EXPECT_THROW_MSG(attention(q.view(), q.view(), q.view(), o), ValueError, "softcap");
  o = {};
  o.window = {-2, 0};
  EXPECT_THROW_MSG(attention(q.view(), q.view(), q.view(), o), ValueError, "window");
  o = {};
  o.scale = kInf;
  EXPECT_THROW_MSG(attention(q.view(), q.view(), q.view(), o), ValueError, "scale");
  o = {};
  o.causal = Causal::offset(-(int64_t{1} << 62) - 1);
  EXPECT_THROW_MSG(attention(q.view(), q.view(), q.view(), o), ValueError,
                   "a causal offset must be within ±2^62, got -4611686018427387905");
  o.causal = Causal::offset(std::numeric_limits<int64_t>::min());  // (whose abs overflows)
  EXPECT_THROW_MSG(attention(q.view(), q.view(), q.view(), o), ValueError, "a causal offset must be within");
  o.causal = Causal::offset(int64_t{1} << 62);  // the bound itself: every key, no overflow
  EXPECT_EQ(max_abs_diff(attention(q.view(), q.view(), q.view(), o), attention(q.view(), q.view(), q.view())),
            0.0);
}

TEST(Attention, AlibiSlopesAreChecked) {
  const Tensor<float> q({2, 3, 4});
  AttentionOptions o;
  o.alibi_slopes = {0.5, 0.25, 0.125};
  EXPECT_THROW_MSG(attention(q.view(), q.view(), q.view(), o), ValueError,
                   "alibi_slopes must hold one slope per query head (2), got 3");
  o.alibi_slopes = {0.5, std::numeric_limits<double>::quiet_NaN()};
  EXPECT_THROW_MSG(attention(q.view(), q.view(), q.view(), o), ValueError, "alibi_slopes must be finite");
  // BLOOM's slopes: 2^(-8(h + 1) / H) for H a power of two
  const auto slopes = alibi_slopes(16);
  for (int64_t h = 0; h < 16; ++h) EXPECT_DOUBLE_EQ(slopes[h], std::exp2(-0.5 * double(h + 1)));
  EXPECT_THROW_MSG(alibi_slopes(0), ValueError, "num_heads must be in [1, 16777216], got 0");
  EXPECT_THROW_MSG(alibi_slopes(4, -1.0), ValueError, "max_bias must be a finite number > 0");
}

TEST(Attention, HugeWindowsDoNotOverflow) {
  std::mt19937 rng(15);
  const auto q = random_tensor({4, 3}, rng), k = random_tensor({6, 3}, rng),
             v = random_tensor({6, 2}, rng);
  AttentionOptions o;
  o.window = {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max()};
  const auto a = attention(cast<float>(q).view(), cast<float>(k).view(), cast<float>(v).view(), o);
  const auto b = attention(q.view(), k.view(), v.view());
  EXPECT_LT(rel_error(a, b), 1e-5);
  // The reference too (found by fuzz_attention: pos + right overflowed).
  EXPECT_LT(rel_error(attention(q.view(), k.view(), v.view(), o), b), 1e-15);
}

// A plan validates once and runs many times: its shapes are attention()'s,
// each run (from several threads too) bitwise what attention() gives, with
// strided inputs copied once; errors come from the constructor, naming the
// argument, and from run() only for an out or weights of the wrong shape.
TEST(AttentionPlan, ValidatesOnceAndRunsLikeAttention) {
  std::mt19937 rng(21);
  const auto q = cast<float>(random_tensor({2, 4, 70, 16}, rng));
  const auto k = cast<float>(random_tensor({2, 2, 90, 16}, rng));
  const auto vt = cast<float>(random_tensor({2, 2, 12, 90}, rng));
  const TensorView<const float> v = vt.view().transpose(-1, -2);  // strided: copied once
  AttentionOptions o;
  o.causal = Causal::BottomRight;
  o.softcap = 3;
  const AttentionPlan<float> plan(q.view(), k.view(), v, o);
  EXPECT_EQ(plan.output_shape(), (Shape{2, 4, 70, 12}));
  EXPECT_EQ(plan.weights_shape(), (Shape{2, 4, 70, 90}));
  const auto expected = test::forward_with_weights(q.view(), k.view(), v, o);
  std::vector<Tensor<float>> outs(4, Tensor<float>(plan.output_shape()));
  std::vector<Tensor<float>> weights(4, Tensor<float>(plan.weights_shape()));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] { plan.run(outs[t].view(), {.weights = weights[t].view()}); });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) {
    EXPECT_EQ(max_abs_diff(outs[t], expected.out), 0.0) << "thread " << t;
    EXPECT_EQ(max_abs_diff(weights[t], expected.weights), 0.0) << "thread " << t;
  }
  EXPECT_LT(rel_error(outs[0], attention(cast<double>(q).view(), cast<double>(k).view(),
                                         cast<double>(contiguous(v)).view(), o)),
            1e-5);
  Tensor<float> wrong({2, 4, 70, 11});
  EXPECT_THROW_MSG(plan.run(wrong.view()), ValueError,
                   "attention: out has shape (2, 4, 70, 11), expected (2, 4, 70, 12)");
  EXPECT_THROW_MSG(plan.run(outs[0].view(), {.weights = wrong.view()}), ValueError,
                   "attention: weights has shape (2, 4, 70, 11), expected (2, 4, 70, 90)");
  EXPECT_THROW_MSG(AttentionPlan<float>(q.view(), k.view(), k.view(), {}, Mask(TensorView<const bool>(nullptr, {3}))),
                   ValueError, "attention: mask");
  o.softcap = -1;
  EXPECT_THROW_MSG(AttentionPlan<float>(q.view(), k.view(), v, o), ValueError, "softcap must be");
}

}  // namespace
}  // namespace attn

namespace attn {
namespace {

// An output that overlaps an input, itself or another output was accepted:
// out aliasing v returned wrong numbers, a zero row stride raced its own
// rows. Each is refused, naming both; views that interleave in one buffer
// share no element and run as separate buffers do.
TEST(Attention, OutputsThatOverlapAnInputThemselvesOrEachOtherAreRefused) {
  std::mt19937 rng(46);
  const Tensor<float> q = test::cast<float>(test::random_tensor({2, 5, 8}, rng));
  Tensor<float> v = test::cast<float>(test::random_tensor({2, 5, 8}, rng));
  const TensorView<float> vv = v.view();
  const std::string own = "an output needs memory of its own for every element";
  EXPECT_THROW_MSG(AttentionPlan<float>(q.view(), q.view(), vv).run(vv), ValueError,
                   "attention: out and v share memory (shape (2, 5, 8), strides (40, 8, 1) and shape (2, 5, 8), "
                   "strides (40, 8, 1)): an output must not overlap an input; pass a buffer of its own");
  Tensor<float> big({2, 5, 16});
  EXPECT_THROW_MSG(AttentionPlan<float>(q.view(), q.view(), vv).run(TensorView<float>(big.data(), {2, 5, 8}, {80, 0, 1})),
                   ValueError, "attention: out (shape (2, 5, 8), strides (80, 0, 1)) has elements that share memory: " + own);
  Tensor<float> out({2, 5, 8}), weights({2, 5, 5});
  AttentionExtras<float> extras;
  extras.weights = TensorView<float>(out.data() + 3, {2, 5, 5});
  EXPECT_THROW_MSG(AttentionPlan<float>(q.view(), q.view(), vv).run(out.view(), extras), ValueError,
                   "attention: weights and out share memory");
  extras.weights = weights.view();
  extras.lse = TensorView<float>(const_cast<float*>(q.data()), {2, 5});
  EXPECT_THROW_MSG(AttentionPlan<float>(q.view(), q.view(), vv).run(out.view(), extras), ValueError,
                   "attention: lse and q share memory");
  Tensor<bool> bytes({200});  // a boolean mask's bytes, and the weights' floats over them
  const TensorView<const bool> mask(bytes.data(), {5, 5});
  EXPECT_THROW_MSG(AttentionPlan<float>(q.view(), q.view(), vv, {}, Mask(mask))
                       .run(out.view(), {.weights = TensorView<float>(reinterpret_cast<float*>(bytes.data()), {2, 5, 5})}),
                   ValueError, "attention: weights and mask share memory");
  // The plan checks each run's outputs against the inputs it was made with.
  const AttentionPlan<float> plan(q.view(), q.view(), vv);
  EXPECT_THROW_MSG(plan.run(TensorView<float>(const_cast<float*>(q.data()), {2, 5, 8})), ValueError,
                   "attention: out and q share memory");
  // v in a buffer's even columns, out in its odd ones: no element shared.
  Tensor<float> both({2, 5, 16});
  const TensorView<float> v_even(both.data(), {2, 5, 8}, {80, 16, 2}), out_odd(both.data() + 1, {2, 5, 8}, {80, 16, 2});
  copy<float>(v.view(), v_even);
  AttentionPlan<float>(q.view(), q.view(), v_even).run(out_odd);
  const Tensor<float> separate = attention<float>(q.view(), q.view(), v.view());
  EXPECT_EQ(test::max_abs_diff(contiguous(TensorView<const float>(out_odd)), separate), 0.0);
}

TEST(Attention, EveryFunctionWithAnOutputRefusesOverlap) {
  std::mt19937 rng(47);
  Tensor<double> x = test::random_tensor({2, 6, 8}, rng);
  Tensor<double> out({2, 6, 8});
  const TensorView<double> xv = x.view();
  const TensorView<double> shifted(x.data() + 8, {2, 5, 8});  // x's rows, one row on
  // In place, as documented: rope and softmax on x itself.
  const Tensor<double> rotated = apply_rope<double>(x.view());
  const Tensor<double> soft = softmax<double>(x.view());
  Tensor<double> y = x;
  apply_rope<double>(y.view(), y.view());
  EXPECT_EQ(test::max_abs_diff(y, rotated), 0.0);
  y = x;
  softmax<double>(y.view(), y.view());
  EXPECT_EQ(test::max_abs_diff(y, soft), 0.0);
  // Partly over their input: refused.
  EXPECT_THROW_MSG(apply_rope<double>(TensorView<const double>(x.data(), {2, 5, 8}), shifted), ValueError,
                   "rope: out and x share memory");
  EXPECT_THROW_MSG(rope_backward<double>(TensorView<const double>(x.data(), {2, 5, 8}), shifted), ValueError,
                   "rope: out and x share memory");
  EXPECT_THROW_MSG(softmax<double>(TensorView<const double>(x.data(), {2, 5, 8}), shifted), ValueError,
                   "softmax: out and a share memory");
  EXPECT_THROW_MSG(multi_head<double>(xv, xv, 2), ValueError, "multi_head: out and x share memory");
  EXPECT_THROW_MSG(sinusoidal_encoding<double>(TensorView<double>(out.data(), {6, 8}, {1, 1})), ValueError,
                   "positional_encoding: out (shape (6, 8), strides (1, 1)) has elements that share memory");
  Tensor<double> dk({2, 6, 8}), dv({2, 6, 8});
  EXPECT_THROW_MSG(attention_backward<double>(xv, xv, xv, xv, xv, dk.view(), dv.view()), ValueError,
                   "attention_backward: dq and q share memory");
  EXPECT_THROW_MSG(attention_backward<double>(xv, xv, xv, out.view(), dk.view(), dk.view(), dv.view()), ValueError,
                   "attention_backward: dk and dq share memory");
  const Tensor<double> packed = test::random_tensor({6, 2, 8}, rng);
  const Tensor<int64_t> cu({2}, {0, 6});
  Tensor<double> vout({6, 2, 8});
  EXPECT_THROW_MSG(attention_varlen<double>(packed.view(), packed.view(), vout.view(), cu.view(), cu.view(), vout.view()),
                   ValueError, "attention_varlen: out and v share memory");
}

}  // namespace
}  // namespace attn
