// The bf16 unit's kernels, written once over the few operations each
// architecture's dot-product instruction needs (bf16_unit.hpp has the
// layouts). An architecture's file (bf16_x86.cc, bf16_arm.cc) defines
//   struct Isa {                            // in an anonymous namespace: the
//                                           // templates below then are the file's own
//     static constexpr const char* kName;   // as precision_unit reports it
//     static constexpr int kLanes;          // float32 lanes of Acc
//     using Acc, Pairs;                     // kLanes floats; kLanes bf16 pairs
//     static Acc Zero(), Set(float), Load(const float*);
//     static void Store(float*, Acc);
//     static Acc Add(Acc, Acc), Mul(Acc, Acc);
//     static Pairs LoadPairs(const uint32_t*), Broadcast(uint32_t pair);
//     static Acc Dot(Acc, Pairs, Pairs);    // acc + the pairs' two products per lane
//     static void ToPairs(const float* x, int64_t n, uint32_t* out);  // BF16Unit::to_pairs
//   };
// and includes this file under the pragma that compiles it for the
// instructions (after every other include: the standard headers' functions
// keep the baseline target).
#ifndef ATTN_KERNELS_BF16_BLOCKS_INL_H_
#define ATTN_KERNELS_BF16_BLOCKS_INL_H_

#include "kernels/unroll.hpp"

namespace attn::kernels::bf16_blocks {

// A block of 4 rows × 4 vectors: 16 accumulators, more independent sums
// than the instruction's latency × throughput needs (kMinSums, config.hpp).
constexpr int kRows = 4, kVecs = 4;
constexpr int64_t kStepPairs = kBF16StepKeys / 2;  // of a P row, paired

// acc[r][v] += pair(a_r, i) · vector v of b's pairs row i
template <class Isa, int MR, int NV>
inline void DotPair(typename Isa::Acc (&acc)[MR][NV], const uint32_t* a, int64_t a_stride, const uint32_t* b,
                    int64_t b_stride, int64_t i) {
  typename Isa::Pairs bv[NV];
  ATTN_UNROLL
  for (int v = 0; v < NV; ++v) bv[v] = Isa::LoadPairs(b + i * b_stride + v * Isa::kLanes);
  ATTN_UNROLL
  for (int r = 0; r < MR; ++r) {
    const typename Isa::Pairs av = Isa::Broadcast(a[r * a_stride + i]);
    ATTN_UNROLL
    for (int v = 0; v < NV; ++v) acc[r][v] = Isa::Dot(acc[r][v], av, bv[v]);
  }
}

// acc[r][v] += Σ_i pair(a_r, i) · vector v of b's pairs row i, for r < MR,
// v < NV, i < pairs: row r's pairs at a + r · a_stride, b's rows b_stride
// pairs apart. Each pair of a is broadcast against NV vectors of b's. Pair
// i goes to set i mod kSets (kMinSums; the pairs past the last whole round
// to set 0), the sets summed into acc at the end.
template <class Isa, int MR, int NV>
inline void DotPairs(typename Isa::Acc (&acc)[MR][NV], const uint32_t* a, int64_t a_stride, const uint32_t* b,
                     int64_t b_stride, int64_t pairs) {
  constexpr int kSets = (kMinSums + MR * NV - 1) / (MR * NV);
  int64_t i = 0;
  if constexpr (kSets > 1) {
    typename Isa::Acc more[kSets - 1][MR][NV];
    ATTN_UNROLL
    for (int k = 0; k < kSets - 1; ++k)
      ATTN_UNROLL
      for (int r = 0; r < MR; ++r)
        ATTN_UNROLL
        for (int v = 0; v < NV; ++v) more[k][r][v] = Isa::Zero();
    for (; i + kSets <= pairs; i += kSets) {
      DotPair<Isa>(acc, a, a_stride, b, b_stride, i);
      ATTN_UNROLL
      for (int k = 0; k < kSets - 1; ++k) DotPair<Isa>(more[k], a, a_stride, b, b_stride, i + 1 + k);
    }
    ATTN_UNROLL
    for (int k = 0; k < kSets - 1; ++k)
      ATTN_UNROLL
      for (int r = 0; r < MR; ++r)
        ATTN_UNROLL
        for (int v = 0; v < NV; ++v) acc[r][v] = Isa::Add(acc[r][v], more[k][r][v]);
  }
  for (; i < pairs; ++i) DotPair<Isa>(acc, a, a_stride, b, b_stride, i);
}

// s rows r < MR, vectors v < NV of a tile: the query pairs against the key
// panel's.
template <class Isa, int MR, int NV>
void ProductBlock(const uint32_t* q, int64_t q_stride, int64_t pairs, const uint32_t* panel, float scale,
                  float* s, int64_t s_stride) {
  typename Isa::Acc acc[MR][NV];
  ATTN_UNROLL
  for (int r = 0; r < MR; ++r)
    ATTN_UNROLL
    for (int v = 0; v < NV; ++v) acc[r][v] = Isa::Zero();
  DotPairs<Isa>(acc, q, q_stride, panel, kBlockK, pairs);
  const typename Isa::Acc sc = Isa::Set(scale);
  ATTN_UNROLL
  for (int r = 0; r < MR; ++r)
    ATTN_UNROLL
    for (int v = 0; v < NV; ++v) Isa::Store(s + r * s_stride + v * Isa::kLanes, Isa::Mul(acc[r][v], sc));
}

// o rows r < MR, vectors v < NV += the P rows' key pairs (pp, kStepPairs
// apart) against the V tile's pairs.
template <class Isa, int MR, int NV>
void AccumulateBlock(const uint32_t* pp, int64_t pairs, const uint32_t* v0, int64_t dvp, float* o,
                     int64_t o_stride) {
  typename Isa::Acc acc[MR][NV];
  ATTN_UNROLL
  for (int r = 0; r < MR; ++r)
    ATTN_UNROLL
    for (int v = 0; v < NV; ++v) acc[r][v] = Isa::Load(o + r * o_stride + v * Isa::kLanes);
  DotPairs<Isa>(acc, pp, kStepPairs, v0, dvp, pairs);
  ATTN_UNROLL
  for (int r = 0; r < MR; ++r)
    ATTN_UNROLL
    for (int v = 0; v < NV; ++v) Isa::Store(o + r * o_stride + v * Isa::kLanes, acc[r][v]);
}

// Every (rows, vectors) instantiation of a block, at [(rows - 1) · kVecs +
// vectors - 1].
template <class Isa, int... I>
constexpr auto ProductTable(std::integer_sequence<int, I...>) {
  return std::array{&ProductBlock<Isa, I / kVecs + 1, I % kVecs + 1>...};
}
template <class Isa, int... I>
constexpr auto AccumulateTable(std::integer_sequence<int, I...>) {
  return std::array{&AccumulateBlock<Isa, I / kVecs + 1, I % kVecs + 1>...};
}

// BF16Unit::products: the keys in blocks of kVecs vectors, the last block
// narrower.
template <class Isa>
void Products(const uint32_t* q, int64_t q_stride, int rows, int64_t pairs, const uint32_t* panel, float scale,
              float* s, int64_t s_stride, int64_t cols) {
  static constexpr auto table = ProductTable<Isa>(std::make_integer_sequence<int, kRows * kVecs>());
  const int64_t vecs = (cols + Isa::kLanes - 1) / Isa::kLanes;
  for (int64_t v0 = 0; v0 < vecs; v0 += kVecs) {
    const auto nv = std::min<int64_t>(kVecs, vecs - v0);
    table[(rows - 1) * kVecs + nv - 1](q, q_stride, pairs, panel + v0 * Isa::kLanes, scale, s + v0 * Isa::kLanes,
                                       s_stride);
  }
}

// BF16Unit::accumulate: 4 P rows paired at a time, then the value columns
// in blocks of kVecs vectors.
template <class Isa>
void Accumulate(const float* p, int64_t p_stride, int rows, int64_t count, const uint32_t* v, int64_t dvp, float* o,
                int64_t o_stride) {
  static constexpr auto table = AccumulateTable<Isa>(std::make_integer_sequence<int, kRows * kVecs>());
  static_assert(kStepPairs % 16 == 0, "a step's P row is whole vectors of pairs on every unit");
  alignas(64) uint32_t pp[kRows * kStepPairs];
  const int64_t pairs = (count + 1) / 2, vecs = dvp / Isa::kLanes;
  for (int r0 = 0; r0 < rows; r0 += kRows) {
    const int mr = std::min(kRows, rows - r0);
    for (int r = 0; r < mr; ++r) Isa::ToPairs(p + (r0 + r) * p_stride, count, pp + r * kStepPairs);
    for (int64_t v0 = 0; v0 < vecs; v0 += kVecs) {
      const auto nv = std::min<int64_t>(kVecs, vecs - v0);
      table[(mr - 1) * kVecs + nv - 1](pp, pairs, v + v0 * Isa::kLanes, dvp, o + r0 * o_stride + v0 * Isa::kLanes,
                                       o_stride);
    }
  }
}

// BF16Unit::peak_loop: kMinSums independent sums, starting from different
// values so that no compiler merges them.
template <class Isa>
double PeakLoop(int64_t iterations, float* sink) {
  typename Isa::Acc acc[kMinSums];
  for (int i = 0; i < kMinSums; ++i) acc[i] = Isa::Set(static_cast<float>(i));
  const typename Isa::Pairs ones = Isa::Broadcast(0x3f803f80u), tiny = Isa::Broadcast(0x33d633d6u);  // 1; 1e-7
  for (int64_t it = 0; it < iterations; ++it)
    for (int i = 0; i < kMinSums; ++i) acc[i] = Isa::Dot(acc[i], ones, tiny);
  alignas(64) float lanes[Isa::kLanes];
  *sink = 0;
  for (int i = 0; i < kMinSums; ++i) {
    Isa::Store(lanes, acc[i]);
    for (float x : lanes) *sink += x;
  }
  return 4.0 * Isa::kLanes * kMinSums * static_cast<double>(iterations);
}

// The unit of an Isa (constant: initialised before any code runs).
template <class Isa>
const BF16Unit* UnitOf() {
  static constexpr BF16Unit unit{Isa::kName,       Isa::kLanes,      &Isa::ToPairs,
                                 &Products<Isa>,   &Accumulate<Isa>, &PeakLoop<Isa>};
  return &unit;
}

}  // namespace attn::kernels::bf16_blocks

#endif  // ATTN_KERNELS_BF16_BLOCKS_INL_H_
