/* test_cpu_mpi.c: the CPU executor on P = 1, 2, 3, 4, 8 MPI processes (run it under
 * mpirun).
 *
 * Every rank draws the same global inputs from one seed (MLAGEN_TEST_SEED, else the time
 * on rank 0, broadcast), computes the single-rank explicit reference on the full inputs
 * with the local communicator, then runs every form at P = np on its shard (the Ulysses
 * forms where P divides H; laga-cp always, on its two-chunk shard) and compares its o,
 * lse (its heads; laga-cp: its queries), dq, dc_kv, dk_rope and the sum over ranks of
 * dw_kv_b with the reference per element (f32, tu_tol_f32; shapes with DeepSeek-V3's YaRN
 * softmax scale, scores with std about 2: tu_shape, tu_inputs), and its measured memory
 * and traffic with the planner's. test_laga_cp_reference holds laga-cp in f64 against the
 * independent float64 reference (tu_reference) at H = 1, 3, 4, 20, P > H included.
 * test_varlen_ranks runs packed sequences (documents of 1, 2, 3, 17, 64, 200 tokens and two
 * empty ones in 312 rows, NaN in every slack row) at P = np in f64, documents cut by the
 * rank boundaries (and laga-cp's chunks), every form that runs at P, against the P = 1
 * packed run of the explicit form (test_cpu_exec holds every form's against the
 * per-document float64 reference). Rank 0 prints cmocka's report; other ranks print theirs only when
 * they fail (tests/mpi_test_main.h). Each test runs all its collectives first and asserts
 * last, so a failing rank never leaves the others waiting. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <mpi.h>

#include "cpu_test_util.h"
#include "mg_comm.h"
#include "mpi_test_main.h"
#include "varlen_test_util.h"

static int g_rank, g_size;
static uint64_t g_seed;

/* Per element at tu_tol_f32 (tu_check); rank 0 prints the largest atol (rms units) each
 * output needed as "needed". Measured over 17 seeds at P = 1, 2, 4: o 3.6e-6,
 * lse 2.5e-7, dq 4.5e-6, dc_kv 3.1e-6, dk_rope 2.5e-6, dw_kv_b 4.0e-6; over 80 more at
 * P = 2: o 5.1e-6, lse 3.6e-7, dq 5.5e-6, dc_kv 3.9e-6, dk_rope 2.9e-6, dw_kv_b 3.9e-6
 * (and lse 5.3e-7 at seed 1020: cpu_test_util.h's tu_tol_f32). */
static double g_need[TU_N_OUT];

/* Checks this rank's part of output k of run r (case c, form, element type dt) against
 * the same part of the whole reference ref (tu_ref_local; the weight gradient, a partial sum
 * per rank, summed over the group first) at tol (tu_check, scaled by ref's RMS; `what`
 * names it), and raises *worst to the largest atol any rank needed; returns 1 when the
 * check failed on any rank (the same on all). */
static int check_ranks(const tu_case *c, const tu_run *r, int k, mg_form form, mg_dtype dt,
                       const double *ref, const char *what, tu_tol tol, double *worst) {
  const int64_t n = tu_local_numel(c, k, form, g_size);
  double *local = malloc((size_t)n * sizeof(double)), *want = malloc((size_t)n * sizeof(double));
  if (!local || !want) MPI_Abort(MPI_COMM_WORLD, 1);
  for (int64_t i = 0; i < n; i++) local[i] = tu_get(dt, tu_out_ptr(r, k), i);
  if (k == TU_DW) MPI_Allreduce(MPI_IN_PLACE, local, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  tu_ref_local(c, k, form, ref, g_size, g_rank, want);
  cc_result cr = tu_check(what, local, want, n, tu_rms(ref, tu_out_numel(c, k)), tol,
                          tu_out_cols(c, k));
  double need = cr.min_atol;
  int ok = cc_ok(&cr), all_ok;
  MPI_Allreduce(MPI_IN_PLACE, &need, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (need > *worst) *worst = need;
  free(want);
  free(local);
  return !all_ok;
}

/* 1 (and the figures printed) when run r's measured saved bytes, peaks or traffic differ
 * from its plan's (r->cost); else 0. form and what name the run. */
static int cost_differs(const tu_run *r, const char *form, const char *what) {
  if (r->st.saved == r->cost.saved && r->st.peak_fwd == r->cost.peak_fwd &&
      r->st.peak_bwd == r->cost.peak_bwd && r->st.sent_fwd == r->cost.sent_fwd &&
      r->st.sent_bwd == r->cost.sent_bwd)
    return 0;
  print_error("%s %s rank %d: measured saved %lld peak %lld/%lld sent %lld/%lld, planned %lld "
              "%lld/%lld %lld/%lld\n", form, what, g_rank, (long long)r->st.saved,
              (long long)r->st.peak_fwd, (long long)r->st.peak_bwd, (long long)r->st.sent_fwd,
              (long long)r->st.sent_bwd, (long long)r->cost.saved, (long long)r->cost.peak_fwd,
              (long long)r->cost.peak_bwd, (long long)r->cost.sent_fwd,
              (long long)r->cost.sent_bwd);
  return 1;
}

static void test_forms_match_single_rank(void **state) {
  mg_comm *comm = *state;
  const mg_shape shapes[2] = {tu_shape(16, 128, 64, 128, 512), tu_shape(8, 64, 32, 64, 256)};
  int bad = 0;
  for (int si = 0; si < 2; si++)
    for (int causal = 0; causal < 2; causal++) {
      tu_case c = {shapes[si], 2, 24, causal};
      double *in[TU_N_IN] = {0}, *ref[TU_N_OUT] = {0};
      mg_diag d = MG_DIAG_INIT;
      if (tu_inputs(&c, g_seed + (uint64_t)(si * 2 + causal), in)) {
        print_error("out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      tu_run r1;
      int rc = tu_run_form(&c, MG_FORM_EXPLICIT, 1, 0, NULL, MG_F32, in, &r1, &d);
      if (rc || tu_outputs(&c, &r1, ref)) {
        print_error("reference: %s\n", mg_diag_msg(&d));
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      tu_run_free(&r1);
      for (int f = 0; f < MG_FORM_COUNT; f++) {
        if (f != MG_FORM_LAGA_CP && c.shape.heads % g_size) continue; /* Ulysses: P | H */
        tu_run r;
        rc = tu_run_form(&c, (mg_form)f, g_size, g_rank, comm, MG_F32, in, &r, &d);
        if (rc) {
          print_error("%s at P = %d: %s\n", mg_form_name((mg_form)f), g_size, mg_diag_msg(&d));
          MPI_Abort(MPI_COMM_WORLD, 1);
        }
        bad += cost_differs(&r, mg_form_name((mg_form)f), c.shape.source);
        if (g_size > 1 && r.st.sent_fwd == 0) bad++; /* P > 1 communicates */
        for (int k = 0; k < TU_N_OUT; k++) {
          char what[512];
          snprintf(what, sizeof what, "%s %s causal %d P %d rank %d: %s vs single-rank explicit",
                   mg_form_name((mg_form)f), c.shape.source, causal, g_size, g_rank, tu_out_names[k]);
          bad += check_ranks(&c, &r, k, (mg_form)f, MG_F32, ref[k], what, tu_tol_f32[k], &g_need[k]);
        }
        tu_run_free(&r);
      }
      mg_diag_clear(&d);
      tu_free(ref, TU_N_OUT);
      tu_free(in, TU_N_IN);
    }
  assert_int_equal(bad, 0);
}

/* laga-cp in f64 against the independent float64 reference (tu_reference): H = 1, 3, 4
 * and 20 heads (P > H at P = 2, 3, 4, 8 for some), causal and not, batch 2, S / P = 5
 * tokens per rank (uneven chunks: 3 and 2) with one and with the default head groups
 * (tiny dims: d_n 16, d_r 16, d_v 32, d_c 32). Per element at tol_f64 (atol in rms units,
 * rtol 1e-14). The f64 noise is a few ulp and depends on the seed: the largest atol measured
 * (printed as "needed f64") over 11 seeds at P = 2 and 3 more at each P of 3, 4, 8 was
 * o 1.2e-15, lse 2.9e-16 (0 for most seeds; 2.9e-16 in one CI run), dq
 * 1.5e-14, dc_kv 6.2e-15, dk_rope 7.6e-15, dw_kv_b 5.0e-15; tol_f64 is about twice that
 * (lse: 3.5x), and for dk_rope and dw_kv_b twice the 1.6e-14 and 8.3e-15 that 60 more seeds
 * at P = 2 (3000-3059) reached (the others stayed under half their atol). A laga-cp error (a wrong position, a missed chunk, a lost
 * group) is 1e-3 or more. The bytes each rank
 * sends equal the planner's, and the forward sends only the latent:
 * B (S / P) (d_c + d_r)(P - 1) elements. */
static const tu_tol tol_f64[TU_N_OUT] = {{2.5e-15, 1e-14}, {1e-15, 1e-14}, {3e-14, 1e-14},
                                         {1.3e-14, 1e-14}, {3.2e-14, 1e-14}, {1.7e-14, 1e-14}};
static double g_need_f64[TU_N_OUT];

static void test_laga_cp_reference(void **state) {
  mg_comm *comm = *state;
  const int heads[] = {1, 3, 4, 20};
  int bad = 0;
  for (size_t hi = 0; hi < sizeof heads / sizeof heads[0]; hi++)
    for (int causal = 0; causal < 2; causal++)
      for (int grouped = 0; grouped < 2; grouped++) {
        tu_case c = {tu_shape(heads[hi], 16, 16, 32, 32), 2, 5 * (int64_t)g_size, causal};
        double *in[TU_N_IN] = {0}, *ref[TU_N_OUT] = {0};
        for (int k = 0; k < TU_N_OUT; k++) ref[k] = calloc((size_t)tu_out_numel(&c, k), sizeof(double));
        if (tu_inputs(&c, g_seed + 100 + hi * 4 + (uint64_t)causal, in) || !ref[TU_N_OUT - 1] ||
            tu_reference(&c, in, ref)) {
          print_error("out of memory\n");
          MPI_Abort(MPI_COMM_WORLD, 1);
        }
        mg_diag d = MG_DIAG_INIT;
        tu_run r;
        memset(&r, 0, sizeof r);
        mg_plan_args a = {.shape = &c.shape, .form = MG_FORM_LAGA_CP, .sp = g_size, .rank = g_rank,
                          .batch = c.B, .seq = c.S, .causal = causal, .dtype = MG_F64,
                          .head_groups = grouped ? 0 : 1};
        /* tu_run_form with laga-cp's head groups: one group, or the default */
        int rc = mg_plan_build(&r.plan, &a, &d);
        for (int k = 0; !rc && k < TU_N_IN; k++) {
          int64_t B, S, w;
          tu_in_dims(&c, k, &B, &S, &w);
          r.in[k] = k == TU_W ? tu_shard(in[k], 1, S, w, 0, 1, MG_F64)
                              : tu_shard_form(in[k], B, S, w, MG_FORM_LAGA_CP, g_rank, g_size, MG_F64);
          if (!r.in[k]) rc = mg_diag_set(&d, MLAGEN_ENOMEM, "out of memory");
        }
        const int lse_id = rc ? -1 : mg_plan_find(&r.plan, "lse");
        const size_t lse_bytes = lse_id < 0 ? 0 : (size_t)mg_plan_buf_bytes(&r.plan.bufs[lse_id]);
        if (!rc && !(r.lse = malloc(lse_bytes))) rc = mg_diag_set(&d, MLAGEN_ENOMEM, "out of memory");
        mg_cpu_capture cap = {"lse", r.lse, lse_bytes};
        r.t = (mg_cpu_tensors){.q = r.in[TU_Q], .c_kv = r.in[TU_CKV], .k_rope = r.in[TU_KROPE],
                               .w_kv_b = r.in[TU_W], .d_o = r.in[TU_DO], .captures = &cap,
                               .n_captures = 1};
        if (!rc) rc = mg_cpu_run(&r.plan, comm, &r.t, &r.st, &d);
        if (rc) {
          print_error("laga-cp H %d P %d: %s\n", heads[hi], g_size, mg_diag_msg(&d));
          MPI_Abort(MPI_COMM_WORLD, 1);
        }
        mg_plan_cost_of(&r.plan, &r.cost);
        const int64_t Sl = c.S / g_size, wc = c.shape.kv_lora_rank + c.shape.qk_rope_head_dim;
        if (r.st.sent_fwd != r.cost.sent_fwd || r.st.sent_bwd != r.cost.sent_bwd ||
            r.cost.sent_fwd != c.B * Sl * wc * (g_size - 1) * 8 || r.st.saved != r.cost.saved ||
            r.st.peak_fwd != r.cost.peak_fwd || r.st.peak_bwd != r.cost.peak_bwd) {
          print_error("laga-cp H %d P %d rank %d: sent %lld/%lld (plan %lld/%lld), saved %lld "
                      "(%lld)\n", heads[hi], g_size, g_rank, (long long)r.st.sent_fwd,
                      (long long)r.st.sent_bwd, (long long)r.cost.sent_fwd,
                      (long long)r.cost.sent_bwd, (long long)r.st.saved, (long long)r.cost.saved);
          bad++;
        }
        for (int k = 0; k < TU_N_OUT; k++) {
          char what[512];
          snprintf(what, sizeof what, "laga-cp f64 H %d causal %d groups %d P %d rank %d: %s vs "
                   "the float64 reference", heads[hi], causal, r.plan.args.head_groups, g_size,
                   g_rank, tu_out_names[k]);
          bad += check_ranks(&c, &r, k, MG_FORM_LAGA_CP, MG_F64, ref[k], what, tol_f64[k],
                             &g_need_f64[k]);
        }
        tu_run_free(&r);
        mg_diag_clear(&d);
        tu_free(ref, TU_N_OUT);
        tu_free(in, TU_N_IN);
      }
  assert_int_equal(bad, 0);
}

/* Packed sequences at P = np against the P = 1 packed run of the explicit form, f64, per
 * element: atol (rms units of the finite elements) at rtol 1e-14, about twice the largest
 * needed over 53 runs at P = 2, 3, 4, 8 (printed as "needed varlen"; the noise has a long
 * tail over seeds, the absorbed form's sums over d_c the worst): o 1.0e-14, lse 1.6e-16,
 * dq 4.4e-14, dc_kv 2.1e-14, dk_rope 2.5e-14, dw_kv_b 5.1e-15 (a wrong boundary or an
 * unclipped token GEMM errs by 1e-3 or gives NaN). The documents
 * [0, 1), [1, 3), [3, 6), [6, 23), [23, 87), [87, 287) cross the rank boundaries at every P
 * (P = 4: 78, 156, 234), and laga-cp's chunks of 39 (P = 4) cut them again; the measured
 * memory and traffic equal the planner's. */
static const tu_tol tol_varlen[TU_N_OUT] = {{2e-14, 1e-14}, {3e-16, 1e-14}, {9e-14, 1e-14},
                                            {4.5e-14, 1e-14}, {5e-14, 1e-14}, {1.2e-14, 1e-14}};
static double g_need_varlen[TU_N_OUT];

static void test_varlen_ranks(void **state) {
  mg_comm *comm = *state;
  const mg_shape sh = tu_shape(4, 16, 8, 16, 32);
  const tv_stream st = tv_many();
  int bad = 0;
  for (int causal = 0; causal < 2; causal++) {
    tu_case c = tv_case(&sh, &st, causal);
    double *in[TU_N_IN] = {0}, *ref[TU_N_OUT] = {0};
    mg_diag d = MG_DIAG_INIT;
    tu_run r1;
    if (tv_inputs(&c, st.T, g_seed + 200 + (uint64_t)causal, in) ||
        tv_run_form(&c, &st, MG_FORM_EXPLICIT, 1, 0, NULL, MG_F64, in, &r1, &d) ||
        tu_outputs(&c, &r1, ref)) {
      print_error("varlen explicit at P = 1: %s\n", mg_diag_msg(&d));
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    tu_run_free(&r1);
    for (int f = 0; f < MG_FORM_COUNT; f++) {
      if (f != MG_FORM_LAGA_CP && sh.heads % g_size) continue; /* Ulysses: P | H */
      tu_run r;
      int rc = tv_run_form(&c, &st, (mg_form)f, g_size, g_rank, comm, MG_F64, in, &r, &d);
      if (rc) {
        print_error("varlen %s at P = %d: %s\n", mg_form_name((mg_form)f), g_size, mg_diag_msg(&d));
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      bad += cost_differs(&r, mg_form_name((mg_form)f), "varlen");
      for (int k = 0; k < TU_N_OUT; k++) {
        char what[512];
        snprintf(what, sizeof what, "varlen %s f64 causal %d P %d rank %d: %s vs the P = 1 packed explicit run",
                 mg_form_name((mg_form)f), causal, g_size, g_rank, tu_out_names[k]);
        bad += check_ranks(&c, &r, k, (mg_form)f, MG_F64, ref[k], what, tol_varlen[k],
                           &g_need_varlen[k]);
      }
      tu_run_free(&r);
    }
    mg_diag_clear(&d);
    tu_free(ref, TU_N_OUT);
    tu_free(in, TU_N_IN);
  }
  assert_int_equal(bad, 0);
}

/* S not divisible by P, and P > H: refused by the plan, the same on every rank (P >= 2: not
 * registered at 1). */
static void test_bad_input(void **state) {
  (void)state;
  mg_diag d = MG_DIAG_INIT;
  static mg_plan p;
  mg_shape sh = tu_shape(8, 64, 32, 64, 256);
  mg_plan_args a = {.shape = &sh, .form = MG_FORM_LAGA, .sp = g_size, .rank = g_rank, .batch = 2,
                    .seq = 4 * g_size + 1, .causal = 1, .dtype = MG_F32};
  assert_int_equal(mg_plan_build(&p, &a, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "not divisible by sp"));
  mg_shape few = tu_shape((g_size + 1) / 2, 64, 32, 64, 256); /* H = P / 2 < P */
  a.shape = &few;
  a.seq = 4 * g_size;
  for (int f = 0; f < MG_FORM_COUNT; f++) {
    a.form = (mg_form)f;
    if (f == MG_FORM_LAGA_CP) { /* any P */
      assert_int_equal(mg_plan_build(&p, &a, &d), 0);
      continue;
    }
    assert_int_equal(mg_plan_build(&p, &a, &d), MLAGEN_EINVAL);
    assert_non_null(strstr(mg_diag_msg(&d), "exceeds num_attention_heads"));
    assert_non_null(strstr(mg_diag_msg(&d), "laga-cp"));
  }
  mg_diag_clear(&d);
}

int main(int argc, char **argv) {
  mpi_test_begin(&argc, &argv, "test_cpu_mpi", &g_rank, &g_size, &g_seed);
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_forms_match_single_rank),
                                     cmocka_unit_test(test_laga_cp_reference)};
  /* P >= 2 only (not registered at 1): test_varlen_ranks' reference is the P = 1 run itself;
   * test_bad_input's refusals need P > 1 */
  const struct CMUnitTest multi[] = {cmocka_unit_test(test_varlen_ranks),
                                     cmocka_unit_test(test_bad_input)};
  int failed = MPI_TEST_GROUP_MULTI("test_cpu_mpi", tests, multi, mpi_test_comm_setup,
                                    mpi_test_comm_teardown);
  if (g_rank == 0) {
    printf("needed atol (rms units) at P = %d:", g_size);
    for (int k = 0; k < TU_N_OUT; k++) printf(" %s %.1e", tu_out_names[k], g_need[k]);
    printf("\nneeded f64 (laga-cp vs the float64 reference):");
    for (int k = 0; k < TU_N_OUT; k++) printf(" %s %.1e", tu_out_names[k], g_need_f64[k]);
    printf("\nneeded varlen f64 (P = %d vs the P = 1 packed explicit run):", g_size);
    for (int k = 0; k < TU_N_OUT; k++) printf(" %s %.1e", tu_out_names[k], g_need_varlen[k]);
    printf("\n");
  }
  return mpi_test_end("test_cpu_mpi", failed);
}
