// Decode: a few query rows against a long key/value cache (flash-decoding).
// Each (batch, kv head, key chunk) item reads its K and V rows once, in place,
// for every query row of the group, and leaves a partial result (row max m,
// sum l, unnormalised output); a merge per (batch, kv head) combines the
// chunks in order: M = max m_c, out = Σ e^(m_c − M) O_c / Σ e^(m_c − M) l_c.
// Chunk size and the query count that picks this kernel: config.hpp.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/decode.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <hwy/cache_control.h>

#include "kernels/attention-inl.h"
#include "kernels/decode_dots-inl.h"
#include "kernels/decode_int4-inl.h"
#include "kernels/flash-inl.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "attn/quantize.hpp"
#include "kernels/attention_kernel.hpp"
#include "kernels/config.hpp"
#include "kernels/int8_unit.hpp"
#include "kernels/scratch.hpp"
#include "thread_pool.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::kernels {
namespace HWY_NAMESPACE {

thread_local Scratch<float> tls_decode_scores, tls_decode_sums;
thread_local Scratch<const float*> tls_decode_queries;
thread_local Scratch<float> tls_decode_panel;
thread_local Scratch<int8_t> tls_decode_block_panel;
thread_local Scratch<float> tls_decode_int4_weights;

// Whether decode fetches p's K and V rows ahead (ChunkKeys::FetchAhead says
// where and why not): more than one row per kv head, keys in blocks, or pages.
bool FetchesAhead(const core::AttentionProblem<float>& p) {
  return p.group() * p.n_q != 1 || p.kv == core::KVStorage::Q8_0 || p.kv == core::KVStorage::Q4_0 || InPages(p);
}

// Whether decode's P·V over a block fetches the next block's K rows
// (ChunkKeys::Values): rows fetched ahead, of a float type (block types,
// whose rows go into L1, ran slower so: q8_0, 32 × 8 heads of 128, 32768
// keys, 2 threads, Zen 4, 4.6-5.0 ms against 5.1-5.8).
bool FetchesNextBlock(const core::AttentionProblem<float>& p) {
  return FetchesAhead(p) &&
         (p.kv == core::KVStorage::Native || p.kv == core::KVStorage::BF16 || p.kv == core::KVStorage::F16);
}

// How a problem's keys are split into work items: `heads` consecutive kv
// heads and kDecodeChunk keys each, taken `block` keys at a time with an
// online softmax across blocks. One head per item, in one block (blocks of
// kDecodeFetchBlock where FetchesNextBlock), unless the heads of a token
// lie side by side in paged memory (NHD pages): then an item takes every
// head, and so reads whole pages in order, where one head's rows lie a page
// row apart; its blocks are smaller, so that every
// head's scores of a block stay in L1 (docs/performance.md). Not where that
// leaves one item, one thread's work: 512 keys over pages of 16, 2 threads,
// AMD EPYC Zen 4, 8 heads of 128, 0.10-0.13 ms against 0.058-0.067 one head
// per item; 32 × 8 heads, 0.16-0.20 against 0.097-0.106 (at 1024 keys, two
// items, 0.100-0.101 against 0.107-0.109; at 32768, 9.0-11.0 against 17.7-19.1).
struct Split {
  int64_t heads, block;
};
// (Contiguous heads are one per item: two per item, a thread streaming four
// arrays rather than two, measured no faster: float32, 32768 keys, 32 × 8
// heads of 128, 2 threads, Zen 5, 0.77-0.78 of the read bandwidth against
// 0.76-0.80; four were slower.)
Split SplitOf(const core::AttentionProblem<float>& p) {
  const int64_t head_stride = p.kv == core::KVStorage::Native ? p.k.head_stride : p.k_stored.head_stride;
  const int64_t row_stride = p.kv == core::KVStorage::Native ? p.k.row_stride : p.k_stored.row_stride;
  const bool one_item = p.batch == 1 && p.n_k <= kDecodeChunk;
  if (!InPages(p) || p.heads_kv == 1 || std::abs(head_stride) >= std::abs(row_stride) || one_item ||
      p.kv == core::KVStorage::Int4)
    return {1, FetchesNextBlock(p) ? kDecodeFetchBlock : kDecodeChunk};  // (Int4ChunkKeys reads one head)
  return {p.heads_kv, std::max<int64_t>(64, kDecodeChunk / p.heads_kv / 64 * 64)};
}

// The prefill's micro-kernel over a tile's panel, compiled once for every
// storage type (only the panel's packing depends on it).
HWY_NOINLINE void PanelProducts(DF d, const float* const* q, int rows, int64_t D, const float* panel, float scale,
                                float* s, int64_t s_stride, int64_t cols) {
  MatmulPanel(d, q, rows, D, panel, scale, s, s_stride, Plain(), cols);
}

// One item's view of its keys, j0 .. j0 + jn: its rows' queries, the
// scale, K's and V's row strides, and the distance between heads' rows of
// a token (nh > 1: side by side, one span of k_span / v_span bytes).
template <class KV>
struct ChunkKeys {
  const core::AttentionProblem<float>& p;
  int64_t b, h0, nh, R, j0, jn;
  const float* const* q;
  const int16_t* codes;      // int8 precision's rounded rows as codes (R = 1), or null (RoundedQueries)
  const float* code_scales;  // their blocks' scales
  float scale;
  int64_t k_stride, v_stride, k_head, v_head, k_span, v_span;
  bool heads_outer, fetch_ahead, fetch_next_block;

  ChunkKeys(const core::AttentionProblem<float>& p_, int64_t b_, int64_t h0_, int64_t nh_, int64_t j0_, int64_t jn_,
            const float* const* q_, const int16_t* codes_ = nullptr, const float* code_scales_ = nullptr)
      : p(p_), b(b_), h0(h0_), nh(nh_), R(p_.group() * p_.n_q), j0(j0_), jn(jn_), q(q_), codes(codes_),
        code_scales(code_scales_), scale(ScoreScale(p_)),
        k_stride(KeyStride<KV>(p_)), v_stride(ValueStride<KV>(p_)),
        k_head(nh_ == 1 ? 0 : KeyRow<KV>(p_, b_, h0_ + 1, j0_) - KeyRow<KV>(p_, b_, h0_, j0_)),
        v_head(nh_ == 1 ? 0 : ValueRow<KV>(p_, b_, h0_ + 1, j0_) - ValueRow<KV>(p_, b_, h0_, j0_)),
        k_span((nh_ - 1) * k_head * static_cast<int64_t>(sizeof(KV)) + RowBytes<KV>(p_.d)),
        v_span((nh_ - 1) * v_head * static_cast<int64_t>(sizeof(KV)) + RowBytes<KV>(p_.d_v)),
        // Key by key for every head; or, when the item's query rows overflow
        // L1 (kDecodeL1QueryBytes), head by head over each page run, so that
        // a head's rows stay in L1. Either order computes the same scores.
        heads_outer(nh_ > 1 && nh_ * R * p_.d * static_cast<int64_t>(sizeof(float)) > kDecodeL1QueryBytes),
        fetch_ahead(FetchesAhead(p_)),
        fetch_next_block(FetchesNextBlock(p_)) {}

  // Keys from key j on (below jn) in one page of K and V: all of them
  // unless K and V are paged (K's pages are V's).
  int64_t run_from(int64_t j) const {
    return p.kv == core::KVStorage::Native ? p.k.rows_in_page(j0 + j, j0 + jn) : p.k_stored.rows_in_page(j0 + j, j0 + jn);
  }

  // The keys from key j on (below `to`) in one page: their count, their
  // first K and V rows (of head h0), and the next run's count and first K
  // row, if any.
  struct Run {
    int64_t count, next_count;
    const KV *k, *v, *next_k;
  };
  Run RunAt(int64_t j, int64_t to) const {
    const int64_t count = std::min(run_from(j), to - j), next = j + count;
    return {count, next < jn ? run_from(next) : 0, KeyRow<KV>(p, b, h0, j0 + j), ValueRow<KV>(p, b, h0, j0 + j),
            next < jn ? KeyRow<KV>(p, b, h0, j0 + next) : nullptr};
  }

  // Fetches rows j .. j + n of the run's V (every head's) while their K
  // streams in: both arrays come from memory concurrently, and P·V reads V
  // from cache. And K's rows kDecodePrefetchRows ahead, in this run or the
  // next (past `to` too; pages shorter than the distance ahead go without):
  // the hardware's prefetcher alone leaves K's reads waiting (config.hpp).
  // Where a run's rows lie side by side, the n rows as one span, so that a
  // line two rows share is fetched once (q8_0 at 8 heads of 64, a cache in
  // L3, 1 thread, Zen 3, 20 alternating runs, ns per key and head, least
  // (median): 12.6 (16.2) against 13.8 (18.0) row by row).
  // Rows of float types go into L2 alone: into L1 they fill its miss
  // buffers and the fetches themselves wait. 32768 keys, AMD EPYC, ms, L2
  // against L1: float32, 32 query and 8 KV heads of 128, 2 threads 11.6-13.1
  // against 12.9-13.9 (pages of 16: 14.1-14.8 against 15.1-15.3); 8 heads
  // 9.1-10.0 against 9.8-10.5; bf16 (DotKeys) at 32 and 8 heads 5.71-5.76
  // against 7.60-8.03 (Zen 4). Blocks stay in L1: into L2, q8_0 (8 of 64)
  // took 2.28-2.31 against 2.15-2.16. None at one query row per KV head over
  // a contiguous cache of a float type (fetch_ahead): a key's arithmetic is
  // short, and the hardware's stream prefetcher alone reads faster (8 heads
  // of 128, 2 threads, huge pages, in turns, Zen 4: float32 1.16-1.36x as
  // fast without, f16 1.10x, bf16 1.03x; at 4 rows 0.84-0.94x). Block types
  // keep it: a Xeon's q8_0 gained 19% (config.hpp).
  HWY_INLINE void FetchAhead(const Run& run, int64_t j, int64_t n) const {
    constexpr bool kToL2 = !kIsBlockType<KV>;
    constexpr auto kSize = static_cast<int64_t>(sizeof(KV));
    PrefetchRows<kToL2>(run.v + j * v_stride, v_stride * kSize, v_span, n);
    const int64_t a = j + kDecodePrefetchRows;
    if (a + n <= run.count) return PrefetchRows<kToL2>(run.k + a * k_stride, k_stride * kSize, k_span, n);
    for (int64_t at = a; at < a + n; ++at)
      if (at < run.count || at - run.count < run.next_count)
        PrefetchSpan<kToL2>(at < run.count ? run.k + at * k_stride : run.next_k + (at - run.count) * k_stride, k_span);
  }

  // s[(hh·R + r)·s_stride + j - from] = the scores of keys from .. to (run by
  // run: a run's rows are k_stride apart, one run unless K and V are paged,
  // then one per page), by ScoreKeys: KeysAtOnce keys of a run at a time
  // where kDecodeKeyGroups and the rows are fetched ahead, or at one row
  // where kDecodeOneRowFourKeys, its last ones alone.
  // (Two loops: beside DotKeys, key by key took 1.1-1.25x the time.)
  HWY_INLINE void Scores(DF d, int64_t from, int64_t to, float* s, int64_t s_stride) const {
    if constexpr (kDecodeKeyGroups<KV> || kDecodeOneRowFourKeys<KV>)
      if ((kDecodeKeyGroups<KV> && fetch_ahead) || (kDecodeOneRowFourKeys<KV> && R == 1))
        return ScoresBy<true>(d, from, to, s, s_stride);
    ScoresBy<false>(d, from, to, s, s_stride);
  }
  template <bool kGrouped>
  HWY_INLINE void ScoresBy(DF d, int64_t from, int64_t to, float* s, int64_t s_stride) const {
    // Locals, not members: a member could be one of the floats the scores'
    // stores reach, so the compiler would load it again after each.
    const float scale = this->scale;
    const float* const* q = this->q;
    const int16_t* const codes = this->codes;
    const float* const code_scales = this->code_scales;
    const int64_t k_head = this->k_head, k_stride = this->k_stride, R = this->R, nh = this->nh, D = p.d;
    const bool heads_outer = this->heads_outer, fetch_ahead = this->fetch_ahead;
    // Keys scored at once (KeysAtOnce: the first rows').
    const int64_t group = R == 1 && kBlocksFolded<KV> ? kBlockKeysAtOnce : KeysAtOnce(std::min<int64_t>(R, kRows));
    for (int64_t at = from; at < to;) {
      const Run run = RunAt(at, to);
      const int64_t passes = heads_outer ? nh : 1;
      for (int64_t pass = 0; pass < passes; ++pass)
        for (int64_t j = 0; j < run.count;) {
          const KV* k = run.k + j * k_stride;
          const int64_t keys = kGrouped && j + group <= run.count ? group : 1;
          if (pass == 0 && fetch_ahead)
            FetchAhead(run, j, keys);
          for (int64_t hh = heads_outer ? pass : 0; hh < (heads_outer ? pass + 1 : nh); ++hh)
            for (int64_t r0 = 0; r0 < R; r0 += kRows) {
              float* sj = s + (hh * R + r0) * s_stride + at - from + j;
              const float* const* qr = q + hh * R + r0;
              WithCount<kRows>(std::min<int64_t>(kRows, R - r0), [&](auto mr) HWY_ATTR {
                ScoreKeys<decltype(mr)::value, kGrouped>(d, keys, qr, k + hh * k_head, k_stride, D, scale, sj, s_stride,
                                                         codes ? codes + hh * D : nullptr,
                                                         codes ? code_scales + hh * (D / kQ8_0Block) : nullptr);
              });
            }
          j += keys;
        }
      at += run.count;
    }
  }

  // The same scores, head by head, tile by tile of kBlockK keys: the tile's
  // K rows transposed into a panel (page run by page run), then the
  // prefill's micro-kernel (MatmulPanel) over the head's rows. Where an
  // item has many rows (kDecodePanelRows), this does a key's FMAs without
  // a horizontal sum per row and key, and widens each K value once.
  HWY_INLINE void PanelScores(DF d, int64_t from, int64_t to, float* s, int64_t s_stride, float* panel) const {
    for (int64_t t = from; t < to; t += kBlockK) {
      const int64_t tn = std::min(kBlockK, to - t);
      for (int64_t hh = 0; hh < nh; ++hh) {
        for (int64_t at = t; at < t + tn;) {
          const Run run = RunAt(at, t + tn);
          if (hh == 0) FetchAhead(run, 0, run.count);
          TransposeRows(run.k + hh * k_head, k_stride, run.count, p.d, panel + (at - t));
          at += run.count;
        }
        PadPanel(tn, p.d, panel);
        for (int64_t r0 = 0; r0 < R; r0 += kRows)
          PanelProducts(d, q + hh * R + r0, static_cast<int>(std::min<int64_t>(kRows, R - r0)), p.d, panel, scale,
                        s + (hh * R + r0) * s_stride + t - from, s_stride, tn);
      }
    }
  }

  // The same scores of q8_0 keys on the int8 unit, from the rounded
  // queries (the item's rows: `rows` bytes and `scales` on): tile by tile
  // of kBlockK keys, head by head, the tile's codes packed into a block
  // panel (page run by page run), then the unit's products over the head's
  // rows (the scores it writes past the keys, from whatever the panel held
  // there, BlockSoftmax sets to -inf).
  HWY_INLINE void UnitScores(int64_t from, int64_t to, float* s, int64_t s_stride, int8_t* panel,
                             const Int8Unit& unit, const uint8_t* rows, const float* scales) const {
    const int64_t D = p.d, blocks = D / kQ8_0Block;
    for (int64_t t = from; t < to; t += kBlockK) {
      const int64_t tn = std::min(kBlockK, to - t);
      for (int64_t hh = 0; hh < nh; ++hh) {
        for (int64_t at = t; at < t + tn;) {
          const Run run = RunAt(at, t + tn);
          // 16 keys at a time, their rows fetched ahead just before: the
          // reads overlap the packing rather than queue at once (a tile's
          // fetches at once took 6.1 ms against 4.7, the decode bench's
          // shape, 1 thread, AMD EPYC Zen 5)
          for (int64_t j = 0; j < run.count; j += 16) {
            const int64_t n = std::min<int64_t>(16, run.count - j);
            if (hh == 0) FetchAhead(run, j, n);
            unit.pack_q8_0(run.k + j * k_stride + hh * k_head, k_stride, n, blocks, panel, kBlockK, at - t + j);
          }
          at += run.count;
        }
        for (int64_t r0 = 0; r0 < R; r0 += kRows) {
          const int64_t row = hh * R + r0;
          unit.block_products(rows + row * D, D, static_cast<int>(std::min<int64_t>(kRows, R - r0)), blocks,
                              scales + row * blocks, panel, kBlockK, scale, s + row * s_stride + t - from,
                              s_stride, tn);
        }
      }
    }
  }

  // O += P · V over keys from .. to, run by run, head by head. With heads
  // side by side (nh > 1), one head's rows lie a token apart, beyond the
  // hardware prefetcher's reach, and a block's V rows (fetched with K's)
  // outgrow L1: the next head's rows of the run are fetched again while this
  // head's are summed. Where FetchesNextBlock, the next block's K rows
  // are fetched kStep keys at a time along the way: memory streams K while
  // P·V reads V from cache, as it streams V while the scores read K
  // (kDecodeFetchBlock).
  HWY_INLINE void Values(DF d, int64_t from, int64_t to, const float* s, int64_t s_stride, float* o, int64_t dvp) const {
    const int64_t ahead_end = fetch_next_block ? std::min(jn, to + (to - from)) : 0;
    for (int64_t run = from; run < to;) {
      const int64_t n = std::min(run_from(run), to - run);
      for (int64_t hh = 0; hh < nh; ++hh) {
        if (hh + 1 < nh) {
          const KV* next_head = ValueRow<KV>(p, b, h0 + hh + 1, j0 + run);
          PrefetchRows(next_head, v_stride * static_cast<int64_t>(sizeof(KV)), RowBytes<KV>(p.d_v), n);
        }
        const int64_t step = ahead_end > to ? kStep : n;
        for (int64_t j = 0; j < n; j += step) {
          const int64_t m = std::min(step, n - j);
          const int64_t next = to + run - from + j;  // the same key of the next block
          if (hh == 0)
            for (int64_t x = next; x < std::min(ahead_end, next + m); ++x)
              PrefetchSpan</*kToL2=*/true>(KeyRow<KV>(p, b, h0, j0 + x), k_span);
          AccumulateValues(d, R, s + hh * R * s_stride + run - from + j, s_stride, m,
                           ValueRow<KV>(p, b, h0 + hh, j0 + run + j), v_stride, p.d_v, o + hh * R * dvp, dvp);
        }
      }
      run += n;
    }
  }
  static constexpr int64_t kStep = 16;  // (P·V over 16 keys covers the fetches of 16 K rows)
};

// The online softmax's step over one block of an item's scores s (`rows`
// rows B apart, `count` keys from key `first`, -inf put past them): softcap,
// masks (the causal/window range too unless `inside`), then each row's
// running max m and sums l_lanes, its output o (dvp apart) rescaled. The
// same for every storage type: compiled once.
HWY_NOINLINE void BlockSoftmax(DF d, const core::AttentionProblem<float>& p, int64_t b, int64_t h0, int64_t first,
                               int64_t count, bool check_range, int64_t B, int64_t rows, float* s, float* m,
                               float* l_lanes, float* o, int64_t dvp) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d)), R = p.group() * p.n_q;
  if (p.softcap > 0) Softcap(d, p.softcap, s, rows * B);
  const bool masked = check_range || p.mask.present() || !p.alibi.empty();
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * B;
    std::fill(sr + count, sr + B, -std::numeric_limits<float>::infinity());
    // Row r: head h0 + r / R's query head r % R / n_q, query r % n_q.
    if (masked) MaskRow(d, p, b, (h0 + r / R) * p.group() + r % R / p.n_q, r % p.n_q, first, count, check_range, sr);
    const float alpha = SoftmaxStep(d, sr, B, m[r], l_lanes + r * N);
    if (alpha != 1.0f) {
      const VF a = hn::Set(d, alpha);
      float* orow = o + r * dvp;
      for (int64_t c = 0; c < dvp; c += N) hn::Store(hn::Mul(hn::Load(d, orow + c), a), d, orow + c);
    }
  }
}

// Partial result of one item, kv heads h0 .. h0 + split.heads, keys of
// chunk `chunk`, for its rows (R = group · n_q per head, head by head):
// O[rows][dvp] (aligned), then m[rows], l[rows].
template <class KV>
void DecodeChunk(DF d, const core::AttentionProblem<float>& p, int64_t b, int64_t h0, const Split& split,
                 int64_t chunk, int64_t dvp, const RoundedQueries* rounded, float* part) {
  const int64_t R = p.group() * p.n_q, nh = split.heads, rows = nh * R, B = split.block;
  float* o = part;
  float* m = part + rows * dvp;
  float* l = m + rows;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const float ninf = -std::numeric_limits<float>::infinity();
  std::fill(m, m + rows, ninf);
  std::fill(l, l + rows, 0.0f);
  std::fill(o, o + rows * dvp, 0.0f);
  const int64_t j0 = chunk * kDecodeChunk, jn = std::min(kDecodeChunk, p.n_k - j0);
  // The rows' causal/window ranges are monotone in the row: the first row's
  // and the last's bound them all.
  const KeyRange first = allowed_keys(0, p.n_q, p.n_k, p.causal, p.window);
  const KeyRange last = allowed_keys(p.n_q - 1, p.n_q, p.n_k, p.causal, p.window);
  if (j0 >= last.end || j0 + jn <= first.begin) return;

  float* s = tls_decode_scores.get(static_cast<size_t>(rows * B));
  float* l_lanes = tls_decode_sums.get(static_cast<size_t>(rows * N));  // per row, one vector (SoftmaxStep)
  std::fill(l_lanes, l_lanes + rows * N, 0.0f);
  // Row r of the item: head h0 + r / R's query head r % R / n_q, query r % n_q.
  const auto row_head = [&](int64_t r) { return (h0 + r / R) * p.group() + r % R / p.n_q; };
  const float** q = tls_decode_queries.get(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) q[r] = p.q.row(b, row_head(r), r % p.n_q);
  // The item's first row in p.q's order (its heads' rows follow it).
  const int64_t first_row = (b * p.heads_q + h0 * p.group()) * p.n_q;
  int8_t* unit_panel = nullptr;
  if (rounded && rounded->unit)
    unit_panel = tls_decode_block_panel.get(static_cast<size_t>(Int8BlockPanelBytes(p.d / kQ8_0Block, kBlockK)));
  else if (rounded)
    for (int64_t r = 0; r < rows; ++r) q[r] = rounded->values.data() + (first_row + r) * p.d;
  // Block by block: scores(from, to), the softmax's step, then P·V.
  const auto blocks = [&](const auto& keys, const auto& scores) HWY_ATTR {
    for (int64_t from = 0; from < jn; from += B) {
      const int64_t to = std::min(jn, from + B), count = to - from;
      if (j0 + from >= last.end || j0 + to <= first.begin) continue;
      const bool inside = j0 + from >= last.begin && j0 + to <= first.end;
      scores(from, to);
      BlockSoftmax(d, p, b, h0, j0 + from, count, !inside, B, rows, s, m, l_lanes, o, dvp);
      keys.Values(d, from, to, s, B, o, dvp);
    }
  };
  if constexpr (std::is_same_v<KV, block_int4>) {
    float* scratch = tls_decode_int4_weights.get(static_cast<size_t>(kInt4ScratchRows * p.d + 16 + 10 * kDecodeChunk));
    const Int4ChunkKeys keys{p, b, h0, R, j0, q, scratch, scratch + (kInt4ScratchRows * p.d + 15) / 16 * 16};
    blocks(keys, [&](int64_t from, int64_t to) HWY_ATTR { keys.Scores(d, from, to, s, B); });
  } else {
    const bool coded = rounded && !rounded->codes.empty();
    const ChunkKeys<KV> keys(p, b, h0, nh, j0, jn, q, coded ? rounded->codes.data() + first_row * p.d : nullptr,
                             coded ? rounded->scales.data() + first_row * (p.d / kQ8_0Block) : nullptr);
    float* panel = R >= kDecodePanelRows ? tls_decode_panel.get(static_cast<size_t>(kBlockK * p.d)) : nullptr;
    blocks(keys, [&](int64_t from, int64_t to) HWY_ATTR {
      if (unit_panel) {
        if constexpr (std::is_same_v<KV, block_q8_0>)  // (unit_panel is null for other types)
          keys.UnitScores(from, to, s, B, unit_panel, *rounded->unit, rounded->bytes.data() + first_row * p.d,
                          rounded->scales.data() + first_row * (p.d / kQ8_0Block));
      } else if (panel) {
        keys.PanelScores(d, from, to, s, B, panel);
      } else {
        keys.Scores(d, from, to, s, B);
      }
    });
  }
  for (int64_t r = 0; r < rows; ++r) l[r] = hn::GetLane(hn::SumOfLanes(d, hn::Load(d, l_lanes + r * N)));
}

thread_local Scratch<float> tls_partials, tls_merged;

// The problems' work items, (problem, batch entry, kv head group, chunk)
// in that order (SplitOf), and where each problem's first item and first
// partial result lie.
struct DecodeItems {
  std::vector<int64_t> first_item, first_part, chunks, part_size;
  std::vector<Split> split;
};
DecodeItems ItemsOf(DF d, const core::AttentionProblem<float>* const* problems, int64_t count) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  DecodeItems items;
  items.first_item.assign(1, 0);
  items.first_part.assign(1, 0);
  for (int64_t i = 0; i < count; ++i) {
    const core::AttentionProblem<float>& p = *problems[i];
    const Split split = SplitOf(p);
    // (No query rows, no query heads: no items, nothing to score.)
    const int64_t chunks = p.group() * p.n_q == 0 ? 0 : (p.n_k + kDecodeChunk - 1) / kDecodeChunk;
    const int64_t groups = p.batch * p.heads_kv / split.heads;
    const int64_t rows = split.heads * p.group() * p.n_q;
    const int64_t part_size = (rows * (WholeVectors(p.d_v) + 2) + N - 1) / N * N;  // each O aligned
    items.split.push_back(split);
    items.chunks.push_back(chunks);
    items.part_size.push_back(part_size);
    items.first_item.push_back(items.first_item.back() + groups * chunks);
    items.first_part.push_back(items.first_part.back() + groups * chunks * part_size);
  }
  return items;
}

// Merges the chunks' partial results of batch entry and kv head bh of p, in
// chunk order, and writes its rows (and their log-sum-exps). `first`: the
// first chunk's part of the head's item group; the head's rows start at row
// `row0` of each part, which holds `rows` rows.
void MergeChunks(DF d, const core::AttentionProblem<float>& p, int64_t bh, int64_t chunks, int64_t part_size,
                 const float* first, int64_t rows, int64_t row0) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t dvp = WholeVectors(p.d_v);
  const int64_t R = p.group() * p.n_q;
  const int64_t b = bh / p.heads_kv, hkv = bh % p.heads_kv;
  float* o = tls_merged.get(static_cast<size_t>(std::max<int64_t>(dvp, 1)));  // one merged row
  for (int64_t r = 0; r < R; ++r) {
    const int64_t h = hkv * p.group() + r / p.n_q;
    const float sink = SinkLogit(p, h, r % p.n_q);  // a key of value zero; -inf without sinks
    float mx = sink;
    const int64_t row = row0 + r;
    for (int64_t c = 0; c < chunks; ++c) mx = std::max(mx, first[c * part_size + rows * dvp + row]);
    std::fill(o, o + dvp, 0.0f);
    float l = p.sinks.empty() ? 0.0f : ExpDifference(sink, mx);
    for (int64_t c = 0; c < chunks; ++c) {
      const float* part = first + c * part_size;
      const float m_c = part[rows * dvp + row], l_c = part[rows * dvp + rows + row];
      if (l_c == 0) continue;
      const float w = ExpDifference(m_c, mx);
      l += w * l_c;
      const VF vw = hn::Set(d, w);
      for (int64_t col = 0; col < dvp; col += N)
        hn::Store(hn::MulAdd(vw, hn::Load(d, part + row * dvp + col), hn::Load(d, o + col)), d, o + col);
    }
    // No allowed key: zeros (o is). l NaN: the row is NaN.
    const bool by_reference = WriteRow(d, p, b, h, r % p.n_q, o, l == 0 ? 0.0f : 1.0f / l, p.out.row(b, h, r % p.n_q));
    if (p.lse && !by_reference) *p.lse.row(b, h, r % p.n_q) = RowLse(p, h, r % p.n_q, mx, l);
  }
}

// Every problem's chunks as one set of work items, then every (problem,
// batch entry, kv head)'s merge: a batch of requests of any lengths keeps
// every thread busy, and each result depends on its own chunks alone, never
// on the thread count.
template <class KV>
void DecodeForwardT(const core::AttentionProblem<float>* const* problems, int64_t count) {
  const DF d;
  const DecodeItems items = ItemsOf(d, problems, count);
  const int64_t total = items.first_item.back();
  float* parts = tls_partials.get(static_cast<size_t>(std::max<int64_t>(items.first_part.back(), 1)));
  std::vector<std::unique_ptr<RoundedQueries>> rounded(static_cast<size_t>(count));
  if constexpr (std::is_same_v<KV, block_q8_0>)
    for (int64_t i = 0; i < count; ++i)
      if (problems[i]->precision == Precision::Int8 && RoundedQueries::Fit(*problems[i]))
        rounded[static_cast<size_t>(i)] = std::make_unique<RoundedQueries>(
            *problems[i], decode_takes_int8_unit(problems[i]->group() * problems[i]->n_q) ? int8_unit() : nullptr);
  // The problem an item (or a problem's merge) belongs to.
  const auto problem_of = [&](const std::vector<int64_t>& firsts, int64_t x) {
    return static_cast<int64_t>(std::upper_bound(firsts.begin(), firsts.end(), x) - firsts.begin()) - 1;
  };
  parallel_for(total, [&](int64_t item) {
    const int64_t i = problem_of(items.first_item, item);
    const auto u = static_cast<size_t>(i);
    const core::AttentionProblem<float>& p = *problems[i];
    const int64_t local = item - items.first_item[u];
    const int64_t chunks = items.chunks[u], group = local / chunks, nh = items.split[u].heads;
    const int64_t groups_per_entry = p.heads_kv / nh;
    float* part = parts + items.first_part[u] + local * items.part_size[u];
    DecodeChunk<KV>(d, p, group / groups_per_entry, group % groups_per_entry * nh, items.split[u], local % chunks,
                    WholeVectors(p.d_v), rounded[u].get(), part);
    // A problem of one chunk writes its rows here: no pass of its own.
    const int64_t R = p.group() * p.n_q;
    if (chunks == 1)
      for (int64_t hh = 0; hh < nh; ++hh) MergeChunks(d, p, group * nh + hh, 1, items.part_size[u], part, nh * R, hh * R);
  });
  if (std::all_of(items.chunks.begin(), items.chunks.end(), [](int64_t chunks) { return chunks == 1; })) return;
  std::vector<int64_t> first_head(1, 0);
  for (int64_t i = 0; i < count; ++i) first_head.push_back(first_head.back() + problems[i]->batch * problems[i]->heads_kv);
  parallel_for(first_head.back(), [&](int64_t head) {
    const int64_t i = problem_of(first_head, head);
    const auto u = static_cast<size_t>(i);
    if (items.chunks[u] == 1) return;
    const core::AttentionProblem<float>& p = *problems[i];
    const int64_t bh = head - first_head[u], nh = items.split[u].heads, group = bh / nh;
    const int64_t R = p.group() * p.n_q;
    MergeChunks(d, p, bh, items.chunks[u], items.part_size[u],
                parts + items.first_part[u] + group * items.chunks[u] * items.part_size[u], nh * R, bh % nh * R);
  });
}

void DecodeForward(const core::AttentionProblem<float>* const* problems, int64_t count) {
  if (count == 0) return;
  if (problems[0]->kv == core::KVStorage::Int4) return DecodeForwardT<block_int4>(problems, count);
  WithKVType(*problems[0], [&](auto kv) HWY_ATTR { DecodeForwardT<decltype(kv)>(problems, count); });
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::kernels {
HWY_EXPORT(DecodeForward);
void decode_forward(const core::AttentionProblem<float>& p) {
  const core::AttentionProblem<float>* one = &p;
  HWY_DYNAMIC_DISPATCH(DecodeForward)(&one, 1);
}
void decode_forward_batch(const std::vector<const core::AttentionProblem<float>*>& problems) {
  HWY_DYNAMIC_DISPATCH(DecodeForward)(problems.data(), static_cast<int64_t>(problems.size()));
}
bool decode_suits(int64_t n_q, Precision precision) {
  return n_q <= (precision == Precision::Float32 ? kDecodeMaxQueries : kDecodeMaxUnitQueries);
}
bool decode_takes_int8_unit(int64_t rows_per_kv_head) { return rows_per_kv_head >= kDecodeUnitRows && int8_unit(); }
bool use_decode(const core::AttentionProblem<float>& p) {
  const bool short_rows =
      p.precision == Precision::Float32 && p.n_k >= kBlockK && p.group() * p.n_q <= kDecodeShortRows;
  return !p.weights && !p.logits && decode_suits(p.n_q, p.precision) &&
         (p.n_k > kDecodeChunk || short_rows);
}
}  // namespace attn::kernels
#endif
