// The epilogue of a consumer warpgroup of the sm_90a prefill kernel: O (already normalised) converted to
// 16 bits and staged through this warpgroup's own rows of the Q tile in shared memory (only its wgmmas read
// them, and they completed), in the Q tile's 128B-swizzled panel layout. Each warp stages and stores its own
// 16 rows, so only sync_warp is needed. Then, per warp, either
//  - a TMA store (dense calls whose O a tensor map can address: FaPrefillSm90Params.o_tma): lane 0 stores the
//    16 x 64 box of each of O's Dv/64 panels (the staged layout is the TMA's 128B swizzle) and waits for the reads of its
//    bulk group before the Q buffer is released; the TMA unit clips rows past Tq (the map's row extent); or
//  - 16-byte stores, consecutive lanes on consecutive chunks of a row, rows past Tq skipped (varlen: they
//    belong to the next sequence, which a TMA box would overwrite).
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
// sequence from this warp's first row on. o_map: the O tensor map for the TMA store, or nullptr for 16-byte
// stores; o_at: the warp's first row, its head and its sequence in the map's coordinates.
struct OutputAt {
  int64_t out_offset, lse_offset;
  int rows_left;
  const FaTensorMap *o_map;
  int row, head, batch;
};

template <class T, class Tr>
FA_DEVICE void store_output(const FaPrefillParams &p, unsigned char *sQ, WgmmaAcc<Tr::kHeadDimV> &o,
                            const float (&lse)[2], int wg, const OutputAt &at) {
  constexpr int kChunks = Tr::kHeadDimV / 8; // O's columns (Dv ≤ D: the first Dv/64 panels of the Q buffer)
  // The lane through a shuffle (its own value): the compiler cannot see it is loop-invariant, so in the
  // persistent loop the ~18 staging addresses derived from it are computed here, once per work tile, rather
  // than hoisted out of the loop and held (or spilled: 44 bytes at D 256) across the mainloop.
  const int lane = shfl_idx(lane_id(), lane_id()), g = lane >> 2, q = lane & 3;
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
  if (at.o_map != nullptr) {
    fence_proxy_async(); // every lane's staged stores, visible to the TMA unit
    sync_warp();
    if (lane == 0 && at.rows_left > 0) {
#pragma unroll
      for (int panel = 0; panel < Tr::kPanelsV; ++panel) {
        const int32_t c[4] = {panel * kPanelCols, at.row, at.head, at.batch};
        tma_store(at.o_map, c, sQ + panel * Tr::kQPanelBytes + row0 * kPanelRowBytes);
      }
      tma_store_commit();
      tma_store_wait_read<0>(); // the staged rows may be overwritten once the warp releases the Q buffer
    }
  } else {
    sync_warp();
    T *out = static_cast<T *>(p.o) + at.out_offset;
#pragma unroll
    for (int i = 0; i < 16 * kChunks / kWarpSize; ++i) {
      const int idx = i * kWarpSize + lane, r = idx / kChunks, c = idx % kChunks;
      if (r < at.rows_left) {
        const Bytes16 v = ld_shared(reinterpret_cast<const Bytes16 *>(sQ + staged_offset<Tr>(row0 + r, c)));
        st_global(reinterpret_cast<Bytes16 *>(out + r * p.o_row_stride + 8 * c), v);
      }
    }
  }
  if (p.lse != nullptr && q == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (g + 8 * h < at.rows_left) st_global(p.lse + at.lse_offset + g + 8 * h, lse[h]);
    }
  }
}

} // namespace hopper
FA_NAMESPACE_END
