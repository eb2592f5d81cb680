// Backward passes against central finite differences in float64: attention
// with every option, RoPE, and the MultiHeadAttention layer.
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <limits>

#include "gradcheck.hpp"
#include "helpers.hpp"

namespace attn {
namespace {

using test::dot;
using test::numeric_gradient;
using test::random_tensor;
using test::rel_error;

constexpr double kTol = 1e-6;

struct AttentionCase {
  const char* name;
  Shape q, k, v;
  AttentionOptions options;
  Shape mask_shape;      // empty: no mask
  bool bool_mask = false;
};
void PrintTo(const AttentionCase& c, std::ostream* os) { *os << c.name; }

class AttentionBackward : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(AttentionBackward, MatchesFiniteDifferences) {
  const auto& c = GetParam();
  std::mt19937 rng(7);
  auto q = random_tensor(c.q, rng), k = random_tensor(c.k, rng), v = random_tensor(c.v, rng);
  const Shape out_shape = attention_output_shape(c.q, c.k, c.v);
  const auto dout = random_tensor(out_shape, rng);
  // Masks: boolean (~30% forbidden) or additive with some -inf.
  Tensor<bool> mb;
  Tensor<double> mf;
  Mask mask;
  if (!c.mask_shape.empty()) {
    std::uniform_real_distribution<double> u(0, 1);
    if (c.bool_mask) {
      mb = Tensor<bool>(c.mask_shape);
      for (int64_t i = 0; i < mb.numel(); ++i) mb[i] = u(rng) < 0.7;
      mask = TensorView<const bool>(mb.view());
    } else {
      mf = random_tensor(c.mask_shape, rng);
      for (int64_t i = 0; i < mf.numel(); ++i)
        if (u(rng) < 0.2) mf[i] = -std::numeric_limits<double>::infinity();
      mask = TensorView<const double>(mf.view());
    }
  }
  // The sinks as a tensor, so that the loss can be differentiated by them too.
  Tensor<double> sinks({static_cast<int64_t>(c.options.sinks.size())});
  for (int64_t h = 0; h < sinks.numel(); ++h) sinks[h] = c.options.sinks[h];
  const auto loss = [&] {
    AttentionOptions o = c.options;
    for (int64_t h = 0; h < sinks.numel(); ++h) o.sinks[h] = sinks[h];
    return dot(attention(q.view(), k.view(), v.view(), o, mask), dout);
  };
  const auto g = attention_backward(q.view(), k.view(), v.view(), dout.view(), c.options, mask);
  EXPECT_LE(rel_error(g.dq, numeric_gradient(q, loss)), kTol);
  EXPECT_LE(rel_error(g.dk, numeric_gradient(k, loss)), kTol);
  EXPECT_LE(rel_error(g.dv, numeric_gradient(v, loss)), kTol);
  if (!c.options.sinks.empty()) {
    EXPECT_LE(rel_error(g.dsinks, numeric_gradient(sinks, loss)), kTol);
  } else {
    EXPECT_EQ(g.dsinks.data(), nullptr);  // no sinks: none
  }

  // float32 goes through the same double computation, rounded.
  const auto f = [](const Tensor<double>& t) { return test::cast<float>(t); };
  const auto q32 = f(q), k32 = f(k), v32 = f(v), dout32 = f(dout);
  const auto g32 = attention_backward(q32.view(), k32.view(), v32.view(), dout32.view(),
                                      c.options, mask);
  EXPECT_LE(rel_error(g32.dq, g.dq), 1e-5);
  EXPECT_LE(rel_error(g32.dk, g.dk), 1e-5);
  EXPECT_LE(rel_error(g32.dv, g.dv), 1e-5);
  if (!c.options.sinks.empty()) {
    EXPECT_LE(rel_error(g32.dsinks, g.dsinks), 1e-5);
  }
}

AttentionOptions with_causal(Causal c, Window w = {}) {
  AttentionOptions o;
  o.causal = c;
  o.window = w;
  return o;
}
AttentionOptions with_scale_softcap(std::optional<double> scale, double softcap) {
  AttentionOptions o;
  o.scale = scale;
  o.softcap = softcap;
  return o;
}

INSTANTIATE_TEST_SUITE_P(
    Options, AttentionBackward,
    ::testing::Values(
        AttentionCase{"one_head", {5, 4}, {6, 4}, {6, 3}},
        AttentionCase{"batch_and_heads", {2, 3, 4, 5}, {2, 3, 6, 5}, {2, 3, 6, 2}},
        AttentionCase{"gqa", {2, 4, 3, 4}, {2, 2, 5, 4}, {2, 2, 5, 3}},
        AttentionCase{"mqa", {3, 4, 4}, {1, 4, 4}, {1, 4, 2}},
        AttentionCase{"causal_bottom_right", {2, 4, 6}, {2, 7, 6}, {2, 7, 3},
                      with_causal(Causal::BottomRight)},
        AttentionCase{"causal_top_left", {2, 4, 6}, {2, 7, 6}, {2, 7, 3},
                      with_causal(Causal::TopLeft)},
        // n_q > n_k bottom-right: the first rows have no allowed key (zero gradients).
        AttentionCase{"causal_empty_rows", {2, 6, 3}, {2, 3, 3}, {2, 3, 2},
                      with_causal(Causal::BottomRight)},
        AttentionCase{"window", {2, 5, 4}, {2, 8, 4}, {2, 8, 3}, with_causal(Causal::None, {2, 1})},
        AttentionCase{"window_causal", {2, 6, 4}, {2, 6, 4}, {2, 6, 3},
                      with_causal(Causal::TopLeft, {1, -1})},
        AttentionCase{"scale", {2, 4, 5}, {2, 5, 5}, {2, 5, 5}, with_scale_softcap(0.7, 0)},
        AttentionCase{"softcap", {2, 4, 5}, {2, 5, 5}, {2, 5, 5}, with_scale_softcap(2.0, 1.5)},
        AttentionCase{"softcap_default_scale", {3, 4, 8}, {3, 6, 8}, {3, 6, 4},
                      with_scale_softcap(std::nullopt, 0.5)},
        AttentionCase{"bool_mask_full", {2, 3, 4, 4}, {2, 3, 5, 4}, {2, 3, 5, 2}, {}, {2, 3, 4, 5}, true},
        AttentionCase{"bool_mask_broadcast", {2, 3, 4, 4}, {2, 3, 5, 4}, {2, 3, 5, 2}, {}, {1, 4, 5}, true},
        AttentionCase{"additive_mask_row", {2, 3, 4, 4}, {2, 1, 5, 4}, {2, 1, 5, 2}, {}, {5}},
        AttentionCase{"additive_mask_column", {2, 4, 4}, {2, 5, 4}, {2, 5, 2}, {}, {4, 1}},
        AttentionCase{"everything", {2, 4, 5, 4}, {2, 2, 7, 4}, {2, 2, 7, 3},
                      [] {
                        AttentionOptions o = with_causal(Causal::BottomRight, {3, -1});
                        o.softcap = 2;
                        o.scale = 0.8;
                        return o;
                      }(),
                      {2, 1, 5, 7}},
        // Sinks (and their own gradient), with GQA and rows that a causal
        // offset leaves without a key (only the sink: no gradient to q).
        AttentionCase{"sinks", {2, 4, 5, 4}, {2, 2, 6, 4}, {2, 2, 6, 3},
                      [] {
                        AttentionOptions o = with_causal(Causal::offset(-1));
                        o.sinks = {0.5, -1.0, 2.0, 0.0};
                        return o;
                      }()},
        AttentionCase{"sinks_everything", {2, 3, 5, 4}, {2, 3, 7, 4}, {2, 3, 7, 3},
                      [] {
                        AttentionOptions o = with_causal(Causal::TopLeft, {4, -1});
                        o.softcap = 2;
                        o.alibi_slopes = {0.5, 0.25, -0.125};
                        o.sinks = {1.0, -0.5, 3.0};
                        return o;
                      }(),
                      {2, 1, 5, 7}}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(AttentionBackward, RowsWithNoAllowedKeyGetZeroGradients) {
  std::mt19937 rng(8);
  const auto q = random_tensor({3, 4}, rng), k = random_tensor({5, 4}, rng),
             v = random_tensor({5, 2}, rng), dout = random_tensor({3, 2}, rng);
  Tensor<bool> mask({3, 5});
  for (int64_t i = 0; i < mask.numel(); ++i) mask[i] = i / 5 != 1;  // row 1: nothing allowed
  const auto g = attention_backward(q.view(), k.view(), v.view(), dout.view(), {},
                                    TensorView<const bool>(mask.view()));
  for (int64_t c = 0; c < 4; ++c) EXPECT_EQ(g.dq.at({1, c}), 0.0);
  // and n_k = 0: every gradient is zero, no NaN
  const Tensor<double> k0({0, 4}), v0({0, 2});
  const auto g0 = attention_backward(q.view(), k0.view(), v0.view(), dout.view());
  for (int64_t i = 0; i < g0.dq.numel(); ++i) EXPECT_EQ(g0.dq[i], 0.0);
}

TEST(AttentionBackward, StridedViewsAreReadAndWrittenInPlace) {
  std::mt19937 rng(9);
  // q, k, v as (n, H, d) buffers seen as (H, n, d), as the layer passes them.
  const auto qb = random_tensor({4, 2, 3}, rng), kb = random_tensor({5, 2, 3}, rng),
             vb = random_tensor({5, 2, 3}, rng), dout = random_tensor({2, 4, 3}, rng);
  const auto t = [](const Tensor<double>& b) { return TensorView<const double>(b.view()).transpose(0, 1); };
  Tensor<double> dqb({4, 2, 3}), dkb({5, 2, 3}), dvb({5, 2, 3});
  attention_backward(t(qb), t(kb), t(vb), dout.view(), dqb.view().transpose(0, 1),
                     dkb.view().transpose(0, 1), dvb.view().transpose(0, 1));
  const auto g = attention_backward(contiguous(t(qb)).view(), contiguous(t(kb)).view(),
                                    contiguous(t(vb)).view(), dout.view());
  EXPECT_LE(rel_error(contiguous(TensorView<const double>(dqb.view()).transpose(0, 1)), g.dq), 1e-15);
  EXPECT_LE(rel_error(contiguous(TensorView<const double>(dvb.view()).transpose(0, 1)), g.dv), 1e-15);
}

TEST(AttentionBackward, ErrorsNameTheArgument) {
  const Tensor<double> q({2, 3, 4}), k({2, 5, 4}), v({2, 5, 6}), dout({2, 3, 5});
  EXPECT_THROW_MSG(attention_backward(q.view(), k.view(), v.view(), dout.view()), ValueError,
                   "dout has shape (2, 3, 5), expected the output's shape (2, 3, 6)");
  const Tensor<double> good({2, 3, 6});
  Tensor<double> dq({2, 3, 4}), dk({2, 5, 3}), dv({2, 5, 6});
  EXPECT_THROW_MSG(attention_backward(q.view(), k.view(), v.view(), good.view(), dq.view(),
                                      dk.view(), dv.view()),
                   ValueError, "dk has shape (2, 5, 3), expected k's shape (2, 5, 4)");
}

// ---------------------------------------------------------------------------

// A saved forward of a problem with more keys (a key block of ring
// attention, attn::dist): given the whole problem's out and lse, each block's
// backward gives that block's share: its rows of dk and dv, and a part of dq
// (the parts summing to dq). The sink, counted once in the saved lse, is
// left out of the blocks. float64 runs the reference, float32 the kernel.
template <class T>
void expect_block_gradients(double tolerance) {
  std::mt19937 rng(11);
  const int64_t n_k = 9, split = 4;
  const auto q = test::cast<T>(random_tensor({2, 5, 4}, rng, -2, 2));
  const auto k = test::cast<T>(random_tensor({2, n_k, 4}, rng, -2, 2));
  const auto v = test::cast<T>(random_tensor({2, n_k, 3}, rng));
  const auto dout = test::cast<T>(random_tensor({2, 5, 3}, rng));
  AttentionOptions options{.softcap = 3.0, .sinks = {0.5, -1.0}};
  const auto whole = test::forward<T, T>(q.view(), k.view(), v.view(), {.lse = true}, options);
  const auto g = attention_backward<T, T>(q.view(), k.view(), v.view(), dout.view(), options);
  options.sinks.clear();
  auto keys = [](const Tensor<T>& t, int64_t begin, int64_t end) {
    Shape shape = t.shape();
    shape[1] = end - begin;
    return contiguous(TensorView<const T>(t.data() + begin * t.dim(2), shape, {t.dim(1) * t.dim(2), t.dim(2), 1}));
  };
  const auto g1 = attention_backward<T, T>(q.view(), keys(k, 0, split).view(), keys(v, 0, split).view(), dout.view(),
                                           options, {}, {whole.out.view(), whole.lse.view()});
  const auto g2 = attention_backward<T, T>(q.view(), keys(k, split, n_k).view(), keys(v, split, n_k).view(),
                                           dout.view(), options, {}, {whole.out.view(), whole.lse.view()});
  Tensor<T> dq(g.dq.shape());
  for (int64_t i = 0; i < dq.numel(); ++i) dq[i] = g1.dq[i] + g2.dq[i];
  EXPECT_LT(rel_error(dq, g.dq), tolerance);
  EXPECT_LT(rel_error(g1.dk, keys(g.dk, 0, split)), tolerance);
  EXPECT_LT(rel_error(g2.dk, keys(g.dk, split, n_k)), tolerance);
  EXPECT_LT(rel_error(g1.dv, keys(g.dv, 0, split)), tolerance);
  EXPECT_LT(rel_error(g2.dv, keys(g.dv, split, n_k)), tolerance);
}

TEST(AttentionBackward, SavedForwardOfMoreKeysGivesABlocksShare) {
  expect_block_gradients<double>(1e-12);
  expect_block_gradients<float>(1e-5);
}

// Logits that reach +∞ (an additive mask of +∞): the weights are the
// softmax's limit, those keys sharing the row, and the gradients are the
// same from a saved forward as without one (the saved lse is +∞ there).
template <class T>
void expect_infinite_logits_gradients() {
  std::mt19937 rng(5);
  const auto q = test::cast<T>(random_tensor({2, 3, 4}, rng)), dout = test::cast<T>(random_tensor({2, 3, 4}, rng));
  const auto k = test::cast<T>(random_tensor({2, 5, 4}, rng)), v = test::cast<T>(random_tensor({2, 5, 4}, rng));
  Tensor<T> mask({3, 5});
  mask.at({1, 2}) = mask.at({1, 4}) = std::numeric_limits<T>::infinity();
  const Mask m = TensorView<const T>(mask.view());
  const auto whole = test::forward<T, T>(q.view(), k.view(), v.view(), {.lse = true}, {}, m);
  const auto fresh = attention_backward<T, T>(q.view(), k.view(), v.view(), dout.view(), {}, m);
  const auto saved = attention_backward<T, T>(q.view(), k.view(), v.view(), dout.view(), {}, m,
                                              {whole.out.view(), whole.lse.view()});
  for (const auto* g : {&fresh, &saved})
    for (const Tensor<T>* t : {&g->dq, &g->dk, &g->dv})
      for (int64_t i = 0; i < t->numel(); ++i) ASSERT_TRUE(std::isfinite((*t)[i])) << i;
  // (The other rows take the saved lse and out: their rounding.)
  const double tolerance = std::is_same_v<T, double> ? 1e-12 : 1e-6;
  EXPECT_LT(rel_error(saved.dq, fresh.dq), tolerance);
  EXPECT_LT(rel_error(saved.dk, fresh.dk), tolerance);
  EXPECT_LT(rel_error(saved.dv, fresh.dv), tolerance);
}

TEST(AttentionBackward, InfiniteLogitsWithASavedForward) {
  expect_infinite_logits_gradients<double>();
  expect_infinite_logits_gradients<float>();
}

TEST(RopeBackward, MatchesFiniteDifferences) {
  std::mt19937 rng(10);
  for (bool interleaved : {false, true})
    for (std::optional<int64_t> rotary_dim : {std::optional<int64_t>(), std::optional<int64_t>(4)}) {
      RopeOptions o;
      o.interleaved = interleaved;
      o.rotary_dim = rotary_dim;
      o.offset = 3;
      auto x = random_tensor({2, 5, 6}, rng);
      const auto dy = random_tensor({2, 5, 6}, rng);
      const auto loss = [&] { return dot(apply_rope(x.view(), o), dy); };
      EXPECT_LE(rel_error(rope_backward(dy.view(), o), numeric_gradient(x, loss)), kTol);
      // explicit positions, per batch entry
      const Tensor<int64_t> pos({2, 5}, {0, 7, -3, 100000, 2, 5, 5, 1, 9, 4});
      const auto loss_pos = [&] { return dot(apply_rope(x.view(), o, pos.view()), dy); };
      EXPECT_LE(rel_error(rope_backward(dy.view(), o, pos.view()), numeric_gradient(x, loss_pos)),
                kTol);
    }
}

// ---------------------------------------------------------------------------

MultiHeadAttentionConfig mha_config(int64_t E, int64_t H) {
  MultiHeadAttentionConfig c;
  c.embed_dim = E;
  c.num_heads = H;
  return c;
}

struct MhaCase {
  const char* name;
  MultiHeadAttentionConfig config;
  bool batched = true;
  bool cross = false;  // separate key and value inputs
  Causal causal = Causal::None;
  bool masks = false;  // a boolean attn_mask and an additive key_padding_mask
};
void PrintTo(const MhaCase& c, std::ostream* os) { *os << c.name; }

class MhaBackward : public ::testing::TestWithParam<MhaCase> {};

template <class T>
void expect_same_gradients(const MhaGradients<T>& a, const MhaGradients<T>& b) {
  const auto same = [](const Tensor<T>& x, const Tensor<T>& y, const std::string& what) {
    ASSERT_EQ(x.shape(), y.shape()) << what;
    EXPECT_TRUE(std::equal(x.data(), x.data() + x.numel(), y.data())) << what;
  };
  same(a.query, b.query, "query");
  same(a.key, b.key, "key");
  same(a.value, b.value, "value");
  ASSERT_EQ(a.parameters.size(), b.parameters.size());
  for (size_t i = 0; i < a.parameters.size(); ++i) same(a.parameters[i], b.parameters[i], "parameter " + std::to_string(i));
}

TEST_P(MhaBackward, MatchesFiniteDifferences) {
  const auto& c = GetParam();
  MultiHeadAttention<double> layer(c.config, 3);
  std::mt19937 rng(11);
  // Biases start at zero; make them random so their gradients matter.
  for (Tensor<double>* p : layer.parameters())
    for (int64_t i = 0; i < p->numel(); ++i) (*p)[i] = std::uniform_real_distribution<double>(-0.5, 0.5)(rng);
  const int64_t B = 2, n_q = 4, n_k = c.cross ? 5 : n_q;
  const auto shape = [&](int64_t n, int64_t w) {
    if (!c.batched) return Shape{n, w};
    return c.config.batch_first ? Shape{B, n, w} : Shape{n, B, w};
  };
  auto query = random_tensor(shape(n_q, c.config.embed_dim), rng);
  auto key = random_tensor(shape(n_k, c.config.key_dim()), rng);
  auto value = random_tensor(shape(n_k, c.config.value_dim()), rng);
  const auto dout = random_tensor(shape(n_q, c.config.embed_dim), rng);

  MhaForwardOptions<double> opt;
  opt.attention.causal = c.causal;
  Tensor<bool> attn_mask({n_q, n_k});
  Tensor<double> padding(c.batched ? Shape{B, n_k} : Shape{n_k});
  if (c.masks) {
    for (int64_t i = 0; i < attn_mask.numel(); ++i) attn_mask[i] = i % 7 == 3;  // true = blocked
    for (int64_t i = 0; i < padding.numel(); ++i) padding[i] = 0.3 * double(i % 3) - 0.2;
    opt.attn_mask = TensorView<const bool>(attn_mask.view());
    opt.key_padding_mask = TensorView<const double>(padding.view());
  }
  const auto k_in = c.cross ? TensorView<const double>(key.view()) : TensorView<const double>();
  const auto v_in = c.cross ? TensorView<const double>(value.view()) : TensorView<const double>();
  const auto loss = [&] { return dot(layer.forward(query.view(), k_in, v_in, opt).out, dout); };

  const auto g = layer.backward(dout.view(), query.view(), k_in, v_in, opt);
  EXPECT_LE(rel_error(g.query, numeric_gradient(query, loss)), kTol);
  if (c.cross) {
    EXPECT_LE(rel_error(g.key, numeric_gradient(key, loss)), kTol);
    EXPECT_LE(rel_error(g.value, numeric_gradient(value, loss)), kTol);
  } else {
    EXPECT_EQ(g.key.rank(), 0);  // self-attention: summed into query's gradient
  }
  // From the forward's saved state: the same arithmetic, so the same bits.
  MhaForwardOptions<double> save = opt;
  save.save_for_backward = true;
  expect_same_gradients(layer.backward(dout.view(), *layer.forward(query.view(), k_in, v_in, save).saved), g);

  const auto params = layer.parameters();
  ASSERT_EQ(g.parameters.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const auto numeric = numeric_gradient(*params[i], loss);
    // dL/dbk is exactly 0 without RoPE (q·bk shifts a whole row of logits,
    // which softmax ignores): there both sides must be (absolutely) ~0.
    if (test::max_abs_diff(numeric, Tensor<double>(numeric.shape())) < 1e-8)
      EXPECT_LE(test::max_abs_diff(g.parameters[i], numeric), 1e-8) << "parameter " << i;
    else
      EXPECT_LE(rel_error(g.parameters[i], numeric), kTol) << "parameter " << i;
  }
}

MultiHeadAttentionConfig variant(MultiHeadAttentionConfig c, void (*edit)(MultiHeadAttentionConfig&)) {
  edit(c);
  return c;
}

INSTANTIATE_TEST_SUITE_P(
    Configs, MhaBackward,
    ::testing::Values(
        MhaCase{"self", mha_config(8, 2)},
        MhaCase{"unbatched", mha_config(8, 2), false},
        MhaCase{"no_bias", variant(mha_config(8, 4), [](auto& c) { c.bias = false; })},
        MhaCase{"cross_kdim_vdim", variant(mha_config(8, 2), [](auto& c) { c.kdim = 5; c.vdim = 3; }), true, true},
        MhaCase{"gqa", variant(mha_config(8, 4), [](auto& c) { c.num_kv_heads = 2; }), true, true},
        MhaCase{"rope", variant(mha_config(8, 2), [](auto& c) { c.rope = true; }), true, false, Causal::BottomRight},
        MhaCase{"rope_interleaved", variant(mha_config(8, 2), [](auto& c) { c.rope = true; c.rope_interleaved = true; })},
        MhaCase{"masks", mha_config(8, 2), true, true, Causal::None, true},
        MhaCase{"masks_unbatched_causal", mha_config(8, 2), false, false, Causal::TopLeft, true},
        MhaCase{"sequence_first", variant(mha_config(8, 2), [](auto& c) { c.batch_first = false; }), true, true,
                Causal::BottomRight, true},
        MhaCase{"bias_kv_zero_attn", variant(mha_config(8, 2), [](auto& c) { c.add_bias_kv = c.add_zero_attn = true; }),
                true, true, Causal::None, true},
        MhaCase{"bias_kv_gqa_no_bias", variant(mha_config(8, 4), [](auto& c) {
                  c.add_bias_kv = true; c.num_kv_heads = 2; c.bias = false; })},
        MhaCase{"zero_attn_unbatched", variant(mha_config(8, 2), [](auto& c) { c.add_zero_attn = true; }), false},
        // learnable sinks (the last parameter), with GQA, RoPE and masks
        MhaCase{"sinks_gqa_rope_masks", variant(mha_config(8, 4), [](auto& c) {
                  c.sinks = true; c.num_kv_heads = 2; c.rope = true; }), true, true, Causal::BottomRight, true},
        // output gates (their parameters last), each kind with the layouts
        // and the parameters they sit beside
        MhaCase{"gate_headwise", variant(mha_config(8, 4), [](auto& c) { c.gate = Gate::Headwise; })},
        MhaCase{"gate_elementwise_sequence_first_cross", variant(mha_config(8, 2), [](auto& c) {
                  c.gate = Gate::Elementwise; c.batch_first = false; c.kdim = 5; }), true, true, Causal::BottomRight},
        MhaCase{"gate_headwise_unbatched_no_bias", variant(mha_config(8, 2), [](auto& c) {
                  c.gate = Gate::Headwise; c.bias = false; }), false},
        MhaCase{"gate_elementwise_sinks_bias_kv", variant(mha_config(8, 4), [](auto& c) {
                  c.gate = Gate::Elementwise; c.sinks = true; c.add_bias_kv = true; c.num_kv_heads = 2; }),
                true, true, Causal::None, true}),
    [](const auto& info) { return std::string(info.param.name); });

// float32 takes the fused kernel with the forward's log-sum-exp in both
// forms; a later load_state_dict leaves the saved forward's parameters alone.
TEST(MhaBackward, SavedForward) {
  auto config = mha_config(32, 4);
  config.rope = true;
  config.num_kv_heads = 2;
  MultiHeadAttention<float> layer(config, 5);
  const MultiHeadAttention<float> before = layer;
  std::mt19937 rng(12);
  const auto query = test::cast<float>(random_tensor({3, 70, 32}, rng));
  const auto dout = test::cast<float>(random_tensor({3, 70, 32}, rng));
  MhaForwardOptions<float> opt;
  opt.attention.causal = Causal::BottomRight;
  opt.save_for_backward = true;
  const auto y = layer.forward(query.view(), {}, {}, opt);
  ASSERT_TRUE(y.saved);
  auto changed = layer.state_dict();
  for (auto& [name, t] : changed)
    for (int64_t i = 0; i < t.numel(); ++i) t[i] += 0.25f;
  layer.load_state_dict(changed);
  expect_same_gradients(layer.backward(dout.view(), *y.saved), before.backward(dout.view(), query.view(), {}, {}, opt));

  EXPECT_THROW_MSG(before.backward(dout.view(), *y.saved), ValueError, "another layer");
  // The same object, assigned a layer of another shape: the state is refused,
  // not read with the new shapes.
  MultiHeadAttention<float> reused = layer;
  const auto mine = reused.forward(query.view(), {}, {}, opt);
  reused = MultiHeadAttention<float>(mha_config(16, 2));
  EXPECT_THROW_MSG(reused.backward(dout.view(), *mine.saved), ValueError, "before this layer was assigned");
  const Tensor<float> wrong({3, 70, 8});
  EXPECT_THROW_MSG(layer.backward(wrong.view(), *y.saved), ValueError, "expected the output's shape (3, 70, 32)");
  auto cache = layer.new_cache();
  opt.cache = &cache;
  EXPECT_THROW_MSG(layer.forward(query.view(), {}, {}, opt), ValueError, "save_for_backward with a KV cache");
  EXPECT_EQ(cache.length(), 0);
}

TEST(MhaBackward, RefusesACacheAndAWrongDout) {
  const MultiHeadAttention<double> layer(mha_config(8, 2));
  const Tensor<double> x({2, 3, 8}), dout({2, 3, 4});
  EXPECT_THROW_MSG(layer.backward(dout.view(), x.view()), ValueError,
                   "dout has shape (2, 3, 4), expected the output's shape (2, 3, 8)");
  auto cache = layer.new_cache();
  MhaForwardOptions<double> opt;
  opt.cache = &cache;
  EXPECT_THROW_MSG(layer.backward(x.view(), x.view(), {}, {}, opt), ValueError, "KV cache");
}

}  // namespace
}  // namespace attn
