// Which instantiated kernel width serves a head dim: the one place every op's launcher (prefill, paged
// prefill, decode) maps a run-time D to a compile-time tile width W >= D. Mirrored on the host by
// `fused_attn::head_dim` (src/head_dim.rs), which the grid, workspace and cost-model computations use; keep
// both in step.
//
// Supported: every D that is a multiple of 8 from 32 to 256 (16-byte rows: one cp.async chunk is 8
// elements). A kernel of width W serves D <= W with *predicated columns*: the 16-byte chunks at or past D
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
// decode has plenty of, and shared memory, which fits) keeps its three widths 64, 128, 256: its
// SwizzledTile needs W % 64 == 0 and its warp split needs W / 64 to divide the 4 warps
// (fa/decode/traits.cuh).
#pragma once

#include "fa/intrinsics.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN

constexpr int kMinHeadDim = 32;
constexpr int kMaxHeadDim = 256;

// Whether any op accepts head dim d.
FA_HOST_DEVICE constexpr bool head_dim_supported(int d) {
  return d >= kMinHeadDim && d <= kMaxHeadDim && d % 8 == 0;
}

// The prefill (dense, varlen and paged) kernel width for a supported d: fa/prefill/tile_config.cuh has a
// TileConfig for each value.
FA_HOST_DEVICE constexpr int prefill_width(int d) {
  return d > 192 ? 256 : (d > 96 && d < 128) ? 160 : (d + 31) / 32 * 32;
}

// The decode kernel width for a supported d: fa/decode/traits.cuh has Traits for each value.
FA_HOST_DEVICE constexpr int decode_width(int d) { return d <= 64 ? 64 : (d <= 128 ? 128 : 256); }

FA_NAMESPACE_END
