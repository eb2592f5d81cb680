// Internal to the Python module: attn.QuantizedTensor, keys or values stored
// compactly (bf16, f16 or q8_0: attn/quantize.hpp), owned or over a buffer
// another engine filled.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "attn/quantize.hpp"
#include "attn/tensor.hpp"

namespace attn::python {

namespace py = pybind11;

struct PyQuantizedTensor {
  KVDtype dtype;
  Shape shape;                   // the logical shape (a q8_0 row's values, not its blocks)
  const std::byte* data;         // C-contiguous storage
  std::shared_ptr<const void> owner;  // keeps data alive: a Tensor, or a buffer export

  int64_t nbytes() const { return kv_dtype_bytes(dtype, numel_of(shape)); }

  // f(view) with the view of the storage type (q8_0: (..., n / 32) blocks).
  template <class F>
  decltype(auto) visit(F&& f) const {
    switch (dtype) {
      case KVDtype::BF16: return f(view<bfloat16>());
      case KVDtype::F16: return f(view<float16>());
      default: return f(view<block_q8_0>());
    }
  }

 private:
  template <class S>
  TensorView<const S> view() const {
    Shape s = shape;
    if (std::is_same_v<S, block_q8_0>) s.back() /= kQ8_0Block;
    return TensorView<const S>(reinterpret_cast<const S*>(data), s);
  }
};

void bind_quantized(py::module_& m);

}  // namespace attn::python
