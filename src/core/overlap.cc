// Whether views overlap: a bounded integer search, as NumPy's
// solve_may_share_memory does it. Two views share a byte when
//   Σ a_i x_i − Σ b_j y_j  lies in  (b0 − a0 − item_a, b0 − a0 + item_b)
// for indices in their shapes. Every term is made c·z with c > 0 and
// 0 <= z <= u (a negative stride counts from the other end), and the terms
// are searched from the largest c down, pruned by the reach of the rest and
// by the greatest common divisor of the rest (which settles interleaved
// views at once).
#include <algorithm>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "attn/tensor.hpp"

namespace attn {
namespace {

__extension__ typedef __int128 Wide;  // sums of byte offsets cannot overflow it

struct Term {
  Wide c;  // > 0
  Wide u;  // z in [0, u]
};

Wide floor_div(Wide a, Wide b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }
Wide ceil_div(Wide a, Wide b) { return -floor_div(-a, b); }

class BoundedSum {
 public:
  // Terms may have any c > 0; equal ones are merged (z1 + z2 spans [0, u1 + u2]).
  explicit BoundedSum(std::vector<Term> terms) {
    std::sort(terms.begin(), terms.end(), [](const Term& x, const Term& y) { return x.c > y.c; });
    for (const Term& t : terms) {
      if (!terms_.empty() && terms_.back().c == t.c) terms_.back().u += t.u;
      else terms_.push_back(t);
    }
    reach_.assign(terms_.size() + 1, 0);
    gcd_.assign(terms_.size() + 1, 0);
    for (size_t k = terms_.size(); k-- > 0;) {
      reach_[k] = reach_[k + 1] + terms_[k].c * terms_[k].u;
      gcd_[k] = std::gcd(static_cast<int64_t>(terms_[k].c), static_cast<int64_t>(gcd_[k + 1]));
    }
  }
  // Whether some z gives a sum in [lo, hi]; nullopt when the search ran out.
  std::optional<bool> reaches(Wide lo, Wide hi) {
    work_ = 1 << 20;
    const int r = solve(0, lo, hi);
    if (r < 0) return std::nullopt;
    return r == 1;
  }

 private:
  // 1: yes, 0: no, -1: out of work.
  int solve(size_t k, Wide lo, Wide hi) {
    lo = std::max<Wide>(lo, 0);
    hi = std::min(hi, reach_[k]);
    if (lo > hi) return 0;
    if (k == terms_.size()) return 1;  // (lo <= 0 <= hi here)
    const Wide g = gcd_[k];
    if (ceil_div(lo, g) * g > hi) return 0;  // no multiple of the rest's divisor in range
    const Wide c = terms_[k].c, rest = reach_[k + 1];
    const Wide first = std::max<Wide>(0, ceil_div(lo - rest, c)), last = std::min(terms_[k].u, floor_div(hi, c));
    for (Wide z = first; z <= last; ++z) {
      if (--work_ < 0) return -1;
      if (const int r = solve(k + 1, lo - c * z, hi - c * z)) return r;
    }
    return 0;
  }

  std::vector<Term> terms_;
  std::vector<Wide> reach_, gcd_;
  int64_t work_ = 0;
};

bool empty(const MemorySpan& m) {
  for (int a = 0; a < m.rank; ++a)
    if (m.shape[a] == 0) return true;
  return false;
}

Wide byte_stride(const MemorySpan& m, int a) { return Wide(m.strides[a]) * m.item_bytes; }

// The lowest and one past the highest byte of a non-empty view.
std::pair<Wide, Wide> bounds(const MemorySpan& m) {
  Wide lo = reinterpret_cast<uintptr_t>(m.data), hi = lo;
  for (int a = 0; a < m.rank; ++a) {
    const Wide step = byte_stride(m, a) * (m.shape[a] - 1);
    (step < 0 ? lo : hi) += step;
  }
  return {lo, hi + m.item_bytes};
}

// Adds sign · stride · x for x in [0, n − 1] as a positive term; returns the
// constant the sum is shifted by.
Wide add_term(std::vector<Term>& terms, Wide signed_stride, int64_t n) {
  if (n <= 1 || signed_stride == 0) return 0;
  const Wide u = n - 1;
  if (signed_stride > 0) {
    terms.push_back({signed_stride, u});
    return 0;
  }
  terms.push_back({-signed_stride, u});
  return signed_stride * u;  // s·x = |s|·(u − x) − |s|·u
}

// shares_memory and overlaps_itself: nullopt when the search ran out.
std::optional<bool> shares(const MemorySpan& a, const MemorySpan& b) {
  if (empty(a) || empty(b)) return false;
  const auto [a_lo, a_hi] = bounds(a);
  const auto [b_lo, b_hi] = bounds(b);
  if (a_hi <= b_lo || b_hi <= a_lo) return false;
  std::vector<Term> terms;
  Wide shift = 0;
  for (int i = 0; i < a.rank; ++i) shift += add_term(terms, byte_stride(a, i), a.shape[i]);
  for (int j = 0; j < b.rank; ++j) shift += add_term(terms, -byte_stride(b, j), b.shape[j]);
  const Wide gap = Wide(reinterpret_cast<uintptr_t>(b.data)) - Wide(reinterpret_cast<uintptr_t>(a.data));
  return BoundedSum(std::move(terms)).reaches(gap - a.item_bytes + 1 - shift, gap + b.item_bytes - 1 - shift);
}

struct Axis {
  Wide stride;  // |stride| in bytes
  int64_t n;
};

std::optional<bool> folds(const MemorySpan& m) {
  if (empty(m)) return false;
  // The axes of two or more, on the stack for any real rank.
  constexpr int kOnStack = 16;
  Axis stack[kOnStack];
  std::vector<Axis> heap(m.rank > kOnStack ? static_cast<size_t>(m.rank) : 0);
  Axis* axes = m.rank > kOnStack ? heap.data() : stack;
  int count = 0;
  for (int i = 0; i < m.rank; ++i)
    if (m.shape[i] > 1) {
      const Wide stride = byte_stride(m, i);
      if (stride == 0) return true;
      axes[count++] = {stride < 0 ? -stride : stride, m.shape[i]};
    }
  // Nested strides (each at least the extent of the smaller ones: every
  // C- or F-ordered array, slice or transpose of one) cannot overlap.
  std::sort(axes, axes + count, [](const Axis& x, const Axis& y) { return x.stride < y.stride; });
  Wide extent = m.item_bytes;
  bool nested = true;
  for (int k = 0; k < count; ++k) {
    if (axes[k].stride < extent) nested = false;
    extent += axes[k].stride * (axes[k].n - 1);
  }
  if (nested) return false;
  // Two indices x != x' share a byte iff d = x − x' != 0 has
  // |Σ s_i d_i| < item. d and −d both do, so the first axis (in this order)
  // where d is not 0 may be taken to add |s_k|·|d_k|, |d_k| in [1, n_k − 1];
  // the later ones add s_j·d_j, d_j in [−(n_j − 1), n_j − 1].
  for (int k = 0; k < count; ++k) {
    std::vector<Term> terms;
    Wide shift = axes[k].stride;  // d_k = 1 + z
    if (axes[k].n > 2) terms.push_back({axes[k].stride, axes[k].n - 2});
    for (int j = k + 1; j < count; ++j) {
      terms.push_back({axes[j].stride, 2 * Wide(axes[j].n - 1)});  // d_j = z − (n_j − 1)
      shift -= axes[j].stride * (axes[j].n - 1);
    }
    const std::optional<bool> r =
        BoundedSum(std::move(terms)).reaches(-(m.item_bytes - 1) - shift, m.item_bytes - 1 - shift);
    if (!r || *r) return r;
  }
  return false;
}

}  // namespace

bool shares_memory(const MemorySpan& a, const MemorySpan& b) { return shares(a, b).value_or(true); }

bool overlaps_itself(const MemorySpan& a) { return folds(a).value_or(true); }

bool same_elements(const MemorySpan& a, const MemorySpan& b) {
  return a.data == b.data && a.rank == b.rank && a.item_bytes == b.item_bytes &&
         std::equal(a.shape, a.shape + a.rank, b.shape) && std::equal(a.strides, a.strides + a.rank, b.strides);
}

void check_outputs(const char* function, std::span<const NamedSpan> outputs, std::span<const NamedSpan> inputs) {
  const auto layout = [](const MemorySpan& m) {
    return "shape " + shape_str(Shape(m.shape, m.shape + m.rank)) + ", strides " +
           shape_str(Strides(m.strides, m.strides + m.rank));
  };
  const auto prefix = [&] { return *function ? std::string(function) + ": " : std::string(); };
  for (size_t o = 0; o < outputs.size(); ++o) {
    const NamedSpan& out = outputs[o];
    if (!out.span.data) continue;
    if (const auto r = folds(out.span); !r || *r)
      throw ValueError(prefix() + out.name + " (" + layout(out.span) + ") " + (r ? "has" : "may have") +
                       " elements that share memory: an output needs memory of its own for every element");
    const auto refuse = [&](const NamedSpan& other, const char* kind) {
      if (!other.span.data) return;
      if (const auto r = shares(out.span, other.span); !r || *r)
        throw ValueError(prefix() + out.name + " and " + other.name + (r ? " share" : " may share") + " memory (" +
                         layout(out.span) + " and " + layout(other.span) + "): an output must not overlap " + kind +
                         "; pass a buffer of its own");
    };
    for (const NamedSpan& in : inputs) refuse(in, "an input");
    for (size_t other = 0; other < o; ++other) refuse(outputs[other], "another output");
  }
}

}  // namespace attn
