/* mg_dev_ops.h: the device-operations seam of the CUDA executor (mg_cuda_exec.h): what a
 * plan's steps need from a device (load and launch a generated kernel, memset, copies, a
 * GEMM, a completion query), as a vtable, so the executor runs on the GPU (mg_dev_ops_cuda,
 * mg_cuda_ops.c) and, in the tests, on host memory (tests/cuda_exec_host_ops.h). */
#ifndef MG_DEV_OPS_H
#define MG_DEV_OPS_H
#include <stddef.h>

#include "mg_diag.h"
#include "mg_dtype.h"
#include "mg_generate.h" /* mg_kernel */
#include "mg_plan.h"     /* mg_gemm */

/* A kernel launch rule and the grid computed from it come from generator/gen/mg_manifest.h. */
struct mg_launch_rule;

/* Device operations. Every pointer is device memory (host memory for a CPU
 * implementation); stream is the caller's CUstream (NULL: the default stream). Every
 * function returns 0 or a negative MLAGEN_E* status with a message in d. */
typedef struct mg_dev_ops mg_dev_ops;
struct mg_dev_ops {
  const char *name; /* "cuda", "host", ... for messages */
  /* The device, for the tuned-configuration lookup (docs/tuning.md): the architecture
   * kernels are compiled for ("sm_90a") and the device name as the driver reports it.
   * arch "" (a CPU implementation): no lookup, every kernel uses its template's default. */
  char arch[16];
  char device[128];
  /* The CUDA driver whose cuTensorMapEncodeTiled encodes, at each launch, the tensor maps an
   * sm_90a family takes by value (runtime/exec/mg_sm90_tmap.h); NULL, or a driver without
   * that entry: the executor runs the portable mma.sync families, whatever arch says. */
  const struct mg_driver *drv;
  /* The generator the ops compile kernels with (the device header and template hash for
   * NVRTC), which the executor then also renders with, so one is opened per device ops;
   * NULL: the ops need none (the executor opens the embedded templates itself). */
  mg_gen *gen;
  /* Makes generated kernel k launchable with launch rule *rule; *handle is what launch
   * takes, valid until destroy. Called once per distinct kernel name. */
  int (*load)(mg_dev_ops *o, const mg_kernel *k, const struct mg_launch_rule *rule, void **handle,
              mg_diag *d);
  /* Launches a loaded kernel: grid and block dims, dynamic shared memory in bytes, params
   * one pointer per kernel parameter in the manifest's order (cuLaunchKernel's
   * kernelParams). The grid has no zero dim. */
  int (*launch)(mg_dev_ops *o, void *handle, const unsigned grid[3], const unsigned block[3],
                size_t smem, void **params, void *stream, mg_diag *d);
  /* bytes of dst set to the byte value. */
  int (*memset)(mg_dev_ops *o, void *dst, int value, size_t bytes, void *stream, mg_diag *d);
  /* bytes from src to dst (no overlap). */
  int (*copy)(mg_dev_ops *o, void *dst, const void *src, size_t bytes, void *stream, mg_diag *d);
  /* bytes from host memory src to device memory dst, queued on stream (copy is device to
   * device only): src may be changed or freed as soon as the call returns (the GPU ops'
   * driver stages pageable host memory before it returns, and may first wait for the
   * stream's earlier work). The CUDA executor uploads a varlen plan's cu_seqlens with it
   * at the start of each pass. NULL: ops for unpacked plans only. */
  int (*upload)(mg_dev_ops *o, void *dst, const void *src, size_t bytes, void *stream, mg_diag *d);
  /* height rows of width bytes: row r from src + r spitch to dst + r dpitch. */
  int (*copy2d)(mg_dev_ops *o, void *dst, size_t dpitch, const void *src, size_t spitch,
                size_t width, size_t height, void *stream, mg_diag *d);
  /* The GEMM g (mg_plan.h: row-major, strided batched, offsets and strides in elements,
   * beta 0 or 1, alpha 1) on the buffers A, B, C (their first element) of dtypes ta, tb
   * (bf16 or f16, equal) and tc (the same, or f32). Accumulates in f32. */
  int (*gemm)(mg_dev_ops *o, const mg_gemm *g, mg_dtype ta, const void *A, mg_dtype tb,
              const void *B, mg_dtype tc, void *C, void *stream, mg_diag *d);
  /* The device scratch the GEMMs queued from now on may use: ws (MG_CUDA_EXEC_ALIGN-byte
   * aligned), bytes long, a slice of the caller's workspace; the executor calls it at the
   * start of every pass of a plan with GEMMs. NULL: the GEMMs need no scratch (CPU
   * implementations). */
  int (*gemm_workspace)(mg_dev_ops *o, void *ws, size_t bytes, mg_diag *d);
  /* *done = 1 when every operation queued on stream has finished, else 0; an error of a
   * finished operation (a kernel fault) is returned. */
  int (*query)(mg_dev_ops *o, void *stream, int *done, mg_diag *d);
  /* Frees the implementation and everything load made; NULL-safe through
   * mg_dev_ops_destroy. */
  void (*destroy)(mg_dev_ops *o);
};

static inline void mg_dev_ops_destroy(mg_dev_ops *o) {
  if (o) o->destroy(o);
}

/* The GPU implementation: the CUDA driver (runtime/exec/mg_driver.h; the CUDA context current
 * on the calling thread at creation, or device 0's primary context, retained and made
 * current when none is, must be current at every later call), kernels
 * compiled by NVRTC for the current device's architecture (sm_90a for compute capability
 * 9.0, else sm_<major><minor>; JIT cache as mg_jit_compile's) and loaded into a module
 * registry (runtime/exec/mg_module.h), GEMMs by cuBLAS (libcublas.so.13, .12 or .11, or the
 * path in $MLAGEN_LIBCUBLAS, loaded with dlopen at creation: cublasGemmStridedBatchedEx,
 * 16-bit operands, f32 compute, row-major by swapping the operands; every GEMM sets the
 * stream, then the workspace gemm_workspace gave (cublasSetWorkspace, as cublasSetStream
 * resets it), and a GEMM before any gemm_workspace is MLAGEN_EINVAL).
 * Errors: MLAGEN_EINVAL out NULL; MLAGEN_ENODRIVER no CUDA driver (the loader's message);
 * MLAGEN_EDRIVER a context or device query failed (the call and the CUDA error), cuBLAS
 * cannot be loaded ("cuBLAS not found (GEMMs of the CUDA executor): <dlerror>...") or
 * lacks an entry point, or cannot be created
 * (cublasCreate: the cuBLAS status); MLAGEN_ENOMEM. *out is NULL on error. */
int mg_dev_ops_cuda(mg_dev_ops **out, mg_diag *d);
#endif
