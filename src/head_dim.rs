//! Which head dims the kernels take, and which instantiated tile width serves each: the host mirror of
//! kernels/include/fa/head_dim.cuh (which says why the widths are what they are); keep both in step.
//!
//! Every op (prefill, varlen prefill, decode) accepts every head dim that is a multiple of 8 from 32 to 256.
//! A kernel of width `W >= D` serves `D` with predicated columns: the columns past `D` are zero-filled in
//! shared memory, never read from global memory and never stored, so the padding costs tensor-core time
//! (counted in the testkit cost model's mma), not memory traffic.

/// Smallest supported head dim.
pub const MIN_HEAD_DIM: usize = 32;
/// Largest supported head dim.
pub const MAX_HEAD_DIM: usize = 256;

/// Every supported head dim: the multiples of 8 from [`MIN_HEAD_DIM`] to [`MAX_HEAD_DIM`].
pub const HEAD_DIMS: [usize; 29] = {
    let mut dims = [0; 29];
    let mut i = 0;
    while i < dims.len() {
        dims[i] = MIN_HEAD_DIM + 8 * i;
        i += 1;
    }
    dims
};

/// Whether the kernels take head dim `d`.
pub fn supported(d: usize) -> bool {
    (MIN_HEAD_DIM..=MAX_HEAD_DIM).contains(&d) && d % 8 == 0
}

/// The prefill kernel width serving `d` (`prefill_width` in head_dim.cuh), or `None` if unsupported.
pub fn prefill_width(d: usize) -> Option<usize> {
    supported(d).then(|| match d {
        193.. => 256,
        97..=127 => 160, // the 128 kernels have no predicated columns (tile_config.cuh: kPredicatedColumns)
        _ => d.div_ceil(32) * 32,
    })
}

/// The decode kernel width serving `d` (`decode_width` in head_dim.cuh), or `None` if unsupported.
pub fn decode_width(d: usize) -> Option<usize> {
    let width = match d {
        0..=64 => 64,
        65..=128 => 128,
        _ => 256,
    };
    supported(d).then_some(width)
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
        assert_eq!((HEAD_DIMS[0], HEAD_DIMS[28]), (32, 256));
        for d in 0..300 {
            assert_eq!(supported(d), HEAD_DIMS.contains(&d), "{d}");
            assert_eq!(prefill_width(d).is_some(), supported(d));
            assert_eq!(decode_width(d).is_some(), supported(d));
        }
        for d in HEAD_DIMS {
            let (p, w) = (prefill_width(d).unwrap(), decode_width(d).unwrap());
            assert!([32, 64, 96, 128, 160, 192, 256].contains(&p) && p >= d, "{d} -> {p}");
            assert!(p - d < if p >= 160 { 64 } else { 32 }, "{d} -> {p}");
            assert!(p != 128 || d == 128, "the 128 kernels serve only 128");
            assert!([64, 128, 256].contains(&w) && w >= d, "{d} -> {w}");
        }
        assert_eq!(
            [80, 96, 104, 112, 120, 128, 136, 160, 200].map(|d| prefill_width(d).unwrap()),
            [96, 96, 160, 160, 160, 128, 160, 160, 256]
        );
        assert_eq!([40, 72, 136].map(|d| decode_width(d).unwrap()), [64, 128, 256]);
    }
}
