#include "attn/io.hpp"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string_view>
#include <vector>

#include "attn/half.hpp"

namespace attn {
namespace {

// Files are little-endian; so is every CPU attn targets (x86-64, Arm64).
static_assert(std::endian::native == std::endian::little);
static_assert(sizeof(float) == 4 && sizeof(double) == 8);

// A file read front to back. A regular file's size is known before reading;
// a stream (a pipe, /dev/stdin, /dev/zero) is read only as far as asked, so
// an endless one cannot exhaust memory.
class InputFile {
 public:
  explicit InputFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail("cannot open for reading", errno);
    struct stat st;
    const bool known = ::fstat(fd_, &st) == 0;
    const int error = !known ? errno : S_ISDIR(st.st_mode) ? EISDIR : 0;
    if (error) {
      ::close(fd_);  // no destructor runs for a constructor that throws
      fail(known ? "cannot read" : "cannot open for reading", error);
    }
    if (S_ISREG(st.st_mode)) size_ = static_cast<uint64_t>(st.st_size);
  }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  ~InputFile() { ::close(fd_); }

  // Up to n bytes into dst; fewer only at the end of the file.
  uint64_t read(char* dst, uint64_t n) {
    uint64_t done = 0;
    while (done < n) {
      const ssize_t got = ::read(fd_, dst + done, std::min<uint64_t>(n - done, 1 << 30));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) fail("read failed", errno);
      if (got == 0) break;
      done += static_cast<uint64_t>(got);
    }
    offset_ += done;
    return done;
  }

  // Up to n bytes, grown as they arrive: n may come from a lying header.
  std::string read(uint64_t n) {
    std::string s;
    while (s.size() < n) {
      const uint64_t chunk = std::min<uint64_t>(n - s.size(), 1 << 20);
      const size_t old = s.size();
      s.resize(old + chunk);
      const uint64_t got = read(s.data() + old, chunk);
      s.resize(old + got);
      if (got < chunk) break;
    }
    return s;
  }

  // The bytes not read yet, where known (a regular file).
  std::optional<uint64_t> remaining() const {
    if (!size_) return std::nullopt;
    return *size_ > offset_ ? *size_ - offset_ : 0;
  }

 private:
  [[noreturn]] void fail(const char* what, int error) {
    throw IOError(path_, what, error);
  }

  std::string path_;
  int fd_ = -1;
  std::optional<uint64_t> size_;
  uint64_t offset_ = 0;
};

uint64_t read_le(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(s[at + i]);
  return v;
}

std::string le_bytes(uint64_t v, int bytes) {
  std::string s(bytes, '\0');
  for (int i = 0; i < bytes; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// ---------------------------------------------------------------------------
// .npy

[[noreturn]] void npy_fail(const std::string& path, const std::string& what) {
  throw ValueError(path + ": not a valid .npy file: " + what);
}

template <class T>
std::string npy_bytes(TensorView<const T> a, const char* descr) {
  std::string dict = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (";
  for (int i = 0; i < a.rank(); ++i) dict += std::to_string(a.dim(i)) + (a.rank() == 1 ? "," : i + 1 < a.rank() ? ", " : "");
  dict += "), }";
  // Pad so that the data starts on a 64-byte boundary; the header ends with '\n'.
  // Version 1 stores the header length in 2 bytes, version 2 in 4.
  const bool v1 = (10 + dict.size() + 1 + 63) / 64 * 64 - 10 <= 65535;
  const size_t prefix = v1 ? 10 : 12;
  const size_t total = (prefix + dict.size() + 1 + 63) / 64 * 64;
  dict.append(total - prefix - dict.size() - 1, ' ');
  dict += '\n';
  std::string head = "\x93NUMPY";
  head += v1 ? std::string("\x01\x00", 2) : std::string("\x02\x00", 2);
  head += le_bytes(dict.size(), v1 ? 2 : 4);
  head += dict;
  const Tensor<T> c = contiguous(a);
  return head.append(reinterpret_cast<const char*>(c.data()), static_cast<size_t>(c.numel()) * sizeof(T));
}

// The header is a Python dict literal with exactly the keys 'descr',
// 'fortran_order' and 'shape', e.g. {'descr': '<f4', 'fortran_order': False,
// 'shape': (2, 3), }. Parsed by hand in one pass: std::regex recursed once per
// character and overflowed the stack on a 30 kB header.
struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  Shape shape;
};

// At most n characters of s, for error messages about arbitrary input.
std::string excerpt(const std::string& s, size_t n = 40) {
  return s.size() <= n ? s : s.substr(0, n) + "...";
}

NpyHeader parse_npy_header(const std::string& path, const std::string& h) {
  size_t at = 0;  // never past h.size()
  const auto fail = [&](const std::string& what) { npy_fail(path, "header " + what); };
  const auto skip_space = [&] {
    while (at < h.size() && std::isspace(static_cast<unsigned char>(h[at]))) ++at;
  };
  const auto next_is = [&](char c) {
    skip_space();
    return at < h.size() && h[at] == c;
  };
  const auto expect = [&](char c) {
    if (!next_is(c)) fail(std::string("expected '") + c + "' at byte " + std::to_string(at));
    ++at;
  };
  const auto quoted = [&] {
    skip_space();
    if (at == h.size() || (h[at] != '\'' && h[at] != '"'))
      fail("expected a quoted string at byte " + std::to_string(at));
    const size_t close = h.find(h[at], at + 1);
    if (close == std::string::npos) fail("has an unterminated string");
    std::string text = h.substr(at + 1, close - at - 1);
    at = close + 1;
    return text;
  };
  NpyHeader r;
  bool descr = false, order = false, shape = false;
  expect('{');
  while (!next_is('}')) {
    const std::string key = quoted();
    expect(':');
    skip_space();
    if (key == "descr") {
      r.descr = quoted();
      descr = true;
    } else if (key == "fortran_order") {
      if (h.compare(at, 4, "True") == 0) r.fortran_order = true, at += 4;
      else if (h.compare(at, 5, "False") == 0) at += 5;
      else fail("has a 'fortran_order' that is neither True nor False");
      order = true;
    } else if (key == "shape") {
      expect('(');
      while (!next_is(')')) {
        const size_t digits = h.find_first_not_of("0123456789", at);
        const size_t n = (digits == std::string::npos ? h.size() : digits) - at;
        if (n == 0 || n > 18) npy_fail(path, "malformed shape at byte " + std::to_string(at));
        r.shape.push_back(std::stoll(h.substr(at, n)));
        at += n;
        if (next_is(',')) ++at;
        else if (!next_is(')')) npy_fail(path, "malformed shape at byte " + std::to_string(at));
      }
      ++at;
      shape = true;
    } else {
      fail("has an unexpected key '" + excerpt(key) + "'");
    }
    if (next_is(',')) ++at;
    else if (!next_is('}')) fail("expected ',' or '}' at byte " + std::to_string(at));
  }
  if (!descr) fail("has no 'descr'");
  if (!order) fail("has no 'fortran_order'");
  if (!shape) fail("has no 'shape'");
  return r;
}

// The dtypes read: float16, float32 and float64 in either byte order.
struct NpyDtype {
  size_t size;  // bytes per element: 2, 4 or 8
  bool big_endian;
};

std::optional<NpyDtype> parse_npy_dtype(const std::string& descr) {
  // '=' is native order, which static_assert above makes little-endian.
  if (descr.size() != 3 || std::strchr("<>=", descr[0]) == nullptr || descr[1] != 'f')
    return std::nullopt;
  const size_t size = static_cast<size_t>(descr[2] - '0');
  if (size != 2 && size != 4 && size != 8) return std::nullopt;
  return NpyDtype{size, descr[0] == '>'};
}

// Element i of `raw` (in the file's dtype) as T.
template <class T>
T npy_element(const char* raw, int64_t i, NpyDtype dtype) {
  char bytes[8];
  const char* element = raw + static_cast<size_t>(i) * dtype.size;
  // Big-endian bytes copied in reverse order (not std::reverse in place,
  // whose inlined swaps GCC 12 for aarch64 takes for writes past bytes).
  if (dtype.big_endian)
    for (size_t k = 0; k < dtype.size; ++k) bytes[k] = element[dtype.size - 1 - k];
  else
    std::memcpy(bytes, element, dtype.size);
  if (dtype.size == 2) {
    uint16_t h;
    std::memcpy(&h, bytes, 2);
    return static_cast<T>(fp16_to_float(h));
  }
  T v;
  std::memcpy(&v, bytes, sizeof(T));
  return v;
}

// The data after the header: exactly the bytes the shape needs, converted
// to T (native byte order, C order).
template <class T>
Tensor<T> npy_payload(const std::string& path, InputFile& in, const NpyHeader& h,
                      NpyDtype dtype) {
  const Shape& shape = h.shape;
  const int64_t n = checked_numel(shape, sizeof(T), (path + ": shape").c_str());
  const uint64_t need = static_cast<uint64_t>(n) * dtype.size;
  const auto mismatch = [&](const std::string& has) {
    npy_fail(path, "shape " + shape_str(shape) + " needs " + std::to_string(need) +
                       " bytes of data, the file has " + has);
  };
  if (const auto left = in.remaining(); left && *left != need) mismatch(std::to_string(*left));
  Tensor<T> t(shape);
  if (dtype.size == sizeof(T) && !dtype.big_endian) {
    const uint64_t got = in.read(reinterpret_cast<char*>(t.data()), need);
    if (got < need) mismatch(std::to_string(got));
  } else {
    const std::string raw = in.read(need);
    if (raw.size() < need) mismatch(std::to_string(raw.size()));
    for (int64_t i = 0; i < n; ++i) t[i] = npy_element<T>(raw.data(), i, dtype);
  }
  if (!in.remaining() && !in.read(1).empty()) mismatch("more");
  // (An empty array has nothing to reorder, and its other axes may multiply
  // past int64: the steps below would overflow.)
  if (!h.fortran_order || n == 0) return t;
  // Fortran order: the first index varies fastest.
  Strides strides(shape.size());
  int64_t stride = 1;
  for (size_t i = 0; i < shape.size(); ++i) strides[i] = stride, stride *= shape[i];
  return contiguous(TensorView<const T>(t.data(), shape, strides));
}

// ---------------------------------------------------------------------------
// safetensors

[[noreturn]] void st_fail(const std::string& path, const std::string& what) {
  throw ValueError(path + ": not a valid safetensors file: " + what);
}

size_t dtype_size(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  return 0;
}

}  // namespace

NpyArray read_npy(const std::string& path) {
  InputFile in(path);
  const std::string prefix = in.read(8);
  if (prefix.size() < 6 || prefix.compare(0, 6, "\x93NUMPY") != 0)
    npy_fail(path, "missing the \\x93NUMPY magic");
  if (prefix.size() < 8) npy_fail(path, "truncated header");
  const int major = static_cast<uint8_t>(prefix[6]);
  if (major < 1 || major > 3) npy_fail(path, "unsupported format version " + std::to_string(major));
  const size_t len_bytes = major == 1 ? 2 : 4;
  const std::string len = in.read(len_bytes);
  if (len.size() < len_bytes) npy_fail(path, "truncated header");
  const uint64_t header_len = read_le(len, 0, static_cast<int>(len_bytes));
  const std::string header = in.read(header_len);
  if (header.size() < header_len)
    npy_fail(path, "header length " + std::to_string(header_len) + " runs past the end of the file");

  const NpyHeader h = parse_npy_header(path, header);
  const auto dtype = parse_npy_dtype(h.descr);
  if (!dtype)
    throw ValueError(path + ": unsupported .npy dtype '" + excerpt(h.descr) +
                     "'; attn reads float16 (as float32), float32 and float64, either byte order "
                     "('<f2', '<f4', '<f8', '>f2', '>f4', '>f8')");
  if (dtype->size == 8) return npy_payload<double>(path, in, h, *dtype);
  return npy_payload<float>(path, in, h, *dtype);
}

std::string encode_npy(TensorView<const float> a) { return npy_bytes(a, "<f4"); }
std::string encode_npy(TensorView<const double> a) { return npy_bytes(a, "<f8"); }
void write_npy(const std::string& path, TensorView<const float> a) { write_file(path, {encode_npy(a)}); }
void write_npy(const std::string& path, TensorView<const double> a) { write_file(path, {encode_npy(a)}); }

namespace {

// The JSON header: its 8-byte length, then the text, parsed.
nlohmann::json read_safetensors_header(InputFile& in, const std::string& path) {
  const std::string prefix = in.read(8);
  if (prefix.size() < 8) st_fail(path, "shorter than its 8-byte header length");
  const uint64_t n = read_le(prefix, 0, 8);
  constexpr uint64_t kMaxHeader = 100 << 20;  // as the reference implementation
  if (n > kMaxHeader) st_fail(path, "header length " + std::to_string(n) + " exceeds 100 MiB");
  const std::string json = in.read(n);
  if (json.size() < n)
    st_fail(path, "header length " + std::to_string(n) + " runs past the end of the file (" +
                      std::to_string(8 + json.size()) + " bytes)");
  nlohmann::json header;
  // A key twice in one object is an error, as in the format's reference
  // implementation (nlohmann keeps the last silently): one object's keys
  // per level of nesting.
  std::vector<std::vector<std::string>> keys;
  const auto no_duplicates = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start) keys.emplace_back();
    if (event == Event::object_end) keys.pop_back();
    if (event == Event::key && !keys.empty()) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (std::find(keys.back().begin(), keys.back().end(), key) != keys.back().end())
        st_fail(path, "header has the key '" + excerpt(key) + "' twice");
      keys.back().push_back(key);
    }
    return true;
  };
  try {
    header = nlohmann::json::parse(json, no_duplicates);
  } catch (const nlohmann::json::exception& e) {
    st_fail(path, std::string("header is not JSON: ") + e.what());
  }
  if (!header.is_object()) st_fail(path, "header is not a JSON object");
  return header;
}

// How far the data section must be read: as far as any tensor claims to
// reach (a stream no further). The entries are validated one by one later.
uint64_t claimed_data_end(const nlohmann::json& header) {
  uint64_t end = 0;
  for (const auto& item : header.items()) {
    const nlohmann::json& entry = item.value();
    if (!entry.is_object() || !entry.contains("data_offsets")) continue;
    const nlohmann::json& off = entry["data_offsets"];
    if (off.is_array() && off.size() == 2 && off[1].is_number_unsigned())
      end = std::max(end, off[1].get<uint64_t>());
  }
  return end;
}

// One tensor entry, validated against the data section (data_size bytes at
// data), as float32; `range` receives its data_offsets.
Tensor<float> read_safetensors_entry(const std::string& path, const std::string& name,
                                     const nlohmann::json& entry, const char* data,
                                     uint64_t data_size, std::pair<uint64_t, uint64_t>& range) {
  const auto bad = [&](const std::string& what) { st_fail(path, "tensor '" + excerpt(name) + "': " + what); };
  if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
      !entry.contains("data_offsets"))
    bad("needs dtype, shape and data_offsets");
  if (!entry["dtype"].is_string()) bad("dtype is not a string");
  const std::string dtype = entry["dtype"];
  const size_t esize = dtype_size(dtype);
  if (!esize) bad("unsupported dtype " + excerpt(dtype) + " (attn reads F32, F16, BF16)");
  Shape shape;
  if (!entry["shape"].is_array()) bad("shape is not an array");
  for (const auto& d : entry["shape"]) {
    if (!d.is_number_unsigned()) bad("shape has a non-integer or negative dimension");
    const uint64_t dim = d.get<uint64_t>();
    if (dim > static_cast<uint64_t>(INT64_MAX)) bad("dimension too large");
    shape.push_back(static_cast<int64_t>(dim));
  }
  const auto& off = entry["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
      !off[1].is_number_unsigned())
    bad("data_offsets must be two non-negative integers");
  const uint64_t begin = off[0], end = off[1];
  if (begin > end || end > data_size)
    bad("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
        "] are outside the " + std::to_string(data_size) + "-byte data section");
  const int64_t count = checked_numel(shape, esize, (path + ": tensor '" + name + "'").c_str());
  if (end - begin != static_cast<uint64_t>(count) * esize)
    bad("shape " + shape_str(shape) + " of " + dtype + " needs " +
        std::to_string(count * static_cast<int64_t>(esize)) + " bytes, data_offsets give " +
        std::to_string(end - begin));
  range = {begin, end};
  Tensor<float> t(shape);
  const char* src = data + begin;
  if (dtype == "F32") {
    std::memcpy(t.data(), src, static_cast<size_t>(count) * 4);
    return t;
  }
  const auto widen = dtype == "F16" ? fp16_to_float : bf16_to_float;
  for (int64_t i = 0; i < count; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    t[i] = widen(h);
  }
  return t;
}

}  // namespace

Safetensors read_safetensors(const std::string& path) {
  InputFile in(path);
  const nlohmann::json header = read_safetensors_header(in, path);
  const std::string data_section = in.read(claimed_data_end(header));
  const uint64_t data_size = data_section.size() + in.remaining().value_or(0);

  Safetensors out;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& item : header.items()) {
    const std::string& name = item.key();
    const nlohmann::json& entry = item.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) st_fail(path, "__metadata__ is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) st_fail(path, "__metadata__ value of '" + excerpt(key) + "' is not a string");
        out.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    out.tensors.emplace(name, read_safetensors_entry(path, name, entry, data_section.data(),
                                                     data_size, ranges.emplace_back()));
  }
  // The tensors cover the data section exactly, end to end, and the file
  // ends with it, as the reference implementation requires: no overlap, no
  // bytes that no tensor holds, nothing after.
  std::sort(ranges.begin(), ranges.end());
  uint64_t covered = 0;
  for (const auto& [begin, end] : ranges) {
    if (begin < covered) st_fail(path, "tensors overlap in the data section at byte " + std::to_string(begin));
    if (begin > covered)
      st_fail(path, "bytes " + std::to_string(covered) + " to " + std::to_string(begin) +
                        " of the data section belong to no tensor");
    covered = end;
  }
  const uint64_t trailing = data_size - covered;
  if (trailing > 0 || in.read(1).size() > 0)  // (a stream's size is known only by reading on)
    st_fail(path, (trailing > 0 ? std::to_string(trailing) : std::string("some")) +
                      " bytes follow the data section's last tensor");
  return out;
}

void write_safetensors(const std::string& path,
                       const std::map<std::string, TensorView<const float>>& tensors,
                       const std::map<std::string, std::string>& metadata, StorageDtype dtype) {
  const char* dname = dtype == StorageDtype::F32 ? "F32" : dtype == StorageDtype::F16 ? "F16" : "BF16";
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string data;
  for (const auto& [name, view] : tensors) {
    const Tensor<float> c = contiguous(view);
    const uint64_t begin = data.size();
    for (int64_t i = 0; i < c.numel(); ++i) {
      if (dtype == StorageDtype::F32) {
        data.append(reinterpret_cast<const char*>(&c[i]), 4);
      } else {
        const uint16_t h = dtype == StorageDtype::F16 ? float_to_fp16(c[i]) : float_to_bf16(c[i]);
        data += le_bytes(h, 2);
      }
    }
    header[name] = {{"dtype", dname}, {"shape", view.shape()}, {"data_offsets", {begin, data.size()}}};
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // align the data section to 8 bytes
  write_file(path, {le_bytes(json.size(), 8) + json, data});
}

}  // namespace attn
