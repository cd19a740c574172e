/* test_ktime.c: the GPU timing path of `mlagen tune` (generator/cli/mg_ktime.c) against the fake
 * driver (tests/fake_cuda.c), which runs no kernel: its launches advance a fake clock by
 * 0.001 ms per CTA thread (times 1 + 0.1 (launch mod 4)), its events stamp that clock.
 *
 * Two modes, one per process (the driver is loaded once per process), chosen by the first
 * argument; each sets MLAGEN_LIBCUDA before any call:
 *   fake      (default) argument sizes from the manifests (copy_cols, attn_fwd both key
 *             layouts, a2a_pack), reference specs, the device description; copy_cols and
 *             attn_fwd (a small shape) timed, and attn_fwd_sm90 with its tensor maps
 *             encoded per launch: samples, percentiles, every buffer, event,
 *             stream and module released; a launch failure -> failed-launch; outputs
 *             changed through the test seam -> wrong-result (a difference, a NaN); last, a
 *             fault at execution -> failed-launch, then every call MG_EDRIVER.
 *   nodriver  MLAGEN_LIBCUDA names no file: mg_ktime_run and mg_ktime_describe are
 *             MLAGEN_ENODRIVER.
 * Cubins are fake images ("FAKECUBIN\n<name>\n"), so no NVRTC is needed. */
#define _DEFAULT_SOURCE 1 /* mkdtemp */
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
#include "mg_generate.h"
#include "mg_ktime.h"
#include "mg_safetensors.h"
#include "mg_tune.h"
#include "mlagen.h"
#include "test_assert.h"

static fake_cuda fake; /* the fake driver's test hooks */

/* ---- kernels: rendered by the generator, with fake cubins ------------------------------ */
static mg_gen *g_gen;

typedef struct tk {
  mg_kernel k;
  mg_cubin c;
  char image[256];
} tk;

static mg_kernel_spec spec_of(const char *family, int heads, const char *set1, const char *set2) {
  mg_kernel_spec s;
  memset(&s, 0, sizeof s);
  snprintf(s.family, sizeof s.family, "%s", family);
  s.heads = heads, s.d_n = 128, s.d_r = 64, s.d_v = 128, s.d_c = 512, s.causal = 1;
  snprintf(s.dtype, sizeof s.dtype, "bf16");
  mg_diag d = MG_DIAG_INIT;
  if (set1 && mg_spec_set(&s, set1, &d)) fail_msg("%s", mg_diag_msg(&d));
  if (set2 && mg_spec_set(&s, set2, &d)) fail_msg("%s", mg_diag_msg(&d));
  return s;
}

static void make(tk *t, const mg_kernel_spec *s) {
  memset(t, 0, sizeof *t);
  mg_diag d = MG_DIAG_INIT;
  if (mg_gen_kernel(g_gen, s, &t->k, &d)) fail_msg("generate %s: %s", s->family, mg_diag_msg(&d));
  snprintf(t->image, sizeof t->image, "FAKECUBIN\n%s\n", t->k.name);
  t->c.data = t->image;
  t->c.size = strlen(t->image) + 1;
}

static void unmake(tk *t) { mg_kernel_free(&t->k); }

/* Live buffers, events, streams, modules: all back to the start after every call. */
typedef struct live { int allocs, events, streams, modules; } live;
static live live_now(void) {
  live l = {fake.count("live_allocs"), fake.count("live_events"), fake.count("live_streams"),
            fake.count("live_modules")};
  return l;
}
static void assert_live(live a, live b) {
  assert_int_equal(a.allocs, b.allocs);
  assert_int_equal(a.events, b.events);
  assert_int_equal(a.streams, b.streams);
  assert_int_equal(a.modules, b.modules);
}

/* ---- sizes ----------------------------------------------------------------------------- */
static const mg_karg *arg(const mg_kargs *a, const char *name) {
  for (int i = 0; i < a->n; i++)
    if (strcmp(a->a[i].name, name) == 0) return &a->a[i];
  fail_msg("no argument %s", name);
  return NULL;
}

static void test_args(void **state) {
  (void)state;
  const long long S = 64;
  mg_diag d = MG_DIAG_INIT;
  mg_kargs a;
  tk t;
  /* copy_cols: q[:, h, d_n:] -> q_abs[:, h, d_c:], S * H rows */
  mg_kernel_spec s = spec_of("copy_cols", 16, NULL, NULL);
  make(&t, &s);
  assert_int_equal(mg_ktime_args(&t.k.info, &s, S, &a, &d), 0);
  assert_int_equal(a.n, 8);
  assert_int_equal(arg(&a, "rows")->ival, S * 16);
  assert_int_equal(arg(&a, "src")->kind, MG_KARG_IN);
  assert_int_equal(arg(&a, "src")->count, (size_t)(S * 16 * 192));
  assert_int_equal(arg(&a, "src")->elem_bytes, 2);
  assert_int_equal(arg(&a, "dst")->kind, MG_KARG_OUT);
  assert_int_equal(arg(&a, "dst")->count, (size_t)(S * 16 * 576));
  assert_int_equal(arg(&a, "dst_col")->ival, 512);
  assert_int_equal(arg(&a, "cols")->ival, 64);
  assert_int_equal(a.dims.seqlen_q, S);
  assert_int_equal(a.dims.batch, 1);
  unmake(&t);
  /* attn_fwd, split keys and packed keys */
  s = spec_of("attn_fwd", 2, NULL, NULL);
  make(&t, &s);
  assert_int_equal(mg_ktime_args(&t.k.info, &s, S, &a, &d), 0);
  assert_int_equal(arg(&a, "q")->count, (size_t)(S * 2 * 192));
  assert_int_equal(arg(&a, "k_nope")->count, (size_t)(S * 2 * 128));
  assert_int_equal(arg(&a, "k_rope")->count, (size_t)(S * 64));
  assert_int_equal(arg(&a, "lse")->kind, MG_KARG_OUT);
  assert_int_equal(arg(&a, "lse")->elem_bytes, 4);
  assert_int_equal(arg(&a, "lse")->count, (size_t)(2 * S));
  assert_int_equal(arg(&a, "seqlen_k")->ival, S);
  assert_int_equal(arg(&a, "q_pos0")->ival, 0);
  assert_int_equal(arg(&a, "q_split")->ival, 0);
  assert_int_equal(arg(&a, "q_pos1")->ival, 0);
  assert_int_equal(arg(&a, "softmax_scale")->kind, MG_KARG_FLOAT);
  assert_true(fabsf(arg(&a, "softmax_scale")->fval - (float)(1 / sqrt(192.0))) < 1e-6f);
  unmake(&t);
  s = spec_of("attn_fwd", 2, "k_packed=1", NULL);
  make(&t, &s);
  assert_int_equal(mg_ktime_args(&t.k.info, &s, S, &a, &d), 0);
  assert_int_equal(arg(&a, "k_nope")->count, (size_t)(S * 2 * 192));
  assert_int_equal(arg(&a, "k_rope")->kind, MG_KARG_NULL);
  unmake(&t);
  /* a2a_pack: direction 0 of q, P = 8: src [S/8, 8 H, d_qk], launched over S/8 tokens */
  s = spec_of("a2a_pack", 2, NULL, NULL);
  make(&t, &s);
  assert_int_equal(mg_ktime_args(&t.k.info, &s, S, &a, &d), 0);
  assert_int_equal(arg(&a, "src")->count, (size_t)(S / 8 * 16 * 192));
  assert_int_equal(arg(&a, "send")->count, (size_t)(S / 8 * 16 * 192));
  assert_int_equal(a.dims.seqlen_q, S / 8);
  /* errors */
  assert_int_equal(mg_ktime_args(&t.k.info, &s, 0, &a, &d), MLAGEN_EINVAL);
  mg_diag_clear(&d);
  mg_kernel_info bad;
  memset(&bad, 0, sizeof bad);
  snprintf(bad.name, sizeof bad.name, "k");
  bad.n_params = 1;
  snprintf(bad.params[0].name, sizeof bad.params[0].name, "x");
  bad.params[0].kind = MG_PARAM_INT;
  assert_int_equal(mg_ktime_args(&bad, &s, S, &a, &d), MLAGEN_EINVAL);
  assert_contains(mg_diag_msg(&d), "no value for int parameter 'x'");
  mg_diag_clear(&d);
  snprintf(bad.params[0].bench, sizeof bad.params[0].bench, "S * nope"); /* declared, unknown name */
  assert_int_equal(mg_ktime_args(&bad, &s, S, &a, &d), MLAGEN_EINVAL);
  assert_contains(mg_diag_msg(&d), "bench value 'S * nope'");
  mg_diag_clear(&d);
  bad.params[0].kind = MG_PARAM_OUT;
  bad.params[0].is_f32 = 1;
  snprintf(bad.params[0].shape, sizeof bad.params[0].shape, "[S_q, nope]");
  assert_int_equal(mg_ktime_args(&bad, &s, S, &a, &d), MLAGEN_EINVAL);
  assert_contains(mg_diag_msg(&d), "cannot size shape '[S_q, nope]'");
  mg_diag_clear(&d);
  unmake(&t);
}

/* Every family's default kernel, and its interface variants (the first tunable its
 * kernel{} declares as interface, set to 1), can be sized. */
static void test_args_every_family(void **state) {
  (void)state;
  for (const char *const *f = mg_spec_families; *f; f++) {
    char itf0[32] = "";
    for (int v = 0; v < 2; v++) {
      char set[64];
      snprintf(set, sizeof set, "%s=1", itf0);
      if (v == 1 && !itf0[0]) break;
      mg_kernel_spec s = spec_of(*f, 16, v ? set : NULL, NULL);
      mg_kernel k;
      mg_diag d = MG_DIAG_INIT;
      if (mg_gen_kernel(g_gen, &s, &k, &d)) { /* a variant the template rejects */
        mg_diag_clear(&d);
        continue;
      }
      if (v == 0 && k.info.n_interface) snprintf(itf0, sizeof itf0, "%s", k.info.interface[0]);
      mg_kargs a;
      if (mg_ktime_args(&k.info, &s, 4096, &a, &d)) fail_msg("%s: %s", *f, mg_diag_msg(&d));
      int n_out = 0;
      for (int i = 0; i < a.n; i++) n_out += a.a[i].kind == MG_KARG_OUT;
      if (n_out == 0) fail_msg("%s: no output", *f);
      mg_kernel_free(&k);
    }
  }
}

/* The reference keeps exactly the tunables the kernel{} declaration names as interface:
 * attn_fwd and attn_bwd_dq k_packed; attn_bwd_dkdv k_packed, deterministic; mqa_bwd_dkv
 * qsplit; none for the others. */
static void test_reference_spec(void **state) {
  (void)state;
  static const struct { const char *family, *itf[2]; } want[] = {
      {"attn_fwd", {"k_packed", NULL}},   {"attn_bwd_dq", {"k_packed", NULL}},
      {"attn_bwd_dkdv", {"k_packed", "deterministic"}}, {"mqa_bwd_dkv", {"qsplit", NULL}},
      {"mqa_fwd", {NULL, NULL}},          {"copy_cols", {NULL, NULL}}};
  for (size_t w = 0; w < sizeof want / sizeof want[0]; w++) {
    mg_kernel_spec s = spec_of(want[w].family, 2, NULL, NULL);
    tk t;
    make(&t, &s);
    int n = 0;
    while (n < 2 && want[w].itf[n]) {
      assert_true(mg_kernel_is_interface(&t.k.info, want[w].itf[n]));
      n++;
    }
    assert_int_equal(t.k.info.n_interface, n);
    unmake(&t);
  }
  mg_kernel_spec s = spec_of("attn_bwd_dkdv", 2, "deterministic=1", "block_m=32"), r;
  tk t;
  make(&t, &s);
  mg_ktime_reference_spec(&s, &t.k.info, &r);
  unmake(&t);
  assert_int_equal(r.n_config, 1);
  assert_string_equal(r.config[0].name, "deterministic");
  assert_int_equal(r.config[0].value, 1);
  s = spec_of("copy_cols", 2, "num_warps=8", NULL);
  make(&t, &s);
  mg_ktime_reference_spec(&s, &t.k.info, &r);
  unmake(&t);
  assert_int_equal(r.n_config, 0);
  assert_string_equal(r.family, "copy_cols");
}

static void test_describe(void **state) {
  (void)state;
  mg_tune_device dev;
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(mg_ktime_describe(&dev, &d), 0);
  assert_string_equal(dev.name, "Fake H200");
  assert_int_equal(dev.sm_count, 132);
  assert_int_equal(dev.driver_version, 13000);
  assert_int_equal(mg_ktime_describe(NULL, &d), MLAGEN_EINVAL);
  mg_diag_clear(&d);
}

/* ---- timing ------------------------------------------------------------------------------ */
enum { N = 25 };

/* A candidate, its reference kernel (mg_ktime_reference_spec), the live counts before any
 * run, and the last run's samples, result and message. */
typedef struct pair {
  mg_kernel_spec s, rs;
  tk cand, ref;
  live before;
  double ms[N];
  mg_ktime_result res;
  mg_diag d;
} pair;

static void pair_make(pair *p, const char *family, int heads, const char *set1, const char *set2) {
  memset(p, 0, sizeof *p);
  p->s = spec_of(family, heads, set1, set2);
  make(&p->cand, &p->s);
  mg_ktime_reference_spec(&p->s, &p->cand.k.info, &p->rs);
  make(&p->ref, &p->rs);
  p->before = live_now();
}

static void pair_free(pair *p) {
  unmake(&p->cand);
  unmake(&p->ref);
  mg_diag_clear(&p->d);
}

/* Times the candidate against its reference at seq; mg_ktime_run's status. */
static int pair_run(pair *p, long long seq) {
  return mg_ktime_run(&p->cand.k, &p->cand.c, &p->ref.k, &p->ref.c, &p->s, seq, N, p->ms, &p->res,
                      &p->d);
}

/* A run at S 256 that completes with verdict, its reason containing why (NULL: any), and
 * leaves nothing live. */
static void expect_verdict(pair *p, int verdict, const char *why) {
  const int rc = pair_run(p, 256);
  if (rc) fail_msg("%s", mg_diag_msg(&p->d));
  assert_int_equal(p->res.verdict, verdict);
  if (why) assert_contains(p->res.reason, why);
  assert_live(p->before, live_now());
}

/* A run at S 256 that fails with status rc and a message containing why. */
static void expect_error(pair *p, int rc, const char *why) {
  assert_int_equal(pair_run(p, 256), rc);
  assert_contains(mg_diag_msg(&p->d), why);
  mg_diag_clear(&p->d);
}

static void test_time_copy_cols(void **state) {
  (void)state;
  pair p; /* the reference is the default: num_warps = 4 */
  pair_make(&p, "copy_cols", 16, "num_warps=2", NULL);
  assert_string_not_equal(p.cand.k.name, p.ref.k.name);
  const int launches = fake.count("cuLaunchKernel");
  expect_verdict(&p, MG_TUNE_KEPT, NULL);
  assert_string_equal(p.res.reason, "");
  assert_int_equal(p.res.n_sets, MG_KTIME_MAX_SETS);
  assert_int_equal(p.res.flush_bytes, 2u << 20); /* twice the fake's 1 MiB L2 */
  assert_int_equal(p.res.set_bytes, (size_t)256 * 16 * (192 + 576) * 2);
  /* check: candidate + reference; then warm-up and samples */
  assert_int_equal(fake.count("cuLaunchKernel") - launches, 2 + MG_KTIME_WARMUP + N);
  for (int i = 0; i < N; i++) /* 64 threads: 0.064 ms x (1 .. 1.3) */
    assert_true(p.ms[i] > 0.0639 && p.ms[i] < 0.0833);
  double pc[3] = {mg_tune_percentile(p.ms, N, 20), mg_tune_percentile(p.ms, N, 50),
                  mg_tune_percentile(p.ms, N, 80)};
  assert_true(pc[0] <= pc[1] && pc[1] <= pc[2] && pc[0] < pc[2]);
  /* the timer hook: same, and the reference against itself */
  int verdict = -1;
  char reason[64] = "x";
  assert_int_equal(mg_ktime_timer(&p.ref.k, &p.ref.c, &p.ref.k, &p.ref.c, &p.rs, 256, N, p.ms,
                                  &verdict, reason, sizeof reason, &p.d), 0);
  assert_int_equal(verdict, MG_TUNE_KEPT);
  assert_string_equal(reason, "");
  for (int i = 0; i < N; i++) assert_true(p.ms[i] > 0.1279 && p.ms[i] < 0.1665); /* 128 threads */
  assert_live(p.before, live_now());
  pair_free(&p);
}

static void test_time_attn_fwd(void **state) {
  (void)state;
  pair p;
  pair_make(&p, "attn_fwd", 2, "k_packed=1", "block_n=32");
  assert_int_equal(p.rs.n_config, 1); /* k_packed = 1 kept: the same parameters */
  const int rc = pair_run(&p, 128);
  if (rc) fail_msg("%s", mg_diag_msg(&p.d));
  assert_int_equal(p.res.verdict, MG_TUNE_KEPT);
  for (int i = 0; i < N; i++) assert_true(p.ms[i] > 0);
  assert_live(p.before, live_now());
  /* a reference of the other key layout cannot be compared: an error, nothing leaked */
  tk split;
  mg_kernel_spec ss = spec_of("attn_fwd", 2, NULL, NULL);
  make(&split, &ss);
  assert_int_equal(mg_ktime_run(&p.cand.k, &p.cand.c, &split.k, &split.c, &p.s, 128, N, p.ms,
                                &p.res, &p.d), MLAGEN_EINVAL);
  assert_contains(mg_diag_msg(&p.d), "parameters differ");
  assert_live(p.before, live_now());
  unmake(&split);
  pair_free(&p);
}

/* p's candidate is kept, with n_maps tensor maps encoded at each of its launches (the
 * check's two, the warm-up and the N timed ones). */
static void expect_kept_maps_per_launch(pair *p, int n_maps) {
  const int launches = fake.count("cuLaunchKernel"), maps = fake.count("cuTensorMapEncodeTiled");
  expect_verdict(p, MG_TUNE_KEPT, NULL);
  assert_int_equal(fake.count("cuLaunchKernel") - launches, 2 + MG_KTIME_WARMUP + N);
  assert_int_equal(fake.count("cuTensorMapEncodeTiled") - maps, n_maps * (2 + MG_KTIME_WARMUP + N));
}

/* attn_fwd_sm90 (an sm_90a family taking its tensor maps by value): every launch, the
 * check's two and the timed ones, gets its 4 maps encoded over the launch's own buffer set
 * (the fake's cuTensorMapEncodeTiled checks them as the driver does); maps the driver
 * refuses make the candidate failed-launch, nothing leaked. */
static void test_time_attn_fwd_sm90(void **state) {
  (void)state;
  pair p;
  pair_make(&p, "attn_fwd_sm90", 2, "k_packed=1", "block_n=64");
  assert_string_not_equal(p.cand.k.name, p.ref.k.name);
  expect_kept_maps_per_launch(&p, 4);
  fake.inject("cuTensorMapEncodeTiled", CUDA_ERROR_INVALID_VALUE);
  expect_verdict(&p, MG_TUNE_FAILED_LAUNCH, "cuTensorMapEncodeTiled");
  pair_free(&p);
}

/* The sm_90a backward's dQ kernel likewise: its 5 maps (mg_sm90_launch_tmaps' backward case:
 * q, k_nope, k_rope, v, dout) at every launch. */
static void test_time_attn_bwd_dq_sm90(void **state) {
  (void)state;
  pair p;
  pair_make(&p, "attn_bwd_dq_sm90", 2, "k_packed=1", "stages=3");
  assert_string_not_equal(p.cand.k.name, p.ref.k.name);
  expect_kept_maps_per_launch(&p, 5);
  pair_free(&p);
}

static void test_failed_launch(void **state) {
  (void)state;
  pair p;
  pair_make(&p, "copy_cols", 16, "num_warps=8", NULL);
  /* the candidate's first launch (the check) fails */
  fake.inject("cuLaunchKernel", CUDA_ERROR_INVALID_VALUE);
  expect_verdict(&p, MG_TUNE_FAILED_LAUNCH, "cuLaunchKernel(mla_copy_cols");
  assert_contains(p.res.reason, "CUDA_ERROR_INVALID_VALUE");
  /* a module the driver rejects */
  fake.inject("cuModuleLoadData", CUDA_ERROR_INVALID_IMAGE);
  expect_verdict(&p, MG_TUNE_FAILED_LAUNCH, "CUDA_ERROR_INVALID_IMAGE");
  /* the device out of memory: not the candidate's fault, the sweep stops */
  fake.inject("cuMemAlloc", CUDA_ERROR_OUT_OF_MEMORY);
  expect_error(&p, MLAGEN_ENOMEM, "cuMemAlloc");
  assert_live(p.before, live_now());
  /* copying the outputs back fails: the harness's failure, not the candidate's */
  fake.inject("cuMemcpyDtoH", CUDA_ERROR_INVALID_VALUE);
  expect_error(&p, MG_EDRIVER, "cuMemcpyDtoH");
  assert_live(p.before, live_now());
  fake.inject(NULL, 0);
  pair_free(&p);
}

/* The test seam: the candidate's outputs as the test wants them. */
static int g_hook_mode; /* 1: dst[0] = 1.0, 2: dst[3] = NaN, 3: see below */
static const char *g_hook_cand; /* the candidate's kernel name (mode 3) */
static size_t g_hook_at, g_hook_n; /* mode 3: the element moved; dst's elements */
static void hook(const char *kernel, const char *param, void *host, size_t bytes) {
  if (strcmp(param, "dst") != 0 || bytes < 8) return;
  uint16_t *h = host;
  if (g_hook_mode == 1 && strcmp(kernel, g_hook_cand) == 0) h[0] = mg_f32_to_bf16(1.0f);
  if (g_hook_mode == 2 && strcmp(kernel, g_hook_cand) == 0) h[3] = 0x7fc0; /* bf16 NaN */
  if (g_hook_mode == 3) {
    /* both outputs as an attention output's: one large element (1.0) and the rest small,
     * uniform in [-0.01, 0.01) (the fake driver runs no kernel: they would be 0); then in
     * the candidate's, element 1 moved by 0.005: under 1e-2 of the largest, over 0.1 of
     * rms + |b| (rms about 0.006 + 1 / sqrt(n)) */
    uint64_t x = 0x2545F4914F6CDD1DULL;
    g_hook_n = bytes / 2;
    for (size_t j = 0; j < g_hook_n; j++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      h[j] = mg_f32_to_bf16((float)(((double)(x >> 11) * 0x1.0p-53 * 2.0 - 1.0) * 0.01));
    }
    h[0] = mg_f32_to_bf16(1.0f);
    if (strcmp(kernel, g_hook_cand) != 0) return;
    h[1] = mg_f32_to_bf16(mg_bf16_to_f32(h[1]) + 0.005f), g_hook_at = 1;
  }
}

static void test_wrong_result(void **state) {
  (void)state;
  pair p;
  pair_make(&p, "copy_cols", 16, "num_warps=2", NULL);
  mg_ktime_output_hook = hook;
  g_hook_cand = p.cand.k.name;
  g_hook_mode = 1; /* the reference's outputs are all zero: max |a - b| = 1 */
  expect_verdict(&p, MG_TUNE_WRONG_RESULT, "output dst: max |a - b| / max |b| = 1");
  assert_contains(p.res.reason, p.ref.k.name);
  assert_true(p.res.max_rel_err >= 1);
  g_hook_mode = 2;
  expect_verdict(&p, MG_TUNE_WRONG_RESULT, "output dst: 1 NaN/inf");
  /* one small element off by 0.005 beside a largest of 1: max |a - b| / max |b| (the first
   * bound, all the check was before) is under 1e-2 and kept it; per element it is over 0.1 */
  g_hook_mode = 3;
  g_hook_at = (size_t)-1;
  expect_verdict(&p, MG_TUNE_WRONG_RESULT, "|a - b| / (rms(b) + |b|) = ");
  assert_true(g_hook_at == 1 && g_hook_n >= 4096);
  assert_contains(p.res.reason, "output dst[1]: ");
  assert_contains(p.res.reason, "not under 0.1");
  assert_true(p.res.max_rel_err > 0.2);
  g_hook_mode = 0; /* untouched: agrees */
  expect_verdict(&p, MG_TUNE_KEPT, NULL);
  mg_ktime_output_hook = NULL;
  pair_free(&p);
}

/* Last in the process: a fault leaves the context unusable. */
static void test_fault(void **state) {
  (void)state;
  pair p;
  pair_make(&p, "copy_cols", 16, "num_warps=2", NULL);
  fake.inject("cuStreamSynchronize", CUDA_ERROR_LAUNCH_FAILED);
  expect_verdict(&p, MG_TUNE_FAILED_LAUNCH, "execution"); /* the fake still frees */
  assert_contains(p.res.reason, "CUDA_ERROR_LAUNCH_FAILED");
  expect_error(&p, MG_EDRIVER, "the CUDA context is unusable after a fault in mla_copy_cols");
  pair_free(&p);
}

/* The store keeps discarded candidates with their verdict and reason. */
static void test_store_verdicts(void **state) {
  (void)state;
  char dir[] = "/tmp/mlagen-test-ktime-XXXXXX";
  if (!mkdtemp(dir)) fail_msg("mkdtemp");
  mg_tune_header h;
  memset(&h, 0, sizeof h);
  h.schema = MG_TUNE_SCHEMA;
  snprintf(h.mlagen_version, sizeof h.mlagen_version, "0.1.0");
  snprintf(h.template_hash, sizeof h.template_hash, "hash");
  snprintf(h.nvrtc_version, sizeof h.nvrtc_version, "13.0");
  snprintf(h.device, sizeof h.device, "Fake H200");
  snprintf(h.arch, sizeof h.arch, "sm_90a");
  mg_kernel_spec s = spec_of("copy_cols", 16, NULL, NULL);
  mg_tune_entry e;
  mg_tune_entry_key(&e, &s, NULL, 4096);
  mg_tune_timing t[3];
  memset(t, 0, sizeof t);
  for (int i = 0; i < 3; i++) {
    t[i].config.n = 1;
    snprintf(t[i].config.v[0].name, sizeof t[i].config.v[0].name, "num_warps");
    t[i].config.v[0].value = 2 << i;
  }
  t[0].verdict = MG_TUNE_KEPT, t[0].p20_ms = 1, t[0].p50_ms = 2, t[0].p80_ms = 3;
  t[1].verdict = MG_TUNE_FAILED_LAUNCH;
  snprintf(t[1].reason, sizeof t[1].reason, "cuLaunchKernel: CUDA_ERROR_INVALID_VALUE");
  t[2].verdict = MG_TUNE_WRONG_RESULT;
  snprintf(t[2].reason, sizeof t[2].reason, "output dst: max |a - b| / max |b| = 1");
  e.config = t[0].config;
  e.p20_ms = 1, e.p50_ms = 2, e.p80_ms = 3;
  e.candidates = t;
  e.n_candidates = 3;
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(mg_tune_store_add(dir, &h, &e, 1, NULL, &d), 0);
  char path[512];
  assert_int_equal(mg_tune_store_path(dir, "sm_90a", "Fake H200", path, sizeof path, &d), 0);
  mg_tune_store st;
  if (mg_tune_store_read(path, &st, &d)) fail_msg("%s", mg_diag_msg(&d));
  assert_int_equal(st.header.schema, MG_TUNE_SCHEMA);
  assert_int_equal(st.n, 1);
  assert_int_equal(st.entries[0].n_candidates, 3);
  const mg_tune_timing *r = st.entries[0].candidates;
  assert_int_equal(r[0].verdict, MG_TUNE_KEPT);
  assert_true(r[0].p50_ms == 2);
  assert_int_equal(r[1].verdict, MG_TUNE_FAILED_LAUNCH);
  assert_string_equal(r[1].reason, t[1].reason);
  assert_true(r[1].p50_ms == 0);
  assert_int_equal(r[2].verdict, MG_TUNE_WRONG_RESULT);
  assert_string_equal(r[2].reason, t[2].reason);
  mg_tune_store_free(&st);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "grep -q '\"verdict\":.*\"failed-launch\"' %s", path);
  assert_int_equal(system(cmd), 0);
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
}

static int setup_gen(void **state) {
  (void)state;
  mg_diag d = MG_DIAG_INIT;
  if (mg_gen_open(&g_gen, NULL, &d)) {
    fprintf(stderr, "mg_gen_open: %s\n", mg_diag_msg(&d));
    return -1;
  }
  return 0;
}
static int teardown_gen(void **state) {
  (void)state;
  mg_gen_close(g_gen);
  return 0;
}

/* ---- no driver ------------------------------------------------------------------------------ */
static void test_nodriver(void **state) {
  (void)state;
  tk cand;
  mg_kernel_spec s = spec_of("copy_cols", 16, NULL, NULL);
  make(&cand, &s);
  double ms[N];
  mg_ktime_result res;
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(mg_ktime_run(&cand.k, &cand.c, NULL, NULL, &s, 256, N, ms, &res, &d),
                   MLAGEN_ENODRIVER);
  assert_contains(mg_diag_msg(&d), "no CUDA driver");
  mg_diag_clear(&d);
  int verdict = -1;
  assert_int_equal(mg_ktime_timer(&cand.k, &cand.c, NULL, NULL, &s, 256, N, ms, &verdict, NULL, 0,
                                  &d), MLAGEN_ENODRIVER);
  mg_diag_clear(&d);
  mg_tune_device dev;
  assert_int_equal(mg_ktime_describe(&dev, &d), MLAGEN_ENODRIVER);
  mg_diag_clear(&d);
  unmake(&cand);
}

int main(int argc, char **argv) {
  const int nodriver = argc > 1 && strcmp(argv[1], "nodriver") == 0;
  if (nodriver) {
    fake_driver_use(NULL);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_nodriver)};
    return cmocka_run_group_tests(tests, setup_gen, teardown_gen);
  }
  if (fake_driver_open(&fake)) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_args),          cmocka_unit_test(test_args_every_family),
      cmocka_unit_test(test_reference_spec),
      cmocka_unit_test(test_describe),      cmocka_unit_test(test_store_verdicts),
      cmocka_unit_test(test_time_copy_cols),
      cmocka_unit_test(test_time_attn_fwd), cmocka_unit_test(test_time_attn_fwd_sm90), cmocka_unit_test(test_time_attn_bwd_dq_sm90),
      cmocka_unit_test(test_failed_launch),
      cmocka_unit_test(test_wrong_result),  cmocka_unit_test(test_fault),
  };
  return cmocka_run_group_tests(tests, setup_gen, teardown_gen);
}
