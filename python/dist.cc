// attn._dist: context-parallel attention (attn/dist.hpp) on NumPy arrays,
// over an mpi4py communicator. Its own extension module, so that importing
// attn never needs MPI: `import attn.dist` does.
#include <mpi.h>
#include <mpi4py/mpi4py.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <type_traits>
#include <vector>

#include "args.hpp"
#include "arrays.hpp"
#include "attn/dist.hpp"
#include "attn/threads.hpp"
#include "bindings.hpp"

namespace attn::python {
namespace {

MPI_Comm comm_from(const py::object& comm) {
  MPI_Comm* c = PyMPIComm_Get(comm.ptr());
  if (!c) {
    PyErr_Clear();
    throw TypeError("comm must be an mpi4py communicator (mpi4py.MPI.Comm), got " +
                    std::string(py::str(py::type::of(comm))));
  }
  return *c;
}

enum class Strategy { Ring, Ulysses };

const char* name_of(Strategy s) { return s == Strategy::Ring ? "ring_attention" : "ulysses_attention"; }

template <class T, class KV>
py::object run(Strategy strategy, const py::array& q_in, TensorView<const KV> k, TensorView<const KV> v,
               MPI_Comm comm, const AttentionOptions& opt, dist::Layout layout, bool return_lse) {
  py::array_t<T> qa, out, lse;
  // Conversions and allocations may fail on one rank (memory): all hear of it.
  dist::check_collectively(comm, name_of(strategy), [&] {
    qa = as<T>(q_in);
    // Shaped as q with v's last axis; a shape that is wrong on any rank is
    // the call's to report, on every rank alike.
    Shape out_shape(qa.shape(), qa.shape() + qa.ndim()), lse_shape = out_shape;
    if (!out_shape.empty() && v.rank() > 0) out_shape.back() = values_shape(v).back();
    if (!lse_shape.empty()) lse_shape.pop_back();
    out = empty<T>(out_shape);
    lse = empty<T>(return_lse ? lse_shape : Shape{0});
  });
  const auto q = view_of<const T>(qa);
  const auto o = view_of<T>(out);
  const TensorView<T> l = return_lse ? view_of<T>(lse) : TensorView<T>();
  {
    py::gil_scoped_release nogil;
    if (strategy == Strategy::Ring)
      dist::ring_attention<T, KV>(q, k, v, o, comm, opt, layout, l);
    else
      dist::ulysses_attention<T, KV>(q, k, v, o, comm, opt, layout, l);
  }
  if (return_lse) return py::make_tuple(out, lse);
  return out;
}

py::object dispatch(Strategy strategy, const py::object& q_obj, const py::object& k_obj, const py::object& v_obj,
                    const py::object& comm, const py::object& causal, const py::object& layout_obj,
                    const py::object& scale, const py::object& softcap, const py::object& window,
                    const py::object& alibi_slopes, const py::object& sinks, bool return_lse,
                    const py::object& precision) {
  const MPI_Comm c = comm_from(comm);
  AttentionOptions opt;
  dist::Layout layout = dist::Layout::Contiguous;
  py::array q, k, v;
  bool quantized = false;  // k and v are attn.QuantizedTensor: they travel as stored
  const auto run_quantized = [&](auto kq, auto vq) {
    using S = std::remove_const_t<std::remove_reference_t<decltype(*kq.data())>>;
    return run<float, S>(strategy, q, kq, vq, c, opt, layout, return_lse);
  };
  // Arguments one rank gets wrong fail on every rank (no rank left waiting).
  dist::check_collectively(c, name_of(strategy), [&] {
    opt = attention_options(causal, scale, softcap, window);
    opt.precision = precision_arg(precision);
    opt.alibi_slopes = per_head_from(alibi_slopes, "alibi_slopes", "slope");
    opt.sinks = per_head_from(sinks, "sinks", "logit");
    layout = dist::parse_layout(str_arg(layout_obj, "layout"));
    q = as_numeric_array(q_obj, "q");
    quantized = on_quantized_kv(name_of(strategy), q, k_obj, v_obj, [](auto, auto) { return py::none(); }).has_value();
    if (!quantized) k = as_numeric_array(k_obj, "k"), v = as_numeric_array(v_obj, "v");
  });
  if (quantized) return *on_quantized_kv(name_of(strategy), q, k_obj, v_obj, run_quantized);
  if (is_float64(q) || is_float64(k) || is_float64(v)) {
    auto ka = as<double>(k), va = as<double>(v);
    return run<double, double>(strategy, q, view_of<const double>(ka), view_of<const double>(va), c, opt, layout,
                               return_lse);
  }
  // float16 keys and values travel as they are: half the bytes of float32.
  if (is_float16(k) && is_float16(v))
    return run<float, float16>(strategy, q, half_view(k), half_view(v), c, opt, layout, return_lse);
  auto ka = as<float>(k), va = as<float>(v);
  return run<float, float>(strategy, q, view_of<const float>(ka), view_of<const float>(va), c, opt, layout,
                           return_lse);
}

template <class T>
py::tuple backward_t(const std::vector<py::array>& arrays, MPI_Comm comm, const AttentionOptions& opt,
                     dist::Layout layout) {
  std::vector<py::array_t<T>> held;
  std::vector<TensorView<const T>> in;
  py::array_t<T> dq, dk, dv, dsinks;
  // Conversions and allocations may fail on one rank (memory): all hear of it.
  dist::check_collectively(comm, "ring_attention_backward", [&] {
    for (const py::array& a : arrays) held.push_back(as<T>(a));
    for (auto& a : held) in.push_back(view_of<const T>(a));
    dq = empty<T>(in[0].shape()), dk = empty<T>(in[1].shape()), dv = empty<T>(in[2].shape());
    dsinks = empty<T>({static_cast<int64_t>(opt.sinks.size())});
  });
  const auto dqv = view_of<T>(dq), dkv = view_of<T>(dk), dvv = view_of<T>(dv);
  const TensorView<T> dsv = opt.sinks.empty() ? TensorView<T>() : view_of<T>(dsinks);
  {
    py::gil_scoped_release nogil;
    dist::ring_attention_backward<T>(in[0], in[1], in[2], in[3], in[4], in[5], dqv, dkv, dvv, comm, opt, layout,
                                     dsv);
  }
  if (opt.sinks.empty()) return py::make_tuple(dq, dk, dv);
  return py::make_tuple(dq, dk, dv, dsinks);
}

py::tuple ring_backward(const py::object& q, const py::object& k, const py::object& v, const py::object& dout,
                        const py::object& out, const py::object& lse, const py::object& comm,
                        const py::object& causal, const py::object& layout_obj, const py::object& scale,
                        const py::object& softcap, const py::object& window, const py::object& alibi_slopes,
                        const py::object& sinks) {
  const MPI_Comm c = comm_from(comm);
  AttentionOptions opt;
  dist::Layout layout = dist::Layout::Contiguous;
  std::vector<py::array> arrays;
  dist::check_collectively(c, "ring_attention_backward", [&] {
    opt = attention_options(causal, scale, softcap, window);
    opt.alibi_slopes = per_head_from(alibi_slopes, "alibi_slopes", "slope");
    opt.sinks = per_head_from(sinks, "sinks", "logit");
    layout = dist::parse_layout(str_arg(layout_obj, "layout"));
    const char* names[] = {"q", "k", "v", "dout", "out", "lse"};
    const py::object* objects[] = {&q, &k, &v, &dout, &out, &lse};
    for (int i = 0; i < 6; ++i) arrays.push_back(as_numeric_array(*objects[i], names[i]));
  });
  bool f64 = false;
  for (const py::array& a : arrays) f64 = f64 || is_float64(a);
  return f64 ? backward_t<double>(arrays, c, opt, layout) : backward_t<float>(arrays, c, opt, layout);
}

}  // namespace
}  // namespace attn::python

PYBIND11_MODULE(_dist, m) {
  using namespace attn::python;
  using py::arg;
  if (import_mpi4py() < 0) throw py::error_already_set();
  register_errors();
  m.doc() = "attn._dist: context-parallel attention over MPI (use attn.dist).";
  m.def(
      "check_collectively",
      [](const py::object& comm, const std::string& function, const py::object& error) {
        const MPI_Comm c = comm_from(comm);
        attn::dist::check_collectively(c, function, [&] {
          if (error.is_none()) return;
          const std::string message = py::str(error);
          if (py::isinstance(error, py::handle(PyExc_TypeError))) throw attn::TypeError(message);
          if (py::isinstance(error, py::handle(PyExc_ValueError))) throw attn::ValueError(message);
          throw attn::RuntimeError(std::string(py::str(py::type::of(error).attr("__name__"))) + ": " + message);
        });
      },
      arg("comm"), arg("function"), arg("error"),
      "check_collectively(comm, function, error): every rank passes the exception its own checks raised, "
      "or None; if any passed one, every rank raises it (TypeError, ValueError, else RuntimeError), naming "
      "that rank.");
  // This module links its own copy of the library: attn.dist keeps its
  // thread count that of attn._core.
  m.def("set_num_threads", [](int64_t n) { attn::set_num_threads(n); }, arg("n"));
  m.def("ring_attention_backward", &ring_backward, arg("q"), arg("k"), arg("v"), arg("dout"), arg("out"),
        arg("lse"), arg("comm"), py::kw_only(), arg("causal") = false, arg("layout") = "contiguous",
        arg("scale") = py::none(), arg("softcap") = py::none(), arg("window") = py::none(),
        arg("alibi_slopes") = py::none(), arg("sinks") = py::none());
  for (const auto& [name, strategy] :
       {std::pair{"ring_attention", Strategy::Ring}, std::pair{"ulysses_attention", Strategy::Ulysses}}) {
    const Strategy s = strategy;
    m.def(
        name,
        [s](const py::object& q, const py::object& k, const py::object& v, const py::object& comm,
            const py::object& causal, const py::object& layout, const py::object& scale,
            const py::object& softcap, const py::object& window, const py::object& alibi_slopes,
            const py::object& sinks, bool return_lse, const py::object& precision) {
          return dispatch(s, q, k, v, comm, causal, layout, scale, softcap, window, alibi_slopes, sinks,
                          return_lse, precision);
        },
        arg("q"), arg("k"), arg("v"), arg("comm"), py::kw_only(), arg("causal") = false,
        arg("layout") = "contiguous", arg("scale") = py::none(), arg("softcap") = py::none(),
        arg("window") = py::none(), arg("alibi_slopes") = py::none(), arg("sinks") = py::none(),
        arg("return_lse") = false, arg("precision") = "f32");
  }
}
