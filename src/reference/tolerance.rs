//! The tolerance rule (docs/semantics.md, FlashAttention's): a kernel's result passes iff it has no NaN and
//! `max|ours − ref64| ≤ 2 · max|naive_lowp − ref64| + 1e-5`, optionally also within a per-element arithmetic
//! bound ([`Output::out_bound`](super::Output::out_bound)); LSEs within an absolute tolerance. Every
//! comparison reports rel-L2 error too.

/// Outcome of comparing a result against the reference.
#[derive(Clone, Copy, Debug)]
pub struct Comparison {
    /// max |ours − ref| (∞ where exactly one side is infinite or the lengths differ; NaN is counted as ∞).
    pub max_abs_err: f64,
    /// ‖ours − ref‖₂ / max(‖ref‖₂, tiny), over the entries both sides have finite.
    pub rel_l2_err: f64,
    /// max |naive − ref| ([`compare`]); NaN if the naive result has a NaN or infinity the reference lacks,
    /// and for [`compare_lse`], where it does not apply.
    pub naive_max_abs_err: f64,
    /// The bound `max_abs_err` was held to.
    pub tolerance: f64,
    /// max over elements of |ours − ref| / bound under the per-element arithmetic bound ([`compare_bounded`];
    /// NaN where no such bound was applied). Passing needs ≤ 1.
    pub bound_ratio: f64,
    pub passed: bool,
}

/// The tolerance rule: passes iff the lengths agree, `ours` has no NaN, `ours` is finite wherever `reference`
/// is (equal infinities compare equal) and `max|ours − ref| ≤ 2 · max|naive − ref| + 1e-5`. A NaN (or stray
/// infinity) in `naive` makes the tolerance NaN, so the comparison fails rather than passing everything.
pub fn compare(ours: &[f64], reference: &[f64], naive: &[f64]) -> Comparison {
    let naive_err = if naive.len() == reference.len() {
        let s = diff_stats(naive, reference);
        if s.non_finite {
            f64::NAN
        } else {
            s.max_abs
        }
    } else {
        f64::NAN
    };
    let tolerance = 2.0 * naive_err + 1e-5;
    finish(ours, reference, naive_err, tolerance)
}

/// The tolerance rule of [`compare`] **and** the per-element arithmetic bound of [`Output::out_bound`](super::Output::out_bound):
/// passes iff `compare` passes and `|ours_i − ref_i| ≤ bound_i` for every element. The first rule is
/// FlashAttention's (relative to what a plain same-dtype implementation achieves); the second does not
/// widen with the sharpness of the softmax, so it judges sharp softmaxes (large scales, large magnitudes)
/// tightly. `bound_ratio` reports max |err_i| / bound_i.
pub fn compare_bounded(ours: &[f64], reference: &[f64], naive: &[f64], bound: &[f64]) -> Comparison {
    let mut c = compare(ours, reference, naive);
    c.bound_ratio = bound_ratio(ours, reference, bound);
    c.passed &= c.bound_ratio <= 1.0;
    c
}

/// Comparison under a per-element bound only (`naive_max_abs_err` NaN, `tolerance` the largest bound): for
/// results with no naive counterpart, such as the exact-answer tests' closed forms.
pub fn compare_within(ours: &[f64], reference: &[f64], bound: &[f64]) -> Comparison {
    let tolerance = bound.iter().copied().fold(0.0, f64::max);
    let mut c = finish(ours, reference, f64::NAN, f64::INFINITY);
    c.tolerance = tolerance;
    c.bound_ratio = bound_ratio(ours, reference, bound);
    c.passed &= c.bound_ratio <= 1.0;
    c
}

/// max_i |ours_i − ref_i| / bound_i: 0 where equal (infinities included), ∞ for a NaN, a one-sided
/// infinity, a length mismatch or an error against a zero bound.
fn bound_ratio(ours: &[f64], reference: &[f64], bound: &[f64]) -> f64 {
    if ours.len() != reference.len() || bound.len() != reference.len() {
        return f64::INFINITY;
    }
    let mut worst = 0.0f64;
    for ((&x, &r), &b) in ours.iter().zip(reference).zip(bound) {
        let ratio = if x == r {
            0.0
        } else if x.is_finite() && r.is_finite() && b > 0.0 {
            (x - r).abs() / b
        } else {
            f64::INFINITY
        };
        worst = worst.max(ratio);
    }
    worst
}

/// LSE comparison: −inf must match −inf exactly, finite values pass within absolute tolerance `atol`, NaN
/// anywhere in `ours` fails. `naive_max_abs_err` is NaN (not applicable) and `tolerance` is `atol`.
pub fn compare_lse(ours: &[f64], reference: &[f64], atol: f64) -> Comparison {
    finish(ours, reference, f64::NAN, atol)
}

fn finish(ours: &[f64], reference: &[f64], naive_max_abs_err: f64, tolerance: f64) -> Comparison {
    if ours.len() != reference.len() {
        let inf = f64::INFINITY;
        return Comparison {
            max_abs_err: inf,
            rel_l2_err: inf,
            naive_max_abs_err,
            tolerance,
            bound_ratio: f64::NAN,
            passed: false,
        };
    }
    let s = diff_stats(ours, reference);
    let rel_l2_err = s.diff_sq.sqrt() / s.ref_sq.sqrt().max(f64::MIN_POSITIVE);
    let passed = !s.ours_nan && s.max_abs <= tolerance;
    Comparison { max_abs_err: s.max_abs, rel_l2_err, naive_max_abs_err, tolerance, bound_ratio: f64::NAN, passed }
}

struct DiffStats {
    max_abs: f64,
    diff_sq: f64,
    ref_sq: f64,
    ours_nan: bool,
    non_finite: bool,
}

/// Elementwise |a − r|: 0 where equal (incl. equal infinities), ∞ where either side is NaN or only one side is
/// infinite (so `max_abs` is never NaN). The L2 sums skip non-finite entries.
fn diff_stats(a: &[f64], r: &[f64]) -> DiffStats {
    let mut s = DiffStats { max_abs: 0.0, diff_sq: 0.0, ref_sq: 0.0, ours_nan: false, non_finite: false };
    for (&x, &y) in a.iter().zip(r) {
        s.ours_nan |= x.is_nan();
        let e = if x == y {
            0.0
        } else if x.is_finite() && y.is_finite() {
            (x - y).abs()
        } else {
            s.non_finite = true;
            f64::INFINITY
        };
        s.max_abs = s.max_abs.max(e);
        if e.is_finite() && y.is_finite() {
            s.diff_sq += e * e;
            s.ref_sq += y * y;
        }
    }
    s
}

// ---------------------------------------------------------------------------------------------------------
// Core
