/* test_comm_local.c: the single-process communicator (rank 0 of 1), and the MPI backend
 * built without MPI. This executable needs no MPI: it compiles runtime/comm/mg_comm_local.c
 * and, when MLAGEN_HAVE_MPI is unset, runtime/comm/mg_comm_mpi.c as the stub. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "mg_comm.h"
#include "mlagen.h"

static const mg_dtype all_types[] = {MG_F32, MG_F64, MG_BF16, MG_F16};
static const size_t counts[] = {0, 1, 7, 1000};

/* Bytes that differ per position, so a shifted or partial copy shows. */
static void fill(unsigned char *p, size_t n, unsigned salt) {
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 131u + salt * 7u + 1u);
}

static int setup(void **state) {
  mg_comm *c = NULL;
  mg_diag d = MG_DIAG_INIT;
  if (mg_comm_local_new(&c, &d) != 0) return -1;
  *state = c;
  return 0;
}

static int teardown(void **state) {
  mg_comm_destroy(*state);
  return 0;
}

static void test_rank_and_size(void **state) {
  mg_comm *c = *state;
  assert_non_null(c->ops);
  assert_int_equal(c->rank, 0);
  assert_int_equal(c->size, 1);
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(c->ops->group_start(c, &d), 0);
  assert_int_equal(c->ops->group_end(c, &d), 0);
  assert_int_equal(mg_comm_local_new(NULL, &d), MLAGEN_EINVAL);
  mg_diag_clear(&d);
  mg_comm_destroy(NULL); /* accepted */
}

typedef int (*coll_fn)(mg_comm *, const void *, void *, size_t, mg_dtype, mg_diag *);

/* One collective over every dtype and count: recv equals send, bytes beyond it untouched
 * (a reduce-scatter of one rank too, bf16/f16 included: its value rounded once). */
static void check_copies(mg_comm *c, coll_fn fn) {
  for (size_t ti = 0; ti < sizeof all_types / sizeof all_types[0]; ti++) {
    mg_dtype t = all_types[ti];
    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
      size_t n = counts[ci] * mg_dtype_size(t);
      unsigned char *send = malloc(n + 16), *recv = malloc(n + 16);
      assert_non_null(send);
      assert_non_null(recv);
      fill(send, n + 16, (unsigned)(ti * 10 + ci));
      memset(recv, 0xA5, n + 16);
      mg_diag d = MG_DIAG_INIT;
      assert_int_equal(fn(c, send, recv, counts[ci], t, &d), 0);
      if (n) assert_memory_equal(recv, send, n);
      for (size_t i = n; i < n + 16; i++) assert_int_equal(recv[i], 0xA5);
      /* in place */
      memcpy(recv, send, n + 16);
      assert_int_equal(fn(c, recv, recv, counts[ci], t, &d), 0);
      assert_memory_equal(recv, send, n + 16);
      mg_diag_clear(&d);
      free(send);
      free(recv);
    }
  }
}

static void test_all_to_all(void **state) {
  mg_comm *c = *state;
  check_copies(c, c->ops->all_to_all);
}

static void test_all_gather(void **state) {
  mg_comm *c = *state;
  check_copies(c, c->ops->all_gather);
}

static void test_reduce_scatter(void **state) {
  mg_comm *c = *state;
  check_copies(c, c->ops->reduce_scatter);
}

static void test_count_zero_null_buffers(void **state) {
  mg_comm *c = *state;
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(c->ops->all_to_all(c, NULL, NULL, 0, MG_F32, &d), 0);
  assert_int_equal(c->ops->all_gather(c, NULL, NULL, 0, MG_BF16, &d), 0);
  assert_int_equal(c->ops->reduce_scatter(c, NULL, NULL, 0, MG_F64, &d), 0);
  mg_diag_clear(&d);
}

static void test_refusals(void **state) {
  mg_comm *c = *state;
  mg_diag d = MG_DIAG_INIT;
  uint16_t send[4] = {1, 2, 3, 4}, recv[4] = {9, 9, 9, 9};
  /* bf16/f16 reduce-scatter (the MPI backend sums in f32, rounds once): one rank's sum is
   * its own value, bit for bit. */
  assert_int_equal(c->ops->reduce_scatter(c, send, recv, 4, MG_BF16, &d), 0);
  assert_memory_equal(recv, send, sizeof send);
  recv[0] = 9;
  assert_int_equal(c->ops->reduce_scatter(c, send, recv, 4, MG_F16, &d), 0);
  assert_int_equal(recv[0], 1);
  recv[0] = 9;
  assert_int_equal(c->ops->reduce_scatter(c, NULL, recv, 1, MG_BF16, &d), MLAGEN_EINVAL);
  assert_int_equal(recv[0], 9);
  assert_int_equal(c->ops->all_to_all(c, NULL, recv, 1, MG_F32, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "NULL send buffer"));
  assert_int_equal(c->ops->all_gather(c, send, NULL, 1, MG_F32, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "NULL receive buffer"));
  assert_int_equal(c->ops->all_gather(c, send, recv, 1, (mg_dtype)17, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "unknown dtype"));
  assert_int_equal(c->ops->all_to_all(c, send, recv, 1, MG_F16, NULL), 0); /* NULL diag */
  assert_int_equal(c->ops->reduce_scatter(c, send, NULL, 1, MG_F16, NULL), MLAGEN_EINVAL);
  mg_diag_clear(&d);
}

/* Without MPI, the MPI backend builds and says why it cannot work. */
static void test_mpi_stub(void **state) {
  (void)state;
#ifdef MLAGEN_HAVE_MPI
  fail_msg("built with MLAGEN_HAVE_MPI: the stub this test checks was not compiled (link "
           "test_comm_local without mlagen_comm)");
#else
  mg_comm *c = (mg_comm *)1;
  mg_diag d = MG_DIAG_INIT;
  int dummy = 0;
  assert_int_equal(mg_comm_mpi_wrap(&c, &dummy, &d), MLAGEN_EUNSUPPORTED);
  assert_null(c);
  assert_non_null(strstr(mg_diag_msg(&d), "built without MPI"));
  assert_non_null(strstr(mg_diag_msg(&d), "libopenmpi-dev"));
  assert_int_equal(mg_comm_mpi_wrap(NULL, NULL, NULL), MLAGEN_EUNSUPPORTED);
  mg_diag_clear(&d);
#endif
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rank_and_size),   cmocka_unit_test(test_all_to_all),
      cmocka_unit_test(test_all_gather),      cmocka_unit_test(test_reduce_scatter),
      cmocka_unit_test(test_count_zero_null_buffers), cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_mpi_stub)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
