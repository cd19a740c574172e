/* mg_plan_check.c: the one check of a plan's steps against its buffers (mg_plan_check.h). */
#include "mg_plan_check.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "mlagen.h"

const char *const mg_plan_input_names[MG_PLAN_N_IO] = {"q", "c_kv", "k_rope", "w_kv_b", "do"};
const char *const mg_plan_output_names[MG_PLAN_N_IO] = {"o", "dq", "dc_kv", "dk_rope", "dw_kv_b"};

/* The step under check. */
typedef struct chk {
  const mg_plan *p;
  const mg_step *s;
  int i;
  mg_diag *d;
} chk;

/* Sets "<form> plan step i (label): <message>" and returns status. */
__attribute__((format(printf, 3, 4)))
static int fail(const chk *c, int status, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return mg_diag_set(c->d, status, "%s plan step %d (%s): %s", mg_form_name(c->p->args.form),
                     c->i, c->s->label, msg);
}

#define NEED(cond, ...) \
  do {                  \
    if (!(cond)) return fail(c, MLAGEN_EINVAL, __VA_ARGS__); \
  } while (0)
#define TRY(e)           \
  do {                   \
    int rc_ = (e);       \
    if (rc_) return rc_; \
  } while (0)

static int64_t last_dim(const mg_plan_buf *b) { return b->ndim ? b->dims[b->ndim - 1] : 1; }
static const mg_plan_buf *in(const chk *c, int k) { return &c->p->bufs[c->s->in[k]]; }
static const mg_plan_buf *out(const chk *c, int k) { return &c->p->bufs[c->s->out[k]]; }

static int arity(const chk *c, int n_in, int n_out) {
  NEED(c->s->n_in == n_in && c->s->n_out == n_out, "takes %d inputs and %d outputs, has %d and %d",
       n_in, n_out, c->s->n_in, c->s->n_out);
  return 0;
}

static int numel_is(const chk *c, const mg_plan_buf *b, int64_t numel) {
  NEED(mg_plan_buf_numel(b) == numel, "%s has %lld elements, the step needs %lld", b->name,
       (long long)mg_plan_buf_numel(b), (long long)numel);
  return 0;
}

static int dtype_is(const chk *c, const mg_plan_buf *b, mg_dtype t) {
  NEED(b->dtype == t, "%s is %s, the step needs %s", b->name, mg_dtype_name(b->dtype),
       mg_dtype_name(t));
  return 0;
}

static int same_dims(const mg_plan_buf *a, const mg_plan_buf *b) {
  if (a->ndim != b->ndim) return 0;
  for (int i = 0; i < a->ndim; i++)
    if (a->dims[i] != b->dims[i]) return 0;
  return 1;
}

/* ---- collectives ------------------------------------------------------------------------ */

static int collective(const chk *c) {
  const mg_step *s = c->s;
  TRY(arity(c, 1, 1));
  const mg_plan_buf *src = in(c, 0), *dst = out(c, 0);
  const int64_t P = c->p->args.sp;
  TRY(dtype_is(c, src, c->p->args.dtype));
  TRY(dtype_is(c, dst, c->p->args.dtype));
  const int seq_head = s->kind == MG_STEP_SEQ_TO_HEAD || s->kind == MG_STEP_HEAD_TO_SEQ;
  /* The sequence-sharded side [B, S_l, (H,) w] and the other side [B, S, (H/P,) w]. */
  const mg_plan_buf *shard = s->kind == MG_STEP_SEQ_TO_HEAD || s->kind == MG_STEP_ALL_GATHER ? src : dst;
  const mg_plan_buf *full = shard == src ? dst : src;
  const int nd = seq_head ? 4 : 3;
  NEED(shard->ndim == nd && full->ndim == nd, "%s and %s must have %d dims", src->name, dst->name, nd);
  const int64_t Bt = shard->dims[0], Sl = shard->dims[1], w = shard->dims[nd - 1];
  const int64_t H = seq_head ? shard->dims[2] : 1;
  int ok = full->dims[0] == Bt && full->dims[1] == Sl * P && full->dims[nd - 1] == w &&
           Sl * P == c->p->args.seq;
  if (seq_head) ok = ok && H % P == 0 && full->dims[2] == H / P;
  NEED(ok, "%s and %s do not match a %s over %d ranks", src->name, dst->name,
       seq_head ? "all-to-all" : "gather/scatter", (int)P);
  /* P > 1: send and receive for an all-to-all, receive for an all-gather, send for a
   * reduce-scatter (mg_plan.c plans it); P = 1: a copy */
  const int64_t in_b = mg_plan_buf_bytes(src), out_b = mg_plan_buf_bytes(dst);
  const int64_t need = P == 1 ? 0 : seq_head ? in_b + out_b : s->kind == MG_STEP_ALL_GATHER ? out_b : in_b;
  NEED(s->workspace >= need, "workspace of %lld bytes, the collective needs %lld",
       (long long)s->workspace, (long long)need);
  return 0;
}

/* ---- GEMM ------------------------------------------------------------------------------- */

/* Operand `which` of a GEMM: `rows` x `cols` stored with leading dimension ld, batch
 * matrices stride apart from off, all inside buffer b. */
static int gemm_operand(const chk *c, const char *which, const mg_plan_buf *b, int64_t rows,
                        int64_t cols, int64_t ld, int64_t off, int64_t stride, int batch) {
  NEED(rows >= 1 && cols >= 1 && batch >= 1 && ld >= cols && off >= 0 && stride >= 0,
       "operand %s (%s): %lld x %lld, ld %lld, offset %lld, stride %lld, batch %d is not a valid "
       "matrix", which, b->name, (long long)rows, (long long)cols, (long long)ld, (long long)off,
       (long long)stride, batch);
  int64_t last = 0, row_end = 0; /* the last element read, overflow-checked */
  NEED(!__builtin_mul_overflow((int64_t)(batch - 1), stride, &last) &&
           !__builtin_add_overflow(last, off, &last) &&
           !__builtin_mul_overflow(rows - 1, ld, &row_end) &&
           !__builtin_add_overflow(last, row_end + cols - 1, &last) &&
           last < mg_plan_buf_numel(b),
       "operand %s reads element %lld of %s, which has %lld", which, (long long)last, b->name,
       (long long)mg_plan_buf_numel(b));
  return 0;
}

static int gemm(const chk *c) {
  const mg_gemm *g = &c->s->gemm;
  TRY(arity(c, g->beta != 0 ? 3 : 2, 1));
  NEED(g->beta == 0 || g->beta == 1, "beta %g: must be 0 or 1", (double)g->beta);
  const mg_plan_buf *A = in(c, 0), *B = in(c, 1), *C = out(c, 0);
  const mg_dtype t = c->p->args.dtype;
  TRY(dtype_is(c, A, t));
  TRY(dtype_is(c, B, t));
  NEED(C->dtype == t || C->dtype == MG_F32, "%s is %s: C must be %s or f32", C->name,
       mg_dtype_name(C->dtype), mg_dtype_name(t));
  NEED(g->beta == 0 || c->s->in[2] == c->s->out[0], "an accumulating GEMM reads C (%s) as its "
       "third input, not %s", C->name, in(c, 2)->name);
  /* a token-contracting GEMM (mg_gemm.tok_k): a varlen plan's, its k token rows inside the
   * sequence, so that the executors' valid rows mg_varlen_valid_rows(T, tok0, k) count them */
  NEED(g->tok_k == 0 || g->tok_k == 1, "tok_k %d: must be 0 or 1", g->tok_k);
  NEED(!g->tok_k || c->p->args.varlen, "tok_k marks a varlen plan's token-contracting GEMM; "
       "this plan is not varlen");
  NEED(g->tok_k ? g->tok0 >= 0 && g->tok0 <= c->p->args.seq - g->k : g->tok0 == 0,
       "tok0 %lld: its %lld token rows must lie inside [0, S = %lld)%s", (long long)g->tok0,
       (long long)g->k, (long long)c->p->args.seq, g->tok_k ? "" : " (and tok0 is 0 without tok_k)");
  TRY(gemm_operand(c, "A", A, g->trans_a ? g->k : g->m, g->trans_a ? g->m : g->k, g->lda,
                   g->off_a, g->stride_a, g->batch));
  TRY(gemm_operand(c, "B", B, g->trans_b ? g->n : g->k, g->trans_b ? g->k : g->n, g->ldb,
                   g->off_b, g->stride_b, g->batch));
  return gemm_operand(c, "C", C, g->m, g->n, g->ldc, g->off_c, g->stride_c, g->batch);
}

/* ---- kernels ---------------------------------------------------------------------------- */

/* The split-key RoPE source of step s (mg_step.split_keys): buffer b [B, S, rope_w] holding
 * k_rope (or its gradient) in columns rope_col .. rope_col + d_r, numel rows x rope_w. */
static int rope_cols(const chk *c, const mg_plan_buf *b, int64_t rows, int64_t dr) {
  const mg_step *s = c->s;
  NEED(s->rope_col >= 0 && s->rope_col + dr <= s->rope_w && last_dim(b) == s->rope_w,
       "rope columns [%lld, %lld) outside %s of width %lld", (long long)s->rope_col,
       (long long)(s->rope_col + dr), b->name, (long long)last_dim(b));
  TRY(numel_is(c, b, rows * s->rope_w));
  return dtype_is(c, b, c->p->args.dtype);
}

/* A split-key RoPE gradient b [rows, d_r] (the attention backward's sum over its heads), in
 * the accumulators' dtype. */
static int rope_grad(const chk *c, const mg_plan_buf *b, int64_t rows, int64_t dr) {
  NEED(last_dim(b) == dr, "%s rows are %lld wide, d_r is %lld", b->name, (long long)last_dim(b),
       (long long)dr);
  TRY(numel_is(c, b, rows * dr));
  return dtype_is(c, b, mg_plan_acc_dtype(c->p));
}

/* MG_OP_ATTN_* and MG_OP_MQA_*: keys over all S tokens (causality is by global position);
 * q [B, S_q, H, d_qk] with S_q = S, or (laga-cp) S_q = S / P with the query positions of
 * mg_step inside [0, S); explicit: k [B, S, H, d_qk], v [B, S, H, d_v], o [B, S_q, H, d_v]
 * (split keys: k_nope [B, S, H, d_n], the latent [B, S, rope_w] last among the inputs, and
 * the backward's dk_rope [B, S, d_r] in the accumulators' dtype last among the outputs);
 * absorbed: c [B, S, d_c + d_r], o [B, S_q, H, d_c]; lse [B, H, S_q] in the accumulators'
 * dtype; the backward's gradients shaped as their inputs and its delta (f32 [B, H, S_q])
 * in the workspace. */
static int attention(const chk *c, const mg_shape *sh) {
  const mg_step *s = c->s;
  const mg_dtype t = c->p->args.dtype;
  const int fwd = s->op == MG_OP_ATTN_FWD || s->op == MG_OP_MQA_FWD;
  const int mqa = s->op == MG_OP_MQA_FWD || s->op == MG_OP_MQA_BWD;
  const int split = s->split_keys;
  NEED(!mqa || !split, "split_keys on the absorbed MQA (its keys are the latent)");
  TRY(arity(c, mqa ? (fwd ? 2 : 5) : (fwd ? 3 : 6) + split, mqa ? 2 : (fwd ? 2 : 3 + split)));
  const int64_t dn = sh->qk_nope_head_dim, dr = sh->qk_rope_head_dim, dc = sh->kv_lora_rank;
  const int64_t dqk = mqa ? dc + dr : dn + dr, dv = mqa ? dc : sh->v_head_dim;
  const mg_plan_buf *q = in(c, 0);
  NEED(q->ndim == 4, "%s must be [B, S, H, d]", q->name);
  const int64_t B = q->dims[0], Sq = q->dims[1], H = q->dims[2], S = c->p->args.seq;
  const int positions = s->q_pos0 || s->q_split || s->q_pos1;
  if (positions) { /* the first bound that fails, named */
    const long long Sl = c->p->seq_local, p0 = s->q_pos0, sp = s->q_split, p1 = s->q_pos1;
    const long long rows = Sq, end0 = p0 + sp, end1 = p1 + (rows - sp);
    char why[160] = "";
    if (mqa || c->p->args.form != MG_FORM_LAGA_CP)
      snprintf(why, sizeof why, "only laga-cp's explicit attention places S / P rows at "
               "increasing positions inside [0, S = %lld)", (long long)S);
    else if (rows != Sl)
      snprintf(why, sizeof why, "laga-cp's attention takes S / P = %lld rows, not %lld", Sl, rows);
    else if (sp < 0 || sp > rows)
      snprintf(why, sizeof why, "q_split must be in [0, %lld] (the rows)", rows);
    else if (p0 < 0)
      snprintf(why, sizeof why, "q_pos0 must be >= 0");
    else if (p1 < end0)
      snprintf(why, sizeof why, "q_pos1 must be >= q_pos0 + q_split = %lld (increasing "
               "positions)", end0);
    else if (sp > 0 && end0 > S)
      snprintf(why, sizeof why, "the first chunk ends at q_pos0 + q_split = %lld, past S = %lld",
               end0, (long long)S);
    else if (sp < rows && end1 > S)
      snprintf(why, sizeof why, "the second chunk ends at q_pos1 + (rows - q_split) = %lld, "
               "past S = %lld", end1, (long long)S);
    NEED(!why[0], "query positions (q_pos0 %lld, q_split %lld, q_pos1 %lld) of %s's %lld rows: %s",
         p0, sp, p1, q->name, rows, why);
  } else {
    NEED(Sq == S, "%s covers %lld tokens, the attention needs all S = %lld (or query "
         "positions)", q->name, (long long)Sq, (long long)S);
  }
  NEED(q->dims[3] == dqk, "%s rows are %lld wide, the kernels take %lld", q->name,
       (long long)q->dims[3], (long long)dqk);
  NEED(H <= INT_MAX, "%s has %lld heads", q->name, (long long)H);
  const int64_t nv = B * S * H * dv, no = B * Sq * H * dv, nl = B * H * Sq;
  const mg_plan_buf *o = mqa ? (fwd ? out(c, 0) : in(c, 2)) : (fwd ? out(c, 0) : in(c, 3));
  const mg_plan_buf *lse = mqa ? (fwd ? out(c, 1) : in(c, 3)) : (fwd ? out(c, 1) : in(c, 4));
  TRY(dtype_is(c, q, t));
  if (mqa) {
    NEED(last_dim(in(c, 1)) == dqk, "%s must be [B, S, %lld]", in(c, 1)->name, (long long)dqk);
    TRY(numel_is(c, in(c, 1), B * S * dqk));
    TRY(dtype_is(c, in(c, 1), t));
  } else {
    const mg_plan_buf *k = in(c, 1);
    const int64_t dk = split ? dn : dqk;
    NEED(k->ndim == 4 && k->dims[0] == B && k->dims[1] == S && k->dims[2] == H && k->dims[3] == dk,
         "%s must be [B, S, H, %s] = [%lld, %lld, %lld, %lld]", k->name, split ? "d_n (split keys)"
         : "d_qk", (long long)B, (long long)S, (long long)H, (long long)dk);
    if (split) TRY(rope_cols(c, in(c, fwd ? 3 : 6), B * S, dr));
    NEED(last_dim(in(c, 2)) == dv, "%s rows are %lld wide, d_v is %lld", in(c, 2)->name,
         (long long)last_dim(in(c, 2)), (long long)dv);
    TRY(numel_is(c, in(c, 2), nv));
    TRY(dtype_is(c, in(c, 1), t));
    TRY(dtype_is(c, in(c, 2), t));
  }
  NEED(last_dim(o) == dv, "%s rows are %lld wide, the values are %lld", o->name,
       (long long)last_dim(o), (long long)dv);
  TRY(numel_is(c, o, no));
  TRY(dtype_is(c, o, t));
  TRY(numel_is(c, lse, nl));
  TRY(dtype_is(c, lse, mg_plan_acc_dtype(c->p)));
  if (fwd) return 0;
  const mg_plan_buf *dout = in(c, mqa ? 4 : 5);
  TRY(numel_is(c, dout, no));
  TRY(dtype_is(c, dout, t));
  for (int k = 0; k < s->n_out - split; k++) {
    TRY(numel_is(c, out(c, k), mg_plan_buf_numel(in(c, k))));
    TRY(dtype_is(c, out(c, k), t));
  }
  if (split) TRY(rope_grad(c, out(c, 3), B * S, dr)); /* dk_rope, summed over the heads */
  NEED(s->workspace >= 4 * nl, "workspace of %lld bytes, the backward's delta needs %lld "
       "(mg_plan_kernel)", (long long)s->workspace, (long long)(4 * nl));
  return 0;
}

static int kernel(const chk *c) {
  const mg_step *s = c->s;
  const mg_shape *sh = &c->p->shape;
  const int64_t dn = sh->qk_nope_head_dim, dr = sh->qk_rope_head_dim, dv = sh->v_head_dim,
                dc = sh->kv_lora_rank;
  const mg_dtype t = c->p->args.dtype;
  const int split_op = s->op == MG_OP_ATTN_FWD || s->op == MG_OP_ATTN_BWD ||
                       s->op == MG_OP_EXPAND_KV || s->op == MG_OP_SPLIT_DKV;
  NEED(s->split_keys == 0 || (s->split_keys == 1 && split_op),
       "split_keys %d: 0 or 1, and 1 only on attention, expand_kv and split_dkv steps",
       s->split_keys);
  switch (s->op) {
    case MG_OP_ATTN_FWD:
    case MG_OP_ATTN_BWD:
    case MG_OP_MQA_FWD:
    case MG_OP_MQA_BWD: return attention(c, sh);
    case MG_OP_EXPAND_KV:
    case MG_OP_SPLIT_DKV: {
      /* packed: kv, rope -> k, v and dk, dv -> dkv, drope; split keys: kv -> k_nope, v and
       * dk_nope, dv, dk_rope -> dkv, drope (mg_plan.h) */
      const int expand = s->op == MG_OP_EXPAND_KV, split = s->split_keys;
      TRY(arity(c, expand ? 2 - split : 2 + split, 2));
      const mg_plan_buf *big = in(c, 0); /* kv or dk: [B, S, Hk, w] */
      const int64_t w0 = expand ? dn + dv : split ? dn : dn + dr, wk = split ? dn : dn + dr;
      NEED(big->ndim == 4 && last_dim(big) == w0, "%s must be [B, S, H, %lld]", big->name,
           (long long)w0);
      const int64_t rows = big->dims[0] * big->dims[1], H = big->dims[2];
      if (!expand) TRY(rope_cols(c, out(c, 1), rows, dr));
      else if (!split) TRY(rope_cols(c, in(c, 1), rows, dr));
      if (expand) {
        TRY(numel_is(c, out(c, 0), rows * H * wk));
        TRY(numel_is(c, out(c, 1), rows * H * dv));
      } else {
        TRY(numel_is(c, in(c, 1), rows * H * dv));
        TRY(numel_is(c, out(c, 0), rows * H * (dn + dv)));
      }
      if (!expand && split) TRY(rope_grad(c, in(c, 2), rows, dr)); /* the attention backward's head sum */
      for (int k = 0; k < 2; k++) {
        TRY(dtype_is(c, in(c, k), t));
        TRY(dtype_is(c, out(c, k), t));
      }
      return 0;
    }
    case MG_OP_CONCAT_LATENT:
    case MG_OP_SPLIT_LATENT: {
      const int concat = s->op == MG_OP_CONCAT_LATENT;
      TRY(arity(c, concat ? 2 : 1, concat ? 1 : 2));
      const mg_plan_buf *ckv = concat ? in(c, 0) : out(c, 0), *kr = concat ? in(c, 1) : out(c, 1),
                        *lat = concat ? out(c, 0) : in(c, 0);
      NEED(last_dim(ckv) == dc && last_dim(kr) == dr && last_dim(lat) == dc + dr,
           "%s, %s and %s must be d_c, d_r and d_c + d_r wide", ckv->name, kr->name, lat->name);
      const int64_t rows = mg_plan_buf_numel(ckv) / dc;
      TRY(numel_is(c, ckv, rows * dc));
      TRY(numel_is(c, kr, rows * dr));
      TRY(numel_is(c, lat, rows * (dc + dr)));
      TRY(dtype_is(c, ckv, t));
      TRY(dtype_is(c, kr, t));
      return dtype_is(c, lat, t);
    }
    case MG_OP_CHUNK_ORDER: {
      TRY(arity(c, 1, 1));
      const mg_plan_buf *src = in(c, 0), *dst = out(c, 0);
      NEED(src->ndim == 3 && same_dims(src, dst), "%s and %s must be [B, S, w] alike", src->name,
           dst->name);
      NEED(s->ranks >= 1 && src->dims[1] % s->ranks == 0 && (s->inverse == 0 || s->inverse == 1),
           "ranks %lld must divide the %lld tokens of %s (inverse %d: 0 or 1)",
           (long long)s->ranks, (long long)src->dims[1], src->name, s->inverse);
      TRY(dtype_is(c, src, t));
      return dtype_is(c, dst, t);
    }
    case MG_OP_COPY_COLS: {
      TRY(arity(c, 1, 1));
      const mg_plan_buf *src = in(c, 0), *dst = out(c, 0);
      const int64_t sw = s->src_w ? s->src_w : last_dim(src), dw = s->dst_w ? s->dst_w : last_dim(dst);
      NEED(sw > 0 && dw > 0 && mg_plan_buf_numel(src) % sw == 0,
           "row width %lld does not divide the %lld elements of %s", (long long)sw,
           (long long)mg_plan_buf_numel(src), src->name);
      const int64_t rows = mg_plan_buf_numel(src) / sw;
      NEED(s->cols >= 0 && s->src_col >= 0 && s->dst_col >= 0 && s->src_col + s->cols <= sw &&
               s->dst_col + s->cols <= dw,
           "columns [%lld, +%lld) -> [%lld, +%lld) outside widths %lld and %lld",
           (long long)s->src_col, (long long)s->cols, (long long)s->dst_col, (long long)s->cols,
           (long long)sw, (long long)dw);
      TRY(numel_is(c, dst, rows * dw));
      NEED(src->dtype == dst->dtype, "%s is %s, %s is %s", src->name, mg_dtype_name(src->dtype),
           dst->name, mg_dtype_name(dst->dtype));
      return 0;
    }
  }
  return fail(c, MLAGEN_EINVAL, "unknown kernel op %d", (int)s->op);
}

/* ---- the plan --------------------------------------------------------------------------- */

static int known(const char *name, const char *const *names) {
  for (int k = 0; k < MG_PLAN_N_IO; k++)
    if (!strcmp(name, names[k])) return 1;
  return 0;
}

/* Buffers: dims, dtypes, names. */
static int check_bufs(const mg_plan *p, mg_diag *d) {
  const char *form = mg_form_name(p->args.form);
  const mg_dtype t = p->args.dtype, acc = mg_plan_acc_dtype(p);
  for (int b = 0; b < p->n_bufs; b++) {
    const mg_plan_buf *pb = &p->bufs[b];
    if (pb->ndim < 0 || pb->ndim > MG_PLAN_MAX_DIMS)
      return mg_diag_set(d, MLAGEN_EINVAL, "%s plan: buffer %s has %d dims", form, pb->name, pb->ndim);
    for (int k = 0; k < pb->ndim; k++)
      if (pb->dims[k] < 1)
        return mg_diag_set(d, MLAGEN_EINVAL, "%s plan: buffer %s is empty (dim %d is %lld)", form,
                           pb->name, k, (long long)pb->dims[k]);
    if (pb->dtype != t && pb->dtype != acc)
      return mg_diag_set(d, MLAGEN_EINVAL, "%s plan: buffer %s is %s, the plan computes in %s "
                         "(accumulators %s)", form, pb->name, mg_dtype_name(pb->dtype),
                         mg_dtype_name(t), mg_dtype_name(acc));
    if ((pb->role == MG_BUF_INPUT && !known(pb->name, mg_plan_input_names)) ||
        (pb->role == MG_BUF_OUTPUT && !known(pb->name, mg_plan_output_names)))
      return mg_diag_set(d, MLAGEN_EINVAL, "%s plan: unknown %s %s", form,
                         pb->role == MG_BUF_INPUT ? "input" : "output", pb->name);
    if (pb->role != MG_BUF_INPUT && pb->role != MG_BUF_OUTPUT && pb->role != MG_BUF_TEMP)
      return mg_diag_set(d, MLAGEN_EINVAL, "%s plan: buffer %s has role %d", form, pb->name,
                         (int)pb->role);
  }
  return 0;
}

/* Steps' argument lists and liveness: ids in range, no input written, nothing read before
 * it is written, every non-input written, and first/last as the steps give them. */
static int check_lists(const mg_plan *p, mg_diag *d) {
  const char *form = mg_form_name(p->args.form);
  int first[MG_PLAN_MAX_BUFS], last[MG_PLAN_MAX_BUFS];
  for (int b = 0; b < p->n_bufs; b++) first[b] = last[b] = -1;
  for (int i = 0; i < p->n_steps; i++) {
    const mg_step *s = &p->steps[i];
    const chk c = {p, s, i, d};
    if (s->n_in < 0 || s->n_in > MG_STEP_MAX_ARGS || s->n_out < 0 || s->n_out > MG_STEP_MAX_ARGS)
      return fail(&c, MLAGEN_EINVAL, "malformed argument lists (%d inputs, %d outputs)", s->n_in,
                  s->n_out);
    if (s->pass != (i < p->n_fwd ? MG_FWD : MG_BWD))
      return fail(&c, MLAGEN_EINVAL, "a %s step after the forward's %d steps",
                  s->pass == MG_FWD ? "forward" : "backward", p->n_fwd);
    if (s->workspace < 0) return fail(&c, MLAGEN_EINVAL, "negative workspace");
    for (int k = 0; k < s->n_in + s->n_out; k++) {
      const int id = k < s->n_in ? s->in[k] : s->out[k - s->n_in];
      if (id < 0 || id >= p->n_bufs)
        return fail(&c, MLAGEN_EINVAL, "%s %d: buffer id %d out of range", k < s->n_in ? "input" :
                    "output", k < s->n_in ? k : k - s->n_in, id);
    }
    for (int k = 0; k < s->n_in; k++) {
      const mg_plan_buf *b = &p->bufs[s->in[k]];
      if (b->role != MG_BUF_INPUT && first[s->in[k]] < 0)
        return mg_diag_set(d, MLAGEN_EINVAL, "%s plan: step %d (%s) reads %s before it is written",
                           form, i, s->label, b->name);
      last[s->in[k]] = i;
    }
    for (int k = 0; k < s->n_out; k++) {
      const mg_plan_buf *b = &p->bufs[s->out[k]];
      if (b->role == MG_BUF_INPUT)
        return mg_diag_set(d, MLAGEN_EINVAL, "%s plan: step %d (%s) writes the input %s", form,
                           i, s->label, b->name);
      if (first[s->out[k]] < 0) first[s->out[k]] = i;
      last[s->out[k]] = i;
    }
  }
  for (int b = 0; b < p->n_bufs; b++) {
    const mg_plan_buf *pb = &p->bufs[b];
    if (pb->role != MG_BUF_INPUT && first[b] < 0)
      return mg_diag_set(d, MLAGEN_EINVAL, "%s plan: %s is never written", form, pb->name);
    if (pb->role != MG_BUF_INPUT && (pb->first != first[b] || pb->last != last[b]))
      return mg_diag_set(d, MLAGEN_EINVAL, "%s plan: buffer %s lives over steps [%d, %d], its "
                         "steps say [%d, %d] (mg_plan_build finalizes plans)", form, pb->name,
                         pb->first, pb->last, first[b], last[b]);
  }
  return 0;
}

int mg_plan_check(const mg_plan *p, mg_diag *d) {
  if (!p) return mg_diag_set(d, MLAGEN_EINVAL, "plan check: plan is NULL");
  if (p->n_bufs < 0 || p->n_bufs > MG_PLAN_MAX_BUFS || p->n_steps < 0 ||
      p->n_steps > MG_PLAN_MAX_STEPS || p->n_fwd < 0 || p->n_fwd > p->n_steps)
    return mg_diag_set(d, MLAGEN_EINVAL, "malformed plan (%d buffers, %d steps, forward %d)",
                       p->n_bufs, p->n_steps, p->n_fwd);
  if ((unsigned)p->args.form >= MG_FORM_COUNT || p->args.sp < 1 || p->args.seq < 1)
    return mg_diag_set(d, MLAGEN_EINVAL, "malformed plan (form %d, sp %d, seq %lld)",
                       (int)p->args.form, p->args.sp, (long long)p->args.seq);
  if (p->args.varlen && p->args.batch != 1)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s plan: varlen with batch %d (a varlen plan has "
                       "batch 1: one stream of documents)", mg_form_name(p->args.form),
                       p->args.batch);
  int rc = check_bufs(p, d);
  if (!rc) rc = check_lists(p, d);
  for (int i = 0; i < p->n_steps && !rc; i++) {
    const chk c = {p, &p->steps[i], i, d};
    switch (c.s->kind) {
      case MG_STEP_SEQ_TO_HEAD:
      case MG_STEP_HEAD_TO_SEQ:
      case MG_STEP_ALL_GATHER:
      case MG_STEP_REDUCE_SCATTER: rc = collective(&c); break;
      case MG_STEP_GEMM: rc = gemm(&c); break;
      case MG_STEP_KERNEL: rc = kernel(&c); break;
      default: rc = fail(&c, MLAGEN_EINVAL, "unknown step kind %d", (int)c.s->kind);
    }
  }
  return rc;
}

int mg_plan_check_gemm_int(const mg_plan *p, const char *lib, mg_diag *d) {
  for (int i = 0; i < p->n_steps; i++) {
    const chk c = {p, &p->steps[i], i, d};
    const mg_gemm *g = &c.s->gemm;
    if (c.s->kind != MG_STEP_GEMM) continue;
    const struct { const char *which; int64_t a, b, ld; } ops[] = {
        {"A", g->m, g->k, g->lda}, {"B", g->k, g->n, g->ldb}, {"C", g->m, g->n, g->ldc}};
    for (int k = 0; k < 3; k++)
      if (ops[k].a > INT_MAX || ops[k].b > INT_MAX || ops[k].ld > INT_MAX)
        return fail(&c, MLAGEN_EUNSUPPORTED, "operand %s (%s) exceeds %s's int dimensions",
                    ops[k].which, p->bufs[k < 2 ? c.s->in[k] : c.s->out[0]].name, lib);
  }
  return 0;
}
