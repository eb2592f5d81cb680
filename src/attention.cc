// attention() and attention_backward(): validate the arguments, normalize
// them into an AttentionProblem and dispatch: float32 to the SIMD kernel,
// float64 to the double-precision reference (the backward: the reference for
// both, for now).
#include "attn/attention.hpp"

#include <cmath>
#include <limits>
#include <string>

#include "attention_problem.hpp"
#include "kernels/attention_kernel.hpp"

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

// Sees a view of shape (batch..., [heads,] rows, cols) as an Operand.
template <class T>
Operand<T> operand(const TensorView<T>& t, const Shape& batch) {
  Operand<T> o;
  o.data = t.data();
  const int r = t.rank();
  o.row_stride = t.stride(r - 2);
  o.col_stride = t.stride(r - 1);
  o.head_stride = r >= 3 ? t.stride(r - 3) : 0;
  const int nb = static_cast<int>(batch.size());
  int64_t count = 1;
  for (int64_t n : batch) count *= n;
  o.batch_offset.resize(static_cast<size_t>(count));
  std::vector<int64_t> index(nb, 0);
  for (int64_t b = 0; b < count; ++b) {
    int64_t off = 0;
    for (int a = 0; a < nb; ++a) off += index[a] * t.stride(a);
    o.batch_offset[b] = off;
    for (int a = nb - 1; a >= 0; --a) {
      if (++index[a] < batch[a]) break;
      index[a] = 0;
    }
  }
  return o;
}

template <class M>
Operand<const M> mask_operand(const TensorView<const M>& m, const Shape& target,
                              const Shape& batch) {
  const Strides s = broadcast_strides(m.shape(), m.strides(), target, "attention: mask");
  return operand(TensorView<const M>(m.data(), target, s), batch);
}

}  // namespace

template <class T, class KV>
AttentionProblem<T> make_problem(TensorView<const T> q, TensorView<const KV> k,
                                 TensorView<const KV> v, TensorView<T> out,
                                 const AttentionOptions& options, const MaskInput& mask,
                                 TensorView<T> weights, const MaskInput& second) {
  const Dims s = check_shapes(q.shape(), k.shape(), v.shape());
  const bool heads = q.rank() >= 3;
  const Shape out_shape = with_tail(s, heads, s.n_q, s.d_v);
  const Shape weights_shape = with_tail(s, heads, s.n_q, s.n_k);
  if (out.shape() != out_shape)
    fail("out has shape " + shape_str(out.shape()) + ", expected " + shape_str(out_shape));
  if (!weights.empty_view() && weights.shape() != weights_shape)
    fail("weights has shape " + shape_str(weights.shape()) + ", expected " +
         shape_str(weights_shape));

  if (options.scale && !std::isfinite(*options.scale))
    fail("scale must be finite, got " + std::to_string(*options.scale));
  if (!(options.softcap >= 0) || !std::isfinite(options.softcap))
    fail("softcap must be a finite number >= 0 (0 = off), got " +
         std::to_string(options.softcap));
  if (options.window.left < -1 || options.window.right < -1)
    fail("window sizes must be >= 0, or -1 for unbounded, got (" +
         std::to_string(options.window.left) + ", " +
         std::to_string(options.window.right) + ")");

  AttentionProblem<T> p;
  p.batch = 1;
  for (int64_t n : s.batch) p.batch *= n;
  p.heads_q = s.heads_q;
  p.heads_kv = s.heads_kv;
  p.n_q = s.n_q;
  p.n_k = s.n_k;
  p.d = s.d;
  p.d_v = s.d_v;
  p.q = operand(q, s.batch);
  if constexpr (std::is_same_v<KV, T>) {
    p.k = operand(k, s.batch);
    p.v = operand(v, s.batch);
  } else {
    static_assert(sizeof(KV) == sizeof(uint16_t));
    const auto bits = [](const TensorView<const KV>& t) {
      return TensorView<const uint16_t>(reinterpret_cast<const uint16_t*>(t.data()), t.shape(),
                                        t.strides());
    };
    p.kv = std::is_same_v<KV, bfloat16> ? KVStorage::BF16 : KVStorage::F16;
    p.k16 = operand(bits(k), s.batch);
    p.v16 = operand(bits(v), s.batch);
  }
  p.out = operand(out, s.batch);
  if (!weights.empty_view()) p.weights = operand(weights, s.batch);
  const MaskInput* inputs[2] = {&mask, &second};
  for (int t = 0; t < 2; ++t) {
    MaskTerm& term = p.mask.terms[t];
    const Mask& m = inputs[t]->mask;
    term.blocking = inputs[t]->true_blocks;
    if (const auto* b = std::get_if<TensorView<const bool>>(&m))
      term.boolean = mask_operand(*b, weights_shape, s.batch);
    if (const auto* f = std::get_if<TensorView<const float>>(&m))
      term.f32 = mask_operand(*f, weights_shape, s.batch);
    if (const auto* f = std::get_if<TensorView<const double>>(&m))
      term.f64 = mask_operand(*f, weights_shape, s.batch);
  }
  p.scale = options.scale ? *options.scale : (s.d > 0 ? 1.0 / std::sqrt(double(s.d)) : 1.0);
  p.causal = options.causal;
  p.window = options.window;
  p.softcap = options.softcap;
  return p;
}

template <class T>
std::pair<AttentionProblem<T>, GradientOperands<T>> make_backward_problem(
    TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
    TensorView<const T> dout, TensorView<T> dq, TensorView<T> dk, TensorView<T> dv,
    const AttentionOptions& options, const MaskInput& mask, const MaskInput& second) {
  const Dims s = check_shapes(q.shape(), k.shape(), v.shape());
  const Shape out_shape = with_tail(s, q.rank() >= 3, s.n_q, s.d_v);
  if (dout.shape() != out_shape)
    fail("dout has shape " + shape_str(dout.shape()) + ", expected the output's shape " +
         shape_str(out_shape));
  const auto check_grad = [](const char* name, const Shape& got, const char* of, const Shape& want) {
    if (got != want)
      fail(std::string(name) + " has shape " + shape_str(got) + ", expected " + of +
           "'s shape " + shape_str(want));
  };
  check_grad("dq", dq.shape(), "q", q.shape());
  check_grad("dk", dk.shape(), "k", k.shape());
  check_grad("dv", dv.shape(), "v", v.shape());
  // The forward problem with no output to write (its operand has a null pointer).
  std::pair<AttentionProblem<T>, GradientOperands<T>> r{
      make_problem(q, k, v, TensorView<T>(nullptr, out_shape), options, mask, TensorView<T>(),
                   second),
      {}};
  r.second.dout = operand(dout, s.batch);
  r.second.dq = operand(dq, s.batch);
  r.second.dk = operand(dk, s.batch);
  r.second.dv = operand(dv, s.batch);
  return r;
}

}  // namespace detail

Shape attention_output_shape(const Shape& q, const Shape& k, const Shape& v) {
  const auto s = detail::check_shapes(q, k, v);
  return detail::with_tail(s, q.size() >= 3, s.n_q, s.d_v);
}

Shape attention_weights_shape(const Shape& q, const Shape& k, const Shape& v) {
  const auto s = detail::check_shapes(q, k, v);
  return detail::with_tail(s, q.size() >= 3, s.n_q, s.n_k);
}

namespace detail {
namespace {

// The float32 entry: the kernels read and write rows with unit stride; other
// layouts go through contiguous copies.
template <class KV>
void attention_f32(TensorView<const float> q, TensorView<const KV> k, TensorView<const KV> v,
                   TensorView<float> out, const AttentionOptions& options, const MaskInput& mask,
                   TensorView<float> weights, const MaskInput& second) {
  // Built (and validated) on the caller's views, so errors name them; built
  // again only when a layout had to be copied.
  auto p = make_problem(q, k, v, out, options, mask, weights, second);
  const auto unit = [](const auto& t) { return t.rank() == 0 || t.stride(-1) == 1 || t.dim(-1) <= 1; };
  Tensor<float> qc, oc;
  Tensor<KV> kc, vc;
  if (!unit(q)) q = (qc = contiguous(q)).view();
  if (!unit(k)) k = (kc = contiguous(k)).view();
  if (!unit(v)) v = (vc = contiguous(v)).view();
  TensorView<float> o = out;
  if (!unit(out)) o = (oc = Tensor<float>(out.shape())).view();
  if (qc.rank() || kc.rank() || vc.rank() || oc.rank())
    p = make_problem(q, k, v, o, options, mask, weights, second);
  if (use_decode(p))
    decode_forward(p);
  else
    flash_forward(p);
  if (o.data() != out.data()) copy<float>(oc.view(), out);
}

}  // namespace

template <class T>
void masked_attention(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                      TensorView<T> out, const AttentionOptions& options, const MaskInput& mask,
                      const MaskInput& second, TensorView<T> weights) {
  if constexpr (std::is_same_v<T, double>)
    reference_attention(make_problem(q, k, v, out, options, mask, weights, second));
  else
    attention_f32(q, k, v, out, options, mask, weights, second);
}
template void masked_attention(TensorView<const float>, TensorView<const float>,
                               TensorView<const float>, TensorView<float>,
                               const AttentionOptions&, const MaskInput&, const MaskInput&,
                               TensorView<float>);
template void masked_attention(TensorView<const double>, TensorView<const double>,
                               TensorView<const double>, TensorView<double>,
                               const AttentionOptions&, const MaskInput&, const MaskInput&,
                               TensorView<double>);

}  // namespace detail

void attention(TensorView<const double> q, TensorView<const double> k,
               TensorView<const double> v, TensorView<double> out,
               const AttentionOptions& options, const Mask& mask,
               TensorView<double> weights) {
  detail::masked_attention(q, k, v, out, options, {mask}, {}, weights);
}
void attention(TensorView<const float> q, TensorView<const float> k,
               TensorView<const float> v, TensorView<float> out,
               const AttentionOptions& options, const Mask& mask,
               TensorView<float> weights) {
  detail::masked_attention(q, k, v, out, options, {mask}, {}, weights);
}
void attention(TensorView<const float> q, TensorView<const bfloat16> k,
               TensorView<const bfloat16> v, TensorView<float> out,
               const AttentionOptions& options, const Mask& mask, TensorView<float> weights) {
  detail::attention_f32(q, k, v, out, options, {mask}, weights, {});
}
void attention(TensorView<const float> q, TensorView<const float16> k,
               TensorView<const float16> v, TensorView<float> out,
               const AttentionOptions& options, const Mask& mask, TensorView<float> weights) {
  detail::attention_f32(q, k, v, out, options, {mask}, weights, {});
}

namespace detail {

template <class T>
void masked_attention_backward(TensorView<const T> q, TensorView<const T> k,
                               TensorView<const T> v, TensorView<const T> dout, TensorView<T> dq,
                               TensorView<T> dk, TensorView<T> dv, const AttentionOptions& options,
                               const MaskInput& mask, const MaskInput& second) {
  if constexpr (std::is_same_v<T, double>) {
    const auto [p, g] = make_backward_problem(q, k, v, dout, dq, dk, dv, options, mask, second);
    reference_attention_backward(p, g);
  } else {
    // No float32 kernel yet (a fast one is planned): compute through the
    // double reference, converting in and out. The float mask is read as it is.
    const auto wide = [](TensorView<const float> t) {
      Tensor<double> d(t.shape());
      copy<float>(t, d.view());
      return d;
    };
    const Tensor<double> q64 = wide(q), k64 = wide(k), v64 = wide(v), dout64 = wide(dout);
    Tensor<double> dq64(dq.shape()), dk64(dk.shape()), dv64(dv.shape());
    masked_attention_backward<double>(q64.view(), k64.view(), v64.view(), dout64.view(),
                                      dq64.view(), dk64.view(), dv64.view(), options, mask, second);
    copy<double>(dq64.view(), dq);
    copy<double>(dk64.view(), dk);
    copy<double>(dv64.view(), dv);
  }
}
template void masked_attention_backward(TensorView<const float>, TensorView<const float>,
                                        TensorView<const float>, TensorView<const float>,
                                        TensorView<float>, TensorView<float>, TensorView<float>,
                                        const AttentionOptions&, const MaskInput&,
                                        const MaskInput&);
template void masked_attention_backward(TensorView<const double>, TensorView<const double>,
                                        TensorView<const double>, TensorView<const double>,
                                        TensorView<double>, TensorView<double>, TensorView<double>,
                                        const AttentionOptions&, const MaskInput&,
                                        const MaskInput&);

}  // namespace detail

void attention_backward(TensorView<const double> q, TensorView<const double> k,
                        TensorView<const double> v, TensorView<const double> dout,
                        TensorView<double> dq, TensorView<double> dk, TensorView<double> dv,
                        const AttentionOptions& options, const Mask& mask) {
  detail::masked_attention_backward(q, k, v, dout, dq, dk, dv, options, {mask}, {});
}
void attention_backward(TensorView<const float> q, TensorView<const float> k,
                        TensorView<const float> v, TensorView<const float> dout,
                        TensorView<float> dq, TensorView<float> dk, TensorView<float> dv,
                        const AttentionOptions& options, const Mask& mask) {
  detail::masked_attention_backward(q, k, v, dout, dq, dk, dv, options, {mask}, {});
}

namespace {
template <class T>
AttentionGradients<T> attention_backward_alloc(TensorView<const T> q, TensorView<const T> k,
                                               TensorView<const T> v, TensorView<const T> dout,
                                               const AttentionOptions& options,
                                               const Mask& mask) {
  AttentionGradients<T> g{Tensor<T>(q.shape()), Tensor<T>(k.shape()), Tensor<T>(v.shape())};
  attention_backward(q, k, v, dout, g.dq.view(), g.dk.view(), g.dv.view(), options, mask);
  return g;
}
}  // namespace

AttentionGradients<float> attention_backward(TensorView<const float> q,
                                             TensorView<const float> k,
                                             TensorView<const float> v,
                                             TensorView<const float> dout,
                                             const AttentionOptions& options,
                                             const Mask& mask) {
  return attention_backward_alloc<float>(q, k, v, dout, options, mask);
}
AttentionGradients<double> attention_backward(TensorView<const double> q,
                                              TensorView<const double> k,
                                              TensorView<const double> v,
                                              TensorView<const double> dout,
                                              const AttentionOptions& options,
                                              const Mask& mask) {
  return attention_backward_alloc<double>(q, k, v, dout, options, mask);
}

namespace {
template <class T>
Tensor<T> attention_alloc(TensorView<const T> q, TensorView<const T> k,
                          TensorView<const T> v, const AttentionOptions& options,
                          const Mask& mask, Tensor<T>* weights) {
  Tensor<T> out(attention_output_shape(q.shape(), k.shape(), v.shape()));
  TensorView<T> w;
  if (weights) {
    *weights = Tensor<T>(attention_weights_shape(q.shape(), k.shape(), v.shape()));
    w = weights->view();
  }
  attention(q, k, v, out.view(), options, mask, w);
  return out;
}
}  // namespace

Tensor<float> attention(TensorView<const float> q, TensorView<const float> k,
                        TensorView<const float> v, const AttentionOptions& options,
                        const Mask& mask) {
  return attention_alloc<float>(q, k, v, options, mask, nullptr);
}
Tensor<double> attention(TensorView<const double> q, TensorView<const double> k,
                         TensorView<const double> v, const AttentionOptions& options,
                         const Mask& mask) {
  return attention_alloc<double>(q, k, v, options, mask, nullptr);
}
AttentionResult<float> attention_with_weights(TensorView<const float> q,
                                              TensorView<const float> k,
                                              TensorView<const float> v,
                                              const AttentionOptions& options,
                                              const Mask& mask) {
  AttentionResult<float> r;
  r.out = attention_alloc<float>(q, k, v, options, mask, &r.weights);
  return r;
}
AttentionResult<double> attention_with_weights(TensorView<const double> q,
                                               TensorView<const double> k,
                                               TensorView<const double> v,
                                               const AttentionOptions& options,
                                               const Mask& mask) {
  AttentionResult<double> r;
  r.out = attention_alloc<double>(q, k, v, options, mask, &r.weights);
  return r;
}

}  // namespace attn
