// attn._core's serving: PagedKVCache, batch_attention and
// BatchAttentionPlan over pages (FlashInfer's metadata), and merge_state,
// merge_state_in_place and merge_states (its layouts: v (n, H, D), s (n,
// H)).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <variant>

#include "args.hpp"
#include "arrays.hpp"
#include "attn/batch_attention.hpp"
#include "attn/cascade.hpp"
#include "attn/paged_kv_cache.hpp"
#include "bindings.hpp"
#include "docstrings.hpp"
#include "quantized.hpp"

namespace attn::python {
namespace {

template <class T>
py::tuple merged(MergedState<T>&& m) {
  return py::make_tuple(to_numpy(std::move(m.v)), to_numpy(std::move(m.s)));
}

// float64 when every array is float64, else float32 (the others converted).
bool all_float64(std::initializer_list<py::array> arrays) {
  for (const py::array& a : arrays)
    if (!is_float64(a)) return false;
  return true;
}

template <class T>
py::tuple merge_state_t(const py::array& v_a, const py::array& s_a, const py::array& v_b, const py::array& s_b) {
  auto va = as<T>(v_a), sa = as<T>(s_a), vb = as<T>(v_b), sb = as<T>(s_b);
  const auto views = std::make_tuple(view_of<const T>(va), view_of<const T>(sa), view_of<const T>(vb),
                                     view_of<const T>(sb));
  MergedState<T> m;
  {
    py::gil_scoped_release nogil;
    m = std::apply([](auto... v) { return merge_state<T>(v...); }, views);
  }
  return merged(std::move(m));
}

py::tuple py_merge_state(const py::object& v_a, const py::object& s_a, const py::object& v_b, const py::object& s_b) {
  const py::array a[] = {as_numeric_array(v_a, "v_a"), as_numeric_array(s_a, "s_a"), as_numeric_array(v_b, "v_b"),
                         as_numeric_array(s_b, "s_b")};
  return all_float64({a[0], a[1], a[2], a[3]}) ? merge_state_t<double>(a[0], a[1], a[2], a[3])
                                                : merge_state_t<float>(a[0], a[1], a[2], a[3]);
}

py::tuple py_merge_states(const py::object& vs_obj, const py::object& ss_obj) {
  const py::array vs = as_numeric_array(vs_obj, "vs"), ss = as_numeric_array(ss_obj, "ss");
  const auto run = [&](auto zero) {
    using T = decltype(zero);
    auto v = as<T>(vs), s = as<T>(ss);
    const auto vv = view_of<const T>(v);
    const auto sv = view_of<const T>(s);
    MergedState<T> m;
    {
      py::gil_scoped_release nogil;
      m = merge_states<T>(vv, sv);
    }
    return merged(std::move(m));
  };
  return all_float64({vs, ss}) ? run(0.0) : run(0.0f);
}

// v and s are written in place: writable float32 or float64 arrays, both of
// one dtype (the others are converted to it).
void py_merge_state_in_place(const py::object& v_obj, const py::object& s_obj, const py::object& v_other,
                             const py::object& s_other) {
  const py::array v = as_numeric_array(v_obj, "v"), s = as_numeric_array(s_obj, "s");
  const auto run = [&](auto zero) {
    using T = decltype(zero);
    for (const auto& [a, name] : {std::pair{v, "v"}, std::pair{s, "s"}}) {
      if (!a.dtype().is(py::dtype::of<T>()))
        throw TypeError(std::string("merge_state_in_place: ") + name + " must be " +
                        (sizeof(T) == 8 ? "float64" : "float32") + " like v, got dtype " +
                        std::string(py::str(a.dtype())));
      if (!a.writeable()) throw ValueError(std::string("merge_state_in_place: ") + name + " must be writable");
    }
    auto vw = py::reinterpret_borrow<py::array_t<T>>(v), sw = py::reinterpret_borrow<py::array_t<T>>(s);
    auto vo = as<T>(as_numeric_array(v_other, "v_other")), so = as<T>(as_numeric_array(s_other, "s_other"));
    const auto vv = view_of<T>(vw);
    const auto sv = view_of<T>(sw);
    if (vw.ptr() != v.ptr() || sw.ptr() != s.ptr())  // view_of copied: the writes would be lost
      throw ValueError("merge_state_in_place: v and s must have strides of whole elements");
    const auto vov = view_of<const T>(vo);
    const auto sov = view_of<const T>(so);
    py::gil_scoped_release nogil;
    merge_state_in_place<T>(vv, sv, vov, sov);
  };
  if (is_float64(v)) run(0.0);
  else if (v.dtype().is(py::dtype::of<float>())) run(0.0f);
  else
    throw TypeError("merge_state_in_place: v must be float32 or float64 (it is written in place), got dtype " +
                    std::string(py::str(v.dtype())));
}

// An integer array as int32 (FlashInfer's metadata), values checked to fit.
std::vector<int32_t> int32_values(const py::object& obj, const char* name) {
  auto a = int64_array(obj, name);
  if (a.ndim() != 1) throw ValueError(std::string(name) + " must be 1-D, got " + std::to_string(a.ndim()) + " axes");
  std::vector<int32_t> out;
  for (py::ssize_t i = 0; i < a.shape(0); ++i) {
    const int64_t x = a.at(i);
    if (x < INT32_MIN || x > INT32_MAX) throw ValueError(std::string(name) + " must fit in int32, got " + std::to_string(x));
    out.push_back(static_cast<int32_t>(x));
  }
  return out;
}
TensorView<const int32_t> view1(const std::vector<int32_t>& v) {
  return TensorView<const int32_t>(v.data(), {static_cast<int64_t>(v.size())});
}

std::vector<int64_t> ids_arg(const py::object& ids, const char* name) {
  std::vector<int64_t> out;
  for (const py::handle& id : py::iter(ids)) out.push_back(int_arg(id, name));
  return out;
}

// The keyword options of batch_attention and BatchAttentionPlan, and the
// arrays their views keep alive.
struct BatchOptionsArg {
  BatchAttentionOptions options;
  py::array_t<bool> custom_mask;
  py::array_t<uint8_t> packed;
  std::vector<int32_t> mask_indptr;

  BatchOptionsArg(const py::object& causal, const py::object& window, const py::object& softcap,
                  const py::object& scale, const py::object& alibi_slopes, const py::object& sinks,
                  const py::object& custom_mask_obj, const py::object& packed_obj, const py::object& mask_indptr_obj,
                  const py::object& precision) {
    if (!py::isinstance<py::bool_>(causal))
      throw TypeError("causal must be True or False (bottom-right per request), got " + repr_of(causal));
    const AttentionOptions a = attention_options(py::bool_(false), scale, softcap, window);
    options.causal = causal.cast<bool>();
    options.window = a.window;
    options.softcap = a.softcap;
    options.scale = a.scale;
    options.alibi_slopes = per_head_from(alibi_slopes, "alibi_slopes", "slope");
    options.sinks = per_head_from(sinks, "sinks", "logit");
    options.precision = precision_arg(precision);
    if (!custom_mask_obj.is_none()) {
      const py::array m = as_numeric_array(custom_mask_obj, "custom_mask");
      if (m.dtype().kind() != 'b')
        throw TypeError("custom_mask must be a bool array, got dtype " + std::string(py::str(m.dtype())));
      custom_mask = py::array_t<bool, py::array::c_style>::ensure(m.attr("ravel")());
      options.custom_mask = TensorView<const bool>(custom_mask.data(), {static_cast<int64_t>(custom_mask.size())});
    }
    if (!packed_obj.is_none()) {
      const py::array m = as_numeric_array(packed_obj, "packed_custom_mask");
      if (!m.dtype().is(py::dtype::of<uint8_t>()))
        throw TypeError("packed_custom_mask must be uint8 (np.packbits), got dtype " + std::string(py::str(m.dtype())));
      packed = py::array_t<uint8_t, py::array::c_style>::ensure(m.attr("ravel")());
      options.packed_custom_mask = TensorView<const uint8_t>(packed.data(), {static_cast<int64_t>(packed.size())});
    }
    if (!mask_indptr_obj.is_none()) {
      mask_indptr = int32_values(mask_indptr_obj, "mask_indptr");
      options.mask_indptr = view1(mask_indptr);
    }
  }
};

// k_pages and v_pages as the plan reads them: float32 (other dtypes
// converted), NumPy float16 in place, or attn.QuantizedTensor (bf16, f16,
// q8_0, q4_0, int4); f(k, v) with views of their storage type.
template <class F>
py::object with_pages(const py::object& k_obj, const py::object& v_obj, F&& f) {
  if (auto r = on_quantized_kv<true>("batch_attention", py::none(), k_obj, v_obj, f)) return *r;
  const py::array k = as_numeric_array(k_obj, "k_pages"), v = as_numeric_array(v_obj, "v_pages");
  if (is_float16(k) && is_float16(v)) return f(half_view(k), half_view(v));
  auto k32 = as<float>(k), v32 = as<float>(v);
  return f(view_of<const float>(k32), view_of<const float>(v32));
}

// out (and lse) of plan over q, the pages given by f_run(out, lse).
template <class Run>
py::object run_plan(const BatchAttentionPlan& plan, const py::object& q_obj, bool return_lse, Run&& run) {
  auto q = as<float>(as_numeric_array(q_obj, "q"));
  const auto qv = view_of<const float>(q);
  auto out = empty<float>(plan.output_shape());
  py::array_t<float> lse;
  if (return_lse) lse = empty<float>(plan.lse_shape());
  const auto ov = view_of<float>(out);
  const TensorView<float> lv = return_lse ? view_of<float>(lse) : TensorView<float>();
  {
    py::gil_scoped_release nogil;
    run(qv, ov, lv);
  }
  if (return_lse) return py::make_tuple(out, lse);
  return out;
}

std::pair<py::object, py::object> pages_pair(const py::object& kv) {
  if (!py::isinstance<py::tuple>(kv) && !py::isinstance<py::list>(kv))
    throw TypeError("kv must be a PagedKVCache or a pair (k_pages, v_pages), got " + repr_of(kv));
  const py::sequence pair = kv;
  if (pair.size() != 2) throw TypeError("kv must be a pair (k_pages, v_pages), got " + std::to_string(pair.size()) + " items");
  return {pair[0], pair[1]};
}

// sparse_attention(q, qo_indptr, cache, seq_ids, indices): the paged form.
py::object py_sparse_attention_paged(const py::object& q_obj, const py::object& qo_indptr_obj,
                                     const PagedKVCache& cache, const py::object& seq_ids,
                                     const py::object& indices_obj, const py::object& scale,
                                     const py::object& softcap, const py::object& sinks, bool return_lse) {
  const SparseAttentionOptions opt = sparse_options(scale, softcap, sinks);
  const std::vector<int32_t> qo_indptr = int32_values(qo_indptr_obj, "qo_indptr");
  const std::vector<int64_t> ids = ids_arg(seq_ids, "seq_ids");
  auto q = as<float>(as_numeric_array(q_obj, "q"));
  auto idx = int32_indices(indices_obj);
  const auto qv = view_of<const float>(q);
  const auto iv = view_of<const int32_t>(idx);
  SparseAttentionResult<float> r;
  {
    py::gil_scoped_release nogil;
    r = sparse_attention(qv, view1(qo_indptr), cache, ids, iv, opt);
  }
  py::array out = to_numpy(std::move(r.out));
  if (!return_lse) return out;
  return py::make_tuple(out, to_numpy(std::move(r.lse)));
}

py::object py_batch_attention(const py::object& q, const py::object& qo_indptr_obj, const py::object& kv,
                              const py::object& seq_ids, const py::object& kv_indptr, const py::object& kv_indices,
                              const py::object& kv_last_page_len, const std::string& layout, const py::object& causal,
                              const py::object& window, const py::object& softcap, const py::object& scale,
                              const py::object& alibi_slopes, const py::object& sinks, const py::object& custom_mask,
                              const py::object& packed_custom_mask, const py::object& mask_indptr, bool return_lse,
                              const py::object& precision) {
  const py::array qa = as_numeric_array(q, "q");
  if (qa.ndim() != 3) throw ValueError("batch_attention: q must be (nnz_q, num_qo_heads, head_dim), got " + std::to_string(qa.ndim()) + " axes");
  const std::vector<int32_t> qo_indptr = int32_values(qo_indptr_obj, "qo_indptr");
  const BatchOptionsArg opt(causal, window, softcap, scale, alibi_slopes, sinks, custom_mask, packed_custom_mask,
                            mask_indptr, precision);
  if (py::isinstance<PagedKVCache>(kv)) {
    if (seq_ids.is_none()) throw TypeError("batch_attention over a PagedKVCache needs seq_ids");
    for (const auto* given : {&kv_indptr, &kv_indices, &kv_last_page_len})
      if (!given->is_none()) throw TypeError("batch_attention over a PagedKVCache takes its page table from the cache: pass no kv_indptr, kv_indices or kv_last_page_len");
    const auto& cache = kv.cast<const PagedKVCache&>();
    const std::vector<int64_t> ids = ids_arg(seq_ids, "seq_ids");
    auto q32 = as<float>(qa);
    const auto qv = view_of<const float>(q32);
    BatchAttentionResult r;
    {
      py::gil_scoped_release nogil;
      r = batch_attention(qv, view1(qo_indptr), cache, ids, opt.options, return_lse);
    }
    py::array out = to_numpy(std::move(r.out));
    if (!return_lse) return out;
    return py::make_tuple(out, to_numpy(std::move(r.lse)));
  }
  if (!seq_ids.is_none()) throw TypeError("seq_ids goes with a PagedKVCache; pages (k_pages, v_pages) take kv_indptr, kv_indices and kv_last_page_len");
  for (const auto& [given, name] : {std::pair{&kv_indptr, "kv_indptr"}, {&kv_indices, "kv_indices"}, {&kv_last_page_len, "kv_last_page_len"}})
    if (given->is_none()) throw TypeError(std::string("batch_attention over pages needs ") + name);
  const std::vector<int32_t> indptr = int32_values(kv_indptr, "kv_indptr"), indices = int32_values(kv_indices, "kv_indices"),
                             last = int32_values(kv_last_page_len, "kv_last_page_len");
  const PageLayout pl = parse_page_layout(layout);
  const auto [k_obj, v_obj] = pages_pair(kv);
  return with_pages(k_obj, v_obj, [&](auto k, auto v) -> py::object {
    using KV = std::remove_const_t<std::remove_reference_t<decltype(*k.data())>>;
    // (int4's keys: a block per channel, its last axis the head dim; V's pool gives the page size.)
    const Shape ks = std::is_same_v<KV, block_int4> ? k.shape() : values_shape(k), vs = values_shape(v);
    if (ks.size() != 4 || vs.size() != 4)
      throw ValueError("batch_attention: k_pages and v_pages must be 4-D pools, got " + shape_str(ks) + " and " + shape_str(vs));
    const bool nhd = pl == PageLayout::NHD;
    const BatchAttentionPlan plan(view1(qo_indptr), view1(indptr), view1(indices), view1(last), qa.shape(1),
                                  ks[nhd ? 2 : 1], ks[3], vs[nhd ? 1 : 2], opt.options, vs[3], pl);
    return run_plan(plan, q, return_lse, [&](auto qv, auto ov, auto lv) { plan.run<KV>(qv, k, v, ov, lv); });
  });
}

// attn.BatchAttentionPlan: the plan and the options' arrays.
struct PyBatchPlan {
  std::optional<BatchAttentionPlan> plan;
};

py::object plan_run(const PyBatchPlan& self, const py::object& q, const py::object& kv, bool return_lse) {
  const BatchAttentionPlan& plan = *self.plan;
  if (py::isinstance<PagedKVCache>(kv)) {
    const auto& cache = kv.cast<const PagedKVCache&>();
    return run_plan(plan, q, return_lse, [&](auto qv, auto ov, auto lv) { cache.run(plan, qv, ov, lv); });
  }
  const auto [k_obj, v_obj] = pages_pair(kv);
  return with_pages(k_obj, v_obj, [&](auto k, auto v) -> py::object {
    using KV = std::remove_const_t<std::remove_reference_t<decltype(*k.data())>>;
    return run_plan(plan, q, return_lse, [&](auto qv, auto ov, auto lv) { plan.run<KV>(qv, k, v, ov, lv); });
  });
}

// A read-only NumPy view of a cache's pool, kept alive by the cache.
py::array pool_view(TensorView<const float> t, const py::object& owner) {
  std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end()), strides;
  for (int64_t s : t.strides()) strides.push_back(s * static_cast<py::ssize_t>(sizeof(float)));
  py::array a(py::dtype::of<float>(), shape, strides, t.data(), owner);
  py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return a;
}

py::tuple cache_state(const PagedKVCache& c) {
  const PagedKVCache::Sequences st = c.sequences_state();
  return py::make_tuple(c.num_pages(), c.page_size(), c.kv_heads(), c.head_dim(), c.value_head_dim(),
                        kv_dtype_name(c.dtype()), page_layout_name(c.layout()),
                        py::bytes(reinterpret_cast<const char*>(c.k_bytes().data()), c.k_bytes().size()),
                        py::bytes(reinterpret_cast<const char*>(c.v_bytes().data()), c.v_bytes().size()), st.ids,
                        st.lengths, st.pages, st.next_id, c.latent_rank(), st.key_tails);
}

// (A state of 13 items, from before latent caches, is a cache of keys and
// values apart; of 14, from before int4 pages, has no key tails.)
PagedKVCache cache_from_state(const py::tuple& t) {
  if (t.size() < 13 || t.size() > 15)
    throw ValueError("PagedKVCache: a pickled state has 15 items, got " + std::to_string(t.size()));
  const int64_t latent_rank = t.size() >= 14 ? t[13].cast<int64_t>() : 0;
  const KVDtype dtype = parse_kv_dtype(t[5].cast<std::string>());
  PagedKVCache c = latent_rank > 0
                       ? PagedKVCache::latent(t[0].cast<int64_t>(), t[1].cast<int64_t>(), latent_rank,
                                              t[3].cast<int64_t>() - latent_rank, dtype)
                       : PagedKVCache(t[0].cast<int64_t>(), t[1].cast<int64_t>(), t[2].cast<int64_t>(),
                                      t[3].cast<int64_t>(), t[4].cast<int64_t>(), dtype,
                                      parse_page_layout(t[6].cast<std::string>()));
  const auto bytes = [](const py::handle& b) {
    const std::string s = b.cast<std::string>();
    return std::vector<uint8_t>(s.begin(), s.end());
  };
  PagedKVCache::Sequences st;
  st.ids = t[9].cast<std::vector<int64_t>>();
  st.lengths = t[10].cast<std::vector<int64_t>>();
  st.pages = t[11].cast<std::vector<std::vector<int32_t>>>();
  st.next_id = t[12].cast<int64_t>();
  if (t.size() == 15) st.key_tails = t[14].cast<std::vector<std::vector<float>>>();
  c.restore(bytes(t[7]), bytes(t[8]), st);
  return c;
}

}  // namespace

void bind_serving(py::module_& m) {
  using py::arg;
  m.def("merge_state", &py_merge_state, arg("v_a"), arg("s_a"), arg("v_b"), arg("s_b"), docs::kMergeState);
  m.def("merge_state_in_place", &py_merge_state_in_place, arg("v"), arg("s"), arg("v_other"), arg("s_other"),
        docs::kMergeStateInPlace);
  m.def("merge_states", &py_merge_states, arg("vs"), arg("ss"), docs::kMergeStates);

  py::class_<PagedKVCache>(m, "PagedKVCache", docs::kPagedKVCache)
      .def(py::init([](const py::object& num_pages, const py::object& page_size, const py::object& kv_heads,
                       const py::object& head_dim, const py::object& value_head_dim, const std::string& dtype,
                       const std::string& layout) {
             return PagedKVCache(int_arg(num_pages, "num_pages"), int_arg(page_size, "page_size"),
                                 int_arg(kv_heads, "kv_heads"), int_arg(head_dim, "head_dim"),
                                 optional_int(value_head_dim, "value_head_dim"), parse_kv_dtype(dtype),
                                 parse_page_layout(layout));
           }),
           arg("num_pages"), arg("page_size"), arg("kv_heads"), arg("head_dim"), py::kw_only(),
           arg("value_head_dim") = py::none(), arg("dtype") = "f32", arg("layout") = "NHD")
      .def_static("latent", [](const py::object& num_pages, const py::object& page_size,
                               const py::object& kv_lora_rank, const py::object& rope_dim, const std::string& dtype) {
             return PagedKVCache::latent(int_arg(num_pages, "num_pages"), int_arg(page_size, "page_size"),
                                         int_arg(kv_lora_rank, "kv_lora_rank"), int_arg(rope_dim, "rope_dim"),
                                         parse_kv_dtype(dtype));
           }, arg("num_pages"), arg("page_size"), arg("kv_lora_rank"), arg("rope_dim"), py::kw_only(),
           arg("dtype") = "f32", docs::kPagedLatent)
      .def_property_readonly("latent_rank", &PagedKVCache::latent_rank)
      .def("latent_rows", [](const PagedKVCache& c, const py::object& seq) {
             return to_numpy(c.latent_rows(int_arg(seq, "seq")));
           }, arg("seq"))
      .def("add_sequence", &PagedKVCache::add_sequence)
      .def("remove", [](PagedKVCache& c, const py::object& seq) { c.remove(int_arg(seq, "seq")); }, arg("seq"))
      .def("fork", [](PagedKVCache& c, const py::object& seq) { return c.fork(int_arg(seq, "seq")); }, arg("seq"))
      .def("truncate", [](PagedKVCache& c, const py::object& seq, const py::object& length) {
             c.truncate(int_arg(seq, "seq"), int_arg(length, "length"));
           }, arg("seq"), arg("length"))
      .def("append", [](PagedKVCache& c, const py::object& seq_ids, const py::object& k_obj, const py::object& v_obj,
                        const py::object& indptr_obj) {
             const std::vector<int64_t> ids = ids_arg(seq_ids, "seq_ids");
             auto k = as<float>(as_numeric_array(k_obj, "k"));
             py::array_t<float> v;  // none for a latent cache
             if (!v_obj.is_none()) v = as<float>(as_numeric_array(v_obj, "v"));
             auto indptr = int64_array(indptr_obj, "append_indptr");
             const auto kv = view_of<const float>(k);
             const auto vv = v_obj.is_none() ? TensorView<const float>() : view_of<const float>(v);
             const auto iv = view_of<const int64_t>(indptr);
             py::gil_scoped_release nogil;
             c.append(ids, kv, vv, iv);
           }, arg("seq_ids"), arg("k"), arg("v"), arg("append_indptr"))
      .def("length", [](const PagedKVCache& c, const py::object& seq) { return c.length(int_arg(seq, "seq")); }, arg("seq"))
      .def("positions", [](const PagedKVCache& c, const py::object& seq) {
             const std::vector<int64_t> p = c.positions(int_arg(seq, "seq"));
             auto a = empty<int64_t>({static_cast<int64_t>(p.size())});
             std::copy(p.begin(), p.end(), a.mutable_data());
             return a;
           }, arg("seq"))
      .def("sequences", &PagedKVCache::sequences)
      .def("pages_in_use", &PagedKVCache::pages_in_use)
      .def("free_pages", &PagedKVCache::free_pages)
      .def_property_readonly("nbytes", &PagedKVCache::nbytes)
      .def_property_readonly("num_pages", &PagedKVCache::num_pages)
      .def_property_readonly("page_size", &PagedKVCache::page_size)
      .def_property_readonly("kv_heads", &PagedKVCache::kv_heads)
      .def_property_readonly("head_dim", &PagedKVCache::head_dim)
      .def_property_readonly("value_head_dim", &PagedKVCache::value_head_dim)
      .def_property_readonly("dtype", [](const PagedKVCache& c) { return kv_dtype_name(c.dtype()); })
      .def_property_readonly("layout", [](const PagedKVCache& c) { return page_layout_name(c.layout()); })
      .def("page_table", [](const PagedKVCache& c, const py::object& seq_ids) {
             PageTable t = c.page_table(ids_arg(seq_ids, "seq_ids"));
             return py::make_tuple(to_numpy(std::move(t.kv_indptr)), to_numpy(std::move(t.kv_indices)),
                                   to_numpy(std::move(t.kv_last_page_len)));
           }, arg("seq_ids"))
      .def("pages", [](const py::object& self) {
             const auto& c = self.cast<const PagedKVCache&>();
             return py::make_tuple(pool_view(c.k_pages(), self), pool_view(c.v_pages(), self));
           })
      .def("__copy__", [](const PagedKVCache& c) { return PagedKVCache(c); })
      .def("__deepcopy__", [](const PagedKVCache& c, const py::object&) { return PagedKVCache(c); }, arg("memo"))
      .def(py::pickle(&cache_state, &cache_from_state));

  m.def("batch_attention", &py_batch_attention, arg("q"), arg("qo_indptr"), arg("kv"), arg("seq_ids") = py::none(),
        py::kw_only(), arg("kv_indptr") = py::none(), arg("kv_indices") = py::none(),
        arg("kv_last_page_len") = py::none(), arg("layout") = "NHD", arg("causal") = false,
        arg("window") = py::none(), arg("softcap") = py::none(), arg("scale") = py::none(),
        arg("alibi_slopes") = py::none(), arg("sinks") = py::none(), arg("custom_mask") = py::none(),
        arg("packed_custom_mask") = py::none(), arg("mask_indptr") = py::none(), arg("return_lse") = false,
        arg("precision") = "f32", docs::kBatchAttention);

  m.def("sparse_attention_paged", &py_sparse_attention_paged, arg("q"), arg("qo_indptr"), arg("cache"),
        arg("seq_ids"), arg("indices"), py::kw_only(), arg("scale") = py::none(), arg("softcap") = py::none(),
        arg("sinks") = py::none(), arg("return_lse") = false);

  py::class_<PyBatchPlan>(m, "BatchAttentionPlan", docs::kBatchAttentionPlan)
      .def(py::init([](const py::object& qo_indptr, const py::object& kv_indptr, const py::object& kv_indices,
                       const py::object& kv_last_page_len, const py::object& num_qo_heads,
                       const py::object& num_kv_heads, const py::object& head_dim, const py::object& page_size,
                       const py::object& value_head_dim, const std::string& layout, const py::object& causal,
                       const py::object& window, const py::object& softcap, const py::object& scale,
                       const py::object& alibi_slopes, const py::object& sinks, const py::object& custom_mask,
                       const py::object& packed_custom_mask, const py::object& mask_indptr,
                       const py::object& precision) {
             const std::vector<int32_t> qo = int32_values(qo_indptr, "qo_indptr"), ip = int32_values(kv_indptr, "kv_indptr"),
                                        ix = int32_values(kv_indices, "kv_indices"),
                                        last = int32_values(kv_last_page_len, "kv_last_page_len");
             const int64_t heads = int_arg(num_qo_heads, "num_qo_heads");
             const BatchOptionsArg opt(causal, window, softcap, scale, alibi_slopes, sinks, custom_mask,
                                       packed_custom_mask, mask_indptr, precision);
             PyBatchPlan p;
             p.plan.emplace(view1(qo), view1(ip), view1(ix), view1(last), heads, int_arg(num_kv_heads, "num_kv_heads"),
                            int_arg(head_dim, "head_dim"), int_arg(page_size, "page_size"), opt.options,
                            optional_int(value_head_dim, "value_head_dim"), parse_page_layout(layout));
             return p;
           }),
           arg("qo_indptr"), arg("kv_indptr"), arg("kv_indices"), arg("kv_last_page_len"), arg("num_qo_heads"),
           arg("num_kv_heads"), arg("head_dim"), arg("page_size"), py::kw_only(), arg("value_head_dim") = py::none(),
           arg("layout") = "NHD", arg("causal") = false, arg("window") = py::none(), arg("softcap") = py::none(),
           arg("scale") = py::none(), arg("alibi_slopes") = py::none(), arg("sinks") = py::none(),
           arg("custom_mask") = py::none(), arg("packed_custom_mask") = py::none(), arg("mask_indptr") = py::none(),
           arg("precision") = "f32")
      .def("run", &plan_run, arg("q"), arg("kv"), py::kw_only(), arg("return_lse") = false)
      .def_property_readonly("batch_size", [](const PyBatchPlan& p) { return p.plan->batch_size(); });
}

}  // namespace attn::python
