/* test_api.c: the embedding API of include/mlagen.h and the driver loader.
 *
 * Three modes, one per process (the driver is loaded once per process), chosen by the
 * first argument; each sets MLAGEN_LIBCUDA before any call:
 *   nodriver     MLAGEN_LIBCUDA names a file that does not exist: every call that needs
 *                the driver returns MLAGEN_ENODRIVER with the dlopen message; contexts,
 *                models, plans and sizes work; sizes equal the planner's; every bad
 *                argument is MLAGEN_EINVAL naming it.
 *   fake         MLAGEN_LIBCUDA = the fake driver built from tests/fake_cuda.c: the
 *                loader resolves every entry point, reports the driver version and the
 *                device name; valid calls to mlagen_forward/backward of an sp_size 8
 *                plan reach the executor's checks: MLAGEN_EINVAL without a communicator
 *                (mlagen_plan_set_comm), MLAGEN_ENONCCL with one when NCCL cannot be
 *                loaded (MLAGEN_LIBNCCL names a missing file). The executor itself is
 *                tested by test_cuda_exec, the NCCL loader by test_nccl_dl.
 *   fake-noinit  the fake driver with cuInit failing: MLAGEN_ENODRIVER naming the error. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_driver.h"
#include "mg_config.h"
#include "mg_driver.h"
#include "mg_plan.h"
#include "mg_plan_mem.h"
#include "mlagen.h"
#include "test_assert.h"

/* ---- fixtures ----------------------------------------------------------------------- */

typedef struct fx {
  mlagen_context *ctx;
  mlagen_model *model;
  mlagen_plan *plan;
  mlagen_sizes sizes;
  mlagen_tensors t;
  void *ws, *saved; /* never dereferenced: the API only checks them */
} fx;

static const mlagen_tensor_info *info_at(const mlagen_sizes *z, int i) {
  const mlagen_tensor_info *all[] = {&z->q, &z->c_kv, &z->k_rope, &z->w_kv_b, &z->o,
                                     &z->d_o, &z->dq, &z->dc_kv, &z->dk_rope, &z->dw_kv_b};
  return i < 10 ? all[i] : NULL;
}
static mlagen_tensor *tensor_at(mlagen_tensors *t, int i) {
  mlagen_tensor *all[] = {&t->q, &t->c_kv, &t->k_rope, &t->w_kv_b, &t->o,
                          &t->d_o, &t->dq, &t->dc_kv, &t->dk_rope, &t->dw_kv_b};
  return i < 10 ? all[i] : NULL;
}

/* Fake (aligned, never read) addresses of buffers that do not overlap (every buffer these
 * tests describe is below 64 GiB): tensor i at FAKE_AT(i), the workspace at FAKE_AT(10),
 * the saved area at FAKE_AT(11). */
#define FAKE_AT(i) ((void *)(((uintptr_t)1 << 40) + ((uintptr_t)(i) << 36)))
#define FAKE_WS FAKE_AT(10)
#define FAKE_SAVED FAKE_AT(11)

/* Tensors that match the plan, at distinct fake addresses (FAKE_AT). */
static void fill_tensors(mlagen_tensors *t, const mlagen_sizes *z) {
  memset(t, 0, sizeof *t);
  for (int i = 0; i < 10; i++) {
    const mlagen_tensor_info *in = info_at(z, i);
    mlagen_tensor *x = tensor_at(t, i);
    x->data = FAKE_AT(i);
    x->dtype = in->dtype;
    x->ndim = in->ndim;
    for (int d = 0; d < in->ndim; d++) x->dims[d] = in->dims[d];
  }
}

static int setup_fx(void **state, const char *model, mlagen_plan_desc desc) {
  fx *f = calloc(1, sizeof *f);
  assert_non_null(f);
  assert_int_equal(mlagen_context_create(&f->ctx), MLAGEN_OK);
  if (mlagen_model_from_config(f->ctx, model, &f->model))
    fail_msg("%s", mlagen_last_message(f->ctx));
  if (mlagen_plan_create(f->ctx, f->model, &desc, &f->plan))
    fail_msg("%s", mlagen_last_message(f->ctx));
  assert_int_equal(mlagen_plan_sizes(f->plan, &f->sizes), MLAGEN_OK);
  fill_tensors(&f->t, &f->sizes);
  f->ws = FAKE_WS;
  f->saved = FAKE_SAVED;
  *state = f;
  return 0;
}

/* DeepSeek-V3, LAGA, P = 8, rank 3, S = 4096, bf16, causal. */
static int setup_laga(void **state) {
  return setup_fx(state, "deepseek-v3",
                  (mlagen_plan_desc){.form = MLAGEN_FORM_LAGA, .batch = 1, .seq = 4096,
                                     .sp_rank = 3, .sp_size = 8, .causal = 1,
                                     .dtype = MLAGEN_DTYPE_BF16});
}

static int teardown_fx(void **state) {
  fx *f = *state;
  mlagen_plan_destroy(f->plan);
  mlagen_model_destroy(f->model);
  mlagen_context_destroy(f->ctx);
  free(f);
  return 0;
}

static int fwd(fx *f) {
  return mlagen_forward(f->plan, &f->t, f->ws, f->sizes.workspace_bytes, f->saved,
                        f->sizes.saved_bytes, NULL);
}
static int bwd(fx *f) {
  return mlagen_backward(f->plan, &f->t, f->ws, f->sizes.workspace_bytes, f->saved,
                         f->sizes.saved_bytes, NULL);
}

/* ---- no driver: what works ------------------------------------------------------------ */

static void test_status_strings(void **state) {
  (void)state;
  assert_string_equal(mlagen_strerror(MLAGEN_ENODRIVER), "no CUDA driver");
  assert_string_equal(mlagen_strerror(12345), "unknown status");
  assert_string_equal(mlagen_status_name(MLAGEN_EUNSUPPORTED), "MLAGEN_EUNSUPPORTED");
}

static void test_context(void **state) {
  (void)state;
  mlagen_context *c = NULL;
  assert_int_equal(mlagen_context_create(NULL), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(NULL), "ctx is NULL");
  assert_int_equal(mlagen_context_create(&c), MLAGEN_OK);
  assert_non_null(c);
  assert_string_equal(mlagen_last_message(c), "");
  mlagen_context_destroy(c);
  mlagen_context_destroy(NULL);
}

static void test_model_from_config(void **state) {
  (void)state;
  mlagen_context *c;
  mlagen_model *m = NULL;
  mlagen_model_desc d;
  assert_int_equal(mlagen_context_create(&c), 0);
  assert_int_equal(mlagen_model_from_config(c, "deepseek-v3", &m), MLAGEN_OK);
  assert_int_equal(mlagen_model_get_desc(m, &d), 0);
  assert_int_equal(d.num_attention_heads, 128);
  assert_int_equal(d.kv_lora_rank, 512);
  assert_int_equal(d.qk_rope_head_dim, 64);
  assert_int_equal(d.qk_nope_head_dim, 128);
  assert_int_equal(d.v_head_dim, 128);
  assert_true(fabs(d.softmax_scale - 0.135234) < 1e-5); /* yarn mscale included */
  mlagen_model_destroy(m);

  m = (mlagen_model *)&d; /* set to NULL on error */
  assert_int_equal(mlagen_model_from_config(c, "no-such-model", &m), MLAGEN_EIO);
  assert_null(m);
  assert_contains(mlagen_last_message(c), "shipped");
  assert_int_equal(mlagen_model_from_config(c, MLAGEN_TEST_DATA "/configs/bad_gqa.json", &m),
                   MLAGEN_ECONFIG);
  assert_contains(mlagen_last_message(c), "not an MLA model");
  assert_int_equal(mlagen_model_from_config(c, MLAGEN_TEST_DATA "/configs/bad_align.json", &m),
                   MLAGEN_EUNSUPPORTED);
  assert_int_equal(mlagen_model_from_config(c, NULL, &m), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(c), "config is NULL");
  assert_int_equal(mlagen_model_from_config(c, "", &m), MLAGEN_EINVAL);
  assert_int_equal(mlagen_model_from_config(c, "deepseek-v3", NULL), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(c), "model is NULL");
  assert_int_equal(mlagen_model_from_config(NULL, "deepseek-v3", &m), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(NULL), "ctx is NULL");
  assert_int_equal(mlagen_model_get_desc(NULL, &d), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(NULL), "model is NULL");
  mlagen_context_destroy(c);
}

static void test_model_from_desc(void **state) {
  (void)state;
  mlagen_context *c;
  mlagen_model *m;
  mlagen_model_desc out;
  assert_int_equal(mlagen_context_create(&c), 0);
  const mlagen_model_desc good = {.num_attention_heads = 8, .kv_lora_rank = 256,
                                  .qk_rope_head_dim = 32, .qk_nope_head_dim = 64,
                                  .v_head_dim = 64};
  assert_int_equal(mlagen_model_from_desc(c, &good, &m), MLAGEN_OK);
  assert_string_equal(mlagen_last_message(c), "");
  assert_int_equal(mlagen_model_get_desc(m, &out), 0);
  assert_true(fabs(out.softmax_scale - 1.0 / sqrt(96.0)) < 1e-12);
  assert_int_equal(out.kv_lora_rank, 256);
  mlagen_model_destroy(m);
  mlagen_model_desc x = good;
  x.softmax_scale = 0.25;
  assert_int_equal(mlagen_model_from_desc(c, &x, &m), MLAGEN_OK);
  assert_int_equal(mlagen_model_get_desc(m, &out), 0);
  assert_true(out.softmax_scale == 0.25);
  mlagen_model_destroy(m);

  struct { mlagen_model_desc d; int status; const char *says; } bad[] = {
    {good, MLAGEN_EINVAL, "num_attention_heads"},
    {good, MLAGEN_EINVAL, "qk_rope_head_dim"},
    {good, MLAGEN_EUNSUPPORTED, "v_head_dim"},
    {good, MLAGEN_EUNSUPPORTED, "kv_lora_rank"},
    {good, MLAGEN_EINVAL, "softmax_scale"},
    {good, MLAGEN_EINVAL, "softmax_scale"},
    {good, MLAGEN_EINVAL, "qk_nope_head_dim"},
  };
  bad[0].d.num_attention_heads = 0;
  bad[1].d.qk_rope_head_dim = 33;  /* odd */
  bad[2].d.v_head_dim = 100;       /* not a multiple of 16 */
  bad[3].d.kv_lora_rank = 2048;    /* over MG_MAX_LATENT */
  bad[4].d.softmax_scale = -1;
  bad[5].d.softmax_scale = NAN;
  bad[6].d.qk_nope_head_dim = -16;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    m = (mlagen_model *)&out;
    assert_int_equal(mlagen_model_from_desc(c, &bad[i].d, &m), bad[i].status);
    assert_null(m);
    assert_contains(mlagen_last_message(c), bad[i].says);
  }
  assert_int_equal(mlagen_model_from_desc(c, NULL, &m), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(c), "desc is NULL");
  mlagen_context_destroy(c);
}

/* The API's sizes are the planner's: every form, two shapes. */
static void check_sizes(mlagen_context *c, const char *model, mlagen_plan_desc desc,
                        mg_dtype dtype) {
  static mg_plan ref;
  mlagen_model *m;
  assert_int_equal(mlagen_model_from_config(c, model, &m), 0);
  mg_shape shape;
  assert_int_equal(mg_config_load(model, &shape, NULL), 0);
  const mlagen_form forms[] = {MLAGEN_FORM_EXPLICIT, MLAGEN_FORM_ABSORBED, MLAGEN_FORM_LAGA,
                               MLAGEN_FORM_LAGA_R, MLAGEN_FORM_LAGA_F, MLAGEN_FORM_LAGA_CP};
  const mg_form mg_forms[] = {MG_FORM_EXPLICIT, MG_FORM_ABSORBED, MG_FORM_LAGA, MG_FORM_LAGA_R,
                              MG_FORM_LAGA_F, MG_FORM_LAGA_CP};
  for (int f = 0; f < 6; f++) {
    desc.form = forms[f];
    mlagen_plan *p;
    if (mlagen_plan_create(c, m, &desc, &p)) fail_msg("%s", mlagen_last_message(c));
    mlagen_sizes z;
    assert_int_equal(mlagen_plan_sizes(p, &z), 0);
    mg_plan_args a = {.shape = &shape, .form = mg_forms[f], .sp = desc.sp_size,
                      .rank = desc.sp_rank, .batch = desc.batch, .seq = desc.seq,
                      .causal = desc.causal, .dtype = dtype};
    assert_int_equal(mg_plan_build(&ref, &a, NULL), 0);
    mg_plan_cost cost;
    mg_plan_cost_of(&ref, &cost);
    /* the two areas are the static layout's (align 256), the workspace grown by exactly
     * cuBLAS's 32 MiB (every form has GEMMs); the peaks the planner's */
    static mg_plan_mem mem;
    assert_int_equal(mg_plan_mem_layout(&ref, 256, &mem, NULL), 0);
    assert_int_equal(z.workspace_bytes, (size_t)mem.workspace_bytes + ((size_t)32 << 20));
    assert_int_equal(z.saved_bytes, (size_t)mem.saved_bytes);
    int n_saved = 0;
    for (int b = 0; b < ref.n_bufs; b++) n_saved += mem.where[b] == MG_MEM_SAVED;
    assert_true(z.saved_bytes >= (size_t)cost.saved &&
                z.saved_bytes < (size_t)cost.saved + 256 * (size_t)n_saved);
    assert_true(z.workspace_bytes % 256 == 0 && z.saved_bytes % 256 == 0);
    assert_int_equal(z.peak_fwd_bytes, (size_t)cost.peak_fwd);
    assert_int_equal(z.peak_bwd_bytes, (size_t)cost.peak_bwd);
    assert_int_equal(z.sent_fwd_bytes, (size_t)cost.sent_fwd);
    assert_int_equal(z.sent_bwd_bytes, (size_t)cost.sent_bwd);
    assert_true(z.saved_bytes > 0 && z.workspace_bytes > 0);
    for (int i = 0; i < 10; i++) {
      const mlagen_tensor_info *t = info_at(&z, i);
      int b = mg_plan_find(&ref, t->name);
      assert_true(b >= 0);
      assert_int_equal(t->ndim, ref.bufs[b].ndim);
      for (int d = 0; d < t->ndim; d++) assert_int_equal(t->dims[d], ref.bufs[b].dims[d]);
      assert_int_equal(t->bytes, (size_t)mg_plan_buf_bytes(&ref.bufs[b]));
      assert_int_equal(t->is_output, ref.bufs[b].role == MG_BUF_OUTPUT);
      assert_true(t->passes != 0);
    }
    /* the boundary of MLA.md, whatever the form */
    const int64_t Sl = desc.seq / desc.sp_size;
    assert_int_equal(z.q.dims[0], desc.batch);
    assert_int_equal(z.q.dims[1], Sl);
    assert_int_equal(z.o.passes, MLAGEN_PASS_FORWARD);
    assert_int_equal(z.d_o.passes, MLAGEN_PASS_BACKWARD);
    assert_int_equal(z.dq.passes, MLAGEN_PASS_BACKWARD);
    assert_int_equal(z.dw_kv_b.passes, MLAGEN_PASS_BACKWARD);
    assert_true(z.q.passes & MLAGEN_PASS_FORWARD);
    assert_int_equal(z.dw_kv_b.dtype, dtype == MG_F64 ? MLAGEN_DTYPE_F64 : MLAGEN_DTYPE_F32);
    assert_int_equal(z.q.dtype, desc.dtype);
    assert_string_equal(z.d_o.name, "do");
    mlagen_plan_destroy(p);
  }
  mlagen_model_destroy(m);
}

static void test_sizes_equal_planner(void **state) {
  (void)state;
  mlagen_context *c;
  assert_int_equal(mlagen_context_create(&c), 0);
  check_sizes(c, "deepseek-v3",
              (mlagen_plan_desc){.batch = 1, .seq = 16384, .sp_rank = 0, .sp_size = 8,
                                 .causal = 1, .dtype = MLAGEN_DTYPE_BF16}, MG_BF16);
  check_sizes(c, "deepseek-v2-lite",
              (mlagen_plan_desc){.batch = 2, .seq = 96, .sp_rank = 1, .sp_size = 2,
                                 .causal = 0, .dtype = MLAGEN_DTYPE_F32}, MG_F32);
  /* f16 plans are accepted and run (test_cuda_exec f16 runs every form's on the host) */
  check_sizes(c, "kimi-k2",
              (mlagen_plan_desc){.batch = 1, .seq = 4096, .sp_rank = 3, .sp_size = 4,
                                 .causal = 1, .dtype = MLAGEN_DTYPE_F16}, MG_F16);
  mlagen_context_destroy(c);
}

static void test_plan_create_errors(void **state) {
  (void)state;
  mlagen_context *c;
  mlagen_model *m;
  mlagen_plan *p;
  assert_int_equal(mlagen_context_create(&c), 0);
  assert_int_equal(mlagen_model_from_config(c, "deepseek-v3", &m), 0);
  const mlagen_plan_desc good = {.form = MLAGEN_FORM_LAGA, .batch = 1, .seq = 64,
                                 .sp_rank = 0, .sp_size = 8, .causal = 1,
                                 .dtype = MLAGEN_DTYPE_BF16};
  assert_int_equal(mlagen_plan_create(c, m, &good, &p), 0);
  mlagen_plan_destroy(p);

  struct { mlagen_plan_desc d; const char *says; } bad[] = {
    {good, "plan_desc->form"},  {good, "plan_desc->dtype"},  {good, "plan_desc->batch"},
    {good, "plan_desc->seq"},   {good, "plan_desc->sp_size"}, {good, "plan_desc->sp_rank"},
    {good, "plan_desc->sp_rank"}, {good, "plan_desc->seq = 60 is not divisible"},
    {good, "plan_desc->sp_size = 3 does not divide"}, {good, "plan_desc->sp_size = 256"},
    {good, "plan_desc->head_groups = 2: only MLAGEN_FORM_LAGA_F"},
    {good, "plan_desc->head_groups = 3 must divide H / P = 16"},
  };
  bad[0].d.form = 0;
  bad[1].d.dtype = (mlagen_dtype)9;
  bad[2].d.batch = 0;
  bad[3].d.seq = 0;
  bad[4].d.sp_size = 0;
  bad[5].d.sp_rank = 8; /* sp_rank >= sp_size */
  bad[6].d.sp_rank = -1;
  bad[7].d.seq = 60;
  bad[8].d.sp_size = 3, bad[8].d.seq = 96;
  bad[9].d.sp_size = 256, bad[9].d.seq = 256;
  bad[10].d.head_groups = 2; /* LAGA has no head groups */
  bad[11].d.form = MLAGEN_FORM_LAGA_F, bad[11].d.head_groups = 3;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    p = (mlagen_plan *)&bad;
    assert_int_equal(mlagen_plan_create(c, m, &bad[i].d, &p), MLAGEN_EINVAL);
    assert_null(p);
    assert_contains(mlagen_last_message(c), bad[i].says);
  }
  /* H = 20 (GLM-4.7-Flash-like) at P = 8: no uneven head split; the message names the
   * Ulysses forms, the degrees that work and laga-cp, which plans there */
  mlagen_model *m20;
  assert_int_equal(mlagen_model_from_config(
                       c, MLAGEN_TEST_DATA "/configs/good_glm4_moe_lite_h20.json", &m20), 0);
  p = (mlagen_plan *)&bad;
  assert_int_equal(mlagen_plan_create(c, m20, &good, &p), MLAGEN_EINVAL);
  assert_null(p);
  assert_contains(mlagen_last_message(c),
                  "mlagen_plan_create: plan_desc->sp_size = 8 does not divide "
                  "num_attention_heads = 20");
  assert_contains(mlagen_last_message(c), "(explicit, absorbed, laga, laga-r, laga-f)");
  assert_contains(mlagen_last_message(c), "plan_desc->sp_size values dividing both H and S work (here 1, 2, 4)");
  assert_contains(mlagen_last_message(c), "the all-gather context-parallel form "
                  "MLAGEN_FORM_LAGA_CP keeps all H heads on every rank and takes any P dividing S");
  mlagen_plan_desc cp8 = good; /* which plans at P = 8 */
  cp8.form = MLAGEN_FORM_LAGA_CP;
  assert_int_equal(mlagen_plan_create(c, m20, &cp8, &p), 0);
  mlagen_plan_destroy(p);
  cp8.head_groups = 3; /* laga-cp's groups divide H = 20 */
  assert_int_equal(mlagen_plan_create(c, m20, &cp8, &p), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(c), "plan_desc->head_groups = 3 must divide H = 20");
  mlagen_plan_desc four = good;
  four.sp_size = 4; /* a degree the message names works */
  assert_int_equal(mlagen_plan_create(c, m20, &four, &p), 0);
  mlagen_plan_destroy(p);
  mlagen_model_destroy(m20);
  assert_int_equal(mlagen_plan_create(c, NULL, &good, &p), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(c), "model is NULL");
  assert_int_equal(mlagen_plan_create(c, m, NULL, &p), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(c), "plan_desc is NULL");
  assert_int_equal(mlagen_plan_create(c, m, &good, NULL), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(c), "plan is NULL");
  assert_int_equal(mlagen_plan_create(NULL, m, &good, &p), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(NULL), "ctx is NULL");
  /* a plan outlives its model: the shape is copied */
  assert_int_equal(mlagen_plan_create(c, m, &good, &p), 0);
  mlagen_model_destroy(m);
  mlagen_sizes z;
  assert_int_equal(mlagen_plan_sizes(p, &z), 0);
  assert_int_equal(z.q.dims[2], 128);
  assert_int_equal(mlagen_plan_sizes(p, NULL), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(c), "sizes is NULL");
  assert_int_equal(mlagen_plan_sizes(NULL, &z), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(NULL), "plan is NULL");
  mlagen_plan_destroy(p);
  mlagen_context_destroy(c);
}

/* The calls that need the driver say there is none, after checking their arguments. */
static void test_nodriver(void **state) {
  fx *f = *state;
  assert_int_equal(fwd(f), MLAGEN_ENODRIVER);
  const char *msg = mlagen_last_message(f->ctx);
  assert_contains(msg, "mlagen_forward: no CUDA driver: " NO_SUCH_LIBCUDA);
  assert_contains(msg, "not found or not loadable (dlopen: ");
  assert_int_equal(bwd(f), MLAGEN_ENODRIVER);
  assert_contains(mlagen_last_message(f->ctx), "mlagen_backward: no CUDA driver");
  mlagen_device_info info;
  assert_int_equal(mlagen_get_device_info(f->ctx, 0, &info), MLAGEN_ENODRIVER);
  assert_contains(mlagen_last_message(f->ctx), "no CUDA driver");
  const mg_driver *drv = (const mg_driver *)f;
  assert_int_equal(mg_driver_get(&drv, NULL), MLAGEN_ENODRIVER);
  assert_null(drv);
  /* a call that succeeds clears the message */
  assert_int_equal(mlagen_plan_sizes(f->plan, &f->sizes), 0);
  assert_string_equal(mlagen_last_message(f->ctx), "");
  /* never prepared (no driver): no kernel to report, and the message says why */
  int n = -1;
  const char *name = NULL;
  assert_int_equal(mlagen_plan_kernel(f->plan, 0, &n, NULL, NULL), 0);
  assert_int_equal(n, 0);
  assert_int_equal(mlagen_plan_kernel(f->plan, 0, NULL, &name, NULL), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(f->ctx), "not prepared yet: its first mlagen_forward");
  assert_int_equal(mlagen_plan_kernel(NULL, 0, &n, NULL, NULL), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(NULL), "mlagen_plan_kernel: plan is NULL");
}

/* ---- bad arguments: MLAGEN_EINVAL naming the argument, before the driver --------------- */

static void expect_einval(fx *f, int backward, const char *says) {
  int rc = backward ? bwd(f) : fwd(f);
  if (rc != MLAGEN_EINVAL)
    fail_msg("expected MLAGEN_EINVAL (%s), got %s: %s", says, mlagen_status_name(rc),
             mlagen_last_message(f->ctx));
  assert_contains(mlagen_last_message(f->ctx), says);
  fill_tensors(&f->t, &f->sizes); /* undo the damage */
}

static void test_bad_arguments(void **state) {
  fx *f = *state;
  /* NULL plan, NULL tensors */
  assert_int_equal(mlagen_forward(NULL, &f->t, f->ws, f->sizes.workspace_bytes, f->saved,
                                  f->sizes.saved_bytes, NULL), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(NULL), "mlagen_forward: plan is NULL");
  assert_int_equal(mlagen_backward(NULL, &f->t, f->ws, f->sizes.workspace_bytes, f->saved,
                                   f->sizes.saved_bytes, NULL), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(NULL), "mlagen_backward: plan is NULL");
  assert_int_equal(mlagen_forward(f->plan, NULL, f->ws, f->sizes.workspace_bytes, f->saved,
                                  f->sizes.saved_bytes, NULL), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(f->ctx), "tensors is NULL");

  /* null tensors */
  f->t.q.data = NULL;
  expect_einval(f, 0, "tensors->q.data is NULL");
  f->t.o.data = NULL;
  expect_einval(f, 0, "tensors->o.data is NULL");
  f->t.d_o.data = NULL;
  expect_einval(f, 1, "tensors->d_o.data is NULL");
  f->t.dw_kv_b.data = NULL;
  expect_einval(f, 1, "tensors->dw_kv_b.data is NULL");
  /* wrong dims */
  f->t.q.dims[1] += 1;
  expect_einval(f, 0, "tensors->q.dims[1] = 513, the plan expects 512");
  f->t.c_kv.ndim = 2;
  expect_einval(f, 0, "tensors->c_kv.ndim = 2, the plan expects 3");
  f->t.dq.dims[3] = 128;
  expect_einval(f, 1, "tensors->dq.dims[3] = 128, the plan expects 192");
  f->t.w_kv_b.dims[0] = 128;
  expect_einval(f, 1, "tensors->w_kv_b.dims[0]");
  /* wrong dtype */
  f->t.k_rope.dtype = MLAGEN_DTYPE_F32;
  expect_einval(f, 0, "tensors->k_rope.dtype is f32, the plan expects bf16");
  f->t.dw_kv_b.dtype = MLAGEN_DTYPE_BF16; /* the accumulator is f32 */
  expect_einval(f, 1, "tensors->dw_kv_b.dtype is bf16, the plan expects f32");
  f->t.o.dtype = (mlagen_dtype)0;
  expect_einval(f, 0, "tensors->o.dtype = 0 is not an mlagen_dtype");
  /* misaligned */
  f->t.c_kv.data = (char *)f->t.c_kv.data + 1;
  expect_einval(f, 0, "tensors->c_kv.data");
  /* workspace and saved */
  assert_int_equal(mlagen_forward(f->plan, &f->t, f->ws, f->sizes.workspace_bytes - 1, f->saved,
                                  f->sizes.saved_bytes, NULL), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(f->ctx), "workspace_bytes = ");
  assert_contains(mlagen_last_message(f->ctx), "is less than the plan's workspace");
  assert_int_equal(mlagen_forward(f->plan, &f->t, NULL, f->sizes.workspace_bytes, f->saved,
                                  f->sizes.saved_bytes, NULL), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(f->ctx), "workspace is NULL");
  assert_int_equal(mlagen_forward(f->plan, &f->t, (char *)f->ws + 8, f->sizes.workspace_bytes,
                                  f->saved, f->sizes.saved_bytes, NULL), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(f->ctx), "16-byte aligned");
  assert_int_equal(mlagen_backward(f->plan, &f->t, f->ws, f->sizes.workspace_bytes, f->saved,
                                   f->sizes.saved_bytes / 2, NULL), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(f->ctx), "saved_bytes = ");
  assert_int_equal(mlagen_backward(f->plan, &f->t, f->ws, f->sizes.workspace_bytes, NULL,
                                   f->sizes.saved_bytes, NULL), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(f->ctx), "saved is NULL");
  /* a pass ignores the tensors of the other pass */
  mlagen_tensors only_fwd = f->t;
  memset(&only_fwd.d_o, 0, sizeof only_fwd.d_o);
  memset(&only_fwd.dq, 0, sizeof only_fwd.dq);
  memset(&only_fwd.dw_kv_b, 0, sizeof only_fwd.dw_kv_b);
  int rc = mlagen_forward(f->plan, &only_fwd, f->ws, f->sizes.workspace_bytes, f->saved,
                          f->sizes.saved_bytes, NULL);
  /* no driver; or, with the fake one, the executor's refusal of a plan without its
   * communicator */
  assert_true(rc == MLAGEN_ENODRIVER || rc == MLAGEN_EINVAL);
  if (rc == MLAGEN_EINVAL) assert_contains(mlagen_last_message(f->ctx), "mlagen_plan_set_comm");
}

/* A plan whose context was destroyed is refused; destroying it still works. */
static void test_plan_after_context(void **state) {
  fx *f = *state;
  mlagen_context *c;
  mlagen_plan *p;
  mlagen_sizes z;
  mlagen_plan_desc desc = {.form = MLAGEN_FORM_EXPLICIT, .batch = 1, .seq = 4096,
                           .sp_rank = 3, .sp_size = 8, .causal = 1,
                           .dtype = MLAGEN_DTYPE_BF16};
  assert_int_equal(mlagen_context_create(&c), 0);
  assert_int_equal(mlagen_plan_create(c, f->model, &desc, &p), 0);
  mlagen_context_destroy(c);
  /* another context, perhaps at the same address, does not revive it */
  mlagen_context *c2;
  assert_int_equal(mlagen_context_create(&c2), 0);
  assert_int_equal(mlagen_plan_sizes(p, &z), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(NULL), "its context was destroyed");
  assert_int_equal(mlagen_forward(p, &f->t, f->ws, f->sizes.workspace_bytes, f->saved,
                                  f->sizes.saved_bytes, NULL), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(NULL), "mlagen_forward: plan: its context was destroyed");
  assert_int_equal(mlagen_backward(p, &f->t, f->ws, f->sizes.workspace_bytes, f->saved,
                                   f->sizes.saved_bytes, NULL), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(NULL), "mlagen_backward: plan: its context was destroyed");
  mlagen_plan_destroy(p);
  /* the fixture's plan, in its live context, is unaffected */
  assert_int_equal(mlagen_plan_sizes(f->plan, &z), 0);
  mlagen_context_destroy(c2);
  mlagen_plan_destroy(NULL);
  mlagen_model_destroy(NULL);
}

/* ---- the fake driver ------------------------------------------------------------------- */

static void test_loader_resolves_every_entry(void **state) {
  (void)state;
  const mg_driver *drv = NULL;
  mg_diag d = MG_DIAG_INIT;
  if (mg_driver_get(&drv, &d)) fail_msg("%s", mg_diag_msg(&d));
  assert_non_null(drv);
  assert_string_equal(drv->path, MLAGEN_FAKE_CUDA);
  assert_int_equal(drv->driver_version, 13000);
  int n = 0;
  for (int i = 0; i < MG_DRIVER_N_ENTRIES; i++) {
    void *fn = NULL;
    const char *name = mg_driver_entry(drv, i, &fn);
    assert_non_null(name);
    if (!fn) fail_msg("entry %s was not resolved", name);
    n++;
  }
  assert_int_equal(n, 37);
  assert_null(mg_driver_entry(drv, MG_DRIVER_N_ENTRIES, NULL));
  /* through the table */
  char name[64];
  CUdevice dev;
  int count = 0, major = 0;
  assert_int_equal(drv->cuDeviceGetCount(&count), CUDA_SUCCESS);
  assert_int_equal(count, 1);
  assert_int_equal(drv->cuDeviceGet(&dev, 0), CUDA_SUCCESS);
  assert_int_equal(drv->cuDeviceGetName(name, (int)sizeof name, dev), CUDA_SUCCESS);
  assert_string_equal(name, "Fake H200");
  assert_int_equal(drv->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                             dev), CUDA_SUCCESS);
  assert_int_equal(major, 9);
  CUdeviceptr p;
  assert_int_equal(drv->cuMemAlloc(&p, 64), CUDA_SUCCESS);
  int v = 42, back = 0;
  assert_int_equal(drv->cuMemcpyHtoD(p, &v, sizeof v), CUDA_SUCCESS);
  assert_int_equal(drv->cuMemcpyDtoH(&back, p, sizeof back), CUDA_SUCCESS);
  assert_int_equal(back, 42);
  assert_int_equal(drv->cuMemFree(p), CUDA_SUCCESS);
  /* a failed CUresult in words */
  assert_int_equal(mg_driver_check(drv, CUDA_ERROR_NO_DEVICE, MLAGEN_ENODRIVER, "probe", &d),
                   MLAGEN_ENODRIVER);
  assert_contains(mg_diag_msg(&d), "probe: CUDA_ERROR_NO_DEVICE (no CUDA-capable device");
  assert_int_equal(mg_driver_check(drv, CUDA_SUCCESS, MLAGEN_ENODRIVER, "probe", &d), 0);
  mg_diag_clear(&d);
  /* the same table every time */
  const mg_driver *again = NULL;
  assert_int_equal(mg_driver_get(&again, NULL), 0);
  assert_ptr_equal(again, drv);
}

static void test_device_info_fake(void **state) {
  fx *f = *state;
  mlagen_device_info info;
  if (mlagen_get_device_info(f->ctx, 0, &info)) fail_msg("%s", mlagen_last_message(f->ctx));
  assert_string_equal(info.name, "Fake H200");
  assert_int_equal(info.driver_version, 13000);
  assert_int_equal(info.device_count, 1);
  assert_int_equal(info.cc_major, 9);
  assert_int_equal(info.cc_minor, 0);
  assert_int_equal(info.sm_count, 132);
  assert_int_equal(mlagen_get_device_info(f->ctx, 1, &info), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(f->ctx), "device = 1 is not in [0, 1)");
  assert_int_equal(mlagen_get_device_info(f->ctx, 0, NULL), MLAGEN_EINVAL);
  assert_int_equal(mlagen_get_device_info(NULL, 0, &info), MLAGEN_EINVAL);
}

static void test_forward_fake(void **state) {
  fx *f = *state;
  assert_int_equal(fwd(f), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(f->ctx), "mlagen_forward: the plan spans sp_size = 8 ranks");
  assert_contains(mlagen_last_message(f->ctx), "mlagen_plan_set_comm");
  assert_int_equal(bwd(f), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(f->ctx), "mlagen_backward: the plan spans sp_size = 8 ranks");
  /* with a communicator: NCCL is loaded (dlopen) to wrap it; here MLAGEN_LIBNCCL names a
   * file that does not exist (test_nccl_dl runs a fake NCCL) */
  assert_int_equal(mlagen_plan_set_comm(f->plan, (void *)(uintptr_t)0x1000), 0);
  assert_int_equal(fwd(f), MLAGEN_ENONCCL);
  assert_contains(mlagen_last_message(f->ctx), "sp_size = 8");
  assert_contains(mlagen_last_message(f->ctx), "/nonexistent/libnccl.so.2 not found: ");
  /* arguments are still checked first */
  f->t.q.dims[0] = 2;
  expect_einval(f, 0, "tensors->q.dims[0] = 2, the plan expects 1");
}

static void test_fake_cuinit_fails(void **state) {
  fx *f = *state;
  const mg_driver *drv;
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(mg_driver_get(&drv, &d), MLAGEN_ENODRIVER);
  assert_contains(mg_diag_msg(&d), "no CUDA driver: cuInit failed: CUDA_ERROR_NO_DEVICE");
  mg_diag_clear(&d);
  assert_int_equal(fwd(f), MLAGEN_ENODRIVER);
  assert_contains(mlagen_last_message(f->ctx), "cuInit failed: CUDA_ERROR_NO_DEVICE");
}

/* Packed sequences (mlagen_plan_desc.varlen): batch other than 1 refused; the sizes are
 * THD (the [B, S_l, ...] tensors without their batch dim, the same bytes as the batch-1
 * plan's), w_kv_b and dw_kv_b unchanged; the tensor checks expect the THD shapes; the
 * pass's cu_seqlens checked before the driver, errors naming the first bad index; a plan
 * that is not varlen refuses them. (The numerics: test_api_cpu's test_varlen_*.) */
static void test_varlen_plan(void **state) {
  (void)state;
  mlagen_context *c;
  mlagen_model *m;
  assert_int_equal(mlagen_context_create(&c), 0);
  assert_int_equal(mlagen_model_from_config(c, "deepseek-v2-lite", &m), 0);
  const mlagen_form forms[] = {MLAGEN_FORM_LAGA, MLAGEN_FORM_LAGA_CP};
  for (int k = 0; k < 2; k++) {
    mlagen_plan_desc d = {.form = forms[k], .batch = 2, .seq = 64, .sp_rank = 1, .sp_size = 2,
                          .causal = 1, .dtype = MLAGEN_DTYPE_BF16, .varlen = 1};
    mlagen_plan *p = (mlagen_plan *)&d;
    assert_int_equal(mlagen_plan_create(c, m, &d, &p), MLAGEN_EINVAL);
    assert_null(p);
    assert_contains(mlagen_last_message(c), "mlagen_plan_create: plan_desc->batch = 2");
    d.batch = 1;
    if (mlagen_plan_create(c, m, &d, &p)) fail_msg("%s", mlagen_last_message(c));
    mlagen_plan_desc dense = d;
    dense.varlen = 0;
    mlagen_plan *pd;
    assert_int_equal(mlagen_plan_create(c, m, &dense, &pd), 0);
    mlagen_sizes z, zd;
    assert_int_equal(mlagen_plan_sizes(p, &z), 0);
    assert_int_equal(mlagen_plan_sizes(pd, &zd), 0);
    /* T_cap / P = 32 token rows; H 16, d_n + d_r 192, d_v 128, d_c 512, d_r 64 */
    const struct { const mlagen_tensor_info *got, *dense; int ndim; int64_t dims[3]; } want[] = {
        {&z.q, &zd.q, 3, {32, 16, 192}},     {&z.c_kv, &zd.c_kv, 2, {32, 512}},
        {&z.k_rope, &zd.k_rope, 2, {32, 64}}, {&z.o, &zd.o, 3, {32, 16, 128}},
        {&z.d_o, &zd.d_o, 3, {32, 16, 128}}, {&z.dq, &zd.dq, 3, {32, 16, 192}},
        {&z.dc_kv, &zd.dc_kv, 2, {32, 512}}, {&z.dk_rope, &zd.dk_rope, 2, {32, 64}},
        {&z.w_kv_b, &zd.w_kv_b, 2, {16 * 256, 512}}, {&z.dw_kv_b, &zd.dw_kv_b, 2, {16 * 256, 512}}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
      const mlagen_tensor_info *t = want[i].got;
      if (t->ndim != want[i].ndim)
        fail_msg("%s: ndim %d, expected %d", t->name, t->ndim, want[i].ndim);
      for (int j = 0; j < MLAGEN_MAX_DIMS; j++)
        if (t->dims[j] != (j < 3 ? want[i].dims[j] : 0))
          fail_msg("%s: dims[%d] = %lld, expected %lld", t->name, j, (long long)t->dims[j],
                   (long long)(j < 3 ? want[i].dims[j] : 0));
      assert_int_equal(t->bytes, want[i].dense->bytes); /* the same memory as batch 1 */
      assert_int_equal(t->dtype, want[i].dense->dtype);
      assert_int_equal(t->passes, want[i].dense->passes);
      assert_string_equal(t->name, want[i].dense->name);
    }

    /* the pass's checks (no driver: a pass that gets past them says so) */
    fx f = {.ctx = c, .model = m, .plan = p, .sizes = z};
    fill_tensors(&f.t, &z);
    f.ws = FAKE_WS;
    f.saved = FAKE_SAVED;
    int32_t cu[] = {0, 5, 5, 40, 41, 60};
    f.t.cu_seqlens = cu, f.t.n_cu_seqlens = 6;
    assert_int_equal(fwd(&f), MLAGEN_ENODRIVER);
    assert_int_equal(bwd(&f), MLAGEN_ENODRIVER);
    f.t.n_cu_seqlens = 1; /* no document: every row slack */
    assert_int_equal(fwd(&f), MLAGEN_ENODRIVER);
    const struct { int at; int32_t v; int64_t n; const char *says; } bad[] = {
        {0, 1, 6, "mlagen_forward: tensors->cu_seqlens[0] = 1, the first boundary must be 0"},
        {3, 4, 6, "mlagen_forward: tensors->cu_seqlens[3] = 4 is below tensors->cu_seqlens[2] = 5"},
        {5, 65, 6, "mlagen_forward: tensors->cu_seqlens[5] = 65 is past the plan's token capacity 64"},
        {1, 5, 0, "mlagen_forward: tensors->cu_seqlens needs at least one entry"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
      int32_t mine[6];
      memcpy(mine, cu, sizeof cu);
      mine[bad[i].at] = bad[i].v;
      f.t.cu_seqlens = mine, f.t.n_cu_seqlens = bad[i].n;
      assert_int_equal(fwd(&f), MLAGEN_EINVAL);
      assert_contains(mlagen_last_message(c), bad[i].says);
    }
    f.t.cu_seqlens = NULL, f.t.n_cu_seqlens = 6;
    assert_int_equal(bwd(&f), MLAGEN_EINVAL);
    assert_contains(mlagen_last_message(c), "mlagen_backward: tensors->cu_seqlens is NULL: the plan "
                    "is for packed sequences");
    /* the batched shapes are refused: the plan expects THD */
    fx fd = {.ctx = c, .model = m, .plan = p, .sizes = z, .ws = f.ws, .saved = f.saved};
    fill_tensors(&fd.t, &zd);
    fd.t.cu_seqlens = cu, fd.t.n_cu_seqlens = 6;
    assert_int_equal(fwd(&fd), MLAGEN_EINVAL);
    assert_contains(mlagen_last_message(c), "tensors->q.ndim = 4, the plan expects 3 (q [32, 16, 192])");
    /* a plan that is not varlen refuses documents */
    fd.plan = pd, fd.sizes = zd;
    assert_int_equal(fwd(&fd), MLAGEN_EINVAL);
    assert_contains(mlagen_last_message(c), "mlagen_forward: tensors->cu_seqlens is set with "
                    "n_cu_seqlens = 6, but the plan is not for packed sequences");
    fd.t.cu_seqlens = NULL;
    assert_int_equal(bwd(&fd), MLAGEN_EINVAL);
    assert_contains(mlagen_last_message(c), "tensors->cu_seqlens is NULL with n_cu_seqlens = 6");
    fd.t.n_cu_seqlens = 0;
    assert_int_equal(bwd(&fd), MLAGEN_ENODRIVER);
    mlagen_plan_destroy(p);
    mlagen_plan_destroy(pd);
  }
  mlagen_model_destroy(m);
  mlagen_context_destroy(c);
}

/* mlagen_token_position: a caller's shard, contiguous for the Ulysses forms and two chunks
 * under MLAGEN_FORM_LAGA_CP (rank 1 of 4, S 16: chunks 1 and 6 of 8; S 12: a = 2, b = 1),
 * and its refusals. */
static void test_token_position(void **state) {
  (void)state;
  mlagen_plan_desc d = {.form = MLAGEN_FORM_LAGA_CP, .seq = 16, .sp_rank = 1, .sp_size = 4};
  const int64_t want16[] = {2, 3, 12, 13}, want12[] = {2, 3, 10}; /* S 12: 8 .. 11 are ranks 3 .. 0 */
  int64_t pos = -1;
  for (int64_t i = 0; i < 4; i++) {
    assert_int_equal(mlagen_token_position(&d, i, &pos), 0);
    assert_int_equal(pos, want16[i]);
  }
  d.seq = 12;
  for (int64_t i = 0; i < 3; i++) {
    assert_int_equal(mlagen_token_position(&d, i, &pos), 0);
    assert_int_equal(pos, want12[i]);
  }
  d.form = MLAGEN_FORM_LAGA;
  for (int64_t i = 0; i < 3; i++) {
    assert_int_equal(mlagen_token_position(&d, i, &pos), 0);
    assert_int_equal(pos, 3 + i);
  }
  assert_int_equal(mlagen_token_position(&d, 3, &pos), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(NULL), "row 3 is outside [0, seq / sp_size = 3)");
  d.seq = 10;
  assert_int_equal(mlagen_token_position(&d, 0, &pos), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(NULL), "seq = 10 is not a positive multiple of sp_size = 4");
  d.seq = 12, d.sp_rank = 4;
  assert_int_equal(mlagen_token_position(&d, 0, &pos), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(NULL), "sp_rank = 4, sp_size = 4");
  d.sp_rank = 0, d.form = (mlagen_form)0;
  assert_int_equal(mlagen_token_position(&d, 0, &pos), MLAGEN_EINVAL);
  assert_contains(mlagen_last_message(NULL), "form = 0 is not an mlagen_form");
  assert_int_equal(mlagen_token_position(NULL, 0, &pos), MLAGEN_EINVAL);
  assert_int_equal(mlagen_token_position(&d, 0, NULL), MLAGEN_EINVAL);
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "nodriver";
  if (strcmp(mode, "nodriver") == 0) {
    fake_driver_use(NULL);
    const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_status_strings),
      cmocka_unit_test(test_context),
      cmocka_unit_test(test_model_from_config),
      cmocka_unit_test(test_model_from_desc),
      cmocka_unit_test(test_sizes_equal_planner),
      cmocka_unit_test(test_plan_create_errors),
      cmocka_unit_test(test_token_position),
      cmocka_unit_test(test_varlen_plan),
      cmocka_unit_test_setup_teardown(test_nodriver, setup_laga, teardown_fx),
      cmocka_unit_test_setup_teardown(test_bad_arguments, setup_laga, teardown_fx),
      cmocka_unit_test_setup_teardown(test_plan_after_context, setup_laga, teardown_fx),
    };
    return cmocka_run_group_tests_name("api (no driver)", tests, NULL, NULL);
  }
  fake_driver_use(MLAGEN_FAKE_CUDA);
  setenv("MLAGEN_LIBNCCL", "/nonexistent/libnccl.so.2", 1); /* not the machine's NCCL */
  if (strcmp(mode, "fake") == 0) {
    const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_loader_resolves_every_entry),
      cmocka_unit_test_setup_teardown(test_device_info_fake, setup_laga, teardown_fx),
      cmocka_unit_test_setup_teardown(test_forward_fake, setup_laga, teardown_fx),
      cmocka_unit_test_setup_teardown(test_bad_arguments, setup_laga, teardown_fx),
    };
    return cmocka_run_group_tests_name("api (fake driver)", tests, NULL, NULL);
  }
  if (strcmp(mode, "fake-noinit") == 0) {
    setenv("FAKE_CUDA_FAIL_INIT", "1", 1);
    const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_fake_cuinit_fails, setup_laga, teardown_fx),
    };
    return cmocka_run_group_tests_name("api (fake driver, cuInit fails)", tests, NULL, NULL);
  }
  fprintf(stderr, "usage: test_api nodriver|fake|fake-noinit\n");
  return 2;
}
