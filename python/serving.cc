// attn._core's serving functions: merge_state, merge_state_in_place and
// merge_states (FlashInfer's names and layouts: v (n, H, D), s (n, H)).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "arrays.hpp"
#include "attn/cascade.hpp"
#include "bindings.hpp"
#include "docstrings.hpp"

namespace attn::python {
namespace {

template <class T>
py::tuple merged(MergedState<T>&& m) {
  return py::make_tuple(to_numpy(std::move(m.v)), to_numpy(std::move(m.s)));
}

// float64 when every array is float64, else float32 (the others converted).
bool all_float64(std::initializer_list<py::array> arrays) {
  for (const py::array& a : arrays)
    if (!is_float64(a)) return false;
  return true;
}

template <class T>
py::tuple merge_state_t(const py::array& v_a, const py::array& s_a, const py::array& v_b, const py::array& s_b) {
  auto va = as<T>(v_a), sa = as<T>(s_a), vb = as<T>(v_b), sb = as<T>(s_b);
  const auto views = std::make_tuple(view_of<const T>(va), view_of<const T>(sa), view_of<const T>(vb),
                                     view_of<const T>(sb));
  MergedState<T> m;
  {
    py::gil_scoped_release nogil;
    m = std::apply([](auto... v) { return merge_state<T>(v...); }, views);
  }
  return merged(std::move(m));
}

py::tuple py_merge_state(const py::object& v_a, const py::object& s_a, const py::object& v_b, const py::object& s_b) {
  const py::array a[] = {as_numeric_array(v_a, "v_a"), as_numeric_array(s_a, "s_a"), as_numeric_array(v_b, "v_b"),
                         as_numeric_array(s_b, "s_b")};
  return all_float64({a[0], a[1], a[2], a[3]}) ? merge_state_t<double>(a[0], a[1], a[2], a[3])
                                                : merge_state_t<float>(a[0], a[1], a[2], a[3]);
}

py::tuple py_merge_states(const py::object& vs_obj, const py::object& ss_obj) {
  const py::array vs = as_numeric_array(vs_obj, "vs"), ss = as_numeric_array(ss_obj, "ss");
  const auto run = [&](auto zero) {
    using T = decltype(zero);
    auto v = as<T>(vs), s = as<T>(ss);
    const auto vv = view_of<const T>(v);
    const auto sv = view_of<const T>(s);
    MergedState<T> m;
    {
      py::gil_scoped_release nogil;
      m = merge_states<T>(vv, sv);
    }
    return merged(std::move(m));
  };
  return all_float64({vs, ss}) ? run(0.0) : run(0.0f);
}

// v and s are written in place: writable float32 or float64 arrays, both of
// one dtype (the others are converted to it).
void py_merge_state_in_place(const py::object& v_obj, const py::object& s_obj, const py::object& v_other,
                             const py::object& s_other) {
  const py::array v = as_numeric_array(v_obj, "v"), s = as_numeric_array(s_obj, "s");
  const auto run = [&](auto zero) {
    using T = decltype(zero);
    for (const auto& [a, name] : {std::pair{v, "v"}, std::pair{s, "s"}}) {
      if (!a.dtype().is(py::dtype::of<T>()))
        throw TypeError(std::string("merge_state_in_place: ") + name + " must be " +
                        (sizeof(T) == 8 ? "float64" : "float32") + " like v, got dtype " +
                        std::string(py::str(a.dtype())));
      if (!a.writeable()) throw ValueError(std::string("merge_state_in_place: ") + name + " must be writable");
    }
    auto vw = py::reinterpret_borrow<py::array_t<T>>(v), sw = py::reinterpret_borrow<py::array_t<T>>(s);
    auto vo = as<T>(as_numeric_array(v_other, "v_other")), so = as<T>(as_numeric_array(s_other, "s_other"));
    const auto vv = view_of<T>(vw);
    const auto sv = view_of<T>(sw);
    if (vw.ptr() != v.ptr() || sw.ptr() != s.ptr())  // view_of copied: the writes would be lost
      throw ValueError("merge_state_in_place: v and s must have strides of whole elements");
    const auto vov = view_of<const T>(vo);
    const auto sov = view_of<const T>(so);
    py::gil_scoped_release nogil;
    merge_state_in_place<T>(vv, sv, vov, sov);
  };
  if (is_float64(v)) run(0.0);
  else if (v.dtype().is(py::dtype::of<float>())) run(0.0f);
  else
    throw TypeError("merge_state_in_place: v must be float32 or float64 (it is written in place), got dtype " +
                    std::string(py::str(v.dtype())));
}

}  // namespace

void bind_serving(py::module_& m) {
  using py::arg;
  m.def("merge_state", &py_merge_state, arg("v_a"), arg("s_a"), arg("v_b"), arg("s_b"), docs::kMergeState);
  m.def("merge_state_in_place", &py_merge_state_in_place, arg("v"), arg("s"), arg("v_other"), arg("s_other"),
        docs::kMergeStateInPlace);
  m.def("merge_states", &py_merge_states, arg("vs"), arg("ss"), docs::kMergeStates);
}

}  // namespace attn::python
