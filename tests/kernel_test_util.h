/* kernel_test_util.h: what the generated-kernel tests share: 16-bit element conversions
 * (the safetensors module's, tested bit-exactly there), the seeded normal generator and
 * random 16-bit arrays with a realistic score spread, and the per-element output check
 * (tests/check_close.h) with its noise figures. Header-only; each test includes it once
 * (the generator's state is the test's own). */
#ifndef MG_KERNEL_TEST_UTIL_H
#define MG_KERNEL_TEST_UTIL_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check_close.h"
#include "host/host_launch.h"
#include "mg_safetensors.h"

typedef uint16_t e16; /* storage of __nv_bfloat16 or __half */
typedef e16 bf16;

static inline float bf16_to_float(e16 x) { return mg_bf16_to_f32(x); }
static inline e16 float_to_bf16(float f) { return mg_f32_to_bf16(f); } /* nearest even */
static inline float half_to_float(e16 h) { return mg_f16_to_f32(h); }
static inline e16 float_to_half(float f) { return mg_f32_to_f16(f); }  /* nearest even */
/* fp16: half, else bf16 */
static inline float e16_to_float(int fp16, e16 x) {
  return fp16 ? half_to_float(x) : bf16_to_float(x);
}
static inline e16 float_to_e16(int fp16, float f) {
  return fp16 ? float_to_half(f) : float_to_bf16(f);
}
/* The rounding of a 16-bit operand as the mixed-precision references (attn_ref_mixed,
 * mqa_ref.h) take it: x to the nearest fp16 (fp16) or bf16 value, as a double. */
static inline double kt_round_bf16(double x) { return bf16_to_float(float_to_bf16((float)x)); }
static inline double kt_round_f16(double x) { return half_to_float(float_to_half((float)x)); }
typedef double (*kt_round)(double);
static inline kt_round kt_round_fn(int fp16) { return fp16 ? kt_round_f16 : kt_round_bf16; }

/* Seeded inputs: MLAGEN_TEST_SEED (printed by each test) reproduces a run. */
static uint64_t rng_state;
static uint64_t g_test_seed;

/* A standard normal sample: Box-Muller on a 64-bit LCG. */
static inline double randn(void) {
  double u[2];
  for (int i = 0; i < 2; i++) {
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    u[i] = ((rng_state >> 11) + 0.5) / 9007199254740992.0;
  }
  return sqrt(-2 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

/* Seeds the generator from MLAGEN_TEST_SEED, else the time, and prints the seed. */
static inline void kt_seed_init(void) {
  const char *env = getenv("MLAGEN_TEST_SEED");
  rng_state = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
  g_test_seed = rng_state;
  printf("MLAGEN_TEST_SEED=%llu\n", (unsigned long long)rng_state);
}

/* n normal samples of standard deviation sd rounded to 16 bits, never 0 (a 0 becomes sd/2):
 * a zero would hide a dropped term. */
static inline e16 *kt_rand_e16_sd(int fp16, size_t n, double sd) {
  e16 *p = malloc((n ? n : 1) * sizeof *p);
  for (size_t i = 0; i < n; i++) {
    e16 x = float_to_e16(fp16, (float)(randn() * sd));
    if (e16_to_float(fp16, x) == 0) x = float_to_e16(fp16, (float)(sd / 2));
    p[i] = x;
  }
  return p;
}

/* n 16-bit values as doubles (malloc'd, at least one element). */
static inline double *kt_e16_to_d(int fp16, const e16 *p, size_t n) {
  double *d = malloc((n ? n : 1) * sizeof *d);
  for (size_t i = 0; i < n; i++) d[i] = e16_to_float(fp16, p[i]);
  return d;
}

/* The attention forward's K as doubles [n, d_n + d_r] (malloc'd, at least one row), n = tokens *
 * heads rows (row t: token t / heads, its head t % heads), from 16-bit storage: `packed`: kn is
 * that [n, d_n + d_r] already; split: row t is kn [t, :d_n] then the token's shared
 * kr [t / heads, :d_r]. */
static inline double *kt_k_to_d(int fp16, int packed, const e16 *kn, const e16 *kr, size_t n,
                                int heads, int dn, int dr) {
  const int dqk = dn + dr;
  double *k = malloc((n ? n : 1) * dqk * sizeof *k);
  for (size_t t = 0; t < n; t++)
    for (int e = 0; e < dqk; e++)
      k[t * dqk + e] = packed   ? e16_to_float(fp16, kn[t * dqk + e])
                       : e < dn ? e16_to_float(fp16, kn[t * dn + e])
                                : e16_to_float(fp16, kr[t / heads * dr + e - dn]);
  return k;
}

/* Split keys' k_rope as the kernels read it (their ld_k_rope argument, SPLITKEY.md): the rows
 * of kr [rows, dr] at column KT_ROPE_COL of a [rows, KT_ROPE_COL + dr] buffer whose every
 * other element is NaN (0x7fff in bf16 and fp16), as the LAGA plans pass the latent c's RoPE
 * columns; or, wide 0, a contiguous copy (ld_k_rope = dr). Returns the malloc'd buffer (free
 * it); *kr_arg and *ld: the kernel's k_rope and ld_k_rope arguments. NULL kr: NULL, no
 * arguments (packed keys). */
#define KT_ROPE_COL 64
static inline e16 *kt_rope_strided(const e16 *kr, size_t rows, int dr, int wide,
                                   const e16 **kr_arg, int *ld) {
  *kr_arg = NULL, *ld = 0;
  if (!kr) return NULL;
  const int col = wide ? KT_ROPE_COL : 0;
  *ld = col + dr;
  e16 *buf = malloc((rows ? rows : 1) * (size_t)*ld * sizeof *buf);
  for (size_t i = 0; i < rows * (size_t)*ld; i++) buf[i] = 0x7fff;
  for (size_t r = 0; r < rows; r++) memcpy(buf + r * *ld + col, kr + r * dr, (size_t)dr * sizeof *kr);
  *kr_arg = buf + col;
  return buf;
}

/* DeepSeek-V2/V3's YaRN attention scale (rope_scaling factor 40, mscale_all_dim 1):
 * mscale = 0.1 ln(40) + 1; the softmax scale is mscale^2 / sqrt(d_qk). */
#define KT_YARN_MSCALE 1.3689
static inline double kt_softmax_scale(int d_qk) {
  return KT_YARN_MSCALE * KT_YARN_MSCALE / sqrt((double)d_qk);
}

/* Query positions of an attention case (attn_ref.h's convention): row i at q_pos0 + i, or
 * with two chunks (q_split > 0) at q_pos1 + i - q_split from row q_split on. */
typedef struct kt_qpos {
  int q_pos0, q_split, q_pos1;
} kt_qpos;

/* The kernels' arguments for p (mla::QueryPos; q_split = 0 there means one chunk at
 * q_pos1): one chunk at q_pos0 is (q_pos0, 0, q_pos0). */
static inline kt_qpos kt_qpos_kernel(const kt_qpos *p) {
  return p->q_split > 0 ? *p : (kt_qpos){p->q_pos0, 0, p->q_pos0};
}

/* The queries of rank r of the all-gather context-parallel form (laga-cp) at P ranks: the
 * S = P (a + b) tokens in P chunks of a then P chunks of b; rank r holds chunk r (a rows at
 * r a) and chunk 2P - 1 - r (b rows at P a + (P - 1 - r) b), S_q = a + b rows. */
static inline kt_qpos kt_qpos_lagacp(int P, int r, int a, int b) {
  return (kt_qpos){r * a, a, P * a + (P - 1 - r) * b};
}

/* The two-chunk cases the attention kernel tests run: rank r of P with chunks of a and b
 * rows (S_q = a + b queries over S_k = P (a + b) keys). a and b are not multiples of any
 * block_m, so a CTA (and a warp) straddles the chunks: P = 2 ranks 0 and 1 (rank 1's
 * chunks are adjacent, q_pos1 = q_pos0 + q_split), P = 3 rank 1. And P = 2 rank 0 with chunks
 * of 33 and 32 (S_q 65, S_k 130: q_pos1 98): the key tile at 128 is first seen by row 63, one
 * before a multiple of every block_m, where QueryPos::first_row_at's second branch (rows
 * past the split) decides which query block a dK/dV CTA starts from. *out: the table;
 * returns its length. */
typedef struct kt_two_chunk {
  int P, r, a, b;
} kt_two_chunk;
static inline int kt_two_chunk_cases(const kt_two_chunk **out) {
  static const kt_two_chunk cases[] = {{2, 0, 37, 45}, {2, 1, 37, 45}, {3, 1, 29, 40}, {2, 0, 33, 32}};
  *out = cases;
  return (int)(sizeof cases / sizeof cases[0]);
}

/* The global position of query row i under p (attn_ref.h's attn_ref_pos rule). */
static inline long kt_qpos_at(const kt_qpos *p, int i) {
  return p->q_split > 0 && i >= p->q_split ? (long)p->q_pos1 + (i - p->q_split) : (long)p->q_pos0 + i;
}

/* Packed sequences (issue 16): the kernel tests' documents in a buffer of KT_VARLEN_CAP
 * token rows (every attention and MQA kernel test, portable and sm_90a, uses these). "many":
 * lengths 1, 2, 3, 17, 0 (an empty document), 64, 200, T = 287 tokens and 13 slack rows,
 * then T twice more (the CUDA executor pads its copy with T: zero-length documents at the
 * end); under laga-cp at P = 2 (chunks of 75) the documents at 23 and 87 are cut by the
 * chunk boundaries 75, 150 and 225. "one": a single document of 260 tokens, 40 slack rows.
 * *out: the table; returns its length. */
#define KT_VARLEN_CAP 300
#define KT_VARLEN_MANY_DOCS 7 /* "many"'s documents before the padding */
typedef struct kt_varlen {
  const char *name;
  const int *cu; /* n + 1 boundaries */
  int n;
} kt_varlen;
static inline int kt_varlen_cases(const kt_varlen **out) {
  static const int many[] = {0, 1, 3, 6, 23, 23, 87, 287, 287, 287}, one[] = {0, 260};
  static const kt_varlen cases[] = {{"many", many, 9}, {"one", one, 1}};
  *out = cases;
  return (int)(sizeof cases / sizeof cases[0]);
}

/* kt_varlen_cases' "many" stream. */
static inline const kt_varlen *kt_varlen_many(void) {
  const kt_varlen *vl;
  kt_varlen_cases(&vl);
  return &vl[0];
}

/* cu [n + 1]: vl's first n + 1 boundaries, entries past vl->n repeating its last (T: the
 * executor's padding); n = KT_VARLEN_MANY_DOCS gives "many"'s exact boundaries,
 * n = KT_VARLEN_CAP the executor's padding to one entry per token. */
static inline void kt_varlen_pad(const kt_varlen *vl, int n, int *cu) {
  for (int d = 0; d <= n; d++) cu[d] = vl->cu[d < vl->n ? d : vl->n];
}

/* A malloc'd copy of vl's n + 1 boundaries (the kernels read them through a heap block of
 * exactly that size, which an ASan run bounds-checks). */
static inline int *kt_varlen_copy(const kt_varlen *vl) {
  int *cu = malloc(sizeof *cu * (size_t)(vl->n + 1));
  memcpy(cu, vl->cu, sizeof *cu * (size_t)(vl->n + 1));
  return cu;
}

/* NaN (0x7fff, bf16 and fp16) in every element of the token rows of x [rows, w] at
 * positions >= T (slack); the position of row r is kt_qpos_at(pos, r), or r when pos is
 * NULL (keys). */
static inline void kt_nan_slack_e16(e16 *x, int rows, size_t w, const kt_qpos *pos, int T) {
  for (int r = 0; r < rows; r++)
    if ((pos ? kt_qpos_at(pos, r) : r) >= T)
      for (size_t c = 0; c < w; c++) x[(size_t)r * w + c] = 0x7fff;
}

/* The same for a per-row fp32 tensor [heads, rows] (LSE, delta). */
static inline void kt_nan_slack_f32(float *x, int heads, int rows, const kt_qpos *pos, int T) {
  for (int h = 0; h < heads; h++)
    for (int r = 0; r < rows; r++)
      if ((pos ? kt_qpos_at(pos, r) : r) >= T) x[(size_t)h * rows + r] = NAN;
}

/* NaN in every element of the last of B batch items of x (n elements, item-major: [B, ...]),
 * for B > 1: a batch-isolation case poisons the last item (after its reference is made, or
 * with that item's reference left uncompared) and checks the items before it, whose tiles'
 * rows past their end must be zero fill (TMA's batch dim), never the next item's values. */
static inline void kt_nan_last_item_e16(e16 *x, size_t n, int B) {
  if (B > 1 && x)
    for (size_t i = n - n / (size_t)B; i < n; i++) x[i] = 0x7fff;
}
static inline void kt_nan_last_item_f32(float *x, size_t n, int B) {
  if (B > 1 && x)
    for (size_t i = n - n / (size_t)B; i < n; i++) x[i] = NAN;
}
/* The same over the explicit attention forward's inputs (H heads; q [B, sq, H, dn + dr];
 * k_nope [B, sk, H, dn], or with packed keys K [B, sk, H, dn + dr] and kr NULL; k_rope
 * [B, sk, dr]; v [B, sk, H, dv]). */
static inline void kt_nan_last_item_attn(int B, int sq, int sk, int H, int dn, int dr, int dv,
                                         int packed, e16 *q, e16 *kn, e16 *kr, e16 *v) {
  const size_t rq = (size_t)B * sq * H, rk = (size_t)B * sk;
  kt_nan_last_item_e16(q, rq * (size_t)(dn + dr), B);
  kt_nan_last_item_e16(kn, rk * H * (size_t)(packed ? dn + dr : dn), B);
  kt_nan_last_item_e16(kr, rk * (size_t)dr, B);
  kt_nan_last_item_e16(v, rk * H * (size_t)dv, B);
}

/* ---- packed sequences: no work on key tiles outside a document ----------------------------
 * The host executor records which rows of a key buffer each CTA copies into shared memory
 * (mg_host_read_watch: cp.async and TMA loads), and the test holds them against the document
 * hull it computes on its own from cu_seqlens (a linear scan, not the kernels' range logic).
 * A CTA may load less than one tile beyond its hull at either end (tiles aligned to multiples
 * of block_n, or ending at the hull's end), never more: a kernel that loops over every key
 * tile and masks passes every per-element check but fails this one. */

/* The hull [lo, hi) of the keys query rows i0 .. i1 (at positions kt_qpos_at(pos, i)) see
 * over the documents cu [n + 1]: from the first to the last key of any of them (a row at
 * position t of document d sees cu[d] .. (causal ? t : cu[d + 1] - 1); a row at or past
 * T = cu[n] sees none), hi clipped to sk; (0, 0) when no row sees a key. */
static inline void kt_varlen_hull(const int *cu, int n, int causal, const kt_qpos *pos, int i0,
                                  int i1, int sk, int *lo, int *hi) {
  *lo = 0x7fffffff, *hi = 0;
  for (int i = i0; i <= i1; i++) {
    const long t = kt_qpos_at(pos, i);
    for (int d = 0; d < n; d++)
      if (cu[d] <= t && t < cu[d + 1]) {
        const long e = causal ? t + 1 : cu[d + 1];
        if (cu[d] < *lo) *lo = cu[d];
        if (e > *hi) *hi = (int)e;
      }
  }
  if (*hi > sk) *hi = sk;
  if (*hi <= *lo) *lo = *hi = 0;
}

/* A launch's key-row watch: lo (its read_watch set) is what the test launches with. The
 * struct must not move after kt_tile_watch_init (lo points into it). */
typedef struct kt_tile_watch {
  mg_host_read_watch w;
  mg_host_launch_opts lo;
  size_t blocks;
} kt_tile_watch;

/* Watches the rows [rows] of row_bytes bytes from base, for a grid of `blocks` blocks. */
static inline void kt_tile_watch_init(kt_tile_watch *tw, const void *base, size_t row_bytes,
                                      size_t rows, size_t blocks) {
  memset(tw, 0, sizeof *tw);
  tw->w = (mg_host_read_watch){base, row_bytes, rows, calloc(blocks * rows + 1, 1)};
  tw->lo.read_watch = &tw->w;
  tw->blocks = blocks;
}
static inline void kt_tile_watch_free(kt_tile_watch *tw) { free(tw->w.read); }

/* Checks the rows block b read against its hull [lo, hi) (kt_varlen_hull): one run [a, e)
 * holding the hull, with lo - a and e - hi under `tile` rows; nothing when the hull is empty.
 * Adds the block's key tiles read, ceil((e - a) / tile), to *tiles and the hull's own,
 * ceil((hi - lo) / tile), to *need. Returns 1, or 0 with the reason in msg. */
static inline int kt_tile_check_block(const kt_tile_watch *tw, size_t b, int lo, int hi, int tile,
                                      long *tiles, long *need, char *msg, size_t msg_n) {
  const unsigned char *r = tw->w.read + b * tw->w.rows;
  const long rows = (long)tw->w.rows;
  long a = 0, e, nread = 0;
  while (a < rows && !r[a]) a++;
  for (e = a; e < rows && r[e]; e++) nread++;
  for (long i = e; i < rows; i++) nread += r[i];
  if (nread != e - a) {
    snprintf(msg, msg_n, "block %zu read rows %ld .. %ld and more rows after a gap", b, a, e - 1);
    return 0;
  }
  *tiles += (e - a + tile - 1) / tile, *need += (hi - lo + tile - 1) / tile;
  if (hi == lo ? nread != 0 : a > lo || e < hi || lo - a >= tile || e - hi >= tile) {
    snprintf(msg, msg_n, "block %zu read rows [%ld, %ld) (%ld tiles of %d) for its documents' "
             "rows [%d, %d) (%d tiles)", b, a, e, (e - a + tile - 1) / tile, tile, lo, hi,
             (hi - lo + tile - 1) / tile);
    return 0;
  }
  return 1;
}

/* The hull [lo, hi) of the query rows 0 .. sq - 1 (at positions kt_qpos_at(pos, i)) that see
 * at least one of the keys k0 .. k1 over the documents cu [n + 1] (a row at position t of
 * document d sees cu[d] .. (causal ? t : cu[d + 1] - 1); a row at or past T sees none); (0, 0)
 * when no row does. The key-tile kernels' (attn_bwd_dkdv's) query rows to read. */
static inline void kt_varlen_query_hull(const int *cu, int n, int causal, const kt_qpos *pos,
                                        int sq, int k0, int k1, int *lo, int *hi) {
  *lo = 0x7fffffff, *hi = 0;
  for (int i = 0; i < sq; i++) {
    const long t = kt_qpos_at(pos, i);
    for (int d = 0; d < n; d++)
      if (cu[d] <= t && t < cu[d + 1]) {
        const long e = causal ? t : cu[d + 1] - 1; /* the row's keys: cu[d] .. e */
        if (cu[d] <= k1 && e >= k0) {
          if (i < *lo) *lo = i;
          if (i + 1 > *hi) *hi = i + 1;
        }
      }
  }
  if (*hi <= *lo) *lo = *hi = 0;
}

/* kt_tile_check_block over a grid of gx key-tile blocks of bn keys (of sk) x gy (heads, the
 * same hull for each), the watch on the query rows: block x reads the query tiles (bm rows)
 * holding kt_varlen_query_hull of its keys. Prints the tiles read against the hulls'; returns
 * 1, or 0 with the first failure's reason in msg. */
static inline int kt_query_tile_check(const kt_tile_watch *tw, int gx, int gy, int bn, int bm,
                                      int sq, const int *cu, int n, int causal, const kt_qpos *pos,
                                      int sk, char *msg, size_t msg_n) {
  long tiles = 0, need = 0;
  int ok = 1;
  for (int x = 0; x < gx; x++) {
    const int k1 = (x + 1) * bn < sk ? (x + 1) * bn - 1 : sk - 1;
    int lo, hi;
    kt_varlen_query_hull(cu, n, causal, pos, sq, x * bn, k1, &lo, &hi);
    for (int y = 0; y < gy; y++)
      if (ok && !kt_tile_check_block(tw, (size_t)x + (size_t)gx * y, lo, hi, bm, &tiles, &need,
                                     msg, msg_n))
        ok = 0;
  }
  printf("    query tiles read per CTA against the document hulls: %ld (hulls %ld)%s\n", tiles,
         need, ok ? "" : ", FAILED");
  if (ok) msg[0] = 0;
  return ok;
}

/* kt_tile_check_block over a grid of gx x gy blocks (linear index x + gx y; y is a head, the
 * same hull for each) whose block x holds the flattened query rows [x bm, (x + 1) bm) of
 * sq div (div rows per query: the heads of the absorbed kernels, else 1), the queries
 * (x bm) / div .. ((x + 1) bm - 1) / div at positions pos; keys sk. Prints the tiles read
 * against the hull's; returns 1, or 0 with the first failure's reason in msg. */
static inline int kt_tile_check(const kt_tile_watch *tw, int gx, int gy, int bm, int div, int sq,
                                const int *cu, int n, int causal, const kt_qpos *pos, int sk,
                                int tile, char *msg, size_t msg_n) {
  long tiles = 0, need = 0;
  int ok = 1;
  for (int x = 0; x < gx; x++) {
    const long r1 = (long)(x + 1) * bm < (long)sq * div ? (long)(x + 1) * bm : (long)sq * div;
    int lo, hi;
    kt_varlen_hull(cu, n, causal, pos, x * bm / div, (int)((r1 - 1) / div), sk, &lo, &hi);
    for (int y = 0; y < gy; y++)
      if (ok && !kt_tile_check_block(tw, (size_t)x + (size_t)gx * y, lo, hi, tile, &tiles, &need,
                                     msg, msg_n))
        ok = 0;
  }
  printf("    key tiles read per CTA against the document hulls: %ld (hulls %ld)%s\n", tiles, need,
         ok ? "" : ", FAILED");
  if (ok) msg[0] = 0;
  return ok;
}

/* The standard deviation of q for scores with standard deviation 2 (a trained model's
 * spread, peaked softmax rows): scale * q . k over w dimensions with k ~ N(0, 1). */
static inline double kt_q_sd(double scale, int w) { return 2.0 / (scale * sqrt((double)w)); }

/* ---- the per-element output check ----------------------------------------------------------
 * An output element passes when |got - ref| <= atol_frac * scale + rtol |ref| (check_close.h),
 * scale the RMS of the tensor's nonzero reference elements (its typical size), unless given.
 * rtol is set from the unit roundoffs u (bf16 2^-8, fp16 2^-11, fp32 2^-24): that of the
 * output's storage (its own rounding), and for the forwards, whose online softmax rounds P
 * to 16 bits against a running maximum no reference follows, that of the 16-bit P too (a
 * P near a rounding boundary may round the other way; when its term dominates the element,
 * the error is u |ref|). The backwards' references model the 16-bit operands and bound such
 * ambiguous roundings per element instead (kt_check_slack's slack: attn_ref.h, mqa_ref.h).
 * Each check also records the output's noise figure, the largest (|err| - rtol |ref| -
 * slack) / scale over its elements (the error beyond what rtol and the slack allow, in
 * units of the tensor's scale), which kt_noise_report prints: atol_frac in the tests is
 * about twice the worst figure measured over seeds and shapes. */
enum { KT_BF16, KT_F16, KT_F32 };

static inline double kt_unit_roundoff(int kind) {
  return kind == KT_BF16 ? 1.0 / 256 : kind == KT_F16 ? 1.0 / 2048 : 1.0 / 16777216;
}

static inline double kt_get(int kind, const void *p, size_t i) {
  if (kind == KT_F32) return ((const float *)p)[i];
  return e16_to_float(kind == KT_F16, ((const e16 *)p)[i]);
}

/* One output's tolerance: atol in units of the tensor's scale, rtol relative. */
typedef struct kt_tol {
  double atol_frac, rtol;
} kt_tol;

/* The outcome of kt_check: the comparison, its absolute bound and, on failure, a message. */
typedef struct kt_checked {
  cc_result r;
  double atol, rtol, scale;
  char msg[400];
} kt_checked;

static struct {
  char name[40];
  double noise, ratio;
} kt_noise_tab[24];
static int kt_noise_n;
static int kt_noise_quiet; /* 1: checks record nothing (a mutation test's outputs are not noise) */
/* 1 (kt_check_fwd's O only): an element whose reference is exactly 0 must be exactly 0 (-0
 * too). A forward's reference 0 is a row without keys (a slack row, a query before every
 * key), which a kernel writes without summing anything. Not for gradients: a row with one
 * key has dS = 0 and dq = 0 exactly in float64, while a kernel's rounding leaves a few ulp. */
static int kt_zero_exact;

static inline void kt_noise_report(void);

/* Records an output's noise figure and err / bound. In the ASan child of kh_run_asan_child
 * ($MLAGEN_TEST_ASAN_CHILD set) the report is printed at exit too, for the parent to show:
 * an ASan build (clang++ -O0) rounds differently from the g++ -O2 one, so its noise counts as well. */
static inline void kt_noise_note(const char *name, double noise, double ratio) {
  if (kt_noise_quiet) return;
  static int at_exit;
  if (!at_exit && getenv("MLAGEN_TEST_ASAN_CHILD")) at_exit = 1, atexit(kt_noise_report);
  int i = 0;
  while (i < kt_noise_n && strcmp(kt_noise_tab[i].name, name)) i++;
  if (i == kt_noise_n) {
    if (kt_noise_n == (int)(sizeof kt_noise_tab / sizeof kt_noise_tab[0])) return;
    snprintf(kt_noise_tab[kt_noise_n++].name, sizeof kt_noise_tab[0].name, "%s", name);
  }
  if (noise > kt_noise_tab[i].noise) kt_noise_tab[i].noise = noise;
  if (ratio > kt_noise_tab[i].ratio) kt_noise_tab[i].ratio = ratio;
}

/* Prints each output's worst noise figure and worst err / bound over the run (the second
 * shows the margin left; the tests' tolerances come from the first). */
static inline void kt_noise_report(void) {
  for (int i = 0; i < kt_noise_n; i++)
    printf("noise %-17s max (|err| - rtol |ref| - slack) / scale %.2e, worst err/bound %.2f\n",
           kt_noise_tab[i].name, kt_noise_tab[i].noise, kt_noise_tab[i].ratio);
}

/* A cmocka group teardown that prints kt_noise_report. */
static inline int kt_noise_teardown(void **state) {
  (void)state;
  kt_noise_report();
  return 0;
}

/* Compares output `name` (kind KT_*: got's storage) on rows x columns [c0, c1) of rows w
 * wide against ref (same layout) with tol; scale <= 0: the RMS of the compared nonzero
 * reference elements. Records the noise figure; returns the comparison (cc_ok(&.r)). */
static inline kt_checked kt_check_slack(const char *name, int kind, const void *got,
                                        const double *ref, const double *slack, size_t rows,
                                        size_t w, size_t c0, size_t c1, kt_tol tol, double scale);
static inline kt_checked kt_check(const char *name, int kind, const void *got, const double *ref,
                                  size_t rows, size_t w, size_t c0, size_t c1, kt_tol tol,
                                  double scale) {
  return kt_check_slack(name, kind, got, ref, NULL, rows, w, c0, c1, tol, scale);
}

/* kt_check with a per-element addition to atol, slack (ref's layout; NULL: none), such as
 * the bound of a reference's ambiguous 16-bit roundings (attn_ref.h's flip_*). */
static inline kt_checked kt_check_slack(const char *name, int kind, const void *got,
                                        const double *ref, const double *slack, size_t rows,
                                        size_t w, size_t c0, size_t c1, kt_tol tol, double scale) {
  kt_checked k;
  if (scale <= 0) {
    double ss = 0;
    size_t nz = 0;
    for (size_t r = 0; r < rows; r++)
      for (size_t c = c0; c < c1; c++) {
        const double x = ref[r * w + c];
        if (x != 0 && isfinite(x)) ss += x * x, nz++;
      }
    scale = nz ? sqrt(ss / (double)nz) : 1;
  }
  k.scale = scale, k.atol = tol.atol_frac * scale, k.rtol = tol.rtol;
  k.r = cc_init();
  double noise = 0;
  for (size_t r = 0; r < rows; r++)
    for (size_t c = c0; c < c1; c++) {
      const size_t i = r * w + c;
      const double g = kt_get(kind, got, i), x = ref[i], sl = slack ? slack[i] : 0;
      /* A flipped rounding moves the value by up to sl before the output is rounded, so
       * that rounding is bounded by rtol (|ref| + sl), not rtol |ref|: the slack's term is
       * (1 + rtol) sl. */
      const double sl_r = sl * (1 + k.rtol);
      cc_add(&k.r, (int64_t)(r * (c1 - c0) + (c - c0)), g, x,
             x == 0 && kt_zero_exact ? 0 : k.atol + sl_r, k.rtol);
      const double e = g == x        ? 0
                       : isfinite(g) ? (fabs(g - x) - tol.rtol * fabs(x) - sl_r) / scale
                                     : INFINITY;
      if (e > noise) noise = e;
    }
  kt_noise_note(name, noise, k.r.worst_ratio);
  cc_describe(&k.r, name, k.atol, k.rtol, (int64_t)(c1 - c0), k.msg, sizeof k.msg);
  return k;
}

/* A forward kernel's outputs per element: O (no elements of width w, 16-bit storage `kind`)
 * against ro with tol_o, LSE (nl fp32) against rl with tol_lse (scale 1). *o_err, *lse_err:
 * the worst err / bound (over 1 fails; O's is 0 when there is no O). The first failure's
 * message goes to msg (when not NULL; msg[0] = 0 when both pass). Returns the number of NaN
 * outputs. `family` names the outputs ("attn_fwd" gives "attn_fwd O", "attn_fwd LSE"). An O
 * element whose reference is exactly 0 (a row without keys: slack rows) must be exactly 0. */
static inline size_t kt_check_fwd(const char *family, int kind, const e16 *o, const double *ro,
                                  size_t no, size_t w, const float *lse, const double *rl,
                                  size_t nl, kt_tol tol_o, kt_tol tol_lse, double *o_err,
                                  double *lse_err, char *msg, size_t msg_n) {
  size_t nans = 0;
  for (size_t i = 0; i < no; i++) nans += isnan(kt_get(kind, o, i)) != 0;
  for (size_t i = 0; i < nl; i++) nans += isnan(lse[i]) != 0;
  char name_o[48], name_l[48];
  snprintf(name_o, sizeof name_o, "%s O", family);
  snprintf(name_l, sizeof name_l, "%s LSE", family);
  const size_t width = w ? w : 1;
  kt_zero_exact = 1; /* O of a row without keys (slack rows included): exactly 0 */
  kt_checked ko = kt_check(name_o, kind, o, ro, no / width, width, 0, width, tol_o, 0);
  kt_zero_exact = 0;
  kt_checked kl = kt_check(name_l, KT_F32, lse, rl, 1, nl, 0, nl, tol_lse, 1);
  *o_err = no ? ko.r.worst_ratio : 0;
  *lse_err = kl.r.worst_ratio;
  if (msg) {
    msg[0] = 0;
    if (no && !cc_ok(&ko.r)) snprintf(msg, msg_n, "%s", ko.msg);
    else if (!cc_ok(&kl.r)) snprintf(msg, msg_n, "%s", kl.msg);
  }
  return nans;
}

/* ---- mutations: a bug injected into a rendered kernel by a string edit ----------------------
 * `find` must occur exactly once in the rendered source; it is overwritten in place by
 * `repl` (not longer, padded with spaces), and `define` (a one-line macro the replacement
 * uses, or NULL) overwrites the source's first block of `//` comment lines. kt_mutate_edit
 * is a kh_edit_fn: it declines (returns 0, the test then fails) and says why in `error`
 * when the pattern is missing, repeated or the texts do not fit, so a mutation can never
 * silently become a no-op. */
typedef struct kt_mutation {
  const char *name, *find, *repl, *define;
  char error[200]; /* out: why the edit was refused */
} kt_mutation;

static inline int kt_mutate_edit(char *src, void *ctx) {
  kt_mutation *m = ctx;
  const size_t nf = strlen(m->find), nr = strlen(m->repl);
  char *p = strstr(src, m->find);
  if (!p || strstr(p + 1, m->find)) {
    snprintf(m->error, sizeof m->error, "%s: pattern %s in the rendered source", m->name,
             p ? "found more than once" : "not found");
    return 0;
  }
  if (nr > nf) {
    snprintf(m->error, sizeof m->error, "%s: replacement longer than the pattern", m->name);
    return 0;
  }
  memcpy(p, m->repl, nr);
  memset(p + nr, ' ', nf - nr);
  if (m->define) {
    char *c = src;
    while (c && strncmp(c, "//", 2)) c = (c = strchr(c, '\n')) ? c + 1 : NULL;
    char *e = c;
    while (e && !strncmp(e, "//", 2)) e = (e = strchr(e, '\n')) ? e + 1 : NULL;
    const size_t nd = strlen(m->define);
    if (!c || !e || (size_t)(e - c) < nd + 1) {
      snprintf(m->error, sizeof m->error, "%s: no comment block to hold the macro", m->name);
      return 0;
    }
    memcpy(c, m->define, nd);
    memset(c + nd, ' ', (size_t)(e - c) - nd - 1); /* e[-1] stays the newline */
  }
  m->error[0] = 0;
  return 1;
}

/* A copy of a launch's outputs (n buffers: p[i], size[i] bytes), to compare the outputs of
 * later launches (other schedules) with bit for bit. */
typedef struct kt_snapshot {
  int n;
  const void *p[4];
  size_t size[4];
  void *copy[4];
} kt_snapshot;

/* Copies the buffers named in s. */
static inline void kt_snapshot_take(kt_snapshot *s) {
  for (int i = 0; i < s->n; i++) {
    s->copy[i] = malloc(s->size[i] ? s->size[i] : 1);
    memcpy(s->copy[i], s->p[i], s->size[i]);
  }
}

/* 1 when every buffer holds the copied bytes again. */
static inline int kt_snapshot_same(const kt_snapshot *s) {
  for (int i = 0; i < s->n; i++)
    if (memcmp(s->copy[i], s->p[i], s->size[i])) return 0;
  return 1;
}

static inline void kt_snapshot_free(kt_snapshot *s) {
  for (int i = 0; i < s->n; i++) free(s->copy[i]);
}

/* Max abs error over max abs reference (the max abs error when the reference is all 0) of
 * columns [c0, c1) of rows rows w wide; a NaN is counted in *nans and makes it infinite.
 * Not a pass criterion any more (a whole-tensor ratio hides one bad row): the barrier-removal
 * tests count NaN outputs with it; every check is kt_check. */
static inline double kt_rel_err_e16_cols(int fp16, const e16 *got, const double *ref, size_t rows,
                                      size_t w, size_t c0, size_t c1, size_t *nans) {
  double mr = 0, me = 0;
  for (size_t r = 0; r < rows; r++)
    for (size_t k = c0; k < c1; k++) {
      const size_t i = r * w + k;
      const double x = e16_to_float(fp16, got[i]);
      if (isnan(x)) {
        ++*nans;
        me = INFINITY;
        continue;
      }
      if (fabs(ref[i]) > mr) mr = fabs(ref[i]);
      if (fabs(x - ref[i]) > me) me = fabs(x - ref[i]);
    }
  return mr > 0 ? me / mr : me;
}

/* The same over n contiguous values. */
static inline double kt_rel_err_e16(int fp16, const e16 *got, const double *ref, size_t n,
                                 size_t *nans) {
  return kt_rel_err_e16_cols(fp16, got, ref, 1, n, 0, n, nans);
}

static inline double kt_rel_err_f32(const float *got, const double *ref, size_t n, size_t *nans) {
  double mr = 0, me = 0;
  for (size_t i = 0; i < n; i++) {
    if (isnan(got[i])) {
      ++*nans;
      me = INFINITY;
      continue;
    }
    if (fabs(ref[i]) > mr) mr = fabs(ref[i]);
    if (fabs(got[i] - ref[i]) > me) me = fabs(got[i] - ref[i]);
  }
  return mr > 0 ? me / mr : me;
}

#endif
