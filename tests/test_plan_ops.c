/* test_plan_ops.c: the plan's layout kernels besides the GEMMs and the attention
 * (templates/expand_kv, split_dkv, latent (concat_latent, split_latent), copy_cols .cu.tpl), run
 * unchanged on the CPU through the host executor (tests/host/), each compared with the CPU
 * executor's op (runtime/exec/mg_cpu_ops.h, f32) applied to the same bf16 values: bit-exactly
 * for the copies; split_dkv's head sum (fp32 in the kernel, double in the CPU op) must round
 * to the same bf16 value or one ulp away. Destination buffers start filled with random values
 * (never zeros), so columns a kernel must leave alone are checked too. Both rope layouts the
 * plans use are covered (explicit: rope_col 0, rope_w d_r; LAGA: rope_col d_c, rope_w
 * d_c + d_r), plus an unaligned one (the kernels' scalar path). Every configuration the
 * families keep compiles by NVRTC for sm_80 and sm_90a without spills. The seed is printed,
 * MLAGEN_TEST_SEED overrides it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_host.h"
#include "mg_cpu_ops.h"
#include "mlagen.h"

#include "kernel_test_util.h"

typedef kh_kernel built_kernel; /* fn, threads, name */

typedef struct op_shape {
  int dn, dr, dv, dc, H;
} op_shape;

static const op_shape shapes[2] = {{128, 64, 128, 512, 2}, {64, 32, 64, 256, 8}};
enum { B = 2, S = 77, ROWS = B * S };

static void set(mg_kernel_spec *s, const char *assignment) { kh_set(s, assignment); }

static mg_kernel_spec make_spec(const char *family, const op_shape *sh, int num_warps) {
  mg_kernel_spec s;
  memset(&s, 0, sizeof s);
  snprintf(s.family, sizeof s.family, "%s", family);
  s.heads = sh->H, s.d_n = sh->dn, s.d_r = sh->dr, s.d_v = sh->dv, s.d_c = sh->dc, s.causal = 1;
  snprintf(s.dtype, sizeof s.dtype, "bf16");
  if (num_warps) {
    char a[32];
    snprintf(a, sizeof a, "num_warps=%d", num_warps);
    set(&s, a);
  }
  return s;
}

static void build(const mg_kernel_spec *spec, built_kernel *out) {
  kh_build(NULL, spec, 0, out);
  assert_int_equal(out->threads, 32 * kh_config_int(out, "num_warps"));
}

/* ---- launching: one thunk per kernel signature ----------------------------------------- */

typedef void (*fn_expand)(const e16 *kv, const e16 *rope, e16 *k, e16 *v, int rows, int rope_col,
                          int rope_w);
typedef void (*fn_split_dkv)(const e16 *dk, const e16 *dv, e16 *dkv, e16 *drope, int rows,
                             int rope_col, int rope_w, int accumulate);
typedef void (*fn_expand_split)(const e16 *kv, e16 *k, e16 *v, int rows);
typedef void (*fn_split_dkv_split)(const e16 *dk, const e16 *dv, const float *dk_rope, e16 *dkv,
                                   e16 *drope, int rows, int rope_col, int rope_w, int accumulate);
typedef void (*fn_concat)(const e16 *c_kv, const e16 *k_rope, e16 *c, int rows);
typedef void (*fn_split_lat)(const e16 *dc, e16 *dc_kv, e16 *dk_rope, int rows);
typedef void (*fn_copy)(const e16 *src, e16 *dst, int rows, int src_w, int src_col, int dst_w,
                        int dst_col, int cols);

typedef struct call {
  const built_kernel *bk;
  int op; /* 0 expand, 1 split_dkv, 2 concat, 3 split_latent, 4 copy_cols; split keys
           * (k_packed = 0): 5 expand, 6 split_dkv */
  const e16 *in[2];
  const float *fin; /* op 6: dk_rope */
  e16 *out[2];
  int i[6];
} call;

static void thunk(void *p) {
  const call *c = p;
  switch (c->op) {
    case 0: ((fn_expand)c->bk->fn)(c->in[0], c->in[1], c->out[0], c->out[1], c->i[0], c->i[1], c->i[2]); break;
    case 1: ((fn_split_dkv)c->bk->fn)(c->in[0], c->in[1], c->out[0], c->out[1], c->i[0], c->i[1], c->i[2], c->i[3]); break;
    case 2: ((fn_concat)c->bk->fn)(c->in[0], c->in[1], c->out[0], c->i[0]); break;
    case 3: ((fn_split_lat)c->bk->fn)(c->in[0], c->out[0], c->out[1], c->i[0]); break;
    case 5: ((fn_expand_split)c->bk->fn)(c->in[0], c->out[0], c->out[1], c->i[0]); break;
    case 6:
      ((fn_split_dkv_split)c->bk->fn)(c->in[0], c->in[1], c->fin, c->out[0], c->out[1], c->i[0],
                                      c->i[1], c->i[2], c->i[3]);
      break;
    default:
      ((fn_copy)c->bk->fn)(c->in[0], c->out[0], c->i[0], c->i[1], c->i[2], c->i[3], c->i[4], c->i[5]);
  }
}

/* grid_x 0: the manifest's grid (seqlen_q = S, 1, batch = B); else (grid_x, 1, 1) */
static void launch(call *c, unsigned grid_x) {
  mg_host_dim3 grid = grid_x ? (mg_host_dim3){grid_x, 1, 1} : kh_grid(c->bk, S, S, B);
  mg_host_launch_opts lo;
  memset(&lo, 0, sizeof lo);
  kh_launch(c->bk, grid, &lo, thunk, c);
}

/* ---- data --------------------------------------------------------------------------------- */

/* n random bf16 values (never zero) and their f32 copy */
typedef struct arr {
  size_t n;
  e16 *h;
  float *f;
} arr;

static arr rand_arr(size_t n) {
  arr a = {n, malloc(n * sizeof(e16)), malloc(n * sizeof(float))};
  for (size_t i = 0; i < n; i++) {
    float v = (float)randn();
    e16 b = float_to_bf16(v);
    if (bf16_to_float(b) == 0.f) b = float_to_bf16(0.75f);
    a.h[i] = b;
    a.f[i] = bf16_to_float(b);
  }
  return a;
}

static void free_arr(arr *a) { free(a->h), free(a->f); }

/* The kernel's output equals the CPU op's, rounded to bf16, bit-exactly (ulp 0) or within
 * ulp units in the last place (same sign). */
static void expect(const char *what, const arr *a, int ulp) {
  size_t bad = 0;
  int worst = 0;
  for (size_t i = 0; i < a->n; i++) {
    const e16 want = float_to_bf16(a->f[i]), got = a->h[i];
    int dist = got == want ? 0 : ((got ^ want) & 0x8000) ? 1 << 16 : abs((int)got - (int)want);
    if (dist > worst) worst = dist;
    if (dist > ulp && bad++ < 5)
      print_message("  %s [%zu]: 0x%04x (%g), want 0x%04x (%g)\n", what, i, got,
                    bf16_to_float(got), want, a->f[i]);
  }
  assert_int_equal(bad, 0);
  (void)worst;
}

/* ---- the ops -------------------------------------------------------------------------------- */

/* split: k_packed = 0 (the LAGA plans' split keys): K_nope only, no rope source */
static void check_expand_kv(const op_shape *sh, int nw, int rope_col, int rope_w, unsigned grid_x,
                            int split) {
  mg_kernel_spec s = make_spec("expand_kv", sh, nw);
  if (split) set(&s, "k_packed=0");
  built_kernel bk;
  build(&s, &bk);
  assert_int_equal(kh_config_int(&bk, "k_packed"), !split);
  const int H = sh->H, dn = sh->dn, dr = sh->dr, dv = sh->dv;
  arr kv = rand_arr((size_t)ROWS * H * (dn + dv)), rope = rand_arr((size_t)ROWS * rope_w);
  arr k = rand_arr((size_t)ROWS * H * (dn + (split ? 0 : dr))), v = rand_arr((size_t)ROWS * H * dv);
  call c = {&bk, split ? 5 : 0, {kv.h, rope.h}, NULL, {k.h, v.h}, {ROWS, rope_col, rope_w}};
  launch(&c, grid_x);
  mg_cpu_expand_kv(MG_F32, ROWS, H, dn, dr, dv, kv.f, split ? NULL : rope.f, rope_col, rope_w, k.f, v.f);
  expect("expand_kv k", &k, 0);
  expect("expand_kv v", &v, 0);
  print_message("  %-52s rope_col %3d rope_w %3d: k, v bit-exact\n", bk.name, rope_col, rope_w);
  free_arr(&kv), free_arr(&rope), free_arr(&k), free_arr(&v);
  kh_free(&bk);
}

/* accumulate: drope starts random and receives += (LAGA-F's later head groups) */
/* split: k_packed = 0, dK_nope and the attention backward's fp32 head sum dk_rope */
static void check_split_dkv(const op_shape *sh, int nw, int rope_col, int rope_w, unsigned grid_x,
                            int accumulate, int split) {
  mg_kernel_spec s = make_spec("split_dkv", sh, nw);
  if (split) set(&s, "k_packed=0");
  built_kernel bk;
  build(&s, &bk);
  assert_int_equal(kh_config_int(&bk, "k_packed"), !split);
  const int H = sh->H, dn = sh->dn, dr = sh->dr, dv = sh->dv;
  arr dk = rand_arr((size_t)ROWS * H * (dn + (split ? 0 : dr))), dvv = rand_arr((size_t)ROWS * H * dv);
  arr dkv = rand_arr((size_t)ROWS * H * (dn + dv)), drope = rand_arr((size_t)ROWS * rope_w);
  arr dkr = rand_arr((size_t)ROWS * dr); /* its f32 values are the kernel's input too */
  call c = {&bk, split ? 6 : 1, {dk.h, dvv.h}, dkr.f, {dkv.h, drope.h}, {ROWS, rope_col, rope_w, accumulate}};
  launch(&c, grid_x);
  mg_cpu_split_dkv(MG_F32, ROWS, H, dn, dr, dv, dk.f, dvv.f, split ? dkr.f : NULL, dkv.f, drope.f,
                   rope_col, rope_w, accumulate);
  expect("split_dkv dkv", &dkv, 0);
  expect("split_dkv drope", &drope, 1);
  size_t exact = 0; /* how many head sums rounded identically (information only) */
  for (int r = 0; r < ROWS; r++)
    for (int j = 0; j < dr; j++) {
      const size_t i = (size_t)r * rope_w + rope_col + j;
      exact += drope.h[i] == float_to_bf16(drope.f[i]);
    }
  print_message("  %-52s rope_col %3d rope_w %3d%s: dkv bit-exact, drope %zu/%d exact, others within 1 ulp\n",
                bk.name, rope_col, rope_w, accumulate ? " +=" : "", exact, ROWS * dr);
  free_arr(&dk), free_arr(&dvv), free_arr(&dkv), free_arr(&drope), free_arr(&dkr);
  kh_free(&bk);
}

static void check_latent(const op_shape *sh, int nw, unsigned grid_x) {
  built_kernel cat, spl;
  mg_kernel_spec s = make_spec("concat_latent", sh, nw);
  build(&s, &cat);
  s = make_spec("split_latent", sh, nw);
  build(&s, &spl);
  const int dc = sh->dc, dr = sh->dr;
  arr ckv = rand_arr((size_t)ROWS * dc), kr = rand_arr((size_t)ROWS * dr);
  arr c = rand_arr((size_t)ROWS * (dc + dr));
  call cc = {&cat, 2, {ckv.h, kr.h}, NULL, {c.h}, {ROWS}};
  launch(&cc, grid_x);
  mg_cpu_concat_latent(MG_F32, ROWS, dc, dr, ckv.f, kr.f, c.f);
  expect("concat_latent", &c, 0);
  /* the inverse, from fresh random data */
  arr dcin = rand_arr((size_t)ROWS * (dc + dr));
  arr dckv = rand_arr((size_t)ROWS * dc), dkr = rand_arr((size_t)ROWS * dr);
  call cs = {&spl, 3, {dcin.h}, NULL, {dckv.h, dkr.h}, {ROWS}};
  launch(&cs, grid_x);
  mg_cpu_split_latent(MG_F32, ROWS, dc, dr, dcin.f, dckv.f, dkr.f);
  expect("split_latent c_kv", &dckv, 0);
  expect("split_latent k_rope", &dkr, 0);
  /* round trip: split(concat(a, b)) == (a, b) */
  call rt = {&spl, 3, {c.h}, NULL, {dckv.h, dkr.h}, {ROWS}};
  launch(&rt, grid_x);
  assert_memory_equal(dckv.h, ckv.h, ckv.n * sizeof(e16));
  assert_memory_equal(dkr.h, kr.h, kr.n * sizeof(e16));
  print_message("  %-52s + split_latent: bit-exact, round trip exact\n", cat.name);
  free_arr(&ckv), free_arr(&kr), free_arr(&c), free_arr(&dcin), free_arr(&dckv), free_arr(&dkr);
  kh_free(&cat);
  kh_free(&spl);
}

static void check_copy_cols(int nw, int src_w, int src_col, int dst_w, int dst_col, int cols,
                            unsigned grid_x) {
  const op_shape dummy = {128, 64, 128, 512, 2}; /* the kernel depends on the dtype only */
  mg_kernel_spec s = make_spec("copy_cols", &dummy, nw);
  built_kernel bk;
  build(&s, &bk);
  arr src = rand_arr((size_t)ROWS * src_w), dst = rand_arr((size_t)ROWS * dst_w);
  call c = {&bk, 4, {src.h}, NULL, {dst.h}, {ROWS, src_w, src_col, dst_w, dst_col, cols}};
  launch(&c, grid_x);
  mg_cpu_copy_cols(MG_F32, ROWS, src.f, src_w, src_col, dst.f, dst_w, dst_col, cols);
  expect("copy_cols", &dst, 0);
  print_message("  %-52s [%3d +%3d of %3d] -> [%3d of %3d]: bit-exact\n", bk.name, src_col, cols,
                src_w, dst_col, dst_w);
  free_arr(&src), free_arr(&dst);
  kh_free(&bk);
}

static void test_expand_kv(void **state) {
  (void)state;
  for (int i = 0; i < 2; i++) {
    const op_shape *sh = &shapes[i];
    check_expand_kv(sh, 0, 0, sh->dr, 0, 0);                  /* explicit */
    check_expand_kv(sh, 0, sh->dc, sh->dc + sh->dr, 0, 1);    /* LAGA: split keys */
    check_expand_kv(sh, 0, 3, sh->dr + 5, 0, 0);              /* unaligned: scalar rope path */
  }
  check_expand_kv(&shapes[1], 2, shapes[1].dc, shapes[1].dc + shapes[1].dr, 7, 0); /* other warps, small grid */
  check_expand_kv(&shapes[0], 8, 0, shapes[0].dr, 0, 1);
}

static void test_split_dkv(void **state) {
  (void)state;
  for (int i = 0; i < 2; i++) {
    const op_shape *sh = &shapes[i];
    check_split_dkv(sh, 0, 0, sh->dr, 0, 0, 0);                 /* explicit */
    check_split_dkv(sh, 0, sh->dc, sh->dc + sh->dr, 0, 0, 1);   /* LAGA: split keys */
    check_split_dkv(sh, 0, sh->dc, sh->dc + sh->dr, 0, 1, 1);   /* LAGA-F's later groups */
    check_split_dkv(sh, 0, 3, sh->dr + 5, 0, 1, i);             /* unaligned: scalar stores */
  }
  check_split_dkv(&shapes[1], 2, 0, shapes[1].dr, 7, 0, 0);
  check_split_dkv(&shapes[0], 8, shapes[0].dc, shapes[0].dc + shapes[0].dr, 0, 1, 0);
}

static void test_latent(void **state) {
  (void)state;
  check_latent(&shapes[0], 0, 0);
  check_latent(&shapes[1], 0, 0);
  check_latent(&shapes[1], 2, 5);
  check_latent(&shapes[0], 8, 0);
}

static void test_copy_cols(void **state) {
  (void)state;
  for (int i = 0; i < 2; i++) {
    const op_shape *sh = &shapes[i];
    const int dc = sh->dc, dr = sh->dr;
    check_copy_cols(0, dc + dr, dc, dr, 0, dr, 0);      /* rope columns out of the latent */
    check_copy_cols(0, dr, 0, dc + dr, dc, dr, 0);      /* and back in */
    check_copy_cols(0, dc + dr, 0, dc, 0, dc, 0);       /* the latent columns */
  }
  check_copy_cols(0, 37, 3, 29, 5, 17, 0);              /* unaligned: scalar path */
  check_copy_cols(2, 96, 8, 200, 64, 80, 3);             /* other warps, small grid */
  check_copy_cols(8, 37, 0, 40, 1, 36, 0);
}

/* ---- NVRTC ---------------------------------------------------------------------------------- */

/* The configurations the five families keep compile for sm_80 and sm_90a without spills,
 * stack or static shared memory, for DeepSeek-V3's and V2-Lite's shapes at P = 1 and 4
 * (heads matter to expand_kv and split_dkv only, both key layouts), bf16 and fp16: all are rendered, a
 * covering sample is compiled (kh_sweep_cover: every family, dtype, shape and warp count,
 * and every pair of them), all with MLAGEN_TEST_EXHAUSTIVE=1. */
static void test_nvrtc_all_kept_configs(void **state) {
  (void)state;
  static const char *const fams[] = {"expand_kv", "split_dkv", "concat_latent", "split_latent",
                                     "copy_cols"};
  kh_sweep sw;
  kh_sweep_open(&sw, 60, 0);
  int kept = 0, nc = 0;
  static mg_kernel_spec cands[2 * 2 * 2 * 7 * 3]; /* a covering sample of them is compiled */
  const char *models[2] = {"deepseek-v3", "deepseek-v2-lite"};
  const char *dtypes[2] = {"bf16", "fp16"};
  const int sps[2] = {1, 4};
  for (int m = 0; m < 2; m++) {
    mg_shape shape;
    kh_load_shape(models[m], NULL, &shape);
    for (int t = 0; t < 2; t++)
      for (int spi = 0; spi < 2; spi++) {
        mg_kernel_spec specs[MG_SPEC_MAX_KERNELS];
        int n;
        assert_int_equal(mg_spec_for_model(&shape, sps[spi], dtypes[t], specs, MG_SPEC_MAX_KERNELS, &n, &sw.d), 0);
        for (int i = 0; i < n; i++) {
          if (!specs[i].causal) continue;
          int fam = -1;
          for (int f = 0; f < 5; f++)
            if (!strcmp(specs[i].family, fams[f])) fam = f;
          if (fam < 0) continue;
          if (specs[i].heads != shape.heads / sps[spi]) continue; /* the head groups' too: H / P's suffice */
          if (fam >= 2 && spi) continue;          /* no H in these kernels */
          if (fam == 4 && m) continue;            /* nor any dimension in copy_cols */
          for (int nw = 2; nw <= 8; nw *= 2) {
            mg_kernel_spec s = specs[i];
            char a[32];
            snprintf(a, sizeof a, "num_warps=%d", nw);
            set(&s, a);
            assert_true(nc < (int)(sizeof cands / sizeof cands[0]));
            cands[nc++] = s;
          }
        }
      }
  }
  kept += kh_sweep_cover(&sw, cands, nc, g_test_seed, "");
  print_message("  %d configurations kept\n", kept);
  /* per dtype, 3 warp counts each: V3 P=1 all 5 families, V3 P=4 expand+split_dkv,
   * V2-Lite P=1 four families, V2-Lite P=4 expand+split_dkv; expand_kv and split_dkv twice
   * each time (packed keys for the explicit plan, split keys for the LAGA plans) */
  assert_int_equal(kept, 2 * 3 * ((5 + 2) + 4 + (4 + 2) + 4));
  kh_sweep_close(&sw);
}

/* The child side of test_asan: the plan-op kernels built with ASan (MG_HOST_ASAN=1, see
 * kh_run_asan_child) on small cases, in a process that has the ASan runtime preloaded. */
static void asan_case_run(void **state) {
  (void)state;
  const op_shape *sh = &shapes[0];
  check_expand_kv(sh, 0, 3, sh->dr + 5, 0, 0);
  check_expand_kv(sh, 0, sh->dc, sh->dc + sh->dr, 0, 1);
  check_split_dkv(sh, 0, sh->dc, sh->dc + sh->dr, 0, 1, 1);
  check_latent(&shapes[1], 2, 5);
  check_copy_cols(0, sh->dc + sh->dr, sh->dc, sh->dr, 0, sh->dr, 0); /* vector path, to the rows' ends */
  check_copy_cols(2, 37, 20, 29, 12, 17, 3); /* scalar path, small grid, to the rows' ends */
}

static void test_asan(void **state) {
  (void)state;
  kh_run_asan_child("test_plan_ops", g_test_seed, asan_case_run);
}

int main(int argc, char **argv) {
  kt_seed_init();
  const int rc = kh_test_main(argc, argv, asan_case_run);
  if (rc >= 0) return rc;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_expand_kv),
      cmocka_unit_test(test_split_dkv),
      cmocka_unit_test(test_latent),
      cmocka_unit_test(test_copy_cols),
      cmocka_unit_test(test_nvrtc_all_kept_configs),
      cmocka_unit_test(test_asan),
  };
  return kh_exit_code(cmocka_run_group_tests(tests, NULL, NULL));
}
