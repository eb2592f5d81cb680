// 2^x for the softmax, whose exponents are scores minus their running max:
// at most kRescaleThreshold = 8 (SoftmaxStep's lazy rescale). The kernels keep scores in base-2 units (log2(e) folded into
// the scale), so this is the whole exp: a rounding, a degree-6 (bf16: 3)
// polynomial and an exponent insert.
// Highway's per-target include: include after hwy/highway.h inside a file
// compiled by foreach_target.h.
#if defined(ATTN_KERNELS_EXP2_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_KERNELS_EXP2_INL_H_
#undef ATTN_KERNELS_EXP2_INL_H_
#else
#define ATTN_KERNELS_EXP2_INL_H_
#endif

#include <hwy/highway.h>

// The shifter rounding below relies on IEEE float arithmetic as written.
#ifdef __FAST_MATH__
#error "kernels/exp2-inl.h: (x + c) - c must not be folded; build without -ffast-math"
#endif

HWY_BEFORE_NAMESPACE();
namespace attn::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// 2^x = 2^n · 2^f with n = round(x), f in [-1/2, 1/2]; 2^f by the minimax
// polynomial of Cephes' exp2f (relative error about 1e-7, two ulps at most),
// or, kForBF16, by a degree-3 one (relative error 1.0e-4, fitted here for
// bf16 precision, whose P is rounded to 2^-9 anyway: three FMAs less on
// the softmax's critical chain). Both give 2^0 = 1 exactly: a row's
// maximum weighs 1 in its sum as in P·V, where P is rounded (a constant
// term of 0.99993, the unconstrained fit, biased rows led by one key). Results below 2^-126 flush to 0, so
// x = -inf gives 0; NaN stays NaN. Meant for x <= 8 (x > 127 would
// overflow the exponent field).
template <bool kForBF16 = false, class D, class V = hn::Vec<D>>
HWY_INLINE V SoftmaxExp2(D d, V x) {
  const hn::RebindToSigned<D> di;
  // Adding 1.5·2^23 + 127 rounds x to an integer n and leaves n + 127, the
  // biased exponent of 2^n, in the low mantissa bits (|x| < 2^22).
  const V shifter = hn::Set(d, 12583039.0f);
  const V t = hn::Add(x, shifter);
  const V f = hn::Sub(x, hn::Sub(t, shifter));
  V p;
  if constexpr (kForBF16) {
    // (c0 + c1·f) + f²·(c2 + c3·f), Estrin's scheme: two operations deep,
    // not Horner's three, since the softmax waits on this chain. float32's
    // degree 6 is no faster that way, so it keeps Horner's order.
    const V hi = hn::MulAdd(hn::Set(d, 5.500892922e-2f), f, hn::Set(d, 2.422109693e-1f));
    const V lo = hn::MulAdd(hn::Set(d, 6.932829022e-1f), f, hn::Set(d, 1.0f));
    p = hn::MulAdd(hn::Mul(f, f), hi, lo);
  } else {
    p = hn::Set(d, 1.535336188319500e-4f);
    p = hn::MulAdd(p, f, hn::Set(d, 1.339887440266574e-3f));
    p = hn::MulAdd(p, f, hn::Set(d, 9.618437357674640e-3f));
    p = hn::MulAdd(p, f, hn::Set(d, 5.550332471162809e-2f));
    p = hn::MulAdd(p, f, hn::Set(d, 2.402264791363012e-1f));
    p = hn::MulAdd(p, f, hn::Set(d, 6.931472028550421e-1f));
    p = hn::MulAdd(p, f, hn::Set(d, 1.0f));
  }
  // n + 127 shifted into the exponent field is 2^n for n >= -126; below
  // that (and for -inf, where t is not an integer) the result is masked.
  const V two_n = hn::BitCast(d, hn::ShiftLeft<23>(hn::BitCast(di, t)));
  return hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, -126.0f)), hn::Mul(p, two_n));
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::kernels
HWY_AFTER_NAMESPACE();

#endif  // ATTN_KERNELS_EXP2_INL_H_
