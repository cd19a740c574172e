/* mg_spec.h: kernel specs, the compile-time facts a kernel is specialized on.
 *
 * A spec names a kernel family (a template under templates/) and the shape it is
 * generated for. Sequence length and batch are never part of a spec: they are run-time
 * arguments, so one compiled kernel serves every batch. */
#ifndef MG_SPEC_H
#define MG_SPEC_H
#include "mg_config.h"
#include "mg_diag.h"

#define MG_SPEC_MAX_CONFIG 8

typedef struct mg_tunable_value {
  char name[32];   /* tunable name declared by the template, e.g. "block_m" */
  long value;
} mg_tunable_value;

typedef struct mg_kernel_spec {
  char family[32];    /* template family: templates/<family>.cu.tpl */
  int heads;          /* heads in the tensors the kernel sees (H / P under Ulysses SP) */
  int d_n, d_r, d_v;  /* qk_nope_head_dim, qk_rope_head_dim, v_head_dim */
  int d_c;            /* kv_lora_rank */
  char dtype[8];      /* "bf16" or "fp16": element type of the tensors */
  int causal;         /* 1: causal masking by global position */
  int varlen;         /* 1: packed sequences (kernel arguments cu_seqlens, n_seqs; the
                         rules in generator/core/mg_varlen.h): only for a family whose
                         kernel{} declares varlen, named "<name>_varlen". A tuned
                         configuration of the unpacked kernel applies to it. */
  char arch[16];      /* the GPU the kernel is rendered for ("sm_86", "sm_90a"; "": any from
                         sm_80 up): its shared-memory limit bounds the configurations the
                         templates accept (prelude.lua smem_limit) */
  int n_config;       /* tunable overrides; the template's default for the rest */
  mg_tunable_value config[MG_SPEC_MAX_CONFIG];
} mg_kernel_spec;

/* The most kernel specs one model needs (every family, causal and not; with `--varlen`, the
 * attention families' packed variants too, and `--family`'s sm_90a ones beside them:
 * about 90 at DeepSeek-V3, SP 8 with --varlen, under 200 with all six families too): the capacity
 * callers give mg_spec_for_model. */
#define MG_SPEC_MAX_KERNELS 256

/* The kernel families (templates/<family>.cu.tpl), NULL-terminated: those `mlagen generate`
 * renders for a model, and those it renders only on request (mg_spec_family_on_request). */
extern const char *const mg_spec_families[];

/* 1 when family is not one of the portable families mg_spec_for_model lists for every model:
 * an architecture's own family (mg_arch_kernel_table: attn_fwd_sm90, mqa_fwd_sm90,
 * attn_bwd_dkdv_sm90, attn_bwd_dq_sm90, mqa_bwd_dkv_sm90, mqa_bwd_dq_sm90), rendered
 * for its architecture (mg_spec_to_arch, rows not marked on_request) or on request (`mlagen
 * generate --family F`); else 0. */
int mg_spec_family_on_request(const char *family);

/* Fills specs[0..*n) with every kernel a model needs at sequence-parallel degree sp, each
 * causal and non-causal: every family (but those on request) at heads = H / sp with the
 * explicit plan's packed keys; attn_bwd_pre with d_n = d_v = d_c (the absorbed backward's
 * delta over o_lat); the split-key variants (k_packed = 0, mg_spec_step_tunables: the LAGA
 * family's steps) of attn_fwd, attn_bwd_pre, attn_bwd_dkdv, attn_bwd_dq, expand_kv and
 * split_dkv at H / sp and, for LAGA-F's default head group (mg_plan_default_head_groups of
 * H / sp) and laga-cp's (of H, at any sp: laga-cp attends with all H heads), when it holds
 * fewer heads than H / sp, at the group's head count; expand_kv and split_dkv packed at H
 * (the explicit form expands K/V for all heads before the all-to-all) (an extra equal to a
 * spec already listed is left out). Each spec carries mg_spec_step_tunables. max is the
 * capacity of specs.
 * Errors: MLAGEN_EINVAL (sp < 1, sp above H or not dividing it: mg_plan_args_check's message
 * for the Ulysses forms, which names laga-cp, whose kernels do not depend on P: those of
 * sp = 1; unknown dtype, max too small). */
int mg_spec_for_model(const mg_shape *shape, int sp, const char *dtype, mg_kernel_spec *specs,
                      int max, int *n, mg_diag *d);

/* mg_spec_for_model for LAGA-F plans of head_groups groups (0: the default,
 * mg_plan_default_head_groups): the group kernels get H / sp / head_groups heads. Errors:
 * those of mg_spec_for_model; MLAGEN_EINVAL head_groups not a divisor of H / sp in
 * [1, MG_PLAN_MAX_HEAD_GROUPS]. */
int mg_spec_for_plan(const mg_shape *shape, int sp, int head_groups, const char *dtype,
                     mg_kernel_spec *specs, int max, int *n, mg_diag *d);

/* The one table from plan operations to kernel families: the families each kernel op of a
 * plan (mg_kernel_op, generator/core/mg_plan.h) runs, in launch order, and, per family, the
 * tunables the plans fix because they change the kernel's interface (its kernel{}
 * interface) or the plan's bytes: "name=value" assignments separated by spaces, NULL for
 * none. MG_SPEC_OP_A2A stands for the all-to-all steps (SEQ_TO_HEAD, HEAD_TO_SEQ at P > 1:
 * pack, collective, unpack). Read by the CUDA executor (which kernel each step launches),
 * mg_spec_for_plan and mg_spec_plan_tunables. */
#define MG_SPEC_OP_A2A (-1)
#define MG_SPEC_OP_FAMILIES 3
typedef struct mg_op_kernels {
  int op;                                   /* mg_kernel_op or MG_SPEC_OP_A2A */
  const char *family[MG_SPEC_OP_FAMILIES];  /* NULL after the last */
  const char *fixed[MG_SPEC_OP_FAMILIES];   /* the plans' settings of family[i], or NULL */
} mg_op_kernels;
extern const mg_op_kernels mg_op_kernel_table[]; /* ends with family[0] NULL */

/* The i-th family (0-based, launch order) op runs, or NULL past the last or for an op the
 * table does not list. */
const char *mg_op_family(int op, int i);

/* Per-architecture families, the one table of which family implements an op on which
 * architecture: a row replaces mg_op_kernel_table's families of op on arch (same launch
 * order, same parameters by name, plus the tensor maps an sm_90a family takes: runtime/exec/
 * mg_sm90_tmap.h), with its own fixed settings. Ops and architectures without a row run
 * the portable (mma.sync, sm_80 and up) families: sm_80, sm_86, sm_89 always. Rows:
 * sm_90a MG_OP_ATTN_FWD attn_fwd_sm90 (k_packed = 1); sm_90a MG_OP_ATTN_BWD attn_bwd_pre,
 * attn_bwd_dkdv_sm90, attn_bwd_dq_sm90 (k_packed = 1, deterministic = 1, as the mma.sync
 * pair's); sm_90a MG_OP_MQA_FWD mqa_fwd_sm90 and sm_90a MG_OP_MQA_BWD attn_bwd_pre,
 * mqa_bwd_dkv_sm90, mqa_bwd_dq_sm90, both on_request (a row that replaces nothing:
 * mg_op_family_arch and mg_spec_to_arch skip it;
 * mg_family_portable, mg_family_runs_on and `--family` read it). Read by mg_op_family_arch,
 * mg_spec_to_arch, mg_spec_plan_tunables; so by the CUDA executor, `mlagen generate`,
 * `compile`, `tune` and `plan --explain`. */
typedef struct mg_arch_kernels {
  const char *arch;                         /* "sm_90a" */
  mg_op_kernels k;                          /* the op and its families on arch */
  int on_request;                           /* 1: rendered only on request (--family), beside
                                               the portable family; executors and --arch keep
                                               running the portable one */
} mg_arch_kernels;
extern const mg_arch_kernels mg_arch_kernel_table[]; /* ends with arch NULL */

/* The i-th family op runs on arch: the arch's row (mg_arch_kernel_table) when there is one,
 * else mg_op_family(op, i). arch NULL or "" (no device known): mg_op_family. */
const char *mg_op_family_arch(int op, int i, const char *arch);

/* The portable family an architecture's family stands in for (attn_fwd_sm90 -> attn_fwd:
 * the same position of the same op in mg_op_kernel_table), or family itself when it is
 * portable or unknown. */
const char *mg_family_portable(const char *family);

/* 1 when family's kernels run on arch: a portable family, or one of arch's rows; else 0
 * (another architecture's family: attn_fwd_sm90 on sm_80). */
int mg_family_runs_on(const char *family, const char *arch);

/* Whether $MLAGEN_MMA_SYNC forces the portable (mma.sync) families where an architecture's
 * row would replace them: *on = 1 for 1, true, yes, on (any case), 0 for unset, empty, 0,
 * false, no, off. Read by the CUDA executor and `mlagen plan --explain` (which shows what
 * the executor would run). Errors: MLAGEN_EINVAL another value (the message names the
 * variable, the value and the accepted words). */
int mg_spec_mma_sync_forced(int *on, mg_diag *d);

/* s for arch: *out is s rendered for arch (out->arch = arch, "" for NULL), and, when a row
 * of mg_arch_kernel_table replaces s->family (a portable family) on arch, with that family,
 * its configuration cleared but for the row's fixed settings and s's key layout
 * (mg_spec_step_tunables: k_packed = 0 stays split): 1 is
 * returned then, else 0. The caller applies its overrides again. out may be s. */
int mg_spec_to_arch(const mg_kernel_spec *s, const char *arch, mg_kernel_spec *out);

/* Sets the tunables the plans' executors (runtime/exec/mg_cuda_exec.h) fix for s's family (the
 * table's fixed settings: attn_fwd, attn_bwd_dq, expand_kv and split_dkv k_packed = 1
 * (attn_fwd_sm90 and the sm_90a backward too, mg_arch_kernel_table); attn_bwd_dkdv
 * k_packed = 1, deterministic = 1, no fp32 dQ accumulator; mqa_bwd_dkv qsplit = 1, dc
 * written once, no fp32 accumulator). k_packed = 1 is the key layout of the explicit plan
 * (a per-head K): a spec that already asks for split keys (k_packed = 0, the LAGA plans'
 * steps: mg_spec_step_tunables) keeps it. Other families are left alone. mg_spec_for_model
 * applies it, so `mlagen generate` emits, and `mlagen tune` sweeps, the kernels the
 * executors run. */
void mg_spec_plan_tunables(mg_kernel_spec *s);

/* 1 when family's kernels have a key layout the plan's step decides (its fixed settings in
 * the tables name k_packed: attn_fwd, attn_bwd_dkdv, attn_bwd_dq, their sm_90a families,
 * expand_kv, split_dkv), else 0. */
int mg_spec_keyed(const char *family);

/* 1 when s runs split keys: a keyed family (mg_spec_keyed) with k_packed = 0; else 0. */
int mg_spec_split_keys(const mg_kernel_spec *s);

/* The tunables of the kernel a plan step runs (mg_step.split_keys, generator/core/mg_plan.h):
 * for a keyed family (mg_spec_keyed) k_packed = 0 when split_keys, else 1 (replacing any
 * k_packed override s had), then mg_spec_plan_tunables. The CUDA executor and
 * mg_spec_for_model call it, so generate, compile and tune see what the plans run. */
void mg_spec_step_tunables(mg_kernel_spec *s, int split_keys);

/* Checks a user's override "name=value" or "family.name=value" (generate's and compile's
 * --set) against the settings the plans fix (the tables' fixed settings: k_packed, the key
 * layout of attn_fwd, attn_bwd_dkdv, attn_bwd_dq, their sm_90a families, expand_kv and
 * split_dkv, set per plan step; attn_bwd_dkdv's deterministic = 1; mqa_bwd_dkv's qsplit = 1):
 * a kernel rendered with another value is one no plan step runs (its arguments or what it
 * computes differ). Without a family, every family's fixed settings count.
 * Errors: MLAGEN_EINVAL (a fixed setting, naming the families that fix it); a malformed
 * assignment is left to mg_spec_set (0 here). */
int mg_spec_override_check(const char *assignment, mg_diag *d);

/* Adds or replaces a tunable override "name=value" (value an integer); "family.name=value"
 * applies only when s is of that family (and is otherwise a no-op).
 * Errors: MLAGEN_EINVAL (not name=value, not an integer, an unknown family, too many
 * overrides). */
int mg_spec_set(mg_kernel_spec *s, const char *assignment, mg_diag *d);
#endif
