// Internal to the layer room: what the layers' serving forwards (mha_serve.cc,
// mla_serve.cc) share: packed sequences' cu_seqlens checked.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/tensor.hpp"

namespace attn::detail {

// cu_seqlens (num_seqs + 1,), int64, rising from 0 to x's `total` rows, as
// batch attention's int32 qo_indptr; ValueError "<who>: ..." otherwise.
inline std::vector<int32_t> qo_indptr_of(const std::string& who, TensorView<const int64_t> cu_seqlens, int64_t num_seqs,
                                         int64_t total) {
  const auto fail = [&](const std::string& msg) { throw ValueError(who + ": " + msg); };
  if (cu_seqlens.rank() != 1 || cu_seqlens.dim(0) != num_seqs + 1)
    fail("cu_seqlens must be (len(seq_ids) + 1,) = (" + std::to_string(num_seqs + 1) + ",), got " +
         shape_str(cu_seqlens.shape()));
  std::vector<int32_t> qo_indptr;
  for (int64_t i = 0; i <= num_seqs; ++i) {
    const int64_t at = cu_seqlens.at({i});
    if ((i == 0 && at != 0) || (i > 0 && at < qo_indptr.back()) || at > total)
      fail("cu_seqlens must rise from 0 to x's length " + std::to_string(total) + ", got " + std::to_string(at) +
           " at " + std::to_string(i));
    qo_indptr.push_back(static_cast<int32_t>(at));
  }
  if (qo_indptr.back() != total)
    fail("cu_seqlens must end at x's length " + std::to_string(total) + ", got " + std::to_string(qo_indptr.back()));
  return qo_indptr;
}

}  // namespace attn::detail
