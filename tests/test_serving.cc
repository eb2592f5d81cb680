// Serving: merge_state and merge_states against attention over the union of
// the keys (the float64 reference), and their rules at the edges.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "attn/attn.hpp"
#include "helpers.hpp"

namespace attn {
namespace {

using test::random_tensor;
constexpr double kInf = std::numeric_limits<double>::infinity();

// Attention of q (H, n, d) over keys [begin, end) of k, v (H, n_k, ·) in
// float64, as a state: v (n, H, d_v) and s (n, H), merge_state's layout.
struct State {
  Tensor<double> v, s;
};
State state_over(const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v, int64_t begin,
                 int64_t end) {
  const int64_t heads = q.dim(0), n = q.dim(1), d_v = v.dim(2);
  const auto keys = [&](const Tensor<double>& t) {
    return TensorView<const double>(t.data() + begin * t.dim(2), {heads, end - begin, t.dim(2)}, t.view().strides());
  };
  const auto r = test::forward(q.view(), keys(k), keys(v), test::Returns{.lse = true});
  State s{Tensor<double>({n, heads, d_v}), Tensor<double>({n, heads})};
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t e = 0; e < d_v; ++e) s.v.at({i, h, e}) = r.out.at({h, i, e});
      s.s.at({i, h}) = r.lse.at({h, i});
    }
  return s;
}

TEST(MergeState, TwoHalvesGiveAttentionOverAllKeys) {
  std::mt19937 rng(7);
  const auto q = random_tensor({3, 5, 8}, rng), k = random_tensor({3, 11, 8}, rng, -2, 2),
             v = random_tensor({3, 11, 6}, rng);
  const State whole = state_over(q, k, v, 0, 11), a = state_over(q, k, v, 0, 4), b = state_over(q, k, v, 4, 11);
  const auto merged = merge_state<double>(a.v.view(), a.s.view(), b.v.view(), b.s.view());
  EXPECT_LT(test::max_abs_diff(merged.v, whole.v), 1e-14);
  EXPECT_LT(test::max_abs_diff(merged.s, whole.s), 1e-14);

  // In place, and in float32 (its weights computed in double).
  auto v32 = test::cast<float>(a.v), s32 = test::cast<float>(a.s);
  const auto vb32 = test::cast<float>(b.v), sb32 = test::cast<float>(b.s);
  merge_state_in_place<float>(v32.view(), s32.view(), vb32.view(), sb32.view());
  EXPECT_LT(test::max_abs_diff(v32, whole.v), 1e-6);
  EXPECT_LT(test::max_abs_diff(s32, whole.s), 1e-6);
}

TEST(MergeState, ManyStatesInOrderGiveAttentionOverAllKeys) {
  std::mt19937 rng(8);
  const auto q = random_tensor({2, 4, 8}, rng), k = random_tensor({2, 20, 8}, rng, -2, 2),
             v = random_tensor({2, 20, 5}, rng);
  const int64_t cuts[] = {0, 3, 3, 12, 20};  // one part holds no key: lse −∞, zeros
  const State whole = state_over(q, k, v, 0, 20);
  Tensor<double> vs({4, 4, 2, 5}), ss({4, 4, 2});
  for (int64_t part = 0; part < 4; ++part) {
    const State st = state_over(q, k, v, cuts[part], cuts[part + 1]);
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t h = 0; h < 2; ++h) {
        for (int64_t e = 0; e < 5; ++e) vs.at({i, part, h, e}) = st.v.at({i, h, e});
        ss.at({i, part, h}) = st.s.at({i, h});
      }
  }
  EXPECT_EQ(ss.at({0, 1, 0}), -kInf);
  const auto merged = merge_states<double>(vs.view(), ss.view());
  EXPECT_LT(test::max_abs_diff(merged.v, whole.v), 1e-14);
  EXPECT_LT(test::max_abs_diff(merged.s, whole.s), 1e-14);
  // No state at all: zeros and −∞.
  const auto none = merge_states<double>(Tensor<double>({2, 0, 1, 3}).view(), Tensor<double>({2, 0, 1}).view());
  EXPECT_EQ(none.v.shape(), (Shape{2, 1, 3}));
  for (int64_t i = 0; i < none.v.numel(); ++i) EXPECT_EQ(none.v[i], 0.0);
  EXPECT_EQ(none.s[0], -kInf);
}

TEST(MergeState, EdgesFollowTheSoftmaxsRules) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  struct Case {
    double s_a, s_b, want_s, want_v;  // v_a = 1, v_b = 3 (NaN when its state is −∞: never read)
  };
  const Case cases[] = {
      {0.0, -kInf, 0.0, 1.0},                       // b has no key: changes nothing
      {-kInf, 0.0, 0.0, 3.0},                       // a has none: b's state
      {-kInf, -kInf, -kInf, 1.0},                   // neither: a's (zeros, for attention's)
      {kInf, 5.0, kInf, 1.0},                       // +∞ takes all the weight
      {5.0, kInf, kInf, 3.0},
      {kInf, kInf, nan, nan},                       // which +∞ weighs more is unknown
      {nan, 0.0, nan, nan},
      {std::log(1.0), std::log(3.0), std::log(4.0), 0.25 * 1 + 0.75 * 3},
  };
  for (const Case& c : cases) {
    const Tensor<double> va({1, 1, 1}, {1.0}), sa({1, 1}, {c.s_a});
    const Tensor<double> vb({1, 1, 1}, {c.s_b == -kInf ? nan : 3.0}), sb({1, 1}, {c.s_b});
    const auto m = merge_state<double>(va.view(), sa.view(), vb.view(), sb.view());
    const auto same = [](double got, double want) { return std::isnan(want) ? std::isnan(got) : got == want; };
    EXPECT_TRUE(same(m.s[0], c.want_s) || std::abs(m.s[0] - c.want_s) < 1e-15)
        << "s_a=" << c.s_a << " s_b=" << c.s_b << ": s " << m.s[0];
    EXPECT_TRUE(same(m.v[0], c.want_v) || std::abs(m.v[0] - c.want_v) < 1e-15)
        << "s_a=" << c.s_a << " s_b=" << c.s_b << ": v " << m.v[0];
  }
}

TEST(MergeState, ShapesThatDifferAreNamed) {
  const Tensor<float> v({2, 3, 4}), s({2, 3}), v_bad({2, 3, 5}), s_bad({3, 2});
  EXPECT_THROW_MSG(merge_state<float>(v.view(), s.view(), v_bad.view(), s.view()), ValueError,
                   "merge_state: v_b must have shape (2, 3, 4), got v_b (2, 3, 5)");
  EXPECT_THROW_MSG(merge_state<float>(v.view(), s_bad.view(), v.view(), s.view()), ValueError,
                   "s_a must have shape (2, 3)");
  EXPECT_THROW_MSG(merge_states<float>(v.view(), s.view()), ValueError,
                   "vs must be (n, num_states, heads, head_dim), got shape (2, 3, 4)");
}

}  // namespace
}  // namespace attn
