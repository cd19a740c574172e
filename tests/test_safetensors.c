/* test_safetensors.c: safetensors files in and out.
 *
 * Reading is checked against files made by the official safetensors library
 * (tests/data/safetensors/make_fixtures.py, committed outputs): values come from a
 * formula the test recomputes, rounded here with mg_f32_to_bf16/f16 (numpy and
 * ml_dtypes rounded them there), and edge values (f16 subnormals, inf, NaN, ties) are
 * hard-coded bit patterns. Every malformed-file case is crafted byte by byte. Writing
 * round-trips fresh random data (the seed is printed; MLAGEN_TEST_SEED overrides it). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "mg_diag.h"
#include "mg_fs.h"
#include "mg_safetensors.h"
#include "mlagen.h"

#define FIXTURE MLAGEN_TEST_DATA "/safetensors/dtypes.safetensors"
#define NO_TENSORS MLAGEN_TEST_DATA "/safetensors/no_tensors.safetensors"

static char g_dir[64]; /* scratch directory, emptied and removed at the end */
static uint64_t g_rng;

static uint64_t rnd(void) { /* xorshift64* */
  g_rng ^= g_rng >> 12;
  g_rng ^= g_rng << 25;
  g_rng ^= g_rng >> 27;
  return g_rng * 2685821657736338717ull;
}
/* A random float in (-scale, scale), never zero. */
static float rnd_float(float scale) {
  float x = (float)((double)(rnd() >> 11) / 9007199254740992.0 * 2.0 - 1.0) * scale;
  return x == 0 ? scale / 3 : x;
}

static uint32_t fbits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}
static uint64_t dbits(double x) {
  uint64_t u;
  memcpy(&u, &x, 8);
  return u;
}

/* The fixture formula (see make_fixtures.py): element i of a tensor with this base. */
static float formula(int64_t i, double scale) {
  return (float)((double)((i * 37) % 101 - 50) / 7.0 * scale);
}

static void expect_msg(const mg_diag *d, const char *sub) {
  const char *m = mg_diag_msg(d);
  if (!strstr(m, sub)) fail_msg("message \"%s\" lacks \"%s\"", m, sub);
  if (strchr(m, '\n')) fail_msg("message \"%s\" is not one line", m);
}

static void path_in_dir(char *out, size_t n, const char *name) {
  snprintf(out, n, "%s/%s", g_dir, name);
}

/* Writes raw bytes to g_dir/name. */
static void write_raw(const char *name, const void *bytes, size_t len, char *path, size_t n) {
  path_in_dir(path, n, name);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  if (len) assert_int_equal(fwrite(bytes, 1, len, f), len);
  assert_int_equal(fclose(f), 0);
}

/* Writes g_dir/name: u64 N = hlen, the header, then data_len bytes of 0x5a. */
static void write_st(const char *name, const char *header, size_t hlen, size_t data_len,
                     char *path, size_t n) {
  size_t len = 8 + hlen + data_len;
  unsigned char *b = malloc(len);
  assert_non_null(b);
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
  memcpy(b + 8, header, hlen);
  memset(b + 8 + hlen, 0x5a, data_len);
  write_raw(name, b, len, path, n);
  free(b);
}

/* Opens path expecting status with a one-line message naming the file and holding
 * each of subs (NULL-terminated). */
static void expect_open_fails(const char *path, int status, const char *const *subs) {
  mg_diag d = MG_DIAG_INIT;
  mg_st_file *f = (mg_st_file *)(uintptr_t)1;
  int rc = mg_st_open(path, &f, &d);
  if (rc != status)
    fail_msg("%s: status %d (%s), expected %d", path, rc, mg_diag_msg(&d), status);
  assert_null(f);
  expect_msg(&d, path);
  for (; *subs; subs++) expect_msg(&d, *subs);
  mg_diag_clear(&d);
}

static mg_st_file *open_ok(const char *path) {
  mg_diag d = MG_DIAG_INIT;
  mg_st_file *f = NULL;
  int rc = mg_st_open(path, &f, &d);
  if (rc != 0) fail_msg("%s: %s", path, mg_diag_msg(&d));
  assert_non_null(f);
  return f;
}

/* ---- fixtures written by the official library --------------------------------------- */

static void test_fixture_listing(void **state) {
  (void)state;
  mg_st_file *f = open_ok(FIXTURE);
  assert_string_equal(mg_st_path(f), FIXTURE);
  assert_int_equal(mg_st_count(f), 10);
  size_t end = 0;
  for (int i = 0; i < mg_st_count(f); i++) { /* data-offset order, tiling the data */
    const mg_st_tensor *t = mg_st_at(f, i);
    assert_int_equal(t->offset, end);
    assert_int_equal(t->nbytes % mg_dtype_size(t->dtype), 0);
    end = t->offset + t->nbytes;
    assert_ptr_equal(mg_st_find(f, t->name), t);
  }
  assert_null(mg_st_at(f, -1));
  assert_null(mg_st_at(f, mg_st_count(f)));
  assert_null(mg_st_find(f, "nope"));
  assert_null(mg_st_find(f, "__metadata__"));

  static const struct { const char *name; mg_dtype t; int ndim; int64_t shape[4]; } want[] = {
      {"x_bf16", MG_BF16, 2, {4, 6}},         {"x_f16", MG_F16, 2, {4, 6}},
      {"x_f32", MG_F32, 4, {2, 6, 3, 4}},     {"x_f64", MG_F64, 2, {3, 5}},
      {"x_bf16_rows", MG_BF16, 3, {2, 6, 3}}, {"f16_special", MG_F16, 1, {22}},
      {"bf16_special", MG_BF16, 1, {12}},     {"scalar", MG_F32, 0, {0}},
      {"empty", MG_F16, 2, {3, 0}},           {"layer.0/n\xc3\xa4me", MG_F32, 1, {2}},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    const mg_st_tensor *t = mg_st_find(f, want[i].name);
    if (!t) fail_msg("no tensor %s", want[i].name);
    assert_string_equal(t->name, want[i].name);
    assert_int_equal(t->dtype, want[i].t);
    assert_int_equal(t->ndim, want[i].ndim);
    size_t numel = 1;
    for (int k = 0; k < t->ndim; k++) {
      assert_int_equal(t->shape[k], want[i].shape[k]);
      numel *= (size_t)t->shape[k];
    }
    assert_int_equal(t->nbytes, numel * mg_dtype_size(t->dtype));
  }
  assert_int_equal(mg_st_find(f, "empty")->nbytes, 0);
  assert_string_equal(mg_st_meta(f, "format"), "np");
  assert_string_equal(mg_st_meta(f, "producer"), "mlagen make_fixtures.py");
  assert_null(mg_st_meta(f, "nope"));
  float two[2];
  assert_int_equal(mg_st_read_f32(f, "layer.0/n\xc3\xa4me", 1, (int64_t[]){2}, two, NULL), 0);
  assert_true(two[0] == 1.0f && two[1] == -1.0f);
  mg_st_close(f);

  f = open_ok(NO_TENSORS);
  assert_int_equal(mg_st_count(f), 0);
  assert_string_equal(mg_st_meta(f, "note"), "empty");
  mg_st_close(f);
  mg_st_close(NULL);
}

/* name holds formula(base + i) * scale rounded to its 16-bit dtype. */
static void check_half_formula(const mg_st_file *f, const char *name, mg_dtype t, int ndim,
                               const int64_t *shape, int64_t base, double scale) {
  size_t n = 1;
  for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
  float *x = malloc(n * sizeof *x);
  double *y = malloc(n * sizeof *y);
  mg_diag d = MG_DIAG_INIT;
  if (mg_st_read_f32(f, name, ndim, shape, x, &d) != 0) fail_msg("%s", mg_diag_msg(&d));
  assert_int_equal(mg_st_read_f64(f, name, ndim, shape, y, NULL), 0);
  const unsigned char *raw = mg_st_data(f, mg_st_find(f, name));
  int nonzero = 0;
  for (size_t i = 0; i < n; i++) {
    float v = formula(base + (int64_t)i, scale);
    uint16_t h = t == MG_BF16 ? mg_f32_to_bf16(v) : mg_f32_to_f16(v);
    float want = t == MG_BF16 ? mg_bf16_to_f32(h) : mg_f16_to_f32(h);
    uint16_t file_bits = (uint16_t)(raw[2 * i] | raw[2 * i + 1] << 8);
    if (file_bits != h) fail_msg("%s[%zu]: file has %#06x, rounding %a gives %#06x", name, i, file_bits, (double)v, h);
    if (fbits(x[i]) != fbits(want)) fail_msg("%s[%zu]: read %a, want %a", name, i, (double)x[i], (double)want);
    assert_true(dbits(y[i]) == dbits((double)want));
    /* independent of the conversions: within half an ulp of the formula */
    double rel = t == MG_BF16 ? 0x1p-8 : 0x1p-11;
    assert_true(fabs((double)x[i] - (double)v) <= fabs((double)v) * rel);
    nonzero += x[i] != 0;
  }
  assert_true(nonzero > (int)n / 2);
  free(x);
  free(y);
}

static void test_fixture_bf16_f16(void **state) {
  (void)state;
  mg_st_file *f = open_ok(FIXTURE);
  check_half_formula(f, "x_bf16", MG_BF16, 2, (int64_t[]){4, 6}, 0, 1.0);
  check_half_formula(f, "x_f16", MG_F16, 2, (int64_t[]){4, 6}, 100, 1000.0);
  check_half_formula(f, "x_bf16_rows", MG_BF16, 3, (int64_t[]){2, 6, 3}, 400, 1.0);
  mg_st_close(f);
}

static void test_fixture_f32_f64(void **state) {
  (void)state;
  mg_st_file *f = open_ok(FIXTURE);
  float x[144];
  double y[144];
  int64_t s4[] = {2, 6, 3, 4};
  assert_int_equal(mg_st_read_f32(f, "x_f32", 4, s4, x, NULL), 0);
  assert_int_equal(mg_st_read_f64(f, "x_f32", 4, s4, y, NULL), 0);
  for (int i = 0; i < 144; i++) {
    float want = formula(200 + i, 1.0);
    assert_true(fbits(x[i]) == fbits(want));
    assert_true(dbits(y[i]) == dbits((double)want));
  }
  int64_t s2[] = {3, 5};
  assert_int_equal(mg_st_read_f64(f, "x_f64", 2, s2, y, NULL), 0);
  assert_int_equal(mg_st_read_f32(f, "x_f64", 2, s2, x, NULL), 0);
  for (int i = 0; i < 15; i++) {
    double want = (double)formula(300 + i, 1.0) / 3.0;
    assert_true(dbits(y[i]) == dbits(want));
    assert_true(fbits(x[i]) == fbits((float)want)); /* rounded to nearest */
  }
  mg_st_close(f);
}

static void test_fixture_specials(void **state) {
  (void)state;
  /* Inputs and the float16 bits numpy gave them (make_fixtures.py asserts the same). */
  static const float f16_in[22] = {
      0x1p-24f, -0x1p-24f, 0x3p-24f, 0x3ffp-24f, 0x1p-14f, 65504.0f, 65519.0f, 65520.0f,
      INFINITY, -INFINITY, NAN, -0.0f, 0x1p-25f, 0x3p-26f, 0x3p-25f, 0x5p-25f,
      1.0f / 3.0f, 1e-7f, -1e-5f, 1.0f + 0x1p-10f, 1.0f + 0x1p-11f, 1.0f + 0x3p-11f};
  static const uint16_t f16_bits[22] = {
      0x0001, 0x8001, 0x0003, 0x03FF, 0x0400, 0x7BFF, 0x7BFF, 0x7C00, 0x7C00, 0xFC00, 0x7E00,
      0x8000, 0x0000, 0x0001, 0x0002, 0x0002, 0x3555, 0x0002, 0x80A8, 0x3C01, 0x3C00, 0x3C02};
  static const float f16_val[22] = {
      0x1p-24f, -0x1p-24f, 0x3p-24f, 0x3ffp-24f, 0x1p-14f, 65504.0f, 65504.0f, INFINITY,
      INFINITY, -INFINITY, NAN, -0.0f, 0.0f, 0x1p-24f, 0x2p-24f, 0x2p-24f,
      0x1.554p-2f, 0x2p-24f, -0xa8p-24f, 1.0f + 0x1p-10f, 1.0f, 1.0f + 0x2p-10f};
  static const float bf16_in[12] = {1.0f, -2.5f, 1.0f + 0x1p-8f, 1.0f + 0x3p-8f, 3.4028234663852886e38f,
                                    INFINITY, -INFINITY, NAN, -0.0f, 1e-40f, 0x1p-126f, 0.1f};
  static const uint16_t bf16_bits[12] = {0x3F80, 0xC020, 0x3F80, 0x3F82, 0x7F80, 0x7F80,
                                         0xFF80, 0x7FC0, 0x8000, 0x0001, 0x0080, 0x3DCD};
  static const float bf16_val[12] = {1.0f, -2.5f, 1.0f, 1.0f + 0x1p-6f, INFINITY, INFINITY,
                                     -INFINITY, NAN, -0.0f, 0x1p-133f, 0x1p-126f, 0x1.9ap-4f};

  mg_st_file *f = open_ok(FIXTURE);
  float x[22];
  assert_int_equal(mg_st_read_f32(f, "f16_special", 1, (int64_t[]){22}, x, NULL), 0);
  const unsigned char *raw = mg_st_data(f, mg_st_find(f, "f16_special"));
  for (int i = 0; i < 22; i++) {
    uint16_t h = (uint16_t)(raw[2 * i] | raw[2 * i + 1] << 8);
    uint16_t mine = mg_f32_to_f16(f16_in[i]);
    if (isnan(f16_val[i])) {
      assert_true(isnan(x[i]) && isnan(mg_f16_to_f32(h)));
      assert_true((h & 0x7c00) == 0x7c00 && (h & 0x3ff) && (mine & 0x7c00) == 0x7c00 && (mine & 0x3ff));
      continue;
    }
    if (h != f16_bits[i]) fail_msg("f16_special[%d]: file %#06x, want %#06x", i, h, f16_bits[i]);
    if (mine != f16_bits[i]) fail_msg("f32_to_f16(%a) = %#06x, want %#06x", (double)f16_in[i], mine, f16_bits[i]);
    if (fbits(x[i]) != fbits(f16_val[i])) fail_msg("f16_special[%d] read %a, want %a", i, (double)x[i], (double)f16_val[i]);
    assert_true(fbits(mg_f16_to_f32(f16_bits[i])) == fbits(f16_val[i]));
  }
  assert_int_equal(mg_st_read_f32(f, "bf16_special", 1, (int64_t[]){12}, x, NULL), 0);
  raw = mg_st_data(f, mg_st_find(f, "bf16_special"));
  for (int i = 0; i < 12; i++) {
    uint16_t h = (uint16_t)(raw[2 * i] | raw[2 * i + 1] << 8);
    uint16_t mine = mg_f32_to_bf16(bf16_in[i]);
    if (isnan(bf16_val[i])) {
      assert_true(isnan(x[i]) && (mine & 0x7f80) == 0x7f80 && (mine & 0x7f));
      continue;
    }
    if (h != bf16_bits[i]) fail_msg("bf16_special[%d]: file %#06x, want %#06x", i, h, bf16_bits[i]);
    if (mine != bf16_bits[i]) fail_msg("f32_to_bf16(%a) = %#06x, want %#06x", (double)bf16_in[i], mine, bf16_bits[i]);
    if (fbits(x[i]) != fbits(bf16_val[i])) fail_msg("bf16_special[%d] read %a, want %a", i, (double)x[i], (double)bf16_val[i]);
  }
  mg_st_close(f);
}

static void test_fixture_scalar_and_empty(void **state) {
  (void)state;
  mg_st_file *f = open_ok(FIXTURE);
  float s = 0;
  double sd = 0;
  assert_int_equal(mg_st_read_f32(f, "scalar", 0, NULL, &s, NULL), 0);
  assert_int_equal(mg_st_read_f64(f, "scalar", 0, NULL, &sd, NULL), 0);
  assert_true(s == 2.5f && sd == 2.5);
  assert_int_equal(mg_st_read_f32(f, "empty", 2, (int64_t[]){3, 0}, NULL, NULL), 0);
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(mg_st_read_f32(f, "scalar", 1, (int64_t[]){1}, &s, &d), MLAGEN_EINVAL);
  expect_msg(&d, "'scalar' has shape [], expected [1]");
  assert_int_equal(mg_st_read_f32(f, "scalar", 0, NULL, NULL, &d), MLAGEN_EINVAL);
  expect_msg(&d, "NULL");
  mg_diag_clear(&d);
  mg_st_close(f);
}

static void test_read_rows(void **state) {
  (void)state;
  mg_st_file *f = open_ok(FIXTURE);
  int64_t s[] = {2, 6, 3, 4};
  float full[144], part[144];
  double partd[144];
  assert_int_equal(mg_st_read_f32(f, "x_f32", 4, s, full, NULL), 0);
  /* every dim, several windows, compared with indexing the full tensor */
  for (int dim = 0; dim < 4; dim++)
    for (int64_t start = 0; start <= s[dim]; start++)
      for (int64_t count = 0; start + count <= s[dim]; count++) {
        memset(part, 0xff, sizeof part);
        mg_diag d = MG_DIAG_INIT;
        if (mg_st_read_f32_rows(f, "x_f32", 4, s, dim, start, count, part, &d) != 0)
          fail_msg("%s", mg_diag_msg(&d));
        assert_int_equal(mg_st_read_f64_rows(f, "x_f32", 4, s, dim, start, count, partd, NULL), 0);
        int64_t o[4] = {s[0], s[1], s[2], s[3]};
        o[dim] = count;
        size_t k = 0;
        for (int64_t a = 0; a < o[0]; a++)
          for (int64_t b = 0; b < o[1]; b++)
            for (int64_t c = 0; c < o[2]; c++)
              for (int64_t e = 0; e < o[3]; e++, k++) {
                int64_t idx[4] = {a, b, c, e};
                idx[dim] += start;
                float want = full[((idx[0] * 6 + idx[1]) * 3 + idx[2]) * 4 + idx[3]];
                assert_true(fbits(part[k]) == fbits(want));
                assert_true(partd[k] == (double)want);
              }
        if (k < 144) assert_true(fbits(part[k]) == 0xffffffffu); /* nothing written past */
      }
  /* a sequence shard of a bf16 [B, S, D] tensor: rank 1 of 3 takes S[2, 4) */
  float b[36], shard[12];
  assert_int_equal(mg_st_read_f32(f, "x_bf16_rows", 3, (int64_t[]){2, 6, 3}, b, NULL), 0);
  assert_int_equal(mg_st_read_f32_rows(f, "x_bf16_rows", 3, (int64_t[]){2, 6, 3}, 1, 2, 2, shard, NULL), 0);
  for (int bb = 0; bb < 2; bb++)
    for (int ss = 0; ss < 2; ss++)
      for (int dd = 0; dd < 3; dd++)
        assert_true(fbits(shard[(bb * 2 + ss) * 3 + dd]) == fbits(b[(bb * 6 + 2 + ss) * 3 + dd]));

  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(mg_st_read_f32_rows(f, "x_f32", 4, s, 1, 4, 3, part, &d), MLAGEN_EINVAL);
  expect_msg(&d, "'x_f32'");
  expect_msg(&d, "start 4 count 3");
  assert_int_equal(mg_st_read_f32_rows(f, "x_f32", 4, s, 1, -1, 1, part, &d), MLAGEN_EINVAL);
  assert_int_equal(mg_st_read_f32_rows(f, "x_f32", 4, s, 1, 0, -1, part, &d), MLAGEN_EINVAL);
  assert_int_equal(mg_st_read_f32_rows(f, "x_f32", 4, s, 1, 1, INT64_MAX, part, &d), MLAGEN_EINVAL);
  assert_int_equal(mg_st_read_f32_rows(f, "x_f32", 4, s, 4, 0, 1, part, &d), MLAGEN_EINVAL);
  expect_msg(&d, "slice dim 4");
  assert_int_equal(mg_st_read_f32_rows(f, "x_f32", 4, s, -1, 0, 1, part, &d), MLAGEN_EINVAL);
  assert_int_equal(mg_st_read_f32_rows(f, "x_f32", 4, (int64_t[]){2, 3, 6, 4}, 1, 0, 1, part, &d),
                   MLAGEN_EINVAL);
  expect_msg(&d, "has shape [2, 6, 3, 4], expected [2, 3, 6, 4]");
  assert_int_equal(mg_st_read_f32_rows(f, "scalar", 0, NULL, 0, 0, 1, part, &d), MLAGEN_EINVAL);
  mg_diag_clear(&d);
  mg_st_close(f);
}

static void test_shape_mismatch_and_missing(void **state) {
  (void)state;
  mg_st_file *f = open_ok(FIXTURE);
  float x[144];
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(mg_st_read_f32(f, "x_f32", 4, (int64_t[]){2, 6, 4, 3}, x, &d), MLAGEN_EINVAL);
  expect_msg(&d, FIXTURE);
  expect_msg(&d, "tensor 'x_f32' has shape [2, 6, 3, 4], expected [2, 6, 4, 3]");
  assert_int_equal(mg_st_read_f64(f, "x_f32", 2, (int64_t[]){12, 12}, (double[144]){0}, &d),
                   MLAGEN_EINVAL);
  expect_msg(&d, "expected [12, 12]");
  assert_int_equal(mg_st_read_f32(f, "q_proj", 1, (int64_t[]){4}, x, &d), MLAGEN_EINVAL);
  expect_msg(&d, FIXTURE);
  expect_msg(&d, "no tensor named 'q_proj'");
  assert_int_equal(mg_st_read_f32_rows(f, "kv", 1, (int64_t[]){4}, 0, 0, 1, x, &d), MLAGEN_EINVAL);
  expect_msg(&d, "'kv'");
  assert_int_equal(mg_st_read_f32(f, "x_f32", 9, (int64_t[9]){0}, x, &d), MLAGEN_EINVAL);
  expect_msg(&d, "9 dims");
  mg_diag_clear(&d);
  mg_st_close(f);
}

/* ---- malformed files ---------------------------------------------------------------- */

#define T1(dtype, shape, b, e) "{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

static void test_malformed_headers(void **state) {
  (void)state;
  static const struct {
    const char *header;
    size_t data_len;
    const char *sub[3];
  } cases[] = {
      {"", 0, {"not valid JSON"}},
      {"{\"a\": ", 0, {"not valid JSON"}},
      {"[1, 2]", 0, {"not a JSON object"}},
      {"{} x", 0, {"text after the JSON object"}},
      {"{\"t\": 5}", 0, {"tensor 't'", "not a JSON object"}},
      {"{\"t\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", 4, {"tensor 't'", "missing \"dtype\""}},
      {"{\"t\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", 4, {"tensor 't'", "missing \"shape\""}},
      {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1]}}", 4, {"tensor 't'", "missing \"data_offsets\""}},
      {"{\"t\": {\"dtype\": 5, \"shape\": [1], \"data_offsets\": [0, 4]}}", 4, {"'t'", "\"dtype\" is not a string"}},
      {"{\"t\": {\"dtype\": \"F32\", \"shape\": \"x\", \"data_offsets\": [0, 4]}}", 4, {"'t'", "\"shape\" is not an array"}},
      {"{\"t\": {\"dtype\": \"F32\", \"shape\": {}, \"data_offsets\": [0, 4]}}", 4, {"'t'", "\"shape\" is not an array"}},
      {"{\"t\":" T1("F32", "[1, \"a\"]", 0, 4) "}", 4, {"'t'", "dim 1 is not a number"}},
      {"{\"t\":" T1("F32", "[-1]", 0, 4) "}", 4, {"'t'", "dim 0 (-1) is not a non-negative integer"}},
      {"{\"t\":" T1("F32", "[1.5]", 0, 4) "}", 4, {"'t'", "dim 0 (1.5) is not a non-negative integer"}},
      {"{\"t\":" T1("F32", "[1e300]", 0, 4) "}", 4, {"'t'", "not a non-negative integer"}},
      {"{\"t\":" T1("F32", "[1,1,1,1,1,1,1,1,1]", 0, 4) "}", 4, {"'t'", "9 dims, more than the 8"}},
      {"{\"t\":" T1("F32", "[4294967296, 4294967296, 4]", 0, 4) "}", 4, {"'t'", "overflows"}},
      {"{\"t\":" T1("U8", "[1]", 0, 1) "}", 1, {"'t'", "U8 is not supported: expected BF16, F16, F32, F64, I32 or I64"}},
      {"{\"t\":" T1("I32", "[3]", 0, 8) "}", 8, {"'t'", "hold 8 bytes, but I32 shape [3] needs 12"}},
      {"{\"t\":" T1("f32", "[1]", 0, 4) "}", 4, {"'t'", "f32 is not supported"}},
      {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}}", 4, {"'t'", "\"data_offsets\" is not an array of two"}},
      {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": \"0,4\"}}", 4, {"'t'", "\"data_offsets\" is not an array of two"}},
      {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4, 8]}}", 8, {"'t'", "\"data_offsets\" is not an array of two"}},
      {"{\"t\":" T1("F32", "[1]", 0, -4) "}", 4, {"'t'", "\"data_offsets\" is not an array of two"}},
      {"{\"t\":" T1("F32", "[1]", 0, 4.5) "}", 4, {"'t'", "\"data_offsets\" is not an array of two"}},
      {"{\"t\":" T1("F32", "[0]", 4, 0) "}", 4, {"'t'", "[4, 0] begin after they end"}},
      {"{\"t\":" T1("F32", "[2]", 0, 8) "}", 4, {"'t'", "run past the end of the 4-byte data section"}},
      {"{\"t\":" T1("F32", "[2]", 0, 4) "}", 4, {"'t'", "hold 4 bytes, but F32 shape [2] needs 8"}},
      {"{\"t\":" T1("BF16", "[2, 3]", 0, 24) "}", 24, {"'t'", "hold 24 bytes, but BF16 shape [2, 3] needs 12"}},
      {"{\"a\":" T1("F32", "[2]", 0, 8) ",\"b\":" T1("F32", "[2]", 4, 12) "}", 12,
       {"tensors 'a' [0, 8) and 'b' [4, 12) overlap"}},
      {"{\"a\":" T1("F32", "[2]", 0, 8) ",\"b\":" T1("F32", "[2]", 0, 8) "}", 8, {"overlap"}},
      {"{\"a\":" T1("F32", "[2]", 0, 8) ",\"z\":" T1("F32", "[0]", 4, 4) "}", 8, {"overlap"}},
      {"{\"a\":" T1("F32", "[1]", 0, 4) ",\"b\":" T1("F32", "[1]", 8, 12) "}", 12,
       {"bytes [4, 8) belong to no tensor", "before 'b'"}},
      {"{\"a\":" T1("F32", "[1]", 4, 8) "}", 8, {"bytes [0, 4) belong to no tensor"}},
      {"{\"a\":" T1("F32", "[1]", 0, 4) "}", 8, {"bytes [4, 8) belong to no tensor", "trailing"}},
      {"{}", 4, {"bytes [0, 4) belong to no tensor"}},
      {"{\"a\":" T1("F32", "[1]", 0, 4) ",\"a\":" T1("F32", "[1]", 4, 8) "}", 8, {"tensor 'a' appears twice"}},
      {"{\"__metadata__\": [\"x\"]}", 0, {"\"__metadata__\" is not a JSON object"}},
      {"{\"__metadata__\": {\"k\": 1}}", 0, {"\"__metadata__\" entry 'k' is not a string"}},
      {"{\"__metadata__\": {}, \"__metadata__\": {}}", 0, {"\"__metadata__\" appears twice"}},
      {"{\"t\xff\":" T1("F32", "[1]", 0, 4) "}", 4, {"not valid UTF-8 (at header byte 3)"}},
      {"{\"t\xc0\x80\":" T1("F32", "[1]", 0, 4) "}", 4, {"not valid UTF-8"}},      /* overlong */
      {"{\"t\xed\xa0\x80\":" T1("F32", "[1]", 0, 4) "}", 4, {"not valid UTF-8"}},  /* surrogate */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char name[32], path[128];
    snprintf(name, sizeof name, "bad%02zu.safetensors", i);
    write_st(name, cases[i].header, strlen(cases[i].header), cases[i].data_len, path, sizeof path);
    const char *subs[4] = {cases[i].sub[0], cases[i].sub[1], cases[i].sub[2], NULL};
    expect_open_fails(path, MLAGEN_EINVAL, subs);
    unlink(path);
  }

  /* a name of 256 bytes is refused, of 255 accepted */
  char longname[300], hdr[600], path[128];
  memset(longname, 'n', 256);
  longname[256] = 0;
  snprintf(hdr, sizeof hdr, "{\"%s\":" T1("F32", "[1]", 0, 4) "}", longname);
  write_st("long.safetensors", hdr, strlen(hdr), 4, path, sizeof path);
  expect_open_fails(path, MLAGEN_EINVAL, (const char *[]){"256 bytes, over the limit of 255", NULL});
  longname[255] = 0;
  snprintf(hdr, sizeof hdr, "{\"%s\":" T1("F32", "[1]", 0, 4) "}", longname);
  write_st("long.safetensors", hdr, strlen(hdr), 4, path, sizeof path);
  mg_st_file *f = open_ok(path);
  assert_non_null(mg_st_find(f, longname));
  mg_st_close(f);
  unlink(path);

  /* a control character in a name does not break the one-line message */
  const char *ctl = "{\"a\\nb\":" T1("I8", "[1]", 0, 1) "}";
  write_st("ctl.safetensors", ctl, strlen(ctl), 1, path, sizeof path);
  expect_open_fails(path, MLAGEN_EINVAL, (const char *[]){"'a?b'", "I8 is not supported", NULL});
  unlink(path);
}

/* I32 and I64 tensors (cu_seqlens): read as int64_t, sign-extended, extremes exact; the
 * float readers refuse them and mg_st_read_i64 refuses float tensors. */
static void test_integer_tensors(void **state) {
  (void)state;
  const char *hdr = "{\"a\":" T1("I32", "[3]", 0, 12) ",\"b\":" T1("I64", "[2]", 16, 32) ",\"f\":"
                    T1("F32", "[1]", 12, 16) "}";
  size_t n = strlen(hdr);
  unsigned char buf[256] = {0};
  buf[0] = (unsigned char)n;
  memcpy(buf + 8, hdr, n);
  unsigned char *data = buf + 8 + n;
  const int32_t a[3] = {0, -7, INT32_MAX};
  const int64_t b[2] = {INT64_MIN, (int64_t)1 << 40};
  const float one = 1.0f;
  memcpy(data, a, 12), memcpy(data + 12, &one, 4), memcpy(data + 16, b, 16); /* little-endian host */
  mg_diag d = MG_DIAG_INIT;
  mg_st_file *f = NULL;
  if (mg_st_open_mem(buf, 8 + n + 32, "ints", &f, &d)) fail_msg("%s", mg_diag_msg(&d));
  assert_int_equal(mg_st_find(f, "a")->int_bytes, 4);
  assert_int_equal(mg_st_find(f, "b")->int_bytes, 8);
  assert_int_equal(mg_st_find(f, "f")->int_bytes, 0);
  int64_t got[3] = {1, 1, 1};
  assert_int_equal(mg_st_read_i64(f, "a", 1, (int64_t[]){3}, got, &d), 0);
  assert_true(got[0] == 0 && got[1] == -7 && got[2] == INT32_MAX);
  assert_int_equal(mg_st_read_i64(f, "b", 1, (int64_t[]){2}, got, &d), 0);
  assert_true(got[0] == INT64_MIN && got[1] == (int64_t)1 << 40);
  assert_int_equal(mg_st_read_i64(f, "f", 1, (int64_t[]){1}, got, &d), MLAGEN_EINVAL);
  expect_msg(&d, "tensor 'f' is F32: expected an integer tensor (I32 or I64)");
  assert_int_equal(mg_st_read_i64(f, "a", 1, (int64_t[]){4}, got, &d), MLAGEN_EINVAL);
  expect_msg(&d, "tensor 'a' has shape [3], expected [4]");
  float x[3];
  assert_int_equal(mg_st_read_f32(f, "b", 1, (int64_t[]){2}, x, &d), MLAGEN_EINVAL);
  expect_msg(&d, "tensor 'b' is I64: expected a float tensor");
  assert_int_equal(mg_st_read_f32_rows(f, "a", 1, (int64_t[]){3}, 0, 0, 1, x, &d), MLAGEN_EINVAL);
  expect_msg(&d, "tensor 'a' is I32");
  mg_diag_clear(&d);
  mg_st_close(f);
}

static void test_malformed_files(void **state) {
  (void)state;
  char path[128];
  write_raw("short.safetensors", "\x10\0\0\0\0", 5, path, sizeof path);
  expect_open_fails(path, MLAGEN_EINVAL, (const char *[]){"5 bytes, shorter than the 8-byte", NULL});
  write_raw("empty.safetensors", "", 0, path, sizeof path);
  expect_open_fails(path, MLAGEN_EINVAL, (const char *[]){"0 bytes, shorter", NULL});

  unsigned char b[16] = {0, 0, 0, 0, 0, 0, 0, 0x80, '{', '}'}; /* N = 2^63 */
  write_raw("huge.safetensors", b, 10, path, sizeof path);
  expect_open_fails(path, MLAGEN_EINVAL,
                    (const char *[]){"header length 9223372036854775808 is over the limit of 100000000", NULL});
  unsigned char c[16] = {0x01, 0xe1, 0xf5, 0x05, 0, 0, 0, 0, '{', '}'}; /* N = 100000001 */
  write_raw("huge2.safetensors", c, 10, path, sizeof path);
  expect_open_fails(path, MLAGEN_EINVAL, (const char *[]){"over the limit", NULL});
  unsigned char e[16] = {3, 0, 0, 0, 0, 0, 0, 0, '{', '}'}; /* N = 3, 2 bytes follow */
  write_raw("past.safetensors", e, 10, path, sizeof path);
  expect_open_fails(path, MLAGEN_EINVAL, (const char *[]){"header length 3 runs past the end of the 10-byte file", NULL});

  path_in_dir(path, sizeof path, "no-such-file.safetensors");
  expect_open_fails(path, MLAGEN_EIO, (const char *[]){"cannot open", NULL});
  expect_open_fails(g_dir, MLAGEN_EIO, (const char *[]){"not a regular file", NULL});

  /* valid corner cases: nothing at all, padding, a zero-size tensor sharing an offset */
  write_st("min.safetensors", "{}", 2, 0, path, sizeof path);
  mg_st_file *f = open_ok(path);
  assert_int_equal(mg_st_count(f), 0);
  mg_st_close(f);
  const char *pad = "{\"z\":" T1("F16", "[0, 5]", 4, 4) ", \"s\":" T1("F32", "[]", 0, 4)
                    ", \"__metadata__\": null}  \n\t  ";
  write_st("pad.safetensors", pad, strlen(pad), 4, path, sizeof path);
  f = open_ok(path);
  assert_int_equal(mg_st_count(f), 2);
  assert_string_equal(mg_st_at(f, 0)->name, "s");
  assert_string_equal(mg_st_at(f, 1)->name, "z");
  assert_int_equal(mg_st_at(f, 1)->nbytes, 0);
  float s;
  assert_int_equal(mg_st_read_f32(f, "s", 0, NULL, &s, NULL), 0);
  assert_true(fbits(s) == 0x5a5a5a5au);
  mg_st_close(f);
}

/* Random byte edits and truncations of a good file: each open either succeeds (and
 * then every tensor reads) or fails with MLAGEN_EINVAL and a one-line message. */
static void test_mutations(void **state) {
  (void)state;
  char *good;
  size_t len;
  assert_int_equal(mg_fs_read(FIXTURE, 1 << 20, &good, &len, NULL), 0);
  size_t hlen = (size_t)(unsigned char)good[0] | (size_t)(unsigned char)good[1] << 8;
  unsigned char *buf = malloc(len);
  double *tmp = malloc(len * sizeof *tmp);
  int ok = 0, bad = 0;
  for (int it = 0; it < 4000; it++) {
    memcpy(buf, good, len);
    size_t n = len;
    int edits = 1 + (int)(rnd() % 4);
    for (int k = 0; k < edits; k++) {
      size_t at = (size_t)(rnd() % (8 + hlen));
      static const char pool[] = "{}[]\",:0123456789-.eE \xff\x80 FBI";
      buf[at] = rnd() % 2 ? (unsigned char)pool[rnd() % (sizeof pool - 1)] : (unsigned char)rnd();
    }
    if (rnd() % 8 == 0) n = (size_t)(rnd() % len);
    mg_diag d = MG_DIAG_INIT;
    mg_st_file *f = NULL;
    int rc = mg_st_open_mem(buf, n, "mutant", &f, &d);
    if (rc == 0) {
      ok++;
      for (int i = 0; i < mg_st_count(f); i++) {
        const mg_st_tensor *t = mg_st_at(f, i);
        if (t->int_bytes) /* "F32" mutated to "I32" */
          assert_int_equal(mg_st_read_i64(f, t->name, t->ndim, t->shape, (int64_t *)(void *)tmp, NULL), 0);
        else
          assert_int_equal(mg_st_read_f64(f, t->name, t->ndim, t->shape, tmp, NULL), 0);
      }
      mg_st_close(f);
    } else {
      bad++;
      assert_int_equal(rc, MLAGEN_EINVAL);
      assert_null(f);
      expect_msg(&d, "mutant: ");
    }
    mg_diag_clear(&d);
  }
  assert_true(bad > 1000);
  free(buf);
  free(tmp);
  free(good);
}

/* ---- writing -------------------------------------------------------------------------- */

static int count_entries(const char *dir) {
  DIR *dp = opendir(dir);
  assert_non_null(dp);
  int n = 0;
  for (struct dirent *e; (e = readdir(dp));)
    if (e->d_name[0] != '.') n++;
  closedir(dp);
  return n;
}

static void test_write_roundtrip(void **state) {
  (void)state;
  char sub[128], path[160];
  path_in_dir(sub, sizeof sub, "rt");
  assert_int_equal(mg_fs_mkdirs(sub, NULL), 0);
  snprintf(path, sizeof path, "%s/out.safetensors", sub);

  enum { NA = 3 * 5 * 7, NB = 4 * 2, NH = 257 };
  float a[NA], h[NH], hb[NH];
  double b[NB];
  for (int i = 0; i < NA; i++) a[i] = rnd_float(10.0f);
  for (int i = 0; i < NB; i++) b[i] = (double)rnd_float(1.0f) * 1e-3 + (double)rnd_float(1.0f);
  for (int i = 0; i < NH; i++) { /* random bit patterns over the whole range, no NaN */
    uint32_t u = (uint32_t)rnd();
    if ((u & 0x7f800000u) == 0x7f800000u) u &= ~0x00800000u;
    memcpy(&h[i], &u, 4);
    hb[i] = i % 2 ? h[i] : rnd_float(70000.0f); /* f16: half in its range */
  }
  float scalar = rnd_float(3.0f);
  int64_t sa[] = {3, 5, 7}, sb[] = {4, 2}, sh[] = {NH}, sz[] = {2, 0, 3};

  mg_st_writer *w;
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(mg_st_writer_new(&w, NULL), 0);
  assert_int_equal(mg_st_writer_add_f32_as(w, "h_bf16", MG_BF16, 1, sh, h, &d), 0);
  assert_int_equal(mg_st_writer_add_f32(w, "attn.q \"quoted\"\\ \xc3\xa4", 3, sa, a, &d), 0);
  assert_int_equal(mg_st_writer_add_f32_as(w, "h_f16", MG_F16, 1, sh, hb, &d), 0);
  assert_int_equal(mg_st_writer_add_f64(w, "b", 2, sb, b, &d), 0);
  assert_int_equal(mg_st_writer_add_f32(w, "scalar", 0, NULL, &scalar, &d), 0);
  assert_int_equal(mg_st_writer_add_f32(w, "zero", 3, sz, NULL, &d), 0);
  assert_int_equal(mg_st_writer_add_f32_as(w, "a64", MG_F64, 3, sa, a, &d), 0);
  assert_int_equal(mg_st_writer_add_meta(w, "format", "pt", &d), 0);
  assert_int_equal(mg_st_writer_add_meta(w, "note", "line1\nline2 \"q\"", &d), 0);
  if (mg_st_writer_write(w, path, &d) != 0) fail_msg("%s", mg_diag_msg(&d));
  assert_int_equal(count_entries(sub), 1);

  char *bytes;
  size_t len;
  assert_int_equal(mg_fs_read(path, 1 << 20, &bytes, &len, NULL), 0);
  uint64_t n = 0;
  for (int i = 0; i < 8; i++) n |= (uint64_t)(unsigned char)bytes[i] << (8 * i);
  assert_int_equal((8 + n) % 8, 0);
  assert_true(bytes[8] == '{');

  mg_st_file *f = open_ok(path);
  assert_int_equal(mg_st_count(f), 7);
  for (int i = 0; i < 7; i++) { /* each tensor aligned to its element size in the file */
    const mg_st_tensor *t = mg_st_at(f, i);
    assert_int_equal((8 + n + t->offset) % mg_dtype_size(t->dtype), 0);
  }
  float ra[NA], rh[NH];
  double rb[NB], ra64[NA];
  assert_int_equal(mg_st_read_f32(f, "attn.q \"quoted\"\\ \xc3\xa4", 3, sa, ra, &d), 0);
  assert_memory_equal(ra, a, sizeof a); /* bit-identical */
  assert_memory_equal(mg_st_data(f, mg_st_find(f, "attn.q \"quoted\"\\ \xc3\xa4")), a, sizeof a); /* LE host */
  assert_int_equal(mg_st_read_f64(f, "b", 2, sb, rb, &d), 0);
  assert_memory_equal(rb, b, sizeof b);
  assert_int_equal(mg_st_read_f64(f, "a64", 3, sa, ra64, &d), 0);
  for (int i = 0; i < NA; i++) assert_true(ra64[i] == (double)a[i]);
  assert_int_equal(mg_st_read_f32(f, "h_bf16", 1, sh, rh, &d), 0);
  for (int i = 0; i < NH; i++) assert_true(fbits(rh[i]) == fbits(mg_bf16_to_f32(mg_f32_to_bf16(h[i]))));
  assert_int_equal(mg_st_read_f32(f, "h_f16", 1, sh, rh, &d), 0);
  for (int i = 0; i < NH; i++) {
    assert_true(fbits(rh[i]) == fbits(mg_f16_to_f32(mg_f32_to_f16(hb[i]))));
    if (fabsf(hb[i]) <= 65504.0f && fabsf(hb[i]) >= 0x1p-14f) /* normal range: half an ulp */
      assert_true(fabsf(rh[i] - hb[i]) <= fabsf(hb[i]) * 0x1p-11f);
  }
  float rs;
  assert_int_equal(mg_st_read_f32(f, "scalar", 0, NULL, &rs, &d), 0);
  assert_true(fbits(rs) == fbits(scalar));
  assert_int_equal(mg_st_read_f32(f, "zero", 3, sz, NULL, &d), 0);
  assert_string_equal(mg_st_meta(f, "format"), "pt");
  assert_string_equal(mg_st_meta(f, "note"), "line1\nline2 \"q\"");
  mg_st_close(f);

  /* writing again gives the same bytes; an empty writer gives a valid empty file */
  assert_int_equal(mg_st_writer_write(w, path, &d), 0);
  char *again;
  size_t len2;
  assert_int_equal(mg_fs_read(path, 1 << 20, &again, &len2, NULL), 0);
  assert_int_equal(len, len2);
  assert_memory_equal(bytes, again, len);
  free(again);
  free(bytes);
  mg_st_writer_free(w);
  assert_int_equal(mg_st_writer_new(&w, NULL), 0);
  assert_int_equal(mg_st_writer_write(w, path, &d), 0);
  f = open_ok(path);
  assert_int_equal(mg_st_count(f), 0);
  mg_st_close(f);
  mg_st_writer_free(w);
  mg_st_writer_free(NULL);
  mg_diag_clear(&d);
  unlink(path);
  rmdir(sub);
}

static void test_writer_errors(void **state) {
  (void)state;
  mg_st_writer *w;
  mg_diag d = MG_DIAG_INIT;
  float x[4] = {1, 2, 3, 4};
  int64_t s[] = {4};
  assert_int_equal(mg_st_writer_new(&w, NULL), 0);
  assert_int_equal(mg_st_writer_add_f32(w, "w", 1, s, x, &d), 0);
  assert_int_equal(mg_st_writer_add_f32(w, "w", 1, s, x, &d), MLAGEN_EINVAL);
  expect_msg(&d, "tensor 'w' was already added");
  assert_int_equal(mg_st_writer_add_f64(w, "w", 1, s, (double[4]){0}, &d), MLAGEN_EINVAL);
  assert_int_equal(mg_st_writer_add_f32(w, "__metadata__", 1, s, x, &d), MLAGEN_EINVAL);
  expect_msg(&d, "reserved");
  char longname[300];
  memset(longname, 'x', 256);
  longname[256] = 0;
  assert_int_equal(mg_st_writer_add_f32(w, longname, 1, s, x, &d), MLAGEN_EINVAL);
  expect_msg(&d, "over the limit of 255");
  assert_int_equal(mg_st_writer_add_f32(w, "bad\xff", 1, s, x, &d), MLAGEN_EINVAL);
  expect_msg(&d, "not valid UTF-8");
  assert_int_equal(mg_st_writer_add_f32(w, "neg", 2, (int64_t[]){2, -2}, x, &d), MLAGEN_EINVAL);
  expect_msg(&d, "'neg': shape [2, -2] has a negative dim");
  assert_int_equal(mg_st_writer_add_f32(w, "nine", 9, (int64_t[9]){1, 1, 1, 1, 1, 1, 1, 1, 1}, x, &d),
                   MLAGEN_EINVAL);
  expect_msg(&d, "'nine'");
  assert_int_equal(mg_st_writer_add_f32(w, "big", 3, (int64_t[]){INT64_MAX, 2, 2}, x, &d), MLAGEN_EINVAL);
  expect_msg(&d, "'big'");
  expect_msg(&d, "overflows");
  assert_int_equal(mg_st_writer_add_f32(w, "null", 1, s, NULL, &d), MLAGEN_EINVAL);
  expect_msg(&d, "'null': data is NULL");
  assert_int_equal(mg_st_writer_add_meta(w, "k", "v", &d), 0);
  assert_int_equal(mg_st_writer_add_meta(w, "k", "v2", &d), MLAGEN_EINVAL);
  expect_msg(&d, "metadata key 'k' was already added");
  assert_int_equal(mg_st_writer_add_meta(w, "k2", "\xc3", &d), MLAGEN_EINVAL);

  /* the failed adds left the writer as it was */
  char path[128];
  path_in_dir(path, sizeof path, "errs.safetensors");
  assert_int_equal(mg_st_writer_write(w, path, &d), 0);
  mg_st_file *f = open_ok(path);
  assert_int_equal(mg_st_count(f), 1);
  assert_string_equal(mg_st_meta(f, "k"), "v");
  assert_null(mg_st_meta(f, "k2"));
  mg_st_close(f);
  unlink(path);
  mg_st_writer_free(w);
  mg_diag_clear(&d);
}

static void test_writer_atomic(void **state) {
  (void)state;
  char sub[128], path[160];
  path_in_dir(sub, sizeof sub, "atomic");
  assert_int_equal(mg_fs_mkdirs(sub, NULL), 0);
  snprintf(path, sizeof path, "%s/keep.safetensors", sub);
  assert_int_equal(mg_fs_write_atomic(path, "old contents", 12, NULL), 0);

  enum { N = 64 * 1024 };
  float *big = malloc(N * sizeof *big);
  for (int i = 0; i < N; i++) big[i] = rnd_float(1.0f);
  mg_st_writer *w;
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(mg_st_writer_new(&w, NULL), 0);
  assert_int_equal(mg_st_writer_add_f32(w, "big", 1, (int64_t[]){N}, big, &d), 0);

  /* a missing directory fails cleanly */
  char missing[200];
  snprintf(missing, sizeof missing, "%s/no/such/dir/x.safetensors", sub);
  assert_int_equal(mg_st_writer_write(w, missing, &d), MLAGEN_EIO);
  expect_msg(&d, missing);

  /* a write cut short (file size limit) leaves the old file and no temp file */
  struct rlimit old;
  assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
  void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = 4096;
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
  int rc = mg_st_writer_write(w, path, &d);
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
  signal(SIGXFSZ, prev);
  assert_int_equal(rc, MLAGEN_EIO);
  expect_msg(&d, path);
  char *data;
  size_t len;
  assert_int_equal(mg_fs_read(path, 1 << 20, &data, &len, NULL), 0);
  assert_int_equal(len, 12);
  assert_memory_equal(data, "old contents", 12);
  free(data);
  assert_int_equal(count_entries(sub), 1);

  /* an unwritable directory (meaningless for root, who may write anyway) */
  if (geteuid() != 0) {
    assert_int_equal(chmod(sub, 0555), 0);
    assert_int_equal(mg_st_writer_write(w, path, &d), MLAGEN_EIO);
    assert_int_equal(chmod(sub, 0755), 0);
    assert_int_equal(mg_fs_read(path, 1 << 20, &data, &len, NULL), 0);
    assert_int_equal(len, 12);
    free(data);
  }

  /* and then the write succeeds, replacing the file whole */
  assert_int_equal(mg_st_writer_write(w, path, &d), 0);
  assert_int_equal(count_entries(sub), 1);
  mg_st_file *f = open_ok(path);
  float *back = malloc(N * sizeof *back);
  assert_int_equal(mg_st_read_f32(f, "big", 1, (int64_t[]){N}, back, &d), 0);
  assert_memory_equal(back, big, N * sizeof *big);
  mg_st_close(f);
  free(back);
  free(big);
  mg_st_writer_free(w);
  mg_diag_clear(&d);
  unlink(path);
  rmdir(sub);
}

/* ---- conversions over every bit pattern ----------------------------------------------- */

static void test_conversions_exhaustive(void **state) {
  (void)state;
  for (uint32_t h = 0; h < 0x10000; h++) {
    /* f16 -> f32 -> f16 is the identity (NaNs stay NaNs) */
    float x = mg_f16_to_f32((uint16_t)h);
    uint16_t back = mg_f32_to_f16(x);
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) {
      assert_true(isnan(x) && (back & 0x7c00) == 0x7c00 && (back & 0x3ff));
    } else if (back != h) {
      fail_msg("f16 %#06x -> %a -> %#06x", h, (double)x, back);
    }
    /* and the value is the IEEE half one: (-1)^s 2^(e-15) (1 + m/1024), or 2^-14 m/1024 */
    if ((h & 0x7c00) != 0x7c00) {
      int e = (int)((h >> 10) & 0x1f), m = (int)(h & 0x3ff);
      double v = e ? ldexp(1.0 + m / 1024.0, e - 15) : ldexp(m / 1024.0, -14);
      if (h & 0x8000) v = -v;
      assert_true((double)x == v && !signbit(x) == !signbit(v));
    }
    float y = mg_bf16_to_f32((uint16_t)h);
    uint16_t bb = mg_f32_to_bf16(y);
    if (isnan(y))
      assert_true(isnan(mg_bf16_to_f32(bb)));
    else
      assert_int_equal(bb, h);
  }
  /* Every midpoint between neighbours rounds to the even one, and one float ulp either
   * side of it to the nearer one (both signs; 65520 = mid(65504, "65536") goes to inf). */
  for (uint16_t mag = 0; mag < 0x7c00; mag++)
    for (int sgn = 0; sgn < 2; sgn++) {
      uint16_t s = sgn ? 0x8000 : 0;
      float a = mg_f16_to_f32((uint16_t)(s | mag));
      float b = mag == 0x7bff ? (sgn ? -65536.0f : 65536.0f) : mg_f16_to_f32((uint16_t)(s | (mag + 1)));
      float mid = (a + b) / 2; /* exact: 12 significant bits */
      assert_int_equal(mg_f32_to_f16(mid), s | (mag & 1 ? mag + 1 : mag));
      assert_int_equal(mg_f32_to_f16(nextafterf(mid, a)), s | mag);
      assert_int_equal(mg_f32_to_f16(nextafterf(mid, b)), s | (mag + 1));
    }
  for (uint16_t mag = 0; mag < 0x7f7f; mag++) { /* (past 0x7f7f the midpoint is not a float) */
    float a = mg_bf16_to_f32(mag), b = mg_bf16_to_f32((uint16_t)(mag + 1));
    float mid = a + (b - a) / 2;
    assert_int_equal(mg_f32_to_bf16(mid), mag & 1 ? mag + 1 : mag);
    assert_int_equal(mg_f32_to_bf16(nextafterf(mid, a)), mag);
    assert_int_equal(mg_f32_to_bf16(nextafterf(mid, b)), mag + 1);
  }
  assert_int_equal(mg_f32_to_bf16(3.4028234663852886e38f), 0x7f80); /* FLT_MAX: past the midpoint */

  /* f32 -> f16 rounds to nearest even: check random floats against the two neighbours */
  for (int i = 0; i < 200000; i++) {
    uint32_t u = (uint32_t)rnd();
    u = (u & 0x80000000u) | (0x33000000u + u % (0x47800000u - 0x33000000u)); /* 2^-25 .. 65536 */
    float x;
    memcpy(&x, &u, 4);
    uint16_t r = mg_f32_to_f16(x);
    double v = mg_f16_to_f32(r), ax = fabs((double)x);
    uint16_t mag = r & 0x7fff;
    double lo = mag ? fabs((double)mg_f16_to_f32((uint16_t)(mag - 1))) : 0;
    double hi = mag < 0x7c00 ? fabs((double)mg_f16_to_f32((uint16_t)(mag + 1))) : INFINITY;
    double av = fabs(v);
    if (isinf(av)) { /* overflow: x at least halfway from 65504 to 65536 */
      assert_true(ax >= 65520.0);
      continue;
    }
    double dlo = av - lo, dhi = hi - av, err = fabs(ax - av);
    double half = ax < av ? dlo / 2 : dhi / 2; /* to the neighbour on x's side */
    if (err > half) fail_msg("f32_to_f16(%a) = %#06x is not the nearest", (double)x, r);
    if (err == half && ax != av) assert_int_equal(mag & 1, 0); /* ties to even */
    assert_true(!signbit(v) == !signbit(x));
  }
}

/* ---- setup ------------------------------------------------------------------------------ */

static int setup(void **state) {
  (void)state;
  const char *env = getenv("MLAGEN_TEST_SEED");
  unsigned long long seed = env && *env ? strtoull(env, NULL, 0)
                                        : (unsigned long long)time(NULL) ^ ((unsigned long long)getpid() << 20);
  printf("test_safetensors: seed %llu (rerun with MLAGEN_TEST_SEED=%llu)\n", seed, seed);
  g_rng = seed * 0x9e3779b97f4a7c15ull + 1;
  snprintf(g_dir, sizeof g_dir, "/tmp/mlagen-st-XXXXXX");
  return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  DIR *dp = opendir(g_dir);
  if (dp) {
    for (struct dirent *e; (e = readdir(dp));) {
      if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
      char p[512];
      snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name);
      unlink(p);
    }
    closedir(dp);
  }
  return rmdir(g_dir) == 0 ? 0 : -1; /* fails if a test left a subdirectory behind */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fixture_listing),
      cmocka_unit_test(test_fixture_bf16_f16),
      cmocka_unit_test(test_fixture_f32_f64),
      cmocka_unit_test(test_fixture_specials),
      cmocka_unit_test(test_fixture_scalar_and_empty),
      cmocka_unit_test(test_read_rows),
      cmocka_unit_test(test_shape_mismatch_and_missing),
      cmocka_unit_test(test_malformed_headers),
      cmocka_unit_test(test_integer_tensors),
      cmocka_unit_test(test_malformed_files),
      cmocka_unit_test(test_mutations),
      cmocka_unit_test(test_write_roundtrip),
      cmocka_unit_test(test_writer_errors),
      cmocka_unit_test(test_writer_atomic),
      cmocka_unit_test(test_conversions_exhaustive),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
