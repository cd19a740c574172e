/* test_attn_fwd.c: the tensor-core attention forward (templates/attn_fwd.cu.tpl), run
 * unchanged on the CPU through the host executor (tests/host/, mma.sync, ldmatrix and
 * cp.async emulated with the PTX fragment layouts), against a float64 reference; and every
 * configuration its check keeps, compiled by NVRTC for sm_80 and sm_90a without spills.
 *
 * Inputs are fresh random bf16 (or fp16) values, scores with standard deviation 2 under
 * DeepSeek's YaRN softmax scale (the seed is printed, MLAGEN_TEST_SEED overrides it). The
 * reference (tests/attn_ref.h) computes from the same rounded values in double precision,
 * so the kernel's error is its fp32 accumulation, the 16-bit rounding of P before P V and
 * the rounding of O; O and LSE are compared per element (kt_check; the figures at tol_o).
 * test_mutations_caught injects bugs into the rendered kernel and requires the check to
 * fail. Launches use the executor's shuffled schedule with shared memory
 * NaN-filled before each block; other schedules must give bit-identical O and LSE. Both key
 * layouts are checked: k_packed = 0 (per-head k_nope + k_rope shared by the heads) and
 * k_packed = 1 (one per-head K [B, S_k, H, d_n + d_r]); split keys read k_rope at column
 * KT_ROPE_COL of NaN-filled rows (ld_k_rope = KT_ROPE_COL + d_r; one contiguous case), and a
 * kernel ignoring ld_k_rope is caught. One small case also runs in a
 * child process (this program, --asan-case) built with ASan, when the compiler has an
 * ASan runtime: the dynamic shared memory is then bounds-checked at the launch's size. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_ref.h"
#include "kernel_host.h"
#include "kernel_test_util.h"
#include "mlagen.h"

typedef void (*attn_fwd_fn)(const e16 *q, const e16 *k_nope, const e16 *k_rope, const e16 *v,
                            e16 *o, float *lse, int seqlen_q, int seqlen_k, int q_pos0,
                            int q_split, int q_pos1, float softmax_scale);

/* The varlen variant (spec.varlen): the same, then cu_seqlens and n_seqs. */
typedef void (*attn_fwd_varlen_fn)(const e16 *q, const e16 *k_nope, const e16 *k_rope,
                                   const e16 *v, e16 *o, float *lse, int seqlen_q, int seqlen_k,
                                   int q_pos0, int q_split, int q_pos1, float softmax_scale,
                                   const int *cu_seqlens, int n_seqs);

/* Split keys (k_packed = 0): the same with k_rope's row stride ld_k_rope after k_rope. */
typedef void (*attn_fwd_split_fn)(const e16 *q, const e16 *k_nope, const e16 *k_rope,
                                  int ld_k_rope, const e16 *v, e16 *o, float *lse, int seqlen_q,
                                  int seqlen_k, int q_pos0, int q_split, int q_pos1,
                                  float softmax_scale);
typedef void (*attn_fwd_split_varlen_fn)(const e16 *q, const e16 *k_nope, const e16 *k_rope,
                                         int ld_k_rope, const e16 *v, e16 *o, float *lse,
                                         int seqlen_q, int seqlen_k, int q_pos0, int q_split,
                                         int q_pos1, float softmax_scale, const int *cu_seqlens,
                                         int n_seqs);

typedef struct launch_args {
  void *fn; /* attn_fwd_fn, or attn_fwd_varlen_fn when cu is set (split keys: the _split_ ones) */
  const e16 *q, *kn, *kr, *v;
  e16 *o;
  float *lse;
  int sq, sk, q_pos0, q_split, q_pos1;
  float scale;
  const int *cu; /* varlen: cu_seqlens [n_cu + 1] */
  int n_cu;
  int ld_kr; /* split keys: ld_k_rope; 0: packed keys (no such parameter) */
} launch_args;

static void thunk(void *p) {
  launch_args *a = p;
  if (a->ld_kr && a->cu) {
    attn_fwd_split_varlen_fn f;
    *(void **)&f = a->fn;
    f(a->q, a->kn, a->kr, a->ld_kr, a->v, a->o, a->lse, a->sq, a->sk, a->q_pos0, a->q_split,
      a->q_pos1, a->scale, a->cu, a->n_cu);
  } else if (a->ld_kr) {
    attn_fwd_split_fn f;
    *(void **)&f = a->fn;
    f(a->q, a->kn, a->kr, a->ld_kr, a->v, a->o, a->lse, a->sq, a->sk, a->q_pos0, a->q_split,
      a->q_pos1, a->scale);
  } else if (a->cu) {
    attn_fwd_varlen_fn f;
    *(void **)&f = a->fn;
    f(a->q, a->kn, a->kr, a->v, a->o, a->lse, a->sq, a->sk, a->q_pos0, a->q_split, a->q_pos1,
      a->scale, a->cu, a->n_cu);
  } else {
    attn_fwd_fn f;
    *(void **)&f = a->fn;
    f(a->q, a->kn, a->kr, a->v, a->o, a->lse, a->sq, a->sk, a->q_pos0, a->q_split, a->q_pos1,
      a->scale);
  }
}

typedef struct built_kernel {
  kh_kernel kh; /* threads, smem (dynamic shared memory per block), name, spec */
  attn_fwd_fn fn;
  int block_m, packed;
} built_kernel;

static int is_fp16(const mg_kernel_spec *s) { return strcmp(s->dtype, "fp16") == 0; }

/* Generates the kernel for spec and builds it with the host executor (once per test run:
 * the harness keys its objects by content). drop >= 0: without that barrier (returns 0
 * when there is none; *after_wait: it published cp.async data). */
static int build_edit(const mg_kernel_spec *spec, int asan, kh_edit_fn edit, void *ctx,
                      built_kernel *out);

static int build_src(const mg_kernel_spec *spec, int asan, int drop, int *after_wait,
                     int *warp, built_kernel *out) {
  kh_drop dr = {.which = drop};
  if (!build_edit(spec, asan, drop >= 0 ? kh_drop_edit : NULL, &dr, out)) return 0;
  if (after_wait) *after_wait = dr.after_wait;
  if (warp) *warp = dr.warp;
  return 1;
}

/* build_src with any edit of the source (NULL: none); returns 0 when the edit declined. */
static int build_edit(const mg_kernel_spec *spec, int asan, kh_edit_fn edit, void *ctx,
                      built_kernel *out) {
  if (!kh_build_edited(NULL, spec, asan, edit, ctx, &out->kh)) return 0;
  out->block_m = kh_config_int(&out->kh, "block_m");
  out->packed = kh_config_int(&out->kh, "k_packed");
  assert_int_equal(out->kh.threads, 32 * kh_config_int(&out->kh, "num_warps"));
  assert_int_equal(kh_launch_value(&out->kh, "smem_static"), 0);
  *(void **)&out->fn = out->kh.fn;
  return 1;
}

static void build_ex(const mg_kernel_spec *spec, int asan, built_kernel *out) {
  build_src(spec, asan, -1, NULL, NULL, out);
}

static void build(const mg_kernel_spec *spec, built_kernel *out) { build_ex(spec, 0, out); }

static void unload(built_kernel *bk) { kh_free(&bk->kh); }

/* One case's tensors: random inputs, outputs NaN until the kernel writes them.
 * Split keys: kn [B, S_k, H, d_n], kr [B, S_k, d_r]; the kernel reads kr from kr_buf
 * (kt_rope_strided, made at each launch: at column KT_ROPE_COL of NaN-filled rows, or
 * contiguous when kr_contig). Packed: kn [B, S_k, H, d_n + d_r] (a RoPE part per head), kr
 * NULL. Query row i at q_pos0 + i, or with two chunks (q_split > 0) at q_pos1 + i - q_split
 * from row q_split on (attn_ref_pos). */
typedef struct fwd_case {
  int B, sq, sk, q_pos0, q_split, q_pos1;
  int *cu; /* varlen (case_varlen): cu_seqlens [n_cu + 1] (malloc'd), else NULL */
  int n_cu;
  float scale;
  e16 *q, *kn, *kr, *v, *o;
  e16 *kr_buf;   /* split keys: what the kernel reads k_rope from (launch_case) */
  int kr_contig; /* 1: ld_k_rope = d_r; 0: d_r + KT_ROPE_COL, NaN between the rows */
  float *lse;
  size_t no, nl;
  int poisoned; /* 1: the last batch item's inputs are NaN (poison_last): not compared */
} fwd_case;

/* The k_rope layout of the split-key cases case_init_pos makes: 0 (wide, NaN around each
 * row) but for check_shape's case with every tile full. */
static int g_kr_contig;

static void case_init_pos(const built_kernel *bk, fwd_case *c, int B, int sq, int sk,
                          const kt_qpos *pos) {
  const mg_kernel_spec *s = &bk->kh.spec;
  const int H = s->heads, dqk = s->d_n + s->d_r, f16 = is_fp16(s);
  c->B = B, c->sq = sq, c->sk = sk;
  c->q_pos0 = pos->q_pos0, c->q_split = pos->q_split, c->q_pos1 = pos->q_pos1;
  c->cu = NULL, c->n_cu = 0; /* not packed (case_varlen sets them) */
  c->kr_buf = NULL, c->kr_contig = g_kr_contig, c->poisoned = 0;
  c->scale = (float)kt_softmax_scale(dqk); /* YaRN mscale^2 / sqrt(d_qk) */
  c->q = kt_rand_e16_sd(f16, (size_t)B * sq * H * dqk, kt_q_sd(c->scale, dqk)); /* scores sd 2 */
  if (bk->packed) {
    c->kn = kt_rand_e16_sd(f16, (size_t)B * sk * H * dqk, 1);
    c->kr = NULL;
  } else {
    c->kn = kt_rand_e16_sd(f16, (size_t)B * sk * H * s->d_n, 1);
    c->kr = kt_rand_e16_sd(f16, (size_t)B * sk * s->d_r, 1);
  }
  c->v = kt_rand_e16_sd(f16, (size_t)B * sk * H * s->d_v, 1);
  c->no = (size_t)B * sq * H * s->d_v;
  c->nl = (size_t)B * H * sq;
  c->o = malloc((c->no ? c->no : 1) * sizeof *c->o);
  c->lse = malloc((c->nl ? c->nl : 1) * sizeof *c->lse);
}

/* One chunk: row i at q_pos0 + i. */
static void case_init(const built_kernel *bk, fwd_case *c, int B, int sq, int sk, int q_pos0) {
  case_init_pos(bk, c, B, sq, sk, &(kt_qpos){q_pos0, 0, 0});
}

/* Batch isolation (B > 1): NaN in every input of c's last batch item; case_compare then
 * checks the items before it, which the NaN must not reach (a CTA's tile rows past its item's
 * end must not bring the next item's queries or keys in: 0 * NaN would be NaN). */
static void poison_last(const built_kernel *bk, fwd_case *c) {
  const mg_kernel_spec *s = &bk->kh.spec;
  kt_nan_last_item_attn(c->B, c->sq, c->sk, s->heads, s->d_n, s->d_r, s->d_v, bk->packed, c->q,
                        c->kn, c->kr, c->v);
  c->poisoned = c->B > 1;
}

static void case_free(fwd_case *c) {
  free(c->q), free(c->kn), free(c->kr), free(c->v), free(c->o), free(c->lse), free(c->cu);
  free(c->kr_buf);
}

/* float64 reference (tests/attn_ref.h) from the rounded inputs: o [B, Sq, H, dv], lse
 * [B, H, Sq] (a row without keys: 0, -inf). Each head's K is [k_nope ; k_rope] (split:
 * the shared k_rope). */
static void reference(const built_kernel *bk, const fwd_case *c, double *o, double *lse) {
  const mg_kernel_spec *s = &bk->kh.spec;
  const int H = s->heads, dn = s->d_n, dr = s->d_r, dqk = dn + dr, f16 = is_fp16(s);
  const attn_ref_dims d = {c->B,     c->sq,    c->sk,         H,         dqk, s->d_v,
                           s->causal, c->q_pos0, c->scale, c->q_split, c->q_pos1};
  const attn_ref_docs docs = {c->cu, c->n_cu}, *dp = c->cu ? &docs : NULL;
  const size_t nk = (size_t)c->B * c->sk * H;
  double *q = kt_e16_to_d(f16, c->q, (size_t)c->B * c->sq * H * dqk);
  double *v = kt_e16_to_d(f16, c->v, nk * s->d_v);
  double *k = kt_k_to_d(f16, bk->packed, c->kn, c->kr, nk, H, dn, dr);
  attn_ref_fwd_docs(&d, dp, q, k, v, o, lse);
  free(q), free(k), free(v);
}

/* Launches the kernel on c (outputs first set to NaN) with lo (NULL: the executor's
 * defaults); returns the wall time of the launch. */
static double launch_case(const built_kernel *bk, fwd_case *c, const mg_host_launch_opts *lo) {
  for (size_t i = 0; i < c->no; i++) c->o[i] = 0x7fff; /* NaN in bf16 and fp16 */
  for (size_t i = 0; i < c->nl; i++) c->lse[i] = NAN;
  const kt_qpos kp = kt_qpos_kernel(&(kt_qpos){c->q_pos0, c->q_split, c->q_pos1});
  const e16 *kr;
  int ld;
  free(c->kr_buf);
  c->kr_buf = kt_rope_strided(c->kr, (size_t)c->B * c->sk, bk->kh.spec.d_r, !c->kr_contig, &kr, &ld);
  launch_args a = {bk->kh.fn, c->q,       c->kn,      kr,       c->v,  c->o,   c->lse, c->sq,
                   c->sk,     kp.q_pos0, kp.q_split, kp.q_pos1, c->scale, c->cu, c->n_cu, ld};
  mg_host_dim3 grid = {(unsigned)((c->sq + bk->block_m - 1) / bk->block_m),
                       (unsigned)bk->kh.spec.heads, (unsigned)c->B};
  return kh_launch(&bk->kh, grid, lo, thunk, &a);
}

/* Tolerances (per element: |err| <= atol_frac * rms(O) + rtol |ref|; kernel_test_util.h).
 * O is stored in 16 bits: rtol = 2 u (the storage rounding plus one flipped 16-bit P).
 * atol_frac is twice NOISE_O, the largest noise figure (max (|err| - rtol |ref|) / rms)
 * measured by kt_noise_report over every case of the numeric tests of this file
 * (MLAGEN_TEST_SEED 21-24, host executor, bf16 and fp16): 6.0e-3 (the online softmax
 * rounds P to 16 bits against a running maximum, which no reference can follow). LSE
 * (fp32): |err| <= 1e-5 (1 + |ref|); the largest measured was 0.05 of that bound. */
#define NOISE_O 6e-3
static kt_tol tol_o(const mg_kernel_spec *s) {
  return (kt_tol){2 * NOISE_O, 2 * kt_unit_roundoff(is_fp16(s) ? KT_F16 : KT_BF16)};
}
static const kt_tol tol_lse = {1e-5, 1e-5};

/* Compares c's outputs with the reference per element; *o_err, *lse_err: the worst
 * err / bound of O and LSE (over 1 fails); returns the number of NaN outputs. The first
 * failure's message goes to msg (when not NULL, msg[0] = 0 when both pass). */
static size_t case_compare(const built_kernel *bk, const fwd_case *c, double *o_err,
                           double *lse_err, char *msg, size_t msg_n) {
  const mg_kernel_spec *s = &bk->kh.spec;
  double *ro = malloc((c->no ? c->no : 1) * sizeof *ro), *rl = malloc((c->nl ? c->nl : 1) * sizeof *rl);
  reference(bk, c, ro, rl);
  const size_t keep = (size_t)(c->B - c->poisoned); /* the items compared */
  const size_t nans = kt_check_fwd("attn_fwd", is_fp16(s) ? KT_F16 : KT_BF16, c->o, ro,
                                   c->no / c->B * keep, (size_t)s->d_v, c->lse, rl,
                                   c->nl / c->B * keep, tol_o(s), tol_lse, o_err, lse_err, msg,
                                   msg_n);
  free(ro), free(rl);
  return nans;
}

/* The old name, for test_missing_barrier_caught: the worst err / bound of O and LSE. */
static size_t case_errors(const built_kernel *bk, const fwd_case *c, double *o_err,
                          double *lse_err) {
  kt_noise_quiet = 1; /* a kernel without a barrier: its errors are not noise */
  const size_t nans = case_compare(bk, c, o_err, lse_err, NULL, 0);
  kt_noise_quiet = 0;
  return nans;
}

/* Checks O and LSE per element (tol_o, tol_lse). */
static void check_case(const built_kernel *bk, const fwd_case *c, double secs) {
  double o_err, lse_err;
  char msg[400];
  size_t nans = case_compare(bk, c, &o_err, &lse_err, msg, sizeof msg);
  print_message("  %s B=%d S_q=%d S_k=%d q_pos0=%d q_split=%d q_pos1=%d: err/bound O %.2f LSE %.2f "
                "(%.2f s)\n", bk->kh.name + strlen("mla_attn_fwd_"), c->B, c->sq, c->sk, c->q_pos0,
                c->q_split, c->q_pos1, o_err, lse_err, secs);
  if (nans) fail_msg("%zu NaN outputs", nans);
  if (msg[0]) fail_msg("%s", msg);
}

/* Runs one case with the default schedule and checks it. */
static double run_case_pos(const built_kernel *bk, int B, int sq, int sk, const kt_qpos *pos) {
  fwd_case c;
  case_init_pos(bk, &c, B, sq, sk, pos);
  double secs = launch_case(bk, &c, NULL);
  check_case(bk, &c, secs);
  case_free(&c);
  return secs;
}
static double run_case(const built_kernel *bk, int B, int sq, int sk, int q_pos0) {
  return run_case_pos(bk, B, sq, sk, &(kt_qpos){q_pos0, 0, 0});
}
/* run_case with the last batch item's inputs NaN (poison_last). */
static void run_case_poisoned(const built_kernel *bk, int B, int sq, int sk, int q_pos0) {
  fwd_case c;
  case_init(bk, &c, B, sq, sk, q_pos0);
  poison_last(bk, &c);
  double secs = launch_case(bk, &c, NULL);
  check_case(bk, &c, secs);
  case_free(&c);
}

static mg_kernel_spec make_spec(int H, int dn, int dr, int dv, int causal) {
  mg_kernel_spec s;
  memset(&s, 0, sizeof s);
  snprintf(s.family, sizeof s.family, "attn_fwd");
  s.heads = H, s.d_n = dn, s.d_r = dr, s.d_v = dv, s.d_c = 512, s.causal = causal;
  snprintf(s.dtype, sizeof s.dtype, "bf16");
  return s;
}

static void set(mg_kernel_spec *s, const char *assignment) { kh_set(s, assignment); }

/* The shape's default configuration, both key layouts, causal and not, on: S = 1 (one key
 * per row), S = 77 (no tile divides it) with batch 2, and again with NaN in every input of
 * item 1 (item 0 checked: batch isolation), a query shard at global position 60
 * of 100 keys (S_q < S_k, causal rows see 61.. keys), a shard at 130 (a 64-row CTA whose
 * keys span three 64-key tiles with the diagonal inside one), and no keys at all (o = 0,
 * lse = -inf). */
static void check_shape(int dn, int dr, int dv) {
  for (int packed = 0; packed <= 1; packed++)
    for (int causal = 1; causal >= 0; causal--) {
      mg_kernel_spec s = make_spec(2, dn, dr, dv, causal);
      if (packed) set(&s, "k_packed=1");
      built_kernel bk;
      build(&s, &bk);
      run_case(&bk, 1, 1, 1, 0);
      run_case(&bk, 2, 77, 77, 0);
      run_case_poisoned(&bk, 2, 77, 77, 0);
      run_case(&bk, 1, 40, 100, 60);
      run_case(&bk, 1, 70, 200, 130);
      g_kr_contig = 1; /* split keys: the one contiguous k_rope (ld_k_rope = d_r) */
      run_case(&bk, 1, 128, 128, 0); /* every tile full */
      g_kr_contig = 0;
      run_case(&bk, 1, 5, 0, 0);
      unload(&bk);
    }
}

/* DeepSeek-V2-Lite / V3 / Kimi K2 head shape. */
static void test_deepseek_heads(void **state) { (void)state; check_shape(128, 64, 128); }
/* An unusual MLA shape. */
static void test_unusual_heads(void **state) { (void)state; check_shape(64, 32, 64); }

/* Other tunable configurations (every block_m, block_n, stages and key layout appears)
 * give right answers, causal and not, on the awkward sizes. */
static void test_configs(void **state) {
  (void)state;
  static const struct {
    int dn, dr, dv;
    const char *set[4];
  } cfgs[] = {
      {128, 64, 128, {"block_m=128", "num_warps=8", "block_n=32", "stages=1"}},
      {128, 64, 128, {"block_m=64", "num_warps=4", "block_n=128", "stages=1"}},
      {128, 64, 128, {"block_m=128", "num_warps=8", "block_n=64", "k_packed=1"}},
      {64, 32, 64, {"block_m=128", "num_warps=8", "block_n=128", "stages=2"}},
      {64, 32, 64, {"block_m=64", "num_warps=4", "block_n=32", "k_packed=1"}},
      {64, 32, 64, {"block_m=64", "num_warps=4", "block_n=128", "stages=1"}},
  };
  for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++)
    for (int causal = 1; causal >= 0; causal--) {
      mg_kernel_spec s = make_spec(2, cfgs[i].dn, cfgs[i].dr, cfgs[i].dv, causal);
      for (int j = 0; j < 4; j++) set(&s, cfgs[i].set[j]);
      built_kernel bk;
      build(&s, &bk);
      run_case(&bk, 2, 77, 77, 0);
      run_case(&bk, 1, 150, 300, 150);
      unload(&bk);
    }
}

/* fp16 inputs (the f16 mma): both shapes, causal, default configuration. */
static void test_fp16(void **state) {
  (void)state;
  const int shapes[][3] = {{128, 64, 128}, {64, 32, 64}};
  for (int i = 0; i < 2; i++) {
    mg_kernel_spec s = make_spec(2, shapes[i][0], shapes[i][1], shapes[i][2], 1);
    snprintf(s.dtype, sizeof s.dtype, "fp16");
    built_kernel bk;
    build(&s, &bk);
    run_case(&bk, 2, 77, 77, 0);
    run_case(&bk, 1, 40, 100, 60);
    unload(&bk);
  }
}

/* Deterministic kernel, any schedule: the same bits. Round robin and three seeds, both
 * pipelines. */
static void test_schedules_bit_identical(void **state) {
  (void)state;
  for (int stages = 1; stages <= 2; stages++)
    for (int causal = 1; causal >= 0; causal--) {
      mg_kernel_spec s = make_spec(2, 128, 64, 128, causal);
      char st[16];
      snprintf(st, sizeof st, "stages=%d", stages);
      set(&s, st);
      built_kernel bk;
      build(&s, &bk);
      fwd_case c;
      case_init(&bk, &c, 2, 77, 77, 0);
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

/* The kernel with one of its barriers removed, for each barrier, with no exemption: every
 * shuffled schedule (NaN-filled shared memory, copies landing at random points between
 * issue and wait, several blocks resident) must give a wrong result, whether the barrier
 * publishes cp.async data (it follows a wait) or guards a buffer against the next copy
 * into it (write after read). Barriers are the __syncthreads and the epilogue's
 * __syncwarp (its lanes' O rows staged in shared memory, then stored by other lanes). */
static void test_missing_barrier_caught(void **state) {
  (void)state;
  for (int stages = 1; stages <= 2; stages++) {
    mg_kernel_spec s = make_spec(2, 128, 64, 128, 1);
    char st[16];
    snprintf(st, sizeof st, "stages=%d", stages);
    set(&s, st);
    int n = 0, required = 0, n_warp = 0;
    for (int which = 0;; which++) {
      built_kernel bk;
      int after_wait = 0, warp = 0;
      if (!build_src(&s, 0, which, &after_wait, &warp, &bk)) break;
      n++;
      n_warp += warp;
      required += after_wait;
      fwd_case c;
      case_init(&bk, &c, 2, 77, 77, 0);
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
                    after_wait ? "publishes copies" : warp ? "publishes O" : "write after read",
                    caught, nans, o_err);
      if (caught < 3)
        fail_msg("stages=%d: barrier %d removed, yet some schedule gives the right result",
                 stages, which);
      case_free(&c);
      unload(&bk);
    }
    assert_true(n >= 2 && required >= 1 && n_warp == 1);
  }
}

/* Mutation tests (issue 12): a bug injected into the rendered attn_fwd by a string edit
 * (kt_mutate_edit: the pattern must match exactly once) must fail the per-element check on
 * every shape of check_shape that has keys and more than one row, for a numerical reason:
 * the mutated kernel compiles, launches and completes without NaN, and O or LSE is off.
 * Both key layouts. */
static kt_mutation g_fwd_mutations[] = {
    {"causal mask off by one in the last partial query tile",
     "qpos(i0 + g + (e >> 1) * 8), seqlen_k, 0))", "qpos(M_), seqlen_k, 0))",
     "#define M_ (i0 + g + (e >> 1) * 8 + (m0 + BLOCK_M > seqlen_q))", ""},
    {"the k_rope part of the scores dropped", "mla::warp_gemm_abt<elem_t, DQK, BLOCK_N,",
     "mla::warp_gemm_abt<elem_t, DN, BLOCK_N,", NULL, ""},
};

/* A split-key kernel that ignores ld_k_rope (k_rope's token rows taken d_r apart, the
 * contiguous layout) fails on the wide k_rope (kt_rope_strided: it reads the NaN between the
 * rows, or other tokens' RoPE parts). Run by test_mutations_caught; the _varlen variant's
 * k_rope goes through the same mla::cp_async_k_tile call. */
static void ld_k_rope_mutation_caught(void) {
  kt_mutation m = {"ld_k_rope ignored", "k_rope, ld_k_rope)", "k_rope, DR)", NULL, ""};
  kt_noise_quiet = 1;
  built_kernel bk;
  mg_kernel_spec s = make_spec(2, 64, 32, 64, 1);
  if (!build_edit(&s, 0, kt_mutate_edit, &m, &bk)) fail_msg("%s", m.error);
  fwd_case c;
  case_init(&bk, &c, 2, 77, 77, 0);
  launch_case(&bk, &c, NULL);
  double o_err, lse_err;
  char msg[400];
  const size_t nans = case_compare(&bk, &c, &o_err, &lse_err, msg, sizeof msg);
  print_message("  [%s] %s: %zu NaN outputs; %s\n", m.name, bk.kh.name, nans, msg[0] ? msg : "NOT CAUGHT");
  if (!nans && !msg[0]) fail_msg("%s: passes the per-element check", m.name);
  case_free(&c);
  unload(&bk);
  kt_noise_quiet = 0;
}

static void test_mutations_caught(void **state) {
  (void)state;
  static const int shapes[][4] = {{2, 77, 77, 0}, {1, 40, 100, 60}, {1, 70, 200, 130}};
  kt_noise_quiet = 1; /* not noise: kt_noise_report leaves these out */
  for (size_t mi = 0; mi < sizeof g_fwd_mutations / sizeof g_fwd_mutations[0]; mi++)
    for (int packed = 0; packed <= 1; packed++) {
      kt_mutation *m = &g_fwd_mutations[mi];
      mg_kernel_spec s = make_spec(2, 64, 32, 64, 1);
      if (packed) set(&s, "k_packed=1");
      built_kernel bk;
      if (!build_edit(&s, 0, kt_mutate_edit, m, &bk)) fail_msg("%s", m->error);
      for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        fwd_case c;
        case_init(&bk, &c, shapes[si][0], shapes[si][1], shapes[si][2], shapes[si][3]);
        launch_case(&bk, &c, NULL);
        double o_err, lse_err;
        char msg[400];
        const size_t nans = case_compare(&bk, &c, &o_err, &lse_err, msg, sizeof msg);
        print_message("  [%s] k_packed=%d B=%d S_q=%d S_k=%d q_pos0=%d: %s\n", m->name, packed,
                      c.B, c.sq, c.sk, c.q_pos0, msg[0] ? msg : "NOT CAUGHT");
        if (nans) fail_msg("%s: NaN outputs, not a numerical failure", m->name);
        if (!msg[0]) fail_msg("%s: passes the per-element check", m->name);
        case_free(&c);
      }
      unload(&bk);
    }
  kt_noise_quiet = 0;
  ld_k_rope_mutation_caught(); /* split keys: the row stride ignored */
}

/* The two-chunk queries of the all-gather context-parallel form (laga-cp): rank r of P
 * holds a rows at r a and b rows at P a + (P - 1 - r) b (kt_qpos_lagacp) over all S =
 * P (a + b) keys; the cases of kt_two_chunk_cases (a CTA straddles the chunks). */
static void run_two_chunk(const built_kernel *bk, int B) {
  const kt_two_chunk *tc;
  const int n = kt_two_chunk_cases(&tc);
  for (int i = 0; i < n; i++) {
    const kt_qpos pos = kt_qpos_lagacp(tc[i].P, tc[i].r, tc[i].a, tc[i].b);
    run_case_pos(bk, B, tc[i].a + tc[i].b, tc[i].P * (tc[i].a + tc[i].b), &pos);
  }
}

/* The DeepSeek heads, causal and not: the default configuration with both key layouts, and
 * block_m 128 (one CTA holds both chunks of a rank) with block_n 32. */
static void test_two_chunk_positions(void **state) {
  (void)state;
  for (int causal = 1; causal >= 0; causal--)
    for (int v = 0; v < 3; v++) {
      mg_kernel_spec s = make_spec(2, 128, 64, 128, causal);
      if (v == 1) set(&s, "k_packed=1");
      if (v == 2) set(&s, "block_m=128"), set(&s, "num_warps=8"), set(&s, "block_n=32");
      built_kernel bk;
      build(&s, &bk);
      run_two_chunk(&bk, v == 0 ? 2 : 1);
      unload(&bk);
    }
}

/* A kernel that ignores the second chunk (every row at q_pos0 + i) fails the check on every
 * two-chunk case with a gap between the chunks (causal: only the mask depends on the
 * positions). The last rank's chunks are adjacent (P = 2, r = 1: q_pos1 = q_pos0 +
 * q_split), where that kernel is right: not run. */
static void test_two_chunk_mutation_caught(void **state) {
  (void)state;
  kt_mutation m = {"second chunk ignored", "qpos{q_pos0, q_split, q_pos1}",
                   "qpos{q_pos0, BIG_, q_pos1}", "#define BIG_ 0x40000000", ""};
  kt_noise_quiet = 1;
  mg_kernel_spec s = make_spec(2, 64, 32, 64, 1);
  built_kernel bk;
  if (!build_edit(&s, 0, kt_mutate_edit, &m, &bk)) fail_msg("%s", m.error);
  const kt_two_chunk *tc;
  const int n = kt_two_chunk_cases(&tc);
  int runs = 0;
  for (int i = 0; i < n; i++) {
    const int P = tc[i].P, a = tc[i].a, b = tc[i].b;
    fwd_case c;
    const kt_qpos pos = kt_qpos_lagacp(P, tc[i].r, a, b);
    if (pos.q_pos1 == pos.q_pos0 + pos.q_split) continue;
    runs++;
    case_init_pos(&bk, &c, 1, a + b, P * (a + b), &pos);
    launch_case(&bk, &c, NULL);
    double o_err, lse_err;
    char msg[400];
    const size_t nans = case_compare(&bk, &c, &o_err, &lse_err, msg, sizeof msg);
    print_message("  [%s] P=%d r=%d a=%d b=%d: %s\n", m.name, P, tc[i].r, a, b,
                  msg[0] ? msg : "NOT CAUGHT");
    if (nans) fail_msg("%s: NaN outputs, not a numerical failure", m.name);
    if (!msg[0]) fail_msg("%s: passes the per-element check", m.name);
    case_free(&c);
  }
  assert_int_equal(runs, 3); /* the cases with a gap between the chunks */
  unload(&bk);
  kt_noise_quiet = 0;
}

/* ---- packed sequences (issue 16): the _varlen variant ------------------------------------- */

/* Makes c (batch 1) a packed-sequence case of the documents vl: the reference takes each
 * row's document from its own loop over cu (attn_ref.h), and every slack row of every input
 * (queries at positions >= T, keys >= T) is NaN, which must reach no output. */
static void case_varlen(const built_kernel *bk, fwd_case *c, const kt_varlen *vl) {
  const mg_kernel_spec *s = &bk->kh.spec;
  const int H = s->heads, dqk = s->d_n + s->d_r, T = vl->cu[vl->n];
  const kt_qpos pos = {c->q_pos0, c->q_split, c->q_pos1};
  c->cu = kt_varlen_copy(vl), c->n_cu = vl->n;
  kt_nan_slack_e16(c->q, c->sq, (size_t)H * dqk, &pos, T);
  kt_nan_slack_e16(c->kn, c->sk, (size_t)H * (bk->packed ? dqk : s->d_n), NULL, T);
  if (c->kr) kt_nan_slack_e16(c->kr, c->sk, (size_t)s->d_r, NULL, T);
  kt_nan_slack_e16(c->v, c->sk, (size_t)H * s->d_v, NULL, T);
}

/* Launches the varlen case c with a watch on the key rows (k_nope) each CTA copies; returns
 * 1 when every CTA read its documents' key tiles and no others (kt_tile_check), else 0 with
 * the reason in msg. */
static int launch_varlen(const built_kernel *bk, fwd_case *c, double *secs, char *msg, size_t msg_n) {
  const mg_kernel_spec *s = &bk->kh.spec;
  const int H = s->heads, gx = (c->sq + bk->block_m - 1) / bk->block_m;
  const size_t row = (size_t)H * (bk->packed ? s->d_n + s->d_r : s->d_n) * sizeof *c->kn;
  kt_tile_watch tw;
  kt_tile_watch_init(&tw, c->kn, row, (size_t)c->sk, (size_t)gx * H);
  *secs = launch_case(bk, c, &tw.lo);
  const kt_qpos pos = {c->q_pos0, c->q_split, c->q_pos1};
  const int ok = kt_tile_check(&tw, gx, H, bk->block_m, 1, c->sq, c->cu, c->n_cu, s->causal, &pos,
                               c->sk, kh_config_int(&bk->kh, "block_n"), msg, msg_n);
  kt_tile_watch_free(&tw);
  return ok;
}

/* One varlen case: the documents vl over KT_VARLEN_CAP keys, sq query rows at pos; the key
 * tiles each CTA reads are checked too. */
static void run_varlen(const built_kernel *bk, const kt_varlen *vl, int sq, const kt_qpos *pos) {
  fwd_case c;
  case_init_pos(bk, &c, 1, sq, KT_VARLEN_CAP, pos);
  case_varlen(bk, &c, vl);
  double secs;
  char msg[300];
  print_message("  documents \"%s\" (T %d of %d):\n", vl->name, vl->cu[vl->n], KT_VARLEN_CAP);
  if (!launch_varlen(bk, &c, &secs, msg, sizeof msg)) fail_msg("%s", msg);
  check_case(bk, &c, secs);
  case_free(&c);
}

/* The varlen spec of test_varlen's configuration v: 0 the default (split keys), 1 block_m
 * 128, block_n 32, one stage, packed keys (several key tiles per document, a CTA over many). */
static mg_kernel_spec varlen_spec(int dn, int dr, int dv, int causal, int v) {
  mg_kernel_spec s = make_spec(2, dn, dr, dv, causal);
  s.varlen = 1;
  if (v == 1) {
    static const char *const a[] = {"block_m=128", "num_warps=8", "block_n=32", "stages=1", "k_packed=1"};
    for (int i = 0; i < 5; i++) set(&s, a[i]);
  }
  return s;
}

/* The varlen variant against the float64 per-document reference, per element, causal and
 * not, two configurations: the documents of kt_varlen_cases (many short ones with an empty
 * one, and one) with queries at 0 .. 299, and the many with laga-cp's two chunks at P = 2
 * (ranks 0 and 1, chunks of 75: documents cut at the chunk boundaries, rank 0's second chunk
 * holding the slack rows); then the DeepSeek heads on the many, causal. Slack rows of every
 * input are NaN; they get o = 0 and lse = -inf, as the reference. */
static void test_varlen(void **state) {
  (void)state;
  const kt_varlen *vl;
  const int nvl = kt_varlen_cases(&vl);
  for (int causal = 1; causal >= 0; causal--)
    for (int v = 0; v < 2; v++) {
      mg_kernel_spec s = varlen_spec(64, 32, 64, causal, v);
      built_kernel bk;
      build(&s, &bk);
      assert_non_null(strstr(bk.kh.name, "_varlen"));
      for (int i = 0; i < nvl; i++) run_varlen(&bk, &vl[i], KT_VARLEN_CAP, &(kt_qpos){0, 0, 0});
      for (int r = 0; r < 2; r++) {
        const kt_qpos pos = kt_qpos_lagacp(2, r, 75, 75);
        run_varlen(&bk, &vl[0], 150, &pos);
      }
      unload(&bk);
    }
  mg_kernel_spec s = varlen_spec(128, 64, 128, 1, 0);
  built_kernel bk;
  build(&s, &bk);
  run_varlen(&bk, &vl[0], KT_VARLEN_CAP, &(kt_qpos){0, 0, 0});
  unload(&bk);
}

/* Document boundaries off by one in the varlen kernel's mask (a row sees the key at its
 * range's end, or the one before its document) fail the per-element check, causal and not,
 * with no NaN (the mutated kernel still never reads a slack row). */
static kt_mutation g_fwd_varlen_mutations[] = {
    {"varlen: the key at a row's range end seen", "if (kr.hides(e >> 1,", "if (M_(e >> 1,",
     "#define M_(r, k) ((k) < kr.lo[r] || (k) > kr.hi[r])", ""},
    {"varlen: the key before a row's document seen", "if (kr.hides(e >> 1,", "if (M_(e >> 1,",
     "#define M_(r, k) ((k) < kr.lo[r] - 1 || (k) >= kr.hi[r])", ""},
};

/* The CTA loops over every key tile from the first one (to its hull's end), masking: right
 * per element, caught by the key tiles it reads. */
static kt_mutation g_fwd_all_tiles = {
    "varlen: every key tile from 0, masked", "mla::varlen_key_tiles<CAUSAL, BLOCK_N>(vl, qpos,", "M_(vl, qpos,",
    "#define M_(...) mla::varlen_key_tiles<CAUSAL, BLOCK_N>(__VA_ARGS__); n_tiles += tile0; tile0 = 0", ""};

static void test_varlen_mutations_caught(void **state) {
  (void)state;
  const kt_varlen *vl;
  kt_varlen_cases(&vl);
  kt_noise_quiet = 1;
  for (size_t mi = 0; mi < sizeof g_fwd_varlen_mutations / sizeof g_fwd_varlen_mutations[0]; mi++)
    for (int causal = 1; causal >= 0; causal--) {
      kt_mutation *m = &g_fwd_varlen_mutations[mi];
      mg_kernel_spec s = varlen_spec(64, 32, 64, causal, 0);
      built_kernel bk;
      if (!build_edit(&s, 0, kt_mutate_edit, m, &bk)) fail_msg("%s", m->error);
      fwd_case c;
      case_init_pos(&bk, &c, 1, KT_VARLEN_CAP, KT_VARLEN_CAP, &(kt_qpos){0, 0, 0});
      case_varlen(&bk, &c, &vl[0]);
      launch_case(&bk, &c, NULL);
      double o_err, lse_err;
      char msg[400];
      const size_t nans = case_compare(&bk, &c, &o_err, &lse_err, msg, sizeof msg);
      print_message("  [%s] %s: %s\n", m->name, causal ? "causal" : "full", msg[0] ? msg : "NOT CAUGHT");
      if (nans) fail_msg("%s: NaN outputs, not a numerical failure", m->name);
      if (!msg[0]) fail_msg("%s: passes the per-element check", m->name);
      case_free(&c);
      unload(&bk);
    }
  {
    const int causal = 1;
    mg_kernel_spec s = varlen_spec(64, 32, 64, causal, 0);
    built_kernel bk;
    if (!build_edit(&s, 0, kt_mutate_edit, &g_fwd_all_tiles, &bk)) fail_msg("%s", g_fwd_all_tiles.error);
    fwd_case c;
    case_init_pos(&bk, &c, 1, KT_VARLEN_CAP, KT_VARLEN_CAP, &(kt_qpos){0, 0, 0});
    case_varlen(&bk, &c, &vl[0]);
    double secs, o_err, lse_err;
    char msg[300], num[400];
    const int tiles_ok = launch_varlen(&bk, &c, &secs, msg, sizeof msg);
    const size_t nans = case_compare(&bk, &c, &o_err, &lse_err, num, sizeof num);
    print_message("  [%s] %s: per element %s; %s\n", g_fwd_all_tiles.name, causal ? "causal" : "full",
                  num[0] || nans ? "FAILS" : "passes", tiles_ok ? "tiles NOT CAUGHT" : msg);
    if (nans || num[0]) fail_msg("%s: fails the per-element check (%s)", g_fwd_all_tiles.name, num);
    if (tiles_ok) fail_msg("%s: its key tiles pass the hull check", g_fwd_all_tiles.name);
    case_free(&c);
    unload(&bk);
  }
  kt_noise_quiet = 0;
}

/* The DeepSeek head shape at S = 256, 2 heads: timed. */
static void test_s256_timing(void **state) {
  (void)state;
  for (int causal = 0; causal <= 1; causal++) {
    mg_kernel_spec s = make_spec(2, 128, 64, 128, causal);
    built_kernel bk;
    build(&s, &bk);
    double secs = run_case(&bk, 1, 256, 256, 0);
    print_message("  S=256 H=2 d_n=128 d_r=64 d_v=128 %s on the host executor: %.2f s "
                  "(limit 20 s)\n", causal ? "causal" : "full", secs);
    assert_true(secs < 20.0);
    unload(&bk);
  }
}

/* An MLA shape unlike DeepSeek's (d_n 64, d_r 32, d_v 64), as in test_generate.c. */
static const char unusual_json[] =
    "{\"model_type\": \"minicpm3\", \"num_attention_heads\": 40, \"kv_lora_rank\": 256,"
    " \"qk_rope_head_dim\": 32, \"qk_nope_head_dim\": 64, \"v_head_dim\": 64,"
    " \"q_lora_rank\": 768, \"hidden_size\": 2560}";

/* The configurations of the tunable space that the template's check keeps compile for
 * sm_80 and sm_90a without spills or a stack frame (causal: the larger kernel), for the
 * DeepSeek-V3 head shape and the unusual one. Every configuration is rendered (the check
 * runs on all); a covering sample is compiled (kh_sweep_cover: every tunable value and pair
 * of values, and the most shared memory), all of them with MLAGEN_TEST_EXHAUSTIVE=1 (ctest
 * -C exhaustive -L exhaustive). The JIT cache ($MLAGEN_CACHE_DIR) is used: a second run
 * reads the cubins back. One cmocka test per shape (m: 0 DeepSeek-V3, 1 the unusual one).
 * varlen: the packed-sequence variants instead, a sample covering every single value (and
 * the most shared memory; all with MLAGEN_TEST_EXHAUSTIVE=1). */
static void nvrtc_all_kept_configs(int m, int varlen) {
  const char *models[] = {"deepseek-v3", NULL};
  const int block_m[] = {64, 128}, block_n[] = {32, 64, 128};
  kh_sweep sw;
  kh_sweep_open(&sw, varlen ? 73 : 66, KH_SWEEP_SMEM | KH_SWEEP_REJECTS | (varlen ? KH_SWEEP_SINGLES : 0));
  int kept = 0;
  {
    mg_shape shape;
    kh_load_shape(models[m], unusual_json, &shape);
    mg_kernel_spec specs[MG_SPEC_MAX_KERNELS];
    int n;
    assert_int_equal(mg_spec_for_model(&shape, 1, "bf16", specs, MG_SPEC_MAX_KERNELS, &n, &sw.d), 0);
    int found = -1;
    for (int i = 0; i < n; i++)
      if (!strcmp(specs[i].family, "attn_fwd") && specs[i].causal) found = i;
    assert_true(found >= 0);
    mg_kernel_spec cands[2 * 3 * 2 * 2];
    int nc = 0;
    for (int bm = 0; bm < 2; bm++)
      for (int bn = 0; bn < 3; bn++)
        for (int stages = 1; stages <= 2; stages++)
          for (int packed = 0; packed <= 1; packed++) {
            mg_kernel_spec s = specs[found];
            kh_setf(&s, "block_m=%d", block_m[bm]);
            kh_setf(&s, "num_warps=%d", block_m[bm] / 16);
            kh_setf(&s, "block_n=%d", block_n[bn]);
            kh_setf(&s, "stages=%d", stages);
            /* explicitly: the model's specs come with the plans' k_packed = 1 */
            set(&s, packed ? "k_packed=1" : "k_packed=0");
            s.varlen = varlen;
            cands[nc++] = s;
          }
    kept += kh_sweep_cover(&sw, cands, nc, g_test_seed, "");
  }
  print_message("  %d configurations kept, %d rejected by the template's check (%.0f s)\n", kept,
                sw.rejected, kh_now() - sw.t0);
  assert_true(kept >= 12);
  kh_sweep_close(&sw);
}
static void test_nvrtc_kept_configs_deepseek(void **state) { (void)state; nvrtc_all_kept_configs(0, 0); }
static void test_nvrtc_kept_configs_unusual(void **state) { (void)state; nvrtc_all_kept_configs(1, 0); }
/* The varlen variants (DeepSeek-V3 heads, causal) compile without spills too. */
static void test_nvrtc_varlen(void **state) { (void)state; nvrtc_all_kept_configs(0, 1); }

/* Rejections: a tunable combination, an accumulator budget, shared memory. */
static void test_check_rejects(void **state) {
  (void)state;
  mg_diag d = MG_DIAG_INIT;
  mg_gen *g;
  assert_int_equal(mg_gen_open(&g, NULL, &d), 0);
  mg_kernel k;
  mg_kernel_spec s = make_spec(128, 128, 64, 128, 1);
  set(&s, "block_m=128");
  assert_int_equal(mg_gen_kernel(g, &s, &k, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "block_m must be 16 * num_warps"));
  s = make_spec(128, 192, 64, 256, 1); /* d_v 256: 128 + 64 accumulators at block_n 128 */
  set(&s, "block_n=128");
  assert_int_equal(mg_gen_kernel(g, &s, &k, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "accumulators per thread"));
  s = make_spec(128, 192, 64, 256, 1); /* the largest dims: the default still fits */
  assert_int_equal(mg_gen_kernel(g, &s, &k, &d), 0);
  print_message("  d_n 192 d_r 64 d_v 256 default: %s\n", k.name);
  mg_kernel_free(&k);
  set(&s, "stages=2");
  set(&s, "block_n=64");
  assert_int_equal(mg_gen_kernel(g, &s, &k, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "bytes of shared memory"));
  print_message("  %s\n", mg_diag_msg(&d));
  mg_diag_clear(&d);
  mg_gen_close(g);
}

/* The child side of test_asan: an ASan build on two small cases, in a process that has
 * the ASan runtime preloaded. */
static void asan_case_run(void **state) {
  (void)state;
  for (int causal = 1; causal >= 0; causal--) {
    mg_kernel_spec s = make_spec(2, 64, 32, 64, causal);
    if (causal) set(&s, "k_packed=1");
    built_kernel bk;
    build_ex(&s, 1, &bk);
    run_case(&bk, 2, 77, 77, 0);
    run_case(&bk, 1, 40, 100, 60);
    unload(&bk);
  }
  /* the varlen variant, laga-cp rank 0 (documents cut by the chunks, slack rows) */
  const kt_varlen *vl;
  kt_varlen_cases(&vl);
  mg_kernel_spec s = varlen_spec(64, 32, 64, 1, 0);
  built_kernel bk;
  build_ex(&s, 1, &bk);
  const kt_qpos pos = kt_qpos_lagacp(2, 0, 75, 75);
  run_varlen(&bk, &vl[0], 150, &pos);
  unload(&bk);
}

/* ASan finds no out-of-bounds global or dynamic shared-memory access in the kernel. */
static void test_asan(void **state) {
  (void)state;
  kh_run_asan_child("test_attn_fwd", g_test_seed, asan_case_run);
}

int main(int argc, char **argv) {
  kt_seed_init();
  const int rc = kh_test_main(argc, argv, asan_case_run);
  if (rc >= 0) return rc;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_deepseek_heads),
      cmocka_unit_test(test_unusual_heads),
      cmocka_unit_test(test_configs),
      cmocka_unit_test(test_fp16),
      cmocka_unit_test(test_schedules_bit_identical),
      cmocka_unit_test(test_missing_barrier_caught),
      cmocka_unit_test(test_s256_timing),
      cmocka_unit_test(test_check_rejects),
      cmocka_unit_test(test_nvrtc_kept_configs_deepseek),
      cmocka_unit_test(test_nvrtc_kept_configs_unusual),
      cmocka_unit_test(test_asan),
      cmocka_unit_test(test_mutations_caught),
      cmocka_unit_test(test_two_chunk_positions),
      cmocka_unit_test(test_two_chunk_mutation_caught),
      cmocka_unit_test(test_varlen),
      cmocka_unit_test(test_varlen_mutations_caught),
      cmocka_unit_test(test_nvrtc_varlen),
  };
  return kh_exit_code(cmocka_run_group_tests(tests, NULL, kt_noise_teardown));
}
