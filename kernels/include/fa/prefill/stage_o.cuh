// The epilogue's first half, shared by dense prefill (kernels/prefill.cu) and paged prefill
// (kernels/paged_prefill.cu): a warp's O fragments, rounded to T, written into its own rows of the Q tile in
// shared memory (no other warp reads them, and this warp's last ldmatrix of Q is behind it), so that the
// global stores that follow are whole 16-byte chunks with consecutive lanes on consecutive chunks of a row
// instead of 4-byte pieces scattered over 8 rows. Cfg is a prefill TileConfig (fa/prefill/tile_config.cuh).
#pragma once

#include "fa/intrinsics.cuh"
#include "fa/mma_tile.cuh"
#include "fa/swizzle.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN
namespace prefill {

// Rows warp_row0 + [0, 16·kMTiles) of sQ (layout SwizzledRows<kHeadDim>) <- o; the lanes may read back any
// chunk of them on return.
template <class T, class Cfg>
FA_DEVICE void stage_o_rows(T *sQ, int warp_row0, const float (&o)[Cfg::kMTiles][Cfg::kHeadDim / 8][4]) {
  using Layout = SwizzledRows<Cfg::kHeadDim>;
  const int g = lane_id() >> 2;
  const int t = lane_id() & 3;
  sync_warp(); // every lane's reads of these Q rows are done before any lane overwrites them
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = warp_row0 + 16 * mt + 8 * h + g;
#pragma unroll
      for (int db = 0; db < Cfg::kHeadDim / 8; ++db) {
        // Conflict-free: the 8 rows g of one store land in 8 different 16-byte bank groups (swizzle).
        st_shared(reinterpret_cast<uint32_t *>(sQ + Layout::offset(r, 8 * db) + 2 * t),
                  pack2<T>(o[mt][db][2 * h], o[mt][db][2 * h + 1]));
      }
    }
  }
  sync_warp(); // lanes read back chunks other lanes wrote
}

} // namespace prefill
FA_NAMESPACE_END
