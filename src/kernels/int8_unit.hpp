// Internal: a CPU's int8 dot-product unit for int8 precision's Q·Kᵀ
// (docs/semantics.md "Precision"): x86's VPDPBUSD (AVX512_VNNI) adds 16
// lanes × 4 products of unsigned and signed bytes into int32 sums, Arm's
// SDOT (the dot-product extension) 4 lanes × 4 signed ones: four times the
// float32 FMA's multiplies per instruction. Highway 1.0.3 has neither, so
// each is one file of compiler intrinsics (int8_x86.cc, int8_arm.cc), used
// only where a run-time CPU check found it.
//
// Layouts (codes: int8 precision's, in [-127, 127]):
//   K panel   [ceil(d / 4)][kBlockK][4] signed codes: k_j's codes 4c .. 4c + 3
//             at [c][j], zero past d and past the tile's keys; then kBlockK
//             float32 scales t_j, then kBlockK int32 offsets 128 · Σ_c k_j[c]
//             (Int8PanelBytes in all)
//   Q rows    ceil(d / 4) · 4 unsigned bytes each: code + 128, 128 past d
//             (VPDPBUSD's first operand is unsigned; the offsets take the
//             128s back out; SDOT takes the codes back, signed, and needs
//             no offsets), with a float32 scale s_r and center term
//             q̃_r · μ per row
//
// q8_0 keys in decode (int8 precision, llama.cpp's vec_dot_q8_0_q8_0): the
// query rows rounded to q8_0 too, as rows of code + 128 bytes (as above)
// with one float32 scale per row and block of 32, and
//   block panel [blocks · 8][keys][4] signed codes (k_j's block b, quad c
//             at [8b + c][j]), then [blocks][keys] float32 scales (the
//             blocks' d), then [blocks][keys] int32 offsets 128 · Σ codes
//             of the block (Int8BlockPanelBytes)
#pragma once

#include <cstdint>

#include "attn/quantize.hpp"

namespace attn::kernels {

// Bytes of one K panel of `keys` keys with head dim d.
inline int64_t Int8PanelBytes(int64_t d, int64_t keys) { return (d + 3) / 4 * keys * 4 + keys * 8; }

// Bytes of one block panel of `keys` keys of `blocks` q8_0 blocks each.
inline int64_t Int8BlockPanelBytes(int64_t blocks, int64_t keys) { return blocks * keys * (kQ8_0Block + 8); }

// The largest |q| and |k| of a call the unit takes, and of its scale: within
// them no difference k − mean, scale product or score it forms overflows
// (below 2^27 per row scale, 2^86 for two and the call's scale, 2^111 a
// score at head dims up to 1024);
// past them, as for NaN and infinities, the Highway path computes.
inline constexpr float kInt8UnitLimit = 4294967296.0f;  // 2^32

struct Int8Unit {
  const char* name;  // as precision_unit reports it
  int lanes;         // int32 sums per vector (4 byte products each per instruction)
  // s[r · s_stride + j] = scale · (s_r · t_j · Σ_c q_r[c] · k_j[c] + center_r)
  // for r < rows (<= 4), query row r's codes at q + r · q_stride bytes, its
  // scale and center term at q_scales[r] and q_centers[r], and the first
  // `cols` keys of the panel (<= keys, a multiple of 64) in whole vectors:
  // columns up to cols rounded up to 16 are written.
  void (*products)(const uint8_t* q, int64_t q_stride, int rows, int64_t quads, const float* q_scales,
                   const float* q_centers, const int8_t* panel, int64_t keys, float scale, float* s,
                   int64_t s_stride, int64_t cols);
  // Block panel columns col .. col + n - 1 from the q8_0 rows k, k +
  // k_stride, ... (k_stride in blocks), `blocks` blocks each.
  void (*pack_q8_0)(const block_q8_0* k, int64_t k_stride, int64_t n, int64_t blocks, int8_t* panel, int64_t keys,
                    int64_t col);
  // s[r · s_stride + j] = scale · Σ_b q_scales[r · blocks + b] · t_bj ·
  // Σ_(c in block b) q_r[c] · k_j[c] for r < rows (<= 4), query row r's
  // bytes at q + r · q_stride, over a block panel of `keys` keys (a
  // multiple of 64), t its scales: columns up to cols rounded up to 16.
  void (*block_products)(const uint8_t* q, int64_t q_stride, int rows, int64_t blocks, const float* q_scales,
                         const int8_t* panel, int64_t keys, float scale, float* s, int64_t s_stride, int64_t cols);
  // `iterations` rounds of independent dot products on one core; returns the
  // operations done (a byte product and its sum counting 2, as an FMA does)
  // and keeps the result in *sink.
  double (*peak_loop)(int64_t iterations, float* sink);
};

// x86 CPUs with AVX512_VNNI (int8_x86.cc), Arm CPUs with the dot-product
// extension (int8_arm.cc); null where the CPU lacks it and in builds for
// other architectures.
const Int8Unit* avx512_vnni_unit();
const Int8Unit* arm_dotprod_unit();

// The CPU's unit, if it has one (int8_unit.cc).
const Int8Unit* cpu_int8_unit();

// The unit int8 precision uses: the CPU's, unless set_int8_unit_use
// (attention_kernel.hpp) turned it off; null where there is none.
const Int8Unit* int8_unit();

}  // namespace attn::kernels
