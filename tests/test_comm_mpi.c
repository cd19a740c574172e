/* test_comm_mpi.c: the MPI communicator on 1, 2 and 4 processes (run it under mpirun).
 *
 * Every rank derives every rank's send buffer from one seed (MLAGEN_TEST_SEED, else the
 * time on rank 0, broadcast), so each rank computes what it must receive on its own,
 * without MPI. Rank 0 prints cmocka's report; the other ranks print theirs only when
 * they fail (tests/mpi_test_main.h). The exit status is non-zero when any rank fails.
 *
 * A failed assertion on one rank leaves the others in a collective; to keep the ranks in
 * step, each test runs all its collectives first, counting mismatches, and asserts last. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mg_comm.h"
#include "mpi_test_main.h"
#include "mg_safetensors.h"
#include "mlagen.h"

static int g_rank, g_size;
static uint64_t g_seed;

static const size_t counts[] = {0, 1, 7, 100000};
static const mg_dtype move_types[] = {MG_F32, MG_F64, MG_BF16, MG_F16};
static const mg_dtype sum_types[] = {MG_F32, MG_F64, MG_BF16, MG_F16};

/* ---- data every rank can compute for every rank -------------------------------------- */

static uint64_t mix(uint64_t x) { /* splitmix64's finalizer */
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Case id of one collective call: distinct per op, dtype, count and test. */
static uint64_t case_id(unsigned test, unsigned op, mg_dtype t, size_t count) {
  return mix(mix(mix(g_seed ^ test) ^ op) ^ ((uint64_t)t << 40 ^ count));
}

/* Element i of (world) rank src's send buffer in case k, written to out (dtype t). */
static void element(uint64_t k, int src, size_t i, mg_dtype t, void *out) {
  uint64_t b = mix(mix(k ^ (uint64_t)(unsigned)src) ^ i);
  switch (t) {
    case MG_F32: {
      float v = (float)((double)(b >> 40) * 0x1p-23 - 1.0); /* exact: 24 bits, [-1, 1) */
      memcpy(out, &v, sizeof v);
      break;
    }
    case MG_F64: {
      double v = (double)(b >> 11) * 0x1p-52 - 1.0;
      memcpy(out, &v, sizeof v);
      break;
    }
    default: { /* any 16 bits, NaN patterns included: they must travel unchanged */
      uint16_t v = (uint16_t)(b >> 48);
      memcpy(out, &v, sizeof v);
    }
  }
}

static double element_value(uint64_t k, int src, size_t i, mg_dtype t) {
  if (t == MG_F32) {
    float v;
    element(k, src, i, t, &v);
    return v;
  }
  double v;
  element(k, src, i, t, &v);
  return v;
}

/* The summands of a bf16/f16 reduce-scatter: finite values in [-1, 1) (element's f32
 * value rounded to the type), so the sum is a number. */
static uint16_t summand16(uint64_t k, int src, size_t i, mg_dtype t) {
  float v;
  element(k, src, i, MG_F32, &v);
  return t == MG_BF16 ? mg_f32_to_bf16(v) : mg_f32_to_f16(v);
}

static double value16(uint16_t h, mg_dtype t) {
  return t == MG_BF16 ? mg_bf16_to_f32(h) : mg_f16_to_f32(h);
}

static void fill(uint64_t k, int src, size_t first, size_t n, mg_dtype t, unsigned char *out) {
  size_t es = mg_dtype_size(t);
  for (size_t i = 0; i < n; i++) element(k, src, first + i, t, out + i * es);
}

static unsigned char *alloc_bytes(size_t n) {
  unsigned char *p = malloc(n ? n : 1);
  if (p) memset(p, 0xA5, n ? n : 1);
  return p;
}

/* ---- one checked collective each; return the number of problems found ---------------- */

static int report_rc(int rc, const mg_diag *d, const char *what, mg_dtype t, size_t count) {
  if (!rc) return 0;
  print_error("%s %s count %zu returned %d: %s\n", what, mg_dtype_name(t), count, rc,
              mg_diag_msg(d));
  return 1;
}

/* all_to_all over members[0..n) (world ranks; the comm's rank r is members[r]). */
static int run_all_to_all(mg_comm *c, const int *members, unsigned test, mg_dtype t, size_t count) {
  int P = c->size, me = members[c->rank];
  uint64_t k = case_id(test, 1, t, count);
  size_t es = mg_dtype_size(t), block = count * es;
  unsigned char *send = alloc_bytes((size_t)P * block), *recv = alloc_bytes((size_t)P * block);
  unsigned char *want = alloc_bytes(block);
  if (!send || !recv || !want) {
    free(send), free(recv), free(want);
    print_error("out of memory\n");
    return 1;
  }
  fill(k, me, 0, (size_t)P * count, t, send);
  mg_diag d = MG_DIAG_INIT;
  int bad = report_rc(c->ops->all_to_all(c, send, recv, count, t, &d), &d, "all-to-all", t, count);
  for (int p = 0; p < P && !bad; p++) { /* block p comes from comm rank p: its block for me */
    fill(k, members[p], (size_t)c->rank * count, count, t, want);
    if (block && memcmp(recv + (size_t)p * block, want, block) != 0) {
      print_error("all-to-all %s count %zu: block from rank %d differs\n", mg_dtype_name(t), count, p);
      bad++;
    }
  }
  mg_diag_clear(&d);
  free(send), free(recv), free(want);
  return bad;
}

static int run_all_gather(mg_comm *c, const int *members, unsigned test, mg_dtype t, size_t count) {
  int P = c->size, me = members[c->rank];
  uint64_t k = case_id(test, 2, t, count);
  size_t es = mg_dtype_size(t), block = count * es;
  unsigned char *send = alloc_bytes(block), *recv = alloc_bytes((size_t)P * block);
  unsigned char *want = alloc_bytes(block);
  if (!send || !recv || !want) {
    free(send), free(recv), free(want);
    print_error("out of memory\n");
    return 1;
  }
  fill(k, me, 0, count, t, send);
  mg_diag d = MG_DIAG_INIT;
  int bad = report_rc(c->ops->all_gather(c, send, recv, count, t, &d), &d, "all-gather", t, count);
  for (int p = 0; p < P && !bad; p++) {
    fill(k, members[p], 0, count, t, want);
    if (block && memcmp(recv + (size_t)p * block, want, block) != 0) {
      print_error("all-gather %s count %zu: block of rank %d differs\n", mg_dtype_name(t), count, p);
      bad++;
    }
  }
  mg_diag_clear(&d);
  free(send), free(recv), free(want);
  return bad;
}

/* The sum over ranks, against a double sum: |got - want| <= P * eps * sum |x| (+ tiny),
 * the bound of any summation order in the working precision. bf16/f16 are summed in f32
 * and rounded once: the f32 bound plus half a unit in the last place of the 16-bit
 * result (2^-8 relative for bf16's 8-bit significand, 2^-11 for f16's 11 bits, plus half
 * f16's subnormal spacing 2^-24). */
static int run_reduce_scatter(mg_comm *c, const int *members, unsigned test, mg_dtype t,
                              size_t count) {
  int P = c->size, me = members[c->rank];
  uint64_t k = case_id(test, 3, t, count);
  size_t es = mg_dtype_size(t);
  unsigned char *send = alloc_bytes((size_t)P * count * es), *recv = alloc_bytes(count * es + es);
  if (!send || !recv) {
    free(send), free(recv);
    print_error("out of memory\n");
    return 1;
  }
  const int half = t == MG_BF16 || t == MG_F16;
  if (half)
    for (size_t i = 0; i < (size_t)P * count; i++) {
      uint16_t h = summand16(k, me, i, t);
      memcpy(send + i * es, &h, es);
    }
  else
    fill(k, me, 0, (size_t)P * count, t, send);
  mg_diag d = MG_DIAG_INIT;
  int bad = report_rc(c->ops->reduce_scatter(c, send, recv, count, t, &d), &d, "reduce-scatter",
                      t, count);
  double eps = t == MG_F64 ? DBL_EPSILON : FLT_EPSILON;
  for (size_t i = 0; i < count && !bad; i++) {
    double want = 0, mag = 0;
    for (int q = 0; q < P; q++) {
      const size_t j = (size_t)c->rank * count + i;
      double x = half ? value16(summand16(k, members[q], j, t), t) : element_value(k, members[q], j, t);
      want += x;
      mag += fabs(x);
    }
    double got, tol = P * eps * mag + 1e-300;
    if (half) {
      uint16_t h;
      memcpy(&h, recv + i * es, sizeof h);
      got = value16(h, t);
      tol += t == MG_BF16 ? 0x1p-8 * (fabs(want) + tol) : 0x1p-11 * (fabs(want) + tol) + 0x1p-25;
    } else if (t == MG_F32) {
      float f;
      memcpy(&f, recv + i * es, sizeof f);
      got = f;
    } else {
      memcpy(&got, recv + i * es, sizeof got);
    }
    if (!(fabs(got - want) <= tol)) {
      print_error("reduce-scatter %s count %zu: element %zu is %.17g, want %.17g\n",
                  mg_dtype_name(t), count, i, got, want);
      bad++;
    }
  }
  for (size_t b = count * es; b < count * es + es && !bad; b++) /* nothing written past */
    if (recv[b] != 0xA5) {
      print_error("reduce-scatter %s count %zu wrote past recv\n", mg_dtype_name(t), count);
      bad++;
    }
  mg_diag_clear(&d);
  free(send), free(recv);
  return bad;
}

/* ---- the tests ------------------------------------------------------------------------ */

static int *world_members(void) {
  static int *m;
  if (!m) {
    m = malloc((size_t)g_size * sizeof *m);
    for (int i = 0; m && i < g_size; i++) m[i] = i;
  }
  return m;
}

static void test_wrap_world(void **state) {
  mg_comm *c = *state;
  assert_int_equal(c->rank, g_rank);
  assert_int_equal(c->size, g_size);
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(c->ops->group_start(c, &d), 0);
  assert_int_equal(c->ops->group_end(c, &d), 0);
  mg_comm *o = (mg_comm *)1;
  assert_int_equal(mg_comm_mpi_wrap(&o, NULL, &d), MLAGEN_EINVAL);
  assert_null(o);
  MPI_Comm null = MPI_COMM_NULL;
  assert_int_equal(mg_comm_mpi_wrap(&o, &null, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "MPI_COMM_NULL"));
  mg_diag_clear(&d);
}

static void test_all_to_all(void **state) {
  mg_comm *c = *state;
  int bad = 0;
  for (size_t ti = 0; ti < sizeof move_types / sizeof move_types[0]; ti++)
    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++)
      bad += run_all_to_all(c, world_members(), 1, move_types[ti], counts[ci]);
  assert_int_equal(bad, 0);
}

static void test_all_gather(void **state) {
  mg_comm *c = *state;
  int bad = 0;
  for (size_t ti = 0; ti < sizeof move_types / sizeof move_types[0]; ti++)
    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++)
      bad += run_all_gather(c, world_members(), 2, move_types[ti], counts[ci]);
  assert_int_equal(bad, 0);
}

static void test_reduce_scatter(void **state) {
  mg_comm *c = *state;
  int bad = 0;
  for (size_t ti = 0; ti < sizeof sum_types / sizeof sum_types[0]; ti++)
    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++)
      bad += run_reduce_scatter(c, world_members(), 3, sum_types[ti], counts[ci]);
  assert_int_equal(bad, 0);
}

/* Calls in a group, as the engine issues them: group_start/group_end change nothing. */
static void test_grouped(void **state) {
  mg_comm *c = *state;
  mg_diag d = MG_DIAG_INIT;
  int bad = c->ops->group_start(c, &d) != 0;
  bad += run_all_to_all(c, world_members(), 4, MG_BF16, 33);
  bad += run_all_gather(c, world_members(), 4, MG_F32, 33);
  bad += c->ops->group_end(c, &d) != 0;
  mg_diag_clear(&d);
  assert_int_equal(bad, 0);
}

/* Count 0 with NULL buffers moves nothing and succeeds. */
static void test_count_zero_null(void **state) {
  mg_comm *c = *state;
  mg_diag d = MG_DIAG_INIT;
  int rc1 = c->ops->all_to_all(c, NULL, NULL, 0, MG_F32, &d);
  int rc2 = c->ops->all_gather(c, NULL, NULL, 0, MG_BF16, &d);
  int rc3 = c->ops->reduce_scatter(c, NULL, NULL, 0, MG_F64, &d);
  if (rc1 || rc2 || rc3) print_error("%s\n", mg_diag_msg(&d));
  mg_diag_clear(&d);
  assert_int_equal(rc1, 0);
  assert_int_equal(rc2, 0);
  assert_int_equal(rc3, 0);
}

/* Refusals are decided locally, the same on every rank, before any communication. */
static void test_refusals(void **state) {
  mg_comm *c = *state;
  mg_diag d = MG_DIAG_INIT;
  uint16_t send[64] = {0}, recv[64];
  memset(recv, 0x5A, sizeof recv);
  assert_int_equal(c->ops->reduce_scatter(c, NULL, recv, 4, MG_BF16, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "NULL send buffer"));
  assert_int_equal(c->ops->reduce_scatter(c, send, NULL, 4, MG_F16, &d), MLAGEN_EINVAL);
  assert_int_equal(recv[0], 0x5A5A);
  size_t huge = (size_t)INT_MAX + 1;
  assert_int_equal(c->ops->all_to_all(c, send, recv, huge, MG_F32, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "exceeds the MPI limit"));
  assert_int_equal(c->ops->all_gather(c, send, recv, huge, MG_BF16, &d), MLAGEN_EINVAL);
  assert_int_equal(c->ops->reduce_scatter(c, send, recv, huge, MG_F64, &d), MLAGEN_EINVAL);
  assert_int_equal(c->ops->reduce_scatter(c, send, recv, huge, MG_BF16, &d), MLAGEN_EINVAL);
  assert_int_equal(c->ops->all_gather(c, NULL, recv, 1, MG_F32, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "NULL send buffer"));
  assert_int_equal(c->ops->all_to_all(c, send, recv, 1, (mg_dtype)9, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "unknown dtype"));
  mg_diag_clear(&d);
}

static int g_custom_calls;
static void custom_handler(MPI_Comm *comm, int *code, ...) {
  (void)comm;
  (void)code;
  g_custom_calls++;
}

/* While wrapped the communicator returns errors; destroy restores the caller's handler.
 * A failing collective comes back as MLAGEN_EIO with MPI's text. */
static void test_error_handler(void **state) {
  (void)state;
  MPI_Comm dup;
  assert_int_equal(MPI_Comm_dup(MPI_COMM_WORLD, &dup), MPI_SUCCESS);
  MPI_Errhandler custom, now;
  assert_int_equal(MPI_Comm_create_errhandler(custom_handler, &custom), MPI_SUCCESS);
  assert_int_equal(MPI_Comm_set_errhandler(dup, custom), MPI_SUCCESS);

  mg_comm *c = NULL;
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(mg_comm_mpi_wrap(&c, &dup, &d), 0);
  MPI_Comm_get_errhandler(dup, &now);
  int is_return = now == MPI_ERRORS_RETURN;
  MPI_Errhandler_free(&now);

  int rc = 0;
  const char *msg = "";
#ifdef OPEN_MPI
  /* Open MPI's argument check rejects MPI_IN_PLACE as the receive buffer on every rank,
   * before any communication: a collective failure that cannot hang. */
  float one = 1.0f;
  rc = c->ops->all_to_all(c, &one, MPI_IN_PLACE, 1, MG_F32, &d);
  msg = mg_diag_msg(&d);
#endif
  int status = d.status;
  mg_comm_destroy(c);
  MPI_Comm_get_errhandler(dup, &now);
  int restored = now == custom;
  MPI_Errhandler_free(&now);
  MPI_Errhandler_free(&custom);
  MPI_Comm_free(&dup);

  assert_true(is_return);
  assert_true(restored);
  assert_int_equal(g_custom_calls, 0);
#ifdef OPEN_MPI
  assert_int_equal(rc, MLAGEN_EIO);
  assert_int_equal(status, MLAGEN_EIO);
  assert_non_null(strstr(msg, "MPI all-to-all failed: "));
  assert_true(strlen(msg) > strlen("MPI all-to-all failed: "));
#else
  (void)rc, (void)msg, (void)status;
#endif
  mg_diag_clear(&d);
}

/* A sub-communicator: even and odd world ranks, each a group of its own. */
static void test_sub_communicator(void **state) {
  (void)state;
  int color = g_rank % 2;
  MPI_Comm sub;
  assert_int_equal(MPI_Comm_split(MPI_COMM_WORLD, color, g_rank, &sub), MPI_SUCCESS);
  int sub_rank, sub_size;
  MPI_Comm_rank(sub, &sub_rank);
  MPI_Comm_size(sub, &sub_size);
  int members[64];
  for (int s = 0; s < sub_size && s < 64; s++) members[s] = color + 2 * s;

  mg_comm *c = NULL;
  mg_diag d = MG_DIAG_INIT;
  int rc = mg_comm_mpi_wrap(&c, &sub, &d);
  int bad = 0, rank_ok = 0;
  if (!rc) {
    rank_ok = c->rank == sub_rank && c->size == sub_size;
    bad += run_all_to_all(c, members, 5, MG_F64, 1000);
    bad += run_all_gather(c, members, 5, MG_F16, 1000);
    bad += run_reduce_scatter(c, members, 5, MG_F32, 1000);
    mg_comm_destroy(c);
  }
  MPI_Comm_free(&sub);
  assert_int_equal(rc, 0);
  assert_true(rank_ok);
  assert_int_equal(bad, 0);
  mg_diag_clear(&d);
}

/* An inter-communicator is refused, and keeps its error handler. Needs 2 ranks (not
 * registered at 1). */
static void test_inter_communicator(void **state) {
  (void)state;
  int color = g_rank % 2;
  MPI_Comm local, inter;
  assert_int_equal(MPI_Comm_split(MPI_COMM_WORLD, color, g_rank, &local), MPI_SUCCESS);
  /* leaders: local rank 0 of each side, world ranks 0 and 1 */
  assert_int_equal(MPI_Intercomm_create(local, 0, MPI_COMM_WORLD, 1 - color, 77, &inter),
                   MPI_SUCCESS);
  MPI_Errhandler before, after;
  MPI_Comm_get_errhandler(inter, &before);
  mg_comm *c = (mg_comm *)1;
  mg_diag d = MG_DIAG_INIT;
  int rc = mg_comm_mpi_wrap(&c, &inter, &d);
  MPI_Comm_get_errhandler(inter, &after);
  int same = before == after;
  MPI_Errhandler_free(&before);
  MPI_Errhandler_free(&after);
  MPI_Comm_free(&inter);
  MPI_Comm_free(&local);
  assert_int_equal(rc, MLAGEN_EINVAL);
  assert_null(c);
  assert_non_null(strstr(mg_diag_msg(&d), "inter-communicator"));
  assert_true(same);
  mg_diag_clear(&d);
}

int main(int argc, char **argv) {
  mpi_test_begin(&argc, &argv, "test_comm_mpi", &g_rank, &g_size, &g_seed);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_wrap_world),       cmocka_unit_test(test_all_to_all),
      cmocka_unit_test(test_all_gather),       cmocka_unit_test(test_reduce_scatter),
      cmocka_unit_test(test_grouped),          cmocka_unit_test(test_count_zero_null),
      cmocka_unit_test(test_refusals),         cmocka_unit_test(test_error_handler),
      cmocka_unit_test(test_sub_communicator)};
  const struct CMUnitTest multi[] = {cmocka_unit_test(test_inter_communicator)};
  int failed = MPI_TEST_GROUP_MULTI("test_comm_mpi", tests, multi, mpi_test_comm_setup,
                                    mpi_test_comm_teardown);
  free(world_members());
  return mpi_test_end("test_comm_mpi", failed);
}
