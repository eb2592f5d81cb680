#include "kernels/thread_pool.hpp"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <hwy/cache_control.h>

#include "attn/error.hpp"
#include "attn/threads.hpp"

namespace attn {
namespace kernels {
namespace {

// Whether this thread is running a pool's items: a parallel_for inside one
// runs on this thread (the pool is busy with the call around it; asking its
// lock again from the thread that holds it would be undefined).
thread_local bool running_items = false;

class ThreadPool {
 public:
  // Throws RuntimeError, with no thread left behind, when the system cannot
  // start them all (a std::thread still joinable at destruction would call
  // std::terminate).
  explicit ThreadPool(int threads) {
    workers_.reserve(static_cast<size_t>(threads));
    try {
      for (int t = 1; t < threads; ++t) workers_.emplace_back([this] { work(); });
    } catch (const std::system_error& e) {
      const size_t started = workers_.size() + 1;
      stop();
      throw RuntimeError("cannot start " + std::to_string(threads) + " threads (the system refused after " +
                         std::to_string(started) + ": " + e.what() +
                         "); ask for fewer with set_num_threads or ATTN_NUM_THREADS");
    }
  }
  ~ThreadPool() { stop(); }
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Caller holds busy_ (one job at a time).
  void run(int64_t n, const std::function<void(int64_t)>& fn) {
    {
      std::lock_guard lock(mutex_);
      fn_ = &fn;
      n_ = n;
      next_.store(0);
      active_.store(static_cast<int>(workers_.size()));
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    drain();
    if (!spin_until([this] { return active_.load(std::memory_order_acquire) == 0; })) {
      std::unique_lock lock(mutex_);
      done_.wait(lock, [this] { return active_.load(std::memory_order_acquire) == 0; });
    }
    fn_ = nullptr;
  }

  std::mutex busy_;

 private:
  // Waking a thread blocked on a condition variable takes tens of
  // microseconds, as long as a short call's whole work, and the kernels hand
  // out work several times per call, and calls come in loops. So both sides
  // first poll for a while, as OpenMP runtimes do, and only then block.
  template <class Ready>
  static bool spin_until(const Ready& ready) {
    using Clock = std::chrono::steady_clock;
    const auto until = Clock::now() + std::chrono::microseconds(200);
    for (;;) {
      if (ready()) return true;
      hwy::Pause();
      if (Clock::now() > until) return false;
    }
  }
  void stop() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
  }
  void drain() {
    struct Running {
      Running() { running_items = true; }
      ~Running() { running_items = false; }
    } running;
    for (int64_t i; (i = next_.fetch_add(1)) < n_;) (*fn_)(i);
  }
  void work() {
    uint64_t seen = 0;
    const auto posted = [&] { return generation_.load(std::memory_order_acquire) != seen; };
    for (;;) {
      if (!spin_until(posted)) {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || posted(); });
      }
      {
        std::lock_guard lock(mutex_);
        if (stop_) return;
      }
      seen = generation_.load(std::memory_order_acquire);
      drain();
      if (active_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard lock(mutex_);  // so that run() cannot miss the notification
        done_.notify_one();
      }
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  std::atomic<int64_t> next_{0};
  std::atomic<int> active_{0};
  std::atomic<uint64_t> generation_{0};
  bool stop_ = false;
};

int hardware_threads() {
  const unsigned hw = std::thread::hardware_concurrency();
  return hw ? static_cast<int>(std::min(hw, 1u << 20)) : 1;
}

// ATTN_NUM_THREADS when set (the whole value an integer in range), else all
// cores.
int default_threads() {
  const char* env = std::getenv("ATTN_NUM_THREADS");
  if (!env || !*env) return std::min(hardware_threads(), max_num_threads());
  const std::string text(env);
  long long n = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || end != text.data() + text.size() || n < 1 || n > max_num_threads())
    throw ValueError("ATTN_NUM_THREADS must be an integer in [1, max_num_threads() = " +
                     std::to_string(max_num_threads()) + "], got '" + text.substr(0, 40) + "'");
  return static_cast<int>(n);
}

std::mutex pool_mutex;
std::shared_ptr<ThreadPool> current_pool;
int requested_threads = 0;

// fork() copies only the thread that calls it. A child of a process that
// ran attn inherits a pool whose workers do not exist in it: a job would
// wait for them forever, and destroying the pool would join them (and its
// condition variables may hold waiters that are gone). So the child lets go
// of that pool without destroying it, and its first parallel call starts a
// pool of its own. pool_mutex is held across the fork, so that the child
// never inherits it locked by a thread it does not have.
void lock_before_fork() { pool_mutex.lock(); }
void unlock_in_parent() { pool_mutex.unlock(); }
void forget_pool_in_child() {
  if (current_pool) {
    // Reachable (not a leak to LeakSanitizer) and never destroyed.
    static auto* const abandoned = new std::vector<std::shared_ptr<ThreadPool>>;
    abandoned->push_back(std::move(current_pool));
  }
  pool_mutex.unlock();
}

std::shared_ptr<ThreadPool> pool() {
  static const int fork_handlers = pthread_atfork(lock_before_fork, unlock_in_parent, forget_pool_in_child);
  if (fork_handlers != 0)
    throw RuntimeError("cannot register attn's fork handlers (pthread_atfork: " + std::to_string(fork_handlers) +
                       ")");
  std::lock_guard lock(pool_mutex);
  if (!requested_threads) requested_threads = default_threads();
  if (!current_pool || current_pool->size() != requested_threads)
    current_pool = std::make_shared<ThreadPool>(requested_threads);
  return current_pool;
}

}  // namespace

void parallel_for(int64_t n, const std::function<void(int64_t)>& fn, double work) {
  const auto serial = [&] {
    for (int64_t i = 0; i < n; ++i) fn(i);
  };
  if (n <= 1 || work < kMinParallelWork || running_items) return serial();
  const auto p = pool();  // kept alive for this call even if the count changes
  if (p->size() == 1) return serial();
  std::unique_lock busy(p->busy_, std::try_to_lock);
  if (!busy) return serial();
  p->run(n, fn);
}

}  // namespace kernels

void parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n < 0) throw ValueError("parallel_for: n must be >= 0, got " + std::to_string(n));
  std::mutex first_error_mutex;
  int64_t first_failed = n;
  std::exception_ptr first_error;
  kernels::parallel_for(
      n,
      [&](int64_t item) {
        try {
          fn(item);
        } catch (...) {
          std::lock_guard lock(first_error_mutex);
          if (item < first_failed) {
            first_failed = item;
            first_error = std::current_exception();
          }
        }
      },
      std::numeric_limits<double>::infinity());  // items are coarse: always worth a thread
  if (first_error) std::rethrow_exception(first_error);
}

int max_num_threads() { return std::min(1024, std::max(64, 4 * kernels::hardware_threads())); }

int num_threads() {
  std::lock_guard lock(kernels::pool_mutex);
  if (!kernels::requested_threads) kernels::requested_threads = kernels::default_threads();
  return kernels::requested_threads;
}

void set_num_threads(int64_t n) {
  if (n < 1 || n > max_num_threads())
    throw ValueError("set_num_threads: n must be in [1, max_num_threads() = " +
                     std::to_string(max_num_threads()) + "], got " + std::to_string(n));
  std::lock_guard lock(kernels::pool_mutex);
  kernels::requested_threads = static_cast<int>(n);
}

}  // namespace attn
