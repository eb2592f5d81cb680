// Internal: the float32 attention kernels, each compiled for every SIMD target
// and dispatched at run time to the best one this CPU supports.
#pragma once

#include "attention_problem.hpp"

namespace attn::detail {

// Both require col_stride == 1 for q, k, v and out (attention() arranges it).

// Tiled online-softmax attention (flash style), any shape; writes weights
// when p.weights is set.
void flash_forward(const AttentionProblem<float>& p);

}  // namespace attn::detail
