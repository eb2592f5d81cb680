// Internal to the Python module: pieces shared by its source files.
#pragma once

#include <pybind11/pybind11.h>

#include "attn/mask.hpp"

namespace attn::python {

namespace py = pybind11;

// causal=False | True | "bottom_right" | "top_left"
Causal causal_from(const py::object& c);

void bind_mha(py::module_& m);

}  // namespace attn::python
