// Internal: an attention call validated and normalized to (batch, head, row,
// col) operands, the one form both the reference and the fast kernel consume.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "attn/attention.hpp"

namespace attn::detail {

// One operand seen as (batch, head, row, col). Leading batch axes of any
// stride are flattened through a per-batch offset table.
template <class T>
struct Operand {
  T* data = nullptr;
  std::vector<int64_t> batch_offset;  // element offset of flattened batch index b
  int64_t head_stride = 0, row_stride = 0, col_stride = 0;

  T* row(int64_t b, int64_t h, int64_t i) const {
    return data + batch_offset[b] + h * head_stride + i * row_stride;
  }
  explicit operator bool() const { return data != nullptr; }
};

// The masks broadcast to (batch, Hq, n_q, n_k): a boolean one (false: the
// key takes no part, as if causal masking excluded it) and an additive one
// (float or double), either or both.
struct MaskOperand {
  Operand<const bool> boolean;
  Operand<const float> f32;
  Operand<const double> f64;

  bool allows(int64_t b, int64_t h, int64_t i, int64_t j) const {
    return !boolean || boolean.row(b, h, i)[j * boolean.col_stride];
  }
  double added(int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (f32) return f32.row(b, h, i)[j * f32.col_stride];
    if (f64) return f64.row(b, h, i)[j * f64.col_stride];
    return 0.0;
  }
  bool present() const { return boolean || f32 || f64; }
};

// How keys and values are stored (float32 problems only).
enum class KVStorage { Native, BF16, F16 };

template <class T>
struct AttentionProblem {
  int64_t batch = 1, heads_q = 1, heads_kv = 1, n_q = 0, n_k = 0, d = 0, d_v = 0;
  Operand<const T> q, k, v;            // k, v unset when kv != Native
  KVStorage kv = KVStorage::Native;
  Operand<const uint16_t> k16, v16;    // bfloat16 or fp16 bits when kv != Native
  Operand<T> out, weights;  // weights.data == nullptr when not requested
  MaskOperand mask;
  double scale = 1;
  Causal causal = Causal::None;
  Window window;
  double softcap = 0;

  int64_t group() const { return heads_q / heads_kv; }  // query heads per kv head
};

// Validates the arguments of attention() and builds the problem; every error
// names the argument and its shape. `keep`, when given, is a boolean mask
// applied on top of `mask` (which must then be additive or absent): the
// MultiHeadAttention layer's two PyTorch masks at once.
// KV is T, or bfloat16 / float16 with T = float.
template <class T, class KV>
AttentionProblem<T> make_problem(TensorView<const T> q, TensorView<const KV> k,
                                 TensorView<const KV> v, TensorView<T> out,
                                 const AttentionOptions& options, const Mask& mask,
                                 TensorView<T> weights, TensorView<const bool> keep = {});

// The gradients of attention: dout (the output's shape) in, dq, dk, dv (the
// shapes of q, k, v) out, as (batch, head, row, col) operands.
template <class T>
struct GradientOperands {
  Operand<const T> dout;
  Operand<T> dq, dk, dv;
};

// Validates the arguments of attention_backward() and builds the forward
// problem (without an output to write) and its gradient operands.
template <class T>
std::pair<AttentionProblem<T>, GradientOperands<T>> make_backward_problem(
    TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
    TensorView<const T> dout, TensorView<T> dq, TensorView<T> dk, TensorView<T> dv,
    const AttentionOptions& options, const Mask& mask, TensorView<const bool> keep = {});

// attention() and attention_backward() with `keep` as in make_problem: the
// entry of the MultiHeadAttention layer. T is float or double.
template <class T>
void masked_attention(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                      TensorView<T> out, const AttentionOptions& options, const Mask& mask,
                      TensorView<const bool> keep, TensorView<T> weights);
template <class T>
void masked_attention_backward(TensorView<const T> q, TensorView<const T> k,
                               TensorView<const T> v, TensorView<const T> dout, TensorView<T> dq,
                               TensorView<T> dk, TensorView<T> dv, const AttentionOptions& options,
                               const Mask& mask, TensorView<const bool> keep);

// The double-precision oracle: plain loops, accumulation in double.
void reference_attention(const AttentionProblem<double>& p);
// Output row (b, h, i) of a float32 problem computed the same way, in double:
// the kernels' answer for the rare rows their vector arithmetic cannot
// settle (a NaN or infinite value in an excluded key's value row).
void reference_attention_row(const AttentionProblem<float>& p, int64_t b, int64_t h, int64_t i,
                             float* out);
// Its backward (dq, dk, dv overwritten), recomputing the weights row by row.
void reference_attention_backward(const AttentionProblem<double>& p,
                                  const GradientOperands<double>& g);

}  // namespace attn::detail
