// Compile-time tile shapes of the prefill kernel, one per tile width (dtype-independent); kHeadDim is the
// width W, which serves every head dim fa/head_dim.cuh maps to it (columns past the head dim predicated
// off). Mirrored on the host by `prefill::TileConfig::for_head_dim` (src/prefill/mod.rs), which computes the
// grid; keep both in step.
//
// Every config uses 4 warps (128 threads) and the FA2 "split-Q" partition: each warp owns 16·kMTiles query
// rows of the Br-row tile and all Bc keys, so softmax statistics never leave the warp. 32 rows per warp
// (kMTiles = 2) halves the shared-memory traffic per FLOP against 16 rows (every warp reads the whole K and
// V tile): on sm_90 that is the difference between smem-bound and tensor-bound. The binding constraint is
// registers (255/thread, no spills allowed): O is kMTiles·D/2 fp32 and S is kMTiles·Bc/2 fp32 per thread,
// and ptxas needs ~60-90 more for fragments, addresses and its own load hoisting.
//
// Shared memory is Q (Br x D) + kStages buffers of K and V (Bc x D each), 16-bit. The kernel prefetches
// one tile ahead; with 3 buffers the buffer being refilled was last read two tiles ago, so one barrier per
// tile suffices (2 buffers need a second barrier before the refill). Everything must fit sm_86/89's
// 99 KiB opt-in; on sm_90 (228 KiB) up to 2 CTAs/SM, which is also the register limit at 255 regs.
//
//   D   | kMTiles | Br  | Bc | stages | smem   | why
//   32  | 2       | 128 | 64 | 3      | 32 KiB | O 32 + S 64 regs: plenty of room
//   64  | 2       | 128 | 64 | 3      | 64 KiB | O 64 + S 64 regs (~225-240 used)
//   96  | 2       | 128 | 32 | 3      | 60 KiB | O 96 + S 32: Bc 64 spills
//   128 | 2       | 128 | 32 | 3      | 80 KiB | O 128 + S 32 (~250 used); Bc 64 (FA2's 128x64) spills:
//       |         |     |    |        |        | measured below
//   160 | 1       | 64  | 32 | 3      | 80 KiB | 2 m-tiles: O 160 + S >= 16 leaves too little for ptxas;
//       |         |     |    |        |        | Bc 64 needs 2 stages and 100 KiB
//   192 | 1       | 64  | 32 | 3      | 96 KiB | as 160 (O 96 + S 16 regs)
//   256 | 1       | 64  | 32 | 2      | 96 KiB | O alone is 128 regs at 16 rows/warp; Bc 64 or a third
//       |         |     |    |        |        | stage would need more than sm_86/89's 99 KiB
//
// The d128 key tile, measured (nvcc 13.0, 2026-12-01; ptxas -v and cuobjdump -sass of the d128 kernels,
// counting the instructions of the mask-free loop per 64 keys):
//   128 x 32, 3 stages: spill-free; 2 x 572 = 1144 instructions per 64 keys (256 HMMA, 264 FMUL, 72 MUFU,
//                       96 LDSM, 2 barriers).
//   128 x 64, 2 stages (the only 64-key shape under 99 KiB): 909 instructions per 64 keys (256 HMMA, 132
//                       FMUL, 68 MUFU, 80 LDSM, 2 barriers), i.e. ~20% fewer issue slots per key; but ptxas
//                       spills 40 bytes (sm_80) / 28 bytes (sm_90a) in the plain kernel and 72 bytes in the
//                       _mod kernel -- mostly sequence offsets parked across the loop, 1-4 local loads per
//                       tile inside it. Before the lazy O rescale (fa/online_softmax.cuh) it spilled 164
//                       bytes with 13-14 local loads + 4 stores per tile.
// FA2 runs 128 x 64 in 255 registers; we have not yet found the ~10 registers our context holds beyond its
// (tried: 16-bit P before P.V, K/V bases in shared memory, recomputing the sequence offsets for the
// epilogue -- none removed the spill). Until then d128 keeps the spill-free 128 x 32: the build forbids
// spills, and the 64-key tile's gain (~20% fewer non-tensor issue slots) is a prediction, not a measurement.
//
// Why 160 and 192 exist (fa/head_dim.cuh; without them dims 136-192 would run at 256): padding 160 to 256
// wastes 37% of the MMAs (192: 25%) in a compute-bound kernel, while the two widths add 8 kernels to
// prefill.cu's nvcc time: measured (4 arches, nvcc -fatbin of prefill.cu alone, user CPU, this 2-core
// machine shared with other builds): 20 kernels 59 s, 28 kernels 82-90 s (+40-50%). 224 is not built:
// dims 200-224 at 256 are at most 28% more MMAs (224: 14%).
#pragma once

#include "fa/swizzle.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN
namespace prefill {

template <int kHeadDim> struct TileConfig;

// The ldmatrix lane addressing of fa/swizzle.cuh: kVariants registers per operand, or one (kXor).
template <bool kXor> struct LaneSelect {
  template <int kCols> using type = LaneAddress<kCols>;
};
template <> struct LaneSelect<true> {
  template <int kCols> using type = XorLaneAddress<kCols>;
};

// kLean_: the register-lean KV loop (measured above): XorLaneAddress lanes; the K/V bases and the epilogue's
// offsets parked in shared memory (48 bytes per warp), the K/V loads by RowWalkCopy; the softmax row sums
// parked in shared memory (16 bytes per thread) between updates.
template <int kHeadDim_, int kMTiles_, int kBc_, int kStages_, bool kLean_ = false> struct TileShape {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kMTiles = kMTiles_;        // m16 tiles per warp
  static constexpr int kBr = 16 * kMTiles * kWarps; // query rows per CTA
  static constexpr int kBc = kBc_;                 // keys per KV tile
  static constexpr int kStages = kStages_;         // K/V tile buffers (2 or 3)
  static constexpr bool kLean = kLean_;
  // Q, the K/V buffers, and (lean) the parked K/V bases and row sums (prefill.cu).
  static constexpr int kSmemBytes = (kBr + 2 * kStages * kBc) * kHeadDim * 2 + (kLean ? 48 * kWarps + 16 * kThreads : 0);
  template <int kCols> using LaneOf = typename LaneSelect<kLean>::template type<kCols>;
  using Lane = LaneOf<kHeadDim>;
  static_assert(kBc % 16 == 0 && kHeadDim % 16 == 0, "mma k/n steps are 16 wide");
  static_assert(kStages == 2 || kStages == 3, "double or triple buffering");
  static_assert(kSmemBytes <= 99 * 1024, "must fit the 99 KiB opt-in of sm_86/sm_89");
};

template <> struct TileConfig<32> : TileShape<32, 2, 64, 3> {};
template <> struct TileConfig<64> : TileShape<64, 2, 64, 3> {};
template <> struct TileConfig<96> : TileShape<96, 2, 32, 3> {};
template <> struct TileConfig<128> : TileShape<128, 2, 64, 2, true> {};
template <> struct TileConfig<160> : TileShape<160, 1, 32, 3> {};
template <> struct TileConfig<192> : TileShape<192, 1, 32, 3> {};
template <> struct TileConfig<256> : TileShape<256, 1, 32, 2> {};

// The _mod kernels' tiles (softcap, ALiBi, a left window bound): TileConfig's, except d128, where the per-score
// work of the variants (the softcap's exp2 and IEEE division, ALiBi's distance) leaves too few registers for
// the 64-key tile (measured above), so the _mod kernel keeps the spill-free 128 x 32.
template <int kHeadDim> struct ModTileConfig : TileConfig<kHeadDim> {};
template <> struct ModTileConfig<128> : TileShape<128, 2, 32, 3> {};

// The tile of the kernel of width kHeadDim, plain or _mod (kVariant).
template <int kHeadDim, bool kVariant> struct KernelTileSelect {
  using type = TileConfig<kHeadDim>;
};
template <int kHeadDim> struct KernelTileSelect<kHeadDim, true> {
  using type = ModTileConfig<kHeadDim>;
};
template <int kHeadDim, bool kVariant> using KernelTile = typename KernelTileSelect<kHeadDim, kVariant>::type;

// Whether the kernel of width kHeadDim serves head dims below it (predicated columns, fa/head_dim.cuh). Not
// 128: that config runs at 255 registers, and the per-copy column predicate in its K/V loop makes its _mod
// kernel spill on sm_90a (16 bytes; a skip-the-copy branch instead of a predicate spills the same), so its
// kernels compile without any column logic (exactly their code before head dims were generalised) and dims
// 104-120 run at 160. Revisit with the d128 retiling.
template <int kHeadDim> constexpr bool kPredicatedColumns = kHeadDim != 128;

} // namespace prefill
FA_NAMESPACE_END
