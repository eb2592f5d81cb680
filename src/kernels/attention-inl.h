// The pieces both attention kernels use, prefill (prefill.cc) and decode
// (decode.cc): base-2 scores (K and V rows are read by kv_rows-inl.h),
// masks, softcap and ALiBi on a row of scores, the online-softmax step, P·V into
// the output rows, and the settling of rows that came out NaN.
// Highway's per-target include: include after hwy/highway.h inside a file
// compiled by foreach_target.h.
#if defined(ATTN_KERNELS_ATTENTION_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_KERNELS_ATTENTION_INL_H_
#undef ATTN_KERNELS_ATTENTION_INL_H_
#else
#define ATTN_KERNELS_ATTENTION_INL_H_
#endif

#include <hwy/highway.h>

#include <hwy/contrib/math/math-inl.h>

#include "kernels/exp2-inl.h"
#include "kernels/kv_rows-inl.h"
#include "kernels/matmul-inl.h"
#include "kernels/partial-inl.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "attention_problem.hpp"
#include "reference/reference.hpp"
#include "attn/quantize.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// n rounded up to whole vectors: the width of padded rows.
inline int64_t WholeVectors(int64_t n) {
  const auto N = static_cast<int64_t>(hn::Lanes(DF()));
  return (n + N - 1) / N * N;
}

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
inline float ScoreScale(const core::AttentionProblem<float>& p) {
  return p.softcap > 0 ? static_cast<float>(p.scale) : Base2(p.scale);
}

// v rounded to bfloat16 and back, bit for bit float_to_bf16's rule: nearest,
// ties to even, overflow to infinity; a NaN keeps its top half, made quiet.
// The values bf16 precision computes with.
HWY_INLINE VF RoundToBF16(DF d, VF v) {
  const hn::RebindToUnsigned<DF> du;
  const auto bits = hn::BitCast(du, v);
  const auto top = hn::Set(du, 0xffff0000u);
  const auto even = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u));
  const auto rounded = hn::And(hn::Add(bits, hn::Add(hn::Set(du, 0x7fffu), even)), top);
  const auto nan = hn::Or(hn::And(bits, top), hn::Set(du, 0x00400000u));
  return hn::BitCast(d, hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), nan, rounded));
}

// Element (r, j) of a block of weights P: at p[r · p_stride + j], or, with
// kTransposed, at p[j · p_stride + r] (the backward's Pᵀ dO and dSᵀ Q, from
// P and dS as the forward lays them out: broadcast from memory, the stride
// costs nothing).
template <bool kTransposed>
HWY_INLINE float WeightAt(const float* p, int64_t p_stride, int r, int64_t j) {
  return kTransposed ? p[j * p_stride + r] : p[r * p_stride + j];
}

// *to += sum: a tile's sum of products, added to the output once (below).
HWY_INLINE void AddTo(DF d, float* to, VF sum) { hn::Store(hn::Add(hn::Load(d, to), sum), d, to); }

// q8_0 and q4_0 at 8 or 16 lanes (AVX2, AVX-512): a block is kBlockVectors
// whole vectors. Decode then folds each block's scale into a row's weight
// (BlockValueRow) or into its sum (BlockDotKeys, decode_dots-inl.h), and no
// value is scaled on its own.
// Decode of one query row per KV head, 8 heads of 64, 32768 keys, AMD EPYC
// Zen 4, alternating builds, 6 pairs, against widening each value first:
// q8_0 1.18× at 1 thread (1.12-1.22), 1.15× at 2; q4_0 1.19× (1.18-1.28)
// and 1.18×; int4's values, centred by the same lookup (decode_int4-inl.h),
// 1.07× and 1.06×. Error against float64 unchanged to 3 digits. On AVX2
// (AMD EPYC Zen 3, the same shape, 3 alternating pairs), with one row's
// keys four at a time (BlockDotKeys), speed over float32 K/V's in the same
// turns: q8_0 1.31-1.39× → 2.57-3.01× at 2 threads, 1.09-1.36× → 2.62-2.87×
// at 1; q4_0 1.07-1.48× → 2.48-2.85× and 1.15-1.21× → 2.08-2.24×.
#undef ATTN_BLOCKS_FOLDED
#undef ATTN_NIBBLE_LOOKUP
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
#define ATTN_BLOCKS_FOLDED 1
inline constexpr int kBlockVectors = kQ8_0Block / HWY_LANES(float);
static_assert(kQ8_0Block == kQ4_0Block && kBlockVectors % 2 == 0, "a block's nibbles fill whole vectors");

#if HWY_TARGET <= HWY_AVX3
#define ATTN_NIBBLE_LOOKUP 1
// The nibbles of 16 bytes less 8, as float32, exactly: the low ones, then
// the high ones, looked up in a vector of the 16 values, not converted and
// centred (a q4_0 block's codes, and an int4 block's centred ones).
HWY_INLINE void CentredNibbles(DF d, const uint8_t* bytes16, VF& low, VF& high) {
  alignas(64) static constexpr float kCentred[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};
  const VF centred = hn::Load(d, kCentred);
  hn::Vec<hn::RebindToSigned<DF>> low_codes, high_codes;
  NibbleLanes(d, bytes16, low_codes, high_codes);
  low = hn::TableLookupLanes(centred, hn::IndicesFromVec(d, low_codes));
  high = hn::TableLookupLanes(centred, hn::IndicesFromVec(d, high_codes));
}
#else
#define ATTN_NIBBLE_LOOKUP 0
#endif

// Whether BlockCodes gives Block's codes centred, as its values are: not
// q4_0's on AVX2, which has no lookup to subtract 8 by. Its nibbles 0 .. 15
// as they are save that subtraction per code: the codes' users take 8
// times what each block's sum multiplies instead, once per block and key
// (BlockDotKeys: the row's sum over the block; BlockValueRow: the weights
// times the blocks' scales). q4_0 decode, 8 heads of 64, 32768 keys, AMD
// EPYC Zen 3, 8 alternating pairs of builds, ms, median (least): 1 thread
// 3.47 (3.37) against 3.81 (3.63), 2 threads 2.22 (1.83) against 2.32
// (1.92); error against float64 unchanged (7.03e-2).
template <class Block>
inline constexpr bool kCodesCentred = ATTN_NIBBLE_LOOKUP || !std::is_same_v<Block, block_q4_0>;

// A block's codes as float32, exactly, vector by vector: q8_0's as they
// are, q4_0's less 8 where kCodesCentred (its codes 0 .. 15 are the low
// nibbles of its 16 bytes, 16 .. 31 the high ones). The block's values are
// these (less 8 where not centred) times its scale.
template <class Block>
HWY_INLINE void BlockCodes(DF d, const Block& b, VF (&codes)[kBlockVectors]) {
  const hn::RebindToSigned<DF> di;
  const auto N = hn::Lanes(d);
  if constexpr (std::is_same_v<Block, block_q8_0>) {
    const hn::Rebind<int8_t, DF> d8;
    for (int i = 0; i < kBlockVectors; ++i) codes[i] = hn::ConvertTo(d, hn::PromoteTo(di, hn::LoadU(d8, b.qs + i * N)));
  } else {
    static_assert(std::is_same_v<Block, block_q4_0>, "q8_0 or q4_0");
#if ATTN_NIBBLE_LOOKUP
    CentredNibbles(d, b.qs, codes[0], codes[1]);
#else
    constexpr int kHalf = kBlockVectors / 2;
    for (int i = 0; i < kHalf; ++i) {
      hn::Vec<decltype(di)> low, high;
      NibbleLanes(d, b.qs + i * N, low, high);
      codes[i] = hn::ConvertTo(d, low);
      codes[kHalf + i] = hn::ConvertTo(d, high);
    }
#endif
  }
}

// P·V over q8_0 or q4_0 value rows for one row of weights: each block's
// scale folded into the weight (p_j · d_jb, one product per block, not one
// per value; BlockCodes). Columns c0 .. c0 + NV·N of the rows, c0 a
// multiple of 32 (ValueRows: of NV·N), so vector v is vector v % V of
// block c0 / 32 + v / V.
template <int NV, class Block>
HWY_INLINE void BlockValueRow(DF d, const float* p, int64_t count, const Block* v0, int64_t v_stride, int64_t c0,
                              float* o) {
  constexpr bool kCentred = kCodesCentred<Block>;
  static_assert(kCentred || NV <= kBlockVectors, "uncentred codes: one block per pass");
  constexpr int S = NV >= 8 || !kCentred ? 1 : 8 / NV, V = kBlockVectors;
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  const Block* first = v0 + c0 / kQ8_0Block;
  VF a0 = hn::Zero(d), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  VF weights = a0;  // Σ_j p_j · d_j, where the codes are not centred
  for (int64_t j = 0; j < count; j += S)
    Unroll<S>([&](auto set) HWY_ATTR {
      constexpr int s = decltype(set)::value;
      if (s > 0 && j + s >= count) return;
      const Block* row = first + (j + s) * v_stride;
      const VF w = hn::Set(d, p[j + s]);
      Unroll<(NV + V - 1) / V>([&](auto block) HWY_ATTR {
        constexpr int b = decltype(block)::value;
        const VF wd = hn::Mul(w, BlockScale(d, row[b]));
        if constexpr (!kCentred) weights = hn::Add(weights, wd);
        VF codes[V];
        BlockCodes(d, row[b], codes);
        Unroll<V>([&](auto vector) HWY_ATTR {
          constexpr int v = b * V + decltype(vector)::value;
          if constexpr (v < NV) {
            VF& acc = Acc<s * NV + v>(a0, a1, a2, a3, a4, a5, a6, a7);
            acc = hn::MulAdd(wd, codes[decltype(vector)::value], acc);
          }
        });
      });
    });
  Unroll<(S - 1) * NV>([&](auto i) HWY_ATTR {
    VF& to = Acc<i % NV>(a0, a1, a2, a3, a4, a5, a6, a7);
    to = hn::Add(to, Acc<NV + i>(a0, a1, a2, a3, a4, a5, a6, a7));
  });
  if constexpr (!kCentred)
    Unroll<NV>([&](auto v) HWY_ATTR {
      VF& acc = Acc<v>(a0, a1, a2, a3, a4, a5, a6, a7);
      acc = hn::NegMulAdd(hn::Set(d, 8.0f), weights, acc);
    });
  Unroll<NV>([&](auto v) HWY_ATTR { AddTo(d, o + v * N, Acc<v>(a0, a1, a2, a3, a4, a5, a6, a7)); });
}

// BlockValueRow's vectors per pass: two blocks, or one where the codes are
// not centred (the block's sum of weights takes a register of AVX2's 16).
template <class KV>
inline constexpr int kFoldedValueVectors = kCodesCentred<KV> ? 8 : kBlockVectors;
#else
#define ATTN_BLOCKS_FOLDED 0
#define ATTN_NIBBLE_LOOKUP 0
template <class KV>
inline constexpr int kFoldedValueVectors = 0;  // (no folded blocks)
#endif

// Whether KV's blocks have their scales folded (the above).
template <class KV>
inline constexpr bool kBlocksFolded =
    ATTN_BLOCKS_FOLDED && (std::is_same_v<KV, block_q8_0> || std::is_same_v<KV, block_q4_0>);

// o[r][0 .. NV·N) += Σ_j p(r, j) · v_j[0 .. NV·N) for r < MR, j < count
// (WeightAt). An FMA waits 4 cycles for the one
// before it in its chain and 2 pipes issue one each per cycle, so fewer than
// 8 accumulators (narrow value rows, few query rows) leave the pipes idle:
// the keys are then dealt round-robin to S sets of accumulators, summed at
// the end. (At head dim 16 the 4 rows × 1 vector of a single set ran at a
// quarter of the FMA rate.) The sums start from 0 and are added to o once:
// a row's output is then a sum of per-tile sums, not one chain of n_k
// roundings (n = 4096, 8 × 64: error_vs_f64 1.1e-6 → 2.2e-7).
// Columns c0 .. c0 + NV·N of the V rows, c0 a multiple of N.
template <int MR, int NV, bool kTransposed, class KV>
HWY_INLINE void ValueBlock(DF d, const float* p, int64_t p_stride, int64_t count,
                           const KV* v0, int64_t v_stride, int64_t c0, float* o, int64_t o_stride) {
#if ATTN_BLOCKS_FOLDED
  if constexpr (MR == 1 && !kTransposed && kBlocksFolded<KV>)
    return BlockValueRow<NV>(d, p, count, v0, v_stride, c0, o);
#endif
  const size_t N = hn::Lanes(d);
  constexpr int S = MR * NV >= 8 ? 1 : 8 / (MR * NV);
#if HWY_HAVE_SCALABLE
  // Accumulator i = s · MR · NV + r · NV + v, named (see Acc): the same sets,
  // loads and FMAs as the array form below.
  constexpr int RV = MR * NV;
  static_assert(S * RV <= 8, "the accumulators fit in eight names");
  VF a0 = hn::Zero(d), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (int64_t j = 0; j < count; j += S) {
    const int step = static_cast<int>(std::min<int64_t>(S, count - j));
    Unroll<S * RV>([&](auto i) HWY_ATTR {
      constexpr int s = i / RV, r = i % RV / NV, v = i % NV;
      if (S > 1 && s >= step) return;
      VF& acc = Acc<i>(a0, a1, a2, a3, a4, a5, a6, a7);
      acc = hn::MulAdd(hn::Set(d, WeightAt<kTransposed>(p, p_stride, r, j + s)),
                       LoadKV(d, v0 + (j + s) * v_stride, c0 + v * N), acc);
    });
  }
  Unroll<(S - 1) * RV>([&](auto i) HWY_ATTR {
    VF& to = Acc<i % RV>(a0, a1, a2, a3, a4, a5, a6, a7);
    to = hn::Add(to, Acc<RV + i>(a0, a1, a2, a3, a4, a5, a6, a7));
  });
  Unroll<RV>([&](auto i) HWY_ATTR {
    AddTo(d, o + (i / NV) * o_stride + (i % NV) * N, Acc<i>(a0, a1, a2, a3, a4, a5, a6, a7));
  });
#else
  VF acc[S][MR][NV];
  for (int s = 0; s < S; ++s)
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) acc[s][r][v] = hn::Zero(d);
  // (Plain loops: with the key step as a lambda, g++ 12 kept j on the stack.)
  int64_t j = 0;
  for (; j < count; j += S) {
    const int step = static_cast<int>(std::min<int64_t>(S, count - j));
    for (int s = 0; s < S; ++s) {
      if (S > 1 && s >= step) break;
      VF vv[NV];
      for (int v = 0; v < NV; ++v) vv[v] = LoadKV(d, v0 + (j + s) * v_stride, c0 + v * N);
      for (int r = 0; r < MR; ++r) {
        const VF pb = hn::Set(d, WeightAt<kTransposed>(p, p_stride, r, j + s));
        for (int v = 0; v < NV; ++v) acc[s][r][v] = hn::MulAdd(pb, vv[v], acc[s][r][v]);
      }
    }
  }
  for (int s = 1; s < S; ++s)
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) acc[0][r][v] = hn::Add(acc[0][r][v], acc[s][r][v]);
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) AddTo(d, o + r * o_stride + v * N, acc[0][r][v]);
#endif
}

// The same for the last value columns [c, d_v) that are not a whole vector:
// loads masked to the real columns, the sums again from 0. (Prefill pads V
// to whole vectors and never comes here; decode and the backward's products
// read their rows in place.)
template <bool kTransposed, class KV>
HWY_INLINE void ValueTail(DF d, int rows, const float* p, int64_t p_stride, int64_t count,
                          const KV* v0, int64_t v_stride, int64_t c, int64_t d_v, float* o,
                          int64_t o_stride) {
  const int64_t n = d_v - c;
  for (int r = 0; r < rows; ++r) {
    VF acc = hn::Zero(d);
    for (int64_t j = 0; j < count; ++j)
      acc = hn::MulAdd(hn::Set(d, WeightAt<kTransposed>(p, p_stride, r, j)), LoadKVPart(d, v0 + j * v_stride, c, n), acc);
    AddTo(d, o + r * o_stride + c, acc);
  }
}

// All d_v value columns of MR rows: blocks of NV vectors, then the whole
// vectors left as one narrower block, then a partial vector, if any.
template <int MR, bool kTransposed, class KV>
HWY_INLINE void ValueRows(DF d, const float* p, int64_t p_stride, int64_t count, const KV* v0,
                          int64_t v_stride, int64_t d_v, float* o, int64_t o_stride) {
  // A single row (decode) has registers for twice the columns: half the
  // passes over V, twice the independent accumulators per key. Its folded
  // blocks take 8 vectors on AVX2 too, two blocks in one pass (q8_0, 8
  // heads of 64, 32768 keys, 1 thread, Zen 3: 2.68× float32's speed
  // against 2.54-2.56× at 4 vectors; q4_0 one: kFoldedValueVectors).
  constexpr int NV = MR == 1 ? (kBlocksFolded<KV> ? kFoldedValueVectors<KV> : 2 * kVecs) : kVecs;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t whole = d_v / N;
  int64_t vec = 0;
  for (; vec + NV <= whole; vec += NV)
    ValueBlock<MR, NV, kTransposed>(d, p, p_stride, count, v0, v_stride, vec * N, o + vec * N, o_stride);
  if (vec < whole) {
    WithCount<NV - 1>(whole - vec, [&](auto nv) HWY_ATTR {
      ValueBlock<MR, decltype(nv)::value, kTransposed>(d, p, p_stride, count, v0, v_stride, vec * N, o + vec * N,
                                                       o_stride);
    });
  }
  if (whole * N < d_v) ValueTail<kTransposed>(d, MR, p, p_stride, count, v0, v_stride, whole * N, d_v, o, o_stride);
}

// O (rows × o_stride) += P (rows × count, row stride p_stride) · V rows;
// with kTransposed, P's element (r, j) is at p[j · p_stride + r] (WeightAt).
template <bool kTransposed = false, class KV>
void AccumulateValues(DF d, int64_t rows, const float* p, int64_t p_stride, int64_t count,
                      const KV* v0, int64_t v_stride, int64_t d_v, float* o, int64_t o_stride) {
  for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
    const float* pr = kTransposed ? p + r0 : p + r0 * p_stride;
    float* orow = o + r0 * o_stride;
    WithCount<kRows>(std::min<int64_t>(kRows, rows - r0), [&](auto mr) HWY_ATTR {
      ValueRows<decltype(mr)::value, kTransposed>(d, pr, p_stride, count, v0, v_stride, d_v, orow, o_stride);
    });
  }
}

// ALiBi's bias, -slope·(p - j) in base-2 units, up to a constant per row,
// which the softmax does not see. The constant puts the bias's 0 at the
// row's last key that causal masking and the window allow (its first, for a
// negative slope): the bias is then never positive, and small, so exact to
// float32's last bit, where the row's largest weights are. (Taken
// literally, -slope·(p - j) would reach +slope·n_k on the last keys of a
// non-causal row, where a float32 bias of 2000 carries an absolute rounding
// error of 1e-4 into the logits.) AlibiAnchor is that key for row range kr.
inline int64_t AlibiAnchor(double slope, const KeyRange& kr) { return slope >= 0 ? kr.end - 1 : kr.begin; }

// 0, 1, 2, ...: the lanes' key offsets within a tile. (Highway 1.0.3's Iota
// fills its lanes one by one through memory: too slow per row.)
struct KeyOffsets {
  alignas(64) float at[kBlockK > kDecodeChunk ? kBlockK : kDecodeChunk];
  constexpr KeyOffsets() : at() {
    for (int64_t j = 0; j < static_cast<int64_t>(sizeof at / sizeof at[0]); ++j) at[j] = static_cast<float>(j);
  }
};
inline constexpr KeyOffsets kKeyOffsets;

// x + slope2 · (first + col + lane): ALiBi's bias on keys j0 + col .. of a
// row whose anchor is j0 - first, added to their scores x; slope2 is the
// slope in base-2 units (Base2). The distances are whole numbers, exact in
// float32 below 2^24, so the bias is rounded once, with the sum.
HWY_INLINE VF WithAlibi(DF d, float slope2, int64_t first, int64_t col, VF x) {
  const VF distance = hn::Add(hn::Load(d, kKeyOffsets.at + col), hn::Set(d, static_cast<float>(first)));
  return hn::MulAdd(hn::Set(d, slope2), distance, x);
}

// The same on s[0 .. count) (up to whole vectors; s aligned; entries past
// count are -inf and stay so).
HWY_INLINE void AddAlibi(DF d, float slope2, int64_t first, int64_t count, float* s) {
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t j = 0; j < count; j += N) hn::Store(WithAlibi(d, slope2, first, j, hn::Load(d, s + j)), d, s + j);
}

// Masks keys j0 .. j0 + count of query row i (head h) in s (aligned; -inf
// past count, up to whole vectors): -inf outside the causal/window range
// (when check_range), then the explicit masks and ALiBi's bias. The softmax's
// scores are in base-2 units with ALiBi anchored (AlibiAnchor); `natural`
// adds both as the returned logits have them: natural units, ALiBi's bias
// literal, -slope · (p - j).
inline void MaskRow(DF d, const core::AttentionProblem<float>& p, int64_t b, int64_t h, int64_t i, int64_t j0,
                    int64_t count, bool check_range, float* s, bool natural = false) {
  const float ninf = -std::numeric_limits<float>::infinity();
  const KeyRange kr = allowed_keys(i, p.n_q, p.n_k, p.causal, p.window);
  if (check_range) {
    const int64_t a = std::clamp(kr.begin - j0, int64_t{0}, count);
    const int64_t z = std::clamp(kr.end - j0, a, count);
    std::fill(s, s + a, ninf);
    std::fill(s + z, s + count, ninf);
  }
  const auto unit = [natural](double x) { return natural ? static_cast<float>(x) : Base2(x); };
  if (!p.alibi.empty()) {
    const int64_t anchor = natural ? i + p.causal.position(p.n_q, p.n_k) : AlibiAnchor(p.alibi[h], kr);
    AddAlibi(d, unit(p.alibi[h]), j0 - anchor, count, s);
  }
  for (const core::MaskTerm& m : p.mask.terms) {
    if (m.f32) {
      const float* mr = m.f32.row(b, h, i) + j0 * m.f32.col_stride;
      for (int64_t j = 0; j < count; ++j) s[j] += unit(mr[j * m.f32.col_stride]);
    } else if (m.f64) {
      const double* mr = m.f64.row(b, h, i) + j0 * m.f64.col_stride;
      for (int64_t j = 0; j < count; ++j) s[j] += unit(mr[j * m.f64.col_stride]);
    }
  }
  // After the additive masks, so that an excluded key is -inf whatever was added.
  for (const core::MaskTerm& m : p.mask.terms)
    if (m.boolean) {
      const bool* mr = m.boolean.row(b, h, i) + j0 * m.boolean.col_stride;
      for (int64_t j = 0; j < count; ++j)
        if (mr[j * m.boolean.col_stride] == m.blocking) s[j] = ninf;
    }
}

// softcap · tanh(s / softcap) over n entries (n a multiple of the lanes), s
// in natural units; the result in base-2 units (the softmax's), or natural
// ones (the returned logits). With tanh_out, the tanh also goes there.
inline void Softcap(DF d, double softcap, float* s, int64_t n, bool natural = false,
                    float* tanh_out = nullptr) {
  const VF cap = hn::Set(d, natural ? static_cast<float>(softcap) : Base2(softcap));
  const VF inv = hn::Set(d, static_cast<float>(1.0 / softcap));
  for (int64_t e = 0; e < n; e += static_cast<int64_t>(hn::Lanes(d))) {
    const VF t = hn::Tanh(d, hn::Mul(hn::Load(d, s + e), inv));
    if (tanh_out) hn::Store(t, d, tanh_out + e);
    hn::Store(hn::Mul(cap, t), d, s + e);
  }
}

// How far the kernels' logits of row i of head h lie above the true ones,
// in natural units: ALiBi's anchor (AlibiAnchor) shifts them by
// slope · (p - anchor); 0 without ALiBi.
inline double AlibiShift(const core::AttentionProblem<float>& p, int64_t h, int64_t i) {
  if (p.alibi.empty()) return 0;
  const int64_t anchor = AlibiAnchor(p.alibi[h], allowed_keys(i, p.n_q, p.n_k, p.causal, p.window));
  return p.alibi[h] * double(i + p.causal.position(p.n_q, p.n_k) - anchor);
}

// Row i of head h's attention sink in the kernels' units (base 2, shifted
// with the row's logits), the running max its online softmax starts from
// (with a sum of 1: the sink is a key of value zero); -inf without sinks.
inline float SinkLogit(const core::AttentionProblem<float>& p, int64_t h, int64_t i) {
  if (p.sinks.empty()) return -std::numeric_limits<float>::infinity();
  return Base2(p.sinks[h] + AlibiShift(p, h, i));
}

// The log-sum-exp of row i of head h, in natural units, from the running max
// m and sum l of its online softmax (base 2, shifted: AlibiShift is undone):
// -inf for a row with no allowed key (and no sink), NaN for a NaN row.
inline float RowLse(const core::AttentionProblem<float>& p, int64_t h, int64_t i, float m, float l) {
  if (l == 0) return -std::numeric_limits<float>::infinity();
  const double lse = (double(m) + std::log2(double(l))) * 0.69314718055994530942;  // NaN and +inf carry
  return static_cast<float>(lse - AlibiShift(p, h, i));
}

// out[0 .. d_v) = o · inv, the output row (b, h, i) from its unnormalised
// sum o (padded to whole vectors, aligned).
//
// P·V multiplies every key of a tile by its weight, and an excluded key's
// weight is 0; a NaN or infinite value in its row still gives 0·NaN = NaN. So
// a row that comes out with a NaN is computed again the slow way
// (reference_attention_row, which never reads an excluded key), and keeps a
// NaN only if it has one of its own. Rows with NaN are rare. Returns whether
// the row was computed again: then its extras (lse, weights, logits) are the
// reference's too, describing this output, and the caller leaves them be.
inline bool WriteRow(DF d, const core::AttentionProblem<float>& p, int64_t b, int64_t h, int64_t i,
                     const float* o, float inv, float* out) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF vinv = hn::Set(d, inv);
  auto nan = hn::FirstN(d, 0);
  for (int64_t c = 0; c < p.d_v; c += N) {
    const VF x = hn::Mul(hn::Load(d, o + c), vinv);
    nan = hn::Or(nan, hn::IsNaN(x));  // a padding lane is NaN only with the row's real ones
    StorePart(d, x, out + c, std::min(N, p.d_v - c));
  }
  if (hn::AllFalse(d, nan)) return false;
  reference::reference_attention_row(p, b, h, i, out);
  return true;
}

// Which online softmax SoftmaxStep runs, and what it leaves of P:
//   Float32  float32 precision: the exact 2^x, the lazy max, P in float32
//   BF16     bf16 precision (SoftmaxExp2's degree 3, the exact max), P
//            rounded to bf16 as its P·V on the Highway path reads it
//   BF16Unit the same softmax for a bf16 unit, whose pairing of P rounds it
//            the same way (nearest, ties to even; P has no subnormals, as
//            SoftmaxExp2 flushes them): P left unrounded, a pass over it less
enum class SoftmaxFor { Float32, BF16, BF16Unit };

// SoftmaxStep's last part: s[j] = 2^(s[j] - m) and l = alpha · l + Σ_j s[j]
// (per lane), for a finite running max m (a NaN one makes every s[j] and l
// NaN). For BF16, s[j] is stored rounded, in the same pass; l always sums
// it unrounded. (One chain of adds: two, each over every other vector, made
// prefill 3-5% slower in float32, bf16 and int8 precision alike, n = 4096,
// 8 heads of 64, 2 threads, AMD EPYC Zen 5.)
template <SoftmaxFor kFor>
HWY_INLINE void AddExponentials(DF d, float* s, int64_t n, float m, float* l, float alpha) {
  constexpr bool kForBF16 = kFor != SoftmaxFor::Float32;
  const size_t N = hn::Lanes(d);
  const VF vm = hn::Set(d, m);
  VF sum = hn::Zero(d);
  for (int64_t j = 0; j < n; j += static_cast<int64_t>(N)) {
    const VF e = SoftmaxExp2<kForBF16>(d, hn::Sub(hn::Load(d, s + j), vm));
    hn::Store(kFor == SoftmaxFor::BF16 ? RoundToBF16(d, e) : e, d, s + j);
    sum = hn::Add(sum, e);
  }
  hn::Store(hn::MulAdd(hn::Load(d, l), hn::Set(d, alpha), sum), d, l);
}

// Online softmax of one row of S (base-2 units) against running max m and
// sum l: turns the row into P = 2^(S - m') and returns the factor 2^(m - m')
// that rescales the row's accumulated output (1 when nothing changes). In
// float32, m' is the tile's max only where that exceeds m by more than
// kRescaleThreshold; otherwise m stays, and P may reach 2^8.
// n is a multiple of the lanes. The sum is kept per lane (l points at one
// vector, aligned) and reduced once at the end: no horizontal sum per tile.
// Edge cases (docs/semantics.md "Numeric edge cases"): a NaN logit makes P, and so l, NaN for
// good (the row comes out NaN); +inf logits share the weight equally, the
// softmax's limit.
// For bf16 (SoftmaxFor), P's exponentials to bf16 precision's accuracy
// (SoftmaxExp2), left rounded to bf16 or for the unit to round (its 0s and
// 1s are exact either way).
inline constexpr float kRescaleThreshold = 8.0f;
template <SoftmaxFor kFor = SoftmaxFor::Float32>
HWY_INLINE float SoftmaxStep(DF d, float* s, int64_t n, float& m, float* l) {
  const size_t N = hn::Lanes(d);
  const float ninf = -std::numeric_limits<float>::infinity();
  VF vmax = hn::Load(d, s);
  for (int64_t j = static_cast<int64_t>(N); j < n; j += static_cast<int64_t>(N))
    vmax = hn::Max(vmax, hn::Load(d, s + j));
  // The max moves only when the tile's exceeds it by more than
  // kRescaleThreshold (FlashAttention-4's lazy rescale): a smaller rise
  // leaves P below 2^kRescaleThreshold and spares the rescale of O and l,
  // which are exact relative to whatever m they share. (-inf: moves.) Not
  // for bf16, whose P is rounded for P·V but not in l: a row's leading key
  // must get P = 2^0 = 1 there, or its weight is off by up to 2^-9.
  constexpr float threshold = kFor == SoftmaxFor::Float32 ? kRescaleThreshold : 0.0f;
  // Most tiles leave a finite m where it is: one compare of every lane
  // tells, without the tile's max across lanes, a chain of shuffles that
  // took a fifth of the softmax's time. (A NaN lane compares false and comes
  // out of 2^x as NaN: l is NaN, as below.)
  if (std::isfinite(m) && hn::AllFalse(d, hn::Gt(vmax, hn::Set(d, m + threshold)))) {
    AddExponentials<kFor>(d, s, n, m, l, 1.0f);
    return 1.0f;
  }
  // (Max may drop a NaN lane or keep it; a kept one must not lose to m.)
  const float tile_max = hn::GetLane(hn::MaxOfLanes(d, vmax));
  const float m_new = std::isnan(tile_max) ? tile_max : tile_max > m + threshold ? tile_max : m;
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
  const float alpha = m == m_new ? 1.0f : hn::GetLane(SoftmaxExp2(d, hn::Set(d, m - m_new)));
  AddExponentials<kFor>(d, s, n, m_new, l, alpha);
  m = m_new;
  return alpha;
}

// 2^(x - m) for x <= m + kRescaleThreshold (base-2 scores), and 1 for x = m
// = +inf (not 2^NaN).
inline float ExpDifference(float x, float m) { return x == m ? 1.0f : std::exp2(x - m); }

}  // namespace HWY_NAMESPACE
}  // namespace attn::kernels
HWY_AFTER_NAMESPACE();

#endif  // ATTN_KERNELS_ATTENTION_INL_H_
