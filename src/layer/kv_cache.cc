#include "attn/kv_cache.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "stored_rows.hpp"

namespace attn {
namespace {

using detail::row_elements;
using detail::store_row;

// Rows t of src (batch, heads, n, cols) to rows at + t of dst (batch, heads,
// capacity, row_elements(cols)).
template <class T, class S>
void store_rows(TensorView<const T> src, Tensor<S>& dst, int64_t at) {
  const int64_t B = src.dim(0), H = src.dim(1), n = src.dim(2), cols = src.dim(3);
  if (cols == 0) return;
  const int64_t cap = dst.dim(2), row = dst.dim(3);
  // Stored as T: each row copied straight in; otherwise gathered (float32)
  // and converted.
  std::vector<T> gathered(std::is_same_v<S, T> ? 0 : static_cast<size_t>(cols));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < n; ++t) {
        const T* in = &src.at({b, h, t, 0});
        S* out = dst.data() + ((b * H + h) * cap + at + t) * row;
        T* x = std::is_same_v<S, T> ? reinterpret_cast<T*>(out) : gathered.data();
        for (int64_t c = 0; c < cols; ++c) x[c] = in[c * src.stride(3)];
        if constexpr (!std::is_same_v<S, T> && std::is_same_v<T, float>) store_row(x, out, cols);
      }
}

}  // namespace

namespace detail {

CacheUser::Hold CacheUser::hold(const char* who) const {
  const std::thread::id me = std::this_thread::get_id();
  if (owner_.load(std::memory_order_acquire) != me) {
    std::thread::id none;
    if (!owner_.compare_exchange_strong(none, me, std::memory_order_acquire))
      throw RuntimeError(std::string("KVCache: ") + who +
                         ": the cache is in use by another thread (a cache holds one sequence: "
                         "give each thread its own cache)");
  }
  ++depth_;
  return Hold(*this);
}

}  // namespace detail

template <class T>
KVCache<T>::KVCache(KVDtype dtype, const StreamingCache& streaming) : dtype_(dtype), streaming_(streaming) {
  if (streaming.sink_tokens < 0 || streaming.window < 0)
    throw ValueError("KVCache: sink_tokens and window must be >= 0 (window 0: not streaming), got " +
                     std::to_string(streaming.sink_tokens) + " and " + std::to_string(streaming.window));
  if (streaming.window == 0 && (streaming.sink_tokens > 0 || streaming.positions != CachePositions::Original))
    throw ValueError("KVCache: sink_tokens and positions need a window (> 0)");
  if (streaming.positions == CachePositions::Cache && dtype != KVDtype::F32)
    throw ValueError(std::string("KVCache: positions 'cache' rotates the cached keys every call: it needs "
                                 "keys stored as the layer's type, not ") + kv_dtype_name(dtype));
  if (dtype == KVDtype::INT4 && streaming.window > 0)
    throw ValueError("KVCache: an int4 cache cannot stream: its keys are quantized 32 tokens at a time, and "
                     "streaming drops them one by one (pass window 0, or another dtype)");
  if constexpr (std::is_same_v<T, double>)
    if (dtype != KVDtype::F32)
      throw ValueError(std::string("KVCache: a float64 cache stores float64 only, got dtype ") +
                       kv_dtype_name(dtype));
  switch (dtype) {
    case KVDtype::F32: keys_ = values_ = Tensor<T>(); break;
    case KVDtype::BF16: keys_ = values_ = Tensor<bfloat16>(); break;
    case KVDtype::F16: keys_ = values_ = Tensor<float16>(); break;
    case KVDtype::Q8_0: keys_ = values_ = Tensor<block_q8_0>(); break;
    case KVDtype::Q4_0: keys_ = values_ = Tensor<block_q4_0>(); break;
    case KVDtype::INT4: keys_ = values_ = Tensor<block_int4>(); break;
  }
}

template <class T>
int64_t KVCache<T>::capacity() const {
  return std::visit([](const auto& s) { return s.rank() == 4 ? s.dim(2) : int64_t{0}; }, values_);
}

template <class T>
int64_t KVCache<T>::bytes() const {
  const auto held = use("bytes");
  const int64_t rows = std::visit([](const auto& s) { return s.rank() == 4 ? s.dim(0) * s.dim(1) : int64_t{0}; }, keys_);
  const auto row_bytes = [&](int64_t cols) {
    return dtype_ == KVDtype::F32 ? cols * static_cast<int64_t>(sizeof(T)) : kv_dtype_bytes(dtype_, cols);
  };
  if (dtype_ == KVDtype::INT4)  // key groups (the last one's blocks and its float32 keys too), value rows
    return rows * ((length_ + kInt4Group - 1) / kInt4Group * head_dim_k_ * static_cast<int64_t>(sizeof(block_int4)) +
                   length_ % kInt4Group * head_dim_k_ * static_cast<int64_t>(sizeof(float)) +
                   length_ * row_bytes(head_dim_v_));
  return rows * length_ * (row_bytes(head_dim_k_) + row_bytes(head_dim_v_));
}

template <class T>
TensorView<const float> KVCache<T>::key_tail() const {
  const auto held = use("key_tail");
  if (dtype_ != KVDtype::INT4)
    throw ValueError(std::string("KVCache.key_tail: only an int4 cache keeps its last keys in float32; this one stores ") +
                     kv_dtype_name(dtype_));
  return view(key_tail_, length_ % kInt4Group);
}

template <class T>
TensorView<const T> KVCache<T>::own_type(const Storage& s, const char* name) const {
  if (dtype_ != KVDtype::F32)
    throw ValueError(std::string("KVCache.") + name + ": the cache stores " + kv_dtype_name(dtype_) +
                     ", not the layer's type: read it with visit()");
  return view(std::get<Tensor<T>>(s), length_);
}

template <class T>
TensorView<const T> KVCache<T>::keys() const {
  const auto held = use("keys");
  return own_type(keys_, "keys");
}

template <class T>
TensorView<const T> KVCache<T>::values() const {
  const auto held = use("values");
  return own_type(values_, "values");
}

template <class T>
void KVCache<T>::reserve(int64_t capacity) {
  // (int4's keys: in groups of 32 tokens.)
  const int64_t groups = (capacity + kInt4Group - 1) / kInt4Group, held = (length_ + kInt4Group - 1) / kInt4Group;
  const auto grow = [&](auto& s, bool key_groups) {
    using S = std::remove_cvref_t<decltype(*s.data())>;
    const int64_t rows = key_groups ? groups : capacity, kept = key_groups ? held : length_;
    Tensor<S> grown(Shape{s.dim(0), s.dim(1), rows, s.dim(3)});
    const int64_t old_rows = s.dim(2), row = s.dim(3);
    for (int64_t bh = 0; bh < s.dim(0) * s.dim(1); ++bh)
      std::memcpy(grown.data() + bh * rows * row, s.data() + bh * old_rows * row, sizeof(S) * kept * row);
    s = std::move(grown);
  };
  std::visit([&](auto& s) { grow(s, dtype_ == KVDtype::INT4); }, keys_);
  std::visit([&](auto& s) { grow(s, false); }, values_);
}

template <class T>
void KVCache<T>::append(TensorView<const T> k, TensorView<const T> v) {
  const auto held = use("append");
  if (k.rank() != 4 || v.rank() != 4 || k.dim(0) != v.dim(0) || k.dim(1) != v.dim(1) ||
      k.dim(2) != v.dim(2))
    throw ValueError("KVCache.append: k and v must be (batch, heads, n, head_dim) with equal "
                     "batch, heads and n, got k " + shape_str(k.shape()) + ", v " +
                     shape_str(v.shape()));
  if (is_block_dtype(dtype_) && (k.dim(3) % 32 != 0 || v.dim(3) % 32 != 0))
    throw ValueError(std::string("KVCache.append: a ") + kv_dtype_name(dtype_) + " cache stores rows in blocks of 32, so head_dim "
                     "must be a multiple of 32, got k " + shape_str(k.shape()) + ", v " +
                     shape_str(v.shape()));
  const bool first = std::visit([](const auto& s) { return s.rank() != 4; }, keys_);
  if (first) {
    const auto start = [&](auto& s, int64_t row) {
      using S = std::remove_cvref_t<decltype(*s.data())>;
      s = Tensor<S>(Shape{k.dim(0), k.dim(1), 0, row});
    };
    const bool key_groups = dtype_ == KVDtype::INT4;  // a block per channel
    std::visit([&](auto& s) { start(s, key_groups ? k.dim(3) : row_elements<std::remove_cvref_t<decltype(*s.data())>>(k.dim(3))); }, keys_);
    std::visit([&](auto& s) { start(s, row_elements<std::remove_cvref_t<decltype(*s.data())>>(v.dim(3))); }, values_);
    if (key_groups) key_tail_ = Tensor<float>({k.dim(0), k.dim(1), kInt4Group, k.dim(3)});
    head_dim_k_ = k.dim(3), head_dim_v_ = v.dim(3);
  }
  const int64_t batch = std::visit([](const auto& s) { return s.dim(0); }, keys_);
  const int64_t heads = std::visit([](const auto& s) { return s.dim(1); }, keys_);
  if (k.dim(0) != batch || k.dim(1) != heads || k.dim(3) != head_dim_k_ || v.dim(3) != head_dim_v_)
    throw ValueError("KVCache.append: the cache holds batch " + std::to_string(batch) +
                     ", heads " + std::to_string(heads) + ", head_dim " +
                     std::to_string(head_dim_k_) + "; cannot append k " + shape_str(k.shape()) +
                     ", v " + shape_str(v.shape()));
  const int64_t n = k.dim(2);
  if (length_ + n > capacity()) reserve(std::max<int64_t>({16, 2 * capacity(), length_ + n}));
  // Written past length_ first: a failure (a value q8_0 or q4_0 cannot hold) leaves
  // the cached tokens as they were.
  std::visit([&](auto& s) { store_rows(v, s, length_); }, values_);
  if (dtype_ == KVDtype::INT4) append_int4_keys(k);
  else std::visit([&](auto& s) { store_rows(k, s, length_); }, keys_);
  length_ += n;
  for (int64_t t = 0; t < n; ++t) positions_.push_back(seen_ + t);
  seen_ += n;
}

// The groups from the one the tail starts on are quantized again from the
// tail's float32 keys and k's, into a copy first: a value int4 cannot hold
// changes nothing.
template <class T>
void KVCache<T>::append_int4_keys(TensorView<const T> k) {
  if constexpr (std::is_same_v<T, float>) {
    const int64_t B = k.dim(0), H = k.dim(1), n = k.dim(2), d = k.dim(3);
    const int64_t first = length_ / kInt4Group, held = length_ % kInt4Group, rows = held + n;
    const int64_t count = (rows + kInt4Group - 1) / kInt4Group, tail = rows % kInt4Group;
    Tensor<block_int4> groups({B, H, count, d});
    Tensor<float> tails({B, H, kInt4Group, d});
    std::vector<float> keys(static_cast<size_t>(rows * d));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        std::copy_n(&key_tail_.data()[(b * H + h) * kInt4Group * d], held * d, keys.data());
        for (int64_t t = 0; t < n; ++t)
          for (int64_t c = 0; c < d; ++c) keys[static_cast<size_t>((held + t) * d + c)] = k.at({b, h, t, c});
        try {
          quantize_int4_key_rows(keys.data(), rows, d, groups.data() + (b * H + h) * count * d, first * kInt4Group);
        } catch (const ValueError& e) {
          throw ValueError("KVCache.append: " + std::string(e.what()) + " (batch " + std::to_string(b) + ", head " +
                           std::to_string(h) + ")");
        }
        std::copy_n(keys.data() + (rows - tail) * d, tail * d, &tails.data()[(b * H + h) * kInt4Group * d]);
      }
    auto& stored = std::get<Tensor<block_int4>>(keys_);
    const int64_t capacity_groups = stored.dim(2);
    for (int64_t bh = 0; bh < B * H; ++bh)
      std::copy_n(groups.data() + bh * count * d, count * d, stored.data() + (bh * capacity_groups + first) * d);
    key_tail_ = std::move(tails);
  }
}

template <class T>
template <class S>
void KVCache<T>::restore(TensorView<const S> keys, TensorView<const S> values, const std::vector<int64_t>& positions,
                         int64_t seen, TensorView<const float> key_tail) {
  const auto held = use("restore");
  constexpr bool key_groups = std::is_same_v<S, block_int4>;
  if (!std::holds_alternative<Tensor<S>>(keys_))
    throw TypeError(std::string("KVCache.restore: the cache stores ") +
                    (dtype_ == KVDtype::F32 ? (std::is_same_v<T, float> ? "float32" : "float64") : kv_dtype_name(dtype_)) +
                    ", and the keys and values given are of another storage type");
  const auto shapes = "keys " + shape_str(keys.shape()) + ", values " + shape_str(values.shape());
  const int64_t length = values.rank() == 4 ? values.dim(2) : -1, groups = (length + kInt4Group - 1) / kInt4Group;
  if (keys.rank() != 4 || values.rank() != 4 || keys.dim(0) != values.dim(0) || keys.dim(1) != values.dim(1) ||
      keys.dim(2) != (key_groups ? groups : length))
    throw ValueError(std::string("KVCache.restore: keys and values must be (batch, heads, length, row) with equal batch, "
                                 "heads and length") + (key_groups ? " (int4 keys: ⌈length / 32⌉ groups)" : "") +
                     ", got " + shapes);
  const Shape tail_shape{keys.dim(0), keys.dim(1), length % kInt4Group, keys.dim(3)};
  if (key_groups ? !key_tail.empty_view() && key_tail.shape() != tail_shape : !key_tail.empty_view())
    throw ValueError("KVCache.restore: key_tail must be " +
                     (key_groups ? "empty or " + shape_str(tail_shape) + ", got " + shape_str(key_tail.shape())
                                 : std::string("empty for a cache that does not store int4")));
  if (static_cast<int64_t>(positions.size()) != length)
    throw ValueError("KVCache.restore: " + std::to_string(positions.size()) + " positions for " +
                     std::to_string(length) + " tokens");
  for (int64_t t = 0; t < length; ++t)
    if (positions[t] < 0 || positions[t] >= seen || (t > 0 && positions[t] <= positions[t - 1]))
      throw ValueError("KVCache.restore: positions must ascend from 0 and stay below seen (" + std::to_string(seen) +
                       "), got " + std::to_string(positions[t]) + " at " + std::to_string(t));
  Tensor<S> k = contiguous(keys), v = contiguous(values);  // (before anything changes)
  if constexpr (key_groups) {
    // The last group's keys: as given, or as its blocks hold them.
    Tensor<float> tails({keys.dim(0), keys.dim(1), kInt4Group, keys.dim(3)});
    const int64_t d = keys.dim(3), rows = length % kInt4Group;
    for (int64_t bh = 0; bh < keys.dim(0) * keys.dim(1); ++bh)
      for (int64_t t = 0; t < rows; ++t)
        for (int64_t c = 0; c < d; ++c)
          tails.data()[(bh * kInt4Group + t) * d + c] =
              key_tail.empty_view() ? int4_value(k.data()[(bh * groups + groups - 1) * d + c], t)
                                    : key_tail.at({bh / keys.dim(1), bh % keys.dim(1), t, c});
    key_tail_ = std::move(tails);
  }
  keys_ = std::move(k);
  values_ = std::move(v);
  head_dim_k_ = keys.dim(3) * (key_groups ? 1 : kBlockValues<S>), head_dim_v_ = values.dim(3) * kBlockValues<S>;
  length_ = length;
  seen_ = seen;
  positions_ = positions;
}

template <class T>
void KVCache<T>::evict() {
  const auto held = use("evict");
  if (!is_streaming()) return;
  // The first sink_tokens of the stream are the first slots; the window's
  // tokens the last. Those in between go, and the window's move down.
  int64_t sinks = 0;
  while (sinks < length_ && positions_[sinks] < streaming_.sink_tokens) ++sinks;
  const int64_t keep_from = std::max(sinks, length_ - streaming_.window);
  if (keep_from == sinks) return;
  const int64_t kept = length_ - keep_from;
  const auto compact = [&](auto& s) {
    using S = std::remove_cvref_t<decltype(*s.data())>;
    const int64_t cap = s.dim(2), row = s.dim(3);
    for (int64_t bh = 0; bh < s.dim(0) * s.dim(1); ++bh)
      std::memmove(s.data() + (bh * cap + sinks) * row, s.data() + (bh * cap + keep_from) * row,
                   sizeof(S) * kept * row);
  };
  std::visit(compact, keys_);
  std::visit(compact, values_);
  positions_.erase(positions_.begin() + sinks, positions_.begin() + keep_from);
  length_ = sinks + kept;
}

template class KVCache<float>;
template class KVCache<double>;

#define ATTN_KV_RESTORE(T, S)                                                                              \
  template void KVCache<T>::restore(TensorView<const S>, TensorView<const S>, const std::vector<int64_t>&, \
                                    int64_t, TensorView<const float>);
ATTN_KV_RESTORE(float, float)
ATTN_KV_RESTORE(float, bfloat16)
ATTN_KV_RESTORE(float, float16)
ATTN_KV_RESTORE(float, block_q8_0)
ATTN_KV_RESTORE(float, block_q4_0)
ATTN_KV_RESTORE(float, block_int4)
ATTN_KV_RESTORE(double, double)
#undef ATTN_KV_RESTORE

}  // namespace attn
