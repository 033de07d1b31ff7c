// XOR-swizzled shared-memory layout for row-major tiles of 16-bit elements (Q, K, V tiles: [rows][kCols]).
//
// Why: a tile row of kCols halves is kCols/8 16-byte chunks. ldmatrix reads one chunk from each of 8
// consecutive rows at the same logical column; unswizzled, rows 128 bytes apart (or a multiple) land in the
// same banks (an 8-way conflict). Permuting each row's chunks by a function of the row index puts those 8
// chunks in 8 different 16-byte bank groups, and keeps the 8 chunks a quarter-warp of cp.async writes (8
// consecutive chunks of a row) a permutation of one 128-byte line, so both sides are conflict-free.
//
//  - kCols/8 a multiple of 8 (D = 64, 128, 256): chunk ^= row & 7 (the low 3 bits of the chunk index).
//  - kCols/8 ≡ 4 mod 8 (D = 32, 96): rows are 64 bytes (mod 128), so rows r and r+1 already sit in opposite
//    halves of a 128-byte line; chunk ^= (row >> 1) & 3 permutes within aligned groups of 4 chunks, which
//    makes 8 consecutive rows hit 8 distinct bank groups.
// Swizzling only permutes chunks inside a row, so a row stays a contiguous 16-byte-aligned span.
#pragma once

#include "fa/intrinsics.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN

template <int kCols> struct SwizzledRows {
  static constexpr int kChunks = kCols / 8;
  static_assert(kCols % 8 == 0 && (kChunks % 8 == 0 || kChunks % 8 == 4),
                "row length must be a multiple of 64 elements, or 32 mod 64");
  // The chunk-index bits the swizzle flips.
  static constexpr int kXorMask = kChunks % 8 == 0 ? 7 : 3;

  // What row `row` XORs into its chunk indices. Depends only on row % 8, so for a block starting at a
  // multiple of 8 rows it is a per-lane constant (see LaneAddress).
  FA_HOST_DEVICE static int row_xor(int row) { return kChunks % 8 == 0 ? (row & 7) : ((row >> 1) & 3); }
  // Physical chunk of logical chunk `chunk` in row `row`.
  FA_HOST_DEVICE static int chunk(int row, int chunk) { return chunk ^ row_xor(row); }
  // Element offset of (row, col); col must be a multiple of 8 (the start of a 16-byte chunk).
  FA_HOST_DEVICE static int offset(int row, int col) { return row * kCols + chunk(row, col >> 3) * 8; }
};

// The per-lane part of an address into a SwizzledRows<kCols> tile, for accesses where a lane reads row
// row0 + lane_row at chunk c0 + lane_chunk, with row0 a multiple of 16, c0 a multiple of 2 and lane_chunk
// in {0, 1} (the ldmatrix patterns of fa/mma_tile.cuh). Then the physical chunk is
//   (c0 | lane_chunk) ^ x = c0 ^ z,  z = lane_chunk ^ row_xor(lane_row) (a lane constant, z <= kXorMask)
// and c0 ^ z = (c0 & ~kXorMask) + ((c0 & kXorMask) ^ z). Only the (kXorMask + 1) / 2 values of
// c0 & kXorMask differ per lane, so the lane keeps one offset per value (`variant`) and every address is
// `tile + variant[...]` plus a compile-time constant. Adding the constant to the pointer LAST matters: the
// compiler folds it into the ldmatrix immediate, whereas an offset computed with XOR/OR per (row0, c0)
// costs a live register each (16 for Q alone at D = 128) and makes the kernel spill.
template <int kCols> struct LaneAddress {
  using Layout = SwizzledRows<kCols>;
  static constexpr int kVariants = (Layout::kXorMask + 1) / 2;
  int variant[kVariants]; // lane_row * kCols + ((2 i) ^ z) * 8

  FA_DEVICE static LaneAddress make(int lane_row, int lane_chunk) {
    const int z = lane_chunk ^ Layout::row_xor(lane_row);
    LaneAddress a;
#pragma unroll
    for (int i = 0; i < kVariants; ++i) a.variant[i] = lane_row * kCols + ((2 * i) ^ z) * 8;
    return a;
  }

  // The tile as at() wants it (XorLaneAddress binds the lane to it; here nothing to do).
  template <class T> FA_DEVICE const T *bind(const T *tile) const { return tile; }
  // This lane's 16 bytes of the block at (row0, col0): row0 % 16 == 0, col0 % 16 == 0 (compile-time).
  template <class T> FA_DEVICE const T *at(const T *tile, int row0, int col0) const {
    const int c0 = col0 >> 3;
    constexpr int kMask = Layout::kXorMask;
    return (tile + variant[(c0 & kMask) >> 1]) + (row0 * kCols + (c0 & ~kMask) * 8);
  }
};

// The same addresses from ONE register per lane instead of kVariants, for rows of a multiple of 64 elements
// (kXorMask = 7) in tiles 128-byte aligned in shared memory. The lane's offset b = lane_row * kCols + z * 8
// (elements) is added to the tile once (bind); then the 128-byte line holding (row0, col0) is b's line plus
// a compile-time offset, and the chunk inside it, (c0 & 7) ^ z, is b's chunk bits XOR (c0 & 7): one LOP3
// per distinct c0 & 7 (shared by every block of that column), on an address whose low 7 bits are z's alone
// (the tile is 128-byte aligned and a row is a multiple of 128 bytes), plus an immediate in the ldmatrix.
// The price: up to 8 LOP3 per tile operand per KV tile, instead of 3 registers per operand held across the
// KV loop (fa/prefill/tile_config.cuh measures both).
template <int kCols> struct XorLaneAddress {
  using Layout = SwizzledRows<kCols>;
  static_assert(Layout::kXorMask == 7 && kCols % 64 == 0, "rows of a multiple of 64 elements");
  int lane; // lane_row * kCols + z * 8 (elements)

  FA_DEVICE static XorLaneAddress make(int lane_row, int lane_chunk) {
    return XorLaneAddress{lane_row * kCols + (lane_chunk ^ Layout::row_xor(lane_row)) * 8};
  }
  // tile: 128-byte aligned in shared memory.
  template <class T> FA_DEVICE const T *bind(const T *tile) const { return tile + lane; }
  // This lane's 16 bytes of the block at (row0, col0) of the bound tile: row0 % 16 == 0, col0 % 16 == 0
  // (compile-time).
  template <class T> FA_DEVICE const T *at(const T *bound, int row0, int col0) const {
    const int c0 = col0 >> 3;
    return xor_smem_bytes(bound, (uint32_t)(c0 & 7) * 16) + (row0 * kCols + (c0 & ~7) * 8);
  }
};

FA_NAMESPACE_END
