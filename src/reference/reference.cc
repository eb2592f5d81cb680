// The double-precision reference: the definition of attention and of its
// gradient, written as plainly as possible. It is the oracle every fast path
// is tested against and the float64 path of the library; keep it small and
// obviously right. The backward mirrors the forward line by line (llm.c).
#include "reference/reference.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "attention_problem.hpp"
#include "attn/half.hpp"
#include "softmax_rules.hpp"

namespace attn::reference {
namespace {

// Causal and window rules exactly as docs/semantics.md "Which keys take part" states them.
template <class T>
bool in_range(const core::AttentionProblem<T>& p, int64_t i, int64_t j) {
  const int64_t pos = i + p.causal.position(p.n_q, p.n_k);
  if (p.causal.masks() && j > i + p.causal.diagonal(p.n_q, p.n_k)) return false;
  // (pos - j and j - pos cannot overflow; pos ± a window of up to INT64_MAX can.)
  if (p.window.left >= 0 && pos - j > p.window.left) return false;
  if (p.window.right >= 0 && j - pos > p.window.right) return false;
  return true;
}

// Column c of a stored row of K or V (bfloat16, fp16, q8_0, q4_0 or int4)
// as a double. Int4 keys lie per channel (`channel_blocks`): the row is the
// group of token j, its block c, value j % 32.
double stored_element(core::KVStorage kv, const std::byte* row, int64_t col_stride, bool channel_blocks, int64_t j,
                      int64_t c) {
  const auto at = [&](auto kind, int64_t col) {
    decltype(kind) e;
    std::memcpy(&e, row + col * col_stride, sizeof e);
    return e;
  };
  switch (kv) {
    case core::KVStorage::BF16: return bf16_to_float(at(uint16_t{}, c));
    case core::KVStorage::F16: return fp16_to_float(at(uint16_t{}, c));
    case core::KVStorage::Q8_0: {
      const block_q8_0 block = at(block_q8_0{}, c / kQ8_0Block);
      return double(fp16_to_float(block.d.bits)) * block.qs[c % kQ8_0Block];
    }
    case core::KVStorage::Q4_0: {  // low nibbles hold values 0 .. 15, high ones 16 .. 31
      const block_q4_0 block = at(block_q4_0{}, c / kQ4_0Block);
      const int64_t i = c % kQ4_0Block, byte = block.qs[i % 16];
      return double(fp16_to_float(block.d.bits)) * double((i < 16 ? byte & 15 : byte >> 4) - 8);
    }
    case core::KVStorage::Int4: {  // d · q + m
      const block_int4 block = at(block_int4{}, channel_blocks ? c : c / kInt4Group);
      const int64_t i = channel_blocks ? j % kInt4Group : c % kInt4Group, byte = block.qs[i % 16];
      return double(fp16_to_float(block.d.bits)) * double(i < 16 ? byte & 15 : byte >> 4) +
             double(fp16_to_float(block.m.bits));
    }
    case core::KVStorage::Native: break;
  }
  return std::numeric_limits<double>::quiet_NaN();  // (Native rows are read as T)
}

// Row j of head (b, h) of K or V (x, or its stored bytes in a float32
// problem) as `cols` doubles, whatever its storage: the row itself where it
// is contiguous doubles, else its values widened into `scratch`.
template <class T>
const double* row_as_double(const core::AttentionProblem<T>& p, const core::Operand<const T>& x,
                            const core::Operand<const std::byte>& stored, int64_t b, int64_t h, int64_t j,
                            int64_t cols, double* scratch) {
  if constexpr (std::is_same_v<T, double>) {
    if (x.col_stride == 1) return x.row(b, h, j);
  } else if (p.kv != core::KVStorage::Native) {
    const bool channel_blocks = p.kv == core::KVStorage::Int4 && &stored == &p.k_stored;
    const std::byte* row = stored.row(b, h, channel_blocks ? j / kInt4Group : j);
    for (int64_t c = 0; c < cols; ++c) scratch[c] = stored_element(p.kv, row, stored.col_stride, channel_blocks, j, c);
    return scratch;
  }
  const T* row = x.row(b, h, j);
  for (int64_t c = 0; c < cols; ++c) scratch[c] = row[c * x.col_stride];
  return scratch;
}

// Row (b, h, i) of the attention weights into w (n_k), returning the row's
// log-sum-exp; the scaled logits before softcap, mask and ALiBi bias into s
// (the backward needs them), and, when `logits` is given, the logits at its
// stage; in part[j] whether key j takes part at all: causal, window and a
// false boolean mask exclude a key whatever its logit or value, even NaN (an
// additive -inf is a value like any other). A row with no allowed key gets
// all-zero weights; one with a NaN logit, all-NaN weights.
template <class T>
double row_weights(const core::AttentionProblem<T>& p, int64_t b, int64_t h, int64_t i,
                   std::vector<double>& s, std::vector<double>& w, std::vector<char>& part,
                   std::vector<double>* logits = nullptr) {
  const T* q = p.q.row(b, h, i);
  const int64_t hkv = h / p.group(), pos = i + p.causal.position(p.n_q, p.n_k);
  std::vector<double> scratch(static_cast<size_t>(p.d));
  for (int64_t j = 0; j < p.n_k; ++j) {
    const double* k = row_as_double(p, p.k, p.k_stored, b, hkv, j, p.d, scratch.data());
    double dot = 0;
    for (int64_t c = 0; c < p.d; ++c) dot += double(q[c * p.q.col_stride]) * k[c];
    s[j] = dot * p.scale;
    const double logit = p.softcap > 0 ? p.softcap * std::tanh(s[j] / p.softcap) : s[j];
    part[j] = in_range(p, i, j) && p.mask.allows(b, h, i, j);
    const double alibi = p.alibi.empty() ? 0.0 : -p.alibi[h] * double(pos - j);
    w[j] = part[j] ? logit + p.mask.added(b, h, i, j) + alibi : -std::numeric_limits<double>::infinity();
    if (logits)
      (*logits)[j] = p.logits_stage == Logits::Scaled ? s[j] : p.logits_stage == Logits::Softcapped ? logit : w[j];
  }
  return core::softmax_by_definition(w.data(), p.n_k,
                               p.sinks.empty() ? -std::numeric_limits<double>::infinity() : p.sinks[h]);
}

// out[c] = Σ w[j] v[j][c] over the keys that take part (a weight of 0 times
// a NaN value is NaN, as in PyTorch; an excluded key is not read).
template <class T, class Out>
void row_output(const core::AttentionProblem<T>& p, int64_t b, int64_t h, const std::vector<double>& w,
                const std::vector<char>& part, Out* out, int64_t out_stride) {
  const int64_t hkv = h / p.group();
  std::vector<double> acc(static_cast<size_t>(p.d_v)), scratch(static_cast<size_t>(p.d_v));
  for (int64_t j = 0; j < p.n_k; ++j) {
    if (!part[j]) continue;
    const double* v = row_as_double(p, p.v, p.v_stored, b, hkv, j, p.d_v, scratch.data());
    for (int64_t c = 0; c < p.d_v; ++c) acc[c] += w[j] * v[c];
  }
  for (int64_t c = 0; c < p.d_v; ++c) out[c * out_stride] = static_cast<Out>(acc[c]);
}

void zero(const core::Operand<double>& t, int64_t batch, int64_t heads, int64_t rows, int64_t cols) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t c = 0; c < cols; ++c) t.row(b, h, i)[c * t.col_stride] = 0;
}

}  // namespace

void reference_attention(const core::AttentionProblem<double>& p) {
  std::vector<double> s(p.n_k), w(p.n_k), logits(p.n_k);
  std::vector<char> part(p.n_k);
  const auto store = [&](const core::Operand<double>& t, int64_t b, int64_t h, int64_t i,
                         const std::vector<double>& row) {
    for (int64_t j = 0; j < p.n_k; ++j) t.row(b, h, i)[j * t.col_stride] = row[j];
  };
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.n_q; ++i) {
        const double lse = row_weights(p, b, h, i, s, w, part, p.logits ? &logits : nullptr);
        row_output(p, b, h, w, part, p.out.row(b, h, i), p.out.col_stride);
        if (p.weights) store(p.weights, b, h, i, w);
        if (p.logits) store(p.logits, b, h, i, logits);
        if (p.lse) *p.lse.row(b, h, i) = lse;
      }
}

void reference_attention_row(const core::AttentionProblem<float>& p, int64_t b, int64_t h, int64_t i,
                             float* out) {
  std::vector<double> s(p.n_k), w(p.n_k), logits(p.n_k);
  std::vector<char> part(p.n_k);
  const double lse = row_weights(p, b, h, i, s, w, part, p.logits ? &logits : nullptr);
  row_output(p, b, h, w, part, out, 1);
  const auto store = [&](const core::Operand<float>& t, const std::vector<double>& row) {
    for (int64_t j = 0; j < p.n_k; ++j) t.row(b, h, i)[j * t.col_stride] = static_cast<float>(row[j]);
  };
  if (p.weights) store(p.weights, w);
  if (p.logits) store(p.logits, logits);
  if (p.lse) *p.lse.row(b, h, i) = static_cast<float>(lse);
}

void reference_attention_backward(const core::AttentionProblem<double>& p,
                                  const core::GradientOperands<double>& g) {
  zero(g.dq, p.batch, p.heads_q, p.n_q, p.d);
  zero(g.dk, p.batch, p.heads_kv, p.n_k, p.d);
  zero(g.dv, p.batch, p.heads_kv, p.n_k, p.d_v);
  if (g.dsinks)
    for (int64_t h = 0; h < p.heads_q; ++h) g.dsinks[h * g.dsinks_stride] = 0;
  std::vector<double> s(p.n_k), w(p.n_k), dw(p.n_k);
  std::vector<char> part(p.n_k);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h) {
      // GQA: every query head of a group adds into its one key/value head.
      const int64_t hkv = h / p.group();
      for (int64_t i = 0; i < p.n_q; ++i) {
        double lse = row_weights(p, b, h, i, s, w, part);
        // A saved forward's lse: the weights of the problem it was saved
        // from (this one, or one with more keys: a block of ring attention).
        // A row with no allowed key, or whose logits reach +∞ (its weights
        // the softmax's limit), keeps its own.
        const bool from_saved = p.lse && std::isfinite(lse) && std::isfinite(*p.lse.row(b, h, i));
        if (from_saved) {
          const double saved = *p.lse.row(b, h, i);
          for (int64_t j = 0; j < p.n_k; ++j) w[j] *= std::exp(lse - saved);
          lse = saved;
        }
        const double* dout = g.dout.row(b, h, i);
        // forward: out[c] = sum_j w[j] v[j][c]
        // so:      dw[j] = dout · v[j];  dv[j][c] += w[j] dout[c]
        for (int64_t j = 0; j < p.n_k; ++j) {
          dw[j] = 0;
          if (w[j] == 0) continue;  // not allowed (or underflowed): no gradient
          const double* v = p.v.row(b, hkv, j);
          double* dv = g.dv.row(b, hkv, j);
          for (int64_t c = 0; c < p.d_v; ++c) {
            dw[j] += dout[c * g.dout.col_stride] * v[c * p.v.col_stride];
            dv[c * g.dv.col_stride] += w[j] * dout[c * g.dout.col_stride];
          }
        }
        // forward: w = softmax(logits) (the sink: one more logit, value 0)
        // so:      dlogit[j] = w[j] (dw[j] - sum_l w[l] dw[l]),
        //          dsink = w_sink (0 - sum_l w[l] dw[l]), w_sink = exp(sink - lse)
        double wdw = 0;
        if (from_saved) {
          const double* out = p.out.row(b, h, i);
          for (int64_t c = 0; c < p.d_v; ++c) wdw += dout[c * g.dout.col_stride] * out[c * p.out.col_stride];
        } else {
          for (int64_t j = 0; j < p.n_k; ++j) wdw += w[j] * dw[j];
        }
        if (g.dsinks) g.dsinks[h * g.dsinks_stride] -= std::exp(p.sinks[h] - lse) * wdw;
        const double* q = p.q.row(b, h, i);
        double* dq = g.dq.row(b, h, i);
        for (int64_t j = 0; j < p.n_k; ++j) {
          if (w[j] == 0) continue;
          double ds = w[j] * (dw[j] - wdw);
          // forward: logit = softcap tanh(s / softcap) + mask;  so: ds *= 1 - tanh²
          if (p.softcap > 0) {
            const double t = std::tanh(s[j] / p.softcap);
            ds *= 1 - t * t;
          }
          // forward: s = scale q·k;  so: dq += scale ds k;  dk += scale ds q
          const double* k = p.k.row(b, hkv, j);
          double* dk = g.dk.row(b, hkv, j);
          for (int64_t c = 0; c < p.d; ++c) {
            dq[c * g.dq.col_stride] += p.scale * ds * k[c * p.k.col_stride];
            dk[c * g.dk.col_stride] += p.scale * ds * q[c * p.q.col_stride];
          }
        }
      }
    }
}

void reference_sparse_attention(const core::SparseProblem<double>& p) {
  std::vector<double> w(static_cast<size_t>(p.topk));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.n_q; ++i) {
        const int64_t hkv = h / p.group();
        const int32_t* idx = p.indices_row(b, hkv, i);
        const double* q = p.q.row(b, h, i);
        // logits: scale q·k, then softcap; −∞ for an empty slot
        for (int64_t t = 0; t < p.topk; ++t) {
          const int32_t j = idx[t * p.indices.col_stride];
          w[t] = -std::numeric_limits<double>::infinity();
          if (j < 0) continue;
          const double* k = p.k.row(b, hkv, j);
          double dot = 0;
          for (int64_t c = 0; c < p.d; ++c) dot += q[c] * k[c];
          w[t] = p.scale * dot;
          if (p.softcap > 0) w[t] = p.softcap * std::tanh(w[t] / p.softcap);
        }
        *p.lse.row(b, h, i) = core::softmax_by_definition(
            w.data(), p.topk, p.sinks.empty() ? -std::numeric_limits<double>::infinity() : p.sinks[h]);
        double* out = p.out.row(b, h, i);
        std::fill(out, out + p.d_v, 0.0);
        for (int64_t t = 0; t < p.topk; ++t) {
          const int32_t j = idx[t * p.indices.col_stride];
          if (j < 0 || w[t] == 0) continue;  // an empty slot (its weight 0, or NaN in a NaN row)
          const double* v = p.v.row(b, hkv, j);
          for (int64_t c = 0; c < p.d_v; ++c) out[c] += w[t] * v[c];
        }
      }
}

}  // namespace attn::reference
