// One K/V tile of the paged cache into shared memory (the paged prefill kernel's only global K/V read path,
// so an FP8 dequantising load can replace it in one place): keys [key0, key0 + kRows) of sequence b and one
// KV head, in the swizzled row layout of fa/swizzle.cuh that the prefill tile math reads.
//  - Token -> page through the block table (fa/paged_view.cuh): every copy looks its row's page up itself.
//    The threads copying one row ask for the same table word (a broadcast, an L1 hit after the first row of
//    a page). The lookup's latency is paid when the copies are issued, one tile ahead of their use; hoisting
//    it a further tile ahead into a shared ring, as decode does, is a follow-up (kernels/paged_prefill.cu).
//  - Rows past the sequence (key >= seq_len) and rows whose table entry is out of range (a *hole*) are
//    zero-filled by the cp.async predicate, never read; columns at or past head_dim likewise (the instantiated
//    width kCols may exceed the problem's head dim).
//  - holes[row] = 1 for a hole inside [0, seq_len), else 0, written for every row of the tile, so the
//    consumer can mask those keys to -inf (a zero key would score 0 and dilute the softmax).
#pragma once

#include "fa/intrinsics.cuh"
#include "fa/paged_view.cuh"
#include "fa/swizzle.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN
namespace paged_prefill {

template <int kRows, int kCols, int kThreads, class T>
FA_DEVICE void cp_async_paged_kv_tile(T *sK, T *sV, int32_t *holes, const PagedView &cache, const T *k_head,
                                      const T *v_head, int b, int key0, int seq_len, int head_dim) {
  using Layout = SwizzledRows<kCols>;
  constexpr int kChunks = kCols / 8;
  static_assert((kRows * kChunks) % kThreads == 0, "tile chunks must split evenly over the threads");
#pragma unroll
  for (int i = 0; i < kRows * kChunks / kThreads; ++i) {
    const int idx = i * kThreads + thread_idx();
    const int row = idx / kChunks;
    const int c = (idx % kChunks) * 8;
    const int key = key0 + row;
    const int page = key < seq_len ? cache.page_of(b, key) : kNoPage;
    const bool has_row = page != kNoPage;
    const bool copy = has_row && c < head_dim;
    const int slot = cache.offset_in_page(key);
    // A predicated-off copy reads nothing; its address is the head's row 0 so that no stray pointer is formed.
    const T *k_src = copy ? k_head + cache.k_row(page, slot) + c : k_head;
    const T *v_src = copy ? v_head + cache.v_row(page, slot) + c : v_head;
    cp_async_cg_16(sK + Layout::offset(row, c), k_src, copy);
    cp_async_cg_16(sV + Layout::offset(row, c), v_src, copy);
    if (c == 0) st_shared(holes + row, (int32_t)(key < seq_len && !has_row));
  }
}

} // namespace paged_prefill
FA_NAMESPACE_END
