// float32 attention, flash style: tiles of queries × keys with an online
// softmax, so memory grows with n, never n².
//
// Per (batch, kv head, query tile) work item, for each query head sharing the
// kv head (GQA), each key tile in the causal/window range, and each block of
// kBlockRows query rows that the tile does not mask wholly
// (tile sizes: config.hpp):
//   S = scale·log2(e) · Q Kᵀ    register-blocked: kRows query rows × kVecs
//                                vectors of keys, the K tile packed transposed
//                                ([d][key]) so keys are contiguous lanes
//   S → softcap, masks, ALiBi   only on blocks that need it
//   m' = max(m, rowmax S); P = 2^(S − m'); l = l·2^(m−m') + rowsum P;
//   O = O·2^(m−m') + P V        register-blocked: kRows rows × kVecs vectors
//                                of value columns, V read in place (or its
//                                tile widened to float32 first: WidenValues)
// and finally out = O / l (0 for a row with no allowed key). Base 2 makes
// every exponential a cheap 2^x (exp2-inl.h); it is the same softmax.
//
// bf16 and int8 precision (docs/semantics.md "Precision") change only what
// the products read: Q rounded or quantized per item and head (SetQueries),
// K per tile as it is packed (PackKeys), V per tile (WidenValues), and P as
// the softmax stores it (or as the bf16 unit pairs it).
//
// K is packed once per call, into transposed float32 tiles. With one query
// tile per (batch, kv head), at most one item's queries, or K stored in 16
// or 8 bits, each item packs its K tiles itself, each just before its rows
// use it (FlashTiles): no float32 copy of all of a compact K or V is made.
//
// Loop order: the key tile is outer and the row blocks inner, so the K tile
// (d·kBlockK·4 = 16 KiB at d = 64) and the V tile stay in cache while all
// item's rows pass over them, and S is one block of kBlockRows rows, never a
// whole tile (the measurements behind the tile sizes: config.hpp). Tiles and
// row blocks wholly outside the causal or window range are skipped; work items
// start with the most expensive query tiles so the causal triangle balances
// across threads. Items and the order of arithmetic inside them do not depend
// on the thread count, so results are bitwise equal for any number of threads.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/prefill.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/flash-inl.h"
#include "kernels/int8-inl.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "attn/threads.hpp"
#include "kernels/attention_kernel.hpp"
#include "kernels/config.hpp"
#include "kernels/scratch.hpp"
#include "thread_pool.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::kernels {
namespace HWY_NAMESPACE {
static_assert(kBlockRows % kRows == 0, "ATTN_BLOCK_ROWS must be a multiple of kRows (4)");

// Packs K tile kt of (b, hkv) (PackKeys) or widens V rows j0 .. j0 + count - 1
// (WidenValues): the steps that depend on K/V's storage type.
using PackKFn = void (*)(const core::AttentionProblem<float>& p, int64_t b, int64_t hkv, int64_t kt,
                         const BF16Unit* unit, const Int8Unit* int8, const float* key_mean, float* dst);
using WidenValuesFn = void (*)(const core::AttentionProblem<float>& p, int64_t b, int64_t hkv,
                               int64_t j0, int64_t count, int64_t width, float* dst);

// Everything one work item needs to see.
struct Item {
  const core::AttentionProblem<float>& p;
  float* kpack;  // this (batch, kv head)'s packed K tiles: n_tiles × d × kBlockK
  bool pack;     // whether the item packs them itself (see FlashTiles)
  PackKFn pack_k;
  // This (batch, kv head)'s V rows, dvp floats apart: its own rows when
  // they are float32 rows of whole vectors side by side, or all of them
  // widened at once (FlashTiles; on the bf16 unit each softmax step's keys
  // as one tile of pairs); otherwise null, and each step's rows are widened
  // into v_tile first.
  const float* v;
  WidenValuesFn widen_v;
  float* v_tile;
  int64_t b, hkv, i0, rows;
  // With bf16 or int8 precision on a CPU's bf16 unit: V tiles are its
  // pairs and it computes P·V (int8's P·V is bf16's); in bf16 also Q·Kᵀ,
  // from K panels and query rows of pairs (scores_unit).
  const BF16Unit* unit;
  // With int8 precision: the center of its keys (KeyMean), and the CPU's
  // int8 unit, which computes Q·Kᵀ from their codes, if it is used.
  const float* key_mean;
  const Int8Unit* int8;

  // The bf16 unit where it computes Q·Kᵀ too: bf16 precision's.
  const BF16Unit* scores_unit() const { return p.precision == Precision::BF16 ? unit : nullptr; }

  // Key tiles per step of the online softmax (config.hpp's kBF16StepTiles).
  int64_t StepTiles() const { return p.precision == Precision::Float32 ? 1 : kBF16StepTiles; }

  // Packs K tile kt into its place in kpack.
  void PackTile(int64_t kt) const { pack_k(p, b, hkv, kt, unit, int8, key_mean, kpack + kt * p.d * kBlockK); }
};

// K tile kt of (b, hkv) as the products read it in p's precision: a float32
// panel (PackK; rounded to bf16 in bf16), the bf16 unit's pairs, or int8's
// quantized keys less key_mean (as a panel, or the int8 unit's codes; int8
// precision's `unit` computes only P·V).
template <class KV>
void PackKeys(const core::AttentionProblem<float>& p, int64_t b, int64_t hkv, int64_t kt, const BF16Unit* unit,
              const Int8Unit* int8, const float* key_mean, float* dst) {
  if (p.precision == Precision::Int8) return PackKInt8<KV>(p, b, hkv, kt, key_mean, int8, dst);
  if (unit) return PackKPairs<KV>(p, b, hkv, kt, dst);
  PackK<KV>(p, b, hkv, kt, dst);
}

// V rows j0 .. j0 + count - 1 of (b, hkv) as float32 rows `width` (d_v
// rounded up to whole vectors) apart at dst, zeros past d_v, rounded to bf16
// with bf16 or int8 precision (int8's P·V is bf16's): the tile P·V reads when V's own rows are not float32
// whole vectors side by side, or must be rounded. Per
// tile, so that no copy of all of V is ever made; V rows far apart (heads
// sliced from one wide array, as multi_head and the layer pass them) also
// share few cache sets, which the copy avoids.
template <class KV>
void WidenValues(const core::AttentionProblem<float>& p, int64_t b, int64_t hkv, int64_t j0,
                 int64_t count, int64_t width, float* dst) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const bool bf16 = p.precision != Precision::Float32;
  for (int64_t j = 0; j < count; ++j) {
    const KV* in = ValueRow<KV>(p, b, hkv, j0 + j);
    for (int64_t c = 0; c < p.d_v; c += N) {
      const VF x = LoadKVUpTo(d, in, c, p.d_v);
      hn::Store(bf16 ? RoundToBF16(d, x) : x, d, dst + j * width + c);
    }
  }
  FetchNextValues<KV>(p, b, hkv, j0, count);
}

// The same V rows as the bf16 unit's tile of pairs (BF16Unit's layouts),
// rounded and paired in one pass: half WidenValues' stores, none read back.
template <class KV>
void WidenValuePairs(const core::AttentionProblem<float>& p, int64_t b, int64_t hkv, int64_t j0, int64_t count,
                     int64_t width, float* dst) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto load = [&](const KV* row, int64_t c) HWY_ATTR {
    return row ? RoundToBF16(d, LoadKVUpTo(d, row, c, p.d_v)) : hn::Zero(d);  // (null: past an odd count)
  };
  for (int64_t i = 0; 2 * i < count; ++i) {
    const KV* lo = ValueRow<KV>(p, b, hkv, j0 + 2 * i);
    const KV* hi = 2 * i + 1 < count ? ValueRow<KV>(p, b, hkv, j0 + 2 * i + 1) : nullptr;
    for (int64_t c = 0; c < p.d_v; c += N) hn::Store(BF16Pairs(d, load(lo, c), load(hi, c)), d, dst + i * width + c);
  }
  FetchNextValues<KV>(p, b, hkv, j0, count);
}

thread_local Scratch<float> tls_scores, tls_out, tls_sums, tls_queries;

// What the passes over one item's key tiles share, for one query head at a
// time: the row blocks, the range of key tiles, scratch, and each row's
// running max m and sum l (per lane in l_lanes until the end).
struct ItemState {
  int64_t dvp;             // d_v rounded up to whole vectors
  int64_t t_begin, t_end;  // key tiles some row of the item reaches
  float* s;                // a block of scores, kBlockRows × a step's keys
  float* o;                // unnormalised output rows, rows × dvp
  float* l_lanes;          // per-lane running sums, rows × lanes
  RowBlock blocks[kBlockQ / kBlockRows];
  AlibiRows alibi;         // of the head being processed
  QueryRows q;             // its rows from it.i0 (SetQueries)
  float m[kBlockQ], l[kBlockQ];
  bool by_reference[kBlockQ];  // rows WriteRow computed again, extras and all
  float q_scales[kBlockQ], q_centers[kBlockQ];  // for the int8 unit (SetQueries)
};

ItemState StartItem(DF d, const Item& it) {
  const auto& p = it.p;
  const size_t N = hn::Lanes(d);
  ItemState st;
  st.dvp = WholeVectors(p.d_v);
  st.s = tls_scores.get(kBlockRows * kBlockK * it.StepTiles());
  st.o = tls_out.get(static_cast<size_t>(kBlockQ * std::max<int64_t>(st.dvp, 1)));
  st.l_lanes = tls_sums.get(static_cast<size_t>(kBlockQ) * N);
  const int64_t n_tiles = (p.n_k + kBlockK - 1) / kBlockK;
  const KeyRange first = allowed_keys(it.i0, p.n_q, p.n_k, p.causal, p.window);
  const KeyRange last = allowed_keys(it.i0 + it.rows - 1, p.n_q, p.n_k, p.causal, p.window);
  st.t_begin = first.begin / kBlockK;
  st.t_end = std::min(n_tiles, (last.end + kBlockK - 1) / kBlockK);
  for (int64_t r0 = 0; r0 < it.rows; r0 += kBlockRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kBlockRows, it.rows - r0));
    st.blocks[r0 / kBlockRows] = RowBlock(p, it.i0 + r0, rows);
  }
  return st;
}

// Head h's query rows for the products: the problem's own, or a copy
// rounded to bf16 (on the unit: its pairs) or quantized (int8), made here,
// once per head and item, not per tile.
void SetQueries(DF d, const Item& it, int64_t h, ItemState& st) {
  const auto& p = it.p;
  st.q = QueryRows::Of(p, it.b, h, it.i0);
  if (p.precision == Precision::Float32) return;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d)), width = WholeVectors(p.d);  // (>= the unit's pairs)
  float* rounded = tls_queries.get(static_cast<size_t>(it.rows * width));
  for (int64_t r = 0; r < it.rows; ++r) {
    if (p.precision == Precision::Int8) {
      float* row = rounded + r * width;
      std::copy(st.q.first + r * st.q.stride, st.q.first + r * st.q.stride + p.d, row);
      const float scale = QuantizeRowInt8(row, p.d, nullptr, it.int8 != nullptr);
      if (it.int8) QueryCodes(row, p.d, scale, it.key_mean, st.q_scales[r], st.q_centers[r]);
      continue;
    }
    if (const BF16Unit* unit = it.scores_unit()) {
      unit->to_pairs(st.q.first + r * st.q.stride, p.d, reinterpret_cast<uint32_t*>(rounded + r * width));
      continue;
    }
    const float* in = st.q.first + r * st.q.stride;
    float* out = rounded + r * width;
    for (int64_t c = 0; c < p.d; c += N) {
      const int64_t m = std::min(N, p.d - c);
      StorePart(d, RoundToBF16(d, LoadPart(d, in + c, m, 0.0f)), out + c, m);
    }
  }
  st.q = {rounded, width};
  if (it.int8) st.q.scales = st.q_scales, st.q.centers = st.q_centers;
}

// The online softmax over the item's key tiles for head h: leaves each row's
// running max (SoftmaxStep's, which in float32 may trail the true max by up
// to 8) in st.m, its per-lane sum in st.l_lanes and O = Σ P V in st.o. Key tile
// outer, row blocks inner (see the top of the file). With `pack`, the first
// head of the item's group packs each K tile just before its rows use it.
// Inlined, so that the row state stays a local of ProcessItem that the
// compiler can keep in registers across the key tiles.
HWY_INLINE void SoftmaxPass(DF d, const Item& it, int64_t h, bool pack, ItemState& st) {
  const auto& p = it.p;
  const size_t N = hn::Lanes(d);
  const int64_t dvp = st.dvp;
  float* s = st.s;
  float* o = st.o;
  const bool bf16 = p.precision != Precision::Float32;  // (int8's P is bf16's)
  std::fill(st.l_lanes, st.l_lanes + it.rows * N, 0.0f);
  for (int64_t r = 0; r < it.rows; ++r) {
    st.m[r] = SinkLogit(p, h, it.i0 + r);  // -inf without sinks
    if (!p.sinks.empty()) st.l_lanes[r * N] = 1.0f;
  }
  std::fill(o, o + it.rows * dvp, 0.0f);
  // A step takes `tiles` key tiles: their scores side by side in each row of
  // s, one softmax step and one P·V over them. Steps start at multiples of
  // `tiles` for every item (so items of any size round P the same way, and
  // V's pairs made once per step of keys serve all of them): a step's first
  // tile may lie before the item's first.
  const int64_t tiles = it.StepTiles(), s_stride = tiles * kBlockK;
  const auto keys_from = [&](int64_t kt, int64_t end) { return std::min(end * kBlockK, p.n_k) - kt * kBlockK; };
  for (int64_t t0 = st.t_begin / tiles * tiles; t0 < st.t_end; t0 += tiles) {
    const int64_t t1 = std::min(t0 + tiles, st.t_end), j0 = t0 * kBlockK;
    const float* v0 = it.v ? it.v + j0 * dvp : it.v_tile;
    if (!it.v) it.widen_v(p, it.b, it.hkv, j0, keys_from(t0, t1), dvp, it.v_tile);
    if (pack)
      for (int64_t kt = std::max(t0, st.t_begin); kt < t1; ++kt) it.PackTile(kt);
    for (int64_t r0 = 0; r0 < it.rows; r0 += kBlockRows) {
      const RowBlock& rb = st.blocks[r0 / kBlockRows];
      // The step's tiles that the block reaches: a run, as each row's
      // allowed keys are one range.
      int64_t first = t0, end = t1;
      while (first < end && rb.masks_all(first * kBlockK, keys_from(first, first + 1))) ++first;
      while (end > first && rb.masks_all((end - 1) * kBlockK, keys_from(end - 1, end))) --end;
      if (first == end) continue;
      for (int64_t kt = first; kt < end; ++kt)
        Scores(d, p, it.b, h, kt, rb, st.q.From(r0), it.kpack + kt * p.d * kBlockK, st.alibi,
               s + (kt - first) * kBlockK, s_stride, nullptr, it.scores_unit(), it.int8);
      const int rows = rb.rows;
      const int64_t count = keys_from(first, end), width = WholeVectors(count);  // (past them: -inf)
      for (int r = 0; r < rows; ++r) {
        float* orow = o + (r0 + r) * dvp;
        float* sr = s + r * s_stride;
        float& m = st.m[r0 + r];
        float* l = st.l_lanes + (r0 + r) * N;
        const float alpha = !bf16    ? SoftmaxStep(d, sr, width, m, l)
                            : it.unit ? SoftmaxStep<SoftmaxFor::BF16Unit>(d, sr, width, m, l)
                                      : SoftmaxStep<SoftmaxFor::BF16>(d, sr, width, m, l);
        if (alpha != 1.0f) {
          const VF a = hn::Set(d, alpha);
          for (int64_t c = 0; c < dvp; c += static_cast<int64_t>(N))
            hn::Store(hn::Mul(hn::Load(d, orow + c), a), d, orow + c);
        }
      }
      // (In bf16, SoftmaxStep left P rounded, or for the unit to round.)
      // V from key `first` (on the unit, rows of pairs: a step's first tile is whole).
      const int64_t skipped = (first - t0) * kBlockK;
      if (it.unit) {
        const auto* v = reinterpret_cast<const uint32_t*>(v0) + skipped / 2 * dvp;
        it.unit->accumulate(s, s_stride, rows, count, v, dvp, o + r0 * dvp, dvp);
        continue;
      }
      AccumulateValues(d, rows, s, s_stride, count, v0 + skipped * dvp, dvp, dvp, o + r0 * dvp, dvp);
    }
  }
}

// out = O / l for head h's rows (0 for a row with no allowed key), and their
// log-sum-exp when asked for; leaves each row's final sum in st.l.
void WriteOutput(DF d, const Item& it, int64_t h, ItemState& st) {
  const auto& p = it.p;
  const size_t N = hn::Lanes(d);
  for (int64_t r = 0; r < it.rows; ++r) {
    const int64_t i = it.i0 + r;
    st.l[r] = hn::GetLane(hn::SumOfLanes(d, hn::Load(d, st.l_lanes + r * N)));
    const float inv = st.l[r] == 0 ? 0.0f : 1.0f / st.l[r];  // l NaN: the row is NaN
    st.by_reference[r] = WriteRow(d, p, it.b, h, i, st.o + r * st.dvp, inv, p.out.row(it.b, h, i));
    if (p.lse && !st.by_reference[r]) *p.lse.row(it.b, h, i) = RowLse(p, h, i, st.m[r], st.l[r]);
  }
}

// Weights of head h's rows: a second sweep over the key tiles now that each
// row's max and sum are final (scores computed again, not kept: O(n) memory).
void WriteWeights(DF d, const Item& it, int64_t h, ItemState& st) {
  const auto& p = it.p;
  for (int64_t r = 0; r < it.rows; ++r) {
    if (st.by_reference[r]) continue;
    float* w = p.weights.row(it.b, h, it.i0 + r);
    const float outside = std::isnan(st.l[r]) ? st.l[r] : 0.0f;  // a NaN row is NaN throughout
    for (int64_t j = 0; j < p.n_k; ++j) w[j * p.weights.col_stride] = outside;
  }
  float* s = st.s;
  for (int64_t kt = st.t_begin; kt < st.t_end; ++kt) {
    const int64_t j0 = kt * kBlockK, jn = std::min(kBlockK, p.n_k - j0);
    for (int64_t r0 = 0; r0 < it.rows; r0 += kBlockRows) {
      const RowBlock& rb = st.blocks[r0 / kBlockRows];
      if (rb.masks_all(j0, jn)) continue;
      Scores(d, p, it.b, h, kt, rb, st.q.From(r0), it.kpack + kt * p.d * kBlockK, st.alibi, s, kBlockK, nullptr,
             it.scores_unit(), it.int8);
      for (int r = 0; r < rb.rows; ++r) {
        const int64_t i = r0 + r;
        if (st.l[i] == 0 || st.by_reference[i]) continue;
        float* w = p.weights.row(it.b, h, it.i0 + i);
        const float inv = 1.0f / st.l[i];
        for (int64_t j = 0; j < jn; ++j)
          w[(j0 + j) * p.weights.col_stride] = ExpDifference(s[r * kBlockK + j], st.m[i]) * inv;
      }
    }
  }
}

// The logits of head h's rows at p.logits_stage, in natural units (MaskRow's
// `natural`), from products computed again. The masked stage covers the
// tiles the softmax visited (-inf elsewhere); the earlier ones every key, so
// an item that packs its own K tiles packs the others here too.
void WriteLogits(DF d, const Item& it, int64_t h, ItemState& st) {
  const auto& p = it.p;
  const float ninf = -std::numeric_limits<float>::infinity();
  const bool masked = p.logits_stage == Logits::Masked;
  const bool softcap = p.softcap > 0 && p.logits_stage != Logits::Scaled;
  if (masked)
    for (int64_t r = 0; r < it.rows; ++r) {
      if (st.by_reference[r]) continue;
      float* row = p.logits.row(it.b, h, it.i0 + r);
      for (int64_t j = 0; j < p.n_k; ++j) row[j * p.logits.col_stride] = ninf;
    }
  const int64_t n_tiles = (p.n_k + kBlockK - 1) / kBlockK;
  float* s = st.s;
  for (int64_t kt = masked ? st.t_begin : 0; kt < (masked ? st.t_end : n_tiles); ++kt) {
    const int64_t j0 = kt * kBlockK, jn = std::min(kBlockK, p.n_k - j0);
    if (it.pack && (kt < st.t_begin || kt >= st.t_end)) it.PackTile(kt);
    for (int64_t r0 = 0; r0 < it.rows; r0 += kBlockRows) {
      const RowBlock& rb = st.blocks[r0 / kBlockRows];
      if (masked && rb.masks_all(j0, jn)) continue;
      Products(d, p, rb, st.q.From(r0), it.kpack + kt * p.d * kBlockK, j0, static_cast<float>(p.scale), s,
               kBlockK, nullptr, it.scores_unit(), it.int8);
      if (softcap) Softcap(d, p.softcap, s, rb.rows * kBlockK, /*natural=*/true);
      for (int r = 0; r < rb.rows; ++r) {
        float* sr = s + r * kBlockK;
        const int64_t i = it.i0 + r0 + r;
        if (st.by_reference[r0 + r]) continue;
        if (masked) {
          std::fill(sr + jn, sr + kBlockK, ninf);
          MaskRow(d, p, it.b, h, i, j0, jn, true, sr, /*natural=*/true);
        }
        float* row = p.logits.row(it.b, h, i);
        for (int64_t j = 0; j < jn; ++j) row[(j0 + j) * p.logits.col_stride] = sr[j];
      }
    }
  }
}

// Every query head of the item's GQA group, one after the other, against the
// same K/V tiles.
void ProcessItem(DF d, const Item& it) {
  ItemState st = StartItem(d, it);
  for (int64_t g = 0; g < it.p.group(); ++g) {
    const int64_t h = it.hkv * it.p.group() + g;
    st.alibi.Set(it.p, h, it.i0, it.rows);
    SetQueries(d, it, h, st);
    SoftmaxPass(d, it, h, it.pack && g == 0, st);
    WriteOutput(d, it, h, st);
    if (it.p.weights) WriteWeights(d, it, h, st);
    if (it.p.logits) WriteLogits(d, it, h, st);
  }
}

// Packed K of every (batch, kv head) (the calling thread's), of one in each
// thread (items that pack their own), and a V tile in each thread.
thread_local Scratch<float> tls_kpack, tls_vpack, tls_item_kpack, tls_v_tile, tls_key_means;

// Query rows per work item: kBlockQ, or half as many when there would be
// fewer than 2 items per thread (config.hpp).
int64_t ItemRows(const core::AttentionProblem<float>& p) {
  const int64_t items = p.batch * p.heads_kv * ((p.n_q + kBlockQ - 1) / kBlockQ);
  return items >= 2 * static_cast<int64_t>(num_threads()) ? kBlockQ : kBlockQ / 2;
}

template <class KV>
void FlashTiles(const core::AttentionProblem<float>& p) {
  const DF d;
  const int64_t n_tiles = (p.n_k + kBlockK - 1) / kBlockK;
  const int64_t head_pack = n_tiles * p.d * kBlockK;
  const int64_t heads = p.batch * p.heads_kv;
  const int64_t rows = ItemRows(p);
  const int64_t n_qt = (p.n_q + rows - 1) / rows;
  const int64_t dvp = WholeVectors(p.d_v);
  // Several query tiles share each (batch, kv head)'s packed K: a pass packs
  // it all first, once. A single one packs it inside its item, each tile
  // just before use, while it is in L1, saving short calls a pass of their
  // own. K stored in 16, 8 or 4 bits is always packed in the items: packed
  // all at once it would be a float32 copy of K, 2 to 7 times the memory of
  // K itself.
  const bool shared = n_qt > 1 && std::is_same_v<KV, float>;
  const BF16Unit* unit = p.precision != Precision::Float32 ? BF16UnitOfTarget() : nullptr;  // (Item::unit)
  const PackKFn pack_k = &PackKeys<KV>;
  const WidenValuesFn widen_v = unit ? &WidenValuePairs<KV> : &WidenValues<KV>;
  const auto size = static_cast<size_t>(std::max<int64_t>(shared ? heads * head_pack : head_pack, 1));
  float* kpack = shared ? tls_kpack.get(size) : nullptr;
  const bool v_in_place = std::is_same_v<KV, float> && !InPages(p) && p.d_v == dvp &&
                          ValueStride<KV>(p) == dvp && p.precision == Precision::Float32;
  // On the bf16 unit, V's pairs are made once for all items when K is packed
  // once, rather than again in each item: a copy of all of V, as K's panels
  // are of K.
  // float32 V that is not read in place (heads sliced from one wide array,
  // as the layer passes them, or pages) is still widened per tile: a full copy there
  // cost the layer's calls the memory of V again (test_mha.py's
  // test_padding_mask_costs_no_dense_mask).
  const bool v_shared = shared && unit;
  const int64_t head_vpack = n_tiles * kBlockK * dvp;
  float* vpack = v_shared ? tls_vpack.get(static_cast<size_t>(std::max<int64_t>(heads * head_vpack, 1))) : nullptr;
  // int8's centers of the keys, for each (batch, kv head) at once. The
  // int8 unit takes the call where its values are within the unit's limit
  // (finite: its codes have no NaN or infinity) and its panel fits a tile's
  // place (d >= 3).
  const int64_t mean_width = WholeVectors(p.d);
  float* key_means = nullptr;
  const Int8Unit* int8 = nullptr;
  if (p.precision == Precision::Int8) {
    key_means = tls_key_means.get(static_cast<size_t>(heads * mean_width));
    std::vector<char> within(static_cast<size_t>(heads));
    parallel_for(heads, [&](int64_t bh) {
      within[bh] = KeyMean<KV>(p, bh / p.heads_kv, bh % p.heads_kv, key_means + bh * mean_width);
    }, double(heads * p.n_k * p.d));
    const bool fits = Int8PanelBytes(p.d, kBlockK) <= p.d * kBlockK * static_cast<int64_t>(sizeof(float)) &&
                      std::abs(p.scale) <= kInt8UnitLimit;
    int8 = fits && std::all_of(within.begin(), within.end(), [](char w) { return w; }) ? int8_unit() : nullptr;
    if (int8 && !QueriesWithinUnitLimit(p)) int8 = nullptr;
  }
  const auto key_mean = [&](int64_t bh) { return key_means ? key_means + bh * mean_width : nullptr; };
  if (shared) {
    parallel_for(heads * n_tiles, [&](int64_t item) {
      const int64_t bh = item / n_tiles, kt = item % n_tiles, j0 = kt * kBlockK;
      pack_k(p, bh / p.heads_kv, bh % p.heads_kv, kt, unit, int8, key_mean(bh),
             kpack + bh * head_pack + kt * p.d * kBlockK);
      if (v_shared && kt % kBF16StepTiles == 0)  // a softmax step's keys at once (Item::v)
        widen_v(p, bh / p.heads_kv, bh % p.heads_kv, j0, std::min(kBF16StepKeys, p.n_k - j0), dvp,
                vpack + bh * head_vpack + j0 * dvp);
    }, double(heads * (head_pack + (v_shared ? head_vpack : 0))));
  }
  // The most expensive (last, under causal masking) query tiles go first.
  parallel_for(heads * n_qt, [&](int64_t item) {
    const int64_t qt = n_qt - 1 - item / heads, bh = item % heads;
    const int64_t b = bh / p.heads_kv, hkv = bh % p.heads_kv, i0 = qt * rows;
    const float* v = v_in_place ? p.v.row(b, hkv, 0) : v_shared ? vpack + bh * head_vpack : nullptr;
    float* v_tile = v ? nullptr : tls_v_tile.get(static_cast<size_t>(kBF16StepKeys * std::max<int64_t>(dvp, 1)));
    const Item it{p,
                  shared ? kpack + bh * head_pack : tls_item_kpack.get(size),
                  !shared,
                  pack_k,
                  v,
                  widen_v,
                  v_tile,
                  b,
                  hkv,
                  i0,
                  std::min(rows, p.n_q - i0),
                  unit,
                  key_mean(bh),
                  int8};
    ProcessItem(d, it);
  }, 2.0 * double(p.batch * p.heads_q) * double(p.n_q) * double(p.n_k) * double(p.d + p.d_v));
}

void FlashForward(const core::AttentionProblem<float>& p) {
  if (p.kv == core::KVStorage::Int4) return FlashTiles<block_int4>(p);
  WithKVType(p, [&](auto kv) HWY_ATTR { FlashTiles<decltype(kv)>(p); });
}

const char* BF16PrefillUnit() {
  const BF16Unit* unit = BF16UnitOfTarget();
  return unit ? unit->name : "highway";
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::kernels {
HWY_EXPORT(FlashForward);
HWY_EXPORT(BF16PrefillUnit);
void flash_forward(const core::AttentionProblem<float>& p) { HWY_DYNAMIC_DISPATCH(FlashForward)(p); }
const char* bf16_prefill_unit() { return HWY_DYNAMIC_DISPATCH(BF16PrefillUnit)(); }
}  // namespace attn::kernels
#endif
