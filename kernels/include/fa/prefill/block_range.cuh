// Which KV tiles a query tile visits, and which of them need a mask. Mirrored exactly on the host by
// `prefill::kv_block_range` (src/prefill.rs, unit-tested); keep both in step.
//
// Bottom-right causal alignment (docs/semantics.md): row i of Tq sees key j of Tk iff j <= i + (Tk - Tq).
// For the query tile of rows [m0, m0 + Br) (clipped to Tq):
//  - tiles past the last key its LAST valid row sees are never loaded (n_end);
//  - a tile needs masking if it holds a key some row must not see: past the causal limit of the tile's
//    FIRST row (rows below see more), or past Tk (the ragged edge). Those are the top tiles
//    [n_mask_begin, n_end); the kernel walks tiles downward, so masked steps come first and the rest of
//    the loop is mask-free.
// n_end == 0 means no row of the tile sees any key: O = 0, LSE = -inf.
// All arithmetic stays inside int32: i + (Tk - Tq) lies in [-Tq, Tk) for any row i < Tq.
#pragma once

#include "fa/intrinsics.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN
namespace prefill {

struct KvBlockRange {
  int n_end;        // visit KV tiles [0, n_end)
  int n_mask_begin; // tiles [n_mask_begin, n_end) need the mask, [0, n_mask_begin) do not
};

FA_HOST_DEVICE KvBlockRange kv_block_range(int m0, int br, int bc, int tq, int tk, bool causal) {
  int n_end = tk / bc + (tk % bc != 0);
  int n_mask_begin = tk / bc; // the ragged last tile is masked
  if (causal) {
    const int last_row = (tq - m0 < br ? tq : m0 + br) - 1;
    const int last_key = last_row + (tk - tq); // last key any row of the tile sees
    const int causal_end = last_key < 0 ? 0 : last_key / bc + 1;
    n_end = causal_end < n_end ? causal_end : n_end;
    const int all_see = m0 + (tk - tq) + 1; // keys [0, all_see) are visible to every row of the tile
    const int causal_mask_begin = all_see <= 0 ? 0 : all_see / bc;
    n_mask_begin = causal_mask_begin < n_mask_begin ? causal_mask_begin : n_mask_begin;
  }
  if (n_mask_begin > n_end) n_mask_begin = n_end;
  return KvBlockRange{n_end, n_mask_begin};
}

} // namespace prefill
FA_NAMESPACE_END
