/* varlen_test_util.h: packed sequences (issue 16, generator/core/mg_varlen.h) in the
 * executor tests (test_cpu_exec.c, test_cpu_mpi.c): a stream of documents in a buffer of
 * cap token rows, random inputs with NaN in every slack row, and the float64 reference per
 * document. Not a public header.
 *
 * The reference never uses mg_varlen_* (the rules under test): it walks the boundaries
 * itself, runs cpu_test_util.h's independent reference (tu_reference, MLA.md's semantics)
 * on each document alone (batch 1, S = its length) and places the results at the
 * document's rows: o, dq, dc_kv, dk_rope per row, lse per (head, row), dw_kv_b the sum over
 * the documents. Rows past the last document (slack) get o = 0, lse = -inf and zero
 * gradients, as the executors promise. */
#ifndef VARLEN_TEST_UTIL_H
#define VARLEN_TEST_UTIL_H
#include "cpu_test_util.h"

#define TV_MAX_DOCS 16

/* The tolerances of a bf16 varlen pass (the CUDA executor on the host kernels) against the
 * float64 per-document reference (test_cuda_exec_varlen at P = 1, test_cuda_exec_mpi
 * test_varlen at P = 2 and 4): tu_tol_bf16's rtol; atol about twice the largest measured
 * (rms units) over 17 seeds of each, every form, causal and not: o 4.3e-2 (P 2, the seed of
 * a CI failure at tu_tol_bf16's 4e-2), lse 2.0e-3, dq 6.8e-2, dc_kv 5.3e-2, dk_rope 4.8e-2,
 * dw_kv_b 2.1e-2. Larger than tu_tol_bf16's fixed-length figures for o, dq and dc_kv: the
 * streams' documents of 1 to 3 tokens average few V rows, so the logit error of K_nope
 * rounded to bf16 moves their o by a larger share than in long rows. */
static const tu_tol tv_tol_bf16[TU_N_OUT] = {
    {8.5e-2, 4e-3}, /* o */
    {4e-3, 0},      /* lse */
    {1.4e-1, 4e-3}, /* dq */
    {1.1e-1, 4e-3}, /* dc_kv */
    {1e-1, 4e-3},   /* dk_rope */
    {4.5e-2, 4e-3}, /* dw_kv_b */
};

/* N documents of the given lengths packed from token 0, in a buffer of cap rows. */
typedef struct tv_stream {
  int32_t cu[TV_MAX_DOCS + 1]; /* N + 1 boundaries */
  int64_t n_cu;                /* N + 1 */
  int64_t T, cap;              /* valid tokens, capacity (rows T .. cap - 1 are slack) */
} tv_stream;

/* The stream of n (<= TV_MAX_DOCS) lengths (>= 0, zero-length documents allowed) in cap
 * rows; cap must be >= the sum (the caller's test asserts it through T <= cap). */
static inline tv_stream tv_make(const int *len, int n, int64_t cap) {
  tv_stream s;
  memset(&s, 0, sizeof s);
  s.n_cu = n + 1;
  for (int i = 0; i < n; i++) s.cu[i + 1] = s.cu[i] + len[i];
  s.T = s.cu[n];
  s.cap = cap;
  return s;
}

/* The executor tests' many-document stream: lengths 0 (empty), 1, 2, 3, 17, 64, 0, 200
 * (T = 287; the 200 one crosses the rank boundaries at P = 2 and laga-cp's chunks) in 312
 * rows. */
static inline tv_stream tv_many(void) {
  static const int lens[] = {0, 1, 2, 3, 17, 64, 0, 200};
  return tv_make(lens, 8, 312);
}

/* The CUDA executor tests' stream (test_cuda_exec_varlen.c, test_cuda_exec_mpi.c): lengths
 * 17, 1, 0 (empty), 2, 200, 3, 64 (T = 287; the 200 one spans the rank boundaries of P = 2
 * and 4 and laga-cp's chunks) in TV_RANK_DOCS_CAP rows, a multiple of 8 (laga-cp's chunks
 * at P = 4). */
#define TV_RANK_DOCS_CAP 304
static inline tv_stream tv_rank_docs(void) {
  static const int lens[] = {17, 1, 0, 2, 200, 3, 64};
  return tv_make(lens, 7, TV_RANK_DOCS_CAP);
}

/* The test case of stream s: batch 1, S = its capacity. */
static inline tu_case tv_case(const mg_shape *shape, const tv_stream *s, int causal) {
  tu_case c = {*shape, 1, s->cap, causal};
  return c;
}

/* tu_run_form on stream s's documents (a varlen plan of case c = tv_case(.., s, ..)). */
static inline int tv_run_form(const tu_case *c, const tv_stream *s, mg_form f, int P, int r,
                              mg_comm *comm, mg_dtype dt, double *const in[TU_N_IN], tu_run *out,
                              mg_diag *d) {
  return tu_run_form_docs(c, f, P, r, comm, dt, in, s->cu, s->n_cu, NULL, NULL, out, d);
}

/* tu_inputs' random inputs for case c (B = 1), then NaN in every slack row (t >= T) of the
 * token inputs q, c_kv, k_rope and do: a slack row holds anything, and nothing valid may
 * read it. 0, or -1 when out of memory. */
static inline int tv_inputs(const tu_case *c, int64_t T, uint64_t seed, double *in[TU_N_IN]) {
  if (tu_inputs(c, seed, in)) return -1;
  for (int k = 0; k < TU_N_IN; k++) {
    if (k == TU_W) continue;
    const int64_t w = tu_in_numel(c, k) / c->S;
    for (int64_t i = T * w; i < c->S * w; i++) in[k][i] = NAN;
  }
  return 0;
}

/* The float64 reference of case c (B = 1, S = capacity) for the documents cu[0 .. n_cu)
 * (any non-decreasing boundaries from 0: the caller may pass a deliberately wrong set):
 * out[k] are allocated here (tu_out_numel), free them with tu_free. 0, or -1 when out of
 * memory. */
static inline int tv_reference(const tu_case *c, const int32_t *cu, int64_t n_cu,
                               double *const in[TU_N_IN], double *out[TU_N_OUT]) {
  const int64_t S = c->S, H = c->shape.heads;
  for (int k = 0; k < TU_N_OUT; k++)
    if (!(out[k] = calloc((size_t)tu_out_numel(c, k), sizeof(double)))) return -1;
  for (int64_t i = 0; i < H * S; i++) out[TU_LSE][i] = -INFINITY; /* rows without keys */
  for (int64_t d = 0; d + 1 < n_cu; d++) {
    const int64_t t0 = cu[d], L = cu[d + 1] - cu[d];
    if (L <= 0) continue; /* an empty document owns no row */
    tu_case dc = {c->shape, 1, L, c->causal};
    double *din[TU_N_IN], *dout[TU_N_OUT] = {0};
    for (int k = 0; k < TU_N_IN; k++) /* the document's rows: contiguous at batch 1 */
      din[k] = k == TU_W ? in[k] : in[k] + t0 * (tu_in_numel(c, k) / S);
    int rc = 0;
    for (int k = 0; k < TU_N_OUT && !rc; k++)
      if (!(dout[k] = calloc((size_t)tu_out_numel(&dc, k), sizeof(double)))) rc = -1;
    if (!rc) rc = tu_reference(&dc, din, dout);
    if (!rc)
      for (int k = 0; k < TU_N_OUT; k++) {
        if (k == TU_DW) {
          for (int64_t i = 0; i < tu_out_numel(c, k); i++) out[k][i] += dout[k][i];
        } else if (k == TU_LSE) {
          for (int64_t h = 0; h < H; h++)
            memcpy(&out[k][h * S + t0], &dout[k][h * L], (size_t)L * sizeof(double));
        } else {
          const int64_t w = tu_out_numel(c, k) / S;
          memcpy(&out[k][t0 * w], dout[k], (size_t)(L * w) * sizeof(double));
        }
      }
    tu_free(dout, TU_N_OUT);
    if (rc) return rc;
  }
  return 0;
}

/* How many elements of the slack rows (t >= T) of global output k (case c, B = 1) differ
 * from what the executors promise there: o, dq, dc_kv, dk_rope exactly 0, lse -inf. */
static inline int64_t tv_slack_wrong(const tu_case *c, int64_t T, int k, const double *out) {
  const int64_t S = c->S, H = c->shape.heads;
  int64_t bad = 0;
  if (k == TU_DW) return 0;
  if (k == TU_LSE) {
    for (int64_t h = 0; h < H; h++)
      for (int64_t t = T; t < S; t++) bad += !(out[h * S + t] == -INFINITY);
    return bad;
  }
  const int64_t w = tu_out_numel(c, k) / S;
  for (int64_t i = T * w; i < S * w; i++) bad += !(out[i] == 0);
  return bad;
}
#endif
