// Which KV tiles a query tile visits, and which of them need a mask. Mirrored exactly on the host by
// `prefill::kv_block_range` (src/prefill/mod.rs, unit-tested); keep both in step.
//
// Row i of Tq sees key j of Tk iff i + δ − left ≤ j ≤ i + δ + right (δ = Tk − Tq, bottom-right alignment;
// docs/semantics.md), with the effective window bounds of fa/score_mod.cuh (causal: right = 0; no window:
// both bounds ≥ span, which excludes nothing). For the query tile of rows [m0, m0 + Br) (clipped to Tq):
//  - the keys some row sees are [m0 + δ − left, last_row + δ + right] ∩ [0, Tk): tiles outside them are
//    never loaded (n_begin, n_end) — left of the window just as above the causal diagonal;
//  - the keys every row sees are [last_row + δ − left, m0 + δ + right] ∩ [0, Tk): tiles inside them need
//    no mask. The others are the top tiles [n_mask_begin, n_end) (the right edge, the diagonal, the
//    ragged Tk) and the bottom tiles [n_begin, n_interior_begin) (the window's left edge). The kernel walks
//    tiles downward: masked steps, the mask-free interior, then masked steps again (none without a window).
// n_begin == n_end means no row of the tile sees any key: O = 0, LSE = -inf.
// All arithmetic stays inside int32: positions are below Tq, Tk ≤ 2^30 and the bounds below span.
#pragma once

#include "fa/intrinsics.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN
namespace prefill {

struct KvBlockRange {
  int n_begin;          // visit KV tiles [n_begin, n_end)
  int n_end;
  int n_mask_begin;     // tiles [n_mask_begin, n_end) need the mask
  int n_interior_begin; // tiles [n_interior_begin, n_mask_begin) do not; [n_begin, n_interior_begin) do
};

// left, right: effective window bounds (fa/score_mod.cuh), both >= 0.
FA_HOST_DEVICE KvBlockRange kv_block_range(int m0, int br, int bc, int tq, int tk, int left, int right) {
  const int diag = tk - tq;
  const int last_row = (tq - m0 < br ? tq : m0 + br) - 1;
  const int first_key = m0 + diag - left > 0 ? m0 + diag - left : 0;
  const int last_key = last_row + diag + right < tk - 1 ? last_row + diag + right : tk - 1;
  if (last_key < first_key) return KvBlockRange{0, 0, 0, 0};
  const int n_begin = first_key / bc;
  const int n_end = last_key / bc + 1;
  // Keys [all_lo, all_hi] are visible to every row of the tile (possibly none: all_hi < all_lo).
  const int all_lo = last_row + diag - left > 0 ? last_row + diag - left : 0;
  const int all_hi = m0 + diag + right < tk - 1 ? m0 + diag + right : tk - 1;
  int n_mask_begin = all_hi + 1 <= 0 ? 0 : (all_hi + 1) / bc; // tiles ending at or below all_hi
  n_mask_begin = n_mask_begin < n_begin ? n_begin : (n_mask_begin > n_end ? n_end : n_mask_begin);
  int n_interior_begin = (all_lo + bc - 1) / bc; // tiles starting at or above all_lo
  n_interior_begin =
      n_interior_begin < n_begin ? n_begin : (n_interior_begin > n_mask_begin ? n_mask_begin : n_interior_begin);
  return KvBlockRange{n_begin, n_end, n_mask_begin, n_interior_begin};
}

} // namespace prefill
FA_NAMESPACE_END
