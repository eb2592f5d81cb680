#include <gtest/gtest.h>

#include <bitset>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>

#include "attn/random.hpp"
#include "helpers.hpp"

namespace attn {
namespace {

TEST(Tensor, ShapeStringMatchesPython) {
  EXPECT_EQ(shape_str({}), "()");
  EXPECT_EQ(shape_str({5}), "(5,)");
  EXPECT_EQ(shape_str({2, 3, 4}), "(2, 3, 4)");
}

TEST(Tensor, ContiguousStrides) {
  EXPECT_EQ(contiguous_strides({2, 3, 4}), (Strides{12, 4, 1}));
  EXPECT_EQ(contiguous_strides({}), Strides{});
}

// An empty shape may have huge other dimensions: its strides saturate and
// its size is 0 without overflowing (UBSan found both through fuzzed .npy files).
TEST(Tensor, EmptyShapesWithHugeDimensionsHaveStrides) {
  const Shape huge{0, 1918083853, 3, 18030383, 3, 18030383853, 360};
  const Tensor<float> t(huge);
  EXPECT_EQ(t.numel(), 0);
  const Strides s = t.view().strides();
  EXPECT_EQ(s.back(), 1);
  EXPECT_EQ(s[5], 360);
  EXPECT_EQ(s[0], std::numeric_limits<int64_t>::max());
  // The 0 last: the product of the others overflows before it (numel did).
  const Tensor<float> last({5, 191, 1918083853, 3, 18030383, 3, 1803038, 36, 0});
  EXPECT_EQ(last.numel(), 0);
  EXPECT_EQ(last.view().numel(), 0);
}

TEST(Tensor, OverflowingSizeIsRefusedBeforeAllocating) {
  const int64_t big = int64_t{1} << 40;
  EXPECT_THROW_MSG(Tensor<float>({big, big}), ValueError, "(1099511627776, 1099511627776)");
  EXPECT_THROW_MSG(checked_numel({std::numeric_limits<int64_t>::max() / 2, 3}, 1, "x"),
                   ValueError, "refusing to allocate");
  EXPECT_THROW_MSG(checked_numel({2, -1}, 4, "x"), ValueError, "negative dimension");
  EXPECT_EQ(checked_numel({0, std::numeric_limits<int64_t>::max()}, 8, "x"), 0);
}

TEST(Tensor, UnallocatableSizeIsAClearError) {
  // 2^44 floats = 64 TiB: representable, but no machine here has it.
  EXPECT_THROW_MSG(Tensor<float>({int64_t{1} << 44}), ValueError, "cannot allocate");
}

// The VmFlags line of the mapping that holds p (/proc/self/smaps), or "".
std::string mapping_flags(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long long begin = 0, end = 0;
    char dash = 0;
    std::istringstream range(line);
    if (line.find("VmFlags:") == 0) {
      if (inside) return line;
    } else if (range >> std::hex >> begin >> dash >> end && dash == '-') {
      inside = begin <= at && at < end;
    }
  }
  return "";
}

// From 4 MiB on, a tensor (a KV cache) lies on 2 MiB boundaries, advised for
// transparent huge pages: the kernel records the advice in the mapping's
// VmFlags as "hg", whether or not it grants the pages. Smaller ones are
// aligned to cache lines, without advice.
TEST(Tensor, LargeTensorsAreAdvisedForHugePages) {
  const Tensor<float> small({1000}), large({int64_t{1} << 20});  // 4000 B, 4 MiB
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.data()) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(large.data()) % (uintptr_t{2} << 20), 0u);
  EXPECT_EQ(large[large.numel() - 1], 0.0f);  // value-initialised to its end
#ifdef __linux__
  if (test::emulated()) GTEST_SKIP() << "qemu-user accepts madvise and ignores it";
  if (!std::filesystem::exists("/sys/kernel/mm/transparent_hugepage"))
    GTEST_SKIP() << "this kernel has no transparent huge pages";
  const std::string flags = mapping_flags(large.data());
  ASSERT_FALSE(flags.empty()) << "no mapping in /proc/self/smaps holds the tensor";
  EXPECT_NE((flags + " ").find(" hg "), std::string::npos) << flags;
#endif
}

TEST(Tensor, BroadcastStrides) {
  EXPECT_EQ(broadcast_strides({3}, {1}, {2, 4, 3}, "m"), (Strides{0, 0, 1}));
  EXPECT_EQ(broadcast_strides({4, 1}, {1, 1}, {2, 4, 3}, "m"), (Strides{0, 1, 0}));
  EXPECT_THROW_MSG(broadcast_strides({2}, {1}, {4, 3}, "mask"), ValueError,
                   "mask of shape (2,) does not broadcast to (4, 3)");
  EXPECT_THROW_MSG(broadcast_strides({1, 4, 3}, {12, 3, 1}, {4, 3}, "mask"), ValueError,
                   "does not broadcast");
}

// A default tensor holds nothing (its rank-0 shape is not a scalar): its
// copies hold nothing either. (The copy read one element from null.)
TEST(Tensor, CopiesOfADefaultTensorHoldNothing) {
  const Tensor<float> none;
  const Tensor<float> copied(none);
  EXPECT_EQ(copied.data(), nullptr);
  Tensor<float> assigned({2, 3});
  assigned = none;
  EXPECT_EQ(assigned.data(), nullptr);
}

// numel() counts the elements held: a default tensor, and a moved-from one,
// hold none (their rank-0 shape is not a scalar's, which holds one).
TEST(Tensor, NumelCountsTheElementsHeld) {
  const auto holds_nothing = [](const Tensor<float>& t) {
    EXPECT_EQ(t.numel(), 0);
    EXPECT_EQ(t.data(), nullptr);
  };
  holds_nothing(Tensor<float>());
  EXPECT_EQ(Tensor<float>(Shape{}).numel(), 1);
  EXPECT_EQ(Tensor<float>({3, 0, 2}).numel(), 0);
  Tensor<float> a({2, 3, 4});
  EXPECT_EQ(a.numel(), 24);
  Tensor<float> b(std::move(a));
  EXPECT_EQ(b.numel(), 24);
  holds_nothing(a);
  Tensor<float> c({5});
  c = std::move(b);
  EXPECT_EQ(c.numel(), 24);
  holds_nothing(b);
  Tensor<float>& self = c;
  c = std::move(self);
  EXPECT_EQ(c.numel(), 24);
  const Tensor<float> d = std::move(c).reshape({6, 4});
  EXPECT_EQ(d.numel(), 24);
  holds_nothing(c);
  EXPECT_EQ(Tensor<float>(d).numel(), 24);
  const Tensor<float> none;
  holds_nothing(Tensor<float>(none));
}

TEST(Tensor, CopyFollowsStrides) {
  Tensor<double> a({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor<float> t({3, 2});
  copy<double>(a.view().transpose(0, 1), t.view());
  const Tensor<float> expected({3, 2}, {1, 4, 2, 5, 3, 6});
  EXPECT_EQ(test::max_abs_diff(t, expected), 0.0);
  EXPECT_THROW_MSG(copy<double>(a.view(), t.view()), ValueError, "differs");
}

TEST(Tensor, ViewRejectsMismatchedStrides) {
  float x[4];
  EXPECT_THROW_MSG(TensorView<float>(x, {2, 2}, {1}), ValueError, "rank");
  EXPECT_THROW_MSG(TensorView<float>(x, {2, -2}), ValueError, "negative");
}

// A view inside a buffer of kBufferBytes, as a MemorySpan refers to it.
constexpr int kBufferBytes = 160;
struct RandomView {
  Shape shape;
  Strides strides;  // in items
  MemorySpan span;
};

// The bytes a view covers, by visiting every element: the reference the
// search in shares_memory and overlaps_itself is held to.
struct Covered {
  std::bitset<kBufferBytes> bytes;
  bool twice = false;
};
Covered covered(const MemorySpan& m, const unsigned char* base) {
  Covered c;
  if (numel_of(Shape(m.shape, m.shape + m.rank)) == 0) return c;
  std::vector<int64_t> index(static_cast<size_t>(m.rank), 0);
  for (;;) {
    int64_t at = static_cast<const unsigned char*>(m.data) - base;
    for (int a = 0; a < m.rank; ++a) at += index[a] * m.strides[a] * m.item_bytes;
    for (int64_t b = at; b < at + m.item_bytes; ++b) {
      c.twice = c.twice || c.bytes[static_cast<size_t>(b)];
      c.bytes[static_cast<size_t>(b)] = true;
    }
    int a = m.rank;
    while (a > 0 && ++index[a - 1] == m.shape[a - 1]) index[--a] = 0;
    if (a == 0) return c;
  }
}

// A random view inside the buffer: rank 0-4, dims 0-4, strides in [-9, 9]
// items (0 and negative included), items of 1, 2, 4 or 8 bytes.
void random_view(std::mt19937& rng, const unsigned char* base, RandomView& v) {
  const auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (;;) {
    const int64_t item = int64_t{1} << pick(0, 3);
    const int rank = pick(0, 4);
    v.shape.clear(), v.strides.clear();
    int64_t lo = 0, hi = item;
    for (int a = 0; a < rank; ++a) {
      v.shape.push_back(pick(0, 4) == 0 ? pick(0, 1) : pick(2, 4));
      v.strides.push_back(pick(-9, 9));
      const int64_t step = v.strides.back() * item * std::max<int64_t>(v.shape.back() - 1, 0);
      (step < 0 ? lo : hi) += step;
    }
    if (hi - lo > kBufferBytes) continue;
    v.span = {base - lo + pick(0, static_cast<int>(kBufferBytes - (hi - lo))), v.shape.data(), v.strides.data(), rank,
              item};
    return;
  }
}

TEST(Overlap, SharesMemoryAndOverlapsItselfAreExact) {
  alignas(8) static unsigned char buffer[kBufferBytes];
  std::mt19937 rng(46);
  int shared = 0, folded = 0;
  RandomView va, vb;
  for (int trial = 0; trial < 20000; ++trial) {
    random_view(rng, buffer, va);
    random_view(rng, buffer, vb);
    const MemorySpan &a = va.span, &b = vb.span;
    const Covered ca = covered(a, buffer), cb = covered(b, buffer);
    const bool share = (ca.bytes & cb.bytes).any();
    ASSERT_EQ(shares_memory(a, b), share) << "trial " << trial;
    ASSERT_EQ(shares_memory(b, a), share) << "trial " << trial;
    ASSERT_EQ(overlaps_itself(a), ca.twice) << "trial " << trial << ": shape " << shape_str(va.shape)
                                            << ", strides " << shape_str(va.strides) << " of " << a.item_bytes;
    shared += share, folded += ca.twice;
  }
  // Both answers occur often enough for the comparison to mean something.
  EXPECT_GT(shared, 2000);
  EXPECT_GT(folded, 2000);
}

TEST(Overlap, InterleavedAndLargeViews) {
  // A buffer's even and odd columns share nothing; its rows do with itself.
  std::vector<float> buf(4096 * 256);
  const TensorView<const float> even(buf.data(), {4096, 128}, {256, 2}), odd(buf.data() + 1, {4096, 128}, {256, 2}),
      one(buf.data() + 256, {1}), folded_rows(buf.data(), {100, 128}, {64, 1}), zero_rows(buf.data(), {3, 4}, {0, 1}),
      one_zero_row(buf.data(), {1, 4}, {0, 1});
  EXPECT_FALSE(shares_memory(MemorySpan::of(even), MemorySpan::of(odd)));
  EXPECT_TRUE(shares_memory(MemorySpan::of(even), MemorySpan::of(one)));
  EXPECT_FALSE(overlaps_itself(MemorySpan::of(even)));
  // Rows of 128 read 64 apart: each row's second half is the next one's first.
  EXPECT_TRUE(overlaps_itself(MemorySpan::of(folded_rows)));
  EXPECT_TRUE(overlaps_itself(MemorySpan::of(zero_rows)));
  EXPECT_FALSE(overlaps_itself(MemorySpan::of(one_zero_row)));
  EXPECT_TRUE(same_elements(MemorySpan::of(even), MemorySpan::of(TensorView<const float>(even))));
  EXPECT_FALSE(same_elements(MemorySpan::of(even), MemorySpan::of(odd)));
}

// The random tensors are the same everywhere: uniform01 is the generator's
// top 53 bits (the standard fixes mt19937_64's first output for its default
// seed), uniform and normal the closed forms of it, draw by draw.
TEST(RandomTensors, AreTheirClosedFormsOfTheStandardGenerator) {
  std::mt19937_64 rng;
  EXPECT_EQ(uniform01(rng), static_cast<double>(14514284786278117030ull >> 11) / 9007199254740992.0);
  std::mt19937_64 a(7), b(7);
  const Tensor<double> u = uniform<double>({3, 4}, 0.5, a);
  for (int64_t i = 0; i < u.numel(); ++i) {
    const double x = static_cast<double>(b() >> 11) / 9007199254740992.0;
    EXPECT_EQ(u[i], (2 * x - 1) * 0.5);
    EXPECT_GE(u[i], -0.5);
    EXPECT_LT(u[i], 0.5);
  }
  const Tensor<double> g = normal<double>({5}, 2.0, a);
  for (int64_t i = 0; i < g.numel(); ++i) {
    const double x = 1 - static_cast<double>(b() >> 11) / 9007199254740992.0;
    const double y = static_cast<double>(b() >> 11) / 9007199254740992.0;
    EXPECT_EQ(g[i], 2.0 * std::sqrt(-2 * std::log(x)) * std::cos(2 * M_PI * y));
  }
}

}  // namespace
}  // namespace attn
