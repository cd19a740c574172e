@ -- mqa_bwd_dkv_sm90: the absorbed-form (MQA over the latent) attention backward, the key
@ -- side, for Hopper (sm_90a): mqa_bwd_dkv's semantics, parameters and layouts (deterministic,
@ -- no qsplit), plus `tmaps`. TMA ring on mbarriers, wgmma, a producer warpgroup, the
@ -- d_c + d_r wide accumulator split over two consumer warpgroups. Not used by the planner or
@ -- the executors yet (their plans run mqa_bwd_dkv): rendered only on request
@ -- (`mlagen generate --family mqa_bwd_dkv_sm90`).
@ --
@ -- A CTA owns the latent tile C = [c_kv ; k_rope] of 64 keys n0 .. n0 + 63 of one batch
@ -- item (one wgmma M), loaded once by TMA, and walks the packed query rows r = i H + h (q[b]
@ -- as a [S_q H, d_c + d_r] matrix, dO[b] as [S_q H, d_c]) that see one of its keys (causal:
@ -- per token, from row (n0 - q_pos0) H), 64 rows per tile through a ring of `stages` stages
@ -- (Q and dO of the tile, one mbarrier each way; C lands on the first tile's). Warpgroups (384 threads): 0 and 1
@ -- consumers, 2 the producer (one thread issues every TMA load; setmaxnreg 24 / 240).
@ -- Per query tile:
@ --   consumer 0: S^T = C Q^T (m64n64, K = d_c + d_r, both operands K-major from shared
@ --               memory), P^T = exp2(S^T scale log2 e - LSE log2 e) masked (per token),
@ --               handed to consumer 1 in fp32 through shared memory    -- named barrier P --
@ --   consumer 1: dP^T = V dO^T (m64n64, K = d_c; V = C's first d_c columns), then
@ --               dS^T = scale P^T (dP^T - delta) from the fp32 P^T (as mqa_bwd_dkv: P is
@ --               rounded to 16 bits only as an MMA operand); once all of its threads have
@ --               read the fp32 P^T (named barrier READ, 128 threads) it stores P^T and dS^T
@ --               16-bit over the same bytes (K-major [key][row] boxes, 128B-swizzled: the A
@ --               operands of phase B), proxy-fenced                 -- named barrier DS --
@ --               (both consumers sync on DS: consumer 1's own wgmma reads every thread's
@ --               stores too)
@ --   phase B, both: the output columns are cut into 64-wide chunks, d_c / 64 of dC and
@ --               ceil(d_r / 64) of dK_rope (the last one ending at d_c + d_r: with d_r 32 it
@ --               overlaps dC's last 32 columns, which it computes and discards); consumer 0
@ --               owns the first ceil(n / 2) chunks, consumer 1 the rest:
@ --                 dC chunk      += P^T dO[:, chunk] + dS^T Q[:, chunk]   (wgmma ss, B MN-major)
@ --                 dK_rope chunk += dS^T Q[:, chunk]
@ --               then each releases the ring stage; consumer 1 also signals the P^T / dS^T
@ --               bytes free (named barrier FREE) for consumer 0's next fp32 P^T.
@ -- dc = [dK_lat + dV ; dK_rope] is the sum of both products in one accumulator, written once,
@ -- 16-bit, from the registers: every element is one thread's fp32 sum over the query tiles
@ -- in order, so the bits do not depend on the schedule (deterministic, no atomics).
@ -- Registers (the crux: a 64-key tile's dC is 64 x 576 fp32, 288 per thread of one
@ -- warpgroup): each consumer holds 32 fp32 per chunk per thread, plus phase A's S^T or dP^T
@ -- (32) and, in consumer 1, P^T's 16-bit pairs (16). 576/512 has n = 8 + 1 = 9 chunks:
@ -- consumer 0 5 x 32 + 32 = 192, consumer 1 4 x 32 + 32 + 16 = 176 live values under the
@ -- 240 registers setmaxnreg gives (288/256: n = 4 + 1, 3 x 32 + 32 = 128). ptxas: 0 spill.
@ -- Shared memory: C 64 x 576 x 2 = 72 KiB + Q and dO per stage 64 x 1088 x 2 = 136 KiB +
@ -- P^T / dS^T 16 KiB (the fp32 P^T shares them) + 2 KiB = 231424 bytes of 232448 at 576/512:
@ -- one stage only (the next query tile loads after both consumers released the stage);
@ -- 288/256 fits two. LSE and delta are read from global memory (L2) by the consumer threads
@ -- at the fragment columns they need (the [B, H, S_q] layout is strided in the packed rows:
@ -- no TMA box covers a tile of them for every H).
@ -- The tensor maps are `tmaps`, passed by value as a __grid_constant__ TensorMaps<3> (kernel
@ -- parameter space, as mqa_fwd_sm90's); the kernel reads them only through tmap(i).
@ --
@ -- Packed sequences (spec.varlen, "_varlen": cu_seqlens, n_seqs last; batch 1): the query
@ -- tiles cover the packed rows of the queries whose positions see one of the tile's keys
@ -- (the first key's Varlen::queries lo to the last non-slack key's hi) and END at the last
@ -- of them, so no slack query row (Q, dO, LSE, delta: NaN allowed) is read; earlier rows are
@ -- earlier queries or, at negative rows, TMA's zero fill (their LSE and delta not read).
@ -- Consumer 0 selects P^T to 0 outside each key's query rows (kept in shared memory: in
@ -- registers they spill at 576/512), so a key no query sees gets dc = 0. The tile's own
@ -- slack keys may hold NaN in C: their dP^T and dS^T rows may be NaN, which reach only
@ -- their own dc rows (dC += P^T dO + dS^T Q sums over rows, per key), written 0.
@ local H, DC, DR = spec.heads, spec.d_c, spec.d_r
@ local DQK = DC + DR
@ local ESIZE = elem_size(spec.dtype)
@ local SMEM_LIMIT = smem_limit("sm_90a")
@ -- Columns per TMA box (and per K-major swizzle atom): the widest of 64/32/16 dividing d_qk.
@ local function box_w(d) return d % 64 == 0 and 64 or d % 32 == 0 and 32 or 16 end
@ local W = box_w(DQK)
@ local NCC, NCR = DC // 64, (DR + 63) // 64
@ local NCH = NCC + NCR
@ local NMAX = (NCH + 1) // 2
@ -- fp32 values live per consumer thread: consumer 0's chunks and S^T (consumer 1 holds one
@ -- chunk fewer and 16 more). 192 (576/512) compiles with no spill (NVRTC, sm_90a).
@ local ACC_LIMIT = 192
@ local function accumulators() return 32 * NMAX + 32 end
@ -- 2048: the 1024-byte alignment slack and the mbarriers; then C (64 keys), the ring (Q and
@ -- dO of 64 rows per stage), P^T and dS^T (64 x 64 each).
@ local function smem_bytes(c)
@   return 2048 + ESIZE * (64 * DQK + c.stages * 64 * (DQK + DC) + 2 * 64 * 64)
@ end
@
@ local K = kernel {
@   family = "mqa_bwd_dkv_sm90", pass = "bwd", causal = true, varlen = true, flops = { pair = 4 * spec.heads * ((spec.d_c + spec.d_r) + spec.d_c) },
@   doc = "absorbed-form MQA attention backward for sm_90a (TMA ring, mbarriers, wgmma, the d_c + d_r wide accumulator split over two consumer warpgroups): dc = [dc_kv ; dk_rope] of the shared latent head, summed over heads (deterministic)",
@   params = join_lists({
@     { name = "q",     type = "const elem_t*", shape = "[B, S_q, H, d_c + d_r]", doc = "absorbed queries [q_lat ; q_rope] (read through tmaps[0])" },
@     { name = "c",     type = "const elem_t*", shape = "[B, S_k, d_c + d_r]",    doc = "the latent head: keys [c_kv ; k_rope], values c_kv (the first d_c columns; read through tmaps[1])" },
@     { name = "dout",  type = "const elem_t*", shape = "[B, S_q, H, d_c]",       doc = "gradient of the latent output o_lat (read through tmaps[2])" },
@     { name = "lse",   type = "const float*",  shape = "[B, H, S_q]",            doc = "the forward's natural-log LSE" },
@     { name = "delta", type = "const float*",  shape = "[B, H, S_q]",            doc = "rowsum(dO * O) from attn_bwd_pre (d_v = d_c)" },
@     { name = "dc",    type = "elem_t*",       shape = "[B, S_k, d_c + d_r]",    doc = "gradient of c: [dc_kv (as key and value) ; dk_rope], summed over heads" },
@     { name = "seqlen_q", type = "int", doc = "query tokens per batch item" },
@     { name = "seqlen_k", type = "int", doc = "key tokens per batch item" },
@     { name = "q_pos0",   type = "int", doc = "global position of query 0; causal keeps key j for query i iff j <= q_pos0 + i" },
@     { name = "softmax_scale", type = "float", doc = "mscale^2 / sqrt(d_qk of the explicit form)" },
@     { name = "tmaps", type = "const __grid_constant__ mla::sm90::TensorMaps<3>", shape = "[3]",
@       doc = "3 CUtensorMaps passed by value (kernel parameter space; the host passes 3 contiguous 64-byte aligned CUtensorMaps, runtime/exec/mg_sm90_tmap.h: mg_sm90_mqa_bwd_tmaps), made with cuTensorMapEncodeTiled (16-bit elements, no interleave, zero OOB fill), box inner width W = 64/32/16 columns for d_c + d_r % 64/32/16 = 0 with swizzle 128B/64B/32B: " ..
@             "[0] q dims {d_c + d_r, S_q*H, B} box {W, 64, 1}; [1] c dims {d_c + d_r, S_k, B} box {W, 64, 1}; [2] dout dims {d_c, S_q*H, B} box {W, 64, 1}" },
@   }, varlen_params()),
@   tunables = {
@     stages = { values = { 1, 2 }, doc = "query tiles (Q and dO) in the TMA ring" },
@   },
@   check = function(s, c)
@     if DC % 64 ~= 0 or DR % 16 ~= 0 or DC < 64 or DR < 16 then
@       return "d_c must be a multiple of 64 and d_r a positive multiple of 16 (64-column accumulator chunks, the wgmma k step)"
@     end
@     if accumulators() > ACC_LIMIT then
@       return string.format("32 ceil((d_c/64 + ceil(d_r/64)) / 2) + 32 = %d fp32 accumulators per consumer thread, over %d (registers would spill)",
@                            accumulators(), ACC_LIMIT)
@     end
@     if smem_bytes(c) > SMEM_LIMIT then
@       return string.format("needs %d bytes of shared memory, over the %d-byte limit", smem_bytes(c), SMEM_LIMIT)
@     end
@   end,
@   default = function(s)
@     if smem_bytes({ stages = 2 }) <= SMEM_LIMIT then return { stages = 2 } end
@     return { stages = 1 }
@   end,
@   name = function(s, c)
@     return string.format("mla_mqa_bwd_dkv_sm90_h%d_dc%d_dr%d_%s_%s_st%d", H, DC, DR,
@                          s.dtype, s.causal and "causal" or "full", c.stages)
@   end,
@   launch = function(s, c)
@     return {
@       grid = { { arg = "seqlen_k", div = 64 }, { value = 1 }, { arg = "batch" } },
@       block = { 384, 1, 1 },
@       smem = smem_bytes(c),   -- dynamic; over 48 KiB needs cudaFuncAttributeMaxDynamicSharedMemorySize
@       smem_static = 0,
@     }
@   end,
@ }
@ local C = K.config
@ local VARLEN = spec.varlen
@ local TAG = spec.dtype == "bf16" and "mla::sm90::bf16_t" or "mla::sm90::f16_t"
@ local PACK2 = spec.dtype == "bf16" and "__floats2bfloat162_rn" or "__floats2half2_rn"
// Generated by mlagen from templates/mqa_bwd_dkv_sm90.cu.tpl: do not edit.
// Absorbed-form MLA attention backward, the key side (dc = [dc_kv ; dk_rope], deterministic),
// for sm_90a (TMA + mbarrier ring, wgmma, the accumulator split over two consumer
// warpgroups), H=${H} d_c=${DC} d_r=${DR}, ${spec.dtype}, ${spec.causal and "causal" or "non-causal"}.
// Dynamic shared memory: ${smem_bytes(C)} bytes.
#include "mla_device_sm90.cuh"

namespace {
using namespace mla::sm90;
typedef ${elem_type(spec.dtype)} elem_t;
typedef ${elem_type(spec.dtype)}2 elem2_t;
typedef ${TAG} tag_t;
constexpr int H = ${H};
constexpr int DC = ${DC};
constexpr int DR = ${DR};
constexpr int DQK = DC + DR;
constexpr bool CAUSAL = ${spec.causal and "true" or "false"};
constexpr int BLOCK_N = 64;  // keys per CTA (one wgmma M)
constexpr int BLOCK_M = 64;  // packed query rows per tile
constexpr int STAGES = ${C.stages};
constexpr bool VARLEN = ${VARLEN and "true" or "false"};  // packed sequences (cu_seqlens)
constexpr int NUM_THREADS = 384;  // consumers 0, 1; producer 2
constexpr int W = ${W};           // columns per TMA box
constexpr int SW = W == 64 ? SWIZZLE_128B : W == 32 ? SWIZZLE_64B : SWIZZLE_32B;
constexpr int NCC = DC / 64;        // 64-column chunks of dC
constexpr int NCH = NCC + ${NCR};   // and of dK_rope
constexpr int NMAX = (NCH + 1) / 2; // chunks of consumer 0 (consumer 1: NCH - NMAX)
// Named barriers (256 threads: both consumers).
constexpr unsigned BAR_P = 1;     // P^T is in shared memory
constexpr unsigned BAR_DS = 2;    // dS^T is in shared memory
constexpr unsigned BAR_FREE = 3;  // consumer 1 is done with P^T and dS^T
// (128 threads: consumer 1 alone)
constexpr unsigned BAR_READ = 4;  // all of consumer 0's fp32 P^T read
// Shared memory (offsets from a 1024-aligned base): mbarriers, C, the ring (Q then dO per
// stage), P^T, dS^T (each [64 keys][64 rows], one 128B-swizzled box).
constexpr unsigned C_BYTES = BLOCK_N * DQK * 2;
constexpr unsigned Q_BYTES = BLOCK_M * DQK * 2;
constexpr unsigned STAGE_BYTES = BLOCK_M * (DQK + DC) * 2;
constexpr unsigned P_BYTES = BLOCK_N * BLOCK_M * 2;
constexpr unsigned OFF_C = 1024;  // (VARLEN: key ranges at 512 .. 1023)
static_assert(2 * STAGES * 8 <= 512, "mbarriers below the key ranges");
constexpr unsigned OFF_RING = OFF_C + C_BYTES;
constexpr unsigned OFF_P = OFF_RING + STAGES * STAGE_BYTES;
constexpr unsigned OFF_DS = OFF_P + P_BYTES;
static_assert(DC % 64 == 0 && DR % 16 == 0 && DQK % W == 0, "head dims");
static_assert(C_BYTES % 1024 == 0 && Q_BYTES % 1024 == 0 && STAGE_BYTES % 1024 == 0, "swizzle alignment");
static_assert(8 * 2 * STAGES <= OFF_C, "barrier area");

__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  elem2_t v = ${PACK2}(lo, hi);
  return *reinterpret_cast<unsigned*>(&v);
}

// K-major descriptor of k-step ks (16 columns) of a tile made of w-column TMA boxes of
// `rows` rows at shared address base: box ks*16 / w, column ks*16 % w within it (the header's
// make_desc_kstep, checked against CuTe by tests/test_hopper_layout.cpp).
__device__ __forceinline__ unsigned long long kdesc(unsigned base, unsigned rows, int w, int swz,
                                                    int ks) {
  return make_desc_kstep(base, rows, w, swz, ks);
}
// First column of chunk ch: dC chunks 64 apart, then dK_rope's, the last ending at DQK.
__device__ __forceinline__ int chunk_col(int ch) { return ch < NCC ? 64 * ch : min(64 * ch, DQK - 64); }
}  // namespace

extern "C" __global__ void __launch_bounds__(NUM_THREADS, 1)
${K.name}(
    ${param_list(K.params)}) {
  // The tensor maps, the one place that knows how they are passed.
  auto tmap = [&](int i) { return &tmaps.m[i]; };
  extern __shared__ __align__(1024) unsigned char smem[];
  const unsigned raw_addr = smem_u32(smem);
  unsigned char* const sbase = smem + (((raw_addr + 1023u) & ~1023u) - raw_addr);
  unsigned long long* const full = reinterpret_cast<unsigned long long*>(sbase);  // [STAGES]: query tile (and C) landed
  unsigned long long* const empty = full + STAGES;  // [STAGES]: both consumers done with it
  unsigned char* const sC = sbase + OFF_C;
  unsigned char* const ring = sbase + OFF_RING;
  unsigned char* const sP = sbase + OFF_P;
  unsigned char* const sDS = sbase + OFF_DS;

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int nrows = seqlen_q * H;  // packed query rows of a batch item
  const int n0 = blockIdx.x * BLOCK_N;
  const int b = blockIdx.z;
  // Query tiles with a row that sees a key of this tile: causal, from row (n0 - q_pos0) H.
@ if VARLEN then
  // Packed: the queries [i_lo, i_hi) whose positions see one of this tile's keys; their
  // packed rows in tiles that end at row i_hi H (tile j from row m_base + j BLOCK_M).
  const mla::Varlen vl{cu_seqlens, n_seqs};
  const mla::QueryPos qpos{q_pos0, 0, q_pos0};
  int i_lo, i_hi;
  varlen_keys_rows<CAUSAL>(vl, qpos, n0, min(n0 + BLOCK_N, seqlen_k) - 1, seqlen_q, i_lo, i_hi);
  const int n_iter = ((i_hi - i_lo) * H + BLOCK_M - 1) / BLOCK_M;
  const int m_base = i_hi * H - n_iter * BLOCK_M;
@ else
  const int m_first = CAUSAL ? max(0, n0 - q_pos0) * H / BLOCK_M : 0;
  const int m_tiles = (nrows + BLOCK_M - 1) / BLOCK_M;
  const int n_iter = max(0, m_tiles - m_first);
@ end
@ local M0 = VARLEN and "m_base + j * BLOCK_M" or "(m_first + j) * BLOCK_M"   -- query tile j's first row

  if (tid == 0) {
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
    for (int j = 0; j < n_iter; ++j) {
      const int st = j % STAGES;
      const unsigned ph = (unsigned)(j / STAGES) & 1u;
      mbar_wait(&empty[st], ph ^ 1u);  // MUTATION: empty wait
      unsigned char* const sQ = ring + st * STAGE_BYTES;
      const int row = ${M0};  // packed row of batch item b
      // The key tile C lands with the first query tile (one barrier for the consumers to
      // wait on: no wait of theirs that another's could stand in for).
      mbar_arrive_expect_tx(&full[st], STAGE_BYTES + (j == 0 ? C_BYTES : 0));
      if (j == 0)
        for (int c = 0; c < DQK / W; ++c)
          tma_load_3d(sC + c * BLOCK_N * 2 * W, tmap(1), &full[0], c * W, n0, b);
      for (int c = 0; c < DQK / W; ++c) tma_load_3d(sQ + c * BLOCK_M * 2 * W, tmap(0), &full[st], c * W, row, b);
      for (int c = 0; c < DC / W; ++c)
        tma_load_3d(sQ + Q_BYTES + c * BLOCK_M * 2 * W, tmap(2), &full[st], c * W, row, b);
    }
    return;
  }

  // ---- consumer warpgroup wg: its chunks FIRST .. FIRST + NC - 1 --------------------------
  setmaxnreg_inc<240>();
  const int t = tid % 128;
  const int qd = t % 4;                         // fragment column pair
  const int rl = 16 * (t / 32) + (t % 32) / 4;  // this thread's keys of the tile: rl, rl + 8
  const unsigned c_addr = smem_u32(sC), ring_addr = smem_u32(ring);
  const unsigned p_addr = smem_u32(sP), ds_addr = smem_u32(sDS);
  float* const sPf = reinterpret_cast<float*>(sP);  // [32][128]: consumer 0's fp32 P^T fragments
  // Byte offset of fragment element i's pair (i even) in the [key][row] P^T / dS^T box.
  auto frag_off = [&](int i) { return tile_offset(SWIZZLE_128B, rl + 8 * ((i % 4) / 2), 8 * (i / 4) + 2 * qd); };
  // The MN-major B operand (rows as K, 64 columns as N) of k-step kk of a tile of W-column
  // boxes of 64 rows at base, from column col (a multiple of W).
  auto mndesc = [&](unsigned base, int col, int kk) {
    return make_desc_mn_kstep(SW, base + (col / W) * BLOCK_M * 2 * W, BLOCK_M, kk);
  };

  // The consumer's code, rendered once per warpgroup (its chunk count is a compile-time
  // array size; NVRTC takes no generic lambda). MUTATION comments name the warpgroup.
@ for ci, cw in ipairs({ { 0, NMAX }, { NMAX, NCH - NMAX } }) do
@   local WGN = ci - 1
  if (wg == ${WGN}) {
    constexpr int FIRST = ${cw[1]}, NC = ${cw[2]};
    float acc[NC][32];
#pragma unroll
    for (int c = 0; c < NC; ++c)
#pragma unroll
      for (int i = 0; i < 32; ++i) acc[c][i] = 0.f;
@   if VARLEN and WGN == 0 then
    // The packed rows [key_lo[k], key_hi[k]) whose queries see key n0 + k (Varlen::queries'
    // positions as rows, clipped to [0, nrows)), in shared memory (the free end of the
    // mbarriers' KiB), each written by its quad's first lane, read by its own warp's lanes
    // through volatile loads where needed (held in registers through the loop, they spill at
    // 576/512).
    volatile int* const key_lo = reinterpret_cast<volatile int*>(sbase + 512);
    volatile int* const key_hi = key_lo + BLOCK_N;
    if (qd == 0)
      for (int r = 0; r < 2; ++r) {
        int lo, hi;
        vl.queries<CAUSAL>(n0 + rl + 8 * r, lo, hi);
        key_lo[rl + 8 * r] = min(max(lo - q_pos0, 0), seqlen_q) * H;
        key_hi[rl + 8 * r] = min(max(hi - q_pos0, 0), seqlen_q) * H;
      }
    __syncwarp();
@   end

    for (int j = 0; j < n_iter; ++j) {
      const int st = j % STAGES;
      const int m0 = ${M0};
      const unsigned q_addr = ring_addr + st * STAGE_BYTES, o_addr = q_addr + Q_BYTES;
      mbar_wait(&full[st], (unsigned)(j / STAGES) & 1u);  // MUTATION: full wait ${WGN}
      float s[32];  // consumer 0: S^T, then P^T; consumer 1: dP^T, then dS^T
@     if WGN == 0 then
        // S^T = C Q^T over all d_c + d_r columns.
        fence_operand(s);
        wgmma_fence();  // MUTATION: S fence
#pragma unroll
        for (int ks = 0; ks < DQK / 16; ++ks)
          wgmma_ss<64, tag_t>(s, kdesc(c_addr, BLOCK_N, W, SW, ks), kdesc(q_addr, BLOCK_M, W, SW, ks), ks > 0);
        wgmma_commit();
        wgmma_wait<0>();  // MUTATION: S wait
        fence_operand(s);
        // P^T: rows keys n0 + rl (+8), columns packed rows m0 + 8 (i / 4) + 2 qd + i % 2.
        const float scale_log2 = softmax_scale * mla::LOG2E;
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          const int key = n0 + rl + 8 * ((i % 4) / 2);
          const int row = m0 + 8 * (i / 4) + 2 * qd + (i % 2);
          float p = 0.f;
@     if VARLEN then
          // packed: the rows [key_lo, key_hi) of the key (nonnegative, below nrows)
          const int k = rl + 8 * ((i % 4) / 2);
          (void)key;
          if (row >= key_lo[k] && row < key_hi[k]) {
@     else
          if (key < seqlen_k && row < nrows && !(CAUSAL && key > q_pos0 + row / H)) {
@     end
            const float l = mla::lse_log2(lse[((size_t)b * H + row % H) * seqlen_q + row / H]);
            p = exp2f(s[i] * scale_log2 - l);
          }
          s[i] = p;
        }
        // P^T in fp32 for consumer 1 (which rounds it), once both are done with the last tile's
        // P^T and dS^T (the same bytes).
        if (j > 0) bar_sync(BAR_FREE, 256);  // MUTATION: free wait
#pragma unroll
        for (int i = 0; i < 32; ++i) sPf[i * 128 + t] = s[i];
        bar_arrive(BAR_P, 256);  // MUTATION: P arrive
        bar_sync(BAR_DS, 256);  // MUTATION: DS sync 0
@     else
        // dP^T = V dO^T, V = C's first d_c columns.
        fence_operand(s);
        wgmma_fence();  // MUTATION: dP fence
#pragma unroll
        for (int ks = 0; ks < DC / 16; ++ks)
          wgmma_ss<64, tag_t>(s, kdesc(c_addr, BLOCK_N, W, SW, ks), kdesc(o_addr, BLOCK_M, W, SW, ks), ks > 0);
        wgmma_commit();
        wgmma_wait<0>();  // MUTATION: dP wait
        fence_operand(s);
        bar_sync(BAR_P, 256);  // MUTATION: P wait
        // dS^T = scale P^T (dP^T - delta) with consumer 0's fp32 P^T; P^T kept 16-bit.
        unsigned p16[16];
#pragma unroll
        for (int i = 0; i < 32; i += 2) {
          const float p0 = sPf[i * 128 + t], p1 = sPf[(i + 1) * 128 + t];
          const int row = m0 + 8 * (i / 4) + 2 * qd;
@     if VARLEN then
          // (the tile's rows are below nrows and not slack; a negative row's P^T is 0: row 0's
          // delta stands in)
          const int ra = max(row, 0), rb = max(row + 1, 0);
          const float d0 = delta[((size_t)b * H + ra % H) * seqlen_q + ra / H];
          const float d1 = delta[((size_t)b * H + rb % H) * seqlen_q + rb / H];
          // (a slack key's dP^T row may be NaN: so is its dS^T row, which reaches only
          // that key's dc, written 0 below)
          s[i] = softmax_scale * p0 * (s[i] - d0);
          s[i + 1] = softmax_scale * p1 * (s[i + 1] - d1);
@     else
          const float d0 = row < nrows ? delta[((size_t)b * H + row % H) * seqlen_q + row / H] : 0.f;
          const float d1 = row + 1 < nrows ? delta[((size_t)b * H + (row + 1) % H) * seqlen_q + (row + 1) / H] : 0.f;
          s[i] = softmax_scale * p0 * (s[i] - d0);
          s[i + 1] = softmax_scale * p1 * (s[i + 1] - d1);
@     end
          p16[i / 2] = pack2(p0, p1);
        }
        bar_sync(BAR_READ, 128);  // MUTATION: read wait (all of the fp32 P^T read before it is overwritten)
#pragma unroll
        for (int i = 0; i < 32; i += 2) {
          *reinterpret_cast<unsigned*>(sP + frag_off(i)) = p16[i / 2];
          *reinterpret_cast<unsigned*>(sDS + frag_off(i)) = pack2(s[i], s[i + 1]);
        }
        fence_proxy_async();  // MUTATION: P fence
        // Both consumers wait here: consumer 1's wgmma below reads every thread's stores too.
        bar_sync(BAR_DS, 256);  // MUTATION: DS sync 1
@     end
      // Phase B: this warpgroup's chunks += P^T dO[:, chunk] (dC chunks) + dS^T Q[:, chunk].
#pragma unroll
      for (int c = 0; c < NC; ++c) fence_operand(acc[c]);
      wgmma_fence();  // MUTATION: B fence ${WGN}
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        constexpr int CH0 = FIRST;
        const int ch = CH0 + c, col = chunk_col(ch);
#pragma unroll
        for (int kk = 0; kk < BLOCK_M / 16; ++kk) {
          if (ch < NCC)
            wgmma_ss_t<64, tag_t, 0, 1>(acc[c], kdesc(p_addr, BLOCK_N, 64, SWIZZLE_128B, kk), mndesc(o_addr, col, kk), 1);
          wgmma_ss_t<64, tag_t, 0, 1>(acc[c], kdesc(ds_addr, BLOCK_N, 64, SWIZZLE_128B, kk), mndesc(q_addr, col, kk), 1);
        }
      }
      wgmma_commit();
      wgmma_wait<0>();  // MUTATION: B wait ${WGN}
#pragma unroll
      for (int c = 0; c < NC; ++c) fence_operand(acc[c]);
@     if WGN == 1 then
      if (j + 1 < n_iter) bar_arrive(BAR_FREE, 256);  // MUTATION: free arrive
@     end
      mbar_arrive(&empty[st]);  // MUTATION: empty release ${WGN}
    }

    // dc = the accumulators (scale is in dS^T): chunk ch's columns from its own first one on
    // (a dK_rope chunk overlapping dC's last columns leaves them to dC's chunk).
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int ch = FIRST + c, col0 = chunk_col(ch);
      const int cmin = ch < NCC ? col0 : DC + 64 * (ch - NCC);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int key = n0 + rl + 8 * r;
        if (key < seqlen_k) {
          elem_t* const dst = dc + ((size_t)b * seqlen_k + key) * DQK + col0 + 2 * qd;
@   if VARLEN then
          // a slack key: 0 (no query sees it; its NaN C rows made its dS^T row NaN)
          const bool slack = key >= cu_seqlens[n_seqs];
#pragma unroll
          for (int n = 0; n < 8; ++n)
            if (col0 + 8 * n >= cmin)
              *reinterpret_cast<unsigned*>(dst + 8 * n) = slack ? 0u : pack2(acc[c][4 * n + 2 * r], acc[c][4 * n + 2 * r + 1]);
@   else
#pragma unroll
          for (int n = 0; n < 8; ++n)
            if (col0 + 8 * n >= cmin)
              *reinterpret_cast<unsigned*>(dst + 8 * n) = pack2(acc[c][4 * n + 2 * r], acc[c][4 * n + 2 * r + 1]);
@   end
        }
      }
    }
  }
@ end
}
