// Reliability: results that do not depend on the thread count, on repeated
// runs or on other threads calling at the same time; and the numeric edge
// cases of docs/semantics.md "Numeric edge cases", each in float32 (the kernels, prefill and
// decode) and float64 (the reference).
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

#include "attn/threads.hpp"
#include "helpers.hpp"

namespace attn {
namespace {

using test::cast;
using test::random_tensor;
using test::rel_error;

template <class T>
bool same_bits(const Tensor<T>& a, const Tensor<T>& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), static_cast<size_t>(a.numel()) * sizeof(T)) == 0;
}

// Restores the library's thread count when a test ends.
struct RestoreThreads {
  int saved = num_threads();
  ~RestoreThreads() { set_num_threads(saved); }
};

// compute() at 1 thread, then twice each at 1, 2, 3 and 8: every result
// bitwise equal to the first. Returns the first.
template <class F>
auto expect_same_bits_for_any_thread_count(F compute) {
  RestoreThreads restore;
  set_num_threads(1);
  const auto first = compute();
  for (int threads : {1, 2, 3, 8})
    for (int run = 0; run < 2; ++run) {
      set_num_threads(threads);
      EXPECT_TRUE(same_bits(compute(), first)) << threads << " threads, run " << run;
    }
  return first;
}

// An attention problem in float64 and its float32 copy.
struct Problem {
  Tensor<double> q, k, v;
  Tensor<float> q32, k32, v32;
  Problem(Shape qs, Shape ks, Shape vs, uint32_t seed) {
    std::mt19937 rng(seed);
    q = random_tensor(qs, rng), k = random_tensor(ks, rng), v = random_tensor(vs, rng);
    q32 = cast<float>(q), k32 = cast<float>(k), v32 = cast<float>(v);
  }
  Tensor<float> run32(const AttentionOptions& o = {}) const {
    return attention(q32.view(), k32.view(), v32.view(), o);
  }
  Tensor<double> run64(const AttentionOptions& o = {}) const {
    return attention(q.view(), k.view(), v.view(), o);
  }
};

AttentionOptions causal() {
  AttentionOptions o;
  o.causal = Causal::BottomRight;
  return o;
}

// Prefill: query tiles × key tiles (flash). Decode: n_q <= 32 against more
// than one 512-key chunk (split-KV). GQA in both.
Problem prefill_problem() { return Problem({2, 4, 300, 64}, {2, 2, 260, 64}, {2, 2, 260, 48}, 1); }
Problem decode_problem() { return Problem({1, 8, 2, 64}, {1, 2, 3000, 64}, {1, 2, 3000, 64}, 2); }

TEST(Determinism, AttentionPrefillAndDecode) {
  for (const Problem& p : {prefill_problem(), decode_problem()}) {
    const auto out = expect_same_bits_for_any_thread_count([&] { return p.run32(causal()); });
    EXPECT_LT(rel_error(out, p.run64(causal())), 1e-5);
  }
}

MultiHeadAttentionConfig layer_config() {
  MultiHeadAttentionConfig c;
  c.embed_dim = 64;
  c.num_heads = 8;
  c.num_kv_heads = 2;
  c.rope = true;
  return c;
}

// The layer fed a sequence (batch 2, 600 tokens) through a KV cache: one
// chunk of 590 (prefill), then single tokens against > 512 cached keys
// (decode). Returns every step's output, concatenated.
template <class T>
Tensor<T> cached_forward(const MultiHeadAttention<T>& layer, const Tensor<T>& x) {
  const int64_t n = x.dim(1), E = x.dim(2);
  KVCache<T> cache = layer.new_cache();
  MhaForwardOptions<T> o;
  o.attention.causal = Causal::BottomRight;
  o.cache = &cache;
  Tensor<T> all(x.shape());
  for (int64_t at = 0; at < n;) {
    const int64_t len = at == 0 ? n - 10 : 1;
    const TensorView<const T> part(x.data() + at * E, {2, len, E}, {n * E, E, 1});
    const Tensor<T> y = layer.forward(part, {}, {}, o).out;
    for (int64_t b = 0; b < 2; ++b)
      std::copy(y.data() + b * len * E, y.data() + (b + 1) * len * E, all.data() + (b * n + at) * E);
    at += len;
  }
  return all;
}

TEST(Determinism, LayerAndKVCache) {
  std::mt19937 rng(3);
  const auto x = random_tensor({2, 600, 64}, rng);
  const auto x32 = cast<float>(x);
  const MultiHeadAttention<float> layer(layer_config(), 5);
  const MultiHeadAttention<double> layer64(layer_config(), 5);
  MhaForwardOptions<float> o;
  o.attention.causal = Causal::BottomRight;
  const auto whole = expect_same_bits_for_any_thread_count(
      [&] { return layer.forward(x32.view(), {}, {}, o).out; });
  const auto cached = expect_same_bits_for_any_thread_count(
      [&] { return cached_forward(layer, x32); });
  MhaForwardOptions<double> o64;
  o64.attention.causal = Causal::BottomRight;
  const auto ref = layer64.forward(x.view(), {}, {}, o64).out;
  EXPECT_LT(rel_error(whole, ref), 1e-5);
  EXPECT_LT(rel_error(cached, ref), 1e-5);
}

// Runs job(t) on 8 threads at once, each `rounds` times.
template <class F>
void on_eight_threads(int rounds, F job) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      for (int r = 0; r < rounds; ++r) job(t);
    });
  for (auto& th : threads) th.join();
}

TEST(Concurrency, EightThreadsCallingAttentionGetTheSerialResults) {
  RestoreThreads restore;
  set_num_threads(2);  // the callers also contend for the library's pool
  std::vector<Problem> problems;
  for (int t = 0; t < 8; ++t)
    problems.push_back(t % 2 ? Problem({1, 2, 3, 32}, {1, 1, 700 + t, 32}, {1, 1, 700 + t, 16}, t)
                             : Problem({2, 2, 70 + t, 32}, {2, 2, 90, 32}, {2, 2, 90, 24}, t));
  std::vector<Tensor<float>> serial;
  for (const auto& p : problems) serial.push_back(p.run32(causal()));
  std::vector<int> mismatches(8, 0);
  on_eight_threads(3, [&](int t) {
    mismatches[t] += !same_bits(problems[t].run32(causal()), serial[t]);
  });
  for (int t = 0; t < 8; ++t) {
    EXPECT_EQ(mismatches[t], 0) << "thread " << t;
    EXPECT_LT(rel_error(serial[t], problems[t].run64(causal())), 1e-5);
  }
}

TEST(Concurrency, EightThreadsShareOneLayerWithTheirOwnCaches) {
  RestoreThreads restore;
  set_num_threads(2);
  const MultiHeadAttention<float> layer(layer_config(), 7);
  std::vector<Tensor<float>> inputs, serial;
  for (int t = 0; t < 8; ++t) {
    std::mt19937 rng(100 + t);
    inputs.push_back(cast<float>(random_tensor({2, 520 + t, 64}, rng)));
    serial.push_back(cached_forward(layer, inputs.back()));
  }
  std::vector<int> mismatches(8, 0);
  on_eight_threads(2, [&](int t) {
    mismatches[t] += !same_bits(cached_forward(layer, inputs[t]), serial[t]);
  });
  for (int t = 0; t < 8; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

// A cache is one sequence: a second thread's use while one thread holds it
// is a RuntimeError naming the reason, for every call that uses it, and the
// cache is as the first thread leaves it.
TEST(Concurrency, ACacheHeldByOneThreadIsAnErrorForAnother) {
  const MultiHeadAttention<float> layer(layer_config(), 7);
  KVCache<float> cache = layer.new_cache();
  std::mt19937 rng(4);
  const Tensor<float> x = cast<float>(random_tensor({1, 5, 64}, rng));
  const Tensor<float> kv = cast<float>(random_tensor({1, 2, 3, 8}, rng));
  MhaForwardOptions<float> o;
  o.cache = &cache;
  layer.forward(x.view(), {}, {}, o);
  {
    const auto held = cache.use("test");
    cache.append(kv.view(), kv.view());  // the holding thread itself may
    std::thread other([&] {
      const std::string busy = "the cache is in use by another thread";
      EXPECT_THROW_MSG(layer.forward(x.view(), {}, {}, o), RuntimeError, "KVCache: forward: " + busy);
      EXPECT_THROW_MSG(cache.append(kv.view(), kv.view()), RuntimeError, "KVCache: append: " + busy);
      EXPECT_THROW_MSG(cache.evict(), RuntimeError, busy);
      EXPECT_THROW_MSG(cache.clear(), RuntimeError, busy);
      EXPECT_THROW_MSG(cache.bytes(), RuntimeError, busy);
      EXPECT_THROW_MSG(cache.keys(), RuntimeError, busy);
      EXPECT_THROW_MSG(cache.visit([](auto, auto) { return 0; }), RuntimeError, busy);
    });
    other.join();
  }
  EXPECT_EQ(cache.length(), 8);
  std::thread after([&] { layer.forward(x.view(), {}, {}, o); });  // released: another thread may
  after.join();
  EXPECT_EQ(cache.length(), 13);
}

// Four threads feeding one cache at once (which corrupted memory): each
// forward either runs whole or raises, and the cache holds exactly the
// tokens of the forwards that ran, as a serial run of that many gives them.
TEST(Concurrency, FourThreadsSharingOneCacheNeverCorruptIt) {
  RestoreThreads restore;
  set_num_threads(2);
  MultiHeadAttentionConfig c = layer_config();
  c.rope = false;  // (so that the tokens' order in the cache does not matter)
  const MultiHeadAttention<float> layer(c, 7);
  std::mt19937 rng(8);
  const Tensor<float> chunk = cast<float>(random_tensor({1, 64, 64}, rng));
  KVCache<float> shared = layer.new_cache();
  MhaForwardOptions<float> o;
  o.cache = &shared;
  std::atomic<int> ran{0}, refused{0}, other_errors{0}, ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (++ready; ready < 4;) std::this_thread::yield();  // all start at once
      for (int r = 0; r < 25; ++r) try {
          layer.forward(chunk.view(), {}, {}, o);
          ++ran;
        } catch (const RuntimeError& e) {
          ++(std::string(e.what()).find("in use by another thread") != std::string::npos ? refused : other_errors);
        } catch (...) {
          ++other_errors;
        }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(other_errors, 0);
  EXPECT_EQ(ran + refused, 100);
  EXPECT_EQ(shared.length(), 64 * ran);
  KVCache<float> serial = layer.new_cache();
  o.cache = &serial;
  for (int r = 0; r < ran; ++r) layer.forward(chunk.view(), {}, {}, o);
  const Tensor<float> a = layer.forward(chunk.view(), {}, {}, o).out;
  o.cache = &shared;
  EXPECT_TRUE(same_bits(layer.forward(chunk.view(), {}, {}, o).out, a));
}

// One thread loads two parameter sets in turn while two threads run
// forwards: every forward sees one set whole (bitwise the serial result with
// A or with B), never a mix or freed memory (ASan, `make tsan`). Packed
// weights were copied in place and separate ones reallocated: both layouts.
template <class T>
void forwards_during_loads(MultiHeadAttentionConfig config) {
  RestoreThreads restore;
  set_num_threads(2);
  MultiHeadAttention<T> layer(config, 1);
  const auto a = MultiHeadAttention<T>(config, 2).state_dict();
  const auto b = MultiHeadAttention<T>(config, 3).state_dict();
  std::mt19937 rng(9);
  const Tensor<T> x = cast<T>(random_tensor({1, 40, config.embed_dim}, rng));
  layer.load_state_dict(a);
  const Tensor<T> ya = layer.forward(x.view()).out;
  layer.load_state_dict(b);
  const Tensor<T> yb = layer.forward(x.view()).out;
  ASSERT_FALSE(same_bits(ya, yb));
  std::atomic<bool> done{false};
  std::atomic<int> forwards{0}, mixed{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 2; ++t)
    readers.emplace_back([&] {
      while (!done) {
        const Tensor<T> y = layer.forward(x.view()).out;
        mixed += !same_bits(y, ya) && !same_bits(y, yb);
        ++forwards;
      }
    });
  for (int i = 0; i < 200 || forwards < 50; ++i) layer.load_state_dict(i % 2 ? b : a);
  done = true;
  for (auto& r : readers) r.join();
  EXPECT_EQ(mixed, 0) << "of " << forwards << " forwards";
}

MultiHeadAttentionConfig packed_projections() {
  MultiHeadAttentionConfig c = layer_config();
  c.num_kv_heads.reset();  // q, k, v weights in one in_proj_weight
  return c;
}

TEST(Concurrency, LoadStateDictWhileForwardsRun) {
  forwards_during_loads<float>(packed_projections());
  forwards_during_loads<double>(packed_projections());
  forwards_during_loads<float>(layer_config());  // separate q, k, v weights
  forwards_during_loads<double>(layer_config());
}

TEST(Threads, CountsOutsideOneToMaxAreRefused) {
  RestoreThreads restore;
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_EQ(max_num_threads(), std::min(1024, std::max(64, 4 * hw)));
  EXPECT_GE(max_num_threads(), 8);  // the tests' 8 threads stay valid on 2 cores
  EXPECT_THROW_MSG(set_num_threads(0), ValueError, "set_num_threads: n must be in [1, max_num_threads() = ");
  EXPECT_THROW_MSG(set_num_threads(max_num_threads() + 1), ValueError, "got " + std::to_string(max_num_threads() + 1));
  EXPECT_THROW_MSG(set_num_threads(100000), ValueError, "got 100000");
  set_num_threads(max_num_threads());
  EXPECT_EQ(num_threads(), max_num_threads());
}

// parallel_for runs every item once, on more than one thread when it has
// them; a nested call runs on its caller's thread; an item that throws
// leaves the others to run, and the lowest-numbered item's exception is the
// one rethrown.
TEST(Threads, ParallelForRunsEveryItemOnceAndRethrowsTheFirstError) {
  RestoreThreads restore;
  set_num_threads(4);
  constexpr int64_t n = 64;
  std::vector<std::atomic<int>> runs(n);
  std::mutex ids_mutex;
  std::vector<std::thread::id> ids;
  parallel_for(n, [&](int64_t i) {
    runs[i].fetch_add(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // long enough for the others to take some
    std::lock_guard lock(ids_mutex);
    if (std::find(ids.begin(), ids.end(), std::this_thread::get_id()) == ids.end())
      ids.push_back(std::this_thread::get_id());
  });
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(runs[i].load(), 1) << "item " << i;
  EXPECT_GT(ids.size(), 1u);

  std::atomic<int> inner{0};
  parallel_for(4, [&](int64_t) {
    const auto outer_thread = std::this_thread::get_id();
    parallel_for(3, [&](int64_t) {
      EXPECT_EQ(std::this_thread::get_id(), outer_thread);
      inner.fetch_add(1);
    });
  });
  EXPECT_EQ(inner.load(), 12);

  std::atomic<int> ran{0};
  EXPECT_THROW_MSG(parallel_for(n,
                                [&](int64_t i) {
                                  ran.fetch_add(1);
                                  if (i == 40 || i == 7 || i == 63) throw ValueError("item " + std::to_string(i));
                                }),
                   ValueError, "item 7");
  EXPECT_EQ(ran.load(), n);
  EXPECT_THROW_MSG(parallel_for(-1, [](int64_t) {}), ValueError, "parallel_for: n must be >= 0, got -1");
  parallel_for(0, [](int64_t) { ADD_FAILURE() << "an item of an empty range ran"; });
}

// A pool the system cannot start is an error, not std::terminate: the
// process is limited to fewer threads than asked for (RLIMIT_NPROC counts
// threads; root ignores it, so the test runs in a child that drops to
// "nobody" when run as root). The child asks for 37 threads, a count no other test uses, so
// it builds a new pool instead of reusing the parent's (whose workers do not
// exist after fork); alarm() turns a hang into a failure.
TEST(Threads, ThreadCreationFailureIsAnError) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    alarm(30);
    int status = 3;
    if (getuid() != 0 || (setgid(65534) == 0 && setuid(65534) == 0)) {
      const rlimit one{1, 1};
      setrlimit(RLIMIT_NPROC, &one);
      std::mt19937 rng(1);
      const auto q = cast<float>(random_tensor({1, 4, 600, 16}, rng));
      try {
        set_num_threads(37);
        attention(q.view(), q.view(), q.view());
        status = 1;  // no error although threads cannot start
      } catch (const RuntimeError& e) {
        status = std::string(e.what()).find("cannot start 37 threads") != std::string::npos ? 0 : 2;
      } catch (...) {
        status = 2;
      }
    }
    _exit(status);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died (signal " << WTERMSIG(status) << ")";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: no error, 2: another error, 3: could not drop root";
}

// Runs check() in a forked child, which exits 0 when it returns true, 1
// when false, 2 on an exception; alarm() turns a hang into a failure. The
// child's status as gtest sees it.
template <class F>
::testing::AssertionResult in_child(F check) {
  const pid_t child = fork();
  if (child < 0) return ::testing::AssertionFailure() << "fork failed";
  if (child == 0) {
    alarm(20);
    int status = 2;
    try {
      status = check() ? 0 : 1;
    } catch (...) {
    }
    _exit(status);
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child) return ::testing::AssertionFailure() << "waitpid failed";
  if (WIFSIGNALED(status))
    return ::testing::AssertionFailure() << "the child died of signal " << WTERMSIG(status)
                                         << (WTERMSIG(status) == SIGALRM ? " (it hung)" : "");
  if (WEXITSTATUS(status) != 0)
    return ::testing::AssertionFailure() << "the child exited " << WEXITSTATUS(status)
                                         << (WEXITSTATUS(status) == 1 ? " (a wrong result)" : " (an exception)");
  return ::testing::AssertionSuccess();
}

// Under qemu-user a child of a process that has run threads dies of the
// emulator's own assertion (cpu == current_cpu in accel/tcg/cpu-exec.c,
// qemu 7.2) when it starts threads of its own: what the Fork tests check is
// the emulator there. They run natively, in every x86 build of make test.
constexpr const char* kQemuCannotFork = "qemu-user's children of a threaded process cannot start threads";

// fork() copies only the calling thread: a child inherits the parent's pool
// without its workers. Its calls must run (they waited for the missing
// workers forever), bitwise as the parent's, at the same thread count, at
// another (the old pool was joined, which hung too), and in a grandchild.
TEST(Fork, AChildRunsAttentionOnThreadsOfItsOwn) {
  if (test::emulated()) GTEST_SKIP() << kQemuCannotFork;
  RestoreThreads restore;
  set_num_threads(2);
  const Problem p({1, 4, 300, 32}, {1, 4, 300, 32}, {1, 4, 300, 32}, 5);
  const Tensor<float> before = p.run32(causal());  // the pool has started
  const auto same_again = [&] { return same_bits(p.run32(causal()), before); };
  EXPECT_TRUE(in_child(same_again));
  EXPECT_TRUE(in_child([&] {
    set_num_threads(3);
    return same_again();
  }));
  EXPECT_TRUE(in_child([&] { return same_again() && in_child(same_again); }));
  EXPECT_TRUE(same_again());  // the parent's pool still works
}

// A fork while another thread is inside a call (the pool busy, its lock
// held): the child still runs its own calls.
TEST(Fork, WhileAnotherThreadIsInsideACall) {
  if (test::emulated()) GTEST_SKIP() << kQemuCannotFork;
  RestoreThreads restore;
  set_num_threads(2);
  const Problem p({1, 4, 300, 32}, {1, 4, 300, 32}, {1, 4, 300, 32}, 6);
  const Tensor<float> expected = p.run32(causal());
  std::atomic<bool> done{false};
  std::atomic<int> calls{0};
  std::thread busy([&] {
    while (!done) p.run32(causal()), ++calls;
  });
  while (calls == 0) std::this_thread::yield();
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(in_child([&] { return same_bits(p.run32(causal()), expected); })) << i;
  done = true;
  busy.join();
}

}  // namespace
}  // namespace attn
