// Internal to the C API: C's descriptors checked and seen as views, the
// options struct read for any version, and every exception turned into a
// status kept for attn_last_error() (attn_c.cc defines what is not inline).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attn/attention.hpp"
#include "attn/attn.h"
#include "attn/quantize.hpp"
#include "attn/error.hpp"
#include "attn/file.hpp"
#include "attn/multi_head_latent_attention.hpp"
#include "attn/tensor.hpp"

// The handles both files of the C API reach (attn_c.cc, serving_c.cc).
struct attn_mla {
  attn::MultiHeadLatentAttention layer;
};

namespace attn::detail::capi {

using attn::Shape;
using attn::Strides;
using attn::TensorView;
using attn::ValueError;

// The calling thread's last error message (attn_last_error).
extern thread_local std::string last_error;

// Ranks beyond this are refused before the shape is read (no real tensor has them).
constexpr int32_t kMaxRank = 16;

// Keeps the message for attn_last_error (none, if even that cannot be allocated).
int failed(int status, const char* message) noexcept;

// Runs fn, turning what it throws into a status (none escapes into C).
template <class F>
int guarded(F&& fn) noexcept {
  try {
    last_error.clear();
    fn();
    return ATTN_OK;
  } catch (const attn::IOError& e) {
    return failed(ATTN_ERROR_IO, e.what());
  } catch (const ValueError& e) {
    return failed(ATTN_ERROR_INVALID_ARGUMENT, e.what());
  } catch (const attn::KeyError& e) {
    return failed(ATTN_ERROR_INVALID_ARGUMENT, e.what());
  } catch (const attn::TypeError& e) {
    return failed(ATTN_ERROR_UNSUPPORTED, e.what());
  } catch (const std::bad_alloc&) {
    return failed(ATTN_ERROR_OUT_OF_MEMORY, "out of memory");
  } catch (const attn::MemoryError& e) {
    return failed(ATTN_ERROR_OUT_OF_MEMORY, e.what());
  } catch (const std::exception& e) {
    return failed(ATTN_ERROR_RUNTIME, e.what());
  } catch (...) {
    return failed(ATTN_ERROR_RUNTIME, "unknown error");
  }
}

// "attn_attention: q: <what>"
[[noreturn]] void fail(const char* function, const char* name, const std::string& what);
[[noreturn]] void unsupported(const char* function, const std::string& what);
// A cache's storage type from its attn_dtype: F32, BF16, F16, Q8_0, Q4_0 or INT4 (others unsupported).
attn::KVDtype cache_dtype(attn_dtype dtype, const char* fn);

template <class P>
void require(const P* pointer, const char* function, const char* name) {
  if (!pointer) throw ValueError(std::string(function) + ": " + name + " is NULL");
}

size_t element_size(attn_dtype dtype);
const char* dtype_name(attn_dtype dtype);

// A descriptor checked for what C can get wrong: its shape and strides.
struct Layout {
  attn_dtype dtype;
  Shape shape;
  Strides strides;
};
// key_axis: the axis along which an INT4 tensor of keys counts its keys
// (negative: from the end), stored a block per channel and group of 32 keys
// along it (attn_attention's k: -2; a pool of NHD pages: 1).
Layout layout_of(const attn_tensor* t, const char* function, const char* name, std::optional<int> key_axis = {});

// Where a view without elements and without data points: the kernels step
// row pointers over an empty view too, which from NULL is undefined. Nothing
// is ever read or written through it.
extern unsigned char no_elements[64];

template <class T>
TensorView<T> view_of(const attn_tensor* t, const Layout& l) {
  void* data = t->data ? t->data : static_cast<void*>(no_elements);
  return {static_cast<T*>(data), l.shape, l.strides};
}

// The options a caller of any struct version passed (see attn.h).
attn::AttentionOptions options_of(const attn_options* given, const char* function);
attn::Mask mask_of(const attn_tensor* mask, const char* function);

}  // namespace attn::detail::capi
