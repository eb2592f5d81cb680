// The gradient of float32 attention, FlashAttention-2 style: the forward's
// tiles again, the weights P recomputed tile by tile from the saved
// log-sum-exp instead of stored, so memory grows with n, never n².
//
// With D_i = rowsum(dO_i ∘ O_i) (the row's Σ_j P_ij dP_ij), per key tile and
// block of query rows:
//   S  = the forward's scores (flash-inl.h's Scores: softcap, masks, ALiBi)
//   P  = 2^(S − lse)                  base-2 units, as the forward's softmax
//   dP = dO Vᵀ                        on V packed like K (a transposed panel)
//   dS = P ∘ (dP − D) [∘ (1 − tanh²)]  the gradient of the scaled logit
//   dV += Pᵀ dO,  dK += dSᵀ Q,  dQ += dS K   (scale applied once at the end)
// Work items are (batch, kv head): one item runs every key tile (outer) of
// its kv head, and for each the query heads of its GQA group in order and
// their row blocks (inner), so dK and dV of a tile sum the group's heads in
// a fixed order while they stay in cache, and dQ of every row sums the key
// tiles in order in the item's own buffer. With too few (batch, kv head)
// pairs to keep the threads busy, two passes split the same loops instead:
// items of key tiles write dK, dV, then items of query rows write dQ (S and
// dP computed twice). No two items write the same gradient and every sum
// keeps its order in either plan: results are bitwise equal for any number
// of threads. The products are the forward's: the packed panel for S and
// dP, AccumulateValues (P·V's micro-kernel) for the rest.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/backward.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/flash-inl.h"

#include <hwy/aligned_allocator.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <string>

#include "attn/threads.hpp"
#include "kernels/attention_kernel.hpp"
#include "kernels/config.hpp"
#include "kernels/scratch.hpp"
#include "thread_pool.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::kernels {
namespace HWY_NAMESPACE {
static_assert(kBackwardRows % kRows == 0 && kBackwardRows <= kBlockQ,
              "ATTN_BACKWARD_ROWS must be a multiple of kRows (4), at most ATTN_BLOCK_Q");
// The two-pass plan's items (BackwardTiles): row chunks of whole row blocks,
// so that their blocks are the one pass's.
constexpr int64_t kBackwardTilesPerItem = 4;
constexpr int64_t kBackwardRowsPerItem = 8 * kBackwardRows;
// The most the one-pass plan's dQ buffer may take per thread (it is kept,
// as all kernel scratch, for the next call): 32 MiB is n = 131072 rows of
// head dim 64, one query head per kv head.
constexpr int64_t kMaxBackwardScratch = int64_t{32} << 20;

// Per row of the problem (batch, head, row): D = dO · O, and the row's
// log-sum-exp in the units of the scores (base 2, shifted with ALiBi's
// anchor as Scores shifts them); +inf for a row with no allowed key, so that
// its P = 2^(S − lse) is 0 throughout.
struct RowStats {
  float* delta;
  float* lse2;
  int64_t at(const core::AttentionProblem<float>& p, int64_t b, int64_t h, int64_t i) const {
    return (b * p.heads_q + h) * p.n_q + i;
  }
};

// Whether every value in n elements of a row (col_stride 1) is finite.
template <class KV>
bool FiniteRow(const KV* row, int64_t n) {
  for (int64_t c = 0; c < n; ++c)
    if (!std::isfinite(KVValue(row, c))) return false;
  return true;
}

// Fills stats, and reports whether the kernel can take the problem: every
// input finite, every row's lse finite or -inf (a NaN or +inf anywhere goes
// to the reference, which settles those rows by its edge rules).
template <class KV>
bool Prepare(const core::AttentionProblem<float>& p, const core::GradientOperands<float>& g, const RowStats& stats) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  std::atomic<bool> finite{true};
  parallel_for(p.batch * p.heads_q, [&](int64_t item) {
    const int64_t b = item / p.heads_q, h = item % p.heads_q;
    bool ok = true;
    for (int64_t i = 0; i < p.n_q && ok; ++i) {
      const float* o = p.out.row(b, h, i);
      const float* dout = g.dout.row(b, h, i);
      VF sum = hn::Zero(d);
      int64_t c = 0;
      for (; c + N <= p.d_v; c += N) sum = hn::MulAdd(hn::LoadU(d, o + c), hn::LoadU(d, dout + c), sum);
      if (c < p.d_v) sum = hn::MulAdd(LoadPart(d, o + c, p.d_v - c, 0.0f), LoadPart(d, dout + c, p.d_v - c, 0.0f), sum);
      const float delta = hn::GetLane(hn::SumOfLanes(d, sum));
      const float lse = *p.lse.row(b, h, i);
      ok = std::isfinite(delta) && !std::isnan(lse) && lse != std::numeric_limits<float>::infinity() &&
           FiniteRow(p.q.row(b, h, i), p.d);
      const int64_t at = stats.at(p, b, h, i);
      stats.delta[at] = delta;
      stats.lse2[at] = lse == -std::numeric_limits<float>::infinity()
                           ? std::numeric_limits<float>::infinity()
                           : static_cast<float>((double(lse) + AlibiShift(p, h, i)) * 1.44269504088896341);
    }
    if (h % p.group() == 0)  // each kv head's rows once
      for (int64_t j = 0; j < p.n_k && ok; ++j)
        ok = FiniteRow(KeyRow<KV>(p, b, h / p.group(), j), p.d) && FiniteRow(ValueRow<KV>(p, b, h / p.group(), j), p.d_v);
    if (!ok) finite = false;
  }, 2.0 * double(p.batch * p.heads_q) * double(p.n_q) * double(p.d + p.d_v));
  return finite;
}

static thread_local Scratch<float> tls_dq, tls_dk, tls_dv, tls_kpack, tls_vpack, tls_p, tls_ds, tls_tanh, tls_k_tile,
    tls_v_tile;

// What one work item computes: for (b, hkv), query heads hkv·G + g for g in
// [g_begin, g_end), rows [i_begin, i_end) (i_begin a multiple of
// kBackwardRows), key tiles [t_begin, t_end); dK and dV of its tiles (keys:
// the item then covers every head and row) and dQ of its heads and rows
// (queries: the item then covers every key tile).
struct Span {
  int64_t b, hkv, g_begin, g_end, i_begin, i_end, t_begin, t_end;
  bool keys, queries;
};

// K and V rows j0 .. j0 + count - 1 of (b, hkv) in float32, whole vectors
// wide (zeros past d and d_v), at k (k_width apart) and v (v_width apart):
// the one part of the gradient that depends on the storage type, so that
// BackwardItem is compiled once. Widening is exact, so the gradient is
// that of the stored values, whichever the type.
using WidenTileFn = void (*)(const core::AttentionProblem<float>& p, int64_t b, int64_t hkv, int64_t j0,
                             int64_t count, float* k, int64_t k_width, float* v, int64_t v_width);
template <class KV>
void WidenTile(const core::AttentionProblem<float>& p, int64_t b, int64_t hkv, int64_t j0, int64_t count, float* k,
               int64_t k_width, float* v, int64_t v_width) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t j = 0; j < count; ++j) {
    const KV* kr = KeyRow<KV>(p, b, hkv, j0 + j);
    const KV* vr = ValueRow<KV>(p, b, hkv, j0 + j);
    for (int64_t c = 0; c < p.d; c += N) hn::Store(LoadKVUpTo(d, kr, c, p.d), d, k + j * k_width + c);
    for (int64_t c = 0; c < p.d_v; c += N) hn::Store(LoadKVUpTo(d, vr, c, p.d_v), d, v + j * v_width + c);
  }
}

// One item: key tiles outer, then heads, then row blocks, as the top of the
// file says. Every gradient element sums in the same order whatever the
// span, so the one-pass and two-pass plans (BackwardTiles) agree bitwise.
// float32 K and V are read in place; other types through `widen`.
void BackwardItem(DF d, const core::AttentionProblem<float>& p, const core::GradientOperands<float>& g,
                  const RowStats& stats, WidenTileFn widen, const Span& sp) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t G = p.group(), dp = WholeVectors(p.d), dvp = WholeVectors(p.d_v);
  const int64_t rows = sp.i_end - sp.i_begin, heads = sp.g_end - sp.g_begin;
  constexpr int64_t R = kBackwardRows;
  float* dq = sp.queries ? tls_dq.get(static_cast<size_t>(std::max<int64_t>(heads * rows * dp, 1))) : nullptr;
  float* dk = tls_dk.get(static_cast<size_t>(kBlockK * std::max<int64_t>(dp, 1)));
  float* dv = tls_dv.get(static_cast<size_t>(kBlockK * std::max<int64_t>(dvp, 1)));
  float* kpack = tls_kpack.get(static_cast<size_t>(std::max<int64_t>(p.d * kBlockK, 1)));
  float* vpack = tls_vpack.get(static_cast<size_t>(std::max<int64_t>(p.d_v * kBlockK, 1)));
  float* P = tls_p.get(R * kBlockK);
  float* dS = tls_ds.get(R * kBlockK);
  float* tanh = p.softcap > 0 ? tls_tanh.get(R * kBlockK) : nullptr;
  float* k_tile = widen ? tls_k_tile.get(static_cast<size_t>(kBlockK * std::max<int64_t>(dp, 1))) : nullptr;
  float* v_tile = widen ? tls_v_tile.get(static_cast<size_t>(kBlockK * std::max<int64_t>(dvp, 1))) : nullptr;
  if (dq) std::fill(dq, dq + heads * rows * dp, 0.0f);
  AlibiRows alibi;
  for (int64_t kt = sp.t_begin; kt < sp.t_end; ++kt) {
    const int64_t j0 = kt * kBlockK, jn = std::min(kBlockK, p.n_k - j0);
    if (sp.keys) {
      std::fill(dk, dk + jn * dp, 0.0f);
      std::fill(dv, dv + jn * dvp, 0.0f);
    }
    if (widen) widen(p, sp.b, sp.hkv, j0, jn, k_tile, dp, v_tile, dvp);
    const float* k_rows = widen ? k_tile : KeyRow<float>(p, sp.b, sp.hkv, j0);
    const float* v_rows = widen ? v_tile : ValueRow<float>(p, sp.b, sp.hkv, j0);
    const int64_t k_stride = widen ? dp : KeyStride<float>(p), v_stride = widen ? dvp : ValueStride<float>(p);
    PackRows(k_rows, k_stride, jn, p.d, kpack);
    PackRows(v_rows, v_stride, jn, p.d_v, vpack);
    for (int64_t gi = sp.g_begin; gi < sp.g_end; ++gi) {
      const int64_t h = sp.hkv * G + gi;
      for (int64_t i0 = sp.i_begin; i0 < sp.i_end; i0 += R) {
        const RowBlock rb(p, i0, static_cast<int>(std::min(R, sp.i_end - i0)));
        if (rb.masks_all(j0, jn)) continue;
        alibi.Set(p, h, i0, rb.rows);
        Scores(d, p, sp.b, h, kt, rb, QueryRows::Of(p, sp.b, h, i0), kpack, alibi, P, kBlockK, tanh);
        // dP = dO Vᵀ
        const float* dout_rows[kRows];
        for (int r0 = 0; r0 < rb.rows; r0 += kRows) {
          const int mr = std::min(kRows, rb.rows - r0);
          for (int r = 0; r < mr; ++r) dout_rows[r] = g.dout.row(sp.b, h, i0 + r0 + r);
          MatmulPanel(d, dout_rows, mr, p.d_v, vpack, 1.0f, dS + r0 * kBlockK, kBlockK, Plain(), jn);
        }
        // P = 2^(S - lse), dS = P (dP - D), times softcap's 1 - tanh², over
        // the tile's keys (whole vectors: the products computed)
        const int64_t width = WholeVectors(jn);
        for (int r = 0; r < rb.rows; ++r) {
          const int64_t at = stats.at(p, sp.b, h, i0 + r);
          const VF lse = hn::Set(d, stats.lse2[at]), delta = hn::Set(d, stats.delta[at]);
          float* pr = P + r * kBlockK;
          float* dsr = dS + r * kBlockK;
          for (int64_t j = 0; j < width; j += N) {
            // (S - lse <= 0 up to rounding with the forward's lse; clamped, so
            // that a caller's inconsistent lse cannot wrap the exponent)
            const VF pj = SoftmaxExp2(d, hn::Min(hn::Sub(hn::Load(d, pr + j), lse), hn::Zero(d)));
            hn::Store(pj, d, pr + j);
            VF ds = hn::Mul(pj, hn::Sub(hn::Load(d, dsr + j), delta));
            if (tanh) {
              const VF t = hn::Load(d, tanh + r * kBlockK + j);
              ds = hn::Mul(ds, hn::NegMulAdd(t, t, hn::Set(d, 1.0f)));
            }
            hn::Store(ds, d, dsr + j);
          }
        }
        if (sp.keys) {
          AccumulateValues<true>(d, jn, P, kBlockK, rb.rows, g.dout.row(sp.b, h, i0), g.dout.row_stride, p.d_v,
                                 dv, dvp);
          AccumulateValues<true>(d, jn, dS, kBlockK, rb.rows, p.q.row(sp.b, h, i0), p.q.row_stride, p.d, dk, dp);
        }
        if (sp.queries)
          AccumulateValues(d, rb.rows, dS, kBlockK, jn, k_rows, k_stride, p.d,
                           dq + ((gi - sp.g_begin) * rows + (i0 - sp.i_begin)) * dp, dp);
      }
    }
    if (sp.keys) {
      const float scale = static_cast<float>(p.scale);
      for (int64_t j = 0; j < jn; ++j) {
        float* dkr = g.dk.row(sp.b, sp.hkv, j0 + j);
        float* dvr = g.dv.row(sp.b, sp.hkv, j0 + j);
        for (int64_t c = 0; c < p.d; ++c) dkr[c * g.dk.col_stride] = scale * dk[j * dp + c];
        for (int64_t c = 0; c < p.d_v; ++c) dvr[c * g.dv.col_stride] = dv[j * dvp + c];
      }
    }
  }
  if (!sp.queries) return;
  const float scale = static_cast<float>(p.scale);
  for (int64_t gi = sp.g_begin; gi < sp.g_end; ++gi)
    for (int64_t i = sp.i_begin; i < sp.i_end; ++i) {
      float* dqr = g.dq.row(sp.b, sp.hkv * G + gi, i);
      const float* acc = dq + ((gi - sp.g_begin) * rows + (i - sp.i_begin)) * dp;
      for (int64_t c = 0; c < p.d; ++c) dqr[c * g.dq.col_stride] = scale * acc[c];
    }
}

template <class KV>
bool BackwardTiles(const core::AttentionProblem<float>& p, const core::GradientOperands<float>& g) {
  const DF d;
  if (p.heads_kv == 0) return true;  // no head: nothing to write (and no group size)
  const auto rows = static_cast<size_t>(std::max<int64_t>(p.batch * p.heads_q * p.n_q, 1));
  const auto delta = hwy::AllocateAligned<float>(rows), lse2 = hwy::AllocateAligned<float>(rows);
  if (!delta || !lse2) throw ValueError("attention_backward: cannot allocate " + std::to_string(8 * rows) + " bytes");
  const RowStats stats{delta.get(), lse2.get()};
  if (!Prepare<KV>(p, g, stats)) return false;
  const WidenTileFn widen = std::is_same_v<KV, float> ? nullptr : &WidenTile<KV>;
  // The sinks' gradient: dsink = -Σ_i e^(sink - lse_i) D_i, rows in order.
  if (g.dsinks)
    for (int64_t h = 0; h < p.heads_q; ++h) {
      double sum = 0;
      for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t i = 0; i < p.n_q; ++i)
          sum += std::exp(p.sinks[h] - double(*p.lse.row(b, h, i))) * stats.delta[stats.at(p, b, h, i)];
      g.dsinks[h * g.dsinks_stride] = static_cast<float>(-sum);
    }
  const int64_t G = p.group(), n_tiles = (p.n_k + kBlockK - 1) / kBlockK, pairs = p.batch * p.heads_kv;
  // One pass: an item per (batch, kv head), 10 units of arithmetic each, in
  // ceil(pairs / T) rounds on T threads (or all on this thread, for a small
  // call); two passes: 14 units per pair, spread evenly. Both give the same
  // bits: the choice is speed and memory alone.
  // The one pass keeps an item's dQ (G · n_q rows) in a per-thread buffer:
  // beyond kMaxBackwardScratch bytes, the two passes' row items instead.
  const int64_t T = num_threads();
  const double work = 10.0 * double(p.batch * p.heads_q) * double(p.n_q) * double(p.n_k) * double(p.d);
  const bool fits = double(G * p.n_q * WholeVectors(p.d)) * sizeof(float) <= double(kMaxBackwardScratch);
  if (fits && (work < kMinParallelWork || (pairs + T - 1) / T * 10 <= pairs * 14 / T)) {
    parallel_for(pairs, [&](int64_t item) {
      BackwardItem(d, p, g, stats, widen, {item / p.heads_kv, item % p.heads_kv, 0, G, 0, p.n_q, 0, n_tiles, true, true});
    }, work);
    return true;
  }
  // Too few pairs for the threads: dK, dV by items of key tiles, then dQ by
  // items of query rows (S and dP computed in both). The same sums in the
  // same order as the one pass.
  const int64_t key_chunks = (n_tiles + kBackwardTilesPerItem - 1) / kBackwardTilesPerItem;
  parallel_for(pairs * key_chunks, [&](int64_t item) {
    const int64_t pair = item / key_chunks, t0 = item % key_chunks * kBackwardTilesPerItem;
    BackwardItem(d, p, g, stats, widen, {pair / p.heads_kv, pair % p.heads_kv, 0, G, 0, p.n_q, t0,
                                      std::min(n_tiles, t0 + kBackwardTilesPerItem), true, false});
  }, work);
  const int64_t row_chunks = (p.n_q + kBackwardRowsPerItem - 1) / kBackwardRowsPerItem;
  parallel_for(p.batch * p.heads_q * row_chunks, [&](int64_t item) {
    const int64_t bh = item / row_chunks, i0 = item % row_chunks * kBackwardRowsPerItem;
    const int64_t b = bh / p.heads_q, h = bh % p.heads_q;
    BackwardItem(d, p, g, stats, widen, {b, h / G, h % G, h % G + 1, i0, std::min(p.n_q, i0 + kBackwardRowsPerItem), 0,
                                      n_tiles, false, true});
  }, work);
  return true;
}

bool FlashBackward(const core::AttentionProblem<float>& p, const core::GradientOperands<float>& g) {
  bool done = false;
  WithKVType(p, [&](auto kv) HWY_ATTR { done = BackwardTiles<decltype(kv)>(p, g); });
  return done;
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::kernels {
HWY_EXPORT(FlashBackward);
bool flash_backward(const core::AttentionProblem<float>& p, const core::GradientOperands<float>& g) {
  return HWY_DYNAMIC_DISPATCH(FlashBackward)(p, g);
}
}  // namespace attn::kernels
#endif
