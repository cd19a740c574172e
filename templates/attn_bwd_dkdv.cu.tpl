@ -- attn_bwd_dkdv: explicit-form MLA attention backward on tensor cores, dK and dV (and,
@ -- deterministic = 0, dQ by fp32 atomics). FlashAttention-2 (arXiv 2307.08691), Algorithm 2.
@ --
@ -- One CTA owns block_n keys of one head of one batch item; each warp owns 16 of those keys
@ -- and keeps their dK (d_n + d_r) and dV (d_v) rows in fp32 accumulator fragments. The K
@ -- and V tiles are copied into shared memory once; the CTA loops over query tiles of
@ -- block_m rows (causal: only tiles with a row whose position, mla::QueryPos as attn_fwd's,
@ -- is at or after the key tile's first key: the rows from QueryPos::first_row_at), which stream
@ -- through shared memory with their dO rows, LSE and delta (cp.async, one or two stages).
@ -- Per query tile, with mma.sync.m16n8k16 (16-bit inputs, fp32 accumulation):
@ --   S^T  = K Q^T             A: K rows (ldmatrix.x4), B: Q rows (ldmatrix.x4: Q row-major
@ --                            is Q^T column-major); keys are the M dimension
@ --   P^T  = exp2(S^T * scale log2 e - LSE log2 e)   (the forward's normalized P, recomputed)
@ --   dV  += P^T dO            A: P^T from registers (C layout -> A layout), B: dO by .trans
@ --   dP^T = V dO^T            A: V rows, B: dO rows
@ --   dS^T = P^T (dP^T - delta)
@ --   dK  += dS^T Q            A: dS^T from registers, B: Q by .trans     (scale at the end)
@ --   dQ  += scale dS K        deterministic = 0 only: dS^T goes through shared memory (16-bit,
@ --                            as FA2), every warp then computes 16x16 blocks of the tile's dQ
@ --                            and adds them with fp32 atomicAdd into dq_accum.
@ -- Outputs: dV [B, S_k, H, d_v]; dK per head ([B, S_k, H, d_n + d_r] with k_packed = 1, else
@ -- dk_nope [B, S_k, H, d_n]); with k_packed = 0 the RoPE part of dK is summed over the heads
@ -- into fp32 dk_rope [B, S_k, d_r] (no per-head copy in memory):
@ --   deterministic = 0: atomicAdd (fast, order-dependent bits; dk_rope must be zeroed first);
@ --   deterministic = 1: one CTA owns a key tile for ALL heads and loops over them in order,
@ --                      keeping the RoPE rows of dK in registers across heads, then stores
@ --                      dk_rope (slower: H times fewer CTAs); dQ comes from attn_bwd_dq.
@ -- With k_packed = 1 and deterministic = 1 every output is written once: bit-reproducible.
@ -- dk_smem = 1 keeps the fp32 dK rows in shared memory instead of registers (each thread
@ -- reads and writes only its own fragment elements there, so no barrier is involved): the
@ -- fallback for head dims whose dK + dV accumulators do not fit in registers (d_v 256).
@ -- Packed sequences (spec.varlen, the "_varlen" variant, arguments cu_seqlens, n_seqs last;
@ -- batch 1): key j is seen by the query positions [lo, hi) of mla::Varlen::queries (its
@ -- document, from j on when causal); a slack key (at or past T = cu[n_seqs]) by none, and
@ -- is loaded as zeros (dK = dV = 0, as for any key no query sees). The CTA's query tiles
@ -- are those holding the rows at positions [lo(first key), hi(last valid key)) (both
@ -- increase with the key; QueryPos::first_row_at turns positions into rows). Slack query
@ -- rows are loaded as zeros and their LSE and delta never read (+inf and 0: P = 0); masks
@ -- are selects, element by element unless the query tile lies inside every key's range.
@ local H, DN, DR, DV = spec.heads, spec.d_n, spec.d_r, spec.d_v
@ local DQK = DN + DR
@ local VARLEN = spec.varlen
@ local ESIZE = elem_size(spec.dtype)
@ local PAD = 8
@ local SMEM_LIMIT = smem_limit()
@ -- fp32 accumulators per thread: dK (d_qk/2, unless dk_smem) + dV (d_v/2) + S^T and dP^T
@ -- (block_m/2 each). Up to 192 every kept configuration of the DeepSeek head (128, 64, 128)
@ -- and of (64, 32, 64) compiles without spills on sm_80 and sm_90a (test_attn_bwd.c).
@ local ACC_LIMIT = 192
@ local DKPAD = 8                     -- fp32 padding per dK smem row
@ -- With dk_smem, dK costs the 8 of the 16x16 chunk being updated.
@ local function accumulators(c) return (c.dk_smem == 1 and 8 or DQK // 2) + DV // 2 + c.block_m end
@ local function smem_bytes(c)
@   local e = c.block_n * ((DQK + PAD) + (DV + PAD)) + c.stages * c.block_m * ((DQK + PAD) + (DV + PAD))
@   if c.deterministic == 0 then e = e + c.block_n * (c.block_m + PAD) end
@   local f = 2 * c.stages * c.block_m
@   if c.dk_smem == 1 then f = f + c.block_n * (DQK + DKPAD) end
@   return ESIZE * e + 4 * f
@ end
@ local PACKED = spec.config ~= nil and spec.config.k_packed == 1
@
@ local K = kernel {
@   family = "attn_bwd_dkdv", pass = "bwd", causal = true, varlen = true, interface = { "k_packed", "deterministic" }, flops = { pair = 4 * spec.heads * ((spec.d_n + spec.d_r) + spec.d_v) },
@   doc = "explicit-form attention backward on tensor cores (FlashAttention-2): dK, dV, and dQ by fp32 atomics (deterministic = 0)",
@   params = append_varlen_params(insert_ld_k_rope({
@     { name = "q",      type = "const elem_t*", shape = "[B, S_q, H, d_n + d_r]", doc = "queries, RoPE part last" },
@     PACKED and
@     { name = "k_nope", type = "const elem_t*", shape = "[B, S_k, H, d_n + d_r]", doc = "k_packed = 1: per-head keys K = [K_nope ; k_rope]" } or
@     { name = "k_nope", type = "const elem_t*", shape = "[B, S_k, H, d_n]",       doc = "per-head no-RoPE keys" },
@     PACKED and
@     { name = "k_rope", type = "const elem_t*", shape = "unused",                 doc = "k_packed = 1: unused (may be null)" } or
@     { name = "k_rope", type = "const elem_t*", shape = "[B, S_k, d_r]",          doc = "RoPE'd key part shared by all heads, token rows ld_k_rope elements apart" },
@     { name = "v",      type = "const elem_t*", shape = "[B, S_k, H, d_v]",       doc = "per-head values" },
@     { name = "dout",   type = "const elem_t*", shape = "[B, S_q, H, d_v]",       doc = "gradient of the output" },
@     { name = "lse",    type = "const float*",  shape = "[B, H, S_q]",            doc = "the forward's natural-log LSE" },
@     { name = "delta",  type = "const float*",  shape = "[B, H, S_q]",            doc = "rowsum(dO * O) from attn_bwd_pre" },
@     { name = "dq_accum", type = "float*",      shape = "[B, S_q, H, d_n + d_r]", doc = "deterministic = 0: dQ (scale applied) added atomically, must be zeroed first; deterministic = 1: unused (may be null)" },
@     PACKED and
@     { name = "dk_nope", type = "elem_t*",      shape = "[B, S_k, H, d_n + d_r]", doc = "k_packed = 1: per-head dK" } or
@     { name = "dk_nope", type = "elem_t*",      shape = "[B, S_k, H, d_n]",       doc = "per-head dK_nope" },
@     PACKED and
@     { name = "dk_rope", type = "float*",       shape = "unused",                 doc = "k_packed = 1: unused (may be null)" } or
@     { name = "dk_rope", type = "float*",       shape = "[B, S_k, d_r]",          doc = "dK's RoPE part summed over the heads (fp32); deterministic = 0: added atomically, must be zeroed first" },
@     { name = "dv",     type = "elem_t*",       shape = "[B, S_k, H, d_v]",       doc = "gradient of V" },
@     { name = "seqlen_q", type = "int", doc = "query tokens per batch item" },
@     { name = "seqlen_k", type = "int", doc = "key tokens per batch item" },
@     { name = "q_pos0",   type = "int", doc = "global position of query row 0 (keys start at 0); rows i < q_split are at q_pos0 + i; causal keeps key j for row i iff j <= pos(i)" },
@     { name = "q_split",  type = "int", doc = "first row of the second chunk (0: one chunk at q_pos1)" },
@     { name = "q_pos1",   type = "int", doc = "global position of row q_split; rows i >= q_split are at q_pos1 + i - q_split; >= q_pos0 + q_split (positions increase)" },
@     { name = "softmax_scale", type = "float", doc = "mscale^2 / sqrt(d_n + d_r)" },
@   }, PACKED)),
@   tunables = {
@     block_n   = { values = { 32, 64, 128 }, doc = "keys per CTA (16 per warp)" },
@     num_warps = { values = { 2, 4, 8 },     doc = "warps per CTA: block_n / 16" },
@     block_m   = { values = { 16, 32, 64 },  doc = "query rows per streamed tile" },
@     stages    = { values = { 1, 2 },        doc = "query tiles in shared memory (2: the next loads during the compute)" },
@     deterministic = { values = { 0, 1 },    doc = "0: dQ and (split keys) dk_rope by fp32 atomics; 1: no dQ (attn_bwd_dq), dk_rope by a head loop" },
@     k_packed  = { values = { 0, 1 },        doc = "0: k_nope + shared k_rope (dK_nope per head, dk_rope summed); 1: per-head K and dK [.., d_n + d_r]" },
@     dk_smem   = { values = { 0, 1 },        doc = "1: the fp32 dK accumulators live in shared memory (large head dims)" },
@   },
@   check = function(s, c)
@     if DN % 16 ~= 0 or DR % 16 ~= 0 or DV % 16 ~= 0 then
@       return "d_n, d_r and d_v must be multiples of 16 (the mma k step and ldmatrix.x4 pairs)"
@     end
@     if c.block_n ~= 16 * c.num_warps then return "block_n must be 16 * num_warps (each warp owns 16 keys)" end
@     if accumulators(c) > ACC_LIMIT then
@       return string.format("d_qk/2 (dk_smem: 8) + d_v/2 + block_m = %d fp32 accumulators per thread, over %d (registers would spill)",
@                            accumulators(c), ACC_LIMIT)
@     end
@     if smem_bytes(c) > SMEM_LIMIT then
@       return string.format("needs %d bytes of shared memory, over the %d-byte limit", smem_bytes(c), SMEM_LIMIT)
@     end
@     if c.dk_smem == 1 and accumulators({ dk_smem = 0, block_m = c.block_m }) <= ACC_LIMIT then
@       return "dk_smem = 1 only where dK does not fit in registers (this block_m fits with dk_smem = 0)"
@     end
@   end,
@   default = function(s)
@     for _, dks in ipairs({ 0, 1 }) do
@       for _, p in ipairs({ { 64, 2 }, { 32, 2 }, { 16, 2 }, { 16, 1 } }) do
@         local c = { block_n = 64, num_warps = 4, block_m = p[1], stages = p[2], deterministic = 0,
@                     k_packed = 0, dk_smem = dks }
@         if accumulators(c) <= ACC_LIMIT and smem_bytes(c) <= SMEM_LIMIT then return c end
@       end
@     end
@     return { block_n = 32, num_warps = 2, block_m = 16, stages = 1, deterministic = 0, k_packed = 0, dk_smem = 1 }
@   end,
@   name = function(s, c)
@     return string.format("mla_attn_bwd_dkdv_h%d_dn%d_dr%d_dv%d_%s_%s_bn%d_bm%d_st%d%s%s", H, DN, DR, DV,
@                          s.dtype, s.causal and "causal" or "full", c.block_n, c.block_m, c.stages,
@                          c.deterministic == 1 and "_det" or "", c.k_packed == 1 and "_kpacked" or "")
@                          .. (c.dk_smem == 1 and "_dksmem" or "")
@   end,
@   launch = function(s, c)
@     local head_loop = c.deterministic == 1 and c.k_packed == 0
@     return {
@       grid = { { arg = "seqlen_k", div = c.block_n }, { value = head_loop and 1 or H }, { arg = "batch" } },
@       block = { 32 * c.num_warps, 1, 1 },
@       smem = smem_bytes(c),   -- dynamic; over 48 KiB needs cudaFuncAttributeMaxDynamicSharedMemorySize
@       smem_static = 0,
@     }
@   end,
@ }
@ assert(PACKED == (K.config.k_packed == 1))
@ local C = K.config
// Generated by mlagen from templates/attn_bwd_dkdv.cu.tpl: do not edit.
// MLA attention backward (dK, dV${C.deterministic == 0 and ", atomic dQ" or ""}) on tensor cores, H=${H} d_n=${DN} d_r=${DR} d_v=${DV},
// ${spec.dtype}, ${spec.causal and "causal" or "non-causal"}, keys ${PACKED and "packed per head" or "split (shared k_rope)"}, ${C.deterministic == 1 and "deterministic" or "atomic"}.
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
constexpr int BLOCK_N = ${C.block_n};  // keys per CTA, 16 per warp
constexpr int BLOCK_M = ${C.block_m};  // query rows per streamed tile
constexpr int STAGES = ${C.stages};
constexpr bool ATOMIC = ${C.deterministic == 0 and "true" or "false"};
constexpr bool K_PACKED = ${PACKED and "true" or "false"};
constexpr bool HEAD_LOOP = !ATOMIC && !K_PACKED;  // one CTA, every head in order
constexpr bool DK_SMEM = ${C.dk_smem == 1 and "true" or "false"};  // dK accumulators in smem
constexpr int DKS = DQK + ${DKPAD};  // fp32 row stride of the smem dK
constexpr int PAD = ${PAD};
constexpr int QS = DQK + PAD;  // smem row strides (elements), odd 16-byte units per row
constexpr int KS = DQK + PAD;
constexpr int VS = DV + PAD;
constexpr int OS = DV + PAD;       // dO rows
constexpr int SS = BLOCK_M + PAD;  // dS^T rows (keys x queries)
constexpr int Q_ELEMS = BLOCK_M * QS;
constexpr int O_ELEMS = BLOCK_M * OS;
constexpr int NT_M = BLOCK_M / 8;  // m16n8 tiles of S^T per warp
constexpr int NT_K = DQK / 8;      // of dK
constexpr int NT_V = DV / 8;       // of dV
constexpr int VEC = mla::CHUNK;
constexpr int TPR_Q = mla::copy_tpr(DQK / VEC);
constexpr int TPR_K = mla::copy_tpr(DN / VEC) < mla::copy_tpr(DR / VEC) ? mla::copy_tpr(DN / VEC) : mla::copy_tpr(DR / VEC);
constexpr int TPR_V = mla::copy_tpr(DV / VEC);
static_assert(DN % 16 == 0 && DR % 16 == 0 && DV % 16 == 0, "head dims must be multiples of 16");
static_assert(BLOCK_N == 16 * NUM_WARPS && BLOCK_M % 16 == 0, "tile shape");

}  // namespace

${kernel_open(K, "NUM_THREADS")}
  elem_t* const sK = reinterpret_cast<elem_t*>(smem);  // [BLOCK_N][KS]
  elem_t* const sV = sK + BLOCK_N * KS;                 // [BLOCK_N][VS]
  elem_t* const sQ = sV + BLOCK_N * VS;                 // STAGES x [BLOCK_M][QS]
  elem_t* const sO = sQ + STAGES * Q_ELEMS;             // STAGES x [BLOCK_M][OS]: dO
  elem_t* const sS = sO + STAGES * O_ELEMS;             // [BLOCK_N][SS]: dS^T (ATOMIC only)
  float* const sLse = reinterpret_cast<float*>(sS + (ATOMIC ? BLOCK_N * SS : 0));  // STAGES x [BLOCK_M]
  float* const sDelta = sLse + STAGES * BLOCK_M;                                   // STAGES x [BLOCK_M]
  float* const sDK = sDelta + STAGES * BLOCK_M;  // DK_SMEM: [BLOCK_N][DKS] fp32

${thread_prologue()}
  const int n0 = blockIdx.x * BLOCK_N;
  const int b = blockIdx.z;
  const int wrow = warp * 16;  // the warp's first key in the tile
  const int k0 = n0 + wrow;    // its global key index
  const float scale_log2 = softmax_scale * mla::LOG2E;

  const mla::QueryPos qpos{q_pos0, q_split, q_pos1};  // rows' global positions
@ if VARLEN then
  // Packed sequences: keys from k_end on are slack (zeros, seen by none); the valid query
  // rows are a prefix of n_valid rows. The query positions [lo, hi) that see key n0 + j
  // (empty for a slack key) wait in the 16 padding bytes of K's shared row j (columns DQK +
  // 0..7, which no ldmatrix reads and no tile copy writes), row 0's also n_valid and k_end, and are
  // read back where needed: registers, not shared memory, are this kernel's budget
  // (ACC_LIMIT), and held in registers across the loop they made ptxas spill at the limit.
  // The query tiles [m_first, m_first + n_iter) hold the rows at positions [lo of the first
  // key, hi of the last valid key).
  const mla::Varlen vl{cu_seqlens, n_seqs};
  const int T = cu_seqlens[n_seqs];
  const int k_end = min(seqlen_k, T);
  const int n_valid = min(seqlen_q, qpos.first_row_at(T));
  int* const sKq = reinterpret_cast<int*>(sK + DQK);  // key j's [lo, hi) at sKq[j * KS / 2]
  static_assert(KS % 2 == 0 && PAD * sizeof(elem_t) >= 4 * sizeof(int), "K rows' padding holds four ints");
  for (int j = tid; j < BLOCK_N; j += NUM_THREADS) {
    int lo = 0, hi = 0;
    if (n0 + j < k_end) vl.queries<CAUSAL>(n0 + j, lo, hi);
    sKq[j * (KS / 2)] = lo;
    sKq[j * (KS / 2) + 1] = hi;
  }
  if (tid == 0) sKq[2] = n_valid, sKq[3] = k_end;
  __syncthreads();  // sKq in
  int m_first = 0, n_iter = 0;
  if (n0 < k_end) {
    int plo, phi, unused;
    vl.queries<CAUSAL>(n0, plo, unused);
    vl.queries<CAUSAL>(min(n0 + BLOCK_N, k_end) - 1, unused, phi);
    const int r0 = qpos.first_row_at(plo), r1 = min(n_valid, qpos.first_row_at(phi));
    if (r0 < r1) {
      m_first = r0 / BLOCK_M;
      n_iter = (r1 + BLOCK_M - 1) / BLOCK_M - m_first;
    }
  }
@ else
  // Query tiles that see a key of this tile: causal, from the one holding the first row at
  // position n0 or later (the positions increase, so every later row sees it too).
  const int m_first = CAUSAL ? qpos.first_row_at(n0) / BLOCK_M : 0;
  const int m_tiles = (seqlen_q + BLOCK_M - 1) / BLOCK_M;
  const int n_iter = m_tiles - m_first;
@ end

  const int tr_q = tid / TPR_Q, tc_q = tid % TPR_Q;
  const int tr_k = tid / TPR_K, tc_k = tid % TPR_K;
  const int tr_v = tid / TPR_V, tc_v = tid % TPR_V;

  // K and V tiles of head h; keys past seqlen_k are zero (and masked).
  auto load_kv = [&](int h) {
    mla::cp_async_k_tile<BLOCK_N, DN, DR, H, K_PACKED, KS, TPR_K, NUM_THREADS>(sK, tr_k, tc_k, n0, ${VARLEN and "sKq[3]" or "seqlen_k"}, b, h,
                                                                              k_nope, k_rope${PACKED and "" or ", ld_k_rope"});
    mla::cp_async_tile<BLOCK_N, DV, VS, TPR_V, NUM_THREADS>(sV, tr_v, tc_v, n0, ${VARLEN and "sKq[3]" or "seqlen_k"},
                                                            [&](int j) { return v + (((size_t)b * seqlen_k + j) * H + h) * DV; });
  };

  // Query tile mt of head h into stage st: Q and dO rows (cp.async, zero past seqlen_q),
  // LSE in base 2 (+inf past seqlen_q or for a row without keys: P = 0) and delta (plain
  // stores, published by the barrier that follows the tile's wait).
  auto load_q = [&](int mt, int st, int h) {
    const int m0 = mt * BLOCK_M;
    mla::cp_async_tile<BLOCK_M, DQK, QS, TPR_Q, NUM_THREADS>(sQ + st * Q_ELEMS, tr_q, tc_q, m0, ${VARLEN and "sKq[2]" or "seqlen_q"}, [&](int i) {
      return q + (((size_t)b * seqlen_q + i) * H + h) * DQK;
    });
    mla::cp_async_tile<BLOCK_M, DV, OS, TPR_V, NUM_THREADS>(sO + st * O_ELEMS, tr_v, tc_v, m0, ${VARLEN and "sKq[2]" or "seqlen_q"}, [&](int i) {
      return dout + (((size_t)b * seqlen_q + i) * H + h) * DV;
    });
    for (int r = tid; r < BLOCK_M; r += NUM_THREADS) {
      const int i = m0 + r;
      float l = mla::pos_inf(), dl = 0.f;
      if (i < ${VARLEN and "sKq[2]" or "seqlen_q"}) {
        const size_t row = ((size_t)b * H + h) * seqlen_q + i;
        const float x = lse[row];
        l = mla::lse_log2(x);
        dl = delta[row];
      }
      sLse[st * BLOCK_M + r] = l;
      sDelta[st * BLOCK_M + r] = dl;
    }
  };

  // ldmatrix lane offsets (elements). A operands from [row][k] tiles (K, V: this warp's 16
  // keys); B operands from [n][k] tiles (Q, dO: 16 query rows per x4); B operands by .trans
  // from [k][n] tiles (Q, dO as [query][dim]; K as [key][dim] for dQ); A by .trans from
  // dS^T [key][query] for dQ (A = dS [query][key]).
  const int a_row = wrow + mla::ldm_a_row(lane), a_col = mla::ldm_a_col(lane);
  const int b_row = mla::ldm_b_row(lane), b_col = mla::ldm_b_col(lane);
  const int bt_row = mla::ldm_a_row(lane), bt_col = mla::ldm_a_col(lane);
  const int ka_off = a_row * KS + a_col;
  const int va_off = a_row * VS + a_col;
  const int qb_off = b_row * QS + b_col;
  const int ob_off = b_row * OS + b_col;
  const int qt_off = bt_row * QS + bt_col;
  const int ot_off = bt_row * OS + bt_col;
  const int kt_off = bt_row * KS + bt_col;
  const int sa_off = (mla::ldm_b_row(lane)) * SS + mla::ldm_b_col(lane);

@ if C.dk_smem == 1 then
  // dK's fragment element (d, e) of this thread, in shared memory: only this thread uses it.
  float* const dk_row0 = sDK + (wrow + g) * DKS + 2 * t;  // rows g (e = 0, 1), g + 8 (e = 2, 3)
#define DK(d, e) dk_row0[((e) >> 1) * 8 * DKS + (d) * 8 + ((e) & 1)]
@ else
  float dk[NT_K][4];
#define DK(d, e) dk[d][e]
@ end
  float dvacc[NT_V][4];
#pragma unroll
  for (int d = 0; d < NT_K; ++d)
#pragma unroll
    for (int e = 0; e < 4; ++e) DK(d, e) = 0.f;

  const int h_begin = HEAD_LOOP ? 0 : blockIdx.y;
  const int h_end = HEAD_LOOP ? H : blockIdx.y + 1;
  for (int h = h_begin; h < h_end; ++h) {
    // dK_nope and dV are per head; dK's RoPE rows sum over the head loop.
#pragma unroll
    for (int d = 0; d < NT_K; ++d)
      if (d < DN / 8 || !HEAD_LOOP)
#pragma unroll
        for (int e = 0; e < 4; ++e) DK(d, e) = 0.f;
#pragma unroll
    for (int d = 0; d < NT_V; ++d)
#pragma unroll
      for (int e = 0; e < 4; ++e) dvacc[d][e] = 0.f;
    // No barrier before the next head's loads: the last iteration of the head ended with
    // "every warp is done with stage st", after which no warp reads the head's K, V or
    // query tiles (the epilogue works from registers, and a dK in shared memory is each
    // thread's own); a head with no iteration loads nothing, nor does the next one (n_iter
    // does not depend on the head). A barrier here was redundant: removing it changed no
    // result under the host executor's shuffled schedules (tests/test_attn_bwd.c).

    if (n_iter > 0) {
      load_kv(h);
      load_q(m_first, 0, h);
    }
    mla::cp_async_commit();  // K, V and query tile 0
    if (STAGES == 2) {
      if (n_iter > 1) load_q(m_first + 1, 1, h);
      mla::cp_async_commit();  // query tile 1 (maybe empty)
    }

    for (int it = 0; it < n_iter; ++it) {
      const int st = STAGES == 2 ? (it & 1) : 0;
      const int m0 = (m_first + it) * BLOCK_M;
      if (STAGES == 2)
        mla::cp_async_wait<1>();
      else
        mla::cp_async_wait<0>();
      __syncthreads();  // query tile it (and K, V) in
      const elem_t* const tq = sQ + st * Q_ELEMS;
      const elem_t* const to = sO + st * O_ELEMS;
      const float* const tl = sLse + st * BLOCK_M;
      const float* const td = sDelta + st * BLOCK_M;
      // A warp computes only if one of its keys is in range and visible to a row of the tile.
@ if VARLEN then
      // This thread's keys k0 + g, k0 + g + 8: the query positions [qr_lo, qr_hi) that see them.
      const int nv = sKq[2];
      const int* const qr = sKq + (wrow + g) * (KS / 2);
      const int qr_lo[2] = {qr[0], qr[8 * (KS / 2)]}, qr_hi[2] = {qr[1], qr[8 * (KS / 2) + 1]};
      const int p_first = qpos(m0), p_last = qpos(min(m0 + BLOCK_M, nv) - 1);  // m0 < nv
      const bool active = __any_sync(0xffffffffu, (qr_lo[0] < qr_hi[0] && qr_lo[0] <= p_last && p_first < qr_hi[0]) ||
                                                      (qr_lo[1] < qr_hi[1] && qr_lo[1] <= p_last && p_first < qr_hi[1]));
@ else
      const bool active = k0 < seqlen_k && (!CAUSAL || k0 <= qpos(m0 + BLOCK_M - 1));
@ end
      if (active) {
        float s[NT_M][4];
        mla::warp_gemm_abt<elem_t, DQK, BLOCK_M, QS, 4>(s, sK + ka_off, tq + qb_off);
        // P^T: rows are keys k0 + g (+8), columns queries m0 + n*8 + 2t (+1).
@ if VARLEN then
        // Element-wise masks unless every row of the tile is valid and sees every key of the
        // warp's (warp vote); rows past nv are slack or past seqlen_q.
        const bool edge = !__all_sync(0xffffffffu, m0 + BLOCK_M <= nv && qr_lo[0] <= p_first && p_last < qr_hi[0] &&
                                                       qr_lo[1] <= p_first && p_last < qr_hi[1]);
#pragma unroll
        for (int n = 0; n < NT_M; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int c = n * 8 + 2 * t + (e & 1);
            float p = exp2f(s[n][e] * scale_log2 - tl[c]);
            if (edge) {
              const int qi = m0 + c, pq = qpos(qi);
              if (qi >= nv || pq < qr_lo[e >> 1] || pq >= qr_hi[e >> 1]) p = 0.f;
            }
            s[n][e] = p;
          }
@ else
        const bool edge = k0 + 15 >= seqlen_k || m0 + BLOCK_M > seqlen_q ||
                          (CAUSAL && k0 + 15 > qpos(m0));
#pragma unroll
        for (int n = 0; n < NT_M; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int c = n * 8 + 2 * t + (e & 1);
            float p = exp2f(s[n][e] * scale_log2 - tl[c]);
            if (edge) {
              const int qi = m0 + c;
              if (mla::key_hidden<CAUSAL>(k0 + g + (e >> 1) * 8, qpos(qi), seqlen_k, 0) || qi >= seqlen_q) p = 0.f;
            }
            s[n][e] = p;
          }
@ end
        // dV += P^T dO
        {
          unsigned pa[BLOCK_M / 16][4];
#pragma unroll
          for (int kk = 0; kk < BLOCK_M / 16; ++kk) {
            mla::c_to_a<elem_t>(pa[kk], s[2 * kk], s[2 * kk + 1]);
          }
          mla::warp_gemm_rs<elem_t, BLOCK_M, DV, OS>(dvacc, pa, to + ot_off);
        }
        // dP^T = V dO^T
        float dpt[NT_M][4];
        mla::warp_gemm_abt<elem_t, DV, BLOCK_M, OS, 4>(dpt, sV + va_off, to + ob_off);
        // dS^T = P^T (dP^T - delta), packed to 16 bits as A fragments.
        unsigned da[BLOCK_M / 16][4];
#pragma unroll
        for (int n = 0; n < NT_M; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[n][e] *= dpt[n][e] - td[n * 8 + 2 * t + (e & 1)];
#pragma unroll
        for (int kk = 0; kk < BLOCK_M / 16; ++kk) {
          mla::c_to_a<elem_t>(da[kk], s[2 * kk], s[2 * kk + 1]);
        }
        // dK += dS^T Q
@ if C.dk_smem == 1 then
#pragma unroll 1
        for (int dp = 0; dp < DQK / 16; ++dp) {
          float acc[2][4];
#pragma unroll
          for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[n][e] = DK(2 * dp + n, e);
#pragma unroll
          for (int kk = 0; kk < BLOCK_M / 16; ++kk) {
            unsigned bq[4];
            mla::ldmatrix_x4_trans(bq, tq + qt_off + kk * 16 * QS + dp * 16);
            mla::mma<elem_t>(acc[0], da[kk], bq, acc[0]);
            mla::mma<elem_t>(acc[1], da[kk], bq + 2, acc[1]);
          }
#pragma unroll
          for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) DK(2 * dp + n, e) = acc[n][e];
        }
@ else
        mla::warp_gemm_rs<elem_t, BLOCK_M, DQK, QS>(dk, da, tq + qt_off);
@ end
        if (ATOMIC) {
          // dS^T rows of this warp's keys, for the CTA's dQ.
#pragma unroll
          for (int kk = 0; kk < BLOCK_M / 16; ++kk) {
            *reinterpret_cast<unsigned*>(sS + (wrow + g) * SS + kk * 16 + 2 * t) = da[kk][0];
            *reinterpret_cast<unsigned*>(sS + (wrow + g + 8) * SS + kk * 16 + 2 * t) = da[kk][1];
            *reinterpret_cast<unsigned*>(sS + (wrow + g) * SS + kk * 16 + 8 + 2 * t) = da[kk][2];
            *reinterpret_cast<unsigned*>(sS + (wrow + g + 8) * SS + kk * 16 + 8 + 2 * t) = da[kk][3];
          }
        }
      } else if (ATOMIC) {
#pragma unroll
        for (int kk = 0; kk < BLOCK_M / 16; ++kk) {
          *reinterpret_cast<unsigned*>(sS + (wrow + g) * SS + kk * 16 + 2 * t) = 0u;
          *reinterpret_cast<unsigned*>(sS + (wrow + g + 8) * SS + kk * 16 + 2 * t) = 0u;
          *reinterpret_cast<unsigned*>(sS + (wrow + g) * SS + kk * 16 + 8 + 2 * t) = 0u;
          *reinterpret_cast<unsigned*>(sS + (wrow + g + 8) * SS + kk * 16 + 8 + 2 * t) = 0u;
        }
      }
      __syncthreads();  // every warp is done with stage st (and, ATOMIC, dS^T is in)
      if (STAGES == 2) {
        if (it + 2 < n_iter) load_q(m_first + it + 2, st, h);
      } else {
        if (it + 1 < n_iter) load_q(m_first + it + 1, 0, h);
      }
      mla::cp_async_commit();
      if (ATOMIC) {
        // dQ[m0 .. m0 + BLOCK_M) += scale dS K over this CTA's keys, in 16 x 16 blocks.
        for (int u = warp; u < (BLOCK_M / 16) * (DQK / 16); u += NUM_WARPS) {
          const int mr = u / (DQK / 16), dc = u % (DQK / 16);
          float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
          for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
            unsigned a[4], bk[4];
            mla::ldmatrix_x4_trans(a, sS + sa_off + kk * 16 * SS + mr * 16);
            mla::ldmatrix_x4_trans(bk, sK + kt_off + kk * 16 * KS + dc * 16);
            mla::mma<elem_t>(acc[0], a, bk, acc[0]);
            mla::mma<elem_t>(acc[1], a, bk + 2, acc[1]);
          }
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int qi = m0 + mr * 16 + g + 8 * r;
            if (qi < seqlen_q) {
              float* dst = dq_accum + (((size_t)b * seqlen_q + qi) * H + h) * DQK + dc * 16 + 2 * t;
#pragma unroll
              for (int nn = 0; nn < 2; ++nn) {
                atomicAdd(dst + nn * 8, softmax_scale * acc[nn][2 * r]);
                atomicAdd(dst + nn * 8 + 1, softmax_scale * acc[nn][2 * r + 1]);
              }
            }
          }
        }
      }
    }
    mla::cp_async_wait<0>();  // nothing in flight past the head (the groups left are empty)

    // Epilogue of head h: dV and dK (scaled) straight from the fragments.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = k0 + g + 8 * r;
      if (key < seqlen_k) {
        const size_t tok = (size_t)b * seqlen_k + key;
#pragma unroll
        for (int d = 0; d < NT_V; ++d)
          *reinterpret_cast<unsigned*>(dv + (tok * H + h) * DV + d * 8 + 2 * t) =
              mla::pack2<elem_t>(dvacc[d][2 * r], dvacc[d][2 * r + 1]);
#pragma unroll
        for (int d = 0; d < NT_K; ++d) {
          const int c = d * 8 + 2 * t;
          const float x0 = softmax_scale * DK(d, 2 * r), x1 = softmax_scale * DK(d, 2 * r + 1);
          if (K_PACKED) {
            *reinterpret_cast<unsigned*>(dk_nope + (tok * H + h) * DQK + c) = mla::pack2<elem_t>(x0, x1);
          } else if (d < DN / 8) {
            *reinterpret_cast<unsigned*>(dk_nope + (tok * H + h) * DN + c) = mla::pack2<elem_t>(x0, x1);
          } else if (ATOMIC) {
            atomicAdd(dk_rope + tok * DR + (c - DN), x0);
            atomicAdd(dk_rope + tok * DR + (c - DN) + 1, x1);
          } else if (h == h_end - 1) {
            *reinterpret_cast<float2*>(dk_rope + tok * DR + (c - DN)) = make_float2(x0, x1);
          }
        }
      }
    }
  }
}
#undef DK
