#include "attn/latent_cache.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "stored_rows.hpp"

namespace attn {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw ValueError("LatentCache: " + msg); }

// Rows (batch, capacity, width) with the first `length` rows of each batch
// entry copied from `old` (same batch and width).
template <class S>
Tensor<S> regrown(const Tensor<S>& old, int64_t batch, int64_t capacity, int64_t width, int64_t length) {
  Tensor<S> t({batch, capacity, width});
  if (old.rank() == 3)
    for (int64_t b = 0; b < batch; ++b)
      std::copy_n(old.data() + b * old.dim(1) * width, length * width, t.data() + b * capacity * width);
  return t;
}

}  // namespace

LatentCache::LatentCache(KVDtype dtype, int64_t kv_lora_rank, int64_t rope_dim)
    : dtype_(dtype), rank_(kv_lora_rank), rope_(rope_dim) {
  if (kv_lora_rank < 1 || rope_dim < 0)
    fail("kv_lora_rank must be >= 1 and rope_dim >= 0, got " + std::to_string(kv_lora_rank) + " and " +
         std::to_string(rope_dim));
  if (dtype == KVDtype::Q4_0 || dtype == KVDtype::INT4)
    fail(std::string("a latent cache stores f32, bf16, f16 or q8_0, not ") + kv_dtype_name(dtype) +
         " (its 4-bit latents would feed every head's keys and values alike; not offered)");
  if (dtype == KVDtype::Q8_0 && kv_lora_rank % kQ8_0Block != 0)
    fail("q8_0 stores blocks of 32 values, so kv_lora_rank must be a multiple of 32, got " +
         std::to_string(kv_lora_rank));
  if (dtype == KVDtype::BF16) rows_ = Tensor<bfloat16>();
  if (dtype == KVDtype::F16) rows_ = Tensor<float16>();
}

int64_t LatentCache::bytes_per_token() const {
  if (dtype_ == KVDtype::Q8_0) return kv_dtype_bytes(KVDtype::Q8_0, rank_) + 2 * rope_;
  return kv_dtype_bytes(dtype_, rank_ + rope_);
}

void LatentCache::reserve(int64_t capacity) {
  if (dtype_ == KVDtype::Q8_0) {
    c_q8_ = regrown(c_q8_, batch_, capacity, rank_ / kQ8_0Block, length_);
    kpe_bf16_ = regrown(kpe_bf16_, batch_, capacity, rope_, length_);
    return;
  }
  std::visit([&](auto& t) { t = regrown(t, batch_, capacity, rank_ + rope_, length_); }, rows_);
}

void LatentCache::append(TensorView<const float> c, TensorView<const float> kpe) {
  const auto held = user_.hold("append");
  const std::string shapes = "c " + shape_str(c.shape()) + ", k_pe " + shape_str(kpe.shape());
  if (c.rank() != 3 || kpe.rank() != 3 || c.dim(0) != kpe.dim(0) || c.dim(1) != kpe.dim(1))
    fail("append takes c (batch, n, kv_lora_rank) and k_pe (batch, n, qk_rope_head_dim), got " + shapes);
  const int64_t B = c.dim(0), n = c.dim(1), r = c.dim(2), p = kpe.dim(2);
  if (r != rank_ || p != rope_ || (length_ > 0 && B != batch_))
    fail("the cache holds " + (length_ > 0 ? "batch " + std::to_string(batch_) + " of " : std::string()) + "rows " +
         std::to_string(rank_) + " + " + std::to_string(rope_) + ", got " + shapes);
  // Converted first, so that a value the storage cannot hold appends nothing.
  const bool q8 = dtype_ == KVDtype::Q8_0;
  const int64_t width = q8 ? r : r + p;
  std::vector<float> rows(static_cast<size_t>(B * n * width));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < n; ++t) {
      float* row = rows.data() + (b * n + t) * width;
      for (int64_t i = 0; i < r; ++i) row[i] = c.at({b, t, i});
      if (!q8)
        for (int64_t i = 0; i < p; ++i) row[r + i] = kpe.at({b, t, i});
    }
  const int64_t nb = r / kQ8_0Block;
  std::vector<block_q8_0> blocks(q8 ? static_cast<size_t>(B * n * nb) : 0);
  if (q8)
    for (int64_t t = 0; t < B * n; ++t) detail::store_row(rows.data() + t * r, blocks.data() + t * nb, r);

  if (length_ == 0 && B != batch_) {  // a new (or cleared) cache takes this call's batch
    batch_ = B;
    std::visit([](auto& t) { t = {}; }, rows_);
    c_q8_ = {}, kpe_bf16_ = {};
  }
  const int64_t capacity = q8 ? (c_q8_.rank() ? c_q8_.dim(1) : 0)
                              : std::visit([](const auto& t) { return t.rank() ? t.dim(1) : int64_t{0}; }, rows_);
  if (length_ + n > capacity) reserve(std::max(length_ + n, 2 * capacity));
  if (q8) {
    const int64_t cap = c_q8_.dim(1);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < n; ++t) {
        std::copy_n(blocks.data() + (b * n + t) * nb, nb, c_q8_.data() + (b * cap + length_ + t) * nb);
        bfloat16* out = kpe_bf16_.data() + (b * cap + length_ + t) * p;
        for (int64_t i = 0; i < p; ++i) out[i].bits = float_to_bf16(kpe.at({b, t, i}));
      }
  } else {
    std::visit([&](auto& t) {
      using S = std::remove_cvref_t<decltype(*t.data())>;
      const int64_t cap = t.dim(1);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < n; ++i) {
          S* out = t.data() + (b * cap + length_ + i) * width;
          const float* in = rows.data() + (b * n + i) * width;
          if constexpr (std::is_same_v<S, float>) std::copy_n(in, width, out);
          else detail::store_row(in, out, width);
        }
    }, rows_);
  }
  length_ += n;
}

Tensor<float> LatentCache::dequantized(int64_t b) const {
  const int64_t r = rank_, p = rope_, row = r + p;
  Tensor<float> rows({length_, row});
  if (length_ == 0) return rows;
  const int64_t cap = c_q8_.dim(1), nb = r / kQ8_0Block;
  for (int64_t t = 0; t < length_; ++t) {
    detail::widen_row(c_q8_.data() + (b * cap + t) * nb, rows.data() + t * row, r);
    detail::widen_row(kpe_bf16_.data() + (b * cap + t) * p, rows.data() + t * row + r, p);
  }
  return rows;
}

}  // namespace attn
