/* test_cuda_exec.c: the CUDA executor (runtime/mg_cuda_exec.h) on CPU device operations.
 *
 * The executor's orchestration (memory layout in the caller's workspace and saved area,
 * collectives, GEMMs, every generated kernel with its parameters matched by name and its
 * manifest's grid) runs every form's bf16 plan (P = 1) forward and backward with device
 * ops that work on host memory: memset/copy/copy2d by memset/memcpy, GEMMs by CBLAS on
 * f32 copies of the bf16 operands (C in f32 or rounded back to bf16), launches through the
 * host executor (tests/host/): each generated kernel's source gets an appended
 * extern "C" <name>__launch(void **p) that calls the kernel with *(T *)p[i] per manifest
 * parameter, as cuLaunchKernel passes kernelParams. Collectives at P = 1 are copies.
 *
 * Checked against the CPU executor (runtime/mg_cpu_exec.h) on the f32 plan of the same
 * form with the same (bf16-rounded) inputs: o and lse (read from the saved area) within
 * 1e-2, dq, dc_kv, dk_rope and dw_kv_b within 2e-2 (max |a - b| / max |b|), no NaN. The
 * workspace (and, before the forward, the saved area and the outputs) is filled with NaN
 * before each pass, so a buffer read before it is written shows. Shapes (d_n, d_r, d_v,
 * d_c, H): (128, 64, 128, 512, 2) and (64, 32, 64, 256, 2); B 2, S 33 and 1, causal and
 * not; every form (laga-f in its default 2 groups of 1 head).
 *
 * Modes (argv[1]): none, the above; "nodriver": mg_dev_ops_cuda without a driver is
 * MLAGEN_ENODRIVER; "fake": with the fake driver (tests/fake_cuda.c, MLAGEN_LIBCUDA) and
 * MLAGEN_LIBCUBLAS pointing nowhere, mg_dev_ops_cuda and mlagen_forward fail cleanly with
 * MLAGEN_EDRIVER naming cuBLAS. MLAGEN_TEST_SEED overrides the seed. */
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

#include "cpu_test_util.h"
#include "host/harness.h"
#include "mg_cpu_exec.h"
#include "mg_cuda_exec.h"
#include "mg_generate.h"
#include "mg_module.h"
#include "mg_safetensors.h"
#include "mlagen.h"

typedef uint16_t e16;
static uint64_t g_seed = 20260529;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- CPU device ops ----------------------------------------------------------------------- */

typedef struct host_kernel {
  mg_host_kernel *k;
  void (*fn)(void **);
  char name[160];
} host_kernel;

#define MAX_HOST_KERNELS 128

typedef struct host_ops {
  mg_dev_ops base;
  mg_gen *gen;
  host_kernel ks[MAX_HOST_KERNELS];
  int n, builds;
  long launches, gemms, copies;
} host_ops;

/* The kernel's source with an appended launcher taking cuLaunchKernel's kernelParams. */
static char *with_launcher(const mg_kernel *k, size_t *len) {
  const cJSON *params = cJSON_GetObjectItemCaseSensitive(k->manifest, "params"), *it;
  size_t cap = k->source_len + 4096, n = k->source_len;
  char *s = malloc(cap);
  if (!s) return NULL;
  memcpy(s, k->source, k->source_len);
  n += (size_t)snprintf(s + n, cap - n, "\nextern \"C\" void %s__launch(void **p) {\n  %s(", k->name,
                        k->name);
  int i = 0;
  cJSON_ArrayForEach(it, params) {
    const char *type = cJSON_GetObjectItemCaseSensitive(it, "type")->valuestring;
    n += (size_t)snprintf(s + n, cap - n, "%s*(%s *)p[%d]", i ? ", " : "", type, i);
    i++;
  }
  n += (size_t)snprintf(s + n, cap - n, ");\n}\n");
  *len = n;
  return s;
}

static int h_load(mg_dev_ops *o, const mg_kernel *k, const struct mg_launch_rule *rule,
                  void **handle, mg_diag *d) {
  (void)rule;
  host_ops *h = (host_ops *)o;
  for (int i = 0; i < h->n; i++)
    if (!strcmp(h->ks[i].name, k->name)) {
      *handle = &h->ks[i];
      return 0;
    }
  if (h->n == MAX_HOST_KERNELS) return mg_diag_set(d, MLAGEN_ELIMIT, "too many kernels");
  int n_hdr;
  const mg_jit_header *hdr = mg_gen_headers(h->gen, &n_hdr);
  mg_host_file files[8];
  for (int i = 0; i < n_hdr && i < 8; i++)
    files[i] = (mg_host_file){hdr[i].name, hdr[i].data, hdr[i].size};
  mg_host_build_opts bo;
  memset(&bo, 0, sizeof bo);
  bo.host_dir = MLAGEN_TESTS_DIR "/host";
  bo.cxx = MLAGEN_CXX;
  bo.cuda_include = MLAGEN_CUDA_INCLUDE;
  bo.headers = files;
  bo.n_headers = n_hdr < 8 ? n_hdr : 8;
  size_t len;
  char *src = with_launcher(k, &len);
  if (!src) return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
  host_kernel *e = &h->ks[h->n];
  memset(e, 0, sizeof *e);
  char msg[4096];
  double t0 = now();
  int rc = mg_host_kernel_build(src, len, k->file, k->name, &bo, &e->k, msg, sizeof msg);
  free(src);
  if (rc) return mg_diag_set(d, MLAGEN_ECOMPILE, "host build of %s: %s", k->name, msg);
  if (now() - t0 > 0.05) print_message("  built %s (%.1f s)\n", k->name, now() - t0);
  char sym[200];
  snprintf(sym, sizeof sym, "%s__launch", k->name);
  void *fn = mg_host_kernel_sym(e->k, sym);
  if (!fn) {
    mg_host_kernel_free(e->k);
    return mg_diag_set(d, MLAGEN_EINVAL, "%s not found in the built kernel", sym);
  }
  memcpy(&e->fn, &fn, sizeof fn);
  snprintf(e->name, sizeof e->name, "%s", k->name);
  h->n++, h->builds++;
  *handle = e;
  return 0;
}

typedef struct lctx {
  void (*fn)(void **);
  void **params;
} lctx;

static void thunk(void *c) {
  lctx *l = c;
  l->fn(l->params);
}

static int h_launch(mg_dev_ops *o, void *handle, const unsigned grid[3], const unsigned block[3],
                    size_t smem, void **params, void *stream, mg_diag *d) {
  (void)stream;
  host_ops *h = (host_ops *)o;
  host_kernel *e = handle;
  lctx l = {e->fn, params};
  char msg[1024];
  mg_host_dim3 g = {grid[0], grid[1], grid[2]}, b = {block[0], block[1], block[2]};
  h->launches++;
  if (mg_host_kernel_launch(e->k, g, b, smem, NULL, thunk, &l, msg, sizeof msg))
    return mg_diag_set(d, MLAGEN_EDRIVER, "host launch of %s: %s", e->name, msg);
  return 0;
}

static int h_memset(mg_dev_ops *o, void *dst, int value, size_t bytes, void *stream, mg_diag *d) {
  (void)o, (void)stream, (void)d;
  memset(dst, value, bytes);
  return 0;
}

static int h_copy(mg_dev_ops *o, void *dst, const void *src, size_t bytes, void *stream,
                  mg_diag *d) {
  (void)stream, (void)d;
  ((host_ops *)o)->copies++;
  memcpy(dst, src, bytes);
  return 0;
}

static int h_copy2d(mg_dev_ops *o, void *dst, size_t dpitch, const void *src, size_t spitch,
                    size_t width, size_t height, void *stream, mg_diag *d) {
  (void)stream, (void)d;
  ((host_ops *)o)->copies++;
  for (size_t r = 0; r < height; r++)
    memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
  return 0;
}

/* n elements of a bf16 or f32 buffer from element off, as f32. */
static float *as_f32(mg_dtype t, const void *base, int64_t off, int64_t n) {
  float *y = malloc((size_t)n * sizeof *y);
  assert_non_null(y);
  for (int64_t i = 0; i < n; i++)
    y[i] = t == MG_F32 ? ((const float *)base)[off + i] : mg_st_bf16_to_f32(((const e16 *)base)[off + i]);
  return y;
}

static int h_gemm(mg_dev_ops *o, const mg_gemm *g, mg_dtype ta, const void *A, mg_dtype tb,
                  const void *B, mg_dtype tc, void *C, void *stream, mg_diag *d) {
  (void)stream;
  ((host_ops *)o)->gemms++;
  if (ta != MG_BF16 || tb != MG_BF16 || (tc != MG_BF16 && tc != MG_F32))
    return mg_diag_set(d, MLAGEN_EINVAL, "host gemm: dtypes %d %d %d", ta, tb, tc);
  const int64_t ra = g->trans_a ? g->k : g->m, ca = g->trans_a ? g->m : g->k;
  const int64_t rb = g->trans_b ? g->n : g->k, cb = g->trans_b ? g->k : g->n;
  const int64_t na = (g->batch - 1) * g->stride_a + (ra - 1) * g->lda + ca;
  const int64_t nb = (g->batch - 1) * g->stride_b + (rb - 1) * g->ldb + cb;
  const int64_t nc = (g->batch - 1) * g->stride_c + (g->m - 1) * g->ldc + g->n;
  float *a = as_f32(ta, A, g->off_a, na), *b = as_f32(tb, B, g->off_b, nb);
  float *c = tc == MG_F32 ? (float *)C + g->off_c : as_f32(tc, C, g->off_c, nc);
  for (int i = 0; i < g->batch; i++)
    cblas_sgemm(CblasRowMajor, g->trans_a ? CblasTrans : CblasNoTrans,
                g->trans_b ? CblasTrans : CblasNoTrans, (int)g->m, (int)g->n, (int)g->k, 1.0f,
                a + i * g->stride_a, (int)g->lda, b + i * g->stride_b, (int)g->ldb, g->beta,
                c + i * g->stride_c, (int)g->ldc);
  if (tc != MG_F32) {
    for (int64_t i = 0; i < nc; i++) ((e16 *)C)[g->off_c + i] = mg_st_f32_to_bf16(c[i]);
    free(c);
  }
  free(a), free(b);
  return 0;
}

static int h_query(mg_dev_ops *o, void *stream, int *done, mg_diag *d) {
  (void)o, (void)stream, (void)d;
  *done = 1;
  return 0;
}

static void h_destroy(mg_dev_ops *o) {
  host_ops *h = (host_ops *)o;
  for (int i = 0; i < h->n; i++) mg_host_kernel_free(h->ks[i].k);
  free(h);
}

static host_ops *host_ops_new(mg_gen *gen) {
  host_ops *h = calloc(1, sizeof *h);
  assert_non_null(h);
  h->base = (mg_dev_ops){.name = "host", .load = h_load, .launch = h_launch, .memset = h_memset,
                         .copy = h_copy, .copy2d = h_copy2d, .gemm = h_gemm, .query = h_query,
                         .destroy = h_destroy};
  h->gen = gen;
  return h;
}

/* ---- one form on one case ---------------------------------------------------------------- */

static double g_worst[TU_N_OUT];

static void *aligned(size_t bytes) {
  size_t n = (bytes + 255) / 256 * 256;
  void *p = aligned_alloc(256, n ? n : 256);
  assert_non_null(p);
  return p;
}

static e16 *to_bf16(const double *x, int64_t n) {
  e16 *y = malloc((size_t)n * sizeof *y);
  assert_non_null(y);
  for (int64_t i = 0; i < n; i++) y[i] = mg_st_f32_to_bf16((float)x[i]);
  return y;
}

static void check_form(const tu_case *c, mg_form f, double *const in[TU_N_IN], host_ops *h,
                       mg_gen *gen) {
  mg_diag d = MG_DIAG_INIT;
  tu_run ref;
  if (tu_run_form(c, f, 1, 0, NULL, MG_F32, in, &ref, &d)) fail_msg("reference: %s", mg_diag_msg(&d));

  mg_plan *plan = calloc(1, sizeof *plan);
  assert_non_null(plan);
  mg_plan_args a = {.shape = &c->shape, .form = f, .sp = 1, .rank = 0, .batch = c->B,
                    .seq = c->S, .causal = c->causal, .dtype = MG_BF16};
  if (mg_plan_build(plan, &a, &d)) fail_msg("%s", mg_diag_msg(&d));
  mg_cuda_exec *x;
  mg_cuda_exec_opts eo = {.gen = gen};
  double t0 = now();
  if (mg_cuda_exec_prepare(plan, &h->base, &eo, &x, &d)) fail_msg("prepare: %s", mg_diag_msg(&d));
  const double t_prep = now() - t0;

  const size_t ws_b = (size_t)mg_cuda_exec_workspace_bytes(x), sv_b = (size_t)mg_cuda_exec_saved_bytes(x);
  void *ws = aligned(ws_b), *saved = aligned(sv_b);
  e16 *inb[TU_N_IN];
  for (int k = 0; k < TU_N_IN; k++) inb[k] = to_bf16(in[k], tu_in_numel(c, k));
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
  if (mg_cuda_exec_run(x, MG_FWD, &t, ws, ws_b, saved, sv_b, NULL, NULL, &d))
    fail_msg("forward: %s", mg_diag_msg(&d));
  memset(ws, 0xff, ws_b);
  if (mg_cuda_exec_run(x, MG_BWD, &t, ws, ws_b, saved, sv_b, NULL, NULL, &d))
    fail_msg("backward: %s", mg_diag_msg(&d));
  const double t_run = now() - t0;
  const float *lse = mg_cuda_exec_buffer(x, "lse", ws, saved);
  assert_non_null(lse); /* every form saves its LSE */

  double e[TU_N_OUT];
  size_t nans = 0;
  for (int k = 0; k < TU_N_OUT; k++) {
    const int64_t n = tu_out_numel(c, k);
    const void *got = k == TU_LSE ? lse : outs[k];
    const float *want = tu_out_ptr(&ref, k);
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
      double g = k == TU_LSE || k == TU_DW ? ((const float *)got)[i]
                                           : mg_st_bf16_to_f32(((const e16 *)got)[i]);
      double w = want[i];
      if (isnan(g) || isnan(w)) {
        nans++;
        continue;
      }
      if (isinf(w) && g == w) continue; /* a row without keys: -inf LSE in both */
      num = fmax(num, fabs(g - w));
      den = fmax(den, fabs(w));
    }
    e[k] = den > 0 ? num / den : num;
    if (nans) e[k] = INFINITY;
    if (e[k] > g_worst[k]) g_worst[k] = e[k];
  }
  print_message("  %-8s dn %3lld S %2lld %-10s o %.1e lse %.1e dq %.1e dc_kv %.1e dk_rope %.1e "
                "dw_kv_b %.1e  (%d kernels, %ld launches; prepare %.1f s, run %.1f s)\n",
                mg_form_name(f), (long long)c->shape.qk_nope_head_dim, (long long)c->S,
                c->causal ? "causal" : "non-causal", e[TU_O], e[TU_LSE], e[TU_DQ], e[TU_DCKV],
                e[TU_DKROPE], e[TU_DW], mg_cuda_exec_kernel_count(x), h->launches - l0, t_prep,
                t_run);
  if (nans) fail_msg("%s: %zu NaN outputs", mg_form_name(f), nans);
  for (int k = 0; k < TU_N_OUT; k++) {
    const double tol = k == TU_O || k == TU_LSE ? 1e-2 : 2e-2;
    if (!(e[k] < tol))
      fail_msg("%s: %s relative error %.3e over %.0e", mg_form_name(f), tu_out_names[k], e[k], tol);
  }
  mg_cuda_exec_destroy(x);
  for (int k = 0; k < TU_N_IN; k++) free(inb[k]);
  for (int k = 0; k < TU_N_OUT; k++) free(outs[k]);
  free(ws), free(saved), free(plan);
  tu_run_free(&ref);
}

static void check_shape(int dn, int dr, int dv, int dc) {
  mg_diag d = MG_DIAG_INIT;
  mg_gen *g;
  assert_int_equal(mg_gen_open(&g, NULL, &d), 0);
  host_ops *h = host_ops_new(g);
  for (int causal = 1; causal >= 0; causal--) {
    tu_case c = {.shape = tu_shape(2, dn, dr, dv, dc), .B = 2, .causal = causal};
    const int64_t seqs[2] = {33, 1};
    for (int si = 0; si < 2; si++) {
      c.S = seqs[si];
      double *in[TU_N_IN] = {0};
      assert_int_equal(tu_inputs(&c, g_seed + (uint64_t)(si * 2 + causal), in), 0);
      for (int k = 0; k < TU_N_IN; k++) /* bf16 values, so both runs see the same inputs */
        for (int64_t i = 0; i < tu_in_numel(&c, k); i++)
          in[k][i] = mg_st_bf16_to_f32(mg_st_f32_to_bf16((float)in[k][i]));
      for (int f = 0; f < MG_FORM_COUNT; f++) check_form(&c, (mg_form)f, in, h, g);
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
  check_shape(128, 64, 128, 512);
}

static void test_unusual_heads(void **state) {
  (void)state;
  check_shape(64, 32, 64, 256);
}

/* Refusals: an f32 plan; a workspace too small; a NULL tensor the pass reads. */
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
  free(ws), free(saved), free(plan);
  mg_dev_ops_destroy(&h->base);
  mg_gen_close(g);
  mg_diag_clear(&d);
}

static int report_worst(void **state) {
  (void)state;
  printf("worst relative errors: o %.2e lse %.2e dq %.2e dc_kv %.2e dk_rope %.2e dw_kv_b %.2e\n",
         g_worst[TU_O], g_worst[TU_LSE], g_worst[TU_DQ], g_worst[TU_DCKV], g_worst[TU_DKROPE],
         g_worst[TU_DW]);
  return 0;
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
  assert_int_equal(mlagen_context_create(&ctx), 0);
  mlagen_model_desc md = {.num_attention_heads = 2, .kv_lora_rank = 256, .qk_rope_head_dim = 32,
                          .qk_nope_head_dim = 64, .v_head_dim = 64};
  assert_int_equal(mlagen_model_from_desc(ctx, &md, &model), 0);
  mlagen_plan_desc pd = {.form = MLAGEN_FORM_LAGA, .batch = 1, .seq = 8, .sp_rank = 0,
                         .sp_size = 1, .causal = 1, .dtype = MLAGEN_DTYPE_BF16};
  assert_int_equal(mlagen_plan_create(ctx, model, &pd, &plan), 0);
  mlagen_sizes z;
  assert_int_equal(mlagen_plan_sizes(plan, &z), 0);
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
  mlagen_plan_destroy(plan);
  mlagen_model_destroy(model);
  mlagen_context_destroy(ctx);
}

int main(int argc, char **argv) {
  const char *env = getenv("MLAGEN_TEST_SEED");
  if (env) g_seed = strtoull(env, NULL, 10);
  if (argc > 1 && !strcmp(argv[1], "nodriver")) {
    setenv("MLAGEN_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_nodriver)};
    return cmocka_run_group_tests(tests, NULL, NULL);
  }
  if (argc > 1 && !strcmp(argv[1], "fake")) {
    setenv("MLAGEN_LIBCUBLAS", "/nonexistent/libcublas.so", 1);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fake_driver)};
    return cmocka_run_group_tests(tests, NULL, NULL);
  }
  printf("MLAGEN_TEST_SEED=%llu\n", (unsigned long long)g_seed);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_unusual_heads),
      cmocka_unit_test(test_deepseek_heads),
  };
  return cmocka_run_group_tests(tests, NULL, report_worst);
}
