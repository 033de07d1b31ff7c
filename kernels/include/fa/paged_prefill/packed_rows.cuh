// Paged prefill packs the query rows of one KV head into the MMA's M dimension: CTA row r (of a sequence's
// q_len · G rows, G = Hq / Hkv) is query token r / G of query head kv_head · G + r % G, so the G heads that
// share a KV head read each K/V tile once, and a short chunk (q_len · G <= Br) reads its K/V once in all.
// Masks and score variants therefore work on *token* positions (row -> token), and ALiBi slopes and sinks
// are per row (per head). Each thread keeps the tokens of its 2·kMT fragment rows (fa/mma_tile.cuh: rows g
// and g + 8 of every m16 tile). The per-row tokens and slopes live in shared memory (one word per CTA row),
// read only by the tiles that need them, rather than in registers across the loop: dense prefill's tile
// already uses (nearly) all 255.
#pragma once

#include "fa/attention_state.cuh"
#include "fa/fragment_walk.cuh"
#include "fa/intrinsics.cuh"
#include "fa/score_mod.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN
namespace paged_prefill {

// The packed row index of fragment row r = 2·mt + h of this lane, for a warp whose rows start at row0.
FA_DEVICE int fragment_row(int row0, int r) { return row0 + fa::fragment_row(r); }

// Mask of one KV tile (keys key0 + [0, 8·kNB)) for packed rows: key j of a row at token i is kept iff
// i + δ − left ≤ j ≤ min(i + δ + right, Tk − 1) (δ = Tk − Tq; the bounds effective, fa/score_mod.cuh), as
// fa/prefill/mask.cuh does for one head per row. kLeft: check the left bound (variant kernels only).
template <bool kLeft, int kMT, int kNB>
FA_DEVICE void apply_packed_mask(float (&s)[kMT][kNB][4], const int *row_token, int row0, int key0, int diag, int tk,
                                 int left, int right) {
  // One row at a time, its token read here: nothing per row stays live across the tile.
  for_each_score(
      s, [&](int row) { return visible_keys(ld_shared(row_token + row0 + row) + diag, tk, left, right); },
      [&](float &x, const VisibleKeys &keys, int col) { mask_score<kLeft>(x, keys, key0 + col); });
}

// Keys of the tile whose bit is set in hole_bits (bit k: key key0 + k) -> -inf: holes in the block table.
template <int kMT, int kNB> FA_DEVICE void mask_hole_keys(float (&s)[kMT][kNB][4], uint64_t hole_bits) {
  const int t = lane_id() & 3;
#pragma unroll
  for (int nb = 0; nb < kNB; ++nb) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      if ((hole_bits >> (8 * nb + 2 * t + e)) & 1u) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          s[mt][nb][e] = kNegInf;
          s[mt][nb][2 + e] = kNegInf;
        }
      }
    }
  }
}

// Softcap and ALiBi of packed rows, in place, into the exp2 domain (fa/score_mod.cuh): the distance is
// |token + δ − key|, the slope the row's head's.
template <int kMT, int kNB>
FA_DEVICE void apply_packed_score_mod(float (&s)[kMT][kNB][4], const int *row_token, const float *row_slope,
                                      int row0, int key0, int diag, const ScoreMod &mod) {
  struct Row {
    int diag_key;
    float slope_log2;
  };
  for_each_score(
      s, [&](int row) { return Row{ld_shared(row_token + row0 + row) + diag, ld_shared(row_slope + row0 + row)}; },
      [&](float &x, const Row &r, int col) {
        const int dist = r.diag_key - (key0 + col);
        x = mod.apply(x, r.slope_log2, dist < 0 ? -dist : dist);
      });
}

} // namespace paged_prefill
FA_NAMESPACE_END
