// The producer warpgroup of the sm_90a prefill kernel: one thread issues every TMA load of the CTA — per
// work tile the Q tile, then the K and V tiles of each visited KV tile, top down, into the ring
// (fa/hopper/pipeline.cuh).
// A tile is D/64 boxes of 64 columns (one 128-byte swizzle span) per operand (Dv/64 for V), completing on the stage's
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

// The kPanels panels (D/64, or Dv/64 for V) of one tile starting at row `row`, into `dst`, under L2 `policy`.
template <int kPanels>
FA_DEVICE void load_panels(unsigned char *dst, int panel_bytes, const FaTensorMap *map, uint64_t *bar, int row,
                           int head, int batch, L2Policy policy) {
#pragma unroll
  for (int p = 0; p < kPanels; ++p) {
    const int32_t c[4] = {p * kPanelCols, row, head, batch};
    tma_load(dst + p * panel_bytes, map, bar, c, policy);
  }
}

// Loads the Q tile (once its buffer is free: the previous work tile's epilogue read it) and then KV tiles
// n_end-1 down to n_begin (the order the consumers visit them), K of each tile before V of the one above it
// (FA3's order: S = Q Kᵀ of the next tile is what the consumers wait for first); a work tile without KV
// tiles only arrives on q_full. `kv` is the ring position of the first KV tile and is left past the last.
// `work` counts the CTA's work tiles so far (their q_full / q_empty phases). Called by one thread.
// L2 policies (FA3's): Q evict_first (this CTA alone reads it, once), K and V evict_last (every query tile of
// the head, and every query head of its group, reads them again).
template <class Tr>
FA_DEVICE void produce(const FaPrefillSm90Params &p, unsigned char *smem, const Barriers<Tr::kStages> &bars,
                       const TmaRows &at, int n_begin, int n_end, int work, PipelineState<Tr::kStages> &kv) {
  mbarrier_wait(bars.q_empty(), (work & 1) ^ 1);
  if (n_end <= n_begin) {
    mbarrier_arrive(bars.q_full());
    return;
  }
  mbarrier_arrive_expect_tx(bars.q_full(), Tr::kQBytes);
  const bool hints = p.l2_hints != 0; // off: evict_normal, the A/B baseline (Sm90Steps::l2_hints)
  const L2Policy q_policy = hints ? l2_evict_first() : l2_evict_normal();
  const L2Policy kv_policy = hints ? l2_evict_last() : l2_evict_normal();
  load_panels<Tr::kPanels>(smem, Tr::kQPanelBytes, &p.q_map, bars.q_full(), at.q_row0, at.head, at.batch, q_policy);
  auto stage = [&](const PipelineState<Tr::kStages> &s) { return smem + Tr::kQBytes + s.stage * Tr::kStageBytes; };
  auto load_k = [&](int n, const PipelineState<Tr::kStages> &s) {
    mbarrier_wait(bars.empty_k(s.stage), s.phase ^ 1); // every consumer's S of this stage's last K completed
    mbarrier_arrive_expect_tx(bars.full_k(s.stage), Tr::kKTileBytes);
    load_panels<Tr::kPanels>(stage(s), Tr::kKvPanelBytes, &p.k_map, bars.full_k(s.stage), at.k_row0 + n * Tr::kBc,
                    at.head_kv, at.batch, kv_policy);
  };
  auto load_v = [&](int n, const PipelineState<Tr::kStages> &s) {
    mbarrier_wait(bars.empty_v(s.stage), s.phase ^ 1); // every consumer's P V of this stage's last V completed
    mbarrier_arrive_expect_tx(bars.full_v(s.stage), Tr::kVTileBytes);
    load_panels<Tr::kPanelsV>(stage(s) + Tr::kKTileBytes, Tr::kKvPanelBytes, &p.v_map, bars.full_v(s.stage),
                    at.k_row0 + n * Tr::kBc, at.head_kv, at.batch, kv_policy);
  };
  PipelineState<Tr::kStages> v = kv;
  int n = n_end - 1;
  load_k(n, kv);
  for (--n; n >= n_begin; --n) {
    kv.advance();
    load_k(n, kv);
    load_v(n + 1, v);
    v.advance();
  }
  load_v(n_begin, v);
  kv.advance();
}

// After the last work tile: stay until the consumers have released every stage, so that no load of this
// thread is still in flight when it exits (for a stage never used, the waits pass at once).
template <class Tr>
FA_DEVICE void producer_drain(const Barriers<Tr::kStages> &bars, PipelineState<Tr::kStages> kv) {
  for (int i = 0; i < Tr::kStages; ++i, kv.advance()) {
    mbarrier_wait(bars.empty_k(kv.stage), kv.phase ^ 1);
    mbarrier_wait(bars.empty_v(kv.stage), kv.phase ^ 1);
  }
}

} // namespace hopper
FA_NAMESPACE_END
