// The walk over a warp's scores held as mma C fragments: s[kMT][kNB][4] holds rows [0, 16·kMT) and key
// columns [0, 8·kNB) of the warp's tile in the m16n8 C layout (fa/mma_tile.cuh; a wgmma m64 accumulator's
// per-warp 16 rows alike), g = lane / 4, t = lane % 4:
//   element s[mt][nb][2·h + e] is row 16·mt + 8·h + g, column 8·nb + 2·t + e.
// The kernel owns this loop; what it does per score is its caller's: masks, score variants and paged rows
// give a row function (called once per fragment row, so per-row data — a position, a token read from
// shared memory, a slope — is read once and nothing per row stays live across the tile) and a score
// function of (score, the row's value, column). Everything is unrolled and inlined: the SASS of every
// kernel using it has the instruction count of the hand-written loops it replaced (nvcc 13.0; only the
// 16-bit paged prefill _mod kernels at D 64/96 allocate registers differently, -8 to +2).
#pragma once

#include "fa/attention_state.cuh"
#include "fa/intrinsics.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN

// The warp-tile row of this lane's fragment row slot r = 2·mt + h.
FA_DEVICE int fragment_row(int r) { return 16 * (r >> 1) + 8 * (r & 1) + (lane_id() >> 2); }

// score(s[mt][nb][2h + e], row_value(row), column) for every element; row_value(row) once per row.
template <int kMT, int kNB, class RowValue, class Score>
FA_DEVICE void for_each_score(float (&s)[kMT][kNB][4], RowValue row_value, Score score) {
  const int g = lane_id() >> 2;
  const int t = lane_id() & 3;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const auto row = row_value(16 * mt + 8 * h + g);
#pragma unroll
      for (int nb = 0; nb < kNB; ++nb) {
#pragma unroll
        for (int e = 0; e < 2; ++e) score(s[mt][nb][2 * h + e], row, 8 * nb + 2 * t + e);
      }
    }
  }
}

// The keys a row sees, [first, last] (first may be < 0; the row sees none when last < first).
struct VisibleKeys {
  int first, last;
};

// The window of a row whose own position among the keys is diag_key: [diag_key − left, min(diag_key + right,
// tk − 1)] (left/right the effective bounds of fa/score_mod.cuh).
FA_DEVICE VisibleKeys visible_keys(int diag_key, int tk, int left, int right) {
  return VisibleKeys{diag_key - left, diag_key + right < tk - 1 ? diag_key + right : tk - 1};
}

// The mask of one score at key `key`: -inf outside the row's visible keys (kLeft: check the left bound too).
template <bool kLeft> FA_DEVICE void mask_score(float &s, const VisibleKeys &row, int key) {
  if (key > row.last || (kLeft && key < row.first)) s = kNegInf;
}

FA_NAMESPACE_END
