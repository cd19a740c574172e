// hopper_selftest.cu: S = (qscale Q) K^T for one 64-row tile of Q and one N-row tile of K
// (head dim D = 64, bf16) with the Hopper primitives of mla_device_sm90.cuh: thread 0
// TMA-loads the Q and K boxes onto one mbarrier, every thread waits on it, scales Q in
// shared memory with ordinary stores (so a fence.proxy.async is needed before wgmma reads
// it), then one warpgroup runs 4 k-steps of wgmma m64nNk16 and stores its accumulators.
// The same text runs on the host executor (tests/test_hopper_host.c, which also removes
// the waits and the fence to see the check fail) and compiles with NVRTC for sm_90a
// (tests/test_hopper_sass.c).
//
// Grid (ceil(sq / 64), ceil(skv / N)), 128 threads, dynamic shared memory
// HOPPER_QK_SMEM(N) bytes. S is [sq, skv] fp32; rows/columns past sq/skv are not written
// (the TMA boxes there are zero-filled). swz: 0 none, 1 128B, 2 64B, 3 32B. a_regs: A from
// registers (wgmma ...rs, the fragments read from the swizzled tile with tile_offset).
#include "mla_device.cuh"
#include "mla_device_sm90.cuh"

#define HOPPER_QK_D 64
#define HOPPER_QK_SMEM(N) (2048 + (64 + (N)) * HOPPER_QK_D * 2)

using namespace mla::sm90;
extern __shared__ __align__(128) unsigned char smem[];

namespace {
// Byte offset in a tile of `rows` rows of element (row, k) as the TMA boxes lay it out:
// box b = k / cols holds columns [b cols, (b+1) cols), rows x span bytes.
__device__ __forceinline__ unsigned kmajor_off(int swz, unsigned rows, unsigned row, unsigned k) {
  unsigned cols = swizzle_span(swz) / 2;
  return (k / cols) * rows * swizzle_span(swz) + tile_offset(swz, row, k % cols);
}

// The descriptor of k-step ks (16 columns) of a tile of `rows` rows at shared address base.
__device__ __forceinline__ unsigned long long kstep_desc(int swz, unsigned base, unsigned rows,
                                                         unsigned ks) {
  unsigned span = swizzle_span(swz);
  if (swz == SWIZZLE_NONE)  // two 8-column boxes per k-step: LBO between them
    return make_desc(base + 2 * ks * rows * 16, rows * 16, 8 * 16, swz);
  return make_desc(base + kmajor_off(swz, rows, 0, ks * 16), 16, 8 * span, swz);
}

// SPLIT: k-steps 0-1 and 2-3 go to two accumulators in two commit groups; after
// wgmma_wait<1> the first group's (written to S_part) must be complete, after wgmma_wait<0>
// both (S = their sum).
template <int N, bool SPLIT = false>
__device__ void qk(const TensorMap* tq, const TensorMap* tk, float* S, int sq, int skv, int swz,
                   float qscale, int a_regs, float* S_part = nullptr) {
  constexpr int D = HOPPER_QK_D;
  // 1024-aligned tiles (the swizzle repeats every 1024 bytes of address)
  unsigned addr0 = smem_u32(smem);
  unsigned pad = ((addr0 + 1023u) & ~1023u) - addr0;
  unsigned long long* bar = reinterpret_cast<unsigned long long*>(smem + pad);
  unsigned char* sQ = smem + pad + 1024;
  unsigned char* sK = sQ + 64 * D * 2;
  const unsigned span = swizzle_span(swz), cols = span / 2;
  const int m0 = blockIdx.x * 64, n0 = blockIdx.y * N;
  const unsigned t = threadIdx.x;

  if (t == 0) {
    mbar_init(bar, 1);
    mbar_init_fence();
  }
  __syncthreads();  // MUTATION: init barrier
  if (t == 0) {
    mbar_arrive_expect_tx(bar, (64 + N) * D * 2);
    for (unsigned b = 0; b < D / cols; ++b) {
      tma_load_2d(sQ + b * 64 * span, tq, bar, b * cols, m0);
      tma_load_2d(sK + b * N * span, tk, bar, b * cols, n0);
    }
  }
  mbar_wait(bar, 0);  // MUTATION: mbarrier wait

  // Q *= qscale in place, with generic stores (elementwise: the layout does not matter).
  __nv_bfloat16* q = reinterpret_cast<__nv_bfloat16*>(sQ);
  for (unsigned i = t; i < 64 * D; i += 128) q[i] = __float2bfloat16_rn(__bfloat162float(q[i]) * qscale);
  fence_proxy_async();  // MUTATION: proxy fence
  __syncthreads();

  unsigned a[D / 16][4];
  if (a_regs) {  // the A fragments of every k-step, before the wgmma.fence
    const unsigned w = t / 32, g = (t % 32) / 4, c = t % 4;
    for (unsigned ks = 0; ks < D / 16; ++ks)
      for (unsigned r = 0; r < 4; ++r) {
        unsigned row = 16 * w + g + 8 * (r & 1), k = ks * 16 + 2 * c + 8 * (r >> 1);
        a[ks][r] = *reinterpret_cast<const unsigned*>(sQ + kmajor_off(swz, 64, row, k));
      }
  }
  float d[N / 2];
  for (int i = 0; i < N / 2; ++i) d[i] = 0.0f;
  const unsigned qa = smem_u32(sQ), ka = smem_u32(sK);
  fence_operand(d);
  wgmma_fence();
  if constexpr (SPLIT) {
    float d2[N / 2];
    for (int i = 0; i < N / 2; ++i) d2[i] = 0.0f;
    fence_operand(d2);
    wgmma_fence();
    for (unsigned ks = 0; ks < D / 16; ++ks) {
      wgmma_ss<N, bf16_t>(ks < 2 ? d : d2, kstep_desc(swz, qa, 64, ks), kstep_desc(swz, ka, N, ks),
                          ks % 2);
      if (ks % 2) wgmma_commit();
    }
    wgmma_wait<1>();
    fence_operand(d);
    for (int i = 0; i < N / 2; ++i) {
      int row = m0 + (int)acc_row(t, i), col = n0 + (int)acc_col(t, i);
      if (row < sq && col < skv) S_part[(long)row * skv + col] = d[i];
    }
    wgmma_wait<0>();
    fence_operand(d2);
    for (int i = 0; i < N / 2; ++i) d[i] += d2[i];
  } else {
    for (unsigned ks = 0; ks < D / 16; ++ks) {
      unsigned long long db = kstep_desc(swz, ka, N, ks);
      if (a_regs)
        wgmma_rs<N, bf16_t>(d, a[ks], db, ks > 0);
      else
        wgmma_ss<N, bf16_t>(d, kstep_desc(swz, qa, 64, ks), db, ks > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();  // MUTATION: wgmma wait
  }
  fence_operand(d);
  for (int i = 0; i < N / 2; ++i) {
    int row = m0 + (int)acc_row(t, i), col = n0 + (int)acc_col(t, i);
    if (row < sq && col < skv) S[(long)row * skv + col] = d[i];
  }
}
}  // namespace

#define HOPPER_QK_KERNEL(N)                                                                     \
  extern "C" __global__ void __launch_bounds__(128)                                            \
      hopper_qk_n##N(const __grid_constant__ TensorMap tq, const __grid_constant__ TensorMap tk, \
                     float* S, int sq, int skv, int swz, float qscale, int a_regs) {           \
    qk<N>(&tq, &tk, S, sq, skv, swz, qscale, a_regs);                                          \
  }
HOPPER_QK_KERNEL(64)
HOPPER_QK_KERNEL(128)
HOPPER_QK_KERNEL(192)
HOPPER_QK_KERNEL(256)

// Two commit groups and wait_group 1 (see qk's SPLIT), N 64, A from shared memory.
extern "C" __global__ void __launch_bounds__(128)
    hopper_qk_split64(const __grid_constant__ TensorMap tq, const __grid_constant__ TensorMap tk,
                      float* S, int sq, int skv, int swz, float qscale, float* S_part) {
  qk<64, true>(&tq, &tk, S, sq, skv, swz, qscale, 0, S_part);
}

// Protocol errors the executor must report: an over-arrival (kind 0), a wait that never
// completes (1: wrong parity), setmaxnreg that differs within a warpgroup (2), a wgmma
// without wgmma.fence (3); kind 4 is correct. The accumulator between a wgmma and its wait
// (PTX ISA: accessing it is undefined): written (5, reported), read (6: the executor's
// registers hold a NaN there, which __trap reports), scaled in place (8: a read-modify-write,
// reported), and two k-steps chained into it before one wait, which is allowed (7, in one
// commit group; 9, in two, waited for with wait_group 1 then 0): correct, d = 1 + 16 + 16
// with every A and B element 1. The init's visibility (the barrier is used by thread 32):
// published by a named barrier all 128 threads bar.sync on (10, correct) or that thread 0
// bar.arrives on and warps 1..3 bar.sync on (12, correct); by nothing (11: reported; round
// robin, so that the init has run: as an init not visible to thread 32). A wgmma's shared
// operand (reported): stored and published by every thread without a barrier before the
// wgmma, so another warp's stores are not ordered before a thread's issue (13), and
// rewritten by thread 0 after every thread issued and before the wait (14).
extern "C" __global__ void hopper_misuse(int kind) {
  unsigned long long* bar = reinterpret_cast<unsigned long long*>(smem);
  if (threadIdx.x == 0) mbar_init(bar, 1);
  if (kind >= 10 && kind <= 12) {
    if (kind == 10) bar_sync(1, 128);
    if (kind == 12) {
      if (threadIdx.x < 32) bar_arrive(1, 128); else bar_sync(1, 128);
    }
    if (threadIdx.x == 32) mbar_arrive(bar);
    return;
  }
  __syncthreads();
  if (kind == 0) {
    if (threadIdx.x < 2) {
      mbar_arrive_expect_tx(bar, 16);  // the second one arrives while 16 bytes are pending
    }
  } else if (kind == 1) {
    if (threadIdx.x == 0) mbar_arrive(bar);
    mbar_wait(bar, 1);  // phase 0 completed; phase 1 never does
  } else if (kind == 2) {
    // one line, so that the threads meet at the same call site with different operations
    if (threadIdx.x < 64) setmaxnreg_inc<240>(); else setmaxnreg_dec<240>();
  } else if (kind == 3) {
    float d[32];
    for (int i = 0; i < 32; ++i) d[i] = 0.0f;
    wgmma_ss<64, bf16_t>(d, 0, 0, 0);  // no wgmma.fence before it
    wgmma_commit();
    wgmma_wait<0>();
  } else if (kind >= 5) {
    float d[32];
    for (int i = 0; i < 32; ++i) d[i] = 1.0f;
    for (int i = threadIdx.x; i < 128; i += blockDim.x)  // bf16 1.0 (0x3f80) everywhere
      reinterpret_cast<unsigned short*>(smem)[i] = 0x3f80;
    fence_proxy_async();  // the ones, for the async proxy's reads
    if (kind != 13) __syncthreads();
    // no swizzle, strides 0: every A and B element read from the first 128 bytes. From the
    // address, not the constant 0: NVRTC 13.0 crashed (SIGSEGV in nvrtcCompileProgram) on
    // constant descriptors whose accumulator was read after the wait.
    const unsigned long long desc = (smem_u32(smem) >> 4) & 0x3fff;
    wgmma_fence();
    wgmma_ss<64, bf16_t>(d, desc, desc, 1);
    if (kind == 9) wgmma_commit();
    if (kind == 7 || kind == 9) wgmma_ss<64, bf16_t>(d, desc, desc, 1);
    wgmma_commit();
    if (kind == 14) {  // every thread issued; then the operand rewritten (bf16 2.0) while
      bar_sync(1, 128);  // the wgmma may still read it, before the wait
      if (threadIdx.x == 0) {
        reinterpret_cast<unsigned short*>(smem)[0] = 0x4000;
        fence_proxy_async();
      }
    }
    float early = 0.0f;
    if (kind == 5) d[3] = 2.0f;
    if (kind == 6) early = d[5];
    if (kind == 8) d[3] *= 0.5f;
    if (kind == 9) wgmma_wait<1>();
    wgmma_wait<0>();
    if (early != early) __trap();
    if ((kind == 7 || kind == 9) && d[0] != 33.0f) __trap();
  } else {
    setmaxnreg_dec<40>();
    setmaxnreg_inc<232>();
  }
}

// One TMA box of `map` (rank 2, 3 or 4) at (c0, c1[, c2[, c3]]) (partly outside the tensor
// when the caller says so) into shared memory, then its raw bytes to out (box bytes): the
// swizzled layout and the zero fill as they land. 32 threads.
extern "C" __global__ void hopper_tma_copy(const __grid_constant__ TensorMap map, unsigned char* out,
                                           int rank, int c0, int c1, int c2, int c3,
                                           unsigned bytes) {
  unsigned addr0 = smem_u32(smem);
  unsigned pad = ((addr0 + 1023u) & ~1023u) - addr0;
  unsigned long long* bar = reinterpret_cast<unsigned long long*>(smem + pad);
  unsigned char* dst = smem + pad + 1024;
  if (threadIdx.x == 0) {
    mbar_init(bar, 1);
    mbar_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbar_arrive_expect_tx(bar, bytes);
    if (rank == 2)
      tma_load_2d(dst, &map, bar, c0, c1);
    else if (rank == 3)
      tma_load_3d(dst, &map, bar, c0, c1, c2);
    else
      tma_load_4d(dst, &map, bar, c0, c1, c2, c3);
  }
  mbar_wait(bar, 0);
  for (unsigned i = threadIdx.x; i < bytes; i += blockDim.x) out[i] = dst[i];
}

// ---- the backward's primitives ---------------------------------------------------------------
// C (64 x N, fp32) = A^T B with A stored [64 k][64 m] (M contiguous: an MN-major A, as P or
// dS [q][key] is read for P^T dO, dS^T Q) and B stored [64 k][N n] (TB = 1: MN-major, as dO or
// Q [q][d]) or [N n][64 k] (TB = 0: K-major): wgmma_ss_t, 4 k-steps; bf16 (hopper_tt_f16_n64:
// f16). One block of 128 threads,
// HOPPER_QK_SMEM(N) bytes; maps: A {64, 64}, B {N, 64} (TB 1) or {64, N} (TB 0), boxes of one
// swizzle span (8 elements without swizzle) by 64 rows.
namespace {
template <int N, int TB, class T = bf16_t>
__device__ void tt(const TensorMap* ta, const TensorMap* tb, float* C, int swz) {
  unsigned addr0 = smem_u32(smem);
  unsigned pad = ((addr0 + 1023u) & ~1023u) - addr0;
  unsigned long long* bar = reinterpret_cast<unsigned long long*>(smem + pad);
  unsigned char* sA = smem + pad + 1024;
  unsigned char* sB = sA + 64 * 64 * 2;
  const unsigned span = swizzle_span(swz), cols = span / 2, t = threadIdx.x;
  if (t == 0) {
    mbar_init(bar, 1);
    mbar_init_fence();
  }
  __syncthreads();
  if (t == 0) {
    mbar_arrive_expect_tx(bar, (64 + N) * 64 * 2);
    for (unsigned b = 0; b < 64 / cols; ++b) tma_load_2d(sA + b * 64 * span, ta, bar, b * cols, 0);
    for (unsigned b = 0; b < (TB ? N : 64) / cols; ++b)
      tma_load_2d(sB + b * (TB ? 64 : N) * span, tb, bar, b * cols, 0);
  }
  mbar_wait(bar, 0);
  float d[N / 2];
  for (int i = 0; i < N / 2; ++i) d[i] = 0.0f;
  const unsigned aa = smem_u32(sA), ba = smem_u32(sB);
  fence_operand(d);
  wgmma_fence();
  for (unsigned ks = 0; ks < 4; ++ks)
    wgmma_ss_t<N, T, 1, TB>(
        d, make_desc_mn_kstep(swz, aa, 64, ks),
        TB ? make_desc_mn_kstep(swz, ba, 64, ks) : kstep_desc(swz, ba, N, ks), ks > 0);
  wgmma_commit();
  wgmma_wait<0>();
  fence_operand(d);
  for (int i = 0; i < N / 2; ++i) C[acc_row(t, i) * N + acc_col(t, i)] = d[i];
}
}  // namespace

extern "C" __global__ void __launch_bounds__(128)
    hopper_tt_n64(const __grid_constant__ TensorMap ta, const __grid_constant__ TensorMap tb,
                  float* C, int swz) {
  tt<64, 1>(&ta, &tb, C, swz);
}
extern "C" __global__ void __launch_bounds__(128)
    hopper_tt_n128(const __grid_constant__ TensorMap ta, const __grid_constant__ TensorMap tb,
                   float* C, int swz) {
  tt<128, 1>(&ta, &tb, C, swz);
}
extern "C" __global__ void __launch_bounds__(128)
    hopper_tt_f16_n64(const __grid_constant__ TensorMap ta, const __grid_constant__ TensorMap tb,
                      float* C, int swz) {
  tt<64, 1, f16_t>(&ta, &tb, C, swz);
}
extern "C" __global__ void __launch_bounds__(128)
    hopper_tk_n64(const __grid_constant__ TensorMap ta, const __grid_constant__ TensorMap tb,
                  float* C, int swz) {
  tt<64, 0>(&ta, &tb, C, swz);
}

// Warpgroup ping-pong on two named barriers (256 threads, 512 bytes of dynamic shared memory):
// element i of a shared row goes x = i, then per round r < 4 warpgroup 0 does x = 2x + r and
// warpgroup 1 x = 3x - r, strictly alternating (the ordered dQ accumulation's pattern); out[i]
// = x. kind 1: counts differ within an instance; 2: a bar.sync whose other participants never
// arrive; 3: a count not a multiple of 32 (all reported). kind 4: one hand-off, warpgroup 0
// writes x = 2i + 1, then warpgroup 1 copies it to out after bar.sync 3; kind 5: the same with
// warpgroup 1 arriving instead of waiting (the counts balance, nothing to report, out wrong).
extern "C" __global__ void hopper_pingpong(float* out, int kind) {
  float* acc = reinterpret_cast<float*>(smem);
  const unsigned t = threadIdx.x, wg = t / 128, i = t % 128;
  if (kind == 1) {
    if (wg == 0) bar_arrive(1, 256); else bar_sync(1, 128);
    return;
  }
  if (kind == 2) {
    if (wg == 1) bar_sync(1, 256);
    return;
  }
  if (kind == 3) {
    bar_sync(1, 100);
    return;
  }
  if (kind >= 4) {
    if (wg == 0) {
      acc[i] = 2.0f * (float)i + 1.0f;
      bar_arrive(3, 256);
    } else {
      if (kind == 5) bar_arrive(3, 256); else bar_sync(3, 256);
      out[i] = acc[i];
    }
    return;
  }
  if (wg == 0) acc[i] = (float)i;
  for (int r = 0; r < 4; ++r) {
    if (wg == 0) {
      if (r > 0) bar_sync(1, 256);  // MUTATION: pingpong wait 0
      acc[i] = 2.0f * acc[i] + (float)r;
      bar_arrive(2, 256);
    } else {
      bar_sync(2, 256);  // MUTATION: pingpong wait 1
      acc[i] = 3.0f * acc[i] - (float)r;
      if (r < 3) bar_arrive(1, 256);
    }
  }
  if (wg == 1) out[i] = acc[i];
}

// TMA reductions and a store from shared memory (128 threads, 1024 + 8192 + 1024 bytes): a
// 64-row x 32-column f32 tile (128B swizzle) at rows [c1, c1 + 64) of the [rows, 32] tensors
// behind tacc and tout. Per round r < rounds the block writes the tile (bulk_val) with ordinary
// stores, fences the proxy, and thread 0 adds it to acc (cp.reduce .add) and waits for the read;
// then thread 0 stores the last tile to out, waits for completion and copies what acc and out
// hold (rows in the tensor) into peek[0 .. 2048) and peek[2048 .. 4096).
__device__ __forceinline__ float bulk_val(unsigned r, unsigned row, unsigned col) {
  unsigned h = (r * 131u + row) * 977u + col * 7919u;
  h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
  return (float)((int)(h % 2001u) - 1000) / 256.0f;
}
extern "C" __global__ void __launch_bounds__(128)
    hopper_bulk(const __grid_constant__ TensorMap tacc, const __grid_constant__ TensorMap tout,
                const float* acc, const float* out, float* peek, int c1, int rows, int rounds) {
  unsigned addr0 = smem_u32(smem);
  unsigned pad = ((addr0 + 1023u) & ~1023u) - addr0;
  unsigned char* tile = smem + pad;
  const unsigned t = threadIdx.x;
  for (int r = 0; r < rounds; ++r) {
    for (unsigned e = t; e < 64 * 32; e += 128)
      *reinterpret_cast<float*>(tile + swizzle_addr(SWIZZLE_128B, (e / 32) * 128 + (e % 32) * 4)) =
          bulk_val(r, e / 32, e % 32);
    fence_proxy_async();  // MUTATION: store fence
    __syncthreads();
    if (t == 0) {
      tma_reduce_add_2d(&tacc, tile, 0, c1);
      bulk_commit();
      bulk_wait_read<0>();  // MUTATION: bulk read wait
    }
    __syncthreads();
  }
  if (t == 0) {
    tma_store_2d(&tout, tile, 0, c1);
    bulk_commit();
    bulk_wait<0>();  // MUTATION: bulk wait
    for (unsigned e = 0; e < 64 * 32; ++e)
      if (c1 + (int)(e / 32) < rows) {
        peek[e] = acc[(c1 + e / 32) * 32 + e % 32];
        peek[2048 + e] = out[(c1 + e / 32) * 32 + e % 32];
      }
  }
}

// stmatrix_x4 (trans 0) or stmatrix_x4_trans (1), one warp (32 threads, 1024 bytes): lane l
// holds the 16-bit values 2 (4 l + m) + h in r[m] (h: low 0, high 1), rows of matrix m at byte
// 80 row + 16 m (rows 80 bytes apart); the 640 bytes go to out (320 values, 0xffff where
// nothing was stored).
extern "C" __global__ void hopper_stmatrix(unsigned short* out, int trans) {
  unsigned short* s = reinterpret_cast<unsigned short*>(smem);
  const unsigned l = threadIdx.x;
  for (unsigned i = l; i < 320; i += 32) s[i] = 0xffff;
  __syncwarp();
  unsigned r[4];
  for (unsigned m = 0; m < 4; ++m) r[m] = (2 * (4 * l + m)) | (2 * (4 * l + m) + 1) << 16;
  void* row = smem + 80 * (l % 8) + 16 * (l / 8);
  if (trans)
    stmatrix_x4_trans(r, row);
  else
    stmatrix_x4(r, row);
  __syncwarp();
  for (unsigned i = l; i < 320; i += 32) out[i] = s[i];
}
