/* test_jit.c: NVRTC compilation and the cubin disk cache (needs the CUDA toolkit's
 * NVRTC and headers, no GPU). Every test gets a fresh cache directory under /tmp. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mg_fs.h"
#include "mg_jit.h"
#include "mlagen.h"

/* A small real kernel: a bf16 load, static smem, a warp shuffle, a block barrier;
 * plus a second kernel, so the report must pick the right one. */
static const char KSRC[] =
    "#include <cuda_bf16.h>\n"
    "extern \"C\" __global__ void k(const __nv_bfloat16 *x, float *y) {\n"
    "  __shared__ float s[256];\n"
    "  float v = __bfloat162float(x[threadIdx.x]);\n"
    "  v += __shfl_xor_sync(0xffffffffu, v, 1);\n"
    "  s[threadIdx.x] = v;\n"
    "  __syncthreads();\n"
    "  y[threadIdx.x] = s[255 - threadIdx.x];\n"
    "}\n"
    "extern \"C\" __global__ void k2(float *y) { y[threadIdx.x] = 1.0f; }\n";

/* A kernel that takes a constant from an extra header. */
static const char HSRC[] =
    "#include \"mg_test.cuh\"\n"
    "extern \"C\" __global__ void h(float *y) { y[threadIdx.x] = MG_TEST_VALUE; }\n";

/* C++ linkage: ptxas reports the mangled name. */
static const char MSRC[] = "__global__ void f(float *y) { y[threadIdx.x] = 2.0f; }\n";

/* A kernel with a stack frame calling a non-inlined function without one: ptxas reports
 * the callee's properties after the kernel's, and they must not overwrite them. */
static const char SSRC[] =
    "__device__ __noinline__ float g(const float *x, int i) {\n"
    "  float a[32];\n"
    "  for (int j = 0; j < 32; j++) a[j] = x[j] * j;\n"
    "  return a[i & 31];\n"
    "}\n"
    "extern \"C\" __global__ void kstack(const float *x, float *y, int i) {\n"
    "  y[threadIdx.x] = g(x, i + threadIdx.x);\n"
    "}\n";

/* sm_90a: a wgmma whose accumulator is read before its wait_group, so ptxas serializes
 * the wgmma of kser (note C7514), not of the second kernel kok. */
static const char WSRC[] =
    "#define MMA(d, a, b) asm volatile(\"wgmma.fence.sync.aligned;\\n\"\\\n"
    "  \"wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7}, \"\\\n"
    "  \"%8, %9, 1, 1, 1, 0, 0;\\nwgmma.commit_group.sync.aligned;\\n\"\\\n"
    "  : \"+f\"(d[0]), \"+f\"(d[1]), \"+f\"(d[2]), \"+f\"(d[3]), \"+f\"(d[4]), \"+f\"(d[5]),\\\n"
    "    \"+f\"(d[6]), \"+f\"(d[7]) : \"l\"(a), \"l\"(b) : \"memory\")\n"
    "#define WAIT(n) asm volatile(\"wgmma.wait_group.sync.aligned \" #n \";\\n\" ::: \"memory\")\n"
    "extern \"C\" __global__ void kser(const unsigned long long *g, float *y, int n) {\n"
    "  float d[8] = {0};\n"
    "  for (int i = 0; i < n; i++) {\n"
    "    MMA(d, g[2 * i], g[2 * i + 1]);\n"
    "    y[i] = d[i & 7];\n"
    "    WAIT(1);\n"
    "  }\n"
    "  WAIT(0);\n"
    "  for (int j = 0; j < 8; j++) y[n + j] = d[j];\n"
    "}\n"
    "extern \"C\" __global__ void kok(const unsigned long long *g, float *y) {\n"
    "  float d[8] = {0};\n"
    "  MMA(d, g[0], g[1]);\n"
    "  WAIT(0);\n"
    "  for (int j = 0; j < 8; j++) y[j] = d[j];\n"
    "}\n";

typedef struct {
  char dir[64];
} state;

/* ---- helpers -------------------------------------------------------------------- */

static void rm_rf(const char *path) {
  struct stat st;
  if (lstat(path, &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    DIR *dp = opendir(path);
    if (dp) {
      struct dirent *e;
      while ((e = readdir(dp))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char sub[4096];
        snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
        rm_rf(sub);
      }
      closedir(dp);
    }
    rmdir(path);
  } else {
    unlink(path);
  }
}

static int setup(void **s) {
  state *st = calloc(1, sizeof *st);
  if (!st) return -1;
  snprintf(st->dir, sizeof st->dir, "/tmp/mg-test-jit-XXXXXX");
  if (!mkdtemp(st->dir)) {
    free(st);
    return -1;
  }
  *s = st;
  return 0;
}

static int teardown(void **s) {
  state *st = *s;
  rm_rf(st->dir);
  free(st);
  return 0;
}

static mg_jit_opts opts_for(const char *dir, const char *arch) {
  mg_jit_opts o;
  memset(&o, 0, sizeof o);
  o.arch = arch;
  o.cache_dir = dir;
  o.template_hash = "";
  return o;
}

/* Compiles src (kernel "k" unless named) and asserts success. */
static void jit_ok(const char *src, const char *kernel, const mg_jit_opts *o, mg_cubin *c) {
  mg_diag d = MG_DIAG_INIT;
  int rc = mg_jit_compile(src, strlen(src), "test.cu", kernel, o, c, &d);
  if (rc) fail_msg("mg_jit_compile: %s: %s", mlagen_status_name(rc), mg_diag_msg(&d));
  mg_diag_clear(&d);
  assert_non_null(c->data);
  assert_true(c->size > 4);
  assert_memory_equal(c->data, "\x7f" "ELF", 4);
  assert_int_equal(strlen(c->key), MG_HASH_HEX - 1);
}

static void entry_path(const char *dir, const char *key, char *buf, size_t n) {
  snprintf(buf, n, "%s/%s.cubin", dir, key);
}

/* Counts the files in dir whose names end in ".cubin" and those holding ".tmp.". */
static void count_files(const char *dir, int *cubins, int *tmps, int *all) {
  *cubins = *tmps = *all = 0;
  DIR *dp = opendir(dir);
  assert_non_null(dp);
  struct dirent *e;
  while ((e = readdir(dp))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    size_t n = strlen(e->d_name);
    (*all)++;
    if (strstr(e->d_name, ".tmp.")) (*tmps)++;
    else if (n > 6 && !strcmp(e->d_name + n - 6, ".cubin")) (*cubins)++;
  }
  closedir(dp);
}

/* Equal ptxas figures; and compile_ms too when with_time. */
static void assert_report_equal(const mg_jit_report *a, const mg_jit_report *b, int with_time) {
  assert_int_equal(a->registers, b->registers);
  assert_int_equal(a->barriers, b->barriers);
  assert_int_equal(a->spill_stores, b->spill_stores);
  assert_int_equal(a->spill_loads, b->spill_loads);
  assert_int_equal(a->stack_bytes, b->stack_bytes);
  assert_int_equal(a->smem_bytes, b->smem_bytes);
  assert_int_equal(a->cmem_bytes, b->cmem_bytes);
  assert_int_equal(a->wgmma_serialized, b->wgmma_serialized);
  double dt = a->compile_ms - b->compile_ms;
  if (with_time) assert_true(dt < 0.001 && dt > -0.001); /* stored to the microsecond */
}

/* ---- compile and hit ----------------------------------------------------------- */

static void compile_then_hit(state *st, const char *arch) {
  mg_jit_opts o = opts_for(st->dir, arch);
  mg_cubin a, b;
  jit_ok(KSRC, "k", &o, &a);
  assert_int_equal(a.report.cache_hit, 0);
  assert_true(a.report.registers > 0);
  assert_int_equal(a.report.barriers, 1);
  assert_int_equal(a.report.spill_stores, 0);
  assert_int_equal(a.report.spill_loads, 0);
  assert_int_equal(a.report.stack_bytes, 0);
  assert_int_equal(a.report.smem_bytes, 1024);
  assert_true(a.report.compile_ms > 0);
  assert_true(a.report.elapsed_ms >= a.report.compile_ms);
  assert_non_null(a.log);
  assert_non_null(strstr(a.log, "ptxas"));
  assert_null(a.warning);

  char path[256];
  entry_path(st->dir, a.key, path, sizeof path);
  assert_true(mg_fs_is_file(path));
  char *f;
  size_t n;
  assert_int_equal(mg_fs_read(path, (size_t)1 << 28, &f, &n, NULL), 0);
  assert_true(n > a.size + 8);
  assert_memory_equal(f, "MLAGENJ1", 8);
  assert_memory_equal(f + n - a.size, a.data, a.size); /* the cubin ends the entry */
  free(f);

  jit_ok(KSRC, "k", &o, &b);
  assert_int_equal(b.report.cache_hit, 1);
  assert_int_equal(b.size, a.size);
  assert_memory_equal(b.data, a.data, a.size);
  assert_string_equal(b.key, a.key);
  assert_report_equal(&b.report, &a.report, 1);
  assert_null(b.log);
  assert_null(b.warning);
  print_message("%s: cold %.1f ms (NVRTC %.1f ms), warm %.3f ms, %d registers, %zu bytes\n",
                arch, a.report.elapsed_ms, a.report.compile_ms, b.report.elapsed_ms,
                a.report.registers, a.size);
  mg_cubin_free(&a);
  mg_cubin_free(&b);
}

static void test_sm80(void **s) {
  compile_then_hit(*s, "sm_80");
}

static void test_sm90a(void **s) {
  compile_then_hit(*s, "sm_90a");
}

/* ptxas's serialization note reaches the report of the kernel it names, from NVRTC's log
 * and, on a hit, from the cache entry; the other kernel of the source is not marked. */
static void test_sm90a_serialized(void **s) {
  state *st = *s;
  mg_jit_opts o = opts_for(st->dir, "sm_90a");
  mg_cubin a, b, c;
  jit_ok(WSRC, "kser", &o, &a);
  assert_int_equal(a.report.cache_hit, 0);
  if (a.report.wgmma_serialized < 7510 || a.report.wgmma_serialized > 7520)
    fail_msg("kser: wgmma_serialized %d; log:\n%s", a.report.wgmma_serialized, a.log);
  jit_ok(WSRC, "kser", &o, &b);
  assert_int_equal(b.report.cache_hit, 1);
  assert_report_equal(&b.report, &a.report, 1);
  jit_ok(WSRC, "kok", &o, &c);
  assert_int_equal(c.report.cache_hit, 0); /* the kernel named is part of the key */
  assert_true(c.report.registers > 0);
  if (c.report.wgmma_serialized) fail_msg("kok: serialized; log:\n%s", c.log);
  print_message("kser: C%d (%s)\n", a.report.wgmma_serialized, a.log ? "from the log" : "-");
  mg_cubin_free(&a);
  mg_cubin_free(&b);
  mg_cubin_free(&c);
}

/* The report is for the named kernel; mangled (C++) names match the plain name. */
static void test_kernel_select(void **s) {
  state *st = *s;
  mg_jit_opts o = opts_for(st->dir, "sm_80");
  mg_cubin c;
  jit_ok(KSRC, "k2", &o, &c);
  assert_int_equal(c.report.smem_bytes, 0);
  assert_int_equal(c.report.barriers, 0);
  assert_true(c.report.registers > 0);
  assert_null(c.warning);
  mg_cubin_free(&c);

  jit_ok(KSRC, NULL, &o, &c); /* the first reported: either kernel, but figures set */
  assert_true(c.report.registers > 0);
  assert_null(c.warning);
  mg_cubin_free(&c);

  jit_ok(MSRC, "f", &o, &c);
  assert_true(c.report.registers > 0);
  assert_null(c.warning);
  mg_cubin_free(&c);

  jit_ok(SSRC, "kstack", &o, &c);
  assert_true(c.report.stack_bytes > 0);
  mg_cubin_free(&c);

  jit_ok(MSRC, "nope", &o, &c); /* compiles, but the report has nothing for it */
  assert_non_null(c.warning);
  assert_non_null(strstr(c.warning, "nope"));
  assert_int_equal(c.report.registers, 0);
  mg_cubin_free(&c);
}

static void test_headers(void **s) {
  state *st = *s;
  mg_jit_opts o = opts_for(st->dir, "sm_80");
  static const char hdr[] = "#define MG_TEST_VALUE 3.0f\n";
  mg_jit_header h = {"mg_test.cuh", hdr, sizeof hdr - 1};
  o.headers = &h;
  o.n_headers = 1;
  mg_cubin c;
  jit_ok(HSRC, "h", &o, &c);
  assert_true(c.report.registers > 0);
  mg_cubin_free(&c);

  /* Without the header the include is refused before NVRTC looks for it on the host. */
  o.n_headers = 0;
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(mg_jit_compile(HSRC, strlen(HSRC), "test.cu", "h", &o, &c, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "#include \"mg_test.cuh\" refused"));
  assert_null(c.data);
  mg_diag_clear(&d);
}

/* Generated source may include only the extra headers (the device header) and the CUDA
 * headers it uses: any other #include would have NVRTC read a host file, print it in its
 * error log, and compile something the cache key does not cover. Refused before NVRTC,
 * in the source and in the headers, however the directive is spelled; includes inside
 * comments and literals are not directives and pass. (No NVRTC compile runs here.) */
static void test_fast_include_policy(void **s) {
  (void)s;
  static const char hdr[] = "#pragma once\n#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n";
  mg_jit_header h = {"mla_device.cuh", hdr, sizeof hdr - 1};
  mg_jit_opts o = {.arch = "sm_80", .no_cache = 1, .headers = &h, .n_headers = 1};
  static const char *const bad[] = {
      "#include \"/etc/passwd\"\n",
      "#include </etc/passwd>\n",
      "  #  include \"../secret.h\"\n",
      "#include \"cuda_bf16.h\"\n", /* CUDA headers as <name> only: "" searches more places */
      "#include_next <stdio.h>\n",
      "#import \"/etc/hostname\"\n",
      "#embed \"/etc/hostname\"\n",
      "#define F \"/etc/passwd\"\n#include F\n",
      "/* a comment */ # /* another */ include /* x */ \"/etc/passwd\"\n",
      "#\\\ninclude \"/etc/passwd\"\n",
      "#inc\\\nlude \"/etc/passwd\"\n",
      "%:include \"/etc/passwd\"\n",
      "?\?=include \"/etc/passwd\"\n",
      "int x = 1'0; int y = '/*';\n#include \"/etc/passwd\"\n// */\n",
      "const char *r = R\"(\n/*\n)\";\n#include \"/etc/passwd\"\n// */\n",
      "const char *r = R\"xy(\n)\"\n)xy\";\n#include \"/etc/passwd\"\n",
      "#include \"mla_device.cuh\"\n#include <mla_device.cuh/../../etc/passwd>\n",
      "#include\n",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    mg_cubin c;
    mg_diag d = MG_DIAG_INIT;
    int rc = mg_jit_compile(bad[i], strlen(bad[i]), "gen.cu", NULL, &o, &c, &d);
    if (rc != MLAGEN_EINVAL || !strstr(mg_diag_msg(&d), "gen.cu: "))
      fail_msg("case %zu (%s): %d %s", i, bad[i], rc, mg_diag_msg(&d));
    assert_null(c.data);
    mg_diag_clear(&d);
  }
  /* the message says what was refused and what is allowed */
  mg_cubin c;
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(mg_jit_compile(bad[0], strlen(bad[0]), "gen.cu", NULL, &o, &c, &d), MLAGEN_EINVAL);
  assert_string_equal(mg_diag_msg(&d),
                      "gen.cu: #include \"/etc/passwd\" refused: generated code may include only "
                      "\"mla_device.cuh\", <cuda_bf16.h>, <cuda_fp16.h> (another file would be "
                      "read from the host and is not part of the cache key)");
  mg_diag_clear(&d);
  /* a header that includes a host file is refused too */
  static const char evil[] = "#pragma once\n#include \"/etc/passwd\"\n";
  mg_jit_header he = {"mla_device.cuh", evil, sizeof evil - 1};
  mg_jit_opts oe = o;
  oe.headers = &he;
  static const char ok_src[] = "#include \"mla_device.cuh\"\n";
  assert_int_equal(mg_jit_compile(ok_src, strlen(ok_src), "gen.cu", NULL, &oe, &c, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "mla_device.cuh: #include \"/etc/passwd\" refused"));
  mg_diag_clear(&d);
  /* not directives: in comments, in literals, a raw string; '#' operators in macros.
   * These pass the check and fail later, in NVRTC (an unknown arch keeps it quick). */
  static const char fine[] =
      "#include \"mla_device.cuh\"\n"
      "#include <cuda_fp16.h>\n"
      "// #include it; see \"/etc/passwd\"\n"
      "/* #include \"/etc/passwd\"\n   #include </etc/shadow> */\n"
      "const char *a = \"#include </etc/passwd>\", b = '#';\n"
      "const char *r = R\"x(\n#include \"/etc/passwd\"\n)x\";\n"
      "#define S(x) #x\n#define C(a, b) a##b\n"
      "#line 7 \"t.tpl\"\n#pragma once\n"
      "int n = 1'000'000;\n"
      "int x = 1'000; /* '\n#include \"/etc/passwd\"\n// */\n";
  mg_jit_opts ob = o;
  ob.arch = "sm_1";
  int rc = mg_jit_compile(fine, strlen(fine), "gen.cu", NULL, &ob, &c, &d);
  if (rc == MLAGEN_EINVAL && strstr(mg_diag_msg(&d), "refused")) fail_msg("%s", mg_diag_msg(&d));
  mg_cubin_free(&c);
  mg_diag_clear(&d);
}

/* Cache entries written and read back through mg_jit_entry_write/read (fuzz_jit_entry's
 * round trip): figures survive, and a read entry whose compile_ms is beyond long long
 * microseconds (found by the fuzzer: undefined behaviour in the writer's cast) writes
 * clamped. A changed byte anywhere is refused. */
static void test_fast_entry_roundtrip(void **s) {
  (void)s;
  static const char key[] = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
  static const char elf[] = "\x7f" "ELF\x02\x01\x01\x33 not a real cubin";
  mg_cubin c;
  memset(&c, 0, sizeof c);
  snprintf(c.key, sizeof c.key, "%s", key);
  c.data = (void *)elf;
  c.size = sizeof elf - 1;
  c.report.registers = 40;
  c.report.spill_stores = 8;
  c.report.smem_bytes = 1024;
  c.report.wgmma_serialized = 7514;
  const double ms[] = {12.345, 99999999999999999.0, 1e300, -5};
  for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
    c.report.compile_ms = ms[i];
    mg_buf b;
    mg_buf_init(&b, 0);
    assert_int_equal(mg_jit_entry_write(&c, "k", "sm_90a", &b), 0);
    mg_cubin r;
    memset(&r, 0, sizeof r);
    int nomem = 0;
    const char *why = mg_jit_entry_read(b.data, b.len, key, &r, &nomem);
    if (why) fail_msg("compile_ms %g: %s", ms[i], why);
    assert_int_equal(r.size, c.size);
    assert_memory_equal(r.data, elf, c.size);
    assert_int_equal(r.report.registers, 40);
    assert_int_equal(r.report.spill_stores, 8);
    assert_int_equal(r.report.smem_bytes, 1024);
    assert_int_equal(r.report.wgmma_serialized, 7514);
    assert_true(r.report.compile_ms >= 0 && r.report.compile_ms <= 1e12);
    if (i == 0) assert_true(r.report.compile_ms > 12.344 && r.report.compile_ms < 12.346);
    assert_string_equal(r.key, key);
    mg_cubin_free(&r);
    for (size_t k = 0; k < b.len; k += 7) { /* every 7th byte changed: refused */
      b.data[k] ^= 0x20;
      assert_non_null(mg_jit_entry_read(b.data, b.len, key, &r, &nomem));
      assert_null(r.data);
      b.data[k] ^= 0x20;
    }
    assert_non_null(mg_jit_entry_read(b.data, b.len - 1, key, &r, &nomem));
    assert_non_null(mg_jit_entry_read(b.data, b.len, "another key", &r, &nomem));
    b.data[8] = 2; /* version 2 (before wgmma_serialized; the sum does not cover it): a miss */
    assert_string_equal(mg_jit_entry_read(b.data, b.len, key, &r, &nomem),
                        "unknown format version");
    mg_buf_free(&b);
  }
}

/* ptxas's serialization note, as NVRTC 13.0 logged it for a hand-written sm_90a kernel
 * reading a wgmma's accumulator before its wait (lines verbatim, the kernel renamed): the
 * note comes before the entry lines and names the function, mangled for C++ linkage. */
static const char SERIALIZED_LOG[] =
    "ptxas info    : (C7517) warpgroup.wait is injected in around line 91 by compiler to "
    "allow use of registers defined by GMMA in function '_Z4kserPKyPfi'\n"
    "ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are "
    "serialized due to non wgmma instructions reading accumulator registers of  a wgmma "
    "between start and end of the pipeline stage in the function '_Z4kserPKyPfi'\n"
    "ptxas info    : 0 bytes gmem\n"
    "ptxas info    : Compiling entry function '_Z5otherPf' for 'sm_90a'\n"
    "ptxas info    : Function properties for _Z5otherPf\n"
    "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    "ptxas info    : Used 8 registers, used 0 barriers\n"
    "ptxas info    : Compile time = 2.764 ms\n"
    "ptxas info    : Compiling entry function '_Z4kserPKyPfi' for 'sm_90a'\n"
    "ptxas info    : Function properties for _Z4kserPKyPfi\n"
    "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    "ptxas info    : Used 34 registers, used 0 barriers\n"
    "ptxas info    : Compile time = 71.612 ms\n";

/* The serialization note counts for the kernel it names (plain or mangled lookup), not for
 * another entry of the same compile; a note naming no entry (a non-inlined device function)
 * or no function counts for every entry; a note without its number still counts. */
static void test_fast_report_serialized(void **s) {
  (void)s;
  mg_jit_report r;
  assert_int_equal(mg_jit_report_parse(SERIALIZED_LOG, "kser", &r), 1);
  assert_int_equal(r.wgmma_serialized, 7514);
  assert_int_equal(r.registers, 34);
  assert_int_equal(mg_jit_report_parse(SERIALIZED_LOG, "other", &r), 1);
  assert_int_equal(r.wgmma_serialized, 0);
  assert_int_equal(r.registers, 8);
  assert_int_equal(mg_jit_report_parse(SERIALIZED_LOG, NULL, &r), 1); /* the first: other */
  assert_int_equal(r.wgmma_serialized, 0);
  char log[sizeof SERIALIZED_LOG + 64];
  const char *mid = strstr(SERIALIZED_LOG, "ptxas info    : 0 bytes gmem");
  int pre = (int)(strstr(SERIALIZED_LOG, "ptxas info    : (C7514)") - SERIALIZED_LOG);
  snprintf(log, sizeof log, "%.*sptxas info    : (C7510) Potential Performance Loss: "
           "wgmma.mma_async instructions are serialized due to wgmma pipeline crossing "
           "function boundary at a function call in the function '_Z6helperv'\n%s", pre,
           SERIALIZED_LOG, mid);
  assert_int_equal(mg_jit_report_parse(log, "other", &r), 1);
  assert_int_equal(r.wgmma_serialized, 7510);
  snprintf(log, sizeof log, "%.*sptxas info    : wgmma.mma_async instructions are serialized "
           "in the function 'other'\n%s", pre, SERIALIZED_LOG, mid);
  assert_int_equal(mg_jit_report_parse(log, "other", &r), 1);
  assert_int_equal(r.wgmma_serialized, 1);
  snprintf(log, sizeof log, "%.*sptxas info    : (C7520) wgmma.mma_async instructions are "
           "serialized\n%s", pre, SERIALIZED_LOG, mid); /* naming no function: every entry */
  assert_int_equal(mg_jit_report_parse(log, "other", &r), 1);
  assert_int_equal(r.wgmma_serialized, 7520);
  assert_int_equal(mg_jit_report_parse(SERIALIZED_LOG, "nope", &r), 0);
  assert_int_equal(r.wgmma_serialized, 0);
}

/* ---- the key ---------------------------------------------------------------------- */

static void key_of(const char *src, const char *kernel, const mg_jit_opts *o,
                   char key[MG_HASH_HEX]) {
  mg_cubin c;
  jit_ok(src, kernel, o, &c);
  memcpy(key, c.key, MG_HASH_HEX);
  mg_cubin_free(&c);
}

static void test_key_changes(void **s) {
  state *st = *s;
  enum { N = 8 };
  char keys[N][MG_HASH_HEX];
  static const char hdr1[] = "#define MG_TEST_VALUE 3.0f\n";
  static const char hdr2[] = "#define MG_TEST_VALUE 4.0f\n";
  mg_jit_header h1 = {"mg_test.cuh", hdr1, sizeof hdr1 - 1};
  mg_jit_header h2 = {"mg_test.cuh", hdr2, sizeof hdr2 - 1};
  const char *opt[] = {"-DMG_EXTRA=1"};

  mg_jit_opts base = opts_for(st->dir, "sm_80");
  base.no_cache = 1;
  base.headers = &h1;
  base.n_headers = 1;
  base.template_hash = "abc";
  key_of(HSRC, "h", &base, keys[0]);

  char twin[MG_HASH_HEX]; /* the same inputs give the same key */
  key_of(HSRC, "h", &base, twin);
  assert_string_equal(twin, keys[0]);

  char src2[sizeof HSRC + 32];
  snprintf(src2, sizeof src2, "%s// changed\n", HSRC);
  key_of(src2, "h", &base, keys[1]);

  mg_jit_opts o = base;
  o.arch = "sm_90a";
  key_of(HSRC, "h", &o, keys[2]);

  o = base;
  o.options = opt;
  o.n_options = 1;
  key_of(HSRC, "h", &o, keys[3]);

  o = base;
  o.headers = &h2;
  key_of(HSRC, "h", &o, keys[4]);

  o = base;
  o.template_hash = "abd";
  key_of(HSRC, "h", &o, keys[5]);

  key_of(HSRC, NULL, &base, keys[6]); /* the kernel the report is for */

  o = base;
  o.no_cache = 0; /* where the cache lives is not part of the key */
  key_of(HSRC, "h", &o, keys[7]);
  assert_string_equal(keys[7], keys[0]);

  for (int i = 0; i < N - 1; i++)
    for (int j = i + 1; j < N - 1; j++)
      if (!strcmp(keys[i], keys[j])) fail_msg("keys %d and %d are equal", i, j);
}

/* ---- corrupt entries ------------------------------------------------------------- */

typedef enum { FLIP_CUBIN, FLIP_META, TRUNCATE_HALF, GARBAGE, EMPTY } damage;

static void corrupt_case(state *st, damage how) {
  mg_jit_opts o = opts_for(st->dir, "sm_80");
  mg_cubin a, b, c;
  jit_ok(KSRC, "k", &o, &a);
  char path[256];
  entry_path(st->dir, a.key, path, sizeof path);
  char *f;
  size_t n;
  assert_int_equal(mg_fs_read(path, (size_t)1 << 28, &f, &n, NULL), 0);
  switch (how) {
    case FLIP_CUBIN: f[n - a.size / 2] ^= 0x01; break;
    case FLIP_META: f[n - a.size - 3] ^= 0x01; break; /* inside the meta text */
    case TRUNCATE_HALF: n /= 2; break;
    case GARBAGE:
      for (size_t i = 0; i < n; i++) f[i] = (char)(i * 131u + 7u);
      break;
    case EMPTY: n = 0; break;
  }
  assert_int_equal(mg_fs_write_atomic(path, f, n, NULL), 0);
  free(f);

  jit_ok(KSRC, "k", &o, &b);
  assert_int_equal(b.report.cache_hit, 0);
  assert_non_null(b.warning);
  assert_non_null(strstr(b.warning, "corrupt"));
  assert_non_null(strstr(b.warning, path));
  assert_non_null(b.log);
  assert_int_equal(b.size, a.size);
  assert_memory_equal(b.data, a.data, a.size);
  assert_report_equal(&b.report, &a.report, 0);

  jit_ok(KSRC, "k", &o, &c); /* the rewritten entry is valid */
  assert_int_equal(c.report.cache_hit, 1);
  assert_null(c.warning);
  assert_memory_equal(c.data, a.data, a.size);
  mg_cubin_free(&a);
  mg_cubin_free(&b);
  mg_cubin_free(&c);
}

static void test_corrupt_flip_cubin(void **s) { corrupt_case(*s, FLIP_CUBIN); }
static void test_corrupt_flip_meta(void **s) { corrupt_case(*s, FLIP_META); }
static void test_corrupt_truncated(void **s) { corrupt_case(*s, TRUNCATE_HALF); }
static void test_corrupt_garbage(void **s) { corrupt_case(*s, GARBAGE); }
static void test_corrupt_empty(void **s) { corrupt_case(*s, EMPTY); }

/* An intact entry of another kernel copied over this key's file is not loaded. */
static void test_swapped_entry(void **s) {
  state *st = *s;
  mg_jit_opts o = opts_for(st->dir, "sm_80"), o90 = opts_for(st->dir, "sm_90a");
  mg_cubin a, other, b;
  jit_ok(KSRC, "k", &o, &a);
  jit_ok(KSRC, "k", &o90, &other);
  char pa[256], po[256];
  entry_path(st->dir, a.key, pa, sizeof pa);
  entry_path(st->dir, other.key, po, sizeof po);
  char *f;
  size_t n;
  assert_int_equal(mg_fs_read(po, (size_t)1 << 28, &f, &n, NULL), 0);
  assert_int_equal(mg_fs_write_atomic(pa, f, n, NULL), 0);
  free(f);
  jit_ok(KSRC, "k", &o, &b);
  assert_int_equal(b.report.cache_hit, 0);
  assert_non_null(b.warning);
  assert_non_null(strstr(b.warning, "another key"));
  assert_int_equal(b.size, a.size);
  assert_memory_equal(b.data, a.data, a.size); /* the sm_80 cubin, not the sm_90a one */
  mg_cubin_free(&a);
  mg_cubin_free(&other);
  mg_cubin_free(&b);
}

/* ---- concurrency ------------------------------------------------------------------ */

/* Four processes compile the same kernel into the same empty cache at once. */
static void test_concurrent(void **s) {
  state *st = *s;
  enum { NPROC = 4 };
  mg_jit_opts o = opts_for(st->dir, "sm_90a");
  int pfd[2];
  assert_int_equal(pipe(pfd), 0);
  pid_t pid[NPROC];
  for (int i = 0; i < NPROC; i++) {
    pid[i] = fork();
    assert_true(pid[i] >= 0);
    if (pid[i] == 0) {
      close(pfd[1]);
      char ch;
      while (read(pfd[0], &ch, 1) < 0 && errno == EINTR) {
      } /* EOF: the parent closed the pipe, go */
      mg_cubin c;
      int rc = mg_jit_compile(KSRC, strlen(KSRC), "test.cu", "k", &o, &c, NULL);
      int ok = rc == 0 && c.size > 4 && memcmp(c.data, "\x7f" "ELF", 4) == 0 && !c.warning;
      mg_cubin_free(&c);
      _exit(ok ? 0 : 1);
    }
  }
  close(pfd[0]);
  close(pfd[1]);
  for (int i = 0; i < NPROC; i++) {
    int status = 0;
    assert_int_equal(waitpid(pid[i], &status, 0), pid[i]);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
  }
  int cubins, tmps, all;
  count_files(st->dir, &cubins, &tmps, &all);
  assert_int_equal(cubins, 1);
  assert_int_equal(tmps, 0);
  assert_int_equal(all, 1);
  mg_cubin c;
  jit_ok(KSRC, "k", &o, &c);
  assert_int_equal(c.report.cache_hit, 1);
  assert_null(c.warning);
  mg_cubin_free(&c);
}

/* ---- errors ------------------------------------------------------------------------ */

static void test_compile_error_line(void **s) {
  state *st = *s;
  static const char src[] =
      "#line 42 \"templates/broken.cu.tpl\"\n"
      "extern \"C\" __global__ void b(float *y) { y[0] = ; }\n";
  mg_jit_opts o = opts_for(st->dir, "sm_80");
  mg_cubin c;
  mg_diag d = MG_DIAG_INIT;
  int rc = mg_jit_compile(src, strlen(src), "gen_broken.cu", "b", &o, &c, &d);
  assert_int_equal(rc, MLAGEN_ECOMPILE);
  const char *m = mg_diag_msg(&d);
  assert_non_null(strstr(m, "NVRTC compile of gen_broken.cu for sm_80 failed:\n"));
  assert_non_null(strstr(m, "templates/broken.cu.tpl(42)"));
  assert_null(c.data);
  assert_null(c.log);
  mg_diag_clear(&d);
  int cubins, tmps, all;
  count_files(st->dir, &cubins, &tmps, &all);
  assert_int_equal(all, 0);
}

static void test_bad_arch(void **s) {
  state *st = *s;
  mg_cubin c;
  mg_diag d = MG_DIAG_INIT;
  mg_jit_opts o = opts_for(st->dir, "sm_12345");
  assert_int_equal(mg_jit_compile(KSRC, strlen(KSRC), "test.cu", "k", &o, &c, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "sm_12345"));
  assert_null(c.data);

  o.arch = "compute_80"; /* virtual: PTX only, no cubin */
  assert_int_equal(mg_jit_compile(KSRC, strlen(KSRC), "test.cu", "k", &o, &c, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "compute_80"));

  o.arch = NULL;
  assert_int_equal(mg_jit_compile(KSRC, strlen(KSRC), "test.cu", "k", &o, &c, &d), MLAGEN_EINVAL);

  const char *bad[] = {"--no-such-option"};
  o.arch = "sm_80";
  o.options = bad;
  o.n_options = 1;
  assert_int_equal(mg_jit_compile(KSRC, strlen(KSRC), "test.cu", "k", &o, &c, &d), MLAGEN_EINVAL);
  mg_diag_clear(&d);
}

static void test_unwritable_cache(void **s) {
  (void)s;
  mg_jit_opts o = opts_for("/proc/mlagen-nope", "sm_80");
  mg_cubin c;
  jit_ok(KSRC, "k", &o, &c);
  assert_int_equal(c.report.cache_hit, 0);
  assert_non_null(c.warning);
  assert_non_null(strstr(c.warning, "not cached"));
  mg_cubin_free(&c);
}

/* An existing entry that cannot be read (here: a directory in its place) is a warning,
 * and so is the failed write after the recompile. */
static void test_unreadable_entry(void **s) {
  state *st = *s;
  mg_jit_opts o = opts_for(st->dir, "sm_80");
  o.no_cache = 1;
  mg_cubin c;
  jit_ok(KSRC, "k", &o, &c);
  char path[256];
  entry_path(st->dir, c.key, path, sizeof path);
  mg_cubin_free(&c);
  assert_int_equal(mkdir(path, 0755), 0);
  o.no_cache = 0;
  jit_ok(KSRC, "k", &o, &c);
  assert_int_equal(c.report.cache_hit, 0);
  assert_non_null(c.warning);
  assert_non_null(strstr(c.warning, path));
  mg_cubin_free(&c);
}

static void test_no_cache(void **s) {
  state *st = *s;
  char sub[128];
  snprintf(sub, sizeof sub, "%s/not/made", st->dir);
  mg_jit_opts o = opts_for(st->dir, "sm_80");
  o.no_cache = 1;
  mg_cubin c;
  jit_ok(KSRC, "k", &o, &c);
  assert_null(c.warning);
  mg_cubin_free(&c);
  jit_ok(KSRC, "k", &o, &c);
  assert_int_equal(c.report.cache_hit, 0);
  mg_cubin_free(&c);
  o.cache_dir = sub;
  jit_ok(KSRC, "k", &o, &c);
  mg_cubin_free(&c);
  int cubins, tmps, all;
  count_files(st->dir, &cubins, &tmps, &all);
  assert_int_equal(all, 0);
}

/* A missing cache directory is created, parents included. */
static void test_mkdirs(void **s) {
  state *st = *s;
  char sub[128];
  snprintf(sub, sizeof sub, "%s/a/b/c", st->dir);
  mg_jit_opts o = opts_for(sub, "sm_80");
  mg_cubin c;
  jit_ok(KSRC, "k", &o, &c);
  assert_null(c.warning);
  char path[256];
  entry_path(sub, c.key, path, sizeof path);
  assert_true(mg_fs_is_file(path));
  mg_cubin_free(&c);
}

/* ---- the cache directory and version ------------------------------------------- */

static char *save_env(const char *name) {
  const char *v = getenv(name);
  return v ? strdup(v) : NULL;
}

static void restore_env(const char *name, char *v) {
  if (v) setenv(name, v, 1);
  else unsetenv(name);
  free(v);
}

static void test_cache_dir(void **s) {
  (void)s;
  char *cd = save_env("MLAGEN_CACHE_DIR"), *home = save_env("HOME");
  char buf[256];
  mg_diag d = MG_DIAG_INIT;
  mg_jit_opts o = opts_for("/x/explicit", "sm_80");

  assert_int_equal(mg_jit_cache_dir(&o, buf, sizeof buf, &d), 0);
  assert_string_equal(buf, "/x/explicit");
  setenv("MLAGEN_CACHE_DIR", "/x/env", 1);
  setenv("HOME", "/x/home", 1);
  o.cache_dir = NULL;
  assert_int_equal(mg_jit_cache_dir(&o, buf, sizeof buf, &d), 0);
  assert_string_equal(buf, "/x/env");
  assert_int_equal(mg_jit_cache_dir(NULL, buf, sizeof buf, &d), 0);
  assert_string_equal(buf, "/x/env");
  unsetenv("MLAGEN_CACHE_DIR");
  assert_int_equal(mg_jit_cache_dir(&o, buf, sizeof buf, &d), 0);
  assert_string_equal(buf, "/x/home/.cache/mlagen");
  assert_int_equal(mg_jit_cache_dir(&o, buf, 8, &d), MLAGEN_ELIMIT);
  unsetenv("HOME");
  assert_int_equal(mg_jit_cache_dir(&o, buf, sizeof buf, &d), MLAGEN_EIO);
  assert_non_null(strstr(mg_diag_msg(&d), "MLAGEN_CACHE_DIR"));

  mg_diag_clear(&d);
  restore_env("MLAGEN_CACHE_DIR", cd);
  restore_env("HOME", home);
}

/* With CUDA_HOME pointing at a toolkit without headers, the fallbacks still find them. */
static void test_cuda_home_fallback(void **s) {
  state *st = *s;
  char *ch = save_env("CUDA_HOME");
  setenv("CUDA_HOME", st->dir, 1);
  mg_jit_opts o = opts_for(st->dir, "sm_80");
  o.no_cache = 1;
  mg_cubin c;
  jit_ok(KSRC, "k", &o, &c);
  mg_cubin_free(&c);
  restore_env("CUDA_HOME", ch);
}

static void test_nvrtc_version(void **s) {
  (void)s;
  int ma = -1, mi = -1;
  mg_jit_nvrtc_version(&ma, &mi);
  assert_true(ma >= 11);
  assert_true(mi >= 0);
  mg_jit_nvrtc_version(NULL, NULL);
  mg_cubin_free(NULL);
}

int main(void) {
  const char *filter = getenv("MLAGEN_TEST_FILTER"); /* a cmocka pattern: run a subset */
  if (filter && *filter) cmocka_set_test_filter(filter);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fast_include_policy),
      cmocka_unit_test(test_fast_entry_roundtrip),
      cmocka_unit_test(test_fast_report_serialized),
      cmocka_unit_test_setup_teardown(test_sm80, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sm90a, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sm90a_serialized, setup, teardown),
      cmocka_unit_test_setup_teardown(test_kernel_select, setup, teardown),
      cmocka_unit_test_setup_teardown(test_headers, setup, teardown),
      cmocka_unit_test_setup_teardown(test_key_changes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_corrupt_flip_cubin, setup, teardown),
      cmocka_unit_test_setup_teardown(test_corrupt_flip_meta, setup, teardown),
      cmocka_unit_test_setup_teardown(test_corrupt_truncated, setup, teardown),
      cmocka_unit_test_setup_teardown(test_corrupt_garbage, setup, teardown),
      cmocka_unit_test_setup_teardown(test_corrupt_empty, setup, teardown),
      cmocka_unit_test_setup_teardown(test_swapped_entry, setup, teardown),
      cmocka_unit_test_setup_teardown(test_concurrent, setup, teardown),
      cmocka_unit_test_setup_teardown(test_compile_error_line, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_arch, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unwritable_cache, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unreadable_entry, setup, teardown),
      cmocka_unit_test_setup_teardown(test_no_cache, setup, teardown),
      cmocka_unit_test_setup_teardown(test_mkdirs, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cache_dir, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cuda_home_fallback, setup, teardown),
      cmocka_unit_test_setup_teardown(test_nvrtc_version, setup, teardown),
  };
  return cmocka_run_group_tests_name("jit", tests, NULL, NULL);
}
