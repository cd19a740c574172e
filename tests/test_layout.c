/* test_layout.c: the Ulysses all-to-all layout kernels (templates/a2a.cu.tpl:
 * a2a_pack and a2a_unpack) and the fast backward's dQ conversion (templates/dq_convert.cu.tpl),
 * run unchanged on the CPU through the host executor (tests/host/); and every configuration
 * the templates keep, compiled by NVRTC for sm_80 and sm_90a without spills.
 *
 * The all-to-all is simulated: every rank's pack runs, block p of rank r's send buffer is
 * copied to block r of rank p's receive buffer (MPI_Alltoall), every rank's unpack runs. The
 * result is compared bit-exactly with a plain C permutation of the global tensor (rank r holds
 * tokens [r*S_l, (r+1)*S_l) and heads [r*H/P, (r+1)*H/P)), and with runtime/exec/mg_cpu_exec.c's
 * layouts; seq -> head -> seq must give back the input. dq_convert is compared bit-exactly
 * with mg_f32_to_bf16 / mg_f32_to_f16 (round to nearest even). Inputs are random normal
 * values (never zero); the seed is printed, MLAGEN_TEST_SEED overrides it. */
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
#include "mlagen.h"

#include "kernel_test_util.h"

typedef void (*a2a_fn)(const e16 *src, e16 *dst, int seqlen_local, int batch, int heads_total,
                       int sp, int width, int direction);
typedef void (*conv_fn)(const float *dq_accum, e16 *dq, int seqlen_q);

typedef kh_kernel built_kernel; /* fn, threads, name */

static void set(mg_kernel_spec *s, const char *assignment) { kh_set(s, assignment); }

static mg_kernel_spec make_spec(const char *family, const char *dtype, int H) {
  mg_kernel_spec s;
  memset(&s, 0, sizeof s);
  snprintf(s.family, sizeof s.family, "%s", family);
  s.heads = H, s.d_n = 128, s.d_r = 64, s.d_v = 128, s.d_c = 512, s.causal = 1;
  snprintf(s.dtype, sizeof s.dtype, "%s", dtype);
  return s;
}

static void build(const mg_kernel_spec *spec, built_kernel *out) {
  kh_build(NULL, spec, 0, out);
  assert_int_equal(out->threads, 32 * kh_config_int(out, "num_warps"));
}

/* ---- launching ---------------------------------------------------------------------------- */

typedef struct a2a_args {
  const built_kernel *bk;
  const e16 *src;
  e16 *dst;
  int Sl, B, H, P, w, dir;
} a2a_args;

static void a2a_thunk(void *p) {
  a2a_args *a = p;
  ((a2a_fn)a->bk->fn)(a->src, a->dst, a->Sl, a->B, a->H, a->P, a->w, a->dir);
}

static void launch_a2a(const built_kernel *bk, const e16 *src, e16 *dst, int Sl, int B, int H,
                       int P, int w, int dir) {
  /* the manifest's grid: (seqlen_q = S_l, 1, batch) */
  a2a_args a = {bk, src, dst, Sl, B, H, P, w, dir};
  mg_host_launch_opts lo;
  memset(&lo, 0, sizeof lo);
  kh_launch(bk, kh_grid(bk, Sl, Sl, B), &lo, a2a_thunk, &a);
}

/* ---- the all-to-all, simulated -------------------------------------------------------------- */

/* ins[r]: rank r's input; outs[r]: rank r's output. dir 0: seq -> head; 1: head -> seq.
 * Each rank's block is B * S_l * H/P * w elements. */
static void all_to_all(const built_kernel *pack, const built_kernel *unpack, e16 **ins, e16 **outs,
                       int B, int Sl, int H, int P, int w, int dir) {
  const size_t blk = (size_t)B * Sl * (H / P) * w, n = blk * P;
  e16 **send = calloc(P, sizeof *send), **recv = calloc(P, sizeof *recv);
  for (int r = 0; r < P; r++) {
    send[r] = malloc(n * sizeof(e16));
    recv[r] = malloc(n * sizeof(e16));
    for (size_t i = 0; i < n; i++) send[r][i] = recv[r][i] = 0xffff; /* NaN: untouched shows */
    launch_a2a(pack, ins[r], send[r], Sl, B, H, P, w, dir);
  }
  for (int r = 0; r < P; r++) /* MPI_Alltoall: rank r's block p -> rank p's block r */
    for (int p = 0; p < P; p++) memcpy(recv[p] + r * blk, send[r] + p * blk, blk * sizeof(e16));
  for (int r = 0; r < P; r++) launch_a2a(unpack, recv[r], outs[r], Sl, B, H, P, w, dir);
  for (int r = 0; r < P; r++) free(send[r]), free(recv[r]);
  free(send), free(recv);
}

/* The global tensor g [B, S, H, w]; rank r's sequence shard [B, S_l, H, w] and head shard
 * [B, S, H/P, w], by plain indexing. */
static void seq_shard(const e16 *g, e16 *o, int r, int B, int Sl, int H, int P, int w) {
  const int S = Sl * P;
  for (int b = 0; b < B; b++)
    for (int l = 0; l < Sl; l++)
      for (int h = 0; h < H; h++)
        for (int c = 0; c < w; c++)
          o[(((size_t)b * Sl + l) * H + h) * w + c] = g[(((size_t)b * S + r * Sl + l) * H + h) * w + c];
}
static void head_shard(const e16 *g, e16 *o, int r, int B, int Sl, int H, int P, int w) {
  const int S = Sl * P, Hl = H / P;
  for (int b = 0; b < B; b++)
    for (int s = 0; s < S; s++)
      for (int j = 0; j < Hl; j++)
        for (int c = 0; c < w; c++)
          o[(((size_t)b * S + s) * Hl + j) * w + c] = g[(((size_t)b * S + s) * H + r * Hl + j) * w + c];
}

static void check_layouts(const char *dtype, int P, int w) {
  const int B = 2, Sl = 5, H = 8, S = Sl * P;
  const size_t n = (size_t)B * S * H * w, nr = n / P;
  mg_kernel_spec s = make_spec("a2a_pack", dtype, H / P);
  built_kernel pack, unpack;
  build(&s, &pack);
  s = make_spec("a2a_unpack", dtype, H / P);
  build(&s, &unpack);
  const int fp16 = !strcmp(dtype, "fp16");
  e16 *g = malloc(n * sizeof *g);
  for (size_t i = 0; i < n; i++) {
    float v = (float)randn();
    if (v == 0.f) v = 1.f;
    g[i] = fp16 ? float_to_half(v) : float_to_bf16(v);
  }
  e16 *seq[4], *head[4], *got_head[4], *got_seq[4];
  for (int r = 0; r < P; r++) {
    seq[r] = malloc(nr * sizeof(e16));
    head[r] = malloc(nr * sizeof(e16));
    got_head[r] = malloc(nr * sizeof(e16));
    got_seq[r] = malloc(nr * sizeof(e16));
    seq_shard(g, seq[r], r, B, Sl, H, P, w);
    head_shard(g, head[r], r, B, Sl, H, P, w);
    for (size_t i = 0; i < nr; i++) got_head[r][i] = got_seq[r][i] = 0xffff;
  }
  /* seq -> head, from the reference sequence shards */
  all_to_all(&pack, &unpack, seq, got_head, B, Sl, H, P, w, 0);
  for (int r = 0; r < P; r++) assert_memory_equal(got_head[r], head[r], nr * sizeof(e16));
  /* head -> seq, from the reference head shards */
  all_to_all(&pack, &unpack, head, got_seq, B, Sl, H, P, w, 1);
  for (int r = 0; r < P; r++) assert_memory_equal(got_seq[r], seq[r], nr * sizeof(e16));
  /* round trip: seq -> head -> seq from the kernels' own output */
  for (int r = 0; r < P; r++) memset(got_seq[r], 0xff, nr * sizeof(e16));
  all_to_all(&pack, &unpack, got_head, got_seq, B, Sl, H, P, w, 1);
  for (int r = 0; r < P; r++) assert_memory_equal(got_seq[r], seq[r], nr * sizeof(e16));
  print_message("  %s P=%d w=%3d: seq->head, head->seq, round trip bit-exact\n", dtype, P, w);
  for (int r = 0; r < P; r++) free(seq[r]), free(head[r]), free(got_head[r]), free(got_seq[r]);
  free(g);
  kh_free(&pack);
  kh_free(&unpack);
}

/* The send buffer itself, checked against runtime/exec/mg_cpu_exec.c's move_block layouts:
 * seq -> head: send[q] = in[:, :, q*Hl:(q+1)*Hl]; head -> seq: send[q] = in[:, q*Sl:(q+1)*Sl]. */
static void check_send_buffer(int P, int w) {
  const int B = 2, Sl = 5, H = 8, Hl = H / P, S = Sl * P;
  const size_t n = (size_t)B * Sl * H * w, blk = n / P;
  mg_kernel_spec s = make_spec("a2a_pack", "bf16", Hl);
  built_kernel pack;
  build(&s, &pack);
  e16 *in = malloc(n * sizeof *in), *send = malloc(n * sizeof *send);
  for (size_t i = 0; i < n; i++) in[i] = float_to_bf16((float)randn() + 1e-3f);
  for (int dir = 0; dir < 2; dir++) {
    memset(send, 0xff, n * sizeof *send);
    launch_a2a(&pack, in, send, Sl, B, H, P, w, dir);
    for (int q = 0; q < P; q++)
      for (int b = 0; b < B; b++)
        for (int l = 0; l < Sl; l++)
          for (int j = 0; j < Hl; j++) {
            const e16 *d = send + q * blk + (((size_t)b * Sl + l) * Hl + j) * w;
            const e16 *src = dir == 0 ? in + (((size_t)b * Sl + l) * H + q * Hl + j) * w
                                      : in + (((size_t)b * S + q * Sl + l) * Hl + j) * w;
            assert_memory_equal(d, src, w * sizeof(e16));
          }
  }
  free(in), free(send);
  kh_free(&pack);
}

static void test_layouts_bf16(void **state) {
  (void)state;
  const int Ps[] = {1, 2, 4}, ws[] = {64, 192};
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 2; j++) check_layouts("bf16", Ps[i], ws[j]);
}

static void test_layouts_fp16(void **state) {
  (void)state;
  check_layouts("fp16", 4, 64);
}

static void test_send_buffer(void **state) {
  (void)state;
  check_send_buffer(2, 64);
  check_send_buffer(4, 192);
}

/* Other warp counts: the strided loops cover every vector. */
static void test_num_warps(void **state) {
  (void)state;
  for (int nw = 2; nw <= 8; nw *= 4) { /* the default (4) runs in check_layouts */
    const int B = 2, Sl = 5, H = 8, P = 4, w = 192, S = Sl * P;
    const size_t n = (size_t)B * S * H * w, nr = n / P;
    built_kernel pack, unpack;
    char a[32];
    snprintf(a, sizeof a, "num_warps=%d", nw);
    mg_kernel_spec s = make_spec("a2a_pack", "bf16", H / P);
    set(&s, a);
    build(&s, &pack);
    s = make_spec("a2a_unpack", "bf16", H / P);
    set(&s, a);
    build(&s, &unpack);
    e16 *g = malloc(n * sizeof *g), *seq[4], *head[4], *got[4];
    for (size_t i = 0; i < n; i++) g[i] = float_to_bf16((float)randn() + 1e-3f);
    for (int r = 0; r < P; r++) {
      seq[r] = malloc(nr * sizeof(e16)), head[r] = malloc(nr * sizeof(e16));
      got[r] = malloc(nr * sizeof(e16));
      seq_shard(g, seq[r], r, B, Sl, H, P, w);
      head_shard(g, head[r], r, B, Sl, H, P, w);
    }
    all_to_all(&pack, &unpack, seq, got, B, Sl, H, P, w, 0);
    for (int r = 0; r < P; r++) assert_memory_equal(got[r], head[r], nr * sizeof(e16));
    all_to_all(&pack, &unpack, head, got, B, Sl, H, P, w, 1);
    for (int r = 0; r < P; r++) assert_memory_equal(got[r], seq[r], nr * sizeof(e16));
    for (int r = 0; r < P; r++) free(seq[r]), free(head[r]), free(got[r]);
    free(g);
    kh_free(&pack);
    kh_free(&unpack);
  }
}

/* ---- dq_convert ----------------------------------------------------------------------------- */

typedef struct conv_args {
  const built_kernel *bk;
  const float *acc;
  e16 *dq;
  int sq;
} conv_args;

static void conv_thunk(void *p) {
  conv_args *a = p;
  ((conv_fn)a->bk->fn)(a->acc, a->dq, a->sq);
}

static void check_convert(const char *dtype, int H, int dn, int dr, const char *cfg) {
  const int B = 2, sq = 5, dqk = dn + dr;
  mg_kernel_spec s = make_spec("dq_convert", dtype, H);
  s.d_n = dn, s.d_r = dr;
  if (cfg) set(&s, cfg);
  built_kernel bk;
  build(&s, &bk);
  const int fp16 = !strcmp(dtype, "fp16");
  const size_t n = (size_t)B * sq * H * dqk;
  float *acc = malloc(n * sizeof *acc);
  e16 *dq = malloc(n * sizeof *dq);
  for (size_t i = 0; i < n; i++) {
    float v = (float)randn();
    if (v == 0.f) v = 0.5f;
    acc[i] = v;
    dq[i] = 0xffff;
  }
  /* exact ties and edge values: rounding to even must show */
  acc[0] = 1.00390625f;                  /* bf16: tie between 1 and 1.0078125 -> 1 */
  acc[1] = 1.01171875f;                  /* bf16: tie -> 1.015625 (even) */
  acc[2] = fp16 ? 65519.f : 3.0e38f;      /* near the top of the range */
  acc[3] = -1e-30f;                      /* tiny (denormal / underflow in fp16) */
  conv_args a = {&bk, acc, dq, sq};
  mg_host_launch_opts lo;
  memset(&lo, 0, sizeof lo);
  kh_launch(&bk, kh_grid(&bk, sq, sq, B), &lo, conv_thunk, &a); /* (seqlen_q, 1, batch) */
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    const e16 want = fp16 ? mg_f32_to_f16(acc[i]) : mg_f32_to_bf16(acc[i]);
    if (dq[i] != want && bad++ < 5)
      print_message("  %s [%zu]: %a -> 0x%04x, want 0x%04x\n", bk.name, i, acc[i], dq[i], want);
  }
  assert_int_equal(bad, 0);
  print_message("  %s: %zu values bit-exact\n", bk.name, n);
  free(acc), free(dq);
  kh_free(&bk);
}

static void test_dq_convert(void **state) {
  (void)state;
  check_convert("bf16", 8, 128, 64, NULL);
  check_convert("bf16", 2, 64, 32, "num_warps=2");
  check_convert("bf16", 40, 64, 32, "num_warps=8");
  check_convert("fp16", 8, 128, 64, NULL);
}

/* ---- NVRTC ---------------------------------------------------------------------------------- */

/* The configurations the three families keep compile for sm_80 and sm_90a without spills,
 * stack or static shared memory, for DeepSeek-V3's shape at P = 1 and 4, bf16 and fp16: all
 * are rendered, a covering sample is compiled (kh_sweep_cover: every family, dtype, head
 * count and warp count, and every pair of them), all with MLAGEN_TEST_EXHAUSTIVE=1. */
static void test_nvrtc_all_kept_configs(void **state) {
  (void)state;
  kh_sweep sw;
  kh_sweep_open(&sw, 56, 0);
  int kept = 0, nc = 0;
  static mg_kernel_spec cands[2 * 2 * 3 * 3]; /* a covering sample of them is compiled */
  mg_shape shape;
  kh_load_shape("deepseek-v3", NULL, &shape);
  const char *dtypes[2] = {"bf16", "fp16"};
  const int sps[2] = {1, 4};
  for (int t = 0; t < 2; t++)
    for (int spi = 0; spi < 2; spi++) {
      mg_kernel_spec specs[MG_SPEC_MAX_KERNELS];
      int n;
      assert_int_equal(mg_spec_for_model(&shape, sps[spi], dtypes[t], specs, MG_SPEC_MAX_KERNELS, &n, &sw.d), 0);
      for (int i = 0; i < n; i++) {
        if (!specs[i].causal) continue;
        if (strcmp(specs[i].family, "a2a_pack") && strcmp(specs[i].family, "a2a_unpack") &&
            strcmp(specs[i].family, "dq_convert"))
          continue;
        if (strcmp(specs[i].family, "dq_convert") && spi) continue; /* no H in the a2a kernels */
        for (int nw = 2; nw <= 8; nw *= 2) {
          mg_kernel_spec s = specs[i];
          char a[32];
          snprintf(a, sizeof a, "num_warps=%d", nw);
          set(&s, a);
          assert_true(nc < (int)(sizeof cands / sizeof cands[0]));
          cands[nc++] = s;
        }
      }
    }
  kept += kh_sweep_cover(&sw, cands, nc, g_test_seed, "");
  print_message("  %d configurations kept\n", kept);
  assert_int_equal(kept, 2 * (3 + 3 + 3) + 2 * 3); /* per dtype: pack, unpack, dq at P=1; dq at P=4 */
  kh_sweep_close(&sw);
}

/* The child side of test_asan: the layout kernels built with ASan (MG_HOST_ASAN=1, see
 * kh_run_asan_child) on small cases, in a process that has the ASan runtime preloaded. */
static void asan_case_run(void **state) {
  (void)state;
  check_layouts("bf16", 2, 64);
  check_send_buffer(2, 64);
  check_convert("bf16", 2, 64, 32, "num_warps=2");
  check_convert("fp16", 8, 128, 64, NULL);
}

static void test_asan(void **state) {
  (void)state;
  kh_run_asan_child("test_layout", g_test_seed, asan_case_run);
}

int main(int argc, char **argv) {
  kt_seed_init();
  const int rc = kh_test_main(argc, argv, asan_case_run);
  if (rc >= 0) return rc;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_layouts_bf16),
      cmocka_unit_test(test_layouts_fp16),
      cmocka_unit_test(test_send_buffer),
      cmocka_unit_test(test_num_warps),
      cmocka_unit_test(test_dq_convert),
      cmocka_unit_test(test_nvrtc_all_kept_configs),
      cmocka_unit_test(test_asan),
  };
  return kh_exit_code(cmocka_run_group_tests(tests, NULL, NULL));
}
