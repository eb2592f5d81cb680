// A program that uses attn::dist as any project would, under mpirun: the
// installed headers and libraries only. Each rank holds two rows of a
// causal sequence of 2W; ring attention must give it the rows attention()
// gives on the whole sequence.
#include <attn/attn.hpp>
#include <attn/dist.hpp>
#include <mpi.h>

#include <cmath>
#include <cstdio>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const int64_t n = 2 * world, d = 4;
  attn::Tensor<float> x({n, d});
  for (int64_t i = 0; i < x.numel(); ++i) x[i] = static_cast<float>(std::sin(0.7 * static_cast<double>(i)));
  const attn::AttentionOptions options{.causal = attn::Causal::TopLeft};
  const attn::Tensor<float> whole = attn::attention(x.view(), x.view(), x.view(), options);
  attn::Tensor<float> mine({2, d}), out({2, d});
  for (int64_t i = 0; i < 2 * d; ++i) mine[i] = x[2 * rank * d + i];
  attn::dist::ring_attention<float, float>(mine.view(), mine.view(), mine.view(), out.view(), MPI_COMM_WORLD, options);
  int bad = 0;
  for (int64_t i = 0; i < 2 * d; ++i)
    if (std::fabs(out[i] - whole[2 * rank * d + i]) > 1e-6) bad = 1;
  int any = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0)
    std::printf(any ? "attn::dist: ring attention differs from attention()\n"
                    : "attn::dist: ring attention on %d ranks matches attention() on the whole sequence\n",
                world);
  MPI_Finalize();
  return any;
}
