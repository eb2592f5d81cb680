// `attn bench`: time the kernels and compare them with this machine's
// ceilings, measured in the same process at the same thread count.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "attn/half.hpp"
#include "attn/machine.hpp"
#include "attn/threads.hpp"
#include "cli/commands.hpp"

namespace attn::cli {
namespace {

Tensor<float> random_tensor(const Shape& shape, uint32_t seed) {
  Tensor<float> t(shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = u(rng);
  return t;
}

double median(std::vector<double> x) {
  std::nth_element(x.begin(), x.begin() + x.size() / 2, x.end());
  return x[x.size() / 2];  // the upper middle one of an even count
}

struct Turns {
  std::vector<double> kernel_ms;  // median ms of one call of each kernel
  double ceiling;                 // median of the ceiling's measurements
};

// Runs the kernels and a ceiling measurement in turns, so that a slow spell of
// this shared machine hits them alike. A turn repeats a fast kernel for about
// 20 ms (so that a small kernel runs hot, as in a loop, not right after the
// ceiling's work); at least 3 turns and about a second in all, after a
// warm-up call of each and a second call of each kernel to size its turn.
Turns run_in_turns(const std::vector<std::function<void()>>& kernels,
                   const std::function<double()>& ceiling) {
  using Clock = std::chrono::steady_clock;
  const auto ms_since = [](Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  };
  ceiling();
  std::vector<int> reps;
  for (const auto& kernel : kernels) {
    kernel();
    const auto t0 = Clock::now();
    kernel();
    reps.push_back(static_cast<int>(std::clamp(20.0 / std::max(ms_since(t0), 1e-3), 1.0, 1000.0)));
  }
  std::vector<std::vector<double>> ms(kernels.size());
  std::vector<double> ceilings;
  const auto start = Clock::now();
  while (ceilings.size() < 3 || (ceilings.size() < 50 && ms_since(start) < 1000)) {
    for (size_t i = 0; i < kernels.size(); ++i) {
      const auto t0 = Clock::now();
      for (int r = 0; r < reps[i]; ++r) kernels[i]();
      ms[i].push_back(ms_since(t0) / reps[i]);
    }
    ceilings.push_back(ceiling());
  }
  Turns t{{}, median(ceilings)};
  for (const auto& m : ms) t.kernel_ms.push_back(median(m));
  return t;
}

template <class H>
Tensor<H> to_16bit(const Tensor<float>& t, uint16_t (*to_bits)(float)) {
  Tensor<H> out(t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) out[i].bits = to_bits(t[i]);
  return out;
}

// attention() with keys and values stored as `kv_dtype` (f32, bf16 or f16).
struct Attend {
  const Tensor<float>& q;
  Tensor<float> k, v;
  Tensor<bfloat16> kb, vb;
  Tensor<float16> kh, vh;
  std::string dtype;

  Attend(const Tensor<float>& q_, Tensor<float> k_, Tensor<float> v_, std::string kv_dtype)
      : q(q_), k(std::move(k_)), v(std::move(v_)), dtype(std::move(kv_dtype)) {
    if (dtype == "bf16") kb = to_16bit<bfloat16>(k, float_to_bf16), vb = to_16bit<bfloat16>(v, float_to_bf16);
    if (dtype == "f16") kh = to_16bit<float16>(k, float_to_fp16), vh = to_16bit<float16>(v, float_to_fp16);
  }
  int element_bytes() const { return dtype == "f32" ? 4 : 2; }
  // as_f32: with the float32 copies of K and V whatever the dtype.
  void operator()(Tensor<float>& out, const AttentionOptions& opt, bool as_f32 = false) const {
    if (dtype == "bf16" && !as_f32) attention(q.view(), kb.view(), vb.view(), out.view(), opt);
    else if (dtype == "f16" && !as_f32) attention(q.view(), kh.view(), vh.view(), out.view(), opt);
    else attention(q.view(), k.view(), v.view(), out.view(), opt);
  }

  // In turns with the ceiling: this kernel, then the baselines of the same
  // turns that its targets compare with: float32 K/V for a 16-bit dtype, the
  // non-causal kernel for a causal one. JSON members and text for them.
  struct Timing {
    Turns turns;
    std::string json, text;
  };
  Timing time(Tensor<float>& out, const AttentionOptions& opt, const std::function<double()>& ceiling) const {
    std::vector<std::function<void()>> kernels{[&] { (*this)(out, opt); }};
    if (dtype != "f32") kernels.push_back([&] { (*this)(out, opt, true); });
    const bool causal = opt.causal != Causal::None;
    if (causal) kernels.push_back([&] { (*this)(out, {}); });
    Timing t{run_in_turns(kernels, ceiling), "", ""};
    const std::vector<double>& ms = t.turns.kernel_ms;
    char buf[160];
    size_t i = 1;
    if (dtype != "f32") {
      std::snprintf(buf, sizeof buf, ", \"f32_median_ms\": %.4f, \"speedup_vs_f32\": %.4f", ms[i], ms[i] / ms[0]);
      t.json += buf;
      std::snprintf(buf, sizeof buf, "  float32 K/V in the same turns: %.3f ms (this is %.2fx as fast)\n", ms[i],
                    ms[i] / ms[0]);
      t.text += buf;
      ++i;
    }
    if (causal) {
      std::snprintf(buf, sizeof buf, ", \"noncausal_median_ms\": %.4f, \"time_vs_noncausal\": %.4f", ms[i],
                    ms[0] / ms[i]);
      t.json += buf;
      std::snprintf(buf, sizeof buf, "  non-causal in the same turns: %.3f ms (this takes %.2fx its time)\n", ms[i],
                    ms[0] / ms[i]);
      t.text += buf;
    }
    return t;
  }
};

}  // namespace

int run_bench(const BenchArgs& a) {
  if (a.threads > 0) set_num_threads(a.threads);
  const int threads = num_threads();
  const int64_t hkv = a.kv_heads > 0 ? a.kv_heads : a.heads;
  if (a.kind == "attention") {
    const Shape qs{a.batch, a.heads, a.n, a.head_dim}, ks{a.batch, hkv, a.n, a.head_dim};
    const auto q = random_tensor(qs, 1);
    const Attend attend(q, random_tensor(ks, 2), random_tensor(ks, 3), a.kv_dtype);
    Tensor<float> out(qs);
    const AttentionOptions& opt = a.attention;
    const bool causal = opt.causal != Causal::None;
    const auto timing = attend.time(out, opt, [&] { return measure_fma_peak_gflops(threads); });
    const double ms = timing.turns.kernel_ms[0], peak = timing.turns.ceiling;
    const double pairs = causal ? a.n * (a.n + 1) / 2.0 : double(a.n) * a.n;
    const double flop = 4.0 * double(a.n) * a.n * a.head_dim * a.heads * a.batch;
    const double flop_unmasked = 4.0 * pairs * a.head_dim * a.heads * a.batch;
    const double gflops = flop / ms * 1e-6, gflops_unmasked = flop_unmasked / ms * 1e-6;
    const double ratio = (causal ? gflops_unmasked : gflops) / peak;
    if (a.json) {
      std::printf("{\"kind\": \"attention\", \"n\": %lld, \"heads\": %lld, \"kv_heads\": %lld, "
                  "\"head_dim\": %lld, \"batch\": %lld, \"causal\": %s, \"kv_dtype\": \"%s\", "
                  "\"threads\": %d, \"median_ms\": %.4f, \"gflops\": %.2f, \"gflops_unmasked\": %.2f, "
                  "\"peak_gflops\": %.2f, \"ratio_to_peak\": %.4f%s}\n",
                  (long long)a.n, (long long)a.heads, (long long)hkv, (long long)a.head_dim,
                  (long long)a.batch, causal ? "true" : "false", a.kv_dtype.c_str(), threads, ms, gflops,
                  gflops_unmasked, peak, ratio, timing.json.c_str());
    } else {
      std::printf("attention n=%lld heads=%lld kv_heads=%lld head_dim=%lld batch=%lld causal=%s "
                  "kv_dtype=%s threads=%d\n  median %.3f ms, %.1f GFLOP/s (4·n²·d·H)%s, FMA peak %.1f GFLOP/s "
                  "-> %.1f%% of peak\n",
                  (long long)a.n, (long long)a.heads, (long long)hkv, (long long)a.head_dim,
                  (long long)a.batch, causal ? "yes" : "no", a.kv_dtype.c_str(), threads, ms, gflops,
                  causal ? (", " + std::to_string(int(gflops_unmasked)) +
                              " GFLOP/s on unmasked pairs").c_str()
                           : "",
                  peak, 100 * ratio);
      std::fputs(timing.text.c_str(), stdout);
    }
    return 0;
  }
  // decode: a few queries against a long key/value cache
  const Shape qs{a.batch, a.heads, a.queries, a.head_dim}, ks{a.batch, hkv, a.kv_len, a.head_dim};
  const auto q = random_tensor(qs, 1);
  const Attend attend(q, random_tensor(ks, 2), random_tensor(ks, 3), a.kv_dtype);
  Tensor<float> out(qs);
  const ReadBandwidth bandwidth;
  const auto timing = attend.time(out, {}, [&] { return bandwidth.measure_gbps(threads); });
  const double ms = timing.turns.kernel_ms[0], peak = timing.turns.ceiling;
  const double bytes = 2.0 * attend.k.numel() * attend.element_bytes();
  const double gbps = bytes / ms * 1e-6;
  if (a.json) {
    std::printf("{\"kind\": \"decode\", \"kv_len\": %lld, \"heads\": %lld, \"kv_heads\": %lld, "
                "\"head_dim\": %lld, \"batch\": %lld, \"queries\": %lld, \"kv_dtype\": \"%s\", "
                "\"threads\": %d, \"median_ms\": %.4f, \"gbps\": %.2f, \"peak_gbps\": %.2f, "
                "\"ratio_to_peak\": %.4f%s}\n",
                (long long)a.kv_len, (long long)a.heads, (long long)hkv, (long long)a.head_dim,
                (long long)a.batch, (long long)a.queries, a.kv_dtype.c_str(), threads, ms, gbps, peak,
                gbps / peak, timing.json.c_str());
  } else {
    std::printf("decode kv_len=%lld heads=%lld kv_heads=%lld head_dim=%lld batch=%lld queries=%lld "
                "kv_dtype=%s threads=%d\n  median %.3f ms, %.1f GB/s of K/V read, read bandwidth %.1f GB/s "
                "-> %.1f%% of peak\n",
                (long long)a.kv_len, (long long)a.heads, (long long)hkv, (long long)a.head_dim,
                (long long)a.batch, (long long)a.queries, a.kv_dtype.c_str(), threads, ms, gbps, peak,
                100 * gbps / peak);
    std::fputs(timing.text.c_str(), stdout);
  }
  return 0;
}

}  // namespace attn::cli
