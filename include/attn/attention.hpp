// Scaled dot-product attention: softmax(Q Kᵀ · scale + mask) V — the
// article's "soft lookup", with the options of docs/semantics.md "Attention".
//
// Shapes: q (..., n_q, d), k (..., n_k, d), v (..., n_k, d_v), all of one rank.
// Rank 2 is a single head. At rank >= 3, axis -3 is heads: q has Hq heads and
// k, v have Hkv heads, Hq a multiple of Hkv (GQA/MQA: query head h reads
// key/value head h / (Hq / Hkv)). Leading axes are batch axes and must match.
// out is (..., Hq, n_q, d_v); the extras, when asked for: weights and logits
// (..., Hq, n_q, n_k), the log-sum-exp (..., Hq, n_q).
//
// float32 runs the fast kernel; float64 runs the double-precision reference.
// Any view may be strided (including the transposed head slices that
// multi_head() passes); the outputs must not overlap the inputs.
#pragma once

#include <concepts>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attn/half.hpp"
#include "attn/mask.hpp"
#include "attn/quantize.hpp"
#include "attn/tensor.hpp"

namespace attn {

// The arithmetic of the float32 prefill's two products, Q·Kᵀ and P·V.
// BF16: Q, K, V and the softmax's weights P rounded to bfloat16 (nearest,
// ties to even), their products summed in float32, the softmax itself in
// float32: PyTorch's and FlashAttention's bf16 attention, whose products
// the CPU's bf16 units compute (docs/semantics.md "Precision"). The
// decode path (few queries, bound by memory, not arithmetic) stays float32,
// but for Int8 over q8_0 keys.
// Int8 (SageAttention's recipe): Q·Kᵀ on each query row, and each key row
// less the mean of its head's keys, quantized to int8 with one scale per
// row (symmetric: scale = max |x| / 127), the mean added back (so the
// scores, the log-sum-exp and sinks keep their meaning); P·V as BF16's.
// In decode over q8_0 keys (llama.cpp's vec_dot_q8_0_q8_0): Q·K of each
// query row rounded to q8_0 and the keys' own codes, summed exactly per
// block on the int8 unit; P·V float32.
enum class Precision { Float32, BF16, Int8 };
// Parses "f32", "bf16" or "int8"; ValueError naming them otherwise.
Precision parse_precision(const std::string& name);
std::string precision_name(Precision precision);
// What computes the prefill's products in that precision on this CPU:
// "avx512_bf16" (x86's VDPBF16PS) or "neon_bf16" (Arm's BFDOT), for BF16
// where the CPU has it and it outruns the float32 FMAs (timed once per
// process, docs/semantics.md "Precision"); "avx512_vnni" (x86's VPDPBUSD)
// or "neon_dotprod" (Arm's SDOT) for Int8's Q·Kᵀ where the CPU has it; or
// "highway" (the float32 FMAs, on the rounded or quantized values for BF16
// and Int8). Int8's P·V, being BF16's, runs on what
// precision_unit(Precision::BF16) names.
std::string precision_unit(Precision precision);
// What computes decode's Q·K in that precision (Int8 over q8_0 keys: calls
// of at most 8 query rows against many keys) at rows_per_kv_head query rows
// per KV head (GQA group × queries): precision_unit(Int8)'s unit from 8
// rows up, "highway" below, where the unit's packing costs more than it
// saves (docs/semantics.md "Precision"); precision_unit's answer otherwise.
std::string decode_precision_unit(Precision precision, int64_t rows_per_kv_head);
// A benchmark's ceiling for a precision (what `attn bench` divides a kernel's
// rate by): `iterations` rounds of independent multiply-adds on registers, on
// the calling thread, on the unit that computes that precision's products
// at their fastest here: the float32 FMAs of the best SIMD target (Float32),
// the bf16 unit (BF16: VDPBF16PS, BFDOT) or the int8 unit (Int8: VPDPBUSD,
// SDOT), whether precision_unit chooses it or not. Returns the operations
// done (a multiply and its add count 2), 0 where the CPU has no such unit;
// the loop's result goes to *sink, so that no compiler drops it.
double precision_peak_loop(Precision precision, int64_t iterations, float* sink);

struct AttentionOptions {
  std::optional<double> scale;  // default 1/sqrt(d) (1 when d == 0)
  Causal causal = Causal::None;  // or Causal::offset(k), |k| <= Causal::kMaxOffset
  Window window;                // combines with causal and mask by intersection
  double softcap = 0;           // > 0: logits = softcap * tanh(logits / softcap)
  // ALiBi (alibi_slopes(Hq) of attn/positional.hpp gives BLOOM's): one slope
  // per query head, adding -slope[h] · (p - j) to the logits after softcap,
  // with the masks (p: the query's position, Causal::position); computed per tile, never stored as
  // an n_q × n_k bias. Empty: none.
  std::vector<double> alibi_slopes;
  // Attention sinks (gpt-oss): one logit per query head, included in every
  // row's softmax denominator as a key of value zero would be: used as given
  // (neither scaled nor softcapped), it takes weight from the row's keys
  // (their weights then sum below 1) and enters the log-sum-exp. Empty: none.
  std::vector<double> sinks;
  Precision precision = Precision::Float32;  // BF16, Int8: float32 inputs, the forward only
};

// The logits attention can return beside its output, by how far they have
// gone through attn's order scale → softcap → mask: scale · q·k ("scaled"),
// then softcap · tanh(· / softcap) ("softcapped"; the same without softcap),
// then plus the additive masks and ALiBi's bias, −∞ for an excluded key
// ("masked": what the softmax takes).
enum class Logits { Scaled, Softcapped, Masked };
// Parses "scaled", "softcapped" or "masked"; ValueError naming them otherwise.
Logits parse_logits(const std::string& name);

// The extra outputs of one call, each written when its view is not empty:
//   weights  (..., Hq, n_q, n_k) the softmax of the masked logits
//   logits   (..., Hq, n_q, n_k) the logits at logits_stage
//   lse      (..., Hq, n_q)      log Σ_j exp(masked logit): the log of each
//            row's softmax denominator, −∞ for a row with no allowed key
//            (what a backward or a merge of partial results needs)
template <class T>
struct AttentionExtras {
  TensorView<T> weights;
  TensorView<T> logits;
  Logits logits_stage = Logits::Masked;
  TensorView<T> lse;
};

// T, the element type of q and of the results, is float (the SIMD kernels)
// or double (the reference); KV, that of k and v, is T, or with T = float
// also bfloat16, float16, block_q8_0 or block_q4_0 (attn/quantize.hpp):
// keys and values in half the memory and bandwidth, or 34 (q8_0) or 18
// (q4_0) bytes per 32 values, read in place and widened to float32 as the
// kernels go. A block type's view's last axis counts blocks: k of logical
// shape (..., n_k, d) is a view (..., n_k, d / 32).
template <class T, class KV>
concept AttentionTypes =
    (std::same_as<T, float> &&
     (std::same_as<KV, float> || std::same_as<KV, bfloat16> || std::same_as<KV, float16> ||
      std::same_as<KV, block_q8_0> || std::same_as<KV, block_q4_0>)) ||
    (std::same_as<T, double> && std::same_as<KV, double>);

// What the forward (AttentionPlan, attention()) takes: AttentionTypes, and
// with T = float KIVI's int4 (block_int4), whose keys are stored per
// channel in groups of 32 tokens: k (..., ⌈n_k / 32⌉, d) and v
// (..., n_k, d_v / 32), as quantize_int4_keys and quantize_int4_values give
// them (attn/quantize.hpp), n_k taken from v; read in place, as the other
// storage types are.
template <class T, class KV>
concept ForwardTypes = AttentionTypes<T, KV> || (std::same_as<T, float> && std::same_as<KV, block_int4>);

// Checks options against a call of `query_heads` query heads on inputs of
// element type T, as every attention call does first: a ValueError naming
// the option (a scale, softcap or window out of range, alibi_slopes or sinks
// not one finite number per query head, a precision other than f32 for
// float64). For a caller that must not act on bad options, such as a layer
// about to append to its cache.
template <class T>
void check_attention_options(const AttentionOptions& options, int64_t query_heads);

// One attention call validated once: the shapes, strides and element types
// of q, k, v and the masks, and the options; the shapes of the output and
// the extras come from it. run() writes out (and each extra whose view is not
// empty), checking their shapes, and that none shares memory with q, k, v,
// the masks, another output or itself (ValueError naming both: check_outputs,
// attn/tensor.hpp); it may run any number of times, from any thread, while
// q, k, v and the masks stay alive and unchanged. This is the forward into
// caller memory; attention() below is the allocating one.
template <class T, class KV = T>
  requires ForwardTypes<T, KV>
class AttentionPlan {
 public:
  AttentionPlan(TensorView<const T> q, TensorView<const KV> k, TensorView<const KV> v,
                const AttentionOptions& options = {}, const AttentionMasks& masks = {});
  const Shape& output_shape() const;   // (..., Hq, n_q, d_v)
  const Shape& weights_shape() const;  // (..., Hq, n_q, n_k), also the logits'
  const Shape& lse_shape() const;      // (..., Hq, n_q)
  void run(TensorView<T> out, const AttentionExtras<T>& extras = {}) const;

 private:
  struct Prepared;  // the validated problem (src/api/attention.cc)
  std::shared_ptr<const Prepared> prepared_;
};

// The shapes attention() produces for these inputs (validating them).
Shape attention_output_shape(const Shape& q, const Shape& k, const Shape& v);
Shape attention_weights_shape(const Shape& q, const Shape& k, const Shape& v);

// The output of a plan of these arguments, allocated. (The extras: a plan,
// with views of the sizes it gives.)
template <class T, class KV>
  requires ForwardTypes<T, KV>
Tensor<T> attention(TensorView<const T> q, TensorView<const KV> k, TensorView<const KV> v,
                    const AttentionOptions& options = {}, const AttentionMasks& masks = {});

// What a forward pass keeps for its backward: its output and its
// log-sum-exp (AttentionExtras::lse), both from attention() with the same
// inputs and options. Given to attention_backward, the gradient is taken
// from them, P = exp(logits - lse) and dout · out for each row's
// Σ_j P_j (dout · v_j), by the float32 kernel (which does not run the
// forward again) and the reference alike; empty, the forward is run. Saved
// from a problem with more keys (the same queries and options), the
// backward gives this block of keys' share of that problem's gradient, as
// ring attention's backward (attn/dist.hpp) needs.
template <class T>
struct SavedForward {
  TensorView<const T> out;  // (..., Hq, n_q, d_v)
  TensorView<const T> lse;  // (..., Hq, n_q)
};

// The gradient of attention: given dout = dL/dout (the output's shape),
// writes dq, dk, dv (the shapes of q, k, v, logical for q8_0: a float32
// gradient per value; overwritten) for the same inputs and options, and with
// sinks their gradient into dsinks (Hq,) unless it is an empty view. With GQA
// a key/value head's gradient sums over the query heads that share it, in
// head order; a row with no allowed key contributes no gradient to q, k, v; a
// mask gets none (it is not learned). K and V stored in 16 or 8 bits get the
// gradient with respect to their float32 values.
//
// float32 runs the fused kernel: P recomputed tile by tile from the saved
// log-sum-exp (extra memory O(n), never n_q × n_k), results bitwise equal
// for any number of threads. A problem with a NaN or an infinity in q, k, v,
// dout or the output goes to the double reference instead, as does float64.
template <class T, class KV>
  requires AttentionTypes<T, KV>
void attention_backward(TensorView<const T> q, TensorView<const KV> k, TensorView<const KV> v,
                        TensorView<const T> dout, TensorView<T> dq, TensorView<T> dk,
                        TensorView<T> dv, const AttentionOptions& options = {},
                        const AttentionMasks& masks = {}, TensorView<T> dsinks = {},
                        const SavedForward<T>& saved = {});

template <class T>
struct AttentionGradients {
  Tensor<T> dq, dk, dv;
  Tensor<T> dsinks;  // (Hq,) with sinks; empty otherwise
};
template <class T, class KV>
  requires AttentionTypes<T, KV>
AttentionGradients<T> attention_backward(TensorView<const T> q, TensorView<const KV> k,
                                         TensorView<const KV> v, TensorView<const T> dout,
                                         const AttentionOptions& options = {},
                                         const AttentionMasks& masks = {},
                                         const SavedForward<T>& saved = {});

}  // namespace attn
