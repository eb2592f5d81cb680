// GoogleTest under mpirun: every rank runs every test; a test that fails on
// any rank fails mpirun. Tests use EXPECT (never ASSERT) around collective
// calls, so that no rank leaves a test while others wait in one.
#include <gtest/gtest.h>
#include <mpi.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ATTN_DIST_LEAK_CHECK 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define ATTN_DIST_LEAK_CHECK 1
#endif
#ifdef ATTN_DIST_LEAK_CHECK
#include <sanitizer/lsan_interface.h>
#endif

int main(int argc, char** argv) {
  // Under ASan, the leak check covers the tests, not Open MPI: its
  // allocations in MPI_Init are left out, and the check runs before
  // MPI_Finalize, which drops references to what its components (unloaded
  // by then, so no stack names them) still hold. What is left are Open MPI's
  // own threads (tests/dist/lsan.supp), whose stacks reach its libraries
  // within a few frames: the Makefile unwinds no further (malloc_context_size).
#ifdef ATTN_DIST_LEAK_CHECK
  __lsan_disable();
#endif
  MPI_Init(&argc, &argv);
#ifdef ATTN_DIST_LEAK_CHECK
  __lsan_enable();
#endif
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // Rank 0 prints the run; the others print only their failures.
  if (rank != 0) GTEST_FLAG_SET(brief, true);
  const int failed = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
#ifdef ATTN_DIST_LEAK_CHECK
  __lsan_do_leak_check();  // a leak ends the rank here, and mpirun fails
#endif
  MPI_Finalize();
  return any;
}
