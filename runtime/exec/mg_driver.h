/* mg_driver.h: the CUDA driver, loaded at run time.
 *
 * libcuda is never linked: nothing is loaded when the library is, and a machine without
 * a driver runs every CPU path. The first call of mg_driver_get() dlopen()s
 * "libcuda.so.1" (or the path in the environment variable MLAGEN_LIBCUDA, the test seam:
 * tests point it at a fake driver, tests/fake_cuda.c), takes cuGetProcAddress from it
 * (dlsym "cuGetProcAddress_v2", CUDA >= 12.0, else "cuGetProcAddress", CUDA 11.3..11.8),
 * resolves every entry point below through it at the ABI version the table names, and
 * calls cuInit(0) and cuDriverGetVersion. That attempt is made once per process
 * (pthread_once, so concurrent first calls are safe); its result, the table or the
 * failure and its message, is what every later call returns. The library handle stays
 * open for the life of the process once loading succeeded.
 *
 * Types are those of <cuda.h> and <cudaTypedefs.h> (headers only). */
#ifndef MG_DRIVER_H
#define MG_DRIVER_H
#include <cuda.h>
#include <cudaTypedefs.h>

#include "mg_diag.h"
#include "mlagen.h"

/* X(name, version): every driver entry point mlagen calls, with the CUDA version of the
 * ABI it is called with (cudaTypedefs.h's PFN_<name>_v<version>; cuGetProcAddress
 * returns that version of the symbol, e.g. cuMemAlloc at 3020 is cuMemAlloc_v2).
 * cuEventElapsedTime is taken at 2000, not 12080 (its _v2, same signature), so drivers
 * older than 12.8 still resolve every entry. */
#define MG_DRIVER_ENTRIES(X)  \
  X(cuInit, 2000)             \
  X(cuDriverGetVersion, 2020) \
  X(cuDeviceGet, 2000)        \
  X(cuDeviceGetCount, 2000)   \
  X(cuDeviceGetName, 2000)    \
  X(cuDeviceGetAttribute, 2000) \
  X(cuCtxGetCurrent, 4000)    \
  X(cuCtxGetDevice, 2000)     \
  X(cuModuleLoadData, 2000)   \
  X(cuModuleUnload, 2000)     \
  X(cuModuleGetFunction, 2000) \
  X(cuFuncSetAttribute, 9000) \
  X(cuLaunchKernel, 4000)     \
  X(cuMemAlloc, 3020)         \
  X(cuMemFree, 3020)          \
  X(cuMemcpyHtoD, 3020)       \
  X(cuMemcpyDtoH, 3020)       \
  X(cuStreamSynchronize, 2000) \
  X(cuGetErrorString, 6000)   \
  X(cuGetErrorName, 6000)     \
  X(cuDevicePrimaryCtxRetain, 7000) \
  X(cuDevicePrimaryCtxRelease, 11000) \
  X(cuCtxSetCurrent, 4000)    \
  X(cuCtxSynchronize, 2000)   \
  X(cuMemGetInfo, 3020)       \
  X(cuMemsetD8, 3020)         \
  X(cuStreamCreate, 2000)     \
  X(cuStreamDestroy, 4000)    \
  X(cuEventCreate, 2000)      \
  X(cuEventRecord, 2000)      \
  X(cuEventSynchronize, 2000) \
  X(cuEventElapsedTime, 2000) \
  X(cuEventDestroy, 4000)     \
  X(cuMemsetD8Async, 3020)    \
  X(cuMemcpyDtoDAsync, 3020)  \
  X(cuMemcpy2DAsync, 3020)    \
  X(cuStreamQuery, 2000)

/* The table. Fields are named as the functions and called as drv->cuMemAlloc(...);
 * <cuda.h> maps some names to versioned ones (cuMemAlloc -> cuMemAlloc_v2) in the field
 * declaration and at every use alike, so both always agree. */
typedef struct mg_driver {
#define MG_DRIVER__FIELD(name, version) PFN_##name##_v##version name;
  MG_DRIVER_ENTRIES(MG_DRIVER__FIELD)
#undef MG_DRIVER__FIELD
  /* Optional entry points: NULL when the driver lacks them (loading does not fail).
   * cuTensorMapEncodeTiled (CUDA 12.0): the CUtensorMap of the sm_90a kernels' TMA loads. */
  PFN_cuTensorMapEncodeTiled_v12000 cuTensorMapEncodeTiled;
  int driver_version; /* cuDriverGetVersion: 1000 major + 10 minor, e.g. 13000 */
  char path[256];     /* the library loaded ("libcuda.so.1" or $MLAGEN_LIBCUDA) */
} mg_driver;

/* Number of entry points in the table (MG_DRIVER_ENTRIES). */
#define MG_DRIVER_N_ENTRIES 37

/* The loaded driver. Loads it on the first call (see above); thread-safe.
 * Returns 0 and sets *out, or (with *out NULL):
 *   MLAGEN_EINVAL     out is NULL.
 *   MLAGEN_ENODRIVER  the library cannot be opened ("no CUDA driver: libcuda.so.1 not
 *                     found (dlopen: <dlerror>)"); it has no cuGetProcAddress (a driver
 *                     older than CUDA 11.3); an entry point cannot be resolved (names the
 *                     entry, its version and the CUresult); cuInit or cuDriverGetVersion
 *                     fails (names the CUDA error, e.g. CUDA_ERROR_NO_DEVICE).
 * A failure is final for the process: later calls return the same status and message. */
int mg_driver_get(const mg_driver **out, mg_diag *d);

/* For CUresult r: 0 when r is CUDA_SUCCESS, else sets d to "<what>: <CUDA error name>
 * (<CUDA error string>)" and returns status. drv may be NULL (the error is then named by
 * its number). */
int mg_driver_check(const mg_driver *drv, CUresult r, int status, const char *what, mg_diag *d);

/* mg_driver_check for a failed call of the executors and the tuner: CUDA_ERROR_OUT_OF_MEMORY
 * is MLAGEN_ENOMEM, any other error MLAGEN_EDRIVER. */
static inline int mg_driver_fail(const mg_driver *drv, CUresult r, const char *what, mg_diag *d) {
  return mg_driver_check(drv, r, r == CUDA_ERROR_OUT_OF_MEMORY ? MLAGEN_ENOMEM : MLAGEN_EDRIVER,
                         what, d);
}

/* Entry i (0 <= i < MG_DRIVER_N_ENTRIES) of the table: its name and resolved address,
 * for tests and diagnostics; returns NULL past the end. */
const char *mg_driver_entry(const mg_driver *drv, int i, void **fn);
#endif
