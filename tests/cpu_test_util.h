/* cpu_test_util.h: what test_cpu_exec.c and test_cpu_mpi.c share: test shapes, random
 * global inputs, running one form on a rank's shard, comparisons. Not a public header. */
#ifndef CPU_TEST_UTIL_H
#define CPU_TEST_UTIL_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mg_cpu_exec.h"
#include "mg_plan.h"
#include "mlagen.h"

/* A model shape with the softmax scale of a model without yarn: 1 / sqrt(d_n + d_r). */
static inline mg_shape tu_shape(int H, int dn, int dr, int dv, int dc) {
  mg_shape s;
  memset(&s, 0, sizeof s);
  snprintf(s.source, sizeof s.source, "test H%d dn%d dr%d dv%d dc%d", H, dn, dr, dv, dc);
  s.heads = H;
  s.qk_nope_head_dim = dn;
  s.qk_rope_head_dim = dr;
  s.v_head_dim = dv;
  s.kv_lora_rank = dc;
  s.rope_factor = 1;
  s.mscale = 1;
  s.softmax_scale = 1.0 / sqrt((double)(dn + dr));
  return s;
}

static inline uint64_t tu_mix(uint64_t x) { /* splitmix64 */
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* A standard normal, element i of stream n of seed. */
static inline double tu_normal(uint64_t seed, uint64_t n, uint64_t i) {
  uint64_t a = tu_mix(tu_mix(tu_mix(seed) ^ n) ^ i), b = tu_mix(a);
  double u1 = ((double)(a >> 11) + 1.0) * 0x1p-53, u2 = (double)(b >> 11) * 0x1p-53;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* The op's global inputs and results, in double, MLA.md's layouts. */
enum { TU_Q, TU_CKV, TU_KROPE, TU_W, TU_DO, TU_N_IN };
enum { TU_O, TU_LSE, TU_DQ, TU_DCKV, TU_DKROPE, TU_DW, TU_N_OUT };
static const char *const tu_out_names[TU_N_OUT] = {"o", "lse", "dq", "dc_kv", "dk_rope", "dw_kv_b"};

typedef struct tu_case {
  mg_shape shape;
  int B;
  int64_t S;
  int causal;
} tu_case;

/* Dims of input k: {B, S, w} with w the per-token width (w_kv_b: {1, rows, d_c}). */
static inline void tu_in_dims(const tu_case *c, int k, int64_t *B, int64_t *S, int64_t *w) {
  const mg_shape *s = &c->shape;
  const int64_t H = s->heads, dn = s->qk_nope_head_dim, dr = s->qk_rope_head_dim,
                dv = s->v_head_dim, dc = s->kv_lora_rank;
  *B = c->B;
  *S = c->S;
  switch (k) {
    case TU_Q: *w = H * (dn + dr); break;
    case TU_CKV: *w = dc; break;
    case TU_KROPE: *w = dr; break;
    case TU_DO: *w = H * dv; break;
    default: *B = 1, *S = H * (dn + dv), *w = dc; break;
  }
}

static inline int64_t tu_in_numel(const tu_case *c, int k) {
  int64_t B, S, w;
  tu_in_dims(c, k, &B, &S, &w);
  return B * S * w;
}

/* Global output k: numel. lse is [B, H, S]; dw_kv_b [H (d_n + d_v), d_c]. */
static inline int64_t tu_out_numel(const tu_case *c, int k) {
  const mg_shape *s = &c->shape;
  const int64_t BS = c->B * c->S, H = s->heads, dn = s->qk_nope_head_dim,
                dr = s->qk_rope_head_dim, dv = s->v_head_dim, dc = s->kv_lora_rank;
  switch (k) {
    case TU_O: return BS * H * dv;
    case TU_LSE: return BS * H;
    case TU_DQ: return BS * H * (dn + dr);
    case TU_DCKV: return BS * dc;
    case TU_DKROPE: return BS * dr;
    default: return H * (dn + dv) * dc;
  }
}

/* Random global inputs: 0.5 N(0,1), w_kv_b N(0,1) / sqrt(d_c). */
static inline int tu_inputs(const tu_case *c, uint64_t seed, double *in[TU_N_IN]) {
  for (int k = 0; k < TU_N_IN; k++) {
    const int64_t n = tu_in_numel(c, k);
    if (!(in[k] = malloc((size_t)n * sizeof(double)))) return -1;
    const double scale = k == TU_W ? 1.0 / sqrt((double)c->shape.kv_lora_rank) : 0.5;
    for (int64_t i = 0; i < n; i++) in[k][i] = scale * tu_normal(seed, (uint64_t)k + 1, (uint64_t)i);
  }
  return 0;
}

static inline void tu_free(double **v, int n) {
  for (int k = 0; k < n; k++) {
    free(v[k]);
    v[k] = NULL;
  }
}

/* Tokens [r S/P, (r+1) S/P) of a global [B, S, w] double array, converted to dt. */
static inline void *tu_shard(const double *g, int64_t B, int64_t S, int64_t w, int r, int P,
                             mg_dtype dt) {
  const int64_t Sl = S / P;
  void *out = malloc((size_t)(B * Sl * w) * mg_dtype_size(dt));
  if (!out) return NULL;
  for (int64_t b = 0; b < B; b++)
    for (int64_t s = 0; s < Sl; s++)
      for (int64_t i = 0; i < w; i++) {
        double x = g[(b * S + r * Sl + s) * w + i];
        int64_t j = (b * Sl + s) * w + i;
        if (dt == MG_F64)
          ((double *)out)[j] = x;
        else
          ((float *)out)[j] = (float)x;
      }
  return out;
}

static inline double tu_get(mg_dtype t, const void *p, int64_t i) {
  return t == MG_F64 ? ((const double *)p)[i] : (double)((const float *)p)[i];
}

/* What one rank's run returns: outputs in its dtype, lse [B, H/P, S] captured. */
typedef struct tu_run {
  mg_plan plan;
  mg_cpu_tensors t;
  void *lse;
  mg_cpu_stats st;
  mg_plan_cost cost;
  void *in[TU_N_IN];
} tu_run;

static inline void tu_run_free(tu_run *r) {
  mg_cpu_tensors_free(&r->t);
  free(r->lse);
  for (int k = 0; k < TU_N_IN; k++) free(r->in[k]);
  memset(r, 0, sizeof *r);
}

/* Builds the plan of form f for rank r of P and runs it on that rank's shard of the
 * global inputs. Returns the status; the message in d. */
static inline int tu_run_form(const tu_case *c, mg_form f, int P, int r, mg_comm *comm,
                              mg_dtype dt, double *const in[TU_N_IN], tu_run *out, mg_diag *d) {
  memset(out, 0, sizeof *out);
  mg_plan_args a = {.shape = &c->shape, .form = f, .sp = P, .rank = r, .batch = c->B,
                    .seq = c->S, .causal = c->causal, .dtype = dt};
  int rc = mg_plan_build(&out->plan, &a, d);
  if (rc) return rc;
  mg_plan_cost_of(&out->plan, &out->cost);
  for (int k = 0; k < TU_N_IN; k++) {
    int64_t B, S, w;
    tu_in_dims(c, k, &B, &S, &w);
    out->in[k] = k == TU_W ? tu_shard(in[k], 1, S, w, 0, 1, dt) : tu_shard(in[k], B, S, w, r, P, dt);
    if (!out->in[k]) return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
  }
  const int lse_id = mg_plan_find(&out->plan, "lse");
  const size_t lse_bytes = (size_t)mg_plan_buf_bytes(&out->plan.bufs[lse_id]);
  if (!(out->lse = malloc(lse_bytes))) return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
  mg_cpu_capture cap = {"lse", out->lse, lse_bytes};
  out->t = (mg_cpu_tensors){.q = out->in[TU_Q], .c_kv = out->in[TU_CKV],
                            .k_rope = out->in[TU_KROPE], .w_kv_b = out->in[TU_W],
                            .d_o = out->in[TU_DO], .captures = &cap, .n_captures = 1};
  rc = mg_cpu_run(&out->plan, comm, &out->t, &out->st, d);
  out->t.captures = NULL;
  out->t.n_captures = 0;
  return rc;
}

/* A run's output k as a double array (its own layout: this rank's shard). */
static inline const void *tu_out_ptr(const tu_run *r, int k) {
  switch (k) {
    case TU_O: return r->t.o;
    case TU_LSE: return r->lse;
    case TU_DQ: return r->t.dq;
    case TU_DCKV: return r->t.dc_kv;
    case TU_DKROPE: return r->t.dk_rope;
    default: return r->t.dw_kv_b;
  }
}

/* Global outputs of a single-rank (P = 1) run, in double. */
static inline int tu_outputs(const tu_case *c, const tu_run *r, double *out[TU_N_OUT]) {
  for (int k = 0; k < TU_N_OUT; k++) {
    const int64_t n = tu_out_numel(c, k);
    if (!(out[k] = malloc((size_t)n * sizeof(double)))) return -1;
    for (int64_t i = 0; i < n; i++) out[k][i] = tu_get(r->plan.args.dtype, tu_out_ptr(r, k), i);
  }
  return 0;
}

/* max |a - b| / max |b|. */
static inline double tu_rel(const double *a, const double *b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    num = fmax(num, fabs(a[i] - b[i]));
    den = fmax(den, fabs(b[i]));
  }
  return den > 0 ? num / den : num;
}
#endif
