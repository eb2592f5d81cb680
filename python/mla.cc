// attn._core.MultiHeadLatentAttention and LatentCache: DeepSeek's latent
// attention layer over NumPy arrays (float32).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <string>
#include <vector>

#include "args.hpp"
#include "arrays.hpp"
#include "attn/multi_head_latent_attention.hpp"
#include "attn/rope_scaling.hpp"
#include "bindings.hpp"

namespace attn::python {
namespace {

LatentForm form_arg(const std::string& form) {
  if (form == "auto") return LatentForm::Auto;
  if (form == "absorbed") return LatentForm::Absorbed;
  if (form == "expanded") return LatentForm::Expanded;
  throw ValueError("MultiHeadLatentAttention: form must be 'auto', 'absorbed' or 'expanded', got '" + form + "'");
}

// forward over a PagedKVCache.latent: many sequences' packed tokens.
py::array mla_serve(const MultiHeadLatentAttention& m, py::array_t<float>& x, PagedKVCache& cache,
                    const py::object& seq_ids, const py::object& cu_seqlens_obj) {
  if (seq_ids.is_none() || cu_seqlens_obj.is_none())
    throw TypeError("MultiHeadLatentAttention over a PagedKVCache needs seq_ids and cu_seqlens");
  std::vector<int64_t> ids;
  for (const py::handle& id : py::iter(seq_ids)) ids.push_back(int_arg(id, "seq_ids"));
  auto cu = int64_array(cu_seqlens_obj, "cu_seqlens");
  Tensor<float> out;
  {
    py::gil_scoped_release nogil;
    out = m.forward(view_of<const float>(x), cache, ids, view_of<const int64_t>(cu));
  }
  return to_numpy(std::move(out));
}

py::array mla_forward(const MultiHeadLatentAttention& m, const py::object& x_obj, const py::object& positions_obj,
                      const py::object& cache_obj, const std::string& form, const py::object& seq_ids,
                      const py::object& cu_seqlens) {
  auto x = as<float>(as_numeric_array(x_obj, "x"));
  if (py::isinstance<PagedKVCache>(cache_obj)) {
    if (!positions_obj.is_none() || form != "auto")
      throw TypeError("MultiHeadLatentAttention over a PagedKVCache places each token at its sequence's next "
                      "position, in the absorbed form: pass no positions or form");
    return mla_serve(m, x, cache_obj.cast<PagedKVCache&>(), seq_ids, cu_seqlens);
  }
  if (!seq_ids.is_none() || !cu_seqlens.is_none())
    throw TypeError("seq_ids and cu_seqlens go with a PagedKVCache (new_paged_cache)");
  LatentCache* cache = cache_obj.is_none() ? nullptr : cache_obj.cast<LatentCache*>();
  py::array_t<int64_t> positions;
  if (!positions_obj.is_none()) positions = int64_array(positions_obj, "positions");
  const LatentForm f = form_arg(form);
  Tensor<float> out;
  {
    py::gil_scoped_release nogil;
    out = m.forward(view_of<const float>(x), cache,
                    positions_obj.is_none() ? TensorView<const int64_t>() : view_of<const int64_t>(positions), f);
  }
  return to_numpy(std::move(out));
}

}  // namespace

void bind_mla(py::module_& m) {
  using py::arg;
  py::class_<LatentCache>(m, "LatentCache",
                          "The latent cache of a MultiHeadLatentAttention: per token the normalised latent c and the "
                          "rotated k_pe. Make one with MultiHeadLatentAttention.new_cache().")
      .def_property_readonly("length", &LatentCache::length)
      .def_property_readonly("dtype", [](const LatentCache& c) { return kv_dtype_name(c.dtype()); })
      .def_property_readonly("nbytes", &LatentCache::nbytes)
      .def_property_readonly("bytes_per_token", &LatentCache::bytes_per_token)
      .def("__len__", &LatentCache::length)
      .def("clear", &LatentCache::clear)
      .def("__repr__", [](const LatentCache& c) {
        return "attn.LatentCache(length=" + std::to_string(c.length()) + ", dtype='" + kv_dtype_name(c.dtype()) +
               "', nbytes=" + std::to_string(c.nbytes()) + ")";
      });

  py::class_<MultiHeadLatentAttention>(m, "MultiHeadLatentAttention", "See attn.MultiHeadLatentAttention.")
      .def(py::init([](const py::object& hidden_size, const py::object& num_attention_heads, const py::object& q_lora_rank,
                       const py::object& kv_lora_rank, const py::object& qk_nope_head_dim,
                       const py::object& qk_rope_head_dim, const py::object& v_head_dim, double rope_theta,
                       const py::object& rope_scaling, bool rope_interleave, bool attention_bias, double rms_norm_eps,
                       uint64_t seed) {
             MultiHeadLatentAttentionConfig c;
             c.hidden_size = int_arg(hidden_size, "hidden_size");
             c.num_attention_heads = int_arg(num_attention_heads, "num_attention_heads");
             c.q_lora_rank = optional_int(q_lora_rank, "q_lora_rank");
             c.kv_lora_rank = int_arg(kv_lora_rank, "kv_lora_rank");
             c.qk_nope_head_dim = int_arg(qk_nope_head_dim, "qk_nope_head_dim");
             c.qk_rope_head_dim = int_arg(qk_rope_head_dim, "qk_rope_head_dim");
             c.v_head_dim = int_arg(v_head_dim, "v_head_dim");
             c.rope_theta = rope_theta;
             if (!rope_scaling.is_none()) c.rope_scaling = parse_rope_scaling(rope_scaling.cast<std::string>());
             c.rope_interleave = rope_interleave;
             c.attention_bias = attention_bias;
             c.rms_norm_eps = rms_norm_eps;
             return MultiHeadLatentAttention(c, seed);
           }),
           arg("hidden_size"), arg("num_attention_heads"), py::kw_only(), arg("q_lora_rank"), arg("kv_lora_rank"),
           arg("qk_nope_head_dim"), arg("qk_rope_head_dim"), arg("v_head_dim"), arg("rope_theta") = 10000.0,
           arg("rope_scaling") = py::none(), arg("rope_interleave") = true, arg("attention_bias") = false,
           arg("rms_norm_eps") = 1e-6, arg("seed") = 0)
      .def_static("from_config_json", [](const std::string& text) { return MultiHeadLatentAttention(mla_config_from_json(text)); },
                  arg("config_json"))
      .def("forward", &mla_forward, arg("x"), arg("positions") = py::none(), arg("cache") = py::none(),
           arg("form") = "auto", arg("seq_ids") = py::none(), arg("cu_seqlens") = py::none())
      .def("new_paged_cache", [](const MultiHeadLatentAttention& self, const py::object& num_pages,
                                 const py::object& page_size, const std::string& dtype) {
             return self.new_paged_cache(int_arg(num_pages, "num_pages"), int_arg(page_size, "page_size"),
                                         parse_kv_dtype(dtype));
           }, arg("num_pages"), arg("page_size"), arg("dtype") = "f32")
      .def("new_cache", [](const MultiHeadLatentAttention& self, const std::string& dtype) {
             return self.new_cache(parse_kv_dtype(dtype));
           }, arg("dtype") = "f32")
      .def("state_dict", [](const MultiHeadLatentAttention& self) {
        py::dict d;
        for (auto& [name, t] : self.state_dict()) d[py::str(name)] = to_numpy(std::move(t));
        return d;
      })
      .def("load_state_dict", [](MultiHeadLatentAttention& self, const py::dict& d) {
        self.load_state_dict(float_tensors(d));
      }, arg("state_dict"))
      .def("load_safetensors", [](MultiHeadLatentAttention& self, const py::object& path, const std::string& prefix) {
        self.load_safetensors(path_arg(path, "path"), prefix);
      }, arg("path"), arg("prefix") = "")
      .def_property_readonly("softmax_scale", [](const MultiHeadLatentAttention& s) { return s.config().softmax_scale(); })
      .def_property_readonly("hidden_size", [](const MultiHeadLatentAttention& s) { return s.config().hidden_size; })
      .def_property_readonly("num_attention_heads", [](const MultiHeadLatentAttention& s) { return s.config().num_attention_heads; })
      .def_property_readonly("q_lora_rank", [](const MultiHeadLatentAttention& s) { return s.config().q_lora_rank; })
      .def_property_readonly("kv_lora_rank", [](const MultiHeadLatentAttention& s) { return s.config().kv_lora_rank; })
      .def_property_readonly("qk_nope_head_dim", [](const MultiHeadLatentAttention& s) { return s.config().qk_nope_head_dim; })
      .def_property_readonly("qk_rope_head_dim", [](const MultiHeadLatentAttention& s) { return s.config().qk_rope_head_dim; })
      .def_property_readonly("v_head_dim", [](const MultiHeadLatentAttention& s) { return s.config().v_head_dim; })
      .def_property_readonly("rope_theta", [](const MultiHeadLatentAttention& s) { return s.config().rope_theta; })
      .def_property_readonly("rope_interleave", [](const MultiHeadLatentAttention& s) { return s.config().rope_interleave; })
      .def_property_readonly("attention_bias", [](const MultiHeadLatentAttention& s) { return s.config().attention_bias; })
      .def_property_readonly("rope_scaling", [](const MultiHeadLatentAttention& s) -> py::object {  // as JSON text
        const RopeScaling& r = s.config().rope_scaling;
        if (r == RopeScaling{}) return py::none();
        return py::str(rope_scaling_json(r));
      });
}

}  // namespace attn::python
