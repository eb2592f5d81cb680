// GoogleTest under mpirun: every rank runs every test; a test that fails on
// any rank fails mpirun. Tests use EXPECT (never ASSERT) around collective
// calls, so that no rank leaves a test while others wait in one.
#include <gtest/gtest.h>
#include <mpi.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // Rank 0 prints the run; the others print only their failures.
  if (rank != 0) GTEST_FLAG_SET(brief, true);
  const int failed = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any;
}
