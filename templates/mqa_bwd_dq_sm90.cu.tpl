@ -- mqa_bwd_dq_sm90: the absorbed-form (MQA over the latent) attention backward, the query
@ -- side, for Hopper (sm_90a): mqa_bwd_dq's semantics, parameters and layouts, plus `tmaps`
@ -- (the same three maps as mqa_bwd_dkv_sm90). The mirror of mqa_bwd_dkv_sm90: a CTA owns
@ -- 64 packed query rows r = i H + h of one batch item (Q and dO loaded once by TMA) and
@ -- walks the latent tiles C = [c_kv ; k_rope] of 64 keys they see (causal: up to its last
@ -- row's token) through a ring of `stages` stages, each tile used as K and as V. Not used
@ -- by the planner or the executors yet: rendered only on request
@ -- (`mlagen generate --family mqa_bwd_dq_sm90`).
@ -- Warpgroups (384 threads): 0 and 1 consumers, 2 the producer (one thread issues every
@ -- TMA load; setmaxnreg 24 / 240). Per key tile:
@ --   consumer 0: S = Q C^T (m64n64, K = d_c + d_r), P = exp2(S scale log2 e - LSE log2 e)
@ --               masked (per token), handed to consumer 1 in fp32   -- named barrier P --
@ --   consumer 1: dP = dO V^T (m64n64, K = d_c; V = C's first d_c columns), dS = scale P
@ --               (dP - delta) from the fp32 P; after all of its threads read P (named
@ --               barrier READ, 128 threads) it stores dS 16-bit over the same bytes
@ --               (K-major [row][key], 128B-swizzled: phase B's A operand), proxy-fenced;
@ --               both consumers sync                               -- named barrier DS --
@ --   phase B, both: dq's d_c + d_r columns in 64-wide chunks (the last ending at d_c + d_r:
@ --               with d_r 32 it recomputes 32 columns of the one before and discards them),
@ --               consumer 0 the first ceil(n / 2), consumer 1 the rest: dQ chunk += dS
@ --               C[:, chunk] (wgmma ss, B MN-major as TMA lands [key][d]); each releases the
@ --               ring stage, consumer 1 signals the P / dS bytes free (named barrier FREE).
@ -- dq is written once, 16-bit, from the registers: deterministic (one thread's fp32 sum over
@ -- the key tiles in order, no atomics). Registers: as mqa_bwd_dkv_sm90 (576: 9 chunks,
@ -- consumer 0 5 x 32 + 32 = 192 live fp32, consumer 1 4 x 32 + 32 = 160). LSE and delta:
@ -- two rows per thread, read once from global memory. Shared memory: Q 64 x (d_c + d_r) and
@ -- dO 64 x d_c once, C 64 x (d_c + d_r) per stage, P (fp32, 16 KiB; dS 16-bit over it):
@ -- 231424 bytes at 576/512 with one stage. Causal kernels take the row tiles in reverse
@ -- (longest first). The tensor maps are read only through tmap(i) (see mqa_bwd_dkv_sm90).
@ --
@ -- Packed sequences (spec.varlen, "_varlen": cu_seqlens, n_seqs last; batch 1): query i at
@ -- position q_pos0 + i sees keys [lo, hi) of its document. As mqa_fwd_sm90's: the latent
@ -- tiles cover [lo of the CTA's first query, hi of its last query with keys) and END at
@ -- that hi, so no slack latent row reaches shared memory; P outside a row's range and dS
@ -- where P is 0 are selected to 0 (a slack row's dO, LSE and delta may be NaN): dq = 0 for
@ -- a row without keys.
@ local H, DC, DR = spec.heads, spec.d_c, spec.d_r
@ local DQK = DC + DR
@ local ESIZE = elem_size(spec.dtype)
@ local SMEM_LIMIT = smem_limit("sm_90a")
@ local function box_w(d) return d % 64 == 0 and 64 or d % 32 == 0 and 32 or 16 end
@ local W = box_w(DQK)
@ local NCH = (DQK + 63) // 64
@ local NMAX = (NCH + 1) // 2
@ -- fp32 values live per consumer thread: consumer 0's chunks and S (192 at 576/512 compiles
@ -- with no spill, NVRTC sm_90a).
@ local ACC_LIMIT = 192
@ local function accumulators() return 32 * NMAX + 32 end
@ -- 2048: alignment slack and mbarriers; Q and dO (64 rows), the ring of C tiles, P fp32.
@ local function smem_bytes(c)
@   return 2048 + ESIZE * (64 * (DQK + DC) + c.stages * 64 * DQK) + 4 * 64 * 64
@ end
@
@ local K = kernel {
@   family = "mqa_bwd_dq_sm90", pass = "bwd", causal = true, varlen = true, flops = { pair = 2 * spec.heads * ((spec.d_c + spec.d_r) * 2 + spec.d_c) },
@   doc = "absorbed-form MQA attention backward for sm_90a, the query side (TMA ring over the latent, mbarriers, wgmma, the d_c + d_r wide dq accumulator split over two consumer warpgroups): dq (deterministic)",
@   params = join_lists({
@     { name = "q",     type = "const elem_t*", shape = "[B, S_q, H, d_c + d_r]", doc = "absorbed queries [q_lat ; q_rope] (read through tmaps[0])" },
@     { name = "c",     type = "const elem_t*", shape = "[B, S_k, d_c + d_r]",    doc = "the latent head: keys [c_kv ; k_rope], values c_kv (read through tmaps[1])" },
@     { name = "dout",  type = "const elem_t*", shape = "[B, S_q, H, d_c]",       doc = "gradient of the latent output o_lat (read through tmaps[2])" },
@     { name = "lse",   type = "const float*",  shape = "[B, H, S_q]",            doc = "the forward's natural-log LSE" },
@     { name = "delta", type = "const float*",  shape = "[B, H, S_q]",            doc = "rowsum(dO * O) from attn_bwd_pre (d_v = d_c)" },
@     { name = "dq",    type = "elem_t*",       shape = "[B, S_q, H, d_c + d_r]", doc = "gradient of the absorbed queries; 0 for a row without keys" },
@     { name = "seqlen_q", type = "int", doc = "query tokens per batch item" },
@     { name = "seqlen_k", type = "int", doc = "key tokens per batch item" },
@     { name = "q_pos0",   type = "int", doc = "global position of query 0; causal keeps key j for query i iff j <= q_pos0 + i" },
@     { name = "softmax_scale", type = "float", doc = "mscale^2 / sqrt(d_qk of the explicit form)" },
@     { name = "tmaps", type = "const __grid_constant__ mla::sm90::TensorMaps<3>", shape = "[3]",
@       doc = "3 CUtensorMaps passed by value (kernel parameter space, as mqa_bwd_dkv_sm90's; runtime/exec/mg_sm90_tmap.h: mg_sm90_mqa_bwd_tmaps): [0] q dims {d_c + d_r, S_q*H, B} box {W, 64, 1}; [1] c dims {d_c + d_r, S_k, B} box {W, 64, 1}; [2] dout dims {d_c, S_q*H, B} box {W, 64, 1}; W = 64/32/16 for d_c + d_r % 64/32/16 = 0, swizzle 128B/64B/32B, 16-bit, zero OOB fill" },
@   }, varlen_params()),
@   tunables = {
@     stages = { values = { 1, 2, 3 }, doc = "latent tiles in the TMA ring" },
@   },
@   check = function(s, c)
@     if DC % 64 ~= 0 or DR % 16 ~= 0 or DC < 64 or DR < 16 then
@       return "d_c must be a multiple of 64 and d_r a positive multiple of 16 (64-column accumulator chunks, the wgmma k step)"
@     end
@     if accumulators() > ACC_LIMIT then
@       return string.format("32 ceil(ceil((d_c + d_r)/64) / 2) + 32 = %d fp32 accumulators per consumer thread, over %d (registers would spill)",
@                            accumulators(), ACC_LIMIT)
@     end
@     if smem_bytes(c) > SMEM_LIMIT then
@       return string.format("needs %d bytes of shared memory, over the %d-byte limit", smem_bytes(c), SMEM_LIMIT)
@     end
@   end,
@   default = function(s)
@     for _, st in ipairs({ 3, 2 }) do
@       if smem_bytes({ stages = st }) <= SMEM_LIMIT then return { stages = st } end
@     end
@     return { stages = 1 }
@   end,
@   name = function(s, c)
@     return string.format("mla_mqa_bwd_dq_sm90_h%d_dc%d_dr%d_%s_%s_st%d", H, DC, DR,
@                          s.dtype, s.causal and "causal" or "full", c.stages)
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
@ local TAG = spec.dtype == "bf16" and "mla::sm90::bf16_t" or "mla::sm90::f16_t"
@ local PACK2 = spec.dtype == "bf16" and "__floats2bfloat162_rn" or "__floats2half2_rn"
// Generated by mlagen from templates/mqa_bwd_dq_sm90.cu.tpl: do not edit.
// Absorbed-form MLA attention backward, the query side (dq, deterministic), for sm_90a (TMA +
// mbarrier ring over the latent, wgmma, the accumulator split over two consumer warpgroups),
// H=${H} d_c=${DC} d_r=${DR}, ${spec.dtype}, ${spec.causal and "causal" or "non-causal"}.
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
constexpr int BLOCK_M = 64;  // packed query rows per CTA (one wgmma M)
constexpr int BLOCK_N = 64;  // keys per latent tile
constexpr int STAGES = ${C.stages};
constexpr bool VARLEN = ${VARLEN and "true" or "false"};  // packed sequences (cu_seqlens)
constexpr int NUM_THREADS = 384;  // consumers 0, 1; producer 2
constexpr int W = ${W};           // columns per TMA box
constexpr int SW = W == 64 ? SWIZZLE_128B : W == 32 ? SWIZZLE_64B : SWIZZLE_32B;
constexpr int NCH = (DQK + 63) / 64;  // 64-column chunks of dq
constexpr int NMAX = (NCH + 1) / 2;   // chunks of consumer 0 (consumer 1: NCH - NMAX)
// Named barriers (256 threads: both consumers; READ: consumer 1 alone).
constexpr unsigned BAR_P = 1;     // P (fp32) is in shared memory
constexpr unsigned BAR_DS = 2;    // dS is in shared memory
constexpr unsigned BAR_FREE = 3;  // consumer 1 is done with dS
constexpr unsigned BAR_READ = 4;  // all of consumer 0's fp32 P read
// Shared memory (offsets from a 1024-aligned base): mbarriers, Q, dO, the ring, P / dS.
constexpr unsigned Q_BYTES = BLOCK_M * DQK * 2;
constexpr unsigned O_BYTES = BLOCK_M * DC * 2;
constexpr unsigned STAGE_BYTES = BLOCK_N * DQK * 2;
constexpr unsigned OFF_Q = 1024;
constexpr unsigned OFF_O = OFF_Q + Q_BYTES;
constexpr unsigned OFF_RING = OFF_O + O_BYTES;
constexpr unsigned OFF_P = OFF_RING + STAGES * STAGE_BYTES;
static_assert(DC % 64 == 0 && DR % 16 == 0 && DQK % W == 0, "head dims");
static_assert(Q_BYTES % 1024 == 0 && O_BYTES % 1024 == 0 && STAGE_BYTES % 1024 == 0, "swizzle alignment");
static_assert(8 * 2 * STAGES <= OFF_Q, "barrier area");

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
// First column of chunk ch: 64 apart, the last ending at DQK.
__device__ __forceinline__ int chunk_col(int ch) { return min(64 * ch, DQK - 64); }
}  // namespace

extern "C" __global__ void __launch_bounds__(NUM_THREADS, 1)
${K.name}(
    ${param_list(K.params)}) {
  // The tensor maps, the one place that knows how they are passed.
  auto tmap = [&](int i) { return &tmaps.m[i]; };
  extern __shared__ __align__(1024) unsigned char smem[];
  const unsigned raw_addr = smem_u32(smem);
  unsigned char* const sbase = smem + (((raw_addr + 1023u) & ~1023u) - raw_addr);
  unsigned long long* const full = reinterpret_cast<unsigned long long*>(sbase);  // [STAGES]: latent tile (and Q, dO) landed
  unsigned long long* const empty = full + STAGES;  // [STAGES]: both consumers done with it
  unsigned char* const sQ = sbase + OFF_Q;
  unsigned char* const sO = sbase + OFF_O;
  unsigned char* const ring = sbase + OFF_RING;
  unsigned char* const sP = sbase + OFF_P;

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int nrows = seqlen_q * H;  // packed query rows of a batch item
  // Causal: the row tiles in reverse, the CTAs with the most key tiles first.
  const int m0 = (CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * BLOCK_M;
  const int b = blockIdx.z;
  // Keys this CTA sees: with causal masking, none past its last row's token.
  const int q_last = (min(m0 + BLOCK_M, nrows) - 1) / H;
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
    for (int j = 0; j < n_tiles; ++j) {
      const int st = j % STAGES;
      const unsigned ph = (unsigned)(j / STAGES) & 1u;
      mbar_wait(&empty[st], ph ^ 1u);  // MUTATION: empty wait
      unsigned char* const sC = ring + st * STAGE_BYTES;
      // Q and dO land with the first latent tile (one barrier for the consumers to wait on).
      mbar_arrive_expect_tx(&full[st], STAGE_BYTES + (j == 0 ? Q_BYTES + O_BYTES : 0));
      if (j == 0) {
        const int row = m0;  // packed row of batch item b
        for (int c = 0; c < DQK / W; ++c) tma_load_3d(sQ + c * BLOCK_M * 2 * W, tmap(0), &full[0], c * W, row, b);
        for (int c = 0; c < DC / W; ++c) tma_load_3d(sO + c * BLOCK_M * 2 * W, tmap(2), &full[0], c * W, row, b);
      }
      for (int c = 0; c < DQK / W; ++c)
        tma_load_3d(sC + c * BLOCK_N * 2 * W, tmap(1), &full[st], c * W, ${VARLEN and "k0 + " or ""}j * BLOCK_N, b);
    }
    return;
  }

  // ---- consumer warpgroup wg ----------------------------------------------------------------
  setmaxnreg_inc<240>();
  const int t = tid % 128;
  const int qd = t % 4;                         // fragment column pair
  const int rl = 16 * (t / 32) + (t % 32) / 4;  // this thread's rows of the tile: rl, rl + 8
  const unsigned q_addr = smem_u32(sQ), o_addr = smem_u32(sO), ring_addr = smem_u32(ring);
  const unsigned ds_addr = smem_u32(sP);
  float* const sPf = reinterpret_cast<float*>(sP);  // [32][128]: consumer 0's fp32 P fragments
  // Byte offset of fragment element i's pair (i even) in the [row][key] dS box.
  auto frag_off = [&](int i) { return tile_offset(SWIZZLE_128B, rl + 8 * ((i % 4) / 2), 8 * (i / 4) + 2 * qd); };
  // The MN-major B operand (keys as K, 64 columns as N) of k-step kk of the latent tile at
  // base (W-column boxes of 64 keys), from column col (a multiple of W).
  auto mndesc = [&](unsigned base, int col, int kk) {
    return make_desc_mn_kstep(SW, base + (col / W) * BLOCK_N * 2 * W, BLOCK_N, kk);
  };

  // The consumer's code, rendered once per warpgroup (its chunk count is a compile-time
  // array size). MUTATION comments name the warpgroup.
@ for ci, cw in ipairs({ { 0, NMAX }, { NMAX, NCH - NMAX } }) do
@   local WGN = ci - 1
  if (wg == ${WGN}) {
    constexpr int FIRST = ${cw[1]}, NC = ${cw[2]};
    float acc[NC][32];
#pragma unroll
    for (int c = 0; c < NC; ++c)
#pragma unroll
      for (int i = 0; i < 32; ++i) acc[c][i] = 0.f;
@   if WGN == 0 then
    // LSE (base 2; +inf past the last row: P = 0) of this thread's rows rl, rl + 8.
    float lrow[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = m0 + rl + 8 * r;
      lrow[r] = row < nrows ? mla::lse_log2(lse[((size_t)b * H + row % H) * seqlen_q + row / H]) : mla::pos_inf();
    }
    const float scale_log2 = softmax_scale * mla::LOG2E;
@     if VARLEN then
    // The keys [row_lo[r], row_hi[r]) of this thread's rows rl, rl + 8.
    int row_lo[2], row_hi[2];
    vl.keys<CAUSAL>(q_pos0 + (m0 + rl) / H, seqlen_k, row_lo[0], row_hi[0]);
    vl.keys<CAUSAL>(q_pos0 + (m0 + rl + 8) / H, seqlen_k, row_lo[1], row_hi[1]);
@     end
@   else
    float drow[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = m0 + rl + 8 * r;
      drow[r] = row < nrows ? delta[((size_t)b * H + row % H) * seqlen_q + row / H] : 0.f;
    }
@   end

    for (int j = 0; j < n_tiles; ++j) {
      const int st = j % STAGES;
      const int n0 = ${VARLEN and "k0 + " or ""}j * BLOCK_N;
      const unsigned c_addr = ring_addr + st * STAGE_BYTES;
      mbar_wait(&full[st], (unsigned)(j / STAGES) & 1u);  // MUTATION: full wait ${WGN}
      float s[32];  // consumer 0: S, then P; consumer 1: dP, then dS
@   if WGN == 0 then
      // S = Q C^T over all d_c + d_r columns.
      fence_operand(s);
      wgmma_fence();  // MUTATION: S fence
#pragma unroll
      for (int ks = 0; ks < DQK / 16; ++ks)
        wgmma_ss<64, tag_t>(s, kdesc(q_addr, BLOCK_M, W, SW, ks), kdesc(c_addr, BLOCK_N, W, SW, ks), ks > 0);
      wgmma_commit();
      wgmma_wait<0>();  // MUTATION: S wait
      fence_operand(s);
      // P: rows m0 + rl (+8), columns keys n0 + 8 (i / 4) + 2 qd + i % 2.
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int row = m0 + rl + 8 * ((i % 4) / 2);
        const int key = n0 + 8 * (i / 4) + 2 * qd + (i % 2);
@     if VARLEN then
        (void)row;
        const bool hidden = key < row_lo[(i % 4) / 2] || key >= row_hi[(i % 4) / 2];
@     else
        const bool hidden = key >= seqlen_k || row >= nrows || (CAUSAL && key > q_pos0 + row / H);
@     end
        s[i] = hidden ? 0.f : exp2f(s[i] * scale_log2 - lrow[(i % 4) / 2]);
      }
      // P in fp32 for consumer 1, once it is done with the last tile's dS (the same bytes).
      if (j > 0) bar_sync(BAR_FREE, 256);  // MUTATION: free wait
#pragma unroll
      for (int i = 0; i < 32; ++i) sPf[i * 128 + t] = s[i];
      bar_arrive(BAR_P, 256);  // MUTATION: P arrive
      bar_sync(BAR_DS, 256);  // MUTATION: DS sync 0
@   else
      // dP = dO V^T, V = C's first d_c columns.
      fence_operand(s);
      wgmma_fence();  // MUTATION: dP fence
#pragma unroll
      for (int ks = 0; ks < DC / 16; ++ks)
        wgmma_ss<64, tag_t>(s, kdesc(o_addr, BLOCK_M, W, SW, ks), kdesc(c_addr, BLOCK_N, W, SW, ks), ks > 0);
      wgmma_commit();
      wgmma_wait<0>();  // MUTATION: dP wait
      fence_operand(s);
      bar_sync(BAR_P, 256);  // MUTATION: P wait
      // dS = scale P (dP - delta) with consumer 0's fp32 P.
#pragma unroll
@     if VARLEN then
      for (int i = 0; i < 32; ++i) {
        const float p = sPf[i * 128 + t];
        s[i] = p != 0.f ? softmax_scale * p * (s[i] - drow[(i % 4) / 2]) : 0.f;
      }
@     else
      for (int i = 0; i < 32; ++i) s[i] = softmax_scale * sPf[i * 128 + t] * (s[i] - drow[(i % 4) / 2]);
@     end
      bar_sync(BAR_READ, 128);  // MUTATION: read wait (all of the fp32 P read before it is overwritten)
#pragma unroll
      for (int i = 0; i < 32; i += 2) *reinterpret_cast<unsigned*>(sP + frag_off(i)) = pack2(s[i], s[i + 1]);
      fence_proxy_async();  // MUTATION: DS fence
      // Both consumers wait here: consumer 1's own wgmma reads every thread's stores too.
      bar_sync(BAR_DS, 256);  // MUTATION: DS sync 1
@   end
      // Phase B: this warpgroup's chunks += dS C[:, chunk].
#pragma unroll
      for (int c = 0; c < NC; ++c) fence_operand(acc[c]);
      wgmma_fence();  // MUTATION: B fence ${WGN}
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        const int col = chunk_col(FIRST + c);
#pragma unroll
        for (int kk = 0; kk < BLOCK_N / 16; ++kk)
          wgmma_ss_t<64, tag_t, 0, 1>(acc[c], kdesc(ds_addr, BLOCK_M, 64, SWIZZLE_128B, kk), mndesc(c_addr, col, kk), 1);
      }
      wgmma_commit();
      wgmma_wait<0>();  // MUTATION: B wait ${WGN}
#pragma unroll
      for (int c = 0; c < NC; ++c) fence_operand(acc[c]);
@   if WGN == 1 then
      if (j + 1 < n_tiles) bar_arrive(BAR_FREE, 256);  // MUTATION: free arrive
@   end
      mbar_arrive(&empty[st]);  // MUTATION: empty release ${WGN}
    }

    // dq = the accumulators (scale is in dS): chunk ch's columns from 64 ch on (the last
    // chunk overlapping the one before leaves those columns to it).
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int ch = FIRST + c, col0 = chunk_col(ch);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = m0 + rl + 8 * r;
        if (row < nrows) {
          elem_t* const dst = dq + ((size_t)b * nrows + row) * DQK + col0 + 2 * qd;
#pragma unroll
          for (int n = 0; n < 8; ++n)
            if (col0 + 8 * n >= 64 * ch)
              *reinterpret_cast<unsigned*>(dst + 8 * n) = pack2(acc[c][4 * n + 2 * r], acc[c][4 * n + 2 * r + 1]);
        }
      }
    }
  }
@ end
}
