// Context parallelism over MPI: one attention problem whose sequence is
// split across the ranks of a communicator, each rank holding its slice of
// q, k and v for all heads, and receiving its slice of the output: the
// output every rank would read from attention() on the whole sequence
// (docs/semantics.md "Context parallelism", docs/scaling.md).
//
//   ring_attention: K/V blocks travel around the ring of ranks while each
//     rank computes its queries against the block it holds, the partial
//     results (output and log-sum-exp) merged exactly, in a fixed order.
//   ulysses_attention: one all-to-all turns the sequence split into a head
//     split, each rank computes whole sequences for Hq / W heads, and a
//     second all-to-all turns it back.
//
// The local arrays are attention()'s, (..., H, n_local, d), with the
// sequence axis (-2) split over the ranks in rank order; every other axis,
// the element types and the options agree on every rank. The caller
// initialises MPI; attn calls it only from the calling thread, so
// MPI_THREAD_FUNNELED is enough. Every rank of comm calls together. Bad
// input on any rank is found collectively before any data moves, and every
// rank throws the same error naming that rank: never a hang.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>

#include "attn/attention.hpp"

namespace attn::dist {

// How the global sequence is split (q's, and k's and v's, each alike):
//   Contiguous: rank r holds the r-th run of positions, any lengths, each
//     rank's given by its local arrays.
//   Zigzag: the sequence cut into 2W equal chunks, rank r holding chunks r
//     and 2W-1-r, concatenated in that order, so that each rank has as much
//     of the causal triangle as any other. Needs every rank's length equal
//     and even (the global length divisible by 2W).
enum class Layout { Contiguous, Zigzag };
// Parses "contiguous" or "zigzag"; ValueError naming them otherwise.
Layout parse_layout(const std::string& name);
std::string layout_name(Layout layout);

// What one rank did in one call (for attn bench ring and for tests of the
// schedule).
struct DistStats {
  double compute_seconds = 0;  // in attention() on blocks and in merging
  double wait_seconds = 0;     // waiting for messages: communication not hidden
  int64_t blocks_computed = 0; // attention() calls
  int64_t blocks_sent = 0;     // messages of data sent (K/V blocks, or all-to-all parts)
  int64_t bytes_sent = 0;
};

// Ring attention. Options: all of attention()'s, on the global sequence:
// causal masking, windows and ALiBi by global positions (a key block
// wholly outside a rank's allowed keys is neither computed nor, where no
// later rank needs it, sent), scale, softcap, sinks (counted once per row),
// GQA, precision; K and V travel in their own element type (bfloat16 or
// float16: half float32's bytes). Results are bitwise reproducible for one
// world size and layout, and within the kernels' rounding of one process's.
// lse, when not empty, receives the log-sum-exp (..., Hq, n_q_local), as
// AttentionExtras::lse.
template <class T, class KV>
  requires AttentionTypes<T, KV>
DistStats ring_attention(TensorView<const T> q, TensorView<const KV> k, TensorView<const KV> v,
                         TensorView<T> out, MPI_Comm comm, const AttentionOptions& options = {},
                         Layout layout = Layout::Contiguous, TensorView<T> lse = {});

// The gradient of ring_attention, by the same ring: every rank passes its
// q, k, v, the gradient of its output dout, and the out and lse its
// ring_attention returned; it receives dq, dk, dv for its slices (each
// block's dK, dV travel around with it and home from the last rank that
// needs it; each block's share computed by attention_backward from the
// saved forward) and, with sinks, dsinks (Hq,), summed over every rank's
// rows, the same on every rank. float32 (the fused kernel) or float64 (the
// reference), K and V of q's type; within their rounding of one process's
// attention_backward, bitwise reproducible for one world size and layout.
template <class T>
  requires AttentionTypes<T, T>
DistStats ring_attention_backward(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                                  TensorView<const T> dout, TensorView<const T> out, TensorView<const T> lse,
                                  TensorView<T> dq, TensorView<T> dk, TensorView<T> dv, MPI_Comm comm,
                                  const AttentionOptions& options = {}, Layout layout = Layout::Contiguous,
                                  TensorView<T> dsinks = {});

// Ulysses (DeepSpeed): needs a heads axis, with Hq and Hkv divisible by the
// world size W. Every option of attention() (ALiBi too), on the global
// sequence; each rank runs attention() on whole sequences of its heads.
template <class T, class KV>
  requires AttentionTypes<T, KV>
DistStats ulysses_attention(TensorView<const T> q, TensorView<const KV> k, TensorView<const KV> v,
                            TensorView<T> out, MPI_Comm comm, const AttentionOptions& options = {},
                            Layout layout = Layout::Contiguous, TensorView<T> lse = {});

// Runs check on every rank of comm; if it throws on any, every rank throws
// that error (the lowest such rank's, its message naming the function and
// the rank), so that no rank goes on to wait for one that gave up. The calls
// above check their arguments this way; a binding checks its own with it.
void check_collectively(MPI_Comm comm, const std::string& function, const std::function<void()>& check);

}  // namespace attn::dist
