/* mg_host_tmap.h: the host executor's CUtensorMap.
 *
 * On a GPU a CUtensorMap is 128 opaque bytes the driver's cuTensorMapEncodeTiled fills. For
 * the host executor, tests/fake_cuda.c's cuTensorMapEncodeTiled (reached through
 * runtime/mg_driver's optional table, as on a GPU) calls mg_host_tmap_encode below, which
 * validates the arguments as the CUDA driver API documents them and stores what the TMA
 * emulation (tests/host/hopper_host.cpp) needs in those 128 bytes. C and C++. */
#ifndef MG_HOST_TMAP_H
#define MG_HOST_TMAP_H
#include <cuda.h>
#include <stdint.h>
#include <string.h>

#define MG_HOST_TMAP_MAGIC 0x4d54686dU /* "mhTM" */
#define MG_HOST_TMAP_MAX_RANK 4 /* the driver allows 5; 4 is what the kernels use and fits 128 bytes */

/* What the 128 bytes hold (the first 112 of them). */
typedef struct mg_host_tmap {
  uint32_t magic;
  uint32_t rank;       /* 1..MG_HOST_TMAP_MAX_RANK */
  uint32_t elem_size;  /* bytes: 1, 2, 4 or 8 */
  uint32_t swizzle;    /* CUtensorMapSwizzle: 0 none, 1 32B, 2 64B, 3 128B */
  uint32_t oob_nan;    /* CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA: fill NaN */
  uint32_t dtype;      /* CUtensorMapDataType (TMA reductions need it) */
  uint64_t dim[MG_HOST_TMAP_MAX_RANK];    /* elements per dimension, innermost first */
  uint32_t box[MG_HOST_TMAP_MAX_RANK];    /* box elements per dimension */
  uint64_t stride[MG_HOST_TMAP_MAX_RANK]; /* bytes between index steps; stride[0] = elem_size */
  const void *base;
} mg_host_tmap;
#ifdef __cplusplus
static_assert(sizeof(mg_host_tmap) <= sizeof(CUtensorMap), "mg_host_tmap must fit a CUtensorMap");
#else
_Static_assert(sizeof(mg_host_tmap) <= sizeof(CUtensorMap), "mg_host_tmap must fit a CUtensorMap");
#endif

/* cuTensorMapEncodeTiled's arguments and checks (CUDA driver API, "Tensor Map Object
 * Managment"): base 16-byte aligned; 1 <= rank <= 4 here (the driver allows 5); dims in
 * [1, 2^32]; strides (rank - 1 of them, for dims 1..) multiples of 16 below 2^40; box dims in
 * [1, 256] with box[0] * elem_size a multiple of 16 bytes; element strides 1 (others are not
 * modelled); no interleave; with a swizzle, box[0] * elem_size equal to the swizzle span (the
 * driver allows up to it; the smaller case is not modelled). Returns CUDA_SUCCESS or
 * CUDA_ERROR_INVALID_VALUE. */
static inline CUresult mg_host_tmap_encode(CUtensorMap *map, CUtensorMapDataType dtype,
                                           cuuint32_t rank, void *base, const cuuint64_t *dims,
                                           const cuuint64_t *strides, const cuuint32_t *box,
                                           const cuuint32_t *estrides,
                                           CUtensorMapInterleave interleave,
                                           CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
                                           CUtensorMapFloatOOBfill fill) {
  (void)l2;
  if ((unsigned)swizzle > CU_TENSOR_MAP_SWIZZLE_128B) return CUDA_ERROR_INVALID_VALUE;
  uint32_t es;
  switch (dtype) {
  case CU_TENSOR_MAP_DATA_TYPE_UINT8: es = 1; break;
  case CU_TENSOR_MAP_DATA_TYPE_UINT16: case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
  case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16: es = 2; break;
  case CU_TENSOR_MAP_DATA_TYPE_UINT32: case CU_TENSOR_MAP_DATA_TYPE_INT32:
  case CU_TENSOR_MAP_DATA_TYPE_FLOAT32: es = 4; break;
  case CU_TENSOR_MAP_DATA_TYPE_UINT64: case CU_TENSOR_MAP_DATA_TYPE_INT64:
  case CU_TENSOR_MAP_DATA_TYPE_FLOAT64: es = 8; break;
  default: return CUDA_ERROR_INVALID_VALUE;
  }
  if (!map || !base || ((uintptr_t)base & 15) || rank < 1 || rank > MG_HOST_TMAP_MAX_RANK ||
      !dims || !box || !estrides || (rank > 1 && !strides) ||
      interleave != CU_TENSOR_MAP_INTERLEAVE_NONE)
    return CUDA_ERROR_INVALID_VALUE;
  mg_host_tmap t;
  memset(&t, 0, sizeof t);
  t.magic = MG_HOST_TMAP_MAGIC;
  t.rank = rank;
  t.elem_size = es;
  t.swizzle = (uint32_t)swizzle;
  t.oob_nan = fill == CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA;
  t.dtype = (uint32_t)dtype;
  t.base = base;
  t.stride[0] = es;
  for (cuuint32_t i = 0; i < rank; i++) {
    if (dims[i] < 1 || dims[i] > ((cuuint64_t)1 << 32) || box[i] < 1 || box[i] > 256 ||
        estrides[i] != 1)
      return CUDA_ERROR_INVALID_VALUE;
    if (i && (strides[i - 1] % 16 || strides[i - 1] >= ((cuuint64_t)1 << 40)))
      return CUDA_ERROR_INVALID_VALUE;
    t.dim[i] = dims[i];
    t.box[i] = box[i];
    if (i) t.stride[i] = strides[i - 1];
  }
  uint32_t inner = box[0] * es;
  if (inner % 16) return CUDA_ERROR_INVALID_VALUE;
  uint32_t span = swizzle == CU_TENSOR_MAP_SWIZZLE_128B  ? 128
                  : swizzle == CU_TENSOR_MAP_SWIZZLE_64B ? 64
                  : swizzle == CU_TENSOR_MAP_SWIZZLE_32B ? 32
                                                         : 0;
  if (swizzle != CU_TENSOR_MAP_SWIZZLE_NONE && inner != span) return CUDA_ERROR_INVALID_VALUE;
  memset(map, 0, sizeof *map);
  memcpy(map, &t, sizeof t);
  return CUDA_SUCCESS;
}
#endif
