/* mpi_test_main.c: see mpi_test_main.h. */
#include "mpi_test_main.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "mg_comm.h"

static int g_rank, g_size;

void mpi_test_begin(int *argc, char ***argv, const char *prog, int *rank, int *size,
                    uint64_t *seed) {
  MPI_Init(argc, argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  unsigned long long s = 0;
  if (g_rank == 0) {
    const char *env = getenv("MLAGEN_TEST_SEED");
    s = env && *env ? strtoull(env, NULL, 0)
                    : (unsigned long long)time(NULL) ^ ((unsigned long long)getpid() << 20);
    printf("%s: %d rank(s), seed %llu (rerun with MLAGEN_TEST_SEED=%llu)\n", prog, g_size, s, s);
    fflush(stdout);
  }
  MPI_Bcast(&s, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  *rank = g_rank, *size = g_size, *seed = s;
}

/* Prints the captured report f, each line prefixed with the rank. */
static void replay(FILE *f) {
  char line[4096];
  rewind(f);
  while (fgets(line, sizeof line, f)) fprintf(stderr, "[rank %d] %s", g_rank, line);
}

int mpi_test_group(const char *prog, const struct CMUnitTest *tests, size_t n,
                   CMFixtureFunction setup, CMFixtureFunction teardown) {
  FILE *capture = NULL;
  int saved_out = -1, saved_err = -1;
  if (g_rank != 0 && (capture = tmpfile()) != NULL) {
    fflush(stdout);
    fflush(stderr);
    saved_out = dup(STDOUT_FILENO);
    saved_err = dup(STDERR_FILENO);
    dup2(fileno(capture), STDOUT_FILENO);
    dup2(fileno(capture), STDERR_FILENO);
  }
  char name[96];
  snprintf(name, sizeof name, "%s rank %d of %d", prog, g_rank, g_size);
  const char *filter = getenv("MLAGEN_TEST_FILTER"); /* a cmocka pattern: a subset */
  if (filter && *filter) cmocka_set_test_filter(filter);
  const int failed = _cmocka_run_group_tests(name, tests, n, setup, teardown);
  if (capture) {
    fflush(stdout);
    fflush(stderr);
    dup2(saved_out, STDOUT_FILENO);
    dup2(saved_err, STDERR_FILENO);
    close(saved_out);
    close(saved_err);
    if (failed) replay(capture);
    fclose(capture);
  }
  return failed;
}

int mpi_test_group_multi(const char *prog, const struct CMUnitTest *tests, size_t n,
                         const struct CMUnitTest *multi, size_t n_multi, CMFixtureFunction setup,
                         CMFixtureFunction teardown) {
  if (g_size < 2) {
    if (g_rank == 0) {
      printf("%s: at 1 rank, not registered (they need 2 ranks or more):", prog);
      for (size_t i = 0; i < n_multi; i++) printf(" %s", multi[i].name);
      printf("\n");
      fflush(stdout);
    }
    return mpi_test_group(prog, tests, n, setup, teardown);
  }
  struct CMUnitTest *all = malloc((n + n_multi) * sizeof *all);
  if (!all) {
    fprintf(stderr, "%s: out of memory\n", prog);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  for (size_t i = 0; i < n; i++) all[i] = tests[i];
  for (size_t i = 0; i < n_multi; i++) all[n + i] = multi[i];
  const int failed = mpi_test_group(prog, all, n + n_multi, setup, teardown);
  free(all);
  return failed;
}

int mpi_test_comm_setup(void **state) {
  mg_comm *c = NULL;
  mg_diag d = MG_DIAG_INIT;
  MPI_Comm world = MPI_COMM_WORLD;
  const int rc = mg_comm_mpi_wrap(&c, &world, &d);
  if (rc) print_error("mg_comm_mpi_wrap: %s\n", mg_diag_msg(&d));
  mg_diag_clear(&d);
  *state = c;
  return rc ? -1 : 0;
}

int mpi_test_comm_teardown(void **state) {
  mg_comm_destroy(*state);
  return 0;
}

int mpi_test_end(const char *prog, int failed) {
  int total = 0;
  MPI_Allreduce(&failed, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0 && total) fprintf(stderr, "%s: %d failure(s) over %d rank(s)\n", prog, total, g_size);
  MPI_Finalize();
  return total ? 1 : 0;
}
