/* test_cuda_exec_varlen.c: packed sequences (issue 16; generator/core/mg_varlen.h) in the
 * CUDA executor (runtime/exec/mg_cuda_exec.h) on CPU device ops (tests/cuda_exec_host_ops.h).
 *
 * A varlen plan (batch 1, seq = the token capacity 304) of every form, bf16, P = 1, forward
 * and backward, over documents of lengths 17, 1, 0 (empty), 2, 200, 3, 64 in that order
 * (T = 287; the 200 one crosses the rank boundaries of P = 2 and laga-cp's chunks), with NaN
 * in every slack row (t >= T) of q, c_kv, k_rope and do, against the float64 reference of
 * each document alone (tests/varlen_test_util.h: tv_reference, its rows put in place,
 * dw_kv_b summed over the documents); slack rows want o = dq = dc_kv = dk_rope = 0 exactly
 * and lse = -inf (tv_slack_wrong). Per element at tv_tol_bf16 (tests/varlen_test_util.h),
 * causal and not. Also
 * T = 0 (every row slack, every token-contracting GEMM at k = 0): all zero. Each pass
 * leaves the compacted cu_seqlens (mg_varlen_compact, padded with T to seq + 1) in the
 * workspace's last (seq + 1) int32 (rounded up to 256 bytes) after cuBLAS's 32 MiB, and the
 * attention kernels are the "_varlen" variants.
 *
 * test_refusals: a bad cu_seqlens (NULL for a varlen plan, given for an unpacked one, not
 * starting at 0, decreasing, past the capacity, no entry) is MLAGEN_EINVAL naming the index,
 * with nothing queued (no launch, GEMM, copy or upload; outputs untouched); ops without
 * upload cannot prepare a varlen plan. test_sm90: host ops claiming an sm_90a device (the
 * fake driver's tensor-map encoder) run attn_fwd_sm90's varlen variant in the explicit and
 * laga-cp plans, checked the same way, and a shape it refuses (d_v 48) the portable
 * attn_fwd's varlen variant. MLAGEN_TEST_SEED overrides the seed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_test_util.h"
#include "cuda_exec_host_ops.h"
#include "fake_driver.h"
#include "mg_driver.h"
#include "mg_cpu_exec.h"
#include "mg_varlen.h"
#include "varlen_test_util.h"

static uint64_t g_seed = 20261201;

#define CAP TV_RANK_DOCS_CAP /* the documents: tv_rank_docs (T = 287, 17 slack rows) */

static double g_worst[TU_N_OUT];
/* test_sm90: a fragment every plan's kernel list must have (the sm_90a varlen family) */
static const char *g_want_kernel;

/* The varlen plan of form f at (c: B 1, S CAP). */
static mg_plan *varlen_plan(const tu_case *c, mg_form f, mg_dtype dt) {
  mg_diag d = MG_DIAG_INIT;
  mg_plan *plan = calloc(1, sizeof *plan);
  assert_non_null(plan);
  mg_plan_args a = {.shape = &c->shape, .form = f, .sp = 1, .rank = 0, .batch = 1, .seq = c->S,
                    .causal = c->causal, .dtype = dt, .varlen = 1};
  if (mg_plan_build(plan, &a, &d)) fail_msg("%s: %s", mg_form_name(f), mg_diag_msg(&d));
  return plan;
}

/* Runs form f's varlen plan on in (slack rows NaN) with cu (n_cu entries) and checks it
 * against tv_reference (tests/varlen_test_util.h). */
static void check_varlen(const tu_case *c, mg_form f, double *const in[TU_N_IN],
                         const int32_t *cu, int64_t n_cu, host_ops *h, mg_gen *gen) {
  mg_diag d = MG_DIAG_INIT;
  const mg_dtype dt = MG_BF16;
  const int64_t T = cu[n_cu - 1];
  double *ref[TU_N_OUT] = {0};
  assert_int_equal(tv_reference(c, cu, n_cu, in, ref), 0);
  mg_plan *plan = varlen_plan(c, f, dt);
  mg_cuda_exec *x;
  mg_cuda_exec_opts eo = {.gen = gen};
  if (mg_cuda_exec_prepare(plan, &h->base, &eo, &x, &d)) fail_msg("prepare: %s", mg_diag_msg(&d));
  int n_varlen = 0;
  for (int i = 0; i < mg_cuda_exec_kernel_info(x, 0, NULL, NULL); i++) {
    const char *name, *why;
    mg_cuda_exec_kernel_info(x, i, &name, &why);
    const int attn = !strncmp(name, "mla_attn_", 9) || !strncmp(name, "mla_mqa_", 8);
    const size_t n = strlen(name);
    const int vl = n > 7 && !strcmp(name + n - 7, "_varlen");
    if (attn != vl) fail_msg("%s: kernel %s (%s)", mg_form_name(f), name, why);
    n_varlen += vl;
  }
  assert_true(n_varlen >= 1);
  if (g_want_kernel) {
    int found = 0;
    for (int i = 0; i < mg_cuda_exec_kernel_info(x, 0, NULL, NULL); i++) {
      const char *name, *why;
      mg_cuda_exec_kernel_info(x, i, &name, &why);
      if (strstr(name, g_want_kernel)) found = 1;
      if (strstr(name, "attn") || strstr(name, "mqa")) print_message("  %s: %s\n", name, why);
    }
    if (!found) fail_msg("%s: no kernel named *%s*", mg_form_name(f), g_want_kernel);
  }
  /* the workspace: the layout's, cuBLAS's 32 MiB, then cu_seqlens (seq + 1 int32, 256-aligned) */
  static mg_plan_mem mem;
  if (mg_plan_mem_layout(plan, 256, &mem, &d)) fail_msg("%s", mg_diag_msg(&d));
  const size_t cu_b = ((size_t)(CAP + 1) * 4 + 255) / 256 * 256;
  const size_t ws_b = (size_t)mg_cuda_exec_workspace_bytes(x), sv_b = (size_t)mg_cuda_exec_saved_bytes(x);
  assert_int_equal(ws_b, (size_t)mem.workspace_bytes + ((size_t)32 << 20) + cu_b);
  void *ws = aligned(ws_b), *saved = aligned(sv_b);
  e16 *inb[TU_N_IN];
  for (int k = 0; k < TU_N_IN; k++) inb[k] = to_e16(dt, in[k], tu_in_numel(c, k));
  void *outs[TU_N_OUT] = {0};
  for (int k = 0; k < TU_N_OUT; k++) {
    if (k == TU_LSE) continue;
    size_t bytes = (size_t)tu_out_numel(c, k) * (k == TU_DW ? 4 : 2);
    outs[k] = malloc(bytes);
    assert_non_null(outs[k]);
    memset(outs[k], 0xff, bytes); /* NaN: a row never written shows */
  }
  mg_cuda_tensors t = {.q = inb[TU_Q], .c_kv = inb[TU_CKV], .k_rope = inb[TU_KROPE],
                       .w_kv_b = inb[TU_W], .d_o = inb[TU_DO], .o = outs[TU_O], .dq = outs[TU_DQ],
                       .dc_kv = outs[TU_DCKV], .dk_rope = outs[TU_DKROPE], .dw_kv_b = outs[TU_DW],
                       .cu_seqlens = cu, .n_cu = n_cu};
  int32_t want_cu[CAP + 1];
  const int64_t used = mg_varlen_compact(cu, n_cu - 1, want_cu, CAP + 1);
  for (int pass = 0; pass < 2; pass++) {
    memset(ws, 0xff, ws_b);
    if (!pass) memset(saved, 0xff, sv_b);
    const long up = h->uploads;
    if (mg_cuda_exec_run(x, pass ? MG_BWD : MG_FWD, &t, ws, ws_b, saved, sv_b, NULL, NULL, &d))
      fail_msg("%s %s: %s", mg_form_name(f), pass ? "backward" : "forward", mg_diag_msg(&d));
    assert_int_equal(h->uploads, up + 1);
    const int32_t *dev_cu = (const int32_t *)((const char *)ws + ws_b - cu_b);
    assert_memory_equal(dev_cu, want_cu, sizeof want_cu);
  }
  assert_int_equal(want_cu[used - 1], T);
  const float *lse = mg_cuda_exec_buffer(x, "lse", ws, saved);
  assert_non_null(lse);

  double e[TU_N_OUT] = {0};
  int bad = 0;
  for (int k = 0; k < TU_N_OUT; k++) {
    const int64_t n = tu_out_numel(c, k);
    const void *got = k == TU_LSE ? lse : outs[k];
    double *g = malloc((size_t)n * sizeof(double));
    assert_non_null(g);
    for (int64_t i = 0; i < n; i++)
      g[i] = k == TU_LSE || k == TU_DW ? ((const float *)got)[i] : e16_to_f32(dt, ((const e16 *)got)[i]);
    char what[256];
    snprintf(what, sizeof what, "varlen %s T %lld %s: %s", mg_form_name(f), (long long)T,
             c->causal ? "causal" : "non-causal", tu_out_names[k]);
    /* slack rows exactly 0 (lse -inf), then every element against the reference */
    const int64_t slack = tv_slack_wrong(c, T, k, g);
    if (slack) fprintf(stderr, "%s: %lld slack element(s) not %s\n", what, (long long)slack,
                       k == TU_LSE ? "-inf" : "0");
    cc_result r = tu_check(what, g, ref[k], n, tu_rms(ref[k], n), tv_tol_bf16[k], tu_out_cols(c, k));
    e[k] = r.min_atol;
    if (e[k] > g_worst[k]) g_worst[k] = e[k];
    bad += !cc_ok(&r) + (slack != 0);
    free(g);
  }
  print_message("  %-8s T %3lld %-10s needed atol o %.1e lse %.1e dq %.1e dc_kv %.1e dk_rope %.1e "
                "dw_kv_b %.1e  (%d kernels, %d varlen)\n",
                mg_form_name(f), (long long)T, c->causal ? "causal" : "non-causal", e[TU_O],
                e[TU_LSE], e[TU_DQ], e[TU_DCKV], e[TU_DKROPE], e[TU_DW],
                mg_cuda_exec_kernel_count(x), n_varlen);
  if (bad) fail_msg("varlen %s: %d output(s) wrong", mg_form_name(f), bad);
  mg_cuda_exec_destroy(x);
  for (int k = 0; k < TU_N_IN; k++) free(inb[k]);
  for (int k = 0; k < TU_N_OUT; k++) free(outs[k]);
  tu_free(ref, TU_N_OUT);
  free(ws), free(saved), free(plan);
}

/* tv_inputs (NaN in the slack rows t >= T of q, c_kv, k_rope and do), bf16 values. */
static void packed_inputs(const tu_case *c, int64_t T, uint64_t seed, double *in[TU_N_IN]) {
  assert_int_equal(tv_inputs(c, T, seed, in), 0);
  round_inputs(c, MG_BF16, in); /* NaN stays NaN */
}

static void check_forms(int causal) {
  mg_diag d = MG_DIAG_INIT;
  mg_gen *g;
  assert_int_equal(mg_gen_open(&g, NULL, &d), 0);
  host_ops *h = host_ops_new(g);
  tu_case c = {.shape = tu_shape(2, 64, 32, 64, 256), .B = 1, .S = CAP, .causal = causal};
  double *in[TU_N_IN] = {0};
  const tv_stream st = tv_rank_docs();
  packed_inputs(&c, st.T, g_seed + (uint64_t)causal, in);
  for (int f = 0; f < MG_FORM_COUNT; f++) check_varlen(&c, (mg_form)f, in, st.cu, st.n_cu, h, g);
  tu_free(in, TU_N_IN);
  if (causal) { /* T = 0: one empty document, every row slack */
    const int32_t empty[] = {0, 0};
    packed_inputs(&c, 0, g_seed + 7, in);
    for (int f = 0; f < MG_FORM_COUNT; f++) check_varlen(&c, (mg_form)f, in, empty, 2, h, g);
    tu_free(in, TU_N_IN);
  }
  print_message("  %d kernels built, %ld launches, %ld GEMMs, %ld uploads\n", h->builds,
                h->launches, h->gemms, h->uploads);
  mg_dev_ops_destroy(&h->base);
  mg_gen_close(g);
}

static void test_forms_causal(void **state) {
  (void)state;
  check_forms(1);
}

static void test_forms_noncausal(void **state) {
  (void)state;
  check_forms(0);
}

/* Host ops claiming an sm_90a device with the fake driver's tensor-map encoder: the
 * explicit and laga-cp varlen plans run attn_fwd_sm90's varlen variant (its tensor maps
 * encoded at each launch; the host executor's sm_90a emulation), the absorbed one its
 * default families' (mqa_fwd_sm90 is on request), all against the same reference. */
static void test_sm90(void **state) {
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
  h->base.drv = drv;
  char dir[] = "/tmp/mlagen-tuned-XXXXXX"; /* an empty store: every kernel its default */
  assert_non_null(mkdtemp(dir));
  setenv("MLAGEN_TUNED_DIR", dir, 1);
  tu_case c = {.shape = tu_shape(2, 64, 32, 64, 256), .B = 1, .S = CAP, .causal = 1};
  double *in[TU_N_IN] = {0};
  const tv_stream st = tv_rank_docs();
  packed_inputs(&c, st.T, g_seed + 3, in);
  g_want_kernel = "mla_attn_fwd_sm90_";
  check_varlen(&c, MG_FORM_EXPLICIT, in, st.cu, st.n_cu, h, g);
  check_varlen(&c, MG_FORM_LAGA_CP, in, st.cu, st.n_cu, h, g);
  g_want_kernel = NULL;
  check_varlen(&c, MG_FORM_ABSORBED, in, st.cu, st.n_cu, h, g);
  tu_free(in, TU_N_IN);
  /* a shape attn_fwd_sm90 refuses (d_v 48): the portable attn_fwd's varlen variant, and
   * its why says so */
  tu_case odd = {.shape = tu_shape(2, 64, 32, 48, 256), .B = 1, .S = CAP, .causal = 1};
  mg_plan *plan = varlen_plan(&odd, MG_FORM_EXPLICIT, MG_BF16);
  mg_cuda_exec_opts eo = {.gen = g};
  mg_cuda_exec *x = NULL;
  if (mg_cuda_exec_prepare(plan, &h->base, &eo, &x, &d)) fail_msg("prepare: %s", mg_diag_msg(&d));
  int fwd = 0;
  for (int i = 0; i < mg_cuda_exec_kernel_info(x, 0, NULL, NULL); i++) {
    const char *name, *why;
    mg_cuda_exec_kernel_info(x, i, &name, &why);
    if (strncmp(name, "mla_attn_fwd_", 13)) continue;
    print_message("  %s: %s\n", name, why);
    assert_int_equal(strncmp(name, "mla_attn_fwd_h", 14), 0);
    assert_non_null(strstr(name, "_varlen"));
    assert_non_null(strstr(why, "attn_fwd_sm90 refused the spec"));
    fwd++;
  }
  assert_int_equal(fwd, 1);
  mg_cuda_exec_destroy(x);
  free(plan);
  unsetenv("MLAGEN_TUNED_DIR");
  rmdir(dir);
  mg_dev_ops_destroy(&h->base);
  mg_gen_close(g);
  mg_diag_clear(&d);
}

/* One run that must fail with MLAGEN_EINVAL and msg in the message, queueing nothing. */
static void expect_refused(mg_cuda_exec *x, host_ops *h, const mg_cuda_tensors *t, void *ws,
                           size_t ws_b, void *saved, size_t sv_b, const char *msg) {
  mg_diag d = MG_DIAG_INIT;
  const long l0 = h->launches, g0 = h->gemms, c0 = h->copies, u0 = h->uploads;
  assert_int_equal(mg_cuda_exec_run(x, MG_FWD, t, ws, ws_b, saved, sv_b, NULL, NULL, &d), MLAGEN_EINVAL);
  print_message("  %s\n", mg_diag_msg(&d));
  if (!strstr(mg_diag_msg(&d), msg)) fail_msg("wanted \"%s\" in \"%s\"", msg, mg_diag_msg(&d));
  assert_true(h->launches == l0 && h->gemms == g0 && h->copies == c0 && h->uploads == u0);
  mg_diag_clear(&d);
}

static void test_refusals(void **state) {
  (void)state;
  mg_diag d = MG_DIAG_INIT;
  mg_gen *g;
  assert_int_equal(mg_gen_open(&g, NULL, &d), 0);
  host_ops *h = host_ops_new(g);
  tu_case c = {.shape = tu_shape(2, 64, 32, 64, 256), .B = 1, .S = 8, .causal = 1};
  mg_plan *plan = varlen_plan(&c, MG_FORM_EXPLICIT, MG_BF16);
  mg_cuda_exec_opts eo = {.gen = g};
  mg_cuda_exec *x = NULL;
  /* ops that cannot upload cannot run a varlen plan */
  h->base.upload = NULL;
  assert_int_equal(mg_cuda_exec_prepare(plan, &h->base, &eo, &x, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "upload"));
  assert_null(x);
  h->base.upload = h_upload;
  if (mg_cuda_exec_prepare(plan, &h->base, &eo, &x, &d)) fail_msg("prepare: %s", mg_diag_msg(&d));
  const size_t ws_b = (size_t)mg_cuda_exec_workspace_bytes(x), sv_b = (size_t)mg_cuda_exec_saved_bytes(x);
  void *ws = aligned(ws_b), *saved = aligned(sv_b);
  double *in[TU_N_IN] = {0};
  assert_int_equal(tu_inputs(&c, g_seed, in), 0);
  e16 *inb[TU_N_IN];
  for (int k = 0; k < TU_N_IN; k++) inb[k] = to_e16(MG_BF16, in[k], tu_in_numel(&c, k));
  const size_t o_b = (size_t)tu_out_numel(&c, TU_O) * 2;
  e16 *o = malloc(o_b);
  assert_non_null(o);
  memset(o, 0xff, o_b);
  mg_cuda_tensors t = {.q = inb[TU_Q], .c_kv = inb[TU_CKV], .k_rope = inb[TU_KROPE],
                       .w_kv_b = inb[TU_W], .o = o};
  expect_refused(x, h, &t, ws, ws_b, saved, sv_b, "a varlen plan needs tensors->cu_seqlens");
  const int32_t not0[] = {1, 4}, down[] = {0, 5, 3, 8}, past[] = {0, 4, 9};
  t.cu_seqlens = not0, t.n_cu = 2;
  expect_refused(x, h, &t, ws, ws_b, saved, sv_b, "tensors->cu_seqlens[0] = 1");
  t.cu_seqlens = down, t.n_cu = 4;
  expect_refused(x, h, &t, ws, ws_b, saved, sv_b, "tensors->cu_seqlens[2] = 3 is below");
  t.cu_seqlens = past, t.n_cu = 3;
  expect_refused(x, h, &t, ws, ws_b, saved, sv_b, "tensors->cu_seqlens[2] = 9 is past the plan's token capacity 8");
  t.n_cu = 0;
  expect_refused(x, h, &t, ws, ws_b, saved, sv_b, "at least one entry");
  for (size_t i = 0; i < o_b / 2; i++) assert_int_equal(o[i], 0xffff); /* untouched */
  /* a good one runs (and uploads once) */
  const int32_t good[] = {0, 3, 3, 7};
  t.cu_seqlens = good, t.n_cu = 4;
  const long u0 = h->uploads;
  if (mg_cuda_exec_run(x, MG_FWD, &t, ws, ws_b, saved, sv_b, NULL, NULL, &d))
    fail_msg("forward: %s", mg_diag_msg(&d));
  assert_int_equal(h->uploads, u0 + 1);
  mg_cuda_exec_destroy(x);
  free(ws), free(saved);
  /* cu_seqlens for an unpacked plan */
  mg_plan_args a = {.shape = &c.shape, .form = MG_FORM_EXPLICIT, .sp = 1, .batch = 1, .seq = 8,
                    .causal = 1, .dtype = MG_BF16};
  assert_int_equal(mg_plan_build(plan, &a, &d), 0);
  if (mg_cuda_exec_prepare(plan, &h->base, &eo, &x, &d)) fail_msg("prepare: %s", mg_diag_msg(&d));
  const size_t ws2 = (size_t)mg_cuda_exec_workspace_bytes(x), sv2 = (size_t)mg_cuda_exec_saved_bytes(x);
  ws = aligned(ws2), saved = aligned(sv2);
  expect_refused(x, h, &t, ws, ws2, saved, sv2, "for a plan that is not varlen");
  mg_cuda_exec_destroy(x);
  free(ws), free(saved), free(o), free(plan);
  for (int k = 0; k < TU_N_IN; k++) free(inb[k]);
  tu_free(in, TU_N_IN);
  mg_dev_ops_destroy(&h->base);
  mg_gen_close(g);
  mg_diag_clear(&d);
}

static int report_worst(void **state) {
  (void)state;
  tu_print_worst("(rms units, rtol of tv_tol_bf16)", g_worst);
  return 0;
}

int main(void) {
  const char *env = getenv("MLAGEN_TEST_SEED");
  if (env) g_seed = strtoull(env, NULL, 10);
  printf("MLAGEN_TEST_SEED=%llu\n", (unsigned long long)g_seed);
  const char *filter = getenv("MLAGEN_TEST_FILTER");
  if (filter && *filter) cmocka_set_test_filter(filter);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_forms_causal),
      cmocka_unit_test(test_forms_noncausal),
      cmocka_unit_test(test_sm90),
  };
  return cmocka_run_group_tests(tests, NULL, report_worst);
}
