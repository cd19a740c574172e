/* cli_common.c: option parsing and model loading shared by the subcommands. */
#include <errno.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "mg_dtype.h"
#include "mg_plan.h"
#include "mlagen.h"

void cli_error(const char *fmt, ...) {
  char buf[8192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  /* Paths and arguments come from the user: escape control characters (a terminal
   * escape sequence in a file name) but keep the line structure of compiler logs. */
  fputs("mlagen: ", stderr);
  for (const unsigned char *p = (const unsigned char *)buf; *p; p++) {
    if ((*p < 0x20 && *p != '\n' && *p != '\t') || *p == 0x7f)
      fprintf(stderr, "\\x%02x", *p);
    else
      fputc(*p, stderr);
  }
  fputc('\n', stderr);
}

/* 1 if the first n bytes of name are one of the space-separated words of allowed. */
static int allowed_has(const char *allowed, const char *name, size_t n) {
  for (const char *p = allowed; *p;) {
    size_t w = strcspn(p, " ");
    if (w == n && strncmp(p, name, n) == 0) return 1;
    p += w;
    p += strspn(p, " ");
  }
  return 0;
}

static int parse_int(const char *opt, const char *v, int min, int *out) {
  char *end = NULL;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || end == v || *end != '\0' || x < min || x > 1 << 20) {
    cli_error("--%s %s: expected an integer from %d to %d", opt, v, min, 1 << 20);
    return CLI_USAGE;
  }
  *out = (int)x;
  return 0;
}

/* Options that take no value. */
static int set_flag(cli_opts *o, const char *name, size_t n) {
  static const struct { const char *name; size_t off; int value; } flags[] = {
      {"no-cache", offsetof(cli_opts, no_cache), 1}, {"json", offsetof(cli_opts, json), 1},
      {"steps", offsetof(cli_opts, steps), 1},       {"check", offsetof(cli_opts, check), 1},
      {"causal", offsetof(cli_opts, causal), 1},     {"no-causal", offsetof(cli_opts, causal), 0},
      {"explain", offsetof(cli_opts, explain), 1},   {"dry-run", offsetof(cli_opts, dry_run), 1},
      {"varlen", offsetof(cli_opts, varlen), 1},
  };
  for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
    if (strlen(flags[i].name) == n && strncmp(flags[i].name, name, n) == 0) {
      *(int *)((char *)o + flags[i].off) = flags[i].value;
      if (flags[i].off == offsetof(cli_opts, causal)) o->causal_given = 1;
      return 1;
    }
  return 0;
}

static int parse_u64(const char *opt, const char *v, unsigned long long min, unsigned long long max,
                     unsigned long long *out) {
  char *end = NULL;
  errno = 0;
  unsigned long long x = strtoull(v, &end, 10);
  if (errno || end == v || *end || x < min || x > max || !(*v >= '0' && *v <= '9')) {
    cli_error("--%s %s: expected an integer from %llu to %llu", opt, v, min, max);
    return CLI_USAGE;
  }
  *out = x;
  return 0;
}

int cli_parse(int argc, char **argv, const char *allowed, const char *help, cli_opts *o) {
  memset(o, 0, sizeof *o); /* dtype NULL: each subcommand has its default */
  o->sp = 1;
  o->batch = 1;
  o->causal = 1;
  o->backend = "cpu";
  o->form = "explicit";
  o->seed = 1;
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(help, stdout);
      return CLI_HELP;
    }
    if (strncmp(a, "--", 2) != 0) {
      cli_error("unexpected argument '%s' (see --help)", a);
      return CLI_USAGE;
    }
    const char *name = a + 2, *eq = strchr(name, '=');
    size_t n = eq ? (size_t)(eq - name) : strlen(name);
    if (!allowed_has(allowed, name, n)) {
      cli_error("unknown option '%.*s' (see --help)", (int)(n + 2), a);
      return CLI_USAGE;
    }
    if (set_flag(o, name, n)) {
      if (eq) {
        cli_error("option '--%.*s' takes no value", (int)n, name);
        return CLI_USAGE;
      }
      continue;
    }
    const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
    if (!v || !*v) {
      cli_error("option '--%.*s' needs a value", (int)n, name);
      return CLI_USAGE;
    }
    unsigned long long u = 0;
#define OPT(s) (n == sizeof(s) - 1 && strncmp(name, s, n) == 0)
    if (OPT("model")) o->model = v;
    else if (OPT("templates")) o->templates = v;
    else if (OPT("dtype")) o->dtype = v;
    else if (OPT("out")) o->out = v;
    else if (OPT("arch")) o->arch = v;
    else if (OPT("cache-dir")) o->cache_dir = v;
    else if (OPT("backend")) o->backend = v;
    else if (OPT("form")) o->form = v;
    else if (OPT("inputs")) o->inputs = v;
    else if (OPT("dump")) o->dump = v;
    else if (OPT("device")) o->device = v;
    else if (OPT("link-gbps")) o->link_gbps = v;
    else if (OPT("tflops")) o->tflops = v;
    else if (OPT("hbm-gbps")) o->hbm_gbps = v;
    else if (OPT("mem-gib")) o->mem_gib = v;
    else if (OPT("seqlens")) o->seqlens = v;
    else if (OPT("family")) {
      if (o->n_family == CLI_MAX_SET) {
        cli_error("at most %d --family options", CLI_MAX_SET);
        return CLI_USAGE;
      }
      o->family[o->n_family++] = v;
    } else if (OPT("min-warps")) {
      if (parse_int("min-warps", v, 1, &o->min_warps)) return CLI_USAGE;
    }
    else if (OPT("head-groups")) {
      if (parse_int("head-groups", v, 0, &o->head_groups)) return CLI_USAGE;
    } else if (OPT("cp-head-groups")) {
      if (parse_int("cp-head-groups", v, 0, &o->cp_head_groups)) return CLI_USAGE;
    } else if (OPT("sp")) {
      if (parse_int("sp", v, 1, &o->sp)) return CLI_USAGE;
    } else if (OPT("batch")) {
      if (parse_int("batch", v, 1, &o->batch)) return CLI_USAGE;
      o->have_batch = 1;
    } else if (OPT("seq")) {
      if (parse_u64("seq", v, 1, CLI_MAX_SEQ, &u)) return CLI_USAGE;
      o->seq = (long long)u;
    } else if (OPT("seed")) {
      if (parse_u64("seed", v, 0, ~0ULL, &o->seed)) return CLI_USAGE;
    } else if (OPT("set")) {
      if (o->n_set == CLI_MAX_SET) {
        cli_error("at most %d --set options", CLI_MAX_SET);
        return CLI_USAGE;
      }
      /* a setting the plans fix (k_packed, deterministic, qsplit) renders a kernel no plan
       * step runs */
      mg_diag d = MG_DIAG_INIT;
      if (mg_spec_override_check(v, &d)) {
        cli_error("--set %s", mg_diag_msg(&d));
        mg_diag_clear(&d);
        return CLI_USAGE;
      }
      o->set[o->n_set++] = v;
    }
#undef OPT
  }
  if (o->out) { /* "dir/" -> "dir", so printed paths have one slash */
    size_t n = strlen(o->out);
    while (n > 1 && o->out[n - 1] == '/') n--;
    snprintf(o->outbuf, sizeof o->outbuf, "%.*s", (int)n, o->out);
    o->out = o->outbuf;
  }
  return 0;
}

int cli_kernel_dtype(cli_opts *o) {
  if (!o->dtype) o->dtype = "bf16";
  mg_dtype t16;
  if (!mg_dtype_spec_parse(o->dtype, &t16)) return 0;
  cli_error("--dtype %s: expected bf16 or fp16", o->dtype);
  return CLI_USAGE;
}

int cli_load_model(const cli_opts *o, mg_shape *shape) {
  mg_diag d = MG_DIAG_INIT;
  if (mg_config_load(o->model, shape, &d)) {
    cli_error("%s", mg_diag_msg(&d));
    mg_diag_clear(&d);
    return CLI_FAIL;
  }
  for (int i = 0; i < shape->n_notes; i++)
    fprintf(stderr, "mlagen: note: %s: %s\n", shape->source, shape->notes[i]);
  return 0;
}

/* Applies the --set overrides, in order, to s; stops at the first one s rejects. */
static int apply_sets(const cli_opts *o, mg_kernel_spec *s, mg_diag *d) {
  int rc = 0;
  for (int j = 0; !rc && j < o->n_set; j++) rc = mg_spec_set(s, o->set[j], d);
  return rc;
}

int cli_plan_build(mg_plan *p, const mg_plan_args *a, mg_diag *d) {
  const mg_plan_arg_names names = {
      .fn = "plan", .sp = "sp", .rank = "rank", .batch = "batch", .seq = "seq",
      .head_groups = a->form == MG_FORM_LAGA_CP ? "--cp-head-groups" : "--head-groups",
      .laga_f = "the fused LAGA form (laga-f)", .laga_cp = "laga-cp"};
  int rc = mg_plan_args_check(a, &names, d);
  return rc ? rc : mg_plan_build(p, a, d);
}

/* At a P that does not divide H (or exceeds it) the Ulysses forms do not run
 * (mg_plan_args_check) and laga-cp is the only form; its kernels do not depend on P (every
 * rank attends with all H heads, in head groups of H / N). Prints a note saying so, in
 * mg_plan_args_check's words, then cuts specs[0..*n) (mg_spec_for_model's at P = 1) to the
 * kernels laga-cp's plan at P launches: the families of its kernel steps, the attention and
 * K/V layout families (expand_kv, split_dkv) at its head-group width. */
static int cp_only_specs(const cli_opts *o, const mg_shape *shape, mg_kernel_spec *specs, int *n,
                         mg_diag *d) {
  if (o->sp < 1) return mg_diag_set(d, MLAGEN_EINVAL, "--sp %d: must be >= 1", o->sp);
  mg_plan *p = malloc(sizeof *p);
  if (!p) return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
  /* S = H P: every degree dividing H divides S, so the message lists them all */
  mg_plan_args a = {.shape = shape, .form = MG_FORM_EXPLICIT, .sp = o->sp, .batch = 1,
                    .seq = (int64_t)shape->heads * o->sp, .causal = 1, .dtype = MG_BF16};
  mg_diag why = MG_DIAG_INIT;
  mg_plan_args_check(&a, &mg_plan_names_no_seq, &why);
  a.form = MG_FORM_LAGA_CP;
  int rc = mg_plan_build(p, &a, d);
  if (!rc) {
    fprintf(stderr, "mlagen: note: %s. At --sp %d only laga-cp runs: rendering its kernels (the "
            "same at any P: all %d heads, %d head groups of %d)\n", mg_diag_msg(&why), o->sp,
            shape->heads, p->args.head_groups, p->heads_local / p->args.head_groups);
    int m = 0;
    for (int i = 0; i < *n; i++) {
      int keep = 0;
      for (int j = 0; j < p->n_steps && !keep; j++) {
        const mg_step *s = &p->steps[j];
        const int attn = s->op == MG_OP_ATTN_FWD || s->op == MG_OP_ATTN_BWD;
        /* per-head kernels: attention and the K/V layout steps, whose first input is
         * [B, S, heads, w] (mg_plan_check.c) */
        const int per_head = attn || s->op == MG_OP_EXPAND_KV || s->op == MG_OP_SPLIT_DKV;
        for (int k = 0; s->kind == MG_STEP_KERNEL && k < MG_SPEC_OP_FAMILIES && mg_op_family(s->op, k); k++)
          keep |= !strcmp(mg_op_family(s->op, k), specs[i].family) &&
                  (!per_head || (specs[i].heads == p->bufs[s->in[0]].dims[2] &&
                                 (!attn || specs[i].d_n == shape->qk_nope_head_dim)));
      }
      if (keep) specs[m++] = specs[i];
    }
    *n = m;
  }
  mg_diag_clear(&why);
  free(p);
  return rc;
}

int cli_model_specs(const cli_opts *o, const mg_shape *shape, int head_groups, const char *dtype,
                    mg_kernel_spec *specs, int max, int *n, mg_diag *d) {
  const int cp_only = o->sp > shape->heads || o->sp < 1 || shape->heads % o->sp != 0;
  int rc = mg_spec_for_plan(shape, cp_only ? 1 : o->sp, cp_only ? 0 : head_groups, dtype, specs,
                            max, n, d);
  return !rc && cp_only ? cp_only_specs(o, shape, specs, n, d) : rc;
}

/* --varlen: a packed-sequence (varlen) copy of every spec of the attention ops' families
 * (mg_op_family of MG_OP_ATTN_FWD, MG_OP_ATTN_BWD, MG_OP_MQA_FWD, MG_OP_MQA_BWD), the
 * kernels a varlen plan runs in their place (the CUDA executor's want_kernel_v). */
static int add_varlen(mg_kernel_spec *specs, int max, int *n, mg_diag *d) {
  static const int ops[] = {MG_OP_ATTN_FWD, MG_OP_ATTN_BWD, MG_OP_MQA_FWD, MG_OP_MQA_BWD};
  const int n0 = *n;
  for (int i = 0; i < n0; i++) {
    int attn = 0;
    for (size_t k = 0; k < sizeof ops / sizeof ops[0] && !attn; k++)
      for (int j = 0; mg_op_family(ops[k], j) && !attn; j++)
        attn = strcmp(mg_op_family(ops[k], j), specs[i].family) == 0;
    if (!attn || specs[i].varlen) continue;
    if (*n == max) return mg_diag_set(d, MLAGEN_ELIMIT, "--varlen: more than %d kernels", max);
    specs[*n] = specs[i];
    specs[(*n)++].varlen = 1;
  }
  return 0;
}

int cli_prepare(const cli_opts *o, mg_shape *shape, mg_kernel_spec *specs, int max, int *n,
                mg_gen **g) {
  *g = NULL;
  int rc = cli_load_model(o, shape);
  if (rc) return rc;
  mg_diag d = MG_DIAG_INIT;
  rc = cli_model_specs(o, shape, 0, o->dtype, specs, max, n, &d);
  for (int i = 0; !rc && i < *n; i++) rc = apply_sets(o, &specs[i], &d);
  if (!rc && o->varlen) rc = add_varlen(specs, max, n, &d);
  int status = rc == MLAGEN_EINVAL ? CLI_USAGE : CLI_FAIL;
  if (!rc) rc = mg_gen_open(g, o->templates, &d);
  if (rc) {
    cli_error("%s", mg_diag_msg(&d));
    mg_diag_clear(&d);
    return status;
  }
  return 0;
}

/* --family F: F beside each spec of its counterpart, the family it stands in for or that
 * stands in for it on this arch (mg_spec.c's tables: attn_fwd_sm90 beside attn_fwd,
 * mqa_fwd_sm90 beside mqa_fwd, attn_bwd_dkdv_sm90 / attn_bwd_dq_sm90 beside attn_bwd_dkdv /
 * attn_bwd_dq, mqa_bwd_dkv_sm90 / mqa_bwd_dq_sm90 beside mqa_bwd_dkv / mqa_bwd_dq, or, once --arch sm_90a made attn_fwd attn_fwd_sm90, attn_fwd
 * beside it). strict: an F that is neither an architecture's family nor a portable family one
 * stands in for is a usage error (generate, compile), else skipped (tune's --family selects). */
static int add_requested(const cli_opts *o, int strict, mg_kernel_spec *specs, int max, int *n) {
  for (int f = 0; f < o->n_family; f++) {
    const char *F = o->family[f];
    int dup = 0; /* --family F given twice renders F once */
    for (int g = 0; g < f; g++) dup |= strcmp(o->family[g], F) == 0;
    if (dup) continue;
    const int arch_family = strcmp(mg_family_portable(F), F) != 0;
    const int n0 = *n;
    for (int i = 0; i < n0; i++) {
      const char *fam = specs[i].family;
      const int counterpart = arch_family ? strcmp(fam, mg_family_portable(F)) == 0
                                          : strcmp(fam, F) != 0 && strcmp(mg_family_portable(fam), F) == 0;
      if (!counterpart) continue;
      if (*n == max) {
        cli_error("more than %d kernels (the model's, --varlen's and --family's)", max);
        return CLI_FAIL;
      }
      mg_kernel_spec s = specs[i];
      const int split = mg_spec_split_keys(&s); /* the counterpart's key layout */
      snprintf(s.family, sizeof s.family, "%s", F);
      s.n_config = 0;
      mg_spec_step_tunables(&s, split);
      mg_diag d = MG_DIAG_INIT;
      if (apply_sets(o, &s, &d)) {
        cli_error("%s", mg_diag_msg(&d));
        mg_diag_clear(&d);
        return CLI_USAGE;
      }
      specs[(*n)++] = s;
    }
    int paired = arch_family; /* F is an arch's family, or a portable one some arch replaces */
    for (const mg_arch_kernels *a = mg_arch_kernel_table; a->arch && !paired; a++)
      for (int i = 0; i < MG_SPEC_OP_FAMILIES && a->k.family[i] && !a->on_request; i++)
        paired |= strcmp(a->k.family[i], F) != 0 && strcmp(mg_family_portable(a->k.family[i]), F) == 0;
    if (strict && !paired) {
      char list[512] = ""; /* the architectures' families (mg_spec.c) */
      for (const char *const *af = mg_spec_families; *af; af++)
        if (strcmp(mg_family_portable(*af), *af)) {
          const size_t len = strlen(list);
          snprintf(list + len, sizeof list - len, "%s%s", len ? ", " : "", *af);
        }
      char repl[256] = ""; /* the portable families an architecture's row replaces */
      for (const mg_arch_kernels *a = mg_arch_kernel_table; a->arch; a++)
        for (int i = 0; i < MG_SPEC_OP_FAMILIES && a->k.family[i] && !a->on_request; i++) {
          const char *p = mg_family_portable(a->k.family[i]);
          if (!strcmp(p, a->k.family[i])) continue;
          const size_t len = strlen(repl);
          snprintf(repl + len, sizeof repl - len, "%s%s on %s", len ? ", " : "", p, a->arch);
        }
      cli_error("--family %s: generate and compile render on request only an architecture's "
                "family beside the portable one it stands in for (%s), or a portable family "
                "beside the architecture's that replaces it (%s; with --arch); every other "
                "family is rendered anyway", F, list, repl);
      return CLI_USAGE;
    }
  }
  return 0;
}

int cli_arch_specs(const cli_opts *o, const char *arch, int strict, mg_kernel_spec *specs, int max,
                   int *n) {
  int forced = 0; /* MLAGEN_MMA_SYNC: the portable families, as the CUDA executor then runs */
  {
    mg_diag d = MG_DIAG_INIT;
    if (mg_spec_mma_sync_forced(&forced, &d)) {
      cli_error("%s", mg_diag_msg(&d));
      mg_diag_clear(&d);
      return CLI_USAGE;
    }
  }
  static int said;
  if (forced && arch && !said++)
    fprintf(stderr, "mlagen: note: MLAGEN_MMA_SYNC=%s: the portable (mma.sync) families, as the "
            "CUDA executor runs them then, not %s's own\n", getenv("MLAGEN_MMA_SYNC"), arch);
  for (int i = 0; arch && !forced && i < *n; i++)
    if (mg_spec_to_arch(&specs[i], arch, &specs[i])) {
      mg_diag d = MG_DIAG_INIT;
      if (apply_sets(o, &specs[i], &d)) {
        cli_error("%s", mg_diag_msg(&d));
        mg_diag_clear(&d);
        return CLI_USAGE;
      }
    }
  int rc = add_requested(o, strict, specs, max, n);
  if (rc) return rc;
  for (int f = 0; arch && f < o->n_family; f++) { /* an arch family asked for elsewhere: say so */
    const char *F = o->family[f], *on = NULL;
    int dup = 0;
    for (int g = 0; g < f; g++) dup |= strcmp(o->family[g], F) == 0;
    for (const mg_arch_kernels *a = mg_arch_kernel_table; a->arch && !on; a++)
      for (int i = 0; i < MG_SPEC_OP_FAMILIES && a->k.family[i]; i++)
        if (!strcmp(a->k.family[i], F)) on = a->arch;
    if (!dup && on && !mg_family_runs_on(F, arch))
      fprintf(stderr, "mlagen: note: --family %s runs on %s only: not rendered for %s\n", F, on, arch);
  }
  int m = 0; /* drop another arch's families, and duplicates */
  for (int i = 0; i < *n; i++) {
    int keep = !arch || mg_family_runs_on(specs[i].family, arch);
    for (int j = 0; j < m && keep; j++) keep = memcmp(&specs[j], &specs[i], sizeof specs[i]) != 0;
    if (keep) specs[m++] = specs[i];
  }
  *n = m;
  return 0;
}

int cli_prepare_rendered(const cli_opts *o, const char *arch, mg_shape *shape,
                         mg_kernel_spec *specs, int max, int *n, mg_gen **g) {
  int rc = cli_prepare(o, shape, specs, max, n, g);
  if (!rc && (rc = cli_arch_specs(o, arch, 1, specs, max, n))) {
    mg_gen_close(*g);
    *g = NULL;
  }
  return rc;
}

/* 1 when the fallback note of family f for reason msg was printed before (seen records it,
 * else 0). The reason: the refusal's text after its "rejected: " (the configuration before
 * it differs between the variants of one spec), else all of it. */
static int note_seen(cli_seen *seen, const char *f, const char *msg) {
  const char *why = strstr(msg, "rejected: ");
  why = why ? why + strlen("rejected: ") : msg;
  char key[1024];
  uint8_t dig[MG_HASH_BYTES];
  snprintf(key, sizeof key, "%s\n%s", f, why);
  if (mg_hash(key, strlen(key), dig)) return 0; /* out of memory: print it */
  for (int j = 0; j < seen->n_notes; j++)
    if (!memcmp(seen->note[j], dig, sizeof dig)) return 1;
  if (seen->n_notes < MG_SPEC_MAX_KERNELS) memcpy(seen->note[seen->n_notes++], dig, sizeof dig);
  return 0;
}

int cli_render(const cli_opts *o, mg_gen *g, mg_kernel_spec *s, mg_kernel *k, cli_seen *seen,
               mg_diag *d) {
  int rc = mg_gen_kernel(g, s, k, d);
  const char *portable = mg_family_portable(s->family);
  if (rc != MLAGEN_EINVAL || !strcmp(portable, s->family)) return rc;
  /* an architecture's family that refuses this shape: the portable one, as the executor does */
  if (!note_seen(seen, s->family, mg_diag_msg(d)))
    fprintf(stderr, "mlagen: note: %s (%s heads %d): %s; %s instead (this note stands for "
            "every %s kernel refused for this reason)\n", s->family,
            s->causal ? "causal" : "non-causal", s->heads, mg_diag_msg(d), portable, s->family);
  mg_diag_clear(d);
  const int split = mg_spec_split_keys(s);
  snprintf(s->family, sizeof s->family, "%s", portable);
  s->n_config = 0;
  mg_spec_step_tunables(s, split);
  if ((rc = apply_sets(o, s, d))) return rc;
  return mg_gen_kernel(g, s, k, d);
}

int cli_kernel_seen(cli_seen *seen, const mg_kernel *k) {
  uint8_t dig[MG_HASH_BYTES];
  if (mg_hash(k->source, k->source_len, dig)) return 0; /* out of memory: render it again */
  for (int j = 0; j < seen->n; j++)
    if (!memcmp(seen->digest[j], dig, sizeof dig) && !strcmp(seen->name[j], k->name)) return 1;
  if (seen->n < MG_SPEC_MAX_KERNELS) {
    snprintf(seen->name[seen->n], sizeof seen->name[0], "%s", k->name);
    memcpy(seen->digest[seen->n++], dig, sizeof dig);
  }
  return 0;
}
