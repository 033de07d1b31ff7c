// The paged KV cache as device code sees it (one idea: token -> page -> element address), shared by the
// append, decode and paged prefill kernels. Layout (docs/semantics.md): K and V each [num_pages, page_size, Hkv, D] with i64
// element strides; block_table int32 [B, max_pages_per_seq]; seq_lens int32 [B]; any page_size >= 1, divided
// by with fa/fast_divmod.cuh (no divide instruction: one multiply-high per key row for its page, one more
// multiply for its slot in the page).
//
// Robustness. seq_lens and block_table live in device memory on the GPU backend, so the host can only check
// what it knows without a sync (shapes, table width x page size >= the caller's max_seq_len). Everything
// read from them is therefore clamped here, so a bad value can never turn into an out-of-bounds access:
//  - a sequence length is clamped into [0, max_pages_per_seq * page_size] (the table's capacity);
//  - a page id outside [0, num_pages) is reported as kNoPage, and its rows are zero-filled by the caller
//    (the cp.async predicate), never read; decode masks those tokens (weight exactly 0, like the tail).
#pragma once

#include "fa/fast_divmod.cuh"
#include "fa/intrinsics.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN

// 16 bytes: the unit of every vectorised global/shared access in the decode path (8 fp16/bf16 elements or
// 4 fp32). CUDA's uint4 (also defined for the host build), so the read-only path (__ldg) accepts it.
using Vec16 = uint4;

constexpr int kNoPage = -1;

// Element offsets of one cache row (page and slot folded in) in K and V; k = -1: no data for this row. The
// unit the paged load paths (decode's and paged prefill's) park per row in their shared-memory rings, so
// that issuing a tile is one shared load + the cp.async copies per row.
struct alignas(16) RowOffsets {
  int64_t k, v;
};

struct PagedView {
  FaPagedCache c;

  FA_DEVICE int page_size() const { return c.page_size; }
  // Tokens the block table can address: max_pages_per_seq * page_size (fits int32, checked by the host).
  FA_DEVICE int capacity() const { return c.max_pages_per_seq * c.page_size; }

  // seq_lens[b] clamped into [0, capacity()]. kViews: also the contiguous views (abi.h, FaPagedCache), read
  // only by the kernels that serve them (a compile-time switch: the others keep their registers): seq_lens
  // NULL, every sequence page_size long; seq_lens_cumulative, seq_lens[b + 1] - seq_lens[b], both ends
  // clamped into [0, num_pages] first, so a sequence's rows (page seq_lens[b], slots 0 ..) stay inside them.
  template <bool kViews = false> FA_DEVICE int seq_len(int b) const {
    if (kViews && c.seq_lens == nullptr) return c.page_size;
    int n = ld_global_nc(c.seq_lens + b);
    if (kViews && c.seq_lens_cumulative) {
      const int lo = n < 0 ? 0 : (n > c.num_pages ? c.num_pages : n);
      const int hi = ld_global_nc(c.seq_lens + b + 1);
      n = (hi > c.num_pages ? c.num_pages : hi) - lo;
    }
    return n < 0 ? 0 : (n > capacity() ? capacity() : n);
  }

  // Page holding token `t` (0 <= t < capacity()) of sequence b, or kNoPage for an out-of-range table entry.
  // kViews: without a block table (the dense view) page b is sequence b's.
  template <bool kViews = false> FA_DEVICE int page_of(int b, int t) const {
    const int p = kViews && c.block_table == nullptr
                      ? b
                      : ld_global_nc(c.block_table + (int64_t)b * c.block_table_stride + fast_div(c.page_div, t));
    return (unsigned)p < (unsigned)c.num_pages ? p : kNoPage;
  }
  // Slot of token t (0 <= t < capacity()) in its page.
  FA_DEVICE int offset_in_page(int t) const { return t - fast_div(c.page_div, t) * c.page_size; }

  // Element offsets (not bytes) of (page, slot-in-page) in K and V; the head and column are added by the
  // caller once, outside its loops.
  FA_DEVICE int64_t k_row(int page, int slot) const {
    return (int64_t)page * c.k_page_stride + (int64_t)slot * c.k_token_stride;
  }
  FA_DEVICE int64_t v_row(int page, int slot) const {
    return (int64_t)page * c.v_page_stride + (int64_t)slot * c.v_token_stride;
  }
  // The row offsets of token t given its page (page_of), or {-1, -1} for kNoPage.
  FA_DEVICE RowOffsets row_offsets(int page, int t) const {
    const int slot = offset_in_page(t);
    return page == kNoPage ? RowOffsets{-1, -1} : RowOffsets{k_row(page, slot), v_row(page, slot)};
  }
};

#if defined(FA_HOST_BUILD)
// The launchers' re-checks of a cache descriptor (what the Rust layer validates; they guard memory safety).
// Its element format: 16-bit (FA_KV_SAME), or FP8 of either format with whole 16-byte chunks per row (head_dim
// a multiple of 16: none straddles head_dim) and fp32 scales per tensor or per KV head, 4-byte aligned (their
// values are checked by the Rust layer).
inline bool valid_cache_format(const FaPagedCache &c, int head_dim) {
  const bool fp8 = c.kv_dtype == FA_KV_FP8_E4M3 || c.kv_dtype == FA_KV_FP8_E5M2;
  if (!fp8) return c.kv_dtype == FA_KV_SAME;
  return head_dim % 16 == 0 && c.k_scale != nullptr && c.v_scale != nullptr && ((uintptr_t)c.k_scale & 3u) == 0 &&
         ((uintptr_t)c.v_scale & 3u) == 0 && (c.scale_head_stride == 0 || c.scale_head_stride == 1);
}
// Its K/V element strides: non-negative, whole 16-byte units (8 16-bit or 16 FP8 elements) for cp.async.
inline bool valid_cache_strides(const FaPagedCache &c) {
  const int unit = c.kv_dtype == FA_KV_SAME ? 8 : 16;
  const int64_t strides[] = {c.k_page_stride, c.k_token_stride, c.k_head_stride,
                             c.v_page_stride, c.v_token_stride, c.v_head_stride};
  for (int64_t s : strides)
    if (s < 0 || s % unit != 0) return false;
  return true;
}
// Everything a reader of `batch` sequences (decode, paged prefill) dereferences through PagedView: the format
// and strides above, a page size >= 1 with its divisor, a non-empty table and pool whose capacity
// (max_pages_per_seq * page_size tokens) fits int32 with a tile and a split granule to spare (src/paged.rs:
// MAX_TOKENS), 16-byte aligned K/V bases, 4-byte aligned block table and seq_lens, and no null pointer when
// there is a sequence to read.
// `contiguous`: the caller also reads the contiguous views (FaPagedCache: a NULL block table and seq_lens, or
// cumulative seq_lens), which hold one page per sequence: decode at its widths past 256 (decode.cu).
inline bool valid_paged_cache_for_read(const FaPagedCache &c, int head_dim, int batch, bool contiguous = false) {
  if (!valid_cache_format(c, head_dim) || !valid_cache_strides(c)) return false;
  if (!valid_divisor(c.page_div, c.page_size)) return false;
  if ((int64_t)c.max_pages_per_seq * c.page_size > INT32_MAX - 4096) return false;
  // The views: paged (table, lengths), dense (neither), varlen (table and lengths both cu_seqlens_k). A
  // contiguous view may have no rows at all (num_pages 0: every key a hole, no K/V byte read).
  const bool paged = c.block_table != nullptr && c.seq_lens != nullptr && c.seq_lens_cumulative == 0;
  const bool dense = c.block_table == nullptr && c.seq_lens == nullptr && c.seq_lens_cumulative == 0;
  const bool varlen = c.block_table != nullptr && c.seq_lens != nullptr && c.seq_lens_cumulative == 1;
  const bool view = (dense || varlen) && contiguous && c.max_pages_per_seq == 1;
  if (c.max_pages_per_seq < 1 || c.num_pages < (view ? 0 : 1)) return false;
  // (a paged call with a NULL table or lengths and no sequence to read is still fine)
  if (!paged && !view && !(batch == 0 && c.seq_lens_cumulative == 0)) return false;
  if (batch > 0 && (c.k_cache == nullptr || c.v_cache == nullptr)) return false;
  if (((uintptr_t)c.k_cache & 15u) != 0 || ((uintptr_t)c.v_cache & 15u) != 0) return false;
  return ((uintptr_t)c.block_table & 3u) == 0 && ((uintptr_t)c.seq_lens & 3u) == 0 && c.block_table_stride >= 0;
}
#endif

FA_NAMESPACE_END
