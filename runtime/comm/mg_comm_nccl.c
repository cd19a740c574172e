/* mg_comm_nccl.c: the NCCL backend of mg_comm. One file, compiled one of three ways:
 *
 *   MLAGEN_NCCL_DLOPEN  (libmlagen.so and the API's static library) NCCL is not linked:
 *                       the first mg_comm_nccl_wrap loads libnccl.so.2 (or the file in
 *                       $MLAGEN_LIBNCCL) with dlopen and resolves the entry points below
 *                       with dlsym, so the library starts where NCCL is absent and says
 *                       so (MLAGEN_ENONCCL) only when a plan needs it. NCCL's types are
 *                       declared here (the ABI of nccl.h 2.x), so no nccl.h is needed.
 *   MLAGEN_HAVE_NCCL    NCCL linked (nccl.h), the same code over the linked functions.
 *   neither             a stub that says mlagen was built without NCCL. */
#include <stdlib.h>
#include <string.h>

#include "mg_comm.h"
#include "mlagen.h"

#if !defined(MLAGEN_NCCL_DLOPEN) && !defined(MLAGEN_HAVE_NCCL)

void mg_comm_nccl_set_stream(mg_comm *c, void *cuda_stream) { /* no communicator exists */
  (void)c;
  (void)cuda_stream;
}

int mg_comm_nccl_wrap(mg_comm **out, void *nccl_comm, void *cuda_stream, mg_diag *d) {
  (void)nccl_comm;
  (void)cuda_stream;
  if (out) *out = NULL;
  return mg_diag_set(d, MLAGEN_ENONCCL,
                     "the NCCL communicator is unavailable: mlagen was built without NCCL "
                     "(install NCCL and rebuild with -DMLAGEN_WITH_NCCL=ON)");
}

#else
#ifdef MLAGEN_NCCL_DLOPEN
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

/* The parts of nccl.h (2.x; values fixed by its ABI) this backend uses. */
typedef struct ncclComm *ncclComm_t;
typedef struct CUstream_st *cudaStream_t;
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7
} ncclResult_t;
typedef enum { ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9 } ncclDataType_t;
typedef enum { ncclSum = 0 } ncclRedOp_t;
#else
#include <nccl.h>
#endif

/* The NCCL entry points the backend calls. */
typedef struct nccl_api {
  ncclResult_t (*GroupStart)(void);
  ncclResult_t (*GroupEnd)(void);
  ncclResult_t (*Send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*Recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*AllGather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t,
                            cudaStream_t);
  ncclResult_t (*ReduceScatter)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                                ncclComm_t, cudaStream_t);
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t *);
  const char *(*GetErrorString)(ncclResult_t);
  ncclResult_t (*CommCount)(const ncclComm_t, int *);
  ncclResult_t (*CommUserRank)(const ncclComm_t, int *);
} nccl_api;

#ifdef MLAGEN_NCCL_DLOPEN
static nccl_api g_api;
static int g_status = 1; /* 1: not tried; 0: loaded; < 0: the failure, message in g_msg */
static char g_msg[700];
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static void load_locked(void) {
  const char *env = getenv("MLAGEN_LIBNCCL");
  const char *path = env && *env ? env : "libnccl.so.2";
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    snprintf(g_msg, sizeof g_msg,
             "%s not found: %s (sp_size > 1 needs NCCL: install it, put it on the library path "
             "or set MLAGEN_LIBNCCL to its file)", path, e ? e : "dlopen failed");
    g_status = MLAGEN_ENONCCL;
    return;
  }
  static const char *const names[] = {"ncclGroupStart", "ncclGroupEnd", "ncclSend", "ncclRecv",
                                      "ncclAllGather", "ncclReduceScatter",
                                      "ncclCommGetAsyncError", "ncclGetErrorString",
                                      "ncclCommCount", "ncclCommUserRank"};
  void *syms[sizeof names / sizeof *names];
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    dlerror();
    if (!(syms[i] = dlsym(h, names[i]))) {
      const char *e = dlerror();
      snprintf(g_msg, sizeof g_msg, "%s lacks %s: %s (an NCCL 2.x library with point-to-point "
               "send/recv, 2.7 or later, is needed)", path, names[i], e ? e : "no such symbol");
      dlclose(h);
      g_status = MLAGEN_ENONCCL;
      return;
    }
  }
  /* the same order as the struct; object and function pointers converted through memcpy */
  _Static_assert(sizeof(nccl_api) == sizeof syms, "nccl_api has one pointer per name");
  memcpy(&g_api, syms, sizeof g_api);
  g_status = 0; /* the handle stays open for the life of the process */
}

/* The loaded API, or MLAGEN_ENONCCL with the loader's message. Loaded once per process
 * (a failure is remembered too). */
static int get_api(const nccl_api **out, mg_diag *d) {
  pthread_mutex_lock(&g_lock);
  if (g_status == 1) load_locked();
  int st = g_status;
  pthread_mutex_unlock(&g_lock);
  *out = st ? NULL : &g_api;
  return st ? mg_diag_set(d, st, "%s", g_msg) : 0;
}
#else
static const nccl_api g_api = {ncclGroupStart, ncclGroupEnd,  ncclSend,
                               ncclRecv,       ncclAllGather, ncclReduceScatter,
                               ncclCommGetAsyncError, ncclGetErrorString, ncclCommCount,
                               ncclCommUserRank};

static int get_api(const nccl_api **out, mg_diag *d) {
  (void)d;
  *out = &g_api;
  return 0;
}
#endif

typedef struct nccl_comm {
  mg_comm base;
  const nccl_api *api;
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

/* MLAGEN_EIO "NCCL <what> failed: <ncclGetErrorString>" for a failed call. */
static int check(const nccl_api *api, ncclResult_t r, const char *what, mg_diag *d) {
  if (r == ncclSuccess) return 0;
  const char *text = api->GetErrorString(r);
  return mg_diag_set(d, MLAGEN_EIO, "NCCL %s failed: %s (ncclResult_t %d)", what,
                     text ? text : "no description", (int)r);
}

/* all-to-all as grouped point-to-point send/recv, as NCCL documents it. */
static int all_to_all(mg_comm *c, const void *send, void *recv, size_t count, mg_dtype t,
                      mg_diag *d) {
  nccl_comm *n = (nccl_comm *)c;
  const nccl_api *a = n->api;
  size_t bytes = count * mg_dtype_size(t);
  int rc = check(a, a->GroupStart(), "group start", d);
  if (rc) return rc;
  for (int p = 0; p < c->size && !rc; p++) {
    rc = check(a, a->Send((const char *)send + p * bytes, count, nccl_type(t), p, n->comm, n->stream),
               "send", d);
    if (!rc)
      rc = check(a, a->Recv((char *)recv + p * bytes, count, nccl_type(t), p, n->comm, n->stream),
                 "recv", d);
  }
  int end = check(a, a->GroupEnd(), "group end", rc ? NULL : d);
  return rc ? rc : end;
}

static int all_gather(mg_comm *c, const void *send, void *recv, size_t count, mg_dtype t,
                      mg_diag *d) {
  nccl_comm *n = (nccl_comm *)c;
  return check(n->api, n->api->AllGather(send, recv, count, nccl_type(t), n->comm, n->stream),
               "all-gather", d);
}

static int reduce_scatter(mg_comm *c, const void *send, void *recv, size_t count, mg_dtype t,
                          mg_diag *d) {
  nccl_comm *n = (nccl_comm *)c;
  return check(n->api,
               n->api->ReduceScatter(send, recv, count, nccl_type(t), ncclSum, n->comm, n->stream),
               "reduce-scatter", d);
}

static int group_start(mg_comm *c, mg_diag *d) {
  return check(((nccl_comm *)c)->api, ((nccl_comm *)c)->api->GroupStart(), "group start", d);
}

static int group_end(mg_comm *c, mg_diag *d) {
  return check(((nccl_comm *)c)->api, ((nccl_comm *)c)->api->GroupEnd(), "group end", d);
}

static void destroy(mg_comm *c) { free(c); } /* the ncclComm_t stays the caller's */

/* ncclCommGetAsyncError: ncclInProgress is not an error (a nonblocking communicator still
 * initializing or an operation in flight). */
static int nccl_poll(mg_comm *c, mg_diag *d) {
  nccl_comm *n = (nccl_comm *)c;
  ncclResult_t async = ncclSuccess;
  int rc = check(n->api, n->api->CommGetAsyncError(n->comm, &async), "ncclCommGetAsyncError", d);
  if (rc || async == ncclSuccess || async == ncclInProgress) return rc;
  return check(n->api, async, "asynchronous error (ncclCommGetAsyncError)", d);
}

static const mg_comm_ops ops = {all_to_all, all_gather, reduce_scatter, group_start, group_end,
                                destroy, nccl_poll};

int mg_comm_nccl_wrap(mg_comm **out, void *nccl_comm_ptr, void *cuda_stream, mg_diag *d) {
  if (!out) return mg_diag_set(d, MLAGEN_EINVAL, "mg_comm_nccl_wrap: out is NULL");
  *out = NULL;
  if (!nccl_comm_ptr) return mg_diag_set(d, MLAGEN_EINVAL, "nccl_comm is NULL");
  const nccl_api *api;
  int rc = get_api(&api, d);
  if (rc) return rc;
  nccl_comm *n = calloc(1, sizeof *n);
  if (!n) return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
  n->api = api;
  n->comm = (ncclComm_t)nccl_comm_ptr;
  n->stream = (cudaStream_t)cuda_stream;
  rc = check(api, api->CommCount(n->comm, &n->base.size), "ncclCommCount", d);
  if (!rc) rc = check(api, api->CommUserRank(n->comm, &n->base.rank), "ncclCommUserRank", d);
  if (rc) {
    free(n);
    return rc;
  }
  n->base.ops = &ops;
  *out = &n->base;
  return 0;
}

void mg_comm_nccl_set_stream(mg_comm *c, void *cuda_stream) {
  if (c) ((nccl_comm *)c)->stream = (cudaStream_t)cuda_stream;
}
#endif
