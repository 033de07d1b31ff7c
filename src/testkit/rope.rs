//! RoPE test data: a cos/sin table poisoned everywhere the op must not read it.

use crate::error::Result;
use crate::reference::RopeRef;
use crate::rope::{RopeConfig, RopeStyle};
use crate::tensor::TensorView;

/// A cos/sin table as the kernels take it, `[max_pos, rotary_dim/2 + 3]`: the 3 columns past rotary_dim/2
/// are NaN, and so is every row no position in `used` addresses (a position is clamped into the table as
/// the kernels clamp it). A kernel reading a row or column it should not gives NaN.
#[derive(Debug, Clone, PartialEq)]
pub struct PoisonedTable {
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
    pub max_pos: usize,
    pub cols: usize,
    pub half: usize,
}

impl PoisonedTable {
    pub fn new(cfg: &RopeConfig, max_pos: usize, used: &[i64]) -> Result<Self> {
        let t = cfg.table(max_pos)?;
        let cols = t.half + 3;
        let (mut cos, mut sin) = (vec![f32::NAN; max_pos * cols], vec![f32::NAN; max_pos * cols]);
        for &p in used {
            let p = crate::rope::table_row(p, max_pos)?;
            cos[p * cols..][..t.half].copy_from_slice(&t.cos[p * t.half..][..t.half]);
            sin[p * cols..][..t.half].copy_from_slice(&t.sin[p * t.half..][..t.half]);
        }
        Ok(Self { cos, sin, max_pos, cols, half: t.half })
    }

    /// `[max_pos, cols]`.
    pub fn shape(&self) -> [usize; 2] {
        [self.max_pos, self.cols]
    }

    /// Host views of the cos and sin tables, `[max_pos, cols]` each (what an emulated op takes).
    pub fn views(&self) -> Result<(TensorView<'_, f32, 2>, TensorView<'_, f32, 2>)> {
        Ok((TensorView::host(&self.cos, self.shape())?, TensorView::host(&self.sin, self.shape())?))
    }

    /// The reference's copy of the columns the ops read.
    pub fn reference(&self, rotary_dim: usize, style: RopeStyle) -> RopeRef {
        let take = |x: &[f32]| (0..self.max_pos).flat_map(|p| x[p * self.cols..][..self.half].to_vec()).collect();
        RopeRef { cos: take(&self.cos), sin: take(&self.sin), max_pos: self.max_pos, rotary_dim, style }
    }
}
