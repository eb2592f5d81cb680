// Compact storage for keys and values: bfloat16 and fp16 (attn/half.hpp),
// GGUF's 8-bit and 4-bit blocks (q8_0, q4_0) and KIVI's 4-bit groups (int4),
// with the conversions into and out of them.
// attention() reads all of them in place with float32 queries, widening as
// it goes; KVCache stores its tokens in any of them.
#pragma once

#include <cstdint>
#include <string>

#include "attn/half.hpp"
#include "attn/tensor.hpp"

namespace attn {

// GGUF's Q8_0 block (ggml's block_q8_0): 32 consecutive values of a row as an
// fp16 scale d and 32 int8 codes q, each value ≈ d · q. 34 bytes with no
// padding, so a llama.cpp-style cache is read in place. A q8_0 tensor is a
// tensor of blocks: logical shape (..., n) is Tensor<block_q8_0> (..., n / 32).
inline constexpr int64_t kQ8_0Block = 32;
struct block_q8_0 {
  float16 d;
  int8_t qs[kQ8_0Block];
};
static_assert(sizeof(block_q8_0) == 34, "GGUF's q8_0 block is 34 bytes");

// GGUF's Q4_0 block (ggml's block_q4_0): 32 consecutive values of a row as an
// fp16 scale d and 32 4-bit codes q in 16 bytes, each value ≈ d · (q − 8).
// Byte j holds value j in its low nibble and value j + 16 in its high one
// (ggml's order). 18 bytes with no padding, as q8_0's blocks.
inline constexpr int64_t kQ4_0Block = 32;
struct block_q4_0 {
  float16 d;
  uint8_t qs[kQ4_0Block / 2];
};
static_assert(sizeof(block_q4_0) == 18, "GGUF's q4_0 block is 18 bytes");

// Values one stored element holds: a block type's 32, else 1. A tensor of
// blocks has logical shape (..., n) and stored shape (..., n / 32).
template <class S>
inline constexpr int64_t kBlockValues = 1;
template <>
inline constexpr int64_t kBlockValues<block_q8_0> = kQ8_0Block;
template <>
inline constexpr int64_t kBlockValues<block_q4_0> = kQ4_0Block;

// KIVI's 4-bit cache (Liu et al., 2024): 32 values as 4-bit codes q with an
// fp16 scale d and minimum m each, asymmetric, each value ≈ d · q + m. The
// block is GGUF's q4_1 (ggml's block_q4_1), codes in q4_0's nibble order;
// 20 bytes. Keys and values group their values differently (KIVI's point:
// a key's outlier channels get ranges of their own):
//   keys   per channel, along tokens: k of logical shape (..., n, d) is a
//          tensor (..., ⌈n / 32⌉, d) of blocks, block (g, c) channel c of
//          tokens 32g .. 32g + 31 (a last partial group's missing tokens
//          code 0);
//   values per token, along channels, as q4_0's rows: (..., n, d / 32).
inline constexpr int64_t kInt4Group = 32;
struct block_int4 {
  float16 d;
  float16 m;
  uint8_t qs[kInt4Group / 2];
};
static_assert(sizeof(block_int4) == 20, "GGUF's q4_1 block is 20 bytes");
template <>
inline constexpr int64_t kBlockValues<block_int4> = kInt4Group;
template <class S>
inline constexpr bool kIsBlockType = kBlockValues<S> > 1;

// The storage types of keys and values (with float32 queries).
enum class KVDtype { F32, BF16, F16, Q8_0, Q4_0, INT4 };

// Whether the dtype stores blocks of 32 values (q8_0, q4_0, int4): head
// dims must be multiples of 32.
constexpr bool is_block_dtype(KVDtype dtype) {
  return dtype == KVDtype::Q8_0 || dtype == KVDtype::Q4_0 || dtype == KVDtype::INT4;
}

// "f32", "bf16", "f16", "q8_0", "q4_0" (llama.cpp's --cache-type-k names),
// "int4".
const char* kv_dtype_name(KVDtype dtype);
// The inverse, and NumPy's names float32, bfloat16 and float16; an unknown
// name is a ValueError listing the accepted ones.
KVDtype parse_kv_dtype(const std::string& name);
// Bytes that n values take in the dtype (n a multiple of 32 for the block
// types; for int4, n / 32 whole blocks).
int64_t kv_dtype_bytes(KVDtype dtype, int64_t n);

// n values (a multiple of 32) into n / 32 blocks: d = max|x| / 127 and
// q = round(x / d), computed as ggml's quantize_row_q8_0_ref does (d in
// float32, then rounded to fp16 for storage; an all-zero block has d = 0).
void quantize_row_q8_0(const float* x, block_q8_0* y, int64_t n);
// n values back: d · q.
void dequantize_row_q8_0(const block_q8_0* x, float* y, int64_t n);
// n values (a multiple of 32) into n / 32 blocks, as ggml's
// quantize_row_q4_0_ref: m the block's value of largest magnitude (the first
// such), d = m / −8, q = min(15, trunc(x / d + 8.5)) (d in float32, rounded
// to fp16 for storage; an all-zero block has d = 0): m is code 0, and the
// codes' values run from m to −7m/8.
void quantize_row_q4_0(const float* x, block_q4_0* y, int64_t n);
// n values back: d · (q − 8).
void dequantize_row_q4_0(const block_q4_0* x, float* y, int64_t n);

// `count` values (1 .. 32), `stride` apart, into one int4 block, as ggml's
// quantize_row_q4_1_ref: m the least, d = (max − m) / 15, q = min(15,
// trunc((x − m) / d + 0.5)) (d in float32, d and m rounded to fp16 for
// storage; equal values have d = 0); codes past count are 0. ValueError for
// a value that is not finite, or a range fp16 cannot hold (the caller adds
// where, catching it: that costs nothing when nothing is thrown).
void quantize_block_int4(const float* x, int64_t stride, int64_t count, block_int4& y);
// n values (a multiple of 32) of a row into n / 32 blocks (int4's values);
// a ValueError names the block's values.
void quantize_row_int4(const float* x, block_int4* y, int64_t n);
// n keys of d channels (contiguous rows; token `first` of their head the
// first) into ⌈n / 32⌉ groups of d blocks, (groups, d) (int4's keys of one
// head); a ValueError names the channel and the group's tokens.
void quantize_int4_key_rows(const float* k, int64_t n, int64_t d, block_int4* y, int64_t first = 0);
// Value i (0 .. 31) of a block: d · q + m (d · q is exact in float32, so this
// rounds once).
inline float int4_value(const block_int4& b, int64_t i) {
  const int byte = b.qs[i % (kInt4Group / 2)];
  const int q = i < kInt4Group / 2 ? byte & 0x0f : byte >> 4;
  return fp16_to_float(b.d.bits) * static_cast<float>(q) + fp16_to_float(b.m.bits);
}

// KIVI's layouts of whole tensors (any strides in; C-contiguous out): keys
// (..., n, d) into (..., ⌈n / 32⌉, d) blocks; values (..., n, d), d a
// multiple of 32, into (..., n, d / 32); and back (a key tensor's n given,
// its groups holding ⌈n / 32⌉ · 32 tokens).
Tensor<block_int4> quantize_int4_keys(TensorView<const float> k);
Tensor<block_int4> quantize_int4_values(TensorView<const float> v);
Tensor<float> dequantize_int4_keys(TensorView<const block_int4> k, int64_t n);
Tensor<float> dequantize_int4_values(TensorView<const block_int4> v);

// Whole tensors, along the last axis (any strides in; C-contiguous out).
// quantize_q8_0 needs a last axis that is a multiple of 32 and names it
// otherwise.
Tensor<block_q8_0> quantize_q8_0(TensorView<const float> x);
Tensor<block_q4_0> quantize_q4_0(TensorView<const float> x);
Tensor<bfloat16> to_bfloat16(TensorView<const float> x);
Tensor<float16> to_float16(TensorView<const float> x);
Tensor<float> dequantize(TensorView<const block_q8_0> x);  // (..., 32 · blocks)
Tensor<float> dequantize(TensorView<const block_q4_0> x);  // (..., 32 · blocks)
Tensor<float> dequantize(TensorView<const bfloat16> x);
Tensor<float> dequantize(TensorView<const float16> x);

}  // namespace attn
