// The streaming rule as two attention calls, each a causal offset (and a
// window) the kernels skip tiles by: the window's keys, and the sink keys;
// their results merged by their log-sum-exps (FlashInfer's merge_state). No
// mask of n_q × n_k is built: a byte per pair is 900 MB at 30k tokens.
#include "layer/streaming_attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "attn/attention.hpp"

namespace attn::detail {
namespace {

// Keys [begin, end) of a (batch, heads, n, row) view (axis 2).
template <class KV>
TensorView<const KV> key_slots(TensorView<const KV> x, int64_t begin, int64_t end) {
  return TensorView<const KV>(x.data() + begin * x.stride(2), {x.dim(0), x.dim(1), end - begin, x.dim(3)},
                              x.strides());
}
template <class T>
TensorView<T> query_rows(TensorView<T> x, int64_t begin, int64_t end) {
  return TensorView<T>(x.data() + begin * x.stride(2), {x.dim(0), x.dim(1), end - begin, x.dim(3)}, x.strides());
}

// Query rows handled together by the sink keys' part: its output (and
// log-sum-exp) for this many rows at a time, not the chunk's, is what it
// holds beside the window's.
constexpr int64_t kSinkRows = 1024;

}  // namespace

template <class T, class KV>
void streaming_attention(TensorView<const T> q, TensorView<const KV> k, TensorView<const KV> v,
                         const AttentionOptions& options, const StreamingCache& rule,
                         const std::vector<int64_t>& positions, int64_t t0, TensorView<T> out, TensorView<T> weights) {
  const int64_t B = q.dim(0), H = q.dim(1), n_q = q.dim(2), n_k = k.dim(2), dv = out.dim(3);
  // The sink keys are the first slots (position = slot); the others hold
  // consecutive positions from the first of them on.
  int64_t sinks = 0;
  while (sinks < n_k && positions[sinks] < rule.sink_tokens) ++sinks;
  const int64_t first_window_position = sinks < n_k ? positions[sinks] : t0;
  const auto weight_cols = [&](TensorView<T> w, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    return weights.empty_view() ? TensorView<T>()
                                : TensorView<T>(w.data() + i0 * w.stride(2) + j0 * w.stride(3),
                                                {B, H, i1 - i0, j1 - j0}, w.strides());
  };
  // The window's keys (with the sink logits of gpt-oss, options.sinks):
  // slot s holds position first_window_position + (s - sinks).
  Tensor<T> window_lse({B, H, n_q});
  AttentionOptions in_window = options;
  in_window.causal = Causal::offset(t0 - first_window_position);
  in_window.window = {rule.window - 1, -1};
  AttentionExtras<T> extras;
  extras.lse = window_lse.view();
  extras.weights = weight_cols(weights, 0, n_q, sinks, n_k);
  AttentionPlan<T, KV>(q, key_slots(k, sinks, n_k), key_slots(v, sinks, n_k), in_window).run(out, extras);
  if (sinks == 0) return;
  AttentionOptions sink_keys = options;
  sink_keys.sinks.clear();
  sink_keys.window = {};
  const auto ks = key_slots(k, 0, sinks), vs = key_slots(v, 0, sinks);
  for (int64_t i0 = 0; i0 < n_q; i0 += kSinkRows) {
    const int64_t i1 = std::min(n_q, i0 + kSinkRows);
    sink_keys.causal = Causal::offset(t0 + i0);
    Tensor<T> sink_out({B, H, i1 - i0, dv}), sink_lse({B, H, i1 - i0});
    AttentionExtras<T> sink_extras;
    sink_extras.lse = sink_lse.view();
    sink_extras.weights = weight_cols(weights, i0, i1, 0, sinks);
    AttentionPlan<T, KV>(query_rows(q, i0, i1), ks, vs, sink_keys).run(sink_out.view(), sink_extras);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = i0; i < i1; ++i) {
          const double la = window_lse.at({b, h, i}), lb = sink_lse.at({b, h, i - i0});
          const double top = std::max(la, lb);
          if (top == -std::numeric_limits<double>::infinity()) continue;  // no key: zeros
          // (A NaN in either carries: the row is NaN.)
          const double fa = la == top ? 1.0 : std::exp(la - top), fb = lb == top ? 1.0 : std::exp(lb - top);
          const double sum = fa + fb;
          T* o = &out.at({b, h, i, 0});
          const T* ob = &sink_out.at({b, h, i - i0, 0});
          for (int64_t c = 0; c < dv; ++c)
            o[c * out.stride(3)] = static_cast<T>((fa * o[c * out.stride(3)] + fb * ob[c]) / sum);
          if (weights.empty_view()) continue;
          T* w = &weights.at({b, h, i, 0});
          for (int64_t j = 0; j < n_k; ++j) w[j * weights.stride(3)] *= static_cast<T>((j < sinks ? fb : fa) / sum);
        }
  }
}

#define ATTN_STREAMING(T, KV)                                                                                     \
  template void streaming_attention(TensorView<const T>, TensorView<const KV>, TensorView<const KV>,             \
                                    const AttentionOptions&, const StreamingCache&, const std::vector<int64_t>&, \
                                    int64_t, TensorView<T>, TensorView<T>);
ATTN_STREAMING(float, float)
ATTN_STREAMING(float, bfloat16)
ATTN_STREAMING(float, float16)
ATTN_STREAMING(float, block_q8_0)
ATTN_STREAMING(float, block_q4_0)
ATTN_STREAMING(double, double)
#undef ATTN_STREAMING

}  // namespace attn::detail
