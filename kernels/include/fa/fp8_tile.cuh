// FP8 KV tiles -> 16-bit tiles in shared memory (issue 17). An FP8 cache streams half the bytes of a 16-bit
// one; the kernels cp.async the FP8 rows as they are (16 bytes = 16 elements of one row) into a staging area,
// then convert shared -> shared into the 16-bit tile layout their ldmatrix / mma path already reads. The
// conversion is exact (every E4M3 / E5M2 value is an fp16 and a bf16 value), so the 16-bit math runs
// unchanged on the stored values; the dequantisation scales are folded into the math by the caller (k_scale
// into the score scale, v_scale into the output), never multiplied per element.
#pragma once

#include "fa/intrinsics.cuh"
#include "fa/paged_view.cuh"
#include "fa/swizzle.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN

// Two FP8 codes (low byte = first element) -> two elements of T, packed (low half = first). Exact.
template <class T, Fp8Format F> FA_DEVICE uint32_t fp8x2_to(uint16_t codes);
template <> FA_DEVICE uint32_t fp8x2_to<half_t, Fp8Format::E4M3>(uint16_t codes) {
  return fp8x2_to_half2<Fp8Format::E4M3>(codes);
}
template <> FA_DEVICE uint32_t fp8x2_to<half_t, Fp8Format::E5M2>(uint16_t codes) {
  return fp8x2_to_half2<Fp8Format::E5M2>(codes);
}
template <> FA_DEVICE uint32_t fp8x2_to<bf16_t, Fp8Format::E4M3>(uint16_t codes) {
  float lo, hi; // fp16 -> fp32 -> bf16: exact for FP8 values (NaN stays the canonical NaN)
  unpack2<half_t>(fp8x2_to_half2<Fp8Format::E4M3>(codes), lo, hi);
  return pack2<bf16_t>(lo, hi);
}
template <> FA_DEVICE uint32_t fp8x2_to<bf16_t, Fp8Format::E5M2>(uint16_t codes) {
  float lo, hi;
  unpack2<half_t>(fp8x2_to_half2<Fp8Format::E5M2>(codes), lo, hi);
  return pack2<bf16_t>(lo, hi);
}

// One 16-byte chunk of 16 FP8 codes (element i in byte i) -> its 16 elements of T: 0-7 in lo, 8-15 in hi.
template <class T, Fp8Format F> FA_DEVICE void fp8x16_to(const Vec16 &in, Vec16 &lo, Vec16 &hi) {
  lo.x = fp8x2_to<T, F>((uint16_t)(in.x & 0xffffu));
  lo.y = fp8x2_to<T, F>((uint16_t)(in.x >> 16));
  lo.z = fp8x2_to<T, F>((uint16_t)(in.y & 0xffffu));
  lo.w = fp8x2_to<T, F>((uint16_t)(in.y >> 16));
  hi.x = fp8x2_to<T, F>((uint16_t)(in.z & 0xffffu));
  hi.y = fp8x2_to<T, F>((uint16_t)(in.z >> 16));
  hi.z = fp8x2_to<T, F>((uint16_t)(in.w & 0xffffu));
  hi.w = fp8x2_to<T, F>((uint16_t)(in.w >> 16));
}

// Converts a staged FP8 tile, kRows rows of D bytes (row-major, unswizzled: how 16-byte cp.async chunks land),
// into the 16-bit tile at dst whose 16-byte chunk c of row r lies at Tile::offset(r, c). Threads
// [0, nthreads) share the chunks; the caller brackets the call with barriers (the staged bytes landed
// before, the tile is read after).
template <class T, class Tile, int D, int kRows, Fp8Format F>
FA_DEVICE void convert_fp8_tile(const unsigned char *src, unsigned char *dst, int tid, int nthreads) {
  constexpr int kChunks = D / 16;
  for (int i = tid; i < kRows * kChunks; i += nthreads) {
    const int row = i / kChunks;
    const int c = i % kChunks;
    Vec16 lo, hi;
    fp8x16_to<T, F>(ld_shared(reinterpret_cast<const Vec16 *>(src + row * D + c * 16)), lo, hi);
    st_shared(reinterpret_cast<Vec16 *>(dst + Tile::offset(row, 2 * c)), lo);
    st_shared(reinterpret_cast<Vec16 *>(dst + Tile::offset(row, 2 * c + 1)), hi);
  }
}
// The Tile of convert_fp8_tile for a SwizzledRows<kCols> tile of 16-bit elements (the prefill tile layout,
// fa/swizzle.cuh): byte offset of 16-byte chunk `chunk` of row `row`.
template <int kCols> struct SwizzledRowChunks {
  FA_HOST_DEVICE static int offset(int row, int chunk) { return SwizzledRows<kCols>::offset(row, 8 * chunk) * 2; }
};

// The same with the format chosen at run time (kv_dtype: FA_KV_FP8_E4M3 or FA_KV_FP8_E5M2; uniform per launch).
template <class T, class Tile, int D, int kRows>
FA_DEVICE void convert_fp8_tile(int kv_dtype, const unsigned char *src, unsigned char *dst, int tid, int nthreads) {
  if (kv_dtype == FA_KV_FP8_E5M2) {
    convert_fp8_tile<T, Tile, D, kRows, Fp8Format::E5M2>(src, dst, tid, nthreads);
  } else {
    convert_fp8_tile<T, Tile, D, kRows, Fp8Format::E4M3>(src, dst, tid, nthreads);
  }
}

// The dequantisation scale of KV head h (per-tensor scales have head stride 0).
FA_DEVICE float kv_scale(const float *scales, int scale_head_stride, int h) {
  return ld_global_nc(scales + (int64_t)h * scale_head_stride);
}

FA_NAMESPACE_END
