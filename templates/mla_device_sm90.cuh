// mla_device_sm90.cuh: the Hopper (sm_90a) device primitives of the templates.
//
// A sibling of mla_device.cuh, included after it by sm_90a kernels only: mbarriers, TMA
// tensor loads (cp.async.bulk.tensor) from a CUtensorMap, wgmma.mma_async with shared-memory
// matrix descriptors, the async-proxy fence and setmaxnreg. Each wrapper is inline PTX under
// NVRTC/nvcc and, under the host executor (tests/host/cuda_host.h defines
// MG_HOST_EMULATION), a call into tests/host/hopper_host.cpp, which follows the PTX ISA's
// semantics: TMA data and wgmma accumulators appear only when the kernel waits for them
// (see tests/host/README.md). The layout helpers (swizzle, descriptors, accumulator
// fragment) are plain C++ shared by both builds and checked against CuTe in
// tests/test_hopper_layout.cpp.
//
// Also for the backward: MN-major ("transposed") wgmma operands, named barriers, TMA stores
// and reductions to global memory with bulk groups.
//
// Conventions: 16-bit operands (bf16 or f16), K-major A (M x K) and B (N x K) tiles in
// shared memory unless a wrapper says otherwise, f32 accumulators; one warpgroup = 4 consecutive warps (128 threads,
// warpgroup index = threadIdx.x / 128).
#pragma once
#ifndef MLA_SM90_LAYOUT_ONLY  // (tests/test_hopper_layout.cpp: the layout part only)
#include "mla_device.cuh"
#endif

namespace mla {
namespace sm90 {

#ifdef MG_HOST_EMULATION
#define MLA90_LINE , int mg_line = __builtin_LINE()
#define MLA90_LINE_ONLY int mg_line = __builtin_LINE()
#else
#define MLA90_LINE
#define MLA90_LINE_ONLY
#endif

// Element-type tags of the wgmma wrappers.
struct bf16_t {};
struct f16_t {};

// A CUtensorMap (cuda.h's type: 128 opaque bytes, 64-byte aligned), made on the host with
// cuTensorMapEncodeTiled and passed to the kernel by value as a `const __grid_constant__`
// parameter (the TMA instructions take its address in the parameter space).
struct __align__(64) TensorMap {
  unsigned long long opaque[16];
};
// N of them as one kernel parameter, `const __grid_constant__ TensorMaps<N> tmaps` (the host
// passes N contiguous CUtensorMaps; the kernel takes &tmaps.m[i]). By value, not in device
// memory: the launch copies them, so no proxy fence, no device buffer and no upload are
// needed, and a map rewritten for the next launch cannot be seen stale.
template <int N>
struct TensorMaps {
  TensorMap m[N];
};

// ---- layouts (plain arithmetic: the same in both builds) ---------------------------------
// Swizzle modes, numbered as the wgmma descriptor's bits 62-63 number them.
enum Swizzle : int { SWIZZLE_NONE = 0, SWIZZLE_128B = 1, SWIZZLE_64B = 2, SWIZZLE_32B = 3 };

// Bytes of one swizzled row (the swizzle span): 128, 64, 32; 16 without swizzle (a core
// matrix row).
__host__ __device__ __forceinline__ constexpr unsigned swizzle_span(int swz) {
  return swz == SWIZZLE_128B ? 128u : swz == SWIZZLE_64B ? 64u : swz == SWIZZLE_32B ? 32u : 16u;
}

// The swizzled form of a shared-memory byte address (or an offset from a base aligned to
// 1024 bytes): the 16-byte chunk index, bits [4, 4+b), is XORed with bits [7, 7+b), b = 3
// (128B), 2 (64B), 1 (32B), 0 (none). TMA writes and wgmma reads apply it to the absolute
// address, so a swizzled tile's base must be aligned to 1024 (128B), 512 (64B), 256 (32B).
__host__ __device__ __forceinline__ constexpr unsigned swizzle_addr(int swz, unsigned a) {
  return a ^ (((a >> 7) & (swz == SWIZZLE_128B ? 7u : swz == SWIZZLE_64B ? 3u
                                                    : swz == SWIZZLE_32B ? 1u : 0u)) << 4);
}

// Byte offset, from a tile base aligned as above, of element (row, col) of a K-major tile of
// 16-bit elements as one TMA box with the given swizzle writes it: rows of swizzle_span bytes
// (box inner dimension = span / 2 elements; col < span / 2). Without swizzle the box inner
// dimension is 8 elements (16-byte rows, col < 8): rows 16 bytes apart, which is the canonical
// no-swizzle core-matrix layout when the tile has a multiple of 8 rows.
__host__ __device__ __forceinline__ constexpr unsigned tile_offset(int swz, unsigned row,
                                                                  unsigned col) {
  return swizzle_addr(swz, row * swizzle_span(swz) + col * 2u);
}

// The 64-bit shared-memory matrix descriptor of wgmma (PTX ISA, "Matrix Descriptor Format"):
// bits 0-13 start address >> 4, 16-29 leading-dimension byte offset >> 4, 32-45
// stride-dimension byte offset >> 4, 49-51 base offset (0 here: tiles are aligned), 62-63
// swizzle mode. For a K-major operand: SBO = bytes between groups of 8 rows (8 * span when
// swizzled); LBO = bytes between the two 8-column halves of the 16-column K step (no
// swizzle only; unused, conventionally 16, when swizzled).
__host__ __device__ __forceinline__ constexpr unsigned long long make_desc(unsigned smem_addr,
                                                                          unsigned lbo,
                                                                          unsigned sbo, int swz) {
  return (unsigned long long)((smem_addr & 0x3ffffu) >> 4) |
         ((unsigned long long)((lbo >> 4) & 0x3fffu) << 16) |
         ((unsigned long long)((sbo >> 4) & 0x3fffu) << 32) |
         ((unsigned long long)(swz & 3) << 62);
}

// The descriptor of k-step ks (K rows [16 ks, 16 ks + 16)) of an MN-major 16-bit operand (A's
// M or B's N index contiguous: imm-trans-a / imm-trans-b 1) of `krows` K rows at shared
// address base (aligned as for tile_offset), stored as TMA boxes of a row-major [k][mn] tensor
// land: box b holds MN columns [b span/2, (b+1) span/2) of every K row, boxes krows x span
// bytes apart (no swizzle: 8-column boxes of 16-byte rows). PTX ISA MN-major canonical
// layouts: swizzled, LBO = krows x span (the next column block), SBO = 8 span (the next 8 K
// rows); no swizzle, LBO = 128 (the next 8 K rows), SBO = krows x 16 (the next 8 columns).
__host__ __device__ __forceinline__ constexpr unsigned long long make_desc_mn_kstep(
    int swz, unsigned base, unsigned krows, unsigned ks) {
  return swz == SWIZZLE_NONE
             ? make_desc(base + 16u * ks * 16u, 8u * 16u, krows * 16u, swz)
             : make_desc(base + 16u * ks * swizzle_span(swz), krows * swizzle_span(swz),
                         8u * swizzle_span(swz), swz);
}

// TMA box widths of the templates: a 16-bit dimension d (a multiple of 16) is loaded as boxes
// of box_width(d) columns, the widest of 64, 32, 16 that divides it, with the swizzle whose
// span is that row (box_swizzle: 128B, 64B, 32B).
__host__ __device__ __forceinline__ constexpr int box_width(int d) {
  return d % 64 == 0 ? 64 : d % 32 == 0 ? 32 : 16;
}
__host__ __device__ __forceinline__ constexpr int box_swizzle(int w) {
  return w == 64 ? SWIZZLE_128B : w == 32 ? SWIZZLE_64B : SWIZZLE_32B;
}

// The K-major descriptor of k-step ks (16 columns) of a 16-bit tile stored as w-column TMA
// boxes of `rows` rows each at shared address base (swizzle swz, span 2w bytes): box
// ks*16 / w, column ks*16 % w within it.
__host__ __device__ __forceinline__ constexpr unsigned long long make_desc_kstep(unsigned base, unsigned rows,
                                                                                int w, int swz, int ks) {
  return make_desc(base + (ks * 16 / w) * rows * (2u * w) + (ks * 16 % w) * 2, 16, 8 * (2u * w), swz);
}

// The wgmma m64nNk16 f32 accumulator fragment (PTX ISA, "Register Fragments ... wgmma
// .m64nNk16", matrix D): thread t of the warpgroup (0..127) holds d[i], i < N/2, at
// row 16 (t / 32) + (t % 32) / 4 + 8 ((i % 4) / 2), column 8 (i / 4) + 2 (t % 4) + i % 2.
__host__ __device__ __forceinline__ constexpr unsigned acc_row(unsigned t, unsigned i) {
  return 16u * (t / 32u) + (t % 32u) / 4u + 8u * ((i % 4u) / 2u);
}
__host__ __device__ __forceinline__ constexpr unsigned acc_col(unsigned t, unsigned i) {
  return 8u * (i / 4u) + 2u * (t % 4u) + i % 2u;
}

#ifndef MLA_SM90_LAYOUT_ONLY
// The 32-bit .shared address of a pointer into shared memory (the host executor: its
// offset in the dynamic shared memory buffer, which must hold it).
__device__ __forceinline__ unsigned smem_u32(const void* p MLA90_LINE) {
#ifdef MG_HOST_EMULATION
  return mg_host_smem_u32(p, mg_line);
#else
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
#endif
}

// ---- mbarrier ----------------------------------------------------------------------------
// A 64-bit mbarrier object in shared memory (8-byte aligned). Its current phase completes
// when `count` arrivals have been made and its tx-count (bytes announced with expect_tx,
// less the bytes TMA loads completed on it) is zero; then the next phase starts.

// mbarrier.init.shared::cta.b64: expected arrival count (1 .. 2^20 - 1), phase 0, tx 0.
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count MLA90_LINE) {
#ifdef MG_HOST_EMULATION
  mg_host_mbar_init(bar, count, mg_line);
#else
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count)
               : "memory");
#endif
}

// fence.mbarrier_init.release.cluster: makes initialized mbarriers visible to the async
// proxy (TMA) and other threads; then a __syncthreads before any use.
__device__ __forceinline__ void mbar_init_fence() {
#ifndef MG_HOST_EMULATION
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// mbarrier.arrive.shared::cta.b64: one arrival on the current phase.
__device__ __forceinline__ void mbar_arrive(unsigned long long* bar MLA90_LINE) {
#ifdef MG_HOST_EMULATION
  mg_host_mbar_arrive(bar, 0, mg_line);
#else
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(
                   smem_u32(bar))
               : "memory");
#endif
}

// mbarrier.arrive.expect_tx.shared::cta.b64: announces `bytes` of TMA transfers for the current
// phase (tx-count += bytes), then one arrival.
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned long long* bar,
                                                      unsigned bytes MLA90_LINE) {
#ifdef MG_HOST_EMULATION
  mg_host_mbar_arrive(bar, bytes, mg_line);
#else
  asm volatile(
      "{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(
          smem_u32(bar)),
      "r"(bytes)
      : "memory");
#endif
}

// mbarrier.try_wait.parity.shared::cta.b64: true when the phase of parity `parity` (0 or 1)
// has completed, i.e. the current phase's parity differs. The hardware may return false after
// a time limit; the host executor instead suspends the thread until it is true.
__device__ __forceinline__ bool mbar_try_wait(unsigned long long* bar, unsigned parity MLA90_LINE) {
#ifdef MG_HOST_EMULATION
  return mg_host_mbar_wait(bar, parity, mg_line) != 0;
#else
  unsigned ok;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
  return ok != 0;
#endif
}

// Waits until the phase of parity `parity` has completed (try_wait in a loop).
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity MLA90_LINE) {
#ifdef MG_HOST_EMULATION
  (void)mg_host_mbar_wait(bar, parity, mg_line);
#else
  while (!mbar_try_wait(bar, parity)) {
  }
#endif
}

// ---- TMA -----------------------------------------------------------------------------------
// cp.async.bulk.tensor.{2d,3d,4d}.shared::cluster.global.tile.mbarrier::complete_tx::bytes:
// loads the box of `map` at element coordinates (c0 innermost, c1[, c2[, c3]]) into shared
// memory at dst
// (128-byte aligned; swizzled as the map says), elements outside the tensor filled with zero;
// when the bytes have landed they complete_tx on `bar` (the box's full size in bytes, the
// out-of-bounds part included). Issued by one thread; map must be a __grid_constant__ kernel
// parameter.
__device__ __forceinline__ void tma_load_2d(void* dst, const TensorMap* map, unsigned long long* bar,
                                            int c0, int c1 MLA90_LINE) {
#ifdef MG_HOST_EMULATION
  int c[3] = {c0, c1, 0};
  mg_host_tma_load(dst, map, bar, 2, c, mg_line);
#else
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
      : "memory");
#endif
}
__device__ __forceinline__ void tma_load_3d(void* dst, const TensorMap* map, unsigned long long* bar,
                                            int c0, int c1, int c2 MLA90_LINE) {
#ifdef MG_HOST_EMULATION
  int c[3] = {c0, c1, c2};
  mg_host_tma_load(dst, map, bar, 3, c, mg_line);
#else
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1),
      "r"(c2)
      : "memory");
#endif
}
__device__ __forceinline__ void tma_load_4d(void* dst, const TensorMap* map, unsigned long long* bar,
                                            int c0, int c1, int c2, int c3 MLA90_LINE) {
#ifdef MG_HOST_EMULATION
  int c[4] = {c0, c1, c2, c3};
  mg_host_tma_load(dst, map, bar, 4, c, mg_line);
#else
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1),
      "r"(c2), "r"(c3)
      : "memory");
#endif
}

// fence.proxy.async.shared::cta: this thread's earlier generic-proxy writes to shared memory
// become visible to the async proxy (wgmma operand reads, TMA stores). Needed between writing
// a wgmma operand with ordinary stores and the wgmma (with a barrier between threads).
__device__ __forceinline__ void fence_proxy_async(MLA90_LINE_ONLY) {
#ifdef MG_HOST_EMULATION
  mg_host_fence_proxy_async(mg_line);
#else
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// ---- wgmma -----------------------------------------------------------------------------------
// All of these are warpgroup-wide (.sync.aligned): the 128 threads of a warpgroup execute them
// together with the same operands (descriptors, N, scale_d).

// wgmma.fence.sync.aligned: orders this thread's earlier register accesses (accumulators, A
// fragments) before the wgmma.mma_async that follow. Needed before the first mma_async and
// after the accumulators were touched (the host executor requires one after every
// wait_group that delivered results).
__device__ __forceinline__ void wgmma_fence(MLA90_LINE_ONLY) {
#ifdef MG_HOST_EMULATION
  mg_host_wgmma_fence(mg_line);
#else
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

// wgmma.commit_group.sync.aligned: the mma_async issued since the last commit form a group.
__device__ __forceinline__ void wgmma_commit(MLA90_LINE_ONLY) {
#ifdef MG_HOST_EMULATION
  mg_host_wgmma_commit(mg_line);
#else
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

// wgmma.wait_group.sync.aligned N: waits until at most the N newest groups are pending; the
// accumulators of every older group are then in the registers.
template <int N>
__device__ __forceinline__ void wgmma_wait(MLA90_LINE_ONLY) {
  static_assert(N >= 0 && N < 8, "wgmma.wait_group takes 0..7");
#ifdef MG_HOST_EMULATION
  mg_host_wgmma_wait(N, mg_line);
#else
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

// Keeps the compiler from moving accesses of an accumulator or fragment register across the
// wgmma wrappers (an empty asm that reads and writes it).
template <int R>
__device__ __forceinline__ void fence_operand(float (&d)[R]) {
#ifndef MG_HOST_EMULATION
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
#else
  (void)d;
#endif
}
// The same for 16-bit A fragments in registers (wgmma_rs's a[k-step][4]): after the wait for
// the GEMMs that read them, so they stay unchanged in their registers while those run.
template <int M>
__device__ __forceinline__ void fence_operand(unsigned (&a)[M][4]) {
#ifndef MG_HOST_EMULATION
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[i][e])::"memory");
#else
  (void)a;
#endif
}

// D (64 x N, f32, fragment acc_row/acc_col) = A (64 x 16) B^T (B: N x 16) + (scale_d ? D : 0):
// wgmma.mma_async.sync.aligned.m64nNk16.f32.T.T, T = bf16_t or f16_t.
//   wgmma_ss: A and B from shared memory through descriptors (make_desc), both K-major.
//   wgmma_rs: A from registers, 4 per thread in the mma.m16n8k16 A layout for rows 16 (t / 32)
//             + 0..15 (a[0] (g, 2q..2q+1), a[1] (g+8, ..), a[2] (g, 2q+8..), a[3] (g+8, 2q+8..);
//             g = (t % 32) / 4, q = t % 4; low half first), B from shared memory.
// N: 64, 128, 192 or 256. Asynchronous: d is written at wgmma_wait, and must not be touched in
// between.
template <int N, class T>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], unsigned long long desc_a,
                                         unsigned long long desc_b, int scale_d MLA90_LINE);
template <int N, class T>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const unsigned (&a)[4],
                                         unsigned long long desc_b, int scale_d MLA90_LINE);

// wgmma_rs_tb: wgmma_rs with B MN-major (imm-trans-b 1: B's N index contiguous, as a
// [K][N] row-major tile such as V [keys][d_v] lands; descriptor per the ISA's MN-major
// canonical layouts: swizzled, LBO = bytes between span-wide column blocks of N and SBO =
// bytes between groups of 8 K rows; no swizzle, SBO between 8-column groups of N, LBO
// between the two 8-row halves of K).
template <int N, class T>
__device__ __forceinline__ void wgmma_rs_tb(float (&d)[N / 2], const unsigned (&a)[4],
                                            unsigned long long desc_b, int scale_d MLA90_LINE);

// wgmma_ss_t: wgmma_ss with either operand MN-major (TRANS_A / TRANS_B = 1: imm-trans-a /
// imm-trans-b, 16-bit types only): the backward's P^T dO and dS^T Q read P, dS ([q][key]) and
// dO, Q ([q][d]) as they lie, the M (resp. N) index contiguous. An MN-major operand's
// descriptor follows wgmma_rs_tb's (the same canonical layouts for A's M as for B's N:
// mg_host_gmma_addr_mn decodes both); a K-major one make_desc's K-major form.
template <int N, class T, int TRANS_A, int TRANS_B>
__device__ __forceinline__ void wgmma_ss_t(float (&d)[N / 2], unsigned long long desc_a,
                                           unsigned long long desc_b, int scale_d MLA90_LINE);

#ifdef MG_HOST_EMULATION
template <int N, class T>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], unsigned long long desc_a,
                                         unsigned long long desc_b, int scale_d, int mg_line) {
  static_assert(N == 64 || N == 128 || N == 192 || N == 256, "wgmma N: 64, 128, 192, 256");
  mg_host_wgmma(std::is_same<T, f16_t>::value ? 1 : 0, N, d, nullptr, desc_a, desc_b, scale_d,
                mg_line);
}
template <int N, class T>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const unsigned (&a)[4],
                                         unsigned long long desc_b, int scale_d, int mg_line) {
  static_assert(N == 64 || N == 128 || N == 192 || N == 256, "wgmma N: 64, 128, 192, 256");
  mg_host_wgmma(std::is_same<T, f16_t>::value ? 1 : 0, N, d, a, 0, desc_b, scale_d, mg_line);
}
template <int N, class T>
__device__ __forceinline__ void wgmma_rs_tb(float (&d)[N / 2], const unsigned (&a)[4],
                                            unsigned long long desc_b, int scale_d, int mg_line) {
  static_assert(N == 64 || N == 128 || N == 192 || N == 256, "wgmma N: 64, 128, 192, 256");
  mg_host_wgmma((std::is_same<T, f16_t>::value ? 1 : 0) | 2, N, d, a, 0, desc_b, scale_d, mg_line);
}
template <int N, class T, int TRANS_A, int TRANS_B>
__device__ __forceinline__ void wgmma_ss_t(float (&d)[N / 2], unsigned long long desc_a,
                                           unsigned long long desc_b, int scale_d, int mg_line) {
  static_assert(N == 64 || N == 128 || N == 192 || N == 256, "wgmma N: 64, 128, 192, 256");
  static_assert((TRANS_A == 0 || TRANS_A == 1) && (TRANS_B == 0 || TRANS_B == 1), "trans: 0 or 1");
  mg_host_wgmma((std::is_same<T, f16_t>::value ? 1 : 0) | (TRANS_B ? 2 : 0) | (TRANS_A ? 4 : 0), N,
                d, nullptr, desc_a, desc_b, scale_d, mg_line);
}
#else
// wgmma's accumulator is a list of N / 2 registers, and inline asm needs each one named: in the
// operand list ("+f"(d[i])) and in the instruction's register list ("%i"). MLA90_WG_D<C> and
// MLA90_WG_R<C> spell both once per count C (32, 64, 96, 128); the MLA90_WG_* variant macros
// below take N, C, the PTX type name and the operand numbers that follow the accumulators, and
// each specialization is one line (they name the enclosing function's d, a, da, db, scale_d and,
// for MLA90_WG_SS_T, its template arguments TA, TB). #undef'd after the last use.
#define MLA90_WG_R32 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define MLA90_WG_D32 \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define MLA90_WG_R64 MLA90_WG_R32 ", " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define MLA90_WG_D64 MLA90_WG_D32, \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define MLA90_WG_R96 MLA90_WG_R64 ", " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define MLA90_WG_D96 MLA90_WG_D64, \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
  "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
  "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
#define MLA90_WG_R128 MLA90_WG_R96 ", " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define MLA90_WG_D128 MLA90_WG_D96, \
  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
  "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
  "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
  "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
// The instruction's head: predicate p = (scale_d != 0) from operand SC, then the opcode.
#define MLA90_WG_HEAD(N, TY, SC) \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %" #SC ", 0;\n" \
  "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " {"
// A, B from shared memory (descriptors %DA, %DB), both K-major; scale_d is %(DB + 1).
#define MLA90_WG_SS(N, C, TY, DA, DB, SC) \
  asm volatile(MLA90_WG_HEAD(N, TY, SC) MLA90_WG_R##C "}, %" #DA ", %" #DB ", p, 1, 1, 0, 0;\n}\n" \
               : MLA90_WG_D##C : "l"(da), "l"(db), "r"(scale_d))
// A from registers a[0..3] (%A0..%A0+3), B from shared memory (%DB); TB: imm-trans-b (0 or 1).
#define MLA90_WG_RS(N, C, TY, A0, A1, A2, A3, DB, SC, TB) \
  asm volatile(MLA90_WG_HEAD(N, TY, SC) MLA90_WG_R##C \
               "}, {%" #A0 ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #DB ", p, 1, 1, " #TB ";\n}\n" \
               : MLA90_WG_D##C : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d))
// wgmma_ss with imm-trans-a / imm-trans-b as "n" immediates %IA, %IB (the caller's template
// arguments TA, TB).
#define MLA90_WG_SS_T(N, C, TY, DA, DB, SC, IA, IB) \
  asm volatile(MLA90_WG_HEAD(N, TY, SC) MLA90_WG_R##C \
               "}, %" #DA ", %" #DB ", p, 1, 1, %" #IA ", %" #IB ";\n}\n" \
               : MLA90_WG_D##C : "l"(da), "l"(db), "r"(scale_d), "n"(TA), "n"(TB))
template <> __device__ __forceinline__ void wgmma_ss<64, bf16_t>(float (&d)[32], unsigned long long da, unsigned long long db, int scale_d) { MLA90_WG_SS(64, 32, "bf16", 32, 33, 34); }
template <> __device__ __forceinline__ void wgmma_rs<64, bf16_t>(float (&d)[32], const unsigned (&a)[4], unsigned long long db, int scale_d) { MLA90_WG_RS(64, 32, "bf16", 32, 33, 34, 35, 36, 37, 0); }
template <> __device__ __forceinline__ void wgmma_ss<128, bf16_t>(float (&d)[64], unsigned long long da, unsigned long long db, int scale_d) { MLA90_WG_SS(128, 64, "bf16", 64, 65, 66); }
template <> __device__ __forceinline__ void wgmma_rs<128, bf16_t>(float (&d)[64], const unsigned (&a)[4], unsigned long long db, int scale_d) { MLA90_WG_RS(128, 64, "bf16", 64, 65, 66, 67, 68, 69, 0); }
template <> __device__ __forceinline__ void wgmma_ss<192, bf16_t>(float (&d)[96], unsigned long long da, unsigned long long db, int scale_d) { MLA90_WG_SS(192, 96, "bf16", 96, 97, 98); }
template <> __device__ __forceinline__ void wgmma_rs<192, bf16_t>(float (&d)[96], const unsigned (&a)[4], unsigned long long db, int scale_d) { MLA90_WG_RS(192, 96, "bf16", 96, 97, 98, 99, 100, 101, 0); }
template <> __device__ __forceinline__ void wgmma_ss<256, bf16_t>(float (&d)[128], unsigned long long da, unsigned long long db, int scale_d) { MLA90_WG_SS(256, 128, "bf16", 128, 129, 130); }
template <> __device__ __forceinline__ void wgmma_rs<256, bf16_t>(float (&d)[128], const unsigned (&a)[4], unsigned long long db, int scale_d) { MLA90_WG_RS(256, 128, "bf16", 128, 129, 130, 131, 132, 133, 0); }
template <> __device__ __forceinline__ void wgmma_ss<64, f16_t>(float (&d)[32], unsigned long long da, unsigned long long db, int scale_d) { MLA90_WG_SS(64, 32, "f16", 32, 33, 34); }
template <> __device__ __forceinline__ void wgmma_rs<64, f16_t>(float (&d)[32], const unsigned (&a)[4], unsigned long long db, int scale_d) { MLA90_WG_RS(64, 32, "f16", 32, 33, 34, 35, 36, 37, 0); }
template <> __device__ __forceinline__ void wgmma_ss<128, f16_t>(float (&d)[64], unsigned long long da, unsigned long long db, int scale_d) { MLA90_WG_SS(128, 64, "f16", 64, 65, 66); }
template <> __device__ __forceinline__ void wgmma_rs<128, f16_t>(float (&d)[64], const unsigned (&a)[4], unsigned long long db, int scale_d) { MLA90_WG_RS(128, 64, "f16", 64, 65, 66, 67, 68, 69, 0); }
template <> __device__ __forceinline__ void wgmma_ss<192, f16_t>(float (&d)[96], unsigned long long da, unsigned long long db, int scale_d) { MLA90_WG_SS(192, 96, "f16", 96, 97, 98); }
template <> __device__ __forceinline__ void wgmma_rs<192, f16_t>(float (&d)[96], const unsigned (&a)[4], unsigned long long db, int scale_d) { MLA90_WG_RS(192, 96, "f16", 96, 97, 98, 99, 100, 101, 0); }
template <> __device__ __forceinline__ void wgmma_ss<256, f16_t>(float (&d)[128], unsigned long long da, unsigned long long db, int scale_d) { MLA90_WG_SS(256, 128, "f16", 128, 129, 130); }
template <> __device__ __forceinline__ void wgmma_rs<256, f16_t>(float (&d)[128], const unsigned (&a)[4], unsigned long long db, int scale_d) { MLA90_WG_RS(256, 128, "f16", 128, 129, 130, 131, 132, 133, 0); }
template <> __device__ __forceinline__ void wgmma_rs_tb<64, bf16_t>(float (&d)[32], const unsigned (&a)[4], unsigned long long db, int scale_d) { MLA90_WG_RS(64, 32, "bf16", 32, 33, 34, 35, 36, 37, 1); }
template <> __device__ __forceinline__ void wgmma_rs_tb<64, f16_t>(float (&d)[32], const unsigned (&a)[4], unsigned long long db, int scale_d) { MLA90_WG_RS(64, 32, "f16", 32, 33, 34, 35, 36, 37, 1); }
template <> __device__ __forceinline__ void wgmma_rs_tb<128, bf16_t>(float (&d)[64], const unsigned (&a)[4], unsigned long long db, int scale_d) { MLA90_WG_RS(128, 64, "bf16", 64, 65, 66, 67, 68, 69, 1); }
template <> __device__ __forceinline__ void wgmma_rs_tb<128, f16_t>(float (&d)[64], const unsigned (&a)[4], unsigned long long db, int scale_d) { MLA90_WG_RS(128, 64, "f16", 64, 65, 66, 67, 68, 69, 1); }
template <> __device__ __forceinline__ void wgmma_rs_tb<192, bf16_t>(float (&d)[96], const unsigned (&a)[4], unsigned long long db, int scale_d) { MLA90_WG_RS(192, 96, "bf16", 96, 97, 98, 99, 100, 101, 1); }
template <> __device__ __forceinline__ void wgmma_rs_tb<192, f16_t>(float (&d)[96], const unsigned (&a)[4], unsigned long long db, int scale_d) { MLA90_WG_RS(192, 96, "f16", 96, 97, 98, 99, 100, 101, 1); }
template <> __device__ __forceinline__ void wgmma_rs_tb<256, bf16_t>(float (&d)[128], const unsigned (&a)[4], unsigned long long db, int scale_d) { MLA90_WG_RS(256, 128, "bf16", 128, 129, 130, 131, 132, 133, 1); }
template <> __device__ __forceinline__ void wgmma_rs_tb<256, f16_t>(float (&d)[128], const unsigned (&a)[4], unsigned long long db, int scale_d) { MLA90_WG_RS(256, 128, "f16", 128, 129, 130, 131, 132, 133, 1); }
// wgmma_ss_t: one overload per accumulator size and type, imm-trans-a/b as "n" immediates.
namespace detail {
template <int TA, int TB>
__device__ __forceinline__ void wgmma_ss_t_impl(float (&d)[32], unsigned long long da, unsigned long long db, int scale_d, bf16_t) { MLA90_WG_SS_T(64, 32, "bf16", 32, 33, 34, 35, 36); }
template <int TA, int TB>
__device__ __forceinline__ void wgmma_ss_t_impl(float (&d)[64], unsigned long long da, unsigned long long db, int scale_d, bf16_t) { MLA90_WG_SS_T(128, 64, "bf16", 64, 65, 66, 67, 68); }
template <int TA, int TB>
__device__ __forceinline__ void wgmma_ss_t_impl(float (&d)[96], unsigned long long da, unsigned long long db, int scale_d, bf16_t) { MLA90_WG_SS_T(192, 96, "bf16", 96, 97, 98, 99, 100); }
template <int TA, int TB>
__device__ __forceinline__ void wgmma_ss_t_impl(float (&d)[128], unsigned long long da, unsigned long long db, int scale_d, bf16_t) { MLA90_WG_SS_T(256, 128, "bf16", 128, 129, 130, 131, 132); }
template <int TA, int TB>
__device__ __forceinline__ void wgmma_ss_t_impl(float (&d)[32], unsigned long long da, unsigned long long db, int scale_d, f16_t) { MLA90_WG_SS_T(64, 32, "f16", 32, 33, 34, 35, 36); }
template <int TA, int TB>
__device__ __forceinline__ void wgmma_ss_t_impl(float (&d)[64], unsigned long long da, unsigned long long db, int scale_d, f16_t) { MLA90_WG_SS_T(128, 64, "f16", 64, 65, 66, 67, 68); }
template <int TA, int TB>
__device__ __forceinline__ void wgmma_ss_t_impl(float (&d)[96], unsigned long long da, unsigned long long db, int scale_d, f16_t) { MLA90_WG_SS_T(192, 96, "f16", 96, 97, 98, 99, 100); }
template <int TA, int TB>
__device__ __forceinline__ void wgmma_ss_t_impl(float (&d)[128], unsigned long long da, unsigned long long db, int scale_d, f16_t) { MLA90_WG_SS_T(256, 128, "f16", 128, 129, 130, 131, 132); }
}  // namespace detail
#undef MLA90_WG_SS_T
#undef MLA90_WG_RS
#undef MLA90_WG_SS
#undef MLA90_WG_HEAD
#undef MLA90_WG_D128
#undef MLA90_WG_R128
#undef MLA90_WG_D96
#undef MLA90_WG_R96
#undef MLA90_WG_D64
#undef MLA90_WG_R64
#undef MLA90_WG_D32
#undef MLA90_WG_R32
template <int N, class T, int TRANS_A, int TRANS_B>
__device__ __forceinline__ void wgmma_ss_t(float (&d)[N / 2], unsigned long long desc_a,
                                           unsigned long long desc_b, int scale_d) {
  static_assert(N == 64 || N == 128 || N == 192 || N == 256, "wgmma N: 64, 128, 192, 256");
  static_assert((TRANS_A == 0 || TRANS_A == 1) && (TRANS_B == 0 || TRANS_B == 1), "trans: 0 or 1");
  detail::wgmma_ss_t_impl<TRANS_A, TRANS_B>(d, desc_a, desc_b, scale_d, T());
}
#endif

// ---- stmatrix ---------------------------------------------------------------------------------
// stmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (sm_90; one warp, all lanes): the inverse of
// ldmatrix_x4[_trans]. smem_row: this lane's row of 8 16-bit elements, 16-byte aligned, in
// shared memory; lanes 8m..8m+7 give rows 0..7 of matrix m. Lane i holds in r[m] row i/4,
// elements 2(i%4) (low half) and 2(i%4)+1 of matrix m; .trans stores each matrix transposed
// (stored row j = column j of the fragment matrix). Writes a bf16 accumulator tile (P, dS) to
// shared memory for a later wgmma or TMA store (then fence_proxy_async).
__device__ __forceinline__ void stmatrix_x4(const unsigned (&r)[4], void* smem_row MLA90_LINE) {
#ifdef MG_HOST_EMULATION
  mg_host_stmatrix(0, r, smem_row, mg_line);
#else
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                   smem_u32(smem_row)),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
#endif
}
__device__ __forceinline__ void stmatrix_x4_trans(const unsigned (&r)[4],
                                                  void* smem_row MLA90_LINE) {
#ifdef MG_HOST_EMULATION
  mg_host_stmatrix(1, r, smem_row, mg_line);
#else
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                   smem_u32(smem_row)),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
#endif
}

// ---- named barriers -----------------------------------------------------------------------
// bar.sync id, count / bar.arrive id, count: CTA barrier `id` (1..15; 0 is __syncthreads's)
// for `count` threads (a multiple of 32; whole warps arrive). bar_sync arrives and waits until
// `count` threads have arrived at this instance of the barrier; bar_arrive arrives without
// waiting (a producer signalling a consumer: warpgroup ping-pong, ordered accumulation). All
// participants of one instance must give the same count. Orders the memory accesses before the
// arrival before those after the wait (CTA scope). The host executor reports a count that
// differs within an instance, a count that is not a multiple of 32 or exceeds the block, an id
// out of 1..15, a wait that never completes (a participant that never arrives), and arrivals
// left incomplete when the block exits.
__device__ __forceinline__ void bar_sync(unsigned id, unsigned count MLA90_LINE) {
#ifdef MG_HOST_EMULATION
  mg_host_named_bar(1, id, count, mg_line);
#else
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void bar_arrive(unsigned id, unsigned count MLA90_LINE) {
#ifdef MG_HOST_EMULATION
  mg_host_named_bar(0, id, count, mg_line);
#else
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
#endif
}

// ---- TMA stores and reductions (shared -> global) ------------------------------------------
// cp.async.bulk.tensor.2d.global.shared::cta.bulk_group: stores the box of `map` at element
// coordinates (c0 innermost, c1) from shared memory at src (128-byte aligned, laid out as a TMA
// load of the same map lays it: swizzle included); elements outside the tensor are not
// written. cp.reduce.async.bulk.tensor ... .add: global += the box instead (element-wise,
// atomically per element; f32 maps here). Both read shared memory through the async proxy: the
// data written with ordinary stores needs fence_proxy_async() by its writers (and a barrier)
// before the issue. Issued by one thread; completion per bulk group of that thread
// (bulk_commit, bulk_wait_read, bulk_wait). map must be a __grid_constant__ kernel parameter.
__device__ __forceinline__ void tma_store_2d(const TensorMap* map, const void* src, int c0,
                                             int c1 MLA90_LINE) {
#ifdef MG_HOST_EMULATION
  int c[3] = {c0, c1, 0};
  mg_host_tma_store(0, map, src, 2, c, mg_line);
#else
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::
                   "l"(reinterpret_cast<unsigned long long>(map)), "r"(smem_u32(src)), "r"(c0),
               "r"(c1)
               : "memory");
#endif
}
__device__ __forceinline__ void tma_reduce_add_2d(const TensorMap* map, const void* src, int c0,
                                                  int c1 MLA90_LINE) {
#ifdef MG_HOST_EMULATION
  int c[3] = {c0, c1, 0};
  mg_host_tma_store(1, map, src, 2, c, mg_line);
#else
  asm volatile(
      "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3}], "
      "[%1];\n" ::"l"(reinterpret_cast<unsigned long long>(map)),
      "r"(smem_u32(src)), "r"(c0), "r"(c1)
      : "memory");
#endif
}

// cp.async.bulk.commit_group: this thread's bulk stores/reductions issued since the last commit
// form a bulk group.
__device__ __forceinline__ void bulk_commit(MLA90_LINE_ONLY) {
#ifdef MG_HOST_EMULATION
  mg_host_bulk_commit(mg_line);
#else
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}

// cp.async.bulk.wait_group.read N: waits until at most the N newest bulk groups of this thread
// still read their shared-memory sources: the older groups' sources may be overwritten. Their
// global writes need not have happened yet.
template <int N>
__device__ __forceinline__ void bulk_wait_read(MLA90_LINE_ONLY) {
  static_assert(N >= 0 && N < 64, "cp.async.bulk.wait_group.read takes 0..63");
#ifdef MG_HOST_EMULATION
  mg_host_bulk_wait(N, 1, mg_line);
#else
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
#endif
}

// cp.async.bulk.wait_group N: waits until at most the N newest bulk groups of this thread are
// pending: the older groups have completed, their global writes made (visible to this thread).
template <int N>
__device__ __forceinline__ void bulk_wait(MLA90_LINE_ONLY) {
  static_assert(N >= 0 && N < 64, "cp.async.bulk.wait_group takes 0..63");
#ifdef MG_HOST_EMULATION
  mg_host_bulk_wait(N, 0, mg_line);
#else
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// setmaxnreg.{inc,dec}.sync.aligned.u32 R: the warpgroup's per-thread register budget
// becomes R (24..256, a multiple of 8): producer warpgroups give registers to consumers.
// Warpgroup-wide; the host executor only checks that all 128 threads ask for the same R.
template <int R>
__device__ __forceinline__ void setmaxnreg_inc(MLA90_LINE_ONLY) {
  static_assert(R >= 24 && R <= 256 && R % 8 == 0, "setmaxnreg: 24..256, a multiple of 8");
#ifdef MG_HOST_EMULATION
  mg_host_setmaxnreg(1, R, mg_line);
#else
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
#endif
}
template <int R>
__device__ __forceinline__ void setmaxnreg_dec(MLA90_LINE_ONLY) {
  static_assert(R >= 24 && R <= 256 && R % 8 == 0, "setmaxnreg: 24..256, a multiple of 8");
#ifdef MG_HOST_EMULATION
  mg_host_setmaxnreg(0, R, mg_line);
#else
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
#endif
}

// ---- pieces the sm_90a templates share -------------------------------------------------------
#ifdef MG_HOST_EMULATION
#define MLA90_PASS_LINE , mg_line
#else
#define MLA90_PASS_LINE
#endif

// The dynamic shared memory's first 1024-aligned byte (the 128B swizzle pattern repeats every
// 1024 bytes of address; the launch asks for 1024 bytes more than the kernel lays out).
__device__ __forceinline__ unsigned char* smem_align_1024(unsigned char* smem) {
  const unsigned raw = smem_u32(smem);
  return smem + (((raw + 1023u) & ~1023u) - raw);
}

// x, unknown to the compiler from here on: keeps a loop-invariant shared address (and the
// 64-bit descriptors made from it) from being hoisted out of a tile loop into registers.
__device__ __forceinline__ unsigned opaque_u32(unsigned x) {
#ifndef MG_HOST_EMULATION
  asm volatile("" : "+r"(x));
#endif
  return x;
}

// One TMA load per W-column box of columns [col0, col0 + D) of rows [row, row + ROWS) of batch
// item b (of head h: 4D maps {d, H, S, B}; 3D maps {d, S, B}): box c lands at dst + c ROWS 2W
// bytes, all completing on bar (whose expect_tx the caller has set). The batch item is a
// dimension of its own, so a box's rows past the item's end are TMA's zero fill, never the
// next item's tokens.
template <int D, int W, int ROWS>
__device__ __forceinline__ void tma_load_boxes_4d(unsigned char* dst, const TensorMap* map,
                                                  unsigned long long* bar, int col0, int h,
                                                  int row, int b MLA90_LINE) {
  for (int c = 0; c < D / W; ++c)
    tma_load_4d(dst + c * ROWS * 2 * W, map, bar, col0 + c * W, h, row, b MLA90_PASS_LINE);
}
template <int D, int W, int ROWS>
__device__ __forceinline__ void tma_load_boxes_3d(unsigned char* dst, const TensorMap* map,
                                                  unsigned long long* bar, int col0, int row,
                                                  int b MLA90_LINE) {
  for (int c = 0; c < D / W; ++c)
    tma_load_3d(dst + c * ROWS * 2 * W, map, bar, col0 + c * W, row, b MLA90_PASS_LINE);
}

// An explicit-form key tile K = [K_nope ; k_rope] of ROWS keys from row `row` of batch item b,
// head h: K_nope's DN columns as WN-column boxes through nope (dims {d_n or d_n + d_r, H, S,
// B}), then, at dst + ROWS DN 2, the DR RoPE columns as WR-column boxes: PACKED, columns DN..
// of the same per-head K (rope: dims {d_n + d_r, H, S, B}); split, the shared k_rope (rope:
// dims {d_r, S, B}). All complete on bar.
template <int DN, int DR, int WN, int WR, int ROWS, bool PACKED>
__device__ __forceinline__ void tma_load_k_tile(unsigned char* dst, const TensorMap* nope,
                                                const TensorMap* rope, unsigned long long* bar,
                                                int h, int row, int b MLA90_LINE) {
  tma_load_boxes_4d<DN, WN, ROWS>(dst, nope, bar, 0, h, row, b MLA90_PASS_LINE);
  if (PACKED)
    tma_load_boxes_4d<DR, WR, ROWS>(dst + ROWS * DN * 2, rope, bar, DN, h, row, b MLA90_PASS_LINE);
  else
    tma_load_boxes_3d<DR, WR, ROWS>(dst + ROWS * DN * 2, rope, bar, 0, row, b MLA90_PASS_LINE);
}

// The online softmax of a wgmma accumulator tile s (m64nN fp32 fragment, scaled to base 2 and
// masked to -inf already) for this thread's two rows (r = 0: elements i % 4 < 2; r = 1 the
// others), each spread over a quad: the running max m and this thread's part of the running
// sum l are updated, s becomes P = exp2(s - max) and corr[r] = exp2(m_old - m_new) is how the
// output accumulator must be rescaled (rescale_rows). A row with no visible key so far keeps
// max -inf and subtracts 0, so its P is 0.
template <int N>
__device__ __forceinline__ void online_softmax(float (&s)[N / 2], float (&m)[2], float (&l)[2],
                                               float (&corr)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = m[r];
#pragma unroll
    for (int n = 0; n < N / 8; ++n) mx = fmaxf(mx, fmaxf(s[4 * n + 2 * r], s[4 * n + 2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(mla::FULL_MASK, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(mla::FULL_MASK, mx, 2));
    const float base = mx == mla::neg_inf() ? 0.f : mx;
    corr[r] = exp2f(m[r] - base);
    m[r] = mx;
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < N / 8; ++n) {
      s[4 * n + 2 * r] = exp2f(s[4 * n + 2 * r] - base);
      s[4 * n + 2 * r + 1] = exp2f(s[4 * n + 2 * r + 1] - base);
      sum += s[4 * n + 2 * r] + s[4 * n + 2 * r + 1];
    }
    l[r] = l[r] * corr[r] + sum;
  }
}
// acc (an m64nN fp32 accumulator fragment) with this thread's row r scaled by corr[r].
template <int N>
__device__ __forceinline__ void rescale_rows(float (&acc)[N / 2], const float (&corr)[2]) {
#pragma unroll
  for (int n = 0; n < N / 8; ++n)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      acc[4 * n + 2 * r] *= corr[r];
      acc[4 * n + 2 * r + 1] *= corr[r];
    }
}
// A wgmma m64nN fp32 accumulator tile as 16-bit A register fragments of N/16 k-steps (element
// type E): column blocks 2kk, 2kk+1 of the accumulator are the A fragment of k-step kk.
template <class E, int N>
__device__ __forceinline__ void acc_to_a(unsigned (&a)[N / 16][4], const float (&s)[N / 2]) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk)
#pragma unroll
    for (int e = 0; e < 4; ++e) a[kk][e] = mla::pack2<E>(s[8 * kk + 2 * e], s[8 * kk + 2 * e + 1]);
}
// A consumer's release of ring positions [j0, j1) that it does not compute (another consumer
// may not compute them either): each waited for on full[j % STAGES] (phase (j / STAGES) & 1),
// then released by this thread's arrival on empty[j % STAGES]; the wait keeps each arrival in
// its own phase, and the stage is never handed back to the producer with a load in flight.
template <int STAGES>
__device__ __forceinline__ void ring_release(unsigned long long* full, unsigned long long* empty,
                                             int j0, int j1 MLA90_LINE) {
  for (int j = j0; j < j1; ++j) {
    mbar_wait(&full[j % STAGES], (unsigned)(j / STAGES) & 1u MLA90_PASS_LINE);
    mbar_arrive(&empty[j % STAGES] MLA90_PASS_LINE);
  }
}
// The same for a ring whose stage is filled under two barriers (K and V landing apart):
// both waited for before the release.
template <int STAGES>
__device__ __forceinline__ void ring_release(unsigned long long* full_a, unsigned long long* full_b,
                                             unsigned long long* empty, int j0, int j1 MLA90_LINE) {
  for (int j = j0; j < j1; ++j) {
    mbar_wait(&full_a[j % STAGES], (unsigned)(j / STAGES) & 1u MLA90_PASS_LINE);
    mbar_wait(&full_b[j % STAGES], (unsigned)(j / STAGES) & 1u MLA90_PASS_LINE);
    mbar_arrive(&empty[j % STAGES] MLA90_PASS_LINE);
  }
}

// Packed sequences, the key tiling of every sm_90a kernel with query-row tiles: the keys
// [lo, hi) rows i0 .. i1 see (mla::varlen_rows_keys) in n tiles of BLOCK_N that end at hi,
// tile j from key k0 + j BLOCK_N (keys of the first tile below lo are masked, never a slack
// row: slack keys come after hi); n = 0 when no row has keys.
struct VarlenTiles {
  int lo, hi, n, k0;
};
template <bool CAUSAL, int BLOCK_N>
__device__ __forceinline__ VarlenTiles varlen_tail_tiles(const mla::Varlen& vl, const mla::QueryPos& qpos,
                                                         int i0, int i1, int seqlen_k) {
  VarlenTiles t;
  mla::varlen_rows_keys<CAUSAL>(vl, qpos, i0, i1, seqlen_k, t.lo, t.hi);
  t.n = (t.hi - t.lo + BLOCK_N - 1) / BLOCK_N;
  t.k0 = t.hi - t.n * BLOCK_N;
  return t;
}
// Packed sequences: the tiles [first, end) of a tiling from key k0 (tile j from key
// k0 + j BLOCK_N) that hold keys rows i0 .. i1 see (a warpgroup's share of its CTA's tiles);
// (0, 0) when none.
template <bool CAUSAL, int BLOCK_N>
__device__ __forceinline__ void varlen_tile_span(const mla::Varlen& vl, const mla::QueryPos& qpos, int i0, int i1,
                                                 int seqlen_k, int k0, int& first, int& end) {
  int lo, hi;
  mla::varlen_rows_keys<CAUSAL>(vl, qpos, i0, i1, seqlen_k, lo, hi);
  first = hi > lo ? (lo - k0) / BLOCK_N : 0;
  end = hi > lo ? (hi - k0 + BLOCK_N - 1) / BLOCK_N : 0;
}
// Packed sequences, a consumer's S tile (wgmma m64nBLOCK_N accumulator at key n0: element i
// is row r = (i % 4) / 2 of the thread's two, key n0 + 8 (i / 4) + 2 qd + i % 2) scaled to
// base 2 and set to -inf (a select: NaN scores of slack rows go too) wherever the key is
// outside its row's [lo[r], hi[r]); the element test only on tiles not inside both ranges.
template <int BLOCK_N>
__device__ __forceinline__ void varlen_scale_mask(float (&s)[BLOCK_N / 2], float scale_log2, int n0, int qd,
                                                  const int (&lo)[2], const int (&hi)[2]) {
  const bool edge = n0 < max(lo[0], lo[1]) || n0 + BLOCK_N > min(hi[0], hi[1]);
#pragma unroll
  for (int i = 0; i < BLOCK_N / 2; ++i) {
    float x = s[i] * scale_log2;
    if (edge) {
      const int key = n0 + 8 * (i / 4) + 2 * qd + (i % 2);
      const int r = (i % 4) / 2;
      if (key < lo[r] || key >= hi[r]) x = mla::neg_inf();
    }
    s[i] = x;
  }
}
// Packed sequences: the query rows [lo, hi) (row indices, at positions qpos(i), rows below
// seqlen_q) whose positions see one of keys j0 .. j1: the first key's Varlen::queries lo to
// the last non-slack key's hi (ranges only grow with the key; slack keys, at >= cu[n], are
// seen by none and come last); (0, 0) when none. Rows below hi are at positions below cu[n]:
// a tile range that ends at hi never reads a slack query row.
template <bool CAUSAL>
__device__ __forceinline__ void varlen_keys_rows(const mla::Varlen& vl, const mla::QueryPos& qpos,
                                                 int j0, int j1, int seqlen_q, int& lo, int& hi) {
  j1 = min(j1, vl.cu[vl.n] - 1);
  lo = hi = 0;
  if (j1 < j0) return;
  int p_lo, p_hi, unused;
  vl.queries<CAUSAL>(j0, p_lo, unused);
  vl.queries<CAUSAL>(j1, unused, p_hi);
  lo = qpos.first_row_at(p_lo);
  hi = min(qpos.first_row_at(p_hi), seqlen_q);
  if (hi <= lo) lo = hi = 0;
}
#undef MLA90_PASS_LINE

#endif  // MLA_SM90_LAYOUT_ONLY
#undef MLA90_LINE
#undef MLA90_LINE_ONLY
}  // namespace sm90
}  // namespace mla
