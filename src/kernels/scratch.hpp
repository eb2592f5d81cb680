// Internal: grow-only aligned scratch memory for the kernels, kept per thread
// and reused across calls (the first touch of fresh pages costs ~10 µs per
// 4 KiB on this machine, more than the arithmetic of a small call).
#pragma once

#include <hwy/aligned_allocator.h>

#include <cstddef>
#include <string>

#include "attn/error.hpp"

namespace attn::kernels {

template <class T>
class Scratch {
 public:
  // At least n elements, aligned for any SIMD target; contents unspecified.
  T* get(size_t n) {
    if (n > size_) {
      data_ = hwy::AllocateAligned<T>(n);
      if (!data_)
        throw ValueError("cannot allocate " + std::to_string(n * sizeof(T)) +
                         " bytes of scratch memory");
      size_ = n;
    }
    return data_.get();
  }

 private:
  hwy::AlignedFreeUniquePtr<T[]> data_;
  size_t size_ = 0;
};

}  // namespace attn::kernels
