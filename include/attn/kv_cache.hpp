// A key/value cache for incremental decoding: the keys and values of every
// token seen so far, per batch entry and key/value head, stored as T or, for
// a float32 cache, compactly (bf16, f16 or q8_0: attn/quantize.hpp).
#pragma once

#include <cstdint>
#include <type_traits>
#include <variant>

#include "attn/quantize.hpp"
#include "attn/tensor.hpp"

namespace attn {

// Storage is (batch, heads, capacity, head_dim) for keys and for values (a
// q8_0 row: head_dim / 32 blocks, one row per token and head, so appending
// never re-quantizes old tokens); the capacity doubles when full, so
// appending is amortised O(chunk). The batch size, head count and head dim
// are fixed by the first append.
template <class T>
class KVCache {
 public:
  // dtype: how tokens are stored. F32 stores T itself (float64 for
  // KVCache<double>, its only storage); BF16, F16 and Q8_0 need T = float,
  // and Q8_0 a head_dim that is a multiple of 32.
  explicit KVCache(KVDtype dtype = KVDtype::F32);

  KVDtype dtype() const { return dtype_; }
  int64_t length() const { return length_; }
  int64_t capacity() const;
  bool empty() const { return length_ == 0; }
  // The bytes the cached tokens' keys and values take (not the capacity).
  int64_t bytes() const;

  // Appends k, v of shape (batch, heads, n, head_dim) (any strides),
  // converting them to the storage type. On an error (a shape, or a value
  // q8_0 cannot hold) nothing is appended.
  void append(TensorView<const T> k, TensorView<const T> v);

  // f(keys, values) with views (batch, heads, length, head_dim) of
  // everything cached, of the storage type (a q8_0 view's last axis counts
  // blocks, as attention() takes it); valid until the next append.
  template <class F>
  decltype(auto) visit(F&& f) const {
    return std::visit(
        [&](const auto& k) -> decltype(auto) {
          using S = std::remove_cvref_t<decltype(*k.data())>;
          return f(view(k), view(std::get<Tensor<S>>(values_)));
        },
        keys_);
  }

  // The views of a cache that stores T (dtype F32); a ValueError otherwise.
  TensorView<const T> keys() const;
  TensorView<const T> values() const;

  void clear() { length_ = 0; }

 private:
  using Storage = std::variant<Tensor<T>, Tensor<bfloat16>, Tensor<float16>, Tensor<block_q8_0>>;
  template <class S>
  TensorView<const S> view(const Tensor<S>& s) const {
    if (s.rank() != 4) return TensorView<const S>(s.data(), {0, 0, 0, 0});
    const int64_t cap = s.dim(2), row = s.dim(3);
    return TensorView<const S>(s.data(), {s.dim(0), s.dim(1), length_, row},
                               {s.dim(1) * cap * row, cap * row, row, 1});
  }
  TensorView<const T> own_type(const Storage& s, const char* name) const;
  void reserve(int64_t capacity);

  KVDtype dtype_;
  Storage keys_, values_;  // (batch, heads, capacity, row), row in the storage type
  int64_t head_dim_k_ = 0, head_dim_v_ = 0;
  int64_t length_ = 0;
};

extern template class KVCache<float>;
extern template class KVCache<double>;

}  // namespace attn
