/* Host executor for generated CUDA kernels: scheduler and launcher.
 *
 * Compiled into the same shared object as the kernel (see README.md). Every thread of a
 * block is a cooperative fiber of the calling OS thread; blocks run one after another.
 * A fiber runs until it has to wait (barrier, warp collective) or exits, then passes
 * control to the next runnable fiber, chosen by pick_next(). When none is runnable and
 * some have not exited, the block is deadlocked: that is reported, never waited on.
 * Errors raised inside a fiber switch straight back to the launcher, which abandons the
 * block's fibers (their stacks are simply reused or unmapped). */
#include "cuda_host.h"
#include "host_launch.h"

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__x86_64__) && !defined(MG_HOST_USE_UCONTEXT)
#define MG_HOST_ASM_SWITCH 1
#else
#define MG_HOST_ASM_SWITCH 0
#include <ucontext.h>
#endif

/* ---- shim state read by the kernel through cuda_host.h ------------------------- */
__thread const mg_host_thread_regs *mg_host_cur = nullptr;

/* Dynamic shared memory: what `extern __shared__ T name[];` resolves to. */
thread_local unsigned char MG_HOST_DYN_SMEM_NAME[MG_HOST_MAX_DYN_SMEM]
    __attribute__((aligned(128), visibility("hidden")));

namespace {

/* ---- execution contexts ------------------------------------------------------ */
struct Ctx {
#if MG_HOST_ASM_SWITCH
  void *sp;
#else
  ucontext_t uc;
#endif
};

} // namespace

#if MG_HOST_ASM_SWITCH
/* void mg_host_ctx_switch(void **save_sp, void *load_sp): saves the callee-saved
 * registers of the SysV x86-64 ABI on the current stack, stores the stack pointer in
 * *save_sp, and resumes the context whose stack pointer is load_sp. */
extern "C" void mg_host_ctx_switch(void **save_sp, void *load_sp) MG_HOST_HIDDEN;
__asm__(".pushsection .text\n"
        ".globl mg_host_ctx_switch\n"
        ".hidden mg_host_ctx_switch\n"
        ".type mg_host_ctx_switch,@function\n"
        ".p2align 4\n"
        "mg_host_ctx_switch:\n"
        "  pushq %rbp\n"
        "  pushq %rbx\n"
        "  pushq %r12\n"
        "  pushq %r13\n"
        "  pushq %r14\n"
        "  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n"
        "  popq %r14\n"
        "  popq %r13\n"
        "  popq %r12\n"
        "  popq %rbx\n"
        "  popq %rbp\n"
        "  ret\n"
        ".size mg_host_ctx_switch, .-mg_host_ctx_switch\n"
        ".popsection\n");
#endif

namespace {

enum FiberState { F_READY, F_WAIT_BAR, F_WAIT_WARP, F_DONE };

struct Fiber {
  Ctx ctx;
  mg_host_thread_regs regs;
  unsigned index; /* linear thread index in the block */
  unsigned lane, warp;
  int state;
  unsigned long long wait; /* barrier generation or warp instance waited on */
  char *stack;             /* lowest usable byte of the stack */
};

struct Warp {
  unsigned nlanes, lanemask;
  unsigned arrived;             /* lanes arrived at the current instance */
  unsigned long long completed; /* instances completed; the current one is `completed` */
  int op, line;                 /* op and call line of the current instance */
  unsigned vote[2];             /* ballot of instance k is in vote[k & 1] */
  unsigned long long slot[2][32];
};

struct Launch {
  mg_host_dim3 grid, block;
  unsigned nthreads, nwarps, ndone;
  Fiber *fibers;
  Warp *warps;
  unsigned cur; /* index of the running fiber */
  Ctx main;     /* the launcher's context */
  void (*fn)(void *);
  void *arg;
  /* block barrier */
  unsigned bar_arrived;
  unsigned long long bar_gen;
  int bar_kind, bar_line, bar_acc;
  int bar_result[2];
  /* first error */
  int err;
  char msg[1024];
  /* fiber stacks */
  char *region;
  size_t region_size, stack_size, guard_size;
};

__thread Launch *g_launch = nullptr;

const char *op_name(int op) {
  switch (op) {
  case MG_HOST_SHFL_IDX: return "__shfl_sync";
  case MG_HOST_SHFL_UP: return "__shfl_up_sync";
  case MG_HOST_SHFL_DOWN: return "__shfl_down_sync";
  case MG_HOST_SHFL_BFLY: return "__shfl_xor_sync";
  case MG_HOST_VOTE_BALLOT: return "__ballot_sync";
  case MG_HOST_VOTE_ANY: return "__any_sync";
  case MG_HOST_VOTE_ALL: return "__all_sync";
  case MG_HOST_SYNCWARP: return "__syncwarp";
  }
  return "?";
}

const char *bar_name(int kind) {
  switch (kind) {
  case MG_HOST_BAR_COUNT: return "__syncthreads_count";
  case MG_HOST_BAR_AND: return "__syncthreads_and";
  case MG_HOST_BAR_OR: return "__syncthreads_or";
  }
  return "__syncthreads";
}

void ctx_switch(Ctx *from, Ctx *to) {
#if MG_HOST_ASM_SWITCH
  mg_host_ctx_switch(&from->sp, to->sp);
#else
  swapcontext(&from->uc, &to->uc);
#endif
}

void fiber_main();

void ctx_make(Ctx *c, char *stack_lo, size_t size) {
#if MG_HOST_ASM_SWITCH
  uintptr_t top = (uintptr_t)(stack_lo + size) & ~(uintptr_t)15;
  void **sp = (void **)top;
  *--sp = nullptr;                      /* fiber_main's return address: never used */
  *--sp = (void *)&fiber_main;          /* where mg_host_ctx_switch's ret goes */
  for (int i = 0; i < 6; ++i) *--sp = nullptr; /* rbp rbx r12 r13 r14 r15 */
  c->sp = sp;
#else
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = stack_lo;
  c->uc.uc_stack.ss_size = size;
  c->uc.uc_link = nullptr;
  makecontext(&c->uc, fiber_main, 0);
#endif
}

/* ---- scheduling ------------------------------------------------------------------- */
bool runnable(const Launch *L, const Fiber *f) {
  switch (f->state) {
  case F_READY: return true;
  case F_WAIT_BAR: return L->bar_gen != f->wait;
  case F_WAIT_WARP: return L->warps[f->warp].completed > f->wait;
  default: return false;
  }
}

/* The one place that decides which fiber runs next: round robin from the fiber after
 * `from`, `from` itself last. NULL when none can run. (A seeded shuffle goes here.) */
Fiber *pick_next(Launch *L, unsigned from) {
  unsigned n = L->nthreads;
  unsigned i = from;
  for (unsigned k = 0; k < n; ++k) {
    if (++i == n) i = 0;
    Fiber *f = &L->fibers[i];
    if (runnable(L, f)) return f;
  }
  return nullptr;
}

void resume(Launch *L, Ctx *from, Fiber *next) {
  next->state = F_READY;
  L->cur = next->index;
  mg_host_cur = &next->regs;
  ctx_switch(from, &next->ctx);
}

/* Called by a fiber that has set its wait state (or F_DONE): runs others until its
 * condition holds. Returns only once it may go on. */
void switch_away(Launch *L, Fiber *self) {
  Fiber *next = pick_next(L, self->index);
  if (next == self) {
    self->state = F_READY;
    return;
  }
  if (next)
    resume(L, &self->ctx, next);
  else
    ctx_switch(&self->ctx, &L->main); /* all exited, or deadlock: the launcher decides */
}

void fiber_main() {
  Launch *L = g_launch;
  Fiber *f = &L->fibers[L->cur];
  L->fn(L->arg);
  f->state = F_DONE;
  L->ndone++;
  switch_away(L, f);
  abort(); /* a finished fiber is never resumed */
}

/* ---- errors ------------------------------------------------------------------------- */
int where(const Launch *L, const Fiber *f, char *buf, size_t n) {
  const mg_host_thread_regs &r = f->regs;
  (void)L;
  return snprintf(buf, n, "block (%u,%u,%u) thread (%u,%u,%u) [warp %u lane %u]", r.bid.x, r.bid.y,
                  r.bid.z, r.tid.x, r.tid.y, r.tid.z, f->warp, f->lane);
}

void set_error(Launch *L, int code, const char *fmt, va_list ap) {
  if (L->err) return;
  L->err = code;
  vsnprintf(L->msg, sizeof L->msg, fmt, ap);
}

[[noreturn]] __attribute__((format(printf, 3, 4))) void fail(Launch *L, int code, const char *fmt,
                                                             ...) {
  va_list ap;
  va_start(ap, fmt);
  set_error(L, code, fmt, ap);
  va_end(ap);
  Fiber *self = &L->fibers[L->cur];
  ctx_switch(&self->ctx, &L->main); /* the launcher abandons this fiber */
  abort();
}

Launch *current(const char *what) {
  Launch *L = g_launch;
  if (!L || !mg_host_cur) {
    fprintf(stderr, "cuda_host: %s called outside mg_host_launch\n", what);
    abort();
  }
  return L;
}

/* A block in which no fiber can run although some have not exited. */
void describe_deadlock(Launch *L) {
  unsigned nbar = 0, nwarp = 0, ndone = 0;
  const Fiber *first_bar = nullptr;
  for (unsigned i = 0; i < L->nthreads; ++i) {
    const Fiber *f = &L->fibers[i];
    if (f->state == F_WAIT_BAR) {
      if (!nbar++) first_bar = f;
    } else if (f->state == F_WAIT_WARP) {
      nwarp++;
    } else if (f->state == F_DONE) {
      ndone++;
    }
  }
  char blk[64];
  snprintf(blk, sizeof blk, "block (%u,%u,%u)", L->fibers[0].regs.bid.x, L->fibers[0].regs.bid.y,
           L->fibers[0].regs.bid.z);
  char *m = L->msg;
  size_t cap = sizeof L->msg;
  L->err = MG_HOST_E_DIVERGENCE;
  if (nwarp) {
    /* The first warp that is stuck in a collective. */
    for (unsigned w = 0; w < L->nwarps; ++w) {
      const Warp *W = &L->warps[w];
      if (!W->arrived) continue;
      unsigned wdone = 0, wbar = 0;
      for (unsigned l = 0; l < W->nlanes; ++l) {
        int st = L->fibers[w * 32 + l].state;
        wdone += st == F_DONE;
        wbar += st == F_WAIT_BAR;
      }
      char others[128] = "";
      if (wbar)
        snprintf(others, sizeof others, "%u wait at %s (line %d)", wbar, bar_name(L->bar_kind),
                 L->bar_line);
      snprintf(m, cap,
               "warp divergence in %s, warp %u: %u of %u lanes wait at %s (line %d) while %u "
               "lanes have exited the kernel%s%s; in the block %u threads wait at warp "
               "collectives, %u at barriers, %u have exited",
               blk, w, W->arrived, W->nlanes, op_name(W->op), W->line, wdone, wbar ? " and " : "",
               others, nwarp, nbar, ndone);
      return;
    }
  }
  if (nbar) {
    char who[96];
    where(L, first_bar, who, sizeof who);
    snprintf(m, cap,
             "barrier divergence in %s: %u of %u threads wait at %s (line %d), e.g. %s, while %u "
             "threads have exited the kernel without reaching it",
             blk, nbar, L->nthreads, bar_name(L->bar_kind), L->bar_line, who, ndone);
    return;
  }
  snprintf(m, cap, "deadlock in %s: %u threads wait at warp collectives, %u at barriers, %u exited",
           blk, nwarp, nbar, ndone);
}

/* ---- warp collectives ------------------------------------------------------------- */
void check_mask(Launch *L, Fiber *f, const Warp *W, int op, unsigned mask, int line) {
  if (mask == 0xffffffffu || mask == W->lanemask) return;
  char who[96];
  where(L, f, who, sizeof who);
  fail(L, MG_HOST_E_MASK,
       "%s(mask=0x%08x) at line %d in %s: unsupported mask, only the full mask 0xffffffff is "
       "supported",
       op_name(op), mask, line, who);
}

/* Deposits v for the warp's current collective instance and waits until every lane of
 * the warp has deposited. Returns the slot bank of that instance. Banks alternate, so
 * the next instance never overwrites slots a slow lane still has to read: no lane can
 * enter instance k+2 before every lane has left instance k. */
unsigned warp_arrive(Launch *L, Fiber *f, int op, unsigned long long v, int line) {
  Warp *W = &L->warps[f->warp];
  unsigned long long k = W->completed;
  unsigned bank = (unsigned)(k & 1);
  if (W->arrived == 0) {
    W->op = op;
    W->line = line;
  } else if (W->op != op) {
    char who[96];
    where(L, f, who, sizeof who);
    fail(L, MG_HOST_E_DIVERGENCE,
         "warp divergence: %s reached %s (line %d) while %u lanes of its warp wait at %s (line %d)",
         who, op_name(op), line, W->arrived, op_name(W->op), W->line);
  }
  W->slot[bank][f->lane] = v;
  if (++W->arrived == W->nlanes) {
    if (op == MG_HOST_VOTE_BALLOT || op == MG_HOST_VOTE_ANY || op == MG_HOST_VOTE_ALL) {
      unsigned b = 0;
      for (unsigned l = 0; l < W->nlanes; ++l) b |= (W->slot[bank][l] != 0 ? 1u : 0u) << l;
      W->vote[bank] = b;
    }
    W->arrived = 0;
    W->completed = k + 1;
  } else {
    f->state = F_WAIT_WARP;
    f->wait = k;
    switch_away(L, f);
  }
  return bank;
}

} // namespace

unsigned long long mg_host_shfl(int mode, unsigned mask, unsigned long long v, int b, int width,
                                int line) {
  Launch *L = current(op_name(mode));
  Fiber *f = &L->fibers[L->cur];
  const Warp *W = &L->warps[f->warp];
  check_mask(L, f, W, mode, mask, line);
  if (width < 1 || width > 32 || (width & (width - 1))) {
    char who[96];
    where(L, f, who, sizeof who);
    fail(L, MG_HOST_E_MASK, "%s(width=%d) at line %d in %s: width must be a power of 2 up to 32",
         op_name(mode), width, line, who);
  }
  /* PTX shfl.sync with c = ((32 - width) << 8) | clamp, as CUDA's intrinsics pass it. */
  long long lane = f->lane;
  long long segmask = 32 - width;
  long long clamp = mode == MG_HOST_SHFL_UP ? 0 : 31;
  long long min_lane = lane & segmask;
  long long max_lane = min_lane | (clamp & ~segmask);
  long long j;
  bool pval;
  switch (mode) {
  case MG_HOST_SHFL_UP:
    j = lane - (long long)(unsigned)b;
    pval = j >= max_lane;
    break;
  case MG_HOST_SHFL_DOWN:
    j = lane + (long long)(unsigned)b;
    pval = j <= max_lane;
    break;
  case MG_HOST_SHFL_BFLY:
    j = lane ^ (long long)(unsigned)b;
    pval = j <= max_lane;
    break;
  default:
    j = min_lane | ((long long)(b & 31) & ~segmask);
    pval = j <= max_lane;
    break;
  }
  if (!pval) j = lane;
  if ((unsigned)j >= W->nlanes) {
    char who[96];
    where(L, f, who, sizeof who);
    fail(L, MG_HOST_E_MASK, "%s at line %d in %s reads lane %lld, which does not exist (the warp has %u lanes)",
         op_name(mode), line, who, j, W->nlanes);
  }
  unsigned bank = warp_arrive(L, f, mode, v, line);
  return L->warps[f->warp].slot[bank][j];
}

unsigned mg_host_vote(int op, unsigned mask, int pred, int line) {
  Launch *L = current(op_name(op));
  Fiber *f = &L->fibers[L->cur];
  const Warp *W = &L->warps[f->warp];
  check_mask(L, f, W, op, mask, line);
  unsigned bank = warp_arrive(L, f, op, pred ? 1u : 0u, line);
  unsigned b = W->vote[bank];
  switch (op) {
  case MG_HOST_VOTE_BALLOT: return b;
  case MG_HOST_VOTE_ANY: return b != 0;
  case MG_HOST_VOTE_ALL: return b == W->lanemask;
  }
  return 0;
}

unsigned mg_host_activemask(void) {
  Launch *L = current("__activemask");
  return L->warps[L->fibers[L->cur].warp].lanemask;
}

int mg_host_syncthreads(int kind, int pred, int line) {
  Launch *L = current(bar_name(kind));
  Fiber *f = &L->fibers[L->cur];
  if (L->bar_arrived == 0) {
    L->bar_kind = kind;
    L->bar_line = line;
    L->bar_acc = 0;
  } else if (L->bar_kind != kind || L->bar_line != line) {
    char who[96];
    where(L, f, who, sizeof who);
    fail(L, MG_HOST_E_DIVERGENCE,
         "barrier divergence: %s reached %s at line %d while %u threads of its block wait at %s at "
         "line %d",
         who, bar_name(kind), line, L->bar_arrived, bar_name(L->bar_kind), L->bar_line);
  }
  L->bar_acc += pred;
  unsigned long long g = L->bar_gen;
  if (++L->bar_arrived == L->nthreads) {
    L->bar_result[g & 1] = L->bar_acc;
    L->bar_arrived = 0;
    L->bar_gen = g + 1;
  } else {
    f->state = F_WAIT_BAR;
    f->wait = g;
    switch_away(L, f);
  }
  int c = L->bar_result[g & 1];
  switch (kind) {
  case MG_HOST_BAR_COUNT: return c;
  case MG_HOST_BAR_AND: return c == (int)L->nthreads;
  case MG_HOST_BAR_OR: return c != 0;
  }
  return 0;
}

void mg_host_trap(int line) {
  Launch *L = current("__trap");
  char who[96];
  where(L, &L->fibers[L->cur], who, sizeof who);
  fail(L, MG_HOST_E_TRAP, "__trap() at line %d in %s", line, who);
}

/* ---- launcher ------------------------------------------------------------------------ */
namespace {

int finish(Launch *L, int rc, char *msg, size_t msg_len) {
  if (msg && msg_len) snprintf(msg, msg_len, "%s", rc ? L->msg : "");
  if (L->region) munmap(L->region, L->region_size);
  free(L->fibers);
  free(L->warps);
  mg_host_cur = nullptr;
  if (g_launch == L) g_launch = nullptr;
  return rc;
}

int config_error(char *msg, size_t msg_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int config_error(char *msg, size_t msg_len, const char *fmt, ...) {
  if (msg && msg_len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, msg_len, fmt, ap);
    va_end(ap);
  }
  return MG_HOST_E_CONFIG;
}

size_t stack_size_from_env() {
  size_t kb = 64;
  if (const char *e = getenv("MG_HOST_STACK_KB")) {
    long v = strtol(e, nullptr, 10);
    if (v >= 16 && v <= 65536) kb = (size_t)v;
  }
  return kb * 1024;
}

/* Fresh barrier, warps and fibers (on the same stacks) for block (bx, by, bz). Filling
 * shared memory with NaNs for each block would go here. */
void begin_block(Launch *L, unsigned bx, unsigned by, unsigned bz) {
  L->ndone = 0;
  L->bar_arrived = 0;
  L->bar_gen = 0;
  L->bar_kind = MG_HOST_BAR_SYNC;
  L->bar_line = 0;
  for (unsigned w = 0; w < L->nwarps; ++w) {
    Warp *W = &L->warps[w];
    W->arrived = 0;
    W->completed = 0;
    W->op = W->line = 0;
  }
  for (unsigned i = 0; i < L->nthreads; ++i) {
    Fiber *f = &L->fibers[i];
    f->state = F_READY;
    f->wait = 0;
    f->regs.bid.x = bx;
    f->regs.bid.y = by;
    f->regs.bid.z = bz;
    ctx_make(&f->ctx, f->stack, L->stack_size);
  }
}

} // namespace

extern "C" __attribute__((visibility("default"))) int
mg_host_launch(mg_host_dim3 grid, mg_host_dim3 block, size_t dyn_smem, void (*fn)(void *),
               void *ctx, char *msg, size_t msg_len) {
  if (msg && msg_len) msg[0] = '\0';
  if (g_launch) {
    if (msg && msg_len) snprintf(msg, msg_len, "mg_host_launch called from inside a launch");
    return MG_HOST_E_BUSY;
  }
  if (!fn) return config_error(msg, msg_len, "no thread function");
  if (!block.x || !block.y || !block.z || !grid.x || !grid.y || !grid.z)
    return config_error(msg, msg_len, "empty grid (%u,%u,%u) or block (%u,%u,%u)", grid.x, grid.y,
                        grid.z, block.x, block.y, block.z);
  if (block.x > 1024 || block.y > 1024 || block.z > 64 ||
      (unsigned long long)block.x * block.y * block.z > 1024)
    return config_error(msg, msg_len,
                        "block (%u,%u,%u) is larger than 1024 threads or (1024,1024,64)", block.x,
                        block.y, block.z);
  if (grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535)
    return config_error(msg, msg_len, "grid (%u,%u,%u) exceeds (2^31-1,65535,65535)", grid.x,
                        grid.y, grid.z);
  if (dyn_smem > MG_HOST_MAX_DYN_SMEM)
    return config_error(msg, msg_len, "dynamic shared memory of %zu bytes exceeds %u bytes",
                        dyn_smem, MG_HOST_MAX_DYN_SMEM);

  Launch launch;
  memset((void *)&launch, 0, sizeof launch);
  Launch *L = &launch;
  L->grid = grid;
  L->block = block;
  L->fn = fn;
  L->arg = ctx;
  L->nthreads = block.x * block.y * block.z;
  L->nwarps = (L->nthreads + 31) / 32;
  L->fibers = (Fiber *)calloc(L->nthreads, sizeof(Fiber));
  L->warps = (Warp *)calloc(L->nwarps, sizeof(Warp));
  long page = sysconf(_SC_PAGESIZE);
  L->guard_size = page > 0 ? (size_t)page : 4096;
  L->stack_size = (stack_size_from_env() + L->guard_size - 1) / L->guard_size * L->guard_size;
  L->region_size = (size_t)L->nthreads * (L->stack_size + L->guard_size);
  void *region = mmap(nullptr, L->region_size, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (region == MAP_FAILED) {
    L->region = nullptr;
    snprintf(L->msg, sizeof L->msg, "cannot map %zu bytes of fiber stacks", L->region_size);
    return finish(L, MG_HOST_E_NOMEM, msg, msg_len);
  }
  L->region = (char *)region;
  if (!L->fibers || !L->warps) {
    snprintf(L->msg, sizeof L->msg, "out of memory");
    return finish(L, MG_HOST_E_NOMEM, msg, msg_len);
  }
  for (unsigned i = 0; i < L->nthreads; ++i) {
    char *lo = L->region + (size_t)i * (L->stack_size + L->guard_size);
    mprotect(lo, L->guard_size, PROT_NONE); /* overflow faults instead of corrupting */
    Fiber *f = &L->fibers[i];
    f->stack = lo + L->guard_size;
    f->index = i;
    f->lane = i % 32;
    f->warp = i / 32;
    f->regs.tid.x = i % block.x;
    f->regs.tid.y = (i / block.x) % block.y;
    f->regs.tid.z = i / (block.x * block.y);
    f->regs.bdim = dim3(block.x, block.y, block.z);
    f->regs.gdim = dim3(grid.x, grid.y, grid.z);
  }
  for (unsigned w = 0; w < L->nwarps; ++w) {
    unsigned n = L->nthreads - w * 32;
    L->warps[w].nlanes = n < 32 ? n : 32;
    L->warps[w].lanemask = n < 32 ? (1u << n) - 1 : 0xffffffffu;
  }
  g_launch = L;

  int rc = 0;
  for (unsigned bz = 0; bz < grid.z && !rc; ++bz)
    for (unsigned by = 0; by < grid.y && !rc; ++by)
      for (unsigned bx = 0; bx < grid.x && !rc; ++bx) {
        begin_block(L, bx, by, bz);
        resume(L, &L->main, &L->fibers[0]);
        /* Back here: every fiber exited, a fiber failed, or no fiber can run. */
        mg_host_cur = nullptr;
        if (L->err)
          rc = L->err;
        else if (L->ndone != L->nthreads) {
          describe_deadlock(L);
          rc = L->err;
        }
      }
  return finish(L, rc, msg, msg_len);
}
