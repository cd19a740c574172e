@ -- mqa_bwd_dq: the absorbed-form (MQA over the latent) attention backward, the query side:
@ -- dq = d[q_lat ; q_rope] for H query heads over one shared latent head c = [c_kv ; k_rope]
@ -- (keys, d_qk = d_c + d_r columns; the values are c_kv, the same bytes). FlashAttention-2
@ -- (arXiv 2307.08691) with dQ apart from dK/dV (mqa_bwd_dkv), the heads packed into the
@ -- row dimension as FlashMLA does: q[b] is a [S_q H, d_qk] matrix, row r = i H + h.
@ --
@ -- One CTA owns block_m packed query rows, in groups of 16 with nsplit warps per group; Q
@ -- and dO are copied into shared memory once, and the latent streams through in tiles of
@ -- block_n keys (cp.async, 1 or 2 stages; causal: only tiles up to the CTA's last row's
@ -- position). Per key tile, with mma.sync.m16n8k16 (fp32 accumulation):
@ --   phase A (split by keys: warp s of a group takes block_n / nsplit keys)
@ --     S = Q K^T, dP = dO V^T     one K fragment serves both over the first d_c columns
@ --     P = exp2(S scale log2 e - LSE log2 e),  dS = scale P (dP - delta)
@ --     dS goes to shared memory as 16-bit                                -- barrier --
@ --   phase B (split by rows and columns: a warp owns mtiles 16-row m-tiles and one of
@ --   nsplit * mtiles column slices of dQ, d_qk / (nsplit mtiles) columns, so each K
@ --   fragment it loads serves mtiles m-tiles)
@ --     dQ[rows, its cols] += dS K[:, its cols]
@ -- dq is written once, 16-bit, by one thread per element: bit-reproducible.
@ -- Packed sequences (spec.varlen; VARLEN.md, mla::Varlen, batch 1): as mqa_fwd, a CTA's key
@ -- tiles run from its first row's lo to its last valid row's hi (zeros outside), a warp
@ -- skips keys outside its group's ranges, and P and dS are masked by select where the
@ -- keys are not in every row's range; a row without keys (slack) reads no LSE or delta
@ -- (whatever attn_bwd_pre wrote there) and gets dq = 0.
@ local H, DC, DR = spec.heads, spec.d_c, spec.d_r
@ local DQK = DC + DR
@ local ESIZE = elem_size(spec.dtype)
@ local PAD = 8
@ local SMEM_LIMIT = smem_limit()
@ -- fp32 accumulators per thread: dQ (mtiles x d_qk / (nsplit mtiles) / 2) + phase A's S
@ -- and dP (block_n / nsplit) or phase B's dS A fragments of one k step (4 mtiles),
@ -- whichever is larger.
@ local ACC_LIMIT = 176
@ local function accumulators(c)
@   return DQK // c.nsplit // 2 + math.max(c.block_n // c.nsplit, 4 * c.mtiles)
@ end
@ local function threads(c) return 32 * (c.block_m // 16) * c.nsplit end
@ local function smem_bytes(c)
@   return ESIZE * (c.block_m * ((DQK + PAD) + (DC + PAD)) + c.stages * c.block_n * (DQK + PAD) +
@                   c.block_m * (c.block_n + PAD))
@ end
@
@ local K = kernel {
@   family = "mqa_bwd_dq", pass = "bwd", causal = true, varlen = true, flops = { pair = spec.heads * (spec.d_c + 2 * (spec.d_c + spec.d_r)) },
@   doc = "absorbed-form MQA attention backward on tensor cores: dq = [dq_lat ; dq_rope] (deterministic)",
@   params = {
@     { name = "q",     type = "const elem_t*", shape = "[B, S_q, H, d_c + d_r]", doc = "absorbed queries [q_lat ; q_rope]" },
@     { name = "c",     type = "const elem_t*", shape = "[B, S_k, d_c + d_r]",    doc = "the latent head: keys [c_kv ; k_rope], values c_kv (the first d_c columns)" },
@     { name = "dout",  type = "const elem_t*", shape = "[B, S_q, H, d_c]",       doc = "gradient of the latent output o_lat" },
@     { name = "lse",   type = "const float*",  shape = "[B, H, S_q]",            doc = "the forward's natural-log LSE" },
@     { name = "delta", type = "const float*",  shape = "[B, H, S_q]",            doc = "rowsum(dO * O) from attn_bwd_pre (d_v = d_c)" },
@     { name = "dq",    type = "elem_t*",       shape = "[B, S_q, H, d_c + d_r]", doc = "gradient of q (16-bit, scale applied)" },
@     { name = "seqlen_q", type = "int", doc = "query tokens per batch item" },
@     { name = "seqlen_k", type = "int", doc = "key tokens per batch item" },
@     { name = "q_pos0",   type = "int", doc = "global position of query 0; causal keeps key j for query i iff j <= q_pos0 + i" },
@     { name = "softmax_scale", type = "float", doc = "mscale^2 / sqrt(d_qk of the explicit form)" },
@     table.unpack(varlen_params())
@   },
@   tunables = {
@     block_m = { values = { 16, 32, 64 }, doc = "packed query rows (i H + h) per CTA (16 per group of nsplit warps)" },
@     nsplit  = { values = { 1, 2, 4 },    doc = "warps per 16 rows: each owns d_qk/nsplit dQ columns and block_n/nsplit keys of S" },
@     block_n = { values = { 16, 32, 64 }, doc = "keys per streamed latent tile" },
@     stages  = { values = { 1, 2 },       doc = "latent tiles in shared memory (2: the next loads during the compute)" },
@     mtiles  = { values = { 1, 2 },       doc = "phase B: 16-row m-tiles per warp (2: each K fragment serves two, half the column slice)" },
@   },
@   check = function(s, c)
@     if DC % 16 ~= 0 or DR % 16 ~= 0 or DQK % (8 * c.nsplit * c.mtiles) ~= 0 then
@       return "d_c and d_r must be multiples of 16 and d_c + d_r of 8 * nsplit * mtiles (each warp's column slice)"
@     end
@     if c.block_m % (16 * c.mtiles) ~= 0 then return "block_m must be a multiple of 16 * mtiles" end
@     if c.block_n % (16 * c.nsplit) ~= 0 then return "block_n must be a multiple of 16 * nsplit (16-key slices of S per warp)" end
@     if threads(c) > 512 then return "more than 16 warps" end
@     if accumulators(c) > ACC_LIMIT then
@       return string.format("d_qk/nsplit/2 + max(block_n/nsplit, block_n/4) = %d fp32 accumulators per thread, over %d (registers would spill)",
@                            accumulators(c), ACC_LIMIT)
@     end
@     if accumulators(c) + 48 > 65536 // threads(c) then
@       return string.format("%d accumulators per thread do not fit the %d registers a thread has at %d threads",
@                            accumulators(c), math.min(255, 65536 // threads(c)), threads(c))
@     end
@     if smem_bytes(c) > SMEM_LIMIT then
@       return string.format("needs %d bytes of shared memory, over the %d-byte limit", smem_bytes(c), SMEM_LIMIT)
@     end
@   end,
@   default = function(s)
@     for _, p in ipairs({ { 64, 2, 32, 2 }, { 32, 2, 32, 2 }, { 32, 2, 32, 1 }, { 16, 1, 16, 1 }, { 16, 2, 32, 1 } }) do  -- the last fits sm_86/89's 99 KiB at d_c 512
@       for _, mt in ipairs({ 2, 1 }) do
@         local c = { block_m = p[1], nsplit = p[2], block_n = p[3], stages = p[4], mtiles = mt }
@         if DQK % (8 * c.nsplit * mt) == 0 and c.block_m % (16 * mt) == 0 and
@            accumulators(c) <= ACC_LIMIT and smem_bytes(c) <= SMEM_LIMIT then
@           return c
@         end
@       end
@     end
@     return { block_m = 16, nsplit = 4, block_n = 64, stages = 1, mtiles = 1 }
@   end,
@   name = function(s, c)
@     return string.format("mla_mqa_bwd_dq_h%d_dc%d_dr%d_%s_%s_bm%d_ns%d_bn%d_st%d_mt%d", H, DC, DR, s.dtype,
@                          s.causal and "causal" or "full", c.block_m, c.nsplit, c.block_n, c.stages, c.mtiles)
@   end,
@   launch = function(s, c)
@     return {
@       grid = { { arg = "seqlen_q", mul = H, div = c.block_m }, { value = 1 }, { arg = "batch" } },
@       block = { threads(c), 1, 1 },
@       smem = smem_bytes(c),   -- dynamic; over 48 KiB needs cudaFuncAttributeMaxDynamicSharedMemorySize
@       smem_static = 0,
@     }
@   end,
@ }
@ local C = K.config
@ -- The key tile of loop step j: packed kernels start at the CTA's first one, j0 (the
@ -- unpacked text stays "j": even a constexpr 0 + j changes the optimized code).
@ local function tile(j) return spec.varlen and ("j0 + " .. j) or tostring(j) end
// Generated by mlagen from templates/mqa_bwd_dq.cu.tpl: do not edit.
// Absorbed-form MQA attention backward, dq (deterministic), on tensor cores,
// H=${H} d_c=${DC} d_r=${DR}, ${spec.dtype}, ${spec.causal and "causal" or "non-causal"}.
// Dynamic shared memory: ${smem_bytes(C)} bytes.
#include "mla_device.cuh"

namespace {
typedef ${elem_type(spec.dtype)} elem_t;
constexpr int H = ${H};
constexpr int DC = ${DC};
constexpr int DR = ${DR};
constexpr int DQK = DC + DR;
constexpr bool CAUSAL = ${spec.causal and "true" or "false"};
constexpr bool VARLEN = ${spec.varlen and "true" or "false"};  // packed documents (cu_seqlens)
constexpr int BLOCK_M = ${C.block_m};  // packed query rows per CTA
constexpr int NSPLIT = ${C.nsplit};    // warps per 16 rows
constexpr int NUM_WARPS = BLOCK_M / 16 * NSPLIT;
constexpr int NUM_THREADS = 32 * NUM_WARPS;
constexpr int BLOCK_N = ${C.block_n};  // keys per streamed tile
constexpr int STAGES = ${C.stages};
constexpr int PAD = ${PAD};
constexpr int QS = DQK + PAD;      // smem row strides (elements), odd 16-byte units per row
constexpr int OS = DC + PAD;
constexpr int KS = DQK + PAD;
constexpr int DSS = BLOCK_N + PAD;  // dS rows (queries x keys)
constexpr int K_ELEMS = BLOCK_N * KS;
constexpr int NS = BLOCK_N / NSPLIT;  // phase A: keys of S per warp
constexpr int MT = ${C.mtiles};       // phase B: 16-row m-tiles per warp
constexpr int NCS = NSPLIT * MT;     // phase B: column slices
constexpr int QCS = DQK / NCS;       // phase B: dQ columns per warp
constexpr int VEC = mla::CHUNK;
static_assert(DC % 16 == 0 && DR % 16 == 0 && QCS % 8 == 0, "column slices");
static_assert(BLOCK_M % (16 * MT) == 0 && NS % 16 == 0, "tile shape");

}  // namespace

${kernel_open(K, "NUM_THREADS")}
@ if not spec.varlen then
  constexpr const int* cu_seqlens = nullptr;  // not packed: the code using them is discarded
  constexpr int n_seqs = 0;
@ end
  elem_t* const sQ = reinterpret_cast<elem_t*>(smem);  // [BLOCK_M][QS]
  elem_t* const sO = sQ + BLOCK_M * QS;                 // [BLOCK_M][OS]: dO
  elem_t* const sK = sO + BLOCK_M * OS;                 // STAGES x [BLOCK_N][KS]; V = first DC columns
  elem_t* const sDS = sK + STAGES * K_ELEMS;            // [BLOCK_M][DSS]: scale dS

${thread_prologue()}
  const int sp = warp % NSPLIT;           // phase A: the warp's slice of the key tile
  const int wrow = (warp / NSPLIT) * 16;  // its group's first row in the CTA
  const int m0 = blockIdx.x * BLOCK_M;
  const int b = blockIdx.z;
  const int nrows = seqlen_q * H;  // packed query rows r = i H + h
  const int r0 = m0 + wrow;        // the group's first packed row
  const int r0_last = min(r0 + 15, nrows - 1);
  const int cs = warp % NCS;                  // phase B: its column slice
  const int brow = (warp / NCS) * (MT * 16);  // and first row of its MT m-tiles
  const int rb0 = m0 + brow;
  const int rb_last = min(rb0 + MT * 16 - 1, nrows - 1);
  const float scale_log2 = softmax_scale * mla::LOG2E;

  const int q_last = (min(m0 + BLOCK_M, nrows) - 1) / H;  // the CTA's last query position
  int n_tiles = mla::visible_key_tiles<CAUSAL, BLOCK_N>(seqlen_k, q_pos0, q_last);
  int j0 = 0;            // the CTA's key tiles are j0 .. j0 + n_tiles - 1
  int k_end = seqlen_k;  // keys from k_end on load as zeros
  mla::RowRanges kr;     // packed: the keys of this thread's rows g, g + 8 and of its group's
  if constexpr (VARLEN) {
    // As mqa_fwd: the CTA's keys from its first row's lo to its last valid row's hi, zeros
    // outside (NaN in slack keys cannot reach dS K); its rows' ranges mask elements.
    const mla::Varlen vl{cu_seqlens, n_seqs};
    mla::varlen_key_tiles<CAUSAL, BLOCK_N>(vl, mla::QueryPos{q_pos0, 0, q_pos0}, m0 / H, q_last, seqlen_k, j0, n_tiles, k_end);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = r0 + g + 8 * r;
      kr.set_keys<CAUSAL>(r, vl, row < nrows, q_pos0 + row / H, seqlen_k);
    }
    kr.warp_reduce();  // the warp's 16 rows are its group's
  }

  // Q and dO rows (zero past the last row).
  auto load_q = [&]() {
    mla::cp_async_tile_dealt<BLOCK_M, DQK, QS, NUM_THREADS, 4>(sQ, tid, m0, nrows,
                                                               [&](int i) { return q + ((size_t)b * nrows + i) * DQK; });
    mla::cp_async_tile_dealt<BLOCK_M, DC, OS, NUM_THREADS, 4>(sO, tid, m0, nrows,
                                                              [&](int i) { return dout + ((size_t)b * nrows + i) * DC; });
  };

  // Key tile `tile` into stage st (zero past seqlen_k; packed: past the CTA's keys).
  auto load_k = [&](int tile, int st) {
    const int n0 = tile * BLOCK_N;
    mla::cp_async_tile_dealt<BLOCK_N, DQK, KS, NUM_THREADS, 4>(sK + st * K_ELEMS, tid, n0, k_end,
                                                             [&](int j) { return c + ((size_t)b * seqlen_k + j) * DQK; });
  };

  // This thread's rows r0 + g and r0 + g + 8: LSE in base 2 (+inf: P = 0), delta, position.
  // Packed: a row without keys (slack) reads neither (whatever attn_bwd_pre wrote there).
  float lse2[2], dlt[2];
  int pos[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = r0 + g + 8 * r;
    lse2[r] = mla::pos_inf();
    dlt[r] = 0.f;
    pos[r] = 0;
    bool has_keys = true;
    if constexpr (VARLEN) has_keys = kr.hi[r] > kr.lo[r];
    if (row < nrows && has_keys) {
      const int i = row / H, h = row - i * H;
      const size_t li = ((size_t)b * H + h) * seqlen_q + i;
      const float x = lse[li];
      lse2[r] = mla::lse_log2(x);
      dlt[r] = delta[li];
      pos[r] = q_pos0 + i;
    }
  }

  // ldmatrix lane offsets: A from [row][k] (Q, dO: the group's rows; dS), B from [n][k]
  // (K = V rows), B by .trans from [k][n] (K as [key][dim]).
  const int a_r = mla::ldm_a_row(lane), a_c = mla::ldm_a_col(lane);
  const int b_r = mla::ldm_b_row(lane), b_c = mla::ldm_b_col(lane);
  const int bt_r = mla::ldm_a_row(lane), bt_c = mla::ldm_a_col(lane);
  const int qa_off = (wrow + a_r) * QS + a_c;
  const int oa_off = (wrow + a_r) * OS + a_c;
  const int da_off = (brow + a_r) * DSS + a_c;
  const int kb_off = b_r * KS + b_c;
  const int kt_off = bt_r * KS + bt_c;
  const int ncol = sp * NS;    // phase A: the warp's first key in the tile
  const int col = cs * QCS;    // phase B: its first dQ column

  float dqacc[MT][QCS / 8][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int d = 0; d < QCS / 8; ++d)
#pragma unroll
      for (int e = 0; e < 4; ++e) dqacc[m][d][e] = 0.f;

  if (n_tiles > 0) {
    load_q();
    load_k(${tile(0)}, 0);
  }
  mla::cp_async_commit();  // Q, dO and key tile 0

  for (int j = 0; j < n_tiles; ++j) {
    const int st = STAGES == 2 ? (j & 1) : 0;
    const int n0 = (${tile("j")}) * BLOCK_N;
@ if C.stages == 1 then
    if (j > 0) {
      __syncthreads();  // every warp is done with the last tile
      load_k(${tile("j")}, 0);
      mla::cp_async_commit();
    }
@ end
    mla::cp_async_wait<0>();
    __syncthreads();  // tile j (and Q, dO) in; every warp done with tile j - 1
@ if C.stages == 2 then
    if (j + 1 < n_tiles) load_k(${tile("j + 1")}, st ^ 1);
    mla::cp_async_commit();  // the next tile loads during this one
@ end
    const elem_t* const tk = sK + st * K_ELEMS;

    // Phase A: S and dP of the group's 16 rows for this warp's NS keys.
    {
      const int ks0 = n0 + ncol;
      bool active = r0 < nrows && ks0 < seqlen_k &&
                    (!CAUSAL || ks0 <= q_pos0 + r0_last / H);
      if constexpr (VARLEN) active = kr.meets(ks0, ks0 + NS);
      unsigned* const d_lo = reinterpret_cast<unsigned*>(sDS + (wrow + g) * DSS + ncol + 2 * t);
      unsigned* const d_hi = reinterpret_cast<unsigned*>(sDS + (wrow + g + 8) * DSS + ncol + 2 * t);
      if (active) {
        float s[NS / 8][4], dp[NS / 8][4];
#pragma unroll
        for (int n = 0; n < NS / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[n][e] = 0.f, dp[n][e] = 0.f;
        // S = Q K^T and dP = dO V^T share the K fragment over the first DC columns.
#pragma unroll 2
        for (int kk = 0; kk < DC / 16; ++kk) {
          unsigned a[4], ao[4];
          mla::ldmatrix_x4(a, sQ + qa_off + kk * 16);
          mla::ldmatrix_x4(ao, sO + oa_off + kk * 16);
#pragma unroll
          for (int np = 0; np < NS / 16; ++np) {
            unsigned bk[4];
            mla::ldmatrix_x4(bk, tk + kb_off + (ncol + np * 16) * KS + kk * 16);
            mla::mma<elem_t>(s[2 * np], a, bk, s[2 * np]);
            mla::mma<elem_t>(s[2 * np + 1], a, bk + 2, s[2 * np + 1]);
            mla::mma<elem_t>(dp[2 * np], ao, bk, dp[2 * np]);
            mla::mma<elem_t>(dp[2 * np + 1], ao, bk + 2, dp[2 * np + 1]);
          }
        }
#pragma unroll
        for (int kk = DC / 16; kk < DQK / 16; ++kk) {
          unsigned a[4];
          mla::ldmatrix_x4(a, sQ + qa_off + kk * 16);
#pragma unroll
          for (int np = 0; np < NS / 16; ++np) {
            unsigned bk[4];
            mla::ldmatrix_x4(bk, tk + kb_off + (ncol + np * 16) * KS + kk * 16);
            mla::mma<elem_t>(s[2 * np], a, bk, s[2 * np]);
            mla::mma<elem_t>(s[2 * np + 1], a, bk + 2, s[2 * np + 1]);
          }
        }
        // P and scale dS: rows r0 + g (+8), columns keys ks0 + n*8 + 2t (+1). Packed: masked
        // where the keys are not in every row's range, P and dS by select (NaN scores of
        // slack rows, or their delta, stay out).
        bool edge = ks0 + NS > seqlen_k || (CAUSAL && ks0 + NS - 1 > q_pos0 + r0 / H);
        if constexpr (VARLEN) edge = !kr.inside(ks0, ks0 + NS);
#pragma unroll
        for (int n = 0; n < NS / 8; ++n) {
          float ds[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float p = exp2f(s[n][e] * scale_log2 - lse2[e >> 1]);
            bool hidden = false;
            if (edge) {
              if constexpr (VARLEN)
                hidden = kr.hides(e >> 1, ks0 + n * 8 + 2 * t + (e & 1));
              else
                hidden = mla::key_hidden<CAUSAL>(ks0 + n * 8 + 2 * t + (e & 1), pos[e >> 1], seqlen_k, 0);
              if (hidden) p = 0.f;
            }
            ds[e] = softmax_scale * p * (dp[n][e] - dlt[e >> 1]);
            if constexpr (VARLEN) ds[e] = hidden ? 0.f : ds[e];
          }
          d_lo[n * 4] = mla::pack2<elem_t>(ds[0], ds[1]);
          d_hi[n * 4] = mla::pack2<elem_t>(ds[2], ds[3]);
        }
      } else {
#pragma unroll
        for (int n = 0; n < NS / 8; ++n) d_lo[n * 4] = d_hi[n * 4] = 0u;
      }
    }
    __syncthreads();  // dS of the whole tile in

    // Phase B: dQ[rows, col ..] += dS K[:, col ..] for the warp's MT 16-row m-tiles.
    if (rb0 < nrows && (!CAUSAL || n0 <= q_pos0 + rb_last / H)) {
#pragma unroll
      for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
        unsigned da[MT][4];
#pragma unroll
        for (int m = 0; m < MT; ++m) mla::ldmatrix_x4(da[m], sDS + da_off + m * 16 * DSS + kk * 16);
#pragma unroll
        for (int cp = 0; cp < QCS / 16; ++cp) {
          unsigned bk[4];
          mla::ldmatrix_x4_trans(bk, tk + kt_off + kk * 16 * KS + col + cp * 16);
#pragma unroll
          for (int m = 0; m < MT; ++m) {
            mla::mma<elem_t>(dqacc[m][2 * cp], da[m], bk, dqacc[m][2 * cp]);
            mla::mma<elem_t>(dqacc[m][2 * cp + 1], da[m], bk + 2, dqacc[m][2 * cp + 1]);
          }
        }
        if (QCS % 16 != 0) {  // an 8-column tail
          unsigned bk[2];
          mla::ldmatrix_x2_trans(bk, tk + kt_off + kk * 16 * KS + col + QCS - 8);
#pragma unroll
          for (int m = 0; m < MT; ++m) mla::mma<elem_t>(dqacc[m][QCS / 8 - 1], da[m], bk, dqacc[m][QCS / 8 - 1]);
        }
      }
    }
  }
  mla::cp_async_wait<0>();  // nothing in flight at exit (the groups left are empty)

  // dq (scale is already in dS), straight from the fragments; rows without keys get 0.
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = rb0 + m * 16 + g + 8 * r;
      if (row < nrows) {
        elem_t* const dst = dq + ((size_t)b * nrows + row) * DQK + col + 2 * t;
#pragma unroll
        for (int d = 0; d < QCS / 8; ++d)
          *reinterpret_cast<unsigned*>(dst + d * 8) = mla::pack2<elem_t>(dqacc[m][d][2 * r], dqacc[m][d][2 * r + 1]);
      }
    }
}
