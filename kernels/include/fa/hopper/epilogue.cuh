// The epilogue of a consumer warpgroup of the sm_90a prefill kernel: O (already normalised) converted to
// 16 bits and staged through this warpgroup's own rows of the Q tile in shared memory (only its wgmmas read
// them, and they completed), so that each lane then stores whole 16-byte chunks, consecutive lanes on
// consecutive chunks of a row. Each warp stages and stores its own 16 rows, so only sync_warp is needed.
// Rows past Tq are not written (varlen: they belong to the next sequence). TMA stores would write whole
// boxes, which varlen cannot allow; 16-byte stores need no special case.
#pragma once

#include "fa/abi.h"
#include "fa/hopper/traits.cuh"
#include "fa/intrinsics.cuh"
#include "fa/tile_copy.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN
namespace hopper {

// Byte offset of (row, 16-byte chunk c) in the staging area: the Q tile's panel layout, chunks XOR-permuted
// by row % 8 so that the 8 rows g of one fragment store land in 8 different bank groups.
template <class Tr> FA_DEVICE int staged_offset(int row, int chunk) {
  const int panel = chunk / 8, c = (chunk % 8) ^ (row % 8);
  return panel * Tr::kQPanelBytes + row * kPanelRowBytes + 16 * c;
}

// o: this warpgroup's normalised accumulator; lse[2]: rows g and g+8 of this warp (natural log).
// out_row0: element offset of the warp's first row in p.o; lse_row0: of its LSE; rows_left: rows of the
// sequence from this warp's first row on.
template <class T, class Tr>
FA_DEVICE void store_output(const FaPrefillParams &p, unsigned char *sQ, WgmmaAcc<Tr::kHeadDim> &o,
                            const float (&lse)[2], int wg, int64_t out_offset, int64_t lse_offset, int rows_left) {
  constexpr int kChunks = Tr::kHeadDim / 8;
  const int lane = lane_id(), g = lane >> 2, q = lane & 3;
  const int row0 = 64 * wg + 16 * (warp_id() % 4); // the warp's first row in the Q tile
  sync_warp();
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row0 + g + 8 * h;
      st_shared(reinterpret_cast<uint32_t *>(sQ + staged_offset<Tr>(r, j) + 4 * q),
                pack2<T>(o[4 * j + 2 * h], o[4 * j + 2 * h + 1]));
    }
  }
  sync_warp();
  T *out = static_cast<T *>(p.o) + out_offset;
#pragma unroll
  for (int i = 0; i < 16 * kChunks / kWarpSize; ++i) {
    const int idx = i * kWarpSize + lane, r = idx / kChunks, c = idx % kChunks;
    if (r < rows_left) {
      const Bytes16 v = ld_shared(reinterpret_cast<const Bytes16 *>(sQ + staged_offset<Tr>(row0 + r, c)));
      st_global(reinterpret_cast<Bytes16 *>(out + r * p.o_row_stride + 8 * c), v);
    }
  }
  if (p.lse != nullptr && q == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (g + 8 * h < rows_left) st_global(p.lse + lse_offset + g + 8 * h, lse[h]);
    }
  }
}

} // namespace hopper
FA_NAMESPACE_END
