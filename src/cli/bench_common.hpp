// What the bench commands share: seeded inputs, medians, rounding for JSON,
// and timing kernels in turns with a ceiling.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "attn/batch_attention.hpp"
#include "attn/quantize.hpp"
#include "attn/tensor.hpp"
#include "cli/commands.hpp"

namespace attn::cli {

// K and V converted once from float32 to a storage dtype (--kv-dtype).
struct StoredKV {
  KVDtype dtype = KVDtype::F32;
  const Tensor<float>*k = nullptr, *v = nullptr;  // the float32 tensors (kept by the caller)
  Tensor<bfloat16> kb, vb;
  Tensor<float16> kh, vh;
  Tensor<block_q8_0> k8, v8;
  Tensor<block_q4_0> k4, v4;
  Tensor<block_int4> ki, vi;  // KIVI's layouts: keys per channel, values per token

  StoredKV() = default;
  // k_ and v_ (..., n, d), or pools of NHD pages (key_pages: int4's keys by page).
  StoredKV(const Tensor<float>& k_, const Tensor<float>& v_, KVDtype t, bool key_pages = false)
      : dtype(t), k(&k_), v(&v_) {
    if (t == KVDtype::BF16) kb = to_bfloat16(k_.view()), vb = to_bfloat16(v_.view());
    if (t == KVDtype::F16) kh = to_float16(k_.view()), vh = to_float16(v_.view());
    if (t == KVDtype::Q8_0) k8 = quantize_q8_0(k_.view()), v8 = quantize_q8_0(v_.view());
    if (t == KVDtype::Q4_0) k4 = quantize_q4_0(k_.view()), v4 = quantize_q4_0(v_.view());
    if (t == KVDtype::INT4) {
      ki = key_pages ? quantize_int4_key_pages(k_.view()) : quantize_int4_keys(k_.view());
      vi = quantize_int4_values(v_.view());
    }
  }
  // f(k, v): views of the storage type (as_f32: the float32 tensors').
  template <class F>
  void with(const F& f, bool as_f32 = false) const {
    switch (as_f32 ? KVDtype::F32 : dtype) {
      case KVDtype::F32: return f(k->view(), v->view());
      case KVDtype::BF16: return f(kb.view(), vb.view());
      case KVDtype::F16: return f(kh.view(), vh.view());
      case KVDtype::Q8_0: return f(k8.view(), v8.view());
      case KVDtype::Q4_0: return f(k4.view(), v4.view());
      case KVDtype::INT4: return f(ki.view(), vi.view());
    }
  }
  // Bytes of K and V in their storage.
  double bytes() const {
    if (dtype == KVDtype::INT4) return double((ki.numel() + vi.numel()) * static_cast<int64_t>(sizeof(block_int4)));
    return double(kv_dtype_bytes(dtype, k->numel()) + kv_dtype_bytes(dtype, v->numel()));
  }
};

// One bench's result: the JSON object and the text it prints, its median
// time, its rate and its ratio to the ceiling.
struct Measurement {
  nlohmann::ordered_json json;
  std::string text;
  double ms, rate, ratio;
};

// Uniform in [-1, 1), the same for a seed.
inline Tensor<float> random_tensor(const Shape& shape, uint32_t seed) {
  Tensor<float> t(shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = u(rng);
  return t;
}

inline double median(std::vector<double> x) {
  std::nth_element(x.begin(), x.begin() + x.size() / 2, x.end());
  return x[x.size() / 2];  // the upper middle one of an even count
}

inline double rounded(double x, int digits) {
  const double f = std::pow(10.0, digits);
  return std::round(x * f) / f;
}

struct Turns {
  std::vector<double> kernel_ms;  // median ms of one call of each kernel
  double ceiling;                 // median of the ceiling's measurements
};

// Runs the kernels and a ceiling measurement in turns, so that a slow spell of
// this shared machine hits them alike. A turn calls each kernel once untimed,
// then times it repeated for about 20 ms, so that it runs hot, as in a loop,
// not right after the ceiling's work; at least 3 turns and --min-time in all
// (at most 50 turns), after a second call of each kernel to size its turn.
inline Turns run_in_turns(const std::vector<std::function<void()>>& kernels,
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
  while (ceilings.size() < 3 || (ceilings.size() < 50 && ms_since(start) < 1000 * bench_min_time_s)) {
    // The untimed call: the first after the ceiling's pass and pause took
    // 1.12x a warm call's time (decode, 32768 keys, 32 × 8 heads of 128, 2
    // threads, Zen 4: the pool's threads woken, the caches the ceiling's).
    // Each turn starts with the next kernel all the same.
    for (size_t t = 0; t < kernels.size(); ++t) {
      const size_t i = (t + ceilings.size()) % kernels.size();
      kernels[i]();
      const auto t0 = Clock::now();
      for (int r = 0; r < reps[i]; ++r) kernels[i]();
      ms[i].push_back(ms_since(t0) / reps[i]);
    }
    // The pool's threads poll for work for a while after a call
    // (thread_pool.cc): let them go to sleep first, so that the ceiling's
    // own threads find the cores free.
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ceilings.push_back(ceiling());
  }
  Turns t{{}, median(ceilings)};
  for (const auto& m : ms) t.kernel_ms.push_back(median(m));
  return t;
}

// The attention of 2026's models (bench_models.cc): MLA's absorbed decode
// and top-k sparse attention.
Measurement bench_mla(const BenchArgs& a, int threads);
Measurement bench_sparse(const BenchArgs& a, int threads);

}  // namespace attn::cli
