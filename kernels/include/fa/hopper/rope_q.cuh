// RoPE on q in the sm_90a prefill kernel (docs/rope.md, docs/hopper.md "RoPE on q"): once a work tile's Q has
// landed (q_full), each consumer warpgroup rotates its own 64 rows of the Q buffer in place, each row at its
// position, in fp32 and rounded back to the 16-bit input type, with the arithmetic of every other RoPE path
// (fa/rope.cuh: the table row, one fma per element), so the rotated q is bit for bit what the sm_80 kernel
// and the Rust model (src/rope.rs, rotate_row_f32) compute. Then fence.proxy.async (the ordinary stores made
// visible to wgmma, which reads Q through the async proxy) and a named barrier of the warpgroup's 128
// threads: only this warpgroup's wgmmas read these rows (S = Q Kᵀ, the A operand of its 64 rows), so no
// other warpgroup waits. q is never written to global memory; K is not rotated here (RoPE on K stays in the
// sm_80 kernel: every CTA of a head reloads the same K tiles, so each would rotate them again).
//
// Why the consumers and not the producer warpgroup's three idle warps: those run at 24 registers (40 at the
// D 128 causal tile; fa/hopper/traits.cuh) after setmaxnreg.dec, where a table walk with 64-bit pointers would
// spill (a warp prefix sum already did, docs/hopper.md), and 96 threads would rotate all Br rows while the
// 256-384 consumer threads, the ones waiting for the rotated rows, sit idle; the consumers have their
// mainloop's registers free at this point (O is zero, S not yet live), so the rotation costs them no
// registers across the mainloop. The Q tile is on the consumers' critical path either way (it lands only
// after the previous tile's epilogue freed the buffer).
//
// Work split (as fa/prefill/rope_tile.cuh, whose loop this is with the warpgroup's 4 warps and the Q tile's
// layout): a warp takes kRowsPerStep rows at a time, its lanes consecutive pairs of a row (coalesced table
// reads), the rows' table loads in flight together. Addresses: the Q tile's 128B-swizzled panels
// (staged_offset, the TMA's layout).
#pragma once

#include "fa/abi.h"
#include "fa/hopper/epilogue.cuh"
#include "fa/hopper/traits.cuh"
#include "fa/intrinsics.cuh"
#include "fa/prefill/seq_info.cuh"
#include "fa/rope.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN
namespace hopper {

// Named barriers "Q rotated", one per consumer warpgroup: ids 5 .. 4 + kConsumers (0: sync_threads, 1: the
// consumers' barrier, 2 .. 4: pingpong, fa/hopper/mainloop.cuh).
constexpr int kQRotatedBarrier = 5;

// Rotates rows [64·wg, 64·wg + 64) ∩ [0, Tq − m0) of the Q buffer, then publishes them to this warpgroup's
// wgmmas. Query row i = m0 + row of sequence `batch` is at positions[q_row0 + i] (q_row0: b·Tq dense, the
// sequence's first packed row varlen) or at its bottom-right position i + Tk − Tq (negative: clamped to 0).
// Rows past Tq (the next sequence's in varlen, zero fill past the tensor) are neither read nor written.
// The caller has waited for q_full; all 128 threads of the warpgroup call this.
template <class T, class Tr>
FA_DEVICE void rotate_q(const FaPrefillParams &p, unsigned char *sQ, int wg, int batch, int m0,
                        const prefill::SeqInfo &seq) {
  // Table loads in flight per lane. 4 (the sm_80 kernels' choice) made ptxas spill 20 bytes in the D 128
  // 128 x 176 consumers (R237 of 240 without); 2 and 1 leave every consumer spill-free.
  constexpr int kRowsPerStep = 2;
  constexpr int kWarps = kWarpgroupThreads / kWarpSize;
  const FaRope &r = p.rope;
  const int row0 = 64 * wg; // this warpgroup's first row of the tile
  const int left = seq.tq - m0 - row0;
  const int rows = left < 64 ? left : 64;
  const int32_t *positions = r.positions;
  if (positions != nullptr) {
    int64_t q_row0 = (int64_t)batch * p.seqlen_q;
    if (p.cu_seqlens_q != nullptr) {
      int q_start, q_len;
      prefill::varlen_bounds(p.cu_seqlens_q, batch, p.total_q, q_start, q_len);
      q_row0 = q_start;
    }
    positions += q_row0 + m0 + row0;
  }
  const int first = m0 + row0 + (seq.tk - seq.tq);
  const int lane = lane_id();
  const int warp = warp_id() % kWarps;
  const int half = r.rotary_dim >> 1;
  const bool gptj = r.style == FA_ROPE_GPTJ;
#pragma unroll 1
  for (int step = warp * kRowsPerStep; step < rows; step += kWarps * kRowsPerStep) {
    int table_row[kRowsPerStep];
#pragma unroll
    for (int u = 0; u < kRowsPerStep; ++u) {
      // Every lane reads the rows' positions (a warp-uniform address: one request per row on the GPU).
      const int row = step + u;
      if (row >= rows) {
        table_row[u] = 0;
        continue;
      }
      table_row[u] = rope_row(r, positions != nullptr ? (int64_t)ld_global_nc(positions + row) : (int64_t)(first + row));
    }
#pragma unroll 1
    for (int i = lane; i < half; i += kWarpSize) {
      const int ja = gptj ? 2 * i : i;
      const int jb = gptj ? 2 * i + 1 : i + half;
      float c[kRowsPerStep], s[kRowsPerStep];
#pragma unroll
      for (int u = 0; u < kRowsPerStep; ++u)
        if (step + u < rows) rope_cos_sin(r, table_row[u], i, c[u], s[u]);
#pragma unroll
      for (int u = 0; u < kRowsPerStep; ++u) {
        const int row = row0 + step + u;
        if (step + u >= rows) continue;
        uint16_t *a = reinterpret_cast<uint16_t *>(sQ + staged_offset<Tr>(row, ja >> 3) + 2 * (ja & 7));
        uint16_t *b = reinterpret_cast<uint16_t *>(sQ + staged_offset<Tr>(row, jb >> 3) + 2 * (jb & 7));
        float xa, xb, unused;
        unpack2<T>((uint32_t)ld_shared(a), xa, unused);
        unpack2<T>((uint32_t)ld_shared(b), xb, unused);
        st_shared(a, (uint16_t)(pack2<T>(rope_rotate(xa, xb, c[u], s[u], true), 0.0f) & 0xffffu));
        st_shared(b, (uint16_t)(pack2<T>(rope_rotate(xb, xa, c[u], s[u], false), 0.0f) & 0xffffu));
      }
    }
  }
  fence_proxy_async(); // this warp's rotated rows, visible to the async proxy (wgmma's operand reads)
  named_barrier_sync(kQRotatedBarrier + wg, kWarpgroupThreads);
}

} // namespace hopper
FA_NAMESPACE_END
