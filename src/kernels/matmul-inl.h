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
#include <utility>

#include "kernels/config.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::kernels {
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

// Sizeless vectors (SVE, RVV) cannot form arrays, nor be members of a
// struct, so there the micro-kernels keep their accumulators in eight named
// variables: Acc<I>(a0, ..., a7) is the I-th, and Unroll<Count>(f) calls
// f(std::integral_constant<int, i>()) for i < Count, the loop over them.
// Inlined, each named variable is one register, as each array element is on
// the other targets.
template <int Count, class F, int... I>
HWY_INLINE void UnrollSequence(const F& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>()), ...);
}
template <int Count, class F>
HWY_INLINE void Unroll(const F& f) {
  UnrollSequence<Count>(f, std::make_integer_sequence<int, Count>());
}
template <int I, class V>
HWY_INLINE V& Acc(V& a0, V& a1, V& a2, V& a3, V& a4, V& a5, V& a6, V& a7) {
  static_assert(0 <= I && I < 8, "eight named accumulators");
  if constexpr (I == 0) return a0;
  else if constexpr (I == 1) return a1;
  else if constexpr (I == 2) return a2;
  else if constexpr (I == 3) return a3;
  else if constexpr (I == 4) return a4;
  else if constexpr (I == 5) return a5;
  else if constexpr (I == 6) return a6;
  else return a7;
}

// What MatmulBlock stores of row r's scaled sums x at panel column col: x
// itself, or (Epilogue) x plus a term of the row and column, added while x
// is still in a register.
struct Plain {
  template <class D, class V>
  HWY_INLINE V operator()(D, int, int64_t, V x) const { return x; }
};

// c[r][0 .. NV·N) = epilogue(scale · Σ_k a_r[k] · panel[k][0 .. NV·N)),
// r < MR; col0 is the block's first column in the panel. (kVecs·N divides
// kPanel: asserted above. Sizeless vectors take NV = kVecs only.)
template <int MR, int NV = kVecs, class D, class Epilogue = Plain, typename T = hn::TFromD<D>>
HWY_INLINE void MatmulBlock(D d, const T* const* a, int64_t K, const T* panel, T scale, T* c,
                            int64_t c_stride, int64_t col0 = 0, const Epilogue& epilogue = {}) {
  using V = hn::Vec<D>;
  const size_t N = hn::Lanes(d);
  const V sc = hn::Set(d, scale);
#if HWY_HAVE_SCALABLE
  // Accumulator i = r · kVecs + v, named (see Acc); the same loads and FMAs
  // as the array form below.
  static_assert(NV == kVecs && kVecs == 2 && kRows * kVecs <= 8, "two vectors per row, eight names in all");
  V a0 = hn::Zero(d), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (int64_t k = 0; k < K; ++k) {
    const V b0 = hn::Load(d, panel + k * kPanel), b1 = hn::Load(d, panel + k * kPanel + N);
    Unroll<MR>([&](auto r) HWY_ATTR {
      const V ar = hn::Set(d, a[r][k]);
      V& lo = Acc<r * kVecs>(a0, a1, a2, a3, a4, a5, a6, a7);
      V& hi = Acc<r * kVecs + 1>(a0, a1, a2, a3, a4, a5, a6, a7);
      lo = hn::MulAdd(ar, b0, lo);
      hi = hn::MulAdd(ar, b1, hi);
    });
  }
  Unroll<MR * kVecs>([&](auto i) HWY_ATTR {
    hn::StoreU(epilogue(d, i / kVecs, col0 + (i % kVecs) * N, hn::Mul(Acc<i>(a0, a1, a2, a3, a4, a5, a6, a7), sc)),
               d, c + (i / kVecs) * c_stride + (i % kVecs) * N);
  });
#else
  V acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = hn::Zero(d);
  for (int64_t k = 0; k < K; ++k) {
    V b[NV];
    for (int v = 0; v < NV; ++v) b[v] = hn::Load(d, panel + k * kPanel + v * N);
    for (int r = 0; r < MR; ++r) {
      const V ar = hn::Set(d, a[r][k]);
      for (int v = 0; v < NV; ++v) acc[r][v] = hn::MulAdd(ar, b[v], acc[r][v]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v)
      hn::StoreU(epilogue(d, r, col0 + v * static_cast<int64_t>(N), hn::Mul(acc[r][v], sc)), d,
                 c + r * c_stride + v * N);
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

// The columns MatmulPanel writes for `cols` (at most kPanel): cols rounded
// up to vectors, or on sizeless vectors to a block of kVecs vectors. A row
// of C narrower than a panel must be this wide.
template <class D>
HWY_INLINE int64_t PanelColumnsWritten(D d, int64_t cols) {
  const int64_t unit = static_cast<int64_t>(hn::Lanes(d)) * (HWY_HAVE_SCALABLE ? kVecs : 1);
  return (cols + unit - 1) / unit * unit;
}

// The first `cols` columns of the panel (at most kPanel) for `rows` rows of
// A (rows <= kRows), in whole vectors: columns up to PanelColumnsWritten
// are written, the rest left alone. (A tile of 3 keys computes one vector
// of products, not four.)
template <class D, class Epilogue = Plain, typename T = hn::TFromD<D>>
HWY_INLINE void MatmulPanel(D d, const T* const* a, int rows, int64_t K, const T* panel, T scale,
                            T* c, int64_t c_stride, const Epilogue& epilogue = {}, int64_t cols = kPanel) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d)), W = kVecs * N;
  WithCount<kRows>(rows, [&](auto mr) HWY_ATTR {
    constexpr int MR = decltype(mr)::value;
    int64_t j = 0;
    for (; j + W <= cols; j += W) MatmulBlock<MR>(d, a, K, panel + j, scale, c + j, c_stride, j, epilogue);
    if (j >= cols) return;
#if HWY_HAVE_SCALABLE
    MatmulBlock<MR>(d, a, K, panel + j, scale, c + j, c_stride, j, epilogue);
#else
    WithCount<kVecs>((cols - j + N - 1) / N, [&](auto nv) HWY_ATTR {
      MatmulBlock<MR, decltype(nv)::value>(d, a, K, panel + j, scale, c + j, c_stride, j, epilogue);
    });
#endif
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::kernels
HWY_AFTER_NAMESPACE();

#endif  // ATTN_KERNELS_MATMUL_INL_H_
