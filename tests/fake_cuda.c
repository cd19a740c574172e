/* fake_cuda.c: a stand-in for libcuda.so.1, built as a shared library for the tests.
 *
 * The driver loader (runtime/mg_driver.c) is pointed at it with MLAGEN_LIBCUDA. It
 * exports cuGetProcAddress_v2 only, as a real driver does for lookups, and answers it
 * for every entry point mlagen resolves: one device, "Fake H200", compute capability
 * 9.0, 132 SMs, 227 KiB opt-in shared memory per block, driver version 13.0; memory calls use host memory; launches do nothing;
 * streams and events are opaque cells (every elapsed time is 1 ms). Everything succeeds.
 * FAKE_CUDA_FAIL_INIT=1 in the environment makes cuInit fail with CUDA_ERROR_NO_DEVICE. */
#include <cuda.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

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
    default: *v = 0; break;
  }
  return CUDA_SUCCESS;
}
static CUresult f_ctx_get_current(CUcontext *c) { *c = NULL; return CUDA_SUCCESS; }
static CUresult f_ctx_get_device(CUdevice *d) { *d = 0; return CUDA_SUCCESS; }
static CUresult f_module_load_data(CUmodule *m, const void *image) {
  (void)image;
  *m = NULL;
  return CUDA_SUCCESS;
}
static CUresult f_module_unload(CUmodule m) { (void)m; return CUDA_SUCCESS; }
static CUresult f_module_get_function(CUfunction *f, CUmodule m, const char *name) {
  (void)m, (void)name;
  *f = NULL;
  return CUDA_SUCCESS;
}
static CUresult f_func_set_attribute(CUfunction f, CUfunction_attribute a, int v) {
  (void)f, (void)a, (void)v;
  return CUDA_SUCCESS;
}
static CUresult f_launch_kernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                unsigned by, unsigned bz, unsigned smem, CUstream s, void **params,
                                void **extra) {
  (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)smem, (void)s;
  (void)params, (void)extra;
  return CUDA_SUCCESS;
}
static CUresult f_mem_alloc(CUdeviceptr *p, size_t bytes) {
  void *m = malloc(bytes ? bytes : 1);
  if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
  *p = (CUdeviceptr)(uintptr_t)m;
  return CUDA_SUCCESS;
}
static CUresult f_mem_free(CUdeviceptr p) { free((void *)(uintptr_t)p); return CUDA_SUCCESS; }
static CUresult f_memcpy_htod(CUdeviceptr dst, const void *src, size_t n) {
  memcpy((void *)(uintptr_t)dst, src, n);
  return CUDA_SUCCESS;
}
static CUresult f_memcpy_dtoh(void *dst, CUdeviceptr src, size_t n) {
  memcpy(dst, (const void *)(uintptr_t)src, n);
  return CUDA_SUCCESS;
}
static CUresult f_stream_synchronize(CUstream s) { (void)s; return CUDA_SUCCESS; }
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
/* Streams and events are opaque heap cells; an event records nothing, every elapsed time
 * is 1 ms. */
static CUresult f_stream_create(CUstream *s, unsigned int flags) {
  (void)flags;
  *s = malloc(1);
  return *s ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult f_stream_destroy(CUstream s) { free(s); return CUDA_SUCCESS; }
static CUresult f_event_create(CUevent *e, unsigned int flags) {
  (void)flags;
  *e = malloc(1);
  return *e ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult f_event_record(CUevent e, CUstream s) { (void)e, (void)s; return CUDA_SUCCESS; }
static CUresult f_event_synchronize(CUevent e) { (void)e; return CUDA_SUCCESS; }
static CUresult f_event_elapsed_time(float *ms, CUevent a, CUevent b) {
  (void)a, (void)b;
  *ms = 1.0f;
  return CUDA_SUCCESS;
}
static CUresult f_event_destroy(CUevent e) { free(e); return CUDA_SUCCESS; }
static CUresult f_get_error_string(CUresult r, const char **s) {
  *s = r == CUDA_SUCCESS ? "no error" : r == CUDA_ERROR_NO_DEVICE ? "no CUDA-capable device is detected"
                                                                  : "fake error";
  return CUDA_SUCCESS;
}
static CUresult f_get_error_name(CUresult r, const char **s) {
  *s = r == CUDA_SUCCESS ? "CUDA_SUCCESS" : r == CUDA_ERROR_NO_DEVICE ? "CUDA_ERROR_NO_DEVICE"
                                                                      : "CUDA_ERROR_UNKNOWN";
  return CUDA_SUCCESS;
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
