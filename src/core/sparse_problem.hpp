// Internal: a sparse_attention call validated, as (batch, head, row, col)
// operands (attention_problem.hpp's Operand), the one form both the
// reference and the kernel consume. Over a paged cache, one problem per
// request (batch 1): its K and V paged, stored as float32 or in the cache's
// storage type (float32 problems only).
#pragma once

#include <cstdint>
#include <vector>

#include "attention_problem.hpp"

namespace attn::core {

template <class T>
struct SparseProblem {
  int64_t batch = 1, heads_q = 1, heads_kv = 1, n_q = 0, n_k = 0, d = 0, d_v = 0, topk = 0;
  Operand<const T> q, k, v;             // last axes contiguous; k, v unset when kv != Native
  KVStorage kv = KVStorage::Native;
  Operand<const std::byte> k_stored, v_stored;  // when kv != Native: strides in bytes (AttentionProblem's)
  Operand<const int32_t> indices;       // (batch, Hkv or 1, n_q, topk): checked, −1 or a key
  bool indices_per_head = true;         // false: one row of indices for all heads
  Operand<T> out, lse;                  // lse seen as rows of one column
  double scale = 1, softcap = 0;
  std::vector<double> sinks;            // one per query head; empty: none

  int64_t group() const { return heads_q / heads_kv; }
  const int32_t* indices_row(int64_t b, int64_t hkv, int64_t i) const {
    return indices.row(b, indices_per_head ? hkv : 0, i);
  }
};

}  // namespace attn::core
