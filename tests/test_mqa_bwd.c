/* test_mqa_bwd.c: the absorbed-form MQA attention backward (templates/mqa_bwd_dkv.cu.tpl,
 * mqa_bwd_dq.cu.tpl, with attn_bwd_pre.cu.tpl generated for d_v = d_c as its delta pass),
 * run unchanged on the CPU through the host executor (tests/host/: shuffled schedules,
 * NaN-filled shared memory) against the float64 reference of tests/mqa_ref.h; and every
 * configuration the templates' checks keep, compiled by NVRTC for sm_80 and sm_90a without
 * spills.
 *
 * Inputs are random bf16 values (fp16 in test_fp16; the seed is printed, MLAGEN_TEST_SEED
 * overrides it), scores with standard deviation 2 under DeepSeek's YaRN softmax scale. The
 * reference forward gives o (rounded to 16 bits) and lse (rounded to fp32), as mqa_fwd
 * stores them; the reference gradients dq and dc are float64 from mqa_ref_bwd_mixed (P from
 * the stored lse, delta from the stored o, P and scale dS rounded to 16 bits as the kernels'
 * MMA operands). Every gradient (dq, dc[:, :d_c], dc[:, d_c:]) is compared per element
 * (kt_check; the figures at compare()); test_mutations_caught injects a bug into the
 * rendered dkv and requires the check to fail. MLAGEN_TEST_FILTER (a cmocka pattern) runs
 * a subset: ctest runs each test as its own entry. */
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
#include "mqa_ref.h"

typedef void (*pre_fn)(const e16 *o, const e16 *dout, float *delta, float *dq_accum,
                       int seqlen_q);
/* mqa_bwd_dkv and mqa_bwd_dq share the signature (out: dc or dq). */
typedef void (*mqa_fn)(const e16 *q, const e16 *c, const e16 *dout, const float *lse,
                       const float *delta, e16 *out, int seqlen_q, int seqlen_k, int q_pos0,
                       float softmax_scale);
/* Their packed-sequence variants (spec.varlen): the same, then cu_seqlens, n_seqs. */
typedef void (*mqa_varlen_fn)(const e16 *q, const e16 *c, const e16 *dout, const float *lse,
                              const float *delta, e16 *out, int seqlen_q, int seqlen_k,
                              int q_pos0, float softmax_scale, const int *cu_seqlens, int n_seqs);

/* dq_convert, reused for the fp32 dc_accum of mqa_bwd_dkv with qsplit > 1 (heads = 1). */
typedef void (*conv_fn)(const float *accum, e16 *out, int rows);

enum { FAM_PRE, FAM_DKV, FAM_DQ, FAM_CONV };

typedef struct built_kernel {
  kh_kernel kh;  /* fn, threads, smem, name, spec */
  int fam;
  int rows;      /* query rows (pre), keys (dkv) or packed rows (dq) per CTA */
  int qsplit;    /* dkv: CTAs per key tile (> 1: fp32 atomics into dc_accum) */
  int varlen;    /* the packed-sequence variant (mqa_varlen_fn) */
} built_kernel;

static void set(mg_kernel_spec *s, const char *assignment) { kh_set(s, assignment); }

/* The element type of the kernels built next and of the cases' 16-bit data (bf16 unless a
 * test sets fp16). */
static int g_fp16;
static e16 float_to_e(float x) { return float_to_e16(g_fp16, x); }

/* 1: make_spec gives mqa_bwd_dkv and mqa_bwd_dq their packed-sequence variants
 * (attn_bwd_pre stays unpacked: its delta of slack rows is NaN, which they must not read). */
static int g_varlen;

/* The absorbed kernels read d_c and d_r; d_n and d_v are the explicit form's (ignored).
 * attn_bwd_pre computes delta over d_v columns: it gets d_v = d_n = d_c. */
static mg_kernel_spec make_spec(const char *family, int H, int dc, int dr, int causal) {
  mg_kernel_spec s;
  memset(&s, 0, sizeof s);
  snprintf(s.family, sizeof s.family, "%s", family);
  const int pre = !strcmp(family, "attn_bwd_pre");
  s.heads = H, s.d_c = dc, s.d_r = dr, s.causal = causal;
  s.d_n = pre ? dc : 128, s.d_v = pre ? dc : 128;
  s.varlen = g_varlen && (!strcmp(family, "mqa_bwd_dkv") || !strcmp(family, "mqa_bwd_dq"));
  snprintf(s.dtype, sizeof s.dtype, "%s", g_fp16 ? "fp16" : "bf16");
  return s;
}

/* Generates the kernel for spec and builds it with the host executor (the harness keys its
 * objects by content). drop >= 0: without that barrier; returns 0 when there is none. */
static int build_edit(const mg_kernel_spec *spec, kh_edit_fn edit, void *ctx, built_kernel *out);

static int build_src(const mg_kernel_spec *spec, int drop, built_kernel *out) {
  kh_drop dr = {.which = drop};
  return build_edit(spec, drop >= 0 ? kh_drop_edit : NULL, &dr, out);
}

/* build_src with any edit of the source (NULL: none); returns 0 when the edit declined. */
static int build_edit(const mg_kernel_spec *spec, kh_edit_fn edit, void *ctx, built_kernel *out) {
  memset(out, 0, sizeof *out);
  if (!kh_build_edited(NULL, spec, 0, edit, ctx, &out->kh)) return 0;
  const kh_kernel *k = &out->kh;
  out->fam = !strcmp(spec->family, "attn_bwd_pre")  ? FAM_PRE
             : !strcmp(spec->family, "mqa_bwd_dkv") ? FAM_DKV
             : !strcmp(spec->family, "dq_convert")  ? FAM_CONV
                                                    : FAM_DQ;
  out->rows = out->fam == FAM_PRE   ? kh_config_int(k, "num_warps") * kh_config_int(k, "rows_per_warp")
              : out->fam == FAM_DKV ? kh_config_int(k, "block_n")
              : out->fam == FAM_DQ  ? kh_config_int(k, "block_m")
                                    : 1;
  out->qsplit = out->fam == FAM_DKV ? kh_config_int(k, "qsplit") : 1;
  out->varlen = spec->varlen;
  assert_int_equal(kh_launch_value(k, "smem_static"), 0);
  return 1;
}

static void build(const mg_kernel_spec *spec, built_kernel *out) { build_src(spec, -1, out); }

/* One case: bf16 inputs, the float64 forward (o, lse) and gradients, the kernels' outputs. */
typedef struct mqa_case {
  int B, sq, sk, H, dc, dr, q_pos0;
  const int *cu; /* packed sequences: cu [n_cu + 1], batch 1 (NULL: not packed) */
  int n_cu;
  float scale;
  e16 *q, *c, *dout, *o16;
  float *lse32;
  size_t nq, nc, no, nl;
  double *r_dq, *r_dc;
  double *f_dq, *f_dc; /* their bounds for ambiguous 16-bit roundings (mqa_ref.h) */
  float *delta, *dc_accum;
  e16 *dq, *dcout;
  int poisoned; /* 1: the last batch item's inputs are NaN (g_poison_last): not compared */
} mqa_case;

/* 1: case_init_cu fills every input of the last batch item (q, c, dout, and the stored o and
 * lse, so attn_bwd_pre's delta too) with NaN after the reference is made, and compare checks
 * the items before it only: a CTA's tile rows past its item's end must not bring the next
 * item's values in (0 * NaN would be NaN). */
static int g_poison_last;

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

/* The relative size of the kernels' own fp32 error in a P or dS element, for mqa_ref.h's
 * bound of ambiguous 16-bit roundings (see the tolerances below). */
#define FLIP_EPS 3e-5

/* Packed (cu not NULL, B 1): every slack row (token >= cu[n_cu]) of q, c, dout, o16 and
 * lse32 is NaN, before the reference runs (it reads none of them). */
static void case_init_cu(mqa_case *c, int H, int dc, int dr, int causal, int B, int sq, int sk,
                         int q_pos0, const int *cu, int n_cu) {
  const int w = dc + dr;
  memset(c, 0, sizeof *c);
  c->B = B, c->sq = sq, c->sk = sk, c->H = H, c->dc = dc, c->dr = dr, c->q_pos0 = q_pos0;
  c->cu = cu, c->n_cu = n_cu;
  /* as the explicit head dim d_qk = w / 3 would have it, times DeepSeek's mscale^2 */
  c->scale = (float)kt_softmax_scale(w / 3);
  c->nq = (size_t)B * sq * H * w;
  c->nc = (size_t)B * sk * w;
  c->no = (size_t)B * sq * H * dc;
  c->nl = (size_t)B * H * sq;
  double *qd = xcalloc(c->nq, sizeof *qd), *cd = xcalloc(c->nc, sizeof *cd);
  double *dod = xcalloc(c->no, sizeof *dod), *od = xcalloc(c->no, sizeof *od);
  double *lsed = xcalloc(c->nl, sizeof *lsed);
  c->q = rand_e16(c->nq, kt_q_sd(c->scale, w), qd); /* scores with sd 2 */
  c->c = rand_e16(c->nc, 1, cd);
  c->dout = rand_e16(c->no, 1, dod);
  const int T = cu ? cu[n_cu] : 0;
  for (int i = 0; cu && i < sq; i++)
    if (q_pos0 + i >= T) {
      for (size_t k = 0; k < (size_t)H * w; k++) c->q[(size_t)i * H * w + k] = 0x7fff, qd[(size_t)i * H * w + k] = NAN;
      for (size_t k = 0; k < (size_t)H * dc; k++) c->dout[(size_t)i * H * dc + k] = 0x7fff, dod[(size_t)i * H * dc + k] = NAN;
    }
  for (int j = T; cu && j < sk; j++)
    for (int k = 0; k < w; k++) c->c[(size_t)j * w + k] = 0x7fff, cd[(size_t)j * w + k] = NAN;
  mqa_ref_fwd_varlen(B, sq, sk, H, dc, dr, causal, q_pos0, cu, n_cu, c->scale, qd, cd, od, lsed);
  c->o16 = xcalloc(c->no, sizeof *c->o16);
  c->lse32 = xcalloc(c->nl, sizeof *c->lse32);
  for (size_t i = 0; i < c->no; i++) c->o16[i] = float_to_e((float)od[i]);
  for (size_t i = 0; i < c->nl; i++) c->lse32[i] = (float)lsed[i];
  for (int i = 0; cu && i < sq; i++)
    if (q_pos0 + i >= T) {
      for (size_t k = 0; k < (size_t)H * dc; k++) c->o16[(size_t)i * H * dc + k] = 0x7fff;
      for (int h = 0; h < H; h++) c->lse32[(size_t)h * sq + i] = NAN;
    }
  c->r_dq = xcalloc(c->nq, sizeof *c->r_dq);
  c->r_dc = xcalloc(c->nc, sizeof *c->r_dc);
  c->f_dq = xcalloc(c->nq, sizeof *c->f_dq);
  c->f_dc = xcalloc(c->nc, sizeof *c->f_dc);
  /* the gradients from the stored o16 and lse32, P and scale dS rounded to 16 bits */
  for (size_t i = 0; i < c->no; i++) od[i] = e16_to_float(g_fp16, c->o16[i]);
  for (size_t i = 0; i < c->nl; i++) lsed[i] = c->lse32[i];
  mqa_ref_bwd_mixed_varlen(B, sq, sk, H, dc, dr, causal, q_pos0, cu, n_cu, c->scale, qd, cd, dod,
                           od, lsed, kt_round_fn(g_fp16), FLIP_EPS, c->f_dq, c->f_dc, c->r_dq,
                           c->r_dc);
  if (g_poison_last && B > 1) {
    kt_nan_last_item_e16(c->q, c->nq, B), kt_nan_last_item_e16(c->c, c->nc, B);
    kt_nan_last_item_e16(c->dout, c->no, B), kt_nan_last_item_e16(c->o16, c->no, B);
    kt_nan_last_item_f32(c->lse32, c->nl, B);
    c->poisoned = 1;
  }
  c->delta = xcalloc(c->nl, sizeof *c->delta);
  c->dq = xcalloc(c->nq, sizeof *c->dq);
  c->dcout = xcalloc(c->nc, sizeof *c->dcout);
  c->dc_accum = xcalloc(c->nc, sizeof *c->dc_accum);
  free(qd), free(cd), free(dod), free(od), free(lsed);
}

static void case_init(mqa_case *c, int H, int dc, int dr, int causal, int B, int sq, int sk,
                      int q_pos0) {
  case_init_cu(c, H, dc, dr, causal, B, sq, sk, q_pos0, NULL, 0);
}

static void case_free(mqa_case *c) {
  free(c->q), free(c->c), free(c->dout), free(c->o16), free(c->lse32);
  free(c->r_dq), free(c->r_dc), free(c->f_dq), free(c->f_dc), free(c->delta), free(c->dq), free(c->dcout);
  free(c->dc_accum);
}

typedef struct launch_args {
  const built_kernel *bk;
  mqa_case *c;
} launch_args;

static void thunk(void *p) {
  launch_args *a = p;
  mqa_case *c = a->c;
  if (a->bk->fam == FAM_PRE)
    ((pre_fn)a->bk->kh.fn)(c->o16, c->dout, c->delta, NULL, c->sq);
  else if (a->bk->fam == FAM_CONV)
    ((conv_fn)a->bk->kh.fn)(c->dc_accum, c->dcout, c->sk);
  else if (a->bk->varlen) /* dkv or dq; dkv with qsplit > 1 adds into dc_accum */
    ((mqa_varlen_fn)(void (*)(void))a->bk->kh.fn)(
        c->q, c->c, c->dout, c->lse32, c->delta,
        a->bk->fam == FAM_DQ ? c->dq : a->bk->qsplit > 1 ? (e16 *)(void *)c->dc_accum : c->dcout,
        c->sq, c->sk, c->q_pos0, c->scale, c->cu, c->n_cu);
  else if (a->bk->fam == FAM_DKV && a->bk->qsplit > 1)
    ((mqa_fn)a->bk->kh.fn)(c->q, c->c, c->dout, c->lse32, c->delta, (e16 *)(void *)c->dc_accum,
                        c->sq, c->sk, c->q_pos0, c->scale);
  else
    ((mqa_fn)a->bk->kh.fn)(c->q, c->c, c->dout, c->lse32, c->delta,
                        a->bk->fam == FAM_DKV ? c->dcout : c->dq, c->sq, c->sk, c->q_pos0,
                        c->scale);
}

static void launch(const built_kernel *bk, mqa_case *c, const mg_host_launch_opts *lo) {
  mg_host_dim3 grid;
  const unsigned rows = (unsigned)bk->rows;
  switch (bk->fam) { /* the manifests' launch rules */
    case FAM_PRE:
      grid = (mg_host_dim3){((unsigned)c->sq + rows - 1) / rows, (unsigned)c->H, (unsigned)c->B};
      break;
    case FAM_DKV: /* {seqlen_k, div = block_n}, qsplit, batch */
      grid = (mg_host_dim3){((unsigned)c->sk + rows - 1) / rows, (unsigned)bk->qsplit, (unsigned)c->B};
      break;
    case FAM_CONV: /* seqlen_q (here S_k), 1, batch */
      grid = (mg_host_dim3){(unsigned)c->sk, 1, (unsigned)c->B};
      break;
    default: /* {seqlen_q, mul = H, div = block_m}, 1, batch */
      grid = (mg_host_dim3){((unsigned)(c->sq * c->H) + rows - 1) / rows, 1, (unsigned)c->B};
  }
  if (grid.x == 0) return;
  launch_args a = {bk, c};
  kh_launch(&bk->kh, grid, lo, thunk, &a);
}

/* The three kernels for one spec: attn_bwd_pre (delta), mqa_bwd_dkv, mqa_bwd_dq. */
typedef struct bwd_set {
  built_kernel pre, dkv, dq, conv; /* conv: dq_convert for dkv's qsplit > 1 */
} bwd_set;

static void set_build(bwd_set *bs, int H, int dc, int dr, int causal, const char *const *dkv_cfg,
                      const char *const *dq_cfg) {
  mg_kernel_spec s = make_spec("attn_bwd_pre", H, dc, dr, causal);
  build(&s, &bs->pre);
  s = make_spec("mqa_bwd_dkv", H, dc, dr, causal);
  for (int i = 0; dkv_cfg && dkv_cfg[i]; i++) set(&s, dkv_cfg[i]);
  build(&s, &bs->dkv);
  s = make_spec("mqa_bwd_dq", H, dc, dr, causal);
  for (int i = 0; dq_cfg && dq_cfg[i]; i++) set(&s, dq_cfg[i]);
  build(&s, &bs->dq);
  memset(&bs->conv, 0, sizeof bs->conv);
  if (bs->dkv.qsplit > 1) { /* dc_accum [B, S_k, 1, d_c + d_r] -> 16 bits */
    s = make_spec("dq_convert", 1, dc, dr, causal);
    s.d_n = dc;
    build(&s, &bs->conv);
  }
}

static void set_unload(bwd_set *bs) {
  kh_free(&bs->pre.kh);
  kh_free(&bs->dkv.kh);
  kh_free(&bs->dq.kh);
  kh_free(&bs->conv.kh);
}

/* Runs the pipeline; every output is NaN first. */
static double run_pipeline(const bwd_set *bs, mqa_case *c, const mg_host_launch_opts *lo) {
  for (size_t i = 0; i < c->nl; i++) c->delta[i] = NAN;
  for (size_t i = 0; i < c->nq; i++) c->dq[i] = 0x7fff;
  for (size_t i = 0; i < c->nc; i++) c->dcout[i] = 0x7fff;
  for (size_t i = 0; i < c->nc; i++) c->dc_accum[i] = bs->dkv.qsplit > 1 ? 0.f : NAN;
  double t0 = kh_now();
  launch(&bs->pre, c, lo);
  launch(&bs->dkv, c, lo);
  launch(&bs->dq, c, lo);
  if (bs->dkv.qsplit > 1) launch(&bs->conv, c, lo);
  return kh_now() - t0;
}

/* max |got - ref| / max |ref| over columns [c0, c1) of rows of width w. */
static double rel_err(const e16 *got, const double *ref, size_t rows, int w, int c0, int c1,
                      size_t *nans) {
  return kt_rel_err_e16_cols(g_fp16, got, ref, rows, (size_t)w, (size_t)c0, (size_t)c1, nans);
}

/* Tolerances, per element: |err| <= atol_frac * rms(gradient part) + rtol |ref| + flip
 * (kernel_test_util.h), flip mqa_ref.h's bound for the P and scale dS elements within
 * FLIP_EPS (relative) of a 16-bit rounding boundary, so that a rounding the kernel makes the
 * other way loosens only the elements it touches. rtol: u of the 16-bit storage (its own
 * rounding). atol_frac is twice NOISE_*, the largest noise figure (max (|err| - rtol |ref|
 * - flip) / rms) measured by kt_noise_report over every case of the numeric tests of this
 * file (test_deepseek_h2, test_deepseek_h16, test_small_latent_h2, test_heads_1_and_128,
 * test_deterministic_bit_identical, test_configs, test_fp16; MLAGEN_TEST_SEED 21, 22, 23;
 * host executor): dq 5.4e-8, dc_kv 2.0e-8, dk_rope 0: fp32 accumulation order only, so
 * NOISE_* is at least 1e-6 (three seeds do not size the tail of such small figures). Before
 * the flip bound (rtol 2 u instead) they were 7.7e-3, 2.2e-3 and 2.2e-3. */
#define NOISE_DQ 1e-6
#define NOISE_DC 1e-6
#define NOISE_DKR 1e-6

/* Compares dq, dc[:, :d_c] and dc[:, d_c:] per element; ratio[i]: their worst err / bound
 * (over 1 fails). Returns the number of NaN outputs; the first failure's message goes to
 * msg (msg[0] = 0 when all pass). */
static size_t compare(const mqa_case *c, double ratio[3], char *msg, size_t n) {
  const size_t nb = (size_t)(c->B - c->poisoned); /* the items compared */
  const size_t w = (size_t)(c->dc + c->dr), qrows = nb * c->sq * c->H;
  const size_t krows = nb * c->sk, dc = (size_t)c->dc;
  const int kind = g_fp16 ? KT_F16 : KT_BF16;
  const double rtol = kt_unit_roundoff(kind);
  kt_checked k[3];
  k[0] = kt_check_slack("mqa_bwd dq", kind, c->dq, c->r_dq, c->f_dq, qrows, w, 0, w,
                        (kt_tol){2 * NOISE_DQ, rtol}, 0);
  k[1] = kt_check_slack("mqa_bwd dc_kv", kind, c->dcout, c->r_dc, c->f_dc, krows, w, 0, dc,
                        (kt_tol){2 * NOISE_DC, rtol}, 0);
  k[2] = kt_check_slack("mqa_bwd dk_rope", kind, c->dcout, c->r_dc, c->f_dc, krows, w, dc, w,
                        (kt_tol){2 * NOISE_DKR, rtol}, 0);
  size_t nans = 0;
  if (msg) msg[0] = 0;
  for (int i = 0; i < 3; i++) {
    ratio[i] = k[i].r.n ? k[i].r.worst_ratio : 0;
    nans += (size_t)(k[i].r.worst_ratio == INFINITY);
    if (msg && !msg[0] && k[i].r.n && !cc_ok(&k[i].r)) snprintf(msg, n, "%s", k[i].msg);
  }
  return nans;
}

/* 1 when every gradient passes per element. */
static int grads_ok(const mqa_case *c) {
  double r[3];
  char msg[8];
  kt_noise_quiet = 1; /* a kernel without a barrier: its errors are not noise */
  compare(c, r, msg, sizeof msg);
  kt_noise_quiet = 0;
  return !msg[0];
}

static void check(const bwd_set *bs, mqa_case *c, double secs) {
  double r[3];
  char msg[400];
  compare(c, r, msg, sizeof msg);
  print_message("  %s B=%d S_q=%d S_k=%d q_pos0=%d: err/bound dq %.2f dc_kv %.2f dk_rope %.2f (%.2f s)\n",
                bs->dkv.kh.name + strlen("mla_mqa_bwd_dkv_"), c->B, c->sq, c->sk, c->q_pos0, r[0], r[1],
                r[2], secs);
  if (msg[0]) fail_msg("%s", msg);
}

static void run_case(const bwd_set *bs, int causal, int B, int sq, int sk, int q_pos0) {
  mqa_case c;
  const mg_kernel_spec *s = &bs->dkv.kh.spec;
  case_init(&c, s->heads, s->d_c, s->d_r, causal, B, sq, sk, q_pos0);
  double secs = run_pipeline(bs, &c, NULL);
  check(bs, &c, secs);
  case_free(&c);
}

/* Causal and not, defaults: S = 1; S = 37 with batch 2 (no tile divides it, nor S H; 13
 * when not full), and again with NaN in every input of item 1 (item 0 checked: batch
 * isolation); (full) a query shard at global position 30 of 50 keys (S_q < S_k, causal tiles
 * cross the diagonal); 8 queries at 0 of 70 keys (causal: key tiles no query sees get
 * dc = 0). */
static void check_shape(int H, int dc, int dr, int full) {
  for (int causal = 1; causal >= 0; causal--) {
    bwd_set bs;
    set_build(&bs, H, dc, dr, causal, NULL, NULL);
    run_case(&bs, causal, 1, 1, 1, 0);
    const int S2 = full ? 37 : 13; /* the batch-2 case's length */
    run_case(&bs, causal, 2, S2, S2, 0);
    g_poison_last = 1; /* the same with NaN in every input of item 1: item 0 unchanged */
    run_case(&bs, causal, 2, S2, S2, 0);
    g_poison_last = 0;
    if (full) run_case(&bs, causal, 1, 20, 50, 30);
    run_case(&bs, causal, 1, 8, 70, 0);
    run_case(&bs, causal, 1, 64, 64, 0); /* every row and key tile full */
    set_unload(&bs);
  }
}

static void test_deepseek_h2(void **state) { (void)state; check_shape(2, 512, 64, 1); }
static void test_deepseek_h16(void **state) { (void)state; check_shape(16, 512, 64, 0); }
static void test_small_latent_h2(void **state) { (void)state; check_shape(2, 256, 32, 1); }

/* One head (plain MQA rows) and 128 heads (one token is 128 packed rows: 4 query tiles of
 * dkv, 4 CTAs of dq at block_m 32), causal, defaults. */
static void test_heads_1_and_128(void **state) {
  (void)state;
  bwd_set bs;
  set_build(&bs, 1, 256, 32, 1, NULL, NULL);
  run_case(&bs, 1, 2, 37, 37, 0);
  run_case(&bs, 1, 1, 20, 50, 30);
  set_unload(&bs);
  set_build(&bs, 128, 512, 64, 1, NULL, NULL);
  run_case(&bs, 1, 1, 1, 1, 0);
  run_case(&bs, 1, 2, 3, 40, 30);
  set_unload(&bs);
}

/* The default gives the same bits under other schedules (seeds 1, 0x9e37... and round
 * robin): dc has one owner CTA per row summing in a fixed order, dq one thread per element. */
static void test_deterministic_bit_identical(void **state) {
  (void)state;
  bwd_set bs;
  set_build(&bs, 2, 512, 64, 1, NULL, NULL);
  mqa_case c;
  case_init(&c, 2, 512, 64, 1, 2, 37, 37, 0);
  mg_host_launch_opts lo;
  memset(&lo, 0, sizeof lo);
  lo.seed = 1;
  check(&bs, &c, run_pipeline(&bs, &c, &lo));
  kt_snapshot out0 = {.n = 2, .p = {c.dq, c.dcout},
                      .size = {c.nq * sizeof *c.dq, c.nc * sizeof *c.dcout}};
  kt_snapshot_take(&out0);
  for (int i = 0; i < 2; i++) {
    memset(&lo, 0, sizeof lo);
    if (i == 0)
      lo.seed = 0x9e3779b97f4a7c15ull;
    else
      lo.round_robin = 1;
    run_pipeline(&bs, &c, &lo);
    if (!kt_snapshot_same(&out0))
      fail_msg("%s: another schedule gives other bits", bs.dkv.kh.name);
  }
  print_message("  %s + %s: seeds 1, 0x9e37... and round robin: dq, dc bit-identical\n",
                bs.dkv.kh.name, bs.dq.kh.name);
  kt_snapshot_free(&out0);
  case_free(&c);
  set_unload(&bs);
}

/* Each kernel with one of its barriers removed, for each barrier (the one that publishes a
 * tile's copies, the one that publishes P^T / dS^T written by other warps and, with one
 * stage, the one before a tile's buffers are refilled): every schedule seed must give a
 * wrong result (NaN-filled shared memory, shuffled warps), or the test would not see a
 * missing barrier. */
static void test_missing_barrier_caught(void **state) {
  (void)state;
  static const struct {
    const char *family, *stages;
  } kernels[] = {{"mqa_bwd_dkv", "stages=1"}, {"mqa_bwd_dkv", "stages=2"},
                 {"mqa_bwd_dq", "stages=1"}, {"mqa_bwd_dq", "stages=2"}};
  for (size_t ki = 0; ki < sizeof kernels / sizeof kernels[0]; ki++) {
    int n = 0;
    for (int which = 0;; which++) {
      bwd_set bs;
      memset(&bs, 0, sizeof bs);
      mg_kernel_spec s = make_spec(kernels[ki].family, 2, 256, 32, 1);
      set(&s, kernels[ki].stages);
      const int is_dq = !strcmp(kernels[ki].family, "mqa_bwd_dq");
      built_kernel *target = is_dq ? &bs.dq : &bs.dkv;
      if (!build_src(&s, which, target)) break;
      n++;
      mg_kernel_spec o = make_spec("attn_bwd_pre", 2, 256, 32, 1);
      build(&o, &bs.pre);
      o = make_spec(is_dq ? "mqa_bwd_dkv" : "mqa_bwd_dq", 2, 256, 32, 1);
      build(&o, is_dq ? &bs.dkv : &bs.dq);
      mqa_case c;
      case_init(&c, 2, 256, 32, 1, 2, 21, 45, 24); /* 2 key tiles (dq), 2 query tiles (dkv) */
      int caught = 0;
      for (unsigned long long seed = 1; seed <= 3; seed++) {
        mg_host_launch_opts lo;
        memset(&lo, 0, sizeof lo);
        lo.seed = seed;
        run_pipeline(&bs, &c, &lo);
        const int w = c.dc + c.dr;
        size_t nans = 0;
        const double e = is_dq ? rel_err(c.dq, c.r_dq, (size_t)c.B * c.sq * c.H, w, 0, w, &nans)
                               : rel_err(c.dcout, c.r_dc, (size_t)c.B * c.sk, w, 0, w, &nans);
        caught += nans || !grads_ok(&c); (void)e;
      }
      print_message("  %s without barrier %d: caught by %d of 3 seeds\n", target->kh.name, which, caught);
      if (caught < 3)
        fail_msg("%s: barrier %d removed, yet some schedule gives the right result", target->kh.name,
                 which);
      case_free(&c);
      set_unload(&bs);
    }
    assert_true(n >= 2);
  }
}

/* fp16 inputs and outputs: the defaults at 576/512, causal. */
static void test_fp16(void **state) {
  (void)state;
  g_fp16 = 1;
  bwd_set bs;
  set_build(&bs, 2, 512, 64, 1, NULL, NULL);
  run_case(&bs, 1, 2, 37, 37, 0);
  set_unload(&bs);
  g_fp16 = 0;
}

/* Other kept configurations give right answers: 1 stage and 2, nsplit 1, 2 and 4 (8-column
 * tails at d_r 32), mtiles 1 and 2, block sizes 16 to 64; dkv with qsplit > 1 (fp32 atomics
 * into dc_accum, then dq_convert at heads = 1). */
static void test_configs(void **state) {
  (void)state;
  static const struct {
    int H, dc, dr, causal;
    const char *dkv[6];
    const char *dq[6];
  } cfgs[] = {
      {2, 256, 32, 1, {"block_n=16", "nsplit=4", "block_m=64", "stages=1", "mtiles=1"},
       {"block_m=16", "nsplit=4", "block_n=64", "stages=1", "mtiles=1"}},
      {3, 256, 32, 0, {"block_n=64", "nsplit=1", "block_m=16", "stages=2", NULL},
       {"block_m=64", "nsplit=1", "block_n=16", "stages=2", NULL}},
      {2, 512, 64, 1, {"block_n=16", "nsplit=4", "block_m=64", "stages=1", "mtiles=1"},
       {"block_m=32", "nsplit=4", "block_n=64", "stages=1", "mtiles=1"}},
      {2, 512, 64, 1, {"qsplit=4", "mtiles=1", NULL}, {"mtiles=1", NULL}}, /* fp32 atomics, then dq_convert */
      {16, 256, 32, 1, {"qsplit=2", "stages=2", NULL}, {NULL}},
  };
  for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
    bwd_set bs;
    set_build(&bs, cfgs[i].H, cfgs[i].dc, cfgs[i].dr, cfgs[i].causal, cfgs[i].dkv, cfgs[i].dq);
    run_case(&bs, cfgs[i].causal, 2, 29, 29, 0);
    run_case(&bs, cfgs[i].causal, 1, 21, 45, 24);
    set_unload(&bs);
  }
}

/* The configurations of the two families' tunable spaces that their checks keep compile
 * for sm_80 and sm_90a without spills or a stack frame (causal), for d_c 512 / d_r 64 at
 * H = 16 and d_c 256 / d_r 32 at H = 128, and so do dkv's default with qsplit 8 and
 * attn_bwd_pre's default at d_v = d_c; the defaults' figures are printed. Uses the JIT
 * cache ($MLAGEN_CACHE_DIR). Every configuration is rendered (the templates' checks run on
 * all); a covering sample is compiled (kh_sweep_cover: every tunable value and pair of
 * values at d_c 512 / d_r 64, DeepSeek-V3's; every single value at d_c 256 / d_r 32; and
 * the most shared memory), all of them with MLAGEN_TEST_EXHAUSTIVE=1 (ctest -C
 * exhaustive -L exhaustive; the whole sweep took 189 s with a cold cache). One cmocka test
 * per shape (only: 0 or 1) and part (dkv: 1 for mqa_bwd_dkv, 0 for mqa_bwd_dq and
 * attn_bwd_pre). */
static void nvrtc_all_kept_configs(size_t only, int dkv) {
  static const struct {
    int H, dc, dr;
  } shapes[] = {{16, 512, 64}, {128, 256, 32}};
  static const char *const families[] = {"mqa_bwd_dkv", "mqa_bwd_dq", "attn_bwd_pre"};
  static const char *const tunables[2][5] = {{"block_n", "nsplit", "block_m", "stages", "mtiles"},
                                             {"block_m", "nsplit", "block_n", "stages", "mtiles"}};
  static const int values[5][3] = {{16, 32, 64}, {1, 2, 4}, {16, 32, 64}, {1, 2, 0}, {1, 2, 0}};
  kh_sweep sw;
  /* pairs of values for the DeepSeek-V3 shape, single values for the other (as
   * test_attn_bwd's sweeps) */
  kh_sweep_open(&sw, 62, KH_SWEEP_SMEM | KH_SWEEP_REJECTS | KH_SWEEP_QUIET_REJECTS |
                             (only != 0 ? KH_SWEEP_SINGLES : 0));
  int kept = 0;
  static mg_kernel_spec cands[3 * 3 * 3 * 2 * 2];
  for (size_t si = only; si == only; si++)
    for (int f = dkv ? 0 : 1; f < (dkv ? 1 : 3); f++) {
      int nc = 0;
      for (int ci = -2; ci < 3 * 3 * 3 * 2 * 2; ci++) { /* -1: the default; -2: dkv's, qsplit 8 */
        if ((ci == -2 && f != 0) || (ci >= 0 && f == 2)) continue; /* attn_bwd_pre: its default */
        mg_kernel_spec s = make_spec(families[f], shapes[si].H, shapes[si].dc, shapes[si].dr, 1);
        if (ci == -2) set(&s, "qsplit=8");
        if (ci >= 0) {
          int v[5] = {ci % 3, ci / 3 % 3, ci / 9 % 3, ci / 27 % 2, ci / 54};
          for (int j = 0; j < 5; j++) {
            char a[48];
            snprintf(a, sizeof a, "%s=%d", tunables[f][j], values[j][v[j]]);
            set(&s, a);
          }
          cands[nc++] = s; /* the space: a covering sample of it below */
          continue;
        }
        if (kh_sweep_compile(&sw, &s, ci == -1 ? "default " : "")) kept += ci != -1;
      }
      kept += kh_sweep_cover(&sw, cands, nc, g_test_seed, "");
    }
  kh_sweep_print_defaults(&sw); /* the defaults again, together */
  print_message("  %d configurations kept, %d rejected by the templates' checks (%.0f s)\n", kept,
                sw.rejected, kh_now() - sw.t0);
  assert_true(kept >= 2);
  kh_sweep_close(&sw);
}
static void test_nvrtc_576_dkv(void **state) { (void)state; nvrtc_all_kept_configs(0, 1); }
static void test_nvrtc_576_dq_pre(void **state) { (void)state; nvrtc_all_kept_configs(0, 0); }
static void test_nvrtc_288_dkv(void **state) { (void)state; nvrtc_all_kept_configs(1, 1); }
static void test_nvrtc_288_dq_pre(void **state) { (void)state; nvrtc_all_kept_configs(1, 0); }

/* Mutation test (issue 12): mqa_bwd_dkv with the k_rope part of dc dropped (written as 0),
 * injected into the rendered source by a string edit (kt_mutate_edit: the pattern must
 * match exactly once), must fail the per-element check on every shape of check_shape with
 * more than one key, for a numerical reason (it compiles, launches, completes without NaN
 * and dk_rope is off). */
static void test_mutations_caught(void **state) {
  (void)state;
  static kt_mutation m = {"dc: the k_rope part dropped",
                          "mla::pack2<elem_t>(dracc[m][d][2 * r], dracc[m][d][2 * r + 1])", "mla::pack2<elem_t>(0.f, 0.f)",
                          NULL, ""};
  static const int shapes[][4] = {{2, 37, 37, 0}, {1, 20, 50, 30}, {1, 8, 70, 0}};
  kt_noise_quiet = 1; /* not noise: kt_noise_report leaves these out */
  for (int causal = 1; causal >= 0; causal--) {
    bwd_set bs;
    memset(&bs, 0, sizeof bs);
    mg_kernel_spec s = make_spec("attn_bwd_pre", 2, 256, 32, causal);
    build(&s, &bs.pre);
    s = make_spec("mqa_bwd_dq", 2, 256, 32, causal);
    build(&s, &bs.dq);
    s = make_spec("mqa_bwd_dkv", 2, 256, 32, causal);
    if (!build_edit(&s, kt_mutate_edit, &m, &bs.dkv)) fail_msg("%s", m.error);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
      mqa_case c;
      case_init(&c, 2, 256, 32, causal, shapes[si][0], shapes[si][1], shapes[si][2], shapes[si][3]);
      run_pipeline(&bs, &c, NULL);
      double r[3];
      char msg[400];
      const size_t nans = compare(&c, r, msg, sizeof msg);
      print_message("  [%s] %s B=%d S_q=%d S_k=%d q_pos0=%d: %s\n", m.name, causal ? "causal" : "full",
                    c.B, c.sq, c.sk, c.q_pos0, msg[0] ? msg : "NOT CAUGHT");
      if (nans) fail_msg("%s: NaN outputs, not a numerical failure", m.name);
      if (!msg[0]) fail_msg("%s: passes the per-element check", m.name);
      case_free(&c);
    }
    set_unload(&bs);
  }
  kt_noise_quiet = 0;
}

/* ---- packed sequences (issue 16, spec.varlen) ----
 * kernel_test_util.h's "many" documents (kt_varlen_many: lengths 1, 2, 3, 17, an empty one,
 * 64 and 200, T = 287 tokens) in a buffer of VL_TCAP = 300, batch 1, or one document of
 * 200; cu_seqlens padded with T to n_seqs = VL_TCAP (as the CUDA executor passes it: entries
 * not distinct) or exact. NaN in every
 * slack row of q, c, dout, o16 and lse32 (so attn_bwd_pre's delta there is NaN too). */
enum { VL_TCAP = KT_VARLEN_CAP, VL_NDOCS = KT_VARLEN_MANY_DOCS };

static void run_varlen(const bwd_set *bs, int causal, int sq, int sk, int q_pos0, const int *cu,
                       int n_cu) {
  mqa_case c;
  const mg_kernel_spec *s = &bs->dkv.kh.spec;
  case_init_cu(&c, s->heads, s->d_c, s->d_r, causal, 1, sq, sk, q_pos0, cu, n_cu);
  const double secs = run_pipeline(bs, &c, NULL);
  check(bs, &c, secs);
  case_free(&c);
}

/* The packed variants against mqa_ref_bwd_mixed_varlen (each row's document range from its
 * own walk over cu_seqlens), causal and not, 288/256 at H = 2, defaults: the many documents
 * (cu padded), one document, a query shard at token 150 of 300 keys (it cuts the
 * 200-token document); then H = 5 causal with dkv qsplit 2 (fp32 atomics) and dq's one
 * stage, nsplit 4: 120 queries. dq = 0 for slack rows, dc = 0 for keys no query sees. */
static void test_varlen(void **state) {
  (void)state;
  int cu_pad[VL_TCAP + 1], cu[VL_NDOCS + 1];
  kt_varlen_pad(kt_varlen_many(), VL_TCAP, cu_pad);
  kt_varlen_pad(kt_varlen_many(), VL_NDOCS, cu);
  static const int cu_one[] = {0, 200};
  g_varlen = 1;
  for (int causal = 1; causal >= 0; causal--) {
    bwd_set bs;
    set_build(&bs, 2, 256, 32, causal, NULL, NULL);
    run_varlen(&bs, causal, VL_TCAP, VL_TCAP, 0, cu_pad, VL_TCAP);
    run_varlen(&bs, causal, VL_TCAP, VL_TCAP, 0, cu_one, 1);
    run_varlen(&bs, causal, 100, VL_TCAP, 150, cu, VL_NDOCS);
    set_unload(&bs);
  }
  static const char *const dkv_cfg[] = {"qsplit=2", NULL};
  static const char *const dq_cfg[] = {"stages=1", "nsplit=4", "block_n=64", "mtiles=1", NULL};
  bwd_set bs;
  set_build(&bs, 5, 256, 32, 1, dkv_cfg, dq_cfg);
  run_varlen(&bs, 1, 120, VL_TCAP, 0, cu, VL_NDOCS);
  set_unload(&bs);
  g_varlen = 0;
}

/* Off-by-one document boundaries injected into the packed variants (kt_mutate_edit) must
 * fail the per-element check on the many documents: dkv's keys also seen by the query
 * before their range (causal), dq's rows also seeing the key before theirs (non-causal). */
static void test_varlen_mutations_caught(void **state) {
  (void)state;
  static kt_mutation muts[] = {
      {"dkv: key's query range starts one early", "if (key < seqlen_k) vl.queries<CAUSAL>(key, qr.lo[r], qr.hi[r]);",
       "if (key < seqlen_k) M_;", "#define M_ vl.queries<CAUSAL>(key, qr.lo[r], qr.hi[r]), qr.lo[r] -= qr.lo[r] > 0", ""},
      {"dq: row's key range starts one early", "kr.set_keys<CAUSAL>(r, vl, row < nrows, q_pos0 + row / H, seqlen_k);", "M_;",
       "#define M_ kr.set_keys<CAUSAL>(r, vl, row < nrows, q_pos0 + row / H, seqlen_k), kr.lo[r] -= kr.lo[r] > 0", ""},
  };
  int cu[VL_NDOCS + 1];
  kt_varlen_pad(kt_varlen_many(), VL_NDOCS, cu);
  kt_noise_quiet = 1; /* not noise */
  g_varlen = 1;
  for (int mi = 0; mi < 2; mi++) {
    const int causal = mi == 0;
    bwd_set bs;
    memset(&bs, 0, sizeof bs);
    mg_kernel_spec s = make_spec("attn_bwd_pre", 2, 256, 32, causal);
    build(&s, &bs.pre);
    s = make_spec(mi ? "mqa_bwd_dkv" : "mqa_bwd_dq", 2, 256, 32, causal);
    build(&s, mi ? &bs.dkv : &bs.dq);
    s = make_spec(mi ? "mqa_bwd_dq" : "mqa_bwd_dkv", 2, 256, 32, causal);
    if (!build_edit(&s, kt_mutate_edit, &muts[mi], mi ? &bs.dq : &bs.dkv)) fail_msg("%s", muts[mi].error);
    mqa_case c;
    case_init_cu(&c, 2, 256, 32, causal, 1, VL_TCAP, VL_TCAP, 0, cu, VL_NDOCS);
    run_pipeline(&bs, &c, NULL);
    double r[3];
    char msg[400];
    const size_t nans = compare(&c, r, msg, sizeof msg);
    print_message("  [%s] %s: %s\n", muts[mi].name, causal ? "causal" : "full", msg[0] ? msg : "NOT CAUGHT");
    if (nans) fail_msg("%s: NaN outputs, not a numerical failure", muts[mi].name);
    if (!msg[0]) fail_msg("%s: passes the per-element check", muts[mi].name);
    case_free(&c);
    set_unload(&bs);
  }
  g_varlen = 0;
  kt_noise_quiet = 0;
}

/* The packed variants of both families' defaults (and dkv's with qsplit 8) compile for
 * sm_80 and sm_90a without spills or a stack frame, causal and (the defaults) not, at
 * 576/512 H 16 (the unpacked sweeps cover 288/256). */
static void test_nvrtc_varlen(void **state) {
  (void)state;
  kh_sweep sw;
  kh_sweep_open(&sw, 70, KH_SWEEP_SMEM);
  g_varlen = 1;
  for (int f = 0; f < 5; f++) { /* f 3, 4: the non-causal dkv and dq */
    mg_kernel_spec s = make_spec(f == 2 || f == 4 ? "mqa_bwd_dq" : "mqa_bwd_dkv", 16, 512, 64, f < 3);
    if (f == 1) set(&s, "qsplit=8");
    assert_true(s.varlen);
    assert_true(kh_sweep_compile(&sw, &s, "varlen "));
  }
  g_varlen = 0;
  kh_sweep_close(&sw);
}

/* The child side of test_asan: the kernels (pre, dkv, dq) built with ASan
 * (MG_HOST_ASAN=1, see kh_run_asan_child) on small cases, in a process that has the ASan
 * runtime preloaded. */
static void asan_case_run(void **state) {
  (void)state;
  bwd_set bs;
  set_build(&bs, 2, 256, 32, 1, NULL, NULL);
  run_case(&bs, 1, 2, 37, 37, 0);
  run_case(&bs, 1, 1, 20, 50, 30);
  set_unload(&bs);
  /* the packed variants: their reads of cu_seqlens and of the rows their ranges name */
  int cu[VL_NDOCS + 1];
  kt_varlen_pad(kt_varlen_many(), VL_NDOCS, cu);
  g_varlen = 1;
  set_build(&bs, 2, 256, 32, 1, NULL, NULL);
  run_varlen(&bs, 1, 100, VL_TCAP, 200, cu, VL_NDOCS);
  set_unload(&bs);
  g_varlen = 0;
}

static void test_asan(void **state) {
  (void)state;
  kh_run_asan_child("test_mqa_bwd", g_test_seed, asan_case_run);
}

/* Every test starts from the file's flags at their defaults (0), as under ctest's one test
 * per process: a test that fails (cmocka longjmps out of it) leaves no flag set for the next
 * one in a direct run of the binary. */
static int fresh_flags(void **state) {
  (void)state;
  g_fp16 = 0; g_varlen = 0; g_poison_last = 0;
  return 0;
}

int main(int argc, char **argv) {
  kt_seed_init();
  const int rc = kh_test_main(argc, argv, asan_case_run);
  if (rc >= 0) return rc;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_deepseek_h2, fresh_flags),
      cmocka_unit_test_setup(test_deepseek_h16, fresh_flags),
      cmocka_unit_test_setup(test_small_latent_h2, fresh_flags),
      cmocka_unit_test_setup(test_heads_1_and_128, fresh_flags),
      cmocka_unit_test_setup(test_deterministic_bit_identical, fresh_flags),
      cmocka_unit_test_setup(test_configs, fresh_flags),
      cmocka_unit_test_setup(test_missing_barrier_caught, fresh_flags),
      cmocka_unit_test_setup(test_fp16, fresh_flags),
      cmocka_unit_test_setup(test_nvrtc_576_dkv, fresh_flags),
      cmocka_unit_test_setup(test_nvrtc_576_dq_pre, fresh_flags),
      cmocka_unit_test_setup(test_nvrtc_288_dkv, fresh_flags),
      cmocka_unit_test_setup(test_nvrtc_288_dq_pre, fresh_flags),
      cmocka_unit_test_setup(test_mutations_caught, fresh_flags),
      cmocka_unit_test_setup(test_asan, fresh_flags),
      cmocka_unit_test_setup(test_varlen, fresh_flags),
      cmocka_unit_test_setup(test_varlen_mutations_caught, fresh_flags),
      cmocka_unit_test_setup(test_nvrtc_varlen, fresh_flags),
  };
  return kh_exit_code(cmocka_run_group_tests(tests, NULL, kt_noise_teardown));
}
