// Compact storage for keys and values: bfloat16 and fp16 (attn/half.hpp)
// and GGUF's 8-bit blocks (q8_0), with the conversions into and out of them.
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

// The storage types of keys and values (with float32 queries).
enum class KVDtype { F32, BF16, F16, Q8_0 };

// "f32", "bf16", "f16", "q8_0" (llama.cpp's --cache-type-k names).
const char* kv_dtype_name(KVDtype dtype);
// The inverse, and NumPy's names float32, bfloat16 and float16; an unknown
// name is a ValueError listing the accepted ones.
KVDtype parse_kv_dtype(const std::string& name);
// Bytes that n values take in the dtype (n a multiple of 32 for q8_0).
int64_t kv_dtype_bytes(KVDtype dtype, int64_t n);

// n values (a multiple of 32) into n / 32 blocks: d = max|x| / 127 and
// q = round(x / d), computed as ggml's quantize_row_q8_0_ref does (d in
// float32, then rounded to fp16 for storage; an all-zero block has d = 0).
void quantize_row_q8_0(const float* x, block_q8_0* y, int64_t n);
// n values back: d · q.
void dequantize_row_q8_0(const block_q8_0* x, float* y, int64_t n);

// Whole tensors, along the last axis (any strides in; C-contiguous out).
// quantize_q8_0 needs a last axis that is a multiple of 32 and names it
// otherwise.
Tensor<block_q8_0> quantize_q8_0(TensorView<const float> x);
Tensor<bfloat16> to_bfloat16(TensorView<const float> x);
Tensor<float16> to_float16(TensorView<const float> x);
Tensor<float> dequantize(TensorView<const block_q8_0> x);  // (..., 32 · blocks)
Tensor<float> dequantize(TensorView<const bfloat16> x);
Tensor<float> dequantize(TensorView<const float16> x);

}  // namespace attn
