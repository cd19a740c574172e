/* cli.h: the `mlagen` command line: subcommands and their shared option parsing.
 * Exit codes: 0 ok, 1 failure, 2 usage. */
#ifndef MG_CLI_H
#define MG_CLI_H
#include "mg_config.h"
#include "mg_generate.h"
#include "mg_hash.h"
#include "mg_plan.h"
#include "mg_spec.h"

enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2, CLI_HELP = -1 };

#define CLI_MAX_SET 8
/* The largest sequence length --seq (and `run --inputs`, from q's shape) accepts. */
#define CLI_MAX_SEQ (1ULL << 40)

/* Options shared by the subcommands that generate kernels. */
typedef struct cli_opts {
  const char *model;          /* --model: path or shipped name (default deepseek-v3) */
  const char *templates;      /* --templates DIR */
  const char *dtype;          /* --dtype (checked by each subcommand) */
  int sp;                     /* --sp P */
  const char *set[CLI_MAX_SET]; /* --set tunable=value */
  int n_set;
  const char *out;            /* generate: --out DIR (trailing slashes removed) */
  char outbuf[4096];
  const char *arch;           /* compile: --arch list; generate, tune, plan: --arch ARCH */
  const char *cache_dir;      /* compile: --cache-dir DIR */
  int no_cache;               /* compile: --no-cache */
  const char *backend;        /* run: --backend */
  const char *form;           /* run: --form */
  const char *inputs;         /* run: --inputs FILE */
  const char *dump;           /* run: --dump FILE */
  int check;                  /* run: --check */
  unsigned long long seed;    /* run: --seed N */
  int have_batch;             /* --batch was given */
  int json;                   /* plan: --json */
  int steps;                  /* plan: --steps */
  long long seq;              /* plan: --seq S, 1..CLI_MAX_SEQ */
  const char *seqlens;        /* plan: --seqlens L1,L2,... (checked by cli_plan) */
  int batch;                  /* plan: --batch B */
  int causal;                 /* plan: --causal (default) / --no-causal */
  int causal_given;           /* --causal or --no-causal was given */
  const char *device;         /* plan --explain: --device NAME */
  int explain;                /* plan: --explain */
  int dry_run;                /* tune: --dry-run */
  int varlen;                 /* generate, compile: --varlen (packed-sequence variants too) */
  const char *family[CLI_MAX_SET]; /* tune, generate, compile: --family F (repeatable) */
  int n_family;
  int min_warps;              /* tune: --min-warps N (0: the default threshold) */
  int head_groups;            /* plan, run: --head-groups N (laga-f; 0: the default) */
  int cp_head_groups;         /* plan, run: --cp-head-groups N (laga-cp; 0: the default) */
  const char *link_gbps;      /* plan: --link-gbps X (checked by cli_plan) */
  const char *tflops;         /* plan: --tflops Y */
  const char *hbm_gbps;       /* plan: --hbm-gbps Z */
  const char *mem_gib;        /* plan: --mem-gib M */
} cli_opts;

/* Parses the options of a subcommand (argv[2..argc)) into o. allowed is a space-separated
 * list of the option names it takes ("model templates ..."). Prints the problem and
 * returns CLI_USAGE on an unknown option or a missing value; prints help and returns
 * CLI_HELP for --help. Callers return `rc == CLI_HELP ? CLI_OK : rc`. */
int cli_parse(int argc, char **argv, const char *allowed, const char *help, cli_opts *o);

/* Checks that o->dtype names a kernel element type (bf16 or fp16; bf16 when not given);
 * prints the problem and returns CLI_USAGE otherwise. */
int cli_kernel_dtype(cli_opts *o);

/* Loads the model shape; prints its notes to stderr. Prints the error and returns
 * CLI_FAIL on failure. */
int cli_load_model(const cli_opts *o, mg_shape *shape);

/* The kernel specs of shape at o->sp: mg_spec_for_plan(shape, o->sp, head_groups, dtype).
 * At a --sp that does not divide H (or exceeds it), where laga-cp is the only form, they
 * are laga-cp's kernels (which do not depend on P), after a note on stderr that says so in
 * mg_plan_args_check's words. Returns 0 or mg_spec_for_plan's error (d says why). */
int cli_model_specs(const cli_opts *o, const mg_shape *shape, int head_groups, const char *dtype,
                    mg_kernel_spec *specs, int max, int *n, mg_diag *d);

/* Loads the model, builds its kernel specs (cli_model_specs: all families, causal and not,
 * with the --set overrides) and opens a generator on o->templates. Prints any error;
 * returns 0, CLI_FAIL or CLI_USAGE. On success the caller closes *g. */
int cli_prepare(const cli_opts *o, mg_shape *shape, mg_kernel_spec *specs, int max, int *n,
                mg_gen **g);

/* mg_plan_build of a (plan and run), its argument errors (mg_plan_args_check) naming the
 * command's options: --head-groups, or --cp-head-groups for laga-cp. Returns
 * mg_plan_build's status; d says why. */
int cli_plan_build(mg_plan *p, const mg_plan_args *a, mg_diag *d);

/* The specs of specs[0..*n) (cli_prepare's, max their capacity) for arch: each portable
 * family an architecture's family replaces on arch (mg_spec_to_arch: attn_fwd ->
 * attn_fwd_sm90 on sm_90a) replaced, the --set overrides applied again; then, for each
 * o->family F, F beside each spec of its counterpart (attn_fwd_sm90 beside attn_fwd; with
 * attn_fwd replaced, attn_fwd beside attn_fwd_sm90), F given twice added once; then another
 * architecture's families and duplicates dropped. arch NULL: no replacement (the portable
 * families, the kernels of every arch from sm_80 up) and nothing dropped. strict: an F with
 * nothing to add beside is a usage error (printed), else skipped. Returns 0 or CLI_USAGE (a
 * rejected override, more than max kernels, a strict F) after printing why. */
int cli_arch_specs(const cli_opts *o, const char *arch, int strict, mg_kernel_spec *specs, int max,
                   int *n);

/* cli_prepare, then cli_arch_specs(o, arch, strict) (generate and compile). Returns
 * cli_prepare's status or cli_arch_specs'; on failure *g is closed and NULL. */
int cli_prepare_rendered(const cli_opts *o, const char *arch, mg_shape *shape,
                         mg_kernel_spec *specs, int max, int *n, mg_gen **g);

/* The kernels rendered so far by one generate, or for one arch of compile, and the
 * fallback notes printed (zero it first). */
typedef struct cli_seen {
  int n;
  char name[MG_SPEC_MAX_KERNELS][160];
  uint8_t digest[MG_SPEC_MAX_KERNELS][MG_HASH_BYTES]; /* SHA-256 of the source (mg_hash) */
  int n_notes;
  uint8_t note[MG_SPEC_MAX_KERNELS][MG_HASH_BYTES]; /* of each family + reason noted */
} cli_seen;

/* mg_gen_kernel of *s, except that an architecture's family whose template refuses the shape
 * (MLAGEN_EINVAL) falls back, with a note on stderr, to the portable family it stands in for
 * (its plan tunables and the --set overrides applied): *s is then that spec, as the CUDA
 * executor falls back. The note is printed once per family and reason (the refusal's text
 * after its configuration), recorded in seen, not again for every causal, head-group or
 * key-layout variant. Returns mg_gen_kernel's status (d says why). */
int cli_render(const cli_opts *o, mg_gen *g, mg_kernel_spec *s, mg_kernel *k, cli_seen *seen,
               mg_diag *d);

/* 1 when a kernel of k's name and source was rendered before (a fallback that is a kernel
 * already listed: attn_fwd_sm90 refusing the shape next to the attn_fwd it stands in for),
 * which generate and compile skip; else 0, k recorded in seen (zero it first). A kernel
 * of a listed name but another source is new here (generate's write then refuses the
 * name twice). */
int cli_kernel_seen(cli_seen *seen, const mg_kernel *k);

/* Prints "mlagen: <msg>" to stderr (the message may hold several lines). */
void cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

int cli_generate(int argc, char **argv);
int cli_compile(int argc, char **argv);
int cli_info(int argc, char **argv);
int cli_plan(int argc, char **argv);
int cli_run(int argc, char **argv);
int cli_tune(int argc, char **argv);
#endif
