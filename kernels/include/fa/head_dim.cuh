// Which instantiated kernel width serves a head dim: the one place every op's launcher (prefill, paged
// prefill, decode) maps a run-time D to a compile-time tile width W >= D. The Rust side reads the result
// through fa_tile_policy (abi.h) and never restates it.
//
// Supported: every D that is a multiple of 8 (16-byte rows: one cp.async chunk is 8 elements) from 32 to
// the op's own maximum (abi.h): 512 for every op; prefill's and paged prefill's tiled kernels stop at 256 and
// the decode kernel's streaming path serves 264-512 for them (abi.h, FA_*_TILED_MAX_HEAD_DIM). The ABI's range
// (FA_MIN_HEAD_DIM .. FA_MAX_HEAD_DIM) is their union; an op's width function answers 0 above its maximum,
// and its launcher and tile policy FA_ERR_UNSUPPORTED. A kernel of width W serves D <= W with *predicated columns*: the 16-byte chunks at or past D
// are zero-filled in shared memory and never read from global memory, and no store touches a column past D
// (the emulator's tight buffer bounds check both). The zero columns add nothing to Q Kᵀ and produce zero
// output columns in P V, which are dropped; what padding costs is tensor-core time and shared memory.
//
// Prefill (compute-bound: the padded columns' MMAs are real work) gets a width every 32 columns up to 192
// (32, 64, 96, 128, 160, 192) and 256 above: at most 24 padded columns (e.g. Phi-2's 80 runs at 96 (+20%
// MMAs), 160 and 192 exactly), except 104-120, which run at 160 (the 128 kernels have no predicated
// columns: fa/prefill/tile_config.cuh, kPredicatedColumns; 112 at 160 is +43% MMAs), and 200-248 at 256
// (<= 28%; 224: +14%). 32 is the swizzle's granularity (fa/swizzle.cuh: rows of 32 mod 64 or 0 mod 64
// elements), so finer widths would need a new layout. 160 and 192 are their own instantiations rather than
// 256 (which would waste 37% / 25% of the MMAs): they cost 8 extra kernels of nvcc time (measured in
// tile_config.cuh); a 224 would save at most 12.5% for dims 200-224, not worth another ~1/7 of the
// prefill build.
//
// Decode (memory-bound: the predicated loads read only D columns, so padding costs only tensor time, which
// decode has plenty of, and shared memory, which fits) keeps its widths at powers of two, 64, 128, 256 and
// 512: its SwizzledTile needs W % 64 == 0 and its warp split needs W / 64 to divide the 4 warps
// (fa/decode/traits.cuh), or at 512 two 64-column groups per warp. 512 (Gemma 4's global layers) serves
// 264-512 as 256 serves 136-256: at most 1.94x the tensor and shared-memory work of the head dim itself
// (264 at 512; 136 at 256: 1.88x), never more global memory traffic. No model we know of has a head dim
// between 256 and 512, so a 384 width (8 more kernels, ~+8 s of nvcc: decode_fp8.cu and decode.cu per
// width) would buy only its shared-memory traffic at 264-384 and is not instantiated.
#pragma once

#include "fa/abi.h"
#include "fa/intrinsics.cuh"
#include "fa/namespace.cuh"

// The instantiated widths of each op, smallest first, as X-macro lists: one list drives a kernel file's
// instantiations, its launcher's dispatch and its tile policy (abi.h, fa_tile_policy), so a width cannot be
// instantiated without being dispatched, or the reverse. X(W) is expanded once per width.
#define FA_PREFILL_WIDTHS(X) X(32) X(64) X(96) X(128) X(160) X(192) X(256)
// Paged prefill: no 32 (head dim 32, no mainstream LLM's, runs at 64: twice its MMAs but the same memory
// traffic, and its kernels would cost a quarter of this op's nvcc time, docs/build.md), no 160/192 (they run
// at 256).
#define FA_PAGED_PREFILL_WIDTHS(X) X(64) X(96) X(128) X(256)
#define FA_DECODE_WIDTHS(X) X(64) X(128) X(256) X(512)
#define FA_WIDTH_ITEM(W) W,

FA_NAMESPACE_BEGIN

constexpr int kMinHeadDim = FA_MIN_HEAD_DIM;
constexpr int kMaxHeadDim = FA_MAX_HEAD_DIM;

// Whether some op accepts head dim d (each op's width function says whether it does).
FA_HOST_DEVICE constexpr bool head_dim_supported(int d) {
  return d >= kMinHeadDim && d <= kMaxHeadDim && d % FA_HEAD_DIM_STEP == 0;
}

// The prefill (dense and varlen) kernel width for a supported d, or 0 above FA_PREFILL_TILED_MAX_HEAD_DIM:
// fa/prefill/tile_config.cuh has a TileConfig for each value of FA_PREFILL_WIDTHS.
FA_HOST_DEVICE constexpr int prefill_width(int d) {
  return d > FA_PREFILL_TILED_MAX_HEAD_DIM ? 0 : d > 192 ? 256 : (d > 96 && d < 128) ? 160 : (d + 31) / 32 * 32;
}

// The smallest of `widths` (ascending) that is >= d, or 0.
template <int N> FA_HOST_DEVICE constexpr int first_width_at_least(const int (&widths)[N], int d) {
  for (int w : widths)
    if (d <= w) return w;
  return 0;
}

constexpr int kPagedPrefillWidths[] = {FA_PAGED_PREFILL_WIDTHS(FA_WIDTH_ITEM)};
constexpr int kDecodeWidths[] = {FA_DECODE_WIDTHS(FA_WIDTH_ITEM)};

// The paged prefill kernel width for a supported d: the smallest instantiated one >= d (0: none).
FA_HOST_DEVICE constexpr int paged_prefill_width(int d) { return first_width_at_least(kPagedPrefillWidths, d); }

// The decode kernel width for a supported d (0: none): fa/decode/traits.cuh has Traits for each value.
FA_HOST_DEVICE constexpr int decode_width(int d) { return first_width_at_least(kDecodeWidths, d); }

// Every head dim up to an op's maximum maps to an instantiated width >= it, and none above it (prefill_width's
// rule is not "the first width >= d", so it is checked against the list here); each op's maximum (abi.h) is
// its widest kernel.
template <int N> constexpr bool listed(const int (&widths)[N], int w) {
  for (int x : widths)
    if (x == w) return true;
  return false;
}
constexpr int kPrefillWidths[] = {FA_PREFILL_WIDTHS(FA_WIDTH_ITEM)};
template <int N> constexpr int widest(const int (&widths)[N]) { return widths[N - 1]; }
constexpr bool covers(int width, int d, int max_d) { return d <= max_d ? width >= d : width == 0; }
constexpr bool widths_cover_every_head_dim() {
  for (int d = kMinHeadDim; d <= kMaxHeadDim; d += FA_HEAD_DIM_STEP) {
    if (!covers(prefill_width(d), d, FA_PREFILL_TILED_MAX_HEAD_DIM)) return false;
    if (d <= FA_PREFILL_TILED_MAX_HEAD_DIM && !listed(kPrefillWidths, prefill_width(d))) return false;
    if (!covers(paged_prefill_width(d), d, FA_PAGED_PREFILL_TILED_MAX_HEAD_DIM)) return false;
    if (!covers(decode_width(d), d, FA_DECODE_MAX_HEAD_DIM)) return false;
  }
  return true;
}
static_assert(widths_cover_every_head_dim(), "a head dim without an instantiated width, or one past its op's maximum");
static_assert(widest(kPrefillWidths) == FA_PREFILL_TILED_MAX_HEAD_DIM &&
                  widest(kPagedPrefillWidths) == FA_PAGED_PREFILL_TILED_MAX_HEAD_DIM &&
                  widest(kDecodeWidths) == FA_DECODE_MAX_HEAD_DIM,
              "each kernel's maximum head dim (abi.h) is its widest instantiation");
// Past their tiled kernels, prefill and paged prefill run on the decode kernel (abi.h): up to its maximum.
static_assert(FA_PREFILL_MAX_HEAD_DIM <= FA_DECODE_MAX_HEAD_DIM && FA_PAGED_PREFILL_MAX_HEAD_DIM <= FA_DECODE_MAX_HEAD_DIM,
              "the streaming path serves every head dim past the tiled kernels'");
static_assert(FA_MAX_HEAD_DIM == FA_DECODE_MAX_HEAD_DIM && FA_PREFILL_MAX_HEAD_DIM <= FA_MAX_HEAD_DIM &&
                  FA_PAGED_PREFILL_MAX_HEAD_DIM <= FA_MAX_HEAD_DIM,
              "FA_MAX_HEAD_DIM is the largest op maximum");

FA_NAMESPACE_END
