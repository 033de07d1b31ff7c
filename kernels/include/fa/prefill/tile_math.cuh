// The two tile GEMMs of the FA2 forward pass on mma.m16n8k16 fragments, shared by dense prefill
// (kernels/prefill.cu) and paged prefill (kernels/paged_prefill.cu): S = Q Kᵀ over the full head dim, and
// O += P V with P taken from the registers of S. Cfg is a prefill TileConfig (fa/prefill/tile_config.cuh).
#pragma once

#include "fa/intrinsics.cuh"
#include "fa/mma_tile.cuh"
#include "fa/swizzle.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN
namespace prefill {

// S[kMT][kBc/8] = Q[warp rows] · K[buffer]ᵀ over the full head dim. Lane: LaneAddress or XorLaneAddress
// (fa/swizzle.cuh) of Cfg::kHeadDim.
template <class T, class Cfg, class Lane>
FA_DEVICE void gemm_qk(float (&s)[Cfg::kMTiles][Cfg::kBc / 8][4], const T *sQ, const T *sK, int warp_row0,
                       const Lane &a_lane, const Lane &b_lane) {
  sQ = a_lane.bind(sQ);
  sK = b_lane.bind(sK);
#pragma unroll
  for (int k0 = 0; k0 < Cfg::kHeadDim; k0 += 16) {
    uint32_t a[Cfg::kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt) load_a_16x16(a[mt], sQ, a_lane, warp_row0 + 16 * mt, k0);
#pragma unroll
    for (int n0 = 0; n0 < Cfg::kBc; n0 += 16) {
      uint32_t b[4];
      load_b_16x16_nk(b, sK, b_lane, n0, k0);
#pragma unroll
      for (int mt = 0; mt < Cfg::kMTiles; ++mt) mma_16x16<T>(s[mt][n0 / 8], s[mt][n0 / 8 + 1], a[mt], b);
    }
  }
}

// O[kMT][D/8] += P · V[buffer], P taken from the probabilities left in s (C -> A fragment reuse).
template <class T, class Cfg, class Lane>
FA_DEVICE void gemm_pv(float (&o)[Cfg::kMTiles][Cfg::kHeadDim / 8][4], const float (&s)[Cfg::kMTiles][Cfg::kBc / 8][4],
                       const T *sV, const Lane &v_lane) {
  sV = v_lane.bind(sV);
#pragma unroll
  for (int k0 = 0; k0 < Cfg::kBc; k0 += 16) {
    uint32_t a[Cfg::kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt) c_pair_to_a<T>(a[mt], s[mt][k0 / 8], s[mt][k0 / 8 + 1]);
#pragma unroll
    for (int n0 = 0; n0 < Cfg::kHeadDim; n0 += 16) {
      uint32_t b[4];
      load_b_16x16_kn_trans(b, sV, v_lane, k0, n0);
#pragma unroll
      for (int mt = 0; mt < Cfg::kMTiles; ++mt) mma_16x16<T>(o[mt][n0 / 8], o[mt][n0 / 8 + 1], a[mt], b);
    }
  }
}

} // namespace prefill
FA_NAMESPACE_END
