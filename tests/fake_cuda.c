/* fake_cuda.c: a stand-in for libcuda.so.1, built as a shared library for the tests.
 *
 * The driver loader (runtime/exec/mg_driver.c) is pointed at it with MLAGEN_LIBCUDA. It
 * exports cuGetProcAddress_v2, as a real driver does for lookups, and answers it for
 * every entry point mlagen resolves: one device, "Fake H200", compute capability 9.0,
 * 132 SMs, 227 KiB opt-in shared memory per block, a 1 MiB L2 (small, so an L2 flush
 * stays cheap), driver version 13.0; memory calls use host memory (live allocations
 * counted); launches run nothing; streams and events are opaque cells (live ones counted).
 * Time: a fake clock in ms advances only at launches, by 0.001 ms per thread of the block
 * times (1 + 0.1 * (launch number mod 4)); cuEventRecord stamps it, cuEventElapsedTime
 * gives the difference (deterministic, and a kernel with fewer threads per CTA is
 * "faster"). FAKE_CUDA_FAIL_INIT=1 in the environment makes cuInit fail with
 * CUDA_ERROR_NO_DEVICE.
 *
 * Modules behave like a driver's, so the module registry (runtime/exec/mg_module.c) can be
 * tested: cuModuleLoadData takes an ELF64 image (a real cubin: a kernel is found when its
 * name is a NUL-terminated string of the image) or a fake image "FAKECUBIN\n" followed by
 * kernel names, one a line, up to the first NUL (anything else: CUDA_ERROR_INVALID_IMAGE);
 * cuModuleGetFunction of a name the image does not hold is CUDA_ERROR_NOT_FOUND; handles
 * are checked (an unloaded module or one of its functions is CUDA_ERROR_INVALID_HANDLE);
 * a function's dynamic shared memory limit is 48 KiB until cuFuncSetAttribute raises it
 * (to at most the opt-in 227 KiB), and a launch above the limit, with a zero grid dim or
 * more than 1024 threads is CUDA_ERROR_INVALID_VALUE.
 *
 * Exported for the tests (dlopen the same path, dlsym): fake_cuda_count(name) (how many
 * times an entry point was called, and "live_modules", "live_allocs", "live_events",
 * "live_streams"), fake_cuda_fail(name, code) (the
 * next call of that entry point returns code; name NULL clears), fake_cuda_last_launch
 * (the last launch's grid, block, smem, stream), fake_cuda_attr_value(fn) (a function's
 * dynamic smem limit), fake_cuda_reset() (counters and failure cleared). It is also a fake
 * cuBLAS (at the end of this file). */
#include <cublas_api.h>
#include <cuda.h>
#include "host/mg_host_tmap.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

/* ---- call counters and failure injection (not thread-safe: the tests are serial) ---- */
static const char *const counted[] = {"cuModuleLoadData", "cuModuleUnload", "cuModuleGetFunction",
                                      "cuFuncSetAttribute", "cuLaunchKernel",
                                      /* timing (generator/cli/mg_ktime.c) */
                                      "cuMemAlloc", "cuMemFree", "cuMemsetD8Async",
                                      "cuStreamSynchronize", "cuEventRecord", "cuEventSynchronize",
                                      "cuEventElapsedTime", "cuMemcpyDtoH",
                                      /* the sm_90a kernels' tensor maps */
                                      "cuTensorMapEncodeTiled"};
#define N_COUNTED (int)(sizeof counted / sizeof counted[0])
static int g_count[N_COUNTED];
static int g_live_modules;
static int g_live_allocs, g_live_events, g_live_streams; /* timing: counted, never reset */
static double g_clock_ms;                                /* advanced by launches */
static unsigned long g_launches;
static char g_fail_name[64];
static CUresult g_fail_code;
static struct { unsigned grid[3], block[3], smem; CUstream stream; } g_last;

/* Counts a call of name; returns the injected failure (once) or CUDA_SUCCESS. */
static CUresult called(const char *name) {
  for (int i = 0; i < N_COUNTED; i++)
    if (strcmp(counted[i], name) == 0) g_count[i]++;
  if (g_fail_name[0] && strcmp(g_fail_name, name) == 0) {
    g_fail_name[0] = '\0';
    return g_fail_code;
  }
  return CUDA_SUCCESS;
}

EXPORT int fake_cuda_count(const char *name) {
  if (name && strcmp(name, "live_modules") == 0) return g_live_modules;
  if (name && strcmp(name, "live_allocs") == 0) return g_live_allocs;
  if (name && strcmp(name, "live_events") == 0) return g_live_events;
  if (name && strcmp(name, "live_streams") == 0) return g_live_streams;
  for (int i = 0; i < N_COUNTED; i++)
    if (name && strcmp(counted[i], name) == 0) return g_count[i];
  return -1;
}
EXPORT void fake_cuda_fail(const char *name, int code) {
  g_fail_name[0] = '\0';
  if (name) {
    strncpy(g_fail_name, name, sizeof g_fail_name - 1);
    g_fail_name[sizeof g_fail_name - 1] = '\0';
  }
  g_fail_code = (CUresult)code;
}
EXPORT void fake_cuda_last_launch(unsigned grid[3], unsigned block[3], unsigned *smem,
                                  void **stream) {
  memcpy(grid, g_last.grid, sizeof g_last.grid);
  memcpy(block, g_last.block, sizeof g_last.block);
  *smem = g_last.smem;
  *stream = g_last.stream;
}
static void fake_cublas_reset(void);
EXPORT void fake_cuda_reset(void) {
  fake_cublas_reset();
  memset(g_count, 0, sizeof g_count);
  memset(&g_last, 0, sizeof g_last);
  g_fail_name[0] = '\0';
}

static CUresult f_init(unsigned int flags) {
  (void)flags;
  const char *fail = getenv("FAKE_CUDA_FAIL_INIT");
  return fail && *fail == '1' ? CUDA_ERROR_NO_DEVICE : CUDA_SUCCESS;
}
static CUresult f_driver_get_version(int *v) { *v = 13000; return CUDA_SUCCESS; }
static CUresult f_device_get(CUdevice *d, int ordinal) {
  if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
  *d = 0;
  return CUDA_SUCCESS;
}
static CUresult f_device_get_count(int *n) { *n = 1; return CUDA_SUCCESS; }
static CUresult f_device_get_name(char *name, int len, CUdevice d) {
  (void)d;
  if (len < 1) return CUDA_ERROR_INVALID_VALUE;
  strncpy(name, "Fake H200", (size_t)len - 1);
  name[len - 1] = '\0';
  return CUDA_SUCCESS;
}
static CUresult f_device_get_attribute(int *v, CUdevice_attribute a, CUdevice d) {
  (void)d;
  switch (a) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *v = 232448; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *v = 1 << 20; break;
    default: *v = 0; break;
  }
  return CUDA_SUCCESS;
}
static CUresult f_ctx_get_current(CUcontext *c) { *c = NULL; return CUDA_SUCCESS; }
static CUresult f_ctx_get_device(CUdevice *d) { *d = 0; return CUDA_SUCCESS; }
/* ---- modules ----------------------------------------------------------------------- */
#define FAKE_MAX_FUNCS 64
#define FAKE_MAX_MODULES 1024
#define DEFAULT_SMEM (48 * 1024)
#define OPTIN_SMEM 232448
typedef struct fake_func {
  char name[256];
  int max_dyn_smem;
  struct fake_module *mod;
} fake_func;
typedef struct fake_module {
  const char *image; /* the caller's image, which must outlive the module (as for a driver) */
  size_t size;       /* bytes of the image searched for names */
  int fake;          /* 1: a "FAKECUBIN" image */
  int n_funcs;
  fake_func funcs[FAKE_MAX_FUNCS];
} fake_module;
static fake_module *g_modules[FAKE_MAX_MODULES];

static int live_module(const fake_module *m) {
  for (int i = 0; i < FAKE_MAX_MODULES; i++)
    if (m && g_modules[i] == m) return 1;
  return 0;
}
static int live_func(const fake_func *f) {
  for (int i = 0; i < FAKE_MAX_MODULES; i++) {
    const fake_module *m = g_modules[i];
    if (m && f >= m->funcs && f < m->funcs + m->n_funcs) return 1;
  }
  return 0;
}

/* Bytes of an ELF64 image: the furthest end of its headers and sections; 0 if not ELF64. */
static size_t elf64_size(const unsigned char *p) {
  if (memcmp(p, "\177ELF", 4) != 0 || p[4] != 2 /* ELFCLASS64 */ || p[5] != 1 /* LSB */) return 0;
  uint64_t shoff, phoff;
  uint16_t ehsize, phentsize, phnum, shentsize, shnum;
  memcpy(&phoff, p + 32, 8), memcpy(&shoff, p + 40, 8);
  memcpy(&ehsize, p + 52, 2), memcpy(&phentsize, p + 54, 2), memcpy(&phnum, p + 56, 2);
  memcpy(&shentsize, p + 58, 2), memcpy(&shnum, p + 60, 2);
  uint64_t end = ehsize;
  if (phoff + (uint64_t)phentsize * phnum > end) end = phoff + (uint64_t)phentsize * phnum;
  if (shoff + (uint64_t)shentsize * shnum > end) end = shoff + (uint64_t)shentsize * shnum;
  for (unsigned i = 0; i < shnum && shentsize >= 64; i++) {
    const unsigned char *sh = p + shoff + (uint64_t)i * shentsize;
    uint32_t type;
    uint64_t off, size;
    memcpy(&type, sh + 4, 4), memcpy(&off, sh + 24, 8), memcpy(&size, sh + 32, 8);
    if (type != 8 /* SHT_NOBITS */ && off + size > end) end = off + size;
  }
  return (size_t)end;
}

static CUresult f_module_load_data(CUmodule *m, const void *image) {
  CUresult r = called("cuModuleLoadData");
  if (r) return r;
  if (!m || !image) return CUDA_ERROR_INVALID_VALUE;
  *m = NULL;
  fake_module *fm = calloc(1, sizeof *fm);
  if (!fm) return CUDA_ERROR_OUT_OF_MEMORY;
  fm->image = image;
  if (strncmp(image, "FAKECUBIN\n", 10) == 0) {
    fm->fake = 1;
    fm->size = strlen(image);
  } else if (!(fm->size = elf64_size(image))) {
    free(fm);
    return CUDA_ERROR_INVALID_IMAGE;
  }
  for (int i = 0; i < FAKE_MAX_MODULES; i++)
    if (!g_modules[i]) {
      g_modules[i] = fm;
      g_live_modules++;
      *m = (CUmodule)fm;
      return CUDA_SUCCESS;
    }
  free(fm);
  return CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult f_module_unload(CUmodule m) {
  CUresult r = called("cuModuleUnload");
  if (r) return r;
  fake_module *fm = (fake_module *)m;
  if (!live_module(fm)) return CUDA_ERROR_INVALID_HANDLE;
  for (int i = 0; i < FAKE_MAX_MODULES; i++)
    if (g_modules[i] == fm) g_modules[i] = NULL;
  free(fm);
  g_live_modules--;
  return CUDA_SUCCESS;
}
/* Whether the image holds name as a whole string: a line of a fake image, a
 * NUL-terminated string (preceded by NUL or '.') of an ELF image. */
static int image_has(const fake_module *m, const char *name) {
  const size_t n = strlen(name);
  if (n == 0) return 0;
  for (size_t i = m->fake ? 10 : 1; i + n < m->size + (m->fake ? 1 : 0); i++) {
    const char before = m->image[i - 1], after = i + n < m->size ? m->image[i + n] : '\0';
    if (memcmp(m->image + i, name, n) != 0) continue;
    if (m->fake ? (before == '\n' && (after == '\n' || after == '\0'))
                : ((before == '\0' || before == '.') && after == '\0'))
      return 1;
  }
  return 0;
}
static CUresult f_module_get_function(CUfunction *f, CUmodule m, const char *name) {
  CUresult r = called("cuModuleGetFunction");
  if (r) return r;
  if (!f || !name) return CUDA_ERROR_INVALID_VALUE;
  *f = NULL;
  fake_module *fm = (fake_module *)m;
  if (!live_module(fm)) return CUDA_ERROR_INVALID_HANDLE;
  for (int i = 0; i < fm->n_funcs; i++)
    if (strcmp(fm->funcs[i].name, name) == 0) {
      *f = (CUfunction)&fm->funcs[i];
      return CUDA_SUCCESS;
    }
  if (!image_has(fm, name) || strlen(name) >= sizeof fm->funcs[0].name) return CUDA_ERROR_NOT_FOUND;
  if (fm->n_funcs == FAKE_MAX_FUNCS) return CUDA_ERROR_OUT_OF_MEMORY;
  fake_func *ff = &fm->funcs[fm->n_funcs++];
  strcpy(ff->name, name);
  ff->max_dyn_smem = DEFAULT_SMEM;
  ff->mod = fm;
  *f = (CUfunction)ff;
  return CUDA_SUCCESS;
}
EXPORT int fake_cuda_attr_value(void *fn) {
  return live_func(fn) ? ((fake_func *)fn)->max_dyn_smem : -1;
}
static CUresult f_func_set_attribute(CUfunction f, CUfunction_attribute a, int v) {
  CUresult r = called("cuFuncSetAttribute");
  if (r) return r;
  fake_func *ff = (fake_func *)f;
  if (!live_func(ff)) return CUDA_ERROR_INVALID_HANDLE;
  if (a == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) {
    if (v < 0 || v > OPTIN_SMEM) return CUDA_ERROR_INVALID_VALUE;
    ff->max_dyn_smem = v;
  }
  return CUDA_SUCCESS;
}
static CUresult f_launch_kernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                unsigned by, unsigned bz, unsigned smem, CUstream s, void **params,
                                void **extra) {
  (void)params, (void)extra;
  CUresult r = called("cuLaunchKernel");
  if (r) return r;
  const fake_func *ff = (const fake_func *)f;
  if (!live_func(ff)) return CUDA_ERROR_INVALID_HANDLE;
  if (!gx || !gy || !gz || !bx || !by || !bz || (unsigned long)bx * by * bz > 1024 ||
      gy > 65535 || gz > 65535 || (int)smem > ff->max_dyn_smem)
    return CUDA_ERROR_INVALID_VALUE;
  g_last.grid[0] = gx, g_last.grid[1] = gy, g_last.grid[2] = gz;
  g_last.block[0] = bx, g_last.block[1] = by, g_last.block[2] = bz;
  g_last.smem = smem, g_last.stream = s;
  g_clock_ms += 0.001 * bx * by * bz * (1 + 0.1 * (double)(g_launches++ % 4));
  return CUDA_SUCCESS;
}
static CUresult f_mem_alloc(CUdeviceptr *p, size_t bytes) {
  CUresult r = called("cuMemAlloc");
  if (r) return r;
  void *m = malloc(bytes ? bytes : 1);
  if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
  *p = (CUdeviceptr)(uintptr_t)m;
  g_live_allocs++;
  return CUDA_SUCCESS;
}
static CUresult f_mem_free(CUdeviceptr p) {
  CUresult r = called("cuMemFree");
  if (r) return r;
  if (p) g_live_allocs--;
  free((void *)(uintptr_t)p);
  return CUDA_SUCCESS;
}
static CUresult f_memcpy_htod(CUdeviceptr dst, const void *src, size_t n) {
  memcpy((void *)(uintptr_t)dst, src, n);
  return CUDA_SUCCESS;
}
static CUresult f_memcpy_dtoh(void *dst, CUdeviceptr src, size_t n) {
  CUresult r = called("cuMemcpyDtoH");
  if (r) return r;
  memcpy(dst, (const void *)(uintptr_t)src, n);
  return CUDA_SUCCESS;
}
static CUresult f_stream_synchronize(CUstream s) { (void)s; return called("cuStreamSynchronize"); }
static CUresult f_primary_ctx_retain(CUcontext *c, CUdevice d) {
  (void)d;
  *c = (CUcontext)(uintptr_t)0x1000; /* an opaque non-null handle, never dereferenced */
  return CUDA_SUCCESS;
}
static CUresult f_primary_ctx_release(CUdevice d) { (void)d; return CUDA_SUCCESS; }
static CUresult f_ctx_set_current(CUcontext c) { (void)c; return CUDA_SUCCESS; }
static CUresult f_ctx_synchronize(void) { return CUDA_SUCCESS; }
static CUresult f_mem_get_info(size_t *free_bytes, size_t *total) {
  *free_bytes = *total = (size_t)141 << 30;
  return CUDA_SUCCESS;
}
static CUresult f_memset_d8(CUdeviceptr p, unsigned char v, size_t n) {
  memset((void *)(uintptr_t)p, v, n);
  return CUDA_SUCCESS;
}
static CUresult f_memset_d8_async(CUdeviceptr p, unsigned char v, size_t n, CUstream s) {
  (void)s;
  CUresult r = called("cuMemsetD8Async");
  if (r) return r;
  memset((void *)(uintptr_t)p, v, n);
  return CUDA_SUCCESS;
}
/* Streams are opaque heap cells; an event is a cell holding the fake clock when it was
 * recorded (a never-recorded event: NaN, its elapsed time CUDA_ERROR_INVALID_HANDLE). */
static CUresult f_stream_create(CUstream *s, unsigned int flags) {
  (void)flags;
  *s = malloc(1);
  if (*s) g_live_streams++;
  return *s ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult f_stream_destroy(CUstream s) {
  if (s) g_live_streams--;
  free(s);
  return CUDA_SUCCESS;
}
static CUresult f_event_create(CUevent *e, unsigned int flags) {
  (void)flags;
  double *t = malloc(sizeof *t);
  if (!t) return CUDA_ERROR_OUT_OF_MEMORY;
  *t = -1;
  *e = (CUevent)(void *)t;
  g_live_events++;
  return CUDA_SUCCESS;
}
static CUresult f_event_record(CUevent e, CUstream s) {
  (void)s;
  CUresult r = called("cuEventRecord");
  if (r) return r;
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  *(double *)(void *)e = g_clock_ms;
  return CUDA_SUCCESS;
}
static CUresult f_event_synchronize(CUevent e) { (void)e; return called("cuEventSynchronize"); }
static CUresult f_event_elapsed_time(float *ms, CUevent a, CUevent b) {
  CUresult r = called("cuEventElapsedTime");
  if (r) return r;
  if (!a || !b) return CUDA_ERROR_INVALID_HANDLE;
  const double ta = *(double *)(void *)a, tb = *(double *)(void *)b;
  if (ta < 0 || tb < 0) return CUDA_ERROR_INVALID_HANDLE; /* not recorded */
  *ms = (float)(tb - ta);
  return CUDA_SUCCESS;
}
static CUresult f_event_destroy(CUevent e) {
  if (e) g_live_events--;
  free(e);
  return CUDA_SUCCESS;
}
/* CUDA executor (runtime/exec/mg_cuda_exec.c): asynchronous copies run at once on host memory;
 * every stream queries idle. */
static CUresult f_memcpy_dtod_async(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  (void)s;
  memcpy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
  return CUDA_SUCCESS;
}
static CUresult f_memcpy_2d_async(const CUDA_MEMCPY2D *c, CUstream s) {
  (void)s;
  /* device to device, or host to device (the executor's upload of cu_seqlens) */
  if (!c || (c->srcMemoryType != CU_MEMORYTYPE_DEVICE && c->srcMemoryType != CU_MEMORYTYPE_HOST) ||
      c->dstMemoryType != CU_MEMORYTYPE_DEVICE || c->WidthInBytes > c->srcPitch ||
      c->WidthInBytes > c->dstPitch)
    return CUDA_ERROR_INVALID_VALUE;
  const char *src = c->srcMemoryType == CU_MEMORYTYPE_HOST ? (const char *)c->srcHost
                                                            : (const char *)(uintptr_t)c->srcDevice;
  for (size_t r = 0; r < c->Height; r++)
    memcpy((char *)(uintptr_t)c->dstDevice + (c->dstY + r) * c->dstPitch + c->dstXInBytes,
           src + (c->srcY + r) * c->srcPitch + c->srcXInBytes,
           c->WidthInBytes);
  return CUDA_SUCCESS;
}
/* Done, unless injected (CUDA_ERROR_NOT_READY: not finished yet, once). */
static CUresult f_stream_query(CUstream s) { (void)s; return called("cuStreamQuery"); }
static const struct { CUresult r; const char *name, *text; } g_errors[] = {
  {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
  {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
  {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
  {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
  {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
  {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
  {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
  {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
};
static CUresult f_get_error_string(CUresult r, const char **s) {
  *s = "fake error";
  for (size_t i = 0; i < sizeof g_errors / sizeof g_errors[0]; i++)
    if (g_errors[i].r == r) *s = g_errors[i].text;
  return CUDA_SUCCESS;
}
static CUresult f_get_error_name(CUresult r, const char **s) {
  *s = "CUDA_ERROR_UNKNOWN";
  for (size_t i = 0; i < sizeof g_errors / sizeof g_errors[0]; i++)
    if (g_errors[i].r == r) *s = g_errors[i].name;
  return CUDA_SUCCESS;
}

/* cuTensorMapEncodeTiled: the host executor's format (tests/host/mg_host_tmap.h), which its
 * TMA emulation reads; the same argument checks as the driver's. */
static CUresult f_tensor_map_encode_tiled(CUtensorMap *map, CUtensorMapDataType dtype,
                                          cuuint32_t rank, void *base, const cuuint64_t *dims,
                                          const cuuint64_t *strides, const cuuint32_t *box,
                                          const cuuint32_t *estrides,
                                          CUtensorMapInterleave interleave,
                                          CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
                                          CUtensorMapFloatOOBfill fill) {
  CUresult r = called("cuTensorMapEncodeTiled");
  if (r != CUDA_SUCCESS) return r;
  return mg_host_tmap_encode(map, dtype, rank, base, dims, strides, box, estrides, interleave,
                             swizzle, l2, fill);
}

/* Symbol names as cuGetProcAddress takes them (without version suffixes). */
static const struct { const char *name; void *fn; } table[] = {
  {"cuInit", (void *)f_init},
  {"cuDriverGetVersion", (void *)f_driver_get_version},
  {"cuDeviceGet", (void *)f_device_get},
  {"cuDeviceGetCount", (void *)f_device_get_count},
  {"cuDeviceGetName", (void *)f_device_get_name},
  {"cuDeviceGetAttribute", (void *)f_device_get_attribute},
  {"cuCtxGetCurrent", (void *)f_ctx_get_current},
  {"cuCtxGetDevice", (void *)f_ctx_get_device},
  {"cuModuleLoadData", (void *)f_module_load_data},
  {"cuModuleUnload", (void *)f_module_unload},
  {"cuModuleGetFunction", (void *)f_module_get_function},
  {"cuFuncSetAttribute", (void *)f_func_set_attribute},
  {"cuLaunchKernel", (void *)f_launch_kernel},
  {"cuMemAlloc", (void *)f_mem_alloc},
  {"cuMemFree", (void *)f_mem_free},
  {"cuMemcpyHtoD", (void *)f_memcpy_htod},
  {"cuMemcpyDtoH", (void *)f_memcpy_dtoh},
  {"cuStreamSynchronize", (void *)f_stream_synchronize},
  {"cuGetErrorString", (void *)f_get_error_string},
  {"cuGetErrorName", (void *)f_get_error_name},
  {"cuDevicePrimaryCtxRetain", (void *)f_primary_ctx_retain},
  {"cuDevicePrimaryCtxRelease", (void *)f_primary_ctx_release},
  {"cuCtxSetCurrent", (void *)f_ctx_set_current},
  {"cuCtxSynchronize", (void *)f_ctx_synchronize},
  {"cuMemGetInfo", (void *)f_mem_get_info},
  {"cuMemsetD8", (void *)f_memset_d8},
  {"cuStreamCreate", (void *)f_stream_create},
  {"cuStreamDestroy", (void *)f_stream_destroy},
  {"cuEventCreate", (void *)f_event_create},
  {"cuEventRecord", (void *)f_event_record},
  {"cuEventSynchronize", (void *)f_event_synchronize},
  {"cuEventElapsedTime", (void *)f_event_elapsed_time},
  {"cuEventDestroy", (void *)f_event_destroy},
  {"cuMemsetD8Async", (void *)f_memset_d8_async},
  {"cuMemcpyDtoDAsync", (void *)f_memcpy_dtod_async},
  {"cuMemcpy2DAsync", (void *)f_memcpy_2d_async},
  {"cuStreamQuery", (void *)f_stream_query},
  {"cuTensorMapEncodeTiled", (void *)f_tensor_map_encode_tiled},
};

/* cuGetProcAddress_v2 (CUDA >= 12.0). The loader asks for the ABI version of each
 * entry; the fake serves one version of each and accepts any requested version >= 2000. */
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                    cuuint64_t flags, CUdriverProcAddressQueryResult *status) {
  (void)flags;
  if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
  *pfn = NULL;
  if (cudaVersion < 2000) {
    if (status) *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
    return CUDA_ERROR_NOT_FOUND;
  }
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
    if (strcmp(table[i].name, symbol) == 0) {
      *pfn = table[i].fn;
      if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
      return CUDA_SUCCESS;
    }
  if (status) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return CUDA_ERROR_NOT_FOUND;
}

/* ---- a fake cuBLAS ---------------------------------------------------------------------
 * The same library stands in for libcublas (point MLAGEN_LIBCUBLAS at it): the entry points
 * runtime/exec/mg_cuda_ops.c resolves, computing nothing. As cuBLAS does, cublasSetStream puts
 * the handle back on the library's own workspace, and cublasSetWorkspace refuses a pointer
 * not 256-byte aligned. Each GEMM records the workspace it would use:
 * fake_cublas_stats(&gemms, &own, &ws, &bytes) gives the GEMMs so far, how many ran on the
 * library's own workspace (none set since the last cublasSetStream: cuBLAS would allocate),
 * and the last GEMM's caller workspace; fake_cuda_reset clears them. */
typedef struct fake_blas {
  void *ws; /* NULL: the library's own */
  size_t ws_bytes;
} fake_blas;
static struct { int gemms, own; void *ws; size_t ws_bytes; } g_blas;

EXPORT cublasStatus_t cublasCreate_v2(cublasHandle_t *h) {
  fake_blas *b = calloc(1, sizeof *b);
  if (!b) return CUBLAS_STATUS_ALLOC_FAILED;
  *h = (cublasHandle_t)(void *)b;
  return CUBLAS_STATUS_SUCCESS;
}
EXPORT cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
  free((void *)h);
  return CUBLAS_STATUS_SUCCESS;
}
EXPORT cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
  (void)s;
  fake_blas *b = (fake_blas *)(void *)h;
  b->ws = NULL, b->ws_bytes = 0;
  return CUBLAS_STATUS_SUCCESS;
}
EXPORT cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void *ws, size_t bytes) {
  if ((uintptr_t)ws % 256) return CUBLAS_STATUS_INVALID_VALUE;
  fake_blas *b = (fake_blas *)(void *)h;
  b->ws = ws, b->ws_bytes = bytes;
  return CUBLAS_STATUS_SUCCESS;
}
EXPORT const char *cublasGetStatusString(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS ? "success" : "fake cuBLAS error";
}
EXPORT cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
    const void *alpha, const void *A, cudaDataType at, int lda, long long sa, const void *B,
    cudaDataType bt, int ldb, long long sb, const void *beta, void *C, cudaDataType ct, int ldc,
    long long sc, int batch, cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  (void)ta, (void)tb, (void)alpha, (void)A, (void)at, (void)lda, (void)sa, (void)B, (void)bt;
  (void)ldb, (void)sb, (void)beta, (void)C, (void)ct, (void)ldc, (void)sc, (void)compute, (void)algo;
  if (m < 0 || n < 0 || k < 0 || batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
  const fake_blas *b = (const fake_blas *)(void *)h;
  g_blas.gemms++;
  if (!b->ws) g_blas.own++;
  else g_blas.ws = b->ws, g_blas.ws_bytes = b->ws_bytes;
  return CUBLAS_STATUS_SUCCESS;
}
static void fake_cublas_reset(void) { memset(&g_blas, 0, sizeof g_blas); }
EXPORT void fake_cublas_stats(int *gemms, int *own, void **ws, size_t *bytes) {
  *gemms = g_blas.gemms, *own = g_blas.own, *ws = g_blas.ws, *bytes = g_blas.ws_bytes;
}
