// Internal: a small persistent thread pool for the kernels.
#pragma once

#include <cstdint>
#include <functional>

namespace attn::detail {

// Runs fn(item) for every item in [0, n) on the library's threads (the caller
// included), handing out items in order from a shared counter. Returns when
// all are done. A call made while the pool is busy (another thread's call, or
// a nested call) runs its items on the calling thread instead: correct,
// deterministic, just not parallel.
void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);

}  // namespace attn::detail
