// RoPE on the tiles of the prefill kernels (dense, varlen and paged prefill; docs/rope.md): once a Q tile
// (or, dense/varlen prefill with rope_k, a K tile) has landed in shared memory, its rows are rotated in
// place, each at its own position, in fp32 and rounded back to the 16-bit input type (the tensor-core
// operand), before the S = Q Kᵀ that reads it. Neither q nor k is ever written to global memory.
//
// Why in the _mod kernels only (a run-time switch there; the plain kernels have no RoPE code at all): the
// plain d128 kernel runs at 255 registers with a thin margin (fa/prefill/tile_config.cuh), and a RoPE
// prologue in it made ptxas spill 4-20 bytes (wip attempt, sm_80 / sm_90); a separate kRope instantiation
// of every kernel would double prefill.cu's nvcc time. The _mod kernels serve plain calls too (no softcap /
// ALiBi: a uniform branch per tile), so a RoPE call of any variant runs the _mod kernel of its width (the
// launchers' needs_variant_kernel) and pays its tile (d128: 128 x 32 instead of 128 x 64). Q is rotated in
// the prologue; K (rope_k) in each KV step, between the barrier that publishes the landed tile and a second
// one before Q Kᵀ reads it (prefill.cu, kv_tile_step).
//
// Work split: a warp takes kRowsPerStep rows at a time, its lanes the pairs of a row (consecutive pairs:
// coalesced table reads, conflict-free 16-bit shared accesses). The table loads of the kRowsPerStep rows
// are issued before any of them is used, so a warp waits for about rows / (4 · kRowsPerStep) table
// round trips, not one per row. No trailing barrier: the caller's next barrier publishes the rotated rows.
#pragma once

#include "fa/abi.h"
#include "fa/intrinsics.cuh"
#include "fa/rope.cuh"
#include "fa/swizzle.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN
namespace prefill {

// Rotates rows [0, rows) of the swizzled tile sX (SwizzledRows<kCols>: a Q tile or a K buffer): row r at
// table row rope_row(r_pos), r_pos = position(r) (a functor: explicit positions or the default ones). Every
// thread's copies of the tile must have been waited for; the caller's barrier before this call publishes
// them (a pair's partner may lie in another thread's chunk).
template <class T, int kCols, int kThreads, class Position>
FA_DEVICE void rotate_tile_rows(const FaRope &r, T *sX, int rows, const Position &position) {
  using Layout = SwizzledRows<kCols>;
  constexpr int kWarps = kThreads / kWarpSize;
  constexpr int kRowsPerStep = 4; // table loads in flight per lane
  const int half = r.rotary_dim >> 1;
  const bool gptj = r.style == FA_ROPE_GPTJ;
#pragma unroll 1
  for (int row0 = warp_id() * kRowsPerStep; row0 < rows; row0 += kWarps * kRowsPerStep) {
    // Every lane reads the rows' positions (a warp-uniform address: one request per row on the GPU). Lanes
    // 0..3 reading them and a shuffle sharing them made ptxas spill 24 bytes in the sm_90 d128 _mod kernel.
    const int lane = lane_id();
    int table_row[kRowsPerStep];
#pragma unroll
    for (int u = 0; u < kRowsPerStep; ++u) table_row[u] = row0 + u < rows ? rope_row(r, position(row0 + u)) : 0;
#pragma unroll 1
    for (int i = lane; i < half; i += kWarpSize) {
      const int ja = gptj ? 2 * i : i;
      const int jb = gptj ? 2 * i + 1 : i + half;
      float c[kRowsPerStep], s[kRowsPerStep];
#pragma unroll
      for (int u = 0; u < kRowsPerStep; ++u)
        if (row0 + u < rows) rope_cos_sin(r, table_row[u], i, c[u], s[u]);
#pragma unroll
      for (int u = 0; u < kRowsPerStep; ++u) {
        const int row = row0 + u;
        if (row >= rows) continue;
        uint16_t *a = reinterpret_cast<uint16_t *>(sX + Layout::offset(row, ja & ~7) + (ja & 7));
        uint16_t *b = reinterpret_cast<uint16_t *>(sX + Layout::offset(row, jb & ~7) + (jb & 7));
        float xa, xb, unused;
        unpack2<T>((uint32_t)ld_shared(a), xa, unused);
        unpack2<T>((uint32_t)ld_shared(b), xb, unused);
        st_shared(a, (uint16_t)(pack2<T>(rope_rotate(xa, xb, c[u], s[u], true), 0.0f) & 0xffffu));
        st_shared(b, (uint16_t)(pack2<T>(rope_rotate(xb, xa, c[u], s[u], false), 0.0f) & 0xffffu));
      }
    }
  }
}

} // namespace prefill
FA_NAMESPACE_END
