// batch_attention's raw form on fuzzed page-table metadata: qo_indptr,
// kv_indptr, kv_indices and kv_last_page_len of any values (out of range,
// negative, decreasing, lengths that disagree), page sizes and layouts, the
// masks (dense and packed, of any length) and the options. Every call either
// refuses with attn::Error or writes its output, which then matches the
// float64 reference per request on the pages gathered.
#include <random>

#include "fuzz_input.hpp"

using namespace attn;

namespace {

std::vector<int32_t> ints(fuzz::Input& in, int64_t n, int64_t lo, int64_t hi) {
  std::vector<int32_t> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(static_cast<int32_t>(in.in(lo, hi)));
  return v;
}

TensorView<const int32_t> view(const std::vector<int32_t>& v) {
  return TensorView<const int32_t>(v.data(), {static_cast<int64_t>(v.size())});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const int64_t batch = in.in(0, 4), page_size = in.in(1, 4), num_pages = in.in(0, 6);
  const int64_t hkv = in.in(1, 2), hq = hkv * in.in(1, 2), d = in.in(1, 5), dv = in.in(1, 4);
  const PageLayout layout = in.flag() ? PageLayout::NHD : PageLayout::HND;
  // Well-formed metadata, then now and then one entry changed.
  std::vector<int32_t> qo{0}, kv{0}, indices, last;
  for (int64_t r = 0; r < batch; ++r) {
    qo.push_back(qo.back() + static_cast<int32_t>(in.in(0, 9)));
    const int64_t pages = in.in(0, 3);
    for (int64_t p = 0; p < pages; ++p) indices.push_back(static_cast<int32_t>(in.in(0, std::max<int64_t>(num_pages - 1, 0))));
    kv.push_back(static_cast<int32_t>(indices.size()));
    last.push_back(static_cast<int32_t>(pages == 0 ? 0 : in.in(1, page_size)));
  }
  std::vector<int32_t>* arrays[] = {&qo, &kv, &indices, &last};
  for (int i = 0; i < 2; ++i) {
    const uint8_t change = in.byte();
    if (change < 40) {
      auto& a = *arrays[change % 4];
      if (!a.empty()) a[static_cast<size_t>(in.in(0, static_cast<int64_t>(a.size()) - 1))] = static_cast<int32_t>(in.in(0, 20)) - 3;
    } else if (change < 48) {
      arrays[change % 4]->push_back(static_cast<int32_t>(in.in(0, 9)));
    } else if (change < 56 && !arrays[change % 4]->empty()) {
      arrays[change % 4]->pop_back();
    }
  }
  BatchAttentionOptions o;
  o.causal = in.flag();
  if (in.byte() < 64) o.window = {in.in(0, 6) - 1, in.in(0, 6) - 1};
  if (in.byte() < 64) o.sinks.assign(static_cast<size_t>(hq), double(in.in(0, 4)) - 2);
  if (in.byte() < 32) o.softcap = double(in.in(1, 5));
  std::vector<char> dense;
  std::vector<uint8_t> packed;
  std::vector<int32_t> mask_indptr;
  const uint8_t mask_kind = in.byte();
  if (mask_kind < 48) {
    dense.resize(static_cast<size_t>(in.in(0, 120)));
    for (char& c : dense) c = in.flag();
    o.custom_mask = TensorView<const bool>(reinterpret_cast<const bool*>(dense.data()), {static_cast<int64_t>(dense.size())});
  } else if (mask_kind < 96) {
    packed = std::vector<uint8_t>(static_cast<size_t>(in.in(0, 20)));
    for (uint8_t& b : packed) b = in.byte();
    mask_indptr = ints(in, batch + 1 - in.in(0, 1), 0, 20);
    std::sort(mask_indptr.begin(), mask_indptr.end());
    o.packed_custom_mask = TensorView<const uint8_t>(packed.data(), {static_cast<int64_t>(packed.size())});
    o.mask_indptr = view(mask_indptr);
  }
  std::mt19937 rng(in.u32());
  std::uniform_real_distribution<float> u(-1, 1);
  const auto pool = [&](int64_t cols) {
    Tensor<float> t(layout == PageLayout::NHD ? Shape{num_pages, page_size, hkv, cols} : Shape{num_pages, hkv, page_size, cols});
    for (int64_t i = 0; i < t.numel(); ++i) t[i] = u(rng);
    return t;
  };
  const Tensor<float> k = pool(d), v = pool(dv);
  const int64_t nnz = qo.empty() ? 0 : std::max<int32_t>(qo.back(), 0);
  Tensor<float> q({nnz, hq, d});
  for (int64_t i = 0; i < q.numel(); ++i) q[i] = u(rng);

  std::optional<BatchAttentionPlan> plan;
  if (!fuzz::accepted([&] {
        plan.emplace(view(qo), view(kv), view(indices), view(last), hq, hkv, d, page_size, o, dv, layout);
      }))
    return 0;
  Tensor<float> out(plan->output_shape()), lse(plan->lse_shape());
  if (!fuzz::accepted([&] { plan->run<float>(q.view(), k.view(), v.view(), out.view(), lse.view()); })) return 0;
  // Accepted: each request against attention() in float64 on its pages gathered.
  int64_t mask_at = 0;
  for (int64_t r = 0; r < plan->batch_size(); ++r) {
    const int64_t n_q = plan->qo_len(r), n_k = plan->kv_len(r);
    Tensor<double> qd({hq, n_q, d}), kd({hkv, n_k, d}), vd({hkv, n_k, dv});
    for (int64_t h = 0; h < hq; ++h)
      for (int64_t i = 0; i < n_q; ++i)
        for (int64_t c = 0; c < d; ++c) qd.at({h, i, c}) = q.at({qo[r] + i, h, c});
    for (int64_t h = 0; h < hkv; ++h)
      for (int64_t j = 0; j < n_k; ++j) {
        const int64_t page = indices[static_cast<size_t>(kv[r] + j / page_size)], slot = j % page_size;
        for (int64_t c = 0; c < d; ++c)
          kd.at({h, j, c}) = layout == PageLayout::NHD ? k.at({page, slot, h, c}) : k.at({page, h, slot, c});
        for (int64_t c = 0; c < dv; ++c)
          vd.at({h, j, c}) = layout == PageLayout::NHD ? v.at({page, slot, h, c}) : v.at({page, h, slot, c});
      }
    Tensor<bool> mask({n_q, n_k});
    for (int64_t e = 0; e < n_q * n_k; ++e)
      mask[e] = !dense.empty() || mask_kind < 48 ? bool(dense[static_cast<size_t>(mask_at + e)])
                : mask_kind < 96 ? bool((packed[static_cast<size_t>(mask_indptr[r] + e / 8)] >> (e % 8)) & 1)
                                 : true;
    mask_at += n_q * n_k;
    AttentionOptions a;
    a.causal = o.causal ? Causal::BottomRight : Causal::None;
    a.window = o.window, a.softcap = o.softcap, a.sinks = o.sinks;
    const Tensor<double> want = attention(qd.view(), kd.view(), vd.view(), a, TensorView<const bool>(mask.view()));
    for (int64_t h = 0; h < hq; ++h)
      for (int64_t i = 0; i < n_q; ++i)
        for (int64_t c = 0; c < dv; ++c)
          if (!(std::abs(out.at({qo[r] + i, h, c}) - want.at({h, i, c})) <= 1e-4))
            fuzz::finding("request " + std::to_string(r) + ": output differs from the float64 reference");
  }
  return 0;
}
