/* test_comm_staged.c: runtime/exec/mg_comm_staged.c on the fake driver (tests/fake_cuda.c:
 * "device" memory is host memory, copies are memcpy), so the staging path runs here:
 * every collective (all-to-all, all-gather, reduce-scatter) in bf16, f16, f32 and f64,
 * through the staged wrapper on cuMemAlloc'd buffers, gives bit for bit what the host
 * communicator gives on host buffers; the stream is synchronized before the copy out and
 * the context after the copy in; a failed cuStreamSynchronize or cuMemcpyDtoH is
 * MLAGEN_EDRIVER naming the collective and the call (injected on every rank, so none is
 * left in a collective); argument errors.
 *
 *   test_comm_staged [local]     one process, mg_comm_local (ctest test_comm_staged)
 *   mpirun -np N test_comm_staged mpi   (built with MPI; ctest test_comm_staged_mpi_npN)
 * It loads the fake driver itself (tests/fake_driver.h). Exit 0 when every check passed. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef MLAGEN_HAVE_MPI
#include <mpi.h>
#endif

#include "fake_driver.h"
#include "mg_comm_staged.h"
#include "mg_safetensors.h"
#include "mlagen.h"

static int g_fail, g_rank;
#define CHECK(cond, ...)                                                \
  do {                                                                  \
    if (!(cond)) {                                                      \
      fprintf(stderr, "[rank %d] %s:%d: ", g_rank, __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                                     \
      fputc('\n', stderr);                                              \
      g_fail++;                                                         \
    }                                                                   \
  } while (0)

static fake_cuda fake; /* the fake driver's hooks */

typedef int (*coll)(mg_comm *, const void *, void *, size_t, mg_dtype, mg_diag *);

/* One collective k (0 all-to-all, 1 all-gather, 2 reduce-scatter) of count elements of t:
 * the staged result on device buffers equals the host communicator's on host buffers. */
static void one(const mg_driver *drv, mg_comm *host, mg_comm *st, int k, size_t count, mg_dtype t) {
  const size_t P = (size_t)host->size, es = mg_dtype_size(t);
  const size_t sn = k == 1 ? count : P * count, rn = k == 0 ? P * count : k == 1 ? P * count : count;
  unsigned char *send = malloc(sn * es + 1), *want = malloc(rn * es + 1), *got = malloc(rn * es + 1);
  for (size_t i = 0; i < sn; i++) { /* small values: a sum of P of them is exact in any type */
    const double v = (double)((int)((i * 7 + (size_t)g_rank * 13) % 17) - 8) / 4;
    if (t == MG_F64) ((double *)send)[i] = v;
    else if (t == MG_F32) ((float *)send)[i] = (float)v;
    else ((uint16_t *)send)[i] = t == MG_BF16 ? mg_f32_to_bf16((float)v) : mg_f32_to_f16((float)v);
  }
  const coll hc = k == 0 ? host->ops->all_to_all : k == 1 ? host->ops->all_gather : host->ops->reduce_scatter;
  const coll sc = k == 0 ? st->ops->all_to_all : k == 1 ? st->ops->all_gather : st->ops->reduce_scatter;
  mg_diag d = MG_DIAG_INIT;
  CHECK(!hc(host, send, want, count, t, &d), "host collective %d: %s", k, mg_diag_msg(&d));
  CUdeviceptr ds = 0, dr = 0;
  CHECK(!drv->cuMemAlloc(&ds, sn * es + 1) && !drv->cuMemAlloc(&dr, rn * es + 1), "cuMemAlloc");
  drv->cuMemcpyHtoD(ds, send, sn * es);
  drv->cuMemsetD8(dr, 0xff, rn * es);
  const int sync0 = fake.count("cuStreamSynchronize"), d2h0 = fake.count("cuMemcpyDtoH");
  int rc = sc(st, (void *)(uintptr_t)ds, (void *)(uintptr_t)dr, count, t, &d);
  CHECK(!rc, "staged collective %d %s: %s", k, mg_dtype_name(t), mg_diag_msg(&d));
  CHECK(fake.count("cuStreamSynchronize") == sync0 + 1, "one stream synchronization per collective");
  CHECK(fake.count("cuMemcpyDtoH") == d2h0 + (sn ? 1 : 0), "one copy out per collective");
  drv->cuMemcpyDtoH(got, dr, rn * es);
  CHECK(memcmp(got, want, rn * es) == 0, "collective %d %s count %zu: staged result differs", k,
        mg_dtype_name(t), count);
  drv->cuMemFree(ds);
  drv->cuMemFree(dr);
  mg_diag_clear(&d);
  free(send), free(want), free(got);
}

static void run_all(const mg_driver *drv, mg_comm *host) {
  mg_comm *st = NULL;
  mg_diag d = MG_DIAG_INIT;
  CHECK(!mg_comm_staged_wrap(&st, host, drv, NULL, &d), "wrap: %s", mg_diag_msg(&d));
  if (!st) return;
  CHECK(st->rank == host->rank && st->size == host->size, "rank/size are the host communicator's");
  const mg_dtype types[] = {MG_BF16, MG_F16, MG_F32, MG_F64};
  for (int k = 0; k < 3; k++)
    for (int ti = 0; ti < 4; ti++)
      for (size_t count = 1; count <= 1000; count *= 31) one(drv, host, st, k, count, types[ti]);
  CHECK(!st->ops->group_start(st, &d) && !st->ops->group_end(st, &d), "group is a no-op");

  /* failures, injected on every rank before anything is exchanged */
  CUdeviceptr ds = 0, dr = 0;
  drv->cuMemAlloc(&ds, 4096);
  drv->cuMemAlloc(&dr, 4096);
  mg_comm_staged_set_stream(st, (CUstream)(uintptr_t)0x10);
  fake.inject("cuStreamSynchronize", CUDA_ERROR_LAUNCH_FAILED);
  int rc = st->ops->all_gather(st, (void *)(uintptr_t)ds, (void *)(uintptr_t)dr, 4, MG_BF16, &d);
  CHECK(rc == MLAGEN_EDRIVER && strstr(mg_diag_msg(&d), "staged all-gather") &&
            strstr(mg_diag_msg(&d), "cuStreamSynchronize") && strstr(mg_diag_msg(&d), "CUDA_ERROR_LAUNCH_FAILED"),
        "stream failure: %d %s", rc, mg_diag_msg(&d));
  fake.inject("cuMemcpyDtoH", CUDA_ERROR_ILLEGAL_ADDRESS);
  rc = st->ops->reduce_scatter(st, (void *)(uintptr_t)ds, (void *)(uintptr_t)dr, 4, MG_F32, &d);
  CHECK(rc == MLAGEN_EDRIVER && strstr(mg_diag_msg(&d), "staged reduce-scatter") &&
            strstr(mg_diag_msg(&d), "cuMemcpyDtoH"),
        "copy failure: %d %s", rc, mg_diag_msg(&d));
  rc = st->ops->all_to_all(st, NULL, (void *)(uintptr_t)dr, 4, MG_F32, &d);
  CHECK(rc == MLAGEN_EINVAL && strstr(mg_diag_msg(&d), "NULL send"), "NULL send: %s", mg_diag_msg(&d));
  rc = st->ops->all_to_all(st, (void *)(uintptr_t)ds, (void *)(uintptr_t)dr, 4, (mg_dtype)99, &d);
  CHECK(rc == MLAGEN_EINVAL && strstr(mg_diag_msg(&d), "unknown dtype"), "dtype: %s", mg_diag_msg(&d));
  drv->cuMemFree(ds);
  drv->cuMemFree(dr);
  mg_comm *none = NULL;
  CHECK(mg_comm_staged_wrap(&none, NULL, drv, NULL, &d) == MLAGEN_EINVAL && !none, "NULL host");
  CHECK(mg_comm_staged_wrap(&none, host, NULL, NULL, &d) == MLAGEN_EINVAL && !none, "NULL drv");
  mg_comm_destroy(st);
  mg_diag_clear(&d);
}

int main(int argc, char **argv) {
  const int mpi = argc > 1 && strcmp(argv[1], "mpi") == 0;
  const char *mode = argc > 1 ? argv[1] : "local";
  if (!mpi && strcmp(mode, "local")) {
    fprintf(stderr, "usage: test_comm_staged local|mpi\n");
    return 2;
  }
  mg_diag d = MG_DIAG_INIT;
  const mg_driver *drv = NULL;
  if (fake_driver_open(&fake)) return 1;
  if (mg_driver_get(&drv, &d)) {
    fprintf(stderr, "test_comm_staged: %s\n", mg_diag_msg(&d));
    return 1;
  }
  mg_comm *host = NULL;
  if (mpi) {
#ifdef MLAGEN_HAVE_MPI
    MPI_Init(&argc, &argv);
    MPI_Comm world = MPI_COMM_WORLD;
    if (mg_comm_mpi_wrap(&host, &world, &d)) {
      fprintf(stderr, "mpi wrap: %s\n", mg_diag_msg(&d));
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    g_rank = host->rank;
#else
    fprintf(stderr, "test_comm_staged: built without MPI\n");
    return 1;
#endif
  } else if (mg_comm_local_new(&host, &d)) {
    fprintf(stderr, "local: %s\n", mg_diag_msg(&d));
    return 1;
  }
  run_all(drv, host);
  const int size = host->size;
  mg_comm_destroy(host);
  int bad = g_fail;
#ifdef MLAGEN_HAVE_MPI
  if (mpi) {
    MPI_Allreduce(&g_fail, &bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Finalize();
  }
#endif
  if (g_rank == 0)
    printf("test_comm_staged %s (%d ranks): %s (%d failed checks)\n", mode, size,
           bad ? "FAILED" : "ok", bad);
  mg_diag_clear(&d);
  return bad ? 1 : 0;
}
