// What this machine can do, measured in-process: the ceilings `attn bench`
// compares the kernels with.
#pragma once

namespace attn {

// float32 FMA throughput of `threads` threads (a Highway loop on the best SIMD
// target), in GFLOP/s (an FMA counts 2).
double measure_fma_peak_gflops(int threads);

// Memory read bandwidth of `threads` threads streaming a buffer far larger
// than the caches, in GB/s.
double measure_read_bandwidth_gbps(int threads);

}  // namespace attn
