/* mg_comm_user.h: the communicator a trainer hands the C API as callbacks
 * (mlagen_comm_ops, mlagen_plan_set_comm_ops in mlagen.h): its all-to-all, all-gather and
 * reduce-scatter behind the mg_comm interface (mg_comm.h). Buffers are what the executor
 * holds: host pointers for a CPU plan, device pointers for a CUDA plan (then with the
 * call's stream). */
#ifndef MG_COMM_USER_H
#define MG_COMM_USER_H
#include "mg_comm.h"
#include "mlagen.h"

/* Wraps *ops (copied; ops->user stays the caller's); size and rank are ops'. A callback's
 * nonzero return becomes MLAGEN_EIO "the caller's <collective> callback returned N (rank R
 * of P, C elements of <dtype>)". Errors: MLAGEN_EINVAL out or ops NULL, a callback NULL,
 * size < 1, rank outside [0, size); MLAGEN_ENOMEM. */
int mg_comm_user_wrap(mg_comm **out, const mlagen_comm_ops *ops, mg_diag *d);

/* The public mlagen_dtype of t (also what the API's plans report in mlagen_tensor_info). */
mlagen_dtype mg_dtype_to_api(mg_dtype t);

/* The stream later collectives pass to the callbacks (c from mg_comm_user_wrap). */
void mg_comm_user_set_stream(mg_comm *c, void *stream);
#endif
