// Compile-time shape of the paged decode kernel for one head dim: the CTA mapping, the KV tile, the
// cp.async pipeline and the shared-memory layout. Everything the kernel body and the launcher must agree on
// lives here; the Rust side reads it through fa_tile_policy and FA_SPLIT_GRANULE (abi.h).
//
// D here is the kernel's tile width: 64, 128, 256 or 512, each serving the head dims fa/head_dim.cuh maps to
// it (columns past the head dim are zero-filled, never read: decode is memory-bound, so a padded width costs
// only tensor time and shared memory, both with room to spare, and no extra instantiations).
//
// CTA = one (sequence, KV head, block of up to 16 R of its query heads, KV split; R row groups, below). The
// G = Hq/Hkv query heads that share the KV head are the M = 16 rows of an m16n8k16 tensor-core tile (FA2's
// "seqlenq_ngroups swapped" / FlashInfer's tensor-core decode), so each K/V byte is read from memory once
// per CTA: once per KV head for G <= 16 R. Tensor
// cores rather than CUDA cores: with G heads every K/V element feeds 2G FMAs, which at HBM3e rates is
// 20-50% of the fp32 FMA pipe plus the conversions, while the padded mma (16 rows for G <= 16) costs well
// under 10% of the tensor pipe; the data path (cp.async -> swizzled smem -> ldmatrix) is the same either way.
//
// 4 warps (8 in a wide CTA: below, kWideFactor). The warps are split kTokenGroups x kDSplits: warps of one
// token group own 16 tokens of every KV tile (one P.V k-step) and keep an independent online-softmax state;
// warps of one D split accumulate kWarpD output columns. Up to D = 256 every warp holds a 16 x 64 fp32
// accumulator (32 registers) and the KV tile holds 16 KB (K + V):
//     D = 64:  4 token groups x 1 D split, 64-token tiles
//     D = 128: 2 x 2, 32-token tiles (the two D-split warps recompute the same 16x16 S: cheap on tensor cores)
//     D = 256: 1 x 4, 16-token tiles
// kStages = 4 stages of 16 KB: after each barrier three tiles (48 KB) are in flight per CTA, and the whole
// CTA needs < 73 KB of shared memory, so it fits every target (sm_86/89 allow 99 KB per block) and three
// CTAs share an SM (~145 KB in flight per SM: far above bandwidth x latency for HBM3e).
//
// D = 512 (Gemma 4's global layers): 1 token group x 4 D splits of kWarpD = 128 columns, 16-token tiles of
// 32 KB (K + V). A tile cannot get smaller (16 tokens is one P.V k-step) and the 16 x 512 Q tile alone is
// 16 KB, so 4 stages (128 KB) do not fit the 99 KB opt-in limit of sm_86/89: kStages = 2 (80.9 KB in all).
// Registers: a warp holding all of Q as A fragments (32 k-steps x 4 = 128 registers) beside its 16 x 128
// accumulator (64) needs 255 registers and spills with an FP8 cache (ptxas, sm_80/89), so at 512 each
// D-split warp computes S over its own 128 columns only (kScoreSplits = 4: 32 registers of Q) and the four
// partial S tiles are summed through shared memory (WarpAttention::exchange_scores: 4 KB overlaying the Q
// tile, idle once the fragments are loaded; one more barrier per tile). Each K element is then read from
// shared memory once, not by each of 4 warps. The launch bounds are built for 2 CTAs per SM (shared memory
// allows no more than 2 anywhere). Bytes in flight (docs/decode-memory.md, "D = 512"): one 32 KB tile per
// CTA while the previous one is computed, 2 CTAs per SM on sm_80 and sm_90 (2 x 81.9 KB of 164 / 228 KB; 1
// on sm_86/89's 100 KB), so 64 KB per SM (16-bit; 32 KB FP8) against a bandwidth-delay product of ~4.8 TB/s
// x ~0.7 us / 132 SMs ~ 26 KB on the H200.
#pragma once

#include "fa/abi.h"
#include "fa/intrinsics.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN
namespace decode {

// A [rows][D] tile of 16-bit elements in shared memory, stored as 16-byte chunks whose index is XORed
// with (row & 7): the 8 rows one ldmatrix phase reads at the same logical column land in 8 different bank
// groups (a row is D*2 >= 128 bytes, so without the swizzle all 8 would hit the same 4 banks).
template <int D> struct SwizzledTile {
  static constexpr int kChunks = D / 8;
  static_assert(kChunks % 8 == 0, "the swizzle permutes groups of 8 chunks");
  // Byte offset of 16-byte chunk `chunk` of row `row`.
  FA_HOST_DEVICE static int offset(int row, int chunk) { return (row * kChunks + (chunk ^ (row & 7))) * 16; }
};

// A [rows][D] tile of FP8 codes in shared memory (D bytes per row, 16-byte chunks of 16 elements), chunk
// index XORed so that the 8 consecutive rows one ldmatrix phase (or one quarter-warp of cp.async writes)
// touches at one logical chunk land in 8 different 16-byte bank groups: with >= 8 chunks per row the row
// index's low 3 bits do it (as SwizzledTile); with 4 (D = 64, two rows per 128 bytes) the row's parity
// already picks the half of the 128 bytes, and bits 1-2 of the row permute the 4 chunks within it.
template <int D> struct Fp8SwizzledTile {
  static constexpr int kChunks = D / 16;
  static_assert(kChunks == 4 || kChunks % 8 == 0, "FP8 tile widths");
  FA_HOST_DEVICE static int offset(int row, int chunk) {
    const int x = kChunks == 4 ? (row >> 1) & 3 : row & 7;
    return row * D + (chunk ^ x) * 16;
  }
};

// Stages per cache format (issue 30, item 3). Bytes in flight per CTA after each barrier are (kStages - 1)
// stages; the model (docs/decode-memory.md, "Stages per format"): per SM, CTAs/SM x (kStages - 1) x stage
// bytes must cover the bandwidth-delay product with margin, ~26 KB on the H200 (4.8 TB/s x ~0.7 us / 132 SMs)
// and more at the longer latencies of a loaded memory system. The 16-bit stages fill the shared memory that
// 3 CTAs per SM leave (2 at D = 512); an FP8 stage holds the same tokens in half the bytes, so FP8 takes
// twice the stages in the same stage area: the same occupancy, twice the tokens in flight, and as many
// bytes in flight as 16-bit (D <= 256: 7 x 8 KB = 56 KB per CTA against 16-bit's 3 x 16 KB; D = 512: 3 x 16 KB
// against 1 x 32 KB). tests/it/tile_policy.rs holds the per-SM product against the model for every format,
// head dim and arch.
template <int D, bool kFp8 = false> struct Traits {
  static_assert(D == 64 || D == 128 || D == 256 || D == 512, "decode head dims");
  // A narrow CTA's threads (4 warps); they also do every copy. A wide CTA (below) adds 4 warps that only compute.
  static constexpr int kThreads = 128;
  // Registers: three narrow CTAs (at most 168 registers a thread) fit any SM's register file; at D = 512 two
  // (shared memory holds no more). A register cap (__maxnreg__), not launch bounds, because one kernel runs
  // narrow and wide CTAs: the 64 K registers over kMinCtasPerSm narrow CTAs, in ptxas's steps of 8, at most
  // 255 (168 and 255: what __launch_bounds__(128, 3) and (128, 2) gave).
  static constexpr int kMinCtasPerSm = D == 512 ? 2 : 3;
  static constexpr int kMaxRegisters =
      65536 / (kThreads * kMinCtasPerSm) / 8 * 8 < 255 ? 65536 / (kThreads * kMinCtasPerSm) / 8 * 8 : 255;
  static_assert(kMaxRegisters == (D == 512 ? 255 : 168), "the caps ptxas was measured at");
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kRows = FA_DECODE_ROWS; // packed query rows per row group: the mma M dimension
  static constexpr int kWarpTokens = 16; // tokens per warp per tile: one P.V k-step
  static constexpr int kTokenGroups = D == 64 ? 4 : (D == 128 ? 2 : 1);
  static constexpr int kDSplits = kWarps / kTokenGroups;
  // Row groups (issue 30, item 4: a KV head read once for more than 16 query rows). The kTokenGroups warp
  // slots of a D split can instead serve up to kTokenGroups blocks of 16 rows: the launch packs a sequence's
  // rows into CTAs of FaDecodeParams::rows_per_cta (16 R_max), and each CTA takes R row groups, the fewest (a
  // power of two) that hold its own rows; its slots are then R row groups x kTokenGroups / R token groups,
  // and each warp computes R of the tile's 16-token chunks for its own 16 rows, one after the other, with the
  // same per-warp state (so the same registers). A narrow CTA serves 16 kTokenGroups rows from each staged
  // K/V byte: 64 at D = 64, 32 at 128, 16 from 256 on.
  // Wide CTAs: a launch of more rows per CTA than that runs 8 warps (kWideThreads), the second four taking
  // slots kTokenGroups .. 2 kTokenGroups - 1 of each D split: up to 2 kTokenGroups row groups, each of one
  // token group computing every chunk of the tile (128 rows at D = 64: Falcon-7B's 71:1 reads its KV head
  // once; 64 at D = 128: MQA 64:1). Same registers per thread (the cap above), so one wide CTA per SM; a
  // CTA of a wide launch with no more rows than a narrow one's leaves its extra warps idle and sums in a
  // narrow CTA's order (bitwise the same rows). Not from D = 256 on: the D = 256 kernels run at the
  // 168-register cap, where the wide CTA's row-group bookkeeping spilled 16-60 bytes (ptxas, sm_80/89/90,
  // 16-bit and FP8 kernels), and D = 512's S exchange is laid out for 4 warps.
  static constexpr int kWideFactor = D <= 128 ? 2 : 1;
  static constexpr int kWideThreads = kThreads * kWideFactor;
  static constexpr int kMaxRowGroups = kTokenGroups * kWideFactor; // warp slots per D split
  static constexpr int kNarrowRows = kRows * kTokenGroups;
  static constexpr int kCtaRows = kRows * kMaxRowGroups;
  static constexpr int kWarpD = D / kDSplits; // output columns per warp (64 up to D = 256, 128 at 512)
  // Warps that share one S, each summing Q·K over D / kScoreSplits columns (the header: 4 at D = 512).
  static constexpr int kScoreSplits = D == 512 ? kDSplits : 1;
  static_assert(kScoreSplits == 1 || (kTokenGroups == 1 && kScoreSplits == kWarps && kWideFactor == 1),
                "exchange_scores' layout");
  static constexpr int kTileTokens = kWarpTokens * kTokenGroups;
  static constexpr int k16BitStages = D == 512 ? 2 : 4; // D = 512: two 32 KB stages fit 99 KB, three do not
  static constexpr int kStages = kFp8 ? 2 * k16BitStages : k16BitStages;

  // cp.async work split: a tile row is kChunksPerRow 16-byte chunks; thread t copies chunk t % kChunksPerRow
  // of rows t / kChunksPerRow + i * kRowsPerPass, i < kLoadsPerThread (for K and for V).
  static constexpr int kChunksPerRow = D / 8;
  static constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  static constexpr int kLoadsPerThread = kTileTokens / kRowsPerPass;
  static_assert(kLoadsPerThread * kRowsPerPass == kTileTokens, "tile rows split evenly over threads");

  // Shared memory (bytes). The epilogue's fp32 partial outputs overlay the (then idle) stages.
  static constexpr int kTileBytes = kTileTokens * D * 2; // K or V of one tile
  static constexpr int kStageBytes = 2 * kTileBytes;
  static constexpr int kStageAreaBytes = k16BitStages * kStageBytes; // either format's stages
  // FP8 cache (the _fp8 kernels): the same stage area holds kStages FP8 stages (K then V tile, each an
  // Fp8SwizzledTile), which the warps read with ldmatrix and convert in registers on the way to the mma
  // (fa/decode/warp_attention.cuh): the same tokens are in flight as with a 16-bit cache, in half the bytes,
  // and every shared byte is written once (cp.async) and read once per reading warp, as with 16-bit. The
  // cp.async split is 16 elements per chunk, D / 16 chunks per row.
  static constexpr int kFp8TileBytes = kTileTokens * D;
  static constexpr int kFp8StageBytes = 2 * kFp8TileBytes;
  static_assert(!kFp8 || kStages * kFp8StageBytes <= kStageAreaBytes, "FP8 stages fit");
  // Q (kCtaRows x D, swizzled). Up to D = 256 the warps hold Q in registers once init has run, before the
  // first barrier of the KV loop, and the last stage is first written after that barrier (iteration 0
  // issues tile kStages - 1): so Q overlays the last stage of the kernel's format and costs no shared memory
  // of its own. That stage holds kQAreaRows rows: a narrow CTA's and a 16-bit wide CTA's (16 KB: the whole
  // stage) at once; a wide FP8 CTA's Q is twice its 8 KB stage, so it comes in two halves (decode.cu: the
  // second half loaded once the first half's warps hold their fragments; shared memory as narrow: the FP8
  // kernels keep 3 CTAs per SM on sm_90). At D = 512 the S exchange overlays Q during the loop, so Q has its
  // own area in front of the stages. The stage area starts at offset 0 (D <= 256): at D = 256, where the
  // kernels run at the 168-register cap, a stage base past the small areas below spilled 8 bytes in the FP8
  // _mod kernel (ptxas, sm_90).
  static constexpr int kQBytes = kCtaRows * D * 2;
  static constexpr bool kQInStages = kScoreSplits == 1;
  static constexpr int kStageOffset = kQInStages ? 0 : kQBytes;
  static constexpr int kLastStageBytes = kFp8 ? kFp8StageBytes : kStageBytes;
  static constexpr int kQOffset = kQInStages ? kStageOffset + kStageAreaBytes - kLastStageBytes : 0;
  static constexpr int kQAreaRows = !kQInStages || kQBytes <= kLastStageBytes ? kCtaRows : kLastStageBytes / (D * 2);
  static_assert(kQAreaRows >= kNarrowRows && kQAreaRows * 2 >= kCtaRows, "a narrow CTA's Q at once, a wide one's in two");
  static constexpr int kRowRingOffset = kStageOffset + kStageAreaBytes;
  static constexpr int kRowRingBytes = 2 * kTileTokens * 16; // K/V row offsets of the next two tiles to issue
  static constexpr int kStatsOffset = kRowRingOffset + kRowRingBytes;
  static constexpr int kStatsBytes = kMaxRowGroups * kRows * 2 * 4; // (m, l) per warp slot and row
  // Hole masks (rows inside the sequence whose page id is out of range): one 32-row ballot word per
  // publishing warp and tile. A tile's word is written when its rows are published (kStages - 1 tiles ahead
  // of its compute, plus the tile published in the same iteration), so kStages + 1 slots keep it alive.
  static constexpr int kHoleWords = (kTileTokens + 31) / 32;
  static constexpr int kHoleSlots = kStages + 1;
  static constexpr int kHoleOffset = kStatsOffset + kStatsBytes;
  static constexpr int kHoleBytes = kHoleSlots * kHoleWords * 4;
  // Per-row facts (key position, q row, query head, partial state: int [4][kCtaRows]) and the key range where all
  // rows see the same keys (int [2]), parked once per unit and read where needed (the loop's masks, ALiBi, the
  // epilogue) instead of held in registers across the loop: the D = 256 kernels run at the 168-register
  // launch bound, where two more live values spill (ptxas, sm_80/90).
  static constexpr int kRowInfoOffset = kHoleOffset + kHoleBytes;
  static constexpr int kRowInfoBytes = (4 * kCtaRows + 2) * 4;
  static constexpr int kSmemBytes = kRowInfoOffset + kRowInfoBytes;
  // kScoreSplits > 1: the partial S tiles (per warp, 32 lanes x 8 fp32) overlay the Q tile, which no warp
  // reads after its fragments are loaded (before the first tile's barrier).
  static constexpr int kExchangeOffset = kQOffset;
  static constexpr int kExchangeBytes = kScoreSplits > 1 ? kWarps * 32 * 8 * 4 : 0;
  static_assert(kExchangeBytes <= kQBytes, "the S exchange fits in the Q tile");
  static constexpr int kOStride = D + 4; // fp32 row stride of the epilogue partials (+4: fewer conflicts)
  static constexpr int kOBytes = kMaxRowGroups * kRows * kOStride * 4; // per warp slot
  static_assert(kOBytes <= kStageAreaBytes, "epilogue partials fit in the stages");
  // Each copying thread takes two chunks of a row (K and V), so a row's page offsets are read from the
  // ring by D / 32 threads: per global byte, the ring costs FP8 what it costs the 16-bit path (one chunk per
  // thread, twice the bytes per chunk). Which two: chunks 2c, 2c+1 up to 8 chunks a row, c and c + n/2 with
  // n >= 16 chunks (c + 8 at D = 256, c + 16 at 512), so each quarter-warp of copies still lands in 8
  // different bank groups of the swizzled tile.
  static constexpr int kFp8ChunksPerRow = D / 16;
  static constexpr int kFp8ThreadsPerRow = kFp8ChunksPerRow / 2;
  static constexpr int kFp8RowsPerPass = kThreads / kFp8ThreadsPerRow;
  static constexpr int kFp8LoadsPerThread = kTileTokens / kFp8RowsPerPass;
  static_assert(kFp8LoadsPerThread * kFp8RowsPerPass == kTileTokens, "FP8 tile rows split evenly over threads");
  FA_HOST_DEVICE static int fp8_copy_chunk(int tid, int e) {
    const int c = tid % kFp8ThreadsPerRow;
    return kFp8ChunksPerRow <= 8 ? 2 * c + e : c + kFp8ThreadsPerRow * e;
  }
  static_assert(kSmemBytes <= 99 * 1024, "fits the smallest per-block limit among the targets (sm_86/89/120)");
  // Whether this width serves dense/varlen/paged prefill past the tiled kernels' head dims (abi.h,
  // FA_*_TILED_MAX_HEAD_DIM): only those kernels hold the uniform query rows and the contiguous cache views
  // (a compile-time switch: the D = 256 FP8 _mod kernel runs at the 168-register bound, where the views'
  // branches spill 12 bytes on sm_90).
  static constexpr bool kServesWidePrefill = D > FA_PREFILL_TILED_MAX_HEAD_DIM;
  static_assert(FA_PREFILL_TILED_MAX_HEAD_DIM == FA_PAGED_PREFILL_TILED_MAX_HEAD_DIM, "one switch serves both");
};

// split_tokens must be a multiple of this (every head dim's tile divides it): abi.h's FA_SPLIT_GRANULE.
constexpr int kSplitGranule = FA_SPLIT_GRANULE;
static_assert(kSplitGranule % Traits<512>::kTileTokens == 0 && kSplitGranule % Traits<256>::kTileTokens == 0 &&
                  kSplitGranule % Traits<128>::kTileTokens == 0 && kSplitGranule % Traits<64>::kTileTokens == 0,
              "every decode KV tile divides a split");

} // namespace decode
FA_NAMESPACE_END
