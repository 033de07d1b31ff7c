// Division by a runtime constant without a divide instruction: the page size (token -> page in decode and
// paged prefill, slot -> page in append). The GPU has no integer divide; `/` by a runtime value is a ~20-
// instruction subroutine (64-bit: ~70). A multiply-high, an add and a shift do it exactly instead, with the
// constants (FaDivisor, abi.h) computed once on the host (src/fast_divmod.rs; `divisor_for` below is the
// launchers' re-check and the test hook's reference).
//
// Why exact (Granlund & Montgomery 1994, the "mulhi + n" form, which keeps the multiplier within the word for
// every divisor, 1 and the powers of two included). Let l = shift = ceil(log2 d), so 2^(l-1) < d <= 2^l, and
// M = ceil(2^(32+l) / d) = 2^32 + mul, i.e. M·d = 2^(32+l) + e with 0 <= e < d <= 2^l. For n = q·d + r,
// 0 <= r < d:
//     n·M / 2^(32+l) = q + (r + n·e / 2^(32+l)) / d,
// and n·e < 2^31 · 2^l for n < 2^31, so 0 <= n·e / 2^(32+l) < 1/2 and r + that < d: the floor is q. M is in
// [2^32, 2^33) because d is in (2^(l-1), 2^l], so mul = M - 2^32 fits 32 bits, and floor(n·M / 2^32) =
// mul_hi(n, mul) + n <= 2n < 2^32: the add cannot wrap. The 64-bit form is the same with 64 for 32 (n < 2^63).
// A power of two gets mul = 0 (n >> l), so every page size takes this one path: one IMAD.HI + IADD + SHF for
// the page, one IMAD more for the slot in the page (tests/it/page_sizes.rs checks both forms against `/`
// and `%` at every boundary that matters, and exhaustively over small ranges).
#pragma once

#include "fa/intrinsics.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN

// n / d for 0 <= n < 2^31 (a token index), `div` being d's FaDivisor.
FA_HOST_DEVICE int fast_div(const FaDivisor &div, int n) {
  return (int)((mul_hi((uint32_t)n, div.mul) + (uint32_t)n) >> div.shift);
}
// n / d for 0 <= n < 2^63 (a cache slot).
FA_HOST_DEVICE int64_t fast_div(const FaDivisor &div, int64_t n) {
  return (int64_t)((mul_hi((uint64_t)n, div.mul64) + (uint64_t)n) >> div.shift);
}

#if defined(FA_HOST_BUILD)
// The divisor constants of d (1 <= d < 2^31); the host's definition, which the Rust layer mirrors.
inline FaDivisor divisor_for(int32_t d) {
  int shift = 0;
  while ((int64_t)1 << shift < d) ++shift;
  const uint64_t m32 = (((uint64_t)1 << (32 + shift)) + (uint64_t)d - 1) / (uint64_t)d; // in [2^32, 2^33)
  const unsigned __int128 one = 1;
  const unsigned __int128 m64 = ((one << (64 + shift)) + (unsigned __int128)d - 1) / (unsigned __int128)d;
  return FaDivisor{(uint64_t)(m64 - (one << 64)), (uint32_t)(m32 - ((uint64_t)1 << 32)), shift};
}
// Whether `div` is d's divisor (a wrong one could index past a block-table row).
inline bool valid_divisor(const FaDivisor &div, int32_t d) {
  if (d < 1) return false;
  const FaDivisor want = divisor_for(d);
  return div.mul64 == want.mul64 && div.mul == want.mul && div.shift == want.shift;
}
#endif

FA_NAMESPACE_END
