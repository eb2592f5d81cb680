// Fuzz targets' helpers: reading choices from the fuzzer's bytes, strided
// buffers with guard cells, and the rule every target enforces.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "attn/attn.hpp"

namespace attn::fuzz {

// Stops the run with a message: libFuzzer saves the input that got here.
[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "FUZZ FINDING: %s\n", what.c_str());
  std::abort();
}

// Runs fn; attn::Error is a refusal (returns false), any other exception a finding.
template <class F>
bool accepted(F&& fn) {
  try {
    fn();
    return true;
  } catch (const Error&) {
    return false;
  } catch (const std::exception& e) {
    finding(std::string("an exception that is not attn::Error: ") + e.what());
  }
}

// Choices read from the fuzzer's bytes; past the end every read is 0, so a
// short input is still a complete (mostly default) case.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t byte() { return at_ < size_ ? data_[at_++] : 0; }
  bool flag() { return byte() & 1; }
  // An integer in [lo, hi] (hi - lo < 256).
  int64_t in(int64_t lo, int64_t hi) { return lo + byte() % (hi - lo + 1); }
  template <class T, size_t N>
  T pick(const T (&options)[N]) { return options[byte() % N]; }
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = v << 8 | byte();
    return v;
  }

 private:
  const uint8_t* data_;
  size_t size_, at_ = 0;
};

// How a Strided array is laid out.
enum Layout { kContiguous, kPaddedRows, kReversedRows, kBroadcastFirstAxis, kTransposed, kLayouts };

// An array of `shape` laid out in a larger buffer (see Layout); the cells
// outside the view are guards that must keep their value.
template <class T>
class Strided {
 public:
  using value_type = T;
  // A broadcast layout is contiguous when !allow_broadcast (outputs).
  Strided(const Shape& shape, int layout, bool allow_broadcast) : shape_(shape) {
    const int r = static_cast<int>(shape.size());
    strides_.assign(r, 0);
    std::vector<int> order(r);  // axes from the fastest-varying out
    for (int a = 0; a < r; ++a) order[a] = r - 1 - a;
    if (layout == kTransposed && r >= 2) std::swap(order[0], order[1]);  // transposed
    int64_t step = 1;
    for (int a : order) {
      strides_[a] = step;
      step *= std::max<int64_t>(shape[a], 1);
      if (layout == kPaddedRows && a == r - 1) step += 3;  // padded rows
    }
    if (layout == kReversedRows && r >= 2) strides_[r - 2] = -strides_[r - 2];  // reversed rows
    if (layout == kBroadcastFirstAxis && allow_broadcast && r >= 1) strides_[0] = 0;  // every index reads one slice
    int64_t lo = 0, hi = 0;
    for (int a = 0; a < r; ++a) {
      if (shape[a] == 0) continue;
      (strides_[a] < 0 ? lo : hi) += strides_[a] * (shape[a] - 1);
    }
    size_ = static_cast<size_t>(hi - lo + 1 + 2 * kGuard);
    buffer_.reset(new T[size_]);
    std::fill(buffer_.get(), buffer_.get() + size_, guard());
    origin_ = kGuard - lo;
  }

  // Sets the elements in visiting order from next() (with a broadcast axis,
  // the last value written to a cell stays).
  template <class F>
  void fill(F&& next) {
    each([&](T& x) { x = next(); });
  }
  // The elements in visiting order.
  std::vector<T> values() {
    std::vector<T> v;
    each([&](T& x) { v.push_back(x); });
    return v;
  }

  TensorView<T> view() { return {buffer_.get() + origin_, shape_, strides_}; }
  TensorView<const T> cview() const { return {buffer_.get() + origin_, shape_, strides_}; }
  const Shape& shape() const { return shape_; }

  // Visits every element of the view (a broadcast cell more than once).
  template <class F>
  void each(F&& f) {
    const int r = static_cast<int>(shape_.size());
    int64_t n = 1;
    for (int64_t d : shape_) n *= d;
    std::vector<int64_t> index(r, 0);
    for (int64_t e = 0; e < n; ++e) {
      int64_t off = origin_;
      for (int a = 0; a < r; ++a) off += index[a] * strides_[a];
      f(buffer_[static_cast<size_t>(off)]);
      for (int a = r - 1; a >= 0; --a) {
        if (++index[a] < shape_[a]) break;
        index[a] = 0;
      }
    }
  }

  // Whether every cell outside the view still holds the guard value.
  bool guards_intact() {
    std::vector<bool> inside(size_, false);
    const T* base = buffer_.get();
    each([&](T& x) { inside[static_cast<size_t>(&x - base)] = true; });
    for (size_t i = 0; i < size_; ++i)
      if (!inside[i] && !same_bits(buffer_[i], guard())) return false;
    return true;
  }

 private:
  static constexpr int64_t kGuard = 4;
  static T guard() {
    if constexpr (std::is_floating_point_v<T>) return static_cast<T>(-12345.5);
    else if constexpr (std::is_same_v<T, bool>) return true;
    else if constexpr (std::is_integral_v<T>) return static_cast<T>(777);
    else return T{0x7bcd};  // bfloat16 / float16 bits
  }
  static bool same_bits(const T& a, const T& b) {
    if constexpr (std::is_class_v<T>) return a.bits == b.bits;
    else return a == b;
  }

  Shape shape_;
  Strides strides_;
  std::unique_ptr<T[]> buffer_;  // not std::vector: vector<bool> has no data()
  size_t size_ = 0;
  int64_t origin_ = 0;
};

// The readers take a path: the input goes to a file of this process,
// removed at exit. In memory (/dev/shm) where there is one: the writers
// fsync every file, which on a disk would cost milliseconds per input.
inline const std::string& scratch_file(const uint8_t* data, size_t size) {
  static const std::string path = [] {
    std::atexit([] { std::remove(path.c_str()); });
    const char* folder = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    return std::string(folder) + "/attn_fuzz_" + std::to_string(::getpid());
  }();
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

// Whether two tensors have one shape and the same bits.
template <class T>
bool identical(const Tensor<T>& a, const Tensor<T>& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), static_cast<size_t>(a.numel()) * sizeof(T)) == 0;
}

}  // namespace attn::fuzz
