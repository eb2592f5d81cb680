// What this machine can do, measured in-process: the ceilings `attn bench`
// compares the kernels with. Each call is one short measurement; the bench
// runs them in turns with the kernel and takes medians, so that both see the
// same machine (other processes share it, and its speed moves).
#pragma once

#include <cstdint>
#include <vector>

#include "attn/attention.hpp"
#include "attn/tensor.hpp"

namespace attn {

// float32 FMA throughput of `threads` threads (a Highway loop on the best SIMD
// target), in GFLOP/s (an FMA counts 2); about 20 ms.
double measure_fma_peak_gflops(int threads);

// The same for this CPU's bf16 dot-product unit (precision_unit's
// "avx512_bf16": a loop of VDPBF16PS, "neon_bf16": of BFDOT; a pair product
// and its sum counting 4), or 0 where the CPU has none. bf16 precision uses
// the unit only where it outruns the FMAs (precision_unit says whether).
double measure_bf16_peak_gflops(int threads);

// The same for this CPU's int8 dot-product unit (precision_unit's
// "avx512_vnni": a loop of VPDPBUSD, "neon_dotprod": of SDOT; a byte
// product and its sum counting 2), in GOP/s, or 0 where the CPU has none.
double measure_int8_peak_gops(int threads);

// A prefill's ceiling, computed: the rate of its useful work (4·d FLOPs per
// query-key pair, d the head dim) were it to do only this per pair: Q·Kᵀ's
// and P·V's 2·d FLOPs each at the peaks of the units they run on (GFLOP/s;
// all three the FMA peak for float32), and the online softmax's vector
// operations on the FMA ports (kSoftmaxFmaOps), each taking an FMA's slot,
// 2 FLOPs' time per score. Packing, pairing P and rescales are not counted:
// the ratio of a measured rate to this ceiling can only be understated.
// docs/performance.md shows the arithmetic.
double prefill_ceiling_gflops(int64_t head_dim, Precision precision, double fma_peak, double qk_peak, double pv_peak);

// Memory read bandwidth: `threads` threads streaming a buffer far larger than
// the caches (512 MiB, allocated and touched once, on construction), a
// Tensor on huge pages as the kernels' caches are (allocate_tensor_memory):
// on 4 KiB pages the same loop read 29.8 GB/s against 31.8 (2 threads, AMD
// EPYC Zen 4, in turns), a ceiling below what decode reaches on huge pages.
class ReadBandwidth {
 public:
  ReadBandwidth();
  // One pass over the buffer, in GB/s.
  double measure_gbps(int threads) const;

 private:
  Tensor<float> buffer_;
};

}  // namespace attn
