// Internal to the Python module: attn.QuantizedTensor, keys or values stored
// compactly (bf16, f16, q8_0, q4_0 or int4: attn/quantize.hpp), owned or over
// a buffer another engine filled.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <optional>
#include <string>
#include <type_traits>

#include "attn/quantize.hpp"
#include "attn/tensor.hpp"

namespace attn::python {

namespace py = pybind11;

struct PyQuantizedTensor {
  KVDtype dtype;
  Shape shape;                   // the logical shape (a block row's values, not its blocks)
  const std::byte* data;         // C-contiguous storage
  std::shared_ptr<const void> owner;  // keeps data alive: a Tensor, or a buffer export
  bool per_channel = false;      // int4 keys: a block per channel and group of 32 tokens

  // The shape stored: q8_0, q4_0 and int4 (..., n / 32) blocks; int4 per
  // channel (..., ⌈n / 32⌉, d).
  static Shape stored_shape(KVDtype dtype, Shape s, bool per_channel) {
    if (per_channel) s[s.size() - 2] = (s[s.size() - 2] + kInt4Group - 1) / kInt4Group;
    else if (is_block_dtype(dtype)) s.back() /= 32;
    return s;
  }
  static int64_t element_bytes(KVDtype dtype) {
    switch (dtype) {
      case KVDtype::Q8_0: return sizeof(block_q8_0);
      case KVDtype::Q4_0: return sizeof(block_q4_0);
      case KVDtype::INT4: return sizeof(block_int4);
      default: return 2;
    }
  }
  int64_t nbytes() const { return numel_of(stored_shape(dtype, shape, per_channel)) * element_bytes(dtype); }

  // f(view) with the view of the storage type (stored_shape).
  template <class F>
  decltype(auto) visit(F&& f) const {
    switch (dtype) {
      case KVDtype::BF16: return f(view<bfloat16>());
      case KVDtype::F16: return f(view<float16>());
      case KVDtype::Q4_0: return f(view<block_q4_0>());
      case KVDtype::INT4: return f(view<block_int4>());
      default: return f(view<block_q8_0>());
    }
  }

 private:
  template <class S>
  TensorView<const S> view() const {
    return TensorView<const S>(reinterpret_cast<const S*>(data), stored_shape(dtype, shape, per_channel));
  }
};

// The shape of a view's values: a block type's last axis counts blocks of 32.
template <class KV>
Shape values_shape(const TensorView<const KV>& t) {
  Shape s = t.shape();
  if (!s.empty()) s.back() *= kBlockValues<KV>;
  return s;
}

// k and v as the attention functions read them: when either is an
// attn.QuantizedTensor (then both must be, stored alike, with float32 q:
// TypeError naming `function` otherwise), f(k, v) with views of their
// storage type (q8_0, q4_0: (..., d / 32) blocks); nullopt when neither is.
// int4 only where kTakesInt4 (attention, and batch_attention's HND pools,
// whose page axis is the keys' axis -2: the functions that read its
// per-channel keys), k per channel and v per token.
template <bool kTakesInt4 = false, class F>
std::optional<py::object> on_quantized_kv(const char* function, const py::object& q_obj, const py::object& k_obj,
                                          const py::object& v_obj, F&& f) {
  const bool k_quantized = py::isinstance<PyQuantizedTensor>(k_obj), v_quantized = py::isinstance<PyQuantizedTensor>(v_obj);
  if (!k_quantized && !v_quantized) return std::nullopt;
  if (!k_quantized || !v_quantized)
    throw TypeError(std::string(function) + ": k and v must both be attn.QuantizedTensor or both arrays, got " +
                    std::string(py::str(py::type::of(k_obj))) + " and " + std::string(py::str(py::type::of(v_obj))));
  const auto& k = k_obj.cast<const PyQuantizedTensor&>();
  const auto& v = v_obj.cast<const PyQuantizedTensor&>();
  if (k.dtype != v.dtype)
    throw TypeError(std::string(function) + ": k and v must be stored alike, got k " + kv_dtype_name(k.dtype) +
                    " and v " + kv_dtype_name(v.dtype));
  if (k.dtype == KVDtype::INT4 && !kTakesInt4)
    throw TypeError(std::string(function) + ": int4 keys and values are read by attn.attention and "
                    "attn.batch_attention only (its keys are stored per channel): pass k.dequantize() and "
                    "v.dequantize(), or another dtype");
  if (k.dtype == KVDtype::INT4 && (!k.per_channel || v.per_channel))
    throw TypeError(std::string(function) + ": int4 keys are quantized per='channel' and values per='token', got k "
                    "per='" + (k.per_channel ? "channel" : "token") + "' and v per='" + (v.per_channel ? "channel" : "token") + "'");
  const py::array q = py::array::ensure(q_obj);
  if (q && q.dtype().is(py::dtype::of<double>()))
    throw TypeError(std::string(function) + ": q is float64, but quantized k and v (" + kv_dtype_name(k.dtype) +
                    ") are read with float32 queries: pass q as float32");
  return k.visit([&](auto kv) {
    using S = std::remove_const_t<std::remove_reference_t<decltype(*kv.data())>>;
    return v.visit([&](auto vv) -> py::object {
      using SV = std::remove_const_t<std::remove_reference_t<decltype(*vv.data())>>;
      if constexpr (std::is_same_v<S, SV> && (kTakesInt4 || !std::is_same_v<S, block_int4>)) return f(kv, vv);
      else throw TypeError(std::string(function) + ": k and v must be stored alike");  // (checked above)
    });
  });
}

// A message for an attn.QuantizedTensor given where an array is read: what
// it is, and what to do.
inline std::string quantized_refused(const PyQuantizedTensor& t, const char* name) {
  return std::string(name) + " is an attn.QuantizedTensor (" + kv_dtype_name(t.dtype) + ", shape " +
         shape_str(t.shape) + "), read quantized only as the keys and values of attention, attention_backward, "
         "attention_varlen, scaled_dot_product_attention and attn.dist: pass " + name +
         ".dequantize() for its float32 values";
}

void bind_quantized(py::module_& m);

}  // namespace attn::python
