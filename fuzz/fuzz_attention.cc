// attention() on fuzzed shapes, strides, masks, options (ALiBi's slopes
// among them) and values. Every
// call either refuses with attn::Error or writes its outputs and nothing else
// (guard cells intact). The float32 kernel (float32, bfloat16 or fp16 keys
// and values) and the float64 reference accept exactly the same calls; on
// finite inputs they agree within float32 error, and otherwise they agree on
// which outputs are NaN. Sizes stay small (at most ~10^5 elements).
#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <random>

#include "fuzz_input.hpp"

using namespace attn;
using fuzz::Strided;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Shape of rank `rank` ending in (heads, rows, cols), batch axes in front.
Shape shaped(int rank, int64_t batch, int64_t heads, int64_t rows, int64_t cols) {
  const Shape full{batch, batch, heads, rows, cols};
  return Shape(full.end() - rank, full.end());
}

// Sometimes one dimension changes to a small arbitrary value.
void perturb(Shape& s, fuzz::Input& in) {
  if (in.byte() < 24 && !s.empty()) s[in.in(0, static_cast<int64_t>(s.size()) - 1)] = in.in(0, 9);
}

// The values of one case, in visiting order, already representable in
// float32 (and in the 16-bit key/value storage), so both precisions see the
// same numbers.
struct Values {
  std::vector<double> q, k, v, mask;
  bool finite = true;
  // docs/semantics.md "Numeric edge cases": a non-finite value in v reaches the rows that weigh
  // it, and in float32 possibly rows that weigh it 0 (0 · ∞ is NaN).
  bool special_in_v = false;
};

struct Case {
  Shape q, k, v, out, weights, mask;
  int q_layout, k_layout, v_layout, out_layout, weights_layout, mask_layout;
  bool want_weights;
  bool want_lse = false;
  std::optional<Logits> logits_stage;
  int mask_kind;  // 0 none, 1 bool, 2 float, 3 double
  AttentionOptions options;
  Values values;
};

Case read_case(fuzz::Input& in, int kv_bits) {
  Case c;
  const int rank = static_cast<int>(in.in(1, 5));  // 2..4 are valid
  const int64_t batch = in.in(1, 2), hq = in.in(0, 4), hkv = in.in(1, 4);
  const int64_t n_q = in.in(0, 9), d = in.in(0, 9), d_v = in.in(0, 9);
  // Now and then more keys than one split-KV chunk (512): the decode kernel.
  const int64_t n_k = in.byte() < 32 ? 500 + in.in(0, 255) : in.in(0, 9);
  c.q = shaped(rank, batch, hq, n_q, d);
  c.k = shaped(rank, batch, hkv, n_k, d);
  c.v = shaped(rank, batch, hkv, n_k, d_v);
  perturb(in.flag() ? c.q : in.flag() ? c.k : c.v, in);
  // What the library says the outputs are, or a plausible guess when it refuses.
  Shape out = shaped(rank, batch, hq, n_q, d_v), weights = shaped(rank, batch, hq, n_q, n_k);
  fuzz::accepted([&] {
    out = attention_output_shape(c.q, c.k, c.v);
    weights = attention_weights_shape(c.q, c.k, c.v);
  });
  c.out = out;
  perturb(c.out, in);
  c.want_weights = in.byte() < 64;
  c.weights = weights;
  if (c.want_weights) perturb(c.weights, in);
  c.mask_kind = static_cast<int>(in.in(0, 3));
  if (c.mask_kind) {
    // A suffix of the logits' shape, axes broadcast (1) or now and then wrong.
    const int64_t rank_m = in.in(0, static_cast<int64_t>(weights.size()) + 1);
    for (int64_t a = 0; a < rank_m; ++a) {
      const int64_t from = static_cast<int64_t>(weights.size()) - rank_m + a;
      const uint8_t choice = in.byte();
      c.mask.push_back(from < 0 || choice < 64 ? 1 : choice < 72 ? in.in(0, 9) : weights[from]);
    }
  }
  for (int* layout : {&c.q_layout, &c.k_layout, &c.v_layout, &c.out_layout, &c.weights_layout,
                      &c.mask_layout})
    *layout = static_cast<int>(in.in(0, fuzz::kLayouts - 1));

  const std::optional<double> scales[] = {std::nullopt, std::nullopt, 0.5, 0.0, -2.0,
                                          1e30, kNaN, kInf};
  c.options.scale = in.pick(scales);
  const Causal causals[] = {Causal::None, Causal::BottomRight, Causal::TopLeft};
  c.options.causal = in.pick(causals);
  const int64_t windows[] = {-1, -1, 0, 1, 3, -2, std::numeric_limits<int64_t>::max()};
  c.options.window = {in.pick(windows), in.pick(windows)};
  const double softcaps[] = {0, 0, 0, 5, 30, -1, kNaN, kInf};
  c.options.softcap = in.pick(softcaps);

  // Values: uniform in [-1, 1] from a fuzzed seed, plus at most one special
  // value at a fuzzed place in q, k or v.
  std::mt19937 rng(in.u32());
  std::uniform_real_distribution<float> uniform(-1, 1);
  const auto representable = [&](float x, bool stored_in_16_bits) -> double {
    if (!stored_in_16_bits || kv_bits == 0) return x;
    return kv_bits == 1 ? bf16_to_float(float_to_bf16(x)) : fp16_to_float(float_to_fp16(x));
  };
  const auto draw = [&](const Shape& s, bool kv) {
    std::vector<double> out(static_cast<size_t>(checked_numel(s, 8, "fuzz")));
    for (double& x : out) x = representable(uniform(rng), kv);
    return out;
  };
  c.values.q = draw(c.q, false);
  c.values.k = draw(c.k, true);
  c.values.v = draw(c.v, true);
  const double specials[] = {kNaN, kInf, -kInf, 1e30, -1e30};
  const uint8_t where = in.byte();
  if (where < 96) {
    std::vector<double>& t = where % 3 == 0 ? c.values.q : where % 3 == 1 ? c.values.k : c.values.v;
    const double special = in.pick(specials);
    if (!t.empty()) t[in.u32() % t.size()] = representable(static_cast<float>(special), &t != &c.values.q);
    c.values.finite = false;
    c.values.special_in_v = &t == &c.values.v;
  }
  const double mask_values[] = {0, 0, 0, -1, 0.5, -kInf};
  c.values.mask.resize(static_cast<size_t>(checked_numel(c.mask, 8, "fuzz")));
  for (double& m : c.values.mask) m = c.mask_kind == 1 ? rng() % 5 != 0 : mask_values[rng() % 6];

  // ALiBi (read last, so that the older corpus keeps its meaning): a slope
  // per query head, now and then a wrong count or a slope that is not finite.
  if (in.byte() >= 160) {
    const double slopes[] = {0.5, 0.25, 1.0 / 256, 0, -0.5, 2, 1e30, kNaN, kInf};
    const int64_t count = in.byte() < 240 ? (rank >= 3 ? hq : 1) : in.in(0, 5);
    for (int64_t h = 0; h < count; ++h) c.options.alibi_slopes.push_back(in.pick(slopes));
  }
  // Then (read last likewise) a causal offset, now and then beyond its
  // bound, and the extras: the log-sum-exp and the logits at a stage.
  if (in.byte() >= 192) {
    const int64_t offsets[] = {-3, 0, 2, 7, 100, -(int64_t{1} << 62), (int64_t{1} << 62) + 1,
                               std::numeric_limits<int64_t>::max()};
    c.options.causal = Causal::offset(in.pick(offsets));
  }
  c.want_lse = in.byte() >= 128;
  const uint8_t stage = in.byte();
  if (stage >= 160) c.logits_stage = std::array{Logits::Scaled, Logits::Softcapped, Logits::Masked}[stage % 3];
  // Then sinks: a logit per query head, now and then a wrong count or one
  // that is not finite.
  if (in.byte() >= 192) {
    const double sinks[] = {0, 1, -2, 15, -15, kNaN, kInf};
    const int64_t count = in.byte() < 240 ? (rank >= 3 ? hq : 1) : in.in(0, 5);
    for (int64_t h = 0; h < count; ++h) c.options.sinks.push_back(in.pick(sinks));
  }
  return c;
}

// The case in words, for a finding's message.
std::string describe(const Case& c) {
  const auto& o = c.options;
  return "q " + shape_str(c.q) + " k " + shape_str(c.k) + " v " + shape_str(c.v) + " out " +
         shape_str(c.out) + (c.want_weights ? " weights " + shape_str(c.weights) : "") +
         " mask kind " + std::to_string(c.mask_kind) + " " + shape_str(c.mask) + " layouts " +
         std::to_string(c.q_layout) + std::to_string(c.k_layout) + std::to_string(c.v_layout) +
         std::to_string(c.out_layout) + std::to_string(c.mask_layout) + " scale " +
         (o.scale ? std::to_string(*o.scale) : "default") + " causal " +
         causal_name(o.causal) + " window " + std::to_string(o.window.left) +
         "," + std::to_string(o.window.right) + " softcap " + std::to_string(o.softcap) +
         " alibi slopes " + std::to_string(o.alibi_slopes.size()) + " sinks " + std::to_string(o.sinks.size()) +
         (c.want_lse ? " lse" : "") +
         (c.logits_stage ? " logits stage " + std::to_string(int(*c.logits_stage)) : "") +
         (c.values.finite ? "" : " with a non-finite value");
}

// Everything a call writes, in visiting order; nullopt when it refused.
template <class T>
struct Result {
  std::vector<T> out, weights, logits, lse;
};

template <class T, class KV>
std::optional<Result<T>> run(const Case& c, bool& guards_ok) {
  Strided<T> q(c.q, c.q_layout, true), out(c.out, c.out_layout, false);
  Strided<KV> k(c.k, c.k_layout, true), v(c.v, c.v_layout, true);
  Strided<T> weights(c.weights, c.weights_layout, false), logits(c.weights, c.weights_layout, false);
  Shape lse_shape = c.weights;
  if (!lse_shape.empty()) lse_shape.pop_back();
  Strided<T> lse(lse_shape, c.out_layout, false);
  const auto from = [](const std::vector<double>& values) {
    return [&values, i = size_t{0}]() mutable {
      const double x = values[i++];
      if constexpr (std::is_same_v<KV, bfloat16>) return KV{float_to_bf16(static_cast<float>(x))};
      else if constexpr (std::is_same_v<KV, float16>) return KV{float_to_fp16(static_cast<float>(x))};
      else return static_cast<KV>(x);
    };
  };
  q.fill([&, i = size_t{0}]() mutable { return static_cast<T>(c.values.q[i++]); });
  k.fill(from(c.values.k));
  v.fill(from(c.values.v));
  Strided<bool> mask_bool(c.mask, c.mask_layout, true);
  Strided<float> mask_float(c.mask, c.mask_layout, true);
  Strided<double> mask_double(c.mask, c.mask_layout, true);
  Mask mask;
  const auto fill_mask = [&](auto& m) {
    using M = typename std::remove_cvref_t<decltype(m)>::value_type;
    m.fill([&, i = size_t{0}]() mutable { return static_cast<M>(c.values.mask[i++]); });
    mask = m.cview();
  };
  if (c.mask_kind == 1) fill_mask(mask_bool);
  if (c.mask_kind == 2) fill_mask(mask_float);
  if (c.mask_kind == 3) fill_mask(mask_double);
  AttentionExtras<T> extras;
  if (c.want_weights) extras.weights = weights.view();
  if (c.logits_stage) extras.logits = logits.view(), extras.logits_stage = *c.logits_stage;
  if (c.want_lse) extras.lse = lse.view();
  const bool ok = fuzz::accepted([&] {
    AttentionPlan(q.cview(), k.cview(), v.cview(), c.options, mask).run(out.view(), extras);
  });
  guards_ok = out.guards_intact() && weights.guards_intact() && logits.guards_intact() && lse.guards_intact();
  if (!ok) return std::nullopt;
  const auto values = [](bool wanted, auto& t) { return wanted ? t.values() : std::vector<T>(); };
  return Result<T>{out.values(), values(c.want_weights, weights), values(c.logits_stage.has_value(), logits),
                   values(c.want_lse, lse)};
}

// finite: all inputs finite, so the values must agree; nan_pattern: NaN
// exactly where the reference has NaN.
template <class A, class B>
void compare(const std::vector<A>& got, const std::vector<B>& ref, bool finite, bool nan_pattern,
             const std::string& what) {
  for (size_t i = 0; i < ref.size(); ++i) {
    const double a = got[i], b = ref[i];
    if (nan_pattern && std::isnan(a) != std::isnan(b))
      fuzz::finding(what + ": float32 and float64 disagree on NaN at element " +
                    std::to_string(i) + ": " + std::to_string(a) + " vs " + std::to_string(b));
    // Entries are convex combinations of values in [-1, 1] (weights: in [0, 1]);
    // logits and log-sum-exps are below 20 in magnitude (without ALiBi), or
    // equal infinities.
    if (finite && a != b && !(std::fabs(a - b) <= 1e-4))
      fuzz::finding(what + ": float32 " + std::to_string(a) + " vs float64 " +
                    std::to_string(b) + " at element " + std::to_string(i));
  }
}

// Whether every scaled logit q·k·scale fits float32 comfortably. Beyond that
// range float32 logits overflow to ±inf where float64's stay finite (so, e.g.,
// +inf plus a -inf mask is NaN in float32 but -inf in float64): the two
// precisions compute different problems and only "no crash" is checked.
bool logits_fit_float32(const Case& c) {
  const auto max_abs = [](const std::vector<double>& values) {
    double m = 0;
    for (double x : values) m = std::fmax(m, std::fabs(x));
    return m;
  };
  const double d = static_cast<double>(c.q.empty() ? 0 : c.q.back());
  const double scale = c.options.scale.value_or(d > 0 ? 1 / std::sqrt(d) : 1);
  const double bound = std::fabs(scale) * max_abs(c.values.q) * max_abs(c.values.k) * d;
  return bound < 1e37;  // float32's max is 3.4e38
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const int kv_bits = static_cast<int>(in.in(0, 2));  // float32, bfloat16, fp16 keys/values
  const Case c = read_case(in, kv_bits);
  const auto run32 = [kv_bits](const Case& cc, bool& guards) {
    return kv_bits == 0   ? run<float, float>(cc, guards)
           : kv_bits == 1 ? run<float, bfloat16>(cc, guards)
                          : run<float, float16>(cc, guards);
  };
  bool guards64 = true, guards32 = true, guards_low = true;
  const auto ref = run<double, double>(c, guards64);
  const auto got = run32(c, guards32);
  // bf16 or int8 precision on the same case (their numbers are the unit
  // tests'): it accepts what float32 accepts and writes only in the views.
  Case low = c;
  low.options.precision = in.byte() < 128 ? Precision::BF16 : Precision::Int8;
  const auto got_low = run32(low, guards_low);
  if (!guards64 || !guards32 || !guards_low) fuzz::finding("attention wrote outside its output views");
  if (ref.has_value() != got.has_value())
    fuzz::finding(std::string("float64 ") + (ref ? "accepts" : "refuses") + " what float32 " +
                  (got ? "accepts" : "refuses"));
  if (got_low.has_value() != got.has_value())
    fuzz::finding(std::string("float32 ") + (got ? "accepts" : "refuses") + " what precision " +
                  precision_name(low.options.precision) + (got_low ? " accepts" : " refuses"));
  if (!ref) return 0;
  // Only a moderate scale keeps float32 logits within float32 error of float64's.
  // So does only a moderate ALiBi slope where there are sinks: float32 anchors
  // each row's bias at a key of its own (docs/semantics.md, ALiBi), which
  // shifts the sink's logit by slope · (p - anchor), kept to 2^-24 of that
  // shift; at a slope of 1e30 the shift swallows the sink and the scores.
  const bool moderate_alibi =
      c.options.sinks.empty() ||
      std::all_of(c.options.alibi_slopes.begin(), c.options.alibi_slopes.end(),
                  [](double a) { return std::fabs(a) <= 2; });
  const bool finite = c.values.finite && c.options.scale.value_or(1) <= 1 &&
                      c.options.scale.value_or(1) >= -2 && moderate_alibi;
  const bool in_range = logits_fit_float32(c);
  compare(got->out, ref->out, finite, in_range && !c.values.special_in_v, "out of " + describe(c));
  compare(got->weights, ref->weights, finite, in_range, "weights of " + describe(c));
  const bool small_logits = finite && c.options.alibi_slopes.empty();
  compare(got->logits, ref->logits, small_logits, in_range, "logits of " + describe(c));
  compare(got->lse, ref->lse, small_logits, in_range, "lse of " + describe(c));
  return 0;
}
