/* test_api_cpu.c: the C API's CPU device (MLAGEN_DEVICE_CPU) and the trainer's collectives
 * as callbacks (mlagen_plan_set_comm_ops), without a driver.
 *   - every form, f32 and f64, causal or not: mlagen_forward then mlagen_backward in the
 *     caller's memory (workspace filled with garbage before each pass, saved kept between)
 *     equal the CPU executor's whole run (mg_cpu_run, its own allocator) bit for bit;
 *     sizes: the static layout without the 32 MiB cuBLAS slice;
 *   - a P = 2 plan: without callbacks MLAGEN_EINVAL; a callback that fails gives MLAGEN_EIO
 *     naming the callback, its return value and the plan step; set_comm_ops's refusals;
 *   - a callback that calls back into the API for its own plan: set_comm_ops, set_comm and
 *     forward are refused (MLAGEN_EINVAL), destroy is deferred to the pass's return
 *     (test_api_cpu_valgrind runs this under valgrind: no use-after-free, no leak);
 *   - P = 2 with callbacks that work (two threads exchanging through shared memory): every
 *     form, f64, causal or not: each rank's o, dq, dc_kv, dk_rope equal its shard of the
 *     P = 1 run and the ranks' dw_kv_b sum to its dw_kv_b, per element within 1e-14
 *     relative;
 *   - plan_create's refusals for the CPU device (bf16, an unknown device);
 *   - packed sequences (mlagen_plan_desc.varlen, THD tensors, mlagen_tensors.cu_seqlens):
 *     every form, f64, causal or not, documents of lengths 5, 0, 12, 1, 11 in 32 token
 *     rows with NaN in the 3 slack rows of every input: each document's rows of o, dq,
 *     dc_kv, dk_rope equal an unpacked run of that document alone (a plan of batch 1, seq
 *     its length), per element within 3e-15 of max|ref| (measured 1.4e-15; a boundary
 *     moved by one is off by 1e-3), slack rows exactly 0, dw_kv_b the sum of the
 *     documents'; bad cu_seqlens refused naming the index with no byte of the
 *     outputs, saved or workspace written; P = 2 over the callbacks with a document across
 *     the ranks equals the packed P = 1 run.
 * The numerics against an independent reference and P = 2, 4 over real collectives are
 * tests/python/ (gloo). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_test_util.h"
#include "mg_cpu_exec.h"
#include "mg_plan.h"
#include "mlagen.h"

/* The six forms (public and internal enums, names), laga-cp last: the P = 2 Ulysses tests
 * take the first five. */
static const mlagen_form k_forms[6] = {MLAGEN_FORM_EXPLICIT, MLAGEN_FORM_ABSORBED,
                                       MLAGEN_FORM_LAGA,     MLAGEN_FORM_LAGA_R,
                                       MLAGEN_FORM_LAGA_F,   MLAGEN_FORM_LAGA_CP};
static const mg_form k_mforms[6] = {MG_FORM_EXPLICIT, MG_FORM_ABSORBED, MG_FORM_LAGA,
                                    MG_FORM_LAGA_R,   MG_FORM_LAGA_F,   MG_FORM_LAGA_CP};
static const char *const k_form_names[6] = {"explicit", "absorbed", "laga",
                                            "laga-r",   "laga-f",   "laga-cp"};

static mlagen_model *make_model(mlagen_context *ctx, const mg_shape *s) {
  mlagen_model_desc md = {.num_attention_heads = s->heads, .kv_lora_rank = s->kv_lora_rank,
                          .qk_rope_head_dim = s->qk_rope_head_dim,
                          .qk_nope_head_dim = s->qk_nope_head_dim, .v_head_dim = s->v_head_dim,
                          .softmax_scale = s->softmax_scale};
  mlagen_model *m = NULL;
  assert_int_equal(mlagen_model_from_desc(ctx, &md, &m), 0);
  return m;
}

static void *filled(size_t bytes, mlagen_dtype t, uint64_t stream, double spread) {
  void *p = aligned_alloc(64, bytes + 64);
  size_t n = bytes / (t == MLAGEN_DTYPE_F64 ? 8 : 4);
  for (size_t i = 0; i < n; i++) {
    double v = spread * tu_normal(7, stream, i);
    if (t == MLAGEN_DTYPE_F64) ((double *)p)[i] = v;
    else ((float *)p)[i] = (float)v;
  }
  return p;
}

static mlagen_tensor tensor_of(void *data, const mlagen_tensor_info *i) {
  mlagen_tensor t = {.data = data, .dtype = i->dtype, .ndim = i->ndim};
  memcpy(t.dims, i->dims, sizeof t.dims);
  return t;
}

static void one_case(mlagen_context *ctx, const mg_shape *s, mlagen_form form, mg_form mform,
                     mlagen_dtype dt, int causal) {
  const int B = 2;
  const int64_t S = 16;
  mlagen_model *m = make_model(ctx, s);
  mlagen_plan_desc pd = {.form = form, .batch = B, .seq = S, .sp_size = 1, .causal = causal,
                         .dtype = dt, .device = MLAGEN_DEVICE_CPU};
  mlagen_plan *plan = NULL;
  int rc = mlagen_plan_create(ctx, m, &pd, &plan);
  if (rc) fail_msg("plan_create: %s", mlagen_last_message(ctx));
  mlagen_sizes z;
  assert_int_equal(mlagen_plan_sizes(plan, &z), 0);
  assert_true(z.workspace_bytes < ((size_t)32 << 20)); /* no cuBLAS slice on the host */
  assert_true(z.saved_bytes > 0);

  /* inputs (scores of std ~2: q and k_rope 1.5, w scaled by 1/sqrt(d_c)) */
  const double wspread = 1.5 / sqrt((double)s->kv_lora_rank);
  void *q = filled(z.q.bytes, dt, 1, 1.5), *ckv = filled(z.c_kv.bytes, dt, 2, 1.0),
       *kr = filled(z.k_rope.bytes, dt, 3, 1.5), *w = filled(z.w_kv_b.bytes, dt, 4, wspread),
       *dO = filled(z.d_o.bytes, dt, 5, 1.0);
  mlagen_tensors t = {.q = tensor_of(q, &z.q), .c_kv = tensor_of(ckv, &z.c_kv),
                      .k_rope = tensor_of(kr, &z.k_rope), .w_kv_b = tensor_of(w, &z.w_kv_b),
                      .d_o = tensor_of(dO, &z.d_o)};
  const mlagen_tensor_info *outs[] = {&z.o, &z.dq, &z.dc_kv, &z.dk_rope, &z.dw_kv_b};
  mlagen_tensor *slots[] = {&t.o, &t.dq, &t.dc_kv, &t.dk_rope, &t.dw_kv_b};
  for (int k = 0; k < 5; k++) { /* garbage in the outputs: the passes must overwrite it */
    void *p = aligned_alloc(64, outs[k]->bytes + 64);
    memset(p, 0xA5, outs[k]->bytes);
    *slots[k] = tensor_of(p, outs[k]);
  }
  size_t wsb = z.workspace_bytes ? z.workspace_bytes : 16;
  unsigned char *ws = aligned_alloc(256, wsb), *saved = aligned_alloc(256, z.saved_bytes);
  memset(ws, 0xFF, wsb); /* NaN patterns: nothing may be read before written */
  rc = mlagen_forward(plan, &t, ws, z.workspace_bytes, saved, z.saved_bytes, NULL);
  if (rc) fail_msg("forward: %s", mlagen_last_message(ctx));
  memset(ws, 0xFF, wsb); /* the workspace need not survive between passes */
  rc = mlagen_backward(plan, &t, ws, z.workspace_bytes, saved, z.saved_bytes, NULL);
  if (rc) fail_msg("backward: %s", mlagen_last_message(ctx));

  /* the executor's whole run on the same plan arguments */
  static mg_plan p;
  mg_diag d = MG_DIAG_INIT;
  mg_plan_args a = {.shape = s, .form = mform, .sp = 1, .batch = B, .seq = S, .causal = causal,
                    .dtype = dt == MLAGEN_DTYPE_F64 ? MG_F64 : MG_F32};
  assert_int_equal(mg_plan_build(&p, &a, &d), 0);
  mg_cpu_tensors ref = {.q = q, .c_kv = ckv, .k_rope = kr, .w_kv_b = w, .d_o = dO};
  if (mg_cpu_run(&p, NULL, &ref, NULL, &d)) fail_msg("mg_cpu_run: %s", mg_diag_msg(&d));
  void *want[] = {ref.o, ref.dq, ref.dc_kv, ref.dk_rope, ref.dw_kv_b};
  for (int k = 0; k < 5; k++)
    if (memcmp(slots[k]->data, want[k], outs[k]->bytes))
      fail_msg("%s %s %s causal %d: %s differs from mg_cpu_run's", mg_form_name(mform),
               dt == MLAGEN_DTYPE_F64 ? "f64" : "f32", s->source, causal, outs[k]->name);
  mg_cpu_tensors_free(&ref);
  for (int k = 0; k < 5; k++) free(slots[k]->data);
  free(q), free(ckv), free(kr), free(w), free(dO), free(ws), free(saved);
  mlagen_plan_destroy(plan);
  mlagen_model_destroy(m);
}

static void test_cpu_passes_equal_executor(void **state) {
  (void)state;
  mlagen_context *ctx = NULL;
  assert_int_equal(mlagen_context_create(&ctx), 0);
  const mg_shape s = tu_shape(4, 16, 16, 16, 32);
  for (int f = 0; f < 6; f++)
    for (int causal = 0; causal < 2; causal++) {
      one_case(ctx, &s, k_forms[f], k_mforms[f], MLAGEN_DTYPE_F64, causal);
      one_case(ctx, &s, k_forms[f], k_mforms[f], MLAGEN_DTYPE_F32, causal);
    }
  mlagen_context_destroy(ctx);
}

/* A collective that fails, and counts its calls. */
static int failing(void *user, const void *send, void *recv, size_t count, mlagen_dtype dtype,
                   void *stream) {
  (void)send, (void)recv, (void)count, (void)dtype, (void)stream;
  ++*(int *)user;
  return -3;
}

static void expect_msg(mlagen_context *ctx, int rc, int want, const char *says) {
  assert_int_equal(rc, want);
  if (!strstr(mlagen_last_message(ctx), says))
    fail_msg("message '%s' lacks '%s'", mlagen_last_message(ctx), says);
}

/* A CPU LAGA plan (f64, causal, B = 1, S = 8, sp_size = 2 at rank `rank`) with its tensors,
 * workspace and saved buffers; inputs zero (`fill` = 0) or random (`fill` = 1). */
typedef struct sp_fixture {
  mlagen_context *ctx;
  mlagen_model *m;
  mlagen_plan *plan;
  mlagen_sizes z;
  void *in[4], *o, *ws, *saved;
  mlagen_tensors t;
} sp_fixture;

static void sp_fixture_init(sp_fixture *f, int rank, int fill) {
  f->ctx = NULL;
  assert_int_equal(mlagen_context_create(&f->ctx), 0);
  const mg_shape s = tu_shape(4, 16, 16, 16, 32);
  f->m = make_model(f->ctx, &s);
  mlagen_plan_desc pd = {.form = MLAGEN_FORM_LAGA, .batch = 1, .seq = 8, .sp_size = 2,
                         .sp_rank = rank, .causal = 1, .dtype = MLAGEN_DTYPE_F64,
                         .device = MLAGEN_DEVICE_CPU};
  f->plan = NULL;
  assert_int_equal(mlagen_plan_create(f->ctx, f->m, &pd, &f->plan), 0);
  mlagen_sizes *z = &f->z;
  assert_int_equal(mlagen_plan_sizes(f->plan, z), 0);
  const mlagen_tensor_info *in[] = {&z->q, &z->c_kv, &z->k_rope, &z->w_kv_b};
  const double spread[] = {1.5, 1.0, 1.5, 0.25};
  for (int k = 0; k < 4; k++)
    f->in[k] = fill ? filled(in[k]->bytes, MLAGEN_DTYPE_F64, (uint64_t)k + 1, spread[k])
                    : calloc(1, in[k]->bytes);
  f->o = calloc(1, z->o.bytes);
  f->ws = aligned_alloc(256, z->workspace_bytes + 256);
  f->saved = aligned_alloc(256, z->saved_bytes + 256);
  f->t = (mlagen_tensors){.q = tensor_of(f->in[0], &z->q), .c_kv = tensor_of(f->in[1], &z->c_kv),
                          .k_rope = tensor_of(f->in[2], &z->k_rope),
                          .w_kv_b = tensor_of(f->in[3], &z->w_kv_b), .o = tensor_of(f->o, &z->o)};
}

/* Frees the buffers, the model and the context; the plan too unless it is already gone. */
static void sp_fixture_free(sp_fixture *f, int destroy_plan) {
  for (int k = 0; k < 4; k++) free(f->in[k]);
  free(f->o), free(f->ws), free(f->saved);
  if (destroy_plan) mlagen_plan_destroy(f->plan);
  mlagen_model_destroy(f->m);
  mlagen_context_destroy(f->ctx);
}

static void test_comm_ops(void **state) {
  (void)state;
  sp_fixture f;
  sp_fixture_init(&f, 1, 0);
  mlagen_context *ctx = f.ctx;
  mlagen_plan *plan = f.plan;
  const mlagen_sizes z = f.z;
  void *ws = f.ws, *saved = f.saved;
  const mlagen_tensors t = f.t;
  int rc = mlagen_forward(plan, &t, ws, z.workspace_bytes, saved, z.saved_bytes, NULL);
  expect_msg(ctx, rc, MLAGEN_EINVAL, "mlagen_plan_set_comm_ops");

  int calls = 0;
  mlagen_comm_ops ops = {.size = 2, .rank = 0, .user = &calls, .all_to_all = failing,
                         .all_gather = failing, .reduce_scatter = failing};
  expect_msg(ctx, mlagen_plan_set_comm_ops(plan, &ops), MLAGEN_EINVAL,
             "comm_ops has size = 2 and rank = 0; the plan is for sp_rank = 1");
  ops.rank = 1;
  ops.all_gather = NULL;
  expect_msg(ctx, mlagen_plan_set_comm_ops(plan, &ops), MLAGEN_EINVAL, "all_gather is NULL");
  ops.all_gather = failing;
  assert_int_equal(mlagen_plan_set_comm_ops(plan, &ops), 0);
  rc = mlagen_forward(plan, &t, ws, z.workspace_bytes, saved, z.saved_bytes, NULL);
  expect_msg(ctx, rc, MLAGEN_EIO, "the caller's all_to_all callback returned -3 (rank 1 of 2");
  expect_msg(ctx, rc, MLAGEN_EIO, "laga plan step 0 (all-to-all q");
  assert_int_equal(calls, 1); /* the pass stopped at the first failure */
  assert_int_equal(mlagen_plan_set_comm_ops(plan, NULL), 0); /* cleared */
  rc = mlagen_forward(plan, &t, ws, z.workspace_bytes, saved, z.saved_bytes, NULL);
  expect_msg(ctx, rc, MLAGEN_EINVAL, "mlagen_plan_set_comm_ops");
  assert_int_equal(mlagen_plan_set_comm_ops(NULL, &ops), MLAGEN_EINVAL);
  sp_fixture_free(&f, 1);
}

/* ---- a callback that calls back into the API for its own plan ---------------------------- */

typedef struct reentry {
  mlagen_plan *plan;
  mlagen_context *ctx;
  const mlagen_tensors *t;
  void *ws, *saved;
  size_t ws_bytes, saved_bytes;
  int destroy; /* 1: the callback destroys the plan, 2: its context; 0: it tries the
                * refused calls */
  int go_on;   /* 1: after a refused call, the collective as if the other rank held the same
                * data (P = 2 in one thread), returning 0: the pass succeeds */
  int rc_ops, rc_comm, rc_fwd, rc_wait;
  char msg_ops[512], msg_wait[512];
} reentry;

static int reentrant(void *user, const void *send, void *recv, size_t count,
                     mlagen_dtype dtype, void *stream) {
  (void)send, (void)recv, (void)count, (void)dtype, (void)stream;
  reentry *r = user;
  if (r->destroy == 2) { /* the plan's context: freed when the pass returns */
    mlagen_context_destroy(r->ctx);
    return -5;
  }
  if (r->destroy) {
    mlagen_plan_destroy(r->plan);
    return -5;
  }
  if (r->go_on) { /* f64; count is elements per rank (mlagen_comm_ops) */
    r->rc_wait = mlagen_plan_set_comm_wait(r->plan, 5);
    const size_t n = count * sizeof(double);
    memcpy(recv, send, r->go_on == 1 ? 2 * n : n); /* 1: all_to_all, 2: all_gather, 3: reduce_scatter */
    if (r->go_on == 2) memcpy((char *)recv + n, send, n);
    return 0;
  }
  r->rc_ops = mlagen_plan_set_comm_ops(r->plan, NULL);
  snprintf(r->msg_ops, sizeof r->msg_ops, "%s", mlagen_last_message(r->ctx));
  static int fake_nccl;
  r->rc_comm = mlagen_plan_set_comm(r->plan, &fake_nccl);
  r->rc_fwd = mlagen_forward(r->plan, r->t, r->ws, r->ws_bytes, r->saved, r->saved_bytes, NULL);
  r->rc_wait = mlagen_plan_set_comm_wait(r->plan, 5);
  snprintf(r->msg_wait, sizeof r->msg_wait, "%s", mlagen_last_message(r->ctx));
  return -5; /* stop the pass */
}

/* go_on's collectives, as if the other rank held this rank's data (every recv byte
 * written: test_api_cpu_valgrind reads no uninitialized memory). */
static int reentrant_a2a(void *user, const void *send, void *recv, size_t count,
                         mlagen_dtype dtype, void *stream) {
  ((reentry *)user)->go_on = 1;
  return reentrant(user, send, recv, count, dtype, stream);
}
static int reentrant_gather(void *user, const void *send, void *recv, size_t count,
                            mlagen_dtype dtype, void *stream) {
  ((reentry *)user)->go_on = 2;
  return reentrant(user, send, recv, count, dtype, stream);
}
static int reentrant_rs(void *user, const void *send, void *recv, size_t count,
                        mlagen_dtype dtype, void *stream) {
  ((reentry *)user)->go_on = 3;
  return reentrant(user, send, recv, count, dtype, stream);
}

static void test_comm_reentry(void **state) {
  (void)state;
  sp_fixture f;
  sp_fixture_init(&f, 0, 1);
  mlagen_context *ctx = f.ctx;
  mlagen_plan *plan = f.plan;
  const mlagen_sizes z = f.z;
  void *ws = f.ws, *saved = f.saved;
  const mlagen_tensors t = f.t;
  reentry r = {.plan = plan, .ctx = ctx, .t = &t, .ws = ws, .saved = saved,
               .ws_bytes = z.workspace_bytes, .saved_bytes = z.saved_bytes};
  mlagen_comm_ops ops = {.size = 2, .rank = 0, .user = &r, .all_to_all = reentrant,
                         .all_gather = reentrant, .reduce_scatter = reentrant};
  assert_int_equal(mlagen_plan_set_comm_ops(plan, &ops), 0);
  int rc = mlagen_forward(plan, &t, ws, z.workspace_bytes, saved, z.saved_bytes, NULL);
  expect_msg(ctx, rc, MLAGEN_EIO, "callback returned -5 (rank 0 of 2");
  assert_int_equal(r.rc_ops, MLAGEN_EINVAL);
  if (!strstr(r.msg_ops, "mlagen_plan_set_comm_ops: the plan is running a pass"))
    fail_msg("set_comm_ops from a callback: message '%s'", r.msg_ops);
  assert_int_equal(r.rc_comm, MLAGEN_EINVAL);
  assert_int_equal(r.rc_fwd, MLAGEN_EINVAL);
  assert_int_equal(r.rc_wait, MLAGEN_EINVAL);
  if (!strstr(r.msg_wait, "mlagen_plan_set_comm_wait: the plan is running a pass"))
    fail_msg("set_comm_wait from a callback: message '%s'", r.msg_wait);
  assert_int_equal(mlagen_plan_set_comm_wait(plan, 5), 0); /* outside a pass: allowed */
  /* the plan still works after the pass: the callbacks are still set, so the same again */
  rc = mlagen_forward(plan, &t, ws, z.workspace_bytes, saved, z.saved_bytes, NULL);
  expect_msg(ctx, rc, MLAGEN_EIO, "callback returned -5");
  assert_int_equal(mlagen_plan_set_comm_ops(plan, NULL), 0); /* outside a pass: allowed */
  assert_int_equal(mlagen_plan_set_comm_ops(plan, &ops), 0);
  /* a refused call inside a pass that then succeeds: the pass's MLAGEN_OK leaves no message
   * (mlagen.h: "" after a call that succeeded), the callback having seen the refusal */
  r.go_on = 1;
  ops.all_to_all = reentrant_a2a, ops.all_gather = reentrant_gather, ops.reduce_scatter = reentrant_rs;
  assert_int_equal(mlagen_plan_set_comm_ops(plan, &ops), 0);
  r.rc_wait = 0;
  rc = mlagen_forward(plan, &t, ws, z.workspace_bytes, saved, z.saved_bytes, NULL);
  if (rc) fail_msg("forward with a refused nested call: %s", mlagen_last_message(ctx));
  assert_int_equal(r.rc_wait, MLAGEN_EINVAL);
  assert_string_equal(mlagen_last_message(ctx), "");
  r.go_on = 0;
  ops.all_to_all = ops.reduce_scatter = ops.all_gather = reentrant;
  assert_int_equal(mlagen_plan_set_comm_ops(plan, &ops), 0);
  /* destroy from a callback: deferred to the end of the pass (valgrind: no leak, no UAF) */
  r.destroy = 1;
  rc = mlagen_forward(plan, &t, ws, z.workspace_bytes, saved, z.saved_bytes, NULL);
  expect_msg(ctx, rc, MLAGEN_EIO, "callback returned -5");
  sp_fixture_free(&f, 0); /* the callback destroyed the plan */

  /* the context destroyed from a callback: the pass still returns its status (the context
   * freed then: valgrind sees no use after free), the plan refuses every call but destroy */
  sp_fixture_init(&f, 0, 1);
  reentry r2 = {.plan = f.plan, .ctx = f.ctx, .t = &f.t, .destroy = 2};
  ops.user = &r2;
  assert_int_equal(mlagen_plan_set_comm_ops(f.plan, &ops), 0);
  rc = mlagen_forward(f.plan, &f.t, f.ws, f.z.workspace_bytes, f.saved, f.z.saved_bytes, NULL);
  assert_int_equal(rc, MLAGEN_EIO);
  rc = mlagen_forward(f.plan, &f.t, f.ws, f.z.workspace_bytes, f.saved, f.z.saved_bytes, NULL);
  assert_int_equal(rc, MLAGEN_EINVAL);
  if (!strstr(mlagen_last_message(NULL), "its context was destroyed"))
    fail_msg("forward after the context's destroy: '%s'", mlagen_last_message(NULL));
  mlagen_plan_destroy(f.plan);
  mlagen_model_destroy(f.m);
  for (int k = 0; k < 4; k++) free(f.in[k]);
  free(f.o), free(f.ws), free(f.saved);
}

/* ---- P = 2 over working callbacks, in one process ---------------------------------------- */

/* Two ranks on two threads: each callback publishes its send buffer, waits for the other,
 * reads what it needs, and waits again before either may reuse its buffer. */
typedef struct xchg {
  pthread_barrier_t bar;
  const void *send[2];
} xchg;

typedef struct rank_run {
  xchg *x;
  int rank;
  mlagen_plan *plan;
  mlagen_context *ctx;
  mlagen_tensors t;
  void *ws, *saved;
  mlagen_sizes z;
  int rc;
  char msg[512];
} rank_run;

static size_t dtype_bytes(mlagen_dtype t) { return t == MLAGEN_DTYPE_F64 ? 8 : 4; }

enum { A2A, GATHER, RSCATTER };

static int exchange(int kind, void *user, const void *send, void *recv, size_t count,
                    mlagen_dtype dtype) {
  rank_run *u = user;
  const size_t es = dtype_bytes(dtype), blk = count * es;
  u->x->send[u->rank] = send;
  pthread_barrier_wait(&u->x->bar);
  for (int p = 0; p < 2; p++) {
    const char *src = u->x->send[p];
    if (kind == A2A) memcpy((char *)recv + p * blk, src + u->rank * blk, blk);
    if (kind == GATHER) memcpy((char *)recv + p * blk, src, blk);
  }
  if (kind == RSCATTER)
    for (size_t i = 0; i < count; i++) { /* rank order, in the type */
      if (dtype == MLAGEN_DTYPE_F64) {
        double acc = 0;
        for (int p = 0; p < 2; p++) acc += ((const double *)u->x->send[p])[u->rank * count + i];
        ((double *)recv)[i] = acc;
      } else {
        float acc = 0;
        for (int p = 0; p < 2; p++) acc += ((const float *)u->x->send[p])[u->rank * count + i];
        ((float *)recv)[i] = acc;
      }
    }
  pthread_barrier_wait(&u->x->bar);
  return 0;
}

static int x_a2a(void *user, const void *send, void *recv, size_t count, mlagen_dtype dtype,
                 void *stream) {
  (void)stream;
  return exchange(A2A, user, send, recv, count, dtype);
}
static int x_gather(void *user, const void *send, void *recv, size_t count, mlagen_dtype dtype,
                    void *stream) {
  (void)stream;
  return exchange(GATHER, user, send, recv, count, dtype);
}
static int x_rscatter(void *user, const void *send, void *recv, size_t count,
                      mlagen_dtype dtype, void *stream) {
  (void)stream;
  return exchange(RSCATTER, user, send, recv, count, dtype);
}

static void *rank_main(void *arg) {
  rank_run *r = arg;
  r->rc = mlagen_forward(r->plan, &r->t, r->ws, r->z.workspace_bytes, r->saved,
                         r->z.saved_bytes, NULL);
  if (!r->rc)
    r->rc = mlagen_backward(r->plan, &r->t, r->ws, r->z.workspace_bytes, r->saved,
                            r->z.saved_bytes, NULL);
  if (r->rc) snprintf(r->msg, sizeof r->msg, "%s", mlagen_last_message(r->ctx));
  /* a failed rank leaves its peer at a barrier: the test fails (times out) either way */
  return NULL;
}

/* Rank `rank`'s sequence shard of a [B, S, ...] tensor of `bytes` bytes (P = 2). */
static void *shard(const void *g, size_t bytes, int B, int64_t S, int rank) {
  const size_t row = bytes / ((size_t)B * (size_t)S), half = row * (size_t)(S / 2);
  char *p = aligned_alloc(64, bytes / 2 + 64);
  for (int b = 0; b < B; b++)
    memcpy(p + b * half, (const char *)g + (size_t)b * row * (size_t)S + rank * half, half);
  return p;
}

/* |got - want| <= 1e-14 (|want| + max|want|) per element (measured: below 8e-16 of
 * max|want|); returns the worst error over max|want|. */
static double close_f64(const double *got, const double *want, size_t n, const char *what) {
  double scale = 0, worst = 0;
  for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
  for (size_t i = 0; i < n; i++) {
    const double e = fabs(got[i] - want[i]);
    if (!(e <= 1e-14 * (fabs(want[i]) + scale)))
      fail_msg("%s[%zu] = %.17g, P = 1 gives %.17g", what, i, got[i], want[i]);
    worst = fmax(worst, e / scale);
  }
  return worst;
}

/* Packed P = 2 runs (varlen = 1): one stream of 16 token rows, documents [0, 3), [3, 3),
 * [3, 13) (across the ranks' boundary at 8), 3 slack rows holding NaN in every input. */
static const int32_t p2_cu[] = {0, 3, 3, 13};

/* NaN in rows [from, S) of each [S, w] input that has token rows (q, c_kv, k_rope, do). */
static void nan_slack(void *const in[5], const mlagen_sizes *z, int64_t S, int64_t from) {
  const mlagen_tensor_info *info[] = {&z->q, &z->c_kv, &z->k_rope, NULL, &z->d_o};
  for (int k = 0; k < 5; k++) {
    if (!info[k]) continue;
    const size_t row = info[k]->bytes / 8 / (size_t)S;
    for (size_t i = (size_t)from * row; i < (size_t)S * row; i++) ((double *)in[k])[i] = NAN;
  }
}

static void p2_case(const mg_shape *s, mlagen_form form, const char *name, int causal, int varlen) {
  const int B = varlen ? 1 : 2;
  const int64_t S = 16;
  const mlagen_dtype dt = MLAGEN_DTYPE_F64;
  mlagen_context *ctx = NULL;
  assert_int_equal(mlagen_context_create(&ctx), 0);
  mlagen_model *m = make_model(ctx, s);
  /* P = 1: the global problem */
  mlagen_plan_desc pd = {.form = form, .batch = B, .seq = S, .sp_size = 1, .causal = causal,
                         .dtype = dt, .device = MLAGEN_DEVICE_CPU, .varlen = varlen};
  mlagen_plan *g = NULL;
  if (mlagen_plan_create(ctx, m, &pd, &g)) fail_msg("plan_create: %s", mlagen_last_message(ctx));
  mlagen_sizes z;
  assert_int_equal(mlagen_plan_sizes(g, &z), 0);
  const double wspread = 1.5 / sqrt((double)s->kv_lora_rank);
  void *in[5] = {filled(z.q.bytes, dt, 1, 1.5), filled(z.c_kv.bytes, dt, 2, 1.0),
                 filled(z.k_rope.bytes, dt, 3, 1.5), filled(z.w_kv_b.bytes, dt, 4, wspread),
                 filled(z.d_o.bytes, dt, 5, 1.0)};
  if (varlen) nan_slack(in, &z, S, p2_cu[3]);
  const mlagen_tensor_info *outs[] = {&z.o, &z.dq, &z.dc_kv, &z.dk_rope, &z.dw_kv_b};
  void *gout[5];
  for (int k = 0; k < 5; k++) gout[k] = aligned_alloc(64, outs[k]->bytes + 64);
  mlagen_tensors t = {.q = tensor_of(in[0], &z.q), .c_kv = tensor_of(in[1], &z.c_kv),
                      .k_rope = tensor_of(in[2], &z.k_rope), .w_kv_b = tensor_of(in[3], &z.w_kv_b),
                      .d_o = tensor_of(in[4], &z.d_o), .o = tensor_of(gout[0], &z.o),
                      .dq = tensor_of(gout[1], &z.dq), .dc_kv = tensor_of(gout[2], &z.dc_kv),
                      .dk_rope = tensor_of(gout[3], &z.dk_rope),
                      .dw_kv_b = tensor_of(gout[4], &z.dw_kv_b),
                      .cu_seqlens = varlen ? p2_cu : NULL, .n_cu_seqlens = varlen ? 4 : 0};
  void *ws = aligned_alloc(256, z.workspace_bytes + 256),
       *saved = aligned_alloc(256, z.saved_bytes + 256);
  if (mlagen_forward(g, &t, ws, z.workspace_bytes, saved, z.saved_bytes, NULL) ||
      mlagen_backward(g, &t, ws, z.workspace_bytes, saved, z.saved_bytes, NULL))
    fail_msg("P = 1: %s", mlagen_last_message(ctx));
  free(ws), free(saved);

  /* P = 2: two plans, two contexts, two threads */
  xchg x;
  assert_int_equal(pthread_barrier_init(&x.bar, NULL, 2), 0);
  rank_run rr[2];
  for (int r = 0; r < 2; r++) {
    rank_run *u = &rr[r];
    memset(u, 0, sizeof *u);
    u->x = &x, u->rank = r;
    assert_int_equal(mlagen_context_create(&u->ctx), 0);
    pd.sp_size = 2, pd.sp_rank = r;
    if (mlagen_plan_create(u->ctx, m, &pd, &u->plan))
      fail_msg("plan_create P = 2: %s", mlagen_last_message(u->ctx));
    assert_int_equal(mlagen_plan_sizes(u->plan, &u->z), 0);
    mlagen_comm_ops ops = {.size = 2, .rank = r, .user = u, .all_to_all = x_a2a,
                           .all_gather = x_gather, .reduce_scatter = x_rscatter};
    assert_int_equal(mlagen_plan_set_comm_ops(u->plan, &ops), 0);
    mlagen_sizes *lz = &u->z;
    u->t = (mlagen_tensors){
        .q = tensor_of(shard(in[0], z.q.bytes, B, S, r), &lz->q),
        .c_kv = tensor_of(shard(in[1], z.c_kv.bytes, B, S, r), &lz->c_kv),
        .k_rope = tensor_of(shard(in[2], z.k_rope.bytes, B, S, r), &lz->k_rope),
        .w_kv_b = tensor_of(in[3], &lz->w_kv_b),
        .d_o = tensor_of(shard(in[4], z.d_o.bytes, B, S, r), &lz->d_o),
        .cu_seqlens = varlen ? p2_cu : NULL, .n_cu_seqlens = varlen ? 4 : 0};
    mlagen_tensor *slots[] = {&u->t.o, &u->t.dq, &u->t.dc_kv, &u->t.dk_rope, &u->t.dw_kv_b};
    const mlagen_tensor_info *lo[] = {&lz->o, &lz->dq, &lz->dc_kv, &lz->dk_rope, &lz->dw_kv_b};
    for (int k = 0; k < 5; k++) {
      void *p = aligned_alloc(64, lo[k]->bytes + 64);
      memset(p, 0xA5, lo[k]->bytes);
      *slots[k] = tensor_of(p, lo[k]);
    }
    u->ws = aligned_alloc(256, u->z.workspace_bytes + 256);
    u->saved = aligned_alloc(256, u->z.saved_bytes + 256);
  }
  pthread_t th[2];
  for (int r = 0; r < 2; r++) assert_int_equal(pthread_create(&th[r], NULL, rank_main, &rr[r]), 0);
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < 2; r++)
    if (rr[r].rc) fail_msg("%s causal %d varlen %d rank %d: %s", name, causal, varlen, r, rr[r].msg);

  /* each rank's shard of o, dq, dc_kv, dk_rope; dw_kv_b summed over the ranks */
  char what[96];
  double worst = 0;
  const mlagen_tensor_info *gi[] = {&z.o, &z.dq, &z.dc_kv, &z.dk_rope};
  for (int r = 0; r < 2; r++) {
    const mlagen_tensor *got[] = {&rr[r].t.o, &rr[r].t.dq, &rr[r].t.dc_kv, &rr[r].t.dk_rope};
    for (int k = 0; k < 4; k++) {
      void *want = shard(gout[k], gi[k]->bytes, B, S, r);
      snprintf(what, sizeof what, "%s causal %d varlen %d rank %d %s", name, causal, varlen, r,
               gi[k]->name);
      worst = fmax(worst, close_f64(got[k]->data, want, gi[k]->bytes / 2 / 8, what));
      free(want);
    }
  }
  const size_t nw = z.dw_kv_b.bytes / 8;
  double *sum = malloc(z.dw_kv_b.bytes);
  for (size_t i = 0; i < nw; i++)
    sum[i] = ((double *)rr[0].t.dw_kv_b.data)[i] + ((double *)rr[1].t.dw_kv_b.data)[i];
  snprintf(what, sizeof what, "%s causal %d varlen %d dw_kv_b (sum of the ranks)", name, causal,
           varlen);
  worst = fmax(worst, close_f64(sum, gout[4], nw, what));
  printf("P = 2 %s causal %d%s: worst error %.1e max|ref|\n", name, causal,
         varlen ? " packed" : "", worst);
  free(sum);

  for (int r = 0; r < 2; r++) {
    rank_run *u = &rr[r];
    void *own[] = {u->t.q.data, u->t.c_kv.data, u->t.k_rope.data, u->t.d_o.data, u->t.o.data,
                   u->t.dq.data, u->t.dc_kv.data, u->t.dk_rope.data, u->t.dw_kv_b.data,
                   u->ws, u->saved};
    for (size_t k = 0; k < sizeof own / sizeof own[0]; k++) free(own[k]);
    mlagen_plan_destroy(u->plan);
    mlagen_context_destroy(u->ctx);
  }
  pthread_barrier_destroy(&x.bar);
  for (int k = 0; k < 5; k++) free(in[k]), free(gout[k]);
  mlagen_plan_destroy(g);
  mlagen_model_destroy(m);
  mlagen_context_destroy(ctx);
}

static void test_p2_callbacks_equal_p1(void **state) {
  (void)state;
  const mg_shape s = tu_shape(4, 16, 16, 16, 32);
  for (int f = 0; f < 5; f++)
    for (int causal = 0; causal < 2; causal++) p2_case(&s, k_forms[f], k_form_names[f], causal, 0);
}

/* The same, packed (a document across the ranks, NaN slack), for the P = 2 Ulysses forms. */
static void test_p2_packed_equal_p1(void **state) {
  (void)state;
  const mg_shape s = tu_shape(4, 16, 16, 16, 32);
  for (int f = 0; f < 5; f++)
    for (int causal = 0; causal < 2; causal++) p2_case(&s, k_forms[f], k_form_names[f], causal, 1);
}

/* ---- packed sequences at P = 1 against each document alone -------------------------------- */

enum { N_IN = 5, N_OUT = 5 };

/* A CPU plan of desc for model m run forward then backward through the API on the inputs
 * in (q, c_kv, k_rope, w_kv_b, do in the plan's shapes) and documents cu (NULL for none):
 * out[k] (o, dq, dc_kv, dk_rope, dw_kv_b) allocated here, filled with 0xA5 before the
 * passes. Returns the first failing status (message in ctx); *z the plan's sizes. */
static int api_run(mlagen_context *ctx, const mlagen_model *m, const mlagen_plan_desc *pd,
                   void *const in[N_IN], const int32_t *cu, int64_t n_cu, void *out[N_OUT],
                   mlagen_sizes *z) {
  mlagen_plan *plan = NULL;
  int rc = mlagen_plan_create(ctx, m, pd, &plan);
  if (rc) return rc;
  assert_int_equal(mlagen_plan_sizes(plan, z), 0);
  const mlagen_tensor_info *oi[N_OUT] = {&z->o, &z->dq, &z->dc_kv, &z->dk_rope, &z->dw_kv_b};
  for (int k = 0; k < N_OUT; k++) {
    out[k] = aligned_alloc(64, oi[k]->bytes + 64);
    memset(out[k], 0xA5, oi[k]->bytes);
  }
  mlagen_tensors t = {.q = tensor_of(in[0], &z->q), .c_kv = tensor_of(in[1], &z->c_kv),
                      .k_rope = tensor_of(in[2], &z->k_rope), .w_kv_b = tensor_of(in[3], &z->w_kv_b),
                      .d_o = tensor_of(in[4], &z->d_o), .o = tensor_of(out[0], &z->o),
                      .dq = tensor_of(out[1], &z->dq), .dc_kv = tensor_of(out[2], &z->dc_kv),
                      .dk_rope = tensor_of(out[3], &z->dk_rope),
                      .dw_kv_b = tensor_of(out[4], &z->dw_kv_b), .cu_seqlens = cu,
                      .n_cu_seqlens = n_cu};
  unsigned char *ws = aligned_alloc(256, z->workspace_bytes + 256),
                *saved = aligned_alloc(256, z->saved_bytes + 256);
  memset(ws, 0xFF, z->workspace_bytes); /* NaN patterns */
  rc = mlagen_forward(plan, &t, ws, z->workspace_bytes, saved, z->saved_bytes, NULL);
  if (!rc) rc = mlagen_backward(plan, &t, ws, z->workspace_bytes, saved, z->saved_bytes, NULL);
  free(ws), free(saved);
  mlagen_plan_destroy(plan);
  return rc;
}

/* Documents of lengths 5, 0, 12, 1, 11 in T_cap = 32 rows (3 slack rows). */
static const int32_t docs_cu[] = {0, 5, 5, 17, 18, 29};
#define DOCS_N 5
#define DOCS_CAP 32

static void packed_case(mlagen_context *ctx, const mg_shape *s, mlagen_form form, int causal,
                        double *worst) {
  const mlagen_dtype dt = MLAGEN_DTYPE_F64;
  mlagen_model *m = make_model(ctx, s);
  mlagen_plan_desc pd = {.form = form, .batch = 1, .seq = DOCS_CAP, .sp_size = 1,
                         .causal = causal, .dtype = dt, .device = MLAGEN_DEVICE_CPU, .varlen = 1};
  /* the sizes, for the inputs (a plan made only to read them) */
  mlagen_plan *sz = NULL;
  if (mlagen_plan_create(ctx, m, &pd, &sz)) fail_msg("%s", mlagen_last_message(ctx));
  mlagen_sizes z;
  assert_int_equal(mlagen_plan_sizes(sz, &z), 0);
  mlagen_plan_destroy(sz);
  const double wspread = 1.5 / sqrt((double)s->kv_lora_rank);
  void *in[N_IN] = {filled(z.q.bytes, dt, 11, 1.5), filled(z.c_kv.bytes, dt, 12, 1.0),
                    filled(z.k_rope.bytes, dt, 13, 1.5), filled(z.w_kv_b.bytes, dt, 14, wspread),
                    filled(z.d_o.bytes, dt, 15, 1.0)};
  nan_slack(in, &z, DOCS_CAP, docs_cu[DOCS_N]);
  void *got[N_OUT];
  if (api_run(ctx, m, &pd, in, docs_cu, DOCS_N + 1, got, &z))
    fail_msg("packed %d causal %d: %s", (int)form, causal, mlagen_last_message(ctx));

  /* per document: the unpacked plan on its rows alone */
  const mlagen_tensor_info *ii[N_IN] = {&z.q, &z.c_kv, &z.k_rope, &z.w_kv_b, &z.d_o};
  const mlagen_tensor_info *oi[N_OUT] = {&z.o, &z.dq, &z.dc_kv, &z.dk_rope, &z.dw_kv_b};
  const size_t nw = z.dw_kv_b.bytes / 8;
  double *dw = calloc(nw, sizeof *dw);
  double scale[N_OUT] = {0};
  void *want[DOCS_N][N_OUT] = {{0}};
  for (int d = 0; d < DOCS_N; d++) {
    const int64_t L = docs_cu[d + 1] - docs_cu[d];
    if (!L) continue; /* an empty document: no plan of seq 0 */
    void *din[N_IN];
    for (int k = 0; k < N_IN; k++) {
      const size_t row = k == 3 ? 0 : ii[k]->bytes / DOCS_CAP; /* w_kv_b: shared */
      din[k] = k == 3 ? in[3] : aligned_alloc(64, row * (size_t)L + 64);
      if (k != 3) memcpy(din[k], (char *)in[k] + row * (size_t)docs_cu[d], row * (size_t)L);
    }
    mlagen_plan_desc dd = pd;
    dd.varlen = 0, dd.seq = L;
    mlagen_sizes dz;
    if (api_run(ctx, m, &dd, din, NULL, 0, want[d], &dz))
      fail_msg("document %d: %s", d, mlagen_last_message(ctx));
    for (size_t i = 0; i < nw; i++) dw[i] += ((double *)want[d][4])[i];
    for (int k = 0; k < N_OUT - 1; k++) {
      const size_t n = oi[k]->bytes / 8 / DOCS_CAP * (size_t)L;
      for (size_t i = 0; i < n; i++) scale[k] = fmax(scale[k], fabs(((double *)want[d][k])[i]));
    }
    for (int k = 0; k < N_IN; k++)
      if (k != 3) free(din[k]);
  }
  for (size_t i = 0; i < nw; i++) scale[4] = fmax(scale[4], fabs(dw[i]));
  /* o, dq, dc_kv, dk_rope: a document's rows, then exact zeros in the slack rows */
  for (int k = 0; k < N_OUT - 1; k++) {
    const size_t row = oi[k]->bytes / 8 / DOCS_CAP;
    const double *g = got[k];
    for (int64_t t = 0; t < DOCS_CAP; t++) {
      int d = 0;
      while (d < DOCS_N && !(docs_cu[d] <= t && t < docs_cu[d + 1])) d++;
      for (size_t e = 0; e < row; e++) {
        const double v = g[(size_t)t * row + e];
        const double w = d < DOCS_N ? ((double *)want[d][k])[(size_t)(t - docs_cu[d]) * row + e] : 0.0;
        const double err = fabs(v - w);
        if (!(err <= 3e-15 * scale[k]) || (d == DOCS_N && v != 0.0))
          fail_msg("form %d causal %d: %s row %lld [%zu] = %.17g, %s %.17g", (int)form, causal,
                   oi[k]->name, (long long)t, e, v, d < DOCS_N ? "its document alone gives" :
                   "a slack row must hold", w);
        worst[k] = fmax(worst[k], err / scale[k]);
      }
    }
  }
  for (size_t i = 0; i < nw; i++) {
    const double err = fabs(((double *)got[4])[i] - dw[i]);
    if (!(err <= 3e-15 * scale[4]))
      fail_msg("form %d causal %d: dw_kv_b[%zu] = %.17g, the documents' sum %.17g", (int)form,
               causal, i, ((double *)got[4])[i], dw[i]);
    worst[4] = fmax(worst[4], err / scale[4]);
  }
  for (int d = 0; d < DOCS_N; d++)
    for (int k = 0; k < N_OUT; k++) free(want[d][k]);
  for (int k = 0; k < N_OUT; k++) free(got[k]);
  for (int k = 0; k < N_IN; k++) free(in[k]);
  free(dw);
  mlagen_model_destroy(m);
}

static void test_packed_equals_documents(void **state) {
  (void)state;
  mlagen_context *ctx = NULL;
  assert_int_equal(mlagen_context_create(&ctx), 0);
  const mg_shape s = tu_shape(4, 16, 16, 16, 32);
  double worst[N_OUT] = {0};
  for (int f = 0; f < 6; f++)
    for (int causal = 0; causal < 2; causal++) packed_case(ctx, &s, k_forms[f], causal, worst);
  printf("packed vs each document alone, worst |err| / max|ref|: o %.1e dq %.1e dc_kv %.1e "
         "dk_rope %.1e dw_kv_b %.1e\n", worst[0], worst[1], worst[2], worst[3], worst[4]);
  mlagen_context_destroy(ctx);
}

/* A laga-cp CPU plan (f32, causal, B = 1, P = 1, H = 4, d 16/16/16, d_c 32) of seq tokens,
 * packed or not, in a context of its own, with its sizes. */
static mlagen_plan *small_cpu_plan(int64_t seq, int varlen, mlagen_context **ctx,
                                   mlagen_model **m, mlagen_sizes *z) {
  *ctx = NULL;
  assert_int_equal(mlagen_context_create(ctx), 0);
  const mg_shape s = tu_shape(4, 16, 16, 16, 32);
  *m = make_model(*ctx, &s);
  mlagen_plan_desc pd = {.form = MLAGEN_FORM_LAGA_CP, .batch = 1, .seq = seq, .sp_size = 1,
                         .causal = 1, .dtype = MLAGEN_DTYPE_F32, .device = MLAGEN_DEVICE_CPU,
                         .varlen = varlen};
  mlagen_plan *plan = NULL;
  if (mlagen_plan_create(*ctx, *m, &pd, &plan)) fail_msg("%s", mlagen_last_message(*ctx));
  assert_int_equal(mlagen_plan_sizes(plan, z), 0);
  return plan;
}

/* Bad documents: MLAGEN_EINVAL naming the index, and not one byte of the outputs, the saved
 * area or the workspace written (each keeps its sentinel). */
static void test_packed_refusals_write_nothing(void **state) {
  (void)state;
  mlagen_context *ctx;
  mlagen_model *m;
  mlagen_sizes z;
  mlagen_plan *plan = small_cpu_plan(DOCS_CAP, 1, &ctx, &m, &z);
  const mlagen_tensor_info *all[] = {&z.q, &z.c_kv, &z.k_rope, &z.w_kv_b, &z.d_o,
                                     &z.o, &z.dq, &z.dc_kv, &z.dk_rope, &z.dw_kv_b};
  void *buf[10];
  for (int k = 0; k < 10; k++) buf[k] = filled(all[k]->bytes, MLAGEN_DTYPE_F32, (uint64_t)k + 21, 1.0);
  mlagen_tensors t = {.q = tensor_of(buf[0], &z.q), .c_kv = tensor_of(buf[1], &z.c_kv),
                      .k_rope = tensor_of(buf[2], &z.k_rope), .w_kv_b = tensor_of(buf[3], &z.w_kv_b),
                      .d_o = tensor_of(buf[4], &z.d_o), .o = tensor_of(buf[5], &z.o),
                      .dq = tensor_of(buf[6], &z.dq), .dc_kv = tensor_of(buf[7], &z.dc_kv),
                      .dk_rope = tensor_of(buf[8], &z.dk_rope), .dw_kv_b = tensor_of(buf[9], &z.dw_kv_b)};
  const size_t wsb = z.workspace_bytes + 16;
  unsigned char *ws = aligned_alloc(256, wsb + 256), *saved = aligned_alloc(256, z.saved_bytes + 256);
  memset(ws, 0x5A, wsb), memset(saved, 0x3C, z.saved_bytes);
  unsigned char *ws0 = malloc(wsb), *saved0 = malloc(z.saved_bytes);
  memcpy(ws0, ws, wsb), memcpy(saved0, saved, z.saved_bytes);
  void *before[10];
  for (int k = 0; k < 10; k++) {
    before[k] = malloc(all[k]->bytes);
    memcpy(before[k], buf[k], all[k]->bytes);
  }
  const struct { int32_t cu[4]; int64_t n; const char *says; } bad[] = {
      {{0, 9, 8, 20}, 4, "tensors->cu_seqlens[2] = 8 is below tensors->cu_seqlens[1] = 9"},
      {{2, 9, 9, 20}, 4, "tensors->cu_seqlens[0] = 2, the first boundary must be 0"},
      {{0, 9, 30, 33}, 4, "tensors->cu_seqlens[3] = 33 is past the plan's token capacity 32"},
      {{0, 9, 30, 31}, 0, "tensors->cu_seqlens needs at least one entry"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    for (int pass = 0; pass < 2; pass++) {
      t.cu_seqlens = bad[i].cu, t.n_cu_seqlens = bad[i].n;
      int rc = pass ? mlagen_backward(plan, &t, ws, z.workspace_bytes, saved, z.saved_bytes, NULL)
                    : mlagen_forward(plan, &t, ws, z.workspace_bytes, saved, z.saved_bytes, NULL);
      expect_msg(ctx, rc, MLAGEN_EINVAL, pass ? "mlagen_backward: " : "mlagen_forward: ");
      expect_msg(ctx, rc, MLAGEN_EINVAL, bad[i].says);
      for (int k = 0; k < 10; k++)
        if (memcmp(before[k], buf[k], all[k]->bytes))
          fail_msg("case %zu pass %d: %s was written", i, pass, all[k]->name);
      if (memcmp(ws0, ws, wsb) || memcmp(saved0, saved, z.saved_bytes))
        fail_msg("case %zu pass %d: the workspace or the saved area was written", i, pass);
    }
  /* the same tensors with good documents do run (the refusals were the documents') */
  t.cu_seqlens = docs_cu, t.n_cu_seqlens = DOCS_N + 1;
  assert_int_equal(mlagen_forward(plan, &t, ws, z.workspace_bytes, saved, z.saved_bytes, NULL), 0);
  assert_true(memcmp(before[5], buf[5], z.o.bytes) != 0);
  for (int k = 0; k < 10; k++) free(buf[k]), free(before[k]);
  free(ws), free(saved), free(ws0), free(saved0);
  mlagen_plan_destroy(plan);
  mlagen_model_destroy(m);
  mlagen_context_destroy(ctx);
}

/* No call works in place (mlagen.h, mlagen_tensors): memory a pass writes that overlaps
 * another buffer of the call is refused, MLAGEN_EINVAL naming both, before a byte of any
 * buffer changes; inputs over each other are allowed (read only). */
static void test_overlap_refused_writes_nothing(void **state) {
  (void)state;
  mlagen_context *ctx;
  mlagen_model *m;
  mlagen_sizes z;
  mlagen_plan *plan = small_cpu_plan(16, 0, &ctx, &m, &z);
  const mlagen_tensor_info *all[] = {&z.q, &z.c_kv, &z.k_rope, &z.w_kv_b, &z.d_o,
                                     &z.o, &z.dq, &z.dc_kv, &z.dk_rope, &z.dw_kv_b};
  /* one arena holds every tensor, the workspace and the saved area, 256 bytes apart */
  size_t off[12], at = 0;
  for (int k = 0; k < 10; k++) off[k] = at, at += (all[k]->bytes + 511) / 256 * 256;
  off[10] = at, at += (z.workspace_bytes + 511) / 256 * 256;
  off[11] = at, at += (z.saved_bytes + 511) / 256 * 256;
  unsigned char *arena = aligned_alloc(256, at);
  float *fa = (float *)arena;
  for (size_t i = 0; i < at / 4; i++) fa[i] = (float)(1.5 * tu_normal(7, 31, i));
  unsigned char *before = malloc(at);
  mlagen_tensors t0 = {0};
  mlagen_tensor *slot[] = {&t0.q, &t0.c_kv, &t0.k_rope, &t0.w_kv_b, &t0.d_o,
                           &t0.o, &t0.dq, &t0.dc_kv, &t0.dk_rope, &t0.dw_kv_b};
  for (int k = 0; k < 10; k++) *slot[k] = tensor_of(arena + off[k], all[k]);
  unsigned char *ws = arena + off[10], *saved = arena + off[11];
  /* a good forward first: the backward cases below then refuse a pass that would run */
  assert_int_equal(mlagen_forward(plan, &t0, ws, z.workspace_bytes, saved, z.saved_bytes, NULL), 0);
  assert_string_equal(mlagen_last_message(ctx), "");
  memcpy(before, arena, at);
  enum { Q, CKV, KR, W, DO, O, DQ, DCKV, DKR, DW };
  const struct { int pass, field; ptrdiff_t to; const char *a, *b; } bad[] = {
      /* the field's data moved to `to` bytes into the arena */
      {1, DQ, -1, "tensors->q (", "tensors->dq ("},            /* dq in place over q */
      {0, O, -2, "tensors->o (", "tensors->c_kv ("},           /* o over c_kv's last bytes */
      {1, DCKV, -3, "tensors->dc_kv (", "tensors->dk_rope ("}, /* two outputs over each other */
      {1, DQ, -4, "tensors->dq (", "saved ("},                 /* an output over the saved area */
      {0, O, -5, "tensors->o (", "workspace ("},               /* an output over the workspace */
      {0, -1, 0, "workspace (", "saved ("},                    /* the workspace over saved */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    mlagen_tensors t = t0;
    mlagen_tensor *ft[] = {&t.q, &t.c_kv, &t.k_rope, &t.w_kv_b, &t.d_o,
                           &t.o, &t.dq, &t.dc_kv, &t.dk_rope, &t.dw_kv_b};
    unsigned char *w = ws, *sv = saved;
    switch (bad[i].to) {
      case -1: ft[DQ]->data = arena + off[Q]; break;
      case -2: ft[O]->data = arena + off[CKV] + z.c_kv.bytes - 256; break;
      case -3: ft[DCKV]->data = arena + off[DKR] + 64; break;
      case -4: ft[DQ]->data = saved + z.saved_bytes / 2 / 256 * 256; break;
      case -5: ft[O]->data = ws + 16; break;
      default: sv = ws + 256; break;
    }
    int rc = bad[i].pass ? mlagen_backward(plan, &t, w, z.workspace_bytes, sv, z.saved_bytes, NULL)
                         : mlagen_forward(plan, &t, w, z.workspace_bytes, sv, z.saved_bytes, NULL);
    expect_msg(ctx, rc, MLAGEN_EINVAL, bad[i].pass ? "mlagen_backward: " : "mlagen_forward: ");
    expect_msg(ctx, rc, MLAGEN_EINVAL, bad[i].a);
    expect_msg(ctx, rc, MLAGEN_EINVAL, bad[i].b);
    expect_msg(ctx, rc, MLAGEN_EINVAL, "overlap");
    if (memcmp(before, arena, at)) fail_msg("case %zu: a byte of the arena was written", i);
  }
  /* a CPU plan runs no generated kernel: mlagen_plan_kernel counts 0, and says why for i */
  int nk = -1;
  const char *kname;
  assert_int_equal(mlagen_plan_kernel(plan, 0, &nk, NULL, NULL), 0);
  assert_int_equal(nk, 0);
  expect_msg(ctx, mlagen_plan_kernel(plan, 0, NULL, &kname, NULL), MLAGEN_EINVAL,
             "a CPU plan runs no generated kernel");
  /* inputs over each other run: k_rope read from q's first rows */
  mlagen_tensors t = t0;
  t.k_rope.data = t.q.data;
  assert_int_equal(mlagen_forward(plan, &t, ws, z.workspace_bytes, saved, z.saved_bytes, NULL), 0);
  assert_int_equal(mlagen_backward(plan, &t, ws, z.workspace_bytes, saved, z.saved_bytes, NULL), 0);
  assert_string_equal(mlagen_last_message(ctx), "");
  free(arena), free(before);
  mlagen_plan_destroy(plan);
  mlagen_model_destroy(m);
  mlagen_context_destroy(ctx);

  /* a packed plan's cu_seqlens (read during the pass) inside the workspace or an output:
   * refused too (it was accepted, and the pass read boundaries the steps had overwritten) */
  plan = small_cpu_plan(16, 1, &ctx, &m, &z);
  unsigned char *ws2 = aligned_alloc(256, z.workspace_bytes + 256);
  unsigned char *saved2 = aligned_alloc(256, z.saved_bytes + 256);
  const int32_t cu[3] = {0, 5, 16};
  mlagen_tensors tp = {0};
  mlagen_tensor *sp[] = {&tp.q, &tp.c_kv, &tp.k_rope, &tp.w_kv_b, &tp.d_o,
                         &tp.o, &tp.dq, &tp.dc_kv, &tp.dk_rope, &tp.dw_kv_b};
  const mlagen_tensor_info *ip[] = {&z.q, &z.c_kv, &z.k_rope, &z.w_kv_b, &z.d_o,
                                    &z.o, &z.dq, &z.dc_kv, &z.dk_rope, &z.dw_kv_b};
  void *bp[10];
  for (int k = 0; k < 10; k++)
    bp[k] = filled(ip[k]->bytes, MLAGEN_DTYPE_F32, (uint64_t)k + 41, 1.0), *sp[k] = tensor_of(bp[k], ip[k]);
  for (int where = 0; where < 3; where++) {
    int32_t *in = where == 0 ? (int32_t *)(ws2 + 128) : where == 1 ? (int32_t *)bp[5] : (int32_t *)saved2;
    memcpy(in, cu, sizeof cu);
    tp.cu_seqlens = in, tp.n_cu_seqlens = 3;
    int rc = mlagen_forward(plan, &tp, ws2, z.workspace_bytes, saved2, z.saved_bytes, NULL);
    expect_msg(ctx, rc, MLAGEN_EINVAL, "tensors->cu_seqlens (");
    expect_msg(ctx, rc, MLAGEN_EINVAL, where == 0 ? "workspace (" : where == 1 ? "tensors->o (" : "saved (");
  }
  tp.cu_seqlens = cu;
  assert_int_equal(mlagen_forward(plan, &tp, ws2, z.workspace_bytes, saved2, z.saved_bytes, NULL), 0);
  for (int k = 0; k < 10; k++) free(bp[k]);
  free(ws2), free(saved2);
  mlagen_plan_destroy(plan);
  mlagen_model_destroy(m);
  mlagen_context_destroy(ctx);
}

static void test_cpu_plan_refusals(void **state) {
  (void)state;
  mlagen_context *ctx = NULL;
  assert_int_equal(mlagen_context_create(&ctx), 0);
  const mg_shape s = tu_shape(4, 16, 16, 16, 32);
  mlagen_model *m = make_model(ctx, &s);
  mlagen_plan_desc pd = {.form = MLAGEN_FORM_LAGA, .batch = 1, .seq = 8, .sp_size = 1,
                         .causal = 1, .dtype = MLAGEN_DTYPE_BF16, .device = MLAGEN_DEVICE_CPU};
  mlagen_plan *plan = NULL;
  expect_msg(ctx, mlagen_plan_create(ctx, m, &pd, &plan), MLAGEN_EUNSUPPORTED,
             "the CPU device (MLAGEN_DEVICE_CPU) runs f32 and f64 plans");
  assert_null(plan);
  pd.dtype = MLAGEN_DTYPE_F32;
  pd.device = (mlagen_device)7;
  expect_msg(ctx, mlagen_plan_create(ctx, m, &pd, &plan), MLAGEN_EINVAL,
             "plan_desc->device = 7 is not an mlagen_device");
  mlagen_model_destroy(m);
  mlagen_context_destroy(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cpu_passes_equal_executor),
      cmocka_unit_test(test_comm_ops),
      cmocka_unit_test(test_comm_reentry),
      cmocka_unit_test(test_p2_callbacks_equal_p1),
      cmocka_unit_test(test_p2_packed_equal_p1),
      cmocka_unit_test(test_packed_equals_documents),
      cmocka_unit_test(test_packed_refusals_write_nothing),
      cmocka_unit_test(test_overlap_refused_writes_nothing),
      cmocka_unit_test(test_cpu_plan_refusals),
  };
  const char *filter = getenv("MLAGEN_TEST_FILTER"); /* a cmocka pattern: one test */
  if (filter) cmocka_set_test_filter(filter);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
