// Paged prefill: each sequence's q_len new query tokens (packed, cu_seqlens_q) attend over its paged K/V
// (seq_len tokens, the new ones included), bottom-right causal per sequence, GQA, score variants, LSE, and
// split-KV for long contexts with few query rows. Shapes and the split contract: FaPagedPrefillParams in
// fa/abi.h; the semantics: docs/semantics.md.
//
// The FA2 prefill tiling (dense prefill's Br and warps, K/V tiles narrower at D = 64/128/256: TileConfig
// below; the tile GEMMs of fa/prefill/tile_math.cuh, the online softmax) over *packed* rows: a CTA serves one sequence, one KV head, Br packed rows of it and one KV split.
// Packed row r is query token r / G of query head kv_head·G + r % G (fa/paged_prefill/packed_rows.cuh), so
//  - a long chunk behaves like dense prefill with G heads interleaved;
//  - a short one (q_len · G <= Br: the whole chunk of a KV head in one CTA) reads every K/V tile once per KV
//    head, as decode does for the G query heads; warps whose rows are all past q_len · G still load and meet
//    the barriers but skip the tensor-core work;
//  - with few CTAs and a long context the host plans num_splits > 1 (src/paged_prefill.rs): each split
//    walks its own key range and writes fp32 partials that merge.cu combines (sinks added there, once).
// Per CTA:
//   load Q rows (gathered per packed row, cp.async) and the top KV tile of the split's range;
//   for each KV tile n from the top down (tiles above the causal diagonal / outside the window / outside the
//   split are never visited):
//     wait for tile n, barrier; prefetch tile n-1 (cp.async from the row offsets published a step earlier)
//     and look up tile n-2's pages (fa/paged_prefill/kv_tile.cuh; published after the math);
//     S = Q Kᵀ; (softcap, ALiBi); mask (edge tiles only: diagonal, window, ragged end; and keys whose
//     block-table entry is out of range, on any tile); online softmax; O += P V;
//   normalise (with the row's sink when unsplit) and store O / LSE, or the split's fp32 partial.
//
// RoPE on q (p.rope; the _mod kernels, a run-time switch in the prologue: fa/prefill/rope_tile.cuh): the Q rows
// are committed as a copy group of their own and rotated in shared memory, each packed row at its token's
// position, while the top KV tile is in flight.
//
// FP8 cache (kFp8, issue 17; fa/fp8_tile.cuh): the copies move the FP8 rows as stored (16 elements per
// 16-byte chunk) into kStages FP8 staging tiles; after the barrier that publishes tile n, every thread
// converts its chunks of K and V (exactly) into the one 16-bit K/V buffer the tile GEMMs read, a second
// barrier, and the math runs unchanged. The KV head's dequantisation scales are folded in as decode does:
// k_scale into the score scale (and ScoreMod's), v_scale into the normalised output (split partials too).
//
// A V head dim Dv of its own (p.head_dim_v; DeepSeek's 192 / 128): the kernel of the wider dim's width, K
// columns predicated at Dqk and V columns at Dv (the zero K columns add nothing to S, the zero V columns give
// zero O columns, which are not stored); O and the split partials are [.., Dv]. No other instantiation.
#include "fa/abi.h"
#include "fa/attention_state.cuh"
#include "fa/head_dim.cuh"
#include "fa/fp8_tile.cuh"
#include "fa/intrinsics.cuh"
#include "fa/mma_tile.cuh"
#include "fa/online_softmax.cuh"
#include "fa/paged_prefill/kv_tile.cuh"
#include "fa/paged_prefill/packed_rows.cuh"
#include "fa/paged_view.cuh"
#include "fa/prefill/block_range.cuh"
#include "fa/prefill/rope_tile.cuh"
#include "fa/prefill/seq_info.cuh"
#include "fa/prefill/tile_config.cuh"
#include "fa/prefill/stage_o.cuh"
#include "fa/prefill/tile_math.cuh"
#include "fa/score_mod.cuh"
#include "fa/split_kv.cuh"
#include "fa/swizzle.cuh"
#include "fa/tile_copy.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN
namespace paged_prefill {
// File-local: kernels and launch helpers are reached only through this file's extern "C" launcher.
namespace {

using prefill::gemm_pv;
using prefill::stage_o_rows;
using prefill::gemm_qk;

// Tile shapes (fa/prefill/tile_config.cuh): dense prefill's Br and warp layout, so a chunk with
// q_len · G <= Br reads its K/V once and a long chunk tiles like dense prefill; but where dense prefill's
// registers are full (D = 64, 128, 256: 225-255 of 255), K/V tiles half as wide (Bc), which frees the
// registers the paged state needs (the page looked up a tile ahead, the ring and row tables, the split
// range): with dense prefill's Bc these kernels spill 4-16 registers (ptxas, sm_80). D = 96 keeps Bc = 32
// but one m16 tile per warp (Br = 64): its 128 x 32 tile spills 8 bytes on sm_90a, and 16-key tiles do not
// split evenly over the threads at 12 chunks per row. The Rust side reads Br through fa_tile_policy.
template <int kHeadDim> struct TileConfig;
template <> struct TileConfig<64> : prefill::TileShape<64, 2, 32, 3> {};
template <> struct TileConfig<96> : prefill::TileShape<96, 1, 32, 3> {};
template <> struct TileConfig<128> : prefill::TileShape<128, 2, 16, 3> {};
template <> struct TileConfig<256> : prefill::TileShape<256, 1, 16, 3> {};

// A compile-time flag passed to the per-tile step (masked or not), as a type.
template <bool kValue> struct Flag {
  static constexpr bool value = kValue;
};

// Shared memory: Q (Br x D), kStages K and V buffers (Bc x D each; FP8: one 16-bit K and V buffer, the
// converted tile, then kStages FP8 staging K and V tiles of Bc x D bytes), the two-slot ring of K/V row
// offsets and three slots of hole flags per key row (fa/paged_prefill/kv_tile.cuh; slot use in the kernel),
// and each CTA row's token and ALiBi slope (fa/paged_prefill/packed_rows.cuh).
template <int kHeadDim, bool kFp8> struct Smem {
  using Cfg = TileConfig<kHeadDim>;
  static constexpr int kTile = Cfg::kBc * kHeadDim; // elements of one K or V tile
  static constexpr int kBuffers = kFp8 ? 1 : Cfg::kStages; // 16-bit K/V buffers
  static constexpr int kFp8Offset = (Cfg::kBr + 2 * kBuffers * Cfg::kBc) * kHeadDim * 2;
  static constexpr int kRingOffset = kFp8Offset + (kFp8 ? Cfg::kStages * 2 * kTile : 0);
  static constexpr int kHoleSlots = 3;
  static constexpr int kHoleOffset = kRingOffset + 2 * Cfg::kBc * (int)sizeof(RowOffsets);
  static constexpr int kRowTokenOffset = kHoleOffset + kHoleSlots * Cfg::kBc * 4; // int [kBr]
  static constexpr int kRowSlopeOffset = kRowTokenOffset + Cfg::kBr * 4;          // float [kBr] (ALiBi)
  static constexpr int kBytes = kRowSlopeOffset + Cfg::kBr * 4;
  static_assert(kRingOffset % 16 == 0 && kFp8Offset % 16 == 0, "the ring and FP8 stages are 16-byte aligned");
  static_assert(kBytes <= 99 * 1024, "must fit the 99 KiB opt-in of sm_86/sm_89/sm_120");
};

// Where this CTA's rows come from and go to.
struct Rows {
  int b, kv_head, group;
  int q_start, q_len; // the sequence's rows of q (packed tokens)
  int rows;           // q_len · group packed rows
  int seq_len;        // keys (the new tokens included)
};

// The packed row's (token, query head).
FA_DEVICE int row_token(const Rows &r, int row) { return row / r.group; }
FA_DEVICE int row_head(const Rows &r, int row) { return r.kv_head * r.group + row % r.group; }

// Gathers Q rows [m0, m0 + kBr) (packed) into sQ; rows past r.rows and columns past head_dim are zero-filled.
template <class Cfg, class T>
FA_DEVICE void load_q_rows(T *sQ, const FaPagedPrefillParams &p, const Rows &r, int m0) {
  using Layout = SwizzledRows<Cfg::kHeadDim>;
  constexpr int kChunks = Cfg::kHeadDim / 8;
  const T *q = static_cast<const T *>(p.q);
#pragma unroll
  for (int i = 0; i < Cfg::kBr * kChunks / Cfg::kThreads; ++i) {
    const int idx = i * Cfg::kThreads + thread_idx();
    const int row = idx / kChunks;
    const int c = (idx % kChunks) * 8;
    const int packed = m0 + row;
    const bool copy = packed < r.rows && c < p.head_dim;
    const T *src = copy ? q + (int64_t)(r.q_start + row_token(r, packed)) * p.q_row_stride +
                              (int64_t)row_head(r, packed) * p.q_head_stride + c
                        : q;
    cp_async_cg_16(sQ + Layout::offset(row, c), src, copy);
  }
}

// O / LSE of this warp's rows (single split): O staged through the warp's own Q rows of shared memory so
// that global stores are whole 16-byte chunks (as dense prefill's store_output does).
template <class T, class Cfg>
FA_DEVICE void store_rows(const FaPagedPrefillParams &p, const Rows &r, int m0, int warp_row0, T *sQ,
                          const float (&o)[Cfg::kMTiles][Cfg::kHeadDim / 8][4], const float (&lse)[2 * Cfg::kMTiles]) {
  using Layout = SwizzledRows<Cfg::kHeadDim>;
  constexpr int kRows = 16 * Cfg::kMTiles;
  constexpr int kChunks = Cfg::kHeadDim / 8;
  static_assert(kRows * kChunks % kWarpSize == 0, "whole chunks per lane");
  const int t = lane_id() & 3;
  stage_o_rows<T, Cfg>(sQ, warp_row0, o);
  T *out = static_cast<T *>(p.o);
#pragma unroll
  for (int i = 0; i < kRows * kChunks / kWarpSize; ++i) {
    const int idx = i * kWarpSize + lane_id();
    const int rr = idx / kChunks;
    const int c = (idx % kChunks) * 8;
    const int packed = m0 + warp_row0 + rr;
    if (packed < r.rows && c < p.head_dim_v) { // O's columns: V's head dim
      const Bytes16 chunk = ld_shared(reinterpret_cast<const Bytes16 *>(sQ + Layout::offset(warp_row0 + rr, c)));
      T *dst = out + (int64_t)(r.q_start + row_token(r, packed)) * p.o_row_stride +
               (int64_t)row_head(r, packed) * p.o_head_stride + c;
      st_global(reinterpret_cast<Bytes16 *>(dst), chunk);
    }
  }
  if (p.lse != nullptr && t == 0) {
#pragma unroll
    for (int k = 0; k < 2 * Cfg::kMTiles; ++k) {
      const int packed = fragment_row(m0 + warp_row0, k);
      if (packed < r.rows)
        st_global(p.lse + (int64_t)row_head(r, packed) * p.lse_head_stride + r.q_start + row_token(r, packed), lse[k]);
    }
  }
}

// The fp32 partial (O normalised by this split's own sum, LSE of this split) of this warp's rows:
// partial_o [num_splits, total_q, Hq, head_dim_v], partial_lse [num_splits, total_q, Hq].
template <class Cfg>
FA_DEVICE void store_partial(const FaPagedPrefillParams &p, const Rows &r, int split, int m0, int warp_row0,
                             const float (&o)[Cfg::kMTiles][Cfg::kHeadDim / 8][4], const float (&lse)[2 * Cfg::kMTiles]) {
  const int t = lane_id() & 3;
#pragma unroll
  for (int k = 0; k < 2 * Cfg::kMTiles; ++k) {
    const int packed = fragment_row(m0 + warp_row0, k);
    if (packed >= r.rows) continue;
    const int64_t row = ((int64_t)split * p.total_q + r.q_start + row_token(r, packed)) * p.heads_q + row_head(r, packed);
    float *dst = p.partial_o + row * p.head_dim_v;
#pragma unroll
    for (int db = 0; db < Cfg::kHeadDim / 8; ++db) {
      const int col = 8 * db + 2 * t;
      if (col < p.head_dim_v)
        st_global(reinterpret_cast<float2 *>(dst + col), make_float2(o[k >> 1][db][2 * (k & 1)], o[k >> 1][db][2 * (k & 1) + 1]));
    }
    if (t == 0) st_global(p.partial_lse + row, lse[k]);
  }
}

// The plain kernels handle causal, a right window bound and sinks; the _mod kernels (kVariant) also
// softcap, ALiBi and a left window bound (fa/score_mod.cuh says why those are compile-time).
// kFp8: an FP8 cache (either format, p.cache.kv_dtype) under 16-bit queries and outputs.
// Grid: (row blocks · num_splits, Hkv, B); block: Cfg::kThreads; dynamic smem: Smem<kHeadDim, kFp8>::kBytes.
template <class T, int kHeadDim, bool kVariant, bool kFp8>
FA_DEVICE void paged_prefill_kernel(const FaPagedPrefillParams &p) {
  using Cfg = TileConfig<kHeadDim>;
  constexpr int kBr = Cfg::kBr;
  constexpr int kBc = Cfg::kBc;
  constexpr int kMT = Cfg::kMTiles;
  constexpr int kTile = kBc * kHeadDim;
  const Dim3 bid = block_idx();
  const int m_blocks = grid_dim().x / p.num_splits;
  const int split = bid.x / m_blocks;
  const int m_block = bid.x % m_blocks;

  Rows r;
  r.b = bid.z;
  r.kv_head = bid.y;
  r.group = p.heads_q / p.heads_kv;
  prefill::varlen_bounds(p.cu_seqlens_q, r.b, p.total_q, r.q_start, r.q_len);
  r.rows = r.q_len * r.group;
  const int m0 = m_block * kBr;
  if (m0 >= r.rows) return; // past this sequence's packed rows: nothing here (for every split alike)
  const PagedView cache{p.cache};
  r.seq_len = cache.seq_len(r.b);
  const int tq = r.q_len;
  const int tk = r.seq_len;
  const int diag = tk - tq;

  // The tokens this CTA's rows cover, and the KV tiles they see (as dense prefill's block range, on tokens).
  const int tok0 = row_token(r, m0);
  const int tok1 = row_token(r, (r.rows - m0 < kBr ? r.rows : m0 + kBr) - 1);
  WindowBounds window = effective_window(p.score_mod, p.causal != 0, tq, tk);
  if constexpr (!kVariant) window.left = tq > tk ? tq : tk; // the plain kernel has no left bound (launcher)
  const prefill::KvBlockRange range = prefill::kv_block_range(tok0, tok1 - tok0 + 1, kBc, tq, tk, window.left, window.right);
  // This split's keys, in tiles: splits are laid out from the first tile these rows see (a window's left
  // edge, or key 0), [n_begin + s · split_tokens / Bc, n_begin + (s + 1) · split_tokens / Bc), the last one
  // running to the end; so a window's keys are split, not the context left of it (split_tokens is a
  // multiple of 64, and Bc divides it).
  const int split_lo = p.num_splits == 1 ? 0 : range.n_begin + (int)((int64_t)split * p.split_tokens / kBc);
  const int split_hi =
      split == p.num_splits - 1 ? range.n_end : range.n_begin + (int)((int64_t)(split + 1) * p.split_tokens / kBc);
  const int n_lo = range.n_begin > split_lo ? range.n_begin : split_lo;
  const int n_hi = range.n_end < split_hi ? range.n_end : split_hi;

  using Sm = Smem<kHeadDim, kFp8>;
  T *sQ = dynamic_smem<T>();
  T *sK = sQ + kBr * kHeadDim;
  T *sV = sK + Sm::kBuffers * kTile;
  unsigned char *smem_bytes = reinterpret_cast<unsigned char *>(sQ);
  [[maybe_unused]] unsigned char *s8 = smem_bytes + Sm::kFp8Offset; // FP8 stage x: K at 2x·kTile, V after
  RowOffsets *ring = reinterpret_cast<RowOffsets *>(smem_bytes + Sm::kRingOffset); // [2][kBc]
  int32_t *holes = reinterpret_cast<int32_t *>(smem_bytes + Sm::kHoleOffset);     // [3][kBc]
  // Tile x's page lookups (a tile ahead of its copy), their publication into ring slot x & 1 and hole slot
  // x % 3, and its copy into K/V buffer buf. Slot reuse: tile x is published in the step of tile x + 2
  // (after its math) and copied in the step of tile x + 1 (after its barrier), so a ring slot is rewritten
  // only after every warp passed the barrier behind its last copy; tile x's holes are read in its own step,
  // right after the barrier, three steps after the slot's previous tile was read.
  // Keys below key_lo are left of every row's window (the _mod kernels' left bound; plain kernels have none):
  // never looked up, zero-filled (kv_tile.cuh).
  const int key_lo = kVariant ? tok0 + diag - window.left : 0;
  auto lookup = [&](int x) { return x >= n_lo ? lookup_tile_row<kBc>(cache, r.b, x * kBc, key_lo, tk) : kNoPage; };
  auto publish = [&](int x, int page) {
    if (x >= n_lo)
      publish_tile_row<kBc>(ring + (x & 1) * kBc, holes + (x % 3) * kBc, cache, x * kBc, key_lo, tk, page);
  };
  auto issue = [&](int x, int buf) {
    // The KV head's K/V bases, formed here from the parameters rather than kept live across the math.
    if constexpr (kFp8) {
      const uint8_t *k_head = static_cast<const uint8_t *>(p.cache.k_cache) + r.kv_head * p.cache.k_head_stride;
      const uint8_t *v_head = static_cast<const uint8_t *>(p.cache.v_cache) + r.kv_head * p.cache.v_head_stride;
      cp_async_paged_fp8_tile<kBc, kHeadDim, Cfg::kThreads>(s8 + 2 * buf * kTile, s8 + (2 * buf + 1) * kTile,
                                                            ring + (x & 1) * kBc, k_head, v_head, p.head_dim,
                                                            p.head_dim_v);
    } else {
      const T *k_head = static_cast<const T *>(p.cache.k_cache) + r.kv_head * p.cache.k_head_stride;
      const T *v_head = static_cast<const T *>(p.cache.v_cache) + r.kv_head * p.cache.v_head_stride;
      cp_async_paged_kv_tile<kBc, kHeadDim, Cfg::kThreads>(sK + buf * kTile, sV + buf * kTile, ring + (x & 1) * kBc,
                                                            k_head, v_head, p.head_dim, p.head_dim_v);
    }
    cp_async_commit();
  };

  // Each CTA row's token (masks, ALiBi distances) and slope, in shared memory (published by the prologue's
  // barrier); sinks are read in the epilogue.
  const int warp_row0 = warp_id() * 16 * kMT;
  const bool warp_active = m0 + warp_row0 < r.rows; // else: loads and barriers only
  int *row_tokens = reinterpret_cast<int *>(smem_bytes + Sm::kRowTokenOffset);
  [[maybe_unused]] float *row_slopes = reinterpret_cast<float *>(smem_bytes + Sm::kRowSlopeOffset);
  for (int row = thread_idx(); row < kBr; row += Cfg::kThreads) {
    st_shared(row_tokens + row, row_token(r, m0 + row));
    if constexpr (kVariant) st_shared(row_slopes + row, alibi_slope_log2(p.score_mod, r.b, row_head(r, m0 + row)));
  }
  // FP8: the KV head's K dequantisation scale folds into the score scale (raw scores are q · stored k).
  const float k_scale = kFp8 ? kv_scale(p.cache.k_scale, p.cache.scale_head_stride, r.kv_head) : 1.0f;
  float softmax_scale_log2 = kFp8 ? p.scale_log2 * k_scale : p.scale_log2;
  [[maybe_unused]] bool has_score_mod = false;
  [[maybe_unused]] ScoreMod mod;
  if constexpr (kVariant) {
    has_score_mod = needs_score_mod(p.score_mod);
    mod = ScoreMod::make(kFp8 ? p.scale * k_scale : p.scale, softmax_scale_log2, p.score_mod.softcap);
    if (has_score_mod) softmax_scale_log2 = 1.0f; // apply_packed_score_mod maps to the exp2 domain
  }
  const LaneAddress<kHeadDim> a_lane = a_lanes<kHeadDim>();
  const LaneAddress<kHeadDim> k_lane = b_nk_lanes<kHeadDim>();

  float o[kMT][kHeadDim / 8][4] = {};
  OnlineSoftmax<kMT> softmax;
  softmax.init();

  if (n_hi > n_lo) {
    publish(n_hi - 1, lookup(n_hi - 1));
    const int page = lookup(n_hi - 2);
    sync_threads(); // the top tile's row offsets (and the row tables) are visible to every thread
    load_q_rows<Cfg>(sQ, p, r, m0);
    [[maybe_unused]] bool rope = false;
    if constexpr (kVariant) {
      rope = rope_enabled(p.rope);
      if (rope) cp_async_commit(); // Q alone: rotated while the top KV tile is in flight
    }
    issue(n_hi - 1, 0);
    publish(n_hi - 2, page);
    if constexpr (kVariant) {
      if (rope) {
        cp_async_wait<1>();
        sync_threads(); // every thread's Q chunks have landed (a pair's partner may be another thread's)
        // Packed row m0 + i is query token row_tokens[i]: at positions[q_start + token], or at its
        // bottom-right position token + seq_len - q_len.
        const int32_t *positions = p.rope.positions != nullptr ? p.rope.positions + r.q_start : nullptr;
        const int rows = r.rows - m0 < kBr ? r.rows - m0 : kBr;
        prefill::rotate_tile_rows<T, kHeadDim, Cfg::kThreads>(p.rope, sQ, rows, [&](int row) {
          const int token = ld_shared(row_tokens + row);
          return positions != nullptr ? (int64_t)ld_global_nc(positions + token) : (int64_t)(token + diag);
        });
      }
    }
  }
  // One KV tile: wait for it, prefetch the next (down to n_lo) and look up the one after, S = Q Kᵀ,
  // (variants), (mask), online softmax, O += P V, publish the looked-up tile.
  auto step = [&](auto masked, int n, int buf) {
    const int next = buf + 1 == Cfg::kStages ? 0 : buf + 1;
    cp_async_wait<0>(); // tile n (and Q) have landed
    sync_threads();     // ... for every thread; every warp is done with step n + 1 (its buffer, its slots)
    int page = kNoPage;
    if (n > n_lo) {
      issue(n - 1, next); // into the buffer of tile n + 1 (2 stages) or n + 2 (3), read before the barrier
      page = lookup(n - 2); // consumed after the math, so its latency is hidden
    }
    int tile = buf; // the 16-bit buffer holding tile n
    if constexpr (kFp8) {
      // Tile n's FP8 bytes -> the 16-bit buffer (free: every warp is past step n + 1's math), all threads.
      using Chunks = SwizzledRowChunks<kHeadDim>;
      const unsigned char *k8 = s8 + 2 * buf * kTile;
      convert_fp8_tile<T, Chunks, kHeadDim, kBc>(p.cache.kv_dtype, k8, reinterpret_cast<unsigned char *>(sK),
                                                 thread_idx(), Cfg::kThreads);
      convert_fp8_tile<T, Chunks, kHeadDim, kBc>(p.cache.kv_dtype, k8 + kTile, reinterpret_cast<unsigned char *>(sV),
                                                 thread_idx(), Cfg::kThreads);
      sync_threads(); // the converted tile is visible to every warp
      tile = 0;
    }
    if (warp_active) {
      float s[kMT][kBc / 8][4] = {};
      gemm_qk<T, Cfg>(s, sQ, sK + tile * kTile, warp_row0, a_lane, k_lane);
      // Holes of this tile: one flag per key row, balloted 32 keys at a time (after the GEMM: fewer live
      // registers across it).
      const int lane = lane_id();
      uint64_t hole_bits = warp_ballot(lane < kBc && ld_shared(holes + (n % 3) * kBc + (lane < kBc ? lane : 0)) != 0);
      if constexpr (kBc == 64)
        hole_bits |= (uint64_t)warp_ballot(ld_shared(holes + (n % 3) * kBc + 32 + lane_id()) != 0) << 32;
      if constexpr (kVariant) {
        if (has_score_mod) apply_packed_score_mod(s, row_tokens, row_slopes, warp_row0, n * kBc, diag, mod);
      }
      if constexpr (decltype(masked)::value)
        apply_packed_mask<kVariant>(s, row_tokens, warp_row0, n * kBc, diag, tk, window.left, window.right);
      if (hole_bits != 0) mask_hole_keys(s, hole_bits);
      softmax.update(s, o, softmax_scale_log2);
      gemm_pv<T, Cfg>(o, s, sV + tile * kTile, a_lane);
    }
    publish(n - 2, page);
    return next;
  };
  static_assert(kBc == 16 || kBc == 32 || kBc == 64, "hole ballots cover up to 64 keys");
  using Masked = Flag<true>;
  using Unmasked = Flag<false>;
  int n = n_hi - 1;
  int buf = 0;
  const int mask_lo = range.n_mask_begin > n_lo ? range.n_mask_begin : n_lo;
  const int interior_lo = range.n_interior_begin > n_lo ? range.n_interior_begin : n_lo;
  // Masked tiles on top (the diagonal, ragged keys) and at the window's left edge, unmasked ones between:
  // one loop with each step inlined once (a warp-uniform branch per tile), not a loop per kind with the
  // masked step twice (as prefill.cu: less code and nvcc time).
  for (; n >= n_lo; --n) {
    if (n >= mask_lo || n < interior_lo)
      buf = step(Masked{}, n, buf);
    else
      buf = step(Unmasked{}, n, buf);
  }

  float lse[2 * kMT];
  float sinks[2 * kMT];
#pragma unroll
  for (int k = 0; k < 2 * kMT; ++k) // split-KV: the merge adds the sinks
    sinks[k] = p.num_splits == 1 ? sink_logit(p.score_mod, row_head(r, fragment_row(m0 + warp_row0, k))) : kNegInf;
  softmax.finalize(o, lse, softmax_scale_log2, sinks);
  if (!warp_active) return;
  if constexpr (kFp8) { // V's dequantisation scale, on the normalised rows (the merge is linear in them)
    const float v_scale = kv_scale(p.cache.v_scale, p.cache.scale_head_stride, r.kv_head);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int db = 0; db < kHeadDim / 8; ++db)
#pragma unroll
        for (int i = 0; i < 4; ++i) o[mt][db][i] *= v_scale;
  }
  if (p.num_splits == 1) {
    store_rows<T, Cfg>(p, r, m0, warp_row0, sQ, o, lse);
  } else {
    store_partial<Cfg>(p, r, split, m0, warp_row0, o, lse);
  }
}

} // namespace
} // namespace paged_prefill
FA_NAMESPACE_END

// One kernel per (dtype, instantiated head-dim width, score mod, cache dtype); 4 warps, like dense prefill.
#define FA_PAGED_PREFILL_KERNEL(name, T, D, kMod, kFp8)                                                      \
  FA_KERNEL(name, fa::paged_prefill::TileConfig<D>::kThreads, fa::paged_prefill::TileConfig<D>::kMinCtasPerSm, \
            FaPagedPrefillParams,                                                                            \
            (fa::paged_prefill::paged_prefill_kernel<T, D, kMod, kFp8>))
#define FA_PAGED_PREFILL_16BIT_KERNELS(dt, T, D)                                                             \
  FA_PAGED_PREFILL_KERNEL(fa_paged_prefill_##dt##_d##D, T, D, false, false)                                  \
  FA_PAGED_PREFILL_KERNEL(fa_paged_prefill_##dt##_d##D##_mod, T, D, true, false)
// _fp8_mod: an FP8 cache (either format, chosen at run time) under 16-bit queries and outputs, for every score
// variant: FP8 paged prefill has no plain twin, which would cost as much nvcc time as all of this file's
// 16-bit kernels (docs/build.md); a plain call pays the variant kernel's run-time checks (no softcap / ALiBi:
// one uniform branch per tile; the left window bound's compare in edge tiles), at the same registers.
#define FA_PAGED_PREFILL_FP8_KERNELS(dt, T, D)                                                               \
  FA_PAGED_PREFILL_KERNEL(fa_paged_prefill_##dt##_d##D##_fp8_mod, T, D, true, true)
// nvcc builds this file's kernels in two jobs that run in parallel: this file the 16-bit-cache ones,
// kernels/paged_prefill_fp8.cu (this file with FA_PAGED_PREFILL_FP8_JOB) the FP8-cache ones, whose SASS for
// sm_90 comes from a compute_89 front end (the hardware FP8 conversion; build.rs: code_changes_at). The host
// build (launchers, emulator) has them all.
#if defined(FA_HOST_BUILD)
#define FA_PAGED_PREFILL_KERNELS(dt, T, D) FA_PAGED_PREFILL_16BIT_KERNELS(dt, T, D) FA_PAGED_PREFILL_FP8_KERNELS(dt, T, D)
#elif defined(FA_PAGED_PREFILL_FP8_JOB)
#define FA_PAGED_PREFILL_KERNELS(dt, T, D) FA_PAGED_PREFILL_FP8_KERNELS(dt, T, D)
#else
#define FA_PAGED_PREFILL_KERNELS(dt, T, D) FA_PAGED_PREFILL_16BIT_KERNELS(dt, T, D)
#endif
#define FA_PAGED_PREFILL_WIDTH_KERNELS(D)                                                                    \
  FA_PAGED_PREFILL_KERNELS(f16, fa::half_t, D) FA_PAGED_PREFILL_KERNELS(bf16, fa::bf16_t, D)
FA_PAGED_PREFILL_WIDTHS(FA_PAGED_PREFILL_WIDTH_KERNELS)
#undef FA_PAGED_PREFILL_WIDTH_KERNELS

#if defined(FA_HOST_BUILD)
#include "fa/tile_policy.h"

namespace fa {
namespace paged_prefill {
namespace {

// Softcap, ALiBi or any left window bound need the _mod kernels (a bound that excludes nothing only costs the
// variant kernel's extra compare; the host does not know the sequence lengths to rule it out), and so does
// RoPE (only they rotate q: fa/prefill/rope_tile.cuh).
bool needs_variant_kernel(const FaPagedPrefillParams &p) {
  return needs_score_mod(p.score_mod) || p.score_mod.window_left >= 0 || rope_enabled(p.rope);
}

template <int kHeadDim, bool kFp8>
int launch_paged_prefill(void (*kernel)(FaPagedPrefillParams), const char *name, const FaPagedPrefillParams &p,
                         FaExec *exec) {
  using Cfg = TileConfig<kHeadDim>;
  const int64_t rows = (int64_t)p.max_seqlen_q * (p.heads_q / p.heads_kv);
  const int64_t m_blocks = (rows + Cfg::kBr - 1) / Cfg::kBr;
  if (m_blocks == 0) return FA_OK; // nothing to compute
  if (m_blocks * p.num_splits > 0x7fffffff) return FA_ERR_INVALID;
  return launch(name, kernel, Dim3{(int)(m_blocks * p.num_splits), p.heads_kv, p.batch}, Cfg::kThreads,
                Smem<kHeadDim, kFp8>::kBytes, exec, p);
}

// One case per instantiated width (FA_PAGED_PREFILL_WIDTHS): the kernel of the call's dtype, cache format and
// variant (the FP8 kernel serves every variant, see its instantiation).
#define FA_PAGED_PREFILL_DTYPE_CASE(dt, D)                                                                   \
  if (fp8)                                                                                                   \
    return launch_paged_prefill<D, true>(FA_KERNEL_REF(fa_paged_prefill_##dt##_d##D##_fp8_mod), p, exec);     \
  return mod ? launch_paged_prefill<D, false>(FA_KERNEL_REF(fa_paged_prefill_##dt##_d##D##_mod), p, exec)      \
             : launch_paged_prefill<D, false>(FA_KERNEL_REF(fa_paged_prefill_##dt##_d##D), p, exec);
#define FA_PAGED_PREFILL_CASE(D)                                                                             \
  case D:                                                                                                    \
    if (p.dtype == FA_DTYPE_F16) {                                                                           \
      FA_PAGED_PREFILL_DTYPE_CASE(f16, D)                                                                    \
    }                                                                                                        \
    FA_PAGED_PREFILL_DTYPE_CASE(bf16, D)
int dispatch(const FaPagedPrefillParams &p, FaExec *exec) {
  if (!head_dim_supported(p.head_dim) || !head_dim_supported(p.head_dim_v)) return FA_ERR_UNSUPPORTED;
  if (p.dtype != FA_DTYPE_F16 && p.dtype != FA_DTYPE_BF16) return FA_ERR_UNSUPPORTED;
  const bool mod = needs_variant_kernel(p);
  const bool fp8 = p.cache.kv_dtype != FA_KV_SAME;
  // The width of the wider head dim (K columns past Dqk and V columns past Dv zero-filled).
  const int widest = p.head_dim > p.head_dim_v ? p.head_dim : p.head_dim_v;
  switch (paged_prefill_width(widest)) { FA_PAGED_PREFILL_WIDTHS(FA_PAGED_PREFILL_CASE) }
  return FA_ERR_UNSUPPORTED;
}
#undef FA_PAGED_PREFILL_DTYPE_CASE
#undef FA_PAGED_PREFILL_CASE

// Preconditions the Rust layer checks; re-checked here because they guard memory safety.
inline bool valid_params(const FaPagedPrefillParams &p) {
  const FaPagedCache &c = p.cache;
  if (p.batch < 0 || p.heads_kv <= 0 || p.heads_q <= 0 || p.heads_q % p.heads_kv != 0) return false;
  if (!head_dim_supported(p.head_dim)) return false;
  if (!valid_paged_cache_for_read(c, p.head_dim, p.batch)) return false;
  if (!head_dim_supported(p.head_dim_v) || !valid_cache_format(c, p.head_dim_v)) return false;
  if (p.total_q < 0 || p.max_seqlen_q < 0 || p.num_splits < 1) return false;
  if (!(p.scale_log2 > 0.0f)) return false; // the row max is taken on raw scores
  // Packed rows (token · G) and positions plus window bounds stay inside int32 (fa/score_mod.cuh).
  const int64_t group = p.heads_q / p.heads_kv;
  if ((int64_t)p.total_q * group > (1 << 30) || (int64_t)p.max_seqlen_q * group > (1 << 30)) return false;
  if ((int64_t)c.max_pages_per_seq * c.page_size > (1 << 30)) return false;
  // Memory safety: every pointer the kernel dereferences (lse is optional).
  if (p.batch > 0 && (p.q == nullptr || p.o == nullptr || p.cu_seqlens_q == nullptr)) return false;
  if (p.num_splits > 1 && (p.split_tokens <= 0 || p.split_tokens % FA_SPLIT_GRANULE != 0 || p.partial_o == nullptr ||
                           p.partial_lse == nullptr))
    return false;
  // 16-byte cp.async / stores of every row: aligned bases and element strides (multiples of 8 16-bit elements).
  const void *ptrs[] = {p.q, p.o, p.partial_o};
  for (const void *ptr : ptrs)
    if (((uintptr_t)ptr & 15u) != 0) return false;
  const int64_t strides[] = {p.q_row_stride, p.q_head_stride, p.o_row_stride, p.o_head_stride};
  for (int64_t s : strides)
    if (s < 0 || s % 8 != 0) return false;
  if (((uintptr_t)p.lse & 3u) != 0 || ((uintptr_t)p.partial_lse & 3u) != 0 || p.lse_head_stride < 0) return false;
  if (((uintptr_t)p.cu_seqlens_q & 3u) != 0) return false;
  if (!valid_score_mod(p.score_mod, p.heads_q)) return false;
  if (!valid_rope(p.rope, p.head_dim)) return false;
  return p.heads_kv <= 65535 && p.batch <= 65535;
}

} // namespace

// The kernel dispatch() runs for a head dim, variant and cache format, and its launch shape (abi.h,
// fa_tile_policy).
int tile_policy(int head_dim, bool fp8, FaTilePolicy *out) {
  if (!head_dim_supported(head_dim)) return FA_ERR_UNSUPPORTED;
#define FA_PAGED_PREFILL_POLICY(D)                                                                           \
  case D:                                                                                                    \
    static_assert(FA_SPLIT_GRANULE % TileConfig<D>::kBc == 0, "a split is whole KV tiles");                 \
    *out = FaTilePolicy{D,                                                                                   \
                        TileConfig<D>::kBr,                                                                  \
                        TileConfig<D>::kBc,                                                                  \
                        TileConfig<D>::kStages,                                                              \
                        TileConfig<D>::kThreads,                                                             \
                        fp8 ? Smem<D, true>::kBytes : Smem<D, false>::kBytes,                                \
                        TileConfig<D>::kMinCtasPerSm,                                                        \
                        TileConfig<D>::kLean};                                                               \
    return FA_OK;
  switch (paged_prefill_width(head_dim)) { FA_PAGED_PREFILL_WIDTHS(FA_PAGED_PREFILL_POLICY) }
#undef FA_PAGED_PREFILL_POLICY
  return FA_ERR_UNSUPPORTED;
}

} // namespace paged_prefill
} // namespace fa

extern "C" int fa_paged_prefill(FaPagedPrefillParams p, FaExec *exec) {
  using namespace fa::paged_prefill;
  if (p.head_dim_v == 0) p.head_dim_v = p.head_dim; // V and O as wide as Q and K (the kernel reads it as given)
  if (!valid_params(p)) return FA_ERR_INVALID;
  if (p.batch == 0 || p.total_q == 0 || p.max_seqlen_q == 0) return FA_OK;
  const int status = dispatch(p, exec);
  if (status != FA_OK || p.num_splits == 1) return status;

  // Split-KV: combine the partials into o [total_q, Hq, D] / lse [Hq, total_q], rows = query tokens.
  return fa::merge_split_kv_partials(p, p.total_q, p.o_row_stride, 1, p.lse_head_stride, exec);
}
#endif // FA_HOST_BUILD
