/* test_attn_fwd_sm90.c: the Hopper attention forward (templates/attn_fwd_sm90.cu.tpl: TMA
 * ring on mbarriers, wgmma, a producer warpgroup) run unchanged on the CPU through the host
 * executor's sm_90a emulation (tests/host/hopper_host.cpp), against the float64 reference
 * of tests/attn_ref.h per element with test_attn_fwd.c's tolerances; every kept
 * configuration compiled by NVRTC for sm_90a without spills; and bugs injected into the
 * rendered source (the waits on the K and V full barriers, the consumer's release of the
 * empty barrier, the producer's wait on it, each wgmma wait; with and without overlap) must
 * fail the check or be reported. Ping-pong (pingpong = 1: the two consumers' GEMMs in turns
 * on named barriers, which order no data): the executor's wgmma issue trace must be the
 * turns' order exactly, and a missing turn wait (broken order) or hand-back (deadlock) is
 * caught. The kernel writes no shared memory with ordinary stores,
 * so it has no fence.proxy.async to remove (test_hopper_host.c covers that fence).
 * The packed-sequence variant ("_varlen") against attn_ref.h's per-document
 * float64 reference, NaN in every slack row of every input, and wrong boundaries caught.
 * Split keys read k_rope at column KT_ROPE_COL of NaN-filled rows through tmaps[2] with the
 * row stride ld_k_rope (one contiguous case); a map ignoring it is caught.
 *
 * The tensor maps come from the runtime's mg_sm90_fwd_tmaps (runtime/exec/mg_sm90_tmap.h, the
 * maps the CUDA executor and the GPU benchmark launch with): cuTensorMapEncodeTiled through
 * runtime/mg_driver's loader with the fake driver (tests/fake_cuda.c).
 * Inputs: random bf16 (fp16 in one case), scores with standard deviation 2 under DeepSeek's
 * YaRN softmax scale (the seed is printed, MLAGEN_TEST_SEED overrides it). */
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
#include "mg_sm90_tmap.h"
#include "sm90_test_util.h"

/* the kernel's `const __grid_constant__ mla::sm90::TensorMaps<4> tmaps`, passed by value */
typedef struct { tmap_t m[4]; } tmaps4_t;
typedef void (*fwd_fn)(const e16 *q, const e16 *k_nope, const e16 *k_rope, const e16 *v, e16 *o,
                       float *lse, int seqlen_q, int seqlen_k, int q_pos0, int q_split, int q_pos1,
                       float softmax_scale, tmaps4_t tmaps);
/* split keys (k_packed = 0): k_rope's row stride ld_k_rope after k_rope (the kernel reads
 * k_rope through tmaps[2], whose row stride it is) */
typedef void (*fwd_split_fn)(const e16 *q, const e16 *k_nope, const e16 *k_rope, int ld_k_rope,
                             const e16 *v, e16 *o, float *lse, int seqlen_q, int seqlen_k,
                             int q_pos0, int q_split, int q_pos1, float softmax_scale,
                             tmaps4_t tmaps);
typedef void (*fwd_split_varlen_fn)(const e16 *q, const e16 *k_nope, const e16 *k_rope,
                                    int ld_k_rope, const e16 *v, e16 *o, float *lse, int seqlen_q,
                                    int seqlen_k, int q_pos0, int q_split, int q_pos1,
                                    float softmax_scale, tmaps4_t tmaps, const int *cu_seqlens,
                                    int n_seqs);
/* the packed-sequence variant (spec.varlen): the same, then cu_seqlens and n_seqs */
typedef void (*fwd_varlen_fn)(const e16 *q, const e16 *k_nope, const e16 *k_rope, const e16 *v,
                              e16 *o, float *lse, int seqlen_q, int seqlen_k, int q_pos0,
                              int q_split, int q_pos1, float softmax_scale, tmaps4_t tmaps,
                              const int *cu_seqlens, int n_seqs);

typedef struct launch_args {
  fwd_fn fn;
  const e16 *q, *kn, *kr, *v;
  e16 *o;
  float *lse;
  int sq, sk, q_pos0, q_split, q_pos1;
  float scale;
  const tmap_t *tmaps;
  const int *cu; /* packed: cu_seqlens [n_cu + 1] (the variant), else NULL */
  int n_cu;
  int ld_kr; /* split keys: ld_k_rope; 0: packed keys (no such parameter) */
} launch_args;

static void thunk(void *p) {
  launch_args *a = p;
  if (a->ld_kr && a->cu) {
    fwd_split_varlen_fn fn;
    *(void **)&fn = *(void **)&a->fn;
    fn(a->q, a->kn, a->kr, a->ld_kr, a->v, a->o, a->lse, a->sq, a->sk, a->q_pos0, a->q_split,
       a->q_pos1, a->scale, *(const tmaps4_t *)a->tmaps, a->cu, a->n_cu);
    return;
  }
  if (a->ld_kr) {
    fwd_split_fn fn;
    *(void **)&fn = *(void **)&a->fn;
    fn(a->q, a->kn, a->kr, a->ld_kr, a->v, a->o, a->lse, a->sq, a->sk, a->q_pos0, a->q_split,
       a->q_pos1, a->scale, *(const tmaps4_t *)a->tmaps);
    return;
  }
  if (a->cu) {
    fwd_varlen_fn fn;
    *(void **)&fn = *(void **)&a->fn;
    fn(a->q, a->kn, a->kr, a->v, a->o, a->lse, a->sq, a->sk, a->q_pos0, a->q_split, a->q_pos1,
       a->scale, *(const tmaps4_t *)a->tmaps, a->cu, a->n_cu);
    return;
  }
  a->fn(a->q, a->kn, a->kr, a->v, a->o, a->lse, a->sq, a->sk, a->q_pos0, a->q_split, a->q_pos1,
        a->scale, *(const tmaps4_t *)a->tmaps);
}

typedef struct built_kernel {
  kh_kernel kh;
  fwd_fn fn;
  int block_m, block_n, packed;
} built_kernel;

static int is_fp16(const mg_kernel_spec *s) { return strcmp(s->dtype, "fp16") == 0; }

static void build_edit(const mg_kernel_spec *spec, const sm90_edit *e, built_kernel *out) {
  sm90_build(spec, e, &out->kh);
  out->block_m = kh_config_int(&out->kh, "block_m");
  out->block_n = kh_config_int(&out->kh, "block_n");
  out->packed = kh_config_int(&out->kh, "k_packed");
  assert_int_equal(out->kh.threads, 128 * (out->block_m / 64 + 1));
  assert_int_equal(kh_launch_value(&out->kh, "smem_static"), 0);
  *(void **)&out->fn = out->kh.fn;
}

static mg_kernel_spec make_spec(int H, int dn, int dr, int dv, int causal) {
  mg_kernel_spec s;
  memset(&s, 0, sizeof s);
  snprintf(s.family, sizeof s.family, "attn_fwd_sm90");
  s.heads = H, s.d_n = dn, s.d_r = dr, s.d_v = dv, s.d_c = 512, s.causal = causal;
  snprintf(s.dtype, sizeof s.dtype, "bf16");
  return s;
}

/* Query row i at q_pos0 + i, or with two chunks (q_split > 0) at q_pos1 + i - q_split from
 * row q_split on (attn_ref_pos). Split keys: kr [B, S_k, d_r], which the kernel reads from
 * kr_buf (prepare_keys: at column KT_ROPE_COL of NaN-filled rows, or contiguous when
 * kr_contig), tmaps[2] with its row stride (or, map_ld_dr, with d_r: a map that ignores
 * ld_k_rope, for the mutation test). */
typedef struct fwd_case {
  int B, sq, sk, q_pos0, q_split, q_pos1;
  float scale;
  e16 *q, *kn, *kr, *v, *o;
  e16 *kr_buf;
  const e16 *kr_arg;
  int ld_kr, kr_contig, map_ld_dr;
  float *lse;
  size_t no, nl;
  tmap_t *tmaps; /* [4] */
  const int *cu; /* packed sequences: cu_seqlens [n_cu + 1] (batch 1), else NULL */
  int n_cu;
  int poisoned; /* 1: the last batch item's inputs are NaN (poison_last): not compared */
} fwd_case;

/* The maps of c's tensors for bk, made by the runtime's helper (runtime/exec/mg_sm90_tmap.h)
 * through the fake driver's cuTensorMapEncodeTiled: the executor's and the benchmark's maps.
 * The host executor's device addresses are host addresses. */
static void encode_maps(const built_kernel *bk, fwd_case *c) {
  const mg_driver *drv;
  mg_kernel_info info;
  sm90_driver_info(&bk->kh, &drv, &info);
  mg_diag d = MG_DIAG_INIT;
  const mg_sm90_fwd_tensors t = {(CUdeviceptr)(uintptr_t)c->q, (CUdeviceptr)(uintptr_t)c->kn,
                                 (CUdeviceptr)(uintptr_t)c->kr_arg, (CUdeviceptr)(uintptr_t)c->v,
                                 c->B, c->sq, c->sk, c->map_ld_dr ? 0 : c->ld_kr};
  if (mg_sm90_fwd_tmaps(drv, &bk->kh.spec, &info, &t, (CUtensorMap *)c->tmaps, &d))
    fail_msg("mg_sm90_fwd_tmaps: %s", mg_diag_msg(&d));
}

/* The k_rope the kernel reads (kr_buf: kt_rope_strided from kr) and c's maps, again after
 * an edit of kr or of map_ld_dr. */
static void prepare_keys(const built_kernel *bk, fwd_case *c) {
  free(c->kr_buf);
  c->kr_buf = kt_rope_strided(c->kr, (size_t)c->B * c->sk, bk->kh.spec.d_r, !c->kr_contig,
                              &c->kr_arg, &c->ld_kr);
  encode_maps(bk, c);
}

/* The k_rope layout of the split-key cases case_init_pos makes: 0 (wide, NaN around each
 * row) but for test_unusual_heads' fp16 case. */
static int g_kr_contig;

static void case_init_pos(const built_kernel *bk, fwd_case *c, int B, int sq, int sk,
                          const kt_qpos *pos) {
  const mg_kernel_spec *s = &bk->kh.spec;
  const int H = s->heads, dn = s->d_n, dr = s->d_r, dv = s->d_v, dqk = dn + dr, f16 = is_fp16(s);
  memset(c, 0, sizeof *c);
  c->B = B, c->sq = sq, c->sk = sk;
  c->q_pos0 = pos->q_pos0, c->q_split = pos->q_split, c->q_pos1 = pos->q_pos1;
  c->scale = (float)kt_softmax_scale(dqk);
  c->q = kt_rand_e16_sd(f16, (size_t)B * sq * H * dqk, kt_q_sd(c->scale, dqk));
  if (bk->packed) {
    c->kn = kt_rand_e16_sd(f16, (size_t)B * sk * H * dqk, 1);
    c->kr = NULL;
  } else {
    c->kn = kt_rand_e16_sd(f16, (size_t)B * sk * H * dn, 1);
    c->kr = kt_rand_e16_sd(f16, (size_t)B * sk * dr, 1);
  }
  c->v = kt_rand_e16_sd(f16, (size_t)B * sk * H * dv, 1);
  c->no = (size_t)B * sq * H * dv;
  c->nl = (size_t)B * H * sq;
  c->o = malloc((c->no ? c->no : 1) * sizeof *c->o);
  c->lse = malloc((c->nl ? c->nl : 1) * sizeof *c->lse);
  c->tmaps = aligned_alloc(64, 4 * sizeof(tmap_t));
  memset(c->tmaps, 0, 4 * sizeof(tmap_t));
  c->kr_contig = g_kr_contig;
  prepare_keys(bk, c);
}
static void case_init(const built_kernel *bk, fwd_case *c, int B, int sq, int sk, int q_pos0) {
  case_init_pos(bk, c, B, sq, sk, &(kt_qpos){q_pos0, 0, 0});
}

/* Batch isolation (B > 1): NaN in every input of c's last batch item; compare then checks the
 * items before it, which the NaN must not reach (a tile's rows past an item's end are TMA's
 * zero fill, not the next item's keys: 0 * NaN would be NaN). */
static void poison_last(const built_kernel *bk, fwd_case *c) {
  const mg_kernel_spec *s = &bk->kh.spec;
  kt_nan_last_item_attn(c->B, c->sq, c->sk, s->heads, s->d_n, s->d_r, s->d_v, bk->packed, c->q,
                        c->kn, c->kr, c->v);
  prepare_keys(bk, c);
  c->poisoned = c->B > 1;
}

static void case_free(fwd_case *c) {
  free(c->q), free(c->kn), free(c->kr), free(c->v), free(c->o), free(c->lse), free(c->tmaps);
  free(c->kr_buf);
}

static void reference(const built_kernel *bk, const fwd_case *c, double *o, double *lse) {
  const mg_kernel_spec *s = &bk->kh.spec;
  const int H = s->heads, dn = s->d_n, dr = s->d_r, dqk = dn + dr, f16 = is_fp16(s);
  const attn_ref_docs docs = {c->cu, c->n_cu}; /* packed: attn_ref.h's per-document reference */
  const attn_ref_dims d = {c->B,     c->sq,    c->sk,         H,         dqk, s->d_v,
                           s->causal, c->q_pos0, c->scale, c->q_split, c->q_pos1};
  const size_t nk = (size_t)c->B * c->sk * H;
  double *q = kt_e16_to_d(f16, c->q, (size_t)c->B * c->sq * H * dqk);
  double *v = kt_e16_to_d(f16, c->v, nk * s->d_v);
  double *k = kt_k_to_d(f16, bk->packed, c->kn, c->kr, nk, H, dn, dr);
  attn_ref_fwd_docs(&d, c->cu ? &docs : NULL, q, k, v, o, lse);
  free(q), free(k), free(v);
}

/* The launch's arguments for c, its outputs set to NaN first (every element must be written). */
static launch_args case_args(const built_kernel *bk, fwd_case *c) {
  for (size_t i = 0; i < c->no; i++) c->o[i] = 0x7fff;
  for (size_t i = 0; i < c->nl; i++) c->lse[i] = NAN;
  const kt_qpos kp = kt_qpos_kernel(&(kt_qpos){c->q_pos0, c->q_split, c->q_pos1});
  return (launch_args){bk->fn, c->q,   c->kn, c->kr_arg,    c->v,         c->o,         c->lse,
                       c->sq,  c->sk,  kp.q_pos0, kp.q_split, kp.q_pos1, c->scale, c->tmaps,
                       c->cu,  c->n_cu, c->ld_kr};
}

/* Launches (outputs NaN first) on the executor's default (shuffled) schedule with sm_90's
 * shared-memory limit; returns the launch's message in msg (0: it ran). */
static int launch_case(const built_kernel *bk, fwd_case *c, char *msg, size_t n) {
  launch_args a = case_args(bk, c);
  return sm90_launch(&bk->kh, kh_grid(&bk->kh, c->sq, c->sk, c->B), thunk, &a, 0, 0, msg, n);
}

/* launch_case on the given schedule seed (0: the default), recording every wgmma the
 * executor issues into tr [cap] (*n_tr: how many were issued). */
static int launch_case_traced(const built_kernel *bk, fwd_case *c, unsigned long long seed,
                              mg_host_wgmma_issue *tr, size_t cap, size_t *n_tr, char *msg,
                              size_t n) {
  launch_args a = case_args(bk, c);
  mg_host_launch_opts lo;
  memset(&lo, 0, sizeof lo);
  lo.arch = 90;
  lo.seed = seed;
  lo.wgmma_trace = tr, lo.wgmma_trace_cap = cap, lo.wgmma_trace_len = n_tr;
  return mg_host_kernel_launch(bk->kh.k, kh_grid(&bk->kh, c->sq, c->sk, c->B),
                               (mg_host_dim3){(unsigned)bk->kh.threads, 1, 1}, bk->kh.smem, &lo,
                               thunk, &a, msg, n);
}

/* test_attn_fwd.c's tolerances: O |err| <= 2 NOISE_O rms(O) + 2u |ref|, LSE 1e-5 (1 + |ref|);
 * NOISE_O the largest noise figure measured here: 6.6e-3 (test_asan's case at
 * MLAGEN_TEST_SEED=2002, the same in the -O2 build; test_attn_fwd.c's cases: 6.0e-3). */
#define NOISE_O 6.6e-3
static kt_tol tol_o(const mg_kernel_spec *s) {
  return (kt_tol){2 * NOISE_O, 2 * kt_unit_roundoff(is_fp16(s) ? KT_F16 : KT_BF16)};
}
static const kt_tol tol_lse = {1e-5, 1e-5};

/* Compares with the reference; returns NaN outputs, worst err/bound in *oe, *le, the first
 * failure in msg (msg[0] 0 when both pass). */
static size_t compare(const built_kernel *bk, const fwd_case *c, double *oe, double *le,
                      char *msg, size_t n) {
  const mg_kernel_spec *s = &bk->kh.spec;
  double *ro = malloc((c->no ? c->no : 1) * sizeof *ro), *rl = malloc((c->nl ? c->nl : 1) * sizeof *rl);
  reference(bk, c, ro, rl);
  const size_t keep = (size_t)(c->B - c->poisoned); /* the items compared */
  size_t nans = kt_check_fwd("attn_fwd_sm90", is_fp16(s) ? KT_F16 : KT_BF16, c->o, ro,
                             c->no / c->B * keep, (size_t)s->d_v, c->lse, rl, c->nl / c->B * keep,
                             tol_o(s), tol_lse, oe, le, msg, n);
  free(ro), free(rl);
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

static double g_worst_o, g_worst_lse;

/* launch_case for a packed case, watching the key rows (k_nope) each CTA's TMA loads read;
 * *tiles_ok: 1 when every CTA read its documents' key tiles and no others (kt_tile_check),
 * else 0 with the reason in tmsg. */
static int launch_watched(const built_kernel *bk, fwd_case *c, int *tiles_ok, char *tmsg,
                          size_t tn, char *msg, size_t n) {
  const mg_kernel_spec *s = &bk->kh.spec;
  const int H = s->heads, gx = (c->sq + bk->block_m - 1) / bk->block_m;
  const size_t row = (size_t)H * (bk->packed ? s->d_n + s->d_r : s->d_n) * sizeof *c->kn;
  kt_tile_watch tw;
  kt_tile_watch_init(&tw, c->kn, row, (size_t)c->sk, (size_t)gx * H);
  tw.lo.arch = 90;
  launch_args a = case_args(bk, c);
  const int rc = mg_host_kernel_launch(bk->kh.k, kh_grid(&bk->kh, c->sq, c->sk, c->B),
                                       (mg_host_dim3){(unsigned)bk->kh.threads, 1, 1},
                                       bk->kh.smem, &tw.lo, thunk, &a, msg, n);
  const kt_qpos pos = {c->q_pos0, c->q_split, c->q_pos1};
  *tiles_ok = rc || kt_tile_check(&tw, gx, H, bk->block_m, 1, c->sq, c->cu, c->n_cu, s->causal,
                                  &pos, c->sk, bk->block_n, tmsg, tn);
  kt_tile_watch_free(&tw);
  return rc;
}

/* Launches the initialized case c, checks it (a packed one's key tiles too), prints a line
 * and frees it. */
static void check_case(const built_kernel *bk, fwd_case *c) {
  char msg[1024], tmsg[300];
  double t0 = kh_now();
  int tiles_ok = 1;
  if (c->cu ? launch_watched(bk, c, &tiles_ok, tmsg, sizeof tmsg, msg, sizeof msg)
            : launch_case(bk, c, msg, sizeof msg))
    fail_msg("%s: launch failed: %s", bk->kh.name, msg);
  if (!tiles_ok) fail_msg("%s", tmsg);
  double oe, le;
  size_t nans = compare(bk, c, &oe, &le, msg, sizeof msg);
  print_message("  %s B=%d S_q=%d S_k=%d q_pos0=%d q_split=%d q_pos1=%d%s: err/bound O %.2f LSE "
                "%.2f (%.2f s)\n", bk->kh.name + strlen("mla_attn_fwd_sm90_"), c->B, c->sq, c->sk,
                c->q_pos0, c->q_split, c->q_pos1, c->cu ? " packed" : "", oe, le, kh_now() - t0);
  if (nans) fail_msg("%zu NaN outputs", nans);
  if (msg[0]) fail_msg("%s", msg);
  if (oe > g_worst_o) g_worst_o = oe;
  if (le > g_worst_lse) g_worst_lse = le;
  case_free(c);
}
static void run_case_pos(const built_kernel *bk, int B, int sq, int sk, const kt_qpos *pos) {
  fwd_case c;
  case_init_pos(bk, &c, B, sq, sk, pos);
  check_case(bk, &c);
}
static void run_case(const built_kernel *bk, int B, int sq, int sk, int q_pos0) {
  run_case_pos(bk, B, sq, sk, &(kt_qpos){q_pos0, 0, 0});
}
/* run_case with the last batch item's inputs NaN (poison_last). */
static void run_case_poisoned(const built_kernel *bk, int B, int sq, int sk, int q_pos0) {
  fwd_case c;
  case_init(bk, &c, B, sq, sk, q_pos0);
  poison_last(bk, &c);
  check_case(bk, &c);
}

/* Ping-pong's turns as the executor's wgmma issue trace shows them, per CTA: the turns go
 * warpgroup 0, 1, 0, 1, ... and in each a warpgroup issues exactly the GEMMs of that turn
 * (overlap 1: turn k is S_k = Q K_k^T, d_qk / 16 wgmmas from shared memory, then
 * O += P_k-1 V_k-1, block_n / 16 with P in registers; overlap 0: turn 2k S_k, 2k + 1
 * P_k V_k), of the tiles its own rows see (none in the turns it sits out). The model is
 * the test's, from the rows' visible keys (causal: key <= q_pos0 + row), for a case with
 * whole 128-row blocks. Returns the first mismatch in msg (msg[0] 0 when none). */
static void check_turns(const built_kernel *bk, const fwd_case *c, int overlap,
                        const mg_host_wgmma_issue *tr, size_t n_tr, char *msg, size_t n) {
  const mg_kernel_spec *s = &bk->kh.spec;
  const int bn = bk->block_n, n_s = (s->d_n + s->d_r) / 16, n_pv = bn / 16;
  const unsigned gx = (unsigned)(c->sq / 128), nblk = gx * (unsigned)s->heads * (unsigned)c->B;
  msg[0] = 0;
  assert_int_equal(c->sq % 128, 0);
  size_t seen = 0;
  for (unsigned blk = 0; blk < nblk; blk++) {
    const int m0 = 128 * (int)(blk % gx);
    int t[2], tiles = 0; /* each warpgroup's key tiles [0, t[w]), the CTA's */
    for (int w = 0; w < 2; w++) {
      const int last = s->causal ? c->q_pos0 + m0 + 64 * w + 63 : c->sk - 1;
      t[w] = c->sk == 0 ? 0 : (last < c->sk - 1 ? last : c->sk - 1) / bn + 1;
      if (t[w] > tiles) tiles = t[w];
    }
    const int turns = overlap ? (tiles ? tiles + 1 : 0) : 2 * tiles;
    size_t at = 0; /* position in blk's issues */
    size_t i = 0;  /* position in tr */
#define NEXT_OF_BLOCK() \
  while (i < n_tr && tr[i].block != blk) i++
    for (int k = 0; k < turns; k++)
      for (int w = 0; w < 2; w++)
        for (int g = 0; g < 2; g++) { /* S, then P V */
          const int tile = overlap ? k - g : k / 2;
          const int has = overlap ? tile >= 0 && tile < t[w] : (k % 2 == g) && tile < t[w];
          for (int e = 0; has && e < (g ? n_pv : n_s); e++, at++, i++) {
            NEXT_OF_BLOCK();
            if (i == n_tr || tr[i].warpgroup != (unsigned)w || tr[i].a_regs != g ||
                tr[i].n != (unsigned)(g ? s->d_v : bn)) {
              snprintf(msg, n, "block %u: issue %zu should be warpgroup %d's %s (turn %d, tile %d), "
                       "the executor issued %s", blk, at, w, g ? "P V" : "S = Q K^T", k, tile,
                       i == n_tr ? "none" : tr[i].a_regs ? "a P V" : "an S");
              if (i < n_tr)
                snprintf(msg + strlen(msg), n - strlen(msg), " of warpgroup %u (line %d)",
                         tr[i].warpgroup, tr[i].line);
              return;
            }
          }
        }
    NEXT_OF_BLOCK();
#undef NEXT_OF_BLOCK
    if (i < n_tr) {
      snprintf(msg, n, "block %u: %zu issues expected, more issued", blk, at);
      return;
    }
    seen += at;
  }
  if (seen != n_tr) snprintf(msg, n, "%zu issues expected, %zu issued", seen, n_tr);
}

/* Launches the case of c (traced, seed `seed`) and checks its output and the turns; returns
 * the first failure in msg (launch reported, output or order wrong), msg[0] 0 when none. */
static void run_turns(const built_kernel *bk, fwd_case *c, int overlap, unsigned long long seed,
                      char *msg, size_t n) {
  enum { CAP = 1 << 16 };
  mg_host_wgmma_issue *tr = malloc(CAP * sizeof *tr);
  assert_non_null(tr);
  size_t n_tr = 0;
  if (!launch_case_traced(bk, c, seed, tr, CAP, &n_tr, msg, n)) {
    assert_true(n_tr <= CAP);
    const size_t nans = compare_mutant(bk, c, msg, n);
    if (nans && !msg[0]) snprintf(msg, n, "%zu NaN outputs", nans);
    if (!msg[0]) check_turns(bk, c, overlap, tr, n_tr, msg, n);
  }
  free(tr);
}

/* Ping-pong's order of turns on a traced case of bk (pingpong = 1): one 128-row CTA per
 * head (2 heads) at query position 192 of 320 keys (causal: warpgroup 0 needs one tile
 * less than warpgroup 1 and sits out its last turn), on 2 schedules; not causal on one. */
static void check_turns_case(const built_kernel *bk) {
  char msg[1024];
  fwd_case c;
  case_init(bk, &c, 1, 128, 320, 192);
  const int causal = bk->kh.spec.causal, overlap = kh_config_int(&bk->kh, "overlap");
  for (unsigned long long seed = 1; seed <= (causal ? 2u : 1u); seed++) {
    run_turns(bk, &c, overlap, seed, msg, sizeof msg);
    if (msg[0]) fail_msg("%s (seed %llu): %s", bk->kh.name, seed, msg);
  }
  print_message("  %s: the turns of 2 CTAs in order (%d schedules)\n",
                bk->kh.name + strlen("mla_attn_fwd_sm90_"), causal ? 2 : 1);
  case_free(&c);
}

/* A shape with one configuration, causal and not: S = 1, S = 77 with batch 2 (no tile
 * divides it: TMA rows past a batch item's end are zero fill), the same with NaN in every
 * input of item 1 (item 0 checked: batch isolation), a query shard at 60 of 100 keys alone
 * and with batch 3 (item 2 NaN), a query
 * shard at 60 of 100 keys, one at 130 of 200 (the diagonal inside a tile), every tile full
 * with more tiles than stages (the ring wraps), no keys; with ping-pong, the order of its
 * turns (check_turns_case). */
static void check_shape(int dn, int dr, int dv, const char *const *sets, int n_sets) {
  for (int causal = 1; causal >= 0; causal--) {
    mg_kernel_spec s = make_spec(2, dn, dr, dv, causal);
    for (int i = 0; i < n_sets; i++) kh_set(&s, sets[i]);
    built_kernel bk;
    build_edit(&s, NULL, &bk);
    run_case(&bk, 1, 1, 1, 0);
    run_case(&bk, 2, 77, 77, 0);
    run_case_poisoned(&bk, 2, 77, 77, 0);
    run_case(&bk, 1, 40, 100, 60);
    run_case_poisoned(&bk, 3, 40, 100, 60); /* items 0 and 1 checked, S_q != S_k */
    run_case(&bk, 1, 70, 200, 130);
    run_case(&bk, 1, 128, 256, 128);
    run_case(&bk, 1, 5, 0, 0);
    if (kh_config_int(&bk.kh, "pingpong")) check_turns_case(&bk);
    kh_free(&bk.kh);
  }
  print_message("  worst err/bound so far: O %.2f LSE %.2f\n", g_worst_o, g_worst_lse);
}

/* DeepSeek-V3 heads (d_qk 192, d_v 128): the default (block_m 128: 2 consumers, block_n
 * 128, 2 stages, overlap) with ping-pong, and the order of its turns (the default without
 * it: test_unusual_heads, test_two_chunk_positions). */
static const char *const pp_deepseek[] = {"pingpong=1"};
static void test_deepseek_heads(void **state) {
  (void)state;
  check_shape(128, 64, 128, pp_deepseek, 1);
}
/* One consumer warpgroup, block_n 64, 3 stages, one GEMM at a time (overlap 0); and
 * packed keys with overlap. */
static void test_deepseek_one_consumer(void **state) {
  (void)state;
  const char *a[] = {"block_m=64", "block_n=64", "stages=3", "overlap=0"};
  check_shape(128, 64, 128, a, 4);
  const char *b[] = {"block_m=64", "block_n=64", "stages=2", "k_packed=1"};
  check_shape(128, 64, 128, b, 4);
}
/* An unusual MLA shape (d_n 64, d_r 32, d_v 64: 64B-swizzled k_rope boxes, 3 Q boxes of
 * 32 columns), and fp16. */
static void test_unusual_heads(void **state) {
  (void)state;
  check_shape(64, 32, 64, NULL, 0);
  mg_kernel_spec s = make_spec(2, 64, 32, 64, 1);
  snprintf(s.dtype, sizeof s.dtype, "fp16");
  built_kernel bk;
  build_edit(&s, NULL, &bk);
  g_kr_contig = 1; /* split keys: the one contiguous k_rope (ld_k_rope = d_r) */
  run_case(&bk, 2, 77, 150, 73);
  g_kr_contig = 0;
  kh_free(&bk.kh);
}

/* Wide heads, d_qk 256 and d_v 256 (GLM-4.7-Flash's 256/256: d_n 192, d_r 64): O += P V
 * is m64n256k16; the default configuration (block_m 128, block_n 64, 2 stages) with
 * ping-pong and one GEMM per turn (overlap 0), and the order of its turns. */
static const char *const pp_wide[] = {"pingpong=1", "overlap=0"};
static void test_wide_heads(void **state) {
  (void)state;
  check_shape(192, 64, 256, pp_wide, 2);
}

/* Split keys: tmaps[2] made as if ld_k_rope were d_r (a map or kernel ignoring it) over the
 * wide k_rope reads the NaN between its rows, or other tokens' RoPE parts: caught. Run by
 * test_mutations_caught. */
static void ld_k_rope_mutation_caught(void) {
  mg_kernel_spec s = make_spec(2, 64, 32, 64, 1);
  kh_set(&s, "block_m=64"), kh_set(&s, "block_n=64"), kh_set(&s, "stages=2");
  built_kernel bk;
  build_edit(&s, NULL, &bk);
  fwd_case c;
  case_init(&bk, &c, 2, 77, 77, 0);
  c.map_ld_dr = 1;
  prepare_keys(&bk, &c);
  char msg[1024];
  if (launch_case(&bk, &c, msg, sizeof msg)) fail_msg("launch failed: %s", msg);
  const size_t nans = compare_mutant(&bk, &c, msg, sizeof msg);
  print_message("  tmaps[2] without ld_k_rope: %zu NaN outputs; %.150s\n", nans, msg[0] ? msg : "NOT CAUGHT");
  if (!nans && !msg[0]) fail_msg("tmaps[2] without ld_k_rope was not caught");
  case_free(&c);
  kh_free(&bk.kh);
}

/* The source with e applied (block_m 64, block_n 64, 2 stages, `overlap`) on 8 key tiles
 * through the 2-stage ring: the check must fail or the launch be reported. */
static void mutation_caught(const sm90_edit *e, int overlap) {
  mg_kernel_spec s = make_spec(2, 64, 32, 64, 1);
  kh_set(&s, "block_m=64"), kh_set(&s, "block_n=64"), kh_set(&s, "stages=2");
  kh_set(&s, overlap ? "overlap=1" : "overlap=0");
  built_kernel bk;
  build_edit(&s, e, &bk);
  fwd_case c;
  case_init(&bk, &c, 1, 128, 512, 384);
  char msg[1024];
  int rc = launch_case(&bk, &c, msg, sizeof msg);
  const char *how = "launch reported";
  if (!rc) {
    size_t nans = compare_mutant(&bk, &c, msg, sizeof msg);
    if (!nans && !msg[0]) fail_msg("removing '%s' was not caught", e->from);
    how = "check failed";
  }
  print_message("  overlap %d without '%s': %s: %.300s\n", overlap, e->from, how, msg);
  case_free(&c);
  kh_free(&bk.kh);
}

/* Each mutation of the rendered source must make the check fail or the launch be reported
 * (a deadlock, a wgmma protocol error); ping-pong's, the order of its turns be wrong or the
 * launch be reported. And ping-pong with one consumer refused. Every mbarrier wait and
 * wgmma wait, the loop's and those around it (Q's; overlap 1: the first tile's K and S
 * waits, the last tile's V and P V waits): a missing mbarrier wait is reported at the wgmma
 * reading the load (the executor: data of a load no wait observed, even if it landed). The
 * last tile's release after the loop: test_varlen_mutations_caught (observable only when
 * the producer waits for it). The __syncthreads after the mbarrier inits (the executor:
 * a barrier used by a thread its init is not visible to). The wgmma fences: the default
 * run removes the PV one on overlap 1 (in the loop the S fence just before covers it, so it is
 * caught at the last tile's O += P V, after a wait that delivered), MLAGEN_TEST_EXHAUSTIVE=1
 * (ctest -C exhaustive) each on both overlaps. fence_operand(...) is a compiler-only register
 * fence (an empty asm; nothing on the host): not among the mutations. */
static void test_mutations_caught(void **state) {
  (void)state;
  ld_k_rope_mutation_caught();
  static const sm90_edit muts[] = {
      {"mbar_wait(&full_k[st], parity(j));", ""},
      {"mbar_wait(&full_v[pst], parity(j - 1));", ""},
      {"mbar_arrive(&empty[pst]);", ""},
      {"mbar_wait(&empty[st], ph ^ 1u);", ""},
      {"wgmma_wait<1>();  // MUTATION: S wait", ""},
      {"wgmma_wait<0>();  // MUTATION: PV wait", ""},
      /* the steps outside the loop: Q's wait, the first tile's K and S waits, the last
       * tile's V and P V waits; the mbarrier inits' barrier */
      {"mbar_wait(q_full, 0);", ""},
      {"mbar_wait(&full_k[0], 0);  // MUTATION: first K wait", ""},
      {"wgmma_wait<0>();  // MUTATION: first S wait", ""},
      {"mbar_wait(&full_v[st], parity(wg_tiles - 1));  // MUTATION: last V full wait", ""},
      {"wgmma_wait<0>();  // MUTATION: last PV wait", ""},
      {"__syncthreads();  // MUTATION: init barrier", ""},
      /* overlap = 0 (the edits name that path's lines) */
      {"mbar_wait(&full_k[st], parity(j));", ""},
      {"mbar_wait(&full_v[st], parity(j));  // MUTATION: V full wait", ""},
      {"mbar_arrive(&empty[st]);  // MUTATION: empty release", ""},
      {"wgmma_wait<0>();  // MUTATION: S wait", ""},
      {"wgmma_wait<0>();  // MUTATION: PV wait", ""},
  };
  for (size_t m = 0; m < sizeof muts / sizeof muts[0]; m++) mutation_caught(&muts[m], m < 12);
  static const struct {
    int overlap, sample;
    sm90_edit e;
  } fences[] = {
      {1, 1, {"wgmma_fence();  // MUTATION: PV fence", ""}},
      {1, 0, {"wgmma_fence();  // MUTATION: S fence", ""}},
      {0, 0, {"wgmma_fence();  // MUTATION: S fence", ""}},
      {0, 0, {"wgmma_fence();  // MUTATION: PV fence", ""}},
  };
  const int all = kh_sweep_exhaustive();
  for (size_t m = 0; m < sizeof fences / sizeof fences[0]; m++)
    if (all || fences[m].sample) mutation_caught(&fences[m].e, fences[m].overlap);
  /* Ping-pong (the output stays right: its barriers order no data): the turn wait removed
   * (the barriers' balance breaks), or made an arrive (balanced but nobody waits: the
   * order of the turns breaks), or the hand-back removed (a deadlock). */
  static const sm90_edit pp_muts[] = {
      {"bar_sync(PP_BAR + wg, 256);", ";"},
      {"bar_sync(PP_BAR + wg, 256);  // MUTATION: turn wait", "bar_arrive(PP_BAR + wg, 256);"},
      {"bar_arrive(PP_BAR + 1 - wg, 256);", ";"},
  };
  for (size_t m = 0; m < sizeof pp_muts / sizeof pp_muts[0]; m++) {
    mg_kernel_spec s = make_spec(2, 64, 32, 64, 1);
    kh_set(&s, "block_n=64"), kh_set(&s, "pingpong=1");
    built_kernel bk;
    build_edit(&s, &pp_muts[m], &bk);
    fwd_case c;
    case_init(&bk, &c, 1, 128, 320, 192);
    char msg[1024];
    run_turns(&bk, &c, 1, 0, msg, sizeof msg);
    if (!msg[0]) fail_msg("'%s' -> '%s' was not caught", pp_muts[m].from, pp_muts[m].to);
    print_message("  pingpong '%s' -> '%s': %.150s\n", pp_muts[m].from, pp_muts[m].to, msg);
    case_free(&c);
    kh_free(&bk.kh);
  }
  mg_kernel_spec s = make_spec(2, 128, 64, 128, 1);
  kh_set(&s, "block_m=64"), kh_set(&s, "pingpong=1");
  sm90_expect_reject(&s, "pingpong needs two consumer warpgroups");
}

/* The two-chunk queries of the all-gather context-parallel form (laga-cp; the cases of
 * kt_two_chunk_cases: a warpgroup's 64 rows straddle the chunks), DeepSeek heads, causal
 * and not: the default (block_m 128, 2 consumers) and block_m 64 with block_n 64. And the
 * kernel ignoring the second chunk (every row at q_pos0 + i) fails the causal check on the
 * cases with a gap between the chunks (the last rank's are adjacent: not run there). */
static void test_two_chunk_positions(void **state) {
  (void)state;
  const kt_two_chunk *tc;
  const int n = kt_two_chunk_cases(&tc);
  for (int causal = 1; causal >= 0; causal--)
    for (int v = 0; v < 2; v++) {
      mg_kernel_spec s = make_spec(2, 128, 64, 128, causal);
      if (v) kh_set(&s, "block_m=64"), kh_set(&s, "block_n=64");
      built_kernel bk;
      build_edit(&s, NULL, &bk);
      for (int i = 0; i < n; i++) {
        const kt_qpos pos = kt_qpos_lagacp(tc[i].P, tc[i].r, tc[i].a, tc[i].b);
        run_case_pos(&bk, 1, tc[i].a + tc[i].b, tc[i].P * (tc[i].a + tc[i].b), &pos);
      }
      kh_free(&bk.kh);
    }
  const sm90_edit mut = {"qpos{q_pos0, q_split, q_pos1}", "qpos{q_pos0, 1 << 30, q_pos1}"};
  mg_kernel_spec s = make_spec(2, 64, 32, 64, 1);
  kh_set(&s, "block_m=64"), kh_set(&s, "block_n=64");
  built_kernel bk;
  build_edit(&s, &mut, &bk);
  int runs = 0;
  for (int i = 0; i < n; i++) {
    const kt_qpos pos = kt_qpos_lagacp(tc[i].P, tc[i].r, tc[i].a, tc[i].b);
    if (pos.q_pos1 == pos.q_pos0 + pos.q_split) continue;
    runs++;
    fwd_case c;
    case_init_pos(&bk, &c, 1, tc[i].a + tc[i].b, tc[i].P * (tc[i].a + tc[i].b), &pos);
    char msg[1024];
    if (launch_case(&bk, &c, msg, sizeof msg)) fail_msg("launch failed: %s", msg);
    const size_t nans = compare_mutant(&bk, &c, msg, sizeof msg);
    print_message("  [second chunk ignored] P=%d r=%d a=%d b=%d: %.150s\n", tc[i].P, tc[i].r,
                  tc[i].a, tc[i].b, msg[0] ? msg : "NOT CAUGHT");
    if (nans) fail_msg("second chunk ignored: NaN outputs, not a numerical failure");
    if (!msg[0]) fail_msg("second chunk ignored: passes the per-element check");
    case_free(&c);
  }
  assert_int_equal(runs, 3); /* the cases with a gap between the chunks */
  kh_free(&bk.kh);
}

/* Packed sequences: kernel_test_util.h's streams (kt_varlen_cases) in T_CAP token rows. */
#define T_CAP KT_VARLEN_CAP

/* A packed case of the varlen variant bk: cu [n + 1] over keys 0 .. T_CAP - 1, sq query rows
 * at pos; NaN in every slack row (position >= cu[n]) of q, k_nope, k_rope and v. */
static void varlen_init(const built_kernel *bk, fwd_case *c, const int *cu, int n, int sq,
                        const kt_qpos *pos) {
  const mg_kernel_spec *s = &bk->kh.spec;
  const int H = s->heads, dqk = s->d_n + s->d_r, T = cu[n];
  case_init_pos(bk, c, 1, sq, T_CAP, pos);
  c->cu = cu, c->n_cu = n;
  kt_nan_slack_e16(c->q, sq, (size_t)H * dqk, pos, T);
  kt_nan_slack_e16(c->kn, T_CAP, (size_t)H * (bk->packed ? dqk : s->d_n), NULL, T);
  if (c->kr) kt_nan_slack_e16(c->kr, T_CAP, (size_t)s->d_r, NULL, T);
  kt_nan_slack_e16(c->v, T_CAP, (size_t)H * s->d_v, NULL, T);
  prepare_keys(bk, c); /* the slack rows' NaN into the wide k_rope */
}
static void varlen_run(const built_kernel *bk, const int *cu, int n, int sq, const kt_qpos *pos) {
  fwd_case c;
  varlen_init(bk, &c, cu, n, sq, pos);
  check_case(bk, &c);
}

/* The packed-sequence variant (spec.varlen, "_varlen") against attn_ref.h's float64
 * per-document reference, causal and not: the default configuration (2 consumers, block_n
 * 128) with ping-pong (causal with overlap, not causal without; the warpgroups of a CTA
 * whose rows lie in different documents sit out turns before and after their tiles) on
 * many short documents (and an empty one, cu padded as the executor pads
 * it), on one document (260 of 300 rows) and on rank 0 of laga-cp at P = 2 (chunks [0, 75)
 * and [225, 300): the 200-token document cut by the split, slack rows in the second chunk);
 * causal only (the larger kernel): one consumer, block_n 64, 3 stages, no overlap, packed keys on
 * the short documents, both compiled for sm_90a with no spill, as is the non-causal one. NaN
 * fills every slack row of every input. */
static void test_varlen(void **state) {
  (void)state;
  const kt_varlen *vl;
  kt_varlen_cases(&vl);
  const kt_qpos at0 = {0, 0, 0}, cp = kt_qpos_lagacp(2, 0, T_CAP / 4, T_CAP / 4);
  kh_sweep sw;
  kh_sweep_open(&sw, 60, KH_SWEEP_SMEM | KH_SWEEP_SM90_ONLY | KH_SWEEP_WGMMA_PIPELINED);
  for (int causal = 0; causal <= 1; causal++) {
    mg_kernel_spec s = make_spec(2, 128, 64, 128, causal);
    s.varlen = 1;
    kh_set(&s, "pingpong=1");
    if (!causal) kh_set(&s, "overlap=0");
    built_kernel bk;
    build_edit(&s, NULL, &bk);
    varlen_run(&bk, vl[0].cu, vl[0].n, T_CAP, &at0);
    varlen_run(&bk, vl[0].cu, vl[0].n, T_CAP / 2, &cp);
    varlen_run(&bk, vl[1].cu, vl[1].n, T_CAP, &at0);
    kh_free(&bk.kh);
    if (!causal) {
      kh_sweep_compile(&sw, &s, ""); /* the non-causal varlen kernel compiles too */
      continue;
    }
    /* Key tiles no warpgroup computes: block_n 64, warpgroup 0's rows at positions 0..63
     * (document [0, 64)), warpgroup 1's at 200..263 (document [200, 300)): the CTA's tiles
     * cover keys [-56, 264), and those of [72, 200) are only released, which must wait for
     * their K as well as their V (an earlier release waited for V alone: over-arrival on the
     * stage's empty barrier while its K load was in flight). */
    static const int gap[] = {0, 64, 200, 300};
    kh_set(&s, "block_n=64"), kh_set(&s, "stages=2");
    build_edit(&s, NULL, &bk);
    varlen_run(&bk, gap, 3, 128, &(kt_qpos){0, 64, 200});
    kh_free(&bk.kh);
    kh_sweep_compile(&sw, &s, "");
    const char *a[] = {"block_m=64", "block_n=64", "stages=3", "overlap=0", "k_packed=1", "pingpong=0"};
    for (int i = 0; i < 6; i++) kh_set(&s, a[i]);
    build_edit(&s, NULL, &bk);
    varlen_run(&bk, vl[0].cu, vl[0].n, T_CAP, &at0);
    kh_free(&bk.kh);
    kh_sweep_compile(&sw, &s, "");
  }
  kh_sweep_close(&sw);
  print_message("  worst err/bound so far: O %.2f LSE %.2f\n", g_worst_o, g_worst_lse);
}

/* Wrong boundaries in the varlen variant are caught: a row seeing one key past its range
 * (the next document's first, or causal its next token) fails the per-element check; key
 * tiles aligned to start at the range's first key instead of ending at its last (slack
 * rows' NaN then reach P V) give NaN outputs; a CTA whose tiles run from key 0 (its rows'
 * hull taken from row 0: every key tile before its documents loaded, and released unused)
 * passes the per-element check and is caught by the key tiles it reads. */
static void test_varlen_mutations_caught(void **state) {
  (void)state;
  static const sm90_edit muts[] = {
      {"qpos(r0 + 8)", "qpos(r0 + 9)"},
      {"k0 = kt.k0", "k0 = kt.lo"},
  };
  const kt_varlen *vl;
  kt_varlen_cases(&vl);
  for (size_t m = 0; m < sizeof muts / sizeof muts[0]; m++) {
    mg_kernel_spec s = make_spec(2, 64, 32, 64, 1);
    s.varlen = 1;
    kh_set(&s, "block_m=64"), kh_set(&s, "block_n=64");
    built_kernel bk;
    build_edit(&s, &muts[m], &bk);
    fwd_case c;
    varlen_init(&bk, &c, vl[0].cu, vl[0].n, T_CAP, &(kt_qpos){0, 0, 0});
    char msg[1024];
    if (launch_case(&bk, &c, msg, sizeof msg)) fail_msg("launch failed: %s", msg);
    const size_t nans = compare_mutant(&bk, &c, msg, sizeof msg);
    if (!nans && !msg[0]) fail_msg("'%s' -> '%s' was not caught", muts[m].from, muts[m].to);
    print_message("  '%s' -> '%s': %zu NaN outputs; %.150s\n", muts[m].from, muts[m].to, nans, msg);
    case_free(&c);
    kh_free(&bk.kh);
  }
  /* The release of a warpgroup's last tile (after the loop, overlap 1) removed: two
   * consumers (block_m 128, block_n 64, 2 stages) whose rows lie in different documents
   * (warpgroup 0's at positions 0..63 of document [0, 64), warpgroup 1's at 200..263 of
   * [200, 300)): the CTA's 5 tiles cover keys [-56, 264), warpgroup 0 computes tiles 0 and 1,
   * and the producer waits for tile 1's release before it loads tile 3: a deadlock. (With
   * the rows in one document a warpgroup's last tile is among the CTA's last `stages`, whose
   * releases nothing waits for: removing it there is harmless on the hardware too.) */
  {
    static const sm90_edit last = {"mbar_arrive(&empty[st]);  // MUTATION: last release", ""};
    static const int gap[] = {0, 64, 200, 300};
    mg_kernel_spec ls = make_spec(2, 64, 32, 64, 1);
    ls.varlen = 1;
    kh_set(&ls, "block_m=128"), kh_set(&ls, "block_n=64"), kh_set(&ls, "stages=2");
    kh_set(&ls, "overlap=1"), kh_set(&ls, "pingpong=0");
    built_kernel lb;
    build_edit(&ls, NULL, &lb); /* unmutated, the case passes */
    varlen_run(&lb, gap, 3, 128, &(kt_qpos){0, 64, 200});
    kh_free(&lb.kh);
    build_edit(&ls, &last, &lb);
    fwd_case c;
    varlen_init(&lb, &c, gap, 3, 128, &(kt_qpos){0, 64, 200});
    char msg[1024];
    const char *how = "launch reported";
    if (!launch_case(&lb, &c, msg, sizeof msg)) {
      const size_t nans = compare_mutant(&lb, &c, msg, sizeof msg);
      if (!nans && !msg[0]) fail_msg("removing '%s' was not caught", last.from);
      how = "check failed";
    }
    print_message("  without '%s': %s: %.300s\n", last.from, how, msg);
    case_free(&c);
    kh_free(&lb.kh);
  }
  static const sm90_edit all = {"varlen_tail_tiles<CAUSAL, BLOCK_N>(vl, qpos, m0,",
                                "varlen_tail_tiles<CAUSAL, BLOCK_N>(vl, qpos, 0,"};
  mg_kernel_spec s = make_spec(2, 64, 32, 64, 1);
  s.varlen = 1;
  kh_set(&s, "block_m=64"), kh_set(&s, "block_n=64");
  built_kernel bk;
  build_edit(&s, &all, &bk);
  fwd_case c;
  varlen_init(&bk, &c, vl[0].cu, vl[0].n, T_CAP, &(kt_qpos){0, 0, 0});
  char msg[1024], tmsg[300];
  int tiles_ok;
  if (launch_watched(&bk, &c, &tiles_ok, tmsg, sizeof tmsg, msg, sizeof msg)) fail_msg("launch failed: %s", msg);
  const size_t nans = compare_mutant(&bk, &c, msg, sizeof msg);
  print_message("  '%s' -> '%s': per element %s; %s\n", all.from, all.to, nans || msg[0] ? "FAILS" : "passes",
                tiles_ok ? "tiles NOT CAUGHT" : tmsg);
  if (nans || msg[0]) fail_msg("every key tile: fails the per-element check (%zu NaN; %s)", nans, msg);
  if (tiles_ok) fail_msg("every key tile: its key tiles pass the hull check");
  case_free(&c);
  kh_free(&bk.kh);
}

/* The configurations the template's check keeps compile for sm_90a (NVRTC) with no spill,
 * no stack frame and no static shared memory (causal: the larger kernel), with split and
 * packed keys (k_packed 0/1: the explicit plans run the packed ones on sm_90a); sh 0: DeepSeek-V3
 * heads at H 128, 1: the unusual shape at H 40, 2: the wide 256/256 heads. Every
 * configuration is rendered (the check and the shared-memory limit run on all); a covering
 * sample is compiled (kh_sweep_cover: every tunable value and pair of values, and the most
 * shared memory), all of them with MLAGEN_TEST_EXHAUSTIVE=1 (ctest -C exhaustive -L
 * exhaustive). */
static void nvrtc_kept_configs(int sh) {
  kh_sweep sw;
  kh_sweep_open(&sw, 60, KH_SWEEP_SMEM | KH_SWEEP_REJECTS | KH_SWEEP_SM90_ONLY | KH_SWEEP_WGMMA_PIPELINED);
  sw.max_smem = 227 * 1024;
  const int shapes[3][3] = {{128, 64, 128}, {64, 32, 64}, {192, 64, 256}};
  mg_kernel_spec cands[2 * 2 * 3 * 2 * 2 * 2];
  int nc = 0;
  for (int nm = 1; nm <= 2; nm++)
    for (int bn = 64; bn <= 128; bn *= 2)
      for (int st = 2; st <= 4; st++)
        for (int ov = 0; ov <= 1; ov++)
          for (int pp = 0; pp <= 1; pp++)
            for (int kp = 0; kp <= 1; kp++) {
              mg_kernel_spec s = make_spec(sh == 1 ? 40 : 128, shapes[sh][0], shapes[sh][1], shapes[sh][2], 1);
              kh_setf(&s, "block_m=%d", 64 * nm);
              kh_setf(&s, "block_n=%d", bn);
              kh_setf(&s, "stages=%d", st);
              kh_setf(&s, "overlap=%d", ov);
              kh_setf(&s, "pingpong=%d", pp);
              kh_setf(&s, "k_packed=%d", kp);
              cands[nc++] = s;
            }
  sm90_sweep_close(&sw, kh_sweep_cover(&sw, cands, nc, g_test_seed, ""), sh == 2 ? 4 : 16);
}
static void test_nvrtc_kept_configs_deepseek(void **state) { (void)state; nvrtc_kept_configs(0); }
static void test_nvrtc_kept_configs_unusual(void **state) { (void)state; nvrtc_kept_configs(1); }
static void test_nvrtc_kept_configs_wide(void **state) { (void)state; nvrtc_kept_configs(2); }

/* The child side of test_asan (kh_run_asan_child: this program as --asan-case, every kernel
 * an ASan build, MG_HOST_ASAN=1): small heads (d_n 64, d_r 32, d_v 64: 3 Q boxes of 32
 * columns), causal, split keys with the wide k_rope (ld_k_rope), one kernel (block_m 128:
 * two consumers, block_n 64, 2 stages) on partial tiles: 45 queries at 100 of 145 keys,
 * batch 2 (TMA rows past a batch item's end; consumer 1 without rows; 3 key tiles: the ring
 * wraps). Checked per element as the other
 * cases; ASan bounds the global buffers, the dynamic shared memory at the launch's size and
 * the emulator's own buffers (tensor maps, async view, mbarriers). */
static void asan_case_run(void **state) {
  (void)state;
  mg_kernel_spec s = make_spec(2, 64, 32, 64, 1);
  kh_set(&s, "block_m=128"), kh_set(&s, "block_n=64"), kh_set(&s, "stages=2");
  built_kernel bk;
  build_edit(&s, NULL, &bk);
  run_case(&bk, 2, 45, 145, 100);
  kh_free(&bk.kh);
}

/* ASan finds no out-of-bounds access in the kernel or the Hopper emulation. */
static void test_asan(void **state) {
  (void)state;
  kh_run_asan_child("test_attn_fwd_sm90", g_test_seed, asan_case_run);
}

int main(int argc, char **argv) {
  kt_seed_init();
  int rc = kh_test_main(argc, argv, asan_case_run);
  if (rc >= 0) return rc;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_deepseek_heads),
      cmocka_unit_test(test_deepseek_one_consumer),
      cmocka_unit_test(test_unusual_heads),
      cmocka_unit_test(test_wide_heads),
      cmocka_unit_test(test_mutations_caught),
      cmocka_unit_test(test_two_chunk_positions),
      cmocka_unit_test(test_varlen),
      cmocka_unit_test(test_varlen_mutations_caught),
      cmocka_unit_test(test_nvrtc_kept_configs_deepseek),
      cmocka_unit_test(test_nvrtc_kept_configs_unusual),
      cmocka_unit_test(test_nvrtc_kept_configs_wide),
      cmocka_unit_test(test_asan),
  };
  return kh_exit_code(cmocka_run_group_tests(tests, NULL, NULL));
}
