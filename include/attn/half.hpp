// 16-bit floats: IEEE half (fp16) and bfloat16, as storage types (keys and
// values of attention, safetensors weights), and their conversions to and
// from float32 (round to nearest even).
#pragma once

#include <cstdint>
#include <cstring>

namespace attn {

// Storage only: arithmetic happens in float32.
struct bfloat16 {
  uint16_t bits;
};
struct float16 {
  uint16_t bits;
};

inline float bf16_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN stays NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}

// f rounded to bfloat16 and back: the values bf16 precision computes with.
inline float round_to_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // Inf, NaN
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);  // normal: rebias 15 -> 127
  } else if (mant == 0) {
    bits = sign;  // zero
  } else {  // subnormal: normalize
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_fp16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;              // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;             // rounds to Inf (>= 65520)
  if (abs < 0x33000001u) return sign;                        // rounds to zero (<= 2^-25)
  const int32_t exp = static_cast<int32_t>(abs >> 23) - 127;
  if (exp < -14) {  // subnormal half: shift the mantissa with rounding
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const int shift = -exp - 14 + 13;
    const uint32_t rounded = (mant + (1u << (shift - 1)) - 1 + ((mant >> shift) & 1u)) >> shift;
    return sign | static_cast<uint16_t>(rounded);
  }
  const uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);  // nearest even at bit 13
  return sign | static_cast<uint16_t>(((rounded >> 13) - (112u << 10)) & 0x7fffu);
}

// The element type a file stores floats in: float32, or one of the 16-bit
// types above (safetensors weights, attn/io.hpp).
enum class StorageDtype { F32, F16, BF16 };

}  // namespace attn
