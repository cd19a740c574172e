/* mg_cuda_exec.c: the CUDA executor's orchestration over mg_dev_ops (see mg_cuda_exec.h).
 *
 * prepare: lay out memory, check every step (one function per step kind, run = 0), build
 * the kernels. run: the same functions with run = 1 queue the pass's work. */
#include "mg_cuda_exec.h"

#include <cJSON.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mg_module.h"
#include "mg_plan_mem.h"
#include "mg_spec.h"
#include "mg_tune.h"
#include "mlagen.h"

#define MAX_PARAMS 24
#define STEP_KERNELS 3

typedef struct kparam {
  char name[32];
  char kind; /* 'p' pointer, 'i' int, 'f' float */
} kparam;

typedef struct kern {
  char name[160];
  char why[320]; /* which configuration, and why (mg_tune_lookup's words) */
  void *handle;
  mg_launch_rule rule;
  int n_params;
  kparam params[MAX_PARAMS];
} kern;

struct mg_cuda_exec {
  const mg_plan *p;
  mg_dev_ops *ops;
  mg_plan_mem mem;
  int64_t blas_off; /* the GEMMs' scratch in the workspace (mg_cuda_exec_mem_layout); -1: none */
  double timeout_s;
  char tune_dir[4096]; /* opts->tune_dir, "" for mg_tune_store_dir() */
  mg_gen *gen; /* during prepare only */
  kern *kerns;
  int n_kerns, cap;
  int step_k[MG_PLAN_MAX_STEPS][STEP_KERNELS]; /* indexes into kerns, -1: none */
};

/* One pass's state. */
typedef struct run {
  mg_cuda_exec *x;
  const mg_plan *p;
  int go;     /* 0: check (prepare), 1: queue the work */
  void *buf[MG_PLAN_MAX_BUFS];
  char *ws;   /* the workspace */
  mg_comm *comm;
  void *stream;
  mg_diag *d;
} run;

/* Sets "<form> plan step i (label): <message>" and returns status. */
__attribute__((format(printf, 4, 5)))
static int step_error(const run *r, int i, int status, const char *fmt, ...) {
  char msg[700];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return mg_diag_set(r->d, status, "%s plan step %d (%s): %s", mg_form_name(r->p->args.form), i,
                     r->p->steps[i].label, msg);
}

/* Prefixes the message already in d (from ops, comm or the generator) with the step. */
static int step_prefix(const run *r, int i, int rc) {
  if (rc) mg_diag_prefix(r->d, "%s plan step %d (%s)", mg_form_name(r->p->args.form), i,
                         r->p->steps[i].label);
  return rc;
}

static const mg_plan_buf *pb(const run *r, int id) { return &r->p->bufs[id]; }
static int64_t last_dim(const mg_plan_buf *b) { return b->ndim ? b->dims[b->ndim - 1] : 1; }
static size_t es(mg_dtype t) { return mg_dtype_size(t); }

#define NEED(cond, ...)                                         \
  do {                                                          \
    if (!(cond)) return step_error(r, i, MLAGEN_EINVAL, __VA_ARGS__); \
  } while (0)
#define TRY(e)             \
  do {                     \
    int rc_ = (e);         \
    if (rc_) return rc_;   \
  } while (0)

static int arity(const run *r, int i, int n_in, int n_out) {
  const mg_step *s = &r->p->steps[i];
  NEED(s->n_in == n_in && s->n_out == n_out, "takes %d inputs and %d outputs, has %d and %d", n_in,
       n_out, s->n_in, s->n_out);
  return 0;
}

static int numel_is(const run *r, int i, const mg_plan_buf *b, int64_t numel) {
  NEED(mg_plan_buf_numel(b) == numel, "%s has %lld elements, the step needs %lld", b->name,
       (long long)mg_plan_buf_numel(b), (long long)numel);
  return 0;
}

static int dtype_is(const run *r, int i, const mg_plan_buf *b, mg_dtype t) {
  NEED(b->dtype == t, "%s is %s, the step needs %s", b->name, mg_dtype_name(b->dtype),
       mg_dtype_name(t));
  return 0;
}

/* ---- kernels: preparation ------------------------------------------------------------- */

static const char *spec_dtype(const mg_plan *p) { return p->args.dtype == MG_F16 ? "fp16" : "bf16"; }

static char param_kind(const char *type) {
  size_t n = strlen(type);
  if (n && type[n - 1] == '*') return 'p';
  if (!strcmp(type, "int")) return 'i';
  if (!strcmp(type, "float")) return 'f';
  return 0;
}

/* Makes kernel `family` (heads, dims) available to step i in slot; reuses a kernel already
 * loaded under the same name. */
static int want_kernel(run *r, int i, int slot, const char *family, int heads, int dn, int dr,
                       int dv, int dc) {
  mg_cuda_exec *x = r->x;
  if (r->go) return 0;
  mg_kernel_spec s;
  memset(&s, 0, sizeof s);
  snprintf(s.family, sizeof s.family, "%s", family);
  s.heads = heads, s.d_n = dn, s.d_r = dr, s.d_v = dv, s.d_c = dc;
  snprintf(s.dtype, sizeof s.dtype, "%s", spec_dtype(r->p));
  /* causality changes only the attention kernels; the others are generated non-causal
   * (their code does not depend on it), so both plans share them */
  static const char *const causal_families[] = {"attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq",
                                                "mqa_fwd", "mqa_bwd_dkv", "mqa_bwd_dq"};
  for (size_t c = 0; c < sizeof causal_families / sizeof *causal_families; c++)
    if (!strcmp(family, causal_families[c])) s.causal = r->p->args.causal;
  /* the interface the steps below are written for, and a tuned configuration for this
   * device, shape and sequence bucket when the ops know their device and the store has
   * one (docs/tuning.md); else the template's default */
  char why[sizeof x->kerns[0].why] = "default: no device to look up tuned configurations for";
  mg_kernel_spec chosen = s;
  mg_kernel k;
  int rc;
  if (x->ops->arch[0]) {
    rc = mg_tune_choose(x->gen, x->tune_dir[0] ? x->tune_dir : NULL, x->ops->arch,
                        x->ops->device, &s, mg_form_name(r->p->args.form), r->p->args.seq,
                        &chosen, why, sizeof why, &k, r->d);
  } else {
    mg_spec_plan_tunables(&chosen);
    rc = mg_gen_kernel(x->gen, &chosen, &k, r->d);
  }
  if (rc) return step_prefix(r, i, rc);
  for (int j = 0; j < x->n_kerns; j++)
    if (!strcmp(x->kerns[j].name, k.name)) {
      x->step_k[i][slot] = j;
      mg_kernel_free(&k);
      return 0;
    }
  if (x->n_kerns == x->cap) {
    int cap = x->cap ? 2 * x->cap : 16;
    kern *nk = realloc(x->kerns, (size_t)cap * sizeof *nk);
    if (!nk) {
      mg_kernel_free(&k);
      return mg_diag_set(r->d, MLAGEN_ENOMEM, "CUDA executor: out of memory");
    }
    x->kerns = nk, x->cap = cap;
  }
  kern *e = &x->kerns[x->n_kerns];
  memset(e, 0, sizeof *e);
  snprintf(e->name, sizeof e->name, "%s", k.name);
  snprintf(e->why, sizeof e->why, "%s", why);
  rc = mg_launch_rule_parse(cJSON_GetObjectItemCaseSensitive(k.manifest, "launch"), k.name,
                            &e->rule, r->d);
  const cJSON *params = cJSON_GetObjectItemCaseSensitive(k.manifest, "params"), *it;
  if (!rc && (!cJSON_IsArray(params) || cJSON_GetArraySize(params) > MAX_PARAMS))
    rc = mg_diag_set(r->d, MLAGEN_EINVAL, "kernel %s: manifest params missing or over %d",
                     k.name, MAX_PARAMS);
  if (!rc) cJSON_ArrayForEach(it, params) {
      const cJSON *nm = cJSON_GetObjectItemCaseSensitive(it, "name");
      const cJSON *ty = cJSON_GetObjectItemCaseSensitive(it, "type");
      kparam *kp = &e->params[e->n_params++];
      if (!cJSON_IsString(nm) || !cJSON_IsString(ty) || !(kp->kind = param_kind(ty->valuestring)) ||
          strlen(nm->valuestring) >= sizeof kp->name) {
        rc = mg_diag_set(r->d, MLAGEN_EINVAL, "kernel %s: manifest parameter %d has no name or "
                         "an unknown type", k.name, e->n_params - 1);
        break;
      }
      snprintf(kp->name, sizeof kp->name, "%s", nm->valuestring);
    }
  if (!rc) rc = x->ops->load(x->ops, &k, &e->rule, &e->handle, r->d);
  mg_kernel_free(&k);
  if (rc) return step_prefix(r, i, rc);
  x->step_k[i][slot] = x->n_kerns++;
  return 0;
}

/* ---- kernels: launching -------------------------------------------------------------- */

typedef struct karg {
  const char *name;
  char kind;
  void *p;
  int64_t i;
  float f;
  int i32; /* the launch's copy of i */
} karg;

typedef struct kargs {
  int n;
  karg a[MAX_PARAMS];
} kargs;

static void ap(kargs *a, const char *name, const void *p) {
  a->a[a->n++] = (karg){.name = name, .kind = 'p', .p = (void *)p};
}
static void ai(kargs *a, const char *name, int64_t v) {
  a->a[a->n++] = (karg){.name = name, .kind = 'i', .i = v};
}
static void af(kargs *a, const char *name, float v) {
  a->a[a->n++] = (karg){.name = name, .kind = 'f', .f = v};
}

/* Launches the kernel in slot of step i with the arguments a (matched to the manifest's
 * parameters by name) over the grid of its rule for batch and seqlen. */
static int launch(run *r, int i, int slot, kargs *a, int64_t batch, int64_t seqlen) {
  if (!r->go) return 0;
  const kern *k = &r->x->kerns[r->x->step_k[i][slot]];
  void *params[MAX_PARAMS];
  for (int j = 0; j < k->n_params; j++) {
    karg *m = NULL;
    for (int q = 0; q < a->n && !m; q++)
      if (!strcmp(a->a[q].name, k->params[j].name)) m = &a->a[q];
    if (!m || m->kind != k->params[j].kind)
      return step_error(r, i, MLAGEN_EINVAL, "kernel %s: parameter %s (%c) %s", k->name,
                        k->params[j].name, k->params[j].kind,
                        m ? "has another type than the executor's" : "is not one the executor knows");
    if (m->kind == 'i') {
      if (m->i < INT_MIN || m->i > INT_MAX)
        return step_error(r, i, MLAGEN_EUNSUPPORTED, "kernel %s: %s = %lld exceeds int", k->name,
                          m->name, (long long)m->i);
      m->i32 = (int)m->i;
      params[j] = &m->i32;
    } else {
      params[j] = m->kind == 'f' ? (void *)&m->f : (void *)&m->p;
    }
  }
  if (batch > LONG_MAX || seqlen > LONG_MAX)
    return step_error(r, i, MLAGEN_ELIMIT, "kernel %s: launch sizes too large", k->name);
  mg_launch_dims dims = {.batch = (long)batch, .seqlen_q = (long)seqlen, .seqlen_k = (long)seqlen};
  unsigned grid[3];
  int rc = mg_launch_grid(&k->rule, &dims, grid, r->d);
  if (rc) return step_error(r, i, rc, "kernel %s: %s", k->name, mg_diag_msg(r->d));
  if (!grid[0] || !grid[1] || !grid[2]) return 0;
  return step_prefix(r, i, r->x->ops->launch(r->x->ops, k->handle, grid, k->rule.block,
                                              k->rule.smem, params, r->stream, r->d));
}

/* The grid size of the layout kernels, which stride over their rows: one CTA per row, up
 * to 2^20 CTAs. */
static int64_t layout_grid(int64_t rows) { return rows < (1 << 20) ? rows : (1 << 20); }

/* ---- device operations with the step in messages --------------------------------------- */

static int d_copy(run *r, int i, void *dst, const void *src, int64_t bytes) {
  if (!r->go || bytes <= 0) return 0;
  return step_prefix(r, i, r->x->ops->copy(r->x->ops, dst, src, (size_t)bytes, r->stream, r->d));
}

static int d_copy2d(run *r, int i, void *dst, int64_t dpitch, const void *src, int64_t spitch,
                    int64_t width, int64_t height) {
  if (!r->go || width <= 0 || height <= 0) return 0;
  return step_prefix(r, i, r->x->ops->copy2d(r->x->ops, dst, (size_t)dpitch, src, (size_t)spitch,
                                              (size_t)width, (size_t)height, r->stream, r->d));
}

/* ---- collectives ---------------------------------------------------------------------- */

static int collective(run *r, int i) {
  const mg_step *s = &r->p->steps[i];
  TRY(arity(r, i, 1, 1));
  const mg_plan_buf *src = pb(r, s->in[0]), *dst = pb(r, s->out[0]);
  const int64_t P = r->p->args.sp;
  const mg_dtype t = r->p->args.dtype;
  TRY(dtype_is(r, i, src, t));
  TRY(dtype_is(r, i, dst, t));
  const int seq_head = s->kind == MG_STEP_SEQ_TO_HEAD || s->kind == MG_STEP_HEAD_TO_SEQ;
  const mg_plan_buf *shard =
      s->kind == MG_STEP_SEQ_TO_HEAD || s->kind == MG_STEP_ALL_GATHER ? src : dst;
  const mg_plan_buf *full = shard == src ? dst : src;
  const int nd = seq_head ? 4 : 3;
  NEED(shard->ndim == nd && full->ndim == nd, "%s and %s must have %d dims", src->name, dst->name,
       nd);
  const int64_t Bt = shard->dims[0], Sl = shard->dims[1], w = shard->dims[nd - 1];
  const int64_t H = seq_head ? shard->dims[2] : 1, Hl = seq_head ? H / P : 1;
  int ok = full->dims[0] == Bt && full->dims[1] == Sl * P && full->dims[nd - 1] == w &&
           Sl * P == r->p->args.seq;
  if (seq_head) ok = ok && H % P == 0 && full->dims[2] == Hl;
  NEED(ok, "%s and %s do not match a %s over %d ranks", src->name, dst->name,
       seq_head ? "all-to-all" : "gather/scatter", (int)P);
  const int64_t in_b = mg_plan_buf_bytes(src), out_b = mg_plan_buf_bytes(dst);
  if (P == 1) return d_copy(r, i, r->buf[s->out[0]], r->buf[s->in[0]], in_b);
  const int64_t need = seq_head ? in_b + out_b : s->kind == MG_STEP_ALL_GATHER ? out_b : in_b;
  NEED(s->workspace >= need && r->x->mem.step_ws[i] >= 0, "staging of %lld bytes, needs %lld",
       (long long)s->workspace, (long long)need);
  if (seq_head) {
    TRY(want_kernel(r, i, 0, "a2a_pack", (int)H, 0, 0, 0, 0));
    TRY(want_kernel(r, i, 1, "a2a_unpack", (int)H, 0, 0, 0, 0));
  }
  if (!r->go) return 0;
  char *send = r->ws + r->x->mem.step_ws[i], *recv = send + in_b;
  const size_t count = (size_t)(Bt * Sl * Hl * w);
  const int64_t blk = (int64_t)count * (int64_t)es(t);
  mg_comm *c = r->comm;
  const void *in = r->buf[s->in[0]];
  void *out = r->buf[s->out[0]];
  int rc = 0;
  if (seq_head) {
    const int dir = s->kind == MG_STEP_HEAD_TO_SEQ;
    kargs a = {0};
    ap(&a, "src", in), ap(&a, "send", send), ai(&a, "seqlen_local", Sl), ai(&a, "batch", Bt);
    ai(&a, "heads_total", H), ai(&a, "sp", P), ai(&a, "width", w), ai(&a, "direction", dir);
    TRY(launch(r, i, 0, &a, Bt, Sl));
    rc = step_prefix(r, i, c->ops->all_to_all(c, send, recv, count, t, r->d));
    if (rc) return rc;
    kargs u = {0};
    ap(&u, "recv", recv), ap(&u, "dst", out), ai(&u, "seqlen_local", Sl), ai(&u, "batch", Bt);
    ai(&u, "heads_total", H), ai(&u, "sp", P), ai(&u, "width", w), ai(&u, "direction", dir);
    return launch(r, i, 1, &u, Bt, Sl);
  }
  const int64_t row = Sl * w * (int64_t)es(t); /* one batch item of one rank's tokens */
  if (s->kind == MG_STEP_ALL_GATHER) {
    rc = step_prefix(r, i, c->ops->all_gather(c, in, send, count, t, r->d));
    for (int64_t q = 0; !rc && q < P; q++) /* block q = rank q's tokens -> rows q S_l.. */
      rc = d_copy2d(r, i, (char *)out + q * row, P * row, send + q * blk, row, row, Bt);
    return rc;
  }
  for (int64_t q = 0; !rc && q < P; q++) /* reduce-scatter: block q = rank q's tokens */
    rc = d_copy2d(r, i, send + q * blk, row, (const char *)in + q * row, P * row, row, Bt);
  if (!rc) rc = step_prefix(r, i, c->ops->reduce_scatter(c, send, out, count, t, r->d));
  return rc;
}

/* ---- GEMM ------------------------------------------------------------------------------ */

static int gemm_operand(const run *r, int i, const char *which, const mg_plan_buf *b,
                        int64_t rows, int64_t cols, int64_t ld, int64_t off, int64_t stride,
                        int batch) {
  NEED(rows >= 1 && cols >= 1 && batch >= 1 && ld >= cols && off >= 0 && stride >= 0,
       "operand %s (%s): %lld x %lld, ld %lld, offset %lld, stride %lld, batch %d is not a valid "
       "matrix", which, b->name, (long long)rows, (long long)cols, (long long)ld, (long long)off,
       (long long)stride, batch);
  if (rows > INT_MAX || cols > INT_MAX || ld > INT_MAX)
    return step_error(r, i, MLAGEN_EUNSUPPORTED, "operand %s (%s) exceeds cuBLAS's int dims",
                      which, b->name);
  const int64_t last = off + (int64_t)(batch - 1) * stride + (rows - 1) * ld + cols - 1;
  NEED(last < mg_plan_buf_numel(b), "operand %s reads element %lld of %s, which has %lld", which,
       (long long)last, b->name, (long long)mg_plan_buf_numel(b));
  return 0;
}

static int gemm(run *r, int i) {
  const mg_step *s = &r->p->steps[i];
  const mg_gemm *g = &s->gemm;
  TRY(arity(r, i, g->beta != 0 ? 3 : 2, 1));
  NEED(g->beta == 0 || g->beta == 1, "beta %g: must be 0 or 1", (double)g->beta);
  const mg_plan_buf *A = pb(r, s->in[0]), *B = pb(r, s->in[1]), *C = pb(r, s->out[0]);
  TRY(dtype_is(r, i, A, r->p->args.dtype));
  TRY(dtype_is(r, i, B, r->p->args.dtype));
  NEED(C->dtype == r->p->args.dtype || C->dtype == MG_F32, "%s is %s: C must be %s or f32",
       C->name, mg_dtype_name(C->dtype), mg_dtype_name(r->p->args.dtype));
  TRY(gemm_operand(r, i, "A", A, g->trans_a ? g->k : g->m, g->trans_a ? g->m : g->k, g->lda,
                   g->off_a, g->stride_a, g->batch));
  TRY(gemm_operand(r, i, "B", B, g->trans_b ? g->n : g->k, g->trans_b ? g->k : g->n, g->ldb,
                   g->off_b, g->stride_b, g->batch));
  TRY(gemm_operand(r, i, "C", C, g->m, g->n, g->ldc, g->off_c, g->stride_c, g->batch));
  if (!r->go) return 0;
  return step_prefix(r, i, r->x->ops->gemm(r->x->ops, g, A->dtype, r->buf[s->in[0]], B->dtype,
                                            r->buf[s->in[1]], C->dtype, r->buf[s->out[0]],
                                            r->stream, r->d));
}

/* ---- kernel steps ------------------------------------------------------------------------ */

static int kernel_step(run *r, int i) {
  const mg_plan *p = r->p;
  const mg_step *s = &p->steps[i];
  const mg_shape *sh = &p->shape;
  const int dn = sh->qk_nope_head_dim, dr = sh->qk_rope_head_dim, dv = sh->v_head_dim,
            dc = sh->kv_lora_rank;
  const mg_dtype t = p->args.dtype, acc = mg_plan_acc_dtype(p);
  const float scale = (float)sh->softmax_scale;
#define IN(k) pb(r, s->in[k])
#define OUT(k) pb(r, s->out[k])
#define BI(k) r->buf[s->in[k]]
#define BO(k) r->buf[s->out[k]]
  switch (s->op) {
    case MG_OP_ATTN_FWD:
    case MG_OP_ATTN_BWD:
    case MG_OP_MQA_FWD:
    case MG_OP_MQA_BWD: {
      const int fwd = s->op == MG_OP_ATTN_FWD || s->op == MG_OP_MQA_FWD;
      const int mqa = s->op == MG_OP_MQA_FWD || s->op == MG_OP_MQA_BWD;
      TRY(arity(r, i, mqa ? (fwd ? 2 : 5) : (fwd ? 3 : 6), mqa ? 2 : (fwd ? 2 : 3)));
      const mg_plan_buf *q = IN(0);
      NEED(q->ndim == 4, "%s must be [B, S, H, d]", q->name);
      const int64_t B = q->dims[0], S = q->dims[1], H = q->dims[2];
      const int64_t dqk = mqa ? dc + dr : dn + dr, dvv = mqa ? dc : dv;
      NEED(S == p->args.seq, "%s covers %lld tokens, the attention needs all S = %lld", q->name,
           (long long)S, (long long)p->args.seq);
      NEED(q->dims[3] == dqk, "%s rows are %lld wide, the kernels take %lld", q->name,
           (long long)q->dims[3], (long long)dqk);
      NEED(H >= 1 && H <= INT_MAX, "%s has %lld heads", q->name, (long long)H);
      const int64_t nq = B * S * H * dqk, nv = B * S * H * dvv, nl = B * H * S;
      const mg_plan_buf *o = mqa ? (fwd ? OUT(0) : IN(2)) : (fwd ? OUT(0) : IN(3));
      const mg_plan_buf *lse = mqa ? (fwd ? OUT(1) : IN(3)) : (fwd ? OUT(1) : IN(4));
      TRY(numel_is(r, i, o, nv));
      TRY(dtype_is(r, i, o, t));
      TRY(numel_is(r, i, lse, nl));
      TRY(dtype_is(r, i, lse, acc));
      TRY(dtype_is(r, i, q, t));
      if (mqa) {
        TRY(numel_is(r, i, IN(1), B * S * dqk));
        TRY(dtype_is(r, i, IN(1), t));
      } else {
        TRY(numel_is(r, i, IN(1), nq));
        TRY(numel_is(r, i, IN(2), B * S * H * dv));
        TRY(dtype_is(r, i, IN(1), t));
        TRY(dtype_is(r, i, IN(2), t));
      }
      if (!fwd) {
        const mg_plan_buf *dout = IN(mqa ? 4 : 5);
        TRY(numel_is(r, i, dout, nv));
        TRY(dtype_is(r, i, dout, t));
        for (int k = 0; k < s->n_out; k++) {
          TRY(numel_is(r, i, OUT(k), mg_plan_buf_numel(IN(k))));
          TRY(dtype_is(r, i, OUT(k), t));
        }
        NEED(s->workspace >= 4 * nl && r->x->mem.step_ws[i] >= 0,
             "scratch of %lld bytes, the backward's delta needs %lld (mg_plan_kernel)",
             (long long)s->workspace, (long long)(4 * nl));
      }
      const int h = (int)H;
      if (mqa && fwd) {
        TRY(want_kernel(r, i, 0, "mqa_fwd", h, dn, dr, dv, dc));
        kargs a = {0};
        ap(&a, "q", BI(0)), ap(&a, "c", BI(1)), ap(&a, "o", BO(0)), ap(&a, "lse", BO(1));
        ai(&a, "seqlen_q", S), ai(&a, "seqlen_k", S), ai(&a, "q_pos0", 0), af(&a, "softmax_scale", scale);
        return launch(r, i, 0, &a, B, S);
      }
      if (!mqa && fwd) {
        TRY(want_kernel(r, i, 0, "attn_fwd", h, dn, dr, dv, dc));
        kargs a = {0};
        ap(&a, "q", BI(0)), ap(&a, "k_nope", BI(1)), ap(&a, "k_rope", NULL), ap(&a, "v", BI(2));
        ap(&a, "o", BO(0)), ap(&a, "lse", BO(1));
        ai(&a, "seqlen_q", S), ai(&a, "seqlen_k", S), ai(&a, "q_pos0", 0), af(&a, "softmax_scale", scale);
        return launch(r, i, 0, &a, B, S);
      }
      /* backward: delta in the step's scratch, by attn_bwd_pre */
      if (mqa) {
        TRY(want_kernel(r, i, 0, "attn_bwd_pre", h, dc, dr, dc, dc));
        TRY(want_kernel(r, i, 1, "mqa_bwd_dkv", h, dn, dr, dv, dc));
        TRY(want_kernel(r, i, 2, "mqa_bwd_dq", h, dn, dr, dv, dc));
      } else {
        TRY(want_kernel(r, i, 0, "attn_bwd_pre", h, dn, dr, dv, dc));
        TRY(want_kernel(r, i, 1, "attn_bwd_dkdv", h, dn, dr, dv, dc));
        TRY(want_kernel(r, i, 2, "attn_bwd_dq", h, dn, dr, dv, dc));
      }
      if (!r->go) return 0;
      void *delta = r->ws + r->x->mem.step_ws[i];
      const void *dout = mqa ? BI(4) : BI(5), *ob = mqa ? BI(2) : BI(3), *lb = mqa ? BI(3) : BI(4);
      kargs pre = {0};
      ap(&pre, "o", ob), ap(&pre, "dout", dout), ap(&pre, "delta", delta), ap(&pre, "dq_accum", NULL);
      ai(&pre, "seqlen_q", S);
      TRY(launch(r, i, 0, &pre, B, S));
      kargs a = {0};
      ap(&a, "q", BI(0)), ap(&a, "dout", dout), ap(&a, "lse", lb), ap(&a, "delta", delta);
      ai(&a, "seqlen_q", S), ai(&a, "seqlen_k", S), ai(&a, "q_pos0", 0), af(&a, "softmax_scale", scale);
      if (mqa) {
        ap(&a, "c", BI(1)), ap(&a, "dc", BO(1)), ap(&a, "dc_accum", NULL), ap(&a, "dq", BO(0));
      } else {
        ap(&a, "k_nope", BI(1)), ap(&a, "k_rope", NULL), ap(&a, "v", BI(2));
        ap(&a, "dq_accum", NULL), ap(&a, "dk_nope", BO(1)), ap(&a, "dk_rope", NULL);
        ap(&a, "dv", BO(2)), ap(&a, "dq", BO(0));
      }
      TRY(launch(r, i, 1, &a, B, S));
      return launch(r, i, 2, &a, B, S);
    }
    case MG_OP_EXPAND_KV:
    case MG_OP_SPLIT_DKV: {
      const int expand = s->op == MG_OP_EXPAND_KV;
      TRY(arity(r, i, 2, 2));
      const mg_plan_buf *big = IN(0); /* kv or dk: [B, S, Hk, w] */
      const int64_t w0 = expand ? dn + dv : dn + dr;
      NEED(big->ndim == 4 && last_dim(big) == w0, "%s must be [B, S, H, %lld]", big->name,
           (long long)w0);
      const int64_t rows = big->dims[0] * big->dims[1], H = big->dims[2];
      const mg_plan_buf *rope = expand ? IN(1) : OUT(1);
      NEED(s->rope_col >= 0 && s->rope_col + dr <= s->rope_w && last_dim(rope) == s->rope_w,
           "rope columns [%lld, %lld) outside %s of width %lld", (long long)s->rope_col,
           (long long)(s->rope_col + dr), rope->name, (long long)last_dim(rope));
      TRY(numel_is(r, i, rope, rows * s->rope_w));
      if (expand) {
        TRY(numel_is(r, i, OUT(0), rows * H * (dn + dr)));
        TRY(numel_is(r, i, OUT(1), rows * H * dv));
      } else {
        TRY(numel_is(r, i, IN(1), rows * H * dv));
        TRY(numel_is(r, i, OUT(0), rows * H * (dn + dv)));
      }
      for (int k = 0; k < 2; k++) {
        TRY(dtype_is(r, i, IN(k), t));
        TRY(dtype_is(r, i, OUT(k), t));
      }
      TRY(want_kernel(r, i, 0, expand ? "expand_kv" : "split_dkv", (int)H, dn, dr, dv, dc));
      kargs a = {0};
      if (expand) {
        ap(&a, "kv", BI(0)), ap(&a, "rope", BI(1)), ap(&a, "k", BO(0)), ap(&a, "v", BO(1));
      } else {
        ap(&a, "dk", BI(0)), ap(&a, "dv", BI(1)), ap(&a, "dkv", BO(0)), ap(&a, "drope", BO(1));
        ai(&a, "accumulate", s->accumulate != 0);
      }
      ai(&a, "rows", rows), ai(&a, "rope_col", s->rope_col), ai(&a, "rope_w", s->rope_w);
      return launch(r, i, 0, &a, 1, layout_grid(rows));
    }
    case MG_OP_CONCAT_LATENT:
    case MG_OP_SPLIT_LATENT: {
      const int concat = s->op == MG_OP_CONCAT_LATENT;
      TRY(arity(r, i, concat ? 2 : 1, concat ? 1 : 2));
      const mg_plan_buf *ckv = concat ? IN(0) : OUT(0), *kr = concat ? IN(1) : OUT(1),
                        *c = concat ? OUT(0) : IN(0);
      const int64_t wc = last_dim(ckv), wr = last_dim(kr), rows = mg_plan_buf_numel(ckv) / wc;
      NEED(wc == dc && wr == dr && last_dim(c) == dc + dr, "%s, %s and %s must be d_c, d_r and "
           "d_c + d_r wide", ckv->name, kr->name, c->name);
      TRY(numel_is(r, i, kr, rows * dr));
      TRY(numel_is(r, i, c, rows * (dc + dr)));
      TRY(dtype_is(r, i, ckv, t));
      TRY(dtype_is(r, i, kr, t));
      TRY(dtype_is(r, i, c, t));
      TRY(want_kernel(r, i, 0, concat ? "concat_latent" : "split_latent", p->shape.heads, dn, dr,
                      dv, dc));
      kargs a = {0};
      if (concat) ap(&a, "c_kv", BI(0)), ap(&a, "k_rope", BI(1)), ap(&a, "c", BO(0));
      else ap(&a, "dc", BI(0)), ap(&a, "dc_kv", BO(0)), ap(&a, "dk_rope", BO(1));
      ai(&a, "rows", rows);
      return launch(r, i, 0, &a, 1, layout_grid(rows));
    }
    case MG_OP_COPY_COLS: {
      TRY(arity(r, i, 1, 1));
      const mg_plan_buf *src = IN(0), *dst = OUT(0);
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
      TRY(numel_is(r, i, dst, rows * dw));
      NEED(src->dtype == dst->dtype, "%s is %s, %s is %s", src->name, mg_dtype_name(src->dtype),
           dst->name, mg_dtype_name(dst->dtype));
      if (src->dtype != t) { /* laga-f's f32 LSE: a strided copy */
        const int64_t e = (int64_t)es(src->dtype);
        if (!r->go) return 0;
        return d_copy2d(r, i, (char *)BO(0) + s->dst_col * e, dw * e,
                        (const char *)BI(0) + s->src_col * e, sw * e, s->cols * e, rows);
      }
      TRY(want_kernel(r, i, 0, "copy_cols", p->shape.heads, dn, dr, dv, dc));
      kargs a = {0};
      ap(&a, "src", BI(0)), ap(&a, "dst", BO(0)), ai(&a, "rows", rows), ai(&a, "src_w", sw);
      ai(&a, "src_col", s->src_col), ai(&a, "dst_w", dw), ai(&a, "dst_col", s->dst_col);
      ai(&a, "cols", s->cols);
      return launch(r, i, 0, &a, 1, layout_grid(rows));
    }
  }
#undef IN
#undef OUT
#undef BI
#undef BO
  return step_error(r, i, MLAGEN_EINVAL, "unknown kernel op %d", (int)s->op);
}

static int step(run *r, int i) {
  switch (r->p->steps[i].kind) {
    case MG_STEP_SEQ_TO_HEAD:
    case MG_STEP_HEAD_TO_SEQ:
    case MG_STEP_ALL_GATHER:
    case MG_STEP_REDUCE_SCATTER: return collective(r, i);
    case MG_STEP_GEMM: return gemm(r, i);
    case MG_STEP_KERNEL: return kernel_step(r, i);
  }
  return step_error(r, i, MLAGEN_EINVAL, "unknown step kind %d", (int)r->p->steps[i].kind);
}
#undef NEED
#undef TRY

/* ---- the op boundary ---------------------------------------------------------------------- */

static const char *const input_names[] = {"q", "c_kv", "k_rope", "w_kv_b", "do"};
static const char *const output_names[] = {"o", "dq", "dc_kv", "dk_rope", "dw_kv_b"};

static void *caller_tensor(const mg_cuda_tensors *t, const char *name) {
  const void *const in[] = {t->q, t->c_kv, t->k_rope, t->w_kv_b, t->d_o};
  void *const out[] = {t->o, t->dq, t->dc_kv, t->dk_rope, t->dw_kv_b};
  for (int k = 0; k < 5; k++) {
    if (!strcmp(name, input_names[k])) return (void *)in[k];
    if (!strcmp(name, output_names[k])) return out[k];
  }
  return NULL;
}

static int known_name(const char *name, mg_buf_role role) {
  const char *const *names = role == MG_BUF_INPUT ? input_names : output_names;
  for (int k = 0; k < 5; k++)
    if (!strcmp(name, names[k])) return 1;
  return 0;
}

/* ---- prepare ----------------------------------------------------------------------------- */

int mg_cuda_exec_mem_layout(const mg_plan *p, mg_plan_mem *m, int64_t *blas_offset, mg_diag *d) {
  if (!blas_offset) return mg_diag_set(d, MLAGEN_EINVAL, "mg_cuda_exec_mem_layout: blas_offset is NULL");
  *blas_offset = -1;
  int rc = mg_plan_mem_layout(p, MG_CUDA_EXEC_ALIGN, m, d);
  if (rc) return rc;
  int gemms = 0;
  for (int i = 0; i < p->n_steps; i++) gemms |= p->steps[i].kind == MG_STEP_GEMM;
  if (!gemms) return 0;
  if (m->workspace_bytes > INT64_MAX - MG_CUDA_EXEC_BLAS_WS)
    return mg_diag_set(d, MLAGEN_EINVAL, "workspace of %lld bytes: no room for cuBLAS's",
                       (long long)m->workspace_bytes);
  *blas_offset = m->workspace_bytes; /* a multiple of MG_CUDA_EXEC_ALIGN */
  m->workspace_bytes += MG_CUDA_EXEC_BLAS_WS;
  return 0;
}

int mg_cuda_exec_prepare(const mg_plan *p, mg_dev_ops *o, const mg_cuda_exec_opts *opts,
                         mg_cuda_exec **out, mg_diag *d) {
  if (out) *out = NULL;
  if (!p || !o || !out)
    return mg_diag_set(d, MLAGEN_EINVAL, "mg_cuda_exec_prepare: plan, ops or out is NULL");
  if (p->args.dtype != MG_BF16 && p->args.dtype != MG_F16)
    return mg_diag_set(d, MLAGEN_EINVAL, "the CUDA executor runs bf16 or f16 plans, not %s (f32 "
                       "and f64 plans run on the CPU executor)", mg_dtype_name(p->args.dtype));
  if (p->n_steps > MG_PLAN_MAX_STEPS || p->n_bufs > MG_PLAN_MAX_BUFS || p->n_fwd < 0 ||
      p->n_fwd > p->n_steps)
    return mg_diag_set(d, MLAGEN_EINVAL, "malformed plan (%d steps, %d buffers)", p->n_steps,
                       p->n_bufs);
  for (int b = 0; b < p->n_bufs; b++) {
    const mg_plan_buf *pbuf = &p->bufs[b];
    if (pbuf->role != MG_BUF_TEMP && !known_name(pbuf->name, pbuf->role))
      return mg_diag_set(d, MLAGEN_EINVAL, "%s plan: unknown %s %s", mg_form_name(p->args.form),
                         pbuf->role == MG_BUF_INPUT ? "input" : "output", pbuf->name);
  }
  mg_cuda_exec *x = calloc(1, sizeof *x);
  if (!x) return mg_diag_set(d, MLAGEN_ENOMEM, "CUDA executor: out of memory");
  x->p = p;
  x->ops = o;
  x->timeout_s = opts && opts->timeout_s != 0 ? opts->timeout_s : 600;
  snprintf(x->tune_dir, sizeof x->tune_dir, "%s", opts && opts->tune_dir ? opts->tune_dir : "");
  memset(x->step_k, -1, sizeof x->step_k);
  int rc = mg_cuda_exec_mem_layout(p, &x->mem, &x->blas_off, d);
  if (rc) {
    mg_diag_prefix(d, "CUDA executor: memory layout");
    free(x);
    return rc;
  }
  int own_gen = !(opts && opts->gen);
  if (own_gen) rc = mg_gen_open(&x->gen, NULL, d);
  else x->gen = opts->gen;
  run r = {.x = x, .p = p, .go = 0, .d = d};
  for (int i = 0; i < p->n_steps && !rc; i++) {
    const mg_step *s = &p->steps[i];
    if (s->n_in < 0 || s->n_in > MG_STEP_MAX_ARGS || s->n_out < 0 || s->n_out > MG_STEP_MAX_ARGS) {
      rc = step_error(&r, i, MLAGEN_EINVAL, "malformed argument lists");
      break;
    }
    for (int k = 0; k < s->n_in + s->n_out && !rc; k++) {
      int id = k < s->n_in ? s->in[k] : s->out[k - s->n_in];
      if (id < 0 || id >= p->n_bufs) rc = step_error(&r, i, MLAGEN_EINVAL, "buffer id %d", id);
    }
    if (!rc) rc = step(&r, i);
  }
  if (own_gen) mg_gen_close(x->gen);
  x->gen = NULL;
  if (rc) {
    mg_cuda_exec_destroy(x);
    return rc;
  }
  *out = x;
  return 0;
}

int64_t mg_cuda_exec_saved_bytes(const mg_cuda_exec *x) { return x ? x->mem.saved_bytes : 0; }
int64_t mg_cuda_exec_workspace_bytes(const mg_cuda_exec *x) { return x ? x->mem.workspace_bytes : 0; }
int mg_cuda_exec_kernel_count(const mg_cuda_exec *x) { return x ? x->n_kerns : 0; }

void *mg_cuda_exec_buffer(const mg_cuda_exec *x, const char *name, void *workspace, void *saved) {
  if (!x || !name) return NULL;
  int b = mg_plan_find(x->p, name);
  if (b < 0 || x->mem.where[b] == MG_MEM_CALLER) return NULL;
  char *base = x->mem.where[b] == MG_MEM_SAVED ? saved : workspace;
  return base ? base + x->mem.offset[b] : NULL;
}

void mg_cuda_exec_destroy(mg_cuda_exec *x) {
  if (!x) return;
  free(x->kerns);
  free(x);
}

/* ---- run ----------------------------------------------------------------------------------- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* P > 1: waits for the stream, polling the communicator, at most x->timeout_s. */
static int wait_pass(mg_cuda_exec *x, mg_comm *comm, void *stream, const char *pass, mg_diag *d) {
  const double t0 = now_s();
  for (;;) {
    int done = 0;
    int rc = x->ops->query(x->ops, stream, &done, d);
    if (rc) return mg_diag_prefix(d, "%s plan, %s: waiting for the pass", mg_form_name(x->p->args.form), pass);
    if (done) return 0;
    if (comm->ops->poll && (rc = comm->ops->poll(comm, d)))
      return mg_diag_prefix(d, "%s plan, %s: the communicator", mg_form_name(x->p->args.form), pass);
    if (now_s() - t0 > x->timeout_s)
      return mg_diag_set(d, MLAGEN_EIO, "%s plan, %s: timed out after %g s waiting for the pass "
                         "to finish (a peer that never joined a collective?)",
                         mg_form_name(x->p->args.form), pass, x->timeout_s);
    struct timespec ts = {0, 200000}; /* 0.2 ms */
    nanosleep(&ts, NULL);
  }
}

int mg_cuda_exec_run(mg_cuda_exec *x, mg_pass pass, const mg_cuda_tensors *t, void *workspace,
                     size_t workspace_bytes, void *saved, size_t saved_bytes, mg_comm *comm,
                     void *stream, mg_diag *d) {
  if (!x || !t) return mg_diag_set(d, MLAGEN_EINVAL, "mg_cuda_exec_run: %s is NULL", x ? "t" : "x");
  const mg_plan *p = x->p;
  const char *pname = pass == MG_FWD ? "forward" : "backward";
  const int first = pass == MG_FWD ? 0 : p->n_fwd, end = pass == MG_FWD ? p->n_fwd : p->n_steps;
  if (workspace_bytes < (size_t)x->mem.workspace_bytes || (!workspace && x->mem.workspace_bytes))
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: workspace of %zu bytes at %p, the plan needs %lld",
                       pname, workspace_bytes, workspace, (long long)x->mem.workspace_bytes);
  if (saved_bytes < (size_t)x->mem.saved_bytes || (!saved && x->mem.saved_bytes))
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: saved area of %zu bytes at %p, the plan needs %lld",
                       pname, saved_bytes, saved, (long long)x->mem.saved_bytes);
  if (p->args.sp > 1 && !comm)
    return mg_diag_set(d, MLAGEN_EINVAL, "a plan for %d ranks needs a communicator", p->args.sp);
  if (comm && (comm->size != p->args.sp || comm->rank != p->args.rank))
    return mg_diag_set(d, MLAGEN_EINVAL,
                       "the communicator is rank %d of %d, the plan is for rank %d of sp = %d",
                       comm->rank, comm->size, p->args.rank, p->args.sp);
  run r = {.x = x, .p = p, .go = 1, .ws = workspace, .comm = comm, .stream = stream, .d = d};
  for (int b = 0; b < p->n_bufs; b++) {
    if (x->mem.where[b] == MG_MEM_CALLER) r.buf[b] = caller_tensor(t, p->bufs[b].name);
    else r.buf[b] = (char *)(x->mem.where[b] == MG_MEM_SAVED ? saved : workspace) + x->mem.offset[b];
  }
  for (int i = first; i < end; i++) { /* every caller tensor the pass touches is given */
    const mg_step *s = &p->steps[i];
    for (int k = 0; k < s->n_in + s->n_out; k++) {
      int b = k < s->n_in ? s->in[k] : s->out[k - s->n_in];
      if (x->mem.where[b] == MG_MEM_CALLER && !r.buf[b])
        return mg_diag_set(d, MLAGEN_EINVAL, "%s: tensor %s is NULL (step %d, %s)", pname,
                           p->bufs[b].name, i, s->label);
    }
  }
  if (x->blas_off >= 0 && x->ops->gemm_workspace) { /* the aligned part of the GEMMs' slice */
    const uintptr_t at = (uintptr_t)workspace + (uintptr_t)x->blas_off;
    const uintptr_t lead = (MG_CUDA_EXEC_ALIGN - at % MG_CUDA_EXEC_ALIGN) % MG_CUDA_EXEC_ALIGN;
    int rc = x->ops->gemm_workspace(x->ops, (char *)workspace + x->blas_off + lead,
                                    (size_t)MG_CUDA_EXEC_BLAS_WS - lead, d);
    if (rc) return mg_diag_prefix(d, "%s: the GEMMs' workspace", pname);
  }
  for (int i = first; i < end; i++) {
    for (int b = 0; b < p->n_bufs; b++) /* this rank's partial dw_kv_b: zero the other rows */
      if (p->args.sp > 1 && p->bufs[b].role == MG_BUF_OUTPUT && p->bufs[b].first == i &&
          !strcmp(p->bufs[b].name, "dw_kv_b")) {
        int rc = step_prefix(&r, i, x->ops->memset(x->ops, r.buf[b], 0,
                                                   (size_t)mg_plan_buf_bytes(&p->bufs[b]),
                                                   stream, d));
        if (rc) return rc;
      }
    int rc = step(&r, i);
    if (rc) return rc;
  }
  if (p->args.sp > 1 && x->timeout_s >= 0) return wait_pass(x, comm, stream, pname, d);
  return 0;
}

int mg_cuda_exec_kernel_info(const mg_cuda_exec *x, int i, const char **name, const char **why) {
  if (!x) return 0;
  if (i >= 0 && i < x->n_kerns) {
    if (name) *name = x->kerns[i].name;
    if (why) *why = x->kerns[i].why;
  }
  return x->n_kerns;
}
