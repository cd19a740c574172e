/* test_hopper_host.c: the Hopper primitives of templates/mla_device_sm90.cuh on the host
 * executor (tests/host/hopper_host.cpp) and under NVRTC for sm_90a.
 *
 * tests/host/hopper_selftest.cu computes S = (qscale Q) K^T for 64 x N tiles (D = 64, bf16)
 * with TMA loads on an mbarrier, a proxy fence and wgmma; here it runs for every N (64, 128,
 * 192, 256), every swizzle (128B, 64B, 32B, none) and A from shared memory and from
 * registers, on partial tiles, against a float64 reference per element. The tensor maps
 * come from cuTensorMapEncodeTiled through runtime/mg_driver's loader with the fake driver
 * (tests/fake_cuda.c, the host format of tests/host/mg_host_tmap.h). Then: removing the
 * mbarrier wait, the wgmma wait_group, the fence.proxy.async or the __syncthreads after
 * mbarrier.init (string edits of the source) must make the check fail for every schedule;
 * an over-arrival, a wait on a phase that never completes, a non-uniform setmaxnreg and a
 * wgmma without wgmma.fence are reported; one TMA box lands with its swizzle and zero fill
 * as the header's tile_offset says, in 2D, 3D and 4D. (NVRTC and the SASS: test_hopper_sass.c.) */
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
#include "host/harness.h"
#include "mg_driver.h"
#include "mg_dtype.h"
#include "mg_fs.h"

#define D 64

typedef struct { _Alignas(64) unsigned long long opaque[16]; } tmap_t;
typedef void (*qk_fn)(tmap_t, tmap_t, float *, int, int, int, float, int);
typedef void (*split_fn)(tmap_t, tmap_t, float *, int, int, int, float, float *);
typedef void (*misuse_fn)(int);
typedef void (*copy_fn)(tmap_t, unsigned char *, int, int, int, int, int, unsigned);

static char *read_src(const char *rel, size_t *len) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", MLAGEN_SOURCE_DIR, rel);
  mg_diag d = MG_DIAG_INIT;
  char *data = NULL;
  if (mg_fs_read(path, 1 << 20, &data, len, &d)) fail_msg("%s", mg_diag_msg(&d));
  return data;
}

static char *g_hdr[2];
static size_t g_hdr_len[2];
static mg_host_file g_files[2];

static mg_host_kernel *build(const char *src, size_t len, const char *kernel, char *msg,
                             size_t n) {
  mg_host_build_opts bo;
  memset(&bo, 0, sizeof bo);
  bo.host_dir = MLAGEN_TESTS_DIR "/host";
  bo.cxx = MLAGEN_CXX;
  bo.cuda_include = MLAGEN_CUDA_INCLUDE;
  bo.headers = g_files;
  bo.n_headers = 2;
  mg_host_kernel *k = NULL;
  if (mg_host_kernel_build(src, len, "hopper_selftest.cu", kernel, &bo, &k, msg, n)) return NULL;
  return k;
}

/* bf16 <-> float, round to nearest even */
static uint16_t f2bf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static float bf2f(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static double urand(void) {
  g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
  return (double)(g_rng >> 11) / 9007199254740992.0;
}
static double nrand(void) {
  double u = urand() + 1e-300, v = urand();
  return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

static const mg_driver *driver(void) {
  fake_driver_use(MLAGEN_FAKE_CUDA);
  const mg_driver *drv = NULL;
  mg_diag d = MG_DIAG_INIT;
  if (mg_driver_get(&drv, &d)) fail_msg("driver: %s", mg_diag_msg(&d));
  assert_non_null(drv->cuTensorMapEncodeTiled);
  return drv;
}

/* A [rows, D] bf16 row-major tensor's map with box (box0, box1). */
static tmap_t make_map(const mg_driver *drv, void *base, unsigned rows, unsigned box0,
                       unsigned box1, int swz) {
  static const CUtensorMapSwizzle sw[4] = {CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                           CU_TENSOR_MAP_SWIZZLE_64B, CU_TENSOR_MAP_SWIZZLE_32B};
  tmap_t m;
  cuuint64_t dims[2] = {D, rows}, strides[1] = {D * 2};
  cuuint32_t box[2] = {box0, box1}, es[2] = {1, 1};
  CUresult r = drv->cuTensorMapEncodeTiled((CUtensorMap *)&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2,
                                           base, dims, strides, box, es,
                                           CU_TENSOR_MAP_INTERLEAVE_NONE, sw[swz],
                                           CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                           CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  assert_int_equal(r, CUDA_SUCCESS);
  return m;
}

static unsigned span_of(int swz) { return swz == 1 ? 128 : swz == 2 ? 64 : swz == 3 ? 32 : 16; }

struct qk_args {
  qk_fn fn;
  split_fn split; /* hopper_qk_split64 instead, S_part its partial result */
  tmap_t tq, tk;
  float *S, *S_part;
  int sq, skv, swz, a_regs;
  float qscale;
};
static void qk_thunk(void *p) {
  struct qk_args *a = p;
  if (a->split)
    a->split(a->tq, a->tk, a->S, a->sq, a->skv, a->swz, a->qscale, a->S_part);
  else
    a->fn(a->tq, a->tk, a->S, a->sq, a->skv, a->swz, a->qscale, a->a_regs);
}

/* One run: returns the largest |err| / tol over S (> 1: fails), or -1 when the launch
 * failed (its message in msg). a_regs < 0: hopper_qk_split64 (n 64), whose partial result
 * over the first 32 columns of D is checked too. */
static double run_qk(mg_host_kernel *k, int n, int swz, int a_regs, unsigned long long seed,
                     char *msg, size_t msg_len) {
  const mg_driver *drv = driver();
  const int sq = 100, skv = n + 37; /* partial tiles in both dimensions */
  const float qscale = 1.375f;
  uint16_t *q = malloc((size_t)sq * D * 2), *kk = malloc((size_t)skv * D * 2);
  float *S = malloc((size_t)sq * skv * 4), *S_part = malloc((size_t)sq * skv * 4);
  assert_true(q && kk && S && S_part);
  /* q, k ~ N(0, 0.45): scores with std ~2 */
  for (int i = 0; i < sq * D; i++) q[i] = f2bf((float)(0.45 * nrand()));
  for (int i = 0; i < skv * D; i++) kk[i] = f2bf((float)(0.45 * nrand()));
  for (int i = 0; i < sq * skv; i++) S[i] = S_part[i] = NAN;
  unsigned cols = span_of(swz) / 2;
  struct qk_args a;
  char name[32];
  snprintf(name, sizeof name, "hopper_qk_n%d", n);
  a.fn = (qk_fn)mg_host_kernel_sym(k, name);
  a.split = a_regs < 0 ? (split_fn)mg_host_kernel_sym(k, "hopper_qk_split64") : NULL;
  a.S_part = S_part;
  assert_non_null(a_regs < 0 ? (void *)a.split : (void *)a.fn);
  a.tq = make_map(drv, q, (unsigned)sq, cols, 64, swz);
  a.tk = make_map(drv, kk, (unsigned)skv, cols, (unsigned)n, swz);
  a.S = S, a.sq = sq, a.skv = skv, a.swz = swz, a.a_regs = a_regs, a.qscale = qscale;
  mg_host_launch_opts lo;
  memset(&lo, 0, sizeof lo);
  lo.seed = seed;
  mg_host_dim3 grid = {(unsigned)(sq + 63) / 64, (unsigned)(skv + n - 1) / n, 1};
  mg_host_dim3 block = {128, 1, 1};
  int rc = mg_host_kernel_launch(k, grid, block, 2048 + (size_t)(64 + n) * D * 2, &lo, qk_thunk,
                                 &a, msg, msg_len);
  double worst = -1;
  if (rc == 0) {
    worst = 0;
    for (int i = 0; i < sq; i++)
      for (int j = 0; j < skv; j++) {
        double ref = 0, mag = 0, part = 0, part_mag = 0;
        for (int c = 0; c < D; c++) {
          double t = (double)bf2f(f2bf(bf2f(q[i * D + c]) * qscale)) * bf2f(kk[j * D + c]);
          ref += t;
          mag += fabs(t);
          if (c == D / 2 - 1) part = ref, part_mag = mag;
        }
        if (a_regs < 0) {
          double e = fabs((double)S_part[i * skv + j] - part) /
                     (1e-30 + 5.2 * ldexp(1.0, -24) * part_mag);
          if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
        }
        /* fp32 accumulation of 64 products (fmaf): the measured worst error is 2.6 units
         * of 2^-24 sum |terms| (over all 32 cases, seeds 1..32); twice that */
        double tol = 1e-30 + 5.2 * ldexp(1.0, -24) * mag;
        double e = fabs((double)S[i * skv + j] - ref) / tol;
        if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
      }
  }
  free(q), free(kk), free(S), free(S_part);
  return worst;
}

static void setup_headers(void) {
  if (g_hdr[0]) return;
  g_hdr[0] = read_src("templates/mla_device.cuh", &g_hdr_len[0]);
  g_hdr[1] = read_src("templates/mla_device_sm90.cuh", &g_hdr_len[1]);
  g_files[0] = (mg_host_file){"mla_device.cuh", g_hdr[0], g_hdr_len[0]};
  g_files[1] = (mg_host_file){"mla_device_sm90.cuh", g_hdr[1], g_hdr_len[1]};
}

/* Reads tests/host/hopper_selftest.cu into *src (the caller frees it) and builds `kernel` from
 * it; a build failure fails the test with the compiler's message. */
static mg_host_kernel *build_selftest(const char *kernel, char **src, size_t *len, char *msg,
                                      size_t n) {
  setup_headers();
  *src = read_src("tests/host/hopper_selftest.cu", len);
  mg_host_kernel *k = build(*src, *len, kernel, msg, n);
  if (!k) fail_msg("build: %s", msg);
  return k;
}

static void test_qk(void **state) {
  (void)state;
  size_t len;
  char *src, msg[4096];
  mg_host_kernel *k = build_selftest("hopper_qk_n64", &src, &len, msg, sizeof msg);
  static const char *const swname[4] = {"none", "128B", "64B", "32B"};
  static const int ns[4] = {64, 128, 192, 256};
  double all = 0;
  for (int ni = 0; ni < 4; ni++)
    for (int swz = 0; swz < 4; swz++)
      for (int ar = 0; ar < 2; ar++) {
        double w = run_qk(k, ns[ni], swz, ar, 1 + (unsigned long long)(ni * 8 + swz * 2 + ar),
                          msg, sizeof msg);
        if (w < 0) fail_msg("N %d swizzle %s A %s: %s", ns[ni], swname[swz], ar ? "regs" : "smem", msg);
        if (!(w <= 1.0))
          fail_msg("N %d swizzle %s A %s: worst |err|/tol %g", ns[ni], swname[swz],
                   ar ? "regs" : "smem", w);
        if (w > all) all = w;
      }
  for (int swz = 0; swz < 4; swz++) {
    double w = run_qk(k, 64, swz, -1, 100 + (unsigned long long)swz, msg, sizeof msg);
    if (w < 0) fail_msg("split, swizzle %s: %s", swname[swz], msg);
    if (!(w <= 1.0)) fail_msg("split (wait_group 1), swizzle %s: worst |err|/tol %g", swname[swz], w);
    if (w > all) all = w;
  }
  print_message("  S = QK^T, N 64/128/192/256 x swizzle none/128B/64B/32B x A smem/regs, and two "
                "commit groups with wait_group 1, 100 x (N+37): worst |err|/tol %.3f\n", all);
  mg_host_kernel_free(k);
  free(src);
}

/* The source with the statement marked "// MUTATION: <what>" removed; fails when absent. */
static char *mutate(const char *src, const char *stmt, const char *what, size_t *len) {
  char mark[256];
  snprintf(mark, sizeof mark, "%s  // MUTATION: %s", stmt, what);
  const char *at = strstr(src, mark);
  if (!at) fail_msg("mutation '%s': the pattern '%s' is not in hopper_selftest.cu", what, mark);
  size_t n = strlen(src), sl = strlen(stmt);
  char *out = malloc(n + 1);
  assert_non_null(out);
  memcpy(out, src, (size_t)(at - src));
  memcpy(out + (at - src), at + sl, n - (size_t)(at - src) - sl + 1);
  *len = n - sl;
  return out;
}

static void test_mutations_caught(void **state) {
  (void)state;
  setup_headers();
  size_t len;
  char *src = read_src("tests/host/hopper_selftest.cu", &len);
  static const struct { const char *stmt, *what; int swz, a_regs; } m[] = {
      {"mbar_wait(bar, 0);", "mbarrier wait", 1, 0},
      {"wgmma_wait<0>();", "wgmma wait", 1, 0},
      {"fence_proxy_async();", "proxy fence", 1, 0},
      {"__syncthreads();", "init barrier", 2, 1},
  };
  for (size_t i = 0; i < sizeof m / sizeof *m; i++) {
    size_t ml;
    char *bad = mutate(src, m[i].stmt, m[i].what, &ml);
    char msg[4096];
    mg_host_kernel *k = build(bad, ml, "hopper_qk_n64", msg, sizeof msg);
    if (!k) fail_msg("build without the %s: %s", m[i].what, msg);
    for (unsigned long long seed = 1; seed <= 3; seed++) {
      double w = run_qk(k, 64, m[i].swz, m[i].a_regs, seed, msg, sizeof msg);
      if (w >= 0 && w <= 1.0)
        fail_msg("without the %s the check passed (seed %llu)", m[i].what, seed);
      print_message("  without the %s, seed %llu: %s%s\n", m[i].what, seed,
                    w < 0 ? "launch error: " : "wrong S", w < 0 ? msg : "");
    }
    mg_host_kernel_free(k);
    free(bad);
  }
  free(src);
}

struct misuse_args {
  misuse_fn fn;
  int kind;
};
static void misuse_thunk(void *p) {
  struct misuse_args *a = p;
  a->fn(a->kind);
}

static void test_misuse_reported(void **state) {
  (void)state;
  size_t len;
  char *src, msg[4096];
  mg_host_kernel *k = build_selftest("hopper_misuse", &src, &len, msg, sizeof msg);
  static const char *const want[15] = {"over-arrival", "never completes", "not warpgroup-uniform",
                                       "no wgmma.fence", NULL,
                                       "accumulator register 3 of thread", /* written */
                                       "__trap()",                         /* read: NaN */
                                       NULL,                               /* chained */
                                       "accumulator register 3 of thread", /* d *= s */
                                       NULL,                               /* chained, 2 groups */
                                       NULL,                    /* init published by bar.sync */
                                       "before its initialization", /* no barrier (round robin) */
                                       NULL,        /* init published by bar.arrive/bar.sync */
                                       "which no barrier has ordered before", /* no barrier before */
                                       "changed between the first issue"}; /* rewritten */
  for (int kind = 0; kind < 15; kind++) {
    struct misuse_args a = {(misuse_fn)mg_host_kernel_sym(k, "hopper_misuse"), kind};
    mg_host_dim3 grid = {1, 1, 1}, block = {128, 1, 1};
    /* 256 bytes: kinds 5-9 fill the first 128, which their descriptors read */
    /* kind 11 round robin: thread 0 inits before thread 32 runs, so only the init's
     * visibility (no barrier between them) can report it */
    mg_host_launch_opts lo;
    memset(&lo, 0, sizeof lo);
    lo.round_robin = kind == 11;
    int rc = mg_host_kernel_launch(k, grid, block, 256, &lo, misuse_thunk, &a, msg, sizeof msg);
    if (!want[kind]) {
      if (rc) fail_msg("kind %d: %s", kind, msg);
      continue;
    }
    if (rc == 0 || !strstr(msg, want[kind]))
      fail_msg("kind %d: rc %d, message '%s' lacks '%s'", kind, rc, msg, want[kind]);
    print_message("  reported: %s\n", msg);
  }
  mg_host_kernel_free(k);
  free(src);
}

/* hopper_tma_copy's launch: a box of map (rank 2 to 4) at c[0 .. rank) into out (bytes). */
struct copy_args {
  copy_fn fn;
  tmap_t map;
  unsigned char *out;
  int rank, c[4];
  unsigned bytes;
};
static void copy_thunk(void *p) {
  struct copy_args *a = p;
  a->fn(a->map, a->out, a->rank, a->c[0], a->c[1], a->c[2], a->c[3], a->bytes);
}
/* A bf16 map of rank `rank` over base (dims, byte strides, box; 128B swizzle, zero fill)
 * into *m, through the fake driver's cuTensorMapEncodeTiled. */
static void encode_bf16_128b(const mg_driver *drv, tmap_t *m, unsigned rank, void *base,
                             const cuuint64_t *dims, const cuuint64_t *strides,
                             const cuuint32_t *box) {
  const cuuint32_t es[4] = {1, 1, 1, 1};
  CUresult r = drv->cuTensorMapEncodeTiled((CUtensorMap *)m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank,
                                           base, dims, strides, box, es,
                                           CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                           CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                           CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  assert_int_equal(r, CUDA_SUCCESS);
}
/* Runs a on the selftest kernel k (32 threads, smem bytes of shared memory); fails the test
 * with the executor's message. */
static void copy_run(mg_host_kernel *k, struct copy_args *a, unsigned smem) {
  char msg[4096];
  a->fn = (copy_fn)mg_host_kernel_sym(k, "hopper_tma_copy");
  assert_non_null(a->fn);
  mg_host_dim3 grid = {1, 1, 1}, block = {32, 1, 1};
  if (mg_host_kernel_launch(k, grid, block, smem, NULL, copy_thunk, a, msg, sizeof msg))
    fail_msg("rank %d box at (%d, %d, %d, %d): %s", a->rank, a->c[0], a->c[1], a->c[2], a->c[3], msg);
}

/* One box per swizzle, partly past the tensor's end in both dimensions (and before its
 * start): every byte where the header's layout (tile_offset, mirrored here) puts it, zero
 * outside. */
static void test_tma_box(void **state) {
  (void)state;
  const mg_driver *drv = driver();
  size_t len;
  char *src, msg[4096];
  mg_host_kernel *k = build_selftest("hopper_tma_copy", &src, &len, msg, sizeof msg);
  const unsigned rows = 40;
  uint16_t *t = malloc(rows * D * 2);
  for (unsigned i = 0; i < rows * D; i++) t[i] = (uint16_t)(i + 1);
  for (int swz = 0; swz < 4; swz++) {
    unsigned span = span_of(swz), cols = span / 2, box1 = 16;
    const int origins[2][2] = {{D - (int)cols / 2, (int)rows - 5}, {-(int)cols / 2, -3}};
    for (int o = 0; o < 2; o++) {
      struct copy_args a = {.rank = 2, .c = {origins[o][0], origins[o][1]}};
      a.map = make_map(drv, t, rows, cols, box1, swz);
      a.bytes = span * box1;
      a.out = malloc(a.bytes);
      copy_run(k, &a, 4096);
      unsigned bits = swz == 1 ? 7 : swz == 2 ? 3 : swz == 3 ? 1 : 0;
      for (unsigned r = 0; r < box1; r++)
        for (unsigned c = 0; c < cols; c++) {
          unsigned off = r * span + c * 2;
          off ^= ((off >> 7) & bits) << 4; /* tile_offset (offsets from a 1024-aligned base) */
          int gr = a.c[1] + (int)r, gc = a.c[0] + (int)c;
          uint16_t want = gr >= 0 && gr < (int)rows && gc >= 0 && gc < D ? t[gr * D + gc] : 0;
          uint16_t got;
          memcpy(&got, a.out + off, 2);
          if (got != want)
            fail_msg("swizzle %d origin (%d, %d): element (%u, %u) at byte %u is %u, want %u", swz,
                     a.c[0], a.c[1], r, c, off, got, want);
        }
      free(a.out);
    }
  }
  free(t);
  mg_host_kernel_free(k);
  free(src);
}

/* A 3D box (128B swizzle, 64 x 8 x 3) of a [3][20][64] bf16 tensor, out of bounds in the two
 * outer dimensions: rows of the box are (i2 * 8 + i1), swizzled as in 2D. */
static void test_tma_box_3d(void **state) {
  (void)state;
  const mg_driver *drv = driver();
  size_t len;
  char *src, msg[4096];
  mg_host_kernel *k = build_selftest("hopper_tma_copy", &src, &len, msg, sizeof msg);
  enum { P = 3, R = 20 };
  uint16_t *t = malloc(P * R * D * 2);
  for (unsigned i = 0; i < P * R * D; i++) t[i] = (uint16_t)(i + 1);
  /* rows 15..22 (20.. outside), planes 1..3 (3 outside) */
  struct copy_args a = {.rank = 3, .c = {0, R - 5, 1}};
  cuuint64_t dims[3] = {D, R, P}, strides[2] = {D * 2, R * D * 2};
  cuuint32_t box[3] = {64, 8, 3};
  encode_bf16_128b(drv, &a.map, 3, t, dims, strides, box);
  a.bytes = 128 * 8 * 3;
  a.out = malloc(a.bytes);
  copy_run(k, &a, 8192);
  for (unsigned i2 = 0; i2 < 3; i2++)
    for (unsigned i1 = 0; i1 < 8; i1++)
      for (unsigned c = 0; c < 64; c++) {
        unsigned off = (i2 * 8 + i1) * 128 + c * 2;
        off ^= ((off >> 7) & 7u) << 4;
        int g1 = a.c[1] + (int)i1, g2 = a.c[2] + (int)i2;
        uint16_t want = g1 < R && g2 < P ? t[(g2 * R + g1) * D + (int)c] : 0, got;
        memcpy(&got, a.out + off, 2);
        if (got != want)
          fail_msg("element (%u, %u, %u) at byte %u is %u, want %u", i2, i1, c, off, got, want);
      }
  free(a.out);
  free(t);
  mg_host_kernel_free(k);
  free(src);
}

/* 4D boxes (128B swizzle) of a [B 2][S 20][H 3][64] bf16 tensor as the explicit kernels map
 * q, k_nope, v: dims {64, H, S, B}. A box {64, 1, 8, 1} of item 0 at rows 15..22, head 2: rows
 * 20.. are zero, not item 1's rows 0.. that follow them in memory (batch isolation); and a box
 * {64, 2, 4, 2} at head 1, rows 18, item 1, out of bounds in heads, rows and items at once.
 * Box rows are ((i3 * box2 + i2) * box1 + i1), swizzled as in 2D. */
static void test_tma_box_4d(void **state) {
  (void)state;
  const mg_driver *drv = driver();
  size_t len;
  char *src, msg[4096];
  mg_host_kernel *k = build_selftest("hopper_tma_copy", &src, &len, msg, sizeof msg);
  enum { NB = 2, S = 20, H = 3 };
  uint16_t *t = malloc(NB * S * H * D * 2);
  for (unsigned i = 0; i < NB * S * H * D; i++) t[i] = (uint16_t)(i + 1);
  const unsigned boxes[2][4] = {{64, 1, 8, 1}, {64, 2, 4, 2}};
  const int origins[2][4] = {{0, 2, S - 5, 0}, {0, 1, S - 2, 1}};
  for (int x = 0; x < 2; x++) {
    struct copy_args a = {.rank = 4};
    memcpy(a.c, origins[x], sizeof a.c);
    cuuint64_t dims[4] = {D, H, S, NB}, strides[3] = {D * 2, H * D * 2, S * H * D * 2};
    cuuint32_t box[4] = {boxes[x][0], boxes[x][1], boxes[x][2], boxes[x][3]};
    encode_bf16_128b(drv, &a.map, 4, t, dims, strides, box);
    const unsigned b1 = box[1], b2 = box[2], b3 = box[3];
    a.bytes = 128 * b1 * b2 * b3;
    a.out = malloc(a.bytes);
    copy_run(k, &a, 8192);
    for (unsigned i3 = 0; i3 < b3; i3++)
      for (unsigned i2 = 0; i2 < b2; i2++)
        for (unsigned i1 = 0; i1 < b1; i1++)
          for (unsigned c = 0; c < 64; c++) {
            unsigned off = ((i3 * b2 + i2) * b1 + i1) * 128 + c * 2;
            off ^= ((off >> 7) & 7u) << 4;
            int h = a.c[1] + (int)i1, row = a.c[2] + (int)i2, b = a.c[3] + (int)i3;
            uint16_t want = h < H && row < S && b < NB ? t[((b * S + row) * H + h) * D + (int)c] : 0, got;
            memcpy(&got, a.out + off, 2);
            if (got != want)
              fail_msg("box %d: element (%u, %u, %u, %u) at byte %u is %u, want %u", x, i3, i2, i1,
                       c, off, got, want);
          }
    free(a.out);
  }
  free(t);
  mg_host_kernel_free(k);
  free(src);
}

/* ---- the backward's primitives (hopper_selftest.cu's tt, pingpong and bulk kernels) ---- */
typedef void (*tt_fn)(tmap_t, tmap_t, float *, int);
typedef void (*pp_fn)(float *, int);
typedef void (*bulk_fn)(tmap_t, tmap_t, const float *, const float *, float *, int, int, int);

/* A [rows, inner] row-major tensor's map (dtype, box (box0, box1), swizzle index as swz). */
static tmap_t make_map2(const mg_driver *drv, void *base, CUtensorMapDataType dt, unsigned es,
                        unsigned inner, unsigned rows, unsigned box0, unsigned box1, int swz) {
  static const CUtensorMapSwizzle sw[4] = {CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                           CU_TENSOR_MAP_SWIZZLE_64B, CU_TENSOR_MAP_SWIZZLE_32B};
  tmap_t m;
  cuuint64_t dims[2] = {inner, rows}, strides[1] = {(cuuint64_t)inner * es};
  cuuint32_t box[2] = {box0, box1}, est[2] = {1, 1};
  CUresult r = drv->cuTensorMapEncodeTiled((CUtensorMap *)&m, dt, 2, base, dims, strides, box, est,
                                           CU_TENSOR_MAP_INTERLEAVE_NONE, sw[swz],
                                           CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                           CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  assert_int_equal(r, CUDA_SUCCESS);
  return m;
}

struct tt_args {
  tt_fn fn;
  tmap_t ta, tb;
  float *C;
  int swz;
};
static void tt_thunk(void *p) {
  struct tt_args *a = p;
  a->fn(a->ta, a->tb, a->C, a->swz);
}

/* C = A^T B (A [64 k][64 m], B [64 k][n] when tb, else [n][64 k]) on the host executor
 * against float64 per element: the worst |err| / tol (> 1 fails), -1 on a launch error. */
static double run_tt(mg_host_kernel *k, int n, int tb, int f16, int swz, unsigned long long seed,
                     char *msg, size_t msg_len) {
  const mg_driver *drv = driver();
  uint16_t *A = malloc(64 * 64 * 2), *B = malloc((size_t)64 * n * 2);
  float *C = malloc((size_t)64 * n * 4);
  assert_true(A && B && C);
  for (int i = 0; i < 64 * 64; i++) {
    float v = (float)(0.45 * nrand());
    A[i] = f16 ? mg_f32_to_f16(v) : f2bf(v);
  }
  for (int i = 0; i < 64 * n; i++) {
    float v = (float)(0.45 * nrand());
    B[i] = f16 ? mg_f32_to_f16(v) : f2bf(v);
  }
  for (int i = 0; i < 64 * n; i++) C[i] = NAN;
  const CUtensorMapDataType dt = f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  unsigned cols = span_of(swz) / 2;
  struct tt_args a;
  char name[32];
  snprintf(name, sizeof name, f16 ? "hopper_tt_f16_n%d" : tb ? "hopper_tt_n%d" : "hopper_tk_n%d", n);
  a.fn = (tt_fn)mg_host_kernel_sym(k, name);
  assert_non_null(a.fn);
  a.ta = make_map2(drv, A, dt, 2, 64, 64, cols, 64, swz);
  a.tb = tb ? make_map2(drv, B, dt, 2, (unsigned)n, 64, cols, 64, swz)
            : make_map2(drv, B, dt, 2, 64, (unsigned)n, cols, (unsigned)n, swz);
  a.C = C, a.swz = swz;
  mg_host_launch_opts lo;
  memset(&lo, 0, sizeof lo);
  lo.seed = seed;
  mg_host_dim3 grid = {1, 1, 1}, block = {128, 1, 1};
  int rc = mg_host_kernel_launch(k, grid, block, 2048 + (size_t)(64 + n) * 64 * 2, &lo, tt_thunk,
                                 &a, msg, msg_len);
  double worst = -1;
  if (rc == 0) {
    worst = 0;
    for (int m = 0; m < 64; m++)
      for (int j = 0; j < n; j++) {
        double ref = 0, mag = 0;
        for (int kk = 0; kk < 64; kk++) {
          uint16_t x = A[kk * 64 + m], y = tb ? B[kk * n + j] : B[j * 64 + kk];
          double t = f16 ? (double)mg_f16_to_f32(x) * mg_f16_to_f32(y) : (double)bf2f(x) * bf2f(y);
          ref += t, mag += fabs(t);
        }
        double e = fabs((double)C[m * n + j] - ref) / (1e-30 + 5.2 * ldexp(1.0, -24) * mag);
        if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
      }
  }
  free(A), free(B), free(C);
  return worst;
}

/* wgmma with an MN-major A from shared memory (imm-trans-a), B MN-major or K-major, every
 * swizzle, N 64 and 128 (d_v), against float64. */
static void test_wgmma_trans_a(void **state) {
  (void)state;
  size_t len;
  char *src, msg[4096];
  mg_host_kernel *k = build_selftest("hopper_tt_n64", &src, &len, msg, sizeof msg);
  static const char *const swname[4] = {"none", "128B", "64B", "32B"};
  static const int cases[4][3] = {{64, 1, 0}, {128, 1, 0}, {64, 0, 0}, {64, 1, 1}};
  double all = 0;
  for (int c = 0; c < 4; c++)
    for (int swz = 0; swz < 4; swz++) {
      double w = run_tt(k, cases[c][0], cases[c][1], cases[c][2], swz,
                        200 + (unsigned long long)(c * 4 + swz), msg, sizeof msg);
      if (w < 0) fail_msg("N %d B %s %s swizzle %s: %s", cases[c][0], cases[c][1] ? "MN" : "K",
                          cases[c][2] ? "f16" : "bf16", swname[swz], msg);
      if (!(w <= 1.0))
        fail_msg("N %d B %s %s swizzle %s: worst |err|/tol %g", cases[c][0],
                 cases[c][1] ? "MN" : "K", cases[c][2] ? "f16" : "bf16", swname[swz], w);
      if (w > all) all = w;
    }
  print_message("  C = A^T B, A MN-major; B MN-major (N 64, 128; bf16, and f16 at N 64) or "
                "K-major (N 64) x swizzle none/128B/64B/32B: worst |err|/tol %.3f\n", all);
  mg_host_kernel_free(k);
  free(src);
}

struct pp_args {
  pp_fn fn;
  float *out;
  int kind;
};
static void pp_thunk(void *p) {
  struct pp_args *a = p;
  a->fn(a->out, a->kind);
}

/* hopper_pingpong: 0 when out is exact, 1 when wrong, -1 on a launch error (msg). */
static int run_pp(mg_host_kernel *k, int kind, unsigned long long seed, char *msg, size_t n) {
  float out[128];
  for (int i = 0; i < 128; i++) out[i] = NAN;
  struct pp_args a = {(pp_fn)mg_host_kernel_sym(k, "hopper_pingpong"), out, kind};
  assert_non_null(a.fn);
  mg_host_launch_opts lo;
  memset(&lo, 0, sizeof lo);
  lo.seed = seed;
  mg_host_dim3 grid = {1, 1, 1}, block = {256, 1, 1};
  if (mg_host_kernel_launch(k, grid, block, 512, &lo, pp_thunk, &a, msg, n)) return -1;
  for (int i = 0; i < 128; i++) {
    float x = (float)i;
    if (kind >= 4)
      x = 2.0f * x + 1.0f;
    else
      for (int r = 0; r < 4; r++) x = 3.0f * (2.0f * x + (float)r) - (float)r;
    if (out[i] != x) return 1;
  }
  return 0;
}

/* Named barriers: the ping-pong order and a one-way hand-off hold for every schedule; in the
 * hand-off, the reader arriving instead of waiting (counts balanced, nothing to report) gives
 * wrong values; removing either ping-pong wait is caught (a deadlock: the counts no longer
 * balance); a differing count, a participant that never arrives and a count not a multiple of 32 are
 * reported. */
static void test_named_barriers(void **state) {
  (void)state;
  size_t len;
  char *src, msg[4096];
  mg_host_kernel *k = build_selftest("hopper_pingpong", &src, &len, msg, sizeof msg);
  for (unsigned long long seed = 1; seed <= 8; seed++) {
    int r = run_pp(k, 0, seed, msg, sizeof msg);
    if (r) fail_msg("ping-pong, seed %llu: %s", seed, r < 0 ? msg : "wrong order");
    r = run_pp(k, 4, seed, msg, sizeof msg);
    if (r) fail_msg("hand-off, seed %llu: %s", seed, r < 0 ? msg : "wrong value");
  }
  static const char *const want[4] = {NULL, "arrived at with count", "never completes",
                                      "not a positive multiple of 32"};
  for (int kind = 1; kind < 4; kind++) {
    int r = run_pp(k, kind, 1, msg, sizeof msg);
    if (r >= 0 || !strstr(msg, want[kind]))
      fail_msg("kind %d: rc %d, message '%s' lacks '%s'", kind, r, r < 0 ? msg : "", want[kind]);
    print_message("  reported: %s\n", msg);
  }
  for (unsigned long long seed = 1; seed <= 3; seed++) {
    int r = run_pp(k, 5, seed, msg, sizeof msg);
    if (r == 0) fail_msg("hand-off, warpgroup 1 arriving without waiting: the check passed (seed "
                         "%llu)", seed);
    print_message("  hand-off, warpgroup 1 arrives without waiting, seed %llu: %s%s\n", seed,
                  r < 0 ? "launch error: " : "wrong values", r < 0 ? msg : "");
  }
  mg_host_kernel_free(k);
  static const char *const mut[2][2] = {{"if (r > 0) bar_sync(1, 256);", "pingpong wait 0"},
                                        {"bar_sync(2, 256);", "pingpong wait 1"}};
  for (int i = 0; i < 2; i++) {
    size_t ml;
    char *bad = mutate(src, mut[i][0], mut[i][1], &ml);
    k = build(bad, ml, "hopper_pingpong", msg, sizeof msg);
    if (!k) fail_msg("build without the %s: %s", mut[i][1], msg);
    for (unsigned long long seed = 1; seed <= 3; seed++) {
      int r = run_pp(k, 0, seed, msg, sizeof msg);
      if (r == 0) fail_msg("without the %s the check passed (seed %llu)", mut[i][1], seed);
      print_message("  without the %s, seed %llu: %s%s\n", mut[i][1], seed,
                    r < 0 ? "launch error: " : "wrong order", r < 0 ? msg : "");
    }
    mg_host_kernel_free(k);
    free(bad);
  }
  free(src);
}

struct bulk_args {
  bulk_fn fn;
  tmap_t tacc, tout;
  float *acc, *out, *peek;
  int c1, rows, rounds;
};
static void bulk_thunk(void *p) {
  struct bulk_args *a = p;
  a->fn(a->tacc, a->tout, a->acc, a->out, a->peek, a->c1, a->rows, a->rounds);
}

/* The kernel's bulk_val, mirrored. */
static float bulk_val(unsigned r, unsigned row, unsigned col) {
  unsigned h = (r * 131u + row) * 977u + col * 7919u;
  h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
  return (float)((int)(h % 2001u) - 1000) / 256.0f;
}

/* hopper_bulk on rows [c1, c1 + 64) of [rows, 32] f32 tensors (128 rows allocated): 0 when acc,
 * out, peek and the untouched rows are exactly as expected, 1 when not, -1 on a launch error. */
static int run_bulk(mg_host_kernel *k, int c1, int rows, unsigned long long seed, char *msg,
                    size_t n) {
  const mg_driver *drv = driver();
  const int rounds = 3;
  float *acc = aligned_alloc(64, 128 * 32 * 4), *out = aligned_alloc(64, 128 * 32 * 4),
        *init = malloc(128 * 32 * 4), *peek = malloc(4096 * 4);
  assert_true(acc && out && init && peek);
  for (int i = 0; i < 128 * 32; i++) init[i] = acc[i] = (float)(2.0 * nrand()), out[i] = -7.0f;
  for (int i = 0; i < 4096; i++) peek[i] = NAN;
  struct bulk_args a;
  memset(&a, 0, sizeof a);
  a.fn = (bulk_fn)mg_host_kernel_sym(k, "hopper_bulk");
  assert_non_null(a.fn);
  a.tacc = make_map2(drv, acc, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, 32, (unsigned)rows, 32, 64, 1);
  a.tout = make_map2(drv, out, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, 32, (unsigned)rows, 32, 64, 1);
  a.acc = acc, a.out = out, a.peek = peek, a.c1 = c1, a.rows = rows, a.rounds = rounds;
  mg_host_launch_opts lo;
  memset(&lo, 0, sizeof lo);
  lo.seed = seed;
  mg_host_dim3 grid = {1, 1, 1}, block = {128, 1, 1};
  int rc = mg_host_kernel_launch(k, grid, block, 1024 + 8192 + 1024, &lo, bulk_thunk, &a, msg, n);
  int bad = rc ? -1 : 0;
  for (int i = 0; i < 128 * 32 && !rc; i++) {
    int row = i / 32, col = i % 32, in = row >= c1 && row < c1 + 64 && row < rows;
    float want = init[i], want_out = -7.0f;
    if (in) {
      for (int r = 0; r < rounds; r++) want += bulk_val((unsigned)r, (unsigned)(row - c1), (unsigned)col);
      want_out = bulk_val(rounds - 1, (unsigned)(row - c1), (unsigned)col);
      int e = (row - c1) * 32 + col;
      if (peek[e] != want || peek[2048 + e] != want_out) bad = 1;
    }
    if (acc[i] != want || out[i] != want_out) bad = 1;
  }
  free(acc), free(out), free(init), free(peek);
  return bad;
}

/* TMA reductions (.add, f32) and a store, a full and a partial tile (rows past the tensor not
 * written), exact; removing the proxy fence, the wait_group.read or the wait_group fails. */
static void test_tma_store_reduce(void **state) {
  (void)state;
  size_t len;
  char *src, msg[4096];
  mg_host_kernel *k = build_selftest("hopper_bulk", &src, &len, msg, sizeof msg);
  for (unsigned long long seed = 1; seed <= 4; seed++) {
    int r = run_bulk(k, 0, 128, seed, msg, sizeof msg);
    if (r) fail_msg("full tile, seed %llu: %s", seed, r < 0 ? msg : "wrong values");
    r = run_bulk(k, 64, 100, seed, msg, sizeof msg);
    if (r) fail_msg("partial tile, seed %llu: %s", seed, r < 0 ? msg : "wrong values");
  }
  mg_host_kernel_free(k);
  static const char *const mut[3][2] = {{"fence_proxy_async();", "store fence"},
                                        {"bulk_wait_read<0>();", "bulk read wait"},
                                        {"bulk_wait<0>();", "bulk wait"}};
  for (int i = 0; i < 3; i++) {
    size_t ml;
    char *bad = mutate(src, mut[i][0], mut[i][1], &ml);
    k = build(bad, ml, "hopper_bulk", msg, sizeof msg);
    if (!k) fail_msg("build without the %s: %s", mut[i][1], msg);
    for (unsigned long long seed = 1; seed <= 3; seed++) {
      int r = run_bulk(k, 0, 128, seed, msg, sizeof msg);
      if (r == 0) fail_msg("without the %s the check passed (seed %llu)", mut[i][1], seed);
      print_message("  without the %s, seed %llu: %s%s\n", mut[i][1], seed,
                    r < 0 ? "launch error: " : "wrong values", r < 0 ? msg : "");
    }
    mg_host_kernel_free(k);
    free(bad);
  }
  free(src);
}

typedef void (*stsm_fn)(unsigned short *, int);
struct stsm_args {
  stsm_fn fn;
  unsigned short *out;
  int trans;
};
static void stsm_thunk(void *p) {
  struct stsm_args *a = p;
  a->fn(a->out, a->trans);
}

/* stmatrix.x4 and .x4.trans: every stored 16-bit value where the PTX ISA's fragment layout
 * puts it (element (row, col) of matrix m: lane 4 row + col / 2, register m, half col % 2;
 * transposed with .trans), rows from the lanes' addresses (80 bytes apart), nothing else
 * written. Exact. */
static void test_stmatrix(void **state) {
  (void)state;
  size_t len;
  char *src, msg[4096];
  mg_host_kernel *k = build_selftest("hopper_stmatrix", &src, &len, msg, sizeof msg);
  for (int trans = 0; trans < 2; trans++) {
    unsigned short out[320];
    memset(out, 0, sizeof out);
    struct stsm_args a = {(stsm_fn)mg_host_kernel_sym(k, "hopper_stmatrix"), out, trans};
    assert_non_null(a.fn);
    mg_host_dim3 grid = {1, 1, 1}, block = {32, 1, 1};
    if (mg_host_kernel_launch(k, grid, block, 1024, NULL, stsm_thunk, &a, msg, sizeof msg))
      fail_msg("trans %d: %s", trans, msg);
    for (unsigned i = 0; i < 320; i++) {
      unsigned row = i / 40, m = (i % 40) / 8, col = i % 8;
      unsigned want = 0xffff;
      if (i % 40 < 32) {
        unsigned fr = trans ? col : row, fc = trans ? row : col;
        want = 2 * (4 * (4 * fr + fc / 2) + m) + fc % 2;
      }
      if (out[i] != want)
        fail_msg("trans %d: row %u matrix %u column %u holds %u, want %u", trans, row, m, col,
                 out[i], want);
    }
  }
  print_message("  stmatrix.x4 and .x4.trans: 4 x 8 x 8 values each where the ISA's fragment "
                "layout puts them, padding untouched\n");
  mg_host_kernel_free(k);
  free(src);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_qk),
      cmocka_unit_test(test_mutations_caught),
      cmocka_unit_test(test_misuse_reported),
      cmocka_unit_test(test_tma_box),
      cmocka_unit_test(test_tma_box_3d),
      cmocka_unit_test(test_tma_box_4d),
      cmocka_unit_test(test_wgmma_trans_a),
      cmocka_unit_test(test_named_barriers),
      cmocka_unit_test(test_tma_store_reduce),
      cmocka_unit_test(test_stmatrix),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
