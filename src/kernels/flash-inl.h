// The tiles of flash attention that the forward (prefill.cc) and the backward
// (backward.cc) share: K and V packed into transposed panels, blocks of
// query rows with the keys allowed to them, and a block of scores against
// one key tile (Q·Kᵀ on the packed panel, softcap, masks, ALiBi), so that
// both passes see the very same logits. Highway's per-target include:
// include after hwy/highway.h inside a file compiled by foreach_target.h.
#if defined(ATTN_KERNELS_FLASH_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_KERNELS_FLASH_INL_H_
#undef ATTN_KERNELS_FLASH_INL_H_
#else
#define ATTN_KERNELS_FLASH_INL_H_
#endif

#include <hwy/highway.h>

#include "kernels/attention-inl.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "kernels/bf16_unit.hpp"
#include "kernels/int8_unit.hpp"
#include "kernels/config.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::kernels {
namespace HWY_NAMESPACE {
static_assert(kBlockK == kPanel, "a key tile is one packed matmul panel");

// Query rows i0 .. i0 + rows - 1 and the keys allowed to the first and the
// last of them (ranges move right with the row, so these bound the block).
struct RowBlock {
  int64_t i0;
  int rows;
  KeyRange first, last;

  RowBlock() = default;
  RowBlock(const core::AttentionProblem<float>& p, int64_t i0_, int rows_)
      : i0(i0_),
        rows(rows_),
        first(allowed_keys(i0_, p.n_q, p.n_k, p.causal, p.window)),
        last(allowed_keys(i0_ + rows_ - 1, p.n_q, p.n_k, p.causal, p.window)) {}

  // Whether causal/window ranges mask keys j0 .. j0 + count - 1 wholly.
  bool masks_all(int64_t j0, int64_t count) const {
    return j0 >= last.end || j0 + count <= first.begin;
  }
  // Whether they allow all kBlockK keys from j0 for every row.
  bool allows_all(int64_t j0, int64_t count) const {
    return count == kBlockK && j0 >= last.begin && j0 + kBlockK <= first.end;
  }
};

// Element c of a row as float32, rounded to bf16 when asked.
template <class KV>
float Value(const KV* row, int64_t c, bool bf16) {
  const float x = KVValue(row, c);
  return bf16 ? attn::round_to_bf16(x) : x;
}

// Rows j0 .. j0 + count - 1 (count <= kBlockK) of K or V, `width` columns
// each, `stride` KVs apart from row0, transposed into a panel: dst[c *
// kBlockK + j] = row j's column c. Four rows at a time: their rows,
// interleaved, are each column's four values side by side, one 16-byte copy
// per column rather than four scattered element stores. 16-bit and q8_0
// rows are widened on the way.
// The same rows wherever they lie: row j at row_at(j) (gathered or paged keys).
template <class KV, class RowAt>
void TransposeRowsAt(const RowAt& row_at, int64_t count, int64_t width, float* dst, bool bf16 = false) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t whole = width / N * N;
  alignas(HWY_MAX_BYTES) float four[4 * HWY_MAX_BYTES / sizeof(float)];
  int64_t j = 0;
  for (; j + 4 <= count; j += 4) {
    const KV* k[4] = {row_at(j), row_at(j + 1), row_at(j + 2), row_at(j + 3)};
    for (int64_t c = 0; c < whole; c += N) {
      VF r0 = LoadKV(d, k[0], c), r1 = LoadKV(d, k[1], c), r2 = LoadKV(d, k[2], c), r3 = LoadKV(d, k[3], c);
      if (bf16) r0 = RoundToBF16(d, r0), r1 = RoundToBF16(d, r1), r2 = RoundToBF16(d, r2), r3 = RoundToBF16(d, r3);
      hn::StoreInterleaved4(r0, r1, r2, r3, d, four);
      for (int64_t e = 0; e < N; ++e) std::memcpy(dst + (c + e) * kBlockK + j, four + 4 * e, 4 * sizeof(float));
    }
    for (int64_t c = whole; c < width; ++c)
      for (int64_t r = 0; r < 4; ++r) dst[c * kBlockK + j + r] = Value(k[r], c, bf16);
  }
  for (; j < count; ++j) {
    const KV* k = row_at(j);
    for (int64_t c = 0; c < width; ++c) dst[c * kBlockK + j] = Value(k, c, bf16);
  }
}
template <class KV>
void TransposeRows(const KV* row0, int64_t stride, int64_t count, int64_t width, float* dst, bool bf16 = false) {
  TransposeRowsAt<KV>([&](int64_t j) HWY_ATTR { return row0 + j * stride; }, count, width, dst, bf16);
}

// Zeros in a panel of `width` columns (TransposeRows) past its first
// `count` rows, as far as MatmulPanel reads a tile of `count` keys: whole
// vectors, or on sizeless vectors a whole block.
inline void PadPanel(int64_t count, int64_t width, float* dst) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  const int64_t read = HWY_HAVE_SCALABLE ? kBlockK : std::min(kBlockK, (count + N - 1) / N * N);
  for (int64_t c = 0; c < width; ++c) std::fill(dst + c * kBlockK + count, dst + c * kBlockK + read, 0.0f);
}

// The panel of `count` rows (TransposeRows), zeros past them (PadPanel).
template <class KV>
void PackRows(const KV* row0, int64_t stride, int64_t count, int64_t width, float* dst, bool bf16 = false) {
  TransposeRows(row0, stride, count, width, dst, bf16);
  PadPanel(count, width, dst);
}

// Paged K and V (batch_attention's) lie a page of rows at a time, far
// apart, where the hardware's streams stop: the packing of K tile j0 /
// kBlockK fetches the next tile's keys into L2, and the widening of V rows
// j0 .. j0 + count - 1 the rows after them, while these are used. (A
// 64-query request over 32768 keys in NHD pages of 16, 32 x 8 heads of
// 128, q8_0, AMD EPYC Zen 4, 2 threads: 233-240 ms without, 189-194 with;
// 210-212 over a contiguous copy.) Always inlined, as PrefetchSpan.
template <class KV>
HWY_INLINE void FetchNextKeys(const core::AttentionProblem<float>& p, int64_t b, int64_t hkv, int64_t j0) {
  if (!InPages(p)) return;
  for (int64_t j = j0 + kBlockK; j < std::min(j0 + 2 * kBlockK, p.n_k); ++j)
    PrefetchSpan</*kToL2=*/true>(KeyRow<KV>(p, b, hkv, j), RowBytes<KV>(p.d));
}
template <class KV>
HWY_INLINE void FetchNextValues(const core::AttentionProblem<float>& p, int64_t b, int64_t hkv, int64_t j0,
                                int64_t count) {
  if (!InPages(p)) return;
  for (int64_t j = j0 + count; j < std::min(j0 + 2 * count, p.n_k); ++j)
    PrefetchSpan</*kToL2=*/true>(ValueRow<KV>(p, b, hkv, j), RowBytes<KV>(p.d_v));
}

// K tile kt of (b, hkv) as a panel (PackRows), rounded to bf16 with that
// precision; keys past n_k are zero (their scores are masked anyway).
// int4's key blocks hold one channel's 32 tokens each: the panel's row c
// is the tile's two blocks of channel c, widened in place (no transpose).
template <class KV>
void PackK(const core::AttentionProblem<float>& p, int64_t b, int64_t hkv, int64_t kt, float* dst) {
  const int64_t j0 = kt * kBlockK, count = std::min(kBlockK, p.n_k - j0);
  const bool bf16 = p.precision == Precision::BF16;
  if constexpr (std::is_same_v<KV, block_int4>) {
    static_assert(kBlockK % kInt4Group == 0, "a tile holds whole groups of keys");
    const DF d;
    const auto N = static_cast<int64_t>(hn::Lanes(d));
    for (int64_t t0 = 0; t0 < count; t0 += kInt4Group) {
      const std::byte* group = p.k_stored.row(b, hkv, (j0 + t0) / kInt4Group);
      for (int64_t c = 0; c < p.d; ++c) {
        const auto& block = *reinterpret_cast<const block_int4*>(group + c * p.k_stored.col_stride);
        float* out = dst + c * kBlockK + t0;
        if (N > kInt4Group) {  // (sizeless vectors of over 32 lanes)
          for (int64_t t = 0; t < kInt4Group; ++t) out[t] = Value(&block, t, bf16);
          continue;
        }
        for (int64_t t = 0; t < kInt4Group; t += N) {
          const VF x = LoadKV(d, &block, t);
          hn::StoreU(bf16 ? RoundToBF16(d, x) : x, d, out + t);
        }
      }
    }
    PadPanel(count, p.d, dst);
  } else {  // row by row: paged keys (batch_attention's) lie a page at a time
    TransposeRowsAt<KV>([&](int64_t j) HWY_ATTR { return KeyRow<KV>(p, b, hkv, j0 + j); }, count, p.d, dst, bf16);
    PadPanel(count, p.d, dst);
    FetchNextKeys<KV>(p, b, hkv, j0);
  }
}

// The bf16 unit (bf16_unit.hpp) on targets whose vectors are whole multiples
// of its lanes (padded V rows, and the key columns products write, then are too);
// null elsewhere, where bf16 precision (and int8's P·V) runs on FMAs.
inline const BF16Unit* BF16UnitOfTarget() {
  const BF16Unit* unit = bf16_unit();
  return unit && hn::Lanes(DF()) % static_cast<size_t>(unit->lanes) == 0 ? unit : nullptr;
}

// Two vectors of bf16 values (float32 with zero low halves) as one of
// pairs, lo's in the low halves (BF16Unit's layouts).
HWY_INLINE VF BF16Pairs(DF d, VF lo, VF hi) {
  const hn::RebindToUnsigned<DF> du;
  const auto bits = hn::Or(hn::ShiftRight<16>(hn::BitCast(du, lo)), hn::BitCast(du, hi));
  return hn::BitCast(d, bits);
}

// `count` float32 rows of bf16 values, `width` (whole vectors) apart, as
// rows of bf16 pairs, in place: row i is rows 2i and 2i + 1 interleaved
// (BF16Unit's layouts), paired with zeros where count is odd. (Row i is read
// only by pairs before it, or its own before it is written.)
inline void InterleavePairs(float* rows, int64_t count, int64_t width) {
  const DF d;
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t i = 0; 2 * i < count; ++i) {
    const float* lo = rows + 2 * i * width;
    const bool pair = 2 * i + 1 < count;
    for (int64_t c = 0; c < width; c += N)
      hn::Store(BF16Pairs(d, hn::Load(d, lo + c), pair ? hn::Load(d, lo + width + c) : hn::Zero(d)), d,
                rows + i * width + c);
  }
}

// K tile kt as the bf16 unit's panel of pairs (PackK, then paired).
template <class KV>
void PackKPairs(const core::AttentionProblem<float>& p, int64_t b, int64_t hkv, int64_t kt, float* dst) {
  PackK<KV>(p, b, hkv, kt, dst);
  InterleavePairs(dst, p.d, kBlockK);
}

// ALiBi's bias added to a block of scores as MatmulBlock stores them, while
// they are in registers, rather than in a pass of its own that would load
// and store every score again.
struct AlibiEpilogue {
  float slope2;
  const int64_t* first;  // per row of the micro-kernel: key j0 - the row's anchor
  HWY_INLINE VF operator()(DF d, int r, int64_t col, VF x) const { return WithAlibi(d, slope2, first[r], col, x); }
};

// ALiBi on rows i0 .. i0 + rows - 1 (rows <= kBlockQ) of head h: the slope
// in base 2 and each row's anchor (AlibiAnchor), worked out once per head and
// rows, not per row and tile.
struct AlibiRows {
  float slope2 = 0;
  int64_t i0 = 0;
  int64_t anchor[kBlockQ];

  void Set(const core::AttentionProblem<float>& p, int64_t h, int64_t first_row, int64_t rows) {
    if (p.alibi.empty()) return;
    slope2 = Base2(p.alibi[h]);
    i0 = first_row;
    for (int64_t r = 0; r < rows; ++r)
      anchor[r] = AlibiAnchor(p.alibi[h], allowed_keys(i0 + r, p.n_q, p.n_k, p.causal, p.window));
  }
  int64_t of(int64_t i) const { return anchor[i - i0]; }
};

// The query rows that products read: row r of a block at first + r · stride,
// the problem's own rows or a rounded or quantized copy of them (bf16, int8
// precision), or, for a unit, its pairs (BF16Unit::to_pairs) or codes (the
// int8 unit, with each row's scale and center term).
struct QueryRows {
  const float* first;
  int64_t stride;
  const float* scales = nullptr;
  const float* centers = nullptr;

  // Head h's rows of batch b from row i.
  static QueryRows Of(const core::AttentionProblem<float>& p, int64_t b, int64_t h, int64_t i) {
    return {p.q.row(b, h, i), p.q.row_stride};
  }
  // The same rows from r rows further on.
  QueryRows From(int64_t r) const {
    return {first + r * stride, stride, scales ? scales + r : nullptr, centers ? centers + r : nullptr};
  }
};

// S = scale · Q Kᵀ of block rb (its queries at q) against the packed key
// tile at `panel` (keys from j0), row r at s + r · s_stride; with `alibi`,
// ALiBi's bias added as the products are stored. Only the tile's keys, in
// whole vectors, are computed (WholeVectors(n_k - j0) of the kBlockK
// columns): the rest of a row is left alone. With `unit` or `int8`, the
// panel is its pairs (PackKPairs) or codes (PackKInt8) and the products are
// the unit's (no `alibi` then).
HWY_INLINE void Products(DF d, const core::AttentionProblem<float>& p, const RowBlock& rb, QueryRows qr,
                         const float* panel, int64_t j0, float scale, float* s, int64_t s_stride,
                         const AlibiRows* alibi, const BF16Unit* unit = nullptr, const Int8Unit* int8 = nullptr) {
  const int64_t cols = std::min(kBlockK, p.n_k - j0);
  const float* q[kRows];
  for (int r0 = 0; r0 < rb.rows; r0 += kRows) {
    const int rows = std::min(kRows, rb.rows - r0);
    for (int r = 0; r < rows; ++r) q[r] = qr.first + (r0 + r) * qr.stride;
    if (unit) {
      unit->products(reinterpret_cast<const uint32_t*>(q[0]), qr.stride, rows, (p.d + 1) / 2,
                     reinterpret_cast<const uint32_t*>(panel), scale, s + r0 * s_stride, s_stride, cols);
    } else if (int8) {
      int8->products(reinterpret_cast<const uint8_t*>(q[0]), qr.stride * 4, rows, (p.d + 3) / 4, qr.scales + r0,
                     qr.centers + r0, reinterpret_cast<const int8_t*>(panel), kBlockK, scale, s + r0 * s_stride,
                     s_stride, cols);
    } else if (alibi) {
      int64_t first[kRows];
      for (int r = 0; r < rows; ++r) first[r] = j0 - alibi->of(rb.i0 + r0 + r);
      MatmulPanel(d, q, rows, p.d, panel, scale, s + r0 * s_stride, s_stride,
                  AlibiEpilogue{alibi->slope2, first}, cols);
    } else {
      MatmulPanel(d, q, rows, p.d, panel, scale, s + r0 * s_stride, s_stride, Plain(), cols);
    }
  }
}

// S = masked, softcapped scores (base-2 units) of block rb (head h of batch
// b, its queries at q) against the packed key tile kt at `panel`, ALiBi's
// bias added; row r's kBlockK scores at s + r · s_stride. With softcap and
// `tanh_out`, also tanh(scale·q·k / softcap) there, in the same layout (the
// backward's derivative of softcap).
// With `unit` or `int8`, the panel is its pairs or codes (Products).
inline void Scores(DF d, const core::AttentionProblem<float>& p, int64_t b, int64_t h, int64_t kt, const RowBlock& rb,
                   QueryRows q, const float* panel, const AlibiRows& alibi, float* s, int64_t s_stride,
                   float* tanh_out = nullptr, const BF16Unit* unit = nullptr, const Int8Unit* int8 = nullptr) {
  const int64_t j0 = kt * kBlockK, jn = std::min(kBlockK, p.n_k - j0);
  const bool inside = rb.allows_all(j0, jn);
  // Without softcap (which comes first) and masks, the bias is added as the
  // scores are stored (but not by the unit); otherwise after softcap
  // (AddAlibi) or with the masks (MaskRow).
  const bool alibi_now = !p.alibi.empty() && p.softcap == 0 && inside && !p.mask.present() && !unit && !int8;
  Products(d, p, rb, q, panel, j0, ScoreScale(p), s, s_stride, alibi_now ? &alibi : nullptr, unit, int8);
  // (On a partial tile the entries past its keys are not products: softcap
  // sees whatever is there, and the masks below make them -inf.)
  if (p.softcap > 0)
    for (int r = 0; r < rb.rows; ++r)
      Softcap(d, p.softcap, s + r * s_stride, kBlockK, /*natural=*/false,
              tanh_out ? tanh_out + r * s_stride : nullptr);
  if (inside && !p.mask.present()) {
    if (p.alibi.empty() || alibi_now) return;
    for (int r = 0; r < rb.rows; ++r)
      AddAlibi(d, alibi.slope2, j0 - alibi.of(rb.i0 + r), kBlockK, s + r * s_stride);
    return;
  }
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int r = 0; r < rb.rows; ++r) {
    float* sr = s + r * s_stride;
    std::fill(sr + jn, sr + kBlockK, ninf);  // keys past n_k
    MaskRow(d, p, b, h, rb.i0 + r, j0, jn, !inside, sr);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::kernels
HWY_AFTER_NAMESPACE();

#endif  // ATTN_KERNELS_FLASH_INL_H_
