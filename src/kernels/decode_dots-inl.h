// Decode's scores key by key: a few query rows against one key row (DotRows)
// or four (DotKeys, block types, where 32 vector registers hold the
// accumulators), each score a horizontal sum; int8 precision's queries
// rounded to q8_0 (RoundedQueries). Highway's per-target include: include
// after hwy/highway.h inside a file compiled by foreach_target.h.
#if defined(ATTN_KERNELS_DECODE_DOTS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_KERNELS_DECODE_DOTS_INL_H_
#undef ATTN_KERNELS_DECODE_DOTS_INL_H_
#else
#define ATTN_KERNELS_DECODE_DOTS_INL_H_
#endif

#include <hwy/highway.h>

#include "kernels/attention-inl.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "attn/half.hpp"
#include "attn/quantize.hpp"
#include "kernels/int8_unit.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::kernels {
namespace HWY_NAMESPACE {

// s[r · s_stride] = scale · q_r · k for r < MR.
template <int MR, class KV>
HWY_INLINE void DotRows(DF d, const float* const* q, const KV* k, int64_t D, float scale,
                        float* s, int64_t s_stride) {
  const size_t N = hn::Lanes(d);
  const int64_t full = D / static_cast<int64_t>(N) * static_cast<int64_t>(N);
#if HWY_HAVE_SCALABLE
  // Two accumulators per row, r and MR + r (the even and odd vector steps),
  // named (see Acc): the same loads and FMAs as the array form below.
  static_assert(2 * MR <= 8, "the accumulators fit in eight names");
  VF a0 = hn::Zero(d), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  const auto acc = [&](auto i) HWY_ATTR -> VF& { return Acc<i>(a0, a1, a2, a3, a4, a5, a6, a7); };
  int64_t c = 0;
  for (; c + 2 * static_cast<int64_t>(N) <= full; c += 2 * static_cast<int64_t>(N)) {
    VF kv, kv2;
    LoadKVPair(d, k, c, kv, kv2);
    Unroll<MR>([&](auto r) HWY_ATTR {
      acc(r) = hn::MulAdd(hn::LoadU(d, q[r] + c), kv, acc(r));
      acc(std::integral_constant<int, MR + r>()) =
          hn::MulAdd(hn::LoadU(d, q[r] + c + N), kv2, acc(std::integral_constant<int, MR + r>()));
    });
  }
  for (; c < full; c += static_cast<int64_t>(N)) {
    const VF kv = LoadKV(d, k, c);
    Unroll<MR>([&](auto r) HWY_ATTR { acc(r) = hn::MulAdd(hn::LoadU(d, q[r] + c), kv, acc(r)); });
  }
  Unroll<MR>([&](auto r) HWY_ATTR {
    VF sum = hn::Add(acc(r), acc(std::integral_constant<int, MR + r>()));
    if (full < D)
      sum = hn::MulAdd(LoadPart(d, q[r] + full, D - full, 0.0f), LoadKVPart(d, k, full, D - full), sum);
    s[r * s_stride] = hn::GetLane(hn::SumOfLanes(d, sum)) * scale;
  });
#else
  // Two accumulators per row halve the chain of FMAs a key's score waits on:
  // more keys, and so more memory reads, in flight.
  VF acc[MR], acc2[MR];
  for (int r = 0; r < MR; ++r) acc[r] = acc2[r] = hn::Zero(d);
  int64_t c = 0;
  for (; c + 2 * static_cast<int64_t>(N) <= full; c += 2 * static_cast<int64_t>(N)) {
    VF kv, kv2;
    LoadKVPair(d, k, c, kv, kv2);
    for (int r = 0; r < MR; ++r) {
      acc[r] = hn::MulAdd(hn::LoadU(d, q[r] + c), kv, acc[r]);
      acc2[r] = hn::MulAdd(hn::LoadU(d, q[r] + c + N), kv2, acc2[r]);
    }
  }
  for (; c < full; c += static_cast<int64_t>(N)) {
    const VF kv = LoadKV(d, k, c);
    for (int r = 0; r < MR; ++r) acc[r] = hn::MulAdd(hn::LoadU(d, q[r] + c), kv, acc[r]);
  }
  for (int r = 0; r < MR; ++r) acc[r] = hn::Add(acc[r], acc2[r]);
  if (full < D) {
    const VF kv = LoadKVPart(d, k, full, D - full);
    for (int r = 0; r < MR; ++r) acc[r] = hn::MulAdd(LoadPart(d, q[r] + full, D - full, 0.0f), kv, acc[r]);
  }
  for (int r = 0; r < MR; ++r) s[r * s_stride] = hn::GetLane(hn::SumOfLanes(d, acc[r])) * scale;
#endif
}

// Keys stored in blocks (q8_0, q4_0) or as 16-bit floats, whose widening
// lengthens a key's arithmetic, are scored four at a time on targets with
// 32 vector registers for the 16 accumulators (AVX-512, NEON; not SVE's
// sizeless vectors, which cannot form the arrays): a row's four
// accumulators are summed together (Sums4), about 4 operations per score
// where a sum of each alone takes about 9, in a chain of latencies per key.
// 32768 keys, 32 query and 8 KV heads of 128, AMD EPYC (Zen 5), ms, key by
// key against four at a time: 2 threads q8_0 2.88-3.01 against 2.43-2.66,
// q4_0 2.93-3.23 against 2.47-2.76; 1 thread q8_0 5.52-5.85 against
// 4.54-4.83, q4_0 5.68-5.93 against 4.69-4.99. bf16 and f16 gain where
// their rows are fetched ahead into L2 (ChunkKeys::FetchAhead; into L1,
// four at a time was slower), as speed over float32's in the same turns
// (2 threads, AMD EPYC Zen 4, alternating builds, medians and ranges): bf16
// 1.57x (1.51-1.74) key by key against 1.80x (1.58-1.86), f16 1.56x
// (1.54-1.67) against 1.79x (1.75-1.85); at 64 query heads, bf16 1.24x
// (1.13-1.34) against 1.42x (1.33-1.51). Not where the hardware's
// prefetcher alone reads them (one row per KV head): four at a time took
// 4.67-5.23 ms against 3.82-4.45 (bf16, 8 heads of 128). float32 waits on
// memory alone, and ran slower four at a time (1 thread, 10.5-11.1 against
// 11.8-12.6 ms): it keeps DotRows.
#undef ATTN_DECODE_FOUR_KEYS
#if (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3) || (HWY_ARCH_ARM && HWY_TARGET == HWY_NEON)
#define ATTN_DECODE_FOUR_KEYS 1
#else
#define ATTN_DECODE_FOUR_KEYS 0
#endif  // ATTN_DECODE_FOUR_KEYS

// Keys DotKeys scores at once beside `rows` rows: four where 32 registers
// hold the 16 accumulators of 4 rows; on AVX2's 16, as many as 8
// accumulators allow, 4 beside 1 or 2 rows and 2 beside 3 or 4. At 4 rows,
// two at a time against key by key (DotRows), 32768 keys, 32 query and 8
// KV heads of 128, 2 threads, AMD EPYC Zen 3, 8 alternating pairs of
// builds, ms, median (least): bf16 7.38 (6.69) against 8.02 (7.11), q4_0
// 8.83 (7.93) against 10.15 (8.17); f16 7.68 (6.44) against 7.59 (6.49) and
// q8_0 8.72 (7.68) against 8.60 (7.28), within noise. float32 keeps DotRows
// (5 pairs: 12.4 (11.8) against 11.2 (10.7)).
constexpr int64_t KeysAtOnce(int64_t rows) { return ATTN_DECODE_FOUR_KEYS || rows <= 2 ? 4 : 2; }

// Keys one row of q8_0 or q4_0 keys has scored at once (BlockDotKeys,
// CodeDotKeys): 8 on AVX2, where four keys' chains of products left its
// pipes idle; 4 on AVX-512, as measured there. 8 heads, a cache in L3, 1
// thread, AMD EPYC Zen 3, 20 alternating runs, ns per key and head, least
// (median), eight against four: q8_0 at head dim 64 11.3 (12.1) against
// 12.7 (14.4); int8 precision 9.9 (10.8) against 11.4 (13.6). (16-bit
// keys keep four: bf16 at head dim 128, 2 threads, took 7.5 ms against
// 6.7.)
inline constexpr int kBlockKeysAtOnce = HWY_TARGET == HWY_AVX2 ? 8 : 4;

// Whether int8 precision's one row per kv head of q8_0 keys takes its
// codes' int16 products (CodeDotKeys): on AVX2 (8 heads of 64, a cache in
// L3, 1 thread, AMD EPYC Zen 3, 20 alternating runs, ns per key and head,
// least (median): 11.8 (14.6) against 12.9 (16.6) through the rounded
// values in float32, four keys at a time either way). AVX-512 keeps the
// float32 path it was measured with.
inline constexpr bool kDecodeCodeDots = HWY_TARGET == HWY_AVX2;

#if ATTN_DECODE_FOUR_KEYS || ATTN_BLOCKS_FOLDED
// A vector's lanes in 128-bit blocks added into one block (halving).
template <class D>
HWY_INLINE hn::Vec<hn::Full128<float>> BlocksAdded(D d, hn::Vec<D> v) {
  if constexpr (hn::MaxLanes(D()) * sizeof(float) > 16) {
    const hn::Half<D> dh;
    return BlocksAdded(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  } else {
    (void)d;
    return v;
  }
}

// Lane i of the result: the sum of a_i's lanes, added in one fixed tree
// (lanes two apart within each 128-bit block, then neighbours, then the
// blocks), so that a sum computed alone, as Sums4(a, 0, 0, 0), has the bits
// it has among four.
HWY_INLINE hn::Vec<hn::Full128<float>> Sums4(DF d, VF a0, VF a1, VF a2, VF a3) {
  const hn::Repartition<uint64_t, DF> d64;
  const VF a01 = hn::Add(hn::InterleaveLower(d, a0, a1), hn::InterleaveUpper(d, a0, a1));
  const VF a23 = hn::Add(hn::InterleaveLower(d, a2, a3), hn::InterleaveUpper(d, a2, a3));
  const auto w01 = hn::BitCast(d64, a01), w23 = hn::BitCast(d64, a23);
  const VF sums = hn::Add(hn::BitCast(d, hn::InterleaveLower(d64, w01, w23)),
                          hn::BitCast(d, hn::InterleaveUpper(d64, w01, w23)));
  return BlocksAdded(d, sums);
}
#endif

#if ATTN_BLOCKS_FOLDED
// s[0 .. KEYS) = scale · the sums of acc[0 .. KEYS)'s lanes, four at a time
// (Sums4; one alone beside zeros).
template <int KEYS>
HWY_INLINE void StoreKeySums(DF d, const VF* acc, float scale, float* s) {
  const hn::Full128<float> d4;
  if constexpr (KEYS == 1) {
    s[0] = hn::GetLane(Sums4(d, acc[0], hn::Zero(d), hn::Zero(d), hn::Zero(d))) * scale;
  } else {
    for (int t = 0; t < KEYS; t += 4)
      hn::StoreU(hn::Mul(Sums4(d, acc[t], acc[t + 1], acc[t + 2], acc[t + 3]), hn::Set(d4, scale)), d4, s + t);
  }
}

// The scores of one row and KEYS (1 or kBlockKeysAtOnce) q8_0 or q4_0
// keys: per block, the row's sum over the block's codes (BlockCodes), then
// times the block's scale, once per block and key, not once per value. The
// same bits whether a key is scored among others or alone.
template <int KEYS, class Block>
HWY_INLINE void BlockDotKeys(DF d, const float* q, const Block* k, int64_t k_stride, int64_t D, float scale, float* s) {
  constexpr int V = kBlockVectors;
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  VF acc[KEYS];
  for (VF& a : acc) a = hn::Zero(d);
  for (int64_t b = 0; b < D / kQ8_0Block; ++b) {
    VF qb[V];
    for (int i = 0; i < V; ++i) qb[i] = hn::LoadU(d, q + b * kQ8_0Block + i * N);
    VF offset = hn::Zero(d);  // 8 Σ q over the block, where the codes are not centred
    if constexpr (!kCodesCentred<Block>) {
      for (int i = 0; i < V; ++i) offset = hn::Add(offset, qb[i]);
      offset = hn::Mul(offset, hn::Set(d, 8.0f));
    }
    for (int t = 0; t < KEYS; ++t) {
      const Block& block = k[t * k_stride + b];
      VF codes[V];
      BlockCodes(d, block, codes);
      VF sum = hn::Mul(qb[0], codes[0]);
      for (int i = 1; i < V; ++i) sum = hn::MulAdd(qb[i], codes[i], sum);
      if constexpr (!kCodesCentred<Block>) sum = hn::Sub(sum, offset);
      acc[t] = hn::MulAdd(sum, BlockScale(d, block), acc[t]);
    }
  }
  StoreKeySums<KEYS>(d, acc, scale, s);
}

// int8 precision's scores of one row and KEYS (1 or kBlockKeysAtOnce) q8_0
// keys, as llama.cpp's vec_dot_q8_0_q8_0: per block, the row's codes (q,
// rounded as RoundedQueries rounds them, widened to int16 once per call)
// times the key's, summed exactly in int32 (ReorderWidenMulAccumulate:
// VPMADDWD, 16 products per instruction, where float32 widens each code
// and takes 8), then times the two blocks' scales (q_scales[b] and the
// key's). The same bits whether a key is scored among others or alone.
template <int KEYS>
HWY_INLINE void CodeDotKeys(DF d, const int16_t* q, const float* q_scales, const block_q8_0* k, int64_t k_stride,
                            int64_t D, float scale, float* s) {
  const hn::RebindToSigned<DF> di;
  const hn::Repartition<int16_t, DF> d16;
  const hn::Rebind<int8_t, decltype(d16)> d8;
  constexpr int L = static_cast<int>(hn::MaxLanes(d16)), W = kQ8_0Block / L;
  static_assert(W * L == kQ8_0Block, "a block fills whole vectors of int16");
  VF acc[KEYS];
  for (VF& a : acc) a = hn::Zero(d);
  for (int64_t b = 0; b < D / kQ8_0Block; ++b) {
    hn::Vec<decltype(d16)> qb[W];
    for (int w = 0; w < W; ++w) qb[w] = hn::LoadU(d16, q + b * kQ8_0Block + w * L);
    const VF q_scale = hn::Set(d, q_scales[b]);
    for (int t = 0; t < KEYS; ++t) {
      const block_q8_0& block = k[t * k_stride + b];
      auto sum = hn::Zero(di), odd = sum;
      for (int w = 0; w < W; ++w)
        sum = hn::ReorderWidenMulAccumulate(di, hn::PromoteTo(d16, hn::LoadU(d8, block.qs + w * L)), qb[w], sum, odd);
      acc[t] = hn::MulAdd(hn::ConvertTo(d, hn::RearrangeToOddPlusEven(sum, odd)),
                          hn::Mul(BlockScale(d, block), q_scale), acc[t]);
    }
  }
  StoreKeySums<KEYS>(d, acc, scale, s);
}
#endif

#if ATTN_DECODE_FOUR_KEYS || ATTN_BLOCKS_FOLDED
// s[r · s_stride + t] = scale · q_r · k_t for r < MR and the KEYS (1, 2 or
// 4) keys k_t = k + t · k_stride, one accumulator per row and key, summed by
// Sums4 (two rows' pairs of keys in one): the same bits whether a key is
// scored among others or alone.
template <int MR, int KEYS, class KV>
HWY_INLINE void DotKeys(DF d, const float* const* q, const KV* k, int64_t k_stride, int64_t D, float scale,
                        float* s, int64_t s_stride) {
  static_assert(KEYS == 1 || KEYS == 2 || KEYS == 4, "one key, two or four");
  const int64_t N = static_cast<int64_t>(hn::Lanes(d)), full = D / N * N;
  VF acc[MR][KEYS];
  for (int r = 0; r < MR; ++r)
    for (int t = 0; t < KEYS; ++t) acc[r][t] = hn::Zero(d);
  int64_t c = 0;
  for (; c + 2 * N <= full; c += 2 * N)
    for (int t = 0; t < KEYS; ++t) {
      VF kv, kv2;
      LoadKVPair(d, k + t * k_stride, c, kv, kv2);
      for (int r = 0; r < MR; ++r)
        acc[r][t] = hn::MulAdd(hn::LoadU(d, q[r] + c + N), kv2, hn::MulAdd(hn::LoadU(d, q[r] + c), kv, acc[r][t]));
    }
  for (; c < D; c += N)
    for (int t = 0; t < KEYS; ++t) {
      const VF kv = LoadKVUpTo(d, k + t * k_stride, c, D);
      for (int r = 0; r < MR; ++r) acc[r][t] = hn::MulAdd(LoadPart(d, q[r] + c, std::min(N, D - c), 0.0f), kv, acc[r][t]);
    }
  const hn::Full128<float> d4;
  const auto at = [&](int r, int t) HWY_ATTR { return r < MR && t < KEYS ? acc[r][t] : hn::Zero(d); };
  if constexpr (KEYS == 2) {
    const hn::Full64<float> d2;
    for (int r = 0; r < MR; r += 2) {
      const auto sums = hn::Mul(Sums4(d, at(r, 0), at(r, 1), at(r + 1, 0), at(r + 1, 1)), hn::Set(d4, scale));
      hn::StoreU(hn::LowerHalf(d2, sums), d2, s + r * s_stride);
      if (r + 1 < MR) hn::StoreU(hn::UpperHalf(d2, sums), d2, s + (r + 1) * s_stride);
    }
  } else {
    for (int r = 0; r < MR; ++r) {
      const auto sums = Sums4(d, at(r, 0), at(r, 1), at(r, 2), at(r, 3));
      if constexpr (KEYS == 4) hn::StoreU(hn::Mul(sums, hn::Set(d4, scale)), d4, s + r * s_stride);
      else s[r * s_stride] = hn::GetLane(sums) * scale;
    }
  }
}
#endif

// Whether decode scores keys stored as KV several at a time (DotKeys,
// KeysAtOnce) for any number of rows, where they are fetched ahead
// (ChunkKeys::Scores).
template <class KV>
inline constexpr bool kDecodeKeyGroups =
    (ATTN_DECODE_FOUR_KEYS || (ATTN_BLOCKS_FOLDED && HWY_TARGET == HWY_AVX2)) && !std::is_same_v<KV, float>;

// Whether decode scores one row's keys stored as KV four at a time, fetched
// ahead or not: q8_0's and q4_0's (BlockDotKeys) on AVX2 and AVX-512, and on
// AVX2 bf16's and fp16's too (DotKeys), which AVX-512 scores so only where
// they are fetched ahead (decode's bench, 8 heads of 64, 32768 keys, bf16,
// AMD EPYC Zen 3, 6 alternating pairs, speed over float32's in the same
// turns: 1.36-1.60x key by key against 1.41-1.78x at 2 threads, 1.34-1.39x
// against 1.59-1.61x at 1).
template <class KV>
inline constexpr bool kDecodeOneRowFourKeys =
    kBlocksFolded<KV> || (ATTN_BLOCKS_FOLDED && HWY_TARGET == HWY_AVX2 && !std::is_same_v<KV, float>);

// The scores of `keys` keys (k_stride apart) for MR rows: with kGrouped,
// several at a time, the same bits as alone: one row of q8_0 or q4_0 keys
// by BlockDotKeys (or CodeDotKeys, given the row's q8_0 codes and their
// scales), 1 or kBlockKeysAtOnce keys; else 1, 2 or 4 (KeysAtOnce) by
// DotKeys (where kDecodeKeyGroups or kDecodeOneRowFourKeys). Else key by
// key by DotRows.
template <int MR, bool kGrouped, class KV>
HWY_INLINE void ScoreKeys(DF d, int64_t keys, const float* const* q, const KV* k, int64_t k_stride, int64_t D,
                          float scale, float* s, int64_t s_stride, const int16_t* codes = nullptr,
                          const float* code_scales = nullptr) {
#if ATTN_BLOCKS_FOLDED
  if constexpr (kGrouped && MR == 1 && kBlocksFolded<KV>) {
    constexpr int G = kBlockKeysAtOnce;
    if constexpr (kDecodeCodeDots && std::is_same_v<KV, block_q8_0>)
      if (codes) {
        if (keys == G) return CodeDotKeys<G>(d, codes, code_scales, k, k_stride, D, scale, s);
        for (int64_t t = 0; t < keys; ++t) CodeDotKeys<1>(d, codes, code_scales, k + t * k_stride, k_stride, D, scale, s + t);
        return;
      }
    if (keys == G) return BlockDotKeys<G>(d, q[0], k, k_stride, D, scale, s);
    for (int64_t t = 0; t < keys; ++t) BlockDotKeys<1>(d, q[0], k + t * k_stride, k_stride, D, scale, s + t);
    return;
  }
#endif
#if ATTN_DECODE_FOUR_KEYS || ATTN_BLOCKS_FOLDED
  if constexpr (kGrouped) {
    if constexpr (KeysAtOnce(MR) == 4)
      if (keys == 4) return DotKeys<MR, 4>(d, q, k, k_stride, D, scale, s, s_stride);
    if constexpr (!ATTN_DECODE_FOUR_KEYS)
      if (keys == 2) return DotKeys<MR, 2>(d, q, k, k_stride, D, scale, s, s_stride);
    for (int64_t t = 0; t < keys; ++t) DotKeys<MR, 1>(d, q, k + t * k_stride, k_stride, D, scale, s + t, s_stride);
    return;
  }
#endif
  for (int64_t t = 0; t < keys; ++t) DotRows<MR>(d, q, k + t * k_stride, D, scale, s + t, s_stride);
}

// int8 precision over q8_0 keys (docs/semantics.md "Precision"): each query
// row rounded to q8_0, as llama.cpp's vec_dot_q8_0_q8_0 rounds it, once per
// call, with a float32 scale per block: for the int8 unit as its bytes
// (code + 128); without one (or below kDecodeUnitRows rows per kv head) as
// float32 values for the float path, and at one row per kv head where
// kDecodeCodeDots as int16 codes too. Rows in p.q's order, (batch, query
// head, query), so a kv head's rows lie together.
// P·V stays float32: on VNNI's int16 products (weight × block scale
// rounded to int16 per row, block and 64-key tile, 6.8e-5 of error added),
// V read in place, it took 5.56 ms against 4.47 (32768 keys, 32 × 8 heads
// of 128, 1 thread, Zen 5): its broadcasts and products outweigh the
// widening it spares.
struct RoundedQueries {
  const Int8Unit* unit;
  std::vector<uint8_t> bytes;  // rows × d, with the unit
  std::vector<float> scales;   // rows × d / 32
  std::vector<float> values;   // rows × d, without
  std::vector<int16_t> codes;  // rows × d, where CodeDotKeys takes them

  RoundedQueries(const core::AttentionProblem<float>& p, const Int8Unit* unit_) : unit(unit_) {
    const int64_t rows = p.batch * p.heads_q * p.n_q, blocks = p.d / kQ8_0Block;
    std::vector<block_q8_0> row_blocks(static_cast<size_t>(blocks));
    scales.resize(static_cast<size_t>(rows * blocks));
    if (unit) {
      bytes.resize(static_cast<size_t>(rows * p.d));
    } else {
      values.resize(static_cast<size_t>(rows * p.d));
      if (kDecodeCodeDots && p.group() * p.n_q == 1) codes.resize(static_cast<size_t>(rows * p.d));
    }
    for (int64_t row = 0; row < rows; ++row) {
      quantize_row_q8_0(p.q.row(row / p.n_q / p.heads_q, row / p.n_q % p.heads_q, row % p.n_q), row_blocks.data(), p.d);
      if (!unit) dequantize_row_q8_0(row_blocks.data(), values.data() + row * p.d, p.d);
      for (int64_t b = 0; b < blocks; ++b) {
        const block_q8_0& block = row_blocks[static_cast<size_t>(b)];
        scales[static_cast<size_t>(row * blocks + b)] = fp16_to_float(block.d.bits);
        for (int64_t c = 0; c < kQ8_0Block; ++c) {
          const auto at = static_cast<size_t>(row * p.d + b * kQ8_0Block + c);
          if (unit) bytes[at] = static_cast<uint8_t>(block.qs[c] + 128);
          else if (!codes.empty()) codes[at] = block.qs[c];
        }
      }
    }
  }
  // Whether q8_0 holds all of p's queries: a value not finite, or past
  // 65504 · 127 (its scale's fp16 overflows), keeps them as they are.
  static bool Fit(const core::AttentionProblem<float>& p) {
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t i = 0; i < p.n_q; ++i) {
          const float* row = p.q.row(b, h, i);
          for (int64_t c = 0; c < p.d; ++c)
            if (!(std::fabs(row[c]) <= 65504.0f * 127.0f)) return false;
        }
    return true;
  }
};

}  // namespace HWY_NAMESPACE
}  // namespace attn::kernels
HWY_AFTER_NAMESPACE();

#endif  // ATTN_KERNELS_DECODE_DOTS_INL_H_
