// FP8 (OCP E4M3 / E5M2, CUDA's __nv_fp8_e4m3 / __nv_fp8_e5m2) as a scalar model: the definition of the
// conversions the FP8 KV cache uses, bit for bit. The host build (emulator) and the GPU below sm_89 run these
// functions; sm_89+ run the hardware cvt (fa/intrinsics.cuh), which the self-tests compare with them.
//  - FP8 -> fp16 is exact for both formats (every FP8 value is an fp16 value); NaN -> 0x7fff (canonical, sign
//    dropped), as CUDA's software path. E4M3 has no infinities (0x7f / 0xff are NaN), E5M2 does (0x7c).
//  - fp32 -> FP8 rounds to nearest even and saturates (.satfinite): every |x| above the largest finite value
//    (448 / 57344), infinities included, becomes +-max; NaN becomes 0x7f (NaN in both formats); -0 stays -0.
// Included by fa/intrinsics.cuh (which defines FA_HOST_DEVICE); no PTX here.
#pragma once

#include <stdint.h>

#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN

enum class Fp8Format { E4M3, E5M2 };

template <Fp8Format F> struct Fp8Traits;
template <> struct Fp8Traits<Fp8Format::E4M3> {
  static constexpr uint32_t kMantBits = 3, kBias = 7;
  static constexpr uint32_t kMaxCode = 0x7e;        // 448 = 1.75 * 2^8
  static constexpr uint32_t kMaxFloatBits = 0x43e00000u; // 448.0f
};
template <> struct Fp8Traits<Fp8Format::E5M2> {
  static constexpr uint32_t kMantBits = 2, kBias = 15;
  static constexpr uint32_t kMaxCode = 0x7b;        // 57344 = 1.75 * 2^15
  static constexpr uint32_t kMaxFloatBits = 0x47600000u; // 57344.0f
};

// `u >> shift` rounded to nearest even given the dropped bits (1 <= shift <= 31).
FA_HOST_DEVICE uint32_t fp8_round_shift_rne(uint32_t u, uint32_t shift) {
  const uint32_t kept = u >> shift;
  const uint32_t rest = u & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  return kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
}

// One FP8 code -> fp16 bits, exact.
template <Fp8Format F> FA_HOST_DEVICE uint16_t fp8_to_half_bits_model(uint8_t code) {
  if constexpr (F == Fp8Format::E5M2) {
    const uint32_t h = (uint32_t)code << 8; // E5M2 is the top byte of an fp16
    return (h & 0x7fffu) > 0x7c00u ? (uint16_t)0x7fffu : (uint16_t)h;
  } else {
    const uint32_t sign = (uint32_t)(code & 0x80u) << 8;
    const uint32_t a = code & 0x7fu;
    if (a == 0x7fu) return 0x7fffu;
    if (a >= 0x08u) return (uint16_t)(sign | ((a << 7) + 0x2000u)); // normal: exponent rebias 7 -> 15
    if (a == 0u) return (uint16_t)sign;
    // Subnormal a * 2^-9 (a = 1..7): an fp16 normal 2^p * (a / 2^p), p = floor(log2 a).
    const uint32_t p = a >= 4u ? 2u : (a >= 2u ? 1u : 0u);
    return (uint16_t)(sign | (p + 6u) << 10 | ((a - (1u << p)) << (10u - p)));
  }
}

// fp32 -> one FP8 code: round to nearest even, saturating to the largest finite value; NaN -> 0x7f.
template <Fp8Format F> FA_HOST_DEVICE uint8_t fp8_from_float_model(float f) {
  using Tr = Fp8Traits<F>;
  uint32_t x;
  __builtin_memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 24) & 0x80u;
  const uint32_t u = x & 0x7fffffffu;
  if (u > 0x7f800000u) return 0x7fu;
  if (u >= Tr::kMaxFloatBits) return (uint8_t)(sign | Tr::kMaxCode);
  if (u >= (128u - Tr::kBias) << 23) // normal: rebias 127 -> kBias; a carry into the exponent is right
    return (uint8_t)(sign | fp8_round_shift_rne(u - ((127u - Tr::kBias) << 23), 23u - Tr::kMantBits));
  // Subnormal: the value m * 2^(e - 150) in units of the smallest subnormal 2^(1 - bias - mant).
  const uint32_t e = u >> 23;
  const uint32_t shift = 151u - Tr::kBias - Tr::kMantBits - e;
  if (shift > 24u) return (uint8_t)sign; // below half the smallest subnormal (or exactly half: even = 0)
  return (uint8_t)(sign | fp8_round_shift_rne((u & 0x7fffffu) | 0x800000u, shift));
}

FA_NAMESPACE_END
