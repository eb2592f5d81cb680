// The int8 unit of Arm CPUs with the dot-product extension (Armv8.4, and
// earlier cores that added it: Cortex-A55, A75 and later, Neoverse N1 and
// later, Graviton 2 and later, Apple M1 and later): NEON's SDOT adds 4 lanes
// × 4 signed byte products into int32 sums. Highway 1.0.3 has no such
// instruction, so this one file uses compiler intrinsics, compiled for them
// by the pragma below; arm_dotprod_unit() hands them out only when Linux
// reports the CPU has them. (Layouts and contract: int8_unit.hpp; the
// kernels: int8_blocks-inl.h.) Not
// measured for speed here: this project's Arm builds run under emulation
// only.
#include "kernels/int8_unit.hpp"

// aarch64 Linux (the CPU check is Linux's hwcaps), with a compiler whose
// arm_neon.h declares the dot-product intrinsics for a target pragma (g++;
// clang from 16: before, only for a command-line -march with them).
#if defined(__aarch64__) && defined(__linux__) && \
    (!defined(__clang__) || __clang_major__ >= 16 || defined(__ARM_FEATURE_DOTPROD))
#define ATTN_ARM_DOTPROD_UNIT 1
#endif

#if !defined(ATTN_ARM_DOTPROD_UNIT)
namespace attn::kernels {
const Int8Unit* arm_dotprod_unit() { return nullptr; }  // (see above)
}  // namespace attn::kernels
#else
#include <arm_neon.h>
#include <sys/auxv.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>

// Linux's arm64 hwcap (asm/hwcap.h)
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif

// Everything from here to the pop is compiled with the dot product, and
// runs only behind the check in arm_dotprod_unit().
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("dotprod"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")
#endif

namespace attn::kernels {
namespace {

struct NeonDotprod {
  static constexpr const char* kName = "neon_dotprod";
  static constexpr int kLanes = 4;
  using Sums = int32x4_t;
  using Codes = int8x16_t;

  static Sums Set(int32_t x) { return vdupq_n_s32(x); }
  static Codes Load(const int8_t* p) { return vld1q_s8(p); }
  static Codes Broadcast(uint32_t quad) { return vreinterpretq_s8_u32(vdupq_n_u32(quad)); }
  // SDOT's operands are signed: code + 128 with its top bit flipped is the
  // code, so no offsets are taken out
  static Codes QueryQuad(uint32_t quad) { return Broadcast(quad ^ 0x80808080u); }
  static Sums Dot(Sums acc, Codes q, Codes k) { return vdotq_s32(acc, q, k); }
  static Sums LessOffsets(Sums x, const int32_t*) { return x; }
  static void StoreScores(float* s, Sums x, float a, const float* t, float b) {
    const float32x4_t ts = vmulq_f32(vdupq_n_f32(a), vld1q_f32(t));
    vst1q_f32(s, vfmaq_f32(vdupq_n_f32(b), vcvtq_f32_s32(x), ts));
  }
  static void StoreSums(int32_t* out, Sums x) { vst1q_s32(out, x); }

  using Floats = float32x4_t;
  static Floats ZeroF() { return vdupq_n_f32(0.0f); }
  static Floats LoadF(const float* p) { return vld1q_f32(p); }
  static Floats MulAddSums(Sums x, Floats t, float a, Floats acc) {
    return vfmaq_f32(acc, vcvtq_f32_s32(x), vmulq_n_f32(t, a));
  }
  static void StoreF(float* s, Floats x, float a) { vst1q_f32(s, vmulq_n_f32(x, a)); }
  // The codes: 4 × 4 transposes of 32-bit quads, quads 0-3 of the rows,
  // then 4-7; no offsets (see QueryQuad).
  static Sums PackBlocks(const block_q8_0* blocks, int64_t row_bytes, int8_t* out, int64_t stride) {
    const auto* base = reinterpret_cast<const char*>(blocks);
    const auto block = [&](int i) { return reinterpret_cast<const block_q8_0*>(base + i * row_bytes); };
    for (int half = 0; half < 2; ++half) {
      uint32x4_t r[4];
      for (int i = 0; i < 4; ++i) r[i] = vreinterpretq_u32_s8(vld1q_s8(block(i)->qs + 16 * half));
      const uint32x4x2_t t01 = vtrnq_u32(r[0], r[1]), t23 = vtrnq_u32(r[2], r[3]);
      int8_t* o = out + 4 * half * stride;
      vst1q_u32(reinterpret_cast<uint32_t*>(o), vcombine_u32(vget_low_u32(t01.val[0]), vget_low_u32(t23.val[0])));
      vst1q_u32(reinterpret_cast<uint32_t*>(o + stride), vcombine_u32(vget_low_u32(t01.val[1]), vget_low_u32(t23.val[1])));
      vst1q_u32(reinterpret_cast<uint32_t*>(o + 2 * stride),
                vcombine_u32(vget_high_u32(t01.val[0]), vget_high_u32(t23.val[0])));
      vst1q_u32(reinterpret_cast<uint32_t*>(o + 3 * stride),
                vcombine_u32(vget_high_u32(t01.val[1]), vget_high_u32(t23.val[1])));
    }
    return Set(0);
  }
  static void WidenScales(const uint16_t* fp16, float* out) {
    vst1q_f32(out, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(fp16))));
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

const Int8Unit* arm_dotprod_unit() {
  static const bool present = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
  return present ? int8_blocks::UnitOf<NeonDotprod>() : nullptr;
}

}  // namespace attn::kernels
#endif  // ATTN_ARM_DOTPROD_UNIT
