// attn._core.onnx_attention and onnx_rotary_embedding: attn/onnx.hpp on
// NumPy arrays. The element type is Q's (X's): float16, float32 or float64;
// the other floating inputs are converted to it, as ONNX requires them to
// share it.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <optional>
#include <string>

#include "args.hpp"
#include "arrays.hpp"
#include "attn/onnx.hpp"
#include "bindings.hpp"
#include "docstrings.hpp"

namespace attn::python {
namespace {

// An optional input as a view of element type T, with the array it reads.
template <class T>
struct Input {
  py::object keep;
  TensorView<const T> view;
};

template <class T>
Input<T> input(const py::object& obj, const char* name) {
  if (obj.is_none()) return {};
  const py::array a = as_numeric_array(obj, name);
  if (a.dtype().kind() != 'f')
    throw TypeError(std::string(name) + " must be a floating array (ONNX's T), got dtype " +
                    std::string(py::str(a.dtype())));
  if constexpr (std::is_same_v<T, float16>) {
    py::array h = a.attr("astype")("float16", py::arg("copy") = false);
    if (!is_float16(h)) h = py::module_::import("numpy").attr("ascontiguousarray")(h);
    return {h, half_view(h)};
  } else {
    auto t = as<T>(a);
    return {t, view_of<const T>(t)};
  }
}

Input<int64_t> integers(const py::object& obj, const char* name) {
  if (obj.is_none()) return {};
  auto t = int64_array(obj, name);
  return {t, view_of<const int64_t>(t)};
}

template <class T>
py::tuple attention_t(const py::object& q, const py::object& k, const py::object& v,
                      const py::object& mask_obj, const py::object& past_key,
                      const py::object& past_value, const py::object& nonpad,
                      const onnx::AttentionAttributes& attributes, bool qk_matmul_output) {
  const auto Q = input<T>(q, "Q"), K = input<T>(k, "K"), V = input<T>(v, "V");
  if (K.view.empty_view() || V.view.empty_view()) throw TypeError("onnx.attention: K and V are required");
  const auto pk = input<T>(past_key, "past_key"), pv = input<T>(past_value, "past_value");
  const auto lengths = integers(nonpad, "nonpad_kv_seqlen");
  onnx::AttentionMask<T> mask;
  py::object keep_mask;
  if (!mask_obj.is_none()) {
    const py::array m = as_numeric_array(mask_obj, "attn_mask");
    if (m.dtype().kind() == 'b') {
      auto b = as<bool>(m);
      keep_mask = b;
      mask = view_of<const bool>(b);
    } else if (m.dtype().kind() == 'f') {
      const auto f = input<T>(mask_obj, "attn_mask");
      keep_mask = f.keep;
      mask = f.view;
    } else {
      throw TypeError("attn_mask must be boolean (True = takes part) or floating (added to the "
                      "logits), got dtype " + std::string(py::str(m.dtype())));
    }
  }
  onnx::AttentionOutputs<T> out;
  {
    py::gil_scoped_release nogil;
    out = onnx::attention<T>(Q.view, K.view, V.view, mask, pk.view, pv.view, lengths.view, attributes,
                             qk_matmul_output);
  }
  return py::make_tuple(to_numpy(std::move(out.Y)), to_numpy(std::move(out.present_key)),
                        to_numpy(std::move(out.present_value)),
                        qk_matmul_output ? py::object(to_numpy(std::move(out.qk_matmul_output))) : py::none());
}

// The element type of Q (X): float16, float32 or float64.
template <class F>
auto by_dtype(const py::object& x, const char* op, const char* name, F f) {
  const py::array a = as_numeric_array(x, name);
  if (a.dtype().is(py::dtype("float16"))) return f(float16{});
  if (a.dtype().is(py::dtype::of<float>())) return f(float{});
  if (a.dtype().is(py::dtype::of<double>())) return f(double{});
  throw TypeError(std::string(op) + ": " + name + " must be float16, float32 or float64, got dtype " +
                  std::string(py::str(a.dtype())));
}

py::tuple py_onnx_attention(const py::object& q, const py::object& k, const py::object& v,
                            const py::object& attn_mask, const py::object& past_key,
                            const py::object& past_value, const py::object& nonpad_kv_seqlen,
                            const py::object& is_causal, const py::object& kv_num_heads,
                            const py::object& q_num_heads, const py::object& qk_matmul_output_mode,
                            const py::object& scale, double softcap,
                            const py::object& softmax_precision, const py::object& left_window_size,
                            const py::object& right_window_size, const py::object& opset,
                            bool qk_matmul_output) {
  onnx::AttentionAttributes a;
  a.is_causal = int_arg(is_causal, "is_causal");
  a.kv_num_heads = int_arg(kv_num_heads, "kv_num_heads");
  a.q_num_heads = int_arg(q_num_heads, "q_num_heads");
  a.qk_matmul_output_mode = int_arg(qk_matmul_output_mode, "qk_matmul_output_mode");
  if (!scale.is_none()) a.scale = scale.cast<double>();
  a.softcap = softcap;
  a.softmax_precision = softmax_precision.is_none() ? 0 : int_arg(softmax_precision, "softmax_precision");
  a.left_window_size = int_arg(left_window_size, "left_window_size");
  a.right_window_size = int_arg(right_window_size, "right_window_size");
  a.opset = int_arg(opset, "opset");
  return by_dtype(q, "onnx.attention", "Q", [&](auto t) {
    return attention_t<decltype(t)>(q, k, v, attn_mask, past_key, past_value, nonpad_kv_seqlen, a,
                                    qk_matmul_output);
  });
}

py::array py_onnx_rotary_embedding(const py::object& x, const py::object& cos_cache,
                                   const py::object& sin_cache, const py::object& position_ids,
                                   const py::object& interleaved, const py::object& num_heads,
                                   const py::object& rotary_embedding_dim) {
  onnx::RotaryEmbeddingAttributes a;
  a.interleaved = int_arg(interleaved, "interleaved");
  a.num_heads = int_arg(num_heads, "num_heads");
  a.rotary_embedding_dim = int_arg(rotary_embedding_dim, "rotary_embedding_dim");
  return by_dtype(x, "onnx.rotary_embedding", "X", [&](auto tag) -> py::array {
    using T = decltype(tag);
    const auto X = input<T>(x, "X"), cos = input<T>(cos_cache, "cos_cache"),
               sin = input<T>(sin_cache, "sin_cache");
    if (cos.view.empty_view() || sin.view.empty_view())
      throw TypeError("onnx.rotary_embedding: cos_cache and sin_cache are required");
    const auto positions = integers(position_ids, "position_ids");
    Tensor<T> y;
    {
      py::gil_scoped_release nogil;
      y = onnx::rotary_embedding<T>(X.view, cos.view, sin.view, positions.view, a);
    }
    return to_numpy(std::move(y));
  });
}

}  // namespace

void bind_onnx(py::module_& m) {
  using py::arg;
  m.def("onnx_attention", &py_onnx_attention, arg("Q"), arg("K"), arg("V"), arg("attn_mask") = py::none(),
        arg("past_key") = py::none(), arg("past_value") = py::none(),
        arg("nonpad_kv_seqlen") = py::none(), py::kw_only(), arg("is_causal") = 0,
        arg("kv_num_heads") = 0, arg("q_num_heads") = 0, arg("qk_matmul_output_mode") = 0,
        arg("scale") = py::none(), arg("softcap") = 0.0, arg("softmax_precision") = py::none(),
        arg("left_window_size") = -1, arg("right_window_size") = -1, arg("opset") = 25,
        arg("qk_matmul_output") = true, docs::kOnnxAttention);
  m.def("onnx_rotary_embedding", &py_onnx_rotary_embedding, arg("X"), arg("cos_cache"),
        arg("sin_cache"), arg("position_ids") = py::none(), py::kw_only(), arg("interleaved") = 0,
        arg("num_heads") = 0, arg("rotary_embedding_dim") = 0, docs::kOnnxRotaryEmbedding);
}

}  // namespace attn::python
