/* mpi_test_main.h: the common main of the cmocka suites that run under mpirun
 * (test_comm_mpi, test_cpu_mpi, test_cuda_exec_mpi).
 *
 *   int main(int argc, char **argv) {
 *     mpi_test_begin(&argc, &argv, "test_x", &g_rank, &g_size, &g_seed);
 *     const struct CMUnitTest tests[] = {...};
 *     int failed = MPI_TEST_GROUP("test_x", tests, setup, teardown);
 *     (or MPI_TEST_GROUP_MULTI("test_x", tests, multi, setup, teardown): multi, the tests
 *     that need 2 ranks or more, are not registered at 1 rank)
 *     return mpi_test_end("test_x", failed);
 *   }
 *
 * One seed for all ranks (MLAGEN_TEST_SEED, else the time on rank 0, broadcast). Rank 0
 * prints cmocka's report; the other ranks capture theirs and print it, each line prefixed
 * "[rank r] ", only when they fail. The exit status is non-zero when any rank fails. A
 * failed assertion on one rank leaves the others in a collective: each test runs all its
 * collectives first and asserts last. MLAGEN_TEST_FILTER (a cmocka pattern) runs the tests
 * it matches. */
#ifndef MLAGEN_TESTS_MPI_TEST_MAIN_H
#define MLAGEN_TESTS_MPI_TEST_MAIN_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

/* Initializes MPI and sets *rank, *size and the seed every rank shares; rank 0 prints
 * "<prog>: N rank(s), seed S (rerun with MLAGEN_TEST_SEED=S)". */
void mpi_test_begin(int *argc, char ***argv, const char *prog, int *rank, int *size,
                    uint64_t *seed);

/* Runs the cmocka group tests[0..n) named "<prog> rank r of n" with setup and teardown
 * (either may be NULL), capturing the report of ranks other than 0 as described above.
 * Returns this rank's number of failed tests. */
int mpi_test_group(const char *prog, const struct CMUnitTest *tests, size_t n,
                   CMFixtureFunction setup, CMFixtureFunction teardown);
#define MPI_TEST_GROUP(prog, tests, setup, teardown) \
  mpi_test_group((prog), (tests), sizeof(tests) / sizeof((tests)[0]), (setup), (teardown))

/* mpi_test_group over tests[0..n) and, where the world has 2 ranks or more, multi[0..n_multi):
 * the tests that need other ranks are not registered at all at 1 rank (a cmocka skip there
 * would be reported, and counted by ctest, as a pass); rank 0 names them. */
int mpi_test_group_multi(const char *prog, const struct CMUnitTest *tests, size_t n,
                         const struct CMUnitTest *multi, size_t n_multi, CMFixtureFunction setup,
                         CMFixtureFunction teardown);
#define MPI_TEST_GROUP_MULTI(prog, tests, multi, setup, teardown)                               \
  mpi_test_group_multi((prog), (tests), sizeof(tests) / sizeof((tests)[0]), (multi),           \
                       sizeof(multi) / sizeof((multi)[0]), (setup), (teardown))

/* Group fixtures: *state = MPI_COMM_WORLD wrapped by mg_comm_mpi_wrap (an mg_comm *), and
 * its destruction. */
int mpi_test_comm_setup(void **state);
int mpi_test_comm_teardown(void **state);

/* Sums failed over the ranks (rank 0 reports a non-zero total), finalizes MPI and returns
 * the exit status: 0 when no rank failed, else 1. */
int mpi_test_end(const char *prog, int failed);

#endif
