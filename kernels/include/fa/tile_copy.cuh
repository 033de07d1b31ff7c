// Asynchronous global -> shared copy of a row-major tile of 16-bit elements (fa/swizzle.cuh layout) with
// cp.async 16-byte transfers, predicated per row: rows at or past `valid_rows` are zero-filled in shared
// memory and their global memory is never read (ragged sequence ends). Consecutive threads take
// consecutive 16-byte chunks of a row, so each 8-thread phase reads 128 contiguous bytes of global memory
// and writes a permutation of one 128-byte shared line (conflict-free).
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
// every row must exist (valid_rows is ignored): no compares, no selects, fewer live registers.
template <int kRows, int kCols, int kThreads, bool kPredicated, class T>
FA_DEVICE void cp_async_tile(T *smem, const T *gmem, int64_t row_stride, int valid_rows) {
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
    const T *src = gmem + r * row_stride + c;
    const int64_t step = kRowStep * row_stride;
#pragma unroll
    for (int i = 0; i < kRows / kRowStep; ++i) {
      const int row = r + i * kRowStep;
      const int dst = kRowStep % 8 == 0 ? Layout::offset(r, c) + i * kRowStep * kCols : Layout::offset(row, c);
      if constexpr (kPredicated) {
        // A predicated-off copy reads nothing; its address still points at row 0 (always valid) so that no
        // out-of-range pointer is ever formed.
        const bool in_range = row < valid_rows;
        cp_async_cg_16(smem + dst, in_range ? src : gmem, in_range);
      } else {
        cp_async_cg_16(smem + dst, src, true);
      }
      src += step;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kRows * kChunks / kThreads; ++i) {
      const int idx = i * kThreads + thread_idx();
      const int row = idx / kChunks;
      const int c = (idx % kChunks) * 8;
      const bool in_range = !kPredicated || row < valid_rows;
      cp_async_cg_16(smem + Layout::offset(row, c), in_range ? gmem + row * row_stride + c : gmem, in_range);
    }
  }
}

FA_NAMESPACE_END
