// Test helpers: seeded random tensors, conversions and error measures.
#pragma once

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "attn/file.hpp"
#include "kernels/attention_kernel.hpp"

// Whether a sanitizer runs this build (GCC's and clang's ways of saying so).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define ATTN_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define ATTN_SANITIZED 1
#endif
#endif
#ifndef ATTN_SANITIZED
#define ATTN_SANITIZED 0
#endif

namespace attn::test {

// Whether a sanitizer runs this build: tests whose float64 references take
// minutes there run smaller (they check memory, not accuracy, there; the
// Release build runs them at full size).
constexpr bool sanitized() { return ATTN_SANITIZED; }

inline constexpr double kInf = std::numeric_limits<double>::infinity();

// A uniform double in [lo, hi), the very value std::uniform_real_distribution
// <double>(lo, hi) draws from a std::mt19937 in libstdc++ (generate_canonical:
// two 32-bit words, the second times 2^32, over 2^64), without the logl it
// computes at every draw for the engine's range: under the sanitizers that
// took about a sixth of the heaviest kernel tests' time. Test
// Kernels.TestInputsAreTheStandardLibrarysUniformDraws keeps the two equal.
inline double uniform(std::mt19937& rng, double lo, double hi) {
  double sum = static_cast<double>(rng());
  sum += static_cast<double>(rng()) * 4294967296.0;
  double canonical = sum / 18446744073709551616.0;
  if (canonical >= 1.0) canonical = std::nextafter(1.0, 0.0);
  return canonical * (hi - lo) + lo;
}

inline Tensor<double> random_tensor(const Shape& shape, std::mt19937& rng,
                                    double lo = -1.0, double hi = 1.0) {
  Tensor<double> t(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = uniform(rng, lo, hi);
  return t;
}

template <class To, class From>
Tensor<To> cast(const Tensor<From>& t) {
  Tensor<To> out(t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = static_cast<To>(t[i]);
  return out;
}

// ||a - b|| / ||b|| (Frobenius); 0 when both are zero.
template <class A, class B>
double rel_error(const Tensor<A>& a, const Tensor<B>& b) {
  EXPECT_EQ(a.shape(), b.shape());
  long double num = 0, den = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    const long double d = static_cast<long double>(a[i]) - static_cast<long double>(b[i]);
    num += d * d;
    den += static_cast<long double>(b[i]) * b[i];
  }
  if (den == 0) return std::sqrt(static_cast<double>(num));
  return std::sqrt(static_cast<double>(num / den));
}

template <class A, class B>
double max_abs_diff(const Tensor<A>& a, const Tensor<B>& b) {
  EXPECT_EQ(a.shape(), b.shape());
  // (A comparison, not std::fmax: both skip NaN differences, and g++ 12's
  // aarch64 vectorizer crashes on an fmax reduction, once numel() is known
  // not to change in the loop.)
  double m = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    const double diff = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (diff > m) m = diff;
  }
  return m;
}

// The extras a test asks a forward for beside its output.
struct Returns {
  bool weights = false;
  std::optional<Logits> logits;  // the stage, when the logits are wanted
  bool lse = false;
};
template <class T>
struct Forward {
  Tensor<T> out, weights, logits, lse;  // empty unless asked for
};
// One forward through the public plan, the output and each extra asked for
// allocated at the shapes the plan gives.
template <class T, class KV>
Forward<T> forward(TensorView<const T> q, TensorView<const KV> k, TensorView<const KV> v,
                   const Returns& returns, const AttentionOptions& options = {},
                   const AttentionMasks& masks = {}) {
  const AttentionPlan<T, KV> plan(q, k, v, options, masks);
  Forward<T> r;
  r.out = Tensor<T>(plan.output_shape());
  AttentionExtras<T> extras;
  if (returns.weights) extras.weights = (r.weights = Tensor<T>(plan.weights_shape())).view();
  if (returns.logits) {
    extras.logits = (r.logits = Tensor<T>(plan.weights_shape())).view();
    extras.logits_stage = *returns.logits;
  }
  if (returns.lse) extras.lse = (r.lse = Tensor<T>(plan.lse_shape())).view();
  plan.run(r.out.view(), extras);
  return r;
}
template <class T, class KV>
Forward<T> forward_with_weights(TensorView<const T> q, TensorView<const KV> k, TensorView<const KV> v,
                                const AttentionOptions& options = {}, const AttentionMasks& masks = {}) {
  return forward(q, k, v, Returns{.weights = true}, options, masks);
}

// One attention problem of the kernel tests: shapes, options and a mask kind.
struct KernelCase {
  int64_t batch, hq, hkv, n_q, n_k, d, d_v;
  Causal causal;
  Window window;
  double softcap;
  int mask;  // 0 none, 1 bool (n_q, n_k), 2 float (hq, 1, n_k)
  // ALiBi with alibi_slopes(hq, |alibi|) (negated when alibi < 0); 0: none.
  double alibi = 0;
  // Sinks: head h's logit is sinks · (h % 3 - 1) + 0.5 (some above the
  // row's logits, some below); 0: none.
  double sinks = 0;
};

// The case's AttentionOptions.
inline AttentionOptions options_of(const KernelCase& c) {
  AttentionOptions o;
  o.causal = c.causal;
  o.window = c.window;
  o.softcap = c.softcap;
  if (c.alibi != 0) {
    o.alibi_slopes = alibi_slopes(c.hq, std::abs(c.alibi));
    if (c.alibi < 0)
      for (double& s : o.alibi_slopes) s = -s;
  }
  for (int64_t h = 0; c.sinks != 0 && h < c.hq; ++h) o.sinks.push_back(c.sinks * double(h % 3 - 1) + 0.5);
  return o;
}

inline std::string describe(const KernelCase& c) {
  return "b=" + std::to_string(c.batch) + " hq=" + std::to_string(c.hq) + " hkv=" +
         std::to_string(c.hkv) + " n_q=" + std::to_string(c.n_q) + " n_k=" +
         std::to_string(c.n_k) + " d=" + std::to_string(c.d) + " d_v=" + std::to_string(c.d_v) +
         " causal=" + causal_name(c.causal) + " window=(" +
         std::to_string(c.window.left) + "," + std::to_string(c.window.right) +
         ") softcap=" + std::to_string(c.softcap) + " mask=" + std::to_string(c.mask) +
         " alibi=" + std::to_string(c.alibi) + " sinks=" + std::to_string(c.sinks);
}

// A fresh folder for one test's files, removed with its contents at the end.
// Named by the test's suite and name and this process, so that tests run in
// parallel (ctest -j, two builds' suites at once) never share one: two suites
// have a test CorruptFilesAreClearErrors, and sharing a folder made one
// remove the other's file mid-test.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path = std::filesystem::temp_directory_path() /
           ("attn_test_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name());
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path / name).string(); }
};

// A file's bytes ("" if it cannot be read).
inline std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// The names in a folder, sorted.
inline std::vector<std::string> names_in(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

// Expects `stmt` to throw E with a message containing `needle`.
#define EXPECT_THROW_MSG(stmt, E, needle)                                       \
  do {                                                                          \
    try {                                                                       \
      stmt;                                                                     \
      ADD_FAILURE() << "expected " #E " from: " #stmt;                          \
    } catch (const E& e) {                                                      \
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)          \
          << "message: " << e.what() << "\nmissing: " << (needle);              \
    }                                                                           \
  } while (0)

// True under instruction-set emulation (make test-arm sets ATTN_TEST_EMULATED):
// the few tests whose sizes make them impractical there (an emulated SVE
// instruction costs ~1000 native ones) run smaller, never skipped.
inline bool emulated() { return std::getenv("ATTN_TEST_EMULATED") != nullptr; }

// How bf16 precision uses the CPU's bf16 unit for this scope (the tests of
// each path); back to the measured choice at its end, also when an
// assertion leaves early.
struct BF16UnitUseScope {
  explicit BF16UnitUseScope(kernels::BF16UnitUse use) { kernels::set_bf16_unit_use(use); }
  ~BF16UnitUseScope() { kernels::set_bf16_unit_use(kernels::BF16UnitUse::Measured); }
  BF16UnitUseScope(const BF16UnitUseScope&) = delete;
  BF16UnitUseScope& operator=(const BF16UnitUseScope&) = delete;
};

// Runs body() once with each SIMD target this CPU can run forced, then
// restores the dispatcher's own choice. ATTN_TEST_TARGETS (names, e.g.
// "SVE_256 NEON") limits the targets to those: make test runs the Arm kernel
// tests under emulation with each CPU's best target only (make test-arm with
// all of them). A listed name this CPU cannot run is a failure.
template <class Body>
void on_every_simd_target(Body body) {
  // (bf16 precision times its unit against the FMAs of the dispatcher's
  // target once per process: on the best one, before a lesser one is forced.)
  kernels::bf16_unit_speedup();
  auto targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  if (const char* only = std::getenv("ATTN_TEST_TARGETS")) {
    std::vector<int64_t> chosen;
    std::istringstream names(only);
    for (std::string name; names >> name;) {
      const auto it = std::find_if(targets.begin(), targets.end(),
                                   [&](int64_t t) { return name == hwy::TargetName(t); });
      if (it == targets.end()) ADD_FAILURE() << "ATTN_TEST_TARGETS: this CPU cannot run " << name;
      else chosen.push_back(*it);
    }
    targets = chosen;
  }
  for (int64_t target : targets) {
    SCOPED_TRACE(hwy::TargetName(target));
    hwy::SetSupportedTargetsForTest(target);
    hwy::GetChosenTarget().Update(hwy::SupportedTargets());
    body();
  }
  hwy::SetSupportedTargetsForTest(0);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

}  // namespace attn::test
