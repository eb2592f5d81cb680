// Scalar and path arguments of the Python module. NumPy scalars and
// path-like objects are accepted wherever a Python int, bool or str is, as
// NumPy and the standard library do; a bool is never taken for an integer.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <string>

#include "attn/error.hpp"

namespace attn::python {

namespace py = pybind11;

inline std::string repr_of(const py::handle& o) { return py::repr(o); }

// True for Python's bool and numpy.bool_.
inline bool is_bool(const py::handle& o) {
  return py::isinstance<py::bool_>(o) ||
         py::isinstance(o, py::module_::import("numpy").attr("bool_"));
}

// Any integer (int, numpy.int64, anything with __index__) that fits int64.
inline int64_t int_arg(const py::handle& o, const std::string& name) {
  if (is_bool(o) || !PyIndex_Check(o.ptr()))
    throw TypeError(name + " must be an integer, got " + repr_of(o));
  const auto i = py::reinterpret_steal<py::object>(PyNumber_Index(o.ptr()));
  if (!i) throw py::error_already_set();
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow) throw ValueError(name + " must fit in int64, got " + repr_of(o));
  return v;
}

inline std::optional<int64_t> optional_int(const py::handle& o, const std::string& name) {
  if (o.is_none()) return std::nullopt;
  return int_arg(o, name);
}

inline std::string str_arg(const py::object& o, const char* name) {
  if (!py::isinstance<py::str>(o)) throw TypeError(std::string(name) + " must be a str, got " + repr_of(o));
  return o.cast<std::string>();
}

// A str, bytes or os.PathLike (pathlib.Path), as os.fspath reads it.
inline std::string path_arg(const py::handle& o, const std::string& name) {
  // As Python's own functions take them: os.fsencode gives a str's bytes in
  // the file system's encoding, with surrogateescape (a Latin-1 name listed
  // by os.listdir comes back to the same bytes), and bytes as they are.
  py::object p;
  try {
    p = py::module_::import("os").attr("fsencode")(o);
  } catch (const py::error_already_set&) {
    throw TypeError(name + " must be a str, bytes or path-like object, got " + repr_of(o));
  }
  return p.cast<std::string>();  // (bytes)
}

}  // namespace attn::python
