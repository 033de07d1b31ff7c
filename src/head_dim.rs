//! Which head dims the kernels take, and which instantiated tile width serves each (kernels/include/fa/
//! head_dim.cuh says why the widths are what they are). The range is abi.h's `FA_MIN_HEAD_DIM` ..
//! `FA_MAX_HEAD_DIM` and the widths are the launchers' own answer ([`crate::tile::tile_policy`]): nothing
//! here restates the kernels' policy.
//!
//! Every op (prefill, varlen prefill, paged prefill, decode) accepts every head dim that is a multiple of 8
//! from 32 to 256. A kernel of width `W >= D` serves `D` with predicated columns: the columns past `D` are
//! zero-filled in shared memory, never read from global memory and never stored, so the padding costs
//! tensor-core time (counted in the testkit cost model's mma), not memory traffic.

use crate::sys;
use crate::tile::{tile_policy, KernelOp};

/// Smallest supported head dim.
pub const MIN_HEAD_DIM: usize = sys::FA_MIN_HEAD_DIM as usize;
/// Largest supported head dim.
pub const MAX_HEAD_DIM: usize = sys::FA_MAX_HEAD_DIM as usize;
/// Supported head dims are the multiples of this.
pub const HEAD_DIM_STEP: usize = sys::FA_HEAD_DIM_STEP as usize;

/// Every supported head dim: the multiples of [`HEAD_DIM_STEP`] from [`MIN_HEAD_DIM`] to [`MAX_HEAD_DIM`].
pub const HEAD_DIMS: [usize; (MAX_HEAD_DIM - MIN_HEAD_DIM) / HEAD_DIM_STEP + 1] = {
    let mut dims = [0; (MAX_HEAD_DIM - MIN_HEAD_DIM) / HEAD_DIM_STEP + 1];
    let mut i = 0;
    while i < dims.len() {
        dims[i] = MIN_HEAD_DIM + HEAD_DIM_STEP * i;
        i += 1;
    }
    dims
};

/// Whether the kernels take head dim `d`.
pub fn supported(d: usize) -> bool {
    (MIN_HEAD_DIM..=MAX_HEAD_DIM).contains(&d) && d % HEAD_DIM_STEP == 0
}

/// The dense/varlen prefill kernel width serving `d`, or `None` if unsupported.
pub fn prefill_width(d: usize) -> Option<usize> {
    tile_policy(KernelOp::Prefill, d, false, None).map(|p| p.width)
}

/// The paged prefill kernel width serving `d`, or `None` if unsupported.
pub fn paged_prefill_width(d: usize) -> Option<usize> {
    tile_policy(KernelOp::PagedPrefill, d, false, None).map(|p| p.width)
}

/// The decode kernel width serving `d`, or `None` if unsupported.
pub fn decode_width(d: usize) -> Option<usize> {
    tile_policy(KernelOp::Decode, d, false, None).map(|p| p.width)
}

/// "multiples of 8 from 32 to 256", for error messages.
pub fn describe() -> String {
    format!("multiples of 8 from {MIN_HEAD_DIM} to {MAX_HEAD_DIM}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widths_cover_every_dim_with_the_documented_padding() {
        assert_eq!((HEAD_DIMS.len(), HEAD_DIMS[0], HEAD_DIMS[28]), (29, 32, 256));
        for d in 0..300 {
            assert_eq!(supported(d), HEAD_DIMS.contains(&d), "{d}");
            assert_eq!(prefill_width(d).is_some(), supported(d));
            assert_eq!(decode_width(d).is_some(), supported(d));
            assert_eq!(paged_prefill_width(d).is_some(), supported(d));
        }
        for d in HEAD_DIMS {
            let (p, w) = (prefill_width(d).unwrap(), decode_width(d).unwrap());
            assert!([32, 64, 96, 128, 160, 192, 256].contains(&p) && p >= d, "{d} -> {p}");
            assert!(p - d < if p >= 160 { 64 } else { 32 }, "{d} -> {p}");
            assert!(p != 128 || d == 128, "the 128 kernels serve only 128");
            assert!([64, 128, 256].contains(&w) && w >= d, "{d} -> {w}");
            let pp = paged_prefill_width(d).unwrap();
            assert!([64, 96, 128, 256].contains(&pp) && pp >= d, "{d} -> {pp}");
        }
        assert_eq!(
            [80, 96, 104, 112, 120, 128, 136, 160, 200].map(|d| prefill_width(d).unwrap()),
            [96, 96, 160, 160, 160, 128, 160, 160, 256]
        );
        assert_eq!([40, 72, 136].map(|d| decode_width(d).unwrap()), [64, 128, 256]);
    }
}
