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
      for (int f = 0; f < MG_FORM_COUNT; f++) {
        tu_run r;
        fail_diag(tu_run_form(&c, (mg_form)f, 1, 0, comm, MG_F32, in, &r, &d), &d, "run");
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

static int report_needed(void **state) {
  (void)state;
  printf("needed atol (rms units), f32 forms vs explicit:");
  for (int k = 0; k < TU_N_OUT; k++) printf(" %s %.1e", tu_out_names[k], g_need_f32[k]);
  printf("\nneeded atol (rms units), f64 explicit vs reference:");
  for (int k = 0; k < TU_N_OUT; k++) printf(" %s %.1e", tu_out_names[k], g_need_f64[k]);
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
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_memory_matches_plan), cmocka_unit_test(test_forms_agree),
      cmocka_unit_test(test_reference_f64),       cmocka_unit_test(test_finite_differences),
      cmocka_unit_test(test_scale_sensitivity), cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, report_needed);
}
