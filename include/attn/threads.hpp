// The number of threads attn's kernels use. Results never depend on it: work
// is split into items whose arithmetic is fixed, whatever thread runs them.
#pragma once

namespace attn {

// Default: the ATTN_NUM_THREADS environment variable, else all cores.
int num_threads();
// n >= 1; takes effect for the next call into the library.
void set_num_threads(int n);

}  // namespace attn
