/* mg_cuda_exec.h: the CUDA executor. Runs a plan (mg_plan.h) of any form (explicit,
 * absorbed, laga, laga-r, laga-f), forward or backward, for one rank of a
 * sequence-parallel group, with the generated kernels, GEMMs and collectives, in memory
 * the caller provides. It allocates no tensor-sized memory.
 *
 * Device operations are a vtable (mg_dev_ops, runtime/exec/mg_dev_ops.h), so the same orchestration runs on the GPU
 * (mg_dev_ops_cuda: the driver, the module registry, cuBLAS) and, in the tests, on the CPU
 * (tests/test_cuda_exec.c: host memory, CBLAS, the host executor of tests/host/).
 *
 * Memory (generator/core/mg_plan_mem.h, laid out once per plan with MG_CUDA_EXEC_ALIGN):
 *   - INPUT and OUTPUT buffers are the caller's tensors (mg_cuda_tensors);
 *   - TEMP buffers written in the forward and read in the backward live in the caller's
 *     saved area, which the caller keeps unchanged from the forward to the backward;
 *   - other TEMP buffers and every step's scratch (step->workspace bytes) live in the
 *     caller's workspace, at the layout's offsets. The workspace's contents do not
 *     matter between passes: nothing is read there before it is written in the pass;
 *   - a plan with a GEMM step has MG_CUDA_EXEC_BLAS_WS more bytes of workspace, after the
 *     layout's, for the GEMMs' own scratch (ops->gemm_workspace: cuBLAS's workspace,
 *     cublasSetWorkspace), so cuBLAS allocates nothing either;
 *   - a varlen plan (packed sequences, p->args.varlen; generator/core/mg_varlen.h) has
 *     (seq + 1) int32 more, rounded up to MG_CUDA_EXEC_ALIGN, after those: the device copy
 *     of the pass's cu_seqlens (mg_varlen_compact: the boundaries of the documents with
 *     tokens, padded with T to seq + 1 entries), staged in the executor and uploaded
 *     (ops->upload) at the start of every pass.
 *
 * Steps, in plan order, all asynchronous on the caller's stream:
 *   SEQ_TO_HEAD / HEAD_TO_SEQ  P > 1: a2a_pack (direction 0 / 1) into the send half of the
 *       step's scratch, all_to_all into the receive half, a2a_unpack into the destination;
 *       P = 1: a copy.
 *   ALL_GATHER      P > 1: all_gather of the [B, S_l, w] shard into the scratch
 *       [P][B, S_l, w], then one strided copy (copy2d) per rank into [B, S, w]; P = 1: a copy.
 *   REDUCE_SCATTER  P > 1: copy2d of [B, S, w] into the scratch [P][B, S_l, w] (block p =
 *       rank p's tokens), reduce_scatter into the destination; P = 1: a copy.
 *   GEMM            ops->gemm (mg_gemm semantics; A and B in their buffers' dtype, the
 *       plan's; C in its buffer's: f32 for dw_kv_b). In a varlen plan a GEMM whose k runs
 *       over tokens (tok_k) contracts only over the valid rows, k = mg_varlen_valid_rows(T,
 *       tok0, k) with T = cu_seqlens[N] of the call, so NaN in slack rows never reaches C;
 *       k = 0 leaves C (beta 1) or zeroes its m x n block(s) (beta 0).
 *   KERNEL          the generated kernels, launched by their manifest's grid rule and with
 *       their parameters matched by name (the manifest's "params") once, at preparation:
 *       Key layout: k_packed = 1 for a packed step (the explicit plan's per-head K), 0 for
 *       a split-key step (mg_step.split_keys, the LAGA plans: k_rope = the latent's column
 *       rope_col, element offset, with ld_k_rope = rope_w; the backward's f32 dk_rope
 *       buffer; expand_kv and split_dkv generated with k_packed = 0 likewise).
 *       MG_OP_ATTN_FWD  attn_fwd; on sm_90a attn_fwd_sm90 (its k_rope map with that row
 *                       stride), its
 *                       4 tensor maps encoded at each launch from the pass's addresses
 *                       (mg_sm90_launch_tmaps) and passed by value; attn_fwd when
 *                       opts.mma_sync or MLAGEN_MMA_SYNC=1 (or true, yes, on, any case;
 *                       0, false, no, off or empty leave it; any other value is
 *                       MLAGEN_EINVAL), when the ops have no driver with cuTensorMapEncodeTiled (mg_dev_ops.drv), or when attn_fwd_sm90
 *                       refuses the shape (kernel_info's why says which and why)
 *       MG_OP_ATTN_BWD  attn_bwd_pre, attn_bwd_dkdv (deterministic = 1), attn_bwd_dq; on an
 *                       sm_90a device attn_bwd_pre, attn_bwd_dkdv_sm90 (deterministic = 1),
 *                       attn_bwd_dq_sm90, their 5 tensor maps each encoded at each launch
 *                       (mg_sm90_launch_tmaps), with the forward's fallbacks (mma_sync,
 *                       MLAGEN_MMA_SYNC, no encoder, a shape they refuse)
 *       MG_OP_MQA_FWD   mqa_fwd
 *       MG_OP_MQA_BWD   attn_bwd_pre (d_n = d_v = d_c), mqa_bwd_dkv (qsplit = 1), mqa_bwd_dq
 *       MG_OP_EXPAND_KV expand_kv; MG_OP_SPLIT_DKV split_dkv (accumulate from the step);
 *       MG_OP_CONCAT_LATENT concat_latent; MG_OP_SPLIT_LATENT split_latent;
 *       MG_OP_COPY_COLS copy_cols for buffers of the plan's dtype, a copy2d for others
 *                       (laga-f's f32 LSE columns).
 *     The attention backward steps' delta (rowsum(dO * O), f32 [B, H, S]) lives in the
 *     step's scratch: mg_plan.c's mg_plan_kernel gives MG_OP_ATTN_BWD and MG_OP_MQA_BWD
 *     steps step->workspace = 4 B H S bytes for it (counted by the planner's peaks).
 *     A varlen plan's attention and MQA steps run their families' varlen variants
 *     (spec.varlen; the symbol ends in "_varlen"), given the device cu_seqlens and n_seqs =
 *     seq after their other arguments; an architecture's family without one runs the
 *     portable family's (its why says so), and a portable family without one fails
 *     prepare (MLAGEN_EINVAL, the generator's message).
 *     Only the attention kernels (attn_fwd, attn_bwd_dkdv, attn_bwd_dq, mqa_*) are
 *     generated for the plan's causal flag; the others do not depend on it and are
 *     generated non-causal. Heads of a kernel are the heads of the step's tensors (laga-f's
 *     groups use fewer);
 *     seqlen_q = S_q of the q buffer, seqlen_k = S_k of the k buffer (k_nope, or c) and
 *     the step's query positions q_pos0, q_split, q_pos1 (mg_step); the absorbed kernels
 *     take one chunk (q_pos0 = the step's q_pos0 if q_split > 0, else q_pos1): two chunks
 *     there are MLAGEN_EUNSUPPORTED, and positions that do not increase (q_pos1 <
 *     q_pos0 + q_split) MLAGEN_EINVAL, both at preparation. The softmax scale is the plan's.
 *   At P > 1 the OUTPUT dw_kv_b is zeroed before its first write (only this rank's heads'
 *   rows are written: it is this rank's partial sum).
 *
 * Preparation (mg_cuda_exec_prepare, once per plan): every kernel a step needs is
 * specified (the family the ops' arch runs: mg_op_family_arch, generator/gen/mg_spec.h, the
 * one table of families per op and arch; the step's shapes, mg_spec_step_tunables' interface (the step's key layout), and the tuned store's
 * configuration for the ops' device and the plan's sequence bucket when there is one:
 * mg_tune_lookup), generated (mg_gen_kernel), loaded (ops->load: on the GPU compiled by NVRTC through the
 * JIT cache and loaded into the module registry) and kept, one per distinct kernel name.
 * The steps are then lowered into a flat program of launches (arguments bound, pointers
 * as buffer and offset, grids computed), GEMMs, copies, memsets and collectives, which
 * each run replays for its pass with the call's addresses.
 *
 * Errors: every call below returns 0 or a negative MLAGEN_E* status with a message in d
 * naming the step ("<form> plan step <i> (<label>): ...") and the call that failed. */
#ifndef MG_CUDA_EXEC_H
#define MG_CUDA_EXEC_H
#include <stddef.h>
#include <stdint.h>

#include "mg_comm.h"
#include "mg_dev_ops.h"
#include "mg_diag.h"
#include "mg_generate.h"
#include "mg_plan.h"
#include "mg_plan_mem.h"

/* The alignment of every buffer in the saved area and the workspace (bytes). */
#define MG_CUDA_EXEC_ALIGN 256

/* The GEMMs' scratch in the workspace (cuBLAS's workspace): 32 MiB, NVIDIA's recommended
 * cublasSetWorkspace size for Hopper (4 MiB for other architectures). The sizes are fixed
 * when the plan is made (mlagen_plan_sizes), before any device is known, so the largest
 * recommendation holds for every device. */
#define MG_CUDA_EXEC_BLAS_WS ((int64_t)32 << 20)

/* The tensors of one pass, this rank's sequence shard, in the plan's layouts (mg_plan.h
 * forms; include/mlagen.h mlagen_sizes): inputs q [B, S/P, H, d_n + d_r], c_kv [B, S/P,
 * d_c], k_rope [B, S/P, d_r], w_kv_b [H (d_n + d_v), d_c], d_o [B, S/P, H, d_v] (the
 * backward's); outputs o (forward), dq, dc_kv, dk_rope, dw_kv_b (backward; dw_kv_b in
 * f32). A pass reads and writes only the ones its steps use (others may be NULL).
 * cu_seqlens: a varlen plan's documents (generator/core/mg_varlen.h), host memory, n_cu =
 * N + 1 int32 entries (cu[0] = 0, non-decreasing, cu[N] = T <= the plan's seq), the same
 * global array on every rank; read during the call only. Required for a varlen plan, NULL
 * (and n_cu 0) for any other. */
typedef struct mg_cuda_tensors {
  const void *q, *c_kv, *k_rope, *w_kv_b, *d_o;
  void *o, *dq, *dc_kv, *dk_rope, *dw_kv_b;
  const int32_t *cu_seqlens;
  int64_t n_cu;
} mg_cuda_tensors;

typedef struct mg_cuda_exec mg_cuda_exec;

typedef struct mg_cuda_exec_opts {
  mg_gen *gen;        /* the generator kernels come from; NULL: the ops' (mg_dev_ops.gen),
                         else the embedded templates (opened and closed inside prepare) */
  double timeout_s;   /* P > 1: how long run waits for the pass to finish while polling
                         the communicator (0: 600 s; < 0: do not wait, return after
                         queueing, as at P = 1) */
  const char *tune_dir; /* the tuned store's directory; NULL: mg_tune_store_dir()
                           ($MLAGEN_TUNED_DIR, else ./tuned) */
  int mma_sync;       /* 1: the portable mma.sync families on every arch (to time them against
                         the sm_90a ones); also MLAGEN_MMA_SYNC=1 (true, yes, on) in the
                         environment */
} mg_cuda_exec_opts;

/* The executor's memory for plan p: mg_plan_mem_layout(p, MG_CUDA_EXEC_ALIGN, m, d), then,
 * when p has a GEMM step, the GEMMs' scratch (MG_CUDA_EXEC_BLAS_WS bytes) appended to the
 * workspace: *blas_offset = the layout's workspace_bytes and m->workspace_bytes grows by
 * MG_CUDA_EXEC_BLAS_WS; else *blas_offset = -1. A pass hands the GEMMs the
 * MG_CUDA_EXEC_ALIGN-aligned part of [workspace + *blas_offset, + MG_CUDA_EXEC_BLAS_WS)
 * (all of it when the workspace is so aligned). A varlen plan's workspace then has its
 * device cu_seqlens ((seq + 1) int32, rounded up to MG_CUDA_EXEC_ALIGN) at the end.
 * mlagen_plan_sizes reports these sizes.
 * Errors: mg_plan_mem_layout's; MLAGEN_EINVAL blas_offset NULL. */
int mg_cuda_exec_mem_layout(const mg_plan *p, mg_plan_mem *m, int64_t *blas_offset, mg_diag *d);

/* Prepares plan p (bf16 or f16; kept by pointer: it must outlive the executor, unchanged)
 * for device ops o (kept, not owned): checks the plan (mg_plan_check.h, the check
 * mg_plan_build ran), lays out memory (mg_cuda_exec_mem_layout), generates and loads every
 * kernel and lowers the steps. opts may be NULL.
 * Errors: MLAGEN_EINVAL (an argument NULL; the plan's dtype is not bf16/f16 ("the CUDA
 * executor runs bf16 or f16 plans"); mg_plan_check's: a malformed step, naming it;
 * MLAGEN_MMA_SYNC set to a value that is neither on nor off; a varlen plan and ops
 * without upload; a portable family without a varlen variant, the generator's message);
 * MLAGEN_EUNSUPPORTED (a GEMM or kernel argument beyond int); MLAGEN_ELIMIT (a grid over
 * the launch limits);
 * the generator's errors (MLAGEN_EINVAL for a kernel configuration a template rejects,
 * MLAGEN_ETEMPLATE) and the ops' (ops->load: MLAGEN_ECOMPILE, MLAGEN_EDRIVER, ...),
 * prefixed with the step; MLAGEN_ENOMEM. *out is NULL on error. */
int mg_cuda_exec_prepare(const mg_plan *p, mg_dev_ops *o, const mg_cuda_exec_opts *opts,
                         mg_cuda_exec **out, mg_diag *d);

/* The kernels prepare chose: returns how many; for 0 <= i < that, *name is kernel i's
 * symbol and *why which configuration it has and why ("tuned: <file> entry ..." or
 * "default: ...", mg_tune_lookup's words). Strings live as long as x. x NULL gives 0. */
int mg_cuda_exec_kernel_info(const mg_cuda_exec *x, int i, const char **name, const char **why);

/* The sizes of the caller's areas (bytes): saved (kept from forward to backward) and
 * workspace (each pass, the GEMMs' scratch included), from mg_cuda_exec_mem_layout. x
 * NULL gives 0. */
int64_t mg_cuda_exec_saved_bytes(const mg_cuda_exec *x);
int64_t mg_cuda_exec_workspace_bytes(const mg_cuda_exec *x);

/* Where plan buffer `name` lives during a pass: its address inside saved or workspace,
 * or NULL when the plan has no such buffer or it is a caller tensor (tests read the saved
 * LSE this way). */
void *mg_cuda_exec_buffer(const mg_cuda_exec *x, const char *name, void *workspace, void *saved);

/* Runs the steps of pass (MG_FWD: steps [0, n_fwd); MG_BWD: the rest) with tensors t,
 * workspace (>= mg_cuda_exec_workspace_bytes, 16-byte aligned) and saved (>=
 * mg_cuda_exec_saved_bytes; the backward reads what the forward wrote there) on stream,
 * collectives through comm (spanning the plan's P ranks: comm->size == sp, comm->rank ==
 * rank; NULL allowed at P = 1). Asynchronous at P = 1 (queued on stream); at P > 1 it
 * then waits for the stream, polling comm->ops->poll when the backend has it, for at most
 * the timeout (opts.timeout_s, or mg_cuda_exec_set_timeout's since; negative: no wait,
 * asynchronous as at P = 1).
 * Errors: MLAGEN_EINVAL (x or t NULL; a tensor the pass uses NULL (named); workspace or
 * saved NULL or too small; comm NULL at P > 1 or not matching the plan; a varlen plan
 * without t->cu_seqlens, or one mg_varlen_check refuses against the plan's seq (naming
 * the index); cu_seqlens given for an unpacked plan: all before anything is queued); the ops' and
 * the communicator's statuses, the
 * message naming the step and the call; MLAGEN_EIO "timed out after N s waiting for
 * the pass" (a peer that never joined a collective). */
int mg_cuda_exec_run(mg_cuda_exec *x, mg_pass pass, const mg_cuda_tensors *t, void *workspace,
                     size_t workspace_bytes, void *saved, size_t saved_bytes, mg_comm *comm,
                     void *stream, mg_diag *d);

/* Number of kernels loaded (distinct names); 0 for NULL. */
int mg_cuda_exec_kernel_count(const mg_cuda_exec *x);

/* Frees the executor (not the plan, the ops or their loaded kernels); NULL is a no-op. */
void mg_cuda_exec_destroy(mg_cuda_exec *x);

/* Replaces opts.timeout_s (its rule: > 0 seconds; < 0 no wait; 0 the default, 600 s) for
 * the runs that follow. x NULL: nothing. */
void mg_cuda_exec_set_timeout(mg_cuda_exec *x, double timeout_s);
#endif
