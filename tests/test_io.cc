// .npy and safetensors: round trips, and every kind of corrupt file refused
// with a clear error.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>

#include "attn/half.hpp"
#include "attn/io.hpp"
#include "helpers.hpp"

namespace attn {
namespace {

namespace fs = std::filesystem;

using test::names_in;
using test::read_bytes;
using test::TempDir;

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}


std::string le(uint64_t v, int n) {
  std::string s(n, '\0');
  for (int i = 0; i < n; ++i) s[i] = char((v >> (8 * i)) & 0xff);
  return s;
}

// ---------------------------------------------------------------------------
// 16-bit floats, against the compiler's half type and the definition of
// round-to-nearest-even for bfloat16.

// _Float16, or __fp16 where the compiler has no _Float16 in C++ (clang before
// 15 on x86, the sanitizer build; g++ 12 on aarch64); both are IEEE binary16
// and convert with round-to-nearest-even.
#if (defined(__clang__) && __clang_major__ < 15) || (defined(__aarch64__) && !defined(__clang__) && __GNUC__ < 13)
using CompilerHalf = __fp16;
#else
using CompilerHalf = _Float16;
#endif

TEST(Half, Fp16ToFloatIsExactForAllValues) {
  for (uint32_t h = 0; h < 65536; ++h) {
    CompilerHalf ref;
    const uint16_t bits = static_cast<uint16_t>(h);
    std::memcpy(&ref, &bits, 2);
    const float got = fp16_to_float(bits);
    if (std::isnan(static_cast<float>(ref))) {
      EXPECT_TRUE(std::isnan(got)) << h;
    } else {
      EXPECT_EQ(got, static_cast<float>(ref)) << h;
      EXPECT_EQ(float_to_fp16(got), bits) << h;  // round trip
    }
  }
}

TEST(Half, FloatToFp16RoundsToNearestEven) {
  std::mt19937 rng(40);
  for (int i = 0; i < 200000; ++i) {
    uint32_t bits = rng();
    float f;
    std::memcpy(&f, &bits, 4);
    if (std::isnan(f)) continue;
    // concentrate on the half range: scale the exponent down
    int e;
    if (i % 2) f = std::ldexp(std::frexp(f, &e), int(rng() % 50) - 30);
    const CompilerHalf ref = static_cast<CompilerHalf>(f);
    uint16_t ref_bits;
    std::memcpy(&ref_bits, &ref, 2);
    ASSERT_EQ(float_to_fp16(f), ref_bits) << f;
  }
}

TEST(Half, Bf16IsTheNearestEvenBfloat) {
  std::mt19937 rng(41);
  for (int i = 0; i < 200000; ++i) {
    uint32_t bits = rng();
    float f;
    std::memcpy(&f, &bits, 4);
    if (std::isnan(f) || std::isinf(f)) continue;
    const uint16_t b = float_to_bf16(f);
    const double got = bf16_to_float(b);
    const double lo = bf16_to_float(static_cast<uint16_t>(bits >> 16));
    const double hi = bf16_to_float(static_cast<uint16_t>((bits >> 16) + 1));
    const double dlo = std::fabs(f - lo), dhi = std::fabs(f - hi);
    if (std::isinf(hi)) continue;
    const double expected = dlo < dhi ? lo : dhi < dlo ? hi : ((bits >> 16) & 1 ? hi : lo);
    ASSERT_EQ(got, expected) << f;
  }
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
}

// ---------------------------------------------------------------------------
// write_file: every writer goes through it (write_npy here; the pictures and
// the CLI's CSV are tested through the CLI in test_cli.py).

TEST(WriteFile, AFullDeviceIsAnError) {
  // A small file fits in the stream's buffer: only a checked flush and close
  // see the failure (the old writer returned as if it had worked).
  TempDir dir;
  const Tensor<float> a({2, 2}, {1, 2, 3, 4});
  EXPECT_THROW_MSG(write_npy("/dev/full", a.view()), IOError,
                   "/dev/full: write failed: No space left on device");
  fs::create_symlink("/dev/full", dir.file("full.npy"));
  EXPECT_THROW_MSG(write_npy(dir.file("full.npy"), a.view()), IOError, "No space left on device");
  EXPECT_THROW_MSG(write_safetensors(dir.file("full.npy"), {{"a", a.view()}}), IOError,
                   "No space left on device");
  EXPECT_TRUE(fs::is_symlink(dir.file("full.npy")));
}

TEST(WriteFile, AFailedWriteLeavesTheOldFileAndNoTemporary) {
  // The write fails part way (the file size limit, with SIGXFSZ ignored so
  // that write() reports EFBIG): in a child, whose limit cannot affect the
  // test runner.
  TempDir dir;
  const std::string path = dir.file("a.npy");
  const Tensor<float> small({2}, {1, 2});
  write_npy(path, small.view());
  const std::string old = read_bytes(path);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const rlimit limit{4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    ::signal(SIGXFSZ, SIG_IGN);
    try {
      write_npy(path, Tensor<float>({10000}).view());
    } catch (const IOError& e) {
      _exit(std::string(e.what()).find(path + ": write failed: File too large") == 0 ? 0 : 3);
    }
    _exit(2);  // no error
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: no error, 3: another message";
  EXPECT_EQ(read_bytes(path), old);
  EXPECT_EQ(names_in(dir.path), std::vector<std::string>{"a.npy"});
}

// Files written together: when one fails (in place or staged), or what runs
// before the renames throws, every target stays as it was, with no
// temporary file left.
TEST(WriteFile, ASetIsReplacedWholeOrNotAtAll) {
  TempDir dir;
  const std::string a = dir.file("a.txt"), b = dir.file("b.txt");
  write_file(a, {"old a"});
  write_file(b, {"old b"});
  fs::create_symlink("/dev/full", dir.file("full"));
  const auto unchanged = [&] {
    EXPECT_EQ(read_bytes(a), "old a");
    EXPECT_EQ(read_bytes(b), "old b");
    EXPECT_EQ(names_in(dir.path), (std::vector<std::string>{"a.txt", "b.txt", "full"}));
  };
  for (const std::string& failing : {std::string("/dev/full"), dir.file("full"), dir.file("no/such/c.txt")}) {
    FileSet files;
    files.add(a, std::string("new a"));
    files.add(failing, {"x"});
    files.add(b, {"new ", "b"});
    EXPECT_THROW(files.write(), IOError) << failing;
    unchanged();
  }
  FileSet files;
  files.add(a, std::string("new a"));
  files.add(b, std::string("new b"));
  EXPECT_THROW_MSG(files.write([] { throw IOError("standard output: write error"); }), IOError, "standard output");
  unchanged();
  FileSet twice;
  twice.add(a, {"1"});
  fs::create_symlink("a.txt", dir.file("to_a"));
  twice.add(dir.file("to_a"), {"2"});
  EXPECT_THROW_MSG(twice.write(), IOError, dir.file("to_a") + ": also given as '" + a + "'");
  EXPECT_EQ(read_bytes(a), "old a");
  files.write();
  EXPECT_EQ(read_bytes(a), "new a");
  EXPECT_EQ(read_bytes(b), "new b");
}

// A file its owner made read-only (mode 444) is refused, as cp refuses it:
// the rename that replaces it needs only the folder's permission. Root may
// write anything, so the test runs in a child that drops to "nobody".
TEST(WriteFile, AWriteProtectedFileIsRefused) {
  TempDir dir;
  ::chmod(dir.path.c_str(), 0777);
  const std::string path = dir.file("keep.txt");
  write_file(path, {"old"});
  ::chmod(path.c_str(), 0444);
  if (::getuid() == 0) {
    ASSERT_EQ(::chown(path.c_str(), 65534, 65534), 0);
  }
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (::getuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) _exit(4);
    try {
      write_file(path, {"new"});
    } catch (const IOError& e) {
      _exit(std::string(e.what()) == path + ": cannot open for writing: Permission denied" ? 0 : 3);
    }
    _exit(2);  // no error
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: no error, 3: another message, 4: could not drop root";
  EXPECT_EQ(read_bytes(path), "old");
  EXPECT_EQ(names_in(dir.path), std::vector<std::string>{"keep.txt"});
}

TEST(WriteFile, AMissingFolderIsAnErrorNamingIt) {
  TempDir dir;
  const std::string path = dir.file("no/such/a.npy");
  EXPECT_THROW_MSG(write_npy(path, Tensor<float>({1}).view()), IOError,
                   path + ": cannot write: cannot open a new file in '" + dir.file("no/such") +
                       "': No such file or directory");
}

TEST(WriteFile, ReplacingKeepsTheModeAndTheLink) {
  TempDir dir;
  const std::string path = dir.file("a.npy"), link = dir.file("link.npy");
  write_npy(path, Tensor<float>({1}, {1}).view());
  ::chmod(path.c_str(), 0604);
  fs::create_symlink("a.npy", link);
  write_npy(link, Tensor<float>({2}, {5, 6}).view());
  EXPECT_TRUE(fs::is_symlink(link));
  const auto back = std::get<Tensor<float>>(read_npy(path));
  EXPECT_EQ(back.shape(), Shape{2});
  EXPECT_EQ(back[1], 6.0f);
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0604u);
  // A new file: the mode the umask gives (0666 & ~umask, as open() does).
  const mode_t umask_before = ::umask(027);
  write_npy(dir.file("new.npy"), Tensor<float>({1}).view());
  ::umask(umask_before);
  ASSERT_EQ(::stat(dir.file("new.npy").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  EXPECT_EQ(names_in(dir.path), (std::vector<std::string>{"a.npy", "link.npy", "new.npy"}));
}

TEST(WriteFile, AFifoIsWrittenInPlace) {
  TempDir dir;
  const std::string fifo = dir.file("pipe.npy"), file = dir.file("file.npy");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const Tensor<float> a({3}, {1, 2, 3});
  std::string received;
  std::thread reader([&] { received = read_bytes(fifo); });
  write_npy(fifo, a.view());
  reader.join();
  write_npy(file, a.view());
  EXPECT_EQ(received, read_bytes(file));
  EXPECT_EQ(fs::status(fifo).type(), fs::file_type::fifo);
}

// ---------------------------------------------------------------------------
// .npy

TEST(Npy, RoundTrip) {
  TempDir dir;
  std::mt19937 rng(42);
  for (const Shape& shape : {Shape{}, Shape{0}, Shape{7}, Shape{3, 4}, Shape{2, 3, 5}}) {
    const auto a = test::random_tensor(shape, rng);
    write_npy(dir.file("a.npy"), a.view());
    const auto back = std::get<Tensor<double>>(read_npy(dir.file("a.npy")));
    EXPECT_EQ(back.shape(), shape);
    EXPECT_EQ(test::max_abs_diff(back, a), 0.0);
    const auto f = test::cast<float>(a);
    write_npy(dir.file("f.npy"), f.view());
    const auto fb = std::get<Tensor<float>>(read_npy(dir.file("f.npy")));
    EXPECT_EQ(test::max_abs_diff(fb, f), 0.0);
  }
}

TEST(Npy, ReadsVersionsTwoAndThree) {
  TempDir dir;
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
  std::string pad(64 - (12 + dict.size() + 1) % 64, ' ');
  const float data[2] = {1.5f, -2.0f};
  for (char version : {'\x02', '\x03'}) {
    std::string bytes = std::string("\x93NUMPY", 6) + version + '\0' +
                        le(dict.size() + pad.size() + 1, 4) + dict + pad + "\n" +
                        std::string(reinterpret_cast<const char*>(data), 8);
    write_bytes(dir.file("v.npy"), bytes);
    const auto t = std::get<Tensor<float>>(read_npy(dir.file("v.npy")));
    EXPECT_EQ(t.shape(), Shape{2});
    EXPECT_EQ(t[0], 1.5f);
    EXPECT_EQ(t[1], -2.0f);
  }
}

std::string npy_v1(const std::string& dict, const std::string& data) {
  return std::string("\x93NUMPY\x01\x00", 8) + le(dict.size() + 1, 2) + dict + "\n" + data;
}
// Version 2: a 4-byte header length (no alignment padding: attn does not need it).
std::string npy_v2(const std::string& dict, const std::string& data) {
  return std::string("\x93NUMPY\x02\x00", 8) + le(dict.size() + 1, 4) + dict + "\n" + data;
}

TEST(Npy, CorruptFilesAreClearErrors) {
  TempDir dir;
  const std::string f = dir.file("bad.npy");
  const std::string ok = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }";
  const std::string data16(16, '\0');
  struct Case {
    std::string bytes, needle;
  };
  const std::vector<Case> cases = {
      {"", "magic"},
      {"PK\x03\x04 not numpy at all", "magic"},
      {std::string("\x93NUMPY\x01\x00", 8), "truncated header"},
      {std::string("\x93NUMPY\x09\x00", 8) + le(4, 2) + "{}  ", "version 9"},
      {std::string("\x93NUMPY\x01\x00", 8) + le(5000, 2) + "{}", "runs past the end"},
      {npy_v1(ok, data16.substr(0, 15)), "needs 16 bytes of data, the file has 15"},
      {npy_v1(ok, data16 + "x"), "the file has 17"},
      {npy_v1("{'descr': '<i4', 'fortran_order': False, 'shape': (2, 2), }", data16),
       "unsupported .npy dtype '<i4'"},
      {npy_v1("{'descr': '>i4', 'fortran_order': False, 'shape': (2, 2), }", data16),
       "unsupported .npy dtype '>i4'"},
      {npy_v1("{'descr': '<f16', 'fortran_order': False, 'shape': (2, 2), }", data16),
       "unsupported .npy dtype '<f16'"},
      {npy_v1("{'descr': '|u1', 'fortran_order': False, 'shape': (2, 2), }", data16),
       "unsupported .npy dtype '|u1'"},
      {npy_v1("{'descr': '<f2', 'fortran_order': False, 'shape': (2, 2), }", data16),
       "needs 8 bytes of data, the file has 16"},
      {npy_v1("{'descr': '>f8', 'fortran_order': True, 'shape': (2, 2), }", data16),
       "needs 32 bytes of data, the file has 16"},
      {npy_v1("{'fortran_order': False, 'shape': (2, 2), }", data16), "no 'descr'"},
      {npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }", data16),
       "malformed shape"},
      {npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (-2, 2), }", data16),
       "malformed shape"},
      {npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': "
              "(999999999999, 999999999999, 999999999999), }", data16),
       "refusing to allocate"},
  };
  for (const auto& c : cases) {
    write_bytes(f, c.bytes);
    EXPECT_THROW_MSG(read_npy(f), ValueError, c.needle);
  }
  EXPECT_THROW_MSG(read_npy(dir.file("missing.npy")), IOError, "cannot open");
  EXPECT_THROW_MSG(read_npy(dir.path.string()), IOError,
                   dir.path.string() + ": cannot read: Is a directory");
}

// float16, big-endian and Fortran-order files are read as np.load reads them
// (test_mha.py compares with NumPy's own files; here the bytes are built by
// hand from the format's definition).
TEST(Npy, ReadsFloat16BigEndianAndFortranOrder) {
  TempDir dir;
  const std::string f = dir.file("a.npy");
  const auto big_endian = [](std::string bytes, size_t size) {
    for (size_t i = 0; i < bytes.size(); i += size) std::reverse(&bytes[i], &bytes[i + size]);
    return bytes;
  };
  // fp16 bits of 1, -2, 0.5, 65504 (the largest half), -0, +inf.
  const uint16_t halves[6] = {0x3C00, 0xC000, 0x3800, 0x7BFF, 0x8000, 0x7C00};
  const std::string h(reinterpret_cast<const char*>(halves), 12);
  const std::vector<float> as_floats{1, -2, 0.5, 65504, -0.0f, INFINITY};
  for (const auto& [descr, bytes] : {std::pair{"<f2", h}, {">f2", big_endian(h, 2)}}) {
    write_bytes(f, npy_v1(std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (2, 3), }", bytes));
    const auto t = std::get<Tensor<float>>(read_npy(f));
    EXPECT_EQ(t.shape(), (Shape{2, 3})) << descr;
    for (int i = 0; i < 6; ++i) EXPECT_EQ(t[i], as_floats[i]) << descr << " " << i;
    EXPECT_TRUE(std::signbit(t[4])) << descr;
  }
  // The (2, 3) array [[0, 1, 2], [3, 4, 5]]: Fortran order stores its columns.
  const double fortran[6] = {0, 3, 1, 4, 2, 5};
  const std::string d(reinterpret_cast<const char*>(fortran), 48);
  for (const auto& [descr, bytes] : {std::pair{"<f8", d}, {">f8", big_endian(d, 8)}}) {
    write_bytes(f, npy_v1(std::string("{'descr': '") + descr + "', 'fortran_order': True, 'shape': (2, 3), }", bytes));
    const auto t = std::get<Tensor<double>>(read_npy(f));
    EXPECT_EQ(t.shape(), (Shape{2, 3})) << descr;
    for (int i = 0; i < 6; ++i) EXPECT_EQ(t[i], i) << descr;
  }
  // Rank 3 in Fortran order: element (i, j, k) at i + 2 j + 6 k.
  std::vector<float> column_major(24);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) column_major[i + 2 * j + 6 * k] = float(100 * i + 10 * j + k);
  write_bytes(f, npy_v1("{'descr': '>f4', 'fortran_order': True, 'shape': (2, 3, 4), }",
                        big_endian(std::string(reinterpret_cast<const char*>(column_major.data()), 96), 4)));
  const auto t = std::get<Tensor<float>>(read_npy(f));
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) EXPECT_EQ(t.at({i, j, k}), float(100 * i + 10 * j + k));
  // An empty array in Fortran order whose other axes multiply past int64
  // (found by fuzz_npy: the column-major steps overflowed): empty, its shape kept.
  const Shape huge{3, 1033830, 8030388, 36, 4000000000, 0};
  write_bytes(f, npy_v1("{'descr': '<f4', 'fortran_order': True, 'shape': (3, 1033830, 8030388, 36, 4000000000, 0), }", ""));
  const auto empty = std::get<Tensor<float>>(read_npy(f));
  EXPECT_EQ(empty.shape(), huge);
  EXPECT_EQ(empty.numel(), 0);
}

// A stream is read only as far as the header says: an endless one is a
// clear error, not an attempt to hold all of it (std::bad_alloc before).
TEST(Npy, StreamsAreReadOnlyAsFarAsTheFormatSays) {
  EXPECT_THROW_MSG(read_npy("/dev/zero"), ValueError, "/dev/zero: not a valid .npy file: missing");
  EXPECT_THROW_MSG(read_safetensors("/dev/zero"), ValueError, "/dev/zero: not a valid safetensors file");
  // A valid array through a FIFO, then the same header with data that never ends.
  TempDir dir;
  const std::string fifo = dir.file("pipe.npy");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string ok = npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }",
                                std::string("\0\0\x80\x3f\0\0\0\x40", 8));
  // The endless writer stops when the reader closes its end: its write then
  // fails with EPIPE instead of a SIGPIPE that would end the test runner.
  const auto sigpipe_before = ::signal(SIGPIPE, SIG_IGN);
  for (const bool endless : {false, true}) {
    std::thread writer([&] {
      std::ofstream out(fifo, std::ios::binary);
      out << ok;
      for (int i = 0; endless && out && i < 1000000; ++i) out << std::string(4096, 'x') << std::flush;
    });
    if (endless) {
      EXPECT_THROW_MSG(read_npy(fifo), ValueError, "needs 8 bytes of data, the file has more");
    } else {
      const auto t = std::get<Tensor<float>>(read_npy(fifo));
      EXPECT_EQ(t[0], 1.0f);
      EXPECT_EQ(t[1], 2.0f);
    }
    writer.join();
  }
  ::signal(SIGPIPE, sigpipe_before);
}

// Regression: the header parser once recursed per character (std::regex)
// and crashed on a 30 kB header; found by a long-header test for issue 8.
TEST(Npy, LongHeadersNeitherCrashNorFloodTheMessage) {
  TempDir dir;
  const std::string f = dir.file("long.npy");
  std::string ones;
  for (int i = 0; i < 100000; ++i) ones += "1, ";
  write_bytes(f, npy_v2("{'descr': '<f4', 'fortran_order': False, 'shape': (" + ones + "), }",
                        std::string(4, '\0')));
  const auto a = read_npy(f);
  EXPECT_EQ(std::get<Tensor<float>>(a).shape(), Shape(100000, 1));
  write_bytes(f, npy_v2("{'descr': '" + std::string(1000000, 'a') +
                            "', 'fortran_order': False, 'shape': (1,), }",
                        std::string(4, '\0')));
  try {
    read_npy(f);
    ADD_FAILURE() << "a 1 MB dtype was accepted";
  } catch (const ValueError& e) {
    EXPECT_LT(std::string(e.what()).size(), 300u);
    EXPECT_NE(std::string(e.what()).find("unsupported .npy dtype 'aaaa"), std::string::npos);
  }
}

// ---------------------------------------------------------------------------
// safetensors

TEST(Safetensors, RoundTripInEveryDtype) {
  TempDir dir;
  std::mt19937 rng(43);
  const auto w = test::cast<float>(test::random_tensor({3, 5}, rng));
  const auto b = test::cast<float>(test::random_tensor({5}, rng));
  const Tensor<float> empty({0, 4});
  for (auto [dtype, tol] : {std::pair{StorageDtype::F32, 0.0}, {StorageDtype::F16, 1e-3},
                            {StorageDtype::BF16, 8e-3}}) {
    write_safetensors(dir.file("w.safetensors"),
                      {{"weight", w.view()}, {"bias", b.view()}, {"empty", empty.view()}},
                      {{"embed_dim", "5"}, {"note", "猫咬狗"}}, dtype);
    const auto st = read_safetensors(dir.file("w.safetensors"));
    EXPECT_EQ(st.metadata.at("embed_dim"), "5");
    EXPECT_EQ(st.metadata.at("note"), "猫咬狗");
    EXPECT_LE(test::max_abs_diff(st.tensors.at("weight"), w), tol);
    EXPECT_LE(test::max_abs_diff(st.tensors.at("bias"), b), tol);
    EXPECT_EQ(st.tensors.at("empty").shape(), (Shape{0, 4}));
  }
}

std::string st_file(const std::string& json, const std::string& data) {
  return le(json.size(), 8) + json + data;
}

TEST(Safetensors, CorruptFilesAreClearErrors) {
  TempDir dir;
  const std::string f = dir.file("bad.safetensors");
  const std::string d8(8, '\0');
  struct Case {
    std::string bytes, needle;
  };
  const std::vector<Case> cases = {
      {"", "shorter than its 8-byte header length"},
      {le(1ull << 40, 8), "exceeds 100 MiB"},
      {le(64, 8) + "{}", "runs past the end of the file"},
      {st_file("{not json", ""), "not JSON"},
      {st_file("[1, 2]", ""), "not a JSON object"},
      {st_file(R"({"w": {"dtype": "F32", "shape": [2]}})", d8), "needs dtype, shape and data_offsets"},
      {st_file(R"({"w": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})", d8),
       "unsupported dtype I64"},
      {st_file(R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", d8),
       "non-integer or negative dimension"},
      {st_file(R"({"w": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]}})", d8),
       "non-integer or negative dimension"},
      {st_file(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 16]}})", d8),
       "outside the 8-byte data section"},
      {st_file(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", d8),
       "outside"},
      {st_file(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", d8),
       "shape (3,) of F32 needs 12 bytes, data_offsets give 8"},
      {st_file(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
               R"( "v": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}})", d8),
       "overlap"},
      {st_file(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 4294967296],)"
               R"( "data_offsets": [0, 8]}})", d8),
       "refusing to allocate"},
      {st_file(R"({"__metadata__": {"n": 5}})", ""), "is not a string"},
      // As the format's reference implementation: a key twice (nlohmann kept
      // the last), bytes no tensor holds, bytes after the last tensor.
      {st_file(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
               R"( "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", d8),
       "header has the key 'w' twice"},
      {st_file(R"({"__metadata__": {"a": "1", "a": "2"}})", ""), "header has the key 'a' twice"},
      {st_file(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
               R"( "v": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})", d8 + "1234"),
       "bytes 4 to 8 of the data section belong to no tensor"},
      {st_file(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", d8 + "x"),
       "1 bytes follow the data section's last tensor"},
  };
  for (const auto& c : cases) {
    write_bytes(f, c.bytes);
    EXPECT_THROW_MSG(read_safetensors(f), ValueError, c.needle);
  }
  EXPECT_THROW_MSG(read_safetensors(dir.file("missing.safetensors")), IOError, "cannot open");
  EXPECT_THROW_MSG(read_safetensors(dir.path.string()), IOError, "cannot read: Is a directory");
}

}  // namespace
}  // namespace attn
