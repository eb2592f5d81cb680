// attention_backward(): the gradient of attention, validated once as the
// forward is (PreparedAttention, the plan's), then the fused float32 kernel, or the
// double-precision reference (float64, and the float32 problems the kernel
// leaves to it).
#include <algorithm>
#include <cmath>
#include <string>

#include "api/prepared_attention.hpp"
#include "attn/attention.hpp"
#include "attn/quantize.hpp"
#include "kernels/attention_kernel.hpp"
#include "reference/reference.hpp"

namespace attn {
namespace detail {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw ValueError("attention: " + msg); }

}  // namespace

template <class T>
core::GradientOperands<T> gradient_operands(const core::AttentionProblem<T>& p, const Shape& q, const Shape& k,
                                      const Shape& v, TensorView<const T> dout, TensorView<T> dq,
                                      TensorView<T> dk, TensorView<T> dv, TensorView<T> dsinks) {
  if (dout.shape() != p.out_shape)
    fail("dout has shape " + shape_str(dout.shape()) + ", expected the output's shape " +
         shape_str(p.out_shape));
  const auto check_grad = [](const char* name, const Shape& got, const char* of, const Shape& want) {
    if (got != want)
      fail(std::string(name) + " has shape " + shape_str(got) + ", expected " + of +
           "'s shape " + shape_str(want));
  };
  check_grad("dq", dq.shape(), "q", q);
  check_grad("dk", dk.shape(), "k", k);
  check_grad("dv", dv.shape(), "v", v);
  core::GradientOperands<T> g;
  g.dout = core::operand(dout, p.batch_axes, p.batch);
  g.dq = core::operand(dq, p.batch_axes, p.batch);
  g.dk = core::operand(dk, p.batch_axes, p.batch);
  g.dv = core::operand(dv, p.batch_axes, p.batch);
  if (!dsinks.empty_view()) {
    if (p.sinks.empty()) fail("dsinks given without sinks");
    check_grad("dsinks", dsinks.shape(), "sinks", Shape{p.heads_q});
    g.dsinks = dsinks.data();
    g.dsinks_stride = dsinks.stride(0);
  }
  return g;
}

namespace {

// Checks a SavedForward against the problem: both views or neither.
template <class T>
bool check_saved(const core::AttentionProblem<T>& p, const SavedForward<T>& saved) {
  if (saved.out.empty_view() != saved.lse.empty_view())
    fail("the saved forward needs both out and lse, or neither");
  if (saved.out.empty_view()) return false;
  if (saved.out.shape() != p.out_shape)
    fail("saved out has shape " + shape_str(saved.out.shape()) + ", expected " + shape_str(p.out_shape));
  if (saved.lse.shape() != p.lse_shape)
    fail("saved lse has shape " + shape_str(saved.lse.shape()) + ", expected " + shape_str(p.lse_shape));
  return true;
}

// A float32 view as float64, K and V stored in 16 or 8 bits widened first.
template <class KV>
Tensor<double> widen(TensorView<const KV> t) {
  if constexpr (std::is_same_v<KV, float>) {
    Tensor<double> d(t.shape());
    copy<float>(t, d.view());
    return d;
  } else {
    const Tensor<float> f = dequantize(t);
    return widen<float>(f.view());
  }
}

// The float32 backward through the double reference, converting in and out:
// for the problems the kernel leaves to it (flash_backward). The float mask
// is read as it is.
template <class KV>
void backward_in_double(TensorView<const float> q, TensorView<const KV> k, TensorView<const KV> v,
                        TensorView<const float> dout, TensorView<float> dq, TensorView<float> dk,
                        TensorView<float> dv, const AttentionOptions& options, const AttentionMasks& masks,
                        TensorView<float> dsinks, const SavedForward<float>& saved) {
  const Tensor<double> q64 = widen(q), k64 = widen(k), v64 = widen(v), dout64 = widen(dout);
  Tensor<double> dq64(dq.shape()), dk64(dk.shape()), dv64(dv.shape()), dsinks64(dsinks.shape());
  Tensor<double> out64, lse64;
  SavedForward<double> saved64;
  if (!saved.out.empty_view()) {
    out64 = widen(saved.out), lse64 = widen(saved.lse);
    saved64 = {out64.view(), lse64.view()};
  }
  attention_backward<double, double>(q64.view(), k64.view(), v64.view(), dout64.view(), dq64.view(), dk64.view(),
                                     dv64.view(), options, masks,
                                     dsinks.empty_view() ? TensorView<double>() : dsinks64.view(), saved64);
  copy<double>(dq64.view(), dq);
  copy<double>(dk64.view(), dk);
  copy<double>(dv64.view(), dv);
  if (!dsinks.empty_view()) copy<double>(dsinks64.view(), dsinks);
}

}  // namespace
}  // namespace detail

template <class T, class KV>
  requires AttentionTypes<T, KV>
void attention_backward(TensorView<const T> q, TensorView<const KV> k, TensorView<const KV> v,
                        TensorView<const T> dout, TensorView<T> dq, TensorView<T> dk,
                        TensorView<T> dv, const AttentionOptions& options, const AttentionMasks& masks,
                        TensorView<T> dsinks, const SavedForward<T>& saved) {
  using namespace detail;
  if (options.precision != Precision::Float32)
    fail("the backward computes in float32: precision must be f32, got " + precision_name(options.precision));
  const PreparedAttention<T, KV> prepared(q, k, v, options, masks);
  {
    NamedSpan inputs[8];
    int n = prepared.input_spans(inputs);
    inputs[n++] = {"dout", MemorySpan::of(dout)};
    inputs[n++] = {"out", MemorySpan::of(saved.out)};
    inputs[n++] = {"lse", MemorySpan::of(saved.lse)};
    const NamedSpan outputs[] = {{"dq", MemorySpan::of(dq)}, {"dk", MemorySpan::of(dk)}, {"dv", MemorySpan::of(dv)},
                                 {"dsinks", MemorySpan::of(dsinks)}};
    check_outputs("attention_backward", outputs, std::span<const NamedSpan>(inputs, n));
  }
  core::AttentionProblem<T> p = prepared.problem;
  const core::GradientOperands<T> g =
      gradient_operands(p, q.shape(), core::logical_shape(k), core::logical_shape(v), dout, dq, dk, dv, dsinks);
  const bool given = check_saved(p, saved);
  if constexpr (std::is_same_v<T, double>) {
    if (given) {  // read only: the reference writes the gradients alone
      AttentionExtras<double> extras;
      extras.lse = TensorView<double>(const_cast<double*>(saved.lse.data()), saved.lse.shape(), saved.lse.strides());
      bind_outputs(p, TensorView<double>(const_cast<double*>(saved.out.data()), saved.out.shape(), saved.out.strides()),
                   extras);
    }
    reference::reference_attention_backward(p, g);
  } else {
    // The kernel reads out, lse and dout by rows of unit stride: the
    // forward's when not given, contiguous copies of other layouts.
    Tensor<float> out, lse, dout_copy;
    const auto rows = [&](TensorView<const float> t, Tensor<float>& holder) {
      return core::unit_rows(t) ? t : TensorView<const float>((holder = contiguous(t)).view());
    };
    TensorView<const float> out_view, lse_view;
    if (given) {
      out_view = rows(saved.out, out);
      lse_view = saved.lse;
    } else {
      out = Tensor<float>(p.out_shape);
      lse = Tensor<float>(p.lse_shape);
      AttentionExtras<float> extras;
      extras.lse = lse.view();
      prepared.run(out.view(), extras);
      out_view = out.view(), lse_view = lse.view();
    }
    AttentionExtras<float> bound;
    bound.lse = TensorView<float>(const_cast<float*>(lse_view.data()), lse_view.shape(), lse_view.strides());
    bind_outputs(p, TensorView<float>(const_cast<float*>(out_view.data()), out_view.shape(), out_view.strides()),
                 bound);  // read only: the kernel writes the gradients alone
    core::GradientOperands<float> gk = g;
    gk.dout = core::operand(rows(dout, dout_copy), p.batch_axes, p.batch);
    if (!kernels::flash_backward(p, gk))
      backward_in_double(q, k, v, dout, dq, dk, dv, options, masks, dsinks, saved);
  }
}

template <class T, class KV>
  requires AttentionTypes<T, KV>
AttentionGradients<T> attention_backward(TensorView<const T> q, TensorView<const KV> k,
                                         TensorView<const KV> v, TensorView<const T> dout,
                                         const AttentionOptions& options, const AttentionMasks& masks,
                                         const SavedForward<T>& saved) {
  AttentionGradients<T> g{Tensor<T>(q.shape()), Tensor<T>(core::logical_shape(k)),
                          Tensor<T>(core::logical_shape(v)), {}};
  if (!options.sinks.empty()) g.dsinks = Tensor<T>({static_cast<int64_t>(options.sinks.size())});
  attention_backward(q, k, v, dout, g.dq.view(), g.dk.view(), g.dv.view(), options, masks,
                     options.sinks.empty() ? TensorView<T>() : g.dsinks.view(), saved);
  return g;
}

#define ATTN_INSTANTIATE(T, KV)                                                                     \
  template void attention_backward(TensorView<const T>, TensorView<const KV>, TensorView<const KV>, \
                                   TensorView<const T>, TensorView<T>, TensorView<T>, TensorView<T>, \
                                   const AttentionOptions&, const AttentionMasks&, TensorView<T>,  \
                                   const SavedForward<T>&);                                        \
  template AttentionGradients<T> attention_backward(TensorView<const T>, TensorView<const KV>,     \
                                                    TensorView<const KV>, TensorView<const T>,     \
                                                    const AttentionOptions&, const AttentionMasks&, \
                                                    const SavedForward<T>&);
ATTN_FOR_EACH_ATTENTION_TYPE(ATTN_INSTANTIATE)
#undef ATTN_INSTANTIATE

}  // namespace attn
