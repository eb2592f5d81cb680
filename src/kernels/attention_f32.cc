// float32 attention, one query row at a time: logits over the allowed key
// range into a scratch row, a vectorised exp, then the weighted sum of V rows.
// Compiled once per SIMD target by Highway; the CPU is detected once per call.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/attention_f32.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <hwy/contrib/dot/dot-inl.h>
#include <hwy/contrib/math/math-inl.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/attention_kernel.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// out[c] = sum_j w[j] * v_j[c], where v_j is row j of V (unit column stride).
void WeightedSum(const float* w, int64_t count, const Operand<const float>& v,
                 int64_t b, int64_t h, int64_t first, int64_t d_v, float* out) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  std::fill(out, out + d_v, 0.0f);
  for (int64_t j = 0; j < count; ++j) {
    if (w[j] == 0.0f) continue;  // masked keys must not leak Inf/NaN values
    const float* vj = v.row(b, h, first + j);
    const auto wj = hn::Set(df, w[j]);
    int64_t c = 0;
    for (; c + N <= d_v; c += N)
      hn::StoreU(hn::MulAdd(wj, hn::LoadU(df, vj + c), hn::LoadU(df, out + c)), df, out + c);
    for (; c < d_v; ++c) out[c] += w[j] * vj[c];
  }
}

// Softmax of the first `count` entries of s in place (s is padded with -inf to
// a whole number of vectors). Returns false when no entry is finite-or-+inf,
// i.e. the row has no allowed key.
bool SoftmaxRow(float* s, int64_t count, int64_t padded) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const float inf = std::numeric_limits<float>::infinity();
  float max = -inf;
  for (int64_t j = 0; j < count; ++j) max = std::max(max, s[j]);
  if (max == -inf) return false;
  if (max == inf) {  // the limit: +inf entries share the weight evenly
    const auto n = std::count(s, s + count, inf);
    for (int64_t j = 0; j < count; ++j) s[j] = s[j] == inf ? 1.0f / n : 0.0f;
    return true;
  }
  const auto vmax = hn::Set(df, max);
  auto vsum = hn::Zero(df);
  for (int64_t j = 0; j < padded; j += N) {
    const auto e = hn::Exp(df, hn::Sub(hn::LoadU(df, s + j), vmax));
    hn::StoreU(e, df, s + j);
    vsum = hn::Add(vsum, e);
  }
  const auto inv = hn::Set(df, 1.0f / hn::GetLane(hn::SumOfLanes(df, vsum)));
  for (int64_t j = 0; j < padded; j += N)
    hn::StoreU(hn::Mul(hn::LoadU(df, s + j), inv), df, s + j);
  return true;
}

void AttentionF32(const AttentionProblem<float>& p) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const float ninf = -std::numeric_limits<float>::infinity();
  std::vector<float> s(static_cast<size_t>((p.n_k + N - 1) / N * N + N));
  const float scale = static_cast<float>(p.scale);
  const float cap = static_cast<float>(p.softcap);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t hkv = h / p.group();
      for (int64_t i = 0; i < p.n_q; ++i) {
        const KeyRange r = allowed_keys(i, p.n_q, p.n_k, p.causal, p.window);
        const int64_t count = r.end - r.begin;
        const int64_t padded = (count + N - 1) / N * N;
        const float* q = p.q.row(b, h, i);
        for (int64_t j = 0; j < count; ++j) {
          const float* k = p.k.row(b, hkv, r.begin + j);
          float x = hn::Dot::Compute<0>(df, q, k, static_cast<size_t>(p.d)) * scale;
          if (cap > 0) x = cap * std::tanh(x / cap);
          if (p.mask.present()) x += static_cast<float>(p.mask.value(b, h, i, r.begin + j));
          s[j] = x;
        }
        std::fill(s.begin() + count, s.begin() + padded, ninf);
        float* out = p.out.row(b, h, i);
        const bool any = SoftmaxRow(s.data(), count, padded);
        if (any)
          WeightedSum(s.data(), count, p.v, b, hkv, r.begin, p.d_v, out);
        else
          std::fill(out, out + p.d_v, 0.0f);
        if (p.weights) {
          float* w = p.weights.row(b, h, i);
          const int64_t ws = p.weights.col_stride;
          for (int64_t j = 0; j < p.n_k; ++j) {
            const bool inside = any && j >= r.begin && j < r.end;
            w[j * ws] = inside ? s[j - r.begin] : 0.0f;
          }
        }
      }
    }
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::detail {
HWY_EXPORT(AttentionF32);

void attention_f32(const AttentionProblem<float>& p) {
  HWY_DYNAMIC_DISPATCH(AttentionF32)(p);
}
}  // namespace attn::detail
#endif
