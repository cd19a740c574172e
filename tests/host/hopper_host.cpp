/* hopper_host.cpp: the host executor's emulation of the Hopper PTX of
 * templates/mla_device_sm90.cuh (see hopper_host.h and tests/host/README.md, "Hopper").
 * Not a translation unit of its own: cuda_host.cpp includes it after its scheduler and PTX
 * sections, so it uses the scheduler's state (Launch, Block, Fiber) directly. */
#include "mg_host_tmap.h"

namespace {

/* One TMA load in flight: the bytes of its box as they will lie in shared memory
 * ([off, off + size) of the dynamic buffer, swizzle applied), read at issue. */
struct TmaOp {
  unsigned off, size;
  unsigned long long *bar;
  bool eager;
  int line;
  unsigned char *data;
};

/* Up to 1024 threads, one bit each. */
struct ThreadSet {
  uint64_t w[16];
  void add(unsigned t) { w[t / 64] |= 1ull << (t % 64); }
  bool meets(const ThreadSet &o) const {
    for (unsigned i = 0; i < 16; ++i)
      if (w[i] & o.w[i]) return true;
    return false;
  }
  void merge(const ThreadSet &o) {
    for (unsigned i = 0; i < 16; ++i) w[i] |= o.w[i];
  }
};

/* A TMA load that landed ([off, off + size) of the dynamic buffer) while its mbarrier bar was
 * in the phase of parity `parity`; obs: the threads it is visible to (those whose wait on bar
 * returned for that phase, and through __syncthreads and named barriers those that synced
 * with one of them since). A wgmma reading those bytes for a warpgroup none of whose threads
 * is in obs is reported. Kept until a later landing covers its bytes. */
struct Landed {
  unsigned off, size;
  unsigned long long *bar;
  unsigned parity;
  int line;
  ThreadSet obs;
};

/* Generic-proxy stores made visible to the async proxy by thread `thread`'s
 * fence.proxy.async: [lo, hi) spans every byte that fence changed in the async view. obs: the
 * threads the data is ordered before (its publisher, and through __syncthreads and named
 * barriers those that synced with one of them since). A wgmma issued by a thread of another
 * warp that is not in obs and reads those bytes is reported: another warp's stores reach a
 * wgmma only through a barrier (PTX memory model), which a completed warpgroup op is not. */
struct Pub {
  unsigned lo, hi, thread;
  int line;
  ThreadSet obs;
};

/* An mbarrier's initialization: by thread `thread`, the `seq`-th of the block's. Visible to
 * thread u when u == thread or HThread::know of u >= seq. */
struct MbarInit {
  unsigned long long *bar;
  unsigned thread, seq;
  int line;
};

/* One wgmma.mma_async of a warpgroup, with what the 128 threads gave. The accumulator
 * registers (d, n / 2 floats a thread) are the operation's from issue to the wait_group that
 * delivers it (PTX ISA: accessing them in between is undefined): at issue their values move
 * to in[t] and d is filled with WG_POISON (a NaN), so a read before the wait sees NaN, and a
 * write is reported at the next issue on d or at the delivery; chained[t]: d was already the
 * accumulator of an earlier op still in flight for thread t (k-steps into one accumulator),
 * whose result that op hands to in[t] when it is applied. */
struct WgOp {
  int kind, n, scale_d, line;
  bool a_regs;
  unsigned long long da, db, group;
  unsigned a[128][4];
  float *d[128];
  float *in;          /* [128][n / 2]: thread t's accumulator input, then its result */
  bool chained[128];
  bool applied[128];
  unsigned napplied;
  /* Its operands as floats, A [64][16] then B as [16][8][n/8] (element (col, k) at
   * (k * 8 + col % 8) * (n / 8) + col / 8: a thread's accumulators of one kind lie 8 columns
   * apart, so their B values for one k are adjacent), decoded from the async view of
   * generation opnd_gen (HBlock::view_gen) by the first thread that applies it there: the 128
   * threads read the same elements (each B element 64 times, each A element 4 times). */
  float *opnd;
  unsigned long long opnd_gen;
  /* The shared-memory operands as the async view held them when the first thread of the
   * warpgroup issued it (same layout as opnd; A only when from shared memory): the hardware
   * may read them at any point from that issue to the wait that delivers the result, so each
   * decode at a delivery must find the same values (a write, or a fence.proxy.async
   * publishing one, after the first issue and before the last delivery is a race: a missing
   * barrier before the wgmma, or before the operand's next rewrite after it). */
  float *opnd_issue;
};

void wgop_free(WgOp *op) {
  if (op) {
    free(op->opnd);
    free(op->opnd_issue);
    free(op->in);
  }
  free(op);
}

/* The accumulator registers' value between a wgmma.mma_async and its delivery: a signalling
 * NaN. Copies keep its bits; any arithmetic on it (d *= s, d += x, fmaf) gives a quiet NaN,
 * so a read-modify-write in between is seen as a write (a quiet NaN would come out of it
 * unchanged and the write would be lost unreported). */
const uint32_t WG_POISON = 0x7f90adadu;
void wg_poison(float *d, unsigned n) {
  for (unsigned i = 0; i < n; ++i) memcpy(d + i, &WG_POISON, 4);
}
/* The first of d[0..n) that is not WG_POISON, or n. */
unsigned wg_unpoisoned(const float *d, unsigned n) {
  for (unsigned i = 0; i < n; ++i) {
    uint32_t v;
    memcpy(&v, d + i, 4);
    if (v != WG_POISON) return i;
  }
  return n;
}

/* A warpgroup rendezvous (wgmma.mma_async, setmaxnreg) in progress. */
struct WgMeet {
  unsigned arrived;
  unsigned rlo[2], rhi[2]; /* wgmma: the shared bytes operands A and B span (lo >= hi: none) */
  int what, line, n, kind, scale_d;
  bool a_regs;
  unsigned long long da, db, committed;
  WgOp *op;
};

/* One TMA store or reduction in flight (cp.async.bulk.tensor / cp.reduce.async.bulk.tensor):
 * its map, box coordinates and shared source; data is the box as read from the async view
 * (NULL until read). group: the issuing thread's bulk commit count at issue. */
struct BulkOp {
  mg_host_tmap t;
  int c[MG_HOST_TMAP_MAX_RANK], reduce, line;
  unsigned off, size, thread;
  unsigned long long group;
  unsigned char *data;
};

/* A named barrier (bar.sync / bar.arrive id): the current instance's arrivals and count. */
struct NamedBar {
  unsigned arrived, count;
  int line;
  unsigned long long gen;
  unsigned know;        /* the largest HThread::know (or own init) of the current instance's arrivals */
  unsigned know_done[2]; /* that of instance g, in know_done[g & 1], once it completed */
  ThreadSet arr, syn;   /* the current instance's arrivals, and those of them in bar.sync */
};

struct HThread {
  unsigned long long committed; /* wgmma groups committed */
  unsigned long long issued;    /* wgmma.mma_async issued (its next one is the warpgroup's
                                   issue number `issued`: HBlock::pend) */
  unsigned long long bulk_committed; /* bulk groups committed */
  bool fenced;                  /* a wgmma.fence since the last wait_group that delivered */
  int line;                     /* line of the mbarrier wait or rendezvous it sleeps at */
  unsigned know;  /* mbarrier inits 1..know (MbarInit::seq) are visible to it (a barrier since) */
  unsigned own;   /* its own latest mbarrier init's seq */
};

/* Per resident block slot. */
struct HBlock {
  TmaOp *tma;
  unsigned ntma, cap;
  unsigned char *view; /* the async proxy's view of the dynamic shared memory */
  bool view_fresh;
  unsigned long long view_gen; /* counts the writes to view: a decoded wgmma operand is stale */
  WgMeet *meet;            /* per warpgroup: the setmaxnreg rendezvous */
  /* per warpgroup: the wgmma.mma_async issued by some but not yet all of its 128 threads,
   * oldest first (npend[w] of them, at most 64; pend[w * 64 + i] is issue number
   * done_seq[w] + i). A thread issues without waiting for the others (the ISA does not order
   * the warps of a warpgroup at a wgmma); the op exists once all 128 have issued, and a
   * wait_group that needs it sleeps until then. */
  WgMeet *pend;
  unsigned *npend;
  unsigned long long *done_seq;
  WgOp **ops;              /* per warpgroup: issued ops, oldest first (nops[w] of them) */
  unsigned *nops, *capops;
  HThread *th;
  BulkOp *bulk;
  unsigned nbulk, bulkcap;
  NamedBar nb[16];
  Landed *landed; /* landed TMA loads, with the threads they are visible to */
  Pub *pubs;      /* fence.proxy.async publications not yet visible to every thread */
  unsigned npubs, pubcap;
  unsigned nlanded, landcap;
  MbarInit *inits; /* the mbarriers initialized, one entry per barrier (the latest init) */
  unsigned ninits, initcap, init_seq;
};

struct HState {
  Launch *L;
  HBlock *b;
};
HState g_h;

enum { W_WGMMA = 1, W_SETMAXNREG = 2 };

HBlock *hblock(Launch *L, Block *B) {
  if (g_h.L != L) {
    g_h.L = L;
    g_h.b = (HBlock *)calloc(L->nres, sizeof(HBlock));
    if (!g_h.b) fail(L, MG_HOST_E_NOMEM, "out of memory for the Hopper emulation");
  }
  HBlock *h = &g_h.b[B - L->blocks];
  if (!h->th) {
    unsigned nwg = (L->nthreads + 127) / 128;
    h->th = (HThread *)calloc(L->nthreads, sizeof(HThread));
    h->meet = (WgMeet *)calloc(nwg, sizeof(WgMeet));
    h->pend = (WgMeet *)calloc(nwg * 64, sizeof(WgMeet));
    h->npend = (unsigned *)calloc(nwg, sizeof(unsigned));
    h->done_seq = (unsigned long long *)calloc(nwg, sizeof(unsigned long long));
    h->ops = (WgOp **)calloc(nwg * 64, sizeof(WgOp *));
    h->nops = (unsigned *)calloc(nwg, sizeof(unsigned));
    h->capops = (unsigned *)calloc(nwg, sizeof(unsigned));
    h->view = (unsigned char *)malloc(g_smem.dyn_size ? g_smem.dyn_size : 1);
    h->view_fresh = true;
    if (!h->th || !h->meet || !h->pend || !h->npend || !h->done_seq || !h->ops || !h->nops || !h->view)
      fail(L, MG_HOST_E_NOMEM, "out of memory for the Hopper emulation");
  }
  if (h->view_fresh) {
    memset(h->view, L->nan_fill ? 0xff : 0, g_smem.dyn_size);
    h->view_fresh = false;
    h->view_gen++;
  }
  return h;
}

void hb_reset(Launch *L, HBlock *h) {
  for (unsigned i = 0; i < h->ntma; ++i) free(h->tma[i].data);
  h->ntma = 0;
  for (unsigned i = 0; i < h->nbulk; ++i) free(h->bulk[i].data);
  h->nbulk = 0;
  h->nlanded = 0;
  h->npubs = 0;
  h->ninits = 0;
  h->init_seq = 0;
  memset(h->nb, 0, sizeof h->nb);
  if (h->th) {
    unsigned nwg = (L->nthreads + 127) / 128;
    for (unsigned w = 0; w < nwg; ++w) {
      for (unsigned i = 0; i < h->nops[w]; ++i) wgop_free(h->ops[w * 64 + i]);
      h->nops[w] = 0;
      wgop_free(h->meet[w].op);
      memset(&h->meet[w], 0, sizeof h->meet[w]);
      for (unsigned i = 0; i < h->npend[w]; ++i) wgop_free(h->pend[w * 64 + i].op);
      memset(h->pend + w * 64, 0, 64 * sizeof *h->pend);
      h->npend[w] = 0;
      h->done_seq[w] = 0;
    }
    memset(h->th, 0, L->nthreads * sizeof(HThread));
  }
  h->view_fresh = true;
}

/* ---- hooks the scheduler calls -------------------------------------------------------- */
void hopper_block_start(Launch *L, Block *B) {
  if (g_h.L == L) hb_reset(L, &g_h.b[B - L->blocks]);
}

void landed_sync(HBlock *h, const ThreadSet *arr, const ThreadSet *syncers);

/* A __syncthreads of B completed: every mbarrier init made so far, and every landed TMA load
 * visible to one of its threads, is visible to all of them. */
void hopper_syncthreads_done(Launch *L, Block *B) {
  if (g_h.L != L) return;
  HBlock *h = &g_h.b[B - L->blocks];
  if (!h->th) return;
  for (unsigned i = 0; i < L->nthreads; ++i) h->th[i].know = h->init_seq;
  landed_sync(h, nullptr, nullptr);
  h->npubs = 0; /* every publication is now ordered before every thread */
}

void hopper_launch_end(Launch *L) {
  if (g_h.L != L) return;
  for (unsigned s = 0; s < L->nres; ++s) {
    HBlock *h = &g_h.b[s];
    hb_reset(L, h);
    free(h->tma), free(h->bulk), free(h->landed), free(h->pubs), free(h->inits), free(h->view), free(h->meet), free(h->pend), free(h->npend), free(h->done_seq), free(h->ops), free(h->nops), free(h->capops);
    free(h->th);
  }
  free(g_h.b);
  g_h.L = nullptr;
  g_h.b = nullptr;
}

/* Wakes the fibers of B that sleep on key (an mbarrier's or a rendezvous' address). */
void hwake(Block *B, unsigned long long key) {
  for (unsigned i = 0; i < g_launch->nthreads; ++i)
    if (B->fibers[i].state == F_WAIT_ASYNC && B->fibers[i].wait == key) ready_push(B, &B->fibers[i]);
}

void hsleep(Launch *L, Fiber *f, unsigned long long key, int line) {
  f->state = F_WAIT_ASYNC;
  f->wait = key;
  if (g_h.L == L) g_h.b[f->blk - L->blocks].th[f->index].line = line;
  am_try(f->blk, f->warp, nullptr);
  switch_away(L, f);
}

/* ---- mbarrier -------------------------------------------------------------------------- */
struct Mbar {
  unsigned pending, expected, phase;
  long tx;
};
const unsigned long long MBAR_MAGIC = 2ull;

bool mbar_read(const unsigned long long *bar, Mbar *m) {
  unsigned long long v = *bar;
  if (v >> 62 != MBAR_MAGIC) return false;
  m->pending = (unsigned)(v & 0xfffff);
  m->expected = (unsigned)((v >> 20) & 0xfffff);
  long tx = (long)((v >> 40) & 0x1fffff);
  m->tx = tx >= (1l << 20) ? tx - (1l << 21) : tx;
  m->phase = (unsigned)((v >> 61) & 1);
  return true;
}

void mbar_write(unsigned long long *bar, const Mbar &m) {
  *bar = (unsigned long long)m.pending | ((unsigned long long)m.expected << 20) |
         ((unsigned long long)(m.tx & 0x1fffff) << 40) | ((unsigned long long)m.phase << 61) |
         (MBAR_MAGIC << 62);
}

Mbar mbar_get(Launch *L, Fiber *f, unsigned long long *bar, const char *what, int line) {
  if ((uintptr_t)bar % 8 || !smem_contains(bar, 8))
    ptx_fail(L, f, what, line, "mbarrier %p is not an 8-byte aligned shared-memory object",
             (void *)bar);
  Mbar m;
  if (!mbar_read(bar, &m))
    ptx_fail(L, f, what, line, "mbarrier %p is not initialized (mbarrier.init)", (void *)bar);
  return m;
}

/* Thread f uses the initialized mbarrier bar (what, line): reported when its initialization
 * by another thread is not yet visible to f, i.e. f and the initializing thread have not
 * both passed a __syncthreads (or a named barrier instance: the initializing thread, or one
 * that knew of the init, arriving and f in bar.sync) since the init (PTX ISA: mbarrier.init
 * is an ordinary write: other threads see it only through a barrier; the templates make
 * the init visible with fence.mbarrier_init then __syncthreads). Lenient: a thread that
 * learnt of the k-th init of the block is taken to see the earlier ones too. */
void mbar_visible(Launch *L, Fiber *f, HBlock *h, const unsigned long long *bar, const char *what,
                  int line) {
  for (unsigned i = 0; i < h->ninits; ++i) {
    const MbarInit &e = h->inits[i];
    if (e.bar != bar) continue;
    if (e.thread != f->index && h->th[f->index].know < e.seq)
      ptx_fail(L, f, what, line,
               "mbarrier %p used before its initialization (mbarrier.init at line %d by thread "
               "%u) is visible to this thread: no __syncthreads (or named barrier) between them",
               (void *)bar, e.line, e.thread);
    return;
  }
}

/* After an arrival or completed transfer: completes the phase when nothing is pending. */
void mbar_settle(Block *B, unsigned long long *bar, Mbar &m) {
  if (m.pending == 0 && m.tx == 0) {
    m.phase ^= 1;
    m.pending = m.expected;
    mbar_write(bar, m);
    hwake(B, (unsigned long long)(uintptr_t)bar);
  } else {
    mbar_write(bar, m);
  }
}

void tma_land(Launch *L, Block *B, HBlock *h, unsigned i) {
  TmaOp op = h->tma[i];
  memmove(h->tma + i, h->tma + i + 1, (h->ntma - i - 1) * sizeof *h->tma);
  h->ntma--;
  memcpy(g_smem.dyn + op.off, op.data, op.size);
  memcpy(h->view + op.off, op.data, op.size);
  { /* the load replaces what generic stores published there */
    unsigned k = 0;
    for (unsigned j = 0; j < h->npubs; ++j)
      if (!(h->pubs[j].lo < op.off + op.size && op.off < h->pubs[j].hi)) h->pubs[k++] = h->pubs[j];
    h->npubs = k;
  }
  h->view_gen++;
  free(op.data);
  Mbar m;
  if (!mbar_read(op.bar, &m)) {
    Fiber *f = L->cur;
    ptx_fail(L, f, "cp.async.bulk.tensor", 0,
             "the mbarrier %p of a TMA load was overwritten before the load completed",
             (void *)op.bar);
  }
  m.tx -= (long)op.size;
  if (m.tx < -((1l << 20) - 1))
    ptx_fail(L, L->cur, "cp.async.bulk.tensor", 0, "mbarrier %p tx-count below -(2^20-1)",
             (void *)op.bar);
  /* the loads whose bytes this one overwrites entirely are forgotten */
  unsigned k = 0;
  for (unsigned j = 0; j < h->nlanded; ++j)
    if (h->landed[j].off < op.off || h->landed[j].off + h->landed[j].size > op.off + op.size)
      h->landed[k++] = h->landed[j];
  h->nlanded = k;
  if (!room_for_one(h->landed, h->nlanded, h->landcap))
    fail(L, MG_HOST_E_NOMEM, "out of memory for the Hopper emulation");
  Landed &r = h->landed[h->nlanded++];
  memset(&r, 0, sizeof r);
  r.off = op.off, r.size = op.size, r.bar = op.bar, r.parity = m.phase, r.line = op.line;
  mbar_settle(B, op.bar, m);
}

/* Thread t's wait on bar returned for the phase of parity `parity`: the loads that landed in
 * it are visible to t. */
void landed_seen(HBlock *h, const unsigned long long *bar, unsigned parity, unsigned t) {
  for (unsigned i = 0; i < h->nlanded; ++i)
    if (h->landed[i].bar == bar && h->landed[i].parity == parity) h->landed[i].obs.add(t);
}

/* A barrier completed whose arrivals were arr and whose waiters (bar.sync) syncers: a landed
 * load visible to one of the arrivals becomes visible to the waiters. */
void landed_sync(HBlock *h, const ThreadSet *arr, const ThreadSet *syncers) {
  for (unsigned i = 0; i < h->nlanded; ++i) {
    Landed &r = h->landed[i];
    if (!arr) {
      bool any = false;
      for (unsigned j = 0; j < 16 && !any; ++j) any = r.obs.w[j] != 0;
      if (any) memset(r.obs.w, 0xff, sizeof r.obs.w);
    } else if (r.obs.meets(*arr)) {
      r.obs.merge(*syncers);
    }
  }
}

/* A wgmma of the thread f's warpgroup (line) reads [lo, hi) of the dynamic shared memory (its
 * operand `which`, descriptor desc): reported when a TMA load in flight writes into it, or one
 * landed there that is visible to none of the warpgroup's threads (no wait of theirs returned
 * for its phase, and no barrier since passed it on from a thread whose wait did: on the
 * hardware the data need not have arrived for them). */
void wg_check_landed(Launch *L, Fiber *f, HBlock *h, unsigned lo, unsigned hi, const char *which,
                     unsigned long long desc, int line) {
  for (unsigned i = 0; i < h->ntma; ++i)
    if (h->tma[i].off < hi && lo < h->tma[i].off + h->tma[i].size)
      ptx_fail(L, f, "wgmma.mma_async", line,
               "operand %s (descriptor 0x%016llx, shared bytes [%u, %u)) overlaps the destination "
               "[%u, %u) of the TMA load at line %d, still in flight: its mbarrier was not waited "
               "for", which, desc, lo, hi, h->tma[i].off, h->tma[i].off + h->tma[i].size,
               h->tma[i].line);
  const unsigned wg = f->index / 128;
  for (unsigned i = 0; i < h->nlanded; ++i) {
    const Landed &r = h->landed[i];
    if (r.off < hi && lo < r.off + r.size && !r.obs.w[2 * wg] && !r.obs.w[2 * wg + 1])
      ptx_fail(L, f, "wgmma.mma_async", line,
               "operand %s (descriptor 0x%016llx, shared bytes [%u, %u)) overlaps the destination "
               "[%u, %u) of the TMA load at line %d, which landed but is visible to no thread of "
               "warpgroup %u: none waited on its mbarrier phase (parity %u), nor synced with a "
               "thread that did (on the hardware the data need not have arrived)",
               which, desc, lo, hi, r.off, r.off + r.size, r.line, wg, r.parity);
  }
}

/* At a scheduling point of B (whose shared memory is live): up to two eager TMA loads land. */
void hopper_sched_point(Launch *L, Block *B) {
  if (g_h.L != L) return;
  HBlock *h = &g_h.b[B - L->blocks];
  for (unsigned k = rng_below(L, 3); k && h->ntma; --k) {
    unsigned i = rng_below(L, h->ntma);
    if (h->tma[i].eager) tma_land(L, B, h, i);
  }
}

/* A block none of whose threads can run (B's shared memory live): its TMA loads in flight
 * land now, waking the threads that wait on their mbarriers (the hardware completes every
 * load; the executor only chooses when, and a load issued after its waiter went to sleep
 * may not have landed at a scheduling point). Returns true when any landed. */
bool hopper_land_stuck(Launch *L, Block *B) {
  if (g_h.L != L) return false;
  HBlock *h = &g_h.b[B - L->blocks];
  if (!h->ntma) return false;
  while (h->ntma) tma_land(L, B, h, 0);
  return true;
}

/* ---- TMA box geometry (loads and stores) ---------------------------------------------- */
/* The swizzle's XOR mask width: 16-byte chunk bits [4, 4+b) ^= address bits [7, 7+b). */
unsigned tmap_swizzle_mask(const mg_host_tmap &t) {
  return t.swizzle == CU_TENSOR_MAP_SWIZZLE_128B  ? 7
         : t.swizzle == CU_TENSOR_MAP_SWIZZLE_64B ? 3
         : t.swizzle == CU_TENSOR_MAP_SWIZZLE_32B ? 1 : 0;
}

/* A box of map t at coordinates c (rank of them): its element i (row-major over the box, dim 0
 * innermost) is at global coordinates c + the box index, stored in shared memory at byte
 * i * elem_size from the box's start (before the swizzle). Dimensions beyond the rank have box
 * 1 and coordinate 0. Walked one box row (box[0] elements along dim 0) at a time: row(o)
 * gives row o's outer coordinates' global offset in bytes, or -1 when they lie outside the
 * tensor (the whole row is then out of bounds). */
struct BoxWalk {
  const mg_host_tmap &t;
  unsigned box[MG_HOST_TMAP_MAX_RANK];
  long long c[MG_HOST_TMAP_MAX_RANK];
  unsigned long long count, rows;
  BoxWalk(const mg_host_tmap &tm, const int *cs) : t(tm), count(1) {
    for (unsigned d = 0; d < MG_HOST_TMAP_MAX_RANK; ++d) {
      box[d] = d < t.rank ? t.box[d] : 1;
      c[d] = d < t.rank ? cs[d] : 0;
      count *= box[d];
    }
    rows = count / box[0];
  }
  long long row(unsigned long long o) const {
    unsigned long long off = 0;
    for (unsigned d = 1; d < MG_HOST_TMAP_MAX_RANK; ++d) {
      const long long g = c[d] + (long long)(o % box[d]);
      o /= box[d];
      if (d >= t.rank) continue;
      if (g < 0 || (unsigned long long)g >= t.dim[d]) return -1;
      off += (unsigned long long)g * t.stride[d];
    }
    return (long long)off;
  }
  /* Element i0 of a row at offset `row` (>= 0): its address, or NULL outside dim 0. */
  unsigned char *at(long long row, unsigned i0) const {
    const long long g0 = c[0] + i0;
    if (g0 < 0 || (unsigned long long)g0 >= t.dim[0]) return nullptr;
    return (unsigned char *)t.base + row + (unsigned long long)g0 * t.stride[0];
  }
};

/* ---- TMA stores and reductions ---------------------------------------------------------- */
/* The source box of op is read from the async proxy's view of shared memory (once). */
void bulk_read(HBlock *h, BulkOp &op, Launch *L, Fiber *f) {
  if (op.data) return;
  op.data = (unsigned char *)malloc(op.size);
  if (!op.data) ptx_fail(L, f, "cp.async.bulk.tensor", op.line, "out of memory");
  memcpy(op.data, h->view + op.off, op.size);
}

/* The global writes of op (read first if it was not): the box's in-bounds elements are stored
 * or, for a reduction, added (f32), in element order. Removes op (index i) from h. */
void bulk_complete(Launch *L, Fiber *f, HBlock *h, unsigned i) {
  bulk_read(h, h->bulk[i], L, f);
  BulkOp op = h->bulk[i];
  memmove(h->bulk + i, h->bulk + i + 1, (h->nbulk - i - 1) * sizeof *h->bulk);
  h->nbulk--;
  const mg_host_tmap &t = op.t;
  const BoxWalk w(t, op.c);
  unsigned es = t.elem_size, bits = tmap_swizzle_mask(t);
  for (unsigned long long o = 0; o < w.rows; ++o) {
    const long long row = w.row(o);
    if (row < 0) continue;
    for (unsigned i0 = 0; i0 < w.box[0]; ++i0) {
      unsigned char *dst = w.at(row, i0);
      if (!dst) continue;
      unsigned a = op.off + (unsigned)(o * w.box[0] + i0) * es;
      a ^= ((a >> 7) & bits) << 4;
      const unsigned char *src = op.data + (a - op.off);
      if (op.reduce) {
        float x, y;
        memcpy(&x, dst, 4), memcpy(&y, src, 4);
        x += y;
        memcpy(dst, &x, 4);
      } else {
        memcpy(dst, src, es);
      }
    }
  }
  free(op.data);
}

/* A thread exits: its bulk operations must be committed and their sources read (waited for
 * with wait_group.read); their global writes happen now (the hardware completes them). */
void bulk_exit(Launch *L, Fiber *f, HBlock *h) {
  for (unsigned i = 0; i < h->nbulk;) {
    BulkOp &op = h->bulk[i];
    if (op.thread != f->index) {
      ++i;
      continue;
    }
    if (op.group == h->th[f->index].bulk_committed)
      ptx_fail(L, f, "cp.async.bulk.tensor", op.line,
               "the thread exits with a TMA store/reduction never committed "
               "(cp.async.bulk.commit_group)");
    if (!op.data)
      ptx_fail(L, f, "cp.async.bulk.tensor", op.line,
               "the thread exits while a TMA store/reduction may still read its shared-memory "
               "source (no cp.async.bulk.wait_group.read covering it)");
    bulk_complete(L, f, h, i);
  }
}

/* A thread exits: its wgmma results must have been waited for; the last thread of a block
 * leaves no TMA load in flight. */
void hopper_fiber_exit(Launch *L, Fiber *f) {
  if (g_h.L != L) return;
  HBlock *h = &g_h.b[f->blk - L->blocks];
  if (h->th) {
    unsigned wg = f->index / 128;
    for (unsigned i = 0; i < h->nops[wg]; ++i)
      if (!h->ops[wg * 64 + i]->applied[f->index % 128])
        ptx_fail(L, f, "wgmma.mma_async", h->ops[wg * 64 + i]->line,
                 "the thread exits with results of this wgmma never waited for "
                 "(wgmma.wait_group)");
    for (unsigned i = 0; i < h->npend[wg]; ++i)
      if (h->pend[wg * 64 + i].op && h->pend[wg * 64 + i].op->d[f->index % 128])
        ptx_fail(L, f, "wgmma.mma_async", h->pend[wg * 64 + i].line,
                 "the thread exits with results of this wgmma never waited for "
                 "(wgmma.wait_group; %u of the warpgroup's 128 threads issued it)",
                 h->pend[wg * 64 + i].arrived);
    if (f->blk->ndone == L->nthreads)
      for (unsigned w = 0; w < (L->nthreads + 127) / 128; ++w)
        if (h->npend[w])
          ptx_fail(L, f, "wgmma.mma_async", h->pend[w * 64].line,
                   "warpgroup divergence: the block exits with a wgmma.mma_async that %u of "
                   "the 128 threads of warpgroup %u issued", h->pend[w * 64].arrived, w);
  }
  if (f->blk->ndone == L->nthreads && h->ntma)
    ptx_fail(L, f, "cp.async.bulk.tensor", 0,
             "the block exits with %u TMA loads in flight (never waited for on their mbarrier)",
             h->ntma);
  bulk_exit(L, f, h);
  if (f->blk->ndone == L->nthreads)
    for (unsigned id = 1; id < 16; ++id)
      if (h->nb[id].arrived)
        ptx_fail(L, f, "bar.arrive", h->nb[id].line,
                 "named barrier %u: the block exits with %u of %u arrivals made at an instance "
                 "that never completes (a count too large, or threads that never arrive)",
                 id, h->nb[id].arrived, h->nb[id].count);
}

/* Threads of B asleep in the Hopper emulation: the deadlock message. */
bool hopper_describe_deadlock(Launch *L, Block *B) {
  if (g_h.L != L) return false;
  HBlock *h = &g_h.b[B - L->blocks];
  for (unsigned i = 0; i < L->nthreads; ++i) {
    Fiber *f = &B->fibers[i];
    if (f->state != F_WAIT_ASYNC) continue;
    char who[96];
    where(L, f, who, sizeof who);
    unsigned nasync = 0, ndone = B->ndone;
    for (unsigned j = 0; j < L->nthreads; ++j) nasync += B->fibers[j].state == F_WAIT_ASYNC;
    L->err = MG_HOST_E_DIVERGENCE;
    unsigned nwg = (L->nthreads + 127) / 128;
    for (unsigned w = 0; w < nwg; ++w)
      if (f->wait == (unsigned long long)(uintptr_t)&h->meet[w]) {
        snprintf(L->msg, sizeof L->msg,
                 "warpgroup divergence: %u of 128 threads of warpgroup %u wait at %s (line %d), "
                 "e.g. %s; %u threads of the block have exited",
                 h->meet[w].arrived, w,
                 h->meet[w].what == W_WGMMA ? "wgmma.mma_async" : "setmaxnreg", h->meet[w].line,
                 who, ndone);
        return true;
      }
    for (unsigned w = 0; w < nwg; ++w)
      if (f->wait == (unsigned long long)(uintptr_t)&h->npend[w]) {
        snprintf(L->msg, sizeof L->msg,
                 "warpgroup divergence: %s waits (wgmma.wait_group) for the wgmma.mma_async at "
                 "line %d, which only %u of the 128 threads of warpgroup %u issued; %u threads "
                 "of the block have exited",
                 who, h->npend[w] ? h->pend[w * 64].line : 0, h->npend[w] ? h->pend[w * 64].arrived : 0,
                 w, ndone);
        return true;
      }
    bool named = false;
    for (unsigned id = 1; id < 16 && !named; ++id)
      if (f->wait == (unsigned long long)(uintptr_t)&h->nb[id]) {
        named = true;
        snprintf(L->msg, sizeof L->msg,
                 "deadlock: %s waits at bar.sync %u (line %d) for an instance that never "
                 "completes: %u of %u threads arrived (a participant that never arrives, or a "
                 "count too large); %u threads wait on barriers, mbarriers or warpgroups, %u have "
                 "exited",
                 who, id, h->th[i].line, h->nb[id].arrived, h->nb[id].count, nasync, ndone);
      }
    if (named) return true;
    Mbar m = {0, 0, 0, 0};
    mbar_read((unsigned long long *)(uintptr_t)f->wait, &m);
    snprintf(L->msg, sizeof L->msg,
             "deadlock: %s waits at line %d on the mbarrier at %p for a phase that never "
             "completes (current phase parity %u, %u of %u arrivals pending, tx-count %ld, no "
             "TMA load in flight on it): a missing arrive or expect_tx, or a wrong phase "
             "parity; %u threads wait on mbarriers or warpgroups, %u have exited",
             who, h->th[i].line, (void *)(uintptr_t)f->wait, m.phase, m.pending, m.expected,
             m.tx, nasync, ndone);
    return true;
  }
  return false;
}

/* ---- wgmma ------------------------------------------------------------------------------ */
float h16_to_float(int kind, uint32_t bits) {
  return (kind & 1) ? f16_bits_to_float(bits & 0xffff) : bf16_bits_to_float(bits & 0xffff);
}

/* op's operands as floats from the async view as it is now (op->opnd: A [64][16], then B
 * in WgOp::opnd's order; decoded again only when the view changed since), every element
 * checked. */
void wg_decode(Launch *L, Fiber *f, HBlock *h, const WgOp *op, float *out) {
  size_t dyn = g_smem.dyn_size;
  auto ld = [&](unsigned long long desc, unsigned row, unsigned k, const char *which) -> float {
    bool mn = which[0] == 'B' ? (op->kind & 2) != 0 : (op->kind & 4) != 0;
    unsigned a = mn ? mg_host_gmma_addr_mn(desc, row, k) : mg_host_gmma_addr(desc, row, k);
    if (a == 0xffffffffu)
      ptx_fail(L, f, "wgmma.mma_async", op->line,
               "matrix descriptor 0x%016llx of %s has a base offset, which is not modelled", desc,
               which);
    if (a + 2 > dyn)
      ptx_fail(L, f, "wgmma.mma_async", op->line,
               "%s element (%u, %u) at shared address %u lies outside the %zu bytes of dynamic "
               "shared memory (descriptor 0x%016llx)",
               which, row, k, a, dyn, desc);
    uint16_t v;
    memcpy(&v, h->view + a, 2);
    return h16_to_float(op->kind, v);
  };
  float *A = out, *B = out + 64 * 16;
  for (unsigned row = 0; row < 64; ++row)
    for (unsigned k = 0; k < 16; ++k) {
      if (op->a_regs) {
        unsigned tt, r, hh;
        mg_host_wgmma_a_coord(row, k, &tt, &r, &hh);
        A[row * 16 + k] = h16_to_float(op->kind, op->a[tt][r] >> (16 * hh));
      } else {
        A[row * 16 + k] = ld(op->da, row, k, "A");
      }
    }
  const unsigned nj = (unsigned)op->n / 8;
  for (unsigned col = 0; col < (unsigned)op->n; ++col)
    for (unsigned k = 0; k < 16; ++k) B[(k * 8 + col % 8) * nj + col / 8] = ld(op->db, col, k, "B");
}

/* op's operands (wg_decode), decoded again only when the view changed since, and then
 * compared with what the view held at the first issue (WgOp::opnd_issue): bit for bit, NaN
 * included. */
const float *wg_operands(Launch *L, Fiber *f, HBlock *h, WgOp *op) {
  if (op->opnd && op->opnd_gen == h->view_gen) return op->opnd;
  if (!op->opnd) op->opnd = (float *)malloc((size_t)(64 + op->n) * 16 * sizeof(float));
  if (!op->opnd) ptx_fail(L, f, "wgmma.mma_async", op->line, "out of memory");
  wg_decode(L, f, h, op, op->opnd);
  op->opnd_gen = h->view_gen;
  if (op->opnd_issue) {
    const unsigned nj = (unsigned)op->n / 8;
    for (unsigned i = op->a_regs ? 64 * 16 : 0; i < (unsigned)(64 + op->n) * 16; ++i)
      if (memcmp(op->opnd + i, op->opnd_issue + i, sizeof(float))) {
        const bool a = i < 64 * 16;
        const unsigned j = a ? i : i - 64 * 16, row = a ? j / 16 : (j % nj) * 8 + (j / nj) % 8,
                       k = a ? j % 16 : j / nj / 8;
        ptx_fail(L, f, "wgmma.mma_async", op->line,
                 "shared-memory operand %s element (%u, %u) changed between the first issue of "
                 "this wgmma in its warpgroup (%g) and the wgmma.wait_group delivering it to "
                 "thread %u (%g): the hardware may read it at any point in between (a barrier "
                 "missing before the wgmma, or before the operand is rewritten after it)",
                 a ? "A" : "B", row, k, (double)op->opnd_issue[i], f->index % 128, (double)op->opnd[i]);
      }
  }
  return op->opnd;
}

/* Thread t's part of op: d[i] = (scale_d ? d[i] : 0) + sum_k A[row][k] B[col][k] (fmaf in k
 * order), operands from the async proxy's view; B MN-major when kind has bit 1, A (from shared
 * memory) when it has bit 2. */
void wg_apply(Launch *L, Fiber *f, HBlock *h, WgOp *op, unsigned t, WgOp *const *later,
              unsigned nlater) {
  const float *A = wg_operands(L, f, h, op), *B = A + 64 * 16;
  const unsigned nacc = (unsigned)op->n / 2;
  float *d = op->in + (size_t)t * nacc; /* the input, made the result in place */
  const unsigned nj = (unsigned)op->n / 8;
  /* d[4j + c] (mg_host_wgmma_acc_coord) is (row of c, 8j + col0 of c): for each c, the nj
   * accumulators share a row and run over B's adjacent j, 8 at a time where the build has
   * AVX and FMA (each element's operations as in the scalar loop: fused, k in order) */
  for (unsigned c = 0; c < 4; ++c) {
    unsigned row, col0;
    mg_host_wgmma_acc_coord(t, c, &row, &col0);
    const float *a = A + row * 16, *b = B + col0 * nj;
    unsigned j = 0;
#if MG_HOST_VEC_FMA
    for (; j + 8 <= nj; j += 8) {
      float x[8];
      for (unsigned u = 0; u < 8; ++u) x[u] = op->scale_d ? d[4 * (j + u) + c] : 0.0f;
      __m256 acc = _mm256_loadu_ps(x);
      for (unsigned k = 0; k < 16; ++k)
        acc = _mm256_fmadd_ps(_mm256_set1_ps(a[k]), _mm256_loadu_ps(b + k * 8 * nj + j), acc);
      _mm256_storeu_ps(x, acc);
      for (unsigned u = 0; u < 8; ++u) d[4 * (j + u) + c] = x[u];
    }
#endif
    for (; j < nj; ++j) {
      float acc = op->scale_d ? d[4 * j + c] : 0.0f;
      for (unsigned k = 0; k < 16; ++k) acc = fmaf(a[k], b[k * 8 * nj + j], acc);
      d[4 * j + c] = acc;
    }
  }
  op->applied[t] = true;
  op->napplied++;
  /* the result: to the next op in flight chained on the same registers, else to them */
  for (unsigned i = 0; i < nlater; ++i)
    if (later[i]->d[t] == op->d[t] && later[i]->chained[t] && !later[i]->applied[t]) {
      memcpy(later[i]->in + (size_t)t * nacc, d, nacc * sizeof(float));
      return;
    }
  const unsigned wg = f->index / 128; /* or to one thread t issued that is still pending */
  for (unsigned i = 0; i < h->npend[wg]; ++i) {
    WgOp *o = h->pend[wg * 64 + i].op;
    if (o && o->d[t] == op->d[t] && o->chained[t]) {
      memcpy(o->in + (size_t)t * nacc, d, nacc * sizeof(float));
      return;
    }
  }
  unsigned bad = wg_unpoisoned(op->d[t], nacc);
  if (bad < nacc)
    ptx_fail(L, f, "wgmma.mma_async", op->line,
             "accumulator register %u of thread %u was written between this wgmma.mma_async and "
             "the wgmma.wait_group that delivers it (PTX ISA: accessing the accumulator before "
             "the wait is undefined)", bad, t);
  memcpy(op->d[t], d, nacc * sizeof(float));
}

/* A warpgroup rendezvous: returns when all 128 threads of the caller's warpgroup arrived with
 * the same operation; the last one runs `complete` first. */
template <class Deposit, class Complete>
void wg_meet(Launch *L, Fiber *f, HBlock *h, int what, int line, const char *name, Deposit dep,
             Complete complete) {
  unsigned wg = f->index / 128;
  if ((wg + 1) * 128 > L->nthreads)
    ptx_fail(L, f, name, line, "needs a full warpgroup (128 threads); the block has %u threads",
             L->nthreads);
  WgMeet &m = h->meet[wg];
  if (m.arrived && (m.what != what || m.line != line)) {
    ptx_fail(L, f, name, line, "warpgroup divergence: %u threads of warpgroup %u wait at %s (line %d)",
             m.arrived, wg, m.what == W_WGMMA ? "wgmma.mma_async" : "setmaxnreg", m.line);
  }
  bool first = m.arrived == 0;
  if (first) {
    m.what = what;
    m.line = line;
  }
  dep(m, first);
  if (++m.arrived == 128) {
    m.arrived = 0;
    complete(m);
    hwake(f->blk, (unsigned long long)(uintptr_t)&m);
    yield(L, f);
  } else {
    hsleep(L, f, (unsigned long long)(uintptr_t)&m, line);
  }
}

} // namespace

unsigned mg_host_smem_u32(const void *p, int line) {
  Launch *L = current("cvta.to.shared");
  const unsigned char *a = (const unsigned char *)p;
  if (a < g_smem.dyn || a >= g_smem.dyn + g_smem.dyn_size)
    ptx_fail(L, L->cur, "cvta.to.shared", line,
             "%p is not in the dynamic shared memory (%zu bytes): the host executor gives .shared "
             "addresses (TMA destinations, wgmma descriptors) to dynamic shared memory only",
             p, g_smem.dyn_size);
  return (unsigned)(a - g_smem.dyn);
}

void mg_host_mbar_init(unsigned long long *bar, unsigned count, int line) {
  Launch *L = current("mbarrier.init");
  Fiber *f = L->cur;
  if ((uintptr_t)bar % 8 || !smem_contains(bar, 8))
    ptx_fail(L, f, "mbarrier.init", line, "%p is not an 8-byte aligned shared-memory object",
             (void *)bar);
  if (count < 1 || count > (1u << 20) - 1)
    ptx_fail(L, f, "mbarrier.init", line, "count %u is not in [1, 2^20 - 1]", count);
  Mbar m = {count, count, 0, 0};
  mbar_write(bar, m);
  HBlock *h = hblock(L, f->blk);
  unsigned i = 0;
  while (i < h->ninits && h->inits[i].bar != bar) ++i;
  if (i == h->ninits) {
    if (!room_for_one(h->inits, h->ninits, h->initcap))
      ptx_fail(L, f, "mbarrier.init", line, "out of memory");
    h->ninits++;
  }
  h->inits[i] = MbarInit{bar, f->index, ++h->init_seq, line};
  h->th[f->index].own = h->init_seq;
}

void mg_host_mbar_arrive(unsigned long long *bar, unsigned tx, int line) {
  Launch *L = current("mbarrier.arrive");
  Fiber *f = L->cur;
  const char *what = tx ? "mbarrier.arrive.expect_tx" : "mbarrier.arrive";
  Mbar m = mbar_get(L, f, bar, what, line);
  mbar_visible(L, f, hblock(L, f->blk), bar, what, line);
  if (m.pending == 0)
    ptx_fail(L, f, what, line,
             "over-arrival: the current phase (parity %u) has no pending arrival left (all %u "
             "made, tx-count %ld outstanding)",
             m.phase, m.expected, m.tx);
  m.tx += (long)tx;
  if (m.tx > (1l << 20) - 1)
    ptx_fail(L, f, what, line, "tx-count %ld exceeds 2^20 - 1", m.tx);
  m.pending--;
  mbar_settle(f->blk, bar, m);
}

int mg_host_mbar_wait(unsigned long long *bar, unsigned parity, int line) {
  Launch *L = current("mbarrier.try_wait.parity");
  Fiber *f = L->cur;
  if (parity > 1)
    ptx_fail(L, f, "mbarrier.try_wait.parity", line, "phase parity %u is not 0 or 1", parity);
  (void)mbar_get(L, f, bar, "mbarrier.try_wait.parity", line);
  mbar_visible(L, f, hblock(L, f->blk), bar, "mbarrier.try_wait.parity", line);
  for (;;) {
    HBlock *h = hblock(L, f->blk);
    Mbar m = mbar_get(L, f, bar, "mbarrier.try_wait.parity", line);
    if (m.phase != parity) {
      landed_seen(h, bar, parity, f->index);
      return 1;
    }
    /* the executor's choice, at the latest: the loads on bar land now */
    for (unsigned i = 0; i < h->ntma;)
      if (h->tma[i].bar == bar)
        tma_land(L, f->blk, h, i);
      else
        ++i;
    m = mbar_get(L, f, bar, "mbarrier.try_wait.parity", line);
    if (m.phase != parity) {
      landed_seen(h, bar, parity, f->index);
      return 1;
    }
    hsleep(L, f, (unsigned long long)(uintptr_t)bar, line);
  }
}

void mg_host_tma_load(void *dst, const void *map, unsigned long long *bar, int rank, const int *c,
                      int line) {
  const char *what = "cp.async.bulk.tensor";
  Launch *L = current(what);
  Fiber *f = L->cur;
  mg_host_tmap t;
  memcpy(&t, map, sizeof t);
  if (t.magic != MG_HOST_TMAP_MAGIC)
    ptx_fail(L, f, what, line, "the tensor map is not one cuTensorMapEncodeTiled made (host format)");
  if ((int)t.rank != rank)
    ptx_fail(L, f, what, line, "a %dd load from a tensor map of rank %u", rank, t.rank);
  unsigned off = mg_host_smem_u32(dst, line);
  if (off % 128) ptx_fail(L, f, what, line, "destination %p is not 128-byte aligned", dst);
  (void)mbar_get(L, f, bar, what, line);
  mbar_visible(L, f, hblock(L, f->blk), bar, what, line);
  const BoxWalk w(t, c);
  unsigned es = t.elem_size;
  unsigned size = (unsigned)w.count * es;
  if ((size_t)off + size > g_smem.dyn_size)
    ptx_fail(L, f, what, line, "the %u-byte box at shared offset %u overruns the %zu bytes of "
             "dynamic shared memory", size, off, g_smem.dyn_size);
  unsigned bits = tmap_swizzle_mask(t);
  unsigned char *data = (unsigned char *)malloc(size);
  if (!data) ptx_fail(L, f, what, line, "out of memory");
  unsigned char fill[8];
  memset(fill, 0, sizeof fill);
  if (t.oob_nan) memset(fill, 0xff, sizeof fill);
  for (unsigned long long o = 0; o < w.rows; ++o) {
    const long long row = w.row(o);
    for (unsigned i0 = 0; i0 < w.box[0]; ++i0) {
      unsigned a = off + (unsigned)(o * w.box[0] + i0) * es;
      a ^= ((a >> 7) & bits) << 4;
      const unsigned char *src = row < 0 ? nullptr : w.at(row, i0);
      if (src)
        note_read(L, f, src, es);
      else
        src = fill;
      memcpy(data + (a - off), src, es);
    }
  }
  HBlock *h = hblock(L, f->blk);
  if (!room_for_one(h->tma, h->ntma, h->cap)) ptx_fail(L, f, what, line, "out of memory");
  h->tma[h->ntma++] = TmaOp{off, size, bar, !L->round_robin && rng_below(L, 2) != 0, line, data};
}

void mg_host_fence_proxy_async(int line) {
  Launch *L = current("fence.proxy.async");
  HBlock *h = hblock(L, L->cur->blk);
  /* the bytes this fence changes in the async view, as runs (gaps under 64 bytes merged):
   * publications by this thread */
  const unsigned char *a = g_smem.dyn, *v = h->view;
  const size_t n = g_smem.dyn_size;
  size_t lo = n, hi = 0;
  auto flush = [&]() {
    if (lo >= hi) return;
    if (!room_for_one(h->pubs, h->npubs, h->pubcap, 64))
      ptx_fail(L, L->cur, "fence.proxy.async", line, "out of memory");
    Pub &r = h->pubs[h->npubs++];
    memset(&r, 0, sizeof r);
    r.lo = (unsigned)lo, r.hi = (unsigned)hi, r.thread = L->cur->index, r.line = line;
    r.obs.add(L->cur->index);
    lo = n, hi = 0;
  };
  for (size_t i = 0; i < n; i += 64) {
    const size_t m = n - i < 64 ? n - i : 64;
    if (!memcmp(a + i, v + i, m)) continue;
    for (size_t j = i; j < i + m; ++j)
      if (a[j] != v[j]) {
        if (lo < hi && j >= hi + 64) flush();
        if (j < lo) lo = j;
        hi = j + 1;
      }
  }
  flush();
  memcpy(h->view, g_smem.dyn, g_smem.dyn_size);
  h->view_gen++;
}

void mg_host_wgmma_fence(int line) {
  (void)line;
  Launch *L = current("wgmma.fence");
  hblock(L, L->cur->blk)->th[L->cur->index].fenced = true;
}

void mg_host_wgmma_commit(int line) {
  (void)line;
  Launch *L = current("wgmma.commit_group");
  hblock(L, L->cur->blk)->th[L->cur->index].committed++;
}

void mg_host_wgmma_wait(int n, int line) {
  Launch *L = current("wgmma.wait_group");
  Fiber *f = L->cur;
  HBlock *h = hblock(L, f->blk);
  HThread &th = h->th[f->index];
  if (n < 0 || n > 7) ptx_fail(L, f, "wgmma.wait_group", line, "N = %d is not in 0..7", n);
  unsigned long long keep = (unsigned long long)n;
  if (th.committed <= keep) return;
  unsigned long long done_below = th.committed - keep;
  unsigned wg = f->index / 128, t = f->index % 128;
  /* the ops to deliver must exist: every thread of the warpgroup has issued them */
  while (h->npend[wg] && h->pend[wg * 64].committed < done_below)
    hsleep(L, f, (unsigned long long)(uintptr_t)&h->npend[wg], line);
  WgOp **ops = h->ops + wg * 64;
  bool any = false;
  for (unsigned i = 0; i < h->nops[wg] && ops[i]->group < done_below; ++i)
    if (!ops[i]->applied[t]) {
      wg_apply(L, f, h, ops[i], t, ops + i + 1, h->nops[wg] - i - 1);
      any = true;
    }
  while (h->nops[wg] && ops[0]->napplied == 128) {
    wgop_free(ops[0]);
    memmove(ops, ops + 1, (h->nops[wg] - 1) * sizeof *ops);
    h->nops[wg]--;
  }
  if (any) th.fenced = false; /* registers were written: the next mma_async needs a fence */
}

void mg_host_wgmma(int kind, int n, float *d, const unsigned *a, unsigned long long desc_a,
                   unsigned long long desc_b, int scale_d, int line) {
  const char *name = "wgmma.mma_async";
  Launch *L = current(name);
  Fiber *f = L->cur;
  HBlock *h = hblock(L, f->blk);
  HThread &th = h->th[f->index];
  if (n < 8 || n > 256 || n % 8)
    ptx_fail(L, f, name, line, "N = %d is not a multiple of 8 in 8..256 (PTX ISA, wgmma .bf16/.f16)", n);
  if (!th.fenced)
    ptx_fail(L, f, name, line,
             "no wgmma.fence since the start or since the last wgmma.wait_group that delivered "
             "results (the PTX ISA requires one before an mma_async whose registers were "
             "accessed)");
  unsigned t = f->index % 128, wg = f->index / 128;
  if ((wg + 1) * 128 > L->nthreads)
    ptx_fail(L, f, name, line, "needs a full warpgroup (128 threads); the block has %u threads",
             L->nthreads);
  auto deposit = [&](WgMeet &m, bool first) {
        if (first) {
          m.n = n, m.kind = kind, m.scale_d = scale_d, m.a_regs = a != nullptr;
          m.da = desc_a, m.db = desc_b, m.committed = th.committed;
          m.op = (WgOp *)calloc(1, sizeof(WgOp));
          if (!m.op) ptx_fail(L, f, name, line, "out of memory");
          /* the operands as the first issue finds them (WgOp::opnd_issue) */
          m.op->kind = kind, m.op->n = n, m.op->a_regs = a != nullptr, m.op->da = desc_a;
          m.op->db = desc_b, m.op->line = line;
          m.op->opnd_issue = (float *)malloc((size_t)(64 + n) * 16 * sizeof(float));
          if (!m.op->opnd_issue) ptx_fail(L, f, name, line, "out of memory");
          wg_decode(L, f, h, m.op, m.op->opnd_issue);
          for (int w = 0; w < 2; ++w) { /* the bytes each shared operand spans */
            m.rlo[w] = 0xffffffffu, m.rhi[w] = 0;
            if (w == 0 && a) continue;
            const unsigned long long desc = w ? desc_b : desc_a;
            const bool mn = w ? (kind & 2) != 0 : (kind & 4) != 0;
            for (unsigned r = 0; r < (w ? (unsigned)n : 64u); ++r)
              for (unsigned k = 0; k < 16; ++k) {
                const unsigned ad = mn ? mg_host_gmma_addr_mn(desc, r, k) : mg_host_gmma_addr(desc, r, k);
                if (ad == 0xffffffffu) continue;
                m.rlo[w] = ad < m.rlo[w] ? ad : m.rlo[w];
                m.rhi[w] = ad + 2 > m.rhi[w] ? ad + 2 : m.rhi[w];
              }
          }
        } else if (m.n != n || m.kind != kind || (m.scale_d != 0) != (scale_d != 0) ||
                   m.a_regs != (a != nullptr) || (!a && m.da != desc_a) || m.db != desc_b) {
          ptx_fail(L, f, name, line,
                   "operands differ within the warpgroup (N %d/%d, descriptors "
                   "0x%llx/0x%llx, 0x%llx/0x%llx, scale-d %d/%d)",
                   n, m.n, desc_a, m.da, desc_b, m.db, scale_d, m.scale_d);
        } else if (m.committed != th.committed) {
          ptx_fail(L, f, name, line, "threads of the warpgroup have committed different numbers "
                   "of wgmma groups (%llu, %llu)", th.committed, m.committed);
        }
        if (a) memcpy(m.op->a[t], a, 16);
        /* the shared operands: no publication of another warp's stores that no barrier has
         * ordered before this thread */
        for (int w = 0; w < 2; ++w)
          for (unsigned i = 0; i < h->npubs; ++i) {
            const Pub &r = h->pubs[i];
            const unsigned me = f->index;
            if (r.lo >= m.rhi[w] || m.rlo[w] >= r.hi || r.thread / 32 == me / 32 ||
                ((r.obs.w[me / 64] >> (me % 64)) & 1))
              continue;
            ptx_fail(L, f, name, line,
                     "operand %s (shared bytes [%u, %u)) overlaps bytes [%u, %u) that thread %u "
                     "stored and published (fence.proxy.async at line %d), which no barrier has "
                     "ordered before this thread of another warp (a barrier missing between "
                     "another warp's stores and this wgmma)",
                     w ? "B" : "A", m.rlo[w], m.rhi[w], r.lo, r.hi, r.thread, r.line);
          }
        /* the accumulator registers: chained on an op in flight on the same registers (its
         * result is this one's input), else their values are the input; then poisoned */
        const unsigned nacc = (unsigned)n / 2;
        if (!m.op->in) m.op->in = (float *)malloc((size_t)128 * nacc * sizeof(float));
        if (!m.op->in) ptx_fail(L, f, name, line, "out of memory");
        bool chained = false;
        /* in flight for thread t: the ops not yet applied to it, then the ones it issued that
         * some thread of the warpgroup has not (pend, before this one) */
        const unsigned npend_before = (unsigned)(&m - (h->pend + wg * 64));
        for (unsigned i = 0; i < h->nops[wg] + npend_before; ++i) {
          const WgOp *o = i < h->nops[wg] ? h->ops[wg * 64 + i] : h->pend[wg * 64 + i - h->nops[wg]].op;
          if (i < h->nops[wg] && o->applied[t]) continue;
          const float *e = o->d[t];
          if (!e) continue; /* a pending op thread t has not issued (none before its own) */
          if (e == d && o->n == n) {
            chained = true;
          } else if (d < e + o->n / 2 && e < d + nacc) {
            ptx_fail(L, f, name, line,
                     "its accumulator registers overlap those of the wgmma.mma_async at line %d, "
                     "still in flight, with another extent", o->line);
          }
        }
        if (chained) {
          unsigned bad = wg_unpoisoned(d, nacc);
          if (bad < nacc)
            ptx_fail(L, f, name, line,
                     "accumulator register %u of thread %u was written while an earlier "
                     "wgmma.mma_async on it was in flight (PTX ISA: accessing the accumulator "
                     "before the wait is undefined)", bad, t);
        } else {
          memcpy(m.op->in + (size_t)t * nacc, d, nacc * sizeof(float));
          wg_poison(d, nacc);
        }
        m.op->chained[t] = chained;
        m.op->d[t] = d;
      };
  auto complete = [&](WgMeet &m) {
        /* the shared memory its descriptor operands span: not a TMA load's the warpgroup may
         * not read yet */
        for (int w = m.a_regs ? 1 : 0; w < 2; ++w) {
          const unsigned long long desc = w ? m.db : m.da;
          const bool mn = w ? (m.kind & 2) != 0 : (m.kind & 4) != 0;
          const unsigned rows = w ? (unsigned)m.n : 64u;
          unsigned lo = 0xffffffffu, hi = 0;
          for (unsigned r = 0; r < rows; ++r)
            for (unsigned k = 0; k < 16; ++k) {
              const unsigned a = mn ? mg_host_gmma_addr_mn(desc, r, k) : mg_host_gmma_addr(desc, r, k);
              if (a == 0xffffffffu) continue; /* reported when the operands are read */
              lo = a < lo ? a : lo;
              hi = a + 2 > hi ? a + 2 : hi;
            }
          if (lo < hi) wg_check_landed(L, f, h, lo, hi, w ? "B" : "A", desc, line);
        }
        WgOp *op = m.op;
        m.op = nullptr;
        op->kind = m.kind, op->n = m.n, op->scale_d = m.scale_d, op->line = line;
        op->a_regs = m.a_regs, op->da = m.da, op->db = m.db, op->group = m.committed;
        if (h->nops[wg] == 64) {
          wgop_free(op);
          ptx_fail(L, f, name, line, "more than 64 wgmma.mma_async in flight in warpgroup %u",
                   wg);
        }
        h->ops[wg * 64 + h->nops[wg]++] = op;
        if (L->wgmma_trace) {
          const uint3 bid = f->regs.bid;
          if (*L->wgmma_trace_len < L->wgmma_trace_cap)
            L->wgmma_trace[*L->wgmma_trace_len] = mg_host_wgmma_issue{
                bid.x + L->grid.x * (bid.y + L->grid.y * bid.z), wg, (unsigned)m.n, m.a_regs ? 1 : 0,
                line};
          ++*L->wgmma_trace_len;
        }
      };
  /* thread t's issue number seq: the warpgroup's pending op of that number, or a new one */
  const unsigned long long seq = th.issued++;
  const unsigned idx = (unsigned)(seq - h->done_seq[wg]);
  WgMeet *q = h->pend + wg * 64;
  const bool first = idx == h->npend[wg];
  if (first) {
    if (h->npend[wg] + h->nops[wg] >= 64)
      ptx_fail(L, f, name, line, "more than 64 wgmma.mma_async in flight in warpgroup %u", wg);
    memset(&q[idx], 0, sizeof q[idx]);
    q[idx].what = W_WGMMA, q[idx].line = line;
    h->npend[wg]++;
  } else if (q[idx].line != line) {
    ptx_fail(L, f, name, line,
             "warpgroup divergence: this thread's wgmma.mma_async number %llu of warpgroup %u "
             "is at line %d, the one %u other threads issued as that number at line %d",
             seq, wg, line, q[idx].arrived, q[idx].line);
  }
  deposit(q[idx], first);
  if (++q[idx].arrived == 128) { /* issued by all: the op exists (the oldest pending one) */
    if (idx != 0) ptx_fail(L, f, name, line, "internal: wgmma issue %llu completes out of order", seq);
    complete(q[0]);
    memmove(q, q + 1, (h->npend[wg] - 1) * sizeof *q);
    h->npend[wg]--;
    h->done_seq[wg]++;
    hwake(f->blk, (unsigned long long)(uintptr_t)&h->npend[wg]);
  }
  yield(L, f); /* a scheduling point: the other warps may be anywhere before or after theirs */
}

void mg_host_setmaxnreg(int inc, int regs, int line) {
  const char *name = inc ? "setmaxnreg.inc" : "setmaxnreg.dec";
  Launch *L = current(name);
  Fiber *f = L->cur;
  HBlock *h = hblock(L, f->blk);
  wg_meet(
      L, f, h, W_SETMAXNREG, line, name,
      [&](WgMeet &m, bool first) {
        if (first) {
          m.n = regs, m.kind = inc;
        } else if (m.n != regs || m.kind != inc) {
          ptx_fail(L, f, name, line, "not warpgroup-uniform: %s %d here, %s %d elsewhere",
                   inc ? "inc" : "dec", regs, m.kind ? "inc" : "dec", m.n);
        }
      },
      [&](WgMeet &) {});
}

void mg_host_named_bar(int sync, unsigned id, unsigned count, int line) {
  const char *name = sync ? "bar.sync" : "bar.arrive";
  Launch *L = current(name);
  Fiber *f = L->cur;
  unsigned warps_threads = (L->nthreads + 31) / 32 * 32;
  if (id < 1 || id > 15)
    ptx_fail(L, f, name, line, "barrier id %u is not in 1..15 (0 is __syncthreads's)", id);
  if (count == 0 || count % 32 || count > warps_threads)
    ptx_fail(L, f, name, line,
             "thread count %u of barrier %u is not a positive multiple of 32 up to the block's "
             "%u threads (in warps)", count, id, warps_threads);
  HBlock *h = hblock(L, f->blk);
  NamedBar &b = h->nb[id];
  if (b.arrived == 0) {
    b.count = count;
    b.line = line;
    b.know = 0;
    memset(&b.arr, 0, sizeof b.arr);
    memset(&b.syn, 0, sizeof b.syn);
  } else if (b.count != count) {
    ptx_fail(L, f, name, line,
             "barrier %u arrived at with count %u while its current instance counts %u (first "
             "arrival at line %d, %u arrived)", id, count, b.count, b.line, b.arrived);
  }
  unsigned long long gen = b.gen;
  unsigned long long key = (unsigned long long)(uintptr_t)&b;
  HThread &th = h->th[f->index];
  b.know = umax(b.know, umax(th.know, th.own));
  b.arr.add(f->index);
  if (sync) b.syn.add(f->index);
  if (++b.arrived == b.count) {
    landed_sync(h, &b.arr, &b.syn);
    for (unsigned i = 0; i < h->npubs; ++i)
      if (h->pubs[i].obs.meets(b.arr)) h->pubs[i].obs.merge(b.syn);
    b.arrived = 0;
    b.know_done[gen & 1] = b.know;
    b.gen++;
    if (sync) th.know = umax(th.know, b.know);
    hwake(f->blk, key);
    yield(L, f, BARRIER_SWITCH);
    return;
  }
  if (!sync) {
    yield(L, f); /* a scheduling point: the consumer may run first */
    return;
  }
  while (b.gen == gen) hsleep(L, f, key, line);
  th.know = umax(th.know, b.know_done[gen & 1]);
}

void mg_host_tma_store(int reduce, const void *map, const void *src, int rank, const int *c,
                       int line) {
  const char *what = reduce ? "cp.reduce.async.bulk.tensor" : "cp.async.bulk.tensor (store)";
  Launch *L = current(what);
  Fiber *f = L->cur;
  mg_host_tmap t;
  memcpy(&t, map, sizeof t);
  if (t.magic != MG_HOST_TMAP_MAGIC)
    ptx_fail(L, f, what, line, "the tensor map is not one cuTensorMapEncodeTiled made (host format)");
  if ((int)t.rank != rank)
    ptx_fail(L, f, what, line, "a %dd operation on a tensor map of rank %u", rank, t.rank);
  if (reduce && t.dtype != CU_TENSOR_MAP_DATA_TYPE_FLOAT32)
    ptx_fail(L, f, what, line, "the .add reduction is modelled for f32 maps only (dtype %u)",
             t.dtype);
  unsigned off = mg_host_smem_u32(src, line);
  if (off % 128) ptx_fail(L, f, what, line, "source %p is not 128-byte aligned", src);
  unsigned size = (unsigned)BoxWalk(t, c).count * t.elem_size;
  if ((size_t)off + size > g_smem.dyn_size)
    ptx_fail(L, f, what, line, "the %u-byte box at shared offset %u overruns the %zu bytes of "
             "dynamic shared memory", size, off, g_smem.dyn_size);
  HBlock *h = hblock(L, f->blk);
  if (!room_for_one(h->bulk, h->nbulk, h->bulkcap)) ptx_fail(L, f, what, line, "out of memory");
  BulkOp &op = h->bulk[h->nbulk++];
  op.t = t;
  for (int d = 0; d < MG_HOST_TMAP_MAX_RANK; ++d) op.c[d] = d < rank ? c[d] : 0;
  op.reduce = reduce, op.line = line, op.off = off, op.size = size, op.thread = f->index;
  op.group = h->th[f->index].bulk_committed;
  op.data = nullptr;
  /* the executor's choice: the source is read now (one in four) or at the latest point, the
   * wait_group.read (or wait_group) that covers it */
  if (!L->round_robin && rng_below(L, 4) == 0) bulk_read(h, op, L, f);
}

void mg_host_bulk_commit(int line) {
  (void)line;
  Launch *L = current("cp.async.bulk.commit_group");
  hblock(L, L->cur->blk)->th[L->cur->index].bulk_committed++;
}

void mg_host_bulk_wait(int n, int read, int line) {
  const char *what = read ? "cp.async.bulk.wait_group.read" : "cp.async.bulk.wait_group";
  Launch *L = current(what);
  Fiber *f = L->cur;
  if (n < 0 || n > 63) ptx_fail(L, f, what, line, "N = %d is not in 0..63", n);
  HBlock *h = hblock(L, f->blk);
  unsigned long long committed = h->th[f->index].bulk_committed;
  if (committed <= (unsigned long long)n) return;
  unsigned long long done_below = committed - (unsigned long long)n;
  for (unsigned i = 0; i < h->nbulk;) {
    BulkOp &op = h->bulk[i];
    if (op.thread != f->index || op.group >= done_below) {
      ++i;
    } else if (read) {
      bulk_read(h, op, L, f);
      ++i;
    } else {
      bulk_complete(L, f, h, i);
    }
  }
}

void mg_host_stmatrix(int trans, const unsigned *r, void *p, int line) {
  int op = trans ? MG_HOST_STSM_X4_T : MG_HOST_STSM_X4;
  Launch *L = current(op_name(op));
  Fiber *f = L->cur;
  need_full_warp(L, f, op, line);
  if ((uintptr_t)p % 16)
    ptx_fail(L, f, op_name(op), line, "row address %p is not 16-byte aligned", p);
  if (!smem_contains(p, 16))
    ptx_fail(L, f, op_name(op), line, "row address %p is not in shared memory", p);
  uint32_t in[4];
  memcpy(in, r, 16);
  unsigned bank = warp_arrive(L, f, op, 0, line, in, 4);
  const uint32_t(*w)[WIDE_IN] = f->blk->warps[f->warp].win[bank];
  unsigned m = f->lane / 8, row = f->lane % 8;
  uint16_t out[8];
  for (unsigned c = 0; c < 8; ++c) {
    unsigned lane, half;
    mg_host_stsm_src(trans, row, c, &lane, &half);
    out[c] = (uint16_t)(w[lane][m] >> (16 * half));
  }
  asan_check_write(p, 16);
  memcpy(p, out, 16); /* this lane's row, written by this lane */
}
