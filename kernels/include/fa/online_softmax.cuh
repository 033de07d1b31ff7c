// Online softmax over mma C fragments in the exp2 domain (FA2, Algorithm 1 with the rescale deferred, and
// the O rescale skipped for tiles where no row max of the warp moved):
// each thread owns 2 rows per m16 tile (rows g and g+8 of every fragment, fa/mma_tile.cuh) and keeps, per
// row, the running max of the RAW scores and a per-thread partial sum of exp2 weights; the partial sums
// are only combined across the quad at the end (every lane of a quad rescales by the same factor, because
// the row max is quad-reduced, so partial sums stay consistent).
//
// Exp2 domain: exp(s·scale - m·scale) = exp2(s·scale_log2 - m·scale_log2), and s·scale_log2 - m_scaled is
// one FFMA per score (FA2's trick; scale > 0 is a precondition, so max(s)·scale = max(s·scale)).
// Empty rows: a row that has only seen masked (-inf) scores keeps m = -inf; max_for_exp (fa/
// attention_state.cuh) turns the subtracted max into 0 so exp2 gives 0, never NaN.
#pragma once

#include "fa/attention_state.cuh"
#include "fa/mma_tile.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN

// The per-thread softmax state of kMT m16 tiles (2 rows each).
template <int kMT> struct OnlineSoftmax {
  float row_max[2 * kMT]; // max raw score seen so far; -inf until a visible key
  float row_sum[2 * kMT]; // this thread's partial sum of exp2(s·scale_log2 - max·scale_log2)

  FA_DEVICE void init() {
#pragma unroll
    for (int r = 0; r < 2 * kMT; ++r) {
      row_max[r] = kNegInf;
      row_sum[r] = 0.0f;
    }
  }

  // Folds one tile of raw scores s[kMT][kNB] (masked entries already -inf) into the state: updates the
  // row max, rescales the output accumulators o[kMT][kDB] and the sums by exp2(m_old - m_new), and turns s
  // into the unnormalised probabilities exp2(s·scale_log2 - m_new·scale_log2) in place.
  template <int kNB, int kDB>
  FA_DEVICE void update(float (&s)[kMT][kNB][4], float (&o)[kMT][kDB][4], float scale_log2) {
    float alpha[2 * kMT];
    bool max_moved = false;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) { // h = 0: row g (c0, c1); h = 1: row g + 8 (c2, c3)
        const int r = 2 * mt + h;
        float m_new = row_max[r];
#pragma unroll
        for (int nb = 0; nb < kNB; ++nb) m_new = fmaxf(m_new, fmaxf(s[mt][nb][2 * h], s[mt][nb][2 * h + 1]));
        m_new = quad_max(m_new);
        const float m_scaled = max_for_exp(m_new * scale_log2);
        // m_old = -inf (nothing seen yet) gives exp2(-inf) = 0: the accumulators are 0 there anyway.
        alpha[r] = fast_exp2(row_max[r] * scale_log2 - m_scaled);
        max_moved |= m_new != row_max[r];
        row_max[r] = m_new;
        float sum = row_sum[r] * alpha[r];
#pragma unroll
        for (int nb = 0; nb < kNB; ++nb) {
#pragma unroll
          for (int e = 2 * h; e < 2 * h + 2; ++e) {
            const float p = fast_exp2(fmaf(s[mt][nb][e], scale_log2, -m_scaled));
            s[mt][nb][e] = p;
            sum += p;
          }
        }
        row_sum[r] = sum;
      }
    }
    // Lazy rescale: a row whose max did not move has alpha = exp2(0) = 1 exactly (or, still empty, O = 0),
    // so O only needs its kMT·kDB·4 multiplies when some row of the warp moved. Past the first few tiles
    // the running max rarely moves (a new record among n keys has probability ~1/n per row), so most tiles
    // skip them; the result is bit-identical. The vote is warp-uniform, so the branch never diverges.
    if (warp_any(max_moved)) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int db = 0; db < kDB; ++db) {
            o[mt][db][2 * h] *= alpha[2 * mt + h];
            o[mt][db][2 * h + 1] *= alpha[2 * mt + h];
          }
        }
      }
    }
  }

  // Ends the pass: reduces the partial sums over the quad, scales o by 1/sum (0 for an empty row) and
  // returns each row's natural-log LSE (-inf for an empty row) in lse[2 * kMT].
  // sink: the attention sink's logit σ (natural log), or -inf for none. It joins the denominator once per
  // row, in the exp2 domain (σ' = σ · log2 e): the max becomes m' = max(m, σ'), the sum
  // l·2^(m − m') + 2^(σ' − m'), and o is rescaled by 2^(m − m'). A row that saw no key gets O = 0 and
  // LSE = σ exactly. Without a sink nothing changes.
  template <int kDB>
  FA_DEVICE void finalize(float (&o)[kMT][kDB][4], float (&lse)[2 * kMT], float scale_log2, float sink) {
    finalize_rows(o, lse, scale_log2, [sink](int) { return sink; });
  }
  // finalize with a sink per row (r = 2·mt + h, as lse): paged prefill packs several query heads, each with
  // its own sink, into one m16 tile.
  template <int kDB>
  FA_DEVICE void finalize(float (&o)[kMT][kDB][4], float (&lse)[2 * kMT], float scale_log2,
                          const float (&sinks)[2 * kMT]) {
    finalize_rows(o, lse, scale_log2, [&sinks](int r) { return sinks[r]; });
  }

private:
  template <int kDB, class SinkOf>
  FA_DEVICE void finalize_rows(float (&o)[kMT][kDB][4], float (&lse)[2 * kMT], float scale_log2, SinkOf sink_of) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = 2 * mt + h;
        const float sink = sink_of(r);
        const float sink_log2 = sink * kLog2e;
        float sum = quad_sum(row_sum[r]);
        float m = row_max[r] * scale_log2;
        float rescale = 1.0f;
        if (sink_log2 != kNegInf) {
          const float m_new = fmaxf(m, sink_log2);
          rescale = fast_exp2(m - m_new); // m = -inf (no key seen): 0
          sum = fmaf(sum, rescale, fast_exp2(sink_log2 - m_new));
          m = m_new;
        }
        const float inv = inv_sum_or_zero(sum) * rescale;
        lse[r] = sink != kNegInf && row_max[r] == kNegInf ? sink : lse_from_state(m, sum);
#pragma unroll
        for (int db = 0; db < kDB; ++db) {
          o[mt][db][2 * h] *= inv;
          o[mt][db][2 * h + 1] *= inv;
        }
      }
    }
  }
};

FA_NAMESPACE_END
