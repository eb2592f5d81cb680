// Ulysses attention (DeepSpeed): an all-to-all turns the split of the
// sequence into a split of the heads, each rank runs attention() on whole
// sequences of Hq / W query heads (and Hkv / W key/value heads), and a
// second all-to-all returns each rank its rows of every head.
#include <algorithm>
#include <chrono>
#include <limits>
#include <utility>

#include "problem.hpp"
#include "sequence.hpp"

namespace attn::dist {

namespace {

// The part of an array that goes between two ranks: this rank's rows of
// their heads, or their rows of this rank's heads.
struct Parts {
  std::vector<int> counts, offsets;  // in rows of the last axis, per rank
};

// A contiguous row of `row_bytes` bytes: counts of rows stay small.
struct RowType {
  MPI_Datatype type;
  explicit RowType(int64_t row_bytes) {
    MPI_Type_contiguous(static_cast<int>(row_bytes), MPI_BYTE, &type);
    MPI_Type_commit(&type);
  }
  ~RowType() { MPI_Type_free(&type); }
  RowType(const RowType&) = delete;
  RowType& operator=(const RowType&) = delete;
};


// Moves this rank's rows of every head, `src` (..., H, n_local, e), into
// every rank's rows of this rank's heads at their global positions, `dst`
// (..., H / W, N, e) (to_heads); or back, from such a `src` into such a
// `dst` (!to_heads).
template <class E>
void exchange(const Communicator& c, TensorView<const E> src, TensorView<E> dst,
              const std::vector<std::vector<Segment>>& segments, bool to_heads, DistStats& stats) {
  const int world = c.size;
  const Shape& gathered = to_heads ? dst.shape() : src.shape();
  const int64_t heads = gathered[gathered.size() - 3], e = gathered.back();
  const int64_t local_rows = (to_heads ? src : TensorView<const E>(dst)).dim(-2);
  int64_t lead = 1;
  for (size_t a = 0; a + 3 < gathered.size(); ++a) lead *= gathered[a];
  // Part r, packed as (..., heads, rows, e): this rank's rows of rank r's
  // heads, or rank r's rows (its segments, in its local order) of this
  // rank's heads.
  auto rows_of = [&](int r) {
    int64_t n = 0;
    for (const Segment& s : segments[static_cast<size_t>(r)]) n += s.length;
    return n;
  };
  std::vector<int64_t> send_rows, receive_rows;
  for (int r = 0; r < world; ++r) {
    send_rows.push_back(to_heads ? local_rows : rows_of(r));
    receive_rows.push_back(to_heads ? rows_of(r) : local_rows);
  }
  Parts send, receive;
  int64_t send_total = 0, receive_total = 0;
  for (int r = 0; r < world; ++r) {
    // (Within int: ulysses_attention checked every rank's totals.)
    send.offsets.push_back(static_cast<int>(send_total)), receive.offsets.push_back(static_cast<int>(receive_total));
    send.counts.push_back(static_cast<int>(lead * heads * send_rows[static_cast<size_t>(r)]));
    receive.counts.push_back(static_cast<int>(lead * heads * receive_rows[static_cast<size_t>(r)]));
    send_total += send.counts.back(), receive_total += receive.counts.back();
  }
  std::vector<E> send_buffer(static_cast<size_t>(send_total * e)), receive_buffer(static_cast<size_t>(receive_total * e));
  Shape part_shape = gathered;
  auto part = [&](std::vector<E>& buffer, const Parts& parts, const std::vector<int64_t>& rows, int r) {
    return TensorView<E>(buffer.data() + int64_t{parts.offsets[static_cast<size_t>(r)]} * e,
                         with_rows(part_shape, rows[static_cast<size_t>(r)]));
  };
  for (int r = 0; r < world; ++r) {
    const TensorView<E> packed = part(send_buffer, send, send_rows, r);
    if (to_heads)
      copy<E, E>(slice(src, -3, r * heads, heads), packed);
    else
      for (const Segment& s : segments[static_cast<size_t>(r)])
        copy<E, E>(slice(src, -2, s.global, s.length), slice(packed, -2, s.local, s.length));
  }
  const RowType row(e * int64_t{sizeof(E)});
  const auto start = std::chrono::steady_clock::now();
  MPI_Alltoallv(send_buffer.data(), send.counts.data(), send.offsets.data(), row.type, receive_buffer.data(),
                receive.counts.data(), receive.offsets.data(), row.type, c.comm);
  stats.wait_seconds += seconds_since(start);
  for (int r = 0; r < world; ++r)
    if (r != c.rank && send.counts[static_cast<size_t>(r)] > 0)
      stats.blocks_sent += 1, stats.bytes_sent += send.counts[static_cast<size_t>(r)] * e * int64_t{sizeof(E)};
  for (int r = 0; r < world; ++r) {
    const TensorView<E> packed = part(receive_buffer, receive, receive_rows, r);
    if (to_heads)
      for (const Segment& s : segments[static_cast<size_t>(r)])
        copy<E, E>(slice(packed, -2, s.local, s.length), slice(dst, -2, s.global, s.length));
    else
      copy<E, E>(packed, slice(dst, -3, r * heads, heads));
  }
}

// A view with a trailing axis of one element (the lse as rows of length 1).
template <class T>
TensorView<T> as_rows(TensorView<T> view) {
  Shape shape = view.shape();
  Strides strides = view.strides();
  shape.push_back(1);
  strides.push_back(1);
  return TensorView<T>(view.data(), shape, strides);
}

std::vector<double> head_group(const std::vector<double>& per_head, int64_t begin, int64_t count) {
  if (per_head.empty()) return {};
  return {per_head.begin() + begin, per_head.begin() + begin + count};
}

}  // namespace

template <class T, class KV>
  requires AttentionTypes<T, KV>
DistStats ulysses_attention(TensorView<const T> q, TensorView<const KV> k, TensorView<const KV> v,
                            TensorView<T> out, MPI_Comm comm, const AttentionOptions& options, Layout layout,
                            TensorView<T> lse) {
  constexpr const char* kName = "ulysses_attention";
  const Communicator c = communicator(comm, kName);
  const int world = c.size;
  check_collectively(c, kName, [&] {
    check_local(q, k, v, out, lse, options);
    if (q.rank() < 3)
      throw ValueError("q " + shape_str(q.shape()) + " has no heads axis; Ulysses splits the heads (..., H, n, d)");
    if (q.dim(-3) % world != 0 || k.dim(-3) % world != 0)
      throw ValueError("Ulysses splits the heads over the " + std::to_string(world) +
                       " ranks, so their number must divide both Hq = " + std::to_string(q.dim(-3)) +
                       " and Hkv = " + std::to_string(k.dim(-3)));
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
  std::vector<std::vector<Segment>> q_segments, k_segments;
  for (int r = 0; r < world; ++r) {
    n_q += q_rows[static_cast<size_t>(r)], n_k += k_rows[static_cast<size_t>(r)];
    q_segments.push_back(rank_segments(layout, q_rows, r));
    k_segments.push_back(rank_segments(layout, k_rows, r));
  }
  const int64_t hq = q.dim(-3) / world, hkv = k.dim(-3) / world;
  // MPI's counts are ints: a rank sends W parts of its rows and receives
  // every rank's. Every rank knows every count, so all refuse alike.
  int64_t lead = 1;
  for (int a = 0; a + 3 < q.rank(); ++a) lead *= q.dim(a);
  for (const auto& [rows, heads] : {std::pair{&q_rows, hq}, std::pair{&k_rows, hkv}}) {
    const int64_t longest = *std::max_element(rows->begin(), rows->end());
    int64_t total = 0;
    for (int64_t n : *rows) total += n;
    const int64_t most = lead * heads * std::max(world * longest, total);
    if (most > std::numeric_limits<int>::max())
      throw ValueError(std::string(kName) + ": an all-to-all of " + std::to_string(most) +
                       " rows is more than MPI's int counts carry (2^31 - 1); use more ranks or ring_attention");
  }
  auto gathered_shape = [](const Shape& local, int64_t heads, int64_t rows) {
    Shape s = with_rows(local, rows);
    s[s.size() - 3] = heads;
    return s;
  };
  return or_abort(c, kName, [&] {
  DistStats stats;
  Tensor<T> q_all(gathered_shape(q.shape(), hq, n_q));
  Tensor<KV> k_all(gathered_shape(k.shape(), hkv, n_k)), v_all(gathered_shape(v.shape(), hkv, n_k));
  exchange<T>(c, q, q_all.view(), q_segments, true, stats);
  exchange<KV>(c, k, k_all.view(), k_segments, true, stats);
  exchange<KV>(c, v, v_all.view(), k_segments, true, stats);

  AttentionOptions group_options = options;
  group_options.alibi_slopes = head_group(options.alibi_slopes, c.rank * hq, hq);
  group_options.sinks = head_group(options.sinks, c.rank * hq, hq);
  Tensor<T> out_all(gathered_shape(out.shape(), hq, n_q));
  Tensor<T> lse_all(Shape(out_all.shape().begin(), out_all.shape().end() - 1));
  AttentionExtras<T> extras;
  if (!lse.empty_view()) extras.lse = lse_all.view();
  const auto start = std::chrono::steady_clock::now();
  AttentionPlan<T, KV>(q_all.view(), k_all.view(), v_all.view(), group_options).run(out_all.view(), extras);
  stats.compute_seconds += seconds_since(start);
  stats.blocks_computed += 1;

  exchange<T>(c, out_all.view(), out, q_segments, false, stats);
  if (!lse.empty_view()) exchange<T>(c, as_rows(lse_all.view()), as_rows(lse), q_segments, false, stats);
  return stats;
  });
}

#define ATTN_INSTANTIATE(T, KV)                                                                              \
  template DistStats ulysses_attention<T, KV>(TensorView<const T>, TensorView<const KV>, TensorView<const KV>, \
                                              TensorView<T>, MPI_Comm, const AttentionOptions&, Layout,       \
                                              TensorView<T>);
ATTN_DIST_FOR_EACH_TYPES(ATTN_INSTANTIATE)
#undef ATTN_INSTANTIATE

}  // namespace attn::dist
