#include "sequence.hpp"

#include <algorithm>
#include <string>

#include "attn/error.hpp"

namespace attn::dist {

Layout parse_layout(const std::string& name) {
  if (name == "contiguous") return Layout::Contiguous;
  if (name == "zigzag") return Layout::Zigzag;
  throw ValueError("layout must be 'contiguous' or 'zigzag', got '" + name + "'");
}

std::string layout_name(Layout layout) {
  return layout == Layout::Zigzag ? "zigzag" : "contiguous";
}

void check_layout(Layout layout, const std::vector<int64_t>& lengths, const char* what) {
  if (layout != Layout::Zigzag) return;
  const auto world = static_cast<int64_t>(lengths.size());
  int64_t total = 0;
  for (int64_t n : lengths) total += n;
  const bool equal = std::all_of(lengths.begin(), lengths.end(), [&](int64_t n) { return n == lengths[0]; });
  if (!equal || lengths[0] % 2 != 0) {
    std::string list;
    for (int64_t n : lengths) list += (list.empty() ? "" : ", ") + std::to_string(n);
    throw ValueError(std::string("the zigzag layout cuts the sequence into 2W equal chunks, two per rank: ") +
                     what + "'s global length " + std::to_string(total) + " must be divisible by 2W = " +
                     std::to_string(2 * world) + " and every rank must hold two chunks, but the ranks hold " +
                     list + " rows");
  }
}

std::vector<Segment> rank_segments(Layout layout, const std::vector<int64_t>& lengths, int rank) {
  const auto world = static_cast<int64_t>(lengths.size());
  if (layout == Layout::Zigzag) {
    const int64_t chunk = lengths[0] / 2;
    return {{rank * chunk, 0, chunk}, {(2 * world - 1 - rank) * chunk, chunk, chunk}};
  }
  int64_t begin = 0;
  for (int r = 0; r < rank; ++r) begin += lengths[static_cast<size_t>(r)];
  return {{begin, 0, lengths[static_cast<size_t>(rank)]}};
}

namespace {

enum class Coverage { None, All, Some };

// Which keys of segment k the queries of segment q may see. In local
// indices every constraint of the global problem is an interval
// i + lo <= j <= i + hi (causal: hi from the diagonal; a window: lo and hi
// around the query's position), and a block's call expresses any such
// interval as Causal::offset(hi) with a left window of hi - lo.
struct PairMask {
  Coverage coverage;
  Causal causal = Causal::None;
  Window window;
};

PairMask pair_mask(const Segment& q, const Segment& k, int64_t n_q, int64_t n_k, Causal causal,
                   Window window) {
  using Wide = __int128;  // offsets up to 2^62 plus windows up to 2^63 cannot overflow
  const int64_t nq = q.length, nk = k.length;
  const Wide delta = Wide{q.global} - k.global;
  const Wide position = delta + causal.position(n_q, n_k);
  const bool has_lo = window.left >= 0;
  const bool has_hi = causal.masks() || window.right >= 0;
  Wide lo = has_lo ? position - window.left : 0;
  Wide hi = 0;
  if (causal.masks()) hi = delta + causal.diagonal(n_q, n_k);
  if (window.right >= 0) hi = causal.masks() ? std::min(hi, position + window.right) : position + window.right;
  if (nq == 0 || nk == 0 || (has_lo && lo > nk - 1) || (has_hi && hi < 1 - nq) ||
      (has_lo && has_hi && lo > hi))
    return {Coverage::None, Causal::None, {}};
  if ((!has_lo || lo <= 1 - nq) && (!has_hi || hi >= nk - 1)) return {Coverage::All, Causal::None, {}};
  // Clamped to where they change which keys are allowed: then they fit int64_t.
  lo = std::max<Wide>(lo, -nq);
  hi = has_hi ? std::min<Wide>(hi, nk) : std::max<Wide>(nk - 1, lo);
  return {Coverage::Some, Causal::offset(static_cast<int64_t>(hi)),
          Window{has_lo ? static_cast<int64_t>(hi - lo) : -1, -1}};
}

bool unmasked(const BlockCall& c) { return !c.causal.masks() && c.window.left < 0 && c.window.right < 0; }

}  // namespace

std::vector<BlockCall> block_calls(const std::vector<Segment>& q_segments,
                                   const std::vector<Segment>& k_segments, int64_t n_q, int64_t n_k,
                                   Causal causal, Window window, bool join) {
  // Per query segment, its calls, wholly visible key segments joined when adjacent.
  std::vector<std::vector<BlockCall>> rows;
  for (const Segment& q : q_segments) {
    std::vector<BlockCall> calls;
    for (const Segment& k : k_segments) {
      const PairMask m = pair_mask(q, k, n_q, n_k, causal, window);
      if (m.coverage == Coverage::None) continue;
      BlockCall call{q.local, q.length, k.local, k.length, m.causal, m.window, q.global, k.global};
      if (join && m.coverage == Coverage::All && !calls.empty() && unmasked(calls.back()) &&
          calls.back().k_begin + calls.back().k_length == k.local)
        calls.back().k_length += k.length;
      else
        calls.push_back(call);
    }
    rows.push_back(std::move(calls));
  }
  // Adjacent query segments that see the same keys wholly share one call.
  std::vector<BlockCall> calls;
  const BlockCall* previous = nullptr;
  for (const auto& row : rows) {
    const bool joins = join && previous && row.size() == 1 && unmasked(row[0]) && unmasked(*previous) &&
                       row[0].k_begin == previous->k_begin && row[0].k_length == previous->k_length &&
                       previous->q_begin + previous->q_length == row[0].q_begin;
    if (joins) {
      calls.back().q_length += row[0].q_length;
    } else {
      calls.insert(calls.end(), row.begin(), row.end());
    }
    previous = row.size() == 1 ? &calls.back() : nullptr;
  }
  return calls;
}

double position_shift(const BlockCall& call, Causal global, int64_t n_q, int64_t n_k) {
  using Wide = __int128;  // positions and offsets up to 2^62 each
  const Wide in_problem = Wide{call.q_global} + global.position(n_q, n_k) - call.k_global;
  return static_cast<double>(in_problem - call.causal.position(call.q_length, call.k_length));
}

}  // namespace attn::dist
