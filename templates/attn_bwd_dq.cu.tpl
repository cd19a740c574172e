@ -- attn_bwd_dq: the deterministic dQ pass of the explicit-form MLA attention backward on
@ -- tensor cores (FlashAttention-2, arXiv 2307.08691, with dQ computed apart from dK/dV so
@ -- that no atomics are needed: attn_bwd_dkdv with deterministic = 1 does dK and dV).
@ --
@ -- One CTA owns block_m query rows of one head of one batch item; each warp owns 16 rows
@ -- and keeps their dQ (d_n + d_r) in fp32 fragments. Q and dO are copied into shared
@ -- memory once; K and V stream through in tiles of block_n keys (cp.async, 1 or 2 stages;
@ -- causal: only the tiles up to the position of the CTA's last row; positions as attn_fwd's,
@ -- mla::QueryPos). Per key tile, with mma.sync:
@ --   S  = Q K^T       (as attn_fwd)          P = exp2(S scale log2 e - LSE log2 e)
@ --   dP = dO V^T      A: dO rows, B: V rows (V row-major is V^T column-major)
@ --   dS = P (dP - delta)
@ --   dQ += dS K       A: dS from registers, B: K by ldmatrix.trans
@ -- dq = scale * dQ is written in the input dtype (16-bit), [B, S_q, H, d_n + d_r]; a row
@ -- without keys gets 0. Every output is written once, by one thread: bit-reproducible.
@ -- Packed sequences (spec.varlen, the "_varlen" variant, arguments cu_seqlens, n_seqs last):
@ -- as attn_fwd's (each row's keys [lo, hi) from mla::Varlen, the CTA's key tiles from its
@ -- first row's lo to its last valid row's hi, masks by select). Slack rows (at or past T =
@ -- cu[n_seqs]) get dq = 0: their Q and dO are loaded as zeros and their LSE and delta are
@ -- never read (attn_bwd_pre's delta of a slack row may be anything, NaN included).
@ local H, DN, DR, DV = spec.heads, spec.d_n, spec.d_r, spec.d_v
@ local DQK = DN + DR
@ local VARLEN = spec.varlen
@ -- A key tile's index in the device code: the varlen kernel's loops count from its first tile.
@ local function TILE(x) return VARLEN and ("(tile0 + " .. x .. ")") or x end
@ local ESIZE = elem_size(spec.dtype)
@ local PAD = 8
@ local SMEM_LIMIT = smem_limit()
@ -- fp32 accumulators per thread: dQ (d_qk/2) + S and dP (block_n/2 each).
@ local ACC_LIMIT = 192
@ local function accumulators(c) return DQK // 2 + c.block_n end
@ local function smem_bytes(c)
@   return ESIZE * (c.block_m * ((DQK + PAD) + (DV + PAD)) + c.stages * c.block_n * ((DQK + PAD) + (DV + PAD)))
@ end
@ local PACKED = spec.config ~= nil and spec.config.k_packed == 1
@
@ local K = kernel {
@   family = "attn_bwd_dq", pass = "bwd", causal = true, varlen = true, interface = { "k_packed" }, flops = { pair = spec.heads * (spec.d_v + 2 * (spec.d_n + spec.d_r)) },
@   doc = "explicit-form attention backward on tensor cores: deterministic dQ (FlashAttention-2, recomputing P and dP)",
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
@     { name = "dq",     type = "elem_t*",       shape = "[B, S_q, H, d_n + d_r]", doc = "gradient of Q (16-bit, scale applied)" },
@     { name = "seqlen_q", type = "int", doc = "query tokens per batch item" },
@     { name = "seqlen_k", type = "int", doc = "key tokens per batch item" },
@     { name = "q_pos0",   type = "int", doc = "global position of query row 0 (keys start at 0); rows i < q_split are at q_pos0 + i; causal keeps key j for row i iff j <= pos(i)" },
@     { name = "q_split",  type = "int", doc = "first row of the second chunk (0: one chunk at q_pos1)" },
@     { name = "q_pos1",   type = "int", doc = "global position of row q_split; rows i >= q_split are at q_pos1 + i - q_split; >= q_pos0 + q_split (positions increase)" },
@     { name = "softmax_scale", type = "float", doc = "mscale^2 / sqrt(d_n + d_r)" },
@   }, PACKED)),
@   tunables = {
@     block_m   = { values = { 32, 64, 128 }, doc = "query rows per CTA (16 per warp)" },
@     num_warps = { values = { 2, 4, 8 },     doc = "warps per CTA: block_m / 16" },
@     block_n   = { values = { 32, 64 },      doc = "keys per K/V tile" },
@     stages    = { values = { 1, 2 },        doc = "K/V tiles in shared memory (2: the next loads during the compute)" },
@     k_packed  = { values = { 0, 1 },        doc = "0: k_nope + shared k_rope; 1: per-head K [B, S_k, H, d_n + d_r] in k_nope" },
@   },
@   check = function(s, c)
@     if DN % 16 ~= 0 or DR % 16 ~= 0 or DV % 16 ~= 0 then
@       return "d_n, d_r and d_v must be multiples of 16 (the mma k step and ldmatrix.x4 pairs)"
@     end
@     if c.block_m ~= 16 * c.num_warps then return "block_m must be 16 * num_warps (each warp owns 16 query rows)" end
@     if accumulators(c) > ACC_LIMIT then
@       return string.format("d_qk/2 + block_n = %d fp32 accumulators per thread, over %d (registers would spill)",
@                            accumulators(c), ACC_LIMIT)
@     end
@     if smem_bytes(c) > SMEM_LIMIT then
@       return string.format("needs %d bytes of shared memory, over the %d-byte limit", smem_bytes(c), SMEM_LIMIT)
@     end
@   end,
@   default = function(s)
@     for _, bn in ipairs({ 64, 32 }) do
@       local c = { block_m = 64, num_warps = 4, block_n = bn, stages = 2, k_packed = 0 }
@       if accumulators(c) <= ACC_LIMIT and smem_bytes(c) <= SMEM_LIMIT then return c end
@     end
@     return { block_m = 32, num_warps = 2, block_n = 32, stages = 1, k_packed = 0 }
@   end,
@   name = function(s, c)
@     return string.format("mla_attn_bwd_dq_h%d_dn%d_dr%d_dv%d_%s_%s_bm%d_bn%d_st%d%s", H, DN, DR, DV,
@                          s.dtype, s.causal and "causal" or "full", c.block_m, c.block_n, c.stages,
@                          c.k_packed == 1 and "_kpacked" or "")
@   end,
@   launch = function(s, c)
@     return {
@       grid = { { arg = "seqlen_q", div = c.block_m }, { value = H }, { arg = "batch" } },
@       block = { 32 * c.num_warps, 1, 1 },
@       smem = smem_bytes(c),
@       smem_static = 0,
@     }
@   end,
@ }
@ assert(PACKED == (K.config.k_packed == 1))
@ local C = K.config
// Generated by mlagen from templates/attn_bwd_dq.cu.tpl: do not edit.
// MLA attention backward, deterministic dQ, on tensor cores, H=${H} d_n=${DN} d_r=${DR} d_v=${DV},
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
constexpr int BLOCK_M = ${C.block_m};
constexpr int BLOCK_N = ${C.block_n};
constexpr int STAGES = ${C.stages};
constexpr int PAD = ${PAD};
constexpr int QS = DQK + PAD;
constexpr int OS = DV + PAD;
constexpr int KS = DQK + PAD;
constexpr int VS = DV + PAD;
constexpr int K_ELEMS = BLOCK_N * KS;
constexpr int V_ELEMS = BLOCK_N * VS;
constexpr int NT_S = BLOCK_N / 8;
constexpr int NT_Q = DQK / 8;
constexpr int VEC = mla::CHUNK;
constexpr bool K_PACKED = ${PACKED and "true" or "false"};  // key layout: mla::cp_async_k_tile
constexpr int TPR_Q = mla::copy_tpr(DQK / VEC);
constexpr int TPR_K = mla::copy_tpr(DN / VEC) < mla::copy_tpr(DR / VEC) ? mla::copy_tpr(DN / VEC) : mla::copy_tpr(DR / VEC);
constexpr int TPR_V = mla::copy_tpr(DV / VEC);
static_assert(DN % 16 == 0 && DR % 16 == 0 && DV % 16 == 0, "head dims must be multiples of 16");
static_assert(BLOCK_M == 16 * NUM_WARPS && BLOCK_N % 16 == 0, "tile shape");

}  // namespace

${kernel_open(K, "NUM_THREADS")}
  elem_t* const sQ = reinterpret_cast<elem_t*>(smem);  // [BLOCK_M][QS]
  elem_t* const sO = sQ + BLOCK_M * QS;                 // [BLOCK_M][OS]: dO
  elem_t* const sK = sO + BLOCK_M * OS;                 // STAGES x [BLOCK_N][KS]
  elem_t* const sV = sK + STAGES * K_ELEMS;             // STAGES x [BLOCK_N][VS]

${thread_prologue()}
  const int m0 = blockIdx.x * BLOCK_M;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int wrow = warp * 16;
  const int i0 = m0 + wrow;
  const mla::QueryPos qpos{q_pos0, q_split, q_pos1};  // rows' global positions

@ if VARLEN then
  // Packed sequences, as attn_fwd's: nv valid rows (a prefix), this thread's rows' key
  // ranges kr, the CTA's key tiles [tile0, tile0 + n_tiles), zeros from k_end on.
  const mla::Varlen vl{cu_seqlens, n_seqs};
  const int nv = min(seqlen_q, qpos.first_row_at(cu_seqlens[n_seqs]));
  mla::RowRanges kr;
#pragma unroll
  for (int r = 0; r < 2; ++r) kr.set_keys<CAUSAL>(r, vl, i0 + g + 8 * r < nv, qpos(i0 + g + 8 * r), seqlen_k);
  kr.warp_reduce();  // over the warp's 16 rows
  int tile0, n_tiles, k_end;
  mla::varlen_key_tiles<CAUSAL, BLOCK_N>(vl, qpos, m0, min(m0 + BLOCK_M, seqlen_q) - 1, seqlen_k, tile0, n_tiles, k_end);
@ else
  const int q_last = min(m0 + BLOCK_M, seqlen_q) - 1;
  const int n_tiles = mla::visible_key_tiles<CAUSAL, BLOCK_N>(seqlen_k, 0, qpos(q_last));
@ end
  const float scale_log2 = softmax_scale * mla::LOG2E;

  const int tr_q = tid / TPR_Q, tc_q = tid % TPR_Q;
  const int tr_k = tid / TPR_K, tc_k = tid % TPR_K;
  const int tr_v = tid / TPR_V, tc_v = tid % TPR_V;

  // Q and dO tiles (zero past seqlen_q), only when some key is visible.
  if (n_tiles > 0) {
    mla::cp_async_tile<BLOCK_M, DQK, QS, TPR_Q, NUM_THREADS>(sQ, tr_q, tc_q, m0, ${VARLEN and "nv" or "seqlen_q"}, [&](int i) {
      return q + (((size_t)b * seqlen_q + i) * H + h) * DQK;
    });
    mla::cp_async_tile<BLOCK_M, DV, OS, TPR_V, NUM_THREADS>(sO, tr_v, tc_v, m0, ${VARLEN and "nv" or "seqlen_q"}, [&](int i) {
      return dout + (((size_t)b * seqlen_q + i) * H + h) * DV;
    });
  }

  auto load_kv = [&](int tile, int st) {
    const int n0 = ${TILE("tile")} * BLOCK_N;
    mla::cp_async_k_tile<BLOCK_N, DN, DR, H, K_PACKED, KS, TPR_K, NUM_THREADS>(sK + st * K_ELEMS, tr_k, tc_k, n0, ${VARLEN and "k_end" or "seqlen_k"},
                                                                              b, h, k_nope, k_rope${PACKED and "" or ", ld_k_rope"});
    mla::cp_async_tile<BLOCK_N, DV, VS, TPR_V, NUM_THREADS>(sV + st * V_ELEMS, tr_v, tc_v, n0, ${VARLEN and "k_end" or "seqlen_k"},
                                                            [&](int j) { return v + (((size_t)b * seqlen_k + j) * H + h) * DV; });
  };

  // This thread's rows g and g + 8: LSE in base 2 (+inf: P = 0) and delta.
  float lse2[2], dlt[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = i0 + g + 8 * r;
    lse2[r] = mla::pos_inf();
    dlt[r] = 0.f;
    if (i < ${VARLEN and "nv" or "seqlen_q"}) {
      const size_t row = ((size_t)b * H + h) * seqlen_q + i;
      const float x = lse[row];
      lse2[r] = mla::lse_log2(x);
      dlt[r] = delta[row];
    }
  }

  // ldmatrix lane offsets: A from [row][k] (Q, dO: this warp's rows), B from [n][k] (K, V
  // rows), B by .trans from [k][n] (K as [key][dim]).
  const int a_row = wrow + mla::ldm_a_row(lane), a_col = mla::ldm_a_col(lane);
  const int b_row = mla::ldm_b_row(lane), b_col = mla::ldm_b_col(lane);
  const int bt_row = mla::ldm_a_row(lane), bt_col = mla::ldm_a_col(lane);
  const int qa_off = a_row * QS + a_col;
  const int oa_off = a_row * OS + a_col;
  const int kb_off = b_row * KS + b_col;
  const int vb_off = b_row * VS + b_col;
  const int kt_off = bt_row * KS + bt_col;

  float dqacc[NT_Q][4];
#pragma unroll
  for (int d = 0; d < NT_Q; ++d)
#pragma unroll
    for (int e = 0; e < 4; ++e) dqacc[d][e] = 0.f;

  auto compute = [&](int tile, int st) {
    const int n0 = ${TILE("tile")} * BLOCK_N;
    const elem_t* const tk = sK + st * K_ELEMS;
    const elem_t* const tv = sV + st * V_ELEMS;
    float s[NT_S][4];
    mla::warp_gemm_abt<elem_t, DQK, BLOCK_N, KS, 4>(s, sQ + qa_off, tk + kb_off);
@ if VARLEN then
    const bool edge = !kr.inside(n0, n0 + BLOCK_N);
#pragma unroll
    for (int n = 0; n < NT_S; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float p = exp2f(s[n][e] * scale_log2 - lse2[e >> 1]);
        if (edge) {
          if (kr.hides(e >> 1, n0 + n * 8 + 2 * t + (e & 1))) p = 0.f;
        }
        s[n][e] = p;
      }
@ else
    const bool edge = n0 + BLOCK_N > seqlen_k || (CAUSAL && n0 + BLOCK_N - 1 > qpos(i0));
#pragma unroll
    for (int n = 0; n < NT_S; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float p = exp2f(s[n][e] * scale_log2 - lse2[e >> 1]);
        if (edge) {
          if (mla::key_hidden<CAUSAL>(n0 + n * 8 + 2 * t + (e & 1), qpos(i0 + g + (e >> 1) * 8), seqlen_k, 0)) p = 0.f;
        }
        s[n][e] = p;
      }
@ end
    // dP = dO V^T
    float dp[NT_S][4];
    mla::warp_gemm_abt<elem_t, DV, BLOCK_N, VS, 4>(dp, sO + oa_off, tv + vb_off);
    // dS = P (dP - delta) as A fragments, then dQ += dS K.
    unsigned da[BLOCK_N / 16][4];
#pragma unroll
    for (int n = 0; n < NT_S; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] *= dp[n][e] - dlt[e >> 1];
#pragma unroll
    for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
      mla::c_to_a<elem_t>(da[kk], s[2 * kk], s[2 * kk + 1]);
    }
    mla::warp_gemm_rs<elem_t, BLOCK_N, DQK, KS>(dqacc, da, tk + kt_off);
  };

  auto warp_active = [&](int tile) {
@ if VARLEN then
    const int n0 = ${TILE("tile")} * BLOCK_N;
    return kr.meets(n0, n0 + BLOCK_N);
@ else
    return i0 < seqlen_q && (!CAUSAL || tile * BLOCK_N <= qpos(i0 + 15));
@ end
  };

  if (n_tiles > 0) load_kv(0, 0);
  mla::cp_async_commit();  // Q, dO and tile 0
  if (STAGES == 2) {
    if (n_tiles > 1) load_kv(1, 1);
    mla::cp_async_commit();
  }
  for (int j = 0; j < n_tiles; ++j) {
    const int st = STAGES == 2 ? (j & 1) : 0;
    if (STAGES == 2)
      mla::cp_async_wait<1>();
    else
      mla::cp_async_wait<0>();
    __syncthreads();  // tile j (and Q, dO) in
    if (warp_active(j)) compute(j, st);
    __syncthreads();  // every warp is done with stage st
    if (STAGES == 2) {
      if (j + 2 < n_tiles) load_kv(j + 2, st);
    } else {
      if (j + 1 < n_tiles) load_kv(j + 1, 0);
    }
    mla::cp_async_commit();
  }
  mla::cp_async_wait<0>();

  // dq = scale dQ, straight from the fragments (rows past seqlen_q are not written).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = i0 + g + 8 * r;
    if (i < seqlen_q) {
      elem_t* dst = dq + (((size_t)b * seqlen_q + i) * H + h) * DQK + 2 * t;
#pragma unroll
      for (int d = 0; d < NT_Q; ++d)
        *reinterpret_cast<unsigned*>(dst + d * 8) =
            mla::pack2<elem_t>(softmax_scale * dqacc[d][2 * r], softmax_scale * dqacc[d][2 * r + 1]);
    }
  }
}
