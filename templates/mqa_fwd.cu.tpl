@ -- mqa_fwd: absorbed-form MLA attention forward, MQA over the latent (arXiv 2405.04434,
@ -- 2.1.3; docs/absorbed.md). One shared head c = [c_kv ; k_rope] [B, S_k, d_c + d_r]
@ -- is the keys, and its first d_c columns, the same bytes, are the values: each key tile
@ -- is loaded into shared memory once and serves S = Q K^T and O += P V. H absorbed query
@ -- heads q [B, S_q, H, d_c + d_r] attend to it; o [B, S_q, H, d_c], lse [B, H, S_q].
@ --
@ -- FlashAttention-2 (arXiv 2307.08691) on mma.sync.m16n8k16 (bf16/fp16 in, fp32 accumulate).
@ --   Rows       heads are packed into the M dimension (as FlashMLA does): q[b] is viewed as
@ --              a [S_q * H, d_qk] matrix whose row r = i * H + h is query i of head h (the
@ --              tensor's own layout, so Q and O tiles are contiguous rows), o[b] as
@ --              [S_q * H, d_c]. A CTA owns block_m consecutive rows of one batch item; row r
@ --              has position i = r / H (H is a compile-time constant). Every row of a tile
@ --              sees the same keys except for the causal limit q_pos0 + r / H.
@ --   Warps      the CTA's rows form block_m / 16 row groups of 16; each row group is served
@ --              by nsplit warps (num_warps = block_m / 16 * nsplit). A d_c = 512 fp32 O of
@ --              16 rows would be 256 registers per thread: warp s of a group accumulates only
@ --              O[16, d_c / nsplit columns starting at s * d_c / nsplit].
@ --   S = Q K^T  split by keys: warp s computes S for keys [s, s + 1) * block_n / nsplit of
@ --              the tile over the full d_qk (Q's A fragments by ldmatrix.x4 from the Q tile,
@ --              re-read for every key tile; K's B fragments by ldmatrix.x4, or .x2 for 8 keys).
@ --   softmax    online, in base 2. Each warp reduces its part of a row's max over the quad
@ --              and writes it to shared memory (red[row][s]); after a barrier every warp of the
@ --              group takes the max over the nsplit parts, so all agree on the running max
@ --              and the rescale factor. Each warp keeps the row sum of its own keys; the
@ --              nsplit partial sums are added in the epilogue through the same smem array.
@ --   O += P V   P is written to shared memory as 16-bit values ([block_m][block_n]); after a
@ --              barrier each warp reads P's A fragments for its 16 rows and all block_n keys
@ --              by ldmatrix.x4, and V's B fragments for its d_c / nsplit columns by
@ --              ldmatrix.x4.trans straight from the K tile (columns [0, d_c) of c).
@ -- Barriers per key tile: data in (+ previous tile done), max parts written, P written
@ -- (+ one more with one stage: the tile is free). They are __syncthreads: the row groups
@ -- are in lockstep anyway, since every tile is shared by all of them.
@ -- Masking: keys past seqlen_k, and (causal) key j for row r when j > q_pos0 + r / H. Key
@ -- tiles entirely past the CTA's last row's position are never loaded; a row group skips
@ -- the tiles entirely past its own last row (all nsplit warps alike, so it still reaches
@ -- every barrier); only tiles that cross the diagonal or the end of the keys are masked
@ -- element by element. Shared-memory rows are padded by 16 bytes (an odd number of 16-byte
@ -- units per row), so the 8 rows of an ldmatrix hit 8 distinct bank groups. O leaves
@ -- through shared memory (the Q area, row stride d_qk + 8) as 16-byte stores, each warp
@ -- its own columns.
@ -- Packed sequences (spec.varlen; VARLEN.md, mla::Varlen, batch 1): row r at token
@ -- q_pos0 + r / H sees the keys [lo, hi) of its document. A CTA's key tiles run from its
@ -- first row's lo to its last valid row's hi (keys outside load as zeros); a row group
@ -- skips tiles outside its rows' ranges and masks, by select, where a tile's keys are not
@ -- in every row's range (NaN scores of slack rows become -inf). Slack rows: o 0, lse -inf.
@ --
@ -- Shared memory (bytes, 16-bit elements): Q block_m (d_qk + 8) + stages block_n (d_qk + 8)
@ -- + P block_m (block_n + 8), times 2, + 4 block_m nsplit (row max / sum parts).
@ -- 576/512 at the default (block_m 64, block_n 32, stages 2, nsplit 2):
@ -- 74752 + 74752 + 5120 + 512 = 155136 bytes, under sm_80's 163 KiB.
@ local H, DC, DR = spec.heads, spec.d_c, spec.d_r
@ local DQK = DC + DR
@ local ESIZE = elem_size(spec.dtype)
@ local PAD = 8                       -- elements of padding per smem row: 16 bytes
@ local SMEM_LIMIT = smem_limit()
@
@ local function num_warps(c) return c.block_m // 16 * c.nsplit end
@ local function smem_bytes(c)
@   local q = c.block_m * (DQK + PAD)               -- Q tile, later O staging
@   local k = c.stages * c.block_n * (DQK + PAD)    -- key (and value) tiles
@   local p = c.block_m * (c.block_n + PAD)         -- P
@   return ESIZE * (q + k + p) + 4 * c.block_m * c.nsplit
@ end
@ -- fp32 accumulators per thread: O (d_c / nsplit / 2) plus the larger of S (block_n /
@ -- nsplit / 2) and P's A fragments (block_n / 4, 32-bit registers), which are not live at
@ -- once. The limit follows the register budget __launch_bounds__ gives: 255 up to 256
@ -- threads, 128 at 512. Measured (NVRTC, sm_80 and sm_90a): 576/512 at 8 warps with 144
@ -- accumulators uses 242 registers and no spill; at 16 warps (nsplit 4, block_m 64) 72
@ -- and 80 accumulators spill on sm_90a (8 and 36 bytes), so 16 warps allow 64.
@ local function accumulators(c)
@   return DC // c.nsplit // 2 + math.max(c.block_n // c.nsplit // 2, c.block_n // 4)
@ end
@ local function acc_limit(c) return num_warps(c) <= 8 and 160 or 64 end
@
@ local K = kernel {
@   family = "mqa_fwd", pass = "fwd", causal = true, varlen = true, flops = { pair = 2 * spec.heads * ((spec.d_c + spec.d_r) + spec.d_c) },
@   doc = "absorbed-form MQA attention forward over the latent (keys [c_kv ; k_rope], values c_kv): O and LSE",
@   params = {
@     { name = "q",   type = "const elem_t*", shape = "[B, S_q, H, d_c + d_r]", doc = "absorbed queries [W_UK^T q_nope ; q_rope] per head, RoPE part last" },
@     { name = "c",   type = "const elem_t*", shape = "[B, S_k, d_c + d_r]",    doc = "the shared latent head: keys [c_kv ; k_rope]; values are its first d_c columns" },
@     { name = "o",   type = "elem_t*",       shape = "[B, S_q, H, d_c]",       doc = "attention output in the latent space; 0 for a row without keys" },
@     { name = "lse", type = "float*",        shape = "[B, H, S_q]",            doc = "natural-log logsumexp of the scaled scores; -inf for a row without keys" },
@     { name = "seqlen_q", type = "int", doc = "query tokens per batch item" },
@     { name = "seqlen_k", type = "int", doc = "key tokens per batch item" },
@     { name = "q_pos0",   type = "int", doc = "global position of query 0 (keys start at 0); causal keeps key j for query i iff j <= q_pos0 + i" },
@     { name = "softmax_scale", type = "float", doc = "mscale^2 / sqrt(d_n + d_r) (the explicit form's scale)" },
@     table.unpack(varlen_params())
@   },
@   tunables = {
@     block_m = { values = { 32, 64 }, doc = "flattened (token, head) rows per CTA: 16 per row group" },
@     block_n = { values = { 32, 64 }, doc = "keys per K tile (the K tile is also the V tile)" },
@     nsplit  = { values = { 2, 4 },   doc = "warps per 16-row group: each holds d_c / nsplit columns of O and computes S for block_n / nsplit keys" },
@     stages  = { values = { 1, 2 },   doc = "1: one K tile, loaded after the previous one is consumed; 2: double-buffered, tile j+1 loads while tile j is computed" },
@   },
@   check = function(s, c)
@     if DC % 16 ~= 0 or DR % 16 ~= 0 then
@       return "d_c and d_r must be multiples of 16 (the mma k step and ldmatrix.x4 pairs)"
@     end
@     if DC % (16 * c.nsplit) ~= 0 then return "d_c must be a multiple of 16 * nsplit (each warp's O columns)" end
@     if accumulators(c) > acc_limit(c) then
@       return string.format("d_c/nsplit/2 + max(block_n/nsplit/2, block_n/4) = %d fp32 accumulators per thread, over %d at %d warps (registers would spill)",
@                            accumulators(c), acc_limit(c), num_warps(c))
@     end
@     if smem_bytes(c) > SMEM_LIMIT then
@       return string.format("needs %d bytes of shared memory, over the %d-byte limit", smem_bytes(c), SMEM_LIMIT)
@     end
@   end,
@   default = function(s)
@     local prefs = {
@       { block_m = 64, block_n = 64, stages = 2 }, { block_m = 64, block_n = 32, stages = 2 },
@       { block_m = 64, block_n = 64, stages = 1 }, { block_m = 64, block_n = 32, stages = 1 },
@       { block_m = 32, block_n = 32, stages = 2 }, { block_m = 32, block_n = 32, stages = 1 },
@     }
@     for _, p in ipairs(prefs) do
@       for _, ns in ipairs({ 2, 4 }) do
@         local c = { block_m = p.block_m, block_n = p.block_n, stages = p.stages, nsplit = ns }
@         if DC % (16 * ns) == 0 and accumulators(c) <= acc_limit(c) and smem_bytes(c) <= SMEM_LIMIT then
@           return c
@         end
@       end
@     end
@     return { block_m = 32, block_n = 32, stages = 1, nsplit = 2 }
@   end,
@   name = function(s, c)
@     return string.format("mla_mqa_fwd_h%d_dc%d_dr%d_%s_%s_bm%d_bn%d_ns%d_st%d", H, DC, DR,
@                          s.dtype, s.causal and "causal" or "full", c.block_m, c.block_n,
@                          c.nsplit, c.stages)
@   end,
@   launch = function(s, c)
@     return {
@       grid = { { arg = "seqlen_q", mul = H, div = c.block_m }, { value = 1 }, { arg = "batch" } },
@       block = { 32 * num_warps(c), 1, 1 },
@       smem = smem_bytes(c),   -- dynamic; over 48 KiB needs cudaFuncAttributeMaxDynamicSharedMemorySize
@       smem_static = 0,
@     }
@   end,
@ }
@ local C = K.config
@ -- The key tile of loop step j: packed kernels start at the CTA's first one, j0 (the
@ -- unpacked text stays "j": even a constexpr 0 + j changes the optimized code).
@ local function tile(j) return spec.varlen and ("j0 + " .. j) or tostring(j) end
// Generated by mlagen from templates/mqa_fwd.cu.tpl: do not edit.
// Absorbed-form MLA attention forward (MQA over the latent), H=${H} d_c=${DC} d_r=${DR},
// ${spec.dtype}, ${spec.causal and "causal" or "non-causal"}.
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
constexpr int BLOCK_M = ${C.block_m};  // rows (r = i * H + h) per CTA
constexpr int BLOCK_N = ${C.block_n};
constexpr int NSPLIT = ${C.nsplit};    // warps per 16-row group
constexpr int STAGES = ${C.stages};
constexpr int NUM_WARPS = BLOCK_M / 16 * NSPLIT;
constexpr int NUM_THREADS = 32 * NUM_WARPS;
constexpr int KW = BLOCK_N / NSPLIT;   // keys per warp in S
constexpr int DCW = DC / NSPLIT;       // O columns per warp
constexpr int PAD = ${PAD};
constexpr int QS = DQK + PAD;      // smem row strides in elements: 16 bytes of padding makes
constexpr int KS = DQK + PAD;      // each row an odd number of 16-byte units, so ldmatrix's
constexpr int PS = BLOCK_N + PAD;  // 8 rows fall in 8 distinct bank groups
constexpr int K_ELEMS = BLOCK_N * KS;  // one K stage
constexpr int NT_S = KW / 8;           // m16n8 tiles of S per warp
constexpr int NT_O = DCW / 8;          // m16n8 tiles of O per warp
constexpr int VEC = mla::CHUNK;                 // elements per 16-byte copy
// Threads per row in the tile copies (see mla::cp_async_tile).
constexpr int TPR = mla::copy_tpr(DQK / VEC);
static_assert(DC % (16 * NSPLIT) == 0 && DR % 16 == 0, "head dims");
static_assert(KW % 8 == 0 && BLOCK_N % 16 == 0 && BLOCK_M % 16 == 0, "tile shape");

}  // namespace

${kernel_open(K, "NUM_THREADS")}
@ if not spec.varlen then
  constexpr const int* cu_seqlens = nullptr;  // not packed: the code using them is discarded
  constexpr int n_seqs = 0;
@ end
  elem_t* const sQ = reinterpret_cast<elem_t*>(smem);  // [BLOCK_M][QS], then O staging
  elem_t* const sK = sQ + BLOCK_M * QS;                // STAGES x [BLOCK_N][KS]
  elem_t* const sP = sK + STAGES * K_ELEMS;            // [BLOCK_M][PS]
  float* const sRed = reinterpret_cast<float*>(sP + BLOCK_M * PS);  // [BLOCK_M][NSPLIT]

${thread_prologue()}
  const int rgrp = warp / NSPLIT;  // the warp's row group
  const int sp = warp % NSPLIT;    // its part: keys [sp * KW, +KW) of S, columns [sp * DCW, +DCW) of O
  const int rows = seqlen_q * H;   // flattened rows of a batch item
  const int m0 = blockIdx.x * BLOCK_M;
  const int b = blockIdx.z;
  const int wrow = rgrp * 16;  // the group's first row in the tile
  const int r0 = m0 + wrow;    // its flattened row index
  const int pos_first = r0 / H;         // the group's first and (an upper bound of) last
  const int pos_last = (r0 + 15) / H;   // query positions, minus q_pos0

  // Keys this CTA can see: with causal masking, none past its last row's position.
  const int q_last = (min(m0 + BLOCK_M, rows) - 1) / H;
  int n_tiles = mla::visible_key_tiles<CAUSAL, BLOCK_N>(seqlen_k, q_pos0, q_last);
  int j0 = 0;            // the CTA's key tiles are j0 .. j0 + n_tiles - 1
  int k_end = seqlen_k;  // keys from k_end on load as zeros
  mla::RowRanges kr;     // packed: the keys of this thread's rows g, g + 8 and of its group's
  if constexpr (VARLEN) {
    // The CTA's keys run from its first row's lo to its last valid row's hi (the ranges
    // are monotone in the row; slack rows see none); keys outside them load as zeros, so
    // NaN in slack keys cannot reach P V. Its rows' own ranges mask element by element.
    const mla::Varlen vl{cu_seqlens, n_seqs};
    mla::varlen_key_tiles<CAUSAL, BLOCK_N>(vl, mla::QueryPos{q_pos0, 0, q_pos0}, m0 / H, q_last, seqlen_k, j0, n_tiles, k_end);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = r0 + g + 8 * r;
      kr.set_keys<CAUSAL>(r, vl, row < rows, q_pos0 + row / H, seqlen_k);
    }
    kr.warp_reduce();  // the warp's 16 rows are its group's
  }
  const float scale_log2 = softmax_scale * mla::LOG2E;

  // Tile copies (mla::cp_async_tile): TPR threads per row.
  const int tr = tid / TPR, tc = tid % TPR;

  // Q tile: rows past S_q * H are zero (and never written out). Not needed, and not
  // loaded, when no key is visible.
  if (n_tiles > 0)
    mla::cp_async_tile<BLOCK_M, DQK, QS, TPR, NUM_THREADS>(sQ, tr, tc, m0, rows,
                                                           [&](int i) { return q + ((size_t)b * rows + i) * DQK; });

  // One key tile into stage st; keys past seqlen_k (packed: past the CTA's keys) are
  // zero-filled (masked later, and 0 * 0 in P V).
  auto load_k = [&](int tile, int st) {
    mla::cp_async_tile<BLOCK_N, DQK, KS, TPR, NUM_THREADS>(sK + st * K_ELEMS, tr, tc, tile * BLOCK_N, k_end,
                                                           [&](int j) { return c + ((size_t)b * seqlen_k + j) * DQK; });
  };

  // This lane's ldmatrix row offsets (elements). A of Q and of P (x4): rows 0-7 / 8-15 at
  // columns +0, then the same at +8. B of K (x4): keys 0-7 at dims +0 / +8, then keys 8-15
  // (x2: the first two). B of V (x4.trans): keys 0-7 / 8-15 at columns +0, then at +8.
  const int q_off = (wrow + mla::ldm_a_row(lane)) * QS + mla::ldm_a_col(lane);
  const int p_off = (wrow + mla::ldm_a_row(lane)) * PS + mla::ldm_a_col(lane);
  const int k_off = (sp * KW + mla::ldm_b_row(lane)) * KS + mla::ldm_b_col(lane);
  const int v_off = (mla::ldm_a_row(lane)) * KS + mla::ldm_a_col(lane) + sp * DCW;

  float o_acc[NT_O][4];
#pragma unroll
  for (int d = 0; d < NT_O; ++d)
#pragma unroll
    for (int e = 0; e < 4; ++e) o_acc[d][e] = 0.f;
  mla::OnlineSoftmax<NT_S> sm;  // rows g, g + 8; l: this warp's part of the sums
  float s[NT_S][4];

  // S = Q K^T for this warp's keys of the tile in stage st, scaled to base 2 and masked;
  // then the row maxima of its part go to sRed.
  auto scores = [&](int tile, int st) {
    const int n0 = tile * BLOCK_N + sp * KW;
    mla::warp_gemm_abt<elem_t, DQK, KW, KS, 4>(s, sQ + q_off, sK + st * K_ELEMS + k_off);
    // Element-wise masks only where the tile crosses the end of the keys or the diagonal
    // of this group's rows (packed: where its keys are not in every row's range; a
    // warp-uniform test). A select, so NaN scores of slack rows become -inf.
    bool edge = n0 + KW > seqlen_k || (CAUSAL && n0 + KW - 1 > q_pos0 + pos_first);
    if constexpr (VARLEN) edge = !kr.inside(n0, n0 + KW);
#pragma unroll
    for (int n = 0; n < NT_S; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[n][e] * scale_log2;
        if (edge) {
          bool hidden;
          if constexpr (VARLEN)
            hidden = kr.hides(e >> 1, n0 + n * 8 + 2 * t + (e & 1));
          else
            hidden = mla::key_hidden<CAUSAL>(n0 + n * 8 + 2 * t + (e & 1), (r0 + g + (e >> 1) * 8) / H, seqlen_k, q_pos0);
          if (hidden) x = mla::neg_inf();
        }
        s[n][e] = x;
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float mx = mla::quad_max(sm.row_max(s, r, mla::neg_inf()));
      if (t == 0) sRed[(wrow + g + 8 * r) * NSPLIT + sp] = mx;
    }
  };

  // Online softmax (after the max parts are in): the row's max over the NSPLIT parts, S
  // becomes P, written to sP as 16-bit; O and this warp's sums are rescaled.
  auto softmax = [&]() {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float* red = sRed + (wrow + g + 8 * r) * NSPLIT;
      float mx = sm.m[r];
#pragma unroll
      for (int k = 0; k < NSPLIT; ++k) mx = fmaxf(mx, red[k]);
      sm.update(s, o_acc, r, mx);
    }
    elem_t* pw = sP + (wrow + g) * PS + sp * KW + 2 * t;
#pragma unroll
    for (int n = 0; n < NT_S; ++n) {
      *reinterpret_cast<unsigned*>(pw + n * 8) = mla::pack2<elem_t>(s[n][0], s[n][1]);
      *reinterpret_cast<unsigned*>(pw + 8 * PS + n * 8) = mla::pack2<elem_t>(s[n][2], s[n][3]);
    }
  };

  // O[:, this warp's columns] += P V for the tile in stage st: P's A fragments (all
  // BLOCK_N keys of the group's 16 rows) from sP, V's from the K tile's first DC columns.
  auto pv = [&](int st) {
    unsigned pa[BLOCK_N / 16][4];
#pragma unroll
    for (int kk = 0; kk < BLOCK_N / 16; ++kk) mla::ldmatrix_x4(pa[kk], sP + p_off + kk * 16);
    mla::warp_gemm_rs<elem_t, BLOCK_N, DCW, KS>(o_acc, pa, sK + st * K_ELEMS + v_off);
  };

  // A row group works on a tile only if it has a row in range that sees one of its keys
  // (uniform over the group's NSPLIT warps).
  auto group_active = [&](int tile) {
    if constexpr (VARLEN) return kr.meets(tile * BLOCK_N, (tile + 1) * BLOCK_N);
    return r0 < rows && (!CAUSAL || tile * BLOCK_N <= q_pos0 + pos_last);
  };

@ if C.stages == 1 then
  // One K tile: tile j+1 loads once every warp is done with tile j.
  if (n_tiles > 0) load_k(${tile(0)}, 0);
  mla::cp_async_commit();  // Q and K_0
  for (int j = 0; j < n_tiles; ++j) {
    const bool active = group_active(${tile("j")});
    mla::cp_async_wait<0>();
    __syncthreads();  // K_j (and Q) in
    if (active) scores(${tile("j")}, 0);
    __syncthreads();  // the row max parts in
    if (active) softmax();
    __syncthreads();  // P in
    if (active) pv(0);
    __syncthreads();  // every warp is done with K_j
    if (j + 1 < n_tiles) load_k(${tile("j + 1")}, 0);
    mla::cp_async_commit();
  }
@ else
  // Double-buffered: tile j+1 loads into the other stage while tile j is computed.
  if (n_tiles > 0) load_k(${tile(0)}, 0);
  mla::cp_async_commit();  // Q and K_0
  for (int j = 0; j < n_tiles; ++j) {
    const int st = j & 1;
    const bool active = group_active(${tile("j")});
    mla::cp_async_wait<0>();
    __syncthreads();  // K_j (and Q) in; every warp is done with tile j-1 (its stage, sP, sRed)
    if (j + 1 < n_tiles) load_k(${tile("j + 1")}, st ^ 1);
    mla::cp_async_commit();
    if (active) scores(${tile("j")}, st);
    __syncthreads();  // the row max parts in
    if (active) softmax();
    __syncthreads();  // P in
    if (active) pv(st);
  }
@ end

  // Epilogue: the row sums' NSPLIT parts through sRed (every read of it, of Q and of P
  // is before the loop's last barrier), O = acc / l staged in the Q area, LSE =
  // ln(sum exp(scaled score)) = (m + log2 l) * ln 2. Every copy has landed: the groups
  // still pending are empty; without key tiles Q was never loaded.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = mla::quad_sum(sm.l[r]);
    if (t == 0) sRed[(wrow + g + 8 * r) * NSPLIT + sp] = l;
  }
  __syncthreads();  // the sum parts in
  float l_row[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float* red = sRed + (wrow + g + 8 * r) * NSPLIT;
    float l = 0.f;
#pragma unroll
    for (int k = 0; k < NSPLIT; ++k) l += red[k];
    l_row[r] = l;
  }
  const float inv0 = sm.inv(l_row[0]), inv1 = sm.inv(l_row[1]);
  elem_t* const sO = sQ + wrow * QS + sp * DCW;  // this warp's 16 rows and DCW columns
#pragma unroll
  for (int d = 0; d < NT_O; ++d) {
    const int col = d * 8 + 2 * t;
    *reinterpret_cast<unsigned*>(sO + g * QS + col) = mla::pack2<elem_t>(o_acc[d][0] * inv0, o_acc[d][1] * inv0);
    *reinterpret_cast<unsigned*>(sO + (g + 8) * QS + col) = mla::pack2<elem_t>(o_acc[d][2] * inv1, o_acc[d][3] * inv1);
  }
  __syncwarp();
  constexpr int CPR = DCW / VEC;  // 16-byte chunks per row of this warp's columns
#pragma unroll
  for (int it = 0; it < (16 * CPR + 31) / 32; ++it) {
    const int idx = it * 32 + lane;
    if ((16 * CPR) % 32 == 0 || idx < 16 * CPR) {
      const int r = idx / CPR, col = (idx % CPR) * VEC;
      if (r0 + r < rows)
        *reinterpret_cast<uint4*>(o + ((size_t)b * rows + r0 + r) * DC + sp * DCW + col) =
            *reinterpret_cast<const uint4*>(sO + r * QS + col);
    }
  }
  if (sp == 0 && t == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = r0 + g + 8 * r;
      if (row < rows)
        lse[((size_t)b * H + row % H) * seqlen_q + row / H] = sm.lse(r, l_row[r]);
    }
  }
}
