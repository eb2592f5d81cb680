// Internal: the run-time CPU check the x86 units (bf16_x86.cc, int8_x86.cc)
// share, before each asks for its own instructions.
#pragma once

#if defined(__x86_64__)
namespace attn::kernels {

// Whether the CPU runs AVX-512 F, BW and VL and the OS saves their state
// (GCC's and clang's checks include the latter).
inline bool HasAvx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
}

}  // namespace attn::kernels
#endif
