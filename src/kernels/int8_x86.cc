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
  static Sums Dot(Sums acc, Codes q, Codes k) { return _mm512_dpbusd_epi32(acc, q, k); }
  static Sums LessOffsets(Sums x, const int32_t* offsets) { return _mm512_sub_epi32(x, _mm512_loadu_si512(offsets)); }
  static void StoreScores(float* s, Sums x, float a, const float* t, float b) {
    const __m512 ts = _mm512_mul_ps(_mm512_set1_ps(a), _mm512_loadu_ps(t));
    // (The zero-masked conversion: GCC 12 warns about the plain one's
    // undefined pass-through register.)
    _mm512_storeu_ps(s, _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(__mmask16(0xffff), x), ts, _mm512_set1_ps(b)));
  }
  static void StoreSums(int32_t* out, Sums x) { _mm512_storeu_si512(out, x); }
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
