// Ring attention: at step t rank r holds the K/V block of rank r - t,
// computes its queries against it while passing it on to rank r + 1 and
// receiving the next from rank r - 1, and merges the partial results in
// step order (so a given world size and layout always sums alike).
#include <chrono>

#include "problem.hpp"
#include "sequence.hpp"

namespace attn::dist {

namespace {

template <class KV>
struct Block {
  Tensor<KV> k, v;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

template <class T, class KV>
  requires AttentionTypes<T, KV>
DistStats ring_attention(TensorView<const T> q, TensorView<const KV> k, TensorView<const KV> v,
                         TensorView<T> out, MPI_Comm comm, const AttentionOptions& options, Layout layout,
                         TensorView<T> lse) {
  constexpr const char* kName = "ring_attention";
  const Communicator c = communicator(comm, kName);
  check_collectively(c, kName, [&] {
    check_local(q, k, v, out, lse, options);
    if (!options.alibi_slopes.empty())
      throw ValueError(
          "ALiBi is not supported (its bias needs each query's global position within every block); "
          "ulysses_attention, which sees whole sequences, supports it");
  });
  check_agreement(c, kName, describe(q, k, v, lse, options, layout));
  const std::vector<int64_t> q_rows = all_gather(c, q.dim(-2)), k_rows = all_gather(c, k.dim(-2));
  try {
    check_layout(layout, q_rows, "q");
    check_layout(layout, k_rows, "k");
  } catch (const ValueError& e) {
    throw ValueError(std::string(kName) + ": " + e.what());
  }
  int64_t n_q = 0, n_k = 0;
  for (size_t r = 0; r < q_rows.size(); ++r) n_q += q_rows[r], n_k += k_rows[r];

  // Which rank's queries see which rank's keys: every rank knows it for all,
  // so a block goes only as far along the ring as some rank still needs it.
  const int world = c.size, rank = c.rank;
  auto calls = [&](int r, int s) {
    return block_calls(rank_segments(layout, q_rows, r), rank_segments(layout, k_rows, s), n_q, n_k,
                       options.causal, options.window);
  };
  std::vector<char> needs(static_cast<size_t>(world * world));
  for (int r = 0; r < world; ++r)
    for (int s = 0; s < world; ++s) needs[static_cast<size_t>(r * world + s)] = !calls(r, s).empty();
  // Whether rank r must receive, at step t, the block of rank r - t: if it
  // or a rank after it in the rest of the ring needs it.
  auto receives = [&](int r, int t) {
    const int s = (r - t + world) % world;
    for (int u = 0; u < world - t; ++u)
      if (needs[static_cast<size_t>(((r + u) % world) * world + s)]) return true;
    return false;
  };

  DistStats stats;
  const int next = (rank + 1) % world, previous = (rank - 1 + world) % world;
  const int64_t heads = q.rank() >= 3 ? q.dim(-3) : 1;
  PartialResult result(out.shape(), heads);
  AttentionOptions block_options = options;
  block_options.sinks.clear();  // added once, after the last block
  Block<KV> current{contiguous(k), contiguous(v)};
  std::vector<MPI_Request> requests;
  for (int t = 0; t < world; ++t) {
    const int source = (rank - t + world) % world;
    Block<KV> incoming;
    if (t + 1 < world) {
      if (receives(rank, t + 1)) {
        const int64_t rows = k_rows[static_cast<size_t>((rank - t - 1 + world) % world)];
        incoming = {Tensor<KV>(with_rows(k.shape(), rows)), Tensor<KV>(with_rows(v.shape(), rows))};
        post_receive(c, incoming.k.data(), incoming.k.numel() * int64_t{sizeof(KV)}, previous, requests);
        post_receive(c, incoming.v.data(), incoming.v.numel() * int64_t{sizeof(KV)}, previous, requests);
      }
      if (receives(next, t + 1)) {
        const int64_t bytes = (current.k.numel() + current.v.numel()) * int64_t{sizeof(KV)};
        post_send(c, current.k.data(), current.k.numel() * int64_t{sizeof(KV)}, next, requests);
        post_send(c, current.v.data(), current.v.numel() * int64_t{sizeof(KV)}, next, requests);
        stats.blocks_sent += 1;
        stats.bytes_sent += bytes;
      }
    }
    if (needs[static_cast<size_t>(rank * world + source)]) {
      const auto start = std::chrono::steady_clock::now();
      const TensorView<const KV> k_block = current.k.view(), v_block = current.v.view();
      for (const BlockCall& call : calls(rank, source)) {
        Tensor<T> out_b(with_rows(out.shape(), call.q_length));
        Tensor<T> lse_b(Shape(out_b.shape().begin(), out_b.shape().end() - 1));
        AttentionExtras<T> extras;
        extras.lse = lse_b.view();
        block_options.causal = call.causal;
        block_options.window = call.window;
        attention<T, KV>(slice(q, -2, call.q_begin, call.q_length), slice(k_block, -2, call.k_begin, call.k_length),
                         slice(v_block, -2, call.k_begin, call.k_length), out_b.view(), extras, block_options);
        result.merge(out_b, lse_b, call.q_begin);
        stats.blocks_computed += 1;
      }
      stats.compute_seconds += seconds_since(start);
    }
    stats.wait_seconds += wait_all(requests);
    current = std::move(incoming);
  }
  result.add_sinks(options.sinks);
  result.write(out, lse);
  return stats;
}

#define ATTN_INSTANTIATE(T, KV)                                                                           \
  template DistStats ring_attention<T, KV>(TensorView<const T>, TensorView<const KV>, TensorView<const KV>, \
                                           TensorView<T>, MPI_Comm, const AttentionOptions&, Layout,       \
                                           TensorView<T>);
ATTN_DIST_FOR_EACH_TYPES(ATTN_INSTANTIATE)
#undef ATTN_INSTANTIATE

}  // namespace attn::dist
