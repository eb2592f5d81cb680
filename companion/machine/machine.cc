// Ceilings for `attn bench`: the units' peak loops of libattn
// (precision_peak_loop) on each thread, and a streaming read of a buffer much
// larger than the last-level cache.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "machine/machine.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "attn/attention.hpp"
#include "attn/error.hpp"
#include "companion/machine.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::machine {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Reads the first n floats at p (rounded down to whole vectors per stream)
// as kStreams concurrent sequential streams; returns how many it read, their
// sum in `sink`. One stream per thread leaves DRAM bandwidth unused on Zen 5
// (measured 30 GB/s with 2 threads against 57 with 6 streams each; 8 streams
// alias in the caches). Software prefetch on top adds nothing: each stream
// fetching 256 B, 1 KiB or 4 KiB ahead read 49.9-50.7, 51.2-51.3 and
// 50.9-51.0 GB/s, against 50.8-50.9 without (2 threads, Zen 5).
size_t ReadSum(const float* p, size_t n, float* sink) {
  constexpr size_t kStreams = 6;
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const size_t part = n / kStreams / N * N;
  auto sum = hn::Zero(d);
  for (size_t i = 0; i < part; i += N) {
    const float* q = p + i;
    sum = hn::Add(sum, hn::Add(hn::Add(hn::Add(hn::LoadU(d, q), hn::LoadU(d, q + part)),
                                       hn::Add(hn::LoadU(d, q + 2 * part), hn::LoadU(d, q + 3 * part))),
                               hn::Add(hn::LoadU(d, q + 4 * part), hn::LoadU(d, q + 5 * part))));
  }
  *sink = hn::GetLane(hn::SumOfLanes(d, sum));
  return kStreams * part;
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::machine
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn {
namespace machine {
HWY_EXPORT(ReadSum);
size_t read_sum(const float* p, size_t n, float* sink) { return HWY_DYNAMIC_DISPATCH(ReadSum)(p, n, sink); }
}  // namespace machine

namespace {
using Clock = std::chrono::steady_clock;

// Runs body(t) on `threads` threads at once; returns the wall time in seconds.
// If the system refuses a thread, the started ones are joined (a joinable
// std::thread destroyed would call std::terminate) and RuntimeError thrown.
template <class Body>
double timed(int threads, Body body) {
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(threads));
  const auto start = Clock::now();
  try {
    for (int t = 1; t < threads; ++t) pool.emplace_back(body, t);
  } catch (const std::system_error& e) {
    for (auto& th : pool) th.join();
    throw RuntimeError("cannot start " + std::to_string(threads) + " threads for the ceiling: " +
                       e.what());
  }
  body(0);
  for (auto& th : pool) th.join();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// GFLOP/s of `threads` threads running loop(iterations, sink) (which
// returns the flops it did) at once.
template <class Loop>
double loop_gflops(int threads, Loop loop) {
  threads = std::max(threads, 1);
  std::vector<float> sink(threads * 16);
  std::vector<double> flops(threads);
  const double s = timed(threads, [&](int t) { flops[t] = loop(10'000'000, &sink[t * 16]); });
  double total = 0;
  for (double f : flops) total += f;
  return total / s * 1e-9;
}

// The peak rate of a precision's unit, or 0 where the CPU has no such unit
// (its loop does nothing).
double unit_gflops(int threads, Precision precision) {
  const auto loop = [precision](int64_t iterations, float* sink) {
    return precision_peak_loop(precision, iterations, sink);
  };
  float sink[1];
  return loop(1, sink) == 0 ? 0 : loop_gflops(threads, loop);
}
}  // namespace

double measure_fma_peak_gflops(int threads) { return unit_gflops(threads, Precision::Float32); }

double measure_bf16_peak_gflops(int threads) { return unit_gflops(threads, Precision::BF16); }

double measure_int8_peak_gops(int threads) { return unit_gflops(threads, Precision::Int8); }

// Vector operations of the online softmax per vector of scores that take an
// FMA port (kernels/exp2-inl.h, attention-inl.h's AddExponentials): the
// exponential's polynomial FMAs (6 in float32, 3 and the square of its
// argument at bf16 precision's accuracy) and its scaling multiply, the
// compare and select that flush underflow, and the running sum's add. (Its
// max, shift and loads go elsewhere; on a CPU whose adds share the FMA
// ports they would count too, which this leaves out.)
constexpr int kSoftmaxFmaOps = 10, kSoftmaxFmaOpsBF16 = 8;

double prefill_ceiling_gflops(int64_t head_dim, Precision precision, double fma_peak, double qk_peak, double pv_peak) {
  const double d = static_cast<double>(head_dim);
  const int softmax = precision == Precision::Float32 ? kSoftmaxFmaOps : kSoftmaxFmaOpsBF16;
  // Seconds per pair, in units of 1e-9 s: each term's FLOPs over its unit's GFLOP/s.
  const double time = 2 * d / qk_peak + 2 * d / pv_peak + 2.0 * softmax / fma_peak;
  return 4 * d / time;
}

// 512 MiB, touched once: a Tensor's zeros (aligned to whole cache lines, on
// huge pages).
ReadBandwidth::ReadBandwidth() : buffer_({int64_t{128} << 20}) {}

double ReadBandwidth::measure_gbps(int threads) const {
  threads = std::max(threads, 1);
  const size_t part = static_cast<size_t>(buffer_.numel()) / threads;
  std::vector<float> sink(threads * 16);
  std::vector<size_t> read(threads);
  const double s = timed(threads, [&](int t) {
    read[t] = machine::read_sum(buffer_.data() + t * part, part, &sink[t * 16]);
  });
  size_t floats = 0;
  for (size_t r : read) floats += r;
  return static_cast<double>(floats * sizeof(float)) / s * 1e-9;
}
}  // namespace attn
#endif
