/* mg_comm_staged.c: see mg_comm_staged.h. */
#include "mg_comm_staged.h"

#include <stdint.h>
#include <stdlib.h>

#include "mlagen.h"

typedef struct staged {
  mg_comm base;
  mg_comm *host;
  const mg_driver *drv;
  CUstream stream;
  void *buf; /* send staging, then recv staging, one allocation */
  size_t cap;
} staged;

static size_t elem(mg_dtype t) { return mg_dtype_size(t); }

/* Grows the staging to bytes; returns the base or NULL. */
static void *staging(staged *s, size_t bytes) {
  if (bytes > s->cap) {
    void *p = realloc(s->buf, bytes);
    if (!p) return NULL;
    s->buf = p;
    s->cap = bytes;
  }
  return s->buf;
}

typedef int (*host_op)(mg_comm *, const void *, void *, size_t, mg_dtype, mg_diag *);

/* send_n and recv_n elements; the host op in between. */
static int run(mg_comm *c, host_op op, const char *what, const void *send, size_t send_n,
               void *recv, size_t recv_n, size_t count, mg_dtype t, mg_diag *d) {
  staged *s = (staged *)c;
  if ((unsigned)t > (unsigned)MG_F16)
    return mg_diag_set(d, MLAGEN_EINVAL, "staged %s: unknown dtype %d", what, (int)t);
  const size_t es = elem(t), sb = send_n * es, rb = recv_n * es;
  if (count > 0 && (!send || !recv))
    return mg_diag_set(d, MLAGEN_EINVAL, "staged %s: NULL %s buffer", what, send ? "receive" : "send");
  char *h = staging(s, sb + rb + 1);
  if (!h) return mg_diag_set(d, MLAGEN_ENOMEM, "staged %s: out of host memory (%zu bytes)", what, sb + rb);
  const mg_driver *drv = s->drv;
  int rc = mg_driver_fail(drv, drv->cuStreamSynchronize(s->stream), "staged: cuStreamSynchronize", d);
  if (!rc && sb)
    rc = mg_driver_fail(drv, drv->cuMemcpyDtoH(h, (CUdeviceptr)(uintptr_t)send, sb),
                        "staged: cuMemcpyDtoH", d);
  if (rc) return mg_diag_prefix(d, "staged %s", what);
  if ((rc = op(s->host, count ? h : NULL, count ? h + sb : NULL, count, t, d)))
    return mg_diag_prefix(d, "staged %s", what);
  if (rb)
    rc = mg_driver_fail(drv, drv->cuMemcpyHtoD((CUdeviceptr)(uintptr_t)recv, h + sb, rb),
                        "staged: cuMemcpyHtoD", d);
  if (!rc) rc = mg_driver_fail(drv, drv->cuCtxSynchronize(), "staged: cuCtxSynchronize", d);
  return rc ? mg_diag_prefix(d, "staged %s", what) : 0;
}

static int all_to_all(mg_comm *c, const void *send, void *recv, size_t count, mg_dtype t,
                      mg_diag *d) {
  const size_t P = (size_t)c->size;
  return run(c, ((staged *)c)->host->ops->all_to_all, "all-to-all", send, P * count, recv,
             P * count, count, t, d);
}

static int all_gather(mg_comm *c, const void *send, void *recv, size_t count, mg_dtype t,
                      mg_diag *d) {
  return run(c, ((staged *)c)->host->ops->all_gather, "all-gather", send, count, recv,
             (size_t)c->size * count, count, t, d);
}

static int reduce_scatter(mg_comm *c, const void *send, void *recv, size_t count, mg_dtype t,
                          mg_diag *d) {
  return run(c, ((staged *)c)->host->ops->reduce_scatter, "reduce-scatter", send,
             (size_t)c->size * count, recv, count, count, t, d);
}

static void destroy(mg_comm *c) {
  staged *s = (staged *)c;
  free(s->buf);
  free(s);
}

static const mg_comm_ops ops = {all_to_all,         all_gather,         reduce_scatter,
                                mg_comm_group_none, mg_comm_group_none,
                                destroy, NULL /* poll: synchronous */};

int mg_comm_staged_wrap(mg_comm **out, mg_comm *host, const mg_driver *drv, CUstream stream,
                        mg_diag *d) {
  if (!out) return mg_diag_set(d, MLAGEN_EINVAL, "mg_comm_staged_wrap: out is NULL");
  *out = NULL;
  if (!host || !drv)
    return mg_diag_set(d, MLAGEN_EINVAL, "mg_comm_staged_wrap: %s is NULL", host ? "drv" : "host");
  staged *s = calloc(1, sizeof *s);
  if (!s) return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
  s->base.ops = &ops;
  s->base.rank = host->rank;
  s->base.size = host->size;
  s->host = host;
  s->drv = drv;
  s->stream = stream;
  *out = &s->base;
  return 0;
}

void mg_comm_staged_set_stream(mg_comm *c, CUstream stream) {
  if (c) ((staged *)c)->stream = stream;
}
