//! Score variants for the candle ops (docs/semantics.md, "Score variants"): the same window, softcap, ALiBi
//! and sinks as [`crate::ScoreMod`], with the per-head arrays as candle tensors on the op's device.

use candle_core::Tensor;

use super::bridge::Backing;
use crate::error::Error;
use crate::score_mod::{AlibiSlopes, ScoreMod};
use crate::tensor::TensorView;

/// The score variants of one candle op call; `Variants::default()` is plain attention.
#[derive(Clone, Debug, Default)]
pub struct Variants {
    /// Sliding window `(left, right)`, each ≥ 0 or −1 (unbounded); with causal, right is 0.
    pub window: Option<(i32, i32)>,
    /// Logit softcap `c > 0`: scores become `c · tanh(s / c)`.
    pub softcap: Option<f32>,
    /// ALiBi slopes, f32 `[Hq]` (every sequence) or `[B, Hq]` (per sequence), on the op's device.
    pub alibi_slopes: Option<Tensor>,
    /// Attention sinks, f32 `[Hq]`, on the op's device.
    pub sinks: Option<Tensor>,
}

/// The slope tensor viewed at its rank.
enum SlopeView<'a> {
    PerHead(TensorView<'a, f32, 1>),
    PerSequence(TensorView<'a, f32, 2>),
}

impl Variants {
    /// Runs `f` with these variants as a [`ScoreMod`] whose arrays are views of the tensors on backend `S`
    /// (the op's; a tensor on another device is a `Backend` error naming it).
    pub(crate) fn with_score_mod<S: Backing, R>(
        &self,
        f: impl FnOnce(ScoreMod<'_>) -> candle_core::Result<R>,
    ) -> candle_core::Result<R> {
        let alibi = self.alibi_slopes.as_ref().map(|t| t.storage_and_layout());
        let sinks = self.sinks.as_ref().map(|t| t.storage_and_layout());
        let slopes = match &alibi {
            None => None,
            Some((storage, l)) => {
                let s = S::of(storage, "alibi_slopes")?;
                Some(match l.dims().len() {
                    1 => SlopeView::PerHead(s.view::<f32, 1>("alibi_slopes", l)?),
                    2 => SlopeView::PerSequence(s.view::<f32, 2>("alibi_slopes", l)?),
                    _ => {
                        return Err(Error::shape(
                            "alibi_slopes",
                            format!("shape {:?}, expected [Hq] or [B, Hq]", l.dims()),
                        )
                        .into())
                    }
                })
            }
        };
        let sinks = match &sinks {
            None => None,
            Some((storage, l)) => Some(S::of(storage, "sinks")?.view::<f32, 1>("sinks", l)?),
        };
        let alibi_slopes = slopes.as_ref().map(|s| match s {
            SlopeView::PerHead(v) => AlibiSlopes::PerHead(v),
            SlopeView::PerSequence(v) => AlibiSlopes::PerSequence(v),
        });
        f(ScoreMod { window: self.window, softcap: self.softcap, alibi_slopes, sinks: sinks.as_ref() })
    }
}
