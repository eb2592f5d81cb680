// int8 precision's quantization (docs/semantics.md "Precision"), as the
// products see it: each query row, and each key row less the mean of its
// (batch, kv head)'s keys, rounded to int8 codes with one scale per row and
// handed to the float32 products dequantized: float32 FMAs on them compute
// what an int8 unit's integer sums, scaled once, do, up to the rounding of
// each dequantized key (mean + t · code) and of the sums. Highway's per-target include:
// include after hwy/highway.h inside a file compiled by foreach_target.h.
#if defined(ATTN_KERNELS_INT8_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_KERNELS_INT8_INL_H_
#undef ATTN_KERNELS_INT8_INL_H_
#else
#define ATTN_KERNELS_INT8_INL_H_
#endif

#include <hwy/highway.h>

#include "kernels/flash-inl.h"

#include <algorithm>
#include <cstring>

#include "kernels/int8_unit.hpp"
#include "kernels/scratch.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::kernels {
namespace HWY_NAMESPACE {

// Row x of n floats, in place, as mean + s · round((x − mean) / s) (ties to
// even; clamped to [-127, 127], which only a subnormal s, rounded, can
// pass), s = max |x − mean| / 127 over the row's finite differences, so each
// code is an int8; mean null: 0. An element whose difference is not finite
// (NaN, ±inf, overflow) stays as it was, so it spoils its own products only,
// as in float32; a row with s = 0 (all its differences 0, or so small that
// s underflows) becomes its mean.
// With `codes`, x becomes the codes themselves (0 for such an element).
// Returns s.
inline float QuantizeRowInt8(float* x, int64_t n, const float* mean, bool codes = false) {
  const DF d;
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  const auto center = [&](int64_t c, int64_t m) HWY_ATTR {
    return mean ? LoadPart(d, mean + c, m, 0.0f) : hn::Zero(d);
  };
  VF largest = hn::Zero(d);
  for (int64_t c = 0; c < n; c += N) {
    const int64_t m = std::min(N, n - c);
    const VF diff = hn::Sub(LoadPart(d, x + c, m, 0.0f), center(c, m));
    largest = hn::Max(largest, hn::IfThenElseZero(hn::IsFinite(diff), hn::Abs(diff)));
  }
  const float scale = hn::GetLane(hn::MaxOfLanes(d, largest)) / 127.0f;
  const VF s = hn::Set(d, scale), most = hn::Set(d, 127.0f);
  for (int64_t c = 0; c < n; c += N) {
    const int64_t m = std::min(N, n - c);
    const VF in = LoadPart(d, x + c, m, 0.0f), mu = center(c, m);
    const VF diff = hn::Sub(in, mu);
    const VF code = scale > 0 ? hn::Clamp(hn::Round(hn::Div(diff, s)), hn::Neg(most), most) : hn::Zero(d);
    const auto finite = hn::IsFinite(diff);
    StorePart(d, codes ? hn::IfThenElseZero(finite, code) : hn::IfThenElse(finite, hn::MulAdd(code, s, mu), in),
              x + c, m);
  }
  return scale;
}

// int8's center for the keys of (b, hkv): each column's sum over the n_k
// keys of its finite values, divided by n_k (0 where that is not finite),
// at mean (whole vectors, zeros past d). Returns whether every element of K
// is within ±kInt8UnitLimit (the int8 unit takes only those). Any center leaves softmax's
// weights as they are (the scores add it back); the mean makes the
// quantized differences small where keys share an offset, as trained
// models' keys do.
template <class KV>
bool KeyMean(const core::AttentionProblem<float>& p, int64_t b, int64_t hkv, float* mean) {
  const DF d;
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t width = WholeVectors(p.d);
  std::fill(mean, mean + width, 0.0f);
  const VF limit = hn::Set(d, kInt8UnitLimit);
  auto within = hn::FirstN(d, N);
  for (int64_t j = 0; j < p.n_k; ++j) {
    for (int64_t c = 0; c < p.d; c += N) {
      const VF x = LoadKey<KV>(d, p, b, hkv, j, c);
      const auto x_finite = hn::IsFinite(x);
      within = hn::And(within, hn::Le(hn::Abs(x), limit));  // (false for NaN)
      hn::Store(hn::Add(hn::Load(d, mean + c), hn::IfThenElseZero(x_finite, x)), d, mean + c);
    }
  }
  const VF inv = hn::Set(d, p.n_k > 0 ? 1.0f / static_cast<float>(p.n_k) : 0.0f);
  for (int64_t c = 0; c < width; c += N) {
    const VF m = hn::Mul(hn::Load(d, mean + c), inv);
    hn::Store(hn::IfThenElseZero(hn::IsFinite(m), m), d, mean + c);
  }
  return hn::AllTrue(d, within);
}

// Query row x (QuantizeRowInt8's codes, scale s) as the int8 unit's bytes,
// code + 128, in place (x's floats then hold ceil(d / 4) · 4 bytes, 128 past
// d), with its center term s · Σ_c code_c · mean_c (int8_unit.hpp). A
// vector's bytes overwrite only floats already read.
inline void QueryCodes(float* x, int64_t n, float s, const float* mean, float& scale, float& center) {
  const DF d;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint8_t, DF> d8;
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  auto* bytes = reinterpret_cast<uint8_t*>(x);
  VF sum = hn::Zero(d);
  for (int64_t c = 0; c < n; c += N) {
    const VF code = LoadPart(d, x + c, std::min(N, n - c), 0.0f);
    sum = hn::MulAdd(code, hn::Load(d, mean + c), sum);
    hn::StoreU(hn::DemoteTo(d8, hn::Add(hn::ConvertTo(di, code), hn::Set(di, 128))), d8, bytes + c);
  }
  for (int64_t c = n; c < (n + 3) / 4 * 4; ++c) bytes[c] = 128;
  scale = s;
  center = s * hn::GetLane(hn::SumOfLanes(d, sum));
}

// Whether every element of Q is within ±kInt8UnitLimit (the int8 unit
// takes only those).
inline bool QueriesWithinUnitLimit(const core::AttentionProblem<float>& p) {
  const DF d;
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  const VF limit = hn::Set(d, kInt8UnitLimit);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.n_q; ++i) {
        const float* row = p.q.row(b, h, i);
        for (int64_t c = 0; c < p.d; c += N) {
          const VF x = LoadPart(d, row + c, std::min(N, p.d - c), 0.0f);
          if (!hn::AllTrue(d, hn::Le(hn::Abs(x), limit))) return false;  // (false for NaN)
        }
      }
  return true;
}

inline thread_local Scratch<float> tls_int8_keys, tls_int8_key_codes;

// K tile kt of (b, hkv) quantized (QuantizeRowInt8, less `mean`, KeyMean's):
// packed as PackK packs it, or with `unit` as its panel of codes, scales and
// offsets (int8_unit.hpp).
template <class KV>
void PackKInt8(const core::AttentionProblem<float>& p, int64_t b, int64_t hkv, int64_t kt, const float* mean,
               const Int8Unit* unit, float* dst) {
  const DF d;
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t j0 = kt * kBlockK, count = std::min(kBlockK, p.n_k - j0), width = WholeVectors(p.d);
  float* rows = tls_int8_keys.get(static_cast<size_t>(kBlockK * width));
  float scales[kBlockK] = {};
  // int4's keys lie by channel: its tile is widened as a panel first, in
  // dst (PackK), then read key by key: n = 4096, 8 heads of 128, causal, 2
  // threads, AMD EPYC Zen 4, 90 ms, where a gather of each value from its
  // block (LoadKey) took 112 (q4_0 keys: 79-81).
  if constexpr (std::is_same_v<KV, block_int4>) PackK<KV>(p, b, hkv, kt, dst);
  for (int64_t j = 0; j < count; ++j) {
    float* out = rows + j * width;
    if constexpr (std::is_same_v<KV, block_int4>) {
      for (int64_t c = 0; c < width; ++c) out[c] = c < p.d ? dst[c * kBlockK + j] : 0.0f;
    } else {
      for (int64_t c = 0; c < p.d; c += N) hn::Store(LoadKVUpTo(d, KeyRow<KV>(p, b, hkv, j0 + j), c, p.d), d, out + c);
    }
    scales[j] = QuantizeRowInt8(out, p.d, mean, unit != nullptr);
  }
  if constexpr (!std::is_same_v<KV, block_int4>) FetchNextKeys<KV>(p, b, hkv, j0);  // (int4: rows of 32 keys)
  if (!unit) return PackRows(rows, width, count, p.d, dst);
  const int64_t quads = (p.d + 3) / 4;
  auto* codes = reinterpret_cast<int8_t*>(dst);
  auto* t = reinterpret_cast<float*>(codes + quads * kBlockK * 4);
  auto* offsets = reinterpret_cast<int32_t*>(t + kBlockK);
  std::fill(codes, codes + quads * kBlockK * 4, int8_t{0});
  // Each key's codes as bytes (0 past d: its row's padding), then quad by
  // quad into the panel's columns.
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<int8_t, DF> d8;
  int8_t* key_codes = reinterpret_cast<int8_t*>(tls_int8_key_codes.get(static_cast<size_t>(width)));
  std::fill(key_codes + width, key_codes + std::max(width, quads * 4), int8_t{0});  // (vectors of under 4 lanes)
  for (int64_t j = 0; j < kBlockK; ++j) {  // (keys past count: scale and offset 0)
    auto sum = hn::Zero(di);
    if (j < count) {
      for (int64_t c = 0; c < width; c += N) {
        const auto code = hn::ConvertTo(di, hn::Load(d, rows + j * width + c));
        sum = hn::Add(sum, code);
        hn::StoreU(hn::DemoteTo(d8, code), d8, key_codes + c);
      }
      for (int64_t c = 0; c < quads; ++c) std::memcpy(codes + (c * kBlockK + j) * 4, key_codes + 4 * c, 4);
    }
    t[j] = scales[j];
    offsets[j] = 128 * hn::GetLane(hn::SumOfLanes(di, sum));
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::kernels
HWY_AFTER_NAMESPACE();

#endif  // include guard
