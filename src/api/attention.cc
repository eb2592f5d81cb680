// attention() and AttentionPlan: validate the arguments once, normalize them
// into an core::AttentionProblem and dispatch: float32 to the SIMD kernels,
// float64 to the double-precision reference. (attention_backward:
// attention_backward.cc.)
#include "attn/attention.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "api/prepared_attention.hpp"
#include "kernels/attention_kernel.hpp"
#include "reference/reference.hpp"

namespace attn {
namespace detail {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw ValueError("attention: " + msg); }

struct Dims {
  Shape batch;  // leading axes
  int64_t heads_q, heads_kv, n_q, n_k, d, d_v;
};

Dims check_shapes(const Shape& q, const Shape& k, const Shape& v) {
  const auto shapes = "q " + shape_str(q) + ", k " + shape_str(k) + ", v " + shape_str(v);
  if (q.size() < 2)
    fail("q must have rank >= 2 (..., n_q, d), got shape " + shape_str(q));
  if (k.size() != q.size() || v.size() != q.size())
    fail("q, k and v must have the same rank, got " + shapes);
  const size_t r = q.size();
  Dims s;
  s.batch.assign(q.begin(), q.end() - std::min<size_t>(r, 3));
  for (size_t a = 0; a + 3 < r; ++a)
    if (k[a] != q[a] || v[a] != q[a])
      fail("batch axes must match, got " + shapes);
  s.heads_q = r >= 3 ? q[r - 3] : 1;
  s.heads_kv = r >= 3 ? k[r - 3] : 1;
  if (r >= 3 && v[r - 3] != k[r - 3])
    fail("k and v must have the same number of heads (axis -3), got " + shapes);
  if (s.heads_kv == 0 ? s.heads_q != 0 : s.heads_q % s.heads_kv != 0)
    fail("query heads (" + std::to_string(s.heads_q) +
         ") must be a multiple of key/value heads (" + std::to_string(s.heads_kv) +
         "), got " + shapes);
  s.n_q = q[r - 2];
  s.d = q[r - 1];
  s.n_k = k[r - 2];
  s.d_v = v[r - 1];
  if (k[r - 1] != s.d)
    fail("q and k must have the same head dimension (last axis), got " + shapes);
  if (v[r - 2] != s.n_k)
    fail("k and v must have the same number of keys (axis -2), got " + shapes);
  return s;
}

Shape with_tail(const Dims& s, bool heads, int64_t a, int64_t b) {
  Shape out = s.batch;
  if (heads) out.push_back(s.heads_q);
  out.push_back(a);
  out.push_back(b);
  return out;
}

template <class M, class T>
core::Operand<const M> mask_operand(const TensorView<const M>& m, const core::AttentionProblem<T>& p) {
  const Strides s = broadcast_strides(m.shape(), m.strides(), p.weights_shape, "attention: mask");
  return core::operand(TensorView<const M>(m.data(), p.weights_shape, s), p.batch_axes, p.batch);
}

// Points the problem's q, k and v at these views (compact K/V as their bytes).
template <class T, class KV>
void point_at(core::AttentionProblem<T>& p, TensorView<const T> q, TensorView<const KV> k,
              TensorView<const KV> v) {
  const Shape& batch = p.batch_axes;
  p.q = core::operand(q, batch, p.batch);
  if constexpr (std::is_same_v<KV, T>) {
    p.k = core::operand(k, batch, p.batch);
    p.v = core::operand(v, batch, p.batch);
  } else {
    const auto bytes = [&](const TensorView<const KV>& t) {
      const core::Operand<const KV> o = core::operand(t, batch, p.batch);
      constexpr auto size = static_cast<int64_t>(sizeof(KV));
      core::Operand<const std::byte> b;
      b.data = reinterpret_cast<const std::byte*>(o.data);
      for (int64_t off : o.batch_offset) b.batch_offset.push_back(off * size);
      b.head_stride = o.head_stride * size;
      b.row_stride = o.row_stride * size;
      b.col_stride = o.col_stride * size;
      return b;
    };
    p.kv = core::storage_of<KV>();
    p.k_stored = bytes(k);
    p.v_stored = bytes(v);
  }
}

// k's logical shape (..., n_k, d): for int4 keys, stored (..., ⌈n_k / 32⌉,
// d), with n_k from v's axis -2 (ValueError when the groups do not match).
template <class KV>
Shape key_shape(const TensorView<const KV>& k, const TensorView<const KV>& v) {
  if constexpr (!std::is_same_v<KV, block_int4>) {
    return core::logical_shape(k);
  } else {
    Shape s = k.shape();
    if (s.size() < 2 || v.rank() != k.rank()) return s;  // check_shapes names the ranks
    const int64_t n_k = v.dim(-2);
    if (s[s.size() - 2] != (n_k + kInt4Group - 1) / kInt4Group)
      fail("int4 keys are (..., ⌈n_k / 32⌉, d) groups of 32 tokens: v's " + std::to_string(n_k) + " keys need " +
           std::to_string((n_k + kInt4Group - 1) / kInt4Group) + ", got k (stored) " + shape_str(k.shape()) +
           ", v (stored) " + shape_str(v.shape()));
    s[s.size() - 2] = n_k;
    return s;
  }
}

}  // namespace

void check_options(const AttentionOptions& options, int64_t heads_q, bool float32) {
  if (options.precision != Precision::Float32 && !float32)
    fail("precision " + precision_name(options.precision) +
         " rounds float32 inputs: pass float32 q, k, v (float64 runs the reference, in float64)");
  if (options.scale && !std::isfinite(*options.scale))
    fail("scale must be finite, got " + std::to_string(*options.scale));
  if (!(options.softcap >= 0) || !std::isfinite(options.softcap))
    fail("softcap must be a finite number >= 0 (0 = off), got " +
         std::to_string(options.softcap));
  const int64_t offset = options.causal.offset_value();  // (std::abs(INT64_MIN) overflows)
  if (offset < -Causal::kMaxOffset || offset > Causal::kMaxOffset)
    fail("a causal offset must be within ±2^62, got " + std::to_string(offset));
  if (options.window.left < -1 || options.window.right < -1)
    fail("window sizes must be >= 0, or -1 for unbounded, got (" +
         std::to_string(options.window.left) + ", " +
         std::to_string(options.window.right) + ")");

  // ALiBi's slopes and the sinks: one finite number per query head, or none.
  const auto per_head = [&](const std::vector<double>& values, const char* name, const char* what) {
    if (values.empty()) return;
    if (static_cast<int64_t>(values.size()) != heads_q)
      fail(std::string(name) + " must hold one " + what + " per query head (" + std::to_string(heads_q) +
           "), got " + std::to_string(values.size()));
    for (double x : values)
      if (!std::isfinite(x)) fail(std::string(name) + " must be finite, got " + std::to_string(x));
  };
  per_head(options.alibi_slopes, "alibi_slopes", "slope");
  per_head(options.sinks, "sinks", "logit");
}

template <class T, class KV>
core::AttentionProblem<T> make_problem(TensorView<const T> q, TensorView<const KV> k,
                                 TensorView<const KV> v, const AttentionOptions& options,
                                 const AttentionMasks& masks) {
  const Dims s = check_shapes(q.shape(), key_shape(k, v), core::logical_shape(v));
  check_options(options, s.heads_q, std::is_same_v<T, float>);

  core::AttentionProblem<T> p;
  p.batch_axes = s.batch;
  p.heads_q = s.heads_q;
  p.heads_kv = s.heads_kv;
  p.n_q = s.n_q;
  p.n_k = s.n_k;
  p.d = s.d;
  p.d_v = s.d_v;
  const bool heads = q.rank() >= 3;
  p.out_shape = with_tail(s, heads, s.n_q, s.d_v);
  p.weights_shape = with_tail(s, heads, s.n_q, s.n_k);
  p.lse_shape = Shape(p.weights_shape.begin(), p.weights_shape.end() - 1);
  // A call with no element anywhere (in q, k, v, the output, the weights and
  // so the gradients) visits no batch entry: beside an axis of 0 the batch
  // axes may multiply past what any memory holds, and each operand keeps an
  // offset per entry.
  const bool nothing = q.numel() == 0 && k.numel() == 0 && v.numel() == 0 &&
                       numel_of(p.out_shape) == 0 && numel_of(p.weights_shape) == 0;
  p.batch = nothing ? 0 : numel_of(s.batch);
  point_at(p, q, k, v);
  const AttentionMask* inputs[2] = {&masks.first, &masks.second};
  for (int t = 0; t < 2; ++t) {
    core::MaskTerm& term = p.mask.terms[t];
    const Mask& m = inputs[t]->mask;
    term.blocking = inputs[t]->convention == MaskConvention::TrueBlocks;
    if (const auto* b = std::get_if<TensorView<const bool>>(&m))
      term.boolean = mask_operand(*b, p);
    if (const auto* f = std::get_if<TensorView<const float>>(&m))
      term.f32 = mask_operand(*f, p);
    if (const auto* f = std::get_if<TensorView<const double>>(&m))
      term.f64 = mask_operand(*f, p);
  }
  p.scale = options.scale ? *options.scale : (s.d > 0 ? 1.0 / std::sqrt(double(s.d)) : 1.0);
  p.causal = options.causal;
  p.window = options.window;
  p.softcap = options.softcap;
  p.alibi = options.alibi_slopes;
  p.sinks = options.sinks;
  p.precision = options.precision;
  return p;
}

template <class T>
void bind_outputs(core::AttentionProblem<T>& p, TensorView<T> out, const AttentionExtras<T>& extras) {
  const auto check = [](const char* name, const TensorView<T>& t, const Shape& want) {
    if (t.shape() != want)
      fail(std::string(name) + " has shape " + shape_str(t.shape()) + ", expected " + shape_str(want));
  };
  check("out", out, p.out_shape);  // never optional (an empty view is the wrong shape)
  const auto check_extra = [&](const char* name, const TensorView<T>& t, const Shape& want) {
    if (!t.empty_view()) check(name, t, want);
  };
  check_extra("weights", extras.weights, p.weights_shape);
  check_extra("logits", extras.logits, p.weights_shape);
  check_extra("lse", extras.lse, p.lse_shape);
  const auto bind = [&](const TensorView<T>& t) {
    return t.empty_view() ? core::Operand<T>() : core::operand(t, p.batch_axes, p.batch);
  };
  p.out = core::operand(out, p.batch_axes, p.batch);
  p.weights = bind(extras.weights);
  p.logits = bind(extras.logits);
  p.logits_stage = extras.logits_stage;
  if (!extras.lse.empty_view()) {  // seen as rows of one column
    Shape shape = extras.lse.shape();
    Strides strides = extras.lse.strides();
    shape.push_back(1);
    strides.push_back(1);
    p.lse = bind(TensorView<T>(extras.lse.data(), shape, strides));
  }
}
template void bind_outputs(core::AttentionProblem<float>&, TensorView<float>, const AttentionExtras<float>&);
template void bind_outputs(core::AttentionProblem<double>&, TensorView<double>, const AttentionExtras<double>&);

template <class T, class KV>
PreparedAttention<T, KV>::PreparedAttention(TensorView<const T> q, TensorView<const KV> k,
                                            TensorView<const KV> v,
                                            const AttentionOptions& options,
                                            const AttentionMasks& masks)
    : problem(make_problem(q, k, v, options, masks)), inputs{SpanCopy(q), SpanCopy(k), SpanCopy(v)} {
  for (const AttentionMask* m : {&masks.first, &masks.second})
    std::visit(
        [&](const auto& view) {
          if constexpr (!std::is_same_v<std::decay_t<decltype(view)>, std::monostate>) {
            input_names[n_inputs] = m == &masks.first ? "mask" : "key_padding_mask";
            inputs[n_inputs++] = SpanCopy(view);
          }
        },
        m->mask);
  if constexpr (std::is_same_v<T, float>) {
    // The kernels read rows with unit stride: other layouts are copied once,
    // here (the problem was built, and its errors name, the caller's views).
    if (core::unit_rows(q) && core::unit_rows(k) && core::unit_rows(v)) return;
    if (!core::unit_rows(q)) q = (q_copy = contiguous(q)).view();
    if (!core::unit_rows(k)) k = (k_copy = contiguous(k)).view();
    if (!core::unit_rows(v)) v = (v_copy = contiguous(v)).view();
    point_at(problem, q, k, v);
  }
}

template <class T, class KV>
int PreparedAttention<T, KV>::input_spans(NamedSpan* spans) const {
  for (int i = 0; i < n_inputs; ++i) spans[i] = {input_names[i], inputs[i].span()};
  return n_inputs;
}

template <class T, class KV>
void PreparedAttention<T, KV>::run(TensorView<T> out, const AttentionExtras<T>& extras) const {
  core::AttentionProblem<T> p = problem;
  bind_outputs(p, out, extras);
  NamedSpan inputs[5];
  const NamedSpan outputs[] = {{"out", MemorySpan::of(out)}, {"weights", MemorySpan::of(extras.weights)},
                               {"logits", MemorySpan::of(extras.logits)}, {"lse", MemorySpan::of(extras.lse)}};
  check_outputs("attention", outputs, std::span<const NamedSpan>(inputs, input_spans(inputs)));
  if constexpr (std::is_same_v<T, double>) {
    reference::reference_attention(p);
  } else {
    Tensor<float> staged;  // out with a column stride: written here, then copied
    if (!core::unit_rows(TensorView<const float>(out))) {
      staged = Tensor<float>(out.shape());
      p.out = core::operand(staged.view(), p.batch_axes, p.batch);
    }
    // (Decode computes in float32 whatever the precision, but for int8 over
    // q8_0 keys: docs/semantics.md "Precision".)
    if (kernels::use_decode(p)) kernels::decode_forward(p);
    else kernels::flash_forward(p);
    if (staged.rank()) copy<float>(staged.view(), out);
  }
}

template struct PreparedAttention<float, float>;
template struct PreparedAttention<float, bfloat16>;
template struct PreparedAttention<float, float16>;
template struct PreparedAttention<float, block_q8_0>;
template struct PreparedAttention<float, block_q4_0>;
template struct PreparedAttention<float, block_int4>;
template struct PreparedAttention<double, double>;

}  // namespace detail

Precision parse_precision(const std::string& name) {
  if (name == "f32") return Precision::Float32;
  if (name == "bf16") return Precision::BF16;
  if (name == "int8") return Precision::Int8;
  throw ValueError("precision must be 'f32', 'bf16' or 'int8', got '" + name + "'");
}

std::string precision_name(Precision precision) {
  switch (precision) {
    case Precision::BF16: return "bf16";
    case Precision::Int8: return "int8";
    default: return "f32";
  }
}

std::string precision_unit(Precision precision) {
  switch (precision) {
    case Precision::BF16: return kernels::bf16_prefill_unit();
    case Precision::Int8: return kernels::int8_prefill_unit();
    default: return "highway";
  }
}

std::string decode_precision_unit(Precision precision, int64_t rows_per_kv_head) {
  if (precision == Precision::Int8 && !kernels::decode_takes_int8_unit(rows_per_kv_head)) return "highway";
  return precision_unit(precision);
}

double precision_peak_loop(Precision precision, int64_t iterations, float* sink) {
  switch (precision) {
    case Precision::BF16: return kernels::bf16_peak_loop(iterations, sink);
    case Precision::Int8: return kernels::int8_peak_loop(iterations, sink);
    default: return kernels::fma_loop(iterations, sink);
  }
}

Logits parse_logits(const std::string& name) {
  if (name == "scaled") return Logits::Scaled;
  if (name == "softcapped") return Logits::Softcapped;
  if (name == "masked") return Logits::Masked;
  throw ValueError("return_logits must be 'scaled', 'softcapped' or 'masked', got '" + name + "'");
}

Shape attention_output_shape(const Shape& q, const Shape& k, const Shape& v) {
  const auto s = detail::check_shapes(q, k, v);
  return detail::with_tail(s, q.size() >= 3, s.n_q, s.d_v);
}

Shape attention_weights_shape(const Shape& q, const Shape& k, const Shape& v) {
  const auto s = detail::check_shapes(q, k, v);
  return detail::with_tail(s, q.size() >= 3, s.n_q, s.n_k);
}

template <class T>
void check_attention_options(const AttentionOptions& options, int64_t query_heads) {
  detail::check_options(options, query_heads, std::is_same_v<T, float>);
}
template void check_attention_options<float>(const AttentionOptions&, int64_t);
template void check_attention_options<double>(const AttentionOptions&, int64_t);

template <class T, class KV>
  requires ForwardTypes<T, KV>
struct AttentionPlan<T, KV>::Prepared : detail::PreparedAttention<T, KV> {
  using detail::PreparedAttention<T, KV>::PreparedAttention;
};

template <class T, class KV>
  requires ForwardTypes<T, KV>
AttentionPlan<T, KV>::AttentionPlan(TensorView<const T> q, TensorView<const KV> k,
                                    TensorView<const KV> v, const AttentionOptions& options,
                                    const AttentionMasks& masks)
    : prepared_(std::make_shared<const Prepared>(q, k, v, options, masks)) {}

template <class T, class KV>
  requires ForwardTypes<T, KV>
const Shape& AttentionPlan<T, KV>::output_shape() const {
  return prepared_->problem.out_shape;
}

template <class T, class KV>
  requires ForwardTypes<T, KV>
const Shape& AttentionPlan<T, KV>::weights_shape() const {
  return prepared_->problem.weights_shape;
}

template <class T, class KV>
  requires ForwardTypes<T, KV>
const Shape& AttentionPlan<T, KV>::lse_shape() const {
  return prepared_->problem.lse_shape;
}

template <class T, class KV>
  requires ForwardTypes<T, KV>
void AttentionPlan<T, KV>::run(TensorView<T> out, const AttentionExtras<T>& extras) const {
  prepared_->run(out, extras);
}

template <class T, class KV>
  requires ForwardTypes<T, KV>
Tensor<T> attention(TensorView<const T> q, TensorView<const KV> k, TensorView<const KV> v,
                    const AttentionOptions& options, const AttentionMasks& masks) {
  const AttentionPlan<T, KV> plan(q, k, v, options, masks);
  Tensor<T> out(plan.output_shape());
  plan.run(out.view());
  return out;
}

// The supported element types (AttentionTypes, Real).
#define ATTN_INSTANTIATE(T, KV)                                                                 \
  template class AttentionPlan<T, KV>;                                                          \
  template Tensor<T> attention(TensorView<const T>, TensorView<const KV>, TensorView<const KV>, \
                               const AttentionOptions&, const AttentionMasks&);
ATTN_FOR_EACH_ATTENTION_TYPE(ATTN_INSTANTIATE)
ATTN_INSTANTIATE(float, block_int4)
#undef ATTN_INSTANTIATE

}  // namespace attn
