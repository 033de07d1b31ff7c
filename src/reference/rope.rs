//! RoPE in the reference: rows rotated from the same fp32 cos/sin table the kernels read (the table's
//! values, widened), at the same positions (clamped into the table as the kernels clamp). The fp64
//! reference rotates exactly; the naive low-precision twin rotates as a separate rotary kernel would: in
//! fp32 (the kernels' own formula, [`rotate_row_f32`]) and rounded to the input dtype.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::rope::{rotate_row_f32, rotate_row_f64, Rope, RopeStyle, RopeTable};

/// A host copy of the table columns an op reads, and how it rotates.
#[derive(Clone, Debug)]
pub struct RopeRef {
    /// `[max_pos, rotary_dim / 2]` row-major.
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
    pub max_pos: usize,
    pub rotary_dim: usize,
    pub style: RopeStyle,
}

impl RopeRef {
    /// From an op's [`Rope`] (host views; only the columns below rotary_dim / 2 are read).
    pub fn from_view(rope: &Rope<'_>) -> Result<Self> {
        let half = rope.rotary_dim / 2;
        let read = |name: &str, v: &crate::TensorView<'_, f32, 2>| -> Result<Vec<f32>> {
            let [rows, cols] = v.shape();
            if cols < half {
                return Err(Error::shape(name, format!("{cols} columns < rotary_dim / 2 = {half}")));
            }
            let all = super::check::host_elements(name, v)?;
            Ok((0..rows).flat_map(|r| all[r * cols..][..half].to_vec()).collect())
        };
        Ok(Self {
            cos: read("rope_cos", rope.cos)?,
            sin: read("rope_sin", rope.sin)?,
            max_pos: rope.cos.dim(0),
            rotary_dim: rope.rotary_dim,
            style: rope.style,
        })
    }

    /// From a host table built by [`crate::RopeConfig::table`].
    pub fn from_table(t: &RopeTable, rotary_dim: usize, style: RopeStyle) -> Self {
        let half = rotary_dim / 2;
        let take = |x: &[f32]| (0..t.max_pos).flat_map(|p| x[p * t.half..][..half].to_vec()).collect();
        Self { cos: take(&t.cos), sin: take(&t.sin), max_pos: t.max_pos, rotary_dim, style }
    }

    /// (cos, sin) of pair `i` at position `pos` (clamped into the table).
    pub fn cos_sin(&self, pos: i64, i: usize) -> (f32, f32) {
        let at = crate::rope::clamp_row(pos, self.max_pos) * (self.rotary_dim / 2) + i;
        (self.cos[at], self.sin[at])
    }

    /// Rotates the rows of `x` (`head_dim` each) in f64: row r at `positions[r / rows_per_position]`.
    pub fn rotate_f64(&self, x: &mut [f64], head_dim: usize, rows_per_position: usize, positions: &[i64]) {
        for (r, row) in x.chunks_mut(head_dim).enumerate() {
            let pos = positions[r / rows_per_position];
            rotate_row_f64(row, self.rotary_dim, self.style, |i| {
                let (c, s) = self.cos_sin(pos, i);
                (f64::from(c), f64::from(s))
            });
        }
    }

    /// The naive twin: each row (values of `dtype`) rotated in fp32 as the kernels do, then rounded to
    /// `dtype` (what a separate rotary kernel writes).
    pub fn rotate_lowp(
        &self,
        x: &mut [f64],
        head_dim: usize,
        rows_per_position: usize,
        positions: &[i64],
        dtype: DType,
    ) {
        for (r, row) in x.chunks_mut(head_dim).enumerate() {
            let pos = positions[r / rows_per_position];
            let mut f: Vec<f32> = row.iter().map(|&v| v as f32).collect();
            rotate_row_f32(&mut f, self.rotary_dim, self.style, |i| self.cos_sin(pos, i));
            for (o, &v) in row.iter_mut().zip(&f) {
                *o = dtype.round(f64::from(v));
            }
        }
    }
}
