/* test_cuda_exec_mpi.c: the CUDA executor (runtime/exec/mg_cuda_exec.h) at P = np under MPI
 * (issue 7): the P > 1 path on CPU device ops (tests/cuda_exec_host_ops.h: host memory,
 * CBLAS GEMMs, generated kernels on the host executor) with collectives through
 * mg_comm_mpi: the all-to-all pack / exchange / unpack, the all-gather and reduce-scatter
 * reorders (bf16 reduce-scatter summed in f32 by the MPI backend), dw_kv_b zeroed before
 * its rows are written, and the wait that polls the communicator.
 *
 * Every rank draws the same global inputs from one seed (MLAGEN_TEST_SEED, else the time
 * on rank 0, broadcast), rounded to bf16, and computes the single-rank reference with the
 * CPU executor (same form, f32 plan, P = 1). It then runs the form's bf16 plan for its
 * rank of np through mg_cuda_exec forward and backward and compares its shard of o, lse
 * (its heads, read from the saved area), dq, dc_kv, dk_rope and the sum over ranks of its
 * dw_kv_b with the reference per element at tu_tol_bf16 (a NaN fails); shapes carry
 * DeepSeek-V3's YaRN softmax scale and scores have std about 2 (tu_shape, tu_inputs).
 * f16: the LAGA and absorbed forms' f16 plans (causal) the same way at tu_tol_f16. The workspace, the saved area and the
 * outputs are filled with NaN before the forward (the workspace before the backward too),
 * so a buffer read before it is written, or dw_kv_b rows left unzeroed, show. Shape: H 4,
 * d_n 64, d_r 32, d_v 64, d_c 256, B 2, S 16, causal and not (at P > 2 causal only, and
 * f16 at P = 2 only: the code they add runs the same at every P > 1), every form (laga-cp with its
 * two-chunk shards: the attention launches take S_k and the query positions).
 * test_varlen: packed sequences (issue 16), every form's varlen plan over documents that
 * span the ranks, against the float64 per-document reference at tv_tol_bf16, slack rows exact.
 *
 * Kernels are built by the host executor's compiler; with MG_HOST_CACHE_DIR set (ctest
 * sets it) rank 0 prepares first and the other ranks load what it built.
 *
 * The wait (np > 1): with a communicator wrapper that adds a poll, a stream that reports
 * busy for a few queries makes the run poll until it is done; a poll error is returned
 * (prefixed with the pass) instead of waiting on; a stream that never finishes times out
 * with MLAGEN_EIO. Every collective completes before the wait, so no rank is left behind.
 *
 * Rank 0 prints cmocka's report; other ranks print theirs only when they fail
 * (tests/mpi_test_main.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_test_util.h"
#include "cuda_exec_host_ops.h"
#include "mg_comm.h"
#include "mpi_test_main.h"
#include "varlen_test_util.h"

static int g_rank, g_size;
static uint64_t g_seed;
static mg_comm *g_comm;
static mg_gen *g_gen;
static host_ops *g_ops;
static double g_worst[TU_N_OUT];

static int setup(void **state) {
  (void)state;
  mg_diag d = MG_DIAG_INIT;
  MPI_Comm world = MPI_COMM_WORLD;
  int rc = mg_comm_mpi_wrap(&g_comm, &world, &d);
  if (!rc) rc = mg_gen_open(&g_gen, NULL, &d);
  if (rc) print_error("setup: %s\n", mg_diag_msg(&d));
  else g_ops = host_ops_new(g_gen);
  mg_diag_clear(&d);
  return rc ? -1 : 0;
}

static int teardown(void **state) {
  (void)state;
  if (g_ops) mg_dev_ops_destroy(&g_ops->base);
  mg_gen_close(g_gen);
  mg_comm_destroy(g_comm);
  return 0;
}

/* A failure that would leave other ranks waiting in a collective ends the job. */
static void die(const char *what, const mg_diag *d) {
  fprintf(stderr, "[rank %d] %s: %s\n", g_rank, what, mg_diag_msg(d));
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Prepares plan p on every rank, rank 0 first (it builds the host kernels; the others
 * find them in MG_HOST_CACHE_DIR). Returns the executor; any rank's failure aborts. */
static mg_cuda_exec *prepare_all(const mg_plan *p, double timeout_s) {
  mg_diag d = MG_DIAG_INIT;
  mg_cuda_exec *x = NULL;
  mg_cuda_exec_opts eo = {.gen = g_gen, .timeout_s = timeout_s};
  int rc = 0;
  if (g_rank == 0) rc = mg_cuda_exec_prepare(p, &g_ops->base, &eo, &x, &d);
  MPI_Barrier(MPI_COMM_WORLD);
  if (g_rank != 0) rc = mg_cuda_exec_prepare(p, &g_ops->base, &eo, &x, &d);
  if (rc) die("prepare", &d);
  mg_diag_clear(&d);
  return x;
}

/* One rank's pass buffers for plan x: inputs (this rank's shard, bf16), outputs filled
 * with NaN, workspace and saved area. */
typedef struct bufs {
  e16 *in[TU_N_IN];
  void *out[TU_N_OUT];
  void *ws, *saved;
  size_t ws_b, sv_b;
  mg_cuda_tensors t;
} bufs;

static void bufs_make(bufs *b, const tu_case *c, const mg_cuda_exec *x, mg_form f, mg_dtype dt,
                      double *const in[TU_N_IN]) {
  memset(b, 0, sizeof *b);
  const int P = g_size, r = g_rank;
  for (int k = 0; k < TU_N_IN; k++) {
    int64_t B, S, w;
    tu_in_dims(c, k, &B, &S, &w);
    const int64_t Sl = k == TU_W ? S : S / P;
    b->in[k] = malloc((size_t)(B * Sl * w) * sizeof(e16));
    assert_non_null(b->in[k]);
    for (int64_t bi = 0; bi < B; bi++)
      for (int64_t s = 0; s < Sl; s++)
        for (int64_t i = 0; i < w; i++)
          b->in[k][(bi * Sl + s) * w + i] = f32_to_e16(
              dt, (float)in[k][(bi * S + (k == TU_W ? s : mg_form_token_pos(f, P, Sl, r, s))) * w + i]);
  }
  for (int k = 0; k < TU_N_OUT; k++) {
    if (k == TU_LSE) continue;
    const int64_t n = k == TU_DW ? tu_out_numel(c, k) : tu_out_numel(c, k) / P;
    const size_t bytes = (size_t)n * (k == TU_DW ? 4 : 2);
    b->out[k] = malloc(bytes);
    assert_non_null(b->out[k]);
    memset(b->out[k], 0xff, bytes); /* NaN in bf16 and f32 */
  }
  b->ws_b = (size_t)mg_cuda_exec_workspace_bytes(x);
  b->sv_b = (size_t)mg_cuda_exec_saved_bytes(x);
  b->ws = aligned(b->ws_b);
  b->saved = aligned(b->sv_b);
  memset(b->ws, 0xff, b->ws_b);
  memset(b->saved, 0xff, b->sv_b);
  b->t = (mg_cuda_tensors){.q = b->in[TU_Q], .c_kv = b->in[TU_CKV], .k_rope = b->in[TU_KROPE],
                           .w_kv_b = b->in[TU_W], .d_o = b->in[TU_DO], .o = b->out[TU_O],
                           .dq = b->out[TU_DQ], .dc_kv = b->out[TU_DCKV],
                           .dk_rope = b->out[TU_DKROPE], .dw_kv_b = b->out[TU_DW]};
}

static void bufs_free(bufs *b) {
  for (int k = 0; k < TU_N_IN; k++) free(b->in[k]);
  for (int k = 0; k < TU_N_OUT; k++) free(b->out[k]);
  free(b->ws), free(b->saved);
  memset(b, 0, sizeof *b);
}

/* Form f's plan of dtype dt for case c (causal as c) on this rank of g_size (heap-allocated;
 * dies on error). */
static mg_plan *build_plan_v(const tu_case *c, mg_form f, mg_dtype dt, int varlen) {
  mg_diag d = MG_DIAG_INIT;
  mg_plan *plan = calloc(1, sizeof *plan);
  assert_non_null(plan);
  mg_plan_args a = {.shape = &c->shape, .form = f, .sp = g_size, .rank = g_rank, .batch = c->B,
                    .seq = c->S, .causal = c->causal, .dtype = dt, .varlen = varlen};
  if (mg_plan_build(plan, &a, &d)) die("plan", &d);
  return plan;
}

static mg_plan *build_plan(const tu_case *c, mg_form f, mg_dtype dt) {
  return build_plan_v(c, f, dt, 0);
}

/* The global token of element i of this rank's output k under form f (case c, B = 1:
 * packed sequences), -1 for dw_kv_b (no token). */
static int64_t local_token(const tu_case *c, int k, mg_form f, int64_t i) {
  const int P = g_size, r = g_rank;
  const int64_t S = c->S, Sl = S / P;
  if (k == TU_DW) return -1;
  if (k == TU_LSE) /* [1, H/P, S], laga-cp [1, H, S/P] */
    return f == MG_FORM_LAGA_CP ? mg_cp_pos(P, Sl, r, i % Sl) : i % S;
  const int64_t w = tu_out_numel(c, k) / S;
  return mg_form_token_pos(f, P, Sl, r, i / w);
}

/* Form f's plan of dtype dt (bf16 or f16) on case c at P = np: returns the number of failed
 * checks (the same on every rank). s: packed sequences (a varlen plan, c = tv_case(.., s,
 * ..)) against the float64 per-document reference (tv_reference), slack rows exactly 0
 * (lse -inf); NULL: the unpacked plan against the single-rank CPU executor. */
static int check_form_v(const tu_case *c, mg_form f, mg_dtype dt, double *const in[TU_N_IN],
                        const tv_stream *s) {
  mg_diag d = MG_DIAG_INIT;
  tu_run r1;
  double *ref[TU_N_OUT] = {0};
  if (s) {
    if (tv_reference(c, s->cu, s->n_cu, in, ref)) die("reference", &d);
  } else {
    if (tu_run_form(c, f, 1, 0, NULL, MG_F32, in, &r1, &d) || tu_outputs(c, &r1, ref))
      die("reference", &d);
    tu_run_free(&r1);
  }

  mg_plan *plan = build_plan_v(c, f, dt, s != NULL);
  double t0 = now();
  mg_cuda_exec *x = prepare_all(plan, 0);
  const double t_prep = now() - t0;
  bufs b;
  bufs_make(&b, c, x, f, dt, in);
  if (s) b.t.cu_seqlens = s->cu, b.t.n_cu = s->n_cu;
  t0 = now();
  const long l0 = g_ops->launches;
  if (mg_cuda_exec_run(x, MG_FWD, &b.t, b.ws, b.ws_b, b.saved, b.sv_b, g_comm, NULL, &d))
    die("forward", &d);
  memset(b.ws, 0xff, b.ws_b);
  if (mg_cuda_exec_run(x, MG_BWD, &b.t, b.ws, b.ws_b, b.saved, b.sv_b, g_comm, NULL, &d))
    die("backward", &d);
  const double t_run = now() - t0;
  const float *lse = mg_cuda_exec_buffer(x, "lse", b.ws, b.saved);
  assert_non_null(lse);

  int bad = 0;
  double e[TU_N_OUT];
  for (int k = 0; k < TU_N_OUT; k++) {
    const int64_t n = tu_local_numel(c, k, f, g_size);
    double *local = malloc((size_t)n * sizeof *local), *want = malloc((size_t)n * sizeof *want);
    assert_true(local && want);
    for (int64_t i = 0; i < n; i++)
      local[i] = k == TU_LSE ? lse[i]
                 : k == TU_DW ? ((const float *)b.out[k])[i]
                              : e16_to_f32(dt, ((const e16 *)b.out[k])[i]);
    if (k == TU_DW) /* each rank holds its heads' rows: the gradient is the sum */
      MPI_Allreduce(MPI_IN_PLACE, local, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    tu_ref_local(c, k, f, ref[k], g_size, g_rank, want);
    char what[512];
    snprintf(what, sizeof what, "%s%s %s %s P %d rank %d: %s", s ? "varlen " : "", mg_form_name(f),
             mg_dtype_name(dt), c->causal ? "causal" : "non-causal", g_size, g_rank, tu_out_names[k]);
    cc_result cr = tu_check(what, local, want, n, tu_rms(ref[k], tu_out_numel(c, k)),
                            s ? tv_tol_bf16[k] : tu_tol_16(dt)[k], tu_out_cols(c, k));
    int ok = cc_ok(&cr), all_ok;
    for (int64_t i = 0; s && i < n; i++) { /* slack rows: exactly 0, lse -inf */
      const int64_t tok = local_token(c, k, f, i);
      if (tok >= s->T && !(k == TU_LSE ? local[i] == -INFINITY : local[i] == 0)) {
        fprintf(stderr, "%s: slack token %lld holds %g\n", what, (long long)tok, local[i]);
        ok = 0;
        break;
      }
    }
    e[k] = cr.min_atol;
    MPI_Allreduce(MPI_IN_PLACE, &e[k], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (e[k] > g_worst[k]) g_worst[k] = e[k];
    bad += !all_ok;
    free(local), free(want);
  }
  print_message("  %-8s %s P %d %-10s needed atol o %.1e lse %.1e dq %.1e dc_kv %.1e dk_rope %.1e dw_kv_b %.1e  "
                "(%d kernels, %ld launches; prepare %.1f s, run %.2f s)\n",
                mg_form_name(f), mg_dtype_name(dt), g_size, c->causal ? "causal" : "non-causal", e[TU_O], e[TU_LSE],
                e[TU_DQ], e[TU_DCKV], e[TU_DKROPE], e[TU_DW], mg_cuda_exec_kernel_count(x),
                g_ops->launches - l0, t_prep, t_run);
  mg_cuda_exec_destroy(x);
  bufs_free(&b);
  free(plan);
  tu_free(ref, TU_N_OUT);
  mg_diag_clear(&d);
  return bad;
}

static int check_form(const tu_case *c, mg_form f, mg_dtype dt, double *const in[TU_N_IN]) {
  return check_form_v(c, f, dt, in, NULL);
}

static tu_case small_case(int causal) {
  tu_case c = {.shape = tu_shape(4, 64, 32, 64, 256), .B = 2, .S = 16, .causal = causal};
  return c;
}

static void inputs(const tu_case *c, uint64_t seed, mg_dtype dt, double *in[TU_N_IN]) {
  assert_int_equal(tu_inputs(c, seed, in), 0);
  round_inputs(c, dt, in); /* 16-bit values, so both runs see the same inputs */
}

static void test_forms_match_single_rank(void **state) {
  (void)state;
  int bad = 0;
  for (int causal = 1; causal >= (g_size > 2); causal--) { /* non-causal: at P = 2 */
    tu_case c = small_case(causal);
    double *in[TU_N_IN] = {0};
    inputs(&c, g_seed + (uint64_t)causal, MG_BF16, in);
    for (int f = 0; f < MG_FORM_COUNT; f++) bad += check_form(&c, (mg_form)f, MG_BF16, in);
    tu_free(in, TU_N_IN);
  }
  print_message("  %d kernels built, %ld launches, %ld GEMMs, %ld copies on rank %d\n",
                g_ops->builds, g_ops->launches, g_ops->gemms, g_ops->copies, g_rank);
  assert_int_equal(bad, 0);
}

/* f16 plans at P = np: the head-sharded LAGA (f16 all-to-all, the MPI backend's f16
 * reduce-scatter summed in f32) and the absorbed form, causal, at tu_tol_f16. */
static void test_f16(void **state) {
  (void)state;
  tu_case c = small_case(1);
  double *in[TU_N_IN] = {0};
  inputs(&c, g_seed + 11, MG_F16, in);
  int bad = check_form(&c, MG_FORM_LAGA, MG_F16, in) + check_form(&c, MG_FORM_ABSORBED, MG_F16, in);
  tu_free(in, TU_N_IN);
  assert_int_equal(bad, 0);
}

/* Packed sequences at P = np: every form's varlen plan (bf16, causal; at P = 2 non-causal too) over documents of
 * lengths 17, 1, 0, 2, 200, 3, 64 in a capacity of 304 tokens (the 200 one spans the rank
 * boundaries of P = 2 and 4 and laga-cp's chunks), NaN in every slack row of q, c_kv,
 * k_rope and do, every rank given the same global cu_seqlens; each rank's shard against
 * the float64 per-document reference (tests/varlen_test_util.h), slack rows exact. */
static void test_varlen(void **state) {
  (void)state;
  const tv_stream st = tv_rank_docs();
  const mg_shape sh = small_case(1).shape;
  int bad = 0;
  for (int causal = 1; causal >= (g_size > 2); causal--) { /* non-causal: at P = 2 */
    const tu_case c = tv_case(&sh, &st, causal);
    double *in[TU_N_IN] = {0};
    assert_int_equal(tv_inputs(&c, st.T, g_seed + 13 + (uint64_t)causal, in), 0);
    round_inputs(&c, MG_BF16, in); /* NaN stays NaN */
    for (int f = 0; f < MG_FORM_COUNT; f++) bad += check_form_v(&c, (mg_form)f, MG_BF16, in, &st);
    tu_free(in, TU_N_IN);
  }
  assert_int_equal(bad, 0);
}

/* ---- the wait: a communicator with a poll ---------------------------------------------- */

typedef struct poll_comm {
  mg_comm base;
  mg_comm *inner; /* the collectives */
  int polls;
  int fail_at; /* > 0: the poll fails from this call on */
} poll_comm;

static mg_comm *inner(mg_comm *c) { return ((poll_comm *)c)->inner; }
static int pc_a2a(mg_comm *c, const void *s, void *r, size_t n, mg_dtype t, mg_diag *d) {
  return inner(c)->ops->all_to_all(inner(c), s, r, n, t, d);
}
static int pc_ag(mg_comm *c, const void *s, void *r, size_t n, mg_dtype t, mg_diag *d) {
  return inner(c)->ops->all_gather(inner(c), s, r, n, t, d);
}
static int pc_rs(mg_comm *c, const void *s, void *r, size_t n, mg_dtype t, mg_diag *d) {
  return inner(c)->ops->reduce_scatter(inner(c), s, r, n, t, d);
}
static int pc_gs(mg_comm *c, mg_diag *d) { return inner(c)->ops->group_start(inner(c), d); }
static int pc_ge(mg_comm *c, mg_diag *d) { return inner(c)->ops->group_end(inner(c), d); }
static void pc_destroy(mg_comm *c) { (void)c; }
static int pc_poll(mg_comm *c, mg_diag *d) {
  poll_comm *w = (poll_comm *)c;
  w->polls++;
  if (w->fail_at > 0 && w->polls >= w->fail_at)
    return mg_diag_set(d, MLAGEN_EIO, "NCCL asynchronous error (test): remote process exited");
  return 0;
}
static const mg_comm_ops pc_ops = {pc_a2a, pc_ag, pc_rs, pc_gs, pc_ge, pc_destroy, pc_poll};

static void test_wait_polls(void **state) {
  (void)state;
  /* P >= 2 only (not registered at 1): P = 1 queues and returns, no wait */
  mg_diag d = MG_DIAG_INIT;
  tu_case c = small_case(1);
  double *in[TU_N_IN] = {0};
  inputs(&c, g_seed + 7, MG_BF16, in);
  mg_plan *plan = build_plan(&c, MG_FORM_LAGA, MG_BF16);
  poll_comm pc = {.base = {.ops = &pc_ops, .rank = g_comm->rank, .size = g_comm->size},
                  .inner = g_comm};
  mg_cuda_exec *x = prepare_all(plan, 0);
  bufs b;
  bufs_make(&b, &c, x, MG_FORM_LAGA, MG_BF16, in);

  /* busy for 5 queries: 5 polls, then done */
  g_ops->busy = 5;
  g_ops->queries = 0;
  int rc1 = mg_cuda_exec_run(x, MG_FWD, &b.t, b.ws, b.ws_b, b.saved, b.sv_b, &pc.base, NULL, &d);
  if (rc1) print_error("busy stream: %s\n", mg_diag_msg(&d));
  const long q1 = g_ops->queries;
  const int p1 = pc.polls;

  /* a poll error while busy comes back, prefixed with the pass */
  g_ops->busy = 1000000;
  pc.polls = 0;
  pc.fail_at = 3;
  int rc2 = mg_cuda_exec_run(x, MG_BWD, &b.t, b.ws, b.ws_b, b.saved, b.sv_b, &pc.base, NULL, &d);
  char msg2[600];
  snprintf(msg2, sizeof msg2, "%s", mg_diag_msg(&d));
  const int p2 = pc.polls;
  g_ops->busy = 0;
  mg_cuda_exec_destroy(x);

  /* a pass that never finishes: timed out */
  x = prepare_all(plan, 0.05);
  g_ops->never_done = 1;
  pc.fail_at = 0;
  double t0 = now();
  int rc3 = mg_cuda_exec_run(x, MG_FWD, &b.t, b.ws, b.ws_b, b.saved, b.sv_b, &pc.base, NULL, &d);
  const double waited = now() - t0;
  char msg3[600];
  snprintf(msg3, sizeof msg3, "%s", mg_diag_msg(&d));
  g_ops->never_done = 0;
  mg_cuda_exec_destroy(x);
  bufs_free(&b);
  free(plan);
  tu_free(in, TU_N_IN);
  mg_diag_clear(&d);
  print_message("  busy: %ld queries, %d polls; poll error after %d polls: %s\n"
                "  never done (%.2f s): %s\n", q1, p1, p2, msg2, waited, msg3);
  assert_int_equal(rc1, 0);
  assert_int_equal(q1, 6);
  assert_int_equal(p1, 5);
  assert_int_equal(rc2, MLAGEN_EIO);
  assert_int_equal(p2, 3);
  assert_non_null(strstr(msg2, "remote process exited"));
  assert_non_null(strstr(msg2, "backward"));
  assert_int_equal(rc3, MLAGEN_EIO);
  assert_non_null(strstr(msg3, "timed out after 0.05 s"));
  assert_true(waited >= 0.05 && waited < 5);
}

static int report_worst(void **state) {
  (void)state;
  char label[64];
  snprintf(label, sizeof label, "(rms units) at P = %d", g_size);
  if (g_rank == 0) tu_print_worst(label, g_worst);
  return teardown(state);
}

/* laga-cp's forward on the CUDA executor at P = np: the all-gather and the chunk-order
 * copies (MG_OP_CHUNK_ORDER as 2P strided copies) leave the saved latent c [B, S, d_c + d_r]
 * in global order, equal bit for bit to the global [c_kv ; k_rope] (bf16, copies only; S / P = 5:
 * chunks of 3 and 2),
 * from each rank's two-chunk shard (its outputs: test_forms_match_single_rank). */
static void test_laga_cp_latent_order(void **state) {
  (void)state;
  mg_diag d = MG_DIAG_INIT;
  tu_case c = {.shape = tu_shape(4, 64, 32, 64, 256), .B = 2, .S = 5 * (int64_t)g_size, .causal = 1};
  double *in[TU_N_IN] = {0};
  inputs(&c, g_seed + 11, MG_BF16, in);
  mg_plan *plan = build_plan(&c, MG_FORM_LAGA_CP, MG_BF16);
  mg_cuda_exec *x = prepare_all(plan, 0);
  bufs b;
  bufs_make(&b, &c, x, MG_FORM_LAGA_CP, MG_BF16, in);
  if (mg_cuda_exec_run(x, MG_FWD, &b.t, b.ws, b.ws_b, b.saved, b.sv_b, g_comm, NULL, &d))
    die("forward", &d);
  const e16 *lat = mg_cuda_exec_buffer(x, "c", b.ws, b.saved);
  assert_non_null(lat);
  const int64_t dc = c.shape.kv_lora_rank, dr = c.shape.qk_rope_head_dim, wc = dc + dr;
  int64_t wrong = 0;
  for (int64_t bi = 0; bi < c.B; bi++)
    for (int64_t s = 0; s < c.S; s++)
      for (int64_t j = 0; j < wc; j++) {
        const double want = j < dc ? in[TU_CKV][(bi * c.S + s) * dc + j]
                                   : in[TU_KROPE][(bi * c.S + s) * dr + j - dc];
        wrong += f32_to_e16(MG_BF16, (float)want) != lat[(bi * c.S + s) * wc + j];
      }
  int64_t all_wrong = 0;
  MPI_Allreduce(&wrong, &all_wrong, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  if (g_rank == 0) print_message("  laga-cp P %d: gathered latent in global order, %lld of %lld "
                                 "values wrong (worst rank)\n", g_size, (long long)all_wrong,
                                 (long long)(c.B * c.S * wc));
  mg_cuda_exec_destroy(x);
  bufs_free(&b);
  free(plan);
  tu_free(in, TU_N_IN);
  assert_int_equal(all_wrong, 0);
}

int main(int argc, char **argv) {
  mpi_test_begin(&argc, &argv, "test_cuda_exec_mpi", &g_rank, &g_size, &g_seed);
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_forms_match_single_rank),
                                     cmocka_unit_test(test_laga_cp_latent_order),
                                     cmocka_unit_test(test_varlen),
                                     cmocka_unit_test(test_f16)};
  const struct CMUnitTest multi[] = {cmocka_unit_test(test_wait_polls)};
  /* test_f16 (last) at P = 2 only: the f16 collectives' code is the same at every P > 1 */
  const size_t n = sizeof tests / sizeof tests[0] - (g_size > 2);
  int failed = mpi_test_group_multi("test_cuda_exec_mpi", tests, n, multi,
                                    sizeof multi / sizeof multi[0], setup, report_worst);
  return mpi_test_end("test_cuda_exec_mpi", failed);
}
