// NumPy arrays <-> attn views for the Python module: zero-copy where the
// dtype already matches, conversion otherwise, and the dtype rules of
// docs/semantics.md "Dtypes".
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <map>
#include <string>

#include "attn/error.hpp"
#include "attn/half.hpp"
#include "attn/mask.hpp"
#include "attn/tensor.hpp"
#include "quantized.hpp"

namespace attn::python {

namespace py = pybind11;

// Any array-like as an ndarray; refuses non-numeric dtypes with a TypeError
// that names the argument.
inline py::array as_numeric_array(const py::handle& obj, const char* name) {
  // (Its buffer is its bytes: read as an array, they were taken for values.)
  if (py::isinstance<PyQuantizedTensor>(obj)) throw TypeError(quantized_refused(obj.cast<const PyQuantizedTensor&>(), name));
  py::array a = py::array::ensure(obj);
  if (!a) {
    // numpy.asarray again, for its reason (a torch tensor that requires grad
    // says to call .detach()).
    std::string why;
    try {
      py::module_::import("numpy").attr("asarray")(obj);
    } catch (const py::error_already_set& e) {
      why = std::string(": ") + e.what();
    }
    throw TypeError(std::string(name) + " must be an array, got " +
                    std::string(py::str(py::type::of(obj))) + why);
  }
  const char kind = a.dtype().kind();
  if (kind != 'f' && kind != 'i' && kind != 'u' && kind != 'b')
    throw TypeError(std::string(name) + " must be a numeric array, got dtype " +
                    std::string(py::str(a.dtype())));
  return a;
}

inline bool is_float64(const py::array& a) { return a.dtype().is(py::dtype::of<double>()); }

// An integer array (TypeError naming `name` for any other dtype) as int64;
// unsigned values past INT64_MAX are a ValueError showing them, never
// wrapped to negative ones (2^64 - 1 was reported as -1).
inline py::array_t<int64_t> int64_array(const py::object& obj, const char* name) {
  const py::array a = as_numeric_array(obj, name);
  if (a.dtype().kind() != 'i' && a.dtype().kind() != 'u')
    throw TypeError(std::string(name) + " must be an integer array, got dtype " + std::string(py::str(a.dtype())));
  if (a.dtype().kind() == 'u' && a.dtype().itemsize() == 8 && a.size() > 0) {
    const py::object max = py::module_::import("numpy").attr("max")(a);
    if (max.cast<uint64_t>() > uint64_t(INT64_MAX))
      throw ValueError(std::string(name) + " must fit in int64, got " + std::string(py::str(max)));
  }
  return py::array_t<int64_t>::ensure(a);
}

// The array converted to T when needed (no copy when it already is T). The
// result keeps its strides, so a non-contiguous view is still used in place.
template <class T>
py::array_t<T> as(const py::array& a) {
  if (py::isinstance<py::array_t<T>>(a) && a.dtype().is(py::dtype::of<T>()))
    return py::reinterpret_borrow<py::array_t<T>>(a);
  return py::array_t<T>::ensure(a);
}

// A view of the array's memory; byte strides that are not whole elements
// (rare, e.g. fields of a structured array) go through a contiguous copy.
template <class T>
TensorView<T> view_of(py::array_t<std::remove_const_t<T>>& a) {
  Shape shape(a.shape(), a.shape() + a.ndim());
  Strides strides(a.ndim());
  for (py::ssize_t i = 0; i < a.ndim(); ++i) {
    if (a.strides(i) % static_cast<py::ssize_t>(sizeof(T)) != 0) {
      a = py::array_t<std::remove_const_t<T>, py::array::c_style>::ensure(a);
      return view_of<T>(a);
    }
    strides[i] = a.strides(i) / static_cast<py::ssize_t>(sizeof(T));
  }
  if constexpr (std::is_const_v<T>)
    return TensorView<T>(a.data(), shape, strides);
  else
    return TensorView<T>(a.mutable_data(), shape, strides);
}

// float16 with whole-element strides (an as_strided view may have others).
inline bool is_float16(const py::array& a) {
  if (!a.dtype().is(py::dtype("float16"))) return false;
  for (py::ssize_t i = 0; i < a.ndim(); ++i)
    if (a.strides(i) % 2 != 0) return false;
  return reinterpret_cast<uintptr_t>(a.data()) % 2 == 0;
}

// A NumPy float16 array (is_float16) as the library's fp16 view, in place.
inline TensorView<const float16> half_view(const py::array& a) {
  Shape shape(a.shape(), a.shape() + a.ndim());
  Strides strides;
  for (py::ssize_t i = 0; i < a.ndim(); ++i) strides.push_back(a.strides(i) / 2);
  return TensorView<const float16>(static_cast<const float16*>(a.data()), shape, strides);
}

// A new C-contiguous array of this shape.
template <class T>
py::array_t<T> empty(const Shape& shape) {
  const int64_t n = checked_numel(shape, sizeof(T), "output");
  try {
    return py::array_t<T>(std::vector<py::ssize_t>(shape.begin(), shape.end()));
  } catch (const py::error_already_set& e) {
    if (!e.matches(PyExc_MemoryError)) throw;
    throw ValueError("cannot allocate " + std::to_string(n * int64_t(sizeof(T))) +
                     " bytes for an output of shape " + shape_str(shape));
  }
}

}  // namespace attn::python

namespace attn::python {

// Hands a Tensor's buffer to NumPy without copying; the array owns it.
template <class T>
py::array_t<T> to_numpy(Tensor<T>&& t) {
  auto* owner = new Tensor<T>(std::move(t));
  py::capsule free_when_done(owner, [](void* p) { delete static_cast<Tensor<T>*>(p); });
  const Shape& s = owner->shape();
  return py::array_t<T>(std::vector<py::ssize_t>(s.begin(), s.end()), owner->data(),
                        free_when_done);
}
// The same for fp16, as a NumPy float16 array.
inline py::array to_numpy(Tensor<float16>&& t) {
  auto* owner = new Tensor<float16>(std::move(t));
  py::capsule free_when_done(owner, [](void* p) { delete static_cast<Tensor<float16>*>(p); });
  const Shape& s = owner->shape();
  return py::array(py::dtype("float16"), std::vector<py::ssize_t>(s.begin(), s.end()),
                   owner->data(), free_when_done);
}

}  // namespace attn::python

namespace attn::python {

// How a mask argument reads integer dtypes. attention() follows
// scaled_dot_product_attention (bool or float only: an integer 0/1 mask added
// to the logits would silently mean something else); the layer follows
// nn.MultiheadAttention, which reads uint8 as boolean.
enum class IntegerMask { Refuse, Uint8AsBool };

// A mask argument: boolean, or additive in float32/float64 (other float
// dtypes become float32). Keeps the converted arrays alive while the library
// reads them.
struct MaskArg {
  py::array_t<bool> b;
  py::array_t<float> f;
  py::array_t<double> d;
  Mask mask;

  MaskArg(const py::object& obj, const char* name, IntegerMask integers) {
    if (obj.is_none()) return;
    const auto m = as_numeric_array(obj, name);
    const char kind = m.dtype().kind();
    const bool as_bool = kind == 'b' || (kind == 'u' && m.dtype().itemsize() == 1 &&
                                         integers == IntegerMask::Uint8AsBool);
    if (!as_bool && (kind == 'i' || kind == 'u'))
      throw TypeError(std::string(name) + " must be a bool or float array" +
                      (integers == IntegerMask::Uint8AsBool ? " (or uint8, read as bool)" : "") +
                      ", got dtype " + std::string(py::str(m.dtype())) +
                      "; convert it: mask.astype(bool) to allow/block, or a float for additive values");
    if (as_bool)
      b = as<bool>(m), mask = view_of<const bool>(b);
    else if (is_float64(m))
      d = as<double>(m), mask = view_of<const double>(d);
    else
      f = as<float>(m), mask = view_of<const float>(f);
  }
};

// A state dict {name: array} as float32 tensors (copies), for load_state_dict;
// a value that is not numeric is a TypeError naming state_dict['name'].
inline std::map<std::string, Tensor<float>> float_tensors(const py::dict& d) {
  std::map<std::string, Tensor<float>> s;
  for (const auto& [key, value] : d) {
    const std::string name = py::str(key);
    auto a = as<float>(as_numeric_array(value, ("state_dict['" + name + "']").c_str()));
    s.emplace(name, contiguous(view_of<const float>(a)));
  }
  return s;
}

}  // namespace attn::python
