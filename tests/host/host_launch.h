/* Host executor for generated CUDA kernels: launch API (C11 and C++).
 *
 * The kernel source and tests/host/cuda_host.cpp are compiled together into one
 * shared object (see tests/host/README.md); this header declares what a test
 * finds in it with dlsym. Nothing here needs CUDA headers. */
#ifndef MG_HOST_LAUNCH_H
#define MG_HOST_LAUNCH_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mg_host_dim3 {
  unsigned x, y, z;
} mg_host_dim3;

/* Return codes of mg_host_launch (0 is success). */
enum {
  MG_HOST_E_CONFIG = -1,     /* bad grid/block shape, block > 1024 threads, dyn smem too large */
  MG_HOST_E_DIVERGENCE = -2, /* barrier or warp divergence: deadlock, exited threads, mismatch */
  MG_HOST_E_MASK = -3,       /* warp collective with an unsupported mask or width, bad lane */
  MG_HOST_E_NOMEM = -4,      /* fiber stacks could not be allocated */
  MG_HOST_E_TRAP = -5,       /* the kernel called __trap() */
  MG_HOST_E_BUSY = -6        /* mg_host_launch called from inside a running launch */
};

/* Largest dynamic shared memory a launch may ask for (228 KiB, as on sm_90). */
#define MG_HOST_MAX_DYN_SMEM (228u * 1024u)

/* Runs fn(ctx) as the body of every thread of every block of the grid. Returns 0, or
 * a negative value with a message in msg (barrier divergence, bad mask, dynamic smem
 * too large, block larger than 1024 threads). msg may be NULL when msg_len is 0; it is
 * set to "" on success. Blocks run one after another, in x, then y, then z order; the
 * threads of a block are cooperative fibers of the calling OS thread. */
int mg_host_launch(mg_host_dim3 grid, mg_host_dim3 block, size_t dyn_smem,
                   void (*fn)(void *ctx), void *ctx, char *msg, size_t msg_len);

typedef int (*mg_host_launch_fn)(mg_host_dim3, mg_host_dim3, size_t, void (*)(void *),
                                 void *, char *, size_t);

#ifdef __cplusplus
}
#endif

#endif /* MG_HOST_LAUNCH_H */
