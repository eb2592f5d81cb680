// latent_attention: MLA's absorbed attention as attention() over one KV
// head, keys [c | k_pe] and values c, on views of the latent rows.
#include "attn/latent_attention.hpp"

#include <cmath>
#include <string>

namespace attn {

template <Real T, class KV>
  requires AttentionTypes<T, KV>
LatentAttentionResult<T> latent_attention(TensorView<const T> q_nope, TensorView<const T> q_pe,
                                          TensorView<const KV> ckv, TensorView<const KV> kpe, double scale,
                                          bool causal) {
  const std::string shapes = "q_nope " + shape_str(q_nope.shape()) + ", q_pe " + shape_str(q_pe.shape()) +
                             ", ckv " + shape_str(ckv.shape()) + ", kpe " + shape_str(kpe.shape());
  const auto fail = [&](const std::string& what) {
    throw ValueError("latent_attention: " + what + ", got " + shapes);
  };
  if (q_nope.rank() != 3 || q_pe.rank() != 3 || ckv.rank() != 2 || kpe.rank() != 2)
    fail("q_nope and q_pe must be (n_q, heads, rank) and (n_q, heads, rope), ckv and kpe (n_k, rank) and (n_k, rope)");
  const int64_t n_q = q_nope.dim(0), heads = q_nope.dim(1), r = q_nope.dim(2), p = q_pe.dim(2), n_k = ckv.dim(0);
  if (q_pe.dim(0) != n_q || q_pe.dim(1) != heads) fail("q_pe's rows and heads must be q_nope's");
  if (ckv.dim(1) != r || kpe.dim(1) != p || kpe.dim(0) != n_k)
    fail("ckv must be (n_k, " + std::to_string(r) + ") and kpe (n_k, " + std::to_string(p) + ")");
  if (!std::isfinite(scale)) fail("scale must be finite, got " + std::to_string(scale));
  // The keys: the cache's rows in place when kpe continues ckv's columns.
  Tensor<KV> keys;
  TensorView<const KV> k;
  const bool adjacent = n_k > 0 && ckv.stride(1) == 1 && kpe.stride(1) == 1 && ckv.stride(0) == kpe.stride(0) &&
                        kpe.data() == ckv.data() + r;
  if (adjacent) {
    k = TensorView<const KV>(ckv.data(), {1, n_k, r + p}, {0, ckv.stride(0), 1});
  } else {
    keys = Tensor<KV>({1, n_k, r + p});
    copy(ckv, TensorView<KV>(keys.data(), {n_k, r}, {r + p, 1}));
    copy(kpe, TensorView<KV>(keys.data() + r, {n_k, p}, {r + p, 1}));
    k = keys.view();
  }
  // The values: c, the first r columns of the keys' rows.
  const TensorView<const KV> v(k.data(), {1, n_k, r}, {0, k.stride(1), 1});
  Tensor<T> q({heads, n_q, r + p});  // (head, row, [q_nope | q_pe])
  copy(q_nope.transpose(0, 1), TensorView<T>(q.data(), {heads, n_q, r}, {n_q * (r + p), r + p, 1}));
  copy(q_pe.transpose(0, 1), TensorView<T>(q.data() + r, {heads, n_q, p}, {n_q * (r + p), r + p, 1}));
  AttentionOptions options;
  options.scale = scale;
  options.causal = causal ? Causal::BottomRight : Causal::None;
  // Written in place as (head, row) views of the (row, head) results.
  LatentAttentionResult<T> result{Tensor<T>({n_q, heads, r}), Tensor<T>({n_q, heads})};
  AttentionExtras<T> extras;
  extras.lse = result.lse.view().transpose(0, 1);
  AttentionPlan<T, KV>(q.view(), k, v, options).run(result.out.view().transpose(0, 1), extras);
  return result;
}

#define ATTN_LATENT_INSTANTIATE(T, KV)                                                                        \
  template LatentAttentionResult<T> latent_attention<T, KV>(TensorView<const T>, TensorView<const T>,        \
                                                            TensorView<const KV>, TensorView<const KV>, double, \
                                                            bool);
ATTN_LATENT_INSTANTIATE(float, float)
ATTN_LATENT_INSTANTIATE(float, bfloat16)
ATTN_LATENT_INSTANTIATE(float, float16)
ATTN_LATENT_INSTANTIATE(double, double)
#undef ATTN_LATENT_INSTANTIATE

}  // namespace attn
