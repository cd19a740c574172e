/* test_sm90_tmap.c: runtime/exec/mg_sm90_tmap.c, attn_fwd_sm90's four CUtensorMaps (and
 * mqa_fwd_sm90's two: test_mqa_maps, test_mqa_errors; the absorbed backward's three: test_mqa_bwd), through
 * the fake driver (tests/fake_cuda.c), whose cuTensorMapEncodeTiled stores its arguments in
 * the host executor's format (tests/host/mg_host_tmap.h): per map, the rank, dims, byte
 * strides, box, swizzle, element size and base are read back and compared with the
 * template's `tmaps` contract written out here by hand (split and packed keys, bf16 and
 * fp16, widths 64/32/16; split keys' k_rope rows ld_k_rope apart, e.g. the latent's RoPE
 * columns). Errors: a driver without the entry, a wrong family, a missing tunable, a
 * misaligned or null tensor, a k_rope row stride TMA cannot take. mg_sm90_launch_tmaps (the per-launch entry of the
 * executor and the tuner): the same maps from launch arguments, and its refusals (the backward's: test_launch_bwd_tmaps). End to end (the maps driving
 * the kernels on the host executor against float64): test_attn_fwd_sm90, test_attn_bwd_sm90. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "fake_driver.h"
#include "host/mg_host_tmap.h"
#include "mg_driver.h"
#include "mg_sm90_tmap.h"
#include "mlagen.h"

static const mg_driver *driver(void) {
  fake_driver_use(MLAGEN_FAKE_CUDA);
  const mg_driver *drv = NULL;
  mg_diag d = MG_DIAG_INIT;
  if (mg_driver_get(&drv, &d)) fail_msg("driver: %s", mg_diag_msg(&d));
  assert_non_null(drv->cuTensorMapEncodeTiled);
  return drv;
}

static mg_kernel_spec spec(int H, int dn, int dr, int dv, const char *dtype) {
  mg_kernel_spec s;
  memset(&s, 0, sizeof s);
  snprintf(s.family, sizeof s.family, "attn_fwd_sm90");
  s.heads = H, s.d_n = dn, s.d_r = dr, s.d_v = dv, s.d_c = 512, s.causal = 1;
  snprintf(s.dtype, sizeof s.dtype, "%s", dtype);
  return s;
}

/* A manifest entry's configuration (names sorted, as mg_manifest_parse leaves them). */
static mg_kernel_info info(long bm, long bn, long packed) {
  mg_kernel_info k;
  memset(&k, 0, sizeof k);
  snprintf(k.name, sizeof k.name, "mla_attn_fwd_sm90_test");
  snprintf(k.family, sizeof k.family, "attn_fwd_sm90");
  const char *names[] = {"block_m", "block_n", "k_packed", "overlap", "stages"};
  const long values[] = {bm, bn, packed, 1, 2};
  for (int i = 0; i < 5; i++) {
    snprintf(k.config[i].name, sizeof k.config[i].name, "%s", names[i]);
    k.config[i].value = values[i];
  }
  k.n_config = 5;
  return k;
}

/* Map m's fields; its rows (dim 0's) ld elements apart (0: dims[0], contiguous). */
static void expect_map_ld(const CUtensorMap *m, unsigned es, unsigned rank, uintptr_t base,
                          const unsigned long long *dims, const unsigned *box, unsigned swz,
                          unsigned long long ld) {
  mg_host_tmap t;
  memcpy(&t, m, sizeof t);
  assert_int_equal(t.magic, MG_HOST_TMAP_MAGIC);
  assert_int_equal(t.rank, rank);
  assert_int_equal(t.elem_size, es);
  assert_int_equal(t.swizzle, swz);
  assert_int_equal(t.oob_nan, 0);
  assert_ptr_equal(t.base, (const void *)base);
  unsigned long long stride = es;
  for (unsigned i = 0; i < rank; i++) {
    assert_int_equal(t.dim[i], dims[i]);
    assert_int_equal(t.box[i], box[i]);
    assert_int_equal(t.stride[i], stride); /* row-major: bytes per step of dim i */
    stride *= i == 0 && ld ? ld : dims[i];
  }
}
static void expect_map(const CUtensorMap *m, unsigned es, unsigned rank, uintptr_t base,
                       const unsigned long long *dims, const unsigned *box, unsigned swz) {
  expect_map_ld(m, es, rank, base, dims, box, swz, 0);
}

/* Names k's first n parameters and gives their kinds, as a manifest would: what
 * mg_sm90_launch_tmaps looks the tensors up by. */
static void set_params(mg_kernel_info *k, int n, const char *const *names,
                       const mg_param_kind *kinds) {
  k->n_params = n;
  for (int i = 0; i < n; i++) {
    snprintf(k->params[i].name, sizeof k->params[i].name, "%s", names[i]);
    k->params[i].kind = kinds[i];
  }
}

/* mg_sm90_launch_tmaps with room for MG_SM90_MAX_TMAPS maps: succeeds with want_n maps. */
static void launch_maps(const mg_driver *drv, const mg_kernel_spec *s, const mg_kernel_info *k,
                        void **args, const mg_launch_dims *dims, CUtensorMap *maps, int want_n) {
  mg_diag d = MG_DIAG_INIT;
  int n = -1;
  if (mg_sm90_launch_tmaps(drv, s, k, args, dims, maps, MG_SM90_MAX_TMAPS, &n, &d))
    fail_msg("%s", mg_diag_msg(&d));
  assert_int_equal(n, want_n);
}

/* mg_sm90_launch_tmaps with room for `room` maps, too few: refused, none encoded. */
static void expect_no_room(const mg_driver *drv, const mg_kernel_spec *s, const mg_kernel_info *k,
                           void **args, const mg_launch_dims *dims, CUtensorMap *maps, int room) {
  mg_diag d = MG_DIAG_INIT;
  int n = -1;
  char want[32];
  snprintf(want, sizeof want, "room for %d maps", room);
  assert_int_equal(mg_sm90_launch_tmaps(drv, s, k, args, dims, maps, room, &n, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), want));
  assert_int_equal(n, 0);
  mg_diag_clear(&d);
}

enum { SW32 = CU_TENSOR_MAP_SWIZZLE_32B, SW64 = CU_TENSOR_MAP_SWIZZLE_64B, SW128 = CU_TENSOR_MAP_SWIZZLE_128B };
/* Distinct 16-byte aligned addresses: never dereferenced by the encode. */
#define QA ((CUdeviceptr)0x100000)
#define KNA ((CUdeviceptr)0x200000)
#define KRA ((CUdeviceptr)0x300000)
#define VA ((CUdeviceptr)0x400000)

/* DeepSeek-V3 heads (192 = 128 + 64, d_v 128), split keys: W 64, swizzle 128B everywhere
 * but d_qk 192 (64 divides it). */
static void test_split_deepseek(void **state) {
  (void)state;
  const mg_driver *drv = driver();
  mg_kernel_spec s = spec(16, 128, 64, 128, "bf16");
  mg_kernel_info k = info(128, 64, 0);
  CUtensorMap maps[4];
  mg_diag d = MG_DIAG_INIT;
  const mg_sm90_fwd_tensors t = {QA, KNA, KRA, VA, 2, 300, 500, 0};
  if (mg_sm90_fwd_tmaps(drv, &s, &k, &t, maps, &d)) fail_msg("%s", mg_diag_msg(&d));
  expect_map(&maps[0], 2, 4, QA, (unsigned long long[]){192, 16, 300, 2}, (unsigned[]){64, 1, 128, 1}, SW128);
  expect_map(&maps[1], 2, 4, KNA, (unsigned long long[]){128, 16, 500, 2}, (unsigned[]){64, 1, 64, 1}, SW128);
  expect_map(&maps[2], 2, 3, KRA, (unsigned long long[]){64, 500, 2}, (unsigned[]){64, 64, 1}, SW128);
  expect_map(&maps[3], 2, 4, VA, (unsigned long long[]){128, 16, 500, 2}, (unsigned[]){64, 1, 64, 1}, SW128);
  /* ld_k_rope = d_r: the same maps as 0 */
  CUtensorMap same[4];
  mg_sm90_fwd_tensors u = t;
  u.ld_k_rope = 64;
  if (mg_sm90_fwd_tmaps(drv, &s, &k, &u, same, &d)) fail_msg("%s", mg_diag_msg(&d));
  assert_memory_equal(same, maps, sizeof maps);
  /* k_rope as the RoPE columns of the latent c [B S_k, 512 + 64] (k_rope = c + d_c, the LAGA
   * plans' split keys): map [2]'s rows 576 elements (1152 bytes) apart; the others as before */
  u.k_rope = KRA + 512 * 2, u.ld_k_rope = 576;
  if (mg_sm90_fwd_tmaps(drv, &s, &k, &u, same, &d)) fail_msg("%s", mg_diag_msg(&d));
  expect_map_ld(&same[2], 2, 3, KRA + 1024, (unsigned long long[]){64, 500, 2}, (unsigned[]){64, 64, 1}, SW128, 576);
  assert_memory_equal(&same[0], &maps[0], 2 * sizeof maps[0]);
  assert_memory_equal(&same[3], &maps[3], sizeof maps[3]);
}

/* An unusual shape, packed keys, fp16: d_n 96 (W 32, 64B), d_r 16 (W 16, 32B), d_qk 112
 * (W 16), d_v 64; map [2] is the packed K (its RoPE columns are read at offset d_n);
 * seqlen_k 0 encodes one row. */
static void test_packed_unusual_fp16(void **state) {
  (void)state;
  const mg_driver *drv = driver();
  mg_kernel_spec s = spec(3, 96, 16, 64, "fp16");
  mg_kernel_info k = info(64, 128, 1);
  CUtensorMap maps[4];
  mg_diag d = MG_DIAG_INIT;
  const mg_sm90_fwd_tensors t = {QA, KNA, 0, VA, 1, 7, 0, 0};
  if (mg_sm90_fwd_tmaps(drv, &s, &k, &t, maps, &d)) fail_msg("%s", mg_diag_msg(&d));
  expect_map(&maps[0], 2, 4, QA, (unsigned long long[]){112, 3, 7, 1}, (unsigned[]){16, 1, 64, 1}, SW32);
  expect_map(&maps[1], 2, 4, KNA, (unsigned long long[]){112, 3, 1, 1}, (unsigned[]){32, 1, 128, 1}, SW64);
  expect_map(&maps[2], 2, 4, KNA, (unsigned long long[]){112, 3, 1, 1}, (unsigned[]){16, 1, 128, 1}, SW32);
  expect_map(&maps[3], 2, 4, VA, (unsigned long long[]){64, 3, 1, 1}, (unsigned[]){64, 1, 128, 1}, SW128);
}

/* An encoder's failure: status `got` is `status`, d's message holds words, and maps[0..n),
 * set to 0x5a before the call, were zeroed (no partial set). */
static void expect_failed(int got, int status, const mg_diag *d, const char *words,
                          const CUtensorMap *maps, int n) {
  assert_int_equal(got, status);
  if (!strstr(mg_diag_msg(d), words)) fail_msg("message '%s' lacks '%s'", mg_diag_msg(d), words);
  static const CUtensorMap zero;
  for (int i = 0; i < n; i++) assert_memory_equal(&maps[i], &zero, sizeof zero);
}

static void expect_error(const mg_driver *drv, const mg_kernel_spec *s, const mg_kernel_info *k,
                         const mg_sm90_fwd_tensors *t, int status, const char *words) {
  CUtensorMap maps[4];
  memset(maps, 0x5a, sizeof maps);
  mg_diag d = MG_DIAG_INIT;
  expect_failed(mg_sm90_fwd_tmaps(drv, s, k, t, maps, &d), status, &d, words, maps, 4);
}

static void test_errors(void **state) {
  (void)state;
  const mg_driver *drv = driver();
  mg_kernel_spec s = spec(16, 128, 64, 128, "bf16");
  mg_kernel_info k = info(128, 64, 0);
  const mg_sm90_fwd_tensors t = {QA, KNA, KRA, VA, 1, 256, 256, 0};
  mg_driver old = *drv; /* a driver older than CUDA 12.0: the optional entry is NULL */
  old.cuTensorMapEncodeTiled = NULL;
  expect_error(&old, &s, &k, &t, MLAGEN_EUNSUPPORTED, "lacks");
  mg_kernel_info other = k;
  snprintf(other.family, sizeof other.family, "attn_fwd");
  expect_error(drv, &s, &other, &t, MLAGEN_EINVAL, "is not attn_fwd_sm90");
  mg_kernel_info nobn = k;
  nobn.config[1] = nobn.config[4], nobn.n_config = 4;
  expect_error(drv, &s, &nobn, &t, MLAGEN_EINVAL, "no tunable block_n");
  mg_sm90_fwd_tensors bad = t;
  bad.v = VA + 8;
  expect_error(drv, &s, &k, &bad, MLAGEN_EINVAL, "map [3] v: address");
  bad = t, bad.k_rope = 0;
  expect_error(drv, &s, &k, &bad, MLAGEN_EINVAL, "null");
  bad = t, bad.seqlen_q = -1;
  expect_error(drv, &s, &k, &bad, MLAGEN_EINVAL, "seqlen_q -1");
  /* split keys' row strides TMA cannot take (d_r 64): under d_r, not a multiple of 16 bytes,
   * 2^40 bytes or more, negative; and the latent's RoPE columns at an odd d_c (a base not
   * 16-byte aligned) */
  bad = t, bad.ld_k_rope = 56;
  expect_error(drv, &s, &k, &bad, MLAGEN_EINVAL,
               "map [2] k_rope: row stride ld_k_rope 56 elements: TMA needs it >= the row's 64 elements");
  bad = t, bad.ld_k_rope = 68;
  expect_error(drv, &s, &k, &bad, MLAGEN_EINVAL, "ld_k_rope 68 elements: TMA needs it >= the row's 64 elements, a multiple of 8 elements (16 bytes)");
  bad = t, bad.ld_k_rope = 1L << 39;
  expect_error(drv, &s, &k, &bad, MLAGEN_EINVAL, "under 2^40 bytes");
  bad = t, bad.ld_k_rope = -64;
  expect_error(drv, &s, &k, &bad, MLAGEN_EINVAL, "ld_k_rope -64");
  bad = t, bad.k_rope = KRA + 2 * 500, bad.ld_k_rope = 564;
  expect_error(drv, &s, &k, &bad, MLAGEN_EINVAL, "map [2] k_rope: address 0x3003e8 is not 16-byte aligned");
  mg_kernel_info packed = info(128, 64, 1); /* packed keys: ld_k_rope not read */
  bad = t, bad.ld_k_rope = 68;
  CUtensorMap pm[4];
  mg_diag d = MG_DIAG_INIT;
  if (mg_sm90_fwd_tmaps(drv, &s, &packed, &bad, pm, &d)) fail_msg("%s", mg_diag_msg(&d));
  mg_kernel_spec odd = s;
  odd.d_r = 8;
  expect_error(drv, &odd, &k, &t, MLAGEN_EINVAL, "multiples of 16");
  mg_kernel_info wide = info(128, 512, 0); /* box 512 > 256: the driver rejects it */
  expect_error(drv, &s, &wide, &t, MLAGEN_EINVAL,
               "cuTensorMapEncodeTiled(attn_fwd_sm90 map [1] k_nope: dims {128, 16, 256, 1} box {64, 1, 512, 1}): CUDA_ERROR_INVALID_VALUE");
}

/* The backward's five maps (mg_sm90_bwd_tmaps): d_n 96, d_r 32 (K boxes W_K = 32 for both
 * parts, 64B), d_qk 128 and d_v 64 (W 64, 128B); dout like v over the query rows; split keys,
 * then packed; a forward kernel and a null dout refused. */
#define DOA ((CUdeviceptr)0x500000)
static void test_bwd(void **state) {
  (void)state;
  const mg_driver *drv = driver();
  mg_kernel_spec s = spec(3, 96, 32, 64, "bf16");
  snprintf(s.family, sizeof s.family, "attn_bwd_dkdv_sm90");
  mg_kernel_info k = info(64, 128, 0);
  snprintf(k.family, sizeof k.family, "attn_bwd_dkdv_sm90");
  CUtensorMap maps[MG_SM90_BWD_TMAPS];
  mg_diag d = MG_DIAG_INIT;
  const mg_sm90_bwd_tensors t = {QA, KNA, KRA, VA, DOA, 2, 70, 100, 0};
  if (mg_sm90_bwd_tmaps(drv, &s, &k, &t, maps, &d)) fail_msg("%s", mg_diag_msg(&d));
  /* the latent's RoPE columns (d_c 512): map [2] with rows 544 elements apart */
  mg_sm90_bwd_tensors lat = t;
  lat.k_rope = KRA + 1024, lat.ld_k_rope = 544;
  CUtensorMap lm[MG_SM90_BWD_TMAPS];
  if (mg_sm90_bwd_tmaps(drv, &s, &k, &lat, lm, &d)) fail_msg("%s", mg_diag_msg(&d));
  expect_map_ld(&lm[2], 2, 3, KRA + 1024, (unsigned long long[]){32, 100, 2}, (unsigned[]){32, 128, 1}, SW64, 544);
  lat.ld_k_rope = 36; /* 72 bytes: not a multiple of 16 */
  assert_int_equal(mg_sm90_bwd_tmaps(drv, &s, &k, &lat, lm, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "attn_bwd_dkdv_sm90 tensor map [2] k_rope: row stride ld_k_rope 36"));
  mg_diag_clear(&d);
  expect_map(&maps[0], 2, 4, QA, (unsigned long long[]){128, 3, 70, 2}, (unsigned[]){64, 1, 64, 1}, SW128);
  expect_map(&maps[1], 2, 4, KNA, (unsigned long long[]){96, 3, 100, 2}, (unsigned[]){32, 1, 128, 1}, SW64);
  expect_map(&maps[2], 2, 3, KRA, (unsigned long long[]){32, 100, 2}, (unsigned[]){32, 128, 1}, SW64);
  expect_map(&maps[3], 2, 4, VA, (unsigned long long[]){64, 3, 100, 2}, (unsigned[]){64, 1, 128, 1}, SW128);
  expect_map(&maps[4], 2, 4, DOA, (unsigned long long[]){64, 3, 70, 2}, (unsigned[]){64, 1, 64, 1}, SW128);
  mg_kernel_info kp = info(64, 128, 1);
  snprintf(kp.family, sizeof kp.family, "attn_bwd_dkdv_sm90");
  if (mg_sm90_bwd_tmaps(drv, &s, &kp, &t, maps, &d)) fail_msg("%s", mg_diag_msg(&d));
  expect_map(&maps[1], 2, 4, KNA, (unsigned long long[]){128, 3, 100, 2}, (unsigned[]){32, 1, 128, 1}, SW64);
  expect_map(&maps[2], 2, 4, KNA, (unsigned long long[]){128, 3, 100, 2}, (unsigned[]){32, 1, 128, 1}, SW64);
  mg_kernel_info fwd = info(64, 128, 0);
  assert_int_equal(mg_sm90_bwd_tmaps(drv, &s, &fwd, &t, maps, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "is not attn_bwd_dkdv_sm90 or attn_bwd_dq_sm90"));
  mg_diag_clear(&d);
  mg_sm90_bwd_tensors bad = t;
  bad.dout = 0;
  assert_int_equal(mg_sm90_bwd_tmaps(drv, &s, &k, &bad, maps, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "attn_bwd_dkdv_sm90 tensor map [4] dout: address 0x0 is null"));
  static const CUtensorMap zero;
  for (int i = 0; i < MG_SM90_BWD_TMAPS; i++) assert_memory_equal(&maps[i], &zero, sizeof zero);
  mg_diag_clear(&d);
}

/* mg_sm90_launch_tmaps for the backward (attn_bwd_dq_sm90's q, k_nope, k_rope, v, dout by
 * name; sizes from the launch dims): the same 5 maps as mg_sm90_bwd_tmaps; too little room
 * refused. */
static void test_launch_bwd_tmaps(void **state) {
  (void)state;
  const mg_driver *drv = driver();
  mg_kernel_spec s = spec(3, 96, 32, 64, "bf16");
  snprintf(s.family, sizeof s.family, "attn_bwd_dq_sm90");
  mg_kernel_info k = info(64, 128, 0);
  snprintf(k.family, sizeof k.family, "attn_bwd_dq_sm90");
  static const char *const names[] = {"q", "k_nope", "k_rope", "ld_k_rope", "v", "dout", "dq", "seqlen_q", "tmaps"};
  const mg_param_kind kinds[] = {MG_PARAM_IN, MG_PARAM_IN,  MG_PARAM_IN,  MG_PARAM_INT,  MG_PARAM_IN,
                                 MG_PARAM_IN, MG_PARAM_OUT, MG_PARAM_INT, MG_PARAM_TMAPS};
  set_params(&k, 9, names, kinds);
  CUdeviceptr ptr[6] = {QA, KNA, KRA + 1024, VA, DOA, 0x600000}; /* k_rope: the latent's columns */
  int sq = 70, ld = 544;
  CUtensorMap maps[MG_SM90_MAX_TMAPS], want[MG_SM90_BWD_TMAPS];
  void *args[9] = {&ptr[0], &ptr[1], &ptr[2], &ld, &ptr[3], &ptr[4], &ptr[5], &sq, maps};
  const mg_launch_dims dims = {2, 70, 100};
  launch_maps(drv, &s, &k, args, &dims, maps, MG_SM90_BWD_TMAPS);
  mg_diag d = MG_DIAG_INIT;
  const mg_sm90_bwd_tensors t = {QA, KNA, KRA + 1024, VA, DOA, 2, 70, 100, 544};
  if (mg_sm90_bwd_tmaps(drv, &s, &k, &t, want, &d)) fail_msg("%s", mg_diag_msg(&d));
  assert_memory_equal(maps, want, sizeof want);
  expect_map(&maps[4], 2, 4, DOA, (unsigned long long[]){64, 3, 70, 2}, (unsigned[]){64, 1, 64, 1}, SW128);
  mg_diag_clear(&d);
  expect_no_room(drv, &s, &k, args, &dims, maps, 4);
}

/* mg_sm90_launch_tmaps, what the CUDA executor and the tuner call at each launch: the
 * tensors read by parameter name from cuLaunchKernel-style arguments, the sizes from the
 * launch dims; the same maps as mg_sm90_fwd_tmaps. Refused: a kernel without a tensor-map
 * parameter, a family without an encoder, too little room. */
static void test_launch_tmaps(void **state) {
  (void)state;
  const mg_driver *drv = driver();
  mg_kernel_spec s = spec(16, 128, 64, 128, "bf16");
  mg_kernel_info k = info(128, 64, 0);
  static const char *const names[] = {"q", "k_nope", "k_rope", "ld_k_rope", "v", "o", "lse", "seqlen_q", "tmaps"};
  const mg_param_kind kinds[] = {MG_PARAM_IN,  MG_PARAM_IN,  MG_PARAM_IN,  MG_PARAM_INT,  MG_PARAM_IN,
                                 MG_PARAM_OUT, MG_PARAM_OUT, MG_PARAM_INT, MG_PARAM_TMAPS};
  set_params(&k, 9, names, kinds);
  CUdeviceptr ptr[6] = {QA, KNA, KRA + 1024, VA, 0x500000, 0x600000}; /* k_rope = c + d_c */
  int sq = 300, ld = 576;
  CUtensorMap maps[MG_SM90_MAX_TMAPS], want[4];
  void *args[9] = {&ptr[0], &ptr[1], &ptr[2], &ld, &ptr[3], &ptr[4], &ptr[5], &sq, maps};
  const mg_launch_dims dims = {2, 300, 500};
  launch_maps(drv, &s, &k, args, &dims, maps, 4);
  mg_diag d = MG_DIAG_INIT;
  int n = -1;
  const mg_sm90_fwd_tensors t = {QA, KNA, KRA + 1024, VA, 2, 300, 500, 576};
  if (mg_sm90_fwd_tmaps(drv, &s, &k, &t, want, &d)) fail_msg("%s", mg_diag_msg(&d));
  assert_memory_equal(maps, want, sizeof want);
  expect_map_ld(&maps[2], 2, 3, KRA + 1024, (unsigned long long[]){64, 500, 2}, (unsigned[]){64, 64, 1}, SW128, 576);
  /* the launch's ld_k_rope is checked as mg_sm90_fwd_tmaps's */
  ld = 60;
  assert_int_equal(mg_sm90_launch_tmaps(drv, &s, &k, args, &dims, maps, 8, &n, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "row stride ld_k_rope 60"));
  mg_diag_clear(&d);
  ld = 576;
  assert_int_equal(mg_sm90_launch_tmaps(drv, &s, &k, args, &dims, maps, 3, &n, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "room for 3 maps"));
  mg_kernel_info other = k;
  snprintf(other.family, sizeof other.family, "attn_fwd");
  assert_int_equal(mg_sm90_launch_tmaps(drv, &s, &other, args, &dims, maps, 8, &n, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "no tensor-map encoder for family attn_fwd"));
  other = k, other.n_params = 8;
  assert_int_equal(mg_sm90_launch_tmaps(drv, &s, &other, args, &dims, maps, 8, &n, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "no tensor-map parameter"));
  assert_int_equal(n, 0);
  mg_diag_clear(&d);
}

/* mqa_fwd_sm90's maps: q as B items of [S_q H, d_qk] rows (dims {d_qk, S_q H, B}, box
 * {W, 64, 1}), c as B items of [S_k, d_qk] (box {W, block_n, 1}); DeepSeek's 576 (W 64, 128B) and 288 in fp16 (W 32, 64B), seqlen_k 0 as one
 * row. */
static mg_kernel_info mqa_info(long bn) {
  mg_kernel_info k;
  memset(&k, 0, sizeof k);
  snprintf(k.name, sizeof k.name, "mla_mqa_fwd_sm90_test");
  snprintf(k.family, sizeof k.family, "mqa_fwd_sm90");
  snprintf(k.config[0].name, sizeof k.config[0].name, "block_n");
  k.config[0].value = bn;
  snprintf(k.config[1].name, sizeof k.config[1].name, "stages");
  k.config[1].value = 2;
  k.n_config = 2;
  return k;
}
static mg_kernel_spec mqa_spec(int H, int dc, int dr, const char *dtype) {
  mg_kernel_spec s = spec(H, 128, dr, 128, dtype);
  snprintf(s.family, sizeof s.family, "mqa_fwd_sm90");
  s.d_c = dc;
  return s;
}

static void test_mqa_maps(void **state) {
  (void)state;
  const mg_driver *drv = driver();
  mg_diag d = MG_DIAG_INIT;
  CUtensorMap maps[2];
  mg_kernel_spec s = mqa_spec(16, 512, 64, "bf16");
  mg_kernel_info k = mqa_info(64);
  const mg_sm90_mqa_tensors t = {QA, KNA, 2, 300, 500};
  if (mg_sm90_mqa_tmaps(drv, &s, &k, &t, maps, &d)) fail_msg("%s", mg_diag_msg(&d));
  expect_map(&maps[0], 2, 3, QA, (unsigned long long[]){576, 4800, 2}, (unsigned[]){64, 64, 1}, SW128);
  expect_map(&maps[1], 2, 3, KNA, (unsigned long long[]){576, 500, 2}, (unsigned[]){64, 64, 1}, SW128);
  s = mqa_spec(5, 256, 32, "fp16");
  k = mqa_info(128);
  const mg_sm90_mqa_tensors t2 = {QA, KNA, 1, 7, 0};
  if (mg_sm90_mqa_tmaps(drv, &s, &k, &t2, maps, &d)) fail_msg("%s", mg_diag_msg(&d));
  expect_map(&maps[0], 2, 3, QA, (unsigned long long[]){288, 35, 1}, (unsigned[]){32, 64, 1}, SW64);
  expect_map(&maps[1], 2, 3, KNA, (unsigned long long[]){288, 1, 1}, (unsigned[]){32, 128, 1}, SW64);
}

static void expect_mqa_error(const mg_driver *drv, const mg_kernel_spec *s,
                             const mg_kernel_info *k, const mg_sm90_mqa_tensors *t, int status,
                             const char *words) {
  CUtensorMap maps[2];
  memset(maps, 0x5a, sizeof maps);
  mg_diag d = MG_DIAG_INIT;
  expect_failed(mg_sm90_mqa_tmaps(drv, s, k, t, maps, &d), status, &d, words, maps, 2);
}

static void test_mqa_errors(void **state) {
  (void)state;
  const mg_driver *drv = driver();
  mg_kernel_spec s = mqa_spec(16, 512, 64, "bf16");
  mg_kernel_info k = mqa_info(64);
  const mg_sm90_mqa_tensors t = {QA, KNA, 1, 256, 256};
  mg_driver old = *drv;
  old.cuTensorMapEncodeTiled = NULL;
  expect_mqa_error(&old, &s, &k, &t, MLAGEN_EUNSUPPORTED, "lacks");
  mg_kernel_info other = k;
  snprintf(other.family, sizeof other.family, "mqa_fwd");
  expect_mqa_error(drv, &s, &other, &t, MLAGEN_EINVAL, "is not mqa_fwd_sm90");
  mg_kernel_info nobn = k;
  nobn.config[0] = nobn.config[1], nobn.n_config = 1;
  expect_mqa_error(drv, &s, &nobn, &t, MLAGEN_EINVAL, "no tunable block_n");
  mg_sm90_mqa_tensors bad = t;
  bad.c = 0;
  expect_mqa_error(drv, &s, &k, &bad, MLAGEN_EINVAL, "mqa_fwd_sm90 tensor map [1] c: address 0x0 is null");
  mg_kernel_spec odd = s;
  odd.d_c = 520;
  expect_mqa_error(drv, &odd, &k, &t, MLAGEN_EINVAL, "multiples of 16");
  mg_kernel_info wide = mqa_info(512); /* box 512 > 256: the driver rejects it */
  expect_mqa_error(drv, &s, &wide, &t, MLAGEN_EINVAL,
                   "cuTensorMapEncodeTiled(mqa_fwd_sm90 map [1] c: dims {576, 256, 1} box {64, 512, 1}): CUDA_ERROR_INVALID_VALUE");
  /* a batch item of 2^26 tokens x 16 heads x 576 bf16 (1.2e12 bytes): q's batch step (dim 2,
   * counting from the innermost 0) is over TMA's 2^40-byte stride limit, refused by name */
  bad = t, bad.batch = 2, bad.seqlen_q = 1L << 26;
  expect_mqa_error(drv, &s, &k, &bad, MLAGEN_EINVAL,
                   "mqa_fwd_sm90 tensor map [0] q: dim 2's step of 1152 x 1073741824 bytes is 2^40 bytes or more");
}

/* mg_sm90_launch_tmaps for mqa_fwd_sm90 (the kernel's q, c by name; sizes from the launch
 * dims): the same 2 maps as mg_sm90_mqa_tmaps; too little room refused. */
static void test_launch_mqa_tmaps(void **state) {
  (void)state;
  const mg_driver *drv = driver();
  mg_kernel_spec s = mqa_spec(16, 512, 64, "bf16");
  mg_kernel_info k = mqa_info(64);
  static const char *const names[] = {"q", "c", "o", "lse", "seqlen_q", "tmaps"};
  const mg_param_kind kinds[] = {MG_PARAM_IN,  MG_PARAM_IN,  MG_PARAM_OUT,
                                 MG_PARAM_OUT, MG_PARAM_INT, MG_PARAM_TMAPS};
  set_params(&k, 6, names, kinds);
  CUdeviceptr ptr[4] = {QA, KNA, 0x500000, 0x600000};
  int sq = 300;
  CUtensorMap maps[MG_SM90_MAX_TMAPS], want[2];
  void *args[6] = {&ptr[0], &ptr[1], &ptr[2], &ptr[3], &sq, maps};
  const mg_launch_dims dims = {2, 300, 500};
  launch_maps(drv, &s, &k, args, &dims, maps, 2);
  mg_diag d = MG_DIAG_INIT;
  const mg_sm90_mqa_tensors t = {QA, KNA, 2, 300, 500};
  if (mg_sm90_mqa_tmaps(drv, &s, &k, &t, want, &d)) fail_msg("%s", mg_diag_msg(&d));
  assert_memory_equal(maps, want, sizeof want);
  expect_map(&maps[1], 2, 3, KNA, (unsigned long long[]){576, 500, 2}, (unsigned[]){64, 64, 1}, SW128);
  mg_diag_clear(&d);
  expect_no_room(drv, &s, &k, args, &dims, maps, 1);
}

/* The absorbed backward's three maps (mg_sm90_mqa_bwd_tmaps): q and dout over the packed
 * rows S_q H of each of the B items, c over S_k of each, all boxes {W(d_c + d_r), 64, 1} (576: 64, 128B; 288: 32, 64B;
 * dout's rows d_c wide); no keys encoded as 1 row; both families accepted, mqa_fwd_sm90 and
 * a null dout refused (maps zeroed); through mg_sm90_launch_tmaps (q, c, dout by name) the
 * same maps. */
static void test_mqa_bwd(void **state) {
  (void)state;
  const mg_driver *drv = driver();
  mg_kernel_spec s = mqa_spec(16, 512, 64, "bf16");
  snprintf(s.family, sizeof s.family, "mqa_bwd_dkv_sm90");
  mg_kernel_info k = mqa_info(64);
  k.n_config = 0; /* no tunable read */
  snprintf(k.family, sizeof k.family, "mqa_bwd_dkv_sm90");
  CUtensorMap maps[MG_SM90_MQA_BWD_TMAPS];
  mg_diag d = MG_DIAG_INIT;
  const mg_sm90_mqa_bwd_tensors t = {QA, KNA, DOA, 2, 30, 50};
  if (mg_sm90_mqa_bwd_tmaps(drv, &s, &k, &t, maps, &d)) fail_msg("%s", mg_diag_msg(&d));
  expect_map(&maps[0], 2, 3, QA, (unsigned long long[]){576, 480, 2}, (unsigned[]){64, 64, 1}, SW128);
  expect_map(&maps[1], 2, 3, KNA, (unsigned long long[]){576, 50, 2}, (unsigned[]){64, 64, 1}, SW128);
  expect_map(&maps[2], 2, 3, DOA, (unsigned long long[]){512, 480, 2}, (unsigned[]){64, 64, 1}, SW128);
  s = mqa_spec(5, 256, 32, "fp16");
  snprintf(s.family, sizeof s.family, "mqa_bwd_dq_sm90");
  snprintf(k.family, sizeof k.family, "mqa_bwd_dq_sm90");
  const mg_sm90_mqa_bwd_tensors t2 = {QA, KNA, DOA, 1, 7, 0};
  if (mg_sm90_mqa_bwd_tmaps(drv, &s, &k, &t2, maps, &d)) fail_msg("%s", mg_diag_msg(&d));
  expect_map(&maps[0], 2, 3, QA, (unsigned long long[]){288, 35, 1}, (unsigned[]){32, 64, 1}, SW64);
  expect_map(&maps[1], 2, 3, KNA, (unsigned long long[]){288, 1, 1}, (unsigned[]){32, 64, 1}, SW64);
  expect_map(&maps[2], 2, 3, DOA, (unsigned long long[]){256, 35, 1}, (unsigned[]){32, 64, 1}, SW64);
  mg_kernel_info fwd = mqa_info(64);
  mg_kernel_spec sf = mqa_spec(5, 256, 32, "fp16");
  assert_int_equal(mg_sm90_mqa_bwd_tmaps(drv, &sf, &fwd, &t2, maps, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "is not mqa_bwd_dkv_sm90 or mqa_bwd_dq_sm90"));
  mg_diag_clear(&d);
  mg_sm90_mqa_bwd_tensors bad = t2;
  bad.dout = 0;
  assert_int_equal(mg_sm90_mqa_bwd_tmaps(drv, &s, &k, &bad, maps, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "mqa_bwd_dq_sm90 tensor map [2] dout: address 0x0 is null"));
  static const CUtensorMap zero;
  for (int i = 0; i < MG_SM90_MQA_BWD_TMAPS; i++) assert_memory_equal(&maps[i], &zero, sizeof zero);
  mg_diag_clear(&d);
  /* through the launch path */
  static const char *const names[] = {"q", "c", "dout", "lse", "delta", "dq", "seqlen_q", "tmaps"};
  const mg_param_kind kinds[] = {MG_PARAM_IN, MG_PARAM_IN,  MG_PARAM_IN,  MG_PARAM_IN,
                                 MG_PARAM_IN, MG_PARAM_OUT, MG_PARAM_INT, MG_PARAM_TMAPS};
  set_params(&k, 8, names, kinds);
  CUdeviceptr ptr[6] = {QA, KNA, DOA, 0x600000, 0x700000, 0x800000};
  int sq = 7;
  CUtensorMap lmaps[MG_SM90_MAX_TMAPS];
  void *args[8] = {&ptr[0], &ptr[1], &ptr[2], &ptr[3], &ptr[4], &ptr[5], &sq, lmaps};
  const mg_launch_dims dims = {1, 7, 0};
  launch_maps(drv, &s, &k, args, &dims, lmaps, MG_SM90_MQA_BWD_TMAPS);
  if (mg_sm90_mqa_bwd_tmaps(drv, &s, &k, &t2, maps, &d)) fail_msg("%s", mg_diag_msg(&d));
  assert_memory_equal(lmaps, maps, sizeof maps);
  mg_diag_clear(&d);
  expect_no_room(drv, &s, &k, args, &dims, lmaps, 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_split_deepseek),
      cmocka_unit_test(test_packed_unusual_fp16),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_bwd),
      cmocka_unit_test(test_launch_bwd_tmaps),
      cmocka_unit_test(test_launch_tmaps),
      cmocka_unit_test(test_launch_mqa_tmaps),
      cmocka_unit_test(test_mqa_maps),
      cmocka_unit_test(test_mqa_errors),
      cmocka_unit_test(test_mqa_bwd),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
