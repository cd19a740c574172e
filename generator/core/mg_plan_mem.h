/* mg_plan_mem.h: a static memory layout of a plan, for an executor without an allocator.
 *
 * The CUDA executor gets two caller-provided device areas (mlagen_forward/_backward's
 * workspace and saved arguments) and allocates nothing. This layout says where every
 * plan buffer and every step's collective staging lives in them:
 *   - MG_BUF_INPUT and MG_BUF_OUTPUT buffers are the caller's tensors (MG_MEM_CALLER);
 *   - a TEMP buffer written in the forward and read in the backward (first < n_fwd <= last)
 *     is saved: MG_MEM_SAVED, the saved buffers laid out one after the other (each size
 *     rounded up to align) in the saved area, which the caller keeps from the forward to
 *     the backward;
 *   - every other TEMP buffer lives in the workspace from its first step to its last step
 *     (inclusive), and a step's staging (step->workspace > 0 bytes) lives in the workspace
 *     for that step only. The forward and the backward share the workspace (the backward
 *     starts with only the saved buffers live, and those are in the saved area).
 * This is the planner's liveness (mg_plan_cost_of), less the caller's tensors and the
 * saved buffers, so at every step the live workspace objects sum to at most the planner's
 * figure for that step minus the live outputs and saved buffers (sizes rounded up to
 * align). Workspace offsets are assigned offline by the best of a few heuristics:
 * simulating the steps in order with a first-fit and a best-fit free list (allocating at
 * each step the buffers first written there and its staging, then freeing the staging and
 * the buffers last accessed there), and placing the objects in a few orders (largest
 * first, the peak step's objects first, ...) each at the lowest offset free over its
 * lifetime. The search stops at the first layout whose high-water mark equals the most
 * bytes live at one step (no layout does better); workspace_bytes is the lowest
 * high-water mark found. */
#ifndef MG_PLAN_MEM_H
#define MG_PLAN_MEM_H
#include <stdint.h>

#include "mg_diag.h"
#include "mg_plan.h"

/* Where a plan buffer lives. */
typedef enum mg_mem_where {
  MG_MEM_CALLER,   /* an input or output: the caller's tensor (offset[] is 0) */
  MG_MEM_SAVED,    /* in the saved area, offset[] bytes from its start */
  MG_MEM_WORKSPACE /* in the workspace, offset[] bytes from its start */
} mg_mem_where;

/* The layout of one plan. Every offset and size is in bytes and a multiple of align; an
 * object of b bytes occupies [offset, offset + b rounded up to align) of its area. */
typedef struct mg_plan_mem {
  int64_t align;                          /* every offset and size is a multiple of it */
  mg_mem_where where[MG_PLAN_MAX_BUFS];   /* CALLER: inputs and outputs, the caller's tensors */
  int64_t offset[MG_PLAN_MAX_BUFS];       /* bytes into the saved area or the workspace */
  int64_t step_ws[MG_PLAN_MAX_STEPS];     /* offset in the workspace of the step's staging
                                             (step->workspace bytes), -1 when it has none */
  int64_t saved_bytes, workspace_bytes;   /* sizes of the two areas */
} mg_plan_mem;

/* Lays out plan p (built by mg_plan_build, so its buffers' first/last steps are set) for
 * offsets aligned to align bytes, into *m (entries past p->n_bufs and p->n_steps are 0
 * and -1). Within the workspace, no two objects live at the same step overlap (a buffer
 * from its first to its last step, a staging at its step); the saved buffers do not
 * overlap; everything lies inside its area. Deterministic: the same plan and align give
 * the same layout.
 * Allocates about 60 KiB of host scratch for the call; thread-safe.
 * Errors (*m zeroed when m is not NULL, message in d, which may be NULL):
 *   MLAGEN_EINVAL  p or m NULL; align not a power of two, below 16 or above 2^30; a
 *                  malformed plan (buffer or step counts out of range, n_fwd outside
 *                  [0, n_steps], a step argument count or buffer id out of range, an
 *                  unknown buffer role or dtype, a non-input buffer without a first write
 *                  or with first/last steps out of order or out of range, a step reading
 *                  or writing a non-input buffer outside its [first, last], a negative
 *                  step workspace, a negative dim or a buffer size overflowing int64);
 *                  areas whose sizes would exceed INT64_MAX bytes.
 *   MLAGEN_ENOMEM  the host scratch could not be allocated. */
int mg_plan_mem_layout(const mg_plan *p, int64_t align, mg_plan_mem *m, mg_diag *d);
#endif
