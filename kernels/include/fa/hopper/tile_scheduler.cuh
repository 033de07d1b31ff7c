// Which work tiles (query tile, query head, sequence) a CTA of the sm_90a prefill kernel runs: a static
// persistent schedule (FA3's StaticPersistentTileScheduler; varlen as its varlen scheduler counts tiles). The
// launch has min(ctas, tiles) CTAs — ctas is what the GPU holds at once, SM count x occupancy, from the host
// (src/prefill/sm90.rs) — and CTA b runs tiles b, b + grid, b + 2·grid, ...: the barriers are initialised
// and the producer's ring runs on across tiles, and the next tile's Q and K loads overlap the last one's
// epilogue. The order is fixed, so results and the assignment do not depend on timing.
//
// Tile order, dense: non-causal, the query tiles of one (head, sequence) are consecutive (CTAs running
// together share K/V in L2). Causal: the query tiles lower down a sequence visit more KV tiles, so the order
// runs the last query tile of every (head, sequence) first, then the one before, ... (longest first: the
// short ones fill the tail).
// Varlen: only the tiles that have rows are numbered — sequence by sequence, within one its heads, within a
// head its query tiles (causal: the last first) — so no CTA walks the empty tiles that counting every
// sequence as the longest would leave (a batch of 1000 short sequences and one of 16k tokens: 99 % of
// those). Each role keeps a cursor into the sequences, which only moves forward (a CTA's tiles come in
// increasing order), so a CTA reads every cu_seqlens entry about once, not once per tile (FA3's varlen
// scheduler does a warp's prefix sum per lookup instead; the producer here is one thread, with 24
// registers). The launch's grid is still sized by the dense count (the host does not read cu_seqlens);
// CTAs whose first index is past the last tile exit at once.
#pragma once

#include "fa/abi.h"
#include "fa/intrinsics.cuh"
#include "fa/prefill/seq_info.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN
namespace hopper {

struct WorkTile {
  int m_block, head, batch;
};

struct TileScheduler {
  int m_blocks, heads, batch;
  bool causal;
  int br;                       // query rows per tile
  const int32_t *cu_seqlens_q;  // varlen (else nullptr)
  int total_q;

  FA_DEVICE static TileScheduler of(const FaPrefillParams &p, int br) {
    return TileScheduler{(p.seqlen_q + br - 1) / br, p.heads_q, p.batch, p.causal != 0, br, p.cu_seqlens_q, p.total_q};
  }
  // The first tile of this CTA, and the stride between its tiles.
  FA_DEVICE static int first() { return block_idx().x; }
  FA_DEVICE static int stride() { return grid_dim().x; }

  // Varlen: where the walk stands — sequence b, whose indices start at `before`. A CTA's tiles come in
  // increasing order, so its walk only moves forward: over the whole launch it reads each sequence's
  // cu_seqlens once (plus once per tile for the sequence it stands on).
  struct Cursor {
    int b = 0, before = 0;
  };

  // Whether t is a work tile, and which (false: past the last one). `cur` is the caller's walk (varlen; the
  // t of successive calls must not decrease).
  FA_DEVICE bool tile(int t, WorkTile &out, Cursor &cur) const {
    if (cu_seqlens_q != nullptr) {
      // Sequence b holds tiles(b) · heads consecutive indices: its query tiles (lengths clamped as seq_info
      // clamps them) for each head. At most m_blocks of them, as the dense count: a sequence longer than the
      // call's seqlen_q (bad cu_seqlens on a GPU, docs/semantics.md) keeps its first rows, and the sum stays
      // below the launch's tile count (int32, checked by the launcher).
      for (; cur.b < batch; ++cur.b) {
        int start, len;
        prefill::varlen_bounds(cu_seqlens_q, cur.b, total_q, start, len);
        const int tiles = (len + br - 1) / br, n = tiles < m_blocks ? tiles : m_blocks;
        if (t < cur.before + n * heads) {
          const int r = t - cur.before, m = r % n;
          out = WorkTile{causal ? n - 1 - m : m, r / n, cur.b};
          return true;
        }
        cur.before += n * heads;
      }
      return false;
    }
    if (t >= m_blocks * heads * batch) return false;
    if (causal) {
      const int per_block = heads * batch, rest = t % per_block;
      out = WorkTile{m_blocks - 1 - t / per_block, rest % heads, rest / heads};
    } else {
      const int rest = t / m_blocks;
      out = WorkTile{t % m_blocks, rest % heads, rest / heads};
    }
    return true;
  }
};

} // namespace hopper
FA_NAMESPACE_END
