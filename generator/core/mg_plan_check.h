/* mg_plan_check.h: the one check of a plan's steps against its buffers.
 *
 * mg_plan_build runs mg_plan_check on every plan it builds, so a malformed step is refused
 * where it is made, naming the step and the operand. The executors (runtime/exec/mg_cpu_exec.c,
 * runtime/exec/mg_cuda_exec.c) run the same check once when they take a plan (mg_cpu_run,
 * mg_cuda_exec_prepare): a plan is a plain struct a caller may have changed since it was
 * built. After it they only dispatch; what they still check is what the plan cannot know
 * (their dtypes and int limits, the caller's pointers, sizes and communicator). */
#ifndef MG_PLAN_CHECK_H
#define MG_PLAN_CHECK_H
#include "mg_diag.h"
#include "mg_plan.h"

/* The op boundary: a plan's INPUT buffers are named among mg_plan_input_names, its OUTPUT
 * buffers among mg_plan_output_names ("q", "c_kv", "k_rope", "w_kv_b", "do"; "o", "dq",
 * "dc_kv", "dk_rope", "dw_kv_b"). */
#define MG_PLAN_N_IO 5
extern const char *const mg_plan_input_names[MG_PLAN_N_IO];
extern const char *const mg_plan_output_names[MG_PLAN_N_IO];

/* Checks plan p as the executors rely on it:
 *   - counts within bounds, the forward's end n_fwd in [0, n_steps], every step's pass
 *     agreeing with it, every buffer id in range;
 *   - buffers: dims >= 1, at most MG_PLAN_MAX_DIMS, dtype the plan's or its accumulators'
 *     (mg_plan_acc_dtype), INPUT and OUTPUT names of the op boundary; first/last as the
 *     steps give them (mg_plan_build sets them): no input written, nothing read before
 *     it is written, every non-input written;
 *   - every step's operands: the arity of its kind or op; collectives' shapes over P
 *     ranks and their workspace; GEMMs' beta (0 or 1), dtypes (A, B the plan's; C the
 *     plan's or f32), A, B, C inside their buffers and tok_k (0 or 1; 1 only on a varlen
 *     plan, which has batch 1, with tok0 >= 0 and tok0 + k <= S; tok0 0 without it); each
 *     kernel op's shapes against the model's dims (mg_plan.h), dtypes (LSE the
 *     accumulators'), column arguments, and the attention backward's delta workspace;
 *     split_keys 0 or 1, 1 only on attention, expand_kv and split_dkv steps, whose
 *     operands then follow mg_plan.h's split-key shapes (K_nope d_n wide, the latent's
 *     RoPE columns inside its rows, dk_rope [B, S, d_r] in the accumulators' dtype).
 * Returns 0 or MLAGEN_EINVAL with "<form> plan step <i> (<label>): <what>" (or "<form>
 * plan: <what>" for a buffer) naming the operand. */
int mg_plan_check(const mg_plan *p, mg_diag *d);

/* Whether every GEMM of p has m, n, k and leading dimensions within int (cuBLAS's and
 * CBLAS's arguments): 0, or MLAGEN_EUNSUPPORTED naming the step, the operand and lib. */
int mg_plan_check_gemm_int(const mg_plan *p, const char *lib, mg_diag *d);
#endif
