// Partial attention results combined by their log-sum-exps: FlashInfer's
// merge_state, merge_state_in_place and merge_states (flashinfer.cascade).
//
// A state is attention's output over some of the keys, v, and the natural
// log of its softmax denominator over those keys, s (the lse attention()
// returns). Two states over disjoint sets of keys merge into the state over
// their union, exactly:
//   s = log(e^s_a + e^s_b),  v = e^(s_a − s) v_a + e^(s_b − s) v_b.
// This is how split-K decode, cascade attention (a shared prefix attended
// once, each request's suffix apart) and context parallelism combine their
// parts. The rules at the edges follow the softmax's (docs/semantics.md):
//   s_b = −∞ (no key allowed)  the state changes nothing: v_a and s_a stay
//                              (both −∞: v_a, zeros for attention's states)
//   s_a = +∞ > s_b             v_a, s_a (the +∞ logits take all the weight)
//   both +∞, or a NaN lse      NaN (which +∞ weighs more cannot be known)
// Weights and sums are computed in double, whatever T.
#pragma once

#include "attn/tensor.hpp"

namespace attn {

template <Real T>
struct MergedState {
  Tensor<T> v;  // (n, H, D)
  Tensor<T> s;  // (n, H)
};

// v, s := merge of (v, s) and (v_other, s_other): v and v_other (n, H, D),
// s and s_other (n, H), any strides. ValueError naming the argument whose
// shape differs.
template <Real T>
void merge_state_in_place(TensorView<T> v, TensorView<T> s, TensorView<const T> v_other,
                          TensorView<const T> s_other);

// The merge of (v_a, s_a) and (v_b, s_b), each v (n, H, D) and s (n, H).
template <Real T>
MergedState<T> merge_state(TensorView<const T> v_a, TensorView<const T> s_a, TensorView<const T> v_b,
                           TensorView<const T> s_b);

// The merge of num_states states per row and head, the first merged with
// the second, the result with the third, and so on: vs (n, num_states, H,
// D), ss (n, num_states, H). num_states = 0 gives zeros and −∞.
template <Real T>
MergedState<T> merge_states(TensorView<const T> vs, TensorView<const T> ss);

}  // namespace attn
