/* mg_comm_mpi.c: the MPI backend of mg_comm, for the CPU reference engine. Without MPI
 * (MLAGEN_HAVE_MPI unset) it compiles to a stub that says so.
 *
 * The backend wraps a communicator the caller owns. While wrapped, the communicator's
 * error handler is MPI_ERRORS_RETURN so a failed collective comes back as a status
 * instead of aborting the job; destroy puts the previous handler back. Reduce-scatter sums
 * f32 and f64 with MPI_SUM, and bf16/f16 through f32 (reduce_scatter_16). */
#include <stdlib.h>

#include "mg_comm.h"
#include "mlagen.h"

#ifndef MLAGEN_HAVE_MPI

int mg_comm_mpi_wrap(mg_comm **out, void *mpi_comm, mg_diag *d) {
  (void)mpi_comm;
  if (out) *out = NULL;
  return mg_diag_set(d, MLAGEN_EUNSUPPORTED,
                     "the MPI communicator is unavailable: mlagen was built without MPI "
                     "(install libopenmpi-dev and rebuild)");
}

#else
#include <limits.h>
#include <mpi.h>
#include <stdint.h>

#include "mg_dtype.h" /* bf16/f16 <-> f32 */

typedef struct mpi_comm {
  mg_comm base;
  MPI_Comm comm;         /* the caller's */
  MPI_Errhandler saved;  /* its error handler before the wrap, restored by destroy */
} mpi_comm;

/* MPI_Error_string's text for code rc, as the message of an MLAGEN_EIO. */
static int mpi_fail(int rc, const char *what, mg_diag *d) {
  char text[MPI_MAX_ERROR_STRING + 1];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS || len <= 0) {
    return mg_diag_set(d, MLAGEN_EIO, "MPI %s failed: MPI error code %d", what, rc);
  }
  text[len < MPI_MAX_ERROR_STRING ? len : MPI_MAX_ERROR_STRING] = '\0';
  return mg_diag_set(d, MLAGEN_EIO, "MPI %s failed: %s", what, text);
}

/* The checks every collective shares: a known dtype, a count MPI's int can carry,
 * buffers present when there is something to move. */
static int check_args(const void *send, const void *recv, size_t count, mg_dtype t,
                      const char *what, mg_diag *d) {
  if ((unsigned)t > (unsigned)MG_F16)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: unknown dtype %d", what, (int)t);
  if (count > (size_t)INT_MAX)
    return mg_diag_set(d, MLAGEN_EINVAL,
                       "%s: count %zu exceeds the MPI limit of %d elements per rank", what,
                       count, INT_MAX);
  if (count > 0 && (!send || !recv))
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: NULL %s buffer", what, send ? "receive" : "send");
  return 0;
}

/* bf16 and f16 move as raw 2-byte elements (their sums go through f32: reduce_scatter_16). */
static MPI_Datatype mpi_type(mg_dtype t) {
  switch (t) {
    case MG_F64: return MPI_DOUBLE;
    case MG_BF16:
    case MG_F16: return MPI_UINT16_T;
    default: return MPI_FLOAT;
  }
}

static int all_to_all(mg_comm *c, const void *send, void *recv, size_t count, mg_dtype t,
                      mg_diag *d) {
  int rc = check_args(send, recv, count, t, "all-to-all", d);
  if (rc) return rc;
  MPI_Datatype ty = mpi_type(t);
  rc = MPI_Alltoall(send, (int)count, ty, recv, (int)count, ty, ((mpi_comm *)c)->comm);
  return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, "all-to-all", d);
}

static int all_gather(mg_comm *c, const void *send, void *recv, size_t count, mg_dtype t,
                      mg_diag *d) {
  int rc = check_args(send, recv, count, t, "all-gather", d);
  if (rc) return rc;
  MPI_Datatype ty = mpi_type(t);
  rc = MPI_Allgather(send, (int)count, ty, recv, (int)count, ty, ((mpi_comm *)c)->comm);
  return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, "all-gather", d);
}

/* bf16 and f16 have no MPI sum: each rank widens its [P][count] send buffer to f32,
 * MPI_Reduce_scatter_block sums the f32 blocks, and the sum is rounded to the 16-bit type
 * once (round to nearest even; NaN stays NaN, f16 past 65504 becomes inf). The result is
 * the f32 sum of the ranks' values (in MPI's order) rounded once, as NCCL sums bf16/f16
 * in f32 on the GPU. It needs (P + 1) count f32 elements of scratch per call; before the
 * reduction the ranks agree (one MPI_Allreduce of a flag) that every one of them has it, so
 * a rank out of memory makes every rank return MLAGEN_ENOMEM instead of leaving the others
 * waiting in the collective. */
static int reduce_scatter_16(mpi_comm *m, const void *send, void *recv, size_t count, mg_dtype t,
                             mg_diag *d) {
  const size_t P = (size_t)m->base.size, n = P * count;
  float *wide = malloc((n + count) * sizeof *wide + 1), *sum = wide ? wide + n : NULL;
  int short_here = wide == NULL, short_any = 0;
  int rc = MPI_Allreduce(&short_here, &short_any, 1, MPI_INT, MPI_MAX, m->comm);
  if (rc != MPI_SUCCESS) {
    free(wide);
    return mpi_fail(rc, "reduce-scatter (agreeing on scratch)", d);
  }
  if (short_any) {
    free(wide);
    return mg_diag_set(d, MLAGEN_ENOMEM,
                       "reduce-scatter of %s: out of memory for the f32 scratch of %zu elements "
                       "(%s)", mg_dtype_name(t), n + count,
                       short_here ? "on this rank" : "on another rank");
  }
  const uint16_t *s16 = send;
  for (size_t i = 0; i < n; i++)
    wide[i] = t == MG_BF16 ? mg_bf16_to_f32(s16[i]) : mg_f16_to_f32(s16[i]);
  rc = MPI_Reduce_scatter_block(wide, sum, (int)count, MPI_FLOAT, MPI_SUM, m->comm);
  if (rc == MPI_SUCCESS) {
    uint16_t *r16 = recv;
    for (size_t i = 0; i < count; i++)
      r16[i] = t == MG_BF16 ? mg_f32_to_bf16(sum[i]) : mg_f32_to_f16(sum[i]);
  }
  free(wide);
  return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, "reduce-scatter", d);
}

static int reduce_scatter(mg_comm *c, const void *send, void *recv, size_t count, mg_dtype t,
                          mg_diag *d) {
  int rc = check_args(send, recv, count, t, "reduce-scatter", d);
  if (rc) return rc;
  if (t == MG_BF16 || t == MG_F16) return reduce_scatter_16((mpi_comm *)c, send, recv, count, t, d);
  rc = MPI_Reduce_scatter_block(send, recv, (int)count, mpi_type(t), MPI_SUM,
                                ((mpi_comm *)c)->comm);
  return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, "reduce-scatter", d);
}

/* Restores the error handler and frees the wrapper; the MPI_Comm stays the caller's.
 * After MPI_Finalize there is nothing left to restore. */
static void destroy(mg_comm *c) {
  mpi_comm *m = (mpi_comm *)c;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    MPI_Comm_set_errhandler(m->comm, m->saved);
    MPI_Errhandler_free(&m->saved); /* the reference MPI_Comm_get_errhandler gave us */
  }
  free(m);
}

static const mg_comm_ops ops = {all_to_all,         all_gather,         reduce_scatter,
                                mg_comm_group_none, mg_comm_group_none,
                                destroy, NULL /* poll: collectives here are synchronous */};

int mg_comm_mpi_wrap(mg_comm **out, void *mpi_comm_ptr, mg_diag *d) {
  if (!out) return mg_diag_set(d, MLAGEN_EINVAL, "mg_comm_mpi_wrap: out is NULL");
  *out = NULL;
  if (!mpi_comm_ptr) return mg_diag_set(d, MLAGEN_EINVAL, "mpi_comm is NULL");
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized)
    return mg_diag_set(d, MLAGEN_EINVAL, "MPI is %s: the MPI communicator needs MPI_Init first",
                       finalized ? "already finalized" : "not initialized");
  MPI_Comm comm = *(MPI_Comm *)mpi_comm_ptr;
  if (comm == MPI_COMM_NULL) return mg_diag_set(d, MLAGEN_EINVAL, "mpi_comm is MPI_COMM_NULL");

  /* Switch to MPI_ERRORS_RETURN first, so the queries below report instead of abort. */
  MPI_Errhandler saved;
  int rc = MPI_Comm_get_errhandler(comm, &saved);
  if (rc != MPI_SUCCESS) return mpi_fail(rc, "get error handler", d);
  rc = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  if (rc != MPI_SUCCESS) {
    MPI_Errhandler_free(&saved);
    return mpi_fail(rc, "set error handler", d);
  }
  int inter = 0, rank = 0, size = 0;
  rc = MPI_Comm_test_inter(comm, &inter);
  if (rc == MPI_SUCCESS && inter)
    rc = mg_diag_set(d, MLAGEN_EINVAL, "mpi_comm is an inter-communicator; "
                                       "sequence parallelism needs an intra-communicator");
  else if (rc != MPI_SUCCESS)
    rc = mpi_fail(rc, "test inter-communicator", d);
  if (!rc && (rc = MPI_Comm_rank(comm, &rank)) != MPI_SUCCESS) rc = mpi_fail(rc, "comm rank", d);
  if (!rc && (rc = MPI_Comm_size(comm, &size)) != MPI_SUCCESS) rc = mpi_fail(rc, "comm size", d);
  mpi_comm *m = NULL;
  if (!rc && !(m = calloc(1, sizeof *m))) rc = mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
  if (rc) {
    MPI_Comm_set_errhandler(comm, saved);
    MPI_Errhandler_free(&saved);
    return rc;
  }
  m->base.ops = &ops;
  m->base.rank = rank;
  m->base.size = size;
  m->comm = comm;
  m->saved = saved;
  *out = &m->base;
  return 0;
}
#endif
