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
    throw TypeError(std::string(where) + ": dtype must be 'bf16', 'f16', 'q8_0', 'q4_0' or 'int4', got " +
                    std::string(py::repr(dtype)));
  const auto name = dtype.cast<std::string>();
  if (name != "bf16" && name != "f16" && name != "q8_0" && name != "q4_0" && name != "int4")
    throw ValueError(std::string(where) + ": dtype must be 'bf16', 'f16', 'q8_0', 'q4_0' or 'int4', got '" + name + "'");
  return parse_kv_dtype(name);
}

// int4's grouping, KIVI's: per='channel' (keys: a block per channel and
// group of 32 tokens along axis -2) or 'token' (values: along the last
// axis); None for the other dtypes. Checks the shape it needs.
bool per_channel_arg(KVDtype dtype, const py::object& per, const Shape& shape, const char* where) {
  const std::string name = per.is_none() ? "" : str_arg(per, (std::string(where) + ": per").c_str());
  if (dtype != KVDtype::INT4) {
    if (!per.is_none())
      throw ValueError(std::string(where) + ": per applies to int4 only (" + kv_dtype_name(dtype) +
                       " stores blocks along the last axis), got per='" + name + "'");
  } else if (name != "channel" && name != "token") {
    throw ValueError(std::string(where) + ": int4 needs per='channel' (keys: a block per channel and group of 32 "
                     "tokens) or per='token' (values), got " + (per.is_none() ? std::string("None") : "'" + name + "'"));
  }
  const bool channel = name == "channel";
  if (channel && shape.size() < 2)
    throw ValueError(std::string(where) + ": int4 keys (per='channel') are (..., n, d), got shape " + shape_str(shape));
  if (!channel && is_block_dtype(dtype) && (shape.empty() || shape.back() % 32 != 0))
    throw ValueError(std::string(where) + ": " + kv_dtype_name(dtype) + " stores blocks of 32 values along the last "
                     "axis, so its length must be a multiple of 32, got shape " + shape_str(shape));
  return channel;
}

template <class S>
PyQuantizedTensor owning(KVDtype dtype, const Shape& shape, Tensor<S>&& t, bool per_channel = false) {
  auto held = std::make_shared<Tensor<S>>(std::move(t));
  return {dtype, shape, reinterpret_cast<const std::byte*>(held->data()), held, per_channel};
}

PyQuantizedTensor py_quantize(const py::object& x_obj, const py::object& dtype_obj, const py::object& per) {
  const KVDtype dtype = compact_dtype(dtype_obj, "quantize");
  auto a = as<float>(as_numeric_array(x_obj, "x"));
  const auto x = view_of<const float>(a);
  const Shape shape = x.shape();
  const bool per_channel = per_channel_arg(dtype, per, shape, "quantize");
  py::gil_scoped_release nogil;
  if (dtype == KVDtype::BF16) return owning(dtype, shape, to_bfloat16(x));
  if (dtype == KVDtype::F16) return owning(dtype, shape, to_float16(x));
  if (dtype == KVDtype::Q4_0) return owning(dtype, shape, quantize_q4_0(x));
  if (dtype == KVDtype::INT4)
    return owning(dtype, shape, per_channel ? quantize_int4_keys(x) : quantize_int4_values(x), per_channel);
  return owning(dtype, shape, quantize_q8_0(x));
}

// Holds a buffer export (released with the GIL held: Python frees the
// QuantizedTensor, which is the only owner).
struct BufferExport {
  py::buffer_info info;
};

PyQuantizedTensor from_buffer(const py::buffer& buf, const py::object& dtype_obj, const py::object& shape_obj,
                              const py::object& per) {
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
  const bool per_channel = per_channel_arg(dtype, per, shape, "QuantizedTensor.from_buffer");
  checked_numel(shape, 4, "QuantizedTensor.from_buffer");
  const int64_t want = PyQuantizedTensor{dtype, shape, nullptr, nullptr, per_channel}.nbytes();
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
  return {dtype, shape, static_cast<const std::byte*>(info.ptr), held, per_channel};
}

py::array dequantize(const PyQuantizedTensor& t) {
  return t.visit([&](auto v) -> py::array {
    Tensor<float> out;
    {
      py::gil_scoped_release nogil;
      using S = std::remove_const_t<std::remove_reference_t<decltype(*v.data())>>;
      if constexpr (std::is_same_v<S, block_int4>)
        out = t.per_channel ? dequantize_int4_keys(v, t.shape[t.shape.size() - 2]) : dequantize_int4_values(v);
      else
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
  const py::object per = t.dtype != KVDtype::INT4 ? py::object(py::none()) : py::str(t.per_channel ? "channel" : "token");
  return py::make_tuple(kv_dtype_name(t.dtype), shape_tuple(t.shape),
                        py::bytes(reinterpret_cast<const char*>(t.data), static_cast<size_t>(t.nbytes())), per);
}

PyQuantizedTensor quantized_from_state(const py::tuple& state) {
  if (state.size() != 3 && state.size() != 4) throw ValueError("QuantizedTensor: not a pickled tensor's state");
  const KVDtype dtype = compact_dtype(state[0], "QuantizedTensor");
  Shape shape;
  for (const auto& d : state[1]) shape.push_back(d.cast<int64_t>());
  const std::string bytes = state[2].cast<std::string>();
  const bool per_channel = per_channel_arg(dtype, state.size() == 4 ? py::object(state[3]) : py::none(), shape,
                                           "QuantizedTensor");
  const auto make = [&](auto element) {
    using S = decltype(element);
    Tensor<S> t(PyQuantizedTensor::stored_shape(dtype, shape, per_channel));
    if (bytes.size() != static_cast<size_t>(t.numel()) * sizeof(S))
      throw ValueError("QuantizedTensor: a pickled tensor's bytes do not fit its shape " + shape_str(shape));
    std::memcpy(t.data(), bytes.data(), bytes.size());
    return owning(dtype, shape, std::move(t), per_channel);
  };
  if (dtype == KVDtype::BF16) return make(bfloat16{});
  if (dtype == KVDtype::F16) return make(float16{});
  if (dtype == KVDtype::Q4_0) return make(block_q4_0{});
  if (dtype == KVDtype::INT4) return make(block_int4{});
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
      .def_property_readonly("per", [](const PyQuantizedTensor& t) -> py::object {
        if (t.dtype != KVDtype::INT4) return py::none();
        return py::str(t.per_channel ? "channel" : "token");
      })
      .def("dequantize", &dequantize,
           "dequantize() -> numpy.ndarray: the values as float32, of this tensor's shape.")
      .def_static("from_buffer", &from_buffer, arg("buffer"), arg("dtype"), arg("shape"), py::kw_only(),
                  arg("per") = py::none(), docs::kFromBuffer)
      .def(py::pickle(&quantized_state, &quantized_from_state))
      .def("__repr__", [](const PyQuantizedTensor& t) {
        return "attn.QuantizedTensor(dtype='" + std::string(kv_dtype_name(t.dtype)) + "', shape=" +
               std::string(py::repr(shape_tuple(t.shape))) +
               (t.dtype == KVDtype::INT4 ? std::string(", per='") + (t.per_channel ? "channel" : "token") + "'" : "") +
               ", nbytes=" + std::to_string(t.nbytes()) + ")";
      });
  m.def("quantize", &py_quantize, arg("x"), arg("dtype"), py::kw_only(), arg("per") = py::none(), docs::kQuantize);
}

}  // namespace attn::python
