// Strided views over caller memory, and a small owning tensor.
//
// A TensorView is a pointer plus shape and strides (in elements, not bytes,
// NumPy-style but element-based; a stride may be 0 for broadcasting or
// negative). It never owns memory. Tensor<T> owns a C-contiguous buffer and
// hands out views of it.
#pragma once

#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/error.hpp"

namespace attn {

// The element types attn computes in: float (the SIMD kernels) and double
// (the reference).
template <class T>
concept Real = std::same_as<T, float> || std::same_as<T, double>;

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;

// "(2, 3, 4)": the form used in every error message.
std::string shape_str(const Shape& shape);

// Product of the dimensions. Throws ValueError naming `what` if a dimension is
// negative or the byte count of `elem_size`-byte elements overflows.
int64_t checked_numel(const Shape& shape, size_t elem_size, const char* what);

// Memory for a tensor's elements: 64-byte aligned (whole cache lines for SIMD
// rows: a row split across two lines costs two loads); from 4 MiB on, 2 MiB
// aligned and advised for transparent huge pages, as NumPy advises its arrays
// from that size, so that a large cache is read through 512 times fewer TLB
// entries (docs/performance.md). Null when the system has no memory. Freed by
// free_tensor_memory.
void* allocate_tensor_memory(size_t bytes);
void free_tensor_memory(void* p) noexcept;

// The number of elements: 0 when any dimension is 0, whatever the others
// (their product could overflow: an empty shape is not bounded by memory).
inline int64_t numel_of(const Shape& shape) {
  for (int64_t d : shape)
    if (d == 0) return 0;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Strides of a C-contiguous array of this shape.
Strides contiguous_strides(const Shape& shape);

// NumPy broadcasting: the strides that make an array of (shape, strides) read
// as an array of `target` shape (stride 0 on broadcast axes). Throws
// ValueError naming `what` when shape does not broadcast to target.
Strides broadcast_strides(const Shape& shape, const Strides& strides,
                          const Shape& target, const char* what);

// Resolves a possibly negative axis against `rank`; throws ValueError naming
// `what` when out of range.
int normalize_axis(int64_t axis, int rank, const char* what);

// A view of mutable elements is also a view of const ones (it derives from
// it), so a function declared for TensorView<const T> deduces T from either,
// as a template too: one declaration serves both.
template <class T>
class TensorView;

template <class T>
class TensorView<const T> {
 public:
  TensorView() = default;
  TensorView(const T* data, Shape shape, Strides strides)
      : data_(data), shape_(std::move(shape)), strides_(std::move(strides)) {
    if (shape_.size() != strides_.size())
      throw ValueError("TensorView: shape " + shape_str(shape_) + " and " +
                       std::to_string(strides_.size()) +
                       " strides differ in rank");
    for (int64_t n : shape_)
      if (n < 0)
        throw ValueError("TensorView: negative dimension in shape " +
                         shape_str(shape_));
  }
  // A C-contiguous view.
  TensorView(const T* data, Shape shape)
      : TensorView(data, shape, contiguous_strides(shape)) {}

  const T* data() const { return data_; }
  const Shape& shape() const { return shape_; }
  const Strides& strides() const { return strides_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  bool empty_view() const { return data_ == nullptr && shape_.empty(); }
  // Negative axes count from the end, as in NumPy.
  int64_t dim(int axis) const { return shape_[axis < 0 ? axis + rank() : axis]; }
  int64_t stride(int axis) const {
    return strides_[axis < 0 ? axis + rank() : axis];
  }
  int64_t numel() const { return numel_of(shape_); }
  bool is_contiguous() const { return strides_ == contiguous_strides(shape_); }

  // Element at a full multi-index (no bounds checks: callers validate shapes).
  const T& at(std::initializer_list<int64_t> index) const {
    int64_t off = 0;
    int a = 0;
    for (int64_t i : index) off += i * strides_[a++];
    return data_[off];
  }
  const T& at(const int64_t* index) const {
    int64_t off = 0;
    for (int a = 0; a < rank(); ++a) off += index[a] * strides_[a];
    return data_[off];
  }

  // Exchanges two axes without moving data.
  TensorView transpose(int a, int b) const {
    TensorView t = *this;
    a = normalize_axis(a, rank(), "axis");
    b = normalize_axis(b, rank(), "axis");
    std::swap(t.shape_[a], t.shape_[b]);
    std::swap(t.strides_[a], t.strides_[b]);
    return t;
  }

 private:
  const T* data_ = nullptr;
  Shape shape_;
  Strides strides_;
};

template <class T>
class TensorView : public TensorView<const T> {
  using Const = TensorView<const T>;

 public:
  TensorView() = default;
  TensorView(T* data, Shape shape, Strides strides) : Const(data, std::move(shape), std::move(strides)) {}
  TensorView(T* data, Shape shape) : Const(data, std::move(shape)) {}

  // The elements are the caller's mutable ones (the constructor took T*).
  T* data() const { return const_cast<T*>(Const::data()); }
  T& at(std::initializer_list<int64_t> index) const { return const_cast<T&>(Const::at(index)); }
  T& at(const int64_t* index) const { return const_cast<T&>(Const::at(index)); }
  TensorView transpose(int a, int b) const {
    const Const t = Const::transpose(a, b);
    return TensorView(data(), t.shape(), t.strides());
  }
};

// Owning, C-contiguous. The size is validated (and the allocation failure
// turned into a ValueError) before any memory is touched.
template <class T>
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(Shape shape) : shape_(std::move(shape)) {
    const int64_t n = numel_ = checked_numel(shape_, sizeof(T), "Tensor");
    try {
      data_.reset(static_cast<T*>(allocate_tensor_memory(static_cast<size_t>(n) * sizeof(T))));
      if (!data_) throw std::bad_alloc();
      std::uninitialized_value_construct_n(data_.get(), static_cast<size_t>(n));
    } catch (const std::bad_alloc&) {
      throw ValueError("Tensor: cannot allocate " +
                       std::to_string(n * static_cast<int64_t>(sizeof(T))) +
                       " bytes for shape " + shape_str(shape_));
    }
  }
  Tensor(Shape shape, std::initializer_list<T> values) : Tensor(std::move(shape)) {
    if (static_cast<int64_t>(values.size()) != numel())
      throw ValueError("Tensor: " + std::to_string(values.size()) +
                       " values for shape " + shape_str(shape_));
    std::copy(values.begin(), values.end(), data_.get());
  }
  // (A default-constructed tensor holds no element, not a scalar: its copy
  // holds none either.)
  Tensor(const Tensor& other) {
    if (!other.data_) return;
    *this = Tensor(other.shape_);
    std::copy(other.data(), other.data() + numel(), data_.get());
  }
  Tensor& operator=(const Tensor& other) {
    if (this != &other) *this = Tensor(other);
    return *this;
  }
  // A moved-from tensor is left as a default-constructed one.
  Tensor(Tensor&& other) noexcept { *this = std::move(other); }
  Tensor& operator=(Tensor&& other) noexcept {
    if (this == &other) return *this;
    shape_ = std::exchange(other.shape_, {});
    numel_ = std::exchange(other.numel_, 0);
    data_ = std::move(other.data_);
    return *this;
  }

  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int axis) const { return shape_[axis < 0 ? axis + rank() : axis]; }
  int64_t numel() const { return numel_; }
  T& operator[](int64_t i) { return data_[i]; }
  const T& operator[](int64_t i) const { return data_[i]; }
  // Element at a full multi-index, row-major (no bounds checks). Computed
  // here, not through view(): a view copies the shape, and training loops
  // call this per element.
  T& at(std::initializer_list<int64_t> index) { return data_[offset(index)]; }
  const T& at(std::initializer_list<int64_t> index) const { return data_[offset(index)]; }

  TensorView<T> view() { return {data_.get(), shape_}; }
  TensorView<const T> view() const { return {data_.get(), shape_}; }

  // The same elements under another shape of equal size (no copy).
  Tensor reshape(Shape shape) && {
    if (checked_numel(shape, sizeof(T), "reshape") != numel())
      throw ValueError("reshape: cannot view " + shape_str(shape_) + " as " + shape_str(shape));
    Tensor t;
    t.shape_ = std::move(shape);
    t.numel_ = std::exchange(numel_, 0);
    t.data_ = std::move(data_);
    shape_.clear();
    return t;
  }

 private:
  int64_t offset(std::initializer_list<int64_t> index) const {
    int64_t off = 0;
    int a = 0;
    for (int64_t i : index) off = off * shape_[a++] + i;
    return off;
  }
  Shape shape_;
  // The elements held: numel_of(shape_), or 0 without data (a default
  // tensor); kept, as loops test numel() once per element.
  int64_t numel_ = 0;
  struct Free {
    void operator()(T* p) const { free_tensor_memory(p); }
  };
  std::unique_ptr<T[], Free> data_;
};

}  // namespace attn

namespace attn {

// Where a view's elements lie: its data, shape and strides (in items of
// item_bytes), for telling whether two views (of any element types) overlap.
// It refers to the view's own shape and strides, without copying them: it is
// valid while the view is (never make one of a temporary view).
struct MemorySpan {
  const void* data = nullptr;
  const int64_t* shape = nullptr;
  const int64_t* strides = nullptr;
  int rank = 0;
  int64_t item_bytes = 1;

  template <class T>
  static MemorySpan of(const TensorView<const T>& v) {
    return {v.data(), v.shape().data(), v.strides().data(), v.rank(), static_cast<int64_t>(sizeof(T))};
  }
};

// Whether some byte belongs to an element of each (NumPy's shares_memory:
// exact, not a comparison of bounds). Views that interleave, such as a
// buffer's even and odd columns, share none. In the rare layouts too costly
// to settle (past about a million steps of the search) the answer is true.
bool shares_memory(const MemorySpan& a, const MemorySpan& b);
// Whether two elements of the view share a byte (a stride of 0 on an axis of
// two or more, or strides that fold onto themselves); as exact as above.
bool overlaps_itself(const MemorySpan& a);

// A function's argument by name, for the error messages.
struct NamedSpan {
  const char* name;
  MemorySpan span;
};

// ValueError "<function>: <output> ..." ("<output> ..." for an empty
// function name) when an output overlaps itself, an input or another
// output: its elements would be written over values still to be read.
// Spans without data (an extra not asked for) are skipped. Allocates
// nothing unless two views' bounds meet or strides interleave: every call
// that writes into a caller's view runs it.
void check_outputs(const char* function, std::span<const NamedSpan> outputs, std::span<const NamedSpan> inputs);
inline void check_outputs(const char* function, std::initializer_list<NamedSpan> outputs,
                          std::initializer_list<NamedSpan> inputs) {
  check_outputs(function, std::span<const NamedSpan>(outputs.begin(), outputs.size()),
                std::span<const NamedSpan>(inputs.begin(), inputs.size()));
}
// Whether b is a's very elements, as an in-place call passes them (the
// functions that work in place leave such an input out of check_outputs).
bool same_elements(const MemorySpan& a, const MemorySpan& b);

// dst = f(src), element by element, between views of one shape (any
// strides). Throws ValueError if the shapes differ.
template <class Src, class Dst, class F>
void transform(TensorView<const Src> src, TensorView<Dst> dst, F f) {
  if (src.shape() != dst.shape())
    throw ValueError("copy: source shape " + shape_str(src.shape()) +
                     " differs from destination shape " + shape_str(dst.shape()));
  const int64_t n = src.numel();
  const int r = src.rank();
  if (n == 0) return;
  if (r == 0) {
    *dst.data() = f(*src.data());
    return;
  }
  // Row by row along the last axis (the index arithmetic per row, not per
  // element: training copies many small tensors).
  const auto outer = static_cast<size_t>(r - 1);
  const Shape& shape = src.shape();
  const Strides &s_strides = src.strides(), &d_strides = dst.strides();
  const int64_t inner = shape[outer], s_step = s_strides[outer], d_step = d_strides[outer];
  std::vector<int64_t> index(outer, 0);
  for (int64_t row = 0; row < n / inner; ++row) {
    int64_t s_off = 0, d_off = 0;
    for (size_t a = 0; a < outer; ++a) s_off += index[a] * s_strides[a], d_off += index[a] * d_strides[a];
    const Src* s = src.data() + s_off;
    Dst* d = dst.data() + d_off;
    for (int64_t e = 0; e < inner; ++e) d[e * d_step] = f(s[e * s_step]);
    for (size_t a = outer; a-- > 0;) {
      if (++index[a] < shape[a]) break;
      index[a] = 0;
    }
  }
}

// Element-wise copy between views of one shape (any strides), converting the
// element type. Throws ValueError if the shapes differ.
template <class Src, class Dst>
void copy(TensorView<const Src> src, TensorView<Dst> dst) {
  transform(src, dst, [](const Src& x) { return static_cast<Dst>(x); });
}

// A C-contiguous copy of a view.
template <class T>
Tensor<std::remove_const_t<T>> contiguous(TensorView<T> src) {
  Tensor<std::remove_const_t<T>> t(src.shape());
  copy<std::remove_const_t<T>>(src, t.view());
  return t;
}

}  // namespace attn
