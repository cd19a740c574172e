/* test_cuda_exec.c: the CUDA executor (runtime/exec/mg_cuda_exec.h) on CPU device operations.
 *
 * The executor's orchestration (memory layout in the caller's workspace and saved area,
 * collectives, GEMMs, every generated kernel with its parameters matched by name and its
 * manifest's grid) runs every form's bf16 plan (P = 1) forward and backward with device
 * ops that work on host memory (tests/cuda_exec_host_ops.h: CBLAS GEMMs, generated
 * kernels on the host executor). Collectives at P = 1 are copies; P = 2 and 4 run under
 * MPI in test_cuda_exec_mpi.c.
 *
 * Checked against the CPU executor (runtime/exec/mg_cpu_exec.h) on the f32 plan of the same
 * form with the same (bf16-rounded) inputs: o, lse (read from the saved area), dq, dc_kv,
 * dk_rope and dw_kv_b per element at tu_tol_bf16 (tests/cpu_test_util.h, where the
 * measured noise is written; a NaN fails); shapes carry DeepSeek-V3's YaRN softmax scale
 * and scores have std about 2 (tu_shape, tu_inputs). The
 * workspace (and, before the forward, the saved area and the outputs) is filled with NaN
 * before each pass, so a buffer read before it is written shows. Shapes (d_n, d_r, d_v,
 * d_c, H): (128, 64, 128, 512, 2) and (64, 32, 64, 256, 2); B 2, S 33 and 1, causal and
 * not; every form (laga-f in its default 2 groups of 1 head).
 *
 * Modes (argv[1]): none, the above; "f16": every form's f16 plan (S 33 and 1, causal) at
 * tu_tol_f16; "sm90": host ops claiming an sm_90a device with the fake driver's tensor-map
 * encoder run attn_fwd_sm90 in the explicit (causal and not), laga and laga-cp plans, at the same
 * tolerances, and the mma.sync attn_fwd when forced (test_sm90_family); "nodriver": mg_dev_ops_cuda without a driver is
 * MLAGEN_ENODRIVER; "fake": with the fake driver (tests/fake_cuda.c, tests/fake_driver.h) and
 * MLAGEN_LIBCUBLAS pointing nowhere, mg_dev_ops_cuda and mlagen_forward fail cleanly with
 * MLAGEN_EDRIVER naming cuBLAS; then with MLAGEN_LIBCUBLAS = the fake driver, which is a
 * fake cuBLAS too, a LAGA plan's forward and backward run through the API (NVRTC compiles
 * its kernels; the fakes compute nothing) and every GEMM used cuBLAS's 32 MiB slice of the
 * caller's workspace (cublasSetWorkspace after cublasSetStream), never cuBLAS's own, and
 * the forward ran attn_fwd_sm90 (the fake device is an sm_90a one) with 4 tensor maps the
 * fake's cuTensorMapEncodeTiled accepted.
 * Every pass also checks cuBLAS's slice: the workspace is the layout's plus exactly
 * 32 MiB, the GEMMs get the 256-byte aligned slice after the layout's, and no step writes
 * there. MLAGEN_TEST_SEED overrides the seed; MLAGEN_TEST_FILTER (a cmocka pattern) runs
 * one case. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cJSON.h>
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cpu_test_util.h"
#include "cuda_exec_host_ops.h"
#include "fake_driver.h"
#include "mg_cpu_exec.h"
#include "mg_module.h"
#include "mg_tune.h"

static uint64_t g_seed = 20260529;
static fake_cuda g_fake; /* the fake driver's hooks (mode "fake") */
/* mode "sm90": fragments every plan's kernel list must have (the sm_90a families; NULL ends) */
static const char *const *g_want_kernel;

/* ---- one form on one case ---------------------------------------------------------------- */

static double g_worst[TU_N_OUT];


/* cuBLAS's slice of the workspace ws (ws_b bytes) after a pass that began with sets_before
 * gemm_workspace calls: the workspace is the static layout's plus exactly 32 MiB; the
 * GEMMs got, once for the pass, the 256-byte aligned 32 MiB right after the layout's; and
 * nothing but the GEMMs wrote there (each 8 bytes still the 0xff fill or the host GEMM's
 * scribble). */
static void check_blas_slice(const mg_plan *plan, const host_ops *h, long sets_before,
                             const void *ws, size_t ws_b) {
  static mg_plan_mem mem;
  mg_diag d = MG_DIAG_INIT;
  if (mg_plan_mem_layout(plan, 256, &mem, &d)) fail_msg("%s", mg_diag_msg(&d));
  const size_t slice = (size_t)32 << 20, at = (size_t)mem.workspace_bytes;
  assert_int_equal(ws_b, at + slice);
  assert_ptr_equal(h->gemm_ws, (const char *)ws + at);
  assert_int_equal(h->gemm_ws_bytes, slice);
  assert_int_equal((uintptr_t)h->gemm_ws % 256, 0);
  assert_int_equal(h->gemm_ws_sets, sets_before + 1);
  uint64_t scribble;
  memset(&scribble, HOST_GEMM_SCRIBBLE, sizeof scribble);
  const uint64_t *w = (const uint64_t *)((const char *)ws + at);
  for (size_t i = 0; i < slice / 8; i++)
    if (w[i] != UINT64_MAX && w[i] != scribble)
      fail_msg("%s: byte %zu of cuBLAS's workspace slice written by a step (0x%016llx)",
               mg_form_name(plan->args.form), 8 * i, (unsigned long long)w[i]);
}

/* tune_dir: the tuned store prepare looks in (the ops then claim a device); tuned: a
 * kernel name fragment that a tuned kernel of the plan must have, every other kernel's
 * configuration the default ("no tuned kernel": every one's; NULL: not checked). */
static void check_form_tuned(const tu_case *c, mg_form f, mg_dtype dt, double *const in[TU_N_IN],
                             host_ops *h, mg_gen *gen, const char *tune_dir, const char *tuned) {
  mg_diag d = MG_DIAG_INIT;
  tu_run ref;
  if (tu_run_form(c, f, 1, 0, NULL, MG_F32, in, &ref, &d)) fail_msg("reference: %s", mg_diag_msg(&d));

  mg_plan *plan = calloc(1, sizeof *plan);
  assert_non_null(plan);
  mg_plan_args a = {.shape = &c->shape, .form = f, .sp = 1, .rank = 0, .batch = c->B,
                    .seq = c->S, .causal = c->causal, .dtype = dt};
  if (mg_plan_build(plan, &a, &d)) fail_msg("%s", mg_diag_msg(&d));
  mg_cuda_exec *x;
  mg_cuda_exec_opts eo = {.gen = gen, .tune_dir = tune_dir};
  double t0 = now();
  if (mg_cuda_exec_prepare(plan, &h->base, &eo, &x, &d)) fail_msg("prepare: %s", mg_diag_msg(&d));
  const double t_prep = now() - t0;
  if (tuned) { /* the tuned kernel was chosen, with the plan's interface tunables kept */
    int found = 0;
    for (int i = 0; i < mg_cuda_exec_kernel_info(x, 0, NULL, NULL); i++) {
      const char *name, *why;
      mg_cuda_exec_kernel_info(x, i, &name, &why);
      if (strstr(name, tuned)) {
        found = 1;
        if (strncmp(why, "tuned: ", 7) != 0) fail_msg("%s: %s", name, why);
        print_message("  %s: %s\n", name, why);
      } else if (strncmp(why, "default: ", 9) != 0) {
        fail_msg("%s: %s", name, why);
      }
    }
    if (!found && strcmp(tuned, "no tuned kernel")) fail_msg("%s: no kernel named *%s*", mg_form_name(f), tuned);
  }
  for (const char *const *w = g_want_kernel; w && *w; w++) { /* the families the ops' arch runs, and why */
    int found = 0;
    for (int i = 0; i < mg_cuda_exec_kernel_info(x, 0, NULL, NULL); i++) {
      const char *name, *why;
      mg_cuda_exec_kernel_info(x, i, &name, &why);
      if (strstr(name, *w)) found = 1, print_message("  %s: %s\n", name, why);
    }
    if (!found) fail_msg("%s: no kernel named *%s*", mg_form_name(f), *w);
  }

  const size_t ws_b = (size_t)mg_cuda_exec_workspace_bytes(x), sv_b = (size_t)mg_cuda_exec_saved_bytes(x);
  void *ws = aligned(ws_b), *saved = aligned(sv_b);
  e16 *inb[TU_N_IN];
  for (int k = 0; k < TU_N_IN; k++) inb[k] = to_e16(dt, in[k], tu_in_numel(c, k));
  void *outs[TU_N_OUT] = {0};
  for (int k = 0; k < TU_N_OUT; k++) {
    if (k == TU_LSE) continue;
    size_t bytes = (size_t)tu_out_numel(c, k) * (k == TU_DW ? 4 : 2);
    outs[k] = malloc(bytes);
    assert_non_null(outs[k]);
    memset(outs[k], 0xff, bytes);
  }
  mg_cuda_tensors t = {.q = inb[TU_Q], .c_kv = inb[TU_CKV], .k_rope = inb[TU_KROPE],
                       .w_kv_b = inb[TU_W], .d_o = inb[TU_DO], .o = outs[TU_O], .dq = outs[TU_DQ],
                       .dc_kv = outs[TU_DCKV], .dk_rope = outs[TU_DKROPE], .dw_kv_b = outs[TU_DW]};
  memset(ws, 0xff, ws_b), memset(saved, 0xff, sv_b); /* NaN in bf16 and f32 */
  t0 = now();
  const long l0 = h->launches;
  long sets = h->gemm_ws_sets;
  if (mg_cuda_exec_run(x, MG_FWD, &t, ws, ws_b, saved, sv_b, NULL, NULL, &d))
    fail_msg("forward: %s", mg_diag_msg(&d));
  check_blas_slice(plan, h, sets, ws, ws_b);
  memset(ws, 0xff, ws_b);
  sets = h->gemm_ws_sets;
  if (mg_cuda_exec_run(x, MG_BWD, &t, ws, ws_b, saved, sv_b, NULL, NULL, &d))
    fail_msg("backward: %s", mg_diag_msg(&d));
  check_blas_slice(plan, h, sets, ws, ws_b);
  const double t_run = now() - t0;
  const float *lse = mg_cuda_exec_buffer(x, "lse", ws, saved);
  assert_non_null(lse); /* every form saves its LSE */

  double e[TU_N_OUT];
  int bad = 0;
  for (int k = 0; k < TU_N_OUT; k++) {
    const int64_t n = tu_out_numel(c, k);
    const void *got = k == TU_LSE ? lse : outs[k];
    const float *want = tu_out_ptr(&ref, k);
    double *g = malloc((size_t)n * sizeof(double)), *w = malloc((size_t)n * sizeof(double));
    assert_true(g && w);
    for (int64_t i = 0; i < n; i++) {
      g[i] = k == TU_LSE || k == TU_DW ? ((const float *)got)[i] : e16_to_f32(dt, ((const e16 *)got)[i]);
      w[i] = want[i];
    }
    char what[512];
    snprintf(what, sizeof what, "%s %s %s S %lld %s: %s", mg_form_name(f), mg_dtype_name(dt),
             c->shape.source, (long long)c->S, c->causal ? "causal" : "non-causal", tu_out_names[k]);
    cc_result r = tu_check(what, g, w, n, tu_rms(w, n), tu_tol_16(dt)[k], tu_out_cols(c, k));
    e[k] = r.min_atol;
    if (e[k] > g_worst[k]) g_worst[k] = e[k];
    bad += !cc_ok(&r);
    free(g), free(w);
  }
  print_message("  %-8s %s dn %3lld S %2lld %-10s needed atol o %.1e lse %.1e dq %.1e dc_kv %.1e "
                "dk_rope %.1e dw_kv_b %.1e  (%d kernels, %ld launches; prepare %.1f s, run %.1f s)\n",
                mg_form_name(f), mg_dtype_name(dt), (long long)c->shape.qk_nope_head_dim,
                (long long)c->S, c->causal ? "causal" : "non-causal", e[TU_O], e[TU_LSE], e[TU_DQ],
                e[TU_DCKV], e[TU_DKROPE], e[TU_DW], mg_cuda_exec_kernel_count(x), h->launches - l0,
                t_prep, t_run);
  if (bad) fail_msg("%s %s: %d output(s) over their tolerance", mg_form_name(f), mg_dtype_name(dt), bad);
  mg_cuda_exec_destroy(x);
  for (int k = 0; k < TU_N_IN; k++) free(inb[k]);
  for (int k = 0; k < TU_N_OUT; k++) free(outs[k]);
  free(ws), free(saved), free(plan);
  tu_run_free(&ref);
}

static void check_form(const tu_case *c, mg_form f, mg_dtype dt, double *const in[TU_N_IN],
                       host_ops *h, mg_gen *gen) {
  check_form_tuned(c, f, dt, in, h, gen, NULL, NULL);
}

/* Every form on shape (d_n, d_r, d_v, d_c, H 2), B 2, S 33 and 1, causal and (with
 * both_masks) not, dtype dt. */
static void check_shape(int dn, int dr, int dv, int dc, mg_dtype dt, int both_masks) {
  mg_diag d = MG_DIAG_INIT;
  mg_gen *g;
  assert_int_equal(mg_gen_open(&g, NULL, &d), 0);
  host_ops *h = host_ops_new(g);
  for (int causal = 1; causal >= !both_masks; causal--) {
    tu_case c = {.shape = tu_shape(2, dn, dr, dv, dc), .B = 2, .causal = causal};
    const int64_t seqs[2] = {1, 33};
    for (int si = 0; si < 2; si++) {
      c.S = seqs[si];
      double *in[TU_N_IN] = {0};
      assert_int_equal(tu_inputs(&c, g_seed + (uint64_t)(si * 2 + causal), in), 0);
      round_inputs(&c, dt, in);
      for (int f = 0; f < MG_FORM_COUNT; f++) check_form(&c, (mg_form)f, dt, in, h, g);
      tu_free(in, TU_N_IN);
    }
  }
  print_message("  %d kernels built, %ld launches, %ld GEMMs, %ld copies\n", h->builds, h->launches,
                h->gemms, h->copies);
  mg_dev_ops_destroy(&h->base);
  mg_gen_close(g);
}

static void test_deepseek_heads(void **state) {
  (void)state;
  check_shape(128, 64, 128, 512, MG_BF16, 1);
}

static void test_unusual_heads(void **state) {
  (void)state;
  check_shape(64, 32, 64, 256, MG_BF16, 1);
}

/* f16 plans: every form on the unusual shape, causal (the non-causal kernels differ only in
 * the mask, which the bf16 runs cover), with kernels generated for fp16 (the f16 mma,
 * __half layout kernels, f16 GEMMs), against the f32 CPU executor on f16-rounded inputs
 * at tu_tol_f16. */
static void test_f16(void **state) {
  (void)state;
  check_shape(64, 32, 64, 256, MG_F16, 0);
}

/* Refusals: an f32 plan; a workspace too small; a NULL tensor the pass reads. */
/* A tuned store for the ops' device: prepare takes its configuration (here a non-default
 * attn_fwd and mqa_fwd tile) where its interface tunables are the step's (the attn_fwd entry,
 * k_packed = 0, serves the LAGA plan's split-key step; the explicit plan's packed step
 * keeps the default), and the pass still matches the CPU executor. */
static void test_tuned_config(void **state) {
  (void)state;
  mg_diag d = MG_DIAG_INIT;
  mg_gen *g;
  assert_int_equal(mg_gen_open(&g, NULL, &d), 0);
  host_ops *h = host_ops_new(g);
  snprintf(h->base.arch, sizeof h->base.arch, "sm_90a");
  snprintf(h->base.device, sizeof h->base.device, "Host Test GPU");
  char dir[] = "/tmp/mlagen-tuned-XXXXXX";
  assert_non_null(mkdtemp(dir));
  tu_case c = {.shape = tu_shape(2, 64, 32, 64, 256), .B = 2, .S = 33, .causal = 1};
  mg_tune_header hd = {.schema = MG_TUNE_SCHEMA, .driver_version = 13000, .sm_count = 132};
  snprintf(hd.template_hash, sizeof hd.template_hash, "%s", mg_gen_template_hash(g));
  snprintf(hd.device, sizeof hd.device, "%s", h->base.device);
  snprintf(hd.arch, sizeof hd.arch, "%s", h->base.arch);
  snprintf(hd.mlagen_version, sizeof hd.mlagen_version, "test");
  snprintf(hd.nvrtc_version, sizeof hd.nvrtc_version, "13.0");
  const struct { const char *family, *pass; const char *cfg[5]; } want[] = {
      {"attn_fwd", "fwd", {"block_m=64", "block_n=64", "k_packed=0", "num_warps=4", "stages=1"}},
      {"mqa_fwd", "fwd", {"block_m=32", "block_n=32", "nsplit=2", "stages=1", NULL}},
  };
  mg_tune_entry e[2];
  memset(e, 0, sizeof e);
  for (int i = 0; i < 2; i++) {
    snprintf(e[i].family, sizeof e[i].family, "%s", want[i].family);
    snprintf(e[i].pass, sizeof e[i].pass, "%s", want[i].pass);
    e[i].heads = 2, e[i].d_n = 64, e[i].d_r = 32, e[i].d_v = 64, e[i].d_c = 256;
    snprintf(e[i].dtype, sizeof e[i].dtype, "bf16");
    e[i].causal = 1, e[i].seq_bucket = mg_tune_bucket(c.S);
    for (int j = 0; j < 5 && want[i].cfg[j]; j++) {
      mg_tunable_value *v = &e[i].config.v[e[i].config.n++];
      const char *eq = strchr(want[i].cfg[j], '=');
      snprintf(v->name, sizeof v->name, "%.*s", (int)(eq - want[i].cfg[j]), want[i].cfg[j]);
      v->value = strtol(eq + 1, NULL, 10);
    }
    e[i].p20_ms = e[i].p50_ms = e[i].p80_ms = 1.0;
  }
  if (mg_tune_store_add(dir, &hd, e, 2, NULL, &d)) fail_msg("%s", mg_diag_msg(&d));
  double *in[TU_N_IN] = {0};
  assert_int_equal(tu_inputs(&c, g_seed, in), 0);
  round_inputs(&c, MG_BF16, in);
  check_form_tuned(&c, MG_FORM_LAGA, MG_BF16, in, h, g, dir, "bm64_bn64_st1");
  check_form_tuned(&c, MG_FORM_EXPLICIT, MG_BF16, in, h, g, dir, "no tuned kernel");
  check_form_tuned(&c, MG_FORM_ABSORBED, MG_BF16, in, h, g, dir, "bm32_bn32_ns2_st1");
  tu_free(in, TU_N_IN);
  char path[4200];
  assert_int_equal(mg_tune_store_path(dir, "sm_90a", h->base.device, path, sizeof path, &d), 0);
  unlink(path);
  char lock[4300];
  snprintf(lock, sizeof lock, "%s.lock", path);
  unlink(lock);
  *strrchr(path, '/') = 0;
  rmdir(path);
  rmdir(dir);
  mg_dev_ops_destroy(&h->base);
  mg_gen_close(g);
}

static void test_refusals(void **state) {
  (void)state;
  mg_diag d = MG_DIAG_INIT;
  mg_gen *g;
  assert_int_equal(mg_gen_open(&g, NULL, &d), 0);
  host_ops *h = host_ops_new(g);
  mg_shape sh = tu_shape(2, 64, 32, 64, 256);
  mg_plan *plan = calloc(1, sizeof *plan);
  mg_plan_args a = {.shape = &sh, .form = MG_FORM_EXPLICIT, .sp = 1, .batch = 1, .seq = 4,
                    .dtype = MG_F32};
  assert_int_equal(mg_plan_build(plan, &a, &d), 0);
  mg_cuda_exec *x = NULL;
  assert_int_equal(mg_cuda_exec_prepare(plan, &h->base, NULL, &x, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "bf16 or f16"));
  assert_null(x);
  a.dtype = MG_BF16;
  assert_int_equal(mg_plan_build(plan, &a, &d), 0);
  mg_cuda_exec_opts eo = {.gen = g};
  assert_int_equal(mg_cuda_exec_prepare(plan, &h->base, &eo, &x, &d), 0);
  assert_true(mg_cuda_exec_workspace_bytes(x) > 0 && mg_cuda_exec_saved_bytes(x) > 0);
  const size_t ws_b = (size_t)mg_cuda_exec_workspace_bytes(x), sv_b = (size_t)mg_cuda_exec_saved_bytes(x);
  void *ws = aligned(ws_b), *saved = aligned(sv_b);
  mg_cuda_tensors t = {0};
  assert_int_equal(mg_cuda_exec_run(x, MG_FWD, &t, ws, ws_b - 1, saved, sv_b, NULL, NULL, &d),
                   MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "workspace"));
  assert_int_equal(mg_cuda_exec_run(x, MG_FWD, &t, ws, ws_b, saved, sv_b, NULL, NULL, &d),
                   MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "is NULL")); /* the first caller tensor read */
  mg_cuda_exec_destroy(x);
  x = NULL;
  /* query positions (mg_step): only laga-cp's explicit attention has them, increasing
   * (mg_plan_check, run again by prepare) */
  int fwd = -1;
  for (int i = 0; i < plan->n_steps; i++)
    if (plan->steps[i].op == MG_OP_ATTN_FWD) fwd = i;
  assert_true(fwd >= 0);
  plan->steps[fwd].q_split = 2, plan->steps[fwd].q_pos1 = 3;
  assert_int_equal(mg_cuda_exec_prepare(plan, &h->base, &eo, &x, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "only laga-cp"));
  assert_null(x);
  a.form = MG_FORM_LAGA_CP;
  assert_int_equal(mg_plan_build(plan, &a, &d), 0);
  for (int i = 0; i < plan->n_steps; i++)
    if (plan->steps[i].op == MG_OP_ATTN_FWD) fwd = i;
  plan->steps[fwd].q_split = 2, plan->steps[fwd].q_pos1 = 1; /* rows 2, 3 before row 1 */
  assert_int_equal(mg_cuda_exec_prepare(plan, &h->base, &eo, &x, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "increasing positions"));
  assert_null(x);
  free(ws), free(saved), free(plan);
  mg_dev_ops_destroy(&h->base);
  mg_gen_close(g);
  mg_diag_clear(&d);
}

/* The host ops launch under the shared-memory limit of their arch, not the host executor's
 * default sm_90 one: a copy_cols launch (no rows: no work) asking for 164 KiB of dynamic
 * shared memory is refused by ops with no arch (sm_80's 163 KiB: the mma.sync families they
 * run) and by "sm_86" ops (99 KiB), and runs on "sm_90a" ops (227 KiB); 163 KiB runs on
 * arch-less ops, 100 KiB is refused on sm_86 ones. */
static void test_launch_arch_limit(void **state) {
  (void)state;
  mg_diag d = MG_DIAG_INIT;
  mg_gen *g;
  assert_int_equal(mg_gen_open(&g, NULL, &d), 0);
  host_ops *h = host_ops_new(g);
  mg_kernel_spec s;
  memset(&s, 0, sizeof s);
  snprintf(s.family, sizeof s.family, "copy_cols");
  snprintf(s.dtype, sizeof s.dtype, "bf16");
  s.heads = 2, s.d_n = 64, s.d_r = 32, s.d_v = 64, s.d_c = 256;
  mg_kernel k;
  assert_int_equal(mg_gen_kernel(g, &s, &k, &d), 0);
  void *handle = NULL;
  assert_int_equal(h->base.load(&h->base, &k, NULL, &handle, &d), 0);
  e16 src[8] = {0}, dst[8] = {0};
  void *srcp = src, *dstp = dst;
  int rows = 0, w = 8, col = 0, cols = 8;
  void *params[8] = {&srcp, &dstp, &rows, &w, &col, &w, &col, &cols};
  const unsigned grid[3] = {1, 1, 1}, block[3] = {128, 1, 1};
  const struct {
    const char *arch;
    size_t smem;
    int ok;
    const char *why; /* the refusal's message names the arch's limit */
  } cases[] = {{"", 164 * 1024, 0, "exceeds sm_80's limit of 166912 bytes"},
               {"", 163 * 1024, 1, NULL},
               {"sm_86", 164 * 1024, 0, "exceeds sm_86's limit of 101376 bytes"},
               {"sm_86", 100 * 1024, 0, "exceeds sm_86's limit"},
               {"sm_86", 99 * 1024, 1, NULL},
               {"sm_90a", 164 * 1024, 1, NULL},
               {"sm_90a", 228 * 1024, 0, "exceeds sm_90's limit of 232448 bytes"}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    snprintf(h->base.arch, sizeof h->base.arch, "%s", cases[i].arch);
    const int rc = h->base.launch(&h->base, handle, grid, block, cases[i].smem, params, NULL, &d);
    print_message("  arch '%s', %zu KiB: %s\n", cases[i].arch, cases[i].smem / 1024,
                  rc ? mg_diag_msg(&d) : "ran");
    if (cases[i].ok) {
      assert_int_equal(rc, 0);
    } else {
      assert_int_equal(rc, MLAGEN_EDRIVER);
      assert_non_null(strstr(mg_diag_msg(&d), cases[i].why));
    }
  }
  mg_kernel_free(&k);
  mg_dev_ops_destroy(&h->base);
  mg_gen_close(g);
  mg_diag_clear(&d);
}

static int report_worst(void **state) {
  (void)state;
  tu_print_worst("(rms units, rtol of tu_tol_bf16)", g_worst);
  return 0;
}

/* Host ops claiming an sm_90a device, with the fake driver's cuTensorMapEncodeTiled (the host
 * executor's map format, tests/host/mg_host_tmap.h) as their driver: the explicit, laga and
 * laga-cp plans run attn_fwd_sm90 and the sm_90a backward (attn_bwd_dkdv_sm90 and
 * attn_bwd_dq_sm90 after attn_bwd_pre; TMA/wgmma, on the host executor's sm_90a emulation)
 * with the tensor maps the executor encodes at each launch from the pass's addresses, and
 * match the CPU executor per element as the mma.sync runs do; MLAGEN_MMA_SYNC=1 (and the
 * mma_sync option) give the mma.sync attn_fwd / attn_bwd_dkdv / attn_bwd_dq back, ops
 * without a driver keep them, and so does a shape the sm_90a kernels refuse (d_v 48). */
static void test_sm90_family(void **state) {
  (void)state;
  mg_diag d = MG_DIAG_INIT;
  fake_driver_use(MLAGEN_FAKE_CUDA);
  const mg_driver *drv = NULL;
  if (mg_driver_get(&drv, &d)) fail_msg("fake driver: %s", mg_diag_msg(&d));
  mg_gen *g;
  assert_int_equal(mg_gen_open(&g, NULL, &d), 0);
  host_ops *h = host_ops_new(g);
  snprintf(h->base.arch, sizeof h->base.arch, "sm_90a");
  snprintf(h->base.device, sizeof h->base.device, "Host Test GPU");
  char dir[] = "/tmp/mlagen-tuned-XXXXXX"; /* an empty store: every kernel its default */
  assert_non_null(mkdtemp(dir));
  /* the family choice: sm90 with a driver; mma.sync when forced or without one */
  mg_shape sh = tu_shape(2, 64, 64, 64, 256); /* d_qk 128: an N of the backward's dK wgmma */
  mg_plan *plan = calloc(1, sizeof *plan);
  assert_non_null(plan);
  mg_plan_args a = {.shape = &sh, .form = MG_FORM_EXPLICIT, .sp = 1, .batch = 2, .seq = 33,
                    .causal = 1, .dtype = MG_BF16};
  assert_int_equal(mg_plan_build(plan, &a, &d), 0);
  /* MLAGEN_MMA_SYNC: any other value than on/off words is refused, naming the accepted */
  setenv("MLAGEN_MMA_SYNC", "sometimes", 1);
  {
    mg_cuda_exec_opts eo = {.gen = g, .tune_dir = dir};
    mg_cuda_exec *x = NULL;
    h->base.drv = drv;
    assert_int_equal(mg_cuda_exec_prepare(plan, &h->base, &eo, &x, &d), MLAGEN_EINVAL);
    assert_non_null(strstr(mg_diag_msg(&d), "MLAGEN_MMA_SYNC=sometimes: expected 1, true, yes or on"));
    assert_null(x);
    mg_diag_clear(&d);
  }
  setenv("MLAGEN_MMA_SYNC", "Off", 1); /* off: the device's family, as unset (v = 0) */
  for (int v = 0; v < 5; v++) { /* drv; none; MLAGEN_MMA_SYNC=1; the mma_sync option; =Yes */
    h->base.drv = v == 1 ? NULL : drv;
    if (v == 2) setenv("MLAGEN_MMA_SYNC", "1", 1);
    if (v == 4) setenv("MLAGEN_MMA_SYNC", "Yes", 1);
    mg_cuda_exec_opts eo = {.gen = g, .tune_dir = dir, .mma_sync = v == 3};
    mg_cuda_exec *x = NULL;
    if (mg_cuda_exec_prepare(plan, &h->base, &eo, &x, &d)) fail_msg("prepare: %s", mg_diag_msg(&d));
    unsetenv("MLAGEN_MMA_SYNC");
    /* the forward and the backward's two sm_90a kernels (attn_bwd_pre is portable) */
    static const char *const fam[3] = {"mla_attn_fwd_", "mla_attn_bwd_dkdv_", "mla_attn_bwd_dq_"};
    int sm90[3] = {0}, mma[3] = {0};
    for (int i = 0; i < mg_cuda_exec_kernel_info(x, 0, NULL, NULL); i++) {
      const char *name, *why;
      mg_cuda_exec_kernel_info(x, i, &name, &why);
      for (int k = 0; k < 3; k++) {
        const size_t len = strlen(fam[k]);
        if (strncmp(name, fam[k], len)) continue;
        sm90[k] += strncmp(name + len, "sm90_", 5) == 0;
        mma[k] += name[len] == 'h';
        if (v) print_message("  %s: %s\n", name, why);
        if (v && !strstr(why, "the mma.sync families")) fail_msg("%s: %s", name, why);
      }
    }
    for (int k = 0; k < 3; k++) {
      assert_int_equal(sm90[k], v == 0);
      assert_int_equal(mma[k], v != 0);
    }
    mg_cuda_exec_destroy(x);
  }
  /* a shape the sm_90a kernels refuse (d_v 48: not an N of the forward's O += P V wgmma;
   * d_qk 96: not one of the backward's dK): attn_fwd, attn_bwd_dkdv and attn_bwd_dq run,
   * and their whys say so */
  mg_shape odd = tu_shape(2, 64, 32, 48, 256);
  a.shape = &odd;
  assert_int_equal(mg_plan_build(plan, &a, &d), 0);
  {
    mg_cuda_exec_opts eo = {.gen = g, .tune_dir = dir};
    mg_cuda_exec *x = NULL;
    if (mg_cuda_exec_prepare(plan, &h->base, &eo, &x, &d)) fail_msg("prepare: %s", mg_diag_msg(&d));
    static const char *const fam[3] = {"attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq"};
    int seen[3] = {0};
    for (int i = 0; i < mg_cuda_exec_kernel_info(x, 0, NULL, NULL); i++) {
      const char *name, *why;
      mg_cuda_exec_kernel_info(x, i, &name, &why);
      for (int k = 0; k < 3; k++) {
        char pre[32], refused[64];
        snprintf(pre, sizeof pre, "mla_%s_", fam[k]);
        if (strncmp(name, pre, strlen(pre))) continue;
        print_message("  %s: %s\n", name, why);
        assert_int_equal(name[strlen(pre)], 'h'); /* the mma.sync kernel */
        snprintf(refused, sizeof refused, "%s_sm90 refused the shape", fam[k]);
        if (!strstr(why, refused) || !strstr(why, "wgmma))")) fail_msg("%s: %s", name, why); /* the reason whole */
        seen[k]++;
      }
    }
    for (int k = 0; k < 3; k++) assert_int_equal(seen[k], 1);
    mg_cuda_exec_destroy(x);
  }
  free(plan);
  /* the runs: attn_fwd_sm90 and the sm_90a backward in the explicit, laga and laga-cp
   * passes, against the CPU executor */
  h->base.drv = drv;
  static const char *const want[] = {"mla_attn_fwd_sm90_", "mla_attn_bwd_dkdv_sm90_", "mla_attn_bwd_dq_sm90_", NULL};
  g_want_kernel = want;
  for (int causal = 1; causal >= 0; causal--) {
    tu_case c = {.shape = sh, .B = 2, .S = 33, .causal = causal};
    double *in[TU_N_IN] = {0};
    assert_int_equal(tu_inputs(&c, g_seed + (uint64_t)causal, in), 0);
    round_inputs(&c, MG_BF16, in);
    check_form_tuned(&c, MG_FORM_EXPLICIT, MG_BF16, in, h, g, dir, NULL);
    if (causal) check_form_tuned(&c, MG_FORM_LAGA, MG_BF16, in, h, g, dir, NULL);
    /* laga-cp: its forward step carries two-chunk positions (q_split, q_pos1: at P 1 the
     * rank's two chunks, adjacent), passed to attn_fwd_sm90 as to attn_fwd */
    if (causal) check_form_tuned(&c, MG_FORM_LAGA_CP, MG_BF16, in, h, g, dir, NULL);
    tu_free(in, TU_N_IN);
  }
  g_want_kernel = NULL;
  rmdir(dir);
  mg_dev_ops_destroy(&h->base);
  mg_gen_close(g);
  mg_diag_clear(&d);
}

/* ---- the GPU ops without a driver, and with the fake one --------------------------------- */

static void test_nodriver(void **state) {
  (void)state;
  mg_diag d = MG_DIAG_INIT;
  mg_dev_ops *o = (mg_dev_ops *)1;
  assert_int_equal(mg_dev_ops_cuda(&o, &d), MLAGEN_ENODRIVER);
  assert_null(o);
  assert_non_null(strstr(mg_diag_msg(&d), "no CUDA driver"));
  mg_diag_clear(&d);
}

/* Through the API: a context, the model (H 2, d_c 256, d_r 32, d_n 64, d_v 64) and its
 * LAGA bf16 plan at B 1, S 8, causal, P 1, with its sizes. */
static void api_laga_plan_v(mlagen_context **ctx, mlagen_model **model, mlagen_plan **plan,
                            mlagen_sizes *z, int varlen) {
  assert_int_equal(mlagen_context_create(ctx), 0);
  mlagen_model_desc md = {.num_attention_heads = 2, .kv_lora_rank = 256, .qk_rope_head_dim = 32,
                          .qk_nope_head_dim = 64, .v_head_dim = 64};
  assert_int_equal(mlagen_model_from_desc(*ctx, &md, model), 0);
  mlagen_plan_desc pd = {.form = MLAGEN_FORM_LAGA, .batch = 1, .seq = 8, .sp_rank = 0,
                         .sp_size = 1, .causal = 1, .dtype = MLAGEN_DTYPE_BF16, .varlen = varlen};
  assert_int_equal(mlagen_plan_create(*ctx, *model, &pd, plan), 0);
  assert_int_equal(mlagen_plan_sizes(*plan, z), 0);
}

static void api_laga_plan(mlagen_context **ctx, mlagen_model **model, mlagen_plan **plan,
                          mlagen_sizes *z) {
  api_laga_plan_v(ctx, model, plan, z, 0);
}

/* All ten tensors of a plan in fresh host buffers (bufs[0..10), which the caller frees):
 * returns 10. */
static int api_tensors(const mlagen_sizes *z, mlagen_tensors *t, void **bufs) {
  memset(t, 0, sizeof *t);
  const mlagen_tensor_info *infos[] = {&z->q, &z->c_kv, &z->k_rope, &z->w_kv_b, &z->o,
                                       &z->d_o, &z->dq, &z->dc_kv, &z->dk_rope, &z->dw_kv_b};
  mlagen_tensor *ts[] = {&t->q, &t->c_kv, &t->k_rope, &t->w_kv_b, &t->o,
                         &t->d_o, &t->dq, &t->dc_kv, &t->dk_rope, &t->dw_kv_b};
  for (int k = 0; k < 10; k++) {
    ts[k]->data = bufs[k] = aligned(infos[k]->bytes);
    ts[k]->dtype = infos[k]->dtype;
    ts[k]->ndim = infos[k]->ndim;
    memcpy(ts[k]->dims, infos[k]->dims, sizeof ts[k]->dims);
  }
  return 10;
}

static void api_close(mlagen_context *ctx, mlagen_model *model, mlagen_plan *plan) {
  mlagen_plan_destroy(plan);
  mlagen_model_destroy(model);
  mlagen_context_destroy(ctx);
}

static void test_fake_driver(void **state) {
  (void)state;
  mg_diag d = MG_DIAG_INIT;
  mg_dev_ops *o = (mg_dev_ops *)1;
  assert_int_equal(mg_dev_ops_cuda(&o, &d), MLAGEN_EDRIVER);
  assert_null(o);
  print_message("  mg_dev_ops_cuda: %s\n", mg_diag_msg(&d));
  assert_non_null(strstr(mg_diag_msg(&d), "cuBLAS"));
  mg_diag_clear(&d);

  /* the API: valid arguments get through validation and the driver, then stop at cuBLAS */
  mlagen_context *ctx;
  mlagen_model *model;
  mlagen_plan *plan;
  mlagen_sizes z;
  api_laga_plan(&ctx, &model, &plan, &z);
  mlagen_tensors t;
  memset(&t, 0, sizeof t);
  void *bufs[16];
  int nb = 0;
  const mlagen_tensor_info *infos[] = {&z.q, &z.c_kv, &z.k_rope, &z.w_kv_b, &z.o};
  mlagen_tensor *ts[] = {&t.q, &t.c_kv, &t.k_rope, &t.w_kv_b, &t.o};
  for (int k = 0; k < 5; k++) {
    ts[k]->data = bufs[nb++] = aligned(infos[k]->bytes);
    ts[k]->dtype = infos[k]->dtype;
    ts[k]->ndim = infos[k]->ndim;
    memcpy(ts[k]->dims, infos[k]->dims, sizeof ts[k]->dims);
  }
  void *ws = bufs[nb++] = aligned(z.workspace_bytes), *saved = bufs[nb++] = aligned(z.saved_bytes);
  int rc = mlagen_forward(plan, &t, ws, z.workspace_bytes, saved, z.saved_bytes, NULL);
  print_message("  mlagen_forward: %s: %s\n", mlagen_status_name(rc), mlagen_last_message(ctx));
  assert_int_equal(rc, MLAGEN_EDRIVER);
  assert_non_null(strstr(mlagen_last_message(ctx), "cuBLAS"));
  for (int k = 0; k < nb; k++) free(bufs[k]);
  api_close(ctx, model, plan);
}

/* The fake driver is a fake cuBLAS too: mlagen_forward/backward of a LAGA plan run through,
 * every GEMM in the 32 MiB at the end of the caller's workspace, 256-byte aligned (the
 * aligned part of it when the workspace is only 16-byte aligned), never in cuBLAS's own. */
static void test_fake_cublas(void **state) {
  (void)state;
  setenv("MLAGEN_LIBCUBLAS", MLAGEN_FAKE_CUDA, 1);
  void (*stats)(int *, int *, void **, size_t *) = g_fake.cublas_stats;
  const size_t slice = (size_t)32 << 20;

  /* the GPU ops refuse a GEMM before they have a workspace, and a misaligned one */
  mg_diag d = MG_DIAG_INIT;
  mg_dev_ops *o;
  if (mg_dev_ops_cuda(&o, &d)) fail_msg("mg_dev_ops_cuda: %s", mg_diag_msg(&d));
  mg_gemm g = {.m = 1, .n = 1, .k = 1, .lda = 1, .ldb = 1, .ldc = 1, .batch = 1};
  e16 a = 0, b = 0, c = 0;
  assert_int_equal(o->gemm(o, &g, MG_BF16, &a, MG_BF16, &b, MG_BF16, &c, NULL, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "without a workspace"));
  char *blas = aligned(512);
  assert_int_equal(o->gemm_workspace(o, blas + 16, 256, &d), MLAGEN_EINVAL);
  mg_dev_ops_destroy(o);
  free(blas);

  mlagen_context *ctx;
  mlagen_model *model;
  mlagen_plan *plan;
  mlagen_sizes z;
  api_laga_plan(&ctx, &model, &plan, &z);
  /* the same plan built here: the workspace is its layout's plus exactly the slice */
  mg_shape sh = tu_shape(2, 64, 32, 64, 256);
  mg_plan ref;
  mg_plan_args pa = {.shape = &sh, .form = MG_FORM_LAGA, .sp = 1, .rank = 0, .batch = 1,
                     .seq = 8, .causal = 1, .dtype = MG_BF16};
  if (mg_plan_build(&ref, &pa, &d)) fail_msg("%s", mg_diag_msg(&d));
  static mg_plan_mem mem;
  if (mg_plan_mem_layout(&ref, 256, &mem, &d)) fail_msg("%s", mg_diag_msg(&d));
  assert_int_equal(z.workspace_bytes, (size_t)mem.workspace_bytes + slice);

  mlagen_tensors t;
  void *bufs[16];
  int nb = api_tensors(&z, &t, bufs);
  char *ws = bufs[nb++] = aligned(z.workspace_bytes + 256);
  void *saved = bufs[nb++] = aligned(z.saved_bytes);
  for (int shift = 0; shift <= 16; shift += 16) { /* 256-byte, then only 16-byte aligned */
    char *w = ws + shift;
    const size_t lead = shift ? 256 - shift : 0;
    for (int pass = 0; pass < 2; pass++) {
      int gemms0, own, gemms;
      void *used;
      size_t bytes;
      stats(&gemms0, &own, &used, &bytes);
      const int maps0 = g_fake.count("cuTensorMapEncodeTiled");
      int rc = pass ? mlagen_backward(plan, &t, w, z.workspace_bytes, saved, z.saved_bytes, NULL)
                    : mlagen_forward(plan, &t, w, z.workspace_bytes, saved, z.saved_bytes, NULL);
      if (rc) fail_msg("%s: %s: %s", pass ? "backward" : "forward", mlagen_status_name(rc),
                       mlagen_last_message(ctx));
      stats(&gemms, &own, &used, &bytes);
      print_message("  workspace %% 256 = %d, %s: %d GEMMs, cuBLAS workspace at +%td, %zu bytes\n",
                    shift, pass ? "backward" : "forward", gemms - gemms0, (char *)used - w, bytes);
      assert_true(gemms > gemms0);
      assert_int_equal(own, 0);
      assert_ptr_equal(used, w + mem.workspace_bytes + lead);
      assert_int_equal(bytes, slice - lead);
      assert_int_equal((uintptr_t)used % 256, 0);
      assert_ptr_equal((char *)used + bytes, w + z.workspace_bytes); /* the caller's end */
      /* the fake device is an sm_90a one: the forward ran attn_fwd_sm90, its 4 tensor maps
       * encoded (and accepted: the fake checks them as the driver does) for the launch */
      assert_int_equal(g_fake.count("cuTensorMapEncodeTiled") - maps0, pass ? 0 : 4);
    }
  }
  for (int k = 0; k < nb; k++) free(bufs[k]);
  api_close(ctx, model, plan);
  mg_diag_clear(&d);
}

/* The same LAGA plan packed (varlen: documents of 3 and 5 tokens): forward and backward run
 * through the fake driver and cuBLAS with the attention families' varlen variants (which
 * ctest cli_compile_warms_executor compiles beforehand with `mlagen compile --varlen`). */
static void test_fake_varlen(void **state) {
  (void)state;
  setenv("MLAGEN_LIBCUBLAS", MLAGEN_FAKE_CUDA, 1);
  mlagen_context *ctx;
  mlagen_model *model;
  mlagen_plan *plan;
  mlagen_sizes z;
  api_laga_plan_v(&ctx, &model, &plan, &z, 1);
  assert_int_equal(z.q.ndim, 3); /* THD */
  mlagen_tensors t;
  void *bufs[16];
  int nb = api_tensors(&z, &t, bufs);
  const int32_t cu[3] = {0, 3, 8};
  t.cu_seqlens = cu, t.n_cu_seqlens = 3;
  void *ws = bufs[nb++] = aligned(z.workspace_bytes), *saved = bufs[nb++] = aligned(z.saved_bytes);
  for (int pass = 0; pass < 2; pass++) {
    int rc = pass ? mlagen_backward(plan, &t, ws, z.workspace_bytes, saved, z.saved_bytes, NULL)
                  : mlagen_forward(plan, &t, ws, z.workspace_bytes, saved, z.saved_bytes, NULL);
    if (rc) fail_msg("%s: %s: %s", pass ? "backward" : "forward", mlagen_status_name(rc),
                     mlagen_last_message(ctx));
  }
  /* mlagen_plan_kernel: the kernels the passes prepared, each with its configuration's
   * reason (the fake device has no tuned store); the varlen variants among them */
  int n = -1, varlen = 0;
  assert_int_equal(mlagen_plan_kernel(plan, 0, &n, NULL, NULL), 0);
  assert_true(n > 0);
  for (int i = 0; i < n; i++) {
    const char *name = NULL, *why = NULL;
    assert_int_equal(mlagen_plan_kernel(plan, i, NULL, &name, &why), 0);
    assert_true(name && !strncmp(name, "mla_", 4) && why && *why);
    if (!strstr(why, "default: no tuned store for sm_90a/")) fail_msg("%s: %s", name, why);
    varlen += strstr(name, "_varlen") != NULL;
  }
  assert_true(varlen >= 4); /* attn_fwd(_sm90), attn_bwd_pre, attn_bwd_dkdv, attn_bwd_dq */
  const char *name;
  assert_int_equal(mlagen_plan_kernel(plan, n, NULL, &name, NULL), MLAGEN_EINVAL);
  if (!strstr(mlagen_last_message(ctx), "the plan runs")) fail_msg("%s", mlagen_last_message(ctx));
  for (int k = 0; k < nb; k++) free(bufs[k]);
  api_close(ctx, model, plan);
}

int main(int argc, char **argv) {
  const char *env = getenv("MLAGEN_TEST_SEED");
  if (env) g_seed = strtoull(env, NULL, 10);
  if (argc > 1 && !strcmp(argv[1], "nodriver")) {
    fake_driver_use(NULL);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_nodriver)};
    return cmocka_run_group_tests(tests, NULL, NULL);
  }
  if (argc > 1 && !strcmp(argv[1], "fake")) {
    if (fake_driver_open(&g_fake)) return 1;
    setenv("MLAGEN_LIBCUBLAS", "/nonexistent/libcublas.so", 1);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fake_driver),
                                       cmocka_unit_test(test_fake_cublas),
                                       cmocka_unit_test(test_fake_varlen)};
    return cmocka_run_group_tests(tests, NULL, NULL);
  }
  printf("MLAGEN_TEST_SEED=%llu\n", (unsigned long long)g_seed);
  const char *filter = getenv("MLAGEN_TEST_FILTER"); /* a cmocka pattern: one case */
  if (filter && *filter) cmocka_set_test_filter(filter);
  if (argc > 1 && !strcmp(argv[1], "f16")) { /* its own ctest: the suite's time per test */
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_f16)};
    return cmocka_run_group_tests(tests, NULL, report_worst);
  }
  if (argc > 1 && !strcmp(argv[1], "sm90")) { /* its own ctest: the sm_90a family */
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_sm90_family)};
    return cmocka_run_group_tests(tests, NULL, report_worst);
  }
  if (argc > 1 && !strcmp(argv[1], "deepseek")) { /* its own ctest too */
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_deepseek_heads)};
    return cmocka_run_group_tests(tests, NULL, report_worst);
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_launch_arch_limit),
      cmocka_unit_test(test_tuned_config),
      cmocka_unit_test(test_unusual_heads),
  };
  return cmocka_run_group_tests(tests, NULL, report_worst);
}
