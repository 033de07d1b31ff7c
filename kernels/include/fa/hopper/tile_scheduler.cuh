// Which work tiles (query tile, query head, sequence) a CTA of the sm_90a prefill kernel runs: a static
// persistent schedule (FA3's StaticPersistentTileScheduler). The launch has min(ctas, tiles) CTAs — ctas is
// what the GPU holds at once, SM count x occupancy, from the host (src/prefill/sm90.rs) — and CTA b runs
// tiles b, b + grid, b + 2·grid, ...: the barriers are initialised and the producer's ring runs on across
// tiles, and the next tile's Q and K loads overlap the last one's epilogue. The order is fixed, so results
// and the assignment do not depend on timing.
//
// Tile order: non-causal, the query tiles of one (head, sequence) are consecutive (CTAs running together
// share K/V in L2). Causal: the query tiles lower down a sequence visit more KV tiles, so the order runs
// the last query tile of every (head, sequence) first, then the one before, ... (longest first: the short
// ones fill the tail). Varlen: tiles are counted over the longest sequence; a tile past its sequence's end
// costs its CTA only the cu_seqlens lookup (the kernel skips it before touching a barrier).
#pragma once

#include "fa/intrinsics.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN
namespace hopper {

struct WorkTile {
  int m_block, head, batch;
};

struct TileScheduler {
  int m_blocks, heads, batch;
  bool causal;

  FA_HOST_DEVICE int tiles() const { return m_blocks * heads * batch; }
  // The first tile of this CTA, and the stride between its tiles.
  FA_DEVICE static int first() { return block_idx().x; }
  FA_DEVICE static int stride() { return grid_dim().x; }

  FA_HOST_DEVICE WorkTile tile(int t) const {
    if (causal) {
      const int per_block = heads * batch, rest = t % per_block;
      return WorkTile{m_blocks - 1 - t / per_block, rest % heads, rest / heads};
    }
    const int rest = t / m_blocks;
    return WorkTile{t % m_blocks, rest % heads, rest / heads};
  }
};

} // namespace hopper
FA_NAMESPACE_END
