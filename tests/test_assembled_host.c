/* test_assembled_host.c: every form's whole forward and backward (explicit, absorbed,
 * LAGA, LAGA-R, LAGA-F), assembled from the generated tensor-core kernels, equals the CPU
 * executor's.
 *
 * Each case runs one f32 plan (P = 1) twice on the same inputs: once with the CPU
 * executor's own kernels (the reference), once with its test seam (mg_cpu_tensors.
 * kernel_hook) routing the attention steps to the generated kernels run unchanged on the
 * CPU by the host executor (tests/host/): MG_OP_ATTN_FWD to attn_fwd, MG_OP_ATTN_BWD to
 * attn_bwd_pre + attn_bwd_dkdv (deterministic = 1) + attn_bwd_dq, with the step's key
 * layout: k_packed = 1 for the explicit plan's per-head packed K, k_packed = 0 for the
 * LAGA plans' split keys (mg_step.split_keys: K_nope, k_rope read in place from the
 * latent's columns d_c.. with ld_k_rope = d_c + d_r, dk_rope summed over the heads); MG_OP_MQA_FWD to mqa_fwd, MG_OP_MQA_BWD
 * to attn_bwd_pre (generated with d_v = d_c) + mqa_bwd_dkv + mqa_bwd_dq. Kernels are
 * generated for the head count of the step's tensors (H, or H / head_groups for LAGA-F's
 * groups) and launched by their manifest's grid rule. The hook converts the executor's f32
 * buffers to bf16 for the kernels and their results (o, and lse as it is; dq, dk, dv, dc)
 * back to f32. The softmax scale is the plan's (p->shape.softmax_scale); causality is by
 * global position with q_pos0 = 0 (at P = 1, as under Ulysses, queries and keys both cover
 * all S tokens). Every GEMM, layout kernel and collective is the executor's in both runs.
 *
 * Checked: every output of the plan (o, lse, dq, dc_kv, dk_rope, dw_kv_b) against the
 * reference per element at tu_tol_bf16 (tests/cpu_test_util.h: bf16 inside the attention;
 * a NaN fails); the hook ran once per attention step (LAGA-F: once per group);
 * and the measured saved / peak_fwd / peak_bwd / allocation count are the same in both
 * runs and equal the planner's (the hook's bf16 scratch is its own, outside the
 * executor's accounting). Shapes (d_n, d_r, d_v, d_c, H): (128, 64, 128, 512, 2) and
 * (64, 32, 64, 256, 2), with DeepSeek-V3's YaRN softmax scale (tu_shape); B 2, S 77 and 1,
 * causal and not. Inputs are deterministic (tu_inputs: scores with std about 2; fixed
 * seed, or MLAGEN_TEST_SEED), rounded to bf16 so that both runs see the same values. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_test_util.h"
#include "kernel_host.h"
#include "kernel_test_util.h"
#include "mg_cpu_exec.h"
#include "mlagen.h"

static uint64_t g_seed = 20260517;

/* ---- the generated kernels ------------------------------------------------------------- */

typedef void (*fwd_fn)(const e16 *q, const e16 *k_nope, const e16 *k_rope, const e16 *v, e16 *o,
                       float *lse, int seqlen_q, int seqlen_k, int q_pos0, int q_split, int q_pos1,
                       float softmax_scale);
/* split keys (k_packed = 0): ld_k_rope after k_rope */
typedef void (*sfwd_fn)(const e16 *q, const e16 *k_nope, const e16 *k_rope, int ld_k_rope,
                        const e16 *v, e16 *o, float *lse, int seqlen_q, int seqlen_k, int q_pos0,
                        int q_split, int q_pos1, float softmax_scale);
typedef void (*sdkdv_fn)(const e16 *q, const e16 *k_nope, const e16 *k_rope, int ld_k_rope,
                         const e16 *v, const e16 *dout, const float *lse, const float *delta,
                         float *dq_accum, e16 *dk_nope, float *dk_rope, e16 *dv, int seqlen_q,
                         int seqlen_k, int q_pos0, int q_split, int q_pos1, float softmax_scale);
typedef void (*sdq_fn)(const e16 *q, const e16 *k_nope, const e16 *k_rope, int ld_k_rope,
                       const e16 *v, const e16 *dout, const float *lse, const float *delta,
                       e16 *dq, int seqlen_q, int seqlen_k, int q_pos0, int q_split, int q_pos1,
                       float softmax_scale);
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
typedef void (*mqa_fwd_fn)(const e16 *q, const e16 *c, e16 *o, float *lse, int seqlen_q,
                           int seqlen_k, int q_pos0, float softmax_scale);
/* mqa_bwd_dkv (out: dc) and mqa_bwd_dq (out: dq) */
typedef void (*mqa_bwd_fn)(const e16 *q, const e16 *c, const e16 *dout, const float *lse,
                           const float *delta, e16 *out, int seqlen_q, int seqlen_k, int q_pos0,
                           float softmax_scale);

/* Explicit attention (K_FWD..K_DQ) and the absorbed form's MQA over the latent
 * (K_MFWD..K_MDQ; its delta comes from attn_bwd_pre generated with d_v = d_c). */
enum { K_FWD, K_PRE, K_DKDV, K_DQ, K_MFWD, K_MPRE, K_MDKV, K_MDQ, K_SFWD, K_SDKDV, K_SDQ, K_N };
static const char *const k_family[K_N] = {"attn_fwd", "attn_bwd_pre", "attn_bwd_dkdv", "attn_bwd_dq",
                                          "mqa_fwd",  "attn_bwd_pre", "mqa_bwd_dkv",   "mqa_bwd_dq",
                                          "attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq"};

/* Generates kernel `which` for the model shape with `heads` heads and builds it with the
 * host executor; its launch rule is the manifest's (the test launches what a runtime
 * would). */
static void build(mg_gen *g, const mg_shape *sh, int heads, int causal, int which,
                  kh_kernel *out) {
  mg_kernel_spec s;
  memset(&s, 0, sizeof s);
  snprintf(s.family, sizeof s.family, "%s", k_family[which]);
  s.heads = heads, s.d_n = sh->qk_nope_head_dim, s.d_r = sh->qk_rope_head_dim;
  s.d_v = sh->v_head_dim, s.d_c = sh->kv_lora_rank, s.causal = causal;
  if (which == K_MPRE) s.d_n = s.d_v = sh->kv_lora_rank; /* rows of o_lat, d_c wide */
  snprintf(s.dtype, sizeof s.dtype, "bf16");
  const int packed = which == K_FWD || which == K_DKDV || which == K_DQ;
  const int split = which == K_SFWD || which == K_SDKDV || which == K_SDQ;
  if (packed || split) kh_set(&s, packed ? "k_packed=1" : "k_packed=0");
  if (which == K_DKDV || which == K_SDKDV) kh_set(&s, "deterministic=1");
  kh_build(g, &s, 0, out);
  if (packed || split) assert_int_equal(kh_config_int(out, "k_packed"), packed);
  if (which == K_DKDV || which == K_SDKDV) assert_int_equal(kh_config_int(out, "deterministic"), 1);
  assert_int_equal(kh_launch_value(out, "smem"), (long)out->smem);
  assert_int_equal(kh_launch_value(out, "smem_static"), 0);
}

/* ---- the hook ---------------------------------------------------------------------------- */

/* Kernel sets by head count: the head-sharded plans attend with H heads, laga-f's groups
 * with H / head_groups. Built on first use. */
#define MAX_HEAD_SETS 4

typedef struct hook_ctx {
  mg_gen *gen;
  const mg_shape *shape;
  int causal;
  int heads[MAX_HEAD_SETS];
  kh_kernel kern[MAX_HEAD_SETS][K_N];
  int n_fwd, n_bwd; /* attention steps the hook ran */
  int failed;       /* a launch failed (message in msg) */
  char msg[1200];
} hook_ctx;

static const kh_kernel *kernel_for(hook_ctx *h, int heads, int which) {
  int i = 0;
  while (i < MAX_HEAD_SETS && h->heads[i] && h->heads[i] != heads) i++;
  if (i == MAX_HEAD_SETS) fail_msg("more than %d head counts", MAX_HEAD_SETS);
  h->heads[i] = heads;
  if (!h->kern[i][which].k) build(h->gen, h->shape, heads, h->causal, which, &h->kern[i][which]);
  return &h->kern[i][which];
}

static void hook_free(hook_ctx *h) {
  for (int i = 0; i < MAX_HEAD_SETS; i++)
    for (int w = 0; w < K_N; w++)
      kh_free(&h->kern[i][w]);
  free(h);
}

/* Arguments of one launch: every pointer any of the kernels takes. */
typedef struct launch_args {
  int which;
  const kh_kernel *bk;
  const e16 *q, *k, *v, *o, *dout;
  const e16 *k_rope; /* split keys: the latent's RoPE columns, rows ld_k_rope apart */
  int ld_k_rope;
  e16 *o_out, *dq, *dk, *dv;
  float *lse_out, *delta, *dk_rope;
  const float *lse;
  int S;
  float scale;
} launch_args;

static void thunk(void *p) {
  launch_args *a = p;
  switch (a->which) {
    case K_FWD:
      ((fwd_fn)a->bk->fn)(a->q, a->k, NULL, a->v, a->o_out, a->lse_out, a->S, a->S, 0, 0, 0,
                          a->scale);
      break;
    case K_PRE:
    case K_MPRE: ((pre_fn)a->bk->fn)(a->o, a->dout, a->delta, NULL, a->S); break;
    case K_DKDV:
      ((dkdv_fn)a->bk->fn)(a->q, a->k, NULL, a->v, a->dout, a->lse, a->delta, NULL, a->dk, NULL,
                           a->dv, a->S, a->S, 0, 0, 0, a->scale);
      break;
    case K_DQ:
      ((dq_fn)a->bk->fn)(a->q, a->k, NULL, a->v, a->dout, a->lse, a->delta, a->dq, a->S, a->S, 0, 0,
                         0, a->scale);
      break;
    case K_SFWD:
      ((sfwd_fn)a->bk->fn)(a->q, a->k, a->k_rope, a->ld_k_rope, a->v, a->o_out, a->lse_out, a->S,
                           a->S, 0, 0, 0, a->scale);
      break;
    case K_SDKDV:
      ((sdkdv_fn)a->bk->fn)(a->q, a->k, a->k_rope, a->ld_k_rope, a->v, a->dout, a->lse, a->delta,
                            NULL, a->dk, a->dk_rope, a->dv, a->S, a->S, 0, 0, 0, a->scale);
      break;
    case K_SDQ:
      ((sdq_fn)a->bk->fn)(a->q, a->k, a->k_rope, a->ld_k_rope, a->v, a->dout, a->lse, a->delta,
                          a->dq, a->S, a->S, 0, 0, 0, a->scale);
      break;
    case K_MFWD:
      ((mqa_fwd_fn)a->bk->fn)(a->q, a->k, a->o_out, a->lse_out, a->S, a->S, 0, a->scale);
      break;
    case K_MDKV:
      ((mqa_bwd_fn)a->bk->fn)(a->q, a->k, a->dout, a->lse, a->delta, a->dk, a->S, a->S, 0, a->scale);
      break;
    default:
      ((mqa_bwd_fn)a->bk->fn)(a->q, a->k, a->dout, a->lse, a->delta, a->dq, a->S, a->S, 0, a->scale);
  }
}

/* Launches kernel a->which for H heads over B batch items by its manifest's launch rule. */
static int launch(hook_ctx *h, launch_args *a, int B, int H) {
  a->bk = kernel_for(h, H, a->which);
  mg_host_dim3 grid = kh_grid(a->bk, a->S, a->S, B);
  mg_host_dim3 block = {(unsigned)a->bk->threads, 1, 1};
  char msg[800];
  if (mg_host_kernel_launch(a->bk->k, grid, block, a->bk->smem, NULL, thunk, a, msg, sizeof msg)) {
    snprintf(h->msg, sizeof h->msg, "%s: launch failed: %s", a->bk->name, msg);
    h->failed = 1;
    return -1;
  }
  return 0;
}

static e16 *to_bf16(const float *x, int64_t n) {
  e16 *y = malloc((size_t)(n ? n : 1) * sizeof *y);
  assert_non_null(y);
  for (int64_t i = 0; i < n; i++) y[i] = float_to_bf16(x[i]);
  return y;
}

static void from_bf16(const e16 *x, float *y, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = bf16_to_float(x[i]);
}

static e16 *nan16(int64_t n) { /* outputs start as NaN, so an unwritten one shows */
  e16 *y = malloc((size_t)(n ? n : 1) * sizeof *y);
  assert_non_null(y);
  for (int64_t i = 0; i < n; i++) y[i] = 0x7fff;
  return y;
}

static float *nanf32(int64_t n) {
  float *y = malloc((size_t)(n ? n : 1) * sizeof *y);
  assert_non_null(y);
  for (int64_t i = 0; i < n; i++) y[i] = NAN;
  return y;
}

/* MG_OP_MQA_FWD / MG_OP_MQA_BWD: q_abs [B, S, H, d_c + d_r], c [B, S, d_c + d_r]. */
static void hook_mqa(hook_ctx *h, const mg_step *step, const mg_plan *p, const void *const *in,
                     void *const *out) {
  const mg_plan_buf *qb = &p->bufs[step->in[0]];
  const int B = (int)qb->dims[0], S = (int)qb->dims[1], H = (int)qb->dims[2];
  const int64_t w = qb->dims[3], dc = p->shape.kv_lora_rank;
  const int64_t nq = (int64_t)B * S * H * w, nc = (int64_t)B * S * w, no = (int64_t)B * S * H * dc,
                nl = (int64_t)B * H * S;
  launch_args a;
  memset(&a, 0, sizeof a);
  a.S = S;
  a.scale = (float)p->shape.softmax_scale;
  e16 *q = to_bf16(in[0], nq), *c = to_bf16(in[1], nc);
  a.q = q, a.k = c;
  if (step->op == MG_OP_MQA_FWD) {
    e16 *o = nan16(no);
    float *lse = out[1];
    for (int64_t i = 0; i < nl; i++) lse[i] = NAN;
    a.which = K_MFWD, a.o_out = o, a.lse_out = lse;
    launch(h, &a, B, H);
    from_bf16(o, out[0], no);
    free(o);
    h->n_fwd++;
  } else {
    e16 *o = to_bf16(in[2], no), *dout = to_bf16(in[4], no), *dq = nan16(nq), *dcc = nan16(nc);
    float *delta = nanf32(nl);
    a.o = o, a.dout = dout, a.lse = in[3], a.delta = delta, a.dq = dq, a.dk = dcc;
    a.which = K_MPRE;
    int rc = launch(h, &a, B, H);
    a.which = K_MDKV;
    if (!rc) rc = launch(h, &a, B, H);
    a.which = K_MDQ;
    if (!rc) launch(h, &a, B, H);
    from_bf16(dq, out[0], nq);
    from_bf16(dcc, out[1], nc);
    free(o), free(dout), free(dq), free(dcc), free(delta);
    h->n_bwd++;
  }
  free(q), free(c);
}

static int hook(const mg_step *step, const mg_plan *p, const void *const *in, void *const *out,
                void *ctx) {
  hook_ctx *h = ctx;
  if (p->args.dtype != MG_F32 || mg_plan_acc_dtype(p) != MG_F32) return 1;
  if (step->op == MG_OP_MQA_FWD || step->op == MG_OP_MQA_BWD) {
    hook_mqa(h, step, p, in, out);
    return 0;
  }
  if (step->op != MG_OP_ATTN_FWD && step->op != MG_OP_ATTN_BWD) return 1;
  const mg_plan_buf *qb = &p->bufs[step->in[0]], *vb = &p->bufs[step->in[2]];
  const int B = (int)qb->dims[0], S = (int)qb->dims[1], H = (int)qb->dims[2];
  const int64_t dqk = qb->dims[3], dv = vb->dims[3];
  const int split = step->split_keys, fwd = step->op == MG_OP_ATTN_FWD;
  const int64_t dr = p->shape.qk_rope_head_dim, dk_w = split ? dqk - dr : dqk;
  const int64_t nq = (int64_t)B * S * H * dqk, nv = (int64_t)B * S * H * dv,
                nk = (int64_t)B * S * H * dk_w, nl = (int64_t)B * H * S, nr = (int64_t)B * S * dr;
  launch_args a;
  memset(&a, 0, sizeof a);
  a.S = S;
  a.scale = (float)p->shape.softmax_scale;
  e16 *q = to_bf16(in[0], nq), *k = to_bf16(in[1], nk), *v = to_bf16(in[2], nv);
  /* split keys: the whole latent in bf16, the kernels reading its RoPE columns in place */
  e16 *lat = split ? to_bf16(in[fwd ? 3 : 6], (int64_t)B * S * step->rope_w) : NULL;
  a.q = q, a.k = k, a.v = v;
  a.k_rope = split ? lat + step->rope_col : NULL, a.ld_k_rope = (int)step->rope_w;
  int rc = 0;
  if (fwd) {
    e16 *o = nan16(nv);
    float *lse = out[1];
    for (int64_t i = 0; i < nl; i++) lse[i] = NAN;
    a.which = split ? K_SFWD : K_FWD, a.o_out = o, a.lse_out = lse;
    rc = launch(h, &a, B, H);
    from_bf16(o, out[0], nv);
    free(o);
    h->n_fwd++;
  } else {
    e16 *o = to_bf16(in[3], nv), *dout = to_bf16(in[5], nv);
    e16 *dq = nan16(nq), *dk = nan16(nk), *dvv = nan16(nv);
    float *delta = nanf32(nl);
    a.o = o, a.dout = dout, a.lse = in[4], a.delta = delta, a.dq = dq, a.dk = dk, a.dv = dvv;
    if (split) { /* dk_rope: f32 [B, S, d_r], the plan's buffer (acc dtype f32) */
      a.dk_rope = out[3];
      for (int64_t i = 0; i < nr; i++) a.dk_rope[i] = NAN;
    }
    a.which = K_PRE;
    rc = launch(h, &a, B, H);
    a.which = split ? K_SDKDV : K_DKDV;
    if (!rc) rc = launch(h, &a, B, H);
    a.which = split ? K_SDQ : K_DQ;
    if (!rc) rc = launch(h, &a, B, H);
    from_bf16(dq, out[0], nq);
    from_bf16(dk, out[1], nk);
    from_bf16(dvv, out[2], nv);
    free(o), free(dout), free(dq), free(dk), free(dvv), free(delta);
    h->n_bwd++;
  }
  free(q), free(k), free(v), free(lat);
  (void)rc; /* a failed launch is reported by the test (h->failed); outputs stay NaN */
  return 0;
}

/* ---- running a plan ---------------------------------------------------------------------- */

/* Runs form f's f32 plan on the global (P = 1) inputs; with h, through the hook. */
static void run_plan(const tu_case *c, mg_form f, double *const in[TU_N_IN], hook_ctx *h,
                     tu_run *r) {
  mg_diag d = MG_DIAG_INIT;
  if (tu_run_form_hooked(c, f, 1, 0, NULL, MG_F32, in, h ? hook : NULL, h, r, &d))
    fail_msg("%s", mg_diag_msg(&d));
}

static double g_worst[TU_N_OUT];

/* One form on one case: the reference run, the assembled run, the comparisons. */
static void check_form(const tu_case *c, mg_form f, double *const in[TU_N_IN], hook_ctx *h) {
  tu_run ref, asm_;
  run_plan(c, f, in, NULL, &ref);
  h->n_fwd = h->n_bwd = 0;
  double t0 = kh_now();
  run_plan(c, f, in, h, &asm_);
  const double secs = kh_now() - t0;
  if (h->failed) fail_msg("%s", h->msg);
  /* one attention step per pass; laga-f and laga-cp one per head group */
  const int steps = f == MG_FORM_LAGA_F || f == MG_FORM_LAGA_CP ? asm_.plan.args.head_groups : 1;
  assert_int_equal(h->n_fwd, steps);
  assert_int_equal(h->n_bwd, steps);
  /* the executor's accounting: the same with and without the hook, and the planner's */
  assert_int_equal(ref.st.saved, ref.cost.saved);
  assert_int_equal(ref.st.peak_fwd, ref.cost.peak_fwd);
  assert_int_equal(ref.st.peak_bwd, ref.cost.peak_bwd);
  assert_int_equal(asm_.st.saved, asm_.cost.saved);
  assert_int_equal(asm_.st.peak_fwd, asm_.cost.peak_fwd);
  assert_int_equal(asm_.st.peak_bwd, asm_.cost.peak_bwd);
  assert_int_equal(asm_.st.n_allocs, ref.st.n_allocs);
  double e[TU_N_OUT];
  int bad = 0;
  for (int k = 0; k < TU_N_OUT; k++) {
    const int64_t n = tu_out_numel(c, k);
    const float *a = tu_out_ptr(&asm_, k), *b = tu_out_ptr(&ref, k);
    assert_non_null(a);
    assert_non_null(b);
    double *got = malloc((size_t)n * sizeof(double)), *want = malloc((size_t)n * sizeof(double));
    assert_true(got && want);
    for (int64_t i = 0; i < n; i++) got[i] = a[i], want[i] = b[i];
    char what[512];
    snprintf(what, sizeof what, "%s %s B %d S %lld %s: %s", mg_form_name(f), c->shape.source, c->B,
             (long long)c->S, c->causal ? "causal" : "non-causal", tu_out_names[k]);
    cc_result r = tu_check(what, got, want, n, tu_rms(want, n), tu_tol_bf16[k], tu_out_cols(c, k));
    e[k] = r.min_atol;
    if (e[k] > g_worst[k]) g_worst[k] = e[k];
    bad += !cc_ok(&r);
    free(got), free(want);
  }
  print_message("  %-8s dn %3lld B %d S %3lld %-10s needed atol o %.1e lse %.1e dq %.1e dc_kv %.1e "
                "dk_rope %.1e dw_kv_b %.1e (%.2f s)\n",
                mg_form_name(f), (long long)c->shape.qk_nope_head_dim, c->B, (long long)c->S,
                c->causal ? "causal" : "non-causal", e[TU_O], e[TU_LSE], e[TU_DQ], e[TU_DCKV],
                e[TU_DKROPE], e[TU_DW], secs);
  if (bad) fail_msg("%s: %d output(s) over their tolerance", mg_form_name(f), bad);
  tu_run_free(&ref);
  tu_run_free(&asm_);
}

static void check_shape(int dn, int dr, int dv, int dc) {
  mg_diag d = MG_DIAG_INIT;
  mg_gen *g;
  assert_int_equal(mg_gen_open(&g, NULL, &d), 0);
  for (int causal = 1; causal >= 0; causal--) {
    tu_case c = {.shape = tu_shape(2, dn, dr, dv, dc), .B = 2, .causal = causal};
    hook_ctx *h = calloc(1, sizeof *h);
    assert_non_null(h);
    h->gen = g, h->shape = &c.shape, h->causal = causal;
    const int64_t seqs[2] = {77, 1};
    for (int si = 0; si < 2; si++) {
      c.S = seqs[si];
      double *in[TU_N_IN] = {0};
      assert_int_equal(tu_inputs(&c, g_seed + (uint64_t)(si * 2 + causal), in), 0);
      for (int k = 0; k < TU_N_IN; k++) /* bf16 values: both runs see the same inputs */
        for (int64_t i = 0; i < tu_in_numel(&c, k); i++)
          in[k][i] = bf16_to_float(float_to_bf16((float)in[k][i]));
      for (int f = 0; f < MG_FORM_COUNT; f++) check_form(&c, (mg_form)f, in, h);
      tu_free(in, TU_N_IN);
    }
    hook_free(h);
  }
  mg_gen_close(g);
}

static void test_deepseek_heads(void **state) {
  (void)state;
  check_shape(128, 64, 128, 512);
}

static void test_unusual_heads(void **state) {
  (void)state;
  check_shape(64, 32, 64, 256);
}

/* Without a hook the seam changes nothing: a hook that declines every step (returns
 * nonzero) gives bit-identical outputs to no hook at all. */
static int decline(const mg_step *step, const mg_plan *p, const void *const *in,
                   void *const *out, void *ctx) {
  (void)step, (void)p, (void)in, (void)out;
  ++*(int *)ctx;
  return 1;
}

static void test_declining_hook(void **state) {
  (void)state;
  tu_case c = {.shape = tu_shape(2, 64, 32, 64, 256), .B = 2, .S = 13, .causal = 1};
  double *in[TU_N_IN] = {0};
  assert_int_equal(tu_inputs(&c, g_seed, in), 0);
  tu_run ref, other;
  run_plan(&c, MG_FORM_EXPLICIT, in, NULL, &ref);
  memset(&other, 0, sizeof other);
  /* the same run with the declining hook */
  mg_diag d = MG_DIAG_INIT;
  other.plan = ref.plan;
  for (int k = 0; k < TU_N_IN; k++) {
    int64_t B, S, w;
    tu_in_dims(&c, k, &B, &S, &w);
    other.in[k] = tu_shard(in[k], B, S, w, 0, 1, MG_F32);
  }
  int calls = 0;
  other.t = (mg_cpu_tensors){.q = other.in[TU_Q], .c_kv = other.in[TU_CKV],
                             .k_rope = other.in[TU_KROPE], .w_kv_b = other.in[TU_W],
                             .d_o = other.in[TU_DO], .kernel_hook = decline, .hook_ctx = &calls};
  if (mg_cpu_run(&other.plan, NULL, &other.t, &other.st, &d)) fail_msg("%s", mg_diag_msg(&d));
  assert_int_equal(calls, 2);
  for (int k = 0; k < TU_N_OUT; k++) {
    if (k == TU_LSE) continue;
    assert_memory_equal(tu_out_ptr(&ref, k), tu_out_ptr(&other, k),
                        (size_t)tu_out_numel(&c, k) * sizeof(float));
  }
  assert_int_equal(other.st.saved, ref.st.saved);
  assert_int_equal(other.st.peak_fwd, ref.st.peak_fwd);
  assert_int_equal(other.st.peak_bwd, ref.st.peak_bwd);
  tu_run_free(&ref);
  tu_run_free(&other);
  tu_free(in, TU_N_IN);
}

static int report_worst(void **state) {
  (void)state;
  tu_print_worst("(rms units, rtol of tu_tol_bf16)", g_worst);
  return 0;
}

int main(void) {
  const char *env = getenv("MLAGEN_TEST_SEED");
  if (env) g_seed = strtoull(env, NULL, 10);
  printf("MLAGEN_TEST_SEED=%llu\n", (unsigned long long)g_seed);
  const char *filter = getenv("MLAGEN_TEST_FILTER"); /* a cmocka pattern: one ctest entry */
  if (filter && *filter) cmocka_set_test_filter(filter);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_declining_hook),
      cmocka_unit_test(test_deepseek_heads),
      cmocka_unit_test(test_unusual_heads),
  };
  return kh_exit_code(cmocka_run_group_tests(tests, NULL, report_worst));
}
