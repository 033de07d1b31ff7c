// Fused prefill attention (FlashAttention-2 forward, sm_80+): O = softmax(Q Kᵀ · scale) V without ever
// materialising the Tq x Tk score matrix.
//
// One CTA per (query tile of Br rows, query head, sequence); 4 warps, each owning 16·kMTiles query rows
// (fa/prefill/tile_config.cuh). Per CTA:
//   load Q tile and the top KV tile (cp.async, zero-filled past the sequence end);
//   for each KV tile n from the top down (tiles above the causal diagonal or outside the sliding window are
//   never visited):
//     prefetch tile n-1 into the next K/V buffer (2-3 buffers: its loads fly under tile n's math);
//     S = Q Kᵀ            (mma m16n8k16; Q and K through ldmatrix from swizzled smem, fp32 accumulate)
//     score variants      (kVariant kernels only: softcap and ALiBi, fa/score_mod.cuh)
//     mask S              (only the tiles that cross the diagonal, a window edge or the ragged Tk edge: a
//                          masked loop, the mask-free loop, a masked loop, see fa/prefill/block_range.cuh)
//     online softmax      (exp2 domain, scale folded into one FFMA, quad-shuffle row max; P stays in the
//                          registers of S, fa/online_softmax.cuh)
//     O += P V            (P converted to 16-bit in registers as the A operand; V through ldmatrix.trans)
//   O /= rowsum (with the sink, if any, in it), LSE = ln-domain log-sum-exp; rows that saw no key: O = 0,
//   LSE = -inf (or the sink's logit).
// The kernel's head dim is a tile width W (Cfg::kHeadDim); it serves every head dim D <= W that
// fa/head_dim.cuh maps to it: Q, K and V columns at or past D are zero-filled, never read, and O's are never
// stored. A V head dim Dv different from Q and K's Dqk (p.head_dim_v; DeepSeek's 192/128) runs at the width
// of the wider (pair_width below), Q/K columns predicated at Dqk and V/O columns at Dv: the zero Q/K
// columns add nothing to Q Kᵀ, the zero V columns give zero O columns, which are not stored.
//
// RoPE (p.rope, fa/prefill/rope_tile.cuh): run-time switches in the _mod kernels (the launcher sends every
// RoPE call to the _mod kernel of its width; the plain kernels hold no RoPE code). q: in the prologue; the Q
// tile is committed as a copy group of its own, so the top KV tile's loads fly while the tile is rotated in
// place. K (p.rope_k): in each KV step, once the tile has landed and before Q Kᵀ, one more barrier per tile;
// K is read from global memory exactly as without RoPE and never written back.
#include "fa/abi.h"
#include "fa/head_dim.cuh"
#include "fa/intrinsics.cuh"
#include "fa/mma_tile.cuh"
#include "fa/online_softmax.cuh"
#include "fa/prefill/block_range.cuh"
#include "fa/prefill/mask.cuh"
#include "fa/prefill/rope_tile.cuh"
#include "fa/prefill/seq_info.cuh"
#include "fa/prefill/tile_config.cuh"
#include "fa/prefill/stage_o.cuh"
#include "fa/prefill/tile_math.cuh"
#include "fa/score_mod.cuh"
#include "fa/swizzle.cuh"
#include "fa/tile_copy.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN
namespace prefill {
// File-local: kernels and launch helpers are reached only through this file's extern "C" launcher. (The GPU
// and emulator builds never share a symbol in any case: fa/namespace.cuh.)
namespace {

// K and V row 0 of this sequence and KV head: what the K/V loads inside the KV loop start from.
template <class T> struct alignas(16) KvBases {
  const T *k;
  const T *v;
};
// What the lean configs (tile_config.cuh) keep in shared memory, one copy per warp, instead of registers
// across the KV loop: the K/V bases of the in-loop loads, and where the epilogue writes.
template <class T> struct alignas(16) WarpPark {
  KvBases<T> kv;
  int64_t o_offset, lse_offset; // SeqInfo's
  int m0, tq;
};
static_assert(sizeof(WarpPark<half_t>) == 48, "tile_config.cuh counts 48 bytes per warp");

// x, opaque to the compiler: neither hoisted out of a loop nor held in a register across one, but recomputed
// where used, for one S2R and two integer ops. thread_idx_reread() >> 31 is 0 (thread indices are below
// 2^31), which the compiler cannot know (a volatile read: fa/intrinsics.cuh).
FA_DEVICE int opaque_to_compiler(int x) { return x + (thread_idx_reread() >> 31); }

// Everything one CTA works on, so that the per-tile step below reads like the algorithm.
template <class T, class Cfg> struct CtaContext {
  const T *k; // row 0 of this sequence and KV head
  const T *v;
  int64_t k_row_stride, v_row_stride;
  T *sQ;
  T *sK; // Cfg::kStages buffers of kBc x D
  T *sV;
  int m0, tq, tk, warp_row0;
  typename Cfg::Lane a_lane; // ldmatrix lanes for Q (A) and V (trans B)
  typename Cfg::Lane k_lane; // ldmatrix lanes for K (B)
  WindowBounds window;               // effective bounds (causal: right = 0), fa/score_mod.cuh
  float softmax_scale_log2; // scale_log2, or 1 when apply_score_mod has mapped the scores to the exp2 domain
  // kVariant kernels only:
  bool has_score_mod; // softcap or ALiBi
  ScoreMod score_mod;
  float slope_log2; // this head's ALiBi slope · log2 e (0 without ALiBi)
  bool rope_k;      // rotate each K tile as it lands (p.rope_k)
  int k_position0;  // without explicit key positions: the position of key row 0 (the left-window skip)
  const int32_t *k_positions; // explicit key positions, the entry of key row 0; else nullptr
  // Cfg::kLean only: this warp's park and this thread's parked row sums, in shared memory.
  const WarpPark<T> *warp_park;
  Bytes16 *row_sum_park;

  // Starts loading KV tile n into buffer buf. Only the top tile can be ragged (Tk % Bc != 0), and it is
  // loaded before the loop (kPredicated); the tiles prefetched inside the loop lie below it, so they are
  // always full and skip the row predicates. K columns at or past head_dim and V columns at or past
  // head_dim_v (both <= Cfg::kHeadDim) are zero-filled.
  // The lean configs load the in-loop tiles from the parked bases with RowWalkCopy (fa/tile_copy.cuh), which
  // holds no register across the loop.
  template <bool kPredicated> FA_DEVICE void load_kv_async(int n, int buf, int head_dim, int head_dim_v) const {
    constexpr int kTile = Cfg::kBc * Cfg::kHeadDim;
    const int key0 = n * Cfg::kBc;
    // The column bounds, opaque inside the KV loop (widths with predicated columns; at 128 they are
    // compile-time constants that fold away): K's and V's per-thread predicates and column offsets are
    // recomputed per tile (a few integer ops) rather than held in registers across the loop. Measured with
    // ptxas -v: with V's bound of its own and no opaque bounds the d256 _mod kernel spilled 60 bytes on sm_80
    // and 16 on sm_90; V's bound alone opaque still spilled 40 on sm_90; both opaque: spill-free.
    if constexpr (!kPredicated && kPredicatedColumns<Cfg::kHeadDim>) {
      head_dim = opaque_to_compiler(head_dim);
      head_dim_v = opaque_to_compiler(head_dim_v);
    }
    if constexpr (Cfg::kLean && !kPredicated) {
      using Copy = RowWalkCopy<Cfg::kBc, Cfg::kHeadDim, Cfg::kThreads>;
      const KvBases<T> bases = ld_shared(&warp_park->kv);
      Copy::copy(sK + buf * kTile, bases.k + key0 * k_row_stride, k_row_stride, head_dim);
      Copy::copy(sV + buf * kTile, bases.v + key0 * v_row_stride, v_row_stride, head_dim_v);
      return;
    }
    cp_async_tile<Cfg::kBc, Cfg::kHeadDim, Cfg::kThreads, kPredicated>(sK + buf * kTile, k + key0 * k_row_stride,
                                                                       k_row_stride, tk - key0, head_dim);
    cp_async_tile<Cfg::kBc, Cfg::kHeadDim, Cfg::kThreads, kPredicated>(sV + buf * kTile, v + key0 * v_row_stride,
                                                                       v_row_stride, tk - key0, head_dim_v);
  }
};

// The lean configs' parked row sums (tile_config.cuh): the 2·kMTiles partial sums of OnlineSoftmax live in
// this thread's 16 bytes of shared memory between softmax updates, not in registers through both GEMMs.
template <class Cfg> FA_DEVICE void unpark_row_sums(const Bytes16 *park, OnlineSoftmax<Cfg::kMTiles> &softmax) {
  static_assert(2 * Cfg::kMTiles == 4, "one 16-byte slot per thread");
  const Bytes16 b = ld_shared(park);
#pragma unroll
  for (int r = 0; r < 4; ++r) __builtin_memcpy(&softmax.row_sum[r], &b.w[r], 4);
}
template <class Cfg> FA_DEVICE void park_row_sums(Bytes16 *park, const OnlineSoftmax<Cfg::kMTiles> &softmax) {
  Bytes16 b;
#pragma unroll
  for (int r = 0; r < 4; ++r) __builtin_memcpy(&b.w[r], &softmax.row_sum[r], 4);
  st_shared(park, b);
}

// The buffer after `buf` in the ring of Cfg::kStages K/V buffers.
template <class Cfg> FA_DEVICE int next_buffer(int buf) { return buf + 1 == Cfg::kStages ? 0 : buf + 1; }

// One KV tile: prefetch the next (down to n_begin), wait for this one, S = Q Kᵀ, (score variants), (mask),
// online softmax, O += P V.
template <bool kMasked, bool kVariant, class T, class Cfg>
FA_DEVICE void kv_tile_step(const CtaContext<T, Cfg> &cta, const FaRope &rope, int n, int n_begin, int buf,
                            int head_dim, int head_dim_v, float (&o)[Cfg::kMTiles][Cfg::kHeadDim / 8][4],
                            OnlineSoftmax<Cfg::kMTiles> &softmax) {
  constexpr int kTile = Cfg::kBc * Cfg::kHeadDim;
  if (n > n_begin) {
    // With 3 buffers, next_buffer(buf) was last read two steps ago, before every warp passed the previous
    // step's barrier; with 2 it was read in the previous step, ordered by that step's trailing barrier.
    cta.template load_kv_async<false>(n - 1, next_buffer<Cfg>(buf), head_dim, head_dim_v);
    cp_async_commit();
    cp_async_wait<1>(); // everything but the prefetch just issued: tile n (and Q) have landed
  } else {
    cp_async_wait<0>();
  }
  sync_threads(); // every thread's part of tile n is visible to every warp
  if constexpr (kVariant) {
    if (cta.rope_k) {
      // RoPE on K: the tile's keys rotated in place at their positions (rows past Tk, the top tile's zero
      // fill, are not; they are never seen). The buffer is refilled only after every warp has passed this
      // step's barriers, so the rotated rows are what Q Kᵀ reads, and global K is never written.
      const int key0 = n * Cfg::kBc;
      const int rows = cta.tk - key0 < Cfg::kBc ? cta.tk - key0 : Cfg::kBc;
      rotate_tile_rows<T, Cfg::kHeadDim, Cfg::kThreads>(rope, cta.sK + buf * kTile, rows, [&](int row) {
        return cta.k_positions != nullptr ? (int64_t)ld_global_nc(cta.k_positions + key0 + row)
                                          : (int64_t)(cta.k_position0 + key0 + row);
      });
      sync_threads(); // the rotated rows are visible to every warp
    }
  }

  float s[Cfg::kMTiles][Cfg::kBc / 8][4] = {};
  gemm_qk<T, Cfg>(s, cta.sQ, cta.sK + buf * kTile, cta.warp_row0, cta.a_lane, cta.k_lane);
  if constexpr (kVariant) {
    if (cta.has_score_mod)
      apply_score_mod(s, cta.m0 + cta.warp_row0, n * Cfg::kBc, cta.tk - cta.tq, cta.score_mod, cta.slope_log2);
  }
  if (kMasked)
    apply_kv_mask<kVariant>(s, cta.m0 + cta.warp_row0, n * Cfg::kBc, cta.tq, cta.tk, cta.window.left,
                            cta.window.right);
  if constexpr (Cfg::kLean) unpark_row_sums<Cfg>(cta.row_sum_park, softmax);
  softmax.update(s, o, cta.softmax_scale_log2);
  if constexpr (Cfg::kLean) park_row_sums<Cfg>(cta.row_sum_park, softmax);
  gemm_pv<T, Cfg>(o, s, cta.sV + buf * kTile, cta.a_lane);

  // Double buffering: every warp must be done with `buf` before the next step refills it.
  if (Cfg::kStages == 2) sync_threads();
}

// Writes this warp's rows of O (16-bit) and LSE (fp32, if requested); rows past Tq and columns past
// head_dim_v (V's and O's head dim) are not written. O is staged through this warp's own rows of the Q tile
// (fa/prefill/stage_o.cuh).
template <class T, class Cfg>
FA_DEVICE void store_output(const FaPrefillParams &p, const SeqInfo &seq, int m0, int warp_row0, T *sQ,
                            const float (&o)[Cfg::kMTiles][Cfg::kHeadDim / 8][4], const float (&lse)[2 * Cfg::kMTiles],
                            int head_dim_v) {
  using Layout = SwizzledRows<Cfg::kHeadDim>;
  constexpr int kRows = 16 * Cfg::kMTiles;
  constexpr int kChunks = Cfg::kHeadDim / 8;
  static_assert(kRows * kChunks % kWarpSize == 0, "whole chunks per lane");
  const int g = lane_id() >> 2;
  const int t = lane_id() & 3;
  stage_o_rows<T, Cfg>(sQ, warp_row0, o);
  T *out = static_cast<T *>(p.o) + seq.o_offset;
#pragma unroll
  for (int i = 0; i < kRows * kChunks / kWarpSize; ++i) {
    const int idx = i * kWarpSize + lane_id();
    const int r = idx / kChunks;
    const int c = (idx % kChunks) * 8;
    const int row = m0 + warp_row0 + r;
    if (row < seq.tq && c < head_dim_v) {
      const Bytes16 chunk = ld_shared(reinterpret_cast<const Bytes16 *>(sQ + Layout::offset(warp_row0 + r, c)));
      st_global(reinterpret_cast<Bytes16 *>(out + row * p.o_row_stride + c), chunk);
    }
  }
  if (p.lse != nullptr && t == 0) {
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + warp_row0 + 16 * mt + 8 * h + g;
        if (row < seq.tq) st_global(p.lse + seq.lse_offset + row, lse[2 * mt + h]);
      }
    }
  }
}

// The plain kernels handle causal, a right window bound and sinks (run-time: the block range, the mask's
// upper bound, the epilogue); the _mod kernels (kVariant) also softcap, ALiBi and a left window bound
// (fa/score_mod.cuh says why those are compile-time).
// Grid: (query tiles, Hq, B). Block: Cfg::kThreads. Dynamic smem: Cfg::kSmemBytes. The kernels are the
// FA_KERNEL instantiations below.
template <class T, int kHeadDim, bool kVariant> FA_DEVICE void prefill_kernel(const FaPrefillParams &p) {
  using Cfg = KernelTile<kHeadDim, kVariant>;
  constexpr int kBr = Cfg::kBr;
  const Dim3 bid = block_idx();
  // Causal tiles lower down the sequence visit more KV tiles: launch those first (longest first), so the
  // short ones fill the tail of the grid.
  const int m_block = p.causal ? grid_dim().x - 1 - bid.x : bid.x;
  SeqInfo seq = seq_info(p, bid.z, bid.y);
  const int m0 = m_block * kBr;
  if (m0 >= seq.tq) return; // past this sequence's end (varlen, or an empty sequence): no rows here
  // The window's bounds, effective for this sequence (fa/score_mod.cuh; causal: right = 0).
  WindowBounds window = effective_window(p.score_mod, p.causal != 0, seq.tq, seq.tk);
  [[maybe_unused]] const int rope_delta = seq.tk - seq.tq; // RoPE's bottom-right offset, before any key skip
  [[maybe_unused]] int key_skip = 0;                        // keys left of every row's window (below)
  if constexpr (kVariant) {
    // Keys left of every row's window (chunked prefill with a window: the first row sees from δ − left on)
    // are hidden memory: an engine may have freed their pages, so they can hold anything. Masking their
    // scores is not enough (P = 0 times a NaN or Inf V row is NaN, docs/semantics.md), so the sequence is
    // made to start at its first visible key: K/V move down `skip` rows and Tk shrinks by as much, which
    // keeps every row's visible keys, the window and ALiBi distances (both relative to δ = Tk − Tq), and
    // makes the first query tile's bottom tile start at that key. Every other tile a CTA loads then holds
    // only keys some row of the sequence sees. Prologue only: the KV loop is unchanged.
    const int skip = seq.tk - seq.tq - window.left;
    if (skip > 0) {
      seq.k_offset += skip * p.k_row_stride;
      seq.v_offset += skip * p.v_row_stride;
      seq.tk -= skip;
      key_skip = skip;
    }
  }

  // The columns this kernel loads and stores: Q and K's head dim (Dqk) and V and O's (Dv: the launcher sets
  // head_dim_v, equal to head_dim unless the call's V is narrower or wider), or (a width without predicated
  // columns, tile_config.cuh) the compile-time width, which folds every column check away. Dv only moves
  // the V copies' per-thread column predicate and the O stores' column bound; inside the KV loop both bounds
  // are opaque to the compiler (load_kv_async), so neither holds a register across it.
  const int head_dim = kPredicatedColumns<kHeadDim> ? p.head_dim : kHeadDim;
  const int head_dim_v = kPredicatedColumns<kHeadDim> ? p.head_dim_v : kHeadDim;
  CtaContext<T, Cfg> cta;
  cta.a_lane = a_lanes<kHeadDim, Cfg::template LaneOf>();
  cta.k_lane = b_nk_lanes<kHeadDim, Cfg::template LaneOf>();
  cta.k = static_cast<const T *>(p.k) + seq.k_offset;
  cta.v = static_cast<const T *>(p.v) + seq.v_offset;
  cta.k_row_stride = p.k_row_stride;
  cta.v_row_stride = p.v_row_stride;
  cta.sQ = dynamic_smem<T>();
  cta.sK = cta.sQ + kBr * kHeadDim;
  cta.sV = cta.sK + Cfg::kStages * Cfg::kBc * kHeadDim;
  cta.m0 = m0;
  cta.tq = seq.tq;
  cta.tk = seq.tk;
  cta.warp_row0 = warp_id() * 16 * Cfg::kMTiles;
  cta.window = window;
  cta.softmax_scale_log2 = p.scale_log2;
  if constexpr (kVariant) {
    cta.has_score_mod = needs_score_mod(p.score_mod);
    cta.score_mod = ScoreMod::make(p.scale, p.scale_log2, p.score_mod.softcap);
    cta.slope_log2 = alibi_slope_log2(p.score_mod, bid.z, bid.y);
    if (cta.has_score_mod) cta.softmax_scale_log2 = 1.0f;
    // RoPE on K: key row j (after the skip) of sequence b sits at position key_skip + j, or at
    // rope_k_positions[k_row0_b + key_skip + j] (k_row0_b: the sequence's first packed key row).
    cta.rope_k = rope_enabled(p.rope) && p.rope_k != 0;
    cta.k_position0 = key_skip;
    cta.k_positions = nullptr;
    if (cta.rope_k && p.rope_k_positions != nullptr) {
      int64_t k_row0 = (int64_t)bid.z * p.seqlen_k;
      if (p.cu_seqlens_k != nullptr) {
        int k_start, k_len;
        varlen_bounds(p.cu_seqlens_k, bid.z, p.total_k, k_start, k_len);
        k_row0 = k_start;
      }
      cta.k_positions = p.rope_k_positions + k_row0 + key_skip;
    }
  } else {
    cta.window.left = seq.tq > seq.tk ? seq.tq : seq.tk; // the plain kernel has no left bound (launcher)
  }

  const KvBlockRange range =
      kv_block_range(m0, kBr, Cfg::kBc, seq.tq, seq.tk, cta.window.left, cta.window.right);

  float o[Cfg::kMTiles][kHeadDim / 8][4] = {};
  OnlineSoftmax<Cfg::kMTiles> softmax;
  softmax.init();
  if constexpr (Cfg::kLean) {
    WarpPark<T> *parks = reinterpret_cast<WarpPark<T> *>(cta.sV + Cfg::kStages * Cfg::kBc * kHeadDim);
    cta.warp_park = parks + warp_id();
    cta.row_sum_park = reinterpret_cast<Bytes16 *>(parks + Cfg::kWarps) + thread_idx();
    if (lane_id() == 0) {
      st_shared(parks + warp_id(), WarpPark<T>{KvBases<T>{cta.k, cta.v}, seq.o_offset, seq.lse_offset, m0, seq.tq});
    }
    park_row_sums<Cfg>(cta.row_sum_park, softmax);
    sync_warp(); // lane 0's park is visible to the whole warp before its first in-loop load
  }

  if (range.n_end > range.n_begin) {
    const T *q = static_cast<const T *>(p.q) + seq.q_offset + m0 * p.q_row_stride;
    cp_async_tile<kBr, kHeadDim, Cfg::kThreads, true>(cta.sQ, q, p.q_row_stride, seq.tq - m0, head_dim);
    [[maybe_unused]] bool rope = false;
    if constexpr (kVariant) {
      rope = rope_enabled(p.rope);
      if (rope) cp_async_commit(); // Q alone: rotated while the KV tile below is in flight
    }
    cta.template load_kv_async<true>(range.n_end - 1, 0, head_dim, head_dim_v);
    cp_async_commit();
    if constexpr (kVariant) {
      if (rope) {
        cp_async_wait<1>();
        sync_threads(); // every thread's Q chunks have landed (a pair's partner may be another thread's)
        // Query row m0 + i at positions[q_row0 + m0 + i] (q_row0: the sequence's first packed row) or at
        // its bottom-right position m0 + i + Tk - Tq.
        const int32_t *positions = p.rope.positions;
        if (positions != nullptr) {
          int64_t q_row0 = (int64_t)bid.z * p.seqlen_q;
          if (p.cu_seqlens_q != nullptr) {
            int q_start, q_len;
            varlen_bounds(p.cu_seqlens_q, bid.z, p.total_q, q_start, q_len);
            q_row0 = q_start;
          }
          positions += q_row0 + m0;
        }
        const int first = m0 + rope_delta;
        const int rows = seq.tq - m0 < kBr ? seq.tq - m0 : kBr;
        rotate_tile_rows<T, kHeadDim, Cfg::kThreads>(p.rope, cta.sQ, rows, [&](int row) {
          return positions != nullptr ? (int64_t)ld_global_nc(positions + row) : (int64_t)(first + row);
        });
      }
    }
  }
  int buf = 0;
  if constexpr (kVariant) {
    // Masked tiles sit at both ends of the range (the diagonal on top, the window's left edge below) and
    // unmasked ones between: one loop over the range with the masked and the unmasked tile step each
    // inlined once (a warp-uniform branch per tile) rather than a loop per kind with the masked step twice
    // (a quarter of prefill.cu's nvcc time, tile_config.cuh).
    for (int n = range.n_end - 1; n >= range.n_begin; --n, buf = next_buffer<Cfg>(buf)) {
      if (n >= range.n_mask_begin || n < range.n_interior_begin)
        kv_tile_step<true, kVariant>(cta, p.rope, n, range.n_begin, buf, head_dim, head_dim_v, o, softmax);
      else
        kv_tile_step<false, kVariant>(cta, p.rope, n, range.n_begin, buf, head_dim, head_dim_v, o, softmax);
    }
  } else {
    // The masked tiles on top, then the unmasked ones (no left window bound in a plain kernel).
    int n = range.n_end - 1;
    for (; n >= range.n_mask_begin; --n, buf = next_buffer<Cfg>(buf))
      kv_tile_step<true, kVariant>(cta, p.rope, n, 0, buf, head_dim, head_dim_v, o, softmax);
    for (; n >= 0; --n, buf = next_buffer<Cfg>(buf))
      kv_tile_step<false, kVariant>(cta, p.rope, n, 0, buf, head_dim, head_dim_v, o, softmax);
  }

  if constexpr (Cfg::kLean) unpark_row_sums<Cfg>(cta.row_sum_park, softmax);
  float lse[2 * Cfg::kMTiles];
  softmax.finalize(o, lse, cta.softmax_scale_log2, sink_logit(p.score_mod, bid.y));
  if constexpr (Cfg::kLean) {
    const WarpPark<T> park = ld_shared(cta.warp_park);
    SeqInfo out = seq;
    out.o_offset = park.o_offset;
    out.lse_offset = park.lse_offset;
    out.tq = park.tq;
    store_output<T, Cfg>(p, out, park.m0, warp_id() * 16 * Cfg::kMTiles, cta.sQ, o, lse, head_dim_v);
  } else {
    store_output<T, Cfg>(p, seq, m0, cta.warp_row0, cta.sQ, o, lse, head_dim_v);
  }
}

} // namespace
} // namespace prefill
FA_NAMESPACE_END

// One kernel per (dtype, tile width (fa/head_dim.cuh maps head dims to widths), score mod); 4 warps, one CTA
// per SM at 255 registers (tile_config.cuh).
// The _mod kernels apply softcap and ALiBi to every score (fa/score_mod.cuh says why that is a template).
#define FA_PREFILL_KERNEL(name, T, D, kMod)                                                                  \
  FA_KERNEL(name, (fa::prefill::KernelTile<D, kMod>::kThreads), (fa::prefill::KernelTile<D, kMod>::kMinCtasPerSm), \
            FaPrefillParams, (fa::prefill::prefill_kernel<T, D, kMod>))
#define FA_PREFILL_KERNELS(D)                                                                                \
  FA_PREFILL_KERNEL(fa_prefill_f16_d##D, fa::half_t, D, false)                                                \
  FA_PREFILL_KERNEL(fa_prefill_f16_d##D##_mod, fa::half_t, D, true)                                           \
  FA_PREFILL_KERNEL(fa_prefill_bf16_d##D, fa::bf16_t, D, false)                                               \
  FA_PREFILL_KERNEL(fa_prefill_bf16_d##D##_mod, fa::bf16_t, D, true)
FA_PREFILL_WIDTHS(FA_PREFILL_KERNELS)
#undef FA_PREFILL_KERNELS

#if defined(FA_HOST_BUILD)
#include "fa/tile_policy.h"

namespace fa {
namespace prefill {
namespace {

template <int kHeadDim, bool kVariant>
int launch_prefill(void (*kernel)(FaPrefillParams), const char *name, const FaPrefillParams &p, FaExec *exec) {
  using Cfg = KernelTile<kHeadDim, kVariant>;
  // A width without predicated columns computes exactly kHeadDim columns (fa/head_dim.cuh never maps
  // another dim to it; this guards the kernel's memory safety should the mapping change).
  if (!kPredicatedColumns<kHeadDim> && (p.head_dim != kHeadDim || p.head_dim_v != kHeadDim)) return FA_ERR_UNSUPPORTED;
  const int m_blocks = p.seqlen_q / Cfg::kBr + (p.seqlen_q % Cfg::kBr != 0);
  if (m_blocks == 0 || p.batch == 0 || p.heads_q == 0) return FA_OK; // nothing to compute
  if (p.heads_q > 65535 || p.batch > 65535) return FA_ERR_INVALID;
  return launch(name, kernel, Dim3{m_blocks, p.heads_q, p.batch}, Cfg::kThreads, Cfg::kSmemBytes, exec, p);
}

// Softcap, ALiBi or a left window bound that excludes keys (one at least max(Tq, Tk) excludes none, for
// any sequence of the batch: seqlen_q / seqlen_k are the maxima) need the _mod kernels, and so does RoPE
// (only they rotate q: fa/prefill/rope_tile.cuh says why).
bool needs_variant_kernel(const FaPrefillParams &p) {
  const int span = p.seqlen_q > p.seqlen_k ? p.seqlen_q : p.seqlen_k;
  return needs_score_mod(p.score_mod) || (p.score_mod.window_left >= 0 && p.score_mod.window_left < span) ||
         rope_enabled(p.rope);
}

// Whether the kernel of width w has predicated columns (tile_config.cuh; every width but 128).
constexpr bool width_predicated(int w) {
#define FA_PREFILL_PREDICATED(W)                                                                             \
  if (w == W) return kPredicatedColumns<W>;
  FA_PREFILL_WIDTHS(FA_PREFILL_PREDICATED)
#undef FA_PREFILL_PREDICATED
  return false;
}

// The kernel width serving Q·K head dim d and V head dim dv (0: none): prefill_width of the wider; a pair
// (d != dv) needs predicated columns for the narrower, so where that width has none (128) it runs at the
// next width (160, as dims 104-120 do: +25% MMAs for 128/64 or 64/128). No new instantiation either way.
constexpr int pair_width(int d, int dv) {
  const int w = prefill_width(d > dv ? d : dv);
  return d == dv || w == 0 || width_predicated(w) ? w : prefill_width(w + FA_HEAD_DIM_STEP);
}
static_assert(pair_width(192, 128) == 192 && pair_width(128, 64) == 160 && pair_width(64, 128) == 160 &&
                  pair_width(128, 128) == 128 && pair_width(96, 64) == 96 && pair_width(256, 128) == 256,
              "a (Dqk, Dv) pair runs at a width with predicated columns, >= both");

// One case per instantiated width (FA_PREFILL_WIDTHS): the plain or _mod kernel of the call's dtype.
#define FA_PREFILL_CASE(D)                                                                                   \
  case D:                                                                                                    \
    if (p.dtype == FA_DTYPE_F16)                                                                             \
      return mod ? launch_prefill<D, true>(FA_KERNEL_REF(fa_prefill_f16_d##D##_mod), p, exec)                  \
                 : launch_prefill<D, false>(FA_KERNEL_REF(fa_prefill_f16_d##D), p, exec);                      \
    return mod ? launch_prefill<D, true>(FA_KERNEL_REF(fa_prefill_bf16_d##D##_mod), p, exec)                   \
               : launch_prefill<D, false>(FA_KERNEL_REF(fa_prefill_bf16_d##D), p, exec);
int dispatch(const FaPrefillParams &p, FaExec *exec) {
  if (!head_dim_supported(p.head_dim) || !head_dim_supported(p.head_dim_v)) return FA_ERR_UNSUPPORTED;
  if (p.dtype != FA_DTYPE_F16 && p.dtype != FA_DTYPE_BF16) return FA_ERR_UNSUPPORTED;
  const bool mod = needs_variant_kernel(p);
  switch (pair_width(p.head_dim, p.head_dim_v)) { FA_PREFILL_WIDTHS(FA_PREFILL_CASE) }
  return FA_ERR_UNSUPPORTED;
}
#undef FA_PREFILL_CASE

// 16-byte alignment of a pointer and of element strides of 16-bit elements (row starts stay aligned).
bool aligned16(const void *ptr) { return ((uintptr_t)ptr & 15u) == 0; }
bool stride_aligned16(int64_t elements) { return elements % 8 == 0; }

} // namespace

template <int kHeadDim, bool kVariant> FaTilePolicy policy_of() {
  using Cfg = KernelTile<kHeadDim, kVariant>;
  return FaTilePolicy{kHeadDim,       Cfg::kBr,        Cfg::kBc,          Cfg::kStages,
                      Cfg::kThreads,  Cfg::kSmemBytes, Cfg::kMinCtasPerSm, Cfg::kLean};
}

// The kernel dispatch() runs for Q·K head dim head_dim and V head dim head_dim_v, plain or _mod, and its
// launch shape (abi.h, fa_tile_policy and fa_prefill_tile_policy).
int tile_policy_pair(int head_dim, int head_dim_v, bool variant, FaTilePolicy *out) {
  if (!head_dim_supported(head_dim) || !head_dim_supported(head_dim_v)) return FA_ERR_UNSUPPORTED;
#define FA_PREFILL_POLICY(D)                                                                                 \
  case D:                                                                                                    \
    *out = variant ? policy_of<D, true>() : policy_of<D, false>();                                           \
    return FA_OK;
  switch (pair_width(head_dim, head_dim_v)) { FA_PREFILL_WIDTHS(FA_PREFILL_POLICY) }
#undef FA_PREFILL_POLICY
  return FA_ERR_UNSUPPORTED;
}
int tile_policy(int head_dim, bool variant, FaTilePolicy *out) { return tile_policy_pair(head_dim, head_dim, variant, out); }

} // namespace prefill
} // namespace fa

extern "C" int fa_prefill(FaPrefillParams p, FaExec *exec) {
  using fa::prefill::aligned16;
  using fa::prefill::stride_aligned16;
  if (p.head_dim_v == 0) p.head_dim_v = p.head_dim; // V and O as wide as Q and K (the kernel reads it as given)
  // Preconditions the Rust layer validates; checked again here because they guard memory safety.
  const bool has_keys = p.cu_seqlens_k != nullptr ? p.total_k > 0 : p.seqlen_k > 0;
  if (p.q == nullptr || p.o == nullptr || (has_keys && (p.k == nullptr || p.v == nullptr))) return FA_ERR_INVALID;
  if (p.batch < 0 || p.seqlen_q < 0 || p.seqlen_k < 0 || p.heads_q < 0 || p.heads_kv <= 0) return FA_ERR_INVALID;
  if (p.heads_q % p.heads_kv != 0) return FA_ERR_INVALID;
  if ((p.cu_seqlens_q == nullptr) != (p.cu_seqlens_k == nullptr)) return FA_ERR_INVALID;
  if (p.cu_seqlens_q != nullptr && (p.total_q < 0 || p.total_k < 0)) return FA_ERR_INVALID;
  if (!(p.scale_log2 > 0.0f)) return FA_ERR_INVALID; // the row max is taken on raw scores
  // 16-byte cp.async / stores of every row: aligned bases and row/head/batch strides.
  if (!aligned16(p.q) || !aligned16(p.o) || !aligned16(p.k) || !aligned16(p.v)) return FA_ERR_INVALID;
  const int64_t strides[] = {p.q_batch_stride, p.q_row_stride, p.q_head_stride, p.k_batch_stride,
                             p.k_row_stride, p.k_head_stride, p.v_batch_stride, p.v_row_stride,
                             p.v_head_stride, p.o_batch_stride, p.o_row_stride, p.o_head_stride};
  for (int64_t s : strides)
    if (s < 0 || !stride_aligned16(s)) return FA_ERR_INVALID;
  if (p.lse != nullptr && (((uintptr_t)p.lse & 3u) != 0 || p.lse_batch_stride < 0 || p.lse_head_stride < 0))
    return FA_ERR_INVALID;
  if (!fa::valid_score_mod(p.score_mod, p.heads_q)) return FA_ERR_INVALID;
  if (!fa::valid_rope(p.rope, p.head_dim)) return FA_ERR_INVALID;
  // RoPE on K rotates with q's table: it needs one, and aligned int32 key positions if any.
  if (p.rope_k != 0 && (!fa::rope_enabled(p.rope) || ((uintptr_t)p.rope_k_positions & 3u) != 0)) return FA_ERR_INVALID;
  // Positions and window bounds must stay inside int32 when added (fa/score_mod.cuh).
  if (p.seqlen_q > (1 << 30) || p.seqlen_k > (1 << 30) || p.total_q > (1 << 30) || p.total_k > (1 << 30))
    return FA_ERR_INVALID;
  return fa::prefill::dispatch(p, exec);
}
#endif // FA_HOST_BUILD
