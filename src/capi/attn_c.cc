// The C API (attn/attn.h) over the C++ one: descriptors become TensorViews,
// whose constructors and the functions they reach do the checking; what is
// checked here is only what C can get wrong and C++ cannot (NULL pointers,
// dtype values, ranks, shapes whose extent no memory can have), and every
// exception becomes a status with its text kept for attn_last_error().
#include "attn/attn.h"

#include "capi/c_views.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <limits>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "attn/attention.hpp"
#include "attn/file.hpp"
#include "attn/multi_head_attention.hpp"
#include "attn/multi_head_latent_attention.hpp"
#include "attn/positional.hpp"
#include "attn/rope_scaling.hpp"
#include "attn/threads.hpp"

struct attn_mha {
  attn::MultiHeadAttention<float> layer;
};
struct attn_cache {
  attn::KVCache<float> cache;
};
struct attn_latent_cache {
  attn::LatentCache cache;
};

namespace attn::detail::capi {

thread_local std::string last_error;

// Keeps the message for attn_last_error (none, if even that cannot be allocated).
int failed(int status, const char* message) noexcept {
  try {
    last_error = message;
  } catch (...) {
    last_error.clear();
  }
  return status;
}

// "attn_attention: q: <what>"
[[noreturn]] void fail(const char* function, const char* name, const std::string& what) {
  throw ValueError(std::string(function) + ": " + name + ": " + what);
}

size_t element_size(attn_dtype dtype) {
  switch (dtype) {
    case ATTN_F32: return sizeof(float);
    case ATTN_F64: return sizeof(double);
    case ATTN_BF16:
    case ATTN_F16: return sizeof(uint16_t);
    case ATTN_BOOL: return sizeof(bool);
    case ATTN_Q8_0: return sizeof(attn::block_q8_0);  // per block of 32 values
    case ATTN_Q4_0: return sizeof(attn::block_q4_0);
    case ATTN_INT4: return sizeof(attn::block_int4);
  }
  return 0;
}

const char* dtype_name(attn_dtype dtype) {
  switch (dtype) {
    case ATTN_F32: return "F32";
    case ATTN_F64: return "F64";
    case ATTN_BF16: return "BF16";
    case ATTN_F16: return "F16";
    case ATTN_BOOL: return "BOOL";
    case ATTN_Q8_0: return "Q8_0";
    case ATTN_Q4_0: return "Q4_0";
    case ATTN_INT4: return "INT4";
  }
  return "?";
}

Layout layout_of(const attn_tensor* t, const char* function, const char* name, std::optional<int> key_axis) {
  require(t, function, name);
  // Read as the int it is: a C enum may hold any int, which loaded as the
  // C++ enum would be undefined.
  static_assert(sizeof(attn_dtype) == sizeof(int));
  int dtype;
  std::memcpy(&dtype, &t->dtype, sizeof dtype);
  if (dtype < ATTN_F32 || dtype > ATTN_INT4)
    fail(function, name, "dtype " + std::to_string(dtype) + " is not an attn_dtype");
  if (t->rank < 0 || t->rank > kMaxRank)
    fail(function, name, "rank " + std::to_string(t->rank) + " is not in [0, " +
                             std::to_string(kMaxRank) + "]");
  if (t->rank > 0 && !t->shape) fail(function, name, "shape is NULL at rank " + std::to_string(t->rank));
  Layout l{static_cast<attn_dtype>(dtype), Shape(t->shape, t->shape + t->rank), {}};
  if (l.dtype == ATTN_INT4 && key_axis) {  // n keys along the axis in, ceil(n / 32) groups out
    const int axis = *key_axis < 0 ? static_cast<int>(l.shape.size()) + *key_axis : *key_axis;
    if (l.shape.size() < 2 || axis < 0 || axis >= static_cast<int>(l.shape.size()) - 1)
      fail(function, name, std::string("INT4 keys are ") + (*key_axis == -2 ? "(..., n, d)" : "a 4-D pool") +
                               ", got shape " + attn::shape_str(l.shape));
    int64_t& n = l.shape[static_cast<size_t>(axis)];
    n = (n + attn::kInt4Group - 1) / attn::kInt4Group;
  } else if (l.dtype == ATTN_Q8_0 || l.dtype == ATTN_Q4_0 || l.dtype == ATTN_INT4) {  // the logical shape in, a shape of blocks out
    if (l.shape.empty() || l.shape.back() % 32 != 0)
      fail(function, name, std::string(dtype_name(l.dtype)) + " stores blocks of 32 values along the last axis, "
                           "which must be a multiple of 32, got shape " + attn::shape_str(l.shape));
    l.shape.back() /= 32;
  }
  const std::string what = std::string(function) + ": " + name;
  const size_t bytes = element_size(l.dtype);
  const int64_t n = attn::checked_numel(l.shape, bytes, what.c_str());
  l.strides = t->strides ? Strides(t->strides, t->strides + t->rank) : attn::contiguous_strides(l.shape);
  if (n > 0 && !t->data) fail(function, name, "data is NULL for shape " + attn::shape_str(l.shape));
  // The farthest element from data must be addressable: strides that reach
  // 2^57 bytes or more (past the widest virtual address space of any 64-bit
  // machine: x86-64 with 5-level paging) cannot describe memory the caller
  // has. Checked for an empty view too: the kernels still step its rows'
  // pointers by the strides.
  constexpr int64_t kAddressable = int64_t{1} << 57;
  int64_t reach = 0, reach_bytes = 0;
  for (int a = 0; a < t->rank; ++a) {
    int64_t step;
    const int64_t stride = l.strides[a];
    if (stride == std::numeric_limits<int64_t>::min() ||
        __builtin_mul_overflow(stride < 0 ? -stride : stride, std::max<int64_t>(l.shape[a] - 1, 0), &step) ||
        __builtin_add_overflow(reach, step, &reach) ||
        __builtin_mul_overflow(reach, static_cast<int64_t>(bytes), &reach_bytes) ||
        reach_bytes >= kAddressable)
      fail(function, name, "strides " + attn::shape_str(l.strides) + " for shape " +
                               attn::shape_str(l.shape) + " reach beyond any memory");
  }
  return l;
}

alignas(64) unsigned char no_elements[64];

[[noreturn]] void unsupported(const char* function, const std::string& what) {
  throw attn::TypeError(std::string(function) + ": " + what);
}

// The options a caller of any struct version passed (see attn.h).
attn::AttentionOptions options_of(const attn_options* given, const char* function) {
  attn_options o;
  attn_options_init(&o);
  if (given) {
    if (given->size > sizeof(attn_options)) {
      const auto* extra = reinterpret_cast<const unsigned char*>(given) + sizeof(attn_options);
      for (size_t i = 0; i < given->size - sizeof(attn_options); ++i)
        if (extra[i])
          fail(function, "options", "size " + std::to_string(given->size) +
                                        " is larger than this library's attn_options (" +
                                        std::to_string(sizeof(attn_options)) +
                                        ") and the extra bytes are not zero");
    }
    // Each field the caller's struct covers whole, the others at their defaults.
    const auto take = [&](auto& field, const auto& from) {
      const size_t end = reinterpret_cast<const char*>(&from) - reinterpret_cast<const char*>(given) + sizeof(from);
      if (end <= given->size) field = from;
    };
    take(o.causal, given->causal);
    take(o.scale, given->scale);
    take(o.softcap, given->softcap);
    take(o.window_left, given->window_left);
    take(o.window_right, given->window_right);
    take(o.alibi_slopes, given->alibi_slopes);
    take(o.causal_offset, given->causal_offset);
    take(o.sinks, given->sinks);
    take(o.precision, given->precision);
  }
  attn::AttentionOptions a;
  switch (o.causal) {
    case 0: a.causal = attn::Causal::None; break;
    case 1: a.causal = attn::Causal::BottomRight; break;
    case 2: a.causal = attn::Causal::TopLeft; break;
    case 3: a.causal = attn::Causal::offset(o.causal_offset); break;
    default:
      fail(function, "options", "causal " + std::to_string(o.causal) +
                                    " is not 0 (none), 1 (bottom-right), 2 (top-left) or 3 (offset)");
  }
  switch (o.precision) {
    case 0: a.precision = attn::Precision::Float32; break;
    case 1: a.precision = attn::Precision::BF16; break;
    case 2: a.precision = attn::Precision::Int8; break;
    default:
      fail(function, "options",
           "precision " + std::to_string(o.precision) + " is not 0 (f32), 1 (bf16) or 2 (int8)");
  }
  if (o.scale != 0) a.scale = o.scale;
  a.softcap = o.softcap;
  a.window = {o.window_left, o.window_right};
  // ALiBi's slopes and the sinks: an F64 or F32 tensor (Hq).
  const auto per_head = [&](const attn_tensor* t, const char* name, const char* what) {
    std::vector<double> values;
    if (!t) return values;
    const Layout l = layout_of(t, function, name);
    if (l.shape.size() != 1)
      fail(function, name, std::string("must be one ") + what + " per query head, shape (Hq), got " +
                               attn::shape_str(l.shape));
    const auto read = [&](auto element) {
      using T = decltype(element);
      const TensorView<const T> v = view_of<const T>(t, l);
      for (int64_t h = 0; h < l.shape[0]; ++h) values.push_back(v.at({h}));
    };
    if (l.dtype == ATTN_F64) read(double{});
    else if (l.dtype == ATTN_F32) read(float{});
    else unsupported(function, std::string(name) + ": dtype " + dtype_name(l.dtype) + " is not F64 or F32");
    return values;
  };
  a.alibi_slopes = per_head(o.alibi_slopes, "options.alibi_slopes", "slope");
  a.sinks = per_head(o.sinks, "options.sinks", "logit");
  return a;
}

attn::Mask mask_of(const attn_tensor* mask, const char* function) {
  if (!mask) return {};
  const Layout l = layout_of(mask, function, "mask");
  switch (l.dtype) {
    case ATTN_BOOL: return view_of<const bool>(mask, l);
    case ATTN_F32: return view_of<const float>(mask, l);
    case ATTN_F64: return view_of<const double>(mask, l);
    default: unsupported(function, std::string("mask: dtype ") + dtype_name(l.dtype) +
                                       " is not BOOL, F32 or F64");
  }
}

attn::KVDtype cache_dtype(attn_dtype dtype, const char* fn) {
  int d;  // read as the int it is (see layout_of)
  std::memcpy(&d, &dtype, sizeof d);
  switch (d) {
    case ATTN_F32: return attn::KVDtype::F32;
    case ATTN_BF16: return attn::KVDtype::BF16;
    case ATTN_F16: return attn::KVDtype::F16;
    case ATTN_Q8_0: return attn::KVDtype::Q8_0;
    case ATTN_Q4_0: return attn::KVDtype::Q4_0;
    case ATTN_INT4: return attn::KVDtype::INT4;
    default: unsupported(fn, "dtype " + std::to_string(d) + " is not a cache's: F32, BF16, F16, Q8_0, Q4_0 or INT4");
  }
}

}  // namespace attn::detail::capi

namespace {

using namespace attn::detail::capi;

// The extras of attn_attention_extras, each an optional tensor of q's dtype.
struct CExtras {
  attn_tensor *weights = nullptr, *logits = nullptr, *lse = nullptr;
  attn::Logits stage = attn::Logits::Masked;
};

template <class T, class KV>
void attention_as(const attn_tensor* q, const Layout& lq, const attn_tensor* k, const Layout& lk,
                  const attn_tensor* v, const Layout& lv, const attn::Mask& mask,
                  const attn::AttentionOptions& options, attn_tensor* out, const Layout& lo,
                  const CExtras& c, const char* fn) {
  attn::AttentionExtras<T> extras;
  const auto bind = [&](attn_tensor* t, const char* name) {
    if (!t) return TensorView<T>();
    const Layout l = layout_of(t, fn, name);
    if (l.dtype != lq.dtype)
      unsupported(fn, std::string(name) + ": dtype " + dtype_name(l.dtype) + " is not q's, " + dtype_name(lq.dtype));
    return view_of<T>(t, l);
  };
  extras.weights = bind(c.weights, "weights");
  extras.logits = bind(c.logits, "logits");
  extras.logits_stage = c.stage;
  extras.lse = bind(c.lse, "lse");
  attn::AttentionPlan<T, KV>(view_of<const T>(q, lq), view_of<const KV>(k, lk), view_of<const KV>(v, lv), options,
                             mask)
      .run(view_of<T>(out, lo), extras);
}

int new_cache(const attn_mha* layer, attn_dtype dtype, attn_cache** cache, const char* fn) {
  return guarded([&] {
    require(layer, fn, "layer");
    require(cache, fn, "cache");
    *cache = nullptr;
    const attn::KVDtype stored = cache_dtype(dtype, fn);
    const int64_t head_dim = layer->layer.config().head_dim();
    if (attn::is_block_dtype(stored) && head_dim % 32 != 0)
      fail(fn, "dtype", std::string(dtype_name(dtype)) + " stores blocks of 32 values, so the layer's head_dim (" +
                            std::to_string(head_dim) + ") must be a multiple of 32");
    *cache = new attn_cache{layer->layer.new_cache(stored)};
  });
}

// attn_attention and attn_attention_extras: one call with or without extras.
int attention_with(const attn_tensor* q, const attn_tensor* k, const attn_tensor* v, const attn_tensor* mask,
                   const attn_options* options, attn_tensor* out, const CExtras& extras, const char* fn) {
  return guarded([&] {
    const Layout lq = layout_of(q, fn, "q"), lk = layout_of(k, fn, "k", -2), lv = layout_of(v, fn, "v"),
                 lo = layout_of(out, fn, "out");
    const attn::Mask m = mask_of(mask, fn);
    const attn::AttentionOptions o = options_of(options, fn);
    if (lk.dtype != lv.dtype || lo.dtype != lq.dtype ||
        !((lq.dtype == ATTN_F64 && lk.dtype == ATTN_F64) ||
          (lq.dtype == ATTN_F32 && (lk.dtype == ATTN_F32 || lk.dtype == ATTN_BF16 ||
                                    lk.dtype == ATTN_F16 || lk.dtype == ATTN_Q8_0 || lk.dtype == ATTN_Q4_0 ||
                                    lk.dtype == ATTN_INT4))))
      unsupported(fn, std::string("dtypes q ") + dtype_name(lq.dtype) + ", k " + dtype_name(lk.dtype) +
                          ", v " + dtype_name(lv.dtype) + ", out " + dtype_name(lo.dtype) +
                          " are not supported: q and out F32 with k and v F32, BF16, F16, Q8_0, Q4_0 or INT4, or all F64");
    if (lk.dtype == ATTN_INT4 && lv.dtype == ATTN_INT4 && v->rank >= 2 && k->shape[k->rank - 2] != v->shape[v->rank - 2])
      fail(fn, "k", "INT4 keys and values must hold the same number of keys (axis -2), got k " +
                        attn::shape_str(Shape(k->shape, k->shape + k->rank)) + ", v " +
                        attn::shape_str(Shape(v->shape, v->shape + v->rank)));
    switch (lk.dtype) {
      case ATTN_F64: return attention_as<double, double>(q, lq, k, lk, v, lv, m, o, out, lo, extras, fn);
      case ATTN_BF16: return attention_as<float, attn::bfloat16>(q, lq, k, lk, v, lv, m, o, out, lo, extras, fn);
      case ATTN_F16: return attention_as<float, attn::float16>(q, lq, k, lk, v, lv, m, o, out, lo, extras, fn);
      case ATTN_Q8_0: return attention_as<float, attn::block_q8_0>(q, lq, k, lk, v, lv, m, o, out, lo, extras, fn);
      case ATTN_Q4_0: return attention_as<float, attn::block_q4_0>(q, lq, k, lk, v, lv, m, o, out, lo, extras, fn);
      case ATTN_INT4: return attention_as<float, attn::block_int4>(q, lq, k, lk, v, lv, m, o, out, lo, extras, fn);
      default: return attention_as<float, float>(q, lq, k, lk, v, lv, m, o, out, lo, extras, fn);
    }
  });
}

}  // namespace

extern "C" {

void attn_options_init(attn_options* options) {
  if (!options) return;
  *options = attn_options{};
  options->size = sizeof(attn_options);
  options->window_left = -1;
  options->window_right = -1;
}

int attn_attention(const attn_tensor* q, const attn_tensor* k, const attn_tensor* v,
                   const attn_tensor* mask, const attn_options* options, attn_tensor* out) {
  return attention_with(q, k, v, mask, options, out, {}, "attn_attention");
}

int attn_attention_extras(const attn_tensor* q, const attn_tensor* k, const attn_tensor* v,
                          const attn_tensor* mask, const attn_options* options, attn_tensor* out,
                          attn_tensor* weights, attn_tensor* logits, int32_t logits_stage, attn_tensor* lse) {
  const char* fn = "attn_attention_extras";
  CExtras extras{weights, logits, lse, attn::Logits::Masked};
  if (logits_stage < 0 || logits_stage > 2)
    return guarded([&] {
      fail(fn, "logits_stage", std::to_string(logits_stage) + " is not 0 (scaled), 1 (softcapped) or 2 (masked)");
    });
  extras.stage = std::array{attn::Logits::Scaled, attn::Logits::Softcapped, attn::Logits::Masked}[logits_stage];
  return attention_with(q, k, v, mask, options, out, extras, fn);
}

int attn_sinusoidal_encoding(int64_t n, int64_t d, double base, attn_tensor* out) {
  return guarded([&] {
    const char* fn = "attn_sinusoidal_encoding";
    if (n < 0) fail(fn, "n", "must be >= 0, got " + std::to_string(n));
    if (d < 1) fail(fn, "d", "must be >= 1, got " + std::to_string(d));
    const Layout lo = layout_of(out, fn, "out");
    if (lo.shape != Shape{n, d})
      fail(fn, "out", "shape " + attn::shape_str(lo.shape) + " is not (n, d) = " +
                          attn::shape_str(Shape{n, d}));
    if (lo.dtype == ATTN_F32) return attn::sinusoidal_encoding(view_of<float>(out, lo), base);
    if (lo.dtype == ATTN_F64) return attn::sinusoidal_encoding(view_of<double>(out, lo), base);
    unsupported(fn, std::string("out: dtype ") + dtype_name(lo.dtype) + " is not F32 or F64");
  });
}

int attn_rope(const attn_tensor* x, const int64_t* positions, double base, int32_t interleaved,
              int64_t rotary_dim, attn_tensor* out) {
  return guarded([&] {
    const char* fn = "attn_rope";
    if (interleaved != 0 && interleaved != 1)
      fail(fn, "interleaved", "must be 0 (halves) or 1 (pairs), got " + std::to_string(interleaved));
    const Layout lx = layout_of(x, fn, "x"), lo = layout_of(out, fn, "out");
    attn::RopeOptions options;
    options.base = base;
    options.interleaved = interleaved != 0;
    if (rotary_dim != 0) options.rotary_dim = rotary_dim;
    TensorView<const int64_t> pos;
    // n positions, one per row: x's axis -2 (apply_rope refuses a lower rank).
    if (positions && lx.shape.size() >= 2) pos = {positions, Shape{lx.shape[lx.shape.size() - 2]}};
    if (lx.dtype != lo.dtype || (lx.dtype != ATTN_F32 && lx.dtype != ATTN_F64))
      unsupported(fn, std::string("dtypes x ") + dtype_name(lx.dtype) + ", out " + dtype_name(lo.dtype) +
                          " are not supported: both F32 or both F64");
    if (lx.dtype == ATTN_F32)
      return attn::apply_rope(view_of<const float>(x, lx), view_of<float>(out, lo), options, pos);
    attn::apply_rope(view_of<const double>(x, lx), view_of<double>(out, lo), options, pos);
  });
}

int attn_rope_frequencies(int64_t rotary_dim, double base, const char* rope_scaling, int64_t seq_len,
                          double* inv_freq, double* attention_factor) {
  return guarded([&] {
    const char* fn = "attn_rope_frequencies";
    require(attention_factor, fn, "attention_factor");
    if (rotary_dim > 0) require(inv_freq, fn, "inv_freq");
    const attn::RopeScaling scaling = rope_scaling ? attn::parse_rope_scaling(rope_scaling) : attn::RopeScaling{};
    const attn::RopeFrequencies f = attn::rope_frequencies(
        rotary_dim, base, scaling, seq_len < 0 ? std::nullopt : std::optional<int64_t>(seq_len));
    std::copy(f.inv_freq.begin(), f.inv_freq.end(), inv_freq);
    *attention_factor = f.attention_factor;
  });
}

int attn_alibi_slopes(int64_t num_heads, double max_bias, double* slopes) {
  return guarded([&] {
    const std::vector<double> s = attn::alibi_slopes(num_heads, max_bias);
    require(slopes, "attn_alibi_slopes", "slopes");
    std::copy(s.begin(), s.end(), slopes);
  });
}

int attn_mha_load(const char* safetensors_path, attn_mha** layer) {
  return guarded([&] {
    const char* fn = "attn_mha_load";
    require(safetensors_path, fn, "safetensors_path");
    require(layer, fn, "layer");
    *layer = nullptr;
    *layer = new attn_mha{attn::MultiHeadAttention<float>::load(safetensors_path)};
  });
}

int attn_mha_forward(attn_mha* layer, const attn_tensor* x, attn_cache* cache,
                     const attn_options* options, attn_tensor* out) {
  return guarded([&] {
    const char* fn = "attn_mha_forward";
    require(layer, fn, "layer");
    const Layout lx = layout_of(x, fn, "x"), lo = layout_of(out, fn, "out");
    if (lx.dtype != ATTN_F32 || lo.dtype != ATTN_F32)
      unsupported(fn, std::string("dtypes x ") + dtype_name(lx.dtype) + ", out " + dtype_name(lo.dtype) +
                          " are not supported: the layer is F32");
    attn::MhaForwardOptions<float> forward;
    forward.attention = options_of(options, fn);
    forward.cache = cache ? &cache->cache : nullptr;
    const TensorView<float> o = view_of<float>(out, lo);
    const TensorView<const float> query = view_of<const float>(x, lx);
    // Checked before the forward, so that a refused call leaves the cache as it was.
    if (o.shape() != query.shape())
      fail(fn, "out", "shape " + attn::shape_str(o.shape()) + " is not x's shape " +
                          attn::shape_str(query.shape()));
    attn::check_outputs(fn, {{"out", attn::MemorySpan::of(o)}},
                                {{"x", attn::MemorySpan::of(query)}});
    attn::copy<float>(layer->layer.forward(query, {}, {}, forward).out.view(), o);
  });
}

int attn_cache_new(const attn_mha* layer, attn_cache** cache) {
  return new_cache(layer, ATTN_F32, cache, "attn_cache_new");
}

int attn_cache_new_dtype(const attn_mha* layer, attn_dtype dtype, attn_cache** cache) {
  return new_cache(layer, dtype, cache, "attn_cache_new_dtype");
}
int attn_cache_bytes(const attn_cache* cache, int64_t* bytes) {
  return guarded([&] {
    require(cache, "attn_cache_bytes", "cache");
    require(bytes, "attn_cache_bytes", "bytes");
    *bytes = cache->cache.bytes();
  });
}

void attn_cache_free(attn_cache* cache) { delete cache; }

void attn_mha_free(attn_mha* layer) { delete layer; }

int attn_mla_load(const char* config_json, const char* safetensors_path, const char* prefix, attn_mla** layer) {
  return guarded([&] {
    const char* fn = "attn_mla_load";
    require(config_json, fn, "config_json");
    require(safetensors_path, fn, "safetensors_path");
    require(layer, fn, "layer");
    *layer = nullptr;
    attn::MultiHeadLatentAttention m(attn::mla_config_from_json(config_json));
    m.load_safetensors(safetensors_path, prefix ? prefix : "");
    *layer = new attn_mla{std::move(m)};
  });
}

int attn_mla_forward(attn_mla* layer, const attn_tensor* x, attn_latent_cache* cache, attn_tensor* out) {
  return guarded([&] {
    const char* fn = "attn_mla_forward";
    require(layer, fn, "layer");
    const Layout lx = layout_of(x, fn, "x"), lo = layout_of(out, fn, "out");
    if (lx.dtype != ATTN_F32 || lo.dtype != ATTN_F32)
      unsupported(fn, std::string("dtypes x ") + dtype_name(lx.dtype) + ", out " + dtype_name(lo.dtype) +
                          " are not supported: the layer is F32");
    const TensorView<float> o = view_of<float>(out, lo);
    const TensorView<const float> input = view_of<const float>(x, lx);
    // Checked before the forward, so that a refused call leaves the cache as it was.
    if (o.shape() != input.shape())
      fail(fn, "out", "shape " + attn::shape_str(o.shape()) + " is not x's shape " + attn::shape_str(input.shape()));
    attn::check_outputs(fn, {{"out", attn::MemorySpan::of(o)}}, {{"x", attn::MemorySpan::of(input)}});
    attn::copy<float>(layer->layer.forward(input, cache ? &cache->cache : nullptr).view(), o);
  });
}

int attn_latent_cache_new(const attn_mla* layer, attn_dtype dtype, attn_latent_cache** cache) {
  return guarded([&] {
    const char* fn = "attn_latent_cache_new";
    require(layer, fn, "layer");
    require(cache, fn, "cache");
    *cache = nullptr;
    *cache = new attn_latent_cache{layer->layer.new_cache(cache_dtype(dtype, fn))};
  });
}

int attn_latent_cache_bytes(const attn_latent_cache* cache, int64_t* bytes) {
  return guarded([&] {
    require(cache, "attn_latent_cache_bytes", "cache");
    require(bytes, "attn_latent_cache_bytes", "bytes");
    *bytes = cache->cache.nbytes();
  });
}

void attn_latent_cache_free(attn_latent_cache* cache) { delete cache; }

void attn_mla_free(attn_mla* layer) { delete layer; }

int attn_set_num_threads(int32_t n) {
  return guarded([&] { attn::set_num_threads(n); });
}

const char* attn_version(void) { return ATTN_VERSION; }

const char* attn_last_error(void) { return last_error.c_str(); }

}  // extern "C"
