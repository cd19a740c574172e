/* test_explicit_fwd_host.c: the generated explicit forward, run unchanged on the CPU
 * through the host executor (tests/host/), against a float64 reference.
 *
 * Inputs are fresh random bf16 values (the seed is printed, MLAGEN_TEST_SEED overrides
 * it). The reference computes from the same bf16 values in double precision, so the
 * kernel's error is its fp32 accumulation plus the bf16 rounding of O. */
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

#include "host/host_launch.h"
#include "mg_fs.h"
#include "mg_generate.h"
#include "mg_spec.h"
#include "mlagen.h"

typedef uint16_t bf16; /* storage of __nv_bfloat16 */

static float bf16_to_float(bf16 x) {
  uint32_t u = (uint32_t)x << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static bf16 float_to_bf16(float f) { /* round to nearest even */
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return (bf16)(u >> 16);
}

static uint64_t rng_state;
static double randn(void) { /* Box-Muller on a 64-bit LCG */
  double u[2];
  for (int i = 0; i < 2; i++) {
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    u[i] = ((rng_state >> 11) + 0.5) / 9007199254740992.0;
  }
  return sqrt(-2 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

static bf16 *rand_bf16(size_t n) {
  bf16 *p = malloc(n * sizeof *p);
  for (size_t i = 0; i < n; i++) p[i] = float_to_bf16((float)randn());
  return p;
}

typedef void (*explicit_fwd_fn)(const bf16 *q, const bf16 *k_nope, const bf16 *k_rope,
                                const bf16 *v, bf16 *o, float *lse, int seqlen_q, int seqlen_k,
                                int q_pos0, float softmax_scale);

typedef struct launch_args {
  explicit_fwd_fn fn;
  const bf16 *q, *kn, *kr, *v;
  bf16 *o;
  float *lse;
  int sq, sk, q_pos0;
  float scale;
} launch_args;

static void thunk(void *p) {
  launch_args *a = p;
  a->fn(a->q, a->kn, a->kr, a->v, a->o, a->lse, a->sq, a->sk, a->q_pos0, a->scale);
}

typedef struct built_kernel {
  void *so;
  explicit_fwd_fn fn;
  mg_host_launch_fn launch;
  int block_m, threads;
  mg_kernel_spec spec;
} built_kernel;

/* Generates the kernel for spec, builds it with the host executor into a shared object. */
static void build(const mg_kernel_spec *spec, built_kernel *out) {
  mg_diag d = MG_DIAG_INIT;
  mg_gen *g;
  mg_kernel k;
  assert_int_equal(mg_gen_open(&g, NULL, &d), 0);
  if (mg_gen_kernel(g, spec, &k, &d)) fail_msg("%s", mg_diag_msg(&d));
  char dir[] = "/tmp/mlagen-host-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[256];
  snprintf(path, sizeof path, "%s/%s", dir, k.file);
  assert_int_equal(mg_fs_write_atomic(path, k.source, k.source_len, &d), 0);
  int n_hdr;
  const mg_jit_header *hdr = mg_gen_headers(g, &n_hdr);
  snprintf(path, sizeof path, "%s/%s", dir, hdr->name);
  assert_int_equal(mg_fs_write_atomic(path, hdr->data, hdr->size, &d), 0);
  const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(k.manifest, "config");
  out->block_m = cJSON_GetObjectItemCaseSensitive(cfg, "block_m")->valueint;
  out->threads = 32 * cJSON_GetObjectItemCaseSensitive(cfg, "num_warps")->valueint;
  out->spec = *spec;

  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           "%s -std=c++17 -O2 -fPIC -shared -w -I'%s' -I'%s' -I'%s/host' -include cuda_host.h "
           "-x c++ '%s/%s' -x c++ '%s/host/cuda_host.cpp' -o '%s/k.so'",
           MLAGEN_CXX, MLAGEN_CUDA_INCLUDE, dir, MLAGEN_TESTS_DIR, dir, k.file, MLAGEN_TESTS_DIR, dir);
  if (system(cmd) != 0) fail_msg("host build failed: %s", cmd);
  char so[256];
  snprintf(so, sizeof so, "%s/k.so", dir);
  out->so = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  if (!out->so) fail_msg("dlopen: %s", dlerror());
  *(void **)&out->fn = dlsym(out->so, k.name);
  *(void **)&out->launch = dlsym(out->so, "mg_host_launch");
  assert_non_null(out->fn);
  assert_non_null(out->launch);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
  mg_kernel_free(&k);
  mg_gen_close(g);
}

/* float64 reference: o [B, Sq, H, dv], lse [B, H, Sq]. */
static void reference(const mg_kernel_spec *s, int B, int sq, int sk, int q_pos0, double scale,
                      const bf16 *q, const bf16 *kn, const bf16 *kr, const bf16 *v, double *o,
                      double *lse) {
  const int H = s->heads, dn = s->d_n, dr = s->d_r, dv = s->d_v, dqk = dn + dr;
  double *sc = malloc((size_t)sk * sizeof *sc);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < sq; i++) {
        const bf16 *qi = q + (((size_t)b * sq + i) * H + h) * dqk;
        double mx = -INFINITY;
        int nk = s->causal ? (q_pos0 + i + 1 < sk ? q_pos0 + i + 1 : sk) : sk;
        for (int j = 0; j < nk; j++) {
          const bf16 *knj = kn + (((size_t)b * sk + j) * H + h) * dn;
          const bf16 *krj = kr + ((size_t)b * sk + j) * dr;
          double dot = 0;
          for (int c = 0; c < dn; c++) dot += (double)bf16_to_float(qi[c]) * bf16_to_float(knj[c]);
          for (int c = 0; c < dr; c++) dot += (double)bf16_to_float(qi[dn + c]) * bf16_to_float(krj[c]);
          sc[j] = dot * scale;
          if (sc[j] > mx) mx = sc[j];
        }
        double sum = 0;
        for (int j = 0; j < nk; j++) sum += exp(sc[j] - mx);
        double *oi = o + (((size_t)b * sq + i) * H + h) * dv;
        for (int c = 0; c < dv; c++) oi[c] = 0;
        for (int j = 0; j < nk; j++) {
          const double p = exp(sc[j] - mx) / sum;
          const bf16 *vj = v + (((size_t)b * sk + j) * H + h) * dv;
          for (int c = 0; c < dv; c++) oi[c] += p * bf16_to_float(vj[c]);
        }
        lse[((size_t)b * H + h) * sq + i] = nk ? mx + log(sum) : -INFINITY;
      }
  free(sc);
}

/* Runs one case and checks O (relative to max |O|, under 1e-2) and LSE (under 1e-4 relative). */
static void run_case(const built_kernel *bk, int B, int sq, int sk, int q_pos0) {
  const mg_kernel_spec *s = &bk->spec;
  const int H = s->heads, dqk = s->d_n + s->d_r, dv = s->d_v;
  const float scale = (float)(1.0 / sqrt((double)dqk) * 1.3689 * 1.3689);
  bf16 *q = rand_bf16((size_t)B * sq * H * dqk);
  bf16 *kn = rand_bf16((size_t)B * sk * H * s->d_n);
  bf16 *kr = rand_bf16((size_t)B * sk * s->d_r);
  bf16 *v = rand_bf16((size_t)B * sk * H * dv);
  size_t no = (size_t)B * sq * H * dv, nl = (size_t)B * H * sq;
  bf16 *o = malloc(no * sizeof *o);
  float *lse = malloc(nl * sizeof *lse);
  for (size_t i = 0; i < no; i++) o[i] = 0x7fc0; /* NaN: every element must be written */
  for (size_t i = 0; i < nl; i++) lse[i] = NAN;
  double *ro = malloc(no * sizeof *ro), *rl = malloc(nl * sizeof *rl);

  launch_args a = {bk->fn, q, kn, kr, v, o, lse, sq, sk, q_pos0, scale};
  mg_host_dim3 grid = {(unsigned)((sq + bk->block_m - 1) / bk->block_m), (unsigned)H, (unsigned)B};
  mg_host_dim3 block = {(unsigned)bk->threads, 1, 1};
  char msg[512];
  clock_t t0 = clock();
  int rc = bk->launch(grid, block, 0, thunk, &a, msg, sizeof msg);
  double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
  if (rc) fail_msg("launch failed: %s", msg);
  reference(s, B, sq, sk, q_pos0, scale, q, kn, kr, v, ro, rl);

  double max_ref = 0, max_err = 0, max_lse_err = 0;
  for (size_t i = 0; i < no; i++) {
    const double got = bf16_to_float(o[i]);
    assert_false(isnan(got));
    if (fabs(ro[i]) > max_ref) max_ref = fabs(ro[i]);
    if (fabs(got - ro[i]) > max_err) max_err = fabs(got - ro[i]);
  }
  for (size_t i = 0; i < nl; i++) {
    assert_false(isnan(lse[i]));
    const double e = fabs(lse[i] - rl[i]) / (1 + fabs(rl[i]));
    if (e > max_lse_err) max_lse_err = e;
  }
  print_message("  H=%d d_n=%d d_r=%d d_v=%d %s B=%d S_q=%d S_k=%d q_pos0=%d: O rel err %.2e, "
                "LSE rel err %.2e (%.2f s)\n", H, s->d_n, s->d_r, dv, s->causal ? "causal" : "full",
                B, sq, sk, q_pos0, max_err / max_ref, max_lse_err, secs);
  assert_true(max_err / max_ref < 1e-2);
  assert_true(max_lse_err < 1e-4);
  free(q), free(kn), free(kr), free(v), free(o), free(lse), free(ro), free(rl);
}

static mg_kernel_spec make_spec(int H, int dn, int dr, int dv, int causal) {
  mg_kernel_spec s;
  memset(&s, 0, sizeof s);
  snprintf(s.family, sizeof s.family, "explicit_fwd");
  s.heads = H, s.d_n = dn, s.d_r = dr, s.d_v = dv, s.d_c = 512, s.causal = causal;
  snprintf(s.dtype, sizeof s.dtype, "bf16");
  return s;
}

static void check_shape(int dn, int dr, int dv) {
  for (int causal = 1; causal >= 0; causal--) {
    mg_kernel_spec s = make_spec(2, dn, dr, dv, causal);
    built_kernel bk;
    build(&s, &bk);
    run_case(&bk, 1, 1, 1, 0);      /* S = 1: one key per row */
    run_case(&bk, 2, 77, 77, 0);    /* S not a multiple of any tile, batch 2 */
    run_case(&bk, 1, 40, 100, 60);  /* a query shard at global position 60 of 100 keys */
    dlclose(bk.so);
  }
}

/* DeepSeek-V2-Lite / V3 / Kimi K2 head shape. */
static void test_deepseek_heads(void **state) { (void)state; check_shape(128, 64, 128); }
/* An unusual MLA shape. */
static void test_unusual_heads(void **state) { (void)state; check_shape(64, 32, 64); }

/* Tunable configurations give the same answers. */
static void test_configs(void **state) {
  (void)state;
  const char *sets[][2] = {{"block_m=16", "num_warps=2"}, {"block_m=64", "num_warps=8"}};
  for (int i = 0; i < 2; i++) {
    mg_kernel_spec s = make_spec(2, 64, 32, 64, 1);
    assert_int_equal(mg_spec_set(&s, sets[i][0], NULL), 0);
    assert_int_equal(mg_spec_set(&s, sets[i][1], NULL), 0);
    built_kernel bk;
    build(&s, &bk);
    run_case(&bk, 1, 70, 70, 0);
    dlclose(bk.so);
  }
}

int main(void) {
  const char *env = getenv("MLAGEN_TEST_SEED");
  rng_state = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
  printf("MLAGEN_TEST_SEED=%llu\n", (unsigned long long)rng_state);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_deepseek_heads),
      cmocka_unit_test(test_unusual_heads),
      cmocka_unit_test(test_configs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
