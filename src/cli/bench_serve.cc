// The serving benchmarks: decode over pages against a contiguous cache,
// a batch of decodes of many lengths in one call, a mixed batch against its
// parts, and a continuous-batching simulation over a PagedKVCache.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attn/attn.hpp"
#include "cli/bench_common.hpp"
#include "cli/commands.hpp"
#include "companion/machine.hpp"
#include "companion/picture.hpp"

namespace attn::cli {
namespace {

using json = nlohmann::ordered_json;

// Requests' keys and values in one pool of pages (NHD, pages in a shuffled
// order) of the storage type, and the same tokens per request contiguous
// (1, kv_heads, len, D) for the calls attention() makes.
struct Pool {
  int64_t page_size, hkv, d;
  KVDtype dtype;
  std::vector<int64_t> lengths;
  std::vector<int32_t> kv_indptr{0}, kv_indices, last_page_len;
  Tensor<float> k, v;  // (num_pages, page_size, hkv, d)
  std::vector<Tensor<float>> k_seq, v_seq;  // per request (1, hkv, len, d)

  Pool(const std::vector<int64_t>& lens, int64_t page_size_, int64_t hkv_, int64_t d_, const std::string& kv_dtype,
       bool contiguous_copies)
      : page_size(page_size_), hkv(hkv_), d(d_), dtype(parse_kv_dtype(kv_dtype)), lengths(lens) {
    int64_t pages = 0;
    for (int64_t n : lengths) pages += (n + page_size - 1) / page_size;
    std::vector<int32_t> order(static_cast<size_t>(pages));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(7));
    k = random_tensor({pages, page_size, hkv, d}, 2), v = random_tensor({pages, page_size, hkv, d}, 3);
    size_t next = 0;
    for (int64_t n : lengths) {
      const int64_t p = (n + page_size - 1) / page_size;
      for (int64_t i = 0; i < p; ++i) kv_indices.push_back(order[next++]);
      kv_indptr.push_back(static_cast<int32_t>(kv_indices.size()));
      last_page_len.push_back(static_cast<int32_t>(p == 0 ? 0 : n - (p - 1) * page_size));
      if (!contiguous_copies) continue;
      Tensor<float> ks({1, hkv, n, d}), vs({1, hkv, n, d});
      for (int64_t j = 0; j < n; ++j)
        for (int64_t h = 0; h < hkv; ++h) {
          const int64_t page = kv_indices[static_cast<size_t>(kv_indptr[kv_indptr.size() - 2] + j / page_size)];
          std::copy_n(&k.at({page, j % page_size, h, 0}), d, &ks.at({0, h, j, 0}));
          std::copy_n(&v.at({page, j % page_size, h, 0}), d, &vs.at({0, h, j, 0}));
        }
      k_seq.push_back(std::move(ks));
      v_seq.push_back(std::move(vs));
    }
    stored = StoredKV(k, v, dtype, true);
    for (size_t r = 0; r < k_seq.size(); ++r) seq_stored.emplace_back(k_seq[r], v_seq[r], dtype);
  }

  StoredKV stored;
  std::vector<StoredKV> seq_stored;

  double bytes_per_token() const { return 2.0 * double(hkv) * double(kv_dtype_bytes(dtype, d)); }
  double kv_bytes(const std::vector<size_t>& requests) const {
    double tokens = 0;
    for (size_t r : requests) tokens += double(lengths[r]);
    return tokens * bytes_per_token();
  }
  // The plan of some requests (qo_lens[i] queries for requests[i]).
  BatchAttentionPlan plan(const std::vector<size_t>& requests, const std::vector<int64_t>& qo_lens, int64_t heads,
                          const BatchAttentionOptions& options) const {
    std::vector<int32_t> qo{0}, indptr{0}, indices, last;
    for (size_t i = 0; i < requests.size(); ++i) {
      const size_t r = requests[i];
      qo.push_back(qo.back() + static_cast<int32_t>(qo_lens[i]));
      indices.insert(indices.end(), kv_indices.begin() + kv_indptr[r], kv_indices.begin() + kv_indptr[r + 1]);
      indptr.push_back(static_cast<int32_t>(indices.size()));
      last.push_back(last_page_len[r]);
    }
    const auto view = [](const std::vector<int32_t>& x) {
      return TensorView<const int32_t>(x.data(), {static_cast<int64_t>(x.size())});
    };
    return BatchAttentionPlan(view(qo), view(indptr), view(indices), view(last), heads, hkv, d, page_size, options);
  }
  void run(const BatchAttentionPlan& plan, const Tensor<float>& q, Tensor<float>& out) const {
    stored.with([&](auto k_pages, auto v_pages) { plan.run(q.view(), k_pages, v_pages, out.view()); });
  }
  // attention() of q (1, heads, n_q, d) over request r's contiguous copy.
  void attend(size_t r, const Tensor<float>& q, Tensor<float>& out, const AttentionOptions& o,
              const AttentionMasks& masks = {}) const {
    seq_stored[r].with([&](auto k_seq, auto v_seq) {
      AttentionPlan(q.view(), k_seq, v_seq, o, masks).run(out.view());
    });
  }
};

std::vector<int64_t> log_spaced(int64_t n, int64_t lo, int64_t hi) {
  std::vector<int64_t> lens;
  for (int64_t i = 0; i < n; ++i)
    lens.push_back(n == 1 ? hi : std::llround(double(lo) * std::pow(double(hi) / double(lo), double(i) / double(n - 1))));
  return lens;
}

std::vector<size_t> first_n(size_t n) {
  std::vector<size_t> r(n);
  std::iota(r.begin(), r.end(), 0);
  return r;
}

// A draft tree of q tokens at the end of kv_len keys: the prefix is seen by
// all, draft i sees itself and its ancestors (parent (i - 1) / 2).
Tensor<bool> tree_mask(int64_t q, int64_t kv_len) {
  Tensor<bool> m({q, kv_len});
  const int64_t first = kv_len - q;
  for (int64_t i = 0; i < q; ++i) {
    for (int64_t j = 0; j < first; ++j) m.at({i, j}) = true;
    for (int64_t a = i;; a = (a - 1) / 2) {
      m.at({i, first + a}) = true;
      if (a == 0) break;
    }
  }
  return m;
}

void print(const ServeBenchArgs& a, const json& j, const std::string& text) {
  std::fputs(a.json ? (j.dump() + "\n").c_str() : text.c_str(), stdout);
}

int paged_decode(const ServeBenchArgs& a, int threads) {
  const std::vector<int64_t> lens(static_cast<size_t>(a.batch), a.kv_len);
  const Pool pool(lens, a.page_size, a.kv_heads, a.head_dim, a.kv_dtype, true);
  const auto requests = first_n(lens.size());
  const Tensor<float> q = random_tensor({a.batch * a.queries, a.heads, a.head_dim}, 1);
  Tensor<float> out({a.batch * a.queries, a.heads, a.head_dim});
  const Tensor<bool> tree = tree_mask(a.queries, a.kv_len);
  BatchAttentionOptions options;
  std::vector<char> mask_bytes;
  if (a.tree) {
    for (int64_t r = 0; r < a.batch; ++r) mask_bytes.insert(mask_bytes.end(), tree.data(), tree.data() + tree.numel());
    options.custom_mask = TensorView<const bool>(reinterpret_cast<const bool*>(mask_bytes.data()),
                                                 {static_cast<int64_t>(mask_bytes.size())});
  } else {
    options.causal = true;
  }
  const BatchAttentionPlan plan = pool.plan(requests, std::vector<int64_t>(lens.size(), a.queries), a.heads, options);
  const BatchAttentionPlan one = pool.plan(requests, std::vector<int64_t>(lens.size(), 1), a.heads, {});
  Tensor<float> out_one({a.batch, a.heads, a.head_dim});
  const Tensor<float> q_one = random_tensor({a.batch, a.heads, a.head_dim}, 4);
  // The contiguous cache: one attention() per request, q (1, heads, queries, d).
  std::vector<Tensor<float>> qs, outs;
  for (int64_t r = 0; r < a.batch; ++r) qs.push_back(random_tensor({1, a.heads, a.queries, a.head_dim}, 5)),
                                        outs.emplace_back(Shape{1, a.heads, a.queries, a.head_dim});
  AttentionOptions contiguous;
  contiguous.causal = a.tree ? Causal::None : Causal::BottomRight;
  const AttentionMasks masks = a.tree ? AttentionMasks(TensorView<const bool>(tree.view())) : AttentionMasks();
  std::vector<std::function<void()>> kernels{[&] { pool.run(plan, q, out); },
                                             [&] {
                                               for (size_t r = 0; r < requests.size(); ++r)
                                                 pool.attend(r, qs[r], outs[r], contiguous, masks);
                                             }};
  if (a.tree) kernels.push_back([&] { pool.run(one, q_one, out_one); });
  const ReadBandwidth bandwidth;
  const Turns t = run_in_turns(kernels, [&] { return bandwidth.measure_gbps(threads); });
  const double ms = t.kernel_ms[0], gbps = pool.kv_bytes(requests) / ms * 1e-6;
  json j{{"kind", "decode"}, {"kv_len", a.kv_len}, {"heads", a.heads}, {"kv_heads", a.kv_heads},
         {"head_dim", a.head_dim}, {"batch", a.batch}, {"queries", a.queries}, {"kv_dtype", a.kv_dtype},
         {"page_size", a.page_size}, {"tree", a.tree}, {"threads", threads}, {"median_ms", rounded(ms, 4)},
         {"gbps", rounded(gbps, 2)}, {"peak_gbps", rounded(t.ceiling, 2)},
         {"ratio_to_peak", rounded(gbps / t.ceiling, 4)}, {"contiguous_median_ms", rounded(t.kernel_ms[1], 4)},
         {"ratio_to_contiguous", rounded(t.kernel_ms[1] / ms, 4)}};
  char buf[600];
  int len = std::snprintf(buf, sizeof buf,
                          "decode over pages kv_len=%lld heads=%lld kv_heads=%lld head_dim=%lld batch=%lld "
                          "queries=%lld%s kv_dtype=%s page_size=%lld threads=%d\n  median %.3f ms, %.1f GB/s of "
                          "K/V read, read bandwidth %.1f GB/s -> %.1f%% of peak\n  the contiguous cache in the "
                          "same turns: %.3f ms (ratio_to_contiguous %.3f)\n",
                          (long long)a.kv_len, (long long)a.heads, (long long)a.kv_heads, (long long)a.head_dim,
                          (long long)a.batch, (long long)a.queries, a.tree ? " (tree mask)" : "", a.kv_dtype.c_str(),
                          (long long)a.page_size, threads, ms, gbps, t.ceiling, 100 * gbps / t.ceiling,
                          t.kernel_ms[1], t.kernel_ms[1] / ms);
  if (a.tree) {
    j["one_query_median_ms"] = rounded(t.kernel_ms[2], 4);
    j["ratio_to_one_query"] = rounded(ms / t.kernel_ms[2], 4);
    std::snprintf(buf + len, sizeof buf - len, "  one query in the same turns: %.3f ms (ratio_to_one_query %.3f)\n",
                  t.kernel_ms[2], ms / t.kernel_ms[2]);
  }
  print(a, j, buf);
  return 0;
}

int batch_decode(const ServeBenchArgs& a, int threads) {
  const std::vector<int64_t> lens = log_spaced(a.requests, a.min_len, a.max_len);
  const Pool pool(lens, a.page_size, a.kv_heads, a.head_dim, a.kv_dtype, true);
  const auto requests = first_n(lens.size());
  const auto n = static_cast<int64_t>(lens.size());
  const Tensor<float> q = random_tensor({n, a.heads, a.head_dim}, 1);
  Tensor<float> out({n, a.heads, a.head_dim});
  const BatchAttentionPlan plan = pool.plan(requests, std::vector<int64_t>(lens.size(), 1), a.heads, {});
  const Tensor<float> q1 = random_tensor({1, a.heads, 1, a.head_dim}, 2);
  std::vector<Tensor<float>> outs(lens.size(), Tensor<float>({1, a.heads, 1, a.head_dim}));
  const size_t longest = static_cast<size_t>(std::max_element(lens.begin(), lens.end()) - lens.begin());
  Tensor<float> out_single({1, a.heads, 1, a.head_dim});
  const std::vector<std::function<void()>> kernels{
      [&] { pool.run(plan, q, out); },
      [&] {
        for (size_t r = 0; r < lens.size(); ++r) pool.attend(r, q1, outs[r], {});
      },
      [&] { pool.attend(longest, q1, out_single, {}); }};
  const ReadBandwidth bandwidth;
  const Turns t = run_in_turns(kernels, [&] { return bandwidth.measure_gbps(threads); });
  const double bw = t.ceiling, ms = t.kernel_ms[0];
  const double ratio = pool.kv_bytes(requests) / ms * 1e-6 / bw;
  const double single = pool.kv_bytes({longest}) / t.kernel_ms[2] * 1e-6 / bw;
  const json j{{"kind", "batch-decode"}, {"requests", a.requests}, {"min_len", a.min_len}, {"max_len", a.max_len},
               {"heads", a.heads}, {"kv_heads", a.kv_heads}, {"head_dim", a.head_dim}, {"kv_dtype", a.kv_dtype},
               {"page_size", a.page_size}, {"threads", threads}, {"median_ms", rounded(ms, 4)},
               {"peak_gbps", rounded(bw, 2)}, {"ratio_to_peak", rounded(ratio, 4)},
               {"single_median_ms", rounded(t.kernel_ms[2], 4)}, {"ratio_to_single", rounded(ratio / single, 4)},
               {"separate_median_ms", rounded(t.kernel_ms[1], 4)},
               {"speedup_vs_separate", rounded(t.kernel_ms[1] / ms, 4)}};
  char buf[600];
  std::snprintf(buf, sizeof buf,
                "batch-decode requests=%lld lengths %lld..%lld (log-spaced) heads=%lld kv_heads=%lld head_dim=%lld "
                "kv_dtype=%s page_size=%lld threads=%d\n  one call %.3f ms: %.1f%% of the read bandwidth (%.1f GB/s); "
                "a single %lld-token decode %.1f%% (ratio_to_single %.3f)\n  %lld separate calls %.3f ms "
                "(speedup_vs_separate %.3f)\n",
                (long long)a.requests, (long long)a.min_len, (long long)a.max_len, (long long)a.heads,
                (long long)a.kv_heads, (long long)a.head_dim, a.kv_dtype.c_str(), (long long)a.page_size, threads, ms,
                100 * ratio, bw, (long long)lens[longest], 100 * single, ratio / single, (long long)a.requests,
                t.kernel_ms[1], t.kernel_ms[1] / ms);
  print(a, j, buf);
  return 0;
}

int mixed(const ServeBenchArgs& a, int threads) {
  // A prefill (2048 tokens), decodes log-spaced over --min-len..--max-len
  // (31 over 100..32768), and 8 draft tokens verified at 8192 (or
  // --max-len, if less): the first request alone, the others as the decode
  // part.
  std::vector<int64_t> lens{a.prefill_len};
  for (int64_t n : log_spaced(a.requests, a.min_len, a.max_len)) lens.push_back(n);
  lens.push_back(std::min<int64_t>(8192, a.max_len));
  std::vector<int64_t> qo(lens.size(), 1);
  qo.front() = a.prefill_len, qo.back() = std::min<int64_t>(8, lens.back());
  const Pool pool(lens, a.page_size, a.kv_heads, a.head_dim, a.kv_dtype, false);
  BatchAttentionOptions causal;
  causal.causal = true;
  std::vector<size_t> all = first_n(lens.size()), decodes(all.begin() + 1, all.end());
  const BatchAttentionPlan whole = pool.plan(all, qo, a.heads, causal);
  const BatchAttentionPlan prefill = pool.plan({0}, {qo.front()}, a.heads, causal);
  const BatchAttentionPlan decode = pool.plan(decodes, std::vector<int64_t>(qo.begin() + 1, qo.end()), a.heads, causal);
  const int64_t nnz = std::accumulate(qo.begin(), qo.end(), int64_t{0});
  const Tensor<float> q = random_tensor({nnz, a.heads, a.head_dim}, 1);
  Tensor<float> out({nnz, a.heads, a.head_dim});
  const TensorView<const float> q_prefill(q.data(), {qo.front(), a.heads, a.head_dim});
  const TensorView<const float> q_decode(q.data() + qo.front() * a.heads * a.head_dim, {nnz - qo.front(), a.heads, a.head_dim});
  Tensor<float> out_prefill({qo.front(), a.heads, a.head_dim}), out_decode({nnz - qo.front(), a.heads, a.head_dim});
  const auto run = [&](const BatchAttentionPlan& p, TensorView<const float> qv, Tensor<float>& o) {
    pool.stored.with([&](auto k, auto v) { p.run(qv, k, v, o.view()); });
  };
  const std::vector<std::function<void()>> kernels{[&] { run(whole, q.view(), out); },
                                                   [&] { run(prefill, q_prefill, out_prefill); },
                                                   [&] { run(decode, q_decode, out_decode); }};
  const Turns t = run_in_turns(kernels, [] { return 0.0; });
  const double parts = t.kernel_ms[1] + t.kernel_ms[2];
  const json j{{"kind", "mixed"}, {"prefill_len", a.prefill_len}, {"requests", a.requests}, {"min_len", a.min_len},
               {"max_len", a.max_len}, {"heads", a.heads}, {"kv_heads", a.kv_heads}, {"head_dim", a.head_dim},
               {"kv_dtype", a.kv_dtype}, {"page_size", a.page_size}, {"threads", threads},
               {"median_ms", rounded(t.kernel_ms[0], 4)}, {"prefill_median_ms", rounded(t.kernel_ms[1], 4)},
               {"decode_median_ms", rounded(t.kernel_ms[2], 4)}, {"ratio_to_parts", rounded(t.kernel_ms[0] / parts, 4)}};
  char buf[500];
  std::snprintf(buf, sizeof buf,
                "mixed: a %lld-token prefill, %lld decodes (%lld..%lld keys), %lld drafts at %lld; heads=%lld "
                "kv_heads=%lld head_dim=%lld kv_dtype=%s threads=%d\n  one call %.3f ms; the prefill alone %.3f ms "
                "+ the decode part alone %.3f ms (ratio_to_parts %.3f)\n",
                (long long)a.prefill_len, (long long)a.requests, (long long)a.min_len, (long long)a.max_len,
                (long long)qo.back(), (long long)lens.back(), (long long)a.heads, (long long)a.kv_heads, (long long)a.head_dim, a.kv_dtype.c_str(), threads,
                t.kernel_ms[0], t.kernel_ms[1], t.kernel_ms[2], t.kernel_ms[0] / parts);
  print(a, j, buf);
  return 0;
}

// Continuous batching from a seed: requests arrive over the steps with
// log-uniform prompts and uniform output lengths; each step decodes one
// token of every request past its prompt and prefills prompt chunks within
// the token budget; a finished request's pages are freed.
int serve(const ServeBenchArgs& a, int threads) {
  struct Request {
    int64_t arrival, prompt, output, done = 0;  // done: tokens in the cache
    int64_t id = -1;
  };
  std::mt19937_64 rng(a.seed);
  std::vector<Request> reqs;
  double clock = 0;
  for (int64_t i = 0; i < a.requests; ++i) {
    clock += std::exponential_distribution<double>(1.0 / a.arrival_every)(rng);
    const double lo = std::log(double(a.min_len)), hi = std::log(double(a.max_len));
    const auto prompt = std::llround(std::exp(std::uniform_real_distribution<double>(lo, hi)(rng)));
    const auto output = std::uniform_int_distribution<int64_t>(a.min_output, a.max_output)(rng);
    reqs.push_back({static_cast<int64_t>(clock), prompt, output});
  }
  int64_t pages = 0;
  for (const Request& r : reqs) pages += (r.prompt + r.output + a.page_size - 1) / a.page_size;
  PagedKVCache cache(pages, a.page_size, a.kv_heads, a.head_dim, a.head_dim, parse_kv_dtype(a.kv_dtype));
  BatchAttentionOptions causal;
  causal.causal = true;
  std::vector<double> step_ms;
  std::vector<std::vector<double>> held;  // per step, pages per request
  int64_t tokens = 0, kv_peak = 0;
  double contiguous_peak = 0;
  using Clock = std::chrono::steady_clock;
  for (int64_t step = 0;; ++step) {
    bool pending = false;
    for (const Request& r : reqs) pending = pending || r.done < r.prompt + r.output;
    if (!pending) break;
    std::vector<int64_t> ids, counts;
    int64_t budget = a.token_budget;
    // Decodes first (every request past its prompt), then prefill chunks in arrival order.
    for (int pass = 0; pass < 2; ++pass)
      for (Request& r : reqs) {
        if (r.arrival > step || r.done >= r.prompt + r.output) continue;
        const bool decoding = r.done >= r.prompt;
        if (decoding != (pass == 0) || budget == 0) continue;
        if (r.id < 0) r.id = cache.add_sequence();
        const int64_t n = decoding ? 1 : std::min(budget, r.prompt - r.done);
        ids.push_back(r.id), counts.push_back(n), budget -= n;
      }
    if (ids.empty()) continue;  // nothing has arrived yet
    std::vector<int64_t> cu{0};
    for (int64_t n : counts) cu.push_back(cu.back() + n);
    const int64_t nnz = cu.back();
    const Tensor<float> k = random_tensor({nnz, a.kv_heads, a.head_dim}, static_cast<uint32_t>(step)),
                        q = random_tensor({nnz, a.heads, a.head_dim}, static_cast<uint32_t>(step) + 1);
    Tensor<int64_t> cu_t({static_cast<int64_t>(cu.size())});
    std::copy(cu.begin(), cu.end(), cu_t.data());
    std::vector<int32_t> qo(cu.begin(), cu.end());
    const auto t0 = Clock::now();
    cache.append(ids, k.view(), k.view(), cu_t.view());
    batch_attention(q.view(), TensorView<const int32_t>(qo.data(), {static_cast<int64_t>(qo.size())}), cache, ids, causal);
    step_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    tokens += nnz;
    double contiguous = 0;
    std::vector<double> row(reqs.size(), 0.0);
    for (size_t i = 0; i < reqs.size(); ++i) {
      Request& r = reqs[i];
      for (size_t s = 0; s < ids.size(); ++s)
        if (ids[s] == r.id) r.done += counts[s];
      if (r.id < 0) continue;
      if (r.done >= r.prompt + r.output) {
        cache.remove(r.id);
        r.id = -2;  // finished
        continue;
      }
      contiguous += double(r.prompt + r.output);
      row[i] = double((r.done + a.page_size - 1) / a.page_size);
    }
    kv_peak = std::max(kv_peak, cache.nbytes());
    contiguous_peak = std::max(contiguous_peak, contiguous);
    held.push_back(row);
  }
  const double bytes_per_token = 2.0 * double(a.kv_heads) * double(kv_dtype_bytes(parse_kv_dtype(a.kv_dtype), a.head_dim));
  const double total_ms = std::accumulate(step_ms.begin(), step_ms.end(), 0.0);
  std::vector<double> sorted = step_ms;
  std::sort(sorted.begin(), sorted.end());
  const auto pct = [&](double p) { return sorted[std::min(sorted.size() - 1, size_t(p * double(sorted.size())))]; };
  const json j{{"kind", "serve"}, {"requests", a.requests}, {"seed", a.seed}, {"heads", a.heads},
               {"kv_heads", a.kv_heads}, {"head_dim", a.head_dim}, {"kv_dtype", a.kv_dtype},
               {"page_size", a.page_size}, {"token_budget", a.token_budget}, {"threads", threads},
               {"steps", step_ms.size()}, {"tokens", tokens}, {"tokens_per_s", rounded(double(tokens) / total_ms * 1e3, 1)},
               {"p50_ms", rounded(pct(0.5), 4)}, {"p99_ms", rounded(pct(0.99), 4)}, {"kv_bytes", kv_peak},
               {"kv_bytes_contiguous", static_cast<int64_t>(contiguous_peak * bytes_per_token)}};
  if (!a.out.empty()) {
    // Pages each request holds, request by step.
    HeatMap map{"pages held per request", Tensor<double>({a.requests, static_cast<int64_t>(held.size())}), {}, {},
                "request", "step"};
    for (size_t s = 0; s < held.size(); ++s)
      for (size_t r = 0; r < reqs.size(); ++r) map.values.at({static_cast<int64_t>(r), static_cast<int64_t>(s)}) = held[s][r];
    PictureOptions options;
    options.scale_title = "pages";
    write_picture(a.out, {map}, options);
  }
  char buf[600];
  std::snprintf(buf, sizeof buf,
                "serve requests=%lld seed=%llu heads=%lld kv_heads=%lld head_dim=%lld kv_dtype=%s page_size=%lld "
                "token_budget=%lld threads=%d\n  %zu steps, %lld tokens: %.0f attention tokens/s; step p50 %.3f ms, "
                "p99 %.3f ms\n  KV bytes at the peak %lld, against %lld for contiguous caches sized for each "
                "request's maximum\n",
                (long long)a.requests, (unsigned long long)a.seed, (long long)a.heads, (long long)a.kv_heads,
                (long long)a.head_dim, a.kv_dtype.c_str(), (long long)a.page_size, (long long)a.token_budget, threads,
                step_ms.size(), (long long)tokens, double(tokens) / total_ms * 1e3, pct(0.5), pct(0.99),
                (long long)kv_peak, (long long)(contiguous_peak * bytes_per_token));
  print(a, j, buf);
  return 0;
}

}  // namespace

int run_serve_bench(const ServeBenchArgs& a) {
  if (a.threads > 0) set_num_threads(a.threads);
  const int threads = num_threads();
  if (a.kind == "decode") return paged_decode(a, threads);
  if (a.kind == "batch-decode") return batch_decode(a, threads);
  if (a.kind == "mixed") return mixed(a, threads);
  return serve(a, threads);
}

}  // namespace attn::cli
