/* test_mqa_fwd.c: the absorbed-form MQA attention forward (templates/mqa_fwd.cu.tpl), run
 * unchanged on the CPU through the host executor (tests/host/, mma.sync, ldmatrix and
 * cp.async emulated with the PTX fragment layouts), against the float64 reference of
 * tests/mqa_ref.h; and every configuration its check keeps, compiled by NVRTC for sm_80 and
 * sm_90a without spills.
 *
 * Inputs are fresh random bf16 (or fp16) values, scores with standard deviation 2 under
 * DeepSeek's YaRN softmax scale (the seed is printed, MLAGEN_TEST_SEED overrides it). The
 * reference computes from the same rounded values in double precision, so the
 * kernel's error is its fp32 accumulation, the 16-bit rounding of P before P V and the
 * rounding of O; O and LSE are compared per element (kt_check; the figures at tol_o). Launches use the executor's shuffled schedule with shared memory
 * NaN-filled before each block; other schedules must give bit-identical O and LSE, and
 * removing any of its barriers must be caught by every seed. Two small cases
 * also run in a child process (this program, --asan-case) built with ASan, when the
 * compiler has an ASan runtime: the dynamic shared memory is then bounds-checked at the
 * launch's size. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_host.h"
#include "kernel_test_util.h"
#include "mlagen.h"
#include "mqa_ref.h"

typedef void (*mqa_fwd_fn)(const e16 *q, const e16 *c, e16 *o, float *lse, int seqlen_q,
                           int seqlen_k, int q_pos0, float softmax_scale);
/* The packed-sequence variant (spec.varlen): the same, then cu_seqlens, n_seqs. */
typedef void (*mqa_fwd_varlen_fn)(const e16 *q, const e16 *c, e16 *o, float *lse, int seqlen_q,
                                  int seqlen_k, int q_pos0, float softmax_scale,
                                  const int *cu_seqlens, int n_seqs);

typedef struct launch_args {
  mqa_fwd_fn fn;
  const e16 *q, *c;
  e16 *o;
  float *lse;
  int sq, sk, q_pos0;
  float scale;
  const int *cu; /* not NULL: fn is a mqa_fwd_varlen_fn */
  int n_cu;
} launch_args;

static void thunk(void *p) {
  launch_args *a = p;
  if (a->cu)
    ((mqa_fwd_varlen_fn)(void (*)(void))a->fn)(a->q, a->c, a->o, a->lse, a->sq, a->sk, a->q_pos0,
                                               a->scale, a->cu, a->n_cu);
  else
    a->fn(a->q, a->c, a->o, a->lse, a->sq, a->sk, a->q_pos0, a->scale);
}

typedef struct built_kernel {
  kh_kernel kh; /* threads, smem (dynamic shared memory per block), name, spec */
  mqa_fwd_fn fn;
  int block_m;
} built_kernel;

static int is_fp16(const mg_kernel_spec *s) { return strcmp(s->dtype, "fp16") == 0; }
static float e_to_float(const mg_kernel_spec *s, e16 x) { return e16_to_float(is_fp16(s), x); }

/* The grid rule's x dimension must be ceil(seqlen_q * H / block_m) (heads packed into the
 * rows), y 1 and z the batch. */
static void check_grid_rule(const kh_kernel *k, int heads, int block_m) {
  const cJSON *grid = kh_launch_item(k, "grid");
  assert_int_equal(cJSON_GetArraySize(grid), 3);
  const cJSON *x = cJSON_GetArrayItem(grid, 0), *y = cJSON_GetArrayItem(grid, 1),
              *z = cJSON_GetArrayItem(grid, 2);
  assert_string_equal(cJSON_GetObjectItemCaseSensitive(x, "arg")->valuestring, "seqlen_q");
  assert_int_equal(cJSON_GetObjectItemCaseSensitive(x, "mul")->valueint, heads);
  assert_int_equal(cJSON_GetObjectItemCaseSensitive(x, "div")->valueint, block_m);
  assert_int_equal(cJSON_GetObjectItemCaseSensitive(y, "value")->valueint, 1);
  assert_string_equal(cJSON_GetObjectItemCaseSensitive(z, "arg")->valuestring, "batch");
}

/* Generates the kernel for spec and builds it with the host executor (the harness keys
 * its objects by content, so a kernel is compiled once). drop >= 0: without that barrier
 * (returns 0 when there is none); *publishes is set to 0 when the barrier's comment says
 * it only guards a buffer against the next copy into it ("every warp is done", write
 * after read), else 1 (it publishes copied data, the row max or sum parts, or P to other
 * warps). */
static int build_edit(const mg_kernel_spec *spec, int asan, kh_edit_fn edit, void *ctx,
                      built_kernel *out);

static int build_src(const mg_kernel_spec *spec, int asan, int drop, int *publishes,
                     int *warp, built_kernel *out) {
  kh_drop dr = {.which = drop};
  if (!build_edit(spec, asan, drop >= 0 ? kh_drop_edit : NULL, &dr, out)) return 0;
  if (warp) *warp = dr.warp;
  if (publishes) {
    const char *comment = strstr(dr.rest, "//");
    *publishes = !(comment && strncmp(comment, "// every warp is done", 21) == 0);
  }
  return 1;
}

/* build_src with any edit of the source (NULL: none); returns 0 when the edit declined. */
static int build_edit(const mg_kernel_spec *spec, int asan, kh_edit_fn edit, void *ctx,
                      built_kernel *out) {
  if (!kh_build_edited(NULL, spec, asan, edit, ctx, &out->kh)) return 0;
  out->block_m = kh_config_int(&out->kh, "block_m");
  assert_int_equal(out->kh.threads, 32 * (out->block_m / 16) * kh_config_int(&out->kh, "nsplit"));
  check_grid_rule(&out->kh, spec->heads, out->block_m);
  assert_int_equal(kh_launch_value(&out->kh, "smem_static"), 0);
  *(void **)&out->fn = out->kh.fn;
  return 1;
}

static void build_ex(const mg_kernel_spec *spec, int asan, built_kernel *out) {
  build_src(spec, asan, -1, NULL, NULL, out);
}

static void build(const mg_kernel_spec *spec, built_kernel *out) { build_ex(spec, 0, out); }

static void unload(built_kernel *bk) { kh_free(&bk->kh); }

/* One case's tensors: random inputs, outputs NaN until the kernel writes them. Packed
 * sequences: cu [n_cu + 1] (NULL: not packed). */
typedef struct fwd_case {
  int B, sq, sk, q_pos0;
  const int *cu;
  int n_cu;
  float scale;
  e16 *q, *c, *o;
  float *lse;
  size_t nq, nc, no, nl;
  int poisoned; /* 1: the last batch item's q and c are NaN (run_case_poisoned): not compared */
} fwd_case;

static void case_init(const built_kernel *bk, fwd_case *c, int B, int sq, int sk, int q_pos0) {
  const mg_kernel_spec *s = &bk->kh.spec;
  const int H = s->heads, dqk = s->d_c + s->d_r;
  c->B = B, c->sq = sq, c->sk = sk, c->q_pos0 = q_pos0;
  c->cu = NULL, c->n_cu = 0, c->poisoned = 0;
  /* the explicit form's scale (d_n 128 + d_r 64, DeepSeek's mscale): the absorbed scores
   * are the explicit ones, so the same scale */
  c->scale = (float)kt_softmax_scale(192);
  c->nq = (size_t)B * sq * H * dqk;
  c->nc = (size_t)B * sk * dqk;
  c->q = kt_rand_e16_sd(is_fp16(s), c->nq, kt_q_sd(c->scale, dqk)); /* scores with sd 2 */
  c->c = kt_rand_e16_sd(is_fp16(s), c->nc, 1);
  c->no = (size_t)B * sq * H * s->d_c;
  c->nl = (size_t)B * H * sq;
  c->o = malloc((c->no ? c->no : 1) * sizeof *c->o);
  c->lse = malloc((c->nl ? c->nl : 1) * sizeof *c->lse);
}

static void case_free(fwd_case *c) { free(c->q), free(c->c), free(c->o), free(c->lse); }

static double *to_double(const mg_kernel_spec *s, const e16 *x, size_t n) {
  double *p = malloc((n ? n : 1) * sizeof *p);
  for (size_t i = 0; i < n; i++) p[i] = e_to_float(s, x[i]);
  return p;
}

/* Launches the kernel on c (outputs first set to NaN) with lo (NULL: the executor's
 * defaults); returns the wall time of the launch. */
static double launch_case(const built_kernel *bk, fwd_case *c, const mg_host_launch_opts *lo) {
  for (size_t i = 0; i < c->no; i++) c->o[i] = 0x7fff; /* NaN in bf16 and fp16 */
  for (size_t i = 0; i < c->nl; i++) c->lse[i] = NAN;
  launch_args a = {bk->fn, c->q, c->c, c->o, c->lse, c->sq, c->sk, c->q_pos0, c->scale, c->cu, c->n_cu};
  assert_int_equal(c->cu != NULL, bk->kh.spec.varlen != 0);
  const unsigned rows = (unsigned)c->sq * (unsigned)bk->kh.spec.heads;
  mg_host_dim3 grid = {(rows + (unsigned)bk->block_m - 1) / (unsigned)bk->block_m, 1,
                       (unsigned)c->B};
  return kh_launch(&bk->kh, grid, lo, thunk, &a);
}

/* Tolerances (per element: |err| <= atol_frac * rms(O) + rtol |ref|; kernel_test_util.h).
 * O is stored in 16 bits: rtol = 2 u (the storage rounding plus one flipped 16-bit P).
 * atol_frac is twice NOISE_O, the largest noise figure (max (|err| - rtol |ref|) / rms)
 * measured by kt_noise_report over every case of the numeric tests of this file
 * (MLAGEN_TEST_SEED 21-24, host executor, bf16 and fp16): 5.12e-3 (P rounded to 16 bits
 * against a running maximum). LSE (fp32): |err| <= 1e-5 (1 + |ref|); the largest measured was 0.06 of that. */
#define NOISE_O 5.2e-3
static kt_tol tol_o(const mg_kernel_spec *s) {
  return (kt_tol){2 * NOISE_O, 2 * kt_unit_roundoff(is_fp16(s) ? KT_F16 : KT_BF16)};
}
static const kt_tol tol_lse = {1e-5, 1e-5};

/* Compares c's outputs with mqa_ref_fwd per element; *o_err, *lse_err: the worst
 * err / bound of O and LSE (over 1 fails); returns the number of NaN outputs. The first
 * failure's message goes to msg (when not NULL; msg[0] = 0 when both pass). */
static size_t case_compare(const built_kernel *bk, const fwd_case *c, double *o_err,
                           double *lse_err, char *msg, size_t msg_n) {
  const mg_kernel_spec *s = &bk->kh.spec;
  double *q = to_double(s, c->q, c->nq), *cc = to_double(s, c->c, c->nc);
  double *ro = malloc((c->no ? c->no : 1) * sizeof *ro), *rl = malloc((c->nl ? c->nl : 1) * sizeof *rl);
  mqa_ref_fwd_varlen(c->B, c->sq, c->sk, s->heads, s->d_c, s->d_r, s->causal, c->q_pos0, c->cu,
                     c->n_cu, c->scale, q, cc, ro, rl);
  const size_t keep = (size_t)(c->B - c->poisoned); /* the items compared */
  const size_t nans = kt_check_fwd("mqa_fwd", is_fp16(s) ? KT_F16 : KT_BF16, c->o, ro,
                                   c->no / c->B * keep, (size_t)s->d_c, c->lse, rl,
                                   c->nl / c->B * keep, tol_o(s), tol_lse, o_err, lse_err, msg,
                                   msg_n);
  free(q), free(cc), free(ro), free(rl);
  return nans;
}

/* For test_missing_barrier_caught: the worst err / bound of O and LSE (no noise figure). */
static size_t case_errors(const built_kernel *bk, const fwd_case *c, double *o_err,
                          double *lse_err) {
  kt_noise_quiet = 1; /* a kernel without a barrier: its errors are not noise */
  const size_t nans = case_compare(bk, c, o_err, lse_err, NULL, 0);
  kt_noise_quiet = 0;
  return nans;
}

/* Checks O and LSE per element (tol_o, tol_lse) and no NaN. */
static void check_case(const built_kernel *bk, const fwd_case *c, double secs) {
  double o_err, lse_err;
  char msg[400];
  size_t nans = case_compare(bk, c, &o_err, &lse_err, msg, sizeof msg);
  print_message("  %s B=%d S_q=%d S_k=%d q_pos0=%d%s: err/bound O %.2f LSE %.2f (%.2f s)\n",
                bk->kh.name + strlen("mla_mqa_fwd_"), c->B, c->sq, c->sk, c->q_pos0,
                c->cu ? " packed" : "", o_err, lse_err, secs);
  if (nans) fail_msg("%zu NaN outputs", nans);
  if (msg[0]) fail_msg("%s", msg);
}

/* Runs one case with the default schedule and checks it. */
static double run_case(const built_kernel *bk, int B, int sq, int sk, int q_pos0) {
  fwd_case c;
  case_init(bk, &c, B, sq, sk, q_pos0);
  double secs = launch_case(bk, &c, NULL);
  check_case(bk, &c, secs);
  case_free(&c);
  return secs;
}
/* Batch isolation (B > 1): run_case with NaN in every q and c element of the last batch item;
 * the items before it are compared, which the NaN must not reach (a CTA's tile rows past its
 * item's end must not bring the next item's tokens in: 0 * NaN would be NaN). */
static void run_case_poisoned(const built_kernel *bk, int B, int sq, int sk, int q_pos0) {
  fwd_case c;
  case_init(bk, &c, B, sq, sk, q_pos0);
  kt_nan_last_item_e16(c.q, c.nq, B), kt_nan_last_item_e16(c.c, c.nc, B);
  c.poisoned = B > 1;
  double secs = launch_case(bk, &c, NULL);
  check_case(bk, &c, secs);
  case_free(&c);
}

static mg_kernel_spec make_spec(int H, int dc, int dr, int causal) {
  return kh_mqa_spec("mqa_fwd", H, dc, dr, causal);
}

static void set(mg_kernel_spec *s, const char *assignment) { kh_set(s, assignment); }

/* DeepSeek's latent (d_c 512, d_r 64: d_qk 576, d_v 512), default configuration (block_m
 * 64, block_n 32, nsplit 2, stages 2), causal and not. H = 2: S = 1; S = 37 with batch 2
 * (no tile divides 74 rows or 37 keys); a query shard at position 30 of 50 keys; no keys
 * (o = 0, lse = -inf). H = 16: 4 positions per 64-row CTA, S = 13 with batch 2 and a
 * shard at 20 of 40 keys. Each batch-2 case again with NaN in every input of item 1 (item 0
 * checked: batch isolation). */
static void test_deepseek(void **state) {
  (void)state;
  for (int causal = 1; causal >= 0; causal--) {
    mg_kernel_spec s = make_spec(2, 512, 64, causal);
    built_kernel bk;
    build(&s, &bk);
    run_case(&bk, 1, 1, 1, 0);
    run_case(&bk, 2, 37, 37, 0);
    run_case_poisoned(&bk, 2, 37, 37, 0);
    run_case(&bk, 1, 20, 50, 30);
    run_case(&bk, 1, 5, 0, 0);
    run_case(&bk, 1, 64, 128, 64); /* every row and key tile full */
    unload(&bk);
    s = make_spec(16, 512, 64, causal);
    build(&s, &bk);
    run_case(&bk, 2, 13, 13, 0);
    run_case_poisoned(&bk, 2, 13, 13, 0);
    run_case(&bk, 1, 7, 40, 33);
    unload(&bk);
  }
}

/* d_c 256, d_r 32 (288/256), default configuration (block_m 64, block_n 64, nsplit 2,
 * stages 2); H = 1 (one row per token) and H = 5 (tokens straddle row groups and CTAs).
 * Each batch-2 case again with NaN in every input of item 1 (batch isolation). */
static void test_dc256(void **state) {
  (void)state;
  for (int causal = 1; causal >= 0; causal--) {
    mg_kernel_spec s = make_spec(2, 256, 32, causal);
    built_kernel bk;
    build(&s, &bk);
    run_case(&bk, 1, 1, 1, 0);
    run_case(&bk, 2, 37, 37, 0);
    run_case_poisoned(&bk, 2, 37, 37, 0);
    run_case(&bk, 1, 20, 70, 50);
    unload(&bk);
  }
  mg_kernel_spec s = make_spec(1, 256, 32, 1);
  built_kernel bk;
  build(&s, &bk);
  run_case(&bk, 2, 77, 77, 0);
  run_case_poisoned(&bk, 2, 77, 77, 0);
  unload(&bk);
  /* H = 5: row groups and CTAs start and end inside tokens */
  s = make_spec(5, 256, 32, 1);
  build(&s, &bk);
  run_case(&bk, 2, 29, 29, 0);
  run_case_poisoned(&bk, 2, 29, 29, 0);
  run_case(&bk, 1, 13, 20, 7);
  unload(&bk);
}

/* H = 128 (DeepSeek-V3 without sequence parallelism), decode-like: one query at position
 * 32 of 33 keys, two 64-row CTAs of the same token. */
static void test_h128(void **state) {
  (void)state;
  mg_kernel_spec s = make_spec(128, 512, 64, 1);
  built_kernel bk;
  build(&s, &bk);
  run_case(&bk, 1, 1, 33, 32);
  unload(&bk);
}

/* Other tunable configurations at 288/256: 8 keys per warp (ldmatrix.x2), one stage,
 * nsplit 4, block_m 32; causal and not. */
static void test_configs(void **state) {
  (void)state;
  static const char *cfgs[][4] = {
      {"block_m=32", "block_n=32", "nsplit=4", "stages=1"},
      {"block_m=64", "block_n=64", "nsplit=4", "stages=1"},
      {"block_m=32", "block_n=64", "nsplit=2", "stages=2"},
  };
  for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++)
    for (int causal = 1; causal >= 0; causal--) {
      mg_kernel_spec s = make_spec(2, 256, 32, causal);
      for (int j = 0; j < 4; j++) set(&s, cfgs[i][j]);
      built_kernel bk;
      build(&s, &bk);
      run_case(&bk, 2, 37, 37, 0);
      run_case(&bk, 1, 20, 90, 70);
      unload(&bk);
    }
}

/* fp16 inputs (the f16 mma), 288/256 causal. */
static void test_fp16(void **state) {
  (void)state;
  mg_kernel_spec s = make_spec(2, 256, 32, 1);
  snprintf(s.dtype, sizeof s.dtype, "fp16");
  built_kernel bk;
  build(&s, &bk);
  run_case(&bk, 2, 37, 37, 0);
  unload(&bk);
}

/* ---- packed sequences (issue 16, spec.varlen) ----
 * kernel_test_util.h's "many" documents (kt_varlen_many: lengths 1, 2, 3, 17, an empty one,
 * 64 and 200, T = 287 tokens) in a buffer of VL_TCAP = 300 (13 slack tokens), batch 1; or
 * one document of 200. cu_seqlens is passed as the CUDA executor's compacted copy is, padded
 * with T to n_seqs = VL_TCAP entries (not distinct), or exactly. Every slack row of q and c
 * is NaN. */
enum { VL_TCAP = KT_VARLEN_CAP, VL_NDOCS = KT_VARLEN_MANY_DOCS };

/* Launches the packed case c with a watch on the latent rows (c) each CTA copies; returns 1
 * when every CTA read its documents' key tiles and no others (kt_tile_check), else 0 with
 * the reason in msg. *secs: the launch's wall time. */
static int launch_watched(const built_kernel *bk, fwd_case *c, double *secs, char *msg, size_t n) {
  const mg_kernel_spec *s = &bk->kh.spec;
  const int H = s->heads, gx = (c->sq * H + bk->block_m - 1) / bk->block_m;
  kt_tile_watch tw;
  kt_tile_watch_init(&tw, c->c, (size_t)(s->d_c + s->d_r) * sizeof *c->c, (size_t)c->sk, (size_t)gx);
  *secs = launch_case(bk, c, &tw.lo);
  const int ok = kt_tile_check(&tw, gx, 1, bk->block_m, H, c->sq, c->cu, c->n_cu, s->causal,
                               &(kt_qpos){c->q_pos0, 0, 0}, c->sk, kh_config_int(&bk->kh, "block_n"),
                               msg, n);
  kt_tile_watch_free(&tw);
  return ok;
}

/* A packed case: rows of tokens q_pos0 .. q_pos0 + sq - 1 over keys 0 .. sk - 1, the
 * documents cu [n_cu + 1], NaN in every slack row of q and c; run and checked (the key tiles
 * each CTA reads too). */
static void run_varlen(const built_kernel *bk, int sq, int sk, int q_pos0, const int *cu, int n_cu) {
  const mg_kernel_spec *s = &bk->kh.spec;
  fwd_case c;
  case_init(bk, &c, 1, sq, sk, q_pos0);
  c.cu = cu, c.n_cu = n_cu;
  const int T = cu[n_cu], dqk = s->d_c + s->d_r;
  for (int i = 0; i < sq; i++)
    if (q_pos0 + i >= T)
      for (size_t k = 0; k < (size_t)s->heads * dqk; k++) c.q[((size_t)i * s->heads) * dqk + k] = 0x7fff;
  for (int j = T; j < sk; j++)
    for (int k = 0; k < dqk; k++) c.c[(size_t)j * dqk + k] = 0x7fff;
  double secs;
  char msg[300];
  if (!launch_watched(bk, &c, &secs, msg, sizeof msg)) fail_msg("%s", msg);
  check_case(bk, &c, secs);
  case_free(&c);
}

static mg_kernel_spec make_varlen_spec(int H, int dc, int dr, int causal) {
  mg_kernel_spec s = make_spec(H, dc, dr, causal);
  s.varlen = 1;
  return s;
}

/* The packed variant against mqa_ref_fwd_varlen (each row's document range from its own
 * walk over cu_seqlens), causal and not, 288/256 at H = 2 (a 64-row CTA spans 32 tokens,
 * so several documents): the many documents (cu padded and exact), one document, a query
 * shard at token 150 of 300 keys (it cuts the 200-token document); at H = 5 with one stage
 * and nsplit 4 (row groups start inside tokens), 120 queries. Slack rows: o 0, lse -inf. */
static void test_varlen(void **state) {
  (void)state;
  int cu_pad[VL_TCAP + 1], cu[VL_NDOCS + 1];
  kt_varlen_pad(kt_varlen_many(), VL_TCAP, cu_pad);
  kt_varlen_pad(kt_varlen_many(), VL_NDOCS, cu);
  static const int cu_one[] = {0, 200};
  for (int causal = 1; causal >= 0; causal--) {
    mg_kernel_spec s = make_varlen_spec(2, 256, 32, causal);
    built_kernel bk;
    build(&s, &bk);
    run_varlen(&bk, VL_TCAP, VL_TCAP, 0, cu_pad, VL_TCAP);
    run_varlen(&bk, VL_TCAP, VL_TCAP, 0, cu_one, 1);
    run_varlen(&bk, 100, VL_TCAP, 150, cu, VL_NDOCS);
    unload(&bk);
  }
  mg_kernel_spec s = make_varlen_spec(5, 256, 32, 1);
  set(&s, "stages=1"), set(&s, "nsplit=4");
  built_kernel bk;
  build(&s, &bk);
  run_varlen(&bk, 120, VL_TCAP, 0, cu, VL_NDOCS);
  unload(&bk);
}

/* Off-by-one document boundaries injected into the packed variant (kt_mutate_edit) must
 * fail the per-element check on the many documents: every row also sees the previous
 * document's last key (non-causal); the CTA's keys end one early (causal: the last one
 * loads as zeros, still unmasked). */
static void test_varlen_mutations_caught(void **state) {
  (void)state;
  kt_mutation muts[] = {
      {"row key range starts one early", "kr.set_keys<CAUSAL>(r, vl, row < rows, q_pos0 + row / H, seqlen_k);", "M_;",
       "#define M_ kr.set_keys<CAUSAL>(r, vl, row < rows, q_pos0 + row / H, seqlen_k), kr.lo[r] -= kr.lo[r] > 0", ""},
      {"CTA key range ends one early", "seqlen_k, j0, n_tiles, k_end);", "M_;",
       "#define M_ seqlen_k, j0, n_tiles, k_end), k_end -= k_end > 0", ""},
  };
  int cu[VL_NDOCS + 1];
  kt_varlen_pad(kt_varlen_many(), VL_NDOCS, cu);
  kt_noise_quiet = 1; /* not noise */
  for (int mi = 0; mi < 2; mi++) {
    const int causal = mi;
    mg_kernel_spec s = make_varlen_spec(2, 256, 32, causal);
    built_kernel bk;
    if (!build_edit(&s, 0, kt_mutate_edit, &muts[mi], &bk)) fail_msg("%s", muts[mi].error);
    fwd_case c;
    case_init(&bk, &c, 1, VL_TCAP, VL_TCAP, 0);
    c.cu = cu, c.n_cu = VL_NDOCS;
    launch_case(&bk, &c, NULL);
    double o_err, lse_err;
    char msg[400];
    const size_t nans = case_compare(&bk, &c, &o_err, &lse_err, msg, sizeof msg);
    print_message("  [%s] %s: %s\n", muts[mi].name, causal ? "causal" : "full", msg[0] ? msg : "NOT CAUGHT");
    if (nans) fail_msg("%s: NaN outputs, not a numerical failure", muts[mi].name);
    if (!msg[0]) fail_msg("%s: passes the per-element check", muts[mi].name);
    case_free(&c);
    unload(&bk);
  }
  /* every key tile from 0, masked (the CTA's hull taken from token 0): right per element,
   * caught by the key tiles each CTA reads */
  kt_mutation all = {"every key tile from 0, masked", "q_pos0}, m0 / H, q_last,", "q_pos0}, 0, q_last,", NULL, ""};
  mg_kernel_spec s = make_varlen_spec(2, 256, 32, 1);
  built_kernel bk;
  if (!build_edit(&s, 0, kt_mutate_edit, &all, &bk)) fail_msg("%s", all.error);
  fwd_case c;
  case_init(&bk, &c, 1, VL_TCAP, VL_TCAP, 0);
  c.cu = cu, c.n_cu = VL_NDOCS;
  double secs, o_err, lse_err;
  char tmsg[300], msg[400];
  const int tiles_ok = launch_watched(&bk, &c, &secs, tmsg, sizeof tmsg);
  const size_t nans = case_compare(&bk, &c, &o_err, &lse_err, msg, sizeof msg);
  print_message("  [%s] causal: per element %s; %s\n", all.name, nans || msg[0] ? "FAILS" : "passes",
                tiles_ok ? "tiles NOT CAUGHT" : tmsg);
  if (nans || msg[0]) fail_msg("%s: fails the per-element check (%s)", all.name, msg);
  if (tiles_ok) fail_msg("%s: its key tiles pass the hull check", all.name);
  case_free(&c);
  unload(&bk);
  kt_noise_quiet = 0;
}

/* Deterministic kernel, any schedule: the same bits. Round robin and three seeds, both
 * pipelines. */
static void test_schedules_bit_identical(void **state) {
  (void)state;
  for (int stages = 1; stages <= 2; stages++) {
    mg_kernel_spec s = make_spec(2, 256, 32, 1);
    set(&s, stages == 1 ? "stages=1" : "stages=2");
    built_kernel bk;
    build(&s, &bk);
    fwd_case c;
    case_init(&bk, &c, 2, 37, 37, 0);
    mg_host_launch_opts lo;
    memset(&lo, 0, sizeof lo);
    lo.round_robin = 1;
    double secs = launch_case(&bk, &c, &lo);
    check_case(&bk, &c, secs);
    kt_snapshot o0 = {.n = 2, .p = {c.o, c.lse},
                      .size = {c.no * sizeof *c.o, c.nl * sizeof *c.lse}};
    kt_snapshot_take(&o0);
    const unsigned long long seeds[] = {1, 2, 0x9e3779b97f4a7c15ull};
    for (int i = 0; i < 3; i++) {
      memset(&lo, 0, sizeof lo);
      lo.seed = seeds[i];
      launch_case(&bk, &c, &lo);
      if (!kt_snapshot_same(&o0))
        fail_msg("%s: schedule seed %llu gives other bits than round robin", bk.kh.name, seeds[i]);
    }
    print_message("  %s: round robin and seeds 1, 2, 0x9e37...: O and LSE bit-identical\n",
                  bk.kh.name);
    kt_snapshot_free(&o0);
    case_free(&c);
    unload(&bk);
  }
}

/* The kernel with one of its barriers removed (each __syncthreads, and the epilogue's
 * __syncwarp: O rows staged in shared memory by other lanes), for each barrier, both
 * pipelines, with no exemption: every shuffled schedule (NaN-filled shared memory, copies landing at random
 * points between issue and wait, several blocks resident) must give a wrong result,
 * whether the barrier publishes data to other warps (copied tiles, the row max or sum
 * parts, P) or guards the single K buffer against the next copy into it (write after
 * read). */
static void test_missing_barrier_caught(void **state) {
  (void)state;
  for (int stages = 1; stages <= 2; stages++) {
    mg_kernel_spec s = make_spec(2, 256, 32, 1);
    set(&s, stages == 1 ? "stages=1" : "stages=2");
    int n = 0, required = 0, n_warp = 0;
    for (int which = 0;; which++) {
      built_kernel bk;
      int publishes = 0, warp = 0;
      if (!build_src(&s, 0, which, &publishes, &warp, &bk)) break;
      n++;
      n_warp += warp;
      required += publishes;
      fwd_case c;
      case_init(&bk, &c, 2, 100, 100, 0); /* two key tiles: the K buffer is refilled */
      mg_host_launch_opts lo;
      memset(&lo, 0, sizeof lo);
      int caught = 0;
      size_t nans = 0;
      double o_err = 0, lse_err = 0;
      for (unsigned long long seed = 1; seed <= 3; seed++) {
        lo.seed = seed;
        launch_case(&bk, &c, &lo);
        nans = case_errors(&bk, &c, &o_err, &lse_err);
        caught += nans || o_err > 1 || lse_err > 1;
      }
      print_message("  stages=%d without barrier %d (%s%s): caught by %d of 3 seeds (last: %zu NaN, "
                    "O err %.2e)\n", stages, which, warp ? "__syncwarp, " : "",
                    publishes ? "publishes" : "write after read", caught, nans, o_err);
      if (caught < 3)
        fail_msg("stages=%d: barrier %d removed, yet some schedule gives the right result",
                 stages, which);
      case_free(&c);
      unload(&bk);
    }
    assert_true(n >= 4 && required >= 4 && n_warp == 1);
  }
}

/* Mutation tests (issue 12): a bug injected into the rendered mqa_fwd by a string edit
 * (kt_mutate_edit: the pattern must match exactly once) must fail the per-element check on
 * every shape of the suite with keys and more than one row, for a numerical reason: the
 * mutated kernel compiles, launches and completes without NaN, and O or LSE is off. */
static kt_mutation g_fwd_mutations[] = {
    {"causal mask off by one in the last partial row tile",
     "(r0 + g + (e >> 1) * 8) / H, seqlen_k", "M_, seqlen_k",
     "#define M_ ((r0 + g + (e >> 1) * 8) / H + (m0 + BLOCK_M > seqlen_q * H))", ""},
    {"the k_rope part of the scores dropped", "mla::warp_gemm_abt<elem_t, DQK, KW,",
     "mla::warp_gemm_abt<elem_t, DC, KW,", NULL, ""},
};

static void test_mutations_caught(void **state) {
  (void)state;
  static const int shapes[][4] = {{2, 37, 37, 0}, {1, 20, 50, 30}, {2, 13, 13, 0}, {1, 7, 40, 33},
                                  {1, 20, 70, 50}, {2, 77, 77, 0}};
  kt_noise_quiet = 1; /* not noise: kt_noise_report leaves these out */
  for (size_t mi = 0; mi < sizeof g_fwd_mutations / sizeof g_fwd_mutations[0]; mi++) {
    kt_mutation *m = &g_fwd_mutations[mi];
    mg_kernel_spec s = make_spec(2, 256, 32, 1);
    built_kernel bk;
    if (!build_edit(&s, 0, kt_mutate_edit, m, &bk)) fail_msg("%s", m->error);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
      fwd_case c;
      case_init(&bk, &c, shapes[si][0], shapes[si][1], shapes[si][2], shapes[si][3]);
      launch_case(&bk, &c, NULL);
      double o_err, lse_err;
      char msg[400];
      const size_t nans = case_compare(&bk, &c, &o_err, &lse_err, msg, sizeof msg);
      print_message("  [%s] B=%d S_q=%d S_k=%d q_pos0=%d: %s\n", m->name, c.B, c.sq, c.sk,
                    c.q_pos0, msg[0] ? msg : "NOT CAUGHT");
      if (nans) fail_msg("%s: NaN outputs, not a numerical failure", m->name);
      if (!msg[0]) fail_msg("%s: passes the per-element check", m->name);
      case_free(&c);
    }
    unload(&bk);
  }
  kt_noise_quiet = 0;
}

/* The child side of test_asan: an ASan build on small cases, in a process that has the
 * ASan runtime preloaded. */
static void asan_case_run(void **state) {
  (void)state;
  for (int causal = 1; causal >= 0; causal--) {
    mg_kernel_spec s = make_spec(2, 256, 32, causal);
    if (!causal) set(&s, "nsplit=4"), set(&s, "block_n=32"), set(&s, "stages=1");
    built_kernel bk;
    build_ex(&s, 1, &bk);
    run_case(&bk, 2, 37, 37, 0);
    run_case(&bk, 1, 20, 70, 50);
    unload(&bk);
  }
  /* the packed variant: its reads of cu_seqlens and of the rows its ranges name */
  int cu[VL_NDOCS + 1];
  kt_varlen_pad(kt_varlen_many(), VL_NDOCS, cu);
  mg_kernel_spec s = make_varlen_spec(2, 256, 32, 1);
  built_kernel bk;
  build_ex(&s, 1, &bk);
  run_varlen(&bk, 100, VL_TCAP, 200, cu, VL_NDOCS);
  unload(&bk);
}

/* ASan finds no out-of-bounds global or dynamic shared-memory access in the kernel. */
static void test_asan(void **state) {
  (void)state;
  kh_run_asan_child("test_mqa_fwd", g_test_seed, asan_case_run);
}

/* An MLA shape unlike DeepSeek's (d_c 256, d_r 32, 40 heads), as in test_attn_fwd.c. */
static const char unusual_json[] =
    "{\"model_type\": \"minicpm3\", \"num_attention_heads\": 40, \"kv_lora_rank\": 256,"
    " \"qk_rope_head_dim\": 32, \"qk_nope_head_dim\": 64, \"v_head_dim\": 64,"
    " \"q_lora_rank\": 768, \"hidden_size\": 2560}";

/* The configurations of the tunable space that the template's check keeps compile for
 * sm_80 and sm_90a without spills or a stack frame (causal: the larger kernel), for the
 * DeepSeek-V3 shape (H 128, 576/512) and the unusual one (H 40, 288/256). Every
 * configuration is rendered (the check runs on all); the default and a covering sample are
 * compiled (kh_sweep_cover: every tunable value and pair of values for DeepSeek-V3, every
 * single value for the unusual shape, and the most shared memory), all of them with
 * MLAGEN_TEST_EXHAUSTIVE=1 (ctest -C exhaustive -L exhaustive).
 * The JIT cache ($MLAGEN_CACHE_DIR) is used: a second run reads the cubins back. */
static void test_nvrtc_all_kept_configs(void **state) {
  (void)state;
  const char *models[] = {"deepseek-v3", NULL};
  const int block_m[] = {32, 64}, block_n[] = {32, 64}, nsplit[] = {2, 4};
  kh_sweep sw;
  kh_sweep_open(&sw, 58, KH_SWEEP_SMEM | KH_SWEEP_REJECTS);
  sw.max_smem = 163 * 1024;
  int kept = 0;
  for (int m = 0; m < 2; m++) {
    mg_shape shape;
    kh_load_shape(models[m], unusual_json, &shape);
    mg_kernel_spec base = make_spec(shape.heads, shape.kv_lora_rank, shape.qk_rope_head_dim, 1);
    /* the default first, then a covering sample of the space */
    mg_kernel_spec cands[16];
    kh_sweep_compile(&sw, &base, "default ");
    for (int i = 0; i < 16; i++) {
      mg_kernel_spec s = base;
      kh_setf(&s, "block_m=%d", block_m[i & 1]);
      kh_setf(&s, "block_n=%d", block_n[(i >> 1) & 1]);
      kh_setf(&s, "nsplit=%d", nsplit[(i >> 2) & 1]);
      kh_setf(&s, "stages=%d", 1 + ((i >> 3) & 1));
      cands[i] = s;
    }
    /* pairs of values for DeepSeek-V3, single values for the other (as test_attn_bwd) */
    sw.flags = KH_SWEEP_SMEM | KH_SWEEP_REJECTS | (m ? KH_SWEEP_SINGLES : 0);
    kept += kh_sweep_cover(&sw, cands, 16, g_test_seed, "");
  }
  print_message("  %d configurations kept, %d rejected by the template's check (%.0f s)\n", kept,
                sw.rejected, kh_now() - sw.t0);
  assert_true(kept >= 20);
  kh_sweep_close(&sw);
}

/* The packed variant of the defaults compiles for sm_80 and sm_90a without spills or a
 * stack frame (causal: the larger kernel), for the DeepSeek-V3 shape (H 128, 576/512) and
 * the unusual one (H 40, 288/256); the non-causal one too at DeepSeek-V3's. */
static void test_nvrtc_varlen(void **state) {
  (void)state;
  kh_sweep sw;
  kh_sweep_open(&sw, 66, KH_SWEEP_SMEM);
  sw.max_smem = 163 * 1024;
  for (int m = 0; m < 2; m++) {
    mg_shape shape;
    kh_load_shape(m ? NULL : "deepseek-v3", unusual_json, &shape);
    mg_kernel_spec s = make_varlen_spec(shape.heads, shape.kv_lora_rank, shape.qk_rope_head_dim, 1);
    assert_true(kh_sweep_compile(&sw, &s, "varlen "));
    if (m) continue;
    s = make_varlen_spec(shape.heads, shape.kv_lora_rank, shape.qk_rope_head_dim, 0); /* non-causal */
    assert_true(kh_sweep_compile(&sw, &s, "varlen "));
  }
  kh_sweep_close(&sw);
}

/* Rejections: shared memory and the accumulator budget at 576/512; a d_c that nsplit
 * does not divide into 16-column parts. */
static void test_check_rejects(void **state) {
  (void)state;
  mg_diag d = MG_DIAG_INIT;
  mg_gen *g;
  assert_int_equal(mg_gen_open(&g, NULL, &d), 0);
  mg_kernel k;
  mg_kernel_spec s = make_spec(128, 512, 64, 1);
  set(&s, "block_n=64");
  set(&s, "stages=2");
  assert_int_equal(mg_gen_kernel(g, &s, &k, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "bytes of shared memory"));
  print_message("  %s\n", mg_diag_msg(&d));
  s = make_spec(128, 512, 64, 1);
  set(&s, "nsplit=4"); /* 16 warps: 72 accumulators over 64 */
  assert_int_equal(mg_gen_kernel(g, &s, &k, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "accumulators per thread"));
  print_message("  %s\n", mg_diag_msg(&d));
  s = make_spec(16, 32, 16, 1); /* d_c 32: nsplit 4 would give 8-column parts */
  set(&s, "nsplit=4");
  assert_int_equal(mg_gen_kernel(g, &s, &k, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "multiple of 16 * nsplit"));
  mg_diag_clear(&d);
  mg_gen_close(g);
}

int main(int argc, char **argv) {
  kt_seed_init();
  const int rc = kh_test_main(argc, argv, asan_case_run);
  if (rc >= 0) return rc;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_deepseek),
      cmocka_unit_test(test_dc256),
      cmocka_unit_test(test_h128),
      cmocka_unit_test(test_configs),
      cmocka_unit_test(test_fp16),
      cmocka_unit_test(test_schedules_bit_identical),
      cmocka_unit_test(test_missing_barrier_caught),
      cmocka_unit_test(test_check_rejects),
      cmocka_unit_test(test_nvrtc_all_kept_configs),
      cmocka_unit_test(test_asan),
      cmocka_unit_test(test_mutations_caught),
      cmocka_unit_test(test_varlen),
      cmocka_unit_test(test_varlen_mutations_caught),
      cmocka_unit_test(test_nvrtc_varlen),
  };
  return kh_exit_code(cmocka_run_group_tests(tests, NULL, kt_noise_teardown));
}
