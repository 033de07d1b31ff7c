// Warp-level tensor-core fragments for mma.sync m16n8k16 over swizzled shared-memory tiles (fa/swizzle.cuh),
// plus the C-fragment -> A-fragment reuse and the quad reductions of a C fragment's rows.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"), g = lane / 4, t = lane % 4:
//   A 16x16 (4 regs of 2 x 16-bit): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//   B 16x8  (2 regs):               b0 = (k 2t..2t+1, n g), b1 = (k 2t+8..2t+9, n g)
//   C 16x8  (4 fp32):               c0,c1 = (g, 2t, 2t+1), c2,c3 = (g+8, 2t, 2t+1)
// A thread therefore owns two rows (g and g+8) of every C fragment; the 4 threads of a quad share them.
#pragma once

#include <math.h>

#include "fa/intrinsics.cuh"
#include "fa/swizzle.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN

// ldmatrix.x4 lane patterns. Each function takes the lane's LaneAddress (fa/swizzle.cuh), built once per
// kernel by the matching *_lanes() below, and the block origin (compile-time in unrolled loops).
//
// A fragment of the 16x16 block at (row0, col0) of a row-major [rows][k] tile (e.g. Q: rows x D).
// Lanes 0-15 address rows row0..row0+15 at col0 (matrices 0, 1 = a0, a1), lanes 16-31 the same rows at
// col0 + 8 (a2, a3).
template <int kCols, template <int> class Lane = LaneAddress> FA_DEVICE Lane<kCols> a_lanes() {
  return Lane<kCols>::make(lane_id() & 15, lane_id() >> 4);
}
template <class Lane, class T>
FA_DEVICE void load_a_16x16(uint32_t (&a)[4], const T *tile, const Lane &lane, int row0, int col0) {
  ldmatrix_x4(a, lane.at(tile, row0, col0));
}

// B fragments of two adjacent n8 blocks (n0, n0+8) at k0 from a row-major [n][k] tile (K: keys x D, so
// S = Q Kᵀ needs no transpose): b[0..1] for n0, b[2..3] for n0 + 8. Lanes 0-7 / 8-15 address rows
// n0..n0+7 at k0 / k0+8, lanes 16-23 / 24-31 rows n0+8..n0+15 at k0 / k0+8.
template <int kCols, template <int> class Lane = LaneAddress> FA_DEVICE Lane<kCols> b_nk_lanes() {
  return Lane<kCols>::make((lane_id() >> 4) * 8 + (lane_id() & 7), (lane_id() >> 3) & 1);
}
template <class Lane, class T>
FA_DEVICE void load_b_16x16_nk(uint32_t (&b)[4], const T *tile, const Lane &lane, int n0, int k0) {
  ldmatrix_x4(b, lane.at(tile, n0, k0));
}

// B fragments of two adjacent n8 blocks (n0, n0+8) at k0 from a row-major [k][n] tile (V: keys x D for
// O = P V), transposed on the fly by ldmatrix.trans: b[0..1] for n0, b[2..3] for n0 + 8. Same lane
// pattern as the A fragment (lanes 0-15 rows k0..k0+15 at n0, lanes 16-31 at n0 + 8): use a_lanes().
template <class Lane, class T>
FA_DEVICE void load_b_16x16_kn_trans(uint32_t (&b)[4], const T *tile, const Lane &lane, int k0, int n0) {
  ldmatrix_x4_trans(b, lane.at(tile, k0, n0));
}

// d += a · b for the n8 halves of a 16x16 B pair loaded above.
template <class T>
FA_DEVICE void mma_16x16(float (&d0)[4], float (&d1)[4], const uint32_t (&a)[4], const uint32_t (&b)[4]) {
  const uint32_t lo[2] = {b[0], b[1]};
  const uint32_t hi[2] = {b[2], b[3]};
  mma_m16n8k16<T>(d0, a, lo);
  mma_m16n8k16<T>(d1, a, hi);
}

// The register-reuse trick of FA2: two adjacent 16x8 C fragments (columns k0..k0+7 and k0+8..k0+15) hold,
// lane for lane, exactly the elements of the 16x16 A fragment over those 16 columns. Converting to 16-bit
// turns the probabilities P of S = Q Kᵀ into the A operand of P V without touching shared memory.
template <class T>
FA_DEVICE void c_pair_to_a(uint32_t (&a)[4], const float (&c_lo)[4], const float (&c_hi)[4]) {
  a[0] = pack2<T>(c_lo[0], c_lo[1]);
  a[1] = pack2<T>(c_lo[2], c_lo[3]);
  a[2] = pack2<T>(c_hi[0], c_hi[1]);
  a[3] = pack2<T>(c_hi[2], c_hi[3]);
}

// Reductions over the 4 lanes of a quad (the lanes sharing a C-fragment row).
FA_DEVICE float quad_max(float v) {
  v = fmaxf(v, shfl_xor(v, 1));
  return fmaxf(v, shfl_xor(v, 2));
}
FA_DEVICE float quad_sum(float v) {
  v += shfl_xor(v, 1);
  return v + shfl_xor(v, 2);
}

FA_NAMESPACE_END
