/* cli_run.c: `mlagen run`: execute a form on the CPU (one process, or one per rank under
 * mpirun), report measured memory against the planner, compare forms, dump results. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "mg_comm.h"
#include "mg_fs.h"
#include "mg_cpu_exec.h"
#include "mg_plan.h"
#include "mg_safetensors.h"
#include "mg_varlen.h"
#include "mlagen.h"
#include <sys/stat.h>
#ifdef MLAGEN_HAVE_MPI
#include <mpi.h>
#endif

static const char help[] =
    "usage: mlagen run --seq S [--backend cpu] [--model M] [--sp P] [--batch B] [--form F]\n"
    "                  [--dtype f32|f64] [--causal | --no-causal] [--head-groups N]\n"
    "                  [--cp-head-groups N] [--seed N]\n"
    "                  [--inputs FILE] [--dump FILE] [--check]\n"
    "\n"
    "Runs one MLA attention layer, forward then backward, with the CPU executor: the\n"
    "form's plan (see `mlagen plan --steps`) step by step, collectives over MPI. Run P\n"
    "ranks with `mpirun -np P mlagen run --sp P ...` (without mpirun, P must be 1).\n"
    "Prints the bytes each rank kept from forward to backward, the peaks of both passes\n"
    "and the bytes sent, measured by the executor's allocator, next to the planner's.\n"
    "\n"
    "  --backend cpu  the executor (only cpu for now)\n"
    "  --form F       explicit (default), absorbed, laga, laga-r, laga-f, laga-cp\n"
    "  --seq S        global sequence length; each rank holds S / P tokens (required\n"
    "                 without --inputs, else taken from q)\n"
    "  --sp P         sequence-parallel degree (default 1) = the number of MPI ranks; it\n"
    "                 must divide S, and H for every form but laga-cp\n"
    "  --batch B      batch size (default 1; with --inputs taken from q)\n"
    "  --dtype T      f32 (default) or f64\n"
    "  --no-causal    full attention (causal, by global position, is the default)\n"
    "  --head-groups N  laga-f: head groups K/V are rebuilt in (default: see mlagen plan)\n"
    "  --cp-head-groups N  laga-cp: the same (N divides H; default: see mlagen plan)\n"
    "  --seed N       inputs drawn from N (default 1), identical on every rank: element i\n"
    "                 (row-major index in the global tensor) of tensor n (q 1, c_kv 2,\n"
    "                 k_rope 3, w_kv_b 4, do 5) is scale * N(0,1) by Box-Muller from\n"
    "                 splitmix64(seed, n, i); scale 0.5, w_kv_b 1/sqrt(d_c)\n"
    "  --inputs FILE  read the inputs from a safetensors file (each rank takes its\n"
    "                 shard): q [B,S,H,d_n+d_r], c_kv [B,S,d_c], k_rope [B,S,d_r],\n"
    "                 w_kv_b [H*(d_n+d_v),d_c], do [B,S,H,d_v]; bf16, f16, f32 or f64\n"
    "                 (a rank's shard: tokens [r S/P, (r+1) S/P); under laga-cp two chunks,\n"
    "                 a = ceil(S_l/2) tokens from r a, then S_l - a from\n"
    "                 P a + (P-1-r)(S_l - a), S_l = S/P: chunks r and 2P-1-r of 2P)\n"
    "                 Packed sequences: a file that also holds cu_seqlens [N+1] (I32 or\n"
    "                 I64 values within int32: 0, non-decreasing, at most T) gives N\n"
    "                 documents packed into one stream, THD layout: q [T,H,d_n+d_r],\n"
    "                 c_kv [T,d_c], k_rope [T,d_r], w_kv_b, do [T,H,d_v]; T is the token\n"
    "                 capacity (rows from cu_seqlens[N] on are slack), each rank takes\n"
    "                 its T/P tokens as above; attention stays inside each document\n"
    "  --dump FILE    write the global results as safetensors in the run's dtype (F32\n"
    "                 or F64; rank 0, atomic):\n"
    "                 o [B,S,H,d_v], lse [B,H,S], dq, dc_kv, dk_rope, dw_kv_b (summed\n"
    "                 over ranks); packed: o [T,H,d_v], lse [H,T], dq [T,H,d_n+d_r],\n"
    "                 dc_kv [T,d_c], dk_rope [T,d_r] (slack rows: 0, lse -inf)\n"
    "  --check        run explicit and the --form F given (without --form, or with\n"
    "                 explicit: every form that runs at P) on the same inputs and print\n"
    "                 each one's max relative error (max|a-b| / max|b|) against explicit;\n"
    "                 fails above 1e-4 (f32) or 1e-10 (f64). Where P does not divide H\n"
    "                 (only laga-cp runs) the reference is explicit at P = 1 on rank 0,\n"
    "                 over the same global inputs\n";

/* Parses and checks the options of `mlagen run`. */
static int parse(int argc, char **argv, cli_opts *o) {
  int rc = cli_parse(argc, argv,
                     "backend model form dtype inputs dump seq sp batch seed causal no-causal head-groups cp-head-groups check",
                     help, o);
  if (rc) return rc;
  if (!o->dtype) o->dtype = "f32";
  if (strcmp(o->backend, "cpu") != 0) {
    cli_error("--backend %s: only the cpu backend runs for now", o->backend);
    return CLI_USAGE;
  }
  mg_form f;
  if (mg_form_parse(o->form, &f)) {
    cli_error("--form %s: expected explicit, absorbed, laga, laga-r, laga-f or laga-cp", o->form);
    return CLI_USAGE;
  }
  const int check_all = o->check && f == MG_FORM_EXPLICIT; /* --check of every form */
  if (o->head_groups && f != MG_FORM_LAGA_F && !check_all) {
    cli_error("--head-groups applies to --form laga-f (or --check without --form, which runs it)");
    return CLI_USAGE;
  }
  if (o->cp_head_groups && f != MG_FORM_LAGA_CP && !check_all) {
    cli_error("--cp-head-groups applies to --form laga-cp (or --check without --form, which runs "
              "it)");
    return CLI_USAGE;
  }
  if (strcmp(o->dtype, "f32") && strcmp(o->dtype, "f64")) {
    cli_error("--dtype %s: the CPU executor runs f32 or f64", o->dtype);
    return CLI_USAGE;
  }
  if (!o->inputs && !o->seq) {
    cli_error("run: --seq S is required without --inputs (see --help)");
    return CLI_USAGE;
  }
  return 0;
}

/* ---- the group of ranks -------------------------------------------------------------- */

typedef struct group {
  mg_comm *comm; /* NULL until made */
  int rank, size;
  int mpi;       /* MPI_Init was called here */
} group;

/* The lowest rank with failed != 0, or -1 when no rank failed: every rank learns the
 * same, so all stop together and one message is printed. */
static int agree(const group *g, int failed) {
#ifdef MLAGEN_HAVE_MPI
  if (g->mpi && g->size > 1) {
    int mine = failed ? g->rank : INT_MAX, low = INT_MAX;
    MPI_Allreduce(&mine, &low, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return low == INT_MAX ? -1 : low;
  }
#endif
  return failed ? g->rank : -1;
}

/* 1 when every rank passed the same fingerprint (of its options and shapes). */
static int same_everywhere(const group *g, uint64_t fingerprint) {
#ifdef MLAGEN_HAVE_MPI
  if (g->mpi && g->size > 1) {
    uint64_t lo = 0, hi = 0;
    MPI_Allreduce(&fingerprint, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&fingerprint, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    return lo == hi;
  }
#endif
  (void)g;
  (void)fingerprint;
  return 1;
}

static uint64_t fnv(uint64_t h, int64_t v) { /* FNV-1a over the 8 bytes of v */
  for (int i = 0; i < 8; i++) h = (h ^ (uint64_t)((v >> (8 * i)) & 0xff)) * 1099511628211ULL;
  return h;
}

/* MemAvailable from /proc/meminfo in bytes, or -1 when unknown. */
static int64_t mem_available(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f) return -1;
  char line[256];
  long long kb = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
  fclose(f);
  return kb < 0 ? -1 : (int64_t)kb * 1024;
}

/* A failure after ranks may have diverged (inside a collective): stop them all. */
static void abort_group(const group *g) {
#ifdef MLAGEN_HAVE_MPI
  if (g->mpi && g->size > 1) MPI_Abort(MPI_COMM_WORLD, 1);
#else
  (void)g;
#endif
}

/* ---- inputs -------------------------------------------------------------------------- */

static uint64_t mix(uint64_t x) { /* splitmix64 */
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Element i of tensor n drawn from seed: a standard normal (Box-Muller). */
static double draw(uint64_t seed, uint64_t n, uint64_t i) {
  uint64_t a = mix(mix(mix(seed) ^ n) ^ i), b = mix(a);
  double u1 = ((double)(a >> 11) + 1.0) * 0x1p-53; /* (0, 1] */
  double u2 = (double)(b >> 11) * 0x1p-53;         /* [0, 1) */
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static void put(mg_dtype t, void *p, int64_t i, double x) {
  if (t == MG_F64)
    ((double *)p)[i] = x;
  else
    ((float *)p)[i] = (float)x;
}
static double get(mg_dtype t, const void *p, int64_t i) {
  return t == MG_F64 ? ((const double *)p)[i] : (double)((const float *)p)[i];
}

/* The op's inputs: name, tensor number of the generator, global shape. */
typedef struct input_spec {
  const char *name;
  int n;          /* generator tensor number */
  int ndim;
  int64_t dims[4]; /* global shape; sharded along dim 1 unless ndim == 2 (w_kv_b) */
  double scale;
  int thd;        /* 1: packed (THD) in the file: dims without dims[0] = B = 1 */
} input_spec;

static void input_specs(const mg_shape *s, int64_t B, int64_t S, int varlen, input_spec *in) {
  const int64_t H = s->heads, dn = s->qk_nope_head_dim, dr = s->qk_rope_head_dim,
                dv = s->v_head_dim, dc = s->kv_lora_rank;
  in[0] = (input_spec){"q", 1, 4, {B, S, H, dn + dr}, 0.5, varlen};
  in[1] = (input_spec){"c_kv", 2, 3, {B, S, dc}, 0.5, varlen};
  in[2] = (input_spec){"k_rope", 3, 3, {B, S, dr}, 0.5, varlen};
  in[3] = (input_spec){"w_kv_b", 4, 2, {H * (dn + dv), dc}, 1.0 / sqrt((double)dc), 0};
  in[4] = (input_spec){"do", 5, 4, {B, S, H, dv}, 0.5, varlen};
}
#define N_INPUTS 5

static int64_t numel_of(const int64_t *dims, int ndim) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= dims[i];
  return n;
}

/* This rank's shard of input spec in under form f: its dims[1] / P tokens
 * (mg_form_token_pos: from token rank * dims[1] / P, or laga-cp's two chunks). */
static void draw_shard(const input_spec *in, uint64_t seed, mg_form f, int rank, int P, mg_dtype t,
                       void *out) {
  if (in->ndim == 2) {
    for (int64_t i = 0; i < numel_of(in->dims, 2); i++)
      put(t, out, i, in->scale * draw(seed, (uint64_t)in->n, (uint64_t)i));
    return;
  }
  const int64_t B = in->dims[0], S = in->dims[1], Sl = S / P, w = numel_of(in->dims + 2, in->ndim - 2);
  for (int64_t b = 0; b < B; b++)
    for (int64_t s = 0; s < Sl; s++)
      for (int64_t c = 0; c < w; c++) {
        const int64_t g = (b * S + mg_form_token_pos(f, P, Sl, rank, s)) * w + c;
        put(t, out, (b * Sl + s) * w + c, in->scale * draw(seed, (uint64_t)in->n, (uint64_t)g));
      }
}

/* This rank's shard of input spec in from file under form f's layout: one slice of
 * dims[1] / P tokens, or laga-cp's two chunks (each read, then placed per batch item). */
static int read_shard(const mg_st_file *file, const input_spec *in, mg_form f, int rank, int P,
                      mg_dtype t, void *out, mg_diag *d) {
  if (in->ndim == 2)
    return t == MG_F64 ? mg_st_read_f64(file, in->name, 2, in->dims, out, d)
                       : mg_st_read_f32(file, in->name, 2, in->dims, out, d);
  const int64_t B = in->dims[0], Sl = in->dims[1] / P, a = (Sl + 1) / 2,
                w = numel_of(in->dims + 2, in->ndim - 2);
  const size_t es = mg_dtype_size(t);
  const int two = f == MG_FORM_LAGA_CP && Sl > a;
  for (int c = 0; c < 1 + two; c++) {
    const int64_t first = two ? c * a : 0, n = two ? (c ? Sl - a : a) : Sl;
    const int64_t start = mg_form_token_pos(f, P, Sl, rank, first);
    void *part = two ? malloc((size_t)(B * n * w) * es) : out;
    if (!part) return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
    const int nd = in->ndim - in->thd, dim = 1 - in->thd; /* THD: tokens are dim 0 */
    const int64_t *dims = in->dims + in->thd;
    int rc = t == MG_F64 ? mg_st_read_f64_rows(file, in->name, nd, dims, dim, start, n, part, d)
                         : mg_st_read_f32_rows(file, in->name, nd, dims, dim, start, n, part, d);
    for (int64_t b = 0; two && !rc && b < B; b++)
      memcpy((char *)out + (size_t)((b * Sl + first) * w) * es,
             (const char *)part + (size_t)(b * n * w) * es, (size_t)(n * w) * es);
    if (two) free(part);
    if (rc) return rc;
  }
  return 0;
}

/* The documents of a packed run (cu_seqlens from --inputs), or none (n = 0). */
typedef struct docs {
  int32_t *cu;
  int64_t n; /* entries, N + 1 */
} docs;

/* The documents of a packed inputs file: its 1-D integer tensor cu_seqlens (I32 or I64),
 * every value within int32, checked against the token capacity cap (mg_varlen_check: the
 * first bad index named). */
static int read_docs(const mg_st_file *file, const mg_st_tensor *t, int64_t cap, docs *out,
                     mg_diag *d) {
  const char *path = mg_st_path(file);
  if (t->ndim != 1 || t->shape[0] < 1)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: tensor 'cu_seqlens' must have one dim of N + 1 >= 1 "
                       "entries (the boundaries of N packed documents), not %d dim%s%s", path,
                       t->ndim, t->ndim == 1 ? "" : "s", t->ndim == 1 ? " of 0 entries" : "");
  const int64_t n = t->shape[0];
  int64_t *wide = malloc((size_t)n * sizeof *wide);
  out->cu = malloc((size_t)n * sizeof *out->cu);
  int rc = !wide || !out->cu ? mg_diag_set(d, MLAGEN_ENOMEM, "out of memory")
                             : mg_st_read_i64(file, "cu_seqlens", 1, &n, wide, d);
  for (int64_t i = 0; !rc && i < n; i++) {
    if (wide[i] < INT32_MIN || wide[i] > INT32_MAX)
      rc = mg_diag_set(d, MLAGEN_EINVAL, "%s: cu_seqlens[%lld] = %lld does not fit int32 (token "
                       "offsets are int32, as FlashAttention's)", path, (long long)i,
                       (long long)wide[i]);
    else
      out->cu[i] = (int32_t)wide[i];
  }
  free(wide);
  if (!rc && (rc = mg_varlen_check(out->cu, n, cap, "cu_seqlens", d)))
    mg_diag_prefix(d, "%s (%lld token rows)", path, (long long)cap);
  if (rc) {
    free(out->cu);
    out->cu = NULL;
    return rc;
  }
  out->n = n;
  return 0;
}

/* ---- results, gathered to every rank ----------------------------------------------------- */

enum { R_O, R_LSE, R_DQ, R_DC_KV, R_DK_ROPE, R_DW, N_RESULTS };
static const char *const result_names[N_RESULTS] = {"o", "lse", "dq", "dc_kv", "dk_rope", "dw_kv_b"};

typedef struct result {
  double *v[N_RESULTS];   /* global tensors, double */
  int64_t dims[N_RESULTS][4];
  int ndim[N_RESULTS];
  mg_cpu_stats st;
  mg_plan_cost cost;
  int matches_plan;      /* on every rank */
  int varlen;            /* packed: THD shapes, lse -inf in slack rows */
} result;

static void result_free(result *r) {
  for (int k = 0; k < N_RESULTS; k++) free(r->v[k]);
  memset(r, 0, sizeof *r);
}

/* all_gather of a local [A, n_s, n_h, w] block into global [A, P n_s, n_h, w] when
 * along_seq != 0 (rank p's row s at global row mg_form_token_pos(f, P, n_s, p, s)), or
 * [A, n_s, P n_h, w] (heads) otherwise, converted to double. */
static int gather(const group *g, mg_form f, mg_dtype t, const void *local, int64_t A, int64_t n_s,
                  int64_t n_h, int64_t w, int along_seq, double *out, mg_diag *d) {
  const int P = g->size;
  const size_t count = (size_t)(A * n_s * n_h * w), es = mg_dtype_size(t);
  void *all = malloc(count * (size_t)P * es);
  if (!all) return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
  int rc = g->comm->ops->all_gather(g->comm, local, all, count, t, d);
  for (int p = 0; !rc && p < P; p++)
    for (int64_t a = 0; a < A; a++)
      for (int64_t s = 0; s < n_s; s++)
        for (int64_t h = 0; h < n_h; h++)
          for (int64_t c = 0; c < w; c++) {
            const int64_t src = (int64_t)p * (int64_t)count + ((a * n_s + s) * n_h + h) * w + c;
            const int64_t dst = along_seq ? ((a * n_s * P + mg_form_token_pos(f, P, n_s, p, s)) * n_h + h) * w + c
                                          : ((a * n_s + s) * n_h * P + p * n_h + h) * w + c;
            out[dst] = get(t, all, src);
          }
  free(all);
  return rc;
}

/* Runs plan p on this rank and gathers its results to every rank. */
static int run_form(const group *g, const mg_plan *p, const void *const *in, const docs *ds,
                    result *r, mg_diag *d) {
  memset(r, 0, sizeof *r);
  const mg_shape *s = &p->shape;
  const mg_dtype t = p->args.dtype;
  const int64_t B = p->args.batch, S = p->args.seq, Sl = p->seq_local, H = s->heads,
                Hl = p->heads_local, dn = s->qk_nope_head_dim, dr = s->qk_rope_head_dim,
                dv = s->v_head_dim, dc = s->kv_lora_rank, W = H * (dn + dv);
  int lse_id = mg_plan_find(p, "lse");
  if (lse_id < 0) return mg_diag_set(d, MLAGEN_EINVAL, "%s plan has no lse", mg_form_name(p->args.form));
  const size_t lse_bytes = (size_t)mg_plan_buf_bytes(&p->bufs[lse_id]);
  void *lse = malloc(lse_bytes);
  if (!lse) return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
  mg_cpu_capture cap = {"lse", lse, lse_bytes};
  mg_cpu_tensors ts = {.q = in[0], .c_kv = in[1], .k_rope = in[2], .w_kv_b = in[3], .d_o = in[4],
                       .captures = &cap, .n_captures = 1, .cu_seqlens = ds->cu, .n_cu = ds->n};
  int rc = mg_cpu_run(p, g->comm, &ts, &r->st, d);
  if (rc) {
    free(lse);
    return rc;
  }
  mg_plan_cost_of(p, &r->cost);
  const int64_t shapes[N_RESULTS][4] = {{B, S, H, dv}, {B, H, S, 0}, {B, S, H, dn + dr},
                                        {B, S, dc, 0}, {B, S, dr, 0},  {W, dc, 0, 0}};
  const int nd[N_RESULTS] = {4, 3, 4, 3, 3, 2};
  r->varlen = p->args.varlen;
  for (int k = 0; k < N_RESULTS && !rc; k++) {
    /* packed: THD, the batch dim (1) dropped; the same values in the same order */
    const int drop = r->varlen && k != R_DW;
    memcpy(r->dims[k], shapes[k] + drop, sizeof shapes[k] - (size_t)drop * sizeof shapes[k][0]);
    r->ndim[k] = nd[k] - drop;
    if (!(r->v[k] = malloc((size_t)numel_of(shapes[k], nd[k]) * sizeof(double))))
      rc = mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
  }
  const mg_form f = p->args.form;
  if (!rc) rc = gather(g, f, t, ts.o, B, Sl, H, dv, 1, r->v[R_O], d);
  if (!rc && f == MG_FORM_LAGA_CP) /* lse [B, H, S_l] of this rank's queries */
    rc = gather(g, f, mg_plan_acc_dtype(p), lse, B * H, Sl, 1, 1, 1, r->v[R_LSE], d);
  else if (!rc) /* lse [B, H/P, S] of this rank's heads */
    rc = gather(g, f, mg_plan_acc_dtype(p), lse, B, 1, Hl, S, 0, r->v[R_LSE], d);
  if (!rc) rc = gather(g, f, t, ts.dq, B, Sl, H, dn + dr, 1, r->v[R_DQ], d);
  if (!rc) rc = gather(g, f, t, ts.dc_kv, B, Sl, 1, dc, 1, r->v[R_DC_KV], d);
  if (!rc) rc = gather(g, f, t, ts.dk_rope, B, Sl, 1, dr, 1, r->v[R_DK_ROPE], d);
  if (!rc) { /* dw_kv_b: the sum of the ranks' partial gradients */
    double *parts = malloc((size_t)(W * dc) * (size_t)g->size * sizeof(double));
    if (!parts) rc = mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
    if (!rc) rc = gather(g, f, mg_plan_acc_dtype(p), ts.dw_kv_b, 1, W * dc, 1, 1, 0, parts, d); /* [W dc, P] */
    for (int64_t i = 0; !rc && i < W * dc; i++) {
      double sum = 0;
      for (int q = 0; q < g->size; q++) sum += parts[i * g->size + q];
      r->v[R_DW][i] = sum;
    }
    free(parts);
  }
  r->matches_plan = r->st.saved == r->cost.saved && r->st.peak_fwd == r->cost.peak_fwd &&
                    r->st.peak_bwd == r->cost.peak_bwd && r->st.sent_fwd == r->cost.sent_fwd &&
                    r->st.sent_bwd == r->cost.sent_bwd;
  mg_cpu_tensors_free(&ts);
  free(lse);
  if (rc) result_free(r);
  return rc;
}

/* 1 for the lse of a packed run's row without keys (slack): -inf by convention. */
static int keyless(const result *r, int k, double v) {
  return r->varlen && k == R_LSE && v == -INFINITY;
}

/* max |a - b| / max |b| over tensor k; NaN when either holds a NaN or an infinity (but
 * for both -inf in keyless rows), so a check never passes on non-finite values (fmax
 * would drop a NaN). */
static double rel_err(const result *a, const result *b, int k) {
  /* per element: max_i |a_i - b_i| / (rms(b) + |b_i|), so one element off by more than
   * tol times its own size (or the tensor's rms, for elements near 0) fails the check */
  double ss = 0, worst = 0;
  int64_t m = 0;
  const int64_t n = numel_of(b->dims[k], b->ndim[k]);
  for (int64_t i = 0; i < n; i++) {
    if (keyless(a, k, a->v[k][i]) && keyless(b, k, b->v[k][i])) continue;
    if (!isfinite(a->v[k][i]) || !isfinite(b->v[k][i])) return NAN;
    ss += b->v[k][i] * b->v[k][i], m++;
  }
  const double rms = m ? sqrt(ss / (double)m) : 0;
  for (int64_t i = 0; i < n; i++) {
    if (keyless(a, k, a->v[k][i]) && keyless(b, k, b->v[k][i])) continue;
    const double err = fabs(a->v[k][i] - b->v[k][i]), scale = rms + fabs(b->v[k][i]);
    worst = fmax(worst, scale > 0 ? err / scale : err);
  }
  return worst;
}

/* How many of result r's values are NaN or infinite. */
static int64_t non_finite(const result *r) {
  int64_t bad = 0;
  for (int k = 0; k < N_RESULTS; k++) {
    if (!r->v[k]) continue;
    const int64_t n = numel_of(r->dims[k], r->ndim[k]);
    for (int64_t i = 0; i < n; i++) bad += !isfinite(r->v[k][i]) && !keyless(r, k, r->v[k][i]);
  }
  return bad;
}

static int dump(const char *path, const result *r, const mg_plan *p, const cli_opts *o,
                const docs *ds, mg_diag *d) {
  mg_st_writer *w = NULL;
  int rc = mg_st_writer_new(&w, d);
  char num[64];
  for (int k = 0; k < N_RESULTS && !rc; k++) {
    const int64_t n = numel_of(r->dims[k], r->ndim[k]);
    if (p->args.dtype == MG_F64) { /* as computed: no f32 rounding, no overflow to inf */
      rc = mg_st_writer_add_f64(w, result_names[k], r->ndim[k], r->dims[k], r->v[k], d);
      continue;
    }
    float *f = malloc((size_t)n * sizeof *f);
    if (!f) {
      rc = mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
      break;
    }
    for (int64_t i = 0; i < n; i++) f[i] = (float)r->v[k][i];
    rc = mg_st_writer_add_f32(w, result_names[k], r->ndim[k], r->dims[k], f, d);
    free(f);
  }
  if (!rc) rc = mg_st_writer_add_meta(w, "form", mg_form_name(p->args.form), d);
  if (!rc) rc = mg_st_writer_add_meta(w, "model", p->shape.source, d);
  if (!rc) rc = mg_st_writer_add_meta(w, "dtype", mg_dtype_name(p->args.dtype), d);
  if (!rc) rc = mg_st_writer_add_meta(w, "causal", p->args.causal ? "true" : "false", d);
  snprintf(num, sizeof num, "%d", p->args.sp);
  if (!rc) rc = mg_st_writer_add_meta(w, "sp", num, d);
  if (!rc) rc = mg_st_writer_add_meta(w, "inputs", o->inputs ? o->inputs : "seed", d);
  if (!rc && ds->n) { /* packed: how many documents, how many valid tokens */
    snprintf(num, sizeof num, "%lld", (long long)(ds->n - 1));
    rc = mg_st_writer_add_meta(w, "documents", num, d);
    snprintf(num, sizeof num, "%lld", (long long)ds->cu[ds->n - 1]);
    if (!rc) rc = mg_st_writer_add_meta(w, "tokens", num, d);
  }
  snprintf(num, sizeof num, "%llu", o->seed);
  if (!rc && !o->inputs) rc = mg_st_writer_add_meta(w, "seed", num, d);
  if (!rc) rc = mg_st_writer_write(w, path, d);
  mg_st_writer_free(w);
  return rc;
}

/* "123456 = plan" or "123456 != plan 654321". */
static const char *vs(char *buf, size_t n, int64_t got, int64_t want) {
  if (got == want)
    snprintf(buf, n, "%lld = plan", (long long)got);
  else
    snprintf(buf, n, "%lld != plan %lld", (long long)got, (long long)want);
  return buf;
}

static void print_stats(const char *form, const result *r) {
  char a[64], b[64], c[64], e[64], f[64];
  printf("%-9s %-22s %-22s %-22s %-18s %-18s %.3f + %.3f\n", form,
         vs(a, sizeof a, r->st.saved, r->cost.saved), vs(b, sizeof b, r->st.peak_fwd, r->cost.peak_fwd),
         vs(c, sizeof c, r->st.peak_bwd, r->cost.peak_bwd),
         vs(e, sizeof e, r->st.sent_fwd, r->cost.sent_fwd),
         vs(f, sizeof f, r->st.sent_bwd, r->cost.sent_bwd), r->st.seconds_fwd, r->st.seconds_bwd);
}

/* ---- the command ------------------------------------------------------------------------- */

/* Prints the message of the lowest failing rank (once), returns status on every rank. */
#define FAIL_IF(cond, status_)                                    \
  do {                                                            \
    int who_ = agree(g, (cond));                                  \
    if (who_ >= 0) {                                              \
      if (who_ == g->rank) cli_error("%s", mg_diag_msg(&d));      \
      ret = (status_);                                            \
      goto out;                                                   \
    }                                                             \
  } while (0)

static int run(const cli_opts *o, group *g) {
  int ret = CLI_OK, rc;
  mg_diag d = MG_DIAG_INIT;
  mg_shape shape;
  mg_st_file *file = NULL;
  docs ds = {NULL, 0}; /* packed inputs: the documents */
  int varlen = 0;
  /* this rank's inputs: [0] token slice, [1] laga-cp's chunks, [2] all tokens (the P = 1
   * reference, rank 0) */
  void *in[3][N_INPUTS] = {{0}};
  static mg_plan plans[MG_FORM_COUNT], ref_plan;
  result res[MG_FORM_COUNT], ref_res;
  memset(res, 0, sizeof res);
  memset(&ref_res, 0, sizeof ref_res);
  mg_form form;
  mg_form_parse(o->form, &form); /* checked by parse */
  mg_dtype dt = strcmp(o->dtype, "f64") == 0 ? MG_F64 : MG_F32;

  rc = mg_config_load(o->model, &shape, &d);
  FAIL_IF(rc != 0, CLI_FAIL);
  /* --dump is written at the end, by rank 0: a path it cannot write is refused now */
  rc = g->rank == 0 && o->dump ? mg_fs_check_writable(o->dump, &d) : 0;
  FAIL_IF(rc != 0, CLI_FAIL);
  for (int i = 0; g->rank == 0 && i < shape.n_notes; i++)
    fprintf(stderr, "mlagen: note: %s: %s\n", shape.source, shape.notes[i]);

  /* B and S: from the options, or from q's shape in the inputs file (packed, with
   * cu_seqlens: B = 1, S = q's token rows T) */
  int64_t B = o->batch, S = o->seq;
  rc = 0;
  if (o->inputs) {
    /* The reader holds the whole file, and each rank converts its shard: refuse a file
     * that cannot fit twice before reading it. */
    struct stat st;
    const int64_t avail = mem_available();
    if (stat(o->inputs, &st) == 0 && avail > 0 && (int64_t)st.st_size > avail / 2 / g->size)
      rc = mg_diag_set(&d, MLAGEN_ENOMEM, "%s: %.1f GiB, too large to read on %d rank%s with "
                       "%.1f GiB available", o->inputs, (double)st.st_size / (1 << 30), g->size,
                       g->size == 1 ? "" : "s", (double)avail / (1 << 30));
    if (!rc) rc = mg_st_open(o->inputs, &file, &d);
    const mg_st_tensor *q = rc ? NULL : mg_st_find(file, "q");
    if (!rc && !q) rc = mg_diag_set(&d, MLAGEN_EINVAL, "%s: no tensor named 'q'", o->inputs);
    const mg_st_tensor *cu = rc ? NULL : mg_st_find(file, "cu_seqlens");
    varlen = cu != NULL;
    if (!rc && varlen && o->have_batch && o->batch != 1)
      rc = mg_diag_set(&d, MLAGEN_EINVAL, "%s holds cu_seqlens (packed sequences, batch 1): "
                       "--batch %d does not apply", o->inputs, o->batch);
    if (!rc && !varlen && q->ndim == 3)
      rc = mg_diag_set(&d, MLAGEN_EINVAL, "%s: tensor 'q' is 3-D [%lld, %lld, %lld] (THD, packed "
                       "sequences) but the file holds no 'cu_seqlens': a THD (packed) file needs a "
                       "'cu_seqlens' tensor [N + 1] of document boundaries; unpacked inputs take "
                       "q [B, S, H, d_n + d_r]", o->inputs, (long long)q->shape[0],
                       (long long)q->shape[1], (long long)q->shape[2]);
    if (!rc && varlen && q->ndim != 3)
      rc = mg_diag_set(&d, MLAGEN_EINVAL, "%s holds cu_seqlens (packed sequences): tensor 'q' "
                       "must be [T, H, d_n + d_r] (THD layout), not %d-dimensional", o->inputs,
                       q->ndim);
    if (!rc && varlen) {
      B = 1;
      if (!o->seq) S = q->shape[0];
    } else if (!rc && q->ndim >= 2) {
      if (!o->have_batch) B = q->shape[0];
      if (!o->seq) S = q->shape[1];
    }
    if (!rc && !o->seq && S > (int64_t)CLI_MAX_SEQ) /* the limit --seq has */
      rc = mg_diag_set(&d, MLAGEN_EINVAL, "%s: tensor 'q' has sequence length %lld: expected "
                       "at most %llu (the limit of --seq)", o->inputs, (long long)S, CLI_MAX_SEQ);
    if (!rc && (B < 1 || S < 1 || B > INT_MAX))
      rc = mg_diag_set(&d, MLAGEN_EINVAL, "%s: tensor 'q' has an empty or unusable shape",
                       o->inputs);
    /* the file's shape before its documents: a capacity other than its token rows would
     * otherwise read as documents past the capacity */
    if (!rc && varlen && o->seq && o->seq != q->shape[0])
      rc = mg_diag_set(&d, MLAGEN_EINVAL, "%s: tensor 'q' has %lld token rows (THD, packed "
                       "sequences), but --seq %lld: a packed file's token rows are the capacity "
                       "(drop --seq, or give --seq %lld)", o->inputs, (long long)q->shape[0],
                       (long long)o->seq, (long long)q->shape[0]);
    if (!rc && !o->seq && S % o->sp != 0)
      rc = mg_diag_set(&d, MLAGEN_EINVAL, "%s: tensor 'q' has %s%lld%s, not divisible by --sp %d "
                       "(each rank holds %s / P of them)%s", o->inputs,
                       varlen ? "" : "sequence length ", (long long)S,
                       varlen ? " token rows (the packed stream's capacity)" : "", o->sp,
                       varlen ? "T" : "S",
                       varlen ? ": pad the stream with slack rows to a multiple of P" : "");
    if (!rc && varlen) rc = read_docs(file, cu, S, &ds, &d);
  }
  FAIL_IF(rc != 0, CLI_FAIL);

  /* the plans */
  /* --check: --form F (not explicit) against explicit, else every form that runs at P. The
   * Ulysses forms need P | H (mg_plan_args_check); at any other P only laga-cp runs (--form
   * another: its build names why) and the reference is explicit at P = 1 on rank 0
   * (ref_single). */
  const int ulysses = o->sp <= shape.heads && shape.heads % o->sp == 0;
  const int ref_single = o->check && !ulysses;
  const int check_all = o->check && form == MG_FORM_EXPLICIT;
  int forms[MG_FORM_COUNT], n_forms = 0;
  for (int f = 0; f < MG_FORM_COUNT; f++) /* check_all at a P not dividing H: laga-cp alone */
    if ((f == (int)form && (ulysses || !check_all)) ||
        (o->check && (ulysses ? check_all || f == MG_FORM_EXPLICIT : f == MG_FORM_LAGA_CP)))
      forms[n_forms++] = f;
  for (int k = 0; k < n_forms; k++) {
    mg_plan_args a = {.shape = &shape, .form = (mg_form)forms[k], .sp = o->sp,
                      .rank = g->rank < o->sp ? g->rank : 0, .batch = (int)B, .seq = S, .causal = o->causal, .dtype = dt,
                      .head_groups = forms[k] == MG_FORM_LAGA_F    ? o->head_groups
                                     : forms[k] == MG_FORM_LAGA_CP ? o->cp_head_groups
                                                                   : 0,
                      .varlen = varlen, .cu_seqlens = ds.cu, .n_cu = ds.n};
    rc = cli_plan_build(&plans[forms[k]], &a, &d);
    if (rc) break;
  }
  if (!rc && ref_single) {
    mg_plan_args a = {.shape = &shape, .form = MG_FORM_EXPLICIT, .sp = 1, .batch = (int)B,
                      .seq = S, .causal = o->causal, .dtype = dt, .varlen = varlen,
                      .cu_seqlens = ds.cu, .n_cu = ds.n};
    rc = cli_plan_build(&ref_plan, &a, &d);
  }
  FAIL_IF(rc != 0, CLI_USAGE);

  /* the plans were checked first: their refusals do not depend on how many ranks run */
  if (g->size != o->sp) {
    if (g->mpi)
      mg_diag_set(&d, MLAGEN_EINVAL, "run: --sp %d but %d MPI process%s: start P ranks with "
                  "mpirun -np P, P = --sp", o->sp, g->size, g->size == 1 ? "" : "es");
    else
      mg_diag_set(&d, MLAGEN_EINVAL, "run: --sp %d needs MPI ranks, and mlagen was built without "
                  "MPI; run with --sp 1", o->sp);
  }
  FAIL_IF(g->size != o->sp, CLI_USAGE);

  /* Every rank must run the same plans: ranks given different options or inputs of
   * other shapes would meet in collectives of different sizes. */
  uint64_t fp = 1469598103934665603ULL;
  const int64_t facts[] = {B, S, (int64_t)form, (int64_t)dt, o->check, o->causal, (int64_t)o->seed,
                           o->inputs != NULL, shape.heads, shape.kv_lora_rank, shape.qk_rope_head_dim,
                           shape.qk_nope_head_dim, shape.v_head_dim};
  for (size_t i = 0; i < sizeof facts / sizeof facts[0]; i++) fp = fnv(fp, facts[i]);
  fp = fnv(fp, ds.n);
  for (int64_t i = 0; i < ds.n; i++) fp = fnv(fp, ds.cu[i]);
  int same = same_everywhere(g, fp);
  if (!same)
    mg_diag_set(&d, MLAGEN_EINVAL, "run: the ranks disagree on the model, batch, sequence length, "
                "form, dtype or flags (or their --inputs differ in shape): start every rank with "
                "the same arguments");
  FAIL_IF(!same, CLI_USAGE);

  /* Refuse what cannot fit rather than be killed by the kernel: the largest planned peak
   * and the inputs, times the ranks on this machine. */
  int64_t need = 0;
  for (int k = 0; k < n_forms; k++) {
    mg_plan_cost c;
    mg_plan_cost_of(&plans[forms[k]], &c);
    int64_t peak = c.peak_fwd > c.peak_bwd ? c.peak_fwd : c.peak_bwd;
    if (peak > need) need = peak;
  }
  for (int b = 0; b < plans[forms[0]].n_bufs; b++) /* the inputs: once per layout */
    if (plans[forms[0]].bufs[b].role == MG_BUF_INPUT)
      need += mg_plan_buf_bytes(&plans[forms[0]].bufs[b]) * (o->check ? 2 : 1);
  if (ref_single) { /* rank 0 also runs the whole problem, on all the tokens */
    mg_plan_cost c;
    mg_plan_cost_of(&ref_plan, &c);
    need += c.peak_fwd > c.peak_bwd ? c.peak_fwd : c.peak_bwd;
    for (int b = 0; b < ref_plan.n_bufs; b++)
      if (ref_plan.bufs[b].role == MG_BUF_INPUT) need += mg_plan_buf_bytes(&ref_plan.bufs[b]);
  }
  const int64_t avail = mem_available();
  const int too_big = avail > 0 && need > avail / g->size;
  if (too_big)
    mg_diag_set(&d, MLAGEN_ENOMEM, "run: needs about %.1f GiB per rank (planned peak, inputs) "
                "x %d rank%s, but %.1f GiB are available", (double)need / (1 << 30), g->size,
                g->size == 1 ? "" : "s", (double)avail / (1 << 30));
  FAIL_IF(too_big, CLI_FAIL);

  /* the inputs, this rank's shard in each layout the forms run take */
  input_spec specs[N_INPUTS];
  input_specs(&shape, B, S, varlen, specs);
  const int ref_here = ref_single && g->rank == 0;
  for (int k = 0; k < n_forms + ref_here && !rc; k++) {
    const int lay = k == n_forms ? 2 : forms[k] == MG_FORM_LAGA_CP;
    const mg_form lf = lay == 1 ? MG_FORM_LAGA_CP : MG_FORM_EXPLICIT;
    const int P = lay == 2 ? 1 : o->sp, rank = lay == 2 ? 0 : g->rank;
    for (int j = 0; j < N_INPUTS && !rc && !in[lay][j]; j++) {
      const input_spec *is = &specs[j];
      const int64_t local = numel_of(is->dims, is->ndim) / (is->ndim == 2 ? 1 : P);
      if (!(in[lay][j] = malloc((size_t)local * mg_dtype_size(dt))))
        rc = mg_diag_set(&d, MLAGEN_ENOMEM, "out of memory");
      else if (!file)
        draw_shard(is, o->seed, lf, rank, P, dt, in[lay][j]);
      else
        rc = read_shard(file, is, lf, rank, P, dt, in[lay][j], &d);
    }
  }
  FAIL_IF(rc != 0, CLI_FAIL);
  mg_st_close(file);
  file = NULL;

  /* run */
  if (g->rank == 0) {
    printf("mlagen run: cpu backend, %s (H=%d d_c=%d d_r=%d d_n=%d d_v=%d scale %.6g), ",
           shape.source, shape.heads, shape.kv_lora_rank, shape.qk_rope_head_dim,
           shape.qk_nope_head_dim, shape.v_head_dim, shape.softmax_scale);
    if (varlen)
      printf("packed: %lld document%s, %ld of %lld tokens,", (long long)(ds.n - 1),
             ds.n == 2 ? "" : "s", (long)ds.cu[ds.n - 1], (long long)S);
    else
      printf("B=%lld S=%lld", (long long)B, (long long)S);
    printf(" P=%d, %s, %s, inputs %s", o->sp, o->dtype, o->causal ? "causal" : "non-causal",
           o->inputs ? o->inputs : "from seed");
    if (!o->inputs) printf(" %llu", o->seed);
    printf("\nbytes per rank (rank 0), measured by the executor's allocator vs the planner; "
           "time in s\n%-9s %-22s %-22s %-22s %-18s %-18s %s\n", "form", "saved fwd->bwd",
           "peak, forward", "peak, backward", "sent, forward", "sent, backward", "fwd + bwd");
    fflush(stdout);
  }
  for (int k = 0; k < n_forms; k++) {
    const mg_plan *p = &plans[forms[k]];
    rc = run_form(g, p, (const void *const *)in[forms[k] == MG_FORM_LAGA_CP], &ds, &res[forms[k]], &d);
    if (rc) { /* a rank may be stuck in a collective: stop every rank */
      cli_error("rank %d: %s", g->rank, mg_diag_msg(&d));
      abort_group(g);
      ret = CLI_FAIL;
      goto out;
    }
    if (g->rank == 0) {
      print_stats(mg_form_name(p->args.form), &res[forms[k]]);
      fflush(stdout);
    }
    int who = agree(g, !res[forms[k]].matches_plan);
    if (who >= 0) {
      if (who == g->rank)
        cli_error("rank %d: the %s form's measured memory or traffic differs from the plan", who,
                  mg_form_name(p->args.form));
      ret = CLI_FAIL;
      goto out;
    }
  }

  if (ref_here) { /* the reference: explicit at P = 1, on this rank alone */
    group one = {NULL, 0, 1, 0};
    rc = mg_comm_local_new(&one.comm, &d);
    if (!rc) rc = run_form(&one, &ref_plan, (const void *const *)in[2], &ds, &ref_res, &d);
    mg_comm_destroy(one.comm);
    if (!rc) {
      printf("explicit at P = 1 on rank 0 (the reference: the Ulysses forms need P | H = %d):\n",
             shape.heads);
      print_stats("explicit", &ref_res);
    }
    if (!rc && !ref_res.matches_plan)
      rc = mg_diag_set(&d, MLAGEN_EINVAL, "the reference's measured memory differs from its plan");
    if (rc) {
      cli_error("rank 0: %s", mg_diag_msg(&d));
      ret = CLI_FAIL;
      goto out;
    }
  }
  if (g->rank == 0) {
    const int64_t nf = non_finite(&res[form]);
    if (nf > 0)
      fprintf(stderr, "mlagen: warning: %lld output value%s of the %s form %s NaN or infinite "
              "(are the inputs finite?)\n", (long long)nf, nf == 1 ? "" : "s",
              mg_form_name(form), nf == 1 ? "is" : "are");
  }
  if (g->rank == 0 && o->check) {
    const double tol = dt == MG_F64 ? 1e-10 : 1e-4;
    int bad = 0;
    const result *ref = ref_single ? &ref_res : &res[MG_FORM_EXPLICIT];
    printf("\ncheck: max over elements of |a - b| / (rms(b) + |b|) against explicit%s over the "
           "global tensors (limit %g)\n%-9s", ref_single ? " at P = 1" : "", tol, "form");
    for (int k = 0; k < N_RESULTS; k++) printf(" %-10s", result_names[k]);
    printf("\n");
    for (int i = 0; i < n_forms; i++) {
      const int f = forms[i];
      if (f == MG_FORM_EXPLICIT) continue;
      printf("%-9s", mg_form_name((mg_form)f));
      for (int k = 0; k < N_RESULTS; k++) {
        double e = rel_err(&res[f], ref, k);
        bad += !(e <= tol);
        printf(" %-10.2e", e);
      }
      printf("\n");
    }
    if (bad) {
      cli_error("check failed: %d tensor(s) differ from the explicit form by more than %g "
                "or hold NaN or infinite values", bad, tol);
      ret = CLI_FAIL;
    } else {
      printf("check passed: %s %sequals explicit%s within %g\n",
             check_all || ref_single ? "every form" : mg_form_name(form),
             ref_single ? "that runs at this P " : "", ref_single ? " at P = 1" : "", tol);
    }
  }
  if (g->rank == 0 && o->dump && ret == CLI_OK) {
    rc = dump(o->dump, &res[form], &plans[form], o, &ds, &d);
    if (rc) {
      cli_error("%s", mg_diag_msg(&d));
      ret = CLI_FAIL;
    } else {
      printf("wrote %s (%s form, %s)\n", o->dump, mg_form_name(form), mg_dtype_name(dt));
    }
  }

out:
  mg_st_close(file);
  free(ds.cu);
  for (int k = 0; k < N_INPUTS; k++) free(in[0][k]), free(in[1][k]), free(in[2][k]);
  for (int f = 0; f < MG_FORM_COUNT; f++) result_free(&res[f]);
  result_free(&ref_res);
  mg_diag_clear(&d);
  return ret;
}
#undef FAIL_IF

int cli_run(int argc, char **argv) {
  cli_opts o;
  int rc = parse(argc, argv, &o);
  if (rc) return rc == CLI_HELP ? CLI_OK : rc;
  group g = {NULL, 0, 1, 0};
  mg_diag d = MG_DIAG_INIT;
#ifdef MLAGEN_HAVE_MPI
  if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
    cli_error("run: MPI_Init failed");
    return CLI_FAIL;
  }
  g.mpi = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &g.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g.size);
  MPI_Comm world = MPI_COMM_WORLD;
  rc = mg_comm_mpi_wrap(&g.comm, &world, &d);
#else
  rc = mg_comm_local_new(&g.comm, &d);
#endif
  int ret;
  if (rc) {
    cli_error("run: %s", mg_diag_msg(&d));
    ret = CLI_FAIL;
  } else {
    ret = run(&o, &g);
  }
  mg_comm_destroy(g.comm);
  mg_diag_clear(&d);
#ifdef MLAGEN_HAVE_MPI
  MPI_Finalize();
#endif
  return ret;
}
