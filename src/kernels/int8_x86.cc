// The int8 unit of x86 CPUs with AVX512_VNNI (Cascade Lake, Ice Lake,
// Sapphire Rapids and later Xeons, Zen 4 and 5): VPDPBUSD adds 16 lanes × 4
// byte products into int32 sums, four times the float32 FMA's multiplies
// per instruction. Highway 1.0.3 has no such instruction, so
// this one file uses compiler intrinsics, compiled for them by the pragma
// below; avx512_vnni_unit() hands them out only when the CPU and the OS have
// them. (Layouts and contract: int8_unit.hpp; the kernels:
// int8_blocks-inl.h.)
#include "kernels/int8_unit.hpp"

#if !defined(__x86_64__)
namespace attn::kernels {
const Int8Unit* avx512_vnni_unit() { return nullptr; }  // (not an x86 build)
}  // namespace attn::kernels
#else
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#include "kernels/x86_cpu.hpp"

// Everything from here to the pop is compiled for AVX-512 with VNNI, and
// runs only behind the check in avx512_vnni_unit().
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni")
#endif

namespace attn::kernels {
namespace {

struct Avx512Vnni {
  static constexpr const char* kName = "avx512_vnni";
  static constexpr int kLanes = 16;
  using Sums = __m512i;
  using Codes = __m512i;

  static Sums Set(int32_t x) { return _mm512_set1_epi32(x); }
  static Codes Load(const int8_t* p) { return _mm512_loadu_si512(p); }
  static Codes Broadcast(uint32_t quad) { return _mm512_set1_epi32(static_cast<int>(quad)); }
  // VPDPBUSD's first operand is unsigned: the bytes as they are, code + 128
  static Codes QueryQuad(uint32_t quad) { return Broadcast(quad); }
  // In place, as the instruction is: through the intrinsic, GCC 12 copied
  // each of a block's 16 sums to another register and back around every
  // VPDPBUSD (32 moves and 2 spills per 16 products), and prefill at int8
  // precision took 1.03x the time (n = 4096, 8 heads of 64, 1 thread, Zen 4).
  // (Registers only: the sanitizers check the loads, not an asm's operands.)
  static Sums Dot(Sums acc, Codes q, Codes k) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(q), "v"(k));
    return acc;
  }
  static Sums LessOffsets(Sums x, const int32_t* offsets) { return _mm512_sub_epi32(x, _mm512_loadu_si512(offsets)); }
  static void StoreScores(float* s, Sums x, float a, const float* t, float b) {
    const __m512 ts = _mm512_mul_ps(_mm512_set1_ps(a), _mm512_loadu_ps(t));
    // (The zero-masked conversion: GCC 12 warns about the plain one's
    // undefined pass-through register.)
    _mm512_storeu_ps(s, _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(__mmask16(0xffff), x), ts, _mm512_set1_ps(b)));
  }
  static void StoreSums(int32_t* out, Sums x) { _mm512_storeu_si512(out, x); }

  using Floats = __m512;
  static Floats ZeroF() { return _mm512_setzero_ps(); }
  static Floats LoadF(const float* p) { return _mm512_loadu_ps(p); }
  static Floats MulAddSums(Sums x, Floats t, float a, Floats acc) {
    return _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(__mmask16(0xffff), x), _mm512_mul_ps(t, _mm512_set1_ps(a)), acc);
  }
  static void StoreF(float* s, Floats x, float a) { _mm512_storeu_ps(s, _mm512_mul_ps(x, _mm512_set1_ps(a))); }
  // The codes: a 16 × 8 transpose of 32-bit quads, rows i and i + 8 side by
  // side in one vector, an 8 × 8 transpose in each half (two rounds of
  // unpacking within 128-bit blocks, then 64-bit pairs picked across both
  // vectors). (Zero-masked forms throughout, as in StoreScores.)
  static Sums PackBlocks(const block_q8_0* blocks, int64_t row_bytes, int8_t* out, int64_t stride) {
    const __mmask16 all16 = 0xffff;
    const __mmask8 all8 = 0xff;
    const auto* base = reinterpret_cast<const char*>(blocks);
    const auto codes = [&](int i) { return base + i * row_bytes + offsetof(block_q8_0, qs); };
    __m512i x[8], y[8];
    for (int i = 0; i < 8; ++i)
      x[i] = _mm512_maskz_inserti64x4(all8, _mm512_maskz_loadu_epi64(0x0f, codes(i)),
                                      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes(i + 8))), 1);
    for (int i = 0; i < 8; i += 2) {
      y[i] = _mm512_maskz_unpacklo_epi32(all16, x[i], x[i + 1]);
      y[i + 1] = _mm512_maskz_unpackhi_epi32(all16, x[i], x[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
      x[i] = _mm512_maskz_unpacklo_epi64(all8, y[i], y[i + 2]);
      x[i + 1] = _mm512_maskz_unpackhi_epi64(all8, y[i], y[i + 2]);
      x[i + 2] = _mm512_maskz_unpacklo_epi64(all8, y[i + 1], y[i + 3]);
      x[i + 3] = _mm512_maskz_unpackhi_epi64(all8, y[i + 1], y[i + 3]);
    }
    // x[c] (c < 4) holds quad c of rows 0-3 and 8-11 in its blocks 0 and 2,
    // quad c + 4 in blocks 1 and 3; x[c + 4] the same of rows 4-7, 12-15.
    const __m512i low = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), high = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    const __m512i u128 = _mm512_set1_epi8(-128);
    __m512i offsets = _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) {
      const __m512i quad = _mm512_permutex2var_epi64(x[c], low, x[c + 4]);
      const __m512i quad4 = _mm512_permutex2var_epi64(x[c], high, x[c + 4]);
      _mm512_storeu_si512(out + c * stride, quad);
      _mm512_storeu_si512(out + (c + 4) * stride, quad4);
      offsets = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(offsets, u128, quad), u128, quad4);
    }
    return offsets;
  }
  static void WidenScales(const uint16_t* fp16, float* out) {
    _mm512_storeu_ps(out, _mm512_maskz_cvtph_ps(__mmask16(0xffff), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(fp16))));
  }

};

}  // namespace
}  // namespace attn::kernels

#include "kernels/int8_blocks-inl.h"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace attn::kernels {

const Int8Unit* avx512_vnni_unit() {
  static const bool present = HasAvx512() && __builtin_cpu_supports("avx512vnni");
  return present ? int8_blocks::UnitOf<Avx512Vnni>() : nullptr;
}

}  // namespace attn::kernels
#endif  // __x86_64__
