// Which (query tile, query head, sequence) a CTA of the sm_90a prefill kernel works on. Grid: (query tiles,
// Hq, B), one CTA per tile. Causal: the query tiles lower down a sequence visit more KV tiles, so the grid's
// first CTAs take the last tiles (longest first) and the short ones fill the tail of the launch, as the sm_80
// kernel does.
#pragma once

#include "fa/intrinsics.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN
namespace hopper {

struct WorkTile {
  int m_block, head, batch;
};

FA_DEVICE WorkTile work_tile(bool causal) {
  const Dim3 bid = block_idx();
  return WorkTile{causal ? grid_dim().x - 1 - bid.x : bid.x, bid.y, bid.z};
}

} // namespace hopper
FA_NAMESPACE_END
