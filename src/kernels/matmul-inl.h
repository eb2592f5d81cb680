// The register-blocked product shared by the kernels: rows of A (in place,
// any row stride) times a packed panel of B, as in S = Q Kᵀ (flash attention)
// and Y = X Wᵀ (the layer's projections). Highway's per-target include:
// include after hwy/highway.h inside a file compiled by foreach_target.h.
#if defined(ATTN_KERNELS_MATMUL_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_KERNELS_MATMUL_INL_H_
#undef ATTN_KERNELS_MATMUL_INL_H_
#else
#define ATTN_KERNELS_MATMUL_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>
#include <type_traits>

#include "kernels/config.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// A panel is kPanel columns of B stored transposed: element (c, j) at
// panel[c * kPanel + j], so the columns are contiguous lanes. Its width is
// the attention key tile (config.hpp).
constexpr int64_t kPanel = kBlockK;
constexpr int kRows = 4;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
constexpr int kVecs = 4;  // 4 × 4 = 16 accumulators of 32 registers
#else
constexpr int kVecs = 2;  // 8 accumulators, room left on 16-register targets
#endif
#if !HWY_HAVE_SCALABLE
static_assert(kPanel % (kVecs * HWY_LANES(float)) == 0, "a panel is whole blocks of kVecs vectors");
#endif

// c[r][0 .. kVecs·N) = scale · Σ_k a_r[k] · panel[k][0 .. kVecs·N), r < MR.
// (kVecs·N divides kPanel: asserted above.)
template <int MR, class D, typename T = hn::TFromD<D>>
HWY_INLINE void MatmulBlock(D d, const T* const* a, int64_t K, const T* panel, T scale, T* c,
                            int64_t c_stride) {
  using V = hn::Vec<D>;
  const size_t N = hn::Lanes(d);
  const V sc = hn::Set(d, scale);
#if HWY_HAVE_SCALABLE
  // Sizeless (SVE, RVV) vectors cannot form arrays: one accumulator at a time.
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < kVecs; ++v) {
      V acc = hn::Zero(d);
      for (int64_t k = 0; k < K; ++k)
        acc = hn::MulAdd(hn::Set(d, a[r][k]), hn::Load(d, panel + k * kPanel + v * N), acc);
      hn::StoreU(hn::Mul(acc, sc), d, c + r * c_stride + v * N);
    }
#else
  V acc[MR][kVecs];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < kVecs; ++v) acc[r][v] = hn::Zero(d);
  for (int64_t k = 0; k < K; ++k) {
    V b[kVecs];
    for (int v = 0; v < kVecs; ++v) b[v] = hn::Load(d, panel + k * kPanel + v * N);
    for (int r = 0; r < MR; ++r) {
      const V ar = hn::Set(d, a[r][k]);
      for (int v = 0; v < kVecs; ++v) acc[r][v] = hn::MulAdd(ar, b[v], acc[r][v]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < kVecs; ++v) hn::StoreU(hn::Mul(acc[r][v], sc), d, c + r * c_stride + v * N);
#endif
}

// f(std::integral_constant<int, n>()) for 1 <= n <= Max: the micro-kernels
// take their row and vector counts as template arguments. (A lambda passed
// here needs HWY_ATTR, as every lambda in SIMD code.)
template <int Max, class F>
HWY_INLINE void WithCount(int64_t n, const F& f) {
  if constexpr (Max > 1)
    if (n < Max) return WithCount<Max - 1>(n, f);
  f(std::integral_constant<int, Max>());
}

// All kPanel columns for `rows` rows of A (rows <= kRows).
template <class D, typename T = hn::TFromD<D>>
HWY_INLINE void MatmulPanel(D d, const T* const* a, int rows, int64_t K, const T* panel, T scale,
                            T* c, int64_t c_stride) {
  const int64_t W = kVecs * static_cast<int64_t>(hn::Lanes(d));
  WithCount<kRows>(rows, [&](auto mr) HWY_ATTR {
    for (int64_t j = 0; j < kPanel; j += W)
      MatmulBlock<decltype(mr)::value>(d, a, K, panel + j, scale, c + j, c_stride);
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::detail
HWY_AFTER_NAMESPACE();

#endif  // ATTN_KERNELS_MATMUL_INL_H_
