// attn bench mla and sparse: the attention of 2026's models, DeepSeek's
// shapes, each against the FMA peak measured in the same turns.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>

#include "attn/attn.hpp"
#include "cli/bench_common.hpp"
#include "companion/machine.hpp"

namespace attn::cli {

// mla: one decode step of absorbed multi-head latent attention over a latent
// cache of DeepSeek-V3's shape (rows [c (512) | k_pe (64)], read in place),
// against the FMA peak: the decode kernel computes in float32 whatever the
// cache's storage. FLOPs = 2 · H · n_k · (576 + 512) per query.
Measurement bench_mla(const BenchArgs& a, int threads) {
  constexpr int64_t r = 512, p = 64;
  const Tensor<float> cache = random_tensor({a.kv_len, r + p}, 2);
  const Tensor<float> q_nope = random_tensor({a.queries, a.heads, r}, 1), q_pe = random_tensor({a.queries, a.heads, p}, 3);
  const double scale = 1.0 / std::sqrt(192.0);
  const auto run_on = [&](auto stored) {
    using KV = std::remove_const_t<std::remove_reference_t<decltype(*stored.data())>>;
    const TensorView<const KV> rows = stored.view();
    const TensorView<const KV> ckv(rows.data(), {a.kv_len, r}, {r + p, 1}), kpe(rows.data() + r, {a.kv_len, p}, {r + p, 1});
    return run_in_turns({[&] { latent_attention<float, KV>(q_nope.view(), q_pe.view(), ckv, kpe, scale, true); }},
                        [&] { return measure_fma_peak_gflops(threads); });
  };
  const Turns t = a.kv_dtype == "bf16"  ? run_on(to_bfloat16(cache.view()))
                  : a.kv_dtype == "f16" ? run_on(to_float16(cache.view()))
                                        : run_on(Tensor<float>(cache));
  const double ms = t.kernel_ms[0], peak = t.ceiling;
  const double gflops = 2.0 * double(a.heads) * double(a.queries) * double(a.kv_len) * double(r + p + r) / ms * 1e-6;
  const std::string unit = precision_unit(Precision::Float32);
  Measurement m{{{"kind", "mla"}, {"kv_len", a.kv_len}, {"heads", a.heads}, {"queries", a.queries},
                 {"kv_lora_rank", r}, {"qk_rope_head_dim", p}, {"kv_dtype", a.kv_dtype}, {"threads", threads},
                 {"unit", unit}, {"median_ms", rounded(ms, 4)}, {"gflops", rounded(gflops, 2)},
                 {"peak_gflops", rounded(peak, 2)}, {"ratio_to_peak", rounded(gflops / peak, 4)}},
                "", ms, gflops, gflops / peak};
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "mla (absorbed) kv_len=%lld heads=%lld queries=%lld latent %lld + rope %lld kv_dtype=%s threads=%d\n"
                "  median %.3f ms, %.1f GFLOP/s (2·H·kv_len·(576 + 512)) on %s, FMA peak %.1f GFLOP/s -> %.1f%% "
                "of peak\n",
                (long long)a.kv_len, (long long)a.heads, (long long)a.queries, (long long)r, (long long)p,
                a.kv_dtype.c_str(), threads, ms, gflops, unit.c_str(), peak, 100 * gflops / peak);
  m.text = buf;
  return m;
}

// sparse: DeepSeek-V3.2's sparse attention (DSA) at decode: `queries` rows
// (a batch's tokens), each with its own topk picks among kv_len latent rows
// (MQA over [c (512) | k_pe (64)], values c, as MLA's absorbed form). In the
// same turns: the same call with topk keys in all (every key picked), whose
// time the first should match if the cost grows with topk and not kv_len;
// and dense attention over all kv_len keys.
// FLOPs = 2 · H · queries · topk · (576 + 512).
Measurement bench_sparse(const BenchArgs& a, int threads) {
  constexpr int64_t r = 512, p = 64;
  const int64_t H = a.heads, n_q = a.queries, topk = std::min(a.topk, a.kv_len);
  const Tensor<float> rows = random_tensor({1, a.kv_len, r + p}, 2), q = random_tensor({H, n_q, r + p}, 1);
  const auto values = [](const Tensor<float>& keys) {  // c: the first r columns of the same rows
    return TensorView<const float>(keys.data(), {1, keys.dim(1), r}, {0, r + p, 1});
  };
  // Each row's picks: topk distinct positions below n (seeded), or all of 0 .. topk - 1.
  const auto picks = [&](int64_t n) {
    Tensor<int32_t> idx({1, n_q, topk});
    std::mt19937 rng(7);
    std::vector<int32_t> all(static_cast<size_t>(n));
    for (int64_t i = 0; i < n_q; ++i) {
      std::iota(all.begin(), all.end(), 0);
      for (int64_t t = 0; t < topk; ++t)
        std::swap(all[static_cast<size_t>(t)], all[static_cast<size_t>(t + std::uniform_int_distribution<int64_t>(0, n - 1 - t)(rng))]);
      std::copy_n(all.begin(), topk, idx.data() + i * topk);
    }
    return idx;
  };
  const Tensor<int32_t> far = picks(a.kv_len), near = picks(topk);
  Tensor<float> short_rows({1, topk, r + p});
  std::copy_n(rows.data(), short_rows.numel(), short_rows.data());
  SparseAttentionOptions opt;
  opt.scale = 1.0 / std::sqrt(192.0);
  AttentionOptions dense_opt;
  dense_opt.scale = opt.scale;
  std::vector<std::function<void()>> kernels{
      [&] { sparse_attention<float>(q.view(), rows.view(), values(rows), far.view(), opt); },
      [&] { sparse_attention<float>(q.view(), short_rows.view(), values(short_rows), near.view(), opt); },
      [&] { attention<float, float>(q.view(), rows.view(), values(rows), dense_opt); }};
  const Turns t = run_in_turns(kernels, [&] { return measure_fma_peak_gflops(threads); });
  const double ms = t.kernel_ms[0], near_ms = t.kernel_ms[1], peak = t.ceiling;
  const double gflops = 2.0 * double(H) * double(n_q) * double(topk) * double(r + p + r) / ms * 1e-6;
  Measurement m{{{"kind", "sparse"}, {"kv_len", a.kv_len}, {"topk", topk}, {"heads", H}, {"queries", n_q},
                 {"head_dim", r + p}, {"value_head_dim", r}, {"threads", threads}, {"median_ms", rounded(ms, 4)},
                 {"gflops", rounded(gflops, 2)}, {"peak_gflops", rounded(peak, 2)},
                 {"ratio_to_peak", rounded(gflops / peak, 4)}, {"topk_keys_median_ms", rounded(near_ms, 4)},
                 {"time_vs_topk_keys", rounded(ms / near_ms, 4)}},
                "", ms, gflops, gflops / peak};
  char buf[600];
  std::snprintf(buf, sizeof buf,
                "sparse (DSA: MQA over latent rows 512 + 64) kv_len=%lld topk=%lld heads=%lld queries=%lld "
                "threads=%d\n  median %.3f ms, %.1f GFLOP/s (2·H·queries·topk·(576 + 512)), FMA peak %.1f "
                "GFLOP/s -> %.1f%% of peak\n  the same call over %lld keys, all picked: %.3f ms (kv_len costs "
                "%.2fx)\n",
                (long long)a.kv_len, (long long)topk, (long long)H, (long long)n_q, threads, ms, gflops, peak,
                100 * gflops / peak, (long long)topk, near_ms, ms / near_ms);
  m.text = buf;
  const double dense = t.kernel_ms[2];
  m.json["dense_median_ms"] = rounded(dense, 4);
  m.json["speedup_vs_dense"] = rounded(dense / ms, 4);
  std::snprintf(buf, sizeof buf, "  dense attention over all %lld keys: %.3f ms (sparse is %.1fx as fast)\n",
                (long long)a.kv_len, dense, dense / ms);
  m.text += buf;
  return m;
}

}  // namespace attn::cli
