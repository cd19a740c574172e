/* test_base.c: buffers, messages, status names, atomic files, SHA-256. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mg_buf.h"
#include "mg_diag.h"
#include "mg_dtype.h"
#include "mg_embed.h"
#include "mg_fs.h"
#include "mg_hash.h"
#include "mlagen.h"

static void test_buf_grows_and_caps(void **state) {
  (void)state;
  mg_buf b;
  mg_buf_init(&b, 10);
  assert_string_equal(mg_buf_str(&b), "");
  assert_int_equal(mg_buf_adds(&b, "hello"), 0);
  assert_int_equal(mg_buf_addf(&b, "%d", 1234), 0);
  assert_string_equal(mg_buf_str(&b), "hello1234");
  assert_int_equal(mg_buf_adds(&b, "xy"), MLAGEN_ENOMEM); /* 11 > cap 10 */
  assert_string_equal(mg_buf_str(&b), "hello1234");     /* unchanged */
  assert_int_equal(mg_buf_adds(&b, "z"), 0);
  assert_int_equal(b.len, 10);
  size_t n;
  char *s = mg_buf_take(&b, &n);
  assert_int_equal(n, 10);
  assert_string_equal(s, "hello1234z");
  free(s);
  assert_null(b.data);
  mg_buf_free(&b);
}

static void test_diag_and_status(void **state) {
  (void)state;
  mg_diag d = MG_DIAG_INIT;
  assert_string_equal(mg_diag_msg(&d), "");
  assert_int_equal(mg_diag_set(&d, MLAGEN_ECONFIG, "%s: key '%s'", "f.json", "v_head_dim"), MLAGEN_ECONFIG);
  mg_diag_prefix(&d, "loading %d", 3);
  assert_string_equal(mg_diag_msg(&d), "loading 3: f.json: key 'v_head_dim'");
  assert_int_equal(d.status, MLAGEN_ECONFIG);
  mg_diag_clear(&d);
  assert_int_equal(mg_diag_set(NULL, MLAGEN_EIO, "ignored"), MLAGEN_EIO);
  assert_string_equal(mlagen_strerror(MLAGEN_ENODRIVER), "no CUDA driver");
  assert_string_equal(mlagen_status_name(MLAGEN_EINVAL), "MLAGEN_EINVAL");
  assert_string_equal(mlagen_strerror(12345), "unknown status");
}

static void test_atomic_write(void **state) {
  (void)state;
  char dir[] = "/tmp/mlagen-test-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char sub[128], path[160];
  snprintf(sub, sizeof sub, "%s/a/b", dir);
  assert_int_equal(mg_fs_mkdirs(sub, NULL), 0);
  snprintf(path, sizeof path, "%s/f.txt", sub);
  assert_int_equal(mg_fs_write_atomic(path, "first", 5, NULL), 0);
  assert_int_equal(mg_fs_write_atomic(path, "second!", 7, NULL), 0);
  char *data;
  size_t n;
  assert_int_equal(mg_fs_read(path, 100, &data, &n, NULL), 0);
  assert_int_equal(n, 7);
  assert_string_equal(data, "second!");
  free(data);
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(mg_fs_read(path, 3, &data, &n, &d), MLAGEN_ELIMIT);
  assert_null(data);
  mg_diag_clear(&d);
  /* mg_fs_check_writable: yes for a file that exists or not yet in an existing directory,
   * leaving nothing behind (the count below) and the file unchanged */
  char fresh[200];
  snprintf(fresh, sizeof fresh, "%s/not-yet.txt", sub);
  assert_int_equal(mg_fs_check_writable(path, NULL), 0);
  assert_int_equal(mg_fs_check_writable(fresh, NULL), 0);
  assert_false(mg_fs_is_file(fresh));
  assert_int_equal(mg_fs_read(path, 100, &data, &n, NULL), 0);
  assert_string_equal(data, "second!");
  free(data);
  /* no temp files left behind */
  DIR *dp = opendir(sub);
  int entries = 0;
  for (struct dirent *e; (e = readdir(dp));)
    if (e->d_name[0] != '.') entries++;
  closedir(dp);
  assert_int_equal(entries, 1);
  /* a path that is not a regular file is never replaced (a symlink, a directory) */
  char link[200];
  snprintf(link, sizeof link, "%s/link", dir);
  assert_int_equal(symlink(path, link), 0);
  assert_int_equal(mg_fs_write_atomic(link, "x", 1, &d), MLAGEN_EIO);
  assert_non_null(strstr(mg_diag_msg(&d), "not a regular file"));
  assert_int_equal(mg_fs_write_atomic(sub, "x", 1, &d), MLAGEN_EIO);
  mg_diag_clear(&d);
  assert_int_equal(mg_fs_check_writable(link, &d), MLAGEN_EIO); /* as the write would */
  assert_non_null(strstr(mg_diag_msg(&d), "not a regular file"));
  mg_diag_clear(&d);
  /* a write into a missing directory fails cleanly, and the check says so first */
  snprintf(path, sizeof path, "%s/missing/f.txt", dir);
  assert_int_equal(mg_fs_check_writable(path, &d), MLAGEN_EIO);
  assert_non_null(strstr(mg_diag_msg(&d), "missing/f.txt"));
  mg_diag_clear(&d);
  assert_int_equal(mg_fs_write_atomic(path, "x", 1, &d), MLAGEN_EIO);
  assert_non_null(strstr(mg_diag_msg(&d), "missing/f.txt"));
  mg_diag_clear(&d);
  assert_int_equal(mg_fs_read("/nonexistent/x", 10, &data, &n, &d), MLAGEN_EIO);
  mg_diag_clear(&d);
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
}

/* A FIFO (no writer) where a file is expected is refused at once, not waited on: every
 * file mlagen reads (templates, cache entries, --inputs, configs, stores) goes through
 * mg_fs_read. An alarm turns a hang back into a failure. Also a directory and /dev/null. */
static void test_read_refuses_fifo(void **state) {
  (void)state;
  char dir[] = "/tmp/mlagen-test-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char fifo[128];
  snprintf(fifo, sizeof fifo, "%s/pipe", dir);
  assert_int_equal(mkfifo(fifo, 0600), 0);
  alarm(20);
  char *data = (char *)1;
  size_t n = 1;
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(mg_fs_read(fifo, 100, &data, &n, &d), MLAGEN_EIO);
  assert_null(data);
  assert_int_equal(n, 0);
  assert_non_null(strstr(mg_diag_msg(&d), "pipe: not a regular file"));
  mg_diag_clear(&d);
  assert_int_equal(mg_fs_read(dir, 100, &data, &n, &d), MLAGEN_EIO);
  assert_non_null(strstr(mg_diag_msg(&d), "not a regular file"));
  mg_diag_clear(&d);
  assert_int_equal(mg_fs_read("/dev/null", 100, &data, &n, &d), MLAGEN_EIO);
  assert_non_null(strstr(mg_diag_msg(&d), "not a regular file"));
  mg_diag_clear(&d);
  alarm(0);
  unlink(fifo);
  rmdir(dir);
}

static void test_sha256_vectors(void **state) {
  (void)state;
  /* FIPS 180-2 test vectors */
  uint8_t h[MG_HASH_BYTES];
  char hex[MG_HASH_HEX];
  assert_int_equal(mg_hash("abc", 3, h), 0);
  mg_hash_hex(h, hex);
  assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  assert_int_equal(mg_hash("", 0, h), 0);
  mg_hash_hex(h, hex);
  assert_string_equal(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  /* length-prefixed fields separate ("ab","c") from ("a","bc") */
  uint8_t h1[MG_HASH_BYTES], h2[MG_HASH_BYTES];
  mg_hash_ctx *c = mg_hash_begin();
  mg_hash_field_str(c, "ab");
  mg_hash_field_str(c, "c");
  assert_int_equal(mg_hash_end(c, h1), 0);
  c = mg_hash_begin();
  mg_hash_field_str(c, "a");
  mg_hash_field_str(c, "bc");
  assert_int_equal(mg_hash_end(c, h2), 0);
  assert_memory_not_equal(h1, h2, MG_HASH_BYTES);
}

/* The one table of dtype names: the command line's, its aliases, and the kernel specs'. */
static void test_dtype_names(void **state) {
  (void)state;
  static const char *const cli[] = {"f32", "f64", "bf16", "f16"};
  mg_dtype t;
  for (int i = 0; i < 4; i++) {
    assert_string_equal(mg_dtype_name((mg_dtype)i), cli[i]);
    assert_int_equal(mg_dtype_parse(cli[i], &t), 0);
    assert_int_equal(t, i);
  }
  assert_int_equal(mg_dtype_parse("fp16", &t), 0);
  assert_int_equal(t, MG_F16);
  assert_int_equal(mg_dtype_parse("half", &t), -1);
  assert_string_equal(mg_dtype_spec_name(MG_BF16), "bf16");
  assert_string_equal(mg_dtype_spec_name(MG_F16), "fp16");
  assert_null(mg_dtype_spec_name(MG_F32));
  assert_null(mg_dtype_spec_name(MG_F64));
  assert_int_equal(mg_dtype_spec_parse("fp16", &t), 0);
  assert_int_equal(t, MG_F16);
  assert_int_equal(mg_dtype_spec_parse("bf16", &t), 0);
  assert_int_equal(t, MG_BF16);
  assert_int_equal(mg_dtype_spec_parse("f16", &t), -1); /* the CLI's name, not a spec's */
  assert_int_equal(mg_dtype_spec_parse("f32", &t), -1);
  assert_int_equal(mg_dtype_spec_parse(NULL, &t), -1);
  assert_int_equal(mg_dtype_of_spec("fp16"), MG_F16);
  assert_int_equal(mg_dtype_of_spec("bf16"), MG_BF16);
  assert_int_equal(mg_dtype_of_spec("nonsense"), MG_BF16);
}

static void test_embedded_files(void **state) {
  (void)state;
  const mg_embedded_file *f = mg_embed_find("configs/deepseek-v3.json");
  assert_non_null(f);
  assert_non_null(strstr(f->data, "\"kv_lora_rank\": 512"));
  assert_int_equal(strlen(f->data), f->size);
  assert_non_null(mg_embed_find("templates/explicit_fwd.cu.tpl"));
  assert_non_null(mg_embed_find("templates/mla_device.cuh"));
  assert_null(mg_embed_find("templates/nope"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_buf_grows_and_caps), cmocka_unit_test(test_diag_and_status),
      cmocka_unit_test(test_atomic_write),       cmocka_unit_test(test_sha256_vectors),
      cmocka_unit_test(test_read_refuses_fifo),
      cmocka_unit_test(test_embedded_files),     cmocka_unit_test(test_dtype_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
