// Ring attention: at step t rank r holds the K/V block of rank r - t,
// computes its queries against it while passing it on to rank r + 1 and
// receiving the next from rank r - 1, and merges the partial results in
// step order (so a given world size and layout always sums alike). The
// backward sends each block's dK, dV around with it and, from the last rank
// that needs the block, home.
#include <algorithm>
#include <chrono>

#include "problem.hpp"
#include "sequence.hpp"

namespace attn::dist {

namespace {

constexpr int kRingTag = 0x5a17, kHomeTag = 0x5a18;

// Who computes what, and how far each block travels: the same on every rank.
class RingSchedule {
 public:
  RingSchedule(const Communicator& c, const char* name, Layout layout, int64_t q_local, int64_t k_local,
               const AttentionOptions& options)
      : world(c.size),
        rank(c.rank),
        next((c.rank + 1) % c.size),
        previous((c.rank - 1 + c.size) % c.size),
        layout_(layout),
        q_rows_(all_gather(c, q_local)),
        k_rows_(all_gather(c, k_local)),
        causal_(options.causal),
        window_(options.window),
        join_(options.alibi_slopes.empty()) {
    try {
      check_layout(layout, q_rows_, "q");
      check_layout(layout, k_rows_, "k");
    } catch (const ValueError& e) {
      throw ValueError(std::string(name) + ": " + e.what());
    }
    for (size_t r = 0; r < q_rows_.size(); ++r) n_q_ += q_rows_[r], n_k_ += k_rows_[r];
    needs_.resize(static_cast<size_t>(world) * static_cast<size_t>(world));
    for (int r = 0; r < world; ++r)
      for (int s = 0; s < world; ++s)
        needs_[static_cast<size_t>(r) * static_cast<size_t>(world) + static_cast<size_t>(s)] = !calls(r, s).empty();
  }

  // Rank r's queries against rank s's keys; none when wholly masked.
  std::vector<BlockCall> calls(int r, int s) const {
    return block_calls(rank_segments(layout_, q_rows_, r), rank_segments(layout_, k_rows_, s), n_q_, n_k_, causal_,
                       window_, join_);
  }
  // Per query head, what ALiBi's bias adds to a call's log-sum-exp in the
  // global problem (empty without ALiBi; calls are not joined with it).
  std::vector<double> alibi_lse_shift(const BlockCall& call, const std::vector<double>& slopes) const {
    std::vector<double> shift;
    const double distance = slopes.empty() ? 0 : position_shift(call, causal_, n_q_, n_k_);
    for (double slope : slopes) shift.push_back(-slope * distance);
    return shift;
  }
  bool needs(int r, int s) const { return needs_[static_cast<size_t>(r) * static_cast<size_t>(world) + static_cast<size_t>(s)]; }
  // Whether rank r receives, at step t, the block of rank r - t: if it or a
  // rank after it in the rest of the ring needs it.
  bool receives(int r, int t) const {
    const int s = (r - t + world) % world;
    for (int u = 0; u < world - t; ++u)
      if (needs((r + u) % world, s)) return true;
    return false;
  }
  // The step at which rank r holds block s (r - s around the ring) and
  // whether it holds it: its own, or received.
  int step_of(int r, int s) const { return (r - s + world) % world; }
  bool holds(int r, int s) const { return r == s || receives(r, step_of(r, s)); }
  // Whether rank r passes block s on to the next rank.
  bool passes_on(int r, int s) const {
    const int t = step_of(r, s);
    return holds(r, s) && t + 1 < world && receives((r + 1) % world, t + 1);
  }
  int64_t k_rows(int s) const { return k_rows_[static_cast<size_t>(s)]; }

  const int world, rank, next, previous;

 private:
  Layout layout_;
  std::vector<int64_t> q_rows_, k_rows_;
  int64_t n_q_ = 0, n_k_ = 0;
  Causal causal_;
  Window window_;
  bool join_;
  std::vector<char> needs_;
};

// Lets MPI move the messages of these requests (completed ones become
// MPI_REQUEST_NULL, which a later wait skips).
void progress(std::vector<MPI_Request>& requests) {
  int done = 0;
  if (!requests.empty()) MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE);
}

// The call in pieces of its query rows, f on each, progress between them:
// MPI moves a large message only inside its calls (the handshake and copy of
// its rendezvous protocol), so a step's transfers would otherwise wait for
// the step's computation to end. Rows are independent, so the pieces give
// the call's result (the same for a given world size, as the pieces are).
template <class F, class P>
void in_pieces(const BlockCall& call, P progress_all, F f) {
  constexpr int64_t kRowsPerPiece = 64, kMaxPieces = 8;
  const int64_t pieces = std::clamp<int64_t>(call.q_length / kRowsPerPiece, 1, kMaxPieces);
  for (int64_t p = 0; p < pieces; ++p) {
    const int64_t begin = call.q_length * p / pieces, end = call.q_length * (p + 1) / pieces;
    BlockCall piece = call;
    piece.q_begin += begin;
    piece.q_global += begin;
    piece.q_length = end - begin;
    // Key j is allowed for row i iff j <= i + offset: rows counted from the piece.
    if (call.causal.masks()) piece.causal = Causal::offset(call.causal.offset_value() + begin);
    f(piece);
    progress_all();
  }
}

template <class E>
void send(const Communicator& c, const Tensor<E>& t, int peer, int tag, std::vector<MPI_Request>& requests,
          DistStats& stats) {
  post_send(c, t.data(), t.numel() * int64_t{sizeof(E)}, peer, tag, requests);
  stats.bytes_sent += t.numel() * int64_t{sizeof(E)};
}

template <class E>
void receive(const Communicator& c, Tensor<E>& t, const Shape& shape, int peer, int tag,
             std::vector<MPI_Request>& requests) {
  t = Tensor<E>(shape);
  post_receive(c, t.data(), t.numel() * int64_t{sizeof(E)}, peer, tag, requests);
}

// The saved log-sum-exp in a call's units: less ALiBi's shift per head
// (RingSchedule::alibi_lse_shift), rounded once from double.
template <class T>
Tensor<T> without_shift(TensorView<const T> lse, const std::vector<double>& shift) {
  Tensor<T> t = contiguous(lse);
  const int64_t length = t.dim(-1), heads = static_cast<int64_t>(shift.size());
  for (int64_t g = 0; length && g < t.numel() / length; ++g)
    for (int64_t i = 0; i < length; ++i)
      t[g * length + i] = static_cast<T>(double{t[g * length + i]} - shift[static_cast<size_t>(g % heads)]);
  return t;
}

// dst[rows of axis -2 from row0] += src, both contiguous, src's rows fewer.
template <class A, class B>
void add_rows(Tensor<A>& dst, const Tensor<B>& src, int64_t row0) {
  const int64_t n = dst.dim(-2), m = src.dim(-2), e = dst.dim(-1);
  const int64_t groups = m > 0 && e > 0 ? src.numel() / (m * e) : 0;
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t i = 0; i < m * e; ++i) dst[(g * n + row0) * e + i] += src[g * m * e + i];
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
  });
  check_agreement(c, kName, describe(q, k, v, lse, options, layout));
  const RingSchedule ring(c, kName, layout, q.dim(-2), k.dim(-2), options);
  return or_abort(c, kName, [&] {
  DistStats stats;
  PartialResult result(out.shape(), q.rank() >= 3 ? q.dim(-3) : 1);
  AttentionOptions block_options = options;
  block_options.sinks.clear();  // added once, after the last block
  Tensor<KV> k_block = contiguous(k), v_block = contiguous(v);
  std::vector<MPI_Request> requests;
  for (int t = 0; t < ring.world; ++t) {
    const int source = (ring.rank - t + ring.world) % ring.world;
    Tensor<KV> k_next, v_next;
    if (t + 1 < ring.world && ring.receives(ring.rank, t + 1)) {
      const int64_t rows = ring.k_rows((source - 1 + ring.world) % ring.world);
      receive(c, k_next, with_rows(k.shape(), rows), ring.previous, kRingTag, requests);
      receive(c, v_next, with_rows(v.shape(), rows), ring.previous, kRingTag, requests);
    }
    if (ring.passes_on(ring.rank, source)) {
      send(c, k_block, ring.next, kRingTag, requests, stats);
      send(c, v_block, ring.next, kRingTag, requests, stats);
      stats.blocks_sent += 1;
    }
    if (ring.needs(ring.rank, source)) {
      const auto start = std::chrono::steady_clock::now();
      for (const BlockCall& whole : ring.calls(ring.rank, source)) {
        in_pieces(whole, [&] { progress(requests); }, [&](const BlockCall& call) {
          Tensor<T> out_b(with_rows(out.shape(), call.q_length));
          Tensor<T> lse_b(Shape(out_b.shape().begin(), out_b.shape().end() - 1));
          AttentionExtras<T> extras;
          extras.lse = lse_b.view();
          block_options.causal = call.causal;
          block_options.window = call.window;
          AttentionPlan<T, KV>(slice(q, -2, call.q_begin, call.q_length),
                               slice(k_block.view(), -2, call.k_begin, call.k_length),
                               slice(v_block.view(), -2, call.k_begin, call.k_length), block_options)
              .run(out_b.view(), extras);
          result.merge(out_b, lse_b, call.q_begin, ring.alibi_lse_shift(call, options.alibi_slopes));
        });
        stats.blocks_computed += 1;
      }
      stats.compute_seconds += seconds_since(start);
    }
    stats.wait_seconds += wait_all(requests);
    k_block = std::move(k_next), v_block = std::move(v_next);
  }
  result.add_sinks(options.sinks);
  result.write(out, lse);
  return stats;
  });
}

template <class T>
  requires AttentionTypes<T, T>
DistStats ring_attention_backward(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                                  TensorView<const T> dout, TensorView<const T> out, TensorView<const T> lse,
                                  TensorView<T> dq, TensorView<T> dk, TensorView<T> dv, MPI_Comm comm,
                                  const AttentionOptions& options, Layout layout, TensorView<T> dsinks) {
  constexpr const char* kName = "ring_attention_backward";
  const Communicator c = communicator(comm, kName);
  check_collectively(c, kName, [&] {
    const AttentionPlan<T, T> plan(q, k, v, options);
    if (options.precision != Precision::Float32)
      throw ValueError("the backward computes in float32: precision must be f32, got " +
                       precision_name(options.precision));
    auto expect = [](const char* name, const Shape& shape, const char* like, const Shape& want) {
      if (shape != want)
        throw ValueError(std::string(name) + " has shape " + shape_str(shape) + ", expected " + like + "'s " +
                         shape_str(want));
    };
    expect("dout", dout.shape(), "the output", plan.output_shape());
    expect("out", out.shape(), "the output", plan.output_shape());
    expect("lse", lse.shape(), "the log-sum-exp", plan.lse_shape());
    expect("dq", dq.shape(), "q", q.shape());
    expect("dk", dk.shape(), "k", k.shape());
    expect("dv", dv.shape(), "v", v.shape());
    if (!dsinks.empty_view()) {
      if (options.sinks.empty()) throw ValueError("dsinks given without sinks");
      expect("dsinks", dsinks.shape(), "sinks", Shape{static_cast<int64_t>(options.sinks.size())});
    }
    check_outputs("",
                  {{"dq", MemorySpan::of(dq)}, {"dk", MemorySpan::of(dk)}, {"dv", MemorySpan::of(dv)},
                   {"dsinks", MemorySpan::of(dsinks)}},
                  {{"q", MemorySpan::of(q)}, {"k", MemorySpan::of(k)}, {"v", MemorySpan::of(v)},
                   {"dout", MemorySpan::of(dout)}, {"out", MemorySpan::of(out)}, {"lse", MemorySpan::of(lse)}});
  });
  std::vector<Field> fields = describe(q, k, v, TensorView<T>(), options, layout);
  fields.push_back({"whether dsinks is asked for", dsinks.empty_view() ? "no" : "yes"});
  check_agreement(c, kName, fields);
  const RingSchedule ring(c, kName, layout, q.dim(-2), k.dim(-2), options);
  return or_abort(c, kName, [&] {
  DistStats stats;
  Tensor<double> dq_sum(q.shape());
  AttentionOptions block_options = options;
  block_options.sinks.clear();  // in the saved lse already
  // The block this rank holds; the dK, dV the ranks before it added to it
  // (sent after their step, so received during this one and waited for
  // only after this step's computation: the transfer overlaps it too).
  Tensor<T> k_block = contiguous(k), v_block = contiguous(v), dk_before, dv_before;
  // This rank's own dK, dV: kept, or sent home by the last rank that held the block.
  Tensor<T> dk_home, dv_home;
  std::vector<MPI_Request> requests, gradient_in, gradient_out, home;
  Tensor<T> dk_out, dv_out;  // what gradient_out sends
  if (ring.passes_on(ring.rank, ring.rank)) {
    int last = ring.rank;
    while (ring.passes_on(last, ring.rank)) last = (last + 1) % ring.world;
    receive(c, dk_home, k.shape(), last, kHomeTag, home);
    receive(c, dv_home, v.shape(), last, kHomeTag, home);
  }
  for (int t = 0; t < ring.world; ++t) {
    const int source = (ring.rank - t + ring.world) % ring.world;
    Tensor<T> k_next, v_next, dk_next, dv_next;
    std::vector<MPI_Request> gradient_next;
    if (t + 1 < ring.world && ring.receives(ring.rank, t + 1)) {
      const int64_t rows = ring.k_rows((source - 1 + ring.world) % ring.world);
      receive(c, k_next, with_rows(k.shape(), rows), ring.previous, kRingTag, requests);
      receive(c, v_next, with_rows(v.shape(), rows), ring.previous, kRingTag, requests);
      receive(c, dk_next, with_rows(k.shape(), rows), ring.previous, kRingTag, gradient_next);
      receive(c, dv_next, with_rows(v.shape(), rows), ring.previous, kRingTag, gradient_next);
    }
    const bool passes_on = ring.passes_on(ring.rank, source), holds = ring.holds(ring.rank, source);
    if (passes_on) {
      send(c, k_block, ring.next, kRingTag, requests, stats);
      send(c, v_block, ring.next, kRingTag, requests, stats);
      stats.blocks_sent += 1;
    }
    // This rank's share of the block's dK, dV.
    Tensor<T> dk_block, dv_block;
    if (holds) dk_block = Tensor<T>(k_block.shape()), dv_block = Tensor<T>(v_block.shape());
    if (ring.needs(ring.rank, source)) {
      const auto start = std::chrono::steady_clock::now();
      for (const BlockCall& whole : ring.calls(ring.rank, source)) {
        auto progress_all = [&] {
          for (auto* r : {&requests, &gradient_in, &gradient_out, &gradient_next, &home}) progress(*r);
        };
        in_pieces(whole, progress_all, [&](const BlockCall& call) {
          block_options.causal = call.causal;
          block_options.window = call.window;
          auto rows = [&](TensorView<const T> t) { return slice(t, -2, call.q_begin, call.q_length); };
          TensorView<const T> lse_call = slice(lse, -1, call.q_begin, call.q_length);
          Tensor<T> shifted;
          if (!options.alibi_slopes.empty()) {
            shifted = without_shift(lse_call, ring.alibi_lse_shift(call, options.alibi_slopes));
            lse_call = shifted.view();
          }
          const AttentionGradients<T> g = attention_backward<T, T>(
              rows(q), slice(k_block.view(), -2, call.k_begin, call.k_length),
              slice(v_block.view(), -2, call.k_begin, call.k_length), rows(dout), block_options, {},
              SavedForward<T>{rows(out), lse_call});
          add_rows(dq_sum, g.dq, call.q_begin);
          add_rows(dk_block, g.dk, call.k_begin);
          add_rows(dv_block, g.dv, call.k_begin);
        });
        stats.blocks_computed += 1;
      }
      stats.compute_seconds += seconds_since(start);
    }
    // The ranks' sum so far, then this rank's share: the same order for
    // every run.
    stats.wait_seconds += wait_all(gradient_in);
    if (holds && source != ring.rank) {
      add_rows(dk_before, dk_block, 0), add_rows(dv_before, dv_block, 0);
      dk_block = std::move(dk_before), dv_block = std::move(dv_before);
    }
    // The block's gradient goes on with it, or home from its last holder.
    stats.wait_seconds += wait_all(gradient_out);
    if (passes_on || (holds && source != ring.rank)) {
      dk_out = std::move(dk_block), dv_out = std::move(dv_block);
      const int to = passes_on ? ring.next : source, tag = passes_on ? kRingTag : kHomeTag;
      send(c, dk_out, to, tag, gradient_out, stats);
      send(c, dv_out, to, tag, gradient_out, stats);
    } else if (source == ring.rank) {
      dk_home = std::move(dk_block), dv_home = std::move(dv_block);
    }
    stats.wait_seconds += wait_all(requests);
    k_block = std::move(k_next), v_block = std::move(v_next);
    dk_before = std::move(dk_next), dv_before = std::move(dv_next);
    gradient_in = std::move(gradient_next);
  }
  stats.wait_seconds += wait_all(gradient_out);
  stats.wait_seconds += wait_all(home);
  copy<double, T>(dq_sum.view(), dq);
  copy<T, T>(dk_home.view(), dk);
  copy<T, T>(dv_home.view(), dv);

  if (!dsinks.empty_view()) {
    // dσ[h] = -Σ over rows of exp(σ[h] - lse) (dout · out), each rank's rows
    // summed, then the ranks' sums in rank order: the same on every rank.
    const int64_t heads = static_cast<int64_t>(options.sinks.size()), rows = q.dim(-2), dv_size = out.dim(-1);
    const Tensor<T> out_c = contiguous(out), dout_c = contiguous(dout), lse_c = contiguous(lse);
    std::vector<double> mine(static_cast<size_t>(heads)), all(static_cast<size_t>(heads * ring.world));
    for (int64_t g = 0; rows && g < lse_c.numel() / rows; ++g)
      for (int64_t i = 0; i < rows; ++i) {
        double wdw = 0;
        for (int64_t e = 0; e < dv_size; ++e)
          wdw += double{dout_c[(g * rows + i) * dv_size + e]} * out_c[(g * rows + i) * dv_size + e];
        mine[static_cast<size_t>(g % heads)] -= std::exp(options.sinks[static_cast<size_t>(g % heads)] - lse_c[g * rows + i]) * wdw;
      }
    MPI_Allgather(mine.data(), static_cast<int>(heads), MPI_DOUBLE, all.data(), static_cast<int>(heads), MPI_DOUBLE,
                  c.comm);
    Tensor<double> sum({heads});
    for (int r = 0; r < ring.world; ++r)
      for (int64_t h = 0; h < heads; ++h) sum[h] += all[static_cast<size_t>(r * heads + h)];
    copy<double, T>(sum.view(), dsinks);
  }
  return stats;
  });
}

#define ATTN_INSTANTIATE(T, KV)                                                                           \
  template DistStats ring_attention<T, KV>(TensorView<const T>, TensorView<const KV>, TensorView<const KV>, \
                                           TensorView<T>, MPI_Comm, const AttentionOptions&, Layout,       \
                                           TensorView<T>);
ATTN_DIST_FOR_EACH_TYPES(ATTN_INSTANTIATE)
#undef ATTN_INSTANTIATE
template DistStats ring_attention_backward<float>(TensorView<const float>, TensorView<const float>,
                                                  TensorView<const float>, TensorView<const float>,
                                                  TensorView<const float>, TensorView<const float>, TensorView<float>,
                                                  TensorView<float>, TensorView<float>, MPI_Comm,
                                                  const AttentionOptions&, Layout, TensorView<float>);
template DistStats ring_attention_backward<double>(TensorView<const double>, TensorView<const double>,
                                                   TensorView<const double>, TensorView<const double>,
                                                   TensorView<const double>, TensorView<const double>,
                                                   TensorView<double>, TensorView<double>, TensorView<double>,
                                                   MPI_Comm, const AttentionOptions&, Layout, TensorView<double>);

}  // namespace attn::dist
