/* mg_cpu_exec.c: the CPU executor (see mg_cpu_exec.h).
 *
 * The plan is checked once at the start of a run (mg_plan_check, the check mg_plan_build
 * ran) with what only this executor limits (f32/f64, CBLAS's int, the kernels' stack
 * rows) and the caller's arguments; then one function per step kind executes it. */
#include "mg_cpu_exec.h"

#include <cblas.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mg_cpu_ops.h"
#include "mg_plan_check.h"
#include "mg_varlen.h"
#include "mlagen.h"

/* ---- the tracking allocator ----------------------------------------------------------- */

typedef struct tracker {
  int64_t live;     /* bytes counted now */
  int64_t peak;     /* high-water mark of live since the last reset */
  int64_t n_allocs;
} tracker;

static void *tr_alloc(tracker *tr, int64_t bytes) {
  void *p = calloc(1, (size_t)bytes);
  if (!p) return NULL;
  tr->live += bytes;
  if (tr->live > tr->peak) tr->peak = tr->live;
  tr->n_allocs++;
  return p;
}

static void tr_free(tracker *tr, void *p, int64_t bytes) {
  if (!p) return;
  free(p);
  tr->live -= bytes;
}

/* ---- the run's state ------------------------------------------------------------------ */

typedef struct exec {
  const mg_plan *p;
  mg_comm *comm;
  mg_cpu_tensors *t;
  mg_diag *d;
  mg_dtype dt;                         /* the plan's dtype */
  size_t es;                           /* its element size */
  int P;                               /* ranks */
  const void *input[MG_PLAN_MAX_BUFS]; /* INPUT buffers: the caller's arrays */
  void *buf[MG_PLAN_MAX_BUFS];         /* TEMP and OUTPUT buffers, while allocated */
  tracker tr;
  mg_cpu_stats st;
  int lo, hi; /* the steps run: [lo, hi) (all of them, or one pass of mg_cpu_run_pass) */
  int64_t T;  /* varlen plans: the valid tokens, cu_seqlens[N] (validate sets it) */
} exec;

static const void *rd(const exec *x, int id) {
  return x->p->bufs[id].role == MG_BUF_INPUT ? x->input[id] : x->buf[id];
}
static void *wr(const exec *x, int id) { return x->buf[id]; }
static const mg_plan_buf *pb(const exec *x, int id) { return &x->p->bufs[id]; }
static int64_t last_dim(const mg_plan_buf *b) { return b->ndim ? b->dims[b->ndim - 1] : 1; }

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Sets "<form> plan step i (label): <message>" and returns status. */
static int step_error(const exec *x, int i, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int step_error(const exec *x, int i, int status, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return mg_diag_set(x->d, status, "%s plan step %d (%s): %s", mg_form_name(x->p->args.form), i,
                     x->p->steps[i].label, msg);
}

/* ---- collectives ------------------------------------------------------------------------ */

/* Copies rows of `row` elements: dst row (a, s_dst, h_dst) of a [A, S_dst, H_dst, row]
 * array from src row (a, s_src, h_src) of a [A, S_src, H_src, row] array, for a < A,
 * s < n_s, h < n_h, with s/h offsets. The one packing loop of every collective. */
typedef struct block {
  int64_t S, H, s0, h0; /* array dims (tokens, heads) and the block's first token/head */
} block;

static void move_block(const exec *x, void *dst, block bd, const void *src, block bs, int64_t A,
                       int64_t n_s, int64_t n_h, int64_t row) {
  const size_t bytes = (size_t)row * x->es;
  for (int64_t a = 0; a < A; a++)
    for (int64_t s = 0; s < n_s; s++)
      for (int64_t h = 0; h < n_h; h++) {
        int64_t id = ((a * bd.S + bd.s0 + s) * bd.H + bd.h0 + h) * row;
        int64_t is = ((a * bs.S + bs.s0 + s) * bs.H + bs.h0 + h) * row;
        memcpy((char *)dst + (size_t)id * x->es, (const char *)src + (size_t)is * x->es, bytes);
      }
}

/* The workspace (mg_plan_check: as mg_plan.c plans it) holds, at P > 1, the send blocks
 * then the receive blocks of an all-to-all, the received blocks of an all-gather, the
 * send blocks of a reduce-scatter. */
static int collective(exec *x, int i, void *ws) {
  const mg_step *s = &x->p->steps[i];
  int rc = 0;
  const mg_plan_buf *src = pb(x, s->in[0]), *dst = pb(x, s->out[0]);
  const int64_t P = x->P;
  const int seq_head = s->kind == MG_STEP_SEQ_TO_HEAD || s->kind == MG_STEP_HEAD_TO_SEQ;
  /* The sequence-sharded side [B, S_l, (H,) w] and the other side [B, S, (H/P,) w]. */
  const mg_plan_buf *shard = s->kind == MG_STEP_SEQ_TO_HEAD || s->kind == MG_STEP_ALL_GATHER ? src : dst;
  const int nd = seq_head ? 4 : 3;
  const int64_t Bt = shard->dims[0], Sl = shard->dims[1], w = shard->dims[nd - 1];
  const int64_t H = seq_head ? shard->dims[2] : 1, Hl = seq_head ? H / P : 1;
  const void *in = rd(x, s->in[0]);
  void *out = wr(x, s->out[0]);
  const int64_t numel = mg_plan_buf_numel(src);
  if (P == 1) { /* one rank: the collective is a copy, as planned (no workspace) */
    memcpy(out, in, (size_t)numel * x->es);
    return 0;
  }
  const size_t count = (size_t)(Bt * Sl * Hl * w); /* elements per rank block */
  char *send = ws, *recv = (char *)ws + (size_t)mg_plan_buf_bytes(src);
  const size_t blk = count * x->es;
  mg_comm *c = x->comm;
  switch (s->kind) {
    case MG_STEP_SEQ_TO_HEAD:
      /* send block p: my tokens, heads of rank p; receive block p: rank p's tokens, my heads */
      for (int64_t q = 0; q < P; q++)
        move_block(x, send + q * blk, (block){Sl, Hl, 0, 0}, in, (block){Sl, H, 0, q * Hl}, Bt, Sl,
                   Hl, w);
      rc = c->ops->all_to_all(c, send, recv, count, x->dt, x->d);
      for (int64_t q = 0; !rc && q < P; q++)
        move_block(x, out, (block){Sl * P, Hl, q * Sl, 0}, recv + q * blk, (block){Sl, Hl, 0, 0},
                   Bt, Sl, Hl, w);
      break;
    case MG_STEP_HEAD_TO_SEQ:
      /* send block p: rank p's tokens, my heads; receive block p: my tokens, rank p's heads */
      for (int64_t q = 0; q < P; q++)
        move_block(x, send + q * blk, (block){Sl, Hl, 0, 0}, in, (block){Sl * P, Hl, q * Sl, 0},
                   Bt, Sl, Hl, w);
      rc = c->ops->all_to_all(c, send, recv, count, x->dt, x->d);
      for (int64_t q = 0; !rc && q < P; q++)
        move_block(x, out, (block){Sl, H, 0, q * Hl}, recv + q * blk, (block){Sl, Hl, 0, 0}, Bt,
                   Sl, Hl, w);
      break;
    case MG_STEP_ALL_GATHER:
      recv = ws; /* block p: rank p's tokens */
      rc = c->ops->all_gather(c, in, recv, count, x->dt, x->d);
      for (int64_t q = 0; !rc && q < P; q++)
        move_block(x, out, (block){Sl * P, 1, q * Sl, 0}, recv + q * blk, (block){Sl, 1, 0, 0}, Bt,
                   Sl, 1, w);
      break;
    default: /* reduce-scatter: block p holds rank p's tokens; the sum of mine lands in out */
      for (int64_t q = 0; q < P; q++)
        move_block(x, send + q * blk, (block){Sl, 1, 0, 0}, in, (block){Sl * P, 1, q * Sl, 0}, Bt,
                   Sl, 1, w);
      rc = c->ops->reduce_scatter(c, send, out, count, x->dt, x->d);
      break;
  }
  if (rc) {
    mg_diag_prefix(x->d, "%s plan step %d (%s)", mg_form_name(x->p->args.form), i, s->label);
    return rc;
  }
  int64_t *sent = s->pass == MG_FWD ? &x->st.sent_fwd : &x->st.sent_bwd;
  *sent += (int64_t)((size_t)(P - 1) * blk);
  return 0;
}

/* ---- GEMM ------------------------------------------------------------------------------- */

static int gemm(exec *x, int i) {
  const mg_step *s = &x->p->steps[i];
  const mg_gemm *g = &s->gemm;
  const enum CBLAS_TRANSPOSE ta = g->trans_a ? CblasTrans : CblasNoTrans;
  const enum CBLAS_TRANSPOSE tb = g->trans_b ? CblasTrans : CblasNoTrans;
  const int m = (int)g->m, n = (int)g->n;
  /* a token-contracting GEMM sums only the valid token rows: the first k of op(A)'s
   * columns and op(B)'s rows (slack rows may hold NaN, and 0 * NaN = NaN) */
  const int k = (int)(g->tok_k ? mg_varlen_valid_rows(x->T, g->tok0, g->k) : g->k);
  const int lda = (int)g->lda, ldb = (int)g->ldb, ldc = (int)g->ldc;
  for (int b = 0; b < g->batch; b++) {
    const int64_t oa = g->off_a + b * g->stride_a, ob = g->off_b + b * g->stride_b,
                  oc = g->off_c + b * g->stride_c;
    if (k == 0) { /* no valid row: C = beta C, which beta 1 leaves as it is */
      for (int64_t r = 0; g->beta == 0 && r < m; r++)
        memset((char *)wr(x, s->out[0]) + (size_t)(oc + r * ldc) * x->es, 0, (size_t)n * x->es);
      continue;
    }
    if (x->dt == MG_F64) {
      const double *A = rd(x, s->in[0]), *Bm = rd(x, s->in[1]);
      double *C = wr(x, s->out[0]);
      cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, 1.0, A + oa, lda, Bm + ob, ldb, g->beta, C + oc,
                  ldc);
    } else {
      const float *A = rd(x, s->in[0]), *Bm = rd(x, s->in[1]);
      float *C = wr(x, s->out[0]);
      cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, 1.0f, A + oa, lda, Bm + ob, ldb, g->beta, C + oc,
                  ldc);
    }
  }
  return 0;
}

/* ---- kernels ---------------------------------------------------------------------------- */

/* The attention geometry of step s: q [B, S_q, H, d_qk], keys k (or the latent c)
 * [B, S_k, ...], values of width d_v, the step's query positions. */
static mg_cpu_attn attn_geom(const exec *x, const mg_step *s, const mg_plan_buf *q,
                             const mg_plan_buf *k, int64_t d_v) {
  return (mg_cpu_attn){.t = x->dt, .B = q->dims[0], .S_q = q->dims[1], .S_k = k->dims[1],
                       .H = q->dims[2], .q_pos0 = s->q_pos0, .q_split = s->q_split,
                       .q_pos1 = s->q_pos1, .d_qk = q->dims[3], .d_v = d_v,
                       .scale = x->p->shape.softmax_scale, .causal = x->p->args.causal,
                       .cu_seqlens = x->p->args.varlen ? x->t->cu_seqlens : NULL,
                       .n_seqs = x->p->args.varlen ? x->t->n_cu - 1 : 0};
}

/* The test seam (mg_cpu_exec.h): 1 when the hook ran the step instead. */
static int hooked(exec *x, const mg_step *s) {
  if (!x->t->kernel_hook) return 0;
  const void *hin[MG_STEP_MAX_ARGS];
  void *hout[MG_STEP_MAX_ARGS];
  for (int k = 0; k < s->n_in; k++) hin[k] = rd(x, s->in[k]);
  for (int k = 0; k < s->n_out; k++) hout[k] = wr(x, s->out[k]);
  return !x->t->kernel_hook(s, x->p, hin, hout, x->t->hook_ctx);
}

static void kernel(exec *x, const mg_step *s) {
  const mg_shape *sh = &x->p->shape;
  const int64_t dn = sh->qk_nope_head_dim, dr = sh->qk_rope_head_dim, dv = sh->v_head_dim;
  const mg_dtype t = x->dt;
#define IN(k) pb(x, s->in[k])
#define OUT(k) pb(x, s->out[k])
#define BI(k) rd(x, s->in[k])
#define BO(k) wr(x, s->out[k])
  switch (s->op) {
    case MG_OP_EXPAND_KV:
    case MG_OP_SPLIT_DKV: {
      /* split keys: expand_kv takes no rope source, split_dkv the summed dk_rope (in 2) */
      const int64_t rows = IN(0)->dims[0] * IN(0)->dims[1], H = IN(0)->dims[2];
      if (s->op == MG_OP_EXPAND_KV)
        mg_cpu_expand_kv(t, rows, H, dn, dr, dv, BI(0), s->split_keys ? NULL : BI(1), s->rope_col,
                         s->rope_w, BO(0), BO(1));
      else
        mg_cpu_split_dkv(t, rows, H, dn, dr, dv, BI(0), BI(1), s->split_keys ? BI(2) : NULL, BO(0),
                         BO(1), s->rope_col, s->rope_w, s->accumulate);
      return;
    }
    case MG_OP_ATTN_FWD:
    case MG_OP_ATTN_BWD: {
      mg_cpu_attn a = attn_geom(x, s, IN(0), IN(1), last_dim(IN(2)));
      if (s->split_keys) { /* k_rope: the latent's columns rope_col.. (the last input) */
        const int fwd = s->op == MG_OP_ATTN_FWD;
        a.d_r = dr, a.ld_k_rope = s->rope_w;
        a.k_rope = (const char *)BI(fwd ? 3 : 6) + (size_t)s->rope_col * x->es;
        a.dk_rope = fwd ? NULL : BO(3);
      }
      if (hooked(x, s)) return;
      if (s->op == MG_OP_ATTN_FWD) mg_cpu_attn_fwd(&a, BI(0), BI(1), BI(2), BO(0), BO(1));
      else mg_cpu_attn_bwd(&a, BI(0), BI(1), BI(2), BI(3), BI(4), BI(5), BO(0), BO(1), BO(2));
      return;
    }
    case MG_OP_MQA_FWD:
    case MG_OP_MQA_BWD: {
      const int fwd = s->op == MG_OP_MQA_FWD;
      const mg_cpu_attn a = attn_geom(x, s, IN(0), IN(1), last_dim(fwd ? OUT(0) : IN(2)));
      if (hooked(x, s)) return;
      if (fwd) mg_cpu_mqa_fwd(&a, BI(0), BI(1), BO(0), BO(1));
      else mg_cpu_mqa_bwd(&a, BI(0), BI(1), BI(2), BI(3), BI(4), BO(0), BO(1));
      return;
    }
    case MG_OP_CONCAT_LATENT:
    case MG_OP_SPLIT_LATENT: {
      const int concat = s->op == MG_OP_CONCAT_LATENT;
      const mg_plan_buf *ckv = concat ? IN(0) : OUT(0), *kr = concat ? IN(1) : OUT(1);
      const int64_t dc = last_dim(ckv), w = last_dim(kr), rows = mg_plan_buf_numel(ckv) / dc;
      if (concat) mg_cpu_concat_latent(t, rows, dc, w, BI(0), BI(1), BO(0));
      else mg_cpu_split_latent(t, rows, dc, w, BI(0), BO(0), BO(1));
      return;
    }
    case MG_OP_CHUNK_ORDER:
      mg_cpu_chunk_order(t, IN(0)->dims[0], s->ranks, IN(0)->dims[1] / s->ranks, IN(0)->dims[2],
                         BI(0), BO(0), s->inverse);
      return;
    case MG_OP_COPY_COLS: {
      const int64_t sw = s->src_w ? s->src_w : last_dim(IN(0)), dw = s->dst_w ? s->dst_w : last_dim(OUT(0));
      mg_cpu_copy_cols(t, mg_plan_buf_numel(IN(0)) / sw, BI(0), sw, s->src_col, BO(0), dw, s->dst_col,
                       s->cols);
      return;
    }
  }
#undef IN
#undef OUT
#undef BI
#undef BO
}

/* Runs step i (mg_plan_check passed) with workspace ws. */
static int step(exec *x, int i, void *ws) {
  const mg_step *s = &x->p->steps[i];
  switch (s->kind) {
    case MG_STEP_GEMM: return gemm(x, i);
    case MG_STEP_KERNEL: kernel(x, s); return 0;
    default: return collective(x, i, ws);
  }
}

/* ---- names of the op boundary ----------------------------------------------------------- */

static const void *input_of(const mg_cpu_tensors *t, const char *name) {
  if (!strcmp(name, "q")) return t->q;
  if (!strcmp(name, "c_kv")) return t->c_kv;
  if (!strcmp(name, "k_rope")) return t->k_rope;
  if (!strcmp(name, "w_kv_b")) return t->w_kv_b;
  if (!strcmp(name, "do")) return t->d_o;
  return NULL;
}

static void **output_slot(mg_cpu_tensors *t, const char *name) {
  if (!strcmp(name, "o")) return &t->o;
  if (!strcmp(name, "dq")) return &t->dq;
  if (!strcmp(name, "dc_kv")) return &t->dc_kv;
  if (!strcmp(name, "dk_rope")) return &t->dk_rope;
  if (!strcmp(name, "dw_kv_b")) return &t->dw_kv_b;
  return NULL;
}

void mg_cpu_tensors_free(mg_cpu_tensors *t) {
  if (!t) return;
  void **outs[] = {&t->o, &t->dq, &t->dc_kv, &t->dk_rope, &t->dw_kv_b};
  for (size_t k = 0; k < sizeof outs / sizeof outs[0]; k++) {
    free(*outs[k]);
    *outs[k] = NULL;
  }
}

/* Whether a step in [x->lo, x->hi) reads or writes buffer b. */
static int touched(const exec *x, int b) {
  for (int i = x->lo; i < x->hi; i++) {
    const mg_step *s = &x->p->steps[i];
    for (int j = 0; j < s->n_in; j++)
      if (s->in[j] == b) return 1;
    for (int j = 0; j < s->n_out; j++)
      if (s->out[j] == b) return 1;
  }
  return 0;
}

/* Everything decidable before running: the plan (mg_plan_check), what this executor
 * limits, the caller's inputs (those the steps run read), communicator and captures. */
static int validate(exec *x) {
  const mg_plan *p = x->p;
  mg_diag *d = x->d;
  if (p->args.dtype != MG_F32 && p->args.dtype != MG_F64)
    return mg_diag_set(d, MLAGEN_EINVAL, "the CPU executor runs f32 or f64, not %s",
                       mg_dtype_name(p->args.dtype));
  int rc = mg_plan_check(p, d);
  if (!rc) rc = mg_plan_check_gemm_int(p, "CBLAS", d);
  if (rc) return rc;
  for (int i = 0; i < p->n_steps; i++) { /* the attention kernels' rows live on the stack */
    const mg_step *s = &p->steps[i];
    if (s->kind != MG_STEP_KERNEL || s->flops <= 0) continue;
    const int mqa = s->op == MG_OP_MQA_FWD || s->op == MG_OP_MQA_BWD;
    const int64_t d_qk = p->bufs[s->in[0]].dims[3],
                  d_v = last_dim(&p->bufs[mqa ? s->in[1] : s->in[2]]);
    if (d_qk > MG_CPU_MAX_ROW || d_v > MG_CPU_MAX_ROW)
      return step_error(x, i, MLAGEN_EUNSUPPORTED,
                        "attention rows of %lld and %lld elements exceed the CPU kernels' %d",
                        (long long)d_qk, (long long)d_v, MG_CPU_MAX_ROW);
  }
  for (int b = 0; b < p->n_bufs; b++)
    if (p->bufs[b].role == MG_BUF_INPUT && touched(x, b) && !input_of(x->t, p->bufs[b].name))
      return mg_diag_set(d, MLAGEN_EINVAL, "input %s is NULL", p->bufs[b].name);
  if (p->args.varlen) { /* the documents, the same on every rank: checked before any step */
    if (!x->t->cu_seqlens)
      return mg_diag_set(d, MLAGEN_EINVAL, "a varlen plan needs cu_seqlens (the documents, N "
                         "+ 1 entries)");
    rc = mg_varlen_check(x->t->cu_seqlens, x->t->n_cu, p->args.seq, "cu_seqlens", d);
    if (rc) return rc;
    x->T = x->t->cu_seqlens[x->t->n_cu - 1];
  } else if (x->t->cu_seqlens || x->t->n_cu) {
    return mg_diag_set(d, MLAGEN_EINVAL, "cu_seqlens given (%lld entries) for a plan without "
                       "varlen (packed sequences)", (long long)x->t->n_cu);
  }
  if (p->args.sp > 1 && !x->comm)
    return mg_diag_set(d, MLAGEN_EINVAL, "a plan for %d ranks needs a communicator", p->args.sp);
  if (x->comm && (x->comm->size != p->args.sp || x->comm->rank != p->args.rank))
    return mg_diag_set(d, MLAGEN_EINVAL,
                       "the communicator is rank %d of %d, the plan is for rank %d of sp = %d",
                       x->comm->rank, x->comm->size, p->args.rank, p->args.sp);
  if (x->t->n_captures < 0 || (x->t->n_captures > 0 && !x->t->captures))
    return mg_diag_set(d, MLAGEN_EINVAL, "captures: %d requested, array NULL", x->t->n_captures);
  for (int k = 0; k < x->t->n_captures; k++) {
    const mg_cpu_capture *c = &x->t->captures[k];
    int b = c->name ? mg_plan_find(p, c->name) : -1;
    if (b < 0)
      return mg_diag_set(d, MLAGEN_EINVAL, "capture: the %s plan has no buffer '%s'",
                         mg_form_name(p->args.form), c->name ? c->name : "(null)");
    if (p->bufs[b].role == MG_BUF_INPUT)
      return mg_diag_set(d, MLAGEN_EINVAL, "capture: %s is an input", c->name);
    if (!c->dst || c->bytes != (size_t)mg_plan_buf_bytes(&p->bufs[b]))
      return mg_diag_set(d, MLAGEN_EINVAL, "capture %s: %zu bytes at %p, the buffer has %lld",
                         c->name, c->bytes, c->dst, (long long)mg_plan_buf_bytes(&p->bufs[b]));
  }
  return 0;
}

/* ---- the run ---------------------------------------------------------------------------- */

/* Copies the captured buffers whose last access was step i. */
static void capture(const exec *x, int i) {
  for (int k = 0; k < x->t->n_captures; k++) {
    const mg_cpu_capture *c = &x->t->captures[k];
    int b = mg_plan_find(x->p, c->name);
    if (x->p->bufs[b].last == i) memcpy(c->dst, x->buf[b], c->bytes);
  }
}

/* The forward/backward boundary: forward outputs go to the caller and leave the count;
 * what is live is what the forward saved for the backward. */
static void boundary(exec *x) {
  const mg_plan *p = x->p;
  x->st.peak_fwd = x->tr.peak;
  for (int b = 0; b < p->n_bufs; b++)
    if (p->bufs[b].role == MG_BUF_OUTPUT && p->bufs[b].first < p->n_fwd)
      x->tr.live -= mg_plan_buf_bytes(&p->bufs[b]);
  x->st.saved = x->tr.live;
  x->tr.peak = x->tr.live;
}

int mg_cpu_run(const mg_plan *p, mg_comm *comm, mg_cpu_tensors *t, mg_cpu_stats *stats,
               mg_diag *d) {
  if (stats) memset(stats, 0, sizeof *stats);
  if (!p || !t) return mg_diag_set(d, MLAGEN_EINVAL, "mg_cpu_run: %s is NULL", p ? "t" : "p");
  t->o = t->dq = t->dc_kv = t->dk_rope = t->dw_kv_b = NULL;
  exec state, *x = &state; /* small (buffer pointers); on the stack */
  memset(x, 0, sizeof *x);
  x->p = p;
  x->comm = comm;
  x->t = t;
  x->d = d;
  x->dt = p->args.dtype;
  x->es = mg_dtype_size(x->dt);
  x->P = p->args.sp;
  x->hi = p->n_steps;
  int rc = validate(x);
  if (rc) return rc;
  for (int b = 0; b < p->n_bufs; b++)
    if (p->bufs[b].role == MG_BUF_INPUT) x->input[b] = input_of(t, p->bufs[b].name);

  double t0 = now_s(), t_mid = t0;
  for (int i = 0; i < p->n_steps && !rc; i++) {
    const mg_step *s = &p->steps[i];
    if (i == p->n_fwd) {
      boundary(x);
      t_mid = now_s();
    }
    for (int b = 0; b < p->n_bufs && !rc; b++)
      if (p->bufs[b].role != MG_BUF_INPUT && p->bufs[b].first == i &&
          !(x->buf[b] = tr_alloc(&x->tr, mg_plan_buf_bytes(&p->bufs[b]))))
        rc = mg_diag_set(d, MLAGEN_ENOMEM, "out of memory allocating %s (%lld bytes)",
                         p->bufs[b].name, (long long)mg_plan_buf_bytes(&p->bufs[b]));
    void *ws = NULL;
    if (!rc && s->workspace > 0 && !(ws = tr_alloc(&x->tr, s->workspace)))
      rc = mg_diag_set(d, MLAGEN_ENOMEM, "out of memory allocating the workspace of step %d (%lld "
                       "bytes)", i, (long long)s->workspace);
    if (!rc) rc = step(x, i, ws);
    tr_free(&x->tr, ws, s->workspace);
    if (!rc) capture(x, i);
    for (int b = 0; b < p->n_bufs; b++)
      if (p->bufs[b].role == MG_BUF_TEMP && p->bufs[b].last == i) {
        tr_free(&x->tr, x->buf[b], mg_plan_buf_bytes(&p->bufs[b]));
        x->buf[b] = NULL;
      }
  }
  if (!rc && p->n_fwd == p->n_steps) { /* no backward */
    boundary(x);
    t_mid = now_s();
  }
  const double t1 = now_s();
  if (rc) { /* free everything, outputs included */
    for (int b = 0; b < p->n_bufs; b++)
      if (p->bufs[b].role != MG_BUF_INPUT) free(x->buf[b]);
    return rc;
  }
  x->st.peak_bwd = x->tr.peak;
  x->st.n_allocs = x->tr.n_allocs;
  x->st.seconds_fwd = t_mid - t0;
  x->st.seconds_bwd = t1 - t_mid;
  for (int b = 0; b < p->n_bufs; b++)
    if (p->bufs[b].role == MG_BUF_OUTPUT) *output_slot(t, p->bufs[b].name) = x->buf[b];
  if (stats) *stats = x->st;
  return 0;
}

/* ---- one pass in the caller's memory ------------------------------------------------- */

int mg_cpu_run_pass(const mg_plan *p, mg_comm *comm, mg_pass pass, const mg_cpu_tensors *t,
                    const mg_plan_mem *mem, void *workspace, void *saved, mg_diag *d) {
  if (!p || !t || !mem)
    return mg_diag_set(d, MLAGEN_EINVAL, "mg_cpu_run_pass: %s is NULL", !p ? "p" : !t ? "t" : "mem");
  if (t->n_captures || t->kernel_hook)
    return mg_diag_set(d, MLAGEN_EINVAL, "mg_cpu_run_pass: captures and kernel hooks are for "
                       "mg_cpu_run");
  if ((!workspace && mem->workspace_bytes > 0) || (!saved && mem->saved_bytes > 0))
    return mg_diag_set(d, MLAGEN_EINVAL, "mg_cpu_run_pass: the %s area is NULL, the layout "
                       "needs %lld bytes", workspace ? "saved" : "workspace",
                       (long long)(workspace ? mem->saved_bytes : mem->workspace_bytes));
  mg_cpu_tensors io = *t; /* output slots are the caller's arrays here */
  exec state, *x = &state;
  memset(x, 0, sizeof *x);
  x->p = p;
  x->comm = comm;
  x->t = &io;
  x->d = d;
  x->dt = p->args.dtype;
  x->es = mg_dtype_size(x->dt);
  x->P = p->args.sp;
  x->lo = pass == MG_FWD ? 0 : p->n_fwd;
  x->hi = pass == MG_FWD ? p->n_fwd : p->n_steps;
  int rc = validate(x);
  if (rc) return rc;
  for (int b = 0; b < p->n_bufs; b++) {
    const mg_plan_buf *pbuf = &p->bufs[b];
    if (pbuf->role == MG_BUF_INPUT) {
      x->input[b] = input_of(&io, pbuf->name);
    } else if (pbuf->role == MG_BUF_OUTPUT) {
      x->buf[b] = *output_slot(&io, pbuf->name);
      if (!x->buf[b] && touched(x, b))
        return mg_diag_set(d, MLAGEN_EINVAL, "output %s is NULL", pbuf->name);
    } else {
      x->buf[b] = (char *)(mem->where[b] == MG_MEM_SAVED ? saved : workspace) + mem->offset[b];
    }
  }
  for (int i = x->lo; i < x->hi && !rc; i++) {
    for (int b = 0; b < p->n_bufs; b++) /* as the allocator's calloc: zero before first write */
      if (p->bufs[b].role != MG_BUF_INPUT && p->bufs[b].first == i)
        memset(x->buf[b], 0, (size_t)mg_plan_buf_bytes(&p->bufs[b]));
    void *ws = mem->step_ws[i] >= 0 ? (char *)workspace + mem->step_ws[i] : NULL;
    rc = step(x, i, ws);
  }
  return rc;
}
