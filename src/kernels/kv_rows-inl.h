// Reading K and V rows in their storage type: float32, bfloat16, fp16, or
// GGUF's q8_0 and q4_0 blocks, widened to float32 lanes, exactly (each value
// is the one its type stores); where a row lies, how far apart rows are, and
// the dispatch on a problem's storage type. Highway's per-target include:
// include after hwy/highway.h inside a file compiled by foreach_target.h.
#if defined(ATTN_KERNELS_KV_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_KERNELS_KV_ROWS_INL_H_
#undef ATTN_KERNELS_KV_ROWS_INL_H_
#else
#define ATTN_KERNELS_KV_ROWS_INL_H_
#endif

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "kernels/partial-inl.h"

#include <cstdint>
#include <type_traits>

#include "attention_problem.hpp"
#include "attn/half.hpp"
#include "attn/quantize.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// fp16 lanes promoted to float32. Highway 1.0.3 emulates the conversion on
// targets without F16C (SSSE3, SSE4, scalar) by rebiasing the exponent, which
// turns inf and NaN (exponent 31) into finite numbers near 65536; those lanes
// are rebuilt from their bits there. Targets with a native conversion need
// nothing.
template <class D16>
HWY_INLINE VF PromoteF16(DF d, hn::Vec<D16> h) {
  const VF f = hn::PromoteTo(d, h);
#if (HWY_ARCH_X86 && HWY_TARGET >= HWY_SSE4) || HWY_TARGET == HWY_SCALAR || \
    HWY_TARGET == HWY_EMU128 || defined(HWY_DISABLE_F16C)
  const hn::RebindToUnsigned<DF> du;
  const auto bits = hn::PromoteTo(du, hn::BitCast(hn::RebindToUnsigned<D16>(), h));
  const auto exponent = hn::Set(du, 0x7C00);
  const auto special = hn::Eq(hn::And(bits, exponent), exponent);
  const auto sign = hn::ShiftLeft<16>(hn::And(bits, hn::Set(du, 0x8000)));
  const auto mantissa = hn::ShiftLeft<13>(hn::And(bits, hn::Set(du, 0x3FF)));
  const auto inf_or_nan = hn::Or(sign, hn::Or(hn::Set(du, 0x7F800000), mantissa));
  return hn::IfThenElse(hn::RebindMask(d, special), hn::BitCast(d, inf_or_nan), f);
#else
  return f;
#endif
}

// Keys and values may be stored as float32, bfloat16, fp16, q8_0 or q4_0
// blocks, values also as int4 blocks (rows as q4_0's, each value d · q +
// m); arithmetic is float32. A row is read by column: element c of a
// q8_0 row is code c % 32 of block c / 32 times its scale; of a q4_0 row,
// the low (c % 32 < 16) or high nibble of byte c % 16, less 8, times it.

// Code c (0 .. 31) of a q4_0 block, less 8.
HWY_INLINE int Q4Code(const block_q4_0& b, int64_t c) {
  const int byte = b.qs[c % (kQ4_0Block / 2)];
  return (c < kQ4_0Block / 2 ? byte & 0x0f : byte >> 4) - 8;
}

// Element c of a K or V row.
template <class KV>
HWY_INLINE float KVValue(const KV* row, int64_t c) {
  if constexpr (std::is_same_v<KV, block_q8_0>) {
    const block_q8_0& b = row[c / kQ8_0Block];
    return fp16_to_float(b.d.bits) * b.qs[c % kQ8_0Block];
  } else if constexpr (std::is_same_v<KV, block_q4_0>) {
    const block_q4_0& b = row[c / kQ4_0Block];
    return fp16_to_float(b.d.bits) * static_cast<float>(Q4Code(b, c % kQ4_0Block));
  } else if constexpr (std::is_same_v<KV, block_int4>) {
    return int4_value(row[c / kInt4Group], c % kInt4Group);
  } else {
    return ToFloat(row[c]);
  }
}

// A block's fp16 scale in every lane, converted by the vector unit (the
// scalar conversion's branches cost more than the block's arithmetic).
template <class Block>
HWY_INLINE VF BlockScale(DF d, const Block& b) {
  const hn::Rebind<uint16_t, DF> du16;
  const hn::Rebind<hwy::float16_t, DF> df16;
  return PromoteF16<decltype(df16)>(d, hn::BitCast(df16, hn::Set(du16, b.d.bits)));
}

// An int4 block's fp16 minimum in every lane.
HWY_INLINE VF BlockMin(DF d, const block_int4& b) {
  const hn::Rebind<uint16_t, DF> du16;
  const hn::Rebind<hwy::float16_t, DF> df16;
  return PromoteF16<decltype(df16)>(d, hn::BitCast(df16, hn::Set(du16, b.m.bits)));
}

// The low and the high nibbles of 16 bytes in 32-bit lanes, from one load
// of them: at 16 lanes, a q4_0 or int4 block's codes 0 .. 15 and 16 .. 31.
HWY_INLINE void NibbleLanes(DF d, const uint8_t* bytes16, hn::Vec<hn::RebindToSigned<DF>>& low,
                            hn::Vec<hn::RebindToSigned<DF>>& high) {
  const hn::RebindToSigned<DF> di;
  const auto bytes = hn::PromoteTo(di, hn::LoadU(hn::Rebind<uint8_t, DF>(), bytes16));
  low = hn::And(bytes, hn::Set(di, 0x0f));
  high = hn::ShiftRight<4>(bytes);
}

// Codes c .. c + N - 1 of a q4_0 or int4 block's 32, as float32 (c a
// multiple of N, N <= 16: the lanes lie in one half of the block, one
// nibble of consecutive bytes).
HWY_INLINE VF NibbleCodes(DF d, const uint8_t* qs, int64_t c) {
  const hn::Rebind<uint8_t, DF> d8;
  const hn::Rebind<int32_t, DF> d32;
  constexpr int64_t half = kQ4_0Block / 2;
  // Nibbles taken from 32-bit lanes: byte shifts are emulated on x86.
  const auto bytes = hn::PromoteTo(d32, hn::LoadU(d8, qs + c % half));
  return hn::ConvertTo(d, c < half ? hn::And(bytes, hn::Set(d32, 0x0f)) : hn::ShiftRight<4>(bytes));
}

// Their values, given the block's scale and offset (q4_0's −8 · scale,
// int4's minimum): q · scale + offset as one FMA, which rounds once, exactly
// as the scalar (q − 8) · scale and q · scale + m (q · scale is exact in
// float32).
template <class Block>
HWY_INLINE VF Q4Values(DF d, const Block& b, int64_t c, VF scale, VF offset) {
  return hn::MulAdd(NibbleCodes(d, b.qs, c), scale, offset);
}

// Elements c .. c + N - 1 of a row, c a multiple of the lanes N.
template <class KV>
HWY_INLINE VF LoadKV(DF d, const KV* row, int64_t c) {
  if constexpr (std::is_same_v<KV, float>) {
    return hn::LoadU(d, row + c);
  } else if constexpr (std::is_same_v<KV, hwy::float16_t>) {
    return PromoteF16<hn::Rebind<KV, DF>>(d, hn::LoadU(hn::Rebind<KV, DF>(), row + c));
  } else if constexpr (kIsBlockType<KV>) {
    const auto N = static_cast<int64_t>(hn::Lanes(d));
    const KV& b = row[c / kBlockValues<KV>];
    // N, a power of 2, divides 32: the lanes lie in one block (and, for
    // q4_0, N <= 16, in one half of it, one nibble of consecutive bytes).
    if constexpr (std::is_same_v<KV, block_q8_0>) {
      const hn::Rebind<int8_t, DF> d8;
      const hn::Rebind<int32_t, DF> d32;
      if (N <= kQ8_0Block)
        return hn::Mul(hn::ConvertTo(d, hn::PromoteTo(d32, hn::LoadU(d8, b.qs + c % kQ8_0Block))), BlockScale(d, b));
    } else if constexpr (std::is_same_v<KV, block_int4>) {
      if (N <= kInt4Group / 2) return Q4Values(d, b, c % kInt4Group, BlockScale(d, b), BlockMin(d, b));
    } else if (N <= kQ4_0Block / 2) {
      const VF scale = BlockScale(d, b);
      return Q4Values(d, b, c % kQ4_0Block, scale, hn::Mul(scale, hn::Set(d, -8.0f)));
    }
    alignas(HWY_MAX_BYTES) float buf[HWY_MAX_BYTES / sizeof(float)];
    for (int64_t i = 0; i < N; ++i) buf[i] = KVValue(row, c + i);
    return hn::Load(d, buf);
  } else {
    return hn::PromoteTo(d, hn::LoadU(hn::Rebind<KV, DF>(), row + c));
  }
}

// Elements c .. c + 2N - 1 of a row as two vectors, c a multiple of 2N: for
// q8_0 and q4_0 with 2N <= 32 one block, whose scale is converted once.
template <class KV>
HWY_INLINE void LoadKVPair(DF d, const KV* row, int64_t c, VF& first, VF& second) {
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  if constexpr (std::is_same_v<KV, block_q8_0>) {
    if (2 * N <= kQ8_0Block) {
      const block_q8_0& b = row[c / kQ8_0Block];
      const hn::Rebind<int8_t, DF> d8;
      const hn::Rebind<int32_t, DF> d32;
      const int8_t* codes = b.qs + c % kQ8_0Block;
      const VF scale = BlockScale(d, b);
      first = hn::Mul(hn::ConvertTo(d, hn::PromoteTo(d32, hn::LoadU(d8, codes))), scale);
      second = hn::Mul(hn::ConvertTo(d, hn::PromoteTo(d32, hn::LoadU(d8, codes + N))), scale);
      return;
    }
  } else if constexpr (std::is_same_v<KV, block_int4>) {
    if (2 * N <= kInt4Group) {
      const block_int4& b = row[c / kInt4Group];
      const VF scale = BlockScale(d, b), min = BlockMin(d, b);
      first = Q4Values(d, b, c % kInt4Group, scale, min);
      second = Q4Values(d, b, c % kInt4Group + N, scale, min);
      return;
    }
  } else if constexpr (std::is_same_v<KV, block_q4_0>) {
    if (2 * N <= kQ4_0Block) {  // one block, one scale (and, at N = 16, one load)
      const block_q4_0& b = row[c / kQ4_0Block];
      const VF scale = BlockScale(d, b), minus_8_scale = hn::Mul(scale, hn::Set(d, -8.0f));
      first = Q4Values(d, b, c % kQ4_0Block, scale, minus_8_scale);
      second = Q4Values(d, b, c % kQ4_0Block + N, scale, minus_8_scale);
      return;
    }
  }
  first = LoadKV(d, row, c);
  second = LoadKV(d, row, c + N);
}

// Elements c .. c + m - 1 of a row, m < N; the other lanes 0.
template <class KV>
HWY_INLINE VF LoadKVPart(DF d, const KV* row, int64_t c, int64_t m) {
  if constexpr (kIsBlockType<KV>) {
    alignas(HWY_MAX_BYTES) float buf[HWY_MAX_BYTES / sizeof(float)] = {};
    for (int64_t i = 0; i < m; ++i) buf[i] = KVValue(row, c + i);
    return hn::Load(d, buf);
  } else {
    return LoadPart(d, row + c, m, 0.0f);
  }
}

// Vector c of a row `width` elements long: whole, or the part before width
// and 0 past it.
template <class KV>
HWY_INLINE VF LoadKVUpTo(DF d, const KV* row, int64_t c, int64_t width) {
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  return c + N <= width ? LoadKV(d, row, c) : LoadKVPart(d, row, c, width - c);
}

// Row j of K or V of (b, h) in its storage type KV, and how many KVs apart
// rows are (p an AttentionProblem<float> or a SparseProblem<float>).
template <class KV, class Problem>
const KV* KeyRow(const Problem& p, int64_t b, int64_t h, int64_t j) {
  if constexpr (std::is_same_v<KV, float>) return p.k.row(b, h, j);
  else return reinterpret_cast<const KV*>(p.k_stored.row(b, h, j));
}
template <class KV, class Problem>
const KV* ValueRow(const Problem& p, int64_t b, int64_t h, int64_t j) {
  if constexpr (std::is_same_v<KV, float>) return p.v.row(b, h, j);
  else return reinterpret_cast<const KV*>(p.v_stored.row(b, h, j));
}
template <class KV, class Problem>
int64_t KeyStride(const Problem& p) {
  if constexpr (std::is_same_v<KV, float>) return p.k.row_stride;
  else return p.k_stored.row_stride / static_cast<int64_t>(sizeof(KV));
}
template <class KV, class Problem>
int64_t ValueStride(const Problem& p) {
  if constexpr (std::is_same_v<KV, float>) return p.v.row_stride;
  else return p.v_stored.row_stride / static_cast<int64_t>(sizeof(KV));
}

// Whether K and V lie in pages (batch_attention's: K's pages are V's).
inline bool InPages(const core::AttentionProblem<float>& p) {
  return (p.kv == core::KVStorage::Native ? p.k.pages : p.k_stored.pages) != nullptr;
}

// Elements c .. c + N - 1 of key j of (b, h), zeros past d (LoadKVUpTo of
// its row), for int4 too, whose key blocks each hold one channel's 32
// tokens: one value of each of N blocks.
template <class KV>
HWY_INLINE VF LoadKey(DF d, const core::AttentionProblem<float>& p, int64_t b, int64_t h, int64_t j, int64_t c) {
  if constexpr (std::is_same_v<KV, block_int4>) {
    const auto N = static_cast<int64_t>(hn::Lanes(d));
    alignas(HWY_MAX_BYTES) float buf[HWY_MAX_BYTES / sizeof(float)] = {};
    const std::byte* group = p.k_stored.row(b, h, j / kInt4Group);
    for (int64_t i = 0; i < std::min(N, p.d - c); ++i)
      buf[i] = int4_value(*reinterpret_cast<const block_int4*>(group + (c + i) * p.k_stored.col_stride), j % kInt4Group);
    return hn::Load(d, buf);
  } else {
    return LoadKVUpTo(d, KeyRow<KV>(p, b, h, j), c, p.d);
  }
}

// Fetches every cache line of `bytes` bytes from x, into L1 or, kToL2,
// into L2 alone (GCC's builtin: Highway's Prefetch fetches into L1 only).
// Always inlined: out of line, GCC 12 finds it free of side effects and
// drops its calls.
template <bool kToL2 = false>
HWY_INLINE void PrefetchSpan(const void* x, int64_t bytes) {
  const auto first = reinterpret_cast<uintptr_t>(x), end = first + static_cast<uintptr_t>(bytes);
  for (uintptr_t line = first & ~uintptr_t{63}; line < end; line += 64) {
    if constexpr (kToL2) __builtin_prefetch(reinterpret_cast<const char*>(line), 0, 2);
    else hwy::Prefetch(reinterpret_cast<const char*>(line));
  }
}

// The same over n rows of `bytes` bytes, `stride` bytes apart: as one span
// where they lie side by side (stride = bytes), so that a line two rows
// share is fetched once, else row by row.
template <bool kToL2 = false>
HWY_INLINE void PrefetchRows(const void* first, int64_t stride, int64_t bytes, int64_t n) {
  if (stride == bytes) return PrefetchSpan<kToL2>(first, n * bytes);
  for (int64_t j = 0; j < n; ++j) PrefetchSpan<kToL2>(static_cast<const char*>(first) + j * stride, bytes);
}

// Bytes of n values of a row.
template <class KV>
constexpr int64_t RowBytes(int64_t n) {
  if constexpr (kIsBlockType<KV>) return n / kBlockValues<KV> * static_cast<int64_t>(sizeof(KV));
  else return n * static_cast<int64_t>(sizeof(KV));
}

// Calls f with a value of the storage type of p's K and V (hwy's 16-bit
// types, whose loads Highway knows): p an AttentionProblem or a SparseProblem.
template <class Problem, class F>
HWY_INLINE void WithKVType(const Problem& p, F&& f) {
  switch (p.kv) {
    case core::KVStorage::BF16: return f(hwy::bfloat16_t());
    case core::KVStorage::F16: return f(hwy::float16_t());
    case core::KVStorage::Q8_0: return f(block_q8_0());
    case core::KVStorage::Q4_0: return f(block_q4_0());
    case core::KVStorage::Native: return f(0.0f);
    case core::KVStorage::Int4: break;  // decode and prefill take it before (int4's keys lie by channel)
  }
  HWY_ABORT("a kernel other than decode and prefill was given int4 keys and values");
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::kernels
HWY_AFTER_NAMESPACE();

#endif  // ATTN_KERNELS_KV_ROWS_INL_H_
