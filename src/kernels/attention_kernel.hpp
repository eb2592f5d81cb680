// Internal: the float32 attention kernel, dispatched at run time to the best
// SIMD target of this CPU (AVX-512, AVX2, NEON, SVE, ...).
#pragma once

#include "attention_problem.hpp"

namespace attn::detail {

// Requires col_stride == 1 for q, k, v and out (attention() arranges it).
void attention_f32(const AttentionProblem<float>& p);

}  // namespace attn::detail
