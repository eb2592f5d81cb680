// Compact storage for keys and values: bfloat16 and fp16 (attn/half.hpp)
// and GGUF's 8-bit and 4-bit blocks (q8_0, q4_0), with the conversions into
// and out of them.
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
template <class S>
inline constexpr bool kIsBlockType = kBlockValues<S> > 1;

// The storage types of keys and values (with float32 queries).
enum class KVDtype { F32, BF16, F16, Q8_0, Q4_0 };

// Whether the dtype stores blocks of 32 values (q8_0, q4_0): rows must be
// multiples of 32 long.
constexpr bool is_block_dtype(KVDtype dtype) { return dtype == KVDtype::Q8_0 || dtype == KVDtype::Q4_0; }

// "f32", "bf16", "f16", "q8_0", "q4_0" (llama.cpp's --cache-type-k names).
const char* kv_dtype_name(KVDtype dtype);
// The inverse, and NumPy's names float32, bfloat16 and float16; an unknown
// name is a ValueError listing the accepted ones.
KVDtype parse_kv_dtype(const std::string& name);
// Bytes that n values take in the dtype (n a multiple of 32 for q8_0, q4_0).
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
