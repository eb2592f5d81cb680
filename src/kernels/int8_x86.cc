// The int8 unit of x86 CPUs with AVX512_VNNI (Cascade Lake, Ice Lake,
// Sapphire Rapids and later Xeons, Zen 4 and 5): VPDPBUSD adds 16 lanes × 4
// byte products into int32 sums, four times the float32 FMA's multiplies
// per instruction (2.4-2.6x its products per second measured on an Intel
// Xeon, docs/performance.md). Highway 1.0.3 has no such instruction, so
// this one file uses compiler intrinsics, compiled for them by the pragma
// below; avx512_vnni_unit() hands them out only when the CPU and the OS have
// them. (Layouts and contract: int8_unit.hpp.)
#include "kernels/int8_unit.hpp"

#include <atomic>

#include "kernels/attention_kernel.hpp"

#if !defined(__x86_64__)
namespace attn::detail {
const Int8Unit* avx512_vnni_unit() { return nullptr; }  // (not an x86 build)
}  // namespace attn::detail
#else
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/x86_cpu.hpp"

// Everything from here to the pop is compiled for AVX-512 with VNNI, and
// runs only behind the check in avx512_vnni_unit().
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni")
#endif

namespace attn::detail {
namespace {

constexpr int kLanes = 16;

// kRows query rows × kVecs vectors of 16 keys: each quad of Q's bytes is
// broadcast once per row and each vector of K's codes loaded once per quad;
// the int32 sums, less the offsets, become float32 only at the end (exact:
// |Σ| <= d · 127 · 127 < 2^24 for d <= 1040).
template <int kRows, int kVecs>
void Block(const uint8_t* q, int64_t q_stride, int64_t quads, const float* q_scales, const float* q_centers,
           const int8_t* panel, int64_t keys, float scale, float* s, int64_t s_stride) {
  __m512i acc[kRows][kVecs];
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm512_setzero_si512();
  for (int64_t c = 0; c < quads; ++c) {
    __m512i k[kVecs];
    for (int v = 0; v < kVecs; ++v) k[v] = _mm512_loadu_si512(panel + (c * keys + v * kLanes) * 4);
    for (int r = 0; r < kRows; ++r) {
      int32_t quad;
      std::memcpy(&quad, q + r * q_stride + 4 * c, 4);
      const __m512i qb = _mm512_set1_epi32(quad);
      for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], qb, k[v]);
    }
  }
  const auto* t = reinterpret_cast<const float*>(panel + quads * keys * 4);
  const auto* offsets = reinterpret_cast<const int32_t*>(t + keys);
  for (int r = 0; r < kRows; ++r) {
    const __m512 a = _mm512_set1_ps(scale * q_scales[r]), b = _mm512_set1_ps(scale * q_centers[r]);
    for (int v = 0; v < kVecs; ++v) {
      const __m512i sum = _mm512_sub_epi32(acc[r][v], _mm512_loadu_si512(offsets + v * kLanes));
      const __m512 ts = _mm512_mul_ps(a, _mm512_loadu_ps(t + v * kLanes));
      // (The zero-masked conversion: GCC 12 warns about the plain one's
      // undefined pass-through register.)
      const __m512 x = _mm512_maskz_cvtepi32_ps(__mmask16(0xffff), sum);
      _mm512_storeu_ps(s + r * s_stride + v * kLanes, _mm512_fmadd_ps(x, ts, b));
    }
  }
}

template <int kRows>
void Rows(const uint8_t* q, int64_t q_stride, int64_t quads, const float* q_scales, const float* q_centers,
          const int8_t* panel, int64_t keys, float scale, float* s, int64_t s_stride, int64_t vecs) {
  switch (vecs) {
    case 1: return Block<kRows, 1>(q, q_stride, quads, q_scales, q_centers, panel, keys, scale, s, s_stride);
    case 2: return Block<kRows, 2>(q, q_stride, quads, q_scales, q_centers, panel, keys, scale, s, s_stride);
    case 3: return Block<kRows, 3>(q, q_stride, quads, q_scales, q_centers, panel, keys, scale, s, s_stride);
    default: return Block<kRows, 4>(q, q_stride, quads, q_scales, q_centers, panel, keys, scale, s, s_stride);
  }
}

void Products(const uint8_t* q, int64_t q_stride, int rows, int64_t quads, const float* q_scales,
              const float* q_centers, const int8_t* panel, int64_t keys, float scale, float* s, int64_t s_stride,
              int64_t cols) {
  // Four vectors (64 keys) at a time, the rest in one block.
  for (int64_t j = 0; j < cols; j += 4 * kLanes) {
    const int64_t vecs = std::min<int64_t>(4, (cols - j + kLanes - 1) / kLanes);
    const int8_t* kp = panel + j * 4;
    // (The scales and offsets sit past all `keys` of the panel: a block
    // from key j finds them shifted by j, as its codes are.)
    switch (rows) {
      case 1: Rows<1>(q, q_stride, quads, q_scales, q_centers, kp, keys, scale, s + j, s_stride, vecs); break;
      case 2: Rows<2>(q, q_stride, quads, q_scales, q_centers, kp, keys, scale, s + j, s_stride, vecs); break;
      case 3: Rows<3>(q, q_stride, quads, q_scales, q_centers, kp, keys, scale, s + j, s_stride, vecs); break;
      default: Rows<4>(q, q_stride, quads, q_scales, q_centers, kp, keys, scale, s + j, s_stride, vecs); break;
    }
  }
}

// Int8Unit::peak_loop: 12 independent sums (more than 2 pipes × the
// instruction's latency), starting from different values so that no
// compiler merges them; every byte product is 1 · 1, so each instruction
// adds 4 to each lane.
double PeakLoop(int64_t iterations, float* sink) {
  constexpr int kChains = 12;
  __m512i acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_epi32(i);
  const __m512i ones = _mm512_set1_epi8(1);
  for (int64_t it = 0; it < iterations; ++it)
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], ones, ones);
  __m512i total = acc[0];
  for (int i = 1; i < kChains; ++i) total = _mm512_add_epi32(total, acc[i]);
  // (Summed through memory: GCC 12's _mm512_reduce_add_epi32 warns about an
  // undefined register it passes through.)
  alignas(64) int32_t lanes[kLanes];
  _mm512_store_si512(lanes, total);
  int64_t sum = 0;
  for (int32_t x : lanes) sum += x;
  *sink = static_cast<float>(sum);
  return 2.0 * 4 * kLanes * kChains * static_cast<double>(iterations);
}

}  // namespace
}  // namespace attn::detail

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace attn::detail {

const Int8Unit* avx512_vnni_unit() {
  static const bool present = HasAvx512() && __builtin_cpu_supports("avx512vnni");
  static const Int8Unit unit{"avx512_vnni", &Products, &PeakLoop};
  return present ? &unit : nullptr;
}

}  // namespace attn::detail
#endif  // __x86_64__

namespace attn::detail {
namespace {
std::atomic<bool> int8_unit_on{true};
}  // namespace

const Int8Unit* int8_unit() { return int8_unit_on.load(std::memory_order_relaxed) ? avx512_vnni_unit() : nullptr; }

const char* int8_prefill_unit() {
  const Int8Unit* unit = int8_unit();
  return unit ? unit->name : "highway";
}

void set_int8_unit_use(bool use) { int8_unit_on.store(use, std::memory_order_relaxed); }

double int8_peak_loop(int64_t iterations, float* sink) {
  const Int8Unit* unit = avx512_vnni_unit();
  return unit ? unit->peak_loop(iterations, sink) : 0.0;
}

}  // namespace attn::detail
