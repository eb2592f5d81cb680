// Serving: merge_state and merge_states against attention over the union of
// the keys (the float64 reference), and their rules at the edges.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <thread>
#include <tuple>

#include "attn/attn.hpp"
#include "helpers.hpp"

namespace attn {
namespace {

using test::random_tensor;
using test::kInf;

// Attention of q (H, n, d) over keys [begin, end) of k, v (H, n_k, ·) in
// float64, as a state: v (n, H, d_v) and s (n, H), merge_state's layout.
struct State {
  Tensor<double> v, s;
};
State state_over(const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v, int64_t begin,
                 int64_t end) {
  const int64_t heads = q.dim(0), n = q.dim(1), d_v = v.dim(2);
  const auto keys = [&](const Tensor<double>& t) {
    return TensorView<const double>(t.data() + begin * t.dim(2), {heads, end - begin, t.dim(2)}, t.view().strides());
  };
  const auto r = test::forward(q.view(), keys(k), keys(v), test::Returns{.lse = true});
  State s{Tensor<double>({n, heads, d_v}), Tensor<double>({n, heads})};
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t e = 0; e < d_v; ++e) s.v.at({i, h, e}) = r.out.at({h, i, e});
      s.s.at({i, h}) = r.lse.at({h, i});
    }
  return s;
}

TEST(MergeState, TwoHalvesGiveAttentionOverAllKeys) {
  std::mt19937 rng(7);
  const auto q = random_tensor({3, 5, 8}, rng), k = random_tensor({3, 11, 8}, rng, -2, 2),
             v = random_tensor({3, 11, 6}, rng);
  const State whole = state_over(q, k, v, 0, 11), a = state_over(q, k, v, 0, 4), b = state_over(q, k, v, 4, 11);
  const auto merged = merge_state<double>(a.v.view(), a.s.view(), b.v.view(), b.s.view());
  EXPECT_LT(test::max_abs_diff(merged.v, whole.v), 1e-14);
  EXPECT_LT(test::max_abs_diff(merged.s, whole.s), 1e-14);

  // In place, and in float32 (its weights computed in double).
  auto v32 = test::cast<float>(a.v), s32 = test::cast<float>(a.s);
  const auto vb32 = test::cast<float>(b.v), sb32 = test::cast<float>(b.s);
  merge_state_in_place<float>(v32.view(), s32.view(), vb32.view(), sb32.view());
  EXPECT_LT(test::max_abs_diff(v32, whole.v), 1e-6);
  EXPECT_LT(test::max_abs_diff(s32, whole.s), 1e-6);
}

TEST(MergeState, ManyStatesInOrderGiveAttentionOverAllKeys) {
  std::mt19937 rng(8);
  const auto q = random_tensor({2, 4, 8}, rng), k = random_tensor({2, 20, 8}, rng, -2, 2),
             v = random_tensor({2, 20, 5}, rng);
  const int64_t cuts[] = {0, 3, 3, 12, 20};  // one part holds no key: lse −∞, zeros
  const State whole = state_over(q, k, v, 0, 20);
  Tensor<double> vs({4, 4, 2, 5}), ss({4, 4, 2});
  for (int64_t part = 0; part < 4; ++part) {
    const State st = state_over(q, k, v, cuts[part], cuts[part + 1]);
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t h = 0; h < 2; ++h) {
        for (int64_t e = 0; e < 5; ++e) vs.at({i, part, h, e}) = st.v.at({i, h, e});
        ss.at({i, part, h}) = st.s.at({i, h});
      }
  }
  EXPECT_EQ(ss.at({0, 1, 0}), -kInf);
  const auto merged = merge_states<double>(vs.view(), ss.view());
  EXPECT_LT(test::max_abs_diff(merged.v, whole.v), 1e-14);
  EXPECT_LT(test::max_abs_diff(merged.s, whole.s), 1e-14);
  // No state at all: zeros and −∞.
  const auto none = merge_states<double>(Tensor<double>({2, 0, 1, 3}).view(), Tensor<double>({2, 0, 1}).view());
  EXPECT_EQ(none.v.shape(), (Shape{2, 1, 3}));
  for (int64_t i = 0; i < none.v.numel(); ++i) EXPECT_EQ(none.v[i], 0.0);
  EXPECT_EQ(none.s[0], -kInf);
}

TEST(MergeState, EdgesFollowTheSoftmaxsRules) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  struct Case {
    double s_a, s_b, want_s, want_v;  // v_a = 1, v_b = 3 (NaN when its state is −∞: never read)
  };
  const Case cases[] = {
      {0.0, -kInf, 0.0, 1.0},                       // b has no key: changes nothing
      {-kInf, 0.0, 0.0, 3.0},                       // a has none: b's state
      {-kInf, -kInf, -kInf, 1.0},                   // neither: a's (zeros, for attention's)
      {kInf, 5.0, kInf, 1.0},                       // +∞ takes all the weight
      {5.0, kInf, kInf, 3.0},
      {kInf, kInf, nan, nan},                       // which +∞ weighs more is unknown
      {nan, 0.0, nan, nan},
      {std::log(1.0), std::log(3.0), std::log(4.0), 0.25 * 1 + 0.75 * 3},
  };
  for (const Case& c : cases) {
    const Tensor<double> va({1, 1, 1}, {1.0}), sa({1, 1}, {c.s_a});
    const Tensor<double> vb({1, 1, 1}, {c.s_b == -kInf ? nan : 3.0}), sb({1, 1}, {c.s_b});
    const auto m = merge_state<double>(va.view(), sa.view(), vb.view(), sb.view());
    const auto same = [](double got, double want) { return std::isnan(want) ? std::isnan(got) : got == want; };
    EXPECT_TRUE(same(m.s[0], c.want_s) || std::abs(m.s[0] - c.want_s) < 1e-15)
        << "s_a=" << c.s_a << " s_b=" << c.s_b << ": s " << m.s[0];
    EXPECT_TRUE(same(m.v[0], c.want_v) || std::abs(m.v[0] - c.want_v) < 1e-15)
        << "s_a=" << c.s_a << " s_b=" << c.s_b << ": v " << m.v[0];
  }
}

TEST(MergeState, ShapesThatDifferAreNamed) {
  const Tensor<float> v({2, 3, 4}), s({2, 3}), v_bad({2, 3, 5}), s_bad({3, 2});
  EXPECT_THROW_MSG(merge_state<float>(v.view(), s.view(), v_bad.view(), s.view()), ValueError,
                   "merge_state: v_b must have shape (2, 3, 4), got v_b (2, 3, 5)");
  EXPECT_THROW_MSG(merge_state<float>(v.view(), s_bad.view(), v.view(), s.view()), ValueError,
                   "s_a must have shape (2, 3)");
  EXPECT_THROW_MSG(merge_states<float>(v.view(), s.view()), ValueError,
                   "vs must be (n, num_states, heads, head_dim), got shape (2, 3, 4)");
}

}  // namespace
}  // namespace attn

namespace attn {
namespace {

// A batch of requests over a shuffled pool of pages, and its float64 answer
// computed per request by attention() on the request's pages gathered.
struct PagedBatch {
  std::vector<int64_t> qo_len, kv_len;
  int64_t page_size = 16, hq = 4, hkv = 2, d = 16, d_v = 16;
  PageLayout layout = PageLayout::NHD;
  Tensor<float> q, k_pool, v_pool;  // pools (num_pages, ...) by layout
  Tensor<int32_t> qo_indptr, kv_indptr, kv_indices, last_page_len;
};

PagedBatch make_batch(std::vector<int64_t> qo_len, std::vector<int64_t> kv_len, int64_t page_size, int64_t hq,
                      int64_t hkv, int64_t d, int64_t d_v, PageLayout layout, uint32_t seed) {
  PagedBatch b;
  b.qo_len = std::move(qo_len);
  b.kv_len = std::move(kv_len);
  b.page_size = page_size, b.hq = hq, b.hkv = hkv, b.d = d, b.d_v = d_v, b.layout = layout;
  std::mt19937 rng(seed);
  const auto n = static_cast<int64_t>(b.qo_len.size());
  int64_t nnz = 0, pages = 0;
  for (int64_t r = 0; r < n; ++r) {
    nnz += b.qo_len[r];
    pages += (b.kv_len[r] + page_size - 1) / page_size;
  }
  const int64_t num_pages = pages + 3;  // a few pages no request uses
  std::vector<int32_t> order(static_cast<size_t>(num_pages));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);  // pages in no particular order
  b.qo_indptr = Tensor<int32_t>({n + 1});
  b.kv_indptr = Tensor<int32_t>({n + 1});
  b.kv_indices = Tensor<int32_t>({pages});
  b.last_page_len = Tensor<int32_t>({n});
  int64_t page = 0;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t p = (b.kv_len[r] + page_size - 1) / page_size;
    b.qo_indptr[r + 1] = static_cast<int32_t>(b.qo_indptr[r] + b.qo_len[r]);
    b.kv_indptr[r + 1] = static_cast<int32_t>(b.kv_indptr[r] + p);
    for (int64_t i = 0; i < p; ++i, ++page) b.kv_indices[page] = order[static_cast<size_t>(page)];
    b.last_page_len[r] = static_cast<int32_t>(p == 0 ? 0 : b.kv_len[r] - (p - 1) * page_size);
  }
  const auto pool = [&](int64_t dim) {
    return layout == PageLayout::NHD ? Shape{num_pages, page_size, hkv, dim} : Shape{num_pages, hkv, page_size, dim};
  };
  b.q = test::cast<float>(random_tensor({nnz, hq, d}, rng));
  b.k_pool = test::cast<float>(random_tensor(pool(d), rng, -2, 2));
  b.v_pool = test::cast<float>(random_tensor(pool(d_v), rng));
  return b;
}

// Row j of request r, head h, from a pool of page_rows rows per page (int4's
// key groups: page_size / 32).
template <class KV>
const KV* pool_row(const PagedBatch& b, const Tensor<KV>& pool, int64_t r, int64_t h, int64_t j, int64_t page_rows) {
  const int64_t page = b.kv_indices[b.kv_indptr[r] + j / page_rows], slot = j % page_rows;
  return b.layout == PageLayout::NHD ? &pool.at({page, slot, h, 0}) : &pool.at({page, h, slot, 0});
}
// Key (or value) j of request r, head h, from a float pool.
const float* pool_row(const PagedBatch& b, const Tensor<float>& pool, int64_t r, int64_t h, int64_t j) {
  return pool_row(b, pool, r, h, j, b.page_size);
}

// Request r's (Hq, qo_len, d_v) output and (Hq, qo_len) lse in float64,
// from pools k_pool and v_pool (the batch's, or their stored values).
test::Forward<double> reference_request(const PagedBatch& b, const Tensor<float>& k_pool, const Tensor<float>& v_pool,
                                        int64_t r, const AttentionOptions& options, const bool* mask) {
  const int64_t n_q = b.qo_len[r], n_k = b.kv_len[r];
  Tensor<double> q({b.hq, n_q, b.d}), k({b.hkv, n_k, b.d}), v({b.hkv, n_k, b.d_v});
  for (int64_t h = 0; h < b.hq; ++h)
    for (int64_t i = 0; i < n_q; ++i)
      for (int64_t c = 0; c < b.d; ++c) q.at({h, i, c}) = b.q.at({b.qo_indptr[r] + i, h, c});
  for (int64_t h = 0; h < b.hkv; ++h)
    for (int64_t j = 0; j < n_k; ++j) {
      for (int64_t c = 0; c < b.d; ++c) k.at({h, j, c}) = pool_row(b, k_pool, r, h, j)[c];
      for (int64_t c = 0; c < b.d_v; ++c) v.at({h, j, c}) = pool_row(b, v_pool, r, h, j)[c];
    }
  AttentionMasks masks;
  if (mask) masks.first = AttentionMask{TensorView<const bool>(mask, {n_q, n_k})};
  return test::forward(q.view(), k.view(), v.view(), test::Returns{.lse = true}, options, masks);
}

AttentionOptions as_attention_options(const BatchAttentionOptions& o) {
  AttentionOptions a;
  a.causal = o.causal ? Causal::BottomRight : Causal::None;
  a.window = o.window, a.softcap = o.softcap, a.scale = o.scale;
  a.alibi_slopes = o.alibi_slopes, a.sinks = o.sinks;
  return a;
}

template <class KV>
BatchAttentionResult run_batch(const PagedBatch& b, TensorView<const KV> k_pool, TensorView<const KV> v_pool,
                               const BatchAttentionOptions& options) {
  return batch_attention<KV>(b.q.view(), b.qo_indptr.view(), k_pool, v_pool, b.kv_indptr.view(), b.kv_indices.view(),
                             b.last_page_len.view(), options, b.layout, true);
}

// Every request's rows of out and lse against the float64 answer.
void expect_matches_reference(const PagedBatch& b, const BatchAttentionResult& got, const Tensor<float>& k_pool,
                              const Tensor<float>& v_pool, const BatchAttentionOptions& options, double tol,
                              const std::string& what) {
  for (int64_t r = 0; r < static_cast<int64_t>(b.qo_len.size()); ++r) {
    const bool* mask = nullptr;
    int64_t offset = 0;
    for (int64_t s = 0; s < r; ++s) offset += b.qo_len[s] * b.kv_len[s];
    if (!options.custom_mask.empty_view()) mask = options.custom_mask.data() + offset;
    const auto want = reference_request(b, k_pool, v_pool, r, as_attention_options(options), mask);
    double err = 0, lse_err = 0;
    for (int64_t h = 0; h < b.hq; ++h)
      for (int64_t i = 0; i < b.qo_len[r]; ++i) {
        const int64_t row = b.qo_indptr[r] + i;
        for (int64_t c = 0; c < b.d_v; ++c)
          err = std::max(err, std::abs(got.out.at({row, h, c}) - want.out.at({h, i, c})));
        const double l = got.lse.at({row, h}), wl = want.lse.at({h, i});
        if (std::isinf(wl)) EXPECT_EQ(l, wl) << what << " request " << r;
        else lse_err = std::max(lse_err, std::abs(l - wl));
      }
    EXPECT_LT(err, tol) << what << " request " << r << " (qo_len " << b.qo_len[r] << ", kv_len " << b.kv_len[r] << ")";
    EXPECT_LT(lse_err, tol) << what << " request " << r;
  }
}

// Decode (1 query), verification (8), prefill (20 and 37) and empty requests.
const std::vector<int64_t> kQoLens = {1, 8, 20, 1, 0, 3, 37, 1};
const std::vector<int64_t> kKvLens = {1, 1100, 45, 0, 9, 17, 37, 600};

TEST(BatchAttention, MatchesFloat64PerRequestOnGatheredPages) {
  struct Case {
    int64_t page_size, hq, hkv, d, d_v;
    PageLayout layout;
  };
  // (With 8 queries, a group of 8 gives 64 rows per kv head: the decode
  // kernel's scores by tiles (kDecodePanelRows), over pages of 1 and 16 in
  // either layout. The last: 8 queries of 4 heads × 3 overflow L1 as one
  // item's rows, so the decode kernel goes head by head over each page.)
  const Case cases[] = {{16, 6, 2, 16, 16, PageLayout::NHD},  {1, 8, 1, 13, 7, PageLayout::NHD},
                        {8, 3, 3, 32, 24, PageLayout::HND},   {16, 8, 1, 64, 64, PageLayout::HND},
                        {16, 16, 2, 128, 64, PageLayout::NHD}, {16, 12, 4, 128, 64, PageLayout::NHD}};
  for (const Case& c : cases) {
    const PagedBatch b = make_batch(kQoLens, kKvLens, c.page_size, c.hq, c.hkv, c.d, c.d_v, c.layout, 1);
    const std::string what = "page_size " + std::to_string(c.page_size) + " hq " + std::to_string(c.hq) + ":" +
                             std::to_string(c.hkv) + " d " + std::to_string(c.d) + "/" + std::to_string(c.d_v) +
                             " " + page_layout_name(c.layout);
    const BatchAttentionResult got = run_batch<float>(b, b.k_pool.view(), b.v_pool.view(), {});
    expect_matches_reference(b, got, b.k_pool, b.v_pool, {}, 2e-5, what);
  }
}

TEST(BatchAttention, EveryOptionPerRequest) {
  const PagedBatch b = make_batch(kQoLens, kKvLens, 16, 6, 2, 16, 16, PageLayout::NHD, 2);
  std::vector<BatchAttentionOptions> all(6);
  all[0].causal = true;
  all[1].window = {30, 2};
  all[2].causal = true, all[2].window = {5, -1}, all[2].softcap = 2.0;
  all[3].alibi_slopes = alibi_slopes(6), all[3].causal = true;
  all[4].sinks = {0.5, -1, 3, 0, 1, -2}, all[4].causal = true;
  all[5].scale = 0.3, all[5].alibi_slopes = alibi_slopes(6), all[5].window = {7, 7};
  for (size_t i = 0; i < all.size(); ++i) {
    const BatchAttentionResult got = run_batch<float>(b, b.k_pool.view(), b.v_pool.view(), all[i]);
    expect_matches_reference(b, got, b.k_pool, b.v_pool, all[i], 2e-5, "options " + std::to_string(i));
  }
}

TEST(BatchAttention, CustomMasksDenseAndPackedAndTheCausalTriangle) {
  const PagedBatch b = make_batch(kQoLens, kKvLens, 8, 4, 2, 16, 16, PageLayout::NHD, 3);
  std::mt19937 rng(4);
  std::vector<char> dense, triangle;  // (char: std::vector<bool> has no data())
  std::vector<uint8_t> packed;
  std::vector<int32_t> mask_indptr = {0};
  for (size_t r = 0; r < kQoLens.size(); ++r) {
    const int64_t n_q = kQoLens[r], n_k = kKvLens[r];
    std::vector<uint8_t> bits(static_cast<size_t>((n_q * n_k + 7) / 8), 0);
    for (int64_t i = 0; i < n_q; ++i)
      for (int64_t j = 0; j < n_k; ++j) {
        const bool allow = rng() % 3 != 0;
        dense.push_back(allow);
        triangle.push_back(j <= i + n_k - n_q);
        if (allow) bits[static_cast<size_t>((i * n_k + j) / 8)] |= uint8_t(1u << ((i * n_k + j) % 8));
      }
    packed.insert(packed.end(), bits.begin(), bits.end());
    mask_indptr.push_back(static_cast<int32_t>(packed.size()));
  }
  const auto n = static_cast<int64_t>(dense.size());
  BatchAttentionOptions with_dense;
  with_dense.custom_mask = TensorView<const bool>(reinterpret_cast<const bool*>(dense.data()), {n});
  const auto got = run_batch<float>(b, b.k_pool.view(), b.v_pool.view(), with_dense);
  expect_matches_reference(b, got, b.k_pool, b.v_pool, with_dense, 2e-5, "custom_mask");

  BatchAttentionOptions with_packed;
  with_packed.packed_custom_mask = TensorView<const uint8_t>(packed.data(), {static_cast<int64_t>(packed.size())});
  with_packed.mask_indptr = TensorView<const int32_t>(mask_indptr.data(), {static_cast<int64_t>(mask_indptr.size())});
  const auto from_bits = run_batch<float>(b, b.k_pool.view(), b.v_pool.view(), with_packed);
  EXPECT_EQ(std::memcmp(got.out.data(), from_bits.out.data(), sizeof(float) * got.out.numel()), 0);

  BatchAttentionOptions as_triangle, causal;
  as_triangle.custom_mask = TensorView<const bool>(reinterpret_cast<const bool*>(triangle.data()), {n});
  causal.causal = true;
  const auto a = run_batch<float>(b, b.k_pool.view(), b.v_pool.view(), as_triangle);
  const auto c = run_batch<float>(b, b.k_pool.view(), b.v_pool.view(), causal);
  EXPECT_LT(test::max_abs_diff(a.out, c.out), 1e-6);
}

TEST(BatchAttention, StorageTypesReadTheirStoredValues) {
  // Groups of 2 and 4: 16 and 32 rows per kv head with 8 queries, scores key
  // by key and by tiles (kDecodePanelRows), each widening the stored values.
  for (const int64_t hq : {4, 8}) {
    const PagedBatch b = make_batch(kQoLens, kKvLens, 16, hq, 2, 64, 32, PageLayout::NHD, 5);
    const auto check = [&](auto k_stored, auto v_stored, const std::string& what) {
      const auto got = run_batch(b, k_stored.view(), v_stored.view(), {});
      // The float64 answer on the values the pool holds: accuracy as float32's.
      expect_matches_reference(b, got, dequantize(k_stored.view()), dequantize(v_stored.view()), {}, 2e-5, what);
    };
    const std::string heads = " hq " + std::to_string(hq);
    check(to_bfloat16(b.k_pool.view()), to_bfloat16(b.v_pool.view()), "bf16" + heads);
    check(to_float16(b.k_pool.view()), to_float16(b.v_pool.view()), "f16" + heads);
    check(quantize_q8_0(b.k_pool.view()), quantize_q8_0(b.v_pool.view()), "q8_0" + heads);
    check(quantize_q4_0(b.k_pool.view()), quantize_q4_0(b.v_pool.view()), "q4_0" + heads);
  }
}

// A batch's pools as int4 (KIVI's): keys per channel over each page's
// groups of 32 slots, values per token; and the float32 pools they hold.
struct Int4Pools {
  Tensor<block_int4> k, v;
  Tensor<float> k_held, v_held;
};
Int4Pools int4_pools(const PagedBatch& b) {
  const int64_t pages = b.k_pool.dim(0), groups = b.page_size / kInt4Group;
  const bool nhd = b.layout == PageLayout::NHD;
  Int4Pools p{Tensor<block_int4>(nhd ? Shape{pages, groups, b.hkv, b.d} : Shape{pages, b.hkv, groups, b.d}),
              quantize_int4_values(b.v_pool.view()), Tensor<float>(b.k_pool.shape()), Tensor<float>()};
  p.v_held = dequantize_int4_values(p.v.view());
  const auto slot = [&](auto& pool, int64_t page, int64_t t, int64_t h) {
    return nhd ? &pool.at({page, t, h, 0}) : &pool.at({page, h, t, 0});
  };
  std::vector<float> keys(static_cast<size_t>(kInt4Group * b.d));
  for (int64_t page = 0; page < pages; ++page)
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t h = 0; h < b.hkv; ++h) {
        for (int64_t t = 0; t < kInt4Group; ++t)
          std::copy_n(slot(b.k_pool, page, g * kInt4Group + t, h), b.d, keys.data() + t * b.d);
        block_int4* row = slot(p.k, page, g, h);
        quantize_int4_key_rows(keys.data(), kInt4Group, b.d, row);
        for (int64_t t = 0; t < kInt4Group; ++t)
          for (int64_t c = 0; c < b.d; ++c) slot(p.k_held, page, g * kInt4Group + t, h)[c] = int4_value(row[c], t);
      }
  return p;
}

TEST(BatchAttention, Int4PagesReadTheirStoredValues) {
  // Pages of 32 and 64 tokens (1 and 2 groups), NHD (every kv head of a
  // token side by side) and HND; groups of 2 and 4 query heads.
  struct Case {
    int64_t page_size, hq, hkv;
    PageLayout layout;
  };
  for (const Case& c : {Case{32, 4, 2, PageLayout::NHD}, Case{64, 8, 2, PageLayout::HND},
                        Case{64, 4, 1, PageLayout::NHD}}) {
    const PagedBatch b = make_batch(kQoLens, kKvLens, c.page_size, c.hq, c.hkv, 64, 32, c.layout, 6);
    const Int4Pools p = int4_pools(b);
    const Tensor<block_int4> key_pages = quantize_int4_key_pages(b.k_pool.view(), c.layout);
    ASSERT_EQ(key_pages.shape(), p.k.shape());
    EXPECT_EQ(std::memcmp(key_pages.data(), p.k.data(), sizeof(block_int4) * p.k.numel()), 0);
    const std::string what = "int4 page_size " + std::to_string(c.page_size) + " hq " + std::to_string(c.hq) + ":" +
                             std::to_string(c.hkv) + " " + page_layout_name(c.layout);
    // The float64 answer on the values the pools hold: accuracy as float32's.
    expect_matches_reference(b, run_batch(b, p.k.view(), p.v.view(), {}), p.k_held, p.v_held, {}, 2e-5, what);
    BatchAttentionOptions masked;
    masked.causal = true, masked.window = {300, -1}, masked.softcap = 3.0;
    expect_matches_reference(b, run_batch(b, p.k.view(), p.v.view(), masked), p.k_held, p.v_held, masked, 2e-5,
                             what + " causal, window, softcap");
  }
  const PagedBatch b = make_batch(kQoLens, kKvLens, 16, 4, 2, 64, 32, PageLayout::NHD, 6);
  const Tensor<block_int4> k({b.k_pool.dim(0), 1, 2, 64}), v = quantize_int4_values(b.v_pool.view());
  EXPECT_THROW_MSG(run_batch(b, k.view(), v.view(), {}), ValueError, "page_size must be a multiple of 32, got 16");
  EXPECT_THROW_MSG(quantize_int4_key_pages(b.k_pool.view()), ValueError, "page_size must be a multiple of 32, got 16");
  Tensor<float> bad({2, 32, 2, 8});
  bad.at({1, 40 % 32, 1, 3}) = std::numeric_limits<float>::infinity();
  EXPECT_THROW_MSG(quantize_int4_key_pages(bad.view()), ValueError, "(channel 3 of keys 0 .. 31) (page 1, head 1)");
  const PagedBatch b32 = make_batch(kQoLens, kKvLens, 32, 4, 2, 64, 32, PageLayout::NHD, 6);
  const BatchAttentionPlan plan(b32.qo_indptr.view(), b32.kv_indptr.view(), b32.kv_indices.view(),
                                b32.last_page_len.view(), 4, 2, 64, 32, {}, 32);
  const Tensor<block_int4> per_token = quantize_int4_values(b32.k_pool.view());
  Tensor<float> out(plan.output_shape());
  EXPECT_THROW_MSG(plan.run<block_int4>(b32.q.view(), per_token.view(), quantize_int4_values(b32.v_pool.view()).view(),
                                        out.view()),
                   ValueError, "k_pages must be int4 key groups (num_pages, page_size / 32, num_kv_heads, head_dim)");
}

// Decode scores block-stored and 16-bit keys several at a time (DotKeys:
// four, two on AVX2 at 4 rows; one row's blocks: kBlockKeysAtOnce, eight on
// AVX2, by BlockDotKeys, or CodeDotKeys at int8 precision) where their rows
// are fetched ahead, or one at a time where a page holds fewer: the same
// bits either way. One sequence's q8_0, q4_0, bf16 or f16 K and V at 4
// query rows per kv head, and q8_0 (at int8 precision too) and q4_0 at 1
// (16-bit keys at one row take other softmax blocks in pages than
// contiguous: SplitOf), contiguous
// (keys by groups, a chunk's last ones alone) and in HND pages of 3 (all
// alone) and 16, whose items are the contiguous call's (one kv head,
// 512-key chunks, the same softmax blocks): the log-sum-exps, which only
// the scores reach, are bitwise equal. (A scale of 1 spreads the scores,
// so that the log-sum-exp follows its largest ones to their last bit: at
// 1/sqrt(d) one key's sum taken in another order went unseen. P·V sums
// page by page, so the outputs agree to rounding.)
TEST(BatchAttention, DecodeScoresAKeyTheSameAloneAndAmongOthers) {
  std::mt19937 rng(17);
  const int64_t hkv = 2, d = 64, n = 1100;
  const auto k = test::cast<float>(random_tensor({hkv, n, d}, rng)), v = test::cast<float>(random_tensor({hkv, n, d}, rng));
  const auto check = [&](auto quantize, int64_t hq, Precision precision) {
    SCOPED_TRACE(std::to_string(hq / hkv) + " rows per kv head" + (precision == Precision::Int8 ? ", int8" : ""));
    const auto q = test::cast<float>(random_tensor({1, hq, d}, rng));
    const auto kq = quantize(k.view()), vq = quantize(v.view());
    using Block = std::remove_cvref_t<decltype(*kq.data())>;
    const Tensor<float> q4 = contiguous(TensorView<const float>(q.view()).transpose(0, 1));  // (hq, 1, d)
    Tensor<float> whole({hq, 1, d}), whole_lse({hq, 1});
    AttentionExtras<float> extras;
    extras.lse = whole_lse.view();
    AttentionOptions options;
    options.precision = precision;
    options.scale = 1.0;
    AttentionPlan(q4.view(), TensorView<const Block>(kq.view()), TensorView<const Block>(vq.view()), options)
        .run(whole.view(), extras);
    for (const int64_t page_size : {3, 16}) {
      const int64_t pages = (n + page_size - 1) / page_size;
      Tensor<float> kp({pages, hkv, page_size, d}), vp({pages, hkv, page_size, d});
      for (int64_t h = 0; h < hkv; ++h)
        for (int64_t j = 0; j < n; ++j)
          for (int64_t c = 0; c < d; ++c)
            kp.at({j / page_size, h, j % page_size, c}) = k.at({h, j, c}),
            vp.at({j / page_size, h, j % page_size, c}) = v.at({h, j, c});
      Tensor<int32_t> indptr({2}, {0, static_cast<int32_t>(pages)}), indices({pages}), last({1});
      for (int64_t p = 0; p < pages; ++p) indices[p] = static_cast<int32_t>(p);
      last[0] = static_cast<int32_t>(n - (pages - 1) * page_size);
      const Tensor<int32_t> qo({2}, {0, 1});
      const auto kpq = quantize(kp.view()), vpq = quantize(vp.view());
      BatchAttentionOptions batch_options;
      batch_options.precision = precision;
      batch_options.scale = 1.0;
      const auto got = batch_attention<Block>(q.view(), qo.view(), kpq.view(), vpq.view(), indptr.view(), indices.view(),
                                              last.view(), batch_options, PageLayout::HND, true);
      for (int64_t h = 0; h < hq; ++h) {
        EXPECT_EQ(got.lse.at({0, h}), whole_lse.at({h, 0})) << "pages of " << page_size << ", head " << h;
        for (int64_t c = 0; c < d; ++c) EXPECT_NEAR(got.out.at({0, h, c}), whole.at({h, 0, c}), 1e-6);
      }
    }
  };
  for (const int64_t hq : {8, 2}) {
    check([](TensorView<const float> x) { return quantize_q8_0(x); }, hq, Precision::Float32);
    check([](TensorView<const float> x) { return quantize_q4_0(x); }, hq, Precision::Float32);
  }
  check([](TensorView<const float> x) { return quantize_q8_0(x); }, 2, Precision::Int8);
  check([](TensorView<const float> x) { return to_bfloat16(x); }, 8, Precision::Float32);
  check([](TensorView<const float> x) { return to_float16(x); }, 8, Precision::Float32);
}

TEST(BatchAttention, BitwiseOneCallSeparateCallsAndAnyThreadCount) {
  const PagedBatch b = make_batch(kQoLens, kKvLens, 16, 8, 2, 32, 32, PageLayout::NHD, 6);
  BatchAttentionOptions o;
  o.causal = true;
  const int threads = num_threads();
  const auto whole = run_batch<float>(b, b.k_pool.view(), b.v_pool.view(), o);
  for (int t : {1, 2, 3, 8}) {
    set_num_threads(t);
    const auto again = run_batch<float>(b, b.k_pool.view(), b.v_pool.view(), o);
    EXPECT_EQ(std::memcmp(whole.out.data(), again.out.data(), sizeof(float) * whole.out.numel()), 0) << t << " threads";
    EXPECT_EQ(std::memcmp(whole.lse.data(), again.lse.data(), sizeof(float) * whole.lse.numel()), 0) << t << " threads";
  }
  set_num_threads(threads);
  // Each request alone: the same bits as in the batch.
  for (int64_t r = 0; r < static_cast<int64_t>(kQoLens.size()); ++r) {
    const Tensor<int32_t> qo({2}, {0, static_cast<int32_t>(kQoLens[r])});
    const Tensor<int32_t> kv({2}, {0, b.kv_indptr[r + 1] - b.kv_indptr[r]}), last({1}, {b.last_page_len[r]});
    const TensorView<const int32_t> indices(b.kv_indices.data() + b.kv_indptr[r], {kv[1]});
    const TensorView<const float> q(b.q.data() + b.qo_indptr[r] * 8 * 32, {kQoLens[r], 8, 32});
    const auto alone = batch_attention<float>(q, qo.view(), b.k_pool.view(), b.v_pool.view(), kv.view(), indices,
                                              last.view(), o, PageLayout::NHD, true);
    EXPECT_EQ(std::memcmp(alone.out.data(), whole.out.data() + b.qo_indptr[r] * 8 * 32,
                          sizeof(float) * alone.out.numel()), 0) << "request " << r;
  }
}

TEST(BatchAttention, NonContiguousViews) {
  const PagedBatch b = make_batch(kQoLens, kKvLens, 16, 4, 2, 16, 16, PageLayout::NHD, 7);
  const auto want = run_batch<float>(b, b.k_pool.view(), b.v_pool.view(), {});
  // q and the pools with every other element: the same values at stride 2.
  const auto spread = [](const Tensor<float>& t) {
    Shape s = t.shape();
    s.back() *= 2;
    Tensor<float> wide(s);
    for (int64_t i = 0; i < t.numel(); ++i) wide[2 * i] = t[i];
    return wide;
  };
  const Tensor<float> q2 = spread(b.q), k2 = spread(b.k_pool), v2 = spread(b.v_pool);
  const auto strided = [](const Tensor<float>& wide, const Shape& shape) {
    Strides st = contiguous_strides(shape);
    for (auto& x : st) x *= 2;
    return TensorView<const float>(wide.data(), shape, st);
  };
  Tensor<float> out_wide({want.out.numel() * 2});
  const Shape out_shape = want.out.shape();
  Strides out_strides = contiguous_strides(out_shape);
  for (auto& x : out_strides) x *= 2;
  const BatchAttentionPlan plan(b.qo_indptr.view(), b.kv_indptr.view(), b.kv_indices.view(), b.last_page_len.view(),
                                4, 2, 16, 16);
  plan.run<float>(strided(q2, b.q.shape()), strided(k2, b.k_pool.shape()), strided(v2, b.v_pool.shape()),
                  TensorView<float>(out_wide.data(), out_shape, out_strides));
  for (int64_t i = 0; i < want.out.numel(); ++i) ASSERT_EQ(out_wide[2 * i], want.out[i]) << i;
}

// Request r's rows of a pool (keys or values; int4's key groups: pages of
// page_size / 32 rows) copied side by side: (num_kv_heads, rows, width).
template <class KV>
Tensor<KV> request_rows(const PagedBatch& b, const Tensor<KV>& pool, int64_t r, int64_t page_rows, int64_t rows) {
  const int64_t width = pool.dim(3);
  Tensor<KV> out({b.hkv, rows, width});
  for (int64_t h = 0; h < b.hkv; ++h)
    for (int64_t j = 0; j < rows; ++j) std::copy_n(pool_row(b, pool, r, h, j, page_rows), width, &out.at({h, j, 0}));
  return out;
}

// Prefill requests read their pages in place, through the same tiles as
// attention() over one array holding each request's keys and values: the
// same bits, out and lse, in every storage type, precision and layout, over
// pages that split the kernel's key tiles anywhere (5 tokens), or hold
// whole ones, or none (1 token).
TEST(BatchAttention, PrefillOverPagesIsAttentionOverTheRequestsArrays) {
  const std::vector<int64_t> qo = {40, 1, 100, 33, 50}, kv = {300, 700, 700, 33, 0};
  const auto check = [&](const PagedBatch& b, auto k_pool, auto v_pool, int64_t k_page_rows, Precision precision,
                         const std::string& what) {
    using KV = std::remove_cvref_t<decltype(*k_pool.data())>;
    BatchAttentionOptions o;
    o.causal = true, o.precision = precision;
    const auto got = run_batch<KV>(b, k_pool.view(), v_pool.view(), o);
    AttentionOptions a = as_attention_options(o);
    a.precision = precision;
    for (int64_t r = 0; r < static_cast<int64_t>(qo.size()); ++r) {
      if (qo[r] == 1) continue;  // the decode kernel's (the tests above)
      const int64_t k_rows = k_page_rows == b.page_size ? kv[r] : (kv[r] + kInt4Group - 1) / kInt4Group;
      const Tensor<KV> k = request_rows(b, k_pool, r, k_page_rows, k_rows);
      const Tensor<KV> v = request_rows(b, v_pool, r, b.page_size, kv[r]);
      const int64_t begin = b.qo_indptr[r];
      const TensorView<const float> q(b.q.data() + begin * b.hq * b.d, {b.hq, qo[r], b.d}, {b.d, b.hq * b.d, 1});
      Tensor<float> out({b.hq, qo[r], b.d_v}), lse({b.hq, qo[r]});
      AttentionExtras<float> extras;
      extras.lse = lse.view();
      AttentionPlan<float, KV>(q, k.view(), v.view(), a).run(out.view(), extras);
      for (int64_t h = 0; h < b.hq; ++h)
        for (int64_t i = 0; i < qo[r]; ++i) {
          ASSERT_EQ(std::memcmp(&got.out.at({begin + i, h, 0}), &out.at({h, i, 0}), sizeof(float) * b.d_v), 0)
              << what << ", request " << r << ", head " << h << ", row " << i;
          ASSERT_EQ(std::memcmp(&got.lse.at({begin + i, h}), &lse.at({h, i}), sizeof(float)), 0)
              << what << ", request " << r << ", head " << h << ", row " << i;
        }
    }
  };
  for (const PageLayout layout : {PageLayout::NHD, PageLayout::HND})
    for (const Precision precision : {Precision::Float32, Precision::BF16, Precision::Int8}) {
      const std::string at = page_layout_name(layout) + " " + precision_name(precision);
      for (const int64_t page_size : {1, 5, 64}) {
        const PagedBatch b = make_batch(qo, kv, page_size, 8, 2, 64, 96, layout, 8);
        const std::string what = at + ", pages of " + std::to_string(page_size);
        check(b, b.k_pool, b.v_pool, page_size, precision, what + ", f32");
        check(b, to_bfloat16(b.k_pool.view()), to_bfloat16(b.v_pool.view()), page_size, precision, what + ", bf16");
        check(b, to_float16(b.k_pool.view()), to_float16(b.v_pool.view()), page_size, precision, what + ", f16");
        check(b, quantize_q8_0(b.k_pool.view()), quantize_q8_0(b.v_pool.view()), page_size, precision,
              what + ", q8_0");
        check(b, quantize_q4_0(b.k_pool.view()), quantize_q4_0(b.v_pool.view()), page_size, precision,
              what + ", q4_0");
      }
      const PagedBatch b = make_batch(qo, kv, 32, 8, 2, 64, 64, layout, 9);
      const Int4Pools p = int4_pools(b);
      check(b, p.k, p.v, 1, precision, at + ", pages of 32, int4");
    }
}

TEST(BatchAttention, BadMetadataIsNamed) {
  const PagedBatch b = make_batch({1, 2}, {5, 20}, 16, 2, 1, 8, 8, PageLayout::NHD, 8);
  const auto run = [&](std::vector<int32_t> qo, std::vector<int32_t> kv, std::vector<int32_t> idx,
                       std::vector<int32_t> last) {
    const auto v = [](std::vector<int32_t>& x) { return TensorView<const int32_t>(x.data(), {static_cast<int64_t>(x.size())}); };
    batch_attention<float>(b.q.view(), v(qo), b.k_pool.view(), b.v_pool.view(), v(kv), v(idx), v(last));
  };
  const std::vector<int32_t> idx = {b.kv_indices[0], b.kv_indices[1], b.kv_indices[2]};
  EXPECT_NO_THROW(run({0, 1, 3}, {0, 1, 3}, idx, {5, 4}));
  EXPECT_THROW_MSG(run({0, 1, 3}, {0, 1, 3}, {idx[0], idx[1], 99}, {5, 4}), ValueError,
                   "kv_indices must be below num_pages = 6, got page 99");
  EXPECT_THROW_MSG(run({0, 1, 3}, {0, 1, 3}, {idx[0], -1, idx[2]}, {5, 4}), ValueError,
                   "kv_indices must be page numbers >= 0, got -1 at 1");
  EXPECT_THROW_MSG(run({0, 1, 3}, {0, 2, 1}, idx, {5, 4}), ValueError, "kv_indptr must not decrease");
  EXPECT_THROW_MSG(run({0, 1, 3}, {0, 1, 2}, idx, {5, 4}), ValueError, "kv_indptr must end at kv_indices' length 3");
  EXPECT_THROW_MSG(run({0, 1, 3}, {0, 1, 3}, idx, {0, 4}), ValueError, "kv_last_page_len[0] must be in [1, page_size = 16]");
  EXPECT_THROW_MSG(run({0, 1, 3}, {0, 1, 3}, idx, {5, 17}), ValueError, "kv_last_page_len[1] must be in [1, page_size = 16]");
  EXPECT_THROW_MSG(run({0, 1, 3}, {0, 1, 3}, idx, {5}), ValueError, "kv_last_page_len must have one entry per request (2)");
  EXPECT_THROW_MSG(run({1, 1, 3}, {0, 1, 3}, idx, {5, 4}), ValueError, "qo_indptr[0] must be 0, got 1");
  EXPECT_THROW_MSG(run({0, 2, 1}, {0, 1, 3}, idx, {5, 4}), ValueError, "qo_indptr must not decrease");
  EXPECT_THROW_MSG(run({0, 1, 3, 3}, {0, 1, 3}, idx, {5, 4}), ValueError,
                   "kv_indptr must have 4 entries (batch + 1, as qo_indptr), got 3");
  EXPECT_THROW_MSG(run({0, 1, 4}, {0, 1, 3}, idx, {5, 4}), ValueError,
                   "q must be (nnz_q, num_qo_heads, head_dim) (4, 2, 8), got (3, 2, 8)");
  EXPECT_THROW_MSG(run({0, 1, 3}, {0, 0, 3}, idx, {5, 4}), ValueError,
                   "kv_last_page_len[0] must be 0 for a request with no page, got 5");
}

}  // namespace
}  // namespace attn

namespace attn {
namespace {

// Tokens (n, heads, d) whose every value names the token: value = base + t.
Tensor<float> tokens(int64_t n, int64_t heads, int64_t d, float base) {
  Tensor<float> t({n, heads, d});
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = base + static_cast<float>(i / (heads * d));
  return t;
}

void append_one(PagedKVCache& c, int64_t seq, int64_t n, float base) {
  const Tensor<float> k = tokens(n, c.kv_heads(), c.head_dim(), base), v = tokens(n, c.kv_heads(), c.value_head_dim(), -base);
  const Tensor<int64_t> indptr({2}, {0, n});
  c.append({seq}, k.view(), v.view(), indptr.view());
}

// Key token j of seq as stored (its first value).
float key_of(const PagedKVCache& c, int64_t seq, int64_t j) {
  const auto pages = c.pages_of(seq);
  return c.k_pages().at({pages[static_cast<size_t>(j / c.page_size())], j % c.page_size(), 0, 0});
}

TEST(PagedKVCache, ForkSharesPagesAndCopiesThePartialLastOnWrite) {
  PagedKVCache c(8, 4, 2, 3);
  const int64_t a = c.add_sequence();
  append_one(c, a, 6, 100);  // pages: one full, one with 2 of 4
  EXPECT_EQ(c.pages_in_use(), 2);
  const int64_t b = c.fork(a);
  EXPECT_EQ(c.pages_in_use(), 2) << "a fork adds no page until it appends";
  EXPECT_EQ(c.length(b), 6);
  EXPECT_EQ(c.positions(b), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  append_one(c, b, 1, 200);
  EXPECT_EQ(c.pages_in_use(), 3) << "its first append copies the shared partial page, one page";
  EXPECT_EQ(c.pages_of(a)[0], c.pages_of(b)[0]);
  EXPECT_NE(c.pages_of(a)[1], c.pages_of(b)[1]);
  for (int64_t j = 0; j < 6; ++j) EXPECT_EQ(key_of(c, b, j), 100 + j);
  EXPECT_EQ(key_of(c, b, 6), 200);
  append_one(c, a, 1, 300);  // a's partial page is its own again: written in place
  EXPECT_EQ(c.pages_in_use(), 3);
  EXPECT_EQ(key_of(c, a, 6), 300);
  EXPECT_EQ(key_of(c, b, 6), 200);
  c.truncate(a, 3);
  EXPECT_EQ(c.positions(a), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(c.pages_in_use(), 2) << "a's second page went back to the pool";
  append_one(c, a, 1, 400);  // into the first page, shared with b: copied
  EXPECT_EQ(key_of(c, b, 3), 103);
  EXPECT_EQ(key_of(c, a, 3), 400);
  c.remove(b);
  EXPECT_EQ(c.pages_in_use(), 1);
  EXPECT_EQ(c.nbytes(), 1 * 4 * 2 * (3 + 3) * 4);
  EXPECT_THROW_MSG(c.length(b), KeyError, "no sequence 1");
}

TEST(PagedKVCache, RefusedCallsLeaveTheCacheAsItWas) {
  PagedKVCache c(3, 4, 1, 32, {}, KVDtype::Q8_0);
  const int64_t a = c.add_sequence(), b = c.add_sequence();
  append_one(c, a, 5, 1);
  const auto before = [&] { return std::make_tuple(c.pages_of(a), c.pages_of(b), c.length(a), c.length(b), c.k_bytes(), c.free_pages()); };
  const auto state = before();
  const Tensor<float> k = tokens(8, 1, 32, 0), v = tokens(8, 1, 32, 0);
  const Tensor<int64_t> indptr({3}, {0, 4, 8});
  EXPECT_THROW_MSG(c.append({a, b}, k.view(), v.view(), indptr.view()), RuntimeError, "needs 2 pages, 1 free (of 3)");
  EXPECT_EQ(before(), state);
  Tensor<float> bad = tokens(2, 1, 32, 0);
  bad[40] = std::numeric_limits<float>::infinity();
  const Tensor<int64_t> two({2}, {0, 2});
  EXPECT_THROW_MSG(c.append({b}, bad.view(), tokens(2, 1, 32, 0).view(), two.view()), ValueError, "q8_0");
  EXPECT_EQ(before(), state);
  EXPECT_THROW_MSG(c.append({a, a}, k.view(), v.view(), indptr.view()), ValueError, "seq_ids must be distinct");
  EXPECT_THROW_MSG(c.append({a, 7}, k.view(), v.view(), indptr.view()), KeyError, "no sequence 7");
  const Tensor<int64_t> short_indptr({3}, {0, 4, 7});
  EXPECT_THROW_MSG(c.append({a, b}, k.view(), v.view(), short_indptr.view()), ValueError, "append_indptr must end at k's length 8");
  EXPECT_THROW_MSG(c.truncate(a, 6), ValueError, "length must be in [0, 5]");
  EXPECT_EQ(before(), state);
  EXPECT_THROW_MSG(c.k_pages(), TypeError, "this cache stores q8_0");
}

TEST(PagedKVCache, AWriterOverlappingAnyCallIsARuntimeError) {
  // A reader that spends its time inside the cache: batch attention over a
  // long sequence (a plan's run holds the cache as a reader).
  PagedKVCache c(1200, 16, 1, 64);
  const int64_t a = c.add_sequence();
  append_one(c, a, 16000, 0);
  const Tensor<float> q({8, 1, 64});
  const Tensor<int32_t> qo({2}, {0, 8});
  const PageTable t = c.page_table({a});
  const BatchAttentionPlan plan(qo.view(), t.kv_indptr.view(), t.kv_indices.view(), t.kv_last_page_len.view(), 1, 1, 64, 16);
  std::atomic<bool> inside{false}, done{false};
  std::thread reader([&] {
    while (!done) {
      Tensor<float> out({8, 1, 64});
      try {
        c.run(plan, q.view(), out.view());
      } catch (const RuntimeError&) {  // it met the writer: refused, as the contract says
      }
      inside = true;
    }
  });
  while (!inside) std::this_thread::yield();
  // Writers until one is refused (a deadline, not a count: a loaded machine
  // may leave the reader's thread unscheduled for a while).
  int refused = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (refused == 0 && std::chrono::steady_clock::now() < deadline) {
    try {
      append_one(c, a, 1, 0);
      c.truncate(a, 16000);
    } catch (const RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find("PagedKVCache is in use by another thread"), std::string::npos);
      ++refused;
    }
  }
  done = true;
  reader.join();
  EXPECT_GT(refused, 0) << "30 s of writes beside a reader that never stops: none overlapped";
  EXPECT_TRUE(c.length(a) == 16000 || c.length(a) == 16001);
  // Readers alone: any number at once.
  std::vector<std::thread> readers;
  std::atomic<int> failures{0};
  for (int r = 0; r < 4; ++r)
    readers.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        try {
          (void)c.length(a), (void)c.page_table({a});
        } catch (const Error&) {
          ++failures;
        }
      }
    });
  for (auto& r : readers) r.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(PagedKVCache, BatchAttentionOverTheCacheIsTheRawFormOverItsPages) {
  std::mt19937 rng(9);
  PagedKVCache c(64, 16, 2, 32, 16, KVDtype::BF16, PageLayout::HND);
  std::vector<int64_t> ids;
  const std::vector<int64_t> lengths = {40, 1, 0, 33};
  for (int64_t n : lengths) {
    ids.push_back(c.add_sequence());
    const Tensor<float> k = test::cast<float>(random_tensor({n, 2, 32}, rng)), v = test::cast<float>(random_tensor({n, 2, 16}, rng));
    const Tensor<int64_t> indptr({2}, {0, n});
    c.append({ids.back()}, k.view(), v.view(), indptr.view());
  }
  const int64_t child = c.fork(ids[0]);
  ids.push_back(child);
  const Tensor<float> q = test::cast<float>(random_tensor({1 + 1 + 0 + 9 + 2, 4, 32}, rng));
  const Tensor<int32_t> qo({6}, {0, 1, 2, 2, 11, 13});
  BatchAttentionOptions o;
  o.causal = true;
  const auto got = batch_attention(q.view(), qo.view(), c, ids, o, true);
  // The raw form over the same pages: the pools as bf16, the cache's table.
  const PageTable t = c.page_table(ids);
  Tensor<bfloat16> k_pool, v_pool;
  {
    const auto kb = c.k_bytes(), vb = c.v_bytes();
    k_pool = Tensor<bfloat16>({64, 2, 16, 32});
    v_pool = Tensor<bfloat16>({64, 2, 16, 16});
    std::memcpy(static_cast<void*>(k_pool.data()), kb.data(), kb.size());
    std::memcpy(static_cast<void*>(v_pool.data()), vb.data(), vb.size());
  }
  const auto raw = batch_attention<bfloat16>(q.view(), qo.view(), k_pool.view(), v_pool.view(), t.kv_indptr.view(),
                                             t.kv_indices.view(), t.kv_last_page_len.view(), o, PageLayout::HND, true);
  EXPECT_EQ(std::memcmp(got.out.data(), raw.out.data(), sizeof(float) * raw.out.numel()), 0);
  EXPECT_EQ(t.kv_last_page_len[2], 0);  // the empty sequence
  EXPECT_EQ(t.kv_indptr[3] - t.kv_indptr[2], 0);
  EXPECT_EQ(t.kv_last_page_len[0], 8);  // 40 = 16 + 16 + 8
}

TEST(PagedKVCache, ACopySharesNothing) {
  PagedKVCache c(4, 2, 1, 2);
  const int64_t a = c.add_sequence();
  append_one(c, a, 3, 10);
  PagedKVCache copy = c;
  append_one(copy, a, 1, 20);
  copy.remove(a);
  EXPECT_EQ(c.length(a), 3);
  EXPECT_EQ(key_of(c, a, 2), 12);
  EXPECT_EQ(c.pages_in_use(), 2);
  // restore: what a pickle holds.
  PagedKVCache back(4, 2, 1, 2);
  back.restore(c.k_bytes(), c.v_bytes(), c.sequences_state());
  EXPECT_EQ(back.pages_of(a), c.pages_of(a));
  EXPECT_EQ(back.free_pages(), 2);
  EXPECT_EQ(back.add_sequence(), a + 1);
}

// An int4 cache against a model of what its sequences hold: their float32
// keys and values (a truncation into a full group keeps that group's keys
// as its blocks held them, the float32 keys gone).
class Int4Model {
 public:
  explicit Int4Model(const PagedKVCache& c) : c_(c), H_(c.kv_heads()), d_(c.head_dim()), dv_(c.value_head_dim()) {}

  void append(const std::vector<int64_t>& ids, const std::vector<int64_t>& counts, std::mt19937& rng) {
    std::vector<int64_t> indptr = {0};
    for (int64_t n : counts) indptr.push_back(indptr.back() + n);
    const Tensor<float> k = test::cast<float>(random_tensor({indptr.back(), H_, d_}, rng, -2, 2));
    const Tensor<float> v = test::cast<float>(random_tensor({indptr.back(), H_, dv_}, rng));
    Tensor<int64_t> at({static_cast<int64_t>(indptr.size())});
    std::copy(indptr.begin(), indptr.end(), at.data());
    const_cast<PagedKVCache&>(c_).append(ids, k.view(), v.view(), at.view());
    for (size_t i = 0; i < ids.size(); ++i) {
      auto& [keys, values] = held_[ids[i]];
      keys.insert(keys.end(), k.data() + indptr[i] * H_ * d_, k.data() + indptr[i + 1] * H_ * d_);
      values.insert(values.end(), v.data() + indptr[i] * H_ * dv_, v.data() + indptr[i + 1] * H_ * dv_);
    }
  }
  void fork(int64_t parent, int64_t child) { held_[child] = held_[parent]; }
  void truncate(int64_t id, int64_t length) {
    auto& [keys, values] = held_[id];
    const int64_t group = length / kInt4Group * kInt4Group, n = length_of(id);
    if (length % kInt4Group != 0 && group + kInt4Group <= n) {  // into a full group: its values as held
      const Tensor<float> held = dequantize_int4_keys(want_keys(id).view(), n);
      for (int64_t t = group; t < length; ++t)
        for (int64_t h = 0; h < H_; ++h)
          for (int64_t c = 0; c < d_; ++c) keys[static_cast<size_t>((t * H_ + h) * d_ + c)] = held.at({h, t, c});
    }
    keys.resize(static_cast<size_t>(length * H_ * d_));
    values.resize(static_cast<size_t>(length * H_ * dv_));
  }
  int64_t length_of(int64_t id) const { return static_cast<int64_t>(held_.at(id).first.size()) / (H_ * d_); }
  // (heads, n, ·) float32 of a sequence's keys or values.
  Tensor<float> heads_first(int64_t id, bool keys) const {
    const std::vector<float>& x = keys ? held_.at(id).first : held_.at(id).second;
    const int64_t w = keys ? d_ : dv_, n = length_of(id);
    Tensor<float> out({H_, n, w});
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < H_; ++h) std::copy_n(x.data() + (t * H_ + h) * w, w, &out.at({h, t, 0}));
    return out;
  }
  Tensor<block_int4> want_keys(int64_t id) const { return quantize_int4_keys(heads_first(id, true).view()); }

  // The cache's blocks and tails of every sequence, bitwise, against the model's.
  void check(const std::string& what) const {
    const std::vector<uint8_t> kb = c_.k_bytes(), vb = c_.v_bytes();
    const auto* k_pool = reinterpret_cast<const block_int4*>(kb.data());
    const auto* v_pool = reinterpret_cast<const block_int4*>(vb.data());
    const int64_t P = c_.page_size(), G = P / kInt4Group, rows_v = dv_ / kInt4Group;
    const bool nhd = c_.layout() == PageLayout::NHD;
    const PagedKVCache::Sequences st = c_.sequences_state();
    int64_t tails = 0;
    for (size_t i = 0; i < st.ids.size(); ++i) {
      const int64_t id = st.ids[i], n = length_of(id);
      ASSERT_EQ(st.lengths[i], n) << what;
      const auto pages = c_.pages_of(id);
      const Tensor<block_int4> keys = want_keys(id), values = quantize_int4_values(heads_first(id, false).view());
      for (int64_t h = 0; h < H_; ++h) {
        for (int64_t g = 0; g < keys.dim(1); ++g) {
          const int64_t page = pages[static_cast<size_t>(g * kInt4Group / P)], slot = g % G;
          const block_int4* got = k_pool + ((nhd ? (page * G + slot) * H_ + h : (page * H_ + h) * G + slot) * d_);
          EXPECT_EQ(std::memcmp(got, &keys.at({h, g, 0}), sizeof(block_int4) * d_), 0)
              << what << ": sequence " << id << " head " << h << " key group " << g;
        }
        for (int64_t t = 0; t < n; ++t) {
          const int64_t page = pages[static_cast<size_t>(t / P)], slot = t % P;
          const block_int4* got = v_pool + ((nhd ? (page * P + slot) * H_ + h : (page * H_ + h) * P + slot) * rows_v);
          EXPECT_EQ(std::memcmp(got, &values.at({h, t, 0}), sizeof(block_int4) * rows_v), 0)
              << what << ": sequence " << id << " head " << h << " value row " << t;
        }
      }
      const auto& keys_held = held_.at(id).first;
      const std::vector<float> tail(keys_held.end() - n % kInt4Group * H_ * d_, keys_held.end());
      EXPECT_EQ(st.key_tails[i], tail) << what << ": sequence " << id << "'s key tail";
      tails += static_cast<int64_t>(tail.size() * sizeof(float));
    }
    const int64_t page_bytes = (G * d_ + P * rows_v) * H_ * static_cast<int64_t>(sizeof(block_int4));
    EXPECT_EQ(c_.nbytes(), c_.pages_in_use() * page_bytes + tails) << what;
  }

 private:
  const PagedKVCache& c_;
  int64_t H_, d_, dv_;
  std::map<int64_t, std::pair<std::vector<float>, std::vector<float>>> held_;  // (n, heads, ·) rows
};

TEST(PagedKVCache, Int4SequencesHoldQuantizeInt4KeysOfTheirKeys) {
  for (const PageLayout layout : {PageLayout::NHD, PageLayout::HND}) {
    std::mt19937 rng(21);
    PagedKVCache c(24, 64, 2, 32, 64, KVDtype::INT4, layout);
    Int4Model m(c);
    const std::string l = page_layout_name(layout) + ": ";
    const int64_t a = c.add_sequence(), b = c.add_sequence();
    m.append({a, b}, {5, 40}, rng);
    m.check(l + "first appends");
    m.append({a, b}, {30, 0}, rng);  // a's tail group fills and a new one starts
    m.check(l + "a across a group");
    const int64_t f = c.fork(a);  // 35 keys: its tail in the shared partial page
    m.fork(a, f);
    m.append({f}, {3}, rng);
    m.append({a}, {1}, rng);
    m.check(l + "fork, both appended");
    c.truncate(b, 36);  // inside its tail group: the tail's first 4 keys
    m.truncate(b, 36);
    m.check(l + "truncate inside the tail");
    c.truncate(a, 20);  // inside a full group, on a page shared with f: copied
    m.truncate(a, 20);
    m.check(l + "truncate inside a full group");
    m.append({a, f}, {50, 70}, rng);
    c.truncate(f, 64);  // to a group's end: no tail
    m.truncate(f, 64);
    m.check(l + "appends past pages, truncate to a group's end");

    // Attention over the cache: the float64 answer on the values it holds.
    const std::vector<int64_t> ids = {a, b, f}, qo = {1, 20, 3};
    std::vector<int32_t> qo_indptr = {0};
    for (int64_t n : qo) qo_indptr.push_back(static_cast<int32_t>(qo_indptr.back() + n));
    const Tensor<float> q = test::cast<float>(random_tensor({qo_indptr.back(), 4, 32}, rng));
    BatchAttentionOptions causal;
    causal.causal = true;
    const auto got = batch_attention(q.view(), TensorView<const int32_t>(qo_indptr.data(), {4}), c, ids, causal, true);
    for (size_t r = 0; r < ids.size(); ++r) {
      const int64_t n = m.length_of(ids[r]), n_q = qo[r];
      Tensor<double> qr({4, n_q, 32});
      for (int64_t h = 0; h < 4; ++h)
        for (int64_t i = 0; i < n_q; ++i)
          for (int64_t e = 0; e < 32; ++e) qr.at({h, i, e}) = q.at({qo_indptr[r] + i, h, e});
      const Tensor<float> k = dequantize_int4_keys(m.want_keys(ids[r]).view(), n);
      const Tensor<float> v = dequantize_int4_values(quantize_int4_values(m.heads_first(ids[r], false).view()).view());
      AttentionOptions bottom_right;
      bottom_right.causal = Causal::BottomRight;
      const auto want = test::forward(qr.view(), test::cast<double>(k).view(), test::cast<double>(v).view(),
                                      test::Returns{}, bottom_right);
      double err = 0;
      for (int64_t h = 0; h < 4; ++h)
        for (int64_t i = 0; i < n_q; ++i)
          for (int64_t e = 0; e < 64; ++e)
            err = std::max(err, std::abs(got.out.at({qo_indptr[r] + i, h, e}) - want.out.at({h, i, e})));
      EXPECT_LT(err, 2e-5) << l << "request " << r;
    }

    // restore: the pools, sequences and tails; without tails, the last
    // group's keys as its blocks hold them.
    PagedKVCache back(24, 64, 2, 32, 64, KVDtype::INT4, layout);
    back.restore(c.k_bytes(), c.v_bytes(), c.sequences_state());
    const auto again = batch_attention(q.view(), TensorView<const int32_t>(qo_indptr.data(), {4}), back, ids, causal);
    EXPECT_EQ(std::memcmp(again.out.data(), got.out.data(), sizeof(float) * got.out.numel()), 0) << l;
    EXPECT_EQ(back.sequences_state().key_tails, c.sequences_state().key_tails) << l;
    PagedKVCache::Sequences no_tails = c.sequences_state();
    no_tails.key_tails.clear();
    back.restore(c.k_bytes(), c.v_bytes(), no_tails);
    const std::vector<float> a_tail = back.sequences_state().key_tails[0];
    const Tensor<float> a_held = dequantize_int4_keys(m.want_keys(a).view(), m.length_of(a));
    const int64_t n_a = m.length_of(a);
    ASSERT_EQ(a_tail.size(), static_cast<size_t>(n_a % 32 * 2 * 32));
    for (int64_t t = 0; t < n_a % 32; ++t)
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t e = 0; e < 32; ++e)
          EXPECT_EQ(a_tail[static_cast<size_t>((t * 2 + h) * 32 + e)], a_held.at({h, n_a / 32 * 32 + t, e})) << l;
  }
}

TEST(PagedKVCache, Int4RefusesWhatItCannotHold) {
  EXPECT_THROW_MSG(PagedKVCache(4, 16, 1, 32, {}, KVDtype::INT4), ValueError,
                   "int4 cache's keys are quantized per channel over groups of 32 tokens, whole in a page: "
                   "page_size must be a multiple of 32, got 16");
  PagedKVCache c(3, 32, 2, 32, {}, KVDtype::INT4);
  const int64_t a = c.add_sequence();
  append_one(c, a, 40, 1);  // two pages
  const int64_t f = c.fork(a), g = c.add_sequence();
  append_one(c, g, 1, 9);  // the third
  const auto state = [&] {
    return std::make_tuple(c.pages_of(a), c.pages_of(f), c.pages_of(g), c.length(a), c.length(g), c.k_bytes(),
                           c.v_bytes(), c.sequences_state().key_tails);
  };
  const auto before = state();
  c.truncate(a, 40);  // its length: nothing to quantize again, no page to copy
  EXPECT_EQ(state(), before);
  EXPECT_THROW_MSG(c.truncate(a, 35), RuntimeError,
                   "sequence 0's int4 keys 32 .. 34 are quantized again on a page it shares, and no page is free");
  EXPECT_EQ(state(), before);
  Tensor<float> bad = tokens(3, 2, 32, 0);
  bad[32 + 7] = std::numeric_limits<float>::quiet_NaN();
  const Tensor<int64_t> three({2}, {0, 3});
  EXPECT_THROW_MSG(c.append({g}, bad.view(), tokens(3, 2, 32, 0).view(), three.view()), ValueError,
                   "(channel 7 of keys 0 .. 3) (sequence 2, head 1)");
  EXPECT_EQ(state(), before);
  const Tensor<float> q({1, 2, 32});
  const Tensor<int32_t> qo({2}, {0, 1});
  const Tensor<int32_t> indices({1, 2, 1});
  EXPECT_THROW_MSG(sparse_attention(q.view(), qo.view(), c, {a}, indices.view()), TypeError,
                   "sparse_attention reads keys token by token");
  EXPECT_THROW_MSG(c.k_pages(), TypeError, "this cache stores int4");
  PagedKVCache::Sequences st = c.sequences_state();
  st.key_tails[0].pop_back();
  EXPECT_THROW_MSG(c.restore(c.k_bytes(), c.v_bytes(), st), ValueError,
                   "sequence 0's key tail must hold (length % 32, kv_heads, head_dim) = 512 values, got 511");
  EXPECT_THROW_MSG(PagedKVCache(2, 32, 2, 32).restore(PagedKVCache(2, 32, 2, 32).k_bytes(),
                                                      PagedKVCache(2, 32, 2, 32).v_bytes(), c.sequences_state()),
                   ValueError, "key_tails are an int4 cache's; this one stores f32");
}

}  // namespace
}  // namespace attn

namespace attn {
namespace {

// Four sequences served through the layer over one paged cache, prompt in
// chunks then decoding, against each sequence through its own KVCache.
TEST(PagedKVCache, TheLayerServesRaggedBatchesAsEachSequenceAlone) {
  struct Case {
    bool rope, alibi, sinks;
    int64_t kv_heads;
    Gate gate = Gate::None;
  };
  for (const Case& cs : {Case{true, false, false, 2}, Case{false, true, true, 4}, Case{true, false, true, 1},
                         Case{true, false, false, 2, Gate::Headwise}, Case{false, false, true, 4, Gate::Elementwise}}) {
    MultiHeadAttentionConfig cfg;
    cfg.embed_dim = 32, cfg.num_heads = 4, cfg.num_kv_heads = cs.kv_heads;
    cfg.rope = cs.rope, cfg.alibi = cs.alibi, cfg.sinks = cs.sinks, cfg.gate = cs.gate;
    MultiHeadAttention<float> layer(cfg, 3);
    if (cs.sinks) layer.parameters()[8]->at({1}) = 1.5f;  // the sinks, after the weights and biases
    std::mt19937 rng(11);
    const std::vector<int64_t> prompt = {5, 19, 1, 12};
    std::vector<Tensor<float>> streams;
    for (int64_t n : prompt) streams.push_back(test::cast<float>(random_tensor({n + 3, 32}, rng)));
    PagedKVCache paged(64, 4, cs.kv_heads, 8);
    std::vector<int64_t> ids;
    std::vector<KVCache<float>> alone(prompt.size());
    for (size_t i = 0; i < prompt.size(); ++i) ids.push_back(paged.add_sequence());
    MhaForwardOptions<float> causal;
    causal.attention.causal = Causal::BottomRight;
    // Steps: the prompts (all at once), then three decode steps.
    std::vector<int64_t> done(prompt.size(), 0);
    for (int step = 0; step < 4; ++step) {
      std::vector<int64_t> cu = {0};
      std::vector<float> packed;
      for (size_t i = 0; i < prompt.size(); ++i) {
        const int64_t n = step == 0 ? prompt[i] : 1;
        packed.insert(packed.end(), streams[i].data() + done[i] * 32, streams[i].data() + (done[i] + n) * 32);
        cu.push_back(cu.back() + n);
      }
      Tensor<int64_t> cu_seqlens({static_cast<int64_t>(cu.size())});
      std::copy(cu.begin(), cu.end(), cu_seqlens.data());
      const TensorView<const float> x(packed.data(), {cu.back(), 32});
      const Tensor<float> got = layer.forward(x, paged, ids, cu_seqlens.view(), causal.attention);
      for (size_t i = 0; i < prompt.size(); ++i) {
        const int64_t n = cu[i + 1] - cu[i];
        causal.cache = &alone[i];
        const TensorView<const float> chunk(streams[i].data() + done[i] * 32, {n, 32});
        const auto want = layer.forward(chunk, {}, {}, causal);
        for (int64_t t = 0; t < n; ++t)
          for (int64_t e = 0; e < 32; ++e)
            ASSERT_NEAR(got.at({cu[i] + t, e}), want.out.at({t, e}), 2e-5)
                << "rope " << cs.rope << " alibi " << cs.alibi << " gate " << gate_name(cs.gate) << " step " << step
                << " sequence " << i;
        done[i] += n;
      }
    }
    for (size_t i = 0; i < prompt.size(); ++i) EXPECT_EQ(paged.length(ids[i]), prompt[i] + 3);
  }
}

TEST(PagedKVCache, TheLayerRefusesWhatItCannotServe) {
  MultiHeadAttentionConfig cfg;
  cfg.embed_dim = 16, cfg.num_heads = 2;
  const MultiHeadAttention<float> layer(cfg);
  PagedKVCache cache(2, 4, 2, 8);
  const int64_t a = cache.add_sequence();
  const Tensor<float> x({9, 16});
  const Tensor<int64_t> cu({2}, {0, 9});
  EXPECT_THROW_MSG(layer.forward(x.view(), cache, {a}, cu.view()), RuntimeError, "needs 3 pages, 2 free");
  EXPECT_EQ(cache.length(a), 0);
  AttentionOptions top_left;
  top_left.causal = Causal::TopLeft;
  const Tensor<int64_t> cu4({2}, {0, 4});
  const Tensor<float> x4({4, 16});
  EXPECT_THROW_MSG(layer.forward(x4.view(), cache, {a}, cu4.view(), top_left), ValueError, "causal is bottom-right");
  EXPECT_THROW_MSG(layer.forward(x4.view(), cache, {a + 1}, cu4.view()), KeyError, "no sequence 1");
  const Tensor<float> wide({4, 8});
  EXPECT_THROW_MSG(layer.forward(wide.view(), cache, {a}, cu4.view()), ValueError, "(total, embed_dim) = (total, 16)");
  EXPECT_EQ(cache.length(a), 0);
}

}  // namespace
}  // namespace attn
