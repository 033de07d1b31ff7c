// The K/V ring of the sm_90a prefill kernel: kStages stages, each holding the K and the V of one KV tile,
// with separate barriers for the two (FA3's pipeline_k and pipeline_v):
//   full_k / full_v: the producer's arrive.expect_tx plus the TMA bytes complete each (S = Q Kᵀ starts as
//     soon as K has landed; V only has to be there for P V);
//   empty_k / empty_v: one arrive per consumer warpgroup, K as soon as its S = Q Kᵀ completed (wgmma_wait<1>
//     of the iteration that issued it) and V once its P V completed (wgmma_wait<0> of the next iteration).
// With one empty barrier per stage, K and V of a tile would be freed together, after the P V that comes an
// iteration after the S: each iteration holds two stages (K of tile n, V of tile n−1), so with two stages
// the next tile's K could only be requested once both consumers ended the previous iteration — every tile
// would wait for a full TMA latency. Freed separately, K of tile n+1 is requested while tile n is in use.
//
// Q has its own pair, reused by the persistent loop (fa/hopper/tile_scheduler.cuh): q_full (the producer's
// arrive, with the Q tile's bytes when the work tile has KV tiles) and q_empty (every consumer warp, once
// its epilogue has read its rows of the Q buffer, which it stages O in).
//
// PipelineState is the position in a ring: the stage index and the phase bit of that stage's current use.
// Both sides walk the same sequence of KV tiles, so the i-th tile is in stage i % kStages, used for the
// (i / kStages)-th time. A consumer waits for full with parity `phase`; the producer waits for empty with
// parity `phase ^ 1` — for a stage's first use that is the phase "before the first", which counts as
// completed, so the first kStages waits pass at once.
#pragma once

#include "fa/intrinsics.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN
namespace hopper {

template <int kStages> struct PipelineState {
  int stage = 0;
  int phase = 0;

  FA_DEVICE void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
};

// The CTA's mbarriers (in shared memory, after the tiles): one base pointer, each barrier's address
// computed where it is used (holding the 2 + 4·kStages addresses across the persistent loop spilled).
template <int kStages> struct Barriers {
  static constexpr int kCount = 2 + 4 * kStages;
  uint64_t *b;

  FA_DEVICE static Barriers at(unsigned char *base) { return Barriers{reinterpret_cast<uint64_t *>(base)}; }
  FA_DEVICE uint64_t *q_full() const { return b; }                  // the producer's arrive (+ Q's bytes)
  FA_DEVICE uint64_t *q_empty() const { return b + 1; }             // one arrive per consumer warp
  FA_DEVICE uint64_t *full_k(int s) const { return b + 2 + s; }     // [kStages]
  FA_DEVICE uint64_t *full_v(int s) const { return b + 2 + kStages + s; }
  FA_DEVICE uint64_t *empty_k(int s) const { return b + 2 + 2 * kStages + s; }
  FA_DEVICE uint64_t *empty_v(int s) const { return b + 2 + 3 * kStages + s; }

  // One thread initialises and fences (the TMA unit may be the first to signal a full barrier); the caller
  // synchronises the CTA before any use.
  FA_DEVICE void init(int consumers) const {
    mbarrier_init(q_full(), 1);
    mbarrier_init(q_empty(), 4 * consumers);
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(full_k(s), 1);
      mbarrier_init(full_v(s), 1);
      mbarrier_init(empty_k(s), consumers);
      mbarrier_init(empty_v(s), consumers);
    }
    fence_mbarrier_init();
  }
};

} // namespace hopper
FA_NAMESPACE_END
