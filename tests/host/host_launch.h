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
  MG_HOST_E_CONFIG = -1,     /* bad grid/block shape, block > 1024 threads, shared memory over
                                the arch's limit, unknown arch */
  MG_HOST_E_DIVERGENCE = -2, /* barrier or warp divergence: deadlock, exited threads, mismatch */
  MG_HOST_E_MASK = -3,       /* warp collective with an unsupported mask or width, bad lane */
  MG_HOST_E_NOMEM = -4,      /* fiber stacks could not be allocated */
  MG_HOST_E_TRAP = -5,       /* the kernel called __trap() */
  MG_HOST_E_BUSY = -6,       /* called from inside a launch, or while another OS thread runs
                                one with the same kernel object */
  MG_HOST_E_PTX = -7         /* ldmatrix/cp.async/mma misuse: misaligned or non-shared address,
                                short warp, bad size */
};

/* Size of the executor's dynamic shared-memory buffer (228 KiB): no architecture allows
 * more per block; the launch's arch sets the limit (mg_host_launch_opts.arch). */
#define MG_HOST_MAX_DYN_SMEM (228u * 1024u)

/* Runs fn(ctx) as the body of every thread of every block of the grid. Returns 0, or
 * a negative value with a message in msg (barrier divergence, bad mask, dynamic smem
 * too large, block larger than 1024 threads). msg may be NULL when msg_len is 0; it is
 * set to "" on success. Several blocks are resident at once and start in a shuffled
 * order; the threads of every resident block are cooperative fibers of the calling OS
 * thread, scheduled in a shuffled order (see mg_host_launch_opts; this uses the
 * defaults). */
int mg_host_launch(mg_host_dim3 grid, mg_host_dim3 block, size_t dyn_smem,
                   void (*fn)(void *ctx), void *ctx, char *msg, size_t msg_len);

typedef int (*mg_host_launch_fn)(mg_host_dim3, mg_host_dim3, size_t, void (*)(void *),
                                 void *, char *, size_t);

/* One wgmma.mma_async of the sm_90a emulation as the executor issued it (when the last of
 * its warpgroup's 128 threads arrived): mg_host_launch_opts.wgmma_trace. */
typedef struct mg_host_wgmma_issue {
  unsigned block;     /* linear block index: x + grid.x (y + grid.y z) */
  unsigned warpgroup; /* threadIdx.x / 128 of the issuing warpgroup */
  unsigned n;         /* the instruction's N */
  int a_regs;         /* 1: A from registers (wgmma ... rs), 0: A from a descriptor */
  int line;           /* the kernel's source line of the call */
} mg_host_wgmma_issue;

/* A global buffer whose reads a launch records per block (mg_host_launch_opts.read_watch):
 * which of its rows each block copied into shared memory. The data-moving instructions are
 * seen, not plain loads: cp.async (the bytes it reads: none for a zero-filled copy,
 * src-size 0) and the sm_90a emulation's TMA tile loads (the in-bounds elements of a box).
 * So a test can tell which key rows (tiles) a CTA spent work on, independently of the
 * kernel's own range logic. */
typedef struct mg_host_read_watch {
  const void *base; /* the buffer's first byte */
  size_t row_bytes; /* bytes from one row to the next (> 0) */
  size_t rows;      /* rows in the buffer: reads past base + rows row_bytes are not recorded */
  /* [grid blocks][rows], the caller's: the launch clears it, then sets read[b rows + r] to 1
   * when block b (linear index x + grid.x (y + grid.y z)) read a byte of row r. */
  unsigned char *read;
} mg_host_read_watch;

/* Options of mg_host_launch_ex; all zero (or a NULL pointer) gives the defaults, which
 * are also what mg_host_launch uses. */
typedef struct mg_host_launch_opts {
  /* Seed of the shuffled schedule: the order blocks start in; whenever the running
   * thread waits (barrier, warp collective, exit), the next one is drawn at random among
   * the runnable threads of its block (now and then, another resident block's), and at
   * the completion of a barrier or collective the last thread to arrive yields too;
   * pending cp.async copies land at random scheduling points. Every draw comes from the
   * seed, so a launch is reproducible from it. 0: the value of $MG_HOST_SEED when set,
   * else 1. */
  unsigned long long seed;
  /* 1: the deterministic round-robin schedule instead (one block at a time in x, y, z
   * order, thread 0 first, then in index order; no yields; copies land at the wait).
   * Also with $MG_HOST_SCHEDULE=rr. */
  int round_robin;
  /* 1: do not fill shared memory (static and dynamic) with NaN (0xff bytes) before each
   * block. */
  int no_nan_fill;
  /* Fiber stack size in KiB; 0: $MG_HOST_STACK_KB, else 64 (256 under ASan). */
  unsigned stack_kb;
  /* The GPU architecture whose shared-memory limit applies (80 for sm_80, 86, 89, 90,
   * ...): a launch whose static plus dynamic shared memory exceeds the per-block opt-in
   * maximum (sm_80 163 KiB, sm_86/89 99 KiB, sm_90 227 KiB, ...) fails with
   * MG_HOST_E_CONFIG. 0: $MG_HOST_ARCH, else 90. */
  unsigned arch;
  /* Blocks resident at once (shuffled schedule only): their fibers interleave, each with
   * its own shared memory, so one block's global-memory writes and atomics interleave
   * with another's. 0: $MG_HOST_RESIDENT_BLOCKS, else 3 (at most 32, at most the grid). */
  unsigned resident_blocks;
  /* A scheduling point hands over to a resident block drawn at random with probability
   * 1/block_switch (the completion of a barrier with probability 1/4). 0:
   * $MG_HOST_BLOCK_SWITCH, else 2048. */
  unsigned block_switch;
  /* When not NULL: the launch records every wgmma.mma_async it issues, in issue order
   * (each block's in its own order; blocks interleave), into wgmma_trace[0 ..
   * wgmma_trace_cap - 1] and sets *wgmma_trace_len to the number issued (past the cap
   * counted, not recorded; wgmma_trace_len must not be NULL then). The order in which
   * warpgroups reach the tensor cores: what a schedule such as ping-pong decides, which
   * named barriers order without any data to show it. */
  mg_host_wgmma_issue *wgmma_trace;
  size_t wgmma_trace_cap;
  size_t *wgmma_trace_len;
  /* When not NULL: the rows of a buffer each block reads (see mg_host_read_watch; its read
   * must not be NULL and row_bytes not 0, else MG_HOST_E_CONFIG). */
  const mg_host_read_watch *read_watch;
} mg_host_launch_opts;

/* mg_host_launch with options (opts may be NULL). */
int mg_host_launch_ex(mg_host_dim3 grid, mg_host_dim3 block, size_t dyn_smem,
                      const mg_host_launch_opts *opts, void (*fn)(void *ctx), void *ctx,
                      char *msg, size_t msg_len);

typedef int (*mg_host_launch_ex_fn)(mg_host_dim3, mg_host_dim3, size_t,
                                    const mg_host_launch_opts *, void (*)(void *), void *,
                                    char *, size_t);

/* How this kernel object finds its shared memory, known after its first launch: 1 with
 * emulated TLS (clang -femulated-tls: every static __shared__ array is a separate heap
 * block, so ASan reports out-of-bounds accesses to it), 0 with native TLS (static
 * __shared__ arrays are filled with NaN but ASan cannot see their bounds; the dynamic
 * buffer is checked either way), -1 before the first launch. */
int mg_host_smem_emulated(void);

#ifdef __cplusplus
}
#endif

#endif /* MG_HOST_LAUNCH_H */
