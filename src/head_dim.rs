//! Which head dims each op takes, and which instantiated tile width serves each (kernels/include/fa/
//! head_dim.cuh says why the widths are what they are). The range of each op is abi.h's `FA_MIN_HEAD_DIM` ..
//! `FA_<OP>_MAX_HEAD_DIM` and the widths are the launchers' own answer ([`crate::tile::tile_policy`]):
//! nothing here restates the kernels' policy.
//!
//! Every op accepts every head dim that is a multiple of 8 from 32 to its own maximum ([`max_head_dim`]):
//! 512 for decode, 256 for dense/varlen prefill and paged prefill. A kernel of width `W >= D` serves `D`
//! with predicated columns: the columns past `D` are zero-filled in shared memory, never read from global
//! memory and never stored, so the padding costs tensor-core time (counted in the testkit cost model's mma),
//! not memory traffic.

use crate::error::{Error, Result};
use crate::sys;
use crate::tile::{tile_policy, KernelOp};

/// Smallest supported head dim (every op).
pub const MIN_HEAD_DIM: usize = sys::FA_MIN_HEAD_DIM as usize;
/// Largest head dim any op takes (decode's; [`max_head_dim`] gives each op's).
pub const MAX_HEAD_DIM: usize = sys::FA_MAX_HEAD_DIM as usize;
/// Supported head dims are the multiples of this.
pub const HEAD_DIM_STEP: usize = sys::FA_HEAD_DIM_STEP as usize;

/// Largest head dim of dense and varlen prefill.
pub const PREFILL_MAX_HEAD_DIM: usize = sys::FA_PREFILL_MAX_HEAD_DIM as usize;
/// Largest head dim of the tiled (sm_80) prefill kernel; wider ones run on the decode kernel's streaming path.
pub const PREFILL_TILED_MAX_HEAD_DIM: usize = sys::FA_PREFILL_TILED_MAX_HEAD_DIM as usize;
/// Largest head dim of paged prefill.
pub const PAGED_PREFILL_MAX_HEAD_DIM: usize = sys::FA_PAGED_PREFILL_MAX_HEAD_DIM as usize;
/// Largest head dim of the tiled paged prefill kernel; wider ones run on the streaming (decode) kernel.
pub const PAGED_PREFILL_TILED_MAX_HEAD_DIM: usize = sys::FA_PAGED_PREFILL_TILED_MAX_HEAD_DIM as usize;
/// Largest head dim of decode.
pub const DECODE_MAX_HEAD_DIM: usize = sys::FA_DECODE_MAX_HEAD_DIM as usize;

/// The multiples of [`HEAD_DIM_STEP`] from [`MIN_HEAD_DIM`] to `MAX`, as an array of `N` (`N` must be their
/// count: a compile-time error otherwise).
pub const fn dims_up_to<const N: usize, const MAX: usize>() -> [usize; N] {
    assert!(N == (MAX - MIN_HEAD_DIM) / HEAD_DIM_STEP + 1, "N is the count of dims up to MAX");
    let mut dims = [0; N];
    let mut i = 0;
    while i < N {
        dims[i] = MIN_HEAD_DIM + HEAD_DIM_STEP * i;
        i += 1;
    }
    dims
}

const fn count(max: usize) -> usize {
    (max - MIN_HEAD_DIM) / HEAD_DIM_STEP + 1
}

/// Every head dim some op takes: the multiples of [`HEAD_DIM_STEP`] from [`MIN_HEAD_DIM`] to [`MAX_HEAD_DIM`].
/// Each op takes a prefix of them ([`head_dims`]).
pub const HEAD_DIMS: [usize; count(MAX_HEAD_DIM)] = dims_up_to::<{ count(MAX_HEAD_DIM) }, MAX_HEAD_DIM>();
/// The head dims of dense and varlen prefill (32 ..= 512; the tiled kernel's up to 256).
pub const PREFILL_HEAD_DIMS: [usize; count(PREFILL_MAX_HEAD_DIM)] =
    dims_up_to::<{ count(PREFILL_MAX_HEAD_DIM) }, PREFILL_MAX_HEAD_DIM>();
/// The head dims of paged prefill (32 ..= 512; the tiled kernel's up to 256).
pub const PAGED_PREFILL_HEAD_DIMS: [usize; count(PAGED_PREFILL_MAX_HEAD_DIM)] =
    dims_up_to::<{ count(PAGED_PREFILL_MAX_HEAD_DIM) }, PAGED_PREFILL_MAX_HEAD_DIM>();
/// The head dims of decode (32 ..= 512).
pub const DECODE_HEAD_DIMS: [usize; count(DECODE_MAX_HEAD_DIM)] =
    dims_up_to::<{ count(DECODE_MAX_HEAD_DIM) }, DECODE_MAX_HEAD_DIM>();

/// The largest head dim `op` takes (the sm_90a prefill kernel: 256, of its own three dims).
pub fn max_head_dim(op: KernelOp) -> usize {
    match op {
        KernelOp::Prefill => PREFILL_MAX_HEAD_DIM,
        KernelOp::PrefillSm90 => PREFILL_TILED_MAX_HEAD_DIM,
        KernelOp::PagedPrefill => PAGED_PREFILL_MAX_HEAD_DIM,
        KernelOp::Decode => DECODE_MAX_HEAD_DIM,
    }
}

/// The head dims `op` takes, smallest first (the sm_90a prefill kernel: those it has a tile for).
pub fn head_dims(op: KernelOp) -> Vec<usize> {
    HEAD_DIMS.into_iter().filter(|&d| supported(op, d)).collect()
}

/// Whether `op` takes head dim `d`: whether its launcher has a kernel for it (asked of the launcher), or,
/// for prefill and paged prefill past their tiled kernels, the decode kernel's streaming path does.
pub fn supported(op: KernelOp, d: usize) -> bool {
    let streaming = matches!(op, KernelOp::Prefill | KernelOp::PagedPrefill) && d <= max_head_dim(op);
    tile_policy(op, d, false, None).is_some() || (streaming && tile_policy(KernelOp::Decode, d, false, None).is_some())
}

/// The dense/varlen prefill kernel width serving `d`, or `None` if unsupported (or served by the decode
/// kernel: [`decode_width`]).
pub fn prefill_width(d: usize) -> Option<usize> {
    tile_policy(KernelOp::Prefill, d, false, None).map(|p| p.width)
}

/// The tiled paged prefill kernel width serving `d`, or `None` if unsupported (or served by the streaming
/// kernel only: [`decode_width`]).
pub fn paged_prefill_width(d: usize) -> Option<usize> {
    tile_policy(KernelOp::PagedPrefill, d, false, None).map(|p| p.width)
}

/// The decode kernel width serving `d`, or `None` if unsupported.
pub fn decode_width(d: usize) -> Option<usize> {
    tile_policy(KernelOp::Decode, d, false, None).map(|p| p.width)
}

/// "multiples of 8 from 32 to 512" (decode), for error messages: the head dims `op` takes.
pub fn describe(op: KernelOp) -> String {
    format!("multiples of {HEAD_DIM_STEP} from {MIN_HEAD_DIM} to {}", max_head_dim(op))
}

/// `Ok` when `op` takes head dim `head_dim`, else the one error every op gives for it: `Unsupported`,
/// naming `q` and the op's own range.
pub(crate) fn check(op: KernelOp, head_dim: usize) -> Result<()> {
    if supported(op, head_dim) {
        return Ok(());
    }
    let name = match op {
        KernelOp::Prefill | KernelOp::PrefillSm90 => "prefill",
        KernelOp::PagedPrefill => "paged prefill",
        KernelOp::Decode => "decode",
    };
    Err(Error::unsupported("q", format!("head dim {head_dim} ({name} supports {})", describe(op))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_op_takes_its_own_range() {
        assert_eq!((HEAD_DIMS.len(), HEAD_DIMS[0], HEAD_DIMS[60]), (61, 32, 512));
        assert_eq!(PREFILL_HEAD_DIMS, HEAD_DIMS);
        assert_eq!(PAGED_PREFILL_HEAD_DIMS, PREFILL_HEAD_DIMS);
        assert_eq!(DECODE_HEAD_DIMS, HEAD_DIMS);
        assert_eq!((PREFILL_TILED_MAX_HEAD_DIM, PAGED_PREFILL_TILED_MAX_HEAD_DIM), (256, 256));
        for (op, dims) in [
            (KernelOp::Prefill, &PREFILL_HEAD_DIMS[..]),
            (KernelOp::PagedPrefill, &PAGED_PREFILL_HEAD_DIMS[..]),
            (KernelOp::Decode, &DECODE_HEAD_DIMS[..]),
        ] {
            assert_eq!(head_dims(op), dims, "{op:?}");
            for d in 0..600 {
                assert_eq!(supported(op, d), dims.contains(&d), "{op:?} {d}");
            }
        }
        assert_eq!(head_dims(KernelOp::PrefillSm90), [64, 128, 256]);
        assert_eq!(describe(KernelOp::Decode), "multiples of 8 from 32 to 512");
        assert_eq!(describe(KernelOp::PagedPrefill), "multiples of 8 from 32 to 512");
        assert_eq!(describe(KernelOp::PrefillSm90), "multiples of 8 from 32 to 256");
    }

    #[test]
    fn widths_cover_every_dim_with_the_documented_padding() {
        for d in 0..600 {
            let tiled = d <= PREFILL_TILED_MAX_HEAD_DIM;
            assert_eq!(prefill_width(d).is_some(), tiled && PREFILL_HEAD_DIMS.contains(&d));
            assert_eq!(decode_width(d).is_some(), DECODE_HEAD_DIMS.contains(&d));
            assert_eq!(paged_prefill_width(d).is_some(), tiled && PAGED_PREFILL_HEAD_DIMS.contains(&d));
        }
        for d in PREFILL_HEAD_DIMS.into_iter().filter(|&d| d <= PREFILL_TILED_MAX_HEAD_DIM) {
            let p = prefill_width(d).unwrap();
            assert!([32, 64, 96, 128, 160, 192, 256].contains(&p) && p >= d, "{d} -> {p}");
            assert!(p - d < if p >= 160 { 64 } else { 32 }, "{d} -> {p}");
            assert!(p != 128 || d == 128, "the 128 kernels serve only 128");
            let pp = paged_prefill_width(d).unwrap();
            assert!([64, 96, 128, 256].contains(&pp) && pp >= d, "{d} -> {pp}");
        }
        for d in DECODE_HEAD_DIMS {
            let w = decode_width(d).unwrap();
            assert!([64, 128, 256, 512].contains(&w) && w >= d && w <= 2 * d, "{d} -> {w}");
        }
        assert_eq!(
            [80, 96, 104, 112, 120, 128, 136, 160, 200].map(|d| prefill_width(d).unwrap()),
            [96, 96, 160, 160, 160, 128, 160, 160, 256]
        );
        assert_eq!(
            [40, 72, 136, 256, 264, 384, 512].map(|d| decode_width(d).unwrap()),
            [64, 128, 256, 256, 512, 512, 512]
        );
    }
}
