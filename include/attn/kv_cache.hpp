// A key/value cache for incremental decoding: the keys and values of every
// token seen so far, per batch entry and key/value head.
#pragma once

#include <cstdint>

#include "attn/tensor.hpp"

namespace attn {

// Storage is (batch, heads, capacity, head_dim) for keys and for values; the
// capacity doubles when full, so appending is amortised O(chunk). The batch
// size, head count and head dim are fixed by the first append.
template <class T>
class KVCache {
 public:
  int64_t length() const { return length_; }
  int64_t capacity() const { return keys_.rank() == 4 ? keys_.dim(2) : 0; }
  bool empty() const { return length_ == 0; }

  // Appends k, v of shape (batch, heads, n, head_dim) (any strides).
  void append(TensorView<const T> k, TensorView<const T> v);

  // Views (batch, heads, length, head_dim) of everything cached; valid until
  // the next append.
  TensorView<const T> keys() const { return view(keys_); }
  TensorView<const T> values() const { return view(values_); }

  void clear() { length_ = 0; }

 private:
  TensorView<const T> view(const Tensor<T>& storage) const;
  void reserve(int64_t capacity);

  Tensor<T> keys_, values_;  // (batch, heads, capacity, head_dim)
  int64_t length_ = 0;
};

extern template class KVCache<float>;
extern template class KVCache<double>;

}  // namespace attn
