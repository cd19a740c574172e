/* test_api_cpu.c: the C API's CPU device (MLAGEN_DEVICE_CPU) and the trainer's collectives
 * as callbacks (mlagen_plan_set_comm_ops), without a driver.
 *   - every form, f32 and f64, causal or not: mlagen_forward then mlagen_backward in the
 *     caller's memory (workspace filled with garbage before each pass, saved kept between)
 *     equal the CPU executor's whole run (mg_cpu_run, its own allocator) bit for bit;
 *     sizes: the static layout without the 32 MiB cuBLAS slice;
 *   - a P = 2 plan: without callbacks MLAGEN_EINVAL; a callback that fails gives MLAGEN_EIO
 *     naming the callback, its return value and the plan step; set_comm_ops's refusals;
 *   - plan_create's refusals for the CPU device (bf16, an unknown device).
 * The numerics against an independent reference and P = 2, 4 over real collectives are
 * tests/python/ (gloo). */
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
#include "mg_cpu_exec.h"
#include "mg_plan.h"
#include "mlagen.h"

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
  const mlagen_form forms[] = {MLAGEN_FORM_EXPLICIT, MLAGEN_FORM_ABSORBED, MLAGEN_FORM_LAGA,
                               MLAGEN_FORM_LAGA_R, MLAGEN_FORM_LAGA_F};
  const mg_form mforms[] = {MG_FORM_EXPLICIT, MG_FORM_ABSORBED, MG_FORM_LAGA, MG_FORM_LAGA_R,
                            MG_FORM_LAGA_F};
  for (int f = 0; f < 5; f++)
    for (int causal = 0; causal < 2; causal++) {
      one_case(ctx, &s, forms[f], mforms[f], MLAGEN_DTYPE_F64, causal);
      one_case(ctx, &s, forms[f], mforms[f], MLAGEN_DTYPE_F32, causal);
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

static void test_comm_ops(void **state) {
  (void)state;
  mlagen_context *ctx = NULL;
  assert_int_equal(mlagen_context_create(&ctx), 0);
  const mg_shape s = tu_shape(4, 16, 16, 16, 32);
  mlagen_model *m = make_model(ctx, &s);
  mlagen_plan_desc pd = {.form = MLAGEN_FORM_LAGA, .batch = 1, .seq = 8, .sp_size = 2,
                         .sp_rank = 1, .causal = 1, .dtype = MLAGEN_DTYPE_F64,
                         .device = MLAGEN_DEVICE_CPU};
  mlagen_plan *plan = NULL;
  assert_int_equal(mlagen_plan_create(ctx, m, &pd, &plan), 0);
  mlagen_sizes z;
  assert_int_equal(mlagen_plan_sizes(plan, &z), 0);
  void *buf[4];
  const mlagen_tensor_info *in[] = {&z.q, &z.c_kv, &z.k_rope, &z.w_kv_b};
  for (int k = 0; k < 4; k++) buf[k] = calloc(1, in[k]->bytes);
  void *o = calloc(1, z.o.bytes), *ws = aligned_alloc(256, z.workspace_bytes + 256),
       *saved = aligned_alloc(256, z.saved_bytes + 256);
  mlagen_tensors t = {.q = tensor_of(buf[0], &z.q), .c_kv = tensor_of(buf[1], &z.c_kv),
                      .k_rope = tensor_of(buf[2], &z.k_rope), .w_kv_b = tensor_of(buf[3], &z.w_kv_b),
                      .o = tensor_of(o, &z.o)};
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
  for (int k = 0; k < 4; k++) free(buf[k]);
  free(o), free(ws), free(saved);
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
      cmocka_unit_test(test_cpu_plan_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
