/* mg_tune.c: the autotuner's sweep: candidate space, pruning, timing helpers. The store
 * and its lookup are in mg_tune_store.c. */
#include "mg_tune.h"


#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mg_arch.h"
#include "mlagen.h"

mg_tune_timer_fn mg_tune_timer = NULL;
mg_tune_describe_fn mg_tune_describe = NULL;

/* ---- limits and pruning ------------------------------------------------------------- */

int mg_tune_arch_limits(const char *arch, mg_tune_limits *l, mg_diag *d) {
  const mg_arch_facts *f = mg_arch_named(arch); /* mg_arch.h: the one table and name rule */
  const int sm = mg_arch_sm(arch);
  if (sm >= 0 && sm < MG_ARCH_MIN_SM)
    return mg_diag_set(d, MLAGEN_EINVAL, MG_ARCH_TOO_OLD_FMT, arch, MG_ARCH_MIN_SM);
  if (f && f->max_warps) {
    l->smem_per_block = f->smem;
    l->regs_per_sm = 65536;
    l->max_warps_per_sm = f->max_warps;
    l->max_ctas_per_sm = f->max_ctas;
    l->min_warps = MG_TUNE_MIN_WARPS;
    return 0;
  }
  return mg_diag_set(d, MLAGEN_EINVAL,
                     "architecture '%s': no occupancy table (known: sm_80, sm_86, sm_87, sm_89, "
                     "sm_90, sm_100, sm_103, sm_120, written sm_<NN> with an optional a/f suffix, "
                     "e.g. sm_90a)", arch ? arch : "(null)");
}

int mg_tune_reg_occupancy(int registers, int threads, const mg_tune_limits *l) {
  if (threads <= 0) return 0;
  int warps_per_cta = (threads + 31) / 32;
  long regs = registers > 0 ? registers : 1;
  long per_warp = (regs * 32 + 255) / 256 * 256; /* allocation unit: 256 registers/warp */
  long per_cta = per_warp * warps_per_cta;
  long ctas = l->regs_per_sm / per_cta;
  if (ctas > l->max_ctas_per_sm) ctas = l->max_ctas_per_sm;
  if (ctas > l->max_warps_per_sm / warps_per_cta) ctas = l->max_warps_per_sm / warps_per_cta;
  return (int)(ctas * warps_per_cta);
}

int mg_tune_prune(const mg_jit_report *r, int threads, long dyn_smem, const mg_tune_limits *l,
                  int *warps, char *why, size_t n) {
  int w = mg_tune_reg_occupancy(r->registers, threads, l);
  if (warps) *warps = w;
  if (n) why[0] = '\0';
  if (r->spill_stores > 0 || r->spill_loads > 0) {
    snprintf(why, n, "spills %ld bytes (stores %ld, loads %ld)", r->spill_stores + r->spill_loads,
             r->spill_stores, r->spill_loads);
    return 1;
  }
  if (r->wgmma_serialized) {
    if (r->wgmma_serialized > 1)
      snprintf(why, n, "wgmma serialized by ptxas (C%d)", r->wgmma_serialized);
    else
      snprintf(why, n, "wgmma serialized by ptxas");
    return 1;
  }
  long smem = r->smem_bytes + dyn_smem;
  if (smem > l->smem_per_block) {
    snprintf(why, n, "smem %ld bytes (static %ld + dynamic %ld) over the %ld-byte limit", smem,
             r->smem_bytes, dyn_smem, l->smem_per_block);
    return 1;
  }
  if (w < l->min_warps) {
    snprintf(why, n, "regs %d x %d threads -> occupancy %d warps/SM < %d", r->registers, threads,
             w, l->min_warps);
    return 1;
  }
  return 0;
}

/* ---- the space ---------------------------------------------------------------------- */

int mg_tune_space(mg_gen *g, const mg_kernel_spec *base, mg_tune_candidate **out, int *n,
                  mg_diag *d) {
  *out = NULL;
  *n = 0;
  mg_kernel_spec s = *base;
  s.n_config = 0;
  mg_kernel k;
  int rc = mg_gen_kernel(g, &s, &k, d);
  if (rc) return rc;
  struct {
    char name[sizeof(((mg_tunable_value *)0)->name)];
    long values[MG_KERNEL_MAX_VALUES];
    int n;
  } t[MG_SPEC_MAX_CONFIG];
  memset(t, 0, sizeof t);
  const int nt = k.info.n_tunables;
  long total = 1;
  rc = 0;
  for (int i = 0; i < nt && !rc; i++) { /* names sorted by the manifest */
    const mg_kernel_tunable *kt = &k.info.tunables[i];
    snprintf(t[i].name, sizeof t[i].name, "%s", kt->name);
    int fixed = -1; /* the base spec fixes this tunable */
    for (int j = 0; j < base->n_config; j++)
      if (strcmp(base->config[j].name, kt->name) == 0) fixed = j;
    for (int v = 0; v < kt->n; v++)
      if (fixed < 0 || kt->values[v] == base->config[fixed].value) t[i].values[t[i].n++] = kt->values[v];
    if (t[i].n == 0)
      rc = mg_diag_set(d, MLAGEN_EINVAL, "%s: tunable %s has no integer values", s.family, t[i].name);
    total *= t[i].n ? t[i].n : 1;
    if (!rc && total > 4096)
      rc = mg_diag_set(d, MLAGEN_EINVAL, "%s: more than 4096 combinations of tunables", s.family);
  }
  mg_kernel_free(&k);
  if (rc) return rc;
  mg_tune_candidate *c = calloc((size_t)total, sizeof *c);
  if (!c) return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
  int idx[MG_SPEC_MAX_CONFIG] = {0};
  for (long i = 0; i < total; i++) {
    mg_tune_candidate *x = &c[i];
    x->spec = s;
    x->config.n = nt;
    for (int j = 0; j < nt; j++) {
      memcpy(x->config.v[j].name, t[j].name, sizeof x->config.v[j].name); /* both 32 bytes */
      x->config.v[j].value = t[j].values[idx[j]];
      x->spec.config[j] = x->config.v[j];
    }
    x->spec.n_config = nt;
    for (int j = nt - 1; j >= 0; j--) { /* odometer, last name fastest */
      if (++idx[j] < t[j].n) break;
      idx[j] = 0;
    }
  }
  *out = c;
  *n = (int)total;
  return 0;
}

int mg_tune_evaluate(mg_gen *g, mg_tune_candidate *cands, int n, const mg_jit_opts *jo,
                     const mg_tune_limits *l, mg_tune_progress_fn progress, void *user,
                     mg_diag *d) {
  int n_hdr = 0;
  const mg_jit_header *hdr = mg_gen_headers(g, &n_hdr);
  mg_jit_opts o = *jo;
  o.headers = hdr;
  o.n_headers = n_hdr;
  o.template_hash = mg_gen_template_hash(g);
  for (int i = 0; i < n; i++) {
    mg_tune_candidate *c = &cands[i];
    mg_diag kd = MG_DIAG_INIT;
    mg_kernel k;
    int rc = mg_gen_kernel(g, &c->spec, &k, &kd);
    if (rc == MLAGEN_ENOMEM) {
      mg_diag_clear(&kd);
      return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
    }
    if (rc) {
      const char *msg = mg_diag_msg(&kd), *r = strstr(msg, " rejected: ");
      c->verdict = rc == MLAGEN_EINVAL ? MG_TUNE_REJECTED : MG_TUNE_FAILED;
      snprintf(c->reason, sizeof c->reason, "%s", r && rc == MLAGEN_EINVAL ? r + 11 : msg);
      mg_diag_clear(&kd);
      if (progress) progress(user, i + 1, n, c);
      continue;
    }
    snprintf(c->kernel, sizeof c->kernel, "%s", k.name);
    c->dyn_smem = (long)k.info.launch.smem;
    c->threads = (int)(k.info.launch.block[0] * k.info.launch.block[1] * k.info.launch.block[2]);
    mg_cubin cub;
    rc = mg_jit_compile(k.source, k.source_len, k.file, k.name, &o, &cub, &kd);
    mg_kernel_free(&k);
    if (rc == MLAGEN_ENOMEM || rc == MLAGEN_EIO || rc == MLAGEN_EINVAL) {
      /* would fail every candidate alike */
      int st = mg_diag_set(d, rc, "%s", mg_diag_msg(&kd));
      mg_diag_clear(&kd);
      return st;
    }
    if (rc) {
      c->verdict = MG_TUNE_FAILED;
      snprintf(c->reason, sizeof c->reason, "%s", mg_diag_msg(&kd));
      mg_diag_clear(&kd);
      if (progress) progress(user, i + 1, n, c);
      continue;
    }
    c->report = cub.report;
    mg_cubin_free(&cub);
    c->verdict = mg_tune_prune(&c->report, c->threads, c->dyn_smem, l, &c->warps, c->reason,
                               sizeof c->reason)
                     ? MG_TUNE_PRUNED
                     : MG_TUNE_KEPT;
    if (progress) progress(user, i + 1, n, c);
  }
  return 0;
}

/* ---- timing helpers ----------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

double mg_tune_percentile(double *samples, int n, double q) {
  if (n <= 0) return 0;
  qsort(samples, (size_t)n, sizeof *samples, cmp_double);
  double pos = q / 100.0 * (n - 1);
  if (pos <= 0) return samples[0];
  if (pos >= n - 1) return samples[n - 1];
  int i = (int)pos;
  double f = pos - i;
  return samples[i] * (1 - f) + samples[i + 1] * f;
}

