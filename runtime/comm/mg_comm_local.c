/* mg_comm_local.c: the single-process backend of mg_comm, rank 0 of a group of 1.
 *
 * With one rank every collective moves the send buffer to the receive buffer unchanged
 * (memmove, so send == recv is fine). It checks its arguments as the MPI backend does,
 * so code that runs here also runs on P ranks. Reduce-scatter of bf16/f16 is a copy too:
 * the MPI backend sums them in f32 and rounds once, and one value rounded back is itself. */
#include <stdlib.h>
#include <string.h>

#include "mg_comm.h"
#include "mlagen.h"

static int check_args(const void *send, const void *recv, size_t count, mg_dtype t,
                      const char *what, mg_diag *d) {
  if ((unsigned)t > (unsigned)MG_F16)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: unknown dtype %d", what, (int)t);
  if (count > 0 && (!send || !recv))
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: NULL %s buffer", what, send ? "receive" : "send");
  return 0;
}

static int copy(const void *send, void *recv, size_t count, mg_dtype t) {
  if (count > 0 && send != recv) memmove(recv, send, count * mg_dtype_size(t));
  return 0;
}

static int all_to_all(mg_comm *c, const void *send, void *recv, size_t count, mg_dtype t,
                      mg_diag *d) {
  (void)c;
  int rc = check_args(send, recv, count, t, "all-to-all", d);
  return rc ? rc : copy(send, recv, count, t);
}

static int all_gather(mg_comm *c, const void *send, void *recv, size_t count, mg_dtype t,
                      mg_diag *d) {
  (void)c;
  int rc = check_args(send, recv, count, t, "all-gather", d);
  return rc ? rc : copy(send, recv, count, t);
}

static int reduce_scatter(mg_comm *c, const void *send, void *recv, size_t count, mg_dtype t,
                          mg_diag *d) {
  (void)c;
  int rc = check_args(send, recv, count, t, "reduce-scatter", d);
  return rc ? rc : copy(send, recv, count, t);
}

static void destroy(mg_comm *c) { free(c); }

static const mg_comm_ops ops = {all_to_all,         all_gather,         reduce_scatter,
                                mg_comm_group_none, mg_comm_group_none,
                                destroy, NULL /* poll: collectives here are synchronous */};

int mg_comm_local_new(mg_comm **out, mg_diag *d) {
  if (!out) return mg_diag_set(d, MLAGEN_EINVAL, "mg_comm_local_new: out is NULL");
  *out = NULL;
  mg_comm *c = calloc(1, sizeof *c);
  if (!c) return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
  c->ops = &ops;
  c->rank = 0;
  c->size = 1;
  *out = c;
  return 0;
}
