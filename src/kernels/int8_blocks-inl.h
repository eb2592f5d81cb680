// The int8 unit's kernels, written once over the few operations each
// architecture's dot-product instruction needs (int8_unit.hpp has the
// layouts). An architecture's file (int8_x86.cc, int8_arm.cc) defines
//   struct Isa {                             // in an anonymous namespace: the
//                                            // templates below then are the file's own
//     static constexpr const char* kName;    // as precision_unit reports it
//     static constexpr int kLanes;           // int32 lanes of Sums
//     using Sums, Codes;                     // kLanes int32; 4 · kLanes bytes
//     static Sums Set(int32_t);
//     static Codes Load(const int8_t*), Broadcast(uint32_t);
//     static Codes QueryQuad(uint32_t);      // a row's 4 bytes (code + 128), as Dot takes them
//     static Sums Dot(Sums, Codes q, Codes k);  // + each lane's 4 byte products
//     static Sums LessOffsets(Sums, const int32_t*);  // Σ q · k of the codes, exact
//     // x · (a · t) + b per lane, x the sums as float32, t loaded from a pointer
//     static void StoreScores(float* s, Sums x, float a, const float* t, float b);
//     static void StoreSums(int32_t*, Sums);
//     // q8_0 keys' block panels (int8_unit.hpp):
//     using Floats;                          // kLanes float32
//     static Floats ZeroF(), LoadF(const float*);
//     static Floats MulAddSums(Sums x, Floats t, float a, Floats acc);  // x · (a · t) + acc
//     static void StoreF(float* s, Floats x, float a);                 // a · x
//     // kLanes q8_0 blocks, row_bytes apart from `blocks`: their codes'
//     // quads c = 0 .. 7 as vectors at out + c · stride; returns the
//     // offsets LessOffsets takes out
//     static Sums PackBlocks(const block_q8_0* blocks, int64_t row_bytes, int8_t* out, int64_t stride);
//     static void WidenScales(const uint16_t* fp16, float* out);  // kLanes of them
//   };
// and includes this file under the pragma that compiles it for the
// instructions (after every other include: the standard headers' functions
// keep the baseline target).
#ifndef ATTN_KERNELS_INT8_BLOCKS_INL_H_
#define ATTN_KERNELS_INT8_BLOCKS_INL_H_

#include "kernels/unroll.hpp"

namespace attn::kernels::int8_blocks {

// A block of 4 rows × 4 vectors: 16 sums, more independent ones than the
// instruction's latency × throughput needs.
constexpr int kRows = 4, kVecs = 4;

// acc[r][v] = Σ over quads c in [c0, c1) of row r's quad c (its bytes at
// q + r · q_stride) · vector v of the panel's quad c: each quad of the
// query's bytes broadcast once per row, each vector of the panel's codes
// (kLanes keys × 4) loaded once per quad.
template <class Isa, int MR, int NV>
inline void DotQuads(typename Isa::Sums (&acc)[MR][NV], const uint8_t* q, int64_t q_stride, const int8_t* panel,
                     int64_t keys, int64_t c0, int64_t c1) {
  ATTN_UNROLL
  for (int r = 0; r < MR; ++r)
    ATTN_UNROLL
    for (int v = 0; v < NV; ++v) acc[r][v] = Isa::Set(0);
  for (int64_t c = c0; c < c1; ++c) {
    typename Isa::Codes k[NV];
    ATTN_UNROLL
    for (int v = 0; v < NV; ++v) k[v] = Isa::Load(panel + (c * keys + v * Isa::kLanes) * 4);
    ATTN_UNROLL
    for (int r = 0; r < MR; ++r) {
      uint32_t quad;
      std::memcpy(&quad, q + r * q_stride + 4 * c, 4);
      const typename Isa::Codes qb = Isa::QueryQuad(quad);
      ATTN_UNROLL
      for (int v = 0; v < NV; ++v) acc[r][v] = Isa::Dot(acc[r][v], qb, k[v]);
    }
  }
}

// s rows r < MR, vectors v < NV of a tile: the int32 sums become float32
// only at the end (exact: |Σ| <= d · 127 · 127 < 2^24 for d <= 1040).
template <class Isa, int MR, int NV>
void ProductBlock(const uint8_t* q, int64_t q_stride, int64_t quads, const float* q_scales,
                  const float* q_centers, const int8_t* panel, int64_t keys, float scale, float* s,
                  int64_t s_stride) {
  typename Isa::Sums acc[MR][NV];
  DotQuads<Isa>(acc, q, q_stride, panel, keys, 0, quads);
  const auto* t = reinterpret_cast<const float*>(panel + quads * keys * 4);
  const auto* offsets = reinterpret_cast<const int32_t*>(t + keys);
  // The rows' factors, read once: s's stores might alias q_scales and
  // q_centers, which would otherwise be read (and multiplied) again for each
  // vector.
  float a[MR], b[MR];
  ATTN_UNROLL
  for (int r = 0; r < MR; ++r) a[r] = scale * q_scales[r], b[r] = scale * q_centers[r];
  ATTN_UNROLL
  for (int r = 0; r < MR; ++r)
    ATTN_UNROLL
    for (int v = 0; v < NV; ++v)
      Isa::StoreScores(s + r * s_stride + v * Isa::kLanes, Isa::LessOffsets(acc[r][v], offsets + v * Isa::kLanes),
                       a[r], t + v * Isa::kLanes, b[r]);
}

// Every (rows, vectors) instantiation of a block, at [(rows - 1) · kVecs +
// vectors - 1].
template <class Isa, int... I>
constexpr auto ProductTable(std::integer_sequence<int, I...>) {
  return std::array{&ProductBlock<Isa, I / kVecs + 1, I % kVecs + 1>...};
}

// Int8Unit::products: the keys up to cols rounded up to 16, in blocks of
// kVecs vectors, the last block narrower. (The panel's scales and offsets
// sit past all `keys`: a block from key j finds them shifted by j, as its
// codes are.)
template <class Isa>
void Products(const uint8_t* q, int64_t q_stride, int rows, int64_t quads, const float* q_scales,
              const float* q_centers, const int8_t* panel, int64_t keys, float scale, float* s, int64_t s_stride,
              int64_t cols) {
  static constexpr auto table = ProductTable<Isa>(std::make_integer_sequence<int, kRows * kVecs>());
  const int64_t vecs = (cols + 15) / 16 * 16 / Isa::kLanes;
  for (int64_t v0 = 0; v0 < vecs; v0 += kVecs) {
    const auto nv = std::min<int64_t>(kVecs, vecs - v0);
    const int64_t j = v0 * Isa::kLanes;
    table[(rows - 1) * kVecs + nv - 1](q, q_stride, quads, q_scales, q_centers, panel + j * 4, keys, scale, s + j,
                                       s_stride);
  }
}

// Block panels of q8_0 keys: each vector of kLanes keys' quads, each block
// of 32 codes summed in int32, then taken to float32 (exact: |Σ q · k| <=
// 32 · 127 · 127 < 2^24) with its two scales, the query's and the key's.
constexpr int kBlockVecs = 2;  // 4 × 2 sums and as many float32 results in flight

template <class Isa, int MR, int NV>
void BlockProductBlock(const uint8_t* q, int64_t q_stride, int64_t blocks, const float* q_scales,
                       const int8_t* panel, int64_t keys, float scale, float* s, int64_t s_stride) {
  typename Isa::Floats out[MR][NV];
  ATTN_UNROLL
  for (int r = 0; r < MR; ++r)
    ATTN_UNROLL
    for (int v = 0; v < NV; ++v) out[r][v] = Isa::ZeroF();
  const auto* t = reinterpret_cast<const float*>(panel + blocks * kQ8_0Block * keys);
  const auto* offsets = reinterpret_cast<const int32_t*>(t + blocks * keys);
  for (int64_t b = 0; b < blocks; ++b) {
    typename Isa::Sums acc[MR][NV];
    DotQuads<Isa>(acc, q, q_stride, panel, keys, 8 * b, 8 * b + 8);
    ATTN_UNROLL
    for (int v = 0; v < NV; ++v) {
      const typename Isa::Floats tv = Isa::LoadF(t + b * keys + v * Isa::kLanes);
      ATTN_UNROLL
      for (int r = 0; r < MR; ++r)
        out[r][v] = Isa::MulAddSums(Isa::LessOffsets(acc[r][v], offsets + b * keys + v * Isa::kLanes), tv,
                                    q_scales[r * blocks + b], out[r][v]);
    }
  }
  ATTN_UNROLL
  for (int r = 0; r < MR; ++r)
    ATTN_UNROLL
    for (int v = 0; v < NV; ++v) Isa::StoreF(s + r * s_stride + v * Isa::kLanes, out[r][v], scale);
}

template <class Isa, int... I>
constexpr auto BlockProductTable(std::integer_sequence<int, I...>) {
  return std::array{&BlockProductBlock<Isa, I / kBlockVecs + 1, I % kBlockVecs + 1>...};
}

// Int8Unit::block_products: as Products, in blocks of kBlockVecs vectors.
template <class Isa>
void BlockProducts(const uint8_t* q, int64_t q_stride, int rows, int64_t blocks, const float* q_scales,
                   const int8_t* panel, int64_t keys, float scale, float* s, int64_t s_stride, int64_t cols) {
  static constexpr auto table = BlockProductTable<Isa>(std::make_integer_sequence<int, kRows * kBlockVecs>());
  const int64_t vecs = (cols + 15) / 16 * 16 / Isa::kLanes;
  for (int64_t v0 = 0; v0 < vecs; v0 += kBlockVecs) {
    const auto nv = std::min<int64_t>(kBlockVecs, vecs - v0);
    const int64_t j = v0 * Isa::kLanes;
    table[(rows - 1) * kBlockVecs + nv - 1](q, q_stride, blocks, q_scales, panel + j * 4, keys, scale, s + j,
                                            s_stride);
  }
}

// Int8Unit::pack_q8_0: each block of kLanes keys at a time, in place; a
// last group of fewer keys from a copy, through buffers, so that nothing
// past the group's rows is read, nor past its columns written.
template <class Isa>
void PackQ8_0(const block_q8_0* k, int64_t k_stride, int64_t n, int64_t blocks, int8_t* panel, int64_t keys,
              int64_t col) {
  constexpr int L = Isa::kLanes;
  auto* t = reinterpret_cast<float*>(panel + blocks * kQ8_0Block * keys);
  auto* offsets = reinterpret_cast<int32_t*>(t + blocks * keys);
  for (int64_t j0 = 0; j0 < n; j0 += L) {
    const int64_t m = std::min<int64_t>(L, n - j0);
    const bool whole = m == L;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t at = b * keys + col + j0;  // the group's first scale and offset
      uint16_t bits[L] = {};  // the blocks' fp16 scales, widened together
      for (int64_t i = 0; i < m; ++i) bits[i] = k[(j0 + i) * k_stride + b].d.bits;
      alignas(64) float scales[L];
      Isa::WidenScales(bits, whole ? t + at : scales);
      if (whole) {
        Isa::StoreSums(offsets + at, Isa::PackBlocks(k + j0 * k_stride + b, k_stride * int64_t{sizeof(block_q8_0)},
                                                     panel + (8 * b * keys + col + j0) * 4, keys * 4));
        continue;
      }
      block_q8_0 part[L] = {};
      for (int64_t i = 0; i < m; ++i) part[i] = k[(j0 + i) * k_stride + b];
      alignas(64) int8_t codes[8 * L * 4];
      alignas(64) int32_t sums[L];
      Isa::StoreSums(sums, Isa::PackBlocks(part, sizeof(block_q8_0), codes, L * 4));
      for (int c = 0; c < 8; ++c) std::memcpy(panel + ((8 * b + c) * keys + col + j0) * 4, codes + c * L * 4, m * 4);
      std::memcpy(t + at, scales, m * sizeof(float));
      std::memcpy(offsets + at, sums, m * sizeof(int32_t));
    }
  }
}

// Int8Unit::peak_loop: 12 independent sums (at least the pipes × the
// instruction's latency of the CPUs known), starting from different values
// so that no compiler merges them; every byte product is 1 · 1, so each
// instruction adds 4 to each lane. (The 1s are read from a volatile: exact
// integer sums of a known constant could be folded into one multiply.)
template <class Isa>
double PeakLoop(int64_t iterations, float* sink) {
  constexpr int kChains = 12;
  typename Isa::Sums acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = Isa::Set(i);
  static volatile uint32_t one_bytes = 0x01010101u;
  const typename Isa::Codes ones = Isa::Broadcast(one_bytes);
  for (int64_t it = 0; it < iterations; ++it)
    for (int i = 0; i < kChains; ++i) acc[i] = Isa::Dot(acc[i], ones, ones);
  int64_t sum = 0;
  for (int i = 0; i < kChains; ++i) {
    int32_t lanes[Isa::kLanes];
    Isa::StoreSums(lanes, acc[i]);
    for (int32_t x : lanes) sum += x;
  }
  *sink = static_cast<float>(sum);
  return 2.0 * 4 * Isa::kLanes * kChains * static_cast<double>(iterations);
}

// The unit of an Isa (constant: initialised before any code runs).
template <class Isa>
const Int8Unit* UnitOf() {
  static constexpr Int8Unit unit{Isa::kName,    Isa::kLanes,         &Products<Isa>,
                                 &PackQ8_0<Isa>, &BlockProducts<Isa>, &PeakLoop<Isa>};
  return &unit;
}

}  // namespace attn::kernels::int8_blocks

#endif  // ATTN_KERNELS_INT8_BLOCKS_INL_H_
