// `attn bench`: time the kernels and compare them with this machine's
// ceilings, measured in the same process at the same thread count.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "attn/attn.hpp"
#include "attn/quantize.hpp"
#include "companion/machine.hpp"
#include "attn/threads.hpp"
#include "cli/bench_common.hpp"
#include "cli/commands.hpp"

namespace attn::cli {
namespace {

// attention() with keys and values stored as `kv_dtype` (f32, bf16, f16,
// q8_0, q4_0 or int4), converted from the same float32 K and V.
struct Attend {
  const Tensor<float>& q;
  Tensor<float> k, v;
  KVDtype dtype;
  StoredKV stored;  // (points at k and v: Attend is neither copied nor moved)

  Attend(const Tensor<float>& q_, Tensor<float> k_, Tensor<float> v_, const std::string& kv_dtype)
      : q(q_), k(std::move(k_)), v(std::move(v_)), dtype(parse_kv_dtype(kv_dtype)), stored(k, v, dtype) {}
  Attend(const Attend&) = delete;
  Attend& operator=(const Attend&) = delete;
  double kv_bytes() const { return stored.bytes(); }
  // f(K, V): views in their storage (as_f32: the float32 ones whatever the
  // dtype).
  template <class F>
  void with_kv(const F& f, bool as_f32 = false) const {
    stored.with(f, as_f32);
  }
  void operator()(Tensor<float>& out, const AttentionOptions& opt, bool as_f32 = false,
                  const AttentionExtras<float>& extras = {}) const {
    with_kv([&](const auto& ks, const auto& vs) { AttentionPlan(q.view(), ks, vs, opt).run(out.view(), extras); },
            as_f32);
  }
  // ||out - ref|| / ||ref|| (Frobenius) of this dtype's output against the
  // double-precision reference on the same (float32) inputs.
  double error_vs_f64(const AttentionOptions& opt) const {
    Tensor<float> out(attention_output_shape(q.shape(), k.shape(), v.shape()));
    (*this)(out, opt);
    const auto widened = [](const Tensor<float>& t) {
      Tensor<double> w(t.shape());
      std::copy(t.data(), t.data() + t.numel(), w.data());
      return w;
    };
    AttentionOptions exact = opt;
    exact.precision = Precision::Float32;  // (float64 has one precision)
    const Tensor<double> ref = attention(widened(q).view(), widened(k).view(), widened(v).view(), exact);
    double num = 0, den = 0;
    for (int64_t i = 0; i < ref.numel(); ++i) {
      num += (out[i] - ref[i]) * (out[i] - ref[i]);
      den += ref[i] * ref[i];
    }
    return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  }

  // In turns with the ceiling: this kernel, then (with `baselines`) those of
  // the same turns that its targets compare with: float32 K/V for a compact
  // dtype, the non-causal kernel for a causal one. JSON members and text for
  // them.
  struct Timing {
    Turns turns;
    nlohmann::ordered_json json;
    std::string text;
  };
  Timing time(Tensor<float>& out, const AttentionOptions& opt, bool baselines,
              const std::function<double()>& ceiling) const {
    const bool vs_f32 = baselines && dtype != KVDtype::F32;
    // The same call without one of its options, in the same turns: the
    // causal mask, ALiBi, the sinks (JSON names and the words for each).
    struct Without {
      const char *key, *words;
      int digits;
      AttentionOptions options;
    };
    std::vector<Without> without;
    if (baselines && opt.causal != Causal::None) {  // (in the same precision)
      without.push_back({"noncausal", "non-causal", 2, {}});
      without.back().options.precision = opt.precision;
    }
    if (baselines && !opt.alibi_slopes.empty()) {
      without.push_back({"no_alibi", "without ALiBi", 3, opt});
      without.back().options.alibi_slopes.clear();
    }
    if (baselines && !opt.sinks.empty()) {
      without.push_back({"no_sinks", "without sinks", 3, opt});
      without.back().options.sinks.clear();
    }
    if (baselines && opt.precision != Precision::Float32) {
      without.push_back({"f32_precision", "in float32 precision", 3, opt});
      without.back().options.precision = Precision::Float32;
    }
    std::vector<std::function<void()>> kernels{[&] { (*this)(out, opt); }};
    if (vs_f32) kernels.push_back([&] { (*this)(out, opt, true); });
    for (const Without& w : without) kernels.push_back([&] { (*this)(out, w.options); });
    Timing t{run_in_turns(kernels, ceiling), nlohmann::ordered_json::object(), ""};
    const std::vector<double>& ms = t.turns.kernel_ms;
    char buf[160];
    size_t i = 1;
    if (vs_f32) {
      t.json["f32_median_ms"] = rounded(ms[i], 4);
      t.json["speedup_vs_f32"] = rounded(ms[i] / ms[0], 4);
      std::snprintf(buf, sizeof buf, "  float32 K/V in the same turns: %.3f ms (this is %.2fx as fast)\n", ms[i],
                    ms[i] / ms[0]);
      t.text += buf;
      ++i;
    }
    if (baselines) {
      const double err = error_vs_f64(opt);
      t.json["error_vs_f64"] = err;
      std::snprintf(buf, sizeof buf, "  relative error against the float64 reference: %.2e\n", err);
      t.text += buf;
    }
    for (const Without& w : without) {
      t.json[std::string(w.key) + "_median_ms"] = rounded(ms[i], 4);
      t.json[std::string("time_vs_") + w.key] = rounded(ms[0] / ms[i], 4);
      std::snprintf(buf, sizeof buf, "  %s in the same turns: %.3f ms (this takes %.*fx its time)\n", w.words,
                    ms[i], w.digits, ms[0] / ms[i]);
      t.text += buf;
      ++i;
    }
    return t;
  }
};

int64_t keys_of(const BenchArgs& a) { return a.kv_len > 0 ? a.kv_len : a.n; }

// The options timed: --causal, with --alibi BLOOM's slopes, with --sinks a
// sink per head (logits 0, ±1, ...: of the size of the scores).
AttentionOptions options_of(const BenchArgs& a) {
  AttentionOptions o = a.attention;
  if (a.alibi) o.alibi_slopes = alibi_slopes(a.heads);
  for (int64_t h = 0; a.sinks && h < a.heads; ++h) o.sinks.push_back(double(h % 3) - 1.0);
  o.precision = parse_precision(a.precision);
  return o;
}

// Query-key pairs the options allow: what a causal kernel must compute.
double allowed_pairs(int64_t n_q, int64_t n_k, Causal causal) {
  if (causal == Causal::None) return double(n_q) * double(n_k);
  const int64_t shift = causal == Causal::BottomRight ? n_k - n_q : 0;
  double pairs = 0;
  for (int64_t i = 0; i < n_q; ++i) pairs += double(std::clamp<int64_t>(i + shift + 1, 0, n_k));
  return pairs;
}

// One measured shape: its JSON object, the text `attn bench` prints for it
// alone, its median time, its rate (GFLOP/s on the pairs computed, or GB/s)
// and that rate's ratio to the ceiling.
// The first lines `attn bench attention|backward` print: the shape, the
// median time and rate (`count` names how FLOPs are counted), and for causal
// the rate on the pairs computed.
std::string shape_text(const char* kind, const BenchArgs& a, int64_t n_k, int64_t hkv, bool causal, int threads,
                       double ms, double gflops, const char* count, double gflops_unmasked) {
  char buf[500];
  std::snprintf(buf, sizeof buf,
                "%s n=%lld kv_len=%lld heads=%lld kv_heads=%lld head_dim=%lld batch=%lld causal=%s "
                "kv_dtype=%s%s%s threads=%d\n  median %.3f ms, %.1f GFLOP/s (%s)",
                kind, (long long)a.n, (long long)n_k, (long long)a.heads, (long long)hkv, (long long)a.head_dim,
                (long long)a.batch, causal ? "yes" : "no", a.kv_dtype.c_str(), a.alibi ? " alibi=yes" : "",
                a.sinks ? " sinks=yes" : "", threads, ms, gflops, count);
  std::string text = buf;
  if (causal) {
    std::snprintf(buf, sizeof buf, ", %.1f GFLOP/s on unmasked pairs", gflops_unmasked);
    text += buf;
  }
  return text;
}

Measurement bench_attention(const BenchArgs& a, int threads) {
  const int64_t hkv = a.kv_heads > 0 ? a.kv_heads : a.heads, n_k = keys_of(a);
  const Shape qs{a.batch, a.heads, a.n, a.head_dim}, ks{a.batch, hkv, n_k, a.head_dim};
  const auto q = random_tensor(qs, 1);
  const Attend attend(q, random_tensor(ks, 2), random_tensor(ks, 3), a.kv_dtype);
  Tensor<float> out(qs);
  const AttentionOptions opt = options_of(a);
  const bool causal = opt.causal != Causal::None;
  // bf16, int8: the CPU's unit's peak in the same turns as the FMA's (not
  // the first call's: run_in_turns' warm-up, whose FMA peak it drops too).
  // (int8 measures the bf16 unit too: its P·V runs there.)
  const bool bf16 = opt.precision == Precision::BF16, int8 = opt.precision == Precision::Int8;
  std::vector<double> bf16_peaks, int8_peaks;
  bool warm = false;
  const auto timing = attend.time(out, opt, a.baselines, [&] {
    if (bf16 || int8) {
      const double bf16_peak = measure_bf16_peak_gflops(threads);
      const double int8_peak = int8 ? measure_int8_peak_gops(threads) : 0;
      if (warm) bf16_peaks.push_back(bf16_peak), int8_peaks.push_back(int8_peak);
    }
    warm = true;
    return measure_fma_peak_gflops(threads);
  });
  const double ms = timing.turns.kernel_ms[0], peak = timing.turns.ceiling;
  const double per_pair = 4.0 * double(a.head_dim) * double(a.heads) * double(a.batch);
  const double gflops = per_pair * double(a.n) * double(n_k) / ms * 1e-6;
  const double gflops_unmasked = per_pair * allowed_pairs(a.n, n_k, opt.causal) / ms * 1e-6;
  const double ratio = (causal ? gflops_unmasked : gflops) / peak;
  // The path's ceiling from the peaks of the units its products run on
  // (the FMAs where precision_unit says "highway").
  const double bf16_peak = bf16 || int8 ? median(bf16_peaks) : 0, int8_peak = int8 ? median(int8_peaks) : 0;
  const bool bf16_used = (bf16 || int8) && precision_unit(Precision::BF16) != "highway" && bf16_peak > 0;
  const bool int8_used = int8 && precision_unit(Precision::Int8) != "highway" && int8_peak > 0;
  const double pv_peak = bf16_used ? bf16_peak : peak;
  const double ceiling =
      prefill_ceiling_gflops(a.head_dim, opt.precision, peak, int8_used ? int8_peak : pv_peak, pv_peak);
  const double ratio_to_ceiling = (causal ? gflops_unmasked : gflops) / ceiling;
  Measurement m{{{"kind", "attention"}, {"n", a.n}, {"kv_len", n_k}, {"heads", a.heads},
                 {"kv_heads", hkv}, {"head_dim", a.head_dim}, {"batch", a.batch}, {"causal", causal},
                 {"kv_dtype", a.kv_dtype}, {"alibi", a.alibi}, {"sinks", a.sinks}, {"threads", threads},
                 {"precision", a.precision}, {"unit", precision_unit(opt.precision)},
                 {"median_ms", rounded(ms, 4)}, {"gflops", rounded(gflops, 2)}, {"gflops_unmasked", rounded(gflops_unmasked, 2)},
                 {"peak_gflops", rounded(peak, 2)}, {"ratio_to_peak", rounded(ratio, 4)},
                 {"ceiling", rounded(ceiling, 2)}, {"ratio_to_ceiling", rounded(ratio_to_ceiling, 4)}},
                "", ms, causal ? gflops_unmasked : gflops, ratio};
  // (null: the CPU has no unit; one it has is measured whether used or not)
  const auto peak_json = [](double x) { return x > 0 ? nlohmann::ordered_json(rounded(x, 2)) : nullptr; };
  if (bf16 || int8) m.json["bf16_peak_gflops"] = peak_json(bf16_peak);
  if (int8) m.json["int8_peak_gops"] = peak_json(int8_peak), m.json["pv_unit"] = precision_unit(Precision::BF16);
  const double unit_peak = bf16 ? bf16_peak : int8_peak;
  m.json.update(timing.json);
  m.text = shape_text("attention", a, n_k, hkv, causal, threads, ms, gflops, "4·n·kv_len·d·H", gflops_unmasked);
  char buf[400];
  std::snprintf(buf, sizeof buf,
                ", FMA peak %.1f GFLOP/s -> %.1f%% of peak\n  this path's ceiling %.1f GFLOP/s (computed: "
                "docs/performance.md) -> %.1f%% of it\n",
                peak, 100 * ratio, ceiling, 100 * ratio_to_ceiling);
  m.text += buf;
  if (opt.precision != Precision::Float32) {
    std::snprintf(buf, sizeof buf, "  precision %s on %s", a.precision.c_str(), precision_unit(opt.precision).c_str());
    m.text += buf;
    const bool used = precision_unit(opt.precision) != "highway";
    if (bf16 && unit_peak > 0 && used) {
      std::snprintf(buf, sizeof buf, ", its peak %.1f GFLOP/s -> %.1f%% of it", unit_peak,
                    100 * (causal ? gflops_unmasked : gflops) / unit_peak);
      m.text += buf;
    } else if (unit_peak > 0) {
      // (int8's unit does Q·Kᵀ only, so the call's rate is not held against it.)
      std::snprintf(buf, sizeof buf, " (the CPU's %s unit%s: %.1f G%s/s)", a.precision.c_str(),
                    used ? "" : ", not used", unit_peak, bf16 ? "FLOP" : "OP");
      m.text += buf;
    }
    m.text += "\n";
  }
  m.text += timing.text;
  return m;
}

// decode: a few queries against a long key/value cache
Measurement bench_decode(const BenchArgs& a, int threads) {
  if (a.precision != "f32" && a.kv_dtype != "q8_0")
    throw ValueError("bench decode: --precision " + a.precision + " needs --kv-dtype q8_0 (decode computes other "
                     "caches in float32), got --kv-dtype " + a.kv_dtype);
  const int64_t hkv = a.kv_heads > 0 ? a.kv_heads : a.heads;
  const Shape qs{a.batch, a.heads, a.queries, a.head_dim}, ks{a.batch, hkv, a.kv_len, a.head_dim};
  const auto q = random_tensor(qs, 1);
  const Attend attend(q, random_tensor(ks, 2), random_tensor(ks, 3), a.kv_dtype);
  Tensor<float> out(qs);
  const ReadBandwidth bandwidth;
  const auto timing = attend.time(out, options_of(a), a.baselines, [&] { return bandwidth.measure_gbps(threads); });
  const double ms = timing.turns.kernel_ms[0], peak = timing.turns.ceiling;
  const double bytes = attend.kv_bytes();
  const double gbps = bytes / ms * 1e-6;
  Measurement m{{{"kind", "decode"}, {"kv_len", a.kv_len}, {"heads", a.heads}, {"kv_heads", hkv},
                 {"head_dim", a.head_dim}, {"batch", a.batch}, {"queries", a.queries},
                 {"kv_dtype", a.kv_dtype}, {"precision", a.precision}, {"alibi", a.alibi}, {"threads", threads},
                 {"median_ms", rounded(ms, 4)},
                 {"gbps", rounded(gbps, 2)}, {"peak_gbps", rounded(peak, 2)},
                 {"ratio_to_peak", rounded(gbps / peak, 4)}, {"ceiling", rounded(peak, 2)},
                 {"ratio_to_ceiling", rounded(gbps / peak, 4)}},
                "", ms, gbps, gbps / peak};
  if (a.precision != "f32") m.json["unit"] = decode_precision_unit(parse_precision(a.precision), a.heads / hkv * a.queries);
  m.json.update(timing.json);
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "decode kv_len=%lld heads=%lld kv_heads=%lld head_dim=%lld batch=%lld queries=%lld "
                "kv_dtype=%s%s%s threads=%d\n  median %.3f ms, %.1f GB/s of K/V read, read bandwidth %.1f GB/s "
                "-> %.1f%% of peak\n",
                (long long)a.kv_len, (long long)a.heads, (long long)hkv, (long long)a.head_dim,
                (long long)a.batch, (long long)a.queries, a.kv_dtype.c_str(),
                a.precision == "f32" ? "" : (" precision=" + a.precision + " on " + m.json.value("unit", "")).c_str(),
                a.alibi ? " alibi=yes" : "",
                threads, ms, gbps, peak,
                100 * gbps / peak);
  m.text = buf + timing.text;
  return m;
}

// varlen: one packed call, against the same sequences one call each and
// against padding them all to the longest with a key mask, in the same turns.
Measurement bench_varlen(const BenchArgs& a, int threads) {
  const int64_t H = a.heads, d = a.head_dim, batch = static_cast<int64_t>(a.lengths.size());
  if (batch == 0) throw ValueError("bench varlen: --lengths needs at least one length");
  Tensor<int64_t> cu({batch + 1});
  cu[0] = 0;
  int64_t longest = 0;
  for (int64_t b = 0; b < batch; ++b) {
    cu[b + 1] = cu[b] + a.lengths[b];
    longest = std::max(longest, a.lengths[b]);
  }
  const int64_t total = cu[batch];
  const auto q = random_tensor({total, H, d}, 1), k = random_tensor({total, H, d}, 2),
             v = random_tensor({total, H, d}, 3);
  Tensor<float> out({total, H, d});
  // One call per sequence, (H, n, d) views of the packed arrays.
  std::vector<Tensor<float>> outs;
  for (int64_t b = 0; b < batch; ++b) outs.emplace_back(Shape{H, a.lengths[b], d});
  const auto seq = [&](const Tensor<float>& t, int64_t b) {
    return TensorView<const float>(t.data() + cu[b] * H * d, {H, a.lengths[b], d}, {d, H * d, 1});
  };
  // Padded: (batch, H, longest, d), keys past each length masked.
  const Shape padded{batch, H, longest, d};
  const auto qp = random_tensor(padded, 4), kp = random_tensor(padded, 5), vp = random_tensor(padded, 6);
  Tensor<float> outp(padded);
  Tensor<bool> valid({batch, 1, 1, longest});
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t j = 0; j < longest; ++j) valid[b * longest + j] = j < a.lengths[b];
  const AttentionOptions& opt = a.attention;
  const std::vector<std::function<void()>> kernels{
      [&] { attention_varlen(q.view(), k.view(), v.view(), cu.view(), cu.view(), out.view(), opt); },
      [&] {
        for (int64_t b = 0; b < batch; ++b)
          AttentionPlan(seq(q, b), seq(k, b), seq(v, b), opt).run(outs[b].view());
      },
      [&] { AttentionPlan(qp.view(), kp.view(), vp.view(), opt, TensorView<const bool>(valid.view())).run(outp.view()); }};
  const Turns t = run_in_turns(kernels, [] { return 0.0; });
  const double packed = t.kernel_ms[0], separate = t.kernel_ms[1], padding = t.kernel_ms[2];
  std::string lengths;
  for (int64_t n : a.lengths) lengths += (lengths.empty() ? "" : ",") + std::to_string(n);
  Measurement m{{{"kind", "varlen"}, {"lengths", a.lengths}, {"heads", H}, {"head_dim", d},
                 {"causal", opt.causal != Causal::None}, {"threads", threads},
                 {"median_ms", rounded(packed, 4)}, {"per_sequence_ms", rounded(separate, 4)},
                 {"padded_ms", rounded(padding, 4)}, {"time_vs_per_sequence", rounded(packed / separate, 4)},
                 {"speedup_vs_padded", rounded(padding / packed, 4)}},
                "", packed, 0, 0};
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "varlen lengths=%s heads=%lld head_dim=%lld causal=%s threads=%d\n"
                "  packed %.3f ms; one call per sequence %.3f ms (packed takes %.3fx its time); "
                "padded to %lld with a key mask %.3f ms (packed is %.2fx as fast)\n",
                lengths.c_str(), (long long)H, (long long)d, opt.causal != Causal::None ? "yes" : "no", threads,
                packed, separate, packed / separate, (long long)longest, padding, padding / packed);
  m.text = buf;
  return m;
}

// backward: one attention_backward given the forward's output and
// log-sum-exp, with the forward itself in the same turns (and, causal, the
// non-causal backward).
Measurement bench_backward(const BenchArgs& a, int threads) {
  if (a.kv_dtype == "int4")
    throw ValueError("attn bench backward: --kv-dtype int4 has no backward (attention_backward takes keys stored "
                     "token by token; int4's are per channel): pass f32, bf16, f16, q8_0 or q4_0");
  const int64_t hkv = a.kv_heads > 0 ? a.kv_heads : a.heads, n_k = keys_of(a);
  const Shape qs{a.batch, a.heads, a.n, a.head_dim}, ks{a.batch, hkv, n_k, a.head_dim};
  const auto q = random_tensor(qs, 1), dout = random_tensor(qs, 4);
  const Attend attend(q, random_tensor(ks, 2), random_tensor(ks, 3), a.kv_dtype);
  const AttentionOptions opt = options_of(a);
  const bool causal = opt.causal != Causal::None;
  AttentionOptions noncausal = opt;
  noncausal.causal = Causal::None;
  // The forward's output and log-sum-exp, with and without the causal mask.
  Tensor<float> out(qs), lse({a.batch, a.heads, a.n}), out_nc(qs), lse_nc({a.batch, a.heads, a.n});
  AttentionExtras<float> extras, extras_nc;
  extras.lse = lse.view(), extras_nc.lse = lse_nc.view();
  attend(out, opt, false, extras);
  if (causal) attend(out_nc, noncausal, false, extras_nc);
  Tensor<float> dq(qs), dk(ks), dv(ks), dsinks({a.heads}), fwd(qs);
  const auto backward = [&](const AttentionOptions& o, const Tensor<float>& o_out, const Tensor<float>& o_lse) {
    attend.with_kv([&](const auto& kx, const auto& vx) {
      using KV = std::remove_const_t<std::remove_reference_t<decltype(*kx.data())>>;
      if constexpr (AttentionTypes<float, KV>)  // (int4 is refused above)
        attention_backward(q.view(), kx, vx, dout.view(), dq.view(), dk.view(), dv.view(), o, {},
                           o.sinks.empty() ? TensorView<float>() : dsinks.view(),
                           SavedForward<float>{o_out.view(), o_lse.view()});
    });
  };
  std::vector<std::function<void()>> kernels{[&] { backward(opt, out, lse); }, [&] { attend(fwd, opt); }};
  if (causal && a.baselines) kernels.push_back([&] { backward(noncausal, out_nc, lse_nc); });
  const Turns turns = run_in_turns(kernels, [&] { return measure_fma_peak_gflops(threads); });
  const double ms = turns.kernel_ms[0], forward_ms = turns.kernel_ms[1], peak = turns.ceiling;
  const double per_pair = 10.0 * double(a.head_dim) * double(a.heads) * double(a.batch);
  const double gflops = per_pair * double(a.n) * double(n_k) / ms * 1e-6;
  const double gflops_unmasked = per_pair * allowed_pairs(a.n, n_k, opt.causal) / ms * 1e-6;
  const double ratio = (causal ? gflops_unmasked : gflops) / peak;
  Measurement m{{{"kind", "backward"}, {"n", a.n}, {"kv_len", n_k}, {"heads", a.heads}, {"kv_heads", hkv},
                 {"head_dim", a.head_dim}, {"batch", a.batch}, {"causal", causal}, {"kv_dtype", a.kv_dtype},
                 {"alibi", a.alibi}, {"sinks", a.sinks}, {"threads", threads}, {"median_ms", rounded(ms, 4)},
                 {"gflops", rounded(gflops, 2)}, {"gflops_unmasked", rounded(gflops_unmasked, 2)},
                 {"peak_gflops", rounded(peak, 2)}, {"ratio_to_peak", rounded(ratio, 4)},
                 {"forward_median_ms", rounded(forward_ms, 4)}, {"time_vs_forward", rounded(ms / forward_ms, 4)}},
                "", ms, causal ? gflops_unmasked : gflops, ratio};
  m.text = shape_text("backward", a, n_k, hkv, causal, threads, ms, gflops, "10·n·kv_len·d·H", gflops_unmasked);
  char buf[400];
  std::snprintf(buf, sizeof buf,
                ", FMA peak %.1f GFLOP/s -> %.1f%% of peak\n  the forward in the same turns: %.3f ms "
                "(the backward takes %.2fx its time)\n",
                peak, 100 * ratio, forward_ms, ms / forward_ms);
  m.text += buf;
  if (kernels.size() > 2) {
    const double nc = turns.kernel_ms[2];
    m.json["noncausal_median_ms"] = rounded(nc, 4);
    m.json["time_vs_noncausal"] = rounded(ms / nc, 4);
    std::snprintf(buf, sizeof buf, "  non-causal backward in the same turns: %.3f ms (this takes %.2fx its time)\n",
                  nc, ms / nc);
    m.text += buf;
  }
  return m;
}

Measurement measure(const BenchArgs& a, int threads) {
  if (a.kind == "mla") return bench_mla(a, threads);
  if (a.kind == "sparse") return bench_sparse(a, threads);
  if (a.kind == "varlen") return bench_varlen(a, threads);
  if (a.kind == "backward") return bench_backward(a, threads);
  return a.kind == "attention" ? bench_attention(a, threads) : bench_decode(a, threads);
}

// The shapes of `attn bench attention --sweep`: first the one the others'
// ratios are given against (R64: head dim 64,
// n = 4096, 8 heads), then the head dims real models use at short to long n,
// batches, GQA ratios, cross-attention and chunked prefill against a cache,
// causal and long sequences, and decode at three head dims.
std::vector<BenchArgs> sweep_shapes(const BenchArgs& base) {
  std::vector<BenchArgs> shapes;
  const auto prefill = [&](int64_t n, int64_t d, int64_t heads = 8, int64_t kv_heads = 0,
                           int64_t batch = 1, int64_t kv_len = 0, bool causal = false) {
    BenchArgs a = base;
    a.kind = "attention";
    a.baselines = false;
    a.n = n, a.head_dim = d, a.heads = heads, a.kv_heads = kv_heads, a.batch = batch, a.kv_len = kv_len;
    a.attention.causal = causal ? Causal::BottomRight : Causal::None;
    shapes.push_back(a);
  };
  prefill(4096, 64);
  for (int64_t n : {128, 512, 2048, 4096, 8192})
    for (int64_t d : {16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 256})
      if (n != 4096 || d != 64) prefill(n, d);
  prefill(128, 64, 8, 0, 8);                                                  // batch
  for (int64_t kv_heads : {32, 8, 4, 1}) prefill(4096, 128, 32, kv_heads);    // GQA 1, 4, 8, MQA
  for (bool causal : {false, true}) prefill(512, 128, 8, 0, 1, 8192, causal);  // cross, chunked prefill
  for (int64_t d : {64, 128}) prefill(4096, d, 8, 0, 1, 0, true);
  prefill(32768, 128, 2, 0, 1, 0, true);                                      // long
  prefill(131072, 64, 1, 0, 1, 0, true);
  for (int64_t d : {128, 64, 256}) {  // 128 first: the others' baseline
    BenchArgs a = base;
    a.kind = "decode";
    a.baselines = false;
    a.kv_len = 32768, a.heads = 32, a.kv_heads = 0, a.head_dim = d, a.batch = 1, a.queries = 1;
    shapes.push_back(a);
  }
  return shapes;
}

// One line per shape; each ratio also as a multiple of R64 (decode's of
// head dim 128's, the targets' baselines).
int run_sweep(const BenchArgs& base, int threads) {
  if (!base.json)
    std::printf("%-9s %7s %7s %5s %3s %5s %6s %10s %9s %7s %7s\n", "kind", "n", "kv_len", "heads", "kv",
                "d", "batch", "median_ms", "rate", "ratio", "vs_base");
  double r64 = 0, r128_decode = 0;
  for (const BenchArgs& a : sweep_shapes(base)) {
    Measurement m = measure(a, threads);
    const bool decode = a.kind == "decode";
    if (!decode && r64 == 0) r64 = m.ratio;
    if (decode && a.head_dim == 128) r128_decode = m.ratio;
    const double baseline = decode ? r128_decode : r64;
    if (baseline > 0) m.json[decode ? "vs_decode_d128" : "vs_r64"] = rounded(m.ratio / baseline, 3);
    if (base.json) {
      std::printf("%s\n", m.json.dump().c_str());
    } else {
      char vs_base[16] = "-";
      if (baseline > 0) std::snprintf(vs_base, sizeof vs_base, "%.2f", m.ratio / baseline);
      const bool causal = a.attention.causal != Causal::None;
      std::printf("%-9s %7lld %7lld %5lld %3lld %5lld %6lld %10.3f %9.1f %7.3f %7s\n",
                  decode ? "decode" : causal ? "causal" : "prefill",
                  (long long)(decode ? a.queries : a.n), (long long)(decode ? a.kv_len : keys_of(a)),
                  (long long)a.heads, (long long)(a.kv_heads > 0 ? a.kv_heads : a.heads),
                  (long long)a.head_dim, (long long)a.batch, m.ms, m.rate, m.ratio, vs_base);
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int run_bench(const BenchArgs& a) {
  if (a.kind == "decode" && a.page_size > 0) {
    if (a.precision != "f32")
      throw ValueError("bench decode: --precision goes without --page-size (its paged timing is float32 precision's)");
    ServeBenchArgs paged;
    paged.kind = "decode";
    paged.heads = a.heads, paged.kv_heads = a.kv_heads > 0 ? a.kv_heads : a.heads, paged.head_dim = a.head_dim;
    paged.page_size = a.page_size, paged.batch = a.batch, paged.kv_len = a.kv_len, paged.queries = a.queries;
    paged.tree = a.tree, paged.kv_dtype = a.kv_dtype, paged.threads = a.threads, paged.json = a.json;
    return run_serve_bench(paged);
  }
  if (a.tree) throw ValueError("bench decode: --tree goes with --page-size");
  if (a.threads > 0) set_num_threads(a.threads);
  const int threads = num_threads();
  if (a.sweep) return run_sweep(a, threads);
  const Measurement m = measure(a, threads);
  std::fputs(a.json ? (m.json.dump() + "\n").c_str() : m.text.c_str(), stdout);
  return 0;
}

}  // namespace attn::cli
