// Score variants as policies (docs/semantics.md, "Score variants"): the one place that decides what a
// variant does to a score, shared by the prefill and decode kernels. Per score, in this order:
//   t = s · scale  ->  softcap c·tanh(t/c)  ->  ALiBi t − m·|i + δ − j|  ->  window/causal mask  ->  softmax
// with the sink in the denominator. What each costs, and why it is compiled the way it is:
//  - Window (and causal): run-time. It only moves the block range (which tiles are visited, which are
//    masked: fa/prefill/block_range.cuh; decode's first token) and the bounds of the mask on the edge tiles,
//    which exist anyway; the mask-free interior loop is today's.
//  - Softcap and ALiBi: one compile-time flag, kScoreMod, for both. They change every score of every tile
//    (an exp2 and a division for the tanh, an integer distance and an FMA for the bias), so they cannot be
//    hoisted; a run-time branch in the inner loop would keep both paths' registers live in the plain
//    kernel (prefill D = 128 runs at ~250 of 255). One flag rather than two doubles, not quadruples, the
//    kernels nvcc builds; inside a kScoreMod kernel the two are uniform run-time branches. The sm_90a
//    prefill kernel has no such flag: its consumers have the registers for a uniform run-time branch per
//    tile (fa/hopper/mainloop.cuh, softmax_step, says why and what it took).
//  - Sinks: run-time, in the epilogue (prefill, single-split decode) or the merge (split-KV): one exp2 per
//    row, never per score.
//
// The kScoreMod kernels produce scores already in the exp2 domain (t · log2 e) and hand the online softmax a
// scale of 1 (fmaf(s, 1, −m) is exact), so the softmax code is the same for both kinds of kernel.
#pragma once

#include "fa/abi.h"
#include "fa/attention_state.cuh"
#include "fa/fragment_walk.cuh"
#include "fa/intrinsics.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN

// A window bound as the kernels use it: non-negative, with "unbounded" (−1, or any bound at least `span`)
// replaced by `span`. For a row i < Tq and a key j < Tk, |i + δ − j| < max(Tq, Tk) = span, so a bound of
// span excludes nothing; clamping keeps every sum of a position and a bound inside int32 (positions and
// spans are below 2^30, checked on the host).
FA_HOST_DEVICE int effective_window_bound(int bound, int span) { return bound < 0 || bound > span ? span : bound; }

// Effective (left, right) of a prefill sequence: causal is right = 0.
struct WindowBounds {
  int left, right;
};
FA_HOST_DEVICE WindowBounds effective_window(const FaScoreMod &m, bool causal, int tq, int tk) {
  const int span = tq > tk ? tq : tk;
  return WindowBounds{effective_window_bound(m.window_left, span),
                      causal ? 0 : effective_window_bound(m.window_right, span)};
}

// Whether a launch needs the kScoreMod kernels.
FA_HOST_DEVICE bool needs_score_mod(const FaScoreMod &m) { return m.softcap > 0.0f || m.alibi_slopes != nullptr; }

// Softcap and ALiBi of one score, in the exp2 domain. Built once per CTA.
struct ScoreMod {
  float scale_log2;    // scale · log2 e: the plain score, without softcap
  float tanh_in;       // 2 · log2 e · scale / c: exp2(s · tanh_in) = exp(2t/c); 0 = no softcap
  float cap_log2;      // c · log2 e
  float two_cap_log2;  // 2 · c · log2 e

  FA_DEVICE static ScoreMod make(float scale, float scale_log2, float softcap) {
    return from(scale_log2, softcap, tanh_input(scale, softcap));
  }
  // tanh_in, make()'s division: a kernel short of registers keeps only it across its loop and rebuilds the
  // rest per tile from the kernel parameters with from() (fa/hopper/mainloop.cuh).
  FA_DEVICE static float tanh_input(float scale, float softcap) {
    return softcap > 0.0f ? 2.0f * kLog2e * scale / softcap : 0.0f;
  }
  FA_DEVICE static ScoreMod from(float scale_log2, float softcap, float tanh_in) {
    ScoreMod m;
    m.scale_log2 = scale_log2;
    m.tanh_in = tanh_in;
    m.cap_log2 = softcap * kLog2e;
    m.two_cap_log2 = 2.0f * m.cap_log2;
    return m;
  }

  // The raw score s = q·k mapped to t · log2 e, t = softcap(s · scale) − m·dist, where slope_log2 =
  // m · log2 e (0 without ALiBi: fmaf(−0, dist, x) = x exactly) and dist = |i + δ − j|.
  // c·tanh(x/c) = c − 2c / (exp(2x/c) + 1): one exp2 (the same ex2.approx the softmax uses, modelled by the
  // emulator) and an IEEE division. exp2 overflowing to +inf gives c, underflowing to 0 gives −c: never NaN.
  // The absolute error is a few ulp of c (ex2's 2^-22 relative error moves tanh by at most half that),
  // the same order as the fp32 rounding of a score of magnitude c.
  // kInlineDivision (the sm_90a kernel): the division without div.rn's slow-path call, whose caller-saved
  // registers make the consumer warpgroups spill (div_rn_in_range), on e + 1 clamped to 2^30. The same
  // bits as the IEEE division whenever softcap_inline_division_ok(c): 2c·log2 e is then in [2^-64, 2^66]
  // and its quotients by [1, 2^30] inside div_rn_in_range's range, and past e + 1 = 2^30 the quotient is
  // below 2^-29 · 2c·log2 e, under half an ulp of cap_log2, so t rounds to cap_log2 with the clamp or
  // without.
  template <bool kInlineDivision = false> FA_DEVICE float apply(float s, float slope_log2, int dist) const {
    const float t = tanh_in != 0.0f ? softcapped<kInlineDivision>(s) : s * scale_log2;
    return alibi(t, slope_log2, dist);
  }
  // The two steps of apply(), for a kernel that runs them as separate passes (apply_score_mod_by_pass).
  template <bool kInlineDivision = false> FA_DEVICE float softcapped(float s) const {
    const float e = fast_exp2(s * tanh_in);
    return cap_log2 -
           (kInlineDivision ? div_rn_in_range(two_cap_log2, fminf(e + 1.0f, 0x1p30f)) : two_cap_log2 / (e + 1.0f));
  }
  FA_DEVICE static float alibi(float t, float slope_log2, int dist) { return fmaf(-slope_log2, (float)dist, t); }
};

// No softcap, or one inside the range ScoreMod's kInlineDivision is exact on: [2^-64, 2^64]. Any softcap
// a model uses (Gemma 2: 30 and 50) is; the sm_90a kernel rejects others (the Rust layer keeps them on the
// sm_80 kernel under auto). Mirrored by src/prefill/sm90.rs (SM90_SOFTCAP_RANGE).
FA_HOST_DEVICE bool softcap_inline_division_ok(float softcap) {
  return !(softcap > 0.0f) || (softcap >= 0x1p-64f && softcap <= 0x1p64f);
}

// apply_score_mod for one warp's m16 rows, as uniform passes over the whole tile: the softcap (or the plain
// scale) on every score, then ALiBi only with a slope. The same bits as apply_score_mod (ALiBi with a slope
// of 0 is fmaf(−0, dist, t) = t), with one pass's temporaries live at a time: the single-pass form, with
// both paths of every score interleaved by the scheduler (64 distances and 64 copies of the scale in
// registers at D = 64), spills the sm_90a consumers (fa/hopper/mainloop.cuh). The sm_90a kernel's divisions
// are inline (kInlineDivision: ScoreMod::apply).
template <int kNB>
FA_DEVICE void apply_score_mod_by_pass(float (&s)[1][kNB][4], int row0, int key0, int diag, const ScoreMod &mod,
                                       float slope_log2) {
  if (mod.tanh_in != 0.0f) {
#pragma unroll
    for (int nb = 0; nb < kNB; ++nb)
#pragma unroll
      for (int i = 0; i < 4; ++i) s[0][nb][i] = mod.template softcapped<true>(s[0][nb][i]);
  } else {
#pragma unroll
    for (int nb = 0; nb < kNB; ++nb)
#pragma unroll
      for (int i = 0; i < 4; ++i) s[0][nb][i] *= mod.scale_log2;
  }
  if (slope_log2 != 0.0f) {
    for_each_score(
        s, [&](int row) { return row0 + row + diag; },
        [&](float &x, int diag_key, int col) {
          const int dist = diag_key - (key0 + col);
          x = ScoreMod::alibi(x, slope_log2, dist < 0 ? -dist : dist);
        });
  }
}

// The ALiBi slope of query head h of sequence b, times log2 e; 0 without ALiBi.
FA_DEVICE float alibi_slope_log2(const FaScoreMod &m, int b, int h) {
  return m.alibi_slopes == nullptr ? 0.0f : ld_global(m.alibi_slopes + b * m.alibi_batch_stride + h) * kLog2e;
}

// Softcap and ALiBi of one warp's scores held as mma C fragments (rows row0 + [0, 16·kMT), keys
// key0 + [0, 8·kNB); the layout of mma.m16n8k16 and of a wgmma m64 accumulator's per-warp 16 rows alike),
// in place; diag = Tk − Tq. The result is in the exp2 domain, so the softmax then runs with a scale of 1.
// Used by the sm_80 kernel (kernels/prefill.cu); the sm_90a one runs apply_score_mod_by_pass.
template <int kMT, int kNB>
FA_DEVICE void apply_score_mod(float (&s)[kMT][kNB][4], int row0, int key0, int diag, const ScoreMod &mod,
                               float slope_log2) {
  for_each_score(
      s, [&](int row) { return row0 + row + diag; },
      [&](float &x, int diag_key, int col) {
        const int dist = diag_key - (key0 + col);
        x = mod.apply(x, slope_log2, dist < 0 ? -dist : dist);
      });
}

// The sink logit of query head h (natural log), or -inf without sinks.
FA_DEVICE float sink_logit(const FaScoreMod &m, int h) { return m.sinks == nullptr ? kNegInf : ld_global(m.sinks + h); }

#if defined(FA_HOST_BUILD)
// The launchers' re-check of what the Rust layer validates: bounds >= -1, softcap finite and >= 0 (0 = off),
// fp32 arrays 4-byte aligned, a non-negative ALiBi batch stride. (Sink values are device data: not read.)
inline bool valid_score_mod(const FaScoreMod &m, int heads_q) {
  if (m.window_left < -1 || m.window_right < -1) return false;
  if (!(m.softcap >= 0.0f && m.softcap <= 3.4e38f)) return false; // also rejects NaN and inf
  if (((uintptr_t)m.alibi_slopes & 3u) != 0 || ((uintptr_t)m.sinks & 3u) != 0) return false;
  if (m.alibi_slopes != nullptr && m.alibi_batch_stride != 0 && m.alibi_batch_stride < heads_q) return false;
  return m.alibi_batch_stride >= 0;
}
#endif

FA_NAMESPACE_END
