// The double-precision reference: the definition of attention and of its
// gradient, written as plainly as possible. It is the oracle every fast path
// is tested against and the float64 path of the library; keep it small and
// obviously right. The backward mirrors the forward line by line (llm.c).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention_problem.hpp"

namespace attn::detail {
namespace {

// Causal and window rules exactly as SPEC "Semantics" states them.
bool allowed(const AttentionProblem<double>& p, int64_t i, int64_t j) {
  const int64_t pos = i + (p.n_k - p.n_q);
  if (p.causal == Causal::BottomRight && j > pos) return false;
  if (p.causal == Causal::TopLeft && j > i) return false;
  // (pos - j and j - pos cannot overflow; pos ± a window of up to INT64_MAX can.)
  if (p.window.left >= 0 && pos - j > p.window.left) return false;
  if (p.window.right >= 0 && j - pos > p.window.right) return false;
  return true;
}

// Row (b, h, i) of the attention weights into w (n_k), and the scaled logits
// before softcap and mask into s (the backward needs them). A row with no
// allowed key gets all-zero weights; one with a NaN logit, all-NaN weights.
void row_weights(const AttentionProblem<double>& p, int64_t b, int64_t h, int64_t i,
                 std::vector<double>& s, std::vector<double>& w) {
  const double inf = std::numeric_limits<double>::infinity();
  const double* q = p.q.row(b, h, i);
  const int64_t hkv = h / p.group();
  // logits = q·k * scale, softcapped, plus the mask; -inf = not allowed
  // (causal, window, a false boolean mask: whatever the logit, even NaN).
  double max = -inf;
  bool nan = false;
  for (int64_t j = 0; j < p.n_k; ++j) {
    const double* k = p.k.row(b, hkv, j);
    double dot = 0;
    for (int64_t c = 0; c < p.d; ++c) dot += q[c * p.q.col_stride] * k[c * p.k.col_stride];
    s[j] = dot * p.scale;
    const double logit = p.softcap > 0 ? p.softcap * std::tanh(s[j] / p.softcap) : s[j];
    const double mask = p.mask.present() ? p.mask.value(b, h, i, j) : 0.0;
    const bool masked_out = p.mask.boolean && mask == -inf;
    w[j] = allowed(p, i, j) && !masked_out ? logit + mask : -inf;
    nan = nan || std::isnan(w[j]);
    max = std::fmax(max, w[j]);
  }
  // A NaN logit (a NaN input, 0 · inf, inf - inf) makes the whole row NaN.
  if (nan) {
    std::fill(w.begin(), w.end(), std::numeric_limits<double>::quiet_NaN());
    return;
  }
  // softmax in place
  double sum = 0;
  for (int64_t j = 0; j < p.n_k; ++j) {
    if (max == -inf) w[j] = 0;
    else if (max == inf) w[j] = w[j] == inf ? 1 : 0;
    else w[j] = std::exp(w[j] - max);
    sum += w[j];
  }
  for (int64_t j = 0; j < p.n_k; ++j) w[j] = sum > 0 ? w[j] / sum : 0;
}

void zero(const Operand<double>& t, int64_t batch, int64_t heads, int64_t rows, int64_t cols) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t c = 0; c < cols; ++c) t.row(b, h, i)[c * t.col_stride] = 0;
}

}  // namespace

void reference_attention(const AttentionProblem<double>& p) {
  std::vector<double> s(p.n_k), w(p.n_k);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t hkv = h / p.group();
      for (int64_t i = 0; i < p.n_q; ++i) {
        row_weights(p, b, h, i, s, w);
        // out = weights · V
        double* out = p.out.row(b, h, i);
        for (int64_t c = 0; c < p.d_v; ++c) {
          double acc = 0;
          for (int64_t j = 0; j < p.n_k; ++j)
            if (w[j] != 0) acc += w[j] * p.v.row(b, hkv, j)[c * p.v.col_stride];
          out[c * p.out.col_stride] = acc;
        }
        if (p.weights)
          for (int64_t j = 0; j < p.n_k; ++j)
            p.weights.row(b, h, i)[j * p.weights.col_stride] = w[j];
      }
    }
}

void reference_attention_backward(const AttentionProblem<double>& p,
                                  const GradientOperands<double>& g) {
  zero(g.dq, p.batch, p.heads_q, p.n_q, p.d);
  zero(g.dk, p.batch, p.heads_kv, p.n_k, p.d);
  zero(g.dv, p.batch, p.heads_kv, p.n_k, p.d_v);
  std::vector<double> s(p.n_k), w(p.n_k), dw(p.n_k);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h) {
      // GQA: every query head of a group adds into its one key/value head.
      const int64_t hkv = h / p.group();
      for (int64_t i = 0; i < p.n_q; ++i) {
        row_weights(p, b, h, i, s, w);
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
        // forward: w = softmax(logits)
        // so:      dlogit[j] = w[j] (dw[j] - sum_l w[l] dw[l])
        double wdw = 0;
        for (int64_t j = 0; j < p.n_k; ++j) wdw += w[j] * dw[j];
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

}  // namespace attn::detail
