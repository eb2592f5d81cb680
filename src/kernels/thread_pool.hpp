// Internal: a small persistent thread pool for the kernels.
#pragma once

#include <cstdint>
#include <functional>

namespace attn::kernels {

// Runs fn(item) for every item in [0, n) on the library's threads (the caller
// included), handing out items in order from a shared counter. Returns when
// all are done. A call made while the pool is busy (another thread's call, or
// a nested call) runs its items on the calling thread instead: correct,
// deterministic, just not parallel.
//
// work: the call's arithmetic in floating-point operations, estimated.
// Below kMinParallelWork the items run on the calling thread: handing them to
// the pool costs microseconds (tens when its threads sleep), the time of
// about 1e6 operations on one core; the training steps of `attn experiment`
// (3 to 8 tokens) ran slower on 2 threads than on 1 before this.
inline constexpr double kMinParallelWork = 1e6;
void parallel_for(int64_t n, const std::function<void(int64_t)>& fn, double work = kMinParallelWork);

}  // namespace attn::kernels
