/* kernel_host.h: what the generated-kernel tests share around the host executor
 * (tests/host/harness.h) and NVRTC: building a generated kernel for the host executor with
 * its launch values from the manifest, the manifest's grid rule, removing a barrier from a
 * kernel's source, the NVRTC sweep over a family's kept configurations, and the ASan child
 * run. Compiled into each test that uses it (tests/kernel_host.c); the test target must
 * define MLAGEN_CXX, MLAGEN_CUDA_INCLUDE and MLAGEN_TESTS_DIR. Failures are cmocka
 * failures of the calling test. Not a public header. */
#ifndef MG_KERNEL_HOST_H
#define MG_KERNEL_HOST_H
#include <stddef.h>
#include <stdint.h>

#include <cJSON.h>

#include "host/harness.h"
#include "mg_generate.h"
#include "mg_jit.h"
#include "mg_spec.h"

/* One dimension of a manifest's grid rule: {value} or ceil(arg * mul / div). */
enum { KH_GRID_VALUE, KH_GRID_SEQLEN_Q, KH_GRID_SEQLEN_K, KH_GRID_BATCH };
typedef struct kh_grid_rule {
  int arg; /* KH_GRID_* */
  long value, mul, div;
} kh_grid_rule;

/* A generated kernel built for the host executor. */
typedef struct kh_kernel {
  mg_host_kernel *k;
  void *fn;          /* the kernel function: call it through its own signature */
  int threads;       /* the manifest's launch.block[0] */
  size_t smem;       /* launch.smem, dynamic shared memory per block (0 when absent) */
  kh_grid_rule grid[3];
  char name[160];
  mg_kernel_spec spec;
  cJSON *manifest;   /* a copy of the kernel's manifest (config, launch, ...) */
} kh_kernel;

/* Edits a kernel's source before it is built; returns 0 to build nothing. */
typedef int (*kh_edit_fn)(char *source, void *ctx);

/* Generates spec's kernel with g (NULL: a generator of its own) and builds it for the host
 * executor (asan: an ASan build), after edit(source, ctx) when edit is given; prints the
 * build's time when it compiled. Returns 1, or 0 (out->k NULL, nothing to free) when edit
 * declined. A generator or build error fails the test. */
int kh_build_edited(mg_gen *g, const mg_kernel_spec *spec, int asan, kh_edit_fn edit,
                    void *ctx, kh_kernel *out);

/* kh_build_edited without an edit. */
void kh_build(mg_gen *g, const mg_kernel_spec *spec, int asan, kh_kernel *out);

/* Unloads the kernel and frees the manifest copy (a zeroed kh_kernel is fine). */
void kh_free(kh_kernel *bk);

/* The manifest's config.<name> / launch.<name>: a number, else the test fails. */
int kh_config_int(const kh_kernel *bk, const char *name);
int kh_config_int_or(const kh_kernel *bk, const char *name, int dflt); /* dflt when absent */
long kh_launch_value(const kh_kernel *bk, const char *name);
/* launch.<name> of any type (the test fails when absent). */
const cJSON *kh_launch_item(const kh_kernel *bk, const char *name);

/* The grid the manifest's rule gives for these arguments. */
mg_host_dim3 kh_grid(const kh_kernel *bk, long seqlen_q, long seqlen_k, long batch);

/* The architecture whose shared-memory limit kh_launch applies unless lo->arch says
 * otherwise: the kernels are generated for sm_80 and sm_90a (the NVRTC sweep compiles
 * both), and sm_80's 163 KiB per block is the smaller limit. */
#define KH_ARCH 80

/* Launches the kernel on grid with block (threads, 1, 1) and its dynamic shared memory:
 * thunk(args) is every thread's body, lo the schedule (NULL: the executor's defaults;
 * arch 0: KH_ARCH). A failed launch fails the test; returns the launch's wall time in
 * seconds. */
double kh_launch(const kh_kernel *bk, mg_host_dim3 grid, const mg_host_launch_opts *lo,
                 void (*thunk)(void *), void *args);

/* The spec of absorbed (MQA) family `family` (mqa_fwd, mqa_fwd_sm90, ...): H heads, latent
 * d_c + d_r, causal, bf16; d_n and d_v are the explicit form's 128 (the templates ignore
 * them). */
mg_kernel_spec kh_mqa_spec(const char *family, int H, int dc, int dr, int causal);

/* Applies a tunable assignment ("block_m=64") to s; a rejected one fails the test. */
void kh_set(mg_kernel_spec *s, const char *assignment);
/* kh_set of the assignment printf formats from fmt ("block_n=%d", 64). */
void kh_setf(mg_kernel_spec *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* An edit for kh_build_edited: blanks the which-th (from 0, in source order) barrier
 * statement, `__syncthreads();` or `__syncwarp();`, of the source, keeping every line where
 * it is; declines (returns 0) when there is no such barrier. */
typedef struct kh_drop {
  int which;      /* in: the barrier */
  int after_wait; /* out: its previous statement is a cp.async wait (it publishes copies) */
  int warp;       /* out: it is a __syncwarp() */
  char rest[160]; /* out: the rest of its line (its comment, if any) */
} kh_drop;
int kh_drop_edit(char *source, void *drop);

/* The NVRTC sweep: each kernel generated and compiled for sm_80 and sm_90a (the JIT cache,
 * $MLAGEN_CACHE_DIR, is used), with a line per architecture
 *   "  <prefix><name, name_width wide> <arch> regs .. spill ..+.. stack .."
 * (then " smem <launch.smem> (dynamic)" with KH_SWEEP_SMEM), and no spills, no stack frame
 * and no static shared memory asserted. */
enum {
  KH_SWEEP_SMEM = 1,          /* print the manifest's dynamic shared memory */
  KH_SWEEP_REJECTS = 2,       /* a configuration the template's check rejects is counted */
  KH_SWEEP_QUIET_REJECTS = 4, /* ... and not printed */
  KH_SWEEP_SM90_ONLY = 8,     /* compile for sm_90a only (kernels using sm_90a instructions) */
  KH_SWEEP_SINGLES = 16,      /* kh_sweep_cover: cover every single value, not every pair */
  KH_SWEEP_WGMMA_PIPELINED = 32, /* fail when ptxas serialized a kernel's wgmma (its note
                                    C7510..C7520 "wgmma.mma_async instructions are
                                    serialized": mg_jit_report.wgmma_serialized, which the
                                    JIT cache entry keeps, so a cache hit is checked too) */
};
typedef struct kh_sweep {
  mg_gen *g;
  const mg_jit_header *hdr;
  int n_hdr;
  mg_diag d;
  int name_width, flags;
  long max_smem;      /* > 0: launch.smem must not exceed it */
  int rejected;       /* configurations the template's check rejected */
  double t0;          /* when the sweep opened (kh_now) */
  char defaults[8192]; /* the lines of kernels compiled with prefix "default " */
} kh_sweep;

void kh_sweep_open(kh_sweep *sw, int name_width, int flags);
/* Returns 1 when s was compiled, 0 when the template's check rejected it (KH_SWEEP_REJECTS;
 * else that fails the test). */
int kh_sweep_compile(kh_sweep *sw, const mg_kernel_spec *s, const char *prefix);
/* The sweep over a list of candidate configurations (n specs, each with its tunables set):
 * every candidate is rendered (the template's check decides which are kept; launch.smem is
 * checked against sw->max_smem), and a covering sample of the kept ones is compiled with
 * kh_sweep_compile: greedily, until every pair of values of two factors (and every single
 * value) that some kept candidate has is in a compiled one, ties broken in an order drawn
 * from seed, plus the kept candidate with the most dynamic shared memory. The factors: the
 * spec's family, dtype, heads, d_n, d_r, d_v, d_c and causal, and each tunable
 * (KH_SWEEP_SINGLES: every single value only; a list should not mix varlen and unpacked
 * candidates, varlen is no factor). When every kept candidate has the same mask (causal),
 * one picked candidate drawn from seed is also compiled with the other mask (for sm_90a). With
 * MLAGEN_TEST_EXHAUSTIVE=1 in the environment (ctest -L exhaustive) every kept candidate is
 * compiled (with both masks in that case). Returns the kept
 * candidates' count (compiled or not); rejected ones are counted in sw->rejected. */
int kh_sweep_cover(kh_sweep *sw, const mg_kernel_spec *cands, int n, uint64_t seed,
                   const char *prefix);
/* 1 when MLAGEN_TEST_EXHAUSTIVE=1: the sweeps compile every kept configuration. */
int kh_sweep_exhaustive(void);
/* Prints the lines of the defaults again, together. */
void kh_sweep_print_defaults(const kh_sweep *sw);
void kh_sweep_close(kh_sweep *sw);

/* Loads a model shape: a shipped model's name, or (model NULL) a config.json text. */
void kh_load_shape(const char *model, const char *json, mg_shape *shape);

/* A monotonic clock, seconds. */
double kh_now(void);

/* The test_asan body: unless this process already has ASan (then asan_case runs here),
 * runs this program (argv0 in messages) again as "--asan-case" (see kh_test_main) with the
 * ASan runtime preloaded, the same seed and a cache directory of its own; the child must
 * exit 0 without an ASan report. Its "rel err", "err/bound" and "built " lines and its noise
 * report are printed prefixed "[asan]". When the compiler has no ASan runtime, or the ASan
 * compiler is not clang (then static __shared__ arrays have no bounds), the test fails if
 * $CI is set and is skipped (cmocka's skip()) otherwise. */
void kh_run_asan_child(const char *argv0, uint64_t seed, void (*asan_case)(void **));

/* The start of a kernel test's main(): $MLAGEN_TEST_FILTER (a cmocka pattern) selects the
 * tests to run; as "--asan-case" (the child of kh_run_asan_child) it runs asan_case alone.
 * Returns -1 to go on with the tests, else main's exit code. */
int kh_test_main(int argc, char **argv, void (*asan_case)(void **));

/* 1 once an ASan case was skipped (no ASan runtime or no clang++, CI unset). */
extern int kh_skipped;

/* main's exit status from cmocka_run_group_tests' result: 77 (ctest's SKIP_RETURN_CODE,
 * reported as "Skipped", never "Passed") when everything else passed but a check was
 * skipped; else the result itself. */
int kh_exit_code(int cmocka_rc);

#endif
