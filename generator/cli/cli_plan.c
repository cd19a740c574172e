/* cli_plan.c: `mlagen plan`: what each form sends, keeps and computes, side by side. */
#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "mg_generate.h"
#include "mg_plan.h"
#include "mg_tune.h"
#include "mlagen.h"

static const char help[] =
    "usage: mlagen plan --seq S [--model M] [--sp P] [--batch B] [--dtype T] [--seqlens L,..]\n"
    "                   [--causal | --no-causal] [--head-groups N] [--cp-head-groups N]\n"
    "                   [--json] [--steps]\n"
    "                   [--link-gbps X] [--tflops Y] [--hbm-gbps Z] [--mem-gib M]\n"
    "                   [--explain [--arch ARCH] [--device NAME] [--templates DIR]]\n"
    "\n"
    "Builds the plan of every form (explicit, absorbed, laga, laga-r, laga-f, laga-cp) for one\n"
    "rank of a sequence-parallel group of P ranks and prints, per rank and layer: bytes sent by the\n"
    "collectives (forward, backward), bytes kept from forward to backward, the transient\n"
    "peak of the forward and of the backward, and FLOPs (attention by FlashMLA's\n"
    "convention, projection GEMMs with any recompute), each with its ratio to explicit.\n"
    "The executors allocate and send exactly these figures (docs/forms.md).\n"
    "It then predicts each form's forward and backward time on a device and link, and\n"
    "names the fastest form whose peak fits a memory budget: every GEMM or kernel takes\n"
    "max(FLOPs / tflops, bytes it reads and writes / hbm), every collective bytes sent /\n"
    "link, one after another (no overlap, no latency): an ideal-device lower bound.\n"
    "\n"
    "  --seq S      global sequence length (required without --seqlens); each rank holds\n"
    "               S / P tokens\n"
    "  --seqlens L1,L2,...  packed sequences: documents of these lengths (0 allowed)\n"
    "               concatenated into one stream, batch 1, in a capacity of --seq tokens\n"
    "               (default: their sum); attention FLOPs count only the (query, key) pairs\n"
    "               inside each document, causal by the position in it\n"
    "  --sp P       sequence-parallel degree (default 1); P must divide S, and H for every\n"
    "               form but laga-cp (they split heads evenly; docs/forms.md, \"P and H\"):\n"
    "               where it does not, those forms print n/a\n"
    "  --batch B    batch size (default 1)\n"
    "  --dtype T    activation dtype: bf16 (default), fp16, f32 or f64 (what\n"
    "               `mlagen run` executes on the CPU)\n"
    "  --no-causal  full attention (causal is the default)\n"
    "  --head-groups N  laga-f rebuilds K/V for H / P / N heads at a time (N divides\n"
    "               H / P, at most 16; default the largest divisor of H / P up to 8)\n"
    "  --cp-head-groups N  laga-cp rebuilds K/V for H / N heads at a time (N divides H,\n"
    "               at most 16; default the largest divisor of H up to 8)\n"
    "  --link-gbps X  GB/s one rank sends to its peers, one direction (default 450: H200\n"
    "               NVLink, 900 GB/s both ways; InfiniBand NDR 400 Gb/s is 50)\n"
    "  --tflops Y   dense matmul TFLOP/s of the dtype (default 989: H200 BF16, dense)\n"
    "  --hbm-gbps Z memory bandwidth in GB/s (default 4800: H200 HBM3e, 4.8 TB/s)\n"
    "  --mem-gib M  budget in GiB for a form's per-layer peak (default 131: H200's\n"
    "               141 GB; give what is left after weights, optimizer state and the\n"
    "               other layers' saved activations); the table is followed by the fastest\n"
    "               form that fits, or says none does (--json: fastest_fitting, null\n"
    "               then); either way a report, exit status 0\n"
    "               (GB = 1e9 bytes, GiB = 2^30 bytes; each from 0.001 to 1e9)\n"
    "  --json       machine-readable output\n"
    "  --steps      also list each form's steps\n"
    "  --explain    also print, per kernel family and causal flag, the configuration the\n"
    "               kernels would use at this S and why: a tuned entry of\n"
    "               $MLAGEN_TUNED_DIR (default ./tuned)/<arch>/<device>.json tuned\n"
    "               with the family's templates as they are, or the template's\n"
    "               default (docs/tuning.md)\n"
    "  --arch ARCH  with --explain: the GPU architecture (default sm_90a), whose\n"
    "               families are shown (sm_90a: attn_fwd_sm90 for attn_fwd)\n"
    "  --device N   with --explain: the device name as the driver reports it\n"
    "               (default \"unknown\": no GPU is queried)\n";

/* --explain's architecture and templates, checked before the report is printed (a bad
 * --arch, MLAGEN_MMA_SYNC or --templates is refused before any output); its kernels,
 * listed by explain once the plans have checked the options. */
typedef struct explainer {
  const char *arch, *device, *kdtype;
  int mma_sync; /* MLAGEN_MMA_SYNC=1 (mg_spec_mma_sync_forced) */
  mg_kernel_spec specs[MG_SPEC_MAX_KERNELS];
  int n;
  mg_gen *g;
} explainer;

/* Checks --arch and MLAGEN_MMA_SYNC and opens the templates. CLI_OK, or CLI_USAGE /
 * CLI_FAIL with the error printed (nothing to close then). */
static int explain_open(const cli_opts *o, explainer *e) {
  e->arch = o->arch ? o->arch : "sm_90a", e->device = o->device ? o->device : "unknown";
  e->kdtype = mg_dtype_spec_name(mg_dtype_of_spec(o->dtype));
  e->n = 0;
  e->g = NULL;
  mg_diag d = MG_DIAG_INIT;
  mg_tune_limits lim;
  if (mg_tune_arch_limits(e->arch, &lim, &d)) { /* one known architecture, as tune takes */
    cli_error("--arch: %s", mg_diag_msg(&d));
    mg_diag_clear(&d);
    return CLI_USAGE;
  }
  int mma_sync = 0; /* MLAGEN_MMA_SYNC=1: the executor runs the portable families */
  if (mg_spec_mma_sync_forced(&mma_sync, &d)) {
    cli_error("%s", mg_diag_msg(&d));
    mg_diag_clear(&d);
    return CLI_USAGE;
  }
  e->mma_sync = mma_sync;
  int rc = mg_gen_open(&e->g, o->templates, &d);
  if (rc) {
    cli_error("%s", mg_diag_msg(&d));
    mg_diag_clear(&d);
    return CLI_FAIL;
  }
  return CLI_OK;
}

/* --explain: which configuration each kernel would use, and why. */
static int explain(const cli_opts *o, const mg_shape *shape, explainer *e) {
  const char *arch = e->arch, *device = e->device, *kdtype = e->kdtype;
  mg_gen *g = e->g;
  mg_diag d = MG_DIAG_INIT;
  if (cli_model_specs(o, shape, o->head_groups, kdtype, e->specs, MG_SPEC_MAX_KERNELS, &e->n,
                      &d)) {
    cli_error("%s", mg_diag_msg(&d));
    mg_diag_clear(&d);
    return CLI_FAIL;
  }
  for (int i = 0; i < e->n; i++) { /* the families arch's executor runs (mg_arch_kernel_table) */
    if (e->mma_sync) snprintf(e->specs[i].arch, sizeof e->specs[i].arch, "%s", arch);
    else mg_spec_to_arch(&e->specs[i], arch, &e->specs[i]);
  }
  const mg_kernel_spec *specs = e->specs;
  const int n = e->n;
  printf("\nkernel configurations for %s/%s, S=%lld (bucket %lld), %s%s\n", arch, device, o->seq,
         mg_tune_bucket(o->seq), kdtype,
         strcmp(kdtype, o->dtype) != 0 ? " (the GPU kernels are bf16/fp16; shown for bf16)" : "");
  if (e->mma_sync)
    printf("MLAGEN_MMA_SYNC=%s: the portable (mma.sync) families, as the CUDA executor runs "
           "them under it\n", getenv("MLAGEN_MMA_SYNC"));
  printf("tuned stores read from %s (%s)\n", mg_tune_store_dir(),
         getenv("MLAGEN_TUNED_DIR") && *getenv("MLAGEN_TUNED_DIR")
             ? "$MLAGEN_TUNED_DIR"
             : "./tuned under the working directory: set MLAGEN_TUNED_DIR to use another, "
               "e.g. the repository's tuned/");
  int status = CLI_OK;
  for (int i = 0; i < n; i++) {
    /* what the CUDA executor would run: the same choice (mg_tune_choose) */
    mg_kernel_spec chosen;
    char why[512];
    mg_tune_config cfg;
    if (mg_tune_choose(g, NULL, arch, device, &specs[i], NULL, o->seq, &chosen, why, sizeof why,
                       NULL, &d)) {
      cli_error("out of memory");
      status = CLI_FAIL;
      break;
    }
    int krc = mg_tune_resolved_config(g, &chosen, &cfg, &d);
    if (krc == MLAGEN_EINVAL) {
      /* the template refuses this shape: say so in place of a configuration */
      printf("  %-18s %-10s (no kernel: %s)\n", specs[i].family,
             specs[i].causal ? "causal" : "non-causal", mg_diag_msg(&d));
      mg_diag_clear(&d);
      continue;
    }
    if (krc) { /* a template error or a resource failure: not an answer, a failure */
      cli_error("%s (%s): %s", specs[i].family, specs[i].causal ? "causal" : "non-causal",
                mg_diag_msg(&d));
      mg_diag_clear(&d);
      status = CLI_FAIL;
      continue;
    }
    char text[256];
    printf("  %-18s %-10s H=%-3d %s\n      %s\n", specs[i].family,
           specs[i].causal ? "causal" : "non-causal", specs[i].heads,
           mg_tune_config_str(&cfg, text, sizeof text), why);
  }
  mg_diag_clear(&d);
  return status;
}

typedef struct row {
  const char *name;
  const char *unit;
  double scale;
} row;

static double field(const mg_plan_cost *c, int i) {
  switch (i) {
    case 0: return (double)c->sent_fwd;
    case 1: return (double)c->sent_bwd;
    case 2: return (double)c->saved;
    case 3: return (double)c->peak_fwd;
    case 4: return (double)c->peak_bwd;
    case 5: return c->attn_flops_fwd;
    case 6: return c->attn_flops_bwd;
    case 7: return c->gemm_flops_fwd;
    default: return c->gemm_flops_bwd;
  }
}

/* Each figure of *c raised to that of *x when larger. */
static void max_cost(mg_plan_cost *c, const mg_plan_cost *x) {
  int64_t *w[] = {&c->sent_fwd, &c->sent_bwd, &c->saved, &c->peak_fwd, &c->peak_bwd};
  const int64_t v[] = {x->sent_fwd, x->sent_bwd, x->saved, x->peak_fwd, x->peak_bwd};
  double *wd[] = {&c->attn_flops_fwd, &c->attn_flops_bwd, &c->gemm_flops_fwd, &c->gemm_flops_bwd};
  const double vd[] = {x->attn_flops_fwd, x->attn_flops_bwd, x->gemm_flops_fwd, x->gemm_flops_bwd};
  for (int i = 0; i < 5; i++)
    if (v[i] > *w[i]) *w[i] = v[i];
  for (int i = 0; i < 4; i++)
    if (vd[i] > *wd[i]) *wd[i] = vd[i];
}

/* Each figure of *t raised to that of *x when larger. */
static void max_time(mg_plan_time *t, const mg_plan_time *x) {
  double *w[] = {&t->fwd_s, &t->bwd_s, &t->compute_fwd_s, &t->compute_bwd_s, &t->comm_fwd_s,
                 &t->comm_bwd_s, &t->flops_fwd, &t->flops_bwd, &t->hbm_fwd, &t->hbm_bwd};
  const double v[] = {x->fwd_s, x->bwd_s, x->compute_fwd_s, x->compute_bwd_s, x->comm_fwd_s,
                      x->comm_bwd_s, x->flops_fwd, x->flops_bwd, x->hbm_fwd, x->hbm_bwd};
  for (int i = 0; i < 10; i++)
    if (v[i] > *w[i]) *w[i] = v[i];
}

static const row rows[] = {
    {"sent, forward", "MiB", 1.0 / (1 << 20)},     {"sent, backward", "MiB", 1.0 / (1 << 20)},
    {"saved fwd->bwd", "MiB", 1.0 / (1 << 20)},    {"peak, forward", "MiB", 1.0 / (1 << 20)},
    {"peak, backward", "MiB", 1.0 / (1 << 20)},    {"attention fwd", "GFLOP", 1e-9},
    {"attention bwd", "GFLOP", 1e-9},              {"GEMMs fwd", "GFLOP", 1e-9},
    {"GEMMs bwd", "GFLOP", 1e-9},
};
static const char *const json_keys[] = {"sent_fwd_bytes", "sent_bwd_bytes", "saved_bytes",
                                        "peak_fwd_bytes", "peak_bwd_bytes", "attn_flops_fwd",
                                        "attn_flops_bwd", "gemm_flops_fwd", "gemm_flops_bwd"};
#define N_ROWS (int)(sizeof rows / sizeof rows[0])

static void print_steps(const mg_plan *p) {
  printf("\n%s: %d steps (forward %d)\n", mg_form_name(p->args.form), p->n_steps, p->n_fwd);
  for (int i = 0; i < p->n_steps; i++) {
    const mg_step *s = &p->steps[i];
    printf("  %2d %s %-50s", i, s->pass == MG_FWD ? "fwd" : "bwd", s->label);
    if (s->sent) printf(" sent %.1f MiB", (double)s->sent / (1 << 20));
    if (s->workspace) printf(" ws %.1f MiB", (double)s->workspace / (1 << 20));
    if (s->flops) printf(" %.1f GFLOP", s->flops * 1e-9);
    if (s->kind == MG_STEP_GEMM && s->gemm.tok_k) /* varlen: only the valid rows are summed */
      printf(" (k: tokens %lld..%lld)", (long long)s->gemm.tok0,
             (long long)(s->gemm.tok0 + s->gemm.k - 1));
    printf("\n");
  }
}

/* A rate option: a decimal number in [1e-3, 1e9] (a smaller rate predicts no time that
 * means anything: 1e-300 TFLOP/s gives 300-digit milliseconds, 1e-308 infinity); def when
 * not given. */
static int parse_rate(const char *opt, const char *v, double def, const char *unit, double *out) {
  if (!v) {
    *out = def;
    return 0;
  }
  char *end = NULL;
  errno = 0;
  const double x = strtod(v, &end);
  if (errno || end == v || *end || v[strspn(v, "0123456789.eE+-")] || !isfinite(x) ||
      !(x >= 1e-3) || x > 1e9) {
    cli_error("--%s %s: expected a decimal number from 0.001 to 1e9 (%s)", opt, v, unit);
    return CLI_USAGE;
  }
  *out = x;
  return 0;
}

/* The fastest built form (forward + backward) whose larger peak fits mem bytes, or -1. */
static int fastest_fitting(const int *ok, const mg_plan_cost *cost, const mg_plan_time *t,
                           double mem) {
  int best = -1;
  for (int f = 0; f < MG_FORM_COUNT; f++) {
    const double peak = (double)(cost[f].peak_fwd > cost[f].peak_bwd ? cost[f].peak_fwd
                                                                    : cost[f].peak_bwd);
    if (ok[f] && peak <= mem &&
        (best < 0 || t[f].fwd_s + t[f].bwd_s < t[best].fwd_s + t[best].bwd_s))
      best = f;
  }
  return best;
}

/* One table cell: the value, with its ratio to explicit when explicit was built and is
 * nonzero; "n/a" for a form not built at this P. */
static void cell(int ok, int f, double v, double base, int base_ok, int prec) {
  if (!ok)
    printf(" %18s", "n/a");
  else if (f == 0 || !base_ok || base == 0)
    printf(" %18.*f", prec, v);
  else
    printf(" %10.*f (%4.2fx)", prec, v, v / base);
}

/* --seqlens L1,L2,...: the boundaries cu[0 .. N] (int32, malloc'd into *cu) of documents of
 * those lengths (each >= 0, their sum T at most INT32_MAX); *seq becomes T when it is 0
 * (no --seq: then T must be a multiple of sp, each rank's share of the capacity), else must
 * hold T. Prints the error and returns CLI_USAGE on bad input. */
static int parse_seqlens(const char *v, int sp, long long *seq, int32_t **cu, int64_t *n_cu) {
  int64_t n = 1;
  for (const char *c = v; *c; c++) n += *c == ',';
  int32_t *b = malloc((size_t)(n + 1) * sizeof *b);
  if (!b) {
    cli_error("out of memory");
    return CLI_FAIL;
  }
  b[0] = 0;
  const char *c = v;
  for (int64_t i = 0; i < n; i++) {
    const size_t len = strcspn(c, ",");
    char *end = NULL;
    errno = 0;
    const long long x = strtoll(c, &end, 10);
    if (len == 0 || strspn(c, "0123456789") != len || errno || end != c + len ||
        x > INT32_MAX - (long long)b[i]) {
      cli_error("--seqlens %s: document %lld (\"%.*s\") is not a length: expected comma-separated "
                "integers >= 0 summing to at most %d", v, (long long)i, (int)len, c, INT32_MAX);
      free(b);
      return CLI_USAGE;
    }
    b[i + 1] = b[i] + (int32_t)x;
    c += len + (c[len] == ',');
  }
  const long long T = b[n];
  if (*seq == 0 && T == 0) {
    cli_error("--seqlens %s: the documents hold no token; give --seq for the capacity", v);
    free(b);
    return CLI_USAGE;
  }
  if (*seq == 0 && sp > 1 && T % sp != 0) {
    cli_error("--seqlens %s: the capacity is the documents' sum %lld without --seq, not divisible "
              "by --sp %d (each rank holds capacity / P token rows): give the capacity as --seq C, "
              "a multiple of %d of at least %lld (e.g. --seq %lld)", v, T, sp, sp, T,
              (T + sp - 1) / sp * sp);
    free(b);
    return CLI_USAGE;
  }
  if (*seq == 0) *seq = T;
  if (T > *seq) {
    cli_error("--seqlens: the documents hold %lld tokens, more than --seq %lld (the capacity)",
              T, *seq);
    free(b);
    return CLI_USAGE;
  }
  *cu = b;
  *n_cu = n + 1;
  return 0;
}

/* The rest of `mlagen plan`: every form's plan for these options (cu: the documents of
 * --seqlens, n_cu boundaries; NULL without), printed; then, with --explain, ex's kernels
 * (explain_open's; NULL without). */
static int plan_forms(cli_opts o, mg_shape shape, const mg_device_model dev, double mem,
                      double mem_gib, mg_dtype dtype, const int32_t *cu, int64_t n_cu,
                      explainer *ex) {
  static mg_plan plans[MG_FORM_COUNT];
  mg_plan_cost cost[MG_FORM_COUNT];
  mg_plan_time tm[MG_FORM_COUNT];
  int ok[MG_FORM_COUNT];
  char why_na[1024] = ""; /* the Ulysses forms' refusal when P does not divide H */
  mg_diag d = MG_DIAG_INIT;
  memset(cost, 0, sizeof cost);
  memset(tm, 0, sizeof tm);
  /* laga-cp first: it takes any P dividing S, so its refusal is the arguments' own */
  for (int k = 0; k < MG_FORM_COUNT; k++) {
    const int f = (k + MG_FORM_LAGA_CP) % MG_FORM_COUNT; /* laga-cp, then the others */
    mg_plan_args a = {.shape = &shape, .form = (mg_form)f, .sp = o.sp, .rank = 0,
                      .batch = o.batch, .seq = o.seq, .causal = o.causal, .dtype = dtype,
                      .head_groups = f == MG_FORM_LAGA_F    ? o.head_groups
                                     : f == MG_FORM_LAGA_CP ? o.cp_head_groups
                                                            : 0,
                      .varlen = cu != NULL, .cu_seqlens = cu, .n_cu = n_cu};
    const int headless = f != MG_FORM_LAGA_CP && (shape.heads % o.sp != 0);
    ok[f] = cli_plan_build(&plans[f], &a, &d) == 0;
    if (!ok[f] && !headless) {
      cli_error("%s", mg_diag_msg(&d)); /* not the head split: refused for every form */
      mg_diag_clear(&d);
      return CLI_USAGE;
    }
    if (!ok[f]) {
      if (!why_na[0]) snprintf(why_na, sizeof why_na, "%s", mg_diag_msg(&d));
      continue;
    }
    mg_plan_cost_of(&plans[f], &cost[f]);
    mg_plan_time_of(&plans[f], &dev, &tm[f]);
    /* laga-cp's ranks differ (causal: rank r's chunks r and 2P - 1 - r see different key
     * counts, unevenly when S / P is odd): each figure is its maximum over the ranks, the
     * slowest rank's time (the other forms' ranks are alike) */
    for (int r = 1; f == MG_FORM_LAGA_CP && r < o.sp; r++) {
      static mg_plan pr;
      mg_plan_cost c;
      mg_plan_time t;
      a.rank = r;
      if (mg_plan_build(&pr, &a, &d)) {
        cli_error("%s", mg_diag_msg(&d));
        mg_diag_clear(&d);
        return CLI_FAIL;
      }
      mg_plan_cost_of(&pr, &c);
      mg_plan_time_of(&pr, &dev, &t);
      max_cost(&cost[f], &c);
      max_time(&tm[f], &t);
    }
  }
  mg_diag_clear(&d);
  const int best = fastest_fitting(ok, cost, tm, mem);

  if (o.json && o.explain) {
    cli_error("plan: --explain prints text; it does not combine with --json");
    return CLI_USAGE;
  }
  if (o.json) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "model", shape.source);
    cJSON_AddNumberToObject(root, "seq", (double)o.seq);
    cJSON_AddNumberToObject(root, "sp", o.sp);
    cJSON_AddNumberToObject(root, "batch", o.batch);
    cJSON_AddStringToObject(root, "dtype", o.dtype);
    cJSON_AddBoolToObject(root, "causal", o.causal);
    if (cu) { /* --seqlens: the packed stream the figures assume */
      cJSON *vj = cJSON_AddObjectToObject(root, "packed");
      cJSON_AddNumberToObject(vj, "documents", (double)(n_cu - 1));
      cJSON_AddNumberToObject(vj, "tokens", (double)cu[n_cu - 1]);
      cJSON_AddNumberToObject(vj, "capacity", (double)o.seq);
    }
    cJSON *dj = cJSON_AddObjectToObject(root, "device");
    cJSON_AddNumberToObject(dj, "tflops", dev.tflops);
    cJSON_AddNumberToObject(dj, "hbm_gbps", dev.hbm_gbps);
    cJSON_AddNumberToObject(dj, "link_gbps", dev.link_gbps);
    cJSON_AddNumberToObject(dj, "mem_gib", mem_gib);
    if (best >= 0) cJSON_AddStringToObject(root, "fastest_fitting", mg_form_name((mg_form)best));
    else cJSON_AddNullToObject(root, "fastest_fitting");
    cJSON *forms = cJSON_AddObjectToObject(root, "forms");
    for (int f = 0; f < MG_FORM_COUNT; f++) {
      if (!ok[f]) { /* P does not divide H: a Ulysses form is not built */
        cJSON_AddNullToObject(forms, mg_form_name((mg_form)f));
        continue;
      }
      cJSON *x = cJSON_AddObjectToObject(forms, mg_form_name((mg_form)f));
      for (int i = 0; i < N_ROWS; i++) cJSON_AddNumberToObject(x, json_keys[i], field(&cost[f], i));
      if (f == MG_FORM_LAGA_F || f == MG_FORM_LAGA_CP)
        cJSON_AddNumberToObject(x, "head_groups", plans[f].args.head_groups);
      cJSON_AddNumberToObject(x, "hbm_bytes_fwd", tm[f].hbm_fwd);
      cJSON_AddNumberToObject(x, "hbm_bytes_bwd", tm[f].hbm_bwd);
      cJSON_AddNumberToObject(x, "compute_fwd_s", tm[f].compute_fwd_s);
      cJSON_AddNumberToObject(x, "compute_bwd_s", tm[f].compute_bwd_s);
      cJSON_AddNumberToObject(x, "comm_fwd_s", tm[f].comm_fwd_s);
      cJSON_AddNumberToObject(x, "comm_bwd_s", tm[f].comm_bwd_s);
      cJSON_AddNumberToObject(x, "time_fwd_s", tm[f].fwd_s);
      cJSON_AddNumberToObject(x, "time_bwd_s", tm[f].bwd_s);
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return CLI_FAIL;
    puts(text);
    free(text);
    return CLI_OK;
  }

  printf("%s: H=%d d_c=%d d_r=%d d_n=%d d_v=%d; S=%lld P=%d B=%d %s %s\n", shape.source,
         shape.heads, shape.kv_lora_rank, shape.qk_rope_head_dim, shape.qk_nope_head_dim,
         shape.v_head_dim, o.seq, o.sp, o.batch, o.dtype, o.causal ? "causal" : "non-causal");
  if (cu)
    printf("packed: %lld document%s, %lld tokens in a capacity of S=%lld; attention FLOPs per "
           "document pair\n", (long long)(n_cu - 1), n_cu == 2 ? "" : "s", (long long)cu[n_cu - 1],
           o.seq);
  /* the ratios only where explicit's column has figures (P | H) */
  printf("per rank, per layer%s", ok[MG_FORM_EXPLICIT] ? " (ratio to explicit)" : "");
  static const mg_form grouped[] = {MG_FORM_LAGA_F, MG_FORM_LAGA_CP}; /* the head-group forms */
  for (int k = 0; k < 2; k++) {
    const mg_form f = grouped[k];
    if (!ok[f]) continue;
    const int groups = plans[f].args.head_groups, w = plans[f].heads_local / groups;
    printf("; %s in %d head groups of %d head%s", mg_form_name(f), groups, w,
           w == 1 ? "" : "s");
  }
  printf("\n");
  if (o.sp > 1)
    printf("laga-cp: each figure is its maximum over the %d ranks (the slowest rank's; they "
           "differ %s)\n", o.sp, cu ? "with the documents each rank's rows hold, whatever the "
           "parity of S / P" : "when S / P is odd");
  if (why_na[0]) printf("n/a: %s\n", why_na);
  printf("%-22s", "");
  for (int f = 0; f < MG_FORM_COUNT; f++) printf(" %18s", mg_form_name((mg_form)f));
  printf("\n");
  for (int i = 0; i < N_ROWS; i++) {
    char name[40];
    snprintf(name, sizeof name, "%s (%s)", rows[i].name, rows[i].unit);
    printf("%-22s", name);
    const double base = field(&cost[0], i);
    for (int f = 0; f < MG_FORM_COUNT; f++)
      cell(ok[f], f, field(&cost[f], i) * rows[i].scale, base * rows[i].scale, ok[0], 1);
    printf("\n");
  }
  /* predicted time, in the table's layout */
  const struct { const char *name; double scale; } trow[] = {
      {"HBM moved fwd (MiB)", 1.0 / (1 << 20)}, {"HBM moved bwd (MiB)", 1.0 / (1 << 20)},
      {"time fwd (ms)", 1e3}, {"  of it comm (ms)", 1e3},
      {"time bwd (ms)", 1e3}, {"  of it comm (ms)", 1e3}, {"time fwd+bwd (ms)", 1e3}};
  for (int i = 0; i < (int)(sizeof trow / sizeof trow[0]); i++) {
    printf("%-22s", trow[i].name);
    double base = 0;
    for (int f = 0; f < MG_FORM_COUNT; f++) {
      const mg_plan_time *t = &tm[f];
      const double v[] = {t->hbm_fwd, t->hbm_bwd, t->fwd_s, t->comm_fwd_s, t->bwd_s, t->comm_bwd_s,
                          t->fwd_s + t->bwd_s};
      if (f == 0) base = v[i];
      cell(ok[f], f, v[i] * trow[i].scale, base * trow[i].scale, ok[0], i < 2 ? 1 : 3);
    }
    printf("\n");
  }
  printf("time: per step max(FLOPs / %g TFLOP/s, bytes / %g GB/s), collectives sent / %g GB/s,\n"
         "      no overlap (docs/forms.md, \"Predicted time\")\n", dev.tflops, dev.hbm_gbps,
         dev.link_gbps);
  if (best >= 0)
    printf("fastest form within %g GiB: %s (%.3f ms forward + backward)\n", mem_gib,
           mg_form_name((mg_form)best), (tm[best].fwd_s + tm[best].bwd_s) * 1e3);
  else
    printf("no form's peak fits %g GiB\n", mem_gib);
  if (o.steps)
    for (int f = 0; f < MG_FORM_COUNT; f++)
      if (ok[f]) print_steps(&plans[f]);
  if (ex) return explain(&o, &shape, ex);
  return CLI_OK;
}

int cli_plan(int argc, char **argv) {
  cli_opts o;
  int rc = cli_parse(argc, argv, "model sp batch seq seqlens dtype causal no-causal head-groups cp-head-groups json steps explain arch device templates link-gbps tflops hbm-gbps mem-gib", help, &o);
  if (rc) return rc == CLI_HELP ? CLI_OK : rc;
  mg_device_model dev;
  double mem_gib;
  if (parse_rate("link-gbps", o.link_gbps, MG_H200_LINK_GBPS, "GB/s", &dev.link_gbps) ||
      parse_rate("tflops", o.tflops, MG_H200_TFLOPS, "TFLOP/s", &dev.tflops) ||
      parse_rate("hbm-gbps", o.hbm_gbps, MG_H200_HBM_GBPS, "GB/s", &dev.hbm_gbps) ||
      parse_rate("mem-gib", o.mem_gib, MG_H200_MEM_GIB, "GiB", &mem_gib))
    return CLI_USAGE;
  const double mem = mem_gib * (double)(1 << 30);
  if (!o.dtype) o.dtype = "bf16";
  mg_dtype dtype = MG_BF16;
  if (mg_dtype_parse(o.dtype, &dtype)) {
    cli_error("--dtype %s: expected bf16, fp16, f32 or f64", o.dtype);
    return CLI_USAGE;
  }
  int32_t *cu = NULL; /* --seqlens: the documents' boundaries */
  int64_t n_cu = 0;
  if (o.seqlens && (rc = parse_seqlens(o.seqlens, o.sp, &o.seq, &cu, &n_cu))) return rc;
  if (o.seq == 0) {
    cli_error("plan: --seq S is required (see --help)");
    return CLI_USAGE;
  }
  mg_shape shape;
  if ((rc = cli_load_model(&o, &shape))) {
    free(cu);
    return rc;
  }
  static explainer ex; /* ~80 KiB of specs */
  if (o.explain && (rc = explain_open(&o, &ex))) {
    free(cu);
    return rc;
  }
  rc = plan_forms(o, shape, dev, mem, mem_gib, dtype, cu, n_cu, o.explain ? &ex : NULL);
  if (o.explain) mg_gen_close(ex.g);
  free(cu);
  return rc;
}
