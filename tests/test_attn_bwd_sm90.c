/* test_attn_bwd_sm90.c: the Hopper attention backward (templates/attn_bwd_dkdv_sm90.cu.tpl:
 * dK and dV, and with deterministic = 0 dQ into dq_accum by atomics; attn_bwd_dq_sm90.cu.tpl:
 * the deterministic dQ; TMA rings on mbarriers, wgmma, a producer warpgroup) run unchanged on
 * the CPU through the host executor's sm_90a emulation (tests/host/hopper_host.cpp), against
 * the float64 reference of tests/attn_ref.h per element with tolerances of test_attn_bwd.c's
 * form sized from these kernels' measured noise (dq, dq_accum, dk_nope / packed dk,
 * dk_rope, dv; flipped 16-bit roundings of P and dS included), both values of the kernels'
 * `overlap`; every kept configuration compiled by NVRTC for sm_90a without spills and with
 * no wgmma serialized by ptxas; and bugs injected into the rendered source (each mbarrier
 * wait and arrival, each wgmma wait, the proxy fence) must fail the check or be reported by
 * the executor. The packed-sequence variants ("_varlen") against the same
 * reference per document (attn_ref.h through reference_one), NaN in every slack row, and wrong
 * boundaries caught. Split keys read k_rope at column KT_ROPE_COL of NaN-filled rows through
 * tmaps[2] with the row stride ld_k_rope (one contiguous case per family); a map ignoring it
 * is caught.
 *
 * The tensor maps come from the runtime's mg_sm90_bwd_tmaps (runtime/exec/mg_sm90_tmap.h)
 * through the fake driver (tests/fake_cuda.c); delta = rowsum(dO * O) is computed here (in
 * double, stored as fp32, as attn_bwd_pre's). Inputs: random bf16 (fp16 in one case), scores
 * with standard deviation 2 under DeepSeek's YaRN softmax scale (the seed is printed,
 * MLAGEN_TEST_SEED overrides it). */
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
#include "mg_sm90_tmap.h"
#include "sm90_test_util.h"

/* the kernels' `const __grid_constant__ mla::sm90::TensorMaps<5> tmaps`, passed by value */
typedef struct { tmap_t m[5]; } tmaps5_t;
typedef void (*dkdv_fn)(const e16 *q, const e16 *k_nope, const e16 *k_rope, const e16 *v,
                        const e16 *dout, const float *lse, const float *delta, float *dq_accum,
                        e16 *dk_nope, float *dk_rope, e16 *dv, int seqlen_q, int seqlen_k,
                        int q_pos0, int q_split, int q_pos1, float softmax_scale,
                        tmaps5_t tmaps);
typedef void (*dq_fn)(const e16 *q, const e16 *k_nope, const e16 *k_rope, const e16 *v,
                      const e16 *dout, const float *lse, const float *delta, e16 *dq,
                      int seqlen_q, int seqlen_k, int q_pos0, int q_split, int q_pos1,
                      float softmax_scale, tmaps5_t tmaps);
/* split keys (k_packed = 0): k_rope's row stride ld_k_rope after k_rope (the kernels read
 * k_rope through tmaps[2], whose row stride it is) */
typedef void (*dkdv_split_fn)(const e16 *q, const e16 *k_nope, const e16 *k_rope, int ld_k_rope,
                              const e16 *v, const e16 *dout, const float *lse, const float *delta,
                              float *dq_accum, e16 *dk_nope, float *dk_rope, e16 *dv,
                              int seqlen_q, int seqlen_k, int q_pos0, int q_split, int q_pos1,
                              float softmax_scale, tmaps5_t tmaps);
typedef void (*dq_split_fn)(const e16 *q, const e16 *k_nope, const e16 *k_rope, int ld_k_rope,
                            const e16 *v, const e16 *dout, const float *lse, const float *delta,
                            e16 *dq, int seqlen_q, int seqlen_k, int q_pos0, int q_split,
                            int q_pos1, float softmax_scale, tmaps5_t tmaps);
typedef void (*dkdv_split_varlen_fn)(const e16 *q, const e16 *k_nope, const e16 *k_rope,
                                     int ld_k_rope, const e16 *v, const e16 *dout,
                                     const float *lse, const float *delta, float *dq_accum,
                                     e16 *dk_nope, float *dk_rope, e16 *dv, int seqlen_q,
                                     int seqlen_k, int q_pos0, int q_split, int q_pos1,
                                     float softmax_scale, tmaps5_t tmaps, const int *cu_seqlens,
                                     int n_seqs);
typedef void (*dq_split_varlen_fn)(const e16 *q, const e16 *k_nope, const e16 *k_rope,
                                   int ld_k_rope, const e16 *v, const e16 *dout, const float *lse,
                                   const float *delta, e16 *dq, int seqlen_q, int seqlen_k,
                                   int q_pos0, int q_split, int q_pos1, float softmax_scale,
                                   tmaps5_t tmaps, const int *cu_seqlens, int n_seqs);
/* the packed-sequence variants (spec.varlen): the same, then cu_seqlens and n_seqs */
typedef void (*dkdv_varlen_fn)(const e16 *q, const e16 *k_nope, const e16 *k_rope, const e16 *v,
                               const e16 *dout, const float *lse, const float *delta,
                               float *dq_accum, e16 *dk_nope, float *dk_rope, e16 *dv,
                               int seqlen_q, int seqlen_k, int q_pos0, int q_split, int q_pos1,
                               float softmax_scale, tmaps5_t tmaps, const int *cu_seqlens,
                               int n_seqs);
typedef void (*dq_varlen_fn)(const e16 *q, const e16 *k_nope, const e16 *k_rope, const e16 *v,
                             const e16 *dout, const float *lse, const float *delta, e16 *dq,
                             int seqlen_q, int seqlen_k, int q_pos0, int q_split, int q_pos1,
                             float softmax_scale, tmaps5_t tmaps, const int *cu_seqlens,
                             int n_seqs);

typedef struct built_kernel {
  kh_kernel kh;
  int is_dq; /* attn_bwd_dq_sm90, else attn_bwd_dkdv_sm90 */
  int packed;
  int atomic; /* attn_bwd_dkdv_sm90 with deterministic = 0: dQ into dq_accum, dk_rope added */
} built_kernel;

static int is_fp16(const mg_kernel_spec *s) { return strcmp(s->dtype, "fp16") == 0; }
static float e_to_float(const mg_kernel_spec *s, e16 x) { return e16_to_float(is_fp16(s), x); }
static e16 float_to_e(const mg_kernel_spec *s, float x) { return float_to_e16(is_fp16(s), x); }

/* Builds spec into out with the first occurrence of `blank` (when not NULL) blanked. */
static void build_edit(const mg_kernel_spec *spec, const char *blank, built_kernel *out) {
  memset(out, 0, sizeof *out);
  const sm90_edit e = {blank, ""};
  sm90_build(spec, blank ? &e : NULL, &out->kh);
  out->packed = kh_config_int(&out->kh, "k_packed");
  out->is_dq = !strcmp(spec->family, "attn_bwd_dq_sm90");
  out->atomic = !out->is_dq && kh_config_int(&out->kh, "deterministic") == 0;
  const int rows = kh_config_int(&out->kh, out->is_dq ? "block_m" : "block_n");
  assert_int_equal(out->kh.threads, 128 * (rows / 64 + 1));
  assert_int_equal(kh_launch_value(&out->kh, "smem_static"), 0);
}

static const char *const FAMS[2] = {"attn_bwd_dkdv_sm90", "attn_bwd_dq_sm90"};
static mg_kernel_spec make_spec(int dq, int H, int dn, int dr, int dv, int causal) {
  mg_kernel_spec s;
  memset(&s, 0, sizeof s);
  snprintf(s.family, sizeof s.family, "%s", FAMS[dq]);
  s.heads = H, s.d_n = dn, s.d_r = dr, s.d_v = dv, s.d_c = 512, s.causal = causal;
  snprintf(s.dtype, sizeof s.dtype, "bf16");
  return s;
}

/* One case: inputs, the reference gradients and their flip bounds, the kernel's outputs.
 * Query row i sits at q_pos0 + i for i < q_split, else at q_pos1 + (i - q_split) (the
 * position contract of COMMON.md / mg_plan.h). Split keys: kr [B, S_k, d_r], which the
 * kernels read from kr_buf (kt_rope_strided: at column KT_ROPE_COL of NaN-filled rows, or
 * contiguous when g_kr_contig), tmaps[2] with its row stride (or, map_ld_dr, with d_r: a
 * map that ignores ld_k_rope, for the mutation test). */
typedef struct bwd_case {
  int B, sq, sk, q_pos0, q_split, q_pos1;
  float scale;
  e16 *q, *kn, *kr, *v, *dout, *o16;
  float *lse32, *delta;
  size_t nq, nkn, nkr, nv, no, nl;
  double *r_dq, *r_dkn, *r_dkr, *r_dv, *f_dq, *f_dkn, *f_dkr, *f_dv;
  e16 *dq, *dkn, *dv;
  float *dkr, *dq_accum;
  tmap_t *tmaps; /* [5] */
  const int *cu; /* packed sequences: cu_seqlens [n_cu + 1] (batch 1), else NULL */
  int n_cu;
  e16 *kr_buf;
  const e16 *kr_arg;
  int ld_kr, map_ld_dr;
} bwd_case;

/* The k_rope layout of the split-key cases case_init_cu makes: 0 (wide, NaN around each
 * row) but for one case of test_wide_heads. */
static int g_kr_contig;

/* 1: case_init_cu fills every input of the last batch item (q, k_nope, k_rope, v, dout, lse,
 * delta) with NaN after the reference is made, and compare checks the items before it only:
 * their tiles' rows past an item's end must not bring the next item's values in (TMA's
 * batch dim: zero fill, not the next item's rows). */
static int g_poison_last;

static void *xcalloc(size_t n, size_t sz) { return calloc(n ? n : 1, sz); }

#define FLIP_EPS 3e-5 /* test_attn_bwd.c's: the kernels' own fp32 error in P or dS */

/* test_attn_bwd.c's reference: the float64 forward (o rounded to 16 bits, lse to fp32),
 * then the gradients with P and dS rounded to 16 bits and their flip bounds (attn_ref.h);
 * split keys: dk_rope is dK's RoPE columns summed over the heads. Also delta. Packed (c->cu:
 * attn_ref.h's per-document rule at the positions of q_pos0, q_split, q_pos1): rows without
 * keys (slack) get o 0, dq 0, and LSE and delta NaN (inputs the kernels must not read); keys
 * no query sees dk = dv = 0. */
static void reference_one(const mg_kernel_spec *s, bwd_case *c, int packed) {
  const int H = s->heads, dn = s->d_n, dr = s->d_r, dqk = dn + dr, f16 = is_fp16(s);
  const attn_ref_dims d = {c->B,     c->sq,     c->sk,    H, dqk, s->d_v, s->causal, c->q_pos0,
                           c->scale, c->cu ? c->q_split : 0, c->q_pos1};
  const attn_ref_docs docs = {c->cu, c->n_cu}, *dp = c->cu ? &docs : NULL;
  const size_t nk = (size_t)c->B * c->sk * H;
  double *q = kt_e16_to_d(f16, c->q, c->nq), *v = kt_e16_to_d(f16, c->v, c->nv);
  double *dout = kt_e16_to_d(f16, c->dout, c->no);
  double *k = kt_k_to_d(f16, packed, c->kn, c->kr, nk, H, dn, dr);
  double *dk = xcalloc(nk * dqk, sizeof *dk), *fdk = xcalloc(nk * dqk, sizeof *fdk);
  double *o = xcalloc(c->no, sizeof *o), *lse = xcalloc(c->nl, sizeof *lse);
  attn_ref_fwd_docs(&d, dp, q, k, v, o, lse);
  for (size_t i = 0; i < c->no; i++) c->o16[i] = float_to_e(s, (float)o[i]);
  for (size_t i = 0; i < c->nl; i++) c->lse32[i] = (float)lse[i];
  for (size_t i = 0; i < c->no; i++) o[i] = e_to_float(s, c->o16[i]);
  for (size_t i = 0; i < c->nl; i++) lse[i] = c->lse32[i];
  for (int b = 0; b < c->B; b++)
    for (int i = 0; i < c->sq; i++)
      for (int h = 0; h < H; h++) {
        const size_t row = ((size_t)b * c->sq + i) * H + h;
        double acc = 0;
        for (int e = 0; e < s->d_v; e++)
          acc += o[row * s->d_v + e] * e_to_float(s, c->dout[row * s->d_v + e]);
        c->delta[((size_t)b * H + h) * c->sq + i] = (float)acc;
      }
  const attn_ref_mixed mx = {o, lse, kt_round_fn(f16), FLIP_EPS, c->f_dq, fdk, c->f_dv};
  attn_ref_bwd_docs(&d, dp, q, k, v, dout, c->r_dq, dk, c->r_dv, NULL, NULL, &mx);
  if (c->cu)
    for (size_t i = 0; i < c->nl; i++)
      if (lse[i] == -INFINITY) c->lse32[i] = c->delta[i] = NAN;
  for (size_t t = 0; t < nk; t++)
    for (int e = 0; e < dqk; e++)
      if (packed) {
        c->r_dkn[t * dqk + e] = dk[t * dqk + e];
        c->f_dkn[t * dqk + e] = fdk[t * dqk + e];
      } else if (e < dn) {
        c->r_dkn[t * dn + e] = dk[t * dqk + e];
        c->f_dkn[t * dn + e] = fdk[t * dqk + e];
      } else {
        c->r_dkr[t / H * dr + e - dn] += dk[t * dqk + e];
        c->f_dkr[t / H * dr + e - dn] += fdk[t * dqk + e];
      }
  free(q), free(v), free(dout), free(k), free(dk), free(fdk), free(o), free(lse);
}

/* The reference of a two-chunk case: each chunk's rows are an independent query set (their
 * own positions), so o, lse, delta and dq come from the chunk's reference, and dk, dk_rope,
 * dv (and their flip bounds) are the sums of the chunks'. */
static void reference(const mg_kernel_spec *s, bwd_case *c, int packed) {
  const int split = c->q_split < 0 ? 0 : c->q_split > c->sq ? c->sq : c->q_split;
  if (split == c->sq || split == 0) {
    const int keep = c->q_pos0;
    if (split == 0) c->q_pos0 = c->q_pos1;
    reference_one(s, c, packed);
    c->q_pos0 = keep;
    return;
  }
  const int H = s->heads, dqk = s->d_n + s->d_r, dv = s->d_v;
  for (int ch = 0; ch < 2; ch++) {
    const int r0 = ch ? split : 0, n = ch ? c->sq - split : split;
    bwd_case u = *c;
    u.sq = n, u.q_pos0 = ch ? c->q_pos1 : c->q_pos0, u.q_split = n;
    u.nq = (size_t)c->B * n * H * dqk, u.no = (size_t)c->B * n * H * dv, u.nl = (size_t)c->B * H * n;
    u.q = xcalloc(u.nq, sizeof(e16)), u.dout = xcalloc(u.no, sizeof(e16));
    for (int b = 0; b < c->B; b++) {
      memcpy(u.q + (size_t)b * n * H * dqk, c->q + ((size_t)b * c->sq + r0) * H * dqk, (size_t)n * H * dqk * sizeof(e16));
      memcpy(u.dout + (size_t)b * n * H * dv, c->dout + ((size_t)b * c->sq + r0) * H * dv, (size_t)n * H * dv * sizeof(e16));
    }
    u.o16 = xcalloc(u.no, sizeof(e16)), u.lse32 = xcalloc(u.nl, sizeof(float)), u.delta = xcalloc(u.nl, sizeof(float));
    u.r_dq = xcalloc(u.nq, sizeof(double)), u.f_dq = xcalloc(u.nq, sizeof(double));
    u.r_dkn = xcalloc(c->nkn, sizeof(double)), u.f_dkn = xcalloc(c->nkn, sizeof(double));
    u.r_dkr = xcalloc(c->nkr, sizeof(double)), u.f_dkr = xcalloc(c->nkr, sizeof(double));
    u.r_dv = xcalloc(c->nv, sizeof(double)), u.f_dv = xcalloc(c->nv, sizeof(double));
    reference_one(s, &u, packed);
    for (int b = 0; b < c->B; b++) {
      const size_t src = (size_t)b * n * H, dst = ((size_t)b * c->sq + r0) * H;
      memcpy(c->o16 + dst * dv, u.o16 + src * dv, (size_t)n * H * dv * sizeof(e16));
      memcpy(c->r_dq + dst * dqk, u.r_dq + src * dqk, (size_t)n * H * dqk * sizeof(double));
      memcpy(c->f_dq + dst * dqk, u.f_dq + src * dqk, (size_t)n * H * dqk * sizeof(double));
      for (int h = 0; h < H; h++) {
        const size_t ls = ((size_t)b * H + h) * n, ld = ((size_t)b * H + h) * c->sq + r0;
        memcpy(c->lse32 + ld, u.lse32 + ls, (size_t)n * sizeof(float));
        memcpy(c->delta + ld, u.delta + ls, (size_t)n * sizeof(float));
      }
    }
    for (size_t i = 0; i < c->nkn; i++) c->r_dkn[i] += u.r_dkn[i], c->f_dkn[i] += u.f_dkn[i];
    for (size_t i = 0; i < c->nkr; i++) c->r_dkr[i] += u.r_dkr[i], c->f_dkr[i] += u.f_dkr[i];
    for (size_t i = 0; i < c->nv; i++) c->r_dv[i] += u.r_dv[i], c->f_dv[i] += u.f_dv[i];
    free(u.q), free(u.dout), free(u.o16), free(u.lse32), free(u.delta), free(u.r_dq), free(u.f_dq);
    free(u.r_dkn), free(u.f_dkn), free(u.r_dkr), free(u.f_dkr), free(u.r_dv), free(u.f_dv);
  }
}

static void encode_maps(const built_kernel *bk, bwd_case *c) {
  const mg_driver *drv;
  mg_kernel_info info;
  sm90_driver_info(&bk->kh, &drv, &info);
  mg_diag d = MG_DIAG_INIT;
  const mg_sm90_bwd_tensors t = {(CUdeviceptr)(uintptr_t)c->q,  (CUdeviceptr)(uintptr_t)c->kn,
                                 (CUdeviceptr)(uintptr_t)c->kr_arg, (CUdeviceptr)(uintptr_t)c->v,
                                 (CUdeviceptr)(uintptr_t)c->dout, c->B, c->sq, c->sk,
                                 c->map_ld_dr ? 0 : c->ld_kr};
  if (mg_sm90_bwd_tmaps(drv, &bk->kh.spec, &info, &t, (CUtensorMap *)c->tmaps, &d))
    fail_msg("mg_sm90_bwd_tmaps: %s", mg_diag_msg(&d));
}

/* A case; cu (n_cu documents; NULL: not packed) makes it a packed one (B must be 1) with
 * NaN in every slack row (position >= cu[n_cu]) of q, dout, k_nope, k_rope and v. */
static void case_init_cu(const built_kernel *bk, bwd_case *c, int B, int sq, int sk, int q_pos0,
                         int q_split, int q_pos1, const int *cu, int n_cu) {
  const mg_kernel_spec *s = &bk->kh.spec;
  const int H = s->heads, dqk = s->d_n + s->d_r, f16 = is_fp16(s), packed = bk->packed;
  memset(c, 0, sizeof *c);
  c->B = B, c->sq = sq, c->sk = sk, c->q_pos0 = q_pos0, c->q_split = q_split, c->q_pos1 = q_pos1;
  c->scale = (float)kt_softmax_scale(dqk);
  c->nq = (size_t)B * sq * H * dqk;
  c->nkn = (size_t)B * sk * H * (packed ? dqk : s->d_n);
  c->nkr = packed ? 0 : (size_t)B * sk * s->d_r;
  c->nv = (size_t)B * sk * H * s->d_v;
  c->no = (size_t)B * sq * H * s->d_v;
  c->nl = (size_t)B * H * sq;
  c->q = kt_rand_e16_sd(f16, c->nq, kt_q_sd(c->scale, dqk));
  c->kn = kt_rand_e16_sd(f16, c->nkn, 1);
  c->kr = packed ? NULL : kt_rand_e16_sd(f16, c->nkr, 1);
  c->v = kt_rand_e16_sd(f16, c->nv, 1);
  c->dout = kt_rand_e16_sd(f16, c->no, 1);
  c->o16 = xcalloc(c->no, sizeof *c->o16);
  c->lse32 = xcalloc(c->nl, sizeof *c->lse32);
  c->delta = xcalloc(c->nl, sizeof *c->delta);
  c->r_dq = xcalloc(c->nq, sizeof(double)), c->f_dq = xcalloc(c->nq, sizeof(double));
  c->dq = xcalloc(c->nq, sizeof(e16));
  c->dq_accum = xcalloc(c->nq, sizeof(float));
  c->r_dkn = xcalloc(c->nkn, sizeof(double)), c->f_dkn = xcalloc(c->nkn, sizeof(double));
  c->r_dkr = xcalloc(c->nkr, sizeof(double)), c->f_dkr = xcalloc(c->nkr, sizeof(double));
  c->r_dv = xcalloc(c->nv, sizeof(double)), c->f_dv = xcalloc(c->nv, sizeof(double));
  c->dkn = xcalloc(c->nkn, sizeof(e16));
  c->dkr = xcalloc(c->nkr, sizeof(float));
  c->dv = xcalloc(c->nv, sizeof(e16));
  c->tmaps = aligned_alloc(64, 5 * sizeof(tmap_t));
  memset(c->tmaps, 0, 5 * sizeof(tmap_t));
  c->cu = cu, c->n_cu = n_cu;
  if (cu) {
    const int T = cu[n_cu];
    const kt_qpos pos = {q_pos0, q_split, q_pos1};
    kt_nan_slack_e16(c->q, sq, (size_t)H * dqk, &pos, T);
    kt_nan_slack_e16(c->dout, sq, (size_t)H * s->d_v, &pos, T);
    kt_nan_slack_e16(c->kn, sk, c->nkn / (size_t)sk, NULL, T);
    if (c->kr) kt_nan_slack_e16(c->kr, sk, (size_t)s->d_r, NULL, T);
    kt_nan_slack_e16(c->v, sk, (size_t)H * s->d_v, NULL, T);
    reference_one(s, c, packed);
  } else {
    reference(s, c, packed);
  }
  if (g_poison_last) {
    kt_nan_last_item_e16(c->q, c->nq, B), kt_nan_last_item_e16(c->kn, c->nkn, B);
    kt_nan_last_item_e16(c->kr, c->nkr, B), kt_nan_last_item_e16(c->v, c->nv, B);
    kt_nan_last_item_e16(c->dout, c->no, B);
    kt_nan_last_item_f32(c->lse32, c->nl, B), kt_nan_last_item_f32(c->delta, c->nl, B);
  }
  c->kr_buf = kt_rope_strided(c->kr, (size_t)B * sk, s->d_r, !g_kr_contig, &c->kr_arg, &c->ld_kr);
  encode_maps(bk, c);
}
static void case_init(const built_kernel *bk, bwd_case *c, int B, int sq, int sk, int q_pos0,
                      int q_split, int q_pos1) {
  case_init_cu(bk, c, B, sq, sk, q_pos0, q_split, q_pos1, NULL, 0);
}

static void case_free(bwd_case *c) {
  free(c->q), free(c->kn), free(c->kr), free(c->v), free(c->dout), free(c->o16), free(c->lse32);
  free(c->delta), free(c->r_dkn), free(c->f_dkn), free(c->r_dkr), free(c->f_dkr), free(c->r_dv);
  free(c->f_dv), free(c->r_dq), free(c->f_dq), free(c->dq), free(c->dq_accum), free(c->dkn), free(c->dkr), free(c->dv), free(c->tmaps);
  free(c->kr_buf);
}

typedef struct launch_args {
  const built_kernel *bk;
  bwd_case *c;
} launch_args;

static void thunk(void *p) {
  launch_args *a = p;
  bwd_case *c = a->c;
  const int p0 = c->q_pos0, split = c->q_split, p1 = c->q_pos1;
  if (c->kr) { /* split keys: ld_k_rope after k_rope */
    const tmaps5_t *tm = (const tmaps5_t *)c->tmaps;
    float *dqa = a->bk->atomic ? c->dq_accum : NULL;
    if (c->cu && a->bk->is_dq)
      ((dq_split_varlen_fn)a->bk->kh.fn)(c->q, c->kn, c->kr_arg, c->ld_kr, c->v, c->dout,
                                         c->lse32, c->delta, c->dq, c->sq, c->sk, p0, split, p1,
                                         c->scale, *tm, c->cu, c->n_cu);
    else if (c->cu)
      ((dkdv_split_varlen_fn)a->bk->kh.fn)(c->q, c->kn, c->kr_arg, c->ld_kr, c->v, c->dout,
                                           c->lse32, c->delta, NULL, c->dkn, c->dkr, c->dv, c->sq,
                                           c->sk, p0, split, p1, c->scale, *tm, c->cu, c->n_cu);
    else if (a->bk->is_dq)
      ((dq_split_fn)a->bk->kh.fn)(c->q, c->kn, c->kr_arg, c->ld_kr, c->v, c->dout, c->lse32,
                                  c->delta, c->dq, c->sq, c->sk, p0, split, p1, c->scale, *tm);
    else
      ((dkdv_split_fn)a->bk->kh.fn)(c->q, c->kn, c->kr_arg, c->ld_kr, c->v, c->dout, c->lse32,
                                    c->delta, dqa, c->dkn, c->dkr, c->dv, c->sq, c->sk, p0,
                                    split, p1, c->scale, *tm);
    return;
  }
  if (c->cu && a->bk->is_dq)
    ((dq_varlen_fn)a->bk->kh.fn)(c->q, c->kn, c->kr, c->v, c->dout, c->lse32, c->delta, c->dq,
                                 c->sq, c->sk, p0, split, p1, c->scale,
                                 *(const tmaps5_t *)c->tmaps, c->cu, c->n_cu);
  else if (c->cu)
    ((dkdv_varlen_fn)a->bk->kh.fn)(c->q, c->kn, c->kr, c->v, c->dout, c->lse32, c->delta, NULL,
                                   c->dkn, c->kr ? c->dkr : NULL, c->dv, c->sq, c->sk, p0, split,
                                   p1, c->scale, *(const tmaps5_t *)c->tmaps, c->cu, c->n_cu);
  else if (a->bk->is_dq)
    ((dq_fn)a->bk->kh.fn)(c->q, c->kn, c->kr, c->v, c->dout, c->lse32, c->delta, c->dq, c->sq,
                          c->sk, p0, split, p1, c->scale, *(const tmaps5_t *)c->tmaps);
  else
    ((dkdv_fn)a->bk->kh.fn)(c->q, c->kn, c->kr, c->v, c->dout, c->lse32, c->delta,
                            a->bk->atomic ? c->dq_accum : NULL, c->dkn,
                            c->kr ? c->dkr : NULL, c->dv, c->sq, c->sk, p0, split, p1, c->scale,
                            *(const tmaps5_t *)c->tmaps);
}

/* Launches (outputs NaN first) on the executor's default (shuffled) schedule with sm_90's
 * shared-memory limit; returns the launch's message in msg (0: it ran). */
static int launch_case(const built_kernel *bk, bwd_case *c, char *msg, size_t n) {
  for (size_t i = 0; i < c->nkn; i++) c->dkn[i] = 0x7fff;
  /* the atomic mode adds into zeroed dq_accum and dk_rope */
  for (size_t i = 0; i < c->nkr; i++) c->dkr[i] = bk->atomic ? 0.f : NAN;
  for (size_t i = 0; i < c->nq; i++) c->dq_accum[i] = bk->atomic ? 0.f : NAN;
  for (size_t i = 0; i < c->nv; i++) c->dv[i] = 0x7fff;
  for (size_t i = 0; i < c->nq; i++) c->dq[i] = 0x7fff;
  mg_host_dim3 grid = kh_grid(&bk->kh, c->sq, c->sk, c->B);
  if (grid.x == 0) return 0;
  launch_args a = {bk, c};
  return sm90_launch(&bk->kh, grid, thunk, &a, 0, 0, msg, n);
}

/* Tolerances, test_attn_bwd.c's form: |err| <= 2 NOISE rms(gradient) + rtol |ref| + flip
 * (rtol: the storage's unit roundoff, fp32's for dq_accum and dk_rope; flip: attn_ref.h's
 * bound of the P and dS elements within FLIP_EPS of a 16-bit rounding boundary). NOISE_*:
 * the largest noise figure (max (|err| - rtol |ref| - flip) / rms, kt_noise_report at the
 * end of a run) over every case of the numeric tests of this file with MLAGEN_TEST_SEED 21,
 * 22, 23 (host executor): dk_nope 1.1e-7 (packed dk 5.7e-8), dk_rope 2.8e-6, dv 1.3e-7,
 * dq 5.5e-8, dq_accum 1.6e-6, and at least 1e-6 (test_attn_bwd.c's floor: fp32 accumulation
 * order only). A wider scan of test_atomic (MLAGEN_TEST_SEED 9001-9080, and 8017 of a
 * scan of the sm_90a suites at 8001-8030) found longer tails of the atomics' fp32 order:
 * dq_accum up to 4.4e-6 (seed 9060; 3.8e-6 at 9001-9080's next, 3.65e-6 at 8017, which
 * failed at 1.7e-6), dk_rope up to 3.1e-6. The worst err/bound reaches 1.00 where the
 * kernel rounds a P or dS element the other way than the reference: the flip term is
 * exactly that bound. */
#define NOISE_DQ 1e-6
#define NOISE_DQ_ACCUM 4.5e-6
#define NOISE_DK 1e-6
#define NOISE_DKR 3.1e-6
#define NOISE_DV 1e-6

/* Compares dk (nope or packed), dk_rope and dv per element (dq: dq, in ratio[0]; the
 * atomic dK/dV kernel: dq_accum too, in ratio[3]); ratio[i]: the worst err/bound. Returns
 * NaN outputs; the first failure's message in msg (msg[0] 0 when all pass). */
static size_t compare(const built_kernel *bk, const bwd_case *c, double ratio[4], char *msg,
                      size_t n) {
  const mg_kernel_spec *s = &bk->kh.spec;
  const int H = s->heads, dqk = s->d_n + s->d_r, k16 = is_fp16(s) ? KT_F16 : KT_BF16;
  const double r16 = kt_unit_roundoff(k16), r32 = kt_unit_roundoff(KT_F32);
  const int nb = c->B - (g_poison_last && c->B > 1); /* the items checked (g_poison_last) */
  const size_t krows = (size_t)nb * c->sk * H, wk = (size_t)(bk->packed ? dqk : s->d_n);
  kt_checked k[3];
  msg[0] = 0;
  if (bk->is_dq) {
    const size_t qrows = (size_t)nb * c->sq * H;
    k[0] = kt_check_slack("dq_sm90 dq", k16, c->dq, c->r_dq, c->f_dq, qrows, dqk, 0, dqk,
                          (kt_tol){2 * NOISE_DQ, r16}, 0);
    ratio[0] = k[0].r.n ? k[0].r.worst_ratio : 0, ratio[1] = ratio[2] = ratio[3] = 0;
    if (k[0].r.n && !cc_ok(&k[0].r)) snprintf(msg, n, "%s", k[0].msg);
    return (size_t)(k[0].r.worst_ratio == INFINITY);
  }
  k[0] = kt_check_slack(bk->packed ? "dkdv_sm90 dk" : "dkdv_sm90 dk_nope", k16, c->dkn, c->r_dkn,
                        c->f_dkn, krows, wk, 0, wk, (kt_tol){2 * NOISE_DK, r16}, 0);
  k[1] = kt_check_slack("dkdv_sm90 dk_rope", KT_F32, c->dkr, c->r_dkr, c->f_dkr,
                        (size_t)nb * c->sk, s->d_r, 0, bk->packed ? 0 : s->d_r,
                        (kt_tol){2 * NOISE_DKR, r32}, 0);
  k[2] = kt_check_slack("dkdv_sm90 dv", k16, c->dv, c->r_dv, c->f_dv, krows, s->d_v, 0, s->d_v,
                        (kt_tol){2 * NOISE_DV, r16}, 0);
  size_t nans = 0;
  ratio[3] = 0;
  for (int i = 0; i < 3; i++) {
    ratio[i] = k[i].r.n ? k[i].r.worst_ratio : 0;
    nans += (size_t)(k[i].r.worst_ratio == INFINITY);
    if (!msg[0] && k[i].r.n && !cc_ok(&k[i].r)) snprintf(msg, n, "%s", k[i].msg);
  }
  if (bk->atomic) {
    const size_t qrows = (size_t)nb * c->sq * H;
    kt_checked a = kt_check_slack("dkdv_sm90 dq_accum", KT_F32, c->dq_accum, c->r_dq, c->f_dq, qrows,
                                  dqk, 0, dqk, (kt_tol){2 * NOISE_DQ_ACCUM, r32}, 0);
    ratio[3] = a.r.n ? a.r.worst_ratio : 0;
    nans += (size_t)(a.r.worst_ratio == INFINITY);
    if (!msg[0] && a.r.n && !cc_ok(&a.r)) snprintf(msg, n, "%s", a.msg);
  }
  return nans;
}

/* One case: rows [0, q_split) at q_pos0 + i, the rest at q_pos1 + (i - q_split); packed
 * over the documents cu (n_cu of them) when cu is not NULL. */
static void run_case_cu(const built_kernel *bk, int B, int sq, int sk, int q_pos0, int q_split,
                        int q_pos1, const int *cu, int n_cu) {
  bwd_case c;
  case_init_cu(bk, &c, B, sq, sk, q_pos0, q_split, q_pos1, cu, n_cu);
  char pos[80];
  if (cu)
    snprintf(pos, sizeof pos, "packed, %d documents, pos %d, rows from %d at %d", n_cu, q_pos0,
             q_split, q_pos1);
  else if (q_split >= sq)
    snprintf(pos, sizeof pos, "pos %d", q_pos0);
  else if (q_split <= 0)
    snprintf(pos, sizeof pos, "pos %d (as chunk 1)", q_pos1);
  else
    snprintf(pos, sizeof pos, "pos %d, rows from %d at %d", q_pos0, q_split, q_pos1);
  char msg[1024];
  double t0 = kh_now();
  if (launch_case(bk, &c, msg, sizeof msg)) fail_msg("%s: launch failed: %s", bk->kh.name, msg);
  double r[4];
  char extra[32];
  size_t nans = compare(bk, &c, r, msg, sizeof msg);
  if (bk->is_dq)
    print_message("  %s B=%d S_q=%d S_k=%d %s: err/bound dq %.2f (%.2f s)\n",
                  bk->kh.name + strlen("mla_attn_bwd_dq_sm90_"), B, sq, sk, pos, r[0], kh_now() - t0);
  else
    print_message("  %s B=%d S_q=%d S_k=%d %s: err/bound dk %.2f dk_rope %.2f dv %.2f%s (%.2f s)\n",
                  bk->kh.name + strlen("mla_attn_bwd_dkdv_sm90_"), B, sq, sk, pos, r[0], r[1], r[2],
                  bk->atomic ? (snprintf(extra, sizeof extra, " dq_accum %.2f", r[3]), extra) : "",
                  kh_now() - t0);
  if (nans) fail_msg("%zu NaN outputs", nans);
  if (msg[0]) fail_msg("%s", msg);
  case_free(&c);
}
static void run_case2(const built_kernel *bk, int B, int sq, int sk, int q_pos0, int q_split,
                      int q_pos1) {
  run_case_cu(bk, B, sq, sk, q_pos0, q_split, q_pos1, NULL, 0);
}

/* One case with every row at q_pos0 + i (split1: passed as the contract's second chunk). */
static void run_case(const built_kernel *bk, int B, int sq, int sk, int q_pos0, int split1) {
  if (split1)
    run_case2(bk, B, sq, sk, -1000, 0, q_pos0);
  else
    run_case2(bk, B, sq, sk, q_pos0, sq, -1000);
}

/* A shape with one configuration of family dq (0: dkdv, 1: dq), causal: S = 1, S = 77 with
 * batch 2 (no tile divides it; TMA rows past a batch item's end are zero fill) and again
 * with NaN in every input of item 1 (item 0 checked: batch isolation), a query shard at 60
 * of 100 keys (passed as the second chunk of the position contract) alone and with batch 3
 * (item 2 NaN), one at 130 of 200 (the diagonal inside a tile), two chunks of 35 rows at 0
 * and 165 of 200 keys, more query and key tiles than stages (the rings wrap); non-causal (no
 * mask but the ends): S = 77 with batch 2, plain and poisoned, and the shard at 130 of 200. */
static int g_contig_full; /* 1: check_shape's tiles-wrap case reads a contiguous k_rope */
static void check_shape(int dq, int H, int dn, int dr, int dv, const char *const *sets, int n_sets) {
  for (int causal = 1; causal >= 0; causal--) {
    mg_kernel_spec s = make_spec(dq, H, dn, dr, dv, causal);
    for (int i = 0; i < n_sets; i++) kh_set(&s, sets[i]);
    built_kernel bk;
    build_edit(&s, NULL, &bk);
    if (causal) run_case(&bk, 1, 1, 1, 0, 0);
    run_case(&bk, 2, 77, 77, 0, 0);
    g_poison_last = 1; /* the same with NaN in every input of item 1: item 0 unchanged */
    run_case(&bk, 2, 77, 77, 0, 0);
    g_poison_last = 0;
    if (causal) run_case(&bk, 1, 40, 100, 60, 1);
    g_poison_last = causal; /* batch 3, S_q != S_k, item 2 NaN: items 0 and 1 checked */
    if (causal) run_case(&bk, 3, 40, 100, 60, 1);
    g_poison_last = 0;
    /* two chunks (the all-gather CP form's zigzag): rows 0..34 at 0.., 35..69 at 165.. */
    if (causal) run_case2(&bk, 1, 70, 200, 0, 35, 165);
    run_case(&bk, 1, 70, 200, 130, 0);
    g_kr_contig = g_contig_full; /* split keys: that case's k_rope contiguous (ld_k_rope = d_r) */
    if (causal) run_case(&bk, 1, dq ? 128 : 256, dq ? 256 : 128, 0, 0);
    g_kr_contig = 0;
    kh_free(&bk.kh);
  }
}

/* DeepSeek-V3 heads (d_qk 192, d_v 128): the defaults with overlap (FA3's pipelining; two
 * consumer warpgroups; split keys: dK/dV's head loop, dk_rope summed per head; dK/dV in two
 * passes), and packed keys with one consumer and 3 stages (dK/dV) or block_n 128 (dQ),
 * overlap 0. */
static void test_deepseek_heads(void **state) {
  (void)state;
  const char *a[] = {"overlap=1"};
  check_shape(0, 2, 128, 64, 128, a, 1);
  const char *b[] = {"block_n=64", "stages=3", "k_packed=1"};
  check_shape(0, 2, 128, 64, 128, b, 3);
}
static void test_deepseek_heads_dq(void **state) {
  (void)state;
  const char *a[] = {"overlap=1"};
  check_shape(1, 2, 128, 64, 128, a, 1);
  const char *b[] = {"block_m=64", "block_n=128", "k_packed=1"};
  check_shape(1, 2, 128, 64, 128, b, 3);
}
/* The atomic dK/dV kernel (deterministic = 0: dQ into dq_accum through shared memory and
 * wgmma, split keys' dk_rope added, one head per CTA) on DeepSeek-V3 heads: the default
 * tiles (two consumers, two passes), and packed keys with one consumer in one pass on
 * 64/64 heads, with overlap (two consumers in one pass are refused with it: they spill). */
static void test_atomic(void **state) {
  (void)state;
  const char *a[] = {"deterministic=0"};
  check_shape(0, 2, 128, 64, 128, a, 1);
  const char *b[] = {"deterministic=0", "block_n=64", "k_packed=1", "overlap=1"};
  check_shape(0, 2, 64, 64, 64, b, 4);
  mg_kernel_spec s = make_spec(0, 2, 64, 64, 64, 1);
  const char *c[] = {"deterministic=0", "block_n=128", "two_pass=0", "overlap=1"};
  for (int i = 0; i < 4; i++) kh_set(&s, c[i]);
  sm90_expect_reject(&s, "192 fp32 accumulators per thread, over 160");
}

/* An unusual MLA shape (d_n 96, d_r 32, d_v 64: 64B-swizzled K boxes of 32 columns,
 * d_v < d_qk; one consumer warpgroup: dK/dV with one stage and two passes, dQ with
 * block_n 128), and fp16 (the defaults with overlap: two consumers, dK/dV in one pass with
 * split keys' head loop); and small heads (d_n 32, d_r 32, d_v 64; the same). */
static void test_unusual_heads(void **state) {
  (void)state;
  const char *a[] = {"block_n=64", "stages=1", "two_pass=1"};
  check_shape(0, 3, 96, 32, 64, a, 3);
  const char *b[] = {"block_m=64", "block_n=128"};
  check_shape(1, 3, 96, 32, 64, b, 2);
  for (int dq = 0; dq < 2; dq++) {
    mg_kernel_spec s = make_spec(dq, 2, 96, 32, 64, 1);
    snprintf(s.dtype, sizeof s.dtype, "fp16");
    kh_set(&s, "overlap=1");
    built_kernel bk;
    build_edit(&s, NULL, &bk);
    run_case(&bk, 2, 77, 150, 73, 0);
    kh_free(&bk.kh);
  }
  for (int dq = 0; dq < 2; dq++) {
    mg_kernel_spec s = make_spec(dq, 2, 32, 32, 64, 1);
    kh_set(&s, "overlap=1");
    built_kernel bk;
    build_edit(&s, NULL, &bk);
    run_case(&bk, 2, 77, 150, 73, 0);
    kh_free(&bk.kh);
  }
}
/* Wide heads, d_qk 256 and d_v 256 (GLM-4.7-Flash's 256/256): the defaults (dK/dV: two
 * passes), dK/dV with packed keys and with split keys (the LAGA plans'), whose default is
 * overlap = 1: with overlap = 0 dK's RoPE columns stay in registers across the heads and
 * the first pass does not fit (208 accumulators). */
static void test_wide_heads(void **state) {
  (void)state;
  const char *a[] = {"k_packed=1"};
  check_shape(0, 2, 192, 64, 256, a, 1);
  g_contig_full = 1; /* split keys: the suite's one contiguous k_rope */
  check_shape(1, 2, 192, 64, 256, NULL, 0);
  mg_kernel_spec s = make_spec(0, 2, 192, 64, 256, 1);
  built_kernel bk;
  build_edit(&s, NULL, &bk); /* the default for split keys renders (it fell back to the mma.sync kernel) */
  assert_int_equal(kh_config_int(&bk.kh, "overlap"), 1);
  kh_free(&bk.kh);
  check_shape(0, 2, 192, 64, 256, NULL, 0);
  g_contig_full = 0;
}

/* Each mutation of the rendered source must make the check fail or the launch be reported
 * (a deadlock, a wgmma or mbarrier protocol error). Among them the atomic kernel's named
 * barrier after its dS^T stores and proxy fences, before the dQ wgmma reads the tile: the
 * executor records each fence.proxy.async's changed bytes as that thread's publication,
 * ordered before other threads only by barriers, and reports a wgmma reading bytes another
 * warp published that no barrier ordered before the issuing thread (a completed warpgroup op,
 * such as the dV/dK GEMMs' wait_group<0>, orders nothing). Not among them: the named barrier
 * before the next tile rewrites the tile. A thread's wgmma.wait_group<0> on the dQ GEMM
 * returns once that one warpgroup op has completed, its shared-memory reads included, so the
 * rewrite cannot race it (the ISA's completion, not a missing check); the kernel keeps the
 * barrier (as FlashAttention-3 syncs its warpgroup around P or dS for a wgmma) until a GPU
 * run has timed it. Each thread's proxy fence is needed too, and its removal is caught. */
typedef struct mutation {
  int dq, two_pass; /* dq: 2 for the atomic dK/dV kernel (64/64/64 heads) */
  int overlap;      /* the kernel's overlap tunable */
  int sample;       /* tried by the default run (all with MLAGEN_TEST_EXHAUSTIVE=1) */
  int split;        /* dQ: rows from `split` at position 192 (0: every row at its index) */
  const char *blank;
} mutation;
/* The pipeline code both overlaps share is mutated in the overlap = 1 kernels (the
 * producers) or the overlap = 0 ones (the K/V hand-off between heads), each overlap's own
 * waits and releases in its kernels. The default run
 * tries a sample covering every kind (ctest -C exhaustive: all of them). dQ's overlap = 1
 * release of a warpgroup's last tile after the loop is needed only when the other consumer
 * runs at least `stages` more tiles: its case puts rows 64.. at position 192.
 * The wgmma fences: each kernel's removals caught by the executor (a wgmma with no fence since
 * a wait that delivered results). Not among them, as not required by the PTX ISA where they
 * stand: both kernels' dP fence (issue_dp always follows issue_s, whose fence already orders
 * every earlier access of the thread's registers, dP^T's included: the ISA's wgmma.fence is not
 * per register, and nothing in between touches a GEMM's registers) and, but for two_pass's dK
 * pass (mutated here), dK/dV's dK fence (issue_dk follows issue_dv's fence the same way); the
 * kernels keep them so that each GEMM's issue stays correct on its own. fence_operand(...) is
 * a compiler-only register fence (an empty asm; nothing on the host): not among them. */
static void test_mutations_caught(void **state) {
  (void)state;
  static const mutation muts[] = {
      {0, 0, 0, 0, 0, "mbar_wait(&full[st], parity(j));"},
      {0, 0, 0, 1, 0, "mbar_arrive(&empty[st]);"},
      {0, 0, 1, 1, 0, "mbar_wait(&empty[st], ph ^ 1u);  // MUTATION: empty wait"},
      {0, 0, 1, 0, 0, "mbar_wait(&empty[st], ph ^ 1u);  // MUTATION: LSE empty wait"},
      {0, 0, 1, 1, 0, "mbar_arrive(&full[st]);"},
      {0, 0, 0, 1, 0, "mbar_wait(kv_full, (unsigned)(h - h_begin) & 1u);"},
      {0, 0, 0, 0, 0, "mbar_wait(kv_empty, (unsigned)(hi - 1) & 1u);"},
      {0, 0, 0, 1, 0, "mbar_arrive(kv_empty);"},
      {0, 0, 0, 1, 0, "wgmma_wait<1>();  // MUTATION: S wait"},
      {0, 0, 0, 1, 0, "wgmma_wait<0>();  // MUTATION: dP wait"},
      {0, 0, 0, 1, 0, "wgmma_wait<0>();  // MUTATION: dV dK wait"},
      {0, 1, 0, 0, 0, "wgmma_wait<0>();  // MUTATION: S wait (dV pass)"},
      {2, 0, 0, 1, 0, "fence_proxy_async();    // MUTATION: dS proxy fence"},
      {2, 0, 0, 1, 0, "bar_sync(1 + wg, 128);  // MUTATION: dS written barrier"},
      {2, 0, 0, 1, 0, "wgmma_wait<0>();  // MUTATION: dQ wait"},
      {0, 0, 1, 0, 0, "mbar_wait(&full[st], parity(j));"},
      {0, 0, 1, 0, 0, "wgmma_wait<1>();  // MUTATION: S wait"},
      {0, 0, 1, 1, 0, "wgmma_wait<3>();  // MUTATION: S wait (overlap)"},
      {0, 0, 1, 1, 0, "wgmma_wait<0>();  // MUTATION: dP dV dK wait (overlap)"},
      {0, 0, 1, 1, 0, "mbar_arrive(&empty[pst]);  // MUTATION: previous empty release (overlap)"},
      {0, 0, 1, 0, 0, "wgmma_wait<0>();  // MUTATION: dV dK wait"},
      {0, 1, 1, 0, 0, "mbar_arrive(&empty[st]);  // MUTATION: empty release"},
      {0, 1, 1, 1, 0, "wgmma_wait<2>();  // MUTATION: S wait (overlap, dK pass)"},
      {0, 1, 1, 0, 0, "wgmma_wait<1>();  // MUTATION: S wait (overlap, dV pass)"},
      {0, 1, 1, 0, 0, "wgmma_wait<0>();  // MUTATION: S wait (dV pass)"},
      {1, 0, 1, 1, 0, "mbar_wait(q_full, 0);"},
      {1, 0, 0, 0, 0, "mbar_wait(&full[st], parity(j));  // MUTATION: full wait"},
      {1, 0, 1, 0, 0, "mbar_wait(&empty[st], ph ^ 1u);"},
      {1, 0, 0, 1, 0, "mbar_arrive(&empty[st]);  // MUTATION: empty release"},
      {1, 0, 0, 0, 0, "wgmma_wait<1>();  // MUTATION: S wait"},
      {1, 0, 0, 0, 0, "wgmma_wait<0>();  // MUTATION: dP wait"},
      {1, 0, 0, 0, 0, "wgmma_wait<0>();  // MUTATION: dQ wait"},
      {1, 0, 1, 0, 0, "mbar_wait(&full[st], parity(j));  // MUTATION: full wait"},
      {1, 0, 1, 0, 0, "wgmma_wait<1>();  // MUTATION: S wait"},
      {1, 0, 1, 1, 0, "wgmma_wait<2>();  // MUTATION: S wait (overlap)"},
      {1, 0, 1, 0, 0, "wgmma_wait<0>();  // MUTATION: dP wait"},
      {1, 0, 1, 1, 0, "mbar_arrive(&empty[pst]);  // MUTATION: previous empty release (overlap)"},
      {1, 0, 1, 0, 0, "wgmma_wait<0>();  // MUTATION: dQ wait"},
      {1, 0, 1, 0, 64, "mbar_arrive(&empty[st]);  // MUTATION: empty release"},
      /* the __syncthreads that makes the mbarrier inits visible (the executor reports a
       * use of a barrier whose init no barrier has published to the thread) */
      {0, 0, 0, 1, 0, "__syncthreads();  // MUTATION: init barrier"},
      {1, 0, 0, 1, 0, "__syncthreads();  // MUTATION: init barrier"},
      /* the wgmma fences (each in its GEMM's issue lambda: every call site loses it) */
      {0, 0, 0, 0, 0, "wgmma_fence();  // MUTATION: S fence"},
      {0, 0, 1, 0, 0, "wgmma_fence();  // MUTATION: S fence"},
      {0, 0, 0, 0, 0, "wgmma_fence();  // MUTATION: dV fence"},
      {0, 0, 1, 1, 0, "wgmma_fence();  // MUTATION: dV fence"},
      {0, 1, 0, 0, 0, "wgmma_fence();  // MUTATION: dK fence"},
      {0, 1, 1, 0, 0, "wgmma_fence();  // MUTATION: dK fence"},
      {2, 0, 0, 0, 0, "wgmma_fence();  // MUTATION: dQ fence"},
      {1, 0, 0, 0, 0, "wgmma_fence();  // MUTATION: S fence"},
      {1, 0, 1, 0, 0, "wgmma_fence();  // MUTATION: S fence"},
      {1, 0, 0, 0, 0, "wgmma_fence();  // MUTATION: dQ fence"},
      {1, 0, 1, 1, 0, "wgmma_fence();  // MUTATION: dQ fence"},
  };
  const int all = kh_sweep_exhaustive();
  for (size_t m = 0; m < sizeof muts / sizeof muts[0]; m++) {
    const mutation *mu = &muts[m];
    if (!all && !mu->sample) continue;
    mg_kernel_spec s = mu->dq == 2 ? make_spec(0, 2, 64, 64, 64, 1) : make_spec(mu->dq, 2, 32, 32, 64, 1);
    if (mu->dq == 2) kh_set(&s, "deterministic=0");
    kh_set(&s, "stages=2");
    if (mu->two_pass) kh_set(&s, "two_pass=1");
    if (mu->overlap) kh_set(&s, "overlap=1");
    built_kernel bk;
    build_edit(&s, mu->blank, &bk);
    bwd_case c;
    /* dK/dV: 8 query tiles through a 2-stage ring, 2 heads (with 4 query tiles and 2 key
     * tiles the missing kv_full wait went unnoticed); dQ: 2 CTAs, 4 key tiles each (with one
     * CTA the producer's missing empty wait went unnoticed) */
    const int dq = mu->dq == 1;
    if (mu->split)
      case_init(&bk, &c, 1, 256, 256, 0, mu->split, 192);
    else
      case_init(&bk, &c, 1, dq ? 256 : 512, 256, 0, dq ? 256 : 512, 0);
    char msg[1024];
    int rc = launch_case(&bk, &c, msg, sizeof msg);
    const char *how = "launch reported";
    if (!rc) {
      double r[4];
      kt_noise_quiet = 1;
      size_t nans = compare(&bk, &c, r, msg, sizeof msg);
      kt_noise_quiet = 0;
      if (!nans && !msg[0]) fail_msg("%s: removing '%s' was not caught", FAMS[dq], mu->blank);
      how = "check failed";
    }
    print_message("  %s%s%s without '%s': %s: %.120s\n", FAMS[dq], mu->dq == 2 ? " (atomic)" : "",
                  mu->overlap ? " (overlap)" : "", mu->blank, how, msg);
    case_free(&c);
    kh_free(&bk.kh);
  }
  /* Split keys: tmaps[2] made as if ld_k_rope were d_r (a map or kernel ignoring it) over the
   * wide k_rope reads the NaN between its rows, or other tokens' RoPE parts: caught (dK/dV;
   * dQ's k_rope map is the same mg_sm90_bwd_tmaps map). */
  mg_kernel_spec s = make_spec(0, 2, 32, 32, 64, 1);
  built_kernel bk;
  build_edit(&s, NULL, &bk);
  bwd_case c;
  case_init(&bk, &c, 2, 77, 77, 0, 77, 0);
  c.map_ld_dr = 1;
  encode_maps(&bk, &c);
  char msg[1024];
  if (launch_case(&bk, &c, msg, sizeof msg)) fail_msg("launch failed: %s", msg);
  double r[4];
  kt_noise_quiet = 1;
  const size_t nans = compare(&bk, &c, r, msg, sizeof msg);
  kt_noise_quiet = 0;
  print_message("  %s, tmaps[2] without ld_k_rope: %zu NaN outputs; %.120s\n", FAMS[0], nans,
                msg[0] ? msg : "NOT CAUGHT");
  if (!nans && !msg[0]) fail_msg("%s: tmaps[2] without ld_k_rope was not caught", FAMS[0]);
  case_free(&c);
  kh_free(&bk.kh);
}

/* Packed sequences: kernel_test_util.h's "many" stream (kt_varlen_many: lengths 1, 2, 3,
 * 17, 0, 64, 200, T = 287, cu padded with T as the executor pads it) in T_CAP token rows. */
#define T_CAP KT_VARLEN_CAP

/* The packed-sequence variants (spec.varlen, "_varlen") of both families against the
 * per-document reference (reference_one with cu), DeepSeek-V3 heads, the defaults (dK/dV: two
 * consumers, split keys' head loop, two passes; dQ: two consumers), causal and not: every
 * query row over the short documents, over one document of 260 tokens ("one": dK/dV
 * non-causal, dQ causal), and (causal) rank 0 of laga-cp at P = 2 (chunks
 * [0, 75) and [225, 300): the 200-token document cut by the split, slack rows in the
 * second chunk). NaN fills every slack row of q, dout, k_nope, k_rope and v (and LSE and
 * delta). The causal variants run with overlap; all four compile for sm_90a with no spill.
 * And deterministic = 0 has no variant. */
static void test_varlen(void **state) {
  (void)state;
  const kt_varlen *vl;
  kt_varlen_cases(&vl);
  const kt_varlen *vm = &vl[0], *v1 = &vl[1];
  kh_sweep sw;
  kh_sweep_open(&sw, 72, KH_SWEEP_SMEM | KH_SWEEP_SM90_ONLY | KH_SWEEP_WGMMA_PIPELINED);
  for (int dq = 0; dq < 2; dq++)
    for (int causal = 0; causal <= 1; causal++) {
      mg_kernel_spec s = make_spec(dq, 2, 128, 64, 128, causal);
      s.varlen = 1;
      if (causal) kh_set(&s, "overlap=1");
      built_kernel bk;
      build_edit(&s, NULL, &bk);
      run_case_cu(&bk, 1, T_CAP, T_CAP, 0, T_CAP, 0, vm->cu, vm->n);
      if (causal == dq) run_case_cu(&bk, 1, T_CAP, T_CAP, 0, T_CAP, 0, v1->cu, v1->n); /* one document */
      if (causal) run_case_cu(&bk, 1, T_CAP / 2, T_CAP, 0, T_CAP / 4, 3 * T_CAP / 4, vm->cu, vm->n);
      kh_free(&bk.kh);
      kh_sweep_compile(&sw, &s, "");
    }
  kh_sweep_close(&sw);
  mg_kernel_spec s = make_spec(0, 2, 128, 64, 128, 1);
  s.varlen = 1;
  kh_set(&s, "deterministic=0");
  sm90_expect_reject(&s, "deterministic = 1");
}

/* Wrong boundaries in the varlen variants are caught: dK/dV with a key seen by one query
 * position past its range, dQ with a row seeing one key past its range (each fails the
 * per-element check); dK/dV's dS^T multiplied where P^T is 0 instead of selected (the slack
 * keys' NaN V reaches dK): NaN outputs. Small heads (d_n 32, d_r 32, d_v 64), causal. */
static void test_varlen_mutations_caught(void **state) {
  (void)state;
  const kt_varlen *vm = kt_varlen_many();
  static const struct {
    int dq;
    sm90_edit e;
  } muts[] = {
      {0, {"pos(qi) >= key_hi[r]", "pos(qi) > key_hi[r]"}},
      {0, {"s[i] != 0.f ? s[i] * (dp[i] - dl) : 0.f", "s[i] * (dp[i] - dl)"}},
      {1, {"key >= row_hi[r]", "key > row_hi[r]"}},
  };
  for (size_t m = 0; m < sizeof muts / sizeof muts[0]; m++) {
    mg_kernel_spec s = make_spec(muts[m].dq, 2, 32, 32, 64, 1);
    s.varlen = 1;
    built_kernel bk;
    memset(&bk, 0, sizeof bk);
    sm90_build(&s, &muts[m].e, &bk.kh);
    bk.packed = kh_config_int(&bk.kh, "k_packed");
    bk.is_dq = muts[m].dq;
    bwd_case c;
    case_init_cu(&bk, &c, 1, T_CAP, T_CAP, 0, T_CAP, 0, vm->cu, vm->n);
    char msg[1024];
    if (launch_case(&bk, &c, msg, sizeof msg)) fail_msg("launch failed: %s", msg);
    double r[4];
    kt_noise_quiet = 1;
    const size_t nans = compare(&bk, &c, r, msg, sizeof msg);
    kt_noise_quiet = 0;
    if (!nans && !msg[0]) fail_msg("%s: '%s' -> '%s' was not caught", FAMS[muts[m].dq], muts[m].e.from, muts[m].e.to);
    print_message("  %s '%s' -> '%s': %zu NaN outputs; %.120s\n", FAMS[muts[m].dq], muts[m].e.from,
                  muts[m].e.to, nans, msg);
    case_free(&c);
    kh_free(&bk.kh);
  }
}

/* The configurations the templates' checks keep compile for sm_90a (NVRTC) with no spill,
 * no stack frame, no static shared memory and no wgmma serialized by ptxas (causal and not:
 * kh_sweep_cover adds the other mask for one pick drawn from the seed; both overlaps). sh 0: DeepSeek-V3
 * heads at H 128, 1: the unusual shape at H 40 and the small heads (d_n 32, d_r 32, d_v 64:
 * the two-consumer and mutation tests') at H 16 in one sweep (the cover pairs each shape
 * with every tunable value), 2: the wide 256/256 heads. A covering sample is compiled
 * (every kept configuration, with both masks, under MLAGEN_TEST_EXHAUSTIVE=1). */
enum { NC_SHAPE = 2 * (2 * 3 * 2 * 2 * 2 + 2 * 2 * 2 * 2) }; /* candidates per shape (x2: overlap) */
static int nvrtc_cands(int sh, mg_kernel_spec *cands);
static void nvrtc_kept_configs(int sh) {
  kh_sweep sw;
  kh_sweep_open(&sw, 72, KH_SWEEP_SMEM | KH_SWEEP_REJECTS | KH_SWEEP_SM90_ONLY | KH_SWEEP_WGMMA_PIPELINED);
  sw.max_smem = 227 * 1024;
  mg_kernel_spec cands[2 * NC_SHAPE];
  int nc = nvrtc_cands(sh, cands);
  if (sh == 1) nc += nvrtc_cands(3, cands + nc);
  sm90_sweep_close(&sw, kh_sweep_cover(&sw, cands, nc, g_test_seed, ""), sh == 2 ? 3 : 6);
}
/* Shape sh's candidates (both families) into cands; returns their count (NC_SHAPE). */
static int nvrtc_cands(int sh, mg_kernel_spec *cands) {
  const int shapes[4][3] = {{128, 64, 128}, {96, 32, 64}, {192, 64, 256}, {32, 32, 64}};
  int nc = 0;
  const int H = sh == 1 ? 40 : sh == 3 ? 16 : 128, dn = shapes[sh][0], dr = shapes[sh][1], dv = shapes[sh][2];
  for (int bn = 64; bn <= 128; bn *= 2)
    for (int st = 1; st <= 3; st++)
      for (int tp = 0; tp <= 1; tp++)
        for (int kp = 0; kp <= 1; kp++)
          for (int det = 0; det <= 1; det++)
            for (int ov = 0; ov <= 1; ov++) {
              mg_kernel_spec s = make_spec(0, H, dn, dr, dv, 1);
              kh_setf(&s, "block_n=%d", bn);
              kh_setf(&s, "stages=%d", st);
              kh_setf(&s, "two_pass=%d", tp);
              kh_setf(&s, "k_packed=%d", kp);
              kh_setf(&s, "deterministic=%d", det);
              kh_setf(&s, "overlap=%d", ov);
              cands[nc++] = s;
            }
  for (int bm = 64; bm <= 128; bm *= 2)
    for (int bn = 64; bn <= 128; bn *= 2)
      for (int st = 2; st <= 3; st++)
        for (int kp = 0; kp <= 1; kp++)
          for (int ov = 0; ov <= 1; ov++) {
            mg_kernel_spec s = make_spec(1, H, dn, dr, dv, 1);
            kh_setf(&s, "block_m=%d", bm);
            kh_setf(&s, "block_n=%d", bn);
            kh_setf(&s, "stages=%d", st);
            kh_setf(&s, "k_packed=%d", kp);
            kh_setf(&s, "overlap=%d", ov);
            cands[nc++] = s;
          }
  return nc;
}
static void test_nvrtc_kept_configs_deepseek(void **state) { (void)state; nvrtc_kept_configs(0); }
static void test_nvrtc_kept_configs_unusual(void **state) { (void)state; nvrtc_kept_configs(1); }
static void test_nvrtc_kept_configs_wide(void **state) { (void)state; nvrtc_kept_configs(2); }

/* The child side of test_asan (kh_run_asan_child: this program as --asan-case, every kernel
 * an ASan build, MG_HOST_ASAN=1): both families at small heads (d_n 32, d_r 32, d_v 64),
 * causal, split keys with the wide k_rope (ld_k_rope), their default configurations, on
 * partial tiles: 45 queries at 32 of 77 keys, batch 2 (TMA rows past a batch item's end).
 * Checked per element as the other cases; ASan bounds the global buffers, the dynamic shared
 * memory at the launch's size and the emulator's own buffers. */
static void asan_case_run(void **state) {
  (void)state;
  for (int dq = 0; dq < 2; dq++) {
    mg_kernel_spec s = make_spec(dq, 2, 32, 32, 64, 1);
    built_kernel bk;
    build_edit(&s, NULL, &bk);
    run_case(&bk, 2, 45, 77, 32, 0);
    kh_free(&bk.kh);
  }
}

/* ASan finds no out-of-bounds access in the kernels or the Hopper emulation. */
static void test_asan(void **state) {
  (void)state;
  kh_run_asan_child("test_attn_bwd_sm90", g_test_seed, asan_case_run);
}

/* Every test starts from the file's flags at their defaults (0), as under ctest's one test
 * per process: a test that fails (cmocka longjmps out of it) leaves no flag set for the next
 * one in a direct run of the binary. */
static int fresh_flags(void **state) {
  (void)state;
  g_kr_contig = 0; g_poison_last = 0; g_contig_full = 0;
  return 0;
}

int main(int argc, char **argv) {
  kt_seed_init();
  int rc = kh_test_main(argc, argv, asan_case_run);
  if (rc >= 0) return rc;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_deepseek_heads, fresh_flags),
      cmocka_unit_test_setup(test_deepseek_heads_dq, fresh_flags),
      cmocka_unit_test_setup(test_atomic, fresh_flags),
      cmocka_unit_test_setup(test_unusual_heads, fresh_flags),
      cmocka_unit_test_setup(test_wide_heads, fresh_flags),
      cmocka_unit_test_setup(test_mutations_caught, fresh_flags),
      cmocka_unit_test_setup(test_varlen, fresh_flags),
      cmocka_unit_test_setup(test_varlen_mutations_caught, fresh_flags),
      cmocka_unit_test_setup(test_nvrtc_kept_configs_deepseek, fresh_flags),
      cmocka_unit_test_setup(test_nvrtc_kept_configs_unusual, fresh_flags),
      cmocka_unit_test_setup(test_nvrtc_kept_configs_wide, fresh_flags),
      cmocka_unit_test_setup(test_asan, fresh_flags),
  };
  const int failed = cmocka_run_group_tests(tests, NULL, NULL);
  kt_noise_report();
  return kh_exit_code(failed);
}
