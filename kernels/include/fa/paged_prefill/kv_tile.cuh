// Paged K/V tiles into shared memory, decode's page-lookup scheme (kernels/decode.cu) for the prefill tile
// (Bc keys x the instantiated width, the swizzled row layout fa/prefill/tile_math.cuh reads). This is the
// paged prefill kernel's only global K/V read path (16-bit caches: step 3; FP8 caches: step 3', whose staged
// bytes fa/fp8_tile.cuh converts into the 16-bit tile).
//  1. lookup:  thread t < kRows fetches the page of key key0 + t of the tile (one ld_global per key row,
//              issued a tile ahead of its use so that its latency hides behind a tile of math);
//  2. publish: the same thread turns it into the row's K/V element offsets in a shared-memory ring slot, and
//              flags a *hole* (a key inside [0, seq_len) whose table entry is out of range) for the mask;
//  3. copy:    every thread issues its cp.async chunks from the ring: one shared load per copied row.
// Rows past the sequence, rows below `key_lo` (keys left of the window of every row of the CTA: their pages
// may have been freed and reused, and P = 0 times a NaN V row is still NaN, docs/semantics.md) and holes are
// zero-filled by the cp.async predicate, never read, their table entries never looked up; so are the columns
// at or past head_dim (the instantiated width may exceed the problem's head dim). The caller orders a ring
// slot's publish before its copy and its reuse after the copy with its barriers (kernels/paged_prefill.cu).
#pragma once

#include "fa/intrinsics.cuh"
#include "fa/paged_view.cuh"
#include "fa/swizzle.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN
namespace paged_prefill {


// 1. The page of key key0 + thread_idx() (threads < kRows), or kNoPage outside [key_lo, seq_len) / for other
// threads.
template <int kRows>
FA_DEVICE int lookup_tile_row(const PagedView &cache, int b, int key0, int key_lo, int seq_len) {
  const int key = key0 + thread_idx();
  return (thread_idx() < kRows && key >= key_lo && key < seq_len) ? cache.page_of(b, key) : kNoPage;
}

// 2. ring[t] = the offsets of key key0 + t, holes[t] = whether it is a hole (threads t < kRows): a key in
// [key_lo, seq_len) without a page (keys below key_lo have none either, but the window mask hides them).
template <int kRows>
FA_DEVICE void publish_tile_row(RowOffsets *ring, int32_t *holes, const PagedView &cache, int key0, int key_lo,
                                int seq_len, int page) {
  const int t = thread_idx();
  if (t < kRows) {
    const int key = key0 + t;
    st_shared(ring + t, cache.row_offsets(page, key));
    st_shared(holes + t, (int32_t)(key >= key_lo && key < seq_len && page == kNoPage));
  }
}

// 3. The tile's cp.async copies (all threads; the caller commits). k_head / v_head: the KV head's base;
// K's columns at or past head_dim and V's at or past head_dim_v are zero-filled.
template <int kRows, int kCols, int kThreads, class T>
FA_DEVICE void cp_async_paged_kv_tile(T *sK, T *sV, const RowOffsets *ring, const T *k_head, const T *v_head,
                                      int head_dim, int head_dim_v) {
  using Layout = SwizzledRows<kCols>;
  constexpr int kChunks = kCols / 8;
  static_assert((kRows * kChunks) % kThreads == 0, "tile chunks must split evenly over the threads");
#pragma unroll
  for (int i = 0; i < kRows * kChunks / kThreads; ++i) {
    const int idx = i * kThreads + thread_idx();
    const int row = idx / kChunks;
    const int c = (idx % kChunks) * 8;
    const RowOffsets off = ld_shared(ring + row);
    const bool copy = off.k >= 0 && c < head_dim;
    const bool copy_v = off.k >= 0 && c < head_dim_v;
    // A predicated-off copy reads nothing; its address is the head's row 0 so that no stray pointer is formed.
    cp_async_cg_16(sK + Layout::offset(row, c), copy ? k_head + off.k + c : k_head, copy);
    cp_async_cg_16(sV + Layout::offset(row, c), copy_v ? v_head + off.v + c : v_head, copy_v);
  }
}

// 3'. An FP8 cache: the tile's rows as stored (one byte per element, 16 elements per cp.async chunk) into
// row-major, unswizzled FP8 staging tiles of kRows x kCols bytes (what convert_fp8_tile reads). FP8 head
// dims are multiples of 16 (the launcher checks), so a chunk is either wholly inside the head dim or
// zero-filled. At kCols = 96 the 6 chunks per row do not split evenly over the threads: the last pass is
// partial.
template <int kRows, int kCols, int kThreads>
FA_DEVICE void cp_async_paged_fp8_tile(unsigned char *sK, unsigned char *sV, const RowOffsets *ring,
                                       const uint8_t *k_head, const uint8_t *v_head, int head_dim, int head_dim_v) {
  constexpr int kChunks = kCols / 16;
  constexpr int kTotal = kRows * kChunks;
#pragma unroll
  for (int i = 0; i < (kTotal + kThreads - 1) / kThreads; ++i) {
    const int idx = i * kThreads + thread_idx();
    if (kTotal % kThreads != 0 && idx >= kTotal) break;
    const int row = idx / kChunks;
    const int c = (idx % kChunks) * 16;
    const RowOffsets off = ld_shared(ring + row);
    const bool copy = off.k >= 0 && c < head_dim;
    const bool copy_v = off.k >= 0 && c < head_dim_v;
    cp_async_cg_16(sK + row * kCols + c, copy ? k_head + off.k + c : k_head, copy);
    cp_async_cg_16(sV + row * kCols + c, copy_v ? v_head + off.v + c : v_head, copy_v);
  }
}

} // namespace paged_prefill
FA_NAMESPACE_END
