// Internal to the Python module: pieces shared by its source files.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <vector>

#include "attn/attention.hpp"
#include "attn/mask.hpp"
#include "attn/sparse_attention.hpp"

namespace attn::python {

namespace py = pybind11;

// causal=False | True | "bottom_right" | "top_left" | ("offset", k)
Causal causal_from(const py::object& c);

// The keyword arguments causal, scale, softcap and window of attn.attention
// (and of the layer's forward), checked and typed.
AttentionOptions attention_options(const py::object& causal, const py::object& scale,
                                   const py::object& softcap, const py::object& window);

// alibi_slopes=None | one slope per query head; sinks=None | one logit per
// query head.
std::vector<double> per_head_from(const py::object& o, const char* name, const char* what);
// precision=: 'f32', 'bf16' or 'int8' (TypeError for what is not a str).
Precision precision_arg(const py::object& o);

// sparse_attention's indices as int32 (any integer dtype; values beyond
// int32 refused, naming indices), and its keyword options.
py::array_t<int32_t> int32_indices(const py::object& obj);
SparseAttentionOptions sparse_options(const py::object& scale, const py::object& softcap, const py::object& sinks);

// attn's errors as Python's: TypeError, ValueError, OSError, RuntimeError.
void register_errors();

void bind_mha(py::module_& m);
void bind_mla(py::module_& m);
void bind_onnx(py::module_& m);
void bind_serving(py::module_& m);

}  // namespace attn::python
