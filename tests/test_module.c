/* test_module.c: the module registry (runtime/exec/mg_module.c) against the fake driver.
 *
 * Two modes, one per process (the driver is loaded once per process), chosen by the
 * first argument; each sets MLAGEN_LIBCUDA before any call:
 *   fake      (default) the fake driver of tests/fake_cuda.c: launch rules and grids
 *             (mul/div rounding, limits), load, lookup and the cache, a kernel name the
 *             cubin does not hold, the dynamic smem attribute set only above 48 KiB,
 *             launches with the computed grid on the caller's stream, driver failures
 *             propagated with their CUDA names, destroy unloading every module. The fake
 *             counts its calls and injects failures through functions it exports
 *             (fake_cuda_count, fake_cuda_fail, ...), reached through tests/fake_driver.h.
 *   nodriver  MLAGEN_LIBCUDA names no file: mg_registry_create is MLAGEN_ENODRIVER.
 * Fake cubins are "FAKECUBIN\n" images listing their kernel names (see fake_cuda.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_driver.h"
#include "mg_module.h"
#include "test_assert.h"
#include "mlagen.h"

static fake_cuda fake; /* the fake driver's test hooks */

static const char k_image[] = "FAKECUBIN\nk_small\nk_edge\nk_big\nk_mul\nk_huge\n";

/* A rule: grid {seqlen_q / div_x, value 1, batch}, block {bx, 1, 1}, smem. */
static mg_launch_rule rule_of(long div_x, unsigned bx, size_t smem) {
  mg_launch_rule r;
  memset(&r, 0, sizeof r);
  r.grid[0].src = MG_GRID_SEQLEN_Q, r.grid[0].mul = 1, r.grid[0].div = div_x;
  r.grid[1].src = MG_GRID_VALUE, r.grid[1].value = 1, r.grid[1].mul = r.grid[1].div = 1;
  r.grid[2].src = MG_GRID_BATCH, r.grid[2].mul = r.grid[2].div = 1;
  r.block[0] = bx, r.block[1] = r.block[2] = 1;
  r.smem = smem;
  return r;
}

static int parse(const char *json, mg_launch_rule *rule, mg_diag *d) {
  cJSON *j = cJSON_Parse(json);
  if (!j) fail_msg("bad test JSON: %s", json);
  int rc = mg_launch_rule_parse(j, "k_test", rule, d);
  cJSON_Delete(j);
  return rc;
}

/* ---- launch rules and grids (no driver calls) ------------------------------------------- */

static void test_rule_parse(void **state) {
  (void)state;
  mg_diag d = MG_DIAG_INIT;
  mg_launch_rule r;
  assert_int_equal(parse("{\"grid\": [{\"arg\": \"seqlen_q\", \"div\": 64}, {\"value\": 16},"
                         " {\"arg\": \"batch\", \"mul\": 128, \"div\": 3}],"
                         " \"block\": [128, 1, 1], \"smem\": 98304, \"smem_static\": 0}", &r, &d), 0);
  assert_int_equal(r.grid[0].src, MG_GRID_SEQLEN_Q);
  assert_int_equal(r.grid[0].div, 64);
  assert_int_equal(r.grid[0].mul, 1); /* mul defaults to 1 */
  assert_int_equal(r.grid[1].src, MG_GRID_VALUE);
  assert_int_equal(r.grid[1].value, 16);
  assert_int_equal(r.grid[2].src, MG_GRID_BATCH);
  assert_int_equal(r.grid[2].mul, 128);
  assert_int_equal(r.grid[2].div, 3);
  assert_int_equal(r.block[0], 128);
  assert_int_equal(r.smem, 98304);
  /* div defaults to 1 too; seqlen_k */
  assert_int_equal(parse("{\"grid\": [{\"arg\": \"seqlen_k\"}, {\"value\": 1}, {\"value\": 1}],"
                         " \"block\": [32, 2, 1], \"smem\": 0}", &r, &d), 0);
  assert_int_equal(r.grid[0].src, MG_GRID_SEQLEN_K);
  assert_int_equal(r.grid[0].div, 1);
  assert_int_equal(r.grid[0].mul, 1);

  static const struct { const char *json, *msg; } bad[] = {
    {"{\"grid\": [{\"value\": 1}, {\"value\": 1}], \"block\": [1, 1, 1], \"smem\": 0}",
     "launch.grid is not an array of 3"},
    {"{\"grid\": [{\"arg\": \"batch\", \"value\": 1}, {\"value\": 1}, {\"value\": 1}], \"block\": [1, 1, 1], \"smem\": 0}",
     "launch.grid[0] is neither"},
    {"{\"grid\": [{\"value\": 1}, {}, {\"value\": 1}], \"block\": [1, 1, 1], \"smem\": 0}",
     "launch.grid[1] is neither"},
    {"{\"grid\": [{\"arg\": \"heads\"}, {\"value\": 1}, {\"value\": 1}], \"block\": [1, 1, 1], \"smem\": 0}",
     "launch.grid[0].arg 'heads' is not batch, seqlen_q or seqlen_k"},
    {"{\"grid\": [{\"arg\": \"batch\", \"div\": 0}, {\"value\": 1}, {\"value\": 1}], \"block\": [1, 1, 1], \"smem\": 0}",
     "launch.grid[0].div is not an integer"},
    {"{\"grid\": [{\"value\": 1}, {\"value\": 1}, {\"arg\": \"batch\", \"mul\": 1.5}], \"block\": [1, 1, 1], \"smem\": 0}",
     "launch.grid[2].mul is not an integer"},
    {"{\"grid\": [{\"value\": 0}, {\"value\": 1}, {\"value\": 1}], \"block\": [1, 1, 1], \"smem\": 0}",
     "launch.grid[0].value is not an integer"},
    {"{\"grid\": [{\"value\": 1}, {\"value\": 1}, {\"value\": 1}], \"block\": [64, 32, 1], \"smem\": 0}",
     "over 1024"},
    {"{\"grid\": [{\"value\": 1}, {\"value\": 1}, {\"value\": 1}], \"block\": [0, 1, 1], \"smem\": 0}",
     "launch.block[0] is not an integer"},
    {"{\"grid\": [{\"value\": 1}, {\"value\": 1}, {\"value\": 1}], \"block\": [1, 1, 1], \"smem\": -4}",
     "launch.smem is not an integer"},
    {"{\"grid\": [{\"value\": 1}, {\"value\": 1}, {\"value\": 1}], \"block\": [1, 1, 1]}",
     "launch.smem is not an integer"},
    {"[]", "no launch rule"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(parse(bad[i].json, &r, &d), MLAGEN_EINVAL);
    assert_contains(mg_diag_msg(&d), bad[i].msg);
    assert_contains(mg_diag_msg(&d), "k_test");
    assert_int_equal(r.block[0], 0); /* zeroed */
  }
  assert_int_equal(mg_launch_rule_parse(NULL, NULL, &r, &d), MLAGEN_EINVAL);
  assert_int_equal(mg_launch_rule_parse(NULL, NULL, NULL, &d), MLAGEN_EINVAL);
  mg_diag_clear(&d);
}

static void test_grid(void **state) {
  (void)state;
  mg_diag d = MG_DIAG_INIT;
  mg_launch_rule r;
  assert_int_equal(parse("{\"grid\": [{\"arg\": \"seqlen_q\", \"div\": 64}, {\"arg\": \"seqlen_k\", \"mul\": 16, \"div\": 3},"
                         " {\"arg\": \"batch\", \"mul\": 8}], \"block\": [128, 1, 1], \"smem\": 0}", &r, &d), 0);
  unsigned g[3];
  mg_launch_dims dims = {.batch = 2, .seqlen_q = 200, .seqlen_k = 10};
  assert_int_equal(mg_launch_grid(&r, &dims, g, &d), 0);
  assert_int_equal(g[0], 4);  /* ceil(200 / 64) */
  assert_int_equal(g[1], 54); /* ceil(10 * 16 / 3) = ceil(53.3) */
  assert_int_equal(g[2], 16); /* 2 * 8 */
  dims = (mg_launch_dims){.batch = 1, .seqlen_q = 64, .seqlen_k = 3};
  assert_int_equal(mg_launch_grid(&r, &dims, g, &d), 0);
  assert_int_equal(g[0], 1);  /* exact */
  assert_int_equal(g[1], 16); /* 48 / 3 */
  assert_int_equal(g[2], 8);
  dims.seqlen_q = 65;
  assert_int_equal(mg_launch_grid(&r, &dims, g, &d), 0);
  assert_int_equal(g[0], 2); /* one more row: one more CTA */
  dims.seqlen_q = 0;         /* an empty dim is 0, not an error */
  assert_int_equal(mg_launch_grid(&r, &dims, g, &d), 0);
  assert_int_equal(g[0], 0);
  dims.seqlen_q = -1;
  assert_int_equal(mg_launch_grid(&r, &dims, g, &d), MLAGEN_EINVAL);
  assert_contains(mg_diag_msg(&d), "seqlen_q = -1 is negative");
  dims = (mg_launch_dims){.batch = 8192, .seqlen_q = 1, .seqlen_k = 1}; /* z = 65536 */
  assert_int_equal(mg_launch_grid(&r, &dims, g, &d), MLAGEN_ELIMIT);
  assert_contains(mg_diag_msg(&d), "grid z = 65536 is over the device limit 65535");
  dims = (mg_launch_dims){.batch = 1, .seqlen_q = 64L * 2147483647L, .seqlen_k = 1};
  assert_int_equal(mg_launch_grid(&r, &dims, g, &d), 0); /* x = 2^31 - 1: at the limit */
  assert_int_equal(g[0], 2147483647u);
  dims.seqlen_q += 1;
  assert_int_equal(mg_launch_grid(&r, &dims, g, &d), MLAGEN_ELIMIT);
  assert_int_equal(mg_launch_grid(NULL, &dims, g, &d), MLAGEN_EINVAL);
  mg_diag_clear(&d);
}

/* ---- the registry against the fake driver --------------------------------------------- */

/* A new registry on the fake driver, its counters and injected failure cleared; *live0
 * (when not NULL) gets the modules live before it. */
static mg_module_registry *fresh_registry(int *live0) {
  fake.reset();
  if (live0) *live0 = fake.count("live_modules");
  mg_diag d = MG_DIAG_INIT;
  mg_module_registry *reg = NULL;
  if (mg_registry_create(&reg, &d)) fail_msg("mg_registry_create: %s", mg_diag_msg(&d));
  return reg;
}

static void test_load_lookup_launch(void **state) {
  (void)state;
  int live0;
  mg_module_registry *reg = fresh_registry(&live0);
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(mg_registry_count(reg), 0);

  /* small smem: no attribute call */
  mg_launch_rule small = rule_of(64, 128, 1024);
  const mg_module_kernel *ks = NULL, *k2 = NULL, *kf = NULL;
  assert_int_equal(mg_registry_load(reg, "k_small", k_image, sizeof k_image, &small, &ks, &d), 0);
  assert_non_null(ks);
  assert_string_equal(ks->name, "k_small");
  assert_non_null(ks->module);
  assert_non_null(ks->function);
  assert_int_equal(ks->smem_raised, 0);
  assert_int_equal(fake.count("cuModuleLoadData"), 1);
  assert_int_equal(fake.count("cuModuleGetFunction"), 1);
  assert_int_equal(fake.count("cuFuncSetAttribute"), 0);
  assert_int_equal(fake.attr_value(ks->function), 48 * 1024);
  assert_int_equal(fake.count("live_modules"), live0 + 1);

  /* cached: a second load of the name touches no driver call (not even the image) */
  assert_int_equal(mg_registry_load(reg, "k_small", "garbage", 7, &small, &k2, &d), 0);
  assert_ptr_equal(k2, ks);
  assert_int_equal(fake.count("cuModuleLoadData"), 1);
  assert_int_equal(mg_registry_count(reg), 1);
  assert_int_equal(mg_registry_find(reg, "k_small", &kf, &d), 0);
  assert_ptr_equal(kf, ks);

  /* exactly 48 KiB: still the default limit, no attribute call */
  mg_launch_rule edge = rule_of(1, 256, 48 * 1024);
  const mg_module_kernel *ke = NULL;
  assert_int_equal(mg_registry_load(reg, "k_edge", k_image, sizeof k_image, &edge, &ke, &d), 0);
  assert_int_equal(ke->smem_raised, 0);
  assert_int_equal(fake.count("cuFuncSetAttribute"), 0);

  /* above 48 KiB: raised to the rule's smem */
  mg_launch_rule big = rule_of(128, 256, 48 * 1024 + 16);
  const mg_module_kernel *kb = NULL;
  assert_int_equal(mg_registry_load(reg, "k_big", k_image, sizeof k_image, &big, &kb, &d), 0);
  assert_int_equal(kb->smem_raised, 1);
  assert_int_equal(fake.count("cuFuncSetAttribute"), 1);
  assert_int_equal(fake.attr_value(kb->function), 48 * 1024 + 16);
  assert_int_equal(mg_registry_count(reg), 3);
  assert_int_equal(fake.count("live_modules"), live0 + 3);

  /* launch: the grid from the rule, block, smem and the caller's stream */
  CUstream stream = (CUstream)(uintptr_t)0x5150;
  int arg0 = 7;
  void *args[] = {&arg0};
  mg_launch_dims dims = {.batch = 3, .seqlen_q = 300, .seqlen_k = 300};
  assert_int_equal(mg_registry_launch(reg, kb, &dims, stream, args, &d), 0);
  unsigned grid[3], block[3], smem;
  void *s = NULL;
  fake.last_launch(grid, block, &smem, &s);
  assert_int_equal(grid[0], 3); /* ceil(300 / 128) */
  assert_int_equal(grid[1], 1);
  assert_int_equal(grid[2], 3);
  assert_int_equal(block[0], 256);
  assert_int_equal(block[1], 1);
  assert_int_equal(smem, 48 * 1024 + 16);
  assert_ptr_equal(s, stream);
  assert_int_equal(fake.count("cuLaunchKernel"), 1);

  /* an empty grid launches nothing */
  dims.seqlen_q = 0;
  assert_int_equal(mg_registry_launch(reg, ks, &dims, stream, args, &d), 0);
  assert_int_equal(fake.count("cuLaunchKernel"), 1);
  /* a negative size, and a grid over the limit, never reach the driver */
  dims.seqlen_q = -5;
  assert_int_equal(mg_registry_launch(reg, ks, &dims, stream, args, &d), MLAGEN_EINVAL);
  assert_contains(mg_diag_msg(&d), "kernel k_small: grid x: seqlen_q = -5 is negative");
  dims = (mg_launch_dims){.batch = 70000, .seqlen_q = 1, .seqlen_k = 1};
  assert_int_equal(mg_registry_launch(reg, ks, &dims, stream, args, &d), MLAGEN_ELIMIT);
  assert_contains(mg_diag_msg(&d), "kernel k_small: grid z = 70000");
  assert_int_equal(fake.count("cuLaunchKernel"), 1);

  /* lookups that fail */
  assert_int_equal(mg_registry_find(reg, "k_nope", &kf, &d), MLAGEN_EINVAL);
  assert_null(kf);
  assert_contains(mg_diag_msg(&d), "no kernel 'k_nope' in the module registry (3 loaded)");
  /* a kernel of another registry */
  mg_module_registry *other = NULL;
  assert_int_equal(mg_registry_create(&other, &d), 0);
  const mg_module_kernel *ko = NULL;
  assert_int_equal(mg_registry_load(other, "k_small", k_image, sizeof k_image, &small, &ko, &d), 0);
  assert_int_equal(mg_registry_launch(reg, ko, &dims, stream, args, &d), MLAGEN_EINVAL);
  assert_contains(mg_diag_msg(&d), "is not of this registry");
  assert_int_equal(mg_registry_destroy(other, &d), 0);

  /* bad arguments */
  const mg_module_kernel *kx = NULL;
  assert_int_equal(mg_registry_load(reg, "", k_image, sizeof k_image, &small, &kx, &d), MLAGEN_EINVAL);
  assert_int_equal(mg_registry_load(reg, "k_mul", k_image, 0, &small, &kx, &d), MLAGEN_EINVAL);
  assert_contains(mg_diag_msg(&d), "the cubin is empty");
  assert_int_equal(mg_registry_load(reg, "k_mul", NULL, 4, &small, &kx, &d), MLAGEN_EINVAL);
  assert_int_equal(mg_registry_load(NULL, "k_mul", k_image, 4, &small, &kx, &d), MLAGEN_EINVAL);
  assert_int_equal(mg_registry_launch(reg, NULL, &dims, stream, args, &d), MLAGEN_EINVAL);
  assert_int_equal(mg_registry_find(NULL, "k_small", &kf, &d), MLAGEN_EINVAL);

  /* destroy unloads every module */
  const int unloads = fake.count("cuModuleUnload");
  assert_int_equal(mg_registry_destroy(reg, &d), 0);
  assert_int_equal(fake.count("cuModuleUnload"), unloads + 3);
  assert_int_equal(fake.count("live_modules"), live0);
  assert_int_equal(mg_registry_destroy(NULL, &d), 0);
  assert_int_equal(mg_registry_count(NULL), 0);
  mg_diag_clear(&d);
}

static void test_load_manifest_mul(void **state) {
  (void)state;
  mg_module_registry *reg = fresh_registry(NULL);
  mg_diag d = MG_DIAG_INIT;
  /* an absorbed-MQA-style rule: rows pack 16 heads per token, 64 rows per CTA */
  cJSON *e = cJSON_Parse("{\"family\": \"mqa_fwd\", \"name\": \"k_mul\", \"params\": [],"
                         " \"launch\": {\"grid\": [{\"arg\": \"seqlen_q\", \"mul\": 16, \"div\": 64},"
                         " {\"value\": 1}, {\"arg\": \"batch\"}], \"block\": [128, 1, 1], \"smem\": 163840}}");
  assert_non_null(e);
  const mg_module_kernel *k = NULL;
  mg_kernel_info info;
  assert_int_equal(mg_manifest_parse(e, &info, &d), 0);
  assert_int_equal(mg_registry_load_kernel(reg, &info, k_image, sizeof k_image, &k, &d), 0);
  assert_string_equal(k->name, "k_mul");
  assert_int_equal(k->rule.grid[0].mul, 16);
  assert_int_equal(k->smem_raised, 1);
  assert_int_equal(fake.attr_value(k->function), 163840);
  mg_launch_dims dims = {.batch = 2, .seqlen_q = 100, .seqlen_k = 100};
  assert_int_equal(mg_registry_launch(reg, k, &dims, NULL, NULL, &d), 0);
  unsigned grid[3], block[3], smem;
  void *s = (void *)1;
  fake.last_launch(grid, block, &smem, &s);
  assert_int_equal(grid[0], 25); /* ceil(100 * 16 / 64) */
  assert_int_equal(grid[2], 2);
  assert_int_equal(smem, 163840);
  assert_null(s);
  cJSON_Delete(e);
  /* entries without a name or with a bad rule */
  e = cJSON_Parse("{\"launch\": {}}");
  assert_int_equal(mg_manifest_parse(e, &info, &d), MLAGEN_EINVAL);
  assert_contains(mg_diag_msg(&d), "without a string \"name\"");
  cJSON_Delete(e);
  e = cJSON_Parse("{\"name\": \"k_edge\", \"launch\": {\"grid\": [], \"block\": [1, 1, 1], \"smem\": 0}}");
  assert_int_equal(mg_manifest_parse(e, &info, &d), MLAGEN_EINVAL);
  assert_contains(mg_diag_msg(&d), "k_edge: launch.grid is not an array of 3");
  cJSON_Delete(e);
  assert_int_equal(mg_manifest_parse(NULL, &info, &d), MLAGEN_EINVAL);
  assert_int_equal(mg_registry_load_kernel(reg, NULL, k_image, sizeof k_image, &k, &d), MLAGEN_EINVAL);
  assert_null(k);
  assert_int_equal(mg_registry_count(reg), 1);
  assert_int_equal(mg_registry_destroy(reg, &d), 0);
  mg_diag_clear(&d);
}

static void test_missing_kernel(void **state) {
  (void)state;
  int live0;
  mg_module_registry *reg = fresh_registry(&live0);
  mg_diag d = MG_DIAG_INIT;
  mg_launch_rule r = rule_of(1, 128, 0);
  const mg_module_kernel *k = (const mg_module_kernel *)&r; /* must be reset to NULL */
  assert_int_equal(mg_registry_load(reg, "mla_attn_fwd_typo", k_image, sizeof k_image, &r, &k, &d),
                   MLAGEN_EINVAL);
  assert_null(k);
  assert_contains(mg_diag_msg(&d), "kernel 'mla_attn_fwd_typo' not found in its cubin");
  assert_contains(mg_diag_msg(&d), "CUDA_ERROR_NOT_FOUND");
  /* a prefix of a real name is not that name */
  assert_int_equal(mg_registry_load(reg, "k_sma", k_image, sizeof k_image, &r, &k, &d), MLAGEN_EINVAL);
  /* the module loaded for the lookup was unloaded again; nothing registered */
  assert_int_equal(fake.count("cuModuleLoadData"), 2);
  assert_int_equal(fake.count("cuModuleUnload"), 2);
  assert_int_equal(fake.count("live_modules"), live0);
  assert_int_equal(mg_registry_count(reg), 0);
  assert_int_equal(mg_registry_destroy(reg, &d), 0);
  assert_int_equal(fake.count("cuModuleUnload"), 2);
  mg_diag_clear(&d);
}

static void test_driver_failures(void **state) {
  (void)state;
  int live0;
  mg_module_registry *reg = fresh_registry(&live0);
  mg_diag d = MG_DIAG_INIT;
  const mg_module_kernel *k = NULL;
  mg_launch_rule small = rule_of(1, 128, 0), big = rule_of(1, 128, 100000);

  /* an image the driver rejects */
  static const char junk[] = "not a cubin";
  assert_int_equal(mg_registry_load(reg, "k_small", junk, sizeof junk, &small, &k, &d), MG_EDRIVER);
  assert_contains(mg_diag_msg(&d), "cuModuleLoadData (kernel k_small, cubin of 12 bytes)");
  assert_contains(mg_diag_msg(&d), "CUDA_ERROR_INVALID_IMAGE (device kernel image is invalid)");
  /* injected: out of memory while loading */
  fake.inject("cuModuleLoadData", CUDA_ERROR_OUT_OF_MEMORY);
  assert_int_equal(mg_registry_load(reg, "k_small", k_image, sizeof k_image, &small, &k, &d),
                   MLAGEN_ENOMEM);
  assert_contains(mg_diag_msg(&d), "CUDA_ERROR_OUT_OF_MEMORY");
  /* cuModuleGetFunction failing otherwise than not-found */
  fake.inject("cuModuleGetFunction", CUDA_ERROR_INVALID_HANDLE);
  assert_int_equal(mg_registry_load(reg, "k_small", k_image, sizeof k_image, &small, &k, &d), MG_EDRIVER);
  assert_contains(mg_diag_msg(&d), "cuModuleGetFunction (kernel k_small): CUDA_ERROR_INVALID_HANDLE");
  /* the attribute refused: injected, and smem over the device's opt-in limit */
  fake.inject("cuFuncSetAttribute", CUDA_ERROR_INVALID_VALUE);
  assert_int_equal(mg_registry_load(reg, "k_big", k_image, sizeof k_image, &big, &k, &d), MG_EDRIVER);
  assert_contains(mg_diag_msg(&d),
                  "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES = 100000) (kernel k_big): "
                  "CUDA_ERROR_INVALID_VALUE (invalid argument)");
  mg_launch_rule huge = rule_of(1, 128, 300000);
  assert_int_equal(mg_registry_load(reg, "k_huge", k_image, sizeof k_image, &huge, &k, &d), MG_EDRIVER);
  assert_contains(mg_diag_msg(&d), "= 300000) (kernel k_huge): CUDA_ERROR_INVALID_VALUE");
  assert_null(k);
  /* every failed load left nothing behind */
  assert_int_equal(mg_registry_count(reg), 0);
  assert_int_equal(fake.count("live_modules"), live0);

  /* a launch failure */
  assert_int_equal(mg_registry_load(reg, "k_big", k_image, sizeof k_image, &big, &k, &d), 0);
  fake.inject("cuLaunchKernel", CUDA_ERROR_LAUNCH_FAILED);
  mg_launch_dims dims = {.batch = 2, .seqlen_q = 5, .seqlen_k = 5};
  assert_int_equal(mg_registry_launch(reg, k, &dims, NULL, NULL, &d), MG_EDRIVER);
  assert_contains(mg_diag_msg(&d), "cuLaunchKernel(k_big, grid 5,1,2, block 128,1,1, smem 100000): "
                                   "CUDA_ERROR_LAUNCH_FAILED (unspecified launch failure)");
  assert_int_equal(mg_registry_launch(reg, k, &dims, NULL, NULL, &d), 0); /* injected once */

  /* an unload failing in destroy: reported, the other modules still unloaded */
  const mg_module_kernel *k2 = NULL;
  assert_int_equal(mg_registry_load(reg, "k_small", k_image, sizeof k_image, &small, &k2, &d), 0);
  assert_int_equal(fake.count("live_modules"), live0 + 2);
  fake.inject("cuModuleUnload", CUDA_ERROR_INVALID_HANDLE);
  const int unloads = fake.count("cuModuleUnload");
  assert_int_equal(mg_registry_destroy(reg, &d), MG_EDRIVER);
  assert_contains(mg_diag_msg(&d), "cuModuleUnload (kernel k_big): CUDA_ERROR_INVALID_HANDLE");
  assert_int_equal(fake.count("cuModuleUnload"), unloads + 2);
  assert_int_equal(fake.count("live_modules"), live0 + 1); /* the fake kept the refused one */
  mg_diag_clear(&d);
}

static void test_nodriver(void **state) {
  (void)state;
  mg_diag d = MG_DIAG_INIT;
  mg_module_registry *reg = (mg_module_registry *)&d; /* must be reset to NULL */
  assert_int_equal(mg_registry_create(&reg, &d), MLAGEN_ENODRIVER);
  assert_null(reg);
  assert_contains(mg_diag_msg(&d), "no CUDA driver");
  assert_contains(mg_diag_msg(&d), NO_SUCH_LIBCUDA);
  /* a second attempt: the same answer */
  assert_int_equal(mg_registry_create(&reg, NULL), MLAGEN_ENODRIVER);
  assert_int_equal(mg_registry_create(NULL, &d), MLAGEN_EINVAL);
  mg_diag_clear(&d);
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "fake";
  if (strcmp(mode, "nodriver") == 0) {
    fake_driver_use(NULL);
    const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rule_parse),
      cmocka_unit_test(test_grid),
      cmocka_unit_test(test_nodriver),
    };
    return cmocka_run_group_tests_name("module registry (no driver)", tests, NULL, NULL);
  }
  if (strcmp(mode, "fake") == 0) {
    if (fake_driver_open(&fake)) return 1;
    const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rule_parse),
      cmocka_unit_test(test_grid),
      cmocka_unit_test(test_load_lookup_launch),
      cmocka_unit_test(test_load_manifest_mul),
      cmocka_unit_test(test_missing_kernel),
      cmocka_unit_test(test_driver_failures),
    };
    return cmocka_run_group_tests_name("module registry (fake driver)", tests, NULL, NULL);
  }
  fprintf(stderr, "usage: test_module [fake|nodriver]\n");
  return 2;
}
