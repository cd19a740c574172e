/* Host executor for generated CUDA kernels: scheduler, launcher, shared memory and PTX.
 *
 * Compiled into the same shared object as the kernel (see README.md). Every thread of a
 * block is a cooperative fiber of the calling OS thread; blocks run one after another.
 * A fiber runs until it has to wait (barrier, warp collective) or exits, then passes
 * control to the next runnable fiber, chosen by pick_next(): at random from a seed, or
 * round robin. When none is runnable and some have not exited, the block is deadlocked:
 * that is reported, never waited on. Errors raised inside a fiber switch straight back
 * to the launcher, which abandons the block's fibers (their stacks are simply reused or
 * unmapped).
 *
 * Nothing here is thread_local except the dynamic shared memory buffer: every
 * thread_local of the object is shared memory (cuda_host.h), and the whole of it is
 * filled with NaN before each block. */
#include "cuda_host.h"
#include "host_launch.h"

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define MG_HOST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MG_HOST_ASAN 1
#endif
#endif
#ifndef MG_HOST_ASAN
#define MG_HOST_ASAN 0
#endif
#if MG_HOST_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if defined(__x86_64__) && !defined(MG_HOST_USE_UCONTEXT)
#define MG_HOST_ASM_SWITCH 1
#else
#define MG_HOST_ASM_SWITCH 0
#include <ucontext.h>
#endif

/* ---- shim state read by the kernel through cuda_host.h ------------------------- */
const mg_host_thread_regs *mg_host_cur = nullptr;

/* Dynamic shared memory: what `extern __shared__ T name[];` resolves to. */
thread_local unsigned char MG_HOST_DYN_SMEM_NAME[MG_HOST_MAX_DYN_SMEM]
    __attribute__((aligned(128), visibility("hidden")));

/* ================================================================ shared memory == */
/* Two ways to find every shared-memory variable, decided at the first launch:
 *
 * - native TLS (g++, or clang without -femulated-tls): all thread_locals of this object
 *   are its TLS block, found with dl_iterate_phdr; filling it fills every static
 *   __shared__ array and the dynamic buffer.
 * - emulated TLS (clang -femulated-tls): the compiler turns each thread_local access into
 *   a call of __emutls_get_address(control object). This object defines that function
 *   (hidden, so it wins over libgcc's inside the object): each variable gets its own
 *   exactly sized heap block on first use, registered here. Under ASan every static
 *   __shared__ array thus has redzones, and the dynamic buffer is allocated per launch
 *   with exactly the requested size, so out-of-bounds shared-memory accesses are
 *   reported like heap overflows. Blocks run one at a time, so one instance suffices. */
namespace {

struct EmutlsObject { /* libgcc's and compiler-rt's struct __emutls_object */
  size_t size;
  size_t align;
  void *loc; /* ours: the variable's address, NULL until first use */
  void *templ;
};

struct SmemVar {
  EmutlsObject *obj;
  void *ptr;
  size_t size;
  bool dyn;   /* the dynamic buffer */
  bool plain; /* has an initializer: not shared memory (CUDA has none), never filled */
};

struct Smem {
  bool probed;             /* the first launch has found out which TLS model is used */
  bool emulated;           /* __emutls_get_address has been called */
  int fill;                /* byte new variables start with: 0xff (NaN) or 0 */
  SmemVar *vars;
  unsigned nvars, cap;
  EmutlsObject *dyn_obj;
  size_t dyn_alloc; /* emulated: bytes allocated for the dynamic buffer */
  /* current launch */
  unsigned char *dyn;      /* dynamic buffer */
  size_t dyn_size;         /* bytes the launch asked for */
  unsigned char *tls_lo, *tls_hi; /* native: this thread's TLS block of the object */
  bool tail_poisoned;      /* native + ASan: the dynamic buffer's unused tail */
};
Smem g_smem;

void *aligned_block(size_t align, size_t size) {
  void *p = nullptr;
  if (align < 16) align = 16;
  if (posix_memalign(&p, align, size ? size : 1)) {
    fprintf(stderr, "cuda_host: out of memory for %zu bytes of shared memory\n", size);
    abort();
  }
  return p;
}

void *emutls_register(EmutlsObject *o) {
  Smem &S = g_smem;
  S.emulated = true;
  if (S.nvars == S.cap) {
    unsigned cap = S.cap ? 2 * S.cap : 16;
    SmemVar *v = (SmemVar *)realloc(S.vars, cap * sizeof *v);
    if (!v) abort();
    S.vars = v;
    S.cap = cap;
  }
  SmemVar &v = S.vars[S.nvars++];
  v.obj = o;
  /* The dynamic buffer is the one 228 KiB thread_local: CUDA caps static __shared__ at
   * 48 KiB. */
  v.dyn = o->size == MG_HOST_MAX_DYN_SMEM && o->align == 128;
  v.plain = !v.dyn && o->templ != nullptr;
  if (v.dyn) {
    S.dyn_obj = o;
#if MG_HOST_ASAN
    S.dyn_alloc = S.dyn_size; /* exactly what the launch asked for (begin_launch) */
#else
    S.dyn_alloc = o->size;
#endif
    v.size = S.dyn_alloc;
  } else {
    v.size = o->size;
  }
  v.ptr = aligned_block(o->align, v.size);
  if (v.plain)
    memcpy(v.ptr, o->templ, v.size);
  else
    memset(v.ptr, S.fill, v.size);
  o->loc = v.ptr;
  return v.ptr;
}

} // namespace

/* Named with an asm label so that g++, which has no emulated TLS on this target and never
 * calls it, does not see a clash with a builtin. */
extern "C" void *mg_host_emutls_get_address(EmutlsObject *o) __asm__("__emutls_get_address")
    MG_HOST_HIDDEN;
extern "C" void *mg_host_emutls_get_address(EmutlsObject *o) {
  if (__builtin_expect(o->loc != nullptr, 1)) return o->loc;
  return emutls_register(o);
}

namespace {

struct TlsFind {
  uintptr_t probe;
  unsigned char *lo, *hi;
};

int tls_find_cb(struct dl_phdr_info *info, size_t, void *data) {
  TlsFind *t = (TlsFind *)data;
  bool mine = false;
  const ElfW(Phdr) *tls = nullptr;
  for (unsigned i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr) &ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_LOAD) {
      uintptr_t a = info->dlpi_addr + ph.p_vaddr;
      if (t->probe >= a && t->probe < a + ph.p_memsz) mine = true;
    } else if (ph.p_type == PT_TLS) {
      tls = &ph;
    }
  }
  if (!mine) return 0;
  if (tls && info->dlpi_tls_data) {
    t->lo = (unsigned char *)info->dlpi_tls_data;
    t->hi = t->lo + tls->p_memsz;
  }
  return 1;
}

/* The dynamic buffer's address; called through a volatile pointer, so that the compiler
 * cannot move the TLS access (emulated: the registration of the buffer, which reads and
 * writes g_smem) across what the caller does before and after. */
__attribute__((noinline)) void *dyn_address() { return (void *)MG_HOST_DYN_SMEM_NAME; }
void *(*volatile g_dyn_address)() = dyn_address;

/* At the start of a launch: finds (or, emulated, allocates) the dynamic buffer and, with
 * native TLS, this thread's TLS block. Returns false when it cannot find it. */
bool smem_begin_launch(size_t dyn_size, bool nan_fill) {
  Smem &S = g_smem;
  S.fill = nan_fill ? 0xff : 0;
  S.dyn_size = dyn_size;
  void *dyn = g_dyn_address(); /* emulated: registers the buffer on the first launch */
  S.probed = true;
  if (S.emulated) {
#if MG_HOST_ASAN
    /* A fresh block of exactly the requested size: ASan reports any access past it. */
    if (S.dyn_obj && S.dyn_alloc != dyn_size) {
      for (unsigned i = 0; i < S.nvars; ++i)
        if (S.vars[i].dyn) {
          free(S.vars[i].ptr);
          S.vars[i].ptr = aligned_block(128, dyn_size);
          S.vars[i].size = dyn_size;
          S.dyn_obj->loc = S.vars[i].ptr;
        }
      S.dyn_alloc = dyn_size;
    }
#endif
    S.dyn = S.dyn_obj ? (unsigned char *)S.dyn_obj->loc : (unsigned char *)dyn;
    S.tls_lo = S.tls_hi = nullptr;
    return true;
  }
  S.dyn = (unsigned char *)dyn;
  TlsFind t = {(uintptr_t)&g_smem, nullptr, nullptr};
  dl_iterate_phdr(tls_find_cb, &t);
  if (!t.lo || S.dyn < t.lo || S.dyn + MG_HOST_MAX_DYN_SMEM > t.hi) return false;
  S.tls_lo = t.lo;
  S.tls_hi = t.hi;
#if MG_HOST_ASAN
  size_t from = (dyn_size + 7) & ~(size_t)7;
  if (from < MG_HOST_MAX_DYN_SMEM) {
    __asan_poison_memory_region(S.dyn + from, MG_HOST_MAX_DYN_SMEM - from);
    S.tail_poisoned = true;
  }
#endif
  return true;
}

void smem_end_launch() {
#if MG_HOST_ASAN
  Smem &S = g_smem;
  if (S.tail_poisoned) __asan_unpoison_memory_region(S.dyn, MG_HOST_MAX_DYN_SMEM);
  S.tail_poisoned = false;
#endif
}

/* Before each block: every shared-memory byte becomes 0xff (a NaN as fp32, bf16, fp16,
 * fp64), so a read of smem the block has not written poisons what it computes. */
void smem_fill_block() {
  Smem &S = g_smem;
  if (S.emulated) {
    for (unsigned i = 0; i < S.nvars; ++i) {
      const SmemVar &v = S.vars[i];
      if (v.plain) continue;
      memset(v.ptr, 0xff, v.dyn ? S.dyn_size : v.size);
    }
    return;
  }
  memset(S.tls_lo, 0xff, (size_t)(S.dyn - S.tls_lo));
  memset(S.dyn, 0xff, S.dyn_size);
  unsigned char *end = S.dyn + MG_HOST_MAX_DYN_SMEM;
  memset(end, 0xff, (size_t)(S.tls_hi - end));
}

/* Whether [p, p + n) lies in the shared memory of the current launch. */
bool smem_contains(const void *p, size_t n) {
  const Smem &S = g_smem;
  const unsigned char *a = (const unsigned char *)p;
  if (a >= S.dyn && a + n <= S.dyn + S.dyn_size) return true;
  if (S.emulated) {
    for (unsigned i = 0; i < S.nvars; ++i) {
      const SmemVar &v = S.vars[i];
      const unsigned char *lo = (const unsigned char *)v.ptr;
      if (!v.dyn && !v.plain && a >= lo && a + n <= lo + v.size) return true;
    }
    return false;
  }
  if (a < S.tls_lo || a + n > S.tls_hi) return false;
  /* not in the unused tail of the dynamic buffer */
  return a + n <= S.dyn || a >= S.dyn + MG_HOST_MAX_DYN_SMEM;
}

/* ================================================================== fibers == */
struct Ctx {
#if MG_HOST_ASM_SWITCH
  void *sp;
#else
  ucontext_t uc;
#endif
  const void *stack_lo; /* for ASan's fiber annotations */
  size_t stack_size;
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

/* One cp.async: the source bytes, read at issue, and where they go at the wait. */
struct CpAsync {
  void *dst;
  unsigned long long group; /* the issuing thread's commit count at issue */
  unsigned size;
  unsigned char data[16];
};

struct Fiber {
  Ctx ctx;
  mg_host_thread_regs regs;
  unsigned index; /* linear thread index in the block */
  unsigned lane, warp;
  int state;
  unsigned long long wait; /* barrier generation or warp instance waited on */
  unsigned rpos;           /* index in Launch::ready while F_READY and not running */
  char *stack;             /* lowest usable byte of the stack */
  /* cp.async: entries [cp_head, cp_n) of cp are pending, oldest first */
  CpAsync *cp;
  unsigned cp_head, cp_n, cp_cap;
  unsigned long long cp_committed;
};

/* Words each lane deposits for a wide collective (mma: a 4, b 2, c 4) and receives. */
enum { WIDE_IN = 10, WIDE_OUT = 4 };

struct Warp {
  unsigned nlanes, lanemask;
  unsigned arrived;             /* lanes arrived at the current instance */
  unsigned long long completed; /* instances completed; the current one is `completed` */
  int op, line;                 /* op and call line of the current instance */
  unsigned vote[2];             /* ballot of instance k is in vote[k & 1] */
  unsigned long long slot[2][32];
  uint32_t win[2][32][WIDE_IN];
  uint32_t wout[2][32][WIDE_OUT];
};

struct Launch {
  mg_host_dim3 grid, block;
  unsigned nthreads, nwarps, ndone;
  Fiber *fibers;
  Warp *warps;
  unsigned cur; /* index of the running fiber */
  Ctx main;     /* the launcher's context */
  bool main_known;
  void (*fn)(void *);
  void *arg;
  /* schedule */
  unsigned *ready; /* runnable fibers other than the running one */
  unsigned nready;
  bool round_robin;
  unsigned long long seed;
  uint64_t rng;
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

Launch *g_launch = nullptr; /* the launch running on this object, if any */
int g_busy = 0;             /* set while a launch runs (any OS thread) */

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
  case MG_HOST_LDSM_X1: return "ldmatrix.x1";
  case MG_HOST_LDSM_X2: return "ldmatrix.x2";
  case MG_HOST_LDSM_X4: return "ldmatrix.x4";
  case MG_HOST_LDSM_X1_T: return "ldmatrix.x1.trans";
  case MG_HOST_LDSM_X2_T: return "ldmatrix.x2.trans";
  case MG_HOST_LDSM_X4_T: return "ldmatrix.x4.trans";
  case MG_HOST_MMA_BF16: return "mma.m16n8k16.bf16";
  case MG_HOST_MMA_F16: return "mma.m16n8k16.f16";
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

/* Switches from `from` to `to`; returns when something switches back to `from`.
 * from_exits: `from` is never resumed (ASan may drop its fake stack). */
void ctx_switch(Ctx *from, Ctx *to, bool from_exits) {
#if MG_HOST_ASAN
  void *fake = nullptr;
  __sanitizer_start_switch_fiber(from_exits ? nullptr : &fake, to->stack_lo, to->stack_size);
#else
  (void)from_exits;
#endif
#if MG_HOST_ASM_SWITCH
  mg_host_ctx_switch(&from->sp, to->sp);
#else
  swapcontext(&from->uc, &to->uc);
#endif
#if MG_HOST_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

void fiber_main();

void ctx_make(Ctx *c, char *stack_lo, size_t size) {
  c->stack_lo = stack_lo;
  c->stack_size = size;
#if MG_HOST_ASAN
  /* The frames an exited fiber left at the top of its stack (fiber_main, switch_away)
   * never returned, so their redzones are still poisoned: clear them for the reuse.
   * Everything below returned normally (or the launch was abandoned, see finish). */
  size_t used = size < 16384 ? size : 16384;
  __asan_unpoison_memory_region(stack_lo + size - used, used);
#endif
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
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

unsigned rng_below(Launch *L, unsigned n) { /* uniform in [0, n), xorshift64* */
  uint64_t x = L->rng;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  L->rng = x;
  uint32_t r = (uint32_t)((x * 0x2545f4914f6cdd1dull) >> 32);
  return (unsigned)(((uint64_t)r * n) >> 32);
}

void ready_push(Launch *L, Fiber *f) {
  f->state = F_READY;
  f->rpos = L->nready;
  L->ready[L->nready++] = f->index;
}

void ready_remove(Launch *L, Fiber *f) {
  unsigned last = L->ready[--L->nready];
  L->ready[f->rpos] = last;
  L->fibers[last].rpos = f->rpos;
}

/* The one place that decides which fiber runs next (and takes it off the ready list):
 * shuffled, a uniformly random runnable fiber; round robin, the first runnable one after
 * `from` in index order. NULL when none can run. */
Fiber *pick_next(Launch *L, unsigned from) {
  if (!L->nready) return nullptr;
  Fiber *f = nullptr;
  if (L->round_robin) {
    unsigned n = L->nthreads, i = from;
    for (unsigned k = 0; k < n && !f; ++k) {
      if (++i == n) i = 0;
      if (L->fibers[i].state == F_READY) f = &L->fibers[i];
    }
    if (!f) return nullptr; /* unreachable: nready > 0 */
  } else {
    f = &L->fibers[L->ready[rng_below(L, L->nready)]];
  }
  ready_remove(L, f);
  return f;
}

void resume(Launch *L, Ctx *from, Fiber *next, bool from_exits) {
  L->cur = next->index;
  mg_host_cur = &next->regs;
  ctx_switch(from, &next->ctx, from_exits);
}

/* Called by a fiber that has set its wait state, exited (F_DONE), or pushed itself on the
 * ready list (a yield): runs others until it may go on. */
void switch_away(Launch *L, Fiber *self) {
  Fiber *next = pick_next(L, self->index);
  if (next == self) return; /* a yield that drew itself */
  bool exits = self->state == F_DONE;
  if (next)
    resume(L, &self->ctx, next, exits);
  else
    ctx_switch(&self->ctx, &L->main, exits); /* all exited, or deadlock: the launcher decides */
  L->cur = self->index;
  mg_host_cur = &self->regs;
}

/* After completing a barrier or collective: in a shuffled schedule the last thread to
 * arrive does not simply go on first. */
void yield(Launch *L, Fiber *self) {
  if (L->round_robin || !L->nready) return;
  ready_push(L, self);
  switch_away(L, self);
}

void fiber_main() {
  Launch *L = g_launch;
#if MG_HOST_ASAN
  const void *from_lo;
  size_t from_size;
  __sanitizer_finish_switch_fiber(nullptr, &from_lo, &from_size);
  if (!L->main_known && ((const char *)from_lo < L->region ||
                         (const char *)from_lo >= L->region + L->region_size)) {
    L->main.stack_lo = from_lo; /* the launcher's stack: switches back to it need it */
    L->main.stack_size = from_size;
    L->main_known = true;
  }
#endif
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
  ctx_switch(&self->ctx, &L->main, true); /* the launcher abandons this fiber */
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

void complete_wide(Warp *W, int op, unsigned bank);

/* Deposits v (and, for wide collectives, the nin words of in) for the warp's current
 * collective instance and waits until every lane of the warp has deposited; the last
 * lane to arrive completes the instance (computing every lane's result of a wide one)
 * and wakes the others. Returns the slot bank of that instance. Banks alternate, so the
 * next instance never overwrites slots a slow lane still has to read: no lane can enter
 * instance k+2 before every lane has left instance k. */
unsigned warp_arrive(Launch *L, Fiber *f, int op, unsigned long long v, int line,
                     const uint32_t *in = nullptr, unsigned nin = 0) {
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
  for (unsigned i = 0; i < nin; ++i) W->win[bank][f->lane][i] = in[i];
  if (++W->arrived == W->nlanes) {
    if (op == MG_HOST_VOTE_BALLOT || op == MG_HOST_VOTE_ANY || op == MG_HOST_VOTE_ALL) {
      unsigned b = 0;
      for (unsigned l = 0; l < W->nlanes; ++l) b |= (W->slot[bank][l] != 0 ? 1u : 0u) << l;
      W->vote[bank] = b;
    } else if (op >= MG_HOST_LDSM_X1) {
      complete_wide(W, op, bank);
    }
    W->arrived = 0;
    W->completed = k + 1;
    Fiber *lanes = &L->fibers[f->warp * 32];
    for (unsigned l = 0; l < W->nlanes; ++l)
      if (lanes[l].state == F_WAIT_WARP) ready_push(L, &lanes[l]);
    yield(L, f);
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
    for (unsigned i = 0; i < L->nthreads; ++i)
      if (L->fibers[i].state == F_WAIT_BAR) ready_push(L, &L->fibers[i]);
    yield(L, f);
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

/* ===================================================================== PTX == */
namespace {

float bf16_bits_to_float(uint32_t h) {
  uint32_t u = (h & 0xffffu) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

float f16_bits_to_float(uint32_t h) {
  h &= 0xffffu;
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13); /* inf, NaN */
  } else if (exp) {
    u = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man) { /* subnormal: normalize */
    int e = -1;
    do {
      man <<= 1;
      ++e;
    } while (!(man & 0x400));
    u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
  } else {
    u = sign;
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Element (row, col) of the 8x8 b16 matrix whose rows lanes 8m..8m+7 deposited. */
uint32_t ldsm_elem(const uint32_t (*rows)[WIDE_IN], unsigned m, unsigned row, unsigned col) {
  return (rows[8 * m + row][col >> 1] >> (16 * (col & 1))) & 0xffffu;
}

void complete_wide(Warp *W, int op, unsigned bank) {
  const uint32_t(*in)[WIDE_IN] = W->win[bank];
  uint32_t(*out)[WIDE_OUT] = W->wout[bank];
  if (op <= MG_HOST_LDSM_X4_T) {
    bool trans = op >= MG_HOST_LDSM_X1_T;
    unsigned num = 1u << ((op - MG_HOST_LDSM_X1) % 3);
    for (unsigned i = 0; i < 32; ++i) {
      unsigned r = i / 4, c = 2 * (i % 4);
      for (unsigned m = 0; m < num; ++m)
        out[i][m] = trans ? ldsm_elem(in, m, c, r) | ldsm_elem(in, m, c + 1, r) << 16
                          : in[8 * m + r][i % 4];
    }
    return;
  }
  /* mma.m16n8k16.row.col, PTX ISA "Matrix Fragments for mma.m16n8k16 with floating point
   * type": groupID g = lane >> 2, threadID_in_group t = lane % 4. */
  float (*cvt)(uint32_t) = op == MG_HOST_MMA_F16 ? f16_bits_to_float : bf16_bits_to_float;
  float A[16][16], B[16][8], C[16][8];
  for (unsigned l = 0; l < 32; ++l) {
    unsigned g = l >> 2, t = l & 3;
    for (unsigned r = 0; r < 4; ++r) /* a[r] = elements a(2r), a(2r+1) */
      for (unsigned h = 0; h < 2; ++h)
        A[g + 8 * (r & 1)][2 * t + 8 * (r >> 1) + h] = cvt(in[l][r] >> (16 * h));
    for (unsigned r = 0; r < 2; ++r) /* b[r] = elements b(2r), b(2r+1) */
      for (unsigned h = 0; h < 2; ++h) B[2 * t + 8 * r + h][g] = cvt(in[l][4 + r] >> (16 * h));
    for (unsigned i = 0; i < 4; ++i) /* c[i] */
      memcpy(&C[g + 8 * (i >> 1)][2 * t + (i & 1)], &in[l][6 + i], 4);
  }
  for (unsigned l = 0; l < 32; ++l) {
    unsigned g = l >> 2, t = l & 3;
    for (unsigned i = 0; i < 4; ++i) {
      unsigned row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
      float acc = C[row][col];
      for (unsigned k = 0; k < 16; ++k) acc = fmaf(A[row][k], B[k][col], acc);
      memcpy(&out[l][i], &acc, 4);
    }
  }
}

[[noreturn]] __attribute__((format(printf, 5, 6))) void ptx_fail(Launch *L, Fiber *f,
                                                                 const char *what, int line,
                                                                 const char *fmt, ...) {
  char who[96], detail[512];
  where(L, f, who, sizeof who);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  fail(L, MG_HOST_E_PTX, "%s at line %d in %s: %s", what, line, who, detail);
}

void need_full_warp(Launch *L, Fiber *f, int op, int line) {
  const Warp *W = &L->warps[f->warp];
  if (W->nlanes != 32)
    ptx_fail(L, f, op_name(op), line, "needs a full warp, this one has %u lanes", W->nlanes);
}

#if MG_HOST_ASAN
/* Reports a write to [p, p + n) now, with this thread's stack (the kernel's line), when
 * ASan knows that memory is not addressable. */
void asan_check_write(void *p, size_t n) {
  if (char *bad = (char *)__asan_region_is_poisoned(p, n)) *(volatile char *)bad = 0;
}
#else
void asan_check_write(void *, size_t) {}
#endif

} // namespace

void mg_host_mma_m16n8k16(int kind, float *d, const unsigned *a, const unsigned *b,
                          const float *c, int line) {
  int op = kind ? MG_HOST_MMA_F16 : MG_HOST_MMA_BF16;
  Launch *L = current(op_name(op));
  Fiber *f = &L->fibers[L->cur];
  need_full_warp(L, f, op, line);
  uint32_t in[WIDE_IN];
  memcpy(in, a, 16);
  memcpy(in + 4, b, 8);
  memcpy(in + 6, c, 16);
  unsigned bank = warp_arrive(L, f, op, 0, line, in, WIDE_IN);
  memcpy(d, L->warps[f->warp].wout[bank][f->lane], 16);
}

void mg_host_ldmatrix(int num, int trans, unsigned *r, const void *p, int line) {
  int op = MG_HOST_LDSM_X1 + (num == 4 ? 2 : num == 2 ? 1 : 0) + (trans ? 3 : 0);
  Launch *L = current(op_name(op));
  Fiber *f = &L->fibers[L->cur];
  need_full_warp(L, f, op, line);
  uint32_t row[4] = {0, 0, 0, 0};
  if (f->lane < 8u * (unsigned)num) {
    if ((uintptr_t)p % 16)
      ptx_fail(L, f, op_name(op), line, "row address %p is not 16-byte aligned", p);
    if (!smem_contains(p, 16))
      ptx_fail(L, f, op_name(op), line, "row address %p is not in shared memory", p);
    memcpy(row, p, 16); /* this lane's row, read by this lane (so ASan names its line) */
  }
  unsigned bank = warp_arrive(L, f, op, 0, line, row, 4);
  const uint32_t *res = L->warps[f->warp].wout[bank][f->lane];
  for (int m = 0; m < num; ++m) r[m] = res[m];
}

void mg_host_cp_async(void *dst, const void *src, unsigned cp_size, unsigned src_size, int line) {
  Launch *L = current("cp.async");
  Fiber *f = &L->fibers[L->cur];
  if (cp_size != 4 && cp_size != 8 && cp_size != 16)
    ptx_fail(L, f, "cp.async", line, "copy size %u is not 4, 8 or 16", cp_size);
  if (src_size > cp_size)
    ptx_fail(L, f, "cp.async", line, "src-size %u exceeds the copy size %u", src_size, cp_size);
  if ((uintptr_t)dst % cp_size || (uintptr_t)src % cp_size)
    ptx_fail(L, f, "cp.async", line, "addresses %p (shared), %p (global) are not %u-byte aligned",
             dst, src, cp_size);
  if (!smem_contains(dst, cp_size))
    ptx_fail(L, f, "cp.async", line, "destination %p is not in shared memory", dst);
  asan_check_write(dst, cp_size);
  if (f->cp_n == f->cp_cap) {
    if (f->cp_head) { /* slide the pending entries down */
      memmove(f->cp, f->cp + f->cp_head, (f->cp_n - f->cp_head) * sizeof *f->cp);
      f->cp_n -= f->cp_head;
      f->cp_head = 0;
    }
    if (f->cp_n == f->cp_cap) {
      unsigned cap = f->cp_cap ? 2 * f->cp_cap : 16;
      CpAsync *p = (CpAsync *)realloc(f->cp, cap * sizeof *p);
      if (!p) ptx_fail(L, f, "cp.async", line, "out of memory for pending copies");
      f->cp = p;
      f->cp_cap = cap;
    }
  }
  CpAsync &e = f->cp[f->cp_n++];
  e.dst = dst;
  e.group = f->cp_committed;
  e.size = cp_size;
  memset(e.data, 0, sizeof e.data);
  if (src_size) memcpy(e.data, src, src_size); /* read now: ASan names the issuing line */
}

void mg_host_cp_async_commit(int line) {
  (void)line;
  Launch *L = current("cp.async.commit_group");
  L->fibers[L->cur].cp_committed++;
}

void mg_host_cp_async_wait(int n, int line) {
  (void)line;
  Launch *L = current("cp.async.wait_group");
  Fiber *f = &L->fibers[L->cur];
  unsigned long long keep = n > 0 ? (unsigned long long)n : 0;
  if (f->cp_committed <= keep) return;
  unsigned long long done_below = f->cp_committed - keep; /* groups [0, done_below) complete */
  while (f->cp_head < f->cp_n && f->cp[f->cp_head].group < done_below) {
    const CpAsync &e = f->cp[f->cp_head++];
    memcpy(e.dst, e.data, e.size);
  }
  if (f->cp_head == f->cp_n) f->cp_head = f->cp_n = 0;
}

/* ================================================================ launcher == */
namespace {

#if MG_HOST_ASAN
/* When ASan stops the process inside a launch: which block and thread made the access. */
void asan_death_note() {
  const Launch *L = g_launch;
  if (!L || !mg_host_cur) return;
  char who[96];
  where(L, &L->fibers[L->cur], who, sizeof who);
  if (L->round_robin)
    fprintf(stderr, "cuda_host: the kernel was running %s (round-robin schedule)\n", who);
  else
    fprintf(stderr, "cuda_host: the kernel was running %s (schedule seed %llu)\n", who, L->seed);
}
#endif

int finish(Launch *L, int rc, char *msg, size_t msg_len) {
  if (msg && msg_len) {
    if (rc && !L->round_robin && L->nthreads)
      snprintf(msg, msg_len, "%s (schedule seed %llu)", L->msg, L->seed);
    else
      snprintf(msg, msg_len, "%s", rc ? L->msg : "");
  }
  if (L->region) {
#if MG_HOST_ASAN
    __asan_unpoison_memory_region(L->region, L->region_size); /* abandoned frames */
#endif
    munmap(L->region, L->region_size);
  }
  if (L->fibers)
    for (unsigned i = 0; i < L->nthreads; ++i) free(L->fibers[i].cp);
  free(L->fibers);
  free(L->warps);
  free(L->ready);
  smem_end_launch();
  mg_host_cur = nullptr;
  if (g_launch == L) g_launch = nullptr;
  __atomic_store_n(&g_busy, 0, __ATOMIC_RELEASE);
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

size_t stack_size_for(const mg_host_launch_opts *o) {
  size_t kb = MG_HOST_ASAN ? 256 : 64;
  if (o && o->stack_kb) {
    kb = o->stack_kb;
  } else if (const char *e = getenv("MG_HOST_STACK_KB")) {
    long v = strtol(e, nullptr, 10);
    if (v >= 16 && v <= 65536) kb = (size_t)v;
  }
  return kb * 1024;
}

/* Fresh barrier, warps, fibers (on the same stacks), schedule and shared memory for
 * block (bx, by, bz). */
void begin_block(Launch *L, unsigned bx, unsigned by, unsigned bz, bool nan_fill) {
  L->ndone = 0;
  L->bar_arrived = 0;
  L->bar_gen = 0;
  L->bar_kind = MG_HOST_BAR_SYNC;
  L->bar_line = 0;
  uint64_t blk = ((uint64_t)bz * L->grid.y + by) * L->grid.x + bx;
  L->rng = splitmix64(L->seed ^ splitmix64(blk)) | 1;
  for (unsigned w = 0; w < L->nwarps; ++w) {
    Warp *W = &L->warps[w];
    W->arrived = 0;
    W->completed = 0;
    W->op = W->line = 0;
  }
  L->nready = 0;
  for (unsigned i = 0; i < L->nthreads; ++i) {
    Fiber *f = &L->fibers[i];
    ready_push(L, f);
    f->wait = 0;
    f->regs.bid.x = bx;
    f->regs.bid.y = by;
    f->regs.bid.z = bz;
    f->cp_head = f->cp_n = 0;
    f->cp_committed = 0;
    ctx_make(&f->ctx, f->stack, L->stack_size);
  }
  if (nan_fill) smem_fill_block();
}

} // namespace

extern "C" __attribute__((visibility("default"))) int
mg_host_launch_ex(mg_host_dim3 grid, mg_host_dim3 block, size_t dyn_smem,
                  const mg_host_launch_opts *opts, void (*fn)(void *), void *ctx, char *msg,
                  size_t msg_len) {
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
  int expected = 0;
  if (!__atomic_compare_exchange_n(&g_busy, &expected, 1, false, __ATOMIC_ACQUIRE,
                                   __ATOMIC_RELAXED)) {
    if (msg && msg_len)
      snprintf(msg, msg_len, "another OS thread is running a launch of this kernel object");
    return MG_HOST_E_BUSY;
  }

  Launch launch;
  memset((void *)&launch, 0, sizeof launch);
  Launch *L = &launch;
  L->grid = grid;
  L->block = block;
  L->fn = fn;
  L->arg = ctx;
  L->seed = opts ? opts->seed : 0;
  if (!L->seed) {
    const char *e = getenv("MG_HOST_SEED");
    L->seed = e && *e ? strtoull(e, nullptr, 0) : 1;
  }
  const char *sched = getenv("MG_HOST_SCHEDULE");
  L->round_robin = (opts && opts->round_robin) || (sched && !strcmp(sched, "rr"));
  bool nan_fill = !(opts && opts->no_nan_fill);
  L->nthreads = block.x * block.y * block.z;
  L->nwarps = (L->nthreads + 31) / 32;
  L->fibers = (Fiber *)calloc(L->nthreads, sizeof(Fiber));
  L->warps = (Warp *)calloc(L->nwarps, sizeof(Warp));
  L->ready = (unsigned *)calloc(L->nthreads, sizeof(unsigned));
  long page = sysconf(_SC_PAGESIZE);
  L->guard_size = page > 0 ? (size_t)page : 4096;
  L->stack_size = (stack_size_for(opts) + L->guard_size - 1) / L->guard_size * L->guard_size;
  L->region_size = (size_t)L->nthreads * (L->stack_size + L->guard_size);
  void *region = mmap(nullptr, L->region_size, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (region == MAP_FAILED) {
    L->region = nullptr;
    snprintf(L->msg, sizeof L->msg, "cannot map %zu bytes of fiber stacks", L->region_size);
    return finish(L, MG_HOST_E_NOMEM, msg, msg_len);
  }
  L->region = (char *)region;
  if (!L->fibers || !L->warps || !L->ready) {
    snprintf(L->msg, sizeof L->msg, "out of memory");
    return finish(L, MG_HOST_E_NOMEM, msg, msg_len);
  }
  if (!smem_begin_launch(dyn_smem, nan_fill)) {
    snprintf(L->msg, sizeof L->msg,
             "cannot find the TLS block of the kernel object (its shared memory)");
    return finish(L, MG_HOST_E_CONFIG, msg, msg_len);
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
#if MG_HOST_ASAN
  __sanitizer_set_death_callback(asan_death_note);
#endif

  int rc = 0;
  for (unsigned bz = 0; bz < grid.z && !rc; ++bz)
    for (unsigned by = 0; by < grid.y && !rc; ++by)
      for (unsigned bx = 0; bx < grid.x && !rc; ++bx) {
        begin_block(L, bx, by, bz, nan_fill);
        Fiber *first = pick_next(L, L->nthreads - 1);
        resume(L, &L->main, first, false);
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

extern "C" __attribute__((visibility("default"))) int
mg_host_launch(mg_host_dim3 grid, mg_host_dim3 block, size_t dyn_smem, void (*fn)(void *),
               void *ctx, char *msg, size_t msg_len) {
  return mg_host_launch_ex(grid, block, dyn_smem, nullptr, fn, ctx, msg, msg_len);
}

extern "C" __attribute__((visibility("default"))) int mg_host_smem_emulated(void) {
  return g_smem.probed ? (g_smem.emulated ? 1 : 0) : -1;
}
