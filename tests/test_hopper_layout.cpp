// test_hopper_layout.cpp: the Hopper layouts of templates/mla_device_sm90.cuh (tile_offset,
// make_desc, acc_row/acc_col) and of the host emulator (tests/host/hopper_host.h:
// mg_host_gmma_addr, mg_host_wgmma_acc_coord, mg_host_wgmma_a_coord) against CuTe's (the
// CUTLASS headers of PyPI's nvidia-cutlass, installed by scripts/setup.sh into
// <build>/tools), an independent reference used by this test only.
//   - shared memory, K-major 16-bit operands: CuTe's GMMA layout atoms (INTER, SW32, SW64,
//     SW128; half_t: the layouts are those of every 16-bit type) tiled to (rows, 64) for rows
//     64, 128, 192, 256, at a 1024-aligned shared-memory pointer, against the byte offsets the
//     TMA boxes give (tile_offset per box, boxes rows x span apart) and, for every 16-column
//     k-step, against the address the emulator decodes from the descriptor the kernels
//     build (make_desc_kstep, swizzled; no swizzle, which no template uses, make_desc: start
//     at the k-step, SBO 8 rows, LBO between 8-column halves);
//   - shared memory, MN-major 16-bit operands (check_smem_mn): B (imm-trans-b, V in the forward,
//     dO and Q in the backward) and A (imm-trans-a, P and dS for P^T dO and dS^T Q: M = 64,
//     the 64-column shapes; the emulator decodes A's and B's MN-major descriptors alike, as
//     the ISA's canonical layouts are per majorness, not per operand), with the header's
//     make_desc_mn_kstep;
//   - stmatrix.x4 and .x4.trans: CuTe's Copy_Traits<SM90_U32x4_STSM_N> and <SM90_U16x8_STSM_T>
//     source layouts (thread, register bit) -> stored bit against mg_host_stsm_src;
//   - registers: CuTe's CLayout_64xN (N 64, 128, 192, 256) against acc_row/acc_col and
//     mg_host_wgmma_acc_coord, and ALayout_64x16 against mg_host_wgmma_a_coord.
// Prints what it compared; exits 1 on the first difference.
#include <cute/atom/copy_traits_sm90.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h> /* __host__, __device__, __forceinline__ for a host compiler */
#define MG_HOST_HIDDEN
#include "host/hopper_host.h"
// Only the header's layout part (plain arithmetic), not its PTX wrappers.
#define MLA_SM90_LAYOUT_ONLY
#include "../templates/mla_device_sm90.cuh"

using namespace cute;

#define CHECK(cond, ...)                  \
  do {                                    \
    if (!(cond)) {                        \
      fprintf(stderr, __VA_ARGS__);       \
      fputc('\n', stderr);                \
      exit(1);                            \
    }                                     \
  } while (0)

// CuTe applies a GMMA atom's swizzle to the address of the shared-memory pointer it is
// given (a composed layout alone, evaluated without one, is not the hardware's pattern):
// the tile sits at a 1024-aligned buffer and offsets are taken from element addresses.
alignas(1024) static half_t g_buf[256 * 128];

template <class Atom>
static void check_smem(int swz, const char *name, unsigned rows) {
  auto tensor = make_tensor(make_smem_ptr(g_buf), tile_to_shape(Atom{}, make_shape(rows, Int<64>{})));
  auto layout = [&](unsigned r, unsigned c) {
    return (unsigned)((const half_t *)raw_pointer_cast(&tensor(r, c)) - g_buf);
  };
  unsigned span = mla::sm90::swizzle_span(swz), cols = span / 2;
  for (unsigned r = 0; r < rows; ++r)
    for (unsigned c = 0; c < 64; ++c) {
      unsigned cute_b = 2u * (unsigned)layout(r, c);
      unsigned ours = (c / cols) * rows * span + mla::sm90::tile_offset(swz, r, c % cols);
      CHECK(cute_b == ours, "%s rows %u: element (%u, %u) CuTe byte %u, tile_offset %u", name,
            rows, r, c, cute_b, ours);
    }
  for (unsigned ks = 0; ks < 4; ++ks) {
    // swizzled: the header's make_desc_kstep, which the templates build every K-major
    // descriptor with (boxes of span / 2 columns); no swizzle (no template uses it: its LBO
    // is the next box, rows x 16 bytes), make_desc
    unsigned long long desc =
        swz == mla::sm90::SWIZZLE_NONE
            ? mla::sm90::make_desc(2 * ks * rows * 16, rows * 16, 128, swz)
            : mla::sm90::make_desc_kstep(0, rows, (int)cols, swz, (int)ks);
    for (unsigned r = 0; r < rows; ++r)
      for (unsigned k = 0; k < 16; ++k) {
        unsigned cute_b = 2u * (unsigned)layout(r, ks * 16 + k);
        unsigned emu = mg_host_gmma_addr(desc, r, k);
        CHECK(cute_b == emu, "%s rows %u k-step %u: element (%u, %u) CuTe byte %u, descriptor "
              "0x%016llx decodes to %u", name, rows, ks, r, k, cute_b, desc, emu);
      }
  }
}

// MN-major 16-bit operands (wgmma imm-trans-a or imm-trans-b 1; the n index is A's M or B's
// N): CuTe's MN-major atoms tiled to (n, k)
// = (cols, rows) with the k mode outermost (Step<_2,_1>), which is how TMA boxes of a
// row-major [k][n] tensor (V [keys][d_v]) land: box b = n / (span / 2) holds every k row of
// its span-wide column block, boxes rows x span bytes apart (no swizzle: 8-column boxes of
// 16-byte rows). Checked: the box offsets, and for every 16-row k-step the address the
// emulator decodes (mg_host_gmma_addr_mn) from the descriptor the header's make_desc_mn_kstep
// builds (every MN-major descriptor of the templates is made by it):
// swizzled, start at the k-step (16 span bytes per step), LBO = rows x span (the next
// column block), SBO = 8 span (the next 8 k rows); no swizzle, start 256 bytes per step,
// SBO = rows x 16 (the next 8 columns), LBO = 128 (the next 8 k rows).
template <class Atom>
static void check_smem_mn(int swz, const char *name, unsigned cols_n, unsigned rows) {
  auto tensor = make_tensor(make_smem_ptr(g_buf),
                            tile_to_shape(Atom{}, make_shape(cols_n, rows), Step<_2, _1>{}));
  auto layout = [&](unsigned n, unsigned k) {
    return (unsigned)((const half_t *)raw_pointer_cast(&tensor(n, k)) - g_buf);
  };
  unsigned span = mla::sm90::swizzle_span(swz), cols = span / 2;
  for (unsigned n = 0; n < cols_n; ++n)
    for (unsigned k = 0; k < rows; ++k) {
      unsigned cute_b = 2u * layout(n, k);
      unsigned ours = (n / cols) * rows * span + mla::sm90::tile_offset(swz, k, n % cols);
      CHECK(cute_b == ours, "MN %s %ux%u: element (n %u, k %u) CuTe byte %u, TMA box %u", name,
            cols_n, rows, n, k, cute_b, ours);
    }
  for (unsigned ks = 0; ks < rows / 16; ++ks) {
    const unsigned long long desc = mla::sm90::make_desc_mn_kstep(swz, 0, rows, ks);
    for (unsigned n = 0; n < cols_n; ++n)
      for (unsigned k = 0; k < 16; ++k) {
        unsigned cute_b = 2u * layout(n, ks * 16 + k);
        unsigned emu = mg_host_gmma_addr_mn(desc, n, k);
        CHECK(cute_b == emu, "MN %s %ux%u k-step %u: element (n %u, k %u) CuTe byte %u, "
              "descriptor 0x%016llx decodes to %u", name, cols_n, rows, ks, n, k, cute_b, desc, emu);
      }
  }
}

// stmatrix: CuTe's SrcLayout maps (lane, bit v of the lane's 4 registers: register v / 32) to
// a bit of the stored rows, row q (lane q's address: matrix q / 8, row q % 8) holding bits
// [128 q, 128 q + 128), element c at bits [16 c, 16 c + 16).
template <class Op>
static void check_stsm(int trans, const char *name) {
  typename Copy_Traits<Op>::SrcLayout src;
  for (unsigned t = 0; t < 32; ++t)
    for (unsigned v = 0; v < 128; v += 16) {
      unsigned bit = (unsigned)src(t, v), q = bit / 128, c = (bit % 128) / 16, lane, half;
      CHECK(bit % 16 == 0 && (unsigned)src(t, v + 15) == bit + 15, "%s: lane %u bit %u: CuTe "
            "bit %u is not a whole 16-bit element", name, t, v, bit);
      mg_host_stsm_src(trans, q % 8, c, &lane, &half);
      CHECK(lane == t && half == (v % 32) / 16 && q / 8 == v / 32,
            "%s: lane %u register %u half %u: CuTe stores it at matrix %u row %u element %u, "
            "the emulator takes lane %u half %u there", name, t, v / 32, (v % 32) / 16, q / 8,
            q % 8, c, lane, half);
    }
}

template <int N>
static void check_acc() {
  GMMA::CLayout_64xN<N> cl;
  for (unsigned t = 0; t < 128; ++t)
    for (unsigned i = 0; i < N / 2; ++i) {
      unsigned idx = (unsigned)cl(t, i), m = idx % 64, n = idx / 64;
      unsigned er, ec;
      mg_host_wgmma_acc_coord(t, i, &er, &ec);
      CHECK(m == mla::sm90::acc_row(t, i) && n == mla::sm90::acc_col(t, i),
            "N %d: thread %u d[%u]: CuTe (%u, %u), header (%u, %u)", N, t, i, m, n,
            mla::sm90::acc_row(t, i), mla::sm90::acc_col(t, i));
      CHECK(m == er && n == ec, "N %d: thread %u d[%u]: CuTe (%u, %u), emulator (%u, %u)", N, t,
            i, m, n, er, ec);
    }
}

int main() {
  for (unsigned rows : {64u, 128u, 192u, 256u}) {
    check_smem<GMMA::Layout_K_INTER_Atom<half_t>>(mla::sm90::SWIZZLE_NONE, "INTER", rows);
    check_smem<GMMA::Layout_K_SW32_Atom<half_t>>(mla::sm90::SWIZZLE_32B, "SW32", rows);
    check_smem<GMMA::Layout_K_SW64_Atom<half_t>>(mla::sm90::SWIZZLE_64B, "SW64", rows);
    check_smem<GMMA::Layout_K_SW128_Atom<half_t>>(mla::sm90::SWIZZLE_128B, "SW128", rows);
      }
  printf("smem: K-major 16-bit INTER/SW32/SW64/SW128 tiles of 64/128/192/256 x 64: TMA box "
         "offsets and the descriptors of 4 k-steps (make_desc_kstep; INTER make_desc) equal "
         "CuTe's\n");
  // (mn, k): the templates' MN-major operands. 64x64: P^T dO and dS^T Q's A (M = 64), d_v 64
  // V; 128x64, 128x128: V (d_v 128, block_n 64/128), dO and Q; 192x64: DeepSeek's Q in
  // dK += dS^T Q and K in dQ += dS K (block_n 64), 192x128: that K at block_n 128; 64x128:
  // the forward's V at d_v 64 with block_n 128, atomic dQ chunks; 256x64: wide heads.
  const unsigned mn_shapes[][2] = {{64, 64}, {128, 64}, {128, 128}, {192, 64}, {192, 128},
                                   {64, 128}, {256, 64}};
  for (const auto &sh : mn_shapes) {
    check_smem_mn<GMMA::Layout_MN_INTER_Atom<half_t>>(mla::sm90::SWIZZLE_NONE, "INTER", sh[0], sh[1]);
    check_smem_mn<GMMA::Layout_MN_SW32_Atom<half_t>>(mla::sm90::SWIZZLE_32B, "SW32", sh[0], sh[1]);
    check_smem_mn<GMMA::Layout_MN_SW64_Atom<half_t>>(mla::sm90::SWIZZLE_64B, "SW64", sh[0], sh[1]);
    check_smem_mn<GMMA::Layout_MN_SW128_Atom<half_t>>(mla::sm90::SWIZZLE_128B, "SW128", sh[0], sh[1]);
  }
  printf("smem: MN-major 16-bit INTER/SW32/SW64/SW128 tiles (mn x k 64x64 (A's M = 64), 128x64, "
         "128x128, 192x64, 192x128, 64x128, 256x64): TMA box offsets and the k-step descriptors "
         "(make_desc_mn_kstep) equal CuTe's\n");
  check_acc<64>();
  check_acc<128>();
  check_acc<192>();
  check_acc<256>();
  printf("registers: wgmma m64nNk16 f32 accumulators (N 64/128/192/256), header and emulator, "
         "equal CuTe's CLayout_64xN\n");
  GMMA::ALayout_64x16 al;
  for (unsigned t = 0; t < 128; ++t)
    for (unsigned v = 0; v < 8; ++v) {
      unsigned idx = (unsigned)al(t, v), m = idx % 64, k = idx / 64, et, er, eh;
      mg_host_wgmma_a_coord(m, k, &et, &er, &eh);
      CHECK(et == t && 2 * er + eh == v, "A (%u, %u): CuTe thread %u value %u, emulator thread "
            "%u register %u half %u", m, k, t, v, et, er, eh);
    }
  printf("registers: wgmma A fragment (m64k16, 16-bit) equals CuTe's ALayout_64x16\n");
  check_stsm<SM90_U32x4_STSM_N>(0, "stmatrix.x4");
  check_stsm<SM90_U16x8_STSM_T>(1, "stmatrix.x4.trans");
  printf("stmatrix.x4 and .x4.trans: the emulator's fragment-to-row map equals CuTe's "
         "SM90_U32x4_STSM_N / SM90_U16x8_STSM_T\n");
  return 0;
}
