/* kernel_test_util.h: what the generated-kernel tests share: 16-bit element conversions
 * (the safetensors module's, tested bit-exactly there), the seeded normal generator and
 * random 16-bit arrays, and the relative errors the tests report. Header-only; each test
 * includes it once (the generator's state is the test's own). */
#ifndef MG_KERNEL_TEST_UTIL_H
#define MG_KERNEL_TEST_UTIL_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mg_safetensors.h"

typedef uint16_t e16; /* storage of __nv_bfloat16 or __half */
typedef e16 bf16;

static inline float bf16_to_float(e16 x) { return mg_st_bf16_to_f32(x); }
static inline e16 float_to_bf16(float f) { return mg_st_f32_to_bf16(f); } /* nearest even */
static inline float half_to_float(e16 h) { return mg_st_f16_to_f32(h); }
static inline e16 float_to_half(float f) { return mg_st_f32_to_f16(f); }  /* nearest even */
/* fp16: half, else bf16 */
static inline float e16_to_float(int fp16, e16 x) {
  return fp16 ? half_to_float(x) : bf16_to_float(x);
}
static inline e16 float_to_e16(int fp16, float f) {
  return fp16 ? float_to_half(f) : float_to_bf16(f);
}

/* Seeded inputs: MLAGEN_TEST_SEED (printed by each test) reproduces a run. */
static uint64_t rng_state;
static uint64_t g_test_seed;

/* A standard normal sample: Box-Muller on a 64-bit LCG. */
static inline double randn(void) {
  double u[2];
  for (int i = 0; i < 2; i++) {
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    u[i] = ((rng_state >> 11) + 0.5) / 9007199254740992.0;
  }
  return sqrt(-2 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

/* Seeds the generator from MLAGEN_TEST_SEED, else the time, and prints the seed. */
static inline void kt_seed_init(void) {
  const char *env = getenv("MLAGEN_TEST_SEED");
  rng_state = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
  g_test_seed = rng_state;
  printf("MLAGEN_TEST_SEED=%llu\n", (unsigned long long)rng_state);
}

/* n standard normal samples rounded to 16 bits (malloc'd, at least one element). */
static inline e16 *kt_rand_e16(int fp16, size_t n) {
  e16 *p = malloc((n ? n : 1) * sizeof *p);
  for (size_t i = 0; i < n; i++) p[i] = float_to_e16(fp16, (float)randn());
  return p;
}

/* A copy of a launch's outputs (n buffers: p[i], size[i] bytes), to compare the outputs of
 * later launches (other schedules) with bit for bit. */
typedef struct kt_snapshot {
  int n;
  const void *p[4];
  size_t size[4];
  void *copy[4];
} kt_snapshot;

/* Copies the buffers named in s. */
static inline void kt_snapshot_take(kt_snapshot *s) {
  for (int i = 0; i < s->n; i++) {
    s->copy[i] = malloc(s->size[i] ? s->size[i] : 1);
    memcpy(s->copy[i], s->p[i], s->size[i]);
  }
}

/* 1 when every buffer holds the copied bytes again. */
static inline int kt_snapshot_same(const kt_snapshot *s) {
  for (int i = 0; i < s->n; i++)
    if (memcmp(s->copy[i], s->p[i], s->size[i])) return 0;
  return 1;
}

static inline void kt_snapshot_free(kt_snapshot *s) {
  for (int i = 0; i < s->n; i++) free(s->copy[i]);
}

/* Max abs error over max abs reference (the max abs error when the reference is all 0) of
 * columns [c0, c1) of rows rows w wide; a NaN is counted in *nans and makes it infinite. */
static inline double kt_rel_err_e16_cols(int fp16, const e16 *got, const double *ref, size_t rows,
                                      size_t w, size_t c0, size_t c1, size_t *nans) {
  double mr = 0, me = 0;
  for (size_t r = 0; r < rows; r++)
    for (size_t k = c0; k < c1; k++) {
      const size_t i = r * w + k;
      const double x = e16_to_float(fp16, got[i]);
      if (isnan(x)) {
        ++*nans;
        me = INFINITY;
        continue;
      }
      if (fabs(ref[i]) > mr) mr = fabs(ref[i]);
      if (fabs(x - ref[i]) > me) me = fabs(x - ref[i]);
    }
  return mr > 0 ? me / mr : me;
}

/* The same over n contiguous values. */
static inline double kt_rel_err_e16(int fp16, const e16 *got, const double *ref, size_t n,
                                 size_t *nans) {
  return kt_rel_err_e16_cols(fp16, got, ref, 1, n, 0, n, nans);
}

static inline double kt_rel_err_f32(const float *got, const double *ref, size_t n, size_t *nans) {
  double mr = 0, me = 0;
  for (size_t i = 0; i < n; i++) {
    if (isnan(got[i])) {
      ++*nans;
      me = INFINITY;
      continue;
    }
    if (fabs(ref[i]) > mr) mr = fabs(ref[i]);
    if (fabs(got[i] - ref[i]) > me) me = fabs(got[i] - ref[i]);
  }
  return mr > 0 ? me / mr : me;
}

/* The max LSE error, |got - ref| / (1 + |ref|); an infinite one on either side must be
 * the same on both (else the error is infinite), a NaN is counted in *nans. */
static inline double kt_lse_err(const float *got, const double *ref, size_t n, size_t *nans) {
  double m = 0;
  for (size_t i = 0; i < n; i++) {
    *nans += isnan(got[i]) != 0;
    double e;
    if (isinf(ref[i]) || isinf(got[i]))
      e = (double)got[i] == ref[i] ? 0 : INFINITY;
    else
      e = fabs(got[i] - ref[i]) / (1 + fabs(ref[i]));
    if (e > m || isnan(e)) m = isnan(e) ? INFINITY : e;
  }
  return m;
}
#endif
