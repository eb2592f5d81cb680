// float32 attention, flash style: tiles of queries × keys with an online
// softmax, so memory grows with n, never n².
//
// Per (batch, kv head, query tile) work item, for each query head sharing the
// kv head (GQA), each key tile in the causal/window range, and each block of
// kBlockRows query rows that the tile does not mask wholly:
//   S = scale·log2(e) · Q Kᵀ    register-blocked: kRows query rows × kVecs
//                                vectors of keys, K pre-packed transposed
//                                ([tile][d][key]) so keys are contiguous lanes
//   S → softcap, masks          only on blocks that need it
//   m' = max(m, rowmax S); P = 2^(S − m'); l = l·2^(m−m') + rowsum P;
//   O = O·2^(m−m') + P V        register-blocked: kRows rows × kVecs vectors
//                                of value columns, V read in place
// and finally out = O / l (0 for a row with no allowed key). Base 2 makes
// every exponential a cheap 2^x (exp2-inl.h); it is the same softmax.
//
// Loop order: the key tile is outer and the row blocks inner, so the K tile
// (d·kBlockK·4 = 16 KiB at d = 64) and the V tile stay in cache while all
// kBlockQ rows pass over them, and S is a 2 KiB block, never a whole tile.
// (Measured on Zen 5, n = 4096: 256-row items reach 72% of the FMA peak,
// 128 rows 66%, 64 rows 66%, 32 rows 63%.) Tiles and row blocks
// wholly outside the causal or window range are skipped; work items start
// with the most expensive query tiles so the causal triangle balances across
// threads. Items and the order of arithmetic inside them do not depend on the
// thread count, so results are bitwise equal for any number of threads.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/flash_attention.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <hwy/aligned_allocator.h>
#include <hwy/cache_control.h>
#include <hwy/contrib/math/math-inl.h>

#include "kernels/exp2-inl.h"
#include "kernels/matmul-inl.h"

#include <algorithm>
#include <cstring>
#include <cmath>
#include <limits>

#include "attn/half.hpp"
#include "kernels/attention_kernel.hpp"
#include "kernels/scratch.hpp"
#include "thread_pool.hpp"

#ifndef ATTN_FLASH_ONCE
#define ATTN_FLASH_ONCE
namespace attn::detail {
// Tile sizes (all targets). A key tile is one panel of matmul-inl.h (64).
constexpr int64_t kBlockQ = 256;
constexpr int64_t kBlockK = 64;
// Decode (few queries, long cache): keys are split into chunks of this many,
// processed in parallel and merged exactly; fixed, so results do not depend
// on the thread count.
constexpr int64_t kDecodeChunk = 512;
}  // namespace attn::detail
#endif

HWY_BEFORE_NAMESPACE();
namespace attn::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
static_assert(kBlockK == kPanel, "a key tile is one packed matmul panel");

// Scores are kept in base-2 units, S·log2(e), so every exponential is a
// cheap 2^x (exp2-inl.h): e^(s − m) = 2^((s − m)·log2(e)). The factor rides
// on the scale (or on the softcap, which must see the natural scores) and
// on additive masks; running maxima are in the same units.

// x·log2(e) in float32, saturating: a finite value stays finite (an additive
// mask of -FLT_MAX, PyTorch's finfo.min padding, must not become -inf).
inline float Base2(double x) {
  const double y = x * 1.44269504088896341;
  const double max = std::numeric_limits<float>::max();
  return static_cast<float>(std::isfinite(x) ? std::clamp(y, -max, max) : y);
}
inline float ScoreScale(const AttentionProblem<float>& p) {
  return p.softcap > 0 ? static_cast<float>(p.scale) : Base2(p.scale);
}

// Keys and values may be stored as float32, bfloat16 or fp16; arithmetic is
// float32 (a 16-bit load is promoted).
inline float ToFloat(float x) { return x; }
// (hwy::float16_t is a struct on x86 and the compiler's __fp16 on Arm: go by bits.)
template <class H>
inline uint16_t Bits(H x) {
  uint16_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}
inline float ToFloat(hwy::bfloat16_t x) { return bf16_to_float(Bits(x)); }
inline float ToFloat(hwy::float16_t x) { return fp16_to_float(Bits(x)); }

// fp16 lanes promoted to float32. Highway 1.0.3 emulates the conversion on
// targets without F16C (SSSE3, SSE4, scalar) by rebiasing the exponent, which
// turns inf and NaN (exponent 31) into finite numbers near 65536; those lanes
// are rebuilt from their bits there. Targets with a native conversion need
// nothing.
template <class D16>
HWY_INLINE VF PromoteF16(DF d, hn::Vec<D16> h) {
  const VF f = hn::PromoteTo(d, h);
#if (HWY_ARCH_X86 && HWY_TARGET >= HWY_SSE4) || HWY_TARGET == HWY_SCALAR || \
    HWY_TARGET == HWY_EMU128 || defined(HWY_DISABLE_F16C)
  const hn::RebindToUnsigned<DF> du;
  const auto bits = hn::PromoteTo(du, hn::BitCast(hn::RebindToUnsigned<D16>(), h));
  const auto exponent = hn::Set(du, 0x7C00);
  const auto special = hn::Eq(hn::And(bits, exponent), exponent);
  const auto sign = hn::ShiftLeft<16>(hn::And(bits, hn::Set(du, 0x8000)));
  const auto mantissa = hn::ShiftLeft<13>(hn::And(bits, hn::Set(du, 0x3FF)));
  const auto inf_or_nan = hn::Or(sign, hn::Or(hn::Set(du, 0x7F800000), mantissa));
  return hn::IfThenElse(hn::RebindMask(d, special), hn::BitCast(d, inf_or_nan), f);
#else
  return f;
#endif
}

template <class KV>
HWY_INLINE VF LoadKV(DF d, const KV* p) {
  if constexpr (std::is_same_v<KV, float>) {
    return hn::LoadU(d, p);
  } else if constexpr (std::is_same_v<KV, hwy::float16_t>) {
    return PromoteF16<hn::Rebind<KV, DF>>(d, hn::LoadU(hn::Rebind<KV, DF>(), p));
  } else {
    return hn::PromoteTo(d, hn::LoadU(hn::Rebind<KV, DF>(), p));
  }
}

// The first n < lanes values at p as floats, zero-padded. (MaskedLoad would
// do, but on some targets it reads the whole vector, past the end of the
// array.)
template <class KV>
HWY_INLINE VF LoadTail(DF d, const KV* p, int64_t n) {
  alignas(HWY_MAX_BYTES) float buf[HWY_MAX_BYTES / sizeof(float)] = {};
  for (int64_t i = 0; i < n; ++i) buf[i] = ToFloat(p[i]);
  return hn::Load(d, buf);
}

// o[r][0 .. NV·N) += Σ_j p[r][j] · v_j[0 .. NV·N) for r < MR, j < count
// (row r of p starts at p + r · p_stride).
template <int MR, int NV, class KV>
HWY_INLINE void ValueBlock(DF d, const float* p, int64_t p_stride, int64_t count,
                           const KV* v0, int64_t v_stride, float* o, int64_t o_stride) {
  const size_t N = hn::Lanes(d);
#if HWY_HAVE_SCALABLE
  // Sizeless (SVE, RVV) vectors cannot form arrays: one accumulator at a time.
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) {
      VF acc = hn::Load(d, o + r * o_stride + v * N);
      for (int64_t j = 0; j < count; ++j)
        acc = hn::MulAdd(hn::Set(d, p[r * p_stride + j]), LoadKV(d, v0 + j * v_stride + v * N), acc);
      hn::Store(acc, d, o + r * o_stride + v * N);
    }
#else
  VF acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = hn::Load(d, o + r * o_stride + v * N);
  for (int64_t j = 0; j < count; ++j) {
    VF vv[NV];
    for (int v = 0; v < NV; ++v) vv[v] = LoadKV(d, v0 + j * v_stride + v * N);
    for (int r = 0; r < MR; ++r) {
      const VF pb = hn::Set(d, p[r * p_stride + j]);
      for (int v = 0; v < NV; ++v) acc[r][v] = hn::MulAdd(pb, vv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) hn::Store(acc[r][v], d, o + r * o_stride + v * N);
#endif
}

// The same for the last value columns [c, d_v) that do not fill kVecs vectors:
// one vector at a time, loads masked to the real columns.
template <class KV>
HWY_INLINE void ValueTail(DF d, int rows, const float* p, int64_t p_stride, int64_t count,
                          const KV* v0, int64_t v_stride, int64_t c, int64_t d_v, float* o,
                          int64_t o_stride) {
  const size_t N = hn::Lanes(d);
  for (; c < d_v; c += static_cast<int64_t>(N)) {
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(N), d_v - c);
    for (int r = 0; r < rows; ++r) {
      VF acc = hn::Load(d, o + r * o_stride + c);
      for (int64_t j = 0; j < count; ++j)
        acc = hn::MulAdd(hn::Set(d, p[r * p_stride + j]), LoadTail(d, v0 + j * v_stride + c, n), acc);
      hn::Store(acc, d, o + r * o_stride + c);
    }
  }
}

template <int MR, class KV>
HWY_INLINE void ValueRows(DF d, const float* p, int64_t p_stride, int64_t count, const KV* v0,
                          int64_t v_stride, int64_t d_v, float* o, int64_t o_stride) {
  // A single row (decode) has registers for twice the columns: half the
  // passes over V, twice the independent accumulators per key.
  constexpr int NV = MR == 1 ? 2 * kVecs : kVecs;
  const int64_t W = NV * static_cast<int64_t>(hn::Lanes(d));
  int64_t c = 0;
  for (; c + W <= d_v; c += W)
    ValueBlock<MR, NV>(d, p, p_stride, count, v0 + c, v_stride, o + c, o_stride);
  if constexpr (MR == 1) {
    if (c + W / 2 <= d_v) {
      ValueBlock<MR, kVecs>(d, p, p_stride, count, v0 + c, v_stride, o + c, o_stride);
      c += W / 2;
    }
  }
  if (c < d_v) ValueTail(d, MR, p, p_stride, count, v0, v_stride, c, d_v, o, o_stride);
}

// O (rows × o_stride) += P (rows × count, row stride p_stride) · V rows.
template <class KV>
void AccumulateValues(DF d, int64_t rows, const float* p, int64_t p_stride, int64_t count,
                      const KV* v0, int64_t v_stride, int64_t d_v, float* o, int64_t o_stride) {
  for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
    const float* pr = p + r0 * p_stride;
    float* orow = o + r0 * o_stride;
    WithRows(std::min<int64_t>(kRows, rows - r0), [&](auto mr) HWY_ATTR {
      ValueRows<decltype(mr)::value>(d, pr, p_stride, count, v0, v_stride, d_v, orow, o_stride);
    });
  }
}

// Masks keys j0 .. j0 + count of query row i (head h) in s: -inf outside the
// causal/window range (when check_range), then the explicit masks.
void MaskRow(const AttentionProblem<float>& p, int64_t b, int64_t h, int64_t i, int64_t j0,
             int64_t count, bool check_range, float* s) {
  const float ninf = -std::numeric_limits<float>::infinity();
  if (check_range) {
    const KeyRange kr = allowed_keys(i, p.n_q, p.n_k, p.causal, p.window);
    const int64_t a = std::clamp(kr.begin - j0, int64_t{0}, count);
    const int64_t z = std::clamp(kr.end - j0, a, count);
    std::fill(s, s + a, ninf);
    std::fill(s + z, s + count, ninf);
  }
  for (const MaskTerm& m : p.mask.terms) {
    if (m.f32) {
      const float* mr = m.f32.row(b, h, i) + j0 * m.f32.col_stride;
      for (int64_t j = 0; j < count; ++j) s[j] += Base2(mr[j * m.f32.col_stride]);
    } else if (m.f64) {
      const double* mr = m.f64.row(b, h, i) + j0 * m.f64.col_stride;
      for (int64_t j = 0; j < count; ++j) s[j] += Base2(mr[j * m.f64.col_stride]);
    }
  }
  // After the additive masks, so that an excluded key is -inf whatever was added.
  for (const MaskTerm& m : p.mask.terms)
    if (m.boolean) {
      const bool* mr = m.boolean.row(b, h, i) + j0 * m.boolean.col_stride;
      for (int64_t j = 0; j < count; ++j)
        if (mr[j * m.boolean.col_stride] == m.blocking) s[j] = ninf;
    }
}

// softcap · tanh(s / softcap) over n entries (n a multiple of the lanes), in
// base-2 units.
void Softcap(DF d, double softcap, float* s, int64_t n) {
  const VF cap = hn::Set(d, Base2(softcap));
  const VF inv = hn::Set(d, static_cast<float>(1.0 / softcap));
  for (int64_t e = 0; e < n; e += static_cast<int64_t>(hn::Lanes(d)))
    hn::Store(hn::Mul(cap, hn::Tanh(d, hn::Mul(hn::Load(d, s + e), inv))), d, s + e);
}

// P·V multiplies every key of a tile by its weight, and an excluded key's
// weight is 0; a NaN or infinite value in its row still gives 0·NaN = NaN. So
// a row that comes out with a NaN is computed again the slow way
// (reference_attention_row, which never reads an excluded key), and keeps a
// NaN only if it has one of its own. Rows with NaN are rare, and checking
// d_v outputs costs nothing next to the row's n_k·(d + d_v) products.
inline void SettleNanRow(const AttentionProblem<float>& p, int64_t b, int64_t h, int64_t i,
                         float* out) {
  for (int64_t c = 0; c < p.d_v; ++c)
    if (std::isnan(out[c])) return reference_attention_row(p, b, h, i, out);
}

// Everything one work item needs to see.
struct Item {
  const AttentionProblem<float>& p;
  const float* kpack;  // this (batch, kv head)'s packed K tiles
  int64_t b, hkv, i0, rows;
};

// Query rows per block of the tile loop.
constexpr int kBlockRows = 8;
static_assert(kBlockQ % kBlockRows == 0 && kBlockRows % kRows == 0);

// kBlockRows query rows of an item, i0 + r0 .. i0 + r0 + rows - 1, and the keys
// allowed to its first and last rows (ranges move right with the row, so
// these bound the whole block).
struct RowBlock {
  int64_t r0;
  int rows;
  KeyRange first, last;

  // Whether causal/window ranges mask keys j0 .. j0 + count - 1 wholly.
  bool masks_all(int64_t j0, int64_t count) const {
    return j0 >= last.end || j0 + count <= first.begin;
  }
  // Whether they allow all kBlockK keys from j0 for every row.
  bool allows_all(int64_t j0, int64_t count) const {
    return count == kBlockK && j0 >= last.begin && j0 + kBlockK <= first.end;
  }
};

// S = masked, softcapped scores of row block rb (head h) against key tile kt;
// row r at s + r · kBlockK.
void Scores(DF d, const Item& it, int64_t h, int64_t kt, const RowBlock& rb, float* s) {
  const auto& p = it.p;
  const int64_t j0 = kt * kBlockK, jn = std::min(kBlockK, p.n_k - j0);
  const int64_t i0 = it.i0 + rb.r0;
  const float* q[kRows];
  for (int r0 = 0; r0 < rb.rows; r0 += kRows) {
    const int rows = std::min(kRows, rb.rows - r0);
    for (int r = 0; r < rows; ++r) q[r] = p.q.row(it.b, h, i0 + r0 + r);
    MatmulPanel(d, q, rows, p.d, it.kpack + kt * p.d * kBlockK, ScoreScale(p), s + r0 * kBlockK,
                kBlockK);
  }
  if (p.softcap > 0) Softcap(d, p.softcap, s, rb.rows * kBlockK);
  const bool inside = rb.allows_all(j0, jn);
  if (inside && !p.mask.present()) return;
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int r = 0; r < rb.rows; ++r) {
    float* sr = s + r * kBlockK;
    std::fill(sr + jn, sr + kBlockK, ninf);  // keys past n_k
    MaskRow(p, it.b, h, i0 + r, j0, jn, !inside, sr);
  }
}

// Online softmax of one row of S (base-2 units) against running max m and
// sum l: turns the row into P = 2^(S - m') and returns the factor 2^(m - m')
// that rescales the row's accumulated output (1 when nothing changes).
// n is a multiple of the lanes. The sum is kept per lane (l points at one
// vector, aligned) and reduced once at the end: no horizontal sum per tile.
// Edge cases (README "Edge cases"): a NaN logit makes P, and so l, NaN for
// good (the row comes out NaN); +inf logits share the weight equally, the
// softmax's limit.
HWY_INLINE float SoftmaxStep(DF d, float* s, int64_t n, float& m, float* l) {
  const size_t N = hn::Lanes(d);
  const float ninf = -std::numeric_limits<float>::infinity();
  VF vmax = hn::Load(d, s);
  for (int64_t j = static_cast<int64_t>(N); j < n; j += static_cast<int64_t>(N))
    vmax = hn::Max(vmax, hn::Load(d, s + j));
  // (Max may drop a NaN lane or keep it; a kept one must not lose to m.)
  const float tile_max = hn::GetLane(hn::MaxOfLanes(d, vmax));
  const float m_new = std::isnan(tile_max) ? tile_max : std::max(m, tile_max);
  if (m_new == ninf || m_new == std::numeric_limits<float>::infinity()) {
    // The rare rows: 2^(s - m') would be 2^(-inf + inf) or 2^(inf - inf). A
    // NaN logit there is not carried by 2^x: mark l by hand.
    auto nan = hn::FirstN(d, 0);
    for (int64_t j = 0; j < n; j += static_cast<int64_t>(N)) nan = hn::Or(nan, hn::IsNaN(hn::Load(d, s + j)));
    if (!hn::AllFalse(d, nan)) {
      std::fill(s, s + n, 0.0f);
      hn::Store(hn::Set(d, std::numeric_limits<float>::quiet_NaN()), d, l);
      return 1.0f;
    }
    if (m_new == ninf) {  // nothing allowed yet
      std::fill(s, s + n, 0.0f);
      return 1.0f;
    }
    // +inf logits: count them
    float count = 0;
    for (int64_t j = 0; j < n; ++j) count += s[j] = s[j] == m_new ? 1.0f : 0.0f;
    const float alpha = m == m_new ? 1.0f : 0.0f;
    hn::Store(hn::Mul(hn::Load(d, l), hn::Set(d, alpha)), d, l);
    l[0] += count;
    m = m_new;
    return alpha;
  }
  const VF vm = hn::Set(d, m_new);
  VF sum = hn::Zero(d);
  for (int64_t j = 0; j < n; j += static_cast<int64_t>(N)) {
    const VF e = Exp2NonPositive(d, hn::Sub(hn::Load(d, s + j), vm));
    hn::Store(e, d, s + j);
    sum = hn::Add(sum, e);
  }
  const float alpha = m == m_new ? 1.0f : hn::GetLane(Exp2NonPositive(d, hn::Set(d, m - m_new)));
  hn::Store(hn::MulAdd(hn::Load(d, l), hn::Set(d, alpha), sum), d, l);
  m = m_new;
  return alpha;
}

// 2^(x - m) for x <= m (base-2 scores), and 1 for x = m = +inf (not 2^NaN).
inline float ExpDifference(float x, float m) { return x == m ? 1.0f : std::exp2(x - m); }

thread_local Scratch<float> tls_scores, tls_out, tls_vtile, tls_sums;

void ProcessItem(DF d, const Item& it) {
  const auto& p = it.p;
  const size_t N = hn::Lanes(d);
  const int64_t dvp = (p.d_v + static_cast<int64_t>(N) - 1) / static_cast<int64_t>(N) * static_cast<int64_t>(N);
  float* s = tls_scores.get(kBlockRows * kBlockK);
  float* o = tls_out.get(static_cast<size_t>(kBlockQ * std::max<int64_t>(dvp, 1)));
  float* vtile = tls_vtile.get(static_cast<size_t>(kBlockK * std::max<int64_t>(p.d_v, 1)));
  const int64_t n_tiles = (p.n_k + kBlockK - 1) / kBlockK;
  const KeyRange first = allowed_keys(it.i0, p.n_q, p.n_k, p.causal, p.window);
  const KeyRange last = allowed_keys(it.i0 + it.rows - 1, p.n_q, p.n_k, p.causal, p.window);
  const int64_t t_begin = first.begin / kBlockK;
  const int64_t t_end = std::min(n_tiles, (last.end + kBlockK - 1) / kBlockK);
  float m[kBlockQ], l[kBlockQ];
  float* l_lanes = tls_sums.get(static_cast<size_t>(kBlockQ) * N);  // per-lane sums
  const float ninf = -std::numeric_limits<float>::infinity();
  RowBlock blocks[kBlockQ / kBlockRows];
  for (int64_t r0 = 0; r0 < it.rows; r0 += kBlockRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kBlockRows, it.rows - r0));
    blocks[r0 / kBlockRows] = {r0, rows, allowed_keys(it.i0 + r0, p.n_q, p.n_k, p.causal, p.window),
                          allowed_keys(it.i0 + r0 + rows - 1, p.n_q, p.n_k, p.causal, p.window)};
  }

  for (int64_t g = 0; g < p.group(); ++g) {
    const int64_t h = it.hkv * p.group() + g;
    std::fill(m, m + it.rows, ninf);
    std::fill(l_lanes, l_lanes + it.rows * N, 0.0f);
    std::fill(o, o + it.rows * dvp, 0.0f);
    // Key tile outer, row blocks inner (see the top of the file).
    for (int64_t kt = t_begin; kt < t_end; ++kt) {
      const int64_t j0 = kt * kBlockK, jn = std::min(kBlockK, p.n_k - j0);
      const float* v0 = p.v.row(it.b, it.hkv, j0);
      int64_t v_stride = p.v.row_stride;
      if (v_stride != p.d_v) {
        // Rows far apart (heads sliced from one wide array) share few cache
        // sets; a contiguous copy keeps the tile in L1 for all row blocks.
        for (int64_t j = 0; j < jn; ++j) std::copy(v0 + j * v_stride, v0 + j * v_stride + p.d_v, vtile + j * p.d_v);
        v0 = vtile;
        v_stride = p.d_v;
      }
      for (int64_t r0 = 0; r0 < it.rows; r0 += kBlockRows) {
        const RowBlock& rb = blocks[r0 / kBlockRows];
        if (rb.masks_all(j0, jn)) continue;
        Scores(d, it, h, kt, rb, s);
        const int rows = rb.rows;
        for (int r = 0; r < rows; ++r) {
          float* orow = o + (r0 + r) * dvp;
          const float alpha = SoftmaxStep(d, s + r * kBlockK, kBlockK, m[r0 + r], l_lanes + (r0 + r) * N);
          if (alpha != 1.0f) {
            const VF a = hn::Set(d, alpha);
            for (int64_t c = 0; c < dvp; c += static_cast<int64_t>(N))
              hn::Store(hn::Mul(hn::Load(d, orow + c), a), d, orow + c);
          }
        }
        AccumulateValues(d, rows, s, kBlockK, jn, v0, v_stride, p.d_v, o + r0 * dvp, dvp);
      }
    }
    for (int64_t r = 0; r < it.rows; ++r) {
      l[r] = hn::GetLane(hn::SumOfLanes(d, hn::Load(d, l_lanes + r * N)));
      float* out = p.out.row(it.b, h, it.i0 + r);
      const float inv = l[r] == 0 ? 0.0f : 1.0f / l[r];  // l NaN: the row is NaN
      for (int64_t c = 0; c < p.d_v; ++c) out[c] = o[r * dvp + c] * inv;
      SettleNanRow(p, it.b, h, it.i0 + r, out);
    }
    if (!p.weights) continue;
    // Weights: a second sweep now that each row's max and sum are final.
    for (int64_t r = 0; r < it.rows; ++r) {
      float* w = p.weights.row(it.b, h, it.i0 + r);
      const float outside = std::isnan(l[r]) ? l[r] : 0.0f;  // a NaN row is NaN throughout
      for (int64_t j = 0; j < p.n_k; ++j) w[j * p.weights.col_stride] = outside;
    }
    for (int64_t kt = t_begin; kt < t_end; ++kt) {
      const int64_t j0 = kt * kBlockK, jn = std::min(kBlockK, p.n_k - j0);
      for (int64_t r0 = 0; r0 < it.rows; r0 += kBlockRows) {
        const RowBlock& rb = blocks[r0 / kBlockRows];
        if (rb.masks_all(j0, jn)) continue;
        Scores(d, it, h, kt, rb, s);
        for (int r = 0; r < rb.rows; ++r) {
          const int64_t i = r0 + r;
          if (l[i] == 0) continue;
          float* w = p.weights.row(it.b, h, it.i0 + i);
          const float inv = 1.0f / l[i];
          for (int64_t j = 0; j < jn; ++j)
            w[(j0 + j) * p.weights.col_stride] = ExpDifference(s[r * kBlockK + j], m[i]) * inv;
        }
      }
    }
  }
}

// K tile kt of (b, hkv), transposed: dst[c * kBlockK + j] = k[j0 + j][c]; keys
// past n_k are zero (their scores are masked anyway).
void PackK(const AttentionProblem<float>& p, int64_t b, int64_t hkv, int64_t kt, float* dst) {
  const int64_t j0 = kt * kBlockK, jn = std::min(kBlockK, p.n_k - j0);
  for (int64_t j = 0; j < jn; ++j) {
    const float* k = p.k.row(b, hkv, j0 + j);
    for (int64_t c = 0; c < p.d; ++c) dst[c * kBlockK + j] = k[c];
  }
  for (int64_t c = 0; c < p.d; ++c) std::fill(dst + c * kBlockK + jn, dst + (c + 1) * kBlockK, 0.0f);
}

thread_local Scratch<float> tls_kpack, tls_k32, tls_v32;

// 16-bit keys/values converted once to float32 rows (O(n) work, against the
// O(n²) of the attention itself), as an operand over `dst`.
template <class KV>
Operand<const float> Widen(const AttentionProblem<float>& p, const Operand<const uint16_t>& src,
                           int64_t width, float* dst) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t rows = p.batch * p.heads_kv * p.n_k;
  parallel_for((rows + 255) / 256, [&](int64_t block) {
    for (int64_t r = block * 256; r < std::min(rows, (block + 1) * 256); ++r) {
      const int64_t bh = r / p.n_k;
      const KV* in = reinterpret_cast<const KV*>(src.row(bh / p.heads_kv, bh % p.heads_kv, r % p.n_k));
      float* out = dst + r * width;
      int64_t c = 0;
      for (; c + N <= width; c += N) hn::StoreU(LoadKV(d, in + c), d, out + c);
      for (; c < width; ++c) out[c] = ToFloat(in[c]);
    }
  });
  Operand<const float> o;
  o.data = dst;
  o.batch_offset.resize(static_cast<size_t>(p.batch));
  for (int64_t b = 0; b < p.batch; ++b) o.batch_offset[b] = b * p.heads_kv * p.n_k * width;
  o.head_stride = p.n_k * width;
  o.row_stride = width;
  o.col_stride = 1;
  return o;
}

void FlashForward(const AttentionProblem<float>& p_in) {
  if (p_in.kv != KVStorage::Native) {
    AttentionProblem<float> p = p_in;
    const auto size = [&](int64_t w) { return static_cast<size_t>(std::max<int64_t>(p.batch * p.heads_kv * p.n_k * w, 1)); };
    float* k = tls_k32.get(size(p.d));
    float* v = tls_v32.get(size(p.d_v));
    if (p.kv == KVStorage::BF16) {
      p.k = Widen<hwy::bfloat16_t>(p, p.k16, p.d, k);
      p.v = Widen<hwy::bfloat16_t>(p, p.v16, p.d_v, v);
    } else {
      p.k = Widen<hwy::float16_t>(p, p.k16, p.d, k);
      p.v = Widen<hwy::float16_t>(p, p.v16, p.d_v, v);
    }
    p.kv = KVStorage::Native;
    return FlashForward(p);
  }
  const AttentionProblem<float>& p = p_in;
  const DF d;
  const int64_t n_tiles = (p.n_k + kBlockK - 1) / kBlockK;
  const int64_t head_pack = n_tiles * p.d * kBlockK;
  const int64_t heads = p.batch * p.heads_kv;
  float* kpack = tls_kpack.get(static_cast<size_t>(std::max<int64_t>(heads * head_pack, 1)));
  parallel_for(heads * n_tiles, [&](int64_t item) {
    const int64_t bh = item / n_tiles, kt = item % n_tiles;
    PackK(p, bh / p.heads_kv, bh % p.heads_kv, kt, kpack + bh * head_pack + kt * p.d * kBlockK);
  });
  // The most expensive (last, under causal masking) query tiles go first.
  const int64_t n_qt = (p.n_q + kBlockQ - 1) / kBlockQ;
  parallel_for(heads * n_qt, [&](int64_t item) {
    const int64_t qt = n_qt - 1 - item / heads, bh = item % heads;
    const int64_t i0 = qt * kBlockQ;
    const Item it{p, kpack + bh * head_pack, bh / p.heads_kv, bh % p.heads_kv, i0,
                  std::min(kBlockQ, p.n_q - i0)};
    ProcessItem(d, it);
  });
}


// ---------------------------------------------------------------------------
// Decode: a few query rows against a long key/value cache (flash-decoding).
// Each (batch, kv head, key chunk) item reads its K and V rows once, in place,
// for every query row of the group, and leaves a partial result (row max m,
// sum l, unnormalised output); a merge per (batch, kv head) combines the
// chunks in order: M = max m_c, out = Σ e^(m_c − M) O_c / Σ e^(m_c − M) l_c.

// Row j of K or V of (b, hkv), in its storage type, and the row stride.
template <class KV>
const KV* KeyRow(const AttentionProblem<float>& p, int64_t b, int64_t h, int64_t j) {
  if constexpr (std::is_same_v<KV, float>) return p.k.row(b, h, j);
  else return reinterpret_cast<const KV*>(p.k16.row(b, h, j));
}
template <class KV>
const KV* ValueRow(const AttentionProblem<float>& p, int64_t b, int64_t h, int64_t j) {
  if constexpr (std::is_same_v<KV, float>) return p.v.row(b, h, j);
  else return reinterpret_cast<const KV*>(p.v16.row(b, h, j));
}
inline int64_t ValueStride(const AttentionProblem<float>& p) {
  return p.kv == KVStorage::Native ? p.v.row_stride : p.v16.row_stride;
}

// s[r · s_stride] = scale · q_r · k for r < MR.
template <int MR, class KV>
HWY_INLINE void DotRows(DF d, const float* const* q, const KV* k, int64_t D, float scale,
                        float* s, int64_t s_stride) {
  const size_t N = hn::Lanes(d);
  const int64_t full = D / static_cast<int64_t>(N) * static_cast<int64_t>(N);
#if HWY_HAVE_SCALABLE
  // Sizeless (SVE, RVV) vectors cannot form arrays: one row at a time.
  for (int r = 0; r < MR; ++r) {
    VF acc = hn::Zero(d);
    for (int64_t c = 0; c < full; c += static_cast<int64_t>(N))
      acc = hn::MulAdd(hn::LoadU(d, q[r] + c), LoadKV(d, k + c), acc);
    if (full < D) acc = hn::MulAdd(LoadTail(d, q[r] + full, D - full), LoadTail(d, k + full, D - full), acc);
    s[r * s_stride] = hn::GetLane(hn::SumOfLanes(d, acc)) * scale;
  }
#else
  // Two accumulators per row halve the chain of FMAs a key's score waits on:
  // more keys, and so more memory reads, in flight.
  VF acc[MR], acc2[MR];
  for (int r = 0; r < MR; ++r) acc[r] = acc2[r] = hn::Zero(d);
  int64_t c = 0;
  for (; c + 2 * static_cast<int64_t>(N) <= full; c += 2 * static_cast<int64_t>(N)) {
    const VF kv = LoadKV(d, k + c), kv2 = LoadKV(d, k + c + N);
    for (int r = 0; r < MR; ++r) {
      acc[r] = hn::MulAdd(hn::LoadU(d, q[r] + c), kv, acc[r]);
      acc2[r] = hn::MulAdd(hn::LoadU(d, q[r] + c + N), kv2, acc2[r]);
    }
  }
  for (; c < full; c += static_cast<int64_t>(N)) {
    const VF kv = LoadKV(d, k + c);
    for (int r = 0; r < MR; ++r) acc[r] = hn::MulAdd(hn::LoadU(d, q[r] + c), kv, acc[r]);
  }
  for (int r = 0; r < MR; ++r) acc[r] = hn::Add(acc[r], acc2[r]);
  if (full < D) {
    const VF kv = LoadTail(d, k + full, D - full);
    for (int r = 0; r < MR; ++r) acc[r] = hn::MulAdd(LoadTail(d, q[r] + full, D - full), kv, acc[r]);
  }
  for (int r = 0; r < MR; ++r) s[r * s_stride] = hn::GetLane(hn::SumOfLanes(d, acc[r])) * scale;
#endif
}

thread_local Scratch<float> tls_decode_scores;
thread_local Scratch<const float*> tls_decode_queries;

// Partial result of one chunk for R rows: O[R][dvp] (aligned), then m[R], l[R].
template <class KV>
void DecodeChunk(DF d, const AttentionProblem<float>& p, int64_t b, int64_t hkv, int64_t chunk,
                 int64_t dvp, float* part) {
  const int64_t R = p.group() * p.n_q;
  float* o = part;
  float* m = part + R * dvp;
  float* l = m + R;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  alignas(HWY_MAX_BYTES) float l_lanes[HWY_MAX_BYTES / sizeof(float)];
  const float ninf = -std::numeric_limits<float>::infinity();
  std::fill(m, m + R, ninf);
  std::fill(l, l + R, 0.0f);
  std::fill(o, o + R * dvp, 0.0f);
  const int64_t j0 = chunk * kDecodeChunk, jn = std::min(kDecodeChunk, p.n_k - j0);
  // The chunk's place in the rows' causal/window ranges (monotone in the row).
  const KeyRange first = allowed_keys(0, p.n_q, p.n_k, p.causal, p.window);
  const KeyRange last = allowed_keys(p.n_q - 1, p.n_q, p.n_k, p.causal, p.window);
  if (j0 >= last.end || j0 + jn <= first.begin) return;
  const bool inside = j0 >= last.begin && j0 + jn <= first.end;

  float* s = tls_decode_scores.get(static_cast<size_t>(R * kDecodeChunk));
  const auto row_head = [&](int64_t r) { return hkv * p.group() + r / p.n_q; };
  const float** q = tls_decode_queries.get(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) q[r] = p.q.row(b, row_head(r), r % p.n_q);
  const float scale = ScoreScale(p);
  const KV* v_rows = ValueRow<KV>(p, b, hkv, j0);
  const int64_t v_bytes = p.d_v * static_cast<int64_t>(sizeof(KV));
  for (int64_t j = 0; j < jn; ++j) {
    const KV* k = KeyRow<KV>(p, b, hkv, j0 + j);
    // Fetch row j of V while K streams in: both arrays come from memory
    // concurrently, and P·V below reads V from cache.
    const char* vj = reinterpret_cast<const char*>(v_rows + j * ValueStride(p));
    for (int64_t off = 0; off < v_bytes; off += 64) hwy::Prefetch(vj + off);
    if (v_bytes > 0) hwy::Prefetch(vj + v_bytes - 1);  // the last line, if not line-aligned
    for (int64_t r0 = 0; r0 < R; r0 += kRows) {
      float* sj = s + r0 * kDecodeChunk + j;
      WithRows(std::min<int64_t>(kRows, R - r0), [&](auto mr) HWY_ATTR {
        DotRows<decltype(mr)::value>(d, q + r0, k, p.d, scale, sj, kDecodeChunk);
      });
    }
  }
  if (p.softcap > 0) Softcap(d, p.softcap, s, R * kDecodeChunk);
  for (int64_t r = 0; r < R; ++r) {
    float* sr = s + r * kDecodeChunk;
    std::fill(sr + jn, sr + kDecodeChunk, ninf);
    if (!inside || p.mask.present())
      MaskRow(p, b, row_head(r), r % p.n_q, j0, jn, !inside, sr);
    std::fill(l_lanes, l_lanes + N, 0.0f);
    SoftmaxStep(d, sr, kDecodeChunk, m[r], l_lanes);
    l[r] = hn::GetLane(hn::SumOfLanes(d, hn::Load(d, l_lanes)));
  }
  AccumulateValues(d, R, s, kDecodeChunk, jn, ValueRow<KV>(p, b, hkv, j0), ValueStride(p), p.d_v,
                   o, dvp);
}

thread_local Scratch<float> tls_partials;

template <class KV>
void DecodeForwardT(const AttentionProblem<float>& p) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t dvp = (p.d_v + N - 1) / N * N;
  const int64_t R = p.group() * p.n_q;
  const int64_t chunks = (p.n_k + kDecodeChunk - 1) / kDecodeChunk;
  const int64_t heads = p.batch * p.heads_kv;
  const int64_t part_size = (R * (dvp + 2) + N - 1) / N * N;  // keeps each O aligned
  float* parts = tls_partials.get(static_cast<size_t>(std::max<int64_t>(heads * chunks * part_size, 1)));
  parallel_for(heads * chunks, [&](int64_t item) {
    const int64_t bh = item / chunks;
    DecodeChunk<KV>(d, p, bh / p.heads_kv, bh % p.heads_kv, item % chunks, dvp,
                    parts + item * part_size);
  });
  parallel_for(heads, [&](int64_t bh) {
    const int64_t b = bh / p.heads_kv, hkv = bh % p.heads_kv;
    const float* first = parts + bh * chunks * part_size;
    for (int64_t r = 0; r < R; ++r) {
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t c = 0; c < chunks; ++c) mx = std::max(mx, first[c * part_size + R * dvp + r]);
      float* out = p.out.row(b, hkv * p.group() + r / p.n_q, r % p.n_q);
      std::fill(out, out + p.d_v, 0.0f);
      float l = 0;
      for (int64_t c = 0; c < chunks; ++c) {
        const float* part = first + c * part_size;
        const float m_c = part[R * dvp + r], l_c = part[R * dvp + R + r];
        if (l_c == 0) continue;
        const float w = ExpDifference(m_c, mx);
        l += w * l_c;
        const float* o = part + r * dvp;
        for (int64_t col = 0; col < p.d_v; ++col) out[col] += w * o[col];
      }
      if (l == 0) continue;  // no allowed key: zeros
      for (int64_t col = 0; col < p.d_v; ++col) out[col] /= l;  // l NaN: the row is NaN
      SettleNanRow(p, b, hkv * p.group() + r / p.n_q, r % p.n_q, out);
    }
  });
}

void DecodeForward(const AttentionProblem<float>& p) {
  switch (p.kv) {
    case KVStorage::BF16: return DecodeForwardT<hwy::bfloat16_t>(p);
    case KVStorage::F16: return DecodeForwardT<hwy::float16_t>(p);
    default: return DecodeForwardT<float>(p);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::detail {
HWY_EXPORT(FlashForward);
HWY_EXPORT(DecodeForward);

void flash_forward(const AttentionProblem<float>& p) { HWY_DYNAMIC_DISPATCH(FlashForward)(p); }
void decode_forward(const AttentionProblem<float>& p) { HWY_DYNAMIC_DISPATCH(DecodeForward)(p); }
bool use_decode(const AttentionProblem<float>& p) {
  return !p.weights && p.n_q <= 8 && p.n_k > kDecodeChunk;
}
}  // namespace attn::detail
#endif
