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

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/attention_kernel.hpp"
#include "kernels/config.hpp"
#include "kernels/scratch.hpp"
#include "thread_pool.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::kernels {
namespace HWY_NAMESPACE {

// s[r · s_stride] = scale · q_r · k for r < MR.
template <int MR, class KV>
HWY_INLINE void DotRows(DF d, const float* const* q, const KV* k, int64_t D, float scale,
                        float* s, int64_t s_stride) {
  const size_t N = hn::Lanes(d);
  const int64_t full = D / static_cast<int64_t>(N) * static_cast<int64_t>(N);
#if HWY_HAVE_SCALABLE
  // Two accumulators per row, r and MR + r (the even and odd vector steps),
  // named (see Acc): the same loads and FMAs as the array form below.
  static_assert(2 * MR <= 8, "the accumulators fit in eight names");
  VF a0 = hn::Zero(d), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  const auto acc = [&](auto i) HWY_ATTR -> VF& { return Acc<i>(a0, a1, a2, a3, a4, a5, a6, a7); };
  int64_t c = 0;
  for (; c + 2 * static_cast<int64_t>(N) <= full; c += 2 * static_cast<int64_t>(N)) {
    VF kv, kv2;
    LoadKVPair(d, k, c, kv, kv2);
    Unroll<MR>([&](auto r) HWY_ATTR {
      acc(r) = hn::MulAdd(hn::LoadU(d, q[r] + c), kv, acc(r));
      acc(std::integral_constant<int, MR + r>()) =
          hn::MulAdd(hn::LoadU(d, q[r] + c + N), kv2, acc(std::integral_constant<int, MR + r>()));
    });
  }
  for (; c < full; c += static_cast<int64_t>(N)) {
    const VF kv = LoadKV(d, k, c);
    Unroll<MR>([&](auto r) HWY_ATTR { acc(r) = hn::MulAdd(hn::LoadU(d, q[r] + c), kv, acc(r)); });
  }
  Unroll<MR>([&](auto r) HWY_ATTR {
    VF sum = hn::Add(acc(r), acc(std::integral_constant<int, MR + r>()));
    if (full < D)
      sum = hn::MulAdd(LoadPart(d, q[r] + full, D - full, 0.0f), LoadKVPart(d, k, full, D - full), sum);
    s[r * s_stride] = hn::GetLane(hn::SumOfLanes(d, sum)) * scale;
  });
#else
  // Two accumulators per row halve the chain of FMAs a key's score waits on:
  // more keys, and so more memory reads, in flight.
  VF acc[MR], acc2[MR];
  for (int r = 0; r < MR; ++r) acc[r] = acc2[r] = hn::Zero(d);
  int64_t c = 0;
  for (; c + 2 * static_cast<int64_t>(N) <= full; c += 2 * static_cast<int64_t>(N)) {
    VF kv, kv2;
    LoadKVPair(d, k, c, kv, kv2);
    for (int r = 0; r < MR; ++r) {
      acc[r] = hn::MulAdd(hn::LoadU(d, q[r] + c), kv, acc[r]);
      acc2[r] = hn::MulAdd(hn::LoadU(d, q[r] + c + N), kv2, acc2[r]);
    }
  }
  for (; c < full; c += static_cast<int64_t>(N)) {
    const VF kv = LoadKV(d, k, c);
    for (int r = 0; r < MR; ++r) acc[r] = hn::MulAdd(hn::LoadU(d, q[r] + c), kv, acc[r]);
  }
  for (int r = 0; r < MR; ++r) acc[r] = hn::Add(acc[r], acc2[r]);
  if (full < D) {
    const VF kv = LoadKVPart(d, k, full, D - full);
    for (int r = 0; r < MR; ++r) acc[r] = hn::MulAdd(LoadPart(d, q[r] + full, D - full, 0.0f), kv, acc[r]);
  }
  for (int r = 0; r < MR; ++r) s[r * s_stride] = hn::GetLane(hn::SumOfLanes(d, acc[r])) * scale;
#endif
}

// How many keys from key j on (below n) lie in one page of K and V: all of
// them unless K and V are paged (K's pages are V's).
inline int64_t RowsInPage(const core::AttentionProblem<float>& p, int64_t j, int64_t n) {
  return p.kv == core::KVStorage::Native ? p.k.rows_in_page(j, n) : p.k_stored.rows_in_page(j, n);
}

thread_local Scratch<float> tls_decode_scores;
thread_local Scratch<const float*> tls_decode_queries;

// How a problem's keys are split into work items: `heads` consecutive kv
// heads and `keys` keys each. One head per item, kDecodeChunk keys, unless
// the heads of a token lie side by side in paged memory (NHD pages): then
// an item takes every head of fewer keys, and so reads whole pages in
// order, where one head's rows lie a page row apart (docs/performance.md).
struct Split {
  int64_t heads, keys;
};
Split SplitOf(const core::AttentionProblem<float>& p) {
  const auto& k = p.kv == core::KVStorage::Native ? p.k.pages : p.k_stored.pages;
  const int64_t head_stride = p.kv == core::KVStorage::Native ? p.k.head_stride : p.k_stored.head_stride;
  const int64_t row_stride = p.kv == core::KVStorage::Native ? p.k.row_stride : p.k_stored.row_stride;
  if (!k || p.heads_kv == 1 || std::abs(head_stride) >= std::abs(row_stride)) return {1, kDecodeChunk};
  return {p.heads_kv, std::max<int64_t>(64, kDecodeChunk / p.heads_kv / 64 * 64)};
}

// Partial result of one item, kv heads h0 .. h0 + split.heads, keys of
// chunk `chunk`, for its rows (R = group · n_q per head, head by head):
// O[rows][dvp] (aligned), then m[rows], l[rows].
template <class KV>
void DecodeChunk(DF d, const core::AttentionProblem<float>& p, int64_t b, int64_t h0, const Split& split,
                 int64_t chunk, int64_t dvp, float* part) {
  const int64_t R = p.group() * p.n_q, nh = split.heads, rows = nh * R, C = split.keys;
  float* o = part;
  float* m = part + rows * dvp;
  float* l = m + rows;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  alignas(HWY_MAX_BYTES) float l_lanes[HWY_MAX_BYTES / sizeof(float)];
  const float ninf = -std::numeric_limits<float>::infinity();
  std::fill(m, m + rows, ninf);
  std::fill(l, l + rows, 0.0f);
  std::fill(o, o + rows * dvp, 0.0f);
  const int64_t j0 = chunk * C, jn = std::min(C, p.n_k - j0);
  // The chunk's place in the rows' causal/window ranges (monotone in the row).
  const KeyRange first = allowed_keys(0, p.n_q, p.n_k, p.causal, p.window);
  const KeyRange last = allowed_keys(p.n_q - 1, p.n_q, p.n_k, p.causal, p.window);
  if (j0 >= last.end || j0 + jn <= first.begin) return;
  const bool inside = j0 >= last.begin && j0 + jn <= first.end;

  float* s = tls_decode_scores.get(static_cast<size_t>(rows * C));
  // Row r of the item: head h0 + r / R's query head r % R / n_q, query r % n_q.
  const auto row_head = [&](int64_t r) { return (h0 + r / R) * p.group() + r % R / p.n_q; };
  const float** q = tls_decode_queries.get(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) q[r] = p.q.row(b, row_head(r), r % p.n_q);
  const float scale = ScoreScale(p);
  const int64_t v_stride = ValueStride<KV>(p), v_bytes = RowBytes<KV>(p.d_v);
  const int64_t k_stride = KeyStride<KV>(p), k_bytes = RowBytes<KV>(p.d);
  // A token's rows of the item's heads (nh > 1: side by side, one span).
  const int64_t k_head = nh == 1 ? 0 : KeyRow<KV>(p, b, h0 + 1, j0) - KeyRow<KV>(p, b, h0, j0);
  const int64_t v_head = nh == 1 ? 0 : ValueRow<KV>(p, b, h0 + 1, j0) - ValueRow<KV>(p, b, h0, j0);
  const int64_t k_span = (nh - 1) * k_head * static_cast<int64_t>(sizeof(KV)) + k_bytes;
  const int64_t v_span = (nh - 1) * v_head * static_cast<int64_t>(sizeof(KV)) + v_bytes;
  const bool heads_outer = nh > 1 && rows * p.d * static_cast<int64_t>(sizeof(float)) > kDecodeL1QueryBytes;
  // The chunk's keys run by run: a run's rows are k_stride (v_stride) apart,
  // one run unless K and V are paged, then one per page. K's rows ahead lie
  // in this run or the next (pages shorter than the distance ahead go
  // without).
  int64_t count = RowsInPage(p, j0, j0 + jn);
  for (int64_t run = 0; run < jn;) {
    const KV* k_run = KeyRow<KV>(p, b, h0, j0 + run);
    const KV* v_run = ValueRow<KV>(p, b, h0, j0 + run);
    const int64_t next = run + count;
    const int64_t next_count = next < jn ? RowsInPage(p, j0 + next, j0 + jn) : 0;
    const KV* next_k = next < jn ? KeyRow<KV>(p, b, h0, j0 + next) : nullptr;
    // Key by key for every head; or, when the item's query rows overflow L1
    // (kDecodeL1QueryBytes), head by head over the run's keys, so that a
    // head's rows stay in L1. The first pass fetches ahead for all heads.
    // Either order computes the same scores.
    const int64_t passes = heads_outer ? nh : 1;
    for (int64_t pass = 0; pass < passes; ++pass)
      for (int64_t j = 0; j < count; ++j) {
        const KV* k = k_run + j * k_stride;
        if (pass == 0) {
          // Fetch row j of V while K streams in: both arrays come from
          // memory concurrently, and P·V below reads V from cache. And K's
          // row kDecodePrefetchRows ahead: the hardware's prefetcher alone
          // leaves K's reads waiting (config.hpp).
          const char* vj = reinterpret_cast<const char*>(v_run + j * v_stride);
          for (int64_t off = 0; off < v_span; off += 64) hwy::Prefetch(vj + off);
          if (v_span > 0) hwy::Prefetch(vj + v_span - 1);  // the last line, if not line-aligned
          const int64_t a = j + kDecodePrefetchRows;
          if (a < count || a - count < next_count) {
            const KV* ahead = a < count ? k + kDecodePrefetchRows * k_stride : next_k + (a - count) * k_stride;
            const char* ka = reinterpret_cast<const char*>(ahead);
            for (int64_t off = 0; off < k_span; off += 64) hwy::Prefetch(ka + off);
            if (k_span > 0) hwy::Prefetch(ka + k_span - 1);
          }
        }
        for (int64_t hh = heads_outer ? pass : 0; hh < (heads_outer ? pass + 1 : nh); ++hh)
          for (int64_t r0 = 0; r0 < R; r0 += kRows) {
            float* sj = s + (hh * R + r0) * C + run + j;
            WithCount<kRows>(std::min<int64_t>(kRows, R - r0), [&](auto mr) HWY_ATTR {
              DotRows<decltype(mr)::value>(d, q + hh * R + r0, k + hh * k_head, p.d, scale, sj, C);
            });
          }
      }
    run = next;
    count = next_count;
  }
  if (p.softcap > 0) Softcap(d, p.softcap, s, rows * C);
  const bool masked = !inside || p.mask.present() || !p.alibi.empty();
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * C;
    std::fill(sr + jn, sr + C, ninf);
    if (masked)
      MaskRow(d, p, b, row_head(r), r % p.n_q, j0, jn, !inside, sr);
    std::fill(l_lanes, l_lanes + N, 0.0f);
    SoftmaxStep(d, sr, C, m[r], l_lanes);
    l[r] = hn::GetLane(hn::SumOfLanes(d, hn::Load(d, l_lanes)));
  }
  for (int64_t run = 0; run < jn;) {
    const int64_t n = RowsInPage(p, j0 + run, j0 + jn);
    for (int64_t hh = 0; hh < nh; ++hh)
      AccumulateValues(d, R, s + hh * R * C + run, C, n, ValueRow<KV>(p, b, h0 + hh, j0 + run), v_stride, p.d_v,
                       o + hh * R * dvp, dvp);
    run += n;
  }
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
    const int64_t chunks = (p.n_k + split.keys - 1) / split.keys, groups = p.batch * p.heads_kv / split.heads;
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
  // The problem an item (or a problem's merge) belongs to.
  const auto problem_of = [&](const std::vector<int64_t>& firsts, int64_t x) {
    return static_cast<int64_t>(std::upper_bound(firsts.begin(), firsts.end(), x) - firsts.begin()) - 1;
  };
  parallel_for(total, [&](int64_t item) {
    const int64_t i = problem_of(items.first_item, item);
    const auto u = static_cast<size_t>(i);
    const core::AttentionProblem<float>& p = *problems[i];
    const int64_t local = item - items.first_item[u];
    const int64_t chunks = items.chunks[u], group = local / chunks, groups_per_entry = p.heads_kv / items.split[u].heads;
    DecodeChunk<KV>(d, p, group / groups_per_entry, group % groups_per_entry * items.split[u].heads, items.split[u],
                    local % chunks, WholeVectors(p.d_v), parts + items.first_part[u] + local * items.part_size[u]);
  });
  std::vector<int64_t> first_head(1, 0);
  for (int64_t i = 0; i < count; ++i) first_head.push_back(first_head.back() + problems[i]->batch * problems[i]->heads_kv);
  parallel_for(first_head.back(), [&](int64_t head) {
    const int64_t i = problem_of(first_head, head);
    const auto u = static_cast<size_t>(i);
    const core::AttentionProblem<float>& p = *problems[i];
    const int64_t bh = head - first_head[u], nh = items.split[u].heads, group = bh / nh;
    const int64_t R = p.group() * p.n_q;
    MergeChunks(d, p, bh, items.chunks[u], items.part_size[u],
                parts + items.first_part[u] + group * items.chunks[u] * items.part_size[u], nh * R, bh % nh * R);
  });
}

void DecodeForward(const core::AttentionProblem<float>* const* problems, int64_t count) {
  if (count > 0) WithKVType(*problems[0], [&](auto kv) HWY_ATTR { DecodeForwardT<decltype(kv)>(problems, count); });
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
bool decode_suits(int64_t n_q) { return n_q <= kDecodeMaxQueries; }
bool use_decode(const core::AttentionProblem<float>& p) {
  return !p.weights && !p.logits && p.n_q <= kDecodeMaxQueries && p.n_k > kDecodeChunk;
}
}  // namespace attn::kernels
#endif
