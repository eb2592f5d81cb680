// A key/value cache for incremental decoding: the keys and values of every
// token seen so far, per batch entry and key/value head, stored as T or, for
// a float32 cache, compactly (bf16, f16, q8_0, q4_0 or int4: attn/quantize.hpp).
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "attn/quantize.hpp"
#include "attn/tensor.hpp"

namespace attn {

// Where a streaming cache's keys sit for RoPE: at the positions their tokens
// had in the stream (Original: each key keeps the rotation it was stored
// with), or at their slots in the cache (Cache: StreamingLLM's and Hugging
// Face's SinkCache re-indexing, to run past the trained length; the cache
// then keeps keys unrotated and the layer rotates them by slot each call).
enum class CachePositions { Original, Cache };

// StreamingLLM (Xiao et al.): a cache that keeps the stream's first
// sink_tokens tokens and its last `window`, so a stream of any length runs
// in bounded memory. Token t attends key j iff j <= t and (j < sink_tokens
// or j > t - window). window = 0: not streaming (every token is kept).
struct StreamingCache {
  int64_t sink_tokens = 0;
  int64_t window = 0;
  CachePositions positions = CachePositions::Original;
};

namespace detail {

// The thread using a cache, and how deeply (the layer's forward holds it and
// appends within). A cache is one sequence's state: one thread at a time.
// Another thread's use meanwhile is a RuntimeError, never a race. A copy of
// a cache starts unused.
class CacheUser {
 public:
  CacheUser() = default;
  CacheUser(const CacheUser&) {}
  CacheUser& operator=(const CacheUser&) { return *this; }

  // Released when it goes out of scope.
  class Hold {
   public:
    explicit Hold(const CacheUser& user) : user_(&user) {}
    Hold(Hold&& other) noexcept : user_(std::exchange(other.user_, nullptr)) {}
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    Hold& operator=(Hold&&) = delete;
    ~Hold() {
      if (user_ && --user_->depth_ == 0) user_->owner_.store(std::thread::id(), std::memory_order_release);
    }

   private:
    const CacheUser* user_;
  };
  // Throws RuntimeError naming `who` when another thread holds the cache.
  [[nodiscard]] Hold hold(const char* who) const;

 private:
  mutable std::atomic<std::thread::id> owner_{};
  mutable int depth_ = 0;  // touched by the owner only
};

}  // namespace detail

// Storage is (batch, heads, capacity, head_dim) for keys and for values (a
// q8_0 or q4_0 row: head_dim / 32 blocks, one row per token and head, so appending
// never re-quantizes old tokens); the capacity doubles when full, so
// appending is amortised O(chunk). The batch size, head count and head dim
// are fixed by the first append.
//
// int4 (KIVI) stores values so too, and keys per channel in groups of 32
// tokens, (batch, heads, capacity / 32, head_dim) blocks. The last group's
// keys are also kept in float32 until it fills (key_tail()), and its blocks
// quantized again from them at each append: a group's ranges are those of
// all its tokens, and the cache's keys are always quantize_int4_keys of
// every key appended. An int4 cache does not stream (it drops tokens one by
// one, its keys are quantized 32 at a time).
//
// One thread at a time: append, evict, clear, bytes, keys, values, visit and
// the layer's forward with the cache raise RuntimeError ("the cache is in
// use by another thread") while another thread is inside one of them. (The
// plain getters, length() and the like, only read; calling them meanwhile
// is a race.)
template <class T>
class KVCache {
 public:
  // dtype: how tokens are stored. F32 stores T itself (float64 for
  // KVCache<double>, its only storage); BF16, F16, Q8_0, Q4_0 and INT4 need
  // T = float, and the last three a head_dim that is a multiple of 32.
  explicit KVCache(KVDtype dtype = KVDtype::F32, const StreamingCache& streaming = {});

  KVDtype dtype() const { return dtype_; }
  const StreamingCache& streaming() const { return streaming_; }
  bool is_streaming() const { return streaming_.window > 0; }
  int64_t length() const { return length_; }  // tokens held
  int64_t seen() const { return seen_; }      // tokens appended since the start (or clear())
  // The stream positions of the tokens held, ascending (0 .. length - 1
  // unless the cache streams).
  const std::vector<int64_t>& positions() const { return positions_; }
  int64_t capacity() const;
  bool empty() const { return length_ == 0; }
  // The bytes the cached tokens' keys and values take (not the capacity).
  int64_t bytes() const;

  // Appends k, v of shape (batch, heads, n, head_dim) (any strides),
  // converting them to the storage type. On an error (a shape, or a value
  // q8_0 or q4_0 cannot hold) nothing is appended.
  void append(TensorView<const T> k, TensorView<const T> v);

  // f(keys, values) with views (batch, heads, length, head_dim) of
  // everything cached, of the storage type (a block type's last axis counts
  // blocks, as attention() takes it; int4's keys are (batch, heads,
  // ⌈length / 32⌉, head_dim)); valid until the next append.
  template <class F>
  decltype(auto) visit(F&& f) const {
    const auto held = use("visit");
    return std::visit(
        [&](const auto& k) -> decltype(auto) {
          using S = std::remove_cvref_t<decltype(*k.data())>;
          return f(view(k, std::is_same_v<S, block_int4> ? (length_ + kInt4Group - 1) / kInt4Group : length_),
                   view(std::get<Tensor<S>>(values_), length_));
        },
        keys_);
  }

  // int4: the keys of the last group, (batch, heads, length % 32, head_dim)
  // in float32, as they were appended; a ValueError for another dtype.
  TensorView<const float> key_tail() const;

  // The views of a cache that stores T (dtype F32); a ValueError otherwise.
  TensorView<const T> keys() const;
  TensorView<const T> values() const;

  // Puts back a cache's content as visit(), positions() and seen() give it
  // (pickling, copies): keys and values (batch, heads, length, row) of the
  // storage type (S: T for an F32 cache; bfloat16, float16, block_q8_0,
  // block_q4_0 or block_int4), the stream position of each token held
  // (ascending, below seen), and for int4 key_tail() (empty: the last
  // group's keys as its blocks hold them). Replaces what the cache held;
  // ValueError (TypeError for another storage type) naming what does not
  // fit, the cache then unchanged.
  template <class S>
  void restore(TensorView<const S> keys, TensorView<const S> values, const std::vector<int64_t>& positions,
               int64_t seen, TensorView<const float> key_tail = {});

  // A streaming cache: drops every token but the first sink_tokens of the
  // stream and its last `window` (nothing otherwise). The layer calls it
  // after each forward, when the chunk's queries have seen the chunk.
  void evict();

  void clear() {
    const auto held = use("clear");
    length_ = seen_ = 0;
    positions_.clear();
  }

  // Holds the cache for this thread until the result goes out of scope (the
  // layer's forward does); RuntimeError naming `who` if another thread does.
  [[nodiscard]] detail::CacheUser::Hold use(const char* who) const { return user_.hold(who); }

 private:
  using Storage = std::variant<Tensor<T>, Tensor<bfloat16>, Tensor<float16>, Tensor<block_q8_0>, Tensor<block_q4_0>,
                               Tensor<block_int4>>;
  // The first `rows` rows (tokens; int4's key groups) of each head.
  template <class S>
  static TensorView<const S> view(const Tensor<S>& s, int64_t rows) {
    if (s.rank() != 4) return TensorView<const S>(s.data(), {0, 0, 0, 0});
    const int64_t cap = s.dim(2), row = s.dim(3);
    return TensorView<const S>(s.data(), {s.dim(0), s.dim(1), rows, row}, {s.dim(1) * cap * row, cap * row, row, 1});
  }
  void append_int4_keys(TensorView<const T> k);
  TensorView<const T> own_type(const Storage& s, const char* name) const;
  void reserve(int64_t capacity);

  KVDtype dtype_;
  StreamingCache streaming_;
  Storage keys_, values_;  // (batch, heads, capacity, row), row in the storage type
  Tensor<float> key_tail_;  // int4: (batch, heads, 32, head_dim), the last group's keys
  int64_t head_dim_k_ = 0, head_dim_v_ = 0;
  int64_t length_ = 0, seen_ = 0;
  std::vector<int64_t> positions_;
  detail::CacheUser user_;
};

extern template class KVCache<float>;
extern template class KVCache<double>;

}  // namespace attn
