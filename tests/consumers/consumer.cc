// A program that uses attn as any project would: the installed headers and
// library only. Attention of one query over two keys against its closed
// form, and the library's version against the header's.
#include <attn/attn.hpp>
#include <attn/version.h>

#include <cmath>
#include <cstdio>

int main() {
  const attn::Tensor<float> q({1, 2}, {1, 0}), k({2, 2}, {1, 0, 0, 1}), v({2, 2}, {1, 2, 3, 4});
  const attn::Tensor<float> out = attn::attention(q.view(), k.view(), v.view());
  // Scores q·k / sqrt(2) = (1/sqrt(2), 0): the first key's weight is the logistic of 1/sqrt(2).
  const double w = 1 / (1 + std::exp(-1 / std::sqrt(2.0)));
  const double expect[] = {w * 1 + (1 - w) * 3, w * 2 + (1 - w) * 4};
  for (int c = 0; c < 2; ++c)
    if (std::fabs(out[c] - expect[c]) > 1e-6) {
      std::printf("attention: column %d is %.9g, expected %.9g\n", c, out[c], expect[c]);
      return 1;
    }
  std::printf("attn %s: attention of one query over two keys matches its closed form\n", ATTN_VERSION);
  return 0;
}
