// The score mask of one KV tile, applied to a warp's S fragments before the row max: key j of row i is
// kept iff i + δ − left ≤ j ≤ i + δ + right and j < Tk (δ = Tk − Tq, bottom-right alignment; left/right the
// effective window bounds of fa/score_mod.cuh: causal is right = 0, no window excludes nothing). Masked
// scores become -inf so that the online softmax gives them weight exactly 0 (see fa/online_softmax.cuh for
// rows left with no key at all). Only called on the tiles kv_block_range marks as needing it.
#pragma once

#include "fa/attention_state.cuh"
#include "fa/intrinsics.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN
namespace prefill {

// s[kMT][kNB]: this warp's scores for rows row0 + [0, 16·kMT) and keys key0 + [0, 8·kNB) (C layout).
// kLeft: check the left bound too (only kernels that may have one: the plain kernels' left bound is
// unbounded, and they keep today's single compare per score).
template <bool kLeft, int kMT, int kNB>
FA_DEVICE void apply_kv_mask(float (&s)[kMT][kNB][4], int row0, int key0, int tq, int tk, int left, int right) {
  const int g = lane_id() >> 2;
  const int t = lane_id() & 3;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int diag_key = row0 + 16 * mt + 8 * h + g + (tk - tq); // this row's own position among the keys
      const int first = diag_key - left;                            // first visible key (may be < 0)
      const int last = diag_key + right < tk - 1 ? diag_key + right : tk - 1; // last visible key
#pragma unroll
      for (int nb = 0; nb < kNB; ++nb) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = key0 + 8 * nb + 2 * t + e;
          if (key > last || (kLeft && key < first)) s[mt][nb][2 * h + e] = kNegInf;
        }
      }
    }
  }
}

} // namespace prefill
FA_NAMESPACE_END
