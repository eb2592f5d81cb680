// attn::onnx::attention and rotary_embedding (attn/onnx.hpp) against ONNX's
// rules written out here: the double reference given the dense mask that
// ONNX's causal alignment, cache and padding describe, and RoPE's rotation
// by the given cos and sin. (tests/python/test_onnx.py checks the same
// operators against a NumPy implementation of the specification, case by
// case of ONNX's own operator tests.)
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "attn/onnx.hpp"
#include "helpers.hpp"

namespace attn {
namespace {

using test::cast;
using test::max_abs_diff;
using test::random_tensor;
using test::rel_error;

using test::kInf;

// (B, H, S, D) as ONNX's 3-D (B, S, H·D), contiguous.
template <class T>
Tensor<T> merge_heads(const Tensor<T>& x) {
  const int64_t b = x.dim(0), h = x.dim(1), s = x.dim(2), d = x.dim(3);
  Tensor<T> out({b, s, h * d});
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < h; ++j)
      for (int64_t t = 0; t < s; ++t)
        for (int64_t c = 0; c < d; ++c) out.at({i, t, j * d + c}) = x.at({i, j, t, c});
  return out;
}

// The cache, a float mask shorter than the keys, nonpad_kv_seqlen, ONNX's
// causal rule and opset 25's window, each turned into the dense (B, 1, S,
// P + L) additive mask it stands for; the double reference with that mask is
// the expected answer. (A past and nonpad_kv_seqlen together are refused.)
TEST(Onnx, AttentionIsTheReferenceWithOnnxsMask) {
  std::mt19937 rng(1);
  const int64_t B = 2, Hq = 4, Hkv = 2, S = 3, P = 5, L = 3, D = 8, Dv = 6, T = P + L;
  const auto q = random_tensor({B, Hq, S, D}, rng), k = random_tensor({B, Hkv, L, D}, rng),
             v = random_tensor({B, Hkv, L, Dv}, rng), pk = random_tensor({B, Hkv, P, D}, rng),
             pv = random_tensor({B, Hkv, P, Dv}, rng);
  Tensor<double> mask = random_tensor({S, 6}, rng, -2, 1);  // 6 < T: padded with -inf
  mask[4] = -kInf;
  const Tensor<int64_t> nonpad({B}, {7, 4});
  const std::pair<int64_t, int64_t> windows[] = {{-1, -1}, {2, 1}, {1, -1}, {-1, 0}, {0, 3}};
  for (int64_t causal : {0, 1})
    for (bool with_past : {true, false})
      for (bool with_nonpad : {true, false})
        for (const auto& [left, right] : windows) {
          SCOPED_TRACE("causal " + std::to_string(causal) + " past " + std::to_string(with_past) +
                       " nonpad " + std::to_string(with_nonpad) + " window " + std::to_string(left) + ", " +
                       std::to_string(right));
          // Without a past, K holds all T keys (an external cache).
          const Tensor<double> k_all = with_past ? k : random_tensor({B, Hkv, T, D}, rng),
                               v_all = with_past ? v : random_tensor({B, Hkv, T, Dv}, rng);
          Tensor<double> keys({B, Hkv, T, D}), values({B, Hkv, T, Dv});
          for (int64_t b = 0; b < B; ++b)
            for (int64_t h = 0; h < Hkv; ++h)
              for (int64_t j = 0; j < T; ++j) {
                for (int64_t c = 0; c < D; ++c)
                  keys.at({b, h, j, c}) = with_past ? (j < P ? pk.at({b, h, j, c}) : k.at({b, h, j - P, c}))
                                                    : k_all.at({b, h, j, c});
                for (int64_t c = 0; c < Dv; ++c)
                  values.at({b, h, j, c}) = with_past ? (j < P ? pv.at({b, h, j, c}) : v.at({b, h, j - P, c}))
                                                      : v_all.at({b, h, j, c});
              }
          Tensor<double> dense({B, 1, S, T});
          for (int64_t b = 0; b < B; ++b)
            for (int64_t i = 0; i < S; ++i)
              for (int64_t j = 0; j < T; ++j) {
                const int64_t offset = with_past ? P : with_nonpad ? nonpad[b] - S : 0;
                bool allowed = j < 6;
                if (with_nonpad) allowed = allowed && j < nonpad[b];
                if (causal) allowed = allowed && j <= i + offset;
                if (left >= 0) allowed = allowed && j >= i + offset - left;
                if (right >= 0) allowed = allowed && j <= i + offset + right;
                dense.at({b, 0, i, j}) = allowed ? mask.at({i, j}) : -kInf;
              }
          onnx::AttentionAttributes a;
          a.is_causal = causal;
          a.qk_matmul_output_mode = 2;
          a.left_window_size = left;
          a.right_window_size = right;
          const auto call = [&] {
            return onnx::attention<double>(
                q.view(), (with_past ? k : k_all).view(), (with_past ? v : v_all).view(),
                TensorView<const double>(mask.view()), with_past ? pk.view() : TensorView<const double>(),
                with_past ? pv.view() : TensorView<const double>(),
                with_nonpad ? nonpad.view() : TensorView<const int64_t>(), a, true);
          };
          if (with_past && with_nonpad) {
            EXPECT_THROW(call(), ValueError);
            continue;
          }
          const auto got = call();
          test::Returns returns;
          returns.logits = Logits::Masked;
          const auto want = test::forward(q.view(), keys.view(), values.view(), returns, {},
                                                  TensorView<const double>(dense.view()));
          EXPECT_LT(max_abs_diff(got.Y, want.out), 1e-14);
          EXPECT_EQ(max_abs_diff(got.present_key, keys), 0.0);
          EXPECT_EQ(max_abs_diff(got.present_value, values), 0.0);
          for (int64_t e = 0; e < want.logits.numel(); ++e) {
            if (std::isinf(want.logits[e])) EXPECT_EQ(got.qk_matmul_output[e], want.logits[e]);
            else EXPECT_NEAR(got.qk_matmul_output[e], want.logits[e], 1e-14);
          }
        }
}

// 3-D inputs are 4-D ones with the heads merged into the last axis, and so
// is the output; GQA through kv_num_heads; float32 through the kernels.
TEST(Onnx, ThreeDimensionalInputsAreMergedHeads) {
  std::mt19937 rng(2);
  const auto q = cast<float>(random_tensor({2, 6, 5, 8}, rng)), k = cast<float>(random_tensor({2, 3, 7, 8}, rng)),
             v = cast<float>(random_tensor({2, 3, 7, 4}, rng));
  onnx::AttentionAttributes a;
  a.is_causal = 1;
  a.softcap = 2;
  const auto four = onnx::attention<float>(q.view(), k.view(), v.view(), {}, {}, {}, {}, a);
  a.q_num_heads = 6;
  a.kv_num_heads = 3;
  const auto three = onnx::attention<float>(merge_heads(q).view(), merge_heads(k).view(),
                                            merge_heads(v).view(), {}, {}, {}, {}, a);
  EXPECT_EQ(three.Y.shape(), (Shape{2, 5, 24}));
  EXPECT_EQ(max_abs_diff(three.Y, merge_heads(four.Y)), 0.0);
  EXPECT_EQ(max_abs_diff(three.present_key, k), 0.0);
  // is_causal without a cache is top-left
  AttentionOptions o;
  o.causal = Causal::TopLeft;
  o.softcap = 2;
  EXPECT_EQ(max_abs_diff(four.Y, attention(q.view(), k.view(), v.view(), o)), 0.0);
}

// float16 and bfloat16 inputs: the float32 computation on the widened
// values, rounded back once.
template <class H>
void check_sixteen_bit(uint16_t (*to_bits)(float), float (*from_bits)(uint16_t)) {
  std::mt19937 rng(3);
  const auto round = [&](const Tensor<double>& x) {
    Tensor<H> h(x.shape());
    for (int64_t e = 0; e < x.numel(); ++e) h[e] = H{to_bits(float(x[e]))};
    return h;
  };
  const auto widen = [&](const Tensor<H>& h) {
    Tensor<float> f(h.shape());
    for (int64_t e = 0; e < h.numel(); ++e) f[e] = from_bits(h[e].bits);
    return f;
  };
  const auto q = round(random_tensor({1, 2, 3, 8}, rng)), k = round(random_tensor({1, 2, 5, 8}, rng)),
             v = round(random_tensor({1, 2, 5, 8}, rng)), mask = round(random_tensor({3, 4}, rng));
  onnx::AttentionAttributes a;
  a.qk_matmul_output_mode = 3;
  const auto got = onnx::attention<H>(q.view(), k.view(), v.view(), TensorView<const H>(mask.view()), {}, {},
                                      {}, a, true);
  const auto wide = onnx::attention<float>(widen(q).view(), widen(k).view(), widen(v).view(),
                                           TensorView<const float>(widen(mask).view()), {}, {}, {}, a, true);
  for (int64_t e = 0; e < wide.Y.numel(); ++e) EXPECT_EQ(got.Y[e].bits, to_bits(wide.Y[e]));
  for (int64_t e = 0; e < wide.qk_matmul_output.numel(); ++e)
    EXPECT_EQ(got.qk_matmul_output[e].bits, to_bits(wide.qk_matmul_output[e]));
}

TEST(Onnx, SixteenBitInputsAreComputedInFloat32) {
  check_sixteen_bit<float16>(float_to_fp16, fp16_to_float);
  check_sixteen_bit<bfloat16>(float_to_bf16, bf16_to_float);
}

TEST(Onnx, AttentionErrorsNameTheArgument) {
  const Tensor<float> q({1, 2, 3, 4}), k({1, 2, 5, 4}), v({1, 2, 5, 4}), q3({1, 3, 8});
  const Tensor<int64_t> lengths({1}, {6});
  const Tensor<float> long_mask({3, 6});
  onnx::AttentionAttributes mode;
  mode.qk_matmul_output_mode = 5;
  EXPECT_THROW_MSG(onnx::attention<float>(q3.view(), k.view(), v.view()), ValueError, "must all be 4-D");
  EXPECT_THROW_MSG(onnx::attention<float>(q.view(), k.view(), v.view(), {}, k.view()), ValueError,
                   "past_key and past_value go together");
  EXPECT_THROW_MSG(onnx::attention<float>(q.view(), k.view(), v.view(), {}, {}, {}, lengths.view()),
                   ValueError, "nonpad_kv_seqlen[0] = 6");
  EXPECT_THROW_MSG(onnx::attention<float>(q.view(), k.view(), v.view(), TensorView<const float>(long_mask.view())),
                   ValueError, "attn_mask (3, 6) has more keys");
  EXPECT_THROW_MSG(onnx::attention<float>(q.view(), k.view(), v.view(), {}, {}, {}, {}, mode), ValueError,
                   "qk_matmul_output_mode must be 0, 1, 2 or 3, got 5");
}

// Y = X with each pair of its first r features turned by the cache's angle:
// (x1, x2) -> (c x1 - s x2, s x1 + c x2), halves or interleaved, 3-D and 4-D.
TEST(Onnx, RotaryEmbeddingTurnsPairsByTheCaches) {
  std::mt19937 rng(4);
  const int64_t B = 2, H = 3, S = 4, D = 8, r = 6, positions = 10;
  const auto x = random_tensor({B, H, S, D}, rng), angle = random_tensor({positions, r / 2}, rng, 0, 6);
  Tensor<double> cos(angle.shape()), sin(angle.shape());
  for (int64_t e = 0; e < angle.numel(); ++e) cos[e] = std::cos(angle[e]), sin[e] = std::sin(angle[e]);
  Tensor<int64_t> ids({B, S});
  for (int64_t e = 0; e < ids.numel(); ++e) ids[e] = int64_t(rng() % positions);
  for (int64_t interleaved : {0, 1}) {
    Tensor<double> want = x;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t s = 0; s < S; ++s)
          for (int64_t p = 0; p < r / 2; ++p) {
            const int64_t i1 = interleaved ? 2 * p : p, i2 = interleaved ? 2 * p + 1 : p + r / 2;
            const double c = cos.at({ids.at({b, s}), p}), n = sin.at({ids.at({b, s}), p});
            const double x1 = x.at({b, h, s, i1}), x2 = x.at({b, h, s, i2});
            want.at({b, h, s, i1}) = c * x1 - n * x2;
            want.at({b, h, s, i2}) = n * x1 + c * x2;
          }
    onnx::RotaryEmbeddingAttributes a;
    a.interleaved = interleaved;
    a.rotary_embedding_dim = r;
    EXPECT_LT(max_abs_diff(onnx::rotary_embedding<double>(x.view(), cos.view(), sin.view(), ids.view(), a), want),
              1e-15);
    a.num_heads = H;
    const auto three = onnx::rotary_embedding<float>(cast<float>(merge_heads(x)).view(), cast<float>(cos).view(),
                                                     cast<float>(sin).view(), ids.view(), a);
    EXPECT_LT(rel_error(three, merge_heads(want)), 1e-6);
  }
}

TEST(Onnx, RotaryEmbeddingErrorsNameTheArgument) {
  const Tensor<float> x({1, 2, 3, 8}), cos({10, 4}), short_cos({10, 3});
  const Tensor<int64_t> ids({1, 3}), far({1, 3}, {0, 1, 10});
  onnx::RotaryEmbeddingAttributes odd;
  odd.rotary_embedding_dim = 5;
  EXPECT_THROW_MSG(onnx::rotary_embedding<float>(x.view(), short_cos.view(), short_cos.view(), ids.view()),
                   ValueError, "cos_cache and sin_cache must be (max_position + 1, 4)");
  EXPECT_THROW_MSG(onnx::rotary_embedding<float>(x.view(), cos.view(), cos.view(), ids.view(), odd), ValueError,
                   "rotary_embedding_dim must be even");
  EXPECT_THROW_MSG(onnx::rotary_embedding<float>(x.view(), cos.view(), cos.view(), far.view()), ValueError,
                   "position");
}

}  // namespace
}  // namespace attn
