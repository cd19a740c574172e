/* mg_sm90_tmap.c: the sm_90a kernels' tensor maps (attn_fwd_sm90, mqa_fwd_sm90, the
 * backward attn_bwd_dkdv_sm90 / attn_bwd_dq_sm90, the absorbed backward mqa_bwd_dkv_sm90 /
 * mqa_bwd_dq_sm90). See mg_sm90_tmap.h. */
#include "mg_sm90_tmap.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "mg_dtype.h"
#include "mlagen.h"

/* Columns per box and the swizzle spanning them: the widest of 64/32/16 dividing d. */
static unsigned box_w(int d) { return d % 64 == 0 ? 64 : d % 32 == 0 ? 32 : 16; }
static CUtensorMapSwizzle swizzle_of(unsigned w) {
  return w == 64 ? CU_TENSOR_MAP_SWIZZLE_128B : w == 32 ? CU_TENSOR_MAP_SWIZZLE_64B
                                                        : CU_TENSOR_MAP_SWIZZLE_32B;
}

static int config_of(const mg_kernel_info *k, const char *name, long *v, mg_diag *d) {
  for (int i = 0; i < k->n_config; i++)
    if (!strcmp(k->config[i].name, name)) return *v = k->config[i].value, 0;
  return mg_diag_set(d, MLAGEN_EINVAL, "%s tensor maps: %s has no tunable %s", k->family,
                     k->name, name);
}

/* One map of a row-major 16-bit tensor of rank 2 to 4 at base: dims innermost first; fam
 * names the kernel family in messages. Dim 0's rows are dims[0] elements apart (contiguous)
 * or, when ld is not 0 (the split keys' k_rope), ld elements apart; each further dim's step
 * is the one below it times that dim's size, refused (named) at 2^40 bytes or more. */
static int encode_ld(const mg_driver *drv, const char *fam, CUtensorMap *map, const char *what,
                     CUtensorMapDataType dt, int rank, CUdeviceptr base, const cuuint64_t *dims,
                     long ld, const cuuint32_t *box, mg_diag *d) {
  if (!base || (base & 15))
    return mg_diag_set(d, MLAGEN_EINVAL, "%s tensor map %s: address 0x%llx is %s", fam, what,
                       (unsigned long long)base, base ? "not 16-byte aligned" : "null");
  const cuuint64_t row = ld ? (cuuint64_t)ld * 2 : dims[0] * 2; /* bytes */
  if (ld && (ld < (long)dims[0] || row % 16 || row >= (1ull << 40)))
    return mg_diag_set(d, MLAGEN_EINVAL,
                       "%s tensor map %s: row stride ld_k_rope %ld elements: TMA needs it >= "
                       "the row's %llu elements, a multiple of 8 elements (16 bytes) and under "
                       "2^40 bytes",
                       fam, what, ld, (unsigned long long)dims[0]);
  cuuint64_t strides[3] = {row, 0, 0}; /* bytes, dims 1.. */
  for (int i = 1; i < rank - 1; i++) {
    if (strides[i - 1] > ((1ull << 40) - 1) / dims[i]) /* checked before it could wrap; dims from 0 */
      return mg_diag_set(d, MLAGEN_EINVAL,
                         "%s tensor map %s: dim %d's step of %llu x %llu bytes is 2^40 bytes or "
                         "more, over TMA's limit for a global stride (a batch item of 1 TiB)",
                         fam, what, i + 1, (unsigned long long)strides[i - 1],
                         (unsigned long long)dims[i]);
    strides[i] = strides[i - 1] * dims[i];
  }
  const cuuint32_t estrides[4] = {1, 1, 1, 1};
  CUresult r = drv->cuTensorMapEncodeTiled(
      map, dt, (cuuint32_t)rank, (void *)(uintptr_t)base, dims, strides, box, estrides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle_of(box[0]), CU_TENSOR_MAP_L2_PROMOTION_NONE,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r == CUDA_SUCCESS) return 0;
  char call[256]; /* at most ~150 characters */
  int n = snprintf(call, sizeof call, "cuTensorMapEncodeTiled(%s map %s: dims {", fam, what);
  for (int i = 0; i < rank; i++)
    n += snprintf(call + n, sizeof call - (size_t)n, "%s%llu", i ? ", " : "", (unsigned long long)dims[i]);
  n += snprintf(call + n, sizeof call - (size_t)n, "} box {");
  for (int i = 0; i < rank; i++)
    n += snprintf(call + n, sizeof call - (size_t)n, "%s%u", i ? ", " : "", box[i]);
  snprintf(call + n, sizeof call - (size_t)n, "})");
  return mg_driver_check(drv, r, MLAGEN_EINVAL, call, d);
}

/* A size as a map dim: the driver needs dims >= 1 (a size of 0 launches no CTA, or masks
 * every key). */
static cuuint64_t at_least_1(long n) { return n > 0 ? (cuuint64_t)n : 1; }

/* encode_ld with contiguous rows. */
static int encode(const mg_driver *drv, const char *fam, CUtensorMap *map, const char *what,
                  CUtensorMapDataType dt, int rank, CUdeviceptr base, const cuuint64_t *dims,
                  const cuuint32_t *box, mg_diag *d) {
  return encode_ld(drv, fam, map, what, dt, rank, base, dims, 0, box, d);
}

/* The checks every family's maps share, and the 16-bit type: k of family fam (or fam2
 * when not NULL) and of s's family, a driver with cuTensorMapEncodeTiled, sizes >= 0, a
 * dtype bf16 or fp16 (into *dt). */
static int prepare(const mg_driver *drv, const mg_kernel_spec *s, const mg_kernel_info *k,
                   const char *fam, const char *fam2, long batch, long sq, long sk,
                   CUtensorMapDataType *dt, mg_diag *d) {
  if (strcmp(k->family, fam) && (!fam2 || strcmp(k->family, fam2)))
    return mg_diag_set(d, MLAGEN_EINVAL, "%s tensor maps: kernel %s (family %s) is not %s%s%s",
                       fam, k->name, k->family, fam, fam2 ? " or " : "", fam2 ? fam2 : "");
  if (strcmp(s->family, k->family))
    return mg_diag_set(d, MLAGEN_EINVAL, "%s tensor maps: kernel %s (family %s, spec family %s)",
                       fam, k->name, k->family, s->family);
  if (!drv->cuTensorMapEncodeTiled)
    return mg_diag_set(d, MLAGEN_EUNSUPPORTED,
                       "%s needs cuTensorMapEncodeTiled, which the CUDA driver %s "
                       "(version %d) lacks (a driver of CUDA 12.0 or newer has it); the mma.sync "
                       "kernels run without it",
                       k->family, drv->path, drv->driver_version);
  if (batch < 0 || sq < 0 || sk < 0)
    return mg_diag_set(d, MLAGEN_EINVAL,
                       "%s tensor maps: batch %ld, seqlen_q %ld, seqlen_k %ld (>= 0)", k->family,
                       batch, sq, sk);
  mg_dtype t16;
  if (mg_dtype_spec_parse(s->dtype, &t16))
    return mg_diag_set(d, MLAGEN_EINVAL, "%s tensor maps: dtype %s (bf16 or fp16)", k->family, s->dtype);
  *dt = t16 == MG_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return 0;
}

/* The explicit attention kernels' (attn_fwd_sm90, the backward) configuration and dims. */
static int attn_config(const mg_kernel_spec *s, const mg_kernel_info *k, long *bm, long *bn,
                       long *packed, mg_diag *d) {
  int rc;
  if ((rc = config_of(k, "block_m", bm, d)) || (rc = config_of(k, "block_n", bn, d)) ||
      (rc = config_of(k, "k_packed", packed, d)))
    return rc;
  const int H = s->heads, dn = s->d_n, dr = s->d_r, dv = s->d_v;
  if (H < 1 || dn < 16 || dr < 16 || dv < 16 || dn % 16 || dr % 16 || dv % 16)
    return mg_diag_set(d, MLAGEN_EINVAL,
                       "%s tensor maps: heads %d, d_n %d, d_r %d, d_v %d (heads >= 1, "
                       "dims positive multiples of 16)", k->family, H, dn, dr, dv);
  return 0;
}

int mg_sm90_bwd_tmaps(const mg_driver *drv, const mg_kernel_spec *s, const mg_kernel_info *k,
                      const mg_sm90_bwd_tensors *t, CUtensorMap maps[MG_SM90_BWD_TMAPS],
                      mg_diag *d) {
  if (!drv || !s || !k || !t || !maps)
    return mg_diag_set(d, MLAGEN_EINVAL, "mg_sm90_bwd_tmaps: a NULL argument");
  memset(maps, 0, MG_SM90_BWD_TMAP_BYTES);
  long bm = 0, bn = 0, packed = 0;
  CUtensorMapDataType dt = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  int rc;
  if ((rc = prepare(drv, s, k, "attn_bwd_dkdv_sm90", "attn_bwd_dq_sm90", t->batch, t->seqlen_q,
                    t->seqlen_k, &dt, d)) ||
      (rc = attn_config(s, k, &bm, &bn, &packed, d)))
    return rc;
  const int H = s->heads, dn = s->d_n, dr = s->d_r, dv = s->d_v, dqk = dn + dr;
  const cuuint64_t rq = at_least_1(t->seqlen_q), rk = at_least_1(t->seqlen_k), nb = at_least_1(t->batch);
  const cuuint32_t BM = (cuuint32_t)bm, BN = (cuuint32_t)bn;
  const unsigned wk = box_w(dn) < box_w(dr) ? box_w(dn) : box_w(dr);
  if ((rc = encode(drv, k->family, &maps[0], "[0] q", dt, 4, t->q, (cuuint64_t[]){dqk, H, rq, nb},
                   (cuuint32_t[]){box_w(dqk), 1, BM, 1}, d)) ||
      (rc = encode(drv, k->family, &maps[1], "[1] k_nope", dt, 4, t->k_nope,
                   (cuuint64_t[]){packed ? dqk : dn, H, rk, nb}, (cuuint32_t[]){wk, 1, BN, 1}, d)) ||
      (rc = packed ? encode(drv, k->family, &maps[2], "[2] k (packed, rope columns)", dt, 4, t->k_nope,
                            (cuuint64_t[]){dqk, H, rk, nb}, (cuuint32_t[]){wk, 1, BN, 1}, d)
                   : encode_ld(drv, k->family, &maps[2], "[2] k_rope", dt, 3, t->k_rope, (cuuint64_t[]){dr, rk, nb}, t->ld_k_rope,
                            (cuuint32_t[]){wk, BN, 1}, d)) ||
      (rc = encode(drv, k->family, &maps[3], "[3] v", dt, 4, t->v, (cuuint64_t[]){dv, H, rk, nb},
                   (cuuint32_t[]){box_w(dv), 1, BN, 1}, d)) ||
      (rc = encode(drv, k->family, &maps[4], "[4] dout", dt, 4, t->dout, (cuuint64_t[]){dv, H, rq, nb},
                   (cuuint32_t[]){box_w(dv), 1, BM, 1}, d))) {
    memset(maps, 0, MG_SM90_BWD_TMAP_BYTES);
    return rc;
  }
  return 0;
}

int mg_sm90_fwd_tmaps(const mg_driver *drv, const mg_kernel_spec *s, const mg_kernel_info *k,
                      const mg_sm90_fwd_tensors *t, CUtensorMap maps[MG_SM90_FWD_TMAPS],
                      mg_diag *d) {
  if (!drv || !s || !k || !t || !maps)
    return mg_diag_set(d, MLAGEN_EINVAL, "mg_sm90_fwd_tmaps: a NULL argument");
  memset(maps, 0, MG_SM90_FWD_TMAP_BYTES);
  long bm = 0, bn = 0, packed = 0;
  CUtensorMapDataType dt = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  int rc;
  if ((rc = prepare(drv, s, k, "attn_fwd_sm90", NULL, t->batch, t->seqlen_q, t->seqlen_k, &dt,
                    d)) ||
      (rc = attn_config(s, k, &bm, &bn, &packed, d)))
    return rc;
  const int H = s->heads, dn = s->d_n, dr = s->d_r, dv = s->d_v, dqk = dn + dr;
  static const char F[] = "attn_fwd_sm90";
  const cuuint64_t rq = at_least_1(t->seqlen_q), rk = at_least_1(t->seqlen_k), nb = at_least_1(t->batch);
  const cuuint32_t BM = (cuuint32_t)bm, BN = (cuuint32_t)bn;
  if ((rc = encode(drv, F, &maps[0], "[0] q", dt, 4, t->q, (cuuint64_t[]){dqk, H, rq, nb},
                   (cuuint32_t[]){box_w(dqk), 1, BM, 1}, d)) ||
      (rc = encode(drv, F, &maps[1], "[1] k_nope", dt, 4, t->k_nope,
                   (cuuint64_t[]){packed ? dqk : dn, H, rk, nb}, (cuuint32_t[]){box_w(dn), 1, BN, 1}, d)) ||
      (rc = packed ? encode(drv, F, &maps[2], "[2] k (packed, rope columns)", dt, 4, t->k_nope,
                            (cuuint64_t[]){dqk, H, rk, nb}, (cuuint32_t[]){box_w(dr), 1, BN, 1}, d)
                   : encode_ld(drv, F, &maps[2], "[2] k_rope", dt, 3, t->k_rope, (cuuint64_t[]){dr, rk, nb}, t->ld_k_rope,
                            (cuuint32_t[]){box_w(dr), BN, 1}, d)) ||
      (rc = encode(drv, F, &maps[3], "[3] v", dt, 4, t->v, (cuuint64_t[]){dv, H, rk, nb},
                   (cuuint32_t[]){box_w(dv), 1, BN, 1}, d))) {
    memset(maps, 0, MG_SM90_FWD_TMAP_BYTES);
    return rc;
  }
  return 0;
}

/* The absorbed families' maps (mqa_fwd_sm90's q, c; the backward's q, c, dout): fam the
 * family expected, n the maps (2 or 3), bn c's box rows, dout the third tensor (n 3). */
static int mqa_maps(const mg_driver *drv, const mg_kernel_spec *s, const mg_kernel_info *k,
                    const char *F, const char *F2, int n, long bn, CUdeviceptr q,
                    CUdeviceptr c, CUdeviceptr dout, long batch, long sq, long sk,
                    CUtensorMap *maps, mg_diag *d) {
  CUtensorMapDataType dt;
  int rc;
  if ((rc = prepare(drv, s, k, F, F2, batch, sq, sk, &dt, d))) return rc;
  const char *fam = k->family;
  const int H = s->heads, dc = s->d_c, dr = s->d_r, dqk = dc + dr;
  if (H < 1 || dc < 16 || dr < 16 || dc % 16 || dr % 16)
    return mg_diag_set(d, MLAGEN_EINVAL,
                       "%s tensor maps: heads %d, d_c %d, d_r %d (heads >= 1, dims "
                       "positive multiples of 16)", fam, H, dc, dr);
  const cuuint64_t rq = at_least_1(sq * H), rk = at_least_1(sk), nb = at_least_1(batch);
  if ((rc = encode(drv, fam, &maps[0], "[0] q", dt, 3, q, (cuuint64_t[]){dqk, rq, nb},
                   (cuuint32_t[]){box_w(dqk), 64, 1}, d)) ||
      (rc = encode(drv, fam, &maps[1], "[1] c", dt, 3, c, (cuuint64_t[]){dqk, rk, nb},
                   (cuuint32_t[]){box_w(dqk), (cuuint32_t)bn, 1}, d)) ||
      (n > 2 && (rc = encode(drv, fam, &maps[2], "[2] dout", dt, 3, dout, (cuuint64_t[]){dc, rq, nb},
                             (cuuint32_t[]){box_w(dqk), 64, 1}, d)))) {
    memset(maps, 0, (size_t)n * sizeof(CUtensorMap));
    return rc;
  }
  return 0;
}

int mg_sm90_mqa_tmaps(const mg_driver *drv, const mg_kernel_spec *s, const mg_kernel_info *k,
                      const mg_sm90_mqa_tensors *t, CUtensorMap maps[MG_SM90_MQA_TMAPS],
                      mg_diag *d) {
  if (!drv || !s || !k || !t || !maps)
    return mg_diag_set(d, MLAGEN_EINVAL, "mg_sm90_mqa_tmaps: a NULL argument");
  memset(maps, 0, MG_SM90_MQA_TMAP_BYTES);
  long bn = 0;
  int rc;
  if (!strcmp(k->family, "mqa_fwd_sm90") && (rc = config_of(k, "block_n", &bn, d))) return rc;
  return mqa_maps(drv, s, k, "mqa_fwd_sm90", NULL, MG_SM90_MQA_TMAPS, bn,
                  t->q, t->c, 0, t->batch, t->seqlen_q, t->seqlen_k, maps, d);
}

int mg_sm90_mqa_bwd_tmaps(const mg_driver *drv, const mg_kernel_spec *s, const mg_kernel_info *k,
                          const mg_sm90_mqa_bwd_tensors *t,
                          CUtensorMap maps[MG_SM90_MQA_BWD_TMAPS], mg_diag *d) {
  if (!drv || !s || !k || !t || !maps)
    return mg_diag_set(d, MLAGEN_EINVAL, "mg_sm90_mqa_bwd_tmaps: a NULL argument");
  memset(maps, 0, MG_SM90_MQA_BWD_TMAP_BYTES);
  return mqa_maps(drv, s, k, "mqa_bwd_dkv_sm90", "mqa_bwd_dq_sm90",
                  MG_SM90_MQA_BWD_TMAPS, 64, t->q, t->c, t->dout, t->batch, t->seqlen_q,
                  t->seqlen_k, maps, d);
}

/* The device address parameter `name` of k has in args (0 when k has no such parameter). */
static CUdeviceptr arg_ptr(const mg_kernel_info *k, void *const *args, const char *name) {
  for (int i = 0; i < k->n_params; i++)
    if (!strcmp(k->params[i].name, name) &&
        (k->params[i].kind == MG_PARAM_IN || k->params[i].kind == MG_PARAM_OUT)) {
      CUdeviceptr p = 0;
      memcpy(&p, args[i], sizeof p);
      return p;
    }
  return 0;
}

/* The int parameter `name` of k in args (0 when k has no such parameter: a k_packed = 1
 * kernel has no ld_k_rope). */
static long arg_int(const mg_kernel_info *k, void *const *args, const char *name) {
  for (int i = 0; i < k->n_params; i++)
    if (!strcmp(k->params[i].name, name) && k->params[i].kind == MG_PARAM_INT) {
      int v = 0;
      memcpy(&v, args[i], sizeof v);
      return v;
    }
  return 0;
}

static int no_room(const mg_kernel_info *k, int max, int need, mg_diag *d) {
  return mg_diag_set(d, MLAGEN_EINVAL, "mg_sm90_launch_tmaps: room for %d maps, %s needs %d", max,
                     k->name, need);
}

int mg_sm90_launch_tmaps(const mg_driver *drv, const mg_kernel_spec *s, const mg_kernel_info *k,
                         void *const *args, const mg_launch_dims *dims, CUtensorMap *maps, int max,
                         int *n, mg_diag *d) {
  if (n) *n = 0;
  if (!drv || !s || !k || !args || !dims || !maps || !n)
    return mg_diag_set(d, MLAGEN_EINVAL, "mg_sm90_launch_tmaps: a NULL argument");
  int has = 0;
  for (int i = 0; i < k->n_params; i++) has |= k->params[i].kind == MG_PARAM_TMAPS;
  if (!has)
    return mg_diag_set(d, MLAGEN_EINVAL, "kernel %s has no tensor-map parameter", k->name);
  if (!strcmp(k->family, "attn_fwd_sm90")) {
    if (max < MG_SM90_FWD_TMAPS) return no_room(k, max, MG_SM90_FWD_TMAPS, d);
    const mg_sm90_fwd_tensors t = {arg_ptr(k, args, "q"),     arg_ptr(k, args, "k_nope"),
                                   arg_ptr(k, args, "k_rope"), arg_ptr(k, args, "v"),
                                   dims->batch,               dims->seqlen_q,
                                   dims->seqlen_k,            arg_int(k, args, "ld_k_rope")};
    int rc = mg_sm90_fwd_tmaps(drv, s, k, &t, maps, d);
    if (!rc) *n = MG_SM90_FWD_TMAPS;
    return rc;
  }
  if (!strcmp(k->family, "mqa_fwd_sm90")) {
    if (max < MG_SM90_MQA_TMAPS) return no_room(k, max, MG_SM90_MQA_TMAPS, d);
    const mg_sm90_mqa_tensors t = {arg_ptr(k, args, "q"), arg_ptr(k, args, "c"), dims->batch,
                                   dims->seqlen_q, dims->seqlen_k};
    int rc = mg_sm90_mqa_tmaps(drv, s, k, &t, maps, d);
    if (!rc) *n = MG_SM90_MQA_TMAPS;
    return rc;
  }
  if (!strcmp(k->family, "mqa_bwd_dkv_sm90") || !strcmp(k->family, "mqa_bwd_dq_sm90")) {
    if (max < MG_SM90_MQA_BWD_TMAPS)
      return mg_diag_set(d, MLAGEN_EINVAL, "mg_sm90_launch_tmaps: room for %d maps, %s needs %d",
                         max, k->name, MG_SM90_MQA_BWD_TMAPS);
    const mg_sm90_mqa_bwd_tensors t = {arg_ptr(k, args, "q"),    arg_ptr(k, args, "c"),
                                       arg_ptr(k, args, "dout"), dims->batch,
                                       dims->seqlen_q,           dims->seqlen_k};
    int rc = mg_sm90_mqa_bwd_tmaps(drv, s, k, &t, maps, d);
    if (!rc) *n = MG_SM90_MQA_BWD_TMAPS;
    return rc;
  }
  if (!strcmp(k->family, "attn_bwd_dkdv_sm90") || !strcmp(k->family, "attn_bwd_dq_sm90")) {
    if (max < MG_SM90_BWD_TMAPS) return no_room(k, max, MG_SM90_BWD_TMAPS, d);
    const mg_sm90_bwd_tensors t = {arg_ptr(k, args, "q"),      arg_ptr(k, args, "k_nope"),
                                   arg_ptr(k, args, "k_rope"), arg_ptr(k, args, "v"),
                                   arg_ptr(k, args, "dout"),   dims->batch,
                                   dims->seqlen_q,             dims->seqlen_k,
                                   arg_int(k, args, "ld_k_rope")};
    int rc = mg_sm90_bwd_tmaps(drv, s, k, &t, maps, d);
    if (!rc) *n = MG_SM90_BWD_TMAPS;
    return rc;
  }
  return mg_diag_set(d, MLAGEN_EINVAL, "kernel %s: no tensor-map encoder for family %s "
                     "(runtime/exec/mg_sm90_tmap.c)", k->name, k->family);
}
