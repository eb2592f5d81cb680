// Internal: an attention call validated and normalized to (batch, head, row,
// col) operands, the one form both the reference and the fast kernel consume.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/attention.hpp"

namespace attn::core {

// One operand seen as (batch, head, row, col). Leading batch axes of any
// stride are flattened through a per-batch offset table. Keys and values may
// be paged (batch attention over a paged cache): row i is then row
// i % page_size of page pages[i / page_size], pages page_stride apart, and
// only rows within one page are row_stride apart (decode_forward reads
// pages; the other kernels take rows a uniform stride apart).
template <class T>
struct Operand {
  T* data = nullptr;
  std::vector<int64_t> batch_offset;  // element offset of flattened batch index b
  int64_t head_stride = 0, row_stride = 0, col_stride = 0;
  const int32_t* pages = nullptr;  // the page table; nullptr: not paged
  int64_t page_size = 0, page_stride = 0;

  T* row(int64_t b, int64_t h, int64_t i) const {
    T* base = data + batch_offset[b] + h * head_stride;
    return pages ? base + pages[i / page_size] * page_stride + i % page_size * row_stride : base + i * row_stride;
  }
  // How many rows from row i on lie in the same page (all up to n unpaged).
  int64_t rows_in_page(int64_t i, int64_t n) const {
    return pages ? std::min(n, (i / page_size + 1) * page_size) - i : n - i;
  }
  explicit operator bool() const { return data != nullptr; }
};

// One mask broadcast to (batch, Hq, n_q, n_k), without copying: boolean (a
// key whose entry equals `blocking` takes no part, as if causal masking
// excluded it) or additive (float or double).
struct MaskTerm {
  Operand<const bool> boolean;
  bool blocking = false;
  Operand<const float> f32;
  Operand<const double> f64;
};

// The masks of a call (AttentionMasks: up to two), combined as they are read.
struct MaskOperand {
  MaskTerm terms[2];

  bool allows(int64_t b, int64_t h, int64_t i, int64_t j) const {
    for (const MaskTerm& t : terms)
      if (t.boolean && t.boolean.row(b, h, i)[j * t.boolean.col_stride] == t.blocking) return false;
    return true;
  }
  double added(int64_t b, int64_t h, int64_t i, int64_t j) const {
    double sum = 0.0;
    for (const MaskTerm& t : terms) {
      if (t.f32) sum += t.f32.row(b, h, i)[j * t.f32.col_stride];
      if (t.f64) sum += t.f64.row(b, h, i)[j * t.f64.col_stride];
    }
    return sum;
  }
  bool present() const {
    for (const MaskTerm& t : terms)
      if (t.boolean || t.f32 || t.f64) return true;
    return false;
  }
};

// How keys and values are stored (float32 problems only): as T, or as
// bfloat16, fp16, q8_0, q4_0 or int4 blocks (attn/quantize.hpp). Int4's K
// rows are groups of 32 tokens, its blocks channels (KIVI's per-channel
// keys); only decode reads it (the API widens it to float32 for the rest).
enum class KVStorage { Native, BF16, F16, Q8_0, Q4_0, Int4 };

// The storage tag of a stored type KV (not float).
template <class KV>
constexpr KVStorage storage_of() {
  if constexpr (std::is_same_v<KV, bfloat16>) return KVStorage::BF16;
  else if constexpr (std::is_same_v<KV, float16>) return KVStorage::F16;
  else if constexpr (std::is_same_v<KV, block_q8_0>) return KVStorage::Q8_0;
  else if constexpr (std::is_same_v<KV, block_int4>) return KVStorage::Int4;
  else {
    static_assert(std::is_same_v<KV, block_q4_0>, "a stored K/V type");
    return KVStorage::Q4_0;
  }
}

template <class T>
struct AttentionProblem {
  // batch: the flattened batch entries visited, numel of batch_axes (0 for a
  // call with no element anywhere: make_problem).
  int64_t batch = 1, heads_q = 1, heads_kv = 1, n_q = 0, n_k = 0, d = 0, d_v = 0;
  Shape batch_axes;                    // the leading axes flattened into batch
  Shape out_shape, weights_shape, lse_shape;  // of the caller's out, weights (logits) and lse
  Operand<const T> q, k, v;            // k, v unset when kv != Native
  KVStorage kv = KVStorage::Native;
  // When kv != Native: K and V as bytes, strides in bytes (a q8_0 or q4_0
  // column is a block of 32 values).
  Operand<const std::byte> k_stored, v_stored;
  // Bound by run(); an extra's data is nullptr when it is not asked for.
  // lse is (batch, head, row) seen as rows of one column.
  Operand<T> out, weights, logits, lse;
  Logits logits_stage = Logits::Masked;
  MaskOperand mask;
  double scale = 1;
  Causal causal = Causal::None;
  Window window;
  double softcap = 0;
  std::vector<double> alibi;  // ALiBi slopes, one per query head; empty: none
  std::vector<double> sinks;  // sink logits, one per query head; empty: none
  Precision precision = Precision::Float32;

  int64_t group() const { return heads_q / heads_kv; }  // query heads per kv head
};

// Sees a view of shape (batch..., [heads,] rows, cols) as an Operand over the
// first `count` flattened batch entries (the problem's batch: see
// make_problem).
template <class T>
inline Operand<T> operand(const TensorView<T>& t, const Shape& batch, int64_t count) {
  Operand<T> o;
  o.data = t.data();
  const int r = t.rank();
  o.row_stride = t.stride(r - 2);
  o.col_stride = t.stride(r - 1);
  o.head_stride = r >= 3 ? t.stride(r - 3) : 0;
  const int nb = static_cast<int>(batch.size());
  o.batch_offset.resize(static_cast<size_t>(count));
  std::vector<int64_t> index(nb, 0);
  for (int64_t b = 0; b < count; ++b) {
    int64_t off = 0;
    for (int a = 0; a < nb; ++a) off += index[a] * t.stride(a);
    o.batch_offset[b] = off;
    for (int a = nb - 1; a >= 0; --a) {
      if (++index[a] < batch[a]) break;
      index[a] = 0;
    }
  }
  return o;
}


// The logical shape of a K or V view: a block type's last axis counts blocks.
template <class KV>
Shape logical_shape(const TensorView<const KV>& t) {
  Shape s = t.shape();
  if (!s.empty()) s.back() *= kBlockValues<KV>;
  return s;
}

// Whether the kernels can read the view's rows in place (unit column stride).
template <class T>
bool unit_rows(const TensorView<const T>& t) {
  return t.rank() == 0 || t.stride(-1) == 1 || t.dim(-1) <= 1;
}

// The gradients of attention: dout (the output's shape) in, dq, dk, dv (the
// shapes of q, k, v) out, as (batch, head, row, col) operands.
template <class T>
struct GradientOperands {
  Operand<const T> dout;
  Operand<T> dq, dk, dv;
  T* dsinks = nullptr;  // (Hq,) contiguous, when the sinks' gradient is asked for
  int64_t dsinks_stride = 1;
};

}  // namespace attn::core
