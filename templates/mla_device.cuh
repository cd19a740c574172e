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

}  // namespace mla
