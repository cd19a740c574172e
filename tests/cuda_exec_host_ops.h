/* cuda_exec_host_ops.h: CPU device operations (mg_dev_ops) for the CUDA executor's tests
 * (test_cuda_exec.c, test_cuda_exec_mpi.c): host memory, memset/copy/copy2d by
 * memset/memcpy (upload too: host to host), GEMMs by CBLAS on f32 copies of the bf16 or f16 operands (C in f32 or
 * rounded back to the 16-bit dtype), launches through the host executor (tests/host/): each generated
 * kernel's source gets an appended extern "C" <name>__launch(void **p) that calls the
 * kernel with *(T *)p[i] per manifest parameter, as cuLaunchKernel passes kernelParams.
 *
 * gemm_workspace: recorded (gemm_ws, gemm_ws_bytes, gemm_ws_sets); a GEMM without one
 * fails, as the GPU ops' does, and each GEMM writes HOST_GEMM_SCRIBBLE over the first and
 * the last 64 KiB of it, as cuBLAS may use its workspace, so a plan buffer laid over it
 * would show.
 *
 * launch: under the shared-memory limit of the ops' arch (sm_80's when it is "", as the
 * kernels rendered for no arch respect), not the host executor's default sm_90 one.
 *
 * query: every queued operation has already run (the ops are synchronous), but a test
 * can make the stream look busy: the next `busy` queries say not done (each counted in
 * `queries`), or all of them with `never_done`, to drive the executor's wait loop.
 *
 * Not a public header: include it once, after cmocka.h, in a test built with
 * tests/host/harness.c and MLAGEN_CXX, MLAGEN_CUDA_INCLUDE, MLAGEN_TESTS_DIR defined. */
#ifndef CUDA_EXEC_HOST_OPS_H
#define CUDA_EXEC_HOST_OPS_H
#include <cJSON.h>
#include <cblas.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu_test_util.h"
#include "host/harness.h"
#include "mg_arch.h"
#include "mg_cuda_exec.h"
#include "mg_generate.h"
#include "mg_safetensors.h"
#include "mlagen.h"

typedef uint16_t e16;

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
  long launches, gemms, copies, uploads;
  long busy, queries; /* query: the next `busy` calls say not done; calls counted */
  void *gemm_ws;      /* gemm_workspace's last arguments, and how many calls */
  size_t gemm_ws_bytes;
  long gemm_ws_sets;
  int never_done;     /* query: never done (a pass that does not finish) */
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

/* The architecture whose shared-memory limit the ops' launches run under: their arch
 * (mg_arch_sm: "sm_90a" 90), or sm_80 for ops with none (""), whose kernels are rendered for
 * no arch in particular, that is within sm_80's 163 KiB (templates/prelude.lua's smem_limit),
 * and are the mma.sync families; -1 for an arch name mg_arch_sm does not read. */
static int host_ops_launch_sm(const host_ops *h) {
  return h->base.arch[0] ? mg_arch_sm(h->base.arch) : 80;
}

static int h_launch(mg_dev_ops *o, void *handle, const unsigned grid[3], const unsigned block[3],
                    size_t smem, void **params, void *stream, mg_diag *d) {
  (void)stream;
  host_ops *h = (host_ops *)o;
  host_kernel *e = handle;
  lctx l = {e->fn, params};
  char msg[1024];
  mg_host_dim3 g = {grid[0], grid[1], grid[2]}, b = {block[0], block[1], block[2]};
  const int sm = host_ops_launch_sm(h);
  if (sm < 0) return mg_diag_set(d, MLAGEN_EINVAL, "host ops: arch '%s' not understood", o->arch);
  mg_host_launch_opts lo;
  memset(&lo, 0, sizeof lo); /* the defaults, but the arch's shared-memory limit */
  lo.arch = (unsigned)sm;
  h->launches++;
  if (mg_host_kernel_launch(e->k, g, b, smem, &lo, thunk, &l, msg, sizeof msg))
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

static int h_upload(mg_dev_ops *o, void *dst, const void *src, size_t bytes, void *stream,
                    mg_diag *d) {
  (void)stream, (void)d;
  ((host_ops *)o)->uploads++;
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

/* A 16-bit value of dtype t (bf16 or f16) as f32, and back (round to nearest even). */
static inline float e16_to_f32(mg_dtype t, e16 x) {
  return t == MG_F16 ? mg_f16_to_f32(x) : mg_bf16_to_f32(x);
}
static inline e16 f32_to_e16(mg_dtype t, float x) {
  return t == MG_F16 ? mg_f32_to_f16(x) : mg_f32_to_bf16(x);
}

/* n elements of a bf16, f16 or f32 buffer from element off, as f32. */
static float *as_f32(mg_dtype t, const void *base, int64_t off, int64_t n) {
  float *y = malloc((size_t)n * sizeof *y);
  assert_non_null(y);
  for (int64_t i = 0; i < n; i++)
    y[i] = t == MG_F32 ? ((const float *)base)[off + i] : e16_to_f32(t, ((const e16 *)base)[off + i]);
  return y;
}

#define HOST_GEMM_SCRIBBLE 0xa5

static int h_gemm_workspace(mg_dev_ops *o, void *ws, size_t bytes, mg_diag *d) {
  (void)d;
  host_ops *h = (host_ops *)o;
  h->gemm_ws = ws, h->gemm_ws_bytes = bytes, h->gemm_ws_sets++;
  return 0;
}

static int h_gemm(mg_dev_ops *o, const mg_gemm *g, mg_dtype ta, const void *A, mg_dtype tb,
                  const void *B, mg_dtype tc, void *C, void *stream, mg_diag *d) {
  (void)stream;
  host_ops *h = (host_ops *)o;
  h->gemms++;
  if (!h->gemm_ws) return mg_diag_set(d, MLAGEN_EINVAL, "host gemm: no workspace (gemm_workspace)");
  const size_t scribble = h->gemm_ws_bytes < (64 << 10) ? h->gemm_ws_bytes : (64 << 10);
  memset(h->gemm_ws, HOST_GEMM_SCRIBBLE, scribble);
  memset((char *)h->gemm_ws + h->gemm_ws_bytes - scribble, HOST_GEMM_SCRIBBLE, scribble);
  if ((ta != MG_BF16 && ta != MG_F16) || tb != ta || (tc != ta && tc != MG_F32))
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
    for (int64_t i = 0; i < nc; i++) ((e16 *)C)[g->off_c + i] = f32_to_e16(tc, c[i]);
    free(c);
  }
  free(a), free(b);
  return 0;
}

static int h_query(mg_dev_ops *o, void *stream, int *done, mg_diag *d) {
  (void)stream, (void)d;
  host_ops *h = (host_ops *)o;
  h->queries++;
  *done = !h->never_done && h->busy <= 0;
  if (h->busy > 0) h->busy--;
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
                         .copy = h_copy, .upload = h_upload, .copy2d = h_copy2d, .gemm = h_gemm,
                         .gemm_workspace = h_gemm_workspace, .query = h_query,
                         .destroy = h_destroy};
  h->gen = gen;
  return h;
}

/* Host memory 256-byte aligned (as the executor's buffers are), bytes rounded up. */
static inline void *aligned(size_t bytes) {
  size_t n = (bytes + 255) / 256 * 256;
  void *p = aligned_alloc(256, n ? n : 256);
  assert_non_null(p);
  return p;
}

/* x rounded to 16-bit dtype t (bf16 or f16). */
static inline e16 *to_e16(mg_dtype t, const double *x, int64_t n) {
  e16 *y = malloc((size_t)n * sizeof *y);
  assert_non_null(y);
  for (int64_t i = 0; i < n; i++) y[i] = f32_to_e16(t, (float)x[i]);
  return y;
}

/* Rounds the global inputs to dtype t's values in place, so that the 16-bit run and the
 * f32 reference see the same inputs. */
static inline void round_inputs(const tu_case *c, mg_dtype t, double *in[TU_N_IN]) {
  for (int k = 0; k < TU_N_IN; k++)
    for (int64_t i = 0; i < tu_in_numel(c, k); i++)
      in[k][i] = e16_to_f32(t, f32_to_e16(t, (float)in[k][i]));
}
#endif
