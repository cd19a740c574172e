/*
 * mlagen.h: the public C interface of mlagen, shape-specialized CUDA kernels for
 * Multi-head Latent Attention (MLA) training.
 *
 * Every function that can fail returns an int status: 0 (MLAGEN_OK) on success or a
 * negative MLAGEN_E* code. mlagen_strerror() names a code; the detailed message (NVRTC
 * log, Lua traceback, config file and key) is kept by the context the call went through
 * (mlagen_last_message, below).
 */
#ifndef MLAGEN_H
#define MLAGEN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MLAGEN_VERSION_MAJOR 0
#define MLAGEN_VERSION_MINOR 1
#define MLAGEN_VERSION_PATCH 0

/* X(name, value, description): the one table of status codes. */
#define MLAGEN_STATUS_MAP(X)                                                        \
  X(OK, 0, "success")                                                               \
  X(EINVAL, -1, "invalid argument")                                                 \
  X(ENOMEM, -2, "out of memory")                                                    \
  X(EIO, -3, "file system error")                                                   \
  X(ECONFIG, -4, "invalid model config")                                            \
  X(EUNSUPPORTED, -5, "shape not supported by the kernels")                         \
  X(ETEMPLATE, -6, "template error")                                                \
  X(ECOMPILE, -7, "NVRTC compilation failed")                                       \
  X(ECACHE, -8, "JIT cache error")                                                  \
  X(ENODRIVER, -9, "no CUDA driver")                                                \
  X(ENONCCL, -10, "NCCL is not available (not built in, libnccl.so.2 not found)") \
  X(ELIMIT, -11, "resource limit exceeded")                                         \
  X(EDRIVER, -12, "a CUDA driver call failed")

enum mlagen_status {
#define MLAGEN__ENUM(name, value, text) MLAGEN_##name = value,
  MLAGEN_STATUS_MAP(MLAGEN__ENUM)
#undef MLAGEN__ENUM
};

/* Short English description of a status code; "unknown status" for other values.
 * The returned string is static. */
const char *mlagen_strerror(int status);

/* Name of a status code ("MLAGEN_EINVAL"); "MLAGEN_UNKNOWN" for other values. */
const char *mlagen_status_name(int status);

/* ==== The embedding API ===============================================================
 *
 * A trainer embeds mlagen through three objects:
 *   mlagen_context  messages, and (later) the CUDA device, modules and kernel cache;
 *   mlagen_model    a validated MLA attention shape (from a config.json or by hand);
 *   mlagen_plan     one form of one layer for one rank of a sequence-parallel (SP)
 *                   group: batch, sequence length, dtype fixed; says the sizes of every
 *                   tensor and buffer (mlagen_plan_sizes) and runs the forward and the
 *                   backward (mlagen_forward, mlagen_backward).
 * Notation (DeepSeek-V2 names, HF config.json keys): H heads [num_attention_heads],
 * d_c [kv_lora_rank], d_r [qk_rope_head_dim], d_n [qk_nope_head_dim], d_v [v_head_dim];
 * B batch, S the global sequence length, P = sp_size, S_l = S / P the tokens of one rank.
 *
 * Status of this version: contexts, models, plans and sizes work on any machine (no GPU
 * or driver needed). mlagen_forward and mlagen_backward validate every argument, load the
 * CUDA driver (MLAGEN_ENODRIVER without one) and run bf16/f16 plans of sp_size 1 with the
 * CUDA executor (runtime/exec/mg_cuda_exec.h; checked on an H200 against the CPU reference
 * by tests/gpu/forms_check.c, at sp_size 1); sp_size > 1 runs
 * its collectives through the trainer's NCCL communicator (mlagen_plan_set_comm), NCCL
 * being loaded with dlopen at the first such call (libnccl.so.2 or $MLAGEN_LIBNCCL; not
 * linked, so the library starts without it: MLAGEN_ENONCCL then). mlagen_get_device_info
 * works with a driver. A plan made for the host (mlagen_plan_desc.device =
 * MLAGEN_DEVICE_CPU; f32 and f64) runs the same passes with the CPU executor on host
 * memory, without a driver; its sp_size > 1 collectives go through the trainer's callbacks
 * (mlagen_plan_set_comm_ops), which a CUDA plan may use instead of an ncclComm_t too.
 *
 * Messages. Every call that takes a context, or a plan made through one, clears the
 * context's message and, when it fails, leaves a one-line message there naming the
 * argument or the config key: mlagen_last_message(ctx). A call that cannot reach a live
 * context (ctx NULL, plan NULL, a plan whose context was destroyed) leaves its message in
 * a per-thread slot: mlagen_last_message(NULL).
 *
 * Threads. Different contexts may be used from different threads at once. One context
 * and the objects made through it must not be used by two threads at the same time, and
 * a context must not be destroyed while another thread uses it or its plans. The driver
 * is loaded once per process, thread-safely.
 *
 * Lifetimes. Models do not depend on a context after they are made (the context was only
 * used for the message); a model may be destroyed once its plans are made (plans copy the
 * shape). A plan belongs to the context it was made with. Destroying the context does not
 * free the plan: the plan must still be destroyed with mlagen_plan_destroy, which is the
 * only call a plan accepts after its context was destroyed; every other call returns
 * MLAGEN_EINVAL ("its context was destroyed"). Detected: a plan used after its context
 * was destroyed (contexts register themselves in a process-wide list; a plan keeps its
 * context's unique id). Not detected (undefined behaviour, as for free()): a context or
 * plan used after its own destroy call, and a pointer that is not one made by this API.
 *
 * Memory. Sizes are bytes (size_t). Every tensor is dense, row-major, in device memory,
 * aligned to its element size; the workspace and the saved buffer are device memory
 * aligned to 16 bytes (256 bytes, as cuMemAlloc gives, lets cuBLAS use all of its slice).
 * The caller owns all of them: neither mlagen nor cuBLAS allocates device memory in
 * mlagen_forward and mlagen_backward. For a CPU plan (MLAGEN_DEVICE_CPU) read "host
 * memory" for "device memory" throughout: the same rules, and mlagen allocates nothing of
 * tensor size either.
 */

/* Element types. 0 is not a type (a zero-filled descriptor is refused). */
typedef enum mlagen_dtype {
  MLAGEN_DTYPE_BF16 = 1, /* bfloat16, 2 bytes */
  MLAGEN_DTYPE_F16 = 2,  /* IEEE half, 2 bytes */
  MLAGEN_DTYPE_F32 = 3,  /* 4 bytes */
  MLAGEN_DTYPE_F64 = 4   /* 8 bytes */
} mlagen_dtype;

/* The forms of MLA attention under SP (docs/forms.md): five Ulysses-style (head-sharded
 * attention) and one context-parallel. 0 is not a form. */
typedef enum mlagen_form {
  MLAGEN_FORM_EXPLICIT = 1, /* up-project K/V locally, all-to-all Q, K, V (Megatron-Core) */
  MLAGEN_FORM_ABSORBED = 2, /* all-gather the latent, attend over it (keeps H/P x d_c) */
  MLAGEN_FORM_LAGA = 3,     /* all-gather the latent, rebuild this rank's K/V, explicit attention */
  MLAGEN_FORM_LAGA_R = 4,   /* LAGA keeping only the latent; K/V recomputed in the backward */
  MLAGEN_FORM_LAGA_F = 5,   /* LAGA with fused expansion: K/V rebuilt per head group in a
                             * workspace of H / P / head_groups heads, forward and backward */
  MLAGEN_FORM_LAGA_CP = 6   /* all-gather context parallelism over the latent: every rank
                             * keeps all H heads and its own queries, all-gathers only
                             * [c_kv ; k_rope], rebuilds K/V for all heads per head group and
                             * attends its queries over all keys; any P dividing S (P > H
                             * too). Its token shard is two chunks (see sp_rank) */
} mlagen_form;

#define MLAGEN_MAX_DIMS 4

typedef struct mlagen_context mlagen_context;
typedef struct mlagen_model mlagen_model;
typedef struct mlagen_plan mlagen_plan;

/* ---- context ----------------------------------------------------------------------- */

/* Creates a context in *ctx. Loads nothing: the CUDA driver is loaded by the first call
 * that needs it. Errors: MLAGEN_EINVAL ctx is NULL; MLAGEN_ENOMEM. On error *ctx is NULL
 * (when ctx is not NULL) and the message is in mlagen_last_message(NULL). */
int mlagen_context_create(mlagen_context **ctx);

/* Destroys a context and its message. NULL is a no-op. Plans made through it stay
 * allocated until mlagen_plan_destroy (see Lifetimes). Called from a collective callback
 * of one of its plans' passes (mlagen_comm_ops), the context is unusable at once and
 * freed when the pass returns (its message then lost). */
void mlagen_context_destroy(mlagen_context *ctx);

/* The message of the last call made through ctx: "" when it succeeded. With ctx NULL:
 * the message of the last call on this thread that could not reach a live context.
 * Never NULL; valid until the next call through ctx (or, for NULL, on this thread). */
const char *mlagen_last_message(const mlagen_context *ctx);

/* ---- models ------------------------------------------------------------------------- */

/* An MLA attention shape given by hand. */
typedef struct mlagen_model_desc {
  int num_attention_heads; /* H */
  int kv_lora_rank;        /* d_c */
  int qk_rope_head_dim;    /* d_r, even */
  int qk_nope_head_dim;    /* d_n */
  int v_head_dim;          /* d_v */
  /* the scale of the attention scores; 0 means 1 / sqrt(d_n + d_r) (no yarn mscale) */
  double softmax_scale;
} mlagen_model_desc;

/* A model from a HuggingFace config.json: config is a path to the file, to a directory
 * holding config.json, or a shipped name ("deepseek-v3", "deepseek-v2-lite", "kimi-k2";
 * an existing path wins). The softmax scale includes the yarn mscale, as DeepSeek's
 * modeling code computes it. On success *model is the new model (free it with
 * mlagen_model_destroy).
 * Errors (message in ctx, naming the file and the key):
 *   MLAGEN_EINVAL       ctx (message in mlagen_last_message(NULL)), config or model NULL,
 *                       or config "".
 *   MLAGEN_EIO          neither a readable file nor a shipped name (the message lists the
 *                       shipped names).
 *   MLAGEN_ELIMIT       a file over 16 MiB.
 *   MLAGEN_ECONFIG      not JSON, not an MLA config, a missing or invalid key.
 *   MLAGEN_EUNSUPPORTED a dim beyond the kernels' limits (the message gives the limit).
 *   MLAGEN_ENOMEM */
int mlagen_model_from_config(mlagen_context *ctx, const char *config, mlagen_model **model);

/* A model from desc, checked with the rules a config is checked with.
 * Errors (message in ctx, naming the field, e.g. "mlagen_model_desc: key 'v_head_dim':"):
 *   MLAGEN_EINVAL       ctx, desc or model NULL; a dim <= 0; an odd qk_rope_head_dim; a
 *                       softmax_scale < 0, NaN or infinite.
 *   MLAGEN_EUNSUPPORTED a dim beyond the kernels' limits: d_n, d_r, d_v multiples of 16,
 *                       d_c a multiple of 32, d_n + d_r <= 256, d_v <= 256,
 *                       d_c + d_r <= 640, H <= 4096.
 *   MLAGEN_ENOMEM */
int mlagen_model_from_desc(mlagen_context *ctx, const mlagen_model_desc *desc,
                           mlagen_model **model);

/* The model's shape, softmax_scale filled in (never 0). Errors: MLAGEN_EINVAL model or
 * desc NULL (message in mlagen_last_message(NULL)). */
int mlagen_model_get_desc(const mlagen_model *model, mlagen_model_desc *desc);

/* Frees a model; NULL is a no-op. Plans made from it are not affected. */
void mlagen_model_destroy(mlagen_model *model);

/* ---- plans -------------------------------------------------------------------------- */

/* Where a plan runs. 0 is the CUDA device, so a zero-filled descriptor keeps meaning what
 * it meant before the CPU device existed. */
typedef enum mlagen_device {
  MLAGEN_DEVICE_CUDA = 0, /* the CUDA executor: bf16 and f16 plans, device memory, a stream */
  MLAGEN_DEVICE_CPU = 1   /* the CPU executor: f32 and f64 plans, host memory; each call
                           * runs its pass to completion on the calling thread (stream is
                           * ignored), GEMMs through the BLAS mlagen was built with */
} mlagen_device;

/* One layer's attention on one rank of an SP group. */
typedef struct mlagen_plan_desc {
  mlagen_form form;
  int batch;        /* B >= 1 */
  int64_t seq;      /* S >= 1, the global sequence length; sp_size divides it */
  int sp_rank;      /* this rank, 0 <= sp_rank < sp_size; it holds tokens
                     * [sp_rank S/P, (sp_rank + 1) S/P), except under MLAGEN_FORM_LAGA_CP:
                     * with S_l = S/P, a = ceil(S_l / 2), b = S_l - a, its row i is the
                     * token at global position r a + i for i < a, else
                     * P a + (P - 1 - r) b + (i - a) (r = sp_rank; for even S_l chunks r
                     * and 2P - 1 - r of 2P equal chunks), so that causal work is even */
  int sp_size;      /* P >= 1; divides H (each rank attends with H / P heads), except under
                     * MLAGEN_FORM_LAGA_CP (any P dividing S) */
  int causal;       /* nonzero: causal attention over global positions */
  mlagen_dtype dtype; /* activations and communication; accumulators (lse, dw_kv_b) are
                       * f32, or f64 when dtype is f64 */
  int head_groups;  /* MLAGEN_FORM_LAGA_F and _LAGA_CP only (0 for the other forms): the
                     * number of head groups K/V are rebuilt in, a divisor of H / P (laga-cp:
                     * of H) in [1, 16]; 0 picks the largest divisor of H / P (of H) not
                     * above 8 */
  mlagen_device device; /* MLAGEN_DEVICE_CUDA (0) or MLAGEN_DEVICE_CPU */
  /* Nonzero: a plan for packed sequences (FlashAttention's "varlen", the THD layout): N
   * documents of different lengths concatenated into one stream of T tokens, held in a
   * buffer of seq = T_cap >= T token rows; the boundaries come with the tensors of each
   * pass (mlagen_tensors.cu_seqlens), so one plan serves every packing of up to T_cap
   * tokens. batch must be 1. The stream is split across the SP ranks as an unpacked
   * sequence of seq tokens (sp_rank above: T_cap / P rows each, laga-cp's two chunks), so
   * a document may span ranks; attention never crosses a document and is causal by the
   * order inside it. The tensors drop the batch dim (mlagen_sizes). 0: [B, S] batches of
   * equal length, as before this field existed. */
  int varlen;
} mlagen_plan_desc;

/* Builds the plan of desc for model. On success *plan is the new plan (free it with
 * mlagen_plan_destroy). Needs no driver.
 * Errors (message in ctx, naming the field, e.g. "plan_desc->sp_rank = 8 is not below
 * plan_desc->sp_size = 8"):
 *   MLAGEN_EINVAL  ctx (message in mlagen_last_message(NULL)), model, desc or plan NULL;
 *                  form or dtype not one of the enums; batch < 1; varlen with batch other
 *                  than 1 (the message names plan_desc->batch); seq < 1; sp_size < 1;
 *                  sp_rank outside [0, sp_size); seq not divisible by sp_size; sp_size
 *                  not dividing H (or above H), except for MLAGEN_FORM_LAGA_CP (the
 *                  message names it); head_groups nonzero for a form other than
 *                  MLAGEN_FORM_LAGA_F and _LAGA_CP, or not a divisor of H / P (laga-cp:
 *                  H) in [1, 16]; buffers
 *                  too large for the planner (over 2^56 bytes) or a memory layout whose
 *                  areas would exceed 2^63 bytes; device not an mlagen_device.
 *   MLAGEN_EUNSUPPORTED  device MLAGEN_DEVICE_CPU and dtype bf16 or f16 (the CPU executor
 *                  runs f32 and f64).
 *   MLAGEN_ENOMEM */
int mlagen_plan_create(mlagen_context *ctx, const mlagen_model *model,
                       const mlagen_plan_desc *desc, mlagen_plan **plan);

/* The global sequence position of row i (0 <= i < seq / sp_size) of rank sp_rank's token
 * shard under desc's form, into *pos: sp_rank seq / sp_size + i, or under
 * MLAGEN_FORM_LAGA_CP its two chunks (see mlagen_plan_desc.sp_rank). Reads form, seq,
 * sp_rank and sp_size only; needs no model and no driver.
 * Errors (message in mlagen_last_message(NULL)): MLAGEN_EINVAL desc or pos NULL; form not
 * an mlagen_form; sp_size < 1; sp_rank outside [0, sp_size); seq < 1 or not divisible by
 * sp_size; i outside [0, seq / sp_size). The same for a varlen plan (plan_desc->varlen):
 * there the position is the row's token index in the packed stream (cu_seqlens say which
 * document it belongs to, and rows at positions >= cu_seqlens[N] are slack). */
int mlagen_token_position(const mlagen_plan_desc *desc, int64_t i, int64_t *pos);

/* Frees a plan; NULL is a no-op. Works after the plan's context was destroyed. Called
 * from a collective callback of the plan's own running pass, it frees the plan when that
 * mlagen_forward/_backward returns (the callback must not call back otherwise: see
 * mlagen_comm_ops). */
void mlagen_plan_destroy(mlagen_plan *plan);

/* Which calls use a tensor (mlagen_tensor_info.passes). */
#define MLAGEN_PASS_FORWARD 1
#define MLAGEN_PASS_BACKWARD 2

/* What one tensor of the op boundary must be. */
typedef struct mlagen_tensor_info {
  const char *name;  /* "q", "c_kv", "k_rope", "w_kv_b", "o", "do", "dq", "dc_kv",
                      * "dk_rope", "dw_kv_b" (static strings) */
  mlagen_dtype dtype;
  int ndim;
  int64_t dims[MLAGEN_MAX_DIMS]; /* dims[ndim..] are 0 */
  size_t bytes;      /* elements x element size */
  int is_output;     /* written by the call (1) or only read (0) */
  int passes;        /* MLAGEN_PASS_* bits: the calls that read or write it (0: unused
                      * by this form) */
} mlagen_tensor_info;

/* The sizes of a plan. workspace_bytes and saved_bytes are the two areas of the plan's
 * static memory layout (the CUDA executor allocates nothing: every intermediate buffer,
 * every step's scratch and cuBLAS's workspace has a fixed offset in one of them, each
 * offset and size a multiple of 256 bytes); the peaks and the communication are the
 * planner's figures (the ones `mlagen plan` prints). A CPU plan has the same layout in
 * host memory, without the 32 MiB GEMM slice (its BLAS allocates its own small scratch):
 * its workspace_bytes is the layout's alone, 0 when nothing lives there. */
typedef struct mlagen_sizes {
  /* bytes of device memory the caller passes as the workspace of mlagen_forward and of
   * mlagen_backward (the same size serves both; its contents need not survive between
   * calls): the high-water mark of the intermediate buffers that are not saved and of
   * the steps' scratch (a collective's send/receive staging, the attention backward's
   * row sums), each placed for the steps it is live; then 32 MiB for cuBLAS's workspace
   * (cublasSetWorkspace; NVIDIA's recommended size on Hopper, 4 MiB elsewhere: fixed here,
   * before the device is known), which every form's GEMMs use. The inputs, the outputs
   * and the saved area are not in it, so it is about max(peak_fwd_bytes, peak_bwd_bytes)
   * less the outputs and the saved buffers, plus 32 MiB and what the fixed layout loses
   * to alignment and fragmentation. */
  size_t workspace_bytes;
  /* bytes of device memory the caller passes as the saved area: written by the forward,
   * kept unchanged until the backward of the same step, which reads it. The sum of the
   * buffers written in the forward and read in the backward, each rounded up to 256
   * bytes (at least the planner's saved figure). */
  size_t saved_bytes;
  size_t peak_fwd_bytes;    /* the planner's peak of the forward: live buffers, saved
                             * buffers and outputs included, plus the step's staging */
  size_t peak_bwd_bytes;    /* the planner's peak of the backward (from the saved buffers) */
  size_t sent_fwd_bytes;    /* bytes this rank sends in the forward's collectives */
  size_t sent_bwd_bytes;    /* ... and in the backward's */
  /* The op boundary, this rank's sequence shard (S_l = S / P tokens; which tokens:
   * mlagen_plan_desc.sp_rank):
   * inputs   q [B, S_l, H, d_n + d_r] (RoPE part last), c_kv [B, S_l, d_c],
   *          k_rope [B, S_l, d_r], w_kv_b [H (d_n + d_v), d_c] (HF kv_b_proj.weight);
   *          do [B, S_l, H, d_v] (the backward's);
   * outputs  o [B, S_l, H, d_v]; dq, dc_kv, dk_rope like q, c_kv, k_rope; dw_kv_b like
   *          w_kv_b in the accumulator dtype (f32, f64 for f64 plans): this rank's
   *          partial sum (the full gradient is the sum over the SP group).
   * A varlen plan (mlagen_plan_desc.varlen; B = 1, S = T_cap) has the THD layout, the
   * same without the batch dim: q [S_l, H, d_n + d_r], c_kv [S_l, d_c], k_rope [S_l, d_r],
   * do and o [S_l, H, d_v], dq, dc_kv, dk_rope likewise; w_kv_b and dw_kv_b unchanged
   * (dw_kv_b sums over the valid tokens only). */
  mlagen_tensor_info q, c_kv, k_rope, w_kv_b, o, d_o, dq, dc_kv, dk_rope, dw_kv_b;
} mlagen_sizes;

/* Fills *sizes for plan. Needs no driver.
 * Errors: MLAGEN_EINVAL plan NULL or its context destroyed (message in
 * mlagen_last_message(NULL)); sizes NULL (message in the plan's context). */
int mlagen_plan_sizes(const mlagen_plan *plan, mlagen_sizes *sizes);

/* ---- running a plan ------------------------------------------------------------------ */

/* A tensor: device pointer and shape. Dense row-major; dims must equal the plan's
 * (mlagen_sizes) and dtype the plan's dtype for that tensor. */
typedef struct mlagen_tensor {
  void *data;
  mlagen_dtype dtype;
  int ndim;
  int64_t dims[MLAGEN_MAX_DIMS]; /* dims[ndim..] are ignored */
} mlagen_tensor;

/* The tensors of one layer on one rank (shapes in mlagen_sizes). A call reads and
 * checks the tensors of its pass (mlagen_tensor_info.passes) and ignores the others,
 * which may be zero-filled. No call works in place: a tensor the pass writes (o in the
 * forward; dq, dc_kv, dk_rope, dw_kv_b in the backward) must not share a byte with
 * another tensor of the pass, cu_seqlens, the workspace or the saved area (nor may the
 * workspace overlap the saved area or cu_seqlens, nor the forward's saved area
 * cu_seqlens); inputs may overlap each other. Refused, MLAGEN_EINVAL. */
typedef struct mlagen_tensors {
  mlagen_tensor q, c_kv, k_rope, w_kv_b; /* inputs */
  mlagen_tensor o;                       /* forward output */
  mlagen_tensor d_o;                     /* backward input: the gradient of o ("do") */
  mlagen_tensor dq, dc_kv, dk_rope, dw_kv_b; /* backward outputs */
  /* The documents of a varlen plan (mlagen_plan_desc.varlen), required there: int32, in
   * HOST memory (also for a CUDA plan), n_cu_seqlens = N + 1 >= 1 entries; every rank
   * passes the same, global array, and the backward the one its forward had. Document d
   * owns the tokens [cu_seqlens[d], cu_seqlens[d + 1]) of the stream: cu_seqlens[0] = 0,
   * non-decreasing (a zero-length document is valid), cu_seqlens[N] = T <= the plan's
   * seq (T_cap). Rows at positions >= T are slack: they attend to nothing and nothing
   * attends to them; their o, dq, dc_kv and dk_rope rows are written as 0, their input
   * values (NaN included) never reach another output, and dw_kv_b sums the valid tokens
   * only. Read on the host during the call only, so it may change once the call returns
   * (the CUDA executor compacts it into a staging copy of its own and queues the upload
   * into the workspace on the stream). Plans that are not varlen: NULL and 0. */
  const int32_t *cu_seqlens;
  int64_t n_cu_seqlens;
} mlagen_tensors;

/* The forward of plan: reads q, c_kv, k_rope, w_kv_b, writes o and the saved buffer
 * (saved_bytes >= mlagen_sizes.saved_bytes, kept unchanged by the caller until the
 * backward), using workspace (workspace_bytes >= mlagen_sizes.workspace_bytes). stream
 * is a CUstream (NULL: the default stream); the call is asynchronous to it.
 * Arguments are checked in this order, before anything is written (on any of these
 * errors no output, saved or workspace byte changes); the first failure is returned:
 *   MLAGEN_EINVAL     plan NULL or its context destroyed (message in
 *                     mlagen_last_message(NULL)); then, message in the context: tensors
 *                     NULL; a tensor of the pass with data NULL, a dtype other than the
 *                     plan's, an ndim or a dim other than the plan's, or data not aligned
 *                     to its element size ("tensors->q.dims[1] = 7, the plan expects 8
 *                     (q [2, 8, 4, 32])"); for a varlen plan, tensors->cu_seqlens NULL or
 *                     n_cu_seqlens < 1, or boundaries that break the rules of
 *                     mlagen_tensors.cu_seqlens, the message naming the first bad index
 *                     ("tensors->cu_seqlens[3] = 10 is below tensors->cu_seqlens[2] = 12
 *                     (boundaries must not decrease)", "tensors->cu_seqlens[0] = 1, the
 *                     first boundary must be 0", "tensors->cu_seqlens[5] = 9000 is past
 *                     the plan's token capacity 8192"); for a plan that is not varlen,
 *                     cu_seqlens not NULL or n_cu_seqlens not 0; workspace NULL (when
 *                     workspace_bytes is needed),
 *                     workspace_bytes too small, or workspace not 16-byte aligned; the
 *                     same for saved; memory the pass writes overlapping another buffer
 *                     of the call (mlagen_tensors: the message names both, "tensors->q
 *                     (0x..., 512 bytes) and tensors->dq (0x..., 512 bytes) overlap:
 *                     memory the pass writes (tensors->dq) must not ..."); a pass of the
 *                     plan already running (called from one of its collective
 *                     callbacks: mlagen_comm_ops).
 *   MLAGEN_ENODRIVER  no CUDA driver (libcuda.so.1 not found or not loadable, or cuInit failed).
 *   MLAGEN_EINVAL     sp_size > 1 and no communicator (mlagen_plan_set_comm, or
 *                     mlagen_plan_set_comm_ops).
 *   MLAGEN_EUNSUPPORTED  an f32 or f64 plan on MLAGEN_DEVICE_CUDA (make it for
 *                     MLAGEN_DEVICE_CPU).
 *   sp_size > 1 only, the communicator, wrapped for this call's stream:
 *   MLAGEN_ENONCCL    NCCL cannot be loaded: "libnccl.so.2 not found: <dlerror> ..." (or
 *                     the $MLAGEN_LIBNCCL file's name), or the library lacks an entry
 *                     point ("... lacks ncclSend ..."); the first attempt's outcome is
 *                     kept for the life of the process.
 *   MLAGEN_EIO        ncclCommCount or ncclCommUserRank failed ("NCCL ncclCommCount
 *                     failed: <ncclGetErrorString> (ncclResult_t N)").
 *   MLAGEN_EINVAL     the communicator's rank count or this process's rank in it differs
 *                     from the plan's sp_size or sp_rank (the message names all four).
 * The first call prepares the plan (kept with it until mlagen_plan_destroy): every kernel
 * it needs is generated, compiled by NVRTC for the current device (cached on disk, see
 * MLAGEN_CACHE_DIR) and loaded into the CUDA context current on the calling thread (or,
 * when none is, device 0's primary context, made current). Each kernel's configuration
 * (tiles, warps, stages) comes from the tuned store of the device (docs/tuning.md):
 * $MLAGEN_TUNED_DIR/<arch>/<device name>.json, else ./tuned/... relative to the process's
 * working directory (`cmake --install` puts the repository's stores under
 * <prefix>/share/mlagen/tuned: point MLAGEN_TUNED_DIR there), or, without an entry for
 * the kernel's shape and sequence bucket, the template's default; `mlagen plan --explain`
 * shows which. A first call compiles for seconds to minutes (a plan's kernels for its
 * device's arch); `mlagen compile --model M --sp P --arch <the GPU's> [--varlen]` run
 * before training with the same MLAGEN_CACHE_DIR compiles the kernels a plan runs with
 * the templates' defaults (--varlen: a packed plan's too), so that its first call finds
 * them in the cache (tuned ones, and laga-f's and laga-cp's head-group kernels at a
 * head_groups other than the default, are compiled then). cuBLAS is loaded then
 * (libcublas.so.13/.12/.11, or $MLAGEN_LIBCUBLAS) and works in its 32 MiB slice of the
 * workspace (cublasSetWorkspace). Errors of that step:
 *   MLAGEN_EDRIVER    cuBLAS not found or not usable ("cuBLAS not found ..."), a driver
 *                     call failed (the message names it and the CUDA error);
 *   MLAGEN_ECOMPILE, MLAGEN_ETEMPLATE  a kernel failed to generate or compile (the log).
 * Then the pass is queued on stream; an error of a queued call (a launch, a copy, a
 * cuBLAS GEMM) is returned as MLAGEN_EDRIVER (MLAGEN_ENOMEM for out-of-memory), its
 * message naming the plan step and the call. Faults inside kernels show at the caller's
 * next synchronization, as with any CUDA launch. At sp_size > 1 the collectives are
 * queued on stream with NCCL (a failed call: MLAGEN_EIO with NCCL's text, naming the step)
 * and the call then waits for the pass to finish on stream, by default at most 600 s,
 * polling ncclCommGetAsyncError: an asynchronous NCCL error (a peer that died) is returned
 * as MLAGEN_EIO with NCCL's text, and a pass still running after the wait time (600 s by
 * default) as MLAGEN_EIO "timed out ..." (a peer that never joined a collective), instead
 * of hanging (mlagen_plan_set_comm_wait sets the time, or 0: return once queued, no wait).
 * With the trainer's callbacks (mlagen_plan_set_comm_ops) instead of NCCL: a callback's
 * nonzero return is MLAGEN_EIO "the caller's all_gather callback returned N ...", naming
 * the plan step; on CUDA plans the wait applies as with NCCL, with nothing to poll (only
 * its time limit).
 *
 * A CPU plan (MLAGEN_DEVICE_CPU): the same arguments and checks (host pointers), no driver
 * loaded, nothing prepared; the pass runs on the calling thread and is complete when the
 * call returns (stream is ignored). sp_size > 1 needs mlagen_plan_set_comm_ops (an NCCL
 * communicator is refused: MLAGEN_EINVAL); the callbacks are called in plan order on this
 * thread. Errors after the checks: MLAGEN_EUNSUPPORTED a GEMM dimension beyond int or an
 * attention row beyond the CPU kernels' limit; a callback's MLAGEN_EIO as above. */
int mlagen_forward(mlagen_plan *plan, const mlagen_tensors *tensors, void *workspace,
                   size_t workspace_bytes, void *saved, size_t saved_bytes, void *stream);

/* The backward of plan, after its forward with the same saved buffer: reads do, the
 * saved buffer and the inputs the form's backward reads, writes dq, dc_kv, dk_rope and
 * dw_kv_b. Arguments and errors as mlagen_forward (the tensors checked are the
 * backward's). */
int mlagen_backward(mlagen_plan *plan, const mlagen_tensors *tensors, void *workspace,
                    size_t workspace_bytes, void *saved, size_t saved_bytes, void *stream);

/* Gives plan the trainer's NCCL communicator (an ncclComm_t spanning the plan's sp_size
 * ranks, this process being sp_rank) for the collectives of mlagen_forward and
 * mlagen_backward, which run them on the call's stream. The communicator stays the
 * caller's and must outlive the plan's use of it. A plan of sp_size 1 needs none (NULL
 * clears it). The communicator is only stored here: NCCL is loaded, and the
 * communicator's size and rank checked against the plan's sp_size and sp_rank, by
 * mlagen_forward and mlagen_backward (their errors). Errors: MLAGEN_EINVAL plan NULL or
 * its context destroyed (message in mlagen_last_message(NULL)), nccl_comm NULL for a plan
 * of sp_size > 1, a pass of the plan running (a callback calling back: mlagen_comm_ops). */
int mlagen_plan_set_comm(mlagen_plan *plan, void *nccl_comm);

/* A communicator of the trainer's own, as three collectives over the plan's sp_size
 * ranks (gloo, MPI, a test double, or NCCL through the trainer's framework). Every rank
 * of the group calls the same collectives in the same order with the same count and
 * dtype. Buffers are host pointers for a CPU plan, device pointers for a CUDA plan;
 * count is elements per rank; stream is the mlagen_forward/_backward call's (NULL for a
 * CPU plan):
 *   all_to_all     send [size][count] -> recv [size][count]: block p of send goes to
 *                  rank p, block p of recv comes from rank p
 *   all_gather     send [count] -> recv [size][count]: block p is rank p's send
 *   reduce_scatter send [size][count] -> recv [count]: the sum over ranks of their block
 *                  `rank` (f32 and f64 summed in their type; bf16/f16 best summed in f32
 *                  and rounded once, as NCCL does)
 * send and recv do not overlap. A callback returns 0 when recv holds the result (on a
 * CUDA plan: when the collective is queued on stream, or done), nonzero on failure; the
 * pass then stops with MLAGEN_EIO. A callback must return: mlagen cannot interrupt it, so
 * a blocking implementation needs a timeout of its own (torch.distributed's group
 * timeout, for one) for a peer that died to become an error instead of a hang.
 * A callback must not call back into the API for the plan whose pass called it:
 * mlagen_plan_set_comm_ops, mlagen_plan_set_comm, mlagen_plan_set_comm_wait,
 * mlagen_forward and mlagen_backward on it are refused (MLAGEN_EINVAL "the plan is running
 * a pass ...": they would change or free what the pass is using), and mlagen_plan_destroy
 * is deferred to the pass's return, as is the freeing of the plan's context by
 * mlagen_context_destroy. */
typedef struct mlagen_comm_ops {
  int size; /* ranks in the group: the plan's sp_size */
  int rank; /* this process's rank in it: the plan's sp_rank */
  void *user; /* passed to every callback, the caller's */
  int (*all_to_all)(void *user, const void *send, void *recv, size_t count,
                    mlagen_dtype dtype, void *stream);
  int (*all_gather)(void *user, const void *send, void *recv, size_t count,
                    mlagen_dtype dtype, void *stream);
  int (*reduce_scatter)(void *user, const void *send, void *recv, size_t count,
                        mlagen_dtype dtype, void *stream);
} mlagen_comm_ops;

/* Gives plan the trainer's collectives (*ops is copied; ops->user must stay valid while
 * the plan uses it). It replaces an NCCL communicator set before (and
 * mlagen_plan_set_comm replaces it); ops NULL clears it. Errors: MLAGEN_EINVAL plan NULL
 * or its context destroyed (message in mlagen_last_message(NULL)); a callback NULL;
 * ops->size or ops->rank other than the plan's sp_size and sp_rank (the message names
 * all four); a pass of the plan running (a callback calling back: mlagen_comm_ops);
 * MLAGEN_ENOMEM. */
int mlagen_plan_set_comm_ops(mlagen_plan *plan, const mlagen_comm_ops *ops);

/* How long mlagen_forward and mlagen_backward of a CUDA plan with sp_size > 1 wait for the
 * pass they queued, in seconds.
 *   seconds > 0 (the default is 600): the call returns when the pass has finished on its
 *     stream, polling the NCCL communicator's asynchronous error (ncclCommGetAsyncError)
 *     meanwhile (with mlagen_plan_set_comm_ops's callbacks there is nothing to poll), so a
 *     peer that died is MLAGEN_EIO with NCCL's text and a pass still running after
 *     `seconds` is MLAGEN_EIO "timed out ..." (a peer that never joined a collective),
 *     instead of a hang. The host waits for the GPU once per pass. A time shorter than a
 *     pass fails every pass as timed out (the GPU finishes it all the same).
 *   seconds = 0: the call returns once the pass is queued, asynchronous to its stream as
 *     at sp_size 1 and as NCCL's own collectives are: the host runs ahead of the GPU (a
 *     trainer that launches its layers from Python needs that to hide its launch time).
 *     A peer's failure then shows where the trainer's own watchdog looks (the NCCL
 *     timeout of a torch.distributed group, for one), not in this call.
 * The setting is read at each call; the PyTorch package (python/mlagen) sets 0 on its CUDA
 * plans. CPU plans complete when the call returns whatever it is (kept, unused).
 * Errors: MLAGEN_EINVAL plan NULL or its context destroyed (message in
 * mlagen_last_message(NULL)); seconds negative, not a number or above 1e6 (about 11.6
 * days); a pass of the plan running (a callback calling back: mlagen_comm_ops). */
int mlagen_plan_set_comm_wait(mlagen_plan *plan, double seconds);

/* The generated kernels a CUDA plan runs, as its first mlagen_forward or mlagen_backward
 * prepared them: *count (when not NULL) gets how many (0 before that first call, and for
 * a CPU plan); for 0 <= i < *count, *name gets kernel i's symbol
 * ("mla_attn_fwd_sm90_h16_dn128_..._kpacked") and *config which configuration it runs and
 * why, in `mlagen plan --explain`'s words ("tuned: <store> entry attn_fwd causal bucket
 * 4096 (block_m=64 ...), p50 0.456 ms, ..." or "default: no tuned store for sm_90a/<device>
 * (<file>)", with the arch family's refusal when a portable one runs instead). Both strings
 * belong to the plan (valid until mlagen_plan_destroy); either pointer may be NULL, and
 * with both NULL i is not read. For a trainer to log or check the configurations in use
 * (docs/tuning.md). Errors: MLAGEN_EINVAL plan NULL or its context destroyed (message in
 * mlagen_last_message(NULL)); i outside [0, *count) when name or config is given. */
int mlagen_plan_kernel(const mlagen_plan *plan, int i, int *count, const char **name,
                       const char **config);

/* ---- the device --------------------------------------------------------------------- */

typedef struct mlagen_device_info {
  int driver_version; /* cuDriverGetVersion: 1000 major + 10 minor (13000 = CUDA 13.0) */
  int device_count;
  char name[256];     /* of device `device` */
  int cc_major, cc_minor; /* compute capability */
  int sm_count;
} mlagen_device_info;

/* Loads the driver (once per process) and describes device `device` (an ordinal).
 * Errors: MLAGEN_EINVAL ctx (message in mlagen_last_message(NULL)) or info NULL, device
 * < 0 or >= the device count; MLAGEN_ENODRIVER no driver (the message says why: "no CUDA
 * driver: libcuda.so.1 not found or not loadable (dlopen: ...)", or the CUDA error of
 * cuInit), or a driver query failed (names the CUDA error). The environment variable
 * MLAGEN_LIBCUDA, read at that first load, replaces the library path (a test seam). */
int mlagen_get_device_info(mlagen_context *ctx, int device, mlagen_device_info *info);

#ifdef __cplusplus
}
#endif
#endif /* MLAGEN_H */
