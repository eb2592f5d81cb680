// The MultiHeadLatentAttention layer's forward: the projections and the two
// latents' RMSNorm, RoPE on the rope parts, the latent cache, then attention
// in the absorbed form (MQA over the latent rows) or the expanded one (per
// head keys and values, as Hugging Face computes), and o_proj.
#include <cmath>
#include <optional>
#include <string>

#include "attn/attention.hpp"
#include "attn/latent_attention.hpp"
#include "attn/linear.hpp"
#include "attn/positional.hpp"
#include "layer/mla_internal.hpp"

namespace attn {
using detail::mla::fail;
namespace {

// RMSNorm of each row's first `width` values, in place: x / sqrt(mean(x²) +
// eps) · weight, the mean in double (Hugging Face computes it in float32).
void rms_norm(float* rows, int64_t n, int64_t stride, const Tensor<float>& weight, double eps) {
  const int64_t width = weight.numel();
  for (int64_t t = 0; t < n; ++t) {
    float* x = rows + t * stride;
    double sum = 0;
    for (int64_t i = 0; i < width; ++i) sum += double(x[i]) * x[i];
    const double inv = 1.0 / std::sqrt(sum / double(width) + eps);
    for (int64_t i = 0; i < width; ++i) x[i] = static_cast<float>(double(x[i]) * inv) * weight[i];
  }
}

}  // namespace

void MultiHeadLatentAttention::Parameters::project(const MultiHeadLatentAttentionConfig& c, TensorView<const float> x,
                                                   Tensor<float>& q, Tensor<float>& kv) const {
  const int64_t N = x.dim(0), row = c.kv_lora_rank + c.qk_rope_head_dim;
  q = Tensor<float>({N, c.num_attention_heads * c.qk_head_dim()}), kv = Tensor<float>({N, row});
  if (c.q_lora_rank) {
    Tensor<float> qa({N, *c.q_lora_rank});
    linear(x, (*this)["q_a_proj.weight"].view(), bias_of("q_a_proj.bias"), qa.view());
    rms_norm(qa.data(), N, *c.q_lora_rank, (*this)["q_a_layernorm.weight"], c.rms_norm_eps);
    linear(TensorView<const float>(qa.view()), (*this)["q_b_proj.weight"].view(), {}, q.view());
  } else {
    linear(x, (*this)["q_proj.weight"].view(), {}, q.view());
  }
  linear(x, (*this)["kv_a_proj_with_mqa.weight"].view(), bias_of("kv_a_proj_with_mqa.bias"), kv.view());
  rms_norm(kv.data(), N, row, (*this)["kv_a_layernorm.weight"], c.rms_norm_eps);
}

Tensor<float> MultiHeadLatentAttention::Parameters::absorb(const MultiHeadLatentAttentionConfig& c, const float* q,
                                                           int64_t n) const {
  const int64_t H = c.num_attention_heads, r = c.kv_lora_rank, nope = c.qk_nope_head_dim, dqk = c.qk_head_dim();
  Tensor<float> q_lat({n, H, r});
  for (int64_t h = 0; h < H; ++h)
    linear(TensorView<const float>(q + h * dqk, {n, nope}, {H * dqk, 1}),
           TensorView<const float>(w_uk_t.data() + h * r * nope, {r, nope}), {},
           TensorView<float>(q_lat.data() + h * r, {n, r}, {H * r, 1}));
  return q_lat;
}

void MultiHeadLatentAttention::Parameters::expand_values(const MultiHeadLatentAttentionConfig& c, const float* latent,
                                                         int64_t n, float* ctx) const {
  const int64_t H = c.num_attention_heads, r = c.kv_lora_rank, nope = c.qk_nope_head_dim, dv = c.v_head_dim;
  const Tensor<float>& kv_b = (*this)["kv_b_proj.weight"];  // per head: W_UK (nope, r) then W_UV (dv, r)
  for (int64_t h = 0; h < H; ++h)
    linear(TensorView<const float>(latent + h * r, {n, r}, {H * r, 1}),
           TensorView<const float>(kv_b.data() + (h * (nope + dv) + nope) * r, {dv, r}), {},
           TensorView<float>(ctx + h * dv, {n, dv}, {H * dv, 1}));
}

namespace detail::mla {

void rotate(const MultiHeadLatentAttentionConfig& c, Tensor<float>& q, Tensor<float>& kv, int64_t B, int64_t n,
            int64_t offset, TensorView<const int64_t> positions) {
  const int64_t H = c.num_attention_heads, r = c.kv_lora_rank, p = c.qk_rope_head_dim, dqk = c.qk_head_dim();
  const int64_t row = r + p;
  if (p == 0) return;
  RopeOptions rope;
  rope.base = c.rope_theta;
  rope.interleaved = c.rope_interleave;
  rope.rotary_dim = p;
  rope.scaling = c.rope_scaling;
  rope.offset = offset;
  const TensorView<float> q_pe(q.data() + c.qk_nope_head_dim, {B, H, n, p}, {n * H * dqk, dqk, H * dqk, 1});
  const TensorView<float> k_pe(kv.data() + r, {B, 1, n, p}, {n * row, 0, row, 1});
  TensorView<const int64_t> pos = positions;
  if (positions.rank() == 2)  // (batch, n) against (batch, heads, n)
    pos = TensorView<const int64_t>(positions.data(), {B, 1, n}, {positions.stride(0), 0, positions.stride(1)});
  apply_rope(TensorView<const float>(q_pe), q_pe, rope, pos);
  apply_rope(TensorView<const float>(k_pe), k_pe, rope, pos);
}

}  // namespace detail::mla

Tensor<float> MultiHeadLatentAttention::forward(TensorView<const float> x, LatentCache* cache,
                                                TensorView<const int64_t> positions, LatentForm form) const {
  const auto& c = config_;
  if (x.rank() != 2 && x.rank() != 3)
    fail("x must be (batch, n, hidden_size) or (n, hidden_size), got " + shape_str(x.shape()));
  if (x.dim(-1) != c.hidden_size)
    fail("x's last axis must be hidden_size=" + std::to_string(c.hidden_size) + ", got " + shape_str(x.shape()));
  const bool batched = x.rank() == 3;
  const int64_t B = batched ? x.dim(0) : 1, n = x.dim(-2), E = c.hidden_size;
  const int64_t H = c.num_attention_heads, r = c.kv_lora_rank, p = c.qk_rope_head_dim, nope = c.qk_nope_head_dim;
  const int64_t dqk = c.qk_head_dim(), dv = c.v_head_dim, row = r + p;
  std::optional<detail::CacheUser::Hold> held;  // until the call's latents are appended and attended
  if (cache) held.emplace(cache->use("forward"));
  const int64_t past = cache ? cache->length() : 0;
  if (cache && past > 0 && cache->batch() != B)
    fail("the cache holds batch " + std::to_string(cache->batch()) + ", x has " + std::to_string(B));
  if (cache && (cache->kv_lora_rank() != r || cache->rope_dim() != p))
    fail("the cache holds rows of " + std::to_string(cache->kv_lora_rank()) + " + " +
         std::to_string(cache->rope_dim()) + ", this layer's are " + std::to_string(r) + " + " + std::to_string(p));
  if (!positions.empty_view() && !(positions.rank() == 1 && positions.dim(0) == n) &&
      !(positions.rank() == 2 && positions.dim(0) == B && positions.dim(1) == n))
    fail("positions must be (n,) = (" + std::to_string(n) + ",) or (batch, n) = (" + std::to_string(B) + ", " +
         std::to_string(n) + "), got " + shape_str(positions.shape()));
  const auto w = snapshot();
  const Parameters& P = *w;
  const Tensor<float> xc = contiguous(x);
  Tensor<float> q, kv;
  P.project(c, TensorView<const float>(xc.data(), {B * n, E}), q, kv);
  detail::mla::rotate(c, q, kv, B, n, past, positions);
  if (cache)
    cache->append(TensorView<const float>(kv.data(), {B, n, r}, {n * row, row, 1}),
                  TensorView<const float>(kv.data() + r, {B, n, p}, {n * row, row, 1}));

  const double scale = c.softmax_scale();
  const bool absorbed = form == LatentForm::Absorbed || (form == LatentForm::Auto && past > 0);
  const Tensor<float>& kv_b = P["kv_b_proj.weight"];  // per head: W_UK (nope, r) then W_UV (dv, r)
  Tensor<float> ctx({B * n, H * dv});
  // Batch entry b's attention over its latent rows (n_k, r + p) of type S.
  const auto attend = [&](int64_t b, auto rows) {
    using S = std::remove_cvref_t<decltype(*rows.data())>;
    const int64_t n_k = rows.dim(0), rs = rows.stride(0);
    float* ctx_b = ctx.data() + b * n * H * dv;
    const float* q_b = q.data() + b * n * H * dqk;
    if (absorbed) {
      const Tensor<float> q_lat = P.absorb(c, q_b, n);
      const auto res = latent_attention<float, S>(
          q_lat.view(), TensorView<const float>(q_b + nope, {n, H, p}, {H * dqk, dqk, 1}),
          TensorView<const S>(rows.data(), {n_k, r}, {rs, 1}), TensorView<const S>(rows.data() + r, {n_k, p}, {rs, 1}),
          scale, /*causal=*/true);
      P.expand_values(c, res.out.data(), n, ctx_b);
      return;
    }
    Tensor<float> latents;
    if constexpr (std::is_same_v<S, float>) latents = contiguous(rows);
    else latents = dequantize(rows);
    Tensor<float> kvb({n_k, H * (nope + dv)});  // per key and head: [k_nope | v]
    linear(TensorView<const float>(latents.data(), {n_k, r}, {row, 1}), kv_b.view(), {}, kvb.view());
    Tensor<float> keys({H, n_k, dqk});
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < n_k; ++j) {
        float* k = keys.data() + (h * n_k + j) * dqk;
        std::copy_n(kvb.data() + (j * H + h) * (nope + dv), nope, k);
        std::copy_n(latents.data() + j * row + r, p, k + nope);
      }
    AttentionOptions o;
    o.causal = Causal::BottomRight;
    o.scale = scale;
    AttentionPlan<float, float>(TensorView<const float>(q_b, {H, n, dqk}, {dqk, H * dqk, 1}), keys.view(),
                                TensorView<const float>(kvb.data() + nope, {H, n_k, dv}, {nope + dv, H * (nope + dv), 1}),
                                o)
        .run(TensorView<float>(ctx_b, {H, n, dv}, {dv, H * dv, 1}));
  };
  for (int64_t b = 0; b < B; ++b) {
    if (cache) cache->visit(b, [&](auto rows) { attend(b, rows); });
    else attend(b, TensorView<const float>(kv.data() + b * n * row, {n, row}));
  }
  Tensor<float> out({B * n, E});
  linear(TensorView<const float>(ctx.view()), P["o_proj.weight"].view(), P.bias_of("o_proj.bias"), out.view());
  return std::move(out).reshape(batched ? Shape{B, n, E} : Shape{n, E});
}

}  // namespace attn
