// The MultiHeadAttention layer and its KV cache. (Parity with PyTorch's
// nn.MultiheadAttention is tested in tests/python/test_mha.py.)
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "attn/io.hpp"
#include "helpers.hpp"

namespace attn {
namespace {

using test::cast;
using test::max_abs_diff;
using test::random_tensor;
using test::rel_error;

TEST(KVCache, AppendsChunksAndGrowsGeometrically) {
  std::mt19937 rng(50);
  const auto all_k = random_tensor({2, 3, 100, 4}, rng), all_v = random_tensor({2, 3, 100, 5}, rng);
  KVCache<double> cache;
  int reallocations = 0;
  int64_t last_capacity = 0;
  for (int64_t at = 0; at < 100;) {
    const int64_t n = std::min<int64_t>(1 + at % 7, 100 - at);
    const auto slice = [&](const Tensor<double>& t) {
      const int64_t d = t.dim(3);
      return TensorView<const double>(t.data() + at * d, {2, 3, n, d}, {300 * d, 100 * d, d, 1});
    };
    cache.append(slice(all_k), slice(all_v));
    at += n;
    if (cache.capacity() != last_capacity) ++reallocations, last_capacity = cache.capacity();
  }
  EXPECT_EQ(cache.length(), 100);
  EXPECT_LE(reallocations, 4);  // 16, 32, 64, 128: amortised O(chunk) appends
  EXPECT_EQ(max_abs_diff(contiguous(cache.keys()), all_k), 0.0);
  EXPECT_EQ(max_abs_diff(contiguous(cache.values()), all_v), 0.0);
  const Tensor<double> wrong({2, 4, 1, 4});
  EXPECT_THROW_MSG(cache.append(wrong.view(), wrong.view()), ValueError, "the cache holds batch 2, heads 3");
}

MultiHeadAttentionConfig config(int64_t E, int64_t H) {
  MultiHeadAttentionConfig c;
  c.embed_dim = E;
  c.num_heads = H;
  return c;
}

// Feeding 37 tokens in chunks equals one causal forward over all of them.
template <class T>
void check_chunks(const MultiHeadAttentionConfig& c, double tol) {
  std::mt19937 rng(51);
  const MultiHeadAttention<T> layer(c, 7);
  const auto x = cast<T>(random_tensor({2, 37, c.embed_dim}, rng));
  MhaForwardOptions<T> causal;
  causal.attention.causal = Causal::BottomRight;
  const auto full = layer.forward(x.view(), {}, {}, causal).out;
  for (int64_t chunk : {1, 5, 31}) {
    auto cache = layer.new_cache();
    MhaForwardOptions<T> opt = causal;
    opt.cache = &cache;
    Tensor<T> got(full.shape());
    for (int64_t at = 0; at < 37; at += chunk) {
      const int64_t n = std::min<int64_t>(chunk, 37 - at);
      const TensorView<const T> part(x.data() + at * c.embed_dim, {2, n, c.embed_dim},
                                     {37 * c.embed_dim, c.embed_dim, 1});
      const auto y = layer.forward(part, {}, {}, opt).out;
      for (int64_t b = 0; b < 2; ++b)
        std::copy(y.data() + b * n * c.embed_dim, y.data() + (b + 1) * n * c.embed_dim,
                  got.data() + (b * 37 + at) * c.embed_dim);
    }
    EXPECT_EQ(cache.length(), 37);
    EXPECT_LT(rel_error(got, full), tol) << "chunk " << chunk;
  }
}

TEST(MultiHeadAttention, KVCacheChunksEqualTheFullCausalForward) {
  auto c = config(32, 4);
  check_chunks<float>(c, 1e-5);
  check_chunks<double>(c, 1e-12);
  c.rope = true;
  check_chunks<float>(c, 1e-5);
  check_chunks<double>(c, 1e-12);
  c.num_kv_heads = 2;
  c.rope_interleaved = true;
  check_chunks<float>(c, 1e-5);
  // ALiBi: each chunk's queries sit at their cache position; a scaling that
  // does not depend on the sequence length rotates as in one call
  c.alibi = true;
  c.rope_scaling = parse_rope_scaling(R"({"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 16})");
  check_chunks<float>(c, 1e-5);
  check_chunks<double>(c, 1e-12);
}

// A StreamingLLM cache (2 sink tokens, a window of 5) fed 23 tokens in
// chunks of 1 to 6 equals one forward over all of them whose mask is the
// streaming rule (token t attends j iff j <= t and (j < 2 or j > t - 5)),
// and holds at most 7 tokens.
TEST(MultiHeadAttention, StreamingCacheIsADenseMaskOverTheHistory) {
  std::mt19937 rng(54);
  auto c = config(16, 4);
  c.rope = true;
  c.num_kv_heads = 2;
  c.sinks = true;
  const MultiHeadAttention<double> layer(c, 4);
  const int64_t N = 23, S = 2, W = 5;
  const auto x = random_tensor({1, N, 16}, rng);
  Tensor<bool> blocked({N, N});  // the layer's convention: true blocks
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < N; ++j) blocked[t * N + j] = !(j <= t && (j < S || j > t - W));
  MhaForwardOptions<double> dense;
  dense.attn_mask = TensorView<const bool>(blocked.view());
  const auto full = layer.forward(x.view(), {}, {}, dense).out;
  auto cache = layer.new_cache(KVDtype::F32, {S, W, CachePositions::Original});
  MhaForwardOptions<double> step;
  step.cache = &cache;
  step.attention.causal = Causal::BottomRight;
  Tensor<double> got({1, N, 16});
  int64_t at = 0;
  for (int64_t n : {1, 3, 6, 2, 1, 4, 5, 1}) {
    const TensorView<const double> chunk(x.data() + at * 16, {1, n, 16}, {N * 16, 16, 1});
    const auto y = layer.forward(chunk, {}, {}, step).out;
    std::copy(y.data(), y.data() + y.numel(), got.data() + at * 16);
    at += n;
    EXPECT_LE(cache.length(), S + W);
    EXPECT_EQ(cache.seen(), at);
  }
  EXPECT_LT(rel_error(got, full), 1e-12);
  step.attention.alibi_slopes = {0.5, 0.25, 0.125, 0.0625};
  EXPECT_THROW_MSG(layer.forward(x.view(), {}, {}, step), ValueError, "ALiBi with a streaming cache");
  step.attention.alibi_slopes.clear();
  step.attention.causal = Causal::None;
  EXPECT_THROW_MSG(layer.forward(x.view(), {}, {}, step), ValueError, "attends causally");
  EXPECT_THROW_MSG(KVCache<float>(KVDtype::BF16, {1, 4, CachePositions::Cache}), ValueError,
                   "positions 'cache' rotates the cached keys");
}

// The streaming rule is two attention calls merged by their log-sum-exps
// (no n_q × n_k mask): over chunks longer than the sink part's row blocks
// (1024 rows: three, or under sanitizers, where the dense float64 reference
// takes 20 s, two), with the layer's sinks, the outputs and the per-head
// weights are the dense mask's, in double within its rounding.
TEST(MultiHeadAttention, StreamingPrefillMergesTheWindowAndTheSinkKeys) {
  std::mt19937 rng(55);
  auto c = config(16, 4);
  c.rope = true;
  c.sinks = true;
  const MultiHeadAttention<double> layer(c, 5);
  const bool small = test::sanitized() || test::emulated();
  const int64_t N = small ? 1400 : 3200, first = small ? 1100 : 2500, S = 4, W = 300;
  const auto x = random_tensor({1, N, 16}, rng);
  Tensor<bool> blocked({N, N});
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < N; ++j) blocked[t * N + j] = !(j <= t && (j < S || j > t - W));
  MhaForwardOptions<double> dense;
  dense.attn_mask = TensorView<const bool>(blocked.view());
  dense.need_weights = true;
  dense.average_attn_weights = false;
  const auto full = layer.forward(x.view(), {}, {}, dense);
  auto cache = layer.new_cache(KVDtype::F32, {S, W, CachePositions::Original});
  MhaForwardOptions<double> step;
  step.cache = &cache;
  step.attention.causal = Causal::BottomRight;
  step.need_weights = true;
  step.average_attn_weights = false;
  const auto head = layer.forward(TensorView<const double>(x.data(), {1, first, 16}), {}, {}, step);
  Tensor<double> want({1, first, 16}), want_weights({1, 4, first, first});
  for (int64_t i = 0; i < first * 16; ++i) want[i] = full.out[(i / 16) * 16 + i % 16];
  for (int64_t h = 0; h < 4; ++h)
    for (int64_t i = 0; i < first; ++i)
      for (int64_t j = 0; j < first; ++j) want_weights.at({0, h, i, j}) = full.weights->at({0, h, i, j});
  EXPECT_LT(rel_error(head.out, want), 1e-12);
  EXPECT_LT(rel_error(*head.weights, want_weights), 1e-12);
  EXPECT_EQ(cache.length(), S + W);
  step.need_weights = false;
  const auto tail = layer.forward(TensorView<const double>(x.data() + first * 16, {1, N - first, 16}), {}, {}, step);
  Tensor<double> want_tail({1, N - first, 16});
  std::copy(full.out.data() + first * 16, full.out.data() + N * 16, want_tail.data());
  EXPECT_LT(rel_error(tail.out, want_tail), 1e-12);
}

// A forward whose options attention() refuses appends nothing to the cache,
// so the cache stays usable (bad options, and a layer's sinks made NaN).
TEST(MultiHeadAttention, ACallThatFailsAppendsNothing) {
  auto c = config(8, 2);
  c.sinks = true;
  MultiHeadAttention<float> layer(c, 1);
  const Tensor<float> x({1, 3, 8});
  auto cache = layer.new_cache(KVDtype::F32, {1, 4, CachePositions::Original});
  MhaForwardOptions<float> opt;
  opt.cache = &cache;
  opt.attention.causal = Causal::BottomRight;
  layer.forward(x.view(), {}, {}, opt);
  opt.attention.softcap = -1;
  EXPECT_THROW_MSG(layer.forward(x.view(), {}, {}, opt), ValueError, "softcap");
  opt.attention.softcap = 0;
  (*layer.parameters().back())[0] = std::numeric_limits<float>::quiet_NaN();  // the sinks
  EXPECT_THROW_MSG(layer.forward(x.view(), {}, {}, opt), ValueError, "sinks must be finite");
  EXPECT_EQ(cache.seen(), 3);
  EXPECT_EQ(cache.length(), 3);
}

TEST(MultiHeadAttention, FloatAndDoubleLayersAgree) {
  std::mt19937 rng(52);
  auto c = config(24, 6);
  c.num_kv_heads = 2;
  c.kdim = 10;
  c.vdim = 7;
  const MultiHeadAttention<float> f(c, 3);
  const MultiHeadAttention<double> d(c, 3);  // same seed: same weights up to rounding
  const auto q = random_tensor({3, 5, 24}, rng), k = random_tensor({3, 9, 10}, rng),
             v = random_tensor({3, 9, 7}, rng);
  MhaForwardOptions<float> of;
  of.need_weights = true;
  MhaForwardOptions<double> od;
  od.need_weights = true;
  const auto rf = f.forward(cast<float>(q).view(), cast<float>(k).view(), cast<float>(v).view(), of);
  const auto rd = d.forward(q.view(), k.view(), v.view(), od);
  EXPECT_LT(rel_error(rf.out, rd.out), 1e-5);
  EXPECT_LT(rel_error(*rf.weights, *rd.weights), 1e-5);
  EXPECT_EQ(rd.weights->shape(), (Shape{3, 5, 9}));
}

TEST(MultiHeadAttention, UnbatchedEqualsBatchOfOne) {
  std::mt19937 rng(53);
  const MultiHeadAttention<double> layer(config(16, 4), 1);
  const auto x = random_tensor({6, 16}, rng);
  MhaForwardOptions<double> opt;
  opt.need_weights = true;
  opt.average_attn_weights = false;
  const auto a = layer.forward(x.view(), {}, {}, opt);
  const auto b = layer.forward(TensorView<const double>(x.data(), {1, 6, 16}), {}, {}, opt);
  EXPECT_EQ(a.out.shape(), (Shape{6, 16}));
  EXPECT_EQ(a.weights->shape(), (Shape{4, 6, 6}));
  EXPECT_EQ(max_abs_diff(a.out, std::move(Tensor<double>(b.out)).reshape({6, 16})), 0.0);
}

TEST(MultiHeadAttention, StateDictNamesShapesAndRoundTrip) {
  auto c = config(8, 2);
  const MultiHeadAttention<float> packed(c);
  auto s = packed.state_dict();
  EXPECT_EQ(s.size(), 4u);
  EXPECT_EQ(s.at("in_proj_weight").shape(), (Shape{24, 8}));
  EXPECT_EQ(s.at("in_proj_bias").shape(), (Shape{24}));
  EXPECT_EQ(s.at("out_proj.weight").shape(), (Shape{8, 8}));
  EXPECT_EQ(s.at("out_proj.bias").shape(), (Shape{8}));

  c.num_kv_heads = 1;
  c.kdim = 5;
  c.bias = false;
  MultiHeadAttention<float> separate(c, 9);
  const auto s2 = separate.state_dict();
  EXPECT_EQ(s2.size(), 4u);
  EXPECT_EQ(s2.at("q_proj_weight").shape(), (Shape{8, 8}));
  EXPECT_EQ(s2.at("k_proj_weight").shape(), (Shape{4, 5}));
  EXPECT_EQ(s2.at("v_proj_weight").shape(), (Shape{4, 8}));
  EXPECT_FALSE(s2.count("in_proj_bias"));

  MultiHeadAttention<float> other(c, 10);
  other.load_state_dict(s2);
  for (const auto& [name, t] : other.state_dict()) EXPECT_EQ(max_abs_diff(t, s2.at(name)), 0.0) << name;

  auto missing = s2;
  missing.erase("k_proj_weight");
  EXPECT_THROW_MSG(other.load_state_dict(missing), ValueError, "missing key 'k_proj_weight'");
  auto extra = s2;
  extra.emplace("out_proj.scale", Tensor<float>({8}));
  EXPECT_THROW_MSG(other.load_state_dict(extra), ValueError, "unexpected key 'out_proj.scale'");
  // nn.MultiheadAttention(add_bias_kv=True)'s keys name the option
  auto bias_kv = s2;
  bias_kv.emplace("bias_k", Tensor<float>({1, 1, 4}));
  bias_kv.emplace("bias_v", Tensor<float>({1, 1, 4}));
  EXPECT_THROW_MSG(other.load_state_dict(bias_kv), ValueError,
                   "unexpected key 'bias_k' (expected k_proj_weight, out_proj.weight, q_proj_weight, "
                   "v_proj_weight); it comes from nn.MultiheadAttention(add_bias_kv=True): build the "
                   "layer with add_bias_kv=True");
  c.add_bias_kv = true;
  MultiHeadAttention<float> with_bias_kv(c, 11);
  const auto s3 = with_bias_kv.state_dict();
  EXPECT_EQ(s3.size(), 6u);
  EXPECT_EQ(s3.at("bias_k").shape(), (Shape{1, 1, 4}));  // (1, 1, dkv)
  EXPECT_EQ(s3.at("bias_v").shape(), (Shape{1, 1, 4}));
  with_bias_kv.load_state_dict(bias_kv);
  EXPECT_EQ(max_abs_diff(with_bias_kv.state_dict().at("bias_k"), bias_kv.at("bias_k")), 0.0);
  auto wrong = s2;
  wrong["k_proj_weight"] = Tensor<float>({5, 4});
  EXPECT_THROW_MSG(other.load_state_dict(wrong), ValueError,
                   "'k_proj_weight' has shape (5, 4), expected (4, 5)");
}

TEST(MultiHeadAttention, SeededXavierInitialisation) {
  auto c = config(64, 4);
  const auto a = MultiHeadAttention<double>(c, 1).state_dict();
  const auto b = MultiHeadAttention<double>(c, 1).state_dict();
  const auto d = MultiHeadAttention<double>(c, 2).state_dict();
  const auto& w = a.at("in_proj_weight");
  EXPECT_EQ(max_abs_diff(w, b.at("in_proj_weight")), 0.0);
  EXPECT_GT(max_abs_diff(w, d.at("in_proj_weight")), 0.1);
  // Xavier-uniform over (3E, E): U(-bound, bound), bound = sqrt(6 / (4E));
  // its standard deviation is bound / sqrt(3).
  const double bound = std::sqrt(6.0 / (4 * 64));
  double m = 0, ss = 0;
  for (int64_t i = 0; i < w.numel(); ++i) m = std::max<double>(m, std::fabs(w[i])), ss += w[i] * w[i];
  EXPECT_LE(m, bound);
  EXPECT_GT(m, 0.99 * bound);
  EXPECT_NEAR(std::sqrt(ss / w.numel()), bound / std::sqrt(3.0), 0.02 * bound);
  for (int64_t i = 0; i < 3 * 64; ++i) EXPECT_EQ(a.at("in_proj_bias")[i], 0.0);

  // add_bias_kv: bias_k, bias_v xavier_normal_ over (1, 1, E), std 1/sqrt(E)
  c.add_bias_kv = true;
  const auto e = MultiHeadAttention<double>(c, 1).state_dict();
  EXPECT_EQ(max_abs_diff(e.at("in_proj_weight"), w), 0.0);  // drawn after the other weights
  double s2 = 0, mean = 0;
  for (const char* name : {"bias_k", "bias_v"})
    for (int64_t i = 0; i < 64; ++i) s2 += e.at(name)[i] * e.at(name)[i], mean += e.at(name)[i];
  // 128 draws: the sample variance's relative error is ~sqrt(2/128) = 0.125,
  // the mean's standard error 1/sqrt(64 * 128); 4 sigma each
  EXPECT_NEAR(s2 / 128 * 64, 1.0, 0.5);
  EXPECT_NEAR(mean / 128, 0.0, 4 / std::sqrt(64.0 * 128));
  EXPECT_GT(max_abs_diff(e.at("bias_k"), e.at("bias_v")), 0.1);
}

// batch_first=false reads (n, batch, E) and writes the output in that layout:
// the same numbers as batch first on the transposed input.
TEST(MultiHeadAttention, SequenceFirstLayoutEqualsBatchFirst) {
  std::mt19937 rng(55);
  auto c = config(12, 3);
  c.kdim = 5;
  c.add_bias_kv = true;
  c.add_zero_attn = true;
  const MultiHeadAttention<double> first(c, 6);
  c.batch_first = false;
  MultiHeadAttention<double> seq(c, 7);
  seq.load_state_dict(first.state_dict());
  const auto transpose = [](const Tensor<double>& t) {
    const int64_t n0 = t.dim(0), n1 = t.dim(1), w = t.dim(2);
    return contiguous(TensorView<const double>(t.data(), {n1, n0, w}, {w, n1 * w, 1}));
  };
  const auto q = random_tensor({2, 4, 12}, rng), k = random_tensor({2, 6, 5}, rng),
             v = random_tensor({2, 6, 12}, rng), dout = random_tensor({2, 4, 12}, rng);
  const auto qt = transpose(q), kt = transpose(k), vt = transpose(v), dt = transpose(dout);
  Tensor<bool> pad({2, 6});
  pad[3] = pad[11] = true;  // true = padding
  MhaForwardOptions<double> opt;
  opt.key_padding_mask = TensorView<const bool>(pad.view());
  opt.need_weights = true;
  const auto a = first.forward(q.view(), k.view(), v.view(), opt);
  const auto b = seq.forward(qt.view(), kt.view(), vt.view(), opt);
  ASSERT_EQ(b.out.shape(), (Shape{4, 2, 12}));
  EXPECT_EQ(max_abs_diff(transpose(b.out), a.out), 0.0);
  EXPECT_EQ(b.weights->shape(), (Shape{2, 4, 8}));  // 6 keys + bias_k + a zero key
  EXPECT_EQ(max_abs_diff(*b.weights, *a.weights), 0.0);
  const auto ga = first.backward(dout.view(), q.view(), k.view(), v.view(), opt);
  const auto gb = seq.backward(dt.view(), qt.view(), kt.view(), vt.view(), opt);
  EXPECT_EQ(max_abs_diff(transpose(gb.query), ga.query), 0.0);
  EXPECT_EQ(max_abs_diff(transpose(gb.key), ga.key), 0.0);
  EXPECT_EQ(max_abs_diff(transpose(gb.value), ga.value), 0.0);
  // parameter gradients sum over the rows in memory order, which the layouts
  // order differently: equal to rounding
  const auto na = first.gradient_dict(ga), nb = seq.gradient_dict(gb);
  for (const auto& [name, g] : na) EXPECT_LT(rel_error(nb.at(name), g), 1e-14) << name;
  EXPECT_THROW_MSG(seq.forward(q.view(), k.view(), v.view()), ValueError,
                   "same batch size");  // (2, 4, 12) read as 2 positions of batch 4
}

// add_bias_kv and add_zero_attn append keys (bias_k, then zeros) that every
// row attends; the same numbers come from the plain layer attending keys and
// values with those rows appended to its projections.
TEST(MultiHeadAttention, AppendedKeysTakePartInEveryRow) {
  std::mt19937 rng(56);
  auto c = config(8, 2);
  c.add_bias_kv = true;
  c.add_zero_attn = true;
  const MultiHeadAttention<double> layer(c, 8);
  const auto s = layer.state_dict();
  const auto x = random_tensor({2, 3, 8}, rng);
  Tensor<bool> blocked({3, 3});
  for (int64_t i = 0; i < 3; ++i) blocked[i * 3 + i] = true;  // each query blocks its own key
  MhaForwardOptions<double> opt;
  opt.attn_mask = TensorView<const bool>(blocked.view());
  opt.need_weights = true;
  opt.average_attn_weights = false;
  const auto got = layer.forward(x.view(), {}, {}, opt);

  // by hand: projections, appended rows, attention() per head, out_proj
  const auto& w = s.at("in_proj_weight");
  const auto& b = s.at("in_proj_bias");
  Tensor<double> q({2, 2, 3, 4}), k({2, 2, 5, 4}), v({2, 2, 5, 4});
  for (int64_t bt = 0; bt < 2; ++bt)
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t o = 0; o < 24; ++o) {
        double y = b[o];
        for (int64_t e = 0; e < 8; ++e) y += x[(bt * 3 + i) * 8 + e] * w[o * 8 + e];
        const int64_t which = o / 8, h = (o % 8) / 4, j = o % 4;
        Tensor<double>& t = which == 0 ? q : which == 1 ? k : v;
        t[((bt * 2 + h) * t.dim(2) + i) * 4 + j] = y;
      }
  for (int64_t bt = 0; bt < 2; ++bt)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t j = 0; j < 4; ++j) {  // row 3: bias_k / bias_v; row 4 stays zero
        k[((bt * 2 + h) * 5 + 3) * 4 + j] = s.at("bias_k")[h * 4 + j];
        v[((bt * 2 + h) * 5 + 3) * 4 + j] = s.at("bias_v")[h * 4 + j];
      }
  Tensor<bool> allowed({3, 5});  // attention()'s convention: true = may attend
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 5; ++j) allowed[i * 5 + j] = j != i;
  const auto r = test::forward_with_weights(q.view(), k.view(), v.view(), {},
                                        Mask(TensorView<const bool>(allowed.view())));
  EXPECT_LT(max_abs_diff(*got.weights, r.weights), 1e-15);
  const auto& wo = s.at("out_proj.weight");
  Tensor<double> want({2, 3, 8});
  for (int64_t bt = 0; bt < 2; ++bt)
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t o = 0; o < 8; ++o) {
        double y = s.at("out_proj.bias")[o];
        for (int64_t e = 0; e < 8; ++e) y += r.out[((bt * 2 + e / 4) * 3 + i) * 4 + e % 4] * wo[o * 8 + e];
        want[(bt * 3 + i) * 8 + o] = y;
      }
  EXPECT_LT(rel_error(got.out, want), 1e-13);

  MhaForwardOptions<double> causal;
  causal.attention.causal = Causal::TopLeft;
  EXPECT_THROW_MSG(layer.forward(x.view(), {}, {}, causal), ValueError,
                   "causal and window with add_bias_kv or add_zero_attn: give the pattern as attn_mask");
  auto cache = layer.new_cache();
  MhaForwardOptions<double> cached;
  cached.cache = &cache;
  EXPECT_THROW_MSG(layer.forward(x.view(), {}, {}, cached), ValueError,
                   "a KV cache with add_bias_kv or add_zero_attn is not supported");
  EXPECT_EQ(cache.length(), 0);
  c.rope = true;
  EXPECT_THROW_MSG(MultiHeadAttention<double>{c}, ValueError, "rope with add_bias_kv or add_zero_attn");
}

// Metadata that claims a larger layer than the file's tensors (1.8 KB that
// said embed_dim 16384 made load allocate and initialise 4.2 GB, then
// refuse): refused against the tensors' shapes before anything is built.
TEST(MultiHeadAttention, LoadChecksTheMetadataAgainstTheTensorsFirst) {
  const test::TempDir dir;
  const auto path = dir.file("lying.safetensors");
  const MultiHeadAttention<float> small(config(16, 4), 1);
  std::map<std::string, TensorView<const float>> views;
  const auto state = small.state_dict();
  for (const auto& [name, t] : state) views.emplace(name, t.view());
  write_safetensors(path, views, {{"embed_dim", "16384"}, {"num_heads", "4"}});
  EXPECT_THROW_MSG(MultiHeadAttention<float>::load(path), ValueError,
                   path + ": its metadata (embed_dim 16384, num_heads 4) needs a tensor 'in_proj_bias' of shape "
                          "(49152,); the file's is (48,)");
  write_safetensors(path, views, {{"embed_dim", "16"}, {"num_heads", "4"}, {"sinks", "true"}});
  EXPECT_THROW_MSG(MultiHeadAttention<float>::load(path), ValueError, "needs a tensor 'sinks' of shape (4,), which the file does not hold");
  write_safetensors(path, views, {{"embed_dim", "16"}, {"num_heads", "5"}});
  EXPECT_THROW_MSG(MultiHeadAttention<float>::load(path), ValueError, path + ": its metadata: MultiHeadAttention: embed_dim (16) must be divisible by num_heads (5)");
}

TEST(MultiHeadAttention, SaveAndLoad) {
  const test::TempDir dir;
  const auto path = dir.file("layer.safetensors");
  std::mt19937 rng(54);
  auto c = config(12, 3);
  c.num_kv_heads = 1;
  c.vdim = 6;
  c.rope = true;
  c.rope_base = 500000.0;
  c.rope_interleaved = true;
  c.rope_scaling = parse_rope_scaling(R"({"rope_type": "llama3", "factor": 8, "low_freq_factor": 1,
                                          "high_freq_factor": 4, "original_max_position_embeddings": 8})");
  c.alibi = true;
  c.dropout = 0.25;
  const MultiHeadAttention<float> layer(c, 4);
  layer.save(path);
  const auto loaded = MultiHeadAttention<float>::load(path);
  EXPECT_EQ(loaded.config().rope_scaling, c.rope_scaling);
  EXPECT_TRUE(loaded.config().alibi);
  EXPECT_EQ(loaded.config().num_kv_heads, std::optional<int64_t>(1));
  EXPECT_EQ(loaded.config().value_dim(), 6);
  EXPECT_TRUE(loaded.config().rope && loaded.config().rope_interleaved);
  EXPECT_EQ(loaded.config().rope_base, 500000.0);
  EXPECT_EQ(loaded.config().dropout, 0.25);
  EXPECT_TRUE(loaded.config().batch_first && !loaded.config().add_zero_attn);
  const auto q = cast<float>(random_tensor({2, 4, 12}, rng)), v = cast<float>(random_tensor({2, 4, 6}, rng));
  EXPECT_EQ(max_abs_diff(layer.forward(q.view(), q.view(), v.view()).out,
                         loaded.forward(q.view(), q.view(), v.view()).out), 0.0);
  layer.save(path, StorageDtype::BF16);
  const auto bf = MultiHeadAttention<float>::load(path);
  EXPECT_LT(rel_error(bf.forward(q.view(), q.view(), v.view()).out,
                      layer.forward(q.view(), q.view(), v.view()).out), 2e-2);
  write_safetensors(path, {{"in_proj_weight", layer.state_dict().at("q_proj_weight").view()}});
  EXPECT_THROW_MSG(MultiHeadAttention<float>::load(path), ValueError, "no embed_dim and num_heads");
  write_safetensors(path, {}, {{"embed_dim", "12x"}, {"num_heads", "3"}});
  EXPECT_THROW_MSG(MultiHeadAttention<float>::load(path), ValueError, "'embed_dim' is not an integer");
  write_safetensors(path, {}, {{"embed_dim", "12"}, {"num_heads", "3"}});
  EXPECT_THROW_MSG(MultiHeadAttention<float>::load(path), ValueError,
                   "needs a tensor 'in_proj_bias' of shape (36,), which the file does not hold");
  write_safetensors(path, {}, {{"embed_dim", "12"}, {"num_heads", "3"}, {"rope", "true"},
                               {"rope_scaling", R"({"rope_type": "linear"})"}});
  EXPECT_THROW_MSG(MultiHeadAttention<float>::load(path), ValueError,
                   "metadata 'rope_scaling': rope_scaling: rope_type 'linear' needs 'factor'");
  // the options of nn.MultiheadAttention round-trip too
  auto t = config(8, 2);
  t.add_bias_kv = t.add_zero_attn = true;
  t.batch_first = false;
  const MultiHeadAttention<float> torch_like(t, 5);
  torch_like.save(path);
  const auto back = MultiHeadAttention<float>::load(path);
  EXPECT_TRUE(back.config().add_bias_kv && back.config().add_zero_attn && !back.config().batch_first);
  EXPECT_EQ(max_abs_diff(back.state_dict().at("bias_v"), torch_like.state_dict().at("bias_v")), 0.0);
}

TEST(MultiHeadAttention, InvalidConfigurationsAndInputs) {
  auto c = config(10, 4);
  EXPECT_THROW_MSG(MultiHeadAttention<float>{c}, ValueError,
                   "embed_dim (10) must be divisible by num_heads (4)");
  c = config(12, 4);
  c.num_kv_heads = 3;
  EXPECT_THROW_MSG(MultiHeadAttention<float>{c}, ValueError, "num_kv_heads (3) must divide num_heads (4)");
  c = config(12, 4);
  c.rope = true;
  EXPECT_THROW_MSG(MultiHeadAttention<float>{c}, ValueError, "rope needs an even head dim");
  c = config(12, 2);
  c.rope_scaling.partial_rotary_factor = 0.5;  // rope off
  EXPECT_THROW_MSG(MultiHeadAttention<float>{c}, ValueError, "rope_scaling is given but rope is off");
  c.rope = true;
  c.rope_scaling.partial_rotary_factor = 0.25;  // int(6 * 0.25) = 1
  EXPECT_THROW_MSG(MultiHeadAttention<float>{c}, ValueError, "rope needs an even rotary dim, got int(head_dim 6");
  c.rope_scaling = {};
  c.rope_scaling.rope_type = RopeType::Dynamic;
  EXPECT_THROW_MSG(MultiHeadAttention<float>{c}, ValueError,
                   "MultiHeadAttention: rope_scaling: rope_type 'dynamic' needs 'factor'");
  c.rope_scaling = {};
  c.rope_scaling.mrope_section = {1, 1};
  EXPECT_THROW_MSG(MultiHeadAttention<float>{c}, ValueError, "mrope_section must add up to the rotary dim / 2 = 3");
  c = config(12, 2);
  c.alibi = true;
  c.add_zero_attn = true;
  EXPECT_THROW_MSG(MultiHeadAttention<float>{c}, ValueError, "alibi with add_bias_kv or add_zero_attn");
  c = config(12, 2);
  c.alibi = true;
  MhaForwardOptions<float> own_slopes;
  own_slopes.attention.alibi_slopes = {0.5, 0.25};
  const Tensor<float> x6({1, 3, 12});
  EXPECT_THROW_MSG(MultiHeadAttention<float>(c).forward(x6.view(), {}, {}, own_slopes), ValueError,
                   "this layer has alibi on, which sets the slopes");
  c = config(12, 4);
  c.dropout = 1.5;
  EXPECT_THROW_MSG(MultiHeadAttention<float>{c}, ValueError, "dropout must be in [0, 1], got 1.5");

  const MultiHeadAttention<float> layer(config(8, 2));
  const Tensor<float> x({2, 5, 8}), bad({2, 5, 7}), k3({3, 5, 8});
  EXPECT_THROW_MSG(layer.forward(bad.view()), ValueError, "query's last axis must be embed_dim=8");
  EXPECT_THROW_MSG(layer.forward(x.view(), k3.view()), ValueError, "same batch size");
  MhaForwardOptions<float> opt;
  const Tensor<bool> m({5, 4});
  opt.attn_mask = TensorView<const bool>(m.view());
  EXPECT_THROW_MSG(layer.forward(x.view(), {}, {}, opt), ValueError,
                   "attn_mask must be (n_q, n_k) = (5, 5) or (batch * num_heads, n_q, n_k) = (4, 5, 5), got (5, 4)");
  opt = {};
  const Tensor<bool> kpm({5});
  opt.key_padding_mask = TensorView<const bool>(kpm.view());
  EXPECT_THROW_MSG(layer.forward(x.view(), {}, {}, opt), ValueError,
                   "key_padding_mask must be (batch, n_k) = (2, 5), got (5,)");
}

// A call that fails leaves the KV cache as it was: the masks are checked
// against the cache's length plus this call's keys before anything is appended.
TEST(MultiHeadAttention, AFailedCallLeavesTheCacheAlone) {
  const MultiHeadAttention<float> layer(config(8, 2));
  KVCache<float> cache = layer.new_cache();
  const Tensor<float> x({2, 5, 8});
  MhaForwardOptions<float> opt;
  opt.cache = &cache;
  layer.forward(x.view(), {}, {}, opt);
  ASSERT_EQ(cache.length(), 5);
  const Tensor<bool> kpm({2, 5});  // but 10 keys: 5 cached + 5 new
  opt.key_padding_mask = TensorView<const bool>(kpm.view());
  EXPECT_THROW_MSG(layer.forward(x.view(), {}, {}, opt), ValueError,
                   "key_padding_mask must be (batch, n_k) = (2, 10), got (2, 5)");
  EXPECT_EQ(cache.length(), 5);
}

}  // namespace
}  // namespace attn
