// Decode's scores of KIVI's int4 keys (attn/quantize.hpp): a group of 32
// keys stores each channel c as one block, value d_c · q + m_c, so a query
// row's scores of the group are
//   s_t = Σ_c (q_c · d_c) · code_t,c + Σ_c q_c · m_c,
// its row scaled by the channels' scales once per group, then one FMA per
// channel and vector of keys, the keys' codes widened once for every row.
// Highway's per-target include: include after hwy/highway.h inside a file
// compiled by foreach_target.h.
#if defined(ATTN_KERNELS_DECODE_INT4_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_KERNELS_DECODE_INT4_INL_H_
#undef ATTN_KERNELS_DECODE_INT4_INL_H_
#else
#define ATTN_KERNELS_DECODE_INT4_INL_H_
#endif

#include <hwy/highway.h>

#include "kernels/attention-inl.h"
#include "kernels/kv_rows-inl.h"
#include "kernels/matmul-inl.h"

#include <algorithm>
#include <cstdint>

#include "attn/quantize.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::kernels {
namespace HWY_NAMESPACE {

// The scales and minima of a group's D channels (blocks side by side) as
// float32, D a multiple of the lanes: each block's fp16 pair read as one
// 32-bit word (d low, m high), gathered, split and widened by the vector
// unit.
HWY_INLINE void Int4ChannelRanges(DF d, const block_int4* group, int64_t D, float* scales, float* mins) {
  static_assert(sizeof(block_int4) % 4 == 0 && offsetof(block_int4, m) == 2, "d and m: one aligned 32-bit word");
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint16_t, DF> d16;
  const hn::Rebind<hwy::float16_t, DF> df16;
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  const auto* words = reinterpret_cast<const int32_t*>(group);
  constexpr int32_t kWords = sizeof(block_int4) / 4;
  auto index = hn::Mul(hn::Iota(di, 0), hn::Set(di, kWords));
  const auto step = hn::Set(di, static_cast<int32_t>(N * kWords)), low = hn::Set(di, 0xffff);
  for (int64_t c = 0; c < D; c += N, index = hn::Add(index, step)) {
    const auto pair = hn::GatherIndex(di, words, index);
    const auto as_f16 = [&](auto bits) HWY_ATTR { return hn::BitCast(df16, hn::DemoteTo(d16, bits)); };
    hn::Store(PromoteF16<decltype(df16)>(d, as_f16(hn::And(pair, low))), d, scales + c);
    hn::Store(PromoteF16<decltype(df16)>(d, as_f16(hn::And(hn::ShiftRight<16>(pair), low))), d, mins + c);
  }
}

inline constexpr int64_t kInt4ScratchRows = 8 + 2;  // 8 rows' weights, then the scales and minima

// s[r · s_stride + v .. + N) = w_r · codes + bias_r for MR rows of
// weights w (q_c · d_c · scale, D apart): keys v .. v + N − 1 of the group.
// Each row's sum runs in 8 / MR chains over the channels in turn (an FMA
// waits 4 cycles for the one before it), added together at the end.
template <int MR>
HWY_INLINE void Int4KeyScores(DF d, const block_int4* group, int64_t D, const float* w, const float* bias,
                              int64_t v, float* s, int64_t s_stride) {
  constexpr int C = 8 / MR;
  VF a0 = hn::Zero(d), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  const auto step = [&](int64_t c, auto phase) HWY_ATTR {
    const VF codes = NibbleCodes(d, group[c].qs, v);  // keys v .. v + N − 1
    Unroll<MR>([&](auto r) HWY_ATTR {
      VF& acc = Acc<decltype(phase)::value * MR + r>(a0, a1, a2, a3, a4, a5, a6, a7);
      acc = hn::MulAdd(hn::Set(d, w[r * D + c]), codes, acc);
    });
  };
  int64_t c = 0;
  for (; c + C <= D; c += C) Unroll<C>([&](auto phase) HWY_ATTR { step(c + phase, phase); });
  for (; c < D; ++c) step(c, std::integral_constant<int, 0>());
  Unroll<MR>([&](auto r) HWY_ATTR {
    VF sum = Acc<r>(a0, a1, a2, a3, a4, a5, a6, a7);
    Unroll<C - 1>([&](auto phase) HWY_ATTR { sum = hn::Add(sum, Acc<(phase + 1) * MR + r>(a0, a1, a2, a3, a4, a5, a6, a7)); });
    hn::StoreU(hn::Add(sum, hn::Set(d, bias[r])), d, s + r * s_stride + v);
  });
}

// The scores of one group of 32 keys (blocks side by side, D of them) for
// R query rows q, s_stride apart from s: all 32, whatever of them the
// chunk holds (BlockSoftmax sets those past it to -inf). w: scratch of
// kInt4ScratchRows · D floats, aligned.
HWY_INLINE void Int4GroupScores(DF d, const float* const* q, int64_t R, const block_int4* group, int64_t D,
                                float scale, float* w, float* s, int64_t s_stride) {
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  float* scales = w + 8 * D;
  float* mins = scales + D;
  float bias[8];
  for (int64_t r0 = 0; r0 < R; r0 += 8) {
    const int64_t rows = std::min<int64_t>(8, R - r0);
    if (N > 16 || D % N != 0) {  // (wide scalable vectors, odd head dims: value by value)
      for (int64_t r = r0; r < r0 + rows; ++r)
        for (int64_t t = 0; t < kInt4Group; ++t) {
          float sum = 0.0f;
          for (int64_t c = 0; c < D; ++c) sum += q[r][c] * int4_value(group[c], t);
          s[r * s_stride + t] = sum * scale;
        }
      continue;
    }
    if (r0 == 0) Int4ChannelRanges(d, group, D, scales, mins);
    for (int64_t r = 0; r < rows; ++r) {
      VF dot = hn::Zero(d);
      const VF vs = hn::Set(d, scale);
      for (int64_t c = 0; c < D; c += N) {
        const VF qc = hn::Mul(hn::LoadU(d, q[r0 + r] + c), vs);
        hn::Store(hn::Mul(qc, hn::Load(d, scales + c)), d, w + r * D + c);
        dot = hn::MulAdd(qc, hn::Load(d, mins + c), dot);
      }
      bias[r] = hn::GetLane(hn::SumOfLanes(d, dot));
    }
    for (int64_t v = 0; v < kInt4Group; v += N)
      WithCount<8>(rows, [&](auto mr) HWY_ATTR {
        Int4KeyScores<decltype(mr)::value>(d, group, D, w, bias, v, s + r0 * s_stride, s_stride);
      });
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::kernels
HWY_AFTER_NAMESPACE();

#endif  // ATTN_KERNELS_DECODE_INT4_INL_H_
