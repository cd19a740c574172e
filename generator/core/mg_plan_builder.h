/* mg_plan_builder.h: the calls a form builder (generator/core/forms/) records its plan
 * with; implemented in mg_plan.c. Not for the plan's users, which see mg_plan.h. */
#ifndef MG_PLAN_BUILDER_H
#define MG_PLAN_BUILDER_H
#include <stdint.h>

#include "mg_plan.h"

/* Each call records into p; a failure (too many buffers or steps) sets p->error, which
 * mg_plan_build reports, so form files read as straight-line code. */
int mg_plan_input(mg_plan *p, const char *name, mg_dtype t, int ndim, const int64_t *dims);
int mg_plan_output(mg_plan *p, const char *name, mg_dtype t, int ndim, const int64_t *dims);
int mg_plan_temp(mg_plan *p, const char *name, mg_dtype t, int ndim, const int64_t *dims);
/* Starts the backward: the steps added from now on are backward steps. */
void mg_plan_backward(mg_plan *p);
void mg_plan_seq_to_head(mg_plan *p, int src, int dst);
void mg_plan_head_to_seq(mg_plan *p, int src, int dst);
void mg_plan_all_gather(mg_plan *p, int src, int dst);
void mg_plan_reduce_scatter(mg_plan *p, int src, int dst);
void mg_plan_gemm(mg_plan *p, const char *label, int a, int b, int c, mg_gemm g);
/* A kernel step; ins and outs end with -1. Returns the step to set column arguments. */
mg_step *mg_plan_kernel(mg_plan *p, mg_kernel_op op, const char *label, const int *ins,
                        const int *outs);
/* Sets attention step s's query positions (mg_step.q_pos0/q_split/q_pos1) and its FLOPs
 * from them: the (query, key) pairs its rows see, counted exactly (causal: pos(i) + 1 keys
 * for row i; else all S_k keys; when the plan's args.cu_seqlens is given, the keys of each
 * row's document, mg_varlen_pairs), times its q buffer's batch and heads. mg_plan_kernel
 * counts an attention step's pairs the same way for pos(i) = i. */
void mg_plan_attn_positions(mg_plan *p, mg_step *s, int64_t q_pos0, int64_t q_split,
                            int64_t q_pos1);

#endif
