// The attention state of one query row and its guards, shared by prefill, decode and merge (so there is one
// tested definition of "empty row"): running max m and running sum l of exp2-domain scores
// (s · scale · log2 e), and the normalisation / LSE rules at the end.
//
// Empty rows (every key masked, zero-length sequence, seq_len 0): m stays -inf and l stays 0. The two
// guards below turn that into O = 0 and LSE = -inf instead of the NaN of (-inf) - (-inf) or 0 / 0.
#pragma once

#include <math.h>

#include "fa/intrinsics.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN

constexpr float kLn2 = 0.693147180559945309f;
constexpr float kLog2e = 1.442695040888963407f;
constexpr float kNegInf = -INFINITY;

// The value subtracted before exp2 for a row whose running max is `m`. A row that has only seen masked
// scores has m = -inf; subtracting 0 instead keeps exp2(-inf - 0) = 0 rather than exp2(NaN).
FA_HOST_DEVICE float max_for_exp(float m) { return m == kNegInf ? 0.0f : m; }

// 1 / l, or 0 for an empty row so that O = acc · 0 = 0 (acc is 0 there too, never NaN).
FA_HOST_DEVICE float inv_sum_or_zero(float l) { return l > 0.0f ? 1.0f / l : 0.0f; }

// Natural-log LSE from an exp2-domain state: ln(Σ exp(s·scale)) = (m + log2 l) · ln 2; -inf when empty.
FA_HOST_DEVICE float lse_from_state(float m, float l) { return l > 0.0f ? (m + log2f(l)) * kLn2 : kNegInf; }

// Weight exp(lse_i - lse_max) of a partial state in a merge; empty partials (lse_i = -inf) weigh 0, and a
// merge where every partial is empty (lse_max = -inf) gives all-zero weights instead of NaN.
FA_HOST_DEVICE float merge_weight(float lse_i, float lse_max) {
  return lse_i == kNegInf ? 0.0f : expf(lse_i - lse_max);
}

// The LSE of a merge: lse_max + ln(Σ merge weights); -inf when every partial was empty (sum 0).
FA_HOST_DEVICE float merged_lse(float lse_max, float weight_sum) {
  return weight_sum > 0.0f ? lse_max + logf(weight_sum) : kNegInf;
}

FA_NAMESPACE_END
