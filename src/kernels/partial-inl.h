// Loads and stores of the first m <= lanes values at p, for the last, partial
// vector of a row: nothing is read or written past p + m. Masked loads and
// stores where the lanes left out cannot fault (HWY_MEM_OPS_MIGHT_FAULT is 0:
// AVX-512, SVE); elsewhere through a buffer, as some targets' MaskedLoad
// reads the whole vector. Loads take float32,
// bfloat16 or fp16 and give float32 lanes. Highway's per-target include:
// include after hwy/highway.h inside a file compiled by foreach_target.h.
#if defined(ATTN_KERNELS_PARTIAL_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_KERNELS_PARTIAL_INL_H_
#undef ATTN_KERNELS_PARTIAL_INL_H_
#else
#define ATTN_KERNELS_PARTIAL_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "attn/half.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// One stored value as float32. (hwy::float16_t is a struct on x86 and the
// compiler's __fp16 on Arm: go by bits.)
inline float ToFloat(float x) { return x; }
template <class H>
inline uint16_t Bits(H x) {
  uint16_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}
inline float ToFloat(hwy::bfloat16_t x) { return bf16_to_float(Bits(x)); }
inline float ToFloat(hwy::float16_t x) { return fp16_to_float(Bits(x)); }

// The m values at p as floats; the other lanes are `fill`.
template <class D, class T>
HWY_INLINE hn::Vec<D> LoadPart(D d, const T* p, int64_t m, float fill) {
  if constexpr (std::is_same_v<T, float>) {
    if (m == static_cast<int64_t>(hn::Lanes(d))) return hn::LoadU(d, p);
    // (The copy through memory below stalls on store forwarding at every
    // load, and heads of 4 or 8 dimensions have no other kind of vector.)
#if !HWY_MEM_OPS_MIGHT_FAULT
    const auto first = hn::FirstN(d, static_cast<size_t>(m));
    return hn::IfThenElse(first, hn::MaskedLoad(first, d, p), hn::Set(d, fill));
#endif
  }
  alignas(HWY_MAX_BYTES) float buf[HWY_MAX_BYTES / sizeof(float)];
  std::fill(buf, buf + hn::Lanes(d), fill);
  for (int64_t i = 0; i < m; ++i) buf[i] = ToFloat(p[i]);
  return hn::Load(d, buf);
}

// The first m lanes of v to p.
template <class D>
HWY_INLINE void StorePart(D d, hn::Vec<D> v, float* p, int64_t m) {
  if (m == static_cast<int64_t>(hn::Lanes(d))) return hn::StoreU(v, d, p);
#if !HWY_MEM_OPS_MIGHT_FAULT
  hn::BlendedStore(v, hn::FirstN(d, static_cast<size_t>(m)), d, p);
#else
  alignas(HWY_MAX_BYTES) float buf[HWY_MAX_BYTES / sizeof(float)];
  hn::Store(v, d, buf);
  std::copy(buf, buf + m, p);
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::kernels
HWY_AFTER_NAMESPACE();

#endif  // ATTN_KERNELS_PARTIAL_INL_H_
