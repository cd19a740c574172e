/* mg_ktime.h: one generated kernel timed on the GPU, for `mlagen tune` (issue 8).
 *
 * mg_ktime_run takes a kernel (mg_kernel: its manifest gives the family, the parameter
 * list and the launch rule), its cubin, the reference kernel it must agree with (the
 * family's default configuration with the candidate's interface tunables, see
 * mg_ktime_reference_spec) and a sequence length (batch 1), and:
 *   1. sizes every parameter from the kernel's typed manifest (mg_ktime_args: pointers
 *      from their declared shapes, ints from their declared bench values);
 *   2. allocates N_SETS (up to MG_KTIME_MAX_SETS, fewer when device memory is short)
 *      input/output buffer sets, fills the inputs once with host-generated random
 *      bf16/fp16/fp32 values (a fixed seed per set and parameter, so a candidate and its
 *      reference see the same inputs) and zeroes the outputs;
 *   3. checks: the candidate, then the reference, launched once on set 0 with zeroed
 *      outputs; every output of the candidate must satisfy max |a - b| / max |b| < 1e-2
 *      (MG_KTIME_TOL) and, element by element, |a - b| / (rms(b) + |b|) < 0.1
 *      (MG_KTIME_ELEM_TOL) against the reference's (|a - b| when b is all zero), with no
 *      NaN or inf where the reference is finite. A launch or execution failure of the
 *      candidate is the verdict MG_TUNE_FAILED_LAUNCH, a difference MG_TUNE_WRONG_RESULT,
 *      each with a reason; nothing is timed then;
 *   4. times: MG_KTIME_WARMUP launches, then n_samples launches, each between two CUDA
 *      events recorded on a stream of its own, sample i on set i mod N_SETS, an L2 flush
 *      (cuMemsetD8Async over a buffer of twice CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE bytes)
 *      between samples and outside the events.
 * Device 0's primary context is retained at the first call and kept for the process.
 * Every device allocation, event, stream and module of a call is released before it
 * returns, on every path. Not thread-safe (one tuning sweep per process).
 *
 * A fault inside a kernel (an execution error reported at synchronization, e.g.
 * CUDA_ERROR_ILLEGAL_ADDRESS) leaves the CUDA context unusable: the candidate gets
 * MG_TUNE_FAILED_LAUNCH and every later call fails with MG_EDRIVER ("the CUDA context is
 * unusable after ..."): rerun the sweep without that candidate's family.
 *
 * Statuses: 0 (the verdict says what happened to the candidate), or negative when the
 * sweep cannot go on: MLAGEN_ENODRIVER (no driver), MLAGEN_EINVAL (a bad argument, a
 * manifest without a parameter list or launch rule, a parameter this module cannot
 * size, the reference's parameters differing from the candidate's), MLAGEN_ENOMEM (host
 * memory, or the device cannot hold even one buffer set), MG_EDRIVER (a driver call
 * outside the candidate's own load, launch and execution failed, or the reference failed
 * to load, launch or run: the message names the call and the CUDA error). */
#ifndef MG_KTIME_H
#define MG_KTIME_H
#include <stddef.h>

#include "mg_diag.h"
#include "mg_generate.h"
#include "mg_jit.h"
#include "mg_module.h"
#include "mg_spec.h"
#include "mg_tune.h"

#define MG_KTIME_MAX_PARAMS MG_KERNEL_MAX_PARAMS
#define MG_KTIME_MAX_SETS 4 /* rotating buffer sets */
#define MG_KTIME_WARMUP 3   /* launches before the timed ones */
/* The check against the reference (docs/tuning.md): max |a - b| / max |b| under
 * MG_KTIME_TOL, and every element's |a - b| / (rms(b) + |b|) under MG_KTIME_ELEM_TOL. Two
 * correct configurations differ by the rounding of P to 16 bits at another running max (a
 * forward's block_n): per element up to 0.025 of rms + |b| (simulated: attn_fwd's inputs,
 * causal, S 4096-16384, block_n 32 or 128 against 64), largest in the short rows. */
#define MG_KTIME_TOL 1e-2
#define MG_KTIME_ELEM_TOL 1e-1
/* The Ulysses degree the benchmark assumes (the symbol P of the bench values and shapes):
 * 8 when it divides seq, else 1. */
#define MG_KTIME_SP(seq) ((seq) % 8 == 0 ? 8LL : 1LL)

typedef enum mg_karg_kind {
  MG_KARG_IN = 0, /* a const pointer: an input, filled with random values */
  MG_KARG_OUT,    /* a non-const pointer: an output (zeroed before the check), compared */
  MG_KARG_NULL,   /* a pointer the configuration does not use (shape "unused"): NULL */
  MG_KARG_INT,    /* an int argument */
  MG_KARG_FLOAT,  /* a float argument */
  MG_KARG_TMAPS   /* CUtensorMaps by value (an sm_90a family's `tmaps`): encoded for each
                     launch over that launch's buffers (mg_sm90_launch_tmaps) */
} mg_karg_kind;

/* One kernel parameter as the timer passes it. */
typedef struct mg_karg {
  char name[32];
  mg_karg_kind kind;
  int elem_bytes;   /* pointers: 2 (the spec's bf16/fp16) or 4 (fp32) */
  int is_f32;       /* pointers: 1 for float* */
  size_t count;     /* pointers: elements (>= 1) */
  int ival;         /* MG_KARG_INT */
  float fval;       /* MG_KARG_FLOAT */
} mg_karg;

typedef struct mg_kargs {
  int n;
  mg_karg a[MG_KTIME_MAX_PARAMS];
  mg_launch_dims dims; /* batch 1, seqlen_q and seqlen_k for the launch rule */
} mg_kargs;

/* The arguments of kernel k (mg_kernel.info) for spec s at sequence length seq (>= 1),
 * batch 1, into *out, each parameter in order, from its kernel{} declaration (docs/
 * tuning.md, "What is timed"): an int argument is its declared bench value (params[i].bench,
 * an expression over B = 1, S = S_q = S_k = seq, P = MG_KTIME_SP(seq), H, d_n, d_r, d_v, d_c
 * from s and the int arguments before it), or, when it declares none, the convention for
 * the sizes the attention kernels share (seqlen_q, seqlen_k, rows = S; batch = B; q_pos0,
 * q_split, q_pos1, accumulate = 0: query row i at position i); softmax_scale = 1 / sqrt(d_n +
 * d_r); tensor maps by value (MG_PARAM_TMAPS) are MG_KARG_TMAPS, made at each launch; a
 * pointer's element count is its
 * declared shape ("[B, S_q, H, d_n + d_r]"; "direction 0: [...]; direction 1: [...]" picks by
 * the direction argument; "unused" is NULL) over the same names and every int argument.
 * The grid's seqlen_q is the seqlen_q argument, else the seqlen_local argument, else seq.
 * Errors: MLAGEN_EINVAL (an argument NULL, seq < 1, an int parameter with no value or one
 * that does not evaluate to an int >= 0, a float other than softmax_scale, a shape that
 * does not parse or an element count that is not >= 1 and under 2^40; the message names
 * the kernel and the parameter). */
int mg_ktime_args(const mg_kernel_info *k, const mg_kernel_spec *s, long long seq, mg_kargs *out,
                  mg_diag *d);

/* The spec of the reference for candidate spec cand (rendered as k) into *ref: cand's
 * family and shape, only the tunables k's kernel{} declares as interface overridden (the
 * template's default for the rest). */
void mg_ktime_reference_spec(const mg_kernel_spec *cand, const mg_kernel_info *k,
                             mg_kernel_spec *ref);

/* What happened to one candidate. */
typedef struct mg_ktime_result {
  int verdict;      /* MG_TUNE_KEPT (timed), MG_TUNE_FAILED_LAUNCH, MG_TUNE_WRONG_RESULT */
  char reason[256]; /* "" when timed */
  double max_rel_err; /* the check's worst |a - b| / (rms(b) + |b|) over the outputs' elements
                         (INFINITY where a NaN/inf differs) */
  int n_sets;       /* buffer sets the samples rotated over */
  size_t set_bytes; /* bytes of one set */
  size_t flush_bytes; /* bytes memset between samples (2 x L2) */
} mg_ktime_result;

/* Checks and times kernel k (cubin c) for spec s at seq (batch 1) as described above:
 * n_samples (1 .. 4096) event-timed wall times in milliseconds into samples_ms when
 * res->verdict is MG_TUNE_KEPT. ref_k/ref_c: the reference (NULL both: no check; may be
 * k/c themselves). Returns 0 with *res filled, or a negative status (above). */
int mg_ktime_run(const mg_kernel *k, const mg_cubin *c, const mg_kernel *ref_k,
                 const mg_cubin *ref_c, const mg_kernel_spec *s, long long seq, int n_samples,
                 double *samples_ms, mg_ktime_result *res, mg_diag *d);

/* mg_tune_timer_fn: mg_ktime_run writing the verdict and reason (size reason_n). */
int mg_ktime_timer(const mg_kernel *k, const mg_cubin *c, const mg_kernel *ref_k,
                   const mg_cubin *ref_c, const mg_kernel_spec *s, long long seq, int n_samples,
                   double *samples_ms, int *verdict, char *reason, size_t reason_n, mg_diag *d);

/* mg_tune_describe_fn: device 0's name (cuDeviceGetName), SM count
 * (CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) and the driver version (cuDriverGetVersion,
 * 1000 major + 10 minor). Errors: MLAGEN_EINVAL (dev NULL), MLAGEN_ENODRIVER, MG_EDRIVER. */
int mg_ktime_describe(mg_tune_device *dev, mg_diag *d);

/* Test seam: when set, called on every output of the candidate, then (when there is one
 * to compare with) of the reference, after it is copied to the host and before the
 * comparison (kernel: the candidate's or the reference's name; param: the output's name;
 * host: bytes bytes the hook may overwrite). NULL in production. */
extern void (*mg_ktime_output_hook)(const char *kernel, const char *param, void *host,
                                    size_t bytes);
#endif
