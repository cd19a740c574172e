/* mg_cpu_exec.h: the CPU executor. Runs a plan (mg_plan.h) on host memory, one rank of a
 * sequence-parallel group, forward then backward, in f32 or f64.
 *
 * Steps run in plan order: collectives through an mg_comm (local or MPI backend; P = 1
 * needs none), GEMMs through CBLAS, kernels from mg_cpu_ops.h. Every buffer the plan
 * owns (TEMP and OUTPUT) and every step workspace comes from a tracking allocator that
 * follows the planner's memory convention exactly:
 *   - a buffer is allocated (zero-filled) just before the step that first writes it
 *     (buf.first); a TEMP buffer is freed right after the step of its last access
 *     (buf.last); OUTPUT buffers are never freed: they are handed to the caller;
 *   - a step's workspace is allocated for the step's duration, step.workspace bytes (the
 *     collective's send/receive staging when P > 1; nothing at P = 1);
 *   - at the forward/backward boundary the forward outputs leave the count (they are the
 *     caller's), so the backward starts from the saved TEMP buffers.
 * So the measured saved / peak_fwd / peak_bwd equal mg_plan_cost_of's figures, and the
 * bytes passed to the collectives as sent equal its sent_fwd / sent_bwd. Nothing else of
 * tensor size is allocated; the attention kernels use 48 KiB of stack (mg_cpu_ops.h).
 *
 * Dtypes: the plan's dtype (args.dtype) must be MG_F32 or MG_F64, and every buffer of the
 * plan must have it (the forms give the accumulators, lse and dw_kv_b,
 * mg_plan_acc_dtype, which is the plan's dtype on the CPU). */
#ifndef MG_CPU_EXEC_H
#define MG_CPU_EXEC_H
#include <stddef.h>
#include <stdint.h>

#include "mg_comm.h"
#include "mg_diag.h"
#include "mg_plan.h"
#include "mg_plan_mem.h"

/* A request to copy a plan buffer out before the executor frees it (a TEMP buffer such
 * as "lse") or at the end (an OUTPUT). dst is caller memory of exactly the buffer's
 * mg_plan_buf_bytes, in the plan's dtype and the buffer's layout (lse: [B, H/P, S], this
 * rank's heads, all tokens). The copy is made after the buffer's last access. */
typedef struct mg_cpu_capture {
  const char *name;
  void *dst;
  size_t bytes;
} mg_cpu_capture;

/* A test seam: lets a test route the attention kernel steps (MG_STEP_KERNEL of op
 * MG_OP_ATTN_FWD, MG_OP_ATTN_BWD, MG_OP_MQA_FWD or MG_OP_MQA_BWD) to other kernels (the generated tensor-core kernels on
 * the host executor) while the executor runs every other step and does all the buffer
 * management. Called, after validation, in place of the executor's own kernel with the
 * step, the plan, and the step's buffers as the executor holds them, in the plan's dtype
 * (f32 or f64) and the layouts of mg_kernel_op: in[k] the buffer step->in[k] (k <
 * step->n_in), out[k] the buffer step->out[k] (k < step->n_out, zero-filled when first
 * written by this step). Return 0 when the hook wrote the outputs (the executor skips its
 * own kernel), nonzero to have the executor run its own. On a varlen plan the hook gets no
 * documents: a hook that runs such a step takes them through ctx. The hook must not touch
 * other buffers; memory it uses is its own (it is not counted in the run's stats, which the
 * hook therefore leaves unchanged). Not for production use. */
typedef int (*mg_cpu_kernel_hook)(const mg_step *step, const mg_plan *p, const void *const *in,
                                  void *const *out, void *ctx);

/* In and out of one run. H, S/P = seq_local, d_* as in docs/forms.md; every array is in the plan's
 * dtype, row-major, this rank's sequence shard (global tokens [rank S/P, (rank+1) S/P)).
 * Inputs are the caller's and only read; they must hold the shapes of the plan's input
 * buffers: */
typedef struct mg_cpu_tensors {
  const void *q;       /* [B, S/P, H, d_n + d_r]  query, RoPE part last */
  const void *c_kv;    /* [B, S/P, d_c]           KV latent */
  const void *k_rope;  /* [B, S/P, d_r]           RoPE key part */
  const void *w_kv_b;  /* [H (d_n + d_v), d_c]    kv_b_proj.weight */
  const void *d_o;     /* [B, S/P, H, d_v]        the gradient of o ("do") */
  /* Outputs, set by mg_cpu_run on success (NULL before and on error). Allocated by the
   * executor with malloc-family functions; free them with mg_cpu_tensors_free(). */
  void *o;             /* [B, S/P, H, d_v] */
  void *dq;            /* [B, S/P, H, d_n + d_r] */
  void *dc_kv;         /* [B, S/P, d_c] */
  void *dk_rope;       /* [B, S/P, d_r] */
  void *dw_kv_b;       /* [H (d_n + d_v), d_c]: this rank's partial sum; the full gradient
                        * is the sum over the P ranks (only this rank's heads' rows are
                        * nonzero in the head-sharded forms) */
  /* Packed sequences (mg_varlen.h): the documents of this pass, host int32, n_cu = N + 1
   * entries, the same global array on every rank (cu[0] = 0, non-decreasing, cu[N] = T <=
   * the plan's seq, the token capacity). Required for a varlen plan (args.varlen), refused
   * for any other (NULL and 0). Rows t >= T are slack: they may hold anything (NaN
   * included) in every input; their o, dq, dc_kv, dk_rope rows come out 0, and no valid
   * output reads them (the attention keeps to each document, the weight gradients contract
   * only the valid token rows). */
  const int32_t *cu_seqlens;
  int64_t n_cu;
  const mg_cpu_capture *captures; /* optional, n_captures entries */
  int n_captures;
  mg_cpu_kernel_hook kernel_hook; /* optional test seam (above); NULL: the executor's kernels */
  void *hook_ctx;                 /* passed to kernel_hook */
} mg_cpu_tensors;

/* What one run measured, the planner's conventions (mg_plan_cost). */
typedef struct mg_cpu_stats {
  int64_t saved;              /* bytes live at the forward/backward boundary */
  int64_t peak_fwd, peak_bwd; /* high-water marks of the forward and the backward */
  int64_t sent_fwd, sent_bwd; /* bytes this rank sent through the collectives: (P - 1) of
                               * the P per-rank blocks of every call */
  int64_t n_allocs;           /* allocations made (buffers + workspaces) */
  double seconds_fwd, seconds_bwd; /* wall time of each pass */
} mg_cpu_stats;

/* Runs plan p on this rank. comm spans the plan's P ranks (comm->size == args.sp and
 * comm->rank == args.rank); it may be NULL when P = 1. stats may be NULL. The plan is
 * checked (mg_plan_check.h, the check mg_plan_build ran: every step's operands in bounds)
 * before any step runs, so a refusal is the same on every rank and never leaves a peer
 * waiting in a collective.
 * Returns 0, or:
 *   MLAGEN_EINVAL  p or t NULL; the plan's dtype is bf16/f16 ("the CPU executor runs f32
 *                  or f64") or a buffer's dtype differs from it; an input the plan reads
 *                  is NULL; an input or output name the executor does not know; comm
 *                  NULL with P > 1, or its size/rank differ from the plan's; a malformed
 *                  plan (mg_plan_check's message: a GEMM or kernel operand out of its
 *                  buffer's bounds, shapes that disagree); a capture with an unknown or input buffer name, a NULL dst
 *                  or a byte count different from the buffer's; a varlen plan without
 *                  t->cu_seqlens ("a varlen plan needs cu_seqlens"), cu_seqlens given to a
 *                  plan without varlen, or cu_seqlens that fail mg_varlen_check against
 *                  the plan's seq (the message names the index, e.g. "cu_seqlens[2] = 5 is
 *                  below cu_seqlens[1] = 7 (boundaries must not decrease)").
 *   MLAGEN_EUNSUPPORTED  a GEMM dimension or leading dimension beyond int (CBLAS), or an
 *                  attention row (d_qk, d_v) longer than MG_CPU_MAX_ROW.
 *   MLAGEN_ENOMEM  an allocation failed.
 *   any status of the communicator (MLAGEN_EIO for an MPI failure), the message
 *                  prefixed with the step.
 * On error everything the executor allocated is freed and the outputs in t are NULL. */
int mg_cpu_run(const mg_plan *p, mg_comm *comm, mg_cpu_tensors *t, mg_cpu_stats *stats,
               mg_diag *d);

/* Runs one pass of plan p (MG_FWD: steps [0, n_fwd); MG_BWD: the rest) in memory the
 * caller provides, as the CUDA executor does (the C API's CPU device, mlagen.h): the
 * inputs AND the outputs are the caller's arrays in t (t->o, dq, dc_kv, dk_rope, dw_kv_b
 * are read, not set: each output the pass writes must be non-NULL; it is zero-filled
 * before its first write); every TEMP buffer and step staging lives at mem's offsets
 * (mg_plan_mem_layout of p) in saved (MG_MEM_SAVED buffers: written by the forward, read by
 * the backward, kept unchanged by the caller in between) or in workspace (everything else;
 * its contents need not survive between passes), each zero-filled before its first write.
 * Allocates nothing of tensor size. captures and kernel_hook must be 0/NULL. comm as for
 * mg_cpu_run. workspace and saved may be NULL when mem's sizes are 0.
 * Errors: those of mg_cpu_run's validation (only the inputs and outputs the pass touches
 * are checked for NULL), MLAGEN_EINVAL for mem NULL, a NULL area of nonzero size, a
 * capture or hook given; the communicator's, prefixed with the step. */
int mg_cpu_run_pass(const mg_plan *p, mg_comm *comm, mg_pass pass, const mg_cpu_tensors *t,
                    const mg_plan_mem *mem, void *workspace, void *saved, mg_diag *d);

/* Frees the outputs of a run and sets them to NULL; NULL t is a no-op. */
void mg_cpu_tensors_free(mg_cpu_tensors *t);
#endif
