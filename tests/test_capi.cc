// The C API (attn/attn.h) gives the C++ API's results bit for bit: it is a
// thin layer, so any difference is a conversion it got wrong (an option, a
// stride, a dtype). tests/c/test_capi.c checks the values themselves.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <utility>

#include "attn/attn.h"
#include "attn/io.hpp"
#include "helpers.hpp"

namespace attn {
namespace {

using test::cast;
using test::random_tensor;

// A descriptor of a C-contiguous tensor (the C API does not write through const inputs).
template <class T>
attn_tensor descriptor(const Tensor<T>& t, attn_dtype dtype) {
  return {const_cast<T*>(t.data()), dtype, t.rank(), t.shape().data(), nullptr};
}

template <class T>
void expect_bitwise_equal(const Tensor<T>& a, const Tensor<T>& b) {
  ASSERT_EQ(a.shape(), b.shape());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), sizeof(T) * a.numel()), 0);
}

TEST(Capi, AttentionWithMaskAndOptionsIsTheCppResult) {
  std::mt19937 rng(3);
  const auto q = cast<float>(random_tensor({2, 4, 5, 8}, rng));
  const auto k = cast<float>(random_tensor({2, 2, 7, 8}, rng));
  const auto v = cast<float>(random_tensor({2, 2, 7, 6}, rng));
  const auto mask = cast<float>(random_tensor({5, 7}, rng));  // additive, broadcast
  AttentionOptions options;
  options.causal = Causal::TopLeft;
  options.window = {3, 1};
  options.scale = 0.4;
  options.softcap = 2.5;
  options.alibi_slopes = alibi_slopes(4);
  const Tensor<float> want = attention<float, float>(q.view(), k.view(), v.view(), options, mask.view());

  attn_options c_options;
  attn_options_init(&c_options);
  c_options.causal = 2;
  c_options.window_left = 3;
  c_options.window_right = 1;
  c_options.scale = 0.4;
  c_options.softcap = 2.5;
  Tensor<double> slopes({4});
  std::copy(options.alibi_slopes.begin(), options.alibi_slopes.end(), slopes.data());
  const attn_tensor c_slopes = descriptor(slopes, ATTN_F64);
  c_options.alibi_slopes = &c_slopes;
  Tensor<float> got(want.shape());
  const attn_tensor cq = descriptor(q, ATTN_F32), ck = descriptor(k, ATTN_F32),
                    cv = descriptor(v, ATTN_F32), cmask = descriptor(mask, ATTN_F32);
  attn_tensor cout = descriptor(got, ATTN_F32);
  ASSERT_EQ(attn_attention(&cq, &ck, &cv, &cmask, &c_options, &cout), ATTN_OK) << attn_last_error();
  expect_bitwise_equal(got, want);
}

TEST(Capi, AttentionBoolMaskStridesAndHalfKeysAreTheCppResult) {
  std::mt19937 rng(4);
  const auto q = cast<float>(random_tensor({3, 6, 4}, rng));
  const auto kt = cast<float>(random_tensor({3, 4, 9}, rng));  // k transposed in memory
  const auto v = cast<float>(random_tensor({3, 9, 5}, rng));
  Tensor<bool> mask({6, 9});
  for (int64_t i = 0; i < mask.numel(); ++i) mask[i] = i % 4 != 1;
  const TensorView<const float> k = kt.view().transpose(1, 2);
  AttentionOptions options;
  options.causal = Causal::BottomRight;
  const Tensor<float> want = attention<float, float>(q.view(), k, v.view(), options, mask.view());

  attn_options c_options;
  attn_options_init(&c_options);
  c_options.causal = 1;
  Tensor<float> got(want.shape());
  const attn_tensor cq = descriptor(q, ATTN_F32), cv = descriptor(v, ATTN_F32),
                    cmask = descriptor(mask, ATTN_BOOL);
  const attn_tensor ck{const_cast<float*>(k.data()), ATTN_F32, 3, k.shape().data(), k.strides().data()};
  attn_tensor cout = descriptor(got, ATTN_F32);
  ASSERT_EQ(attn_attention(&cq, &ck, &cv, &cmask, &c_options, &cout), ATTN_OK) << attn_last_error();
  expect_bitwise_equal(got, want);

  // bfloat16 keys and values.
  Tensor<bfloat16> k16({3, 9, 4}), v16(v.shape());
  const Tensor<float> kc = contiguous(k);
  for (int64_t i = 0; i < kc.numel(); ++i) k16[i].bits = float_to_bf16(kc[i]);
  for (int64_t i = 0; i < v.numel(); ++i) v16[i].bits = float_to_bf16(v[i]);
  const Tensor<float> want16 = attention<float, bfloat16>(q.view(), k16.view(), v16.view());
  const attn_tensor ck16 = descriptor(k16, ATTN_BF16), cv16 = descriptor(v16, ATTN_BF16);
  ASSERT_EQ(attn_attention(&cq, &ck16, &cv16, nullptr, nullptr, &cout), ATTN_OK) << attn_last_error();
  expect_bitwise_equal(got, want16);
}

TEST(Capi, RopeAndSinusoidalAreTheCppResult) {
  std::mt19937 rng(5);
  const auto x = cast<float>(random_tensor({2, 5, 8}, rng));
  const Tensor<int64_t> positions({5}, {3, 0, 17, 1000000, -4});
  RopeOptions options;
  options.base = 500;
  options.interleaved = true;
  options.rotary_dim = 6;
  const Tensor<float> want = apply_rope<float>(x.view(), options, positions.view());
  Tensor<float> got(x.shape());
  const attn_tensor cx = descriptor(x, ATTN_F32);
  attn_tensor cout = descriptor(got, ATTN_F32);
  ASSERT_EQ(attn_rope(&cx, positions.data(), 500, 1, 6, &cout), ATTN_OK) << attn_last_error();
  expect_bitwise_equal(got, want);

  const Tensor<double> table = sinusoidal_encoding<double>(11, 7, 100.0);
  Tensor<double> c_table(table.shape());
  attn_tensor ctable = descriptor(c_table, ATTN_F64);
  ASSERT_EQ(attn_sinusoidal_encoding(11, 7, 100.0, &ctable), ATTN_OK) << attn_last_error();
  expect_bitwise_equal(c_table, table);
}

// Each output gate too: the file's metadata and gate_proj tensors reach the C layer.
TEST(Capi, MhaForwardWithAndWithoutCacheIsTheCppResult) {
  for (Gate gate : {Gate::None, Gate::Headwise, Gate::Elementwise}) {
    SCOPED_TRACE("gate " + gate_name(gate));
    MultiHeadAttentionConfig config;
    config.embed_dim = 8;
    config.num_heads = 4;
    config.num_kv_heads = 2;
    config.rope = true;
    config.gate = gate;
    const MultiHeadAttention<float> layer(config, 9);
    const test::TempDir dir;
    const auto path = dir.file("layer.safetensors");
    layer.save(path);
    attn_mha* c_layer = nullptr;
    ASSERT_EQ(attn_mha_load(path.c_str(), &c_layer), ATTN_OK) << attn_last_error();

    std::mt19937 rng(6);
    const auto x = cast<float>(random_tensor({2, 5, 8}, rng));
    MhaForwardOptions<float> options;
    options.attention.causal = Causal::BottomRight;
    const Tensor<float> want = layer.forward(x.view(), {}, {}, options).out;
    attn_options c_options;
    attn_options_init(&c_options);
    c_options.causal = 1;
    Tensor<float> got(x.shape());
    const attn_tensor cx = descriptor(x, ATTN_F32);
    attn_tensor cout = descriptor(got, ATTN_F32);
    ASSERT_EQ(attn_mha_forward(c_layer, &cx, nullptr, &c_options, &cout), ATTN_OK) << attn_last_error();
    expect_bitwise_equal(got, want);

    // Two calls on one cache, as the C++ layer does them with its own.
    KVCache<float> cache = layer.new_cache();
    options.cache = &cache;
    attn_cache* c_cache = nullptr;
    ASSERT_EQ(attn_cache_new(c_layer, &c_cache), ATTN_OK) << attn_last_error();
    for (int round = 0; round < 2; ++round) {
      const Tensor<float> step = layer.forward(x.view(), {}, {}, options).out;
      ASSERT_EQ(attn_mha_forward(c_layer, &cx, c_cache, &c_options, &cout), ATTN_OK) << attn_last_error();
      expect_bitwise_equal(got, step);
    }
    attn_cache_free(c_cache);
    attn_mha_free(c_layer);
  }
}

// The latent attention layer from a Hugging Face config and a checkpoint's
// tensors under a prefix: the C++ layer's results, bit for bit, with a cache
// in every storage type.
TEST(Capi, MlaLoadAndForwardAreTheCppLayer) {
  const std::string config_json =
      R"({"hidden_size": 32, "num_attention_heads": 4, "q_lora_rank": 16, "kv_lora_rank": 32,
          "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 6, "max_position_embeddings": 640,
          "rope_scaling": {"type": "yarn", "original_max_position_embeddings": 64, "mscale": 1.0,
                           "mscale_all_dim": 1.0}, "vocab_size": 100})";
  const MultiHeadLatentAttention layer(mla_config_from_json(config_json), 4);
  const test::TempDir dir;
  const auto path = dir.file("mla.safetensors");
  const auto state = layer.state_dict();
  std::map<std::string, TensorView<const float>> views;
  for (const auto& [name, t] : state) views.emplace("model.layers.1.self_attn." + name, t.view());
  write_safetensors(path, views);
  attn_mla* c_layer = nullptr;
  ASSERT_EQ(attn_mla_load(config_json.c_str(), path.c_str(), "model.layers.1.self_attn.", &c_layer), ATTN_OK)
      << attn_last_error();
  std::mt19937 rng(7);
  const auto x = cast<float>(random_tensor({2, 5, 32}, rng));
  Tensor<float> got(x.shape());
  const attn_tensor cx = descriptor(x, ATTN_F32);
  attn_tensor cout = descriptor(got, ATTN_F32);
  ASSERT_EQ(attn_mla_forward(c_layer, &cx, nullptr, &cout), ATTN_OK) << attn_last_error();
  expect_bitwise_equal(got, layer.forward(x.view()));
  for (const auto& [dtype, stored] : {std::pair{ATTN_F32, KVDtype::F32}, {ATTN_BF16, KVDtype::BF16},
                                       {ATTN_F16, KVDtype::F16}, {ATTN_Q8_0, KVDtype::Q8_0}}) {
    LatentCache cache = layer.new_cache(stored);
    attn_latent_cache* c_cache = nullptr;
    ASSERT_EQ(attn_latent_cache_new(c_layer, dtype, &c_cache), ATTN_OK) << attn_last_error();
    for (int round = 0; round < 2; ++round) {  // a prompt, then a chunk after it
      const Tensor<float> want = layer.forward(x.view(), &cache);
      ASSERT_EQ(attn_mla_forward(c_layer, &cx, c_cache, &cout), ATTN_OK) << attn_last_error();
      expect_bitwise_equal(got, want);
    }
    int64_t bytes = 0;
    ASSERT_EQ(attn_latent_cache_bytes(c_cache, &bytes), ATTN_OK);
    EXPECT_EQ(bytes, cache.nbytes());
    attn_latent_cache_free(c_cache);
  }
  // Serving over a paged latent cache: two sequences' tokens packed, then a decode step of both.
  for (const auto& [dtype, stored] : {std::pair{ATTN_BF16, KVDtype::BF16}, {ATTN_Q8_0, KVDtype::Q8_0}}) {
    PagedKVCache cache = layer.new_paged_cache(16, 4, stored);
    attn_paged_cache* c_cache = nullptr;
    ASSERT_EQ(attn_mla_paged_cache_new(c_layer, 16, 4, dtype, &c_cache), ATTN_OK) << attn_last_error();
    const std::vector<int64_t> ids{cache.add_sequence(), cache.add_sequence()};
    int64_t c_seq = -1;  // the same ids, 0 and 1
    for (int i = 0; i < 2; ++i) ASSERT_EQ(attn_paged_cache_add_sequence(c_cache, &c_seq), ATTN_OK);
    ASSERT_EQ(c_seq, ids[1]);
    for (const std::vector<int64_t>& cu : {std::vector<int64_t>{0, 3, 5}, std::vector<int64_t>{0, 1, 2}}) {
      const auto packed = cast<float>(random_tensor({cu.back(), 32}, rng));
      const Tensor<float> want = layer.forward(packed.view(), cache, ids, TensorView<const int64_t>(cu.data(), {3}));
      Tensor<float> served(packed.shape());
      const attn_tensor cp = descriptor(packed, ATTN_F32);
      attn_tensor cs = descriptor(served, ATTN_F32);
      ASSERT_EQ(attn_mla_forward_paged(c_layer, &cp, c_cache, ids.data(), 2, cu.data(), &cs), ATTN_OK)
          << attn_last_error();
      expect_bitwise_equal(served, want);
    }
    attn_paged_cache_free(c_cache);
  }
  attn_mla_free(c_layer);
  EXPECT_EQ(attn_mla_load(config_json.c_str(), path.c_str(), nullptr, &c_layer), ATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(attn_last_error()).find("unexpected key 'model.layers.1.self_attn.kv_a_layernorm.weight'"),
            std::string::npos)
      << attn_last_error();
  EXPECT_EQ(c_layer, nullptr);
  attn_mla_free(nullptr);
  attn_latent_cache_free(nullptr);
}

// options.precision: 1 bf16, 2 int8, as C++'s Precision; others refused.
TEST(Capi, PrecisionIsTheCppOne) {
  std::mt19937 rng(4);
  const auto q = cast<float>(random_tensor({1, 2, 20, 16}, rng));  // (past the 8 queries decode takes in bf16 and int8)
  const auto k = cast<float>(random_tensor({1, 2, 30, 16}, rng)), v = cast<float>(random_tensor({1, 2, 30, 16}, rng));
  Tensor<float> got(q.shape());
  const attn_tensor cq = descriptor(q, ATTN_F32), ck = descriptor(k, ATTN_F32), cv = descriptor(v, ATTN_F32);
  attn_tensor cout = descriptor(got, ATTN_F32);
  attn_options c_options;
  attn_options_init(&c_options);
  for (const auto& [code, precision] : {std::pair{1, Precision::BF16}, std::pair{2, Precision::Int8}}) {
    AttentionOptions options;
    options.precision = precision;
    c_options.precision = code;
    ASSERT_EQ(attn_attention(&cq, &ck, &cv, nullptr, &c_options, &cout), ATTN_OK) << attn_last_error();
    expect_bitwise_equal(got, attention<float, float>(q.view(), k.view(), v.view(), options));
  }
  c_options.precision = 3;
  EXPECT_EQ(attn_attention(&cq, &ck, &cv, nullptr, &c_options, &cout), ATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(attn_last_error()).find("precision 3 is not 0 (f32), 1 (bf16) or 2 (int8)"), std::string::npos)
      << attn_last_error();
}

TEST(Capi, ErrorsCarryTheCppMessage) {
  const Tensor<float> q({2, 3}), k({4, 2});
  Tensor<float> out({2, 3});
  const attn_tensor cq = descriptor(q, ATTN_F32), ck = descriptor(k, ATTN_F32);
  attn_tensor cout = descriptor(out, ATTN_F32);
  std::string cpp_message;
  try {
    AttentionPlan<float>(q.view(), k.view(), k.view()).run(out.view());
  } catch (const ValueError& e) {
    cpp_message = e.what();
  }
  ASSERT_FALSE(cpp_message.empty());
  EXPECT_EQ(attn_attention(&cq, &ck, &ck, nullptr, nullptr, &cout), ATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(attn_last_error()), cpp_message);
}

}  // namespace
}  // namespace attn
