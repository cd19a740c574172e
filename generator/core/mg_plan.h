/* mg_plan.h: a form of MLA attention as a plan, and what it costs.
 *
 * A plan is an ordered list of steps (collective, GEMM, kernel) over named buffers with
 * shapes and dtypes, built for one rank from the model shape, the sequence-parallel
 * degree P, batch, sequence length, causal flag and dtype. Forward steps come first, then
 * backward steps. The same plan drives the planner (communication, memory, FLOPs) and
 * the executors (cpu, cuda), so the figures `mlagen plan` prints are the bytes the
 * executors send and allocate.
 *
 * Memory convention: the caller owns the inputs (q, c_kv, k_rope, w_kv_b; do in the
 * backward). Every other buffer is allocated by the plan when first written and freed
 * after its last use; a buffer written in the forward and read in the backward is
 * saved (kept from forward to backward). Outputs (o; dq, dc_kv, dk_rope, dw_kv_b) are
 * allocated by the plan and handed to the caller: they count toward the peak of their
 * pass and are not freed. Steps may also need a workspace (the send and receive buffers
 * of a collective) for their duration. Communication counts the bytes each rank sends
 * (docs/forms.md, Conventions). The forms are in generator/core/forms/ (built through
 * mg_plan_builder.h); the math in docs/forms.md. */
#ifndef MG_PLAN_H
#define MG_PLAN_H
#include <stdint.h>

#include "mg_config.h"
#include "mg_diag.h"
#include "mg_dtype.h"

#define MG_PLAN_MAX_BUFS 384
#define MG_PLAN_MAX_STEPS 320
#define MG_PLAN_MAX_DIMS 4
#define MG_STEP_MAX_ARGS 8

typedef enum mg_form {
  MG_FORM_EXPLICIT, MG_FORM_ABSORBED, MG_FORM_LAGA, MG_FORM_LAGA_R, MG_FORM_LAGA_F,
  MG_FORM_LAGA_CP /* all-gather context parallelism over the latent (form_laga_cp.c) */
} mg_form;
#define MG_FORM_COUNT 6

/* The most head groups of the fused LAGA form (laga-f) and of laga-cp: each group adds 17
 * steps and 18 buffers. */
#define MG_PLAN_MAX_HEAD_GROUPS 16

/* laga-cp's token layout, for any S_l = S / P: rank r's shard holds two chunks of the
 * sequence, a = ceil(S_l / 2) tokens then b = S_l - a; its row i (0 <= i < S_l) is the
 * token at global position r a + i when i < a, else P a + (P - 1 - r) b + (i - a). For
 * even S_l these are chunks r and 2P - 1 - r of 2P equal chunks, so under a causal mask
 * every rank attends the same number of (query, key) pairs. At P = 1 the map is the
 * identity. Every other form's rank r holds positions r S_l + i. */
static inline int64_t mg_cp_pos(int64_t P, int64_t Sl, int64_t r, int64_t i) {
  const int64_t a = (Sl + 1) / 2, b = Sl - a;
  return i < a ? r * a + i : P * a + (P - 1 - r) * b + (i - a);
}

/* The global position of row i of rank `rank`'s token shard under form f (P ranks, S_l
 * tokens each): mg_cp_pos for MG_FORM_LAGA_CP, rank S_l + i for every other form. */
static inline int64_t mg_form_token_pos(mg_form f, int64_t P, int64_t Sl, int64_t rank, int64_t i) {
  return f == MG_FORM_LAGA_CP ? mg_cp_pos(P, Sl, rank, i) : rank * Sl + i;
}

/* "explicit", "absorbed", "laga", "laga-r", "laga-f", "laga-cp". */
const char *mg_form_name(mg_form f);
/* Parses a form name; returns 0 or -1. */
int mg_form_parse(const char *name, mg_form *out);

typedef enum mg_pass { MG_FWD, MG_BWD } mg_pass;
typedef enum mg_buf_role { MG_BUF_INPUT, MG_BUF_OUTPUT, MG_BUF_TEMP } mg_buf_role;

typedef struct mg_plan_buf {
  char name[24];
  mg_buf_role role;
  mg_dtype dtype;
  int ndim;
  int64_t dims[MG_PLAN_MAX_DIMS];
  /* set by mg_plan_finalize: steps of the first write and of the last access (-1: none) */
  int first, last;
} mg_plan_buf;

typedef enum mg_step_kind {
  MG_STEP_SEQ_TO_HEAD,    /* all-to-all [B, S_l, H, w] -> [B, S, H/P, w] */
  MG_STEP_HEAD_TO_SEQ,    /* all-to-all [B, S, H/P, w] -> [B, S_l, H, w] */
  MG_STEP_ALL_GATHER,     /* all-gather [B, S_l, w] -> [B, S, w] */
  MG_STEP_REDUCE_SCATTER, /* reduce-scatter (sum) [B, S, w] -> [B, S_l, w] */
  MG_STEP_GEMM,           /* strided batched GEMM, see mg_gemm */
  MG_STEP_KERNEL,         /* an attention or layout kernel, see mg_kernel_op */
} mg_step_kind;

/* Kernels. Shapes use the plan's names: S_k the keys' sequence length. */
typedef enum mg_kernel_op {
  /* k [.., Hk, d_n + d_r] = [kv[.., :d_n] ; rope (shared by all heads)], v = kv[.., d_n:].
   * args: kv [B, S, Hk, d_n + d_v], rope source (column rope_col of a [B, S, rope_w]
   * buffer) -> k [B, S, Hk, d_n + d_r], v [B, S, Hk, d_v].
   * split_keys (below): k_nope = kv[.., :d_n], v = kv[.., d_n:], no RoPE copy. args: kv ->
   * k_nope [B, S, Hk, d_n], v [B, S, Hk, d_v] */
  MG_OP_EXPAND_KV,
  /* dkv [.., d_n + d_v] = [dk[.., :d_n] ; dv]; drope[b, s, :] (columns rope_col.. of a
   * [B, S, rope_w] buffer) = sum over heads of dk[.., d_n:]. args: dk, dv -> dkv, drope.
   * split_keys: the RoPE gradient comes summed already: args dk_nope [B, S, Hk, d_n], dv,
   * dk_rope [B, S, d_r] (mg_plan_acc_dtype) -> dkv, drope with drope's columns rope_col..
   * = dk_rope (accumulate: +=) */
  MG_OP_SPLIT_DKV,
  /* explicit attention forward. args: q [B, S_q, Hl, d_qk], k [B, S, Hl, d_qk],
   * v [B, S, Hl, d_v] -> o [B, S_q, Hl, d_v], lse [B, Hl, S_q] (natural log,
   * mg_plan_acc_dtype). S_q = S, or laga-cp's S / P rows at the step's query positions
   * (q_pos0, q_split, q_pos1 below). split_keys: args q, k_nope [B, S, Hl, d_n], v,
   * c [B, S, rope_w] (k_rope = c's columns rope_col .. rope_col + d_r, shared by the
   * heads) -> o, lse */
  MG_OP_ATTN_FWD,
  /* explicit attention backward. args: q, k, v, o, lse, do -> dq, dk, dv.
   * split_keys: args q, k_nope, v, o, lse, do, c -> dq, dk_nope [B, S, Hl, d_n], dv,
   * dk_rope [B, S, d_r] (mg_plan_acc_dtype: the kernels sum it over the step's heads in
   * fp32) */
  MG_OP_ATTN_BWD,
  /* absorbed MQA forward, one shared latent head. args: q_abs [B, S, Hl, d_c + d_r],
   * c [B, S, d_c + d_r] (keys; values are c[.., :d_c]) -> o_lat [B, S, Hl, d_c], lse */
  MG_OP_MQA_FWD,
  /* absorbed MQA backward. args: q_abs, c, o_lat, lse, do_lat -> dq_abs, dc (summed over
   * heads: c is both key and value) */
  MG_OP_MQA_BWD,
  /* c [B, S, d_c + d_r] = [c_kv ; k_rope]. args: c_kv, k_rope -> c */
  MG_OP_CONCAT_LATENT,
  /* [dc_kv ; dk_rope] = dc. args: dc -> dc_kv, dk_rope */
  MG_OP_SPLIT_LATENT,
  /* laga-cp's token order: src and dst [B, S, w] over the step's `ranks` = P shards of
   * S_l = S / P rows. Forward (inverse 0), from rank order (the all-gather's: row
   * q S_l + i is rank q's row i) to global order: dst[b, mg_cp_pos(P, S_l, q, i)] =
   * src[b, q S_l + i]; inverse 1: dst[b, q S_l + i] = src[b, mg_cp_pos(P, S_l, q, i)].
   * args: src -> dst */
  MG_OP_CHUNK_ORDER,
  /* dst[r, dst_col + j] = src[r, src_col + j] for j < cols over all rows of width
   * src_w / dst_w (the step's, or each buffer's last dim when 0). args: src -> dst */
  MG_OP_COPY_COLS,
} mg_kernel_op;

/* C[i] = alpha op(A[i]) op(B[i]) + beta C[i] for i < batch, row-major; operand X of
 * batch i starts at element off_x + i * stride_x of its buffer. */
typedef struct mg_gemm {
  int trans_a, trans_b;
  int64_t m, n, k;
  int64_t lda, ldb, ldc;
  int64_t off_a, off_b, off_c;
  int64_t stride_a, stride_b, stride_c;
  int batch;
  float beta; /* 0: overwrite, 1: accumulate */
  /* Varlen plans (mg_varlen.h): tok_k = 1 marks a GEMM whose k runs over token rows (the
   * weight gradients, k = S_l or S), row i of k at global position tok0 + i. At run time
   * the executors contract only over the valid rows, mg_varlen_valid_rows(T, tok0, k), so
   * that NaN in slack rows never reaches the sum (0 * NaN). 0: k is not tokens. */
  int tok_k;
  int64_t tok0;
} mg_gemm;

typedef struct mg_step {
  mg_step_kind kind;
  mg_pass pass;
  char label[80];            /* what the step does, for `mlagen plan --steps` */
  int in[MG_STEP_MAX_ARGS];  /* buffer ids read, in the order the kernel takes them */
  int n_in;
  int out[MG_STEP_MAX_ARGS]; /* buffer ids written */
  int n_out;
  mg_kernel_op op;           /* MG_STEP_KERNEL */
  int64_t rope_col, rope_w, src_col, dst_col, cols; /* kernel column arguments */
  int64_t src_w, dst_w;      /* MG_OP_COPY_COLS row widths; 0: the buffer's last dim */
  int accumulate;            /* MG_OP_SPLIT_DKV: add the RoPE sum into drope */
  /* MG_OP_ATTN_FWD, MG_OP_ATTN_BWD, MG_OP_EXPAND_KV, MG_OP_SPLIT_DKV: 1 = split keys (the
   * LAGA family: laga, laga-r, laga-f, laga-cp). No per-head copy of the shared RoPE key:
   * K_nope is per head (d_n wide) and the attention steps read k_rope from the gathered
   * latent, columns rope_col .. rope_col + d_r of rows rope_w wide (d_c, d_c + d_r); the
   * attention backward returns dk_rope [B, S, d_r] summed over its heads. The kernels run
   * with k_packed = 0 (mg_spec_step_tunables). 0 = packed keys (explicit: the all-to-all
   * delivers a per-head K [B, S, Hl, d_n + d_r]; k_packed = 1). Args per op above. */
  int split_keys;
  int64_t ranks;             /* MG_OP_CHUNK_ORDER: the shards P (the plan's sp) */
  int inverse;               /* MG_OP_CHUNK_ORDER: global order -> rank order */
  /* MG_OP_ATTN_FWD / MG_OP_ATTN_BWD: the global position of query row i (of the q buffer's
   * S_q rows per batch item) is q_pos0 + i for i < q_split, else q_pos1 + (i - q_split);
   * keys sit at positions 0 .. S_k - 1 (S_k from the k buffer). Causal keeps key j for
   * query i iff j <= pos(i). All zero (every form but laga-cp): pos(i) = i. The attention
   * kernels take the same three numbers as arguments q_pos0, q_split, q_pos1. */
  int64_t q_pos0, q_split, q_pos1;
  mg_gemm gemm;              /* MG_STEP_GEMM (in[0] = A, in[1] = B, out[0] = C) */
  int64_t sent;              /* collectives: bytes this rank sends */
  int64_t workspace;         /* bytes the step needs for its duration: a collective's
                              * staging at P > 1; MG_OP_ATTN_BWD / MG_OP_MQA_BWD: the
                              * delta the CUDA executor computes, f32 [B, H, S] */
  double flops;              /* GEMMs and attention kernels (docs/forms.md, Conventions) */
} mg_step;

typedef struct mg_plan_args {
  const mg_shape *shape;
  mg_form form;
  int sp;          /* P, sequence-parallel degree */
  int rank;        /* this rank, 0 <= rank < P */
  int batch;       /* B */
  int64_t seq;     /* S, global sequence length; S_l = S / P */
  int causal;
  mg_dtype dtype;  /* activations and communication (f32 on the CPU reference) */
  int head_groups; /* laga-f: K/V are rebuilt for H/P / head_groups heads at a time (a
                      divisor of H/P, at most MG_PLAN_MAX_HEAD_GROUPS); laga-cp: for
                      H / head_groups heads at a time (a divisor of H, at most
                      MG_PLAN_MAX_HEAD_GROUPS); 0 picks mg_plan_default_head_groups (of
                      H/P, of H). Other forms require 0. */
  /* Packed sequences (mg_varlen.h): nonzero makes a varlen plan, batch 1 and seq the token
   * capacity T_cap; the executors then take cu_seqlens at every pass. */
  int varlen;
  /* Optional, varlen plans only: the documents the planner's figures assume (attention
   * FLOPs counted per document pair, mg_varlen_pairs); n_cu = N + 1 entries, checked by
   * mg_plan_args_check (mg_varlen_check against seq). NULL: one document of seq tokens, the
   * worst case (the unpacked figures). Not kept past mg_plan_build (the plan's
   * args.cu_seqlens is set to NULL and n_cu to 0: the executors take the documents at
   * every pass). */
  const int32_t *cu_seqlens;
  int64_t n_cu;
} mg_plan_args;

typedef struct mg_plan {
  mg_plan_args args;
  mg_shape shape;        /* copy of *args.shape */
  int heads_local;       /* H / P (laga-cp: H, every rank attends with all heads) */
  int64_t seq_local;     /* S / P */
  mg_plan_buf bufs[MG_PLAN_MAX_BUFS];
  int n_bufs;
  mg_step steps[MG_PLAN_MAX_STEPS];
  int n_steps;
  int n_fwd;             /* steps [0, n_fwd) are the forward */
  int in_backward;       /* builder state: mg_plan_backward was called */
  int error;             /* set by a builder call that failed: 1 too many buffers or
                            steps, 2 a buffer too large (named in too_big) */
  char too_big[24];
  mg_step spill;         /* builder state: absorbs a step past MG_PLAN_MAX_STEPS (error 1),
                            so form files need no checks and threads share no scratch */
} mg_plan;

/* How a caller's messages name mg_plan_args' fields: the message prefix (fn) and each
 * field's spelling ("sp" or "plan_desc->sp_size"), and how to name the laga-f form.
 * no_seq: the caller takes no sequence length (generate, compile: args->seq is a stand-in,
 * a multiple of H P), so the P-versus-H message speaks of "the sequence length", not S. */
typedef struct mg_plan_arg_names {
  const char *fn, *sp, *rank, *batch, *seq, *head_groups, *laga_f, *laga_cp;
  int no_seq;
} mg_plan_arg_names;

/* mg_plan_args_check's default names ("plan: sp = ...") with no_seq set, for the callers
 * that check a P without a sequence length (mg_spec_for_plan, the CLI's generate/compile). */
extern const mg_plan_arg_names mg_plan_names_no_seq;

/* The argument rules of mg_plan_build, the one place they are written: MLAGEN_EINVAL
 * naming the argument (shape NULL, an unknown form or dtype, P < 1, rank outside [0, P),
 * batch < 1, S < 1, S not divisible by P, for every form but laga-cp P > H or not
 * dividing H (the Ulysses forms shard by whole heads: the message names the forms, the P
 * that divide H and S, and laga-cp, which takes any P), head_groups nonzero for a form
 * other than laga-f and laga-cp, or not dividing H / P (laga-f) or H (laga-cp) or above
 * MG_PLAN_MAX_HEAD_GROUPS, sizes past 2^56 bytes per buffer; varlen with batch != 1,
 * cu_seqlens or n_cu given without varlen, and mg_varlen_check's messages for cu_seqlens
 * against seq, e.g. "plan: cu_seqlens[3] = 9000 is past the plan's token capacity 8192"),
 * in the words of names (NULL: "plan: sp = ..."). */
int mg_plan_args_check(const mg_plan_args *args, const mg_plan_arg_names *names, mg_diag *d);

/* Builds the plan of args->form for one rank (args checked by mg_plan_args_check), sets
 * every buffer's first/last steps and checks every step (mg_plan_check.h). A varlen plan
 * marks its token-contracting GEMMs (the weight gradients: mg_gemm.tok_k, tok0) and, when
 * args->cu_seqlens is given, counts its attention FLOPs per document pair
 * (mg_varlen_pairs); the plan keeps a copy of *args with cu_seqlens NULL. Errors:
 * MLAGEN_EINVAL with mg_plan_args_check's or mg_plan_check's message. */
int mg_plan_build(mg_plan *p, const mg_plan_args *args, mg_diag *d);

/* What a plan costs one rank (per layer). */
typedef struct mg_plan_cost {
  int64_t sent_fwd, sent_bwd;   /* bytes sent by the collectives */
  int64_t saved;                /* bytes kept from forward to backward */
  int64_t peak_fwd, peak_bwd;   /* transient peak: live plan buffers + step workspace */
  double attn_flops_fwd, attn_flops_bwd;
  double gemm_flops_fwd, gemm_flops_bwd; /* projections, recompute included */
} mg_plan_cost;

void mg_plan_cost_of(const mg_plan *p, mg_plan_cost *c);

/* A device and link for predicting time, in decimal units (1 GB/s = 1e9 bytes per second,
 * not gigabits). Defaults (mlagen plan): MG_H200_* below. */
typedef struct mg_device_model {
  double tflops;    /* dense matmul rate of the plan's dtype, 1e12 FLOP/s, > 0 */
  double hbm_gbps;  /* memory bandwidth, GB/s, > 0 */
  double link_gbps; /* what one rank can send to its peers, one direction, GB/s, > 0 */
} mg_device_model;
/* NVIDIA H200 SXM datasheet: 989 dense BF16/FP16 Tensor TFLOPS (1,979 is with sparsity),
 * 4.8 TB/s HBM3e, NVLink 900 GB/s (both directions together: 450 GB/s each way), 141 GB. */
#define MG_H200_TFLOPS 989.0
#define MG_H200_HBM_GBPS 4800.0
#define MG_H200_LINK_GBPS 450.0
#define MG_H200_MEM_GIB 131.0 /* 141e9 bytes = 131.3 GiB, rounded down */
/* An InfiniBand-class link: NDR 400 Gb/s per GPU = 50 GB/s each way. */
#define MG_NDR_LINK_GBPS 50.0

/* A plan's predicted time per rank and layer, a roofline with communication on the
 * critical path: each compute step (GEMM, kernel) takes max(flops / tflops, bytes /
 * hbm) where bytes are what it must read and write once (a GEMM batch x (m k + k n + m n)
 * elements, plus m n more when it accumulates into C; a column copy its columns read and
 * written; any other kernel its input and output buffers, whole); each collective takes
 * sent / link (no latency term); steps run one after another, since every collective
 * feeds the next step (no overlap of communication and compute). An ideal-device lower
 * bound: kernels at peak rate and minimal traffic. */
typedef struct mg_plan_time {
  double fwd_s, bwd_s;                 /* predicted seconds, forward and backward */
  double compute_fwd_s, compute_bwd_s; /* compute steps: sum of max(flops, bytes) times */
  double comm_fwd_s, comm_bwd_s;       /* collectives: sent / link */
  double flops_fwd, flops_bwd;         /* all steps' FLOPs (attention + GEMMs) */
  double hbm_fwd, hbm_bwd;             /* bytes the compute steps read and write */
} mg_plan_time;
/* Fills *t for plan p on device dev (every rate > 0; the caller checks). */
void mg_plan_time_of(const mg_plan *p, const mg_device_model *dev, mg_plan_time *t);

/* laga-f's and laga-cp's head groups when the caller gives none: the largest divisor of
 * heads_local (laga-f H / P, laga-cp H) not above 8 (1 when it is 1 or has no divisor in
 * [2, 8]). Each group's K/V workspace is then at most half of the materialized one while
 * the attention launches keep heads_local / 8 or more heads of CTAs (DeepSeek-V3 at
 * P = 8: laga-f 8 groups of 2 heads, laga-cp 8 groups of 16). */
int mg_plan_default_head_groups(int heads_local);

/* The dtype of the plan's accumulators (the LSE, the weight gradient dw_kv_b): MG_F64 when
 * the plan computes in f64 (the CPU reference), else MG_F32 (bf16/f16 activations keep
 * f32 accumulators, as the kernels do). */
mg_dtype mg_plan_acc_dtype(const mg_plan *p);

/* Bytes of buffer b. */
int64_t mg_plan_buf_bytes(const mg_plan_buf *b);
/* Elements of buffer b. */
int64_t mg_plan_buf_numel(const mg_plan_buf *b);
/* The buffer named name, or -1. */
int mg_plan_find(const mg_plan *p, const char *name);
#endif
