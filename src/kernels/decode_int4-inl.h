// Decode's scores of KIVI's int4 keys (attn/quantize.hpp): a group of 32
// keys stores each channel c as one block, value d_c · q + m_c, so a query
// row's scores of the group are
//   s_t = Σ_c (q_c · d_c) · code_t,c + Σ_c q_c · m_c,
// its row scaled by the channels' scales once per group, then one FMA per
// channel and vector of keys, the keys' codes widened once for every row;
// and an item's walk over its groups and values (Int4ChunkKeys).
// Highway's per-target include: include after hwy/highway.h inside a file
// compiled by foreach_target.h.
#if defined(ATTN_KERNELS_DECODE_INT4_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_KERNELS_DECODE_INT4_INL_H_
#undef ATTN_KERNELS_DECODE_INT4_INL_H_
#else
#define ATTN_KERNELS_DECODE_INT4_INL_H_
#endif

#include <hwy/highway.h>

#include "kernels/attention-inl.h"
#include "kernels/kv_rows-inl.h"
#include "kernels/matmul-inl.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "attn/quantize.hpp"
#include "kernels/config.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::kernels {
namespace HWY_NAMESPACE {

// The scales and minima of `count` blocks, `stride` blocks apart from
// first, as float32: each block's fp16 pair read as one 32-bit word (d low,
// m high), N words at a time into a vector, split and widened by the vector
// unit; the last count % N one by one. Blocks side by side (a group's keys)
// by whole vectors (below: int4 decode, 8 heads of 128, 32768 keys, 2
// threads, AMD EPYC Zen 4, in turns in one process, 3.29 ms against 3.37
// word by word); blocks apart (values) by scalar loads (with a gather of
// them, int4 decode took 2.90-2.96 ms against 2.66-2.71 at 1 thread, 1.48
// against 1.34-1.35 at 2; 8 heads of 64, alternating builds).
HWY_INLINE void Int4Ranges(DF d, const block_int4* first, int64_t stride, int64_t count, float* scales, float* mins) {
  static_assert(sizeof(block_int4) % 4 == 0 && offsetof(block_int4, m) == 2, "d and m: one aligned 32-bit word");
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint16_t, DF> d16;
  const hn::Rebind<hwy::float16_t, DF> df16;
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  constexpr int64_t kWords = sizeof(block_int4) / 4;
  static_assert(kWords == 5, "a block is 5 words: the lookup below takes word i from 5i");
  const auto* words = reinterpret_cast<const int32_t*>(first);
  const auto low = hn::Set(di, 0xffff);
  const auto as_f16 = [&](auto bits) HWY_ATTR { return hn::BitCast(df16, hn::DemoteTo(d16, bits)); };
  const int64_t whole = count / N * N;
  const auto store = [&](int64_t c, auto pair) HWY_ATTR {
    hn::StoreU(PromoteF16<decltype(df16)>(d, as_f16(hn::And(pair, low))), d, scales + c);
    hn::StoreU(PromoteF16<decltype(df16)>(d, as_f16(hn::And(hn::ShiftRight<16>(pair), low))), d, mins + c);
  };
  if (stride == 1) {
    // N blocks side by side: their words, word i at 5i, fill 5 vectors, and
    // lane L of those holds word i = 13 · L mod N of exactly one of them (5 ·
    // 13 = 65 = 1 mod N, N a power of 2 up to 64). So a blend of the 5
    // vectors, then one lookup (word i from lane 5i mod N), puts the words
    // in order: 5 loads and 5 shuffles, not N loads and inserts.
    const auto lane = hn::Iota(di, 0), mod = hn::Set(di, static_cast<int32_t>(N - 1));
    const auto word = hn::And(hn::Mul(lane, hn::Set(di, 13)), mod);
    const auto at = hn::Mul(word, hn::Set(di, 5));  // word i's offset in the N blocks' words
    const auto from = hn::IndicesFromVec(di, hn::And(hn::Mul(lane, hn::Set(di, 5)), mod));
    for (int64_t c = 0; c < whole; c += N) {
      const int32_t* w = words + c * kWords;
      auto blend = hn::LoadU(di, w);
      for (int64_t k = 1; k < kWords; ++k)
        blend = hn::IfThenElse(hn::Gt(at, hn::Set(di, static_cast<int32_t>(k * N - 1))), hn::LoadU(di, w + k * N), blend);
      store(c, hn::TableLookupLanes(blend, from));
    }
  } else {
    alignas(HWY_MAX_BYTES) int32_t pairs[HWY_MAX_BYTES / sizeof(int32_t)];
    for (int64_t c = 0; c < whole; c += N) {
      for (int64_t i = 0; i < N; ++i) pairs[i] = words[(c + i) * stride * kWords];
      store(c, hn::Load(di, pairs));
    }
  }
  for (int64_t c = whole; c < count; ++c)
    scales[c] = fp16_to_float(first[c * stride].d.bits), mins[c] = fp16_to_float(first[c * stride].m.bits);
}

inline constexpr int64_t kInt4ScratchRows = 8 + 2;  // 8 rows' weights, then the scales and minima

// Vectors of a group's keys (parts) one Int4KeyScores pass scores for MR
// rows: as many as the accumulators allow (up to 4), so that each byte of
// codes is loaded and widened once, not once per part. int4 decode, 8 heads
// of 64, 32768 keys, alternating builds, ms, median (least): AMD EPYC Zen 4,
// 8 pairs, both halves at 16 lanes against one, 1 thread 2.60 against 2.68,
// 2 threads 1.35 against 1.39; Zen 3 (AVX2), 8 pairs, all four parts, their
// nibbles known at compile time, against one per pass: 2 threads 1.95 (1.63)
// against 2.08 (1.77), 2.87x float32's speed against 2.79x; 1 thread 3.80
// (3.17) against 3.57 (3.39), 2.56x against 2.49x; head dim 128, 2 threads,
// 6 pairs, 4.01 (3.75) against 4.84 (3.64), 2.68x against 2.50x.
inline constexpr int kInt4GroupVectors = HWY_LANES(float) >= kInt4Group ? 1 : kInt4Group / HWY_LANES(float);
template <int MR>
inline constexpr int kInt4Parts = MR * std::min(kInt4GroupVectors, 4) <= 8 ? std::min(kInt4GroupVectors, 4)
                                  : MR * 2 <= 8 && kInt4GroupVectors >= 2 ? 2
                                                                          : 1;

// s[r · s_stride + v + h · N .. + N) = w_r · codes + bias_r for MR rows of
// weights w (q_c · d_c · scale, D apart) and the H parts h of keys from v.
// Each row's sum runs in 8 / (MR · H) chains over the channels in turn (an
// FMA waits 4 cycles for the one before it), added together at the end.
template <int MR, int H = kInt4Parts<MR>>
HWY_INLINE void Int4KeyScores(DF d, const block_int4* group, int64_t D, const float* w, const float* bias,
                              int64_t v, float* s, int64_t s_stride) {
  constexpr int C = 8 / (MR * H);
  static_assert(C >= 1 && H >= 1 && H <= 4, "the accumulators fit in eight names");
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  // v, known to be 0 where one pass takes the whole group: then each part's
  // nibbles (low or high) are known where this compiles, not tested per channel.
  const int64_t first = H * HWY_LANES(float) == kInt4Group ? 0 : v;
  VF a0 = hn::Zero(d), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  const auto step = [&](int64_t c, auto phase) HWY_ATTR {
    // The parts' codes, named (SVE's sizeless vectors cannot form an array).
    VF codes0, codes1, codes2, codes3;
    if constexpr (H == 2 && HWY_LANES(float) == kInt4Group / 2) {  // one load: the low nibbles, the high ones
      hn::Vec<hn::RebindToSigned<DF>> low, high;
      NibbleLanes(d, group[c].qs, low, high);
      codes0 = hn::ConvertTo(d, low), codes1 = hn::ConvertTo(d, high);
    } else {
      codes0 = NibbleCodes(d, group[c].qs, first);  // keys first .. first + N − 1
      if constexpr (H > 1) codes1 = NibbleCodes(d, group[c].qs, first + N);
      if constexpr (H > 2) codes2 = NibbleCodes(d, group[c].qs, first + 2 * N);
      if constexpr (H > 3) codes3 = NibbleCodes(d, group[c].qs, first + 3 * N);
    }
    Unroll<MR>([&](auto r) HWY_ATTR {
      const VF wr = hn::Set(d, w[r * D + c]);
      Unroll<H>([&](auto h) HWY_ATTR {
        VF& acc = Acc<(decltype(phase)::value * MR + r) * H + h>(a0, a1, a2, a3, a4, a5, a6, a7);
        constexpr int part = decltype(h)::value;
        if constexpr (part == 0) acc = hn::MulAdd(wr, codes0, acc);
        else if constexpr (part == 1) acc = hn::MulAdd(wr, codes1, acc);
        else if constexpr (part == 2) acc = hn::MulAdd(wr, codes2, acc);
        else acc = hn::MulAdd(wr, codes3, acc);
      });
    });
  };
  int64_t c = 0;
  for (; c + C <= D; c += C) Unroll<C>([&](auto phase) HWY_ATTR { step(c + phase, phase); });
  for (; c < D; ++c) step(c, std::integral_constant<int, 0>());
  Unroll<MR * H>([&](auto i) HWY_ATTR {
    VF sum = Acc<i>(a0, a1, a2, a3, a4, a5, a6, a7);
    Unroll<C - 1>([&](auto phase) HWY_ATTR { sum = hn::Add(sum, Acc<(phase + 1) * MR * H + i>(a0, a1, a2, a3, a4, a5, a6, a7)); });
    constexpr int r = i / H, h = i % H;
    hn::StoreU(hn::Add(sum, hn::Set(d, bias[r])), d, s + r * s_stride + v + h * N);
  });
}

// The scores of one group of 32 keys (blocks side by side, D of them) for
// R query rows q, s_stride apart from s: all 32, whatever of them the
// chunk holds (BlockSoftmax sets those past it to -inf). w: scratch of
// kInt4ScratchRows · D floats, aligned.
HWY_INLINE void Int4GroupScores(DF d, const float* const* q, int64_t R, const block_int4* group, int64_t D,
                                float scale, float* w, float* s, int64_t s_stride) {
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  float* scales = w + 8 * D;
  float* mins = scales + D;
  float bias[8];
  for (int64_t r0 = 0; r0 < R; r0 += 8) {
    const int64_t rows = std::min<int64_t>(8, R - r0);
    if (N > 16 || D % N != 0) {  // (wide scalable vectors, odd head dims: value by value)
      for (int64_t r = r0; r < r0 + rows; ++r)
        for (int64_t t = 0; t < kInt4Group; ++t) {
          float sum = 0.0f;
          for (int64_t c = 0; c < D; ++c) sum += q[r][c] * int4_value(group[c], t);
          s[r * s_stride + t] = sum * scale;
        }
      continue;
    }
    if (r0 == 0) Int4Ranges(d, group, 1, D, scales, mins);
    for (int64_t r = 0; r < rows; ++r) {
      VF dot = hn::Zero(d);
      const VF vs = hn::Set(d, scale);
      for (int64_t c = 0; c < D; c += N) {
        const VF qc = hn::Mul(hn::LoadU(d, q[r0 + r] + c), vs);
        hn::Store(hn::Mul(qc, hn::Load(d, scales + c)), d, w + r * D + c);
        dot = hn::MulAdd(qc, hn::Load(d, mins + c), dot);
      }
      bias[r] = hn::GetLane(hn::SumOfLanes(d, dot));
    }
    WithCount<8>(rows, [&](auto mr) HWY_ATTR {
      constexpr int MR = decltype(mr)::value;
      for (int64_t v = 0; v < kInt4Group; v += N * kInt4Parts<MR>)
        Int4KeyScores<MR>(d, group, D, w, bias, v, s + r0 * s_stride, s_stride);
    });
  }
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
// P·V over int4 value rows (a block per 32 channels of a token), by
// linearity, with the codes centred (c_j = q_j − 8, the block's middle
// m_jb + 8 · d_jb):
//   Σ_j p_j (d_jb · q_j + m_jb) = Σ_j (p_j · d_jb) · c_j + Σ_j p_j · (m_jb + 8 · d_jb),
// block by block: the tokens' scales and minima widened N at a time
// (Int4Ranges), each row's weights p_j · d_jb and its middles' share (a dot
// product) as vectors, then per token one FMA per row and vector of the
// block's centred codes, which are widened once for every row. (Uncentred,
// the two sums cancel where a block's values lie about 0, and the output's
// rounding error grew past the widened path's bound, 1e-5.) (The row-by-row
// widening, q · d + m per value, took the scale's and minimum's conversions
// and an FMA more per vector.) Fixed vectors only: 32 / N per block.
#undef ATTN_INT4_VALUES  // (defined again for each target)
#define ATTN_INT4_VALUES 1
inline constexpr int kInt4BlockVectors = 32 / HWY_LANES(float);
inline constexpr int kInt4ValueRows = 8 / kInt4BlockVectors;  // accumulators: 8 names
static_assert(kInt4BlockVectors >= 1 && kInt4ValueRows >= 1, "a block is whole vectors");

// o[r][0 .. 32) += Σ_j w[r · w_stride + j] · (codes_j − 8) for MR rows, the
// codes of one block of count tokens v_stride apart; keys are dealt round-robin
// to S sets of accumulators (fewer than 8 chains leave the FMA pipes idle).
template <int MR>
HWY_INLINE void Int4ValueBlock(DF d, const float* w, int64_t w_stride, int64_t count, const block_int4* v,
                               int64_t v_stride, float* o, int64_t o_stride) {
  constexpr int V = kInt4BlockVectors, S = kInt4ValueRows / MR, RV = MR * V;
  const auto N = static_cast<int64_t>(hn::Lanes(d));
#if !ATTN_NIBBLE_LOOKUP
  const VF eight = hn::Set(d, 8.0f);
#endif
  VF a0 = hn::Zero(d), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (int64_t j = 0; j < count; j += S)
    Unroll<S>([&](auto set) HWY_ATTR {
      constexpr int s = decltype(set)::value;
      if (s > 0 && j + s >= count) return;
      const uint8_t* codes = v[(j + s) * v_stride].qs;
#if ATTN_NIBBLE_LOOKUP
      VF centred[2];  // (16 lanes: V = 2, the low nibbles, then the high ones)
      CentredNibbles(d, codes, centred[0], centred[1]);
#endif
      Unroll<V>([&](auto vector) HWY_ATTR {
#if ATTN_NIBBLE_LOOKUP
        const VF c = centred[decltype(vector)::value];
#else
        const VF c = hn::Sub(NibbleCodes(d, codes, decltype(vector)::value * N), eight);
#endif
        Unroll<MR>([&](auto r) HWY_ATTR {
          VF& acc = Acc<(s * MR + r) * V + decltype(vector)::value>(a0, a1, a2, a3, a4, a5, a6, a7);
          acc = hn::MulAdd(hn::Set(d, w[r * w_stride + j + s]), c, acc);
        });
      });
    });
  Unroll<RV>([&](auto i) HWY_ATTR {
    VF sum = Acc<i>(a0, a1, a2, a3, a4, a5, a6, a7);
    Unroll<S - 1>([&](auto set) HWY_ATTR { sum = hn::Add(sum, Acc<(set + 1) * RV + i>(a0, a1, a2, a3, a4, a5, a6, a7)); });
    AddTo(d, o + (i / V) * o_stride + (i % V) * N, sum);
  });
}

// O (R rows, o_stride apart) += P (R rows of count weights, p_stride apart,
// zero from count to p_stride) · V, the int4 value rows v0 + j · v_stride of
// d_v values. scratch: 2 + kInt4ValueRows arrays of count rounded up to
// whole vectors, aligned.
HWY_INLINE void Int4Values(DF d, int64_t R, const float* p, int64_t p_stride, int64_t count, const block_int4* v0,
                           int64_t v_stride, int64_t d_v, float* o, int64_t o_stride, float* scratch) {
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t padded = (count + N - 1) / N * N;
  float* scales = scratch;
  float* mins = scales + padded;
  float* w = mins + padded;  // kInt4ValueRows rows of padded weights
  for (int64_t b = 0; b < d_v / kInt4Group; ++b) {
    Int4Ranges(d, v0 + b, v_stride, count, scales, mins);
    std::fill(scales + count, scales + padded, 0.0f);  // (P is 0 there; so must these be, not NaN)
    std::fill(mins + count, mins + padded, 0.0f);
    for (int64_t r0 = 0; r0 < R; r0 += kInt4ValueRows) {
      const int64_t rows = std::min<int64_t>(kInt4ValueRows, R - r0);
      float bias[kInt4ValueRows];
      for (int64_t r = 0; r < rows; ++r) {
        const float* pr = p + (r0 + r) * p_stride;
        VF share = hn::Zero(d);
        const VF eight = hn::Set(d, 8.0f);
        for (int64_t j = 0; j < padded; j += N) {
          const VF pj = hn::LoadU(d, pr + j), scale = hn::Load(d, scales + j);
          hn::Store(hn::Mul(pj, scale), d, w + r * padded + j);
          share = hn::MulAdd(pj, hn::MulAdd(eight, scale, hn::Load(d, mins + j)), share);
        }
        bias[r] = hn::GetLane(hn::SumOfLanes(d, share));
      }
      float* ob = o + r0 * o_stride + b * kInt4Group;
      WithCount<kInt4ValueRows>(rows, [&](auto mr) HWY_ATTR {
        Int4ValueBlock<decltype(mr)::value>(d, w, padded, count, v0 + b, v_stride, ob, o_stride);
      });
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < kInt4Group; c += N) AddTo(d, ob + r * o_stride + c, hn::Set(d, bias[r]));
    }
  }
}
#else
#undef ATTN_INT4_VALUES
#define ATTN_INT4_VALUES 0
#endif

// decode.cc's ChunkKeys's Scores and Values for KIVI's int4: keys j0 ..
// j0 + jn (j0 a multiple of 32) group by group (Int4GroupScores), one kv
// head, the next group's keys and this group's values fetched ahead into
// L2 (into L1, their 100-odd fetches filled its miss buffers: 3.69 ms
// against 2.60, 8 heads of 128, Zen 4); paged, a page holds whole groups
// (its keys' operand counts rows in groups), P·V by page runs.
struct Int4ChunkKeys {
  const core::AttentionProblem<float>& p;
  int64_t b, h, R, j0;
  const float* const* q;
  float* w;               // kInt4ScratchRows · d floats
  float* values_scratch;  // (2 + kInt4ValueRows) · kDecodeChunk floats (Int4Values)

  HWY_INLINE void Scores(DF d, int64_t from, int64_t to, float* s, int64_t s_stride) const {
    const float scale = ScoreScale(p);
    const int64_t groups = (p.n_k + kInt4Group - 1) / kInt4Group;
    for (int64_t t = from; t < to; t += kInt4Group) {
      const int64_t g = (j0 + t) / kInt4Group;
      if (g + 1 < groups) PrefetchSpan<true>(p.k_stored.row(b, h, g + 1), p.d * static_cast<int64_t>(sizeof(block_int4)));
      // The group's V rows as one span where they lie side by side, not row
      // by row (8 heads of 64, 32768 keys, AMD EPYC Zen 3, alternating builds,
      // ms, median (least): 2 threads 2.00 (1.97) against 2.34 (2.18), 8
      // pairs; 1 thread 3.09 (2.85) against 3.32 (3.11), 6 pairs).
      const int64_t n = std::min(to, t + kInt4Group) - t, row = RowBytes<block_int4>(p.d_v);
      if (p.v_stored.rows_in_page(j0 + t, j0 + t + n) == n)
        PrefetchRows<true>(ValueRow<block_int4>(p, b, h, j0 + t), p.v_stored.row_stride, row, n);
      else
        for (int64_t j = t; j < t + n; ++j) PrefetchSpan<true>(ValueRow<block_int4>(p, b, h, j0 + j), row);
      Int4GroupScores(d, q, R, reinterpret_cast<const block_int4*>(p.k_stored.row(b, h, g)), p.d, scale, w,
                      s + t - from, s_stride);
    }
  }
  HWY_INLINE void Values(DF d, int64_t from, int64_t to, const float* s, int64_t s_stride, float* o, int64_t dvp) const {
    for (int64_t j = from, n; j < to; j += n) {
      n = p.v_stored.rows_in_page(j0 + j, j0 + to);
      const block_int4* v = ValueRow<block_int4>(p, b, h, j0 + j);
#if ATTN_INT4_VALUES
      Int4Values(d, R, s + j - from, s_stride, n, v, ValueStride<block_int4>(p), p.d_v, o, dvp, values_scratch);
#else
      AccumulateValues(d, R, s + j - from, s_stride, n, v, ValueStride<block_int4>(p), p.d_v, o, dvp);
#endif
    }
  }
};
static_assert(kDecodeChunk % kInt4Group == 0, "int4 chunks are whole groups of keys");

}  // namespace HWY_NAMESPACE
}  // namespace attn::kernels
HWY_AFTER_NAMESPACE();

#endif  // ATTN_KERNELS_DECODE_INT4_INL_H_
