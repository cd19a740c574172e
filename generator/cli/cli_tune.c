/* cli_tune.c: `mlagen tune`: sweep the tunables, prune by ptxas, time, keep the winners. */
#define _DEFAULT_SOURCE 1 /* clock_gettime, isatty, fileno */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "mg_generate.h"
#include "mg_driver.h"
#include "mg_jit.h"
#include "mg_ktime.h"
#include "mg_tune.h"
#include "mlagen.h"

static const char help[] =
    "usage: mlagen tune [--dry-run] [--model M] [--sp P] [--arch ARCH] [--family F]...\n"
    "                   [--causal | --no-causal] [--dtype bf16|fp16] [--seq S]\n"
    "                   [--min-warps N] [--templates DIR] [--cache-dir DIR] [--no-cache]\n"
    "\n"
    "Enumerates every combination of each kernel family's declared tunables for the\n"
    "model's shape (causal and non-causal unless one is given; the families ARCH's\n"
    "executor runs: on sm_90a attn_fwd_sm90, attn_bwd_dkdv_sm90, attn_bwd_dq_sm90 in place\n"
    "of attn_fwd, attn_bwd_dkdv, attn_bwd_dq, which --family brings back for A/B, or\n"
    "MLAGEN_MMA_SYNC=1 alone), drops what the\n"
    "template's check rejects, compiles the rest with NVRTC (JIT cache on) and prunes\n"
    "by the ptxas report: any spill, wgmma that ptxas serialized (its C75xx note),\n"
    "shared memory over the arch's per-block limit, or\n"
    "registers that allow fewer than N resident warps per SM (docs/tuning.md). The\n"
    "survivors are then checked against the default configuration's outputs and timed\n"
    "on the GPU at sequence length S (CUDA events, rotating inputs, L2 flushed); a\n"
    "candidate that fails to launch or differs is discarded (failed-launch,\n"
    "wrong-result) and recorded so; the winner of each\n"
    "kernel goes into $MLAGEN_TUNED_DIR (default ./tuned)/<arch>/<device>.json, stamped\n"
    "with its family's template hash and merged with what is there (the entries of the\n"
    "same key replaced, the others kept). Timing needs a GPU: without --dry-run and without one, tune\n"
    "fails with MLAGEN_ENODRIVER.\n"
    "\n"
    "  --dry-run        everything but the timing: print the candidate table and a summary\n"
    "  --arch ARCH      one real target (default sm_90a)\n"
    "  --family F       only this kernel family (repeatable; default all)\n"
    "  --causal         only the causal kernels; --no-causal only the non-causal ones\n"
    "  --seq S          sequence length to time at (default 4096; stored by bucket)\n"
    "  --min-warps N    occupancy threshold, warps per SM the registers must allow\n"
    "                   (default 8)\n"
    "  other options as for `mlagen compile`\n";

typedef struct progress {
  double t0;
  int tty;
  int last_len;
} progress;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void on_progress(void *user, int done, int total, const mg_tune_candidate *c) {
  progress *p = user;
  double el = now_s() - p->t0;
  double eta = done > 0 ? el / done * (total - done) : 0;
  if (p->tty) {
    char bar[31];
    int fill = total > 0 ? (int)(30.0 * done / total) : 30;
    for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
    bar[30] = '\0';
    fprintf(stderr, "\r[%s] %d/%d  elapsed %.1f s  ETA %.0f s ", bar, done, total, el, eta);
    if (done == total) fputc('\n', stderr);
    fflush(stderr);
  } else if (c->verdict != MG_TUNE_REJECTED || done == total) {
    fprintf(stderr, "tune: %d/%d %s (elapsed %.1f s, ETA %.0f s)\n", done, total,
            c->kernel[0] ? c->kernel : c->spec.family, el, eta);
  }
}

static int family_known(const char *f) {
  for (const char *const *x = mg_spec_families; *x; x++)
    if (strcmp(*x, f) == 0) return 1;
  return 0;
}

static int spec_selected(const cli_opts *o, const mg_kernel_spec *s) {
  if (o->causal_given && s->causal != o->causal) return 0;
  if (o->n_family == 0) return 1;
  for (int i = 0; i < o->n_family; i++)
    if (strcmp(o->family[i], s->family) == 0) return 1;
  return 0;
}

/* The reference kernels of one spec: the default configuration with each candidate's
 * interface tunables (mg_ktime_reference_spec), built once each. */
typedef struct ref_cache {
  int n;
  struct {
    mg_kernel_spec spec;
    mg_kernel k;
    mg_cubin c;
  } r[16];
} ref_cache;

static void ref_cache_free(ref_cache *rc) {
  for (int i = 0; i < rc->n; i++) {
    mg_cubin_free(&rc->r[i].c);
    mg_kernel_free(&rc->r[i].k);
  }
  rc->n = 0;
}

static int same_config(const mg_kernel_spec *a, const mg_kernel_spec *b) {
  if (a->n_config != b->n_config) return 0;
  for (int i = 0; i < a->n_config; i++)
    if (strcmp(a->config[i].name, b->config[i].name) || a->config[i].value != b->config[i].value)
      return 0;
  return 1;
}

/* The reference of candidate spec s into *k, *c (owned by the cache). */
static int reference_of(mg_gen *g, ref_cache *rc, const mg_kernel_spec *s,
                        const mg_kernel_info *cand, const mg_jit_opts *o, const mg_kernel **k,
                        const mg_cubin **c, mg_diag *d) {
  mg_kernel_spec rs;
  mg_ktime_reference_spec(s, cand, &rs);
  for (int i = 0; i < rc->n; i++)
    if (same_config(&rc->r[i].spec, &rs)) {
      *k = &rc->r[i].k, *c = &rc->r[i].c;
      return 0;
    }
  if (rc->n == (int)(sizeof rc->r / sizeof rc->r[0]))
    return mg_diag_set(d, MLAGEN_ELIMIT, "%s: more than %d reference kernels", s->family, rc->n);
  int e = rc->n;
  int st = mg_gen_kernel(g, &rs, &rc->r[e].k, d);
  if (st) {
    mg_diag_prefix(d, "the reference (default configuration) of %s", s->family);
    return st;
  }
  if ((st = mg_jit_compile(rc->r[e].k.source, rc->r[e].k.source_len, rc->r[e].k.file,
                           rc->r[e].k.name, o, &rc->r[e].c, d))) {
    mg_kernel_free(&rc->r[e].k);
    return st;
  }
  rc->r[e].spec = rs;
  rc->n++;
  *k = &rc->r[e].k, *c = &rc->r[e].c;
  return 0;
}

/* Checks and times the kept candidates of one spec (cands[0..n)) and stores the winner with
 * every candidate's timing or why it was discarded (failed-launch, wrong-result). GPU only. */
static int time_spec(mg_gen *g, const mg_tune_candidate *cands, int n, const mg_jit_opts *jo,
                     long long seq, const mg_tune_header *h, int *stored, int *discarded,
                     mg_diag *d) {
  enum { SAMPLES = 25 };
  mg_tune_entry e;
  mg_tune_entry_key(&e, &cands[0].spec, NULL, seq);
  /* the entry holds while what renders this family's kernels is unchanged */
  const char *fam_hash = mg_gen_family_hash(g, e.family);
  snprintf(e.template_hash, sizeof e.template_hash, "%s", fam_hash ? fam_hash : "");
  e.candidates = calloc((size_t)n, sizeof *e.candidates);
  if (!e.candidates) return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
  int rc = 0, best = -1;
  double flops = 0; /* of one call at seq */
  int n_hdr = 0;
  mg_jit_opts o = *jo;
  o.headers = mg_gen_headers(g, &n_hdr);
  o.n_headers = n_hdr;
  o.template_hash = mg_gen_template_hash(g);
  ref_cache refs;
  refs.n = 0;
  for (int i = 0; i < n && !rc; i++) {
    if (cands[i].verdict != MG_TUNE_KEPT) continue;
    mg_kernel k;
    mg_cubin c;
    const mg_kernel *rk = NULL;
    const mg_cubin *rcub = NULL;
    if ((rc = mg_gen_kernel(g, &cands[i].spec, &k, d))) break;
    /* the family's facts from its kernel{} declaration */
    snprintf(e.pass, sizeof e.pass, "%s", k.info.pass);
    flops = mg_kernel_flops(&k.info, cands[i].spec.causal, seq);
    rc = reference_of(g, &refs, &cands[i].spec, &k.info, &o, &rk, &rcub, d);
    if (!rc) rc = mg_jit_compile(k.source, k.source_len, k.file, k.name, &o, &c, d);
    if (!rc) {
      double ms[SAMPLES];
      mg_tune_timing *t = &e.candidates[e.n_candidates];
      t->config = cands[i].config;
      rc = mg_tune_timer(&k, &c, rk, rcub, &cands[i].spec, seq, SAMPLES, ms, &t->verdict,
                         t->reason, sizeof t->reason, d);
      if (!rc) {
        char cfg[256];
        mg_tune_config_str(&t->config, cfg, sizeof cfg);
        if (t->verdict == MG_TUNE_KEPT) {
          t->p20_ms = mg_tune_percentile(ms, SAMPLES, 20);
          t->p50_ms = mg_tune_percentile(ms, SAMPLES, 50);
          t->p80_ms = mg_tune_percentile(ms, SAMPLES, 80);
          if (best < 0 || t->p50_ms < e.candidates[best].p50_ms) best = e.n_candidates;
          fprintf(stderr, "tune: %s: p20 %.4f p50 %.4f p80 %.4f ms\n", k.name, t->p20_ms,
                  t->p50_ms, t->p80_ms);
        } else {
          printf("%-18s %-10s %-52s %s (%s)\n", cands[i].spec.family,
                 cands[i].spec.causal ? "causal" : "non-causal", cfg,
                 mg_tune_verdict_name(t->verdict), t->reason);
          (*discarded)++;
        }
        e.n_candidates++;
      }
      mg_cubin_free(&c);
    }
    mg_kernel_free(&k);
  }
  ref_cache_free(&refs);
  if (!rc && best < 0 && e.n_candidates > 0) {
    printf("%s %s: every candidate was discarded at timing: nothing stored\n", e.family,
           e.causal ? "causal" : "non-causal");
  }
  if (!rc && best >= 0) {
    const mg_tune_timing *w = &e.candidates[best];
    e.config = w->config;
    e.p20_ms = w->p20_ms;
    e.p50_ms = w->p50_ms;
    e.p80_ms = w->p80_ms;
    e.tflops = w->p50_ms > 0 ? flops / (w->p50_ms * 1e-3) * 1e-12 : 0;
    char *warning = NULL;
    rc = mg_tune_store_add(NULL, h, &e, 1, &warning, d);
    if (warning) fprintf(stderr, "mlagen: warning: %s\n", warning);
    free(warning);
    if (!rc) {
      char cfg[256];
      printf("%s %s: %s, p50 %.3f ms, %.1f TFLOP/s\n", e.family, e.causal ? "causal" : "non-causal",
             mg_tune_config_str(&e.config, cfg, sizeof cfg), e.p50_ms, e.tflops);
      (*stored)++;
    }
  }
  free(e.candidates);
  return rc;
}

int cli_tune(int argc, char **argv) {
  cli_opts o;
  int rc = cli_parse(argc, argv,
                     "model sp dtype templates arch cache-dir no-cache family causal no-causal "
                     "dry-run seq min-warps",
                     help, &o);
  if (rc) return rc == CLI_HELP ? CLI_OK : rc;
  if ((rc = cli_kernel_dtype(&o))) return rc;
  const char *arch = o.arch ? o.arch : "sm_90a";
  mg_diag d = MG_DIAG_INIT;
  mg_tune_limits lim;
  if (mg_tune_arch_limits(arch, &lim, &d)) {
    cli_error("--arch: %s", mg_diag_msg(&d));
    mg_diag_clear(&d);
    return CLI_USAGE;
  }
  if (o.min_warps) lim.min_warps = o.min_warps;
  for (int i = 0; i < o.n_family; i++)
    if (!family_known(o.family[i])) {
      cli_error("--family %s: no such kernel family", o.family[i]);
      return CLI_USAGE;
    }
  if (!o.dry_run && (!mg_tune_timer || !mg_tune_describe)) {
    /* the GPU timer (generator/cli/mg_ktime.c) is installed when the CUDA driver loads */
    const mg_driver *drv = NULL;
    mg_diag dd = MG_DIAG_INIT;
    if (mg_driver_get(&drv, &dd) == 0) {
      mg_tune_timer = mg_ktime_timer;
      mg_tune_describe = mg_ktime_describe;
      /* where the winners go must take them, before anything is compiled or timed */
      mg_tune_device dev;
      memset(&dev, 0, sizeof dev);
      if (mg_tune_describe(&dev, &dd) || mg_tune_store_writable(NULL, arch, dev.name, &dd)) {
        cli_error("tune: %s", mg_diag_msg(&dd));
        mg_diag_clear(&dd);
        return CLI_FAIL;
      }
    } else {
      cli_error("%s: timing needs a GPU (%s); use --dry-run to enumerate, compile and prune "
                "without timing",
                mlagen_status_name(MLAGEN_ENODRIVER), mg_diag_msg(&dd));
      mg_diag_clear(&dd);
      return CLI_FAIL;
    }
    mg_diag_clear(&dd);
  }
  long long seq = o.seq ? o.seq : 4096;

  mg_shape shape;
  mg_kernel_spec specs[MG_SPEC_MAX_KERNELS];
  int n_specs = 0;
  mg_gen *g;
  if ((rc = cli_prepare(&o, &shape, specs, MG_SPEC_MAX_KERNELS, &n_specs, &g))) return rc;
  /* the families arch's executor runs (sm_90a: attn_fwd_sm90 for attn_fwd), and a portable
   * family they replace when --family names it (the mma.sync fallback) */
  if ((rc = cli_arch_specs(&o, arch, 0, specs, MG_SPEC_MAX_KERNELS, &n_specs))) {
    mg_gen_close(g);
    return rc;
  }

  /* the space: every selected spec's combinations, one array */
  mg_tune_candidate *all = NULL;
  /* one of each per selected spec: n_specs <= MG_SPEC_MAX_KERNELS (V3 at --sp 4 selects 72) */
  int n_all = 0, first[MG_SPEC_MAX_KERNELS], count[MG_SPEC_MAX_KERNELS], n_sel = 0;
  for (int i = 0; i < n_specs && !rc; i++) {
    if (!spec_selected(&o, &specs[i])) continue;
    mg_tune_candidate *c = NULL;
    int n = 0;
    if ((rc = mg_tune_space(g, &specs[i], &c, &n, &d))) break;
    mg_tune_candidate *grown = realloc(all, (size_t)(n_all + n) * sizeof *all);
    if (!grown) {
      free(c);
      rc = mg_diag_set(&d, MLAGEN_ENOMEM, "out of memory");
      break;
    }
    all = grown;
    memcpy(all + n_all, c, (size_t)n * sizeof *c);
    free(c);
    first[n_sel] = n_all;
    count[n_sel++] = n;
    n_all += n;
  }
  if (!rc && n_all == 0) {
    cli_error("no kernel selected (check --family and --causal/--no-causal)");
    free(all);
    mg_gen_close(g);
    return CLI_USAGE;
  }

  mg_jit_opts jo = {.arch = arch, .cache_dir = o.cache_dir, .no_cache = o.no_cache};
  progress pr = {.t0 = now_s(), .tty = isatty(fileno(stderr))};
  if (!rc) {
    fprintf(stderr, "tune: %d candidates for %s, %s (first runs compile each kept one, "
            "~0.3-1 s; the JIT cache makes reruns fast)\n", n_all, shape.source, arch);
    rc = mg_tune_evaluate(g, all, n_all, &jo, &lim, on_progress, &pr, &d);
  }
  if (rc) {
    cli_error("%s", mg_diag_msg(&d));
    mg_diag_clear(&d);
    free(all);
    mg_gen_close(g);
    return rc == MLAGEN_EINVAL ? CLI_USAGE : CLI_FAIL;
  }
  double elapsed = now_s() - pr.t0;

  int by[MG_TUNE_N_VERDICTS] = {0}, hits = 0;
  printf("%-18s %4s %-10s %-52s %5s %6s %7s %5s  %s\n", "family", "H", "causal", "config", "regs",
         "spill", "smem", "warps", "verdict");
  for (int i = 0; i < n_all; i++) {
    const mg_tune_candidate *c = &all[i];
    char cfg[256];
    mg_tune_config_str(&c->config, cfg, sizeof cfg);
    by[c->verdict >= 0 && c->verdict < MG_TUNE_N_VERDICTS ? c->verdict : MG_TUNE_FAILED]++;
    int compiled = c->verdict == MG_TUNE_KEPT || c->verdict == MG_TUNE_PRUNED;
    hits += compiled && c->report.cache_hit;
    if (compiled)
      printf("%-18s %4d %-10s %-52s %5d %6ld %7ld %5d  %s%s%s%s\n", c->spec.family, c->spec.heads,
             c->spec.causal ? "causal" : "non-causal", cfg, c->report.registers,
             c->report.spill_stores + c->report.spill_loads, c->report.smem_bytes + c->dyn_smem,
             c->warps, mg_tune_verdict_name(c->verdict), c->reason[0] ? " (" : "", c->reason,
             c->reason[0] ? ")" : "");
    else
      printf("%-18s %4d %-10s %-52s %5s %6s %7s %5s  %s (%s)\n", c->spec.family, c->spec.heads,
             c->spec.causal ? "causal" : "non-causal", cfg, "-", "-", "-", "-",
             mg_tune_verdict_name(c->verdict), c->reason);
  }
  printf("%d candidates: %d kept, %d rejected by check, %d pruned, %d failed; "
         "%d compiled (%d from cache) in %.1f s; threshold %d warps/SM, smem limit %ld bytes (%s)\n",
         n_all, by[MG_TUNE_KEPT], by[MG_TUNE_REJECTED], by[MG_TUNE_PRUNED], by[MG_TUNE_FAILED],
         by[MG_TUNE_KEPT] + by[MG_TUNE_PRUNED], hits, elapsed, lim.min_warps, lim.smem_per_block,
         arch);
  /* the portable families' templates cap themselves at sm_80's limit on every arch
   * (prelude.lua, smem_limit): their rejections name that figure, not arch's */
  mg_tune_limits l80;
  int portable = 0;
  for (int i = 0; i < n_all; i++) portable |= !strcmp(mg_family_portable(all[i].spec.family), all[i].spec.family);
  if (portable && !mg_tune_arch_limits("sm_80", &l80, NULL) && l80.smem_per_block < lim.smem_per_block)
    printf("portable families: their templates cap shared memory at sm_80's %ld bytes on every "
           "arch (the limit their rejections name); only an architecture's own family, such as "
           "attn_fwd_sm90, may use %s's %ld\n", l80.smem_per_block, arch, lim.smem_per_block);

  int status = by[MG_TUNE_FAILED] ? CLI_FAIL : CLI_OK;
  if (!o.dry_run) {
    mg_tune_device dev;
    memset(&dev, 0, sizeof dev);
    if ((rc = mg_tune_describe(&dev, &d)) == 0) {
      mg_tune_header h;
      memset(&h, 0, sizeof h);
      h.schema = MG_TUNE_SCHEMA;
      snprintf(h.mlagen_version, sizeof h.mlagen_version, "%s", MLAGEN_VERSION);
      snprintf(h.template_hash, sizeof h.template_hash, "%s", mg_gen_template_hash(g));
      int maj = 0, min = 0;
      mg_jit_nvrtc_version(&maj, &min);
      snprintf(h.nvrtc_version, sizeof h.nvrtc_version, "%d.%d", maj, min);
      h.driver_version = dev.driver_version;
      snprintf(h.device, sizeof h.device, "%s", dev.name);
      snprintf(h.arch, sizeof h.arch, "%s", arch);
      h.sm_count = dev.sm_count;
      int stored = 0, discarded = 0;
      printf("timing on %s (%d SMs, driver %d) at seq %lld, batch 1\n", dev.name, dev.sm_count,
             dev.driver_version, seq);
      for (int s = 0; s < n_sel && !rc; s++)
        rc = time_spec(g, all + first[s], count[s], &jo, seq, &h, &stored, &discarded, &d);
      if (!rc)
        printf("%d entries stored under %s; %d candidates discarded at timing\n", stored,
               mg_tune_store_dir(), discarded);
    }
    if (rc) {
      cli_error("%s", mg_diag_msg(&d));
      status = CLI_FAIL;
    }
  }
  mg_diag_clear(&d);
  free(all);
  mg_gen_close(g);
  return status;
}
