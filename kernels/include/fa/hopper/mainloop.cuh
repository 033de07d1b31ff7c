// A consumer warpgroup of the sm_90a prefill kernel: 64 query rows (warp w of the warpgroup owns rows
// 16w..16w+15, wgmma's accumulator layout), all head-dim columns (Q and K: D, V and O: Dv). Per KV tile,
// top down:
//   wait for the stage's K (its V only before the P·V that reads it);
//   S = Q Kᵀ          wgmma m64n{Bc}k16 SS, D/16 steps: Q and K K-major from their 128B-swizzled panels;
//   (varlen, ragged top tile: the V rows past the sequence end are zeroed, see zero_v_rows; so are the
//   bottom tile's V rows left of every row's window, before its P·V)
//   softcap, ALiBi    when the call has them (fa/score_mod.cuh; a uniform run-time branch, see softmax_step);
//   mask S            only the tiles kv_block_range marks (diagonal, window edges, ragged Tk);
//   online softmax    fa/online_softmax.cuh on the accumulator (its registers are mma C fragments);
//   O += P V          wgmma m64n{Dv}k16 RS, Bc/16 steps: P packed to 16-bit A fragments in registers, V
//                     MN-major (head dim contiguous) from its panels;
//   release K and V separately (one arrive per warpgroup on empty_k / empty_v, each after the wgmma_wait
//   that completes every read of it: fa/hopper/pipeline.cuh).
// The loop overlaps each tile's softmax with the previous tile's P·V (intra-warpgroup overlap) and the
// warpgroups' GEMMs with each other's softmax (pingpong); see consume() and Pingpong below.
#pragma once

#include "fa/hopper/pipeline.cuh"
#include "fa/hopper/traits.cuh"
#include "fa/intrinsics.cuh"
#include "fa/online_softmax.cuh"
#include "fa/prefill/block_range.cuh"
#include "fa/prefill/mask.cuh"
#include "fa/score_mod.cuh"
#include "fa/tile_copy.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN
namespace hopper {

// Named barrier of the consumer warpgroups (id 0 is sync_threads').
constexpr int kConsumerBarrier = 1;

// wgmma descriptors of the 128B-swizzled panels (fa/hopper/traits.cuh). K-major (Q as A, K as B): 8 rows
// per 1024 bytes (SBO), a k16 step is 32 bytes along a 128-byte row, and every 4 steps the next panel.
// MN-major (V as B of P·V: keys are k, head dim is n): 64 n per 128-byte row, the next 64 n one panel
// further (LBO), 8 keys per 1024 bytes (SBO), a k16 step is 16 rows = 2048 bytes.
FA_DEVICE uint64_t k_major_desc(const unsigned char *panel0, int panel_bytes, int kk) {
  return smem_matrix_desc(smem_addr(panel0 + (kk / 4) * panel_bytes + 32 * (kk % 4)), 16, 1024, SmemSwizzle::B128);
}
FA_DEVICE uint64_t mn_major_desc(const unsigned char *panel0, int panel_bytes, int kk) {
  return smem_matrix_desc(smem_addr(panel0 + kk * 16 * kPanelRowBytes), panel_bytes, 1024, SmemSwizzle::B128);
}

// The accumulator as kMT = 1 m16 tile of N/8 mma C fragments (register 4j + i is fragment j, element i),
// the shape the shared softmax and mask code take. The checked access first lets the emulator verify that no
// wgmma in flight owns the registers; the view itself is the same registers.
template <int N> FA_DEVICE float (&fragments(WgmmaAcc<N> &acc))[1][N / 8][4] {
  (void)acc[0];
  return *reinterpret_cast<float(*)[1][N / 8][4]>(acc.raw());
}

// Rows [lo, hi) of every V panel of a stage set to 0 by all consumer warpgroups (whole 128-byte rows: the
// swizzle only permutes chunks within a row). A TMA box brings in whole tiles: in varlen the top tile's rows
// past Tk are the next sequence's, and the bottom tile's rows left of the window are keys no row sees (a
// freed cache's bytes, anything). Their P is 0, but 0 · NaN would still be NaN (docs/semantics.md). The
// proxy fence makes the stores visible to wgmma; the named barrier to the other warpgroups (all read the
// whole stage).
template <class Tr> FA_DEVICE void zero_v_rows(unsigned char *sV, int lo, int hi) {
  constexpr int kConsumerThreads = Tr::kConsumers * kWarpgroupThreads;
  const int t = thread_idx() - kWarpgroupThreads;
  const int chunks = (hi - lo) * (kPanelRowBytes / 16);
#pragma unroll
  for (int p = 0; p < Tr::kPanelsV; ++p) {
    Bytes16 *rows = reinterpret_cast<Bytes16 *>(sV + p * Tr::kKvPanelBytes + lo * kPanelRowBytes);
    for (int i = t; i < chunks; i += kConsumerThreads) st_shared(rows + i, Bytes16{});
  }
  fence_proxy_async();
  named_barrier_sync(kConsumerBarrier, kConsumerThreads);
}

// Everything one consumer warpgroup needs to walk its KV tiles.
struct ConsumerTile {
  int wg;        // consumer index: rows 64·wg.. of the CTA's tile
  int warp_row0; // this warp's first row in the sequence
  int tq, tk;
  WindowBounds window;
  bool zero_ragged_v; // varlen: the top tile's rows past Tk belong to the next sequence
  int first_key;      // the first key a row of the CTA sees (the window's left edge; may be < 0)
  // Softcap and ALiBi (fa/score_mod.cuh), a uniform run-time branch per tile (see softmax_step): the two
  // values the kernel parameters do not hold.
  float tanh_in;    // ScoreMod::tanh_input
  float slope_log2; // this head's ALiBi slope · log2 e (0 without ALiBi)
};

// The scale the online softmax runs with: 1 when softcap or ALiBi have mapped the scores to the exp2 domain.
FA_DEVICE float softmax_scale_log2(const FaPrefillParams &p) {
  return needs_score_mod(p.score_mod) ? 1.0f : p.scale_log2;
}

// Pingpong among the consumer warpgroups, a ring of kConsumers (FA3's warp scheduler barriers): each
// warpgroup issues its wgmmas inside a window that opens when the previous one in the ring has issued its
// own (named barrier kPingpong + c: 128 threads of c wait there, 128 of c − 1 arrive), so the tensor cores
// take the warpgroups in turn and the others' softmax runs meanwhile. The last consumer opens consumer
// 0's first window; each warpgroup opens the next one's window after issuing, except the last consumer
// after its last (nobody waits for it): all have the same windows (the CTA's KV tiles + 1), so every
// barrier generation gets exactly 256 threads, and a warpgroup cannot arrive twice before its successor
// waited once (its next window needs the whole ring to have gone round, the successor included).
// With kEnabled false (D = 256, fa/hopper/traits.cuh) every call is empty: the warpgroups issue freely.
// In the persistent loop each work tile runs its own ring: the last consumer's start() of the next tile
// takes the place of the close() it skipped after its last window.
constexpr int kPingpong = 2; // ids 2 .. 1 + kConsumers
template <int kConsumers, bool kEnabled> struct Pingpong {
  int c;        // this consumer (0 .. kConsumers − 1)
  int windows;  // windows this warpgroup opens in total (tiles + 1)
  int opened = 0;
  FA_DEVICE void start() const {
    if (kEnabled && c == kConsumers - 1) named_barrier_arrive(kPingpong + 0, 2 * kWarpgroupThreads);
  }
  FA_DEVICE void open() const {
    if (kEnabled) named_barrier_sync(kPingpong + c, 2 * kWarpgroupThreads);
  }
  FA_DEVICE void close() {
    ++opened;
    if (kEnabled && (c < kConsumers - 1 || opened < windows))
      named_barrier_arrive(kPingpong + (c + 1) % kConsumers, 2 * kWarpgroupThreads);
  }
};

// S = Q Kᵀ issued (not waited for) into s: D/16 k steps.
template <class T, class Tr>
FA_DEVICE void issue_qk(WgmmaAcc<Tr::kBc> &s, const unsigned char *sQ, const unsigned char *sK) {
#pragma unroll
  for (int kk = 0; kk < Tr::kHeadDim / 16; ++kk) {
    wgmma_ss<T, Tr::kBc, Major::K, Major::K>(s, k_major_desc(sQ, Tr::kQPanelBytes, kk),
                                             k_major_desc(sK, Tr::kKvPanelBytes, kk), kk > 0);
  }
  wgmma_commit();
}

// O += P V issued (not waited for): Bc/16 k steps, P from registers.
template <class T, class Tr>
FA_DEVICE void issue_pv(WgmmaAcc<Tr::kHeadDimV> &o, const WgmmaFragA (&pa)[Tr::kBc / 16], const unsigned char *sV) {
#pragma unroll
  for (int kk = 0; kk < Tr::kBc / 16; ++kk)
    wgmma_rs<T, Tr::kHeadDimV, Major::MN>(o, pa[kk], mn_major_desc(sV, Tr::kKvPanelBytes, kk), true);
  wgmma_commit();
}

// Score variants, mask (on the edge tiles) and the online softmax of one tile's scores, leaving the unnormalised
// probabilities in s and returning in alpha[2] the factor the output rows (g, g + 8) must be rescaled by.
// O is rescaled by the caller, once the P·V wgmma of the previous tile that accumulates into it completed:
// alpha is computed exactly as OnlineSoftmax::update computes it (which gets a dummy accumulator here).
//
// Softcap and ALiBi are a run-time branch, uniform over the CTA, around passes over the tile's scores, not
// a template flag as in the sm_80 kernel (whose D = 128 loop runs at ~250 of 255 registers, where keeping
// both paths live would spill). Here the consumers have 232 registers; the plain path pays the test of
// two kernel parameters per tile and two registers (tanh_in, slope), while a template flag would double the
// sm_90a kernels and prefill_sm90.cu's nvcc time, which the build's budget cannot spare. What it took to
// keep every consumer spill-free (ptxas, sm_90a; docs/usage.md "sm_90a kernel"): the per-score division inline
// (div.rn's slow-path call spilled D = 128 and 256), the softcap and ALiBi as separate passes
// (apply_score_mod_by_pass: the sm_80 single-pass form spilled D = 64), and the ScoreMod rebuilt per tile
// from the kernel parameters (constant-bank operands) rather than held across the loop.
template <class Tr>
FA_DEVICE void softmax_step(WgmmaAcc<Tr::kBc> &s, OnlineSoftmax<1> &softmax, float (&alpha)[2], bool masked,
                            const ConsumerTile &ct, const FaPrefillParams &p, int key0) {
  float(&sf)[1][Tr::kBc / 8][4] = fragments(s);
  const float scale_log2 = softmax_scale_log2(p);
  if (needs_score_mod(p.score_mod)) {
    const ScoreMod mod = ScoreMod::from(p.scale_log2, p.score_mod.softcap, ct.tanh_in);
    apply_score_mod_by_pass(sf, ct.warp_row0, key0, ct.tk - ct.tq, mod, ct.slope_log2);
  }
  if (masked) prefill::apply_kv_mask<true>(sf, ct.warp_row0, key0, ct.tq, ct.tk, ct.window.left, ct.window.right);
  const float m_old[2] = {softmax.row_max[0], softmax.row_max[1]};
  float none[1][1][4] = {};
  softmax.update(sf, none, scale_log2);
#pragma unroll
  for (int h = 0; h < 2; ++h) alpha[h] = fast_exp2(m_old[h] * scale_log2 - max_for_exp(softmax.row_max[h] * scale_log2));
}

// P as RS A fragments: k16 step kk covers C fragments 2kk (columns 0-7) and 2kk+1 (8-15); registers
// (row g, cols 2q..), (row g+8, cols 2q..), (row g, cols 8+2q..), (row g+8, cols 8+2q..).
template <class T, int kBc> FA_DEVICE void pack_p(WgmmaFragA (&pa)[kBc / 16], WgmmaAcc<kBc> &s) {
  float(&sf)[1][kBc / 8][4] = fragments(s);
#pragma unroll
  for (int kk = 0; kk < kBc / 16; ++kk) {
    pa[kk][0] = pack2<T>(sf[0][2 * kk][0], sf[0][2 * kk][1]);
    pa[kk][1] = pack2<T>(sf[0][2 * kk][2], sf[0][2 * kk][3]);
    pa[kk][2] = pack2<T>(sf[0][2 * kk + 1][0], sf[0][2 * kk + 1][1]);
    pa[kk][3] = pack2<T>(sf[0][2 * kk + 1][2], sf[0][2 * kk + 1][3]);
    wgmma_fence_operand(pa[kk]);
  }
}

template <int N> FA_DEVICE void rescale_rows(WgmmaAcc<N> &o, const float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < N / 2; ++i) o[i] *= alpha[(i >> 1) & 1];
}

// The mainloop with intra-warpgroup overlap (FA3): tile n's S = Q K_nᵀ and the previous tile's O += P V
// are issued together, S is waited for alone (wgmma_wait<1>), and the softmax of tile n runs while the
// P·V wgmma is still in flight; O is rescaled after it completes. Tiles run top down (n_end - 1 first).
// Release points (FA3's): K of tile n right after its S completed, V of tile n−1 after its P V did, so the
// producer refills K while this tile's softmax and P V still run (fa/hopper/pipeline.cuh). `st` is the
// ring position of the work tile's first KV tile, and is left past its last (the persistent loop goes on).
// The caller has waited for the Q tile (q_full).
template <class T, class Tr>
FA_DEVICE void consume(unsigned char *smem, const Barriers<Tr::kStages> &bars, const prefill::KvBlockRange &range,
                       const ConsumerTile &ct, const FaPrefillParams &p, WgmmaAcc<Tr::kHeadDimV> &o,
                       OnlineSoftmax<1> &softmax, PipelineState<Tr::kStages> &st) {
  constexpr int kBc = Tr::kBc;
  const bool leader = thread_idx() % kWarpgroupThreads == 0;
  const unsigned char *sQ = smem + ct.wg * 64 * kPanelRowBytes; // this warpgroup's 64 rows of each panel
  auto stage_k = [&](int stage) { return smem + Tr::kQBytes + stage * Tr::kStageBytes; };
  auto stage_v = [&](int stage) { return stage_k(stage) + Tr::kKTileBytes; };
  auto masked = [&](int n) { return n >= range.n_mask_begin || n < range.n_interior_begin; };
  auto release = [&](uint64_t *empty) {
    if (leader) mbarrier_arrive(empty); // the wgmma_wait before it saw the whole warpgroup's reads complete
  };
  Pingpong<Tr::kConsumers, Tr::kPingpong> pingpong{ct.wg, range.n_end - range.n_begin + 1};
  pingpong.start();

  // The top tile: S alone, then its softmax (O is still 0: nothing to rescale).
  int n = range.n_end - 1;
  WgmmaAcc<kBc> s;
  WgmmaFragA pa[kBc / 16];
  float alpha[2];
  mbarrier_wait(bars.full_k(st.stage), st.phase);
  pingpong.open();
  wgmma_fence();
  issue_qk<T, Tr>(s, sQ, stage_k(st.stage));
  pingpong.close();
  wgmma_wait<0>();
  wgmma_fence_operand(s);
  release(bars.empty_k(st.stage));
  if (ct.zero_ragged_v && n * kBc + kBc > ct.tk) {
    mbarrier_wait(bars.full_v(st.stage), st.phase); // the rows to zero have landed
    zero_v_rows<Tr>(stage_v(st.stage), ct.tk - n * kBc, kBc);
  }
  softmax_step<Tr>(s, softmax, alpha, masked(n), ct, p, n * kBc);
  pack_p<T, kBc>(pa, s);
  PipelineState<Tr::kStages> prev = st;
  st.advance();

  for (--n; n >= range.n_begin; --n, st.advance()) {
    mbarrier_wait(bars.full_k(st.stage), st.phase);
    mbarrier_wait(bars.full_v(prev.stage), prev.phase);
    wgmma_fence_operand(o);
    pingpong.open();
    wgmma_fence();
    issue_qk<T, Tr>(s, sQ, stage_k(st.stage));
    issue_pv<T, Tr>(o, pa, stage_v(prev.stage));
    pingpong.close();
    wgmma_wait<1>(); // S of tile n; the previous tile's P V may still run
    wgmma_fence_operand(s);
    release(bars.empty_k(st.stage));
    softmax_step<Tr>(s, softmax, alpha, masked(n), ct, p, n * kBc);
    wgmma_wait<0>(); // P V done: the previous tile's V is free, O and the P registers may be touched
    wgmma_fence_operand(o);
    release(bars.empty_v(prev.stage));
    rescale_rows(o, alpha);
    pack_p<T, kBc>(pa, s);
    prev = st;
  }

  // The last tile's P V; first its V rows left of the window, if any (uniform over the CTA).
  mbarrier_wait(bars.full_v(prev.stage), prev.phase);
  const int hidden = ct.first_key - range.n_begin * kBc;
  if (hidden > 0) zero_v_rows<Tr>(stage_v(prev.stage), 0, hidden);
  wgmma_fence_operand(o);
  pingpong.open();
  wgmma_fence();
  issue_pv<T, Tr>(o, pa, stage_v(prev.stage));
  pingpong.close();
  wgmma_wait<0>();
  wgmma_fence_operand(o);
  release(bars.empty_v(prev.stage));
}

} // namespace hopper
FA_NAMESPACE_END
