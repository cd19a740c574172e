/* mg_comm_nccl.c: the NCCL backend of mg_comm. Without NCCL (MLAGEN_HAVE_NCCL unset)
 * it compiles to a stub that says so. */
#include <stdlib.h>

#include "mg_comm.h"
#include "mlagen.h"

#ifndef MLAGEN_HAVE_NCCL

int mg_comm_nccl_wrap(mg_comm **out, void *nccl_comm, void *cuda_stream, mg_diag *d) {
  (void)nccl_comm;
  (void)cuda_stream;
  *out = NULL;
  return mg_diag_set(d, MLAGEN_ENONCCL,
                     "the NCCL communicator is unavailable: mlagen was built without NCCL "
                     "(install NCCL and rebuild with -DMLAGEN_WITH_NCCL=ON)");
}

#else
#include <nccl.h>

typedef struct nccl_comm {
  mg_comm base;
  ncclComm_t comm;
  cudaStream_t stream;
} nccl_comm;

static ncclDataType_t nccl_type(mg_dtype t) {
  switch (t) {
    case MG_F64: return ncclFloat64;
    case MG_BF16: return ncclBfloat16;
    case MG_F16: return ncclFloat16;
    default: return ncclFloat32;
  }
}

static int check(ncclResult_t r, const char *what, mg_diag *d) {
  if (r == ncclSuccess) return 0;
  return mg_diag_set(d, MLAGEN_EIO, "NCCL %s failed: %s", what, ncclGetErrorString(r));
}

/* all-to-all as grouped point-to-point send/recv, as NCCL documents it. */
static int all_to_all(mg_comm *c, const void *send, void *recv, size_t count, mg_dtype t,
                      mg_diag *d) {
  nccl_comm *n = (nccl_comm *)c;
  size_t bytes = count * mg_dtype_size(t);
  int rc = check(ncclGroupStart(), "group start", d);
  for (int p = 0; p < c->size && !rc; p++) {
    rc = check(ncclSend((const char *)send + p * bytes, count, nccl_type(t), p, n->comm, n->stream),
               "send", d);
    if (!rc)
      rc = check(ncclRecv((char *)recv + p * bytes, count, nccl_type(t), p, n->comm, n->stream),
                 "recv", d);
  }
  int end = check(ncclGroupEnd(), "group end", rc ? NULL : d);
  return rc ? rc : end;
}

static int all_gather(mg_comm *c, const void *send, void *recv, size_t count, mg_dtype t,
                      mg_diag *d) {
  nccl_comm *n = (nccl_comm *)c;
  return check(ncclAllGather(send, recv, count, nccl_type(t), n->comm, n->stream), "all-gather", d);
}

static int reduce_scatter(mg_comm *c, const void *send, void *recv, size_t count, mg_dtype t,
                          mg_diag *d) {
  nccl_comm *n = (nccl_comm *)c;
  return check(ncclReduceScatter(send, recv, count, nccl_type(t), ncclSum, n->comm, n->stream),
               "reduce-scatter", d);
}

static int group_start(mg_comm *c, mg_diag *d) {
  (void)c;
  return check(ncclGroupStart(), "group start", d);
}

static int group_end(mg_comm *c, mg_diag *d) {
  (void)c;
  return check(ncclGroupEnd(), "group end", d);
}

static void destroy(mg_comm *c) { free(c); } /* the ncclComm_t stays the caller's */

/* ncclCommGetAsyncError: ncclInProgress is not an error (a nonblocking communicator still
 * initializing or an operation in flight). */
static int nccl_poll(mg_comm *c, mg_diag *d) {
  nccl_comm *n = (nccl_comm *)c;
  ncclResult_t async = ncclSuccess;
  int rc = check(ncclCommGetAsyncError(n->comm, &async), "ncclCommGetAsyncError", d);
  if (rc || async == ncclSuccess || async == ncclInProgress) return rc;
  return check(async, "asynchronous error (ncclCommGetAsyncError)", d);
}

static const mg_comm_ops ops = {all_to_all, all_gather, reduce_scatter, group_start, group_end,
                                destroy, nccl_poll};

int mg_comm_nccl_wrap(mg_comm **out, void *nccl_comm_ptr, void *cuda_stream, mg_diag *d) {
  *out = NULL;
  if (!nccl_comm_ptr) return mg_diag_set(d, MLAGEN_EINVAL, "nccl_comm is NULL");
  nccl_comm *n = calloc(1, sizeof *n);
  if (!n) return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
  n->comm = (ncclComm_t)nccl_comm_ptr;
  n->stream = (cudaStream_t)cuda_stream;
  int rc = check(ncclCommCount(n->comm, &n->base.size), "comm count", d);
  if (!rc) rc = check(ncclCommUserRank(n->comm, &n->base.rank), "user rank", d);
  if (rc) {
    free(n);
    return rc;
  }
  n->base.ops = &ops;
  *out = &n->base;
  return 0;
}
#endif
