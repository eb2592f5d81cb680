// The C API (attn/attn.h) on fuzzed descriptors: dtypes (valid or not),
// ranks, shapes, strides (negative, zero, padded), NULL pointers, shapes and
// strides no memory can have, and options structs of any size (ALiBi's slopes
// among their fields). Each
// descriptor that claims memory has it (a buffer as large as its strides
// reach): then attn_attention and attn_rope must return a status, with a
// message exactly when it is not ATTN_OK, and never crash. A RUNTIME status
// is a finding too: it means a C++ exception other than attn::Error.
//
// Not fuzzed: huge batch axes beside an axis of 0 (q, k, v and out of shape
// (2^62 - 1, 0, 0, 9)), whose buffers here, sized by their strides' reach,
// could not be allocated. attention() sized a table of offsets by such batch
// axes and threw std::length_error; EdgeCases.EmptyAndZeroWidthInputs covers
// it now.
#include <algorithm>
#include <random>

#include "attn/attn.h"
#include "fuzz_input.hpp"

using attn::fuzz::finding;

namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// Bytes per element (Q8_0, Q4_0: per block of 32 values; their strides count blocks).
size_t element_size(int dtype) {
  return dtype == ATTN_Q8_0 ? 34 : dtype == ATTN_Q4_0 ? 18 : dtype == ATTN_F64 ? 8 : dtype == ATTN_F32 ? 4
                                  : dtype == ATTN_BOOL ? 1 : 2;
}

// One fuzzed descriptor and the memory it points into.
struct Descriptor {
  attn_tensor tensor{};
  std::vector<int64_t> shape, strides;
  std::vector<unsigned char> buffer;
  bool null = false;  // pass NULL instead of &tensor

  const attn_tensor* get() const { return null ? nullptr : &tensor; }
  attn_tensor* get() { return null ? nullptr : &tensor; }
};

// Kinds of descriptor: mostly real ones, now and then each way of being wrong.
enum Kind { kReal, kNull, kNullShape, kNullData, kBadDtype, kBadRank, kHugeShape, kHugeStride, kKinds };

// A descriptor of `shape` (now and then one axis changed, or dropped).
void read_descriptor(attn::fuzz::Input& in, std::mt19937& rng, Descriptor& d, int dtype,
                     attn::Shape shape) {
  const uint8_t choice = in.byte();
  const int kind = choice < 200 ? kReal : 1 + choice % (kKinds - 1);
  if (kind == kNull) d.null = true;
  if (kind == kBadDtype) dtype = static_cast<int>(in.in(ATTN_Q4_0 + 1, 255)) * (in.flag() ? 1 : -1);
  const uint8_t change = in.byte();
  if (change < 16 && !shape.empty()) shape[in.in(0, static_cast<int64_t>(shape.size()) - 1)] = in.in(0, 5);
  if (change >= 16 && change < 20 && !shape.empty()) shape.erase(shape.begin());
  d.shape = shape;
  const int rank = kind != kBadRank ? static_cast<int>(shape.size())
                   : in.flag()      ? -static_cast<int>(in.in(1, 3))
                                    : static_cast<int>(in.in(17, 40));
  const int real_rank = static_cast<int>(d.shape.size());
  if (kind == kHugeShape && real_rank >= 1) {
    // No axis 0 (see the top of the file) and one more >= 5: no byte count fits.
    for (int64_t& n : d.shape) n = std::max<int64_t>(n, 1);
    d.shape[0] = kMax / static_cast<int64_t>(in.in(1, 4));
    d.shape.push_back(in.in(5, 9));
  }
  // Strides: C order, then an axis reversed, broadcast (0) or padded.
  const size_t r = d.shape.size();
  d.strides.assign(r, 0);
  int64_t step = 1;
  for (size_t a = r; a-- > 0;) {
    d.strides[a] = step;
    if (kind != kHugeShape)  // (whose strides no element is reached through)
      step *= std::max<int64_t>(d.shape[a], 1) + (in.byte() < 32 ? 2 : 0);
  }
  const bool explicit_strides = in.flag();
  if (explicit_strides)
    for (size_t a = 0; a < r; ++a) {
      const uint8_t s = in.byte();
      if (s < 24) d.strides[a] = -d.strides[a];
      else if (s < 40) d.strides[a] = 0;
    }
  if (kind == kHugeStride && r >= 1) {
    d.strides[0] = in.flag() ? std::numeric_limits<int64_t>::min() : kMax / 2;
    d.shape[0] = std::max<int64_t>(d.shape[0], 3);
  }
  int64_t lo = 0, hi = 0;
  if (kind != kHugeShape && kind != kHugeStride)
    for (size_t a = 0; a < r; ++a)
      if (d.shape[a] > 0) (d.strides[a] < 0 ? lo : hi) += d.strides[a] * (d.shape[a] - 1);
  const size_t esize = element_size(dtype);
  d.buffer.resize(static_cast<size_t>(hi - lo + 1) * element_size(ATTN_Q8_0));  // room for any dtype
  // Booleans must be 0 or 1 (a C _Bool); floats any bits, NaN included.
  for (auto& b : d.buffer) b = dtype == ATTN_BOOL ? rng() & 1 : static_cast<unsigned char>(rng());
  d.tensor.data = kind == kNullData ? nullptr : d.buffer.data() + static_cast<size_t>(-lo) * esize;
  // Any int, as C may store it (a C++ enum cannot hold it all).
  std::memcpy(&d.tensor.dtype, &dtype, sizeof dtype);
  d.tensor.rank = kind == kBadRank ? rank : static_cast<int32_t>(r);
  d.tensor.shape = kind == kNullShape ? nullptr : d.shape.data();
  d.tensor.strides = explicit_strides || kind == kHugeStride ? d.strides.data() : nullptr;
}

// attn_options, possibly longer than this library's (the extra bytes zero or not).
struct LongerOptions {
  attn_options options;
  uint64_t extra;
};

const attn_options* read_options(attn::fuzz::Input& in, LongerOptions& o) {
  if (in.byte() < 32) return nullptr;
  attn_options_init(&o.options);
  o.extra = 0;
  const double scales[] = {0, 0, 0.5, -1, 1e30, std::numeric_limits<double>::quiet_NaN(),
                           std::numeric_limits<double>::infinity()};
  const double softcaps[] = {0, 0, 2, -1, 1e-300, std::numeric_limits<double>::quiet_NaN()};
  const int64_t windows[] = {-1, -1, 0, 1, 3, -2, kMax, std::numeric_limits<int64_t>::min()};
  o.options.causal = static_cast<int32_t>(in.in(-1, 3));
  o.options.scale = in.pick(scales);
  o.options.softcap = in.pick(softcaps);
  o.options.window_left = in.pick(windows);
  o.options.window_right = in.pick(windows);
  const size_t sizes[] = {sizeof(attn_options), sizeof(attn_options), 0, sizeof(size_t),
                          offsetof(attn_options, softcap), sizeof(LongerOptions)};
  o.options.size = in.pick(sizes);
  if (o.options.size == sizeof(LongerOptions)) o.extra = in.flag() ? 0 : in.u32();
  return &o.options;
}

void check(int status, const char* function) {
  const std::string message = attn_last_error();
  if (status < ATTN_OK || status > ATTN_ERROR_RUNTIME)
    finding(std::string(function) + " returned " + std::to_string(status) + ", not an attn_status");
  if (status == ATTN_ERROR_RUNTIME)
    finding(std::string(function) + ": a non-attn error: " + message);
  if ((status == ATTN_OK) != message.empty())
    finding(std::string(function) + ": status " + std::to_string(status) + " with message '" +
            message + "'");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  attn::fuzz::Input in(data, size);
  std::mt19937 rng(in.u32());
  // Mostly the dtypes that run (F32 with F32/BF16/F16/Q8_0/Q4_0 keys, F64), sometimes any.
  const int dtypes[] = {ATTN_F32, ATTN_F32, ATTN_F64, ATTN_BF16, ATTN_F16, ATTN_Q8_0, ATTN_Q4_0, ATTN_BOOL};
  if (in.flag()) {
    const int q_dtype = in.pick(dtypes), kv_dtype = in.flag() ? q_dtype : in.pick(dtypes);
    // Shapes that fit together (batch, heads, n_q, n_k, d, d_v), each of them
    // then maybe changed by read_descriptor: no heads axis, or GQA. Q8_0's
    // and Q4_0's head dims are whole blocks of 32.
    const int64_t block = kv_dtype == ATTN_Q8_0 || kv_dtype == ATTN_Q4_0 ? 32 : 1;
    const int64_t batch = in.in(0, 2), n_q = in.in(0, 5), n_k = in.in(0, 6),
                  d = block * in.in(0, block > 1 ? 2 : 5), d_v = block * in.in(0, block > 1 ? 1 : 4),
                  kv_heads = in.in(1, 2), q_heads = kv_heads * in.in(1, 2);
    attn::Shape lead = batch ? attn::Shape{batch} : attn::Shape{};
    const auto with = [](attn::Shape s, std::initializer_list<int64_t> tail) {
      s.insert(s.end(), tail);
      return s;
    };
    const bool heads = in.flag();
    const attn::Shape q_lead = heads ? with(lead, {q_heads}) : lead,
                      kv_lead = heads ? with(lead, {kv_heads}) : lead;
    Descriptor q, k, v, mask, out;
    read_descriptor(in, rng, q, q_dtype, with(q_lead, {n_q, d}));
    read_descriptor(in, rng, k, kv_dtype, with(kv_lead, {n_k, d}));
    read_descriptor(in, rng, v, kv_dtype, with(kv_lead, {n_k, d_v}));
    read_descriptor(in, rng, out, in.flag() ? q_dtype : in.pick(dtypes), with(q_lead, {n_q, d_v}));
    const bool with_mask = in.flag();
    const int mask_dtypes[] = {ATTN_BOOL, ATTN_F32, ATTN_F64, ATTN_BF16};
    if (with_mask) read_descriptor(in, rng, mask, in.pick(mask_dtypes), {n_q, n_k});
    LongerOptions options;
    const attn_options* o = read_options(in, options);
    // ALiBi's slopes, one per query head (read last: the older corpus keeps its meaning).
    Descriptor slopes;
    const int slope_dtypes[] = {ATTN_F64, ATTN_F64, ATTN_F32, ATTN_BOOL};
    if (o && in.byte() >= 192) {
      read_descriptor(in, rng, slopes, in.pick(slope_dtypes), {heads ? q_heads : 1});
      options.options.alibi_slopes = slopes.get();
    }
    // A causal offset (causal 3), read last likewise.
    const int64_t offsets[] = {-2, 0, 3, 1000, (int64_t{1} << 62) + 1, std::numeric_limits<int64_t>::min()};
    if (o && in.byte() >= 192) options.options.causal_offset = in.pick(offsets);
    // Then sinks, and the extras (the log-sum-exp, the logits at a stage).
    Descriptor sinks, lse, logits;
    if (o && in.byte() >= 192) {
      read_descriptor(in, rng, sinks, in.pick(slope_dtypes), {heads ? q_heads : 1});
      options.options.sinks = sinks.get();
    }
    if (in.byte() >= 160) {
      const bool want_lse = in.flag(), want_logits = in.flag();
      if (want_lse) read_descriptor(in, rng, lse, in.flag() ? q_dtype : in.pick(dtypes), with(q_lead, {n_q}));
      if (want_logits) read_descriptor(in, rng, logits, in.flag() ? q_dtype : in.pick(dtypes), with(q_lead, {n_q, n_k}));
      check(attn_attention_extras(q.get(), k.get(), v.get(), with_mask ? mask.get() : nullptr, o, out.get(),
                                  nullptr, want_logits ? logits.get() : nullptr, int32_t(in.in(-1, 3)),
                                  want_lse ? lse.get() : nullptr),
            "attn_attention_extras");
      return 0;
    }
    check(attn_attention(q.get(), k.get(), v.get(), with_mask ? mask.get() : nullptr, o, out.get()),
          "attn_attention");
  } else {
    const int dtype = in.pick(dtypes);
    attn::Shape shape;
    for (int64_t a = in.in(0, 4); a > 0; --a) shape.push_back(in.in(0, 5));
    Descriptor x, separate_out;
    read_descriptor(in, rng, x, dtype, shape);
    const bool in_place = in.flag();
    if (!in_place) read_descriptor(in, rng, separate_out, in.flag() ? dtype : in.pick(dtypes), shape);
    Descriptor& out = in_place ? x : separate_out;
    // One position per row of x (the API reads x's axis -2 of them).
    const int64_t rows = x.shape.size() >= 2 ? x.shape[x.shape.size() - 2] : 0;
    std::vector<int64_t> positions(static_cast<size_t>(std::clamp<int64_t>(rows, 1, 1 << 20)));
    for (auto& p : positions) p = static_cast<int64_t>(rng()) - (1 << 30);
    const double bases[] = {10000, 2, 0.5, 0, -1, std::numeric_limits<double>::quiet_NaN()};
    check(attn_rope(x.get(), in.flag() ? positions.data() : nullptr, in.pick(bases),
                    static_cast<int32_t>(in.in(0, 2)), in.in(-2, 9), out.get()),
          "attn_rope");
  }
  return 0;
}
