// mla_device.cuh: device helpers shared by every generated kernel.
//
// This is the one device header of the templates: type conversions, warp reductions,
// and (from the tensor-core kernels on) every inline PTX instruction, each with a host
// counterpart for the host executor chosen at compile time. Generated .cu files
// #include it; NVRTC receives it as a named header, and `mlagen generate` writes a copy
// next to the .cu files so they also build with nvcc.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace mla {

constexpr unsigned FULL_MASK = 0xffffffffu;
constexpr float LOG2E = 1.4426950408889634f;  // log2(e): scores go to base 2 for exp2f
constexpr float LN2 = 0.6931471805599453f;    // ln(2): LSE back to natural log

// -inf without <math.h> (NVRTC has none): the masked score, the max of an empty row.
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float2 to_float2(__nv_bfloat162 x) { return __bfloat1622float2(x); }
__device__ __forceinline__ float2 to_float2(__half2 x) { return __half22float2(x); }

template <class T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}

// Butterfly reductions over the 32 lanes of a warp; every lane gets the result.
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, off));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(FULL_MASK, v, off);
  return v;
}

// ---- tensor-core and async-copy PTX (sm_80+) ---------------------------------------
// Each wrapper is inline asm for NVRTC/nvcc, and under the host executor
// (tests/host/cuda_host.h defines MG_HOST_EMULATION) a call into its warp-level
// emulation with the same semantics and PTX ISA fragment layouts; the generated .cu
// text is the same for both. The host versions take the caller's line (a defaulted
// argument the kernels never pass) for error reports.
#ifdef MG_HOST_EMULATION
#define MLA_HOST_LINE , int mg_line = __builtin_LINE()
#else
#define MLA_HOST_LINE
namespace detail {
// The 32-bit .shared address of a generic pointer into shared memory.
__device__ __forceinline__ unsigned cvta_to_shared(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
}  // namespace detail
#endif

// D = A B + C, mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (one warp, all lanes).
// Fragments (g = lane >> 2, t = lane % 4; element pairs low half first):
//   a[0] A[g][2t..2t+1]    a[1] A[g+8][2t..2t+1]    a[2] A[g][2t+8..]    a[3] A[g+8][2t+8..]
//   b[0] B[2t..2t+1][g]    b[1] B[2t+8..2t+9][g]
//   c/d  [0] C[g][2t]  [1] C[g][2t+1]  [2] C[g+8][2t]  [3] C[g+8][2t+1]
// d may be c.
__device__ __forceinline__ void mma_m16n8k16_bf16_f32(float d[4], const unsigned a[4],
                                                      const unsigned b[2], const float c[4]
                                                      MLA_HOST_LINE) {
#ifdef MG_HOST_EMULATION
  mg_host_mma_m16n8k16(0, d, a, b, c, mg_line);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
#endif
}

// The same with fp16 A and B.
__device__ __forceinline__ void mma_m16n8k16_f16_f32(float d[4], const unsigned a[4],
                                                     const unsigned b[2], const float c[4]
                                                     MLA_HOST_LINE) {
#ifdef MG_HOST_EMULATION
  mg_host_mma_m16n8k16(1, d, a, b, c, mg_line);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
#endif
}

// ldmatrix.sync.aligned.m8n8.{x1,x2,x4}[.trans].shared.b16 (one warp, all lanes).
// smem_row: this lane's row of 8 16-bit elements, 16-byte aligned, in shared memory;
// lanes 8m..8m+7 give the rows 0..7 of matrix m (x1: lanes 0-7 only, x2: 0-15). Lane i
// receives in r[m] row i/4, elements 2(i%4) and 2(i%4)+1 of matrix m; with .trans, of
// its transpose (element (2(i%4), i/4) low, (2(i%4)+1, i/4) high).
#ifdef MG_HOST_EMULATION
#define MLA_LDMATRIX(name, num, trans, ptx, outs, ...)                                      \
  __device__ __forceinline__ void name(unsigned r[num], const void* smem_row MLA_HOST_LINE) { \
    mg_host_ldmatrix(num, trans, r, smem_row, mg_line);                                     \
  }
#else
#define MLA_LDMATRIX(name, num, trans, ptx, outs, ...)                                      \
  __device__ __forceinline__ void name(unsigned r[num], const void* smem_row) {             \
    asm volatile(ptx " " outs ", [%" #num "];\n"                                            \
                 : __VA_ARGS__                                                              \
                 : "r"(detail::cvta_to_shared(smem_row)));                                  \
  }
#endif
MLA_LDMATRIX(ldmatrix_x1, 1, 0, "ldmatrix.sync.aligned.m8n8.x1.shared.b16", "{%0}", "=r"(r[0]))
MLA_LDMATRIX(ldmatrix_x2, 2, 0, "ldmatrix.sync.aligned.m8n8.x2.shared.b16", "{%0, %1}",
             "=r"(r[0]), "=r"(r[1]))
MLA_LDMATRIX(ldmatrix_x4, 4, 0, "ldmatrix.sync.aligned.m8n8.x4.shared.b16", "{%0, %1, %2, %3}",
             "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]))
MLA_LDMATRIX(ldmatrix_x1_trans, 1, 1, "ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16", "{%0}",
             "=r"(r[0]))
MLA_LDMATRIX(ldmatrix_x2_trans, 2, 1, "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16",
             "{%0, %1}", "=r"(r[0]), "=r"(r[1]))
MLA_LDMATRIX(ldmatrix_x4_trans, 4, 1, "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
             "{%0, %1, %2, %3}", "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]))
#undef MLA_LDMATRIX

// cp.async.cg.shared.global [smem], [gmem], 16: an asynchronous 16-byte copy (both
// addresses 16-byte aligned). The data is in smem only after this thread's
// cp_async_wait for the group it was committed in (then a barrier for other threads).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem MLA_HOST_LINE) {
#ifdef MG_HOST_EMULATION
  mg_host_cp_async(smem, gmem, 16, 16, mg_line);
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(detail::cvta_to_shared(smem)),
               "l"(gmem)
               : "memory");
#endif
}

// The same, but with valid == false nothing is read (src-size 0) and the 16 bytes are
// zero: for rows past the end of a tensor (gmem must still be a valid address to form).
__device__ __forceinline__ void cp_async_16_zfill(void* smem, const void* gmem,
                                                  bool valid MLA_HOST_LINE) {
#ifdef MG_HOST_EMULATION
  mg_host_cp_async(smem, gmem, 16, valid ? 16u : 0u, mg_line);
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                   detail::cvta_to_shared(smem)),
               "l"(gmem), "r"(valid ? 16u : 0u)
               : "memory");
#endif
}

// cp.async.commit_group: the copies issued since the last commit form a group.
__device__ __forceinline__ void cp_async_commit(
#ifdef MG_HOST_EMULATION
    int mg_line = __builtin_LINE()
#endif
) {
#ifdef MG_HOST_EMULATION
  mg_host_cp_async_commit(mg_line);
#else
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// cp.async.wait_group N: waits until at most the N newest committed groups of this
// thread are pending; every older group's data is then in shared memory.
template <int N>
__device__ __forceinline__ void cp_async_wait(
#ifdef MG_HOST_EMULATION
    int mg_line = __builtin_LINE()
#endif
) {
  static_assert(N >= 0 && N < 8, "cp.async.wait_group takes 0..7");
#ifdef MG_HOST_EMULATION
  mg_host_cp_async_wait(N, mg_line);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}
#undef MLA_HOST_LINE

}  // namespace mla
