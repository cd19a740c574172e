@ -- attn_bwd_dq_sm90: the deterministic dQ pass of the explicit-form MLA attention backward for
@ -- Hopper (sm_90a): TMA, mbarriers, wgmma, warp specialization, as attn_fwd_sm90. A drop-in
@ -- for attn_bwd_dq (same parameters and layouts, plus `tmaps`); attn_bwd_dkdv_sm90 does dK
@ -- and dV. sm_90a's row of mg_arch_kernel_table: run in place of attn_bwd_dq there
@ -- (MLAGEN_MMA_SYNC=1 gives that one back).
@ --
@ -- One CTA owns block_m query rows (64 per consumer warpgroup) of one head; the last
@ -- warpgroup is the producer, one thread of which issues the TMA loads: Q and dO once onto
@ -- q_full, then K and V tiles of block_n keys (causal: up to the CTA's last position) into
@ -- stage j % stages of a ring (full[st]: the TMA bytes; empty[st]: every consumer thread's
@ -- arrival). Each consumer thread reads its two rows' LSE and delta from global memory once.
@ -- Per key tile, with wgmma (m64 = the warpgroup's rows; fp32 accumulation):
@ --   S  = Q K^T     ss, both K-major            dP = dO V^T   ss, both K-major (d_v native)
@ --   P  = exp2(S scale log2 e - LSE log2 e), masked only on tiles crossing the end of the
@ --        keys or the warpgroup's diagonal;  dS = P (dP - delta)  (fp32 P)
@ --   dQ += dS K     rs: dS packed to 16 bits in registers; K [key][d_qk] MN-major (K_nope
@ --                  and k_rope boxes of the same width W_K, one run of boxes: n = d_n + d_r)
@ -- dq = scale dQ leaves from the registers in the input dtype; a row without keys gets 0.
@ -- overlap = 1 (FlashAttention-3's pipelining, as attn_fwd_sm90's): per key tile, S is
@ -- issued, then the previous tile's dQ GEMM (its dS kept packed in registers), then dP; the
@ -- softmax runs while those compute, so the tensor cores do not drain between tiles. Every
@ -- GEMM is waited for within its step (nothing in flight across the loop: ptxas would
@ -- serialize every wgmma). overlap = 0: each tile's GEMMs waited for before the next's.
@ -- Every output is written once, by one thread: bit-reproducible.
@ --
@ -- Packed sequences (spec.varlen, "_varlen": cu_seqlens, n_seqs last; batch 1): as
@ -- attn_fwd_sm90's, the key tiles cover [lo of the CTA's first row, hi of its last row with
@ -- keys) and end at that hi, so no slack K or V row reaches shared memory (earlier rows are
@ -- earlier documents' tokens or TMA's zero fill); P outside a row's [lo, hi) and dS where P
@ -- is 0 are selected to 0 (never multiplied: a slack row's dO, LSE and delta may be NaN),
@ -- so a row without keys gets dq = 0. Each consumer runs the tiles its rows need.
@ local H, DN, DR, DV = spec.heads, spec.d_n, spec.d_r, spec.d_v
@ local DQK = DN + DR
@ local ESIZE = elem_size(spec.dtype)
@ local SMEM_LIMIT = smem_limit("sm_90a")   -- sm_90's opt-in dynamic shared memory per block (prelude.lua)
@ -- fp32 accumulators per consumer thread: dQ (d_qk/2) + S + dP (block_n/2 each); the limit
@ -- 224 with one consumer (255 registers), 160 with two (240 after setmaxnreg). The kept
@ -- configurations compile without spills on sm_90a (tests/test_attn_bwd_sm90.c).
@ local function acc_limit(c) return c.block_m == 64 and 224 or 160 end
@ local function accumulators(c) return DQK // 2 + c.block_n end
@ local function smem_bytes(c)
@   return 1024 + ESIZE * (c.block_m * (DQK + DV) + c.stages * c.block_n * (DQK + DV))
@ end
@ local PACKED = spec.config ~= nil and spec.config.k_packed == 1
@ local VARLEN = spec.varlen
@
@ local K = kernel {
@   family = "attn_bwd_dq_sm90", pass = "bwd", causal = true, varlen = true, interface = { "k_packed" }, flops = { pair = spec.heads * (spec.d_v + 2 * (spec.d_n + spec.d_r)) },
@   doc = "explicit-form attention backward for sm_90a (TMA ring, mbarriers, wgmma): deterministic dQ",
@   params = join_lists({
@     { name = "q",      type = "const elem_t*", shape = "[B, S_q, H, d_n + d_r]", doc = "queries, RoPE part last (read through tmaps[0])" },
@   }, explicit_k_params(PACKED, "per-head no-RoPE keys"), {
@     { name = "v",      type = "const elem_t*", shape = "[B, S_k, H, d_v]",       doc = "per-head values (read through tmaps[3])" },
@     { name = "dout",   type = "const elem_t*", shape = "[B, S_q, H, d_v]",       doc = "gradient of the output (read through tmaps[4])" },
@     { name = "lse",    type = "const float*",  shape = "[B, H, S_q]",            doc = "the forward's natural-log LSE" },
@     { name = "delta",  type = "const float*",  shape = "[B, H, S_q]",            doc = "rowsum(dO * O) from attn_bwd_pre" },
@     { name = "dq",     type = "elem_t*",       shape = "[B, S_q, H, d_n + d_r]", doc = "gradient of Q (16-bit, scale applied)" },
@   }, explicit_scalar_params(), {
@     { name = "tmaps", type = "const __grid_constant__ mla::sm90::TensorMaps<5>", shape = "[5]",
@       doc = "5 CUtensorMaps passed by value (kernel parameter space; the host passes 5 contiguous 64-byte aligned CUtensorMaps), made by mg_sm90_bwd_tmaps (runtime/exec/mg_sm90_tmap.h): q, k_nope, k_rope (packed: K's RoPE columns), v, dout" },
@   }, varlen_params()),
@   tunables = {
@     block_m   = { values = { 64, 128 },   doc = "query rows per CTA: 64 per consumer warpgroup (1 or 2 consumers)" },
@     block_n   = { values = { 64, 128 },   doc = "keys per K/V tile (the N of S = Q K^T's wgmma)" },
@     stages    = { values = { 2, 3 },      doc = "K/V tiles in the TMA ring" },
@     k_packed  = { values = { 0, 1 },      doc = "0: k_nope + shared k_rope; 1: per-head K [B, S_k, H, d_n + d_r] in k_nope" },
@     overlap   = { values = { 0, 1 },      doc = "1: a tile's S, the previous tile's dQ and its dP in flight together, its softmax overlapping them (FA3's pipelining); 0: each tile's GEMMs waited for before the next tile's" },
@   },
@   check = function(s, c)
@     if DN % 16 ~= 0 or DR % 16 ~= 0 then return "d_n and d_r must be multiples of 16 (the wgmma k step)" end
@     if DQK ~= 64 and DQK ~= 128 and DQK ~= 192 and DQK ~= 256 then return "d_n + d_r must be 64, 128, 192 or 256 (the N of dQ += dS K's wgmma)" end
@     if DV % 64 ~= 0 then return "d_v must be a multiple of 64" end
@     if accumulators(c) > acc_limit(c) then
@       return string.format("d_qk/2 + block_n = %d fp32 accumulators per thread, over %d (registers would spill)",
@                            accumulators(c), acc_limit(c))
@     end
@     if c.overlap == 1 and c.block_m == 64 and accumulators(c) + c.block_n // 4 > acc_limit(c) then
@       -- measured (NVRTC 13): DeepSeek's heads at block_n 128 (256) serialized every wgmma
@       -- (ptxas C7511, insufficient registers); 224 (d_qk 128) did not, nor two consumers
@       return string.format("overlap = 1: d_qk/2 + block_n + block_n/4 (dS held) = %d, over %d (ptxas would serialize the wgmma)",
@                            accumulators(c) + c.block_n // 4, acc_limit(c))
@     end
@     if smem_bytes(c) > SMEM_LIMIT then
@       return string.format("needs %d bytes of shared memory, over the %d-byte limit", smem_bytes(c), SMEM_LIMIT)
@     end
@   end,
@   default = function(s)
@     for _, p in ipairs({ { 128, 64, 2 }, { 64, 64, 2 } }) do
@       local c = { block_m = p[1], block_n = p[2], stages = p[3], k_packed = 0, overlap = 0 }
@       if accumulators(c) <= acc_limit(c) and smem_bytes(c) <= SMEM_LIMIT then return c end
@     end
@     return { block_m = 64, block_n = 64, stages = 2, k_packed = 0, overlap = 0 }
@   end,
@   name = function(s, c)
@     return string.format("mla_attn_bwd_dq_sm90_h%d_dn%d_dr%d_dv%d_%s_%s_bm%d_bn%d_st%d%s", H, DN, DR, DV,
@                          s.dtype, s.causal and "causal" or "full", c.block_m, c.block_n, c.stages,
@                          c.k_packed == 1 and "_kpacked" or "") .. (c.overlap == 1 and "_ov" or "")
@   end,
@   launch = function(s, c)
@     return {
@       grid = { { arg = "seqlen_q", div = c.block_m }, { value = H }, { arg = "batch" } },
@       block = { 128 * (c.block_m // 64 + 1), 1, 1 },
@       smem = smem_bytes(c),
@       smem_static = 0,
@     }
@   end,
@ }
@ assert(PACKED == (K.config.k_packed == 1))
@ local C = K.config
@ local OV = C.overlap == 1
// Generated by mlagen from templates/attn_bwd_dq_sm90.cu.tpl: do not edit.
// MLA attention backward, deterministic dQ, for sm_90a (TMA + mbarrier ring, wgmma), H=${H} d_n=${DN} d_r=${DR} d_v=${DV},
// ${spec.dtype}, ${spec.causal and "causal" or "non-causal"}, keys ${PACKED and "packed per head" or "split (shared k_rope)"}.
// Dynamic shared memory: ${smem_bytes(C)} bytes.
#include "mla_device_sm90.cuh"

namespace {
${sm90_preamble(spec)}
${explicit_dims(spec, PACKED)}
constexpr int NC = ${C.block_m // 64};
constexpr int NUM_THREADS = 128 * (NC + 1);
constexpr int BLOCK_M = 64 * NC;
constexpr int BLOCK_N = ${C.block_n};
constexpr int STAGES = ${C.stages};
constexpr bool VARLEN = ${VARLEN and "true" or "false"};  // packed sequences (cu_seqlens)
constexpr int WQ = box_width(DQK), WV = box_width(DV);
constexpr int WK = box_width(DN) < box_width(DR) ? box_width(DN) : box_width(DR);
constexpr int SWQ = box_swizzle(WQ), SWK = box_swizzle(WK), SWV = box_swizzle(WV);
constexpr unsigned Q_BYTES = BLOCK_M * DQK * 2;
constexpr unsigned O_BYTES = BLOCK_M * DV * 2;
constexpr unsigned K_BYTES = BLOCK_N * DQK * 2;
constexpr unsigned V_BYTES = BLOCK_N * DV * 2;
constexpr unsigned STAGE_BYTES = K_BYTES + V_BYTES;
constexpr unsigned OFF_Q = 1024;
constexpr unsigned OFF_O = OFF_Q + Q_BYTES;
constexpr unsigned OFF_RING = OFF_O + O_BYTES;
static_assert(DN % WK == 0 && DR % WK == 0, "tile shape");
static_assert(Q_BYTES % 1024 == 0 && O_BYTES % 1024 == 0 && K_BYTES % 1024 == 0 && V_BYTES % 1024 == 0, "swizzle alignment");
static_assert(1 + 2 * STAGES <= 128, "mbarriers fit in 1024 bytes");
}  // namespace

extern "C" __global__ void __launch_bounds__(NUM_THREADS, 1)
${K.name}(
    ${param_list(K.params)}) {
  extern __shared__ __align__(1024) unsigned char smem[];
  unsigned char* const sbase = smem_align_1024(smem);
  unsigned long long* const q_full = reinterpret_cast<unsigned long long*>(sbase);
  unsigned long long* const full = q_full + 1;      // [STAGES]: K and V tile landed
  unsigned long long* const empty = full + STAGES;  // [STAGES]: consumers done with it
  unsigned char* const sQ = sbase + OFF_Q;
  unsigned char* const sO = sbase + OFF_O;
  unsigned char* const ring = sbase + OFF_RING;

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int m0 = blockIdx.x * BLOCK_M;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const mla::QueryPos pos{q_pos0, q_split, q_pos1};  // rows' global positions
  // The largest and smallest positions of rows [a, e) (e > a).
  auto max_pos = [&](int a, int e) {
    int mx = -2147483647;
    if (a < q_split) mx = pos(min(e, q_split) - 1);
    if (e > q_split) mx = max(mx, pos(e - 1));
    return mx;
  };
  auto min_pos = [&](int a, int e) {
    int mn = 2147483647;
    if (a < q_split) mn = pos(a);
    if (e > q_split) mn = min(mn, pos(max(a, q_split)));
    return mn;
  };
  const int q_last = min(m0 + BLOCK_M, seqlen_q);
@ if VARLEN then
  // Packed: the keys the CTA's rows see, in tiles that end at their last (tile j from key
  // k0 + j BLOCK_N).
  const mla::Varlen vl{cu_seqlens, n_seqs};
  const VarlenTiles kt = varlen_tail_tiles<CAUSAL, BLOCK_N>(vl, pos, m0, q_last - 1, seqlen_k);
  const int n_tiles = kt.n, k0 = kt.k0;
@ else
  const int n_end = m0 >= seqlen_q ? 0 : CAUSAL ? min(seqlen_k, max(0, max_pos(m0, q_last) + 1)) : seqlen_k;
  const int n_tiles = (n_end + BLOCK_N - 1) / BLOCK_N;
@ end

  if (tid == 0) {
    mbar_init(q_full, 1);
    for (int st = 0; st < STAGES; ++st) {
      mbar_init(&full[st], 1);
      mbar_init(&empty[st], 128 * NC);
    }
    mbar_init_fence();
  }
  __syncthreads();  // MUTATION: init barrier

  if (wg == NC) {
    // ---- producer warpgroup: one thread issues the TMA loads ------------------------------
@ if C.block_m == 128 then
    setmaxnreg_dec<24>();
@ end
    if (tid != 128 * NC) return;
    if (n_tiles > 0) {
      mbar_arrive_expect_tx(q_full, Q_BYTES + O_BYTES);
      tma_load_boxes_4d<DQK, WQ, BLOCK_M>(sQ, &tmaps.m[0], q_full, 0, h, m0, b);
      tma_load_boxes_4d<DV, WV, BLOCK_M>(sO, &tmaps.m[4], q_full, 0, h, m0, b);
    }
    for (int j = 0; j < n_tiles; ++j) {
      const int st = j % STAGES;
      const unsigned ph = (unsigned)(j / STAGES) & 1u;
      mbar_wait(&empty[st], ph ^ 1u);  // MUTATION: empty wait
      unsigned char* const sK = ring + st * STAGE_BYTES;
      const int row = ${VARLEN and "k0 + " or ""}j * BLOCK_N;  // of batch item b
      mbar_arrive_expect_tx(&full[st], STAGE_BYTES);
      tma_load_k_tile<DN, DR, WK, WK, BLOCK_N, K_PACKED>(sK, &tmaps.m[1], &tmaps.m[2], &full[st], h, row, b);
      tma_load_boxes_4d<DV, WV, BLOCK_N>(sK + K_BYTES, &tmaps.m[3], &full[st], 0, h, row, b);
    }
    return;
  }

  // ---- consumer warpgroup wg: query rows m0 + 64 wg .. + 63 ---------------------------------
@ if C.block_m == 128 then
  setmaxnreg_inc<240>();
@ end
  const int t = tid % 128;
  const int g = (t % 32) / 4;
  const int qd = t % 4;
  const int i0 = m0 + 64 * wg;
  const int r0 = i0 + 16 * (t / 32) + g;  // this thread's rows r0, r0 + 8
  const float scale_log2 = softmax_scale * mla::LOG2E;
  const unsigned q_base = smem_u32(sQ) + 64 * wg * 2 * WQ;
  const unsigned o_base = smem_u32(sO) + 64 * wg * 2 * WV;
  const unsigned ring_addr = smem_u32(ring);
  // This thread's rows' LSE (base 2; +inf past seqlen_q or for a row without keys: P = 0)
  // and delta.
  float lse2[2], dl[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = r0 + 8 * r;
    lse2[r] = mla::pos_inf(), dl[r] = 0.f;
    if (i < seqlen_q) {
      const size_t at = ((size_t)b * H + h) * seqlen_q + i;
      lse2[r] = mla::lse_log2(lse[at]);
      dl[r] = delta[at];
    }
  }

  float acc[DQK / 2];
#pragma unroll
  for (int i = 0; i < DQK / 2; ++i) acc[i] = 0.f;
  float s[BLOCK_N / 2];
  float dp[BLOCK_N / 2];
@ if VARLEN then
  // Tiles this warpgroup computes: [wg_first, wg_tiles) of the CTA's, those holding keys of
  // its rows' ranges (the others released here and after the loop); the keys
  // [row_lo[r], row_hi[r]) of this thread's rows r0, r0 + 8.
  int wg_first, wg_tiles;
  varlen_tile_span<CAUSAL, BLOCK_N>(vl, pos, i0, min(i0 + 63, seqlen_q - 1), seqlen_k, k0, wg_first, wg_tiles);
  int row_lo[2], row_hi[2];
  vl.keys<CAUSAL>(pos(r0), seqlen_k, row_lo[0], row_hi[0]);
  vl.keys<CAUSAL>(pos(r0 + 8), seqlen_k, row_lo[1], row_hi[1]);
  ring_release<STAGES>(full, empty, 0, wg_first);
@ else
  // Tiles this warpgroup computes: a prefix of the CTA's (causal: a tile whose first key is
  // past the warpgroup's last position is hidden from all of its rows).
  const int wg_last = min(i0 + 64, seqlen_q);
  const int wg_tiles = i0 >= seqlen_q ? 0
                       : CAUSAL ? min(n_tiles, max(0, max_pos(i0, wg_last) / BLOCK_N + 1))
                                : n_tiles;
  const int wg_min = i0 >= seqlen_q ? 0 : min_pos(i0, wg_last);
@ end
  auto parity = [](int j) { return (unsigned)(j / STAGES) & 1u; };

  if (wg_tiles > ${VARLEN and "wg_first" or "0"}) {
    mbar_wait(q_full, 0);  // MUTATION: Q full wait
  }
  // A stage's K and V, and Q's and dO's rows of this warpgroup (through an empty asm, so
  // that the compiler recomputes the descriptors per tile rather than keep them).
  struct Addr {
    unsigned k, v, q, o;
  };
  auto addr = [&](int st) {
    Addr a;
    a.k = opaque_u32(ring_addr + st * STAGE_BYTES);
    a.v = a.k + K_BYTES;
    a.q = opaque_u32(q_base), a.o = opaque_u32(o_base);
    return a;
  };
  // S = Q K^T and dP = dO V^T (each issued and committed).
  auto issue_s = [&](const Addr& a) {
    fence_operand(s);
    wgmma_fence();  // MUTATION: S fence
#pragma unroll
    for (int ks = 0; ks < DQK / 16; ++ks)
      wgmma_ss<BLOCK_N, tag_t>(s, make_desc_kstep(a.q, BLOCK_M, WQ, SWQ, ks), make_desc_kstep(a.k, BLOCK_N, WK, SWK, ks), ks > 0);
    wgmma_commit();
  };
  auto issue_dp = [&](const Addr& a) {
    fence_operand(dp);
    wgmma_fence();  // MUTATION: dP fence
#pragma unroll
    for (int ks = 0; ks < DV / 16; ++ks)
      wgmma_ss<BLOCK_N, tag_t>(dp, make_desc_kstep(a.o, BLOCK_M, WV, SWV, ks), make_desc_kstep(a.v, BLOCK_N, WV, SWV, ks), ks > 0);
    wgmma_commit();
  };
  // P from S in place (the tile at key n0).
  auto softmax = [&](int n0) {
@ if VARLEN then
    // P, selected to 0 wherever the tile is not inside both rows' [lo, hi).
    const bool edge = n0 < max(row_lo[0], row_lo[1]) || n0 + BLOCK_N > min(row_hi[0], row_hi[1]);
#pragma unroll
    for (int i = 0; i < BLOCK_N / 2; ++i) {
      const int r = (i % 4) / 2;
      float p = exp2f(s[i] * scale_log2 - lse2[r]);
      if (edge) {
        const int key = n0 + 8 * (i / 4) + 2 * qd + (i % 2);
        if (key < row_lo[r] || key >= row_hi[r]) p = 0.f;
      }
      s[i] = p;
    }
@ else
    // P, masked only on tiles crossing the end of the keys or the diagonal.
    const bool edge = n0 + BLOCK_N > seqlen_k || (CAUSAL && n0 + BLOCK_N - 1 > wg_min);
#pragma unroll
    for (int i = 0; i < BLOCK_N / 2; ++i) {
      const int r = (i % 4) / 2;
      float p = exp2f(s[i] * scale_log2 - lse2[r]);
      if (edge) {
        const int key = n0 + 8 * (i / 4) + 2 * qd + (i % 2);
        const int row = r0 + 8 * r;
        if (key >= seqlen_k || (CAUSAL && key > pos(row))) p = 0.f;
      }
      s[i] = p;
    }
@ end
  };
  // dS = P (dP - delta), packed: column blocks 2kk, 2kk+1 are the A fragment of k-step kk.
  auto pack_ds = [&](unsigned (&da)[BLOCK_N / 16][4]) {
#pragma unroll
@ if VARLEN then
    for (int i = 0; i < BLOCK_N / 2; ++i) dp[i] = s[i] != 0.f ? s[i] * (dp[i] - dl[(i % 4) / 2]) : 0.f;
@ else
    for (int i = 0; i < BLOCK_N / 2; ++i) dp[i] = s[i] * (dp[i] - dl[(i % 4) / 2]);
@ end
    acc_to_a<elem_t, BLOCK_N>(da, dp);
  };
  // dQ += dS K: K [key][d_qk] as an MN-major B operand (W_K-column boxes BLOCK_N rows
  // apart); issued, committed.
  auto issue_dq = [&](const Addr& a, const unsigned (&da)[BLOCK_N / 16][4]) {
    fence_operand(acc);
    wgmma_fence();  // MUTATION: dQ fence
#pragma unroll
    for (int kk = 0; kk < BLOCK_N / 16; ++kk)
      wgmma_rs_tb<DQK, tag_t>(acc, da[kk], make_desc_mn_kstep(SWK, a.k, BLOCK_N, kk), 1);
    wgmma_commit();
  };
@ if not OV then
  // One tile at a time: S and dP issued together, the softmax once S has landed, dS packed
  // once dP has, dQ += dS K, each waited for before the next tile.
  for (int j = ${VARLEN and "wg_first" or "0"}; j < wg_tiles; ++j) {
    const int st = j % STAGES;
    const Addr a = addr(st);
    mbar_wait(&full[st], parity(j));  // MUTATION: full wait
    issue_s(a);
    issue_dp(a);
    wgmma_wait<1>();  // MUTATION: S wait
    fence_operand(s);
    softmax(${VARLEN and "k0 + " or ""}j * BLOCK_N);
    wgmma_wait<0>();  // MUTATION: dP wait
    fence_operand(dp);
    unsigned da[BLOCK_N / 16][4];
    pack_ds(da);
    issue_dq(a, da);
    wgmma_wait<0>();  // MUTATION: dQ wait
    fence_operand(acc);
    mbar_arrive(&empty[st]);  // MUTATION: empty release
  }
@ else
  // overlap: one step per key tile j: S issued, then (but for the first tile) the previous
  // tile's dQ from its dS in da (stage pst), then dP; the softmax runs while they compute;
  // all waited for, the previous tile's stage released, this tile's dS packed into da.
  // `first` is a constant at each call, so every wait count is.
  unsigned da[BLOCK_N / 16][4];
  auto step = [&](int j, bool first) {
    const int st = j % STAGES, pst = (j + STAGES - 1) % STAGES;
    const Addr a = addr(st);
    mbar_wait(&full[st], parity(j));  // MUTATION: full wait
    issue_s(a);
    if (!first) issue_dq(addr(pst), da);
    issue_dp(a);
    if (first) {
      wgmma_wait<1>();  // MUTATION: S wait
    } else {
      wgmma_wait<2>();  // MUTATION: S wait (overlap)
    }
    fence_operand(s);
    softmax(${VARLEN and "k0 + " or ""}j * BLOCK_N);
    wgmma_wait<0>();  // MUTATION: dP wait
    fence_operand(dp);
    if (!first) {
      fence_operand(acc);
      fence_operand(da);
      mbar_arrive(&empty[pst]);  // MUTATION: previous empty release (overlap)
    }
    pack_ds(da);
  };
  if (wg_tiles > ${VARLEN and "wg_first" or "0"}) {
    step(${VARLEN and "wg_first" or "0"}, true);
    for (int j = ${VARLEN and "wg_first + 1" or "1"}; j < wg_tiles; ++j) step(j, false);
    // the last tile's dQ
    const int st = (wg_tiles - 1) % STAGES;
    issue_dq(addr(st), da);
    wgmma_wait<0>();  // MUTATION: dQ wait
    fence_operand(acc);
    mbar_arrive(&empty[st]);  // MUTATION: empty release
  }
@ end
  // The tiles hidden from this warpgroup's rows (the other consumer needs them): released
  // once loaded.
  ring_release<STAGES>(full, empty, wg_tiles, n_tiles);

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = r0 + 8 * r;
    if (i < seqlen_q) {
      elem_t* const row = dq + (((size_t)b * seqlen_q + i) * H + h) * DQK;
#pragma unroll
      for (int n = 0; n < DQK / 8; ++n)
        *reinterpret_cast<unsigned*>(row + 8 * n + 2 * qd) =
            pack2(softmax_scale * acc[4 * n + 2 * r], softmax_scale * acc[4 * n + 2 * r + 1]);
    }
  }
}
