// Context-parallel attention against one process: each rank's output and
// log-sum-exp must be the rows it holds of attention() on the gathered
// inputs. Runs under mpirun -np W for W = 1..4 (tests/CMakeLists.txt).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attn/attention.hpp"
#include "attn/dist.hpp"
#include "attn/error.hpp"
#include "attn/positional.hpp"
#include "attn/quantize.hpp"

namespace attn::dist {
namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int w = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &w);
  return w;
}

// The global positions rank r holds, in its local order: the layouts as
// docs/semantics.md defines them, written out here apart from the library.
std::vector<int64_t> positions(Layout layout, const std::vector<int64_t>& lengths, int r) {
  std::vector<int64_t> rows;
  if (layout == Layout::Zigzag) {
    const int64_t chunk = lengths[0] / 2, chunks = 2 * static_cast<int64_t>(lengths.size());
    for (int64_t c : {int64_t{r}, chunks - 1 - r})
      for (int64_t i = 0; i < chunk; ++i) rows.push_back(c * chunk + i);
    return rows;
  }
  int64_t begin = 0;
  for (int s = 0; s < r; ++s) begin += lengths[static_cast<size_t>(s)];
  for (int64_t i = 0; i < lengths[static_cast<size_t>(r)]; ++i) rows.push_back(begin + i);
  return rows;
}

template <class E>
E from_double(double x) {
  if constexpr (std::is_same_v<E, bfloat16>)
    return bfloat16{float_to_bf16(static_cast<float>(x))};
  else if constexpr (std::is_same_v<E, float16>)
    return float16{float_to_fp16(static_cast<float>(x))};
  else
    return static_cast<E>(x);
}

// N(0, 1) values, the same on every rank (the seed is shared).
template <class E>
Tensor<E> normal(const Shape& shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> z;
  Tensor<E> t(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = from_double<E>(z(rng));
  return t;
}

// The rows of axis -2 at the given positions, as a contiguous tensor.
template <class E>
Tensor<E> take_rows(const Tensor<E>& x, const std::vector<int64_t>& rows) {
  Shape shape = x.shape();
  const int64_t n = shape[shape.size() - 2], e = shape.back();
  shape[shape.size() - 2] = static_cast<int64_t>(rows.size());
  Tensor<E> out(shape);
  const int64_t groups = n ? x.numel() / (n * e) : 0;
  for (int64_t g = 0; g < groups; ++g)
    for (size_t i = 0; i < rows.size(); ++i)
      for (int64_t j = 0; j < e; ++j)
        out[(g * static_cast<int64_t>(rows.size()) + static_cast<int64_t>(i)) * e + j] = x[(g * n + rows[i]) * e + j];
  return out;
}

// A trailing axis of one element, so that take_rows picks lse's rows.
template <class E>
Tensor<E> with_unit_axis(Tensor<E> x) {
  Shape shape = x.shape();
  shape.push_back(1);
  return std::move(x).reshape(shape);
}

enum class Strategy { Ring, Ulysses };
const char* strategy_name(Strategy s) { return s == Strategy::Ring ? "ring" : "ulysses"; }

struct Problem {
  Strategy strategy;
  Layout layout;
  std::vector<int64_t> q_lengths, k_lengths;  // per rank
  AttentionOptions options;
  int64_t batch = 2, d = 8;
};

// attention() on one process: the output and log-sum-exp of the whole problem.
template <class T>
struct Whole {
  Tensor<T> out, lse;
};
template <class T, class KV>
Whole<T> whole_attention(TensorView<const T> q, TensorView<const KV> k, TensorView<const KV> v,
                         const AttentionOptions& options) {
  const AttentionPlan<T, KV> plan(q, k, v, options);
  Whole<T> whole{Tensor<T>(plan.output_shape()), Tensor<T>(plan.lse_shape())};
  plan.run(whole.out.view(), {.lse = whole.lse.view()});
  return whole;
}

// Rows per rank: contiguous ones uneven (base + r, some ranks possibly
// empty when base is 0), zigzag ones two chunks each.
std::vector<int64_t> lengths(Layout layout, int64_t base) {
  std::vector<int64_t> n;
  for (int r = 0; r < world_size(); ++r) n.push_back(layout == Layout::Zigzag ? 2 * base : base + r);
  return n;
}

template <class T, class KV>
struct Outcome {
  Tensor<T> out, lse, expected_out, expected_lse;
  DistStats stats;
};

template <class T, class KV>
Outcome<T, KV> run(const Problem& p, bool with_lse = true) {
  const int w = world_size(), r = world_rank();
  const int64_t hq = 2 * w, hkv = w;  // GQA, and heads Ulysses can split at any W
  int64_t n_q = 0, n_k = 0;
  for (int64_t n : p.q_lengths) n_q += n;
  for (int64_t n : p.k_lengths) n_k += n;
  const Tensor<T> q = normal<T>({p.batch, hq, n_q, p.d}, 1);
  const Tensor<KV> k = normal<KV>({p.batch, hkv, n_k, p.d}, 2), v = normal<KV>({p.batch, hkv, n_k, p.d}, 3);
  Outcome<T, KV> o;
  const auto whole = whole_attention<T, KV>(q.view(), k.view(), v.view(), p.options);
  const std::vector<int64_t> q_rows = positions(p.layout, p.q_lengths, r);
  const std::vector<int64_t> k_rows = positions(p.layout, p.k_lengths, r);
  o.expected_out = take_rows(whole.out, q_rows);
  o.expected_lse = take_rows(with_unit_axis(Tensor<T>(whole.lse)), q_rows);
  const Tensor<T> q_local = take_rows(q, q_rows);
  const Tensor<KV> k_local = take_rows(k, k_rows), v_local = take_rows(v, k_rows);
  o.out = Tensor<T>(o.expected_out.shape());
  o.lse = Tensor<T>(Shape(o.out.shape().begin(), o.out.shape().end() - 1));
  auto f = p.strategy == Strategy::Ring ? ring_attention<T, KV> : ulysses_attention<T, KV>;
  o.stats = f(q_local.view(), k_local.view(), v_local.view(), o.out.view(), MPI_COMM_WORLD, p.options, p.layout,
              with_lse ? o.lse.view() : TensorView<T>());
  o.lse = with_unit_axis(std::move(o.lse));
  return o;
}

template <class E>
double max_abs(const Tensor<E>& x) {
  double m = 0;
  for (int64_t i = 0; i < x.numel(); ++i) m = std::max(m, std::fabs(static_cast<double>(x[i])));
  return m;
}

// max |a - b| / max |b| over the finite entries of b; the infinite (a row
// with no allowed key: lse = -inf) must match exactly.
template <class E>
double relative_difference(const Tensor<E>& a, const Tensor<E>& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    const double x = a[i], y = b[i];
    if (!std::isfinite(y)) {
      EXPECT_TRUE(x == y || (std::isnan(x) && std::isnan(y))) << "at " << i << ": " << x << " vs " << y;
      continue;
    }
    if (!std::isfinite(x)) return std::numeric_limits<double>::infinity();  // fails any tolerance
    diff = std::max(diff, std::fabs(x - y));
    scale = std::max(scale, std::fabs(y));
  }
  return scale > 0 ? diff / scale : diff;
}

template <class T, class KV = T>
void expect_one_process(const Problem& p, double tolerance) {
  const Outcome<T, KV> o = run<T, KV>(p);
  SCOPED_TRACE(std::string(strategy_name(p.strategy)) + ", " + layout_name(p.layout) + ", rank " +
               std::to_string(world_rank()) + " of " + std::to_string(world_size()));
  EXPECT_LE(relative_difference(o.out, o.expected_out), tolerance);
  EXPECT_LE(relative_difference(o.lse, o.expected_lse), tolerance);
}

const Strategy kStrategies[] = {Strategy::Ring, Strategy::Ulysses};
const Layout kLayouts[] = {Layout::Contiguous, Layout::Zigzag};

// float32 within 1e-5 of one process (the kernels' rounding of partial
// results merged in double); float64 (the reference on every block) within
// 1e-12.
constexpr double kFloat32 = 1e-5, kFloat64 = 1e-12;

TEST(ContextParallel, NonCausal) {
  for (Strategy s : kStrategies)
    for (Layout l : kLayouts) {
      expect_one_process<float>({s, l, lengths(l, 3), lengths(l, 3)}, kFloat32);
      expect_one_process<double>({s, l, lengths(l, 3), lengths(l, 3)}, kFloat64);
    }
}

// Queries and keys of different global lengths (a prefix of cached keys),
// so that the two causal alignments differ; some contiguous ranks hold no
// query row.
TEST(ContextParallel, CausalBothAlignments) {
  for (Strategy s : kStrategies)
    for (Layout l : kLayouts)
      for (Causal causal : {Causal::TopLeft, Causal::BottomRight, Causal::offset(-2)}) {
        SCOPED_TRACE(causal_name(causal));
        Problem p{s, l, lengths(l, l == Layout::Zigzag ? 2 : 0), lengths(l, 4), {.causal = causal}};
        expect_one_process<float>(p, kFloat32);
        expect_one_process<double>(p, kFloat64);
      }
}

// Keys outnumber queries by 2W (contiguous) or 4W (zigzag), at most 16:
// windows measure from the query's position p = i + (n_k - n_q), top-left
// causal masking from i, so the top-left windows reach past that gap.
TEST(ContextParallel, Windows) {
  const std::vector<Window> near = {{3, 0}, {2, 5}, {-1, 1}, {4, -1}}, far = {{18, 0}, {20, 3}, {-1, 1}, {19, -1}};
  for (Strategy s : kStrategies)
    for (Layout l : kLayouts)
      for (Causal causal : {Causal::None, Causal::BottomRight, Causal::TopLeft, Causal::offset(-3)})
        for (Window window : causal == Causal::TopLeft ? far : near) {
          SCOPED_TRACE(causal_name(causal) + " window (" + std::to_string(window.left) + ", " +
                       std::to_string(window.right) + ")");
          Problem p{s, l, lengths(l, 3), lengths(l, 5), {.causal = causal, .window = window}};
          expect_one_process<float>(p, kFloat32);
          expect_one_process<double>(p, kFloat64);
        }
}

// Enough rows on a rank that the ring computes each block in pieces (64
// rows and more each, MPI_Testall between them), each piece with its own
// causal offset.
TEST(ContextParallel, BlocksInPieces) {
  for (Layout l : kLayouts) {
    const Problem p{Strategy::Ring, l, lengths(l, 130), lengths(l, 130), {.causal = Causal::TopLeft, .window = {150, -1}}};
    expect_one_process<float>(p, kFloat32);
  }
}

TEST(ContextParallel, ScaleSoftcapAndSinks) {
  const int64_t hq = 2 * world_size();
  std::vector<double> sinks;
  for (int64_t h = 0; h < hq; ++h) sinks.push_back(0.3 * static_cast<double>(h) - 1);
  for (Strategy s : kStrategies)
    for (Layout l : kLayouts) {
      Problem p{s, l, lengths(l, 3), lengths(l, 3),
                {.scale = 0.7, .causal = Causal::TopLeft, .window = {4, -1}, .softcap = 2.5, .sinks = sinks}};
      expect_one_process<float>(p, kFloat32);
      expect_one_process<double>(p, kFloat64);
    }
}

// bf16 and int8 precision (enough rows per call for the prefill kernel,
// whose products they change). Ulysses runs whole heads, as one process
// does: within float32's tolerance. The ring's blocks each round or
// quantize what they see (int8 centers each block's keys on their own
// mean), so its result and one process's are each within the bound
// of the exact one (bf16 4e-3, int8 2e-2, relative Frobenius) and so within
// twice that of each other.
TEST(ContextParallel, LowPrecisions) {
  const auto frobenius = [](const Tensor<float>& a, const Tensor<float>& b) {
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < b.numel(); ++i) diff += std::pow(double(a[i]) - b[i], 2), norm += std::pow(double(b[i]), 2);
    return std::sqrt(diff / norm);
  };
  for (const auto& [precision, bound] : {std::pair{Precision::BF16, 4e-3}, std::pair{Precision::Int8, 2e-2}})
    for (Strategy s : kStrategies)
      for (Layout l : kLayouts) {
        Problem p{s, l, lengths(l, 20), lengths(l, 20), {.causal = Causal::TopLeft, .precision = precision}};
        p.d = 64;
        const Outcome<float, float> o = run<float, float>(p);
        SCOPED_TRACE(precision_name(precision) + ", " + strategy_name(s) + ", " + layout_name(l));
        if (s == Strategy::Ulysses) {
          EXPECT_LE(relative_difference(o.out, o.expected_out), kFloat32);
        } else {
          EXPECT_LE(frobenius(o.out, o.expected_out), 2 * bound);
        }
      }
}

// bfloat16 and float16 K and V travel as they are stored: half of float32's
// bytes around the ring.
TEST(ContextParallel, HalfPrecisionKeysAndValuesTravelInHalfTheBytes) {
  for (Strategy s : kStrategies)
    for (Layout l : kLayouts) {
      const Problem p{s, l, lengths(l, 3), lengths(l, 3), {.causal = Causal::TopLeft}};
      expect_one_process<float, bfloat16>(p, kFloat32);
      expect_one_process<float, float16>(p, kFloat32);
      const auto half = run<float, bfloat16>(p).stats;
      const auto full = run<float, float>(p).stats;
      if (s == Strategy::Ring) {
        EXPECT_EQ(2 * half.bytes_sent, full.bytes_sent);
        // (Contiguous and causal, no rank needs the last rank's block.)
        if (l == Layout::Zigzag || world_rank() + 1 < world_size()) {
          EXPECT_EQ(full.bytes_sent > 0, world_size() > 1);
        }
      }
    }
}

// GGUF's q8_0 blocks (34 bytes per 32 values) travel as stored too.
TEST(ContextParallel, Q8_0KeysAndValues) {
  const int w = world_size(), r = world_rank();
  for (Strategy s : kStrategies)
    for (Layout l : kLayouts) {
      const std::vector<int64_t> n_local = lengths(l, 3);
      int64_t n = 0;
      for (int64_t x : n_local) n += x;
      const Tensor<float> q = normal<float>({2 * w, n, 32}, 1);
      const Tensor<block_q8_0> k = quantize_q8_0(normal<float>({w, n, 32}, 2).view());
      const Tensor<block_q8_0> v = quantize_q8_0(normal<float>({w, n, 32}, 3).view());
      const AttentionOptions options{.causal = Causal::TopLeft};
      const auto whole =
          whole_attention<float, block_q8_0>(q.view(), k.view(), v.view(), options);
      const std::vector<int64_t> rows = positions(l, n_local, r);
      const Tensor<float> q_local = take_rows(q, rows);
      const Tensor<block_q8_0> k_local = take_rows(k, rows), v_local = take_rows(v, rows);
      Tensor<float> out(q_local.shape()), lse({2 * w, static_cast<int64_t>(rows.size())});
      auto f = s == Strategy::Ring ? ring_attention<float, block_q8_0> : ulysses_attention<float, block_q8_0>;
      f(q_local.view(), k_local.view(), v_local.view(), out.view(), MPI_COMM_WORLD, options, l, lse.view());
      SCOPED_TRACE(std::string(strategy_name(s)) + ", " + layout_name(l));
      EXPECT_LE(relative_difference(out, take_rows(whole.out, rows)), kFloat32);
      EXPECT_LE(relative_difference(with_unit_axis(std::move(lse)), take_rows(with_unit_axis(Tensor<float>(whole.lse)), rows)),
                kFloat32);
    }
}

// ALiBi's bias on global positions. The ring computes each block with the
// block's own positions and corrects its log-sum-exp by a constant per
// head: checked with both alignments and an offset (n_q != n_k), windows,
// blocks in pieces, and steep slopes (2^-1 first), where a position off by
// one in any block would move the output far past the tolerance.
TEST(ContextParallel, ALiBi) {
  const int64_t hq = 2 * world_size();
  for (Strategy s : kStrategies)
    for (Layout l : kLayouts) {
      for (Causal causal : {Causal::None, Causal::TopLeft, Causal::BottomRight, Causal::offset(-2)}) {
        SCOPED_TRACE(causal_name(causal));
        Problem p{s, l, lengths(l, 3), lengths(l, 5), {.causal = causal, .alibi_slopes = alibi_slopes(hq)}};
        expect_one_process<float>(p, kFloat32);
        expect_one_process<double>(p, kFloat64);
        p.options.window = {4, 2};
        expect_one_process<float>(p, kFloat32);
        expect_one_process<double>(p, kFloat64);
      }
      expect_one_process<float>({s, l, lengths(l, 130), lengths(l, 130),
                                 {.causal = Causal::TopLeft, .alibi_slopes = alibi_slopes(hq, 1.0)}},
                                kFloat32);
    }
}

// Two calls alike give the same bits, output and log-sum-exp (across
// processes: tests/python/test_dist.py runs the same twice); without lse
// asked for, the same output.
TEST(ContextParallel, BitwiseReproducible) {
  for (Strategy s : kStrategies)
    for (Layout l : kLayouts) {
      const Problem p{s, l, lengths(l, 5), lengths(l, 5), {.causal = Causal::TopLeft}};
      const auto a = run<float, float>(p), b = run<float, float>(p);
      for (int64_t i = 0; i < a.out.numel(); ++i) EXPECT_EQ(a.out[i], b.out[i]) << "at " << i;
      for (int64_t i = 0; i < a.lse.numel(); ++i) EXPECT_EQ(a.lse[i], b.lse[i]) << "at " << i;
      const Tensor<float> out = run<float, float>(p, false).out;
      for (int64_t i = 0; i < out.numel(); ++i) EXPECT_EQ(out[i], a.out[i]) << "at " << i;
    }
}

// Contiguous and causal, W equal blocks: rank r needs the blocks of ranks
// 0..r, so block s goes from rank s to rank W - 1 and no further:
// W (W - 1) / 2 blocks sent (not W (W - 1)), W (W + 1) / 2 computed.
TEST(ContextParallel, RingSkipsWhollyMaskedBlocks) {
  const int64_t w = world_size();
  const Problem p{Strategy::Ring, Layout::Contiguous, std::vector<int64_t>(static_cast<size_t>(w), 4),
                  std::vector<int64_t>(static_cast<size_t>(w), 4), {.causal = Causal::TopLeft}};
  const DistStats stats = run<float, float>(p).stats;
  int64_t mine[2] = {stats.blocks_sent, stats.blocks_computed}, total[2] = {0, 0};
  MPI_Allreduce(mine, total, 2, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(total[0], w * (w - 1) / 2);
  EXPECT_EQ(total[1], w * (w + 1) / 2);
}

// Zigzag balances the causal triangle: every rank makes the same calls,
// of chunk-sized blocks: three on its own block, one on each other's.
TEST(ContextParallel, ZigzagBalancesTheCausalWork) {
  const int64_t w = world_size();
  const Problem p{Strategy::Ring, Layout::Zigzag, lengths(Layout::Zigzag, 4), lengths(Layout::Zigzag, 4),
                  {.causal = Causal::TopLeft}};
  const DistStats stats = run<float, float>(p).stats;
  // The diagonal block takes three calls (each chunk's triangle, and the
  // later chunk against the earlier one); a block of another rank one (all
  // rows against its first chunk, or the later chunk against both).
  std::vector<int64_t> computed(static_cast<size_t>(w));
  MPI_Allgather(&stats.blocks_computed, 1, MPI_INT64_T, computed.data(), 1, MPI_INT64_T, MPI_COMM_WORLD);
  for (int64_t c : computed) EXPECT_EQ(c, computed[0]);
  EXPECT_EQ(computed[0], 3 + (w - 1));
}

// The ring's backward against one process's attention_backward: each
// rank's rows of dq, dk, dv, and dsinks (summed over all rows) on every rank.
template <class T>
void expect_backward(const Problem& p, double tolerance) {
  const int w = world_size(), r = world_rank();
  const int64_t hq = 2 * w, hkv = w;
  int64_t n_q = 0, n_k = 0;
  for (int64_t n : p.q_lengths) n_q += n;
  for (int64_t n : p.k_lengths) n_k += n;
  const Tensor<T> q = normal<T>({p.batch, hq, n_q, p.d}, 1), dout = normal<T>({p.batch, hq, n_q, p.d}, 4);
  const Tensor<T> k = normal<T>({p.batch, hkv, n_k, p.d}, 2), v = normal<T>({p.batch, hkv, n_k, p.d}, 3);
  const AttentionGradients<T> whole = attention_backward<T, T>(q.view(), k.view(), v.view(), dout.view(), p.options);
  const std::vector<int64_t> q_rows = positions(p.layout, p.q_lengths, r), k_rows = positions(p.layout, p.k_lengths, r);
  const Tensor<T> q_local = take_rows(q, q_rows), dout_local = take_rows(dout, q_rows);
  const Tensor<T> k_local = take_rows(k, k_rows), v_local = take_rows(v, k_rows);
  Tensor<T> out(q_local.shape()), lse(Shape(q_local.shape().begin(), q_local.shape().end() - 1));
  ring_attention<T, T>(q_local.view(), k_local.view(), v_local.view(), out.view(), MPI_COMM_WORLD, p.options,
                       p.layout, lse.view());
  Tensor<T> dq(q_local.shape()), dk(k_local.shape()), dv(v_local.shape());
  Tensor<T> dsinks(Shape{static_cast<int64_t>(p.options.sinks.size())});
  ring_attention_backward<T>(q_local.view(), k_local.view(), v_local.view(), dout_local.view(), out.view(),
                             lse.view(), dq.view(), dk.view(), dv.view(), MPI_COMM_WORLD, p.options, p.layout,
                             p.options.sinks.empty() ? TensorView<T>() : dsinks.view());
  SCOPED_TRACE(std::string(layout_name(p.layout)) + ", rank " + std::to_string(r) + " of " + std::to_string(w));
  EXPECT_LE(relative_difference(dq, take_rows(whole.dq, q_rows)), tolerance);
  EXPECT_LE(relative_difference(dk, take_rows(whole.dk, k_rows)), tolerance);
  EXPECT_LE(relative_difference(dv, take_rows(whole.dv, k_rows)), tolerance);
  if (!p.options.sinks.empty()) {
    EXPECT_LE(relative_difference(dsinks, whole.dsinks), tolerance);
  }
}

TEST(ContextParallel, RingBackward) {
  const int64_t hq = 2 * world_size();
  std::vector<double> sinks;
  for (int64_t h = 0; h < hq; ++h) sinks.push_back(0.25 * static_cast<double>(h) - 0.5);
  for (Layout l : kLayouts) {
    expect_backward<float>({Strategy::Ring, l, lengths(l, 3), lengths(l, 3)}, kFloat32);
    expect_backward<double>({Strategy::Ring, l, lengths(l, 3), lengths(l, 3)}, kFloat64);
    for (Causal causal : {Causal::TopLeft, Causal::BottomRight}) {
      SCOPED_TRACE(causal_name(causal));
      const Problem p{Strategy::Ring, l, lengths(l, 2), lengths(l, 4), {.causal = causal, .window = {5, -1}}};
      expect_backward<float>(p, kFloat32);
      expect_backward<double>(p, kFloat64);
    }
    const Problem with_sinks{Strategy::Ring, l, lengths(l, 3), lengths(l, 3),
                             {.scale = 0.6, .causal = Causal::TopLeft, .softcap = 2.0, .sinks = sinks}};
    expect_backward<float>(with_sinks, kFloat32);
    expect_backward<double>(with_sinks, kFloat64);
    for (Causal causal : {Causal::None, Causal::BottomRight}) {
      SCOPED_TRACE("ALiBi, " + causal_name(causal));
      const Problem alibi{Strategy::Ring, l, lengths(l, 2), lengths(l, 4),
                          {.causal = causal, .window = {6, -1}, .alibi_slopes = alibi_slopes(hq), .sinks = sinks}};
      expect_backward<float>(alibi, kFloat32);
      expect_backward<double>(alibi, kFloat64);
    }
  }
}

// Bad input on one rank: every rank throws the same error, naming it.
TEST(ContextParallel, BadInputOnOneRankFailsOnEveryRank) {
  const int w = world_size(), r = world_rank(), bad = w - 1;
  const int64_t hq = 2 * w, hkv = w;
  for (Strategy s : kStrategies) {
    auto f = s == Strategy::Ring ? ring_attention<float, float> : ulysses_attention<float, float>;
    const Tensor<float> q = normal<float>({hq, 3, 8}, 1);
    const Tensor<float> k = normal<float>({hkv, 3, r == bad ? 7 : 8}, 2), v = normal<float>({hkv, 3, 8}, 3);
    Tensor<float> out({hq, 3, 8});
    try {
      f(q.view(), k.view(), v.view(), out.view(), MPI_COMM_WORLD, {}, Layout::Contiguous, {});
      ADD_FAILURE() << strategy_name(s) << ": no error";
    } catch (const ValueError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("rank " + std::to_string(bad) + ":"), std::string::npos) << message;
      EXPECT_NE(message.find("(" + std::to_string(hkv) + ", 3, 7)"), std::string::npos) << message;
    }
  }
}

// An output over an input on one rank (out aliasing v; a gradient over
// dout): every rank throws, naming both.
void expect_error_on_every_rank(const std::function<void()>& call, const std::string& needle) {
  try {
    call();
    ADD_FAILURE() << "no error; expected " << needle;
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(ContextParallel, OutputsThatOverlapInputsFailOnEveryRank) {
  const int w = world_size(), r = world_rank(), bad = w - 1;
  const int64_t hq = 2 * w, hkv = w;
  const std::string on_bad = "rank " + std::to_string(bad) + ": ";
  const Tensor<float> q = normal<float>({hq, 3, 8}, 1), k = normal<float>({hkv, 3, 8}, 2);
  Tensor<float> v = normal<float>({hq, 3, 8}, 3), out({hq, 3, 8});
  const TensorView<const float> v_heads(v.data(), {hkv, 3, 8});
  for (Strategy s : kStrategies) {
    auto f = s == Strategy::Ring ? ring_attention<float, float> : ulysses_attention<float, float>;
    expect_error_on_every_rank([&] {
      f(q.view(), k.view(), v_heads, r == bad ? v.view() : out.view(), MPI_COMM_WORLD, {}, Layout::Contiguous, {});
    }, on_bad + "out and v share memory");
  }
  Tensor<float> dout = normal<float>({hq, 3, 8}, 4), lse({hq, 3}), dq({hq, 3, 8}), dk({hkv, 3, 8}), dv({hkv, 3, 8});
  ring_attention<float, float>(q.view(), k.view(), v_heads, out.view(), MPI_COMM_WORLD, {}, Layout::Contiguous,
                               lse.view());
  expect_error_on_every_rank([&] {
    ring_attention_backward<float>(q.view(), k.view(), v_heads, dout.view(), out.view(), lse.view(),
                                   r == bad ? dout.view() : dq.view(), dk.view(), dv.view(), MPI_COMM_WORLD);
  }, on_bad + "dq and dout share memory");
}

TEST(ContextParallel, OptionsThatDifferBetweenRanksAreAnError) {
  const int w = world_size(), r = world_rank();
  if (w == 1) GTEST_SKIP() << "needs two ranks";
  const Tensor<float> q = normal<float>({2 * w, 3, 8}, 1), k = normal<float>({w, 3, 8}, 2);
  Tensor<float> out({2 * w, 3, 8});
  const AttentionOptions options{.softcap = r == 1 ? 2.0 : 0.0};
  try {
    ring_attention<float, float>(q.view(), k.view(), k.view(), out.view(), MPI_COMM_WORLD, options);
    ADD_FAILURE() << "no error";
  } catch (const ValueError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("options.softcap"), std::string::npos) << message;
    EXPECT_NE(message.find("on rank 1"), std::string::npos) << message;
  }
}

TEST(ContextParallel, ZigzagRefusesLengthsItCannotCut) {
  const int w = world_size();
  // Odd lengths on every rank; and, with two ranks or more, even lengths
  // that differ between ranks.
  for (const int64_t rows : {int64_t{3}, int64_t{2 + 2 * (world_rank() % 2)}}) {
  if (rows % 2 == 0 && w == 1) continue;
  const Tensor<float> q = normal<float>({2 * w, rows, 8}, 1), k = normal<float>({w, rows, 8}, 2);
  Tensor<float> out({2 * w, rows, 8});
  for (Strategy s : kStrategies) {
    auto f = s == Strategy::Ring ? ring_attention<float, float> : ulysses_attention<float, float>;
    try {
      f(q.view(), k.view(), k.view(), out.view(), MPI_COMM_WORLD, {}, Layout::Zigzag, {});
      ADD_FAILURE() << "no error";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("divisible by 2W = " + std::to_string(2 * w)), std::string::npos)
          << e.what();
    }
  }
  }
}

TEST(ContextParallel, UlyssesRefusesIndivisibleHeads) {
  const int w = world_size();
  const Tensor<float> q = normal<float>({2 * w + 1, 3, 8}, 1), k = normal<float>({2 * w + 1, 3, 8}, 2);
  Tensor<float> out({2 * w + 1, 3, 8});
  if (w > 1) {
    EXPECT_THROW((ulysses_attention<float, float>(q.view(), k.view(), k.view(), out.view(), MPI_COMM_WORLD)),
                 ValueError);
  }
}

TEST(ContextParallel, LayoutNames) {
  EXPECT_EQ(parse_layout("zigzag"), Layout::Zigzag);
  EXPECT_EQ(layout_name(parse_layout("contiguous")), "contiguous");
  EXPECT_THROW(parse_layout("striped"), ValueError);
}

}  // namespace
}  // namespace attn::dist
