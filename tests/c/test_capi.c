/* The C API (attn/attn.h) from C99: every function against values computed
   here in double precision (a naive attention loop, the sinusoidal closed
   form, RoPE's rotation, the layer's projections), and every error path:
   the status and that attn_last_error() names the problem.
   Run by ctest as capi_c (from the build's tests folder, where it writes its
   two small weights files). */
#define _POSIX_C_SOURCE 200809L /* fork, waitpid, alarm, threads */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "attn/attn.h"

static int failures = 0;

#define CHECK(cond)                                                  \
  do {                                                               \
    if (!(cond)) {                                                   \
      fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                    \
    }                                                                \
  } while (0)

/* A call's status, and that the message names the problem (contains `text`). */
static void expect_error(int status, int expected, const char* text, int line) {
  const char* message = attn_last_error();
  if (status != expected || strstr(message, text) == NULL) {
    fprintf(stderr, "line %d: status %d (expected %d), message '%s' (expected to contain '%s')\n",
            line, status, expected, message, text);
    ++failures;
  }
}
#define EXPECT_ERROR(call, expected, text) expect_error((call), (expected), (text), __LINE__)

/* Largest |a[i] - b[i]| <= tol. */
static void expect_close_f(const float* got, const double* want, int64_t n, double tol, int line) {
  int64_t i;
  for (i = 0; i < n; ++i)
    if (!(fabs(got[i] - want[i]) <= tol)) {
      fprintf(stderr, "line %d: element %ld is %.9g, expected %.9g (tolerance %g)\n", line,
              (long)i, got[i], want[i], tol);
      ++failures;
      return;
    }
}
static void expect_close_d(const double* got, const double* want, int64_t n, double tol, int line) {
  int64_t i;
  for (i = 0; i < n; ++i)
    if (!(fabs(got[i] - want[i]) <= tol)) {
      fprintf(stderr, "line %d: element %ld is %.17g, expected %.17g (tolerance %g)\n", line,
              (long)i, got[i], want[i], tol);
      ++failures;
      return;
    }
}

/* Reproducible values in [-1, 1), exact in float. */
static double next_value(uint32_t* state) {
  *state = *state * 1664525u + 1013904223u;
  return (double)(*state >> 8) / (double)(1u << 23) - 1.0;
}

static attn_tensor tensor(void* data, attn_dtype dtype, int32_t rank, const int64_t* shape) {
  attn_tensor t;
  t.data = data;
  t.dtype = dtype;
  t.rank = rank;
  t.shape = shape;
  t.strides = NULL;
  return t;
}

/* Attention of one head, naively: q (nq, d), k (nk, d), v (nk, dv) with row
   strides d, d and dv; allowed[i*nk+j] (NULL: all), causal/window/softcap and
   the ALiBi slope (0: none) as docs/semantics.md states them. */
static void reference_head(const double* q, const double* k, const double* v, int64_t nq,
                           int64_t nk, int64_t d, int64_t dv, const unsigned char* allowed,
                           int causal, int64_t left, int64_t right, double scale, double softcap,
                           double alibi, double* out) {
  int64_t i, j, c;
  for (i = 0; i < nq; ++i) {
    double logits[64], max = -INFINITY, sum = 0;
    const int64_t p = i + (nk - nq);
    for (j = 0; j < nk; ++j) {
      double s = 0;
      int ok = allowed == NULL || allowed[i * nk + j];
      if (causal == 1 && j > p) ok = 0;
      if (causal == 2 && j > i) ok = 0;
      if (left >= 0 && j < p - left) ok = 0;
      if (right >= 0 && j > p + right) ok = 0;
      for (c = 0; c < d; ++c) s += q[i * d + c] * k[j * d + c];
      s *= scale;
      if (softcap > 0) s = softcap * tanh(s / softcap);
      s -= alibi * (double)(p - j);
      logits[j] = ok ? s : -INFINITY;
      if (logits[j] > max) max = logits[j];
    }
    for (j = 0; j < nk; ++j) sum += logits[j] == -INFINITY ? 0 : exp(logits[j] - max);
    for (c = 0; c < dv; ++c) {
      double acc = 0;
      for (j = 0; j < nk; ++j)
        if (logits[j] != -INFINITY) acc += exp(logits[j] - max) / sum * v[j * dv + c];
      out[i * dv + c] = acc;
    }
  }
}

enum { HQ = 4, HKV = 2, NQ = 3, NK = 5, D = 4, DV = 3 };
static const int64_t q_shape[] = {HQ, NQ, D}, k_shape[] = {HKV, NK, D}, v_shape[] = {HKV, NK, DV},
                     out_shape[] = {HQ, NQ, DV};

/* The attention tests' GQA problem (4 query heads over 2 kv heads): q, k and
   v in float32 (behind the F32 descriptors tq, tk, tv; tout for the output)
   and the same values in double. */
static struct {
  float q[HQ * NQ * D], k[HKV * NK * D], v[HKV * NK * DV], out[HQ * NQ * DV];
  double qd[HQ * NQ * D], kd[HKV * NK * D], vd[HKV * NK * DV];
  attn_tensor tq, tk, tv, tout;
} gqa;

static void random_gqa(uint32_t state) {
  int i;
  for (i = 0; i < HQ * NQ * D; ++i) gqa.q[i] = (float)(gqa.qd[i] = next_value(&state));
  for (i = 0; i < HKV * NK * D; ++i) gqa.k[i] = (float)(gqa.kd[i] = next_value(&state));
  for (i = 0; i < HKV * NK * DV; ++i) gqa.v[i] = (float)(gqa.vd[i] = next_value(&state));
  gqa.tq = tensor(gqa.q, ATTN_F32, 3, q_shape);
  gqa.tk = tensor(gqa.k, ATTN_F32, 3, k_shape);
  gqa.tv = tensor(gqa.v, ATTN_F32, 3, v_shape);
  gqa.tout = tensor(gqa.out, ATTN_F32, 3, out_shape);
}

static void test_attention(void) {
  /* A bool mask broadcast over heads, bottom-right causal, a window, softcap
     and scale all at once. */
  static double want[HQ * NQ * DV], outd[HQ * NQ * DV];
  _Bool mask[NQ * NK];
  unsigned char allowed[NQ * NK];
  const int64_t mask_shape[] = {NQ, NK};
  const int64_t k_strides[] = {D * NK, 1, NK}; /* k stored transposed, in kt below */
  int i, h;
  attn_tensor tmask;
  attn_options options;
  random_gqa(1);
  /* Query i may not attend key i + 1 (mod NK): with the causal window every
     row keeps two keys. */
  for (i = 0; i < NQ * NK; ++i) {
    allowed[i] = (unsigned char)(i % NK != (i / NK + 1) % NK);
    mask[i] = allowed[i] != 0;
  }
  tmask = tensor(mask, ATTN_BOOL, 2, mask_shape);
  attn_options_init(&options);
  options.causal = 1;
  options.window_left = 2;
  options.scale = 0.75;
  options.softcap = 1.5;
  for (h = 0; h < HQ; ++h)
    reference_head(gqa.qd + h * NQ * D, gqa.kd + h / 2 * NK * D, gqa.vd + h / 2 * NK * DV, NQ, NK, D, DV,
                   allowed, 1, 2, -1, 0.75, 1.5, 0, want + h * NQ * DV);
  CHECK(attn_attention(&gqa.tq, &gqa.tk, &gqa.tv, &tmask, &options, &gqa.tout) == ATTN_OK);
  CHECK(strcmp(attn_last_error(), "") == 0);
  /* float32 kernel (float32 dot products, exponentials and sums over at most
     5 keys of values in [-1, 1]) against double: a few float ulps, < 1e-5. */
  expect_close_f(gqa.out, want, HQ * NQ * DV, 1e-5, __LINE__);

  /* float64, defaults (NULL options), no mask, and k as a strided view: the
     reference path in double agrees to rounding (1e-12). */
  {
    static double kt[HKV * D * NK];
    int64_t kv, j, c;
    for (kv = 0; kv < HKV; ++kv)
      for (j = 0; j < NK; ++j)
        for (c = 0; c < D; ++c) kt[kv * D * NK + c * NK + j] = gqa.kd[kv * NK * D + j * D + c];
    gqa.tq = tensor(gqa.qd, ATTN_F64, 3, q_shape);
    gqa.tk = tensor(kt, ATTN_F64, 3, k_shape);
    gqa.tk.strides = k_strides;
    gqa.tv = tensor(gqa.vd, ATTN_F64, 3, v_shape);
    gqa.tout = tensor(outd, ATTN_F64, 3, out_shape);
    for (h = 0; h < HQ; ++h)
      reference_head(gqa.qd + h * NQ * D, gqa.kd + h / 2 * NK * D, gqa.vd + h / 2 * NK * DV, NQ, NK, D, DV,
                     NULL, 0, -1, -1, 1 / sqrt((double)D), 0, 0, want + h * NQ * DV);
    CHECK(attn_attention(&gqa.tq, &gqa.tk, &gqa.tv, NULL, NULL, &gqa.tout) == ATTN_OK);
    expect_close_d(outd, want, HQ * NQ * DV, 1e-12, __LINE__);
  }

  /* options.size: a caller's older, shorter struct covering only causal
     gets the defaults for the rest (here a scale it did not set). */
  {
    attn_options old;
    double want_causal[HQ * NQ * DV];
    attn_options_init(&old);
    old.size = offsetof(attn_options, scale);
    old.causal = 2;
    old.scale = 123; /* past old.size: not read */
    for (h = 0; h < HQ; ++h)
      reference_head(gqa.qd + h * NQ * D, gqa.kd + h / 2 * NK * D, gqa.vd + h / 2 * NK * DV, NQ, NK, D, DV,
                     NULL, 2, -1, -1, 1 / sqrt((double)D), 0, 0, want_causal + h * NQ * DV);
    CHECK(attn_attention(&gqa.tq, &gqa.tk, &gqa.tv, NULL, &old, &gqa.tout) == ATTN_OK);
    expect_close_d(outd, want_causal, HQ * NQ * DV, 1e-12, __LINE__);
  }
  /* causal 3 with an explicit offset: n_k - n_q is bottom-right, 0 top-left. */
  {
    attn_options offset;
    double want_offset[HQ * NQ * DV];
    int align;
    for (align = 1; align <= 2; ++align) {
      attn_options_init(&offset);
      offset.causal = 3;
      offset.causal_offset = align == 1 ? NK - NQ : 0;
      for (h = 0; h < HQ; ++h)
        reference_head(gqa.qd + h * NQ * D, gqa.kd + h / 2 * NK * D, gqa.vd + h / 2 * NK * DV, NQ, NK, D, DV,
                       NULL, align, -1, -1, 1 / sqrt((double)D), 0, 0, want_offset + h * NQ * DV);
      CHECK(attn_attention(&gqa.tq, &gqa.tk, &gqa.tv, NULL, &offset, &gqa.tout) == ATTN_OK);
      expect_close_d(outd, want_offset, HQ * NQ * DV, 1e-12, __LINE__);
    }
  }
  /* A newer, longer struct: zero extra bytes are fine, others refused. */
  {
    struct {
      attn_options options;
      int64_t future;
    } newer;
    memset(&newer, 0, sizeof newer);
    attn_options_init(&newer.options);
    newer.options.size = sizeof newer;
    CHECK(attn_attention(&gqa.tq, &gqa.tk, &gqa.tv, NULL, &newer.options, &gqa.tout) == ATTN_OK);
    newer.future = 1;
    EXPECT_ERROR(attn_attention(&gqa.tq, &gqa.tk, &gqa.tv, NULL, &newer.options, &gqa.tout),
                 ATTN_ERROR_INVALID_ARGUMENT, "extra bytes are not zero");
  }
}

static void test_attention_errors(void) {
  float q[2 * 3] = {0}, k[4 * 3] = {0}, v[4 * 3] = {0}, out[2 * 3] = {0};
  double qd[2 * 3] = {0};
  const int64_t q_shape[] = {2, 3}, kv_shape[] = {4, 3}, wrong_shape[] = {4, 2},
                huge_shape[] = {INT64_MAX / 2, 3}, negative_shape[] = {-1, 3};
  const int64_t huge_strides[] = {INT64_MAX / 4, 1};
  attn_tensor tq = tensor(q, ATTN_F32, 2, q_shape), tk = tensor(k, ATTN_F32, 2, kv_shape),
              tv = tensor(v, ATTN_F32, 2, kv_shape), tout = tensor(out, ATTN_F32, 2, q_shape),
              bad;
  attn_options options;
  CHECK(attn_attention(&tq, &tk, &tv, NULL, NULL, &tout) == ATTN_OK);

  /* An output over an input (out aliasing v returned ATTN_OK and wrong
     numbers), over itself (a zero row stride) or over another output:
     refused, naming both. */
  {
    const int64_t zero_rows[] = {0, 1}, w_shape[] = {2, 4};
    bad = tensor(v, ATTN_F32, 2, q_shape);
    EXPECT_ERROR(attn_attention(&tq, &tk, &tv, NULL, NULL, &bad), ATTN_ERROR_INVALID_ARGUMENT,
                 "out and v share memory");
    bad = tout;
    bad.strides = zero_rows;
    EXPECT_ERROR(attn_attention(&tq, &tk, &tv, NULL, NULL, &bad), ATTN_ERROR_INVALID_ARGUMENT,
                 "out (shape (2, 3), strides (0, 1)) has elements that share memory");
    bad = tensor(out, ATTN_F32, 2, w_shape);
    EXPECT_ERROR(attn_attention_extras(&tq, &tk, &tv, NULL, NULL, &tout, &bad, NULL, 2, NULL),
                 ATTN_ERROR_INVALID_ARGUMENT, "weights and out share memory");
  }

  EXPECT_ERROR(attn_attention(NULL, &tk, &tv, NULL, NULL, &tout), ATTN_ERROR_INVALID_ARGUMENT,
               "attn_attention: q is NULL");
  EXPECT_ERROR(attn_attention(&tq, &tk, &tv, NULL, NULL, NULL), ATTN_ERROR_INVALID_ARGUMENT,
               "attn_attention: out is NULL");
  bad = tk;
  bad.dtype = (attn_dtype)8;
  EXPECT_ERROR(attn_attention(&tq, &bad, &tv, NULL, NULL, &tout), ATTN_ERROR_INVALID_ARGUMENT,
               "k: dtype 8 is not an attn_dtype");
  bad = tk;
  bad.rank = -1;
  EXPECT_ERROR(attn_attention(&tq, &bad, &tv, NULL, NULL, &tout), ATTN_ERROR_INVALID_ARGUMENT,
               "k: rank -1 is not in [0, 16]");
  bad.rank = 1000;
  EXPECT_ERROR(attn_attention(&tq, &bad, &tv, NULL, NULL, &tout), ATTN_ERROR_INVALID_ARGUMENT,
               "k: rank 1000");
  bad = tv;
  bad.shape = NULL;
  EXPECT_ERROR(attn_attention(&tq, &tk, &bad, NULL, NULL, &tout), ATTN_ERROR_INVALID_ARGUMENT,
               "v: shape is NULL");
  bad = tv;
  bad.data = NULL;
  EXPECT_ERROR(attn_attention(&tq, &tk, &bad, NULL, NULL, &tout), ATTN_ERROR_INVALID_ARGUMENT,
               "v: data is NULL");
  /* Wrong rank and shapes: the C++ API's messages. */
  bad = tensor(q, ATTN_F32, 1, q_shape);
  EXPECT_ERROR(attn_attention(&bad, &tk, &tv, NULL, NULL, &tout), ATTN_ERROR_INVALID_ARGUMENT,
               "rank");
  bad = tensor(v, ATTN_F32, 2, wrong_shape);
  EXPECT_ERROR(attn_attention(&tq, &tk, &tv, NULL, NULL, &bad), ATTN_ERROR_INVALID_ARGUMENT,
               "(4, 2)");
  /* Dtypes the C++ API has no kernel for. */
  bad = tensor(qd, ATTN_F64, 2, q_shape);
  EXPECT_ERROR(attn_attention(&bad, &tk, &tv, NULL, NULL, &tout), ATTN_ERROR_UNSUPPORTED,
               "q F64, k F32");
  bad = tensor(k, ATTN_BOOL, 2, kv_shape);
  EXPECT_ERROR(attn_attention(&tq, &bad, &bad, NULL, NULL, &tout), ATTN_ERROR_UNSUPPORTED,
               "k BOOL");
  bad = tensor(k, ATTN_BF16, 2, kv_shape);
  EXPECT_ERROR(attn_attention(&tq, &bad, &bad, &bad, NULL, &tout), ATTN_ERROR_UNSUPPORTED,
               "mask: dtype BF16");
  /* Shapes no memory can hold, and strides past any address. */
  bad = tensor(k, ATTN_F32, 2, huge_shape);
  EXPECT_ERROR(attn_attention(&tq, &bad, &tv, NULL, NULL, &tout), ATTN_ERROR_INVALID_ARGUMENT,
               "attn_attention: k: shape");
  bad = tensor(k, ATTN_F32, 2, negative_shape);
  EXPECT_ERROR(attn_attention(&tq, &bad, &tv, NULL, NULL, &tout), ATTN_ERROR_INVALID_ARGUMENT,
               "negative dimension");
  bad = tk;
  bad.strides = huge_strides;
  EXPECT_ERROR(attn_attention(&tq, &bad, &tv, NULL, NULL, &tout), ATTN_ERROR_INVALID_ARGUMENT,
               "reach beyond any memory");
  /* A one-byte (BOOL) mask whose reach, 2^62 bytes, still fits in int64
     but in no address space: read, it crashed (fuzz_capi found it). */
  {
    const int64_t mask_shape[] = {2, 4}, far_strides[] = {INT64_MAX / 2, 1};
    _Bool mask[2 * 4] = {1, 1, 1, 1, 1, 1, 1, 1};
    bad = tensor(mask, ATTN_BOOL, 2, mask_shape);
    bad.strides = far_strides;
    EXPECT_ERROR(attn_attention(&tq, &tk, &tv, &bad, NULL, &tout), ATTN_ERROR_INVALID_ARGUMENT,
                 "attn_attention: mask: strides (4611686018427387903, 1) for shape (2, 4) reach beyond any memory");
  }
  /* Even with no element: the kernels would step row pointers by them
     (fuzz_capi found it). */
  {
    const int64_t empty_rows[] = {4, 0}, empty_out[] = {2, 0}, min_strides[] = {INT64_MIN, 1};
    attn_tensor no_out = tensor(out, ATTN_F32, 2, empty_out);
    bad = tensor(NULL, ATTN_F32, 2, empty_rows); /* no element: NULL data is fine */
    CHECK(attn_attention(&tq, &tk, &bad, NULL, NULL, &no_out) == ATTN_OK);
    bad.strides = min_strides;
    EXPECT_ERROR(attn_attention(&tq, &tk, &bad, NULL, NULL, &no_out), ATTN_ERROR_INVALID_ARGUMENT,
                 "strides (-9223372036854775808, 1) for shape (4, 0) reach beyond any memory");
  }
  /* Options the C++ API refuses, and a causal value out of range. */
  attn_options_init(&options);
  options.softcap = -1;
  EXPECT_ERROR(attn_attention(&tq, &tk, &tv, NULL, &options, &tout), ATTN_ERROR_INVALID_ARGUMENT,
               "softcap");
  attn_options_init(&options);
  options.causal = 4;
  EXPECT_ERROR(attn_attention(&tq, &tk, &tv, NULL, &options, &tout), ATTN_ERROR_INVALID_ARGUMENT,
               "causal 4");
  options.causal = 3;
  options.causal_offset = -((int64_t)1 << 62) - 1;
  EXPECT_ERROR(attn_attention(&tq, &tk, &tv, NULL, &options, &tout), ATTN_ERROR_INVALID_ARGUMENT,
               "causal offset");
  /* The next successful call clears the message. */
  CHECK(attn_attention(&tq, &tk, &tv, NULL, NULL, &tout) == ATTN_OK);
  CHECK(strcmp(attn_last_error(), "") == 0);
}

/* GGUF's q8_0 block as a C caller lays it out: 34 bytes. */
typedef struct {
  uint16_t d; /* fp16 bits */
  int8_t qs[32];
} q8_0_block;

/* K and V of a block dtype (kb, vb; their values kd, vd) read by attention
   for nq float32 queries q (values qd) against the naive attention of the
   values; a logical last axis that is not whole blocks is refused, named. */
static void check_blocks(attn_dtype dtype, float* q, const double* qd, void* kb, const double* kd, void* vb,
                         const double* vd, int64_t nq, int64_t n, int64_t dk, int64_t dv, float* out,
                         double* want) {
  const int64_t q_shape[] = {nq, dk}, k_shape[] = {n, dk}, v_shape[] = {n, dv}, out_shape[] = {nq, dv},
                bad_shape[] = {n, dk - 16};
  char message[128];
  attn_tensor tq = tensor(q, ATTN_F32, 2, q_shape), tk = tensor(kb, dtype, 2, k_shape),
              tv = tensor(vb, dtype, 2, v_shape), tout = tensor(out, ATTN_F32, 2, out_shape);
  reference_head(qd, kd, vd, nq, n, dk, dv, NULL, 0, -1, -1, 1 / sqrt((double)dk), 0, 0, want);
  CHECK(attn_attention(&tq, &tk, &tv, NULL, NULL, &tout) == ATTN_OK);
  expect_close_f(out, want, nq * dv, 1e-5, __LINE__);
  tk.shape = bad_shape;
  snprintf(message, sizeof message, "attn_attention: k: %s stores blocks of 32 values along the last axis",
           dtype == ATTN_Q8_0 ? "Q8_0" : "Q4_0");
  EXPECT_ERROR(attn_attention(&tq, &tk, &tv, NULL, NULL, &tout), ATTN_ERROR_INVALID_ARGUMENT, message);
}

/* ALiBi through options.alibi_slopes (F64 or F32, one per query head) and
   attn_alibi_slopes; RoPE's frequencies with a rope_scaling dict. */
static void test_positional(void) {
  static double want[HQ * NQ * DV];
  const int64_t slopes_shape[] = {HQ}, three[] = {3}, square[] = {2, 2};
  double slopes[HQ], inv_freq[4], factor;
  float slopes32[HQ];
  int i, h;
  attn_tensor ts;
  attn_options options;
  CHECK(attn_alibi_slopes(HQ, 8.0, slopes) == ATTN_OK); /* 2^(-8(h+1)/4) */
  for (h = 0; h < HQ; ++h) CHECK(slopes[h] == ldexp(1.0, -2 * (h + 1)));
  EXPECT_ERROR(attn_alibi_slopes(0, 8.0, slopes), ATTN_ERROR_INVALID_ARGUMENT, "num_heads must be in [1, 16777216], got 0");
  random_gqa(3);
  for (h = 0; h < HQ; ++h) slopes32[h] = (float)slopes[h];
  attn_options_init(&options);
  options.causal = 1;
  for (h = 0; h < HQ; ++h)
    reference_head(gqa.qd + h * NQ * D, gqa.kd + h / 2 * NK * D, gqa.vd + h / 2 * NK * DV, NQ, NK, D,
                   DV, NULL, 1, -1, -1, 1 / sqrt((double)D), 0, slopes[h], want + h * NQ * DV);
  ts = tensor(slopes, ATTN_F64, 1, slopes_shape);
  options.alibi_slopes = &ts;
  CHECK(attn_attention(&gqa.tq, &gqa.tk, &gqa.tv, NULL, &options, &gqa.tout) == ATTN_OK);
  expect_close_f(gqa.out, want, HQ * NQ * DV, 1e-5, __LINE__);
  ts = tensor(slopes32, ATTN_F32, 1, slopes_shape);  /* the slopes are powers of 2: exact in float */
  CHECK(attn_attention(&gqa.tq, &gqa.tk, &gqa.tv, NULL, &options, &gqa.tout) == ATTN_OK);
  expect_close_f(gqa.out, want, HQ * NQ * DV, 1e-5, __LINE__);
  ts = tensor(slopes, ATTN_F64, 1, three);
  EXPECT_ERROR(attn_attention(&gqa.tq, &gqa.tk, &gqa.tv, NULL, &options, &gqa.tout),
               ATTN_ERROR_INVALID_ARGUMENT,
               "alibi_slopes must hold one slope per query head (4), got 3");
  ts = tensor(slopes, ATTN_F64, 2, square);
  EXPECT_ERROR(attn_attention(&gqa.tq, &gqa.tk, &gqa.tv, NULL, &options, &gqa.tout),
               ATTN_ERROR_INVALID_ARGUMENT,
               "options.alibi_slopes: must be one slope per query head");
  ts = tensor(slopes, ATTN_BOOL, 1, slopes_shape);
  EXPECT_ERROR(attn_attention(&gqa.tq, &gqa.tk, &gqa.tv, NULL, &options, &gqa.tout), ATTN_ERROR_UNSUPPORTED,
               "options.alibi_slopes: dtype BOOL is not F64 or F32");
  /* An older struct, without the field, has no ALiBi. */
  options.size = offsetof(attn_options, alibi_slopes);
  CHECK(attn_attention(&gqa.tq, &gqa.tk, &gqa.tv, NULL, &options, &gqa.tout) == ATTN_OK);

  CHECK(attn_rope_frequencies(8, 10000.0, "{\"rope_type\": \"linear\", \"factor\": 2}", -1, inv_freq,
                              &factor) == ATTN_OK);
  for (i = 0; i < 4; ++i) CHECK(fabs(inv_freq[i] - pow(10000.0, -i / 4.0) / 2) <= 1e-15);
  CHECK(factor == 1.0);
  CHECK(attn_rope_frequencies(8, 10000.0, "{\"type\": \"yarn\", \"factor\": 4, "
                              "\"original_max_position_embeddings\": 64}", -1, inv_freq, &factor) == ATTN_OK);
  CHECK(fabs(factor - (0.1 * log(4.0) + 1)) <= 1e-15);
  CHECK(attn_rope_frequencies(8, 100.0, NULL, -1, inv_freq, &factor) == ATTN_OK);
  CHECK(inv_freq[1] == pow(100.0, -0.25));
  EXPECT_ERROR(attn_rope_frequencies(8, 10000.0, "{\"rope_type\": \"linear\"", -1, inv_freq, &factor),
               ATTN_ERROR_INVALID_ARGUMENT, "rope_scaling: not valid JSON");
  EXPECT_ERROR(attn_rope_frequencies(8, 10000.0, "{\"rope_type\": \"linear\"}", -1, inv_freq, &factor),
               ATTN_ERROR_INVALID_ARGUMENT, "rope_type 'linear' needs 'factor'");
  EXPECT_ERROR(attn_rope_frequencies(8, 10000.0, NULL, -1, inv_freq, NULL), ATTN_ERROR_INVALID_ARGUMENT,
               "attention_factor is NULL");
}

/* K and V as q8_0 blocks written here from codes and power-of-two scales
   (exact in fp16 and float), read as check_blocks reads them. */
static void test_q8_0(void) {
  enum { N = 6, DK = 64, DQ = 32 };
  static q8_0_block kb[N * DK / 32], vb[N * DQ / 32];
  static float q[2 * DK], out[2 * DQ];
  static double qd[2 * DK], kd[N * DK], vd[N * DQ], want[2 * DQ];
  const uint16_t scale_bits[] = {0x2000, 0x2800, 0x3000}; /* 2^-7, 2^-5, 2^-3 */
  const double scales[] = {1.0 / 128, 1.0 / 32, 1.0 / 8};
  const int64_t q_shape[] = {2, DK}, k_shape[] = {N, DK}, v_shape[] = {N, DQ}, out_shape[] = {2, DQ};
  uint32_t state = 7;
  int64_t i, b, j;
  attn_tensor tq, tk, tv, tout;
  CHECK(sizeof(q8_0_block) == 34);
  for (i = 0; i < 2 * DK; ++i) q[i] = (float)(qd[i] = next_value(&state));
  for (b = 0; b < N * DK / 32 + N * DQ / 32; ++b) {
    q8_0_block* blk = b < N * DK / 32 ? &kb[b] : &vb[b - N * DK / 32];
    double* values = b < N * DK / 32 ? kd + b * 32 : vd + (b - N * DK / 32) * 32;
    blk->d = scale_bits[b % 3];
    for (j = 0; j < 32; ++j) {
      blk->qs[j] = (int8_t)(j == 5 ? -127 : (int)(next_value(&state) * 127));
      values[j] = scales[b % 3] * blk->qs[j];
    }
  }
  check_blocks(ATTN_Q8_0, q, qd, kb, kd, vb, vd, 2, N, DK, DQ, out, want);
  tq = tensor(kb, ATTN_Q8_0, 2, q_shape);
  tk = tensor(kb, ATTN_Q8_0, 2, k_shape);
  tv = tensor(vb, ATTN_Q8_0, 2, v_shape);
  tout = tensor(out, ATTN_F32, 2, out_shape);
  EXPECT_ERROR(attn_attention(&tq, &tk, &tv, NULL, NULL, &tout), ATTN_ERROR_UNSUPPORTED,
               "q Q8_0, k Q8_0");
}

/* GGUF's q4_0 block: 18 bytes, byte j holding code j (low 4 bits) and code
   j + 16 (high 4 bits), each value d * (code - 8). Written here from codes
   and power-of-two scales, read as check_blocks reads them. */
typedef struct {
  uint16_t d; /* fp16 bits */
  uint8_t qs[16];
} q4_0_block;

static void test_q4_0(void) {
  enum { N = 5, DK = 64, DQ = 32 };
  static q4_0_block kb[N * DK / 32], vb[N * DQ / 32];
  static float q[3 * DK], out[3 * DQ];
  static double qd[3 * DK], kd[N * DK], vd[N * DQ], want[3 * DQ];
  const uint16_t scale_bits[] = {0x2400, 0x3400}; /* 2^-6, 2^-2 */
  const double scales[] = {1.0 / 64, 1.0 / 4};
  const int64_t q_shape[] = {3, DK}, k_shape[] = {N, DK}, v_shape[] = {N, DQ}, out_shape[] = {3, DQ};
  uint32_t state = 11;
  int64_t i, b, j;
  attn_tensor tq, tk, tv, tout;
  CHECK(sizeof(q4_0_block) == 18);
  for (i = 0; i < 3 * DK; ++i) q[i] = (float)(qd[i] = next_value(&state));
  for (b = 0; b < N * DK / 32 + N * DQ / 32; ++b) {
    q4_0_block* blk = b < N * DK / 32 ? &kb[b] : &vb[b - N * DK / 32];
    double* values = b < N * DK / 32 ? kd + b * 32 : vd + (b - N * DK / 32) * 32;
    int codes[32];
    blk->d = scale_bits[b % 2];
    for (j = 0; j < 32; ++j) {
      codes[j] = (int)((next_value(&state) + 1) * 8) & 15; /* 0 .. 15 */
      values[j] = scales[b % 2] * (codes[j] - 8);
    }
    for (j = 0; j < 16; ++j) blk->qs[j] = (uint8_t)(codes[j] | codes[j + 16] << 4);
  }
  check_blocks(ATTN_Q4_0, q, qd, kb, kd, vb, vd, 3, N, DK, DQ, out, want);
  tq = tensor(q, ATTN_F32, 2, q_shape);
  tk = tensor(kb, ATTN_Q4_0, 2, k_shape);
  tv = tensor(vb, ATTN_Q8_0, 2, v_shape);
  tout = tensor(out, ATTN_F32, 2, out_shape);
  EXPECT_ERROR(attn_attention(&tq, &tk, &tv, NULL, NULL, &tout), ATTN_ERROR_UNSUPPORTED, "k Q4_0, v Q8_0");
}

/* KIVI's int4 in GGUF's q4_1 block: 20 bytes, an fp16 scale d and minimum m,
   then q4_0's codes; each value d * code + m. Keys take a block per channel
   and group of 32 keys (their data (ceil(n / 32), d) blocks, any d), values
   a block per 32 values of a row. Written here from codes and power-of-two
   scales and minima, exact in fp16 and float. */
typedef struct {
  uint16_t d, m; /* fp16 bits */
  uint8_t qs[16];
} int4_block;

static void test_int4(void) {
  enum { N = 40, G = 2, DK = 40, DQ = 32, NQ = 2 }; /* a last group of 8 keys */
  static int4_block kb[G * DK], vb[N * DQ / 32];
  static float q[NQ * DK], out[NQ * DQ];
  static double qd[NQ * DK], kd[N * DK], vd[N * DQ], want[NQ * DQ];
  const uint16_t scale_bits[] = {0x2400, 0x3400}, min_bits[] = {0xB800, 0x3C00}; /* 2^-6, 2^-2; -0.5, 1 */
  const double scales[] = {1.0 / 64, 1.0 / 4}, mins[] = {-0.5, 1.0};
  const int64_t q_shape[] = {NQ, DK}, k_shape[] = {N, DK}, v_shape[] = {N, DQ}, out_shape[] = {NQ, DQ},
                short_k[] = {N - 1, DK};
  uint32_t state = 13;
  int64_t i, b, j;
  attn_tensor tq, tk, tv, tout;
  CHECK(sizeof(int4_block) == 20);
  for (i = 0; i < NQ * DK; ++i) q[i] = (float)(qd[i] = next_value(&state));
  for (b = 0; b < G * DK + N * DQ / 32; ++b) { /* key blocks (g, c), then value blocks (row, 0) */
    int4_block* blk = b < G * DK ? &kb[b] : &vb[b - G * DK];
    int codes[32];
    blk->d = scale_bits[b % 2];
    blk->m = min_bits[b % 3 % 2];
    for (j = 0; j < 32; ++j) {
      const double value = scales[b % 2] * (codes[j] = (int)((next_value(&state) + 1) * 8) & 15) + mins[b % 3 % 2];
      if (b < G * DK && (b / DK) * 32 + j < N) kd[((b / DK) * 32 + j) * DK + b % DK] = value;
      if (b >= G * DK) vd[(b - G * DK) * 32 + j] = value;
    }
    for (j = 0; j < 16; ++j) blk->qs[j] = (uint8_t)(codes[j] | codes[j + 16] << 4);
  }
  tq = tensor(q, ATTN_F32, 2, q_shape);
  tk = tensor(kb, ATTN_INT4, 2, k_shape);
  tv = tensor(vb, ATTN_INT4, 2, v_shape);
  tout = tensor(out, ATTN_F32, 2, out_shape);
  reference_head(qd, kd, vd, NQ, N, DK, DQ, NULL, 0, -1, -1, 1 / sqrt((double)DK), 0, 0, want);
  CHECK(attn_attention(&tq, &tk, &tv, NULL, NULL, &tout) == ATTN_OK);
  expect_close_f(out, want, NQ * DQ, 1e-5, __LINE__);
  tk.shape = short_k;
  EXPECT_ERROR(attn_attention(&tq, &tk, &tv, NULL, NULL, &tout), ATTN_ERROR_INVALID_ARGUMENT,
               "INT4 keys and values must hold the same number of keys (axis -2), got k (39, 40), v (40, 32)");
}

static void test_sinusoidal(void) {
  enum { N = 7, W = 6 };
  double got[N * W], want[N * W];
  float got_f[N * W];
  const int64_t shape[] = {N, W}, wrong[] = {N, W - 1};
  attn_tensor out = tensor(got, ATTN_F64, 2, shape);
  int p, i;
  for (p = 0; p < N; ++p)
    for (i = 0; i < W; ++i) {
      const double angle = p / pow(10000.0, 2.0 * (i / 2) / W);
      want[p * W + i] = i % 2 == 0 ? sin(angle) : cos(angle);
    }
  CHECK(attn_sinusoidal_encoding(N, W, 10000.0, &out) == ATTN_OK);
  /* Both in double, maybe in another order of operations: 1e-12. */
  expect_close_d(got, want, N * W, 1e-12, __LINE__);
  out = tensor(got_f, ATTN_F32, 2, shape);
  CHECK(attn_sinusoidal_encoding(N, W, 10000.0, &out) == ATTN_OK);
  /* Rounded to float: half an ulp of a value in [-1, 1], < 1e-7. */
  expect_close_f(got_f, want, N * W, 1e-7, __LINE__);

  EXPECT_ERROR(attn_sinusoidal_encoding(N, W, 10000.0, NULL), ATTN_ERROR_INVALID_ARGUMENT,
               "attn_sinusoidal_encoding: out is NULL");
  out = tensor(got, ATTN_F64, 2, wrong);
  EXPECT_ERROR(attn_sinusoidal_encoding(N, W, 10000.0, &out), ATTN_ERROR_INVALID_ARGUMENT,
               "is not (n, d) = (7, 6)");
  out = tensor(got, ATTN_F64, 2, shape);
  EXPECT_ERROR(attn_sinusoidal_encoding(N, W, -1.0, &out), ATTN_ERROR_INVALID_ARGUMENT, "base");
  EXPECT_ERROR(attn_sinusoidal_encoding(-1, W, 10000.0, &out), ATTN_ERROR_INVALID_ARGUMENT,
               "attn_sinusoidal_encoding: n: must be >= 0, got -1");
  EXPECT_ERROR(attn_sinusoidal_encoding(N, 0, 10000.0, &out), ATTN_ERROR_INVALID_ARGUMENT,
               "attn_sinusoidal_encoding: d: must be >= 1, got 0");
  out = tensor(got, ATTN_BF16, 2, shape);
  EXPECT_ERROR(attn_sinusoidal_encoding(N, W, 10000.0, &out), ATTN_ERROR_UNSUPPORTED,
               "out: dtype BF16 is not F32 or F64");
}

/* RoPE of x (rows, d) directly: pair k turns by pos * base^(-2k/r). */
static void reference_rope(const double* x, const int64_t* positions, int64_t rows, int64_t n,
                           int64_t d, int64_t r, int interleaved, double* out) {
  int64_t row, kk;
  memcpy(out, x, (size_t)(rows * d) * sizeof *out);
  for (row = 0; row < rows; ++row)
    for (kk = 0; kk < r / 2; ++kk) {
      const double pos = (double)(positions ? positions[row % n] : row % n);
      const double angle = pos * pow(10000.0, -2.0 * (double)kk / (double)r);
      const int64_t a = interleaved ? 2 * kk : kk, b = interleaved ? 2 * kk + 1 : kk + r / 2;
      const double x1 = x[row * d + a], x2 = x[row * d + b];
      out[row * d + a] = x1 * cos(angle) - x2 * sin(angle);
      out[row * d + b] = x1 * sin(angle) + x2 * cos(angle);
    }
}

static void test_rope(void) {
  enum { B = 2, N = 3, W = 8 };
  double x[B * N * W], got[B * N * W], want[B * N * W];
  float xf[B * N * W], gotf[B * N * W];
  const int64_t shape[] = {B, N, W}, other[] = {B, N, W - 2}, positions[] = {5, 0, 100};
  uint32_t state = 7;
  attn_tensor tx = tensor(x, ATTN_F64, 3, shape), tout = tensor(got, ATTN_F64, 3, shape), bad;
  int i, interleaved;
  for (i = 0; i < B * N * W; ++i) xf[i] = (float)(x[i] = next_value(&state));
  for (interleaved = 0; interleaved < 2; ++interleaved) {
    reference_rope(x, positions, B * N, N, W, 4, interleaved, want);
    CHECK(attn_rope(&tx, positions, 10000.0, interleaved, 4, &tout) == ATTN_OK);
    /* Angles and products in double both: 1e-12. */
    expect_close_d(got, want, B * N * W, 1e-12, __LINE__);
    reference_rope(x, NULL, B * N, N, W, W, interleaved, want);
    CHECK(attn_rope(&tx, NULL, 10000.0, interleaved, 0, &tout) == ATTN_OK);
    expect_close_d(got, want, B * N * W, 1e-12, __LINE__);
  }
  /* float32, in place: computed in double and rounded, < 1e-7 for |x| < 1. */
  reference_rope(x, positions, B * N, N, W, W, 0, want);
  memcpy(gotf, xf, sizeof xf);
  tx = tensor(gotf, ATTN_F32, 3, shape);
  CHECK(attn_rope(&tx, positions, 10000.0, 0, 0, &tx) == ATTN_OK);
  expect_close_f(gotf, want, B * N * W, 2e-7, __LINE__);

  tx = tensor(x, ATTN_F64, 3, shape);
  EXPECT_ERROR(attn_rope(NULL, NULL, 10000.0, 0, 0, &tout), ATTN_ERROR_INVALID_ARGUMENT,
               "attn_rope: x is NULL");
  bad = tensor(got, ATTN_F64, 3, other);
  EXPECT_ERROR(attn_rope(&tx, NULL, 10000.0, 0, 0, &bad), ATTN_ERROR_INVALID_ARGUMENT,
               "out has shape (2, 3, 6)");
  bad = tensor(x, ATTN_F64, 1, shape);
  EXPECT_ERROR(attn_rope(&bad, NULL, 10000.0, 0, 0, &tout), ATTN_ERROR_INVALID_ARGUMENT,
               "rope: x must have shape (..., n, d)");
  EXPECT_ERROR(attn_rope(&tx, NULL, 10000.0, 0, 3, &tout), ATTN_ERROR_INVALID_ARGUMENT,
               "rotary_dim");
  bad = tensor(gotf, ATTN_F32, 3, shape);
  EXPECT_ERROR(attn_rope(&tx, NULL, 10000.0, 0, 0, &bad), ATTN_ERROR_UNSUPPORTED,
               "dtypes x F64, out F32");
  EXPECT_ERROR(attn_rope(&tx, NULL, 10000.0, 7, 0, &tout), ATTN_ERROR_INVALID_ARGUMENT,
               "attn_rope: interleaved: must be 0 (halves) or 1 (pairs), got 7");
  {
    /* In place is x itself; out one row on from x is refused. */
    const int64_t two_rows[] = {1, 2, W};
    attn_tensor from = tensor(x, ATTN_F64, 3, two_rows);
    bad = tensor(x + W, ATTN_F64, 3, two_rows);
    EXPECT_ERROR(attn_rope(&from, NULL, 10000.0, 0, 0, &bad), ATTN_ERROR_INVALID_ARGUMENT,
                 "rope: out and x share memory");
  }
}

/* A layer file written here, byte by byte (safetensors: an 8-byte
   little-endian header length, the JSON header, the float32 data; this test
   assumes a little-endian machine), E = 4, 2 heads, with biases. */
enum { E = 4, HEADS = 2, T = 3 };
static float w_in[3 * E * E], b_in[3 * E], w_out[E * E], b_out[E];

static int write_layer_claiming(const char* path, int embed_dim) {
  char header[512];
  unsigned char length[8];
  uint64_t n;
  int i;
  FILE* f;
  uint32_t state = 11;
  for (i = 0; i < 3 * E * E; ++i) w_in[i] = (float)next_value(&state);
  for (i = 0; i < 3 * E; ++i) b_in[i] = (float)(0.5 * next_value(&state));
  for (i = 0; i < E * E; ++i) w_out[i] = (float)next_value(&state);
  for (i = 0; i < E; ++i) b_out[i] = (float)(0.5 * next_value(&state));
  sprintf(header,
          "{\"__metadata__\":{\"format\":\"attn.MultiHeadAttention\",\"embed_dim\":\"%d\","
          "\"num_heads\":\"%d\"},"
          "\"in_proj_weight\":{\"dtype\":\"F32\",\"shape\":[%d,%d],\"data_offsets\":[0,%d]},"
          "\"in_proj_bias\":{\"dtype\":\"F32\",\"shape\":[%d],\"data_offsets\":[%d,%d]},"
          "\"out_proj.weight\":{\"dtype\":\"F32\",\"shape\":[%d,%d],\"data_offsets\":[%d,%d]},"
          "\"out_proj.bias\":{\"dtype\":\"F32\",\"shape\":[%d],\"data_offsets\":[%d,%d]}}",
          embed_dim, HEADS, 3 * E, E, 12 * E * E, 3 * E, 12 * E * E, 12 * E * E + 12 * E, E, E,
          12 * E * E + 12 * E, 16 * E * E + 12 * E, E, 16 * E * E + 12 * E, 16 * E * E + 16 * E);
  n = strlen(header);
  for (i = 0; i < 8; ++i) length[i] = (unsigned char)(n >> (8 * i));
  f = fopen(path, "wb");
  if (!f) return 0;
  fwrite(length, 1, 8, f);
  fwrite(header, 1, (size_t)n, f);
  fwrite(w_in, sizeof w_in, 1, f);
  fwrite(b_in, sizeof b_in, 1, f);
  fwrite(w_out, sizeof w_out, 1, f);
  fwrite(b_out, sizeof b_out, 1, f);
  return fclose(f) == 0;
}

static int write_layer(const char* path) { return write_layer_claiming(path, E); }

/* y (rows, out) = x (rows, in) Wᵀ + b, W (out, in) as nn.Linear. */
static void linear(const double* x, const float* w, const float* b, int rows, int in, int out_dim,
                   double* y) {
  int r, o, c;
  for (r = 0; r < rows; ++r)
    for (o = 0; o < out_dim; ++o) {
      double acc = b[o];
      for (c = 0; c < in; ++c) acc += x[r * in + c] * w[o * in + c];
      y[r * out_dim + o] = acc;
    }
}

/* The layer's self-attention of x (T, E), causal: per head attention of the
   projections, concatenated, projected out. */
static void reference_mha(const double* x, int causal, double* out) {
  double qkv[3][T * E], qh[T * (E / HEADS)], kh[T * (E / HEADS)], vh[T * (E / HEADS)],
      oh[T * (E / HEADS)], concat[T * E];
  const int hd = E / HEADS;
  int p, h, t, c;
  for (p = 0; p < 3; ++p) linear(x, w_in + p * E * E, b_in + p * E, T, E, E, qkv[p]);
  for (h = 0; h < HEADS; ++h) {
    for (t = 0; t < T; ++t)
      for (c = 0; c < hd; ++c) {
        qh[t * hd + c] = qkv[0][t * E + h * hd + c];
        kh[t * hd + c] = qkv[1][t * E + h * hd + c];
        vh[t * hd + c] = qkv[2][t * E + h * hd + c];
      }
    reference_head(qh, kh, vh, T, T, hd, hd, NULL, causal, -1, -1, 1 / sqrt((double)hd), 0, 0, oh);
    for (t = 0; t < T; ++t)
      for (c = 0; c < hd; ++c) concat[t * E + h * hd + c] = oh[t * hd + c];
  }
  linear(concat, w_out, b_out, T, E, E, out);
}

/* x (1, T, E) through the layer in two chunks, 2 tokens then 1, appending
   to cache, bottom-right causal, into out. */
static void forward_in_chunks(attn_mha* layer, attn_cache* cache, float* x, float* out) {
  const int64_t first[] = {1, 2, E}, last[] = {1, 1, E};
  attn_tensor tx = tensor(x, ATTN_F32, 3, first), tout = tensor(out, ATTN_F32, 3, first);
  attn_options options;
  attn_options_init(&options);
  options.causal = 1;
  CHECK(attn_mha_forward(layer, &tx, cache, &options, &tout) == ATTN_OK);
  tx = tensor(x + 2 * E, ATTN_F32, 3, last);
  tout = tensor(out + 2 * E, ATTN_F32, 3, last);
  CHECK(attn_mha_forward(layer, &tx, cache, &options, &tout) == ATTN_OK);
}

static void test_mha(void) {
  const char* path = "capi_test_layer.safetensors";
  const char* corrupt = "capi_test_corrupt.safetensors";
  attn_mha* layer = NULL;
  attn_cache* cache = NULL;
  double xd[T * E], want[T * E];
  float x[T * E], out[T * E];
  const int64_t shape[] = {1, T, E}, wrong[] = {1, T, 2};
  attn_tensor tx = tensor(x, ATTN_F32, 3, shape), tout = tensor(out, ATTN_F32, 3, shape), bad;
  uint32_t state = 5;
  int i;
  FILE* f;
  for (i = 0; i < T * E; ++i) x[i] = (float)(xd[i] = next_value(&state));
  CHECK(write_layer(path));
  CHECK(attn_mha_load(path, &layer) == ATTN_OK);
  if (!layer) return;

  reference_mha(xd, 0, want);
  CHECK(attn_mha_forward(layer, &tx, NULL, NULL, &tout) == ATTN_OK);
  /* float32 projections and attention over E = 4 against double: < 1e-5. */
  expect_close_f(out, want, T * E, 1e-5, __LINE__);

  /* With a cache: 2 tokens, then 1, attend as the whole sequence does with
     bottom-right causal masking. */
  reference_mha(xd, 1, want);
  CHECK(attn_cache_new(layer, &cache) == ATTN_OK);
  forward_in_chunks(layer, cache, x, out);
  expect_close_f(out, want, T * E, 1e-5, __LINE__);

  tx = tensor(x, ATTN_F32, 3, shape);
  bad = tensor(out, ATTN_F32, 3, wrong);
  EXPECT_ERROR(attn_mha_forward(layer, &tx, NULL, NULL, &bad), ATTN_ERROR_INVALID_ARGUMENT,
               "attn_mha_forward: out: shape (1, 3, 2) is not x's shape (1, 3, 4)");
  EXPECT_ERROR(attn_mha_forward(NULL, &tx, NULL, NULL, &tout), ATTN_ERROR_INVALID_ARGUMENT,
               "attn_mha_forward: layer is NULL");
  EXPECT_ERROR(attn_mha_forward(layer, &tx, NULL, NULL, &tx), ATTN_ERROR_INVALID_ARGUMENT,
               "attn_mha_forward: out and x share memory");
  bad = tensor(xd, ATTN_F64, 3, shape);
  EXPECT_ERROR(attn_mha_forward(layer, &bad, NULL, NULL, &tout), ATTN_ERROR_UNSUPPORTED,
               "the layer is F32");
  bad = tensor(x, ATTN_F32, 3, wrong);
  EXPECT_ERROR(attn_mha_forward(layer, &bad, NULL, NULL, &bad), ATTN_ERROR_INVALID_ARGUMENT,
               "(1, 3, 2)");
  EXPECT_ERROR(attn_cache_new(NULL, &cache), ATTN_ERROR_INVALID_ARGUMENT,
               "attn_cache_new: layer is NULL");
  EXPECT_ERROR(attn_cache_new(layer, NULL), ATTN_ERROR_INVALID_ARGUMENT,
               "attn_cache_new: cache is NULL");
  {
    /* A bf16 cache: the same chunks within bf16's rounding; its bytes are
       2 per value of K and V. The layer's head_dim is too small for q8_0 and q4_0. */
    attn_cache* compact = NULL;
    int64_t bytes = -1, f32_bytes = -1;
    CHECK(attn_cache_bytes(cache, &f32_bytes) == ATTN_OK);
    CHECK(attn_cache_new_dtype(layer, ATTN_BF16, &compact) == ATTN_OK);
    forward_in_chunks(layer, compact, x, out);
    expect_close_f(out, want, T * E, 2e-2, __LINE__);
    CHECK(attn_cache_bytes(compact, &bytes) == ATTN_OK);
    CHECK(bytes * 2 == f32_bytes && bytes > 0);
    attn_cache_free(compact);
    EXPECT_ERROR(attn_cache_new_dtype(layer, ATTN_Q8_0, &compact), ATTN_ERROR_INVALID_ARGUMENT,
                 "attn_cache_new_dtype: dtype: Q8_0 stores blocks of 32 values");
    EXPECT_ERROR(attn_cache_new_dtype(layer, ATTN_Q4_0, &compact), ATTN_ERROR_INVALID_ARGUMENT,
                 "attn_cache_new_dtype: dtype: Q4_0 stores blocks of 32 values");
    EXPECT_ERROR(attn_cache_new_dtype(layer, ATTN_INT4, &compact), ATTN_ERROR_INVALID_ARGUMENT,
                 "attn_cache_new_dtype: dtype: INT4 stores blocks of 32 values");
    EXPECT_ERROR(attn_cache_new_dtype(layer, ATTN_F64, &compact), ATTN_ERROR_UNSUPPORTED,
                 "is not a cache's");
  }
  attn_cache_free(cache);
  attn_mha_free(layer);
  attn_cache_free(NULL);
  attn_mha_free(NULL);

  layer = (attn_mha*)&state; /* overwritten with NULL on failure */
  EXPECT_ERROR(attn_mha_load("capi_test_no_such_file.safetensors", &layer), ATTN_ERROR_IO,
               "capi_test_no_such_file.safetensors");
  CHECK(layer == NULL);
  f = fopen(corrupt, "wb");
  CHECK(f != NULL);
  if (f) {
    fputs("\x10\0\0\0\0\0\0\0{not json at all", f);
    fclose(f);
  }
  EXPECT_ERROR(attn_mha_load(corrupt, &layer), ATTN_ERROR_INVALID_ARGUMENT, corrupt);
  /* Metadata claiming a far larger layer than the file's tensors: refused
     before anything of that size is built (it allocated gigabytes first). */
  CHECK(write_layer_claiming(corrupt, 16384));
  EXPECT_ERROR(attn_mha_load(corrupt, &layer), ATTN_ERROR_INVALID_ARGUMENT,
               "its metadata (embed_dim 16384, num_heads 2) needs a tensor 'in_proj_bias' of shape (49152,); "
               "the file's is (12,)");
  EXPECT_ERROR(attn_mha_load(NULL, &layer), ATTN_ERROR_INVALID_ARGUMENT,
               "attn_mha_load: safetensors_path is NULL");
  EXPECT_ERROR(attn_mha_load(path, NULL), ATTN_ERROR_INVALID_ARGUMENT, "attn_mha_load: layer is NULL");
  remove(path);
  remove(corrupt);
}

/* One cache fed by four threads at once (which corrupted the heap): each
   forward is ATTN_OK or ATTN_ERROR_RUNTIME saying the cache is in use by
   another thread, and the cache holds exactly the tokens of the forwards
   that ran. */
enum { SHARED_N = 200, SHARED_ROUNDS = 20 };
static struct {
  attn_mha* layer;
  attn_cache* cache;
  float x[SHARED_N * E];
  int ran, refused, other; /* under lock */
  pthread_mutex_t lock;
} shared;

static void* feed_shared_cache(void* unused) {
  const int64_t shape[] = {1, SHARED_N, E};
  static float out[4][SHARED_N * E];
  static int next = 0;
  int r, slot;
  attn_tensor tx = tensor(shared.x, ATTN_F32, 3, shape), tout;
  (void)unused;
  pthread_mutex_lock(&shared.lock);
  slot = next++;
  pthread_mutex_unlock(&shared.lock);
  tout = tensor(out[slot], ATTN_F32, 3, shape);
  for (r = 0; r < SHARED_ROUNDS; ++r) {
    const int status = attn_mha_forward(shared.layer, &tx, shared.cache, NULL, &tout);
    const int busy = status == ATTN_ERROR_RUNTIME &&
                     strstr(attn_last_error(), "the cache is in use by another thread") != NULL;
    pthread_mutex_lock(&shared.lock);
    if (status == ATTN_OK) ++shared.ran;
    else if (busy) ++shared.refused;
    else ++shared.other;
    pthread_mutex_unlock(&shared.lock);
  }
  return NULL;
}

static void test_shared_cache(void) {
  const char* path = "capi_test_shared_layer.safetensors";
  pthread_t threads[4];
  int64_t bytes = -1;
  uint32_t state = 9;
  int i;
  CHECK(write_layer(path));
  CHECK(attn_mha_load(path, &shared.layer) == ATTN_OK);
  remove(path);
  if (!shared.layer) return;
  CHECK(attn_cache_new(shared.layer, &shared.cache) == ATTN_OK);
  for (i = 0; i < SHARED_N * E; ++i) shared.x[i] = (float)next_value(&state);
  pthread_mutex_init(&shared.lock, NULL);
  CHECK(attn_set_num_threads(2) == ATTN_OK);
  for (i = 0; i < 4; ++i) CHECK(pthread_create(&threads[i], NULL, feed_shared_cache, NULL) == 0);
  for (i = 0; i < 4; ++i) pthread_join(threads[i], NULL);
  CHECK(shared.other == 0);
  CHECK(shared.ran + shared.refused == 4 * SHARED_ROUNDS);
  /* float32 K and V of E values each per token */
  CHECK(attn_cache_bytes(shared.cache, &bytes) == ATTN_OK);
  CHECK(bytes == (int64_t)shared.ran * SHARED_N * 2 * E * (int64_t)sizeof(float));
  pthread_mutex_destroy(&shared.lock);
  attn_cache_free(shared.cache);
  attn_mha_free(shared.layer);
}

/* A child of a process whose calls started the library's threads: its own
   calls run (they waited forever for the parent's threads, which a child
   does not have) and give the parent's result bitwise. */
static void test_fork(void) {
  enum { H = 4, N = 300, DH = 32 };
  static float q[H * N * DH], out[H * N * DH], again[H * N * DH];
  const int64_t shape[] = {H, N, DH};
  attn_tensor tq = tensor(q, ATTN_F32, 3, shape), tout = tensor(out, ATTN_F32, 3, shape);
  uint32_t state = 3;
  int i, status = -1;
  pid_t child;
  for (i = 0; i < H * N * DH; ++i) q[i] = (float)next_value(&state);
  CHECK(attn_set_num_threads(2) == ATTN_OK);
  CHECK(attn_attention(&tq, &tq, &tq, NULL, NULL, &tout) == ATTN_OK);
  child = fork();
  CHECK(child >= 0);
  if (child == 0) {
    attn_tensor tagain = tensor(again, ATTN_F32, 3, shape);
    alarm(20); /* a hang becomes SIGALRM */
    _exit(attn_attention(&tq, &tq, &tq, NULL, NULL, &tagain) == ATTN_OK &&
                  memcmp(out, again, sizeof out) == 0
              ? 0
              : 1);
  }
  CHECK(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  if (WIFSIGNALED(status)) fprintf(stderr, "the forked child died of signal %d\n", WTERMSIG(status));
}

static void test_misc(void) {
  CHECK(strcmp(attn_version(), ATTN_VERSION) == 0);
  CHECK(attn_set_num_threads(2) == ATTN_OK);
  EXPECT_ERROR(attn_set_num_threads(0), ATTN_ERROR_INVALID_ARGUMENT, "set_num_threads: n must be in [1,");
  CHECK(attn_set_num_threads(1) == ATTN_OK);
}

/* attn_attention_extras and options.sinks, against a closed form: two heads
   (q = 1, -0.5), one key/value head with keys 0.5, 2 and values 10, -4, d = 1,
   scale 1, causal offset 0 (each query sees key 0 only), sinks 0.25, -1. */
static void test_extras_and_sinks(void) {
  static const int64_t q_shape[] = {2, 1, 1}, kv_shape[] = {1, 2, 1}, w_shape[] = {2, 1, 2},
                       lse_shape[] = {2, 1}, sink_shape[] = {2}, bad_shape[] = {2, 1};
  double qd[2] = {1.0, -0.5}, kd[2] = {0.5, 2.0}, vd[2] = {10.0, -4.0}, sinks[2] = {0.25, -1.0};
  double out[2], weights[4], logits[4], lse[2], want_out[2], want_w[4], want_lse[2];
  float qf[2] = {1.0f, -0.5f}, kf[2] = {0.5f, 2.0f}, vf[2] = {10.0f, -4.0f}, outf[2], lsef[2];
  attn_tensor tq = tensor(qd, ATTN_F64, 3, q_shape), tk = tensor(kd, ATTN_F64, 3, kv_shape),
              tv = tensor(vd, ATTN_F64, 3, kv_shape), tout = tensor(out, ATTN_F64, 3, q_shape),
              tw = tensor(weights, ATTN_F64, 3, w_shape), tl = tensor(logits, ATTN_F64, 3, w_shape),
              tlse = tensor(lse, ATTN_F64, 2, lse_shape), tsinks = tensor(sinks, ATTN_F64, 1, sink_shape),
              tbad = tensor(sinks, ATTN_F64, 2, bad_shape);
  attn_options options;
  int h;
  attn_options_init(&options);
  options.scale = 1;
  options.causal = 3;
  options.causal_offset = 0;
  options.sinks = &tsinks;
  for (h = 0; h < 2; ++h) {
    const double e = exp(qd[h] * kd[0]), denominator = e + exp(sinks[h]);
    want_w[2 * h] = e / denominator;
    want_w[2 * h + 1] = 0;
    want_out[h] = want_w[2 * h] * vd[0];
    want_lse[h] = log(denominator);
  }
  CHECK(attn_attention_extras(&tq, &tk, &tv, NULL, &options, &tout, &tw, &tl, 2, &tlse) == ATTN_OK);
  expect_close_d(out, want_out, 2, 1e-15, __LINE__);
  expect_close_d(weights, want_w, 4, 1e-15, __LINE__);
  expect_close_d(lse, want_lse, 2, 1e-15, __LINE__);
  CHECK(logits[0] == 0.5 && isinf(logits[1]) && logits[1] < 0);  /* masked: -inf past the offset */
  CHECK(attn_attention_extras(&tq, &tk, &tv, NULL, &options, &tout, NULL, &tl, 0, NULL) == ATTN_OK);
  CHECK(logits[1] == 2.0 && logits[3] == -1.0);                    /* scaled: every key */
  {  /* float32: the kernels */
    attn_tensor fq = tensor(qf, ATTN_F32, 3, q_shape), fk = tensor(kf, ATTN_F32, 3, kv_shape),
                fv = tensor(vf, ATTN_F32, 3, kv_shape), fout = tensor(outf, ATTN_F32, 3, q_shape),
                flse = tensor(lsef, ATTN_F32, 2, lse_shape);
    CHECK(attn_attention_extras(&fq, &fk, &fv, NULL, &options, &fout, NULL, NULL, 2, &flse) == ATTN_OK);
    expect_close_f(outf, want_out, 2, 1e-6, __LINE__);
    expect_close_f(lsef, want_lse, 2, 1e-6, __LINE__);
    EXPECT_ERROR(attn_attention_extras(&fq, &fk, &fv, NULL, &options, &fout, NULL, NULL, 2, &tlse),
                 ATTN_ERROR_UNSUPPORTED, "lse: dtype F64 is not q's, F32");
  }
  EXPECT_ERROR(attn_attention_extras(&tq, &tk, &tv, NULL, &options, &tout, NULL, &tl, 3, NULL),
               ATTN_ERROR_INVALID_ARGUMENT, "logits_stage: 3 is not 0 (scaled), 1 (softcapped) or 2 (masked)");
  EXPECT_ERROR(attn_attention_extras(&tq, &tk, &tv, NULL, &options, &tout, NULL, NULL, 0, &tout),
               ATTN_ERROR_INVALID_ARGUMENT, "lse has shape (2, 1, 1), expected (2, 1)");
  options.sinks = &tbad;
  EXPECT_ERROR(attn_attention(&tq, &tk, &tv, NULL, &options, &tout), ATTN_ERROR_INVALID_ARGUMENT,
               "options.sinks: must be one logit per query head, shape (Hq), got (2, 1)");
}

/* options.precision, against a closed form: one key, so its weight is 1 and
   the output is v as the products see it. v = 1 + 2^-10 is not a bfloat16:
   bf16 and int8 (whose P·V is bf16's) give 1 (its rounding, to even), f32
   keeps it. Other values and float64 with bf16 are refused. */
static void test_precision(void) {
  static const int64_t shape[] = {1, 1, 1};
  float qf[1] = {0.5f}, kf[1] = {2.0f}, vf[1] = {1.0f + 1.0f / 1024}, outf[1];
  double qd[1] = {0.5}, outd[1];
  attn_tensor tq = tensor(qf, ATTN_F32, 3, shape), tk = tensor(kf, ATTN_F32, 3, shape),
              tv = tensor(vf, ATTN_F32, 3, shape), tout = tensor(outf, ATTN_F32, 3, shape),
              dq = tensor(qd, ATTN_F64, 3, shape), dout = tensor(outd, ATTN_F64, 3, shape);
  attn_options options;
  attn_options_init(&options);
  CHECK(options.precision == 0);
  CHECK(attn_attention(&tq, &tk, &tv, NULL, &options, &tout) == ATTN_OK);
  CHECK(outf[0] == vf[0]);
  options.precision = 1;
  CHECK(attn_attention(&tq, &tk, &tv, NULL, &options, &tout) == ATTN_OK);
  CHECK(outf[0] == 1.0f);
  EXPECT_ERROR(attn_attention(&dq, &dq, &dq, NULL, &options, &dout), ATTN_ERROR_INVALID_ARGUMENT,
               "pass float32 q, k, v");
  options.precision = 2;
  CHECK(attn_attention(&tq, &tk, &tv, NULL, &options, &tout) == ATTN_OK);
  CHECK(outf[0] == 1.0f);
  options.precision = 3;
  EXPECT_ERROR(attn_attention(&tq, &tk, &tv, NULL, &options, &tout), ATTN_ERROR_INVALID_ARGUMENT,
               "options: precision 3 is not 0 (f32), 1 (bf16) or 2 (int8)");
}

/* The paged cache and batch attention: two sequences (one a fork, cut back)
   over pages of 2 tokens, against the naive loop per request and head; the
   same pages given as caller-owned pools through a plan, bit for bit. */
static void test_paged(void) {
  attn_paged_cache* cache = NULL;
  int64_t a = -1, b = -1, len = 0, pages = 0, count = 0, t, h, c, r;
  static float k[NK * HKV * D], v[NK * HKV * DV];
  static float q[(NQ + 1) * HQ * D], out[(NQ + 1) * HQ * DV], raw[(NQ + 1) * HQ * DV], lse[(NQ + 1) * HQ];
  const int64_t k_shape3[] = {NK, HKV, D}, v_shape3[] = {NK, HKV, DV}, q_shape3[] = {NQ + 1, HQ, D},
                out_shape3[] = {NQ + 1, HQ, DV}, lse_shape[] = {NQ + 1, HQ};
  const int64_t indptr[] = {0, NK};
  int32_t qo_indptr[] = {0, NQ, NQ + 1}, kv_indptr[3], kv_indices[8], last[2];
  attn_tensor tk, tv, tq, tout, traw, tlse;
  attn_options options;
  attn_batch_plan* plan = NULL;
  random_gqa(11);
  for (t = 0; t < NK; ++t)
    for (h = 0; h < HKV; ++h) {
      for (c = 0; c < D; ++c) k[(t * HKV + h) * D + c] = gqa.k[(h * NK + t) * D + c];
      for (c = 0; c < DV; ++c) v[(t * HKV + h) * DV + c] = gqa.v[(h * NK + t) * DV + c];
    }
  for (h = 0; h < HQ; ++h)
    for (t = 0; t < NQ; ++t)
      for (c = 0; c < D; ++c) q[(t * HQ + h) * D + c] = q[(NQ * HQ + h) * D + c] = gqa.q[(h * NQ + t) * D + c];
  tk = tensor(k, ATTN_F32, 3, k_shape3);
  tv = tensor(v, ATTN_F32, 3, v_shape3);
  tq = tensor(q, ATTN_F32, 3, q_shape3);
  tout = tensor(out, ATTN_F32, 3, out_shape3);
  traw = tensor(raw, ATTN_F32, 3, out_shape3);
  tlse = tensor(lse, ATTN_F32, 2, lse_shape);
  CHECK(attn_paged_cache_new(8, 2, HKV, D, DV, ATTN_F32, 0, &cache) == ATTN_OK);
  CHECK(attn_paged_cache_add_sequence(cache, &a) == ATTN_OK);
  CHECK(attn_paged_cache_append(cache, &a, 1, &tk, &tv, indptr) == ATTN_OK);
  CHECK(attn_paged_cache_fork(cache, a, &b) == ATTN_OK);
  CHECK(attn_paged_cache_truncate(cache, b, 3) == ATTN_OK);
  CHECK(attn_paged_cache_length(cache, b, &len) == ATTN_OK && len == 3);
  CHECK(attn_paged_cache_pages_in_use(cache, &pages) == ATTN_OK && pages == 3); /* b shares a's first two */
  attn_options_init(&options);
  options.causal = 1;
  {
    const int64_t seqs[] = {a, b};
    double want[NQ * DV];
    CHECK(attn_batch_attention(&tq, qo_indptr, 2, cache, seqs, &options, NULL, &tout, &tlse) == ATTN_OK);
    for (h = 0; h < HQ; ++h) {
      float got[NQ * DV];
      /* request 0: NQ queries over a's NK keys; request 1: the last of them over b's 3 */
      reference_head(gqa.qd + h * NQ * D, gqa.kd + (h / 2) * NK * D, gqa.vd + (h / 2) * NK * DV, NQ, NK, D, DV,
                     NULL, 1, -1, -1, 0.5, 0, 0, want);
      for (t = 0; t < NQ; ++t)
        for (c = 0; c < DV; ++c) got[t * DV + c] = out[(t * HQ + h) * DV + c];
      expect_close_f(got, want, NQ * DV, 1e-5, __LINE__);
      reference_head(gqa.qd + (h * NQ + NQ - 1) * D, gqa.kd + (h / 2) * NK * D, gqa.vd + (h / 2) * NK * DV, 1, 3, D, DV,
                     NULL, 1, -1, -1, 0.5, 0, 0, want);
      for (c = 0; c < DV; ++c) got[c] = out[(NQ * HQ + h) * DV + c];
      expect_close_f(got, want, DV, 1e-5, __LINE__);
    }
    /* A precision is taken: int8 changes decode only over Q8_0 pages, so over these F32
       pages the same bits (tests/python/test_batch_serving.py checks Q8_0's). */
    options.precision = 2;
    CHECK(attn_batch_attention(&tq, qo_indptr, 2, cache, seqs, &options, NULL, &traw, NULL) == ATTN_OK);
    CHECK(memcmp(raw, out, sizeof raw) == 0);
    options.precision = 0;
    /* The raw form: the pages copied into caller-owned pools, by the cache's table. */
    CHECK(attn_paged_cache_page_table(cache, seqs, 2, kv_indptr, kv_indices, 8, last, &count) == ATTN_OK);
    CHECK(count == 5 && kv_indptr[2] == 5 && last[0] == 1 && last[1] == 1);
    {
      static float k_pool[8 * 2 * HKV * D], v_pool[8 * 2 * HKV * DV];
      const int64_t kp_shape[] = {8, 2, HKV, D}, vp_shape[] = {8, 2, HKV, DV};
      attn_tensor tkp = tensor(k_pool, ATTN_F32, 4, kp_shape), tvp = tensor(v_pool, ATTN_F32, 4, vp_shape);
      for (r = 0; r < 2; ++r)
        for (t = 0; t < (r == 0 ? NK : 3); ++t) {
          const int32_t page = kv_indices[kv_indptr[r] + t / 2];
          for (h = 0; h < HKV; ++h) {
            memcpy(&k_pool[((page * 2 + t % 2) * HKV + h) * D], &k[(t * HKV + h) * D], D * sizeof(float));
            memcpy(&v_pool[((page * 2 + t % 2) * HKV + h) * DV], &v[(t * HKV + h) * DV], DV * sizeof(float));
          }
        }
      CHECK(attn_batch_plan_new(qo_indptr, kv_indptr, kv_indices, last, 2, HQ, HKV, D, DV, 2, 0, &options, NULL,
                                &plan) == ATTN_OK);
      CHECK(attn_batch_plan_run(plan, &tq, &tkp, &tvp, &traw, NULL) == ATTN_OK);
      CHECK(memcmp(raw, out, sizeof raw) == 0);
      memset(raw, 0, sizeof raw);
      CHECK(attn_batch_plan_run_cache(plan, &tq, cache, &traw, NULL) == ATTN_OK);
      CHECK(memcmp(raw, out, sizeof raw) == 0);
      last[0] = 3;
      attn_batch_plan_free(plan);
      plan = NULL;
      EXPECT_ERROR(attn_batch_plan_new(qo_indptr, kv_indptr, kv_indices, last, 2, HQ, HKV, D, DV, 2, 0, &options,
                                       NULL, &plan),
                   ATTN_ERROR_INVALID_ARGUMENT, "kv_last_page_len[0] must be in [1, page_size = 2]");
      CHECK(plan == NULL);
    }
  }
  EXPECT_ERROR(attn_paged_cache_length(cache, 99, &len), ATTN_ERROR_INVALID_ARGUMENT, "no sequence 99");
  {
    static float big_k[20 * HKV * D], big_v[20 * HKV * DV];
    const int64_t bk[] = {20, HKV, D}, bv[] = {20, HKV, DV}, big_indptr[] = {0, 20};
    attn_tensor tbk = tensor(big_k, ATTN_F32, 3, bk), tbv = tensor(big_v, ATTN_F32, 3, bv);
    EXPECT_ERROR(attn_paged_cache_append(cache, &a, 1, &tbk, &tbv, big_indptr), ATTN_ERROR_RUNTIME,
                 "needs 10 pages, 5 free");
    CHECK(attn_paged_cache_length(cache, a, &len) == ATTN_OK && len == NK);
  }
  EXPECT_ERROR(attn_paged_cache_new(8, 2, HKV, D, 0, ATTN_BOOL, 0, &cache), ATTN_ERROR_UNSUPPORTED,
               "is not a cache's");
  attn_paged_cache_free(cache);
}

/* An INT4 paged cache over keys and values int4 holds exactly (on a grid of
   0.25 from -2, each group of 32 and each tail of 16 or more reaching both
   ends of its range): its attention is the F32 cache's over the same tokens. */
static void test_paged_int4(void) {
  enum { PN = 80, PH = 2, PD = 32, PQ = 3 };
  attn_paged_cache *exact = NULL, *packed = NULL;
  static float k[PN * PH * PD], v[PN * PH * PD], q[PQ * 2 * PH * PD], got[PQ * 2 * PH * PD];
  static double want[PQ * 2 * PH * PD];
  const int64_t kv_shape[] = {48, PH, PD}, more_shape[] = {PN - 48, PH, PD}, q_shape[] = {PQ, 2 * PH, PD};
  const int64_t indptr[] = {0, 48}, more_indptr[] = {0, PN - 48};
  const int32_t qo_indptr[] = {0, 1, PQ};
  int64_t a = -1, b = -1, i, t, h, c;
  attn_tensor tk, tv, tq, tout;
  attn_options options;
  for (t = 0; t < PN; ++t)
    for (h = 0; h < PH; ++h)
      for (c = 0; c < PD; ++c) {
        k[(t * PH + h) * PD + c] = 0.25f * (float)((t * 7 + c * 3 + h) % 16) - 2.0f;
        v[(t * PH + h) * PD + c] = 0.25f * (float)((c * 7 + t * 3 + h) % 16) - 2.0f;
      }
  for (i = 0; i < PQ * 2 * PH * PD; ++i) q[i] = (float)sin(0.37 * (double)i);
  attn_options_init(&options);
  options.causal = 1;
  tq = tensor(q, ATTN_F32, 3, q_shape);
  CHECK(attn_paged_cache_new(8, 32, PH, PD, 0, ATTN_F32, 1, &exact) == ATTN_OK);
  CHECK(attn_paged_cache_new(8, 32, PH, PD, 0, ATTN_INT4, 1, &packed) == ATTN_OK);
  for (i = 0; i < 2; ++i) {
    attn_paged_cache* cache = i == 0 ? exact : packed;
    int64_t seqs[2];
    CHECK(attn_paged_cache_add_sequence(cache, &a) == ATTN_OK && attn_paged_cache_add_sequence(cache, &b) == ATTN_OK);
    tk = tensor(k, ATTN_F32, 3, kv_shape);
    tv = tensor(v, ATTN_F32, 3, kv_shape);
    CHECK(attn_paged_cache_append(cache, &a, 1, &tk, &tv, indptr) == ATTN_OK); /* a group and a tail of 16 */
    CHECK(attn_paged_cache_append(cache, &b, 1, &tk, &tv, indptr) == ATTN_OK);
    tk = tensor(k + 48 * PH * PD, ATTN_F32, 3, more_shape);
    tv = tensor(v + 48 * PH * PD, ATTN_F32, 3, more_shape);
    CHECK(attn_paged_cache_append(cache, &b, 1, &tk, &tv, more_indptr) == ATTN_OK); /* 80: a tail of 16 */
    seqs[0] = a, seqs[1] = b;
    tout = tensor(got, ATTN_F32, 3, q_shape);
    CHECK(attn_batch_attention(&tq, qo_indptr, 2, cache, seqs, &options, NULL, &tout, NULL) == ATTN_OK);
    if (i == 0)
      for (t = 0; t < PQ * 2 * PH * PD; ++t) want[t] = got[t];
    else
      expect_close_f(got, want, PQ * 2 * PH * PD, 1e-5, __LINE__);
  }
  { /* The same tokens in raw INT4 pools of NHD pages, blocks written here (d 0.25, m -2): a's
       pages 0 and 1, b's 2, 3 and 4 (its keys' page axis stored as one group of 32 a page). */
    static int4_block kp[5 * PH * PD], vp[5 * 32 * PH * PD / 32];
    const int64_t pool_shape[] = {5, 32, PH, PD};
    const int32_t kv_indptr[] = {0, 2, 5}, kv_indices[] = {0, 1, 2, 3, 4}, last[] = {16, 16};
    attn_batch_plan* plan = NULL;
    attn_tensor tkp, tvp;
    int64_t p, j;
    for (p = 0; p < 5; ++p)
      for (h = 0; h < PH; ++h) {
        const int64_t first = 32 * (p < 2 ? p : p - 2); /* the page's first token */
        for (c = 0; c < PD; ++c) {
          int4_block* kb = &kp[(p * PH + h) * PD + c];
          kb->d = 0x3400, kb->m = 0xC000;
          for (j = 0; j < 16; ++j)
            kb->qs[j] = (uint8_t)(((first + j) * 7 + c * 3 + h) % 16 | ((first + j + 16) * 7 + c * 3 + h) % 16 << 4);
        }
        for (t = 0; t < 32; ++t) {
          int4_block* vb = &vp[(p * 32 + t) * PH + h]; /* (PD = 32: one block a row) */
          vb->d = 0x3400, vb->m = 0xC000;
          for (j = 0; j < 16; ++j)
            vb->qs[j] = (uint8_t)((j * 7 + (first + t) * 3 + h) % 16 | ((j + 16) * 7 + (first + t) * 3 + h) % 16 << 4);
        }
      }
    CHECK(attn_batch_plan_new(qo_indptr, kv_indptr, kv_indices, last, 2, 2 * PH, PH, PD, 0, 32, 0, &options, NULL,
                              &plan) == ATTN_OK);
    tkp = tensor(kp, ATTN_INT4, 4, pool_shape);
    tvp = tensor(vp, ATTN_INT4, 4, pool_shape);
    tout = tensor(got, ATTN_F32, 3, q_shape);
    CHECK(attn_batch_plan_run(plan, &tq, &tkp, &tvp, &tout, NULL) == ATTN_OK);
    expect_close_f(got, want, PQ * 2 * PH * PD, 1e-5, __LINE__);
    attn_batch_plan_free(plan);
  }
  attn_paged_cache_free(exact);
  attn_paged_cache_free(packed);
  packed = NULL;
  EXPECT_ERROR(attn_paged_cache_new(8, 16, PH, PD, 0, ATTN_INT4, 0, &packed), ATTN_ERROR_INVALID_ARGUMENT,
               "page_size must be a multiple of 32, got 16");
}

int main(void) {
  test_attention();
  test_attention_errors();
  test_extras_and_sinks();
  test_precision();
  test_q8_0();
  test_q4_0();
  test_int4();
  test_positional();
  test_sinusoidal();
  test_rope();
  test_mha();
  test_shared_cache();
  test_fork();
  test_misc();
  test_paged();
  test_paged_int4();
  if (failures) fprintf(stderr, "%d failures\n", failures);
  else printf("test_capi: all checks passed (attn %s)\n", attn_version());
  return failures ? 1 : 0;
}
