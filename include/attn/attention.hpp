// Scaled dot-product attention: softmax(Q Kᵀ · scale + mask) V — the
// article's "soft lookup", with the options of docs/semantics.md "Attention".
//
// Shapes: q (..., n_q, d), k (..., n_k, d), v (..., n_k, d_v), all of one rank.
// Rank 2 is a single head. At rank >= 3, axis -3 is heads: q has Hq heads and
// k, v have Hkv heads, Hq a multiple of Hkv (GQA/MQA: query head h reads
// key/value head h / (Hq / Hkv)). Leading axes are batch axes and must match.
// out is (..., Hq, n_q, d_v); weights, when asked for, (..., Hq, n_q, n_k).
//
// float32 runs the fast kernel; float64 runs the double-precision reference.
// Any view may be strided (including the transposed head slices that
// multi_head() passes); out and weights must not overlap the inputs.
#pragma once

#include <optional>

#include "attn/half.hpp"
#include "attn/mask.hpp"
#include "attn/tensor.hpp"

namespace attn {

struct AttentionOptions {
  std::optional<double> scale;  // default 1/sqrt(d) (1 when d == 0)
  Causal causal = Causal::None;
  Window window;                // combines with causal and mask by intersection
  double softcap = 0;           // > 0: logits = softcap * tanh(logits / softcap)
};

// The shapes attention() produces for these inputs (validating them).
Shape attention_output_shape(const Shape& q, const Shape& k, const Shape& v);
Shape attention_weights_shape(const Shape& q, const Shape& k, const Shape& v);

// Writes into out (and weights unless it is an empty view).
void attention(TensorView<const float> q, TensorView<const float> k,
               TensorView<const float> v, TensorView<float> out,
               const AttentionOptions& options = {}, const Mask& mask = {},
               TensorView<float> weights = {});
void attention(TensorView<const double> q, TensorView<const double> k,
               TensorView<const double> v, TensorView<double> out,
               const AttentionOptions& options = {}, const Mask& mask = {},
               TensorView<double> weights = {});

// Keys and values stored as bfloat16 or fp16 (half the memory and bandwidth);
// computation is float32.
void attention(TensorView<const float> q, TensorView<const bfloat16> k,
               TensorView<const bfloat16> v, TensorView<float> out,
               const AttentionOptions& options = {}, const Mask& mask = {},
               TensorView<float> weights = {});
void attention(TensorView<const float> q, TensorView<const float16> k,
               TensorView<const float16> v, TensorView<float> out,
               const AttentionOptions& options = {}, const Mask& mask = {},
               TensorView<float> weights = {});

// Allocating forms.
template <class T>
struct AttentionResult {
  Tensor<T> out;
  Tensor<T> weights;
};
Tensor<float> attention(TensorView<const float> q, TensorView<const float> k,
                        TensorView<const float> v,
                        const AttentionOptions& options = {}, const Mask& mask = {});
Tensor<double> attention(TensorView<const double> q, TensorView<const double> k,
                         TensorView<const double> v,
                         const AttentionOptions& options = {}, const Mask& mask = {});
AttentionResult<float> attention_with_weights(
    TensorView<const float> q, TensorView<const float> k, TensorView<const float> v,
    const AttentionOptions& options = {}, const Mask& mask = {});
AttentionResult<double> attention_with_weights(
    TensorView<const double> q, TensorView<const double> k,
    TensorView<const double> v, const AttentionOptions& options = {},
    const Mask& mask = {});

// The gradient of attention: given dout = dL/dout (the output's shape),
// writes dq, dk, dv (the shapes of q, k, v; overwritten) for the same inputs
// and options. With GQA a key/value head's gradient sums over the query heads
// that share it; a row with no allowed key contributes no gradient; a mask
// gets none (it is not learned). Computed in double (float32 converts in and
// out; a fast float32 kernel is future work).
void attention_backward(TensorView<const float> q, TensorView<const float> k,
                        TensorView<const float> v, TensorView<const float> dout,
                        TensorView<float> dq, TensorView<float> dk, TensorView<float> dv,
                        const AttentionOptions& options = {}, const Mask& mask = {});
void attention_backward(TensorView<const double> q, TensorView<const double> k,
                        TensorView<const double> v, TensorView<const double> dout,
                        TensorView<double> dq, TensorView<double> dk, TensorView<double> dv,
                        const AttentionOptions& options = {}, const Mask& mask = {});

template <class T>
struct AttentionGradients {
  Tensor<T> dq, dk, dv;
};
AttentionGradients<float> attention_backward(TensorView<const float> q,
                                             TensorView<const float> k,
                                             TensorView<const float> v,
                                             TensorView<const float> dout,
                                             const AttentionOptions& options = {},
                                             const Mask& mask = {});
AttentionGradients<double> attention_backward(TensorView<const double> q,
                                              TensorView<const double> k,
                                              TensorView<const double> v,
                                              TensorView<const double> dout,
                                              const AttentionOptions& options = {},
                                              const Mask& mask = {});

}  // namespace attn
