/* sm90_test_util.h: the scaffolding the sm_90a kernel tests run on the host executor share
 * (test_attn_fwd_sm90.c, test_attn_bwd_sm90.c, test_mqa_fwd_sm90.c, test_mqa_bwd_sm90.c):
 * the CUtensorMap stand-in passed by value, the source edit of the mutation tests, the fake
 * driver and parsed manifest the runtime's tensor-map helpers take, the launch on the host
 * executor as sm_90, the end of an NVRTC configuration sweep and a rejected spec (the
 * packed-sequence references are attn_ref.h's and mqa_ref.h's). Include after
 * cmocka.h, kernel_host.h and kernel_test_util.h. */
#ifndef MLAGEN_SM90_TEST_UTIL_H
#define MLAGEN_SM90_TEST_UTIL_H

#include <math.h>
#include <string.h>

#include "fake_driver.h"
#include "kernel_host.h"
#include "mg_driver.h"
#include "mg_manifest.h"
#include "mlagen.h"

/* One CUtensorMap (128 bytes, 64-aligned) as the kernels take it inside their by-value
 * `const __grid_constant__ mla::sm90::TensorMaps<N> tmaps`. */
typedef struct { _Alignas(64) unsigned long long opaque[16]; } tmap_t;

/* A source edit for kh_build_edited (sm90_apply_edit): replaces the first occurrence of
 * `from` by `to` padded with spaces (to "" blanks it). `from` must occur: else the test
 * fails, so a renamed pattern cannot make a mutation test pass. */
typedef struct sm90_edit {
  const char *from, *to;
} sm90_edit;

static inline int sm90_apply_edit(char *src, void *ctx) {
  const sm90_edit *e = ctx;
  char *at = strstr(src, e->from);
  if (!at) fail_msg("mutation pattern '%s' not in the rendered source", e->from);
  size_t nf = strlen(e->from), nt = strlen(e->to);
  assert_true(nt <= nf);
  memcpy(at, e->to, nt);
  memset(at + nt, ' ', nf - nt);
  return 1;
}

/* Builds spec with edit e applied (none when e is NULL) into out; fails the test on error. */
static inline void sm90_build(const mg_kernel_spec *spec, const sm90_edit *e, kh_kernel *out) {
  assert_true(kh_build_edited(NULL, spec, 0, e ? sm90_apply_edit : NULL, (void *)e, out));
}

/* The fake driver (tests/fake_cuda.c: the host executor's device addresses are host
 * addresses) into *drv and kh's parsed manifest into *info: what the runtime's
 * mg_sm90_*_tmaps (runtime/exec/mg_sm90_tmap.h) take. Fails the test on error. */
static inline void sm90_driver_info(const kh_kernel *kh, const mg_driver **drv,
                                    mg_kernel_info *info) {
  fake_driver_use(MLAGEN_FAKE_CUDA);
  mg_diag d = MG_DIAG_INIT;
  *drv = NULL;
  if (mg_driver_get(drv, &d)) fail_msg("driver: %s", mg_diag_msg(&d));
  if (mg_manifest_parse(kh->manifest, info, &d)) fail_msg("manifest: %s", mg_diag_msg(&d));
}

/* Launches kh on the host executor as sm_90 (its shared-memory limit; kh's threads and
 * dynamic shared memory) over grid, thunk(ctx) calling the kernel: on the default shuffled
 * schedule, or that of seed when not 0, or round robin when round_robin. Returns 0 when it
 * ran, else nonzero with the launch's message in msg. */
static inline int sm90_launch(const kh_kernel *kh, mg_host_dim3 grid, void (*thunk)(void *),
                              void *ctx, unsigned long long seed, int round_robin, char *msg,
                              size_t n) {
  mg_host_dim3 block = {(unsigned)kh->threads, 1, 1};
  mg_host_launch_opts lo;
  memset(&lo, 0, sizeof lo);
  lo.arch = 90;
  lo.seed = seed;
  lo.round_robin = round_robin;
  return mg_host_kernel_launch(kh->k, grid, block, kh->smem, &lo, thunk, ctx, msg, n);
}

/* Ends an NVRTC sweep whose kh_sweep_cover calls kept `kept` configurations: prints the
 * count, asserts at least min_kept, closes sw. */
static inline void sm90_sweep_close(kh_sweep *sw, int kept, int min_kept) {
  print_message("  %d configurations kept, %d rejected (%.0f s)\n", kept, sw->rejected,
                kh_now() - sw->t0);
  assert_true(kept >= min_kept);
  kh_sweep_close(sw);
}

/* Asserts that generating spec fails with MLAGEN_EINVAL and a message containing want;
 * prints the message. */
static inline void sm90_expect_reject(const mg_kernel_spec *spec, const char *want) {
  mg_diag d = MG_DIAG_INIT;
  mg_gen *g;
  assert_int_equal(mg_gen_open(&g, NULL, &d), 0);
  mg_kernel k;
  assert_int_equal(mg_gen_kernel(g, spec, &k, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), want));
  print_message("  %s\n", mg_diag_msg(&d));
  mg_diag_clear(&d);
  mg_gen_close(g);
}

#endif
