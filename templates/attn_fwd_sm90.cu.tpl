@ -- attn_fwd_sm90: explicit-form MLA attention forward for Hopper (sm_90a), in the manner of
@ -- FlashAttention-3 (arXiv 2407.08608): TMA, mbarriers, wgmma, warp specialization.
@ --
@ -- Same semantics as attn_fwd (O [B, S_q, H, d_v], natural-log LSE [B, H, S_q], causal
@ -- at the rows' global positions q_pos0 / q_split / q_pos1 (mla::QueryPos), split or packed
@ -- keys) and the same parameters, plus `tmaps`: the four CUtensorMaps TMA reads the inputs
@ -- through, by value (see the param's doc for their boxes).
@ -- The family of MG_OP_ATTN_FWD on sm_90a (generator/gen/mg_spec.c mg_arch_kernel_table):
@ -- the CUDA executor, generate/compile/tune --arch sm_90a run it in place of attn_fwd.
@ --
@ -- One CTA owns block_m (64 or 128) query rows of one head of one batch item. Warpgroups
@ -- 0 .. block_m/64 - 1 are consumers (64 rows each); the last warpgroup is the producer,
@ -- of which one thread issues every TMA load:
@ --   Q            once, onto q_full: d_qk / W_q boxes {W_q, 1, block_m} (W = 64, 32 or 16
@ --                columns: the widest that divides the dimension; swizzle 128B/64B/32B).
@ --   K_j, V_j     into stage j % stages of a ring: full_k[st] and full_v[st] (expect_tx of
@ --                the K and the V tile's bytes, completed by the TMA loads: S = Q K^T need
@ --                not wait for V) and empty[st] (every consumer thread arrives when it is
@ --                done with the stage; the producer waits on it, parity flipped, before
@ --                reusing the stage). K_nope boxes {W_n, 1, block_n, 1} per head; split
@ --                keys: the shared k_rope [B, S_k, d_r] (rows ld_k_rope apart) in 3D
@ --                boxes {W_r, block_n, 1}; V boxes {W_v, 1, block_n, 1}. The batch item
@ --                is each map's outermost dim: a tile's rows past the item's end are
@ --                TMA's zero fill (masked keys, query rows never stored), never the next
@ --                item's tokens (a NaN there would reach this item's O through 0 * V).
@ -- Consumers, per key tile: S = Q K^T with wgmma m64n{block_n}k16, A (Q) and B (K) from
@ -- shared memory (K-major descriptors); scale to base 2, mask (only tiles crossing the end
@ -- of the keys or the warpgroup's diagonal), online softmax in fp32 with exp2; P packed to
@ -- 16 bits in registers (the accumulator layout of two n8 column blocks is the A register
@ -- fragment of one k16 step) and O += P V with wgmma m64n{d_v}k16 rs, V as an MN-major B
@ -- operand (d_v contiguous, as TMA lands [key][d_v] rows). overlap = 1: FA3's
@ -- intra-warpgroup pipelining, S_j = Q K_j^T issued together with O += P_j-1 V_j-1 and the
@ -- softmax of S_j computed while the latter runs; overlap = 0: each GEMM waited for before
@ -- the next step. pingpong = 1 (two consumers): FA3's inter-warpgroup ping-pong, the
@ -- consumers take turns issuing their GEMMs on named barriers (see the consumer loop), so
@ -- one's GEMMs run on the tensor cores while the other computes its softmax. With two
@ -- consumers the producer gives registers away (setmaxnreg 24 / 240). O and LSE leave from
@ -- the registers.
@ --
@ -- Packed sequences (spec.varlen, the "_varlen" variant: cu_seqlens, n_seqs last; batch 1):
@ -- row i at position qpos(i) sees keys [lo, hi) of its document (mla::Varlen). The CTA's key
@ -- tiles cover [lo of its first row, hi of its last row with keys) and END at that hi (tile
@ -- j's first key is k0 + j block_n, k0 = hi - n_tiles block_n, possibly negative): no tile
@ -- ever reads a row at or past hi <= cu[n_seqs], so slack rows (whatever they hold, NaN
@ -- included) never reach shared memory through K or V; rows before lo are earlier
@ -- documents' tokens or, at negative rows, TMA's zero fill. Scores outside a row's [lo, hi)
@ -- are set to -inf by a select (never a multiply), so P is exactly 0 there and P V adds
@ -- 0 * (finite V) = 0; a slack query row (NaN Q) has no keys: all its scores are selected
@ -- away, O = 0 and LSE = -inf. Each consumer computes the sub-range of tiles its own rows
@ -- need and releases the others.
@ local H, DN, DR, DV = spec.heads, spec.d_n, spec.d_r, spec.d_v
@ local DQK = DN + DR
@ local ESIZE = elem_size(spec.dtype)
@ local SMEM_LIMIT = smem_limit("sm_90a")   -- sm_90's opt-in dynamic shared memory per block (prelude.lua)
@ -- fp32 accumulators per consumer thread: S (block_n / 2) + O (d_v / 2), plus block_n / 4
@ -- registers of P. Every kept configuration of the tested shapes compiles with no spill
@ -- (NVRTC, sm_90a: at most 209 registers, one consumer, block_n 128, d_v 128, overlap).
@ local ACC_LIMIT = 160
@ -- Columns per TMA box of a dimension: 64 (128-byte swizzle), 32 (64B) or 16 (32B).
@ local function smem_bytes(c)
@   local bm = c.block_m
@   return 2048 + ESIZE * (bm * DQK + c.stages * c.block_n * (DQK + DV))
@ end
@ local function accumulators(c) return DV // 2 + c.block_n // 2 end
@ local PACKED = spec.config ~= nil and spec.config.k_packed == 1
@ local VARLEN = spec.varlen
@
@ local K = kernel {
@   family = "attn_fwd_sm90", pass = "fwd", causal = true, varlen = true, interface = { "k_packed" }, flops = { pair = 2 * spec.heads * (spec.d_n + spec.d_r + spec.d_v) },
@   doc = "explicit-form attention forward for sm_90a (FlashAttention-3 manner: TMA ring, mbarriers, wgmma): O and LSE from Q, K, V",
@   params = join_lists({
@     { name = "q",      type = "const elem_t*", shape = "[B, S_q, H, d_n + d_r]", doc = "queries, RoPE part last (read through tmaps[0])" },
@   }, explicit_k_params(PACKED, "per-head no-RoPE keys, W_UK c_kv"), {
@     { name = "v",      type = "const elem_t*", shape = "[B, S_k, H, d_v]",       doc = "per-head values, W_UV c_kv (read through tmaps[3])" },
@     { name = "o",      type = "elem_t*",       shape = "[B, S_q, H, d_v]",       doc = "attention output; 0 for a row without keys" },
@     { name = "lse",    type = "float*",        shape = "[B, H, S_q]",            doc = "natural-log logsumexp of the scaled scores; -inf for a row without keys" },
@   }, explicit_scalar_params(), {
@     { name = "tmaps", type = "const __grid_constant__ mla::sm90::TensorMaps<4>", shape = "[4]",
@       doc = "4 CUtensorMaps passed by value (kernel parameter space; the host passes 4 contiguous 64-byte aligned CUtensorMaps, runtime/exec/mg_sm90_tmap.h), made with cuTensorMapEncodeTiled over the tensors above (16-bit elements, no interleave, zero OOB fill), box inner width W(d) = 64/32/16 columns for d % 64/32/16 = 0 with swizzle 128B/64B/32B: " ..
@             "[0] q dims {d_qk, H, S_q, B} box {W(d_qk), 1, block_m, 1}; [1] k_nope dims {d_n (packed: d_qk), H, S_k, B} box {W(d_n), 1, block_n, 1}; " ..
@             "[2] split: k_rope dims {d_r, S_k, B} row stride ld_k_rope box {W(d_r), block_n, 1}, packed: K dims {d_qk, H, S_k, B} box {W(d_r), 1, block_n, 1}; [3] v dims {d_v, H, S_k, B} box {W(d_v), 1, block_n, 1}" },
@   }, varlen_params()),
@   tunables = {
@     block_m   = { values = { 64, 128 },   doc = "query rows per CTA: 64 per consumer warpgroup (1 or 2 consumers)" },
@     block_n   = { values = { 64, 128 },   doc = "keys per K/V tile (the N of S = Q K^T's wgmma)" },
@     stages    = { values = { 2, 3, 4 },   doc = "K/V tiles in the TMA ring" },
@     overlap   = { values = { 0, 1 },      doc = "1: S_j = Q K_j^T in flight with O += P_j-1 V_j-1, the softmax of S_j overlapping the latter (FA3's intra-warpgroup pipelining); 0: one GEMM at a time" },
@     pingpong  = { values = { 0, 1 },      doc = "1 (block_m 128): the two consumer warpgroups take turns issuing their GEMMs (named barriers), one's softmax overlapping the other's GEMMs (FA3's inter-warpgroup ping-pong); a turn is S_j with P_j-1 V_j-1 (overlap 1) or one GEMM (overlap 0)" },
@     k_packed  = { values = { 0, 1 },      doc = "0: k_nope [B,S_k,H,d_n] + shared k_rope [B,S_k,d_r]; 1: one per-head K [B,S_k,H,d_n+d_r] in k_nope" },
@   },
@   check = function(s, c)
@     if DN % 16 ~= 0 or DR % 16 ~= 0 then return "d_n and d_r must be multiples of 16 (the wgmma k step)" end
@     if c.pingpong == 1 and c.block_m ~= 128 then return "pingpong needs two consumer warpgroups (block_m 128)" end
@     if DV ~= 64 and DV ~= 128 and DV ~= 192 and DV ~= 256 then return "d_v must be 64, 128, 192 or 256 (the N of O += P V's wgmma)" end
@     if accumulators(c) > ACC_LIMIT then
@       return string.format("d_v/2 + block_n/2 = %d fp32 accumulators per thread, over %d (registers would spill)",
@                            accumulators(c), ACC_LIMIT)
@     end
@     if smem_bytes(c) > SMEM_LIMIT then
@       return string.format("needs %d bytes of shared memory, over the %d-byte limit", smem_bytes(c), SMEM_LIMIT)
@     end
@   end,
@   default = function(s)
@     for _, p in ipairs({ { 2, 128, 2 }, { 2, 64, 3 }, { 2, 64, 2 }, { 1, 64, 2 } }) do
@       local c = { block_m = 64 * p[1], block_n = p[2], stages = p[3], k_packed = 0, overlap = 1, pingpong = 0 }
@       if accumulators(c) <= ACC_LIMIT and smem_bytes(c) <= SMEM_LIMIT then return c end
@     end
@     return { block_m = 64, block_n = 64, stages = 2, k_packed = 0, overlap = 1, pingpong = 0 }
@   end,
@   name = function(s, c)
@     return string.format("mla_attn_fwd_sm90_h%d_dn%d_dr%d_dv%d_%s_%s_bm%d_bn%d_st%d%s%s%s", H, DN, DR, DV,
@                          s.dtype, s.causal and "causal" or "full", c.block_m, c.block_n, c.stages,
@                          c.overlap == 1 and "_ov" or "", c.pingpong == 1 and "_pp" or "",
@                          c.k_packed == 1 and "_kpacked" or "")
@   end,
@   launch = function(s, c)
@     return {
@       grid = { { arg = "seqlen_q", div = c.block_m }, { value = H }, { arg = "batch" } },
@       block = { 128 * (c.block_m // 64 + 1), 1, 1 },
@       smem = smem_bytes(c),   -- dynamic; over 48 KiB needs cudaFuncAttributeMaxDynamicSharedMemorySize
@       smem_static = 0,
@     }
@   end,
@ }
@ assert(PACKED == (K.config.k_packed == 1))
@ local C = K.config
@ local PP = C.pingpong == 1   -- the consumers' GEMMs in turns (named barriers)
// Generated by mlagen from templates/attn_fwd_sm90.cu.tpl: do not edit.
// Explicit-form MLA attention forward for sm_90a (TMA + mbarrier ring, wgmma), H=${H}
// d_n=${DN} d_r=${DR} d_v=${DV}, ${spec.dtype}, ${spec.causal and "causal" or "non-causal"}, keys ${PACKED and "packed per head" or "split (shared k_rope)"}.
// Dynamic shared memory: ${smem_bytes(C)} bytes.
#include "mla_device_sm90.cuh"

namespace {
${sm90_preamble(spec)}
${explicit_dims(spec, PACKED)}
constexpr int NC = ${C.block_m // 64};       // consumer warpgroups
constexpr int NUM_THREADS = 128 * (NC + 1);  // + the producer warpgroup
constexpr int BLOCK_M = 64 * NC;
constexpr int BLOCK_N = ${C.block_n};
constexpr int STAGES = ${C.stages};
constexpr bool VARLEN = ${VARLEN and "true" or "false"};  // packed sequences (cu_seqlens)
// TMA box widths (columns) and their swizzles, per tensor.
constexpr int WQ = box_width(DQK), WN = box_width(DN), WR = box_width(DR), WV = box_width(DV);
constexpr int SWQ = box_swizzle(WQ), SWN = box_swizzle(WN), SWR = box_swizzle(WR), SWV = box_swizzle(WV);
// Shared memory (offsets from a 1024-aligned base): mbarriers, Q, then the ring.
constexpr unsigned Q_BYTES = BLOCK_M * DQK * 2;
constexpr unsigned KN_BYTES = BLOCK_N * DN * 2;   // the K_nope part of a K tile
constexpr unsigned K_BYTES = BLOCK_N * DQK * 2;
constexpr unsigned V_BYTES = BLOCK_N * DV * 2;
constexpr unsigned STAGE_BYTES = K_BYTES + V_BYTES;
constexpr unsigned OFF_Q = 1024;
constexpr unsigned OFF_RING = OFF_Q + Q_BYTES;
static_assert(DN % 16 == 0 && DR % 16 == 0 && BLOCK_N % 16 == 0, "tile shape");
static_assert(Q_BYTES % 1024 == 0 && KN_BYTES % 1024 == 0 && STAGE_BYTES % 1024 == 0, "swizzle alignment");
static_assert(1 + 3 * STAGES <= 128, "mbarriers fit in 1024 bytes");
}  // namespace

extern "C" __global__ void __launch_bounds__(NUM_THREADS, 1)
${K.name}(
    ${param_list(K.params)}) {
  extern __shared__ __align__(1024) unsigned char smem[];
  unsigned char* const sbase = smem_align_1024(smem);
  unsigned long long* const q_full = reinterpret_cast<unsigned long long*>(sbase);
  unsigned long long* const full_k = q_full + 1;        // [STAGES]: K tile landed
  unsigned long long* const full_v = full_k + STAGES;   // [STAGES]: V tile landed
  unsigned long long* const empty = full_v + STAGES;    // [STAGES]: consumers done with it
  unsigned char* const sQ = sbase + OFF_Q;
  unsigned char* const ring = sbase + OFF_RING;

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int m0 = blockIdx.x * BLOCK_M;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const mla::QueryPos qpos{q_pos0, q_split, q_pos1};  // rows' global positions
  // Keys this CTA can see: with causal masking, none past its last query's position.
  const int q_last = min(m0 + BLOCK_M, seqlen_q) - 1;
@ if VARLEN then
  // Packed: the keys the CTA's rows see, in tiles that end at their last (tile j from key
  // k0 + j BLOCK_N).
  const mla::Varlen vl{cu_seqlens, n_seqs};
  const VarlenTiles kt = varlen_tail_tiles<CAUSAL, BLOCK_N>(vl, qpos, m0, q_last, seqlen_k);
  const int n_tiles = kt.n, k0 = kt.k0;
@ else
  const int n_tiles = mla::visible_key_tiles<CAUSAL, BLOCK_N>(seqlen_k, 0, qpos(q_last));
@ end

  if (tid == 0) {
    mbar_init(q_full, 1);
    for (int st = 0; st < STAGES; ++st) {
      mbar_init(&full_k[st], 1);
      mbar_init(&full_v[st], 1);
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
      mbar_arrive_expect_tx(q_full, Q_BYTES);
      tma_load_boxes_4d<DQK, WQ, BLOCK_M>(sQ, &tmaps.m[0], q_full, 0, h, m0, b);
    }
    for (int j = 0; j < n_tiles; ++j) {
      const int st = j % STAGES;
      const unsigned ph = (unsigned)(j / STAGES) & 1u;
      mbar_wait(&empty[st], ph ^ 1u);  // MUTATION: empty wait
      unsigned char* const sK = ring + st * STAGE_BYTES;
      unsigned char* const sV = sK + K_BYTES;
      const int row = ${VARLEN and "k0 + " or ""}j * BLOCK_N;  // of batch item b
      mbar_arrive_expect_tx(&full_k[st], K_BYTES);
      tma_load_k_tile<DN, DR, WN, WR, BLOCK_N, K_PACKED>(sK, &tmaps.m[1], &tmaps.m[2], &full_k[st], h, row, b);
      mbar_arrive_expect_tx(&full_v[st], V_BYTES);
      tma_load_boxes_4d<DV, WV, BLOCK_N>(sV, &tmaps.m[3], &full_v[st], 0, h, row, b);
    }
    return;
  }

  // ---- consumer warpgroup wg: query rows m0 + 64 wg .. + 63 ---------------------------------
@ if C.block_m == 128 then
  setmaxnreg_inc<240>();
@ end
  const int t = tid % 128;
  const int g = (t % 32) / 4;  // fragment row (and row + 8) within the warp's 16
  const int qd = t % 4;        // fragment column pair
  const int i0 = m0 + 64 * wg;             // the warpgroup's first query row
  const int r0 = i0 + 16 * (t / 32) + g;   // this thread's rows r0, r0 + 8
  const float scale_log2 = softmax_scale * mla::LOG2E;
  const unsigned q_addr = smem_u32(sQ) + 64 * wg * 2 * WQ;  // this warpgroup's rows of each Q box
  const unsigned ring_addr = smem_u32(ring);

  float acc_o[DV / 2];
#pragma unroll
  for (int i = 0; i < DV / 2; ++i) acc_o[i] = 0.f;
  float s[BLOCK_N / 2];
  float m_i[2] = {mla::neg_inf(), mla::neg_inf()};  // running max of the base-2 scores
  float l_i[2] = {0.f, 0.f};                        // this thread's part of the running sum

@ if VARLEN then
  // Tiles this warpgroup computes: [wg_first, wg_tiles) of the CTA's, those holding keys of
  // its rows' ranges (the others released here and after the loop); the keys
  // [row_lo[r], row_hi[r]) of this thread's rows r0, r0 + 8.
  int wg_first, wg_tiles;
  varlen_tile_span<CAUSAL, BLOCK_N>(vl, qpos, i0, min(i0 + 63, seqlen_q - 1), seqlen_k, k0, wg_first, wg_tiles);
  int row_lo[2], row_hi[2];
  vl.keys<CAUSAL>(qpos(r0), seqlen_k, row_lo[0], row_hi[0]);
  vl.keys<CAUSAL>(qpos(r0 + 8), seqlen_k, row_lo[1], row_hi[1]);
@ if not PP then
  ring_release<STAGES>(full_k, full_v, empty, 0, wg_first);
@ end
@ else
  // Tiles this warpgroup computes: a prefix of the CTA's (causal: a tile whose first key
  // is past the warpgroup's last row is hidden from all of its rows); none when its rows
  // are past seqlen_q.
  const int wg_tiles = i0 >= seqlen_q ? 0
                       : CAUSAL ? min(n_tiles, max(0, qpos(i0 + 63) / BLOCK_N + 1))
                                : n_tiles;
@ end
  float corr[2];  // the last softmax's rescaling of O

  // S = Q K^T for the K tile in stage st (issued, not waited for).
  auto issue_s = [&](int st) {
    const unsigned k_addr = ring_addr + st * STAGE_BYTES;
    fence_operand(s);
    wgmma_fence();  // MUTATION: S fence
#pragma unroll
    for (int ks = 0; ks < DQK / 16; ++ks) {
      const unsigned long long db = ks * 16 < DN
          ? make_desc_kstep(k_addr, BLOCK_N, WN, SWN, ks)
          : make_desc_kstep(k_addr + KN_BYTES, BLOCK_N, WR, SWR, ks - DN / 16);
      wgmma_ss<BLOCK_N, tag_t>(s, make_desc_kstep(q_addr, BLOCK_M, WQ, SWQ, ks), db, ks > 0);
    }
    wgmma_commit();
  };
  // O += P V for the V tile in stage st (issued, not waited for): V [key][d_v] as an
  // MN-major B operand (d_v contiguous): boxes of WV columns BLOCK_N rows apart (LBO),
  // 8 keys = 8 swizzle rows (SBO).
  auto issue_pv = [&](int st, const unsigned (&p)[BLOCK_N / 16][4]) {
    const unsigned v_addr = ring_addr + st * STAGE_BYTES + K_BYTES;
    fence_operand(acc_o);
    wgmma_fence();  // MUTATION: PV fence
#pragma unroll
    for (int kk = 0; kk < BLOCK_N / 16; ++kk)
      wgmma_rs_tb<DV, tag_t>(acc_o, p[kk],
                             make_desc_mn_kstep(SWV, v_addr, BLOCK_N, kk), 1);
    wgmma_commit();
  };
  // Scale S (tile at key n0) to base 2, mask it (only when the tile crosses the end of the
  // keys or this warpgroup's diagonal), and the online softmax: S becomes P (fp32), the
  // running max and sum are updated and corr is how O must be rescaled (not done here: O
  // may be in flight). Rows r0 (i % 4 < 2) and r0 + 8, each spread over a quad.
  auto softmax = [&](int n0) {
@ if VARLEN then
    varlen_scale_mask<BLOCK_N>(s, scale_log2, n0, qd, row_lo, row_hi);
@ else
    const bool edge = n0 + BLOCK_N > seqlen_k || (CAUSAL && n0 + BLOCK_N - 1 > qpos(i0));
#pragma unroll
    for (int i = 0; i < BLOCK_N / 2; ++i) {
      float x = s[i] * scale_log2;
      if (edge) {
        const int key = n0 + 8 * (i / 4) + 2 * qd + (i % 2);
        const int row = r0 + 8 * ((i % 4) / 2);
        if (mla::key_hidden<CAUSAL>(key, qpos(row), seqlen_k, 0)) x = mla::neg_inf();
      }
      s[i] = x;
    }
@ end
    online_softmax<BLOCK_N>(s, m_i, l_i, corr);
  };
  auto rescale_o = [&]() { rescale_rows<DV>(acc_o, corr); };
  // P to 16 bits: the A register fragments of O += P V's k-steps.
  unsigned p[BLOCK_N / 16][4];
  auto pack_p = [&]() { acc_to_a<elem_t, BLOCK_N>(p, s); };
  auto parity = [](int j) { return (unsigned)(j / STAGES) & 1u; };

@ local J0 = VARLEN and "wg_first" or "0"     -- the warpgroup's first tile
@ local N0 = VARLEN and "k0 + " or ""         -- tile j's first key: N0 j * BLOCK_N
@ if PP then
  // Ping-pong (FlashAttention-3's inter-warpgroup schedule): the two consumers take turns
  // issuing their GEMMs, so that one's run on the tensor cores while the other computes its
  // softmax. A turn is S_j = Q K_j^T with O += P_j-1 V_j-1 (overlap 1: turn j of the CTA's
  // n_tiles + 1) or one GEMM (overlap 0: turn 2j is S_j, 2j + 1 is P_j V_j). Warpgroup w's
  // turn begins with bar.sync on named barrier PP_BAR + w and ends with bar.arrive on the
  // other's: an instance of each barrier is one warpgroup's sync and the other's arrive (256
  // threads). Warpgroup 0 takes its first turn without waiting and warpgroup 1 does not hand
  // its last back, so the turns go 0, 1, 0, 1, ... and both barriers end complete. The
  // barriers order the issue of the GEMMs, not data. Both warpgroups take every turn of the
  // CTA: a warpgroup sits out (takes and hands back at once) the turns of tiles its rows do
  // not need and releases those tiles after the hand-back. No turn can wait for the other's
  // next one: a load waits for releases `stages` >= 2 tiles back, made in earlier turns.
  constexpr unsigned PP_BAR = 1;  // ids PP_BAR, PP_BAR + 1 (0 is __syncthreads's)
  const int n_turns = ${C.overlap == 1 and "n_tiles > 0 ? n_tiles + 1 : 0" or "2 * n_tiles"};
  int turn = 0;
  auto turn_begin = [&]() {
    if (wg == 1 || turn > 0) bar_sync(PP_BAR + wg, 256);  // MUTATION: turn wait
  };
  auto turn_end = [&]() {
    if (wg == 0 || turn < n_turns - 1) bar_arrive(PP_BAR + 1 - wg, 256);  // MUTATION: turn hand-back
    ++turn;
  };
  int rel = 0;  // the tiles below rel that this warpgroup does not compute are released
  // Sits out the turns up to `until`, releasing after each the tiles up to its own (below
  // rel_end).
  auto idle_turns = [&](int until, int rel_end) {
    while (turn < until) {
      turn_begin();
      turn_end();
      const int upto = min(${C.overlap == 1 and "turn" or "(turn + 1) / 2"}, rel_end);
      ring_release<STAGES>(full_k, full_v, empty, rel, upto);
      rel = max(rel, upto);
    }
  };
@ if VARLEN then
  idle_turns(${C.overlap == 1 and "wg_first" or "2 * wg_first"}, wg_first);  // the tiles before this warpgroup's
@ end
@ else
  // Without ping-pong a GEMM is issued without taking a turn.
  auto turn_begin = [] {};
  auto turn_end = [] {};
@ end
  if (wg_tiles > ${J0}) mbar_wait(q_full, 0);
@ if C.overlap == 0 then
  // One tile at a time: S_j, its softmax, P_j V_j, each GEMM waited for before the next step.
  for (int j = ${J0}; j < wg_tiles; ++j) {
    const int st = j % STAGES;
    mbar_wait(&full_k[st], parity(j));  // MUTATION: K full wait
    turn_begin();
    issue_s(st);
    turn_end();
    wgmma_wait<0>();  // MUTATION: S wait
    fence_operand(s);
    softmax(${N0}j * BLOCK_N);
    rescale_o();
    pack_p();
    mbar_wait(&full_v[st], parity(j));  // MUTATION: V full wait
    turn_begin();
    issue_pv(st, p);
    turn_end();
    wgmma_wait<0>();  // MUTATION: PV wait
    fence_operand(acc_o);
    mbar_arrive(&empty[st]);  // MUTATION: empty release
  }
@ else
  // FlashAttention-3's intra-warpgroup overlap: S_j = Q K_j^T and O += P_j-1 V_j-1 are in
  // flight together; the softmax of S_j runs while P_j-1 V_j-1 is still computing, and O
  // is rescaled once that is done.
@ if VARLEN then
  if (wg_tiles > wg_first) {
    mbar_wait(&full_k[wg_first % STAGES], parity(wg_first));  // MUTATION: first K wait
    turn_begin();
    issue_s(wg_first % STAGES);
    turn_end();
    wgmma_wait<0>();  // MUTATION: first S wait
    fence_operand(s);
    softmax(k0 + wg_first * BLOCK_N);  // O is 0: nothing to rescale
    pack_p();
  }
@ else
  if (wg_tiles > 0) {
    mbar_wait(&full_k[0], 0);  // MUTATION: first K wait
    turn_begin();
    issue_s(0);
    turn_end();
    wgmma_wait<0>();  // MUTATION: first S wait
    fence_operand(s);
    softmax(0);  // O is 0: nothing to rescale
    pack_p();
  }
@ end
  for (int j = ${VARLEN and "wg_first + 1" or "1"}; j < wg_tiles; ++j) {
    const int st = j % STAGES, pst = (j - 1) % STAGES;
    mbar_wait(&full_k[st], parity(j));  // MUTATION: K full wait
    turn_begin();
    issue_s(st);
    mbar_wait(&full_v[pst], parity(j - 1));  // MUTATION: V full wait
    issue_pv(pst, p);
    turn_end();
    wgmma_wait<1>();  // MUTATION: S wait
    fence_operand(s);
    softmax(${N0}j * BLOCK_N);
    wgmma_wait<0>();  // MUTATION: PV wait
    fence_operand(acc_o);
    mbar_arrive(&empty[pst]);  // MUTATION: empty release
    rescale_o();
    pack_p();
  }
  if (wg_tiles > ${J0}) {
    const int st = (wg_tiles - 1) % STAGES;
    mbar_wait(&full_v[st], parity(wg_tiles - 1));  // MUTATION: last V full wait
    turn_begin();
    issue_pv(st, p);
    turn_end();
    wgmma_wait<0>();  // MUTATION: last PV wait
    fence_operand(acc_o);
    mbar_arrive(&empty[st]);  // MUTATION: last release
  }
@ end
  // The tiles hidden from this warpgroup's rows (the other consumer's, or gaps no row sees): released
  // once loaded.
@ if PP then
  rel = max(rel, wg_tiles);
  idle_turns(n_turns, n_tiles);  // (in its remaining turns)
@ else
  ring_release<STAGES>(full_k, full_v, empty, wg_tiles, n_tiles);
@ end

  // Epilogue: O = acc / l straight from the registers, LSE = (m + log2 l) ln 2.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_i[r] += __shfl_xor_sync(mla::FULL_MASK, l_i[r], 1);
    l_i[r] += __shfl_xor_sync(mla::FULL_MASK, l_i[r], 2);
  }
  const float inv[2] = {l_i[0] > 0.f ? 1.f / l_i[0] : 0.f, l_i[1] > 0.f ? 1.f / l_i[1] : 0.f};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = r0 + 8 * r;
    if (i < seqlen_q) {
      elem_t* const orow = o + (((size_t)b * seqlen_q + i) * H + h) * DV;
#pragma unroll
      for (int n = 0; n < DV / 8; ++n)
        *reinterpret_cast<unsigned*>(orow + 8 * n + 2 * qd) =
            pack2(acc_o[4 * n + 2 * r] * inv[r], acc_o[4 * n + 2 * r + 1] * inv[r]);
      if (qd == 0)
        lse[((size_t)b * H + h) * seqlen_q + i] =
            l_i[r] > 0.f ? (m_i[r] + log2f(l_i[r])) * mla::LN2 : mla::neg_inf();
    }
  }
}
