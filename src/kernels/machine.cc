// Ceilings for `attn bench`: an FMA loop with enough independent accumulators
// to fill every FMA pipe, and a streaming read of a buffer much larger than
// the last-level cache.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/machine.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <hwy/aligned_allocator.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "attn/machine.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Returns FLOPs done; `sink` keeps the result alive. The chains start from
// different values: equal chains were merged by the compiler into one
// latency-bound chain counted as 12, and the "peak" came out 1.5x too high.
double FmaLoop(int64_t iterations, float* sink) {
  const hn::ScalableTag<float> d;
  // 12 chains > 2 pipes x 4 cycles of FMA latency. Named, not an array:
  // sizeless SVE vectors cannot form arrays.
  auto a0 = hn::Set(d, 1.0f), a1 = hn::Set(d, 1.1f), a2 = hn::Set(d, 1.2f), a3 = hn::Set(d, 1.3f),
       a4 = hn::Set(d, 1.4f), a5 = hn::Set(d, 1.5f), a6 = hn::Set(d, 1.6f), a7 = hn::Set(d, 1.7f),
       a8 = hn::Set(d, 1.8f), a9 = hn::Set(d, 1.9f), a10 = hn::Set(d, 2.0f), a11 = hn::Set(d, 2.1f);
  const auto x = hn::Set(d, 0.999999f), y = hn::Set(d, 1e-7f);
  for (int64_t i = 0; i < iterations; ++i) {
    a0 = hn::MulAdd(a0, x, y); a1 = hn::MulAdd(a1, x, y); a2 = hn::MulAdd(a2, x, y);
    a3 = hn::MulAdd(a3, x, y); a4 = hn::MulAdd(a4, x, y); a5 = hn::MulAdd(a5, x, y);
    a6 = hn::MulAdd(a6, x, y); a7 = hn::MulAdd(a7, x, y); a8 = hn::MulAdd(a8, x, y);
    a9 = hn::MulAdd(a9, x, y); a10 = hn::MulAdd(a10, x, y); a11 = hn::MulAdd(a11, x, y);
  }
  const auto s = hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)),
                         hn::Add(hn::Add(hn::Add(a4, a5), hn::Add(a6, a7)),
                                 hn::Add(hn::Add(a8, a9), hn::Add(a10, a11))));
  *sink = hn::GetLane(hn::SumOfLanes(d, s));
  return 2.0 * 12 * static_cast<double>(hn::Lanes(d)) * static_cast<double>(iterations);
}

float ReadSum(const float* p, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  auto s0 = hn::Zero(d), s1 = s0, s2 = s0, s3 = s0;
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    s0 = hn::Add(s0, hn::Load(d, p + i));
    s1 = hn::Add(s1, hn::Load(d, p + i + N));
    s2 = hn::Add(s2, hn::Load(d, p + i + 2 * N));
    s3 = hn::Add(s3, hn::Load(d, p + i + 3 * N));
  }
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
}

}  // namespace HWY_NAMESPACE
}  // namespace attn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn {
HWY_EXPORT(FmaLoop);
HWY_EXPORT(ReadSum);

namespace {
using Clock = std::chrono::steady_clock;

// Runs body(t) on `threads` threads at once; returns the wall time in seconds.
template <class Body>
double timed(int threads, Body body) {
  std::vector<std::thread> pool;
  const auto start = Clock::now();
  for (int t = 1; t < threads; ++t) pool.emplace_back(body, t);
  body(0);
  for (auto& th : pool) th.join();
  return std::chrono::duration<double>(Clock::now() - start).count();
}
}  // namespace

double measure_fma_peak_gflops(int threads) {
  threads = std::max(threads, 1);
  std::vector<float> sink(threads * 16);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    std::vector<double> flops(threads);
    const double s = timed(threads, [&](int t) {
      flops[t] = HWY_DYNAMIC_DISPATCH(FmaLoop)(20'000'000, &sink[t * 16]);
    });
    double total = 0;
    for (double f : flops) total += f;
    best = std::max(best, total / s * 1e-9);
  }
  return best;
}

double measure_read_bandwidth_gbps(int threads) {
  threads = std::max(threads, 1);
  const size_t n = size_t{128} << 20;  // 512 MiB of floats
  auto buf = hwy::AllocateAligned<float>(n);
  std::fill(buf.get(), buf.get() + n, 1.0f);
  std::vector<float> sink(threads * 16);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const double s = timed(threads, [&](int t) {
      const size_t part = n / threads / 64 * 64;
      sink[t * 16] = HWY_DYNAMIC_DISPATCH(ReadSum)(buf.get() + t * part, part);
    });
    best = std::max(best, n * sizeof(float) / s * 1e-9);
  }
  return best;
}
}  // namespace attn
#endif
