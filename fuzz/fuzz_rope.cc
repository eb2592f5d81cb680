// apply_rope() on fuzzed shapes, strides, positions and options, rope_scaling
// dicts (JSON built from choices, or raw bytes), M-RoPE sections and explicit
// cos/sin tables. Every call either refuses with attn::Error or writes its
// output and nothing else (guard cells intact). float32 and float64 accept
// the same calls and, as both compute in double (tables hold float32 values),
// float32 is float64 rounded. For a pure rotation (no tables, a scaling whose
// attention factor is 1), on finite input the output is finite, each rotated
// pair keeps its length, and rope_backward undoes the rotation.
#include <random>
#include <string>

#include "fuzz_input.hpp"

using namespace attn;
using fuzz::Strided;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

struct Case {
  Shape x, out, positions;
  int x_layout, out_layout, positions_layout;
  bool in_place, with_positions;
  RopeOptions options;
  std::vector<double> x_values;
  std::vector<int64_t> position_values;
  bool finite = true;
  std::string scaling;               // a rope_scaling dict's JSON text; empty: none
  std::vector<int64_t> mrope_section;
  Shape table;                       // explicit tables' shape; empty: none
  std::vector<float> table_values;   // cos, then sin
};

// A rope_scaling dict as JSON: a type and some keys, with values of every kind.
std::string scaling_json(fuzz::Input& in) {
  const char* types[] = {"default", "linear", "dynamic", "yarn", "longrope", "llama3", "mrope", "ntk"};
  const char* keys[] = {"factor", "original_max_position_embeddings", "max_position_embeddings",
                        "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
                        "truncate", "short_factor", "long_factor", "low_freq_factor",
                        "high_freq_factor", "partial_rotary_factor", "rope_theta"};
  const char* values[] = {"0", "1", "2", "4", "8", "0.5", "-1", "32", "4096", "1e308", "1e-308",
                          "2.5", "true", "null", "\"x\"", "[]", "[1, 2]", "[0.5, 1, 2, 4]",
                          "[1e-300, 1, 1, 1]", "16"};
  std::string j = std::string("{\"") + (in.flag() ? "rope_type" : "type") + "\": \"" + in.pick(types) + "\"";
  for (const char* key : keys)
    if (in.byte() < 96) j += std::string(", \"") + key + "\": " + in.pick(values);
  return j + "}";
}

Case read_case(fuzz::Input& in) {
  Case c;
  const int64_t rank = in.in(0, 4);  // 2..4 are valid
  for (int64_t a = 0; a < rank; ++a) c.x.push_back(in.in(0, a + 1 == rank ? 9 : 4));
  c.out = c.x;
  if (in.byte() < 16 && rank > 0) c.out[in.in(0, rank - 1)] = in.in(0, 9);
  c.in_place = in.byte() < 64;
  c.with_positions = in.flag();
  if (c.with_positions) {
    // A suffix of x's shape without its last axis, axes broadcast (1) or now and then wrong.
    const int64_t rank_p = in.in(0, rank);
    for (int64_t a = 0; a < rank_p; ++a) {
      const int64_t from = rank - 1 - rank_p + a;
      const uint8_t choice = in.byte();
      c.positions.push_back(from < 0 || choice < 64 ? 1 : choice < 72 ? in.in(0, 9) : c.x[from]);
    }
  }
  c.x_layout = static_cast<int>(in.in(0, fuzz::kLayouts - 1));
  c.out_layout = static_cast<int>(in.in(0, fuzz::kLayouts - 1));
  c.positions_layout = static_cast<int>(in.in(0, fuzz::kLayouts - 1));

  const double bases[] = {10000, 10000, 2, 0.5, 1e-300, 5e-324, 0, -1, kNaN, kInf};
  c.options.base = in.pick(bases);
  c.options.interleaved = in.flag();
  if (in.flag()) c.options.rotary_dim = in.in(-2, 11);
  const int64_t offsets[] = {0, 0, 3, -7, 1000000, kMax, kMin, kMax - 5};
  c.options.offset = in.pick(offsets);

  std::mt19937 rng(in.u32());
  std::uniform_real_distribution<float> uniform(-1, 1);
  c.x_values.resize(static_cast<size_t>(checked_numel(c.x, 8, "fuzz")));
  for (double& v : c.x_values) v = uniform(rng);
  const double specials[] = {kNaN, kInf, -kInf, 1e30};
  if (in.byte() < 32 && !c.x_values.empty()) {
    c.x_values[in.u32() % c.x_values.size()] = static_cast<float>(in.pick(specials));
    c.finite = false;
  }
  // Read last, so that the older corpus keeps its meaning (past the end every
  // read is 0: no scaling, sections or tables).
  const uint8_t extra = in.byte();
  if (extra % 4 == 1) c.scaling = scaling_json(in);
  if (extra % 4 == 2)
    for (int64_t n = in.in(0, 80); n > 0; --n) c.scaling += static_cast<char>(in.byte());
  if (extra & 4) {
    for (int64_t n = in.in(1, 3); n > 0; --n) c.mrope_section.push_back(in.in(-1, 5));
    if (c.with_positions) c.positions.insert(c.positions.begin(), in.byte() < 200 ? int64_t(c.mrope_section.size()) : in.in(0, 4));
  }
  if (extra & 8) {
    const int64_t width = in.in(0, 5);
    if (c.with_positions || rank < 2) c.table = {in.in(0, 120), width};
    else c.table = {in.byte() < 128 ? c.x[rank - 2] : in.in(0, 9), width};
    c.table_values.resize(2 * static_cast<size_t>(checked_numel(c.table, 8, "fuzz")));
    for (float& v : c.table_values) v = uniform(rng);
  }

  const int64_t special_positions[] = {kMax, kMin, 1000000, -3};
  c.position_values.resize(static_cast<size_t>(checked_numel(c.positions, 8, "fuzz")));
  for (int64_t& p : c.position_values)
    p = rng() % 8 == 0 ? special_positions[rng() % 4] : static_cast<int64_t>(rng() % 100);
  return c;
}

// The case's options with its scaling and sections (the parse may refuse).
RopeOptions options_of(const Case& c) {
  RopeOptions o = c.options;
  if (!c.scaling.empty()) o.scaling = parse_rope_scaling(c.scaling);
  if (!c.mrope_section.empty()) o.scaling.mrope_section = c.mrope_section;
  return o;
}

template <class T>
struct Result {
  std::vector<T> in, out;  // in: x as the call read it
  std::vector<T> back;  // rope_backward of out
};

template <class T>
std::optional<Result<T>> run(const Case& c, bool& guards_ok) {
  Strided<T> x(c.x, c.x_layout, !c.in_place), separate_out(c.out, c.out_layout, false);
  Strided<T>& out = c.in_place ? x : separate_out;
  Strided<int64_t> positions(c.positions, c.positions_layout, true);
  x.fill([&, i = size_t{0}]() mutable { return static_cast<T>(c.x_values[i++]); });
  positions.fill([&, i = size_t{0}]() mutable { return c.position_values[i++]; });
  const TensorView<const int64_t> pos = c.with_positions ? positions.cview() : TensorView<const int64_t>();
  std::vector<T> in = x.values();
  Tensor<T> cos(c.table), sin(c.table);
  const int64_t cells = c.table.empty() ? 0 : cos.numel();
  for (int64_t i = 0; i < cells; ++i) cos[i] = c.table_values[i], sin[i] = c.table_values[cells + i];
  const RopeTables<T> tables{cos.view(), sin.view()};
  RopeOptions options;
  const auto rotate = [&](TensorView<const T> from, TensorView<T> to, bool backward) {
    if (c.table.empty()) backward ? rope_backward(from, to, options, pos) : apply_rope(from, to, options, pos);
    else backward ? rope_backward(from, to, tables, options, pos) : apply_rope(from, to, tables, options, pos);
  };
  const bool ok = fuzz::accepted([&] {
    options = options_of(c);
    rotate(x.cview(), out.view(), false);
  });
  guards_ok = out.guards_intact();
  if (!ok) return std::nullopt;
  Result<T> r{std::move(in), out.values(), {}};
  rotate(out.cview(), out.view(), true);
  r.back = out.values();
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const Case c = read_case(in);
  bool guards64 = true, guards32 = true;
  const auto ref = run<double>(c, guards64);
  const auto got = run<float>(c, guards32);
  if (!guards64 || !guards32) fuzz::finding("rope wrote outside its output view");
  if (ref.has_value() != got.has_value())
    fuzz::finding(std::string("float64 ") + (ref ? "accepts" : "refuses") + " what float32 " +
                  (got ? "accepts" : "refuses"));
  if (!ref) return 0;
  // A pure rotation: no tables, and a scaling whose attention factor is 1.
  const RopeType type = options_of(c).scaling.rope_type;
  const bool rotation = c.table.empty() && type != RopeType::Yarn && type != RopeType::LongRope;
  for (size_t i = 0; i < ref->out.size(); ++i) {
    const float rounded = static_cast<float>(ref->out[i]);
    if (!(got->out[i] == rounded || (std::isnan(got->out[i]) && std::isnan(rounded))))
      fuzz::finding("float32 rope " + std::to_string(got->out[i]) + " is not float64's " +
                    std::to_string(ref->out[i]) + " rounded, at element " + std::to_string(i));
    if (!c.finite || !rotation) continue;
    if (!std::isfinite(ref->out[i]))
      fuzz::finding("finite input gave " + std::to_string(ref->out[i]) + " at element " +
                    std::to_string(i));
    if (!(std::fabs(ref->back[i] - ref->in[i]) <= 1e-12))
      fuzz::finding("rope_backward does not undo rope at element " + std::to_string(i));
  }
  return 0;
}
