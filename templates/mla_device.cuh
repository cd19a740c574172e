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

// ---- the tensor-core kernels' building blocks ---------------------------------------
// Shared by attn_fwd, attn_bwd_dq, attn_bwd_dkdv, mqa_fwd, mqa_bwd_dq, mqa_bwd_dkv: every
// one is a forced inline of what the kernels wrote out before, so the code is the same.
// Fragment conventions are mma.m16n8k16's (see mma_m16n8k16_bf16_f32): a thread holds
// rows g = lane >> 2 and g + 8 of an m16n8 accumulator tile, columns 2t, 2t + 1
// (t = lane & 3); element e of a tile's float[4] is row g + 8 (e >> 1), column 2t + (e & 1).

// +inf without <math.h>: a base-2 LSE that makes every P = exp2(s - lse) of its row 0.
__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000); }

// Two floats as the packed pair of a 32-bit mma operand register of element type T (lo
// in the low half), rounded to nearest.
template <class T> __device__ __forceinline__ unsigned pack2(float lo, float hi);
template <> __device__ __forceinline__ unsigned pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<unsigned*>(&v);
}
template <> __device__ __forceinline__ unsigned pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<unsigned*>(&v);
}

// The A fragment of one m16n8k16 step from the C fragments of two adjacent m16n8 tiles
// (columns 0-7 and 8-15 of the step's k): the C layout of the pair is the A layout.
template <class T>
__device__ __forceinline__ void c_to_a(unsigned a[4], const float c0[4], const float c1[4]) {
  a[0] = pack2<T>(c0[0], c0[1]);  // row g,     k 2t, 2t+1
  a[1] = pack2<T>(c0[2], c0[3]);  // row g + 8
  a[2] = pack2<T>(c1[0], c1[1]);  // row g,     k 2t+8, 2t+9
  a[3] = pack2<T>(c1[2], c1[3]);  // row g + 8
}

// mma.m16n8k16 with fp32 accumulators for element type T (bf16 or fp16): D = A B + C.
template <class T>
__device__ __forceinline__ void mma(float d[4], const unsigned a[4], const unsigned b[2], const float c[4]);
template <>
__device__ __forceinline__ void mma<__nv_bfloat16>(float d[4], const unsigned a[4], const unsigned b[2],
                                                   const float c[4]) {
  mma_m16n8k16_bf16_f32(d, a, b, c);
}
template <>
__device__ __forceinline__ void mma<__half>(float d[4], const unsigned a[4], const unsigned b[2],
                                            const float c[4]) {
  mma_m16n8k16_f16_f32(d, a, b, c);
}

// One warp's C = A B^T, C [16][N] (N / 8 m16n8 tiles, a multiple of 8), from two shared
// tiles read by ldmatrix: A [16][K] row-major at a, B [N][K] row-major (B^T column-major, as
// mma's .col wants) at b, row stride BS; a and b already at this lane's ldm_a / ldm_b
// offsets. The k loop (K / 16 steps) is unrolled KUNROLL times; an N with an odd number of
// n8 tiles takes its last one by ldmatrix.x2.
template <class T, int K, int N, int BS, int KUNROLL>
__device__ __forceinline__ void warp_gemm_abt(float (&c)[N / 8][4], const T* a, const T* b) {
#pragma unroll
  for (int n = 0; n < N / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) c[n][e] = 0.f;
#pragma unroll KUNROLL
  for (int kk = 0; kk < K / 16; ++kk) {
    unsigned af[4];
    ldmatrix_x4(af, a + kk * 16);
#pragma unroll
    for (int np = 0; np < N / 16; ++np) {
      unsigned bf[4];
      ldmatrix_x4(bf, b + np * 16 * BS + kk * 16);
      mma<T>(c[2 * np], af, bf, c[2 * np]);
      mma<T>(c[2 * np + 1], af, bf + 2, c[2 * np + 1]);
    }
    if (N % 16 != 0) {
      unsigned bf[2];
      ldmatrix_x2(bf, b + (N / 16) * 16 * BS + kk * 16);
      mma<T>(c[N / 8 - 1], af, bf, c[N / 8 - 1]);
    }
  }
}

// One warp's C += A B, C [16][N]: A [16][K] in registers (K / 16 A fragments, e.g. P from
// c_to_a), B [K][N] row-major in shared at b (this lane's ldm_a offset, row stride BS),
// read by ldmatrix.x4.trans; the n loop outside, the k loop inside.
template <class T, int K, int N, int BS>
__device__ __forceinline__ void warp_gemm_rs(float (&c)[N / 8][4], const unsigned (&a)[K / 16][4], const T* b) {
#pragma unroll
  for (int dp = 0; dp < N / 16; ++dp)
#pragma unroll
    for (int kk = 0; kk < K / 16; ++kk) {
      unsigned bf[4];
      ldmatrix_x4_trans(bf, b + kk * 16 * BS + dp * 16);
      mma<T>(c[2 * dp], a[kk], bf, c[2 * dp]);
      mma<T>(c[2 * dp + 1], a[kk], bf + 2, c[2 * dp + 1]);
    }
}

// Reductions over the 4 lanes of a quad (the threads that share a fragment row).
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, 1));
  return fmaxf(v, __shfl_xor_sync(FULL_MASK, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(FULL_MASK, v, 1);
  return v + __shfl_xor_sync(FULL_MASK, v, 2);
}

// ldmatrix.x4 lane row/column offsets within a 16x16 block: `a` for an A operand from a
// [row][k] tile (matrices rows 0-7 / 8-15 at k + 0, then the same at k + 8), and for a
// B operand by .trans from a [k][n] tile; `b` for a B operand from an [n][k] tile (n 0-7
// at k + 0 / + 8, then n 8-15: the B fragments of two adjacent n8 tiles).
__device__ __forceinline__ int ldm_a_row(int lane) { return (lane & 7) + ((lane >> 3) & 1) * 8; }
__device__ __forceinline__ int ldm_a_col(int lane) { return (lane >> 4) * 8; }
__device__ __forceinline__ int ldm_b_row(int lane) { return (lane & 7) + (lane >> 4) * 8; }
__device__ __forceinline__ int ldm_b_col(int lane) { return ((lane >> 3) & 1) * 8; }

// The global positions of an attention call's query rows (the kernels' q_pos0, q_split,
// q_pos1 arguments; generator/core/mg_plan.h, mg_step): row i is at pos0 + i for i < split,
// else at pos1 + (i - split); keys sit at 0 .. seqlen_k - 1. Two chunks are how the
// all-gather context-parallel form (laga-cp) hands a rank its chunks r and 2P - 1 - r; all
// zero is pos(i) = i, and one offset chunk is split = 0, pos1 = its position (or split >=
// seqlen_q). Callers guarantee pos1 >= pos0 + split, so the map is strictly increasing and
// the rows that see key j (causal) are a suffix: first_row_at inverts the map.
struct QueryPos {
  int pos0, split, pos1;
  __device__ __forceinline__ int operator()(int i) const { return i < split ? pos0 + i : pos1 + (i - split); }
  // The first row whose position is >= p (monotone map: every later row's is too).
  __device__ __forceinline__ int first_row_at(int p) const {
    return p - pos0 < split ? max(p - pos0, 0) : split + max(p - pos1, 0);
  }
};

// Packed sequences (generator/core/mg_varlen.h has the rules and the host side): the
// kernel arguments cu_seqlens [n_seqs + 1] (device int32; nullptr: not packed, every batch
// item is one sequence of seqlen_k keys) and n_seqs. Positions are global token indices
// (mla::QueryPos); a query at t of document d sees keys [cu[d], causal ? t + 1 : cu[d + 1]);
// a slack query (t >= cu[n_seqs]) sees none, as a slack key is seen by none. Packed calls
// have batch 1. Rows outside a tile's ranges must be loaded as zeros (or never read), so
// that NaN in slack or foreign rows cannot reach a valid output through 0 * NaN.
struct Varlen {
  const int* cu;
  int n;
  __device__ __forceinline__ bool on() const { return cu != nullptr; }
  // The document of token t, or -1 (slack, or t < 0). Binary search over cu.
  __device__ __forceinline__ int doc(int t) const {
    if (t < 0 || t >= cu[n]) return -1;
    int lo = 0, hi = n;  // the last d with cu[d] <= t is in [lo, hi)
    while (hi - lo > 1) {
      const int mid = (lo + hi) >> 1;
      if (cu[mid] <= t) lo = mid; else hi = mid;
    }
    return lo;
  }
  // The keys [lo, hi) query position t sees; not packed: [0, causal ? min(t + 1, seqlen_k)
  // : seqlen_k) (empty for t < 0 when causal).
  template <bool CAUSAL>
  __device__ __forceinline__ void keys(int t, int seqlen_k, int& lo, int& hi) const {
    if (!on()) {
      lo = 0, hi = CAUSAL ? max(0, min(t + 1, seqlen_k)) : seqlen_k;
      return;
    }
    const int d = doc(t);
    if (d < 0) { lo = hi = 0; return; }
    lo = cu[d], hi = CAUSAL ? t + 1 : cu[d + 1];
  }
  // Packed calls only: the query positions [lo, hi) that see key j (j's document, from j
  // on when causal; empty for a slack key).
  template <bool CAUSAL>
  __device__ __forceinline__ void queries(int j, int& lo, int& hi) const {
    const int d = doc(j);
    if (d < 0) { lo = hi = 0; return; }
    lo = CAUSAL ? j : cu[d], hi = cu[d + 1];
  }
};

// Packed sequences (Varlen): the keys [lo, hi) that query rows i0 .. i1 (row indices, at
// positions qpos(i)) see together: the first row's lo to the last row's hi among the rows
// with keys (those at positions < cu[n]: slack rows, at positions >= cu[n], have none and
// come last; ranges only grow with the position); (0, 0) when no row has keys; hi clipped
// to seqlen_k. hi <= cu[n]: a tile range that ends at hi never reads a slack row. Every
// packed kernel's key tiles are built on it (one owner for a query tile's key hull).
template <bool CAUSAL>
__device__ __forceinline__ void varlen_rows_keys(const Varlen& vl, const QueryPos& qpos,
                                                 int i0, int i1, int seqlen_k, int& lo, int& hi) {
  i1 = min(i1, qpos.first_row_at(vl.cu[vl.n]) - 1);
  lo = hi = 0;
  if (i1 < i0) return;
  int l1, h0;
  vl.keys<CAUSAL>(qpos(i0), seqlen_k, lo, h0);
  vl.keys<CAUSAL>(qpos(i1), seqlen_k, l1, hi);
  hi = min(hi, seqlen_k);
  if (hi <= lo) lo = hi = 0;
}
// Packed sequences, the portable kernels' tiling: the key tiles [j0, j0 + n_tiles) (tile j
// from key j BLOCK_N) holding the keys rows i0 .. i1 see (varlen_rows_keys); keys from
// k_end on are none of theirs and load as zeros. No tiles when no row has keys.
template <bool CAUSAL, int BLOCK_N>
__device__ __forceinline__ void varlen_key_tiles(const Varlen& vl, const QueryPos& qpos, int i0, int i1,
                                                 int seqlen_k, int& j0, int& n_tiles, int& k_end) {
  int lo;
  varlen_rows_keys<CAUSAL>(vl, qpos, i0, i1, seqlen_k, lo, k_end);
  j0 = lo / BLOCK_N;
  n_tiles = (k_end + BLOCK_N - 1) / BLOCK_N - j0;  // 0 for (0, 0)
}

// Key tiles of BLOCK_N keys that queries up to position q_last (0 = the first query of the
// call, at global position q_pos0) can see: with causal masking, none past its position.
// Kernels with two-chunk positions pass q_pos0 = 0 and the last row's global position.
template <bool CAUSAL, int BLOCK_N>
__device__ __forceinline__ int visible_key_tiles(int seqlen_k, int q_pos0, int q_last) {
  const int n_end = CAUSAL ? min(seqlen_k, q_pos0 + q_last + 1) : seqlen_k;
  return n_end > 0 ? (n_end + BLOCK_N - 1) / BLOCK_N : 0;
}

// A row's natural-log LSE in base 2 for P = exp2(s log2(e) scale - lse2): +inf for a row
// without keys (LSE -inf), so its P is 0.
__device__ __forceinline__ float lse_log2(float lse) { return lse == neg_inf() ? pos_inf() : lse * LOG2E; }

// Masking: key `key` is hidden from the query at position `pos` (0 = the first of the
// call, q_pos0 its global position) when it is past the keys or, causal, after the query.
// Kernels with two-chunk positions pass the row's global position and q_pos0 = 0.
template <bool CAUSAL>
__device__ __forceinline__ bool key_hidden(int key, int pos, int seqlen_k, int q_pos0) {
  return key >= seqlen_k || (CAUSAL && key > q_pos0 + pos);
}

// Packed sequences, per warp of mma fragments: the ranges [lo[r], hi[r]) of a thread's two
// fragment rows g and g + 8 (the keys a query row sees, or the query positions that see a
// key; an empty range is lo = hi = 0), and, after warp_reduce() (every lane of the warp),
// over the warp's 16 rows: their union's hull [any_lo, any_hi) (empty rows left out) and
// their intersection [all_lo, all_hi) (empty when a row is). Ranges are monotone in the
// row (Varlen's are), so the hull is the union.
struct RowRanges {
  int lo[2], hi[2];
  int any_lo, any_hi, all_lo, all_hi;
  __device__ __forceinline__ void warp_reduce() {
    const int big = 0x7fffffff;
    any_lo = min(hi[0] > lo[0] ? lo[0] : big, hi[1] > lo[1] ? lo[1] : big);
    any_hi = max(hi[0], hi[1]);
    all_lo = max(lo[0], lo[1]);
    all_hi = min(hi[0], hi[1]);
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) {  // over g: lanes with the same column pair
      any_lo = min(any_lo, __shfl_xor_sync(FULL_MASK, any_lo, off));
      any_hi = max(any_hi, __shfl_xor_sync(FULL_MASK, any_hi, off));
      all_lo = max(all_lo, __shfl_xor_sync(FULL_MASK, all_lo, off));
      all_hi = min(all_hi, __shfl_xor_sync(FULL_MASK, all_hi, off));
    }
  }
  // Packed calls: row r's range is the keys query position pos sees (Varlen::keys; empty
  // unless valid), hi clipped to seqlen_k.
  template <bool CAUSAL>
  __device__ __forceinline__ void set_keys(int r, const Varlen& vl, bool valid, int pos, int seqlen_k) {
    lo[r] = hi[r] = 0;
    if (valid) vl.keys<CAUSAL>(pos, seqlen_k, lo[r], hi[r]);
    hi[r] = min(hi[r], seqlen_k);
  }
  // [a, b) meets some row's range; lies in every row's range; x outside row r's range.
  __device__ __forceinline__ bool meets(int a, int b) const { return a < any_hi && b > any_lo; }
  __device__ __forceinline__ bool inside(int a, int b) const { return a >= all_lo && b <= all_hi; }
  __device__ __forceinline__ bool hides(int r, int x) const { return x < lo[r] || x >= hi[r]; }
};

// ---- tile copies, global -> shared by cp.async ----
// A tile of ROWS rows is copied by NTHREADS threads, TPR per row: thread (tr, tc) =
// (tid / TPR, tid % TPR) copies the 16-byte chunks tc, tc + TPR, ... of rows tr,
// tr + NTHREADS / TPR, ... A thread's chunk columns are then compile-time offsets from
// one row pointer (few live registers between tiles).
constexpr int CHUNK = 8;  // 16-bit elements per 16-byte copy

// Threads per row for a row of `chunks` 16-byte chunks: the largest of 8, 4, 2 dividing it.
__host__ __device__ constexpr int copy_tpr(int chunks) {
  return chunks % 8 == 0 ? 8 : chunks % 4 == 0 ? 4 : 2;
}

// Calls row(r) for each row r of [0, ROWS) that thread row tr copies.
template <int ROWS, int TPR, int NTHREADS, class F>
__device__ __forceinline__ void for_copy_rows(int tr, F&& row) {
  constexpr int RPP = NTHREADS / TPR;  // rows per pass
#pragma unroll
  for (int rp = 0; rp < (ROWS + RPP - 1) / RPP; ++rp) {
    const int r = rp * RPP + tr;
    if (ROWS % RPP == 0 || r < ROWS) row(r);
  }
}

// This thread's chunks of one row of COLS elements: dst and src point at its chunk tc;
// with ok false the chunks are zero-filled (src must still be a valid address to form).
template <int COLS, int TPR, class T>
__device__ __forceinline__ void cp_async_row(T* dst, const T* src, bool ok) {
#pragma unroll
  for (int ci = 0; ci < COLS / CHUNK / TPR; ++ci)
    cp_async_16_zfill(dst + ci * TPR * CHUNK, src + ci * TPR * CHUNK, ok);
}

// Rows [row0, row0 + ROWS) of a tensor with `rows` rows of COLS elements into a shared
// tile of row stride STRIDE; rows past `rows` are zero. src_row(i) is row i's first
// element (called with 0 for a row past the end).
template <int ROWS, int COLS, int STRIDE, int TPR, int NTHREADS, class T, class F>
__device__ __forceinline__ void cp_async_tile(T* dst, int tr, int tc, int row0, int rows,
                                              F&& src_row) {
  for_copy_rows<ROWS, TPR, NTHREADS>(tr, [&](int r) {
    const bool ok = row0 + r < rows;
    cp_async_row<COLS, TPR>(dst + r * STRIDE + tc * CHUNK, src_row(ok ? row0 + r : 0) + tc * CHUNK,
                            ok);
  });
}

// The same with the tile's chunks dealt out in turn (for rows of more chunks than TPR
// threads copy well): thread tid copies chunks tid, tid + NTHREADS, ... of the ROWS x
// COLS / 8 chunks, in a loop unrolled UNROLL times (a count past the trip count unrolls it
// fully).
template <int ROWS, int COLS, int STRIDE, int NTHREADS, int UNROLL, class T, class F>
__device__ __forceinline__ void cp_async_tile_dealt(T* dst, int tid, int row0, int rows, F&& src_row) {
  constexpr int CH = COLS / CHUNK;
#pragma unroll UNROLL
  for (int it = 0; it < (ROWS * CH + NTHREADS - 1) / NTHREADS; ++it) {
    const int idx = it * NTHREADS + tid;
    if ((ROWS * CH) % NTHREADS == 0 || idx < ROWS * CH) {
      const int r = idx / CH, ch = idx % CH;
      const bool ok = row0 + r < rows;
      cp_async_16_zfill(dst + r * STRIDE + ch * CHUNK, src_row(ok ? row0 + r : 0) + ch * CHUNK, ok);
    }
  }
}

// A tile of the explicit form's keys K = [K_nope ; k_rope] of head h: rows [n0, n0 + ROWS)
// of batch item b, row stride STRIDE, zero past seqlen_k. Split (PACKED false): k_nope
// [B, S_k, H, DN] per head and k_rope shared by the heads, token row t = b * S_k + j at
// k_rope + t * ld_kr (ld_kr >= DR elements, its first DR used: DR for a contiguous
// [B, S_k, DR], d_c + DR for the RoPE columns of the latent c). Packed: one per-head
// K [B, S_k, H, DN + DR] in k_nope, the RoPE part at +DN of the same row (k_rope and ld_kr
// unused). TPR must divide DN / 8 and DR / 8, so each chunk's part is known at compile time.
template <int ROWS, int DN, int DR, int H, bool PACKED, int STRIDE, int TPR, int NTHREADS, class T>
__device__ __forceinline__ void cp_async_k_tile(T* dst, int tr, int tc, int n0, int seqlen_k, int b,
                                                int h, const T* k_nope, const T* k_rope, int ld_kr = 0) {
  constexpr int DQK = DN + DR;
  constexpr int KN_TOK = PACKED ? H * DQK : H * DN, KN_HEAD = PACKED ? DQK : DN;
  constexpr int KR_HEAD = PACKED ? DQK : 0;
  const size_t KR_TOK = PACKED ? (size_t)H * DQK : (size_t)ld_kr;  // a constant when packed
  static_assert((DN / CHUNK) % TPR == 0 && (DR / CHUNK) % TPR == 0, "a chunk column on one side of DN");
  for_copy_rows<ROWS, TPR, NTHREADS>(tr, [&](int j) {
    const bool ok = n0 + j < seqlen_k;
    const size_t tok = (size_t)b * seqlen_k + (ok ? n0 + j : 0);
    const T* src_n = k_nope + tok * KN_TOK + h * KN_HEAD + tc * CHUNK;
    const T* src_r = (PACKED ? k_nope + DN : k_rope) + tok * KR_TOK + h * KR_HEAD + tc * CHUNK;
    T* d = dst + j * STRIDE + tc * CHUNK;
#pragma unroll
    for (int ci = 0; ci < DQK / CHUNK / TPR; ++ci) {
      const int c = ci * TPR * CHUNK;  // + tc * CHUNK: on the same side of DN
      cp_async_16_zfill(d + c, c < DN ? src_n + c : src_r + (c - DN), ok);
    }
  });
}

// ---- online softmax (FlashAttention-2), in base 2, on accumulator fragments ----
// A thread's two rows (g, g + 8) of a warp's 16: m the running max of the scaled scores,
// l this thread's part of the running sum of exp2(score - m) (its quad holds the rest).
template <int NT_S>  // m16n8 tiles of S per thread
struct OnlineSoftmax {
  float m[2] = {neg_inf(), neg_inf()};
  float l[2] = {0.f, 0.f};

  // The max of row r over the tile's scores s and init.
  __device__ __forceinline__ static float row_max(const float (&s)[NT_S][4], int r, float init) {
#pragma unroll
    for (int n = 0; n < NT_S; ++n) init = fmaxf(init, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
    return init;
  }

  // Row r with the tile's scores s (base 2) and mx, the row's max over m[r] and every
  // score of it in the tile (over all its threads): s becomes P = exp2(s - mx), l and
  // row r of the O accumulators o are rescaled by exp2(m_old - mx) and P's sum is added.
  template <int NT_O>
  __device__ __forceinline__ void update(float (&s)[NT_S][4], float (&o)[NT_O][4], int r, float mx) {
    // A row with no visible key so far keeps max -inf: subtract 0 so exp2 gives 0, not NaN.
    const float base = mx == neg_inf() ? 0.f : mx;
    const float corr = exp2f(m[r] - base);
    m[r] = mx;
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < NT_S; ++n) {
      s[n][2 * r] = exp2f(s[n][2 * r] - base);
      s[n][2 * r + 1] = exp2f(s[n][2 * r + 1] - base);
      sum += s[n][2 * r] + s[n][2 * r + 1];
    }
    l[r] = l[r] * corr + sum;
#pragma unroll
    for (int d = 0; d < NT_O; ++d) {
      o[d][2 * r] *= corr;
      o[d][2 * r + 1] *= corr;
    }
  }

  // The row's natural-log LSE, ln(sum exp(scaled score)) = (m + log2 l) ln 2, given its
  // total sum l_row (-inf for a row without keys); and 1 / l_row, 0 for such a row.
  __device__ __forceinline__ float lse(int r, float l_row) const {
    return l_row > 0.f ? (m[r] + log2f(l_row)) * LN2 : neg_inf();
  }
  __device__ __forceinline__ static float inv(float l_row) { return l_row > 0.f ? 1.f / l_row : 0.f; }
};

}  // namespace mla
