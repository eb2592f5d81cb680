// The arguments every attention binding shares (causal, window, scale,
// softcap, per-head arrays) and the translation of attn's errors into
// Python's: compiled into each extension module (attn._core, attn._dist).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "args.hpp"
#include "arrays.hpp"
#include "attn/error.hpp"
#include "attn/file.hpp"
#include "bindings.hpp"

namespace attn::python {

Causal causal_from(const py::object& c) {
  static const std::string kAccepted =
      "False, True, 'bottom_right', 'top_left', 'none' or ('offset', k)";
  if (c.is_none()) return Causal::None;
  if (is_bool(c)) return py::cast<bool>(py::bool_(c)) ? Causal::BottomRight : Causal::None;
  if (py::isinstance<py::str>(c)) {
    const auto name = c.cast<std::string>();
    try {
      return parse_causal(name);
    } catch (const ValueError&) {
      throw ValueError("causal must be " + kAccepted + ", got '" + name + "'");
    }
  }
  if (py::isinstance<py::tuple>(c) && py::len(c) == 2 && py::isinstance<py::str>(c[py::int_(0)]) &&
      c[py::int_(0)].cast<std::string>() == "offset")
    return Causal::offset(int_arg(c[py::int_(1)], "causal=('offset', k): k"));
  throw TypeError("causal must be " + kAccepted + ", got " + std::string(py::repr(c)));
}

namespace {

Window window_from(const py::object& w) {
  if (w.is_none()) return {};
  const auto side = [](const py::handle& h) -> int64_t {
    if (h.is_none()) return -1;
    return int_arg(h, "window sizes (integers or None)");
  };
  if (!py::isinstance<py::sequence>(w) || py::isinstance<py::str>(w) || py::len(w) != 2)
    throw TypeError("window must be None or a pair (left, right), got " +
                    std::string(py::repr(w)));
  return {side(w[py::int_(0)]), side(w[py::int_(1)])};
}

std::optional<double> optional_float(const py::object& o, const char* name) {
  if (o.is_none()) return std::nullopt;
  try {
    return o.cast<double>();
  } catch (const py::cast_error&) {
    throw TypeError(std::string(name) + " must be a number or None, got " +
                    std::string(py::repr(o)));
  }
}

}  // namespace

std::vector<double> per_head_from(const py::object& o, const char* name, const char* what) {
  if (o.is_none()) return {};
  auto a = as<double>(as_numeric_array(o, name));
  if (a.ndim() != 1)
    throw ValueError(std::string(name) + " must be a 1-D array, one " + what + " per query head, got shape " +
                     shape_str(Shape(a.shape(), a.shape() + a.ndim())));
  std::vector<double> values(static_cast<size_t>(a.shape(0)));
  for (py::ssize_t h = 0; h < a.shape(0); ++h) values[h] = a.at(h);
  return values;
}

Precision precision_arg(const py::object& o) {
  if (!py::isinstance<py::str>(o))
    throw TypeError("precision must be 'f32', 'bf16' or 'int8', got " + repr_of(o));
  return parse_precision(o.cast<std::string>());
}

AttentionOptions attention_options(const py::object& causal, const py::object& scale,
                              const py::object& softcap, const py::object& window) {
  AttentionOptions opt;
  opt.causal = causal_from(causal);
  opt.scale = optional_float(scale, "scale");
  opt.softcap = optional_float(softcap, "softcap").value_or(0.0);
  opt.window = window_from(window);
  return opt;
}

namespace {

// A message as a Python str: bytes that are not UTF-8 (a path or a header
// key read from a file) as \xNN, never an exception without its message.
py::str message_of(const std::string& text) {
  PyObject* s = PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "backslashreplace");
  if (!s) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(s);
}

void set_error(PyObject* type, const char* what) { PyErr_SetObject(type, message_of(what).ptr()); }

}  // namespace

void register_errors() {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const attn::TypeError& e) {
      set_error(PyExc_TypeError, e.what());
    } catch (const attn::ValueError& e) {
      set_error(PyExc_ValueError, e.what());
    } catch (const attn::KeyError& e) {
      set_error(PyExc_KeyError, e.what());
    } catch (const attn::IOError& e) {
      if (!e.error_number()) return set_error(PyExc_OSError, e.what());
      // OSError(errno, reason, filename) is the subclass the errno names
      // (FileNotFoundError, PermissionError, ...), as open() raises; the
      // filename decoded as the file system's (os.fsdecode).
      PyObject* name = PyUnicode_DecodeFSDefaultAndSize(e.path().data(), static_cast<Py_ssize_t>(e.path().size()));
      if (!name) throw py::error_already_set();
      const py::object error = py::reinterpret_borrow<py::object>(PyExc_OSError)(
          e.error_number(), message_of(e.what_failed() + ": " + std::strerror(e.error_number())),
          py::reinterpret_steal<py::object>(name));
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
    } catch (const attn::RuntimeError& e) {
      set_error(PyExc_RuntimeError, e.what());
    } catch (const attn::MemoryError& e) {
      set_error(PyExc_MemoryError, e.what());
    } catch (const attn::Error& e) {
      set_error(PyExc_ValueError, e.what());
    }
  });
}

}  // namespace attn::python
