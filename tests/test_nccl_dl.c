/* test_nccl_dl.c: the NCCL backend as libmlagen.so has it (runtime/comm/mg_comm_nccl.c built
 * with MLAGEN_NCCL_DLOPEN: libnccl.so.2 or $MLAGEN_LIBNCCL loaded with dlopen at the first
 * wrap), against the fake NCCL of tests/fake_nccl.c, and the API's sp_size > 1 path
 * (runtime/api/mlagen_api.c) with the fake driver of tests/fake_cuda.c (issue 7).
 *
 * Modes, one per process (NCCL is loaded once per process), by the first argument:
 *   fake     MLAGEN_LIBNCCL = the fake: wrap gives ncclCommCount's size and
 *            ncclCommUserRank's rank; the collectives move host memory (a 1-rank
 *            communicator: NCCL's results exactly); a failed NCCL call is MLAGEN_EIO with
 *            ncclGetErrorString's text (group end still called after a failed send);
 *            poll returns the async error; the CUDA executor at P = 2 on no-op device ops
 *            whose stream never finishes returns the async error as MLAGEN_EIO instead of
 *            waiting on, or times out; mlagen_forward of an sp_size 2 plan refuses a
 *            communicator of another size or rank (MLAGEN_EINVAL naming both), propagates
 *            a failed ncclCommUserRank, and with a matching one gets past NCCL to cuBLAS
 *            (MLAGEN_EDRIVER here: MLAGEN_LIBCUBLAS names nothing).
 *   missing  MLAGEN_LIBNCCL names a missing file: MLAGEN_ENONCCL "... not found: <dlerror>"
 *            from the backend and from mlagen_forward, every time.
 *   nosym    MLAGEN_LIBNCCL = the fake CUDA driver (no NCCL symbols): MLAGEN_ENONCCL
 *            "... lacks ncclGroupStart". */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fake_driver.h"
#include "mg_comm.h"
#include "mg_cuda_exec.h"
#include "mg_plan.h"
#include "mlagen.h"
#include "test_assert.h"

#ifndef MLAGEN_FAKE_NCCL
#error "MLAGEN_FAKE_NCCL (the fake NCCL's path) must be defined"
#endif

/* ---- the fake's knobs --------------------------------------------------------------- */

static void *g_fake;
static void *(*comm_create)(int, int);
static void (*comm_free)(void *);
static void (*fail_call)(const char *);
static void (*async_after)(void *, int);
static int (*polls)(const void *);
static int (*group_depth)(void);

static void *sym(const char *name) {
  void *p = dlsym(g_fake, name);
  if (!p) fail_msg("fake NCCL lacks %s", name);
  return p;
}

static int setup_fake(void **state) {
  (void)state;
  g_fake = dlopen(MLAGEN_FAKE_NCCL, RTLD_NOW | RTLD_LOCAL); /* the handle the loader gets */
  if (!g_fake) return -1;
  *(void **)&comm_create = sym("fake_nccl_comm_create");
  *(void **)&comm_free = sym("fake_nccl_comm_free");
  *(void **)&fail_call = sym("fake_nccl_fail");
  *(void **)&async_after = sym("fake_nccl_async_after");
  *(void **)&polls = sym("fake_nccl_polls");
  *(void **)&group_depth = sym("fake_nccl_group_depth");
  return 0;
}

static int teardown_fake(void **state) {
  (void)state;
  if (g_fake) dlclose(g_fake);
  return 0;
}

/* ---- the backend -------------------------------------------------------------------- */

static void test_wrap_and_collectives(void **state) {
  (void)state;
  mg_diag d = MG_DIAG_INIT;
  mg_comm *c = (mg_comm *)1;
  assert_int_equal(mg_comm_nccl_wrap(&c, NULL, NULL, &d), MLAGEN_EINVAL);
  assert_null(c);
  assert_contains(mg_diag_msg(&d), "nccl_comm is NULL");
  void *fc = comm_create(4, 3);
  assert_int_equal(mg_comm_nccl_wrap(&c, fc, NULL, &d), 0);
  assert_int_equal(c->size, 4);
  assert_int_equal(c->rank, 3);
  assert_non_null(c->ops->poll);
  mg_comm_destroy(c);
  comm_free(fc);

  /* one rank: NCCL's results */
  fc = comm_create(1, 0);
  assert_int_equal(mg_comm_nccl_wrap(&c, fc, NULL, &d), 0);
  uint16_t send[8] = {1, 2, 3, 4, 5, 6, 7, 8}, recv[8] = {0};
  assert_int_equal(c->ops->all_to_all(c, send, recv, 8, MG_BF16, &d), 0);
  assert_memory_equal(recv, send, sizeof send);
  assert_int_equal(group_depth(), 0);
  memset(recv, 0, sizeof recv);
  assert_int_equal(c->ops->all_gather(c, send, recv, 8, MG_F16, &d), 0);
  assert_memory_equal(recv, send, sizeof send);
  memset(recv, 0, sizeof recv);
  assert_int_equal(c->ops->reduce_scatter(c, send, recv, 4, MG_F32, &d), 0);
  assert_memory_equal(recv, send, 4 * sizeof(float));
  assert_int_equal(c->ops->group_start(c, &d), 0);
  assert_int_equal(group_depth(), 1);
  assert_int_equal(c->ops->group_end(c, &d), 0);
  assert_int_equal(group_depth(), 0);
  assert_int_equal(c->ops->poll(c, &d), 0);
  mg_comm_destroy(c);
  comm_free(fc);
  mg_diag_clear(&d);
}

/* A failed NCCL call: MLAGEN_EIO with NCCL's text. */
static void test_failed_calls(void **state) {
  (void)state;
  mg_diag d = MG_DIAG_INIT;
  void *fc = comm_create(2, 0);
  mg_comm *c = NULL;
  fail_call("ncclCommCount");
  assert_int_equal(mg_comm_nccl_wrap(&c, fc, NULL, &d), MLAGEN_EIO);
  assert_null(c);
  assert_contains(mg_diag_msg(&d), "NCCL ncclCommCount failed: invalid argument (run with "
                                   "NCCL_DEBUG=WARN for details) (ncclResult_t 4)");
  fail_call("ncclCommUserRank");
  assert_int_equal(mg_comm_nccl_wrap(&c, fc, NULL, &d), MLAGEN_EIO);
  assert_contains(mg_diag_msg(&d), "NCCL ncclCommUserRank failed: invalid argument");
  fail_call(NULL);
  assert_int_equal(mg_comm_nccl_wrap(&c, fc, NULL, &d), 0);
  uint16_t buf[16] = {0}, out[32];
  const char *const calls[] = {"ncclAllGather", "ncclReduceScatter", "ncclSend", "ncclRecv",
                               "ncclGroupStart", "ncclGroupEnd"};
  const char *const words[] = {"NCCL all-gather failed: invalid argument",
                               "NCCL reduce-scatter failed: invalid argument",
                               "NCCL send failed: invalid argument",
                               "NCCL recv failed: invalid argument",
                               "NCCL group start failed: invalid argument",
                               "NCCL group end failed: invalid argument"};
  for (int k = 0; k < 6; k++) {
    fail_call(calls[k]);
    int rc = k == 0   ? c->ops->all_gather(c, buf, out, 4, MG_BF16, &d)
             : k == 1 ? c->ops->reduce_scatter(c, buf, out, 4, MG_BF16, &d)
                      : c->ops->all_to_all(c, buf, out, 4, MG_BF16, &d);
    assert_int_equal(rc, MLAGEN_EIO);
    assert_contains(mg_diag_msg(&d), words[k]);
    assert_int_equal(group_depth(), 0); /* a started group is always ended */
  }
  fail_call(NULL);
  mg_comm_destroy(c);
  comm_free(fc);
  mg_diag_clear(&d);
}

static void test_poll_async_error(void **state) {
  (void)state;
  mg_diag d = MG_DIAG_INIT;
  void *fc = comm_create(2, 1);
  mg_comm *c = NULL;
  assert_int_equal(mg_comm_nccl_wrap(&c, fc, NULL, &d), 0);
  async_after(fc, 3);
  assert_int_equal(c->ops->poll(c, &d), 0);
  assert_int_equal(c->ops->poll(c, &d), 0);
  assert_int_equal(c->ops->poll(c, &d), MLAGEN_EIO);
  assert_contains(mg_diag_msg(&d), "NCCL asynchronous error (ncclCommGetAsyncError) failed: "
                                   "remote process exited or there was a network error");
  fail_call("ncclCommGetAsyncError");
  assert_int_equal(c->ops->poll(c, &d), MLAGEN_EIO);
  assert_contains(mg_diag_msg(&d), "NCCL ncclCommGetAsyncError failed: invalid argument");
  fail_call(NULL);
  mg_comm_destroy(c);
  comm_free(fc);
  mg_diag_clear(&d);
}

/* ---- the executor's wait on no-op device ops ------------------------------------------ */

static int n_load(mg_dev_ops *o, const mg_kernel *k, const struct mg_launch_rule *rule,
                  void **handle, mg_diag *d) {
  (void)o, (void)k, (void)rule, (void)d;
  *handle = (void *)1;
  return 0;
}
static int n_launch(mg_dev_ops *o, void *h, const unsigned g[3], const unsigned b[3], size_t smem,
                    void **params, void *stream, mg_diag *d) {
  (void)o, (void)h, (void)g, (void)b, (void)smem, (void)params, (void)stream, (void)d;
  return 0;
}
static int n_memset(mg_dev_ops *o, void *dst, int v, size_t n, void *stream, mg_diag *d) {
  (void)o, (void)stream, (void)d;
  memset(dst, v, n);
  return 0;
}
static int n_copy(mg_dev_ops *o, void *dst, const void *src, size_t n, void *stream, mg_diag *d) {
  (void)o, (void)stream, (void)d;
  memcpy(dst, src, n);
  return 0;
}
static int n_copy2d(mg_dev_ops *o, void *dst, size_t dp, const void *src, size_t sp, size_t w,
                    size_t h, void *stream, mg_diag *d) {
  (void)o, (void)stream, (void)d;
  for (size_t r = 0; r < h; r++) memcpy((char *)dst + r * dp, (const char *)src + r * sp, w);
  return 0;
}
static int n_gemm(mg_dev_ops *o, const mg_gemm *g, mg_dtype ta, const void *A, mg_dtype tb,
                  const void *B, mg_dtype tc, void *C, void *stream, mg_diag *d) {
  (void)o, (void)g, (void)ta, (void)A, (void)tb, (void)B, (void)tc, (void)C, (void)stream, (void)d;
  return 0;
}
static long g_queries;
static int n_query(mg_dev_ops *o, void *stream, int *done, mg_diag *d) {
  (void)o, (void)stream, (void)d;
  g_queries++;
  *done = 0; /* the pass never finishes: a peer that is gone */
  return 0;
}
static void n_destroy(mg_dev_ops *o) { (void)o; }

static void test_exec_wait_returns_async_error(void **state) {
  (void)state;
  mg_diag d = MG_DIAG_INIT;
  mg_dev_ops ops = {.name = "null", .load = n_load, .launch = n_launch, .memset = n_memset,
                    .copy = n_copy, .copy2d = n_copy2d, .gemm = n_gemm, .query = n_query,
                    .destroy = n_destroy};
  mg_shape sh;
  memset(&sh, 0, sizeof sh);
  snprintf(sh.source, sizeof sh.source, "test");
  sh.heads = 4, sh.qk_nope_head_dim = 64, sh.qk_rope_head_dim = 32, sh.v_head_dim = 64;
  sh.kv_lora_rank = 256, sh.rope_factor = 1, sh.mscale = 1, sh.softmax_scale = 1 / sqrt(96.0);
  mg_plan *plan = calloc(1, sizeof *plan);
  assert_non_null(plan);
  mg_plan_args a = {.shape = &sh, .form = MG_FORM_LAGA, .sp = 2, .rank = 0, .batch = 1, .seq = 8,
                    .causal = 1, .dtype = MG_BF16};
  assert_int_equal(mg_plan_build(plan, &a, &d), 0);
  mg_cuda_exec_opts eo = {.timeout_s = 5};
  mg_cuda_exec *x = NULL;
  if (mg_cuda_exec_prepare(plan, &ops, &eo, &x, &d)) fail_msg("prepare: %s", mg_diag_msg(&d));
  const size_t ws_b = (size_t)mg_cuda_exec_workspace_bytes(x), sv_b = (size_t)mg_cuda_exec_saved_bytes(x);
  void *ws = calloc(1, ws_b + 16), *saved = calloc(1, sv_b + 16);
  void *big = calloc(1, 1 << 20); /* every caller tensor (small shapes): zeros */
  assert_true(ws && saved && big);
  mg_cuda_tensors t = {big, big, big, big, big, big, big, big, big, big, NULL, 0};
  void *fc = comm_create(2, 0);
  mg_comm *c = NULL;
  assert_int_equal(mg_comm_nccl_wrap(&c, fc, NULL, &d), 0);

  async_after(fc, 4); /* the 4th poll sees the peer gone */
  g_queries = 0;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int rc = mg_cuda_exec_run(x, MG_FWD, &t, ws, ws_b, saved, sv_b, c, NULL, &d);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  const double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  print_message("  async error after %ld queries, %.3f s: %s\n", g_queries, s, mg_diag_msg(&d));
  assert_int_equal(rc, MLAGEN_EIO);
  assert_contains(mg_diag_msg(&d), "laga plan, forward: the communicator: NCCL asynchronous "
                                   "error (ncclCommGetAsyncError) failed: remote process exited");
  assert_int_equal(polls(fc), 4);
  assert_true(s < 2);
  mg_cuda_exec_destroy(x);

  /* no async error: the timeout */
  eo.timeout_s = 0.05;
  if (mg_cuda_exec_prepare(plan, &ops, &eo, &x, &d)) fail_msg("prepare: %s", mg_diag_msg(&d));
  async_after(fc, 0);
  rc = mg_cuda_exec_run(x, MG_BWD, &t, ws, ws_b, saved, sv_b, c, NULL, &d);
  assert_int_equal(rc, MLAGEN_EIO);
  assert_contains(mg_diag_msg(&d), "laga plan, backward: timed out after 0.05 s");
  assert_true(polls(fc) > 0);

  /* no wait (mg_cuda_exec_set_timeout < 0): returns once queued, nothing queried or polled */
  mg_cuda_exec_set_timeout(x, -1);
  async_after(fc, 1);
  const int polled = polls(fc);
  g_queries = 0;
  rc = mg_cuda_exec_run(x, MG_BWD, &t, ws, ws_b, saved, sv_b, c, NULL, &d);
  if (rc) fail_msg("no wait: %s", mg_diag_msg(&d));
  assert_int_equal(g_queries, 0);
  assert_int_equal(polls(fc), polled);
  mg_cuda_exec_set_timeout(x, 0.05);
  async_after(fc, 0);

  /* a failed collective names the step */
  fail_call("ncclAllGather");
  rc = mg_cuda_exec_run(x, MG_FWD, &t, ws, ws_b, saved, sv_b, c, NULL, &d);
  fail_call(NULL);
  assert_int_equal(rc, MLAGEN_EIO);
  assert_contains(mg_diag_msg(&d), "laga plan step 2 (all-gather c_local -> c)");
  assert_contains(mg_diag_msg(&d), "NCCL all-gather failed: invalid argument");
  mg_cuda_exec_destroy(x);
  mg_comm_destroy(c);
  comm_free(fc);
  free(ws), free(saved), free(big), free(plan);
  mg_diag_clear(&d);
}

/* ---- the API ----------------------------------------------------------------------------- */

typedef struct api_fx {
  mlagen_context *ctx;
  mlagen_model *model;
  mlagen_plan *plan;
  mlagen_tensors t;
  void *bufs[8];
  int nb;
  void *ws, *saved;
  mlagen_sizes z;
} api_fx;

static void *al(size_t n) {
  void *p = aligned_alloc(256, (n + 255) / 256 * 256 + 256);
  assert_non_null(p);
  return p;
}

/* An sp_size 2, sp_rank 1 laga plan with every forward tensor. */
static void api_open(api_fx *f) {
  memset(f, 0, sizeof *f);
  assert_int_equal(mlagen_context_create(&f->ctx), 0);
  mlagen_model_desc md = {.num_attention_heads = 2, .kv_lora_rank = 256, .qk_rope_head_dim = 32,
                          .qk_nope_head_dim = 64, .v_head_dim = 64};
  assert_int_equal(mlagen_model_from_desc(f->ctx, &md, &f->model), 0);
  mlagen_plan_desc pd = {.form = MLAGEN_FORM_LAGA, .batch = 1, .seq = 8, .sp_rank = 1,
                         .sp_size = 2, .causal = 1, .dtype = MLAGEN_DTYPE_BF16};
  assert_int_equal(mlagen_plan_create(f->ctx, f->model, &pd, &f->plan), 0);
  assert_int_equal(mlagen_plan_sizes(f->plan, &f->z), 0);
  const mlagen_tensor_info *infos[] = {&f->z.q, &f->z.c_kv, &f->z.k_rope, &f->z.w_kv_b, &f->z.o};
  mlagen_tensor *ts[] = {&f->t.q, &f->t.c_kv, &f->t.k_rope, &f->t.w_kv_b, &f->t.o};
  for (int k = 0; k < 5; k++) {
    ts[k]->data = f->bufs[f->nb++] = al(infos[k]->bytes);
    ts[k]->dtype = infos[k]->dtype;
    ts[k]->ndim = infos[k]->ndim;
    memcpy(ts[k]->dims, infos[k]->dims, sizeof ts[k]->dims);
  }
  f->ws = f->bufs[f->nb++] = al(f->z.workspace_bytes);
  f->saved = f->bufs[f->nb++] = al(f->z.saved_bytes);
}

static int api_fwd(api_fx *f) {
  return mlagen_forward(f->plan, &f->t, f->ws, f->z.workspace_bytes, f->saved, f->z.saved_bytes,
                        NULL);
}

static void api_close(api_fx *f) {
  for (int k = 0; k < f->nb; k++) free(f->bufs[k]);
  mlagen_plan_destroy(f->plan);
  mlagen_model_destroy(f->model);
  mlagen_context_destroy(f->ctx);
}

static void test_api_sp2(void **state) {
  (void)state;
  api_fx f;
  api_open(&f);
  void *other_rank = comm_create(2, 0), *other_size = comm_create(4, 1), *right = comm_create(2, 1);
  assert_int_equal(mlagen_plan_set_comm(f.plan, other_rank), 0);
  assert_int_equal(api_fwd(&f), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(f.ctx), "mlagen_forward: the NCCL communicator "
                  "(mlagen_plan_set_comm) has 2 ranks and this process is its rank 0; the plan "
                  "is for sp_rank = 1 of sp_size = 2");
  assert_int_equal(mlagen_plan_set_comm(f.plan, other_size), 0);
  assert_int_equal(api_fwd(&f), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(f.ctx), "has 4 ranks");
  assert_int_equal(mlagen_plan_set_comm(f.plan, right), 0);
  fail_call("ncclCommUserRank");
  assert_int_equal(api_fwd(&f), MLAGEN_EIO);
  assert_contains(mlagen_last_message(f.ctx), "mlagen_forward: sp_size = 2: the NCCL communicator: "
                  "NCCL ncclCommUserRank failed: invalid argument");
  fail_call(NULL);
  /* the right communicator: past NCCL, to the device ops (no cuBLAS here) */
  int rc = api_fwd(&f);
  print_message("  matching communicator: %s: %s\n", mlagen_status_name(rc),
                mlagen_last_message(f.ctx));
  assert_int_equal(rc, MLAGEN_EDRIVER);
  assert_contains(mlagen_last_message(f.ctx), "cuBLAS");
  api_close(&f);
  comm_free(other_rank), comm_free(other_size), comm_free(right);
}

/* mlagen_plan_set_comm_wait: its arguments; then what it decides, through the API with the
 * fake cuBLAS (the forward runs) and the stream not finished at the first query: waiting
 * (30 s), the first poll of the communicator sees NCCL's asynchronous error (MLAGEN_EIO);
 * not waiting (0), the call returns once queued, nothing polled; waiting 1e-9 s, the pass
 * times out after that time (the seconds reach the executor). */
static void test_api_comm_wait(void **state) {
  (void)state;
  api_fx f;
  api_open(&f);
  assert_int_equal(mlagen_plan_set_comm_wait(NULL, 1), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(NULL), "mlagen_plan_set_comm_wait: plan is NULL");
  const double bad[] = {-1, NAN, INFINITY, 2e6};
  for (int i = 0; i < 4; i++) {
    assert_int_equal(mlagen_plan_set_comm_wait(f.plan, bad[i]), MLAGEN_EINVAL);
    assert_contains(mlagen_last_message(f.ctx), "give 0 (do not wait) or a time in seconds up to 1e6");
  }
  fake_cuda fk;
  if (fake_driver_open(&fk)) fail_msg("the fake driver's hooks");
  setenv("MLAGEN_LIBCUBLAS", MLAGEN_FAKE_CUDA, 1); /* the fake is a fake cuBLAS too */
  void *fc = comm_create(2, 1);
  assert_int_equal(mlagen_plan_set_comm(f.plan, fc), 0);
  async_after(fc, 1); /* the first poll sees the peer gone */

  assert_int_equal(mlagen_plan_set_comm_wait(f.plan, 0), 0);
  fk.inject("cuStreamQuery", 600); /* CUDA_ERROR_NOT_READY (cuda.h) */
  int rc = api_fwd(&f);
  if (rc) fail_msg("no wait: %s: %s", mlagen_status_name(rc), mlagen_last_message(f.ctx));
  assert_int_equal(polls(fc), 0);

  assert_int_equal(mlagen_plan_set_comm_wait(f.plan, 30), 0); /* the injection still pending */
  rc = api_fwd(&f);
  print_message("  waiting: %s: %s\n", mlagen_status_name(rc), mlagen_last_message(f.ctx));
  assert_int_equal(rc, MLAGEN_EIO);
  assert_contains(mlagen_last_message(f.ctx), "NCCL asynchronous error (ncclCommGetAsyncError) "
                                              "failed: remote process exited");
  assert_int_equal(polls(fc), 1);
  /* the time itself reaches the pass: a wait shorter than the first query's answer */
  async_after(fc, 0);
  assert_int_equal(mlagen_plan_set_comm_wait(f.plan, 1e-9), 0);
  fk.inject("cuStreamQuery", 600);
  rc = api_fwd(&f);
  assert_int_equal(rc, MLAGEN_EIO);
  assert_contains(mlagen_last_message(f.ctx), "laga plan, forward: timed out after 1e-09 s");
  fk.reset();
  setenv("MLAGEN_LIBCUBLAS", "/nonexistent/libcublas.so", 1);
  api_close(&f);
  comm_free(fc);
}

/* ---- NCCL missing, or not NCCL ------------------------------------------------------ */

static void test_missing(void **state) {
  (void)state;
  const char *want = state && *state ? (const char *)*state : "";
  mg_diag d = MG_DIAG_INIT;
  mg_comm *c = (mg_comm *)1;
  int dummy = 0;
  for (int k = 0; k < 2; k++) { /* the outcome is kept: the same the second time */
    assert_int_equal(mg_comm_nccl_wrap(&c, &dummy, NULL, &d), MLAGEN_ENONCCL);
    assert_null(c);
    print_message("  %s\n", mg_diag_msg(&d));
    assert_contains(mg_diag_msg(&d), want);
  }
  mg_diag_clear(&d);
  api_fx f;
  api_open(&f);
  assert_int_equal(mlagen_plan_set_comm(f.plan, &dummy), 0);
  assert_int_equal(api_fwd(&f), MLAGEN_ENONCCL);
  assert_contains(mlagen_last_message(f.ctx), "mlagen_forward: sp_size = 2: the NCCL communicator: ");
  assert_contains(mlagen_last_message(f.ctx), want);
  api_close(&f);
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "fake";
  fake_driver_use(MLAGEN_FAKE_CUDA);
  setenv("MLAGEN_LIBCUBLAS", "/nonexistent/libcublas.so", 1);
  if (!strcmp(mode, "missing")) {
    setenv("MLAGEN_LIBNCCL", "/nonexistent/libnccl.so.2", 1);
    static char want[] = "/nonexistent/libnccl.so.2 not found: ";
    const struct CMUnitTest tests[] = {cmocka_unit_test_prestate(test_missing, want)};
    return cmocka_run_group_tests_name("nccl (missing)", tests, NULL, NULL);
  }
  if (!strcmp(mode, "nosym")) {
    setenv("MLAGEN_LIBNCCL", MLAGEN_FAKE_CUDA, 1);
    static char want[] = "lacks ncclGroupStart";
    const struct CMUnitTest tests[] = {cmocka_unit_test_prestate(test_missing, want)};
    return cmocka_run_group_tests_name("nccl (not NCCL)", tests, NULL, NULL);
  }
  setenv("MLAGEN_LIBNCCL", MLAGEN_FAKE_NCCL, 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_wrap_and_collectives),
      cmocka_unit_test(test_failed_calls),
      cmocka_unit_test(test_poll_async_error),
      cmocka_unit_test(test_exec_wait_returns_async_error),
      cmocka_unit_test(test_api_sp2),
      cmocka_unit_test(test_api_comm_wait),
  };
  return cmocka_run_group_tests_name("nccl (fake)", tests, setup_fake, teardown_fake);
}
