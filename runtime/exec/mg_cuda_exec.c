/* mg_cuda_exec.c: the CUDA executor's orchestration over mg_dev_ops (see mg_cuda_exec.h).
 *
 * prepare: check the plan (mg_plan_check, the check mg_plan_build ran), lay out memory,
 * build the kernels, and lower the steps (one function per step kind) into a flat
 * program of launches, GEMMs, copies and collectives whose kernel arguments are bound to
 * the manifests' parameters once, pointers as (buffer, offset). run: resolve each
 * buffer's address for the call and replay the pass's part of the program. */
#include "mg_cuda_exec.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mg_module.h"
#include "mg_plan_check.h"
#include "mg_plan_mem.h"
#include "mg_sm90_tmap.h"
#include "mg_spec.h"
#include "mg_tune_store.h"
#include "mg_varlen.h"
#include "mlagen.h"

#define MAX_PARAMS MG_KERNEL_MAX_PARAMS

typedef struct kparam {
  char name[32];
  char kind; /* 'p' pointer, 'i' int, 'f' float, 't' tensor maps by value (sm_90a) */
} kparam;

typedef struct kern {
  char name[160];
  char why[720]; /* which family and configuration, and why (mg_tune_lookup's words) */
  void *handle;
  mg_launch_rule rule;
  int n_params;
  kparam params[MAX_PARAMS];
  /* an sm_90a family's tensor maps ('t' param tparam, else -1): encoded at each launch by
   * mg_sm90_launch_tmaps from the spec and the manifest (tinfo: heap) */
  int tparam;
  mg_kernel_spec spec;
  mg_kernel_info *tinfo;
} kern;

/* Where a pointer of the lowered program points; resolved at each run. */
typedef struct ref {
  int buf;     /* a plan buffer id, REF_WS (the workspace) or REF_NULL */
  int64_t off; /* bytes from its start */
} ref;
#define REF_NULL (-1)
#define REF_WS (-2)

/* One device operation of the lowered program. */
typedef enum lkind { L_LAUNCH, L_GEMM, L_COPY, L_COPY2D, L_MEMSET, L_A2A, L_GATHER, L_RSCATTER } lkind;

typedef struct lop {
  lkind kind;
  int step;                 /* the plan step it comes from, for messages */
  /* L_LAUNCH: kerns[kern] over grid, its parameters in the manifest's order */
  int kern;
  unsigned grid[3];
  mg_launch_dims dims;      /* the sizes the grid came from (and the tensor maps' rows) */
  char pkind[MAX_PARAMS];   /* 'p', 'i', 'f' */
  ref ptr[MAX_PARAMS];      /* 'p' */
  int32_t ival[MAX_PARAMS]; /* 'i' */
  float fval[MAX_PARAMS];   /* 'f' */
  /* the others: a (dst; GEMM A; collectives' source), b (src; GEMM B; destination), c (C) */
  ref a, b, c;
  int64_t bytes;            /* L_COPY, L_MEMSET */
  int64_t dpitch, spitch, width, height; /* L_COPY2D */
  size_t count;             /* collectives: elements per rank block */
  const mg_gemm *gemm;      /* L_GEMM: the plan's */
  mg_dtype ta, tb, tc;      /* L_GEMM operand dtypes; collectives: ta */
} lop;

struct mg_cuda_exec {
  const mg_plan *p;
  mg_dev_ops *ops;
  mg_plan_mem mem;
  int64_t blas_off; /* the GEMMs' scratch in the workspace (mg_cuda_exec_mem_layout); -1: none */
  int64_t cu_off;   /* varlen plans: the device cu_seqlens [seq + 1] int32 in the workspace;
                       -1: an unpacked plan */
  int32_t *cu_host; /* varlen plans: its staging (mg_varlen_compact), seq + 1 entries */
  double timeout_s;
  char tune_dir[4096]; /* opts->tune_dir, "" for mg_tune_store_dir() */
  char arch[16];       /* the arch whose families run (mg_op_family_arch): the ops' arch, or ""
                          (the portable mma.sync families) when forced or without tensor maps */
  char arch_note[160]; /* why arch is "" on a device that has one, else "" */
  mg_gen *gen; /* during prepare only */
  kern *kerns;
  int n_kerns, cap;
  signed char slot[MG_PLAN_MAX_BUFS]; /* caller buffers: index into the op boundary, else -1 */
  lop *prog; /* the lowered plan: the forward's [0, n_fwd_ops), then the backward's */
  int n_prog, prog_cap, n_fwd_ops;
};

/* The state of prepare. */
typedef struct prep {
  mg_cuda_exec *x;
  const mg_plan *p;
  mg_diag *d;
} prep;

/* Sets "<form> plan step i (label): <message>" and returns status. */
__attribute__((format(printf, 5, 6)))
static int step_error(const mg_plan *p, mg_diag *d, int i, int status, const char *fmt, ...) {
  char msg[700];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return mg_diag_set(d, status, "%s plan step %d (%s): %s", mg_form_name(p->args.form), i,
                     p->steps[i].label, msg);
}

/* Prefixes the message already in d (from ops, comm or the generator) with the step. */
static int step_prefix(const mg_plan *p, mg_diag *d, int i, int rc) {
  if (rc) mg_diag_prefix(d, "%s plan step %d (%s)", mg_form_name(p->args.form), i, p->steps[i].label);
  return rc;
}

static const mg_plan_buf *pb(const prep *r, int id) { return &r->p->bufs[id]; }
static int64_t last_dim(const mg_plan_buf *b) { return b->ndim ? b->dims[b->ndim - 1] : 1; }
static size_t es(mg_dtype t) { return mg_dtype_size(t); }
static ref bref(int buf, int64_t off) { return (ref){buf, off}; }
static const ref rnull = {REF_NULL, 0};

#define TRY(e)             \
  do {                     \
    int rc_ = (e);         \
    if (rc_) return rc_;   \
  } while (0)

/* A new operation of step i at the end of the program, or NULL (out of memory, in d). */
static lop *emit(prep *r, lkind kind, int i) {
  mg_cuda_exec *x = r->x;
  if (x->n_prog == x->prog_cap) {
    int cap = x->prog_cap ? 2 * x->prog_cap : 64;
    lop *np = realloc(x->prog, (size_t)cap * sizeof *np);
    if (!np) {
      mg_diag_set(r->d, MLAGEN_ENOMEM, "CUDA executor: out of memory");
      return NULL;
    }
    x->prog = np, x->prog_cap = cap;
  }
  lop *l = &x->prog[x->n_prog++];
  memset(l, 0, sizeof *l);
  l->kind = kind;
  l->step = i;
  return l;
}

/* ---- kernels: preparation ------------------------------------------------------------- */

static const char *spec_dtype(const mg_plan *p) { return p->args.dtype == MG_F16 ? "fp16" : "bf16"; }

/* Makes kernel `family` (heads, dims) available to step i: *kidx its index in x->kerns;
 * reuses a kernel already loaded under the same name. The step's key layout
 * (mg_step.split_keys) decides k_packed for a keyed family (mg_spec_step_tunables). */
static int want_kernel_v(prep *r, int i, const char *family, int varlen, int heads, int dn,
                         int dr, int dv, int dc, int *kidx) {
  const int split = r->p->steps[i].split_keys;
  mg_cuda_exec *x = r->x;
  mg_kernel_spec s;
  memset(&s, 0, sizeof s);
  snprintf(s.family, sizeof s.family, "%s", family);
  s.heads = heads, s.d_n = dn, s.d_r = dr, s.d_v = dv, s.d_c = dc;
  snprintf(s.dtype, sizeof s.dtype, "%s", spec_dtype(r->p));
  s.causal = r->p->args.causal;
  s.varlen = varlen;
  snprintf(s.arch, sizeof s.arch, "%s", x->ops->arch); /* the device's shared-memory limit */
  mg_spec_step_tunables(&s, split);
  /* the interface the steps below are written for, and a tuned configuration for this
   * device, shape and sequence bucket when the ops know their device and the store has
   * one (docs/tuning.md); else the template's default. A kernel whose code does not
   * depend on causality (kernel{} causal false: the layout kernels) is generated
   * non-causal, so both plans share it. */
  char why[sizeof x->kerns[0].why];
  mg_kernel k;
  mg_kernel_spec used;
  int rc;
  for (;;) {
    mg_kernel_spec chosen = s;
    snprintf(why, sizeof why, "default: no device to look up tuned configurations for");
    if (x->ops->arch[0]) {
      rc = mg_tune_choose(x->gen, x->tune_dir[0] ? x->tune_dir : NULL, x->ops->arch,
                          x->ops->device, &s, mg_form_name(r->p->args.form), r->p->args.seq,
                          &chosen, why, sizeof why, &k, r->d);
    } else {
      mg_spec_plan_tunables(&chosen);
      rc = mg_gen_kernel(x->gen, &chosen, &k, r->d);
    }
    used = chosen;
    if (rc || !s.causal || k.info.causal) break;
    mg_kernel_free(&k);
    s.causal = 0;
  }
  if (rc == MLAGEN_EINVAL && strcmp(mg_family_portable(family), family) != 0) {
    /* an architecture's family that refuses this shape (or has no varlen variant): the
     * portable one runs instead */
    char msg[400];
    snprintf(msg, sizeof msg, "%s", mg_diag_msg(r->d));
    mg_diag_clear(r->d);
    rc = want_kernel_v(r, i, mg_family_portable(family), varlen, heads, dn, dr, dv, dc, kidx);
    if (!rc) {
      kern *e = &x->kerns[*kidx];
      size_t n = strlen(e->why);
      snprintf(e->why + n, sizeof e->why - n, "; %s refused the %s (%.300s)", family,
               varlen ? "spec" : "shape", msg);
    }
    return rc;
  }
  if (rc) return step_prefix(r->p, r->d, i, rc);
  for (int j = 0; j < x->n_kerns; j++)
    if (!strcmp(x->kerns[j].name, k.name)) {
      *kidx = j;
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
  snprintf(e->why, sizeof e->why, "%.400s%.200s", why, x->arch_note);
  e->rule = k.info.launch;
  e->tparam = -1;
  rc = 0;
  for (int j = 0; j < k.info.n_params; j++) {
    const mg_kernel_param *kp = &k.info.params[j];
    e->params[e->n_params].kind = kp->kind == MG_PARAM_INT     ? 'i'
                                  : kp->kind == MG_PARAM_FLOAT ? 'f'
                                  : kp->kind == MG_PARAM_TMAPS ? 't'
                                                               : 'p';
    if (kp->kind == MG_PARAM_TMAPS) e->tparam = j;
    snprintf(e->params[e->n_params++].name, sizeof e->params[0].name, "%s", kp->name);
  }
  if (e->tparam >= 0) { /* the maps are made at each launch: keep what they are made from */
    e->spec = used;
    if (!(e->tinfo = malloc(sizeof *e->tinfo))) rc = mg_diag_set(r->d, MLAGEN_ENOMEM, "CUDA executor: out of memory");
    else *e->tinfo = k.info;
  }
  if (!rc) rc = x->ops->load(x->ops, &k, &e->rule, &e->handle, r->d);
  mg_kernel_free(&k);
  if (rc) {
    free(e->tinfo);
    return step_prefix(r->p, r->d, i, rc);
  }
  *kidx = x->n_kerns++;
  return 0;
}

/* An unpacked kernel (the layout kernels, and every kernel of an unpacked plan). */
static int want_kernel(prep *r, int i, const char *family, int heads, int dn, int dr, int dv,
                       int dc, int *kidx) {
  return want_kernel_v(r, i, family, 0, heads, dn, dr, dv, dc, kidx);
}

/* ---- kernels: binding ------------------------------------------------------------------ */

/* The arguments the executor has for a kernel, by parameter name. */
typedef struct karg {
  const char *name;
  char kind;
  ref p;
  int64_t i;
  float f;
} karg;

typedef struct kargs {
  int n;
  karg a[MAX_PARAMS];
} kargs;

static void ap(kargs *a, const char *name, ref p) {
  a->a[a->n++] = (karg){.name = name, .kind = 'p', .p = p};
}
static void ai(kargs *a, const char *name, int64_t v) {
  a->a[a->n++] = (karg){.name = name, .kind = 'i', .i = v};
}
static void af(kargs *a, const char *name, float v) {
  a->a[a->n++] = (karg){.name = name, .kind = 'f', .f = v};
}

/* Appends a launch of kernel kidx for step i: the arguments a bound to the manifest's
 * parameters by name (once, here), the grid of its rule for batch and seqlen. An empty
 * grid launches nothing. */
/* A launch whose grid rule sees seqlen_q and seqlen_k (the attention kernels: the q and the
 * k buffers' tokens per batch item). */
static int launch_qk(prep *r, int i, int kidx, const kargs *a, int64_t batch, int64_t seqlen_q,
                     int64_t seqlen_k) {
  const kern *k = &r->x->kerns[kidx];
  if (batch > LONG_MAX || seqlen_q > LONG_MAX || seqlen_k > LONG_MAX)
    return step_error(r->p, r->d, i, MLAGEN_ELIMIT, "kernel %s: launch sizes too large", k->name);
  mg_launch_dims dims = {.batch = (long)batch, .seqlen_q = (long)seqlen_q, .seqlen_k = (long)seqlen_k};
  unsigned grid[3];
  int rc = mg_launch_grid(&k->rule, &dims, grid, r->d);
  if (rc) return step_error(r->p, r->d, i, rc, "kernel %s: %s", k->name, mg_diag_msg(r->d));
  if (!grid[0] || !grid[1] || !grid[2]) return 0;
  lop *l = emit(r, L_LAUNCH, i);
  if (!l) return MLAGEN_ENOMEM;
  l->kern = kidx;
  memcpy(l->grid, grid, sizeof grid);
  l->dims = dims;
  for (int j = 0; j < k->n_params; j++) {
    if (k->params[j].kind == 't') { /* made at each run from the other arguments */
      l->pkind[j] = 't';
      continue;
    }
    const karg *m = NULL;
    for (int q = 0; q < a->n && !m; q++)
      if (!strcmp(a->a[q].name, k->params[j].name)) m = &a->a[q];
    if (!m || m->kind != k->params[j].kind)
      return step_error(r->p, r->d, i, MLAGEN_EINVAL, "kernel %s: parameter %s (%c) %s", k->name,
                        k->params[j].name, k->params[j].kind,
                        m ? "has another type than the executor's" : "is not one the executor knows");
    l->pkind[j] = m->kind;
    if (m->kind == 'i') {
      if (m->i < INT_MIN || m->i > INT_MAX)
        return step_error(r->p, r->d, i, MLAGEN_EUNSUPPORTED, "kernel %s: %s = %lld exceeds int",
                          k->name, m->name, (long long)m->i);
      l->ival[j] = (int32_t)m->i;
    } else if (m->kind == 'f') {
      l->fval[j] = m->f;
    } else {
      l->ptr[j] = m->p;
    }
  }
  return 0;
}

/* A launch whose grid rule sees seqlen_q = seqlen_k = seqlen. */
static int launch(prep *r, int i, int kidx, const kargs *a, int64_t batch, int64_t seqlen) {
  return launch_qk(r, i, kidx, a, batch, seqlen, seqlen);
}

/* The grid size of the layout kernels, which stride over their rows: one CTA per row, up
 * to 2^20 CTAs. */
static int64_t layout_grid(int64_t rows) { return rows < (1 << 20) ? rows : (1 << 20); }

/* ---- device operations ------------------------------------------------------------------ */

static int emit_copy(prep *r, int i, ref dst, ref src, int64_t bytes) {
  if (bytes <= 0) return 0;
  lop *l = emit(r, L_COPY, i);
  if (!l) return MLAGEN_ENOMEM;
  l->a = dst, l->b = src, l->bytes = bytes;
  return 0;
}

static int emit_copy2d(prep *r, int i, ref dst, int64_t dpitch, ref src, int64_t spitch,
                       int64_t width, int64_t height) {
  if (width <= 0 || height <= 0) return 0;
  lop *l = emit(r, L_COPY2D, i);
  if (!l) return MLAGEN_ENOMEM;
  l->a = dst, l->b = src, l->dpitch = dpitch, l->spitch = spitch, l->width = width,
  l->height = height;
  return 0;
}

/* A collective of count elements per rank block from src to dst. */
static int emit_coll(prep *r, int i, lkind kind, ref src, ref dst, size_t count) {
  lop *l = emit(r, kind, i);
  if (!l) return MLAGEN_ENOMEM;
  l->a = src, l->b = dst, l->count = count, l->ta = r->p->args.dtype;
  return 0;
}

/* ---- collectives (mg_plan_check: shapes and workspace as planned) ----------------------- */

static int collective(prep *r, int i) {
  const mg_step *s = &r->p->steps[i];
  const mg_plan_buf *src = pb(r, s->in[0]), *dst = pb(r, s->out[0]);
  const int64_t P = r->p->args.sp;
  const mg_dtype t = r->p->args.dtype;
  const int seq_head = s->kind == MG_STEP_SEQ_TO_HEAD || s->kind == MG_STEP_HEAD_TO_SEQ;
  const mg_plan_buf *shard =
      s->kind == MG_STEP_SEQ_TO_HEAD || s->kind == MG_STEP_ALL_GATHER ? src : dst;
  const int nd = seq_head ? 4 : 3;
  const int64_t Bt = shard->dims[0], Sl = shard->dims[1], w = shard->dims[nd - 1];
  const int64_t H = seq_head ? shard->dims[2] : 1, Hl = seq_head ? H / P : 1;
  const int64_t in_b = mg_plan_buf_bytes(src);
  const ref in = bref(s->in[0], 0), out = bref(s->out[0], 0);
  if (P == 1) return emit_copy(r, i, out, in, in_b);
  const ref send = bref(REF_WS, r->x->mem.step_ws[i]), recv = bref(REF_WS, r->x->mem.step_ws[i] + in_b);
  const size_t count = (size_t)(Bt * Sl * Hl * w);
  const int64_t blk = (int64_t)count * (int64_t)es(t);
  if (seq_head) {
    int pack, unpack;
    TRY(want_kernel(r, i, mg_op_family(MG_SPEC_OP_A2A, 0), (int)H, 0, 0, 0, 0, &pack));
    TRY(want_kernel(r, i, mg_op_family(MG_SPEC_OP_A2A, 1), (int)H, 0, 0, 0, 0, &unpack));
    const int dir = s->kind == MG_STEP_HEAD_TO_SEQ;
    kargs a = {0};
    ap(&a, "src", in), ap(&a, "send", send), ai(&a, "seqlen_local", Sl), ai(&a, "batch", Bt);
    ai(&a, "heads_total", H), ai(&a, "sp", P), ai(&a, "width", w), ai(&a, "direction", dir);
    TRY(launch(r, i, pack, &a, Bt, Sl));
    TRY(emit_coll(r, i, L_A2A, send, recv, count));
    kargs u = {0};
    ap(&u, "recv", recv), ap(&u, "dst", out), ai(&u, "seqlen_local", Sl), ai(&u, "batch", Bt);
    ai(&u, "heads_total", H), ai(&u, "sp", P), ai(&u, "width", w), ai(&u, "direction", dir);
    return launch(r, i, unpack, &u, Bt, Sl);
  }
  const int64_t row = Sl * w * (int64_t)es(t); /* one batch item of one rank's tokens */
  if (s->kind == MG_STEP_ALL_GATHER) {
    TRY(emit_coll(r, i, L_GATHER, in, send, count));
    for (int64_t q = 0; q < P; q++) /* block q = rank q's tokens -> rows q S_l.. */
      TRY(emit_copy2d(r, i, bref(out.buf, q * row), P * row, bref(REF_WS, send.off + q * blk),
                      row, row, Bt));
    return 0;
  }
  for (int64_t q = 0; q < P; q++) /* reduce-scatter: block q = rank q's tokens */
    TRY(emit_copy2d(r, i, bref(REF_WS, send.off + q * blk), row, bref(in.buf, q * row), P * row,
                    row, Bt));
  return emit_coll(r, i, L_RSCATTER, send, out, count);
}

/* ---- GEMM ------------------------------------------------------------------------------ */

static int gemm(prep *r, int i) {
  const mg_step *s = &r->p->steps[i];
  lop *l = emit(r, L_GEMM, i);
  if (!l) return MLAGEN_ENOMEM;
  l->gemm = &s->gemm;
  l->a = bref(s->in[0], 0), l->b = bref(s->in[1], 0), l->c = bref(s->out[0], 0);
  l->ta = pb(r, s->in[0])->dtype, l->tb = pb(r, s->in[1])->dtype, l->tc = pb(r, s->out[0])->dtype;
  return 0;
}

/* ---- kernel steps ------------------------------------------------------------------------ */

/* The i-th family of op on the executor's arch (mg_spec.c's tables). */
static const char *op_family(const prep *r, int op, int i) { return mg_op_family_arch(op, i, r->x->arch); }

static int kernel_step(prep *r, int i) {
  const mg_plan *p = r->p;
  const mg_step *s = &p->steps[i];
  const mg_shape *sh = &p->shape;
  const int dn = sh->qk_nope_head_dim, dr = sh->qk_rope_head_dim, dv = sh->v_head_dim,
            dc = sh->kv_lora_rank;
  const mg_dtype t = p->args.dtype;
  const float scale = (float)sh->softmax_scale;
  int k0, k1, k2;
#define IN(k) pb(r, s->in[k])
#define OUT(k) pb(r, s->out[k])
#define BI(k) bref(s->in[k], 0)
#define BO(k) bref(s->out[k], 0)
  switch (s->op) {
    case MG_OP_ATTN_FWD:
    case MG_OP_ATTN_BWD:
    case MG_OP_MQA_FWD:
    case MG_OP_MQA_BWD: {
      const int fwd = s->op == MG_OP_ATTN_FWD || s->op == MG_OP_MQA_FWD;
      const int mqa = s->op == MG_OP_MQA_FWD || s->op == MG_OP_MQA_BWD;
      /* queries [B, S_q, h, ..] at the step's positions (mg_step: q_pos0, q_split, q_pos1)
       * over the keys [B, S_k, ..] (k_nope, or the absorbed form's c) */
      const mg_plan_buf *q = IN(0);
      const int64_t B = q->dims[0], S = q->dims[1], Sk = IN(1)->dims[1];
      const int h = (int)q->dims[2];
      /* positions checked by mg_plan_check (increasing; only laga-cp's explicit attention
       * has any: the absorbed kernels get q_pos0 = 0). A varlen plan's kernels are the
       * families' varlen variants, with the device cu_seqlens (n_seqs = seq, the capacity:
       * mg_varlen_compact's padded copy) after the unpacked arguments. */
      const int vl = p->args.varlen != 0;
      const ref cu = vl ? bref(REF_WS, r->x->cu_off) : rnull;
      if (mqa && fwd) {
        TRY(want_kernel_v(r, i, op_family(r, s->op, 0), vl, h, dn, dr, dv, dc, &k0));
        kargs a = {0};
        if (vl) ap(&a, "cu_seqlens", cu), ai(&a, "n_seqs", p->args.seq);
        ap(&a, "q", BI(0)), ap(&a, "c", BI(1)), ap(&a, "o", BO(0)), ap(&a, "lse", BO(1));
        ai(&a, "seqlen_q", S), ai(&a, "seqlen_k", Sk), ai(&a, "q_pos0", s->q_pos0);
        af(&a, "softmax_scale", scale);
        return launch_qk(r, i, k0, &a, B, S, Sk);
      }
      /* split keys (mg_step.split_keys): k_rope is the latent's columns rope_col.., rows
       * rope_w apart (its last input), and the backward's dk_rope its last output (f32) */
      const ref krope = s->split_keys ? bref(s->in[fwd ? 3 : 6], s->rope_col * (int64_t)es(t)) : rnull;
      if (!mqa && fwd) {
        TRY(want_kernel_v(r, i, op_family(r, s->op, 0), vl, h, dn, dr, dv, dc, &k0));
        kargs a = {0};
        if (vl) ap(&a, "cu_seqlens", cu), ai(&a, "n_seqs", p->args.seq);
        ap(&a, "q", BI(0)), ap(&a, "k_nope", BI(1)), ap(&a, "k_rope", krope), ap(&a, "v", BI(2));
        ai(&a, "ld_k_rope", s->rope_w);
        ap(&a, "o", BO(0)), ap(&a, "lse", BO(1));
        ai(&a, "seqlen_q", S), ai(&a, "seqlen_k", Sk), ai(&a, "q_pos0", s->q_pos0);
        ai(&a, "q_split", s->q_split), ai(&a, "q_pos1", s->q_pos1), af(&a, "softmax_scale", scale);
        return launch_qk(r, i, k0, &a, B, S, Sk);
      }
      /* backward: delta in the step's scratch, by attn_bwd_pre */
      /* the delta over o_lat (d_c wide) for the absorbed form */
      TRY(want_kernel_v(r, i, op_family(r, s->op, 0), vl, h, mqa ? dc : dn, dr, mqa ? dc : dv, dc,
                        &k0));
      TRY(want_kernel_v(r, i, op_family(r, s->op, 1), vl, h, dn, dr, dv, dc, &k1));
      TRY(want_kernel_v(r, i, op_family(r, s->op, 2), vl, h, dn, dr, dv, dc, &k2));
      const ref delta = bref(REF_WS, r->x->mem.step_ws[i]);
      const ref dout = mqa ? BI(4) : BI(5), ob = mqa ? BI(2) : BI(3), lb = mqa ? BI(3) : BI(4);
      kargs pre = {0};
      if (vl) ap(&pre, "cu_seqlens", cu), ai(&pre, "n_seqs", p->args.seq);
      ap(&pre, "o", ob), ap(&pre, "dout", dout), ap(&pre, "delta", delta), ap(&pre, "dq_accum", rnull);
      ai(&pre, "seqlen_q", S);
      TRY(launch(r, i, k0, &pre, B, S));
      kargs a = {0};
      if (vl) ap(&a, "cu_seqlens", cu), ai(&a, "n_seqs", p->args.seq);
      ap(&a, "q", BI(0)), ap(&a, "dout", dout), ap(&a, "lse", lb), ap(&a, "delta", delta);
      ai(&a, "seqlen_q", S), ai(&a, "seqlen_k", Sk), af(&a, "softmax_scale", scale);
      ai(&a, "q_pos0", s->q_pos0);
      if (!mqa) ai(&a, "q_split", s->q_split), ai(&a, "q_pos1", s->q_pos1);
      if (mqa) {
        ap(&a, "c", BI(1)), ap(&a, "dc", BO(1)), ap(&a, "dc_accum", rnull), ap(&a, "dq", BO(0));
      } else {
        ap(&a, "k_nope", BI(1)), ap(&a, "k_rope", krope), ap(&a, "v", BI(2));
        ai(&a, "ld_k_rope", s->rope_w);
        ap(&a, "dq_accum", rnull), ap(&a, "dk_nope", BO(1));
        ap(&a, "dk_rope", s->split_keys ? BO(3) : rnull);
        ap(&a, "dv", BO(2)), ap(&a, "dq", BO(0));
      }
      TRY(launch_qk(r, i, k1, &a, B, S, Sk));
      return launch_qk(r, i, k2, &a, B, S, Sk);
    }
    case MG_OP_EXPAND_KV:
    case MG_OP_SPLIT_DKV: {
      const int expand = s->op == MG_OP_EXPAND_KV;
      const mg_plan_buf *big = IN(0); /* kv or dk: [B, S, Hk, w] */
      const int64_t rows = big->dims[0] * big->dims[1], H = big->dims[2];
      TRY(want_kernel(r, i, op_family(r, s->op, 0), (int)H, dn, dr, dv, dc, &k0));
      kargs a = {0};
      if (expand) { /* split keys: no rope source (the kernel takes none) */
        ap(&a, "kv", BI(0)), ap(&a, "rope", s->split_keys ? rnull : BI(1)), ap(&a, "k", BO(0));
        ap(&a, "v", BO(1));
      } else { /* split keys: the attention backward's dk_rope (in 2) */
        ap(&a, "dk", BI(0)), ap(&a, "dv", BI(1)), ap(&a, "dkv", BO(0)), ap(&a, "drope", BO(1));
        ap(&a, "dk_rope", s->split_keys ? BI(2) : rnull);
        ai(&a, "accumulate", s->accumulate != 0);
      }
      ai(&a, "rows", rows), ai(&a, "rope_col", s->rope_col), ai(&a, "rope_w", s->rope_w);
      return launch(r, i, k0, &a, 1, layout_grid(rows));
    }
    case MG_OP_CONCAT_LATENT:
    case MG_OP_SPLIT_LATENT: {
      const int concat = s->op == MG_OP_CONCAT_LATENT;
      const int64_t rows = mg_plan_buf_numel(concat ? IN(0) : OUT(0)) / dc;
      TRY(want_kernel(r, i, op_family(r, s->op, 0), p->shape.heads, dn, dr, dv, dc, &k0));
      kargs a = {0};
      if (concat) ap(&a, "c_kv", BI(0)), ap(&a, "k_rope", BI(1)), ap(&a, "c", BO(0));
      else ap(&a, "dc", BI(0)), ap(&a, "dc_kv", BO(0)), ap(&a, "dk_rope", BO(1));
      ai(&a, "rows", rows);
      return launch(r, i, k0, &a, 1, layout_grid(rows));
    }
    case MG_OP_CHUNK_ORDER: { /* two strided copies per rank: its chunks, every batch item */
      const mg_plan_buf *src = IN(0);
      const int64_t P = s->ranks, S = src->dims[1], Sl = S / P, a = (Sl + 1) / 2;
      const int64_t e = src->dims[2] * (int64_t)es(t), pitch = S * e;
      for (int64_t q = 0; q < P; q++)
        for (int64_t c = 0; c < 2; c++) {
          const int64_t ranked = q * Sl + c * a, n = c ? Sl - a : a;
          const int64_t global = mg_cp_pos(P, Sl, q, c * a);
          const int64_t from = s->inverse ? global : ranked, to = s->inverse ? ranked : global;
          TRY(emit_copy2d(r, i, bref(s->out[0], to * e), pitch, bref(s->in[0], from * e), pitch,
                          n * e, src->dims[0]));
        }
      return 0;
    }
    case MG_OP_COPY_COLS: {
      const mg_plan_buf *src = IN(0), *dst = OUT(0);
      const int64_t sw = s->src_w ? s->src_w : last_dim(src), dw = s->dst_w ? s->dst_w : last_dim(dst);
      const int64_t rows = mg_plan_buf_numel(src) / sw;
      if (src->dtype != t) { /* laga-f's f32 LSE: a strided copy */
        const int64_t e = (int64_t)es(src->dtype);
        return emit_copy2d(r, i, bref(s->out[0], s->dst_col * e), dw * e,
                           bref(s->in[0], s->src_col * e), sw * e, s->cols * e, rows);
      }
      TRY(want_kernel(r, i, op_family(r, s->op, 0), p->shape.heads, dn, dr, dv, dc, &k0));
      kargs a = {0};
      ap(&a, "src", BI(0)), ap(&a, "dst", BO(0)), ai(&a, "rows", rows), ai(&a, "src_w", sw);
      ai(&a, "src_col", s->src_col), ai(&a, "dst_w", dw), ai(&a, "dst_col", s->dst_col);
      ai(&a, "cols", s->cols);
      return launch(r, i, k0, &a, 1, layout_grid(rows));
    }
  }
#undef IN
#undef OUT
#undef BI
#undef BO
  return 0; /* mg_plan_check refuses unknown ops */
}

/* Lowers step i: at P > 1 the OUTPUT dw_kv_b is zeroed before its first write (this
 * rank's partial sum writes only its heads' rows), then the step's operations. */
static int lower_step(prep *r, int i) {
  const mg_plan *p = r->p;
  for (int b = 0; b < p->n_bufs; b++)
    if (p->args.sp > 1 && p->bufs[b].role == MG_BUF_OUTPUT && p->bufs[b].first == i &&
        !strcmp(p->bufs[b].name, "dw_kv_b")) {
      lop *l = emit(r, L_MEMSET, i);
      if (!l) return MLAGEN_ENOMEM;
      l->a = bref(b, 0), l->bytes = mg_plan_buf_bytes(&p->bufs[b]);
    }
  switch (p->steps[i].kind) {
    case MG_STEP_GEMM: return gemm(r, i);
    case MG_STEP_KERNEL: return kernel_step(r, i);
    default: return collective(r, i);
  }
}
#undef TRY

/* ---- the op boundary ---------------------------------------------------------------------- */

/* The caller's tensor of op-boundary slot k (mg_plan_check.h: inputs 0..4, outputs 5..9). */
static void *caller_tensor(const mg_cuda_tensors *t, int k) {
  const void *const all[2 * MG_PLAN_N_IO] = {t->q, t->c_kv, t->k_rope, t->w_kv_b, t->d_o,
                                             t->o, t->dq, t->dc_kv, t->dk_rope, t->dw_kv_b};
  return (void *)all[k];
}

/* The op-boundary slot of caller buffer b (mg_plan_check checked its name), else -1. */
static int caller_slot(const mg_plan_buf *b) {
  if (b->role == MG_BUF_TEMP) return -1;
  const char *const *names = b->role == MG_BUF_INPUT ? mg_plan_input_names : mg_plan_output_names;
  for (int k = 0; k < MG_PLAN_N_IO; k++)
    if (!strcmp(b->name, names[k])) return k + (b->role == MG_BUF_INPUT ? 0 : MG_PLAN_N_IO);
  return -1;
}

/* ---- prepare ----------------------------------------------------------------------------- */

/* The bytes of a varlen plan's device cu_seqlens: (seq + 1) int32, rounded up to
 * MG_CUDA_EXEC_ALIGN; 0 for an unpacked plan. */
static int64_t cu_region_bytes(const mg_plan *p) {
  if (!p->args.varlen) return 0;
  const int64_t b = (p->args.seq + 1) * (int64_t)sizeof(int32_t);
  return (b + MG_CUDA_EXEC_ALIGN - 1) / MG_CUDA_EXEC_ALIGN * MG_CUDA_EXEC_ALIGN;
}

/* mg_cuda_exec_mem_layout, and where the device cu_seqlens is (*cu_offset; -1: none). */
static int mem_layout(const mg_plan *p, mg_plan_mem *m, int64_t *blas_offset, int64_t *cu_offset,
                      mg_diag *d) {
  *blas_offset = *cu_offset = -1;
  int rc = mg_plan_mem_layout(p, MG_CUDA_EXEC_ALIGN, m, d);
  if (rc) return rc;
  int gemms = 0;
  for (int i = 0; i < p->n_steps; i++) gemms |= p->steps[i].kind == MG_STEP_GEMM;
  const int64_t extra = (gemms ? MG_CUDA_EXEC_BLAS_WS : 0) + cu_region_bytes(p);
  if (p->args.seq < 0 || m->workspace_bytes > INT64_MAX - extra)
    return mg_diag_set(d, MLAGEN_EINVAL, "workspace of %lld bytes: no room for cuBLAS's and "
                       "cu_seqlens", (long long)m->workspace_bytes);
  if (gemms) { /* at a multiple of MG_CUDA_EXEC_ALIGN */
    *blas_offset = m->workspace_bytes;
    m->workspace_bytes += MG_CUDA_EXEC_BLAS_WS;
  }
  if (p->args.varlen) {
    *cu_offset = m->workspace_bytes;
    m->workspace_bytes += cu_region_bytes(p);
  }
  return 0;
}

int mg_cuda_exec_mem_layout(const mg_plan *p, mg_plan_mem *m, int64_t *blas_offset, mg_diag *d) {
  if (!blas_offset) return mg_diag_set(d, MLAGEN_EINVAL, "mg_cuda_exec_mem_layout: blas_offset is NULL");
  int64_t cu;
  return mem_layout(p, m, blas_offset, &cu, d);
}

/* A boolean environment variable: *on = 1 for 1, true, yes or on; 0 when unset, empty, or
 * 0, false, no or off (any letter case); MLAGEN_EINVAL naming those for anything else. */
int mg_cuda_exec_prepare(const mg_plan *p, mg_dev_ops *o, const mg_cuda_exec_opts *opts,
                         mg_cuda_exec **out, mg_diag *d) {
  if (out) *out = NULL;
  if (!p || !o || !out)
    return mg_diag_set(d, MLAGEN_EINVAL, "mg_cuda_exec_prepare: plan, ops or out is NULL");
  if (p->args.dtype != MG_BF16 && p->args.dtype != MG_F16)
    return mg_diag_set(d, MLAGEN_EINVAL, "the CUDA executor runs bf16 or f16 plans, not %s (f32 "
                       "and f64 plans run on the CPU executor)", mg_dtype_name(p->args.dtype));
  int rc = mg_plan_check(p, d);
  if (!rc) rc = mg_plan_check_gemm_int(p, "cuBLAS", d);
  if (rc) return rc;
  int force = 0;
  if ((rc = mg_spec_mma_sync_forced(&force, d))) return mg_diag_prefix(d, "CUDA executor");
  mg_cuda_exec *x = calloc(1, sizeof *x);
  if (!x) return mg_diag_set(d, MLAGEN_ENOMEM, "CUDA executor: out of memory");
  x->p = p;
  x->ops = o;
  mg_cuda_exec_set_timeout(x, opts ? opts->timeout_s : 0);
  snprintf(x->tune_dir, sizeof x->tune_dir, "%s", opts && opts->tune_dir ? opts->tune_dir : "");
  /* the families of the device's arch (sm_90a: attn_fwd_sm90), unless forced to the portable
   * mma.sync ones or the sm_90a ones could not get their tensor maps */
  const int mma_sync = (opts && opts->mma_sync) || force;
  if (mma_sync)
    snprintf(x->arch_note, sizeof x->arch_note, "; the mma.sync families (%s)",
             opts && opts->mma_sync ? "mma_sync option" : "MLAGEN_MMA_SYNC");
  else if (o->arch[0] && (!o->drv || !o->drv->cuTensorMapEncodeTiled))
    snprintf(x->arch_note, sizeof x->arch_note, "; the mma.sync families (the %s ops have no "
             "driver with cuTensorMapEncodeTiled)", o->name);
  else
    snprintf(x->arch, sizeof x->arch, "%s", o->arch);
  for (int b = 0; b < p->n_bufs; b++) x->slot[b] = (signed char)caller_slot(&p->bufs[b]);
  rc = mem_layout(p, &x->mem, &x->blas_off, &x->cu_off, d);
  if (rc) {
    mg_diag_prefix(d, "CUDA executor: memory layout");
    free(x);
    return rc;
  }
  if (p->args.varlen) { /* cu_seqlens: staged here, uploaded at each pass */
    if (!o->upload) rc = mg_diag_set(d, MLAGEN_EINVAL, "a varlen plan needs device ops that "
                                     "upload (the %s ops have no upload)", o->name);
    else if (!(x->cu_host = malloc((size_t)(p->args.seq + 1) * sizeof *x->cu_host)))
      rc = mg_diag_set(d, MLAGEN_ENOMEM, "CUDA executor: out of memory");
    if (rc) {
      free(x);
      return rc;
    }
  }
  int own_gen = !(opts && opts->gen) && !o->gen;
  if (own_gen) rc = mg_gen_open(&x->gen, NULL, d);
  else x->gen = opts && opts->gen ? opts->gen : o->gen;
  prep r = {.x = x, .p = p, .d = d};
  for (int i = 0; i < p->n_steps && !rc; i++) {
    if (i == p->n_fwd) x->n_fwd_ops = x->n_prog;
    rc = lower_step(&r, i);
  }
  if (p->n_fwd == p->n_steps) x->n_fwd_ops = x->n_prog;
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
  for (int i = 0; i < x->n_kerns; i++) free(x->kerns[i].tinfo);
  free(x->kerns);
  free(x->prog);
  free(x->cu_host);
  free(x);
}

/* ---- run ----------------------------------------------------------------------------------- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void mg_cuda_exec_set_timeout(mg_cuda_exec *x, double timeout_s) {
  if (x) x->timeout_s = timeout_s != 0 ? timeout_s : 600;
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

/* C = 0 for a GEMM with no valid token rows (k = 0, beta 0): its m x n block of each batch
 * item, one memset where they are contiguous. */
static int zero_c(mg_dev_ops *o, const mg_gemm *g, mg_dtype tc, void *C, void *stream, mg_diag *d) {
  const size_t e = es(tc);
  char *c = (char *)C + (size_t)g->off_c * e;
  if (g->ldc == g->n && (g->batch == 1 || g->stride_c == g->m * g->n))
    return o->memset(o, c, 0, (size_t)(g->batch * g->m * g->n) * e, stream, d);
  for (int b = 0; b < g->batch; b++)
    for (int64_t row = 0; row < (g->ldc == g->n ? 1 : g->m); row++) {
      const size_t bytes = (size_t)(g->ldc == g->n ? g->m * g->n : g->n) * e;
      int rc = o->memset(o, c + (size_t)(b * g->stride_c + row * g->ldc) * e, 0, bytes, stream, d);
      if (rc) return rc;
    }
  return 0;
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
  void *buf[MG_PLAN_MAX_BUFS]; /* where each buffer is for this call */
  for (int b = 0; b < p->n_bufs; b++) {
    if (x->mem.where[b] == MG_MEM_CALLER) buf[b] = caller_tensor(t, x->slot[b]);
    else buf[b] = (char *)(x->mem.where[b] == MG_MEM_SAVED ? saved : workspace) + x->mem.offset[b];
  }
  for (int i = first; i < end; i++) { /* every caller tensor the pass touches is given */
    const mg_step *s = &p->steps[i];
    for (int k = 0; k < s->n_in + s->n_out; k++) {
      int b = k < s->n_in ? s->in[k] : s->out[k - s->n_in];
      if (x->mem.where[b] == MG_MEM_CALLER && !buf[b])
        return mg_diag_set(d, MLAGEN_EINVAL, "%s: tensor %s is NULL (step %d, %s)", pname,
                           p->bufs[b].name, i, s->label);
    }
  }
  int64_t T = 0; /* varlen: the stream's tokens, cu[N] */
  if (p->args.varlen) {
    if (!t->cu_seqlens)
      return mg_diag_set(d, MLAGEN_EINVAL, "%s: a varlen plan needs tensors->cu_seqlens", pname);
    int rc = mg_varlen_check(t->cu_seqlens, t->n_cu, p->args.seq, "tensors->cu_seqlens", d);
    if (rc) return mg_diag_prefix(d, "%s", pname);
    T = t->cu_seqlens[t->n_cu - 1];
  } else if (t->cu_seqlens || t->n_cu) {
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: tensors->cu_seqlens given (%lld entries) for a plan "
                       "that is not varlen (mlagen_plan_desc.varlen)", pname, (long long)t->n_cu);
  }
  mg_dev_ops *o = x->ops;
  if (x->cu_off >= 0) { /* the compacted copy, padded with T to seq + 1 entries */
    const int64_t n = p->args.seq + 1;
    mg_varlen_compact(t->cu_seqlens, t->n_cu - 1, x->cu_host, n);
    int rc = o->upload(o, (char *)workspace + x->cu_off, x->cu_host, (size_t)n * sizeof(int32_t),
                       stream, d);
    if (rc) return mg_diag_prefix(d, "%s: uploading cu_seqlens", pname);
  }
  if (x->blas_off >= 0 && o->gemm_workspace) { /* the aligned part of the GEMMs' slice */
    const uintptr_t at = (uintptr_t)workspace + (uintptr_t)x->blas_off;
    const uintptr_t lead = (MG_CUDA_EXEC_ALIGN - at % MG_CUDA_EXEC_ALIGN) % MG_CUDA_EXEC_ALIGN;
    int rc = o->gemm_workspace(o, (char *)workspace + x->blas_off + lead,
                               (size_t)MG_CUDA_EXEC_BLAS_WS - lead, d);
    if (rc) return mg_diag_prefix(d, "%s: the GEMMs' workspace", pname);
  }
  /* replay the pass's part of the lowered program */
#define R(rf) ((rf).buf >= 0 ? (void *)((char *)buf[(rf).buf] + (rf).off) \
               : (rf).buf == REF_WS ? (void *)((char *)workspace + (rf).off) : NULL)
  const int j0 = pass == MG_FWD ? 0 : x->n_fwd_ops, j1 = pass == MG_FWD ? x->n_fwd_ops : x->n_prog;
  for (int j = j0; j < j1; j++) {
    const lop *l = &x->prog[j];
    int rc = 0;
    switch (l->kind) {
      case L_LAUNCH: {
        const kern *k = &x->kerns[l->kern];
        void *ptrs[MAX_PARAMS], *params[MAX_PARAMS];
        CUtensorMap maps[MG_SM90_MAX_TMAPS]; /* copied by the launch: by value, no upload */
        for (int q = 0; q < k->n_params; q++) {
          if (l->pkind[q] == 'p') ptrs[q] = R(l->ptr[q]), params[q] = &ptrs[q];
          else params[q] = l->pkind[q] == 'i' ? (void *)&l->ival[q] : (void *)&l->fval[q];
        }
        if (k->tparam >= 0) {
          int n_maps = 0;
          params[k->tparam] = maps;
          rc = mg_sm90_launch_tmaps(o->drv, &k->spec, k->tinfo, params, &l->dims, maps,
                                    MG_SM90_MAX_TMAPS, &n_maps, d);
          if (rc) break;
        }
        rc = o->launch(o, k->handle, l->grid, k->rule.block, k->rule.smem, params, stream, d);
        break;
      }
      case L_GEMM: {
        mg_gemm g = *l->gemm;
        if (g.tok_k && p->args.varlen) g.k = mg_varlen_valid_rows(T, g.tok0, g.k);
        if (g.k > 0) rc = o->gemm(o, &g, l->ta, R(l->a), l->tb, R(l->b), l->tc, R(l->c), stream, d);
        else if (g.beta == 0) rc = zero_c(o, &g, l->tc, R(l->c), stream, d); /* C = beta C */
        break;
      }
      case L_COPY: rc = o->copy(o, R(l->a), R(l->b), (size_t)l->bytes, stream, d); break;
      case L_COPY2D:
        rc = o->copy2d(o, R(l->a), (size_t)l->dpitch, R(l->b), (size_t)l->spitch, (size_t)l->width,
                       (size_t)l->height, stream, d);
        break;
      case L_MEMSET: rc = o->memset(o, R(l->a), 0, (size_t)l->bytes, stream, d); break;
      case L_A2A: rc = comm->ops->all_to_all(comm, R(l->a), R(l->b), l->count, l->ta, d); break;
      case L_GATHER: rc = comm->ops->all_gather(comm, R(l->a), R(l->b), l->count, l->ta, d); break;
      case L_RSCATTER: rc = comm->ops->reduce_scatter(comm, R(l->a), R(l->b), l->count, l->ta, d); break;
    }
    if (rc) return step_prefix(p, d, l->step, rc);
  }
#undef R
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
