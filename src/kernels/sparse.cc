// Top-k sparse attention: one work item per (problem, batch entry, kv
// head, query row); a paged cache's requests are problems of their own,
// their items one set for all threads. It keeps the row's picked keys (the
// indices other than −1), and runs the prefill's tiles over them for every
// query head of the GQA group: 64 keys at a time gathered (from any page,
// widened from the storage type) and transposed into a panel (Q·Kᵀ by
// MatmulPanel), the group's rows softmaxed in one step (SoftmaxStep, its
// edge cases included), and P·V over the picked values gathered side by
// side. O(topk · d) per row; nothing of size n_k.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/sparse.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/attention-inl.h"
#include "kernels/flash-inl.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/attention_kernel.hpp"
#include "kernels/config.hpp"
#include "kernels/scratch.hpp"
#include "softmax_rules.hpp"
#include "sparse_problem.hpp"
#include "attn/threads.hpp"
#include "thread_pool.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::kernels {
namespace HWY_NAMESPACE {

thread_local Scratch<float> tls_sparse_scores, tls_sparse_sums, tls_sparse_panel, tls_sparse_values, tls_sparse_out,
    tls_sparse_rows;
thread_local Scratch<const float*> tls_sparse_queries;
thread_local Scratch<int32_t> tls_sparse_keys;

// The picked rows of a storage type KV, read for SparseRow (which is
// compiled once, not once per type): tn keys' K rows transposed into the
// panel (zeros past them), and their V rows widened side by side, dvp apart.
struct PickedRows {
  void (*pack_keys)(const core::SparseProblem<float>& p, int64_t b, int64_t hkv, const int32_t* keys, int64_t tn,
                    float* panel);
  void (*gather_values)(const core::SparseProblem<float>& p, int64_t b, int64_t hkv, const int32_t* keys,
                        int64_t tn, int64_t dvp, float* vt);
};

template <class KV>
void PackPickedKeys(const core::SparseProblem<float>& p, int64_t b, int64_t hkv, const int32_t* keys, int64_t tn,
                    float* panel) {
  TransposeRowsAt<KV>([&](int64_t j) HWY_ATTR { return KeyRow<KV>(p, b, hkv, keys[j]); }, tn, p.d, panel);
  PadPanel(tn, p.d, panel);
}

template <class KV>
void GatherPickedValues(const core::SparseProblem<float>& p, int64_t b, int64_t hkv, const int32_t* keys, int64_t tn,
                        int64_t dvp, float* vt) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t j = 0; j < tn; ++j) {
    const KV* row = ValueRow<KV>(p, b, hkv, keys[j]);
    for (int64_t c = 0; c < dvp; c += N) hn::Store(LoadKVUpTo(d, row, c, p.d_v), d, vt + j * dvp + c);
  }
}

// Query row i of batch entry b and kv head hkv, for G of the group's query
// heads from g0 on.
void SparseRow(DF d, const core::SparseProblem<float>& p, const PickedRows& picked, int64_t b, int64_t hkv, int64_t i,
               int64_t g0, int64_t G) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  // A row's scores: whole vectors, as wide as the products write them (its
  // tiles start at multiples of kBlockK, whole blocks of their writes).
  const int64_t TP = PanelColumnsWritten(d, p.topk);
  const float ninf = -std::numeric_limits<float>::infinity();
  // Scores in base-2 units (the softmax's): log2(e) folded into the scale,
  // or into softcap's bound (Softcap takes natural units).
  const float scale = static_cast<float>(p.softcap > 0 ? p.scale : p.scale * 1.4426950408889634);
  // The picked keys, in the indices' order.
  const int32_t* idx = p.indices_row(b, hkv, i);
  int32_t* keys = tls_sparse_keys.get(static_cast<size_t>(std::max<int64_t>(p.topk, 1)));
  int64_t n = 0;
  for (int64_t t = 0; t < p.topk; ++t)
    if (idx[t * p.indices.col_stride] >= 0) keys[n++] = idx[t * p.indices.col_stride];
  float* s = tls_sparse_scores.get(static_cast<size_t>(std::max<int64_t>(G * TP, 1)));
  float* l = tls_sparse_sums.get(static_cast<size_t>(N));
  float* panel = tls_sparse_panel.get(static_cast<size_t>(kBlockK * std::max<int64_t>(p.d, 1)));
  const float** q = tls_sparse_queries.get(static_cast<size_t>(G));
  const int64_t h0 = hkv * p.group() + g0;  // the first query head
  for (int64_t r = 0; r < G; ++r) q[r] = p.q.row(b, h0 + r, i);
  for (int64_t t0 = 0; t0 < n; t0 += kBlockK) {
    const int64_t tn = std::min(kBlockK, n - t0);
    picked.pack_keys(p, b, hkv, keys + t0, tn, panel);
    for (int64_t r0 = 0; r0 < G; r0 += kRows)
      MatmulPanel(d, q + r0, static_cast<int>(std::min<int64_t>(kRows, G - r0)), p.d, panel, scale,
                  s + r0 * TP + t0, TP, Plain(), tn);
  }
  // The group's output rows, aligned (P·V's stores), dvp apart.
  const int64_t dvp = (p.d_v + N - 1) / N * N;
  float* o = tls_sparse_out.get(static_cast<size_t>(std::max<int64_t>(G * dvp, 1)));
  std::fill(o, o + G * dvp, 0.0f);
  float* m = tls_sparse_rows.get(static_cast<size_t>(2 * G));  // per row: its max, then its sum
  float* sum = m + G;
  std::fill(m, m + G, ninf);
  for (int64_t r = 0; r < G; ++r) {
    float* sr = s + r * TP;
    if (p.softcap > 0) Softcap(d, p.softcap, sr, TP);
    std::fill(sr + n, sr + TP, ninf);
    std::fill(l, l + N, 0.0f);
    SoftmaxStep(d, sr, TP, m[r], l);  // sr := 2^(s − m); l: their sums per lane
    double total = 0;
    for (int64_t e = 0; e < N; ++e) total += l[e];
    sum[r] = static_cast<float>(total);
  }
  // O += P · V, the picked values gathered kBlockK at a time.
  float* vt = tls_sparse_values.get(static_cast<size_t>(kBlockK * std::max<int64_t>(dvp, 1)));
  for (int64_t t0 = 0; t0 < n; t0 += kBlockK) {
    const int64_t tn = std::min(kBlockK, n - t0);
    picked.gather_values(p, b, hkv, keys + t0, tn, dvp, vt);
    AccumulateValues(d, G, s + t0, TP, tn, vt, dvp, dvp, o, dvp);
  }
  // Each row: its keys' softmax (running max m, sum) merged with the
  // sink's, a key of value zero (core::merge_lse's rules).
  for (int64_t r = 0; r < G; ++r) {
    const int64_t h = h0 + r;
    const double keys_lse = sum[r] == 0 ? -INFINITY : (double(m[r]) + std::log2(double(sum[r]))) * 0.6931471805599453;
    const auto merged = core::merge_lse<double>(keys_lse, p.sinks.empty() ? -INFINITY : p.sinks[h]);
    const float norm = merged.take_a && sum[r] != 0 ? static_cast<float>(merged.weight_a / sum[r]) : 0.0f;
    float* out = p.out.row(b, h, i);
    for (int64_t c = 0; c < p.d_v; ++c) out[c] = o[r * dvp + c] * norm;
    *p.lse.row(b, h, i) = static_cast<float>(merged.lse);
  }
}

// Items: (problem, batch entry, kv head, query row), and where there are
// fewer rows than threads (a decoding step of few sequences), slices of the
// GQA group of kSparseHeadsPerItem query heads. A slice's rows are whole
// blocks of the micro-kernels' rows, so a head's output is bitwise the same
// sliced or not, at any thread count.
void SparseForward(const core::SparseProblem<float>* const* problems, int64_t count) {
  static_assert(kSparseHeadsPerItem % kRows == 0, "a slice of heads is whole blocks of rows");
  int64_t rows = 0;
  for (int64_t u = 0; u < count; ++u) rows += problems[u]->batch * problems[u]->heads_kv * problems[u]->n_q;
  const bool sliced = rows < num_threads();
  const auto slices = [&](const core::SparseProblem<float>& p) {
    return sliced ? (p.group() + kSparseHeadsPerItem - 1) / kSparseHeadsPerItem : 1;
  };
  const auto heads_per_item = [&](const core::SparseProblem<float>& p) {
    return sliced ? kSparseHeadsPerItem : p.group();
  };
  std::vector<int64_t> first_item(1, 0);  // problem u's items: first_item[u] ..
  double flops = 0;
  for (int64_t u = 0; u < count; ++u) {
    const core::SparseProblem<float>& p = *problems[u];
    const int64_t n = p.batch * p.heads_kv * p.n_q;
    first_item.push_back(first_item.back() + n * slices(p));
    flops += 2.0 * static_cast<double>(n) * static_cast<double>(p.topk) * static_cast<double>((p.d + p.d_v) * p.group());
  }
  if (count == 0) return;
  PickedRows picked{};
  WithKVType(*problems[0], [&](auto kv) HWY_ATTR {
    picked = {&PackPickedKeys<decltype(kv)>, &GatherPickedValues<decltype(kv)>};
  });
  parallel_for(first_item.back(), [&](int64_t item) {
    const auto u = static_cast<size_t>(std::upper_bound(first_item.begin(), first_item.end(), item) - first_item.begin()) - 1;
    const core::SparseProblem<float>& p = *problems[u];
    const int64_t local = item - first_item[u], n = slices(p), row = local / n, g0 = local % n * heads_per_item(p);
    const int64_t i = row % p.n_q, hkv = row / p.n_q % p.heads_kv, b = row / p.n_q / p.heads_kv;
    SparseRow(DF(), p, picked, b, hkv, i, g0, std::min(heads_per_item(p), p.group() - g0));
  }, flops);
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::kernels {
HWY_EXPORT(SparseForward);
void sparse_forward(const std::vector<const core::SparseProblem<float>*>& problems) {
  HWY_DYNAMIC_DISPATCH(SparseForward)(problems.data(), static_cast<int64_t>(problems.size()));
}
}  // namespace attn::kernels
#endif
