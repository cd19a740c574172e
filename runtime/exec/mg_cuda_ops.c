/* mg_cuda_ops.c: the GPU device operations of the CUDA executor (mg_dev_ops_cuda in
 * mg_dev_ops.h): the driver (mg_driver.h), NVRTC through the JIT cache (mg_jit.h), the
 * module registry (mg_module.h) and cuBLAS, loaded with dlopen like libcuda, so nothing of
 * the GPU stack is linked. */
#include <cublas_api.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mg_cuda_exec.h"
#include "mg_driver.h"
#include "mg_generate.h"
#include "mg_jit.h"
#include "mg_module.h"
#include "mlagen.h"

typedef cublasStatus_t (*pfn_create)(cublasHandle_t *);
typedef cublasStatus_t (*pfn_destroy)(cublasHandle_t);
typedef cublasStatus_t (*pfn_set_stream)(cublasHandle_t, cudaStream_t);
typedef cublasStatus_t (*pfn_set_workspace)(cublasHandle_t, void *, size_t);
typedef const char *(*pfn_status_string)(cublasStatus_t);
typedef cublasStatus_t (*pfn_gemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                   int, const void *, const void *, cudaDataType, int, long long,
                                   const void *, cudaDataType, int, long long, const void *, void *,
                                   cudaDataType, int, long long, int, cublasComputeType_t,
                                   cublasGemmAlgo_t);

typedef struct cuda_ops {
  mg_dev_ops base;
  const mg_driver *drv;
  CUdevice dev;
  int retained;        /* 1: we made the device's primary context current */
  char arch[16];
  mg_module_registry *reg;
  mg_gen *gen;         /* the device header and the template hash for NVRTC */
  void *cublas_lib;
  cublasHandle_t blas;
  pfn_create create;
  pfn_destroy destroy;
  pfn_set_stream set_stream;
  pfn_set_workspace set_workspace;
  void *blas_ws;       /* the workspace gemm_workspace gave cuBLAS (the caller's memory) */
  size_t blas_ws_bytes;
  pfn_status_string status_string; /* may be NULL (cuBLAS < 11.4) */
  pfn_gemm gemm;
} cuda_ops;

static int blas_fail(const cuda_ops *c, cublasStatus_t s, const char *what, mg_diag *d) {
  const char *text = c->status_string ? c->status_string(s) : NULL;
  return mg_diag_set(d, s == CUBLAS_STATUS_ALLOC_FAILED ? MLAGEN_ENOMEM : MLAGEN_EDRIVER,
                     "%s: cuBLAS status %d (%s)", what, (int)s, text ? text : "no description");
}

static int c_load(mg_dev_ops *o, const mg_kernel *k, const struct mg_launch_rule *rule,
                  void **handle, mg_diag *d) {
  cuda_ops *c = (cuda_ops *)o;
  (void)rule; /* the registry parses the manifest's own */
  const mg_module_kernel *found = NULL;
  mg_diag quiet = MG_DIAG_INIT;
  int rc = mg_registry_find(c->reg, k->name, &found, &quiet);
  mg_diag_clear(&quiet);
  if (!rc) {
    *handle = (void *)found;
    return 0;
  }
  int n_hdr;
  const mg_jit_header *hdr = mg_gen_headers(c->gen, &n_hdr);
  mg_jit_opts jo = {.arch = c->arch, .template_hash = mg_gen_template_hash(c->gen),
                    .headers = hdr, .n_headers = n_hdr};
  mg_cubin cubin;
  memset(&cubin, 0, sizeof cubin);
  if ((rc = mg_jit_compile(k->source, k->source_len, k->file, k->name, &jo, &cubin, d)))
    return mg_diag_prefix(d, "NVRTC (%s, %s)", k->name, c->arch);
  rc = mg_registry_load_kernel(c->reg, &k->info, cubin.data, cubin.size, &found, d);
  mg_cubin_free(&cubin);
  if (rc) return rc;
  *handle = (void *)found;
  return 0;
}

static int c_launch(mg_dev_ops *o, void *handle, const unsigned grid[3], const unsigned block[3],
                    size_t smem, void **params, void *stream, mg_diag *d) {
  cuda_ops *c = (cuda_ops *)o;
  const mg_module_kernel *k = handle;
  CUresult r = c->drv->cuLaunchKernel(k->function, grid[0], grid[1], grid[2], block[0], block[1],
                                      block[2], (unsigned)smem, (CUstream)stream, params, NULL);
  if (r == CUDA_SUCCESS) return 0;
  char what[400];
  snprintf(what, sizeof what, "cuLaunchKernel(%s, grid %u,%u,%u, block %u,%u,%u, smem %zu)",
           k->name, grid[0], grid[1], grid[2], block[0], block[1], block[2], smem);
  return mg_driver_fail(c->drv, r, what, d);
}

static int c_memset(mg_dev_ops *o, void *dst, int value, size_t bytes, void *stream, mg_diag *d) {
  cuda_ops *c = (cuda_ops *)o;
  CUresult r = c->drv->cuMemsetD8Async((CUdeviceptr)(uintptr_t)dst, (unsigned char)value, bytes,
                                       (CUstream)stream);
  return r == CUDA_SUCCESS ? 0 : mg_driver_fail(c->drv, r, "cuMemsetD8Async", d);
}

static int c_copy(mg_dev_ops *o, void *dst, const void *src, size_t bytes, void *stream,
                  mg_diag *d) {
  cuda_ops *c = (cuda_ops *)o;
  CUresult r = c->drv->cuMemcpyDtoDAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src,
                                         bytes, (CUstream)stream);
  return r == CUDA_SUCCESS ? 0 : mg_driver_fail(c->drv, r, "cuMemcpyDtoDAsync", d);
}

/* cuMemcpy2DAsync with a host source (one row): the table's one asynchronous host-to-device
 * copy; pageable src is staged by the driver before it returns. */
static int c_upload(mg_dev_ops *o, void *dst, const void *src, size_t bytes, void *stream,
                    mg_diag *d) {
  cuda_ops *c = (cuda_ops *)o;
  if (!bytes) return 0;
  CUDA_MEMCPY2D m;
  memset(&m, 0, sizeof m);
  m.srcMemoryType = CU_MEMORYTYPE_HOST;
  m.srcHost = src;
  m.srcPitch = bytes;
  m.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  m.dstDevice = (CUdeviceptr)(uintptr_t)dst;
  m.dstPitch = bytes;
  m.WidthInBytes = bytes;
  m.Height = 1;
  CUresult r = c->drv->cuMemcpy2DAsync(&m, (CUstream)stream);
  return r == CUDA_SUCCESS ? 0 : mg_driver_fail(c->drv, r, "cuMemcpy2DAsync (host to device)", d);
}

static int c_copy2d(mg_dev_ops *o, void *dst, size_t dpitch, const void *src, size_t spitch,
                    size_t width, size_t height, void *stream, mg_diag *d) {
  cuda_ops *c = (cuda_ops *)o;
  CUDA_MEMCPY2D m;
  memset(&m, 0, sizeof m);
  m.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  m.srcDevice = (CUdeviceptr)(uintptr_t)src;
  m.srcPitch = spitch;
  m.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  m.dstDevice = (CUdeviceptr)(uintptr_t)dst;
  m.dstPitch = dpitch;
  m.WidthInBytes = width;
  m.Height = height;
  CUresult r = c->drv->cuMemcpy2DAsync(&m, (CUstream)stream);
  if (r == CUDA_SUCCESS) return 0;
  char what[160];
  snprintf(what, sizeof what, "cuMemcpy2DAsync(%zu x %zu bytes, pitches %zu, %zu)", height, width,
           dpitch, spitch);
  return mg_driver_fail(c->drv, r, what, d);
}

static cudaDataType blas_type(mg_dtype t) {
  return t == MG_F32 ? CUDA_R_32F : t == MG_F16 ? CUDA_R_16F : CUDA_R_16BF;
}

/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the operands swap,
 * m and n swap, each keeps its own transpose flag and leading dimension. */
static int c_gemm(mg_dev_ops *o, const mg_gemm *g, mg_dtype ta, const void *A, mg_dtype tb,
                  const void *B, mg_dtype tc, void *C, void *stream, mg_diag *d) {
  cuda_ops *c = (cuda_ops *)o;
  if ((ta != MG_BF16 && ta != MG_F16) || tb != ta || (tc != ta && tc != MG_F32))
    return mg_diag_set(d, MLAGEN_EINVAL, "cuBLAS GEMM: operands %s, %s, %s (16-bit A and B of one "
                       "type, C the same or f32)", mg_dtype_name(ta), mg_dtype_name(tb),
                       mg_dtype_name(tc));
  if (!c->blas_ws)
    return mg_diag_set(d, MLAGEN_EINVAL, "cuBLAS GEMM without a workspace (gemm_workspace not "
                       "called): cuBLAS would allocate its own");
  /* cublasSetStream puts cuBLAS back on its own workspace pool: the caller's after it */
  cublasStatus_t s = c->set_stream(c->blas, (cudaStream_t)stream);
  if (s != CUBLAS_STATUS_SUCCESS) return blas_fail(c, s, "cublasSetStream", d);
  s = c->set_workspace(c->blas, c->blas_ws, c->blas_ws_bytes);
  if (s != CUBLAS_STATUS_SUCCESS) {
    char what[120];
    snprintf(what, sizeof what, "cublasSetWorkspace(%p, %zu bytes)", c->blas_ws, c->blas_ws_bytes);
    return blas_fail(c, s, what, d);
  }
  const float alpha = 1.0f, beta = g->beta;
  const size_t ea = mg_dtype_size(ta), ec = mg_dtype_size(tc);
  s = c->gemm(c->blas, g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
              (int)g->n, (int)g->m, (int)g->k, &alpha, (const char *)B + g->off_b * (int64_t)ea,
              blas_type(tb), (int)g->ldb, g->stride_b, (const char *)A + g->off_a * (int64_t)ea,
              blas_type(ta), (int)g->lda, g->stride_a, &beta, (char *)C + g->off_c * (int64_t)ec,
              blas_type(tc), (int)g->ldc, g->stride_c, g->batch, CUBLAS_COMPUTE_32F,
              CUBLAS_GEMM_DEFAULT);
  if (s == CUBLAS_STATUS_SUCCESS) return 0;
  char what[200];
  snprintf(what, sizeof what, "cublasGemmStridedBatchedEx(m %lld, n %lld, k %lld, batch %d)",
           (long long)g->m, (long long)g->n, (long long)g->k, g->batch);
  return blas_fail(c, s, what, d);
}

static int c_gemm_workspace(mg_dev_ops *o, void *ws, size_t bytes, mg_diag *d) {
  cuda_ops *c = (cuda_ops *)o;
  if (!ws || (uintptr_t)ws % MG_CUDA_EXEC_ALIGN)
    return mg_diag_set(d, MLAGEN_EINVAL, "cuBLAS workspace at %p: not %d-byte aligned", ws,
                       MG_CUDA_EXEC_ALIGN);
  c->blas_ws = ws, c->blas_ws_bytes = bytes;
  return 0;
}

static int c_query(mg_dev_ops *o, void *stream, int *done, mg_diag *d) {
  cuda_ops *c = (cuda_ops *)o;
  CUresult r = c->drv->cuStreamQuery((CUstream)stream);
  *done = r != CUDA_ERROR_NOT_READY;
  return r == CUDA_SUCCESS || r == CUDA_ERROR_NOT_READY ? 0 : mg_driver_fail(c->drv, r, "cuStreamQuery", d);
}

static void c_destroy(mg_dev_ops *o) {
  cuda_ops *c = (cuda_ops *)o;
  if (!c) return;
  mg_registry_destroy(c->reg, NULL);
  if (c->blas) c->destroy(c->blas);
  if (c->cublas_lib) dlclose(c->cublas_lib);
  mg_gen_close(c->gen);
  if (c->retained) c->drv->cuDevicePrimaryCtxRelease(c->dev);
  free(c);
}

/* dlsym into a function pointer without a cast between object and function pointers. */
static int sym(void *lib, const char *name, void *fn, size_t n) {
  void *p = dlsym(lib, name);
  if (p) memcpy(fn, &p, n);
  return p != NULL;
}

static int load_cublas(cuda_ops *c, mg_diag *d) {
  const char *env = getenv("MLAGEN_LIBCUBLAS");
  static const char *const names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so.11",
                                      "libcublas.so"};
  char tried[600] = "";
  size_t at = 0;
  for (size_t i = 0; i < (env && *env ? 1 : sizeof names / sizeof *names) && !c->cublas_lib; i++) {
    const char *path = env && *env ? env : names[i];
    dlerror();
    c->cublas_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!c->cublas_lib && at < sizeof tried) {
      const char *why = dlerror();
      at += (size_t)snprintf(tried + at, sizeof tried - at, "%s%s", at ? "; " : "",
                             why ? why : path);
    }
  }
  if (!c->cublas_lib)
    return mg_diag_set(d, MLAGEN_EDRIVER, "cuBLAS not found (GEMMs of the CUDA executor): %s%s",
                       tried, env && *env ? " (from MLAGEN_LIBCUBLAS)" : "");
  if (!sym(c->cublas_lib, "cublasCreate_v2", &c->create, sizeof c->create) ||
      !sym(c->cublas_lib, "cublasDestroy_v2", &c->destroy, sizeof c->destroy) ||
      !sym(c->cublas_lib, "cublasSetStream_v2", &c->set_stream, sizeof c->set_stream) ||
      !sym(c->cublas_lib, "cublasSetWorkspace_v2", &c->set_workspace, sizeof c->set_workspace) ||
      !sym(c->cublas_lib, "cublasGemmStridedBatchedEx", &c->gemm, sizeof c->gemm))
    return mg_diag_set(d, MLAGEN_EDRIVER, "cuBLAS: the library lacks cublasCreate_v2, "
                       "cublasSetStream_v2, cublasSetWorkspace_v2 or cublasGemmStridedBatchedEx "
                       "(cuBLAS >= 11 needed)");
  sym(c->cublas_lib, "cublasGetStatusString", &c->status_string, sizeof c->status_string);
  cublasStatus_t s = c->create(&c->blas);
  if (s != CUBLAS_STATUS_SUCCESS) {
    c->blas = NULL;
    return blas_fail(c, s, "cublasCreate", d);
  }
  return 0;
}

int mg_dev_ops_cuda(mg_dev_ops **out, mg_diag *d) {
  if (!out) return mg_diag_set(d, MLAGEN_EINVAL, "mg_dev_ops_cuda: out is NULL");
  *out = NULL;
  const mg_driver *drv;
  int rc = mg_driver_get(&drv, d);
  if (rc) return rc;
  cuda_ops *c = calloc(1, sizeof *c);
  if (!c) return mg_diag_set(d, MLAGEN_ENOMEM, "CUDA device ops: out of memory");
  c->drv = drv;
  c->base = (mg_dev_ops){.name = "cuda", .drv = drv, .load = c_load, .launch = c_launch,
                         .memset = c_memset, .copy = c_copy, .upload = c_upload,
                         .copy2d = c_copy2d, .gemm = c_gemm,
                         .gemm_workspace = c_gemm_workspace, .query = c_query,
                         .destroy = c_destroy};
  CUcontext ctx = NULL;
  CUresult r = drv->cuCtxGetCurrent(&ctx);
  if (r != CUDA_SUCCESS) rc = mg_driver_fail(c->drv, r, "cuCtxGetCurrent", d);
  if (!rc && !ctx) { /* none current: device 0's primary context, as the CUDA runtime does */
    if ((r = drv->cuDeviceGet(&c->dev, 0)) != CUDA_SUCCESS)
      rc = mg_driver_fail(c->drv, r, "no current CUDA context; cuDeviceGet(0)", d);
    else if ((r = drv->cuDevicePrimaryCtxRetain(&ctx, c->dev)) != CUDA_SUCCESS)
      rc = mg_driver_fail(c->drv, r, "cuDevicePrimaryCtxRetain", d);
    else if ((c->retained = 1, r = drv->cuCtxSetCurrent(ctx)) != CUDA_SUCCESS)
      rc = mg_driver_fail(c->drv, r, "cuCtxSetCurrent", d);
  } else if (!rc && (r = drv->cuCtxGetDevice(&c->dev)) != CUDA_SUCCESS) {
    rc = mg_driver_fail(c->drv, r, "cuCtxGetDevice", d);
  }
  int major = 0, minor = 0;
  if (!rc && ((r = drv->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                             c->dev)) != CUDA_SUCCESS ||
              (r = drv->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                             c->dev)) != CUDA_SUCCESS))
    rc = mg_driver_fail(c->drv, r, "cuDeviceGetAttribute(compute capability)", d);
  if (!rc) {
    if (major == 9 && minor == 0) snprintf(c->arch, sizeof c->arch, "sm_90a");
    else snprintf(c->arch, sizeof c->arch, "sm_%d%d", major, minor);
    snprintf(c->base.arch, sizeof c->base.arch, "%s", c->arch);
    if ((r = drv->cuDeviceGetName(c->base.device, (int)sizeof c->base.device, c->dev)) != CUDA_SUCCESS)
      rc = mg_driver_fail(c->drv, r, "cuDeviceGetName", d);
  }
  if (!rc) {
    rc = load_cublas(c, d);
  }
  if (!rc) rc = mg_registry_create(&c->reg, d);
  if (!rc) rc = mg_gen_open(&c->gen, NULL, d);
  c->base.gen = c->gen; /* the executor renders with it too: one generator per ops */
  if (rc) {
    c_destroy(&c->base);
    return rc;
  }
  *out = &c->base;
  return 0;
}
