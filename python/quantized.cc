// attn.quantize and attn.QuantizedTensor.
#include "quantized.hpp"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>
#include <string>

#include "args.hpp"
#include "arrays.hpp"
#include "docstrings.hpp"

namespace attn::python {
namespace {

KVDtype compact_dtype(const py::object& dtype, const char* where) {
  if (!py::isinstance<py::str>(dtype))
    throw TypeError(std::string(where) + ": dtype must be 'bf16', 'f16', 'q8_0' or 'q4_0', got " +
                    std::string(py::repr(dtype)));
  const auto name = dtype.cast<std::string>();
  if (name != "bf16" && name != "f16" && name != "q8_0" && name != "q4_0")
    throw ValueError(std::string(where) + ": dtype must be 'bf16', 'f16', 'q8_0' or 'q4_0', got '" + name + "'");
  return parse_kv_dtype(name);
}

template <class S>
PyQuantizedTensor owning(KVDtype dtype, const Shape& shape, Tensor<S>&& t) {
  auto held = std::make_shared<Tensor<S>>(std::move(t));
  return {dtype, shape, reinterpret_cast<const std::byte*>(held->data()), held};
}

PyQuantizedTensor py_quantize(const py::object& x_obj, const py::object& dtype_obj) {
  const KVDtype dtype = compact_dtype(dtype_obj, "quantize");
  auto a = as<float>(as_numeric_array(x_obj, "x"));
  const auto x = view_of<const float>(a);
  const Shape shape = x.shape();
  if (is_block_dtype(dtype) && (shape.empty() || shape.back() % 32 != 0))
    throw ValueError(std::string("quantize: ") + kv_dtype_name(dtype) + " stores blocks of 32 values along the last "
                     "axis, so its length must be a multiple of 32, got shape " + shape_str(shape));
  py::gil_scoped_release nogil;
  if (dtype == KVDtype::BF16) return owning(dtype, shape, to_bfloat16(x));
  if (dtype == KVDtype::F16) return owning(dtype, shape, to_float16(x));
  if (dtype == KVDtype::Q4_0) return owning(dtype, shape, quantize_q4_0(x));
  return owning(dtype, shape, quantize_q8_0(x));
}

// Holds a buffer export (released with the GIL held: Python frees the
// QuantizedTensor, which is the only owner).
struct BufferExport {
  py::buffer_info info;
};

PyQuantizedTensor from_buffer(const py::buffer& buf, const py::object& dtype_obj,
                              const py::object& shape_obj) {
  const KVDtype dtype = compact_dtype(dtype_obj, "QuantizedTensor.from_buffer");
  Shape shape;
  if (!py::isinstance<py::sequence>(shape_obj) || py::isinstance<py::str>(shape_obj))
    throw TypeError("QuantizedTensor.from_buffer: shape must be a sequence of integers, got " +
                    std::string(py::repr(shape_obj)));
  for (const auto& n : shape_obj) {
    const int64_t dim = int_arg(n, "QuantizedTensor.from_buffer: shape entries");
    if (dim < 0) throw ValueError("QuantizedTensor.from_buffer: negative dimension in shape " + std::string(py::repr(shape_obj)));
    shape.push_back(dim);
  }
  if (is_block_dtype(dtype) && (shape.empty() || shape.back() % 32 != 0))
    throw ValueError(std::string("QuantizedTensor.from_buffer: ") + kv_dtype_name(dtype) +
                     "'s last axis must be a multiple of 32, got shape " + shape_str(shape));
  const int64_t want = kv_dtype_bytes(dtype, checked_numel(shape, 4, "QuantizedTensor.from_buffer"));
  auto held = std::make_shared<BufferExport>(BufferExport{buf.request()});
  const py::buffer_info& info = held->info;
  int64_t bytes = info.itemsize;  // the stride a C-contiguous axis has, then the total
  for (py::ssize_t a = info.ndim - 1; a >= 0; --a) {
    if (info.shape[a] != 1 && info.strides[a] != bytes)
      throw ValueError("QuantizedTensor.from_buffer: the buffer must be C-contiguous");
    bytes *= info.shape[a];
  }
  if (bytes != want)
    throw ValueError("QuantizedTensor.from_buffer: " + std::string(kv_dtype_name(dtype)) + " of shape " +
                     shape_str(shape) + " takes " + std::to_string(want) + " bytes, the buffer holds " +
                     std::to_string(bytes));
  if (reinterpret_cast<uintptr_t>(info.ptr) % 2 != 0)
    throw ValueError("QuantizedTensor.from_buffer: the buffer's address must be 2-byte aligned "
                     "(its fp16 scales and 16-bit values are read as such)");
  return {dtype, shape, static_cast<const std::byte*>(info.ptr), held};
}

py::array dequantize(const PyQuantizedTensor& t) {
  return t.visit([&](auto v) -> py::array {
    Tensor<float> out;
    {
      py::gil_scoped_release nogil;
      out = attn::dequantize(v);
    }
    return to_numpy(std::move(out));
  });
}

py::tuple shape_tuple(const Shape& s) {
  py::tuple t(s.size());
  for (size_t i = 0; i < s.size(); ++i) t[i] = py::int_(s[i]);
  return t;
}

// Pickling (and copy.deepcopy): the dtype, the logical shape and the bytes;
// the copy owns bytes of its own, also of a tensor that wrapped a buffer.
py::tuple quantized_state(const PyQuantizedTensor& t) {
  return py::make_tuple(kv_dtype_name(t.dtype), shape_tuple(t.shape),
                        py::bytes(reinterpret_cast<const char*>(t.data), static_cast<size_t>(t.nbytes())));
}

PyQuantizedTensor quantized_from_state(const py::tuple& state) {
  if (state.size() != 3) throw ValueError("QuantizedTensor: not a pickled tensor's state");
  const KVDtype dtype = compact_dtype(state[0], "QuantizedTensor");
  Shape shape;
  for (const auto& d : state[1]) shape.push_back(d.cast<int64_t>());
  const std::string bytes = state[2].cast<std::string>();
  const auto make = [&](auto element) {
    using S = decltype(element);
    Shape stored = shape;
    stored.back() /= kBlockValues<S>;
    Tensor<S> t(stored);
    if (bytes.size() != static_cast<size_t>(t.numel()) * sizeof(S))
      throw ValueError("QuantizedTensor: a pickled tensor's bytes do not fit its shape " + shape_str(shape));
    std::memcpy(t.data(), bytes.data(), bytes.size());
    return owning(dtype, shape, std::move(t));
  };
  if (dtype == KVDtype::BF16) return make(bfloat16{});
  if (dtype == KVDtype::F16) return make(float16{});
  if (dtype == KVDtype::Q4_0) return make(block_q4_0{});
  return make(block_q8_0{});
}

}  // namespace

void bind_quantized(py::module_& m) {
  using py::arg;
  py::class_<PyQuantizedTensor>(m, "QuantizedTensor", py::buffer_protocol(), docs::kQuantizedTensor)
      .def_buffer([](const PyQuantizedTensor& t) {  // its bytes, read-only: memoryview(t)
        return py::buffer_info(const_cast<std::byte*>(t.data), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {t.nbytes()}, {1}, /*readonly=*/true);
      })
      .def_property_readonly("dtype", [](const PyQuantizedTensor& t) { return kv_dtype_name(t.dtype); })
      .def_property_readonly("shape", [](const PyQuantizedTensor& t) { return shape_tuple(t.shape); })
      .def_property_readonly("ndim", [](const PyQuantizedTensor& t) { return t.shape.size(); })
      .def_property_readonly("nbytes", &PyQuantizedTensor::nbytes)
      .def("dequantize", &dequantize,
           "dequantize() -> numpy.ndarray: the values as float32, of this tensor's shape.")
      .def_static("from_buffer", &from_buffer, arg("buffer"), arg("dtype"), arg("shape"),
                  docs::kFromBuffer)
      .def(py::pickle(&quantized_state, &quantized_from_state))
      .def("__repr__", [](const PyQuantizedTensor& t) {
        return "attn.QuantizedTensor(dtype='" + std::string(kv_dtype_name(t.dtype)) + "', shape=" +
               std::string(py::repr(shape_tuple(t.shape))) + ", nbytes=" + std::to_string(t.nbytes()) + ")";
      });
  m.def("quantize", &py_quantize, arg("x"), arg("dtype"), docs::kQuantize);
}

}  // namespace attn::python
