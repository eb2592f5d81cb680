// Internal: the float32 attention kernels, each compiled for every SIMD target
// and dispatched at run time to the best one this CPU supports.
#pragma once

#include <vector>

#include "attention_problem.hpp"
#include "sparse_problem.hpp"

namespace attn::kernels {

// Both require col_stride == 1 for q, k, v and out (PreparedAttention arranges it).

// Tiled online-softmax attention (flash style), any shape; writes the
// weights, logits and log-sum-exp when asked for. K and V may lie in pages
// (core::Operand), as batch_attention's do.
void flash_forward(const core::AttentionProblem<float>& p);

// The gradient of p's attention into g (dq, dk, dv overwritten; dsinks with
// sinks), from the output and log-sum-exp that the forward wrote into p.out
// and p.lse, P recomputed tile by tile (extra memory O(n)). Requires
// col_stride == 1 for dout too. Returns false, having written nothing, when
// an input, the output or dout holds a NaN or an infinity, or a row's
// log-sum-exp is NaN or +inf: the reference settles those problems.
bool flash_backward(const core::AttentionProblem<float>& p, const core::GradientOperands<float>& g);

// A few queries against a long key/value cache: keys split into fixed chunks
// processed in parallel, partial softmax results merged exactly. No weights
// or logits (the log-sum-exp, yes).
void decode_forward(const core::AttentionProblem<float>& p);

// Top-k sparse attention: each row over the keys its indices name (checked
// by the API), gathered in place; out and lse written. Many problems (a
// paged cache's requests; one K/V storage type) share one set of work items.
void sparse_forward(const std::vector<const core::SparseProblem<float>*>& problems);

// decode_forward for many problems at once (batch attention's requests,
// each with its own n_q, n_k and options; one K/V storage type): their
// chunks are one set of work items. Any n_k, 0 included.
void decode_forward_batch(const std::vector<const core::AttentionProblem<float>*>& problems);
// Whether a request of n_q queries in `precision` suits decode_forward_batch
// (n_q <= kDecodeMaxQueries in float32, kDecodeMaxUnitQueries in bf16 and
// int8: config.hpp).
bool decode_suits(int64_t n_q, Precision precision);

// Whether decode's Q·K in int8 precision over q8_0 keys runs on the int8
// unit (int8_unit(), from kDecodeUnitRows query rows per kv head: config.hpp)
// rather than on the FMAs over the same rounded queries.
bool decode_takes_int8_unit(int64_t rows_per_kv_head);

// Whether decode_forward is the better kernel for p: decode_suits(n_q, precision),
// no weights or logits asked for, and n_k beyond one chunk or few rows per
// kv head (kDecodeShortRows; config.hpp).
bool use_decode(const core::AttentionProblem<float>& p);

// out[i] = 2^x[i], the kernels' softmax exponential, meant for x <= 8 (the
// online softmax's lazy rescale lets scores exceed their max by up to 8):
// relative error about 1e-7, 0 below 2^-126 and for -inf, NaN for NaN;
// for_bf16, bf16 precision's: relative error 1.0e-4. Both give 2^0 = 1. (The kernels inline
// it; this array form is for tests and benchmarks.)
void softmax_exp2(const float* x, float* out, int64_t n, bool for_bf16 = false);

// out[i] = x[i] rounded to bfloat16 (and back to float), as bf16 precision
// rounds Q, K, V and P on the Highway path (and K and V for the units):
// bitwise float_to_bf16's rounding. (Array form for tests.)
void round_to_bf16(const float* x, float* out, int64_t n);

// The unit bf16 precision's prefill computes its products on, with the SIMD
// target the dispatcher picks now: "avx512_bf16" or "neon_bf16"
// (bf16_unit.hpp), or "highway" (the same rounding, FMAs on float32).
const char* bf16_prefill_unit();

// Whether bf16 precision (and int8's P·V) uses the CPU's bf16 unit: where
// it outruns the float32 FMAs (Measured, the default; bf16_unit.hpp), or,
// for tests that check each path, Always (where the CPU has one) or Never.
// Not while kernels run.
enum class BF16UnitUse { Measured, Always, Never };
void set_bf16_unit_use(BF16UnitUse use);

// Whether int8 precision uses the CPU's int8 unit (int8_unit.hpp) where it
// has one (the default), or, for tests that check each path, never. Not
// while kernels run.
void set_int8_unit_use(bool use);

// The unit int8 precision's prefill computes Q·Kᵀ on (on every SIMD
// target: only the scores come from it): "avx512_vnni", "neon_dotprod" or
// "highway".
const char* int8_prefill_unit();

// How many times the float32 FMAs' throughput the CPU's bf16 unit reaches
// on one core (its peak loop's FLOP/s over fma_loop's, on the SIMD target
// the dispatcher has then: the best, unless a test forces one), measured
// once, on first use; 0 where the CPU has no unit. bf16 precision takes the
// unit from kBF16UnitMinSpeedup (config.hpp) up.
double bf16_unit_speedup();

// Throughput loops: `iterations` rounds of independent float32 FMAs on the
// best SIMD target (an FMA counting 2), or of the CPU's bf16 or int8 unit
// (BF16Unit::peak_loop, Int8Unit::peak_loop; 0 where the CPU has none, used
// or not). Each returns the operations done and keeps its result in *sink.
double fma_loop(int64_t iterations, float* sink);
double bf16_peak_loop(int64_t iterations, float* sink);
double int8_peak_loop(int64_t iterations, float* sink);

// y = softmax(x) for one contiguous row of n floats (y may be x), when the
// row holds no NaN and its maximum is finite; otherwise returns false and
// leaves y alone (softmax.cc handles those rows).
bool softmax_row(const float* x, float* y, int64_t n);

}  // namespace attn::kernels
