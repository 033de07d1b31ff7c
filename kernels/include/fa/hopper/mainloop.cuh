// A consumer warpgroup of the sm_90a prefill kernel: 64 query rows (warp w of the warpgroup owns rows
// 16w..16w+15, wgmma's accumulator layout), all head-dim columns. Per KV tile, top down:
//   wait for the stage's full barrier;
//   S = Q Kᵀ          wgmma m64n{Bc}k16 SS, D/16 steps: Q and K K-major from their 128B-swizzled panels;
//   (varlen, ragged top tile: the V rows past the sequence end are zeroed, see zero_v_rows)
//   mask S            only the tiles kv_block_range marks (diagonal, window edges, ragged Tk);
//   online softmax    fa/online_softmax.cuh on the accumulator (its registers are mma C fragments);
//   O += P V          wgmma m64n{D}k16 RS, Bc/16 steps: P packed to 16-bit A fragments in registers, V
//                     MN-major (head dim contiguous) from its panels;
//   release the stage (one arrive per warpgroup on its empty barrier, after the wgmma_wait that
//   completes every read of it).
// What this first version does not yet do (docs: README "sm_90a kernel"): pingpong between the two
// consumer warpgroups and issuing S(n-1) before the softmax of tile n; both only reorder this loop.
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

// Named barrier of the two consumer warpgroups (id 0 is sync_threads').
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

// Rows [valid, Bc) of every V panel of a stage set to 0 by both consumer warpgroups (whole 128-byte rows:
// the swizzle only permutes chunks within a row). In varlen those rows are the next sequence's: their P is
// 0, but 0 · NaN would still be NaN. The proxy fence makes the stores visible to wgmma; the named barrier
// to the other warpgroup (both read the whole stage).
template <class Tr> FA_DEVICE void zero_v_rows(unsigned char *sV, int valid) {
  constexpr int kConsumerThreads = Tr::kConsumers * kWarpgroupThreads;
  const int t = thread_idx() - kWarpgroupThreads;
  const int chunks = (Tr::kBc - valid) * (kPanelRowBytes / 16);
#pragma unroll
  for (int p = 0; p < Tr::kPanels; ++p) {
    Bytes16 *rows = reinterpret_cast<Bytes16 *>(sV + p * Tr::kKvPanelBytes + valid * kPanelRowBytes);
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
};

template <class T, class Tr>
FA_DEVICE void consume(unsigned char *smem, const Barriers<Tr::kStages> &bars, const prefill::KvBlockRange &range,
                       const ConsumerTile &ct, float scale_log2, WgmmaAcc<Tr::kHeadDim> &o,
                       OnlineSoftmax<1> &softmax) {
  constexpr int kD = Tr::kHeadDim, kBc = Tr::kBc;
  const bool leader = thread_idx() % kWarpgroupThreads == 0;
  const unsigned char *sQ = smem + ct.wg * 64 * kPanelRowBytes; // this warpgroup's 64 rows of each panel
  mbarrier_wait(bars.q_full, 0);
  PipelineState<Tr::kStages> st;
  for (int n = range.n_end - 1; n >= range.n_begin; --n, st.advance()) {
    unsigned char *sK = smem + Tr::kQBytes + st.stage * Tr::kStageBytes, *sV = sK + Tr::kKvTileBytes;
    const int key0 = n * kBc;
    mbarrier_wait(&bars.full[st.stage], st.phase);

    WgmmaAcc<kBc> s;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      wgmma_ss<T, kBc, Major::K, Major::K>(s, k_major_desc(sQ, Tr::kQPanelBytes, kk),
                                           k_major_desc(sK, Tr::kKvPanelBytes, kk), kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operand(s);

    if (ct.zero_ragged_v && key0 + kBc > ct.tk) zero_v_rows<Tr>(sV, ct.tk - key0);
    float(&sf)[1][kBc / 8][4] = fragments(s);
    if (n >= range.n_mask_begin || n < range.n_interior_begin)
      prefill::apply_kv_mask<true>(sf, ct.warp_row0, key0, ct.tq, ct.tk, ct.window.left, ct.window.right);
    softmax.update(sf, fragments(o), scale_log2);

    // P as RS A fragments: k16 step kk covers C fragments 2kk (columns 0-7) and 2kk+1 (8-15); registers
    // (row g, cols 2q..), (row g+8, cols 2q..), (row g, cols 8+2q..), (row g+8, cols 8+2q..).
    WgmmaFragA pa[kBc / 16];
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
      pa[kk][0] = pack2<T>(sf[0][2 * kk][0], sf[0][2 * kk][1]);
      pa[kk][1] = pack2<T>(sf[0][2 * kk][2], sf[0][2 * kk][3]);
      pa[kk][2] = pack2<T>(sf[0][2 * kk + 1][0], sf[0][2 * kk + 1][1]);
      pa[kk][3] = pack2<T>(sf[0][2 * kk + 1][2], sf[0][2 * kk + 1][3]);
      wgmma_fence_operand(pa[kk]);
    }
    wgmma_fence_operand(o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk)
      wgmma_rs<T, kD, Major::MN>(o, pa[kk], mn_major_desc(sV, Tr::kKvPanelBytes, kk), true);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operand(o);
    if (leader) mbarrier_arrive(&bars.empty[st.stage]);
  }
}

} // namespace hopper
FA_NAMESPACE_END
