// int8 precision's quantization (docs/semantics.md "Precision"), as the
// products see it: each query row, and each key row less the mean of its
// (batch, kv head)'s keys, rounded to int8 codes with one scale per row and
// handed to the float32 products dequantized. The codes times the scale are
// integers times one float, so float32 FMAs on them compute what an int8
// unit's integer sums, scaled once, would. Highway's per-target include:
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

#include "kernels/scratch.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::detail {
namespace HWY_NAMESPACE {

// Row x of n floats, in place, as mean + s · round((x − mean) / s) (ties to
// even), s = max |x − mean| / 127 over the row's finite differences, so
// each code is an int8 in [-127, 127]; mean null: 0. An element whose
// difference is not finite (NaN, ±inf, overflow) stays as it was, so it
// spoils its own products only, as in float32; a row with s = 0 (all its
// differences 0, or below 127 times the smallest float) becomes its mean.
inline void QuantizeRowInt8(float* x, int64_t n, const float* mean) {
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
  const VF s = hn::Set(d, scale);
  for (int64_t c = 0; c < n; c += N) {
    const int64_t m = std::min(N, n - c);
    const VF in = LoadPart(d, x + c, m, 0.0f), mu = center(c, m);
    const VF diff = hn::Sub(in, mu);
    const VF code = scale > 0 ? hn::Round(hn::Div(diff, s)) : hn::Zero(d);
    StorePart(d, hn::IfThenElse(hn::IsFinite(diff), hn::MulAdd(code, s, mu), in), x + c, m);
  }
}

// int8's center for the keys of (b, hkv): each column's sum over the n_k
// keys of its finite values, divided by n_k (0 where that is not finite),
// at mean (whole vectors, zeros past d). Any center leaves softmax's
// weights as they are (the scores add it back); the mean makes the
// quantized differences small where keys share an offset, as trained
// models' keys do.
template <class KV>
void KeyMean(const AttentionProblem<float>& p, int64_t b, int64_t hkv, float* mean) {
  const DF d;
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t width = WholeVectors(p.d);
  std::fill(mean, mean + width, 0.0f);
  for (int64_t j = 0; j < p.n_k; ++j) {
    const KV* row = KeyRow<KV>(p, b, hkv, j);
    for (int64_t c = 0; c < p.d; c += N) {
      const VF x = c + N <= p.d ? LoadKV(d, row, c) : LoadKVPart(d, row, c, p.d - c);
      hn::Store(hn::Add(hn::Load(d, mean + c), hn::IfThenElseZero(hn::IsFinite(x), x)), d, mean + c);
    }
  }
  const VF inv = hn::Set(d, p.n_k > 0 ? 1.0f / static_cast<float>(p.n_k) : 0.0f);
  for (int64_t c = 0; c < width; c += N) {
    const VF m = hn::Mul(hn::Load(d, mean + c), inv);
    hn::Store(hn::IfThenElseZero(hn::IsFinite(m), m), d, mean + c);
  }
}

inline thread_local Scratch<float> tls_int8_keys;

// K tile kt of (b, hkv) quantized (QuantizeRowInt8, less `mean`, KeyMean's)
// and packed as PackK packs it.
template <class KV>
void PackKInt8(const AttentionProblem<float>& p, int64_t b, int64_t hkv, int64_t kt, const float* mean,
               float* dst) {
  const DF d;
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t j0 = kt * kBlockK, count = std::min(kBlockK, p.n_k - j0), width = WholeVectors(p.d);
  float* rows = tls_int8_keys.get(static_cast<size_t>(kBlockK * width));
  for (int64_t j = 0; j < count; ++j) {
    const KV* in = KeyRow<KV>(p, b, hkv, j0 + j);
    float* out = rows + j * width;
    for (int64_t c = 0; c < p.d; c += N)
      hn::Store(c + N <= p.d ? LoadKV(d, in, c) : LoadKVPart(d, in, c, p.d - c), d, out + c);
    QuantizeRowInt8(out, p.d, mean);
  }
  PackRows(rows, width, count, p.d, dst);
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::detail
HWY_AFTER_NAMESPACE();

#endif  // include guard
