// Asynchronous global -> shared copy of a row-major tile of 16-bit elements (fa/swizzle.cuh layout) with
// cp.async 16-byte transfers, predicated per row and per 16-byte column chunk: rows at or past `valid_rows`
// (ragged sequence ends), rows below `first_row` (keys left of every row's window: kLowerBound only) and
// columns at or past `valid_cols` (a head dim below the tile width, fa/head_dim.cuh) are zero-filled in
// shared memory and their global memory is never read (docs/semantics.md: hidden memory never matters). Consecutive
// threads take consecutive 16-byte chunks of a row, so each 8-thread phase reads 128 contiguous bytes of
// global memory and writes a permutation of one 128-byte shared line (conflict-free).
#pragma once

#include "fa/intrinsics.cuh"
#include "fa/swizzle.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN

// 16 bytes moved as one unit (one LDS.128 / STG.128 per lane).
struct alignas(16) Bytes16 {
  uint32_t w[4];
};

// Copies rows [0, kRows) x cols [0, kCols) from gmem (row r at gmem + r * row_stride, 16-byte aligned) into
// smem. All kThreads threads of the block call it; the caller commits and waits. With kPredicated false
// every row must exist (valid_rows is ignored): no row compares, no selects, fewer live registers.
// valid_cols (a multiple of 8, <= kCols) is always honoured: a chunk is wholly inside or outside it, and the
// chunks past it are zero-filled. A compile-time valid_cols == kCols folds every column check away.
// kLowerBound (with kPredicated): rows below first_row are zero-filled too; one more compare per copy, paid
// only by the copies that can need it (a window's bottom tile), so every other copy keeps its code.
template <int kRows, int kCols, int kThreads, bool kPredicated, class T, bool kLowerBound = false>
FA_DEVICE void cp_async_tile(T *smem, const T *gmem, int64_t row_stride, int valid_rows, int valid_cols = kCols,
                             int first_row = 0) {
  static_assert(kPredicated || !kLowerBound, "a lower bound is a row predicate");
  using Layout = SwizzledRows<kCols>;
  constexpr int kChunks = kCols / 8;
  static_assert((kRows * kChunks) % kThreads == 0, "tile chunks must split evenly over the threads");
  if constexpr (kThreads % kChunks == 0) {
    // Each thread keeps one column chunk and walks rows kRowStep apart with a running pointer (precomputing
    // every copy's 64-bit address would cost two registers per copy), and, when kRowStep is a multiple of
    // 8, one swizzled column for all its copies.
    constexpr int kRowStep = kThreads / kChunks;
    const int r = thread_idx() / kChunks;
    const int c = (thread_idx() % kChunks) * 8;
    // A column chunk past valid_cols is this thread's for every row: it copies nothing but zeros, from
    // addresses at column 0 (inside the row, like a predicated-off row's address below).
    const bool col_in_range = c < valid_cols;
    const T *src = gmem + r * row_stride + (col_in_range ? c : 0);
    const int64_t step = kRowStep * row_stride;
#pragma unroll
    for (int i = 0; i < kRows / kRowStep; ++i) {
      const int row = r + i * kRowStep;
      const int dst = kRowStep % 8 == 0 ? Layout::offset(r, c) + i * kRowStep * kCols : Layout::offset(row, c);
      if constexpr (kPredicated) {
        // A predicated-off copy reads nothing; its address still points at row 0 (always valid) so that no
        // out-of-range pointer is ever formed.
        const bool in_range = col_in_range && row < valid_rows && (!kLowerBound || row >= first_row);
        cp_async_cg_16(smem + dst, in_range ? src : gmem, in_range);
      } else {
        // No per-copy select back to row 0 as above (a second live address per copy): src is inside the
        // row already, and a predicated-off copy reads nothing (src-size 0).
        cp_async_cg_16(smem + dst, src, col_in_range);
      }
      src += step;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kRows * kChunks / kThreads; ++i) {
      const int idx = i * kThreads + thread_idx();
      const int row = idx / kChunks;
      const int c = (idx % kChunks) * 8;
      const bool in_range =
          (!kPredicated || row < valid_rows) && (!kLowerBound || row >= first_row) && c < valid_cols;
      cp_async_cg_16(smem + Layout::offset(row, c), in_range ? gmem + row * row_stride + c : gmem, in_range);
    }
  }
}

// cp_async_tile's row walk for full tiles (every row present), for a loop that copies a tile per step and
// cannot afford registers for it: this thread's row, column, destination and source offset are recomputed
// from the thread index on every call (re-read, so that the compiler holds none of them across the loop).
template <int kRows, int kCols, int kThreads> struct RowWalkCopy {
  using Layout = SwizzledRows<kCols>;
  static constexpr int kChunks = kCols / 8;
  static constexpr int kRowStep = kThreads / kChunks;
  static_assert(kThreads % kChunks == 0 && kRows % kRowStep == 0, "whole rows per step, whole steps per tile");

  // Copies rows [0, kRows) of the tile whose row 0 is at gmem; columns at or past valid_cols are zero-filled.
  template <class T> FA_DEVICE static void copy(T *smem, const T *gmem, int64_t row_stride, int valid_cols) {
    const int tid = thread_idx_reread();
    const int r = tid / kChunks;
    const int c = (tid % kChunks) * 8;
    const bool col_in_range = c < valid_cols;
    const T *src = gmem + r * row_stride + (col_in_range ? c : 0);
#pragma unroll
    for (int i = 0; i < kRows / kRowStep; ++i) {
      const int dst = kRowStep % 8 == 0 ? Layout::offset(r, c) + i * kRowStep * kCols : Layout::offset(r + i * kRowStep, c);
      cp_async_cg_16(smem + dst, src, col_in_range);
      src += kRowStep * row_stride;
    }
  }
};

FA_NAMESPACE_END
