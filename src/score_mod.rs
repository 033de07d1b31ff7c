//! Score variants of every attention op (docs/semantics.md, "Score variants"): a sliding window, a logit
//! softcap, ALiBi slopes and attention sinks, in any combination. Per score, in this order:
//!
//! ```text
//! t = s · scale → softcap: c · tanh(t / c) → ALiBi: t − m_h · |i + δ − j| → window / causal mask → softmax with sink
//! ```
//!
//! with `δ = Tk − Tq` (decode: `seq_len − 1`), so row `i`'s own position among the keys is `i + δ`:
//! - window `(left, right)`, each ≥ 0 or −1 = unbounded: key `j` is visible iff
//!   `i + δ − left ≤ j ≤ i + δ + right` (FlashAttention-2's `window_size`; causal is `right = 0`);
//! - softcap `c > 0` (Gemma 2, Grok);
//! - ALiBi slopes `m_h` fp32 per query head, `[Hq]` or `[B, Hq]` (BLOOM, MPT);
//! - sinks `σ_h` fp32 `[Hq]` (gpt-oss): the denominator gains `exp(σ_h)`, so `O = Σ e^t v / (e^σ + Σ e^t)`,
//!   `LSE = log(e^σ + Σ e^t)`; a row with no visible key gives `O = 0`, `LSE = σ_h`. Under split-KV the
//!   sink enters once, in the merge.
//!
//! The kernels visit only the KV tiles (prefill) or tokens (decode) a window lets them see. With no variant
//! set they run exactly their plain code path.

use crate::error::{Error, Result};
use crate::launch::Launch;
use crate::sys;
use crate::tensor::{Mem, TensorView};

/// ALiBi slopes: one per query head, or one per (sequence, query head).
#[derive(Clone, Copy)]
pub enum AlibiSlopes<'a> {
    /// `[Hq]`, shared by every sequence.
    PerHead(&'a TensorView<'a, f32, 1>),
    /// `[B, Hq]` (unit head stride, any batch stride ≥ Hq).
    PerSequence(&'a TensorView<'a, f32, 2>),
}

/// The score variants of one call; `ScoreMod::default()` is plain attention.
#[derive(Clone, Copy, Default)]
pub struct ScoreMod<'a> {
    /// Sliding window `(left, right)`, each ≥ 0 or −1 (unbounded). Combined with causal, right is 0.
    pub window: Option<(i32, i32)>,
    /// Logit softcap `c`: finite and positive.
    pub softcap: Option<f32>,
    pub alibi_slopes: Option<AlibiSlopes<'a>>,
    /// Attention sinks, fp32 `[Hq]`, finite.
    pub sinks: Option<&'a TensorView<'a, f32, 1>>,
}

impl std::fmt::Debug for ScoreMod<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let alibi = self.alibi_slopes.map(|a| match a {
            AlibiSlopes::PerHead(v) => v.shape().to_vec(),
            AlibiSlopes::PerSequence(v) => v.shape().to_vec(),
        });
        f.debug_struct("ScoreMod")
            .field("window", &self.window)
            .field("softcap", &self.softcap)
            .field("alibi_slopes", &alibi)
            .field("sinks", &self.sinks.map(|s| s.shape()))
            .finish()
    }
}

/// Which variants a call sets, without their arrays: what decides which kernel runs and which tiles it
/// visits ([`crate::prefill::uses_variant_kernel`]). [`ScoreMod::set`] gives a call's. `A` says how ALiBi is
/// set: whether at all (`bool`), or, for a test case (`testkit::variants::CaseVariants`), with which slopes.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct VariantSet<A = bool> {
    pub window: Option<(i32, i32)>,
    pub softcap: Option<f32>,
    pub alibi: A,
    pub sinks: bool,
}

/// The ABI value of "no variant" (note: not `FaScoreMod::default()`, whose zero window bounds would mean
/// "the diagonal only").
pub(crate) fn abi_none() -> sys::FaScoreMod {
    sys::FaScoreMod { window_left: -1, window_right: -1, ..Default::default() }
}

/// The standard geometric ALiBi slopes for `heads` query heads: `2^(−8(h+1)/H)`, h < H (Press et al.).
pub fn alibi_slopes(heads: usize) -> Vec<f32> {
    (0..heads).map(|h| 2f64.powf(-8.0 * (h + 1) as f64 / heads as f64) as f32).collect()
}

impl<'a> ScoreMod<'a> {
    /// Whether any variant is set.
    pub fn is_plain(&self) -> bool {
        self.window.is_none() && self.softcap.is_none() && self.alibi_slopes.is_none() && self.sinks.is_none()
    }

    /// The variants set, without their arrays.
    pub fn set(&self) -> VariantSet {
        VariantSet {
            window: self.window,
            softcap: self.softcap,
            alibi: self.alibi_slopes.is_some(),
            sinks: self.sinks.is_some(),
        }
    }

    /// The left window bound as a key count, `None` if unbounded.
    pub fn window_left(&self) -> Option<usize> {
        self.window.and_then(|(l, _)| usize::try_from(l).ok())
    }

    /// Checks the scalar variants: window bounds ≥ −1, softcap finite and positive (`Unsupported`, naming
    /// the argument).
    pub fn check_values(&self) -> Result<()> {
        if let Some((l, r)) = self.window {
            for (name, v) in [("window (left)", l), ("window (right)", r)] {
                if v < -1 {
                    return Err(Error::unsupported(name, format!("{v} (a bound is >= 0, or -1 for unbounded)")));
                }
            }
        }
        if let Some(c) = self.softcap {
            if !(c.is_finite() && c > 0.0) {
                return Err(Error::unsupported("softcap", format!("{c} (must be finite and positive)")));
            }
        }
        Ok(())
    }

    /// Validates the variants for a call over `batch` sequences of `heads_q` query heads and registers their
    /// arrays with `launch`. Errors: bad scalars (see [`check_values`](Self::check_values)); slopes or sinks
    /// of the wrong shape (`Shape`) or layout (`Layout`); non-finite values in host memory (`Unsupported`;
    /// device arrays are not read back); arrays of another backend (`Backend`).
    pub(crate) fn abi(&self, launch: &mut Launch<'a>, batch: usize, heads_q: usize) -> Result<sys::FaScoreMod> {
        self.check_values()?;
        let mut m = abi_none();
        if let Some((l, r)) = self.window {
            (m.window_left, m.window_right) = (l, r);
        }
        m.softcap = self.softcap.unwrap_or(0.0);
        match self.alibi_slopes {
            None => {}
            Some(AlibiSlopes::PerHead(v)) => {
                v.expect_shape("alibi_slopes", [heads_q])?;
                v.check_rows("alibi_slopes", 4)?;
                check_finite("alibi_slopes", v)?;
                m.alibi_slopes = launch.input(c"alibi_slopes", v, 4)? as *const f32;
            }
            Some(AlibiSlopes::PerSequence(v)) => {
                v.expect_shape("alibi_slopes", [batch, heads_q])?;
                v.check_rows("alibi_slopes", 4)?;
                if batch > 1 && (v.strides()[0] as usize) < heads_q {
                    return Err(Error::layout("alibi_slopes", format!("batch stride {} < Hq", v.strides()[0])));
                }
                check_finite("alibi_slopes", v)?;
                m.alibi_slopes = launch.input(c"alibi_slopes", v, 4)? as *const f32;
                m.alibi_batch_stride = if batch > 1 { v.strides()[0] } else { heads_q as i64 };
            }
        }
        if let Some(s) = self.sinks {
            s.expect_shape("sinks", [heads_q])?;
            s.check_rows("sinks", 4)?;
            check_finite("sinks", s)?;
            m.sinks = launch.input(c"sinks", s, 4)? as *const f32;
        }
        Ok(m)
    }
}

/// Rejects NaN and infinities in a host array (the emulator backend); device arrays are not read.
fn check_finite<const N: usize>(name: &str, v: &TensorView<'_, f32, N>) -> Result<()> {
    let Mem::Host(h) = &v.mem else { return Ok(()) };
    let (shape, strides) = (v.shape(), v.strides());
    let mut bad = None;
    let total: usize = shape.iter().product();
    for flat in 0..total {
        let (mut rem, mut at) = (flat, 0i64);
        for d in (0..N).rev() {
            at += (rem % shape[d]) as i64 * strides[d];
            rem /= shape[d];
        }
        let x = h[at as usize];
        if !x.is_finite() {
            bad = Some((flat, x));
            break;
        }
    }
    match bad {
        Some((i, x)) => Err(Error::unsupported(name, format!("element {i} is {x} (must be finite)"))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_alibi_slopes() {
        let s = alibi_slopes(8);
        assert_eq!(s.len(), 8);
        assert_eq!((s[0], s[7]), (0.5, 1.0 / 256.0));
        assert_eq!(alibi_slopes(4), [0.25, 1.0 / 16.0, 1.0 / 64.0, 1.0 / 256.0]);
        assert!(alibi_slopes(0).is_empty());
    }

    #[test]
    fn scalar_checks() {
        let ok = ScoreMod { window: Some((-1, 0)), softcap: Some(30.0), ..Default::default() };
        assert!(ok.check_values().is_ok());
        for bad in [
            ScoreMod { window: Some((-2, 0)), ..Default::default() },
            ScoreMod { window: Some((4, -5)), ..Default::default() },
            ScoreMod { softcap: Some(0.0), ..Default::default() },
            ScoreMod { softcap: Some(-1.0), ..Default::default() },
            ScoreMod { softcap: Some(f32::NAN), ..Default::default() },
            ScoreMod { softcap: Some(f32::INFINITY), ..Default::default() },
        ] {
            assert_eq!(bad.check_values().unwrap_err().kind(), &crate::ErrorKind::Unsupported, "{bad:?}");
        }
        assert!(ScoreMod::default().is_plain());
        assert_eq!(ok.window_left(), None);
    }
}
