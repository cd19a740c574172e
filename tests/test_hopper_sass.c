/* test_hopper_sass.c: tests/host/hopper_selftest.cu (the Hopper primitives of
 * templates/mla_device_sm90.cuh, run on the host executor by test_hopper_host.c) compiles
 * with NVRTC for sm_90a, its qk kernels with no spills (ptxas figures printed), and the
 * SASS, read with nvdisasm (MLAGEN_NVDISASM, as test_device_header), holds the instructions
 * the wrappers stand for. Without nvdisasm the SASS check fails in CI and is skipped
 * elsewhere (exit 77, ctest's skip). Needs NVRTC and the CUDA headers, no GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ci.h"
#include "mg_fs.h"
#include "mg_jit.h"
#include "mlagen.h"

#ifndef MLAGEN_NVDISASM
#error "MLAGEN_NVDISASM (nvdisasm's path, or \"\" when none was found) must be defined"
#endif

static char *read_src(const char *rel, size_t *len) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", MLAGEN_SOURCE_DIR, rel);
  mg_diag d = MG_DIAG_INIT;
  char *data = NULL;
  if (mg_fs_read(path, 1 << 20, &data, len, &d)) fail_msg("%s", mg_diag_msg(&d));
  return data;
}

static int g_skipped;

/* The instructions the wrappers must become (nvdisasm of the sm_90a cubin): wgmma ->
 * HGMMA of its shape, TMA -> UTMALDG, mbarrier -> SYNCS, the proxy fence -> FENCE.VIEW.ASYNC,
 * wait_group -> WARPGROUP.DEPBAR; for the backward: an MN-major A -> HGMMA ... gdesc[..].tnspA,
 * TMA store / reduction -> UTMASTG / UTMAREDG.ADD, bulk wait_group -> DEPBAR.LE SB0, named
 * barriers -> BAR.SYNC.DEFER_BLOCKING id, count / BAR.ARV, stmatrix -> STSM.16.M(T)88.4. */
static const char *const g_sass[] = {
    "HGMMA.64x64x16.F32.BF16 ", "HGMMA.64x128x16.F32.BF16 ", "HGMMA.64x192x16.F32.BF16 ",
    "HGMMA.64x256x16.F32.BF16 ", "UTMALDG.2D ", "UTMALDG.3D ", "SYNCS.EXCH.64 ",
    "SYNCS.ARRIVE.TRANS64", "SYNCS.PHASECHK.TRANS64", "FENCE.VIEW.ASYNC.S", "WARPGROUP.ARRIVE",
    "WARPGROUP.DEPBAR.LE",
    ".tnspA,", ".tnspA.tnspB,", "HGMMA.64x64x16.F32 R" /* f16 */, "UTMASTG.2D ",
    "UTMAREDG.2D.ADD ", "UTMACMDFLUSH", "DEPBAR.LE SB0",
    "BAR.SYNC.DEFER_BLOCKING 0x2, 0x100", "BAR.ARV 0x1, 0x100", "STSM.16.M88.4 ",
    "STSM.16.MT88.4 "};

/* The cubin's SASS must hold g_sass (nvdisasm: MLAGEN_NVDISASM, as test_device_header).
 * Without nvdisasm: fails in CI, else skipped (the program exits 77 when nothing failed). */
static void check_sass(const mg_cubin *c) {
  const char *tool = MLAGEN_NVDISASM;
  if (!*tool || access(tool, X_OK) != 0) {
    if (mg_test_in_ci()) fail_msg("no nvdisasm: the sm_90a SASS cannot be checked (scripts/setup.sh)");
    print_message("  no nvdisasm: SASS check SKIPPED (scripts/setup.sh installs it)\n");
    g_skipped = 1;
    return;
  }
  char dir[] = "/tmp/mg-test-hopper-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char bin[256], txt[256], cmd[1024];
  snprintf(bin, sizeof bin, "%s/k.cubin", dir);
  snprintf(txt, sizeof txt, "%s/k.sass", dir);
  mg_diag d = MG_DIAG_INIT;
  char *sass = NULL;
  size_t len;
  snprintf(cmd, sizeof cmd, "'%s' -c '%s' > '%s' 2>&1", tool, bin, txt);
  int ok = mg_fs_write_atomic(bin, c->data, c->size, &d) == 0 && system(cmd) == 0 &&
           mg_fs_read(txt, 64 << 20, &sass, &len, &d) == 0;
  mg_diag_clear(&d);
  unlink(bin), unlink(txt), rmdir(dir);
  if (!ok) fail_msg("%s could not disassemble the sm_90a cubin", tool);
  for (size_t i = 0; i < sizeof g_sass / sizeof *g_sass; i++)
    if (!strstr(sass, g_sass[i])) fail_msg("no '%s' in the sm_90a SASS", g_sass[i]);
  print_message("  SASS (%s): HGMMA.64x{64,128,192,256}x16.F32.BF16, UTMALDG.2D/.3D, SYNCS "
                "(mbarrier), FENCE.VIEW.ASYNC.S, WARPGROUP.ARRIVE/DEPBAR.LE, HGMMA .tnspA(.tnspB) (bf16, f16), "
                "UTMASTG.2D, UTMAREDG.2D.ADD, DEPBAR.LE SB0, BAR.SYNC/BAR.ARV id, count, "
                "STSM.16.M88.4/MT88.4\n", tool);
  free(sass);
}

/* NVRTC for sm_90a: hopper_selftest.cu compiles; the listed kernels have no spills; the SASS
 * holds the Hopper instructions. */
static void test_nvrtc_sm90a(void **state) {
  (void)state;
  size_t len, l0, l1;
  char *src = read_src("tests/host/hopper_selftest.cu", &len);
  char *h0 = read_src("templates/mla_device.cuh", &l0);
  char *h1 = read_src("templates/mla_device_sm90.cuh", &l1);
  mg_jit_header h[2] = {{"mla_device.cuh", h0, l0}, {"mla_device_sm90.cuh", h1, l1}};
  /* the kernels whose figures are checked: the smallest and largest qk, and the backward's
   * primitives (MN-major A with B MN-major at d_v 128 and B K-major, the named-barrier
   * ping-pong, the TMA reductions and store). One compile builds the whole file: its log
   * holds every kernel's ptxas lines (mg_jit_report_parse), its cubin every kernel's SASS. */
  static const char *const kernels[] = {"hopper_qk_n64",  "hopper_qk_n256",  "hopper_tt_n128",
                                        "hopper_tk_n64",  "hopper_pingpong", "hopper_bulk",
                                        "hopper_stmatrix"};
  mg_jit_opts o;
  memset(&o, 0, sizeof o);
  o.arch = "sm_90a";
  o.no_cache = 1; /* compiled here, so the log is there */
  o.template_hash = "";
  o.headers = h;
  o.n_headers = 2;
  mg_cubin c;
  mg_diag d = MG_DIAG_INIT;
  int rc = mg_jit_compile(src, len, "hopper_selftest.cu", kernels[0], &o, &c, &d);
  if (rc) fail_msg("%s: %s", mlagen_status_name(rc), mg_diag_msg(&d));
  assert_non_null(c.log);
  for (size_t i = 0; i < sizeof kernels / sizeof *kernels; i++) {
    mg_jit_report r;
    if (!mg_jit_report_parse(c.log, kernels[i], &r)) fail_msg("ptxas reported no %s", kernels[i]);
    print_message("  sm_90a %s: %d registers, %ld spill bytes, %ld stack bytes\n", kernels[i],
                  r.registers, r.spill_stores + r.spill_loads, r.stack_bytes);
    assert_true(r.registers > 0);
    assert_int_equal(r.spill_stores + r.spill_loads, 0);
  }
  check_sass(&c);
  mg_cubin_free(&c);
  free(src), free(h0), free(h1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nvrtc_sm90a),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  return failed ? failed : g_skipped ? 77 : 0;
}
