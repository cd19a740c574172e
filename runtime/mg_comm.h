/* mg_comm.h: the sequence-parallel collectives behind one interface.
 *
 * A communicator spans the P ranks of a sequence-parallel group. Backends: NCCL on the
 * GPU (wrapping a communicator the trainer already has); MPI and a single-process
 * backend for the CPU executor come with the CPU reference engine. Buffers are device
 * pointers for NCCL. Counts are elements per rank:
 *   all_to_all     send [P][count] -> recv [P][count], block p goes to / comes from rank p
 *   all_gather     send [count]    -> recv [P][count]
 *   reduce_scatter send [P][count] -> recv [count], summed over ranks
 * Every call returns 0 or a negative MLAGEN_E* code with a message in d. */
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

static inline void mg_comm_destroy(mg_comm *c) {
  if (c) c->ops->destroy(c);
}
#endif
