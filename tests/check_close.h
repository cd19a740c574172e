/* check_close.h: the one per-element comparison every numerical test uses.
 *
 * An element passes when |got - ref| <= atol + rtol * |ref|; a NaN or infinity in got never
 * passes, except an infinity equal to the reference (an LSE of -inf for a row without
 * keys). The result
 * names the worst element by its excess over the bound, so a single bad row or tile fails
 * the check and the message says where. Tolerances are the caller's: set them at about
 * twice the measured noise of the kernel against its float64 reference.
 *
 * Header-only C11 (static inline), usable from C and C++ tests and from tests/gpu. */
#ifndef MG_CHECK_CLOSE_H
#define MG_CHECK_CLOSE_H
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The outcome of one comparison. */
typedef struct cc_result {
  int64_t n;         /* elements compared */
  int64_t n_bad;     /* elements over atol + rtol |ref| (NaN/inf in got counts) */
  int64_t worst;     /* index of the element with the largest err / bound (-1 when n = 0) */
  double worst_got;  /* got[worst] */
  double worst_ref;  /* ref[worst] */
  double worst_ratio;/* |got - ref| / (atol + rtol |ref|) at worst: <= 1 passes; inf for NaN */
  double max_abs;    /* max |got - ref| over all elements (NaN counted as inf) */
  double min_atol;   /* the smallest atol that passes every element at this rtol:
                        max(|got - ref| - rtol |ref|, 0); inf for NaN. The measured noise
                        to set atol from. */
} cc_result;

/* Folds one element into r (index i). */
static inline void cc_add(cc_result *r, int64_t i, double got, double ref, double atol,
                          double rtol) {
  double err = got == ref ? 0 : fabs(got - ref);
  double bound = isfinite(ref) ? atol + rtol * fabs(ref) : atol;
  double ratio = (isfinite(got) || got == ref) && isfinite(err)
                     ? (bound > 0 ? err / bound : (err > 0 ? INFINITY : 0))
                     : INFINITY;
  if (!(err <= r->max_abs)) r->max_abs = isfinite(err) ? err : INFINITY;
  const double need = got == ref ? 0 /* an infinity equal to the reference needs none */
                      : isfinite(got) && isfinite(err) ? err - rtol * fabs(ref) : INFINITY;
  if (!(need <= r->min_atol)) r->min_atol = need;
  if (!(ratio <= 1)) r->n_bad++;
  if (r->worst < 0 || ratio > r->worst_ratio) {
    r->worst = i;
    r->worst_got = got;
    r->worst_ref = ref;
    r->worst_ratio = ratio;
  }
  r->n++;
}

/* An empty result (no element yet). */
static inline cc_result cc_init(void) {
  cc_result r = {0, 0, -1, 0, 0, 0, 0, 0};
  return r;
}

/* Compares n doubles. */
static inline cc_result cc_compare_d(const double *got, const double *ref, int64_t n,
                                     double atol, double rtol) {
  cc_result r = cc_init();
  for (int64_t i = 0; i < n; i++) cc_add(&r, i, got[i], ref[i], atol, rtol);
  return r;
}

/* Compares n floats with double references. */
static inline cc_result cc_compare_fd(const float *got, const double *ref, int64_t n,
                                      double atol, double rtol) {
  cc_result r = cc_init();
  for (int64_t i = 0; i < n; i++) cc_add(&r, i, got[i], ref[i], atol, rtol);
  return r;
}

/* 1 when every element passed (and at least one was compared). */
static inline int cc_ok(const cc_result *r) { return r->n > 0 && r->n_bad == 0; }

/* One line: "NAME: N of M over atol A + rtol R; worst [i] got G ref F (x ratio)". Writes
 * into buf (always terminated) and returns it. `cols` > 0 prints the index as [row, col]. */
static inline const char *cc_describe(const cc_result *r, const char *name, double atol,
                                      double rtol, int64_t cols, char *buf, size_t n) {
  if (cols > 0 && r->worst >= 0)
    snprintf(buf, n, "%s: %lld of %lld over %.1e + %.1e|ref|; worst [%lld, %lld] got %.6g ref %.6g (%.2fx bound), max|err| %.3e",
             name, (long long)r->n_bad, (long long)r->n, atol, rtol, (long long)(r->worst / cols),
             (long long)(r->worst % cols), r->worst_got, r->worst_ref, r->worst_ratio, r->max_abs);
  else
    snprintf(buf, n, "%s: %lld of %lld over %.1e + %.1e|ref|; worst [%lld] got %.6g ref %.6g (%.2fx bound), max|err| %.3e",
             name, (long long)r->n_bad, (long long)r->n, atol, rtol, (long long)r->worst,
             r->worst_got, r->worst_ref, r->worst_ratio, r->max_abs);
  return buf;
}

#endif
