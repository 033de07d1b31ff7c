// FP8 -> 16-bit in registers, four codes at a time: what the decode kernel runs between its FP8 ldmatrix and
// the mma (fa/decode/warp_attention.cuh), so an FP8 tile never makes a second trip through shared memory.
//
// Where the hardware has no FP8 cvt (below sm_89), and for bf16 everywhere (no cvt from FP8 to bf16 exists
// before sm_100), the conversion is FlashInfer's (include/flashinfer/vec_dtypes.cuh): move each code's byte
// to the top of a 16-bit lane (one byte permute), shift its exponent and mantissa bits down into the target
// format's fields keeping the sign in place (one shift, one LOP3), then multiply the pair by 2^(bias_T -
// bias_FP8) (one HMUL2 / HFMA2.BF16). The first three steps read the code as the target format with the
// FP8 bias; the multiply by a power of two rebiases it exactly, subnormals included (an FP8 subnormal lands on
// a target subnormal or normal with the same value times 2^-(bias_T - bias_FP8)). Exact for every finite
// code (tests/fp8.rs checks all 256 of each format against fa/fp8_model.cuh); a NaN or infinity code becomes
// a finite value, which the kernels never meet: their hidden slots are zero-filled, never read.
// E5M2 -> fp16 needs only the permute (E5M2 is the top byte of an fp16). fp16 on sm_89+: the hardware cvt.
#pragma once

#include "fa/intrinsics.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN

// Bytes of (hi:lo) picked by selector s (nibble i names result byte i: 0-3 = lo's bytes, 4-7 = hi's): PRMT.
FA_DEVICE uint32_t byte_perm(uint32_t lo, uint32_t hi, uint32_t s) {
#if defined(FA_HOST_BUILD)
  const uint64_t both = (uint64_t)hi << 32 | lo;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= (uint32_t)(both >> (8 * ((s >> (4 * i)) & 7u)) & 0xffu) << (8 * i);
  return r;
#else
  return __byte_perm(lo, hi, s);
#endif
}

// Pairwise product of two packed pairs of T, round to nearest even (HMUL2 / HFMA2.BF16 with -0 addend).
template <class T> FA_DEVICE uint32_t mul2(uint32_t a, uint32_t b);
#if defined(FA_HOST_BUILD)
template <class T> FA_DEVICE uint32_t mul2(uint32_t a, uint32_t b) {
  float a0, a1, b0, b1;
  unpack2<T>(a, a0, a1);
  unpack2<T>(b, b0, b1);
  return pack2<T>(a0 * b0, a1 * b1); // exact in fp32, then rounded once as the hardware does
}
#else
template <class Pair> FA_DEVICE uint32_t mul2_as(uint32_t a, uint32_t b) {
  Pair x, y;
  __builtin_memcpy(&x, &a, 4);
  __builtin_memcpy(&y, &b, 4);
  const Pair z = __hmul2(x, y);
  uint32_t r;
  __builtin_memcpy(&r, &z, 4);
  return r;
}
template <> FA_DEVICE uint32_t mul2<half_t>(uint32_t a, uint32_t b) { return mul2_as<__half2>(a, b); }
template <> FA_DEVICE uint32_t mul2<bf16_t>(uint32_t a, uint32_t b) { return mul2_as<__nv_bfloat162>(a, b); }
#endif

template <class T, Fp8Format F> struct Fp8Rebias;
// Shift of the code's exponent+mantissa (after the permute put the code in bits 8-15) and 2^(bias_T - bias_FP8).
template <> struct Fp8Rebias<half_t, Fp8Format::E4M3> {
  static constexpr bool kHalf = true;
  static constexpr uint32_t kShift = 1, kScalePair = 0x5c005c00u; // 2^8 = 256 in fp16
};
template <> struct Fp8Rebias<half_t, Fp8Format::E5M2> {
  static constexpr bool kHalf = true;
  static constexpr uint32_t kShift = 0, kScalePair = 0x3c003c00u; // same bias: no multiply
};
template <> struct Fp8Rebias<bf16_t, Fp8Format::E4M3> {
  static constexpr bool kHalf = false;
  static constexpr uint32_t kShift = 4, kScalePair = 0x7b807b80u; // 2^120 in bf16
};
template <> struct Fp8Rebias<bf16_t, Fp8Format::E5M2> {
  static constexpr bool kHalf = false;
  static constexpr uint32_t kShift = 3, kScalePair = 0x77807780u; // 2^112 in bf16
};

// Two codes, already at the top of the two 16-bit lanes of `raw` -> the two values of T. Exact (finite codes).
template <class T, Fp8Format F> FA_DEVICE uint32_t fp8_pair_rebias(uint32_t raw) {
  using R = Fp8Rebias<T, F>;
  if constexpr (R::kShift == 0) return raw;
  const uint32_t fields = (raw & 0x80008000u) | ((raw >> R::kShift) & (0x7f007f00u >> R::kShift));
  return mul2<T>(fields, R::kScalePair);
}

// Four FP8 codes (byte i = element i) -> lo = elements 0, 1 and hi = elements 2, 3, packed pairs of T.
template <class T, Fp8Format F> FA_DEVICE void fp8x4_to(uint32_t codes, uint32_t &lo, uint32_t &hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if constexpr (Fp8Rebias<T, F>::kHalf) {
    lo = fp8x2_to_half2<F>((uint16_t)(codes & 0xffffu));
    hi = fp8x2_to_half2<F>((uint16_t)(codes >> 16));
    return;
  }
#endif
  lo = fp8_pair_rebias<T, F>(byte_perm(codes, 0u, 0x1404u)); // codes 0, 1 -> bits 8-15 and 24-31
  hi = fp8_pair_rebias<T, F>(byte_perm(codes, 0u, 0x3424u)); // codes 2, 3
}

FA_NAMESPACE_END
