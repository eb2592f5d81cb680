/* A C program that uses an installed attn through its C API: attention of
   one query over two keys against its closed form, the library's version
   against the header's. */
#include <attn/attn.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  float q[2] = {1, 0}, k[4] = {1, 0, 0, 1}, v[4] = {1, 2, 3, 4}, out[2];
  const int64_t q_shape[] = {1, 2}, kv_shape[] = {2, 2};
  attn_tensor tq = {q, ATTN_F32, 2, q_shape, NULL}, tk = {k, ATTN_F32, 2, kv_shape, NULL},
              tv = {v, ATTN_F32, 2, kv_shape, NULL}, tout = {out, ATTN_F32, 2, q_shape, NULL};
  /* Scores q·k / sqrt(2) = (1/sqrt(2), 0): the first key's weight is the logistic of 1/sqrt(2). */
  const double w = 1 / (1 + exp(-1 / sqrt(2.0)));
  const double expect[2] = {w * 1 + (1 - w) * 3, w * 2 + (1 - w) * 4};
  int c;
  if (attn_attention(&tq, &tk, &tv, NULL, NULL, &tout) != ATTN_OK) {
    printf("attn_attention: %s\n", attn_last_error());
    return 1;
  }
  for (c = 0; c < 2; ++c)
    if (fabs(out[c] - expect[c]) > 1e-6) {
      printf("attention: column %d is %.9g, expected %.9g\n", c, out[c], expect[c]);
      return 1;
    }
  if (strcmp(attn_version(), ATTN_VERSION) != 0) {
    printf("library %s, header %s\n", attn_version(), ATTN_VERSION);
    return 1;
  }
  printf("attn %s from C: attention of one query over two keys matches its closed form\n", attn_version());
  return 0;
}
