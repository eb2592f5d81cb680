// apply_rope() on fuzzed shapes, strides, positions and options. Every call
// either refuses with attn::Error or writes its output and nothing else
// (guard cells intact). float32 and float64 accept the same calls and, as
// both compute in double, float32 is float64 rounded. On finite input the
// output is finite, each rotated pair keeps its length, and rope_backward
// undoes the rotation.
#include <random>

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
};

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
  const int64_t special_positions[] = {kMax, kMin, 1000000, -3};
  c.position_values.resize(static_cast<size_t>(checked_numel(c.positions, 8, "fuzz")));
  for (int64_t& p : c.position_values)
    p = rng() % 8 == 0 ? special_positions[rng() % 4] : static_cast<int64_t>(rng() % 100);
  return c;
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
  const bool ok = fuzz::accepted([&] { apply_rope(x.cview(), out.view(), c.options, pos); });
  guards_ok = out.guards_intact();
  if (!ok) return std::nullopt;
  Result<T> r{std::move(in), out.values(), {}};
  rope_backward(out.cview(), out.view(), c.options, pos);
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
  for (size_t i = 0; i < ref->out.size(); ++i) {
    const float rounded = static_cast<float>(ref->out[i]);
    if (!(got->out[i] == rounded || (std::isnan(got->out[i]) && std::isnan(rounded))))
      fuzz::finding("float32 rope " + std::to_string(got->out[i]) + " is not float64's " +
                    std::to_string(ref->out[i]) + " rounded, at element " + std::to_string(i));
    if (!c.finite) continue;
    if (!std::isfinite(ref->out[i]))
      fuzz::finding("finite input gave " + std::to_string(ref->out[i]) + " at element " +
                    std::to_string(i));
    if (!(std::fabs(ref->back[i] - ref->in[i]) <= 1e-12))
      fuzz::finding("rope_backward does not undo rope at element " + std::to_string(i));
  }
  return 0;
}
