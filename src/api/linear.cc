// linear() and linear_backward(): check the shapes and layouts once, then the
// kernels' products (kernels/linear.hpp), whose arguments are raw rows.
#include "attn/linear.hpp"

#include <string>

#include "attn/error.hpp"
#include "kernels/linear.hpp"

namespace attn {
namespace {

[[noreturn]] void fail(const char* function, const std::string& msg) {
  throw ValueError(std::string(function) + ": " + msg);
}

template <class T>
void need_rank(const char* function, const char* name, const TensorView<const T>& t, int rank) {
  if (t.rank() != rank)
    fail(function, std::string(name) + " must have rank " + std::to_string(rank) + ", got shape " +
                       shape_str(t.shape()));
}

template <class T>
void need_contiguous(const char* function, const char* name, const TensorView<const T>& t) {
  if (!t.is_contiguous())
    fail(function, std::string(name) + " must be C-contiguous, got shape " + shape_str(t.shape()) +
                       " with strides " + shape_str(t.strides()));
}

template <class T>
void need_unit_rows(const char* function, const char* name, const TensorView<const T>& t) {
  if (t.dim(1) > 1 && t.stride(1) != 1)
    fail(function, std::string(name) + "'s rows must have unit stride, got strides " + shape_str(t.strides()));
}

// w (out, in) and b (out,) or empty, against x's `in`.
template <class T>
void check_weights(const char* function, const TensorView<const T>& w, const TensorView<const T>& b, int64_t in) {
  need_rank(function, "w", w, 2);
  need_contiguous(function, "w", w);
  if (w.dim(1) != in)
    fail(function, "w " + shape_str(w.shape()) + " must be (out, in) with x's in = " + std::to_string(in));
  if (b.empty_view()) return;
  need_rank(function, "b", b, 1);
  need_contiguous(function, "b", b);
  if (b.dim(0) != w.dim(0))
    fail(function, "b " + shape_str(b.shape()) + " must be (out,) with w's out = " + std::to_string(w.dim(0)));
}

template <class T>
void need_shape(const char* function, const char* name, const TensorView<const T>& t, const Shape& want) {
  if (t.shape() != want)
    fail(function, std::string(name) + " has shape " + shape_str(t.shape()) + ", expected " + shape_str(want));
}

}  // namespace

template <class T>
void linear(TensorView<const T> x, TensorView<const T> w, TensorView<const T> b, TensorView<T> y) {
  constexpr const char* f = "linear";
  need_rank(f, "x", x, 2);
  need_unit_rows(f, "x", x);
  check_weights(f, w, b, x.dim(1));
  need_shape(f, "y", TensorView<const T>(y), {x.dim(0), w.dim(0)});
  need_unit_rows(f, "y", TensorView<const T>(y));
  check_outputs(f, {{"y", MemorySpan::of(y)}},
                {{"x", MemorySpan::of(x)}, {"w", MemorySpan::of(w)}, {"b", MemorySpan::of(b)}});
  kernels::linear(x, w.data(), b.empty_view() ? nullptr : b.data(), y);
}

template <class T>
void linear_backward(TensorView<const T> x, TensorView<const T> w, TensorView<const T> dy, TensorView<T> dx,
                     TensorView<T> dw, TensorView<T> db) {
  constexpr const char* f = "linear_backward";
  need_rank(f, "x", x, 2);
  need_contiguous(f, "x", x);
  check_weights(f, w, TensorView<const T>(), x.dim(1));
  const int64_t rows = x.dim(0), in = x.dim(1), out = w.dim(0);
  need_shape(f, "dy", dy, {rows, out});
  need_contiguous(f, "dy", dy);
  if (!dx.empty_view()) {
    need_shape(f, "dx", TensorView<const T>(dx), {rows, in});
    need_contiguous(f, "dx", TensorView<const T>(dx));
  }
  need_shape(f, "dw", TensorView<const T>(dw), {out, in});
  need_contiguous(f, "dw", TensorView<const T>(dw));
  if (!db.empty_view()) {
    need_shape(f, "db", TensorView<const T>(db), {out});
    need_contiguous(f, "db", TensorView<const T>(db));
  }
  check_outputs(f, {{"dx", MemorySpan::of(dx)}, {"dw", MemorySpan::of(dw)}, {"db", MemorySpan::of(db)}},
                {{"x", MemorySpan::of(x)}, {"w", MemorySpan::of(w)}, {"dy", MemorySpan::of(dy)}});
  kernels::linear_backward(x.data(), w.data(), dy.data(), rows, in, out, dx.empty_view() ? nullptr : dx.data(),
                          dw.data(), db.empty_view() ? nullptr : db.data());
}

template void linear(TensorView<const float>, TensorView<const float>, TensorView<const float>, TensorView<float>);
template void linear(TensorView<const double>, TensorView<const double>, TensorView<const double>,
                     TensorView<double>);
template void linear_backward(TensorView<const float>, TensorView<const float>, TensorView<const float>,
                              TensorView<float>, TensorView<float>, TensorView<float>);
template void linear_backward(TensorView<const double>, TensorView<const double>, TensorView<const double>,
                              TensorView<double>, TensorView<double>, TensorView<double>);

}  // namespace attn
