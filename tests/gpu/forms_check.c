/* forms_check.c (mlagen_forms_check, and mlagen_forms_check_mpi for --sp): every form's
 * whole forward and backward on a real GPU, checked per element against a float64
 * reference, run twice and compared bit for bit, and timed with CUDA events.
 *
 *   mlagen_forms_check OUTDIR [--heads 16] [--seq 256] [--forms LIST] [--iters 20]
 *                             [--warmup 3] [--seed N] [--no-check] [--no-causal] [--varlen]
 *                             [--dtype bf16|f16] [--ref-rows N] [--dims DN,DR,DV,DC]
 *   mpirun -np 2 mlagen_forms_check_mpi OUTDIR --sp 2 [same options]
 *   mpirun -np P mlagen_forms_check_host OUTDIR --sp P [...]   (CPU device ops, fake driver)
 *
 * For a DeepSeek-V3 head shape with --heads heads (d_c 512, d_r 64, d_n 128, d_v 128, or
 * --dims; softmax scale mscale^2 / sqrt(d_n + d_r), mscale 1.3689), B = 1, S = --seq, causal (or not),
 * --dtype, and each form of --forms (default all six: explicit, absorbed, laga, laga-r,
 * laga-f, laga-cp, the last with its shards two chunks per rank):
 *   - inputs: q, c_kv, k_rope N(0, 1) on a grid of 1/16, w_kv_b N(0, 1) / sqrt(d_c) on a
 *     grid of 2^-10, d_o N(0, 1) / 2 on a grid of 1/64 (scores std about 2; every value
 *     exact in bf16 and f16, and the forms' K_n = W_UK c_kv, V and q_lat = W_UK^T q_n
 *     exact in f32 whatever cuBLAS's order, so the reference rounds them as the GPU does);
 *   - sp 1: through the public API (mlagen_plan_create, mlagen_forward/_backward; tensors,
 *     workspace and saved area cuMemAlloc'd and NaN-filled). An f16 plan the API refuses
 *     is "refused by the API" (status and message), not a pass and not a failure (a
 *     refused bf16 plan fails).
 *     --sp P (mlagen_forms_check_mpi under mpirun -np P, one GPU shared): each rank runs
 *     its plan of sp_size P with the CUDA executor directly (mg_dev_ops_cuda,
 *     mg_cuda_exec), collectives through runtime/exec/mg_comm_staged.h over MPI; rank 0
 *     gathers the shards and checks them (dw_kv_b: the sum over ranks);
 *   - the reference (tests/gpu/mla_ref64.h, float64, dgemm) once for all forms:
 *     --ref-rows 0 (default) every row; N > 0: rows [0, 128) and the last N only (o, lse,
 *     dq there; dc_kv, dk_rope for the last N tokens, exact under causal masking; dw_kv_b
 *     not checked), for sequence lengths a full reference is too slow for;
 *   - compared per element (tests/check_close.h, |err| <= atol + rtol |ref|, atol a
 *     multiple of the checked reference's rms; tests/gpu/gpu_tol.h has the values and how
 *     they were measured), plus an L2 bound (||err|| / ||ref||) for errors small per
 *     element but systematic; the lse (f32, read from the saved area at the executor's
 *     layout) at GPU_TOL_LSE_ATOL + GPU_TOL_LSE_RTOL |lse| (gpu_tol.h: the one place its
 *     values are stated), every form alike; the absorbed form's other outputs at their own
 *     multiples (GPU_TOL_ABS_*: it rounds more). Any NaN fails. Each output prints its worst element and max|err| / rms (the noise);
 *   - sp 1: the forward and backward run a second time (outputs, workspace NaN-filled
 *     again) and every output and the lse are compared byte for byte: "bitwise equal" or
 *     the first differing element; a difference fails the form;
 *   - --iters > 0 (sp 1): the median of --iters calls of mlagen_forward and of
 *     mlagen_backward after --warmup, each between two events.
 * --varlen: every form's varlen plan (packed sequences, docs/packed.md) with capacity S:
 * documents 1, 2, 0 (empty), 17, S / 4 and the rest of T = S - S / 16 tokens (vl_docs; one
 * document when S is too short), NaN in every slack input row (from T on), cu_seqlens given
 * with the tensors (the API's mlagen_tensors.cu_seqlens, or the executor's at --sp); the
 * reference runs each document alone and stitches the outputs (dw_kv_b their sum), and
 * every slack output element must equal it exactly (0, lse -inf). Not with --ref-rows.
 * --no-check: no reference; the outputs must be finite and the line says "not checked"
 * (never ok); the summary "forms: N of M timed, not checked".
 * Writes OUTDIR/forms.log and OUTDIR/forms.csv (form,H,S,causal,dtype,sp,o,lse,dq,dc_kv,
 * dk_rope,dw_kv_b,ok,bitwise,prepare_s,fwd_ms,bwd_ms,iters,status; the error columns are
 * the worst element's err / bound, <= 1 passes; empty when not checked).
 * Exit: 0 every form passed (or, --no-check, ran); 1 a form failed; 2 usage or no CUDA
 * driver; 4 no form failed and at least one was refused by the API (f16). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check_close.h"
#include "gpu/gpu_common.h"
#include "gpu/gpu_tol.h"
#include "cpu_test_util.h"
#include "gpu/mla_ref64.h"
#include "mg_cuda_exec.h"
#include "mg_driver.h"
#include "mg_fs.h"
#include "mg_plan_mem.h"
#include "mg_safetensors.h"
#include "mlagen.h"
#ifdef FORMS_MPI
#include <mpi.h>

#include "mg_comm_staged.h"
#endif
#ifdef FORMS_HOST /* CPU device ops (the header needs cmocka's print_message, assert_*) */
#include <setjmp.h>
#include <stddef.h>
#include <cmocka.h>

#include "cuda_exec_host_ops.h"
#endif

typedef uint16_t e16;

static int g_no_check;
#ifdef FORMS_MPI
static int g_size = 1;
#endif
static CUstream g_stream;

static int g_iters = 20, g_warmup = 3;

/* ---- the case, its inputs and the reference ---------------------------------------------- */

static const mlagen_form k_forms[MG_FORM_COUNT] = {MLAGEN_FORM_EXPLICIT, MLAGEN_FORM_ABSORBED,
                                                   MLAGEN_FORM_LAGA, MLAGEN_FORM_LAGA_R,
                                                   MLAGEN_FORM_LAGA_F, MLAGEN_FORM_LAGA_CP};

/* The tensors in mlagen_tensors order, with the cpu_test_util input / output index. */
enum { T_Q, T_CKV, T_KROPE, T_W, T_O, T_DO, T_DQ, T_DCKV, T_DKROPE, T_DW, T_N };
static const int k_out_of[T_N] = {-1, -1, -1, -1, TU_O, -1, TU_DQ, TU_DCKV, TU_DKROPE, TU_DW};
static const int k_in_of[T_N] = {TU_Q, TU_CKV, TU_KROPE, TU_W, -1, TU_DO, -1, -1, -1, -1};

static tu_case g_case;
static mg_dtype g_dt = MG_BF16;
static mr_case g_mr;
static mr_out g_ref;

/* --varlen: every form's varlen plan (packed sequences, docs/packed.md) at capacity S, the
 * documents g_cu [g_ncu + 1] (vl_docs), NaN in every slack input row; the reference runs
 * each document alone (ref_varlen), and slack outputs must equal it exactly (0, lse -inf). */
static int g_varlen, g_ncu;
static int32_t g_cu[8];

/* The documents of a stream of capacity S: lengths 1, 2, 0 (empty), 17, S / 4 and the rest
 * of T = S - max(1, S / 16) (the last S / 16 rows slack); one document of T when S is too
 * short for them. At S 96 and P 2 the last document crosses the rank boundary (48). */
static void vl_docs(int S) {
  const int T = S - (S / 16 > 1 ? S / 16 : 1), lens[5] = {1, 2, 0, 17, S / 4};
  g_ncu = 0, g_cu[0] = 0;
  if (1 + 2 + 17 + S / 4 < T)
    for (int d = 0; d < 5; d++) g_cu[g_ncu + 1] = g_cu[g_ncu] + lens[d], g_ncu++;
  g_cu[g_ncu + 1] = T, g_ncu++;
}


/* Inputs on grids that make the forms' GEMMs exact in f32 (see the top), then rounded to
 * the dtype (a no-op for all but the rare value beyond the grid's exact range). */
static int make_inputs(uint64_t seed, double *in[TU_N_IN]) {
  for (int k = 0; k < TU_N_IN; k++) {
    const int64_t n = tu_in_numel(&g_case, k);
    if (!(in[k] = malloc((size_t)n * sizeof(double)))) return -1;
    const double sc = k == TU_W ? 1.0 / sqrt((double)g_case.shape.kv_lora_rank) : k == TU_DO ? 0.5 : 1.0;
    const int e = k == TU_W ? 10 : k == TU_DO ? 6 : 4;
    for (int64_t i = 0; i < n; i++)
      in[k][i] = mr_round(mr_quantize(sc * tu_normal(seed, (uint64_t)k + 1, (uint64_t)i), e),
                          g_dt == MG_F16 ? 2 : 1);
  }
  return 0;
}

/* --varlen: NaN in every slack row (from g_cu[g_ncu] on) of q, c_kv, k_rope and d_o. */
static void vl_nan_slack(double *in[TU_N_IN]) {
  for (int k = 0; k < TU_N_IN; k++) {
    if (k == TU_W) continue;
    int64_t B_, S_, w;
    tu_in_dims(&g_case, k, &B_, &S_, &w);
    for (int64_t i = (int64_t)g_cu[g_ncu] * w; i < S_ * w; i++) in[k][i] = NAN;
  }
}

/* --varlen's reference: mr_run on each document alone (its rows of the inputs), stitched
 * into g_ref; slack rows o, dq, dc_kv, dk_rope 0 and lse -inf; dw_kv_b the documents' sum.
 * Returns 0, or -1 out of memory. */
static int ref_varlen(double *const in[TU_N_IN]) {
  const mr_case *m = &g_mr;
  const int64_t S = m->S, H = m->H, dqk = m->dn + m->dr, nw = H * (m->dn + m->dv) * m->dc;
  mr_out *r = &g_ref;
  memset(r, 0, sizeof *r);
  r->o = calloc((size_t)(S * H * m->dv), sizeof(double));
  r->dq = calloc((size_t)(S * H * dqk), sizeof(double));
  r->dc_kv = calloc((size_t)(S * m->dc), sizeof(double));
  r->dk_rope = calloc((size_t)(S * m->dr), sizeof(double));
  r->dw_kv_b = calloc((size_t)nw, sizeof(double));
  r->lse = malloc((size_t)(H * S) * sizeof(double)), r->lse_abs = malloc((size_t)(H * S) * sizeof(double));
  if (!r->o || !r->dq || !r->dc_kv || !r->dk_rope || !r->dw_kv_b || !r->lse || !r->lse_abs) return -1;
  for (int64_t i = 0; i < H * S; i++) r->lse[i] = r->lse_abs[i] = -INFINITY;
  for (int d = 0; d < g_ncu; d++) {
    const int64_t t0 = g_cu[d], L = g_cu[d + 1] - t0;
    if (!L) continue;
    mr_case c = *m;
    c.S = L, c.head1 = c.tail0 = 0;
    mr_out o;
    if (mr_run(&c, in[TU_Q] + t0 * H * dqk, in[TU_CKV] + t0 * m->dc, in[TU_KROPE] + t0 * m->dr, in[TU_W],
               in[TU_DO] + t0 * H * m->dv, &o))
      return -1;
    memcpy(r->o + t0 * H * m->dv, o.o, (size_t)(L * H * m->dv) * sizeof(double));
    memcpy(r->dq + t0 * H * dqk, o.dq, (size_t)(L * H * dqk) * sizeof(double));
    memcpy(r->dc_kv + t0 * m->dc, o.dc_kv, (size_t)(L * m->dc) * sizeof(double));
    memcpy(r->dk_rope + t0 * m->dr, o.dk_rope, (size_t)(L * m->dr) * sizeof(double));
    for (int64_t h = 0; h < H; h++)
      for (int64_t i = 0; i < L; i++)
        r->lse[h * S + t0 + i] = o.lse[h * L + i], r->lse_abs[h * S + t0 + i] = o.lse_abs[h * L + i];
    for (int64_t i = 0; i < nw; i++) r->dw_kv_b[i] += o.dw_kv_b[i];
    mr_free(&o);
  }
  return 0;
}

static e16 to16(double x) { return g_dt == MG_F16 ? mg_f32_to_f16((float)x) : mg_f32_to_bf16((float)x); }
static double from16(e16 x) { return g_dt == MG_F16 ? mg_f16_to_f32(x) : mg_bf16_to_f32(x); }

/* ---- checks ---------------------------------------------------------------------------- */

enum { C_O, C_LSE, C_DQ, C_DCKV, C_DKROPE, C_DW, C_N };

/* Whether element i of output k (forms_check's C_* layouts) lies in a slack row of the
 * --varlen stream. */
static int vl_slack(int k, int64_t i, int64_t n) {
  const int64_t S = g_case.S;
  if (!g_varlen || k == C_DW) return 0;
  return (k == C_LSE ? i % S : i / (n / S)) >= g_cu[g_ncu];
}
static const char *const k_cname[C_N] = {"o", "lse", "dq", "dc_kv", "dk_rope", "dw_kv_b"};

/* One form's outputs in global layouts, as doubles: o [S, H, dv], lse [H, S], dq, dc_kv,
 * dk_rope, dw_kv_b. */
typedef struct outs {
  double *v[C_N];
} outs;

static int64_t c_numel(int k) {
  const mg_shape *s = &g_case.shape;
  return k == C_LSE ? g_case.S * s->heads : tu_out_numel(&g_case, k == C_O ? TU_O : k == C_DQ ? TU_DQ
                                                                       : k == C_DCKV ? TU_DCKV
                                                                       : k == C_DKROPE ? TU_DKROPE : TU_DW);
}

static void outs_free(outs *o) {
  for (int k = 0; k < C_N; k++) free(o->v[k]), o->v[k] = NULL;
}

static int outs_alloc(outs *o) {
  memset(o, 0, sizeof *o);
  for (int k = 0; k < C_N; k++)
    if (!(o->v[k] = calloc((size_t)c_numel(k), sizeof(double)))) return -1;
  return 0;
}

/* Whether element i of output k is checked against the reference. */
static int checked(int k, int64_t i) {
  const int64_t S = g_case.S, n = c_numel(k);
  switch (k) {
    case C_LSE: return mr_row_in(&g_mr, i % S);
    case C_O:
    case C_DQ: return mr_row_in(&g_mr, i / (n / S));
    case C_DCKV:
    case C_DKROPE: return i / (n / S) >= mr_key0(&g_mr);
    default: return g_ref.dw_kv_b != NULL;
  }
}

typedef struct check_res {
  double ratio[C_N]; /* worst err / bound; NAN when not checked */
  int ok;
} check_res;

/* Compares got with the reference; prints one line per output; fills r. absorbed picks
 * the absorbed form's lse. */
static void check_all(const char *fname, const outs *got, int absorbed, check_res *r) {
  r->ok = 1;
  for (int k = 0; k < C_N; k++) {
    r->ratio[k] = NAN;
    const double *ref = k == C_O ? g_ref.o : k == C_LSE ? (absorbed ? g_ref.lse_abs : g_ref.lse)
                        : k == C_DQ ? g_ref.dq : k == C_DCKV ? g_ref.dc_kv
                        : k == C_DKROPE ? g_ref.dk_rope : g_ref.dw_kv_b;
    const int64_t n = c_numel(k);
    if (!ref) {
      say("  %-9s %-8s not checked (the reference has no rows for it: --ref-rows)\n", fname, k_cname[k]);
      continue;
    }
    double ss = 0;
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++)
      if (checked(k, i) && !vl_slack(k, i, n)) ss += ref[i] * ref[i], m++;
    if (!m) {
      say("  %-9s %-8s not checked (no reference rows)\n", fname, k_cname[k]);
      continue;
    }
    const double rms = sqrt(ss / (double)m);
    const double atol = k == C_LSE ? GPU_TOL_LSE_ATOL
                        : (k == C_O ? (absorbed ? GPU_TOL_ABS_O_ATOL_RMS : GPU_TOL_O_ATOL_RMS)
                                    : (absorbed ? GPU_TOL_ABS_GRAD_ATOL_RMS : GPU_TOL_GRAD_ATOL_RMS)) * rms;
    const double rtol = k == C_LSE ? GPU_TOL_LSE_RTOL : k == C_O ? GPU_TOL_RTOL : GPU_TOL_GRAD_RTOL;
    cc_result c = cc_init();
    double se = 0;
    for (int64_t i = 0; i < n; i++)
      if (!checked(k, i)) {
      } else if (vl_slack(k, i, n)) { /* --varlen's slack rows: exactly the reference (0, -inf) */
        cc_add(&c, i, got->v[k][i], ref[i], 0, 0);
      } else {
        cc_add(&c, i, got->v[k][i], ref[i], atol, rtol);
        se += (got->v[k][i] - ref[i]) * (got->v[k][i] - ref[i]);
      }
    char buf[512];
    const int64_t cols = k == C_LSE ? g_case.S : k == C_DW ? g_case.shape.kv_lora_rank : n / g_case.S;
    cc_describe(&c, k_cname[k], atol, rtol, cols, buf, sizeof buf);
    /* the L2 bound: a small error on many elements (not for the lse: per element at 1e-5) */
    const double l2 = ss > 0 ? sqrt(se / ss) : sqrt(se), l2_tol = k == C_O ? (absorbed ? GPU_TOL_ABS_O_L2 : GPU_TOL_O_L2)
                                                               : (absorbed ? GPU_TOL_ABS_GRAD_L2 : GPU_TOL_GRAD_L2);
    const int ok = cc_ok(&c) && (k == C_LSE || l2 <= l2_tol);
    r->ratio[k] = c.worst_ratio;
    if (!ok) r->ok = 0;
    if (k != C_LSE) snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "; L2 %.2e (bound %.0e)", l2, l2_tol);
    say("  %-9s %s %s; noise max|err|/rms %.2e\n", fname, ok ? "ok  " : "FAIL", buf,
        rms > 0 ? c.max_abs / rms : c.max_abs);
  }
}

/* --no-check: every value finite. */
static int all_finite(const char *fname, const outs *got) {
  int ok = 1;
  for (int k = 0; k < C_N; k++) {
    int64_t bad = 0;
    for (int64_t i = 0; i < c_numel(k); i++) bad += !isfinite(got->v[k][i]);
    if (bad) say("  %-9s %s: %lld non-finite values\n", fname, k_cname[k], (long long)bad), ok = 0;
  }
  return ok;
}

/* ---- sp 1: one form through the public API ---------------------------------------------- */

static mlagen_tensor *tensor_at(mlagen_tensors *t, int i) {
  mlagen_tensor *all[T_N] = {&t->q, &t->c_kv, &t->k_rope, &t->w_kv_b, &t->o,
                             &t->d_o, &t->dq, &t->dc_kv, &t->dk_rope, &t->dw_kv_b};
  return all[i];
}
static const mlagen_tensor_info *info_at(const mlagen_sizes *z, int i) {
  const mlagen_tensor_info *all[T_N] = {&z->q, &z->c_kv, &z->k_rope, &z->w_kv_b, &z->o,
                                        &z->d_o, &z->dq, &z->dc_kv, &z->dk_rope, &z->dw_kv_b};
  return all[i];
}

typedef struct form_result {
  check_res chk;
  int ok, ran, refused, bitwise; /* bitwise: 1 equal, 0 differs, -1 not compared */
  double prepare_s, fwd_ms, bwd_ms;
  int iters;
  char status[96];
} form_result;

/* Times `iters` calls of the pass (after the warm-up), median ms into *ms. Returns 0, or
 * the API status (message printed), or -1 on a CUDA error. */
static int time_pass(mlagen_context *ctx, mlagen_plan *plan, int bwd, const mlagen_tensors *t,
                     CUdeviceptr ws, size_t ws_b, CUdeviceptr sv, size_t sv_b, double *ms) {
  CUevent *const ev = gpu_events();
  if (!ev) return -1;
  const int n = g_iters < 256 ? g_iters : 256;
  for (int i = 0; i < g_warmup + n; i++) {
    const int timed = i >= g_warmup, k = i - g_warmup;
    if (timed && k == 0 && CU(drv->cuEventRecord(ev[0], g_stream))) return -1;
    int rc = bwd ? mlagen_backward(plan, t, (void *)ws, ws_b, (void *)sv, sv_b, g_stream)
                 : mlagen_forward(plan, t, (void *)ws, ws_b, (void *)sv, sv_b, g_stream);
    if (rc) {
      say("  %s (timing): %s: %s\n", bwd ? "mlagen_backward" : "mlagen_forward",
          mlagen_status_name(rc), mlagen_last_message(ctx));
      return rc;
    }
    if (timed && CU(drv->cuEventRecord(ev[k + 1], g_stream))) return -1;
  }
  if (CU(drv->cuEventSynchronize(ev[n]))) return -1;
  float tm[256];
  for (int i = 0; i < n; i++)
    if (CU(drv->cuEventElapsedTime(&tm[i], ev[i], ev[i + 1]))) return -1;
  qsort(tm, (size_t)n, sizeof tm[0], cmp_float);
  *ms = n % 2 ? tm[n / 2] : 0.5 * (tm[n / 2 - 1] + tm[n / 2]);
  return 0;
}

/* Where the plan's lse lives in the saved area: the executor's layout (mg_plan_mem_layout
 * with MG_CUDA_EXEC_ALIGN) of the same plan. Returns the byte offset, or -1 (printed). */
static int64_t lse_offset(mg_form f, int P, int rank, size_t saved_bytes, int64_t *bytes) {
  static mg_plan p; /* large: not on the stack */
  static mg_plan_mem m;
  mg_diag d = MG_DIAG_INIT;
  mg_plan_args a = {.shape = &g_case.shape, .form = f, .sp = P, .rank = rank, .batch = g_case.B,
                    .seq = g_case.S, .causal = g_case.causal, .dtype = g_dt, .varlen = g_varlen};
  int64_t off = -1;
  if (mg_plan_build(&p, &a, &d) || mg_plan_mem_layout(&p, MG_CUDA_EXEC_ALIGN, &m, &d)) {
    say("  lse: cannot lay out the plan: %s\n", mg_diag_msg(&d));
  } else {
    const int b = mg_plan_find(&p, "lse");
    if (b < 0 || m.where[b] != MG_MEM_SAVED) say("  lse: not in the saved area of this plan\n");
    else if ((size_t)m.saved_bytes != saved_bytes)
      say("  lse: the saved area is %zu bytes, the executor's layout %lld: lse not located\n",
          saved_bytes, (long long)m.saved_bytes);
    else off = m.offset[b], *bytes = mg_plan_buf_bytes(&p.bufs[b]);
  }
  mg_diag_clear(&d);
  return off;
}

/* Copies the outputs (device tensors dev[], lse in the saved area) into global doubles and
 * the raw bytes into raw[] (for the bitwise comparison; raw[C_LSE] the lse). */
static int fetch(const mlagen_sizes *z, CUdeviceptr dev[T_N], CUdeviceptr sv, int64_t lse_off,
                 int64_t lse_b, outs *o, void *raw[C_N], size_t raw_b[C_N]) {
  for (int i = 0; i < T_N; i++) {
    const int k = k_out_of[i];
    if (k < 0) continue;
    const int c = k == TU_O ? C_O : k == TU_DQ ? C_DQ : k == TU_DCKV ? C_DCKV : k == TU_DKROPE ? C_DKROPE : C_DW;
    const mlagen_tensor_info *ti = info_at(z, i);
    const int64_t n = c_numel(c);
    if (ti->bytes != (size_t)n * (ti->dtype == MLAGEN_DTYPE_F32 ? 4 : 2)) {
      say("  output %s: %zu bytes, the reference has %lld values\n", ti->name, ti->bytes, (long long)n);
      return -1;
    }
    raw_b[c] = ti->bytes;
    if (CU(drv->cuMemcpyDtoH(raw[c], dev[i], ti->bytes))) return -1;
    for (int64_t j = 0; j < n; j++)
      o->v[c][j] = ti->dtype == MLAGEN_DTYPE_F32 ? ((const float *)raw[c])[j] : from16(((const e16 *)raw[c])[j]);
  }
  raw_b[C_LSE] = 0;
  if (lse_off >= 0 && lse_b != c_numel(C_LSE) * 4) {
    say("  lse: %lld bytes in the plan, the reference has %lld values\n", (long long)lse_b,
        (long long)c_numel(C_LSE));
    lse_off = -1;
  }
  if (lse_off >= 0) {
    raw_b[C_LSE] = (size_t)lse_b;
    if (CU(drv->cuMemcpyDtoH(raw[C_LSE], sv + (CUdeviceptr)lse_off, (size_t)lse_b))) return -1;
    for (int64_t j = 0; j < c_numel(C_LSE); j++) o->v[C_LSE][j] = ((const float *)raw[C_LSE])[j];
  } else {
    for (int64_t j = 0; j < c_numel(C_LSE); j++) o->v[C_LSE][j] = NAN;
  }
  return 0;
}

/* The first differing element of two runs' raw outputs, or -1 when every byte is equal. */
static int bitwise(const char *fname, void *a[C_N], void *b[C_N], const size_t n[C_N]) {
  int equal = 1;
  for (int k = 0; k < C_N; k++) {
    if (!n[k] || !memcmp(a[k], b[k], n[k])) continue;
    const size_t es = k == C_LSE || k == C_DW ? 4 : 2;
    size_t i = 0;
    while ((i + 1) * es <= n[k] && !memcmp((char *)a[k] + i * es, (char *)b[k] + i * es, es)) i++;
    double x, y;
    if (es == 4) x = ((float *)a[k])[i], y = ((float *)b[k])[i];
    else x = from16(((e16 *)a[k])[i]), y = from16(((e16 *)b[k])[i]);
    say("  %-9s bitwise: %s differs between two runs: first at element %zu: %.9g then %.9g\n",
        fname, k_cname[k], i, x, y);
    equal = 0;
  }
  if (equal) say("  %-9s bitwise equal (two runs, every output and the lse)\n", fname);
  return equal;
}

/* The attention kernels plan runs (mlagen_plan_kernel, after its first passes), one line:
 * which family the CUDA executor chose for this device, forward and backward. */
static void print_attention_kernels(const char *fname, const mlagen_plan *plan) {
  int n = 0;
  if (mlagen_plan_kernel(plan, 0, &n, NULL, NULL)) return;
  say("%-9s kernels:", fname);
  for (int i = 0; i < n; i++) {
    const char *name = NULL;
    if (mlagen_plan_kernel(plan, i, NULL, &name, NULL) || !name) continue;
    if (strstr(name, "_attn_fwd") || strstr(name, "_attn_bwd_dkdv") || strstr(name, "_attn_bwd_dq") ||
        strstr(name, "_mqa_"))
      say(" %s", name);
  }
  say("\n");
}

static int run_form(mlagen_context *ctx, const mlagen_model *model, int fi, double *const in[TU_N_IN],
                    form_result *r) {
  memset(r, 0, sizeof *r);
  r->bitwise = -1;
  snprintf(r->status, sizeof r->status, "ok");
  const char *fname = mg_form_name((mg_form)fi);
  int rc_out = 0;
  mlagen_plan *plan = NULL;
  mlagen_plan_desc pd = {.form = k_forms[fi], .batch = g_case.B, .seq = g_case.S, .sp_rank = 0,
                         .sp_size = 1, .causal = g_case.causal,
                         .dtype = g_dt == MG_F16 ? MLAGEN_DTYPE_F16 : MLAGEN_DTYPE_BF16,
                         .varlen = g_varlen};
  mlagen_sizes z;
  mlagen_tensors t;
  memset(&t, 0, sizeof t);
  if (g_varlen) t.cu_seqlens = g_cu, t.n_cu_seqlens = g_ncu + 1;
  CUdeviceptr dev[T_N] = {0}, ws = 0, sv = 0;
  void *host[T_N] = {0}, *raw[2][C_N] = {{0}};
  size_t raw_b[2][C_N];
  outs got;
  memset(&got, 0, sizeof got);
  int rc = mlagen_plan_create(ctx, model, &pd, &plan);
  if (!rc) rc = mlagen_plan_sizes(plan, &z);
  if (rc && g_dt == MG_F16) { /* whether the API takes f16 is its call: reported, not passed */
    say("%-9s refused by the API: mlagen_plan_create (%s): %s: %s\n", fname, mg_dtype_name(g_dt),
        mlagen_status_name(rc), mlagen_last_message(ctx));
    snprintf(r->status, sizeof r->status, "refused by the API (%s)", mlagen_status_name(rc));
    r->refused = 1;
    goto done;
  }
  if (rc) {
    say("%s: mlagen_plan_create/sizes: %s: %s\n", fname, mlagen_status_name(rc), mlagen_last_message(ctx));
    snprintf(r->status, sizeof r->status, "%s", mlagen_status_name(rc));
    goto done;
  }
  for (int i = 0; i < T_N; i++) {
    const mlagen_tensor_info *ti = info_at(&z, i);
    mlagen_tensor *tt = tensor_at(&t, i);
    tt->dtype = ti->dtype, tt->ndim = ti->ndim;
    memcpy(tt->dims, ti->dims, sizeof tt->dims);
    if (CU(drv->cuMemAlloc(&dev[i], ti->bytes ? ti->bytes : 16))) goto cuda_fail;
    tt->data = (void *)(uintptr_t)dev[i];
    if (!(host[i] = malloc(ti->bytes ? ti->bytes : 16))) goto cuda_fail;
    if (k_in_of[i] >= 0) {
      const int64_t n = tu_in_numel(&g_case, k_in_of[i]);
      if ((size_t)n * 2 != ti->bytes || (ti->dtype != MLAGEN_DTYPE_BF16 && ti->dtype != MLAGEN_DTYPE_F16)) {
        say("%s: tensor %s: %zu bytes (dtype %d), the test made %lld 16-bit values\n", fname,
            ti->name, ti->bytes, (int)ti->dtype, (long long)n);
        snprintf(r->status, sizeof r->status, "tensor size mismatch");
        goto done;
      }
      e16 *h = host[i];
      for (int64_t k = 0; k < n; k++) h[k] = to16(in[k_in_of[i]][k]);
      if (CU(drv->cuMemcpyHtoD(dev[i], h, ti->bytes))) goto cuda_fail;
    }
  }
  if (CU(drv->cuMemAlloc(&ws, z.workspace_bytes ? z.workspace_bytes : 256)) ||
      CU(drv->cuMemAlloc(&sv, z.saved_bytes ? z.saved_bytes : 256)))
    goto cuda_fail;
  int64_t lse_b = 0;
  const int64_t lse_off = lse_offset((mg_form)fi, 1, 0, z.saved_bytes, &lse_b);
  for (int k = 0; k < C_N; k++) {
    const size_t b = k == C_LSE ? (size_t)(lse_b > 0 ? lse_b : 16) : (size_t)c_numel(k) * 4 + 16;
    if (!(raw[0][k] = malloc(b)) || !(raw[1][k] = malloc(b))) goto cuda_fail;
  }
  if (outs_alloc(&got)) goto cuda_fail;

  /* two runs: forward (the first prepares the plan) and backward, everything NaN first */
  for (int run = 0; run < 2; run++) {
    for (int i = 0; i < T_N; i++)
      if (k_in_of[i] < 0 && CU(drv->cuMemsetD8(dev[i], 0xff, info_at(&z, i)->bytes))) goto cuda_fail;
    if (CU(drv->cuMemsetD8(ws, 0xff, z.workspace_bytes ? z.workspace_bytes : 256)) ||
        CU(drv->cuMemsetD8(sv, 0xff, z.saved_bytes ? z.saved_bytes : 256)))
      goto cuda_fail;
    const double t0 = wall_s();
    rc = mlagen_forward(plan, &t, (void *)(uintptr_t)ws, z.workspace_bytes, (void *)(uintptr_t)sv,
                        z.saved_bytes, g_stream);
    if (rc) {
      say("%s: mlagen_forward: %s: %s\n", fname, mlagen_status_name(rc), mlagen_last_message(ctx));
      snprintf(r->status, sizeof r->status, "%s", mlagen_status_name(rc));
      goto done;
    }
    if (cu(drv->cuStreamSynchronize(g_stream), "cuStreamSynchronize after mlagen_forward")) goto cuda_fail;
    if (run == 0) r->prepare_s = wall_s() - t0;
    if (CU(drv->cuMemsetD8(ws, 0xff, z.workspace_bytes ? z.workspace_bytes : 256))) goto cuda_fail;
    rc = mlagen_backward(plan, &t, (void *)(uintptr_t)ws, z.workspace_bytes, (void *)(uintptr_t)sv,
                         z.saved_bytes, g_stream);
    if (rc) {
      say("%s: mlagen_backward: %s: %s\n", fname, mlagen_status_name(rc), mlagen_last_message(ctx));
      snprintf(r->status, sizeof r->status, "%s", mlagen_status_name(rc));
      goto done;
    }
    if (cu(drv->cuStreamSynchronize(g_stream), "cuStreamSynchronize after mlagen_backward")) goto cuda_fail;
    if (fetch(&z, dev, sv, lse_off, lse_b, &got, raw[run], raw_b[run])) goto cuda_fail;
    if (run == 0) {
      r->ran = 1;
      print_attention_kernels(fname, plan);
      if (g_no_check) {
        r->ok = all_finite(fname, &got);
        for (int k = 0; k < C_N; k++) r->chk.ratio[k] = NAN;
      } else {
        check_all(fname, &got, fi == MG_FORM_ABSORBED, &r->chk);
        r->ok = r->chk.ok && lse_off >= 0;
      }
    }
  }
  r->bitwise = bitwise(fname, raw[0], raw[1], raw_b[0]);
  if (!r->bitwise) r->ok = 0;
  if (!r->ok) snprintf(r->status, sizeof r->status, g_no_check ? "non-finite or not deterministic" : "tolerance or not deterministic");

  if (g_iters > 0) {
    r->iters = g_iters < 256 ? g_iters : 256;
    rc = time_pass(ctx, plan, 0, &t, ws, z.workspace_bytes, sv, z.saved_bytes, &r->fwd_ms);
    if (!rc) rc = time_pass(ctx, plan, 1, &t, ws, z.workspace_bytes, sv, z.saved_bytes, &r->bwd_ms);
    if (rc < 0) goto cuda_fail;
    if (rc) {
      r->ok = 0;
      snprintf(r->status, sizeof r->status, "%s (timing)", mlagen_status_name(rc));
    }
  }
  say("%-9s %s  %s  fwd %8.3f ms  bwd %8.3f ms  (prepare %.1f s)\n", fname,
      g_no_check ? (r->ok ? "not checked" : "FAIL (not checked)") : r->ok ? "ok" : "FAIL",
      r->bitwise ? "bitwise equal" : "NOT bitwise equal", r->fwd_ms, r->bwd_ms, r->prepare_s);
  goto done;
cuda_fail:
  rc_out = -1;
  r->ok = 0;
  snprintf(r->status, sizeof r->status, "CUDA error");
done:
  if (!r->ran && !r->refused) say("%-9s FAIL (%s)\n", fname, r->status);
  if (g_stream) cu(drv->cuStreamSynchronize(g_stream), "cuStreamSynchronize");
  for (int i = 0; i < T_N; i++) {
    if (dev[i]) cu(drv->cuMemFree(dev[i]), "cuMemFree");
    free(host[i]);
  }
  for (int k = 0; k < C_N; k++) free(raw[0][k]), free(raw[1][k]);
  outs_free(&got);
  if (ws) cu(drv->cuMemFree(ws), "cuMemFree");
  if (sv) cu(drv->cuMemFree(sv), "cuMemFree");
  mlagen_plan_destroy(plan);
  return rc_out;
}

#ifdef FORMS_MPI
/* ---- the executor path: sp P with the staged MPI communicator ----------------------------
 * mlagen_forms_check_mpi: CUDA device ops, the GPU. mlagen_forms_check_host (FORMS_HOST,
 * a ctest): CPU device ops (tests/cuda_exec_host_ops.h: generated kernels on the host
 * executor, CBLAS GEMMs) on the fake driver, whose "device" memory is host memory, so this
 * whole path (staging, gathering, checks, bitwise repeat) runs without a GPU. */

#ifdef FORMS_HOST
/* Test seam (ctest gpu_forms_host_inject_*): $FORMS_CHECK_INJECT puts an error the checks
 * must see into the gathered outputs: "dq_row" zeroes dq of the last token, "dckv_cols"
 * makes half of dc_kv's columns 1% too large, "lse_row" moves one row's lse by 2e-5,
 * "o_row" adds 10% of o's rms (five times the noise) to one token's o. */
static void inject(outs *o) {
  const char *k = getenv("FORMS_CHECK_INJECT");
  if (!k || !*k) return;
  const int64_t S = g_case.S, H = g_case.shape.heads, dqk = g_case.shape.qk_nope_head_dim + g_case.shape.qk_rope_head_dim;
  const int64_t dc = g_case.shape.kv_lora_rank, dv = g_case.shape.v_head_dim;
  if (!strcmp(k, "dq_row"))
    for (int64_t i = 0; i < H * dqk; i++) o->v[C_DQ][(S - 1) * H * dqk + i] = 0;
  else if (!strcmp(k, "dckv_cols"))
    for (int64_t s = 0; s < S; s++)
      for (int64_t j = 0; j < dc / 2; j++) o->v[C_DCKV][s * dc + j] *= 1.01;
  else if (!strcmp(k, "lse_row"))
    o->v[C_LSE][S / 2] += 2e-5;
  else if (!strcmp(k, "o_row")) {
    double ss = 0;
    for (int64_t i = 0; i < S * H * dv; i++) ss += o->v[C_O][i] * o->v[C_O][i];
    for (int64_t i = 0; i < H * dv; i++) o->v[C_O][(S / 3) * H * dv + i] += 0.1 * sqrt(ss / (double)(S * H * dv));
  }
  say("injected: %s\n", k);
}
#endif

static mg_comm *g_mpi, *g_staged;
static mg_dev_ops *g_ops;
static mg_gen *g_gen;

/* Runs form fi on this rank's shard twice; rank 0 gathers the first run and checks it;
 * every rank compares its two runs byte for byte. Fills r (the same verdict on every
 * rank). */
static int run_form_exec(int fi, double *const in[TU_N_IN], form_result *r) {
  memset(r, 0, sizeof *r);
  r->bitwise = -1;
  snprintf(r->status, sizeof r->status, "ok");
  const char *fname = mg_form_name((mg_form)fi);
  const int P = g_size, rk = g_rank;
  const mg_shape *sh = &g_case.shape;
  const int64_t S = g_case.S, Sl = S / P, H = sh->heads, Hl = H / P, dn = sh->qk_nope_head_dim,
                dr = sh->qk_rope_head_dim, dv = sh->v_head_dim, dc = sh->kv_lora_rank;
  static mg_plan p;
  mg_diag d = MG_DIAG_INIT;
  mg_cuda_exec *x = NULL;
  const double t0 = wall_s();
  mg_plan_args a = {.shape = sh, .form = (mg_form)fi, .sp = P, .rank = rk, .batch = 1, .seq = S,
                    .causal = g_case.causal, .dtype = g_dt, .varlen = g_varlen};
  mg_cuda_exec_opts eo = {.gen = g_gen};
  int rc = mg_plan_build(&p, &a, &d);
  for (int turn = 0; turn < 2; turn++) { /* rank 0 first: it builds (host) or compiles (JIT) */
    if ((turn == 0) == (rk == 0) && !rc) rc = mg_cuda_exec_prepare(&p, g_ops, &eo, &x, &d);
    MPI_Barrier(MPI_COMM_WORLD);
  }
  /* local tensor sizes (elements): inputs are this rank's tokens, w_kv_b whole */
  const int64_t nin[TU_N_IN] = {Sl * H * (dn + dr), Sl * dc, Sl * dr, H * (dn + dv) * dc, Sl * H * dv};
  const int cp = fi == MG_FORM_LAGA_CP; /* all heads, this rank's two chunks of tokens */
  const int64_t nout[C_N] = {Sl * H * dv, cp ? H * Sl : Hl * S, Sl * H * (dn + dr), Sl * dc, Sl * dr,
                             H * (dn + dv) * dc};
  CUdeviceptr din[TU_N_IN] = {0}, dout[C_N] = {0}, ws = 0, sv = 0;
  const int64_t ws_b = x ? mg_cuda_exec_workspace_bytes(x) : 0, sv_b = x ? mg_cuda_exec_saved_bytes(x) : 0;
  const size_t wsz = (size_t)(ws_b ? ws_b : 256), svz = (size_t)(sv_b ? sv_b : 256);
  outs got;
  memset(&got, 0, sizeof got);
  void *raw[2][C_N] = {{0}};
  size_t raw_b[C_N];
  int bad = rc != 0;
  if (rc) fprintf(stderr, "[rank %d] %s: prepare: %s\n", rk, fname, mg_diag_msg(&d));
  for (int k = 0; !bad && k < TU_N_IN; k++) {
    int64_t B_, S_, w;
    tu_in_dims(&g_case, k, &B_, &S_, &w);
    e16 *h = malloc((size_t)nin[k] * 2);
    bad |= !h || CU(drv->cuMemAlloc(&din[k], (size_t)nin[k] * 2));
    if (!bad) {
      for (int64_t i = 0; i < nin[k]; i++) /* this rank's rows: mg_form_token_pos */
        h[i] = to16(in[k][k == TU_W ? i : mg_form_token_pos((mg_form)fi, P, Sl, rk, i / w) * w + i % w]);
      bad |= CU(drv->cuMemcpyHtoD(din[k], h, (size_t)nin[k] * 2));
    }
    free(h);
  }
  for (int k = 0; !bad && k < C_N; k++) {
    raw_b[k] = (size_t)nout[k] * (k == C_DW || k == C_LSE ? 4 : 2);
    bad |= !(raw[0][k] = malloc(raw_b[k])) || !(raw[1][k] = malloc(raw_b[k]));
    if (k != C_LSE && !bad) bad |= CU(drv->cuMemAlloc(&dout[k], raw_b[k]));
  }
  if (!bad) bad |= CU(drv->cuMemAlloc(&ws, wsz)) || CU(drv->cuMemAlloc(&sv, svz)) || outs_alloc(&got);
  int all_bad = 0;
  MPI_Allreduce(&bad, &all_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (all_bad) goto out; /* nobody entered a collective */
  r->prepare_s = wall_s() - t0;
  const float *lse_dev = mg_cuda_exec_buffer(x, "lse", NULL, (void *)(uintptr_t)sv);
  int lse_ok = lse_dev != NULL;
  if (P == 1) { /* the API path locates the lse by the same layout: cross-check it here */
    int64_t lb = 0;
    const int64_t off = lse_offset((mg_form)fi, 1, 0, (size_t)sv_b, &lb);
    if (off != (int64_t)((uintptr_t)lse_dev - (uintptr_t)sv) || lb != (int64_t)raw_b[C_LSE]) {
      say("  %-9s lse: the API path's offset %lld (%lld bytes) is not the executor's %lld\n", fname,
          (long long)off, (long long)lb, (long long)((uintptr_t)lse_dev - (uintptr_t)sv));
      lse_ok = 0;
    }
  }
  mg_cuda_tensors t = {(void *)(uintptr_t)din[TU_Q], (void *)(uintptr_t)din[TU_CKV],
                       (void *)(uintptr_t)din[TU_KROPE], (void *)(uintptr_t)din[TU_W],
                       (void *)(uintptr_t)din[TU_DO], (void *)(uintptr_t)dout[C_O],
                       (void *)(uintptr_t)dout[C_DQ], (void *)(uintptr_t)dout[C_DCKV],
                       (void *)(uintptr_t)dout[C_DKROPE], (void *)(uintptr_t)dout[C_DW],
                       g_varlen ? g_cu : NULL, g_varlen ? g_ncu + 1 : 0};
  for (int run = 0; run < 2; run++) {
    for (int k = 0; k < C_N; k++)
      if (dout[k]) rc |= CU(drv->cuMemsetD8(dout[k], 0xff, raw_b[k]));
    rc |= CU(drv->cuMemsetD8(ws, 0xff, wsz)) || CU(drv->cuMemsetD8(sv, 0xff, svz));
    if (!rc)
      rc = mg_cuda_exec_run(x, MG_FWD, &t, (void *)(uintptr_t)ws, (size_t)ws_b, (void *)(uintptr_t)sv,
                            (size_t)sv_b, g_staged, g_stream, &d);
    if (!rc && !(rc = CU(drv->cuMemsetD8(ws, 0xff, wsz))))
      rc = mg_cuda_exec_run(x, MG_BWD, &t, (void *)(uintptr_t)ws, (size_t)ws_b, (void *)(uintptr_t)sv,
                            (size_t)sv_b, g_staged, g_stream, &d);
    if (!rc) rc = CU(drv->cuStreamSynchronize(g_stream));
    if (rc) { /* a rank stuck in a collective: end the job */
      fprintf(stderr, "[rank %d] %s: run: %s\n", rk, fname, mg_diag_msg(&d));
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (int k = 0; k < C_N; k++) {
      const CUdeviceptr src = k == C_LSE ? (CUdeviceptr)(uintptr_t)lse_dev : dout[k];
      if (src && CU(drv->cuMemcpyDtoH(raw[run][k], src, raw_b[k]))) MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  if (x && rk == 0) { /* the attention kernels this device runs (as print_attention_kernels; after
                    * the passes, which prepare them) */
    say("%-9s kernels:", mg_form_name((mg_form)fi));
    for (int i = 0; i < mg_cuda_exec_kernel_info(x, 0, NULL, NULL); i++) {
      const char *name = NULL, *why = NULL;
      mg_cuda_exec_kernel_info(x, i, &name, &why);
      if (strstr(name, "_attn_fwd") || strstr(name, "_attn_bwd_dkdv") || strstr(name, "_attn_bwd_dq") ||
          strstr(name, "_mqa_"))
        say(" %s", name);
    }
    say("\n");
  }
  /* this rank's part of the first run into global arrays (zero elsewhere), summed on rank 0 */
  for (int k = 0; k < C_N; k++) {
    const int64_t n = nout[k];
    const int es = k == C_DW || k == C_LSE ? 4 : 2;
    const int64_t w = k == C_LSE || k == C_DW ? 1 : n / Sl;
    for (int64_t i = 0; i < n; i++) {
      const double v = !lse_dev && k == C_LSE ? NAN
                       : es == 4 ? ((const float *)raw[0][k])[i] : from16(((const e16 *)raw[0][k])[i]);
      const int64_t gi = k == C_DW                ? i
                         : k == C_LSE && cp       ? i / Sl * S + mg_cp_pos(P, Sl, rk, i % Sl)
                         : k == C_LSE             ? (rk * Hl + i / S) * S + i % S
                                                  : mg_form_token_pos((mg_form)fi, P, Sl, rk, i / w) * w + i % w;
      got.v[k][gi] = v;
    }
    MPI_Reduce(g_rank ? got.v[k] : MPI_IN_PLACE, got.v[k], (int)c_numel(k), MPI_DOUBLE, MPI_SUM, 0,
               MPI_COMM_WORLD);
  }
  r->ran = 1;
#ifdef FORMS_HOST
  if (g_rank == 0) inject(&got);
#endif
  int eq = 1, all_eq = 1, lse_all = 1;
  for (int k = 0; k < C_N; k++) eq &= !memcmp(raw[0][k], raw[1][k], raw_b[k]);
  if (!eq && rk == 0) bitwise(fname, raw[0], raw[1], raw_b); /* the first differences */
  if (!eq && rk != 0) fprintf(stderr, "[rank %d] %s: outputs differ between two runs\n", rk, fname);
  MPI_Allreduce(&eq, &all_eq, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&lse_ok, &lse_all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  r->bitwise = all_eq;
  if (g_rank == 0) {
    if (g_no_check) r->ok = all_finite(fname, &got);
    else check_all(fname, &got, fi == MG_FORM_ABSORBED, &r->chk), r->ok = r->chk.ok;
    r->ok = r->ok && all_eq && lse_all;
    say("%-9s sp %d %s  %s  (prepare, two forwards and backwards: %.1f s)\n", fname, P,
        g_no_check ? (r->ok ? "not checked" : "FAIL (not checked)") : r->ok ? "ok" : "FAIL",
        all_eq ? "bitwise equal" : "NOT bitwise equal", wall_s() - t0);
  }
  MPI_Bcast(&r->ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (!r->ok) snprintf(r->status, sizeof r->status, "tolerance, lse or not deterministic");
out:
  if (all_bad) {
    snprintf(r->status, sizeof r->status, "setup failed on a rank");
    say("%-9s sp %d FAIL (%s)\n", fname, P, r->status);
  }
  for (int k = 0; k < TU_N_IN; k++)
    if (din[k]) cu(drv->cuMemFree(din[k]), "cuMemFree");
  for (int k = 0; k < C_N; k++) {
    if (dout[k]) cu(drv->cuMemFree(dout[k]), "cuMemFree");
    free(raw[0][k]), free(raw[1][k]);
  }
  if (ws) cu(drv->cuMemFree(ws), "cuMemFree");
  if (sv) cu(drv->cuMemFree(sv), "cuMemFree");
  outs_free(&got);
  mg_cuda_exec_destroy(x);
  mg_diag_clear(&d);
  return 0;
}
#endif

/* ---- main ------------------------------------------------------------------------------- */

static int usage(void) {
  if (!g_rank)
    fprintf(stderr,
            "usage: mlagen_forms_check OUTDIR [--heads 16] [--seq 256] [--forms LIST] [--iters 20]\n"
            "                          [--warmup 3] [--seed N] [--no-check] [--no-causal]\n"
            "                          [--dtype bf16|f16] [--ref-rows N] [--dims DN,DR,DV,DC]\n"
            "                          [--sp P (mlagen_forms_check_mpi, mlagen_forms_check_host)]\n"
            "                          [--varlen (packed documents in a capacity of --seq)]\n"
            "  LIST: comma-separated of explicit, absorbed, laga, laga-r, laga-f (default all)\n");
  return 2;
}

int main(int argc, char **argv) {
  g_rank = 0; /* say() prints on rank 0 only; cu() tags stderr with the rank */
#ifdef FORMS_MPI
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
#define RETURN(x) do { int rv_ = (x); MPI_Finalize(); return rv_; } while (0)
#else
#define RETURN(x) return (x)
#endif
  if (argc < 2 || argv[1][0] == '-') RETURN(usage());
  const char *outdir = argv[1];
  int H = 16, S = 256, causal = 1, want[MG_FORM_COUNT] = {1, 1, 1, 1, 1, 1}, sp = 1;
  int64_t ref_rows = 0;
  int dn = 128, dr = 64, dv = 128, dc = 512;
  uint64_t seed = 20250712;
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--no-check")) { g_no_check = 1; continue; }
    if (!strcmp(a, "--no-causal")) { causal = 0; continue; }
    if (!strcmp(a, "--varlen")) { g_varlen = 1; continue; }
    if (!v) RETURN(usage());
    i++;
    if (!strcmp(a, "--heads")) { if ((H = atoi(v)) < 1 || H > 128) RETURN(usage()); }
    else if (!strcmp(a, "--seq")) { if ((S = atoi(v)) < 1 || S > 65536) RETURN(usage()); }
    else if (!strcmp(a, "--iters")) { if ((g_iters = atoi(v)) < 0 || g_iters > 256) RETURN(usage()); }
    else if (!strcmp(a, "--warmup")) { if ((g_warmup = atoi(v)) < 0) RETURN(usage()); }
    else if (!strcmp(a, "--seed")) seed = strtoull(v, NULL, 0);
    else if (!strcmp(a, "--ref-rows")) { if ((ref_rows = atoll(v)) < 0) RETURN(usage()); }
    else if (!strcmp(a, "--sp")) { if ((sp = atoi(v)) < 1) RETURN(usage()); }
    else if (!strcmp(a, "--dims")) {
      if (sscanf(v, "%d,%d,%d,%d", &dn, &dr, &dv, &dc) != 4 || dn < 16 || dr < 16 || dv < 16 || dc < 16)
        RETURN(usage());
    }
    else if (!strcmp(a, "--dtype")) {
      if (!strcmp(v, "bf16")) g_dt = MG_BF16;
      else if (!strcmp(v, "f16")) g_dt = MG_F16;
      else RETURN(usage());
    } else if (!strcmp(a, "--forms")) {
      memset(want, 0, sizeof want);
      char buf[256];
      snprintf(buf, sizeof buf, "%s", v);
      for (char *sv = NULL, *tok = strtok_r(buf, ",", &sv); tok; tok = strtok_r(NULL, ",", &sv)) {
        int f = 0;
        while (f < MG_FORM_COUNT && strcmp(tok, mg_form_name((mg_form)f))) f++;
        if (f == MG_FORM_COUNT) RETURN(usage());
        want[f] = 1;
      }
    } else RETURN(usage());
  }
#ifdef FORMS_MPI
  if (sp != g_size) {
    if (!g_rank) fprintf(stderr, "forms_check: --sp %d under %d MPI ranks\n", sp, g_size);
    RETURN(2);
  }
#else
  if (sp != 1) {
    fprintf(stderr, "forms_check: --sp %d needs mlagen_forms_check_mpi under mpirun\n", sp);
    return 2;
  }
#endif
  mg_diag d = MG_DIAG_INIT;
  char path[4096];
  if (!g_rank) {
    if (mg_fs_mkdirs(outdir, &d)) {
      fprintf(stderr, "forms_check: %s\n", mg_diag_msg(&d));
      mg_diag_clear(&d);
      RETURN(1);
    }
    snprintf(path, sizeof path, "%s/forms%s.log", outdir, sp > 1 ? "-sp" : "");
    if (!(g_log = fopen(path, "w"))) {
      fprintf(stderr, "forms_check: cannot write %s: %s\n", path, strerror(errno));
      RETURN(1);
    }
  }
  if (mg_driver_get(&drv, &d)) {
    say("forms_check: %s\n", mg_diag_msg(&d));
    const int nodrv = d.status == MLAGEN_ENODRIVER;
    mg_diag_clear(&d);
    if (g_log) fclose(g_log);
    RETURN(nodrv ? 2 : 1);
  }
  int rc = 1, retained = 0;
  CUdevice dev;
  CUcontext cctx = NULL;
  char name[256] = "";
  mlagen_context *ctx = NULL;
  mlagen_model *model = NULL;
  double *in[TU_N_IN] = {0};
  form_result res[MG_FORM_COUNT];
  memset(res, 0, sizeof res);
  if (CU(drv->cuDeviceGet(&dev, 0)) || CU(drv->cuDeviceGetName(name, sizeof name, dev)) ||
      CU(drv->cuDevicePrimaryCtxRetain(&cctx, dev)))
    goto out;
  retained = 1;
  if (CU(drv->cuCtxSetCurrent(cctx)) || CU(drv->cuStreamCreate(&g_stream, CU_STREAM_NON_BLOCKING)))
    goto out;

  const double scale = 1.3689 * 1.3689 / sqrt((double)(dn + dr));
  g_case = (tu_case){.shape = tu_shape(H, dn, dr, dv, dc), .B = 1, .S = S, .causal = causal};
  g_case.shape.softmax_scale = scale;
  if (sp > 1 && (H % sp || S % sp)) {
    say("forms_check: --sp %d must divide --heads %d and --seq %d\n", sp, H, S);
    rc = 2;
    goto out;
  }
  int st = mlagen_context_create(&ctx);
  mlagen_model_desc md = {.num_attention_heads = H, .kv_lora_rank = dc, .qk_rope_head_dim = dr,
                          .qk_nope_head_dim = dn, .v_head_dim = dv, .softmax_scale = scale};
  if (!st) st = mlagen_model_from_desc(ctx, &md, &model);
  if (st) {
    say("forms_check: mlagen context/model: %s: %s\n", mlagen_status_name(st), mlagen_last_message(ctx));
    goto out;
  }
  if (make_inputs(seed, in)) {
    say("forms_check: out of host memory\n");
    goto out;
  }
  if (g_varlen) {
    if (ref_rows > 0) {
      say("forms_check: --varlen takes the full reference (no --ref-rows)\n");
      rc = 2;
      goto out;
    }
    vl_docs(S);
    vl_nan_slack(in);
    char list[128];
    int at = 0;
    for (int j = 0; j <= g_ncu; j++) at += snprintf(list + at, sizeof list - (size_t)at, "%s%d", j ? "," : "", (int)g_cu[j]);
    say("--varlen: cu_seqlens %s (%d documents, T %d of capacity %d; NaN in every slack input row)\n",
        list, g_ncu, (int)g_cu[g_ncu], S);
  }
  g_mr = (mr_case){.H = H, .dn = dn, .dr = dr, .dv = dv, .dc = dc, .S = S, .causal = causal,
                   .scale = scale, .rnd = g_dt == MG_F16 ? 2 : 1};
  if (ref_rows > 0 && ref_rows + 128 < S) g_mr.head1 = 128, g_mr.tail0 = S - ref_rows;
  say("device: %s; driver %d; %s heads (d_n %d, d_r %d, d_v %d, d_c %d) at H %d, "
      "B 1, S %d, %s, %s, sp %d; seed %llu; timing: %s\n", name, drv->driver_version,
      dn == 128 && dr == 64 && dv == 128 && dc == 512 ? "DeepSeek-V3" : "test", dn, dr, dv, dc, H, S, causal ? "causal" : "non-causal", mg_dtype_name(g_dt), sp,
      (unsigned long long)seed, g_iters > 0 && sp == 1 ? "warm-up and median of --iters" : "none");
  {
    const char *mma = getenv("MLAGEN_MMA_SYNC");
    say("kernel families: the CUDA executor's choice for this device (mg_arch_kernel_table: on "
        "sm_90a attn_fwd_sm90, attn_bwd_dkdv_sm90, attn_bwd_dq_sm90); MLAGEN_MMA_SYNC=%s; each "
        "form's attention kernels are listed after its first passes (sp 1)\n",
        mma ? mma : "unset");
  }
  if (g_no_check) {
    say("--no-check: no reference; outputs only required to be finite (not checked)\n");
  } else {
    const double t0 = wall_s();
    if (g_rank == 0 && (g_varlen ? ref_varlen(in)
                                 : mr_run(&g_mr, in[TU_Q], in[TU_CKV], in[TU_KROPE], in[TU_W], in[TU_DO], &g_ref))) {
      say("forms_check: out of host memory for the reference\n");
      goto out;
    }
    say("reference: float64, %s, %.1f s\n",
        g_varlen ? "each document alone, every row (slack rows exactly 0, lse -inf)"
        : g_mr.tail0 > 0 ? "rows [0, 128) and the last --ref-rows (dc_kv, dk_rope: those tokens; dw_kv_b not checked)"
                         : "every row", wall_s() - t0);
  }
#ifdef FORMS_MPI
#ifdef FORMS_HOST
  const int use_exec = 1; /* always: the API's device ops are the GPU's */
#else
  const int use_exec = sp > 1;
#endif
  if (use_exec) {
    MPI_Comm world = MPI_COMM_WORLD;
    int bad = mg_comm_mpi_wrap(&g_mpi, &world, &d) ||
              mg_comm_staged_wrap(&g_staged, g_mpi, drv, g_stream, &d) || mg_gen_open(&g_gen, NULL, &d);
#ifdef FORMS_HOST
    if (!bad && g_dt != MG_BF16) bad = mg_diag_set(&d, MLAGEN_EUNSUPPORTED, "the host device ops run bf16 only");
    if (!bad) { /* an sm_90a device, as the H200's: the fake driver's cuTensorMapEncodeTiled
                 * (the host executor's map format), so the executor runs the sm_90a families */
      host_ops *h = host_ops_new(g_gen);
      snprintf(h->base.arch, sizeof h->base.arch, "sm_90a");
      h->base.drv = drv;
      g_ops = &h->base;
    }
#else
    if (!bad) bad = mg_dev_ops_cuda(&g_ops, &d);
#endif
    if (bad) fprintf(stderr, "[rank %d] forms_check: %s\n", g_rank, mg_diag_msg(&d));
    int any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any) {
      say("forms_check: sp %d: set-up failed (communicator or device ops): %s\n", sp,
          bad ? mg_diag_msg(&d) : "on another rank");
      goto out;
    }
  }
#endif
  int n_bad = 0, n_run = 0, n_refused = 0;
  for (int f = 0; f < MG_FORM_COUNT; f++) {
    if (!want[f]) continue;
    n_run++;
#ifdef FORMS_MPI
    if (use_exec) {
      run_form_exec(f, in, &res[f]);
      if (!res[f].ok) n_bad++;
      continue;
    }
#endif
    if (run_form(ctx, model, f, in, &res[f])) {
      n_bad++;
      break;
    }
    if (res[f].refused) n_refused++;
    else if (!res[f].ok) n_bad++;
  }
  if (!g_rank) {
    snprintf(path, sizeof path, "%s/forms%s.csv", outdir, sp > 1 ? "-sp" : "");
    FILE *csv = fopen(path, "w");
    if (csv) {
      fprintf(csv, "form,H,S,causal,dtype,sp,o,lse,dq,dc_kv,dk_rope,dw_kv_b,ok,bitwise,prepare_s,fwd_ms,bwd_ms,iters,status\n");
      for (int f = 0; f < MG_FORM_COUNT; f++) {
        const form_result *r = &res[f];
        if (!want[f]) continue;
        fprintf(csv, "%s,%d,%d,%d,%s,%d", mg_form_name((mg_form)f), H, S, causal, mg_dtype_name(g_dt), sp);
        for (int k = 0; k < C_N; k++)
          if (r->ran && isfinite(r->chk.ratio[k]) && !g_no_check) fprintf(csv, ",%.3e", r->chk.ratio[k]);
          else fprintf(csv, ",");
        fprintf(csv, ",%s,%s,%.2f,", r->refused ? "refused" : g_no_check ? (r->ok ? "not checked" : "0") : r->ok ? "1" : "0",
                r->bitwise < 0 ? "" : r->bitwise ? "equal" : "differs", r->prepare_s);
        if (r->iters) fprintf(csv, "%.4f,%.4f,%d", r->fwd_ms, r->bwd_ms, r->iters);
        else fprintf(csv, ",,");
        fprintf(csv, ",%s\n", r->status);
      }
      fclose(csv);
      say("wrote %s\n", path);
    } else {
      say("forms_check: cannot write %s: %s\n", path, strerror(errno));
      n_bad++;
    }
  }
  if (g_no_check) say("forms: %d of %d timed, not checked\n", n_run - n_bad - n_refused, n_run);
  else say("forms: %d of %d passed\n", n_run - n_bad - n_refused, n_run);
  if (n_refused) say("forms: %d of %d refused by the API (%s)\n", n_refused, n_run, mg_dtype_name(g_dt));
  rc = n_bad ? 1 : n_refused ? 4 : 0;
out:
  mr_free(&g_ref);
  tu_free(in, TU_N_IN);
#ifdef FORMS_MPI
  mg_dev_ops_destroy(g_ops);
  mg_comm_destroy(g_staged);
  mg_comm_destroy(g_mpi);
  mg_gen_close(g_gen);
#endif
  mlagen_model_destroy(model);
  mlagen_context_destroy(ctx);
  if (g_stream) cu(drv->cuStreamDestroy(g_stream), "cuStreamDestroy");
  if (retained) cu(drv->cuDevicePrimaryCtxRelease(dev), "cuDevicePrimaryCtxRelease");
  say("%s\n", rc == 4 ? "forms_check: refused by the API" : rc ? "forms_check: FAILED" : g_no_check ? "forms_check: ran, not checked" : "forms_check: ok");
  if (g_log) fclose(g_log);
  RETURN(rc);
}
