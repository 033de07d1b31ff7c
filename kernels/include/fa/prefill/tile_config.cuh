// Compile-time tile shapes of the prefill kernel, one per tile width (dtype-independent); kHeadDim is the
// width W, which serves every head dim fa/head_dim.cuh maps to it (columns past the head dim predicated
// off). The host reads them through fa_tile_policy (abi.h; `prefill::TileConfig::for_kernel` in
// src/prefill/mod.rs, the grid and the cost model's tiling): nothing restates them.
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
//   128 | 2       | 128 | 64 | 2      | 98 KiB | O 128 + S 64: FA2's 128x64, spill-free only with the lean
//       |         |     |    |        |        | loop (measured below); 2 stages: 3 need 128 KiB. The
//       |         |     |    |        |        | _mod kernel: 128 x 32, 3 stages, 80 KiB
//   160 | 1       | 64  | 32 | 3      | 80 KiB | 2 m-tiles: O 160 + S >= 16 leaves too little for ptxas;
//       |         |     |    |        |        | Bc 64 needs 2 stages and 100 KiB
//   192 | 1       | 64  | 32 | 3      | 96 KiB | as 160 (O 96 + S 16 regs)
//   256 | 1       | 64  | 32 | 2      | 96 KiB | O alone is 128 regs at 16 rows/warp; Bc 64 or a third
//       |         |     |    |        |        | stage would need more than sm_86/89's 99 KiB
//
// The d128 key tile. Measured with nvcc 13.0 (2026-12-01): ptxas -v of the d128 kernels, and the mask-free
// loop of cuobjdump -sass (fa_prefill_f16_d128, sm_80; bf16 and sm_86/89/90a alike), per 64 keys, by kind:
//
//                     |  all | HMMA | LDSM | LDGSTS | LDS/STS | MUFU | FMUL | FFMA/FADD | F2FP | SHFL | int/ | BAR/
//                     |      |      |      |        |         |      |      | FMNMX     |      | VOTE | addr | BRA
//   128x32 3 stages   | 1144 |  256 |   96 |     16 |       6 |   72 |  264 |       240 |   32 |   18 |  126 |  16
//   128x64 (spills)   |  909 |  256 |   80 |     16 |       3 |   68 |  132 |       216 |   32 |    9 |   85 |   9
//   128x64 lean       |  911 |  256 |   80 |     16 |       6 |   68 |  132 |       216 |   32 |    9 |   86 |   9
//
// (LDS/STS: 3 per tile are ptxas's no-op "@!PT LDS" beside the cp.async; the lean loop adds its 3 parking
// accesses per tile.) 128 (2 x 64 in 128x32) of the FMULs are the lazy O rescale, a branch skipped on tiles
// where no row max of the warp moved, i.e. most tiles: so per 64 keys the issued instructions are ~888 for
// 128x32 and ~783 for lean 128x64 (-12%; -17% of the non-HMMA ones): one softmax (max/sum shuffles, rescale
// vote, alpha exp2s) and one loop overhead instead of two, 16 fewer LDSM (Q is re-read per tile: once per 64
// keys instead of twice), the same two barriers (2 stages need the trailing one). The 64-key tile's gain is
// a prediction (no GPU run yet): with one warp per SM sub-partition the softmax is not hidden behind another
// warp's MMAs, so the per-tile overhead counts in full.
//
// Registers: O is 128 and S is 64 fp32 per thread, the running maxima and sums 8: 200 of 255 before any
// fragment or address. The plain 128x64 kernel spilled (sm_80 40 bytes, sm_90a 28; 1-4 local loads per tile
// in the loop). Live across the mask-free loop besides O and the maxima (SASS liveness of the plain 128x64
// kernel): 12 ldmatrix lane addresses (4 variants each for Q, K, V), 8 for the K/V copies (row, 64-bit
// column, destination, two 64-bit bases), the row sums (4), the epilogue's sequence offsets (4-6), n and the
// buffer; at the loop's peak (during Q Kᵀ) ptxas also keeps ~40 registers of prefetched fragments. The lean
// loop (kLean) removes the context, not the prefetch:
//   - XorLaneAddress (fa/swizzle.cuh): one lane register per operand set, up to 8 LOP3 per operand per tile;
//   - the K/V copy bases and the epilogue's offsets parked in shared memory (48 bytes per warp, one LDS.128
//     per tile and one in the epilogue), the copy's per-thread row/column/destination recomputed from a
//     re-read thread index (RowWalkCopy, fa/tile_copy.cuh);
//   - the softmax row sums parked in shared memory between updates (16 bytes per thread: one LDS.128 and one
//     STS.128 per tile, conflict-free): they are dead through both GEMMs, where the pressure peaks.
// Result, f16 and bf16: 255 registers, no spills, on sm_80, 86, 89 and 90a (sm_90a: 913 instructions per 64
// keys); live across the loop head 142 registers (O, the maxima, n, the buffer, lane addresses), peak ~249
// in Q Kᵀ. Tried and not kept (no effect or worse, measured): 16-bit P packed before P V; an empty-asm
// "opaque" lane offset against hoisting (+13 instructions per tile); recomputing the epilogue's offsets from
// re-read block indices (ptxas merges the re-reads); one lane set for Q, K and V (K's B fragments then come
// out of ldmatrix in the wrong register order: +220 MOVs per tile); a rolled or 2x/4x-unrolled k loop in
// Q Kᵀ; ptxas -O1 (fixes the plain kernel but not _mod).
// The margin is thin: ptxas fills freed registers with deeper prefetch, so small edits to the loop can bring
// a spill back (the build fails on it; re-measure with the ptxas report).
//
// The d128 _mod kernel (softcap, ALiBi, left window bound) keeps 128x32 (ModTileConfig): with the lean loop
// at 128x64 it still spills 40 bytes (sm_80/86/89) and 68-108 (sm_90a): the softcap's exp2 and IEEE
// division per score and ALiBi's distances need ~10-25 more registers at the softmax than the plain kernel.
// It runs the lean loop at 128x32, in one KV loop (2026-12-06): the plain 128x32 three-loop kernel it was
// sat at 255 registers on sm_80/90 and spilled on Blackwell (sm_100: 8 bytes, sm_120: 24); lean, one loop,
// ptxas -v gives 249 / 248 / 245 / 243 registers on sm_80 / 90 / 100 / 120, no spills (f16; bf16 alike),
// and the edge loop's second copy of the masked step is gone from nvcc's time.
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
// The _mod kernels walk their KV tiles in one loop that branches per tile between the masked and the
// unmasked step (prefill.cu), not in a loop per kind with the masked step inlined twice (top and the
// window's left edge): a quarter less nvcc time for prefill.cu (user CPU 60.5 -> 45.8 s, nvcc 13.0, sm_80 +
// sm_90 SASS) and 8-24 fewer registers. (The d128 _mod kernel kept three loops until it went lean: at
// 128x32 without the lean loop one loop spilled 80 bytes on sm_90.)
template <int kHeadDim_, int kMTiles_, int kBc_, int kStages_, bool kLean_ = false>
struct TileShape {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kMTiles = kMTiles_;        // m16 tiles per warp
  static constexpr int kBr = 16 * kMTiles * kWarps; // query rows per CTA
  static constexpr int kBc = kBc_;                 // keys per KV tile
  static constexpr int kStages = kStages_;         // K/V tile buffers (2 or 3)
  static constexpr bool kLean = kLean_;
  static constexpr int kMinCtasPerSm = 1; // launch bounds: one CTA per SM at up to 255 registers
  // Q, the K/V buffers, and (lean) the parked K/V bases and row sums (prefill.cu).
  static constexpr int kSmemBytes = (kBr + 2 * kStages * kBc) * kHeadDim * 2 + (kLean ? 48 * kWarps + 16 * kThreads : 0);
  template <int kCols> using LaneOf = typename LaneSelect<kLean>::template type<kCols>;
  using Lane = LaneOf<kHeadDim>;
  static_assert(kBc % 16 == 0 && kHeadDim % 16 == 0, "mma k/n steps are 16 wide");
  static_assert(kStages == 2 || kStages == 3, "double or triple buffering");
  static_assert(kSmemBytes <= 99 * 1024, "must fit the 99 KiB opt-in of sm_86/sm_89/sm_120");
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
template <> struct ModTileConfig<128> : TileShape<128, 2, 32, 3, true> {};

// The tile of the kernel of width kHeadDim, plain or _mod (kVariant).
template <int kHeadDim, bool kVariant> struct KernelTileSelect {
  using type = TileConfig<kHeadDim>;
};
template <int kHeadDim> struct KernelTileSelect<kHeadDim, true> {
  using type = ModTileConfig<kHeadDim>;
};
template <int kHeadDim, bool kVariant> using KernelTile = typename KernelTileSelect<kHeadDim, kVariant>::type;

// Whether the kernel of width kHeadDim serves head dims below it (predicated columns, fa/head_dim.cuh). Not
// 128: before the lean 128x64 loop, the per-copy column predicate made the 128x32 _mod kernel spill on sm_90a
// (16 bytes), so the 128 kernels compile without any column logic and dims 104-120 run at 160. Measured
// since: with predicated columns the lean plain and the 128x32 _mod d128 kernels are spill-free on sm_80,
// 86 and 90a (f16, bf16), so 104-120 could move to 128 (head_dim.cuh and src/head_dim.rs with it).
template <int kHeadDim> constexpr bool kPredicatedColumns = kHeadDim != 128;

} // namespace prefill
FA_NAMESPACE_END
