// Internal: a CPU's bf16 dot-product unit, the two products of bf16
// precision's prefill (and int8's P·V, which is bf16's) done by instructions that multiply bf16 pairs into
// float32 sums (x86's VDPBF16PS: twice the float32 FMA's work per
// instruction; Arm's BFDOT). Highway 1.0.3 has none of them, so each
// architecture's unit is one file of compiler intrinsics (bf16_x86.cc,
// bf16_arm.cc) over kernels written once (bf16_blocks-inl.h), used only
// where a run-time CPU check found the instructions.
//
// Layouts ("pairs": two bf16 in 32 bits, the first in the low half):
//   K panel   [ceil(d / 2)][kBlockK] pairs: (k_j[2c], k_j[2c + 1]) at
//             [c][j], a float32 panel (PackRows) with rows 2c and 2c + 1
//             interleaved (flash-inl.h, InterleavePairs)
//   V tile    [ceil(count / 2)][dvp] pairs: (v_2i[c], v_2i+1[c]) at [i][c],
//             the keys of a softmax step (up to kBF16StepKeys)
//   Q rows    ceil(d / 2) pairs each (to_pairs)
// P rows are float32, paired by the unit.
// The instructions treat bf16 subnormals (below 2^-126) as zero.
#pragma once

#include <cstdint>

namespace attn::kernels {

struct BF16Unit {
  const char* name;  // as precision_unit reports it
  // float32 lanes of its vectors: the prefill uses it on SIMD targets whose
  // vectors are whole multiples of them (padded rows then are too).
  int lanes;
  // The first n floats of x as ceil(n / 2) pairs at out, rounded to bf16
  // (nearest, ties to even), zero past n; writes whole vectors of `lanes`
  // pairs.
  void (*to_pairs)(const float* x, int64_t n, uint32_t* out);
  // s[r · s_stride + j] = scale · Σ_c q_r[c] · k_j[c] for r < rows (<= 4),
  // query row r's `pairs` pairs at q + r · q_stride, and the first `cols`
  // keys of the panel (<= kBlockK) in whole vectors: columns up to cols
  // rounded up to `lanes` are written.
  void (*products)(const uint32_t* q, int64_t q_stride, int rows, int64_t pairs, const uint32_t* panel,
                   float scale, float* s, int64_t s_stride, int64_t cols);
  // o[r · o_stride + c] += Σ_{j < count} p[r · p_stride + j] · v_j[c] for
  // r < rows, c < dvp (a multiple of `lanes`), count <= kBF16StepKeys (a
  // softmax step's keys, config.hpp); p's entries past count are not read.
  void (*accumulate)(const float* p, int64_t p_stride, int rows, int64_t count, const uint32_t* v, int64_t dvp,
                     float* o, int64_t o_stride);
  // The unit's throughput loop for measuring its peak: `iterations` rounds
  // of independent dot products, the flops done (a pair product counts 2,
  // its sum 2), the result's sum in *sink.
  double (*peak_loop)(int64_t iterations, float* sink);
};

// x86 CPUs with AVX512_BF16 (bf16_x86.cc), Arm CPUs with BF16
// (bf16_arm.cc); null where the CPU lacks it, and in builds for other
// architectures (each file compiles to just that there).
const BF16Unit* avx512_bf16_unit();
const BF16Unit* arm_bf16_unit();

// This CPU's unit, used or not; null where it has none.
const BF16Unit* cpu_bf16_unit();

// The unit bf16 precision (and int8's P·V) uses: the CPU's where bf16_unit_speedup() is at
// least kBF16UnitMinSpeedup (config.hpp; or as set_bf16_unit_use
// forces), else null.
const BF16Unit* bf16_unit();

}  // namespace attn::kernels
