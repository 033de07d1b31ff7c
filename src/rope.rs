//! Rotary position embedding (RoPE) fused into the ops that read Q or K (docs/rope.md): append rotates K on
//! its way into the paged cache, decode rotates each query at its position. The kernels read a precomputed
//! fp32 cos/sin table `[max_pos, rotary_dim / 2]` ([`Rope`]); this module builds one for θ and the
//! frequency schemes models use ([`RopeConfig::table`]: default, linear, NTK-aware, Llama 3, YaRN), in f64,
//! rounded once to f32. Engines that already keep a cos/sin cache pass theirs.
//!
//! Pair `i < rotary_dim / 2` of a head row `x` is `(x[i], x[i + rotary_dim/2])` ([`RopeStyle::Neox`],
//! rotate-half) or `(x[2i], x[2i+1])` ([`RopeStyle::Gptj`], interleaved), and turns by the table's
//! `(c, s) = (cos[p][i], sin[p][i])` at position `p`: `(a, b) → (a·c − b·s, b·c + a·s)`, in fp32 with one
//! fma each ([`rotate_row_f32`] is the exact model). Dims at or past `rotary_dim` pass through.

use std::f64::consts::PI;

use crate::error::{Error, Result};
use crate::launch::Launch;
use crate::sys;
use crate::tensor::{Mem, TensorView};

/// Which elements of a head row pair up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RopeStyle {
    /// Rotate-half (GPT-NeoX, Llama, most models): pair `i` is `(x[i], x[i + rotary_dim/2])`.
    #[default]
    Neox,
    /// Interleaved (GPT-J, GLM): pair `i` is `(x[2i], x[2i+1])`.
    Gptj,
}

impl RopeStyle {
    fn abi(self) -> i32 {
        match self {
            RopeStyle::Neox => sys::FA_ROPE_NEOX as i32,
            RopeStyle::Gptj => sys::FA_ROPE_GPTJ as i32,
        }
    }
    /// Element `j < rotary_dim`: (pair index, partner element, whether `j` is the pair's first).
    pub fn pair(self, j: usize, rotary_dim: usize) -> (usize, usize, bool) {
        match self {
            RopeStyle::Gptj => (j / 2, j ^ 1, j % 2 == 0),
            RopeStyle::Neox => {
                let half = rotary_dim / 2;
                if j < half {
                    (j, j + half, true)
                } else {
                    (j - half, j - half, false)
                }
            }
        }
    }
}

/// The frequency scheme: how the inverse frequencies `θ^(−2i/d)` are changed for long contexts.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum RopeScaling {
    /// `inv_freq[i] = θ^(−2i/d)`, d = rotary_dim.
    #[default]
    None,
    /// Position interpolation: every frequency divided by `factor`.
    Linear { factor: f64 },
    /// NTK-aware (static): θ replaced by `θ · factor^(d/(d−2))`.
    Ntk { factor: f64 },
    /// Llama 3 / 3.1: wavelengths longer than `original_max_pos / low_freq_factor` divided by `factor`,
    /// shorter than `original_max_pos / high_freq_factor` kept, a smooth blend between.
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_max_pos: usize },
    /// YaRN (Peng et al.; HF `_compute_yarn_parameters`): interpolation by `factor` blended with
    /// extrapolation over the dims between the correction bounds of `beta_fast` / `beta_slow` rotations
    /// (floor / ceil), and cos, sin multiplied by the attention factor ([`RopeConfig::attention_factor`]).
    Yarn {
        factor: f64,
        original_max_pos: usize,
        beta_fast: f64,
        beta_slow: f64,
        /// `mscale` / `mscale_all_dim` (DeepSeek): attention factor `m(factor, mscale) / m(factor,
        /// mscale_all_dim)`; both 0: `m(factor, 1)`, with `m(s, k) = 0.1·k·ln s + 1` (1 for s ≤ 1).
        mscale: f64,
        mscale_all_dim: f64,
        /// An explicit attention factor overriding the mscale rule.
        attention_factor: Option<f64>,
    },
}

impl RopeScaling {
    /// Llama 3.1's published parameters (factor 8, low 1, high 4, original 8192).
    pub fn llama31() -> Self {
        RopeScaling::Llama3 { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_pos: 8192 }
    }
    /// YaRN with the usual defaults (β_fast 32, β_slow 1, no mscale override).
    pub fn yarn(factor: f64, original_max_pos: usize) -> Self {
        RopeScaling::Yarn {
            factor,
            original_max_pos,
            beta_fast: 32.0,
            beta_slow: 1.0,
            mscale: 0.0,
            mscale_all_dim: 0.0,
            attention_factor: None,
        }
    }
}

/// A model's rotary embedding: base θ, rotated dims, pair layout and frequency scheme.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeConfig {
    pub theta: f64,
    /// Even, 2..=head_dim (partial rotary below head_dim: Phi, GLM, Pythia).
    pub rotary_dim: usize,
    pub style: RopeStyle,
    pub scaling: RopeScaling,
}

impl RopeConfig {
    pub fn new(theta: f64, rotary_dim: usize, style: RopeStyle) -> Self {
        Self { theta, rotary_dim, style, scaling: RopeScaling::None }
    }

    /// Rejects what no table can be built for (`Unsupported`, naming the parameter).
    pub fn check(&self) -> Result<()> {
        if self.rotary_dim < 2 || self.rotary_dim % 2 != 0 {
            return Err(Error::unsupported("rotary_dim", format!("{} (must be even and >= 2)", self.rotary_dim)));
        }
        if !(self.theta.is_finite() && self.theta > 1.0) {
            return Err(Error::unsupported("rope_theta", format!("{} (must be finite and > 1)", self.theta)));
        }
        let factor = match self.scaling {
            RopeScaling::None => 1.0,
            RopeScaling::Linear { factor } | RopeScaling::Ntk { factor } => factor,
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_pos } => {
                if !(low_freq_factor > 0.0 && high_freq_factor > low_freq_factor && original_max_pos > 0) {
                    return Err(Error::unsupported(
                        "rope_scaling",
                        "llama3 needs 0 < low_freq_factor < high_freq_factor and original_max_pos > 0",
                    ));
                }
                factor
            }
            RopeScaling::Yarn { factor, original_max_pos, beta_fast, beta_slow, .. } => {
                if !(original_max_pos > 0 && beta_fast > 0.0 && beta_slow > 0.0) {
                    return Err(Error::unsupported(
                        "rope_scaling",
                        "yarn needs original_max_pos, beta_fast, beta_slow > 0",
                    ));
                }
                factor
            }
        };
        if !(factor.is_finite() && factor > 0.0) {
            return Err(Error::unsupported("rope_scaling", format!("factor {factor} (must be finite and > 0)")));
        }
        Ok(())
    }

    /// The inverse frequencies `[rotary_dim / 2]` (radians per position), in f64.
    pub fn inv_freq(&self) -> Vec<f64> {
        let d = self.rotary_dim as f64;
        let half = self.rotary_dim / 2;
        let base = |theta: f64| (0..half).map(move |i| theta.powf(-((2 * i) as f64) / d));
        match self.scaling {
            RopeScaling::None => base(self.theta).collect(),
            RopeScaling::Linear { factor } => base(self.theta).map(|f| f / factor).collect(),
            RopeScaling::Ntk { factor } => base(self.theta * factor.powf(d / (d - 2.0))).collect(),
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_pos } => {
                let old = original_max_pos as f64;
                let (low_wavelen, high_wavelen) = (old / low_freq_factor, old / high_freq_factor);
                base(self.theta)
                    .map(|f| {
                        let wavelen = 2.0 * PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
            RopeScaling::Yarn { factor, original_max_pos, beta_fast, beta_slow, .. } => {
                // The dim whose wavelength fits `rotations` times into the original context.
                let correction_dim = |rotations: f64| {
                    d * (original_max_pos as f64 / (rotations * 2.0 * PI)).ln() / (2.0 * self.theta.ln())
                };
                let low = correction_dim(beta_fast).floor().max(0.0);
                let high = correction_dim(beta_slow).ceil().min(d - 1.0);
                let high = if low == high { high + 0.001 } else { high };
                base(self.theta)
                    .enumerate()
                    .map(|(i, f)| {
                        let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                        let extrapolate = 1.0 - ramp;
                        (f / factor) * (1.0 - extrapolate) + f * extrapolate
                    })
                    .collect()
            }
        }
    }

    /// The factor cos and sin are multiplied by (YaRN's attention factor; 1 otherwise).
    pub fn attention_factor(&self) -> f64 {
        let m = |s: f64, k: f64| if s <= 1.0 { 1.0 } else { 0.1 * k * s.ln() + 1.0 };
        match self.scaling {
            RopeScaling::Yarn { factor, mscale, mscale_all_dim, attention_factor, .. } => match attention_factor {
                Some(a) => a,
                None if mscale != 0.0 && mscale_all_dim != 0.0 => m(factor, mscale) / m(factor, mscale_all_dim),
                None => m(factor, 1.0),
            },
            _ => 1.0,
        }
    }

    /// The cos/sin table of positions `0..max_pos`: angle `p · inv_freq[i]` and the attention factor in f64,
    /// each entry rounded once to f32.
    /// `max_pos` from 1 to `i32::MAX` (the kernels' positions are int32), else `Shape` / `Overflow` naming it;
    /// a table the host cannot allocate is `OutOfMemory`.
    pub fn table(&self, max_pos: usize) -> Result<RopeTable> {
        self.check()?;
        if max_pos == 0 {
            return Err(Error::shape("max_pos", "0 (a table needs at least one position)"));
        }
        crate::error::to_i32("max_pos", max_pos)?;
        let (inv, att) = (self.inv_freq(), self.attention_factor());
        let half = inv.len();
        let len = max_pos.checked_mul(half).ok_or_else(|| Error::overflow("max_pos", format!("{max_pos} x {half}")))?;
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for v in [&mut cos, &mut sin] {
            v.try_reserve_exact(len).map_err(|_| {
                Error::new(crate::ErrorKind::OutOfMemory, format!("max_pos: a table of {len} fp32 entries"))
            })?;
        }
        for p in 0..max_pos {
            for &f in &inv {
                let (s, c) = (p as f64 * f).sin_cos();
                cos.push((c * att) as f32);
                sin.push((s * att) as f32);
            }
        }
        Ok(RopeTable { max_pos, half, cos, sin })
    }
}

/// A host cos/sin table: `cos`, `sin` `[max_pos, half]` row-major, `half = rotary_dim / 2`.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeTable {
    pub max_pos: usize,
    pub half: usize,
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
}

impl RopeTable {
    /// (cos, sin) of pair `i` at position `p`.
    pub fn at(&self, p: usize, i: usize) -> (f32, f32) {
        (self.cos[p * self.half + i], self.sin[p * self.half + i])
    }
}

/// The rotary embedding of one op call: the table (fp32 `cos`, `sin`, each `[max_pos, ≥ rotary_dim/2]`
/// with unit column stride; columns past rotary_dim/2 are never read, so one `[max_pos, rotary_dim]`
/// cos‖sin cache as vLLM keeps it is two views of one buffer), the rotated dims, the layout, and the
/// positions (int32; append: one per new token, required; decode: one per sequence, `None` = each
/// sequence's last position `seq_len − 1`). Positions must lie in `[0, max_pos)`: host positions are
/// checked (`OutOfBounds`), device ones are clamped into the table by the kernels.
#[derive(Clone, Copy)]
pub struct Rope<'a> {
    pub cos: &'a TensorView<'a, f32, 2>,
    pub sin: &'a TensorView<'a, f32, 2>,
    pub rotary_dim: usize,
    pub style: RopeStyle,
    pub positions: Option<&'a TensorView<'a, i32, 1>>,
}

impl std::fmt::Debug for Rope<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rope")
            .field("table", &self.cos.shape())
            .field("rotary_dim", &self.rotary_dim)
            .field("style", &self.style)
            .field("positions", &self.positions.map(|p| p.shape()))
            .finish()
    }
}

impl<'a> Rope<'a> {
    /// Validates the table and positions for an op over rows of `head_dim` with `positions_len` positions
    /// expected (`None`: positions optional, else their count), and registers them with `launch`. Errors:
    /// bad dims (`Unsupported`), shapes (`Shape`), strides (`Layout`), missing positions (`Usage`), a host
    /// position outside the table (`OutOfBounds`, naming it).
    pub(crate) fn abi<'l>(
        &self,
        launch: &mut Launch<'l>,
        head_dim: usize,
        positions_len: usize,
        positions_required: bool,
    ) -> Result<sys::FaRope>
    where
        'a: 'l,
    {
        let rd = self.rotary_dim;
        if rd < 2 || rd % 2 != 0 || rd > head_dim {
            return Err(Error::unsupported(
                "rotary_dim",
                format!("{rd} (must be even, >= 2 and <= the head dim {head_dim})"),
            ));
        }
        let [max_pos, cols] = self.cos.shape();
        if max_pos == 0 || cols < rd / 2 {
            return Err(Error::shape(
                "rope_cos",
                format!("shape {:?}: needs >= 1 position and >= rotary_dim/2 = {} columns", self.cos.shape(), rd / 2),
            ));
        }
        let [sin_pos, sin_cols] = self.sin.shape();
        if sin_pos != max_pos || sin_cols < rd / 2 {
            return Err(Error::shape(
                "rope_sin",
                format!("shape {:?} does not match cos {:?}", self.sin.shape(), self.cos.shape()),
            ));
        }
        i32::try_from(max_pos).map_err(|_| Error::overflow("rope_cos", format!("{max_pos} positions")))?;
        // The kernels read columns 0..rotary_dim/2 of a row: rows of more than one must not overlap them
        // (the launcher's rule, checked here to name the table). One row's stride addresses nothing.
        let half = (rd / 2) as i64;
        for (name, v) in [("rope_cos", self.cos), ("rope_sin", self.sin)] {
            if v.strides()[1] != 1 || (max_pos > 1 && v.strides()[0] < half) {
                return Err(Error::layout(
                    name,
                    format!(
                        "needs unit column stride and a row stride >= rotary_dim/2 = {half}, got {:?}",
                        v.strides()
                    ),
                ));
            }
        }
        let row_stride = |v: &TensorView<'_, f32, 2>| if max_pos > 1 { v.strides()[0] } else { half };
        let mut r = sys::FaRope {
            cos: launch.input(c"rope_cos", self.cos, 4)? as *const f32,
            sin: launch.input(c"rope_sin", self.sin, 4)? as *const f32,
            cos_stride: row_stride(self.cos),
            sin_stride: row_stride(self.sin),
            positions: std::ptr::null(),
            max_pos: max_pos as i32,
            rotary_dim: rd as i32,
            style: self.style.abi(),
        };
        match self.positions {
            None if positions_required => {
                return Err(Error::usage("rope positions: this op needs one position per token"));
            }
            None => {}
            Some(p) => r.positions = positions_abi(launch, c"rope_positions", p, positions_len, max_pos)?,
        }
        Ok(r)
    }
}

/// Checks one positions vector (`len` int32 entries, contiguous; host values inside the table's `max_pos`)
/// and registers it with `launch` as `name` (null when empty).
pub(crate) fn positions_abi<'l>(
    launch: &mut Launch<'l>,
    name: &'static std::ffi::CStr,
    p: &'l TensorView<'_, i32, 1>,
    len: usize,
    max_pos: usize,
) -> Result<*const i32> {
    let label = name.to_str().unwrap_or("rope_positions");
    p.check_index_vector(label, len, || format!("(the op has {len} rows to rotate)"))?;
    if let Mem::Host(h) = &p.mem {
        if let Some((i, &x)) = h.iter().take(len).enumerate().find(|(_, &x)| x < 0 || x as usize >= max_pos) {
            return Err(Error::out_of_bounds(
                label,
                format!("position {x} of row {i} is outside the table's {max_pos} positions"),
            ));
        }
    }
    if len == 0 {
        return Ok(std::ptr::null());
    }
    Ok(launch.input(name, p, 4)? as *const i32)
}

/// RoPE on dense / varlen prefill's K ([`crate::prefill::PrefillOptions::rope_k`]; docs/rope.md): each key
/// rotated with the call's q table (the same [`Rope`]: table, rotary dims, layout) as its tile lands in
/// shared memory, at `positions` (int32, one per key token: `[B·Tk]` dense, key j of sequence b at
/// `b·Tk + j`; `[total_k]` varlen, at `cu_seqlens_k[b] + j`) or, with `None`, at its index j in its sequence
/// (keys at 0..Tk, queries at their bottom-right positions: the causal mask's alignment).
#[derive(Clone, Copy, Default)]
pub struct RopeKeys<'a> {
    pub positions: Option<&'a TensorView<'a, i32, 1>>,
}

impl std::fmt::Debug for RopeKeys<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RopeKeys").field("positions", &self.positions.map(|p| p.shape())).finish()
    }
}

/// The table row the kernels use for position `pos` (clamped into `[0, max_pos)`, fa/rope.cuh). A table of
/// no rows has none: `Shape`, naming `max_pos`.
pub fn table_row(pos: i64, max_pos: usize) -> Result<usize> {
    if max_pos == 0 {
        return Err(Error::shape("max_pos", "0: a table of no positions has no row"));
    }
    Ok(clamp_row(pos, max_pos))
}

/// [`table_row`] for a table known to have rows (0 for none).
pub(crate) fn clamp_row(pos: i64, max_pos: usize) -> usize {
    let last = i64::try_from(max_pos).unwrap_or(i64::MAX).saturating_sub(1).max(0);
    pos.clamp(0, last) as usize
}

/// The kernels' rotation of one head row `x` (fp32, in place) by the table entries `cos_sin(i)` of its
/// position: bit for bit what fa/rope.cuh computes (`fmaf(a, c, −(b·s))`, `fmaf(b, c, a·s)`).
pub fn rotate_row_f32(x: &mut [f32], rotary_dim: usize, style: RopeStyle, cos_sin: impl Fn(usize) -> (f32, f32)) {
    rotate_row(
        x,
        rotary_dim,
        style,
        cos_sin,
        |a, c, y, s, first| {
            if first {
                a.mul_add(c, -(y * s))
            } else {
                a.mul_add(c, y * s)
            }
        },
    );
}

/// The fp64 rotation of one head row (the reference's): the same pairs and table entries, exact arithmetic.
pub fn rotate_row_f64(x: &mut [f64], rotary_dim: usize, style: RopeStyle, cos_sin: impl Fn(usize) -> (f64, f64)) {
    rotate_row(x, rotary_dim, style, cos_sin, |a, c, y, s, first| if first { a * c - y * s } else { a * c + y * s });
}

/// Element `j` of the rotated row is `rotate(x_j, cos, x_partner, sin, first of its pair)`.
fn rotate_row<F: Copy>(
    x: &mut [F],
    rotary_dim: usize,
    style: RopeStyle,
    cos_sin: impl Fn(usize) -> (F, F),
    rotate: impl Fn(F, F, F, F, bool) -> F,
) {
    let src = x[..rotary_dim].to_vec();
    for (j, out) in x.iter_mut().enumerate().take(rotary_dim) {
        let (i, partner, first) = style.pair(j, rotary_dim);
        let (c, s) = cos_sin(i);
        *out = rotate(src[j], c, src[partner], s, first);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_frequencies_and_table() {
        let cfg = RopeConfig::new(10000.0, 8, RopeStyle::Neox);
        let f = cfg.inv_freq();
        assert_eq!(f.len(), 4);
        assert_eq!(f[0], 1.0);
        assert!((f[1] - 0.1).abs() < 1e-15 && (f[2] - 0.01).abs() < 1e-16 && (f[3] - 0.001).abs() < 1e-17);
        let t = cfg.table(3).unwrap();
        assert_eq!(t.at(0, 2), (1.0, 0.0));
        assert_eq!(t.at(2, 0), ((2.0f64).cos() as f32, (2.0f64).sin() as f32));
    }

    #[test]
    fn scaled_frequencies() {
        let base = RopeConfig::new(500000.0, 128, RopeStyle::Neox);
        let f0 = base.inv_freq();
        let lin = RopeConfig { scaling: RopeScaling::Linear { factor: 4.0 }, ..base }.inv_freq();
        assert!(lin.iter().zip(&f0).all(|(a, b)| (a * 4.0 - b).abs() <= 1e-15 * b));
        // NTK: the first frequency stays 1, the last is θ'^(-(d-2)/d) = θ^(-(d-2)/d) / factor.
        let ntk = RopeConfig { scaling: RopeScaling::Ntk { factor: 8.0 }, ..base }.inv_freq();
        assert_eq!(ntk[0], 1.0);
        assert!((ntk[63] * 8.0 / f0[63] - 1.0).abs() < 1e-12);
        // Llama 3: high frequencies kept, low ones divided by the factor, the band between in between.
        let l3 = RopeConfig { scaling: RopeScaling::llama31(), ..base }.inv_freq();
        assert_eq!(l3[0], f0[0]);
        assert!((l3[63] * 8.0 / f0[63] - 1.0).abs() < 1e-12);
        let mid: Vec<usize> =
            (0..64).filter(|&i| l3[i] != f0[i] && (l3[i] * 8.0 / f0[i] - 1.0).abs() > 1e-12).collect();
        assert!(!mid.is_empty());
        assert!(mid.iter().all(|&i| l3[i] < f0[i] && l3[i] > f0[i] / 8.0));
        // YaRN: extrapolated (kept) at high frequencies, interpolated (÷ factor) at low ones.
        let y = RopeConfig { scaling: RopeScaling::yarn(4.0, 4096), theta: 10000.0, ..base };
        let (fy, f1) = (y.inv_freq(), RopeConfig { theta: 10000.0, ..base }.inv_freq());
        assert_eq!(fy[0], f1[0]);
        assert!((fy[63] * 4.0 / f1[63] - 1.0).abs() < 1e-12);
        assert!((y.attention_factor() - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-15);
        assert_eq!(base.attention_factor(), 1.0);
        let t = y.table(2).unwrap();
        assert_eq!(t.at(0, 5).0, y.attention_factor() as f32);
    }

    /// The fp32 model is the f64 rotation to within the two roundings of an fma chain (|a| + |b| times
    /// 2^-23), at every pair of a Llama-3 table's far positions.
    #[test]
    fn fp32_model_is_the_f64_rotation_rounded() {
        let cfg = RopeConfig { scaling: RopeScaling::llama31(), ..RopeConfig::new(500000.0, 64, RopeStyle::Neox) };
        let t = cfg.table(1 << 17).unwrap();
        for style in [RopeStyle::Neox, RopeStyle::Gptj] {
            for p in [0usize, 1, 4095, 131071] {
                let x: Vec<f32> = (0..80).map(|j| ((j * 37 % 19) as f32 - 9.0) / 4.0).collect();
                let (mut a, mut b) = (x.clone(), x.iter().map(|&v| f64::from(v)).collect::<Vec<f64>>());
                rotate_row_f32(&mut a, 64, style, |i| t.at(p, i));
                rotate_row_f64(&mut b, 64, style, |i| {
                    let (c, s) = t.at(p, i);
                    (f64::from(c), f64::from(s))
                });
                for j in 0..80 {
                    let (_, partner, _) = if j < 64 { style.pair(j, 64) } else { (0, j, true) };
                    let bound = f64::from(x[j].abs() + x[partner].abs()) * 2f64.powi(-23);
                    assert!((f64::from(a[j]) - b[j]).abs() <= bound, "{style:?} p {p} j {j}: {} vs {}", a[j], b[j]);
                }
                assert_eq!(a[64..], x[64..]);
            }
        }
    }

    #[test]
    fn rotations_pair_the_layouts() {
        assert_eq!(RopeStyle::Neox.pair(1, 8), (1, 5, true));
        assert_eq!(RopeStyle::Neox.pair(5, 8), (1, 1, false));
        assert_eq!(RopeStyle::Gptj.pair(5, 8), (2, 4, false));
        // A quarter turn of pair 0 maps (1, 0) to (0, 1); dims past rotary_dim pass through.
        let mut x = [1.0f32, 0.0, 0.0, 0.0, 7.0];
        rotate_row_f32(&mut x, 4, RopeStyle::Gptj, |_| (0.0, 1.0));
        assert_eq!(x, [0.0, 1.0, 0.0, 0.0, 7.0]);
        let mut x = [1.0f32, 0.0, 0.0, 0.0, 7.0];
        rotate_row_f32(&mut x, 4, RopeStyle::Neox, |_| (0.0, 1.0));
        assert_eq!(x, [0.0, 0.0, 1.0, 0.0, 7.0]);
        assert!(RopeConfig::new(10000.0, 7, RopeStyle::Neox).check().is_err());
    }
}
