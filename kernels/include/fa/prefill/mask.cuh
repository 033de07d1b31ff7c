// The score mask of one KV tile, applied to a warp's S fragments before the row max: key j of row i is
// kept iff i + δ − left ≤ j ≤ i + δ + right and j < Tk (δ = Tk − Tq, bottom-right alignment; left/right the
// effective window bounds of fa/score_mod.cuh: causal is right = 0, no window excludes nothing). Masked
// scores become -inf so that the online softmax gives them weight exactly 0 (see fa/online_softmax.cuh for
// rows left with no key at all). Only called on the tiles kv_block_range marks as needing it.
#pragma once

#include "fa/fragment_walk.cuh"
#include "fa/intrinsics.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN
namespace prefill {

// s[kMT][kNB]: this warp's scores for rows row0 + [0, 16·kMT) and keys key0 + [0, 8·kNB) (C layout).
// kLeft: check the left bound too (only kernels that may have one: the plain kernels' left bound is
// unbounded, and they keep today's single compare per score).
template <bool kLeft, int kMT, int kNB>
FA_DEVICE void apply_kv_mask(float (&s)[kMT][kNB][4], int row0, int key0, int tq, int tk, int left, int right) {
  // A row's own position among the keys is row + (tk − tq) (bottom-right alignment).
  for_each_score(
      s, [&](int row) { return visible_keys(row0 + row + (tk - tq), tk, left, right); },
      [&](float &x, const VisibleKeys &keys, int col) { mask_score<kLeft>(x, keys, key0 + col); });
}

} // namespace prefill
FA_NAMESPACE_END
