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
 * backends (MPI, local) send and recv are host pointers and reduce_scatter sums f32 or
 * f64 only; bf16/f16 all_to_all and all_gather move the 2-byte elements unchanged. */
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

struct mg_comm {
  const mg_comm_ops *ops;
  int rank, size;
};

/* Wraps the trainer's NCCL communicator (an ncclComm_t) and CUDA stream (a cudaStream_t,
 * NULL for the default stream); the communicator stays the caller's. Errors:
 * MLAGEN_ENONCCL when mlagen was built without NCCL, MLAGEN_EINVAL for a NULL
 * communicator, the NCCL error text otherwise. */
int mg_comm_nccl_wrap(mg_comm **out, void *nccl_comm, void *cuda_stream, mg_diag *d);

/* Wraps an MPI communicator the caller owns (mpi_comm points to an MPI_Comm: MPI_COMM_WORLD
 * or a sub-communicator; an intra-communicator, after MPI_Init). It must outlive the
 * mg_comm. While wrapped its error handler is MPI_ERRORS_RETURN, so a failed collective
 * returns MLAGEN_EIO with MPI's error text; mg_comm_destroy restores the previous handler
 * (wrap the same MPI_Comm twice only if you destroy in reverse order). As MPI requires,
 * send and recv must not overlap, and every rank passes the same count and dtype. Counts
 * above INT_MAX elements per rank are refused (MLAGEN_EINVAL). Errors: MLAGEN_EUNSUPPORTED
 * when mlagen was built without MPI, MLAGEN_EINVAL for a NULL or MPI_COMM_NULL
 * communicator, an inter-communicator, or MPI not (or no longer) initialized. */
int mg_comm_mpi_wrap(mg_comm **out, void *mpi_comm, mg_diag *d);

/* The single-process communicator: rank 0 of size 1, every collective copies send to recv
 * (send == recv is allowed). Arguments are checked as the MPI backend checks them
 * (reduce_scatter of bf16/f16 is MLAGEN_EINVAL), so code tested here runs on P ranks.
 * Errors: MLAGEN_ENOMEM. */
int mg_comm_local_new(mg_comm **out, mg_diag *d);

static inline void mg_comm_destroy(mg_comm *c) {
  if (c) c->ops->destroy(c);
}
#endif
