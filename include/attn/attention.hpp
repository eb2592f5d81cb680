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

#include <concepts>
#include <memory>
#include <optional>
#include <vector>

#include "attn/half.hpp"
#include "attn/mask.hpp"
#include "attn/quantize.hpp"
#include "attn/tensor.hpp"

namespace attn {

struct AttentionOptions {
  std::optional<double> scale;  // default 1/sqrt(d) (1 when d == 0)
  Causal causal = Causal::None;
  Window window;                // combines with causal and mask by intersection
  double softcap = 0;           // > 0: logits = softcap * tanh(logits / softcap)
  // ALiBi (alibi_slopes(Hq) of attn/positional.hpp gives BLOOM's): one slope
  // per query head, adding -slope[h] · (p - j) to the logits after softcap,
  // with the masks (p = i + n_k - n_q); computed per tile, never stored as
  // an n_q × n_k bias. Empty: none.
  std::vector<double> alibi_slopes;
};

// T, the element type of q and of the results, is float (the SIMD kernels)
// or double (the reference); KV, that of k and v, is T, or with T = float
// also bfloat16, float16 or block_q8_0 (attn/quantize.hpp): keys and values
// in half the memory and bandwidth, or 34 bytes per 32 values, read in place
// and widened to float32 as the kernels go. A q8_0 view's last axis counts
// blocks: k of logical shape (..., n_k, d) is a view (..., n_k, d / 32).
template <class T, class KV>
concept AttentionTypes =
    (std::same_as<T, float> &&
     (std::same_as<KV, float> || std::same_as<KV, bfloat16> || std::same_as<KV, float16> ||
      std::same_as<KV, block_q8_0>)) ||
    (std::same_as<T, double> && std::same_as<KV, double>);

namespace detail {
template <class T, class KV>
struct PreparedAttention;
}  // namespace detail

// One attention call validated once: the shapes, strides and element types
// of q, k, v and the mask, and the options; the output and weights shapes
// come from it. run() writes out (and weights unless it is an empty view),
// checking only their shapes; it may run any number of times, from any
// thread, while q, k, v and the mask stay alive and unchanged. attention() is
// a plan run once; build one to allocate the outputs first (as the Python
// module does).
template <class T, class KV = T>
  requires AttentionTypes<T, KV>
class AttentionPlan {
 public:
  AttentionPlan(TensorView<const T> q, TensorView<const KV> k, TensorView<const KV> v,
                const AttentionOptions& options = {}, const Mask& mask = {});
  const Shape& output_shape() const;   // (..., Hq, n_q, d_v)
  const Shape& weights_shape() const;  // (..., Hq, n_q, n_k)
  void run(TensorView<T> out, TensorView<T> weights = {}) const;

 private:
  std::shared_ptr<const detail::PreparedAttention<T, KV>> prepared_;
};

// The shapes attention() produces for these inputs (validating them).
Shape attention_output_shape(const Shape& q, const Shape& k, const Shape& v);
Shape attention_weights_shape(const Shape& q, const Shape& k, const Shape& v);

// Writes into out (and weights unless it is an empty view).
template <class T, class KV>
  requires AttentionTypes<T, KV>
void attention(TensorView<const T> q, TensorView<const KV> k, TensorView<const KV> v,
               TensorView<T> out, const AttentionOptions& options = {}, const Mask& mask = {},
               TensorView<T> weights = {});

// Allocating forms.
template <class T>
struct AttentionResult {
  Tensor<T> out;
  Tensor<T> weights;
};
template <class T, class KV>
  requires AttentionTypes<T, KV>
Tensor<T> attention(TensorView<const T> q, TensorView<const KV> k, TensorView<const KV> v,
                    const AttentionOptions& options = {}, const Mask& mask = {});
template <class T, class KV>
  requires AttentionTypes<T, KV>
AttentionResult<T> attention_with_weights(TensorView<const T> q, TensorView<const KV> k,
                                          TensorView<const KV> v,
                                          const AttentionOptions& options = {},
                                          const Mask& mask = {});

// The gradient of attention: given dout = dL/dout (the output's shape),
// writes dq, dk, dv (the shapes of q, k, v; overwritten) for the same inputs
// and options. With GQA a key/value head's gradient sums over the query heads
// that share it; a row with no allowed key contributes no gradient; a mask
// gets none (it is not learned). Computed in double (float32 converts in and
// out; a fast float32 kernel is future work).
template <Real T>
void attention_backward(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                        TensorView<const T> dout, TensorView<T> dq, TensorView<T> dk,
                        TensorView<T> dv, const AttentionOptions& options = {},
                        const Mask& mask = {});

template <class T>
struct AttentionGradients {
  Tensor<T> dq, dk, dv;
};
template <Real T>
AttentionGradients<T> attention_backward(TensorView<const T> q, TensorView<const T> k,
                                         TensorView<const T> v, TensorView<const T> dout,
                                         const AttentionOptions& options = {},
                                         const Mask& mask = {});

}  // namespace attn
