/* mg_comm.h: the sequence-parallel collectives behind one interface.
 *
 * A communicator spans the P ranks of a sequence-parallel group. Backends: NCCL on the
 * GPU (wrapping a communicator the trainer already has); MPI and a single-process
 * backend for the CPU executor come with the CPU reference engine. Buffers are device
 * pointers for NCCL. Counts are elements per rank:
 *   all_to_all     send [P][count] -> recv [P][count], block p goes to / comes from rank p
 *   all_gather     send [count]    -> recv [P][count]
 *   reduce_scatter send [P][count] -> recv [count], summed over ranks
 * Every call returns 0 or a negative MLAGEN_E* code with a message in d. On the CPU
 * backends (MPI, local) send and recv are host pointers; all_to_all and all_gather move
 * bf16/f16 as 2-byte elements unchanged; reduce_scatter sums f32 and f64 in their type and
 * bf16/f16 in f32 (each rank's values widened, summed, the sum rounded once to nearest
 * even), as NCCL sums them on the GPU. */
#ifndef MG_COMM_H
#define MG_COMM_H
#include <stddef.h>

#include "mg_diag.h"
#include "mg_dtype.h"

typedef struct mg_comm mg_comm;

typedef struct mg_comm_ops {
  int (*all_to_all)(mg_comm *c, const void *send, void *recv, size_t count, mg_dtype t, mg_diag *d);
  int (*all_gather)(mg_comm *c, const void *send, void *recv, size_t count, mg_dtype t, mg_diag *d);
  int (*reduce_scatter)(mg_comm *c, const void *send, void *recv, size_t count, mg_dtype t,
                        mg_diag *d);
  int (*group_start)(mg_comm *c, mg_diag *d);
  int (*group_end)(mg_comm *c, mg_diag *d);
  void (*destroy)(mg_comm *c);
  /* Optional (NULL when the backend has none): 0 while the communicator is healthy, else
   * the asynchronous error of an operation already queued (NCCL: ncclCommGetAsyncError,
   * MLAGEN_EIO with NCCL's text). Does not block: an executor waiting for a pass calls it
   * in its wait loop, so a dead peer is reported instead of hanging. */
  int (*poll)(mg_comm *c, mg_diag *d);
} mg_comm_ops;

/* group_start / group_end of a backend whose collectives block and complete in call order
 * (local, MPI, staged): there is nothing to group, so both are this no-op. */
static inline int mg_comm_group_none(mg_comm *c, mg_diag *d) {
  (void)c;
  (void)d;
  return 0;
}

struct mg_comm {
  const mg_comm_ops *ops;
  int rank, size;
};

/* Wraps the trainer's NCCL communicator (an ncclComm_t) and CUDA stream (a cudaStream_t,
 * NULL for the default stream); the communicator stays the caller's; size and rank are
 * ncclCommCount's and ncclCommUserRank's. In libmlagen.so (runtime/comm/mg_comm_nccl.c built
 * with MLAGEN_NCCL_DLOPEN) the first call loads libnccl.so.2, or the file named by
 * $MLAGEN_LIBNCCL, with dlopen (once per process; a failure is remembered). Collective
 * failures are MLAGEN_EIO "NCCL <call> failed: <ncclGetErrorString> (ncclResult_t N)"; poll
 * returns ncclCommGetAsyncError's error the same way. Errors: MLAGEN_EINVAL out or
 * nccl_comm NULL; MLAGEN_ENONCCL mlagen built without NCCL (neither linked nor loadable),
 * "libnccl.so.2 not found: <dlerror> ..." or "<file> lacks ncclSend: ..."; MLAGEN_EIO
 * ncclCommCount or ncclCommUserRank failed (NCCL's text); MLAGEN_ENOMEM. */
int mg_comm_nccl_wrap(mg_comm **out, void *nccl_comm, void *cuda_stream, mg_diag *d);

/* Points a communicator from mg_comm_nccl_wrap at another CUDA stream (cudaStream_t, NULL
 * for the default stream) for its later collectives, so one wrap serves every call of a
 * plan whatever stream the call is on. c must come from mg_comm_nccl_wrap. */
void mg_comm_nccl_set_stream(mg_comm *c, void *cuda_stream);

/* Wraps an MPI communicator the caller owns (mpi_comm points to an MPI_Comm: MPI_COMM_WORLD
 * or a sub-communicator; an intra-communicator, after MPI_Init). It must outlive the
 * mg_comm. While wrapped its error handler is MPI_ERRORS_RETURN, so a failed collective
 * returns MLAGEN_EIO with MPI's error text; mg_comm_destroy restores the previous handler
 * (wrap the same MPI_Comm twice only if you destroy in reverse order). As MPI requires,
 * send and recv must not overlap, and every rank passes the same count and dtype. Counts
 * above INT_MAX elements per rank are refused (MLAGEN_EINVAL). A bf16/f16 reduce_scatter
 * takes (P + 1) count f32 elements of scratch on each rank (MLAGEN_ENOMEM on every rank
 * when one lacks it; an extra MPI_Allreduce of a flag decides). Errors: MLAGEN_EUNSUPPORTED
 * when mlagen was built without MPI, MLAGEN_EINVAL for a NULL or MPI_COMM_NULL
 * communicator, an inter-communicator, or MPI not (or no longer) initialized. */
int mg_comm_mpi_wrap(mg_comm **out, void *mpi_comm, mg_diag *d);

/* The single-process communicator: rank 0 of size 1, every collective copies send to recv
 * (send == recv is allowed; a bf16/f16 reduce_scatter too: one value summed and rounded
 * once is itself). Arguments are checked as the MPI backend checks them (an unknown dtype,
 * a NULL buffer with count > 0: MLAGEN_EINVAL), so code tested here runs on P ranks.
 * Errors: MLAGEN_ENOMEM. */
int mg_comm_local_new(mg_comm **out, mg_diag *d);

static inline void mg_comm_destroy(mg_comm *c) {
  if (c) c->ops->destroy(c);
}
#endif
