/* mg_comm_staged.h: a device communicator staged through host memory.
 *
 * Wraps a host communicator (mg_comm_mpi_wrap, mg_comm_local_new: send and recv are host
 * pointers) so that the CUDA executor can run its collectives on device buffers without
 * NCCL: every collective waits for the stream (cuStreamSynchronize: the kernels that wrote
 * the send buffer are done), copies the send buffer to host memory (cuMemcpyDtoH), runs
 * the host collective, copies the result to the device (cuMemcpyHtoD) and waits for the
 * context (cuCtxSynchronize: a pageable host-to-device copy may return before its DMA
 * lands, and it is not ordered with a non-blocking stream). Slow, and meant for that:
 * the multi-rank CUDA path on one machine with one GPU (tests/gpu/forms_check.c --sp 2,
 * two processes sharing the GPU under mpirun) until a machine with several GPUs and NCCL
 * is lent. Numerics are the host communicator's (mg_comm.h: bf16/f16 reduce-scatter summed
 * in f32 and rounded once, as NCCL does).
 *
 * Host staging buffers grow to the largest collective and are kept until destroy. */
#ifndef MG_COMM_STAGED_H
#define MG_COMM_STAGED_H
#include "mg_comm.h"
#include "mg_driver.h"

/* Wraps host (kept, not owned: it must outlive the wrapper; rank and size are its) for
 * device buffers of driver drv (mg_driver_get's table; the CUDA context current at each
 * call) on stream (a CUstream; NULL the default stream). Errors: MLAGEN_EINVAL out, host
 * or drv NULL; MLAGEN_ENOMEM. Collectives return the host communicator's errors, prefixed
 * "staged <collective>: ", ENOMEM for staging memory, and MLAGEN_EDRIVER for a failed
 * copy or synchronization (the call and the CUDA error). */
int mg_comm_staged_wrap(mg_comm **out, mg_comm *host, const mg_driver *drv, CUstream stream,
                        mg_diag *d);

/* The stream later collectives wait for (c from mg_comm_staged_wrap). */
void mg_comm_staged_set_stream(mg_comm *c, CUstream stream);
#endif
