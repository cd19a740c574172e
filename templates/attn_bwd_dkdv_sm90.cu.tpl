@ -- attn_bwd_dkdv_sm90: explicit-form MLA attention backward for Hopper (sm_90a), dK and dV, in
@ -- the manner of FlashAttention-3's backward (arXiv 2407.08608): TMA, mbarriers, wgmma, warp
@ -- specialization. A drop-in for attn_bwd_dkdv (same parameters and layouts, plus `tmaps`):
@ -- deterministic = 1, dQ from attn_bwd_dq_sm90 (or attn_bwd_dq); deterministic = 0, dQ here
@ -- into the fp32 dq_accum by atomics (then dq_convert).
@ -- sm_90a's row of mg_arch_kernel_table: the CUDA executor, `generate --arch sm_90a` and
@ -- `tune` run it in place of attn_bwd_dkdv there (MLAGEN_MMA_SYNC=1 gives that one back).
@ --
@ -- One CTA owns block_n keys (64 per consumer warpgroup, 1 or 2 consumers) of one head
@ -- (split keys: of every head, in order, keeping dK's RoPE columns summed over the heads in
@ -- registers, as attn_bwd_dkdv's deterministic head loop). The last warpgroup is the
@ -- producer: one thread issues the TMA loads, one warp stages LSE and delta.
@ --   K, V       once per head onto kv_full (K: boxes of W_K = the widest of 64/32/16 columns
@ --              dividing both d_n and d_r, so the split k_rope lands after K_nope as more
@ --              boxes of the same tile; V: W(d_v) boxes); released on kv_empty by every
@ --              consumer thread after the head's last query tile.
@ --   Q_i, dO_i  query tiles of 64 rows (causal: only those with a row that sees a key of the
@ --              CTA) into stage i % stages of a ring: full[st] completes with the TMA bytes
@ --              and the 32 arrivals of the warp that writes the tile's LSE (base 2, +inf
@ --              past seqlen_q or for a row without keys) and delta into shared memory;
@ --              empty[st] gets every consumer thread's arrival once it is done with the stage.
@ -- Consumers, per query tile, with wgmma (m64 = the warpgroup's 64 keys; fp32 accumulation):
@ --   S^T  = K Q^T          ss, both K-major                               (n = 64 queries)
@ --   dP^T = V dO^T         ss, both K-major (issued with S^T; d_v native: no padding to d_qk)
@ --   P^T  = exp2(S^T scale log2 e - LSE log2 e); causal: masked only on tiles crossing the
@ --          end of the keys or queries or the diagonal; non-causal: no per-element test (a
@ --          key past the end gets -inf added to its row, a query row past the end has LSE
@ --          +inf; with the tests, overlap = 1 kernels spilled where the causal ones fit)
@ --   dS^T = P^T (dP^T - delta)                                            (fp32 P)
@ --   dV  += P^T dO         rs: P^T packed to 16 bits in registers; dO MN-major (n = d_v)
@ --   dK  += dS^T Q         rs: dS^T in registers; Q MN-major (n = d_n + d_r)
@ -- two_pass = 1 streams the query tiles twice, dV in the first pass and dK in the second
@ -- (S^T computed twice, 25% more tensor work): dK and dV never live together in registers,
@ -- which wide heads (d_qk 256, d_v 256) need. Outputs leave from the registers, dK scaled.
@ -- deterministic = 0 (one head per CTA): each consumer also writes its dS^T to shared memory
@ -- and computes dQ += scale dS K for the query tile in 64-column chunks (wgmma ss, both
@ -- operands MN-major), added to dq_accum with fp32 atomics (dq_convert rounds it); split
@ -- keys add dk_rope atomically.
@ -- overlap = 1 (FlashAttention-3's pipelining, as attn_fwd_sm90's): per query tile, S^T is
@ -- issued, then the previous tile's dV and dK GEMMs (P^T, dS^T kept packed in registers),
@ -- then dP^T; the softmax of S^T runs while those compute, so the tensor cores do not
@ -- drain between tiles. Every GEMM is waited for within its step (nothing in flight across
@ -- the loop: ptxas would serialize every wgmma). Needs 2 stages (two tiles held at once).
@ -- The split keys' head loop sums dK's RoPE columns in dk_rope itself (each thread its own
@ -- elements, head after head: deterministic), not in the accumulator across the heads (with
@ -- that, ptxas serialized every wgmma: C7511).
@ -- deterministic = 0: each tile's dQ once its dS^T is packed (not overlapped: beside S^T and
@ -- dP^T its accumulators spilled).
@ -- overlap = 0: each tile's GEMMs waited for before the next tile's. Not yet: block_m 128.
@ --
@ -- Packed sequences (spec.varlen, "_varlen": cu_seqlens, n_seqs last; batch 1; deterministic
@ -- = 1 only): the query tiles cover the rows whose positions see one of the CTA's keys (from
@ -- the first key's Varlen::queries lo to the last non-slack key's hi) and END at the last of
@ -- them, so no slack query row (Q, dO, LSE, delta: NaN allowed) is ever read; earlier rows
@ -- are earlier documents' tokens or, at negative rows, TMA's zero fill (LSE +inf, delta 0).
@ -- P^T outside each key's query range [lo, hi) and dS^T where P^T is 0 are selected to 0
@ -- (never multiplied: the CTA's own slack keys may hold NaN in K and V), so a key no query
@ -- sees gets dK = dV = 0. deterministic = 0 has no variant: its dQ += dS K would multiply
@ -- the slack keys' NaN K rows.
@ local H, DN, DR, DV = spec.heads, spec.d_n, spec.d_r, spec.d_v
@ local DQK = DN + DR
@ local ESIZE = elem_size(spec.dtype)
@ local SMEM_LIMIT = smem_limit("sm_90a")   -- sm_90's opt-in dynamic shared memory per block (prelude.lua)
@ local BM = 64
@ -- fp32 accumulators per consumer thread: dK (d_qk/2) + dV (d_v/2) + S^T + dP^T (32 each);
@ -- two_pass: the larger of the passes. One consumer has 255 registers per thread; two
@ -- (block_n 128: 384 threads) get 232 after setmaxnreg, the producer keeping 40 (with 24 its
@ -- LSE warp spilled). The kept configurations compile without spills on sm_90a, causal
@ -- and not (tests/test_attn_bwd_sm90.c). DeepSeek's heads in one pass (224 accumulators)
@ -- need 255 registers and spill a little (k_packed): they run two passes.
@ local function acc_limit(c) return c.block_n == 64 and 192 or 160 end
@ local function WKc(dn, dr) return math.min(tma_box_width(dn), tma_box_width(dr)) end
@ local function accumulators(c)
@   -- (the first pass: dV, S^T, P^T packed, and with split keys dK's RoPE columns summed
@   -- over the heads; the second: dK, S^T, dP^T)
@   -- deterministic = 0: dQ's 64-column chunk (32 accumulators) beside dK, counted
@   -- with the second pass (measured: wide heads spilled without it)
@   local dq = c.deterministic == 0 and 32 or 0
@   -- (overlap = 1: no RoPE sums in registers; they go to dk_rope per head)
@   if c.two_pass == 1 then return math.max(DV // 2 + BM // 2 + BM // 4 + ((c.k_packed == 1 or c.overlap == 1) and 0 or DR // 2), DQK // 2 + BM + dq) end
@   -- overlap = 1 in one pass: the dQ chunk counted too (beside dK, dV and the P^T, dS^T
@   -- held for the next step; measured: 64/64/64 heads with two consumers spilled)
@   return DQK // 2 + DV // 2 + BM + (c.overlap == 1 and dq or 0)
@ end
@ local function smem_bytes(c)
@   -- deterministic = 0: each consumer's dS^T tile [64 keys][BM queries] for dQ
@   return 1024 + ESIZE * (c.block_n * (DQK + DV) + c.stages * BM * (DQK + DV)) + c.stages * BM * 8 +
@          (c.deterministic == 0 and ESIZE * c.block_n * BM or 0)
@ end
@ local PACKED = spec.config ~= nil and spec.config.k_packed == 1
@ local VARLEN = spec.varlen
@
@ local K = kernel {
@   family = "attn_bwd_dkdv_sm90", pass = "bwd", causal = true, varlen = true, interface = { "k_packed", "deterministic" }, flops = { pair = 4 * spec.heads * ((spec.d_n + spec.d_r) + spec.d_v) },
@   doc = "explicit-form attention backward for sm_90a (FlashAttention-3 manner: TMA ring, mbarriers, wgmma): dK and dV, deterministic",
@   params = join_lists({
@     { name = "q",      type = "const elem_t*", shape = "[B, S_q, H, d_n + d_r]", doc = "queries, RoPE part last (read through tmaps[0])" },
@   }, explicit_k_params(PACKED, "per-head no-RoPE keys"), {
@     { name = "v",      type = "const elem_t*", shape = "[B, S_k, H, d_v]",       doc = "per-head values (read through tmaps[3])" },
@     { name = "dout",   type = "const elem_t*", shape = "[B, S_q, H, d_v]",       doc = "gradient of the output (read through tmaps[4])" },
@     { name = "lse",    type = "const float*",  shape = "[B, H, S_q]",            doc = "the forward's natural-log LSE" },
@     { name = "delta",  type = "const float*",  shape = "[B, H, S_q]",            doc = "rowsum(dO * O) from attn_bwd_pre" },
@     { name = "dq_accum", type = "float*",      shape = "[B, S_q, H, d_n + d_r]", doc = "deterministic = 0: dQ (scale applied) added atomically, must be zeroed first; deterministic = 1: unused (may be null), dQ comes from attn_bwd_dq_sm90" },
@     PACKED and
@     { name = "dk_nope", type = "elem_t*",      shape = "[B, S_k, H, d_n + d_r]", doc = "k_packed = 1: per-head dK" } or
@     { name = "dk_nope", type = "elem_t*",      shape = "[B, S_k, H, d_n]",       doc = "per-head dK_nope" },
@     PACKED and
@     { name = "dk_rope", type = "float*",       shape = "unused",                 doc = "k_packed = 1: unused (may be null)" } or
@     { name = "dk_rope", type = "float*",       shape = "[B, S_k, d_r]",          doc = "dK's RoPE part summed over the heads (fp32): deterministic = 1 written by the head loop (overlap = 0: once, from registers; 1: summed in place head by head, the first head storing); 0 added atomically, must be zeroed first" },
@     { name = "dv",     type = "elem_t*",       shape = "[B, S_k, H, d_v]",       doc = "gradient of V" },
@   }, explicit_scalar_params(), {
@     { name = "tmaps", type = "const __grid_constant__ mla::sm90::TensorMaps<5>", shape = "[5]",
@       doc = "5 CUtensorMaps passed by value (kernel parameter space; the host passes 5 contiguous 64-byte aligned CUtensorMaps), made by mg_sm90_bwd_tmaps (runtime/exec/mg_sm90_tmap.h): q, k_nope, k_rope (packed: K's RoPE columns), v, dout" },
@   }, varlen_params()),
@   tunables = {
@     block_n   = { values = { 64, 128 },   doc = "keys per CTA: 64 per consumer warpgroup (1 or 2 consumers)" },
@     block_m   = { values = { 64 },        doc = "query rows per streamed tile (the N of S^T = K Q^T's wgmma)" },
@     stages    = { values = { 1, 2, 3 },   doc = "query tiles (Q, dO, LSE, delta) in the TMA ring" },
@     two_pass  = { values = { 0, 1 },      doc = "1: dV in a first pass over the query tiles, dK in a second (wide heads: dK and dV do not fit in registers together)" },
@     deterministic = { values = { 0, 1 },  doc = "0: dQ (through shared memory, wgmma, fp32 atomics into dq_accum) and split keys' dk_rope by fp32 atomics, one head per CTA; 1: no dQ here (attn_bwd_dq_sm90), dk_rope by the head loop" },
@     k_packed  = { values = { 0, 1 },      doc = "0: k_nope + shared k_rope (dK_nope per head, dk_rope summed); 1: per-head K and dK [.., d_n + d_r]" },
@     overlap   = { values = { 0, 1 },      doc = "1: a tile's S^T, the previous tile's dV/dK and its dP^T in flight together, its softmax overlapping them (FA3's pipelining; stages >= 2); 0: each tile's GEMMs waited for before the next tile's" },
@   },
@   check = function(s, c)
@     if DN % 16 ~= 0 or DR % 16 ~= 0 then return "d_n and d_r must be multiples of 16 (the wgmma k step)" end
@     if DQK ~= 64 and DQK ~= 128 and DQK ~= 192 and DQK ~= 256 then return "d_n + d_r must be 64, 128, 192 or 256 (the N of dK += dS^T Q's wgmma)" end
@     if DV ~= 64 and DV ~= 128 and DV ~= 192 and DV ~= 256 then return "d_v must be 64, 128, 192 or 256 (the N of dV += P^T dO's wgmma)" end
@     if s.varlen and c.deterministic == 0 then
@       return "packed sequences (varlen) need deterministic = 1 (dQ from attn_bwd_dq_sm90)"
@     end
@     if c.deterministic == 0 and (WKc(DN, DR) ~= 64 or DQK % 64 ~= 0) then
@       return "deterministic = 0 needs d_n and d_r multiples of 64 (dQ += dS K reads K in 64-column chunks of 128B-swizzled boxes)"
@     end
@     if c.overlap == 1 and c.stages < 2 then
@       return "overlap = 1 needs stages >= 2 (a tile's stage is waited for before the previous tile's is released)"
@     end
@     if accumulators(c) > acc_limit(c) then
@       return string.format("%d fp32 accumulators per thread, over %d (registers would spill; two_pass = 1 needs fewer)",
@                            accumulators(c), acc_limit(c))
@     end
@     if smem_bytes(c) > SMEM_LIMIT then
@       return string.format("needs %d bytes of shared memory, over the %d-byte limit", smem_bytes(c), SMEM_LIMIT)
@     end
@   end,
@   default = function(s)
@     -- the interface tunables as set (the plan's), for the register and memory checks
@     local det = s.config ~= nil and s.config.deterministic or 1
@     local kp = s.config ~= nil and s.config.k_packed or 0
@     -- overlap 0 first (until a GPU has timed both); overlap 1 where 0 does not fit (split
@     -- keys at wide heads, GLM's 256/256: its RoPE sums leave the registers)
@     for _, ov in ipairs({ 0, 1 }) do
@       for _, tp in ipairs({ 0, 1 }) do
@         for _, p in ipairs({ { 128, 2 }, { 64, 2 }, { 64, 1 } }) do
@           local c = { block_n = p[1], block_m = BM, stages = p[2], two_pass = tp, deterministic = det, k_packed = kp, overlap = ov }
@           if (ov == 0 or c.stages >= 2) and accumulators(c) <= acc_limit(c) and smem_bytes(c) <= SMEM_LIMIT then return c end
@         end
@       end
@     end
@     return { block_n = 64, block_m = BM, stages = 1, two_pass = 1, deterministic = det, k_packed = kp, overlap = 0 }
@   end,
@   name = function(s, c)
@     return string.format("mla_attn_bwd_dkdv_sm90_h%d_dn%d_dr%d_dv%d_%s_%s_bn%d_bm%d_st%d%s%s", H, DN, DR, DV,
@                          s.dtype, s.causal and "causal" or "full", c.block_n, c.block_m, c.stages,
@                          c.two_pass == 1 and "_2pass" or "", c.k_packed == 1 and "_kpacked" or "")
@                          .. (c.deterministic == 0 and "_atomic" or "") .. (c.overlap == 1 and "_ov" or "")
@   end,
@   launch = function(s, c)
@     return {
@       grid = { { arg = "seqlen_k", div = c.block_n }, { value = (c.k_packed == 1 or c.deterministic == 0) and H or 1 }, { arg = "batch" } },
@       block = { 128 * (c.block_n // 64 + 1), 1, 1 },
@       smem = smem_bytes(c),   -- dynamic; over 48 KiB needs cudaFuncAttributeMaxDynamicSharedMemorySize
@       smem_static = 0,
@     }
@   end,
@ }
@ assert(PACKED == (K.config.k_packed == 1))
@ local C = K.config
@ local OV = C.overlap == 1
// Generated by mlagen from templates/attn_bwd_dkdv_sm90.cu.tpl: do not edit.
// MLA attention backward (dK, dV) for sm_90a (TMA + mbarrier ring, wgmma), H=${H} d_n=${DN} d_r=${DR} d_v=${DV},
// ${spec.dtype}, ${spec.causal and "causal" or "non-causal"}, keys ${PACKED and "packed per head" or "split (shared k_rope)"}${C.two_pass == 1 and ", two passes" or ""}.
// Dynamic shared memory: ${smem_bytes(C)} bytes.
#include "mla_device_sm90.cuh"

namespace {
${sm90_preamble(spec)}
${explicit_dims(spec, PACKED)}
constexpr bool ATOMIC = ${C.deterministic == 0 and "true" or "false"};  // dQ (and dk_rope) by atomics
constexpr bool HEAD_LOOP = !K_PACKED && !ATOMIC;  // one CTA, every head in order (dk_rope summed)
constexpr bool TWO_PASS = ${C.two_pass == 1 and "true" or "false"};
constexpr int NC = ${C.block_n // 64};       // consumer warpgroups
constexpr int NUM_THREADS = 128 * (NC + 1);  // + the producer warpgroup
constexpr int BLOCK_N = 64 * NC;
constexpr int BM = ${BM};
constexpr int STAGES = ${C.stages};
constexpr bool VARLEN = ${VARLEN and "true" or "false"};  // packed sequences (cu_seqlens)
constexpr int WQ = box_width(DQK), WV = box_width(DV);
constexpr int WK = box_width(DN) < box_width(DR) ? box_width(DN) : box_width(DR);
constexpr int SWQ = box_swizzle(WQ), SWK = box_swizzle(WK), SWV = box_swizzle(WV);
// Shared memory (offsets from a 1024-aligned base): mbarriers, K, V, the ring, LSE/delta.
constexpr unsigned K_BYTES = BLOCK_N * DQK * 2;
constexpr unsigned V_BYTES = BLOCK_N * DV * 2;
constexpr unsigned Q_BYTES = BM * DQK * 2;
constexpr unsigned O_BYTES = BM * DV * 2;
constexpr unsigned STAGE_BYTES = Q_BYTES + O_BYTES;
constexpr unsigned OFF_K = 1024;
constexpr unsigned OFF_V = OFF_K + K_BYTES;
constexpr unsigned OFF_RING = OFF_V + V_BYTES;
constexpr unsigned OFF_DS = OFF_RING + STAGES * STAGE_BYTES;  // ATOMIC: NC x dS^T [64][BM]
constexpr unsigned DS_BYTES = ATOMIC ? 64 * BM * 2 : 0;
constexpr unsigned OFF_LD = OFF_DS + NC * DS_BYTES;  // STAGES x [LSE[BM], delta[BM]]
static_assert(DN % WK == 0 && DR % WK == 0 && DQK % 16 == 0, "tile shape");
static_assert(K_BYTES % 1024 == 0 && V_BYTES % 1024 == 0 && Q_BYTES % 1024 == 0 && O_BYTES % 1024 == 0, "swizzle alignment");
static_assert(2 + 2 * STAGES <= 128, "mbarriers fit in 1024 bytes");
}  // namespace

extern "C" __global__ void __launch_bounds__(NUM_THREADS, 1)
${K.name}(
    ${param_list(K.params)}) {
  extern __shared__ __align__(1024) unsigned char smem[];
  unsigned char* const sbase = smem_align_1024(smem);
  unsigned long long* const kv_full = reinterpret_cast<unsigned long long*>(sbase);
  unsigned long long* const kv_empty = kv_full + 1;
  unsigned long long* const full = kv_full + 2;       // [STAGES]: Q, dO (TMA), LSE, delta in
  unsigned long long* const empty = full + STAGES;    // [STAGES]: consumers done with it
  unsigned char* const sK = sbase + OFF_K;
  unsigned char* const sV = sbase + OFF_V;
  unsigned char* const ring = sbase + OFF_RING;
  float* const sLD = reinterpret_cast<float*>(sbase + OFF_LD);
  unsigned char* const sDS = sbase + OFF_DS;
  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int n0 = blockIdx.x * BLOCK_N;
  const int b = blockIdx.z;
  const int h_begin = HEAD_LOOP ? 0 : blockIdx.y;
  const int h_end = HEAD_LOOP ? H : blockIdx.y + 1;
  const mla::QueryPos pos{q_pos0, q_split, q_pos1};  // rows' global positions
@ if VARLEN then
  // Packed: the query rows [r_lo, r_hi) whose positions see one of this CTA's keys, in tiles
  // of BM rows that end at r_hi (tile mt from row m_base + mt BM), every one of them visible.
  const mla::Varlen vl{cu_seqlens, n_seqs};
  int r_lo, r_hi;
  varlen_keys_rows<CAUSAL>(vl, pos, n0, min(n0 + BLOCK_N, seqlen_k) - 1, seqlen_q, r_lo, r_hi);
  const int m_tiles = (r_hi - r_lo + BM - 1) / BM;
  const int m_base = r_hi - m_tiles * BM;
  auto visible = [](int) { return true; };
@ else
  // Causal: query tile mt has a row that sees a key of this CTA (its largest position >= n0).
  const int m_tiles = (seqlen_q + BM - 1) / BM;
  auto visible = [&](int mt) {
    if (!CAUSAL) return true;
    const int m0 = mt * BM, m1 = min(m0 + BM, seqlen_q);
    int mx = -2147483647;
    if (m0 < q_split) mx = pos(min(m1, q_split) - 1);
    if (m1 > q_split) mx = max(mx, pos(m1 - 1));
    return mx >= n0;
  };
@ end
@ local M0 = VARLEN and "m_base + mt * BM" or "mt * BM"   -- query tile mt's first row
  int n_vis = 0;  // visible query tiles (the same for every head)
  if (!CAUSAL)
    n_vis = m_tiles;  // all of them (counted, it took a register of its own in ptxas)
  else
    for (int mt = 0; mt < m_tiles; ++mt) n_vis += visible(mt) ? 1 : 0;
  constexpr int PASSES = TWO_PASS ? 2 : 1;

  if (tid == 0) {
    mbar_init(kv_full, 1);
    mbar_init(kv_empty, 128 * NC);
    for (int st = 0; st < STAGES; ++st) {
      mbar_init(&full[st], 1 + 32);
      mbar_init(&empty[st], 128 * NC);
    }
    mbar_init_fence();
  }
  __syncthreads();  // MUTATION: init barrier

  if (wg == NC) {
    // ---- producer warpgroup: thread 0 issues the TMA loads, warp 1 stages LSE and delta ----
@ if C.block_n == 128 then
    setmaxnreg_dec<40>();
@ end
    const int pt = tid - 128 * NC;
    if (pt != 0 && pt / 32 != 1) return;
    int j = 0;  // query tiles issued so far (the ring position)
    for (int h = h_begin; h < h_end && n_vis > 0; ++h) {
      const int hi = h - h_begin;
      if (pt == 0) {
        if (hi > 0) {
          mbar_wait(kv_empty, (unsigned)(hi - 1) & 1u);  // MUTATION: kv empty wait
        }
        const int row = n0;  // of batch item b
        mbar_arrive_expect_tx(kv_full, K_BYTES + V_BYTES);
        tma_load_k_tile<DN, DR, WK, WK, BLOCK_N, K_PACKED>(sK, &tmaps.m[1], &tmaps.m[2], kv_full, h, row, b);
        tma_load_boxes_4d<DV, WV, BLOCK_N>(sV, &tmaps.m[3], kv_full, 0, h, row, b);
      }
      for (int pass = 0; pass < PASSES; ++pass)
        for (int mt = 0; mt < m_tiles; ++mt) {
          if (!visible(mt)) continue;
          const int st = j % STAGES;
          const unsigned ph = (unsigned)(j / STAGES) & 1u;
          ++j;
          const int m0 = ${M0};
          if (pt == 0) {
            mbar_wait(&empty[st], ph ^ 1u);  // MUTATION: empty wait
            unsigned char* const sQ = ring + st * STAGE_BYTES;
            mbar_arrive_expect_tx(&full[st], STAGE_BYTES);
            tma_load_boxes_4d<DQK, WQ, BM>(sQ, &tmaps.m[0], &full[st], 0, h, m0, b);
            tma_load_boxes_4d<DV, WV, BM>(sQ + Q_BYTES, &tmaps.m[4], &full[st], 0, h, m0, b);
          } else {
            mbar_wait(&empty[st], ph ^ 1u);  // MUTATION: LSE empty wait
            float* const ld = sLD + st * 2 * BM;
            for (int r = pt - 32; r < BM; r += 32) {
              const int i = m0 + r;
              float l = mla::pos_inf(), dl = 0.f;
              if (${VARLEN and "i >= 0 && " or ""}i < seqlen_q) {
                const size_t at = ((size_t)b * H + h) * seqlen_q + i;
                l = mla::lse_log2(lse[at]);
                dl = delta[at];
              }
              ld[r] = l;
              ld[BM + r] = dl;
            }
            mbar_arrive(&full[st]);  // MUTATION: LSE arrive
          }
        }
    }
    return;
  }

  // ---- consumer warpgroup wg: keys n0 + 64 wg .. + 63 ----------------------------------------
@ if C.block_n == 128 then
  setmaxnreg_inc<232>();
@ end
  const int t = tid % 128;
  const int qd = t % 4;
  const int k0 = n0 + 64 * wg;                       // the warpgroup's first key
  const int kr0 = k0 + 16 * (t / 32) + (t % 32) / 4;  // this thread's keys kr0, kr0 + 8
@ if VARLEN then
  // The query positions [key_lo[r], key_hi[r]) that see this thread's keys kr0, kr0 + 8.
  int key_lo[2], key_hi[2];
  vl.queries<CAUSAL>(kr0, key_lo[0], key_hi[0]);
  vl.queries<CAUSAL>(kr0 + 8, key_lo[1], key_hi[1]);
@ end
  const float scale_log2 = softmax_scale * mla::LOG2E;
  const unsigned k_base = smem_u32(sK) + 64 * wg * 2 * WK;  // this warpgroup's rows of each box
  const unsigned v_base = smem_u32(sV) + 64 * wg * 2 * WV;
  const unsigned ring_addr = smem_u32(ring);

  float dk[DQK / 2];
  float dv_acc[DV / 2];
  float s[BM / 2];
  float dp[BM / 2];
#pragma unroll
  for (int i = 0; i < DQK / 2; ++i) dk[i] = 0.f;

  // S^T = K Q^T (stage st), issued, committed.
  auto issue_s = [&](int st) {
    const unsigned q_addr = opaque_u32(ring_addr + st * STAGE_BYTES);
    const unsigned k_addr = opaque_u32(k_base);
    fence_operand(s);
    wgmma_fence();  // MUTATION: S fence
#pragma unroll
    for (int ks = 0; ks < DQK / 16; ++ks)
      wgmma_ss<BM, tag_t>(s, make_desc_kstep(k_addr, BLOCK_N, WK, SWK, ks), make_desc_kstep(q_addr, BM, WQ, SWQ, ks), ks > 0);
    wgmma_commit();
  };
  // dP^T = V dO^T (stage st), issued, committed.
  auto issue_dp = [&](int st) {
    const unsigned o_addr = opaque_u32(ring_addr + st * STAGE_BYTES + Q_BYTES);
    const unsigned v_addr = opaque_u32(v_base);
    fence_operand(dp);
    wgmma_fence();  // MUTATION: dP fence
#pragma unroll
    for (int ks = 0; ks < DV / 16; ++ks)
      wgmma_ss<BM, tag_t>(dp, make_desc_kstep(v_addr, BLOCK_N, WV, SWV, ks), make_desc_kstep(o_addr, BM, WV, SWV, ks), ks > 0);
    wgmma_commit();
  };
  // P^T = exp2(S^T scale log2 e - LSE log2 e) in s, masked on edge tiles (query tile at m0).
  auto softmax = [&](int m0, const float* ld) {
@ if VARLEN then
    // packed: a select wherever a tile row's position may be outside a key's [lo, hi)
    const bool edge = m0 < 0 || m0 + BM > seqlen_q || pos(m0) < max(key_lo[0], key_lo[1]) ||
                      pos(m0 + BM - 1) >= min(key_hi[0], key_hi[1]);
#pragma unroll
    for (int i = 0; i < BM / 2; ++i) {
      const int c = 8 * (i / 4) + 2 * qd + (i % 2);
      float p = exp2f(s[i] * scale_log2 - ld[c]);
      if (edge) {
        const int r = (i % 4) / 2;
        const int qi = m0 + c;
        if (qi < 0 || qi >= seqlen_q || pos(qi) < key_lo[r] || pos(qi) >= key_hi[r]) p = 0.f;
      }
      s[i] = p;
    }
@ else
    if (!CAUSAL) {
      // Non-causal: a key past the end gets -inf added to its row, a query row past the end
      // has LSE +inf (the producer's): P^T is 0 there with no per-element test (with tests,
      // ptxas kept them hoisted out of the query loop live across it, and the overlap = 1
      // kernels spilled 80-476 bytes where the causal ones fit; NVRTC, sm_90a).
      const float k_off[2] = {kr0 < seqlen_k ? 0.f : mla::neg_inf(), kr0 + 8 < seqlen_k ? 0.f : mla::neg_inf()};
#pragma unroll
      for (int i = 0; i < BM / 2; ++i)
        s[i] = exp2f(s[i] * scale_log2 - ld[8 * (i / 4) + 2 * qd + (i % 2)] + k_off[(i % 4) / 2]);
      return;
    }
    const int m1 = min(m0 + BM, seqlen_q);
    int mn = 2147483647;  // the tile's smallest query position
    if (m0 < q_split) mn = pos(m0);
    if (m1 > q_split) mn = min(mn, pos(max(m0, q_split)));
    const bool edge = k0 + 64 > seqlen_k || m0 + BM > seqlen_q || k0 + 63 > mn;
#pragma unroll
    for (int i = 0; i < BM / 2; ++i) {
      const int c = 8 * (i / 4) + 2 * qd + (i % 2);
      float p = exp2f(s[i] * scale_log2 - ld[c]);
      if (edge) {
        const int key = kr0 + 8 * ((i % 4) / 2);
        const int qi = m0 + c;
        if (key >= seqlen_k || qi >= seqlen_q || key > pos(qi)) p = 0.f;
      }
      s[i] = p;
    }
@ end
  };
  // dV += P^T dO: dO [query][d_v] as an MN-major B operand (boxes of WV columns BM rows apart).
  auto issue_dv = [&](int st, const unsigned (&a)[BM / 16][4]) {
    const unsigned o_addr = opaque_u32(ring_addr + st * STAGE_BYTES + Q_BYTES);
    fence_operand(dv_acc);
    wgmma_fence();  // MUTATION: dV fence
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk)
      wgmma_rs_tb<DV, tag_t>(dv_acc, a[kk], make_desc_mn_kstep(SWV, o_addr, BM, kk), 1);
    wgmma_commit();
  };
  // dK += dS^T Q: Q [query][d_qk] as an MN-major B operand.
  auto issue_dk = [&](int st, const unsigned (&a)[BM / 16][4]) {
    const unsigned q_addr = opaque_u32(ring_addr + st * STAGE_BYTES);
    fence_operand(dk);
    wgmma_fence();  // MUTATION: dK fence
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk)
      wgmma_rs_tb<DQK, tag_t>(dk, a[kk], make_desc_mn_kstep(SWQ, q_addr, BM, kk), 1);
    wgmma_commit();
  };
  auto parity = [](int j) { return (unsigned)(j / STAGES) & 1u; };
  // ATOMIC: dQ[m0 .. m0 + BM) += scale dS K over this warpgroup's 64 keys, in 64-column
  // chunks: wgmma ss with A = dS (queries x keys) read MN-major from the dS^T tile and
  // B = K [key][d_qk] MN-major (128B-swizzled 64-column boxes of BLOCK_N rows); each chunk
  // added to dq_accum with fp32 atomics from the accumulator fragment.
  auto dq_tile = [&](int st, int m0) {
    (void)st;
    const unsigned ds_addr = smem_u32(sDS) + wg * DS_BYTES;
#pragma unroll 1
    for (int cb = 0; cb < DQK / 64; ++cb) {
      float acc[32];
      fence_operand(acc);
      wgmma_fence();  // MUTATION: dQ fence
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        wgmma_ss_t<64, tag_t, 1, 1>(acc, make_desc_mn_kstep(SWIZZLE_128B, ds_addr, 64, ks),
                                    make_desc_mn_kstep(SWIZZLE_128B, k_base + cb * BLOCK_N * 128, BLOCK_N, ks),
                                    ks > 0);
      wgmma_commit();
      wgmma_wait<0>();  // MUTATION: dQ wait
      fence_operand(acc);
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int qi = m0 + (int)acc_row(t, i);
        if (qi < seqlen_q)
          atomicAdd(dq_accum + (((size_t)b * seqlen_q + qi) * H + (int)blockIdx.y) * DQK + cb * 64 + acc_col(t, i),
                    softmax_scale * acc[i]);
      }
    }
  };
  // P^T and dS^T = P^T (dP^T - delta) of the tile in s, dp (LSE, delta in ld) packed to 16
  // bits, element by element, so that S^T and dP^T die as the fragments fill (the peak is
  // dK + dV + S^T + dP^T); ATOMIC: dS^T also into this warpgroup's shared tile.
  auto pack = [&](const float* ld, bool do_dv, bool do_dk, unsigned (&pa)[BM / 16][4], unsigned (&da)[BM / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 8 * kk + 2 * e;  // elements i, i + 1: columns c, c + 1
        if (do_dv) pa[kk][e] = pack2(s[i], s[i + 1]);
        if (do_dk) {
          const float dl = ld[BM + 8 * (i / 4) + 2 * qd];
          const float dl1 = ld[BM + 8 * (i / 4) + 2 * qd + 1];
@ if VARLEN then
          da[kk][e] = pack2(s[i] != 0.f ? s[i] * (dp[i] - dl) : 0.f, s[i + 1] != 0.f ? s[i + 1] * (dp[i + 1] - dl1) : 0.f);
@ else
          da[kk][e] = pack2(s[i] * (dp[i] - dl), s[i + 1] * (dp[i + 1] - dl1));
@ end
        }
      }
    if (ATOMIC && do_dk) {
      // dS^T into this warpgroup's shared tile [64 keys][BM queries] (128B swizzle: 64
      // queries of 16 bits per row), for dQ += dS K below, once every warp's wgmma of the
      // last tile's dQ has read it (the ISA does not order the warps of a warpgroup for us).
      bar_sync(1 + wg, 128);
#pragma unroll
      for (int kk = 0; kk < BM / 16; ++kk)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const unsigned row = 16 * (t / 32) + (t % 32) / 4 + 8 * (e & 1);
          const unsigned col = 16 * kk + 8 * (e >> 1) + 2 * qd;
          *reinterpret_cast<unsigned*>(sDS + wg * DS_BYTES + tile_offset(SWIZZLE_128B, row, col)) = da[kk][e];
        }
      fence_proxy_async();    // MUTATION: dS proxy fence
      // every warp's dS^T written and fenced before the wgmma reads it
      bar_sync(1 + wg, 128);  // MUTATION: dS written barrier
    }
  };
@ if not OV then
  // One query tile (ring position j, tile mt): dV and/or dK.
  auto tile = [&](int j, int mt, bool do_dv, bool do_dk) {
    const int st = j % STAGES;
    const float* const ld = sLD + st * 2 * BM;
    mbar_wait(&full[st], parity(j));  // MUTATION: full wait
    issue_s(st);
    if (do_dk) {
      issue_dp(st);
      wgmma_wait<1>();  // MUTATION: S wait
    } else {
      wgmma_wait<0>();  // MUTATION: S wait (dV pass)
    }
    fence_operand(s);
    softmax(${M0}, ld);
    if (do_dk) {
      wgmma_wait<0>();  // MUTATION: dP wait
      fence_operand(dp);
    }
    unsigned pa[BM / 16][4], da[BM / 16][4];
    pack(ld, do_dv, do_dk, pa, da);
    if (do_dv) issue_dv(st, pa);
    if (do_dk) issue_dk(st, da);
    wgmma_wait<0>();  // MUTATION: dV dK wait
    if (do_dv) fence_operand(dv_acc);
    if (do_dk) fence_operand(dk);
    if (ATOMIC && do_dk) dq_tile(st, ${M0});
    mbar_arrive(&empty[st]);  // MUTATION: empty release
  };
@ else
  // overlap: one step per query tile (ring position j, tile mt): S^T issued, then (but for
  // the first tile) the previous tile's dV and dK from its P^T, dS^T in pa, da (stage pst),
  // then dP^T; the softmax runs while they compute; all waited for, the previous tile's
  // stage released, and this tile's P^T, dS^T packed into pa, da. `first` is a constant at
  // each call, so every wait count is.
  auto step = [&](int j, int mt, bool do_dv, bool do_dk, bool first, unsigned (&pa)[BM / 16][4],
                  unsigned (&da)[BM / 16][4]) {
    const int st = j % STAGES, pst = (j + STAGES - 1) % STAGES;
    const float* const ld = sLD + st * 2 * BM;
    mbar_wait(&full[st], parity(j));  // MUTATION: full wait
    issue_s(st);
    if (!first && do_dv) issue_dv(pst, pa);
    if (!first && do_dk) issue_dk(pst, da);
    if (do_dk) {
      issue_dp(st);
      if (first) {
        wgmma_wait<1>();  // MUTATION: S wait
      } else if (do_dv) {
        wgmma_wait<3>();  // MUTATION: S wait (overlap)
      } else {
        wgmma_wait<2>();  // MUTATION: S wait (overlap, dK pass)
      }
    } else if (first) {
      wgmma_wait<0>();  // MUTATION: S wait (dV pass)
    } else {
      wgmma_wait<1>();  // MUTATION: S wait (overlap, dV pass)
    }
    fence_operand(s);
    softmax(${M0}, ld);
    if (do_dk || !first) {
      wgmma_wait<0>();  // MUTATION: dP dV dK wait (overlap)
    }
    if (do_dk) fence_operand(dp);
    if (!first) {
      if (do_dv) fence_operand(dv_acc), fence_operand(pa);
      if (do_dk) fence_operand(dk), fence_operand(da);
      mbar_arrive(&empty[pst]);  // MUTATION: previous empty release (overlap)
    }
    pack(ld, do_dv, do_dk, pa, da);
    // ATOMIC: this tile's dQ now, S^T and dP^T dead (beside them its accumulators spilled)
    if (ATOMIC && do_dk) dq_tile(st, ${M0});
  };
  // One pass over the visible query tiles from ring position j; the last tile's dV and dK
  // after the loop.
  auto run_pass = [&](int& j, bool do_dv, bool do_dk) {
    unsigned pa[BM / 16][4], da[BM / 16][4];
    int mt = 0;
    while (mt < m_tiles && !visible(mt)) ++mt;
    if (mt == m_tiles) return;
    step(j, mt, do_dv, do_dk, true, pa, da);
    while (++mt < m_tiles)
      if (visible(mt)) step(++j, mt, do_dv, do_dk, false, pa, da);
    const int st = j++ % STAGES;
    if (do_dv) issue_dv(st, pa);
    if (do_dk) issue_dk(st, da);
    wgmma_wait<0>();  // MUTATION: dV dK wait
    if (do_dv) fence_operand(dv_acc);
    if (do_dk) fence_operand(dk);
    mbar_arrive(&empty[st]);  // MUTATION: empty release
  };
@ end
  auto store_dv = [&](int h) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = kr0 + 8 * r;
      if (key < seqlen_k) {
        elem_t* const row = dv + (((size_t)b * seqlen_k + key) * H + h) * DV;
#pragma unroll
        for (int n = 0; n < DV / 8; ++n)
          *reinterpret_cast<unsigned*>(row + 8 * n + 2 * qd) = pack2(dv_acc[4 * n + 2 * r], dv_acc[4 * n + 2 * r + 1]);
      }
    }
  };
  auto store_dk = [&](int h) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = kr0 + 8 * r;
      if (key < seqlen_k) {
        const size_t tok = (size_t)b * seqlen_k + key;
#pragma unroll
        for (int n = 0; n < DQK / 8; ++n) {
          const int c = 8 * n + 2 * qd;
          const float x0 = softmax_scale * dk[4 * n + 2 * r], x1 = softmax_scale * dk[4 * n + 2 * r + 1];
          if (K_PACKED)
            *reinterpret_cast<unsigned*>(dk_nope + (tok * H + h) * DQK + c) = pack2(x0, x1);
          else if (c < DN)
            *reinterpret_cast<unsigned*>(dk_nope + (tok * H + h) * DN + c) = pack2(x0, x1);
          else if (ATOMIC) {
            atomicAdd(dk_rope + tok * DR + (c - DN), x0);
            atomicAdd(dk_rope + tok * DR + (c - DN) + 1, x1);
@ if OV then
          } else {
            // overlap: dk holds this head's RoPE columns only, summed here over the heads in
            // order by the one thread that owns them (deterministic)
            float2* const at = reinterpret_cast<float2*>(dk_rope + tok * DR + (c - DN));
            const float2 was = h == h_begin ? make_float2(0.f, 0.f) : *at;
            *at = make_float2(was.x + x0, was.y + x1);
          }
@ else
          } else if (h == h_end - 1)
            *reinterpret_cast<float2*>(dk_rope + tok * DR + (c - DN)) = make_float2(x0, x1);
@ end
        }
      }
    }
  };

  // dK_nope and dV are per head; dK's RoPE columns sum over the head loop (overlap: in
  // dk_rope, by store_dk: carried across the heads in the accumulator, ptxas serialized
  // every wgmma, C7511). dK's per-head part is zeroed just before its pass, so that with
  // two passes it is not live in the first.
  // (The zero comes through opaque_u32(): the compiler cannot hoist the stores of a constant
  // into the first pass, where dV fills the registers: with wide heads, both would spill.)
  auto zero_dk = [&]() {
    const float z = __uint_as_float(opaque_u32(0u));
#pragma unroll
    for (int i = 0; i < DQK / 2; ++i)
      ${OV and "" or "if (i < DN / 2 || !HEAD_LOOP) "}dk[i] = z;
  };
  int j = 0;
  for (int h = h_begin; h < h_end; ++h) {
    const float z = __uint_as_float(opaque_u32(0u));  // (as zero_dk's: not hoisted into the last head)
#pragma unroll
    for (int i = 0; i < DV / 2; ++i) dv_acc[i] = z;
    if (n_vis > 0) {
      mbar_wait(kv_full, (unsigned)(h - h_begin) & 1u);  // MUTATION: kv full wait
    }
@ if OV then
    if (TWO_PASS) {
      run_pass(j, true, false);
      store_dv(h);
      zero_dk();
      run_pass(j, false, true);
    } else {
      zero_dk();
      run_pass(j, true, true);
      store_dv(h);
    }
@ else
    if (TWO_PASS) {
      for (int mt = 0; mt < m_tiles; ++mt)
        if (visible(mt)) tile(j++, mt, true, false);
      store_dv(h);
      zero_dk();
      for (int mt = 0; mt < m_tiles; ++mt)
        if (visible(mt)) tile(j++, mt, false, true);
    } else {
      zero_dk();
      for (int mt = 0; mt < m_tiles; ++mt)
        if (visible(mt)) tile(j++, mt, true, true);
      store_dv(h);
    }
@ end
    if (n_vis > 0) {
      mbar_arrive(kv_empty);  // MUTATION: kv empty release
    }
    store_dk(h);
  }
}
