/* forms_check.c (mlagen_forms_check): every form's whole forward and backward on a real
 * GPU through the public API (include/mlagen.h), checked against the CPU executor and
 * timed with CUDA events.
 *
 *   mlagen_forms_check OUTDIR [--heads 16] [--seq 256] [--forms LIST] [--iters 20]
 *                             [--warmup 3] [--seed N] [--no-check]
 *
 * For a DeepSeek-V3 head shape with --heads heads (d_c 512, d_r 64, d_n 128, d_v 128,
 * softmax scale mscale^2 / sqrt(192), mscale 1.3689 as V3's yarn gives), B = 1, S = --seq,
 * causal, bf16, sp_size 1, and each form of --forms (default explicit, absorbed, laga,
 * laga-r, laga-f; laga-f with its default head groups):
 *   - mlagen_model_from_desc, mlagen_plan_create, mlagen_plan_sizes; every tensor, the
 *     workspace and the saved area allocated with the driver (cuMemAlloc through
 *     runtime/mg_driver.h); inputs uploaded (random, rounded to bf16: 0.5 N(0, 1), w_kv_b
 *     N(0, 1) / sqrt(d_c), tests/cpu_test_util.h), outputs, workspace and saved area
 *     filled with NaN;
 *   - mlagen_forward then mlagen_backward on one stream (the first forward prepares the
 *     plan: kernels generated, compiled by NVRTC through the JIT cache, loaded; cuBLAS
 *     loaded), outputs copied back and compared with the CPU executor
 *     (runtime/mg_cpu_exec.h) running the f32 plan of the same form on the same
 *     bf16-rounded inputs: o within 1e-2, dq, dc_kv, dk_rope, dw_kv_b within 2e-2
 *     (max |gpu - cpu| / max |cpu|; any NaN fails), the kernel issues' bf16 tolerances;
 *   - timing: --warmup calls, then the median of --iters calls, each between two events
 *     recorded back to back on the stream, of mlagen_forward and (after one forward, with
 *     its saved area) of mlagen_backward. A call's time includes everything the form does
 *     (GEMMs, layout kernels, attention), so forms compare by ms, not TFLOP/s.
 * --no-check skips the CPU executor and the comparison (timing at sizes the CPU reference
 * is too slow for; the outputs are still required to be finite). The tuned store the CUDA
 * executor reads is $MLAGEN_TUNED_DIR (else ./tuned): point it elsewhere to time the
 * templates' defaults.
 * One line per form: the errors, ok or FAIL, the forward and backward ms. An API call
 * that fails prints the form, the call, its status name and mlagen_last_message (e.g.
 * "MLAGEN_EDRIVER: ... cuBLAS not found ..." through the fake driver) and the next form
 * runs.
 *
 * Writes OUTDIR/forms.log (everything printed) and OUTDIR/forms.csv:
 * form,H,S,o,dq,dc_kv,dk_rope,dw_kv_b,ok,prepare_s,fwd_ms,bwd_ms,iters,status.
 * Exit: 0 every form ran and passed; 1 a form failed (an API error, a CUDA error, a
 * tolerance miss); 2 usage, or no CUDA driver. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu_test_util.h"
#include "mg_driver.h"
#include "mg_fs.h"
#include "mg_safetensors.h"
#include "mlagen.h"

typedef uint16_t e16;

static FILE *g_log;
static int g_no_check; /* --no-check */

__attribute__((format(printf, 1, 2)))
static void say(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  fflush(stdout);
  if (g_log) {
    va_start(ap, fmt);
    vfprintf(g_log, fmt, ap);
    va_end(ap);
    fflush(g_log);
  }
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const mg_driver *drv;
static CUstream g_stream;

static int cu(CUresult r, const char *what) {
  if (r == CUDA_SUCCESS) return 0;
  mg_diag d = MG_DIAG_INIT;
  mg_driver_check(drv, r, MLAGEN_EIO, what, &d);
  say("CUDA error: %s\n", mg_diag_msg(&d));
  mg_diag_clear(&d);
  return -1;
}
#define CU(call) cu((call), #call)

static int g_iters = 20, g_warmup = 3;

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

/* ---- one form -------------------------------------------------------------------------- */

static const mlagen_form k_forms[MG_FORM_COUNT] = {MLAGEN_FORM_EXPLICIT, MLAGEN_FORM_ABSORBED,
                                                   MLAGEN_FORM_LAGA, MLAGEN_FORM_LAGA_R,
                                                   MLAGEN_FORM_LAGA_F};

/* The tensors in mlagen_tensors order, with their mlagen_sizes entries and, for the
 * compared outputs, the cpu_test_util output index. */
enum { T_Q, T_CKV, T_KROPE, T_W, T_O, T_DO, T_DQ, T_DCKV, T_DKROPE, T_DW, T_N };
static const int k_out_of[T_N] = {-1, -1, -1, -1, TU_O, -1, TU_DQ, TU_DCKV, TU_DKROPE, TU_DW};
static const int k_in_of[T_N] = {TU_Q, TU_CKV, TU_KROPE, TU_W, -1, TU_DO, -1, -1, -1, -1};

static mlagen_tensor *tensor_at(mlagen_tensors *t, int i) {
  mlagen_tensor *all[T_N] = {&t->q, &t->c_kv, &t->k_rope, &t->w_kv_b, &t->o,
                             &t->d_o, &t->dq, &t->dc_kv, &t->dk_rope, &t->dw_kv_b};
  return all[i];
}
static const mlagen_tensor_info *info_at(const mlagen_sizes *z, int i) {
  const mlagen_tensor_info *all[T_N] = {&z->q, &z->c_kv, &z->k_rope, &z->w_kv_b, &z->o,
                                        &z->d_o, &z->dq, &z->dc_kv, &z->dk_rope, &z->dw_kv_b};
  return all[i];
}

typedef struct form_result {
  double err[TU_N_OUT];
  int ok, ran;
  double prepare_s, fwd_ms, bwd_ms;
  int iters;
  char status[64];
} form_result;

/* Times `iters` calls of the pass (after the warm-up), median ms into *ms. Returns 0, or
 * the API status (message printed), or -1 on a CUDA error. */
static int time_pass(mlagen_context *ctx, mlagen_plan *plan, int bwd, const mlagen_tensors *t,
                     CUdeviceptr ws, size_t ws_b, CUdeviceptr sv, size_t sv_b, double *ms) {
  static CUevent ev[257];
  static int n_ev;
  if (!n_ev) {
    for (int i = 0; i < 257; i++)
      if (CU(drv->cuEventCreate(&ev[i], CU_EVENT_DEFAULT))) return -1;
    n_ev = 257;
  }
  const int n = g_iters < 256 ? g_iters : 256;
  for (int i = 0; i < g_warmup + n; i++) {
    const int timed = i >= g_warmup, k = i - g_warmup;
    if (timed && k == 0 && CU(drv->cuEventRecord(ev[0], g_stream))) return -1;
    int rc = bwd ? mlagen_backward(plan, t, (void *)ws, ws_b, (void *)sv, sv_b, g_stream)
                 : mlagen_forward(plan, t, (void *)ws, ws_b, (void *)sv, sv_b, g_stream);
    if (rc) {
      say("  %s (timing): %s: %s\n", bwd ? "mlagen_backward" : "mlagen_forward",
          mlagen_status_name(rc), mlagen_last_message(ctx));
      return rc;
    }
    if (timed && CU(drv->cuEventRecord(ev[k + 1], g_stream))) return -1;
  }
  if (CU(drv->cuEventSynchronize(ev[n]))) return -1;
  float tm[256];
  for (int i = 0; i < n; i++)
    if (CU(drv->cuEventElapsedTime(&tm[i], ev[i], ev[i + 1]))) return -1;
  qsort(tm, (size_t)n, sizeof tm[0], cmp_float);
  *ms = n % 2 ? tm[n / 2] : 0.5 * (tm[n / 2 - 1] + tm[n / 2]);
  return 0;
}

/* Runs, checks and times form fi. Fills *r; returns -1 on a CUDA error (stop), else 0. */
static int run_form(mlagen_context *ctx, const mlagen_model *model, const tu_case *c, int fi,
                    double *const in[TU_N_IN], form_result *r) {
  memset(r, 0, sizeof *r);
  snprintf(r->status, sizeof r->status, "ok");
  const char *fname = mg_form_name((mg_form)fi);
  mg_diag d = MG_DIAG_INIT;
  int rc_out = 0;
  tu_run ref;
  memset(&ref, 0, sizeof ref);
  double t0 = now();
  if (!g_no_check && tu_run_form(c, (mg_form)fi, 1, 0, NULL, MG_F32, in, &ref, &d)) {
    say("%s: CPU reference: %s\n", fname, mg_diag_msg(&d));
    snprintf(r->status, sizeof r->status, "cpu reference failed");
    mg_diag_clear(&d);
    tu_run_free(&ref);
    return 0;
  }
  const double t_ref = now() - t0;

  mlagen_plan *plan = NULL;
  mlagen_plan_desc pd = {.form = k_forms[fi], .batch = c->B, .seq = c->S, .sp_rank = 0,
                         .sp_size = 1, .causal = c->causal, .dtype = MLAGEN_DTYPE_BF16};
  mlagen_sizes z;
  mlagen_tensors t;
  memset(&t, 0, sizeof t);
  CUdeviceptr dev[T_N] = {0}, ws = 0, sv = 0;
  void *host[T_N] = {0};
  int rc = mlagen_plan_create(ctx, model, &pd, &plan);
  if (!rc) rc = mlagen_plan_sizes(plan, &z);
  if (rc) {
    say("%s: mlagen_plan_create/sizes: %s: %s\n", fname, mlagen_status_name(rc),
        mlagen_last_message(ctx));
    snprintf(r->status, sizeof r->status, "%s", mlagen_status_name(rc));
    goto done;
  }
  /* device tensors: inputs uploaded as bf16, everything else NaN (0xff bytes) */
  for (int i = 0; i < T_N; i++) {
    const mlagen_tensor_info *ti = info_at(&z, i);
    mlagen_tensor *tt = tensor_at(&t, i);
    tt->dtype = ti->dtype, tt->ndim = ti->ndim;
    memcpy(tt->dims, ti->dims, sizeof tt->dims);
    if (CU(drv->cuMemAlloc(&dev[i], ti->bytes ? ti->bytes : 16))) goto cuda_fail;
    tt->data = (void *)(uintptr_t)dev[i];
    if (!(host[i] = malloc(ti->bytes ? ti->bytes : 16))) goto cuda_fail;
    if (k_in_of[i] >= 0) {
      const int64_t n = tu_in_numel(c, k_in_of[i]);
      if ((size_t)n * 2 != ti->bytes || ti->dtype != MLAGEN_DTYPE_BF16) {
        say("%s: tensor %s: %zu bytes (dtype %d), the test made %lld bf16 values\n", fname,
            ti->name, ti->bytes, (int)ti->dtype, (long long)n);
        snprintf(r->status, sizeof r->status, "tensor size mismatch");
        goto done;
      }
      e16 *h = host[i];
      for (int64_t k = 0; k < n; k++) h[k] = mg_st_f32_to_bf16((float)in[k_in_of[i]][k]);
      if (CU(drv->cuMemcpyHtoD(dev[i], h, ti->bytes))) goto cuda_fail;
    } else if (CU(drv->cuMemsetD8(dev[i], 0xff, ti->bytes ? ti->bytes : 16))) {
      goto cuda_fail;
    }
  }
  if (CU(drv->cuMemAlloc(&ws, z.workspace_bytes ? z.workspace_bytes : 256)) ||
      CU(drv->cuMemAlloc(&sv, z.saved_bytes ? z.saved_bytes : 256)) ||
      CU(drv->cuMemsetD8(ws, 0xff, z.workspace_bytes ? z.workspace_bytes : 256)) ||
      CU(drv->cuMemsetD8(sv, 0xff, z.saved_bytes ? z.saved_bytes : 256)))
    goto cuda_fail;

  /* forward (the first call prepares the plan), backward */
  t0 = now();
  rc = mlagen_forward(plan, &t, (void *)(uintptr_t)ws, z.workspace_bytes, (void *)(uintptr_t)sv,
                      z.saved_bytes, g_stream);
  if (rc) {
    say("%s: mlagen_forward: %s: %s\n", fname, mlagen_status_name(rc), mlagen_last_message(ctx));
    snprintf(r->status, sizeof r->status, "%s", mlagen_status_name(rc));
    goto done;
  }
  if (cu(drv->cuStreamSynchronize(g_stream), "cuStreamSynchronize after mlagen_forward"))
    goto cuda_fail;
  r->prepare_s = now() - t0;
  if (CU(drv->cuMemsetD8(ws, 0xff, z.workspace_bytes ? z.workspace_bytes : 256))) goto cuda_fail;
  rc = mlagen_backward(plan, &t, (void *)(uintptr_t)ws, z.workspace_bytes, (void *)(uintptr_t)sv,
                       z.saved_bytes, g_stream);
  if (rc) {
    say("%s: mlagen_backward: %s: %s\n", fname, mlagen_status_name(rc), mlagen_last_message(ctx));
    snprintf(r->status, sizeof r->status, "%s", mlagen_status_name(rc));
    goto done;
  }
  if (cu(drv->cuStreamSynchronize(g_stream), "cuStreamSynchronize after mlagen_backward"))
    goto cuda_fail;
  r->ran = 1;

  /* compare */
  r->ok = 1;
  for (int i = 0; i < T_N; i++) {
    const int k = k_out_of[i];
    if (k < 0) continue;
    const mlagen_tensor_info *ti = info_at(&z, i);
    if (CU(drv->cuMemcpyDtoH(host[i], dev[i], ti->bytes))) goto cuda_fail;
    const int64_t n = tu_out_numel(c, k);
    const size_t esz = ti->dtype == MLAGEN_DTYPE_F32 ? 4 : 2;
    if ((size_t)n * esz != ti->bytes) {
      say("%s: output %s: %zu bytes, the reference has %lld values\n", fname, ti->name, ti->bytes,
          (long long)n);
      r->ok = 0;
      r->err[k] = INFINITY;
      continue;
    }
    const float *want = g_no_check ? NULL : tu_out_ptr(&ref, k);
    double num = 0, den = 0;
    size_t nans = 0;
    for (int64_t j = 0; j < n; j++) {
      const double g = esz == 4 ? ((const float *)host[i])[j]
                                : mg_st_bf16_to_f32(((const e16 *)host[i])[j]);
      const double w = want ? want[j] : g; /* --no-check: finiteness only */
      if (!isfinite(g) || !isfinite(w)) {
        nans++;
        continue;
      }
      num = fmax(num, fabs(g - w));
      den = fmax(den, fabs(w));
    }
    r->err[k] = nans ? INFINITY : den > 0 ? num / den : num;
    const double tol = k == TU_O ? 1e-2 : 2e-2;
    if (!(r->err[k] < tol)) r->ok = 0;
    if (nans) say("%s: %s: %zu non-finite values\n", fname, ti->name, nans);
  }
  if (!r->ok) snprintf(r->status, sizeof r->status, "tolerance");

  /* timing: forwards, then backwards (the saved area of the last forward stays valid) */
  r->iters = g_iters < 256 ? g_iters : 256;
  rc = time_pass(ctx, plan, 0, &t, ws, z.workspace_bytes, sv, z.saved_bytes, &r->fwd_ms);
  if (!rc) rc = time_pass(ctx, plan, 1, &t, ws, z.workspace_bytes, sv, z.saved_bytes, &r->bwd_ms);
  if (rc < 0) goto cuda_fail;
  if (rc) {
    r->ok = 0;
    snprintf(r->status, sizeof r->status, "%s (timing)", mlagen_status_name(rc));
  }
  say("%-9s o %.2e dq %.2e dc_kv %.2e dk_rope %.2e dw_kv_b %.2e  %-4s  fwd %8.3f ms  bwd %8.3f ms"
      "  (prepare %.1f s, CPU reference %.1f s)\n",
      fname, r->err[TU_O], r->err[TU_DQ], r->err[TU_DCKV], r->err[TU_DKROPE], r->err[TU_DW],
      r->ok ? "ok" : "FAIL", r->fwd_ms, r->bwd_ms, r->prepare_s, t_ref);
  goto done;
cuda_fail:
  rc_out = -1;
  r->ok = 0;
  snprintf(r->status, sizeof r->status, "CUDA error");
done:
  if (!r->ran) say("%-9s FAIL (%s)\n", fname, r->status);
  if (g_stream) cu(drv->cuStreamSynchronize(g_stream), "cuStreamSynchronize");
  for (int i = 0; i < T_N; i++) {
    if (dev[i]) cu(drv->cuMemFree(dev[i]), "cuMemFree");
    free(host[i]);
  }
  if (ws) cu(drv->cuMemFree(ws), "cuMemFree");
  if (sv) cu(drv->cuMemFree(sv), "cuMemFree");
  mlagen_plan_destroy(plan);
  tu_run_free(&ref);
  mg_diag_clear(&d);
  return rc_out;
}

/* ---- main ------------------------------------------------------------------------------- */

static int usage(void) {
  fprintf(stderr,
          "usage: mlagen_forms_check OUTDIR [--heads 16] [--seq 256] [--forms LIST] [--iters 20]\n"
          "                          [--warmup 3] [--seed N] [--no-check]\n"
          "  LIST: comma-separated of explicit, absorbed, laga, laga-r, laga-f (default all)\n");
  return 2;
}

int main(int argc, char **argv) {
  if (argc < 2 || argv[1][0] == '-') return usage();
  const char *outdir = argv[1];
  int H = 16, S = 256, want[MG_FORM_COUNT] = {1, 1, 1, 1, 1};
  uint64_t seed = 20250712;
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--no-check")) {
      g_no_check = 1;
      continue;
    }
    if (!v) return usage();
    i++;
    if (!strcmp(a, "--heads")) { if ((H = atoi(v)) < 1 || H > 128) return usage(); }
    else if (!strcmp(a, "--seq")) { if ((S = atoi(v)) < 1 || S > 65536) return usage(); }
    else if (!strcmp(a, "--iters")) { if ((g_iters = atoi(v)) < 1 || g_iters > 256) return usage(); }
    else if (!strcmp(a, "--warmup")) { if ((g_warmup = atoi(v)) < 0) return usage(); }
    else if (!strcmp(a, "--seed")) seed = strtoull(v, NULL, 0);
    else if (!strcmp(a, "--forms")) {
      memset(want, 0, sizeof want);
      char buf[256];
      snprintf(buf, sizeof buf, "%s", v);
      for (char *sv = NULL, *tok = strtok_r(buf, ",", &sv); tok; tok = strtok_r(NULL, ",", &sv)) {
        int f = 0;
        while (f < MG_FORM_COUNT && strcmp(tok, mg_form_name((mg_form)f))) f++;
        if (f == MG_FORM_COUNT) return usage();
        want[f] = 1;
      }
    } else return usage();
  }
  mg_diag d = MG_DIAG_INIT;
  if (mg_fs_mkdirs(outdir, &d)) {
    fprintf(stderr, "forms_check: %s\n", mg_diag_msg(&d));
    mg_diag_clear(&d);
    return 1;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/forms.log", outdir);
  if (!(g_log = fopen(path, "w"))) {
    fprintf(stderr, "forms_check: cannot write %s: %s\n", path, strerror(errno));
    return 1;
  }
  if (mg_driver_get(&drv, &d)) {
    say("forms_check: %s\n", mg_diag_msg(&d));
    const int nodrv = d.status == MLAGEN_ENODRIVER;
    mg_diag_clear(&d);
    fclose(g_log);
    return nodrv ? 2 : 1;
  }
  int rc = 1, retained = 0;
  CUdevice dev;
  CUcontext cctx = NULL;
  char name[256] = "";
  mlagen_context *ctx = NULL;
  mlagen_model *model = NULL;
  double *in[TU_N_IN] = {0};
  form_result res[MG_FORM_COUNT];
  memset(res, 0, sizeof res);
  if (CU(drv->cuDeviceGet(&dev, 0)) || CU(drv->cuDeviceGetName(name, sizeof name, dev)) ||
      CU(drv->cuDevicePrimaryCtxRetain(&cctx, dev)))
    goto out;
  retained = 1;
  if (CU(drv->cuCtxSetCurrent(cctx)) || CU(drv->cuStreamCreate(&g_stream, CU_STREAM_NON_BLOCKING)))
    goto out;

  /* DeepSeek-V3's head shape at H heads, V3's softmax scale */
  const double scale = 1.3689 * 1.3689 / sqrt(192.0);
  tu_case c = {.shape = tu_shape(H, 128, 64, 128, 512), .B = 1, .S = S, .causal = 1};
  c.shape.softmax_scale = scale;
  int st = mlagen_context_create(&ctx);
  mlagen_model_desc md = {.num_attention_heads = H, .kv_lora_rank = 512, .qk_rope_head_dim = 64,
                          .qk_nope_head_dim = 128, .v_head_dim = 128, .softmax_scale = scale};
  if (!st) st = mlagen_model_from_desc(ctx, &md, &model);
  if (st) {
    say("forms_check: mlagen context/model: %s: %s\n", mlagen_status_name(st),
        mlagen_last_message(ctx));
    goto out;
  }
  if (tu_inputs(&c, seed, in)) {
    say("forms_check: out of host memory\n");
    goto out;
  }
  for (int k = 0; k < TU_N_IN; k++) /* bf16 values: the GPU and the CPU see the same inputs */
    for (int64_t i = 0; i < tu_in_numel(&c, k); i++)
      in[k][i] = mg_st_bf16_to_f32(mg_st_f32_to_bf16((float)in[k][i]));
  say("device: %s; driver %d; DeepSeek-V3 heads (d_n 128, d_r 64, d_v 128, d_c 512) at H %d, "
      "B 1, S %d, causal, bf16, sp_size 1; seed %llu; tolerances o 1e-2, gradients 2e-2 vs the "
      "CPU executor (f32); timing: warm-up %d, median of %d\n",
      name, drv->driver_version, H, S, (unsigned long long)seed, g_warmup, g_iters);
  if (g_no_check) say("--no-check: no CPU reference; outputs only required to be finite\n");
  int n_bad = 0, n_run = 0;
  for (int f = 0; f < MG_FORM_COUNT; f++) {
    if (!want[f]) continue;
    n_run++;
    if (run_form(ctx, model, &c, f, in, &res[f])) {
      n_bad++;
      break;
    }
    if (!res[f].ok) n_bad++;
  }
  snprintf(path, sizeof path, "%s/forms.csv", outdir);
  FILE *csv = fopen(path, "w");
  if (csv) {
    fprintf(csv, "form,H,S,o,dq,dc_kv,dk_rope,dw_kv_b,ok,prepare_s,fwd_ms,bwd_ms,iters,status\n");
    for (int f = 0; f < MG_FORM_COUNT; f++) {
      const form_result *r = &res[f];
      if (!want[f]) continue;
      if (!r->ran) { /* no results: empty fields */
        fprintf(csv, "%s,%d,%d,,,,,,0,,,,,%s\n", mg_form_name((mg_form)f), H, S, r->status);
        continue;
      }
      fprintf(csv, "%s,%d,%d,%.3e,%.3e,%.3e,%.3e,%.3e,%d,%.2f,%.4f,%.4f,%d,%s\n",
              mg_form_name((mg_form)f), H, S, r->err[TU_O], r->err[TU_DQ], r->err[TU_DCKV],
              r->err[TU_DKROPE], r->err[TU_DW], r->ok, r->prepare_s, r->fwd_ms, r->bwd_ms, r->iters,
              r->status);
    }
    fclose(csv);
    say("wrote %s\n", path);
  } else {
    say("forms_check: cannot write %s: %s\n", path, strerror(errno));
    n_bad++;
  }
  say("forms: %d of %d passed\n", n_run - n_bad, n_run);
  rc = n_bad ? 1 : 0;
out:
  tu_free(in, TU_N_IN);
  mlagen_model_destroy(model);
  mlagen_context_destroy(ctx);
  if (g_stream) cu(drv->cuStreamDestroy(g_stream), "cuStreamDestroy");
  if (retained) cu(drv->cuDevicePrimaryCtxRelease(dev), "cuDevicePrimaryCtxRelease");
  say("%s\n", rc ? "forms_check: FAILED" : "forms_check: ok");
  fclose(g_log);
  return rc;
}
