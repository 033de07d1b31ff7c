// The CUDA vector and 16-bit float types kernel code uses, for the host build, so that the host library
// (launchers + emulator) compiles with any C++17 compiler and no CUDA headers: a crate built without a CUDA
// toolkit still has the emulator. Layouts match CUDA's (float2 8-byte, float4/uint4 16-byte aligned); the
// fp32 -> 16-bit conversions are round-to-nearest-even with CUDA's results bit for bit (overflow to inf,
// subnormals kept, every NaN to the canonical 0x7fff), which tests/emulator.rs checks against the `half`
// crate over every fp16/bf16 value and a sweep of fp32 inputs.
#pragma once

#include <stdint.h>
#include <string.h>

struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(16) uint4 {
  uint32_t x, y, z, w;
};
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

namespace fa {
namespace emu {

// 16-bit storage types: only their bits are ever used by kernel code (loads, stores, pack/unpack).
struct Half {
  uint16_t bits;
};
struct Bf16 {
  uint16_t bits;
};

inline uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// Rounds the magnitude `u >> shift` to nearest even given the dropped low bits.
inline uint32_t round_shift_rne(uint32_t u, uint32_t shift) {
  const uint32_t kept = u >> shift;
  const uint32_t rest = u & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  return kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
}

inline uint16_t float_to_half_bits(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t u = x & 0x7fffffffu;
  if (u > 0x7f800000u) return 0x7fffu;                    // NaN: canonical
  if (u >= 0x47800000u) return (uint16_t)(sign | 0x7c00u); // >= 2^16: inf (also rounds there)
  if (u >= 0x38800000u) {                                  // normal half: rebias 127 -> 15
    const uint32_t r = round_shift_rne(u - 0x38000000u, 13);
    return (uint16_t)(sign | r); // a carry into the exponent is the correct rounding (up to inf)
  }
  if (u < 0x33000001u) return (uint16_t)sign; // below half the smallest subnormal (ties to even: 0)
  // Subnormal half: value = mantissa(with implicit 1) * 2^(e-150); in units of 2^-24 that is m >> (126 - e).
  const uint32_t e = u >> 23;
  const uint32_t m = (u & 0x7fffffu) | 0x800000u;
  return (uint16_t)(sign | round_shift_rne(m, 126u - e));
}

inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) return bits_float(float_bits((float)mant * 0x1p-24f) | sign); // exact
  if (exp == 31) return bits_float(sign | 0x7f800000u | mant << 13);
  return bits_float(sign | (exp + 112) << 23 | mant << 13);
}

inline uint16_t float_to_bf16_bits(float f) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fffu; // NaN: canonical
  return (uint16_t)round_shift_rne(x, 16);             // a carry past the exponent gives inf, as it should
}

inline float bf16_bits_to_float(uint16_t h) { return bits_float((uint32_t)h << 16); }

} // namespace emu
} // namespace fa
