// The bf16 unit of Arm CPUs with BF16 (Armv8.6, and earlier cores that
// added it: Neoverse V1 and N2, Graviton 3 and later, Apple M2 and later):
// NEON's BFDOT adds 4 lanes × 2 bf16 products into float32 sums. Highway
// 1.0.3 has no bf16 dot product, so this one file uses compiler intrinsics,
// compiled for the instructions by the pragma below; arm_bf16_unit() hands
// them out only when Linux reports the CPU has them. (Layouts and
// contracts: bf16_unit.hpp; the kernels: bf16_blocks-inl.h.) Not measured
// for speed here: this project's Arm builds run under emulation only.
#include "kernels/bf16_unit.hpp"

// aarch64 Linux (the CPU check is Linux's hwcaps), with a compiler whose
// arm_neon.h declares the bf16 intrinsics for a target pragma (g++; clang
// from 16: before, only for a command-line -march with bf16).
#if defined(__aarch64__) && defined(__linux__) && \
    (!defined(__clang__) || __clang_major__ >= 16 || defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC))
#define ATTN_ARM_BF16_UNIT 1
#endif

#if !defined(ATTN_ARM_BF16_UNIT)
namespace attn::kernels {
const BF16Unit* arm_bf16_unit() { return nullptr; }  // (see above)
}  // namespace attn::kernels
#else
#include <arm_neon.h>
#include <sys/auxv.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

#include "kernels/config.hpp"

// Linux's arm64 hwcaps (asm/hwcap.h)
#ifndef HWCAP_ASIMDHP
#define HWCAP_ASIMDHP (1 << 10)
#endif
#ifndef HWCAP2_BF16
#define HWCAP2_BF16 (1 << 14)
#endif

// Everything from here to the pop is compiled with BF16, and runs only
// behind the check in arm_bf16_unit(). With FP16 too, which the check asks
// for as well: g++ 12 builds bf16 vector constants with FP16's FMOV (and the
// cores with BF16 known here, Neoverse V1 on, Graviton 3, Apple M2, have it).
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("fullfp16,bf16"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+fp16+bf16")  // (arm_neon.h declares the bf16 intrinsics for armv8.2-a+bf16)
#endif

namespace attn::kernels {
namespace {

struct NeonBf16 {
  static constexpr const char* kName = "neon_bf16";
  static constexpr int kLanes = 4;
  using Acc = float32x4_t;
  using Pairs = bfloat16x8_t;

  static Acc Zero() { return vdupq_n_f32(0.0f); }
  static Acc Set(float x) { return vdupq_n_f32(x); }
  static Acc Load(const float* p) { return vld1q_f32(p); }
  static void Store(float* p, Acc x) { vst1q_f32(p, x); }
  static Acc Add(Acc a, Acc b) { return vaddq_f32(a, b); }
  static Acc Mul(Acc a, Acc b) { return vmulq_f32(a, b); }
  static Pairs LoadPairs(const uint32_t* p) { return vreinterpretq_bf16_u32(vld1q_u32(p)); }
  static Pairs Broadcast(uint32_t pair) { return vreinterpretq_bf16_u32(vdupq_n_u32(pair)); }
  static Acc Dot(Acc acc, Pairs a, Pairs b) { return vbfdotq_f32(acc, a, b); }

  // 8 floats at a time (BFCVTN, BFCVTN2: nearest, ties to even), the last
  // ones from a copy padded with zeros.
  static void ToPairs(const float* x, int64_t n, uint32_t* out) {
    for (int64_t c = 0; c < n; c += 2 * kLanes) {
      float part[2 * kLanes] = {};
      const float* from = x + c;
      if (n - c < 2 * kLanes) {
        std::copy(x + c, x + n, part);
        from = part;
      }
      const bfloat16x8_t b = vcvtq_high_bf16_f32(vcvtq_low_bf16_f32(vld1q_f32(from)), vld1q_f32(from + kLanes));
      vst1q_u32(out + c / 2, vreinterpretq_u32_bf16(b));
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

const BF16Unit* arm_bf16_unit() {
  static const bool present =
      (getauxval(AT_HWCAP) & HWCAP_ASIMDHP) != 0 && (getauxval(AT_HWCAP2) & HWCAP2_BF16) != 0;
  return present ? bf16_blocks::UnitOf<NeonBf16>() : nullptr;
}

}  // namespace attn::kernels
#endif  // ATTN_ARM_BF16_UNIT
