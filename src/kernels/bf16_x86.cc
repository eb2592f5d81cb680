// The bf16 unit of x86 CPUs with AVX512_BF16 (Zen 4 and 5, Cooper Lake,
// Sapphire Rapids and later): VDPBF16PS adds 16 lanes × 2 bf16 products
// into float32 sums, twice the float32 FMA's work per instruction.
// Highway 1.0.3 has no bf16 dot product, so this one file uses compiler
// intrinsics, compiled for the instructions by the pragma below;
// avx512_bf16_unit() hands them out only when the CPU and the OS have them.
// (Layouts and contracts: bf16_unit.hpp; the kernels: bf16_blocks-inl.h.)
#include "kernels/bf16_unit.hpp"

#if !defined(__x86_64__)
namespace attn::kernels {
const BF16Unit* avx512_bf16_unit() { return nullptr; }  // (not an x86 build)
}  // namespace attn::kernels
#else
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

#include "kernels/config.hpp"
#include "kernels/x86_cpu.hpp"

// Everything from here to the pop is compiled for AVX-512 with BF16, and
// runs only behind the check in avx512_bf16_unit().
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")
#endif

namespace attn::kernels {
namespace {

struct Avx512Bf16 {
  static constexpr const char* kName = "avx512_bf16";
  static constexpr int kLanes = 16;
  using Acc = __m512;
  using Pairs = __m512bh;

  static Acc Zero() { return _mm512_setzero_ps(); }
  static Acc Set(float x) { return _mm512_set1_ps(x); }
  static Acc Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, Acc x) { _mm512_storeu_ps(p, x); }
  static Acc Add(Acc a, Acc b) { return _mm512_add_ps(a, b); }
  static Acc Mul(Acc a, Acc b) { return _mm512_mul_ps(a, b); }
  static Pairs LoadPairs(const uint32_t* p) { return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p)); }
  static Pairs Broadcast(uint32_t pair) {
    return reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(pair)));
  }
  static Acc Dot(Acc acc, Pairs a, Pairs b) { return _mm512_dpbf16_ps(acc, a, b); }

  static __mmask16 FirstN(int64_t n) {
    return n >= kLanes ? __mmask16(0xffff) : static_cast<__mmask16>((1u << std::max<int64_t>(n, 0)) - 1);
  }
  // 32 floats at a time, masked past n (VCVTNE2PS2BF16: nearest, ties to
  // even; it treats subnormals as zero).
  static void ToPairs(const float* x, int64_t n, uint32_t* out) {
    for (int64_t c = 0; c < n; c += 2 * kLanes) {
      const __m512 lo = _mm512_maskz_loadu_ps(FirstN(n - c), x + c);
      const __m512 hi = _mm512_maskz_loadu_ps(FirstN(n - c - kLanes), x + c + kLanes);
      _mm512_storeu_si512(out + c / 2, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
    }
  }
};

}  // namespace
}  // namespace attn::kernels

#include "kernels/bf16_blocks-inl.h"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace attn::kernels {

const BF16Unit* avx512_bf16_unit() {
  static const bool present = HasAvx512() && __builtin_cpu_supports("avx512bf16");
  return present ? bf16_blocks::UnitOf<Avx512Bf16>() : nullptr;
}

}  // namespace attn::kernels
#endif  // __x86_64__
