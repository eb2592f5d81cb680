// The latent cache of multi-head latent attention (DeepSeek-V2/V3, Kimi K2):
// per token, the normalised compressed latent c (kv_lora_rank values) and
// the rotated RoPE key k_pe (qk_rope_head_dim), shared by every head: 576
// numbers per token in DeepSeek-V3, where the expanded keys and values of
// 128 heads would take 40,960.
#pragma once

#include <cstdint>
#include <variant>

#include "attn/half.hpp"
#include "attn/kv_cache.hpp"
#include "attn/quantize.hpp"
#include "attn/tensor.hpp"

namespace attn {

// Rows [c | k_pe] per batch entry and token. F32, BF16 and F16 store the
// whole row in that type, so attention reads it in place (keys [c | k_pe],
// values c: the same row). Q8_0 stores c as GGUF q8_0 blocks (kv_lora_rank a
// multiple of 32) and keeps k_pe in bfloat16, as FlashMLA's FP8 layout keeps
// its RoPE part in 16 bits: the rotated key carries the positions, which 8
// bits would blur. The widths are the layer's; the batch size is fixed by
// the first append (after clear(), again); the capacity doubles when full.
// One thread at a time, as KVCache.
class LatentCache {
 public:
  // ValueError for q8_0 with a kv_lora_rank that is not a multiple of 32,
  // and for q4_0 (not offered for latents).
  LatentCache(KVDtype dtype, int64_t kv_lora_rank, int64_t rope_dim);

  KVDtype dtype() const { return dtype_; }
  int64_t length() const { return length_; }  // tokens held per batch entry
  int64_t batch() const { return batch_; }
  int64_t kv_lora_rank() const { return rank_; }
  int64_t rope_dim() const { return rope_; }
  // The bytes one token of one batch entry takes: (r + p) · 4 or · 2, or for
  // q8_0 r / 32 · 34 + 2 p (DeepSeek-V3: 2304, 1152, 1152 and 672 bytes).
  int64_t bytes_per_token() const;
  // The bytes of the tokens held (batch · length · bytes_per_token), not the capacity.
  int64_t nbytes() const { return batch_ * length_ * bytes_per_token(); }

  // Appends c (batch, n, r) and k_pe (batch, n, p), float32, any strides.
  // On an error (shapes that differ from the cache's, a value q8_0 cannot
  // hold) nothing is appended.
  void append(TensorView<const float> c, TensorView<const float> kpe);

  // f(rows) with batch entry b's rows (length, r + p): of the storage type
  // and read in place for F32, BF16 and F16; dequantized to float32 (a copy)
  // for Q8_0. Valid until the next append.
  template <class F>
  decltype(auto) visit(int64_t b, F&& f) const {
    const auto held = user_.hold("visit");
    if (dtype_ == KVDtype::Q8_0) {
      const Tensor<float> rows = dequantized(b);
      return f(rows.view());
    }
    return std::visit([&](const auto& t) -> decltype(auto) {
      using S = std::remove_cvref_t<decltype(*t.data())>;
      const int64_t row = rank_ + rope_, cap = t.rank() ? t.dim(1) : 0;
      return f(TensorView<const S>(t.data() + b * cap * row, {length_, row}, {row, 1}));
    }, rows_);
  }

  // Holds the cache for this thread until the result goes out of scope (the
  // layer's forward does); RuntimeError if another thread does.
  [[nodiscard]] detail::CacheUser::Hold use(const char* who) const { return user_.hold(who); }

  void clear() {
    const auto held = user_.hold("clear");
    length_ = 0;
  }

 private:
  Tensor<float> dequantized(int64_t b) const;
  void reserve(int64_t capacity);

  KVDtype dtype_;
  std::variant<Tensor<float>, Tensor<bfloat16>, Tensor<float16>> rows_;  // (batch, capacity, r + p)
  Tensor<block_q8_0> c_q8_;   // Q8_0: (batch, capacity, r / 32)
  Tensor<bfloat16> kpe_bf16_;  // Q8_0: (batch, capacity, p)
  int64_t batch_ = 0, rank_ = 0, rope_ = 0, length_ = 0;
  detail::CacheUser user_;
};

}  // namespace attn
