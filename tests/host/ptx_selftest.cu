// Kernels that use every PTX wrapper of templates/mla_device.cuh. One text, two
// compilers: tests/host/selftest.cpp includes it and runs it on the host executor
// against scalar references; tests/test_device_header.c compiles it unchanged with
// NVRTC for sm_80 and sm_90a (no GPU here to run it). Plain CUDA C++: no std headers.
#include "mla_device.cuh"

// One 16x8x16 product per block (one warp): A 16x16 row-major, B 16x8 as [k][n], C and
// D 16x8 row-major, the 16-bit matrices as raw bits. Every lane builds its fragments
// straight from global memory by the PTX ISA formulas, so this checks mma alone.
// kind 0: bf16, 1: fp16.
extern "C" __global__ void k_mma_direct(const unsigned short* A, const unsigned short* B,
                                        const float* C, float* D, int kind) {
  const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
  A += blockIdx.x * 256;
  B += blockIdx.x * 128;
  C += blockIdx.x * 128;
  D += blockIdx.x * 128;
  unsigned a[4], b[2];
  float c[4], d[4];
  for (int r = 0; r < 4; ++r) {
    const int row = g + 8 * (r & 1), col = 2 * t + 8 * (r >> 1);
    a[r] = A[row * 16 + col] | (unsigned)A[row * 16 + col + 1] << 16;
  }
  for (int r = 0; r < 2; ++r) {
    const int k = 2 * t + 8 * r;
    b[r] = B[k * 8 + g] | (unsigned)B[(k + 1) * 8 + g] << 16;
  }
  for (int i = 0; i < 4; ++i) c[i] = C[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)];
  if (kind)
    mla::mma_m16n8k16_f16_f32(d, a, b, c);
  else
    mla::mma_m16n8k16_bf16_f32(d, a, b, c);
  for (int i = 0; i < 4; ++i) D[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = d[i];
}

// The same product with the fragments loaded from shared memory by ldmatrix, the way
// kernels do (bf16). variant 0: A row-major (x4), B as [k][n] (x2.trans); variant 1:
// A stored transposed as [k][m] (x4.trans), B as [n][k] (x2). C is accumulated in
// place (d aliases c).
extern "C" __global__ void k_mma_ldmatrix(const unsigned short* A, const unsigned short* B,
                                          const float* C, float* D, int variant) {
  __shared__ __align__(16) unsigned short sA[16 * 16];
  __shared__ __align__(16) unsigned short sB[16 * 16];
  const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
  A += blockIdx.x * 256;
  B += blockIdx.x * 128;
  C += blockIdx.x * 128;
  D += blockIdx.x * 128;
  for (int i = lane; i < 256; i += 32) {
    const int m = i / 16, k = i % 16;
    sA[variant ? k * 16 + m : i] = A[i];
  }
  for (int i = lane; i < 128; i += 32) {
    const int k = i / 8, n = i % 8;
    sB[variant ? n * 16 + k : i] = B[i];
  }
  __syncthreads();
  unsigned a[4], b[2];
  if (variant == 0) {
    mla::ldmatrix_x4(a, &sA[(lane % 16) * 16 + (lane / 16) * 8]);
    mla::ldmatrix_x2_trans(b, &sB[(lane % 16) * 8]);
  } else {
    const int mi = lane / 8, r = lane % 8;
    mla::ldmatrix_x4_trans(a, &sA[((mi >> 1) * 8 + r) * 16 + (mi & 1) * 8]);
    mla::ldmatrix_x2(b, &sB[r * 16 + (mi & 1) * 8]);
  }
  float acc[4];
  for (int i = 0; i < 4; ++i) acc[i] = C[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)];
  mla::mma_m16n8k16_bf16_f32(acc, a, b, acc);
  for (int i = 0; i < 4; ++i) D[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = acc[i];
}

// Raw ldmatrix: 32 rows of 8 16-bit elements in smem; lane l gives the address of row
// perm[l], so matrix m has rows perm[8m..8m+7]. out[lane * 4 + m] = r[m] (0 if unused).
// mode: 0 x1, 1 x2, 2 x4, 3 x1.trans, 4 x2.trans, 5 x4.trans.
extern "C" __global__ void k_ldmatrix_raw(const unsigned short* M, const int* perm,
                                          unsigned* out, int mode) {
  __shared__ __align__(16) unsigned short s[32 * 8];
  const int lane = threadIdx.x;
  for (int i = lane; i < 32 * 8; i += 32) s[i] = M[i];
  __syncwarp();
  const void* row = &s[perm[lane] * 8];
  unsigned r[4] = {0u, 0u, 0u, 0u};
  switch (mode) {
  case 0: mla::ldmatrix_x1(r, row); break;
  case 1: mla::ldmatrix_x2(r, row); break;
  case 2: mla::ldmatrix_x4(r, row); break;
  case 3: mla::ldmatrix_x1_trans(r, row); break;
  case 4: mla::ldmatrix_x2_trans(r, row); break;
  default: mla::ldmatrix_x4_trans(r, row); break;
  }
  for (int m = 0; m < 4; ++m) out[lane * 4 + m] = r[m];
}

// cp.async visibility, 64 threads. g: 3 * 256 floats. Each thread owns one 16-byte
// chunk in each of s0, s1, s2, first set to the poison -7. Group 0 fills s0, group 1
// s1, group 2 zero-fills s2 (valid = false). out[t * 8 + j], j =
//   0: s0 before any wait (poison)   1: s0 after wait_group 1 (data)
//   2: s1 after wait_group 1 (poison: group 1 is still pending)
//   3: s1 after wait_group 0 (data)  4: s2 after wait_group 0 (0)
//   5: the s0 chunk of thread t+1 after the waits and a barrier (its data)
//   6: s2 before its group was committed and waited (poison)
extern "C" __global__ void k_cp_async(const float* g, float* out) {
  __shared__ __align__(16) float s0[64 * 4];
  __shared__ __align__(16) float s1[64 * 4];
  __shared__ __align__(16) float s2[64 * 4];
  const int t = threadIdx.x;
  for (int j = 0; j < 4; ++j) s0[t * 4 + j] = s1[t * 4 + j] = s2[t * 4 + j] = -7.0f;
  mla::cp_async_16(&s0[t * 4], &g[t * 4]);
  mla::cp_async_commit();
  mla::cp_async_16(&s1[t * 4], &g[256 + t * 4]);
  mla::cp_async_commit();
  mla::cp_async_16_zfill(&s2[t * 4], &g[512 + t * 4], false);
  out[t * 8 + 0] = s0[t * 4];
  mla::cp_async_wait<1>();
  out[t * 8 + 1] = s0[t * 4];
  out[t * 8 + 2] = s1[t * 4];
  out[t * 8 + 6] = s2[t * 4 + 1];
  mla::cp_async_commit();
  mla::cp_async_wait<0>();
  out[t * 8 + 3] = s1[t * 4 + 3];
  out[t * 8 + 4] = s2[t * 4 + 2];
  __syncthreads();
  out[t * 8 + 5] = s0[((t + 1) % 64) * 4];
  out[t * 8 + 7] = 0.0f;
}
