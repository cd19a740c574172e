/* Host executor for generated CUDA kernels: the device-side shim.
 *
 * Force-included before a kernel's source so that g++ compiles the CUDA C++ text
 * unchanged, as C++17, for the CPU:
 *
 *   g++ -std=c++17 -O1 -fPIC -shared -I/usr/local/cuda/include -I tests/host \
 *       -include cuda_host.h -x c++ kernel.cu -x c++ tests/host/cuda_host.cpp -o k.so
 *
 * Threads of a block run as cooperative fibers of one OS thread (cuda_host.cpp); the
 * built-in variables read the running fiber's state, and barriers and warp collectives
 * switch fibers. See tests/host/README.md for what is emulated and what is not. */
#ifndef MG_CUDA_HOST_H
#define MG_CUDA_HOST_H

#if !defined(__cplusplus) || __cplusplus < 201703L
#error "cuda_host.h needs C++17 (g++ -std=c++17)"
#endif
#if defined(__CUDACC__) || defined(__CUDA_ARCH__)
#error "cuda_host.h is for host (g++) builds of kernels, not for nvcc/NVRTC"
#endif

/* Kernels may test this to know they run under the host executor. */
#define MG_HOST_EMULATION 1

/* Standard and CUDA headers first, so that later #includes of them by the kernel are
 * no-ops and never see the macros below (threadIdx, __shared__, ...). */
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <math.h>
#include <new>
#include <type_traits>

#include <cuda_runtime.h>
#include <device_launch_parameters.h>
#include <vector_types.h>
#include <vector_functions.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#define MG_HOST_HIDDEN __attribute__((visibility("hidden")))

/* ---- execution-space and storage keywords ------------------------------------ */
#undef __global__
#undef __device__
#undef __host__
#undef __noinline__
#undef __launch_bounds__
#undef __shared__
#define __global__
#define __device__
#define __host__
/* Empty rather than __attribute__((noinline)): libstdc++ spells the attribute
 * __attribute__((__noinline__)), which must keep compiling after this header. */
#define __noinline__
#define __launch_bounds__(...)
#undef __grid_constant__
#define __grid_constant__
#ifndef __forceinline__
#define __forceinline__ inline __attribute__((always_inline))
#endif
/* __align__(n) keeps CUDA's host definition, __attribute__((aligned(n))), which g++
 * accepts in every position CUDA code puts it (also between decl-specifiers, where
 * alignas() is not allowed). __restrict__ is a g++ keyword. */
#ifndef __align__
#define __align__(n) __attribute__((aligned(n)))
#endif

/* __shared__ -> thread_local. At block scope thread_local implies static storage, so
 * there is one copy per OS thread, shared by all fibers (threads) of the block that
 * runs on it; the executor keeps each resident block's contents and swaps them in when
 * that block runs, so that copy is per-block shared memory.
 * Unlike `static`, it also combines with `extern`:
 *   extern __shared__ __align__(16) unsigned char smem[];
 * refers to the dynamic shared memory buffer that cuda_host.cpp defines (228 KiB,
 * 128-byte aligned) under the name MG_HOST_DYN_SMEM_NAME, `smem` by default. A kernel
 * that names its extern array differently is built with -DMG_HOST_DYN_SMEM_NAME=name
 * (that define must reach cuda_host.cpp, e.g. on the same g++ command line).
 *
 * Every thread_local of the kernel's shared object is therefore shared memory, and
 * cuda_host.cpp fills all of it with NaN (0xff bytes) when a block first runs: with
 * native TLS it fills the module's TLS block; built with clang -femulated-tls, each
 * variable is allocated on its own (exactly sized, so ASan sees its bounds) by the
 * executor's __emutls_get_address. The executor itself keeps no thread_local state. */
#define __shared__ thread_local
#ifndef MG_HOST_DYN_SMEM_NAME
#define MG_HOST_DYN_SMEM_NAME smem
#endif

/* ---- built-in variables -------------------------------------------------------- */
struct mg_host_thread_regs {
  uint3 tid;
  uint3 bid;
  dim3 bdim;
  dim3 gdim;
};
/* Points at the running fiber's registers; the scheduler updates it on every switch.
 * A plain global, not thread_local (every thread_local is shared memory, see above):
 * one launch at a time per kernel object. */
extern const mg_host_thread_regs *mg_host_cur MG_HOST_HIDDEN;

#define threadIdx (mg_host_cur->tid)
#define blockIdx (mg_host_cur->bid)
#define blockDim (mg_host_cur->bdim)
#define gridDim (mg_host_cur->gdim)
#define warpSize 32

/* ---- scheduler entry points (cuda_host.cpp) ------------------------------------ */
enum {
  MG_HOST_SHFL_IDX = 0,
  MG_HOST_SHFL_UP = 1,
  MG_HOST_SHFL_DOWN = 2,
  MG_HOST_SHFL_BFLY = 3,
  MG_HOST_VOTE_BALLOT = 4,
  MG_HOST_VOTE_ANY = 5,
  MG_HOST_VOTE_ALL = 6,
  MG_HOST_SYNCWARP = 7,
  /* warp-wide PTX (see mg_host_ldmatrix and mg_host_mma_m16n8k16 below) */
  MG_HOST_LDSM_X1 = 8,
  MG_HOST_LDSM_X2 = 9,
  MG_HOST_LDSM_X4 = 10,
  MG_HOST_LDSM_X1_T = 11,
  MG_HOST_LDSM_X2_T = 12,
  MG_HOST_LDSM_X4_T = 13,
  MG_HOST_MMA_BF16 = 14,
  MG_HOST_MMA_F16 = 15,
  /* stmatrix (sm_90, hopper_host.h's mg_host_stmatrix) */
  MG_HOST_STSM_X4 = 16,
  MG_HOST_STSM_X4_T = 17
};
enum { MG_HOST_BAR_SYNC = 0, MG_HOST_BAR_COUNT = 1, MG_HOST_BAR_AND = 2, MG_HOST_BAR_OR = 3 };

/* All of these may switch fibers. A misuse (bad mask, divergence) does not return: the
 * launch is abandoned and mg_host_launch reports it. `line` is the caller's __LINE__;
 * `file` its __FILE__ (the warp collectives' call site is the pair: a kernel line and a
 * header line of the same number are different sites). */
MG_HOST_HIDDEN unsigned long long mg_host_shfl(int mode, unsigned mask, unsigned long long v,
                                               int b, int width, int line, const char *file);
MG_HOST_HIDDEN unsigned mg_host_vote(int op, unsigned mask, int pred, int line, const char *file);
/* The lanes of the warp that reach this __activemask call site together (exited lanes
 * and lanes that wait elsewhere are not in it). */
MG_HOST_HIDDEN unsigned mg_host_activemask(int line, const char *file);
MG_HOST_HIDDEN int mg_host_syncthreads(int kind, int pred, int line);
[[noreturn]] MG_HOST_HIDDEN void mg_host_trap(int line);

/* ---- PTX the templates use (called by the wrappers in templates/mla_device.cuh) ---- */
/* mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 d, a, b, c: a warp
 * collective. Every lane deposits its A (4 regs), B (2 regs) and C (4 floats) fragments;
 * the last lane to arrive assembles the 16x16 A, 16x8 B and 16x8 C with the PTX ISA
 * fragment layouts, computes D = A B + C in fp32 (fmaf over k = 0..15) and every lane
 * takes its D fragment. kind: 0 bf16, 1 f16. d may alias c. */
MG_HOST_HIDDEN void mg_host_mma_m16n8k16(int kind, float *d, const unsigned *a, const unsigned *b,
                                         const float *c, int line);
/* ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16 r, [p]: a warp collective.
 * Lanes 8m..8m+7 give the rows of matrix m (16-byte aligned shared-memory addresses;
 * other lanes' p is ignored); each reads its own row on arrival, and lane i receives in
 * r[m] row i/4, elements 2(i%4) and 2(i%4)+1 of matrix m (of its transpose with trans). */
MG_HOST_HIDDEN void mg_host_ldmatrix(int num, int trans, unsigned *r, const void *p, int line);
/* cp.async.{ca,cg}.shared.global [dst], [src], cp_size, src_size: src_size bytes are
 * read now, the rest up to cp_size is zero; nothing is written until the issuing thread
 * waits for the group (mg_host_cp_async_wait), so the data is not visible before. */
MG_HOST_HIDDEN void mg_host_cp_async(void *dst, const void *src, unsigned cp_size,
                                     unsigned src_size, int line);
/* cp.async.commit_group: closes this thread's current group. */
MG_HOST_HIDDEN void mg_host_cp_async_commit(int line);
/* cp.async.wait_group n: performs this thread's copies of every committed group but the
 * newest n (copies not yet committed stay pending). */
MG_HOST_HIDDEN void mg_host_cp_async_wait(int n, int line);

/* Hopper (sm_90a) PTX: mbarrier, TMA, wgmma (templates/mla_device_sm90.cuh). */
#include "hopper_host.h"

/* ---- barriers ------------------------------------------------------------------ */
#define __syncthreads() mg_host_syncthreads(MG_HOST_BAR_SYNC, 1, __LINE__)
#define __syncthreads_count(p) mg_host_syncthreads(MG_HOST_BAR_COUNT, (p) ? 1 : 0, __LINE__)
#define __syncthreads_and(p) mg_host_syncthreads(MG_HOST_BAR_AND, (p) ? 1 : 0, __LINE__)
#define __syncthreads_or(p) mg_host_syncthreads(MG_HOST_BAR_OR, (p) ? 1 : 0, __LINE__)
#define __trap() mg_host_trap(__LINE__)

/* Fibers never run concurrently and memory is coherent: fences only stop the compiler. */
static inline void __threadfence(void) { __asm__ __volatile__("" ::: "memory"); }
static inline void __threadfence_block(void) { __asm__ __volatile__("" ::: "memory"); }
static inline void __threadfence_system(void) { __asm__ __volatile__("" ::: "memory"); }

/* ---- warp collectives ---------------------------------------------------------- */
/* Any trivially copyable value of at most 8 bytes (int, unsigned, float, double,
 * long long, __half2, __nv_bfloat162, ...) travels as its bytes. Only full masks are
 * supported; width is 1, 2, 4, 8, 16 or 32 and lanes follow PTX shfl.sync rules. */
template <class T> static inline unsigned long long mg_host_to_bits(const T &v) {
  /* Not is_trivially_copyable: __half2 and __nv_bfloat162 declare move constructors. */
  static_assert(std::is_trivially_destructible<T>::value, "shuffled type must be a plain value");
  static_assert(sizeof(T) <= 8, "shuffled type must be at most 8 bytes");
  unsigned long long b = 0;
  std::memcpy(&b, (const void *)&v, sizeof(T));
  return b;
}
template <class T> static inline T mg_host_from_bits(unsigned long long b) {
  T v;
  std::memcpy((void *)&v, &b, sizeof(T));
  return v;
}

#define MG_HOST_SHFL_FN(name, mode, btype)                                                      \
  template <class T> static inline T name##_at(const char *file, int line, unsigned mask,   \
                                                T var, btype b, int width = 32) {            \
    return mg_host_from_bits<T>(                                                             \
        mg_host_shfl(mode, mask, mg_host_to_bits(var), (int)b, width, line, file));          \
  }
MG_HOST_SHFL_FN(mg_host_shfl_idx, MG_HOST_SHFL_IDX, int)
MG_HOST_SHFL_FN(mg_host_shfl_up, MG_HOST_SHFL_UP, unsigned)
MG_HOST_SHFL_FN(mg_host_shfl_down, MG_HOST_SHFL_DOWN, unsigned)
MG_HOST_SHFL_FN(mg_host_shfl_xor, MG_HOST_SHFL_BFLY, int)
#undef MG_HOST_SHFL_FN

#define __shfl_sync(...) mg_host_shfl_idx_at(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_up_sync(...) mg_host_shfl_up_at(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_down_sync(...) mg_host_shfl_down_at(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_xor_sync(...) mg_host_shfl_xor_at(__FILE__, __LINE__, __VA_ARGS__)

/* A call site's file and line travel in a function object, so that __syncwarp() and
 * __syncwarp(mask) both work (they identify the call site, see warp_arrive). */
struct mg_host_syncwarp_at {
  const char *file;
  int line;
  void operator()(unsigned mask = 0xffffffffu) const {
    (void)mg_host_vote(MG_HOST_SYNCWARP, mask, 0, line, file);
  }
};
#define __syncwarp(...) (mg_host_syncwarp_at{__FILE__, __LINE__}(__VA_ARGS__))
#define __ballot_sync(mask, pred) mg_host_vote(MG_HOST_VOTE_BALLOT, (mask), (pred) ? 1 : 0, __LINE__, __FILE__)
#define __any_sync(mask, pred) ((int)mg_host_vote(MG_HOST_VOTE_ANY, (mask), (pred) ? 1 : 0, __LINE__, __FILE__))
#define __all_sync(mask, pred) ((int)mg_host_vote(MG_HOST_VOTE_ALL, (mask), (pred) ? 1 : 0, __LINE__, __FILE__))
#define __activemask() mg_host_activemask(__LINE__, __FILE__)

/* ---- integer intrinsics -------------------------------------------------------- */
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
static inline unsigned __brev(unsigned x) {
  x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
  x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
  x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
  return __builtin_bswap32(x);
}
static inline unsigned __umulhi(unsigned a, unsigned b) {
  return (unsigned)(((unsigned long long)a * b) >> 32);
}
static inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }

/* CUDA's min/max overloads (the mixed int/unsigned ones pick unsigned, as in CUDA). */
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline unsigned min(int a, unsigned b) { return min((unsigned)a, b); }
static inline unsigned max(int a, unsigned b) { return max((unsigned)a, b); }
static inline unsigned min(unsigned a, int b) { return min(a, (unsigned)b); }
static inline unsigned max(unsigned a, int b) { return max(a, (unsigned)b); }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
static inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }
static inline double min(float a, double b) { return fmin(a, b); }
static inline double max(float a, double b) { return fmax(a, b); }
static inline double min(double a, float b) { return fmin(a, b); }
static inline double max(double a, float b) { return fmax(a, b); }
static inline unsigned umin(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned umax(unsigned a, unsigned b) { return a > b ? a : b; }

/* ---- float intrinsics ---------------------------------------------------------- */
/* glibc declares __expf, __logf, ... as internal names it does not export: map the
 * CUDA fast intrinsics with function-like macros so calls never bind to those. */
#define __expf(x) (::expf(x))
#define __exp10f(x) (::exp10f(x))
#define __logf(x) (::logf(x))
#define __log2f(x) (::log2f(x))
#define __log10f(x) (::log10f(x))
#define __powf(x, y) (::powf((x), (y)))
#define __sinf(x) (::sinf(x))
#define __cosf(x) (::cosf(x))
#define __tanf(x) (::tanf(x))
static inline float rsqrtf(float x) { return 1.0f / ::sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / ::sqrt(x); }
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fsqrt_rn(float x) { return ::sqrtf(x); }
static inline float __frsqrt_rn(float x) { return 1.0f / ::sqrtf(x); }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fmaf_rn(float a, float b, float c) { return ::fmaf(a, b, c); }
static inline float __saturatef(float x) { return x > 0.0f ? (x < 1.0f ? x : 1.0f) : 0.0f; }
static inline float __int_as_float(int x) { float f; std::memcpy(&f, &x, 4); return f; }
static inline float __uint_as_float(unsigned x) { float f; std::memcpy(&f, &x, 4); return f; }
static inline int __float_as_int(float f) { int x; std::memcpy(&x, &f, 4); return x; }
static inline unsigned __float_as_uint(float f) { unsigned x; std::memcpy(&x, &f, 4); return x; }
static inline double __longlong_as_double(long long x) { double d; std::memcpy(&d, &x, 8); return d; }
static inline long long __double_as_longlong(double d) { long long x; std::memcpy(&x, &d, 8); return x; }
static inline int __float2int_rn(float x) { return (int)::nearbyintf(x); }
static inline int __float2int_rz(float x) { return (int)x; }
static inline unsigned __float2uint_rn(float x) { return (unsigned)::nearbyintf(x); }
static inline float __int2float_rn(int x) { return (float)x; }
static inline float __uint2float_rn(unsigned x) { return (float)x; }

/* ---- half/bf16 math the CUDA headers leave device-only ------------------------ */
/* Computed in float, rounded once to the 16-bit type. Templates with a defaulted
 * parameter, so a non-template a newer cuda_fp16.h/cuda_bf16.h declares for the host
 * wins overload resolution instead of clashing. */
#define MG_HOST_H16_MATH(T1, T2, TOF, FROMF, PAIR)                                           \
  template <class = void> static inline T1 __hfma(const T1 a, const T1 b, const T1 c) {     \
    return FROMF(::fmaf(TOF(a), TOF(b), TOF(c)));                                           \
  }                                                                                          \
  template <class = void> static inline T2 __hfma2(const T2 a, const T2 b, const T2 c) {    \
    return PAIR(::fmaf(__low2float(a), __low2float(b), __low2float(c)),                      \
                ::fmaf(__high2float(a), __high2float(b), __high2float(c)));                  \
  }                                                                                          \
  template <class = void> static inline T2 __hfma2_relu(const T2 a, const T2 b, const T2 c) { \
    float lo = ::fmaf(__low2float(a), __low2float(b), __low2float(c));                       \
    float hi = ::fmaf(__high2float(a), __high2float(b), __high2float(c));                    \
    return PAIR(lo > 0.0f ? lo : (lo != lo ? lo : 0.0f), hi > 0.0f ? hi : (hi != hi ? hi : 0.0f)); \
  }                                                                                          \
  MG_HOST_H16_UNARY(T1, T2, TOF, FROMF, PAIR, hexp, h2exp, ::expf(x))                        \
  MG_HOST_H16_UNARY(T1, T2, TOF, FROMF, PAIR, hexp2, h2exp2, ::exp2f(x))                     \
  MG_HOST_H16_UNARY(T1, T2, TOF, FROMF, PAIR, hlog, h2log, ::logf(x))                        \
  MG_HOST_H16_UNARY(T1, T2, TOF, FROMF, PAIR, hlog2, h2log2, ::log2f(x))                     \
  MG_HOST_H16_UNARY(T1, T2, TOF, FROMF, PAIR, hsqrt, h2sqrt, ::sqrtf(x))                     \
  MG_HOST_H16_UNARY(T1, T2, TOF, FROMF, PAIR, hrsqrt, h2rsqrt, 1.0f / ::sqrtf(x))            \
  MG_HOST_H16_UNARY(T1, T2, TOF, FROMF, PAIR, hrcp, h2rcp, 1.0f / x)
#define MG_HOST_H16_UNARY(T1, T2, TOF, FROMF, PAIR, n1, n2, expr)                              \
  template <class = void> static inline T1 n1(const T1 a) {                                 \
    float x = TOF(a);                                                                        \
    return FROMF(expr);                                                                      \
  }                                                                                          \
  template <class = void> static inline T2 n2(const T2 a) {                                 \
    float x = __low2float(a);                                                                \
    float lo = (expr);                                                                       \
    x = __high2float(a);                                                                     \
    return PAIR(lo, (expr));                                                                 \
  }
MG_HOST_H16_MATH(__nv_bfloat16, __nv_bfloat162, __bfloat162float, __float2bfloat16,
                 __floats2bfloat162_rn)
MG_HOST_H16_MATH(__half, __half2, __half2float, __float2half, __floats2half2_rn)
#undef MG_HOST_H16_UNARY
#undef MG_HOST_H16_MATH

/* ---- memory -------------------------------------------------------------------- */
template <class T> static inline T __ldg(const T *p) { return *p; }

/* Fibers are cooperative (no switch inside these), so plain read-modify-writes are
 * atomic. Each returns the old value, as in CUDA. */
#define MG_HOST_ATOMIC_RMW(name, T, expr)                                                        \
  static inline T name(T *addr, T val) {                                                     \
    T old = *addr;                                                                           \
    *addr = (expr);                                                                          \
    return old;                                                                              \
  }
MG_HOST_ATOMIC_RMW(atomicAdd, int, old + val)
MG_HOST_ATOMIC_RMW(atomicAdd, unsigned, old + val)
MG_HOST_ATOMIC_RMW(atomicAdd, unsigned long long, old + val)
MG_HOST_ATOMIC_RMW(atomicAdd, float, old + val)
MG_HOST_ATOMIC_RMW(atomicAdd, double, old + val)
MG_HOST_ATOMIC_RMW(atomicSub, int, old - val)
MG_HOST_ATOMIC_RMW(atomicSub, unsigned, old - val)
MG_HOST_ATOMIC_RMW(atomicMax, int, old > val ? old : val)
MG_HOST_ATOMIC_RMW(atomicMax, unsigned, old > val ? old : val)
MG_HOST_ATOMIC_RMW(atomicMax, unsigned long long, old > val ? old : val)
MG_HOST_ATOMIC_RMW(atomicMin, int, old < val ? old : val)
MG_HOST_ATOMIC_RMW(atomicMin, unsigned, old < val ? old : val)
MG_HOST_ATOMIC_RMW(atomicMin, unsigned long long, old < val ? old : val)
MG_HOST_ATOMIC_RMW(atomicExch, int, val)
MG_HOST_ATOMIC_RMW(atomicExch, unsigned, val)
MG_HOST_ATOMIC_RMW(atomicExch, unsigned long long, val)
MG_HOST_ATOMIC_RMW(atomicExch, float, val)
MG_HOST_ATOMIC_RMW(atomicAnd, int, old & val)
MG_HOST_ATOMIC_RMW(atomicAnd, unsigned, old & val)
MG_HOST_ATOMIC_RMW(atomicOr, int, old | val)
MG_HOST_ATOMIC_RMW(atomicOr, unsigned, old | val)
MG_HOST_ATOMIC_RMW(atomicXor, int, old ^ val)
MG_HOST_ATOMIC_RMW(atomicXor, unsigned, old ^ val)
#undef MG_HOST_ATOMIC_RMW
#define MG_HOST_ATOMIC_CAS(T)                                                                    \
  static inline T atomicCAS(T *addr, T compare, T val) {                                    \
    T old = *addr;                                                                           \
    if (old == compare) *addr = val;                                                         \
    return old;                                                                              \
  }
MG_HOST_ATOMIC_CAS(int)
MG_HOST_ATOMIC_CAS(unsigned)
MG_HOST_ATOMIC_CAS(unsigned long long)
#undef MG_HOST_ATOMIC_CAS

#endif /* MG_CUDA_HOST_H */
