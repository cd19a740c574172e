/* mg_tune.h: the autotuner's sweep: candidate space, static pruning, timing.
 *
 * `mlagen tune` sweeps every combination of a kernel family's declared tunables for a
 * model's shape, drops what the template's check rejects, compiles the rest with NVRTC
 * and prunes by what ptxas reports (mg_tune_prune) before anything is timed. Timing
 * needs a GPU: it goes through the mg_tune_timer hook, which generator/cli/mg_ktime.c provides
 * and `mlagen tune` installs when the CUDA driver loads (NULL in the library; without a
 * driver `mlagen tune` without --dry-run fails with MLAGEN_ENODRIVER). Winners are
 * kept in the store (mg_tune_store.h: tuned/<arch>/<device>.json, read at plan time by
 * mg_tune_lookup). Schema, bucketing, the occupancy threshold: docs/tuning.md. */
#ifndef MG_TUNE_H
#define MG_TUNE_H
#include <stddef.h>

#include "mg_diag.h"
#include "mg_generate.h"
#include "mg_jit.h"
#include "mg_spec.h"
#include "mg_tune_store.h"

/* Per-architecture limits used by pruning. */
typedef struct mg_tune_limits {
  long smem_per_block;   /* bytes one CTA may use (static + dynamic, opt-in maximum) */
  int regs_per_sm;       /* 32-bit registers per SM */
  int max_warps_per_sm;  /* resident warps per SM */
  int max_ctas_per_sm;   /* resident CTAs per SM */
  int min_warps;         /* threshold: registers must allow at least this many resident
                            warps per SM (MG_TUNE_MIN_WARPS by default) */
} mg_tune_limits;

/* The default occupancy threshold (warps per SM that the registers must allow). */
#define MG_TUNE_MIN_WARPS 8

/* Limits of a real target ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100a",
 * "sm_120" ...; the a/f suffix is ignored). Errors: MLAGEN_EINVAL (not sm_<NN>[a|f], or an
 * architecture mlagen has no table for; the message lists the known ones). */
int mg_tune_arch_limits(const char *arch, mg_tune_limits *l, mg_diag *d);

/* Warps per SM that the register use alone allows for CTAs of `threads` threads (the
 * allocation unit is 256 registers per warp), capped by the warp and CTA limits. 0 when
 * one CTA does not fit. */
int mg_tune_reg_occupancy(int registers, int threads, const mg_tune_limits *l);

/* Static pruning of one compiled candidate: returns 1 and writes the reason into why
 * (size n) when the report shows spills (stores or loads > 0), wgmma.mma_async that ptxas
 * serialized (r->wgmma_serialized: "wgmma serialized by ptxas (C7514)"), static + dynamic shared
 * memory over l->smem_per_block, or registers that allow fewer than l->min_warps warps
 * per SM; 0 otherwise. *warps (may be NULL) gets mg_tune_reg_occupancy. */
int mg_tune_prune(const mg_jit_report *r, int threads, long dyn_smem, const mg_tune_limits *l,
                  int *warps, char *why, size_t n);

/* ---- the candidate space --------------------------------------------------------- */


typedef struct mg_tune_candidate {
  mg_kernel_spec spec;     /* family, shape, causal; config holds every tunable */
  mg_tune_config config;
  int verdict;             /* enum mg_tune_verdict */
  char reason[384];        /* why rejected / pruned / failed; "" when kept */
  char kernel[160];        /* the symbol (kept and pruned) */
  int threads;             /* CTA size from the launch rule */
  long dyn_smem;           /* dynamic shared memory from the launch rule */
  int warps;               /* register-limited warps per SM */
  mg_jit_report report;    /* ptxas figures (kept and pruned) */
} mg_tune_candidate;

/* Every combination of the tunables that base->family declares, in lexicographic order
 * of the sorted tunable names; a tunable base overrides (mg_spec_plan_tunables: those that
 * change the kernel's interface) keeps base's value only. *out is heap (free()).
 * Errors: MLAGEN_EINVAL (unknown family, a template that declares more than
 * MG_SPEC_MAX_CONFIG tunables or a product over 4096), MLAGEN_ETEMPLATE, MLAGEN_ENOMEM. */
int mg_tune_space(mg_gen *g, const mg_kernel_spec *base, mg_tune_candidate **out, int *n,
                  mg_diag *d);

/* Called after each candidate is evaluated (done of total). */
typedef void (*mg_tune_progress_fn)(void *user, int done, int total, const mg_tune_candidate *c);

/* Evaluates cands[0..n): render (check-rejected -> MG_TUNE_REJECTED), compile for
 * jo->arch (jo's cache settings apply), prune with l. A compile error marks the candidate
 * MG_TUNE_FAILED and goes on. Errors: only MLAGEN_ENOMEM, or MLAGEN_EIO/MLAGEN_EINVAL
 * from NVRTC that would fail every candidate alike (CUDA headers missing, bad arch). */
int mg_tune_evaluate(mg_gen *g, mg_tune_candidate *cands, int n, const mg_jit_opts *jo,
                     const mg_tune_limits *l, mg_tune_progress_fn progress, void *user,
                     mg_diag *d);

/* ---- timing: the GPU hook ---------------------------------------------------------- */

/* Checks kernel k (its cubin c) for spec s at sequence length seq (batch 1) against the
 * reference ref_k/ref_c (the family's default configuration with k's interface tunables;
 * both NULL: no check) and times it: returns 0 and sets *verdict to MG_TUNE_KEPT with
 * n_samples wall times in milliseconds in samples_ms, or to MG_TUNE_FAILED_LAUNCH /
 * MG_TUNE_WRONG_RESULT with the reason in reason (size reason_n); a negative status
 * when the sweep cannot go on (no driver, the device out of memory, a driver failure
 * outside the candidate). generator/cli/mg_ktime.c provides it (mg_ktime_timer); NULL in the
 * library, and `mlagen tune` installs it when the CUDA driver loads; without one, tune
 * (without --dry-run) fails with MLAGEN_ENODRIVER "timing needs a GPU". */
typedef int (*mg_tune_timer_fn)(const mg_kernel *k, const mg_cubin *c, const mg_kernel *ref_k,
                                const mg_cubin *ref_c, const mg_kernel_spec *s, long long seq,
                                int n_samples, double *samples_ms, int *verdict, char *reason,
                                size_t reason_n, mg_diag *d);
extern mg_tune_timer_fn mg_tune_timer;

/* The device the timer runs on, for the store header; provided with mg_tune_timer. */
typedef struct mg_tune_device {
  char name[128];
  int sm_count;
  int driver_version;
} mg_tune_device;
typedef int (*mg_tune_describe_fn)(mg_tune_device *dev, mg_diag *d);
extern mg_tune_describe_fn mg_tune_describe;

/* The q-th percentile (0..100) of samples[0..n) by linear interpolation of the sorted
 * values (samples is sorted in place). 0 for n == 0. */
double mg_tune_percentile(double *samples, int n, double q);


#endif
