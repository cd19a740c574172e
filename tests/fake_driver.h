/* fake_driver.h: how a test points the driver loader (runtime/exec/mg_driver.c) at the fake
 * libcuda of tests/fake_cuda.c, or at no driver, and reaches the fake's test hooks.
 *
 * The loader reads MLAGEN_LIBCUDA once per process, at the first call that needs the
 * driver: a test picks the outcome (fake_driver_use) before any such call, one process per
 * outcome. The hooks are found with dlopen of the same path (the loader gets the same
 * handle) and dlsym. Targets registered with mlagen_test(... FAKE_CUDA ...) get this file's
 * source and MLAGEN_FAKE_CUDA, the fake's path (tests/CMakeLists.txt). */
#ifndef MLAGEN_TESTS_FAKE_DRIVER_H
#define MLAGEN_TESTS_FAKE_DRIVER_H

#include <stddef.h>

/* A libcuda path that does not exist: the loader's "no CUDA driver" outcome. */
#define NO_SUCH_LIBCUDA "/nonexistent/mlagen-test/libcuda.so.1"

/* The fake's test hooks (tests/fake_cuda.c says what each does). */
typedef struct fake_cuda {
  int (*count)(const char *name);            /* calls of an entry point, or live_* counts */
  void (*inject)(const char *name, int code); /* the next call of name returns code */
  void (*last_launch)(unsigned grid[3], unsigned block[3], unsigned *smem, void **stream);
  int (*attr_value)(void *fn);               /* a function's dynamic smem limit */
  void (*reset)(void);                       /* counters and failure cleared */
  void (*cublas_stats)(int *gemms, int *own, void **ws, size_t *bytes); /* the fake cuBLAS */
} fake_cuda;

/* Sets MLAGEN_LIBCUDA to path (NULL: NO_SUCH_LIBCUDA) and clears FAKE_CUDA_FAIL_INIT. */
void fake_driver_use(const char *path);

/* fake_driver_use(MLAGEN_FAKE_CUDA), then opens the fake and binds every hook into *f.
 * Returns 0, or -1 after printing the reason (dlopen's message, or the missing hook). */
int fake_driver_open(fake_cuda *f);

#endif
