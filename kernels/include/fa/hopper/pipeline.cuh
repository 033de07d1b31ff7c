// The K/V ring of the sm_90a prefill kernel: kStages stages, each with two "full" mbarriers, one for K and one
// for V (the producer's arrive.expect_tx plus the TMA bytes complete each: S = Q Kᵀ starts as soon as K has
// landed, V only has to be there for P V), and an "empty" mbarrier (one arrive per consumer warpgroup once
// its wgmmas on the stage completed).
//
// PipelineState is the position in the ring: the stage index and the phase bit of that stage's current use.
// Both sides walk the same sequence of KV tiles, so the i-th tile is in stage i % kStages, used for the
// (i / kStages)-th time. A consumer waits for full_k / full_v with parity `phase`; the producer waits for empty with
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

// The CTA's mbarriers (in shared memory, after the tiles).
template <int kStages> struct Barriers {
  static constexpr int kCount = 1 + 3 * kStages;
  uint64_t *q_full; // Q tile landed (one expect_tx arrive + bytes)
  uint64_t *full_k; // [kStages]
  uint64_t *full_v; // [kStages]
  uint64_t *empty;  // [kStages]

  FA_DEVICE static Barriers at(unsigned char *base) {
    uint64_t *b = reinterpret_cast<uint64_t *>(base);
    return Barriers{b, b + 1, b + 1 + kStages, b + 1 + 2 * kStages};
  }

  // One thread initialises; the caller synchronises the CTA before any use.
  FA_DEVICE void init(int consumers) const {
    mbarrier_init(q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full_k[s], 1);
      mbarrier_init(&full_v[s], 1);
      mbarrier_init(&empty[s], consumers);
    }
  }
};

} // namespace hopper
FA_NAMESPACE_END
