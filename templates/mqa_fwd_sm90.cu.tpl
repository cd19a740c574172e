@ -- mqa_fwd_sm90: the absorbed-form MQA attention forward (mqa_fwd's semantics, parameters and
@ -- layouts, plus `tmaps`) for Hopper (sm_90a): TMA ring on mbarriers, wgmma, a producer
@ -- warpgroup, the d_c-wide O split across two consumer warpgroups that share P through
@ -- shared memory (the manner of FlashMLA's sm90 kernel; FlashAttention-3 for the pipeline).
@ -- Not used by the planner or the executors yet (their plans run mqa_fwd): rendered only on
@ -- request (`mlagen generate --family mqa_fwd_sm90`).
@ --
@ -- Rows: q[b] viewed as a [S_q H, d_c + d_r] matrix whose row r = i H + h is query i of head
@ -- h (its own layout), o[b] as [S_q H, d_c]; a CTA owns 64 consecutive rows of one batch
@ -- item (one wgmma M); row r has position q_pos0 + r / H.
@ -- Warpgroups (384 threads): 0 and 1 consumers, 2 the producer, of which one thread issues
@ -- every TMA load (setmaxnreg: 24 registers for it, 240 for the consumers):
@ --   Q           once, onto q_full: (d_c + d_r) / W boxes {W, 64, 1} of the 3D map over
@ --               the S_q H rows of each batch item (W = 64, 32 or 16 columns, the widest
@ --               dividing d_c + d_r; swizzle 128B/64B/32B; rows past the item's end are
@ --               TMA's zero fill, never the next item's).
@ --   C_j         the latent tile [c_kv ; k_rope] of keys j block_n .. + block_n, loaded
@ --               once into stage j % stages of a ring (full[st]: expect_tx of its bytes;
@ --               empty[st]: both consumer warpgroups arrive when done with it) and read as
@ --               K (all d_c + d_r columns, K-major) and as V (its first d_c columns, as an
@ --               MN-major B operand: d contiguous, as TMA lands [key][d] rows).
@ -- Consumer 0, per tile: S = Q C_j^T (wgmma m64n{block_n}k16, both operands from shared
@ -- memory), scaled to base 2, masked (only tiles crossing the end of the keys or the
@ -- diagonal of the CTA's first row: with packed rows the diagonal is per token), online
@ -- softmax in fp32; P packed to 16 bits in registers, O[:, 0 : d_c/2] += P V_j with P from
@ -- registers (wgmma rs). It also stores P (128B-swizzled, K-major) and the rows' rescale
@ -- factors into shared memory, proxy-fenced, and signals p_full (named barrier).
@ -- Consumer 1, per tile: waits p_full, rescales its O, O[:, d_c/2 : d_c] += P V_j with P
@ -- from shared memory (wgmma ss), then signals p_free (named barrier), which consumer 0
@ -- waits for before it stores the next P. So S_j+1 and its softmax (consumer 0) overlap
@ -- P_j V_j (consumer 1), and the tensor cores do each product once: S once, P V once.
@ -- overlap = 1 (FA3's intra-warpgroup pipelining in consumer 0): S_j+1 is issued together
@ -- with its own P_j V_j, and the softmax of S_j+1 runs while the latter computes; overlap =
@ -- 0: each GEMM waited for before the next step.
@ -- Epilogue: consumer 0 writes the row sums to shared memory (named barrier l_ready) and LSE;
@ -- both write their O columns straight from the registers. Causal kernels take the row
@ -- tiles in reverse order (longest first).
@ --
@ -- Packed sequences (spec.varlen, "_varlen": cu_seqlens, n_seqs last; batch 1): query i at
@ -- position q_pos0 + i sees keys [lo, hi) of its document (mla::Varlen). As attn_fwd_sm90's:
@ -- the CTA's latent tiles cover [lo of its first query, hi of its last query with keys) and
@ -- END at that hi, so no slack latent row (NaN allowed) reaches shared memory (earlier rows
@ -- are earlier documents' tokens or TMA's zero fill at negative rows); consumer 0 selects
@ -- the scores outside each row's [lo, hi) to -inf, so P is exactly 0 there and a slack
@ -- query row (NaN Q) gets O = 0 and LSE = -inf.
@ local H, DC, DR = spec.heads, spec.d_c, spec.d_r
@ local DQK = DC + DR
@ local ESIZE = elem_size(spec.dtype)
@ local SMEM_LIMIT = smem_limit("sm_90a")
@ -- Columns per TMA box (and per K-major swizzle atom): the widest of 64/32/16 dividing d_qk.
@ local W = tma_box_width(DQK)
@ -- 2048: the 1024-byte alignment slack and the area of the mbarriers and the row arrays;
@ -- then Q (64 rows), the ring, P (64 x block_n).
@ local function smem_bytes(c)
@   return 2048 + ESIZE * ((64 + c.stages * c.block_n) * DQK + 64 * c.block_n)
@ end
@ -- Consumer 0's fp32 accumulators per thread: O (d_c / 4: its d_c / 2 columns of 64 rows),
@ -- S (block_n / 2) and P's 16-bit pairs (block_n / 4). Measured (NVRTC, sm_90a): at most
@ -- 176 (576/512, block_n 64) compiles with no spill under the 240 registers setmaxnreg gives.
@ local ACC_LIMIT = 176
@ local function accumulators(c) return DC // 4 + c.block_n // 2 + c.block_n // 4 end
@
@ local K = kernel {
@   family = "mqa_fwd_sm90", pass = "fwd", causal = true, varlen = true, flops = { pair = 2 * spec.heads * ((spec.d_c + spec.d_r) + spec.d_c) },
@   doc = "absorbed-form MQA attention forward over the latent for sm_90a (TMA ring, mbarriers, wgmma, O split over two consumer warpgroups): O and LSE",
@   params = join_lists({
@     { name = "q",   type = "const elem_t*", shape = "[B, S_q, H, d_c + d_r]", doc = "absorbed queries [W_UK^T q_nope ; q_rope] per head, RoPE part last (read through tmaps[0])" },
@     { name = "c",   type = "const elem_t*", shape = "[B, S_k, d_c + d_r]",    doc = "the shared latent head: keys [c_kv ; k_rope]; values are its first d_c columns (read through tmaps[1])" },
@     { name = "o",   type = "elem_t*",       shape = "[B, S_q, H, d_c]",       doc = "attention output in the latent space; 0 for a row without keys" },
@     { name = "lse", type = "float*",        shape = "[B, H, S_q]",            doc = "natural-log logsumexp of the scaled scores; -inf for a row without keys" },
@     { name = "seqlen_q", type = "int", doc = "query tokens per batch item" },
@     { name = "seqlen_k", type = "int", doc = "key tokens per batch item" },
@     { name = "q_pos0",   type = "int", doc = "global position of query 0 (keys start at 0); causal keeps key j for query i iff j <= q_pos0 + i" },
@     { name = "softmax_scale", type = "float", doc = "mscale^2 / sqrt(d_n + d_r) (the explicit form's scale)" },
@     { name = "tmaps", type = "const __grid_constant__ mla::sm90::TensorMaps<2>", shape = "[2]",
@       doc = "2 CUtensorMaps passed by value (kernel parameter space; the host passes 2 contiguous 64-byte aligned CUtensorMaps, runtime/exec/mg_sm90_tmap.h), made with cuTensorMapEncodeTiled over q and c (16-bit elements, no interleave, zero OOB fill), box inner width W = 64/32/16 columns for d_c + d_r % 64/32/16 = 0 with swizzle 128B/64B/32B: " ..
@             "[0] q dims {d_c + d_r, S_q*H, B} box {W, 64, 1}; [1] c dims {d_c + d_r, S_k, B} box {W, block_n, 1}" },
@   }, varlen_params()),
@   tunables = {
@     block_n = { values = { 64, 128 },  doc = "keys per latent tile (the N of S = Q C^T's wgmma; the K of O += P V)" },
@     stages  = { values = { 2, 3, 4 },  doc = "latent tiles in the TMA ring" },
@     overlap = { values = { 0, 1 },     doc = "1: consumer 0 issues S_j+1 = Q C_j+1^T with its O += P_j V_j, the softmax of S_j+1 overlapping the latter (FA3's intra-warpgroup pipelining); 0: one GEMM at a time" },
@   },
@   check = function(s, c)
@     if DC % 16 ~= 0 or DR % 16 ~= 0 then return "d_c and d_r must be multiples of 16 (the wgmma k step)" end
@     if DC ~= 128 and DC ~= 256 and DC ~= 384 and DC ~= 512 then
@       return "d_c must be 128, 256, 384 or 512 (each consumer's O += P V is a wgmma of N = d_c / 2)"
@     end
@     if (DC // 2) % W ~= 0 then
@       return string.format("d_c / 2 = %d must be a multiple of the TMA box width %d (consumer 1's V starts on a box)", DC // 2, W)
@     end
@     if accumulators(c) > ACC_LIMIT then
@       return string.format("d_c/4 + block_n/2 + block_n/4 = %d fp32 accumulators per thread, over %d (registers would spill)",
@                            accumulators(c), ACC_LIMIT)
@     end
@     if smem_bytes(c) > SMEM_LIMIT then
@       return string.format("needs %d bytes of shared memory, over the %d-byte limit", smem_bytes(c), SMEM_LIMIT)
@     end
@   end,
@   default = function(s)
@     for _, p in ipairs({ { 64, 4 }, { 64, 3 }, { 64, 2 }, { 128, 2 } }) do
@       local c = { block_n = p[1], stages = p[2], overlap = 1 }
@       if accumulators(c) <= ACC_LIMIT and smem_bytes(c) <= SMEM_LIMIT then return c end
@     end
@     return { block_n = 64, stages = 2, overlap = 1 }
@   end,
@   name = function(s, c)
@     return string.format("mla_mqa_fwd_sm90_h%d_dc%d_dr%d_%s_%s_bn%d_st%d%s", H, DC, DR,
@                          s.dtype, s.causal and "causal" or "full", c.block_n, c.stages,
@                          c.overlap == 1 and "_ov" or "")
@   end,
@   launch = function(s, c)
@     return {
@       grid = { { arg = "seqlen_q", mul = H, div = 64 }, { value = 1 }, { arg = "batch" } },
@       block = { 384, 1, 1 },
@       smem = smem_bytes(c),   -- dynamic; over 48 KiB needs cudaFuncAttributeMaxDynamicSharedMemorySize
@       smem_static = 0,
@     }
@   end,
@ }
@ local C = K.config
@ local VARLEN = spec.varlen
// Generated by mlagen from templates/mqa_fwd_sm90.cu.tpl: do not edit.
// Absorbed-form MLA attention forward (MQA over the latent) for sm_90a (TMA + mbarrier ring,
// wgmma, O split over two consumer warpgroups), H=${H} d_c=${DC} d_r=${DR}, ${spec.dtype},
// ${spec.causal and "causal" or "non-causal"}.
// Dynamic shared memory: ${smem_bytes(C)} bytes.
#include "mla_device_sm90.cuh"

namespace {
${sm90_preamble(spec)}
constexpr int DC = ${DC};
constexpr int DR = ${DR};
constexpr int DQK = DC + DR;
constexpr int DH = DC / 2;  // O columns per consumer warpgroup
constexpr int BLOCK_M = 64;  // rows (r = i * H + h) per CTA
constexpr int BLOCK_N = ${C.block_n};
constexpr int STAGES = ${C.stages};
constexpr bool VARLEN = ${VARLEN and "true" or "false"};  // packed sequences (cu_seqlens)
constexpr int NUM_THREADS = 384;  // consumers 0, 1; producer 2
constexpr int W = ${W};           // columns per TMA box
constexpr int SW = box_swizzle(W);
// Named barriers (consumer 0 arrives, consumer 1 waits, or the reverse; 256 threads).
constexpr unsigned BAR_P_FULL = 1;   // P_j and its rescale factors are in shared memory
constexpr unsigned BAR_P_FREE = 2;   // consumer 1 is done with them
constexpr unsigned BAR_L_READY = 3;  // the row sums are in shared memory
// Shared memory (offsets from a 1024-aligned base): mbarriers and the row arrays, Q, the
// ring, P (BLOCK_N / 64 boxes of [64 rows][64 columns], 128B-swizzled).
constexpr unsigned Q_BYTES = BLOCK_M * DQK * 2;
constexpr unsigned STAGE_BYTES = BLOCK_N * DQK * 2;
constexpr unsigned P_BOX = BLOCK_M * 128;
constexpr unsigned OFF_ROWS = 128;  // float scale[64], then float l[64]
constexpr unsigned OFF_Q = 1024;
constexpr unsigned OFF_RING = OFF_Q + Q_BYTES;
constexpr unsigned OFF_P = OFF_RING + STAGES * STAGE_BYTES;
static_assert(DC % 16 == 0 && DR % 16 == 0 && DQK % W == 0 && DH % W == 0, "head dims");
static_assert(BLOCK_N % 64 == 0, "P boxes");
static_assert(Q_BYTES % 1024 == 0 && STAGE_BYTES % 1024 == 0, "swizzle alignment");
static_assert(8 * (1 + 2 * STAGES) <= OFF_ROWS && OFF_ROWS + 2 * 64 * 4 <= OFF_Q, "barrier area");
}  // namespace

extern "C" __global__ void __launch_bounds__(NUM_THREADS, 1)
${K.name}(
    ${param_list(K.params)}) {
  extern __shared__ __align__(1024) unsigned char smem[];
  unsigned char* const sbase = smem_align_1024(smem);
  unsigned long long* const q_full = reinterpret_cast<unsigned long long*>(sbase);
  unsigned long long* const full = q_full + 1;       // [STAGES]: latent tile landed
  unsigned long long* const empty = full + STAGES;   // [STAGES]: both consumers done with it
  float* const s_scale = reinterpret_cast<float*>(sbase + OFF_ROWS);  // [64]: O's rescale by tile
  float* const s_l = s_scale + BLOCK_M;                              // [64]: the row sums
  unsigned char* const sQ = sbase + OFF_Q;
  unsigned char* const ring = sbase + OFF_RING;
  unsigned char* const sP = sbase + OFF_P;

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int rows = seqlen_q * H;  // flattened rows of a batch item
  // Causal: the row tiles in reverse, so the CTAs with the most key tiles start first (the
  // longest-first order shortens the tail of the grid).
  const int m0 = (CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * BLOCK_M;
  const int b = blockIdx.z;
  // Keys this CTA can see: with causal masking, none past its last row's position.
  const int q_last = (min(m0 + BLOCK_M, rows) - 1) / H;
@ if VARLEN then
  // Packed: the keys the CTA's queries see, in tiles that end at their last (tile j from
  // key k0 + j BLOCK_N; none for a CTA past the rows: m0 / H > q_last).
  const mla::Varlen vl{cu_seqlens, n_seqs};
  const mla::QueryPos qpos{q_pos0, 0, q_pos0};
  const VarlenTiles kt = varlen_tail_tiles<CAUSAL, BLOCK_N>(vl, qpos, m0 / H, q_last, seqlen_k);
  const int n_tiles = kt.n, k0 = kt.k0;
@ else
  const int n_end = CAUSAL ? min(seqlen_k, q_pos0 + q_last + 1) : seqlen_k;
  const int n_tiles = n_end > 0 ? (n_end + BLOCK_N - 1) / BLOCK_N : 0;
@ end

  if (tid == 0) {
    mbar_init(q_full, 1);
    for (int st = 0; st < STAGES; ++st) {
      mbar_init(&full[st], 1);
      mbar_init(&empty[st], 256);
    }
    mbar_init_fence();
  }
  __syncthreads();  // MUTATION: init barrier

  if (wg == 2) {
    // ---- producer warpgroup: one thread issues the TMA loads ------------------------------
    setmaxnreg_dec<24>();
    if (tid != 256) return;
    if (n_tiles > 0) {
      mbar_arrive_expect_tx(q_full, Q_BYTES);
      tma_load_boxes_3d<DQK, W, BLOCK_M>(sQ, &tmaps.m[0], q_full, 0, m0, b);
    }
    for (int j = 0; j < n_tiles; ++j) {
      const int st = j % STAGES;
      const unsigned ph = (unsigned)(j / STAGES) & 1u;
      mbar_wait(&empty[st], ph ^ 1u);  // MUTATION: empty wait
      unsigned char* const sC = ring + st * STAGE_BYTES;
      mbar_arrive_expect_tx(&full[st], STAGE_BYTES);
      tma_load_boxes_3d<DQK, W, BLOCK_N>(sC, &tmaps.m[1], &full[st], 0, ${VARLEN and "k0 + " or ""}j * BLOCK_N, b);
    }
    return;
  }

  // ---- consumer warpgroup wg: all 64 rows, O columns [wg DC/2, (wg + 1) DC/2) -------------
  setmaxnreg_inc<240>();
  const int t = tid % 128;
  const int g = (t % 32) / 4;          // fragment row (and row + 8) within the warp's 16
  const int qd = t % 4;                // fragment column pair
  const int rl = 16 * (t / 32) + g;    // this thread's rows of the tile: rl, rl + 8
  const unsigned ring_addr = smem_u32(ring);
  auto parity = [](int j) { return (unsigned)(j / STAGES) & 1u; };
  // V of consumer wg in stage st: columns [wg DH, +DH) of the tile, an MN-major B operand
  // (boxes of W columns BLOCK_N rows apart).
  auto vdesc = [&](int st, int kk) {
    return make_desc_mn_kstep(SW, ring_addr + st * STAGE_BYTES + (wg * DH / W) * BLOCK_N * 2 * W,
                              BLOCK_N, kk);
  };

  float acc_o[DH / 2];
#pragma unroll
  for (int i = 0; i < DH / 2; ++i) acc_o[i] = 0.f;
  float l_row[2];

  if (wg == 0) {
    const unsigned q_addr = smem_u32(sQ);
    float s[BLOCK_N / 2];
    unsigned p[BLOCK_N / 16][4];
    float m_i[2] = {mla::neg_inf(), mla::neg_inf()};  // running max of the base-2 scores
    float l_i[2] = {0.f, 0.f};                        // this thread's part of the running sum
    float corr[2];                                    // the last softmax's rescaling of O
    const float scale_log2 = softmax_scale * mla::LOG2E;
@ if VARLEN then
    // the keys [row_lo[r], row_hi[r]) of this thread's rows rl, rl + 8 (queries (m0 + rl) / H..)
    int row_lo[2], row_hi[2];
    vl.keys<CAUSAL>(q_pos0 + (m0 + rl) / H, seqlen_k, row_lo[0], row_hi[0]);
    vl.keys<CAUSAL>(q_pos0 + (m0 + rl + 8) / H, seqlen_k, row_lo[1], row_hi[1]);
@ else
    const int pos_first = q_pos0 + m0 / H;  // the CTA's first row's position
@ end
    // S = Q C^T over all d_c + d_r columns of the tile in stage st (issued, not waited for).
    auto issue_s = [&](int st) {
      const unsigned c_addr = ring_addr + st * STAGE_BYTES;
      fence_operand(s);
      wgmma_fence();  // MUTATION: S fence
#pragma unroll
      for (int ks = 0; ks < DQK / 16; ++ks)
        wgmma_ss<BLOCK_N, tag_t>(s, make_desc_kstep(q_addr, BLOCK_M, W, SW, ks), make_desc_kstep(c_addr, BLOCK_N, W, SW, ks), ks > 0);
      wgmma_commit();
    };
    // O[:, 0 : DH] += P V for the tile in stage st, P from the registers (issued, not waited for).
    auto issue_pv = [&](int st) {
      fence_operand(acc_o);
      wgmma_fence();  // MUTATION: PV0 fence
#pragma unroll
      for (int kk = 0; kk < BLOCK_N / 16; ++kk) wgmma_rs_tb<DH, tag_t>(acc_o, p[kk], vdesc(st, kk), 1);
      wgmma_commit();
    };
    // Scale S (tile at key n0) to base 2, mask it (only tiles crossing the end of the keys or
    // the diagonal of the CTA's first row), and the online softmax: S becomes P (fp32), the
    // running max and sum are updated and corr is how O must be rescaled (not done here: O
    // may be in flight). Rows rl (i % 4 < 2) and rl + 8, each spread over a quad.
    auto softmax = [&](int n0) {
@ if VARLEN then
      varlen_scale_mask<BLOCK_N>(s, scale_log2, n0, qd, row_lo, row_hi);
@ else
      const bool edge = n0 + BLOCK_N > seqlen_k || (CAUSAL && n0 + BLOCK_N - 1 > pos_first);
#pragma unroll
      for (int i = 0; i < BLOCK_N / 2; ++i) {
        float x = s[i] * scale_log2;
        if (edge) {
          const int key = n0 + 8 * (i / 4) + 2 * qd + (i % 2);
          const int pos = q_pos0 + (m0 + rl + 8 * ((i % 4) / 2)) / H;
          if (key >= seqlen_k || (CAUSAL && key > pos)) x = mla::neg_inf();
        }
        s[i] = x;
      }
@ end
      online_softmax<BLOCK_N>(s, m_i, l_i, corr);
    };
    auto rescale_o = [&]() { rescale_rows<DH>(acc_o, corr); };
    // P to 16 bits: the A register fragments of O += P V's k-steps (rows rl, rl + 8; keys
    // 16kk + 2qd.., 16kk + 8 + 2qd..).
    auto pack_p = [&]() { acc_to_a<elem_t, BLOCK_N>(p, s); };
    // P_j and the rescale factors for consumer 1, once it is done with the previous ones.
    auto publish_p = [&](int j) {
      if (j > 0) bar_sync(BAR_P_FREE, 256);  // MUTATION: P free wait
#pragma unroll
      for (int kk = 0; kk < BLOCK_N / 16; ++kk)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = 16 * kk + 8 * (e >> 1) + 2 * qd;
          *reinterpret_cast<unsigned*>(sP + (col / 64) * P_BOX +
                                       tile_offset(SWIZZLE_128B, rl + 8 * (e & 1), col % 64)) = p[kk][e];
        }
      if (qd == 0) s_scale[rl] = corr[0], s_scale[rl + 8] = corr[1];
      fence_proxy_async();  // MUTATION: P fence
      bar_arrive(BAR_P_FULL, 256);  // MUTATION: P full arrive
    };

    if (n_tiles > 0) mbar_wait(q_full, 0);
@ if C.overlap == 0 then
    // One tile at a time: S_j, its softmax, P_j published, P_j V_j, each GEMM waited for.
    for (int j = 0; j < n_tiles; ++j) {
      const int st = j % STAGES;
      mbar_wait(&full[st], parity(j));  // MUTATION: full wait
      issue_s(st);
      wgmma_wait<0>();  // MUTATION: S wait
      fence_operand(s);
      softmax(${VARLEN and "k0 + " or ""}j * BLOCK_N);
      rescale_o();
      pack_p();
      publish_p(j);
      issue_pv(st);
      wgmma_wait<0>();  // MUTATION: PV0 wait
      fence_operand(acc_o);
      mbar_arrive(&empty[st]);  // MUTATION: empty release 0
    }
@ else
    // FlashAttention-3's intra-warpgroup overlap: S_j = Q C_j^T and O += P_j-1 V_j-1 are in
    // flight together; the softmax of S_j runs while P_j-1 V_j-1 is still computing, and O
    // is rescaled once that is done.
    if (n_tiles > 0) {
      mbar_wait(&full[0], 0);
      issue_s(0);
      wgmma_wait<0>();
      fence_operand(s);
      softmax(${VARLEN and "k0" or "0"});  // O is 0: nothing to rescale
      pack_p();
      publish_p(0);
    }
    for (int j = 1; j < n_tiles; ++j) {
      const int st = j % STAGES, pst = (j - 1) % STAGES;
      mbar_wait(&full[st], parity(j));  // MUTATION: full wait
      issue_s(st);
      issue_pv(pst);
      wgmma_wait<1>();  // MUTATION: S wait
      fence_operand(s);
      softmax(${VARLEN and "k0 + " or ""}j * BLOCK_N);
      wgmma_wait<0>();  // MUTATION: PV0 wait
      fence_operand(acc_o);
      mbar_arrive(&empty[pst]);  // MUTATION: empty release 0
      rescale_o();
      pack_p();
      publish_p(j);
    }
    if (n_tiles > 0) {
      const int st = (n_tiles - 1) % STAGES;
      issue_pv(st);
      wgmma_wait<0>();
      fence_operand(acc_o);
      mbar_arrive(&empty[st]);
    }
@ end
    // The row sums for consumer 1, and LSE = (m + log2 l) ln 2.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l_i[r] += __shfl_xor_sync(mla::FULL_MASK, l_i[r], 1);
      l_i[r] += __shfl_xor_sync(mla::FULL_MASK, l_i[r], 2);
      l_row[r] = l_i[r];
    }
    if (qd == 0) s_l[rl] = l_row[0], s_l[rl + 8] = l_row[1];
    bar_arrive(BAR_L_READY, 256);  // MUTATION: l arrive
    if (qd == 0) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = m0 + rl + 8 * r;
        if (row < rows)
          lse[((size_t)b * H + row % H) * seqlen_q + row / H] =
              l_row[r] > 0.f ? (m_i[r] + log2f(l_row[r])) * mla::LN2 : mla::neg_inf();
      }
    }
  } else {
    const unsigned p_addr = smem_u32(sP);
    for (int j = 0; j < n_tiles; ++j) {
      const int st = j % STAGES;
      bar_sync(BAR_P_FULL, 256);  // MUTATION: P full wait
      // (consumer 0 waited for this tile before it signalled P, but this warpgroup reads the
      // tile through its own wgmma: it observes the TMA's completion itself; complete by now)
      mbar_wait(&full[st], parity(j));
      const float corr[2] = {s_scale[rl], s_scale[rl + 8]};
      rescale_rows<DH>(acc_o, corr);
      // O[:, DH : DC] += P V_j, P from shared memory (K-major, 128B-swizzled boxes).
      fence_operand(acc_o);
      wgmma_fence();  // MUTATION: PV1 fence
#pragma unroll
      for (int kk = 0; kk < BLOCK_N / 16; ++kk)
        wgmma_ss_t<DH, tag_t, 0, 1>(acc_o, make_desc_kstep(p_addr, BLOCK_M, 64, SWIZZLE_128B, kk), vdesc(st, kk), 1);
      wgmma_commit();
      wgmma_wait<0>();  // MUTATION: PV1 wait
      fence_operand(acc_o);
      if (j + 1 < n_tiles) bar_arrive(BAR_P_FREE, 256);  // MUTATION: P free arrive
      mbar_arrive(&empty[st]);  // MUTATION: empty release 1
    }
    bar_sync(BAR_L_READY, 256);  // MUTATION: l wait
    l_row[0] = s_l[rl], l_row[1] = s_l[rl + 8];
  }

  // O = acc / l straight from the registers: this warpgroup's DH columns.
  const float inv[2] = {l_row[0] > 0.f ? 1.f / l_row[0] : 0.f, l_row[1] > 0.f ? 1.f / l_row[1] : 0.f};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = m0 + rl + 8 * r;
    if (row < rows) {
      elem_t* const orow = o + ((size_t)b * rows + row) * DC + wg * DH;
#pragma unroll
      for (int n = 0; n < DH / 8; ++n)
        *reinterpret_cast<unsigned*>(orow + 8 * n + 2 * qd) =
            pack2(acc_o[4 * n + 2 * r] * inv[r], acc_o[4 * n + 2 * r + 1] * inv[r]);
    }
  }
}
