// The number of threads attn's kernels use. Results never depend on it: work
// is split into items whose arithmetic is fixed, whatever thread runs them.
#pragma once

#include <cstdint>
#include <functional>

namespace attn {

// The largest thread count accepted: min(1024, max(64, 4 × hardware
// threads)). More threads than that only cost memory and scheduling, and a
// count in the thousands can exhaust the system's process slots.
int max_num_threads();
// Default: the ATTN_NUM_THREADS environment variable, else all cores. A
// variable that is not an integer in [1, max_num_threads()] is a ValueError
// (here and from the first call that runs a kernel).
int num_threads();
// 1 <= n <= max_num_threads(), else ValueError; takes effect for the next call
// into the library. If the system cannot start that many threads, that call
// throws attn::RuntimeError and the count stays as requested.
void set_num_threads(int64_t n);

// Runs fn(item) for every item in [0, n) on attn's threads (the calling
// thread included), handing items out in order, and returns when all are
// done: for work made of coarse items, such as whole models trained at once
// (the kernel calls inside an item then run on that item's thread). A call
// made while the threads are busy (inside an item, or beside another
// thread's call) runs its items on the calling thread. If items throw, every
// item still runs, and the exception of the lowest-numbered one that threw
// is rethrown. n < 0 is a ValueError.
void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);

}  // namespace attn
