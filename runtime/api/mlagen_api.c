/* mlagen_api.c: the embedding API of include/mlagen.h over the config reader, the plans
 * and the driver loader.
 *
 * Contexts register themselves in a process-wide list (a mutex guards it) under a unique
 * 64-bit id; a plan keeps its context's pointer and id and reaches the context only
 * after finding the id in that list, so a plan whose context was destroyed is refused
 * without touching freed memory. Messages go to the context's mg_diag, or to a per-thread
 * slot when no live context is at hand. */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mg_comm.h"
#include "mg_comm_user.h"
#include "mg_config.h"
#include "mg_cpu_exec.h"
#include "mg_diag.h"
#include "mg_cuda_exec.h"
#include "mg_driver.h"
#include "mg_plan.h"
#include "mg_plan_mem.h"
#include "mg_varlen.h"
#include "mlagen.h"

struct mlagen_context {
  uint64_t id;          /* unique for the life of the process */
  mlagen_context *next; /* the registry's list */
  mg_diag diag;         /* the last call's message */
  int passes;           /* passes of its plans running on this thread (a callback's nesting) */
  int destroy_pending;  /* destroyed from a callback: freed when the last pass returns */
};

struct mlagen_model {
  mg_shape shape;
};

/* mlagen_plan_set_comm_wait's default (mlagen.h) */
#define MLAGEN_DEFAULT_COMM_WAIT_S 600.0

struct mlagen_plan {
  mlagen_context *ctx; /* dereferenced only while ctx_id is registered */
  uint64_t ctx_id;
  mg_plan plan;
  mlagen_sizes sizes;
  /* the CUDA executor, prepared by the first mlagen_forward/_backward (NULL before) */
  mg_dev_ops *ops;
  mg_cuda_exec *exec;
  void *nccl_comm; /* mlagen_plan_set_comm: the trainer's ncclComm_t (sp_size > 1) */
  mg_comm *comm;   /* nccl_comm wrapped and checked against the plan at its first use */
  mg_comm *user_comm; /* mlagen_plan_set_comm_ops: the trainer's callbacks (or NULL) */
  mlagen_device device;
  double wait_s;   /* mlagen_plan_set_comm_wait: sp_size > 1 CUDA passes (0: no wait) */
  mg_plan_mem mem; /* MLAGEN_DEVICE_CPU: the layout of workspace and saved */
  /* a pass (mlagen_forward/_backward) is running: a callback that calls back into the API
   * for this plan is refused (set_comm, set_comm_ops, set_comm_wait), or deferred (destroy)
   * to its end */
  int busy, destroy_pending;
};

/* The refusal of a call that would change plan's communicator under a running pass. */
static int refuse_busy(mlagen_context *ctx, const char *fn) {
  return mg_diag_set(&ctx->diag, MLAGEN_EINVAL, "%s: the plan is running a pass "
                     "(mlagen_forward/_backward): a collective callback must not call back "
                     "into the API for its own plan", fn);
}

/* ---- messages ------------------------------------------------------------------------ */

static _Thread_local char tls_msg[512];

__attribute__((format(printf, 2, 3)))
static int tls_fail(int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tls_msg, sizeof tls_msg, fmt, ap);
  va_end(ap);
  return status;
}

const char *mlagen_last_message(const mlagen_context *ctx) {
  return ctx ? mg_diag_msg(&ctx->diag) : tls_msg;
}

/* ---- the registry of live contexts --------------------------------------------------- */

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static mlagen_context *registry;
static uint64_t next_id = 1;

/* The plan's context if it is still alive, else NULL (message in the thread's slot). */
static mlagen_context *plan_context(const mlagen_plan *p, const char *fn) {
  mlagen_context *found = NULL;
  pthread_mutex_lock(&registry_lock);
  for (mlagen_context *c = registry; c; c = c->next)
    if (c->id == p->ctx_id) found = c;
  pthread_mutex_unlock(&registry_lock);
  if (!found)
    tls_fail(MLAGEN_EINVAL, "%s: plan: its context was destroyed (mlagen_context_destroy); "
             "only mlagen_plan_destroy accepts it now", fn);
  return found;
}

int mlagen_context_create(mlagen_context **ctx) {
  if (!ctx) return tls_fail(MLAGEN_EINVAL, "mlagen_context_create: ctx is NULL");
  *ctx = NULL;
  mlagen_context *c = calloc(1, sizeof *c);
  if (!c) return tls_fail(MLAGEN_ENOMEM, "mlagen_context_create: out of memory");
  pthread_mutex_lock(&registry_lock);
  c->id = next_id++;
  c->next = registry;
  registry = c;
  pthread_mutex_unlock(&registry_lock);
  *ctx = c;
  return 0;
}

void mlagen_context_destroy(mlagen_context *ctx) {
  if (!ctx) return;
  pthread_mutex_lock(&registry_lock);
  for (mlagen_context **pp = &registry; *pp; pp = &(*pp)->next)
    if (*pp == ctx) {
      *pp = ctx->next;
      break;
    }
  pthread_mutex_unlock(&registry_lock);
  if (ctx->passes) { /* from a collective callback: the pass still writes its message here */
    ctx->destroy_pending = 1;
    return;
  }
  mg_diag_clear(&ctx->diag);
  free(ctx);
}

/* ---- models -------------------------------------------------------------------------- */

int mlagen_model_from_config(mlagen_context *ctx, const char *config, mlagen_model **model) {
  if (!ctx) return tls_fail(MLAGEN_EINVAL, "mlagen_model_from_config: ctx is NULL");
  mg_diag_clear(&ctx->diag);
  if (model) *model = NULL;
  if (!model)
    return mg_diag_set(&ctx->diag, MLAGEN_EINVAL, "mlagen_model_from_config: model is NULL");
  if (!config || !*config)
    return mg_diag_set(&ctx->diag, MLAGEN_EINVAL,
                       "mlagen_model_from_config: config is %s; give a config.json path or a "
                       "shipped name (deepseek-v3, deepseek-v2-lite, kimi-k2)",
                       config ? "\"\"" : "NULL");
  mlagen_model *m = calloc(1, sizeof *m);
  if (!m) return mg_diag_set(&ctx->diag, MLAGEN_ENOMEM, "mlagen_model_from_config: out of memory");
  int rc = mg_config_load(config, &m->shape, &ctx->diag);
  if (rc) {
    free(m);
    return rc;
  }
  *model = m;
  return 0;
}

int mlagen_model_from_desc(mlagen_context *ctx, const mlagen_model_desc *desc,
                           mlagen_model **model) {
  if (!ctx) return tls_fail(MLAGEN_EINVAL, "mlagen_model_from_desc: ctx is NULL");
  mg_diag_clear(&ctx->diag);
  if (model) *model = NULL;
  if (!model)
    return mg_diag_set(&ctx->diag, MLAGEN_EINVAL, "mlagen_model_from_desc: model is NULL");
  if (!desc)
    return mg_diag_set(&ctx->diag, MLAGEN_EINVAL, "mlagen_model_from_desc: desc is NULL");
  mg_shape s;
  memset(&s, 0, sizeof s);
  snprintf(s.source, sizeof s.source, "mlagen_model_desc");
  s.heads = desc->num_attention_heads;
  s.kv_lora_rank = desc->kv_lora_rank;
  s.qk_rope_head_dim = desc->qk_rope_head_dim;
  s.qk_nope_head_dim = desc->qk_nope_head_dim;
  s.v_head_dim = desc->v_head_dim;
  int rc = mg_shape_validate(&s, "mlagen_model_desc", &ctx->diag);
  if (rc) /* a bad field is a bad argument here, not a bad config file */
    return rc == MLAGEN_ECONFIG ? (ctx->diag.status = MLAGEN_EINVAL) : rc;
  double scale = desc->softmax_scale;
  if (!(scale >= 0) || !isfinite(scale))
    return mg_diag_set(&ctx->diag, MLAGEN_EINVAL,
                       "mlagen_model_desc: softmax_scale = %g: expected > 0, or 0 for "
                       "1 / sqrt(qk_nope_head_dim + qk_rope_head_dim)", scale);
  s.rope_factor = 1;
  s.mscale = 1;
  s.softmax_scale =
      scale > 0 ? scale : 1.0 / sqrt((double)s.qk_nope_head_dim + s.qk_rope_head_dim);
  mlagen_model *m = malloc(sizeof *m);
  if (!m) return mg_diag_set(&ctx->diag, MLAGEN_ENOMEM, "mlagen_model_from_desc: out of memory");
  m->shape = s;
  *model = m;
  return 0;
}

int mlagen_model_get_desc(const mlagen_model *model, mlagen_model_desc *desc) {
  if (!model) return tls_fail(MLAGEN_EINVAL, "mlagen_model_get_desc: model is NULL");
  if (!desc) return tls_fail(MLAGEN_EINVAL, "mlagen_model_get_desc: desc is NULL");
  const mg_shape *s = &model->shape;
  desc->num_attention_heads = s->heads;
  desc->kv_lora_rank = s->kv_lora_rank;
  desc->qk_rope_head_dim = s->qk_rope_head_dim;
  desc->qk_nope_head_dim = s->qk_nope_head_dim;
  desc->v_head_dim = s->v_head_dim;
  desc->softmax_scale = s->softmax_scale;
  return 0;
}

void mlagen_model_destroy(mlagen_model *model) { free(model); }

/* ---- plans --------------------------------------------------------------------------- */

static int form_from_api(mlagen_form f, mg_form *out) {
  switch (f) {
    case MLAGEN_FORM_EXPLICIT: *out = MG_FORM_EXPLICIT; return 0;
    case MLAGEN_FORM_ABSORBED: *out = MG_FORM_ABSORBED; return 0;
    case MLAGEN_FORM_LAGA: *out = MG_FORM_LAGA; return 0;
    case MLAGEN_FORM_LAGA_R: *out = MG_FORM_LAGA_R; return 0;
    case MLAGEN_FORM_LAGA_F: *out = MG_FORM_LAGA_F; return 0;
    case MLAGEN_FORM_LAGA_CP: *out = MG_FORM_LAGA_CP; return 0;
  }
  return -1;
}

int mlagen_token_position(const mlagen_plan_desc *desc, int64_t i, int64_t *pos) {
  mg_form f;
  if (!desc || !pos)
    return tls_fail(MLAGEN_EINVAL, "mlagen_token_position: %s is NULL", desc ? "pos" : "plan_desc");
  if (form_from_api(desc->form, &f))
    return tls_fail(MLAGEN_EINVAL, "mlagen_token_position: plan_desc->form = %d is not an "
                    "mlagen_form", (int)desc->form);
  if (desc->sp_size < 1 || desc->sp_rank < 0 || desc->sp_rank >= desc->sp_size)
    return tls_fail(MLAGEN_EINVAL, "mlagen_token_position: plan_desc->sp_rank = %d, sp_size = "
                    "%d: need 0 <= sp_rank < sp_size", desc->sp_rank, desc->sp_size);
  if (desc->seq < 1 || desc->seq % desc->sp_size)
    return tls_fail(MLAGEN_EINVAL, "mlagen_token_position: plan_desc->seq = %lld is not a "
                    "positive multiple of sp_size = %d", (long long)desc->seq, desc->sp_size);
  const int64_t Sl = desc->seq / desc->sp_size;
  if (i < 0 || i >= Sl)
    return tls_fail(MLAGEN_EINVAL, "mlagen_token_position: row %lld is outside [0, seq / "
                    "sp_size = %lld)", (long long)i, (long long)Sl);
  *pos = mg_form_token_pos(f, desc->sp_size, Sl, desc->sp_rank, i);
  return 0;
}

static int dtype_from_api(mlagen_dtype t, mg_dtype *out) {
  switch (t) {
    case MLAGEN_DTYPE_BF16: *out = MG_BF16; return 0;
    case MLAGEN_DTYPE_F16: *out = MG_F16; return 0;
    case MLAGEN_DTYPE_F32: *out = MG_F32; return 0;
    case MLAGEN_DTYPE_F64: *out = MG_F64; return 0;
  }
  return -1;
}

/* mg_dtype_name of t; NULL when t is not an mlagen_dtype. */
static const char *api_dtype_name(mlagen_dtype t) {
  mg_dtype m;
  return dtype_from_api(t, &m) ? NULL : mg_dtype_name(m);
}

/* The op boundary: the plan's buffer name, the field of mlagen_tensors and of
 * mlagen_sizes. */
static const struct slot {
  const char *name;  /* in the plan and in mlagen_tensor_info.name */
  const char *field; /* in messages: tensors-><field> */
  size_t t_off, i_off;
  int tokens; /* 1: [B, S_l, ...] token rows (THD in a varlen plan: the batch dim dropped) */
} slots[] = {
#define SLOT(name, field, tokens) \
  {name, #field, offsetof(mlagen_tensors, field), offsetof(mlagen_sizes, field), tokens}
    SLOT("q", q, 1),         SLOT("c_kv", c_kv, 1),   SLOT("k_rope", k_rope, 1),
    SLOT("w_kv_b", w_kv_b, 0), SLOT("o", o, 1),       SLOT("do", d_o, 1),
    SLOT("dq", dq, 1),       SLOT("dc_kv", dc_kv, 1), SLOT("dk_rope", dk_rope, 1),
    SLOT("dw_kv_b", dw_kv_b, 0),
#undef SLOT
};
#define N_SLOTS (sizeof slots / sizeof slots[0])

static mlagen_tensor_info *slot_info(mlagen_sizes *s, size_t i) {
  return (mlagen_tensor_info *)((char *)s + slots[i].i_off);
}

/* The sizes: the workspace and the saved area the CUDA executor lays the plan out in
 * (mg_cuda_exec_mem_layout: the plan's static memory layout and cuBLAS's workspace), the
 * peaks and the communication from the planner, the tensors from the plan's buffers.
 * Errors: those of mg_plan_mem_layout (MLAGEN_EINVAL, not expected of a built plan). */
static int plan_sizes(const mg_plan *p, mlagen_device device, mg_plan_mem *cpu_mem,
                      mlagen_sizes *z, mg_diag *diag) {
  mg_plan_cost c;
  mg_plan_cost_of(p, &c);
  memset(z, 0, sizeof *z);
  mg_plan_mem gpu_mem; /* ~7 KiB */
  mg_plan_mem *mem_ptr = device == MLAGEN_DEVICE_CPU ? cpu_mem : &gpu_mem;
  int64_t blas_offset;
  int rc = device == MLAGEN_DEVICE_CPU /* the same layout, no cuBLAS slice */
               ? mg_plan_mem_layout(p, MG_CUDA_EXEC_ALIGN, cpu_mem, diag)
               : mg_cuda_exec_mem_layout(p, &gpu_mem, &blas_offset, diag);
  if (rc) return rc;
  const mg_plan_mem mem = *mem_ptr;
  z->peak_fwd_bytes = (size_t)c.peak_fwd;
  z->peak_bwd_bytes = (size_t)c.peak_bwd;
  z->workspace_bytes = (size_t)mem.workspace_bytes;
  z->saved_bytes = (size_t)mem.saved_bytes;
  z->sent_fwd_bytes = (size_t)c.sent_fwd;
  z->sent_bwd_bytes = (size_t)c.sent_bwd;
  for (size_t i = 0; i < N_SLOTS; i++) {
    mlagen_tensor_info *t = slot_info(z, i);
    t->name = slots[i].name;
    int b = mg_plan_find(p, slots[i].name);
    if (b < 0) continue; /* not at this form's boundary: passes 0 */
    const mg_plan_buf *pb = &p->bufs[b];
    t->dtype = mg_dtype_to_api(pb->dtype);
    /* a varlen plan's token tensors are THD: its batch dim (1) dropped, same memory */
    const int drop = p->args.varlen && slots[i].tokens && pb->ndim > 2 && pb->dims[0] == 1;
    t->ndim = pb->ndim - drop;
    for (int d = 0; d < t->ndim; d++) t->dims[d] = pb->dims[d + drop];
    t->bytes = (size_t)mg_plan_buf_bytes(pb);
    t->is_output = pb->role == MG_BUF_OUTPUT;
    for (int k = 0; k < p->n_steps; k++) {
      const mg_step *st = &p->steps[k];
      int used = 0;
      for (int j = 0; j < st->n_in; j++) used |= st->in[j] == b;
      for (int j = 0; j < st->n_out; j++) used |= st->out[j] == b;
      if (used) t->passes |= st->pass == MG_FWD ? MLAGEN_PASS_FORWARD : MLAGEN_PASS_BACKWARD;
    }
  }
  return 0;
}

int mlagen_plan_create(mlagen_context *ctx, const mlagen_model *model,
                       const mlagen_plan_desc *desc, mlagen_plan **plan) {
  if (!ctx) return tls_fail(MLAGEN_EINVAL, "mlagen_plan_create: ctx is NULL");
  mg_diag *d = &ctx->diag;
  mg_diag_clear(d);
  if (plan) *plan = NULL;
  if (!plan) return mg_diag_set(d, MLAGEN_EINVAL, "mlagen_plan_create: plan is NULL");
  if (!model) return mg_diag_set(d, MLAGEN_EINVAL, "mlagen_plan_create: model is NULL");
  if (!desc) return mg_diag_set(d, MLAGEN_EINVAL, "mlagen_plan_create: plan_desc is NULL");
  mg_form form;
  mg_dtype dtype;
  if (form_from_api(desc->form, &form))
    return mg_diag_set(d, MLAGEN_EINVAL, "mlagen_plan_create: plan_desc->form = %d is not an "
                       "mlagen_form (MLAGEN_FORM_EXPLICIT, _ABSORBED, _LAGA, _LAGA_R, _LAGA_F, "
                       "_LAGA_CP)",
                       (int)desc->form);
  if (dtype_from_api(desc->dtype, &dtype))
    return mg_diag_set(d, MLAGEN_EINVAL, "mlagen_plan_create: plan_desc->dtype = %d is not an "
                       "mlagen_dtype (MLAGEN_DTYPE_BF16, _F16, _F32, _F64)", (int)desc->dtype);
  if (desc->device != MLAGEN_DEVICE_CUDA && desc->device != MLAGEN_DEVICE_CPU)
    return mg_diag_set(d, MLAGEN_EINVAL, "mlagen_plan_create: plan_desc->device = %d is not an "
                       "mlagen_device (MLAGEN_DEVICE_CUDA, MLAGEN_DEVICE_CPU)", (int)desc->device);
  if (desc->device == MLAGEN_DEVICE_CPU && dtype != MG_F32 && dtype != MG_F64)
    return mg_diag_set(d, MLAGEN_EUNSUPPORTED, "mlagen_plan_create: plan_desc->dtype is %s: the "
                       "CPU device (MLAGEN_DEVICE_CPU) runs f32 and f64 plans",
                       mg_dtype_name(dtype));
  /* the plan's argument rules (mg_plan_args_check), in the words of mlagen_plan_desc */
  static const mg_plan_arg_names names = {
      .fn = "mlagen_plan_create", .sp = "plan_desc->sp_size", .rank = "plan_desc->sp_rank",
      .batch = "plan_desc->batch", .seq = "plan_desc->seq", .head_groups = "plan_desc->head_groups",
      .laga_f = "MLAGEN_FORM_LAGA_F", .laga_cp = "MLAGEN_FORM_LAGA_CP"};
  mg_plan_args a = {.shape = &model->shape, .form = form, .sp = desc->sp_size,
                    .rank = desc->sp_rank, .batch = desc->batch, .seq = desc->seq,
                    .causal = desc->causal != 0, .dtype = dtype, .head_groups = desc->head_groups,
                    .varlen = desc->varlen != 0};
  int rc = mg_plan_args_check(&a, &names, d);
  if (rc) return rc;
  mlagen_plan *p = calloc(1, sizeof *p);
  if (!p) return mg_diag_set(d, MLAGEN_ENOMEM, "mlagen_plan_create: out of memory");
  rc = mg_plan_build(&p->plan, &a, d);
  if (rc) {
    mg_diag_prefix(d, "mlagen_plan_create");
    free(p);
    return rc;
  }
  p->device = desc->device;
  p->wait_s = MLAGEN_DEFAULT_COMM_WAIT_S;
  if ((rc = plan_sizes(&p->plan, p->device, &p->mem, &p->sizes, d))) {
    mg_diag_prefix(d, "mlagen_plan_create");
    free(p);
    return rc;
  }
  p->ctx = ctx;
  p->ctx_id = ctx->id;
  *plan = p;
  return 0;
}

void mlagen_plan_destroy(mlagen_plan *plan) {
  if (!plan) return;
  if (plan->busy) { /* called from a callback of the running pass: done when it returns */
    plan->destroy_pending = 1;
    return;
  }
  mg_comm_destroy(plan->comm);
  mg_comm_destroy(plan->user_comm);
  mg_cuda_exec_destroy(plan->exec);
  mg_dev_ops_destroy(plan->ops); /* unloads the plan's modules */
  free(plan);
}

int mlagen_plan_set_comm(mlagen_plan *plan, void *nccl_comm) {
  if (!plan) return tls_fail(MLAGEN_EINVAL, "mlagen_plan_set_comm: plan is NULL");
  mlagen_context *ctx = plan_context(plan, "mlagen_plan_set_comm");
  if (!ctx) return MLAGEN_EINVAL;
  mg_diag_clear(&ctx->diag);
  if (plan->busy) return refuse_busy(ctx, "mlagen_plan_set_comm");
  if (!nccl_comm && plan->plan.args.sp > 1)
    return mg_diag_set(&ctx->diag, MLAGEN_EINVAL, "mlagen_plan_set_comm: nccl_comm is NULL and "
                       "the plan spans sp_size = %d ranks", plan->plan.args.sp);
  if (nccl_comm != plan->nccl_comm) { /* wrapped again at the next call */
    mg_comm_destroy(plan->comm);
    plan->comm = NULL;
  }
  plan->nccl_comm = nccl_comm;
  mg_comm_destroy(plan->user_comm); /* the NCCL communicator replaces the callbacks */
  plan->user_comm = NULL;
  return 0;
}

int mlagen_plan_set_comm_ops(mlagen_plan *plan, const mlagen_comm_ops *ops) {
  if (!plan) return tls_fail(MLAGEN_EINVAL, "mlagen_plan_set_comm_ops: plan is NULL");
  mlagen_context *ctx = plan_context(plan, "mlagen_plan_set_comm_ops");
  if (!ctx) return MLAGEN_EINVAL;
  mg_diag *d = &ctx->diag;
  mg_diag_clear(d);
  if (plan->busy) return refuse_busy(ctx, "mlagen_plan_set_comm_ops");
  const mg_plan_args *a = &plan->plan.args;
  if (ops && (ops->size != a->sp || ops->rank != a->rank))
    return mg_diag_set(d, MLAGEN_EINVAL, "mlagen_plan_set_comm_ops: comm_ops has size = %d and "
                       "rank = %d; the plan is for sp_rank = %d of sp_size = %d", ops->size,
                       ops->rank, a->rank, a->sp);
  mg_comm *comm = NULL;
  if (ops && mg_comm_user_wrap(&comm, ops, d))
    return mg_diag_prefix(d, "mlagen_plan_set_comm_ops");
  mg_comm_destroy(plan->user_comm);
  plan->user_comm = comm;
  if (comm) { /* the callbacks replace an NCCL communicator */
    mg_comm_destroy(plan->comm);
    plan->comm = NULL;
    plan->nccl_comm = NULL;
  }
  return 0;
}

int mlagen_plan_set_comm_wait(mlagen_plan *plan, double seconds) {
  if (!plan) return tls_fail(MLAGEN_EINVAL, "mlagen_plan_set_comm_wait: plan is NULL");
  mlagen_context *ctx = plan_context(plan, "mlagen_plan_set_comm_wait");
  if (!ctx) return MLAGEN_EINVAL;
  mg_diag_clear(&ctx->diag);
  if (plan->busy) return refuse_busy(ctx, "mlagen_plan_set_comm_wait");
  if (!(seconds >= 0 && seconds <= 1e6)) /* NaN fails both */
    return mg_diag_set(&ctx->diag, MLAGEN_EINVAL, "mlagen_plan_set_comm_wait: seconds = %g: "
                       "give 0 (do not wait) or a time in seconds up to 1e6", seconds);
  plan->wait_s = seconds;
  return 0;
}

int mlagen_plan_kernel(const mlagen_plan *plan, int i, int *count, const char **name,
                       const char **config) {
  if (!plan) return tls_fail(MLAGEN_EINVAL, "mlagen_plan_kernel: plan is NULL");
  mlagen_context *ctx = plan_context(plan, "mlagen_plan_kernel");
  if (!ctx) return MLAGEN_EINVAL;
  mg_diag_clear(&ctx->diag);
  const int n = mg_cuda_exec_kernel_info(plan->exec, 0, NULL, NULL); /* 0 before prepare */
  if (count) *count = n;
  if (!name && !config) return 0;
  if (i < 0 || i >= n)
    return mg_diag_set(&ctx->diag, MLAGEN_EINVAL, "mlagen_plan_kernel: i = %d, the plan runs %d "
                       "kernels%s", i, n, n ? "" : plan->device == MLAGEN_DEVICE_CPU
                                                      ? " (a CPU plan runs no generated kernel)"
                                                      : " (not prepared yet: its first "
                                                        "mlagen_forward or mlagen_backward "
                                                        "prepares it)");
  const char *nm = NULL, *why = NULL;
  mg_cuda_exec_kernel_info(plan->exec, i, &nm, &why);
  if (name) *name = nm;
  if (config) *config = why;
  return 0;
}

int mlagen_plan_sizes(const mlagen_plan *plan, mlagen_sizes *sizes) {
  if (!plan) return tls_fail(MLAGEN_EINVAL, "mlagen_plan_sizes: plan is NULL");
  mlagen_context *ctx = plan_context(plan, "mlagen_plan_sizes");
  if (!ctx) return MLAGEN_EINVAL;
  mg_diag_clear(&ctx->diag);
  if (!sizes) return mg_diag_set(&ctx->diag, MLAGEN_EINVAL, "mlagen_plan_sizes: sizes is NULL");
  *sizes = plan->sizes;
  return 0;
}

/* ---- running ------------------------------------------------------------------------- */

static void shape_words(const mlagen_tensor_info *t, char *buf, size_t n) {
  size_t at = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < t->ndim && at < n; i++)
    at += (size_t)snprintf(buf + at, n - at, "%s%lld", i ? ", " : "", (long long)t->dims[i]);
  if (at < n) snprintf(buf + at, n - at, "]");
}

/* One tensor of the pass against the plan. */
static int check_tensor(const mlagen_tensor *t, const mlagen_tensor_info *want, const char *field,
                        const char *fn, mg_diag *d) {
  char shape[96];
  shape_words(want, shape, sizeof shape);
  mg_dtype want_dt = MG_BF16;
  dtype_from_api(want->dtype, &want_dt); /* the plan's: always an mlagen_dtype */
  const char *want_t = mg_dtype_name(want_dt);
  if (!t->data)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: tensors->%s.data is NULL (%s %s %s)", fn, field,
                       want->name, want_t, shape);
  const char *got_t = api_dtype_name(t->dtype);
  if (t->dtype != want->dtype) {
    if (got_t)
      return mg_diag_set(d, MLAGEN_EINVAL, "%s: tensors->%s.dtype is %s, the plan expects %s",
                         fn, field, got_t, want_t);
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: tensors->%s.dtype = %d is not an mlagen_dtype "
                       "(the plan expects %s)", fn, field, (int)t->dtype, want_t);
  }
  if (t->ndim != want->ndim)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: tensors->%s.ndim = %d, the plan expects %d (%s %s)",
                       fn, field, t->ndim, want->ndim, want->name, shape);
  for (int i = 0; i < want->ndim; i++)
    if (t->dims[i] != want->dims[i])
      return mg_diag_set(d, MLAGEN_EINVAL, "%s: tensors->%s.dims[%d] = %lld, the plan expects "
                         "%lld (%s %s)", fn, field, i, (long long)t->dims[i],
                         (long long)want->dims[i], want->name, shape);
  size_t el = mg_dtype_size(want_dt);
  if ((uintptr_t)t->data % el)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: tensors->%s.data = %p is not aligned to its "
                       "element size, %zu bytes", fn, field, t->data, el);
  return 0;
}

/* The documents of a pass (mlagen_tensors.cu_seqlens): a varlen plan needs them, checked
 * against its token capacity (mg_varlen_check); any other plan refuses them. */
static int check_cu_seqlens(const mlagen_plan *plan, const mlagen_tensors *t, const char *fn,
                            mg_diag *d) {
  const mg_plan_args *a = &plan->plan.args;
  if (!a->varlen) {
    if (t->cu_seqlens || t->n_cu_seqlens)
      return mg_diag_set(d, MLAGEN_EINVAL, "%s: tensors->cu_seqlens is %s with n_cu_seqlens = "
                         "%lld, but the plan is not for packed sequences (plan_desc->varlen = 0): "
                         "leave them NULL and 0", fn, t->cu_seqlens ? "set" : "NULL",
                         (long long)t->n_cu_seqlens);
    return 0;
  }
  if (!t->cu_seqlens)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: tensors->cu_seqlens is NULL: the plan is for packed "
                       "sequences (plan_desc->varlen): give the documents' boundaries, N + 1 "
                       "int32 entries in host memory", fn);
  if (mg_varlen_check(t->cu_seqlens, t->n_cu_seqlens, a->seq, "tensors->cu_seqlens", d))
    return mg_diag_prefix(d, "%s", fn);
  return 0;
}

/* A caller buffer (workspace or saved) of at least need bytes, 16-byte aligned. */
static int check_buffer(const void *buf, size_t bytes, size_t need, const char *what,
                        const char *fn, mg_diag *d) {
  if (bytes < need)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: %s_bytes = %zu is less than the plan's %s, %zu "
                       "bytes (mlagen_plan_sizes)", fn, what, bytes, what, need);
  if (!buf && need > 0)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: %s is NULL; the plan needs %zu bytes", fn, what,
                       need);
  if ((uintptr_t)buf % 16)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: %s = %p is not 16-byte aligned", fn, what, buf);
  return 0;
}

/* Whether slot i is written by a step of pass (mg_pass). */
static int slot_written(const mg_plan *p, size_t i, mg_pass pass) {
  int b = mg_plan_find(p, slots[i].name);
  if (b < 0) return 0;
  for (int k = 0; k < p->n_steps; k++)
    if (p->steps[k].pass == pass)
      for (int j = 0; j < p->steps[k].n_out; j++)
        if (p->steps[k].out[j] == b) return 1;
  return 0;
}

/* The memory of one call: a tensor of the pass, the workspace or the saved area. */
typedef struct region {
  const char *what; /* "tensors->dq", "workspace", "saved" */
  uintptr_t lo, hi; /* [lo, hi) */
  int written;      /* by this pass */
} region;

/* No memory the pass writes may share a byte with any other buffer of the call (an input
 * read after an output that overlaps it was written, or two outputs over each other, gives
 * wrong results, silently); inputs may overlap each other (read only). */
static int check_overlap(const mlagen_plan *plan, int pass, const char *fn,
                         const mlagen_tensors *tensors, const void *workspace,
                         const void *saved, mg_diag *d) {
  const mg_pass mpass = pass == MLAGEN_PASS_FORWARD ? MG_FWD : MG_BWD;
  region r[N_SLOTS + 3];
  char names[N_SLOTS][24];
  int n = 0;
  for (size_t i = 0; i < N_SLOTS; i++) {
    const mlagen_tensor_info *want =
        (const mlagen_tensor_info *)((const char *)&plan->sizes + slots[i].i_off);
    if (!(want->passes & pass) || !want->bytes) continue;
    const mlagen_tensor *t = (const mlagen_tensor *)((const char *)tensors + slots[i].t_off);
    snprintf(names[i], sizeof names[i], "tensors->%s", slots[i].field);
    r[n++] = (region){names[i], (uintptr_t)t->data, (uintptr_t)t->data + want->bytes,
                      slot_written(&plan->plan, i, mpass)};
  }
  if (tensors->cu_seqlens && tensors->n_cu_seqlens > 0) /* host memory the CPU executor reads
                                                           * during the pass */
    r[n++] = (region){"tensors->cu_seqlens", (uintptr_t)tensors->cu_seqlens,
                      (uintptr_t)(tensors->cu_seqlens + tensors->n_cu_seqlens), 0};
  if (plan->sizes.workspace_bytes)
    r[n++] = (region){"workspace", (uintptr_t)workspace,
                      (uintptr_t)workspace + plan->sizes.workspace_bytes, 1};
  if (plan->sizes.saved_bytes)
    r[n++] = (region){"saved", (uintptr_t)saved, (uintptr_t)saved + plan->sizes.saved_bytes,
                      pass == MLAGEN_PASS_FORWARD};
  for (int i = 0; i < n; i++)
    for (int j = i + 1; j < n; j++)
      if ((r[i].written || r[j].written) && r[i].lo < r[j].hi && r[j].lo < r[i].hi)
        return mg_diag_set(d, MLAGEN_EINVAL, "%s: %s (%p, %zu bytes) and %s (%p, %zu bytes) "
                           "overlap: memory the pass writes (%s) must not share a byte with "
                           "another buffer of the call", fn, r[i].what, (void *)r[i].lo,
                           (size_t)(r[i].hi - r[i].lo), r[j].what, (void *)r[j].lo,
                           (size_t)(r[j].hi - r[j].lo), r[i].written ? r[i].what : r[j].what);
  return 0;
}

static int run_pass(mlagen_plan *plan, mlagen_context *ctx, int pass, const char *fn,
                    const mlagen_tensors *tensors, void *workspace, size_t workspace_bytes,
                    void *saved, size_t saved_bytes, void *stream) {
  mg_diag *d = &ctx->diag;
  if (!tensors) return mg_diag_set(d, MLAGEN_EINVAL, "%s: tensors is NULL", fn);
  int rc;
  for (size_t i = 0; i < N_SLOTS; i++) {
    const mlagen_tensor_info *want = slot_info(&plan->sizes, i);
    if (!(want->passes & pass)) continue;
    const mlagen_tensor *t = (const mlagen_tensor *)((const char *)tensors + slots[i].t_off);
    if ((rc = check_tensor(t, want, slots[i].field, fn, d))) return rc;
  }
  if ((rc = check_cu_seqlens(plan, tensors, fn, d))) return rc;
  if ((rc = check_buffer(workspace, workspace_bytes, plan->sizes.workspace_bytes, "workspace",
                         fn, d)) ||
      (rc = check_buffer(saved, saved_bytes, plan->sizes.saved_bytes, "saved", fn, d)) ||
      (rc = check_overlap(plan, pass, fn, tensors, workspace, saved, d)))
    return rc;
  const mg_plan *p = &plan->plan;
  const mg_pass mpass = pass == MLAGEN_PASS_FORWARD ? MG_FWD : MG_BWD;
  if (plan->device == MLAGEN_DEVICE_CPU) { /* the CPU executor, on this thread */
    if (p->args.sp > 1 && !plan->user_comm)
      return mg_diag_set(d, MLAGEN_EINVAL, "%s: the CPU plan spans sp_size = %d ranks: give it "
                         "the trainer's collectives with mlagen_plan_set_comm_ops (an NCCL "
                         "communicator does not serve host memory)", fn, p->args.sp);
    mg_cpu_tensors t = {.q = tensors->q.data, .c_kv = tensors->c_kv.data,
                        .k_rope = tensors->k_rope.data, .w_kv_b = tensors->w_kv_b.data,
                        .d_o = tensors->d_o.data, .o = tensors->o.data, .dq = tensors->dq.data,
                        .dc_kv = tensors->dc_kv.data, .dk_rope = tensors->dk_rope.data,
                        .dw_kv_b = tensors->dw_kv_b.data, .cu_seqlens = tensors->cu_seqlens,
                        .n_cu = tensors->n_cu_seqlens};
    rc = mg_cpu_run_pass(p, p->args.sp > 1 ? plan->user_comm : NULL, mpass, &t, &plan->mem,
                         workspace, saved, d);
    return rc ? mg_diag_prefix(d, "%s", fn) : 0;
  }
  const mg_driver *drv;
  if ((rc = mg_driver_get(&drv, d))) return mg_diag_prefix(d, "%s", fn);
  (void)drv;
  if (p->args.sp > 1 && !plan->nccl_comm && !plan->user_comm)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: the plan spans sp_size = %d ranks: give it the "
                       "trainer's NCCL communicator with mlagen_plan_set_comm (or its "
                       "collectives with mlagen_plan_set_comm_ops)", fn, p->args.sp);
  if (p->args.dtype != MG_BF16 && p->args.dtype != MG_F16)
    return mg_diag_set(d, MLAGEN_EUNSUPPORTED, "%s: the CUDA executor runs bf16 and f16 plans; "
                       "the %s plan runs on the CPU with `mlagen run`", fn,
                       mg_dtype_name(p->args.dtype));
  if (p->args.sp > 1 && plan->user_comm) mg_comm_user_set_stream(plan->user_comm, stream);
  if (p->args.sp > 1 && !plan->user_comm && !plan->comm) { /* NCCL, wrapped once */
    mg_comm *comm;
    if ((rc = mg_comm_nccl_wrap(&comm, plan->nccl_comm, stream, d)))
      return mg_diag_prefix(d, "%s: sp_size = %d: the NCCL communicator", fn, p->args.sp);
    if (comm->size != p->args.sp || comm->rank != p->args.rank) {
      rc = mg_diag_set(d, MLAGEN_EINVAL, "%s: the NCCL communicator (mlagen_plan_set_comm) has "
                       "%d ranks and this process is its rank %d; the plan is for sp_rank = %d "
                       "of sp_size = %d", fn, comm->size, comm->rank, p->args.rank, p->args.sp);
      mg_comm_destroy(comm);
      return rc;
    }
    plan->comm = comm;
  }
  if (plan->comm) mg_comm_nccl_set_stream(plan->comm, stream); /* this call's stream */
  if (!plan->exec) { /* prepare once: kernels generated, compiled (JIT cache) and loaded */
    if ((!plan->ops && (rc = mg_dev_ops_cuda(&plan->ops, d))) ||
        (rc = mg_cuda_exec_prepare(p, plan->ops, NULL, &plan->exec, d))) {
      return plan->ops ? mg_diag_prefix(d, "%s: preparing the %s plan", fn, mg_form_name(p->args.form))
                       : mg_diag_prefix(d, "%s", fn);
    }
  }
  mg_cuda_tensors t = {.q = tensors->q.data, .c_kv = tensors->c_kv.data,
                       .k_rope = tensors->k_rope.data, .w_kv_b = tensors->w_kv_b.data,
                       .d_o = tensors->d_o.data, .o = tensors->o.data, .dq = tensors->dq.data,
                       .dc_kv = tensors->dc_kv.data, .dk_rope = tensors->dk_rope.data,
                       .dw_kv_b = tensors->dw_kv_b.data, .cu_seqlens = tensors->cu_seqlens,
                       .n_cu = tensors->n_cu_seqlens};
  mg_cuda_exec_set_timeout(plan->exec, plan->wait_s > 0 ? plan->wait_s : -1); /* 0: no wait */
  rc = mg_cuda_exec_run(plan->exec, mpass, &t, workspace, workspace_bytes, saved, saved_bytes,
                        plan->user_comm ? plan->user_comm : plan->comm, stream, d);
  return rc ? mg_diag_prefix(d, "%s", fn) : 0;
}

/* run_pass with the plan marked busy: a callback that calls back into the API for this plan
 * cannot free the communicator the pass is using (mlagen.h). */
static int run(mlagen_plan *plan, int pass, const char *fn, const mlagen_tensors *tensors,
               void *workspace, size_t workspace_bytes, void *saved, size_t saved_bytes,
               void *stream) {
  if (!plan) return tls_fail(MLAGEN_EINVAL, "%s: plan is NULL", fn);
  mlagen_context *ctx = plan_context(plan, fn);
  if (!ctx) return MLAGEN_EINVAL;
  mg_diag_clear(&ctx->diag);
  if (plan->busy)
    return mg_diag_set(&ctx->diag, MLAGEN_EINVAL, "%s: the plan is already running a pass: a "
                       "collective callback must not call back into the API for its own "
                       "plan", fn);
  plan->busy = 1;
  ctx->passes++;
  int rc = run_pass(plan, ctx, pass, fn, tensors, workspace, workspace_bytes, saved,
                    saved_bytes, stream);
  plan->busy = 0;
  if (--ctx->passes == 0 && ctx->destroy_pending) { /* destroyed from a callback */
    mg_diag_clear(&ctx->diag);
    free(ctx);
  } else if (!rc) {
    /* a nested call refused during the pass (from a callback) leaves no message behind */
    mg_diag_clear(&ctx->diag);
  }
  if (plan->destroy_pending) mlagen_plan_destroy(plan);
  return rc;
}

int mlagen_forward(mlagen_plan *plan, const mlagen_tensors *tensors, void *workspace,
                   size_t workspace_bytes, void *saved, size_t saved_bytes, void *stream) {
  return run(plan, MLAGEN_PASS_FORWARD, "mlagen_forward", tensors, workspace, workspace_bytes,
             saved, saved_bytes, stream);
}

int mlagen_backward(mlagen_plan *plan, const mlagen_tensors *tensors, void *workspace,
                    size_t workspace_bytes, void *saved, size_t saved_bytes, void *stream) {
  return run(plan, MLAGEN_PASS_BACKWARD, "mlagen_backward", tensors, workspace, workspace_bytes,
             saved, saved_bytes, stream);
}

/* ---- the device ---------------------------------------------------------------------- */

int mlagen_get_device_info(mlagen_context *ctx, int device, mlagen_device_info *info) {
  if (!ctx) return tls_fail(MLAGEN_EINVAL, "mlagen_get_device_info: ctx is NULL");
  mg_diag *d = &ctx->diag;
  mg_diag_clear(d);
  if (!info) return mg_diag_set(d, MLAGEN_EINVAL, "mlagen_get_device_info: info is NULL");
  memset(info, 0, sizeof *info);
  const mg_driver *drv;
  int rc = mg_driver_get(&drv, d);
  if (rc) return mg_diag_prefix(d, "mlagen_get_device_info");
  info->driver_version = drv->driver_version;
  int n = 0;
  if ((rc = mg_driver_check(drv, drv->cuDeviceGetCount(&n), MLAGEN_ENODRIVER,
                            "mlagen_get_device_info: cuDeviceGetCount", d)))
    return rc;
  info->device_count = n;
  if (device < 0 || device >= n)
    return mg_diag_set(d, MLAGEN_EINVAL, "mlagen_get_device_info: device = %d is not in [0, %d), "
                       "the devices the driver sees", device, n);
  CUdevice dev;
  if ((rc = mg_driver_check(drv, drv->cuDeviceGet(&dev, device), MLAGEN_ENODRIVER,
                            "mlagen_get_device_info: cuDeviceGet", d)) ||
      (rc = mg_driver_check(drv, drv->cuDeviceGetName(info->name, (int)sizeof info->name, dev),
                            MLAGEN_ENODRIVER, "mlagen_get_device_info: cuDeviceGetName", d)) ||
      (rc = mg_driver_check(drv, drv->cuDeviceGetAttribute(
                                     &info->cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
                            MLAGEN_ENODRIVER, "mlagen_get_device_info: cuDeviceGetAttribute", d)) ||
      (rc = mg_driver_check(drv, drv->cuDeviceGetAttribute(
                                     &info->cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
                            MLAGEN_ENODRIVER, "mlagen_get_device_info: cuDeviceGetAttribute", d)) ||
      (rc = mg_driver_check(drv, drv->cuDeviceGetAttribute(
                                     &info->sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
                            MLAGEN_ENODRIVER, "mlagen_get_device_info: cuDeviceGetAttribute", d)))
    return rc;
  info->name[sizeof info->name - 1] = '\0';
  return 0;
}
