/* mg_module.h: the module registry. Loads generated kernels' cubins (the bytes the JIT
 * cache holds: mg_cubin.data from runtime/jit/mg_jit.h) into the current CUDA context with
 * cuModuleLoadData, finds each kernel by name (cuModuleGetFunction), raises its dynamic
 * shared memory limit when its launch rule needs more than 48 KiB
 * (cuFuncSetAttribute CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES), and launches it
 * (cuLaunchKernel) on the caller's stream with the grid its manifest's launch rule gives
 * for the run-time sizes (mg_launch_rule, mg_launch_grid: generator/gen/mg_manifest.h).
 *
 * A registry belongs to one mlagen context and, through it, to the CUDA context that was
 * current when the registry was created: every load and launch must run with that CUDA
 * context current (the registry does not switch contexts). It caches one module and
 * function per kernel name (a second load of a name returns the cached kernel without
 * touching the driver) and unloads every module on destroy. A registry is not
 * thread-safe: like the context owning it, one thread at a time.
 *
 * cuModuleLoadData is used rather than cuLibraryLoadData: it exists on every driver the
 * loader accepts (CUDA >= 11.3), and a module is bound to one context, as a registry is.
 *
 * Errors. Every driver call is checked; a failure returns a status with a message naming
 * the call, the kernel and the CUDA error (cuGetErrorName and cuGetErrorString):
 *   MG_EDRIVER      a driver call failed (below);
 *   MLAGEN_ENOMEM   host allocation failed, or the driver returned CUDA_ERROR_OUT_OF_MEMORY;
 *   MLAGEN_EINVAL   a bad argument, a malformed launch rule, a kernel name the cubin does
 *                   not hold (cuModuleGetFunction: CUDA_ERROR_NOT_FOUND), a name not loaded;
 *   MLAGEN_ELIMIT   a computed grid over the device limits (x 2^31 - 1, y and z 65535);
 *   MLAGEN_ENODRIVER  no CUDA driver (mg_registry_create).
 * Nothing aborts or prints. */
#ifndef MG_MODULE_H
#define MG_MODULE_H
#include <stddef.h>

#include "mg_diag.h"
#include "mg_driver.h"
#include "mg_manifest.h" /* mg_launch_rule, mg_launch_dims, mg_kernel_info */
#include "mlagen.h"

/* The status of a failed driver call. */
#define MG_EDRIVER MLAGEN_EDRIVER

/* Dynamic shared memory a kernel may use without raising its limit: 48 KiB. */
#define MG_DEFAULT_DYN_SMEM (48 * 1024)

typedef struct mg_module_registry mg_module_registry;

/* A loaded kernel; owned by its registry, valid until the registry is destroyed. */
typedef struct mg_module_kernel {
  const char *name;     /* the kernel's symbol name */
  CUmodule module;
  CUfunction function;
  mg_launch_rule rule;
  int smem_raised;      /* 1: cuFuncSetAttribute raised its dynamic smem to rule.smem */
} mg_module_kernel;

/* Creates an empty registry in *out, loading the CUDA driver if it is not loaded yet
 * (runtime/exec/mg_driver.h). Returns 0, or MLAGEN_EINVAL (out NULL), MLAGEN_ENODRIVER (no
 * driver: the loader's message), MLAGEN_ENOMEM; *out is NULL on error. */
int mg_registry_create(mg_module_registry **out, mg_diag *d);

/* Unloads every module (cuModuleUnload) and frees the registry; r NULL is a no-op
 * returning 0. Every module is unloaded and all memory freed even when an unload fails;
 * the first failure is returned (MG_EDRIVER, its message naming the kernel), else 0. */
int mg_registry_destroy(mg_module_registry *r, mg_diag *d);

/* Loads the kernel name from the cubin image (size bytes, > 0; the bytes are only read
 * during the call) with launch rule *rule, and sets *out. A name already in the registry
 * returns the cached kernel and touches neither the driver nor image (its first rule
 * stays). Otherwise: cuModuleLoadData, cuModuleGetFunction(name), and, when rule->smem >
 * 48 KiB, cuFuncSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem); on
 * any failure the module is unloaded again and the registry is unchanged.
 * Returns 0, or MLAGEN_EINVAL (an argument NULL, name empty or over 255 bytes, size 0;
 * the cubin has no kernel of that name: "kernel '<name>' not found in its cubin"),
 * MLAGEN_ENOMEM, MG_EDRIVER (cuModuleLoadData rejects the image, e.g.
 * CUDA_ERROR_INVALID_IMAGE or CUDA_ERROR_NO_BINARY_FOR_GPU for another architecture;
 * cuFuncSetAttribute fails, e.g. smem over the device's opt-in limit). *out is NULL on
 * error. */
int mg_registry_load(mg_module_registry *r, const char *name, const void *image, size_t size,
                     const mg_launch_rule *rule, const mg_module_kernel **out, mg_diag *d);

/* mg_registry_load for a generated kernel's typed manifest (mg_kernel.info): its name and
 * launch rule. Same returns; MLAGEN_EINVAL also for k NULL. */
int mg_registry_load_kernel(mg_module_registry *r, const mg_kernel_info *k, const void *image,
                            size_t size, const mg_module_kernel **out, mg_diag *d);

/* The loaded kernel named name in *out. Returns 0, or MLAGEN_EINVAL (an argument NULL, or
 * "no kernel '<name>' in the module registry"); *out is NULL on error. */
int mg_registry_find(const mg_module_registry *r, const char *name, const mg_module_kernel **out,
                     mg_diag *d);

/* Number of kernels (and modules: one each) loaded; 0 for r NULL. */
int mg_registry_count(const mg_module_registry *r);

/* Launches k on stream (0: the legacy default stream) with the grid of k's rule for dims
 * (mg_launch_grid), its block and its dynamic shared memory; args: one pointer per kernel
 * parameter, in the manifest's order (cuLaunchKernel's kernelParams). An empty grid (a dim
 * of 0) launches nothing and returns 0. Asynchronous: a fault inside the kernel shows at
 * the next synchronizing call, not here. Returns 0, or MLAGEN_EINVAL (r, k or dims NULL;
 * args NULL for a kernel with parameters is not detected; k not of this registry; a
 * negative dims field), MLAGEN_ELIMIT (a grid dim over its limit), MG_EDRIVER
 * (cuLaunchKernel fails: the message names the kernel, grid, block and smem), MLAGEN_ENOMEM
 * (CUDA_ERROR_OUT_OF_MEMORY). */
int mg_registry_launch(mg_module_registry *r, const mg_module_kernel *k, const mg_launch_dims *dims,
                       CUstream stream, void **args, mg_diag *d);
#endif
