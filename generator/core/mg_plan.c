/* mg_plan.c: plan building, liveness, and the planner's cost figures; every plan built
 * is checked by mg_plan_check (mg_plan_check.c). */
#include "mg_plan.h"

#include <stdio.h>
#include <string.h>

#include "forms/forms.h"
#include "mg_plan_builder.h"
#include "mg_plan_check.h"
#include "mg_varlen.h"
#include "mlagen.h"

static const char *const form_names[MG_FORM_COUNT] = {"explicit", "absorbed", "laga", "laga-r", "laga-f",
                                                             "laga-cp"};

const char *mg_form_name(mg_form f) {
  return (unsigned)f < MG_FORM_COUNT ? form_names[f] : "unknown";
}

int mg_form_parse(const char *name, mg_form *out) {
  for (int i = 0; i < MG_FORM_COUNT; i++)
    if (strcmp(name, form_names[i]) == 0) {
      *out = (mg_form)i;
      return 0;
    }
  return -1;
}

mg_dtype mg_plan_acc_dtype(const mg_plan *p) {
  return p->args.dtype == MG_F64 ? MG_F64 : MG_F32;
}

int64_t mg_plan_buf_numel(const mg_plan_buf *b) {
  int64_t n = 1;
  for (int i = 0; i < b->ndim; i++) n *= b->dims[i];
  return n;
}

int64_t mg_plan_buf_bytes(const mg_plan_buf *b) {
  return mg_plan_buf_numel(b) * (int64_t)mg_dtype_size(b->dtype);
}

int mg_plan_find(const mg_plan *p, const char *name) {
  for (int i = 0; i < p->n_bufs; i++)
    if (strcmp(p->bufs[i].name, name) == 0) return i;
  return -1;
}

/* ---- builder ------------------------------------------------------------------------ */

/* The largest buffer a plan may hold: 2^56 bytes (64 PiB), so that the planner's sums
 * over all buffers and workspaces stay far inside int64. */
#define MG_PLAN_MAX_BUF_BYTES ((int64_t)1 << 56)

/* Whether every size a form computes fits: rows B*S times H heads times the sum of all
 * widths (a bound on every activation row), and H times that width squared (a bound on
 * every weight), in bytes of the widest element (8), stay within MG_PLAN_MAX_BUF_BYTES.
 * Checked with overflow-safe multiplication before any form multiplies dims in int64. */
static int dims_fit(const mg_plan_args *a) {
  const mg_shape *m = a->shape;
  const int64_t dims[] = {m->qk_nope_head_dim, m->qk_rope_head_dim, m->v_head_dim,
                          m->kv_lora_rank};
  int64_t w = 2 * (int64_t)m->qk_rope_head_dim + 1, rows, x, y;
  for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
    if (dims[i] < 0) return 0;
    w += dims[i];
  }
  return !__builtin_mul_overflow((int64_t)a->batch, a->seq, &rows) &&
         !__builtin_mul_overflow(rows, (int64_t)m->heads, &x) &&
         !__builtin_mul_overflow(x, w, &x) && !__builtin_mul_overflow(x, (int64_t)8, &x) &&
         x <= MG_PLAN_MAX_BUF_BYTES &&
         !__builtin_mul_overflow((int64_t)m->heads * 8, w, &y) &&
         !__builtin_mul_overflow(y, w, &y) && y <= MG_PLAN_MAX_BUF_BYTES;
}

static int buf_new(mg_plan *p, const char *name, mg_buf_role role, mg_dtype t, int ndim,
                   const int64_t *dims) {
  if (p->n_bufs == MG_PLAN_MAX_BUFS || ndim > MG_PLAN_MAX_DIMS) {
    p->error = 1;
    return 0;
  }
  int64_t bytes = (int64_t)mg_dtype_size(t);
  for (int i = 0; i < ndim; i++)
    if (dims[i] < 0 || __builtin_mul_overflow(bytes, dims[i], &bytes) || bytes > MG_PLAN_MAX_BUF_BYTES) {
      if (!p->error) snprintf(p->too_big, sizeof p->too_big, "%s", name);
      p->error = 2;
      bytes = 0;
      break;
    }
  mg_plan_buf *b = &p->bufs[p->n_bufs];
  memset(b, 0, sizeof *b);
  snprintf(b->name, sizeof b->name, "%s", name);
  b->role = role;
  b->dtype = t;
  b->ndim = ndim;
  memcpy(b->dims, dims, (size_t)ndim * sizeof *dims);
  b->first = b->last = -1;
  return p->n_bufs++;
}

int mg_plan_input(mg_plan *p, const char *name, mg_dtype t, int ndim, const int64_t *dims) {
  return buf_new(p, name, MG_BUF_INPUT, t, ndim, dims);
}
int mg_plan_output(mg_plan *p, const char *name, mg_dtype t, int ndim, const int64_t *dims) {
  return buf_new(p, name, MG_BUF_OUTPUT, t, ndim, dims);
}
int mg_plan_temp(mg_plan *p, const char *name, mg_dtype t, int ndim, const int64_t *dims) {
  return buf_new(p, name, MG_BUF_TEMP, t, ndim, dims);
}

void mg_plan_backward(mg_plan *p) {
  p->n_fwd = p->n_steps;
  p->in_backward = 1;
}

static mg_step *step_new(mg_plan *p, mg_step_kind kind, const char *label) {
  if (p->n_steps == MG_PLAN_MAX_STEPS) { /* p->spill absorbs the writes; p->error reports it */
    p->error = 1;
    memset(&p->spill, 0, sizeof p->spill);
    return &p->spill;
  }
  mg_step *s = &p->steps[p->n_steps++];
  memset(s, 0, sizeof *s);
  s->kind = kind;
  s->pass = p->in_backward ? MG_BWD : MG_FWD;
  snprintf(s->label, sizeof s->label, "%s", label);
  return s;
}

static void io(mg_step *s, int in, int out) {
  s->in[s->n_in++] = in;
  s->out[s->n_out++] = out;
}

/* Collectives: bytes sent per rank and the send/receive workspace (docs/forms.md, Conventions).
 * At P = 1 a collective is a copy: nothing sent, no workspace. */
static void collective(mg_plan *p, mg_step_kind kind, int src, int dst) {
  const char *what = kind == MG_STEP_ALL_GATHER       ? "all-gather"
                     : kind == MG_STEP_REDUCE_SCATTER ? "reduce-scatter"
                                                      : "all-to-all";
  char label[80];
  snprintf(label, sizeof label, "%s %s -> %s", what, p->bufs[src].name, p->bufs[dst].name);
  mg_step *s = step_new(p, kind, label);
  io(s, src, dst);
  if (p->args.sp == 1 || p->error) return; /* p->error: a buffer's size did not fit */
  const int64_t P = p->args.sp, in = mg_plan_buf_bytes(&p->bufs[src]),
                out = mg_plan_buf_bytes(&p->bufs[dst]);
  switch (kind) {
    case MG_STEP_SEQ_TO_HEAD:
    case MG_STEP_HEAD_TO_SEQ: /* pack into a send buffer, receive, unpack */
      s->sent = in / P * (P - 1);
      s->workspace = in + out;
      break;
    case MG_STEP_ALL_GATHER: /* send the shard to P - 1 peers, receive P shards */
      s->sent = in * (P - 1);
      s->workspace = out;
      break;
    default: /* reduce-scatter: pack by destination rank, keep 1/P */
      s->sent = in / P * (P - 1);
      s->workspace = in;
      break;
  }
}

void mg_plan_seq_to_head(mg_plan *p, int src, int dst) { collective(p, MG_STEP_SEQ_TO_HEAD, src, dst); }
void mg_plan_head_to_seq(mg_plan *p, int src, int dst) { collective(p, MG_STEP_HEAD_TO_SEQ, src, dst); }
void mg_plan_all_gather(mg_plan *p, int src, int dst) { collective(p, MG_STEP_ALL_GATHER, src, dst); }
void mg_plan_reduce_scatter(mg_plan *p, int src, int dst) {
  collective(p, MG_STEP_REDUCE_SCATTER, src, dst);
}

void mg_plan_gemm(mg_plan *p, const char *label, int a, int b, int c, mg_gemm g) {
  mg_step *s = step_new(p, MG_STEP_GEMM, label);
  s->in[s->n_in++] = a;
  s->in[s->n_in++] = b;
  if (g.beta != 0) s->in[s->n_in++] = c; /* accumulating reads C */
  s->out[s->n_out++] = c;
  if (g.batch == 0) g.batch = 1;
  s->gemm = g;
  s->flops = 2.0 * (double)g.m * (double)g.n * (double)g.k * g.batch;
}

/* Attention FLOPs by docs/forms.md's (FlashMLA's) convention: forward 2 H pairs (d_qk + d_v),
 * backward 2 H pairs (3 d_qk + 2 d_v); pairs = S (S + 1) / 2 when causal, or those inside
 * each document when the plan's documents are given (args.cu_seqlens). */
static double attn_flops(const mg_plan *p, mg_kernel_op op) {
  const double S = (double)p->args.seq, B = p->args.batch, H = p->heads_local;
  const double pairs = p->args.cu_seqlens /* a varlen plan's documents: pairs inside them */
                           ? mg_varlen_pairs(p->args.cu_seqlens, p->args.n_cu - 1, p->args.causal,
                                             p->args.seq, 0, 0, 0)
                       : p->args.causal ? S * (S + 1) / 2
                                        : S * S;
  const mg_shape *m = &p->shape;
  int absorbed = op == MG_OP_MQA_FWD || op == MG_OP_MQA_BWD;
  double dqk = absorbed ? m->kv_lora_rank + m->qk_rope_head_dim : m->qk_nope_head_dim + m->qk_rope_head_dim;
  double dv = absorbed ? m->kv_lora_rank : m->v_head_dim;
  int fwd = op == MG_OP_ATTN_FWD || op == MG_OP_MQA_FWD;
  return 2 * B * H * pairs * (fwd ? dqk + dv : 3 * dqk + 2 * dv);
}

mg_step *mg_plan_kernel(mg_plan *p, mg_kernel_op op, const char *label, const int *ins,
                        const int *outs) {
  mg_step *s = step_new(p, MG_STEP_KERNEL, label);
  s->op = op;
  for (; *ins >= 0 && s->n_in < MG_STEP_MAX_ARGS; ins++) s->in[s->n_in++] = *ins;
  for (; *outs >= 0 && s->n_out < MG_STEP_MAX_ARGS; outs++) s->out[s->n_out++] = *outs;
  if (op == MG_OP_ATTN_FWD || op == MG_OP_ATTN_BWD || op == MG_OP_MQA_FWD || op == MG_OP_MQA_BWD)
    s->flops = attn_flops(p, op);
  /* The attention backward's scratch: delta = rowsum(dO * O), f32 [B, H, S] of the
   * step's queries (in[0], [B, S, H, w]), which the CUDA executor (runtime/exec/mg_cuda_exec.h)
   * keeps in the step's workspace between attn_bwd_pre and the dK/dV and dQ kernels. */
  if ((op == MG_OP_ATTN_BWD || op == MG_OP_MQA_BWD) && s->n_in > 0 && s->in[0] >= 0 &&
      s->in[0] < p->n_bufs && p->bufs[s->in[0]].ndim == 4) {
    const mg_plan_buf *q = &p->bufs[s->in[0]];
    int64_t ws = (int64_t)sizeof(float);
    for (int i = 0; i < 3; i++)
      if (__builtin_mul_overflow(ws, q->dims[i], &ws) || ws > MG_PLAN_MAX_BUF_BYTES) {
        if (!p->error) snprintf(p->too_big, sizeof p->too_big, "%s", "delta");
        p->error = 2;
        ws = 0;
        break;
      }
    s->workspace = ws;
  }
  return s;
}

/* Keys visible to n query rows at positions p0 .. p0 + n - 1: causal sum (p0 + i + 1),
 * else n S_k. */
static double pairs_of(int causal, int64_t p0, int64_t n, int64_t Sk) {
  if (!causal) return (double)n * (double)Sk;
  return (double)n * (double)p0 + (double)n * (double)(n + 1) / 2;
}

void mg_plan_attn_positions(mg_plan *p, mg_step *s, int64_t q_pos0, int64_t q_split,
                            int64_t q_pos1) {
  s->q_pos0 = q_pos0, s->q_split = q_split, s->q_pos1 = q_pos1;
  if (p->error || s->n_in < 2) return;
  const mg_plan_buf *q = &p->bufs[s->in[0]], *k = &p->bufs[s->in[1]];
  const int64_t Sq = q->dims[1], Sk = k->dims[1];
  const double pairs = p->args.cu_seqlens /* a varlen plan's documents */
                           ? mg_varlen_pairs(p->args.cu_seqlens, p->args.n_cu - 1, p->args.causal,
                                             Sq, q_pos0, q_split, q_pos1)
                           : pairs_of(p->args.causal, q_pos0, q_split, Sk) +
                                 pairs_of(p->args.causal, q_pos1, Sq - q_split, Sk);
  const mg_shape *m = &p->shape;
  const double dqk = m->qk_nope_head_dim + m->qk_rope_head_dim, dv = m->v_head_dim;
  s->flops = 2.0 * (double)q->dims[0] * (double)q->dims[2] * pairs *
             (s->op == MG_OP_ATTN_FWD ? dqk + dv : 3 * dqk + 2 * dv);
}

/* ---- finalize and build ------------------------------------------------------------- */

/* Reports a builder failure, sets every buffer's first/last steps, then checks the plan
 * (mg_plan_check.h: the one check the executors rely on). */
static int finalize(mg_plan *p, mg_diag *d) {
  if (p->error == 2)
    return mg_diag_set(d, MLAGEN_EINVAL, "plan: buffer %s would exceed 2^56 bytes: batch, "
                       "sequence length and model dims are too large together", p->too_big);
  if (p->error)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s plan: more than %d buffers or %d steps",
                       mg_form_name(p->args.form), MG_PLAN_MAX_BUFS, MG_PLAN_MAX_STEPS);
  for (int i = 0; i < p->n_bufs; i++) p->bufs[i].first = p->bufs[i].last = -1;
  for (int i = 0; i < p->n_steps; i++) {
    const mg_step *s = &p->steps[i];
    for (int k = 0; k < s->n_in + s->n_out; k++) {
      const int id = k < s->n_in ? s->in[k] : s->out[k - s->n_in];
      if (id < 0 || id >= p->n_bufs) continue; /* mg_plan_check names it */
      mg_plan_buf *b = &p->bufs[id];
      if (k >= s->n_in && b->first < 0) b->first = i;
      b->last = i;
    }
  }
  return mg_plan_check(p, d);
}

#define PLAN_NAMES                                                                         \
  .fn = "plan", .sp = "sp", .rank = "rank", .batch = "batch", .seq = "seq",                \
  .head_groups = "head_groups", .laga_f = "the fused LAGA form (laga-f)", .laga_cp = "laga-cp"
static const mg_plan_arg_names plan_names = {PLAN_NAMES};
const mg_plan_arg_names mg_plan_names_no_seq = {PLAN_NAMES, .no_seq = 1};
#undef PLAN_NAMES

/* The Ulysses forms shard attention by heads (H / P heads per rank), so P must divide H;
 * there is no uneven head split. The message says so, names those forms, the degrees
 * that work for this H and S, and laga-cp, which takes any P (docs/forms.md, "P and H"). */
static int head_split_error(const mg_plan_args *a, const mg_plan_arg_names *n, mg_diag *d) {
  const int H = a->shape->heads;
  char forms[128] = "", ok[160] = "";
  for (int f = 0, k = 0; f < MG_FORM_COUNT; f++) {
    if (f == MG_FORM_LAGA_CP) continue;
    size_t at = strlen(forms);
    snprintf(forms + at, sizeof forms - at, "%s%s", k++ ? ", " : "", mg_form_name((mg_form)f));
  }
  for (int p = 1, k = 0; p <= H && k < 16; p++) /* the degrees dividing both H and S */
    if (H % p == 0 && a->seq % p == 0) {
      size_t at = strlen(ok);
      snprintf(ok + at, sizeof ok - at, "%s%d", k++ ? ", " : "", p);
    }
  return mg_diag_set(d, MLAGEN_EINVAL, "%s: %s = %d %s num_attention_heads = %d: the Ulysses "
                     "forms (%s) give each rank H / P whole heads, so P must divide H (no "
                     "uneven head split); %s values dividing %s work (here %s); the "
                     "all-gather context-parallel form %s keeps all H heads on every rank and "
                     "takes any P dividing %s", n->fn, n->sp, a->sp,
                     a->sp > H ? "exceeds" : "does not divide", H, forms, n->sp,
                     n->no_seq ? "H (and the sequence length)" : "both H and S", ok, n->laga_cp,
                     n->no_seq ? "the sequence length" : "S");
}

int mg_plan_args_check(const mg_plan_args *a, const mg_plan_arg_names *n, mg_diag *d) {
  if (!n) n = &plan_names;
  if (!a || !a->shape) return mg_diag_set(d, MLAGEN_EINVAL, "%s: shape is NULL", n->fn);
  const int H = a->shape->heads;
  if ((unsigned)a->form >= MG_FORM_COUNT)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: unknown form %d", n->fn, (int)a->form);
  if ((unsigned)a->dtype > MG_F16)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: unknown dtype %d", n->fn, (int)a->dtype);
  if (a->sp < 1)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: %s = %d, must be >= 1", n->fn, n->sp, a->sp);
  if (a->rank < 0 || a->rank >= a->sp)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: %s = %d is outside [0, %s = %d)", n->fn, n->rank,
                       a->rank, n->sp, a->sp);
  if (a->batch < 1)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: %s = %d, must be >= 1", n->fn, n->batch, a->batch);
  if (a->seq < 1)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: %s = %lld, must be >= 1", n->fn, n->seq,
                       (long long)a->seq);
  if (a->seq % a->sp != 0)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: %s = %lld is not divisible by %s = %d (each rank "
                       "holds S / P tokens)", n->fn, n->seq, (long long)a->seq, n->sp, a->sp);
  if (a->varlen && a->batch != 1)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: %s = %d with varlen (packed sequences): a varlen "
                       "plan takes one stream of documents, %s = 1 and %s = the token capacity",
                       n->fn, n->batch, a->batch, n->batch, n->seq);
  if (!a->varlen && (a->cu_seqlens || a->n_cu))
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: cu_seqlens given (%lld entries) for a plan "
                       "without varlen: documents need a varlen (packed sequences) plan", n->fn,
                       (long long)a->n_cu);
  if (a->varlen && (a->cu_seqlens || a->n_cu)) {
    int rc = mg_varlen_check(a->cu_seqlens, a->n_cu, a->seq, "cu_seqlens", d);
    if (rc) {
      mg_diag_prefix(d, "%s", n->fn);
      return rc;
    }
  }
  const int cp = a->form == MG_FORM_LAGA_CP;
  if (!cp && (a->sp > H || H % a->sp != 0)) return head_split_error(a, n, d);
  if (a->form != MG_FORM_LAGA_F && !cp && a->head_groups != 0)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: %s = %d: only %s and %s have head groups (0 for "
                       "the other forms)", n->fn, n->head_groups, a->head_groups, n->laga_f,
                       n->laga_cp);
  const int Hl = cp ? H : H / a->sp;
  if ((a->form == MG_FORM_LAGA_F || cp) && a->head_groups != 0 &&
      (a->head_groups < 1 || a->head_groups > MG_PLAN_MAX_HEAD_GROUPS || Hl % a->head_groups != 0))
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: %s = %d must divide %s = %d and be in [1, %d] "
                       "(or 0 for the default)", n->fn, n->head_groups, a->head_groups,
                       cp ? "H" : "H / P", Hl, MG_PLAN_MAX_HEAD_GROUPS);
  if (!dims_fit(a))
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: %s %d x %s %lld x %d heads x the model's widths "
                       "would exceed 2^56 bytes per buffer: batch, sequence length and model "
                       "dims are too large together", n->fn, n->batch, a->batch, n->seq,
                       (long long)a->seq, H);
  return 0;
}

int mg_plan_build(mg_plan *p, const mg_plan_args *a, mg_diag *d) {
  memset(p, 0, sizeof *p);
  int rc = mg_plan_args_check(a, NULL, d);
  if (rc) return rc;
  const int Hl = a->form == MG_FORM_LAGA_CP ? a->shape->heads : a->shape->heads / a->sp;
  p->args = *a;
  if ((a->form == MG_FORM_LAGA_F || a->form == MG_FORM_LAGA_CP) && a->head_groups == 0)
    p->args.head_groups = mg_plan_default_head_groups(Hl);
  p->shape = *a->shape;
  p->args.shape = &p->shape;
  p->heads_local = Hl;
  p->seq_local = a->seq / a->sp;
  switch (a->form) {
    case MG_FORM_EXPLICIT: mg_form_explicit(p); break;
    case MG_FORM_ABSORBED: mg_form_absorbed(p); break;
    case MG_FORM_LAGA: mg_form_laga(p, 0); break;
    case MG_FORM_LAGA_R: mg_form_laga(p, 1); break;
    case MG_FORM_LAGA_F: mg_form_laga_fused(p); break;
    case MG_FORM_LAGA_CP: mg_form_laga_cp(p); break;
  }
  p->args.cu_seqlens = NULL; /* the caller's array: the figures are made, the plan keeps none */
  p->args.n_cu = 0;
  return finalize(p, d);
}

int mg_plan_default_head_groups(int heads_local) {
  for (int g = 8; g > 1; g--)
    if (heads_local % g == 0) return g;
  return 1;
}

/* ---- the planner -------------------------------------------------------------------- */

void mg_plan_cost_of(const mg_plan *p, mg_plan_cost *c) {
  memset(c, 0, sizeof *c);
  int64_t live = 0;
  /* Forward: plan buffers live from their first write to their last access. */
  for (int i = 0; i < p->n_steps; i++) {
    const mg_step *s = &p->steps[i];
    if (i == p->n_fwd) {
      /* The backward starts with the saved buffers; forward outputs went to the caller. */
      live = 0;
      for (int j = 0; j < p->n_bufs; j++) {
        const mg_plan_buf *b = &p->bufs[j];
        if (b->role == MG_BUF_TEMP && b->first < p->n_fwd && b->last >= p->n_fwd)
          live += mg_plan_buf_bytes(b);
      }
      c->saved = live;
    }
    for (int j = 0; j < p->n_bufs; j++)
      if (p->bufs[j].role != MG_BUF_INPUT && p->bufs[j].first == i)
        live += mg_plan_buf_bytes(&p->bufs[j]);
    int64_t now = live + s->workspace;
    int fwd = i < p->n_fwd;
    if (fwd && now > c->peak_fwd) c->peak_fwd = now;
    if (!fwd && now > c->peak_bwd) c->peak_bwd = now;
    for (int j = 0; j < p->n_bufs; j++)
      if (p->bufs[j].role == MG_BUF_TEMP && p->bufs[j].last == i)
        live -= mg_plan_buf_bytes(&p->bufs[j]);
    int64_t *sent = fwd ? &c->sent_fwd : &c->sent_bwd;
    *sent += s->sent;
    int attn = s->kind == MG_STEP_KERNEL && s->flops > 0;
    double *fl = s->kind == MG_STEP_GEMM ? (fwd ? &c->gemm_flops_fwd : &c->gemm_flops_bwd)
                                         : (fwd ? &c->attn_flops_fwd : &c->attn_flops_bwd);
    if (attn || s->kind == MG_STEP_GEMM) *fl += s->flops;
  }
}

/* Bytes step s must read and write at least once (mg_plan_time's convention). */
static double step_bytes(const mg_plan *p, const mg_step *s) {
  if (s->kind == MG_STEP_GEMM) {
    const mg_gemm *g = &s->gemm;
    const double ea = (double)mg_dtype_size(p->bufs[s->in[0]].dtype);
    const double eb = (double)mg_dtype_size(p->bufs[s->in[1]].dtype);
    const double ec = (double)mg_dtype_size(p->bufs[s->out[0]].dtype);
    return g->batch * ((double)g->m * g->k * ea + (double)g->k * g->n * eb +
                       (double)g->m * g->n * ec * (g->beta != 0 ? 2 : 1));
  }
  if (s->op == MG_OP_COPY_COLS) {
    const mg_plan_buf *src = &p->bufs[s->in[0]];
    const int64_t sw = s->src_w ? s->src_w : src->dims[src->ndim - 1];
    return 2.0 * (double)(mg_plan_buf_numel(src) / sw) * (double)s->cols *
           (double)mg_dtype_size(src->dtype);
  }
  double b = 0;
  for (int j = 0; j < s->n_in; j++) b += (double)mg_plan_buf_bytes(&p->bufs[s->in[j]]);
  for (int j = 0; j < s->n_out; j++) b += (double)mg_plan_buf_bytes(&p->bufs[s->out[j]]);
  return b;
}

void mg_plan_time_of(const mg_plan *p, const mg_device_model *dev, mg_plan_time *t) {
  memset(t, 0, sizeof *t);
  for (int i = 0; i < p->n_steps; i++) {
    const mg_step *s = &p->steps[i];
    const int fwd = i < p->n_fwd;
    if (s->kind == MG_STEP_GEMM || s->kind == MG_STEP_KERNEL) {
      const double bytes = step_bytes(p, s);
      const double tc = s->flops / (dev->tflops * 1e12), tm = bytes / (dev->hbm_gbps * 1e9);
      *(fwd ? &t->compute_fwd_s : &t->compute_bwd_s) += tc > tm ? tc : tm;
      *(fwd ? &t->hbm_fwd : &t->hbm_bwd) += bytes;
      *(fwd ? &t->flops_fwd : &t->flops_bwd) += s->flops;
    } else {
      *(fwd ? &t->comm_fwd_s : &t->comm_bwd_s) += (double)s->sent / (dev->link_gbps * 1e9);
    }
  }
  t->fwd_s = t->compute_fwd_s + t->comm_fwd_s;
  t->bwd_s = t->compute_bwd_s + t->comm_bwd_s;
}
