// Compile-time shape of the sm_90a prefill kernel, one per (head dim, Bc) (dtype-independent). The tile a call
// runs is chosen here (prefill_sm90_block_n) and read by the host through fa_tile_policy (abi.h;
// `prefill::sm90::Sm90Tile::for_call` makes the TMA boxes for it); the launcher dispatches on the tile it
// was given and rejects any other.
//
// CTA = 1 + kConsumers warpgroups: warpgroup 0 produces (one thread issues TMA), the others consume, 64
// query rows each (wgmma's M), so Br = 64 · kConsumers. Registers: the threads start with 65536 / threads
// each (rounded down to 8); the producer returns all but kProducerRegs and the consumers take
// kConsumerRegs, out of that pool: producer + kConsumers · consumer ≤ (1 + kConsumers) · entry.
//   2 consumers, 384 threads, entry 168: 40 + 2 · 232 = 504 ≤ 504 (D 128 at 128 x 128), or 24 + 2 · 240 = 504
//     (FA3's split with two consumers: D 128 at 128 x 176 and D 256; the producer uses R0-R11).
//   3 consumers, 512 threads, entry 128: 24 + 3 · 160 = 504 ≤ 512 (FA3's split at D = 64; the producer
//     uses 14 registers, tests/it/build_artifacts.rs checks every role against its budget).
//
// Shared memory holds 16-bit tiles as TMA writes them with 128-byte swizzle: a tile of R rows and D columns
// is D/64 "panels" of R rows x 64 columns (128 bytes, one swizzle span, per row); panel p of a tile starts
// R·128 bytes after panel p-1. Every panel is a multiple of 1024 bytes (8 rows · 128), so every panel and
// stage starts on the 1024-byte boundary the 128B swizzle pattern repeats on.
//
//   D   | consumers | Br  | Bc  | stages | smem (Q + stages·(K+V)) | consumer registers: fragments (S+O+P) / budget
//   64  | 3         | 192 | 128 | 3      | 24 + 3·32  = 120 KiB    | 64 + 32 + 32  = 128 / 160 (FA3: 192 x 128)
//   128 | 2         | 128 | 176 | 2      | 32 + 2·88  = 208 KiB    | 88 + 64 + 44  = 196 / 240 (FA3: 128 x 176)
//   128 | 2         | 128 | 128 | 3      | 32 + 3·64  = 224 KiB    | 64 + 64 + 32  = 160 / 232 (causal/local)
//   256 | 2         | 128 | 64  | 2      | 64 + 2·64  = 192 KiB    | 32 + 128 + 16 = 176 / 240 (FA3: 128 x 80)
//   192 / 128 | 2   | 128 | 128 | 2      | 48 + 2·(48+32) = 208 KiB| 64 + 64 + 32  = 160 / 240 (FA3: 128 x 128)
// 192 / 128 (Dqk / Dv, DeepSeek-V2/V3's prefill): Q and K tiles of 192 columns (3 panels), V and O of 128
// (2 panels), so S = Q Kᵀ runs 12 k16 steps and O = P V is m64n128: no zero columns (the sm_80 kernel serves
// the pair at width 192, 17 % of its MMAs on zero V columns). FA3's tile for hdim 192 / hdimv 128 (128 x 128;
// 96 with a window, which here keeps 128: another instantiation's nvcc time for short windows only), its
// 24 / 240 split (the producer uses R0-R12, the consumers R237 the highest, no spills), 2 stages (a third
// would need 288 KiB), pingpong off as FA3 has it for a Q·K head dim past 128. O is staged for the epilogue
// in the first 2 of the Q buffer's 3 panels.
// D = 64 runs three consumers: its GEMMs per KV tile are half D = 128's while the softmax per score is the
// same, so with two consumers the tensor cores would idle behind the softmax that pingpong cannot hide; a
// third warpgroup gives them a third stream (the ring of Pingpong, fa/hopper/mainloop.cuh) and every K/V
// tile serves 192 query rows instead of 128 (2/3 of the K/V loads per row). Its 128 fragment registers
// and ~30 of addresses and softmax state fit 160 (ptxas: R157 the highest, no spills). D = 128 and 256
// keep two: their consumers need more than 160 (O alone is 64 / 128).
// Bc = 128 for D ≤ 128 gives each S wgmma N = 128 (the m64n128k16 shape runs at full rate); D = 256 halves
// Bc because O alone is 128 registers. D = 128 without a mask (not causal, no window) takes FA3's 128 x 176
// (m64n176k16: 176 keys per softmax and per barrier round trip instead of 128, 27 % fewer KV iterations) with
// the 24 / 240 split that its 196 fragment registers need (ptxas: R237 the highest, no spills), 2 stages
// (3 x 88 KiB would not fit); causal and windowed calls keep 128 x 128 as FA3 does (a wider tile adds
// masked diagonal work and a longer tail of short query tiles). D = 64 stays at 192 x 128: FA3's 192 x 192
// would need S = 96 + O 32 + P 48 = 176 fragment registers, past the 160 its three consumers get.
// D = 256 takes the 24 / 240 split too (FA3's with two consumers; its producer uses R0-R10): with the
// persistent loop, 232 spilled (ptxas: 44 bytes even at 240 until the epilogue's staging addresses were kept
// from being hoisted out of the loop, fa/hopper/epilogue.cuh; now R234 the highest, no spills).
// Every instantiation runs the persistent loop (fa/hopper/tile_scheduler.cuh); launched with one CTA per
// tile (FaPrefillSm90Params.ctas = 0, Sm90Steps::persistent off) it runs its one tile.
// Stages: K and V have their own full/empty barriers (fa/hopper/pipeline.cuh), K freed as soon as S = Q Kᵀ
// completed and V once P V did, so with two stages the load of tile n+1's K already overlaps tile n; a
// third stage (D 64 and 128, where 227 KiB allow it) lets the producer run one more tile ahead, absorbing
// a late TMA or the pingpong skew between the consumers. D = 256 has room for two.
// Pingpong (kPingpong): on for D ≤ 128, off for D = 256, as FA3 has it (its mainloop's UseSchedulerBarrier:
// 16-bit inputs, head dim ≤ 128): at D = 256 each warpgroup's GEMMs are long enough next to its softmax
// that serialising the warpgroups' GEMMs only costs issue slots.
#pragma once

#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN
namespace hopper {

constexpr int kWarpgroupThreads = 128;
constexpr int kPanelCols = 64;    // 16-bit elements per 128-byte swizzle row
constexpr int kPanelRowBytes = 128;

// kHeadDim: Q's and K's head dim (the k of S = Q Kᵀ); kHeadDimV: V's and O's (the N of O = P V), kHeadDim
// unless a pair gives V one of its own (DeepSeek's 192 / 128).
template <int kHeadDim_, int kBc_, int kStages_, int kConsumers_, int kProducerRegs_, int kConsumerRegs_,
          bool kPingpong_, int kHeadDimV_ = kHeadDim_>
struct PrefillShape {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr int kConsumers = kConsumers_; // consumer warpgroups
  static constexpr int kThreads = (kConsumers + 1) * kWarpgroupThreads;
  static constexpr int kMinCtasPerSm = 1; // launch bounds: every tile takes over half an SM's shared memory
  static constexpr int kBr = 64 * kConsumers; // query rows per CTA
  static constexpr int kBc = kBc_;            // keys per KV tile
  static constexpr int kStages = kStages_;
  static constexpr int kPanels = kHeadDim / kPanelCols;   // of Q and K
  static constexpr int kPanelsV = kHeadDimV / kPanelCols; // of V and O
  static constexpr int kProducerRegs = kProducerRegs_;
  static constexpr int kConsumerRegs = kConsumerRegs_;
  static constexpr bool kPingpong = kPingpong_;
  // Bytes of one panel / tile of each operand.
  static constexpr int kQPanelBytes = kBr * kPanelRowBytes;
  static constexpr int kKvPanelBytes = kBc * kPanelRowBytes;
  static constexpr int kQBytes = kPanels * kQPanelBytes;
  static constexpr int kKTileBytes = kPanels * kKvPanelBytes;
  static constexpr int kVTileBytes = kPanelsV * kKvPanelBytes;
  static constexpr int kStageBytes = kKTileBytes + kVTileBytes; // K then V
  // Layout: Q, stages x (K, V), then the mbarriers (fa/hopper/pipeline.cuh, Barriers).
  static constexpr int kBarrierOffset = kQBytes + kStages * kStageBytes;
  static constexpr int kSmemBytes = kBarrierOffset + 8 * (2 + 4 * kStages);
  static_assert(kHeadDim % kPanelCols == 0 && kHeadDimV % kPanelCols == 0, "head dims are whole 64-column panels");
  static_assert(kHeadDimV <= kHeadDim, "O is staged in the Q buffer's panels (fa/hopper/epilogue.cuh)");
  static_assert(kBc % 16 == 0 && kBc <= 256, "wgmma N: a multiple of 16 up to 256, and a TMA box of at most 256 rows");
  static_assert(kQPanelBytes % 1024 == 0 && kKvPanelBytes % 1024 == 0, "panels start on the swizzle pattern");
  static_assert(kSmemBytes <= 227 * 1024, "sm_90's 227 KiB opt-in");
  static constexpr int kEntryRegs = 65536 / kThreads / 8 * 8;
  static_assert(kProducerRegs + kConsumers * kConsumerRegs <= (kConsumers + 1) * kEntryRegs, "the register pool");
  static_assert(kProducerRegs % 8 == 0 && kConsumerRegs % 8 == 0 && kProducerRegs >= 24 && kConsumerRegs <= 256,
                "setmaxnreg: multiples of 8 from 24 to 256");
  static_assert(kConsumers >= 2 && kConsumers <= 3, "named barriers: pingpong ids 2 .. 1 + kConsumers");
};

template <int kHeadDim, int kBc, int kHeadDimV = kHeadDim> struct PrefillTraits;
//                                                             D    Bc   stages consumers registers pingpong Dv
template <> struct PrefillTraits<64, 128> : PrefillShape<64, 128, 3, 3, 24, 160, true> {};
template <> struct PrefillTraits<128, 176> : PrefillShape<128, 176, 2, 2, 24, 240, true> {};
template <> struct PrefillTraits<128, 128> : PrefillShape<128, 128, 3, 2, 40, 232, true> {};
template <> struct PrefillTraits<256, 64> : PrefillShape<256, 64, 2, 2, 24, 240, false> {};
template <> struct PrefillTraits<192, 128, 128> : PrefillShape<192, 128, 2, 2, 24, 240, false, 128> {};

// The instantiated (D, Bc, Dv) tiles as an X-macro list, X(D, Bc, Dv, name suffix): the suffix names the wider
// of two tiles of one head dim, or V's head dim when it is not D's. It drives prefill_sm90.cu's
// instantiations, dispatch and tile policy.
#define FA_PREFILL_SM90_TILES(X)                                                                             \
  X(64, 128, 64, ) X(128, 128, 128, ) X(128, 176, 128, _bc176) X(256, 64, 256, ) X(192, 128, 128, _dv128)

// The tile a call of Q·K head dim `head_dim` and V head dim `head_dim_v` runs (0: no kernel for the pair):
// D 128 without a mask takes FA3's 128 x 176; masked calls (causal or windowed) keep 128 x 128, as FA3 does
// (the diagonal tiles' waste grows with Bc). 192 / 128 runs 128 x 128 masked or not (FA3 takes Bc 96 for a
// window, a third instantiation's nvcc time for short windows only).
constexpr int prefill_sm90_block_n(int head_dim, int head_dim_v, bool masked) {
  if (head_dim_v != head_dim) return head_dim == 192 && head_dim_v == 128 ? 128 : 0;
  return head_dim == 64 ? 128 : head_dim == 128 ? (masked ? 128 : 176) : head_dim == 256 ? 64 : 0;
}

} // namespace hopper
FA_NAMESPACE_END
