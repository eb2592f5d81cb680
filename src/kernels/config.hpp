// Internal: the attention kernels' configuration, in one place: the prefill
// tile sizes, the decode chunk and the query count below which decode takes
// over, and the bf16 unit's thresholds. Each default sits next to the
// measurement (or, where none was made, the reason) behind it, here and
// nowhere else; docs/performance.md explains the kernels they tune.
//
// Each can be overridden at build time for an experiment, in a build folder
// of its own, e.g.
//   cmake -S . -B build-q128 -DCMAKE_BUILD_TYPE=Release
//         -DCMAKE_CXX_FLAGS="-DATTN_BLOCK_Q=128 -DATTN_DECODE_CHUNK=1024"
//   (one command)
//   cmake --build build-q128 -j 2 && build-q128/bin/attn bench attention ...
// The static_asserts below (and the per-target one in matmul-inl.h) reject
// values the kernels cannot run with. Any setting keeps results bitwise equal
// for every thread count; other settings give other roundings (the order of
// the sums changes), so outputs differ from the default build's in the last
// bits.
#pragma once

#include <cstdint>

#ifndef ATTN_BLOCK_Q
#define ATTN_BLOCK_Q 512
#endif
#ifndef ATTN_BLOCK_K
#define ATTN_BLOCK_K 64
#endif
#ifndef ATTN_BF16_STEP_TILES
#define ATTN_BF16_STEP_TILES 4
#endif
#ifndef ATTN_BLOCK_ROWS
#define ATTN_BLOCK_ROWS 32
#endif
#ifndef ATTN_BACKWARD_ROWS
#define ATTN_BACKWARD_ROWS 32
#endif
#ifndef ATTN_DECODE_CHUNK
#define ATTN_DECODE_CHUNK 512
#endif
#ifndef ATTN_SPARSE_HEADS_PER_ITEM
#define ATTN_SPARSE_HEADS_PER_ITEM 64
#endif
#ifndef ATTN_DECODE_PREFETCH_ROWS
#define ATTN_DECODE_PREFETCH_ROWS 16
#endif
#ifndef ATTN_DECODE_MAX_QUERIES
#define ATTN_DECODE_MAX_QUERIES 32
#endif

namespace attn::kernels {

// Prefill: query rows per work item (batch, kv head, query tile), at most.
// The K and V tiles stay in cache while all of an item's rows pass over
// them, so larger items reuse each tile more. Measured on Zen 5, n = 4096,
// 8 heads, d = 64, 2 threads: 256-row items 72% of the FMA peak, 128 rows
// 66%, 64 rows 66%, 32 rows 63%; on a Xeon (Sapphire Rapids), 512 rows
// against 256: n = 4096 0.68 against 0.65, head dim 128 0.71 against 0.70,
// n_q = 512 against 8192 keys 0.64 against 0.61 (medians of 3). But larger
// items are fewer: a call with fewer than 2 items per thread at kBlockQ rows
// takes items of kBlockQ / 2 (prefill.cc, ItemRows). Either way the rows'
// arithmetic is the same, so results do not depend on it.
constexpr int64_t kBlockQ = ATTN_BLOCK_Q;

// Prefill: keys per tile, one packed panel of the Q·Kᵀ product (matmul-inl.h
// takes its panel width from here, so the layer's projections use it too).
// At d = 64 a K tile is 64 · 64 · 4 B = 16 KiB and stays in L1 with the V
// tile. 64 is the only width measured; each target's row of accumulators
// (kVecs vectors: 64 floats with AVX-512) must divide it.
constexpr int64_t kBlockK = ATTN_BLOCK_K;

// Prefill in bf16 and int8 precision: key tiles per step of the online
// softmax, whose max P is rounded against (so part of what the precision
// computes, on a bf16 unit or not). The unit's K panels and V tiles are bf16
// pairs, half float32's bytes, and a step's fixed costs (the softmax's
// per-row checks and sum, the rescale of O, the unit's calls, loading and
// storing O around P·V) are spread over all its keys. Measured on a Zen 5,
// n = 4096, 8 × 64, 2 threads, ms over three alternating turns: bf16 on the
// unit 65.5-66.7 at 2 tiles against 70.0-72.7 at 1, int8 65.6-66.3 against
// 69.2-71.4, the Highway bf16 path 104 against 104-107. 4 tiles against 2 (S
// then 32 KiB per block of kBlockRows), AMD EPYC Zen 4, n = 4096, 8 heads, 2
// threads, two builds in one process, calls in turns, both orders: bf16
// 0.96-0.97 of the time at head dim 64 and 0.985-0.996 at 128, int8 0.96-0.98
// at 64 and 128, causal bf16 0.99-1.0, the Highway bf16 path (the unit off)
// 182-186 ms against 195-197; `attn bench attention` at n = 512 and 1024
// within noise. 4 tiles of 16-row blocks were no faster than 2 tiles of 32
// rows, and 8 tiles (S 64 KiB) took 1.17-1.56× 4 tiles' time at n = 1024.
// float32 keeps one: two tiles per step gained nothing there (0.76-0.79 of
// the FMA peak either way), and 128-key tiles (-DATTN_BLOCK_K=128) were no
// faster on a Xeon or at head dim 64 on a Zen 5, and 5-10% slower at head
// dims 80-256 on the Zen 5.
constexpr int64_t kBF16StepTiles = ATTN_BF16_STEP_TILES;
constexpr int64_t kBF16StepKeys = kBF16StepTiles * kBlockK;

// Prefill: query rows per block of the inner loop, so the score block S is
// kBlockRows · kBlockK · 4 B = 8 KiB (a bf16 step's four tiles 32 KiB), never
// a whole tile. Key tiles outer and 8-row blocks inner took 256-row items
// from 63% to 72% of peak (Zen 5, as above), and skipping the 8-row blocks a
// diagonal tile masks wholly took causal from 0.55× to 0.52× of the
// non-causal time. Blocks of 32 rows spread each block's fixed costs (the
// calls into the products, a step's checks) over more rows. n = 4096, 8
// heads, 2 threads, AMD EPYC Zen 4: two builds in one process, calls in
// turns (both orders), time at 32 rows over 8: bf16 0.97-0.99 (head dim 64),
// 0.95-0.97 (128); float32 0.94-0.985 (128), causal 0.97, non-causal at 64
// within noise; `attn bench attention`, alternating builds: int8 383 against
// 357 GFLOP/s. 64 rows (S then L1's size in a step of 2 tiles) against 32:
// int8 0.96-0.98, bf16 0.98-1.0 at head dim 64 but 1.01-1.02 at 128, float32
// within noise. The results are the same bits at any block size.
constexpr int kBlockRows = ATTN_BLOCK_ROWS;

// Backward: query rows per block against one key tile. The block's products
// Pᵀ dO and dSᵀ Q keep a tile's dK, dV accumulators in registers for all
// its rows, so more rows amortize their loads and stores; P and dS are each
// rows · kBlockK · 4 B (8 KiB at 32), still within L1 beside the K and V
// tiles. 32 is the only value timed: n = 4096, 8 × 64, 2 threads, Zen 5,
// 0.82-0.84 of the FMA peak, against the forward's 0.73-0.75 in the same
// turns.
constexpr int64_t kBackwardRows = ATTN_BACKWARD_ROWS;

// Decode: keys per chunk, each chunk a work item whose partial softmax is
// merged exactly. Fixed (not derived from the thread count) so results do
// not depend on it. Not tuned by a recorded measurement: 512 keys give
// 32768 / 512 = 64 items per head at the decode bench's shape, plenty for
// any thread count, while a chunk's scores (512 · 4 B = 2 KiB per query row)
// stay in L1.
constexpr int64_t kDecodeChunk = ATTN_DECODE_CHUNK;

// Decode's block of keys (scores, softmax step, P·V) where it fetches a
// float cache's rows ahead (GQA, pages). A chunk in one block left memory idle
// while P·V summed V from cache; in blocks, P·V fetches the next block's K.
// float32, 32 × 8 heads of 128, 32768 keys, 2 threads, AMD EPYC Zen 4,
// alternating runs, ratio to the read-bandwidth ceiling: one block of 512
// 0.78-0.82, blocks of 256 0.82, 128 0.84-0.88, 64 0.86-0.88.
constexpr int64_t kDecodeFetchBlock = 128;

// Decode takes float32 calls with at most this many query rows (and more
// than one chunk of keys, and no weights): it reads K and V once per chunk
// for all rows of a GQA group, fetching them ahead, where the flash kernel
// reads them once per query head, on the hardware's prefetcher alone, and
// waits on memory while its tiles have few rows. Its time rose faster with
// the rows: by 32 the two were even. Causal, head dim 128, 2 threads, AMD
// EPYC Zen 4, a cache larger than L3 (as a model's layers leave it), ms,
// flash against decode: 8 heads, 4096 keys, 9 queries 2.71 against 1.40, 16
// queries 3.24 against 2.07, 32 queries 4.31 against 4.12; 600 keys, 9
// queries 0.42 against 0.26, 32 queries 0.67 against 0.66; 32 x 8 heads,
// 4096 keys, 9 queries 5.33 against 4.68, 32 queries 12.30 against 12.25.
// (With K and V in cache from a previous call, flash was ahead at 12 to 32
// queries below 2048 keys: 8 heads, 1024 keys, 16 queries 0.44 against 0.56.)
constexpr int64_t kDecodeMaxQueries = ATTN_DECODE_MAX_QUERIES;

// bf16 and int8 precision's bound: past it their flash kernel, whose
// products run on a unit (VDPBF16PS, VPDPBUSD), gains on decode's float32
// arithmetic. 32 x 8 heads of 128, 600 keys, as above, bf16's flash
// against decode: 16 queries 1.16 against 1.08, 24 queries 1.33 against
// 1.52; 4096 keys, 16 queries 6.35 against 6.88.
constexpr int64_t kDecodeMaxUnitQueries = 8;

// Decode also takes float32 precision's calls of one chunk of keys or fewer
// (from one tile, kBlockK) with at most this many query rows per kv head
// (GQA group × queries), where the flash kernel's tiles run mostly empty
// (bf16 and int8 keep the flash kernel, whose arithmetic they name). 8 heads of
// 128, 2 threads, AMD EPYC Zen 4, medians of 3 alternating runs, ms, flash
// against decode: 1 row, 64 keys 0.0195 against 0.0088-0.0166, 192 keys
// 0.057 against 0.018, 512 keys 0.085 against 0.049; 2 rows, 512 keys
// 0.086 against 0.053; 4 rows, 512 keys 0.097 against 0.073; 32 × 8
// heads, 1 query (4 rows), 128 keys 0.038 against 0.024. At 8 rows decode
// was 0.95-1.08x flash's speed (8 queries of 8 heads) or 1.0-1.35x (2 of
// 32 × 8), at 16 and 32 rows slower; at 16 keys, 0.6-1.5x.
constexpr int64_t kDecodeShortRows = 4;

// Decode: how many K rows ahead of the row being read the kernel prefetches
// (V's row is prefetched as its K row is read). Measured on a Xeon (Sapphire
// Rapids), 2 threads, 32768 keys, 32 heads × 128, ms: q8_0 16.6 without K
// prefetch, 14.9 at 4 rows, 13.9 at 16, 14.2 at 32, 14.5 at 64; float32 and
// bf16 within noise of each other at 0 and 16.
constexpr int64_t kDecodePrefetchRows = ATTN_DECODE_PREFETCH_ROWS;

// Top-k sparse attention: where a call has fewer query rows than threads,
// each row's GQA group is sliced into work items of this many query heads
// (MLA's absorbed MQA has 128), each gathering the row's keys again. 128
// heads, one row, topk 2048 of 65536 keys (attn bench sparse --queries 1),
// AMD EPYC (Zen 5), 2 threads, ms: unsliced 2.83-2.85, slices of 16
// 2.46-2.50, 32 1.86-1.89, 64 1.56-1.57. With 16 rows, slices of 64 took
// 30.8-32.2 against 26.7-29.7 unsliced: rows alone then keep every thread
// busy, so only calls of too few rows are sliced.
constexpr int64_t kSparseHeadsPerItem = ATTN_SPARSE_HEADS_PER_ITEM;

// Decode: the query rows per kv head (GQA group × queries) from which an
// item computes its scores by tiles (K transposed into a panel, the
// prefill's micro-kernel) rather than key by key with a horizontal sum per
// row and key. Fewer rows leave the tiles' compute bursts apart from the
// memory reads, which key by key overlap. 32 query and 8 KV heads of 128,
// 8192 keys, AMD EPYC (Zen 5), 2 threads, medians of 5 alternating runs, key
// by key against tiles, ms: 32 rows (8 draft queries, pages of 16, tree
// mask) float32 5.48 against 4.88, bf16 4.14 against 3.58, q8_0 5.08 against
// 3.49; contiguous float32, 24 rows 3.02 against 3.51, 16 rows 2.09 against
// 2.86.
constexpr int64_t kDecodePanelRows = 32;

// Decode: the query rows per kv head from which int8 precision's Q·K over
// q8_0 keys takes the int8 unit (its keys' codes packed into panels); fewer
// rows score the same rounded queries on the FMAs (BlockDotKeys on AVX2 and AVX-512),
// where packing costs more than the unit saves. int8 against float32
// precision's time, q8_0, 32768 keys, 2 threads, AMD EPYC Zen 4: 8 heads of
// 128 (1 row) 1.59×; 32 × 8 heads of 128, 1 query (4 rows) 1.32×, 2
// queries (8 rows) 1.02×, 8 queries (32 rows) 0.75×. Below it, the unit
// over the keys in place gained nothing either (no panel: codes flipped to
// unsigned by one XOR, eight keys' block sums added across lanes, their d
// gathered): 1 row, 8 heads of 128, 2 threads, Zen 4, against the float
// path's time, 0.96-0.97× with the cache in L3 (1024, 4096 keys), 1.05-1.11×
// from memory (32768 keys).
constexpr int64_t kDecodeUnitRows = 8;

// Decode over NHD pages, key by key: the query rows an item keeps in L1
// while it goes key by key over all its heads (about two thirds of a 48 KiB
// L1, room left for the scores and a K row); beyond it, head by head over
// each page. 4 draft queries of a group of 4 at 8 heads x 128 are 64 KiB of
// rows. (8 drafts, 128 KiB, at 8192 keys took 10.0 ms key by key, 6.7-7.0
// ms head by head, against about 2 ms for one query, AMD EPYC, 2 threads;
// they take tiles now: kDecodePanelRows.)
constexpr int64_t kDecodeL1QueryBytes = 32 * 1024;

// bf16 and int8 precision take the CPU's bf16 unit when its throughput is at
// least this many times the float32 FMAs' (bf16_unit_speedup, timed once per
// process). Twice the products per instruction is not twice the throughput
// on every CPU: 1.8-1.9x the FMAs' FLOP/s on a Zen 5, 0.48x on an Intel Xeon
// (Sapphire Rapids) with AVX512_BF16. The margin above 1 pays for the
// pairing the unit adds (Q, V and each block of P).
inline constexpr double kBF16UnitMinSpeedup = 1.25;

// bf16 and int8 precision: independent accumulator chains a block of the
// unit's products keeps going, and its peak loop too: more than the
// instruction's latency × its throughput. A block of 4 rows × 4 vectors has
// 16. A narrower one (the last value vector of d_v = 80, the last two of 96,
// every block at head dims 16 and 32, a last partial tile of keys) adds its
// pairs into 2 or 3 sets of accumulators in turn (bf16_blocks-inl.h,
// DotPairs). Measured on a Zen 5, n = 4096, 8 heads, 2 threads, bf16's time
// against float32 precision's, one set of accumulators against several:
// head dim 16 1.01-1.02 against 0.82-0.83, 32 0.76-0.79 against 0.67-0.68,
// 80 0.67-0.69 against 0.62-0.63; 64 and 128 (4 × 4 blocks only) unchanged.
constexpr int kMinSums = 12;

static_assert(kBlockQ > 0 && kBlockK > 0 && kBF16StepTiles > 0 && kBlockRows > 0 && kBackwardRows > 0 &&
                  kDecodeChunk > 0 && kDecodeMaxQueries > 0 && kDecodePrefetchRows >= 0 && kSparseHeadsPerItem > 0,
              "kernel configuration: sizes must be positive");
// Row blocks tile an item exactly (and take whole micro-kernel row groups:
// asserted in prefill.cc against matmul-inl.h's kRows).
static_assert(kBlockQ % (2 * kBlockRows) == 0, "ATTN_BLOCK_Q must be a multiple of 2 × ATTN_BLOCK_ROWS");
// Score rows of a tile or chunk are whole, aligned vectors on every target
// (64 floats: SVE's widest, 2048 bits), and a key tile is whole blocks of the
// Q·Kᵀ micro-kernel (AVX-512: 4 vectors of 16).
static_assert(kBlockK % 64 == 0, "ATTN_BLOCK_K must be a multiple of 64");
static_assert(kDecodeChunk % 64 == 0, "ATTN_DECODE_CHUNK must be a multiple of 64");

}  // namespace attn::kernels
