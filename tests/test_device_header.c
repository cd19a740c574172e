/* test_device_header.c: the templates' device header (templates/mla_device.cuh) with its
 * PTX wrappers compiles with NVRTC for sm_80 and sm_90a, from the very text the host
 * executor runs (tests/host/ptx_selftest.cu, which uses every wrapper; the host side is
 * checked by tests/host/run_selftest.sh). That it compiles at all shows NVRTC took the
 * asm branch (the host branch calls functions NVRTC does not have) and ptxas accepted
 * the instructions for the arch. Then the SASS, read with nvdisasm, must hold the
 * instructions the wrappers stand for (HMMA.16816 bf16 and f16, LDSM with and without
 * .MT88, LDGSTS, LDGDEPBAR, DEPBAR), so a wrapper that compiled to something else fails.
 * nvdisasm is the one CMake found (MLAGEN_NVDISASM: the toolkit's, PATH, or the PyPI
 * wheel scripts/setup.sh installs into <build>/tools). Without it the SASS check fails
 * in CI (CI set, not "0"/"false") and is a cmocka skip elsewhere, the program then
 * exiting 77, which ctest reports as skipped. Needs NVRTC and the CUDA headers, no GPU. */
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

static int g_skipped; /* a check skipped: exit 77 when nothing failed */


static char *read_source(const char *rel, size_t *len) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", MLAGEN_SOURCE_DIR, rel);
  mg_diag d = MG_DIAG_INIT;
  char *data = NULL;
  if (mg_fs_read(path, 1 << 20, &data, len, &d)) fail_msg("%s", mg_diag_msg(&d));
  return data;
}

/* The SASS of a cubin's code sections, by nvdisasm (NULL when it cannot run). */
static char *sass_of(const mg_cubin *c, const char *nvdisasm) {
  char dir[] = "/tmp/mg-test-devhdr-XXXXXX";
  if (!mkdtemp(dir)) return NULL;
  char bin[256], txt[256], cmd[2048];
  snprintf(bin, sizeof bin, "%s/k.cubin", dir);
  snprintf(txt, sizeof txt, "%s/k.sass", dir);
  mg_diag d = MG_DIAG_INIT;
  char *out = NULL;
  size_t len;
  if (mg_fs_write_atomic(bin, c->data, c->size, &d) == 0) {
    int n = snprintf(cmd, sizeof cmd, "'%s' -c '%s' > '%s' 2>&1", nvdisasm, bin, txt);
    if (n > 0 && (size_t)n < sizeof cmd && system(cmd) == 0 &&
        mg_fs_read(txt, 64 << 20, &out, &len, &d) != 0)
      out = NULL;
  }
  mg_diag_clear(&d);
  unlink(bin);
  unlink(txt);
  rmdir(dir);
  return out;
}

/* The SASS of kernel `name` in nvdisasm's output: from its ".text.<name>:" label to the
 * next section (malloc'ed), or NULL. */
static char *kernel_sass(const char *sass, const char *name) {
  char label[128];
  snprintf(label, sizeof label, "\n.text.%s:", name);
  const char *at = strstr(sass, label);
  if (!at) return NULL;
  at += strlen(label);
  const char *end = strstr(at, "\n\t.section");
  size_t n = end ? (size_t)(end - at) : strlen(at);
  char *out = malloc(n + 1);
  assert_non_null(out);
  memcpy(out, at, n);
  out[n] = '\0';
  return out;
}

/* The instructions each kernel of ptx_selftest.cu must compile to (a trailing space ends
 * the mnemonic: "HMMA.16816.F32 " is f16 inputs, not the .BF16 form). */
static const struct {
  const char *kernel;
  const char *sass[7];
} want[] = {
    {"k_mma_direct", {"HMMA.16816.F32.BF16 ", "HMMA.16816.F32 "}},
    {"k_mma_ldmatrix", {"LDSM.16.M88.4 ", "LDSM.16.M88.2 ", "LDSM.16.MT88.4 ", "LDSM.16.MT88.2 ",
                        "HMMA.16816.F32.BF16 "}},
    {"k_ldmatrix_raw", {"LDSM.16.M88 ", "LDSM.16.M88.2 ", "LDSM.16.M88.4 ", "LDSM.16.MT88 ",
                        "LDSM.16.MT88.2 ", "LDSM.16.MT88.4 "}},
    {"k_cp_async", {"LDGSTS.E.BYPASS.128 ", "LDGDEPBAR ", "DEPBAR.LE SB0, 0x1 ",
                    "DEPBAR.LE SB0, 0x0 "}},
};

static void compile_for(const char *arch) {
  size_t src_len, hdr_len;
  char *src = read_source("tests/host/ptx_selftest.cu", &src_len);
  char *hdr = read_source("templates/mla_device.cuh", &hdr_len);
  mg_jit_header h = {"mla_device.cuh", hdr, hdr_len};
  mg_jit_opts o;
  memset(&o, 0, sizeof o);
  o.arch = arch;
  o.no_cache = 1;
  o.template_hash = "";
  o.headers = &h;
  o.n_headers = 1;
  /* Each kernel separately named for its ptxas figures; one compile holds them all. */
  mg_cubin c;
  mg_diag d = MG_DIAG_INIT;
  int rc = mg_jit_compile(src, src_len, "ptx_selftest.cu", "k_mma_ldmatrix", &o, &c, &d);
  if (rc) fail_msg("%s: %s: %s", arch, mlagen_status_name(rc), mg_diag_msg(&d));
  mg_diag_clear(&d);
  print_message("  %s: k_mma_ldmatrix %d registers, %ld bytes smem, %ld spill bytes (%.0f ms)\n",
                arch, c.report.registers, c.report.smem_bytes,
                c.report.spill_stores + c.report.spill_loads, c.report.compile_ms);
  assert_true(c.report.registers > 0);
  assert_int_equal(c.report.spill_stores + c.report.spill_loads, 0);
  assert_int_equal(c.report.smem_bytes, 2 * 16 * 16 * 2);

  const char *tool = MLAGEN_NVDISASM;
  if (!*tool || access(tool, X_OK) != 0) {
    mg_cubin_free(&c);
    free(src);
    free(hdr);
    if (mg_test_in_ci())
      fail_msg("%s: no nvdisasm (%s): the SASS cannot be checked; scripts/setup.sh installs it",
               arch, *tool ? tool : "not found at configure time");
    print_message("  %s: no nvdisasm (%s): SASS check SKIPPED (scripts/setup.sh installs it)\n",
                  arch, *tool ? tool : "not found at configure time");
    g_skipped = 1;
    skip();
    return; /* skip() longjmps; the return tells the compiler src and hdr are not used again */
  }
  char *sass = sass_of(&c, tool);
  if (!sass) fail_msg("%s: %s could not disassemble the cubin", arch, tool);
  for (size_t i = 0; i < sizeof want / sizeof *want; i++)
    for (size_t j = 0; j < sizeof want[i].sass / sizeof *want[i].sass && want[i].sass[j]; j++) {
      char *body = kernel_sass(sass, want[i].kernel);
      if (!body) fail_msg("%s: no %s in the SASS", arch, want[i].kernel);
      if (!strstr(body, want[i].sass[j]))
        fail_msg("%s: %s: no '%s' in its SASS:\n%s", arch, want[i].kernel, want[i].sass[j], body);
      free(body);
    }
  print_message("  %s: SASS (%s) of the 4 kernels has HMMA.16816 (.BF16 and f16), LDSM "
                "(.M88/.MT88, x1/x2/x4), LDGSTS.E.BYPASS.128, LDGDEPBAR, DEPBAR.LE SB0 0x1/0x0\n",
                arch, tool);
  free(sass);
  mg_cubin_free(&c);
  free(src);
  free(hdr);
}

static void test_sm80(void **state) { (void)state; compile_for("sm_80"); }
static void test_sm90a(void **state) { (void)state; compile_for("sm_90a"); }

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sm80),
      cmocka_unit_test(test_sm90a),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  return failed ? failed : g_skipped ? 77 : 0;
}
