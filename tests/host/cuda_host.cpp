/* Host executor for generated CUDA kernels: scheduler, launcher, shared memory and PTX.
 *
 * Compiled into the same shared object as the kernel (see README.md). Every thread of a
 * block is a cooperative fiber of the calling OS thread; several blocks are resident at
 * once (Launch::blocks), started in a shuffled order. A fiber runs until it has to wait
 * (barrier, warp collective) or exits, then passes control to the next runnable fiber of
 * its block, chosen by pick_next(): at random from a seed, or round robin; now and then
 * (and when its block cannot go on) it switches back to the launcher, run_grid(), which
 * picks a resident block, swaps shared memory to that block's and runs it. When a block
 * has threads that have not exited and none can run, it is deadlocked: that is reported,
 * never waited on. Errors raised inside a fiber switch straight back to the launcher,
 * which abandons every fiber (their stacks are simply reused or unmapped).
 *
 * Nothing here is thread_local except the dynamic shared memory buffer: every
 * thread_local of the object is shared memory (cuda_host.h); the whole of it is filled
 * with NaN when a block first runs, saved when another block takes over and restored
 * when the block runs again. */
#include "cuda_host.h"
#include "host_launch.h"
/* the per-arch shared-memory limits: the generator's one table, beside this file's
 * directory in the source tree (harness.c hashes it into the build's key) */
#include "../../generator/gen/mg_arch.h"

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <link.h>
/* The mma and wgmma products 8 columns at a time (the harness builds with -mfma). */
#if defined(__FMA__) && defined(__AVX__)
#define MG_HOST_VEC_FMA 1
#include <immintrin.h>
#endif
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
 *   reported like heap overflows. One block's shared memory is live at a time (the others'
 *   are saved copies, see SmemCopy), so one instance suffices. */
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

/* Room for one more element in the growable array arr of n elements and capacity cap: when
 * n == cap, cap doubles (from `first`) by realloc. false when out of memory (arr and cap
 * unchanged). */
template <class T>
bool room_for_one(T *&arr, unsigned n, unsigned &cap, unsigned first = 16) {
  if (n < cap) return true;
  const unsigned c = cap ? 2 * cap : first;
  T *p = (T *)realloc(arr, c * sizeof *p);
  if (!p) return false;
  arr = p, cap = c;
  return true;
}

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
  if (!room_for_one(S.vars, S.nvars, S.cap)) abort();
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

/* When a block first becomes live: every shared-memory byte becomes 0xff (a NaN as fp32, bf16, fp16,
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

/* A block's shared memory while another resident block's is live (see Launch): the
 * contents of every shared-memory variable, in the order smem_regions visits them. */
struct SmemCopy {
  unsigned char *buf;
  size_t cap, size;
  unsigned nvars; /* emulated TLS: variables registered when it was saved */
};

/* Calls f(i, p, n) for each shared-memory region [p, p + n) of the current launch: with
 * native TLS the TLS block around the dynamic buffer's unused tail, emulated each
 * variable (i its index). */
template <class F> void smem_regions(F f) {
  Smem &S = g_smem;
  if (S.emulated) {
    for (unsigned i = 0; i < S.nvars; ++i) {
      const SmemVar &v = S.vars[i];
      if (!v.plain) f(i, (unsigned char *)v.ptr, v.dyn ? S.dyn_size : v.size);
    }
    return;
  }
  unsigned char *end = S.dyn + MG_HOST_MAX_DYN_SMEM;
  f(0u, S.tls_lo, (size_t)(S.dyn - S.tls_lo));
  f(1u, S.dyn, S.dyn_size);
  f(2u, end, (size_t)(S.tls_hi - end));
}

/* Static shared memory (bytes) the kernel object has: native TLS, its TLS block less the
 * dynamic buffer; emulated, the variables used so far. */
size_t smem_static_bytes() {
  Smem &S = g_smem;
  if (!S.emulated) return (size_t)(S.tls_hi - S.tls_lo) - MG_HOST_MAX_DYN_SMEM;
  size_t n = 0;
  for (unsigned i = 0; i < S.nvars; ++i)
    if (!S.vars[i].plain && !S.vars[i].dyn) n += S.vars[i].size;
  return n;
}

/* Copies the live shared memory into c. False when out of memory. */
bool smem_save(SmemCopy *c) {
  size_t need = 0;
  smem_regions([&](unsigned, unsigned char *, size_t n) { need += n; });
  if (need > c->cap) {
    unsigned char *b = (unsigned char *)realloc(c->buf, need);
    if (!b) return false;
    c->buf = b;
    c->cap = need;
  }
  size_t at = 0;
  smem_regions([&](unsigned, unsigned char *p, size_t n) {
    memcpy(c->buf + at, p, n);
    at += n;
  });
  c->size = at;
  c->nvars = g_smem.nvars;
  return true;
}

/* Makes c the live shared memory; variables registered after c was saved (emulated TLS)
 * become 0xff bytes (fill) or keep their contents. */
void smem_restore(const SmemCopy *c, bool fill) {
  size_t at = 0;
  bool emulated = g_smem.emulated;
  smem_regions([&](unsigned i, unsigned char *p, size_t n) {
    if (emulated && i >= c->nvars) {
      if (fill) memset(p, 0xff, n);
      return;
    }
    if (at + n <= c->size) memcpy(p, c->buf + at, n);
    at += n;
  });
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

/* F_WAIT_ASYNC: asleep in the Hopper emulation (hopper_host.cpp) on an mbarrier or a
 * warpgroup rendezvous, whose address is Fiber::wait. */
enum FiberState { F_READY, F_WAIT_BAR, F_WAIT_WARP, F_WAIT_ACTIVE, F_WAIT_ASYNC, F_DONE };

/* One cp.async: the source bytes, read at issue, and where they go when it lands: an
 * eager copy (half of them, drawn at issue) at a random scheduling point of its block
 * after the issue, at the latest at the wait; a lazy one at the wait. */
struct CpAsync {
  void *dst;
  unsigned long long group; /* the issuing thread's commit count at issue */
  unsigned size;
  bool landed, eager;
  unsigned char data[16];
};

struct Block;

struct Fiber {
  Ctx ctx;
  mg_host_thread_regs regs;
  Block *blk;     /* the resident block slot it belongs to */
  unsigned index; /* linear thread index in the block */
  unsigned lane, warp;
  int state;
  unsigned long long wait; /* barrier generation, warp instance or __activemask line */
  const char *wait_file;   /* and that __activemask's file (see same_site) */
  unsigned rpos;           /* index in Block::ready while F_READY and not running */
  char *stack;             /* lowest usable byte of the stack */
  /* cp.async: entries [cp_head, cp_n) of cp are pending or landed early, oldest first;
   * cp_live of them have not landed */
  CpAsync *cp;
  unsigned cp_head, cp_n, cp_cap, cp_live;
  unsigned cpf_pos; /* index in Block::cpf while cp_live > 0 */
  unsigned long long cp_committed;
  unsigned active; /* what __activemask returned */
};

/* Words each lane deposits for a wide collective (mma: a 4, b 2, c 4) and receives. */
enum { WIDE_IN = 10, WIDE_OUT = 4 };

struct Warp {
  unsigned nlanes, lanemask;
  unsigned arrived;             /* lanes arrived at the current instance */
  unsigned long long completed; /* instances completed; the current one is `completed` */
  int op, line;                 /* op and call site (line, file) of the current instance */
  const char *file;             /* NULL: the wide PTX ops (see warp_arrive) */
  unsigned vote[2];             /* ballot of instance k is in vote[k & 1] */
  unsigned am_waiting;          /* lanes waiting at __activemask (F_WAIT_ACTIVE) */
  unsigned long long slot[2][32];
  uint32_t win[2][32][WIDE_IN];
  uint32_t wout[2][32][WIDE_OUT];
};

/* A resident block: one of the Launch's slots, holding a block of the grid while it
 * runs. Its threads' fibers have their own stacks; its shared memory is the live one
 * while it is Launch::owner, else kept in `saved`. */
struct Block {
  bool live;    /* holds a block of the grid that has not finished */
  bool fresh;   /* its shared memory has never been live (NaN fill when it becomes so) */
  bool saved_ok;
  Fiber *fibers;
  Warp *warps;
  unsigned *ready; /* runnable fibers other than the running one */
  unsigned nready, ndone;
  /* block barrier */
  unsigned bar_arrived;
  unsigned long long bar_gen;
  int bar_kind, bar_line, bar_acc;
  int bar_result[2];
  /* fibers with cp.async copies that have not landed */
  unsigned *cpf;
  unsigned ncpf;
  SmemCopy saved;
};

struct Launch {
  mg_host_dim3 grid, block;
  unsigned nthreads, nwarps;
  Block *blocks;   /* nres resident slots */
  unsigned nres;
  Block *owner;    /* the slot whose shared memory is live, or NULL */
  unsigned long long nblocks, next_block; /* grid blocks, and the next to start */
  unsigned *order; /* shuffled: the order blocks start in (NULL: x, then y, then z) */
  Fiber *cur;      /* the running fiber */
  Ctx main;        /* the launcher's context */
  bool main_known;
  void (*fn)(void *);
  void *arg;
  /* schedule */
  bool round_robin, nan_fill;
  unsigned switch_period; /* a block switch at about one scheduling point in this many */
  unsigned long long seed;
  uint64_t rng;
  /* first error */
  int err;
  char msg[1024];
  /* opts.wgmma_trace (hopper_host.cpp records the issues) */
  mg_host_wgmma_issue *wgmma_trace;
  size_t wgmma_trace_cap, *wgmma_trace_len;
  /* opts.read_watch (note_read records cp.async and TMA reads) */
  const mg_host_read_watch *read_watch;
  /* fiber stacks */
  char *region;
  size_t region_size, stack_size, guard_size;
};

Launch *g_launch = nullptr; /* the launch running on this object, if any */
int g_busy = 0;             /* set while a launch runs (any OS thread) */

/* The Hopper emulation's hooks (hopper_host.cpp): a scheduling point of a block, a thread's
 * exit, a block's start, a deadlock's description, the end of a launch. */
void hopper_sched_point(Launch *L, Block *B);
void hopper_fiber_exit(Launch *L, Fiber *f);
void hopper_block_start(Launch *L, Block *B);
bool hopper_describe_deadlock(Launch *L, Block *B);
bool hopper_land_stuck(Launch *L, Block *B);
void hopper_launch_end(Launch *L);
void hopper_syncthreads_done(Launch *L, Block *B);

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
  case MG_HOST_STSM_X4: return "stmatrix.x4";
  case MG_HOST_STSM_X4_T: return "stmatrix.x4.trans";
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

void ready_push(Block *B, Fiber *f) {
  f->state = F_READY;
  f->rpos = B->nready;
  B->ready[B->nready++] = f->index;
}

void ready_remove(Block *B, Fiber *f) {
  unsigned last = B->ready[--B->nready];
  B->ready[f->rpos] = last;
  B->fibers[last].rpos = f->rpos;
}

/* ---- cp.async landing ---------------------------------------------------------------- */
void cp_land(Fiber *f, CpAsync &e) {
  memcpy(e.dst, e.data, e.size);
  e.landed = true;
  if (--f->cp_live == 0) { /* every entry has landed: f leaves the block's list */
    Block *B = f->blk;
    unsigned last = B->cpf[--B->ncpf];
    B->cpf[f->cpf_pos] = last;
    B->fibers[last].cpf_pos = f->cpf_pos;
    f->cp_head = f->cp_n = 0;
  } else {
    while (f->cp_head < f->cp_n && f->cp[f->cp_head].landed) f->cp_head++;
  }
}

/* At a scheduling point of block B (whose shared memory is live): up to two of its pending
 * eager copies, drawn at random among every thread's, land now. So in every schedule some
 * copies land early (a later copy into a buffer other warps still read shows) and some
 * only at the wait (a read before the wait and barrier shows). */
void cp_land_random(Launch *L, Block *B) {
  for (unsigned k = rng_below(L, 3); k && B->ncpf; --k) {
    Fiber *f = &B->fibers[B->cpf[rng_below(L, B->ncpf)]];
    CpAsync &e = f->cp[f->cp_head + rng_below(L, f->cp_n - f->cp_head)];
    if (!e.landed && e.eager) cp_land(f, e);
  }
}

/* Whether two call sites (file, line) are the same one: the lines equal and the files too
 * (the same __FILE__ literal, or equal strings; both NULL for the wide PTX ops, whose file
 * the templates' wrappers do not pass). */
bool same_site(const char *fa, int la, const char *fb, int lb) {
  return la == lb && (fa == fb || (fa && fb && !strcmp(fa, fb)));
}

/* A call site for messages: "file:line", or "line N" without a file. */
const char *site_str(char *buf, size_t n, const char *file, int line) {
  if (file) snprintf(buf, n, "%s:%d", file, line);
  else snprintf(buf, n, "line %d", line);
  return buf;
}

/* __activemask: a lane that reaches one waits (F_WAIT_ACTIVE) until no lane of its warp
 * can run any more: each has exited, or waits at a barrier, a collective or an
 * __activemask. Then the lanes at each __activemask call site form a converged group and
 * get its mask. Called when a lane arrives at one, exits, or starts waiting elsewhere.
 * self: the running fiber (made ready, not pushed). Returns whether groups completed. */
bool am_try(Block *B, unsigned warp, Fiber *self) {
  Warp *W = &B->warps[warp];
  if (!W->am_waiting) return false;
  Fiber *lanes = &B->fibers[warp * 32];
  for (unsigned l = 0; l < W->nlanes; ++l)
    if (lanes[l].state == F_READY) return false;
  for (unsigned l = 0; l < W->nlanes; ++l) {
    if (lanes[l].state != F_WAIT_ACTIVE) continue;
    unsigned m = 0;
    for (unsigned j = 0; j < W->nlanes; ++j)
      if (lanes[j].state == F_WAIT_ACTIVE &&
          same_site(lanes[j].wait_file, (int)lanes[j].wait, lanes[l].wait_file, (int)lanes[l].wait))
        m |= 1u << j;
    lanes[l].active = m;
  }
  for (unsigned l = 0; l < W->nlanes; ++l)
    if (lanes[l].state == F_WAIT_ACTIVE) {
      if (&lanes[l] != self)
        ready_push(B, &lanes[l]);
      else
        lanes[l].state = F_READY;
    }
  W->am_waiting = 0;
  return true;
}

/* The one place that decides which fiber of block B runs next (and takes it off the
 * ready list): shuffled, a uniformly random runnable fiber; round robin, the first
 * runnable one after `from` in index order. NULL when none can run. */
Fiber *pick_next(Launch *L, Block *B, unsigned from) {
  if (!B->nready) return nullptr;
  Fiber *f = nullptr;
  if (L->round_robin) {
    unsigned n = L->nthreads, i = from;
    for (unsigned k = 0; k < n && !f; ++k) {
      if (++i == n) i = 0;
      if (B->fibers[i].state == F_READY) f = &B->fibers[i];
    }
    if (!f) return nullptr; /* unreachable: nready > 0 */
  } else {
    f = &B->fibers[B->ready[rng_below(L, B->nready)]];
  }
  ready_remove(B, f);
  return f;
}

void resume(Launch *L, Ctx *from, Fiber *next, bool from_exits) {
  L->cur = next;
  mg_host_cur = &next->regs;
  ctx_switch(from, &next->ctx, from_exits);
}

/* Called by a fiber that has set its wait state, exited (F_DONE), or pushed itself on the
 * ready list (a yield): runs others until it may go on. This is a scheduling point of its
 * block: pending copies may land; then the next fiber of the block runs, or, with
 * probability 1/period (and always when none of the block can run), the launcher takes
 * over to switch blocks (see run_grid). */
void switch_away(Launch *L, Fiber *self, unsigned period = 0) {
  Block *B = self->blk;
  Fiber *next = nullptr;
  if (!L->round_robin) {
    if (B->ncpf) cp_land_random(L, B);
    hopper_sched_point(L, B);
    if (L->nres < 2 || rng_below(L, period ? period : L->switch_period))
      next = pick_next(L, B, self->index);
  } else {
    next = pick_next(L, B, self->index);
  }
  if (next == self) return; /* a yield that drew itself */
  bool exits = self->state == F_DONE;
  if (next)
    resume(L, &self->ctx, next, exits);
  else
    ctx_switch(&self->ctx, &L->main, exits); /* the launcher decides */
  L->cur = self;
  mg_host_cur = &self->regs;
}

/* After completing a barrier or collective: in a shuffled schedule the last thread to
 * arrive does not simply go on first. period: see switch_away (0: Launch::switch_period). */
void yield(Launch *L, Fiber *self, unsigned period = 0) {
  if (L->round_robin || !self->blk->nready) return;
  ready_push(self->blk, self);
  switch_away(L, self, period);
}

/* A block switch at one barrier completion in this many: barriers are few, so this makes
 * blocks interleave between the phases of even a short kernel at little cost. */
enum { BARRIER_SWITCH = 4 };

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
  Fiber *f = L->cur;
  L->fn(L->arg);
  f->state = F_DONE;
  f->blk->ndone++;
  hopper_fiber_exit(L, f);
  am_try(f->blk, f->warp, nullptr);
  if (f->cp_live) { /* copies still pending when a thread exits are dropped */
    Block *B = f->blk;
    unsigned last = B->cpf[--B->ncpf];
    B->cpf[f->cpf_pos] = last;
    B->fibers[last].cpf_pos = f->cpf_pos;
    f->cp_live = 0;
    f->cp_head = f->cp_n = 0;
  }
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
  ctx_switch(&L->cur->ctx, &L->main, true); /* the launcher abandons this fiber */
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

/* A block in which no fiber can run although some have not exited (and no other resident
 * block can run either). */
void describe_deadlock(Launch *L, Block *B) {
  if (hopper_describe_deadlock(L, B)) return;
  unsigned nbar = 0, nwarp = 0, ndone = 0;
  const Fiber *first_bar = nullptr;
  for (unsigned i = 0; i < L->nthreads; ++i) {
    const Fiber *f = &B->fibers[i];
    if (f->state == F_WAIT_BAR) {
      if (!nbar++) first_bar = f;
    } else if (f->state == F_WAIT_WARP) {
      nwarp++;
    } else if (f->state == F_DONE) {
      ndone++;
    }
  }
  char blk[64];
  snprintf(blk, sizeof blk, "block (%u,%u,%u)", B->fibers[0].regs.bid.x, B->fibers[0].regs.bid.y,
           B->fibers[0].regs.bid.z);
  char *m = L->msg;
  size_t cap = sizeof L->msg;
  L->err = MG_HOST_E_DIVERGENCE;
  if (nwarp) {
    /* The first warp that is stuck in a collective. */
    for (unsigned w = 0; w < L->nwarps; ++w) {
      const Warp *W = &B->warps[w];
      if (!W->arrived) continue;
      unsigned wdone = 0, wbar = 0;
      for (unsigned l = 0; l < W->nlanes; ++l) {
        int st = B->fibers[w * 32 + l].state;
        wdone += st == F_DONE;
        wbar += st == F_WAIT_BAR;
      }
      char others[128] = "";
      if (wbar)
        snprintf(others, sizeof others, "%u wait at %s (line %d)", wbar, bar_name(B->bar_kind),
                 B->bar_line);
      char site[256];
      snprintf(m, cap,
               "warp divergence in %s, warp %u: %u of %u lanes wait at %s (%s) while %u "
               "lanes have exited the kernel%s%s; in the block %u threads wait at warp "
               "collectives, %u at barriers, %u have exited",
               blk, w, W->arrived, W->nlanes, op_name(W->op),
               site_str(site, sizeof site, W->file, W->line), wdone, wbar ? " and " : "", others,
               nwarp, nbar, ndone);
      return;
    }
  }
  if (nbar) {
    char who[96];
    where(L, first_bar, who, sizeof who);
    snprintf(m, cap,
             "barrier divergence in %s: %u of %u threads wait at %s (line %d), e.g. %s, while %u "
             "threads have exited the kernel without reaching it",
             blk, nbar, L->nthreads, bar_name(B->bar_kind), B->bar_line, who, ndone);
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
 * and wakes the others. Every lane must arrive at the same collective at the same call
 * site, else that is warp divergence: the source line and file (same_site) for the
 * shuffles, votes and __syncwarp (cuda_host.h passes __FILE__); the line alone for the wide
 * PTX ops (file NULL: templates/mla_device.cuh's wrappers pass __builtin_LINE() only, and
 * passing the file too would change the headers the tuned store's template hashes cover). Returns the slot bank of that
 * instance. Banks alternate, so the next instance never overwrites slots a slow lane
 * still has to read: no lane can enter instance k+2 before every lane has left
 * instance k. */
unsigned warp_arrive(Launch *L, Fiber *f, int op, unsigned long long v, int line,
                     const uint32_t *in = nullptr, unsigned nin = 0, const char *file = nullptr) {
  Block *B = f->blk;
  Warp *W = &B->warps[f->warp];
  unsigned long long k = W->completed;
  unsigned bank = (unsigned)(k & 1);
  if (W->arrived == 0) {
    W->op = op;
    W->line = line;
    W->file = file;
  } else if (W->op != op || !same_site(W->file, W->line, file, line)) {
    char who[96], here[256], there[256];
    where(L, f, who, sizeof who);
    fail(L, MG_HOST_E_DIVERGENCE,
         "warp divergence: %s reached %s (%s) while %u lanes of its warp wait at %s (%s)", who,
         op_name(op), site_str(here, sizeof here, file, line), W->arrived, op_name(W->op),
         site_str(there, sizeof there, W->file, W->line));
  }
  W->slot[bank][f->lane] = v;
  for (unsigned i = 0; i < nin; ++i) W->win[bank][f->lane][i] = in[i];
  if (++W->arrived == W->nlanes) {
    if (op == MG_HOST_VOTE_BALLOT || op == MG_HOST_VOTE_ANY || op == MG_HOST_VOTE_ALL) {
      unsigned b = 0;
      for (unsigned l = 0; l < W->nlanes; ++l) b |= (W->slot[bank][l] != 0 ? 1u : 0u) << l;
      W->vote[bank] = b;
    } else if (op >= MG_HOST_LDSM_X1 && op <= MG_HOST_MMA_F16) {
      complete_wide(W, op, bank);
    }
    W->arrived = 0;
    W->completed = k + 1;
    Fiber *lanes = &B->fibers[f->warp * 32];
    for (unsigned l = 0; l < W->nlanes; ++l)
      if (lanes[l].state == F_WAIT_WARP) ready_push(B, &lanes[l]);
    yield(L, f);
  } else {
    f->state = F_WAIT_WARP;
    f->wait = k;
    am_try(B, f->warp, nullptr);
    switch_away(L, f);
  }
  return bank;
}

} // namespace

unsigned long long mg_host_shfl(int mode, unsigned mask, unsigned long long v, int b, int width,
                                int line, const char *file) {
  Launch *L = current(op_name(mode));
  Fiber *f = L->cur;
  const Warp *W = &f->blk->warps[f->warp];
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
  unsigned bank = warp_arrive(L, f, mode, v, line, nullptr, 0, file);
  return W->slot[bank][j];
}

unsigned mg_host_vote(int op, unsigned mask, int pred, int line, const char *file) {
  Launch *L = current(op_name(op));
  Fiber *f = L->cur;
  const Warp *W = &f->blk->warps[f->warp];
  check_mask(L, f, W, op, mask, line);
  unsigned bank = warp_arrive(L, f, op, pred ? 1u : 0u, line, nullptr, 0, file);
  unsigned b = W->vote[bank];
  switch (op) {
  case MG_HOST_VOTE_BALLOT: return b;
  case MG_HOST_VOTE_ANY: return b != 0;
  case MG_HOST_VOTE_ALL: return b == W->lanemask;
  }
  return 0;
}

/* The lanes of the caller's warp that reach this __activemask call site together: each
 * waits until no lane of its warp can run any more (see am_try). So exited lanes are not
 * in the mask, a short last warp gives its lane mask, and lanes that branched away to
 * wait elsewhere (another __activemask, a barrier, a collective) are left out. */
unsigned mg_host_activemask(int line, const char *file) {
  Launch *L = current("__activemask");
  Fiber *f = L->cur;
  Block *B = f->blk;
  Warp *W = &B->warps[f->warp];
  f->state = F_WAIT_ACTIVE;
  f->wait = (unsigned long long)(unsigned)line;
  f->wait_file = file;
  W->am_waiting++;
  if (am_try(B, f->warp, f))
    yield(L, f);
  else
    switch_away(L, f);
  return f->active;
}

int mg_host_syncthreads(int kind, int pred, int line) {
  Launch *L = current(bar_name(kind));
  Fiber *f = L->cur;
  Block *B = f->blk;
  if (B->bar_arrived == 0) {
    B->bar_kind = kind;
    B->bar_line = line;
    B->bar_acc = 0;
  } else if (B->bar_kind != kind || B->bar_line != line) {
    char who[96];
    where(L, f, who, sizeof who);
    fail(L, MG_HOST_E_DIVERGENCE,
         "barrier divergence: %s reached %s at line %d while %u threads of its block wait at %s at "
         "line %d",
         who, bar_name(kind), line, B->bar_arrived, bar_name(B->bar_kind), B->bar_line);
  }
  B->bar_acc += pred;
  unsigned long long g = B->bar_gen;
  if (++B->bar_arrived == L->nthreads) {
    B->bar_result[g & 1] = B->bar_acc;
    B->bar_arrived = 0;
    B->bar_gen = g + 1;
    hopper_syncthreads_done(L, B);
    for (unsigned i = 0; i < L->nthreads; ++i)
      if (B->fibers[i].state == F_WAIT_BAR) ready_push(B, &B->fibers[i]);
    yield(L, f, BARRIER_SWITCH);
  } else {
    f->state = F_WAIT_BAR;
    f->wait = g;
    am_try(B, f->warp, nullptr);
    switch_away(L, f);
  }
  int c = B->bar_result[g & 1];
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
  where(L, L->cur, who, sizeof who);
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

/* One warp's mma.m16n8k16 from the lanes' deposited fragments (in[l]: a0..a3, b0..b1,
 * c0..c3) into out[l][0..3]. Each d element is c followed by fmaf over k = 0..15 in
 * order; the innermost loop runs over a row's 8 columns so the compiler can vectorize it
 * (each element still sees the same operations in the same order). */
template <float (*cvt)(uint32_t)>
void mma_m16n8k16(const uint32_t (*in)[WIDE_IN], uint32_t (*out)[WIDE_OUT]) {
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
  for (unsigned row = 0; row < 16; ++row) {
#if MG_HOST_VEC_FMA
    __m256 acc = _mm256_loadu_ps(C[row]); /* a row of 8 in one register; fused, as fmaf */
    for (unsigned k = 0; k < 16; ++k)
      acc = _mm256_fmadd_ps(_mm256_set1_ps(A[row][k]), _mm256_loadu_ps(B[k]), acc);
    _mm256_storeu_ps(C[row], acc);
#else
    for (unsigned k = 0; k < 16; ++k)
      for (unsigned col = 0; col < 8; ++col) C[row][col] = fmaf(A[row][k], B[k][col], C[row][col]);
#endif
  }
  for (unsigned l = 0; l < 32; ++l) {
    unsigned g = l >> 2, t = l & 3;
    for (unsigned i = 0; i < 4; ++i) memcpy(&out[l][i], &C[g + 8 * (i >> 1)][2 * t + (i & 1)], 4);
  }
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
  if (op == MG_HOST_MMA_F16)
    mma_m16n8k16<f16_bits_to_float>(in, out);
  else
    mma_m16n8k16<bf16_bits_to_float>(in, out);
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
  const Warp *W = &f->blk->warps[f->warp];
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
  Fiber *f = L->cur;
  need_full_warp(L, f, op, line);
  uint32_t in[WIDE_IN];
  memcpy(in, a, 16);
  memcpy(in + 4, b, 8);
  memcpy(in + 6, c, 16);
  unsigned bank = warp_arrive(L, f, op, 0, line, in, WIDE_IN);
  memcpy(d, f->blk->warps[f->warp].wout[bank][f->lane], 16);
}

void mg_host_ldmatrix(int num, int trans, unsigned *r, const void *p, int line) {
  int op = MG_HOST_LDSM_X1 + (num == 4 ? 2 : num == 2 ? 1 : 0) + (trans ? 3 : 0);
  Launch *L = current(op_name(op));
  Fiber *f = L->cur;
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
  const uint32_t *res = f->blk->warps[f->warp].wout[bank][f->lane];
  for (int m = 0; m < num; ++m) r[m] = res[m];
}

/* opts.read_watch: fiber f's block read the n bytes at src (a cp.async source, a TMA box's
 * element). */
static void note_read(Launch *L, const Fiber *f, const void *src, size_t n) {
  const mg_host_read_watch *w = L->read_watch;
  if (!w || !n) return;
  const uintptr_t a = (uintptr_t)src, base = (uintptr_t)w->base, end = base + w->rows * w->row_bytes;
  if (a + n <= base || a >= end) return;
  const uint3 bid = f->regs.bid;
  const size_t b = bid.x + (size_t)L->grid.x * (bid.y + (size_t)L->grid.y * bid.z);
  const size_t r0 = (a < base ? 0 : a - base) / w->row_bytes;
  const size_t r1 = ((a + n > end ? end : a + n) - base - 1) / w->row_bytes;
  for (size_t r = r0; r <= r1; ++r) w->read[b * w->rows + r] = 1;
}

void mg_host_cp_async(void *dst, const void *src, unsigned cp_size, unsigned src_size, int line) {
  Launch *L = current("cp.async");
  Fiber *f = L->cur;
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
    if (!room_for_one(f->cp, f->cp_n, f->cp_cap))
      ptx_fail(L, f, "cp.async", line, "out of memory for pending copies");
  }
  CpAsync &e = f->cp[f->cp_n++];
  e.dst = dst;
  e.group = f->cp_committed;
  e.size = cp_size;
  e.landed = false;
  e.eager = !L->round_robin && rng_below(L, 2);
  if (f->cp_live++ == 0) { /* f joins its block's list of threads with pending copies */
    Block *B = f->blk;
    f->cpf_pos = B->ncpf;
    B->cpf[B->ncpf++] = f->index;
  }
  memset(e.data, 0, sizeof e.data);
  if (src_size) memcpy(e.data, src, src_size); /* read now: ASan names the issuing line */
  note_read(L, f, src, src_size);
}

void mg_host_cp_async_commit(int line) {
  (void)line;
  Launch *L = current("cp.async.commit_group");
  L->cur->cp_committed++;
}

void mg_host_cp_async_wait(int n, int line) {
  (void)line;
  Launch *L = current("cp.async.wait_group");
  Fiber *f = L->cur;
  unsigned long long keep = n > 0 ? (unsigned long long)n : 0;
  if (f->cp_committed <= keep) return;
  unsigned long long done_below = f->cp_committed - keep; /* groups [0, done_below) complete */
  /* Entries are in group order; those of the completed groups that have not landed at a
   * scheduling point land now. */
  for (unsigned i = f->cp_head; f->cp_live && i < f->cp_n && f->cp[i].group < done_below; ++i)
    if (!f->cp[i].landed) cp_land(f, f->cp[i]);
}

/* ================================================================= Hopper == */
#include "hopper_host.cpp"

/* ================================================================ launcher == */
namespace {

#if MG_HOST_ASAN
/* When ASan stops the process inside a launch: which block and thread made the access. */
void asan_death_note() {
  const Launch *L = g_launch;
  if (!L || !mg_host_cur) return;
  char who[96];
  where(L, L->cur, who, sizeof who);
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
  if (L->blocks)
    for (unsigned s = 0; s < L->nres; ++s) {
      Block *B = &L->blocks[s];
      if (B->fibers)
        for (unsigned i = 0; i < L->nthreads; ++i) free(B->fibers[i].cp);
      free(B->fibers);
      free(B->warps);
      free(B->ready);
      free(B->cpf);
      free(B->saved.buf);
    }
  hopper_launch_end(L);
  free(L->blocks);
  free(L->order);
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

/* An option: the value given, else the environment variable's (within [lo, hi]), else
 * dflt. */
unsigned opt_or_env(unsigned given, const char *env, unsigned lo, unsigned hi, unsigned dflt) {
  if (given) return given;
  if (const char *e = getenv(env)) {
    long v = strtol(e, nullptr, 0);
    if (v >= (long)lo && v <= (long)hi) return (unsigned)v;
  }
  return dflt;
}

/* The most shared memory (static + dynamic) one block may use on sm_<arch>, with the
 * opt-in (cudaFuncAttributeMaxDynamicSharedMemorySize): the generator's table
 * (generator/gen/mg_arch.h, the one owner; tests/host/harness.c keys the build on it).
 * 0: unknown arch. */
size_t arch_smem_limit(unsigned arch) {
  const mg_arch_facts *f = mg_arch_find((int)arch);
  return f ? (size_t)f->smem : 0;
}

/* Starts block number n of the start order in slot B: fresh barrier, warps, fibers (on the
 * slot's stacks) and cp.async state; its shared memory is NaN-filled when it first becomes
 * live (make_live). */
void start_block(Launch *L, Block *B, unsigned long long n) {
  unsigned long long b = L->order ? L->order[n] : n;
  unsigned bx = (unsigned)(b % L->grid.x);
  unsigned by = (unsigned)(b / L->grid.x % L->grid.y);
  unsigned bz = (unsigned)(b / ((unsigned long long)L->grid.x * L->grid.y));
  B->live = true;
  B->fresh = true;
  B->ndone = 0;
  B->bar_arrived = 0;
  B->bar_gen = 0;
  B->bar_kind = MG_HOST_BAR_SYNC;
  B->bar_line = 0;
  B->ncpf = 0;
  hopper_block_start(L, B);
  for (unsigned w = 0; w < L->nwarps; ++w) {
    Warp *W = &B->warps[w];
    W->arrived = 0;
    W->completed = 0;
    W->op = W->line = 0;
    W->file = nullptr;
    W->am_waiting = 0;
  }
  B->nready = 0;
  for (unsigned i = 0; i < L->nthreads; ++i) {
    Fiber *f = &B->fibers[i];
    ready_push(B, f);
    f->wait = 0;
    f->regs.bid.x = bx;
    f->regs.bid.y = by;
    f->regs.bid.z = bz;
    f->cp_head = f->cp_n = f->cp_live = 0;
    f->cp_committed = 0;
    ctx_make(&f->ctx, f->stack, L->stack_size);
  }
}

/* Makes B's shared memory the live one: saves the current owner's (when it is still
 * running), then restores B's, or NaN-fills it when B has never run. */
bool make_live(Launch *L, Block *B) {
  if (L->owner == B) return true;
  if (L->owner && L->owner->live && !smem_save(&L->owner->saved)) return false;
  if (B->fresh) {
    if (L->nan_fill) smem_fill_block();
    B->fresh = false;
  } else {
    smem_restore(&B->saved, L->nan_fill);
  }
  L->owner = B;
  return true;
}

/* Runs every block of the grid, nres at a time: the launcher starts blocks (in the shuffled
 * order) into free slots, picks a resident block that can run (at random), makes its
 * shared memory live and runs its fibers until they switch back here: the block finished,
 * cannot go on (a deadlock: no other block can wake it), or a scheduling point chose to
 * switch blocks. Returns 0 or the first error. */
int run_grid(Launch *L) {
  for (;;) {
    unsigned cand[64], nc = 0, nlive = 0;
    for (unsigned s = 0; s < L->nres; ++s) {
      Block *B = &L->blocks[s];
      if (!B->live && L->next_block < L->nblocks) start_block(L, B, L->next_block++);
      if (!B->live) continue;
      nlive++;
      if (B->nready) cand[nc++] = s;
    }
    if (!nlive) return 0;
    if (!nc) { /* unreachable: a block that cannot go on is reported below */
      snprintf(L->msg, sizeof L->msg, "no resident block can run");
      return L->err = MG_HOST_E_DIVERGENCE;
    }
    Block *B = &L->blocks[cand[L->round_robin ? 0 : rng_below(L, nc)]];
    if (!make_live(L, B)) {
      snprintf(L->msg, sizeof L->msg, "out of memory for a copy of a block's shared memory");
      return L->err = MG_HOST_E_NOMEM;
    }
    Fiber *first = pick_next(L, B, L->nthreads - 1);
    resume(L, &L->main, first, false);
    /* Back here: a fiber failed, the block finished or cannot go on, or a block switch. */
    mg_host_cur = nullptr;
    if (L->err) return L->err;
    Block *R = L->cur->blk;
    if (R->ndone == L->nthreads) {
      R->live = false;
      if (L->owner == R) L->owner = nullptr; /* its shared memory need not be kept */
    } else if (!R->nready && !(make_live(L, R) && hopper_land_stuck(L, R))) {
      describe_deadlock(L, R);
      return L->err;
    }
  }
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
  unsigned arch = opt_or_env(opts ? opts->arch : 0, "MG_HOST_ARCH", 1, 1000, 90);
  size_t limit = arch_smem_limit(arch);
  if (!limit)
    return config_error(msg, msg_len,
                        "unknown architecture sm_%u (known: 70, 72, 75, 80, 86, 87, 89, 90, 100, "
                        "101, 103, 110, 120, 121)", arch);
  if (dyn_smem > limit)
    return config_error(msg, msg_len,
                        "dynamic shared memory of %zu bytes exceeds sm_%u's limit of %zu bytes "
                        "(%zu KiB) per block",
                        dyn_smem, arch, limit, limit / 1024);
  if (opts && opts->wgmma_trace && !opts->wgmma_trace_len)
    return config_error(msg, msg_len, "wgmma_trace without wgmma_trace_len");
  if (opts && opts->read_watch && (!opts->read_watch->read || !opts->read_watch->row_bytes))
    return config_error(msg, msg_len, "read_watch without read or row_bytes");
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
  L->rng = splitmix64(L->seed) | 1;
  const char *sched = getenv("MG_HOST_SCHEDULE");
  L->round_robin = (opts && opts->round_robin) || (sched && !strcmp(sched, "rr"));
  L->nan_fill = !(opts && opts->no_nan_fill);
  if (opts && opts->wgmma_trace) {
    L->wgmma_trace = opts->wgmma_trace;
    L->wgmma_trace_cap = opts->wgmma_trace_cap;
    L->wgmma_trace_len = opts->wgmma_trace_len;
    *L->wgmma_trace_len = 0;
  }
  L->nblocks = (unsigned long long)grid.x * grid.y * grid.z;
  if (opts && opts->read_watch) {
    L->read_watch = opts->read_watch;
    memset(L->read_watch->read, 0, L->nblocks * L->read_watch->rows);
  }
  L->nres = L->round_robin ? 1 : opt_or_env(opts ? opts->resident_blocks : 0,
                                            "MG_HOST_RESIDENT_BLOCKS", 1, 32, 3);
  if (L->nres > L->nblocks) L->nres = (unsigned)L->nblocks;
  L->switch_period = opt_or_env(opts ? opts->block_switch : 0, "MG_HOST_BLOCK_SWITCH", 1,
                                1u << 30, 2048);
  L->nthreads = block.x * block.y * block.z;
  L->nwarps = (L->nthreads + 31) / 32;
  L->blocks = (Block *)calloc(L->nres, sizeof(Block));
  bool ok = L->blocks != nullptr;
  for (unsigned s = 0; ok && s < L->nres; ++s) {
    Block *B = &L->blocks[s];
    B->fibers = (Fiber *)calloc(L->nthreads, sizeof(Fiber));
    B->warps = (Warp *)calloc(L->nwarps, sizeof(Warp));
    B->ready = (unsigned *)calloc(L->nthreads, sizeof(unsigned));
    B->cpf = (unsigned *)calloc(L->nthreads, sizeof(unsigned));
    ok = B->fibers && B->warps && B->ready && B->cpf;
  }
  if (ok && !L->round_robin && L->nblocks > 1 && L->nblocks <= (1u << 24)) {
    /* The order blocks start in: a seeded shuffle (Fisher-Yates). */
    L->order = (unsigned *)malloc(L->nblocks * sizeof(unsigned));
    ok = L->order != nullptr;
    for (unsigned i = 0; ok && i < L->nblocks; ++i) {
      unsigned j = rng_below(L, i + 1);
      L->order[i] = L->order[j];
      L->order[j] = i;
    }
  }
  if (!ok) {
    snprintf(L->msg, sizeof L->msg, "out of memory");
    return finish(L, MG_HOST_E_NOMEM, msg, msg_len);
  }
  long page = sysconf(_SC_PAGESIZE);
  L->guard_size = page > 0 ? (size_t)page : 4096;
  L->stack_size = (stack_size_for(opts) + L->guard_size - 1) / L->guard_size * L->guard_size;
  L->region_size = (size_t)L->nres * L->nthreads * (L->stack_size + L->guard_size);
  void *region = mmap(nullptr, L->region_size, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (region == MAP_FAILED) {
    L->region = nullptr;
    snprintf(L->msg, sizeof L->msg, "cannot map %zu bytes of fiber stacks", L->region_size);
    return finish(L, MG_HOST_E_NOMEM, msg, msg_len);
  }
  L->region = (char *)region;
  if (!smem_begin_launch(dyn_smem, L->nan_fill)) {
    snprintf(L->msg, sizeof L->msg,
             "cannot find the TLS block of the kernel object (its shared memory)");
    return finish(L, MG_HOST_E_CONFIG, msg, msg_len);
  }
  size_t stat = smem_static_bytes();
  if (stat + dyn_smem > limit) {
    snprintf(L->msg, sizeof L->msg,
             "static (%zu bytes) and dynamic (%zu bytes) shared memory exceed sm_%u's limit of "
             "%zu bytes (%zu KiB) per block",
             stat, dyn_smem, arch, limit, limit / 1024);
    return finish(L, MG_HOST_E_CONFIG, msg, msg_len);
  }
  for (unsigned s = 0; s < L->nres; ++s) {
    Block *B = &L->blocks[s];
    for (unsigned i = 0; i < L->nthreads; ++i) {
      char *lo = L->region + ((size_t)s * L->nthreads + i) * (L->stack_size + L->guard_size);
      mprotect(lo, L->guard_size, PROT_NONE); /* overflow faults instead of corrupting */
      Fiber *f = &B->fibers[i];
      f->blk = B;
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
      B->warps[w].nlanes = n < 32 ? n : 32;
      B->warps[w].lanemask = n < 32 ? (1u << n) - 1 : 0xffffffffu;
    }
  }
  g_launch = L;
#if MG_HOST_ASAN
  __sanitizer_set_death_callback(asan_death_note);
#endif
  return finish(L, run_grid(L), msg, msg_len);
}

extern "C" __attribute__((visibility("default"))) int
mg_host_launch(mg_host_dim3 grid, mg_host_dim3 block, size_t dyn_smem, void (*fn)(void *),
               void *ctx, char *msg, size_t msg_len) {
  return mg_host_launch_ex(grid, block, dyn_smem, nullptr, fn, ctx, msg, msg_len);
}

extern "C" __attribute__((visibility("default"))) int mg_host_smem_emulated(void) {
  return g_smem.probed ? (g_smem.emulated ? 1 : 0) : -1;
}
