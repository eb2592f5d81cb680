// sparse_attention against attention() in float64 with the boolean mask its
// indices describe (the dense reference, which shares no code with the
// sparse kernel or the sparse reference), on every SIMD target, and its
// refusals; over a paged cache, against the contiguous form over each
// sequence's rows as stored.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>

#include "attn/paged_kv_cache.hpp"
#include "attn/quantize.hpp"
#include "attn/sparse_attention.hpp"
#include "attn/threads.hpp"
#include "helpers.hpp"

namespace attn {
namespace {

using test::cast;
using test::max_abs_diff;
using test::random_tensor;

using test::kInf;

struct SparseCase {
  Shape lead;
  int64_t hq, hkv, n_q, n_k, d, d_v, topk;
  bool per_head;  // indices per KV head, or one row for all heads
  double softcap = 0, sink = 0;  // sink != 0: sinks (h % 3 - 1) · sink + 0.5
  std::optional<double> scale;
};

// Distinct keys per row (−1 in about one slot of five, anywhere), rows of
// (lead..., Hkv or 1, n_q, topk).
Tensor<int32_t> random_indices(const SparseCase& c, std::mt19937& rng) {
  Shape shape = c.lead;
  for (int64_t x : {c.per_head ? c.hkv : 1, c.n_q, c.topk}) shape.push_back(x);
  Tensor<int32_t> idx(shape);
  std::vector<int32_t> keys(static_cast<size_t>(c.n_k));
  std::iota(keys.begin(), keys.end(), 0);
  for (int64_t row = 0; row < idx.numel() / c.topk; ++row) {
    std::shuffle(keys.begin(), keys.end(), rng);
    for (int64_t t = 0; t < c.topk; ++t) idx[row * c.topk + t] = rng() % 5 == 0 ? -1 : keys[static_cast<size_t>(t)];
  }
  return idx;
}

// The boolean mask (lead..., Hq, n_q, n_k) the indices describe.
Tensor<bool> dense_mask(const SparseCase& c, const Tensor<int32_t>& idx) {
  Shape shape = c.lead;
  for (int64_t x : {c.hq, c.n_q, c.n_k}) shape.push_back(x);
  Tensor<bool> mask(shape);
  const int64_t batch = numel_of(c.lead), heads = c.per_head ? c.hkv : 1;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < c.hq; ++h)
      for (int64_t i = 0; i < c.n_q; ++i)
        for (int64_t t = 0; t < c.topk; ++t) {
          const int64_t row = (b * heads + (c.per_head ? h / (c.hq / c.hkv) : 0)) * c.n_q + i;
          const int32_t j = idx[row * c.topk + t];
          if (j >= 0) mask[((b * c.hq + h) * c.n_q + i) * c.n_k + j] = true;
        }
  return mask;
}

Shape with(const Shape& lead, std::initializer_list<int64_t> tail) {
  Shape s = lead;
  s.insert(s.end(), tail);
  return s;
}

TEST(SparseAttention, IsAttentionWithTheMaskItsIndicesDescribe) {
  const SparseCase cases[] = {
      {{}, 4, 4, 5, 40, 16, 16, 8, true},
      {{2}, 6, 2, 7, 100, 24, 20, 13, true, 0, 1.5},              // GQA 3:1, sinks
      {{2, 3}, 8, 1, 3, 70, 33, 17, 70, false, 4.0, 0, 0.3},      // every key, rank 5, softcap, scale
      {{1}, 4, 2, 9, 300, 64, 64, 31, false, 0, 2.0},             // one row of indices for all heads
      {{1}, 2, 2, 2, 5, 3, 1, 1, true},                           // one key per row, d < lanes
  };
  uint32_t seed = 1;
  for (const SparseCase& c : cases) {
    SCOPED_TRACE("case with hq " + std::to_string(c.hq) + ", n_k " + std::to_string(c.n_k));
    std::mt19937 rng(seed++);
    const auto q = random_tensor(with(c.lead, {c.hq, c.n_q, c.d}), rng);
    const auto k = random_tensor(with(c.lead, {c.hkv, c.n_k, c.d}), rng);
    const auto v = random_tensor(with(c.lead, {c.hkv, c.n_k, c.d_v}), rng);
    const Tensor<int32_t> idx = random_indices(c, rng);
    SparseAttentionOptions so;
    so.scale = c.scale, so.softcap = c.softcap;
    AttentionOptions ao;
    ao.scale = c.scale, ao.softcap = c.softcap;
    if (c.sink != 0)
      for (int64_t h = 0; h < c.hq; ++h) so.sinks.push_back(double(h % 3 - 1) * c.sink + 0.5);
    ao.sinks = so.sinks;
    const Tensor<bool> mask = dense_mask(c, idx);
    Tensor<double> want_lse(with(c.lead, {c.hq, c.n_q}));
    AttentionExtras<double> extras;
    extras.lse = want_lse.view();
    Tensor<double> want(with(c.lead, {c.hq, c.n_q, c.d_v}));
    AttentionPlan<double, double>(q.view(), k.view(), v.view(), ao, AttentionMasks(TensorView<const bool>(mask.view())))
        .run(want.view(), extras);
    const auto f64 = sparse_attention<double>(q.view(), k.view(), v.view(), idx.view(), so);
    EXPECT_LT(max_abs_diff(f64.out, want), 1e-13);
    for (int64_t e = 0; e < want_lse.numel(); ++e)
      if (std::isinf(want_lse[e])) EXPECT_EQ(f64.lse[e], want_lse[e]);
      else EXPECT_NEAR(f64.lse[e], want_lse[e], 1e-13);
    test::on_every_simd_target([&] {
      const auto f32 = sparse_attention<float>(cast<float>(q).view(), cast<float>(k).view(),
                                               cast<float>(v).view(), idx.view(), so);
      // float32 inputs, sums of topk products: the bound of attention's kernels.
      EXPECT_LT(max_abs_diff(f32.out, want), 2e-6);
      for (int64_t e = 0; e < want_lse.numel(); ++e)
        if (std::isinf(want_lse[e])) EXPECT_EQ(double(f32.lse[e]), want_lse[e]);
        else EXPECT_NEAR(f32.lse[e], want_lse[e], 2e-6);
    });
  }
}

// A row with no key: zeros, lse −∞, or the sink's logit with sinks.
TEST(SparseAttention, ARowWithNoKeyGivesZeros) {
  std::mt19937 rng(9);
  const auto q = cast<float>(random_tensor({2, 3, 4}, rng)), k = cast<float>(random_tensor({2, 6, 4}, rng)),
             v = cast<float>(random_tensor({2, 6, 5}, rng));
  Tensor<int32_t> idx({2, 3, 2});
  std::fill(idx.data(), idx.data() + idx.numel(), -1);
  idx[2] = 4;  // head 0, row 1 sees key 4 alone: its value
  SparseAttentionOptions o;
  const auto r = sparse_attention<float>(q.view(), k.view(), v.view(), idx.view(), o);
  for (int64_t c = 0; c < 5; ++c) {
    EXPECT_EQ(r.out.at({0, 0, c}), 0.0f);
    EXPECT_NEAR(r.out.at({0, 1, c}), v.at({0, 4, c}), 1e-6);
  }
  EXPECT_EQ(double(r.lse.at({0, 0})), -kInf);
  o.sinks = {0.25, -3.0};
  const auto s = sparse_attention<float>(q.view(), k.view(), v.view(), idx.view(), o);
  EXPECT_EQ(s.out.at({1, 2, 0}), 0.0f);
  EXPECT_FLOAT_EQ(s.lse.at({1, 2}), -3.0f);
  // No keys at all: every slot empty.
  const Tensor<float> none({2, 0, 4}), none_v({2, 0, 5});
  std::fill(idx.data(), idx.data() + idx.numel(), -1);
  const auto e = sparse_attention<float>(q.view(), none.view(), none_v.view(), idx.view(), o);
  EXPECT_EQ(e.out.at({0, 1, 4}), 0.0f);
  EXPECT_FLOAT_EQ(e.lse.at({0, 1}), 0.25f);
}

TEST(SparseAttention, BadIndicesAndShapesAreRefusedByName) {
  const Tensor<float> q({1, 2, 4}), k({1, 5, 4}), v({1, 5, 4});
  const auto refused = [&](std::initializer_list<int32_t> row, const std::string& message) {
    Tensor<int32_t> idx({1, 2, 3});
    std::fill(idx.data(), idx.data() + idx.numel(), -1);
    std::copy(row.begin(), row.end(), idx.data() + 3);
    try {
      sparse_attention<float>(q.view(), k.view(), v.view(), idx.view());
      ADD_FAILURE() << "accepted: " << message;
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  };
  refused({0, -2, 1}, "indices at (batch entry 0, head 0, row 1, slot 1) is -2: must be -1 (no key) or a key in 0..4");
  refused({5, -1, 1}, "is 5: must be -1");
  refused({3, -1, 3}, "row 1, slot 2) names key 3 a second time");
  EXPECT_THROW(sparse_attention<float>(q.view(), k.view(), v.view(), Tensor<int32_t>({1, 3, 3}).view()), ValueError);
  EXPECT_THROW(sparse_attention<float>(q.view(), Tensor<float>({2, 5, 4}).view(), v.view(),
                                       Tensor<int32_t>({1, 2, 3}).view()),
               ValueError);  // Hkv 2 does not divide Hq 1
}

// Over a PagedKVCache of every storage type and both layouts, with pages
// shared by a fork: each request is the contiguous call over its
// sequence's keys and values rounded as the cache stores them, bit for bit
// (the same kernel, reading its rows from pages).
TEST(SparseAttention, OverAPagedCacheIsEachSequenceAlone) {
  std::mt19937 rng(21);
  const int64_t hq = 4, hkv = 2, d = 32, dv = 64, topk = 6;
  for (const KVDtype dtype : {KVDtype::F32, KVDtype::BF16, KVDtype::F16, KVDtype::Q8_0, KVDtype::Q4_0})
    for (const PageLayout layout : {PageLayout::NHD, PageLayout::HND}) {
      PagedKVCache cache(32, 4, hkv, d, dv, dtype, layout);
      const std::vector<int64_t> lengths{10, 0, 7};
      std::vector<int64_t> ids;
      std::vector<Tensor<float>> ks, vs;  // (hkv, n, ·): as stored
      const auto stored = [&](const Tensor<float>& x) {  // rows of x rounded as the cache stores them
        if (dtype == KVDtype::BF16) return dequantize(to_bfloat16(x.view()).view());
        if (dtype == KVDtype::F16) return dequantize(to_float16(x.view()).view());
        if (dtype == KVDtype::Q8_0) return dequantize(quantize_q8_0(x.view()).view());
        if (dtype == KVDtype::Q4_0) return dequantize(quantize_q4_0(x.view()).view());
        return Tensor<float>(x);
      };
      for (int64_t n : lengths) {
        ids.push_back(cache.add_sequence());
        const auto k = cast<float>(random_tensor({n, hkv, d}, rng)), v = cast<float>(random_tensor({n, hkv, dv}, rng));
        const std::vector<int64_t> at{0, n};
        cache.append({ids.back()}, k.view(), v.view(), TensorView<const int64_t>(at.data(), {2}));
        ks.push_back(contiguous(TensorView<const float>(stored(k).view()).transpose(0, 1)));
        vs.push_back(contiguous(TensorView<const float>(stored(v).view()).transpose(0, 1)));
      }
      ids.push_back(cache.fork(ids[0]));
      ks.push_back(ks[0]), vs.push_back(vs[0]);
      const std::vector<int32_t> qo{0, 2, 3, 6, 7};  // rows per request: 2, 1, 3, 1
      const auto q = cast<float>(random_tensor({7, hq, d}, rng));
      Tensor<int32_t> idx({7, hkv, topk});
      for (int64_t r = 0; r < 4; ++r) {
        const int64_t n = ks[static_cast<size_t>(r)].dim(1);
        std::vector<int32_t> keys(static_cast<size_t>(n));
        std::iota(keys.begin(), keys.end(), 0);
        for (int64_t row = qo[r] * hkv; row < qo[r + 1] * hkv; ++row) {
          std::shuffle(keys.begin(), keys.end(), rng);
          for (int64_t t = 0; t < topk; ++t) idx[row * topk + t] = t < n && rng() % 4 ? keys[static_cast<size_t>(t)] : -1;
        }
      }
      SparseAttentionOptions o;
      o.softcap = 5, o.sinks = {0.5, -1, 0, 2};
      const auto got = sparse_attention(q.view(), TensorView<const int32_t>(qo.data(), {5}), cache, ids, idx.view(), o);
      for (int64_t r = 0; r < 4; ++r) {
        const int64_t rows = qo[r + 1] - qo[r];
        const auto part = [&](const auto& t, int64_t width) {  // request r's rows as (heads, rows, width)
          return contiguous(TensorView<const std::remove_cvref_t<decltype(*t.data())>>(
              t.data() + qo[r] * t.dim(1) * width, {t.dim(1), rows, width}, {width, t.dim(1) * width, 1}));
        };
        const auto want = sparse_attention<float>(part(q, d).view(), ks[static_cast<size_t>(r)].view(),
                                                  vs[static_cast<size_t>(r)].view(), part(idx, topk).view(), o);
        const auto out_r = part(got.out, dv);
        const Tensor<float> lse_r = contiguous(TensorView<const float>(got.lse.data() + qo[r] * hq, {hq, rows}, {1, hq}));
        EXPECT_EQ(max_abs_diff(out_r, want.out), 0.0) << kv_dtype_name(dtype) << " request " << r;
        for (int64_t e = 0; e < lse_r.numel(); ++e) EXPECT_EQ(lse_r[e], want.lse[e]) << kv_dtype_name(dtype);
      }
    }
}

// A call of fewer rows than threads slices each row's GQA group into work
// items (kernels/config.hpp's kSparseHeadsPerItem): one row of 130 heads
// over one KV head, bitwise the same on 1 thread (whole groups) as on 2
// (slices), and within float rounding of the float64 reference.
TEST(SparseAttention, SlicedHeadsAreBitwiseTheWholeGroups) {
  if (max_num_threads() < 2) GTEST_SKIP() << "needs 2 threads";
  std::mt19937 rng(31);
  const auto q = random_tensor({130, 1, 48}, rng), k = random_tensor({1, 300, 48}, rng),
             v = random_tensor({1, 300, 40}, rng);
  const SparseCase c{{}, 130, 1, 1, 300, 48, 40, 70, true};
  const Tensor<int32_t> idx = random_indices(c, rng);
  const auto qf = cast<float>(q), kf = cast<float>(k), vf = cast<float>(v);
  const int before = num_threads();
  set_num_threads(1);
  const auto whole = sparse_attention<float>(qf.view(), kf.view(), vf.view(), idx.view());
  set_num_threads(2);
  const auto sliced = sparse_attention<float>(qf.view(), kf.view(), vf.view(), idx.view());
  set_num_threads(before);
  EXPECT_EQ(max_abs_diff(whole.out, sliced.out), 0.0);
  EXPECT_EQ(max_abs_diff(whole.lse, sliced.lse), 0.0);
  const auto want = sparse_attention<double>(q.view(), k.view(), v.view(), idx.view());
  EXPECT_LT(max_abs_diff(cast<double>(sliced.out), want.out), 2e-6);
}

}  // namespace
}  // namespace attn
