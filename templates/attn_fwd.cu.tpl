@ -- attn_fwd: explicit-form MLA attention forward on tensor cores (arXiv 2405.04434, 2.1).
@ --
@ -- FlashAttention-2 (arXiv 2307.08691) on mma.sync.m16n8k16 (bf16/fp16 in, fp32 accumulate).
@ -- One CTA owns block_m query rows of one head of one batch item; each of its warps owns
@ -- 16 rows. The Q tile is copied once into shared memory (cp.async); K and V stream
@ -- through shared memory in tiles of block_n keys (cp.async, one or two stages). Q's A
@ -- fragments are re-read from shared memory by ldmatrix for every key tile rather than
@ -- held in registers (d_qk / 4 more per thread would not fit beside a d_v = 256 O).
@ --   S = Q K^T      A fragments of Q and B fragments of K by ldmatrix.x4 (K row-major
@ --                  [key][dim] is K^T column-major, as mma's .col B wants); the k loop runs
@ --                  over d_n + d_r in steps of 16, and since d_n and d_r are multiples of 16
@ --                  no step straddles the K_nope and k_rope parts of a smem row.
@ --   softmax        online, in base 2, on the accumulator fragments: each thread holds two
@ --                  rows (g, g + 8) of its warp's 16; a row's max is reduced over the 4
@ --                  lanes of a quad; the row sum stays per thread until the end.
@ --   O += P V       P's C fragments become A fragments in registers (the C layout of two
@ --                  adjacent m16n8 tiles is the A layout of one m16n8k16 step); V's B
@ --                  fragments by ldmatrix.x4.trans from row-major V.
@ -- Masking: keys past seqlen_k, and (causal) key j for query row i when j > pos(i), the
@ -- row's global position (mla::QueryPos: q_pos0 + i, or q_pos1 + i - q_split from row
@ -- q_split on, the second chunk of the all-gather context-parallel form). Key tiles
@ -- entirely past the position of a CTA's last row are never loaded; a warp skips the tiles
@ -- entirely past its own last row's; only tiles that cross the diagonal or the end of the
@ -- keys are masked element by element. Shared-memory rows are padded by 16 bytes (an odd
@ -- number of 16-byte units per row), so the 8 rows of an ldmatrix hit 8 distinct bank
@ -- groups. O leaves through shared memory (the Q area) as 16-byte stores.
@ --
@ -- Packed sequences (spec.varlen, the "_varlen" variant; generator/core/mg_varlen.h): the
@ -- arguments cu_seqlens, n_seqs follow the others (batch 1). Row i sees the keys [lo, hi)
@ -- of its document (mla::Varlen::keys at its global position); rows at or past T =
@ -- cu[n_seqs] (slack) see none (o = 0, lse = -inf) and are loaded as zeros, as are the
@ -- keys past the CTA's last valid row's hi. A CTA's key tiles run from its first row's lo
@ -- to its last valid row's hi (both increase with the row); a warp skips the tiles none of
@ -- its rows sees, and masks element by element (a select: NaN in a foreign or slack row
@ -- cannot leak) unless the tile lies inside every row's range.
@ --
@ -- Key layout (tunable k_packed, spec-independent):
@ --   0 "split"   k_nope [B, S_k, H, d_n] per head and k_rope [B, S_k, d_r] shared by all
@ --               heads, rows ld_k_rope apart (d_c + d_r: the latent c's RoPE columns).
@ --   1 "packed"  one K [B, S_k, H, d_n + d_r] per head, passed as k_nope; the RoPE part is
@ --               read at k_nope + d_n with K's strides, and the k_rope argument is unused
@ --               (may be null; no ld_k_rope): the per-head K of the explicit plans.
@ local H, DN, DR, DV = spec.heads, spec.d_n, spec.d_r, spec.d_v
@ local DQK = DN + DR
@ local VARLEN = spec.varlen
@ -- A key tile's index in the device code: the varlen kernel's loops count from its first tile.
@ local function TILE(x) return VARLEN and ("(tile0 + " .. x .. ")") or x end
@ local ESIZE = elem_size(spec.dtype)
@ local PAD = 8                       -- elements of padding per smem row: 16 bytes
@ local SMEM_LIMIT = smem_limit()
@ -- fp32 accumulators per thread, O (d_v/2) + S (block_n/2): past 160 (d_v 256 with
@ -- block_n 128) ptxas spills; up to it, every kept configuration of d_n, d_r, d_v in
@ -- 16..256 tried (test_attn_fwd.c, and a sweep of nine shapes) has no spill on sm_80 and
@ -- sm_90a. The S loop over d_qk is unrolled by 4, not fully: fully unrolled, ptxas hoists
@ -- Q's fragments and spills at d_v 256, block_n 32, one stage.
@ local ACC_LIMIT = 160
@
@ local function smem_bytes(c)
@   local q = c.block_m * math.max(DQK + PAD, DV + PAD)   -- Q tile, later O staging
@   local kv = c.stages * c.block_n * ((DQK + PAD) + (DV + PAD))
@   return ESIZE * (q + kv)
@ end
@ local function accumulators(c) return DV // 2 + c.block_n // 2 end
@
@ -- The layout is needed for the parameter docs before kernel{} resolves the configuration;
@ -- kernel{} checks the value, and the record's k_packed is asserted equal below.
@ local PACKED = spec.config ~= nil and spec.config.k_packed == 1
@
@ local K = kernel {
@   family = "attn_fwd", pass = "fwd", causal = true, varlen = true, interface = { "k_packed" }, flops = { pair = 2 * spec.heads * (spec.d_n + spec.d_r + spec.d_v) },
@   doc = "explicit-form attention forward on tensor cores (FlashAttention-2): O and LSE from Q, K, V",
@   params = append_varlen_params(insert_ld_k_rope({
@     { name = "q",      type = "const elem_t*", shape = "[B, S_q, H, d_n + d_r]", doc = "queries, RoPE part last" },
@     PACKED and
@     { name = "k_nope", type = "const elem_t*", shape = "[B, S_k, H, d_n + d_r]", doc = "k_packed = 1: per-head keys K = [K_nope ; k_rope], RoPE part last" } or
@     { name = "k_nope", type = "const elem_t*", shape = "[B, S_k, H, d_n]",       doc = "per-head no-RoPE keys, W_UK c_kv" },
@     PACKED and
@     { name = "k_rope", type = "const elem_t*", shape = "unused",                 doc = "k_packed = 1: unused (may be null); the RoPE part is in k_nope" } or
@     { name = "k_rope", type = "const elem_t*", shape = "[B, S_k, d_r]",          doc = "RoPE'd key part shared by all heads, token rows ld_k_rope elements apart" },
@     { name = "v",      type = "const elem_t*", shape = "[B, S_k, H, d_v]",       doc = "per-head values, W_UV c_kv" },
@     { name = "o",      type = "elem_t*",       shape = "[B, S_q, H, d_v]",       doc = "attention output; 0 for a row without keys" },
@     { name = "lse",    type = "float*",        shape = "[B, H, S_q]",            doc = "natural-log logsumexp of the scaled scores; -inf for a row without keys" },
@     { name = "seqlen_q", type = "int", doc = "query tokens per batch item" },
@     { name = "seqlen_k", type = "int", doc = "key tokens per batch item" },
@     { name = "q_pos0",   type = "int", doc = "global position of query row 0 (keys start at 0); rows i < q_split are at q_pos0 + i; causal keeps key j for row i iff j <= pos(i)" },
@     { name = "q_split",  type = "int", doc = "first row of the second chunk (0: one chunk at q_pos1)" },
@     { name = "q_pos1",   type = "int", doc = "global position of row q_split; rows i >= q_split are at q_pos1 + i - q_split; >= q_pos0 + q_split (positions increase)" },
@     { name = "softmax_scale", type = "float", doc = "mscale^2 / sqrt(d_n + d_r)" },
@   }, PACKED)),
@   tunables = {
@     block_m   = { values = { 64, 128 },     doc = "query rows per CTA (16 per warp)" },
@     num_warps = { values = { 4, 8 },        doc = "warps per CTA: block_m / 16" },
@     block_n   = { values = { 32, 64, 128 }, doc = "keys per K/V tile" },
@     stages    = { values = { 1, 2 },        doc = "1: one K and one V buffer, V_j and K_j+1 loads overlap the compute (FA2); 2: K/V tiles double-buffered" },
@     k_packed  = { values = { 0, 1 },        doc = "0: k_nope [B,S_k,H,d_n] + shared k_rope [B,S_k,d_r]; 1: one per-head K [B,S_k,H,d_n+d_r] in k_nope" },
@   },
@   check = function(s, c)
@     if DN % 16 ~= 0 or DR % 16 ~= 0 or DV % 16 ~= 0 then
@       return "d_n, d_r and d_v must be multiples of 16 (the mma k step and ldmatrix.x4 pairs)"
@     end
@     if c.block_m ~= 16 * c.num_warps then return "block_m must be 16 * num_warps (each warp owns 16 query rows)" end
@     if accumulators(c) > ACC_LIMIT then
@       return string.format("d_v/2 + block_n/2 = %d fp32 accumulators per thread, over %d (registers would spill)",
@                            accumulators(c), ACC_LIMIT)
@     end
@     if smem_bytes(c) > SMEM_LIMIT then
@       return string.format("needs %d bytes of shared memory, over the %d-byte limit", smem_bytes(c), SMEM_LIMIT)
@     end
@   end,
@   default = function(s)
@     local prefs = {
@       { block_n = 64, stages = 2 }, { block_n = 64, stages = 1 },
@       { block_n = 32, stages = 2 }, { block_n = 32, stages = 1 },
@     }
@     for _, p in ipairs(prefs) do
@       local c = { block_m = 64, num_warps = 4, block_n = p.block_n, stages = p.stages, k_packed = 0 }
@       if accumulators(c) <= ACC_LIMIT and smem_bytes(c) <= SMEM_LIMIT then return c end
@     end
@     return { block_m = 64, num_warps = 4, block_n = 32, stages = 1, k_packed = 0 }
@   end,
@   name = function(s, c)
@     return string.format("mla_attn_fwd_h%d_dn%d_dr%d_dv%d_%s_%s_bm%d_bn%d_st%d%s", H, DN, DR, DV,
@                          s.dtype, s.causal and "causal" or "full", c.block_m, c.block_n, c.stages,
@                          c.k_packed == 1 and "_kpacked" or "")
@   end,
@   launch = function(s, c)
@     return {
@       grid = { { arg = "seqlen_q", div = c.block_m }, { value = H }, { arg = "batch" } },
@       block = { 32 * c.num_warps, 1, 1 },
@       smem = smem_bytes(c),   -- dynamic; over 48 KiB needs cudaFuncAttributeMaxDynamicSharedMemorySize
@       smem_static = 0,
@     }
@   end,
@ }
@ assert(PACKED == (K.config.k_packed == 1))
@ local C = K.config
// Generated by mlagen from templates/attn_fwd.cu.tpl: do not edit.
// Explicit-form MLA attention forward on tensor cores, H=${H} d_n=${DN} d_r=${DR} d_v=${DV},
// ${spec.dtype}, ${spec.causal and "causal" or "non-causal"}, keys ${PACKED and "packed per head" or "split (shared k_rope)"}.
// Dynamic shared memory: ${smem_bytes(C)} bytes.
#include "mla_device.cuh"

namespace {
typedef ${elem_type(spec.dtype)} elem_t;
constexpr int H = ${H};
constexpr int DN = ${DN};
constexpr int DR = ${DR};
constexpr int DQK = DN + DR;
constexpr int DV = ${DV};
constexpr bool CAUSAL = ${spec.causal and "true" or "false"};
constexpr bool VARLEN = ${VARLEN and "true" or "false"};  // packed sequences (cu_seqlens)
constexpr int NUM_WARPS = ${C.num_warps};
constexpr int NUM_THREADS = 32 * NUM_WARPS;
constexpr int BLOCK_M = ${C.block_m};  // 16 rows per warp
constexpr int BLOCK_N = ${C.block_n};
constexpr int STAGES = ${C.stages};
constexpr int PAD = ${PAD};
constexpr int QS = DQK + PAD;  // smem row strides in elements: 16 bytes of padding makes
constexpr int KS = DQK + PAD;  // each row an odd number of 16-byte units, so ldmatrix's
constexpr int VS = DV + PAD;   // 8 rows fall in 8 distinct bank groups
constexpr int OS = DV + PAD;
constexpr int Q_ELEMS = BLOCK_M * (QS > OS ? QS : OS);  // the Q tile, then the O staging
constexpr int K_ELEMS = BLOCK_N * KS;                    // one K stage
constexpr int V_ELEMS = BLOCK_N * VS;                    // one V stage
constexpr int NT_S = BLOCK_N / 8;  // m16n8 tiles of S per warp
constexpr int NT_O = DV / 8;       // m16n8 tiles of O per warp
constexpr int VEC = mla::CHUNK;    // elements per 16-byte copy
constexpr bool K_PACKED = ${PACKED and "true" or "false"};  // key layout: mla::cp_async_k_tile
// Threads per row in the tile copies (mla::copy_tpr; for K, one that divides both parts).
constexpr int TPR_Q = mla::copy_tpr(DQK / VEC);
constexpr int TPR_K = mla::copy_tpr(DN / VEC) < mla::copy_tpr(DR / VEC) ? mla::copy_tpr(DN / VEC) : mla::copy_tpr(DR / VEC);
constexpr int TPR_V = mla::copy_tpr(DV / VEC);
static_assert(DN % 16 == 0 && DR % 16 == 0 && DV % 16 == 0, "head dims must be multiples of 16");
static_assert(BLOCK_M == 16 * NUM_WARPS && BLOCK_N % 16 == 0, "tile shape");
}  // namespace

${kernel_open(K, "NUM_THREADS")}
  elem_t* const sQ = reinterpret_cast<elem_t*>(smem);
  elem_t* const sK = sQ + Q_ELEMS;             // STAGES x [BLOCK_N][KS]
  elem_t* const sV = sK + STAGES * K_ELEMS;    // STAGES x [BLOCK_N][VS]

${thread_prologue()}
  const int m0 = blockIdx.x * BLOCK_M;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int wrow = warp * 16;   // the warp's first row in the tile
  const int i0 = m0 + wrow;     // its first query row
  const mla::QueryPos qpos{q_pos0, q_split, q_pos1};  // rows' global positions

@ if VARLEN then
  // Packed sequences: the valid rows are a prefix (the positions increase; slack from T on).
  // kr: the key ranges of this thread's rows g, g + 8 (empty past nv) and of the warp's. The
  // CTA's key tiles [tile0, tile0 + n_tiles) cover its first row's lo to its last valid
  // row's hi, and keys from k_end on (none a valid row of the CTA sees) are loaded as zeros.
  const mla::Varlen vl{cu_seqlens, n_seqs};
  const int nv = min(seqlen_q, qpos.first_row_at(cu_seqlens[n_seqs]));
  mla::RowRanges kr;
#pragma unroll
  for (int r = 0; r < 2; ++r) kr.set_keys<CAUSAL>(r, vl, i0 + g + 8 * r < nv, qpos(i0 + g + 8 * r), seqlen_k);
  kr.warp_reduce();  // over the warp's 16 rows
  int tile0, n_tiles, k_end;
  mla::varlen_key_tiles<CAUSAL, BLOCK_N>(vl, qpos, m0, min(m0 + BLOCK_M, seqlen_q) - 1, seqlen_k, tile0, n_tiles, k_end);
@ else
  // Keys this CTA can see: with causal masking, none past its last query's position.
  const int q_last = min(m0 + BLOCK_M, seqlen_q) - 1;
  const int n_tiles = mla::visible_key_tiles<CAUSAL, BLOCK_N>(seqlen_k, 0, qpos(q_last));
@ end
  const float scale_log2 = softmax_scale * mla::LOG2E;

  // Tile copies (mla::cp_async_tile): for K, TPR divides d_n / 8, so whether a chunk is in
  // the K_nope or the RoPE part is known at compile time.
  const int tr_q = tid / TPR_Q, tc_q = tid % TPR_Q;
  const int tr_k = tid / TPR_K, tc_k = tid % TPR_K;
  const int tr_v = tid / TPR_V, tc_v = tid % TPR_V;

  // Q tile: rows past seqlen_q are zero (and never written out). Not needed, and not
  // loaded, when no key is visible.
  if (n_tiles > 0)
    mla::cp_async_tile<BLOCK_M, DQK, QS, TPR_Q, NUM_THREADS>(sQ, tr_q, tc_q, m0, ${VARLEN and "nv" or "seqlen_q"}, [&](int i) {
      return q + (((size_t)b * seqlen_q + i) * H + h) * DQK;
    });

  // One K tile (columns [0, DN) from K_nope, [DN, DQK) from the RoPE part) or one V tile
  // into stage `st`; keys past seqlen_k are zero-filled (masked later, and 0 * 0 in P V).
  auto load_k = [&](int tile, int st) {
    mla::cp_async_k_tile<BLOCK_N, DN, DR, H, K_PACKED, KS, TPR_K, NUM_THREADS>(sK + st * K_ELEMS, tr_k, tc_k, ${TILE("tile")} * BLOCK_N,
                                                                              ${VARLEN and "k_end" or "seqlen_k"}, b, h, k_nope, k_rope${PACKED and "" or ", ld_k_rope"});
  };
  auto load_v = [&](int tile, int st) {
    mla::cp_async_tile<BLOCK_N, DV, VS, TPR_V, NUM_THREADS>(sV + st * V_ELEMS, tr_v, tc_v, ${TILE("tile")} * BLOCK_N, ${VARLEN and "k_end" or "seqlen_k"},
                                                            [&](int j) { return v + (((size_t)b * seqlen_k + j) * H + h) * DV; });
  };

  // This lane's ldmatrix row offsets (elements). A of Q (x4): matrices rows 0-7 / 8-15 at
  // columns +0, then the same at +8. B of K (x4): keys 0-7 at dims +0 / +8, then keys 8-15.
  // B of V (x4.trans): keys 0-7 / 8-15 at columns +0, then the same at +8.
  const int q_off = (wrow + mla::ldm_a_row(lane)) * QS + mla::ldm_a_col(lane);
  const int k_off = mla::ldm_b_row(lane) * KS + mla::ldm_b_col(lane);
  const int v_off = mla::ldm_a_row(lane) * VS + mla::ldm_a_col(lane);

  float o_acc[NT_O][4];
#pragma unroll
  for (int d = 0; d < NT_O; ++d)
#pragma unroll
    for (int e = 0; e < 4; ++e) o_acc[d][e] = 0.f;
  mla::OnlineSoftmax<NT_S> sm;  // rows g, g + 8
  float s[NT_S][4];

  // S = Q K^T for the tile in stage st, scaled to base 2 and masked.
  auto scores = [&](int tile, int st) {
    const int n0 = ${TILE("tile")} * BLOCK_N;
    // The k loop over d_qk unrolled by 4, not fully: see ACC_LIMIT in the template header.
    mla::warp_gemm_abt<elem_t, DQK, BLOCK_N, KS, 4>(s, sQ + q_off, sK + st * K_ELEMS + k_off);
@ if VARLEN then
    // Element-wise masks unless the tile lies inside every row's key range (warp vote).
    const bool edge = !kr.inside(n0, n0 + BLOCK_N);
#pragma unroll
    for (int n = 0; n < NT_S; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[n][e] * scale_log2;
        if (edge) {
          if (kr.hides(e >> 1, n0 + n * 8 + 2 * t + (e & 1))) x = mla::neg_inf();
        }
        s[n][e] = x;
      }
@ else
    // Element-wise masks only where the tile crosses the end of the keys or the diagonal
    // of this warp's rows (warp-uniform test).
    const bool edge = n0 + BLOCK_N > seqlen_k || (CAUSAL && n0 + BLOCK_N - 1 > qpos(i0));
#pragma unroll
    for (int n = 0; n < NT_S; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[n][e] * scale_log2;
        if (edge) {
          if (mla::key_hidden<CAUSAL>(n0 + n * 8 + 2 * t + (e & 1), qpos(i0 + g + (e >> 1) * 8), seqlen_k, 0))
            x = mla::neg_inf();
        }
        s[n][e] = x;
      }
@ end
  };

  // Online softmax: S becomes P (fp32) and O and the sums are rescaled to the new max.
  auto softmax = [&]() {
#pragma unroll
    for (int r = 0; r < 2; ++r) sm.update(s, o_acc, r, mla::quad_max(sm.row_max(s, r, sm.m[r])));
  };

  // O += P V for the V tile in stage st. P's A fragments come straight from S's registers,
  // packed to 16 bits first (half the registers of S), then the d_v loop runs outside.
  auto pv = [&](int st) {
    unsigned p[BLOCK_N / 16][4];
#pragma unroll
    for (int kk = 0; kk < BLOCK_N / 16; ++kk) mla::c_to_a<elem_t>(p[kk], s[2 * kk], s[2 * kk + 1]);
    mla::warp_gemm_rs<elem_t, BLOCK_N, DV, VS>(o_acc, p, sV + st * V_ELEMS + v_off);
  };

  // A warp works on a tile only if it has a row in range that sees one of its keys.
  auto warp_active = [&](int tile) {
@ if VARLEN then
    const int n0 = ${TILE("tile")} * BLOCK_N;
    return kr.meets(n0, n0 + BLOCK_N);
@ else
    return i0 < seqlen_q && (!CAUSAL || tile * BLOCK_N <= qpos(i0 + 15));
@ end
  };

@ if C.stages == 1 then
  // One K and one V buffer (FA2's schedule): V_j loads during S = Q K_j^T, K_j+1 during
  // the softmax and P V_j.
  if (n_tiles > 0) load_k(0, 0);
  mla::cp_async_commit();  // Q and K_0
  for (int j = 0; j < n_tiles; ++j) {
    mla::cp_async_wait<0>();
    __syncthreads();  // K_j (and Q) in; every warp is done with V_j-1
    load_v(j, 0);
    mla::cp_async_commit();
    const bool active = warp_active(j);
    if (active) scores(j, 0);
    __syncthreads();  // every warp is done with K_j
    if (j + 1 < n_tiles) load_k(j + 1, 0);
    mla::cp_async_commit();
    if (active) softmax();
    mla::cp_async_wait<1>();
    __syncthreads();  // V_j in
    if (active) pv(0);
  }
@ else
  // K and V double-buffered: tile j+1 loads while tile j is computed.
  if (n_tiles > 0) {
    load_k(0, 0);
    load_v(0, 0);
  }
  mla::cp_async_commit();  // Q and tile 0
  if (n_tiles > 1) {
    load_k(1, 1);
    load_v(1, 1);
  }
  mla::cp_async_commit();  // tile 1 (maybe empty)
  for (int j = 0; j < n_tiles; ++j) {
    const int st = j & 1;
    mla::cp_async_wait<1>();
    __syncthreads();  // tile j (and Q) in
    if (warp_active(j)) {
      scores(j, st);
      softmax();
      pv(st);
    }
    __syncthreads();  // every warp is done with stage st
    if (j + 2 < n_tiles) {
      load_k(j + 2, st);
      load_v(j + 2, st);
    }
    mla::cp_async_commit();
  }
@ end

  // Epilogue: O = acc / l through shared memory, LSE = ln(sum exp(scaled score))
  // = (m + log2 l) * ln 2. O is staged in the Q area with no barrier: the loop's last
  // barrier follows every read of Q (and every real copy has landed: the groups still
  // pending are empty; without key tiles Q was never loaded).
#pragma unroll
  for (int r = 0; r < 2; ++r) sm.l[r] = mla::quad_sum(sm.l[r]);
  const float inv0 = sm.inv(sm.l[0]), inv1 = sm.inv(sm.l[1]);
  elem_t* const sO = sQ + wrow * OS;  // this warp's 16 rows
#pragma unroll
  for (int d = 0; d < NT_O; ++d) {
    const int c = d * 8 + 2 * t;
    *reinterpret_cast<unsigned*>(sO + g * OS + c) = mla::pack2<elem_t>(o_acc[d][0] * inv0, o_acc[d][1] * inv0);
    *reinterpret_cast<unsigned*>(sO + (g + 8) * OS + c) = mla::pack2<elem_t>(o_acc[d][2] * inv1, o_acc[d][3] * inv1);
  }
  __syncwarp();
#pragma unroll
  for (int it = 0; it < (16 * (DV / VEC) + 31) / 32; ++it) {
    const int idx = it * 32 + lane;
    if ((16 * (DV / VEC)) % 32 == 0 || idx < 16 * (DV / VEC)) {
      const int r = idx / (DV / VEC), c = (idx % (DV / VEC)) * VEC;
      const int i = i0 + r;
      if (i < seqlen_q)
        *reinterpret_cast<uint4*>(o + (((size_t)b * seqlen_q + i) * H + h) * DV + c) =
            *reinterpret_cast<const uint4*>(sO + r * OS + c);
    }
  }
  if (t == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = i0 + g + 8 * r;
      if (i < seqlen_q) lse[((size_t)b * H + h) * seqlen_q + i] = sm.lse(r, sm.l[r]);
    }
  }
}
