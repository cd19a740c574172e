/* mg_ktime.c: one generated kernel checked against its reference and timed with CUDA
 * events. See mg_ktime.h. */
#include "mg_ktime.h"

#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mg_driver.h"
#include "mg_dtype.h" /* mg_f32_to_bf16 ... */
#include "mg_sm90_tmap.h"
#include "mlagen.h"

void (*mg_ktime_output_hook)(const char *kernel, const char *param, void *host,
                             size_t bytes) = NULL;

#define MAX_COUNT (1LL << 40)

/* ---- the arguments: shapes and bench values from the kernel{} declaration ------------------ */

typedef struct sym {
  const char *name;
  long long v;
} sym;

typedef struct ev {
  const char *p;
  const sym *syms;
  int n_syms;
  int err;
} ev;

static void ev_space(ev *e) {
  while (*e->p == ' ' || *e->p == '\t') e->p++;
}

static long long ev_sum(ev *e);

static long long ev_atom(ev *e) {
  ev_space(e);
  if (*e->p == '(') {
    e->p++;
    long long v = ev_sum(e);
    ev_space(e);
    if (*e->p != ')') e->err = 1;
    else e->p++;
    return v;
  }
  if (isdigit((unsigned char)*e->p)) {
    long long v = 0;
    while (isdigit((unsigned char)*e->p) && v < MAX_COUNT) v = v * 10 + (*e->p++ - '0');
    return v;
  }
  if (isalpha((unsigned char)*e->p) || *e->p == '_') {
    const char *s = e->p;
    while (isalnum((unsigned char)*e->p) || *e->p == '_') e->p++;
    const size_t n = (size_t)(e->p - s);
    for (int i = 0; i < e->n_syms; i++)
      if (strlen(e->syms[i].name) == n && strncmp(e->syms[i].name, s, n) == 0) return e->syms[i].v;
  }
  e->err = 1;
  return 0;
}

static long long ev_prod(ev *e) {
  long long v = ev_atom(e);
  for (;;) {
    ev_space(e);
    const char op = *e->p;
    if (op != '*' && op != '/') return v;
    e->p++;
    long long w = ev_atom(e);
    if (op == '*') {
      if (w != 0 && (v > MAX_COUNT / (w < 0 ? -w : w) || v < -MAX_COUNT / (w < 0 ? -w : w))) {
        e->err = 1;
        return 0;
      }
      v *= w;
    } else {
      if (w == 0) {
        e->err = 1;
        return 0;
      }
      v /= w;
    }
  }
}

static long long ev_sum(ev *e) {
  long long v = ev_prod(e);
  for (;;) {
    ev_space(e);
    const char op = *e->p;
    if (op != '+' && op != '-') return v;
    e->p++;
    long long w = ev_prod(e);
    v = op == '+' ? v + w : v - w;
    if (v > MAX_COUNT || v < -MAX_COUNT) {
      e->err = 1;
      return 0;
    }
  }
}

/* Elements of shape "[d, d, ...]" (each d an expression); -1 when it does not parse. */
static long long shape_count(const char *shape, const sym *syms, int n_syms) {
  ev e = {shape, syms, n_syms, 0};
  ev_space(&e);
  if (*e.p != '[') return -1;
  e.p++;
  long long count = 1;
  for (;;) {
    long long dim = ev_sum(&e);
    if (e.err || dim < 0) return -1;
    if (dim != 0 && count > MAX_COUNT / dim) return -1;
    count *= dim;
    ev_space(&e);
    if (*e.p == ',') {
      e.p++;
      continue;
    }
    if (*e.p != ']') return -1;
    e.p++;
    ev_space(&e);
    return *e.p == '\0' || *e.p == ';' ? count : -1;
  }
}

/* The value of expression text (kernel{} params[i].bench) over syms; -1 when it does not
 * parse or is not in 0 .. 2^40. */
static long long expr_value(const char *text, const sym *syms, int n_syms) {
  ev e = {text, syms, n_syms, 0};
  long long v = ev_sum(&e);
  ev_space(&e);
  return e.err || *e.p != '\0' || v < 0 || v > MAX_COUNT ? -1 : v;
}

/* The benchmark's conventions for the int arguments a kernel does not declare a bench
 * value for: the run-time sizes the attention kernels share. */
static const char *bench_default(const char *name) {
  static const char *const conv[][2] = {{"seqlen_q", "S"}, {"seqlen_k", "S"}, {"rows", "S"},
                                        {"batch", "B"},    {"q_pos0", "0"},   {"q_split", "0"},
                                        {"q_pos1", "0"},   {"accumulate", "0"}};
  for (size_t i = 0; i < sizeof conv / sizeof conv[0]; i++)
    if (strcmp(name, conv[i][0]) == 0) return conv[i][1];
  return NULL;
}

int mg_ktime_args(const mg_kernel_info *k, const mg_kernel_spec *s, long long seq, mg_kargs *out,
                  mg_diag *d) {
  if (!k || !s || !out || seq < 1)
    return mg_diag_set(d, MLAGEN_EINVAL, "mg_ktime_args: kernel, spec or out NULL, or seq < 1");
  memset(out, 0, sizeof *out);
  const char *kname = k->name;
  /* the shape names; every int argument joins them by name once it has its value */
  sym syms[MG_KTIME_MAX_PARAMS + 16];
  int ns = 0;
  syms[ns++] = (sym){"B", 1};
  syms[ns++] = (sym){"S_q", seq};
  syms[ns++] = (sym){"S_k", seq};
  syms[ns++] = (sym){"S", seq};
  syms[ns++] = (sym){"P", MG_KTIME_SP(seq)};
  syms[ns++] = (sym){"H", s->heads};
  syms[ns++] = (sym){"d_n", s->d_n};
  syms[ns++] = (sym){"d_r", s->d_r};
  syms[ns++] = (sym){"d_v", s->d_v};
  syms[ns++] = (sym){"d_c", s->d_c};
  /* pass 1: kinds, integer values */
  for (int i = 0; i < k->n_params; i++) {
    const mg_kernel_param *p = &k->params[i];
    mg_karg *a = &out->a[out->n++];
    snprintf(a->name, sizeof a->name, "%s", p->name);
    if (p->kind == MG_PARAM_IN || p->kind == MG_PARAM_OUT) {
      a->kind = p->kind == MG_PARAM_IN ? MG_KARG_IN : MG_KARG_OUT;
      a->is_f32 = p->is_f32;
      a->elem_bytes = a->is_f32 ? 4 : 2;
    } else if (p->kind == MG_PARAM_INT) {
      a->kind = MG_KARG_INT;
      const char *text = p->bench[0] ? p->bench : bench_default(p->name);
      if (!text)
        return mg_diag_set(d, MLAGEN_EINVAL, "%s: no value for int parameter '%s' (declare its "
                           "bench value in the %s template's kernel{} params)", kname, a->name,
                           k->family);
      const long long v = expr_value(text, syms, ns);
      if (v < 0 || v > 2147483647LL)
        return mg_diag_set(d, MLAGEN_EINVAL, "%s: int parameter %s: bench value '%s' does not "
                           "evaluate to an int >= 0", kname, a->name, text);
      a->ival = (int)v;
      syms[ns++] = (sym){p->name, v};
    } else if (p->kind == MG_PARAM_TMAPS) {
      a->kind = MG_KARG_TMAPS; /* made per launch from the buffers (build_args) */
    } else {
      a->kind = MG_KARG_FLOAT;
      if (strcmp(a->name, "softmax_scale") != 0)
        return mg_diag_set(d, MLAGEN_EINVAL, "%s: no value for float parameter '%s'", kname, a->name);
      a->fval = (float)(1.0 / sqrt((double)(s->d_n + s->d_r)));
    }
  }
  /* pass 2: pointer sizes from the shapes */
  int direction = 0;
  long long seqlen_q = seq;
  for (int i = 0; i < out->n; i++) {
    if (out->a[i].kind != MG_KARG_INT) continue;
    if (strcmp(out->a[i].name, "direction") == 0) direction = out->a[i].ival;
    if (strcmp(out->a[i].name, "seqlen_q") == 0 || strcmp(out->a[i].name, "seqlen_local") == 0)
      seqlen_q = out->a[i].ival; /* the grid's seqlen_q: the a2a kernels launch S_l as it */
  }
  for (int i = 0; i < out->n; i++) {
    mg_karg *a = &out->a[i];
    if (a->kind != MG_KARG_IN && a->kind != MG_KARG_OUT) continue;
    const char *shape = k->params[i].shape;
    if (strcmp(shape, "unused") == 0) {
      a->kind = MG_KARG_NULL;
      continue;
    }
    char part[256];
    const char *dir = strstr(shape, "direction ");
    if (dir) { /* "direction 0: [...]; direction 1: [...]" */
      char tag[32];
      snprintf(tag, sizeof tag, "direction %d:", direction);
      const char *at = strstr(shape, tag);
      if (!at) {
        return mg_diag_set(d, MLAGEN_EINVAL, "%s: parameter %s: shape '%s' has no '%s'", kname,
                           a->name, shape, tag);
      }
      snprintf(part, sizeof part, "%s", at + strlen(tag));
      char *semi = strchr(part, ';');
      if (semi) *semi = '\0';
      shape = part;
    }
    long long n = shape_count(shape, syms, ns);
    if (n < 1)
      return mg_diag_set(d, MLAGEN_EINVAL, "%s: parameter %s: cannot size shape '%s' (an unknown "
                         "symbol, or not 1 .. 2^40 elements)", kname, a->name, shape);
    a->count = (size_t)n;
  }
  out->dims.batch = 1;
  out->dims.seqlen_q = (long)seqlen_q;
  out->dims.seqlen_k = (long)seq;
  return 0;
}

void mg_ktime_reference_spec(const mg_kernel_spec *cand, const mg_kernel_info *k,
                             mg_kernel_spec *ref) {
  *ref = *cand;
  ref->n_config = 0;
  memset(ref->config, 0, sizeof ref->config);
  for (int i = 0; i < cand->n_config; i++)
    if (mg_kernel_is_interface(k, cand->config[i].name) && ref->n_config < MG_SPEC_MAX_CONFIG)
      ref->config[ref->n_config++] = cand->config[i];
}

/* ---- the device: device 0's primary context, kept for the process ---------------------- */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  int have;
  CUdevice dev;
  CUcontext ctx;
  char poisoned[400]; /* non-empty: a kernel faulted, the context is unusable */
} g;

static int device_ctx(const mg_driver *drv, mg_diag *d) {
  int rc = 0;
  pthread_mutex_lock(&g_mu);
  if (g.poisoned[0]) {
    rc = mg_diag_set(d, MG_EDRIVER, "the CUDA context is unusable after %s; rerun the sweep "
                     "without it", g.poisoned);
  } else if (!g.have) {
    CUresult r = drv->cuDeviceGet(&g.dev, 0);
    if (r != CUDA_SUCCESS) rc = mg_driver_fail(drv, r, "cuDeviceGet(0)", d);
    else if ((r = drv->cuDevicePrimaryCtxRetain(&g.ctx, g.dev)) != CUDA_SUCCESS)
      rc = mg_driver_fail(drv, r, "cuDevicePrimaryCtxRetain", d);
    else g.have = 1;
  }
  if (!rc) {
    CUresult r = drv->cuCtxSetCurrent(g.ctx);
    if (r != CUDA_SUCCESS) rc = mg_driver_fail(drv, r, "cuCtxSetCurrent", d);
  }
  pthread_mutex_unlock(&g_mu);
  return rc;
}

int mg_ktime_describe(mg_tune_device *dev, mg_diag *d) {
  if (!dev) return mg_diag_set(d, MLAGEN_EINVAL, "mg_ktime_describe: dev is NULL");
  memset(dev, 0, sizeof *dev);
  const mg_driver *drv = NULL;
  int rc = mg_driver_get(&drv, d);
  if (rc) return rc;
  CUdevice cd;
  CUresult r = drv->cuDeviceGet(&cd, 0);
  if (r != CUDA_SUCCESS) return mg_driver_fail(drv, r, "cuDeviceGet(0)", d);
  if ((r = drv->cuDeviceGetName(dev->name, (int)sizeof dev->name, cd)) != CUDA_SUCCESS)
    return mg_driver_fail(drv, r, "cuDeviceGetName", d);
  if ((r = drv->cuDeviceGetAttribute(&dev->sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                                     cd)) != CUDA_SUCCESS)
    return mg_driver_fail(drv, r, "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)", d);
  dev->driver_version = drv->driver_version;
  return 0;
}

/* ---- one run ------------------------------------------------------------------------------ */

typedef struct run {
  const mg_driver *drv;
  mg_module_registry *reg;
  CUstream stream;
  CUevent *ev;
  int n_ev;
  CUdeviceptr buf[MG_KTIME_MAX_SETS][MG_KTIME_MAX_PARAMS];
  CUdeviceptr flush;
  void *got[MG_KTIME_MAX_PARAMS], *ref[MG_KTIME_MAX_PARAMS];
} run;

/* Releases everything of r; returns the first driver failure (0 if none) into d when
 * status is still 0. */
static int run_free(run *r, int status, mg_diag *d) {
  const mg_driver *drv = r->drv;
  int rc = status;
  CUresult cr;
  /* wait for the stream before freeing what it uses (its error, if any, is reported) */
  if (r->stream && (cr = drv->cuStreamSynchronize(r->stream)) != CUDA_SUCCESS && !rc)
    rc = mg_driver_fail(drv, cr, "cuStreamSynchronize (release)", d);
  for (int i = 0; i < r->n_ev; i++)
    if ((cr = drv->cuEventDestroy(r->ev[i])) != CUDA_SUCCESS && !rc)
      rc = mg_driver_fail(drv, cr, "cuEventDestroy", d);
  free(r->ev);
  for (int s = 0; s < MG_KTIME_MAX_SETS; s++)
    for (int i = 0; i < MG_KTIME_MAX_PARAMS; i++)
      if (r->buf[s][i] && (cr = drv->cuMemFree(r->buf[s][i])) != CUDA_SUCCESS && !rc)
        rc = mg_driver_fail(drv, cr, "cuMemFree", d);
  if (r->flush && (cr = drv->cuMemFree(r->flush)) != CUDA_SUCCESS && !rc)
    rc = mg_driver_fail(drv, cr, "cuMemFree (L2 flush buffer)", d);
  if (r->stream && (cr = drv->cuStreamDestroy(r->stream)) != CUDA_SUCCESS && !rc)
    rc = mg_driver_fail(drv, cr, "cuStreamDestroy", d);
  mg_diag rd = MG_DIAG_INIT;
  int rr = mg_registry_destroy(r->reg, &rd);
  if (rr && !rc) rc = mg_diag_set(d, rr, "%s", mg_diag_msg(&rd));
  mg_diag_clear(&rd);
  for (int i = 0; i < MG_KTIME_MAX_PARAMS; i++) free(r->got[i]), free(r->ref[i]);
  memset(r, 0, sizeof *r);
  return rc;
}

static uint64_t rng_next(uint64_t *x) { /* xorshift64* */
  *x ^= *x >> 12;
  *x ^= *x << 25;
  *x ^= *x >> 27;
  return *x * 2685821657736338717ULL;
}

/* Random values for input a of set `set` into host (a.count elements): uniform in
 * [-1, 1); an "lse" input log(seq) plus noise (the scores' logsumexp is about that). */
static void fill_host(const mg_karg *a, int set, int param, const char *dtype, long long seq,
                      void *host) {
  uint64_t x = 0x9E3779B97F4A7C15ULL ^ ((uint64_t)(set + 1) << 32) ^ (uint64_t)(param + 1) * 7919;
  const double base = strcmp(a->name, "lse") == 0 ? log((double)seq) : 0;
  const int f16 = mg_dtype_of_spec(dtype) == MG_F16;
  for (size_t i = 0; i < a->count; i++) {
    const float v = (float)(base + ((double)(rng_next(&x) >> 11) * 0x1.0p-53 * 2.0 - 1.0));
    if (a->is_f32) ((float *)host)[i] = v;
    else ((uint16_t *)host)[i] = f16 ? mg_f32_to_f16(v) : mg_f32_to_bf16(v);
  }
}

static double elem_at(const mg_karg *a, const char *dtype, const void *p, size_t i) {
  if (a->is_f32) return ((const float *)p)[i];
  const uint16_t h = ((const uint16_t *)p)[i];
  return mg_dtype_of_spec(dtype) == MG_F16 ? mg_f16_to_f32(h) : mg_bf16_to_f32(h);
}

/* The kernel parameters of kernel k (spec s) for set `set` into argv (values in the storage
 * arrays; an sm_90a family's tensor maps encoded into maps over the set's buffers, as the
 * CUDA executor encodes them). Returns 0, or mg_sm90_launch_tmaps' status. */
static int build_args(const run *r, const mg_kernel_info *k, const mg_kernel_spec *s,
                      const mg_kargs *ka, int set, CUdeviceptr *pv, int *iv, float *fv,
                      CUtensorMap *maps, void **argv, mg_diag *d) {
  int tmaps = 0;
  for (int i = 0; i < ka->n; i++) {
    const mg_karg *a = &ka->a[i];
    switch (a->kind) {
      case MG_KARG_INT: iv[i] = a->ival, argv[i] = &iv[i]; break;
      case MG_KARG_FLOAT: fv[i] = a->fval, argv[i] = &fv[i]; break;
      case MG_KARG_NULL: pv[i] = 0, argv[i] = &pv[i]; break;
      case MG_KARG_TMAPS: argv[i] = maps, tmaps = 1; break;
      default: pv[i] = r->buf[set][i], argv[i] = &pv[i]; break;
    }
  }
  int n = 0;
  return tmaps ? mg_sm90_launch_tmaps(r->drv, s, k, argv, &ka->dims, maps, MG_SM90_MAX_TMAPS, &n, d)
               : 0;
}

/* Zeroes the outputs of set 0 on the stream. */
static int zero_outputs(run *r, const mg_kargs *ka, mg_diag *d) {
  for (int i = 0; i < ka->n; i++)
    if (ka->a[i].kind == MG_KARG_OUT) {
      CUresult cr = r->drv->cuMemsetD8Async(r->buf[0][i], 0, ka->a[i].count * ka->a[i].elem_bytes,
                                            r->stream);
      if (cr != CUDA_SUCCESS) return mg_driver_fail(r->drv, cr, "cuMemsetD8Async (outputs)", d);
    }
  return 0;
}

/* After a launch: the stream's completion. An error here is the kernel's own (it faulted):
 * the context is then unusable, recorded for the later calls. */
static void poison(const run *r, const char *kernel, CUresult cr) {
  char words[300];
  mg_diag t = MG_DIAG_INIT;
  mg_driver_check(r->drv, cr, MG_EDRIVER, kernel, &t);
  snprintf(words, sizeof words, "%s", mg_diag_msg(&t));
  mg_diag_clear(&t);
  pthread_mutex_lock(&g_mu);
  snprintf(g.poisoned, sizeof g.poisoned, "a fault in %s", words);
  pthread_mutex_unlock(&g_mu);
}

static CUresult sync_after(run *r, const char *kernel) {
  CUresult cr = r->drv->cuStreamSynchronize(r->stream);
  if (cr != CUDA_SUCCESS) poison(r, kernel, cr);
  return cr;
}

static int is_poisoned(void) {
  pthread_mutex_lock(&g_mu);
  const int p = g.poisoned[0] != 0;
  pthread_mutex_unlock(&g_mu);
  return p;
}

/* Releases r after the candidate failed (its verdict is set): 0, unless releasing fails on
 * a context that is still usable. After a fault the release's own failures are expected
 * and not reported (the next call reports the unusable context). */
static int run_free_failed(run *r, mg_diag *d) {
  if (!is_poisoned()) return run_free(r, 0, d);
  mg_diag sink = MG_DIAG_INIT;
  run_free(r, 0, &sink);
  mg_diag_clear(&sink);
  return 0;
}

/* Copies the outputs of set 0 into host[] (allocated here). */
static int download(run *r, const mg_kargs *ka, void **host, mg_diag *d) {
  for (int i = 0; i < ka->n; i++) {
    const mg_karg *a = &ka->a[i];
    if (a->kind != MG_KARG_OUT) continue;
    const size_t bytes = a->count * a->elem_bytes;
    if (!host[i] && !(host[i] = malloc(bytes)))
      return mg_diag_set(d, MLAGEN_ENOMEM, "out of host memory (%zu bytes)", bytes);
    CUresult cr = r->drv->cuMemcpyDtoH(host[i], r->buf[0][i], bytes);
    if (cr != CUDA_SUCCESS) return mg_driver_fail(r->drv, cr, "cuMemcpyDtoH (outputs)", d);
  }
  return 0;
}

static void set_verdict(mg_ktime_result *res, int verdict, const char *msg) {
  res->verdict = verdict;
  size_t n = msg ? strlen(msg) : 0; /* truncated to fit */
  if (n >= sizeof res->reason) n = sizeof res->reason - 1;
  if (n) memcpy(res->reason, msg, n);
  res->reason[n] = '\0';
}

/* Loads and launches kernel k once on set 0 with zeroed outputs, synchronizes and copies the
 * outputs into host. Returns 0, or a status with d set; *launch_failed says the failure
 * was the kernel's own (load, launch, execution) rather than the harness's. */
static int run_once(run *r, const mg_kernel *k, const mg_cubin *c, const mg_kernel_spec *s,
                    const mg_kargs *ka, void **host, int *launch_failed, mg_diag *d) {
  *launch_failed = 0;
  const mg_module_kernel *mk = NULL;
  int rc = mg_registry_load_kernel(r->reg, &k->info, c->data, c->size, &mk, d);
  if (rc) {
    *launch_failed = rc != MLAGEN_ENOMEM;
    return rc;
  }
  if ((rc = zero_outputs(r, ka, d))) return rc;
  CUdeviceptr pv[MG_KTIME_MAX_PARAMS];
  int iv[MG_KTIME_MAX_PARAMS];
  float fv[MG_KTIME_MAX_PARAMS];
  void *argv[MG_KTIME_MAX_PARAMS];
  CUtensorMap maps[MG_SM90_MAX_TMAPS];
  if ((rc = build_args(r, &k->info, s, ka, 0, pv, iv, fv, maps, argv, d))) {
    *launch_failed = rc != MLAGEN_ENOMEM; /* maps the driver refuses: the candidate's */
    return rc;
  }
  if ((rc = mg_registry_launch(r->reg, mk, &ka->dims, r->stream, argv, d))) {
    *launch_failed = rc != MLAGEN_ENOMEM;
    return rc;
  }
  CUresult cr = sync_after(r, k->name);
  if (cr != CUDA_SUCCESS) {
    *launch_failed = 1;
    char what[300];
    snprintf(what, sizeof what, "%s: execution (cuStreamSynchronize)", k->name);
    return mg_driver_fail(r->drv, cr, what, d);
  }
  return download(r, ka, host, d);
}

/* Compares the candidate's outputs with the reference's, on two bounds (docs/tuning.md):
 *   max |a - b| / max |b| < MG_KTIME_TOL (max |a - b| when b is all zero): an error of 1% of
 *     the output's largest element anywhere, so a configuration off by a little everywhere
 *     fails;
 *   |a_i - b_i| / (rms(b) + |b_i|) < MG_KTIME_ELEM_TOL for every element (|a_i - b_i| when b
 *     is all zero): one row or tile off by a tenth of its own size (or of the output's rms,
 *     near 0) fails, where the first bound cannot see it (an attention output's short rows
 *     are small beside its largest element).
 * Nothing non-finite where the reference is finite (both NaN, or the same infinity, agree).
 * 0 when they agree, else writes the reason. *worst gets the largest per-element error
 * (INFINITY for a non-finite difference). */
static int compare(const mg_kargs *ka, const char *dtype, void **got, void **ref, double *worst,
                   char *why, size_t n) {
  *worst = 0;
  for (int i = 0; i < ka->n; i++) {
    const mg_karg *a = &ka->a[i];
    if (a->kind != MG_KARG_OUT) continue;
    double ss = 0, me = 0, mr = 0;
    size_t nonfinite = 0, m = 0;
    for (size_t j = 0; j < a->count; j++) {
      const double x = elem_at(a, dtype, got[i], j), y = elem_at(a, dtype, ref[i], j);
      if (!isfinite(y)) {
        if (!(x == y || (isnan(x) && isnan(y)))) nonfinite++;
        continue;
      }
      if (!isfinite(x)) {
        nonfinite++;
        continue;
      }
      ss += y * y, m++;
      if (fabs(y) > mr) mr = fabs(y);
      if (fabs(x - y) > me) me = fabs(x - y);
    }
    if (nonfinite) {
      snprintf(why, n, "output %s: %zu NaN/inf values where the reference's are finite or differ",
               a->name, nonfinite);
      *worst = INFINITY;
      return 1;
    }
    const double rms = m ? sqrt(ss / (double)m) : 0, global = mr > 0 ? me / mr : me;
    double err = 0;
    size_t at = 0;
    for (size_t j = 0; j < a->count; j++) {
      const double x = elem_at(a, dtype, got[i], j), y = elem_at(a, dtype, ref[i], j);
      if (!isfinite(y)) continue;
      const double scale = rms + fabs(y), e = scale > 0 ? fabs(x - y) / scale : fabs(x - y);
      if (e > err) err = e, at = j;
    }
    if (err > *worst) *worst = err;
    if (!(global < MG_KTIME_TOL)) {
      snprintf(why, n, "output %s: max |a - b| / max |b| = %.3g, not under %g", a->name, global,
               MG_KTIME_TOL);
      return 1;
    }
    if (!(err < MG_KTIME_ELEM_TOL)) {
      snprintf(why, n,
               "output %s[%zu]: |a - b| / (rms(b) + |b|) = %.3g, not under %g (a %.6g, b %.6g, "
               "rms(b) %.3g)",
               a->name, at, err, MG_KTIME_ELEM_TOL, elem_at(a, dtype, got[i], at),
               elem_at(a, dtype, ref[i], at), rms);
      return 1;
    }
  }
  return 0;
}

static int same_params(const mg_kargs *a, const mg_kargs *b) {
  if (a->n != b->n) return 0;
  for (int i = 0; i < a->n; i++)
    if (strcmp(a->a[i].name, b->a[i].name) != 0 || a->a[i].kind != b->a[i].kind ||
        a->a[i].count != b->a[i].count || a->a[i].is_f32 != b->a[i].is_f32 ||
        a->a[i].ival != b->a[i].ival)
      return 0;
  return a->dims.seqlen_q == b->dims.seqlen_q && a->dims.seqlen_k == b->dims.seqlen_k;
}

int mg_ktime_run(const mg_kernel *k, const mg_cubin *c, const mg_kernel *ref_k,
                 const mg_cubin *ref_c, const mg_kernel_spec *s, long long seq, int n_samples,
                 double *samples_ms, mg_ktime_result *res, mg_diag *d) {
  if (!k || !c || !s || !samples_ms || !res || n_samples < 1 || n_samples > 4096 ||
      (!ref_k) != (!ref_c) || seq < 1)
    return mg_diag_set(d, MLAGEN_EINVAL, "mg_ktime_run: a NULL argument, ref_k without ref_c, "
                       "seq < 1 or n_samples not in 1 .. 4096");
  memset(res, 0, sizeof *res);
  if (!c->data || c->size == 0)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: empty cubin", k->name);
  mg_kargs ka, kr;
  mg_kernel_spec rs;
  int rc = mg_ktime_args(&k->info, s, seq, &ka, d);
  if (rc) return rc;
  if (ref_k) {
    mg_ktime_reference_spec(s, &k->info, &rs);
    if ((rc = mg_ktime_args(&ref_k->info, &rs, seq, &kr, d))) return rc;
    if (!same_params(&ka, &kr))
      return mg_diag_set(d, MLAGEN_EINVAL, "%s: its parameters differ from the reference %s's "
                         "(a tunable that changes the interface is missing from "
                         "its template's kernel{} interface)", k->name, ref_k->name);
  }
  const mg_driver *drv = NULL;
  if ((rc = mg_driver_get(&drv, d))) return rc;
  if ((rc = device_ctx(drv, d))) return rc;

  run r;
  memset(&r, 0, sizeof r);
  r.drv = drv;
  CUresult cr;
  if ((rc = mg_registry_create(&r.reg, d))) return rc;
  if ((cr = drv->cuStreamCreate(&r.stream, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS) {
    r.stream = NULL;
    return run_free(&r, mg_driver_fail(drv, cr, "cuStreamCreate", d), d);
  }
  /* sizes: one set, the flush buffer, how many sets fit */
  size_t set_bytes = 0;
  for (int i = 0; i < ka.n; i++)
    if (ka.a[i].kind == MG_KARG_IN || ka.a[i].kind == MG_KARG_OUT)
      set_bytes += ka.a[i].count * ka.a[i].elem_bytes;
  int l2 = 0;
  if ((cr = drv->cuDeviceGetAttribute(&l2, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, g.dev)) != CUDA_SUCCESS)
    return run_free(&r, mg_driver_fail(drv, cr, "cuDeviceGetAttribute(L2_CACHE_SIZE)", d), d);
  const size_t flush_bytes = l2 > 0 ? 2 * (size_t)l2 : 0;
  size_t free_b = 0, total_b = 0;
  if ((cr = drv->cuMemGetInfo(&free_b, &total_b)) != CUDA_SUCCESS)
    return run_free(&r, mg_driver_fail(drv, cr, "cuMemGetInfo", d), d);
  int n_sets = MG_KTIME_MAX_SETS;
  while (n_sets > 1 && (double)n_sets * set_bytes + flush_bytes > 0.8 * (double)free_b) n_sets--;
  if ((double)set_bytes + flush_bytes > 0.9 * (double)free_b)
    return run_free(&r, mg_diag_set(d, MLAGEN_ENOMEM, "%s at seq %lld: one buffer set is %zu "
                                    "bytes, the device has %zu free", k->name, seq, set_bytes,
                                    free_b), d);
  res->n_sets = n_sets, res->set_bytes = set_bytes, res->flush_bytes = flush_bytes;
  /* buffers: inputs random (copied once), outputs zeroed */
  size_t max_bytes = 0;
  for (int i = 0; i < ka.n; i++)
    if (ka.a[i].kind == MG_KARG_IN && ka.a[i].count * ka.a[i].elem_bytes > max_bytes)
      max_bytes = ka.a[i].count * ka.a[i].elem_bytes;
  void *host = max_bytes ? malloc(max_bytes) : NULL;
  if (max_bytes && !host)
    return run_free(&r, mg_diag_set(d, MLAGEN_ENOMEM, "out of host memory (%zu bytes)", max_bytes), d);
  for (int st = 0; st < n_sets && !rc; st++)
    for (int i = 0; i < ka.n && !rc; i++) {
      const mg_karg *a = &ka.a[i];
      if (a->kind != MG_KARG_IN && a->kind != MG_KARG_OUT) continue;
      const size_t bytes = a->count * a->elem_bytes;
      if ((cr = drv->cuMemAlloc(&r.buf[st][i], bytes)) != CUDA_SUCCESS) {
        r.buf[st][i] = 0;
        rc = mg_driver_fail(drv, cr, "cuMemAlloc", d);
      } else if (a->kind == MG_KARG_IN) {
        fill_host(a, st, i, s->dtype, seq, host);
        if ((cr = drv->cuMemcpyHtoD(r.buf[st][i], host, bytes)) != CUDA_SUCCESS)
          rc = mg_driver_fail(drv, cr, "cuMemcpyHtoD (inputs)", d);
      } else if ((cr = drv->cuMemsetD8Async(r.buf[st][i], 0, bytes, r.stream)) != CUDA_SUCCESS) {
        rc = mg_driver_fail(drv, cr, "cuMemsetD8Async (outputs)", d);
      }
    }
  free(host);
  if (!rc && flush_bytes) {
    if ((cr = drv->cuMemAlloc(&r.flush, flush_bytes)) != CUDA_SUCCESS) {
      r.flush = 0;
      rc = mg_driver_fail(drv, cr, "cuMemAlloc (L2 flush buffer)", d);
    }
  }
  /* the legacy-stream copies before anything runs on the non-blocking stream */
  if (!rc && (cr = drv->cuCtxSynchronize()) != CUDA_SUCCESS)
    rc = mg_driver_fail(drv, cr, "cuCtxSynchronize (after the uploads)", d);
  if (rc) return run_free(&r, rc, d);

  /* the check: the candidate, then the reference, on set 0 */
  int failed = 0;
  mg_diag kd = MG_DIAG_INIT;
  rc = run_once(&r, k, c, s, &ka, r.got, &failed, &kd);
  if (rc && failed) {
    set_verdict(res, MG_TUNE_FAILED_LAUNCH, mg_diag_msg(&kd));
    mg_diag_clear(&kd);
    return run_free_failed(&r, d);
  }
  if (rc) {
    rc = mg_diag_set(d, rc, "%s", mg_diag_msg(&kd));
    mg_diag_clear(&kd);
    return run_free(&r, rc, d);
  }
  for (int i = 0; i < ka.n && mg_ktime_output_hook; i++)
    if (ka.a[i].kind == MG_KARG_OUT)
      mg_ktime_output_hook(k->name, ka.a[i].name, r.got[i], ka.a[i].count * ka.a[i].elem_bytes);
  if (ref_k && strcmp(ref_k->name, k->name) != 0) { /* the same kernel agrees with itself */
    if ((rc = run_once(&r, ref_k, ref_c, &rs, &kr, r.ref, &failed, &kd))) {
      rc = mg_diag_set(d, rc == MLAGEN_ENOMEM ? rc : MG_EDRIVER, "the reference %s for %s: %s",
                       ref_k->name, k->name, mg_diag_msg(&kd));
      mg_diag_clear(&kd);
      return run_free(&r, rc, d);
    }
    for (int i = 0; i < ka.n && mg_ktime_output_hook; i++)
      if (ka.a[i].kind == MG_KARG_OUT)
        mg_ktime_output_hook(ref_k->name, ka.a[i].name, r.ref[i],
                             ka.a[i].count * ka.a[i].elem_bytes);
    char why[240];
    if (compare(&ka, s->dtype, r.got, r.ref, &res->max_rel_err, why, sizeof why)) {
      char msg[256 + 160];
      snprintf(msg, sizeof msg, "%s (reference %s)", why, ref_k->name);
      set_verdict(res, MG_TUNE_WRONG_RESULT, msg);
      return run_free(&r, 0, d);
    }
  }

  /* timing: warm-up, then n_samples launches between events, L2 flushed between them */
  const mg_module_kernel *mk = NULL;
  if ((rc = mg_registry_find(r.reg, k->name, &mk, d))) return run_free(&r, rc, d);
  if (!(r.ev = calloc((size_t)n_samples * 2, sizeof *r.ev)))
    return run_free(&r, mg_diag_set(d, MLAGEN_ENOMEM, "out of host memory"), d);
  for (int i = 0; i < 2 * n_samples; i++) {
    if ((cr = drv->cuEventCreate(&r.ev[i], CU_EVENT_DEFAULT)) != CUDA_SUCCESS)
      return run_free(&r, mg_driver_fail(drv, cr, "cuEventCreate", d), d);
    r.n_ev++;
  }
  CUdeviceptr pv[MG_KTIME_MAX_PARAMS];
  int iv[MG_KTIME_MAX_PARAMS];
  float fv[MG_KTIME_MAX_PARAMS];
  void *argv[MG_KTIME_MAX_PARAMS];
  CUtensorMap maps[MG_SM90_MAX_TMAPS]; /* by value: the launch copies them */
  for (int i = 0; i < MG_KTIME_WARMUP + n_samples; i++) {
    const int t = i - MG_KTIME_WARMUP; /* the sample, < 0 during the warm-up */
    if ((rc = build_args(&r, &k->info, s, &ka, i % n_sets, pv, iv, fv, maps, argv, d)))
      return run_free(&r, rc, d);
    if (t >= 0 && r.flush &&
        (cr = drv->cuMemsetD8Async(r.flush, (unsigned char)t, flush_bytes, r.stream)) != CUDA_SUCCESS)
      return run_free(&r, mg_driver_fail(drv, cr, "cuMemsetD8Async (L2 flush)", d), d);
    if (t >= 0 && (cr = drv->cuEventRecord(r.ev[2 * t], r.stream)) != CUDA_SUCCESS)
      return run_free(&r, mg_driver_fail(drv, cr, "cuEventRecord", d), d);
    if ((rc = mg_registry_launch(r.reg, mk, &ka.dims, r.stream, argv, &kd))) {
      if (rc == MLAGEN_ENOMEM) {
        rc = mg_diag_set(d, rc, "%s", mg_diag_msg(&kd));
        mg_diag_clear(&kd);
        return run_free(&r, rc, d);
      }
      set_verdict(res, MG_TUNE_FAILED_LAUNCH, mg_diag_msg(&kd));
      mg_diag_clear(&kd);
      return run_free_failed(&r, d);
    }
    if (t >= 0 && (cr = drv->cuEventRecord(r.ev[2 * t + 1], r.stream)) != CUDA_SUCCESS)
      return run_free(&r, mg_driver_fail(drv, cr, "cuEventRecord", d), d);
  }
  if ((cr = drv->cuEventSynchronize(r.ev[2 * n_samples - 1])) != CUDA_SUCCESS) {
    poison(&r, k->name, cr); /* an execution error: the context is unusable */
    char what[300];
    snprintf(what, sizeof what, "%s: execution (cuEventSynchronize)", k->name);
    mg_driver_fail(drv, cr, what, &kd);
    set_verdict(res, MG_TUNE_FAILED_LAUNCH, mg_diag_msg(&kd));
    mg_diag_clear(&kd);
    return run_free_failed(&r, d);
  }
  for (int t = 0; t < n_samples; t++) {
    float ms = 0;
    if ((cr = drv->cuEventElapsedTime(&ms, r.ev[2 * t], r.ev[2 * t + 1])) != CUDA_SUCCESS)
      return run_free(&r, mg_driver_fail(drv, cr, "cuEventElapsedTime", d), d);
    samples_ms[t] = ms;
  }
  res->verdict = MG_TUNE_KEPT;
  return run_free(&r, 0, d);
}

int mg_ktime_timer(const mg_kernel *k, const mg_cubin *c, const mg_kernel *ref_k,
                   const mg_cubin *ref_c, const mg_kernel_spec *s, long long seq, int n_samples,
                   double *samples_ms, int *verdict, char *reason, size_t reason_n, mg_diag *d) {
  if (!verdict) return mg_diag_set(d, MLAGEN_EINVAL, "mg_ktime_timer: verdict is NULL");
  mg_ktime_result res;
  int rc = mg_ktime_run(k, c, ref_k, ref_c, s, seq, n_samples, samples_ms, &res, d);
  if (rc) return rc;
  *verdict = res.verdict;
  if (reason && reason_n) snprintf(reason, reason_n, "%s", res.reason);
  return 0;
}
