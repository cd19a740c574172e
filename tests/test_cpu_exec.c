/* test_cpu_exec.c: the CPU executor in one process (P = 1, the local communicator).
 *
 *   memory     measured saved / peak_fwd / peak_bwd / sent == mg_plan_cost_of, every form,
 *              two shapes, causal and not
 *   forms      every form equals explicit per element (f32, tu_tol_f32) on o, lse and the
 *              gradients; the inputs' scores have std about 2 (tu_score_std)
 *   reference  an independent float64 reference written from MLA.md (K_n, V materialized
 *              per head, naive softmax attention, gradients by the chain rule) equals the
 *              explicit form in f64 per element (tol_f64)
 *   scale      the checks fail a 5% error in the softmax scale (f32 and bf16 tolerances)
 *   gradients  central finite differences (f64, eps 1e-6) of loss = sum(o * do) against
 *              every form's dq, dc_kv, dk_rope, dw_kv_b on a tiny shape
 *   refusals   bf16 plans, NULL inputs, bad captures, a communicator of the wrong size, a
 *              malformed plan, rows beyond the kernels' stack rows
 *   varlen     packed sequences: every form in f64 on a stream of documents (lengths 0, 1,
 *              2, 3, 17, 64, 0, 200 in 312 rows; one document of 90 in 96; one empty
 *              document in 8 rows, every row slack) with NaN in
 *              every slack row of every input, against the float64 reference run on each
 *              document alone (tests/varlen_test_util.h), per element; slack rows give
 *              exactly o = 0, lse = -inf, zero gradients; a boundary moved by one token
 *              fails the check; mg_cpu_run_pass equals mg_cpu_run; the executor's
 *              refusals of missing, unexpected and malformed cu_seqlens
 * Shapes carry DeepSeek-V3's YaRN softmax scale (tu_shape). Inputs are fresh random
 * numbers each run: the seed is printed; MLAGEN_TEST_SEED overrides it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <time.h>
#include <unistd.h>

#include "cpu_test_util.h"
#include "mg_comm.h"
#include "varlen_test_util.h"

static uint64_t g_seed;

/* The two shapes of the brief: V2-Lite-like and an unusual one. */
static mg_shape shape_v2lite(void) { return tu_shape(16, 128, 64, 128, 512); }
static mg_shape shape_small(void) { return tu_shape(8, 64, 32, 64, 256); }

static void fail_diag(int rc, mg_diag *d, const char *what) {
  if (rc) print_error("%s: %s (%d)\n", what, mg_diag_msg(d), rc);
  mg_diag_clear(d);
  assert_int_equal(rc, 0);
}

/* Tolerances, |err| <= atol rms(ref) + rtol |ref| per element (tu_check): the forms
 * against explicit in f32 at tu_tol_f32; f64 explicit against the float64 reference at
 * about twice the noise measured over 30 seeds (the largest atol, in rms units, at rtol
 * 1e-14; printed at the end as "needed"): o 1.0e-14, lse 4.0e-16 (an lse near 0 keeps
 * the rounding of its terms, about 4 in size), dq 1.4e-14, dc_kv 9.1e-15,
 * dk_rope 5.8e-15, dw_kv_b 8.8e-15. */
static const tu_tol tol_f64[TU_N_OUT] = {{2e-14, 1e-14}, {1e-15, 1e-14}, {3e-14, 1e-14},
                                         {2e-14, 1e-14}, {1.2e-14, 1e-14}, {2e-14, 1e-14}};
static double g_need_f32[TU_N_OUT], g_need_f64[TU_N_OUT];

/* Every output of a P = 1 run against ref, per element; need[k] keeps the largest atol
 * (rms units) output k needed. Returns the number of outputs that failed. */
static int compare_all(const tu_case *c, double *const out[TU_N_OUT], double *const ref[TU_N_OUT],
                       const tu_tol tol[TU_N_OUT], const char *what, double need[TU_N_OUT]) {
  int bad = 0;
  for (int k = 0; k < TU_N_OUT; k++) {
    const int64_t n = tu_out_numel(c, k);
    char name[512];
    snprintf(name, sizeof name, "%s: %s", what, tu_out_names[k]);
    cc_result r = tu_check(name, out[k], ref[k], n, tu_rms(ref[k], n), tol[k], tu_out_cols(c, k));
    if (need && r.min_atol > need[k]) need[k] = r.min_atol;
    bad += !cc_ok(&r);
  }
  return bad;
}

/* ---- (a) memory: measured == planned ------------------------------------------------ */

static void test_memory_matches_plan(void **state) {
  (void)state;
  mg_comm *comm = NULL;
  mg_diag d = MG_DIAG_INIT;
  fail_diag(mg_comm_local_new(&comm, &d), &d, "local comm");
  const mg_shape shapes[2] = {shape_v2lite(), shape_small()};
  for (int si = 0; si < 2; si++)
    for (int causal = 0; causal < 2; causal++) {
      tu_case c = {shapes[si], 2, 24, causal};
      double *in[TU_N_IN] = {0};
      assert_int_equal(tu_inputs(&c, g_seed, in), 0);
      int64_t explicit_saved = 0;
      for (int f = 0; f < MG_FORM_COUNT; f++) {
        tu_run r;
        fail_diag(tu_run_form(&c, (mg_form)f, 1, 0, comm, MG_F32, in, &r, &d), &d, "run");
        /* split keys: every LAGA form keeps less than explicit, whose K carries the RoPE
         * copy per head; the measured bytes are the plan's (below) */
        if (f == MG_FORM_EXPLICIT) explicit_saved = r.st.saved;
        else if (f != MG_FORM_ABSORBED) assert_true(r.st.saved < explicit_saved);
        int64_t allocs = 0;
        for (int b = 0; b < r.plan.n_bufs; b++) allocs += r.plan.bufs[b].role != MG_BUF_INPUT;
        for (int i = 0; i < r.plan.n_steps; i++) allocs += r.plan.steps[i].workspace > 0;
        if (si == 0 && causal && f == 0)
          print_message("explicit, V2-Lite-like, B 2 S 24 causal f32: saved %lld (plan %lld), "
                        "peak fwd %lld (%lld), peak bwd %lld (%lld)\n",
                        (long long)r.st.saved, (long long)r.cost.saved, (long long)r.st.peak_fwd,
                        (long long)r.cost.peak_fwd, (long long)r.st.peak_bwd,
                        (long long)r.cost.peak_bwd);
        assert_true(r.cost.saved > 0 && r.cost.peak_fwd > 0 && r.cost.peak_bwd > 0);
        assert_int_equal(r.st.saved, r.cost.saved);
        assert_int_equal(r.st.peak_fwd, r.cost.peak_fwd);
        assert_int_equal(r.st.peak_bwd, r.cost.peak_bwd);
        assert_int_equal(r.st.sent_fwd, r.cost.sent_fwd);
        assert_int_equal(r.st.sent_bwd, r.cost.sent_bwd);
        assert_int_equal(r.st.n_allocs, allocs);
        assert_non_null(r.t.o);
        assert_non_null(r.t.dw_kv_b);
        tu_run_free(&r);
      }
      tu_free(in, TU_N_IN);
    }
  mg_comm_destroy(comm);
}

/* ---- (b) every form equals explicit ------------------------------------------------- */

static void test_forms_agree(void **state) {
  (void)state;
  mg_diag d = MG_DIAG_INIT;
  const mg_shape shapes[2] = {shape_v2lite(), shape_small()};
  for (int si = 0; si < 2; si++)
    for (int causal = 0; causal < 2; causal++) {
      tu_case c = {shapes[si], 2, 24, causal};
      double *in[TU_N_IN] = {0}, *ref[TU_N_OUT] = {0};
      assert_int_equal(tu_inputs(&c, g_seed + 1, in), 0);
      const double spread = tu_score_std(&c, in);
      if (si == 0 && causal) print_message("score std %.2f (%s)\n", spread, c.shape.source);
      assert_true(spread > 1.6 && spread < 2.4); /* a trained model's spread, not a flat softmax */
      for (int f = 0; f < MG_FORM_COUNT; f++) {
        tu_run r;
        double *out[TU_N_OUT] = {0};
        fail_diag(tu_run_form(&c, (mg_form)f, 1, 0, NULL, MG_F32, in, &r, &d), &d, "run");
        assert_int_equal(tu_outputs(&c, &r, f == 0 ? ref : out), 0);
        if (f > 0) {
          char what[400];
          snprintf(what, sizeof what, "%s %s causal %d vs explicit", mg_form_name((mg_form)f),
                   c.shape.source, causal);
          assert_int_equal(compare_all(&c, out, ref, tu_tol_f32, what, g_need_f32), 0);
        }
        tu_free(out, TU_N_OUT);
        tu_run_free(&r);
      }
      tu_free(ref, TU_N_OUT);
      tu_free(in, TU_N_IN);
    }
}

/* ---- (c) an independent float64 reference ------------------------------------------- */

static void test_reference_f64(void **state) {
  (void)state;
  mg_diag d = MG_DIAG_INIT;
  const mg_shape shapes[2] = {shape_small(), tu_shape(4, 32, 16, 48, 64)};
  for (int si = 0; si < 2; si++)
    for (int causal = 0; causal < 2; causal++) {
      tu_case c = {shapes[si], 2, 24, causal};
      double *in[TU_N_IN] = {0}, *ref[TU_N_OUT] = {0}, *out[TU_N_OUT] = {0};
      assert_int_equal(tu_inputs(&c, g_seed + 2, in), 0);
      for (int k = 0; k < TU_N_OUT; k++)
        assert_non_null(ref[k] = calloc((size_t)tu_out_numel(&c, k), sizeof(double)));
      assert_int_equal(tu_reference(&c, in, ref), 0);
      tu_run r;
      fail_diag(tu_run_form(&c, MG_FORM_EXPLICIT, 1, 0, NULL, MG_F64, in, &r, &d), &d, "run");
      assert_int_equal(tu_outputs(&c, &r, out), 0);
      char what[400];
      snprintf(what, sizeof what, "explicit f64 %s causal %d vs the reference", c.shape.source, causal);
      assert_int_equal(compare_all(&c, out, ref, tol_f64, what, g_need_f64), 0);
      tu_run_free(&r);
      tu_free(out, TU_N_OUT);
      tu_free(ref, TU_N_OUT);
      tu_free(in, TU_N_IN);
    }
}

/* ---- (d) finite differences -------------------------------------------------------- */

/* sum(o * do) of form f on inputs in (f64, P = 1). */
static double loss(const tu_case *c, mg_form f, double *const in[TU_N_IN]) {
  mg_diag d = MG_DIAG_INIT;
  tu_run r;
  fail_diag(tu_run_form(c, f, 1, 0, NULL, MG_F64, in, &r, &d), &d, "run");
  double s = 0;
  const double *o = r.t.o;
  for (int64_t i = 0; i < tu_out_numel(c, TU_O); i++) s += o[i] * in[TU_DO][i];
  tu_run_free(&r);
  return s;
}

static void test_finite_differences(void **state) {
  (void)state;
  tu_case c = {tu_shape(2, 16, 16, 16, 32), 1, 5, 1};
  const int grads[4] = {TU_DQ, TU_DCKV, TU_DKROPE, TU_DW};
  const int inputs[4] = {TU_Q, TU_CKV, TU_KROPE, TU_W};
  const double eps = 1e-6;
  double worst = 0;
  mg_diag d = MG_DIAG_INIT;
  for (int f = 0; f < MG_FORM_COUNT; f++) {
    double *in[TU_N_IN] = {0}, *g[TU_N_OUT] = {0};
    assert_int_equal(tu_inputs(&c, g_seed + 3 + (uint64_t)f, in), 0);
    tu_run r;
    fail_diag(tu_run_form(&c, (mg_form)f, 1, 0, NULL, MG_F64, in, &r, &d), &d, "run");
    assert_int_equal(tu_outputs(&c, &r, g), 0);
    tu_run_free(&r);
    for (int t = 0; t < 4; t++) {
      const int64_t n = tu_in_numel(&c, inputs[t]);
      double gmax = 0;
      for (int64_t i = 0; i < n; i++) gmax = fmax(gmax, fabs(g[grads[t]][i]));
      assert_true(gmax > 0);
      /* a handful of entries whose gradient is not tiny next to the tensor's largest */
      uint64_t pick = tu_mix(g_seed ^ (uint64_t)(f * 16 + t));
      for (int checked = 0, tries = 0; checked < 5 && tries < 1000; tries++) {
        pick = tu_mix(pick);
        const int64_t i = (int64_t)(pick % (uint64_t)n);
        const double an = g[grads[t]][i];
        if (fabs(an) < 0.05 * gmax) continue;
        const double x0 = in[inputs[t]][i];
        in[inputs[t]][i] = x0 + eps;
        const double lp = loss(&c, (mg_form)f, in);
        in[inputs[t]][i] = x0 - eps;
        const double lm = loss(&c, (mg_form)f, in);
        in[inputs[t]][i] = x0;
        const double fd = (lp - lm) / (2 * eps), err = fabs(fd - an) / fabs(an);
        worst = fmax(worst, err);
        if (!(err < 1e-6))
          print_error("%s: d loss / d %s[%lld]: analytic %.12g, central difference %.12g "
                      "(rel err %.3g)\n", mg_form_name((mg_form)f), tu_out_names[grads[t]],
                      (long long)i, an, fd, err);
        assert_true(err < 1e-6);
        checked++;
      }
    }
    tu_free(g, TU_N_OUT);
    tu_free(in, TU_N_IN);
  }
  print_message("finite differences: worst relative error %.3g\n", worst);
}

/* ---- (e) the checks see a 5% error in the softmax scale -------------------------------- */

/* The explicit f32 form against the float64 reference: with the model's scale it passes
 * the f32 tolerances and the bf16 executors' (tu_tol_bf16); with the scale given to it 5%
 * too large it fails both, on o and lse (and the gradients). */
static void test_scale_sensitivity(void **state) {
  (void)state;
  mg_diag d = MG_DIAG_INIT;
  tu_case c = {shape_small(), 2, 24, 1};
  double *in[TU_N_IN] = {0}, *ref[TU_N_OUT] = {0};
  assert_int_equal(tu_inputs(&c, g_seed + 9, in), 0);
  for (int k = 0; k < TU_N_OUT; k++)
    assert_non_null(ref[k] = calloc((size_t)tu_out_numel(&c, k), sizeof(double)));
  assert_int_equal(tu_reference(&c, in, ref), 0);
  for (int wrong = 0; wrong < 2; wrong++) {
    tu_case run_case = c;
    if (wrong) run_case.shape.softmax_scale *= 1.05;
    tu_run r;
    double *out[TU_N_OUT] = {0};
    fail_diag(tu_run_form(&run_case, MG_FORM_EXPLICIT, 1, 0, NULL, MG_F32, in, &r, &d), &d, "run");
    assert_int_equal(tu_outputs(&c, &r, out), 0);
    for (int t = 0; t < 2; t++) {
      const tu_tol *tol = t ? tu_tol_bf16 : tu_tol_f32;
      int failed[TU_N_OUT], n_failed = 0;
      for (int k = 0; k < TU_N_OUT; k++) {
        const int64_t n = tu_out_numel(&c, k);
        cc_result cr = cc_compare_d(out[k], ref[k], n, tol[k].atol * tu_rms(ref[k], n), tol[k].rtol);
        failed[k] = !cc_ok(&cr);
        n_failed += failed[k];
        if (wrong && t)
          print_message("scale x1.05 against the bf16 tolerances: %s %s (worst %.1fx its bound)\n",
                        tu_out_names[k], failed[k] ? "fails" : "passes", cr.worst_ratio);
      }
      if (!wrong && n_failed) fail_msg("the right scale fails %d output(s) (%s tolerances)",
                                       n_failed, t ? "bf16" : "f32");
      if (wrong && !(failed[TU_O] && failed[TU_LSE]))
        fail_msg("a 5%% scale error passes o or lse (%s tolerances)", t ? "bf16" : "f32");
    }
    tu_run_free(&r);
    tu_free(out, TU_N_OUT);
  }
  tu_free(ref, TU_N_OUT);
  tu_free(in, TU_N_IN);
}

/* ---- refusals ----------------------------------------------------------------------- */

static void expect_refusal(const mg_plan *p, mg_comm *comm, mg_cpu_tensors *t, int status,
                           const char *text) {
  mg_diag d = MG_DIAG_INIT;
  mg_cpu_stats st;
  int rc = mg_cpu_run(p, comm, t, &st, &d);
  if (rc != status || !strstr(mg_diag_msg(&d), text))
    print_error("expected %d '%s', got %d '%s'\n", status, text, rc, mg_diag_msg(&d));
  assert_int_equal(rc, status);
  assert_non_null(strstr(mg_diag_msg(&d), text));
  assert_null(t->o);
  assert_null(t->dw_kv_b);
  assert_int_equal(st.n_allocs, 0);
  mg_diag_clear(&d);
}

static void test_refusals(void **state) {
  (void)state;
  const mg_shape sh = shape_small();
  static mg_plan p, bad;
  mg_diag d = MG_DIAG_INIT;
  static char dummy[64];
  mg_cpu_tensors t = {.q = dummy, .c_kv = dummy, .k_rope = dummy, .w_kv_b = dummy, .d_o = dummy};

  mg_plan_args a = {.shape = &sh, .form = MG_FORM_EXPLICIT, .sp = 1, .batch = 1, .seq = 8,
                    .causal = 1, .dtype = MG_BF16};
  fail_diag(mg_plan_build(&p, &a, &d), &d, "plan");
  expect_refusal(&p, NULL, &t, MLAGEN_EINVAL, "the CPU executor runs f32 or f64");

  a.dtype = MG_F32;
  fail_diag(mg_plan_build(&p, &a, &d), &d, "plan");
  t.d_o = NULL;
  expect_refusal(&p, NULL, &t, MLAGEN_EINVAL, "input do is NULL");
  t.d_o = dummy;

  mg_cpu_capture cap = {"no_such", dummy, 4};
  t.captures = &cap;
  t.n_captures = 1;
  expect_refusal(&p, NULL, &t, MLAGEN_EINVAL, "has no buffer 'no_such'");
  cap.name = "q";
  expect_refusal(&p, NULL, &t, MLAGEN_EINVAL, "q is an input");
  cap.name = "lse";
  expect_refusal(&p, NULL, &t, MLAGEN_EINVAL, "capture lse: 4 bytes");
  t.captures = NULL;
  t.n_captures = 0;

  /* a plan for 2 ranks: no communicator, or one of 1 rank */
  a.sp = 2;
  fail_diag(mg_plan_build(&p, &a, &d), &d, "plan");
  expect_refusal(&p, NULL, &t, MLAGEN_EINVAL, "needs a communicator");
  mg_comm *comm = NULL;
  fail_diag(mg_comm_local_new(&comm, &d), &d, "comm");
  expect_refusal(&p, comm, &t, MLAGEN_EINVAL, "the communicator is rank 0 of 1");

  /* a malformed plan: a GEMM reading past its operand */
  a.sp = 1;
  fail_diag(mg_plan_build(&p, &a, &d), &d, "plan");
  bad = p;
  bad.steps[0].gemm.ldb += 1;
  expect_refusal(&bad, comm, &t, MLAGEN_EINVAL, "operand B reads element");
  bad = p;
  bad.steps[1].rope_col = 1;
  expect_refusal(&bad, comm, &t, MLAGEN_EINVAL, "rope columns");
  mg_comm_destroy(comm);

  /* the absorbed form's latent rows past the kernels' stack rows */
  mg_shape wide = tu_shape(1, 16, 16, 16, 4096);
  a.shape = &wide;
  a.form = MG_FORM_ABSORBED;
  a.seq = 1;
  fail_diag(mg_plan_build(&p, &a, &d), &d, "plan");
  expect_refusal(&p, NULL, &t, MLAGEN_EUNSUPPORTED, "exceed the CPU kernels' 2048");

  assert_int_equal(mg_cpu_run(NULL, NULL, &t, NULL, &d), MLAGEN_EINVAL);
  mg_diag_clear(&d);
}

/* ---- (f) packed sequences ------------------------------------------------------------ */

/* Every form in f64 against the per-document float64 reference (tv_reference): atol in rms
 * units (of the finite elements) at rtol 1e-14, about twice the largest needed over 82 seeds
 * (printed at the end as "needed varlen"; the noise has a long tail over seeds): o 8.0e-15,
 * lse 2.5e-16, dq 5.5e-14, dc_kv 2.2e-14, dk_rope 1.1e-14, dw_kv_b 6.8e-15. A boundary moved
 * by one token fails every output (the test checks it). */
static const tu_tol tol_varlen[TU_N_OUT] = {{1.6e-14, 1e-14}, {5e-16, 1e-14}, {1.1e-13, 1e-14},
                                            {4.5e-14, 1e-14}, {2.2e-14, 1e-14}, {1.4e-14, 1e-14}};
static double g_need_varlen[TU_N_OUT];

/* mg_cpu_run_pass (forward then backward in the caller's memory) gives run r's outputs
 * bit for bit on the same inputs and documents. Returns the outputs that differ. */
static int pass_matches_run(const tv_stream *st, const tu_run *r) {
  mg_diag d = MG_DIAG_INIT;
  static mg_plan_mem mem;
  fail_diag(mg_plan_mem_layout(&r->plan, 64, &mem, &d), &d, "layout");
  void *ws = calloc(1, (size_t)mem.workspace_bytes + 1), *saved = calloc(1, (size_t)mem.saved_bytes + 1);
  const void *want[5] = {r->t.o, r->t.dq, r->t.dc_kv, r->t.dk_rope, r->t.dw_kv_b};
  const char *names[5] = {"o", "dq", "dc_kv", "dk_rope", "dw_kv_b"};
  void *got[5];
  size_t bytes[5];
  for (int k = 0; k < 5; k++) {
    bytes[k] = (size_t)mg_plan_buf_bytes(&r->plan.bufs[mg_plan_find(&r->plan, names[k])]);
    assert_non_null(got[k] = malloc(bytes[k]));
  }
  mg_cpu_tensors t = {.q = r->t.q, .c_kv = r->t.c_kv, .k_rope = r->t.k_rope,
                      .w_kv_b = r->t.w_kv_b, .d_o = r->t.d_o, .o = got[0], .dq = got[1],
                      .dc_kv = got[2], .dk_rope = got[3], .dw_kv_b = got[4],
                      .cu_seqlens = st->cu, .n_cu = st->n_cu};
  assert_non_null(ws);
  assert_non_null(saved);
  fail_diag(mg_cpu_run_pass(&r->plan, NULL, MG_FWD, &t, &mem, ws, saved, &d), &d, "pass fwd");
  fail_diag(mg_cpu_run_pass(&r->plan, NULL, MG_BWD, &t, &mem, ws, saved, &d), &d, "pass bwd");
  int bad = 0;
  for (int k = 0; k < 5; k++) {
    if (memcmp(got[k], want[k], bytes[k])) {
      print_error("%s: mg_cpu_run_pass's %s differs from mg_cpu_run's\n",
                  mg_form_name(r->plan.args.form), names[k]);
      bad++;
    }
    free(got[k]);
  }
  free(ws);
  free(saved);
  return bad;
}

static void test_varlen_f64(void **state) {
  (void)state;
  mg_diag d = MG_DIAG_INIT;
  const mg_shape sh = tu_shape(4, 16, 8, 16, 32);
  const int one[] = {90}, none[] = {0};
  const tv_stream streams[3] = {tv_many(), tv_make(one, 1, 96), tv_make(none, 1, 8)};
  const char *stream_names[3] = {"lengths 0 1 2 3 17 64 0 200 in 312 rows",
                                 "one document of 90 in 96 rows",
                                 "no token in 8 rows (the weight GEMMs contract none)"};
  int bad = 0;
  for (int si = 0; si < 3; si++)
    for (int causal = 0; causal < 2; causal++) {
      const tv_stream *st = &streams[si];
      assert_true(st->T < st->cap); /* slack rows present */
      tu_case c = tv_case(&sh, st, causal);
      double *in[TU_N_IN] = {0}, *ref[TU_N_OUT] = {0};
      assert_int_equal(tv_inputs(&c, st->T, g_seed + 20 + (uint64_t)(si * 2 + causal), in), 0);
      assert_int_equal(tv_reference(&c, st->cu, st->n_cu, in, ref), 0);
      if (si == 1) { /* the scores of the one document: a trained model's spread */
        tu_case doc = {sh, 1, st->T, causal};
        const double spread = tu_score_std(&doc, in);
        assert_true(spread > 1.6 && spread < 2.4);
      }
      for (int f = 0; f < MG_FORM_COUNT; f++) {
        tu_run r;
        double *out[TU_N_OUT] = {0};
        fail_diag(tv_run_form(&c, st, (mg_form)f, 1, 0, NULL, MG_F64, in, &r, &d), &d, "varlen run");
        assert_true(r.plan.args.varlen && r.plan.args.cu_seqlens == NULL);
        assert_int_equal(tu_outputs(&c, &r, out), 0);
        char what[400];
        snprintf(what, sizeof what, "varlen %s f64, %s, causal %d vs the per-document reference",
                 mg_form_name((mg_form)f), stream_names[si], causal);
        bad += compare_all(&c, out, ref, tol_varlen, what, g_need_varlen);
        for (int k = 0; k < TU_N_OUT; k++) {
          const int64_t wrong = tv_slack_wrong(&c, st->T, k, out[k]);
          if (wrong) print_error("%s: %lld slack elements of %s are not %s\n", what,
                                 (long long)wrong, tu_out_names[k], k == TU_LSE ? "-inf" : "0");
          bad += wrong > 0;
        }
        if (si == 0 && causal && f == MG_FORM_LAGA) bad += pass_matches_run(st, &r);
        if (si == 0 && f == MG_FORM_EXPLICIT) {
          /* the check sees a boundary moved by one token (the 17-token document one later) */
          int32_t moved[TV_MAX_DOCS + 1];
          memcpy(moved, st->cu, sizeof moved);
          moved[4] += 1;
          double *mref[TU_N_OUT] = {0};
          assert_int_equal(tv_reference(&c, moved, st->n_cu, in, mref), 0);
          for (int k = 0; k < TU_N_OUT; k++) {
            const int64_t n = tu_out_numel(&c, k);
            cc_result cr = cc_compare_d(out[k], mref[k], n, tol_varlen[k].atol * tu_rms(mref[k], n),
                                        tol_varlen[k].rtol);
            if (cc_ok(&cr)) {
              print_error("%s: a boundary moved by one passes %s\n", what, tu_out_names[k]);
              bad++;
            }
          }
          tu_free(mref, TU_N_OUT);
        }
        tu_free(out, TU_N_OUT);
        tu_run_free(&r);
      }
      tu_free(ref, TU_N_OUT);
      tu_free(in, TU_N_IN);
    }
  assert_int_equal(bad, 0);
}

/* The executor's refusals of documents: none for a varlen plan, some for an unpacked one,
 * malformed ones (each naming the index), before any step runs (nothing allocated). */
static void test_varlen_refusals(void **state) {
  (void)state;
  const mg_shape sh = shape_small();
  static mg_plan p;
  mg_diag d = MG_DIAG_INIT;
  static char dummy[64];
  mg_cpu_tensors t = {.q = dummy, .c_kv = dummy, .k_rope = dummy, .w_kv_b = dummy, .d_o = dummy};
  mg_plan_args a = {.shape = &sh, .form = MG_FORM_LAGA, .sp = 1, .batch = 1, .seq = 16,
                    .causal = 1, .dtype = MG_F32, .varlen = 1};
  fail_diag(mg_plan_build(&p, &a, &d), &d, "plan");
  expect_refusal(&p, NULL, &t, MLAGEN_EINVAL, "a varlen plan needs cu_seqlens");
  const int32_t start1[] = {1, 4, 9}, down[] = {0, 7, 5, 9}, past[] = {0, 8, 17};
  t.cu_seqlens = start1, t.n_cu = 3;
  expect_refusal(&p, NULL, &t, MLAGEN_EINVAL, "cu_seqlens[0] = 1, the first boundary must be 0");
  t.cu_seqlens = down, t.n_cu = 4;
  expect_refusal(&p, NULL, &t, MLAGEN_EINVAL, "cu_seqlens[2] = 5 is below cu_seqlens[1] = 7");
  t.cu_seqlens = past, t.n_cu = 3;
  expect_refusal(&p, NULL, &t, MLAGEN_EINVAL, "cu_seqlens[2] = 17 is past the plan's token capacity 16");
  t.n_cu = 0;
  expect_refusal(&p, NULL, &t, MLAGEN_EINVAL, "cu_seqlens needs at least one entry");
  a.varlen = 0;
  fail_diag(mg_plan_build(&p, &a, &d), &d, "plan");
  t.n_cu = 2;
  expect_refusal(&p, NULL, &t, MLAGEN_EINVAL, "for a plan without varlen");
  mg_diag_clear(&d);
}

static int report_needed(void **state) {
  (void)state;
  printf("needed atol (rms units), f32 forms vs explicit:");
  for (int k = 0; k < TU_N_OUT; k++) printf(" %s %.1e", tu_out_names[k], g_need_f32[k]);
  printf("\nneeded atol (rms units), f64 explicit vs reference:");
  for (int k = 0; k < TU_N_OUT; k++) printf(" %s %.1e", tu_out_names[k], g_need_f64[k]);
  printf("\nneeded varlen (rms units), f64 forms vs the per-document reference:");
  for (int k = 0; k < TU_N_OUT; k++) printf(" %s %.1e", tu_out_names[k], g_need_varlen[k]);
  printf("\n");
  return 0;
}

int main(void) {
  const char *s = getenv("MLAGEN_TEST_SEED");
  g_seed = s && *s ? strtoull(s, NULL, 0)
                   : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
  printf("test_cpu_exec: seed %llu (rerun with MLAGEN_TEST_SEED=%llu)\n",
         (unsigned long long)g_seed, (unsigned long long)g_seed);
  fflush(stdout);
  const char *filter = getenv("MLAGEN_TEST_FILTER"); /* a cmocka pattern: a subset */
  if (filter && *filter) cmocka_set_test_filter(filter);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_memory_matches_plan), cmocka_unit_test(test_forms_agree),
      cmocka_unit_test(test_reference_f64),       cmocka_unit_test(test_finite_differences),
      cmocka_unit_test(test_scale_sensitivity), cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_varlen_f64),          cmocka_unit_test(test_varlen_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, report_needed);
}
