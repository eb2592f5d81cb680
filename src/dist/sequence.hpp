// Where each rank's rows sit in the global sequence, and which keys of one
// rank's block the queries of another may see.
#pragma once

#include <cstdint>
#include <vector>

#include "attn/dist.hpp"

namespace attn::dist {

// A run of a rank's local rows: local rows [local, local + length) are
// global positions [global, global + length).
struct Segment {
  int64_t global;
  int64_t local;
  int64_t length;
};

// The segments rank `rank` holds, in local order, given every rank's local
// length (validated: see check_layout).
std::vector<Segment> rank_segments(Layout layout, const std::vector<int64_t>& lengths, int rank);

// Throws ValueError unless the lengths suit the layout (zigzag: all equal
// and even). `what` names the array ("q", "k").
void check_layout(Layout layout, const std::vector<int64_t>& lengths, const char* what);

// One attention() call of a block: local query rows [q_begin, q_begin +
// q_length) against local key rows [k_begin, k_begin + k_length) of the
// block, with the causal mask and window that select, within it, exactly
// the keys the global problem allows. q_global, k_global: the global
// positions of its first query and key (of the first segment, if joined).
struct BlockCall {
  int64_t q_begin, q_length;
  int64_t k_begin, k_length;
  Causal causal;
  Window window;
  int64_t q_global, k_global;
};

// The calls that compute rank's queries (q_segments) against a block of
// keys (k_segments), for the global problem's causal mask and window
// (n_q, n_k: global lengths). Empty when the block holds no allowed key:
// then it is neither computed nor needed. With `join`, pairs of segments
// that see each other wholly are joined into one call where their local
// rows are adjacent (their global positions need not be).
std::vector<BlockCall> block_calls(const std::vector<Segment>& q_segments,
                                   const std::vector<Segment>& k_segments, int64_t n_q, int64_t n_k,
                                   Causal causal, Window window, bool join);

// How much further each query of an unjoined call lies from each key in
// the global problem than in the call (global: the problem's causal
// setting and lengths): ALiBi's bias of the call's logits is off by
// -slope times this, the same for every query and key, so the call's
// weights are right and its log-sum-exp is off by that constant.
double position_shift(const BlockCall& call, Causal global, int64_t n_q, int64_t n_k);

}  // namespace attn::dist
