/* kernel_host.c: see kernel_host.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ci.h"
#include "kernel_host.h"
#include "mg_config.h"
#include "mlagen.h"

double kh_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The build options of every test: tests/host, the test's compiler and CUDA headers. */
static mg_host_build_opts kh_build_opts(const mg_host_file *headers, int n_headers, int asan) {
  mg_host_build_opts bo;
  memset(&bo, 0, sizeof bo);
  bo.host_dir = MLAGEN_TESTS_DIR "/host";
  bo.cxx = MLAGEN_CXX;
  bo.cuda_include = MLAGEN_CUDA_INCLUDE;
  bo.headers = headers;
  bo.n_headers = n_headers;
  bo.asan = asan;
  return bo;
}

/* ---- the manifest ------------------------------------------------------------------------ */

static const cJSON *item(const cJSON *manifest, const char *kname, const char *obj,
                         const char *name) {
  const cJSON *o = cJSON_GetObjectItemCaseSensitive(manifest, obj);
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
  if (!v) fail_msg("%s: no %s.%s in the manifest", kname, obj, name);
  return v;
}

static long number(const cJSON *manifest, const char *kname, const char *obj, const char *name) {
  const cJSON *v = item(manifest, kname, obj, name);
  if (!cJSON_IsNumber(v)) fail_msg("%s: %s.%s is not a number", kname, obj, name);
  return (long)v->valuedouble;
}

int kh_config_int(const kh_kernel *bk, const char *name) {
  return (int)number(bk->manifest, bk->name, "config", name);
}

int kh_config_int_or(const kh_kernel *bk, const char *name, int dflt) {
  const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(bk->manifest, "config");
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, name);
  return cJSON_IsNumber(v) ? v->valueint : dflt;
}

long kh_launch_value(const kh_kernel *bk, const char *name) {
  return number(bk->manifest, bk->name, "launch", name);
}

const cJSON *kh_launch_item(const kh_kernel *bk, const char *name) {
  return item(bk->manifest, bk->name, "launch", name);
}

static void read_launch(kh_kernel *out) {
  const cJSON *launch = cJSON_GetObjectItemCaseSensitive(out->manifest, "launch");
  const cJSON *grid = cJSON_GetObjectItemCaseSensitive(launch, "grid");
  const cJSON *block = cJSON_GetObjectItemCaseSensitive(launch, "block");
  const cJSON *smem = cJSON_GetObjectItemCaseSensitive(launch, "smem");
  assert_int_equal(cJSON_GetArraySize(grid), 3);
  assert_true(cJSON_IsArray(block) && cJSON_IsNumber(cJSON_GetArrayItem(block, 0)));
  out->threads = (int)cJSON_GetArrayItem(block, 0)->valuedouble;
  out->smem = cJSON_IsNumber(smem) ? (size_t)smem->valuedouble : 0;
  for (int i = 0; i < 3; i++) {
    const cJSON *e = cJSON_GetArrayItem(grid, i);
    const cJSON *arg = cJSON_GetObjectItemCaseSensitive(e, "arg");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, "value");
    const cJSON *mul = cJSON_GetObjectItemCaseSensitive(e, "mul");
    const cJSON *div = cJSON_GetObjectItemCaseSensitive(e, "div");
    kh_grid_rule *r = &out->grid[i];
    if (!cJSON_IsString(arg))
      r->arg = KH_GRID_VALUE;
    else if (!strcmp(arg->valuestring, "batch"))
      r->arg = KH_GRID_BATCH;
    else if (!strcmp(arg->valuestring, "seqlen_q"))
      r->arg = KH_GRID_SEQLEN_Q;
    else if (!strcmp(arg->valuestring, "seqlen_k"))
      r->arg = KH_GRID_SEQLEN_K;
    else
      fail_msg("%s: grid[%d] has an unknown arg %s", out->name, i, arg->valuestring);
    r->value = cJSON_IsNumber(v) ? (long)v->valuedouble : 0;
    r->mul = cJSON_IsNumber(mul) ? (long)mul->valuedouble : 1;
    r->div = cJSON_IsNumber(div) ? (long)div->valuedouble : 1;
    if (!r->arg && !cJSON_IsNumber(v)) fail_msg("%s: grid[%d] has neither arg nor value", out->name, i);
  }
}

static unsigned grid_dim(const kh_grid_rule *r, long sq, long sk, long batch) {
  if (r->arg == KH_GRID_VALUE) return (unsigned)r->value;
  const long x = r->arg == KH_GRID_BATCH ? batch : r->arg == KH_GRID_SEQLEN_K ? sk : sq;
  return (unsigned)((x * r->mul + r->div - 1) / r->div);
}

mg_host_dim3 kh_grid(const kh_kernel *bk, long seqlen_q, long seqlen_k, long batch) {
  mg_host_dim3 g = {grid_dim(&bk->grid[0], seqlen_q, seqlen_k, batch),
                    grid_dim(&bk->grid[1], seqlen_q, seqlen_k, batch),
                    grid_dim(&bk->grid[2], seqlen_q, seqlen_k, batch)};
  return g;
}

double kh_launch(const kh_kernel *bk, mg_host_dim3 grid, const mg_host_launch_opts *lo,
                 void (*thunk)(void *), void *args) {
  mg_host_dim3 block = {(unsigned)bk->threads, 1, 1};
  mg_host_launch_opts o;
  if (lo)
    o = *lo;
  else
    memset(&o, 0, sizeof o);
  if (!o.arch) o.arch = KH_ARCH;
  char msg[1024];
  double t0 = kh_now();
  if (mg_host_kernel_launch(bk->k, grid, block, bk->smem, &o, thunk, args, msg, sizeof msg))
    fail_msg("%s: launch failed: %s", bk->name, msg);
  return kh_now() - t0;
}

/* ---- building ---------------------------------------------------------------------------- */

mg_kernel_spec kh_mqa_spec(const char *family, int H, int dc, int dr, int causal) {
  mg_kernel_spec s;
  memset(&s, 0, sizeof s);
  snprintf(s.family, sizeof s.family, "%s", family);
  s.heads = H, s.d_c = dc, s.d_r = dr, s.d_n = 128, s.d_v = 128, s.causal = causal;
  snprintf(s.dtype, sizeof s.dtype, "bf16");
  return s;
}

void kh_set(mg_kernel_spec *s, const char *assignment) {
  mg_diag d = MG_DIAG_INIT;
  if (mg_spec_set(s, assignment, &d)) fail_msg("%s", mg_diag_msg(&d));
}

void kh_setf(mg_kernel_spec *s, const char *fmt, ...) {
  char a[128];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(a, sizeof a, fmt, ap);
  va_end(ap);
  kh_set(s, a);
}

int kh_build_edited(mg_gen *g, const mg_kernel_spec *spec, int asan, kh_edit_fn edit,
                    void *ctx, kh_kernel *out) {
  mg_diag d = MG_DIAG_INIT;
  mg_gen *own = NULL;
  mg_kernel k;
  memset(out, 0, sizeof *out);
  if (!g) {
    assert_int_equal(mg_gen_open(&own, NULL, &d), 0);
    g = own;
  }
  if (mg_gen_kernel(g, spec, &k, &d)) fail_msg("%s", mg_diag_msg(&d));
  out->manifest = cJSON_Duplicate(k.manifest, 1);
  assert_non_null(out->manifest);
  snprintf(out->name, sizeof out->name, "%s", k.name);
  out->spec = *spec;
  read_launch(out);
  int built = 0;
  if (!edit || edit(k.source, ctx)) {
    int n_hdr;
    const mg_jit_header *hdr = mg_gen_headers(g, &n_hdr);
    mg_host_file files[8];
    assert_true(n_hdr <= 8);
    for (int i = 0; i < n_hdr; i++) {
      files[i].name = hdr[i].name;
      files[i].data = hdr[i].data;
      files[i].size = hdr[i].size;
    }
    mg_host_build_opts bo = kh_build_opts(files, n_hdr, asan);
    char msg[4096];
    double t0 = kh_now();
    if (mg_host_kernel_build(k.source, k.source_len, k.file, k.name, &bo, &out->k, msg, sizeof msg))
      fail_msg("host build: %s", msg);
    double secs = kh_now() - t0;
    out->fn = mg_host_kernel_fn(out->k);
    if (secs > 0.05)
      print_message("  built %s%s (%.1f s)\n", k.name, mg_host_kernel_asan(out->k) ? " with ASan" : "",
                    secs);
    assert_non_null(out->fn);
    built = 1;
  }
  mg_kernel_free(&k);
  if (own) mg_gen_close(own);
  if (!built) {
    cJSON_Delete(out->manifest);
    out->manifest = NULL;
  }
  return built;
}

void kh_build(mg_gen *g, const mg_kernel_spec *spec, int asan, kh_kernel *out) {
  kh_build_edited(g, spec, asan, NULL, NULL, out);
}

void kh_free(kh_kernel *bk) {
  if (bk->k) mg_host_kernel_free(bk->k);
  cJSON_Delete(bk->manifest);
  bk->k = NULL;
  bk->manifest = NULL;
}

/* The first barrier statement at or after p (*len its length, *warp 1 for __syncwarp), or
 * NULL. */
static char *next_barrier(char *p, size_t *len, int *warp) {
  static const char block[] = "__syncthreads();", wbar[] = "__syncwarp();";
  char *b = strstr(p, block), *w = strstr(p, wbar);
  *warp = w && (!b || w < b);
  *len = *warp ? sizeof wbar - 1 : sizeof block - 1;
  return *warp ? w : b;
}

int kh_drop_edit(char *src, void *ctx) {
  kh_drop *d = ctx;
  char *p = src;
  size_t len;
  int warp;
  for (int i = 0; (p = next_barrier(p, &len, &warp)); i++, p += len)
    if (i == d->which) {
      /* the previous non-blank line */
      const char *e = p;
      while (e > src && e[-1] != '\n') e--;
      const char *s = e > src ? e - 1 : e;
      while (s > src && s[-1] != '\n') s--;
      const char *w = strstr(s, "cp_async_wait<");
      d->after_wait = w != NULL && w < e;
      d->warp = warp;
      const char *rest = p + len, *eol = strchr(rest, '\n');
      snprintf(d->rest, sizeof d->rest, "%.*s", (int)(eol ? eol - rest : (long)strlen(rest)), rest);
      memset(p, ' ', len);
      return 1;
    }
  return 0;
}

/* ---- the NVRTC sweep ----------------------------------------------------------------------- */

void kh_sweep_open(kh_sweep *sw, int name_width, int flags) {
  memset(sw, 0, sizeof *sw);
  sw->d = (mg_diag)MG_DIAG_INIT;
  assert_int_equal(mg_gen_open(&sw->g, NULL, &sw->d), 0);
  sw->hdr = mg_gen_headers(sw->g, &sw->n_hdr);
  sw->name_width = name_width;
  sw->flags = flags;
  sw->t0 = kh_now();
}

int kh_sweep_compile(kh_sweep *sw, const mg_kernel_spec *s, const char *prefix) {
  mg_kernel k;
  int rc = mg_gen_kernel(sw->g, s, &k, &sw->d);
  if ((sw->flags & KH_SWEEP_REJECTS) && rc == MLAGEN_EINVAL &&
      strstr(mg_diag_msg(&sw->d), "rejected")) {
    if (!(sw->flags & KH_SWEEP_QUIET_REJECTS)) print_message("  rejected: %s\n", mg_diag_msg(&sw->d));
    sw->rejected++;
    return 0;
  }
  if (rc) fail_msg("%s", mg_diag_msg(&sw->d));
  long smem = 0;
  if (sw->flags & KH_SWEEP_SMEM) {
    const cJSON *launch = cJSON_GetObjectItemCaseSensitive(k.manifest, "launch");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(launch, "smem");
    if (!cJSON_IsNumber(v)) fail_msg("%s: launch.smem is not a number", k.name);
    smem = (long)v->valuedouble;
  }
  for (int arch = (sw->flags & KH_SWEEP_SM90_ONLY) ? 1 : 0; arch < 2; arch++) {
    mg_jit_opts o = {.arch = arch ? "sm_90a" : "sm_80", .headers = sw->hdr,
                     .n_headers = sw->n_hdr, .template_hash = mg_gen_template_hash(sw->g)};
    mg_cubin cb;
    if (mg_jit_compile(k.source, k.source_len, k.file, k.name, &o, &cb, &sw->d))
      fail_msg("%s", mg_diag_msg(&sw->d));
    char line[256], tail[64] = "";
    if (sw->flags & KH_SWEEP_SMEM) snprintf(tail, sizeof tail, " smem %ld (dynamic)", smem);
    snprintf(line, sizeof line, "  %s%-*s %-6s regs %3d spill %ld+%ld stack %ld%s\n", prefix,
             sw->name_width, k.name, o.arch, cb.report.registers, cb.report.spill_stores,
             cb.report.spill_loads, cb.report.stack_bytes, tail);
    print_message("%s", line);
    if (!strcmp(prefix, "default ") && strlen(sw->defaults) + strlen(line) < sizeof sw->defaults)
      strcat(sw->defaults, line);
    if ((sw->flags & KH_SWEEP_WGMMA_PIPELINED) && cb.report.wgmma_serialized) {
      const char *ser =
          cb.log ? strstr(cb.log, "wgmma.mma_async instructions are serialized") : NULL;
      fail_msg("%s (%s): ptxas serialized its wgmma (C%d%s): %.200s", k.name, o.arch,
               cb.report.wgmma_serialized, cb.report.cache_hit ? ", from the JIT cache entry" : "",
               ser ? ser : "");
    }
    assert_true(cb.report.registers > 0);
    assert_int_equal(cb.report.spill_stores + cb.report.spill_loads, 0);
    assert_int_equal(cb.report.stack_bytes, 0);
    assert_int_equal(cb.report.smem_bytes, 0); /* all of it dynamic */
    if (sw->max_smem > 0) assert_true(smem <= sw->max_smem);
    mg_cubin_free(&cb);
  }
  mg_kernel_free(&k);
  return 1;
}

int kh_sweep_exhaustive(void) {
  const char *e = getenv("MLAGEN_TEST_EXHAUSTIVE");
  return e && !strcmp(e, "1");
}

/* The factors of a sweep's covering sample besides the tunables: what a spec says of the
 * kernel (candidates of several families, shapes or dtypes may share one sweep). */
static const char *const spec_factors[] = {"family", "dtype", "heads", "d_n",
                                           "d_r",    "d_v",   "d_c",   "causal"};
enum { N_SPEC_FACTORS = sizeof spec_factors / sizeof spec_factors[0] };

static long str_value(const char *str) { /* FNV-1a */
  uint64_t h = 1469598103934665603ULL;
  for (; *str; str++) h = (h ^ (unsigned char)*str) * 1099511628211ULL;
  return (long)(h >> 1);
}

/* A candidate's value of factor name (a spec field, else a tunable), or LONG_MIN when it
 * does not set that tunable. */
static long cand_value(const mg_kernel_spec *s, const char *name) {
  const long fixed[N_SPEC_FACTORS] = {str_value(s->family), str_value(s->dtype), s->heads, s->d_n,
                                      s->d_r, s->d_v, s->d_c, s->causal};
  for (int f = 0; f < N_SPEC_FACTORS; f++)
    if (!strcmp(spec_factors[f], name)) return fixed[f];
  for (int j = 0; j < s->n_config; j++)
    if (!strcmp(s->config[j].name, name)) return s->config[j].value;
  return LONG_MIN;
}

int kh_sweep_cover(kh_sweep *sw, const mg_kernel_spec *cands, int n, uint64_t seed,
                   const char *prefix) {
  enum { MAX_F = N_SPEC_FACTORS + 2 * MG_SPEC_MAX_CONFIG };
  char names[MAX_F][32];
  int nf = 0;
  for (; nf < N_SPEC_FACTORS; nf++) snprintf(names[nf], sizeof names[0], "%s", spec_factors[nf]);
  for (int i = 0; i < n; i++)
    for (int j = 0; j < cands[i].n_config; j++) {
      int f = 0;
      while (f < nf && strcmp(names[f], cands[i].config[j].name)) f++;
      if (f == nf) {
        assert_true(nf < MAX_F);
        snprintf(names[nf++], sizeof names[0], "%s", cands[i].config[j].name);
      }
    }
  long *val = calloc((size_t)(n ? n : 1) * (nf ? nf : 1), sizeof *val);
  long *smem = calloc(n ? n : 1, sizeof *smem);
  int *order = calloc(n ? n : 1, sizeof *order), *state = calloc(n ? n : 1, sizeof *state);
  assert_non_null(val);
  assert_non_null(smem);
  assert_non_null(order);
  assert_non_null(state);
  int kept = 0;
  for (int i = 0; i < n; i++) { /* state: 0 rejected, 1 kept, 2 picked */
    mg_kernel k;
    const int rc = mg_gen_kernel(sw->g, &cands[i], &k, &sw->d);
    if (rc == MLAGEN_EINVAL && strstr(mg_diag_msg(&sw->d), "rejected")) {
      if (!(sw->flags & KH_SWEEP_REJECTS)) fail_msg("%s", mg_diag_msg(&sw->d));
      if (!(sw->flags & KH_SWEEP_QUIET_REJECTS)) print_message("  rejected: %s\n", mg_diag_msg(&sw->d));
      sw->rejected++;
      continue;
    }
    if (rc) fail_msg("%s", mg_diag_msg(&sw->d));
    const cJSON *launch = cJSON_GetObjectItemCaseSensitive(k.manifest, "launch");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(launch, "smem");
    smem[i] = cJSON_IsNumber(v) ? (long)v->valuedouble : 0;
    if (sw->max_smem > 0 && smem[i] > sw->max_smem)
      fail_msg("%s: launch.smem %ld exceeds %ld", k.name, smem[i], sw->max_smem);
    mg_kernel_free(&k);
    state[i] = 1;
    kept++;
    for (int f = 0; f < nf; f++) val[(size_t)i * nf + f] = cand_value(&cands[i], names[f]);
  }
  /* the tie-break order: a Fisher-Yates shuffle drawn from seed */
  uint64_t r = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  for (int i = 0; i < n; i++) order[i] = i;
  for (int i = n - 1; i > 0; i--) {
    r = r * 6364136223846793005ULL + 1442695040888963407ULL;
    const int j = (int)((r >> 33) % (uint64_t)(i + 1));
    const int t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  /* a pair (f, g) of candidate c is covered when a picked candidate has the same two
   * values; f == g stands for the single value */
  int picked = 0, best_smem = -1;
  for (int o = 0; o < n; o++)
    if (state[order[o]] && (best_smem < 0 || smem[order[o]] > smem[best_smem])) best_smem = order[o];
  const int all = kh_sweep_exhaustive();
  if (best_smem >= 0) state[best_smem] = 2, picked++;
  for (int i = 0; all && i < n; i++)
    if (state[i] == 1) state[i] = 2, picked++;
  for (;;) {
    int best = -1, best_gain = 0;
    for (int o = 0; o < n; o++) {
      const int c = order[o];
      if (state[c] != 1) continue;
      int gain = 0;
      for (int f = 0; f < nf; f++)
        for (int g = f; g < ((sw->flags & KH_SWEEP_SINGLES) ? f + 1 : nf); g++) {
          int covered = 0;
          for (int p = 0; p < n && !covered; p++)
            covered = state[p] == 2 && val[(size_t)p * nf + f] == val[(size_t)c * nf + f] &&
                      val[(size_t)p * nf + g] == val[(size_t)c * nf + g];
          gain += !covered;
        }
      if (gain > best_gain) best = c, best_gain = gain;
    }
    if (best < 0) break;
    state[best] = 2;
    picked++;
  }
  /* A list of one mask (the suites sweep their causal specs): every pick compiles with its
   * mask, and one of them, drawn from seed (the first pick in the shuffled order), with the
   * other mask too, for sm_90a (where the spills of one mask only were found); every kept
   * one with both, for both archs, under MLAGEN_TEST_EXHAUSTIVE=1 (ptxas allocates
   * registers per mask: a configuration may spill with one and not the other). */
  int one_mask = best_smem >= 0;
  for (int i = 0; i < n && one_mask; i++)
    one_mask = !state[i] || cands[i].causal == cands[best_smem].causal;
  int other_pick = -1;
  for (int o = 0; one_mask && o < n && other_pick < 0; o++)
    if (state[order[o]] == 2) other_pick = order[o];
  print_message("  %d of %d kept configurations compiled (%s%s, seed %llu)\n", picked, kept,
                all ? "MLAGEN_TEST_EXHAUSTIVE=1: all"
                : (sw->flags & KH_SWEEP_SINGLES)
                    ? "every value of the spec's fields and tunables, and the most shared memory;"
                      " MLAGEN_TEST_EXHAUSTIVE=1 compiles all"
                    : "every value and pair of values of the spec's fields and tunables, and the"
                      " most shared memory; MLAGEN_TEST_EXHAUSTIVE=1 compiles all",
                !one_mask ? "" : all ? "; each causal and not" : "; one drawn from the seed also with the other mask, for sm_90a",
                (unsigned long long)seed);
  const int rejected = sw->rejected;
  for (int i = 0; i < n; i++) {
    if (state[i] != 2) continue;
    assert_int_equal(kh_sweep_compile(sw, &cands[i], prefix), 1);
    mg_kernel_spec other = cands[i];
    other.causal = !other.causal;
    if (one_mask && (all || i == other_pick)) { /* by default for sm_90a only */
      const int flags = sw->flags;
      if (!all) sw->flags |= KH_SWEEP_SM90_ONLY;
      assert_int_equal(kh_sweep_compile(sw, &other, prefix), 1);
      sw->flags = flags;
    }
  }
  sw->rejected = rejected;
  free(val);
  free(smem);
  free(order);
  free(state);
  return kept;
}

void kh_sweep_print_defaults(const kh_sweep *sw) {
  for (const char *line = sw->defaults, *nl; *line; line = nl + 1) {
    nl = strchr(line, '\n');
    print_message("%.*s\n", (int)(nl - line), line);
  }
}

void kh_sweep_close(kh_sweep *sw) {
  mg_diag_clear(&sw->d);
  mg_gen_close(sw->g);
}

void kh_load_shape(const char *model, const char *json, mg_shape *shape) {
  mg_diag d = MG_DIAG_INIT;
  int rc = model ? mg_config_load(model, shape, &d)
                 : mg_config_parse(json, strlen(json), "json", shape, &d);
  if (rc) fail_msg("%s", mg_diag_msg(&d));
  mg_diag_clear(&d);
}

/* ---- ASan ------------------------------------------------------------------------------------ */

int kh_test_main(int argc, char **argv, void (*asan_case)(void **)) {
  const char *filter = getenv("MLAGEN_TEST_FILTER");
  if (filter && *filter) cmocka_set_test_filter(filter);
  if (argc == 2 && !strcmp(argv[1], "--asan-case")) {
    const struct CMUnitTest child[] = {{"asan_case", asan_case, NULL, NULL, NULL}};
    cmocka_set_test_filter(NULL);
    return cmocka_run_group_tests(child, NULL, NULL);
  }
  return -1;
}

int kh_skipped;

/* A tool an ASan check needs is missing: a failure in CI ($CI set), else a skip. */
static void asan_missing(const char *what) {
  if (mg_test_in_ci())
    fail_msg("CI is set and %s: the ASan check cannot run (install clang and its ASan runtime)",
             what);
  print_message("  SKIPPED: %s (the ASan check did not run; with CI set this fails)\n", what);
  kh_skipped = 1;
  skip();
}

int kh_exit_code(int cmocka_rc) { return cmocka_rc == 0 && kh_skipped ? 77 : cmocka_rc; }

void kh_run_asan_child(const char *argv0, uint64_t test_seed, void (*asan_case)(void **)) {
  mg_host_build_opts bo = kh_build_opts(NULL, 0, 1);
  char rt[1024];
  if (mg_host_process_has_asan()) {
    print_message("  this process has ASan: the case runs here\n");
    asan_case(NULL);
    return;
  }
  if (mg_host_asan_runtime(&bo, rt, sizeof rt)) {
    char what[1200];
    snprintf(what, sizeof what, "the ASan compiler %s has no ASan runtime", mg_host_asan_cxx(&bo));
    asan_missing(what);
    return;
  }
  if (!mg_host_asan_cxx_is_clang(&bo)) {
    char what[1200];
    snprintf(what, sizeof what,
             "the ASan compiler %s is not clang++ (no bounds on static shared memory)",
             mg_host_asan_cxx(&bo));
    asan_missing(what);
    return;
  }
  char seed[32], cache[1200];
  snprintf(seed, sizeof seed, "%llu", (unsigned long long)test_seed);
  /* The child builds into this process's cache directory (a temporary one is removed at
   * its exit even when ASan kills the child; $MG_HOST_CACHE_DIR is kept). */
  const char *root = mg_host_cache_dir();
  assert_non_null(root);
  snprintf(cache, sizeof cache, "%s/asan-child", root);
  int fd[2];
  assert_int_equal(pipe(fd), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(fd[1], 1);
    dup2(fd[1], 2);
    close(fd[0]);
    close(fd[1]);
    setenv("LD_PRELOAD", rt, 1);
    setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
    setenv("MLAGEN_TEST_SEED", seed, 1);
    setenv("MLAGEN_TEST_ASAN_CHILD", "1", 1); /* its noise report at exit (kernel_test_util.h) */
    setenv("MG_HOST_CACHE_DIR", cache, 1);
    setenv("MG_HOST_ASAN", "1", 1); /* every kernel the child builds is an ASan build */
    execl("/proc/self/exe", argv0, "--asan-case", (char *)NULL);
    _exit(127);
  }
  close(fd[1]);
  size_t cap = 1 << 16, len = 0;
  char *out = malloc(cap + 1);
  ssize_t r;
  while ((r = read(fd[0], out + len, cap - len)) > 0) {
    len += (size_t)r;
    if (len == cap) {
      out = realloc(out, 2 * cap + 1);
      cap *= 2;
    }
  }
  out[len] = '\0';
  close(fd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0 && !strstr(out, "AddressSanitizer");
  if (!ok) {
    /* fwrite, not print_message: cmocka cuts a message at 4 KiB, and an ASan report with
     * its stacks is longer (the report itself was lost) */
    fflush(stdout);
    fwrite(out, 1, len, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    fail_msg("the ASan child failed (status %d), its output is above", status);
  }
  for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n"))
    if (!strncmp(line, "noise ", 6)) print_message("  [asan] %s\n", line);
    else if (strstr(line, "rel err") || strstr(line, "err/bound") || strstr(line, "built "))
      print_message("  [asan] %s\n", line + 2);
  free(out);
}
