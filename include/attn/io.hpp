// Files: NumPy .npy arrays and safetensors weights.
//
// Readers validate everything before trusting it (magic, header length,
// dtype, shape, byte counts, offsets) and report a corrupt or lying file as
// ValueError naming the file and the problem; a missing file, a directory or
// a failed read is IOError. A stream (a pipe, /dev/stdin) is read only as far
// as the format says, so an endless one (/dev/zero) is a clear error too.
// Writers go through write_file (attn/file.hpp): a failed write never loses
// the old file.
#pragma once

#include <map>
#include <string>
#include <variant>

#include "attn/error.hpp"
#include "attn/file.hpp"
#include "attn/half.hpp"
#include "attn/tensor.hpp"

namespace attn {

// .npy, format versions 1-3: float32 ('<f4') and float64 ('<f8') are read
// as they are; float16 ('<f2') is read as float32 (exactly, as NumPy's
// astype(float32) does); big-endian files ('>f2', '>f4', '>f8') are converted
// to native byte order and Fortran-order files to C order, so the array is
// the one np.load gives. Other dtypes and malformed or truncated files are
// errors. write_npy writes little-endian, C order; encode_npy gives the
// file's bytes (for a FileSet of several outputs).
using NpyArray = std::variant<Tensor<float>, Tensor<double>>;
NpyArray read_npy(const std::string& path);
std::string encode_npy(TensorView<const float> array);
std::string encode_npy(TensorView<const double> array);
void write_npy(const std::string& path, TensorView<const float> array);
void write_npy(const std::string& path, TensorView<const double> array);

// safetensors: 8-byte little-endian header length, a JSON header mapping
// names to {dtype, shape, data_offsets}, optional "__metadata__" (string to
// string), then the data. F32, F16 and BF16 tensors are read (as float32).
struct Safetensors {
  std::map<std::string, Tensor<float>> tensors;
  std::map<std::string, std::string> metadata;
};
Safetensors read_safetensors(const std::string& path);

// Writes every tensor in `dtype` (a StorageDtype of attn/half.hpp; 16-bit
// types round to nearest even).
void write_safetensors(const std::string& path,
                       const std::map<std::string, TensorView<const float>>& tensors,
                       const std::map<std::string, std::string>& metadata = {},
                       StorageDtype dtype = StorageDtype::F32);

}  // namespace attn
