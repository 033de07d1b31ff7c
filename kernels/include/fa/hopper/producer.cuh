// The producer warpgroup of the sm_90a prefill kernel: one thread issues every TMA load of the CTA — the Q
// tile once, then the K and V tiles of each visited KV tile, top down, into the ring (fa/hopper/pipeline.cuh).
// A tile is D/64 boxes of 64 columns (one 128-byte swizzle span) per operand, completing on the stage's
// full_k or full_v barrier, whose expect_tx declares the whole boxes' bytes (out-of-bounds rows included: the TMA unit
// zero-fills them and counts them).
#pragma once

#include "fa/abi.h"
#include "fa/hopper/pipeline.cuh"
#include "fa/intrinsics.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN
namespace hopper {

// Where this CTA's rows are in the tensor maps' coordinates (dimension 1 = rows, 2 = head, 3 = batch).
struct TmaRows {
  int q_row0;  // first query row of the CTA's tile
  int k_row0;  // key 0 of the sequence
  int head, head_kv, batch;
};

// The D/64 panels of one tile of `rows` rows starting at `row`, into `dst`.
template <class Tr>
FA_DEVICE void load_panels(unsigned char *dst, int panel_bytes, const FaTensorMap *map, uint64_t *bar, int row,
                           int head, int batch) {
#pragma unroll
  for (int p = 0; p < Tr::kPanels; ++p) {
    const int32_t c[4] = {p * kPanelCols, row, head, batch};
    tma_load(dst + p * panel_bytes, map, bar, c);
  }
}

// Loads KV tiles n_end-1 down to n_begin (the order the consumers visit them). Called by one thread.
template <class Tr>
FA_DEVICE void produce(const FaPrefillSm90Params &p, unsigned char *smem, const Barriers<Tr::kStages> &bars,
                       const TmaRows &at, int n_begin, int n_end) {
  mbarrier_arrive_expect_tx(bars.q_full, Tr::kQBytes);
  load_panels<Tr>(smem, Tr::kQPanelBytes, &p.q_map, bars.q_full, at.q_row0, at.head, at.batch);
  PipelineState<Tr::kStages> st;
  for (int n = n_end - 1; n >= n_begin; --n, st.advance()) {
    mbarrier_wait(&bars.empty[st.stage], st.phase ^ 1); // both consumers released this stage's last use
    unsigned char *stage = smem + Tr::kQBytes + st.stage * Tr::kStageBytes;
    const int row = at.k_row0 + n * Tr::kBc;
    mbarrier_arrive_expect_tx(&bars.full_k[st.stage], Tr::kKvTileBytes);
    load_panels<Tr>(stage, Tr::kKvPanelBytes, &p.k_map, &bars.full_k[st.stage], row, at.head_kv, at.batch);
    mbarrier_arrive_expect_tx(&bars.full_v[st.stage], Tr::kKvTileBytes);
    load_panels<Tr>(stage + Tr::kKvTileBytes, Tr::kKvPanelBytes, &p.v_map, &bars.full_v[st.stage], row, at.head_kv,
                    at.batch);
  }
  // Stay until the consumers have released every stage: then no load of this thread is still in flight
  // when it exits (for a stage never used, the wait passes at once).
  for (int i = 0; i < Tr::kStages; ++i, st.advance()) mbarrier_wait(&bars.empty[st.stage], st.phase ^ 1);
}

} // namespace hopper
FA_NAMESPACE_END
