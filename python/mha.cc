// attn._core.MultiHeadAttention and attn.KVCache: the learnable layer over
// NumPy arrays. attn.MultiHeadAttention (python/attn/layer.py) wraps it with
// PyTorch's call signature, torch tensors and autograd.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <variant>

#include "args.hpp"
#include "arrays.hpp"
#include "attn/attn.hpp"
#include "bindings.hpp"
#include "docstrings.hpp"

namespace attn::python {
namespace {

// An 'f32' cache takes the dtype of the first input it sees; a compact one
// (bf16, f16, q8_0, q4_0) is a float32 cache from the start.
struct PyKVCache {
  KVDtype dtype = KVDtype::F32;
  StreamingCache streaming;
  std::variant<std::monostate, KVCache<float>, KVCache<double>> cache;

  PyKVCache(KVDtype d, const StreamingCache& s) : dtype(d), streaming(s) {
    cache.emplace<KVCache<float>>(d, s);  // checks the options now
    if (d == KVDtype::F32) cache = std::monostate();
  }

  template <class T>
  KVCache<T>* get() {
    if (std::holds_alternative<std::monostate>(cache)) cache = KVCache<T>(dtype, streaming);
    if (auto* c = std::get_if<KVCache<T>>(&cache)) return c;
    throw TypeError(std::string("this cache holds ") +
                    (dtype != KVDtype::F32 ? std::string(kv_dtype_name(dtype)) + " keys and values of float32"
                     : std::holds_alternative<KVCache<float>>(cache) ? "float32 keys and values"
                                                                     : "float64 keys and values") +
                    " input; feed it float32 input");
  }
  // f(the cache), held for this thread meanwhile (a forward on another
  // thread may be using it, without the GIL).
  template <class F>
  int64_t read(const char* who, F f) const {
    return std::visit([&](const auto& c) -> int64_t {
      if constexpr (std::is_same_v<std::decay_t<decltype(c)>, std::monostate>) {
        return 0;
      } else {
        const auto held = c.use(who);
        return f(c);
      }
    }, cache);
  }
  int64_t length() const { return read("length", [](const auto& c) { return c.length(); }); }
  int64_t nbytes() const { return read("nbytes", [](const auto& c) { return c.bytes(); }); }
};

// Pickling (and so copy.deepcopy): a cache's state is its options and, once
// it has held tokens, its storage as bytes with their shapes, the positions
// held and the tokens seen. A copy shares nothing with the original.
template <class S>
py::bytes storage_bytes(TensorView<const S> v) {
  const Tensor<S> c = contiguous(v);
  return py::bytes(reinterpret_cast<const char*>(c.data()), static_cast<size_t>(c.numel()) * sizeof(S));
}

py::tuple shape_tuple(const Shape& s) {
  py::tuple t(s.size());
  for (size_t i = 0; i < s.size(); ++i) t[i] = py::int_(s[i]);
  return t;
}

py::tuple cache_state(const PyKVCache& c) {
  const StreamingCache& s = c.streaming;
  const py::tuple options = py::make_tuple(kv_dtype_name(c.dtype), s.sink_tokens, s.window,
                                           s.positions == CachePositions::Cache ? "cache" : "original");
  return std::visit([&](const auto& k) -> py::tuple {
    if constexpr (std::is_same_v<std::decay_t<decltype(k)>, std::monostate>) {
      return py::make_tuple(options, py::none());
    } else {
      const auto held = k.use("pickle");
      const bool f64 = std::is_same_v<std::decay_t<decltype(k)>, KVCache<double>>;
      return k.visit([&](auto keys, auto values) {
        py::tuple held = py::make_tuple(f64, shape_tuple(keys.shape()), shape_tuple(values.shape()), storage_bytes(keys),
                                        storage_bytes(values), py::cast(k.positions()), k.seen());
        if (k.dtype() == KVDtype::INT4) {  // and the last group's float32 keys
          const TensorView<const float> tail = k.key_tail();
          held = py::make_tuple(held[0], held[1], held[2], held[3], held[4], held[5], held[6], shape_tuple(tail.shape()),
                                storage_bytes(tail));
        }
        return py::make_tuple(options, held);
      });
    }
  }, c.cache);
}

Shape shape_of(const py::handle& t) {
  Shape s;
  for (const auto& d : t) s.push_back(d.cast<int64_t>());
  return s;
}

PyKVCache cache_from_state(const py::tuple& state) {
  if (state.size() != 2) throw ValueError("KVCache: not a pickled cache's state");
  const py::tuple options = state[0].cast<py::tuple>();
  StreamingCache s;
  s.sink_tokens = options[1].cast<int64_t>();
  s.window = options[2].cast<int64_t>();
  s.positions = options[3].cast<std::string>() == "cache" ? CachePositions::Cache : CachePositions::Original;
  PyKVCache c(parse_kv_dtype(options[0].cast<std::string>()), s);
  if (state[1].is_none()) return c;
  const py::tuple held = state[1].cast<py::tuple>();
  const Shape ks = shape_of(held[1]), vs = shape_of(held[2]);
  const std::string kb = held[3].cast<std::string>(), vb = held[4].cast<std::string>();
  const auto positions = held[5].cast<std::vector<int64_t>>();
  const int64_t seen = held[6].cast<int64_t>();
  const auto restore = [&](auto& cache, auto element) {
    using S = decltype(element);
    if (kb.size() != static_cast<size_t>(numel_of(ks)) * sizeof(S) || vb.size() != static_cast<size_t>(numel_of(vs)) * sizeof(S))
      throw ValueError("KVCache: a pickled cache's bytes do not fit its shapes");
    // (Copied into aligned storage by restore: the bytes object's buffer may not be.)
    std::vector<S> k(static_cast<size_t>(numel_of(ks))), v(static_cast<size_t>(numel_of(vs)));
    std::memcpy(k.data(), kb.data(), kb.size());
    std::memcpy(v.data(), vb.data(), vb.size());
    std::vector<float> tail;
    Shape tail_shape;
    if (held.size() == 9) {
      tail_shape = shape_of(held[7]);
      const std::string tb = held[8].cast<std::string>();
      if (tb.size() != static_cast<size_t>(numel_of(tail_shape)) * sizeof(float))
        throw ValueError("KVCache: a pickled cache's bytes do not fit its shapes");
      tail.resize(static_cast<size_t>(numel_of(tail_shape)));
      std::memcpy(tail.data(), tb.data(), tb.size());
    }
    cache.restore(TensorView<const S>(k.data(), ks), TensorView<const S>(v.data(), vs), positions, seen,
                  tail_shape.empty() ? TensorView<const float>() : TensorView<const float>(tail.data(), tail_shape));
  };
  if (held[0].cast<bool>()) {
    restore(*c.get<double>(), double{});
    return c;
  }
  KVCache<float>& cache = *c.get<float>();
  switch (c.dtype) {
    case KVDtype::F32: restore(cache, float{}); break;
    case KVDtype::BF16: restore(cache, bfloat16{}); break;
    case KVDtype::F16: restore(cache, float16{}); break;
    case KVDtype::Q8_0: restore(cache, block_q8_0{}); break;
    case KVDtype::Q4_0: restore(cache, block_q4_0{}); break;
    case KVDtype::INT4: restore(cache, block_int4{}); break;
  }
  return c;
}

// The float32 layer, and a float64 twin built on the first float64 call.
// Both live as long as this object and are never replaced, only their
// parameters (atomically, by load_state_dict): a forward that released the
// GIL keeps working on the set it started with.
struct PyMha {
  std::unique_ptr<MultiHeadAttention<float>> f32;
  std::unique_ptr<MultiHeadAttention<double>> f64;

  // Called with the GIL held, which serializes building the twin.
  template <class T>
  const MultiHeadAttention<T>& layer() {
    if constexpr (std::is_same_v<T, float>) {
      return *f32;
    } else {
      if (!f64) {
        auto twin = std::make_unique<MultiHeadAttention<double>>(f32->config());
        twin->load_state_dict(widened(f32->state_dict()));
        f64 = std::move(twin);
      }
      return *f64;
    }
  }
  void load_state_dict(const std::map<std::string, Tensor<float>>& s) {
    f32->load_state_dict(s);
    if (f64) f64->load_state_dict(widened(s));
  }

 private:
  static std::map<std::string, Tensor<double>> widened(const std::map<std::string, Tensor<float>>& s) {
    std::map<std::string, Tensor<double>> d;
    for (const auto& [name, t] : s) {
      Tensor<double> w(t.shape());
      std::copy(t.data(), t.data() + t.numel(), w.data());
      d.emplace(name, std::move(w));
    }
    return d;
  }
};

// Key and value are optional (None means self-attention); the arrays keep the
// converted data alive for the views.
template <class T>
struct KeyValueArgs {
  py::array_t<T> key_array, value_array;
  TensorView<const T> key, value;
  KeyValueArgs(const py::object& k, const py::object& v) {
    if (!k.is_none()) key_array = as<T>(as_numeric_array(k, "key")), key = view_of<const T>(key_array);
    if (!v.is_none())
      value_array = as<T>(as_numeric_array(v, "value")), value = view_of<const T>(value_array);
  }
};

bool any_float64(const py::object& key, const py::object& value) {
  return (!key.is_none() && is_float64(as_numeric_array(key, "key"))) ||
         (!value.is_none() && is_float64(as_numeric_array(value, "value")));
}

template <class T>
MhaForwardOptions<T> forward_options(const MaskArg& kpm, const MaskArg& am,
                                     const AttentionOptions& options) {
  MhaForwardOptions<T> opt;
  opt.key_padding_mask = kpm.mask;
  opt.attn_mask = am.mask;
  opt.attention = options;
  return opt;
}

template <class T>
py::tuple forward_t(PyMha& self, const py::array& q_in, const py::object& k_obj,
                    const py::object& v_obj, const MaskArg& kpm, const MaskArg& am,
                    const AttentionOptions& options, bool need_weights, bool average,
                    PyKVCache* cache) {
  const auto& layer = self.layer<T>();
  auto qa = as<T>(q_in);
  const KeyValueArgs<T> kv(k_obj, v_obj);
  MhaForwardOptions<T> opt = forward_options<T>(kpm, am, options);
  opt.need_weights = need_weights;
  opt.average_attn_weights = average;
  opt.cache = cache ? cache->get<T>() : nullptr;
  MhaOutput<T> r;
  {
    py::gil_scoped_release nogil;
    r = layer.forward(view_of<const T>(qa), kv.key, kv.value, opt);
  }
  py::object w = py::none();
  if (r.weights) w = to_numpy(std::move(*r.weights));
  return py::make_tuple(to_numpy(std::move(r.out)), w);
}

py::tuple py_forward(PyMha& self, const py::object& query, const py::object& key,
                     const py::object& value, const py::object& key_padding_mask,
                     const py::object& attn_mask, const py::object& causal,
                     const py::object& window, const py::object& softcap,
                     const py::object& scale, bool need_weights,
                     bool average_attn_weights, const py::object& cache) {
  const auto q = as_numeric_array(query, "query");
  PyKVCache* c = nullptr;
  if (!cache.is_none()) {
    if (!py::isinstance<PyKVCache>(cache))
      throw TypeError("cache must come from MultiHeadAttention.new_cache(), got " +
                      std::string(py::repr(cache)));
    c = cache.cast<PyKVCache*>();
  }
  const MaskArg kpm(key_padding_mask, "key_padding_mask", IntegerMask::Uint8AsBool),
      am(attn_mask, "attn_mask", IntegerMask::Uint8AsBool);
  const AttentionOptions options = attention_options(causal, scale, softcap, window);
  const bool f64 = is_float64(q) || any_float64(key, value);
  if (f64) return forward_t<double>(self, q, key, value, kpm, am, options, need_weights,
                                    average_attn_weights, c);
  return forward_t<float>(self, q, key, value, kpm, am, options, need_weights,
                          average_attn_weights, c);
}

// The layer over a PagedKVCache: x (total, E) packed, float32.
py::array py_serve(PyMha& self, const py::object& x_obj, PagedKVCache& cache, const py::object& seq_ids,
                   const py::object& cu_seqlens_obj, const py::object& causal, const py::object& window,
                   const py::object& softcap, const py::object& scale) {
  std::vector<int64_t> ids;
  for (const py::handle& id : py::iter(seq_ids)) ids.push_back(int_arg(id, "seq_ids"));
  auto x = as<float>(as_numeric_array(x_obj, "query"));
  auto cu = int64_array(cu_seqlens_obj, "cu_seqlens");
  if (!py::isinstance<py::bool_>(causal))
    throw TypeError("causal must be True or False over a PagedKVCache (bottom-right per sequence), got " + repr_of(causal));
  const AttentionOptions options = attention_options(causal, scale, softcap, window);
  const auto xv = view_of<const float>(x);
  const auto cv = view_of<const int64_t>(cu);
  Tensor<float> out;
  {
    py::gil_scoped_release nogil;
    out = self.f32->forward(xv, cache, ids, cv, options);
  }
  return to_numpy(std::move(out));
}

template <class T>
py::dict named_arrays(std::map<std::string, Tensor<T>>&& tensors) {
  py::dict d;
  for (auto& [name, t] : tensors) d[py::str(name)] = to_numpy(std::move(t));
  return d;
}

template <class T>
py::object array_or_none(Tensor<T>&& t) {
  return t.rank() ? py::object(to_numpy(std::move(t))) : py::none();
}

py::dict py_state_dict(const PyMha& self) { return named_arrays(self.f32->state_dict()); }

template <class T>
py::tuple backward_t(PyMha& self, const py::array& dout_in, const py::array& q_in,
                     const py::object& k_obj, const py::object& v_obj, const MaskArg& kpm,
                     const MaskArg& am, const AttentionOptions& options) {
  const auto& layer = self.layer<T>();
  auto da = as<T>(dout_in), qa = as<T>(q_in);
  const KeyValueArgs<T> kv(k_obj, v_obj);
  const MhaForwardOptions<T> opt = forward_options<T>(kpm, am, options);
  MhaGradients<T> g;
  std::map<std::string, Tensor<T>> named;
  {
    py::gil_scoped_release nogil;
    g = layer.backward(view_of<const T>(da), view_of<const T>(qa), kv.key, kv.value, opt);
    named = layer.gradient_dict(g);
  }
  return py::make_tuple(array_or_none(std::move(g.query)), array_or_none(std::move(g.key)),
                        array_or_none(std::move(g.value)), named_arrays(std::move(named)));
}

py::tuple py_backward(PyMha& self, const py::object& dout, const py::object& query,
                      const py::object& key, const py::object& value,
                      const py::object& key_padding_mask, const py::object& attn_mask,
                      const py::object& causal, const py::object& window,
                      const py::object& softcap, const py::object& scale) {
  const auto d = as_numeric_array(dout, "dout"), q = as_numeric_array(query, "query");
  const MaskArg kpm(key_padding_mask, "key_padding_mask", IntegerMask::Uint8AsBool),
      am(attn_mask, "attn_mask", IntegerMask::Uint8AsBool);
  const AttentionOptions options = attention_options(causal, scale, softcap, window);
  const bool f64 = is_float64(q) || is_float64(d) || any_float64(key, value);
  if (f64) return backward_t<double>(self, d, q, key, value, kpm, am, options);
  return backward_t<float>(self, d, q, key, value, kpm, am, options);
}

void py_load_state_dict(PyMha& self, const py::dict& d) { self.load_state_dict(float_tensors(d)); }

// A layer's state: its configuration (as safetensors metadata, the form
// save() writes) and its parameters.
py::tuple layer_state(const PyMha& self) {
  return py::make_tuple(py::cast(to_metadata(self.f32->config())), py_state_dict(self));
}

PyMha layer_from_state(const py::tuple& state) {
  if (state.size() != 2) throw ValueError("MultiHeadAttention: not a pickled layer's state");
  const auto config = from_metadata("a pickled layer", state[0].cast<std::map<std::string, std::string>>());
  PyMha layer{std::make_unique<MultiHeadAttention<float>>(config), nullptr};
  py_load_state_dict(layer, state[1].cast<py::dict>());
  return layer;
}

}  // namespace

void bind_mha(py::module_& m) {
  using py::arg;
  py::class_<PyKVCache>(m, "KVCache", docs::kKVCache)
      .def_property_readonly("length", &PyKVCache::length)
      .def_property_readonly("seen", [](const PyKVCache& c) { return c.read("seen", [](const auto& k) { return k.seen(); }); })
      .def_property_readonly("dtype", [](const PyKVCache& c) { return kv_dtype_name(c.dtype); })
      .def_property_readonly("nbytes", &PyKVCache::nbytes)
      .def("__len__", &PyKVCache::length)
      .def("__repr__", [](const PyKVCache& c) {
        return "attn.KVCache(length=" + std::to_string(c.length()) + ", dtype='" +
               kv_dtype_name(c.dtype) + "', nbytes=" + std::to_string(c.nbytes()) + ")";
      })
      .def(py::pickle(&cache_state, &cache_from_state));

  py::class_<PyMha>(m, "MultiHeadAttention",
                    "The layer over NumPy arrays; use attn.MultiHeadAttention.")
      .def(py::init([](const py::object& embed_dim, const py::object& num_heads, double dropout,
                       bool bias, bool add_bias_kv, bool add_zero_attn, const py::object& kdim,
                       const py::object& vdim, bool batch_first, const py::object& num_kv_heads,
                       bool rope, double rope_base, bool rope_interleaved,
                       const py::object& rope_scaling, bool alibi, bool sinks, const std::string& gate,
                       uint64_t seed) {
             MultiHeadAttentionConfig c;
             c.embed_dim = int_arg(embed_dim, "embed_dim");
             c.num_heads = int_arg(num_heads, "num_heads");
             c.dropout = dropout;
             c.bias = bias;
             c.add_bias_kv = add_bias_kv;
             c.add_zero_attn = add_zero_attn;
             c.kdim = optional_int(kdim, "kdim");
             c.vdim = optional_int(vdim, "vdim");
             c.batch_first = batch_first;
             c.num_kv_heads = optional_int(num_kv_heads, "num_kv_heads");
             c.rope = rope;
             c.rope_base = rope_base;
             c.rope_interleaved = rope_interleaved;
             if (!rope_scaling.is_none()) c.rope_scaling = parse_rope_scaling(rope_scaling.cast<std::string>());
             c.alibi = alibi;
             c.sinks = sinks;
             c.gate = parse_gate(gate);
             return PyMha{std::make_unique<MultiHeadAttention<float>>(c, seed), nullptr};
           }),
           arg("embed_dim"), arg("num_heads"), py::kw_only(), arg("dropout") = 0.0,
           arg("bias") = true, arg("add_bias_kv") = false, arg("add_zero_attn") = false,
           arg("kdim") = py::none(), arg("vdim") = py::none(), arg("batch_first") = true,
           arg("num_kv_heads") = py::none(), arg("rope") = false, arg("rope_base") = 10000.0,
           arg("rope_interleaved") = false, arg("rope_scaling") = py::none(), arg("alibi") = false,
           arg("sinks") = false, arg("gate") = "none", arg("seed") = 0)
      .def("forward", &py_forward, arg("query"), arg("key") = py::none(),
           arg("value") = py::none(), py::kw_only(), arg("key_padding_mask") = py::none(),
           arg("attn_mask") = py::none(), arg("causal") = false, arg("window") = py::none(),
           arg("softcap") = py::none(), arg("scale") = py::none(), arg("need_weights") = false,
           arg("average_attn_weights") = true, arg("cache") = py::none(),
           "forward(query, key=None, value=None, *, ...) -> (out, weights): see attn.MultiHeadAttention.")
      .def("serve", &py_serve, arg("x"), arg("cache"), arg("seq_ids"), arg("cu_seqlens"), py::kw_only(),
           arg("causal") = false, arg("window") = py::none(), arg("softcap") = py::none(), arg("scale") = py::none(),
           "serve(x, cache, seq_ids, cu_seqlens, *, causal=False, ...) -> out: see attn.MultiHeadAttention.forward.")
      .def("backward", &py_backward, arg("dout"), arg("query"), arg("key") = py::none(),
           arg("value") = py::none(), py::kw_only(), arg("key_padding_mask") = py::none(),
           arg("attn_mask") = py::none(), arg("causal") = false, arg("window") = py::none(),
           arg("softcap") = py::none(), arg("scale") = py::none(), docs::kMhaBackward)
      .def("new_cache", [](const PyMha& self, const py::object& dtype, const py::object& sink_tokens,
                           const py::object& window, const std::string& positions) {
             if (!py::isinstance<py::str>(dtype))
               throw TypeError("new_cache: dtype must be 'f32', 'bf16', 'f16', 'q8_0', 'q4_0' or 'int4', got " +
                               std::string(py::repr(dtype)));
             const KVDtype d = parse_kv_dtype(dtype.cast<std::string>());
             if (is_block_dtype(d) && self.f32->config().head_dim() % 32 != 0)
               throw ValueError(std::string("new_cache: ") + kv_dtype_name(d) + " stores blocks of 32 values, so head_dim (" +
                                std::to_string(self.f32->config().head_dim()) + ") must be a multiple of 32");
             StreamingCache s;
             if (window.is_none() != sink_tokens.is_none())
               throw ValueError("new_cache: a streaming cache takes both sink_tokens and window");
             if (!window.is_none()) {
               s.sink_tokens = int_arg(sink_tokens, "new_cache: sink_tokens");
               s.window = int_arg(window, "new_cache: window");
               if (s.window < 1) throw ValueError("new_cache: window must be >= 1, got " + std::to_string(s.window));
             }
             if (positions != "original" && positions != "cache")
               throw ValueError("new_cache: positions must be 'original' or 'cache', got '" + positions + "'");
             s.positions = positions == "cache" ? CachePositions::Cache : CachePositions::Original;
             return PyKVCache(d, s);
           }, arg("dtype") = "f32", py::kw_only(), arg("sink_tokens") = py::none(),
           arg("window") = py::none(), arg("positions") = "original", docs::kNewCache)
      .def("state_dict", &py_state_dict, docs::kStateDict)
      .def("load_state_dict", &py_load_state_dict, arg("state_dict"), docs::kLoadStateDict)
      .def("save", [](const PyMha& self, const py::object& path) { self.f32->save(path_arg(path, "path")); },
           arg("path"), docs::kSave)
      .def_static("load", [](const py::object& path) {
             return PyMha{std::make_unique<MultiHeadAttention<float>>(
                              MultiHeadAttention<float>::load(path_arg(path, "path"))),
                          nullptr};
           }, arg("path"), docs::kLoad)
      .def_property_readonly("dropout", [](const PyMha& s) { return s.f32->config().dropout; })
      .def_property_readonly("add_bias_kv", [](const PyMha& s) { return s.f32->config().add_bias_kv; })
      .def_property_readonly("add_zero_attn", [](const PyMha& s) { return s.f32->config().add_zero_attn; })
      .def_property_readonly("batch_first", [](const PyMha& s) { return s.f32->config().batch_first; })
      .def_property_readonly("rope_base", [](const PyMha& s) { return s.f32->config().rope_base; })
      .def_property_readonly("rope_interleaved", [](const PyMha& s) { return s.f32->config().rope_interleaved; })
      .def_property_readonly("embed_dim", [](const PyMha& s) { return s.f32->config().embed_dim; })
      .def_property_readonly("num_heads", [](const PyMha& s) { return s.f32->config().num_heads; })
      .def_property_readonly("num_kv_heads", [](const PyMha& s) { return s.f32->config().kv_heads(); })
      .def_property_readonly("head_dim", [](const PyMha& s) { return s.f32->config().head_dim(); })
      .def_property_readonly("kdim", [](const PyMha& s) { return s.f32->config().key_dim(); })
      .def_property_readonly("vdim", [](const PyMha& s) { return s.f32->config().value_dim(); })
      .def_property_readonly("bias", [](const PyMha& s) { return s.f32->config().bias; })
      .def_property_readonly("rope", [](const PyMha& s) { return s.f32->config().rope; })
      .def_property_readonly("rope_scaling", [](const PyMha& s) -> py::object {  // as JSON text
        const RopeScaling& r = s.f32->config().rope_scaling;
        if (r == RopeScaling{}) return py::none();
        return py::str(rope_scaling_json(r));
      })
      .def_property_readonly("alibi", [](const PyMha& s) { return s.f32->config().alibi; })
      .def_property_readonly("sinks", [](const PyMha& s) { return s.f32->config().sinks; })
      .def_property_readonly("gate", [](const PyMha& s) { return gate_name(s.f32->config().gate); })
      .def(py::pickle(&layer_state, &layer_from_state));
}

}  // namespace attn::python
