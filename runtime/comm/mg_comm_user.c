/* mg_comm_user.c: the trainer's callbacks as an mg_comm (mg_comm_user.h). */
#include "mg_comm_user.h"

#include <stdlib.h>

typedef struct user_comm {
  mg_comm base; /* first: an mg_comm * is a user_comm * */
  mlagen_comm_ops ops;
  void *stream;
} user_comm;

mlagen_dtype mg_dtype_to_api(mg_dtype t) {
  switch (t) {
    case MG_F32: return MLAGEN_DTYPE_F32;
    case MG_F64: return MLAGEN_DTYPE_F64;
    case MG_BF16: return MLAGEN_DTYPE_BF16;
    case MG_F16: return MLAGEN_DTYPE_F16;
  }
  return (mlagen_dtype)0;
}

typedef int (*user_fn)(void *user, const void *send, void *recv, size_t count,
                       mlagen_dtype dtype, void *stream);

static int call(mg_comm *c, user_fn fn, const char *what, const void *send, void *recv,
                size_t count, mg_dtype t, mg_diag *d) {
  user_comm *u = (user_comm *)c;
  int r = fn(u->ops.user, send, recv, count, mg_dtype_to_api(t), u->stream);
  if (r)
    return mg_diag_set(d, MLAGEN_EIO, "the caller's %s callback returned %d (rank %d of %d, "
                       "%zu elements of %s)", what, r, c->rank, c->size, count, mg_dtype_name(t));
  return 0;
}

static int all_to_all(mg_comm *c, const void *send, void *recv, size_t count, mg_dtype t,
                      mg_diag *d) {
  return call(c, ((user_comm *)c)->ops.all_to_all, "all_to_all", send, recv, count, t, d);
}

static int all_gather(mg_comm *c, const void *send, void *recv, size_t count, mg_dtype t,
                      mg_diag *d) {
  return call(c, ((user_comm *)c)->ops.all_gather, "all_gather", send, recv, count, t, d);
}

static int reduce_scatter(mg_comm *c, const void *send, void *recv, size_t count, mg_dtype t,
                          mg_diag *d) {
  return call(c, ((user_comm *)c)->ops.reduce_scatter, "reduce_scatter", send, recv, count, t,
              d);
}

static void destroy(mg_comm *c) { free(c); }

static const mg_comm_ops user_ops = {all_to_all, all_gather, reduce_scatter, mg_comm_group_none,
                                     mg_comm_group_none, destroy,
                                     NULL /* poll: the callbacks return when done */};

int mg_comm_user_wrap(mg_comm **out, const mlagen_comm_ops *ops, mg_diag *d) {
  if (!out || !ops)
    return mg_diag_set(d, MLAGEN_EINVAL, "mg_comm_user_wrap: %s is NULL", out ? "ops" : "out");
  *out = NULL;
  if (!ops->all_to_all || !ops->all_gather || !ops->reduce_scatter)
    return mg_diag_set(d, MLAGEN_EINVAL, "comm_ops->%s is NULL: every collective is needed",
                       !ops->all_to_all ? "all_to_all" : !ops->all_gather ? "all_gather"
                                                                           : "reduce_scatter");
  if (ops->size < 1 || ops->rank < 0 || ops->rank >= ops->size)
    return mg_diag_set(d, MLAGEN_EINVAL, "comm_ops->rank = %d is not in [0, comm_ops->size = %d)",
                       ops->rank, ops->size);
  user_comm *u = calloc(1, sizeof *u);
  if (!u) return mg_diag_set(d, MLAGEN_ENOMEM, "mg_comm_user_wrap: out of memory");
  u->base.ops = &user_ops;
  u->base.rank = ops->rank;
  u->base.size = ops->size;
  u->ops = *ops;
  *out = &u->base;
  return 0;
}

void mg_comm_user_set_stream(mg_comm *c, void *stream) { ((user_comm *)c)->stream = stream; }
