/* test_device_header.c: the templates' device header (templates/mla_device.cuh) with its
 * PTX wrappers compiles with NVRTC for sm_80 and sm_90a, from the very text the host
 * executor runs (tests/host/ptx_selftest.cu, which uses every wrapper; the host side is
 * checked by tests/host/run_selftest.sh). That it compiles at all shows NVRTC took the
 * asm branch (the host branch calls functions NVRTC does not have) and ptxas accepted
 * the instructions for the arch. When cuobjdump is found (PATH, $CUDA_HOME/bin) the SASS
 * is checked for the instructions the wrappers stand for. Needs NVRTC and the CUDA
 * headers, no GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mg_fs.h"
#include "mg_jit.h"
#include "mlagen.h"

static char *read_source(const char *rel, size_t *len) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", MLAGEN_SOURCE_DIR, rel);
  mg_diag d = MG_DIAG_INIT;
  char *data = NULL;
  if (mg_fs_read(path, 1 << 20, &data, len, &d)) fail_msg("%s", mg_diag_msg(&d));
  return data;
}

/* cuobjdump on PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin: 1 and its path in buf. */
static int find_cuobjdump(char *buf, size_t n) {
  const char *path = getenv("PATH");
  while (path && *path) {
    size_t k = strcspn(path, ":");
    if (k && k < 900) {
      snprintf(buf, n, "%.*s/cuobjdump", (int)k, path);
      if (access(buf, X_OK) == 0) return 1;
    }
    path += k + (path[k] == ':');
  }
  const char *home = getenv("CUDA_HOME");
  snprintf(buf, n, "%s/bin/cuobjdump", home && *home ? home : "/usr/local/cuda");
  if (access(buf, X_OK) == 0) return 1;
  snprintf(buf, n, "/usr/local/cuda/bin/cuobjdump");
  return access(buf, X_OK) == 0;
}

/* The SASS of a cubin, by cuobjdump (NULL when it cannot run). */
static char *sass_of(const mg_cubin *c, const char *cuobjdump) {
  char dir[] = "/tmp/mg-test-devhdr-XXXXXX";
  if (!mkdtemp(dir)) return NULL;
  char bin[256], txt[256], cmd[2048];
  snprintf(bin, sizeof bin, "%s/k.cubin", dir);
  snprintf(txt, sizeof txt, "%s/k.sass", dir);
  mg_diag d = MG_DIAG_INIT;
  char *out = NULL;
  size_t len;
  if (mg_fs_write_atomic(bin, c->data, c->size, &d) == 0) {
    int n = snprintf(cmd, sizeof cmd, "'%s' -sass '%s' > '%s' 2>&1", cuobjdump, bin, txt);
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

  char tool[1024];
  if (find_cuobjdump(tool, sizeof tool)) {
    char *sass = sass_of(&c, tool);
    if (!sass) fail_msg("%s: cuobjdump could not disassemble the cubin", arch);
    /* mma.m16n8k16 bf16 and f16, ldmatrix with and without .trans, cp.async with
     * commit and wait. */
    const char *want[] = {"HMMA.16816.F32.BF16", "HMMA.16816.F32", "LDSM.16.M88.4",
                          "LDSM.16.MT88.4", "LDSM.16.M88.2", "LDSM.16.MT88.2", "LDSM.16.M88",
                          "LDGSTS.E.BYPASS.128", "LDGDEPBAR", "DEPBAR"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
      if (!strstr(sass, want[i])) fail_msg("%s: no %s in the SASS", arch, want[i]);
    print_message("  %s: SASS has HMMA.16816, LDSM (.MT88), LDGSTS, LDGDEPBAR, DEPBAR\n", arch);
    free(sass);
  } else {
    print_message("  %s: no cuobjdump, SASS not checked\n", arch);
  }
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
  return cmocka_run_group_tests(tests, NULL, NULL);
}
