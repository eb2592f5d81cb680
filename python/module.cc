// attn._core: the Python API of docs/semantics.md over the C++ library, on
// NumPy arrays. Arrays are read in place (float32 and float64 with any
// strides); other numeric dtypes are converted to float32. The GIL is
// released while computing. The package attn (python/attn/) adds torch
// tensors, autograd and PyTorch's signatures on top.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>

#include "args.hpp"
#include "arrays.hpp"
#include "attn/attn.hpp"
#include "attn/file.hpp"
#include "attn/threads.hpp"
#include "attn/version.h"
#include "bindings.hpp"
#include "docstrings.hpp"
#include "quantized.hpp"

namespace attn::python {

py::array_t<int32_t> int32_indices(const py::object& obj) {
  const py::array_t<int64_t, py::array::c_style> wide = int64_array(obj, "indices");
  for (ssize_t e = 0; e < wide.size(); ++e)
    if (wide.data()[e] < INT32_MIN || wide.data()[e] > INT32_MAX)
      throw ValueError("sparse_attention: indices holds " + std::to_string(wide.data()[e]) +
                       ", beyond int32 (key positions are int32)");
  return py::array_t<int32_t>::ensure(wide);
}

SparseAttentionOptions sparse_options(const py::object& scale, const py::object& softcap, const py::object& sinks) {
  const AttentionOptions common = attention_options(py::none(), scale, softcap, py::none());
  SparseAttentionOptions opt;
  opt.scale = common.scale, opt.softcap = common.softcap;
  opt.sinks = per_head_from(sinks, "sinks", "logit");
  return opt;
}

namespace {

// ---------------------------------------------------------------------------

// f(in, out) into a new array of in's shape, as T, without the GIL.
template <class T, class F>
py::array same_shape(const py::array& in_array, F f) {
  auto a = as<T>(in_array);
  const auto in = view_of<const T>(a);
  auto out = empty<T>(in.shape());
  auto o = view_of<T>(out);
  py::gil_scoped_release nogil;
  f(in, o);
  return out;
}

// float64 stays float64 (the reference); every other dtype is float32.
template <class F>
py::array same_shape(const py::array& in, F f) {
  return is_float64(in) ? same_shape<double>(in, f) : same_shape<float>(in, f);
}

py::array py_softmax(const py::object& a_obj, int64_t axis) {
  return same_shape(as_numeric_array(a_obj, "a"), [&](auto in, auto out) { softmax(in, out, axis); });
}

// Which extras attn.attention returns beside its output.
struct AttentionReturns {
  bool weights = false;
  std::optional<Logits> logits;  // the stage, when the logits are wanted
  bool lse = false;
};

template <class T, class KV>
py::object attention_t(const py::array& q_in, TensorView<const KV> k, TensorView<const KV> v,
                       const py::object& mask_obj, const AttentionOptions& opt,
                       const AttentionReturns& returns) {
  auto qa = as<T>(q_in);
  const auto q = view_of<const T>(qa);
  const MaskArg m(mask_obj, "mask", IntegerMask::Refuse);  // boolean: True = may attend
  const AttentionPlan<T, KV> plan(q, k, v, opt, m.mask);    // every check, once
  auto out = empty<T>(plan.output_shape());
  py::tuple result(1 + int(returns.weights) + int(returns.logits.has_value()) + int(returns.lse));
  result[0] = out;
  AttentionExtras<T> extras;
  int next = 1;
  const auto extra = [&](const Shape& shape) {
    auto a = empty<T>(shape);
    result[next++] = a;
    return view_of<T>(a);
  };
  if (returns.weights) extras.weights = extra(plan.weights_shape());
  if (returns.logits) {
    extras.logits = extra(plan.weights_shape());
    extras.logits_stage = *returns.logits;
  }
  if (returns.lse) extras.lse = extra(plan.lse_shape());
  auto o = view_of<T>(out);
  {
    py::gil_scoped_release nogil;
    plan.run(o, extras);
  }
  if (next == 1) return out;
  return result;
}

template <class T>
py::object attention_t(const py::array& q, const py::array& k_in, const py::array& v_in,
                       const py::object& mask, const AttentionOptions& opt,
                       const AttentionReturns& returns) {
  auto ka = as<T>(k_in), va = as<T>(v_in);
  return attention_t<T, T>(q, view_of<const T>(ka), view_of<const T>(va), mask, opt, returns);
}

py::object py_attention(const py::object& q_obj, const py::object& k_obj,
                        const py::object& v_obj, const py::object& mask,
                        const py::object& causal, const py::object& scale,
                        const py::object& softcap, const py::object& window,
                        const py::object& alibi_slopes, const py::object& sinks, bool return_weights,
                        const py::object& return_logits, bool return_lse, const py::object& precision) {
  AttentionOptions opt = attention_options(causal, scale, softcap, window);
  opt.precision = precision_arg(precision);
  opt.alibi_slopes = per_head_from(alibi_slopes, "alibi_slopes", "slope");
  opt.sinks = per_head_from(sinks, "sinks", "logit");
  AttentionReturns returns;
  returns.weights = return_weights;
  returns.lse = return_lse;
  if (!return_logits.is_none()) {
    if (!py::isinstance<py::str>(return_logits))
      throw TypeError("return_logits must be None, 'scaled', 'softcapped' or 'masked', got " +
                      std::string(py::repr(return_logits)));
    returns.logits = parse_logits(return_logits.cast<std::string>());
  }
  if (auto r = on_quantized_kv<true>("attention", q_obj, k_obj, v_obj, [&](auto k, auto v) {
        using S = std::remove_const_t<std::remove_reference_t<decltype(*k.data())>>;
        return attention_t<float, S>(as_numeric_array(q_obj, "q"), k, v, mask, opt, returns);
      }))
    return *r;
  const auto q = as_numeric_array(q_obj, "q"), k = as_numeric_array(k_obj, "k"),
             v = as_numeric_array(v_obj, "v");
  if (is_float64(q) || is_float64(k) || is_float64(v))
    return attention_t<double>(q, k, v, mask, opt, returns);
  // float16 keys and values are read as they are (half the bytes of float32).
  if (is_float16(k) && is_float16(v))
    return attention_t<float, float16>(q, half_view(k), half_view(v), mask, opt, returns);
  return attention_t<float>(q, k, v, mask, opt, returns);
}

py::object py_sparse_attention(const py::object& q_obj, const py::object& k_obj, const py::object& v_obj,
                               const py::object& indices_obj, const py::object& scale, const py::object& softcap,
                               const py::object& sinks, bool return_lse) {
  const SparseAttentionOptions opt = sparse_options(scale, softcap, sinks);
  auto idx = int32_indices(indices_obj);
  const auto q = as_numeric_array(q_obj, "q"), k = as_numeric_array(k_obj, "k"), v = as_numeric_array(v_obj, "v");
  const auto run = [&](auto zero) -> py::object {
    using T = decltype(zero);
    auto qa = as<T>(q), ka = as<T>(k), va = as<T>(v);
    const auto qv = view_of<const T>(qa), kv = view_of<const T>(ka), vv = view_of<const T>(va);
    const auto iv = view_of<const int32_t>(idx);
    SparseAttentionResult<T> r;
    {
      py::gil_scoped_release nogil;
      r = sparse_attention<T>(qv, kv, vv, iv, opt);
    }
    py::array out = to_numpy(std::move(r.out));
    if (!return_lse) return out;
    return py::make_tuple(out, to_numpy(std::move(r.lse)));
  };
  return is_float64(q) || is_float64(k) || is_float64(v) ? run(0.0) : run(0.0f);
}

template <class T, class KV>
py::object latent_attention_t(const py::array& q_nope, const py::array& q_pe, TensorView<const KV> ckv,
                              TensorView<const KV> kpe, double scale, bool causal, bool return_lse) {
  auto qn = as<T>(q_nope), qp = as<T>(q_pe);
  const auto qnv = view_of<const T>(qn), qpv = view_of<const T>(qp);
  LatentAttentionResult<T> r;
  {
    py::gil_scoped_release nogil;
    r = latent_attention<T, KV>(qnv, qpv, ckv, kpe, scale, causal);
  }
  py::array out = to_numpy(std::move(r.out));
  if (!return_lse) return out;
  return py::make_tuple(out, to_numpy(std::move(r.lse)));
}

// ckv and kpe are viewed in place: two slices of one cache array keep its
// rows (keys and values read once, not copied).
py::object py_latent_attention(const py::object& q_nope_obj, const py::object& q_pe_obj, const py::object& ckv_obj,
                               const py::object& kpe_obj, double scale, bool causal, bool return_lse) {
  const auto qn = as_numeric_array(q_nope_obj, "q_nope"), qp = as_numeric_array(q_pe_obj, "q_pe"),
             c = as_numeric_array(ckv_obj, "ckv"), kp = as_numeric_array(kpe_obj, "kpe");
  if (is_float64(qn) || is_float64(qp) || is_float64(c) || is_float64(kp)) {
    auto ca = as<double>(c), ka = as<double>(kp);
    return latent_attention_t<double, double>(qn, qp, view_of<const double>(ca), view_of<const double>(ka), scale,
                                              causal, return_lse);
  }
  if (is_float16(c) && is_float16(kp))
    return latent_attention_t<float, float16>(qn, qp, half_view(c), half_view(kp), scale, causal, return_lse);
  auto ca = as<float>(c), ka = as<float>(kp);
  return latent_attention_t<float, float>(qn, qp, view_of<const float>(ca), view_of<const float>(ka), scale, causal,
                                          return_lse);
}

template <class T, class KV>
py::tuple attention_backward_t(const py::array& q_in, TensorView<const KV> k, TensorView<const KV> v,
                               const py::array& dout_in, const py::object& mask_obj, const AttentionOptions& opt,
                               const py::object& out_obj, const py::object& lse_obj) {
  auto qa = as<T>(q_in), da = as<T>(dout_in);
  const auto q = view_of<const T>(qa), dout = view_of<const T>(da);
  // The forward's output and log-sum-exp, when the caller kept them.
  py::array_t<T> out_a, lse_a;
  SavedForward<T> saved;
  if (!out_obj.is_none()) saved.out = view_of<const T>(out_a = as<T>(as_numeric_array(out_obj, "out")));
  if (!lse_obj.is_none()) saved.lse = view_of<const T>(lse_a = as<T>(as_numeric_array(lse_obj, "lse")));
  auto dq = empty<T>(q.shape()), dk = empty<T>(values_shape(k)), dv = empty<T>(values_shape(v));
  auto dsinks = empty<T>({static_cast<int64_t>(opt.sinks.size())});
  auto dqv = view_of<T>(dq), dkv = view_of<T>(dk), dvv = view_of<T>(dv);
  const TensorView<T> dsv = opt.sinks.empty() ? TensorView<T>() : view_of<T>(dsinks);
  const MaskArg m(mask_obj, "mask", IntegerMask::Refuse);
  {
    py::gil_scoped_release nogil;
    attention_backward(q, k, v, dout, dqv, dkv, dvv, opt, m.mask, dsv, saved);
  }
  if (opt.sinks.empty()) return py::make_tuple(dq, dk, dv);
  return py::make_tuple(dq, dk, dv, dsinks);
}

template <class T>
py::tuple attention_backward_t(const py::array& q, const py::array& k_in, const py::array& v_in,
                               const py::array& dout, const py::object& mask, const AttentionOptions& opt,
                               const py::object& out, const py::object& lse) {
  auto ka = as<T>(k_in), va = as<T>(v_in);
  return attention_backward_t<T, T>(q, view_of<const T>(ka), view_of<const T>(va), dout, mask, opt, out, lse);
}

py::tuple py_attention_backward(const py::object& q_obj, const py::object& k_obj,
                                const py::object& v_obj, const py::object& dout_obj,
                                const py::object& mask, const py::object& causal,
                                const py::object& scale, const py::object& softcap,
                                const py::object& window, const py::object& alibi_slopes,
                                const py::object& sinks, const py::object& out,
                                const py::object& lse) {
  AttentionOptions opt = attention_options(causal, scale, softcap, window);
  opt.alibi_slopes = per_head_from(alibi_slopes, "alibi_slopes", "slope");
  opt.sinks = per_head_from(sinks, "sinks", "logit");
  if (auto r = on_quantized_kv("attention_backward", q_obj, k_obj, v_obj, [&](auto k, auto v) -> py::object {
        using S = std::remove_const_t<std::remove_reference_t<decltype(*k.data())>>;
        return attention_backward_t<float, S>(as_numeric_array(q_obj, "q"), k, v, as_numeric_array(dout_obj, "dout"),
                                              mask, opt, out, lse);
      }))
    return *r;
  const auto q = as_numeric_array(q_obj, "q"), k = as_numeric_array(k_obj, "k"),
             v = as_numeric_array(v_obj, "v"), dout = as_numeric_array(dout_obj, "dout");
  if (is_float64(q) || is_float64(k) || is_float64(v) || is_float64(dout))
    return attention_backward_t<double>(q, k, v, dout, mask, opt, out, lse);
  return attention_backward_t<float>(q, k, v, dout, mask, opt, out, lse);
}

template <class T, class KV>
py::object attention_varlen_t(const py::array& q_in, TensorView<const KV> k, TensorView<const KV> v,
                              py::array_t<int64_t> cu_q, py::array_t<int64_t> cu_k,
                              const AttentionOptions& opt, bool return_lse) {
  auto qa = as<T>(q_in);
  const auto q = view_of<const T>(qa);
  if (q.rank() != 3 || v.rank() != 3)
    throw ValueError("attention_varlen: q, k and v must be packed (total, heads, head_dim), got q " +
                     shape_str(q.shape()) + ", v " + shape_str(values_shape(v)));
  auto out = empty<T>({q.dim(0), q.dim(1), values_shape(v)[2]});
  auto lse = empty<T>(return_lse ? Shape{q.dim(1), q.dim(0)} : Shape{0});
  const auto o = view_of<T>(out);
  const TensorView<T> l = return_lse ? view_of<T>(lse) : TensorView<T>();
  const auto cq = view_of<const int64_t>(cu_q), ck = view_of<const int64_t>(cu_k);
  {
    py::gil_scoped_release nogil;
    attention_varlen(q, k, v, cq, ck, o, opt, l);
  }
  if (return_lse) return py::make_tuple(out, lse);
  return out;
}

template <class T>
py::object attention_varlen_t(const py::array& q, const py::array& k_in, const py::array& v_in,
                              py::array_t<int64_t> cu_q, py::array_t<int64_t> cu_k,
                              const AttentionOptions& opt, bool return_lse) {
  auto ka = as<T>(k_in), va = as<T>(v_in);
  return attention_varlen_t<T, T>(q, view_of<const T>(ka), view_of<const T>(va), cu_q, cu_k, opt, return_lse);
}

py::object py_attention_varlen(const py::object& q_obj, const py::object& k_obj, const py::object& v_obj,
                               const py::object& cu_seqlens_q, const py::object& cu_seqlens_k,
                               const py::object& causal, const py::object& scale,
                               const py::object& softcap, const py::object& window,
                               const py::object& alibi_slopes, const py::object& sinks, bool return_lse) {
  AttentionOptions opt = attention_options(causal, scale, softcap, window);
  opt.alibi_slopes = per_head_from(alibi_slopes, "alibi_slopes", "slope");
  opt.sinks = per_head_from(sinks, "sinks", "logit");
  const auto cu_q = int64_array(cu_seqlens_q, "cu_seqlens_q"), cu_k = int64_array(cu_seqlens_k, "cu_seqlens_k");
  if (auto r = on_quantized_kv("attention_varlen", q_obj, k_obj, v_obj, [&](auto k, auto v) {
        return attention_varlen_t<float>(as_numeric_array(q_obj, "q"), k, v, cu_q, cu_k, opt, return_lse);
      }))
    return *r;
  const auto q = as_numeric_array(q_obj, "q"), k = as_numeric_array(k_obj, "k"),
             v = as_numeric_array(v_obj, "v");
  if (is_float64(q) || is_float64(k) || is_float64(v))
    return attention_varlen_t<double>(q, k, v, cu_q, cu_k, opt, return_lse);
  return attention_varlen_t<float>(q, k, v, cu_q, cu_k, opt, return_lse);
}

py::array py_multi_head(const py::object& x_obj, int64_t heads) {
  return same_shape(as_numeric_array(x_obj, "x"), [&](auto x, auto out) { multi_head(x, out, heads); });
}

py::array py_positional_encoding(int64_t n, int64_t d, double base, const py::object& dtype) {
  const py::dtype dt = py::dtype::from_args(dtype);
  const auto fill = [&](auto tag) -> py::array {
    using T = decltype(tag);
    if (n < 0) throw ValueError("positional_encoding: n must be >= 0, got " + std::to_string(n));
    if (d < 1) throw ValueError("positional_encoding: d must be >= 1, got " + std::to_string(d));
    auto out = empty<T>({n, d});  // the table is written here, never copied
    auto o = view_of<T>(out);
    py::gil_scoped_release nogil;
    sinusoidal_encoding<T>(o, base);
    return out;
  };
  if (dt.is(py::dtype::of<float>())) return fill(float{});
  if (dt.is(py::dtype::of<double>())) return fill(double{});
  throw TypeError("positional_encoding: dtype must be float32 or float64, got " +
                  std::string(py::str(static_cast<const py::handle&>(dt))));
}

py::array_t<int64_t> positions_from(const py::object& positions) { return int64_array(positions, "rope: positions"); }

template <class T, bool backward>
py::array rope_t(const py::array& x_in, const py::object& positions, const RopeOptions& opt,
                 const py::object& cos, const py::object& sin) {
  auto xa = as<T>(x_in);
  const auto x = view_of<const T>(xa);
  py::array_t<int64_t> pa;
  TensorView<const int64_t> pos;
  if (!positions.is_none()) {
    pa = positions_from(positions);
    pos = view_of<const int64_t>(pa);
  }
  // Explicit tables, in x's dtype.
  py::array_t<T> ca, sa;
  RopeTables<T> tables;
  const bool with_tables = !cos.is_none() || !sin.is_none();
  if (with_tables) {
    if (cos.is_none() || sin.is_none())
      throw ValueError(std::string("rope: cos and sin tables go together, got only ") +
                       (cos.is_none() ? "sin" : "cos"));
    ca = as<T>(as_numeric_array(cos, "cos"));
    sa = as<T>(as_numeric_array(sin, "sin"));
    tables = {view_of<const T>(ca), view_of<const T>(sa)};
  }
  auto out = empty<T>(x.shape());
  auto o = view_of<T>(out);
  {
    py::gil_scoped_release nogil;
    if (with_tables) {
      if constexpr (backward) rope_backward(x, o, tables, opt, pos);
      else apply_rope(x, o, tables, opt, pos);
    } else {
      if constexpr (backward) rope_backward(x, o, opt, pos);
      else apply_rope(x, o, opt, pos);
    }
  }
  return out;
}

// rope_scaling as the JSON text attn.rope makes of its dict (None: none).
RopeScaling scaling_from(const py::object& json) {
  if (json.is_none()) return {};
  if (!py::isinstance<py::str>(json))
    throw TypeError("scaling must be a rope_scaling dict or None, got " + repr_of(json));
  return parse_rope_scaling(json.cast<std::string>());
}

// apply_rope, or with `backward` rope_backward.
template <bool backward>
py::array py_rope(const py::object& x_obj, const py::object& positions, double base,
                  bool interleaved, const py::object& rotary_dim, const py::object& scaling,
                  const py::object& cos, const py::object& sin, const py::object& mrope_section) {
  const auto x = as_numeric_array(x_obj, backward ? "dy" : "x");
  RopeOptions opt;
  opt.base = base;
  opt.interleaved = interleaved;
  opt.rotary_dim = optional_int(rotary_dim, "rope: rotary_dim");
  opt.scaling = scaling_from(scaling);
  if (!mrope_section.is_none()) {
    if (!py::isinstance<py::sequence>(mrope_section) || py::isinstance<py::str>(mrope_section))
      throw TypeError("rope: mrope_section must be a list of section sizes, e.g. [16, 24, 24], got " +
                      repr_of(mrope_section));
    std::vector<int64_t> sections;
    for (const py::handle& h : mrope_section) sections.push_back(int_arg(h, "rope: mrope_section sizes"));
    if (!opt.scaling.mrope_section.empty() && opt.scaling.mrope_section != sections)
      throw ValueError("rope: mrope_section given twice, as an argument and in scaling, and they differ");
    opt.scaling.mrope_section = sections;
  }
  return is_float64(x) ? rope_t<double, backward>(x, positions, opt, cos, sin)
                       : rope_t<float, backward>(x, positions, opt, cos, sin);
}

py::tuple py_rope_frequencies(const py::object& rotary_dim, double base, const py::object& scaling,
                              const py::object& seq_len) {
  const RopeFrequencies f = rope_frequencies(int_arg(rotary_dim, "rope_frequencies: rotary_dim"), base,
                                             scaling_from(scaling), optional_int(seq_len, "rope_frequencies: seq_len"));
  auto inv = empty<double>({static_cast<int64_t>(f.inv_freq.size())});
  std::copy(f.inv_freq.begin(), f.inv_freq.end(), inv.mutable_data());
  return py::make_tuple(inv, f.attention_factor);
}

py::array py_alibi_slopes(const py::object& num_heads, double max_bias) {
  const std::vector<double> slopes = alibi_slopes(int_arg(num_heads, "alibi_slopes: num_heads"), max_bias);
  auto out = empty<double>({static_cast<int64_t>(slopes.size())});
  std::copy(slopes.begin(), slopes.end(), out.mutable_data());
  return out;
}

}  // namespace

}  // namespace attn::python

PYBIND11_MODULE(_core, m) {
  using namespace attn::python;
  namespace py = pybind11;
  using py::arg;
  py::options options;
  options.disable_function_signatures();  // each docstring opens with its own
  m.doc() = docs::kModule;
  m.attr("__version__") = ATTN_VERSION;
  register_errors();

  m.def("softmax", &py_softmax, arg("a"), arg("axis") = -1, docs::kSoftmax);
  m.def("attention", &py_attention, arg("q"), arg("k"), arg("v"), arg("mask") = py::none(),
        py::kw_only(), arg("causal") = false, arg("scale") = py::none(),
        arg("softcap") = py::none(), arg("window") = py::none(), arg("alibi_slopes") = py::none(),
        arg("sinks") = py::none(), arg("return_weights") = false, arg("return_logits") = py::none(),
        arg("return_lse") = false, arg("precision") = "f32", docs::kAttention);
  m.def("latent_attention", &py_latent_attention, arg("q_nope"), arg("q_pe"), arg("ckv"), arg("kpe"), py::kw_only(),
        arg("scale"), arg("causal") = false, arg("return_lse") = false, docs::kLatentAttention);
  m.def("sparse_attention", &py_sparse_attention, arg("q"), arg("k"), arg("v"), arg("indices"), py::kw_only(),
        arg("scale") = py::none(), arg("softcap") = py::none(), arg("sinks") = py::none(),
        arg("return_lse") = false, docs::kSparseAttention);
  m.def("attention_backward", &py_attention_backward, arg("q"), arg("k"), arg("v"),
        arg("dout"), arg("mask") = py::none(), py::kw_only(), arg("causal") = false,
        arg("scale") = py::none(), arg("softcap") = py::none(), arg("window") = py::none(),
        arg("alibi_slopes") = py::none(), arg("sinks") = py::none(), arg("out") = py::none(),
        arg("lse") = py::none(), docs::kAttentionBackward);
  m.def("attention_varlen", &py_attention_varlen, arg("q"), arg("k"), arg("v"), arg("cu_seqlens_q"),
        arg("cu_seqlens_k"), py::kw_only(), arg("causal") = false, arg("scale") = py::none(),
        arg("softcap") = py::none(), arg("window") = py::none(), arg("alibi_slopes") = py::none(),
        arg("sinks") = py::none(), arg("return_lse") = false, docs::kAttentionVarlen);
  m.def("multi_head", &py_multi_head, arg("x"), arg("heads") = 4, docs::kMultiHead);
  m.def("positional_encoding", &py_positional_encoding, arg("n"), arg("d"), py::kw_only(),
        arg("base") = 10000.0, arg("dtype") = py::module_::import("numpy").attr("float32"),
        docs::kPositionalEncoding);
  // scaling: the JSON text of a rope_scaling dict (attn.rope makes it).
  m.def("rope", &py_rope<false>, arg("x"), arg("positions") = py::none(), py::kw_only(),
        arg("base") = 10000.0, arg("interleaved") = false, arg("rotary_dim") = py::none(),
        arg("scaling") = py::none(), arg("cos") = py::none(), arg("sin") = py::none(),
        arg("mrope_section") = py::none(), docs::kRope);
  m.def("rope_backward", &py_rope<true>, arg("dy"), arg("positions") = py::none(), py::kw_only(),
        arg("base") = 10000.0, arg("interleaved") = false, arg("rotary_dim") = py::none(),
        arg("scaling") = py::none(), arg("cos") = py::none(), arg("sin") = py::none(),
        arg("mrope_section") = py::none(), docs::kRopeBackward);
  m.def("rope_frequencies", &py_rope_frequencies, arg("rotary_dim"), py::kw_only(),
        arg("base") = 10000.0, arg("scaling") = py::none(), arg("seq_len") = py::none(),
        docs::kRopeFrequencies);
  m.def("alibi_slopes", &py_alibi_slopes, arg("num_heads"), py::kw_only(), arg("max_bias") = 8.0,
        docs::kAlibiSlopes);
  m.def("num_threads", &attn::num_threads,
        "num_threads() -> int: threads the kernels use (default: ATTN_NUM_THREADS, else all "
        "cores). Results do not depend on it.");
  m.def("set_num_threads", [](const py::object& n) { attn::set_num_threads(int_arg(n, "set_num_threads: n")); },
        arg("n"),
        "set_num_threads(n): use 1 <= n <= max_num_threads() threads from the next call on.");
  m.def("max_num_threads", &attn::max_num_threads,
        "max_num_threads() -> int: the largest count set_num_threads accepts, "
        "min(1024, max(64, 4 x hardware threads)).");
  m.def("precision_unit", [](const py::object& precision) { return attn::precision_unit(precision_arg(precision)); },
        arg("precision"),
        "precision_unit(precision) -> str: what computes attention's products in that precision ('f32', "
        "'bf16' or 'int8') on this CPU: 'avx512_bf16' (x86's VDPBF16PS) or 'neon_bf16' (Arm's BFDOT), for 'bf16' where "
        "the CPU has it and it outruns the float32 FMAs (timed once per process), 'avx512_vnni' (x86's "
        "VPDPBUSD) or 'neon_dotprod' (Arm's SDOT) for the Q·Kᵀ of 'int8' where the CPU has it, or 'highway' "
        "(the float32 FMAs, on bf16-rounded or int8-quantized values). The P·V of 'int8', being bf16's, runs "
        "on what precision_unit('bf16') names.");
  m.def("decode_precision_unit",
        [](const py::object& precision, int64_t rows_per_kv_head) {
          return attn::decode_precision_unit(precision_arg(precision), rows_per_kv_head);
        },
        arg("precision"), arg("rows_per_kv_head"),
        "decode_precision_unit(precision, rows_per_kv_head) -> str: what computes decode's Q·K (at most 8 "
        "query rows against many keys) in that precision at this many query rows per KV head (GQA group x "
        "queries): for 'int8' over q8_0 keys, precision_unit('int8') from 8 rows up and 'highway' below them "
        "(where the unit's packing costs more than it saves); precision_unit(precision) otherwise.");
  bind_quantized(m);
  bind_mha(m);
  bind_mla(m);
  bind_onnx(m);
  bind_serving(m);
}
