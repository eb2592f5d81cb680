// The double-precision reference: the definition of attention and of its
// gradient, written as plainly as possible (reference.cc). The API runs it
// for float64; the kernels for the rare float32 rows their vector
// arithmetic cannot settle (a declared dependency: cmake/layers.cmake).
#pragma once

#include <cstdint>

#include "attention_problem.hpp"
#include "sparse_problem.hpp"

namespace attn::reference {

// The double-precision oracle: plain loops, accumulation in double.
void reference_attention(const core::AttentionProblem<double>& p);
// Output row (b, h, i) of a float32 problem computed the same way, in double,
// with the row's extras where p binds them (lse, weights, logits): the
// kernels' answer for the rare rows their vector arithmetic cannot settle (a
// NaN or infinite value in an excluded key's value row, products that
// overflow).
void reference_attention_row(const core::AttentionProblem<float>& p, int64_t b, int64_t h, int64_t i,
                             float* out);
// Its backward (dq, dk, dv overwritten), recomputing the weights row by row;
// with the forward's out and lse bound in p (a saved forward), the gradient
// is taken from them as the kernel takes it: P = exp(logit - lse), and
// dout · out for Σ_j P_j (dout · v_j).
void reference_attention_backward(const core::AttentionProblem<double>& p,
                                  const core::GradientOperands<double>& g);

// Top-k sparse attention: each row over the keys its indices name.
void reference_sparse_attention(const core::SparseProblem<double>& p);

}  // namespace attn::reference
