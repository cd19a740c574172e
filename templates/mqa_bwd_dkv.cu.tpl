@ -- mqa_bwd_dkv: the absorbed-form (MQA over the latent) attention backward, the key side:
@ -- dc = d[c_kv ; k_rope] for one shared latent head that is both the keys [c_kv ; k_rope]
@ -- (d_qk = d_c + d_r columns) and, with the same bytes, the values c_kv (d_c columns).
@ -- FlashAttention-2 (arXiv 2307.08691), Algorithm 2, with the H query heads packed into
@ -- the row dimension as FlashMLA does: q[b] is a [S_q H, d_qk] matrix, row r = i H + h.
@ --
@ -- One CTA owns block_n keys of one batch item and loops over ALL packed query rows (causal:
@ -- only tiles with a row whose position reaches the CTA's first key), block_m rows per
@ -- streamed tile (cp.async, one or two stages). Keys are handled in groups of 16 with
@ -- nsplit warps per group. Per query tile, with mma.sync.m16n8k16 (fp32 accumulation):
@ --   phase A (split by query rows: warp s of a group takes block_m / nsplit rows)
@ --     S^T  = K Q^T, dP^T = V dO^T      one K fragment serves both for the d_c columns
@ --     P^T  = exp2(S^T scale log2 e - LSE log2 e),  dS^T = scale P^T (dP^T - delta)
@ --     P^T and dS^T go to shared memory as 16-bit                      -- barrier --
@ --   phase B (split by keys and columns: a warp owns mtiles 16-key m-tiles and one of
@ --   nsplit * mtiles column slices: d_c / (nsplit mtiles) columns of dC, d_r / (nsplit
@ --   mtiles) of dK_rope, so every warp has the same work and each B fragment (dO, Q) it
@ --   loads serves mtiles m-tiles)
@ --     dC[keys, its cols]      += P^T dO[:, its cols] + dS^T Q_lat[:, its cols]
@ --     dK_rope[keys, its cols] += dS^T Q_rope[:, its cols]
@ -- dc = [dC ; dK_rope] is written once, 16-bit, by the one CTA that owns the key: every
@ -- element is one thread's fp32 sum over the query tiles in order, so the result is
@ -- bit-reproducible (deterministic by construction, no atomics).
@ -- Packed sequences (spec.varlen; VARLEN.md, mla::Varlen, batch 1): a CTA's query tiles run
@ -- from its first key's first query row to its last valid key's last (Varlen::queries);
@ -- rows past them load as zeros with LSE +inf and delta 0 (never read), a warp skips rows
@ -- outside its group's keys' ranges, and P^T and dS^T are masked by select where the rows
@ -- are not in every key's range. A key no query sees (slack among them) gets dc = 0.
@ --
@ -- qsplit > 1 is the fast, non-deterministic option for few key tiles (short S_k, small
@ -- batch): gridDim.y = qsplit CTAs share a key tile, CTA y taking the query tiles y,
@ -- y + qsplit, ... (interleaved, so that causal work stays balanced), and each adds its
@ -- fp32 partial sums into dc_accum with atomicAdd (zeroed first; dq_convert generated with
@ -- heads = 1, d_n = d_c, d_r = d_r and seqlen_q = S_k rounds it to 16 bits). The bits then
@ -- depend on the order the atomics land in.
@ local H, DC, DR = spec.heads, spec.d_c, spec.d_r
@ local DQK = DC + DR
@ local ESIZE = elem_size(spec.dtype)
@ local PAD = 8
@ local SMEM_LIMIT = smem_limit()
@ local QSPLIT = spec.config ~= nil and spec.config.qsplit or 1
@ -- fp32 accumulators per thread: dC and dK_rope (mtiles x d_qk / (nsplit mtiles) / 2) +
@ -- phase A's S^T and dP^T (block_m / nsplit) or phase B's P^T and dS^T A fragments of one
@ -- k step (8 mtiles registers), whichever is larger.
@ local ACC_LIMIT = 176
@ local function accumulators(c) return DQK // c.nsplit // 2 + math.max(c.block_m // c.nsplit, 8 * c.mtiles) end
@ local function threads(c) return 32 * (c.block_n // 16) * c.nsplit end
@ local function smem_bytes(c)
@   local e = c.block_n * (DQK + PAD) + c.stages * c.block_m * ((DQK + PAD) + (DC + PAD)) +
@             2 * c.block_n * (c.block_m + PAD)
@   return ESIZE * e + 4 * 2 * c.stages * c.block_m
@ end
@
@ local K = kernel {
@   family = "mqa_bwd_dkv", pass = "bwd", causal = true, varlen = true, interface = { "qsplit" }, flops = { pair = 4 * spec.heads * ((spec.d_c + spec.d_r) + spec.d_c) },
@   doc = "absorbed-form MQA attention backward on tensor cores: dc = [dc_kv ; dk_rope] of the shared latent head, summed over heads (deterministic)",
@   params = {
@     { name = "q",     type = "const elem_t*", shape = "[B, S_q, H, d_c + d_r]", doc = "absorbed queries [q_lat ; q_rope]" },
@     { name = "c",     type = "const elem_t*", shape = "[B, S_k, d_c + d_r]",    doc = "the latent head: keys [c_kv ; k_rope], values c_kv (the first d_c columns)" },
@     { name = "dout",  type = "const elem_t*", shape = "[B, S_q, H, d_c]",       doc = "gradient of the latent output o_lat" },
@     { name = "lse",   type = "const float*",  shape = "[B, H, S_q]",            doc = "the forward's natural-log LSE" },
@     { name = "delta", type = "const float*",  shape = "[B, H, S_q]",            doc = "rowsum(dO * O) from attn_bwd_pre (d_v = d_c)" },
@     QSPLIT == 1 and
@     { name = "dc",    type = "elem_t*",       shape = "[B, S_k, d_c + d_r]",    doc = "gradient of c: [dc_kv (as key and value) ; dk_rope], summed over heads" } or
@     { name = "dc_accum", type = "float*",     shape = "[B, S_k, d_c + d_r]",    doc = "qsplit > 1: gradient of c (fp32), added atomically: must be zeroed first" },
@     { name = "seqlen_q", type = "int", doc = "query tokens per batch item" },
@     { name = "seqlen_k", type = "int", doc = "key tokens per batch item" },
@     { name = "q_pos0",   type = "int", doc = "global position of query 0; causal keeps key j for query i iff j <= q_pos0 + i" },
@     { name = "softmax_scale", type = "float", doc = "mscale^2 / sqrt(d_qk of the explicit form)" },
@     table.unpack(varlen_params())
@   },
@   tunables = {
@     block_n = { values = { 16, 32, 64 }, doc = "keys per CTA (16 per group of nsplit warps)" },
@     nsplit  = { values = { 1, 2, 4 },    doc = "warps per 16 keys: each owns d_c/nsplit + d_r/nsplit accumulator columns and block_m/nsplit rows of S^T" },
@     block_m = { values = { 16, 32, 64 }, doc = "packed query rows (i H + h) per streamed tile" },
@     stages  = { values = { 1, 2 },       doc = "query tiles in shared memory (2: the next loads during the compute)" },
@     mtiles  = { values = { 1, 2 },       doc = "phase B: 16-key m-tiles per warp (2: each dO / Q fragment serves two, half the column slice)" },
@     qsplit  = { values = { 1, 2, 4, 8 }, doc = "CTAs per key tile, splitting the query tiles; > 1: fp32 atomics into dc_accum (not deterministic)" },
@   },
@   check = function(s, c)
@     local ncs = c.nsplit * c.mtiles
@     if DC % (8 * ncs) ~= 0 or DR % (8 * ncs) ~= 0 or DC % 16 ~= 0 or DR % 16 ~= 0 then
@       return "d_c and d_r must be multiples of 16 and of 8 * nsplit * mtiles (each warp's column slices)"
@     end
@     if c.block_n % (16 * c.mtiles) ~= 0 then return "block_n must be a multiple of 16 * mtiles" end
@     if c.block_m % (16 * c.nsplit) ~= 0 then return "block_m must be a multiple of 16 * nsplit (16-row slices of S^T per warp)" end
@     if threads(c) > 512 then return "more than 16 warps" end
@     if accumulators(c) > ACC_LIMIT then
@       return string.format("d_qk/nsplit/2 + block_m/2 = %d fp32 accumulators per thread, over %d (registers would spill)",
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
@     for _, p in ipairs({ { 64, 2, 32, 2 }, { 64, 2, 32, 1 }, { 32, 2, 32, 1 }, { 32, 1, 16, 1 }, { 16, 2, 32, 1 } }) do  -- the last fits sm_86/89's 99 KiB at d_c 512
@       for _, mt in ipairs({ 2, 1 }) do
@         local c = { block_n = p[1], nsplit = p[2], block_m = p[3], stages = p[4], mtiles = mt, qsplit = 1 }
@         local ncs = c.nsplit * mt
@         if DC % (8 * ncs) == 0 and DR % (8 * ncs) == 0 and c.block_n % (16 * mt) == 0 and accumulators(c) <= ACC_LIMIT and
@            smem_bytes(c) <= SMEM_LIMIT then return c end
@       end
@     end
@     return { block_n = 16, nsplit = 4, block_m = 64, stages = 1, mtiles = 1, qsplit = 1 }
@   end,
@   name = function(s, c)
@     return string.format("mla_mqa_bwd_dkv_h%d_dc%d_dr%d_%s_%s_bn%d_ns%d_bm%d_st%d_mt%d", H, DC, DR, s.dtype,
@                          s.causal and "causal" or "full", c.block_n, c.nsplit, c.block_m, c.stages, c.mtiles)
@            .. (c.qsplit > 1 and string.format("_qs%d", c.qsplit) or "")
@   end,
@   launch = function(s, c)
@     return {
@       grid = { { arg = "seqlen_k", div = c.block_n }, { value = c.qsplit }, { arg = "batch" } },
@       block = { threads(c), 1, 1 },
@       smem = smem_bytes(c),   -- dynamic; over 48 KiB needs cudaFuncAttributeMaxDynamicSharedMemorySize
@       smem_static = 0,
@     }
@   end,
@ }
@ local C = K.config
@ assert(QSPLIT == C.qsplit)
// Generated by mlagen from templates/mqa_bwd_dkv.cu.tpl: do not edit.
// Absorbed-form MQA attention backward (dc = [dc_kv ; dk_rope], deterministic) on tensor cores,
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
constexpr int BLOCK_N = ${C.block_n};  // keys per CTA
constexpr int NSPLIT = ${C.nsplit};    // warps per 16 keys
constexpr int NUM_WARPS = BLOCK_N / 16 * NSPLIT;
constexpr int NUM_THREADS = 32 * NUM_WARPS;
constexpr int BLOCK_M = ${C.block_m};  // packed query rows per streamed tile
constexpr int STAGES = ${C.stages};
constexpr int QSPLIT = ${C.qsplit};    // CTAs per key tile (> 1: atomics into dc_accum)
constexpr int PAD = ${PAD};
constexpr int KS = DQK + PAD;      // smem row strides (elements), odd 16-byte units per row
constexpr int QS = DQK + PAD;
constexpr int OS = DC + PAD;       // dO rows
constexpr int PS = BLOCK_M + PAD;  // P^T and dS^T rows (keys x queries)
constexpr int Q_ELEMS = BLOCK_M * QS;
constexpr int O_ELEMS = BLOCK_M * OS;
constexpr int MS = BLOCK_M / NSPLIT;  // phase A: query rows of S^T per warp
constexpr int MT = ${C.mtiles};        // phase B: 16-key m-tiles per warp
constexpr int NCS = NSPLIT * MT;      // phase B: column slices
constexpr int DCS = DC / NCS;         // phase B: dC columns per warp
constexpr int DRS = DR / NCS;         // phase B: dK_rope columns per warp
constexpr int VEC = mla::CHUNK;
static_assert(DC % 16 == 0 && DR % 16 == 0 && DCS % 8 == 0 && DRS % 8 == 0, "column slices");
static_assert(BLOCK_N % (16 * MT) == 0 && MS % 16 == 0, "tile shape");

}  // namespace

${kernel_open(K, "NUM_THREADS")}
@ if not spec.varlen then
  constexpr const int* cu_seqlens = nullptr;  // not packed: the code using them is discarded
  constexpr int n_seqs = 0;
@ end
  elem_t* const sK = reinterpret_cast<elem_t*>(smem);  // [BLOCK_N][KS]; V = its first DC columns
  elem_t* const sQ = sK + BLOCK_N * KS;                 // STAGES x [BLOCK_M][QS]
  elem_t* const sO = sQ + STAGES * Q_ELEMS;             // STAGES x [BLOCK_M][OS]: dO
  elem_t* const sP = sO + STAGES * O_ELEMS;             // [BLOCK_N][PS]: P^T
  elem_t* const sDS = sP + BLOCK_N * PS;                // [BLOCK_N][PS]: scale dS^T
  float* const sLse = reinterpret_cast<float*>(sDS + BLOCK_N * PS);  // STAGES x [BLOCK_M]
  float* const sDelta = sLse + STAGES * BLOCK_M;                      // STAGES x [BLOCK_M]

${thread_prologue()}
  const int sp = warp % NSPLIT;  // phase A: the warp's slice of the query rows
  const int wrow = (warp / NSPLIT) * 16;  // phase A: its group's first key in the tile
  const int cs = warp % NCS;                     // phase B: its column slice
  const int bkey = (warp / NCS) * (MT * 16);     // and first key of its MT m-tiles
  const int n0 = blockIdx.x * BLOCK_N;
  const int k0 = n0 + wrow;    // phase A: its group's first key
  const int kb0 = n0 + bkey;   // phase B: its first key
  const int b = blockIdx.z;
  const int nrows = seqlen_q * H;  // packed query rows r = i H + h
  const float scale_log2 = softmax_scale * mla::LOG2E;

  // Query tiles with a row that sees a key of this tile: causal, from row (n0 - q_pos0) H;
  // this CTA takes every QSPLIT-th of them from the blockIdx.y-th: tile(it).
  int m_first = (CAUSAL ? max(0, n0 - q_pos0) * H / BLOCK_M : 0) + (int)blockIdx.y;
  int m_tiles = (nrows + BLOCK_M - 1) / BLOCK_M;
  int row_end = nrows;  // query rows from row_end on load as zeros (LSE +inf, delta 0)
  mla::RowRanges qr;    // packed: the query positions that see keys k0 + g, k0 + g + 8 and its group's
  if constexpr (VARLEN) {
    // The query rows that see a key of the CTA: from its first key's first query to its
    // last valid key's last (monotone in the key; a slack key is seen by none). Rows past
    // them (slack rows among them) load as zeros, so NaN there cannot reach P^T dO or
    // dS^T Q; the keys' own ranges mask element by element.
    const mla::Varlen vl{cu_seqlens, n_seqs};
    const int k_last = min(min(n0 + BLOCK_N, seqlen_k), cu_seqlens[n_seqs]) - 1;
    int lo = 0, hi = 0, unused;
    if (n0 <= k_last) {
      vl.queries<CAUSAL>(n0, lo, unused);
      vl.queries<CAUSAL>(k_last, unused, hi);
    }
    const int row_lo = min(max(lo - q_pos0, 0), seqlen_q) * H;
    row_end = min(max(hi - q_pos0, 0), seqlen_q) * H;
    m_first = row_lo / BLOCK_M + (int)blockIdx.y;
    m_tiles = row_end > row_lo ? (row_end + BLOCK_M - 1) / BLOCK_M : 0;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = k0 + g + 8 * r;
      qr.lo[r] = qr.hi[r] = 0;
      if (key < seqlen_k) vl.queries<CAUSAL>(key, qr.lo[r], qr.hi[r]);
    }
    qr.warp_reduce();  // the warp's 16 rows of S^T are its group's keys
  }
  const int n_iter = m_tiles > m_first ? (m_tiles - m_first + QSPLIT - 1) / QSPLIT : 0;
  auto tile = [&](int it) { return m_first + it * QSPLIT; };

  // The key tile (zero past seqlen_k).
  auto load_k = [&]() {
    mla::cp_async_tile_dealt<BLOCK_N, DQK, KS, NUM_THREADS, BLOCK_N * DQK>(sK, tid, n0, seqlen_k,
                                                             [&](int j) { return c + ((size_t)b * seqlen_k + j) * DQK; });
  };

  // Query tile mt into stage st: Q and dO rows (cp.async, zero past the last row; packed:
  // past row_end), LSE in base 2 (+inf past it or for a row without keys: P = 0) and delta
  // (plain stores, published by the barrier that follows the tile's wait).
  auto load_q = [&](int mt, int st) {
    const int m0 = mt * BLOCK_M;
    mla::cp_async_tile_dealt<BLOCK_M, DQK, QS, NUM_THREADS, 4>(sQ + st * Q_ELEMS, tid, m0, row_end,
                                                               [&](int i) { return q + ((size_t)b * nrows + i) * DQK; });
    mla::cp_async_tile_dealt<BLOCK_M, DC, OS, NUM_THREADS, 4>(sO + st * O_ELEMS, tid, m0, row_end,
                                                              [&](int i) { return dout + ((size_t)b * nrows + i) * DC; });
    for (int r = tid; r < BLOCK_M; r += NUM_THREADS) {
      const int row = m0 + r;
      float l = mla::pos_inf(), dl = 0.f;
      if (row < row_end) {
        const int i = row / H, h = row - i * H;
        const size_t li = ((size_t)b * H + h) * seqlen_q + i;
        const float x = lse[li];
        l = mla::lse_log2(x);
        dl = delta[li];
      }
      sLse[st * BLOCK_M + r] = l;
      sDelta[st * BLOCK_M + r] = dl;
    }
  };

  // ldmatrix lane offsets (elements). A operands from [row][k] tiles: K (= V) rows of the
  // group's 16 keys, and P^T, dS^T rows; B from [n][k] tiles: Q, dO rows (16 per x4); B by
  // .trans from [k][n] tiles: Q, dO as [query][dim].
  const int a_r = mla::ldm_a_row(lane), a_c = mla::ldm_a_col(lane);
  const int b_r = mla::ldm_b_row(lane), b_c = mla::ldm_b_col(lane);
  const int bt_r = mla::ldm_a_row(lane), bt_c = mla::ldm_a_col(lane);
  const int ka_off = (wrow + a_r) * KS + a_c;
  const int pa_off = (bkey + a_r) * PS + a_c;
  const int qb_off = b_r * QS + b_c;
  const int ob_off = b_r * OS + b_c;
  const int qt_off = bt_r * QS + bt_c;
  const int ot_off = bt_r * OS + bt_c;
  const int mrow = sp * MS;  // phase A: the warp's first query row in the tile
  const int col_c = cs * DCS;       // phase B: its first dC column
  const int col_r = DC + cs * DRS;  // and first dK_rope column

  float dcacc[MT][DCS / 8][4];
  float dracc[MT][DRS / 8][4];
#pragma unroll
  for (int m = 0; m < MT; ++m) {
#pragma unroll
    for (int d = 0; d < DCS / 8; ++d)
#pragma unroll
      for (int e = 0; e < 4; ++e) dcacc[m][d][e] = 0.f;
#pragma unroll
    for (int d = 0; d < DRS / 8; ++d)
#pragma unroll
      for (int e = 0; e < 4; ++e) dracc[m][d][e] = 0.f;
  }

  if (n_iter > 0) {
    load_k();
    load_q(tile(0), 0);
  }
  mla::cp_async_commit();  // the key tile and query tile 0

  for (int it = 0; it < n_iter; ++it) {
    const int st = STAGES == 2 ? (it & 1) : 0;
    const int m0 = tile(it) * BLOCK_M;
@ if C.stages == 1 then
    if (it > 0) {
      __syncthreads();  // every warp is done with the last tile
      load_q(tile(it), 0);
      mla::cp_async_commit();
    }
@ end
    mla::cp_async_wait<0>();
    __syncthreads();  // tile it (and the key tile) in; every warp done with tile it - 1
@ if C.stages == 2 then
    if (it + 1 < n_iter) load_q(tile(it + 1), st ^ 1);
    mla::cp_async_commit();  // the next tile loads during this one
@ end
    const elem_t* const tq = sQ + st * Q_ELEMS;
    const elem_t* const to = sO + st * O_ELEMS;
    const float* const tl = sLse + st * BLOCK_M;
    const float* const td = sDelta + st * BLOCK_M;
    const int row_last = min(m0 + BLOCK_M, nrows) - 1;  // the tile's last valid row

    // Phase A: this warp's MS rows of S^T and dP^T for its group's 16 keys.
    {
      const int r0 = m0 + mrow;
      bool active = k0 < seqlen_k && r0 < nrows &&
                    (!CAUSAL || k0 <= q_pos0 + min(r0 + MS - 1, nrows - 1) / H);
      // Packed: the positions of the warp's rows meet the queries of one of its keys.
      if constexpr (VARLEN)
        active = r0 < nrows && qr.meets(q_pos0 + r0 / H, q_pos0 + min(r0 + MS - 1, nrows - 1) / H + 1);
      unsigned* const p_lo = reinterpret_cast<unsigned*>(sP + (wrow + g) * PS + mrow + 2 * t);
      unsigned* const p_hi = reinterpret_cast<unsigned*>(sP + (wrow + g + 8) * PS + mrow + 2 * t);
      unsigned* const d_lo = reinterpret_cast<unsigned*>(sDS + (wrow + g) * PS + mrow + 2 * t);
      unsigned* const d_hi = reinterpret_cast<unsigned*>(sDS + (wrow + g + 8) * PS + mrow + 2 * t);
      if (active) {
        float s[MS / 8][4], dpt[MS / 8][4];
#pragma unroll
        for (int n = 0; n < MS / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[n][e] = 0.f, dpt[n][e] = 0.f;
        // S^T = K Q^T and dP^T = V dO^T share the K fragment over the first DC columns.
#pragma unroll 2
        for (int kk = 0; kk < DC / 16; ++kk) {
          unsigned a[4];
          mla::ldmatrix_x4(a, sK + ka_off + kk * 16);
#pragma unroll
          for (int np = 0; np < MS / 16; ++np) {
            unsigned bq[4], bo[4];
            mla::ldmatrix_x4(bq, tq + qb_off + (mrow + np * 16) * QS + kk * 16);
            mla::ldmatrix_x4(bo, to + ob_off + (mrow + np * 16) * OS + kk * 16);
            mla::mma<elem_t>(s[2 * np], a, bq, s[2 * np]);
            mla::mma<elem_t>(s[2 * np + 1], a, bq + 2, s[2 * np + 1]);
            mla::mma<elem_t>(dpt[2 * np], a, bo, dpt[2 * np]);
            mla::mma<elem_t>(dpt[2 * np + 1], a, bo + 2, dpt[2 * np + 1]);
          }
        }
#pragma unroll
        for (int kk = DC / 16; kk < DQK / 16; ++kk) {
          unsigned a[4];
          mla::ldmatrix_x4(a, sK + ka_off + kk * 16);
#pragma unroll
          for (int np = 0; np < MS / 16; ++np) {
            unsigned bq[4];
            mla::ldmatrix_x4(bq, tq + qb_off + (mrow + np * 16) * QS + kk * 16);
            mla::mma<elem_t>(s[2 * np], a, bq, s[2 * np]);
            mla::mma<elem_t>(s[2 * np + 1], a, bq + 2, s[2 * np + 1]);
          }
        }
        // P^T and scale dS^T: rows are keys k0 + g (+8), columns rows r0 + n*8 + 2t (+1).
        // Packed: masked unless the rows' positions are in every key's range, P^T and dS^T
        // by select (NaN scores of slack keys stay out).
        bool edge = k0 + 15 >= seqlen_k || r0 + MS > nrows ||
                    (CAUSAL && k0 + 15 > q_pos0 + r0 / H);
        if constexpr (VARLEN)
          edge = r0 + MS > nrows || !qr.inside(q_pos0 + r0 / H, q_pos0 + (r0 + MS - 1) / H + 1);
#pragma unroll
        for (int n = 0; n < MS / 8; ++n) {
          float p[4], ds[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int cl = mrow + n * 8 + 2 * t + (e & 1);
            p[e] = exp2f(s[n][e] * scale_log2 - tl[cl]);
            bool hidden = false;
            if (edge) {
              const int row = m0 + cl;
              if constexpr (VARLEN)
                hidden = row >= nrows || qr.hides(e >> 1, q_pos0 + row / H);
              else
                hidden = mla::key_hidden<CAUSAL>(k0 + g + (e >> 1) * 8, row / H, seqlen_k, q_pos0) || row >= nrows;
              if (hidden) p[e] = 0.f;
            }
            ds[e] = softmax_scale * p[e] * (dpt[n][e] - td[cl]);
            if constexpr (VARLEN) ds[e] = hidden ? 0.f : ds[e];
          }
          p_lo[n * 4] = mla::pack2<elem_t>(p[0], p[1]);
          p_hi[n * 4] = mla::pack2<elem_t>(p[2], p[3]);
          d_lo[n * 4] = mla::pack2<elem_t>(ds[0], ds[1]);
          d_hi[n * 4] = mla::pack2<elem_t>(ds[2], ds[3]);
        }
      } else {
#pragma unroll
        for (int n = 0; n < MS / 8; ++n) p_lo[n * 4] = p_hi[n * 4] = d_lo[n * 4] = d_hi[n * 4] = 0u;
      }
    }
    __syncthreads();  // P^T and dS^T of the whole tile in

    // Phase B: dC[keys, col_c ..] += P^T dO + dS^T Q_lat; dK_rope[keys, col_r ..] += dS^T Q_rope,
    // for the warp's MT 16-key m-tiles: every B fragment (dO, Q) serves MT of them.
    if (kb0 < seqlen_k && (!CAUSAL || kb0 <= q_pos0 + row_last / H)) {
#pragma unroll
      for (int kk = 0; kk < BLOCK_M / 16; ++kk) {
        unsigned pa[MT][4], da[MT][4];
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          mla::ldmatrix_x4(pa[m], sP + pa_off + m * 16 * PS + kk * 16);
          mla::ldmatrix_x4(da[m], sDS + pa_off + m * 16 * PS + kk * 16);
        }
#pragma unroll
        for (int cp = 0; cp < DCS / 16; ++cp) {
          unsigned bo[4], bq[4];
          mla::ldmatrix_x4_trans(bo, to + ot_off + kk * 16 * OS + col_c + cp * 16);
          mla::ldmatrix_x4_trans(bq, tq + qt_off + kk * 16 * QS + col_c + cp * 16);
#pragma unroll
          for (int m = 0; m < MT; ++m) {
            mla::mma<elem_t>(dcacc[m][2 * cp], pa[m], bo, dcacc[m][2 * cp]);
            mla::mma<elem_t>(dcacc[m][2 * cp + 1], pa[m], bo + 2, dcacc[m][2 * cp + 1]);
            mla::mma<elem_t>(dcacc[m][2 * cp], da[m], bq, dcacc[m][2 * cp]);
            mla::mma<elem_t>(dcacc[m][2 * cp + 1], da[m], bq + 2, dcacc[m][2 * cp + 1]);
          }
        }
        if (DCS % 16 != 0) {  // an 8-column tail
          unsigned bo[2], bq[2];
          mla::ldmatrix_x2_trans(bo, to + ot_off + kk * 16 * OS + col_c + DCS - 8);
          mla::ldmatrix_x2_trans(bq, tq + qt_off + kk * 16 * QS + col_c + DCS - 8);
#pragma unroll
          for (int m = 0; m < MT; ++m) {
            mla::mma<elem_t>(dcacc[m][DCS / 8 - 1], pa[m], bo, dcacc[m][DCS / 8 - 1]);
            mla::mma<elem_t>(dcacc[m][DCS / 8 - 1], da[m], bq, dcacc[m][DCS / 8 - 1]);
          }
        }
#pragma unroll
        for (int cp = 0; cp < DRS / 16; ++cp) {
          unsigned bq[4];
          mla::ldmatrix_x4_trans(bq, tq + qt_off + kk * 16 * QS + col_r + cp * 16);
#pragma unroll
          for (int m = 0; m < MT; ++m) {
            mla::mma<elem_t>(dracc[m][2 * cp], da[m], bq, dracc[m][2 * cp]);
            mla::mma<elem_t>(dracc[m][2 * cp + 1], da[m], bq + 2, dracc[m][2 * cp + 1]);
          }
        }
        if (DRS % 16 != 0) {
          unsigned bq[2];
          mla::ldmatrix_x2_trans(bq, tq + qt_off + kk * 16 * QS + col_r + DRS - 8);
#pragma unroll
          for (int m = 0; m < MT; ++m) mla::mma<elem_t>(dracc[m][DRS / 8 - 1], da[m], bq, dracc[m][DRS / 8 - 1]);
        }
      }
    }
  }
  mla::cp_async_wait<0>();  // nothing in flight at exit (the groups left are empty)

@ if C.qsplit == 1 then
  // dc = [dC ; dK_rope] straight from the fragments (scale is already in dS^T).
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = kb0 + m * 16 + g + 8 * r;
      if (key < seqlen_k) {
        elem_t* const dst = dc + ((size_t)b * seqlen_k + key) * DQK + 2 * t;
#pragma unroll
        for (int d = 0; d < DCS / 8; ++d)
          *reinterpret_cast<unsigned*>(dst + col_c + d * 8) = mla::pack2<elem_t>(dcacc[m][d][2 * r], dcacc[m][d][2 * r + 1]);
#pragma unroll
        for (int d = 0; d < DRS / 8; ++d)
          *reinterpret_cast<unsigned*>(dst + col_r + d * 8) = mla::pack2<elem_t>(dracc[m][d][2 * r], dracc[m][d][2 * r + 1]);
      }
    }
@ else
  // This CTA's share of [dC ; dK_rope], added into the fp32 dc_accum (scale is in dS^T).
  if (n_iter > 0) {
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int key = kb0 + m * 16 + g + 8 * r;
        if (key < seqlen_k) {
          float* const dst = dc_accum + ((size_t)b * seqlen_k + key) * DQK + 2 * t;
#pragma unroll
          for (int d = 0; d < DCS / 8; ++d) {
            atomicAdd(dst + col_c + d * 8, dcacc[m][d][2 * r]);
            atomicAdd(dst + col_c + d * 8 + 1, dcacc[m][d][2 * r + 1]);
          }
#pragma unroll
          for (int d = 0; d < DRS / 8; ++d) {
            atomicAdd(dst + col_r + d * 8, dracc[m][d][2 * r]);
            atomicAdd(dst + col_r + d * 8 + 1, dracc[m][d][2 * r + 1]);
          }
        }
      }
  }
@ end
}
