// Loads and stores of the first m <= lanes floats at p, for the last, partial
// vector of a row: nothing is read or written past p + m (MaskedLoad would
// do on some targets, but others read the whole vector). Highway's
// per-target include: include after hwy/highway.h inside a file compiled by
// foreach_target.h.
#if defined(ATTN_KERNELS_PARTIAL_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_KERNELS_PARTIAL_INL_H_
#undef ATTN_KERNELS_PARTIAL_INL_H_
#else
#define ATTN_KERNELS_PARTIAL_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>

HWY_BEFORE_NAMESPACE();
namespace attn::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The m floats at p; the other lanes are `fill`.
template <class D>
HWY_INLINE hn::Vec<D> LoadPart(D d, const float* p, int64_t m, float fill) {
  if (m == static_cast<int64_t>(hn::Lanes(d))) return hn::LoadU(d, p);
  alignas(HWY_MAX_BYTES) float buf[HWY_MAX_BYTES / sizeof(float)];
  std::fill(buf, buf + hn::Lanes(d), fill);
  std::copy(p, p + m, buf);
  return hn::Load(d, buf);
}

// The first m lanes of v to p.
template <class D>
HWY_INLINE void StorePart(D d, hn::Vec<D> v, float* p, int64_t m) {
  if (m == static_cast<int64_t>(hn::Lanes(d))) return hn::StoreU(v, d, p);
  alignas(HWY_MAX_BYTES) float buf[HWY_MAX_BYTES / sizeof(float)];
  hn::Store(v, d, buf);
  std::copy(buf, buf + m, p);
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::detail
HWY_AFTER_NAMESPACE();

#endif  // ATTN_KERNELS_PARTIAL_INL_H_
