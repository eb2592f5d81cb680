// Internal to the API room: an attention call validated once (what
// AttentionPlan holds, and what attention_backward builds its problem from),
// and the checks that build it. The kernels and the reference see only the
// core::AttentionProblem it holds (attention_problem.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "attention_problem.hpp"
#include "attn/attention.hpp"

namespace attn::detail {

// Binds out and the extras asked for to problem p, checking their shapes
// (ValueError naming the one that differs).
template <class T>
void bind_outputs(core::AttentionProblem<T>& p, TensorView<T> out, const AttentionExtras<T>& extras);

// Validates the options of attention() for heads_q query heads and inputs
// of element type T (float32 or not): check_attention_options' body.
void check_options(const AttentionOptions& options, int64_t heads_q, bool float32);

// A view's place in memory kept by value, for overlap checks after the view
// is gone: its data, shape and strides inline up to rank 8 (a copy of the
// view itself would allocate on every call of a small decode).
class SpanCopy {
 public:
  SpanCopy() = default;
  template <class T>
  explicit SpanCopy(const TensorView<const T>& v) : data_(v.data()), rank_(v.rank()), item_(sizeof(T)) {
    if (rank_ > kInline) more_.resize(2 * static_cast<size_t>(rank_));
    int64_t* shape = rank_ > kInline ? more_.data() : shape_;
    int64_t* strides = rank_ > kInline ? more_.data() + rank_ : strides_;
    std::copy(v.shape().begin(), v.shape().end(), shape);
    std::copy(v.strides().begin(), v.strides().end(), strides);
  }
  MemorySpan span() const {
    const bool inline_ = rank_ <= kInline;
    return {data_, inline_ ? shape_ : more_.data(), inline_ ? strides_ : more_.data() + rank_, rank_, item_};
  }

 private:
  static constexpr int kInline = 8;
  const void* data_ = nullptr;
  int rank_ = 0;
  int64_t item_ = 1;
  int64_t shape_[kInline] = {}, strides_[kInline] = {};
  std::vector<int64_t> more_;  // shape then strides, past kInline axes
};

// A problem ready to run any number of times, from any thread: validated
// once, with contiguous copies of the inputs the float32 kernels cannot read
// in place. run() checks only the shapes of out and the extras.
template <class T, class KV>
struct PreparedAttention {
  PreparedAttention(TensorView<const T> q, TensorView<const KV> k, TensorView<const KV> v,
                    const AttentionOptions& options, const AttentionMasks& masks);
  // Refuses out and extras that overlap each other or the caller's inputs.
  void run(TensorView<T> out, const AttentionExtras<T>& extras) const;

  // Spans of the caller's q, k, v and masks (not the copies below), for
  // overlap checks: writes them into spans (room for 5), returns how many.
  int input_spans(NamedSpan* spans) const;

  core::AttentionProblem<T> problem;
  SpanCopy inputs[5];  // the caller's q, k, v and masks
  const char* input_names[5] = {"q", "k", "v"};
  int n_inputs = 3;
  Tensor<T> q_copy;
  Tensor<KV> k_copy, v_copy;
};

// Validates the gradient arguments of attention_backward() for problem p,
// built from q, k, v of these (logical) shapes, and sees them as operands.
template <class T>
core::GradientOperands<T> gradient_operands(const core::AttentionProblem<T>& p, const Shape& q, const Shape& k,
                                      const Shape& v, TensorView<const T> dout, TensorView<T> dq,
                                      TensorView<T> dk, TensorView<T> dv, TensorView<T> dsinks);

}  // namespace attn::detail

// X(T, KV) for each pair of element types attention takes (AttentionTypes):
// the one list the API's files instantiate their templates for.
#define ATTN_FOR_EACH_ATTENTION_TYPE(X) \
  X(float, float)                       \
  X(float, bfloat16)                    \
  X(float, float16)                     \
  X(float, block_q8_0)                  \
  X(float, block_q4_0)                  \
  X(double, double)
