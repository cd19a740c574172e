/* Self-test of the host executor (cuda_host.h / cuda_host.cpp).
 *
 * One file, three builds (run_selftest.sh does all):
 *   default                  kernels + driver, linked with cuda_host.cpp (cuda_host.h
 *                            force-included);
 *   -DMG_SELFTEST_KERNELS    kernels only, built into a shared object exactly as
 *                            README.md says a generated kernel is;
 *   -DMG_SELFTEST_DLOPEN     driver only, plain C++ without CUDA headers: dlopens that
 *                            shared object (argv[1]) and finds mg_host_launch and the
 *                            kernels with dlsym, as a C test does.
 *   -fsanitize=address       (with the default build) also runs the ASan checks: a child
 *                            process (this program, --asan-child CASE) makes one
 *                            out-of-bounds access and must be stopped by ASan with the
 *                            kernel's file:line in the report.
 * The PTX kernels are in ptx_selftest.cu (also compiled by NVRTC in
 * tests/test_device_header.c); they need -I templates for mla_device.cuh.
 * Prints one line per test and `N passed, M failed` last; exits non-zero on failure. */

#if !defined(MG_SELFTEST_DLOPEN)
/* ======================================================================== kernels == */
#include <cuda_bf16.h> /* as a generated kernel does: a no-op after cuda_host.h */
#include <stdint.h>

#include "mla_device.cuh"

#define FULL 0xffffffffu

/* Block sum: each thread adds `per_thread` strided elements, then a shared-memory tree. */
extern "C" __global__ void __launch_bounds__(256)
    k_block_reduce(const float *__restrict__ in, float *__restrict__ out, int per_thread) {
  __shared__ float s[256];
  const int tid = threadIdx.x;
  const float *base = in + (size_t)blockIdx.x * blockDim.x * per_thread;
  float acc = 0.0f;
  for (int k = 0; k < per_thread; ++k) acc += base[tid + k * blockDim.x];
  s[tid] = acc;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (tid < stride) s[tid] += s[tid + stride];
    __syncthreads();
  }
  if (tid == 0) out[blockIdx.x] = s[0];
}

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(FULL, v, m);
  return v;
}

/* Every warp collective, each result written per thread. */
extern "C" __global__ void k_warp_ops(const float *in, float *sum, float *bcast, float *down,
                                      float *up, float *idx16, unsigned *ballot, int *anyall) {
  const int gid = blockIdx.x * blockDim.x + threadIdx.x;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const float v = in[gid];
  sum[gid] = warp_sum(v);
  bcast[gid] = __shfl_sync(FULL, v, (blockIdx.x * 7 + warp * 3) % 32);
  down[gid] = __shfl_down_sync(FULL, v, 3);
  up[gid] = __shfl_up_sync(FULL, v, 5);
  idx16[gid] = __shfl_sync(FULL, v, 3, 16);
  ballot[gid] = __ballot_sync(FULL, v > 0.5f);
  int any = __any_sync(FULL, v > 0.97f);
  int all = __all_sync(FULL, v >= 0.0f);
  int none = __all_sync(FULL, v > 0.5f);
  __syncwarp();
  unsigned am = __activemask();
  anyall[gid] = any | (all << 1) | (none << 2) | ((am == FULL) << 3) | (lane == __ffs((int)(1u << lane)) - 1) << 4;
}

/* 3D grid and block: every element written once, with its coordinates. */
extern "C" __global__ void k_grid3d(int *count, int *coord) {
  const unsigned gx = blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned gy = blockIdx.y * blockDim.y + threadIdx.y;
  const unsigned gz = blockIdx.z * blockDim.z + threadIdx.z;
  const unsigned W = gridDim.x * blockDim.x, H = gridDim.y * blockDim.y;
  const unsigned i = (gz * H + gy) * W + gx;
  atomicAdd(&count[i], 1);
  coord[i] = (int)(gx | gy << 10 | gz << 20);
}

/* Half the block returns before a barrier: divergence. */
extern "C" __global__ void k_diverge_barrier(float *out) {
  if (threadIdx.x >= 64) return;
  __syncthreads();
  out[threadIdx.x] = 1.0f;
}

/* Threads at two different __syncthreads() calls. */
extern "C" __global__ void k_split_barrier(float *out) {
  if (threadIdx.x < 32) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1.0f;
}

/* Partial mask: unsupported, reported. */
extern "C" __global__ void k_bad_mask(float *out) {
  out[threadIdx.x] = __shfl_sync(0xffffu, out[threadIdx.x], 0);
}

/* Half of a warp reaches a shuffle, the other half exits. */
extern "C" __global__ void k_partial_warp(float *out) {
  if (threadIdx.x % 32 >= 16) return;
  out[threadIdx.x] = __shfl_xor_sync(FULL, out[threadIdx.x], 1);
}

/* Lanes of one warp at different collectives. */
extern "C" __global__ void k_mixed_collectives(float *out) {
  if (threadIdx.x % 2)
    out[threadIdx.x] = (float)__ballot_sync(FULL, 1);
  else
    out[threadIdx.x] = __shfl_sync(FULL, 1.0f, 0);
}

extern "C" __global__ void k_trap(float *out) {
  if (blockIdx.x == 1 && threadIdx.x == 5) __trap();
  out[threadIdx.x] = 1.0f;
}

/* Dynamic shared memory: reverse through smem, two regions, alignment. */
extern "C" __global__ void k_dyn_smem(const float *in, float *out, int *aligned) {
  extern __shared__ __align__(16) unsigned char smem[];
  float *a = reinterpret_cast<float *>(smem);
  float *b = a + blockDim.x;
  const int t = threadIdx.x, gid = blockIdx.x * blockDim.x + t;
  a[t] = in[gid];
  b[t] = 2.0f * in[gid];
  __syncthreads();
  out[gid] = a[blockDim.x - 1 - t] + b[(t + 1) % blockDim.x];
  if (gid == 0) *aligned = ((uintptr_t)smem % 16) == 0;
}

/* bf16: round trip, pairs, and a shuffled __nv_bfloat162. */
extern "C" __global__ void k_bf16(const float *in, float *rt, float *pair, float *shfl) {
  const int gid = blockIdx.x * blockDim.x + threadIdx.x;
  const float x = in[gid];
  __nv_bfloat16 h = __float2bfloat16(x);
  rt[gid] = __bfloat162float(h);
  __nv_bfloat162 p = __floats2bfloat162_rn(x, -2.0f * x);
  pair[2 * gid] = __low2float(p);
  pair[2 * gid + 1] = __high2float(p);
  __nv_bfloat162 q = __shfl_xor_sync(FULL, p, 1);
  shfl[gid] = __low2float(q) + __high2float(q);
}

/* __syncthreads_count/_and/_or and fast math. */
extern "C" __global__ void k_sync_reduce(int *out, float *math) {
  const int t = threadIdx.x;
  int c = __syncthreads_count(t % 3 == 0);
  int a = __syncthreads_and(t >= 0);
  int o = __syncthreads_or(t == 77);
  int z = __syncthreads_or(0);
  out[t] = c | a << 16 | o << 17 | z << 18;
  if (t == 0) {
    math[0] = __expf(1.0f);
    math[1] = rsqrtf(4.0f);
    math[2] = __fdividef(1.0f, 8.0f);
    math[3] = __saturatef(1.5f) + __saturatef(-2.0f);
    math[4] = __int_as_float(__float_as_int(3.5f));
    math[5] = (float)(__popc(0xf0f0u) + __clz(1) + max(3, 7) + min(2u, 9u));
    math[6] = exp2f(3.0f) + __logf(1.0f) + fmaxf(1.0f, 2.0f);
  }
}

/* A block of 48 threads: warp 1 has 16 lanes. xor 1 stays inside them; xor 16 reads a
 * lane that does not exist when `far` is set. */
extern "C" __global__ void k_partial_block(const float *in, float *out, unsigned *bal, int far) {
  const int t = threadIdx.x;
  out[t] = __shfl_xor_sync(FULL, in[t], far ? 16 : 1);
  bal[t] = __ballot_sync(FULL, 1) ^ __activemask() << 1;
}

/* Throughput: many shuffles per warp plus barriers and smem, as an attention kernel. */
extern "C" __global__ void k_perf(const float *in, float *out, int iters) {
  __shared__ float s[1024];
  const int gid = blockIdx.x * blockDim.x + threadIdx.x;
  float v = in[gid];
  for (int it = 0; it < iters; ++it) {
    v = v * 0.5f + __shfl_xor_sync(FULL, v, it % 31 + 1) * 0.25f;
    if (it % 256 == 255) {
      s[threadIdx.x] = v;
      __syncthreads();
      v += 0.125f * s[(threadIdx.x + 32) % blockDim.x];
      __syncthreads();
    }
  }
  out[gid] = v;
}

/* A block sum missing the barrier between the stores and the reads: the last thread
 * sums s[]. Round robin runs threads in index order, so it passes by luck; a shuffled
 * schedule runs the last thread while others have not stored, and it reads NaN. */
extern "C" __global__ void k_reduce_nobarrier(const float *in, float *out) {
  __shared__ float s[256];
  const int t = threadIdx.x;
  s[t] = in[blockIdx.x * blockDim.x + t];
  /* __syncthreads() missing */
  if (t == (int)blockDim.x - 1) {
    float acc = 0.0f;
    for (int i = 0; i < (int)blockDim.x; ++i) acc += s[i];
    out[blockIdx.x] = acc;
  }
}

/* Reads shared memory nobody wrote in this block: block 0 writes s[] and the dynamic
 * buffer, every block reads them. */
extern "C" __global__ void k_unwritten_smem(float *out) {
  __shared__ float s[64];
  extern __shared__ __align__(16) unsigned char smem[];
  float *d = reinterpret_cast<float *>(smem);
  const int t = threadIdx.x;
  if (blockIdx.x == 0) {
    s[t] = 1.0f;
    d[t] = 2.0f;
  }
  __syncthreads();
  out[blockIdx.x * 128 + t] = s[t];
  out[blockIdx.x * 128 + 64 + t] = d[t];
}

/* The order in which threads pass a point: ticket[t] = arrival rank, between barriers. */
extern "C" __global__ void k_ticket(int *ticket, int *counter) {
  __syncthreads();
  ticket[blockIdx.x * blockDim.x + threadIdx.x] = atomicAdd(&counter[blockIdx.x], 1);
  __syncthreads();
}

/* ASan cases, run in a child process. The line numbers are what the report must name. */
extern "C" __global__ void k_oob_global(float *out) {
  out[threadIdx.x + 1] = 1.0f; /* off by one: the last thread stores past the end */
}
[[maybe_unused]] static const int k_oob_global_line = __LINE__ - 2;

extern "C" __global__ void k_oob_smem(float *out, int off) {
  __shared__ float s[64];
  s[threadIdx.x] = 1.0f;
  __syncthreads();
  out[threadIdx.x] = s[threadIdx.x + off]; /* off = 1: the last thread reads s[64] */
}
[[maybe_unused]] static const int k_oob_smem_line = __LINE__ - 2;

extern "C" __global__ void k_oob_dyn(float *out, int off) {
  extern __shared__ __align__(16) unsigned char smem[];
  float *d = reinterpret_cast<float *>(smem);
  d[threadIdx.x] = 1.0f;
  __syncthreads();
  out[threadIdx.x] = d[threadIdx.x + off]; /* launched with 64 floats of dynamic smem */
}
[[maybe_unused]] static const int k_oob_dyn_line = __LINE__ - 2;

extern "C" __global__ void k_oob_cp_async(const float *g, float *out) {
  __shared__ __align__(16) float s[64 * 4];
  mla::cp_async_16(&s[threadIdx.x * 4], &g[threadIdx.x * 4 + 4]); /* g has 64 * 4 floats */
  mla::cp_async_commit();
  mla::cp_async_wait<0>();
  __syncthreads();
  out[threadIdx.x] = s[threadIdx.x * 4];
}
[[maybe_unused]] static const int k_oob_cp_async_line = __LINE__ - 6;

/* ldmatrix row addresses must be 16-byte aligned and in shared memory. */
extern "C" __global__ void k_ldmatrix_misaligned(const unsigned short *g, unsigned *out, int bad) {
  __shared__ __align__(16) unsigned short s[32 * 8 + 8];
  for (int i = threadIdx.x; i < 32 * 8 + 8; i += 32) s[i] = 1;
  __syncwarp();
  unsigned r[4];
  const unsigned short *row =
      bad == 1 ? &s[threadIdx.x * 8 + 1] : bad == 2 ? g : &s[threadIdx.x * 8];
  mla::ldmatrix_x4(r, row);
  out[threadIdx.x] = r[0];
}

/* Cross-block: every block adds 1 to *counter. racy: a plain read, a barrier (a
 * scheduling point, where another resident block may run), then the write, so blocks
 * that interleave lose updates; blocks run one after another never do. Else atomicAdd.
 * Each block also keeps its own value in static shared memory across the barrier, which
 * must survive the other blocks' runs (per-block shared memory). */
extern "C" __global__ void k_cross_block(int *counter, int *bad, int racy) {
  __shared__ int mine[4];
  if (threadIdx.x == 0) mine[0] = (int)blockIdx.x;
  int v = 0;
  if (racy && threadIdx.x == 0) v = *counter;
  for (int i = 0; i < 4; ++i) __syncthreads();
  if (threadIdx.x == 0) {
    if (racy)
      *counter = v + 1;
    else
      atomicAdd(counter, 1);
    if (mine[0] != (int)blockIdx.x) atomicAdd(bad, 1);
  }
}

/* A pipeline's write after read: each thread copies its 16 bytes in and, after wait and
 * barrier, reads its neighbour warp's first float 16 times, with a warp shuffle (a
 * scheduling point) after each read. The next data then goes into the same buffer; when
 * that prefetch is issued before the reads (war = 1: the barrier between the last read
 * and the prefetch is missing), a copy can land while the other warp still reads. */
extern "C" __global__ void k_cp_war(const float *a, const float *b, float *out, int war) {
  __shared__ __align__(16) float s[64 * 4];
  const int t = threadIdx.x, o = ((t + 32) % 64) * 4;
  mla::cp_async_16(&s[t * 4], &a[t * 4]);
  mla::cp_async_commit();
  mla::cp_async_wait<0>();
  __syncthreads();
  if (war) {
    mla::cp_async_16(&s[t * 4], &b[t * 4]);
    mla::cp_async_commit();
  }
  float acc = 0.0f;
  for (int k = 0; k < 16; ++k) acc = __shfl_xor_sync(FULL, acc + s[o], 0);
  if (!war) {
    __syncthreads();
    mla::cp_async_16(&s[t * 4], &b[t * 4]);
    mla::cp_async_commit();
  }
  mla::cp_async_wait<0>();
  __syncthreads();
  out[t] = acc + s[t * 4];
}

/* Lanes of one warp at two different shuffles (different source lines). */
extern "C" __global__ void k_shfl_sites(float *out) {
  float v = (float)threadIdx.x;
  if (threadIdx.x % 32 < 16)
    v = __shfl_xor_sync(FULL, v, 1);
  else
    v = __shfl_xor_sync(FULL, v, 1);
  out[threadIdx.x] = v;
}

/* __activemask after lanes >= keep of each warp have returned. */
extern "C" __global__ void k_activemask_exit(unsigned *out, int keep) {
  if ((int)(threadIdx.x % 32) >= keep) return;
  out[threadIdx.x] = __activemask();
}

#include "selftest_sites.inc"
#include "ptx_selftest.cu"

#endif /* kernels */

#if !defined(MG_SELFTEST_KERNELS)
/* ========================================================================= driver == */
#include "host_launch.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>
#if defined(__SANITIZE_ADDRESS__)
#define MG_SELFTEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MG_SELFTEST_ASAN 1
#endif
#endif
#ifndef MG_SELFTEST_ASAN
#define MG_SELFTEST_ASAN 0
#endif
#if defined(MG_SELFTEST_DLOPEN)
#include <dlfcn.h>
#endif

namespace {

/* The kernels, as the driver sees them: through pointers (static or dlsym). */
#define MG_SELFTEST_KERNEL_LIST(X)                                                               \
  X(k_block_reduce, void (*)(const float *, float *, int))                                      \
  X(k_warp_ops, void (*)(const float *, float *, float *, float *, float *, float *, unsigned *,  \
                         int *))                                                                 \
  X(k_grid3d, void (*)(int *, int *))                                                            \
  X(k_diverge_barrier, void (*)(float *))                                                        \
  X(k_split_barrier, void (*)(float *))                                                          \
  X(k_bad_mask, void (*)(float *))                                                               \
  X(k_partial_warp, void (*)(float *))                                                           \
  X(k_mixed_collectives, void (*)(float *))                                                      \
  X(k_trap, void (*)(float *))                                                                   \
  X(k_dyn_smem, void (*)(const float *, float *, int *))                                         \
  X(k_bf16, void (*)(const float *, float *, float *, float *))                                  \
  X(k_sync_reduce, void (*)(int *, float *))                                                     \
  X(k_partial_block, void (*)(const float *, float *, unsigned *, int))                          \
  X(k_perf, void (*)(const float *, float *, int))                                              \
  X(k_reduce_nobarrier, void (*)(const float *, float *))                                      \
  X(k_unwritten_smem, void (*)(float *))                                                       \
  X(k_ticket, void (*)(int *, int *))                                                          \
  X(k_oob_global, void (*)(float *))                                                           \
  X(k_oob_smem, void (*)(float *, int))                                                        \
  X(k_oob_dyn, void (*)(float *, int))                                                         \
  X(k_oob_cp_async, void (*)(const float *, float *))                                          \
  X(k_ldmatrix_misaligned, void (*)(const unsigned short *, unsigned *, int))                  \
  X(k_mma_direct, void (*)(const unsigned short *, const unsigned short *, const float *,      \
                           float *, int))                                                      \
  X(k_mma_ldmatrix, void (*)(const unsigned short *, const unsigned short *, const float *,    \
                             float *, int))                                                    \
  X(k_ldmatrix_raw, void (*)(const unsigned short *, const int *, unsigned *, int))            \
  X(k_cp_async, void (*)(const float *, float *))                                           \
  X(k_cross_block, void (*)(int *, int *, int))                                                \
  X(k_cp_war, void (*)(const float *, const float *, float *, int))                            \
  X(k_shfl_sites, void (*)(float *))                                                           \
  X(k_activemask_exit, void (*)(unsigned *, int))                                              \
  X(k_shfl_same_line, void (*)(float *))                                                       \
  X(k_activemask_same_line, void (*)(unsigned *))

template <class T> using type_of = T;
struct Kernels {
#define X(name, type) type_of<type> name;
  MG_SELFTEST_KERNEL_LIST(X)
#undef X
} K;
mg_host_launch_fn launch_fn;
mg_host_launch_ex_fn launch_ex_fn;
int (*smem_emulated_fn)(void);

int n_pass, n_fail;
char g_msg[1024];

#define CHECK(cond, ...)                                                                         \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      printf("    check failed (line %d): %s: ", __LINE__, #cond);                               \
      printf(__VA_ARGS__);                                                                       \
      printf("\n");                                                                              \
      return false;                                                                              \
    }                                                                                            \
  } while (0)

mg_host_dim3 d3(unsigned x, unsigned y = 1, unsigned z = 1) { return mg_host_dim3{x, y, z}; }

/* Launch with a lambda-free thunk: fn(ctx) calls the kernel with the arguments in ctx. */
template <class F> int launch(mg_host_dim3 g, mg_host_dim3 b, size_t smem, F &body) {
  g_msg[0] = '\0';
  return launch_fn(g, b, smem, [](void *p) { (*static_cast<F *>(p))(); }, &body, g_msg,
                   sizeof g_msg);
}

/* The same with launch options. */
template <class F>
int launch_o(const mg_host_launch_opts &o, mg_host_dim3 g, mg_host_dim3 b, size_t smem, F &body) {
  g_msg[0] = '\0';
  return launch_ex_fn(g, b, smem, &o, [](void *p) { (*static_cast<F *>(p))(); }, &body, g_msg,
                      sizeof g_msg);
}

mg_host_launch_opts seed_opts(unsigned long long seed) {
  mg_host_launch_opts o;
  memset(&o, 0, sizeof o);
  if (seed)
    o.seed = seed;
  else
    o.round_robin = 1;
  return o;
}

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9e3779b97f4a7c15ull + 1) {}
  float uniform() { /* [0, 1) */
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(s >> 40) / (float)(1ull << 24);
  }
};

std::vector<float> random_floats(size_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<float> v(n);
  for (auto &x : v) x = r.uniform();
  return v;
}

bool approx(double got, double want, double rel) {
  return std::fabs(got - want) <= rel * (std::fabs(want) + 1e-6);
}

float bf16_round(float x) { /* round to nearest even, as __float2bfloat16 (finite x) */
  uint32_t u;
  memcpy(&u, &x, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  float r;
  memcpy(&r, &u, 4);
  return r;
}

/* ---- tests ----------------------------------------------------------------------- */
bool t_block_reduce() {
  const int blocks = 8, threads = 256, per = 4;
  std::vector<float> in = random_floats((size_t)blocks * threads * per, 1), out(blocks, -1.0f);
  auto body = [&] { K.k_block_reduce(in.data(), out.data(), per); };
  int rc = launch(d3(blocks), d3(threads), 0, body);
  CHECK(rc == 0, "rc %d: %s", rc, g_msg);
  for (int b = 0; b < blocks; ++b) {
    double want = 0;
    for (int i = 0; i < threads * per; ++i) want += in[(size_t)b * threads * per + i];
    CHECK(approx(out[b], want, 1e-5), "block %d: %f vs %f", b, out[b], want);
  }
  return true;
}

bool t_warp_ops() {
  const int blocks = 3, threads = 128, n = blocks * threads;
  std::vector<float> in = random_floats(n, 2), sum(n), bc(n), dn(n), up(n), i16(n);
  std::vector<unsigned> bal(n);
  std::vector<int> aa(n);
  auto body = [&] {
    K.k_warp_ops(in.data(), sum.data(), bc.data(), dn.data(), up.data(), i16.data(), bal.data(),
                 aa.data());
  };
  int rc = launch(d3(blocks), d3(threads), 0, body);
  CHECK(rc == 0, "rc %d: %s", rc, g_msg);
  for (int g = 0; g < n; ++g) {
    int blk = g / threads, t = g % threads, lane = t % 32, w0 = g - lane;
    double s = 0;
    unsigned ballot = 0;
    bool any = false, all = true, none = true;
    for (int l = 0; l < 32; ++l) {
      s += in[w0 + l];
      ballot |= (in[w0 + l] > 0.5f ? 1u : 0u) << l;
      any |= in[w0 + l] > 0.97f;
      all &= in[w0 + l] >= 0.0f;
      none &= in[w0 + l] > 0.5f;
    }
    CHECK(approx(sum[g], s, 1e-5), "sum[%d] %f vs %f", g, sum[g], s);
    int src = (blk * 7 + (t / 32) * 3) % 32;
    CHECK(bc[g] == in[w0 + src], "bcast[%d] %f vs lane %d %f", g, bc[g], src, in[w0 + src]);
    CHECK(dn[g] == in[lane + 3 < 32 ? g + 3 : g], "down[%d]", g);
    CHECK(up[g] == in[lane >= 5 ? g - 5 : g], "up[%d]", g);
    CHECK(i16[g] == in[w0 + (lane & 16) + 3], "idx16[%d]", g);
    CHECK(bal[g] == ballot, "ballot[%d] %08x vs %08x", g, bal[g], ballot);
    int want = (int)any | (int)all << 1 | (int)none << 2 | 1 << 3 | 1 << 4;
    CHECK(aa[g] == want, "any/all[%d] %x vs %x", g, aa[g], want);
  }
  return true;
}

bool t_grid3d() {
  const mg_host_dim3 g = d3(5, 3, 2), b = d3(8, 4, 2);
  const unsigned W = g.x * b.x, H = g.y * b.y, D = g.z * b.z;
  std::vector<int> count(W * H * D, 0), coord(W * H * D, -1);
  auto body = [&] { K.k_grid3d(count.data(), coord.data()); };
  int rc = launch(g, b, 0, body);
  CHECK(rc == 0, "rc %d: %s", rc, g_msg);
  for (unsigned z = 0; z < D; ++z)
    for (unsigned y = 0; y < H; ++y)
      for (unsigned x = 0; x < W; ++x) {
        unsigned i = (z * H + y) * W + x;
        CHECK(count[i] == 1, "(%u,%u,%u) written %d times", x, y, z, count[i]);
        CHECK(coord[i] == (int)(x | y << 10 | z << 20), "(%u,%u,%u) coord %x", x, y, z, coord[i]);
      }
  return true;
}

/* An expected failure: rc and a message that mentions `word`. */
bool expect_error(int rc, int want_rc, const char *word) {
  printf("    reported: %s\n", g_msg);
  CHECK(rc == want_rc, "rc %d, want %d: %s", rc, want_rc, g_msg);
  CHECK(strstr(g_msg, word) != nullptr, "message lacks '%s': %s", word, g_msg);
  return true;
}

bool t_diverge_barrier() {
  std::vector<float> out(128, 0.0f);
  auto body = [&] { K.k_diverge_barrier(out.data()); };
  return expect_error(launch(d3(2), d3(128), 0, body), MG_HOST_E_DIVERGENCE, "barrier divergence");
}

bool t_split_barrier() {
  std::vector<float> out(128, 0.0f);
  auto body = [&] { K.k_split_barrier(out.data()); };
  return expect_error(launch(d3(1), d3(128), 0, body), MG_HOST_E_DIVERGENCE, "barrier divergence");
}

bool t_bad_mask() {
  std::vector<float> out(64, 1.0f);
  auto body = [&] { K.k_bad_mask(out.data()); };
  return expect_error(launch(d3(1), d3(64), 0, body), MG_HOST_E_MASK, "mask=0x0000ffff");
}

bool t_partial_warp() {
  std::vector<float> out(64, 1.0f);
  auto body = [&] { K.k_partial_warp(out.data()); };
  return expect_error(launch(d3(1), d3(64), 0, body), MG_HOST_E_DIVERGENCE, "warp divergence");
}

bool t_mixed_collectives() {
  std::vector<float> out(32, 1.0f);
  auto body = [&] { K.k_mixed_collectives(out.data()); };
  return expect_error(launch(d3(1), d3(32), 0, body), MG_HOST_E_DIVERGENCE, "warp divergence");
}

bool t_trap() {
  std::vector<float> out(64, 0.0f);
  auto body = [&] { K.k_trap(out.data()); };
  return expect_error(launch(d3(3), d3(64), 0, body), MG_HOST_E_TRAP, "block (1,0,0) thread (5,0,0)");
}

bool t_config_errors() {
  std::vector<float> out(2048, 0.0f);
  auto body = [&] { K.k_trap(out.data()); };
  if (!expect_error(launch(d3(1), d3(33, 33), 0, body), MG_HOST_E_CONFIG, "1024")) return false;
  if (!expect_error(launch(d3(1), d3(32), MG_HOST_MAX_DYN_SMEM + 1, body), MG_HOST_E_CONFIG,
                    "dynamic shared memory"))
    return false;
  return expect_error(launch(d3(0), d3(32), 0, body), MG_HOST_E_CONFIG, "empty");
}

bool t_dyn_smem() {
  const int blocks = 4, threads = 96, n = blocks * threads;
  std::vector<float> in = random_floats(n, 3), out(n, 0.0f);
  int aligned = -1;
  auto body = [&] { K.k_dyn_smem(in.data(), out.data(), &aligned); };
  int rc = launch(d3(blocks), d3(threads), 2 * threads * sizeof(float), body);
  CHECK(rc == 0, "rc %d: %s", rc, g_msg);
  CHECK(aligned == 1, "smem not 16-byte aligned");
  for (int g = 0; g < n; ++g) {
    int b = g / threads, t = g % threads;
    float want = in[b * threads + threads - 1 - t] + 2.0f * in[b * threads + (t + 1) % threads];
    CHECK(out[g] == want, "out[%d] %f vs %f", g, out[g], want);
  }
  return true;
}

bool t_bf16() {
  const int n = 64;
  std::vector<float> in = random_floats(n, 4), rt(n), pair(2 * n), sh(n);
  for (int i = 0; i < n; ++i) in[i] = (in[i] - 0.5f) * 1000.0f; /* signs, larger exponents */
  auto body = [&] { K.k_bf16(in.data(), rt.data(), pair.data(), sh.data()); };
  int rc = launch(d3(2), d3(32), 0, body);
  CHECK(rc == 0, "rc %d: %s", rc, g_msg);
  for (int i = 0; i < n; ++i) {
    float want = bf16_round(in[i]);
    CHECK(rt[i] == want, "rt[%d] %.9g vs %.9g (from %.9g)", i, rt[i], want, in[i]);
    CHECK(rt[i] != in[i] || bf16_round(in[i]) == in[i], "rt[%d] not rounded", i);
    CHECK(pair[2 * i] == want && pair[2 * i + 1] == bf16_round(-2.0f * in[i]), "pair[%d]", i);
    int j = i ^ 1;
    float ws = bf16_round(in[j]) + bf16_round(-2.0f * in[j]);
    CHECK(sh[i] == ws, "shfl[%d] %g vs %g", i, sh[i], ws);
  }
  return true;
}

bool t_sync_reduce() {
  std::vector<int> out(160, -1);
  std::vector<float> m(8, 0.0f);
  auto body = [&] { K.k_sync_reduce(out.data(), m.data()); };
  int rc = launch(d3(1), d3(160), 0, body);
  CHECK(rc == 0, "rc %d: %s", rc, g_msg);
  int count = 0;
  for (int t = 0; t < 160; ++t) count += t % 3 == 0;
  for (int t = 0; t < 160; ++t)
    CHECK(out[t] == (count | 1 << 16 | 1 << 17), "out[%d] %x vs %x", t, out[t],
          count | 1 << 16 | 1 << 17);
  CHECK(approx(m[0], std::exp(1.0), 1e-6), "expf %f", m[0]);
  CHECK(m[1] == 0.5f && m[2] == 0.125f && m[3] == 1.0f && m[4] == 3.5f, "math %f %f %f %f", m[1],
        m[2], m[3], m[4]);
  CHECK(m[5] == (float)(8 + 31 + 7 + 2), "int intrinsics %f", m[5]);
  CHECK(m[6] == 10.0f, "exp2f/logf/fmaxf %f", m[6]);
  return true;
}

bool t_partial_block() {
  std::vector<float> in = random_floats(48, 6), out(48);
  std::vector<unsigned> bal(48);
  int far = 0;
  auto body = [&] { K.k_partial_block(in.data(), out.data(), bal.data(), far); };
  int rc = launch(d3(2), d3(48), 0, body);
  CHECK(rc == 0, "rc %d: %s", rc, g_msg);
  for (int t = 0; t < 48; ++t) {
    unsigned m = t < 32 ? 0xffffffffu : 0xffffu;
    CHECK(out[t] == in[t ^ 1], "out[%d]", t);
    CHECK(bal[t] == (m ^ m << 1), "ballot/activemask[%d] %08x", t, bal[t]);
  }
  far = 1;
  return expect_error(launch(d3(2), d3(48), 0, body), MG_HOST_E_MASK, "does not exist");
}

/* ---- schedule, NaN fill ------------------------------------------------------------ */
bool t_missing_barrier() {
  const int blocks = 4, threads = 256, n = blocks * threads;
  std::vector<float> in = random_floats(n, 7), out(blocks);
  auto body = [&] { K.k_reduce_nobarrier(in.data(), out.data()); };
  std::vector<double> want(blocks, 0.0);
  for (int i = 0; i < n; ++i) want[i / threads] += in[i];
  /* Round robin: the last thread runs last, so the missing barrier goes unnoticed. */
  int rc = launch_o(seed_opts(0), d3(blocks), d3(threads), 0, body);
  CHECK(rc == 0, "rc %d: %s", rc, g_msg);
  for (int b = 0; b < blocks; ++b)
    CHECK(approx(out[b], want[b], 1e-5), "round robin: block %d %g vs %g", b, out[b], want[b]);
  printf("    round robin: right by luck\n");
  /* Shuffled: the last thread runs before others have stored; it reads NaN. */
  for (unsigned long long seed : {1ull, 2ull, 3ull}) {
    rc = launch_o(seed_opts(seed), d3(blocks), d3(threads), 0, body);
    CHECK(rc == 0, "rc %d: %s", rc, g_msg);
    int caught = 0;
    for (int b = 0; b < blocks; ++b) caught += std::isnan(out[b]);
    CHECK(caught == blocks, "seed %llu: only %d of %d blocks are NaN", seed, caught, blocks);
  }
  printf("    seeds 1, 2, 3: every block NaN\n");
  /* Without the NaN fill the shuffle alone still gives wrong sums. */
  mg_host_launch_opts o = seed_opts(1);
  o.no_nan_fill = 1;
  rc = launch_o(o, d3(blocks), d3(threads), 0, body);
  CHECK(rc == 0, "rc %d: %s", rc, g_msg);
  int wrong = 0;
  for (int b = 0; b < blocks; ++b) wrong += !approx(out[b], want[b], 1e-5);
  CHECK(wrong == blocks, "no NaN fill: only %d of %d blocks wrong", wrong, blocks);
  return true;
}

bool t_nan_fill() {
  std::vector<float> out(2 * 128);
  auto body = [&] { K.k_unwritten_smem(out.data()); };
  int rc = launch(d3(2), d3(64), 64 * sizeof(float), body);
  CHECK(rc == 0, "rc %d: %s", rc, g_msg);
  for (int t = 0; t < 64; ++t) {
    CHECK(out[t] == 1.0f && out[64 + t] == 2.0f, "block 0 [%d]: %g %g", t, out[t], out[64 + t]);
    CHECK(std::isnan(out[128 + t]), "block 1 static smem [%d] = %g, not NaN", t, out[128 + t]);
    CHECK(std::isnan(out[192 + t]), "block 1 dynamic smem [%d] = %g, not NaN", t, out[192 + t]);
  }
  mg_host_launch_opts o = seed_opts(1);
  o.no_nan_fill = 1;
  rc = launch_o(o, d3(2), d3(64), 64 * sizeof(float), body);
  CHECK(rc == 0, "rc %d: %s", rc, g_msg);
  for (int t = 0; t < 64; ++t) /* the previous block's values survive */
    CHECK(out[128 + t] == 1.0f && out[192 + t] == 2.0f, "no fill: block 1 [%d] %g %g", t,
          out[128 + t], out[192 + t]);
  printf("    shared memory model: %s TLS\n", smem_emulated_fn() == 1 ? "emulated" : "native");
  return true;
}

bool t_seeds_identical() {
  const int blocks = 8, threads = 256, per = 4;
  std::vector<float> in = random_floats((size_t)blocks * threads * per, 8);
  std::vector<float> ref;
  for (unsigned long long seed : {0ull, 1ull, 2ull, 0x5eedull}) {
    std::vector<float> out(blocks, -1.0f);
    auto body = [&] { K.k_block_reduce(in.data(), out.data(), per); };
    int rc = launch_o(seed_opts(seed), d3(blocks), d3(threads), 0, body);
    CHECK(rc == 0, "rc %d: %s", rc, g_msg);
    if (ref.empty())
      ref = out;
    else
      CHECK(memcmp(ref.data(), out.data(), blocks * sizeof(float)) == 0,
            "seed %llu: not bit-identical to round robin", seed);
  }
  return true;
}

bool t_shuffled() {
  const int blocks = 2, threads = 128, n = blocks * threads;
  auto run_tickets = [&](unsigned long long seed, std::vector<int> &t) {
    t.assign(n, -1);
    std::vector<int> counter(blocks, 0);
    auto body = [&] { K.k_ticket(t.data(), counter.data()); };
    return launch_o(seed_opts(seed), d3(blocks), d3(threads), 0, body);
  };
  std::vector<int> rr, rr2, s1, s1b, s2;
  CHECK(run_tickets(0, rr) == 0 && run_tickets(0, rr2) == 0, "%s", g_msg);
  CHECK(run_tickets(1, s1) == 0 && run_tickets(1, s1b) == 0 && run_tickets(2, s2) == 0, "%s",
        g_msg);
  CHECK(rr == rr2 && s1 == s1b, "a schedule is not reproducible");
  CHECK(s1 != rr && s2 != rr && s1 != s2, "seeds do not change the order");
  for (int b = 0; b < blocks; ++b) {
    std::vector<int> seen(threads, 0);
    for (int t = 0; t < threads; ++t) seen[s1[b * threads + t]]++;
    for (int t = 0; t < threads; ++t) CHECK(seen[t] == 1, "ticket %d taken %d times", t, seen[t]);
  }
  int moved = 0;
  for (int i = 1; i < threads; ++i) moved += s1[i] != s1[i - 1] + 1;
  printf("    seed 1, block 0: %d of %d threads not right after their predecessor\n", moved,
         threads - 1);
  CHECK(moved > threads / 2, "too little shuffling: %d", moved);
  return true;
}

/* ---- PTX ---------------------------------------------------------------------------- */
/* Random 16-bit floats built from bits: +-(1 + m/2^p) 2^e, e in [-3, 3]; exact values. */
uint16_t rand_bf16_bits(Rng &r) {
  unsigned sign = r.uniform() < 0.5f, e = 127 - 3 + (unsigned)(r.uniform() * 7);
  unsigned m = (unsigned)(r.uniform() * 128);
  return (uint16_t)(sign << 15 | e << 7 | m);
}
uint16_t rand_f16_bits(Rng &r) {
  unsigned sign = r.uniform() < 0.5f, e = 15 - 3 + (unsigned)(r.uniform() * 7);
  unsigned m = (unsigned)(r.uniform() * 1024);
  return (uint16_t)(sign << 15 | e << 10 | m);
}
double bf16_value(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
double f16_value(uint16_t h) { /* normal numbers only, as rand_f16_bits makes */
  int e = (h >> 10) & 0x1f;
  double v = std::ldexp(1.0 + (h & 0x3ff) / 1024.0, e - 15);
  return h & 0x8000 ? -v : v;
}

/* D = A B + C for `blocks` independent problems, checked against a double reference. */
bool check_mma(const std::vector<uint16_t> &A, const std::vector<uint16_t> &B,
               const std::vector<float> &C, const std::vector<float> &D, int blocks, bool f16,
               const char *what) {
  double (*val)(uint16_t) = f16 ? f16_value : bf16_value;
  for (int blk = 0; blk < blocks; ++blk)
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 8; ++n) {
        double ref = C[blk * 128 + m * 8 + n], mag = std::fabs(ref);
        for (int k = 0; k < 16; ++k) {
          double p = val(A[blk * 256 + m * 16 + k]) * val(B[blk * 128 + k * 8 + n]);
          ref += p;
          mag += std::fabs(p);
        }
        double got = D[blk * 128 + m * 8 + n];
        CHECK(std::fabs(got - ref) <= 2e-6 * mag + 1e-30, "%s block %d D[%d][%d] = %.9g, want %.9g",
              what, blk, m, n, got, ref);
      }
  return true;
}

bool t_mma() {
  const int blocks = 16;
  for (int kind = 0; kind < 2; ++kind) {
    Rng r(100 + kind);
    std::vector<uint16_t> A(blocks * 256), B(blocks * 128);
    std::vector<float> C(blocks * 128), D(blocks * 128, -1.0f);
    for (auto &x : A) x = kind ? rand_f16_bits(r) : rand_bf16_bits(r);
    for (auto &x : B) x = kind ? rand_f16_bits(r) : rand_bf16_bits(r);
    for (auto &x : C) x = r.uniform() - 0.5f;
    auto body = [&] { K.k_mma_direct(A.data(), B.data(), C.data(), D.data(), kind); };
    int rc = launch(d3(blocks), d3(32), 0, body);
    CHECK(rc == 0, "rc %d: %s", rc, g_msg);
    if (!check_mma(A, B, C, D, blocks, kind == 1, kind ? "f16" : "bf16")) return false;
  }
  return true;
}

bool t_mma_ldmatrix() {
  const int blocks = 16;
  Rng r(200);
  std::vector<uint16_t> A(blocks * 256), B(blocks * 128);
  std::vector<float> C(blocks * 128);
  for (auto &x : A) x = rand_bf16_bits(r);
  for (auto &x : B) x = rand_bf16_bits(r);
  for (auto &x : C) x = r.uniform() - 0.5f;
  for (int variant = 0; variant < 2; ++variant) {
    std::vector<float> D(blocks * 128, -1.0f);
    auto body = [&] { K.k_mma_ldmatrix(A.data(), B.data(), C.data(), D.data(), variant); };
    int rc = launch(d3(blocks), d3(32), 0, body);
    CHECK(rc == 0, "rc %d: %s", rc, g_msg);
    if (!check_mma(A, B, C, D, blocks, false, variant ? "x4.trans/x2" : "x4/x2.trans"))
      return false;
  }
  return true;
}

bool t_ldmatrix_raw() {
  Rng r(300);
  std::vector<uint16_t> M(32 * 8);
  for (auto &x : M) x = (uint16_t)(r.uniform() * 65536);
  std::vector<int> perm(32);
  for (int i = 0; i < 32; ++i) perm[i] = i;
  for (int i = 31; i > 0; --i) std::swap(perm[i], perm[(int)(r.uniform() * (i + 1))]);
  for (int mode = 0; mode < 6; ++mode) {
    const int num = 1 << (mode % 3);
    const bool trans = mode >= 3;
    std::vector<unsigned> out(32 * 4, 0xdeadbeefu);
    auto body = [&] { K.k_ldmatrix_raw(M.data(), perm.data(), out.data(), mode); };
    int rc = launch(d3(1), d3(32), 0, body);
    CHECK(rc == 0, "rc %d: %s", rc, g_msg);
    /* PTX ISA, ldmatrix: lanes 8m..8m+7 give matrix m's rows; lane i gets row i/4,
     * elements 2(i%4), 2(i%4)+1 (of the transpose with .trans). */
    auto elem = [&](int m, int row, int col) -> unsigned { return M[perm[8 * m + row] * 8 + col]; };
    for (int i = 0; i < 32; ++i)
      for (int m = 0; m < 4; ++m) {
        unsigned want = 0;
        if (m < num)
          want = trans ? elem(m, 2 * (i % 4), i / 4) | elem(m, 2 * (i % 4) + 1, i / 4) << 16
                       : elem(m, i / 4, 2 * (i % 4)) | elem(m, i / 4, 2 * (i % 4) + 1) << 16;
        CHECK(out[i * 4 + m] == want, "x%d%s lane %d matrix %d: %08x, want %08x", num,
              trans ? ".trans" : "", i, m, out[i * 4 + m], want);
      }
  }
  return true;
}

bool t_cp_async() {
  std::vector<float> g = random_floats(3 * 256, 9), out(64 * 8, 99.0f);
  auto body = [&] { K.k_cp_async(g.data(), out.data()); };
  int rc = launch(d3(2), d3(64), 0, body);
  CHECK(rc == 0, "rc %d: %s", rc, g_msg);
  for (int t = 0; t < 64; ++t) {
    const float *o = &out[t * 8];
    CHECK(o[0] == -7.0f, "thread %d: s0 before the wait is %g, not the poison", t, o[0]);
    CHECK(o[1] == g[t * 4], "thread %d: s0 after wait_group 1 is %g, not %g", t, o[1], g[t * 4]);
    CHECK(o[2] == -7.0f, "thread %d: s1 (group 1) visible after wait_group 1: %g", t, o[2]);
    CHECK(o[3] == g[256 + t * 4 + 3], "thread %d: s1 after wait_group 0 is %g", t, o[3]);
    CHECK(o[4] == 0.0f, "thread %d: zero-filled s2 is %g", t, o[4]);
    CHECK(o[5] == g[((t + 1) % 64) * 4], "thread %d: neighbour's s0 is %g", t, o[5]);
    CHECK(o[6] == -7.0f, "thread %d: uncommitted s2 visible: %g", t, o[6]);
  }
  return true;
}

/* Resident blocks: a non-atomic cross-block counter is right block after block (round
 * robin, or one resident block) and loses updates for some seeds with several resident
 * blocks; with atomicAdd it is right for every seed; each block's static shared memory
 * survives the others' runs. */
bool t_resident_blocks() {
  const int blocks = 24;
  for (int racy = 0; racy <= 1; ++racy) {
    int lost = 0;
    for (unsigned long long seed = 0; seed <= 6; ++seed) {
      int counter = 0, bad = 0;
      auto body = [&] { K.k_cross_block(&counter, &bad, racy); };
      mg_host_launch_opts o = seed_opts(seed);
      o.block_switch = 2;
      int rc = launch_o(o, d3(blocks), d3(64), 0, body);
      CHECK(rc == 0, "rc %d: %s", rc, g_msg);
      CHECK(bad == 0, "seed %llu: %d blocks saw another block's shared memory", seed, bad);
      if (!racy || seed == 0) CHECK(counter == blocks, "racy %d seed %llu: %d", racy, seed, counter);
      lost += counter != blocks;
      o.resident_blocks = 1;
      counter = 0;
      rc = launch_o(o, d3(blocks), d3(64), 0, body);
      CHECK(rc == 0 && counter == blocks, "one resident block, seed %llu: %d", seed, counter);
    }
    if (racy) {
      printf("    racy cross-block counter: wrong for %d of 6 seeds\n", lost);
      CHECK(lost >= 3, "lost updates for only %d of 6 seeds", lost);
    }
  }
  return true;
}

/* cp.async: a prefetch into a buffer another warp still reads is caught (copies land at
 * random points before the wait) for every seed; with the barrier it is right. */
bool t_cp_async_war() {
  std::vector<float> a = random_floats(256, 11), b = random_floats(256, 12), out(64);
  for (int war = 0; war <= 1; ++war)
    for (unsigned long long seed = 1; seed <= 4; ++seed) {
      auto body = [&] { K.k_cp_war(a.data(), b.data(), out.data(), war); };
      int rc = launch_o(seed_opts(seed), d3(1), d3(64), 0, body);
      CHECK(rc == 0, "rc %d: %s", rc, g_msg);
      bool right = true;
      for (int t = 0; t < 64; ++t) {
        const int o = ((t + 32) % 64) * 4;
        float want = 0.0f;
        for (int k = 0; k < 16; ++k) want += a[o];
        want += b[t * 4];
        right = right && std::fabs(out[t] - want) <= 1e-5f * (1 + std::fabs(want));
      }
      CHECK(right == !war, "war %d seed %llu: %s", war, seed,
            right ? "right although the copy races the reads" : "wrong with the barrier");
    }
  return true;
}

bool t_collective_sites() {
  std::vector<float> out(32, 0.0f);
  auto body = [&] { K.k_shfl_sites(out.data()); };
  return expect_error(launch(d3(1), d3(32), 0, body), MG_HOST_E_DIVERGENCE, "while");
}

/* Collectives at the same line number in two files (selftest_sites.inc, #line) are two call
 * sites: a shuffle split between them is warp divergence naming both, and an __activemask
 * split between them gives each group its own lanes (every seed). */
bool t_same_line_sites() {
  std::vector<float> out(32, 0.0f);
  auto body = [&] { K.k_shfl_same_line(out.data()); };
  if (!expect_error(launch(d3(1), d3(32), 0, body), MG_HOST_E_DIVERGENCE, "warp divergence"))
    return false;
  CHECK(strstr(g_msg, "site_a.cu:9000") && strstr(g_msg, "site_b.cu:9000"),
        "message lacks both sites: %s", g_msg);
  std::vector<unsigned> am(32, 0);
  for (unsigned long long seed = 0; seed <= 3; ++seed) {
    auto amb = [&] { K.k_activemask_same_line(am.data()); };
    int rc = launch_o(seed_opts(seed), d3(1), d3(32), 0, amb);
    CHECK(rc == 0, "rc %d: %s", rc, g_msg);
    for (int t = 0; t < 32; ++t)
      CHECK(am[t] == (t % 2 ? 0xaaaaaaaau : 0x55555555u), "seed %llu lane %d: %08x", seed, t, am[t]);
  }
  return true;
}

/* __activemask: exited lanes are not in it (every seed), a short warp has its lanes. */
bool t_activemask() {
  std::vector<unsigned> out(80, 0);
  for (unsigned long long seed = 0; seed <= 3; ++seed) {
    auto body = [&] { K.k_activemask_exit(out.data(), 20); };
    int rc = launch_o(seed_opts(seed), d3(2), d3(80), 0, body);
    CHECK(rc == 0, "rc %d: %s", rc, g_msg);
    for (int t = 0; t < 80; ++t)
      if (t % 32 < 20)
        CHECK(out[t] == (t < 64 ? 0x000fffffu : 0x0000ffffu), "seed %llu lane %d: %08x", seed, t,
              out[t]);
  }
  return true;
}

/* Per-arch shared-memory limits (opt-in maximum per block). */
bool t_arch_smem() {
  std::vector<float> out(64, 0.0f);
  auto body = [&] { K.k_activemask_exit(reinterpret_cast<unsigned *>(out.data()), 32); };
  mg_host_launch_opts o = seed_opts(1);
  const struct {
    unsigned arch;
    size_t bytes;
    bool ok;
  } cases[] = {/* this object's static __shared__ arrays (all the kernels') count too */
               {80, 140 * 1024, true},  {80, 163 * 1024 + 16, false}, {86, 80 * 1024, true},
               {86, 100 * 1024, false}, {89, 120 * 1024, false},      {90, 200 * 1024, true},
               {90, 227 * 1024 + 16, false}};
  for (const auto &c : cases) {
    o.arch = c.arch;
    int rc = launch_o(o, d3(1), d3(32), c.bytes, body);
    if (c.ok) {
      CHECK(rc == 0, "sm_%u, %zu bytes: rc %d: %s", c.arch, c.bytes, rc, g_msg);
    } else {
      char want[32];
      snprintf(want, sizeof want, "sm_%u", c.arch);
      if (!expect_error(rc, MG_HOST_E_CONFIG, want)) return false;
    }
  }
  o.arch = 12;
  return expect_error(launch_o(o, d3(1), d3(32), 0, body), MG_HOST_E_CONFIG, "unknown architecture");
}

bool t_ldmatrix_errors() {
  std::vector<uint16_t> g(32 * 8, 1);
  std::vector<unsigned> out(32);
  int bad = 1;
  auto body = [&] { K.k_ldmatrix_misaligned(g.data(), out.data(), bad); };
  if (!expect_error(launch(d3(1), d3(32), 0, body), MG_HOST_E_PTX, "not 16-byte aligned"))
    return false;
  bad = 2;
  if (!expect_error(launch(d3(1), d3(32), 0, body), MG_HOST_E_PTX, "not in shared memory"))
    return false;
  bad = 0;
  int rc = launch(d3(1), d3(32), 0, body);
  CHECK(rc == 0 && out[5] == 0x00010001u, "rc %d out %08x: %s", rc, out[5], g_msg);
  return true;
}

bool t_perf() {
  const int blocks = 16, threads = 128, iters = 4000, n = blocks * threads;
  std::vector<float> in = random_floats(n, 5), out(n, 0.0f);
  auto body = [&] { K.k_perf(in.data(), out.data(), iters); };
  auto t0 = std::chrono::steady_clock::now();
  int rc = launch(d3(blocks), d3(threads), 0, body);
  double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(rc == 0, "rc %d: %s", rc, g_msg);
  printf("    %d blocks x %d threads x %d shuffles: %.3f s (%.1f ns per lane-shuffle)\n", blocks,
         threads, iters, sec, sec * 1e9 / ((double)n * iters));
  /* Reference: the same arithmetic, block by block, lane-parallel. */
  for (int b = 0; b < blocks; ++b) {
    std::vector<float> v(in.begin() + b * threads, in.begin() + (b + 1) * threads), nv(threads);
    for (int it = 0; it < iters; ++it) {
      for (int t = 0; t < threads; ++t) {
        int src = (t & ~31) | ((t % 32) ^ (it % 31 + 1));
        nv[t] = v[t] * 0.5f + v[src] * 0.25f;
      }
      v.swap(nv);
      if (it % 256 == 255) {
        for (int t = 0; t < threads; ++t) nv[t] = v[t] + 0.125f * v[(t + 32) % threads];
        v.swap(nv);
      }
    }
    for (int t = 0; t < threads; ++t)
      CHECK(approx(out[b * threads + t], v[t], 1e-5), "out[%d] %g vs %g", b * threads + t,
            out[b * threads + t], v[t]);
  }
  return true;
}

#if MG_SELFTEST_ASAN && !defined(MG_SELFTEST_DLOPEN)
/* ---- ASan: each case in a child process, which ASan must stop ----------------------- */
int asan_child(const char *what) {
  std::vector<float> buf(64 * 4, 1.0f), out(64, 0.0f);
  std::vector<float> exact(64); /* exactly 64 floats: the 65th is out of bounds */
  auto g = [&] { K.k_oob_global(exact.data()); };
  auto sm = [&] { K.k_oob_smem(out.data(), 1); };
  auto dy = [&] { K.k_oob_dyn(out.data(), 1); };
  auto cp = [&] { K.k_oob_cp_async(buf.data(), out.data()); };
  int rc = -100;
  if (!strcmp(what, "global")) rc = launch(d3(1), d3(64), 0, g);
  if (!strcmp(what, "smem")) rc = launch(d3(1), d3(64), 0, sm);
  if (!strcmp(what, "dyn")) rc = launch(d3(1), d3(64), 64 * sizeof(float), dy);
  if (!strcmp(what, "cp_async")) rc = launch(d3(1), d3(64), 0, cp);
  fprintf(stderr, "asan child %s: not stopped (rc %d: %s)\n", what, rc, g_msg);
  return 0;
}

std::string g_self;

/* Runs this program with --asan-child what; returns its stderr and exit status. */
bool run_child(const char *what, std::string &err, int &status) {
  int fd[2];
  if (pipe(fd)) return false;
  pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    dup2(fd[1], 2);
    close(fd[0]);
    close(fd[1]);
    setenv("ASAN_OPTIONS", "detect_leaks=0:abort_on_error=0", 1);
    execl(g_self.c_str(), g_self.c_str(), "--asan-child", what, (char *)nullptr);
    _exit(127);
  }
  close(fd[1]);
  char b[4096];
  ssize_t r;
  while ((r = read(fd[0], b, sizeof b)) > 0) err.append(b, (size_t)r);
  close(fd[0]);
  waitpid(pid, &status, 0);
  return true;
}

bool asan_case(const char *what, int line, const char *kind) {
  std::string err;
  int status = 0;
  CHECK(run_child(what, err, status), "cannot run the child");
  bool stopped = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  char at[64];
  snprintf(at, sizeof at, "selftest.cpp:%d", line);
  size_t p = err.find(at);
  bool named = p != std::string::npos && !isdigit((unsigned char)err[p + strlen(at)]);
  size_t e = err.find("ERROR: AddressSanitizer");
  if (e != std::string::npos)
    printf("    %s: %s\n", what, err.substr(e, err.find('\n', e) - e).c_str());
  CHECK(stopped && e != std::string::npos, "%s: ASan did not stop the child:\n%s", what,
        err.c_str());
  CHECK(err.find(kind) != std::string::npos, "%s: report lacks '%s':\n%s", what, kind, err.c_str());
  CHECK(named, "%s: report does not name %s:\n%s", what, at, err.c_str());
  printf("    %s: reported at %s\n", what, at);
  return true;
}

bool t_asan_global() { return asan_case("global", k_oob_global_line, "WRITE of size 4"); }
bool t_asan_smem() {
  if (smem_emulated_fn() != 1) {
    printf("    skipped: native TLS (build with clang -femulated-tls for static smem bounds)\n");
    return true;
  }
  return asan_case("smem", k_oob_smem_line, "READ of size 4");
}
bool t_asan_dyn() { return asan_case("dyn", k_oob_dyn_line, "READ of size 4"); }
bool t_asan_cp_async() { return asan_case("cp_async", k_oob_cp_async_line, "READ of size"); }
#endif

void on_alarm(int) {
  static const char m[] = "selftest: timed out (a launch hangs?)\n";
  ssize_t r = write(2, m, sizeof m - 1);
  (void)r;
  _exit(3);
}

void run(const char *name, bool (*fn)()) {
  bool ok = fn();
  printf("%s %s\n", ok ? "PASS" : "FAIL", name);
  fflush(stdout);
  (ok ? n_pass : n_fail)++;
}

} // namespace

int main(int argc, char **argv) {
  signal(SIGALRM, on_alarm);
  alarm(120);
#if defined(MG_SELFTEST_DLOPEN)
  if (argc < 2) {
    fprintf(stderr, "usage: %s kernels.so\n", argv[0]);
    return 2;
  }
  void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 2;
  }
  launch_fn = (mg_host_launch_fn)dlsym(h, "mg_host_launch");
  launch_ex_fn = (mg_host_launch_ex_fn)dlsym(h, "mg_host_launch_ex");
  smem_emulated_fn = (int (*)(void))dlsym(h, "mg_host_smem_emulated");
#define X(name, type) K.name = (type)dlsym(h, #name);
  MG_SELFTEST_KERNEL_LIST(X)
#undef X
  if (!launch_fn || !launch_ex_fn || !smem_emulated_fn || !K.k_perf || !K.k_cp_async) {
    fprintf(stderr, "dlsym: %s\n", dlerror());
    return 2;
  }
  printf("mode: dlopen %s\n", argv[1]);
#else
  launch_fn = &mg_host_launch;
  launch_ex_fn = &mg_host_launch_ex;
  smem_emulated_fn = &mg_host_smem_emulated;
#define X(name, type) K.name = &name;
  MG_SELFTEST_KERNEL_LIST(X)
#undef X
#if MG_SELFTEST_ASAN
  if (argc == 3 && !strcmp(argv[1], "--asan-child")) return asan_child(argv[2]);
  g_self = "/proc/self/exe";
  printf("mode: static, ASan\n");
#else
  (void)argc;
  (void)argv;
  printf("mode: static\n");
#endif
#endif
  auto t0 = std::chrono::steady_clock::now();
  run("block_reduce", t_block_reduce);
  run("warp_ops", t_warp_ops);
  run("grid3d", t_grid3d);
  run("diverge_barrier", t_diverge_barrier);
  run("split_barrier", t_split_barrier);
  run("bad_mask", t_bad_mask);
  run("partial_warp", t_partial_warp);
  run("mixed_collectives", t_mixed_collectives);
  run("trap", t_trap);
  run("config_errors", t_config_errors);
  run("block_reduce_after_errors", t_block_reduce);
  run("dyn_smem", t_dyn_smem);
  run("bf16", t_bf16);
  run("sync_reduce", t_sync_reduce);
  run("partial_block", t_partial_block);
  run("missing_barrier", t_missing_barrier);
  run("nan_fill", t_nan_fill);
  run("seeds_identical", t_seeds_identical);
  run("shuffled", t_shuffled);
  run("mma", t_mma);
  run("mma_ldmatrix", t_mma_ldmatrix);
  run("ldmatrix_raw", t_ldmatrix_raw);
  run("cp_async", t_cp_async);
  run("resident_blocks", t_resident_blocks);
  run("cp_async_war", t_cp_async_war);
  run("collective_sites", t_collective_sites);
  run("activemask", t_activemask);
  run("same_line_sites", t_same_line_sites);
  run("arch_smem", t_arch_smem);
  run("ldmatrix_errors", t_ldmatrix_errors);
#if MG_SELFTEST_ASAN && !defined(MG_SELFTEST_DLOPEN)
  run("asan_global", t_asan_global);
  run("asan_smem", t_asan_smem);
  run("asan_dyn", t_asan_dyn);
  run("asan_cp_async", t_asan_cp_async);
#endif
  run("perf", t_perf);
  double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  printf("total %.3f s\n", sec);
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
#endif /* driver */
