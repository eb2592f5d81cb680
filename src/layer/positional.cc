#include "attn/positional.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace attn {
namespace {

void check_base(double base, const char* what) {
  if (!(base > 0) || !std::isfinite(base))
    throw ValueError(std::string(what) + ": base must be a finite number > 0, got " +
                     std::to_string(base));
}

// A rope call checked once: the rotated width, each pair's M-RoPE section,
// and the positions as a view broadcast to x's rows.
struct RopePlan {
  int64_t d = 0, n = 0, r = 0, half = 0;
  Shape rows_shape;                // x's shape without its last axis
  std::vector<int64_t> section;    // per pair: its row of M-RoPE positions (all 0 without)
  int64_t sections = 1;
  // Positions: (rows_shape), or with M-RoPE sections (sections, rows_shape).
  TensorView<const int64_t> pos;
  bool has_positions = false;
  int64_t min_position = 0, max_position = 0;  // over every row (offset + 0..n-1 without positions)
};

// The smallest and largest value of a view (it has at least one element).
std::pair<int64_t, int64_t> value_range(const TensorView<const int64_t>& v) {
  const Tensor<int64_t> c = contiguous(v);
  const auto [lo, hi] = std::minmax_element(c.data(), c.data() + c.numel());
  return {*lo, *hi};
}

// Validates apply_rope's arguments (the tables' own shapes apart).
template <class T>
RopePlan plan_rope(const TensorView<const T>& x, const TensorView<T>& out, const RopeOptions& opt,
                   const TensorView<const int64_t>& positions, std::optional<int64_t> table_width) {
  if (x.rank() < 2)
    throw ValueError("rope: x must have shape (..., n, d), got " + shape_str(x.shape()));
  if (out.shape() != x.shape())
    throw ValueError("rope: out has shape " + shape_str(out.shape()) +
                     ", expected x's shape " + shape_str(x.shape()));
  {
    const NamedSpan in[] = {{"positions", MemorySpan::of(positions)}, {"x", MemorySpan::of(x)}},
                    o[] = {{"out", MemorySpan::of(out)}};
    check_outputs("rope", o, std::span(in, same_elements(in[1].span, o[0].span) ? 1 : 2));  // (x itself: in place)
  }
  check_base(opt.base, "rope");
  RopePlan p;
  p.d = x.dim(-1);
  p.n = x.dim(-2);
  const double prf = opt.scaling.partial_rotary_factor;
  const auto partial = static_cast<int64_t>(double(p.d) * prf);  // int(head_dim * factor), as Hugging Face
  const char* from = prf != 1 ? " (int(d * partial_rotary_factor))" : " (the default, all of d)";
  p.r = opt.rotary_dim.value_or(partial);
  // Tables of another width than rotary_dim / 2 are refused, as ONNX's
  // reference refuses them: narrower ones rotated part of the head silently.
  if (table_width && p.r != 2 * *table_width)
    throw ValueError("rope: the cos/sin tables are " + std::to_string(*table_width) + " wide, but rotary_dim / 2 is " +
                     std::to_string(p.r / 2) + " (rotary_dim " + std::to_string(p.r) + (opt.rotary_dim ? "" : from) +
                     "): they must match; pass tables of width " + std::to_string(p.r / 2) +
                     (2 * *table_width <= p.d ? ", or rotary_dim=" + std::to_string(2 * *table_width) +
                                                    " to rotate the first " + std::to_string(2 * *table_width) +
                                                    " features only"
                                              : std::string()));
  if (opt.rotary_dim && prf != 1 && *opt.rotary_dim != partial)
    throw ValueError("rope: rotary_dim " + std::to_string(*opt.rotary_dim) +
                     " contradicts partial_rotary_factor " + std::to_string(prf) + " of d=" +
                     std::to_string(p.d) + " (" + std::to_string(partial) + ")");
  if (p.r < 0 || p.r > p.d || p.r % 2 != 0)
    throw ValueError("rope: rotary_dim must be even and in [0, d=" + std::to_string(p.d) + "], got " +
                     std::to_string(p.r) + (opt.rotary_dim ? "" : std::string(from) + "; pass an even rotary_dim"));
  p.half = p.r / 2;
  p.section.assign(static_cast<size_t>(p.half), 0);
  if (const auto& ms = opt.scaling.mrope_section; !ms.empty()) {
    int64_t total = 0;
    for (int64_t s : ms) {
      if (s < 0) throw ValueError("rope: mrope_section sizes must be >= 0, got " + std::to_string(s));
      total += s;
    }
    if (total != p.half)
      throw ValueError("rope: mrope_section must add up to rotary_dim / 2 = " + std::to_string(p.half) +
                       " frequency pairs, got a total of " + std::to_string(total));
    p.sections = static_cast<int64_t>(ms.size());
    for (int64_t s = 0, k = 0; s < p.sections; ++s)
      for (int64_t e = 0; e < ms[s]; ++e) p.section[k++] = s;
  }
  p.rows_shape.assign(x.shape().begin(), x.shape().end() - 1);
  p.has_positions = !positions.empty_view();
  if (p.has_positions) {
    if (opt.scaling.mrope_section.empty()) {
      p.pos = TensorView<const int64_t>(
          positions.data(), p.rows_shape,
          broadcast_strides(positions.shape(), positions.strides(), p.rows_shape, "rope: positions"));
    } else {
      // (sections, ...): each section's row broadcast to x's rows.
      if (positions.rank() < 1 || positions.dim(0) != p.sections)
        throw ValueError("rope: with mrope_section of " + std::to_string(p.sections) +
                         " sections, positions must be (" + std::to_string(p.sections) +
                         ", ..., n), one row per section, got " + shape_str(positions.shape()));
      const Shape row(positions.shape().begin() + 1, positions.shape().end());
      const Strides row_strides(positions.strides().begin() + 1, positions.strides().end());
      Strides strides = broadcast_strides(row, row_strides, p.rows_shape, "rope: positions[s]");
      strides.insert(strides.begin(), positions.stride(0));
      Shape target = p.rows_shape;
      target.insert(target.begin(), p.sections);
      p.pos = TensorView<const int64_t>(positions.data(), target, strides);
    }
    if (positions.numel() > 0) std::tie(p.min_position, p.max_position) = value_range(positions);
  } else if (p.n > 0) {
    if (opt.offset > std::numeric_limits<int64_t>::max() - (p.n - 1))
      throw ValueError("rope: positions offset + 0.." + std::to_string(p.n - 1) +
                       " overflow int64 (offset " + std::to_string(opt.offset) + ")");
    p.min_position = opt.offset;
    p.max_position = opt.offset + (p.n - 1);  // (offset + n may overflow: the last position just fits)
  }
  return p;
}

// Turns pair k of each row by the angle whose cos and sin `angles` gives:
// angles(index) returns pointers (c, s) to them for the row at `index` (x's
// index without its last axis), the sine already times the direction (+1
// for RoPE, -1 for its backward: a rotation's transpose is the rotation by
// -angle) and both times the attention factor.
template <class T, class Angles>
void rotate_rows(const TensorView<const T>& x, const TensorView<T>& out, const RopeOptions& opt,
                 const RopePlan& p, Angles&& angles) {
  const int lead = x.rank() - 1;
  const int64_t rows = numel_of(p.rows_shape), half = p.half;
  const int64_t sx = x.stride(-1), so = out.stride(-1);
  std::vector<int64_t> index(lead + 1, 0);
  for (int64_t row = 0; row < rows; ++row) {
    const auto [c, s] = angles(index.data());
    const T* xr = &x.at(index.data());
    T* yr = &out.at(index.data());
    for (int64_t k = 0; k < half; ++k) {
      const int64_t a = opt.interleaved ? 2 * k : k;
      const int64_t b = opt.interleaved ? 2 * k + 1 : k + half;
      const double xa = xr[a * sx], xb = xr[b * sx];
      yr[a * so] = static_cast<T>(xa * c[k] - xb * s[k]);
      yr[b * so] = static_cast<T>(xb * c[k] + xa * s[k]);
    }
    for (int64_t f = p.r; f < p.d; ++f) yr[f * so] = xr[f * sx];
    for (int a = lead - 1; a >= 0; --a) {
      if (++index[a] < x.dim(a)) break;
      index[a] = 0;
    }
  }
}

// The row's position of each section: positions[s, index...].
void row_positions(const RopePlan& p, const int64_t* index, int64_t* out) {
  const int lead = static_cast<int>(p.rows_shape.size());
  const int first = p.pos.rank() - lead;  // 1 with M-RoPE sections, else 0
  int64_t off = 0;
  for (int a = 0; a < lead; ++a) off += index[a] * p.pos.stride(first + a);
  for (int64_t s = 0; s < p.sections; ++s) out[s] = p.pos.data()[off + (first ? s * p.pos.stride(0) : 0)];
}

// RoPE with computed angles: rope_frequencies for the options, the sequence
// length the largest position + 1.
template <class T>
void rope_computed(TensorView<const T> x, TensorView<T> out, const RopeOptions& opt,
                   TensorView<const int64_t> positions, double direction) {
  const RopePlan p = plan_rope(x, out, opt, positions, std::nullopt);
  const int64_t max = p.max_position;
  const int64_t seq_len = max == std::numeric_limits<int64_t>::max() ? max : max + 1;
  const RopeFrequencies f = rope_frequencies(p.r, opt.base, opt.scaling, seq_len);
  const int64_t half = p.half;
  const double af = f.attention_factor;
  // An angle position × frequency beyond double's range has no cosine (NaN):
  // refused, naming the two, before anything is written.
  const double farthest = std::max(std::fabs(double(p.min_position)), std::fabs(double(p.max_position)));
  for (double w : f.inv_freq)
    if (!std::isfinite(farthest * w))
      throw ValueError("rope: the angle position × frequency overflows: position " +
                       std::to_string(std::fabs(double(p.min_position)) > std::fabs(double(p.max_position))
                                          ? p.min_position : p.max_position) +
                       " times frequency " + std::to_string(w));
  // Angles in double: exact enough at position 1e6 and beyond.
  const auto fill = [&](const int64_t* pos, double* c, double* s) {
    for (int64_t k = 0; k < half; ++k) {
      const double theta = double(pos[p.section[k]]) * f.inv_freq[k];
      c[k] = af * std::cos(theta);
      s[k] = direction * af * std::sin(theta);
    }
  };
  std::vector<double> c(half), s(half);
  if (!p.has_positions) {
    // Positions offset + t repeat for every head and batch entry: one table
    // of n rows of cos/sin serves them all.
    std::vector<double> tc(static_cast<size_t>(p.n * half)), ts(tc.size());
    std::vector<int64_t> same(static_cast<size_t>(p.sections));  // every section at the row's position
    for (int64_t t = 0; t < p.n; ++t) {
      std::fill(same.begin(), same.end(), opt.offset + t);
      fill(same.data(), tc.data() + t * half, ts.data() + t * half);
    }
    const int lead = static_cast<int>(p.rows_shape.size());
    rotate_rows(x, out, opt, p, [&](const int64_t* index) {
      const int64_t t = index[lead - 1];  // (half may be 0: no element)
      return std::pair{tc.data() + t * half, ts.data() + t * half};
    });
    return;
  }
  // Given positions: computed per row, reused while consecutive rows share them.
  std::vector<int64_t> pos(p.sections), last(p.sections);
  bool have = false;
  rotate_rows(x, out, opt, p, [&](const int64_t* index) {
    row_positions(p, index, pos.data());
    if (!have || pos != last) {
      fill(pos.data(), c.data(), s.data());
      last = pos;
      have = true;
    }
    return std::pair{c.data(), s.data()};
  });
}

// RoPE with explicit cos/sin tables.
template <class T>
void rope_tables(TensorView<const T> x, TensorView<T> out, const RopeTables<T>& tables,
                 const RopeOptions& opt, TensorView<const int64_t> positions, double direction) {
  const TensorView<const T>& tc = tables.cos;
  const TensorView<const T>& ts = tables.sin;
  if (tc.rank() < 2 || tc.shape() != ts.shape())
    throw ValueError("rope: cos and sin tables must have one shape, (max_position + 1, rotary_dim / 2) "
                     "or (..., n, rotary_dim / 2), got cos " + shape_str(tc.shape()) + " and sin " +
                     shape_str(ts.shape()));
  RopeScaling sections_only;
  sections_only.mrope_section = opt.scaling.mrope_section;
  if (!(opt.scaling == sections_only))
    throw ValueError("rope: rope_scaling '" + rope_type_name(opt.scaling.rope_type) +
                     "' with explicit cos/sin tables: tables are used as given, so bake the scaling "
                     "into them (only mrope_section applies)");
  check_outputs("rope", {{"out", MemorySpan::of(out)}},
                        {{"cos", MemorySpan::of(tc)}, {"sin", MemorySpan::of(ts)}});
  const RopePlan p = plan_rope(x, out, opt, positions, tc.dim(-1));
  const int64_t half = p.half;
  std::vector<double> c(half), s(half);
  if (p.has_positions) {
    if (tc.rank() != 2)
      throw ValueError("rope: with positions, the cos and sin tables must be (max_position + 1, "
                       "rotary_dim / 2), got " + shape_str(tc.shape()));
    const int64_t rows = tc.dim(0);
    if (p.pos.numel() > 0 && (p.min_position < 0 || p.max_position >= rows))
      throw ValueError("rope: position " +
                       std::to_string(p.min_position < 0 ? p.min_position : p.max_position) +
                       " is outside the cos/sin tables, which hold positions 0.." +
                       std::to_string(rows - 1));
    std::vector<int64_t> pos(p.sections);
    rotate_rows(x, out, opt, p, [&](const int64_t* index) {
      row_positions(p, index, pos.data());
      for (int64_t k = 0; k < half; ++k) {
        const int64_t row = pos[p.section[k]];
        c[k] = double(tc.at({row, k}));
        s[k] = direction * double(ts.at({row, k}));
      }
      return std::pair{c.data(), s.data()};
    });
    return;
  }
  if (!opt.scaling.mrope_section.empty())
    throw ValueError("rope: mrope_section needs positions, one row per section");
  if (opt.offset != 0)
    throw ValueError("rope: offset " + std::to_string(opt.offset) +
                     " with tables and no positions: the tables' rows are x's rows; pass positions "
                     "to index them");
  // The tables broadcast to (rows_shape, half).
  Shape target = p.rows_shape;
  target.push_back(half);
  const TensorView<const T> bc(tc.data(), target, broadcast_strides(tc.shape(), tc.strides(), target, "rope: cos"));
  const TensorView<const T> bs(ts.data(), target, broadcast_strides(ts.shape(), ts.strides(), target, "rope: sin"));
  const int lead = static_cast<int>(p.rows_shape.size());
  std::vector<int64_t> at(lead + 1);
  rotate_rows(x, out, opt, p, [&](const int64_t* index) {
    std::copy(index, index + lead, at.begin());
    for (int64_t k = 0; k < half; ++k) {
      at[lead] = k;
      c[k] = double(bc.at(at.data()));
      s[k] = direction * double(bs.at(at.data()));
    }
    return std::pair{c.data(), s.data()};
  });
}

template <class T>
Tensor<T> rope_alloc(TensorView<const T> x, const RopeOptions& opt,
                     TensorView<const int64_t> positions, const RopeTables<T>* tables,
                     double direction) {
  Tensor<T> out(x.shape());
  if (tables) rope_tables<T>(x, out.view(), *tables, opt, positions, direction);
  else rope_computed<T>(x, out.view(), opt, positions, direction);
  return out;
}

}  // namespace

template <class T>
Tensor<T> sinusoidal_encoding(int64_t n, int64_t d, double base) {
  if (n < 0) throw ValueError("positional_encoding: n must be >= 0, got " + std::to_string(n));
  if (d < 1) throw ValueError("positional_encoding: d must be >= 1, got " + std::to_string(d));
  check_base(base, "positional_encoding");
  Tensor<T> pe({n, d});
  sinusoidal_encoding(pe.view(), base);
  return pe;
}

template <class T>
void sinusoidal_encoding(TensorView<T> out, double base) {
  if (out.rank() != 2 || out.dim(1) < 1)
    throw ValueError("positional_encoding: out must be (n, d) with d >= 1, got shape " +
                     shape_str(out.shape()));
  check_base(base, "positional_encoding");
  check_outputs("positional_encoding", {{"out", MemorySpan::of(out)}}, {});
  const int64_t n = out.dim(0), d = out.dim(1);
  for (int64_t i = 0; i < d; ++i) {
    const double denom = std::pow(base, double(2 * (i / 2)) / double(d));
    for (int64_t p = 0; p < n; ++p) {
      const double angle = double(p) / denom;
      out.data()[p * out.stride(0) + i * out.stride(1)] =
          static_cast<T>(i % 2 == 0 ? std::sin(angle) : std::cos(angle));
    }
  }
}
template void sinusoidal_encoding<float>(TensorView<float>, double);
template void sinusoidal_encoding<double>(TensorView<double>, double);
template Tensor<float> sinusoidal_encoding<float>(int64_t, int64_t, double);
template Tensor<double> sinusoidal_encoding<double>(int64_t, int64_t, double);

template <Real T>
void apply_rope(TensorView<const T> x, TensorView<T> out, const RopeOptions& options,
                TensorView<const int64_t> positions) {
  rope_computed<T>(x, out, options, positions, 1);
}
template <Real T>
Tensor<T> apply_rope(TensorView<const T> x, const RopeOptions& options,
                     TensorView<const int64_t> positions) {
  return rope_alloc<T>(x, options, positions, nullptr, 1);
}
template <Real T>
void apply_rope(TensorView<const T> x, TensorView<T> out, const RopeTables<T>& tables,
                const RopeOptions& options, TensorView<const int64_t> positions) {
  rope_tables<T>(x, out, tables, options, positions, 1);
}
template <Real T>
Tensor<T> apply_rope(TensorView<const T> x, const RopeTables<T>& tables, const RopeOptions& options,
                     TensorView<const int64_t> positions) {
  return rope_alloc<T>(x, options, positions, &tables, 1);
}
template <Real T>
void rope_backward(TensorView<const T> dy, TensorView<T> dx, const RopeOptions& options,
                   TensorView<const int64_t> positions) {
  rope_computed<T>(dy, dx, options, positions, -1);
}
template <Real T>
Tensor<T> rope_backward(TensorView<const T> dy, const RopeOptions& options,
                        TensorView<const int64_t> positions) {
  return rope_alloc<T>(dy, options, positions, nullptr, -1);
}
template <Real T>
void rope_backward(TensorView<const T> dy, TensorView<T> dx, const RopeTables<T>& tables,
                   const RopeOptions& options, TensorView<const int64_t> positions) {
  rope_tables<T>(dy, dx, tables, options, positions, -1);
}
template <Real T>
Tensor<T> rope_backward(TensorView<const T> dy, const RopeTables<T>& tables,
                        const RopeOptions& options, TensorView<const int64_t> positions) {
  return rope_alloc<T>(dy, options, positions, &tables, -1);
}

std::vector<double> alibi_slopes(int64_t num_heads, double max_bias) {
  if (num_heads < 1 || num_heads > kMaxAlibiHeads)
    throw ValueError("alibi_slopes: num_heads must be in [1, " + std::to_string(kMaxAlibiHeads) + "], got " +
                     std::to_string(num_heads) + " (one slope per attention head)");
  if (!(max_bias > 0) || !std::isfinite(max_bias))
    throw ValueError("alibi_slopes: max_bias must be a finite number > 0, got " + std::to_string(max_bias));
  int64_t c = 1;  // the largest power of 2 <= num_heads
  while (c <= num_heads / 2) c *= 2;
  // m0^(h+1) and m1^(2(h-c)+1) with m0 = 2^(-max_bias/c), m1 = 2^(-max_bias/2c),
  // as one power of 2 each: exact where the paper's slopes are (2^-1 .. 2^-8).
  std::vector<double> slopes(static_cast<size_t>(num_heads));
  for (int64_t h = 0; h < num_heads; ++h)
    slopes[h] = h < c ? std::exp2(-max_bias * double(h + 1) / double(c))
                      : std::exp2(-max_bias / 2 * double(2 * (h - c) + 1) / double(c));
  return slopes;
}

#define ATTN_INSTANTIATE(T)                                                                     \
  template void apply_rope(TensorView<const T>, TensorView<T>, const RopeOptions&,             \
                           TensorView<const int64_t>);                                         \
  template Tensor<T> apply_rope(TensorView<const T>, const RopeOptions&, TensorView<const int64_t>); \
  template void apply_rope(TensorView<const T>, TensorView<T>, const RopeTables<T>&,           \
                           const RopeOptions&, TensorView<const int64_t>);                     \
  template Tensor<T> apply_rope(TensorView<const T>, const RopeTables<T>&, const RopeOptions&, \
                                TensorView<const int64_t>);                                    \
  template void rope_backward(TensorView<const T>, TensorView<T>, const RopeOptions&,          \
                              TensorView<const int64_t>);                                      \
  template Tensor<T> rope_backward(TensorView<const T>, const RopeOptions&,                    \
                                   TensorView<const int64_t>);                                 \
  template void rope_backward(TensorView<const T>, TensorView<T>, const RopeTables<T>&,        \
                              const RopeOptions&, TensorView<const int64_t>);                  \
  template Tensor<T> rope_backward(TensorView<const T>, const RopeTables<T>&, const RopeOptions&, \
                                   TensorView<const int64_t>);
ATTN_INSTANTIATE(float)
ATTN_INSTANTIATE(double)
#undef ATTN_INSTANTIATE

}  // namespace attn
