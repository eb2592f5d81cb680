// Keys and values stored compactly (attn/quantize.hpp): q8_0 and q4_0 blocks
// as GGUF defines them, KIVI's int4 groups, both kernels reading every storage type on every SIMD target
// against the double reference, the accuracy each storage type keeps, the
// KV cache in every storage type, and the memory a compact prefill uses.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <type_traits>

#include "attn/attn.hpp"
#include "attn/quantize.hpp"
#include "helpers.hpp"

namespace attn {
namespace {

using test::cast;
using test::describe;
using test::KernelCase;
using test::options_of;
using test::random_tensor;
using test::rel_error;

// GGUF's q8_0, from its definition: d = max|x| / 127 in float32, stored as
// fp16; q = x / d rounded to the nearest integer (either way at a tie).
TEST(Q8_0, BlocksFollowTheGgufDefinition) {
  EXPECT_EQ(offsetof(block_q8_0, qs), 2u);  // d first, then the 32 codes
  std::mt19937 rng(5);
  for (double scale : {1e-4, 1.0, 3e5}) {
    auto x = cast<float>(random_tensor({7 * 32}, rng, -scale, scale));
    for (int j = 0; j < 32; ++j) x[j] = 0.0f;               // an all-zero block: d = 0
    x[32 + 5] = static_cast<float>(-2 * scale);             // a negative maximum
    for (int j = 64; j < 96; ++j) x[j] = j == 70 ? 1.0f : 0.0f;  // one value
    std::vector<block_q8_0> blocks(7);
    quantize_row_q8_0(x.data(), blocks.data(), x.numel());
    for (int b = 0; b < 7; ++b) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
      const float d = amax / 127.0f;
      ASSERT_EQ(blocks[b].d.bits, float_to_fp16(d)) << "block " << b;
      for (int j = 0; j < 32; ++j) {
        const float xj = x[b * 32 + j];
        const int q = blocks[b].qs[j];
        if (d == 0) {
          EXPECT_EQ(q, 0);
          continue;
        }
        EXPECT_LE(std::fabs(q - double(xj) / d), 0.5 + 1e-5) << "block " << b << " value " << j;
        if (std::fabs(xj) == amax) {
          EXPECT_EQ(std::abs(q), 127);
        }
      }
    }
    std::vector<float> y(x.numel());
    dequantize_row_q8_0(blocks.data(), y.data(), x.numel());
    for (int64_t i = 0; i < x.numel(); ++i)
      EXPECT_EQ(y[i], fp16_to_float(blocks[i / 32].d.bits) * blocks[i / 32].qs[i % 32]);
  }
}

TEST(Q8_0, ValuesItCannotHoldAreClearErrors) {
  EXPECT_THROW_MSG(quantize_q8_0(Tensor<float>({2, 48}).view()), ValueError, "multiple of 32");
  Tensor<float> x({2, 64});
  x[70] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW_MSG(quantize_q8_0(x.view()), ValueError, "finite");
  x[70] = 1e7f * 127;
  EXPECT_THROW_MSG(quantize_q8_0(x.view()), ValueError, "overflows its fp16 scale");
  EXPECT_THROW_MSG(parse_kv_dtype("int3"), ValueError, "f32, bf16, f16, q8_0, q4_0 or int4");
}

// GGUF's q4_0, from ggml's quantize_row_q4_0_ref: m the block's value of
// largest magnitude (the first), d = m / -8 in float32, stored as fp16;
// code = min(15, trunc(x / d + 8.5)); byte j holds codes j (low nibble) and
// j + 16 (high); a value is d · (code − 8).
TEST(Q4_0, BlocksFollowTheGgufDefinition) {
  EXPECT_EQ(offsetof(block_q4_0, qs), 2u);
  std::mt19937 rng(6);
  for (double scale : {1e-4, 1.0, 3e4}) {
    auto x = cast<float>(random_tensor({7 * 32}, rng, -scale, scale));
    for (int j = 0; j < 32; ++j) x[j] = 0.0f;                     // an all-zero block
    x[32 + 5] = static_cast<float>(-2 * scale);                   // a negative extreme
    x[96 + 3] = static_cast<float>(2 * scale), x[96 + 20] = static_cast<float>(-2 * scale);  // a tie: the first
    std::vector<block_q4_0> blocks(7);
    quantize_row_q4_0(x.data(), blocks.data(), x.numel());
    std::vector<float> y(x.numel());
    dequantize_row_q4_0(blocks.data(), y.data(), x.numel());
    for (int b = 0; b < 7; ++b) {
      float amax = 0, m = 0;
      for (int j = 0; j < 32; ++j)
        if (std::fabs(x[b * 32 + j]) > amax) amax = std::fabs(x[b * 32 + j]), m = x[b * 32 + j];
      const float d = m / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
      ASSERT_EQ(blocks[b].d.bits, float_to_fp16(d)) << "block " << b;
      for (int j = 0; j < 32; ++j) {
        const int want = std::min(15, static_cast<int>(x[b * 32 + j] * id + 8.5f));
        const int byte = blocks[b].qs[j % 16], code = j < 16 ? byte & 15 : byte >> 4;
        EXPECT_EQ(code, want) << "block " << b << " value " << j;
        EXPECT_EQ(y[b * 32 + j], fp16_to_float(blocks[b].d.bits) * float(code - 8));
        if (x[b * 32 + j] == m && amax > 0) {
          EXPECT_EQ(code, 0);  // the extreme is stored as −8 · d = m
        }
      }
    }
  }
  Tensor<float> bad({2, 64});
  bad[70] = std::numeric_limits<float>::infinity();
  EXPECT_THROW_MSG(quantize_q4_0(bad.view()), ValueError, "finite");
  bad[70] = 1e6f;
  EXPECT_THROW_MSG(quantize_q4_0(bad.view()), ValueError, "overflows its fp16 scale");
  EXPECT_THROW_MSG(quantize_q4_0(Tensor<float>({2, 48}).view()), ValueError, "multiple of 32");
}

// KIVI's int4 (Liu et al., 2024) in GGUF's q4_1 block: a block of values x
// (the first `count` of 32) has m = min x, d = (max x − m) / 15 in float32,
// both stored as fp16; code = min(15, trunc((x − m) / d + 0.5)), 0 past
// count, in q4_0's nibble order; a value is d · code + m. Keys take a block
// per channel and group of 32 tokens, values per token and 32 channels.
TEST(Int4, BlocksFollowKivisGroupsAndGgufQ4_1Rounding) {
  EXPECT_EQ(offsetof(block_int4, m), 2u);
  EXPECT_EQ(offsetof(block_int4, qs), 4u);
  std::mt19937 rng(8);
  const int64_t H = 2, n = 70, d = 64;  // a last group of 6 tokens
  auto x = cast<float>(random_tensor({H, n, d}, rng, -3, 5));
  for (int64_t j = 0; j < 32; ++j) x[j * d + 3] = 0.25f;  // a constant channel of a key group: d = 0
  const auto check_block = [&](const block_int4& b, const auto& value_at, int64_t count, const std::string& where) {
    float lo = value_at(0), hi = lo;
    for (int64_t i = 0; i < count; ++i) lo = std::min(lo, value_at(i)), hi = std::max(hi, value_at(i));
    const float scale = (hi - lo) / 15.0f, inverse = scale != 0 ? 1.0f / scale : 0.0f;
    ASSERT_EQ(b.d.bits, float_to_fp16(scale)) << where;
    ASSERT_EQ(b.m.bits, float_to_fp16(lo)) << where;
    for (int64_t i = 0; i < 32; ++i) {
      const int want = i < count ? std::min(15, static_cast<int>((value_at(i) - lo) * inverse + 0.5f)) : 0;
      const int byte = b.qs[i % 16], code = i < 16 ? byte & 15 : byte >> 4;
      ASSERT_EQ(code, want) << where << ", value " << i;
      EXPECT_EQ(int4_value(b, i), fp16_to_float(b.d.bits) * float(code) + fp16_to_float(b.m.bits));
    }
  };
  const auto keys = quantize_int4_keys(x.view());
  ASSERT_EQ(keys.shape(), (Shape{H, 3, d}));
  const auto key_values = dequantize_int4_keys(keys.view(), n);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t g = 0; g < 3; ++g)
      for (int64_t c = 0; c < d; ++c) {
        const auto at = [&](int64_t i) { return x[(h * n + g * 32 + i) * d + c]; };
        const block_int4& b = keys[(h * 3 + g) * d + c];
        check_block(b, at, std::min<int64_t>(32, n - g * 32), "key block " + std::to_string(g) + ", channel " +
                                                                  std::to_string(c));
        for (int64_t i = 0; i < std::min<int64_t>(32, n - g * 32); ++i)
          ASSERT_EQ(key_values[(h * n + g * 32 + i) * d + c], int4_value(b, i));
      }
  const auto values = quantize_int4_values(x.view());
  ASSERT_EQ(values.shape(), (Shape{H, n, d / 32}));
  const auto value_values = dequantize_int4_values(values.view());
  for (int64_t row = 0; row < H * n; ++row)
    for (int64_t blk = 0; blk < d / 32; ++blk) {
      const auto at = [&](int64_t i) { return x[row * d + blk * 32 + i]; };
      check_block(values[row * (d / 32) + blk], at, 32, "value row " + std::to_string(row));
      for (int64_t i = 0; i < 32; ++i)
        ASSERT_EQ(value_values[row * d + blk * 32 + i], int4_value(values[row * (d / 32) + blk], i));
    }
  Tensor<float> bad({1, 40, 32});
  bad[33 * 32 + 7] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW_MSG(quantize_int4_keys(bad.view()), ValueError, "channel 7 of keys 32 .. 39");
  EXPECT_THROW_MSG(quantize_int4_values(bad.view()), ValueError, "finite");
  bad[33 * 32 + 7] = -1e5f;
  EXPECT_THROW_MSG(quantize_int4_keys(bad.view()), ValueError, "overflow the block's fp16 scale or minimum");
  EXPECT_THROW_MSG(quantize_int4_values(Tensor<float>({2, 48}).view()), ValueError, "multiple of 32");
  EXPECT_THROW_MSG(dequantize_int4_keys(keys.view(), 64), ValueError, "⌈n / 32⌉");
}

// K and V in a storage type, with their values as the kernels must see them
// (dequantized by the library's scalar code, not the kernels' SIMD loads).
template <class F>
void with_storage(KVDtype dtype, const Tensor<float>& k, const Tensor<float>& v, F&& f) {
  const auto run = [&](auto ks, auto vs) {
    f(TensorView<const std::remove_cvref_t<decltype(*ks.data())>>(ks.view()),
      TensorView<const std::remove_cvref_t<decltype(*vs.data())>>(vs.view()), cast<double>(dequantize(ks.view())),
      cast<double>(dequantize(vs.view())));
  };
  switch (dtype) {
    case KVDtype::BF16: return run(to_bfloat16(k.view()), to_bfloat16(v.view()));
    case KVDtype::F16: return run(to_float16(k.view()), to_float16(v.view()));
    case KVDtype::Q8_0: return run(quantize_q8_0(k.view()), quantize_q8_0(v.view()));
    case KVDtype::Q4_0: return run(quantize_q4_0(k.view()), quantize_q4_0(v.view()));
    case KVDtype::INT4: {
      const auto ks = quantize_int4_keys(k.view()), vs = quantize_int4_values(v.view());
      return f(TensorView<const block_int4>(ks.view()), TensorView<const block_int4>(vs.view()),
               cast<double>(dequantize_int4_keys(ks.view(), k.dim(-2))), cast<double>(dequantize_int4_values(vs.view())));
    }
    case KVDtype::F32: break;
  }
  FAIL() << "with_storage takes the compact dtypes";
}

// Prefill (straddling 64-key tiles and row blocks, several query tiles)
// and decode (n_q <= 32, several 512-key chunks): GQA, both causal
// alignments, windows, softcap and both kinds of mask. Head dims are
// multiples of 32 (q8_0's blocks); the 16-bit types also take odd ones.
// Under emulation (SVE in qemu runs this about 300 times slower) and
// sanitizers the longest cases are shorter, still straddling what they
// straddle.
std::vector<KernelCase> storage_cases(bool odd_dims) {
  const bool small = test::emulated() || test::sanitized();
  const int64_t tiles = small ? 300 : 1100, long_keys = small ? 1025 : 2048;
  std::vector<KernelCase> cases = {
      {1, 2, 1, 300, 260, 64, 64, Causal::None, {}, 0, 0},
      {1, 2, 1, 300, 260, 64, 64, Causal::BottomRight, {}, 0, 1},
      {2, 4, 2, 129, 65, 32, 96, Causal::TopLeft, {}, 0, 0},
      {1, 2, 2, 200, 333, 64, 32, Causal::None, {70, 10}, 0, 1},
      {1, 3, 3, 150, 150, 32, 32, Causal::TopLeft, {}, 30.0, 2},
      {1, 1, 1, 64, 64, 128, 128, Causal::None, {}, 0, 0},
      {1, 4, 2, tiles, tiles, 64, 64, Causal::BottomRight, {}, 0, 0},  // several query tiles
      {1, 8, 8, 1, long_keys, 128, 128, Causal::None, {}, 0, 0},
      {2, 8, 2, 3, 1025, 64, 64, Causal::BottomRight, {}, 0, 0},
      {1, 4, 1, 8, long_keys, 32, 64, Causal::None, {600, -1}, 0, 1},
      {1, 2, 2, 2, 700, 32, 32, Causal::TopLeft, {}, 15.0, 2},
      {1, 2, 2, 1, 600, 32, 224, Causal::None, {}, 0, 0},
  };
  if (odd_dims) {
    cases.push_back({1, 2, 1, 70, 130, 17, 5, Causal::BottomRight, {}, 0, 0});
    cases.push_back({1, 2, 2, 2, 770, 40, 221, Causal::None, {}, 0, 1});
    cases.push_back({1, 1, 1, 257, 500, 7, 5, Causal::BottomRight, {0, -1}, 0, 0});
  }
  return cases;
}

// Both kernels on the stored K/V against the reference on the values they
// hold: float32 rounding only (the storage's own rounding is measured in
// StorageTypesKeepTheirAccuracy).
void check_storage(KVDtype dtype, const KernelCase& c, uint32_t seed) {
  SCOPED_TRACE(std::string(kv_dtype_name(dtype)) + " " + describe(c));
  std::mt19937 rng(seed);
  const auto q = random_tensor({c.batch, c.hq, c.n_q, c.d}, rng);
  const auto k = cast<float>(random_tensor({c.batch, c.hkv, c.n_k, c.d}, rng));
  const auto v = cast<float>(random_tensor({c.batch, c.hkv, c.n_k, c.d_v}, rng));
  Tensor<bool> mb({c.n_q, c.n_k});
  for (int64_t i = 0; i < mb.numel(); ++i) mb[i] = rng() % 5 != 0;
  Tensor<double> md = random_tensor({c.hq, 1, c.n_k}, rng, -2, 1);
  const Tensor<float> mf = cast<float>(md);
  Mask m32, m64;
  if (c.mask == 1) m32 = m64 = TensorView<const bool>(mb.view());
  if (c.mask == 2) m32 = TensorView<const float>(mf.view()), m64 = TensorView<const double>(md.view());
  const AttentionOptions o = options_of(c);
  const Tensor<float> q32 = cast<float>(q);
  with_storage(dtype, k, v, [&](auto ks, auto vs, const Tensor<double>& kd, const Tensor<double>& vd) {
    const auto ref = attention(q.view(), kd.view(), vd.view(), o, m64);  // once for every target
    test::on_every_simd_target([&] { EXPECT_LT(rel_error(attention(q32.view(), ks, vs, o, m32), ref), 1e-5); });
  });
}

TEST(KVStorage, KernelsReadEveryStorageTypeOnEveryTarget) {
  uint32_t seed = 900;
  for (KVDtype dtype : {KVDtype::BF16, KVDtype::F16, KVDtype::Q8_0, KVDtype::Q4_0, KVDtype::INT4})
    for (const auto& c : storage_cases(!is_block_dtype(dtype))) check_storage(dtype, c, seed++);
  // int4's keys take any head dim (a block per channel), decode's and the
  // prefill's; a partial last group, in the last chunk and not; one chunk
  // of keys or less, fewer than a group among them.
  for (const KernelCase& c : {KernelCase{1, 4, 2, 2, 700, 40, 64, Causal::None, {}, 0, 1},
                              KernelCase{1, 2, 1, 1, 1040, 8, 32, Causal::BottomRight, {}, 0, 0},
                              KernelCase{1, 2, 1, 37, 90, 17, 32, Causal::BottomRight, {}, 0, 0},
                              KernelCase{1, 4, 2, 1, 100, 64, 64, Causal::None, {}, 0, 0},
                              KernelCase{2, 2, 2, 3, 20, 32, 32, Causal::BottomRight, {}, 15.0, 1},
                              KernelCase{1, 2, 1, 8, 512, 24, 32, Causal::TopLeft, {64, 0}, 0, 2}})
    check_storage(KVDtype::INT4, c, seed++);
}

// q8_0 blocks viewed in place with strides: heads sliced from one wider
// array of blocks (a cache laid out as another engine lays it out) give the
// result of their contiguous copy.
TEST(KVStorage, StridedBlocksAreReadInPlace) {
  std::mt19937 rng(12);
  const auto q = cast<float>(random_tensor({2, 40, 64}, rng));
  const auto k = quantize_q8_0(cast<float>(random_tensor({40, 2, 64}, rng)).view());  // (n, heads, blocks)
  const auto v = quantize_q8_0(cast<float>(random_tensor({40, 2, 64}, rng)).view());
  const TensorView<const block_q8_0> kh(k.data(), {2, 40, 2}, {2, 4, 1}), vh(v.data(), {2, 40, 2}, {2, 4, 1});
  const auto got = attention(q.view(), kh, vh);
  const auto want = attention(q.view(), contiguous(kh).view(), contiguous(vh).view());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.numel() * sizeof(float)), 0);
  EXPECT_THROW_MSG(attention(q.view(), TensorView<const block_q8_0>(k.data(), {2, 40, 1}, {2, 4, 1}), vh),
                   ValueError, "(2, 40, 32)");
}

// The accuracy of each storage type on N(0, 1) inputs: the relative
// Frobenius error of the output against the double reference on the
// original values, plain and with one outlier channel (×30) in K, V or both.
// The bounds are issue 18's (q8_0 with outliers in both: its bound for K);
// what each measures is printed.
struct Bound {
  KVDtype dtype;
  double plain, outlier_k, outlier_v, outlier_both;
};

TEST(KVStorage, StorageTypesKeepTheirAccuracy) {
  const Bound bounds[] = {
      {KVDtype::BF16, 1e-2, 5e-2, 5e-2, 5e-2},
      // (The issue bounds fp16 without outliers only; with them, five times
      // that, as it allows bf16: an outlier ×30 raises the logits' rounding.)
      {KVDtype::F16, 2e-3, 1e-2, 1e-2, 1e-2},
      {KVDtype::Q8_0, 2e-2, 1e-1, 5e-2, 1e-1},
      // q4_0: 16 levels per block. The plain bound is issue 50's; an outlier
      // channel takes a block's scale, leaving its other values two or three
      // levels: measured 0.11-0.12 plain, 0.26-0.31 (K), 0.14-0.18 (V) and
      // 0.24-0.31 (both), bounded about 1.3 times above (KIVI-style int4's
      // per-channel keys are for this case).
      {KVDtype::Q4_0, 1.5e-1, 4e-1, 2.5e-1, 4e-1},
      // int4: the plain and K-outlier bounds are issue 50's; measured 0.10-0.11
      // plain, 0.10-0.12 (K: the outlier channel has its own blocks),
      // 0.12-0.17 (V, per token as q4_0) and 0.13-0.15 (both).
      {KVDtype::INT4, 1.5e-1, 1.5e-1, 2.5e-1, 2.5e-1},
  };
  // Prefill with GQA, a mask and causal; decode with GQA and causal. An
  // error over few rows is mostly that of their largest: decode takes its
  // most rows (8 queries × 8 heads), as with 16 the K-outlier error of q8_0
  // spread from 0.03 to 0.105 over seeds (0.04–0.07 with 64).
  // Under emulation and sanitizers, 128 queries and 1024 keys (two decode
  // chunks).
  const bool small = test::emulated() || test::sanitized();
  const KernelCase cases[] = {
      {1, 8, 2, small ? 128 : 256, small ? 128 : 256, 128, 128, Causal::BottomRight, {}, 0, 1},
      {1, 8, 2, 8, small ? 1024 : 4096, 128, 128, Causal::BottomRight, {}, 0, 0}};
  for (const KernelCase& c : cases) {
    std::mt19937 rng(77);
    std::normal_distribution<double> normal;
    const auto gaussian = [&](const Shape& s) {
      Tensor<double> t(s);
      for (int64_t i = 0; i < t.numel(); ++i) t[i] = normal(rng);
      return t;
    };
    const auto q = gaussian({c.batch, c.hq, c.n_q, c.d});
    const auto k = gaussian({c.batch, c.hkv, c.n_k, c.d}), v = gaussian({c.batch, c.hkv, c.n_k, c.d_v});
    Tensor<bool> mb({c.n_q, c.n_k});
    for (int64_t i = 0; i < mb.numel(); ++i) mb[i] = rng() % 5 != 0;
    const Mask mask = c.mask ? Mask(TensorView<const bool>(mb.view())) : Mask();
    const AttentionOptions o = options_of(c);
    for (int outlier = 0; outlier < 4; ++outlier) {  // none, in K, in V, in both
      auto ko = k, vo = v;
      const int64_t channel = 37;
      for (int64_t row = 0; row < ko.numel() / c.d; ++row)
        if (outlier == 1 || outlier == 3) ko[row * c.d + channel] *= 30;
      for (int64_t row = 0; row < vo.numel() / c.d_v; ++row)
        if (outlier == 2 || outlier == 3) vo[row * c.d_v + channel] *= 30;
      const auto ref = attention(q.view(), ko.view(), vo.view(), o, mask);  // once for every target
      const Tensor<float> q32 = cast<float>(q);
      for (const Bound& b : bounds) {
        const double bound = outlier == 0 ? b.plain : outlier == 1 ? b.outlier_k : outlier == 2 ? b.outlier_v : b.outlier_both;
        with_storage(b.dtype, cast<float>(ko), cast<float>(vo), [&](auto ks, auto vs, const auto&, const auto&) {
          test::on_every_simd_target([&] {
            const double err = rel_error(attention(q32.view(), ks, vs, o, mask), ref);
            const char* where[] = {"none", "K", "V", "K and V"};
            std::printf("accuracy %s n_q=%lld outlier in %s: %.2e (bound %.2g)\n", kv_dtype_name(b.dtype),
                        (long long)c.n_q, where[outlier], err, bound);
            EXPECT_LT(err, bound) << kv_dtype_name(b.dtype) << ", outlier in " << where[outlier];
          });
        });
      }
    }
  }
}

// The cache in every storage type: fed chunk by chunk, its attention equals
// one causal attention over the whole sequence's keys and values stored
// the same way, whatever the chunking; it reports the bytes its tokens use.
// restore() puts back what visit(), positions() and seen() give (pickling):
// the restored cache attends as the original, and what does not fit is
// refused with the cache left as it was.
TEST(KVStorage, RestoreGivesTheCacheBackAndRefusesWhatDoesNotFit) {
  std::mt19937 rng(12);
  const auto k = cast<float>(random_tensor({1, 2, 5, 32}, rng)), v = cast<float>(random_tensor({1, 2, 5, 32}, rng));
  KVCache<float> a(KVDtype::Q8_0, {1, 3, CachePositions::Original});
  a.append(k.view(), v.view());
  a.evict();  // positions 0, 2, 3, 4
  KVCache<float> b(KVDtype::Q8_0, {1, 3, CachePositions::Original});
  a.visit([&](auto keys, auto values) {
    using S = std::remove_const_t<std::remove_reference_t<decltype(*keys.data())>>;
    if constexpr (std::is_same_v<S, block_q8_0>) {
      b.restore(keys, values, a.positions(), a.seen());
      EXPECT_THROW_MSG(b.restore(keys, values, {0, 1}, 5), ValueError, "2 positions for 4 tokens");
      EXPECT_THROW_MSG(b.restore(keys, values, {0, 2, 2, 4}, 5), ValueError, "positions must ascend");
      EXPECT_THROW_MSG(b.restore(keys, values, a.positions(), 4), ValueError, "stay below seen (4)");
    }
  });
  EXPECT_EQ(b.positions(), (std::vector<int64_t>{0, 2, 3, 4}));
  EXPECT_EQ(b.seen(), 5);
  EXPECT_EQ(b.bytes(), a.bytes());
  EXPECT_THROW_MSG(b.restore(k.view(), v.view(), {0, 1, 2, 3, 4}, 5), TypeError, "the cache stores q8_0");
  const Tensor<float> q = cast<float>(random_tensor({1, 2, 1, 32}, rng));
  const auto attend = [&](const KVCache<float>& c) {
    return c.visit([&](auto keys, auto values) { return attention<float>(q.view(), keys, values); });
  };
  EXPECT_EQ(test::max_abs_diff(attend(a), attend(b)), 0.0);
}

// Tokens from .. from + count of t (batch, heads, n, d).
TensorView<const float> rows(const Tensor<float>& t, int64_t from, int64_t count) {
  return TensorView<const float>(t.data() + from * t.dim(3), {t.dim(0), t.dim(1), count, t.dim(3)},
                                 {t.dim(1) * t.dim(2) * t.dim(3), t.dim(2) * t.dim(3), t.dim(3), 1});
}

TEST(KVStorage, CacheInEveryStorageTypeEqualsOneCausalCall) {
  std::mt19937 rng(31);
  const int64_t B = 2, Hq = 4, Hkv = 2, n = 70, d = 64;
  const auto q = cast<float>(random_tensor({B, Hq, n, d}, rng));
  const auto k = cast<float>(random_tensor({B, Hkv, n, d}, rng));
  const auto v = cast<float>(random_tensor({B, Hkv, n, d}, rng));
  AttentionOptions causal;
  causal.causal = Causal::BottomRight;
  for (KVDtype dtype : {KVDtype::F32, KVDtype::BF16, KVDtype::F16, KVDtype::Q8_0, KVDtype::Q4_0}) {
    Tensor<float> whole;
    if (dtype == KVDtype::F32) whole = attention(q.view(), k.view(), v.view(), causal);
    else with_storage(dtype, k, v, [&](auto ks, auto vs, const auto&, const auto&) {
      whole = attention(q.view(), ks, vs, causal);
    });
    for (const std::vector<int64_t>& chunks : {std::vector<int64_t>{70}, {1, 1, 5, 63}, {33, 7, 30}}) {
      SCOPED_TRACE(std::string(kv_dtype_name(dtype)) + ", chunks of " + std::to_string(chunks[0]) + "...");
      KVCache<float> cache(dtype);
      Tensor<float> out({B, Hq, n, d});
      int64_t at = 0;
      for (int64_t count : chunks) {
        cache.append(rows(k, at, count), rows(v, at, count));
        const TensorView<float> out_rows(out.data() + at * d, {B, Hq, count, d}, {Hq * n * d, n * d, d, 1});
        cache.visit([&](auto K, auto V) { AttentionPlan(rows(q, at, count), K, V, causal).run(out_rows); });
        at += count;
      }
      EXPECT_LT(rel_error(out, whole), 1e-6);
      EXPECT_EQ(cache.bytes(), 2 * B * Hkv * n * kv_dtype_bytes(dtype, d));
    }
  }
  KVCache<float> q8(KVDtype::Q8_0);
  EXPECT_THROW_MSG(q8.append(Tensor<float>({1, 1, 2, 48}).view(), Tensor<float>({1, 1, 2, 48}).view()), ValueError,
                   "multiple of 32");
  Tensor<float> bad({1, 1, 2, 32});
  bad[40] = std::numeric_limits<float>::infinity();
  q8.append(Tensor<float>({1, 1, 3, 32}).view(), Tensor<float>({1, 1, 3, 32}).view());
  EXPECT_THROW_MSG(q8.append(bad.view(), bad.view()), ValueError, "finite");
  EXPECT_EQ(q8.length(), 3) << "a failed append keeps the tokens that were there";
  KVCache<float> q4(KVDtype::Q4_0);
  EXPECT_THROW_MSG(q4.append(Tensor<float>({1, 1, 2, 48}).view(), Tensor<float>({1, 1, 2, 48}).view()), ValueError,
                   "a q4_0 cache stores rows in blocks of 32");
  EXPECT_THROW_MSG(KVCache<double>{KVDtype::BF16}, ValueError, "float64 only");
  EXPECT_THROW_MSG(q8.keys(), ValueError, "read it with visit()");
}

// An int4 cache, fed chunk by chunk: its keys are always quantize_int4_keys
// of every key appended (the last group quantized again from its float32
// keys as it fills) and its values quantize_int4_values of every value, so
// each chunk's attention equals one causal call over the prefix so far
// stored so. It counts the last group's float32 keys among its bytes,
// gives them back (key_tail), and restore() with them gives a cache that
// appends as the original does; without them, its blocks' values.
TEST(KVStorage, Int4CacheQuantizesEveryGroupOverAllItsTokens) {
  std::mt19937 rng(32);
  const int64_t B = 1, Hq = 4, Hkv = 2, n = 75, d = 64;
  const auto q = cast<float>(random_tensor({B, Hq, n, d}, rng));
  const auto k = cast<float>(random_tensor({B, Hkv, n, d}, rng));
  const auto v = cast<float>(random_tensor({B, Hkv, n, d}, rng));
  AttentionOptions causal;
  causal.causal = Causal::BottomRight;
  const auto same_bytes = [](const auto& a, const auto& b) {
    return a.numel() == b.numel() && std::memcmp(a.data(), b.data(), a.numel() * sizeof(*a.data())) == 0;
  };
  KVCache<float> cache(KVDtype::INT4);
  int64_t at = 0;
  for (int64_t count : {1, 30, 2, 33, 9}) {
    SCOPED_TRACE("after " + std::to_string(at + count) + " tokens");
    cache.append(rows(k, at, count), rows(v, at, count));
    at += count;
    const auto kq = quantize_int4_keys(rows(k, 0, at)), vq = quantize_int4_values(rows(v, 0, at));
    cache.visit([&](auto K, auto V) {
      using S = std::remove_const_t<std::remove_reference_t<decltype(*K.data())>>;
      if constexpr (std::is_same_v<S, block_int4>) {
        EXPECT_TRUE(same_bytes(contiguous(K), kq));
        EXPECT_TRUE(same_bytes(contiguous(V), vq));
        const auto want = attention(rows(q, at - count, count), TensorView<const block_int4>(kq.view()),
                                    TensorView<const block_int4>(vq.view()), causal);
        EXPECT_EQ(test::max_abs_diff(attention(rows(q, at - count, count), K, V, causal), want), 0.0);
      } else {
        ADD_FAILURE() << "an int4 cache visits block_int4";
      }
    });
    EXPECT_TRUE(same_bytes(contiguous(cache.key_tail()), contiguous(rows(k, at / 32 * 32, at % 32))));
    EXPECT_EQ(cache.bytes(), B * Hkv * ((at + 31) / 32 * d * 20 + at % 32 * d * 4 + at * d / 32 * 20));
  }
  // Restored with its tail, then with its blocks' values: each appends on.
  for (bool with_tail : {true, false}) {
    KVCache<float> copy(KVDtype::INT4);
    cache.visit([&](auto K, auto V) {
      using S = std::remove_const_t<std::remove_reference_t<decltype(*K.data())>>;
      if constexpr (std::is_same_v<S, block_int4>)
        copy.restore(K, V, cache.positions(), cache.seen(), with_tail ? cache.key_tail() : TensorView<const float>());
    });
    const auto extra = cast<float>(random_tensor({B, Hkv, 5, d}, rng));
    KVCache<float> original = cache;
    original.append(extra.view(), extra.view());
    copy.append(extra.view(), extra.view());
    const auto attend = [&](const KVCache<float>& c) {
      return c.visit([&](auto K, auto V) { return attention<float>(rows(q, 0, 1), K, V); });
    };
    const double diff = test::max_abs_diff(attend(original), attend(copy));
    if (with_tail) EXPECT_EQ(diff, 0.0);
    else EXPECT_LT(diff, 0.2) << "the last group's keys as its blocks held them";
  }
  EXPECT_THROW_MSG(KVCache<float>(KVDtype::INT4, {0, 8, CachePositions::Original}), ValueError, "cannot stream");
  EXPECT_THROW_MSG(KVCache<float>(KVDtype::Q8_0).key_tail(), ValueError, "only an int4 cache");
  Tensor<float> bad({1, 2, 3, 64});
  bad[70] = std::numeric_limits<float>::infinity();
  const int64_t length = cache.length();
  EXPECT_THROW_MSG(cache.append(bad.view(), Tensor<float>({1, 2, 3, 64}).view()), ValueError, "channel 6 of keys");
  EXPECT_EQ(cache.length(), length) << "a failed append keeps the tokens that were there";
  EXPECT_TRUE(same_bytes(contiguous(cache.key_tail()), contiguous(rows(k, n / 32 * 32, n % 32))));
}

// The peak resident memory of this process since the last reset (Linux's
// VmHWM), in bytes; -1 where it cannot be read or reset.
int64_t status_bytes(const char* field) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind(field, 0) == 0) return std::stoll(line.substr(std::strlen(field))) * 1024;
  return -1;
}
bool reset_peak_rss() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return clear.good();
}

// Why this process's peak resident memory is no measure of the library's
// here, or null where it is.
const char* peak_memory_unmeasurable() {
  if (test::sanitized()) return "a sanitizer's shadow memory makes resident memory no measure of the library's";
  if (test::emulated()) return "under an emulator resident memory is the emulator's";
  return nullptr;
}

// How far call() raises this process's peak resident memory, in bytes.
// (Linux, which attn's builds target, resets and reports it; -1 where it
// cannot, a broken measurement, which the tests fail on.)
template <class F>
int64_t peak_growth(F&& call) {
  if (!reset_peak_rss() || status_bytes("VmHWM:") < 0) return -1;
  const int64_t before = status_bytes("VmRSS:");
  call();
  return status_bytes("VmHWM:") - before;
}

// Prefill at n = 32768, 8 heads × 128, with bf16, q8_0 and int4 K/V: the call's
// peak memory (its scratch included) grows by at most 64 MiB, measured in
// this process around the call: no float32 copy of K or V (128 MiB each
// here) is made. A causal window keeps the arithmetic short; the copies it
// must not make do not depend on it. Each test runs in a process of its own
// (ctest), so no earlier call's scratch hides what this one takes.
TEST(KVStorageMemory, CompactPrefillMakesNoFullSizeCopy) {
  if (const char* why = peak_memory_unmeasurable()) GTEST_SKIP() << why;
  const int64_t n = 32768, H = 8, d = 128;
  Tensor<float> q({1, H, n, d}), out({1, H, n, d});
  Tensor<bfloat16> kb, vb;
  Tensor<block_q8_0> kq, vq;
  Tensor<block_int4> k4, v4;
  {
    std::mt19937 rng(3);
    std::normal_distribution<float> normal;
    Tensor<float> k({1, H, n, d}), v({1, H, n, d});
    for (Tensor<float>* t : {&q, &k, &v})
      for (int64_t i = 0; i < t->numel(); ++i) (*t)[i] = normal(rng);
    kb = to_bfloat16(k.view()), vb = to_bfloat16(v.view());
    kq = quantize_q8_0(k.view()), vq = quantize_q8_0(v.view());
    k4 = quantize_int4_keys(k.view()), v4 = quantize_int4_values(v.view());
  }
  AttentionOptions o;
  o.causal = Causal::BottomRight;
  o.window = {64, 0};
  const auto measure = [&](const char* name, auto k, auto v) {
    const int64_t growth = peak_growth([&] { AttentionPlan(q.view(), k, v, o).run(out.view()); });
    ASSERT_GE(growth, 0) << "cannot reset and read this process's peak memory (/proc/self/clear_refs, VmHWM)";
    std::printf("%s prefill n=%lld, %lld heads x %lld: peak memory grew %.1f MiB\n", name, (long long)n,
                (long long)H, (long long)d, growth / 1048576.0);
    EXPECT_LE(growth, 64 << 20) << name;
  };
  measure("bf16", TensorView<const bfloat16>(kb.view()), TensorView<const bfloat16>(vb.view()));
  measure("q8_0", TensorView<const block_q8_0>(kq.view()), TensorView<const block_q8_0>(vq.view()));
  measure("int4", TensorView<const block_int4>(k4.view()), TensorView<const block_int4>(v4.view()));
}

// Decode over int4 K/V reads them in place at every length, one chunk of
// keys (config.hpp's kDecodeChunk) or less included: 16 sequences of 512
// keys, 8 heads × 128, one query each, whose K and V widened to float32
// would take 64 MiB (10 MiB in int4).
TEST(KVStorageMemory, Int4DecodeMakesNoFloat32Copy) {
  if (const char* why = peak_memory_unmeasurable()) GTEST_SKIP() << why;
  const int64_t B = 16, H = 8, n = 512, d = 128;
  std::mt19937 rng(5);
  const auto q = cast<float>(random_tensor({B, H, 1, d}, rng));
  Tensor<float> out({B, H, 1, d});
  Tensor<block_int4> kq, vq;
  {
    const auto k = cast<float>(random_tensor({B, H, n, d}, rng)), v = cast<float>(random_tensor({B, H, n, d}, rng));
    kq = quantize_int4_keys(k.view()), vq = quantize_int4_values(v.view());
  }
  const AttentionPlan<float, block_int4> plan(q.view(), kq.view(), vq.view());
  const int64_t growth = peak_growth([&] { plan.run(out.view()); });
  ASSERT_GE(growth, 0) << "cannot reset and read this process's peak memory (/proc/self/clear_refs, VmHWM)";
  std::printf("int4 decode, %lld sequences of %lld keys, %lld heads x %lld: peak memory grew %.1f MiB\n",
              (long long)B, (long long)n, (long long)H, (long long)d, growth / 1048576.0);
  EXPECT_LE(growth, 16 << 20);
}


// batch_attention's prefill requests read their pages in place: 64 queries
// against 32768 keys in pages of 32, 8 heads × 128, in bf16, q8_0 and int4.
// The call's peak memory grows by at most a quarter of the request's stored
// K and V (bf16 128 MiB, q8_0 68, int4 40), where a copy of them gathered
// from the pages would take all of it. A causal window keeps the arithmetic
// short; the copy it must not make does not depend on it.
TEST(KVStorageMemory, BatchPrefillReadsItsPagesInPlace) {
  if (const char* why = peak_memory_unmeasurable()) GTEST_SKIP() << why;
  const int64_t n = 32768, H = 8, d = 128, page = 32, pages = n / page, n_q = 64;
  std::mt19937 rng(6);
  const auto q = cast<float>(random_tensor({n_q, H, d}, rng));
  Tensor<float> out({n_q, H, d});
  Tensor<bfloat16> kb, vb;
  Tensor<block_q8_0> kq, vq;
  Tensor<block_int4> k4, v4;
  {
    const auto k = cast<float>(random_tensor({pages, page, H, d}, rng));  // NHD pages
    const auto v = cast<float>(random_tensor({pages, page, H, d}, rng));
    kb = to_bfloat16(k.view()), vb = to_bfloat16(v.view());
    kq = quantize_q8_0(k.view()), vq = quantize_q8_0(v.view());
    k4 = quantize_int4_key_pages(k.view()), v4 = quantize_int4_values(v.view());
  }
  Tensor<int32_t> qo_indptr({2}, {0, static_cast<int32_t>(n_q)}), kv_indptr({2}, {0, static_cast<int32_t>(pages)});
  Tensor<int32_t> kv_indices({pages}), last({1}, {static_cast<int32_t>(page)});
  for (int64_t p = 0; p < pages; ++p) kv_indices[p] = static_cast<int32_t>(pages - 1 - p);
  BatchAttentionOptions o;
  o.causal = true;
  o.window = {64, 0};
  const BatchAttentionPlan plan(qo_indptr.view(), kv_indptr.view(), kv_indices.view(), last.view(), H, H, d, page, o);
  const auto measure = [&](const char* name, const auto& k, const auto& v) {
    using KV = std::remove_cvref_t<decltype(*k.data())>;
    const int64_t stored = static_cast<int64_t>(sizeof(KV)) * (k.numel() + v.numel());
    const int64_t growth = peak_growth([&] { plan.run<KV>(q.view(), k.view(), v.view(), out.view()); });
    ASSERT_GE(growth, 0) << "cannot reset and read this process's peak memory (/proc/self/clear_refs, VmHWM)";
    std::printf("%s batch prefill, %lld queries over %lld keys in pages, %lld heads x %lld: peak memory grew %.1f "
                "MiB (K and V %.1f MiB)\n", name, (long long)n_q, (long long)n, (long long)H, (long long)d,
                growth / 1048576.0, stored / 1048576.0);
    EXPECT_LE(growth, stored / 4) << name;
  };
  measure("bf16", kb, vb);
  measure("q8_0", kq, vq);
  measure("int4", k4, v4);
}

}  // namespace
}  // namespace attn
