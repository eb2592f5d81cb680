// `attn bench ring`, under mpirun -np W: context-parallel attention timed
// per rank (computing, and waiting: communication not hidden under the
// computation, or a slower neighbour), the communication its messages take
// alone (from MPI's latency and bandwidth measured here), and the speed
// against one process on the whole problem. docs/scaling.md models these.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attn/attention.hpp"
#include "attn/dist.hpp"
#include "attn/error.hpp"
#include "attn/threads.hpp"
#include "cli/bench_common.hpp"
#include "cli/commands.hpp"

namespace attn::cli {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

struct MpiSession {
  MpiSession() {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  }
  ~MpiSession() { MPI_Finalize(); }
};

// One-way time of a message of `bytes` between ranks 0 and 1 (ping-pong,
// median of `trips` round trips halved); 0 on one rank.
double one_way_ms(int rank, int world, int64_t bytes, int trips) {
  if (world < 2) return 0;
  std::vector<char> buffer(static_cast<size_t>(std::max<int64_t>(bytes, 1)));
  std::vector<double> times;
  for (int i = 0; i < trips; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = Clock::now();
    const int count = static_cast<int>(bytes);
    if (rank == 0) {
      MPI_Send(buffer.data(), count, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
      MPI_Recv(buffer.data(), count, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (rank == 1) {
      MPI_Recv(buffer.data(), count, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(buffer.data(), count, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
    }
    times.push_back(ms_since(t0) / 2);
  }
  double t = median(times);
  MPI_Bcast(&t, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  return t;
}

}  // namespace

int run_bench_ring(const RingBenchArgs& a) {
  const MpiSession mpi;
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  set_num_threads(a.threads);
  const dist::Layout layout = dist::parse_layout(a.layout);
  const int64_t parts = layout == dist::Layout::Zigzag ? 2 * world : world;
  if (a.n % parts != 0)
    throw ValueError("bench ring: --n " + std::to_string(a.n) + " must be divisible by " + std::to_string(parts) +
                     (layout == dist::Layout::Zigzag ? " (2W: the zigzag layout's chunks)" : " (W: equal slices)"));
  const int64_t n_local = a.n / world, hkv = a.kv_heads > 0 ? a.kv_heads : a.heads;
  AttentionOptions options;
  if (a.causal) options.causal = Causal::TopLeft;
  const auto seed = static_cast<uint32_t>(3 * rank);
  const Tensor<float> q = random_tensor({a.heads, n_local, a.head_dim}, seed + 1);
  const Tensor<float> k = random_tensor({hkv, n_local, a.head_dim}, seed + 2);
  const Tensor<float> v = random_tensor({hkv, n_local, a.head_dim}, seed + 3);
  Tensor<float> out({a.heads, n_local, a.head_dim});
  const bool ring = a.strategy == "ring";
  auto call = [&] {
    return ring ? dist::ring_attention<float, float>(q.view(), k.view(), v.view(), out.view(), MPI_COMM_WORLD,
                                                     options, layout)
                : dist::ulysses_attention<float, float>(q.view(), k.view(), v.view(), out.view(), MPI_COMM_WORLD,
                                                        options, layout);
  };
  call();  // warm-up: threads started, pages touched
  std::vector<double> wall, compute, wait;
  dist::DistStats stats;
  for (int i = 0; i < a.repeats; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = Clock::now();
    stats = call();
    double mine = ms_since(t0), slowest = 0;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    wall.push_back(slowest);
    compute.push_back(stats.compute_seconds * 1e3);
    wait.push_back(stats.wait_seconds * 1e3);
  }
  // One process, the whole problem, the same threads: rank 0 alone.
  double one_ms = 0;
  if (rank == 0) {
    const Tensor<float> q1 = random_tensor({a.heads, a.n, a.head_dim}, 1);
    const Tensor<float> k1 = random_tensor({hkv, a.n, a.head_dim}, 2), v1 = random_tensor({hkv, a.n, a.head_dim}, 3);
    Tensor<float> out1({a.heads, a.n, a.head_dim});
    std::vector<double> times;
    for (int i = 0; i <= a.repeats; ++i) {
      const auto t0 = Clock::now();
      AttentionPlan<float>(q1.view(), k1.view(), v1.view(), options).run(out1.view());
      if (i > 0) times.push_back(ms_since(t0));  // the first: warm-up
    }
    one_ms = median(times);
  }
  MPI_Bcast(&one_ms, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  // MPI here: latency (8 bytes) and bandwidth (one K/V block's bytes).
  const int64_t block_bytes = (k.numel() + v.numel()) * int64_t{sizeof(float)};
  const double latency_ms = one_way_ms(rank, world, 8, 50);
  const double block_ms = one_way_ms(rank, world, block_bytes, 10);
  const double bandwidth = block_ms > latency_ms ? double(block_bytes) / ((block_ms - latency_ms) * 1e-3) : 0;

  // Per rank: what it computed and waited, and what its messages take alone.
  const double comm_ms = world < 2 || bandwidth == 0
                             ? 0
                             : double(stats.blocks_sent) * latency_ms + double(stats.bytes_sent) / bandwidth * 1e3;
  const double row[] = {median(compute), median(wait), comm_ms, double(stats.blocks_computed),
                        double(stats.blocks_sent), double(stats.bytes_sent)};
  constexpr int kRow = sizeof row / sizeof row[0];
  std::vector<double> rows(static_cast<size_t>(kRow * world));
  MPI_Gather(row, kRow, MPI_DOUBLE, rows.data(), kRow, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (rank != 0) return 0;

  const double ring_ms = median(wall), speedup = one_ms / ring_ms;
  nlohmann::ordered_json j{{"kind", "ring"}, {"strategy", a.strategy}, {"layout", a.layout}, {"causal", a.causal},
                           {"world", world}, {"n", a.n}, {"heads", a.heads}, {"kv_heads", hkv},
                           {"head_dim", a.head_dim}, {"threads_per_rank", a.threads},
                           {"median_ms", rounded(ring_ms, 4)}, {"one_process_ms", rounded(one_ms, 4)},
                           {"speedup", rounded(speedup, 4)}, {"efficiency", rounded(speedup / world, 4)},
                           {"mpi_latency_us", rounded(latency_ms * 1e3, 3)},
                           {"mpi_bandwidth_GB_per_s", rounded(bandwidth * 1e-9, 3)}, {"block_bytes", block_bytes}};
  std::string text;
  char buf[300];
  std::snprintf(buf, sizeof buf,
                "%s attention, %s layout%s: n = %lld over %d ranks, %lld heads (%lld K/V) x %lld, %d thread(s) "
                "per rank\n  %.3f ms (median of %d); one process on the whole problem: %.3f ms -> speedup %.2fx, "
                "efficiency %.0f%%\n  MPI here: latency %.1f us, bandwidth %.2f GB/s (a block: %lld bytes)\n",
                a.strategy.c_str(), a.layout.c_str(), a.causal ? ", causal" : "", (long long)a.n, world,
                (long long)a.heads, (long long)hkv, (long long)a.head_dim, a.threads, ring_ms, a.repeats, one_ms,
                speedup, 100 * speedup / world, latency_ms * 1e3, bandwidth * 1e-9, (long long)block_bytes);
  text += buf;
  text += "  rank  compute_ms  wait_ms  comm_ms  hidden  blocks  sent  bytes_sent\n";
  nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
  for (int r = 0; r < world; ++r) {
    const double* x = rows.data() + r * kRow;
    // Communication hidden under computation (the ring's; Ulysses' blocking
    // all-to-alls hide none): what its messages take alone, less the waiting
    // that remained (which also holds any imbalance between ranks).
    const double hidden = x[2] > 0 ? std::clamp(1 - x[1] / x[2], 0.0, 1.0) : 1.0;
    nlohmann::ordered_json rank{{"rank", r}, {"compute_ms", rounded(x[0], 4)}, {"wait_ms", rounded(x[1], 4)},
                                {"comm_ms", rounded(x[2], 4)}, {"hidden", nullptr},
                                {"blocks_computed", int64_t(x[3])}, {"blocks_sent", int64_t(x[4])},
                                {"bytes_sent", int64_t(x[5])}};
    char share[16] = "-";
    if (ring) {
      rank["hidden"] = rounded(hidden, 4);
      std::snprintf(share, sizeof share, "%.0f%%", 100 * hidden);
    }
    ranks.push_back(rank);
    std::snprintf(buf, sizeof buf, "  %4d  %10.3f  %7.3f  %7.3f  %6s  %6lld  %4lld  %10lld\n", r, x[0], x[1], x[2],
                  share, (long long)x[3], (long long)x[4], (long long)x[5]);
    text += buf;
  }
  j["ranks"] = ranks;
  std::fputs(a.json ? (j.dump() + "\n").c_str() : text.c_str(), stdout);
  return 0;
}

}  // namespace attn::cli
