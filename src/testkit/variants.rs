//! The score variants of a test or benchmark case as data ([`CaseVariants`]): the fixtures make the arrays
//! from it (standard ALiBi slopes, sinks drawn from the case's seed) and hand the ops a
//! [`ScoreMod`](crate::ScoreMod) and the reference its [`Variants`](crate::reference::Variants).

use crate::score_mod::{alibi_slopes, VariantSet};

/// ALiBi slopes of a test or benchmark case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CaseAlibi {
    #[default]
    None,
    /// The standard geometric slopes ([`alibi_slopes`]), `[Hq]`.
    PerHead,
    /// `[B, Hq]`: sequence b's slopes are the standard ones times (1 + b/2).
    PerSequence,
}

/// The score variants of a test or benchmark case, as data: the fixtures make the arrays (standard ALiBi
/// slopes; sinks drawn from N(0, 1) with the case's seed).
pub type CaseVariants = VariantSet<CaseAlibi>;

impl CaseVariants {
    pub fn is_plain(&self) -> bool {
        *self == Self::default()
    }

    /// The variants set, without their arrays (what the product API's kernel choice takes).
    pub fn set(&self) -> VariantSet {
        VariantSet {
            window: self.window,
            softcap: self.softcap,
            alibi: self.alibi != CaseAlibi::None,
            sinks: self.sinks,
        }
    }

    /// Short description for labels ("" when plain).
    pub fn label(&self) -> String {
        let mut parts = Vec::new();
        if let Some((l, r)) = self.window {
            parts.push(format!("window=({l},{r})"));
        }
        if let Some(c) = self.softcap {
            parts.push(format!("softcap={c}"));
        }
        match self.alibi {
            CaseAlibi::None => {}
            CaseAlibi::PerHead => parts.push("alibi".into()),
            CaseAlibi::PerSequence => parts.push("alibi[B,Hq]".into()),
        }
        if self.sinks {
            parts.push("sinks".into());
        }
        parts.join(" ")
    }

    /// The slopes of `batch` sequences of `heads_q` heads: `[Hq]` or `[B·Hq]`, empty without ALiBi.
    pub fn slopes(&self, batch: usize, heads_q: usize) -> Vec<f32> {
        let base = alibi_slopes(heads_q);
        match self.alibi {
            CaseAlibi::None => Vec::new(),
            CaseAlibi::PerHead => base,
            CaseAlibi::PerSequence => {
                (0..batch).flat_map(|b| base.iter().map(move |&m| m * (1.0 + 0.5 * b as f32))).collect()
            }
        }
    }

    /// Sinks for `heads_q` heads drawn from N(0, 1) with `seed` (empty without sinks).
    pub fn sinks(&self, heads_q: usize, seed: u64) -> Vec<f32> {
        if !self.sinks {
            return Vec::new();
        }
        use rand::Rng;
        let mut rng = crate::testkit::seed::rng(seed ^ 0x51_4b5);
        // Box-Muller.
        (0..heads_q)
            .map(|_| {
                let (u1, u2): (f64, f64) = (rng.random_range(f64::EPSILON..1.0), rng.random_range(0.0..1.0));
                ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
            })
            .collect()
    }

    /// The reference's view, given the arrays made by [`slopes`](Self::slopes) and [`sinks`](Self::sinks)
    /// widened to f64.
    pub fn reference<'a>(&self, slopes: &'a [f64], sinks: &'a [f64]) -> crate::reference::Variants<'a> {
        crate::reference::Variants {
            window: self.window.map(|(l, r)| (i64::from(l), i64::from(r))),
            softcap: self.softcap.map(f64::from),
            alibi: (self.alibi != CaseAlibi::None).then_some(slopes),
            sinks: self.sinks.then_some(sinks),
        }
    }
}
