// Internal to the layer room: rows of float32 keys and values in a cache's
// storage type (float32, bfloat16, fp16, q8_0 or q4_0 blocks, int4's value
// rows), for KVCache and PagedKVCache alike.
#pragma once

#include <cstdint>
#include <type_traits>

#include "attn/half.hpp"
#include "attn/quantize.hpp"

namespace attn::detail {

// Storage elements per row of `cols` values.
template <class S>
int64_t row_elements(int64_t cols) {
  return cols / kBlockValues<S>;
}

// One row of cols values (contiguous) in the storage type (not float:
// copied as it is). q8_0 and q4_0 throw ValueError for a value they cannot
// hold.
template <class S>
void store_row(const float* x, S* out, int64_t cols) {
  if constexpr (std::is_same_v<S, block_q8_0>) quantize_row_q8_0(x, out, cols);
  else if constexpr (std::is_same_v<S, block_q4_0>) quantize_row_q4_0(x, out, cols);
  else if constexpr (std::is_same_v<S, block_int4>) quantize_row_int4(x, out, cols);
  else if constexpr (std::is_same_v<S, bfloat16>) for (int64_t c = 0; c < cols; ++c) out[c].bits = float_to_bf16(x[c]);
  else for (int64_t c = 0; c < cols; ++c) out[c].bits = float_to_fp16(x[c]);
}

// The inverse: one stored row of cols values widened to float32.
template <class S>
void widen_row(const S* x, float* out, int64_t cols) {
  if constexpr (std::is_same_v<S, float>) for (int64_t c = 0; c < cols; ++c) out[c] = x[c];
  else if constexpr (std::is_same_v<S, block_q8_0>) dequantize_row_q8_0(x, out, cols);
  else if constexpr (std::is_same_v<S, block_q4_0>) dequantize_row_q4_0(x, out, cols);
  else if constexpr (std::is_same_v<S, block_int4>) for (int64_t c = 0; c < cols; ++c) out[c] = int4_value(x[c / kInt4Group], c % kInt4Group);
  else if constexpr (std::is_same_v<S, bfloat16>) for (int64_t c = 0; c < cols; ++c) out[c] = bf16_to_float(x[c].bits);
  else for (int64_t c = 0; c < cols; ++c) out[c] = fp16_to_float(x[c].bits);
}

}  // namespace attn::detail
