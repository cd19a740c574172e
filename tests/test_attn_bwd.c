/* test_attn_bwd.c: the tensor-core attention backward (templates/attn_bwd_pre.cu.tpl,
 * attn_bwd_dkdv.cu.tpl, attn_bwd_dq.cu.tpl), run unchanged on the CPU through the host
 * executor (tests/host/), against float64 reference gradients; and every configuration the
 * templates' checks keep, compiled by NVRTC for sm_80 and sm_90a without spills.
 *
 * Inputs are random bf16 (or fp16) values, scores with standard deviation 2 under DeepSeek's
 * YaRN softmax scale (the seed is printed, MLAGEN_TEST_SEED overrides it). The forward is
 * computed in float64 (tests/attn_ref.h) from the rounded inputs; the kernels get its O
 * rounded to 16 bits and its LSE rounded to fp32, as attn_fwd stores them. The reference
 * gradients (dq, dk_nope or packed dk, dk_rope summed over the heads, dv) are float64 from
 * attn_ref.h's 16-bit-aware backward (P from the stored LSE, delta from the stored O, P and
 * dS rounded to 16 bits as the kernels' MMA operands). The pipeline: attn_bwd_pre (delta;
 * zeroes dq_accum), attn_bwd_dkdv, and in the deterministic mode attn_bwd_dq. Every
 * gradient is compared per element (kt_check: atol relative to the gradient's RMS, rtol
 * from the roundings; the figures at compare()). test_mutations_caught injects bugs into
 * the rendered dkdv and requires the check to fail (and dkdv or dq ignoring ld_k_rope: split
 * keys read k_rope at column KT_ROPE_COL of NaN-filled rows, one case contiguous). MLAGEN_TEST_FILTER (a cmocka pattern)
 * runs a subset: ctest runs each test as its own entry. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_ref.h"
#include "kernel_host.h"
#include "kernel_test_util.h"
#include "mlagen.h"

typedef void (*pre_fn)(const e16 *o, const e16 *dout, float *delta, float *dq_accum,
                       int seqlen_q);
typedef void (*dkdv_fn)(const e16 *q, const e16 *k_nope, const e16 *k_rope, const e16 *v,
                        const e16 *dout, const float *lse, const float *delta, float *dq_accum,
                        e16 *dk_nope, float *dk_rope, e16 *dv, int seqlen_q, int seqlen_k,
                        int q_pos0, int q_split, int q_pos1, float softmax_scale);
typedef void (*dq_fn)(const e16 *q, const e16 *k_nope, const e16 *k_rope, const e16 *v,
                      const e16 *dout, const float *lse, const float *delta, e16 *dq,
                      int seqlen_q, int seqlen_k, int q_pos0, int q_split, int q_pos1,
                      float softmax_scale);

/* The varlen variants (spec.varlen): the same, then cu_seqlens and n_seqs. */
typedef void (*pre_varlen_fn)(const e16 *o, const e16 *dout, float *delta, float *dq_accum,
                              int seqlen_q, const int *cu_seqlens, int n_seqs);
typedef void (*dkdv_varlen_fn)(const e16 *q, const e16 *k_nope, const e16 *k_rope, const e16 *v,
                               const e16 *dout, const float *lse, const float *delta,
                               float *dq_accum, e16 *dk_nope, float *dk_rope, e16 *dv,
                               int seqlen_q, int seqlen_k, int q_pos0, int q_split, int q_pos1,
                               float softmax_scale, const int *cu_seqlens, int n_seqs);
typedef void (*dq_varlen_fn)(const e16 *q, const e16 *k_nope, const e16 *k_rope, const e16 *v,
                             const e16 *dout, const float *lse, const float *delta, e16 *dq,
                             int seqlen_q, int seqlen_k, int q_pos0, int q_split, int q_pos1,
                             float softmax_scale, const int *cu_seqlens, int n_seqs);

/* Split keys (k_packed = 0): dkdv and dq with k_rope's row stride ld_k_rope after k_rope. */
typedef void (*dkdv_split_fn)(const e16 *q, const e16 *k_nope, const e16 *k_rope, int ld_k_rope,
                              const e16 *v, const e16 *dout, const float *lse, const float *delta,
                              float *dq_accum, e16 *dk_nope, float *dk_rope, e16 *dv,
                              int seqlen_q, int seqlen_k, int q_pos0, int q_split, int q_pos1,
                              float softmax_scale);
typedef void (*dq_split_fn)(const e16 *q, const e16 *k_nope, const e16 *k_rope, int ld_k_rope,
                            const e16 *v, const e16 *dout, const float *lse, const float *delta,
                            e16 *dq, int seqlen_q, int seqlen_k, int q_pos0, int q_split,
                            int q_pos1, float softmax_scale);
typedef void (*dkdv_split_varlen_fn)(const e16 *q, const e16 *k_nope, const e16 *k_rope,
                                     int ld_k_rope, const e16 *v, const e16 *dout,
                                     const float *lse, const float *delta, float *dq_accum,
                                     e16 *dk_nope, float *dk_rope, e16 *dv, int seqlen_q,
                                     int seqlen_k, int q_pos0, int q_split, int q_pos1,
                                     float softmax_scale, const int *cu_seqlens, int n_seqs);
typedef void (*dq_split_varlen_fn)(const e16 *q, const e16 *k_nope, const e16 *k_rope,
                                   int ld_k_rope, const e16 *v, const e16 *dout, const float *lse,
                                   const float *delta, e16 *dq, int seqlen_q, int seqlen_k,
                                   int q_pos0, int q_split, int q_pos1, float softmax_scale,
                                   const int *cu_seqlens, int n_seqs);

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
static int build_edit(const mg_kernel_spec *spec, kh_edit_fn edit, void *ctx, built_kernel *out);

static int build_src(const mg_kernel_spec *spec, int drop, int *after_wait, built_kernel *out) {
  kh_drop dr = {.which = drop};
  if (!build_edit(spec, drop >= 0 ? kh_drop_edit : NULL, &dr, out)) return 0;
  if (after_wait) *after_wait = dr.after_wait;
  return 1;
}

/* build_src with any edit of the source (NULL: none); returns 0 when the edit declined. */
static int build_edit(const mg_kernel_spec *spec, kh_edit_fn edit, void *ctx, built_kernel *out) {
  memset(out, 0, sizeof *out);
  out->fam = !strcmp(spec->family, "attn_bwd_pre") ? FAM_PRE
             : !strcmp(spec->family, "attn_bwd_dkdv") ? FAM_DKDV : FAM_DQ;
  if (!kh_build_edited(NULL, spec, 0, edit, ctx, &out->kh)) return 0;
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
 * Split keys: kn [B, S_k, H, d_n], kr [B, S_k, d_r], which the kernels read from kr_buf
 * (kt_rope_strided, made by run_pipeline: at column KT_ROPE_COL of NaN-filled rows, or
 * contiguous when kr_contig); packed: kn [B, S_k, H, d_n + d_r].
 * Query row i at q_pos0 + i, or with two chunks (q_split > 0) at q_pos1 + i - q_split from
 * row q_split on (attn_ref_pos). */
typedef struct bwd_case {
  int B, sq, sk, q_pos0, q_split, q_pos1, packed;
  int *cu; /* packed sequences: cu_seqlens [n_cu + 1] (case_init_vl, malloc'd), else NULL */
  int n_cu;
  float scale;
  e16 *q, *kn, *kr, *v, *dout, *o16;
  e16 *kr_buf;       /* split keys: what the kernels read k_rope from (run_pipeline) */
  const e16 *kr_arg; /* their k_rope and ld_k_rope arguments */
  int ld_kr, kr_contig;
  float *lse32;
  size_t nq, nkn, nkr, nv, no, nl;
  double *r_dq, *r_dkn, *r_dkr, *r_dv; /* reference gradients */
  double *f_dq, *f_dkn, *f_dkr, *f_dv; /* their bounds for ambiguous 16-bit roundings */
  /* kernel outputs */
  float *delta, *dq_accum, *dkr;
  e16 *dq, *dkn, *dv;
} bwd_case;

static void *xcalloc(size_t n, size_t sz) { return calloc(n ? n : 1, sz); }

/* The k_rope layout of the split-key cases case_init_vl makes: 0 (wide, NaN around each
 * row) but for check_shape's case with every tile full. */
static int g_kr_contig;

/* 1: case_init_vl fills every input of the last batch item (q, k_nope, k_rope, v, dout, and
 * the stored o and lse, so attn_bwd_pre's delta too) with NaN after the reference is made,
 * and compare checks the items before it only: a CTA's tile rows past its item's end must
 * not bring the next item's values in (0 * NaN would be NaN). */
static int g_poison_last;

/* The relative size of the kernels' own fp32 error in a P or dS element, for attn_ref.h's
 * bound of ambiguous 16-bit roundings (see the tolerances below). */
#define FLIP_EPS 3e-5


/* Reference forward and backward in float64 (tests/attn_ref.h) from the rounded inputs;
 * each head's K is [k_nope ; k_rope] (split: the shared k_rope, whose gradient is dK's rope
 * columns summed over the heads). The kernels get o rounded to 16 bits and lse to fp32. */
static void reference(const mg_kernel_spec *s, bwd_case *c) {
  const int H = s->heads, dn = s->d_n, dr = s->d_r, dqk = dn + dr, f16 = is_fp16(s);
  const attn_ref_dims d = {c->B,     c->sq,    c->sk,         H,         dqk, s->d_v,
                           s->causal, c->q_pos0, c->scale, c->q_split, c->q_pos1};
  const attn_ref_docs docs = {c->cu, c->n_cu}, *dp = c->cu ? &docs : NULL;
  const size_t nk = (size_t)c->B * c->sk * H; /* key rows: token * H + head */
  double *q = kt_e16_to_d(f16, c->q, c->nq), *v = kt_e16_to_d(f16, c->v, c->nv);
  double *dout = kt_e16_to_d(f16, c->dout, c->no);
  double *k = xcalloc(nk * dqk, sizeof *k), *dk = xcalloc(nk * dqk, sizeof *dk);
  double *fdk = xcalloc(nk * dqk, sizeof *fdk);
  double *o = xcalloc(c->no, sizeof *o), *lse = xcalloc(c->nl, sizeof *lse);
  for (size_t t = 0; t < nk; t++)
    for (int e = 0; e < dqk; e++)
      k[t * dqk + e] = c->packed ? e_to_float(s, c->kn[t * dqk + e])
                       : e < dn  ? e_to_float(s, c->kn[t * dn + e])
                                 : e_to_float(s, c->kr[t / H * dr + e - dn]);
  attn_ref_fwd_docs(&d, dp, q, k, v, o, lse);
  for (size_t i = 0; i < c->no; i++) c->o16[i] = float_to_e(s, (float)o[i]);
  for (size_t i = 0; i < c->nl; i++) c->lse32[i] = (float)lse[i];
  /* the gradients from the stored o16 and lse32, P and dS rounded to 16 bits (attn_ref.h) */
  for (size_t i = 0; i < c->no; i++) o[i] = e_to_float(s, c->o16[i]);
  for (size_t i = 0; i < c->nl; i++) lse[i] = c->lse32[i];
  const attn_ref_mixed mx = {o, lse, kt_round_fn(f16), FLIP_EPS, c->f_dq, fdk, c->f_dv};
  attn_ref_bwd_docs(&d, dp, q, k, v, dout, c->r_dq, dk, c->r_dv, NULL, NULL, &mx);
  if (c->packed) {
    memcpy(c->r_dkn, dk, nk * dqk * sizeof *dk);
    memcpy(c->f_dkn, fdk, nk * dqk * sizeof *dk);
  } else {
    for (size_t t = 0; t < nk; t++)
      for (int e = 0; e < dqk; e++)
        if (e < dn) {
          c->r_dkn[t * dn + e] = dk[t * dqk + e];
          c->f_dkn[t * dn + e] = fdk[t * dqk + e];
        } else {
          c->r_dkr[t / H * dr + e - dn] += dk[t * dqk + e];
          c->f_dkr[t / H * dr + e - dn] += fdk[t * dqk + e];
        }
  }
  free(q), free(v), free(dout), free(k), free(dk), free(fdk), free(o), free(lse);
}

/* vl: packed sequences (batch 1): the documents vl, and NaN in every slack row of every
 * input (q, k, v, dout before the reference; the stored o and lse after it). */
static void case_init_vl(const mg_kernel_spec *s, bwd_case *c, int packed, int B, int sq,
                         int sk, const kt_qpos *pos, const kt_varlen *vl) {
  const int H = s->heads, dqk = s->d_n + s->d_r;
  memset(c, 0, sizeof *c);
  c->B = B, c->sq = sq, c->sk = sk, c->packed = packed, c->kr_contig = g_kr_contig;
  if (vl) c->cu = kt_varlen_copy(vl), c->n_cu = vl->n;
  c->q_pos0 = pos->q_pos0, c->q_split = pos->q_split, c->q_pos1 = pos->q_pos1;
  c->scale = (float)kt_softmax_scale(dqk); /* YaRN mscale^2 / sqrt(d_qk) */
  c->nq = (size_t)B * sq * H * dqk;
  c->nkn = (size_t)B * sk * H * (packed ? dqk : s->d_n);
  c->nkr = packed ? 0 : (size_t)B * sk * s->d_r;
  c->nv = (size_t)B * sk * H * s->d_v;
  c->no = (size_t)B * sq * H * s->d_v;
  c->nl = (size_t)B * H * sq;
  const int f16 = is_fp16(s);
  c->q = kt_rand_e16_sd(f16, c->nq, kt_q_sd(c->scale, dqk)); /* scores with sd 2 */
  c->kn = kt_rand_e16_sd(f16, c->nkn, 1);
  c->kr = packed ? NULL : kt_rand_e16_sd(f16, c->nkr, 1);
  c->v = kt_rand_e16_sd(f16, c->nv, 1);
  c->dout = kt_rand_e16_sd(f16, c->no, 1);
  c->o16 = xcalloc(c->no, sizeof *c->o16);
  c->lse32 = xcalloc(c->nl, sizeof *c->lse32);
  c->r_dq = xcalloc(c->nq, sizeof(double));
  c->r_dkn = xcalloc(c->nkn, sizeof(double));
  c->r_dkr = xcalloc(c->nkr, sizeof(double));
  c->r_dv = xcalloc(c->nv, sizeof(double));
  c->f_dq = xcalloc(c->nq, sizeof(double));
  c->f_dkn = xcalloc(c->nkn, sizeof(double));
  c->f_dkr = xcalloc(c->nkr, sizeof(double));
  c->f_dv = xcalloc(c->nv, sizeof(double));
  c->delta = xcalloc(c->nl, sizeof(float));
  c->dq_accum = xcalloc(c->nq, sizeof(float));
  c->dkr = xcalloc(c->nkr, sizeof(float));
  c->dq = xcalloc(c->nq, sizeof(e16));
  c->dkn = xcalloc(c->nkn, sizeof(e16));
  c->dv = xcalloc(c->nv, sizeof(e16));
  const int T = vl ? vl->cu[vl->n] : 0;
  if (vl) {
    kt_nan_slack_e16(c->q, sq, (size_t)H * dqk, pos, T);
    kt_nan_slack_e16(c->kn, sk, c->nkn / (size_t)(sk ? sk : 1), NULL, T);
    if (c->kr) kt_nan_slack_e16(c->kr, sk, (size_t)s->d_r, NULL, T);
    kt_nan_slack_e16(c->v, sk, (size_t)H * s->d_v, NULL, T);
    kt_nan_slack_e16(c->dout, sq, (size_t)H * s->d_v, pos, T);
  }
  reference(s, c);
  if (vl) {
    kt_nan_slack_e16(c->o16, sq, (size_t)H * s->d_v, pos, T);
    kt_nan_slack_f32(c->lse32, H, sq, pos, T);
  }
  if (g_poison_last) {
    kt_nan_last_item_e16(c->q, c->nq, B), kt_nan_last_item_e16(c->kn, c->nkn, B);
    kt_nan_last_item_e16(c->kr, c->nkr, B), kt_nan_last_item_e16(c->v, c->nv, B);
    kt_nan_last_item_e16(c->dout, c->no, B), kt_nan_last_item_e16(c->o16, c->no, B);
    kt_nan_last_item_f32(c->lse32, c->nl, B);
  }
}

static void case_init_pos(const mg_kernel_spec *s, bwd_case *c, int packed, int B, int sq,
                          int sk, const kt_qpos *pos) {
  case_init_vl(s, c, packed, B, sq, sk, pos, NULL);
}

/* One chunk: row i at q_pos0 + i. */
static void case_init(const mg_kernel_spec *s, bwd_case *c, int packed, int B, int sq, int sk,
                      int q_pos0) {
  case_init_pos(s, c, packed, B, sq, sk, &(kt_qpos){q_pos0, 0, 0});
}

static void case_free(bwd_case *c) {
  free(c->q), free(c->kn), free(c->kr), free(c->v), free(c->dout), free(c->o16), free(c->lse32);
  free(c->r_dq), free(c->r_dkn), free(c->r_dkr), free(c->r_dv);
  free(c->f_dq), free(c->f_dkn), free(c->f_dkr), free(c->f_dv);
  free(c->delta), free(c->dq_accum), free(c->dkr), free(c->dq), free(c->dkn), free(c->dv);
  free(c->cu), free(c->kr_buf);
}

typedef struct launch_args {
  const built_kernel *bk;
  bwd_case *c;
} launch_args;

static void thunk(void *p) {
  launch_args *a = p;
  bwd_case *c = a->c;
  const kt_qpos kp = kt_qpos_kernel(&(kt_qpos){c->q_pos0, c->q_split, c->q_pos1});
  if (!c->packed && a->bk->fam != FAM_PRE) { /* split keys: ld_k_rope after k_rope */
    const float *dqa = a->bk->det ? NULL : c->dq_accum;
    if (a->bk->fam == FAM_DKDV && c->cu)
      ((dkdv_split_varlen_fn)a->bk->kh.fn)(c->q, c->kn, c->kr_arg, c->ld_kr, c->v, c->dout,
                                           c->lse32, c->delta, (float *)dqa, c->dkn, c->dkr, c->dv,
                                           c->sq, c->sk, kp.q_pos0, kp.q_split, kp.q_pos1,
                                           c->scale, c->cu, c->n_cu);
    else if (a->bk->fam == FAM_DKDV)
      ((dkdv_split_fn)a->bk->kh.fn)(c->q, c->kn, c->kr_arg, c->ld_kr, c->v, c->dout, c->lse32,
                                    c->delta, (float *)dqa, c->dkn, c->dkr, c->dv, c->sq, c->sk,
                                    kp.q_pos0, kp.q_split, kp.q_pos1, c->scale);
    else if (c->cu)
      ((dq_split_varlen_fn)a->bk->kh.fn)(c->q, c->kn, c->kr_arg, c->ld_kr, c->v, c->dout,
                                         c->lse32, c->delta, c->dq, c->sq, c->sk, kp.q_pos0,
                                         kp.q_split, kp.q_pos1, c->scale, c->cu, c->n_cu);
    else
      ((dq_split_fn)a->bk->kh.fn)(c->q, c->kn, c->kr_arg, c->ld_kr, c->v, c->dout, c->lse32,
                                  c->delta, c->dq, c->sq, c->sk, kp.q_pos0, kp.q_split, kp.q_pos1,
                                  c->scale);
    return;
  }
  if (c->cu) {
    switch (a->bk->fam) {
      case FAM_PRE:
        ((pre_varlen_fn)a->bk->kh.fn)(c->o16, c->dout, c->delta, c->dq_accum, c->sq, c->cu, c->n_cu);
        break;
      case FAM_DKDV:
        ((dkdv_varlen_fn)a->bk->kh.fn)(c->q, c->kn, c->kr, c->v, c->dout, c->lse32, c->delta,
                                       a->bk->det ? NULL : c->dq_accum, c->dkn,
                                       c->packed ? NULL : c->dkr, c->dv, c->sq, c->sk, kp.q_pos0,
                                       kp.q_split, kp.q_pos1, c->scale, c->cu, c->n_cu);
        break;
      default:
        ((dq_varlen_fn)a->bk->kh.fn)(c->q, c->kn, c->kr, c->v, c->dout, c->lse32, c->delta, c->dq,
                                     c->sq, c->sk, kp.q_pos0, kp.q_split, kp.q_pos1, c->scale,
                                     c->cu, c->n_cu);
    }
    return;
  }
  switch (a->bk->fam) {
    case FAM_PRE:
      ((pre_fn)a->bk->kh.fn)(c->o16, c->dout, c->delta, c->dq_accum, c->sq);
      break;
    case FAM_DKDV:
      ((dkdv_fn)a->bk->kh.fn)(c->q, c->kn, c->kr, c->v, c->dout, c->lse32, c->delta,
                           a->bk->det ? NULL : c->dq_accum, c->dkn, c->packed ? NULL : c->dkr,
                           c->dv, c->sq, c->sk, kp.q_pos0, kp.q_split, kp.q_pos1, c->scale);
      break;
    default:
      ((dq_fn)a->bk->kh.fn)(c->q, c->kn, c->kr, c->v, c->dout, c->lse32, c->delta, c->dq, c->sq,
                         c->sk, kp.q_pos0, kp.q_split, kp.q_pos1, c->scale);
  }
}

/* The key-tile check of the last packed attn_bwd_dq launch (kt_tile_check: every CTA read its
 * documents' key tiles and no others), and the query-tile check of the last packed
 * single-chunk attn_bwd_dkdv launch (kt_query_tile_check): "" when it passed, else the reason. */
static char g_dq_tiles[300], g_dkdv_tiles[300];

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
  const mg_kernel_spec *s = &bk->kh.spec;
  const kt_qpos pos = {c->q_pos0, c->q_split, c->q_pos1};
  if (bk->fam == FAM_DKDV && c->cu && !lo && (c->q_split <= 0 || c->q_split >= c->sq)) {
    /* packed attn_bwd_dkdv, one chunk of positions: the query rows each CTA copies, against
     * the hull of the rows that see its keys */
    const size_t qrow = (size_t)H * (s->d_n + s->d_r) * sizeof *c->q;
    kt_tile_watch tw;
    kt_tile_watch_init(&tw, c->q, qrow, (size_t)c->sq, (size_t)grid.x * grid.y);
    kh_launch(&bk->kh, grid, &tw.lo, thunk, &a);
    kt_query_tile_check(&tw, (int)grid.x, (int)grid.y, bk->rows, kh_config_int(&bk->kh, "block_m"),
                        c->sq, c->cu, c->n_cu, s->causal, &pos, c->sk, g_dkdv_tiles,
                        sizeof g_dkdv_tiles);
    kt_tile_watch_free(&tw);
    return;
  }
  if (bk->fam != FAM_DQ || !c->cu || lo) {
    kh_launch(&bk->kh, grid, lo, thunk, &a);
    return;
  }
  /* packed attn_bwd_dq: the key rows (k_nope) each CTA copies, against its rows' hull */
  const size_t row = (size_t)H * (bk->packed ? s->d_n + s->d_r : s->d_n) * sizeof *c->kn;
  kt_tile_watch tw;
  kt_tile_watch_init(&tw, c->kn, row, (size_t)c->sk, (size_t)grid.x * H);
  kh_launch(&bk->kh, grid, &tw.lo, thunk, &a);
  kt_tile_check(&tw, (int)grid.x, H, bk->rows, 1, c->sq, c->cu, c->n_cu, s->causal, &pos, c->sk,
                kh_config_int(&bk->kh, "block_n"), g_dq_tiles, sizeof g_dq_tiles);
  kt_tile_watch_free(&tw);
}

/* The three kernels of one mode: pre, dkdv and (deterministic) dq. */
typedef struct bwd_set {
  built_kernel pre, dkdv, dq;
  int det, packed;
} bwd_set;

/* dkdv_block_m > 0: that block_m for attn_bwd_dkdv (else its default). varlen: the
 * packed-sequence variants. */
static void set_build_bm(bwd_set *bs, int H, int dn, int dr, int dv, int causal, int packed,
                         int det, int dkdv_block_m, int varlen) {
  bs->det = det, bs->packed = packed;
  mg_kernel_spec s = make_spec("attn_bwd_pre", H, dn, dr, dv, causal);
  s.varlen = varlen;
  build(&s, &bs->pre);
  s = make_spec("attn_bwd_dkdv", H, dn, dr, dv, causal);
  s.varlen = varlen;
  if (packed) set(&s, "k_packed=1");
  if (det) set(&s, "deterministic=1");
  if (dkdv_block_m > 0) {
    char bm[32];
    snprintf(bm, sizeof bm, "block_m=%d", dkdv_block_m);
    set(&s, bm);
  }
  build(&s, &bs->dkdv);
  if (det) {
    s = make_spec("attn_bwd_dq", H, dn, dr, dv, causal);
    s.varlen = varlen;
    if (packed) set(&s, "k_packed=1");
    build(&s, &bs->dq);
  }
}

static void set_build(bwd_set *bs, int H, int dn, int dr, int dv, int causal, int packed, int det) {
  set_build_bm(bs, H, dn, dr, dv, causal, packed, det, 0, 0);
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
  free(c->kr_buf);
  c->kr_buf = kt_rope_strided(c->kr, (size_t)c->B * c->sk, bs->dkdv.kh.spec.d_r, !c->kr_contig,
                              &c->kr_arg, &c->ld_kr);
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

/* Tolerances, per element: |err| <= atol_frac * rms(gradient) + rtol |ref| + flip
 * (kernel_test_util.h), flip the reference's bound for the P and dS elements that lie
 * within FLIP_EPS (relative) of a 16-bit rounding boundary (attn_ref.h), so that a rounding
 * the kernel makes the other way loosens only the elements it touches. rtol: the storage's
 * unit roundoff (its own rounding; u_fp32 for dq_accum and dk_rope). atol_frac is twice
 * NOISE_*, the largest noise figure (max (|err| - rtol |ref| - flip) / rms) measured by
 * kt_noise_report over every case of the numeric tests of this file (test_deepseek_heads,
 * test_unusual_heads, test_large_heads, test_deterministic_bit_identical, test_configs,
 * test_fp16; MLAGEN_TEST_SEED 21, 22, 23; host executor): dq 3.0e-8, dq_accum 3.0e-6,
 * dk_nope 6.2e-6 (packed dk 3.6e-8), dk_rope 3.3e-6, dv 1.1e-7: fp32 accumulation order
 * only, so NOISE_* is that figure but at least 1e-6 (three seeds do not size the tail of
 * such small figures; 2e-6 of the RMS is still far below any bug worth catching). Before
 * the flip bound (rtol 2 u instead), the same figures were 2.7e-3 to 1.0e-2, set by the
 * rare flipped roundings. */
#define NOISE_DQ 1e-6
#define NOISE_DQ_ACCUM 3e-6
#define NOISE_DK 6.2e-6
#define NOISE_DKR 3.3e-6
#define NOISE_DV 1e-6

/* Compares the four gradients per element; ratio[i]: the worst err / bound of dq, dk,
 * dk_rope, dv (over 1 fails). Returns the number of NaN outputs; the first failure's
 * message goes to msg (msg[0] = 0 when every gradient passes). */
static size_t compare(const bwd_set *bs, const bwd_case *c, double ratio[4], char *msg, size_t n) {
  const mg_kernel_spec *s = &bs->dkdv.kh.spec;
  const int H = s->heads, dqk = s->d_n + s->d_r, k16 = is_fp16(s) ? KT_F16 : KT_BF16;
  const double r16 = kt_unit_roundoff(k16), r32 = kt_unit_roundoff(KT_F32);
  const int nb = c->B - (g_poison_last && c->B > 1); /* the items checked (g_poison_last) */
  const size_t qrows = (size_t)nb * c->sq * H, krows = (size_t)nb * c->sk * H;
  const size_t wk = (size_t)(c->packed ? dqk : s->d_n);
  kt_checked k[4];
  k[0] = bs->det ? kt_check_slack("attn_bwd dq", k16, c->dq, c->r_dq, c->f_dq, qrows, dqk, 0,
                                  dqk, (kt_tol){2 * NOISE_DQ, r16}, 0)
                 : kt_check_slack("attn_bwd dq_accum", KT_F32, c->dq_accum, c->r_dq, c->f_dq,
                                  qrows, dqk, 0, dqk, (kt_tol){2 * NOISE_DQ_ACCUM, r32}, 0);
  k[1] = kt_check_slack(c->packed ? "attn_bwd dk" : "attn_bwd dk_nope", k16, c->dkn, c->r_dkn,
                        c->f_dkn, krows, wk, 0, wk, (kt_tol){2 * NOISE_DK, r16}, 0);
  k[2] = kt_check_slack("attn_bwd dk_rope", KT_F32, c->dkr, c->r_dkr, c->f_dkr,
                        (size_t)nb * c->sk, s->d_r, 0, c->packed ? 0 : s->d_r,
                        (kt_tol){2 * NOISE_DKR, r32}, 0);
  k[3] = kt_check_slack("attn_bwd dv", k16, c->dv, c->r_dv, c->f_dv, krows, s->d_v, 0, s->d_v,
                        (kt_tol){2 * NOISE_DV, r16}, 0);
  size_t nans = 0;
  if (msg) msg[0] = 0;
  for (int i = 0; i < 4; i++) {
    ratio[i] = k[i].r.n ? k[i].r.worst_ratio : 0;
    nans += (size_t)(k[i].r.worst_ratio == INFINITY);
    if (msg && !msg[0] && k[i].r.n && !cc_ok(&k[i].r)) snprintf(msg, n, "%s", k[i].msg);
  }
  return nans;
}

/* 1 when every gradient passes per element. */
static int grads_ok(const bwd_set *bs, const bwd_case *c) {
  double r[4];
  char msg[8];
  kt_noise_quiet = 1; /* a kernel without a barrier: its errors are not noise */
  compare(bs, c, r, msg, sizeof msg);
  kt_noise_quiet = 0;
  return !msg[0];
}

static void check(const bwd_set *bs, bwd_case *c, double secs) {
  double r[4];
  char msg[400];
  compare(bs, c, r, msg, sizeof msg);
  print_message("  %s B=%d S_q=%d S_k=%d q_pos0=%d q_split=%d q_pos1=%d: err/bound dq %.2f dk%s "
                "%.2f dk_rope %.2f dv %.2f (%.2f s)\n", bs->dkdv.kh.name + strlen("mla_attn_bwd_dkdv_"),
                c->B, c->sq, c->sk, c->q_pos0, c->q_split, c->q_pos1, r[0], c->packed ? "" : "_nope",
                r[1], r[2], r[3], secs);
  if (msg[0]) fail_msg("%s", msg);
}

static void run_case_pos(const bwd_set *bs, int B, int sq, int sk, const kt_qpos *pos) {
  bwd_case c;
  case_init_pos(&bs->dkdv.kh.spec, &c, bs->packed, B, sq, sk, pos);
  double secs = run_pipeline(bs, &c, NULL);
  check(bs, &c, secs);
  case_free(&c);
}
static void run_case(const bwd_set *bs, int B, int sq, int sk, int q_pos0) {
  run_case_pos(bs, B, sq, sk, &(kt_qpos){q_pos0, 0, 0});
}

/* Both modes, both key layouts, causal and not, on: S = 1 (one key), S = 77 with batch 2
 * (no tile divides it; causal row 0 has a single key), and again with NaN in every input of
 * item 1 (item 0 checked: batch isolation), and query shards at global
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
        g_poison_last = 1; /* the same with NaN in every input of item 1: item 0 unchanged */
        run_case(&bs, 2, 77, 77, 0);
        g_poison_last = 0;
        run_case(&bs, 1, 40, 100, 60);
        run_case(&bs, 1, 70, 200, 130);
        run_case(&bs, 1, 16, 200, 0);
        g_kr_contig = 1; /* split keys: the one contiguous k_rope (ld_k_rope = d_r) */
        run_case(&bs, 1, 128, 128, 0); /* every tile full: the training lengths' case */
        g_kr_contig = 0;
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
      run_case(&bs, 1, 64, 128, 64); /* every key tile full */
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
        caught += nans || !grads_ok(&bs, &c); (void)e;
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

/* The configurations of the three families' tunable spaces that their checks keep compile
 * for sm_80 and sm_90a without spills or a stack frame (causal), for the DeepSeek-V3 head
 * shape, the unusual one and a large one (d_n 192, d_r 64, d_v 256), and the varlen
 * variants for the DeepSeek-V3 and the large ones. Uses the JIT cache ($MLAGEN_CACHE_DIR). Per family and
 * head dims (the model's specs that differ only in the head count are compiled once: H is
 * a constant of the address arithmetic), every configuration is rendered (the templates'
 * checks run on all) and a covering sample is compiled (kh_sweep_cover, drawn from the
 * test's seed, with the most shared memory): by default every value and every pair of
 * values for the DeepSeek-V3 heads, every single value for the other shapes and the varlen
 * variants; with MLAGEN_TEST_EXHAUSTIVE=1 (ctest -C exhaustive -L exhaustive) all of them
 * (one shape took 205 s with a cold cache on a loaded two-core machine; the three default
 * sweeps 118 s before this cut). One cmocka test per shape (m: 0, 1, 2). */
static void nvrtc_kept_configs(int m) {
  const char *models[] = {"deepseek-v3", NULL, NULL};
  const char *jsons[] = {NULL, unusual_json, large_json};
  kh_sweep sw;
  kh_sweep_open(&sw, 79, KH_SWEEP_SMEM | KH_SWEEP_REJECTS);
  int kept = 0;
  for (int varlen = 0; varlen <= (m != 1); varlen++) {
    sw.flags = KH_SWEEP_SMEM | KH_SWEEP_REJECTS | (m != 0 || varlen ? KH_SWEEP_SINGLES : 0);
    mg_shape shape;
    kh_load_shape(models[m], jsons[m], &shape);
    mg_kernel_spec specs[MG_SPEC_MAX_KERNELS];
    int n;
    assert_int_equal(mg_spec_for_model(&shape, 1, "bf16", specs, MG_SPEC_MAX_KERNELS, &n, &sw.d), 0);
    for (int i = 0; i < n; i++) {
      if (!specs[i].causal || strncmp(specs[i].family, "attn_bwd_", 9)) continue;
      int seen = 0; /* an earlier spec of the family with the same head dims */
      for (int j = 0; j < i && !seen; j++)
        seen = specs[j].causal && !strcmp(specs[j].family, specs[i].family) &&
               specs[j].d_n == specs[i].d_n && specs[j].d_r == specs[i].d_r && specs[j].d_v == specs[i].d_v;
      if (seen) continue;
      specs[i].varlen = varlen;
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
      static mg_kernel_spec cands[160];
      for (int ci = 0; ci < nc; ci++) {
        cands[ci] = specs[i];
        for (int j = 0; j < 7 && cfg[ci][j][0]; j++) set(&cands[ci], cfg[ci][j]);
      }
      kept += kh_sweep_cover(&sw, cands, nc, g_test_seed, "");
    }
  }
  print_message("  %d configurations kept, %d rejected by the templates' checks (%.0f s)\n", kept,
                sw.rejected, kh_now() - sw.t0);
  assert_true(kept >= 3);
  kh_sweep_close(&sw);
}
static void test_nvrtc_deepseek(void **state) { (void)state; nvrtc_kept_configs(0); }
static void test_nvrtc_unusual(void **state) { (void)state; nvrtc_kept_configs(1); }
static void test_nvrtc_large(void **state) { (void)state; nvrtc_kept_configs(2); }

/* Mutation tests (issue 12): a bug injected into the rendered attn_bwd_dkdv by a string
 * edit (kt_mutate_edit: the pattern must match exactly once) must fail the per-element
 * check on every shape it runs, for a numerical reason: the mutated kernel compiles,
 * launches and completes, writes no NaN, and its gradients are off. Shapes: those of
 * check_shape except S_k = 1 (one key: dS = 0, so dK = 0 and no mask can change). */
static kt_mutation g_bwd_mutations[] = {
    {"dV: a row near the end of the seen keys dropped",
     "mla::pack2<elem_t>(dvacc[d][2 * r], dvacc[d][2 * r + 1])", "M_(dvacc[d][2 * r], dvacc[d][2 * r + 1])",
     "#define LASTK_ ((CAUSAL ? min(seqlen_k, q_pos0 + seqlen_q) : seqlen_k) - 5)\n"
     "#define M_(a, b) mla::pack2<elem_t>(key == LASTK_ ? 0.f : (a), key == LASTK_ ? 0.f : (b))",
     ""},
    {"dK: 1% high on its first half of the columns",
     "const float x0 = softmax_scale * DK(d, 2 * r), x1 = softmax_scale * DK(d, 2 * r + 1);",
     "const float x0 = M_(DK(d, 2 * r)), x1 = M_(DK(d, 2 * r + 1));",
     "#define M_(x) (softmax_scale * (x) * (c < DQK / 2 ? 1.01f : 1.f))", ""},
    {"causal mask off by one in the last partial query tile",
     "qpos(qi), seqlen_k, 0) || qi >= seqlen_q) p = 0.f;", "qpos(M_), seqlen_k, 0) || qi >= seqlen_q) p = 0.f;",
     "#define M_ (qi + (m0 + BLOCK_M > seqlen_q))", ""},
};

/* The ld_k_rope mutation (below), run as part of test_mutations_caught. */
static void ld_k_rope_mutation_caught(void);

static void test_mutations_caught(void **state) {
  (void)state;
  static const int shapes[][4] = {{2, 77, 77, 0}, {1, 40, 100, 60}, {1, 70, 200, 130}, {1, 16, 200, 0}};
  kt_noise_quiet = 1; /* not noise: kt_noise_report leaves these out */
  for (size_t mi = 0; mi < sizeof g_bwd_mutations / sizeof g_bwd_mutations[0]; mi++) {
    kt_mutation *m = &g_bwd_mutations[mi];
    bwd_set bs;
    memset(&bs, 0, sizeof bs);
    mg_kernel_spec s = make_spec("attn_bwd_pre", 2, 64, 32, 64, 1);
    build(&s, &bs.pre);
    s = make_spec("attn_bwd_dkdv", 2, 64, 32, 64, 1); /* causal, atomic, split keys */
    /* the \n in define: two macro lines; kt_mutate_edit writes it as one block */
    if (!build_edit(&s, kt_mutate_edit, m, &bs.dkdv)) fail_msg("%s", m->error);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
      bwd_case c;
      case_init(&s, &c, 0, shapes[si][0], shapes[si][1], shapes[si][2], shapes[si][3]);
      run_pipeline(&bs, &c, NULL);
      double r[4];
      char msg[400];
      const size_t nans = compare(&bs, &c, r, msg, sizeof msg);
      print_message("  [%s] B=%d S_q=%d S_k=%d q_pos0=%d: %s\n", m->name, c.B, c.sq, c.sk,
                    c.q_pos0, msg[0] ? msg : "NOT CAUGHT");
      if (nans) fail_msg("%s: NaN outputs, not a numerical failure", m->name);
      if (!msg[0]) fail_msg("%s: passes the per-element check", m->name);
      case_free(&c);
    }
    set_unload(&bs);
  }
  kt_noise_quiet = 0;
  ld_k_rope_mutation_caught(); /* split keys: the row stride ignored */
}

/* attn_bwd_dkdv or attn_bwd_dq ignoring ld_k_rope (k_rope's token rows taken d_r apart,
 * the contiguous layout) fails on the wide k_rope (kt_rope_strided: it reads the NaN between
 * the rows, or other tokens' RoPE parts): the deterministic pipeline with one of its two
 * kernels mutated, causal, batch 2 of 77. */
static void ld_k_rope_mutation_caught(void) {
  kt_noise_quiet = 1;
  for (int fam = FAM_DKDV; fam <= FAM_DQ; fam++) {
    kt_mutation m = {fam == FAM_DKDV ? "attn_bwd_dkdv: ld_k_rope ignored" : "attn_bwd_dq: ld_k_rope ignored",
                     "k_rope, ld_k_rope)", "k_rope, DR)", NULL, ""};
    bwd_set bs;
    memset(&bs, 0, sizeof bs);
    bs.det = 1;
    mg_kernel_spec s = make_spec("attn_bwd_pre", 2, 64, 32, 64, 1);
    build(&s, &bs.pre);
    s = make_spec("attn_bwd_dkdv", 2, 64, 32, 64, 1);
    set(&s, "deterministic=1");
    if (!build_edit(&s, fam == FAM_DKDV ? kt_mutate_edit : NULL, &m, &bs.dkdv)) fail_msg("%s", m.error);
    s = make_spec("attn_bwd_dq", 2, 64, 32, 64, 1);
    if (!build_edit(&s, fam == FAM_DQ ? kt_mutate_edit : NULL, &m, &bs.dq)) fail_msg("%s", m.error);
    bwd_case c;
    case_init(&bs.dkdv.kh.spec, &c, 0, 2, 77, 77, 0);
    run_pipeline(&bs, &c, NULL);
    double r[4];
    char msg[400];
    const size_t nans = compare(&bs, &c, r, msg, sizeof msg);
    print_message("  [%s] %zu NaN outputs; %s\n", m.name, nans, msg[0] ? msg : "NOT CAUGHT");
    if (!nans && !msg[0]) fail_msg("%s: passes the per-element check", m.name);
    case_free(&c);
    set_unload(&bs);
  }
  kt_noise_quiet = 0;
}

/* The two-chunk queries of the all-gather context-parallel form (laga-cp; the cases of
 * kt_two_chunk_cases, a query tile straddling the chunks), DeepSeek heads: the atomic mode
 * causal and not, the deterministic one (attn_bwd_dq) causal, and dkdv with block_m 16
 * (causal: the query tiles before the first row that sees a key tile are skipped,
 * mla::QueryPos::first_row_at). */
static void test_two_chunk_positions(void **state) {
  (void)state;
  const kt_two_chunk *tc;
  const int n = kt_two_chunk_cases(&tc);
  static const int sets[][3] = {{0, 1, 0}, {0, 0, 0}, {1, 1, 0}, {0, 1, 16}}; /* det, causal, bm */
  for (size_t v = 0; v < sizeof sets / sizeof sets[0]; v++) {
    bwd_set bs;
    set_build_bm(&bs, 2, 128, 64, 128, sets[v][1], 0, sets[v][0], sets[v][2], 0);
    for (int i = 0; i < n; i++) {
      const kt_qpos pos = kt_qpos_lagacp(tc[i].P, tc[i].r, tc[i].a, tc[i].b);
      run_case_pos(&bs, 1, tc[i].a + tc[i].b, tc[i].P * (tc[i].a + tc[i].b), &pos);
    }
    set_unload(&bs);
  }
}

/* attn_bwd_dkdv (atomic mode: it computes dQ too) ignoring the second chunk (every row at
 * q_pos0 + i) fails the check on the two-chunk cases with a gap between the chunks (the
 * last rank's are adjacent, where that kernel is right). */
static void test_two_chunk_mutation_caught(void **state) {
  (void)state;
  kt_mutation m = {"second chunk ignored", "qpos{q_pos0, q_split, q_pos1}",
                   "qpos{q_pos0, BIG_, q_pos1}", "#define BIG_ 0x40000000", ""};
  kt_noise_quiet = 1;
  bwd_set bs;
  memset(&bs, 0, sizeof bs);
  mg_kernel_spec s = make_spec("attn_bwd_pre", 2, 64, 32, 64, 1);
  build(&s, &bs.pre);
  s = make_spec("attn_bwd_dkdv", 2, 64, 32, 64, 1);
  set(&s, "block_m=16");
  if (!build_edit(&s, kt_mutate_edit, &m, &bs.dkdv)) fail_msg("%s", m.error);
  const kt_two_chunk *tc;
  const int n = kt_two_chunk_cases(&tc);
  int runs = 0;
  for (int i = 0; i < n; i++) {
    const kt_qpos pos = kt_qpos_lagacp(tc[i].P, tc[i].r, tc[i].a, tc[i].b);
    if (pos.q_pos1 == pos.q_pos0 + pos.q_split) continue;
    runs++;
    bwd_case c;
    case_init_pos(&s, &c, 0, 1, tc[i].a + tc[i].b, tc[i].P * (tc[i].a + tc[i].b), &pos);
    run_pipeline(&bs, &c, NULL);
    double r[4];
    char msg[400];
    const size_t nans = compare(&bs, &c, r, msg, sizeof msg);
    print_message("  [%s] P=%d r=%d a=%d b=%d: %s\n", m.name, tc[i].P, tc[i].r, tc[i].a, tc[i].b,
                  msg[0] ? msg : "NOT CAUGHT");
    if (nans) fail_msg("%s: NaN outputs, not a numerical failure", m.name);
    if (!msg[0]) fail_msg("%s: passes the per-element check", m.name);
    case_free(&c);
  }
  assert_int_equal(runs, 3); /* the cases with a gap between the chunks */
  set_unload(&bs);
  kt_noise_quiet = 0;
}

/* ---- packed sequences (issue 16): the _varlen variants --------------------------------------- */

/* One varlen pipeline: the documents vl over KT_VARLEN_CAP keys, sq query rows at pos; in the
 * deterministic mode, attn_bwd_dq's key tiles per CTA are checked too. */
static void run_varlen(const bwd_set *bs, const kt_varlen *vl, int sq, const kt_qpos *pos) {
  bwd_case c;
  case_init_vl(&bs->dkdv.kh.spec, &c, bs->packed, 1, sq, KT_VARLEN_CAP, pos, vl);
  print_message("  documents \"%s\" (T %d of %d):\n", vl->name, vl->cu[vl->n], KT_VARLEN_CAP);
  const double secs = run_pipeline(bs, &c, NULL);
  if (bs->det && g_dq_tiles[0]) fail_msg("attn_bwd_dq: %s", g_dq_tiles);
  if (g_dkdv_tiles[0]) fail_msg("attn_bwd_dkdv: %s", g_dkdv_tiles);
  check(bs, &c, secs);
  case_free(&c);
}

/* The varlen pipelines (pre, dkdv, and dq in the deterministic mode) against the float64
 * per-document reference gradients, per element: the atomic mode causal and not (split
 * keys), the deterministic one causal (packed keys, dkdv block_m 16: several query tiles
 * per key tile, some skipped) and not; on the documents of kt_varlen_cases with queries at
 * 0 .. 299, and the many with laga-cp's two chunks at P = 2 (ranks 0 and 1, documents cut at
 * the chunk boundaries); then the DeepSeek heads on the many, causal, atomic. NaN fills
 * every slack row of q, k, v, dout, o and lse (and pre's delta there is NaN): slack query
 * rows get dq = 0, slack keys (seen by no query) dk = dv = 0, as the reference. */
static void test_varlen(void **state) {
  (void)state;
  const kt_varlen *vl;
  const int nvl = kt_varlen_cases(&vl);
  static const int sets[][4] = {{0, 1, 0, 0}, {0, 0, 0, 0}, {1, 1, 1, 16}, {1, 0, 0, 0}}; /* det, causal, packed, bm */
  for (size_t v = 0; v < sizeof sets / sizeof sets[0]; v++) {
    bwd_set bs;
    set_build_bm(&bs, 2, 64, 32, 64, sets[v][1], sets[v][2], sets[v][0], sets[v][3], 1);
    assert_non_null(strstr(bs.dkdv.kh.name, "_varlen"));
    for (int i = 0; i < nvl; i++) run_varlen(&bs, &vl[i], KT_VARLEN_CAP, &(kt_qpos){0, 0, 0});
    for (int r = 0; r < 2; r++) {
      const kt_qpos pos = kt_qpos_lagacp(2, r, 75, 75);
      run_varlen(&bs, &vl[0], 150, &pos);
    }
    set_unload(&bs);
  }
  bwd_set bs;
  set_build_bm(&bs, 2, 128, 64, 128, 1, 0, 0, 0, 1);
  run_varlen(&bs, &vl[0], KT_VARLEN_CAP, &(kt_qpos){0, 0, 0});
  set_unload(&bs);
}

/* Document boundaries off by one in the varlen kernels' masks fail the per-element check,
 * causal and not, with no NaN: attn_bwd_dkdv (atomic mode, so dq_accum is its too) letting
 * the query at the end of a key's range see it, attn_bwd_dq (deterministic mode) letting a
 * row see the key at its range's end. */
static kt_mutation g_bwd_varlen_mutations[] = {
    {"varlen dkdv: the query at a key's range end sees it", "pq >= qr_hi[e >> 1]) p = 0.f;",
     "pq > qr_hi[e >> 1]) p = 0.f;", NULL, ""},
    {"varlen dq: the key at a row's range end seen", "if (kr.hides(e >> 1,", "if (M_(e >> 1,",
     "#define M_(r, k) ((k) < kr.lo[r] || (k) > kr.hi[r])", ""},
    /* right per element: caught by the key tiles each CTA reads (causal only) */
    {"varlen dq: every key tile from 0, masked", "mla::varlen_key_tiles<CAUSAL, BLOCK_N>(vl, qpos, m0,",
     "mla::varlen_key_tiles<CAUSAL, BLOCK_N>(vl, qpos, 0,", NULL, ""},
    /* right per element: caught by the query tiles each CTA reads */
    {"varlen dkdv: every query tile from 0, masked",
     "const int r0 = qpos.first_row_at(plo), r1 = min(n_valid, qpos.first_row_at(phi));",
     "const int r0 = 0 * plo, r1 = n_valid + 0 * phi;", NULL, ""},
};

static void test_varlen_mutations_caught(void **state) {
  (void)state;
  const kt_varlen *vl;
  kt_varlen_cases(&vl);
  kt_noise_quiet = 1; /* not noise: kt_noise_report leaves these out */
  for (size_t mi = 0; mi < sizeof g_bwd_varlen_mutations / sizeof g_bwd_varlen_mutations[0]; mi++)
    for (int causal = 1; causal >= 0; causal--) {
      kt_mutation *m = &g_bwd_varlen_mutations[mi];
      const int is_dq = mi == 1 || mi == 2, all_tiles = mi >= 2;
      const char *tiles = mi == 3 ? g_dkdv_tiles : g_dq_tiles;
      if (mi == 2 && !causal) continue;
      bwd_set bs;
      memset(&bs, 0, sizeof bs);
      bs.det = is_dq;
      mg_kernel_spec s = make_spec("attn_bwd_pre", 2, 64, 32, 64, causal);
      s.varlen = 1;
      build(&s, &bs.pre);
      s = make_spec("attn_bwd_dkdv", 2, 64, 32, 64, causal);
      s.varlen = 1;
      if (is_dq) set(&s, "deterministic=1");
      if (is_dq) build(&s, &bs.dkdv);
      else if (!build_edit(&s, kt_mutate_edit, m, &bs.dkdv)) fail_msg("%s", m->error);
      if (is_dq) {
        s = make_spec("attn_bwd_dq", 2, 64, 32, 64, causal);
        s.varlen = 1;
        if (!build_edit(&s, kt_mutate_edit, m, &bs.dq)) fail_msg("%s", m->error);
      }
      bwd_case c;
      case_init_vl(&bs.dkdv.kh.spec, &c, 0, 1, KT_VARLEN_CAP, KT_VARLEN_CAP, &(kt_qpos){0, 0, 0}, &vl[0]);
      run_pipeline(&bs, &c, NULL);
      double r[4];
      char msg[400];
      const size_t nans = compare(&bs, &c, r, msg, sizeof msg);
      if (all_tiles) {
        print_message("  [%s] %s: per element %s; %s\n", m->name, causal ? "causal" : "full",
                      nans || msg[0] ? "FAILS" : "passes", tiles[0] ? tiles : "tiles NOT CAUGHT");
        if (nans || msg[0]) fail_msg("%s: fails the per-element check (%s)", m->name, msg);
        if (!tiles[0]) fail_msg("%s: its tiles pass the hull check", m->name);
        case_free(&c);
        set_unload(&bs);
        continue;
      }
      if (is_dq && g_dq_tiles[0]) fail_msg("%s: %s", m->name, g_dq_tiles);
      if (g_dkdv_tiles[0]) fail_msg("%s: %s", m->name, g_dkdv_tiles);
      print_message("  [%s] %s: %s\n", m->name, causal ? "causal" : "full", msg[0] ? msg : "NOT CAUGHT");
      if (nans) fail_msg("%s: NaN outputs, not a numerical failure", m->name);
      if (!msg[0]) fail_msg("%s: passes the per-element check", m->name);
      case_free(&c);
      set_unload(&bs);
    }
  kt_noise_quiet = 0;
}

/* The reference itself: its gradients are those of L = sum(dout * o) by central finite
 * differences (every element of q, k and v, a small causal case with a query shard and a
 * row without keys, and a non-causal one), and its lse is log sum exp of the scores. */
static void test_reference_finite_differences(void **state) {
  (void)state;
  for (int causal = 1; causal >= 0; causal--) {
    /* causal: q_pos0 -1, so row 0 sees no key */
    const attn_ref_dims d = {2, 3, 4, 2, 5, 3, causal, causal ? -1 : 0, 0.7, 0, 0};
    const size_t nq = (size_t)d.B * d.S_q * d.H * d.d_qk, nk = (size_t)d.B * d.S_k * d.H * d.d_qk;
    const size_t nv = (size_t)d.B * d.S_k * d.H * d.d_v, no = (size_t)d.B * d.S_q * d.H * d.d_v;
    const size_t nl = (size_t)d.B * d.H * d.S_q;
    double *x = xcalloc(nq + nk + nv, sizeof *x), *dout = xcalloc(no, sizeof *dout);
    double *g = xcalloc(nq + nk + nv, sizeof *g), *o = xcalloc(no, sizeof *o), *o2 = xcalloc(no, sizeof *o);
    double *lse = xcalloc(nl, sizeof *lse), *lse2 = xcalloc(nl, sizeof *lse);
    for (size_t i = 0; i < nq + nk + nv; i++) x[i] = randn();
    for (size_t i = 0; i < no; i++) dout[i] = randn();
    double *q = x, *k = x + nq, *v = x + nq + nk;
    attn_ref_bwd(&d, q, k, v, dout, g, g + nq, g + nq + nk, o, lse, NULL);
    attn_ref_fwd(&d, q, k, v, o2, lse2);
    for (size_t i = 0; i < no; i++) assert_true(o[i] == o2[i]);
    for (size_t i = 0; i < nl; i++) assert_true(lse[i] == lse2[i]);
    double worst = 0;
    for (size_t i = 0; i < nq + nk + nv; i++) {
      const double h = 1e-5, x0 = x[i];
      double l[2];
      for (int sgn = 0; sgn < 2; sgn++) {
        x[i] = x0 + (sgn ? -h : h);
        attn_ref_fwd(&d, q, k, v, o2, lse2);
        l[sgn] = 0;
        for (size_t j = 0; j < no; j++) l[sgn] += dout[j] * o2[j];
      }
      x[i] = x0;
      const double fd = (l[0] - l[1]) / (2 * h), e = fabs(fd - g[i]) / (1 + fabs(g[i]));
      if (e > worst) worst = e;
    }
    /* lse by hand for the last row of batch 1, head 1 */
    const int b = 1, h = 1, i = d.S_q - 1;
    double m = 0;
    for (int j = 0; j < d.S_k && (!causal || j <= d.q_pos0 + i); j++) {
      double sdot = 0;
      for (int e = 0; e < d.d_qk; e++)
        sdot += q[(((size_t)b * d.S_q + i) * d.H + h) * d.d_qk + e] *
                k[(((size_t)b * d.S_k + j) * d.H + h) * d.d_qk + e];
      m += exp(sdot * d.scale);
    }
    const double lse_err = fabs(log(m) - lse[((size_t)b * d.H + h) * d.S_q + i]);
    print_message("  %s: max |fd - grad| / (1 + |grad|) %.2e, lse err %.1e%s\n",
                  causal ? "causal, q_pos0 -1" : "full", worst, lse_err,
                  causal ? ", row 0 lse -inf" : "");
    assert_true(worst < 1e-7);
    assert_true(lse_err < 1e-12);
    if (causal) assert_true(lse[0] == -INFINITY && o[0] == 0);
    free(x), free(dout), free(g), free(o), free(o2), free(lse), free(lse2);
  }
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
  /* the varlen pipeline, deterministic (pre, dkdv, dq), laga-cp rank 0 */
  const kt_varlen *vl;
  kt_varlen_cases(&vl);
  bwd_set bs;
  set_build_bm(&bs, 2, 64, 32, 64, 1, 0, 1, 0, 1);
  const kt_qpos pos = kt_qpos_lagacp(2, 0, 75, 75);
  run_varlen(&bs, &vl[0], 150, &pos);
  set_unload(&bs);
}

static void test_asan(void **state) {
  (void)state;
  kh_run_asan_child("test_attn_bwd", g_test_seed, asan_case_run);
}

/* Every test starts from the file's flags at their defaults (0), as under ctest's one test
 * per process: a test that fails (cmocka longjmps out of it) leaves no flag set for the next
 * one in a direct run of the binary. */
static int fresh_flags(void **state) {
  (void)state;
  g_kr_contig = 0; g_poison_last = 0;
  return 0;
}

int main(int argc, char **argv) {
  kt_seed_init();
  const int rc = kh_test_main(argc, argv, asan_case_run);
  if (rc >= 0) return rc;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_reference_finite_differences, fresh_flags),
      cmocka_unit_test_setup(test_deepseek_heads, fresh_flags),
      cmocka_unit_test_setup(test_unusual_heads, fresh_flags),
      cmocka_unit_test_setup(test_large_heads, fresh_flags),
      cmocka_unit_test_setup(test_deterministic_bit_identical, fresh_flags),
      cmocka_unit_test_setup(test_configs, fresh_flags),
      cmocka_unit_test_setup(test_missing_barrier_caught, fresh_flags),
      cmocka_unit_test_setup(test_fp16, fresh_flags),
      cmocka_unit_test_setup(test_nvrtc_deepseek, fresh_flags),
      cmocka_unit_test_setup(test_nvrtc_unusual, fresh_flags),
      cmocka_unit_test_setup(test_nvrtc_large, fresh_flags),
      cmocka_unit_test_setup(test_mutations_caught, fresh_flags),
      cmocka_unit_test_setup(test_two_chunk_positions, fresh_flags),
      cmocka_unit_test_setup(test_two_chunk_mutation_caught, fresh_flags),
      cmocka_unit_test_setup(test_varlen, fresh_flags),
      cmocka_unit_test_setup(test_varlen_mutations_caught, fresh_flags),
      cmocka_unit_test_setup(test_asan, fresh_flags),
  };
  return kh_exit_code(cmocka_run_group_tests(tests, NULL, kt_noise_teardown));
}
