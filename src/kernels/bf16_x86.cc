// The bf16 unit of x86 CPUs with AVX512_BF16 (Zen 4 and 5, Cooper Lake,
// Sapphire Rapids and later): VDPBF16PS adds 16 lanes × 2 bf16 products
// into float32 sums, twice the float32 FMA's work per instruction.
// Highway 1.0.3 has no bf16 dot product, so this one file uses compiler
// intrinsics, each function compiled for the instructions by its target
// attribute; avx512_bf16_unit() hands them out only when the CPU and the
// OS have them. (Layouts and contracts: bf16_unit.hpp.)
#include "kernels/bf16_unit.hpp"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

#include "kernels/config.hpp"

// On a function, not a #pragma over the file: the standard headers'
// functions keep the baseline target.
#define ATTN_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

namespace attn::detail {
namespace {

constexpr int kLanes = 16;
// A block of 4 rows × 4 vectors: 16 accumulators of the 32 registers, more
// independent sums than the unit's latency × throughput needs.
constexpr int kRows = 4, kVecs = 4;
constexpr int64_t kTilePairs = kBlockK / 2;
static_assert(kTilePairs % kLanes == 0, "a tile's P row is whole vectors of pairs");

ATTN_AVX512_BF16 inline __mmask16 FirstN(int64_t n) {
  return n >= kLanes ? __mmask16(0xffff) : static_cast<__mmask16>((1u << std::max<int64_t>(n, 0)) - 1);
}

// The first n floats of x as ceil(n / 2) pairs (x[2i], x[2i + 1]) at out,
// rounded to bf16 (nearest, ties to even; exact for bf16 values), zero
// past n; whole vectors of 16 pairs are written.
ATTN_AVX512_BF16 void ToPairs(const float* x, int64_t n, uint32_t* out) {
  for (int64_t c = 0; c < n; c += 2 * kLanes) {
    const __m512 lo = _mm512_maskz_loadu_ps(FirstN(n - c), x + c);
    const __m512 hi = _mm512_maskz_loadu_ps(FirstN(n - c - kLanes), x + c + kLanes);
    _mm512_storeu_si512(out + c / 2, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
  }
}

ATTN_AVX512_BF16 inline __m512bh Broadcast(uint32_t pair) {
  return reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(pair)));
}
ATTN_AVX512_BF16 inline __m512bh LoadPairs(const uint32_t* p) {
  return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p));
}

// s rows r < MR, vectors v < NV of a tile: each query pair broadcast
// against NV vectors of 16 keys' pairs.
template <int MR, int NV>
ATTN_AVX512_BF16 void ProductBlock(const uint32_t* q, int64_t q_stride, int64_t pairs, const uint32_t* panel,
                                   float scale, float* s, int64_t s_stride) {
  __m512 acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t c = 0; c < pairs; ++c) {
    __m512bh b[NV];
    for (int v = 0; v < NV; ++v) b[v] = LoadPairs(panel + c * kBlockK + v * kLanes);
    for (int r = 0; r < MR; ++r) {
      const __m512bh a = Broadcast(q[r * q_stride + c]);
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a, b[v]);
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(s + r * s_stride + v * kLanes, _mm512_mul_ps(acc[r][v], sc));
}

// o rows r < MR, vectors v < NV += the P rows' key pairs (pp, kTilePairs
// apart) against the V tile's pairs.
template <int MR, int NV>
ATTN_AVX512_BF16 void AccumulateBlock(const uint32_t* pp, int64_t pairs, const uint32_t* v0, int64_t dvp, float* o,
                                      int64_t o_stride) {
  __m512 acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_loadu_ps(o + r * o_stride + v * kLanes);
  for (int64_t i = 0; i < pairs; ++i) {
    __m512bh b[NV];
    for (int v = 0; v < NV; ++v) b[v] = LoadPairs(v0 + i * dvp + v * kLanes);
    for (int r = 0; r < MR; ++r) {
      const __m512bh a = Broadcast(pp[r * kTilePairs + i]);
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a, b[v]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(o + r * o_stride + v * kLanes, acc[r][v]);
}

// Every (rows, vectors) instantiation of a block, indexed [rows - 1][vectors - 1].
template <int MR, int NV>
struct ProductOf {
  static constexpr auto fn = &ProductBlock<MR, NV>;
};
template <int MR, int NV>
struct AccumulateOf {
  static constexpr auto fn = &AccumulateBlock<MR, NV>;
};
template <template <int, int> class Block, int... I>
constexpr auto MakeTable(std::integer_sequence<int, I...>) {
  return std::array{Block<I / kVecs + 1, I % kVecs + 1>::fn...};
}
template <template <int, int> class Block>
constexpr auto kTable = MakeTable<Block>(std::make_integer_sequence<int, kRows * kVecs>());

void Products(const uint32_t* q, int64_t q_stride, int rows, int64_t pairs, const uint32_t* panel, float scale,
              float* s, int64_t s_stride, int64_t cols) {
  const int64_t vecs = (cols + kLanes - 1) / kLanes;
  for (int64_t v0 = 0; v0 < vecs; v0 += kVecs) {
    const auto nv = std::min<int64_t>(kVecs, vecs - v0);
    kTable<ProductOf>[(rows - 1) * kVecs + nv - 1](q, q_stride, pairs, panel + v0 * kLanes, scale,
                                                    s + v0 * kLanes, s_stride);
  }
}

void Accumulate(const float* p, int64_t p_stride, int rows, int64_t count, const uint32_t* v, int64_t dvp, float* o,
                int64_t o_stride) {
  alignas(64) uint32_t pp[kRows * kTilePairs];
  const int64_t pairs = (count + 1) / 2, vecs = dvp / kLanes;
  for (int r0 = 0; r0 < rows; r0 += kRows) {
    const int mr = std::min(kRows, rows - r0);
    for (int r = 0; r < mr; ++r) ToPairs(p + (r0 + r) * p_stride, count, pp + r * kTilePairs);
    for (int64_t v0 = 0; v0 < vecs; v0 += kVecs) {
      const auto nv = std::min<int64_t>(kVecs, vecs - v0);
      kTable<AccumulateOf>[(mr - 1) * kVecs + nv - 1](pp, pairs, v + v0 * kLanes, dvp,
                                                       o + r0 * o_stride + v0 * kLanes, o_stride);
    }
  }
}

// 12 independent sums (more than 2 pipes × the instruction's latency).
ATTN_AVX512_BF16 double PeakLoop(int64_t iterations, float* sink) {
  constexpr int kChains = 12;
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512bh ones = Broadcast(0x3f803f80u), tiny = Broadcast(0x33d633d6u);  // (1, 1), (1e-7, 1e-7)
  for (int64_t it = 0; it < iterations; ++it)
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], ones, tiny);
  __m512 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm512_add_ps(sum, acc[i]);
  alignas(64) float lanes[kLanes];
  _mm512_store_ps(lanes, sum);
  *sink = 0;
  for (float x : lanes) *sink += x;
  return 4.0 * kLanes * kChains * static_cast<double>(iterations);
}

}  // namespace

const BF16Unit* avx512_bf16_unit() {
  static const BF16Unit unit{"avx512_bf16", &ToPairs, &Products, &Accumulate, &PeakLoop};
  // (GCC's and clang's checks include the OS's saving of the AVX-512 state.)
  static const bool present = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
  }();
  return present ? &unit : nullptr;
}

}  // namespace attn::detail
