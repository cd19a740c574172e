/* hopper_host.h: the host executor's Hopper (sm_90a) PTX entry points, called by the
 * wrappers in templates/mla_device_sm90.cuh; included by cuda_host.h, implemented in
 * hopper_host.cpp (compiled as part of cuda_host.cpp). See tests/host/README.md, "Hopper". */
#ifndef MG_HOPPER_HOST_H
#define MG_HOPPER_HOST_H

/* The .shared address of p: its offset in the dynamic shared-memory buffer (the only
 * shared memory the async proxy reaches here). Reported: p outside it. */
MG_HOST_HIDDEN unsigned mg_host_smem_u32(const void *p, int line);

/* mbarrier.init: expected arrival count `count` (1 .. 2^20 - 1), phase 0, tx-count 0. The
 * state lives in the barrier's 8 bytes of shared memory (an executor-private encoding). */
MG_HOST_HIDDEN void mg_host_mbar_init(unsigned long long *bar, unsigned count, int line);
/* mbarrier.arrive (tx 0) or arrive.expect_tx (tx-count += tx, then the arrival). Reported:
 * an uninitialized barrier, an arrival when no arrival is pending (over-arrival), a tx-count
 * out of [-(2^20-1), 2^20-1], a barrier whose init is not yet visible to the thread (no
 * __syncthreads or named barrier between the initializing thread and it; the wait and the
 * TMA load report it too). */
MG_HOST_HIDDEN void mg_host_mbar_arrive(unsigned long long *bar, unsigned tx, int line);
/* mbarrier.try_wait.parity: returns 1 once the phase of that parity has completed. The TMA
 * loads pending on this barrier land first; if the phase is still incomplete the thread
 * sleeps until an arrival or landing completes it (a wait that can never complete is
 * reported as a deadlock naming the barrier and its state). */
MG_HOST_HIDDEN int mg_host_mbar_wait(unsigned long long *bar, unsigned parity, int line);
/* cp.async.bulk.tensor.<rank>d ... mbarrier::complete_tx::bytes: map is a CUtensorMap
 * made by mg_host_tmap_encode (mg_host_tmap.h), c the rank coordinates. The box is read at
 * issue (zero or NaN outside the tensor) and lands in shared memory (both proxies' views) at
 * a scheduling point the executor picks, at the latest when a thread waits on bar; landing
 * completes its bytes on bar. */
MG_HOST_HIDDEN void mg_host_tma_load(void *dst, const void *map, unsigned long long *bar,
                                     int rank, const int *c, int line);
/* fence.proxy.async.shared::cta: the async proxy's view of dynamic shared memory (what
 * wgmma reads) becomes the generic view (what ordinary stores wrote). */
MG_HOST_HIDDEN void mg_host_fence_proxy_async(int line);
/* wgmma.fence / commit_group / wait_group n. wait_group writes the accumulators of the
 * groups it completes (the calling thread's fragment). */
MG_HOST_HIDDEN void mg_host_wgmma_fence(int line);
MG_HOST_HIDDEN void mg_host_wgmma_commit(int line);
MG_HOST_HIDDEN void mg_host_wgmma_wait(int n, int line);
/* wgmma.mma_async m64nNk16 f32 += {bf16 (kind bit 0 clear), f16 (set)}, B K-major (kind bit 1
 * clear) or MN-major (set: imm-trans-b 1, mg_host_gmma_addr_mn), A from desc_a K-major (bit 2
 * clear) or MN-major (set: imm-trans-a 1, mg_host_gmma_addr_mn with the M index): a warpgroup rendezvous of the
 * 128 threads (same N, descriptors, scale_d, line; each after a wgmma.fence). a: this
 * thread's 4 A registers, or NULL for A from desc_a. d is this thread's N/2 accumulators,
 * written at the wait_group that completes the group. Reported at issue: a descriptor
 * operand over shared memory that a TMA load in flight writes, or that a landed one wrote
 * which is visible to no thread of the warpgroup (none waited on its mbarrier phase, or
 * passed a __syncthreads or named barrier with a thread that did). */
MG_HOST_HIDDEN void mg_host_wgmma(int kind, int n, float *d, const unsigned *a,
                                  unsigned long long desc_a, unsigned long long desc_b,
                                  int scale_d, int line);
/* bar.sync (sync 1) / bar.arrive (sync 0) id, count. Reported: id not in 1..15, count not a
 * multiple of 32 or above the block's threads rounded up to warps, a count that differs from
 * the one the current instance's first arrival gave, a wait that never completes (deadlock,
 * naming the barrier), arrivals of an incomplete instance when the block has exited. */
MG_HOST_HIDDEN void mg_host_named_bar(int sync, unsigned id, unsigned count, int line);
/* cp.async.bulk.tensor.<rank>d.global.shared::cta.bulk_group (reduce 0) or
 * cp.reduce.async.bulk.tensor ... .add (reduce 1, f32 maps only) from shared memory at src. The
 * box is read from the async proxy's view of shared memory (stale without fence.proxy.async
 * after ordinary stores) at a point the executor picks between the issue and the
 * wait_group.read that covers it; the global writes happen at the wait_group (not .read) that
 * covers it, or when the issuing thread exits. Reported: a bad map, rank, alignment or
 * overrun, a reduction on a non-f32 map, a thread exiting with bulk operations uncommitted or
 * never waited for with .read. */
MG_HOST_HIDDEN void mg_host_tma_store(int reduce, const void *map, const void *src, int rank,
                                      const int *c, int line);
/* cp.async.bulk.commit_group and cp.async.bulk.wait_group{.read} n (read 1: sources read;
 * read 0: complete, global written). */
MG_HOST_HIDDEN void mg_host_bulk_commit(int line);
MG_HOST_HIDDEN void mg_host_bulk_wait(int n, int read, int line);
/* stmatrix.sync.aligned.m8n8.x4{,.trans}.shared.b16 [p], r: a warp collective (sm_90), the
 * inverse of ldmatrix. Lane 8m + i gives the 16-byte aligned shared address of row i of matrix
 * m; lane l holds in r[m] row l/4, elements 2(l%4) (low half) and 2(l%4)+1 of matrix m (with
 * trans, of its transpose: the stored row i holds column i of that fragment matrix). Once all
 * 32 lanes arrived, each lane writes its own row. */
MG_HOST_HIDDEN void mg_host_stmatrix(int trans, const unsigned *r, void *p, int line);
/* setmaxnreg.{inc (1), dec (0)}: a warpgroup rendezvous checking the same value. */
MG_HOST_HIDDEN void mg_host_setmaxnreg(int inc, int regs, int line);

/* The byte address wgmma reads for element (row, k) (k < 16) of a K-major 16-bit operand
 * described by desc (PTX ISA, "Shared Memory Matrix Layout" and "Matrix Descriptor"):
 * r0 = row % 8, r1 = row / 8, k0 = k % 8, kh = k / 8, start = (desc & 0x3fff) << 4,
 * LBO, SBO likewise from bits 16-29, 32-45:
 *   no swizzle (mode 0):  start + r1 SBO + kh LBO + 16 r0 + 2 k0
 *   swizzle of span S (mode 1: 128, 2: 64, 3: 32 bytes): a = start + r1 SBO + S r0 + 16 kh + 2 k0,
 *   then bits [4, 4+b) ^= bits [7, 7+b), b = log2(S / 16).
 * Returns 0xffffffff for a descriptor this executor does not model (base offset != 0). */
static inline unsigned mg_host_gmma_addr(unsigned long long desc, unsigned row, unsigned k) {
  unsigned start = (unsigned)(desc & 0x3fffu) << 4;
  unsigned lbo = (unsigned)((desc >> 16) & 0x3fffu) << 4;
  unsigned sbo = (unsigned)((desc >> 32) & 0x3fffu) << 4;
  unsigned base_off = (unsigned)((desc >> 49) & 7u);
  unsigned mode = (unsigned)(desc >> 62);
  if (base_off) return 0xffffffffu;
  unsigned r0 = row % 8, r1 = row / 8, k0 = k % 8, kh = k / 8;
  if (mode == 0) return start + r1 * sbo + kh * lbo + 16 * r0 + 2 * k0;
  unsigned span = mode == 1 ? 128 : mode == 2 ? 64 : 32;
  unsigned bits = mode == 1 ? 7 : mode == 2 ? 3 : 1;
  unsigned a = start + r1 * sbo + span * r0 + 16 * kh + 2 * k0;
  return a ^ (((a >> 7) & bits) << 4);
}

/* The byte address wgmma reads for element (n, k) (k < 16, n the M or N index) of an
 * MN-major ("transposed") 16-bit operand described by desc (PTX ISA, "Shared Memory Matrix
 * Layout", MN-major canonical layouts, in 16-byte units T): n0 = n % 8, k0 = k % 8,
 * k1 = k / 8, start, LBO, SBO as above:
 *   no swizzle (mode 0), ((T,1,m),(8,k)) : ((1,T,SBO),(1T,LBO)):
 *     start + (n / 8) SBO + k1 LBO + 16 k0 + 2 n0
 *   swizzle of span S (W = S / 16 chunks), ((T,W,m),(8,k)) : ((1,T,LBO),(WT,SBO)):
 *     a = start + (n / (8W)) LBO + k1 SBO + S k0 + 16 ((n / 8) % W) + 2 n0, then the swizzle.
 * Returns 0xffffffff for a descriptor with a base offset (not modelled). */
static inline unsigned mg_host_gmma_addr_mn(unsigned long long desc, unsigned n, unsigned k) {
  unsigned start = (unsigned)(desc & 0x3fffu) << 4;
  unsigned lbo = (unsigned)((desc >> 16) & 0x3fffu) << 4;
  unsigned sbo = (unsigned)((desc >> 32) & 0x3fffu) << 4;
  unsigned base_off = (unsigned)((desc >> 49) & 7u);
  unsigned mode = (unsigned)(desc >> 62);
  if (base_off) return 0xffffffffu;
  unsigned n0 = n % 8, k0 = k % 8, k1 = k / 8;
  if (mode == 0) return start + (n / 8) * sbo + k1 * lbo + 16 * k0 + 2 * n0;
  unsigned span = mode == 1 ? 128 : mode == 2 ? 64 : 32;
  unsigned bits = mode == 1 ? 7 : mode == 2 ? 3 : 1, w = span / 16;
  unsigned a = start + (n / (8 * w)) * lbo + k1 * sbo + span * k0 + 16 * ((n / 8) % w) + 2 * n0;
  return a ^ (((a >> 7) & bits) << 4);
}

/* The accumulator element thread t (0..127 in its warpgroup) holds in d[i] of a wgmma
 * m64nNk16 with f32 accumulators (PTX ISA, "wgmma .m64nNk16 register fragment layout for
 * accumulator matrix D"): warp w = t / 32 owns rows 16w..16w+15; within it the mma.m16n8
 * C layout repeats every 8 columns: row 16w + g + 8 ((i % 4) / 2), column 8 (i / 4) +
 * 2 q + i % 2, g = (t % 32) / 4, q = t % 4. */
static inline void mg_host_wgmma_acc_coord(unsigned t, unsigned i, unsigned *row, unsigned *col) {
  unsigned w = t / 32, g = (t % 32) / 4, q = t % 4;
  *row = 16 * w + g + 8 * ((i % 4) / 2);
  *col = 8 * (i / 4) + 2 * q + i % 2;
}

/* Which thread t (0..127) and register r (0..3, half h: 0 low, 1 high) hold element (row, k)
 * of a register A fragment (m64k16, 16-bit): the mma.m16n8k16 A layout per warp. */
static inline void mg_host_wgmma_a_coord(unsigned row, unsigned k, unsigned *t, unsigned *r,
                                         unsigned *h) {
  unsigned w = row / 16, rr = row % 16, g = rr % 8;
  *t = 32 * w + 4 * g + (k % 8) / 2;
  *r = rr / 8 + 2 * (k / 8);
  *h = k % 2;
}

/* stmatrix.x4{,.trans}: the lane and half (0 low, 1 high) of register r[m] whose value is
 * stored as element c (0..7) of the row that lane 8m + row gives the address of (PTX ISA
 * "stmatrix": lane l holds row l/4, elements 2(l%4), 2(l%4)+1 of matrix m; .trans stores the
 * transpose). */
static inline void mg_host_stsm_src(int trans, unsigned row, unsigned c, unsigned *lane,
                                    unsigned *half) {
  unsigned fr = trans ? c : row, fc = trans ? row : c;
  *lane = 4 * fr + fc / 2;
  *half = fc % 2;
}
#endif
