/* test_mqa_bwd_sm90.c: the sm_90a absorbed backward, its key side (templates/mqa_bwd_dkv_sm90.cu.tpl:
 * a CTA owns 64 latent keys, a TMA ring of query tiles on mbarriers, wgmma, a producer
 * warpgroup, the d_c + d_r wide dc accumulator split over two consumer warpgroups) and its
 * query side (mqa_bwd_dq_sm90.cu.tpl: the mirror, 64 packed query rows per CTA; the test_dq_*
 * cases run the same shapes on it, comparing dq), each run
 * unchanged on the CPU through the host executor's sm_90a emulation, against the float64
 * reference of tests/mqa_ref.h per element with test_mqa_bwd.c's tolerances; the same bits on
 * every schedule; the kept configurations compiled by NVRTC for sm_90a without spills; and
 * barriers, waits and fences of the kernel removed from the rendered source, each removal
 * failing the check or being reported (a deadlock, a wgmma or named-barrier protocol error).
 * The default run compiles a covering sample of the configurations and tries a sample of
 * the removals covering every kind (sample_dkv, sample_dq); MLAGEN_TEST_EXHAUSTIVE=1
 * (ctest -C exhaustive) all of them.
 *
 * The three tensor maps (q, c, dout: the template's `tmaps` doc) come from the runtime's
 * mg_sm90_mqa_bwd_tmaps (runtime/exec/mg_sm90_tmap.h), passed by value as the kernel's
 * TensorMaps<3>: cuTensorMapEncodeTiled through runtime/mg_driver's loader with the fake
 * driver (tests/fake_cuda.c). delta = rowsum(dO o) is
 * computed on the host in float64 from the stored 16-bit o and rounded to fp32 (what
 * attn_bwd_pre stores up to its fp32 summation order). Inputs: random bf16 (fp16 in one
 * case), scores with standard deviation 2 under DeepSeek's YaRN softmax scale (the seed is
 * printed, MLAGEN_TEST_SEED overrides it). The host executor is slow on 576-wide heads: the
 * shapes are few and small, each chosen for a property (named at its case). The
 * packed-sequence variants ("_varlen") against mqa_ref.h run per document (case_init_cu),
 * NaN in every slack row, wrong boundaries caught. */
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
#include "mg_sm90_tmap.h"
#include "mqa_ref.h"
#include "sm90_test_util.h"

/* the kernel's `const __grid_constant__ mla::sm90::TensorMaps<3> tmaps`, passed by value */
typedef struct { tmap_t m[3]; } tmaps3_t;
typedef void (*dkv_fn)(const e16 *q, const e16 *c, const e16 *dout, const float *lse,
                       const float *delta, e16 *dc, int seqlen_q, int seqlen_k, int q_pos0,
                       float softmax_scale, tmaps3_t tmaps);
/* the packed-sequence variants (spec.varlen): the same, then cu_seqlens and n_seqs */
typedef void (*dkv_varlen_fn)(const e16 *q, const e16 *c, const e16 *dout, const float *lse,
                              const float *delta, e16 *dc, int seqlen_q, int seqlen_k,
                              int q_pos0, float softmax_scale, tmaps3_t tmaps,
                              const int *cu_seqlens, int n_seqs);

static int g_fp16;
static int g_dq; /* the kernels built next: mqa_bwd_dq_sm90 (1) or mqa_bwd_dkv_sm90 (0) */

typedef struct built_kernel {
  kh_kernel kh;
  dkv_fn fn;
} built_kernel;

static void build_edit(const mg_kernel_spec *spec, const sm90_edit *e, built_kernel *out) {
  sm90_build(spec, e, &out->kh);
  assert_int_equal(out->kh.threads, 384);
  assert_int_equal(kh_launch_value(&out->kh, "smem_static"), 0);
  *(void **)&out->fn = out->kh.fn;
}

static mg_kernel_spec make_spec(int H, int dc, int dr, int causal) {
  mg_kernel_spec s = kh_mqa_spec(g_dq ? "mqa_bwd_dq_sm90" : "mqa_bwd_dkv_sm90", H, dc, dr, causal);
  if (g_fp16) snprintf(s.dtype, sizeof s.dtype, "fp16");
  return s;
}

/* One case: 16-bit inputs, the forward's stored o (16-bit) and lse (fp32), delta, the
 * float64 reference dc (P and scale dS rounded to 16 bits as the kernel's wgmma operands)
 * with mqa_ref.h's bound of ambiguous roundings, the kernel's dc, the maps. */
typedef struct bwd_case {
  int B, sq, sk, H, dc, dr, causal, q_pos0, dq; /* dq: the kernel's output is dq */
  float scale;
  e16 *q, *c, *dout, *out;
  float *lse, *delta;
  size_t nq, nc, no, nl;
  double *r_dc, *f_dc, *r_dq, *f_dq;
  tmap_t *tmaps; /* [3] */
  const int *cu; /* packed sequences: cu_seqlens [n_cu + 1] (batch 1), else NULL */
  int n_cu;
  int poisoned; /* 1: the last batch item's inputs are NaN (g_poison_last): not compared */
} bwd_case;

/* 1: case_init_cu fills every input of the last batch item (q, c, dout, lse, delta) with NaN
 * after the reference is made, and compare checks the items before it only: their tiles' rows
 * past an item's end must be TMA's zero fill, never the next item's values. */
static int g_poison_last;

#define FLIP_EPS 3e-5 /* as test_mqa_bwd.c: the kernel's own fp32 error in a P or dS element */

static void *xcalloc(size_t n, size_t sz) {
  void *p = calloc(n ? n : 1, sz);
  assert_non_null(p);
  return p;
}
static e16 *rand_e16(size_t n, double sd, double *as_double) {
  e16 *p = kt_rand_e16_sd(g_fp16, n, sd);
  for (size_t i = 0; i < n; i++) as_double[i] = e16_to_float(g_fp16, p[i]);
  return p;
}

/* The kernel's 3 maps over c's tensors for kh, made by the runtime's mg_sm90_mqa_bwd_tmaps
 * (what mg_sm90_launch_tmaps passes the executor) through the fake driver's
 * cuTensorMapEncodeTiled (the host executor's device addresses are host addresses). */
static void encode_maps(bwd_case *c, const kh_kernel *kh) {
  const mg_driver *drv;
  mg_kernel_info info;
  sm90_driver_info(kh, &drv, &info);
  mg_diag d = MG_DIAG_INIT;
  const mg_sm90_mqa_bwd_tensors t = {(CUdeviceptr)(uintptr_t)c->q, (CUdeviceptr)(uintptr_t)c->c,
                                     (CUdeviceptr)(uintptr_t)c->dout, c->B, c->sq, c->sk};
  if (mg_sm90_mqa_bwd_tmaps(drv, &kh->spec, &info, &t, (CUtensorMap *)c->tmaps, &d))
    fail_msg("mg_sm90_mqa_bwd_tmaps: %s", mg_diag_msg(&d));
}

/* A case; cu (n_cu documents; NULL: not packed) makes it a packed one (B must be 1): NaN in
 * every slack row (position >= cu[n_cu]) of q, c and dout, and (as the forward's outputs)
 * in the slack rows' LSE and delta; the reference per document: mqa_ref.h's _varlen entries
 * (each row's document from their own walk over cu, never mg_varlen or mla::Varlen). */
static void case_init_cu(bwd_case *c, const kh_kernel *kh, int B, int sq, int sk, int q_pos0,
                         const int *cu, int n_cu) {
  const mg_kernel_spec *s = &kh->spec;
  const int H = s->heads, dc = s->d_c, dr = s->d_r, w = dc + dr;
  memset(c, 0, sizeof *c);
  c->B = B, c->sq = sq, c->sk = sk, c->H = H, c->dc = dc, c->dr = dr, c->causal = s->causal;
  c->q_pos0 = q_pos0;
  c->dq = !strcmp(s->family, "mqa_bwd_dq_sm90");
  c->scale = (float)kt_softmax_scale(w / 3); /* as test_mqa_bwd.c */
  c->nq = (size_t)B * sq * H * w;
  c->nc = (size_t)B * sk * w;
  c->no = (size_t)B * sq * H * dc;
  c->nl = (size_t)B * H * sq;
  double *qd = xcalloc(c->nq, sizeof *qd), *cd = xcalloc(c->nc, sizeof *cd);
  double *dod = xcalloc(c->no, sizeof *dod), *od = xcalloc(c->no, sizeof *od);
  double *lsed = xcalloc(c->nl, sizeof *lsed);
  /* 64-byte aligned: the maps' base addresses must be 16-byte aligned */
  c->q = rand_e16(c->nq, kt_q_sd(c->scale, w), qd); /* scores with sd 2 */
  c->c = rand_e16(c->nc, 1, cd);
  c->dout = rand_e16(c->no, 1, dod);
  c->cu = cu, c->n_cu = n_cu;
  const int T = cu ? cu[n_cu] : 0, i_slack = cu ? (T - q_pos0 > 0 ? T - q_pos0 : 0) : sq;
  if (cu) {
    for (size_t i = (size_t)i_slack * H * w; i < c->nq; i++) c->q[i] = 0x7fff, qd[i] = NAN;
    for (size_t i = (size_t)i_slack * H * dc; i < c->no; i++) c->dout[i] = 0x7fff, dod[i] = NAN;
    for (size_t i = (size_t)T * w; i < c->nc; i++) c->c[i] = 0x7fff, cd[i] = NAN;
    for (size_t i = 0; i < c->nl; i++) lsed[i] = NAN;
  }
  mqa_ref_fwd_varlen(B, sq, sk, H, dc, dr, c->causal, q_pos0, cu, n_cu, c->scale, qd, cd, od,
                     lsed);
  if (cu) /* the slack rows' LSE as the kernels get it: NaN (their o stays 0) */
    for (int h = 0; h < H; h++)
      for (int i = i_slack; i < sq; i++) lsed[(size_t)h * sq + i] = NAN;
  c->lse = xcalloc(c->nl, sizeof *c->lse);
  c->delta = xcalloc(c->nl, sizeof *c->delta);
  for (size_t i = 0; i < c->no; i++) od[i] = e16_to_float(g_fp16, float_to_e16(g_fp16, (float)od[i]));
  for (size_t i = 0; i < c->nl; i++) lsed[i] = c->lse[i] = (float)lsed[i];
  for (int b = 0; b < B; b++)
    for (int i = 0; i < sq; i++)
      for (int h = 0; h < H; h++) {
        const size_t row = ((size_t)b * sq + i) * H + h;
        double acc = 0;
        for (int k = 0; k < dc; k++) acc += dod[row * dc + k] * od[row * dc + k];
        c->delta[((size_t)b * H + h) * sq + i] = (float)acc;
      }
  c->r_dc = xcalloc(c->nc, sizeof *c->r_dc);
  c->f_dc = xcalloc(c->nc, sizeof *c->f_dc);
  c->r_dq = xcalloc(c->nq, sizeof *c->r_dq);
  c->f_dq = xcalloc(c->nq, sizeof *c->f_dq);
  mqa_ref_bwd_mixed_varlen(B, sq, sk, H, dc, dr, c->causal, q_pos0, cu, n_cu, c->scale, qd, cd,
                           dod, od, lsed, kt_round_fn(g_fp16), FLIP_EPS, c->f_dq, c->f_dc,
                           c->r_dq, c->r_dc);
  if (g_poison_last && B > 1) {
    kt_nan_last_item_e16(c->q, c->nq, B), kt_nan_last_item_e16(c->c, c->nc, B);
    kt_nan_last_item_e16(c->dout, c->no, B);
    kt_nan_last_item_f32(c->lse, c->nl, B), kt_nan_last_item_f32(c->delta, c->nl, B);
    c->poisoned = 1;
  }
  c->out = xcalloc(c->dq ? c->nq : c->nc, sizeof *c->out);
  c->tmaps = aligned_alloc(64, 3 * sizeof(tmap_t));
  memset(c->tmaps, 0, 3 * sizeof(tmap_t));
  encode_maps(c, kh);
  free(qd), free(cd), free(dod), free(od), free(lsed);
}
static void case_init(bwd_case *c, const kh_kernel *kh, int B, int sq, int sk, int q_pos0) {
  case_init_cu(c, kh, B, sq, sk, q_pos0, NULL, 0);
}

static void case_free(bwd_case *c) {
  free(c->q), free(c->c), free(c->dout), free(c->out), free(c->lse), free(c->delta);
  free(c->r_dc), free(c->f_dc), free(c->r_dq), free(c->f_dq), free(c->tmaps);
}

typedef struct launch_args {
  const built_kernel *bk;
  bwd_case *c;
} launch_args;
static void thunk(void *p) {
  launch_args *a = p;
  bwd_case *c = a->c;
  if (c->cu) {
    ((dkv_varlen_fn)a->bk->kh.fn)(c->q, c->c, c->dout, c->lse, c->delta, c->out, c->sq, c->sk,
                                  c->q_pos0, c->scale, *(const tmaps3_t *)c->tmaps, c->cu,
                                  c->n_cu);
    return;
  }
  a->bk->fn(c->q, c->c, c->dout, c->lse, c->delta, c->out, c->sq, c->sk, c->q_pos0, c->scale,
            *(const tmaps3_t *)c->tmaps);
}

/* Launches (dc NaN first) on the executor's default (shuffled) schedule, or seed when not 0
 * (round robin when rr), with sm_90's shared-memory limit; returns the launch's message in
 * msg (0: it ran). */
static int launch_case(const built_kernel *bk, bwd_case *c, unsigned long long seed, int rr,
                       char *msg, size_t n) {
  const size_t nout = c->dq ? c->nq : c->nc;
  for (size_t i = 0; i < nout; i++) c->out[i] = 0x7fff; /* NaN in bf16 and fp16 */
  mg_host_dim3 grid = kh_grid(&bk->kh, c->sq, c->sk, c->B);
  assert_int_equal(grid.x, c->dq ? ((unsigned)c->sq * (unsigned)c->H + 63) / 64 : ((unsigned)c->sk + 63) / 64);
  if (grid.x == 0) return 0;
  launch_args a = {bk, c};
  return sm90_launch(&bk->kh, grid, thunk, &a, seed, rr, msg, n);
}

/* test_mqa_bwd.c's tolerances, per element: |err| <= 2 NOISE_* rms(part) + u |ref| + flip
 * (mqa_ref.h's bound for P and scale dS elements near a 16-bit rounding boundary). NOISE_*:
 * the largest noise figure kt_noise_report printed over this file's numeric cases
 * (MLAGEN_TEST_SEED 21, 22, 23) was dc_kv 4.0e-8, dk_rope 3.9e-8, dq 1.9e-8: fp32 accumulation
 * order only, so 1e-6 as in test_mqa_bwd.c (three seeds do not size the tail). dq's tail is
 * longer: seeds 100-140 stay under 9.5e-8, but seed 1796250907 puts 2.47e-6 on a dq element
 * whose reference is exactly 0 (a row whose dS cancels: dP and delta, each a 512-term fp32
 * sum in its own order), so dq's is twice that. */
#define NOISE_DQ 2.5e-6
#define NOISE_DC 1e-6
#define NOISE_DKR 1e-6

/* Compares dc[:, :d_c] and dc[:, d_c:] per element; ratio[i]: their worst err / bound.
 * Returns the number of NaN outputs; the first failure's message goes to msg. */
static size_t compare(const bwd_case *c, double ratio[2], char *msg, size_t n) {
  const size_t nb = (size_t)(c->B - c->poisoned); /* the items compared */
  const size_t w = (size_t)(c->dc + c->dr), krows = nb * c->sk, dc = (size_t)c->dc;
  const size_t qrows = nb * c->sq * c->H;
  const int kind = g_fp16 ? KT_F16 : KT_BF16;
  const double rtol = kt_unit_roundoff(kind);
  kt_checked k[2];
  msg[0] = 0;
  if (c->dq) { /* dq: one part (ratio[1] 0) */
    k[0] = kt_check_slack("mqa_bwd_dq_sm90 dq", kind, c->out, c->r_dq, c->f_dq, qrows, w, 0, w,
                          (kt_tol){2 * NOISE_DQ, rtol}, 0);
    ratio[0] = k[0].r.n ? k[0].r.worst_ratio : 0, ratio[1] = 0;
    if (k[0].r.n && !cc_ok(&k[0].r)) snprintf(msg, n, "%s", k[0].msg);
    return (size_t)(k[0].r.worst_ratio == INFINITY);
  }
  k[0] = kt_check_slack("mqa_bwd_dkv_sm90 dc_kv", kind, c->out, c->r_dc, c->f_dc, krows, w, 0,
                        dc, (kt_tol){2 * NOISE_DC, rtol}, 0);
  k[1] = kt_check_slack("mqa_bwd_dkv_sm90 dk_rope", kind, c->out, c->r_dc, c->f_dc, krows, w,
                        dc, w, (kt_tol){2 * NOISE_DKR, rtol}, 0);
  size_t nans = 0;
  msg[0] = 0;
  for (int i = 0; i < 2; i++) {
    ratio[i] = k[i].r.n ? k[i].r.worst_ratio : 0;
    nans += (size_t)(k[i].r.worst_ratio == INFINITY);
    if (!msg[0] && k[i].r.n && !cc_ok(&k[i].r)) snprintf(msg, n, "%s", k[i].msg);
  }
  return nans;
}

static void run_case_cu(const built_kernel *bk, int B, int sq, int sk, int q_pos0,
                        const int *cu, int n_cu) {
  bwd_case c;
  case_init_cu(&c, &bk->kh, B, sq, sk, q_pos0, cu, n_cu);
  char msg[1024];
  double t0 = kh_now();
  if (launch_case(bk, &c, 0, 0, msg, sizeof msg)) fail_msg("%s: launch failed: %s", bk->kh.name, msg);
  double r[2];
  size_t nans = compare(&c, r, msg, sizeof msg);
  if (c.dq)
    print_message("  %s B=%d S_q=%d S_k=%d q_pos0=%d%s: err/bound dq %.2f (%.2f s)\n",
                  bk->kh.name + strlen("mla_mqa_bwd_"), B, sq, sk, q_pos0, cu ? " packed" : "",
                  r[0], kh_now() - t0);
  else
    print_message("  %s B=%d S_q=%d S_k=%d q_pos0=%d%s: err/bound dc_kv %.2f dk_rope %.2f (%.2f s)\n",
                  bk->kh.name + strlen("mla_mqa_bwd_"), B, sq, sk, q_pos0, cu ? " packed" : "",
                  r[0], r[1], kh_now() - t0);
  if (nans) fail_msg("%zu NaN outputs", nans);
  if (msg[0]) fail_msg("%s", msg);
  case_free(&c);
}
static void run_case(const built_kernel *bk, int B, int sq, int sk, int q_pos0) {
  run_case_cu(bk, B, sq, sk, q_pos0, NULL, 0);
}

/* DeepSeek's latent (d_c 512, d_r 64: 576/512; the default, 1 stage: 2 do not fit), causal
 * and not. H 2: S = 1; S = 37 with batch 2 (74 rows: a partial query tile, TMA rows past a
 * batch item's end zero fill; 37 keys: a partial key tile), and again with NaN in every input
 * of item 1 (item 0 checked: batch isolation); a query shard
 * at 30 of 50 keys; 70 keys for 5 queries at 0 (causal: the second key tile sees no query,
 * dc = 0); dq: no keys (dq = 0). H 16: 4 tokens per 64-row tile (the diagonal differs per token). H 128 (V3
 * without sequence parallelism): 3 queries at 62.. of 65 keys, 6 query tiles through the
 * one-stage ring. */
static void deepseek(void) {
  for (int causal = 1; causal >= 0; causal--) {
    mg_kernel_spec s = make_spec(2, 512, 64, causal);
    built_kernel bk;
    build_edit(&s, NULL, &bk);
    run_case(&bk, 1, 1, 1, 0);
    run_case(&bk, 2, 37, 37, 0);
    g_poison_last = 1; /* the same with NaN in every input of item 1: item 0 unchanged */
    run_case(&bk, 2, 37, 37, 0);
    g_poison_last = 0;
    run_case(&bk, 1, 20, 50, 30);
    if (causal) run_case(&bk, 1, 5, 70, 0);
    if (g_dq) run_case(&bk, 1, 5, 0, 0); /* no keys: dq = 0 (dkv: no CTA) */
    kh_free(&bk.kh);
    s = make_spec(16, 512, 64, causal);
    build_edit(&s, NULL, &bk);
    run_case(&bk, 1, 13, 13, 0);
    kh_free(&bk.kh);
  }
  mg_kernel_spec s = make_spec(128, 512, 64, 1);
  built_kernel bk;
  build_edit(&s, NULL, &bk);
  run_case(&bk, 1, 3, 65, 62);
  kh_free(&bk.kh);
}

/* d_c 256, d_r 32 (288/256: 64B-swizzled 32-column boxes; the dK_rope chunk overlaps dC's
 * last 32 columns), the default (2 stages) causal and not: H 2 at S = 1, S 37 batch 2, a
 * shard at 50 of 70 keys, 130 keys for 70 queries at 60 (3 key tiles, 3 query tiles around
 * the ring); H 1 (one row per token); H 5 (tokens straddle query tiles; batch 2 again with item
 * 1 NaN). Then 1 stage, and
 * fp16. */
static void dc256(void) {
  for (int causal = 1; causal >= 0; causal--) {
    mg_kernel_spec s = make_spec(2, 256, 32, causal);
    built_kernel bk;
    build_edit(&s, NULL, &bk);
    run_case(&bk, 1, 1, 1, 0);
    run_case(&bk, 2, 37, 37, 0);
    run_case(&bk, 1, 20, 70, 50);
    run_case(&bk, 1, 70, 130, 60);
    kh_free(&bk.kh);
  }
  mg_kernel_spec s = make_spec(1, 256, 32, 1);
  built_kernel bk;
  build_edit(&s, NULL, &bk);
  run_case(&bk, 2, 77, 77, 0);
  kh_free(&bk.kh);
  s = make_spec(5, 256, 32, 1);
  build_edit(&s, NULL, &bk);
  run_case(&bk, 2, 29, 29, 0);
  g_poison_last = 1; /* batch isolation with tokens straddling query tiles */
  run_case(&bk, 2, 29, 29, 0);
  g_poison_last = 0;
  run_case(&bk, 1, 13, 20, 7);
  kh_free(&bk.kh);
  s = make_spec(2, 256, 32, 1);
  kh_set(&s, "stages=1");
  build_edit(&s, NULL, &bk);
  run_case(&bk, 2, 37, 100, 63);
  kh_free(&bk.kh);
  g_fp16 = 1;
  s = make_spec(2, 256, 32, 1);
  build_edit(&s, NULL, &bk);
  run_case(&bk, 2, 37, 77, 40);
  kh_free(&bk.kh);
  g_fp16 = 0;
}

/* Deterministic by construction: round robin and two shuffled schedules give the same bits
 * (288/256, H 2, causal, batch 2, 3 query tiles through the 2-stage ring). */
static void schedules_bit_identical(void) {
  mg_kernel_spec s = make_spec(2, 256, 32, 1);
  built_kernel bk;
  build_edit(&s, NULL, &bk);
  bwd_case c;
  case_init(&c, &bk.kh, 2, 80, 100, 20);
  const size_t nout = c.dq ? c.nq : c.nc;
  e16 *d0 = malloc(nout * sizeof *d0);
  char msg[1024];
  for (int k = 0; k < 3; k++) {
    if (launch_case(&bk, &c, (unsigned long long)k * 7, k == 0, msg, sizeof msg))
      fail_msg("launch: %s", msg);
    if (k == 0) {
      double r[2];
      if (compare(&c, r, msg, sizeof msg) || msg[0]) fail_msg("round robin: %s", msg);
      memcpy(d0, c.out, nout * sizeof *d0);
    } else if (memcmp(d0, c.out, nout * sizeof *d0)) {
      fail_msg("schedule seed %d gives other bits than round robin", k * 7);
    }
  }
  print_message("  %s: round robin and seeds 7, 14: %s bit-identical\n", bk.kh.name, c.dq ? "dq" : "dc");
  free(d0);
  case_free(&c);
  kh_free(&bk.kh);
}

/* The two kernels' pipeline protocol (the same names in both): every wait, barrier and fence
 * whose removal the check must catch, in the order sample_dkv / sample_dq index them; `free`
 * is the kernel's BAR_FREE arrive at the end of an iteration (its loop bound differs). The
 * wgmma fences last (each before its warpgroup's first wgmma or after a wait that delivered
 * results: the executor reports the wgmma). fence_operand(...) is a compiler-only register
 * fence (an empty asm; nothing on the host): not among them. */
#define MQA_BWD_SM90_SYNC_MUTS(free) \
      {"mbar_wait(&empty[st], ph ^ 1u);", ""}, \
      {"mbar_wait(&full[st], (unsigned)(j / STAGES) & 1u);  // MUTATION: full wait 0", ""}, \
      {"mbar_wait(&full[st], (unsigned)(j / STAGES) & 1u);  // MUTATION: full wait 1", ""}, \
      {"wgmma_wait<0>();  // MUTATION: S wait", ""}, \
      {"if (j > 0) bar_sync(BAR_FREE, 256);", ""}, \
      {"bar_arrive(BAR_P, 256);", ""}, \
      {"bar_sync(BAR_DS, 256);  // MUTATION: DS sync 0", ""}, \
      {"wgmma_wait<0>();  // MUTATION: dP wait", ""}, \
      {"bar_sync(BAR_P, 256);", ""}, \
      {"bar_sync(BAR_READ, 128);", ""}, \
      {"fence_proxy_async();", ""}, \
      {"bar_sync(BAR_DS, 256);  // MUTATION: DS sync 1", ""}, \
      {"wgmma_wait<0>();  // MUTATION: B wait 0", ""}, \
      {"wgmma_wait<0>();  // MUTATION: B wait 1", ""}, \
      {free, ""}, \
      {"mbar_arrive(&empty[st]);  // MUTATION: empty release 0", ""}, \
      {"mbar_arrive(&empty[st]);  // MUTATION: empty release 1", ""}, \
      {"wgmma_fence();  // MUTATION: S fence", ""}, \
      {"wgmma_fence();  // MUTATION: dP fence", ""}, \
      {"wgmma_fence();  // MUTATION: B fence 0", ""}, \
      {"wgmma_fence();  // MUTATION: B fence 1", ""}, \
      {"__syncthreads();  // MUTATION: init barrier", ""}

static const sm90_edit muts_dkv[] = {
    MQA_BWD_SM90_SYNC_MUTS("if (j + 1 < n_iter) bar_arrive(BAR_FREE, 256);"),
    {"!(CAUSAL && key > q_pos0 + row / H)", "true"},
    {"key > q_pos0 + row / H", "key > q_pos0 + row    "},
    {"mbar_wait(&empty[st], ph ^ 1u);", ""}, /* 1 stage */
};

static const sm90_edit muts_dq[] = {
    MQA_BWD_SM90_SYNC_MUTS("if (j + 1 < n_tiles) bar_arrive(BAR_FREE, 256);"),
    {"(CAUSAL && key > q_pos0 + row / H)", "false"},
    {"key > q_pos0 + row / H", "key > q_pos0 + row    "},
    {"mbar_wait(&empty[st], ph ^ 1u);", ""}, /* 1 stage */
};

/* The default run's sample (indices into muts_dkv / muts_dq; every mutation with
 * MLAGEN_TEST_EXHAUSTIVE=1, ctest -C exhaustive): every kind of barrier, wait and fence at
 * least once across the two mirrored kernels (same names, same protocol), and each kernel's
 * proxy fence and a wgmma fence. dkv: the producer's empty mbarrier wait, the S wgmma wait,
 * the P named-barrier arrive, the warpgroup-internal READ bar.sync, the proxy fence, the S
 * wgmma fence; dq: the consumers' full mbarrier wait, the DS bar.sync, the proxy fence, a
 * consumer's empty mbarrier arrive, consumer 1's phase-B wgmma fence; both: the __syncthreads that publishes the mbarrier inits. */
static const int sample_dkv[] = {0, 3, 5, 9, 10, 17, 21};
static const int sample_dq[] = {1, 6, 10, 15, 20, 21};

static void mutations(const sm90_edit *muts, size_t n, const int *sample, size_t n_sample, int sq,
                      int sk, int q_pos0) {
  const int all = kh_sweep_exhaustive();
  print_message("  %s: %zu of %zu mutations\n", all ? "exhaustive" : "sample", all ? n : n_sample, n);
  for (size_t i = 0; i < (all ? n : n_sample); i++) {
    const size_t m = all ? i : (size_t)sample[i];
    mg_kernel_spec s = make_spec(2, 256, 32, 1);
    kh_set(&s, m + 1 < n ? "stages=2" : "stages=1");
    built_kernel bk;
    build_edit(&s, &muts[m], &bk);
    bwd_case c;
    case_init(&c, &bk.kh, 1, sq, sk, q_pos0);
    /* schedules m + 1, ... until one catches it (at most 8) */
    char msg[1024];
    const char *how = NULL;
    unsigned long long seed = 0;
    for (int k = 0; k < 8 && !how; k++) {
      seed = m + 1 + 100ull * (unsigned long long)k;
      if (launch_case(&bk, &c, seed, 0, msg, sizeof msg)) {
        how = "launch reported";
      } else {
        double r[2];
        kt_noise_quiet = 1;
        size_t nans = compare(&c, r, msg, sizeof msg);
        kt_noise_quiet = 0;
        if (nans || msg[0]) how = nans ? "NaN outputs" : "check failed";
      }
    }
    if (!how) fail_msg("removing '%s' was not caught on 8 schedules", muts[m].from);
    print_message("  without '%s' (seed %llu): %s: %.120s\n", muts[m].from, seed, how, msg);
    case_free(&c);
    kh_free(&bk.kh);
  }
}


/* Each removal of a barrier, wait or fence from the rendered source (288/256, H 2, causal,
 * 2 stages; 96 queries at 32 of 128 keys: 2 key tiles, 3 query tiles around the ring) must
 * make the check fail or the launch be reported (a deadlock, a wgmma or named-barrier
 * protocol error) on one of at most 8 schedule seeds (m + 1 + 100 k: a race shows on some
 * schedules only); the producer's empty wait on 1 stage too (every tile reuses the stage). Two numeric mutations too: the causal mask dropped, and the
 * diagonal taken per packed row instead of per token. The default run tries sample_dkv's
 * (sample_dq's for dq), ctest -C exhaustive all of them. */
static void test_mutations_caught(void **state) {
  (void)state;
  mutations(muts_dkv, sizeof muts_dkv / sizeof muts_dkv[0], sample_dkv,
            sizeof sample_dkv / sizeof sample_dkv[0], 96, 128, 32);
}
/* The same for mqa_bwd_dq_sm90 (96 queries at 104 of 200 keys: 3 row tiles, 4 key tiles
 * around the 2-stage ring). */
static void test_dq_mutations_caught(void **state) {
  (void)state;
  g_dq = 1;
  mutations(muts_dq, sizeof muts_dq / sizeof muts_dq[0], sample_dq,
            sizeof sample_dq / sizeof sample_dq[0], 96, 200, 104);
  g_dq = 0;
}

/* Packed sequences: kernel_test_util.h's "many" stream (kt_varlen_many: lengths 1, 2, 3,
 * 17, 0, 64, 200, T = 287, cu padded with T as the executor pads it) in T_CAP token rows. */
#define T_CAP KT_VARLEN_CAP

/* The packed-sequence variants (spec.varlen, "_varlen") of both kernels against the
 * per-document reference (case_init_cu): 288/256, H 2, the default configuration, causal
 * and not, every query over the short documents, over one document of 260 tokens ("one":
 * dkv non-causal, dq causal), and (causal) a shard of the second half
 * (queries at 150..: the 200-token document cut by the shard's start, slack rows at its
 * end); the causal variants at 576/512 compiled for sm_90a with no spill. NaN in every slack
 * row of q, c, dout, LSE and delta. Then wrong boundaries caught: dkv with a key seen by one
 * query position past its range, dq with a row seeing one key past its range (the check
 * fails), dkv writing a slack key's dc from its accumulator instead of 0 (its NaN C rows
 * make it NaN): NaN outputs. */
static void test_varlen(void **state) {
  (void)state;
  const kt_varlen *vl;
  kt_varlen_cases(&vl);
  const kt_varlen *vm = &vl[0], *v1 = &vl[1];
  kh_sweep sw;
  kh_sweep_open(&sw, 56, KH_SWEEP_SMEM | KH_SWEEP_SM90_ONLY | KH_SWEEP_WGMMA_PIPELINED);
  for (g_dq = 0; g_dq < 2; g_dq++) {
    for (int causal = 0; causal <= 1; causal++) {
      mg_kernel_spec s = make_spec(2, 256, 32, causal);
      s.varlen = 1;
      built_kernel bk;
      build_edit(&s, NULL, &bk);
      run_case_cu(&bk, 1, T_CAP, T_CAP, 0, vm->cu, vm->n);
      if (causal == g_dq) run_case_cu(&bk, 1, T_CAP, T_CAP, 0, v1->cu, v1->n); /* one document */
      if (causal) run_case_cu(&bk, 1, T_CAP / 2, T_CAP, T_CAP / 2, vm->cu, vm->n);
      kh_free(&bk.kh);
    }
    mg_kernel_spec s = make_spec(2, 512, 64, 1);
    s.varlen = 1;
    kh_sweep_compile(&sw, &s, "");
  }
  kh_sweep_close(&sw);
  static const struct {
    int dq;
    sm90_edit e;
  } muts[] = {
      {0, {"row < key_hi[k]", "row<=key_hi[k]"}},
      {0, {"slack ? 0u : ", ""}},
      {1, {"key >= row_hi[(i % 4) / 2]", "key > row_hi[(i % 4) / 2]"}},
  };
  for (size_t m = 0; m < sizeof muts / sizeof muts[0]; m++) {
    g_dq = muts[m].dq;
    mg_kernel_spec s = make_spec(2, 256, 32, 1);
    s.varlen = 1;
    built_kernel bk;
    build_edit(&s, &muts[m].e, &bk);
    bwd_case c;
    case_init_cu(&c, &bk.kh, 1, T_CAP, T_CAP, 0, vm->cu, vm->n);
    char msg[1024];
    if (launch_case(&bk, &c, 0, 0, msg, sizeof msg)) fail_msg("launch failed: %s", msg);
    double r[2];
    kt_noise_quiet = 1;
    const size_t nans = compare(&c, r, msg, sizeof msg);
    kt_noise_quiet = 0;
    if (!nans && !msg[0]) fail_msg("'%s' -> '%s' was not caught", muts[m].e.from, muts[m].e.to);
    print_message("  %s '%s' -> '%s': %zu NaN outputs; %.120s\n", bk.kh.name + strlen("mla_"),
                  muts[m].e.from, muts[m].e.to, nans, msg);
    case_free(&c);
    kh_free(&bk.kh);
  }
  g_dq = 0;
}

static void test_deepseek(void **state) { (void)state; deepseek(); }
static void test_dc256(void **state) { (void)state; dc256(); }
static void test_schedules_bit_identical(void **state) { (void)state; schedules_bit_identical(); }
/* mqa_bwd_dq_sm90 on the same cases (its grid: 64 packed query rows per CTA). */
static void test_dq_deepseek(void **state) { (void)state; g_dq = 1; deepseek(); g_dq = 0; }
static void test_dq_dc256(void **state) { (void)state; g_dq = 1; dc256(); g_dq = 0; }
static void test_dq_schedules_bit_identical(void **state) {
  (void)state;
  g_dq = 1;
  schedules_bit_identical();
  g_dq = 0;
}

/* The configurations the template's check keeps compile for sm_90a (NVRTC) with no spill,
 * no stack frame and no static shared memory: the candidates are both kernels, DeepSeek-V3
 * (H 128, 576/512) and the d_c 256 shape (H 40, 288/256), bf16 and fp16, causal and not,
 * every stages value; the default run compiles kh_sweep_cover's covering sample of the kept
 * ones (every pair of factor values, plus the largest shared memory), ctest -C exhaustive
 * all of them; registers and shared memory printed. */
static void test_nvrtc_kept_configs(void **state) {
  (void)state;
  kh_sweep sw;
  kh_sweep_open(&sw, 56, KH_SWEEP_SMEM | KH_SWEEP_REJECTS | KH_SWEEP_SM90_ONLY | KH_SWEEP_WGMMA_PIPELINED);
  sw.max_smem = 227 * 1024;
  mg_kernel_spec cands[40];
  int nc = 0;
  for (int fam = 0; fam < 2; fam++)
    for (int sh = 0; sh < 2; sh++)
      for (int f16 = 0; f16 < 2; f16++)
        for (int causal = 0; causal < 2; causal++)
          for (int st = 1; st <= (fam ? 3 : 2); st++) { /* dq: stages {1, 2, 3}; dkv: {1, 2} */
            char a[16];
            snprintf(a, sizeof a, "stages=%d", st);
            g_fp16 = f16, g_dq = fam;
            cands[nc] = sh == 0 ? make_spec(128, 512, 64, causal) : make_spec(40, 256, 32, causal);
            kh_set(&cands[nc++], a);
          }
  const int kept = kh_sweep_cover(&sw, cands, nc, g_test_seed, "");
  g_dq = 0;
  g_fp16 = 0;
  sm90_sweep_close(&sw, kept, 28); /* 40 candidates, 12 over the shared-memory limit */
}

/* Rejections: 2 stages at 576/512 (shared memory); d_c not a multiple of 64. */
static void test_check_rejects(void **state) {
  (void)state;
  mg_kernel_spec s = make_spec(128, 512, 64, 1);
  kh_set(&s, "stages=2");
  sm90_expect_reject(&s, "bytes of shared memory");
  s = make_spec(16, 160, 32, 1);
  sm90_expect_reject(&s, "d_c must be a multiple of 64");
}

/* The child side of test_asan (kh_run_asan_child: this program as --asan-case, every kernel
 * an ASan build, MG_HOST_ASAN=1): both kernels at 288/256, H 2, causal, the default
 * configuration, on partial tiles: 20 queries at 20 of 40 keys, batch 2 (TMA rows past a
 * batch item's end). Checked per element as the other cases; ASan bounds the global buffers,
 * the dynamic shared memory at the launch's size and the emulator's own buffers. */
static void asan_case_run(void **state) {
  (void)state;
  for (g_dq = 0; g_dq < 2; g_dq++) {
    mg_kernel_spec s = make_spec(2, 256, 32, 1);
    built_kernel bk;
    build_edit(&s, NULL, &bk);
    run_case(&bk, 2, 20, 40, 20);
    kh_free(&bk.kh);
  }
  g_dq = 0;
}

/* ASan finds no out-of-bounds access in the kernels or the Hopper emulation. */
static void test_asan(void **state) {
  (void)state;
  kh_run_asan_child("test_mqa_bwd_sm90", g_test_seed, asan_case_run);
}

/* Every test starts from the file's flags at their defaults (0), as under ctest's one test
 * per process: a test that fails (cmocka longjmps out of it) leaves no flag set for the next
 * one in a direct run of the binary. */
static int fresh_flags(void **state) {
  (void)state;
  g_fp16 = 0; g_dq = 0; g_poison_last = 0;
  return 0;
}

int main(int argc, char **argv) {
  kt_seed_init();
  int rc = kh_test_main(argc, argv, asan_case_run);
  if (rc >= 0) return rc;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_deepseek, fresh_flags),
      cmocka_unit_test_setup(test_dc256, fresh_flags),
      cmocka_unit_test_setup(test_schedules_bit_identical, fresh_flags),
      cmocka_unit_test_setup(test_mutations_caught, fresh_flags),
      cmocka_unit_test_setup(test_dq_deepseek, fresh_flags),
      cmocka_unit_test_setup(test_dq_dc256, fresh_flags),
      cmocka_unit_test_setup(test_dq_schedules_bit_identical, fresh_flags),
      cmocka_unit_test_setup(test_dq_mutations_caught, fresh_flags),
      cmocka_unit_test_setup(test_check_rejects, fresh_flags),
      cmocka_unit_test_setup(test_varlen, fresh_flags),
      cmocka_unit_test_setup(test_nvrtc_kept_configs, fresh_flags),
      cmocka_unit_test_setup(test_asan, fresh_flags),
  };
  return kh_exit_code(cmocka_run_group_tests(tests, NULL, kt_noise_teardown));
}
