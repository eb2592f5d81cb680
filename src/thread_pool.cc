#include "thread_pool.hpp"

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "attn/error.hpp"
#include "attn/threads.hpp"

namespace attn {
namespace detail {
namespace {

class ThreadPool {
 public:
  explicit ThreadPool(int threads) {
    for (int t = 1; t < threads; ++t) workers_.emplace_back([this] { work(); });
  }
  ~ThreadPool() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
  }
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Caller holds busy_ (one job at a time).
  void run(int64_t n, const std::function<void(int64_t)>& fn) {
    {
      std::lock_guard lock(mutex_);
      fn_ = &fn;
      n_ = n;
      next_.store(0);
      active_ = static_cast<int>(workers_.size());
      ++generation_;
    }
    wake_.notify_all();
    drain();
    std::unique_lock lock(mutex_);
    done_.wait(lock, [this] { return active_ == 0; });
    fn_ = nullptr;
  }

  std::mutex busy_;

 private:
  void drain() {
    for (int64_t i; (i = next_.fetch_add(1)) < n_;) (*fn_)(i);
  }
  void work() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      drain();
      std::lock_guard lock(mutex_);
      if (--active_ == 0) done_.notify_one();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  std::atomic<int64_t> next_{0};
  int active_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

int default_threads() {
  if (const char* env = std::getenv("ATTN_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n >= 1) return n;
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw ? static_cast<int>(hw) : 1;
}

std::mutex pool_mutex;
std::shared_ptr<ThreadPool> current_pool;
int requested_threads = 0;

std::shared_ptr<ThreadPool> pool() {
  std::lock_guard lock(pool_mutex);
  if (!requested_threads) requested_threads = default_threads();
  if (!current_pool || current_pool->size() != requested_threads)
    current_pool = std::make_shared<ThreadPool>(requested_threads);
  return current_pool;
}

}  // namespace

void parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  const auto serial = [&] {
    for (int64_t i = 0; i < n; ++i) fn(i);
  };
  if (n <= 1) return serial();
  const auto p = pool();  // kept alive for this call even if the count changes
  std::unique_lock busy(p->busy_, std::try_to_lock);
  if (p->size() == 1 || !busy) return serial();
  p->run(n, fn);
}

}  // namespace detail

int num_threads() {
  std::lock_guard lock(detail::pool_mutex);
  if (!detail::requested_threads) detail::requested_threads = detail::default_threads();
  return detail::requested_threads;
}

void set_num_threads(int n) {
  if (n < 1) throw ValueError("set_num_threads: n must be >= 1, got " + std::to_string(n));
  std::lock_guard lock(detail::pool_mutex);
  detail::requested_threads = n;
}

}  // namespace attn
