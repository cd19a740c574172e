/* test_attn_bwd.c: the tensor-core attention backward (templates/attn_bwd_pre.cu.tpl,
 * attn_bwd_dkdv.cu.tpl, attn_bwd_dq.cu.tpl), run unchanged on the CPU through the host
 * executor (tests/host/), against float64 reference gradients; and every configuration the
 * templates' checks keep, compiled by NVRTC for sm_80 and sm_90a without spills.
 *
 * Inputs are random bf16 (or fp16) values (the seed is printed, MLAGEN_TEST_SEED overrides
 * it). The forward is computed in float64 from the rounded inputs; the kernels get its O
 * rounded to 16 bits and its LSE rounded to fp32, as attn_fwd stores them. The reference
 * gradients (dq, dk_nope or packed dk, dk_rope summed over the heads, dv) are float64 from
 * MLA.md's semantics with the exact O. The pipeline: attn_bwd_pre (delta; zeroes dq_accum),
 * attn_bwd_dkdv, and in the deterministic mode attn_bwd_dq. Errors are max abs error over
 * max abs reference, per gradient, under 2e-2. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_host.h"
#include "kernel_test_util.h"
#include "mlagen.h"

typedef void (*pre_fn)(const e16 *o, const e16 *dout, float *delta, float *dq_accum,
                       int seqlen_q);
typedef void (*dkdv_fn)(const e16 *q, const e16 *k_nope, const e16 *k_rope, const e16 *v,
                        const e16 *dout, const float *lse, const float *delta, float *dq_accum,
                        e16 *dk_nope, float *dk_rope, e16 *dv, int seqlen_q, int seqlen_k,
                        int q_pos0, float softmax_scale);
typedef void (*dq_fn)(const e16 *q, const e16 *k_nope, const e16 *k_rope, const e16 *v,
                      const e16 *dout, const float *lse, const float *delta, e16 *dq,
                      int seqlen_q, int seqlen_k, int q_pos0, float softmax_scale);

enum { FAM_PRE, FAM_DKDV, FAM_DQ };

typedef struct built_kernel {
  kh_kernel kh; /* fn, threads, smem, name, spec */
  int fam;
  int rows;        /* query rows (pre, dq) or keys (dkdv) per CTA */
  int packed, det; /* dkdv, dq: key layout; dkdv: deterministic */
} built_kernel;

static int is_fp16(const mg_kernel_spec *s) { return strcmp(s->dtype, "fp16") == 0; }
static float e_to_float(const mg_kernel_spec *s, e16 x) { return e16_to_float(is_fp16(s), x); }
static e16 float_to_e(const mg_kernel_spec *s, float x) { return float_to_e16(is_fp16(s), x); }

static void set(mg_kernel_spec *s, const char *assignment) { kh_set(s, assignment); }

static mg_kernel_spec make_spec(const char *family, int H, int dn, int dr, int dv, int causal) {
  mg_kernel_spec s;
  memset(&s, 0, sizeof s);
  snprintf(s.family, sizeof s.family, "%s", family);
  s.heads = H, s.d_n = dn, s.d_r = dr, s.d_v = dv, s.d_c = 512, s.causal = causal;
  snprintf(s.dtype, sizeof s.dtype, "bf16");
  return s;
}

/* Generates the kernel for spec and builds it with the host executor (the harness keys
 * its objects by content). drop >= 0: without that barrier; returns 0 when there is none
 * (*after_wait: it published cp.async data). */
static int build_src(const mg_kernel_spec *spec, int drop, int *after_wait, built_kernel *out) {
  kh_drop dr = {.which = drop};
  memset(out, 0, sizeof *out);
  out->fam = !strcmp(spec->family, "attn_bwd_pre") ? FAM_PRE
             : !strcmp(spec->family, "attn_bwd_dkdv") ? FAM_DKDV : FAM_DQ;
  if (!kh_build_edited(NULL, spec, 0, drop >= 0 ? kh_drop_edit : NULL, &dr, &out->kh)) return 0;
  if (after_wait) *after_wait = dr.after_wait;
  const kh_kernel *k = &out->kh;
  assert_int_equal(k->threads, 32 * kh_config_int(k, "num_warps"));
  out->rows = out->fam == FAM_PRE ? kh_config_int(k, "num_warps") * kh_config_int(k, "rows_per_warp")
              : out->fam == FAM_DKDV ? kh_config_int(k, "block_n") : kh_config_int(k, "block_m");
  out->packed = kh_config_int_or(k, "k_packed", 0);
  out->det = kh_config_int_or(k, "deterministic", 1);
  assert_int_equal(kh_launch_value(k, "smem_static"), 0);
  return 1;
}

static void build(const mg_kernel_spec *spec, built_kernel *out) { build_src(spec, -1, NULL, out); }

static void unload(built_kernel *bk) { kh_free(&bk->kh); }

/* One case: inputs, the float64 forward (o, lse) and reference gradients, kernel outputs.
 * Split keys: kn [B, S_k, H, d_n], kr [B, S_k, d_r]; packed: kn [B, S_k, H, d_n + d_r]. */
typedef struct bwd_case {
  int B, sq, sk, q_pos0, packed;
  float scale;
  e16 *q, *kn, *kr, *v, *dout, *o16;
  float *lse32;
  size_t nq, nkn, nkr, nv, no, nl;
  double *r_dq, *r_dkn, *r_dkr, *r_dv; /* reference gradients */
  /* kernel outputs */
  float *delta, *dq_accum, *dkr;
  e16 *dq, *dkn, *dv;
} bwd_case;

static void *xcalloc(size_t n, size_t sz) { return calloc(n ? n : 1, sz); }

/* Reference forward and backward in float64. */
static void reference(const mg_kernel_spec *s, bwd_case *c) {
  const int H = s->heads, dn = s->d_n, dr = s->d_r, dv = s->d_v, dqk = dn + dr;
  const int B = c->B, sq = c->sq, sk = c->sk;
  const size_t kn_tok = c->packed ? (size_t)H * dqk : (size_t)H * dn;
  const size_t kn_head = c->packed ? (size_t)dqk : (size_t)dn;
  const e16 *kr = c->packed ? c->kn + dn : c->kr;
  const size_t kr_tok = c->packed ? (size_t)H * dqk : (size_t)dr;
  const size_t kr_head = c->packed ? (size_t)dqk : 0;
  double *sc = xcalloc((size_t)sk, sizeof *sc), *oi = xcalloc((size_t)dv, sizeof *oi);
  double *kf = xcalloc((size_t)sk * dqk, sizeof *kf), *qf = xcalloc((size_t)dqk, sizeof *qf);
  double *dof = xcalloc((size_t)dv, sizeof *dof);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++) {
      for (int j = 0; j < sk; j++) { /* K[j] of head h, as doubles */
        const size_t tok = (size_t)b * sk + j;
        for (int d = 0; d < dn; d++) kf[(size_t)j * dqk + d] = e_to_float(s, c->kn[tok * kn_tok + h * kn_head + d]);
        for (int d = 0; d < dr; d++) kf[(size_t)j * dqk + dn + d] = e_to_float(s, kr[tok * kr_tok + h * kr_head + d]);
      }
      for (int i = 0; i < sq; i++) {
        const size_t row = ((size_t)b * sq + i) * H + h;
        for (int d = 0; d < dqk; d++) qf[d] = e_to_float(s, c->q[row * dqk + d]);
        for (int d = 0; d < dv; d++) dof[d] = e_to_float(s, c->dout[row * dv + d]);
        long lim = s->causal ? (long)c->q_pos0 + i + 1 : sk;
        int nk = lim < 0 ? 0 : lim < sk ? (int)lim : sk;
        double mx = -INFINITY;
        for (int j = 0; j < nk; j++) {
          double dot = 0;
          for (int d = 0; d < dqk; d++) dot += qf[d] * kf[(size_t)j * dqk + d];
          sc[j] = dot * c->scale;
          if (sc[j] > mx) mx = sc[j];
        }
        double sum = 0;
        for (int j = 0; j < nk; j++) sum += exp(sc[j] - mx);
        const double lse = nk ? mx + log(sum) : -INFINITY;
        for (int d = 0; d < dv; d++) oi[d] = 0;
        for (int j = 0; j < nk; j++) {
          const double p = exp(sc[j] - lse);
          const e16 *vj = c->v + (((size_t)b * sk + j) * H + h) * dv;
          for (int d = 0; d < dv; d++) oi[d] += p * e_to_float(s, vj[d]);
        }
        double delta = 0;
        for (int d = 0; d < dv; d++) {
          c->o16[row * dv + d] = float_to_e(s, (float)oi[d]);
          delta += dof[d] * oi[d];
        }
        c->lse32[((size_t)b * H + h) * sq + i] = (float)lse;
        for (int j = 0; j < nk; j++) {
          const double p = exp(sc[j] - lse);
          const size_t tok = (size_t)b * sk + j;
          const e16 *vj = c->v + (tok * H + h) * dv;
          double dp = 0;
          for (int d = 0; d < dv; d++) dp += dof[d] * e_to_float(s, vj[d]);
          const double ds = p * (dp - delta) * c->scale;
          for (int d = 0; d < dv; d++) c->r_dv[(tok * H + h) * dv + d] += p * dof[d];
          for (int d = 0; d < dqk; d++) c->r_dq[row * dqk + d] += ds * kf[(size_t)j * dqk + d];
          if (c->packed) {
            for (int d = 0; d < dqk; d++) c->r_dkn[(tok * H + h) * dqk + d] += ds * qf[d];
          } else {
            for (int d = 0; d < dn; d++) c->r_dkn[(tok * H + h) * dn + d] += ds * qf[d];
            for (int d = 0; d < dr; d++) c->r_dkr[tok * dr + d] += ds * qf[dn + d];
          }
        }
      }
    }
  free(sc), free(oi), free(kf), free(qf), free(dof);
}

static void case_init(const mg_kernel_spec *s, bwd_case *c, int packed, int B, int sq, int sk,
                      int q_pos0) {
  const int H = s->heads, dqk = s->d_n + s->d_r;
  memset(c, 0, sizeof *c);
  c->B = B, c->sq = sq, c->sk = sk, c->q_pos0 = q_pos0, c->packed = packed;
  c->scale = (float)(1.0 / sqrt((double)dqk) * 1.3689 * 1.3689);
  c->nq = (size_t)B * sq * H * dqk;
  c->nkn = (size_t)B * sk * H * (packed ? dqk : s->d_n);
  c->nkr = packed ? 0 : (size_t)B * sk * s->d_r;
  c->nv = (size_t)B * sk * H * s->d_v;
  c->no = (size_t)B * sq * H * s->d_v;
  c->nl = (size_t)B * H * sq;
  c->q = kt_rand_e16(is_fp16(s), c->nq);
  c->kn = kt_rand_e16(is_fp16(s), c->nkn);
  c->kr = packed ? NULL : kt_rand_e16(is_fp16(s), c->nkr);
  c->v = kt_rand_e16(is_fp16(s), c->nv);
  c->dout = kt_rand_e16(is_fp16(s), c->no);
  c->o16 = xcalloc(c->no, sizeof *c->o16);
  c->lse32 = xcalloc(c->nl, sizeof *c->lse32);
  c->r_dq = xcalloc(c->nq, sizeof(double));
  c->r_dkn = xcalloc(c->nkn, sizeof(double));
  c->r_dkr = xcalloc(c->nkr, sizeof(double));
  c->r_dv = xcalloc(c->nv, sizeof(double));
  c->delta = xcalloc(c->nl, sizeof(float));
  c->dq_accum = xcalloc(c->nq, sizeof(float));
  c->dkr = xcalloc(c->nkr, sizeof(float));
  c->dq = xcalloc(c->nq, sizeof(e16));
  c->dkn = xcalloc(c->nkn, sizeof(e16));
  c->dv = xcalloc(c->nv, sizeof(e16));
  reference(s, c);
}

static void case_free(bwd_case *c) {
  free(c->q), free(c->kn), free(c->kr), free(c->v), free(c->dout), free(c->o16), free(c->lse32);
  free(c->r_dq), free(c->r_dkn), free(c->r_dkr), free(c->r_dv);
  free(c->delta), free(c->dq_accum), free(c->dkr), free(c->dq), free(c->dkn), free(c->dv);
}

typedef struct launch_args {
  const built_kernel *bk;
  bwd_case *c;
} launch_args;

static void thunk(void *p) {
  launch_args *a = p;
  bwd_case *c = a->c;
  switch (a->bk->fam) {
    case FAM_PRE:
      ((pre_fn)a->bk->kh.fn)(c->o16, c->dout, c->delta, c->dq_accum, c->sq);
      break;
    case FAM_DKDV:
      ((dkdv_fn)a->bk->kh.fn)(c->q, c->kn, c->kr, c->v, c->dout, c->lse32, c->delta,
                           a->bk->det ? NULL : c->dq_accum, c->dkn, c->packed ? NULL : c->dkr,
                           c->dv, c->sq, c->sk, c->q_pos0, c->scale);
      break;
    default:
      ((dq_fn)a->bk->kh.fn)(c->q, c->kn, c->kr, c->v, c->dout, c->lse32, c->delta, c->dq, c->sq,
                         c->sk, c->q_pos0, c->scale);
  }
}

static void launch(const built_kernel *bk, bwd_case *c, const mg_host_launch_opts *lo) {
  const int H = bk->kh.spec.heads;
  mg_host_dim3 grid;
  if (bk->fam == FAM_DKDV)
    grid = (mg_host_dim3){(unsigned)((c->sk + bk->rows - 1) / bk->rows),
                          (unsigned)(bk->det && !bk->packed ? 1 : H), (unsigned)c->B};
  else
    grid = (mg_host_dim3){(unsigned)((c->sq + bk->rows - 1) / bk->rows), (unsigned)H, (unsigned)c->B};
  if (grid.x == 0) return;
  launch_args a = {bk, c};
  kh_launch(&bk->kh, grid, lo, thunk, &a);
}

/* The three kernels of one mode: pre, dkdv and (deterministic) dq. */
typedef struct bwd_set {
  built_kernel pre, dkdv, dq;
  int det, packed;
} bwd_set;

static void set_build(bwd_set *bs, int H, int dn, int dr, int dv, int causal, int packed, int det) {
  bs->det = det, bs->packed = packed;
  mg_kernel_spec s = make_spec("attn_bwd_pre", H, dn, dr, dv, causal);
  build(&s, &bs->pre);
  s = make_spec("attn_bwd_dkdv", H, dn, dr, dv, causal);
  if (packed) set(&s, "k_packed=1");
  if (det) set(&s, "deterministic=1");
  build(&s, &bs->dkdv);
  if (det) {
    s = make_spec("attn_bwd_dq", H, dn, dr, dv, causal);
    if (packed) set(&s, "k_packed=1");
    build(&s, &bs->dq);
  }
}

static void set_unload(bwd_set *bs) {
  unload(&bs->pre);
  unload(&bs->dkdv);
  if (bs->det) unload(&bs->dq);
}

/* Runs the pipeline; outputs are NaN (16-bit) / NaN or 0 (fp32 atomics targets) first. */
static double run_pipeline(const bwd_set *bs, bwd_case *c, const mg_host_launch_opts *lo) {
  for (size_t i = 0; i < c->nl; i++) c->delta[i] = NAN;
  for (size_t i = 0; i < c->nq; i++) c->dq_accum[i] = NAN, c->dq[i] = 0x7fff;
  for (size_t i = 0; i < c->nkn; i++) c->dkn[i] = 0x7fff;
  for (size_t i = 0; i < c->nv; i++) c->dv[i] = 0x7fff;
  for (size_t i = 0; i < c->nkr; i++) c->dkr[i] = bs->det ? NAN : 0.f;
  double t0 = kh_now();
  /* pre zeroes dq_accum in the atomic mode; the deterministic mode has none (NULL) */
  float *keep = c->dq_accum;
  if (bs->det) c->dq_accum = NULL;
  launch(&bs->pre, c, lo);
  c->dq_accum = keep;
  launch(&bs->dkdv, c, lo);
  if (bs->det) launch(&bs->dq, c, lo);
  return kh_now() - t0;
}

static double rel_err_e(const mg_kernel_spec *s, const e16 *got, const double *ref, size_t n,
                        size_t *nans) {
  return kt_rel_err_e16(is_fp16(s), got, ref, n, nans);
}

static double g_worst[4]; /* dq, dk (nope or packed), dk_rope, dv */

static void check(const bwd_set *bs, bwd_case *c, double secs) {
  const mg_kernel_spec *s = &bs->dkdv.kh.spec;
  size_t nans = 0;
  double e[4];
  e[0] = bs->det ? rel_err_e(s, c->dq, c->r_dq, c->nq, &nans)
                 : kt_rel_err_f32(c->dq_accum, c->r_dq, c->nq, &nans);
  e[1] = rel_err_e(s, c->dkn, c->r_dkn, c->nkn, &nans);
  e[2] = c->packed ? 0 : kt_rel_err_f32(c->dkr, c->r_dkr, c->nkr, &nans);
  e[3] = rel_err_e(s, c->dv, c->r_dv, c->nv, &nans);
  print_message("  %s B=%d S_q=%d S_k=%d q_pos0=%d: rel err dq %.2e dk%s %.2e dk_rope %.2e dv %.2e"
                " (%.2f s)\n", bs->dkdv.kh.name + strlen("mla_attn_bwd_dkdv_"), c->B, c->sq, c->sk,
                c->q_pos0, e[0], c->packed ? "" : "_nope", e[1], e[2], e[3], secs);
  if (nans) fail_msg("%zu NaN outputs", nans);
  for (int i = 0; i < 4; i++) {
    if (e[i] > g_worst[i]) g_worst[i] = e[i];
    if (!(e[i] < 2e-2)) fail_msg("gradient %d: relative error %.3e over 2e-2", i, e[i]);
  }
}

static void run_case(const bwd_set *bs, int B, int sq, int sk, int q_pos0) {
  bwd_case c;
  case_init(&bs->dkdv.kh.spec, &c, bs->packed, B, sq, sk, q_pos0);
  double secs = run_pipeline(bs, &c, NULL);
  check(bs, &c, secs);
  case_free(&c);
}

/* Both modes, both key layouts, causal and not, on: S = 1 (one key), S = 77 with batch 2
 * (no tile divides it; causal row 0 has a single key), and query shards at global
 * positions 60 of 100 keys and 130 of 200 (S_q < S_k; causal key tiles start at query
 * tiles past the first, and tiles cross the diagonal), and 16 queries at 0 of 200 keys
 * (causal: key tiles that no query sees get dK = dV = 0 without a query tile). */
static void check_shape(int dn, int dr, int dv) {
  for (int det = 0; det <= 1; det++)
    for (int packed = 0; packed <= 1; packed++)
      for (int causal = 1; causal >= 0; causal--) {
        bwd_set bs;
        set_build(&bs, 2, dn, dr, dv, causal, packed, det);
        run_case(&bs, 1, 1, 1, 0);
        run_case(&bs, 2, 77, 77, 0);
        run_case(&bs, 1, 40, 100, 60);
        run_case(&bs, 1, 70, 200, 130);
        run_case(&bs, 1, 16, 200, 0);
        set_unload(&bs);
      }
}

static void test_deepseek_heads(void **state) { (void)state; check_shape(128, 64, 128); }

/* Large head dims (d_n 192, d_r 64, d_v 256): dK and dV do not both fit in registers, and
 * the default dkdv keeps dK in shared memory (dk_smem = 1). Both modes, causal and not. */
static void test_large_heads(void **state) {
  (void)state;
  for (int det = 0; det <= 1; det++)
    for (int causal = 1; causal >= 0; causal--) {
      bwd_set bs;
      set_build(&bs, 2, 192, 64, 256, causal, 0, det);
      assert_non_null(strstr(bs.dkdv.kh.name, "_dksmem"));
      run_case(&bs, 2, 77, 77, 0);
      run_case(&bs, 1, 40, 100, 60);
      set_unload(&bs);
    }
}
static void test_unusual_heads(void **state) { (void)state; check_shape(64, 32, 64); }

/* The deterministic mode gives the same bits under other schedules (two seeds and round
 * robin), both key layouts, causal. */
static void test_deterministic_bit_identical(void **state) {
  (void)state;
  for (int packed = 0; packed <= 1; packed++) {
    bwd_set bs;
    set_build(&bs, 2, 64, 32, 64, 1, packed, 1);
    bwd_case c;
    case_init(&bs.dkdv.kh.spec, &c, packed, 2, 77, 77, 0);
    mg_host_launch_opts lo;
    memset(&lo, 0, sizeof lo);
    lo.seed = 1;
    double secs = run_pipeline(&bs, &c, &lo);
    check(&bs, &c, secs);
    kt_snapshot out0 = {.n = 4, .p = {c.dq, c.dkn, c.dv, c.dkr},
                        .size = {c.nq * sizeof *c.dq, c.nkn * sizeof *c.dkn,
                                 c.nv * sizeof *c.dv, c.nkr * sizeof *c.dkr}};
    kt_snapshot_take(&out0);
    for (int i = 0; i < 2; i++) {
      memset(&lo, 0, sizeof lo);
      if (i == 0)
        lo.seed = 0x9e3779b97f4a7c15ull;
      else
        lo.round_robin = 1;
      run_pipeline(&bs, &c, &lo);
      if (!kt_snapshot_same(&out0))
        fail_msg("%s: another schedule gives other bits", bs.dkdv.kh.name);
    }
    print_message("  %s + %s: seeds 1, 0x9e37... and round robin: dq, dk, dk_rope, dv "
                  "bit-identical\n", bs.dkdv.kh.name, bs.dq.kh.name);
    kt_snapshot_free(&out0);
    case_free(&c);
    set_unload(&bs);
  }
}

/* Each kernel with one of its barriers removed, for each barrier, with no exemption:
 * every shuffled schedule (NaN-filled shared memory, copies landing at random points
 * between issue and wait, several blocks resident) must give a wrong result, whether the
 * barrier publishes cp.async data (it follows a wait), guards a buffer against the next
 * copy into it, hands dS^T over in the atomic dkdv, or ends a head of the head loop. */
static void test_missing_barrier_caught(void **state) {
  (void)state;
  static const struct {
    const char *family;
    const char *set[3];
  } kernels[] = {
      {"attn_bwd_dkdv", {"stages=1", NULL, NULL}},
      {"attn_bwd_dkdv", {"stages=2", NULL, NULL}},
      {"attn_bwd_dkdv", {"stages=2", "deterministic=1", NULL}},
      {"attn_bwd_dq", {"stages=1", NULL, NULL}},
      {"attn_bwd_dq", {"stages=2", NULL, NULL}},
  };
  for (size_t ki = 0; ki < sizeof kernels / sizeof kernels[0]; ki++) {
    int n = 0, required = 0;
    for (int which = 0;; which++) {
      bwd_set bs;
      memset(&bs, 0, sizeof bs);
      mg_kernel_spec s = make_spec(kernels[ki].family, 2, 64, 32, 64, 1);
      for (int j = 0; j < 3 && kernels[ki].set[j]; j++) set(&s, kernels[ki].set[j]);
      const int is_dq = !strcmp(kernels[ki].family, "attn_bwd_dq");
      bs.det = is_dq || kernels[ki].set[1] != NULL;
      int after_wait = 0;
      built_kernel *target = is_dq ? &bs.dq : &bs.dkdv;
      if (!build_src(&s, which, &after_wait, target)) break;
      n++;
      required += after_wait;
      mg_kernel_spec o = make_spec("attn_bwd_pre", 2, 64, 32, 64, 1);
      build(&o, &bs.pre);
      if (is_dq) {
        o = make_spec("attn_bwd_dkdv", 2, 64, 32, 64, 1);
        set(&o, "deterministic=1");
        build(&o, &bs.dkdv);
      } else if (bs.det) {
        o = make_spec("attn_bwd_dq", 2, 64, 32, 64, 1);
        build(&o, &bs.dq);
      }
      bwd_case c;
      case_init(&bs.dkdv.kh.spec, &c, 0, 1, 140, 140, 0); /* 3 tiles: a stage is refilled */
      int caught = 0;
      for (unsigned long long seed = 1; seed <= 3; seed++) {
        mg_host_launch_opts lo;
        memset(&lo, 0, sizeof lo);
        lo.seed = seed;
        run_pipeline(&bs, &c, &lo);
        size_t nans = 0;
        double e[4];
        e[0] = bs.det ? rel_err_e(&s, c.dq, c.r_dq, c.nq, &nans) : kt_rel_err_f32(c.dq_accum, c.r_dq, c.nq, &nans);
        e[1] = rel_err_e(&s, c.dkn, c.r_dkn, c.nkn, &nans);
        e[2] = kt_rel_err_f32(c.dkr, c.r_dkr, c.nkr, &nans);
        e[3] = rel_err_e(&s, c.dv, c.r_dv, c.nv, &nans);
        caught += nans || e[0] >= 2e-2 || e[1] >= 2e-2 || e[2] >= 2e-2 || e[3] >= 2e-2;
      }
      print_message("  %s without barrier %d (%s): caught by %d of 3 seeds\n", target->kh.name, which,
                    after_wait ? "publishes copies" : "other", caught);
      if (caught < 3)
        fail_msg("%s: barrier %d removed, yet some schedule gives the right result", target->kh.name,
                 which);
      case_free(&c);
      set_unload(&bs);
    }
    assert_true(n >= 2 && required >= 1);
  }
}

/* Other tunable configurations give right answers: every block size, stages, warps. */
static void test_configs(void **state) {
  (void)state;
  static const struct {
    int dn, dr, dv, causal;
    const char *dkdv[6];
    const char *dq[4];
  } cfgs[] = {
      {64, 32, 64, 1, {"block_n=32", "num_warps=2", "block_m=64", "stages=1", "deterministic=1", NULL},
       {"block_m=32", "num_warps=2", "block_n=32", "stages=1"}},
      {64, 32, 64, 0, {"block_n=128", "num_warps=8", "block_m=16", "stages=2", "deterministic=1", "k_packed=1"},
       {"block_m=128", "num_warps=8", "block_n=64", "k_packed=1"}},
      {128, 64, 128, 1, {"block_n=128", "num_warps=8", "block_m=16", "stages=1", "deterministic=0", NULL},
       {NULL}},
  };
  for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
    bwd_set bs;
    memset(&bs, 0, sizeof bs);
    int packed = 0, det = 0;
    mg_kernel_spec s = make_spec("attn_bwd_pre", 2, cfgs[i].dn, cfgs[i].dr, cfgs[i].dv, cfgs[i].causal);
    set(&s, "num_warps=8");
    set(&s, "rows_per_warp=1");
    build(&s, &bs.pre);
    s = make_spec("attn_bwd_dkdv", 2, cfgs[i].dn, cfgs[i].dr, cfgs[i].dv, cfgs[i].causal);
    for (int j = 0; j < 6 && cfgs[i].dkdv[j]; j++) {
      set(&s, cfgs[i].dkdv[j]);
      if (!strcmp(cfgs[i].dkdv[j], "k_packed=1")) packed = 1;
      if (!strcmp(cfgs[i].dkdv[j], "deterministic=1")) det = 1;
    }
    build(&s, &bs.dkdv);
    bs.det = det, bs.packed = packed;
    if (det) {
      s = make_spec("attn_bwd_dq", 2, cfgs[i].dn, cfgs[i].dr, cfgs[i].dv, cfgs[i].causal);
      for (int j = 0; j < 4 && cfgs[i].dq[j]; j++) set(&s, cfgs[i].dq[j]);
      build(&s, &bs.dq);
    }
    run_case(&bs, 2, 77, 77, 0);
    run_case(&bs, 1, 150, 300, 150);
    set_unload(&bs);
  }
}

/* fp16 inputs: one shape, both modes, causal, defaults. */
static void test_fp16(void **state) {
  (void)state;
  for (int det = 0; det <= 1; det++) {
    bwd_set bs;
    memset(&bs, 0, sizeof bs);
    const char *fams[3] = {"attn_bwd_pre", "attn_bwd_dkdv", "attn_bwd_dq"};
    built_kernel *dst[3] = {&bs.pre, &bs.dkdv, &bs.dq};
    for (int f = 0; f < (det ? 3 : 2); f++) {
      mg_kernel_spec s = make_spec(fams[f], 2, 64, 32, 64, 1);
      snprintf(s.dtype, sizeof s.dtype, "fp16");
      if (f == 1 && det) set(&s, "deterministic=1");
      build(&s, dst[f]);
    }
    bs.det = det;
    run_case(&bs, 2, 77, 77, 0);
    set_unload(&bs);
  }
}

static const char unusual_json[] =
    "{\"model_type\": \"minicpm3\", \"num_attention_heads\": 40, \"kv_lora_rank\": 256,"
    " \"qk_rope_head_dim\": 32, \"qk_nope_head_dim\": 64, \"v_head_dim\": 64,"
    " \"q_lora_rank\": 768, \"hidden_size\": 2560}";
static const char large_json[] =
    "{\"model_type\": \"large\", \"num_attention_heads\": 16, \"kv_lora_rank\": 512,"
    " \"qk_rope_head_dim\": 64, \"qk_nope_head_dim\": 192, \"v_head_dim\": 256,"
    " \"q_lora_rank\": 768, \"hidden_size\": 2560}";

/* Every configuration of the three families' tunable spaces that their checks keep
 * compiles for sm_80 and sm_90a without spills or a stack frame (causal), for the
 * DeepSeek-V3 head shape, the unusual one and a large one (d_n 192, d_r 64, d_v 256). Uses the JIT cache ($MLAGEN_CACHE_DIR). */
static void test_nvrtc_all_kept_configs(void **state) {
  (void)state;
  const char *models[] = {"deepseek-v3", NULL, NULL};
  const char *jsons[] = {NULL, unusual_json, large_json};
  kh_sweep sw;
  kh_sweep_open(&sw, 72, KH_SWEEP_SMEM | KH_SWEEP_REJECTS);
  int kept = 0;
  for (int m = 0; m < 3; m++) {
    mg_shape shape;
    kh_load_shape(models[m], jsons[m], &shape);
    mg_kernel_spec specs[MG_SPEC_MAX_KERNELS];
    int n;
    assert_int_equal(mg_spec_for_model(&shape, 1, "bf16", specs, MG_SPEC_MAX_KERNELS, &n, &sw.d), 0);
    for (int i = 0; i < n; i++) {
      if (!specs[i].causal || strncmp(specs[i].family, "attn_bwd_", 9)) continue;
      /* the configurations: a list of assignment sets per family */
      char cfg[160][7][32];
      int nc = 0;
      if (!strcmp(specs[i].family, "attn_bwd_pre")) {
        for (int w = 4; w <= 8; w += 4)
          for (int r = 1; r <= 4; r += 3) {
            snprintf(cfg[nc][0], 32, "num_warps=%d", w);
            snprintf(cfg[nc][1], 32, "rows_per_warp=%d", r);
            cfg[nc][2][0] = 0;
            nc++;
          }
      } else if (!strcmp(specs[i].family, "attn_bwd_dkdv")) {
        for (int bn = 32; bn <= 128; bn *= 2)
          for (int bm = 16; bm <= 64; bm *= 2)
            for (int st = 1; st <= 2; st++)
              for (int det = 0; det <= 1; det++)
                for (int pk = 0; pk <= 1; pk++)
                  for (int dks = 0; dks <= 1; dks++) {
                    snprintf(cfg[nc][0], 32, "block_n=%d", bn);
                    snprintf(cfg[nc][1], 32, "num_warps=%d", bn / 16);
                    snprintf(cfg[nc][2], 32, "block_m=%d", bm);
                    snprintf(cfg[nc][3], 32, "stages=%d", st);
                    snprintf(cfg[nc][4], 32, "deterministic=%d", det);
                    snprintf(cfg[nc][5], 32, "k_packed=%d", pk);
                    snprintf(cfg[nc][6], 32, "dk_smem=%d", dks);
                    nc++;
                  }
      } else {
        for (int bm = 32; bm <= 128; bm *= 2)
          for (int bn = 32; bn <= 64; bn *= 2)
            for (int st = 1; st <= 2; st++)
              for (int pk = 0; pk <= 1; pk++) {
                snprintf(cfg[nc][0], 32, "block_m=%d", bm);
                snprintf(cfg[nc][1], 32, "num_warps=%d", bm / 16);
                snprintf(cfg[nc][2], 32, "block_n=%d", bn);
                snprintf(cfg[nc][3], 32, "stages=%d", st);
                snprintf(cfg[nc][4], 32, "k_packed=%d", pk);
                cfg[nc][5][0] = 0;
                nc++;
              }
      }
      for (int ci = 0; ci < nc; ci++) {
        mg_kernel_spec s = specs[i];
        for (int j = 0; j < 7 && cfg[ci][j][0]; j++) set(&s, cfg[ci][j]);
        kept += kh_sweep_compile(&sw, &s, "");
      }
    }
  }
  print_message("  %d configurations kept, %d rejected by the templates' checks (%.0f s)\n", kept,
                sw.rejected, kh_now() - sw.t0);
  assert_true(kept >= 60);
  kh_sweep_close(&sw);
}

static int report_worst(void **state) {
  (void)state;
  printf("worst over the checked cases: dq %.2e, dk %.2e, dk_rope %.2e, dv %.2e\n", g_worst[0],
         g_worst[1], g_worst[2], g_worst[3]);
  return 0;
}

/* The child side of test_asan: the three kernels (pre, dkdv, dq; both dkdv modes) built
 * with ASan (MG_HOST_ASAN=1, see kh_run_asan_child) on a small causal case, in a process
 * that has the ASan runtime preloaded. */
static void asan_case_run(void **state) {
  (void)state;
  for (int det = 1; det >= 0; det--) {
    bwd_set bs;
    set_build(&bs, 2, 64, 32, 64, 1, 0, det);
    run_case(&bs, 2, 77, 77, 0);
    set_unload(&bs);
  }
}

static void test_asan(void **state) {
  (void)state;
  kh_run_asan_child("test_attn_bwd", g_test_seed, asan_case_run);
}

int main(int argc, char **argv) {
  kt_seed_init();
  const int rc = kh_test_main(argc, argv, asan_case_run);
  if (rc >= 0) return rc;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_deepseek_heads),
      cmocka_unit_test(test_unusual_heads),
      cmocka_unit_test(test_large_heads),
      cmocka_unit_test(test_deterministic_bit_identical),
      cmocka_unit_test(test_configs),
      cmocka_unit_test(test_missing_barrier_caught),
      cmocka_unit_test(test_fp16),
      cmocka_unit_test(test_nvrtc_all_kept_configs),
      cmocka_unit_test(test_asan),
  };
  return cmocka_run_group_tests(tests, NULL, report_worst);
}
