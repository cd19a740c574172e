/* test_mqa_fwd_sm90.c: the sm_90a absorbed forward (templates/mqa_fwd_sm90.cu.tpl: a TMA ring
 * on mbarriers, wgmma, a producer warpgroup, O split over two consumer warpgroups sharing P
 * through shared memory) run unchanged on the CPU through the host executor's sm_90a
 * emulation, against the float64 reference of tests/mqa_ref.h per element with
 * test_mqa_fwd.c's tolerances; the same bits on every schedule; every kept configuration (a
 * covering sample; all with MLAGEN_TEST_EXHAUSTIVE=1) compiled by NVRTC for sm_90a without
 * spills; and every barrier, wait and fence of the kernel removed from the rendered source,
 * each removal failing the check or being reported (a deadlock, a wgmma protocol error).
 *
 * The tensor maps come from the runtime's mg_sm90_mqa_tmaps (runtime/exec/mg_sm90_tmap.h,
 * the maps the GPU benchmark launches with), passed by value as the kernel's TensorMaps<2>: cuTensorMapEncodeTiled through runtime/mg_driver's
 * loader with the fake driver (tests/fake_cuda.c). Inputs: random bf16 (fp16 in one case),
 * scores with standard deviation 2 under DeepSeek's YaRN softmax scale (the seed is printed,
 * MLAGEN_TEST_SEED overrides it). The host executor is slow on 576-wide heads: the shapes are
 * few and small, each chosen for a property (named at its case). The packed-sequence variant
 * ("_varlen") against mqa_ref.h's per-document float64 reference, NaN in every
 * slack row, wrong boundaries caught. */
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
#include "mg_sm90_tmap.h"
#include "sm90_test_util.h"
#include "mqa_ref.h"

/* the kernel's `const __grid_constant__ mla::sm90::TensorMaps<2> tmaps`, passed by value */
typedef struct { tmap_t m[2]; } tmaps2_t;
typedef void (*fwd_fn)(const e16 *q, const e16 *c, e16 *o, float *lse, int seqlen_q,
                       int seqlen_k, int q_pos0, float softmax_scale, tmaps2_t tmaps);
/* the packed-sequence variant (spec.varlen): the same, then cu_seqlens and n_seqs */
typedef void (*fwd_varlen_fn)(const e16 *q, const e16 *c, e16 *o, float *lse, int seqlen_q,
                              int seqlen_k, int q_pos0, float softmax_scale, tmaps2_t tmaps,
                              const int *cu_seqlens, int n_seqs);

typedef struct launch_args {
  fwd_fn fn;
  const e16 *q, *c;
  e16 *o;
  float *lse;
  int sq, sk, q_pos0;
  float scale;
  const tmap_t *tmaps;
  const int *cu; /* packed: cu_seqlens [n_cu + 1] (the variant), else NULL */
  int n_cu;
} launch_args;

static void thunk(void *p) {
  launch_args *a = p;
  if (a->cu) {
    fwd_varlen_fn fn;
    *(void **)&fn = *(void **)&a->fn;
    fn(a->q, a->c, a->o, a->lse, a->sq, a->sk, a->q_pos0, a->scale, *(const tmaps2_t *)a->tmaps,
       a->cu, a->n_cu);
    return;
  }
  a->fn(a->q, a->c, a->o, a->lse, a->sq, a->sk, a->q_pos0, a->scale, *(const tmaps2_t *)a->tmaps);
}

typedef struct built_kernel {
  kh_kernel kh;
  fwd_fn fn;
} built_kernel;

static int is_fp16(const mg_kernel_spec *s) { return strcmp(s->dtype, "fp16") == 0; }

static void build_edit(const mg_kernel_spec *spec, const sm90_edit *e, built_kernel *out) {
  sm90_build(spec, e, &out->kh);
  assert_int_equal(out->kh.threads, 384);
  assert_int_equal(kh_launch_value(&out->kh, "smem_static"), 0);
  *(void **)&out->fn = out->kh.fn;
}

static mg_kernel_spec make_spec(int H, int dc, int dr, int causal) {
  return kh_mqa_spec("mqa_fwd_sm90", H, dc, dr, causal);
}

typedef struct fwd_case {
  int B, sq, sk, q_pos0;
  float scale;
  e16 *q, *c, *o;
  float *lse;
  size_t nq, nc, no, nl;
  tmap_t *tmaps; /* [2] */
  const int *cu; /* packed sequences: cu_seqlens [n_cu + 1] (batch 1), else NULL */
  int n_cu;
  int poisoned; /* 1: the last batch item's q and c are NaN (run_case_poisoned): not compared */
} fwd_case;

/* The maps of c's tensors for bk, made by the runtime's helper through the fake driver's
 * cuTensorMapEncodeTiled (the host executor's device addresses are host addresses). */
static void encode_maps(const built_kernel *bk, fwd_case *c) {
  const mg_driver *drv;
  mg_kernel_info info;
  sm90_driver_info(&bk->kh, &drv, &info);
  mg_diag d = MG_DIAG_INIT;
  const mg_sm90_mqa_tensors t = {(CUdeviceptr)(uintptr_t)c->q, (CUdeviceptr)(uintptr_t)c->c,
                                 c->B, c->sq, c->sk};
  if (mg_sm90_mqa_tmaps(drv, &bk->kh.spec, &info, &t, (CUtensorMap *)c->tmaps, &d))
    fail_msg("mg_sm90_mqa_tmaps: %s", mg_diag_msg(&d));
}

static void case_init(const built_kernel *bk, fwd_case *c, int B, int sq, int sk, int q_pos0) {
  const mg_kernel_spec *s = &bk->kh.spec;
  const int H = s->heads, dqk = s->d_c + s->d_r, f16 = is_fp16(s);
  memset(c, 0, sizeof *c);
  c->B = B, c->sq = sq, c->sk = sk, c->q_pos0 = q_pos0;
  /* the explicit form's scale (d_n 128 + d_r 64, DeepSeek's mscale), as test_mqa_fwd.c */
  c->scale = (float)kt_softmax_scale(192);
  c->nq = (size_t)B * sq * H * dqk;
  c->nc = (size_t)B * sk * dqk;
  c->q = kt_rand_e16_sd(f16, c->nq, kt_q_sd(c->scale, dqk)); /* scores with sd 2 */
  c->c = kt_rand_e16_sd(f16, c->nc, 1);
  c->no = (size_t)B * sq * H * s->d_c;
  c->nl = (size_t)B * H * sq;
  c->o = malloc((c->no ? c->no : 1) * sizeof *c->o);
  c->lse = malloc((c->nl ? c->nl : 1) * sizeof *c->lse);
  c->tmaps = aligned_alloc(64, 2 * sizeof(tmap_t));
  memset(c->tmaps, 0, 2 * sizeof(tmap_t));
  encode_maps(bk, c);
}

static void case_free(fwd_case *c) {
  free(c->q), free(c->c), free(c->o), free(c->lse), free(c->tmaps);
}

/* Launches (outputs NaN first) on the executor's default (shuffled) schedule, or seed when
 * not 0, or round robin, with sm_90's shared-memory limit; returns the launch's message in
 * msg (0: it ran). */
static int launch_case(const built_kernel *bk, fwd_case *c, unsigned long long seed,
                       int round_robin, char *msg, size_t n) {
  for (size_t i = 0; i < c->no; i++) c->o[i] = 0x7fff; /* NaN in bf16 and fp16 */
  for (size_t i = 0; i < c->nl; i++) c->lse[i] = NAN;
  launch_args a = {bk->fn, c->q,   c->c,     c->o,  c->lse, c->sq, c->sk,
                   c->q_pos0, c->scale, c->tmaps, c->cu, c->n_cu};
  mg_host_dim3 grid = kh_grid(&bk->kh, c->sq, c->sk, c->B);
  assert_int_equal(grid.x, ((unsigned)c->sq * (unsigned)bk->kh.spec.heads + 63) / 64);
  return sm90_launch(&bk->kh, grid, thunk, &a, seed, round_robin, msg, n);
}

/* test_mqa_fwd.c's tolerances (the same rounding of P before P V, the same fp32 softmax):
 * O |err| <= 2 NOISE_O rms(O) + 2u |ref|, LSE 1e-5 (1 + |ref|). NOISE_O: the largest noise
 * figure kt_noise_report printed over this file's numeric cases (MLAGEN_TEST_SEED 21, 22
 * and three random seeds) was 5.43e-3 (test_mqa_fwd.c measured 5.12e-3 for mqa_fwd); LSE's
 * worst was 0.06 of its bound. */
#define NOISE_O 5.5e-3
static kt_tol tol_o(const mg_kernel_spec *s) {
  return (kt_tol){2 * NOISE_O, 2 * kt_unit_roundoff(is_fp16(s) ? KT_F16 : KT_BF16)};
}
static const kt_tol tol_lse = {1e-5, 1e-5};

/* Compares with mqa_ref_fwd; returns NaN outputs, worst err/bound in *oe, *le, the first
 * failure in msg (msg[0] 0 when both pass). */
static size_t compare(const built_kernel *bk, const fwd_case *c, double *oe, double *le,
                      char *msg, size_t n) {
  const mg_kernel_spec *s = &bk->kh.spec;
  const int f16 = is_fp16(s);
  double *q = kt_e16_to_d(f16, c->q, c->nq), *cc = kt_e16_to_d(f16, c->c, c->nc);
  double *ro = malloc((c->no ? c->no : 1) * sizeof *ro), *rl = malloc((c->nl ? c->nl : 1) * sizeof *rl);
  /* packed (c->cu): mqa_ref.h's per-document reference */
  mqa_ref_fwd_varlen(c->B, c->sq, c->sk, s->heads, s->d_c, s->d_r, s->causal, c->q_pos0, c->cu,
                     c->n_cu, c->scale, q, cc, ro, rl);
  const size_t keep = (size_t)(c->B - c->poisoned); /* the items compared */
  size_t nans = kt_check_fwd("mqa_fwd_sm90", f16 ? KT_F16 : KT_BF16, c->o, ro,
                             c->no / c->B * keep, (size_t)s->d_c, c->lse, rl, c->nl / c->B * keep,
                             tol_o(s), tol_lse, oe, le, msg, n);
  free(q), free(cc), free(ro), free(rl);
  return nans;
}

/* compare for a mutation run: without its noise record (kt_noise_quiet); returns the NaN
 * outputs, the first failure in msg (msg[0] 0 when both outputs pass). */
static size_t compare_mutant(const built_kernel *bk, const fwd_case *c, char *msg, size_t n) {
  double oe, le;
  kt_noise_quiet = 1;
  const size_t nans = compare(bk, c, &oe, &le, msg, n);
  kt_noise_quiet = 0;
  return nans;
}

/* Packed sequences: kernel_test_util.h's "many" stream (kt_varlen_many: lengths 1, 2, 3,
 * 17, 0, 64, 200, T = 287, cu padded with T as the executor pads it) in T_CAP token rows. */
#define T_CAP KT_VARLEN_CAP

/* A packed case of the varlen variant: sq queries at q_pos0.. over the T_CAP latent rows of
 * the documents vl (NULL: the "many" stream); NaN in every slack row (position >= T) of q
 * and c. */
static void varlen_init_docs(const built_kernel *bk, fwd_case *c, int sq, int q_pos0, const kt_varlen *vl) {
  const mg_kernel_spec *s = &bk->kh.spec;
  if (!vl) vl = kt_varlen_many();
  const int T = vl->cu[vl->n], w = s->heads * (s->d_c + s->d_r);
  case_init(bk, c, 1, sq, T_CAP, q_pos0);
  c->cu = vl->cu, c->n_cu = vl->n;
  kt_nan_slack_e16(c->q, sq, (size_t)w, &(kt_qpos){q_pos0, 0, 0}, T);
  kt_nan_slack_e16(c->c, T_CAP, (size_t)(s->d_c + s->d_r), NULL, T);
}
static void varlen_init(const built_kernel *bk, fwd_case *c, int sq, int q_pos0) {
  varlen_init_docs(bk, c, sq, q_pos0, NULL);
}

/* Launches the initialized case c, checks it, prints a line and frees it. */
static void check_case(const built_kernel *bk, fwd_case *c) {
  const int B = c->B, sq = c->sq, sk = c->sk, q_pos0 = c->q_pos0;
  char msg[1024];
  double t0 = kh_now();
  if (launch_case(bk, c, 0, 0, msg, sizeof msg)) fail_msg("%s: launch failed: %s", bk->kh.name, msg);
  double oe, le;
  size_t nans = compare(bk, c, &oe, &le, msg, sizeof msg);
  print_message("  %s B=%d S_q=%d S_k=%d q_pos0=%d%s: err/bound O %.2f LSE %.2f (%.2f s)\n",
                bk->kh.name + strlen("mla_mqa_fwd_sm90_"), B, sq, sk, q_pos0,
                c->cu ? " packed" : "", oe, le, kh_now() - t0);
  if (nans) fail_msg("%zu NaN outputs", nans);
  if (msg[0]) fail_msg("%s", msg);
  case_free(c);
}
static void run_case(const built_kernel *bk, int B, int sq, int sk, int q_pos0) {
  fwd_case c;
  case_init(bk, &c, B, sq, sk, q_pos0);
  check_case(bk, &c);
}
/* Batch isolation (B > 1): run_case with NaN in every q and c element of the last batch item;
 * the items before it are compared, which the NaN must not reach (a tile's rows past an
 * item's end are TMA's zero fill, not the next item's: 0 * NaN would be NaN). */
static void run_case_poisoned(const built_kernel *bk, int B, int sq, int sk, int q_pos0) {
  fwd_case c;
  case_init(bk, &c, B, sq, sk, q_pos0);
  kt_nan_last_item_e16(c.q, c.nq, B), kt_nan_last_item_e16(c.c, c.nc, B);
  c.poisoned = B > 1;
  check_case(bk, &c);
}

static void build_set(mg_kernel_spec *s, const char *const *sets, int n, built_kernel *bk) {
  for (int i = 0; i < n; i++) kh_set(s, sets[i]);
  build_edit(s, NULL, bk);
}

/* DeepSeek's latent (d_c 512, d_r 64: 576/512), the default configuration (block_n 64,
 * 2 stages, overlap), causal and not; and one GEMM at a time (overlap 0). H 2: S = 1; S = 37 with batch 2 (74 rows: a partial row tile;
 * 37 keys: a partial key tile; TMA rows past a batch item's end are zero fill, and a NaN in
 * every input of item 1 leaves item 0 exact); a query shard at 30 of 50 keys; no keys (o = 0, lse = -inf). H 16:
 * 4 tokens per 64-row CTA (the diagonal differs per token within a tile). H 128 (DeepSeek-V3
 * without sequence parallelism), decode-like: one query at 32 of 33 keys, two CTAs of one
 * token, and 3 queries at 130.. of 133 keys (3 tiles through the 2-stage ring). */
static void test_deepseek(void **state) {
  (void)state;
  for (int causal = 1; causal >= 0; causal--) {
    mg_kernel_spec s = make_spec(2, 512, 64, causal);
    built_kernel bk;
    build_edit(&s, NULL, &bk);
    run_case(&bk, 1, 1, 1, 0);
    run_case(&bk, 2, 37, 37, 0);
    run_case_poisoned(&bk, 2, 37, 37, 0);
    run_case(&bk, 1, 20, 50, 30);
    run_case(&bk, 1, 5, 0, 0);
    kh_free(&bk.kh);
    s = make_spec(16, 512, 64, causal);
    build_edit(&s, NULL, &bk);
    run_case(&bk, 2, 13, 13, 0);
    kh_free(&bk.kh);
  }
  mg_kernel_spec s = make_spec(128, 512, 64, 1);
  built_kernel bk;
  build_edit(&s, NULL, &bk);
  run_case(&bk, 1, 1, 33, 32);
  run_case(&bk, 1, 3, 133, 130);
  kh_free(&bk.kh);
  const char *a[] = {"overlap=0"};
  s = make_spec(2, 512, 64, 1);
  build_set(&s, a, 1, &bk);
  run_case(&bk, 1, 37, 200, 163);
  kh_free(&bk.kh);
}

/* d_c 256, d_r 32 (288/256: 64B-swizzled boxes of 32 columns; each consumer's O += P V is
 * m64n128), the default configuration (block_n 64, 4 stages, overlap) causal and not: H 2 at
 * S = 1, S 37 batch 2, a shard at 50 of 70 keys, 330 keys past 4 stages (the ring wraps);
 * H 1 (one row per token); H 5 (tokens straddle row tiles). Then block_n 128 with 2 stages
 * (overlap 0 when not causal) and fp16. */
static void test_dc256(void **state) {
  (void)state;
  for (int causal = 1; causal >= 0; causal--) {
    mg_kernel_spec s = make_spec(2, 256, 32, causal);
    built_kernel bk;
    build_edit(&s, NULL, &bk);
    run_case(&bk, 1, 1, 1, 0);
    run_case(&bk, 2, 37, 37, 0);
    run_case(&bk, 1, 20, 70, 50);
    run_case(&bk, 1, 30, 330, 300);
    kh_free(&bk.kh);
  }
  mg_kernel_spec s = make_spec(1, 256, 32, 1);
  built_kernel bk;
  build_edit(&s, NULL, &bk);
  run_case(&bk, 2, 77, 77, 0);
  kh_free(&bk.kh);
  s = make_spec(5, 256, 32, 1);
  build_edit(&s, NULL, &bk);
  run_case(&bk, 2, 29, 29, 0);
  run_case_poisoned(&bk, 2, 29, 29, 0);
  run_case(&bk, 1, 13, 20, 7);
  kh_free(&bk.kh);
  for (int causal = 1; causal >= 0; causal--) {
    const char *a[] = {"block_n=128", "stages=2", causal ? "overlap=1" : "overlap=0"};
    s = make_spec(2, 256, 32, causal);
    build_set(&s, a, 3, &bk);
    run_case(&bk, 2, 37, 37, 0);
    run_case(&bk, 1, 40, 300, 260);
    kh_free(&bk.kh);
  }
  s = make_spec(2, 256, 32, 1);
  snprintf(s.dtype, sizeof s.dtype, "fp16");
  build_edit(&s, NULL, &bk);
  run_case(&bk, 2, 37, 77, 40);
  kh_free(&bk.kh);
}

/* The kernel is deterministic: round robin and two shuffled schedules give the same bits
 * (288/256, H 2, causal, batch 2, 6 key tiles through the 4-stage ring). */
static void test_schedules_bit_identical(void **state) {
  (void)state;
  mg_kernel_spec s = make_spec(2, 256, 32, 1);
  built_kernel bk;
  build_edit(&s, NULL, &bk);
  fwd_case c;
  case_init(&bk, &c, 2, 37, 350, 313);
  e16 *o0 = malloc(c.no * sizeof *o0);
  float *l0 = malloc(c.nl * sizeof *l0);
  char msg[1024];
  for (int k = 0; k < 3; k++) {
    if (launch_case(&bk, &c, (unsigned long long)k * 7, k == 0, msg, sizeof msg))
      fail_msg("launch: %s", msg);
    if (k == 0) {
      double oe, le;
      if (compare(&bk, &c, &oe, &le, msg, sizeof msg) || msg[0]) fail_msg("round robin: %s", msg);
      memcpy(o0, c.o, c.no * sizeof *o0), memcpy(l0, c.lse, c.nl * sizeof *l0);
    } else if (memcmp(o0, c.o, c.no * sizeof *o0) || memcmp(l0, c.lse, c.nl * sizeof *l0)) {
      fail_msg("schedule seed %d gives other bits than round robin", k * 7);
    }
  }
  print_message("  %s: round robin and seeds 7, 14: O and LSE bit-identical\n", bk.kh.name);
  free(o0), free(l0);
  case_free(&c);
  kh_free(&bk.kh);
}

/* The source with e applied (288/256, H 2, causal, block_n 64, 2 stages, `overlap`; 40 rows at
 * 216 of 256 keys) on schedule seed: the check must fail or the launch be reported. */
static void mutation_caught(const sm90_edit *e, int overlap, unsigned long long seed) {
  mg_kernel_spec s = make_spec(2, 256, 32, 1);
  kh_set(&s, "block_n=64"), kh_set(&s, "stages=2");
  kh_set(&s, overlap ? "overlap=1" : "overlap=0");
  built_kernel bk;
  build_edit(&s, e, &bk);
  fwd_case c;
  case_init(&bk, &c, 1, 40, 256, 216);
  char msg[1024];
  int rc = launch_case(&bk, &c, seed, 0, msg, sizeof msg);
  const char *how = "launch reported";
  if (!rc) {
    size_t nans = compare_mutant(&bk, &c, msg, sizeof msg);
    if (!nans && !msg[0]) fail_msg("removing '%s' was not caught (schedule seed %llu)", e->from, seed);
    how = nans ? "NaN outputs" : "check failed";
  }
  print_message("  overlap %d without '%s' (seed %llu): %s: %.120s\n", overlap, e->from, seed, how,
                msg);
  case_free(&c);
  kh_free(&bk.kh);
}

/* Each removal of a barrier, wait or fence from the rendered source (288/256, H 2, causal,
 * block_n 64, 2 stages: 4 key tiles, twice around the ring) must make the check fail or the launch
 * be reported (a deadlock, a wgmma or named-barrier protocol error), each on its own
 * schedule seed. The patterns are the kernel's synchronization, one by one; consumer 1's own
 * wait on the full barrier is left out: consumer 0 waited on it before signalling P, so on
 * the host executor (and by the memory model's cumulativity) it is redundant, kept in the
 * kernel as cheap insurance. Consumer 0's wait on P_FREE is caught by the executor's report
 * of a named barrier left with unmatched arrivals at exit (3 arrivals of consumer 1 here: an
 * odd number of tiles after the first), not by the overwrite of P it guards against: on the
 * host schedule consumer 1 (4 wgmma per tile) always finishes with P before consumer 0
 * (36 for S, then the softmax) stores the next one. Two numeric mutations too: the diagonal
 * tiles left unmasked, and the diagonal taken per packed row instead of per token. */
static void test_mutations_caught(void **state) {
  (void)state;
  static const sm90_edit muts[] = {
      /* overlap = 1 (the default) */
      {"mbar_wait(&empty[st], ph ^ 1u);", ""},
      {"mbar_wait(q_full, 0);", ""},
      {"mbar_wait(&full[st], parity(j));  // MUTATION: full wait", ""},
      {"wgmma_wait<1>();  // MUTATION: S wait", ""},
      {"if (j > 0) bar_sync(BAR_P_FREE, 256);", ""},
      {"fence_proxy_async();", ""},
      {"bar_arrive(BAR_P_FULL, 256);", ""},
      {"wgmma_wait<0>();  // MUTATION: PV0 wait", ""},
      {"mbar_arrive(&empty[pst]);  // MUTATION: empty release 0", ""},
      {"bar_sync(BAR_P_FULL, 256);", ""},
      {"wgmma_wait<0>();  // MUTATION: PV1 wait", ""},
      {"if (j + 1 < n_tiles) bar_arrive(BAR_P_FREE, 256);", ""},
      {"mbar_arrive(&empty[st]);  // MUTATION: empty release 1", ""},
      {"bar_arrive(BAR_L_READY, 256);", ""},
      {"bar_sync(BAR_L_READY, 256);", ""},
      {"(CAUSAL && n0 + BLOCK_N - 1 > pos_first)", "false"},
      {"(m0 + rl + 8 * ((i % 4) / 2)) / H;", "(m0 + rl + 8 * ((i % 4) / 2));"},
      /* overlap = 0: consumer 0's own waits and release (the rest is the same code) */
      {"mbar_wait(&full[st], parity(j));  // MUTATION: full wait", ""},
      {"wgmma_wait<0>();  // MUTATION: S wait", ""},
      {"wgmma_wait<0>();  // MUTATION: PV0 wait", ""},
      {"mbar_arrive(&empty[st]);  // MUTATION: empty release 0", ""},
      /* the __syncthreads that makes the mbarrier inits visible */
      {"__syncthreads();  // MUTATION: init barrier", ""},
  };
  const size_t n_ov = 17; /* the first n_ov on overlap 1 */
  const size_t n = sizeof muts / sizeof muts[0];
  for (size_t m = 0; m < n; m++) mutation_caught(&muts[m], m < n_ov, m + 1);
  /* The wgmma fences: the default run removes consumer 1's (its first wgmma), -C exhaustive
   * each (consumer 0's in its issue lambdas: every call site loses it; on overlap 1 the PV0
   * fence in the loop follows the S fence and is caught at the last tile's P V, after a wait
   * that delivered). fence_operand(...) is a compiler-only register fence (an empty asm;
   * nothing on the host): not among the mutations. */
  static const struct {
    int overlap, sample;
    sm90_edit e;
  } fences[] = {
      {1, 1, {"wgmma_fence();  // MUTATION: PV1 fence", ""}},
      {1, 0, {"wgmma_fence();  // MUTATION: S fence", ""}},
      {1, 0, {"wgmma_fence();  // MUTATION: PV0 fence", ""}},
      {0, 0, {"wgmma_fence();  // MUTATION: S fence", ""}},
      {0, 0, {"wgmma_fence();  // MUTATION: PV0 fence", ""}},
  };
  const int all = kh_sweep_exhaustive();
  for (size_t m = 0; m < sizeof fences / sizeof fences[0]; m++)
    if (all || fences[m].sample) mutation_caught(&fences[m].e, fences[m].overlap, n + m + 1);
}

/* The configurations the template's check keeps compile for sm_90a (NVRTC) with no spill,
 * no stack frame and no static shared memory (causal: the larger kernel), for DeepSeek-V3
 * (H 128, 576/512) and the d_c 256 shape (H 40, 288/256); the registers and shared memory
 * of each are printed. Every configuration is rendered (the check and the shared-memory
 * limit run on all); a covering sample is compiled (kh_sweep_cover), all of them with
 * MLAGEN_TEST_EXHAUSTIVE=1. */
static void test_nvrtc_kept_configs(void **state) {
  (void)state;
  kh_sweep sw;
  kh_sweep_open(&sw, 56, KH_SWEEP_SMEM | KH_SWEEP_REJECTS | KH_SWEEP_SM90_ONLY | KH_SWEEP_WGMMA_PIPELINED);
  sw.max_smem = 227 * 1024;
  int kept = 0;
  for (int sh = 0; sh < 2; sh++) {
    mg_kernel_spec cands[2 * 3 * 2];
    int nc = 0;
    for (int bn = 64; bn <= 128; bn *= 2)
      for (int st = 2; st <= 4; st++)
        for (int ov = 0; ov <= 1; ov++) {
          mg_kernel_spec s = sh == 0 ? make_spec(128, 512, 64, 1) : make_spec(40, 256, 32, 1);
          kh_setf(&s, "block_n=%d", bn);
          kh_setf(&s, "stages=%d", st);
          kh_setf(&s, "overlap=%d", ov);
          cands[nc++] = s;
        }
    kept += kh_sweep_cover(&sw, cands, nc, g_test_seed, "");
  }
  sm90_sweep_close(&sw, kept, 10);
}

/* The packed-sequence variant (spec.varlen, "_varlen") against mqa_ref.h's float64
 * per-document reference: 288/256, H 2 (the default configuration), causal and not, every
 * query over the short documents, and a shard of the second half (queries at 150..: the
 * 200-token document cut by the shard's start, slack rows at its end), causal also one
 * document of 260 (40 slack rows); DeepSeek's 576/512
 * causal over the short documents, compiled for sm_90a with no spill. NaN fills every slack
 * row of q and c. Then a row seeing one key past its range fails the check, and latent tiles
 * aligned to start at the range's first key (slack rows' NaN reaching P V) give NaN. */
static void test_varlen(void **state) {
  (void)state;
  fwd_case c;
  built_kernel bk;
  for (int causal = 0; causal <= 1; causal++) {
    mg_kernel_spec s = make_spec(2, 256, 32, causal);
    s.varlen = 1;
    build_edit(&s, NULL, &bk);
    varlen_init(&bk, &c, T_CAP, 0);
    check_case(&bk, &c);
    varlen_init(&bk, &c, T_CAP / 2, T_CAP / 2);
    check_case(&bk, &c);
    if (causal) { /* one document of 260 (kernel_test_util.h's "one") */
      const kt_varlen *vl;
      kt_varlen_cases(&vl);
      varlen_init_docs(&bk, &c, T_CAP, 0, &vl[1]);
      check_case(&bk, &c);
    }
    kh_free(&bk.kh);
  }
  mg_kernel_spec s = make_spec(2, 512, 64, 1);
  s.varlen = 1;
  build_edit(&s, NULL, &bk);
  varlen_init(&bk, &c, T_CAP, 0);
  check_case(&bk, &c);
  kh_free(&bk.kh);
  kh_sweep sw;
  kh_sweep_open(&sw, 56, KH_SWEEP_SMEM | KH_SWEEP_SM90_ONLY | KH_SWEEP_WGMMA_PIPELINED);
  kh_sweep_compile(&sw, &s, "");
  kh_sweep_close(&sw);
  static const sm90_edit muts[] = {
      {"(m0 + rl + 8) / H", "(m0+rl+8+H) / H"},
      {"k0 = kt.k0", "k0 = kt.lo"},
  };
  for (int m = 0; m < 2; m++) {
    s = make_spec(2, 256, 32, 1);
    s.varlen = 1;
    build_edit(&s, &muts[m], &bk);
    varlen_init(&bk, &c, T_CAP, 0);
    char msg[1024];
    if (launch_case(&bk, &c, 0, 0, msg, sizeof msg)) fail_msg("launch failed: %s", msg);
    const size_t nans = compare_mutant(&bk, &c, msg, sizeof msg);
    if (!nans && !msg[0]) fail_msg("'%s' -> '%s' was not caught", muts[m].from, muts[m].to);
    print_message("  '%s' -> '%s': %zu NaN outputs; %.120s\n", muts[m].from, muts[m].to, nans, msg);
    case_free(&c);
    kh_free(&bk.kh);
  }
}

/* Rejections: shared memory at 576/512 (block_n 128, or 3 stages); a d_c whose halves are
 * no wgmma N. */
static void test_check_rejects(void **state) {
  (void)state;
  mg_kernel_spec s = make_spec(128, 512, 64, 1);
  kh_set(&s, "stages=3");
  sm90_expect_reject(&s, "bytes of shared memory");
  s = make_spec(16, 160, 32, 1);
  sm90_expect_reject(&s, "d_c must be 128, 256, 384 or 512");
}

/* The child side of test_asan (kh_run_asan_child: this program as --asan-case, every kernel
 * an ASan build, MG_HOST_ASAN=1): 288/256 (64B-swizzled 32-column boxes), H 2, causal, the
 * default configuration (block_n 64, 4 stages, overlap), on partial tiles (20 queries at 50
 * of 70 keys, batch 2: TMA rows past a batch item's end), and its packed variant. Checked per
 * element as the other cases; ASan bounds the global buffers, the dynamic shared memory at
 * the launch's size and the emulator's own buffers. */
static void asan_case_run(void **state) {
  (void)state;
  mg_kernel_spec s = make_spec(2, 256, 32, 1);
  built_kernel bk;
  build_edit(&s, NULL, &bk);
  run_case(&bk, 2, 20, 70, 50);
  kh_free(&bk.kh);
  /* the packed variant: its reads of cu_seqlens (a heap copy of exactly n_seqs + 1 entries,
   * which ASan bounds) and of the rows its ranges name; 12 queries at 280..: the 200-token
   * document's last rows, then slack rows (past cu[n_seqs]) */
  s.varlen = 1;
  build_edit(&s, NULL, &bk);
  int *cu = kt_varlen_copy(kt_varlen_many());
  fwd_case c;
  varlen_init(&bk, &c, 12, 280);
  c.cu = cu;
  check_case(&bk, &c);
  free(cu);
  kh_free(&bk.kh);
}

/* ASan finds no out-of-bounds access in the kernel or the Hopper emulation. */
static void test_asan(void **state) {
  (void)state;
  kh_run_asan_child("test_mqa_fwd_sm90", g_test_seed, asan_case_run);
}

int main(int argc, char **argv) {
  kt_seed_init();
  int rc = kh_test_main(argc, argv, asan_case_run);
  if (rc >= 0) return rc;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_deepseek),
      cmocka_unit_test(test_dc256),
      cmocka_unit_test(test_schedules_bit_identical),
      cmocka_unit_test(test_mutations_caught),
      cmocka_unit_test(test_check_rejects),
      cmocka_unit_test(test_varlen),
      cmocka_unit_test(test_nvrtc_kept_configs),
      cmocka_unit_test(test_asan),
  };
  return kh_exit_code(cmocka_run_group_tests(tests, NULL, kt_noise_teardown));
}
