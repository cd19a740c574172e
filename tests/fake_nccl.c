/* fake_nccl.c: a fake libnccl.so.2 for the NCCL loader of libmlagen.so without NCCL or a GPU
 * (tests/test_nccl_dl.c; MLAGEN_LIBNCCL points here).
 *
 * It exports the NCCL entry points runtime/comm/mg_comm_nccl.c resolves, with nccl.h's ABI
 * (ncclResult_t, ncclDataType_t as int; buffers are host memory), for communicators the
 * test makes with fake_nccl_comm_create(nranks, rank): one process plays the rank, and
 * its peers are mirrors of it, so the data path is a loopback: a send to peer p is what a
 * recv from peer p of the same group receives (at ncclGroupEnd, or at once outside a
 * group); all-gather writes the send buffer into every block; reduce-scatter copies block
 * `rank` of the send buffer (the sum over P mirrors would be P times it: the test's data
 * do not depend on it). With one rank these are exactly NCCL's results.
 *
 * Knobs for the error paths (exported, found by the test with dlsym):
 *   fake_nccl_fail(name)        the entry point called `name` returns ncclInvalidArgument
 *                               from now on (NULL: none fails);
 *   fake_nccl_async_after(c, n) ncclCommGetAsyncError reports ncclRemoteError from its
 *                               n-th call on c (n <= 0: never); calls counted in
 *                               fake_nccl_polls(c);
 *   fake_nccl_group_depth()     ncclGroupStart calls not yet ended. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef int ncclResult_t;
enum { ok = 0, invalid_argument = 4, invalid_usage = 5, remote_error = 6 };

typedef struct fake_comm {
  uint32_t magic;
  int nranks, rank;
  int async_after, polls;
} fake_comm;
#define MAGIC 0x6e63636cu

static const char *g_fail;
static int g_depth;

typedef struct p2p {
  int send; /* 1 send, 0 recv */
  void *buf;
  size_t bytes;
  int peer;
  fake_comm *c;
} p2p;
static p2p g_ops[256];
static int g_n_ops;

static int fails(const char *name) { return g_fail && !strcmp(g_fail, name); }

static size_t type_size(int t) {
  switch (t) {
    case 0: case 1: return 1;          /* int8, uint8 */
    case 6: case 9: return 2;          /* float16, bfloat16 */
    case 2: case 3: case 7: return 4;  /* int32, uint32, float32 */
    case 4: case 5: case 8: return 8;  /* int64, uint64, float64 */
    default: return 0;
  }
}

static int good(const fake_comm *c) { return c && c->magic == MAGIC; }

EXPORT void *fake_nccl_comm_create(int nranks, int rank) {
  fake_comm *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->magic = MAGIC;
  c->nranks = nranks;
  c->rank = rank;
  return c;
}

EXPORT void fake_nccl_comm_free(void *c) { free(c); }
EXPORT void fake_nccl_fail(const char *name) { g_fail = name; }
EXPORT void fake_nccl_async_after(void *c, int n) {
  ((fake_comm *)c)->async_after = n;
  ((fake_comm *)c)->polls = 0;
}
EXPORT int fake_nccl_polls(const void *c) { return ((const fake_comm *)c)->polls; }
EXPORT int fake_nccl_group_depth(void) { return g_depth; }

EXPORT const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ok: return "no error";
    case invalid_argument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case invalid_usage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case remote_error: return "remote process exited or there was a network error";
    default: return "unknown result code";
  }
}

/* Matches every queued send with the queued recv of the same peer and size. */
static ncclResult_t flush(void) {
  ncclResult_t rc = ok;
  for (int i = 0; i < g_n_ops; i++) {
    if (!g_ops[i].send) continue;
    int j = 0;
    for (; j < g_n_ops; j++)
      if (!g_ops[j].send && g_ops[j].c == g_ops[i].c && g_ops[j].peer == g_ops[i].peer &&
          g_ops[j].bytes == g_ops[i].bytes && g_ops[j].buf)
        break;
    if (j == g_n_ops) {
      rc = invalid_usage; /* a send without its recv would hang NCCL */
      continue;
    }
    if (g_ops[i].bytes) memcpy(g_ops[j].buf, g_ops[i].buf, g_ops[i].bytes);
    g_ops[j].buf = NULL; /* used */
  }
  for (int j = 0; j < g_n_ops; j++)
    if (!g_ops[j].send && g_ops[j].buf) rc = invalid_usage;
  g_n_ops = 0;
  return rc;
}

EXPORT ncclResult_t ncclGroupStart(void) {
  if (fails("ncclGroupStart")) return invalid_argument;
  g_depth++;
  return ok;
}

EXPORT ncclResult_t ncclGroupEnd(void) {
  if (g_depth <= 0) return invalid_usage;
  g_depth--;
  if (fails("ncclGroupEnd")) {
    g_n_ops = 0;
    return invalid_argument;
  }
  return g_depth ? ok : flush();
}

static ncclResult_t queue(int send, const void *buf, size_t count, int t, int peer, void *comm) {
  fake_comm *c = comm;
  if (fails(send ? "ncclSend" : "ncclRecv")) return invalid_argument;
  if (!good(c) || !type_size(t) || peer < 0 || peer >= c->nranks || g_n_ops == 256)
    return invalid_argument;
  g_ops[g_n_ops++] = (p2p){send, (void *)buf, count * type_size(t), peer, c};
  return g_depth ? ok : flush();
}

EXPORT ncclResult_t ncclSend(const void *buf, size_t count, int t, int peer, void *comm,
                             void *stream) {
  (void)stream;
  return queue(1, buf, count, t, peer, comm);
}

EXPORT ncclResult_t ncclRecv(void *buf, size_t count, int t, int peer, void *comm, void *stream) {
  (void)stream;
  return queue(0, buf, count, t, peer, comm);
}

EXPORT ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, int t, void *comm,
                                  void *stream) {
  (void)stream;
  fake_comm *c = comm;
  if (fails("ncclAllGather")) return invalid_argument;
  if (!good(c) || !type_size(t)) return invalid_argument;
  const size_t b = count * type_size(t);
  for (int p = 0; p < c->nranks && b; p++) memmove((char *)recv + (size_t)p * b, send, b);
  return ok;
}

EXPORT ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, int t, int op,
                                      void *comm, void *stream) {
  (void)stream;
  fake_comm *c = comm;
  if (fails("ncclReduceScatter")) return invalid_argument;
  if (!good(c) || !type_size(t) || op != 0) return invalid_argument;
  const size_t b = count * type_size(t);
  if (b) memmove(recv, (const char *)send + (size_t)c->rank * b, b);
  return ok;
}

EXPORT ncclResult_t ncclCommGetAsyncError(void *comm, ncclResult_t *async) {
  fake_comm *c = comm;
  if (fails("ncclCommGetAsyncError")) return invalid_argument;
  if (!good(c) || !async) return invalid_argument;
  c->polls++;
  *async = c->async_after > 0 && c->polls >= c->async_after ? remote_error : ok;
  return ok;
}

EXPORT ncclResult_t ncclCommCount(const void *comm, int *count) {
  const fake_comm *c = comm;
  if (fails("ncclCommCount")) return invalid_argument;
  if (!good(c) || !count) return invalid_argument;
  *count = c->nranks;
  return ok;
}

EXPORT ncclResult_t ncclCommUserRank(const void *comm, int *rank) {
  const fake_comm *c = comm;
  if (fails("ncclCommUserRank")) return invalid_argument;
  if (!good(c) || !rank) return invalid_argument;
  *rank = c->rank;
  return ok;
}
