#include "attn/quantize.hpp"

#include <cmath>
#include <algorithm>

#include "attn/error.hpp"

namespace attn {

const char* kv_dtype_name(KVDtype dtype) {
  switch (dtype) {
    case KVDtype::F32: return "f32";
    case KVDtype::BF16: return "bf16";
    case KVDtype::F16: return "f16";
    case KVDtype::Q8_0: return "q8_0";
    case KVDtype::Q4_0: return "q4_0";
    case KVDtype::INT4: return "int4";
  }
  return "?";
}

KVDtype parse_kv_dtype(const std::string& name) {
  for (KVDtype t : {KVDtype::F32, KVDtype::BF16, KVDtype::F16, KVDtype::Q8_0, KVDtype::Q4_0, KVDtype::INT4})
    if (name == kv_dtype_name(t)) return t;
  // NumPy's and PyTorch's names of the same types.
  if (name == "float32") return KVDtype::F32;
  if (name == "bfloat16") return KVDtype::BF16;
  if (name == "float16") return KVDtype::F16;
  throw ValueError("unknown K/V dtype '" + name + "': expected f32, bf16, f16, q8_0, q4_0 or int4 (or float32, bfloat16, float16)");
}

int64_t kv_dtype_bytes(KVDtype dtype, int64_t n) {
  switch (dtype) {
    case KVDtype::F32: return 4 * n;
    case KVDtype::BF16:
    case KVDtype::F16: return 2 * n;
    case KVDtype::Q8_0: return n / kQ8_0Block * static_cast<int64_t>(sizeof(block_q8_0));
    case KVDtype::Q4_0: return n / kQ4_0Block * static_cast<int64_t>(sizeof(block_q4_0));
    case KVDtype::INT4: return n / kInt4Group * static_cast<int64_t>(sizeof(block_int4));
  }
  return 0;
}

namespace {

// The value of largest magnitude of block b (32 values at x), the first of
// equal ones; ValueError for a value that is not finite.
float block_extreme(const float* x, int64_t b, const char* dtype) {
  float amax = 0.0f, m = 0.0f;
  for (int64_t j = 0; j < 32; ++j) {
    if (!std::isfinite(x[j]))
      throw ValueError(std::string("quantize ") + dtype + ": value " + std::to_string(x[j]) + " at index " +
                       std::to_string(b * 32 + j) + " of the row cannot be stored (" + dtype +
                       " holds finite values only)");
    if (std::fabs(x[j]) > amax) amax = std::fabs(x[j]), m = x[j];
  }
  return m;
}

// d's fp16 bits; ValueError when d overflows fp16 (max: the block's value of
// largest magnitude, `limit` the largest it may be).
uint16_t block_scale(float d, float max, int64_t b, const char* dtype, const char* limit) {
  const uint16_t d16 = float_to_fp16(d);
  if ((d16 & 0x7fffu) == 0x7c00u)
    throw ValueError(std::string("quantize ") + dtype + ": |x| up to " + std::to_string(std::fabs(max)) +
                     " in the block at index " + std::to_string(b * 32) + " of the row overflows its fp16 scale (|x| <= " +
                     limit + ")");
  return d16;
}

}  // namespace

void quantize_row_q8_0(const float* x, block_q8_0* y, int64_t n) {
  for (int64_t b = 0; b < n / kQ8_0Block; ++b, x += kQ8_0Block) {
    const float m = block_extreme(x, b, "q8_0");
    const float d = std::fabs(m) / 127.0f;
    y[b].d.bits = block_scale(d, m, b, "q8_0", "65504 · 127");
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int64_t j = 0; j < kQ8_0Block; ++j) y[b].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
  }
}

void quantize_row_q4_0(const float* x, block_q4_0* y, int64_t n) {
  constexpr int64_t half = kQ4_0Block / 2;
  for (int64_t b = 0; b < n / kQ4_0Block; ++b, x += kQ4_0Block) {
    const float m = block_extreme(x, b, "q4_0");
    const float d = m / -8.0f;
    y[b].d.bits = block_scale(d, m, b, "q4_0", "65504 · 8");
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    // x / d + 8.5 lies in [0.5, 16.5]: the cast truncates as ggml's does.
    const auto code = [&](float v) { return static_cast<uint8_t>(std::min(15, static_cast<int>(v * id + 8.5f))); };
    for (int64_t j = 0; j < half; ++j) y[b].qs[j] = static_cast<uint8_t>(code(x[j]) | code(x[j + half]) << 4);
  }
}

void dequantize_row_q4_0(const block_q4_0* x, float* y, int64_t n) {
  constexpr int64_t half = kQ4_0Block / 2;
  for (int64_t b = 0; b < n / kQ4_0Block; ++b) {
    const float d = fp16_to_float(x[b].d.bits);
    for (int64_t j = 0; j < half; ++j) {
      y[b * kQ4_0Block + j] = d * static_cast<float>((x[b].qs[j] & 0x0f) - 8);
      y[b * kQ4_0Block + j + half] = d * static_cast<float>((x[b].qs[j] >> 4) - 8);
    }
  }
}

void dequantize_row_q8_0(const block_q8_0* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQ8_0Block; ++b) {
    const float d = fp16_to_float(x[b].d.bits);
    for (int64_t j = 0; j < kQ8_0Block; ++j) y[b * kQ8_0Block + j] = d * x[b].qs[j];
  }
}

void quantize_block_int4(const float* x, int64_t stride, int64_t count, block_int4& y) {
  float lo = x[0], hi = x[0];
  for (int64_t i = 0; i < count; ++i) {
    const float v = x[i * stride];
    if (!std::isfinite(v))
      throw ValueError("quantize int4: value " + std::to_string(v) + " at index " + std::to_string(i) +
                       " of its block cannot be stored (int4 holds finite values only)");
    lo = std::min(lo, v), hi = std::max(hi, v);
  }
  const float d = (hi - lo) / 15.0f;
  const uint16_t d16 = float_to_fp16(d), m16 = float_to_fp16(lo);
  if ((d16 & 0x7fffu) == 0x7c00u || (m16 & 0x7fffu) == 0x7c00u || !std::isfinite(d))
    throw ValueError("quantize int4: values from " + std::to_string(lo) + " to " + std::to_string(hi) +
                     " overflow the block's fp16 scale or minimum (least >= -65504, range <= 65504 · 15)");
  y.d.bits = d16;
  y.m.bits = m16;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  // (x − m) / d + 0.5 lies in [0.5, 15.5 + rounding]: the cast truncates as ggml's does.
  const auto code = [&](int64_t i) {
    return i < count ? std::min(15, static_cast<int>((x[i * stride] - lo) * id + 0.5f)) : 0;
  };
  constexpr int64_t half = kInt4Group / 2;
  for (int64_t j = 0; j < half; ++j) y.qs[j] = static_cast<uint8_t>(code(j) | code(j + half) << 4);
}

void quantize_row_int4(const float* x, block_int4* y, int64_t n) {
  for (int64_t b = 0; b < n / kInt4Group; ++b) try {
      quantize_block_int4(x + b * kInt4Group, 1, kInt4Group, y[b]);
    } catch (const ValueError& e) {
      throw ValueError(std::string(e.what()) + " (values " + std::to_string(b * kInt4Group) + " .. " +
                       std::to_string(b * kInt4Group + 31) + " of a row)");
    }
}

namespace {

// Calls row(src, dst) for every row of x (its last axis), in and out
// contiguous; out has x's shape with the last axis `out_cols`.
template <class Out, class Row>
Tensor<Out> by_rows(TensorView<const float> x, int64_t out_cols, Row row) {
  const Tensor<float> c = contiguous(x);
  Shape shape = x.shape();
  if (shape.empty()) shape.push_back(1);
  const int64_t cols = shape.back();
  shape.back() = out_cols;
  Tensor<Out> out(shape);
  if (x.rank() == 0) out = std::move(out).reshape({});
  const int64_t rows = cols == 0 ? 0 : c.numel() / cols;
  for (int64_t r = 0; r < rows; ++r) row(c.data() + r * cols, out.data() + r * out_cols, cols);
  return out;
}

template <class Half>
Tensor<Half> to_half(TensorView<const float> x, uint16_t (*to_bits)(float)) {
  return by_rows<Half>(x, x.rank() ? x.dim(-1) : 1, [&](const float* s, Half* d, int64_t n) {
    for (int64_t j = 0; j < n; ++j) d[j].bits = to_bits(s[j]);
  });
}

template <class Half>
Tensor<float> from_half(TensorView<const Half> x, float (*from_bits)(uint16_t)) {
  Tensor<float> out(x.shape());
  const Tensor<Half> c = contiguous(x);
  for (int64_t i = 0; i < c.numel(); ++i) out[i] = from_bits(c[i].bits);
  return out;
}

template <class Block>
Tensor<Block> to_blocks(TensorView<const float> x, const char* dtype, void (*row)(const float*, Block*, int64_t)) {
  if (x.rank() == 0 || x.dim(-1) % kBlockValues<Block> != 0)
    throw ValueError(std::string("quantize ") + dtype + ": the last axis must be a multiple of 32 (blocks of 32 "
                     "values), got shape " + shape_str(x.shape()));
  return by_rows<Block>(x, x.dim(-1) / kBlockValues<Block>, row);
}

template <class Block>
Tensor<float> from_blocks(TensorView<const Block> x, const char* dtype, void (*row)(const Block*, float*, int64_t)) {
  if (x.rank() == 0)
    throw ValueError(std::string("dequantize ") + dtype + ": expected blocks along a last axis, got a scalar");
  Shape shape = x.shape();
  shape.back() *= kBlockValues<Block>;
  Tensor<float> out(shape);
  const Tensor<Block> c = contiguous(x);
  row(c.data(), out.data(), out.numel());
  return out;
}

}  // namespace

Tensor<block_q8_0> quantize_q8_0(TensorView<const float> x) { return to_blocks(x, "q8_0", quantize_row_q8_0); }
Tensor<block_q4_0> quantize_q4_0(TensorView<const float> x) { return to_blocks(x, "q4_0", quantize_row_q4_0); }

Tensor<block_int4> quantize_int4_keys(TensorView<const float> k) {
  if (k.rank() < 2) throw ValueError("quantize_int4_keys: k must be (..., n, d), got shape " + shape_str(k.shape()));
  const Tensor<float> c = contiguous(k);
  const int64_t n = k.dim(-2), d = k.dim(-1), groups = (n + kInt4Group - 1) / kInt4Group;
  Shape shape = k.shape();
  shape[shape.size() - 2] = groups;
  Tensor<block_int4> out(shape);
  const int64_t heads = n * d == 0 ? 0 : c.numel() / (n * d);
  for (int64_t h = 0; h < heads; ++h) quantize_int4_key_rows(c.data() + h * n * d, n, d, out.data() + h * groups * d);
  return out;
}

void quantize_int4_key_rows(const float* k, int64_t n, int64_t d, block_int4* y, int64_t first) {
  for (int64_t g = 0; g * kInt4Group < n; ++g)
    for (int64_t ch = 0; ch < d; ++ch) try {
        quantize_block_int4(k + g * kInt4Group * d + ch, d, std::min(kInt4Group, n - g * kInt4Group), y[g * d + ch]);
      } catch (const ValueError& e) {
        throw ValueError(std::string(e.what()) + " (channel " + std::to_string(ch) + " of keys " +
                         std::to_string(first + g * kInt4Group) + " .. " +
                         std::to_string(first + std::min(n, (g + 1) * kInt4Group) - 1) + ")");
      }
}

Tensor<block_int4> quantize_int4_values(TensorView<const float> v) { return to_blocks(v, "int4", quantize_row_int4); }

namespace {

// The block's 32 values, int4_value(b, 0 .. 31), its scale and minimum
// converted from fp16 once.
void dequantize_block_int4(const block_int4& b, float* y) {
  const float d = fp16_to_float(b.d.bits), m = fp16_to_float(b.m.bits);
  for (int64_t i = 0; i < kInt4Group / 2; ++i) {
    y[i] = d * static_cast<float>(b.qs[i] & 0x0f) + m;
    y[i + kInt4Group / 2] = d * static_cast<float>(b.qs[i] >> 4) + m;
  }
}

}  // namespace

Tensor<float> dequantize_int4_keys(TensorView<const block_int4> k, int64_t n) {
  const int64_t groups = k.rank() >= 2 ? k.dim(-2) : -1;
  if (n < 0 || groups != (n + kInt4Group - 1) / kInt4Group)
    throw ValueError("dequantize_int4_keys: k must be (..., ⌈n / 32⌉, d) blocks for n = " + std::to_string(n) +
                     " keys, got shape " + shape_str(k.shape()));
  const Tensor<block_int4> c = contiguous(k);
  const int64_t d = k.dim(-1);
  Shape shape = k.shape();
  shape[shape.size() - 2] = n;
  Tensor<float> out(shape);
  const int64_t heads = groups * d == 0 ? 0 : c.numel() / (groups * d);
  float tokens[kInt4Group];
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t ch = 0; ch < d; ++ch) {
        dequantize_block_int4(c.data()[(h * groups + g) * d + ch], tokens);
        for (int64_t t = 0; t < std::min(kInt4Group, n - g * kInt4Group); ++t)
          out.data()[(h * n + g * kInt4Group + t) * d + ch] = tokens[t];
      }
  return out;
}

Tensor<float> dequantize_int4_values(TensorView<const block_int4> v) {
  if (v.rank() == 0) throw ValueError("dequantize_int4_values: expected blocks along a last axis, got a scalar");
  Shape shape = v.shape();
  shape.back() *= kInt4Group;
  Tensor<float> out(shape);
  const Tensor<block_int4> c = contiguous(v);
  for (int64_t i = 0; i < c.numel(); ++i) dequantize_block_int4(c.data()[i], out.data() + i * kInt4Group);
  return out;
}

Tensor<bfloat16> to_bfloat16(TensorView<const float> x) { return to_half<bfloat16>(x, float_to_bf16); }
Tensor<float16> to_float16(TensorView<const float> x) { return to_half<float16>(x, float_to_fp16); }

Tensor<float> dequantize(TensorView<const block_q8_0> x) { return from_blocks(x, "q8_0", dequantize_row_q8_0); }
Tensor<float> dequantize(TensorView<const block_q4_0> x) { return from_blocks(x, "q4_0", dequantize_row_q4_0); }

Tensor<float> dequantize(TensorView<const bfloat16> x) { return from_half(x, bf16_to_float); }
Tensor<float> dequantize(TensorView<const float16> x) { return from_half(x, fp16_to_float); }

}  // namespace attn
