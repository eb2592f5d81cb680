// latent_attention (MLA's absorbed attention) against its definition in
// double, written here: logits scale · (q_nope·c + q_pe·k_pe), softmax over
// the keys (causal: bottom-right), out = Σ softmax · c; on the rows of one
// bf16 cache read in place, and on separate float32 arrays.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "attn/latent_attention.hpp"
#include "attn/quantize.hpp"
#include "helpers.hpp"

namespace attn {
namespace {

using test::cast;
using test::random_tensor;

TEST(LatentAttention, IsItsDefinitionOnACachesRows) {
  constexpr int64_t r = 48, p = 16, n_q = 2, heads = 40, n_k = 700;  // 80 rows per KV head: tiles
  std::mt19937 rng(5);
  const Tensor<float> q_nope = cast<float>(random_tensor({n_q, heads, r}, rng)),
                      q_pe = cast<float>(random_tensor({n_q, heads, p}, rng)),
                      rows = cast<float>(random_tensor({n_k, r + p}, rng));
  const Tensor<bfloat16> stored = to_bfloat16(rows.view());
  const Tensor<float> held = dequantize(TensorView<const bfloat16>(stored.view()));  // the values the cache holds
  const double scale = 0.15;
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "not causal");
    const auto in_place = latent_attention<float, bfloat16>(
        q_nope.view(), q_pe.view(), TensorView<const bfloat16>(stored.data(), {n_k, r}, {r + p, 1}),
        TensorView<const bfloat16>(stored.data() + r, {n_k, p}, {r + p, 1}), scale, causal);
    Tensor<float> c({n_k, r}), k_pe({n_k, p});
    for (int64_t j = 0; j < n_k; ++j) {
      for (int64_t e = 0; e < r; ++e) c.at({j, e}) = held.at({j, e});
      for (int64_t e = 0; e < p; ++e) k_pe.at({j, e}) = held.at({j, r + e});
    }
    const auto apart = latent_attention<float>(q_nope.view(), q_pe.view(), c.view(), k_pe.view(), scale, causal);
    double err = 0, lse_err = 0;
    for (int64_t i = 0; i < n_q; ++i)
      for (int64_t h = 0; h < heads; ++h) {
        std::vector<double> logit(n_k);
        double top = -INFINITY;
        const int64_t last = causal ? n_k - n_q + i : n_k - 1;
        for (int64_t j = 0; j <= last; ++j) {
          double s = 0;
          for (int64_t e = 0; e < r; ++e) s += double(q_nope.at({i, h, e})) * held.at({j, e});
          for (int64_t e = 0; e < p; ++e) s += double(q_pe.at({i, h, e})) * held.at({j, r + e});
          logit[j] = scale * s;
          top = std::max(top, logit[j]);
        }
        double sum = 0;
        std::vector<double> out(r, 0.0);
        for (int64_t j = 0; j <= last; ++j) {
          const double w = std::exp(logit[j] - top);
          sum += w;
          for (int64_t e = 0; e < r; ++e) out[e] += w * held.at({j, e});
        }
        for (int64_t e = 0; e < r; ++e) {
          err = std::max(err, std::abs(in_place.out.at({i, h, e}) - out[e] / sum));
          EXPECT_EQ(in_place.out.at({i, h, e}), apart.out.at({i, h, e}));  // the same keys, the same kernel
        }
        lse_err = std::max(lse_err, std::abs(in_place.lse.at({i, h}) - (top + std::log(sum))));
      }
    EXPECT_LT(err, 2e-6);
    EXPECT_LT(lse_err, 2e-6);
  }
  EXPECT_THROW(latent_attention<float>(q_nope.view(), q_pe.view(), rows.view(), rows.view(), scale), ValueError);
}

}  // namespace
}  // namespace attn
