#include "attn/kv_cache.hpp"

#include <algorithm>
#include <cstring>

namespace attn {

template <class T>
TensorView<const T> KVCache<T>::view(const Tensor<T>& s) const {
  if (s.rank() != 4) return TensorView<const T>(s.data(), {0, 0, 0, 0});
  const int64_t cap = s.dim(2), dh = s.dim(3);
  return TensorView<const T>(s.data(), {s.dim(0), s.dim(1), length_, dh},
                             {s.dim(1) * cap * dh, cap * dh, dh, 1});
}

template <class T>
void KVCache<T>::reserve(int64_t capacity) {
  for (Tensor<T>* s : {&keys_, &values_}) {
    Tensor<T> grown(Shape{s->dim(0), s->dim(1), capacity, s->dim(3)});
    const int64_t old_cap = s->dim(2), dh = s->dim(3);
    for (int64_t bh = 0; bh < s->dim(0) * s->dim(1); ++bh)
      std::memcpy(grown.data() + bh * capacity * dh, s->data() + bh * old_cap * dh,
                  sizeof(T) * length_ * dh);
    *s = std::move(grown);
  }
}

template <class T>
void KVCache<T>::append(TensorView<const T> k, TensorView<const T> v) {
  if (k.rank() != 4 || v.rank() != 4 || k.dim(0) != v.dim(0) || k.dim(1) != v.dim(1) ||
      k.dim(2) != v.dim(2))
    throw ValueError("KVCache.append: k and v must be (batch, heads, n, head_dim) with equal "
                     "batch, heads and n, got k " + shape_str(k.shape()) + ", v " +
                     shape_str(v.shape()));
  if (keys_.rank() != 4) {
    keys_ = Tensor<T>(Shape{k.dim(0), k.dim(1), 0, k.dim(3)});
    values_ = Tensor<T>(Shape{v.dim(0), v.dim(1), 0, v.dim(3)});
  }
  const Shape have{keys_.dim(0), keys_.dim(1), keys_.dim(3)};
  if (k.dim(0) != have[0] || k.dim(1) != have[1] || k.dim(3) != have[2] ||
      v.dim(3) != values_.dim(3))
    throw ValueError("KVCache.append: the cache holds batch " + std::to_string(have[0]) +
                     ", heads " + std::to_string(have[1]) + ", head_dim " +
                     std::to_string(have[2]) + "; cannot append k " + shape_str(k.shape()) +
                     ", v " + shape_str(v.shape()));
  const int64_t n = k.dim(2);
  if (length_ + n > keys_.dim(2)) reserve(std::max<int64_t>({16, 2 * keys_.dim(2), length_ + n}));
  const int64_t cap = keys_.dim(2);
  const auto dest = [&](Tensor<T>& s) {
    return TensorView<T>(s.data() + length_ * s.dim(3), {s.dim(0), s.dim(1), n, s.dim(3)},
                         {s.dim(1) * cap * s.dim(3), cap * s.dim(3), s.dim(3), 1});
  };
  copy<T>(k, dest(keys_));
  copy<T>(v, dest(values_));
  length_ += n;
}

template class KVCache<float>;
template class KVCache<double>;

}  // namespace attn
