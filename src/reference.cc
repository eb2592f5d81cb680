// The double-precision reference: the definition of attention, written as
// plainly as possible. It is the oracle every fast path is tested against and
// the float64 path of the library; keep it small and obviously right.
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
  if (p.window.left >= 0 && j < pos - p.window.left) return false;
  if (p.window.right >= 0 && j > pos + p.window.right) return false;
  return true;
}

}  // namespace

void reference_attention(const AttentionProblem<double>& p) {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> logits(p.n_k), w(p.n_k);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t hkv = h / p.group();
      for (int64_t i = 0; i < p.n_q; ++i) {
        const double* q = p.q.row(b, h, i);
        // logits = q·k * scale, softcapped, plus the mask; -inf = not allowed.
        double max = -inf;
        for (int64_t j = 0; j < p.n_k; ++j) {
          const double* k = p.k.row(b, hkv, j);
          double s = 0;
          for (int64_t c = 0; c < p.d; ++c) s += q[c * p.q.col_stride] * k[c * p.k.col_stride];
          s *= p.scale;
          if (p.softcap > 0) s = p.softcap * std::tanh(s / p.softcap);
          if (p.mask.present()) s += p.mask.value(b, h, i, j);
          logits[j] = allowed(p, i, j) ? s : -inf;
          max = std::fmax(max, logits[j]);
        }
        // softmax; a row with no allowed key gets all-zero weights.
        double sum = 0;
        for (int64_t j = 0; j < p.n_k; ++j) {
          if (max == -inf) w[j] = 0;
          else if (max == inf) w[j] = logits[j] == inf ? 1 : 0;
          else w[j] = std::exp(logits[j] - max);
          sum += w[j];
        }
        for (int64_t j = 0; j < p.n_k; ++j) w[j] = sum > 0 ? w[j] / sum : 0;
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

}  // namespace attn::detail
