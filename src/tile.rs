//! Which kernel serves a class of calls and how it is launched, asked of the launchers rather than restated
//! here: `fa_tile_policy` (kernels/include/fa/abi.h) reads the same kernel traits each launcher dispatches
//! on (fa/prefill/tile_config.cuh, fa/decode/traits.cuh, paged_prefill.cu, fa/hopper/traits.cuh), so the
//! grids, workspaces, schedules and cost models computed on this side cannot drift from the kernels.
//! `tests/it/tile_policy.rs` runs every (op, dtype, head dim, variant, cache format) the launchers accept
//! and checks that the kernel they launch has exactly this shape.

use crate::dtype::Fp8Format;
use crate::sys;

/// The ops whose kernels are tiled over a head dim (merge and append have one shape for every call).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelOp {
    /// Dense and varlen prefill, the sm_80 kernel; `variant`: the score-variant (`_mod`) kernel.
    Prefill,
    /// The sm_90a prefill kernel; `variant`: a masked call (causal or windowed), whose D 128 tile is
    /// 128 × 128 (unmasked: FA3's 128 × 176).
    PrefillSm90,
    /// Paged prefill; `variant`: the `_mod` kernel (the shape is the same as the plain one's).
    PagedPrefill,
    /// Paged decode; `variant`: the `_mod` kernel (the same shape).
    Decode,
}

/// A kernel's tile and launch shape (`FaTilePolicy` in abi.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TilePolicy {
    /// The instantiated head-dim width serving the call (>= the head dim; the columns past it are
    /// zero-filled in shared memory, never read from or written to global memory).
    pub width: usize,
    /// Rows per CTA: query rows (prefill), packed query rows (paged prefill: token · G + head), query heads
    /// (decode).
    pub block_m: usize,
    /// Keys per KV tile.
    pub block_n: usize,
    /// K/V tiles in flight (shared-memory buffers).
    pub stages: usize,
    /// Threads per CTA.
    pub threads: usize,
    /// Dynamic shared memory per CTA.
    pub smem_bytes: usize,
    /// The CTAs per SM the kernel's launch bounds are built for (its register budget).
    pub min_ctas_per_sm: usize,
    /// Prefill's register-lean KV loop (the K/V bases and row sums parked in shared memory).
    pub lean: bool,
    /// Decode: the warps that sum one S tile, each computing Q·Kᵀ over `width / score_splits` columns
    /// (1 up to width 256; 4 at 512, kernels/include/fa/decode/traits.cuh); 0 for the other ops.
    pub score_splits: usize,
    /// Decode: the most packed rows a CTA of `threads` threads serves; a launch of more rows per CTA (up to
    /// `block_m`) runs wide CTAs of twice the threads (8 warps, the same shared memory;
    /// kernels/include/fa/decode/traits.cuh). 0 for the other ops.
    pub narrow_rows: usize,
}

impl TilePolicy {
    /// Warps per CTA.
    pub fn warps(&self) -> usize {
        self.threads / 32
    }
    /// Decode: whether a launch of `rows_per_cta` packed rows per CTA runs wide CTAs.
    pub fn is_wide(&self, rows_per_cta: usize) -> bool {
        self.narrow_rows > 0 && rows_per_cta > self.narrow_rows
    }
    /// Decode: threads per CTA of a launch of `rows_per_cta` packed rows per CTA.
    pub fn threads_for(&self, rows_per_cta: usize) -> usize {
        if self.is_wide(rows_per_cta) {
            2 * self.threads
        } else {
            self.threads
        }
    }
    /// CTAs of a launch of `rows_per_cta` packed rows per CTA that the register budget lets an SM hold: the
    /// register cap is built for `min_ctas_per_sm` CTAs of `threads`, so a wide decode CTA (twice the
    /// threads, the same cap) takes twice a narrow one's share: 1 where 3 narrow ones fit.
    pub fn ctas_per_sm_by_registers(&self, rows_per_cta: usize) -> usize {
        (self.min_ctas_per_sm * self.threads / self.threads_for(rows_per_cta)).max(1)
    }
}

/// The policy of the kernel `op` runs for `head_dim` (`variant` as [`KernelOp`] says; `fp8`: an FP8 cache,
/// paged prefill and decode only), or `None` when no kernel serves the call. fp16 and bf16 share it.
pub fn tile_policy(op: KernelOp, head_dim: usize, variant: bool, fp8: Option<Fp8Format>) -> Option<TilePolicy> {
    let op = match op {
        KernelOp::Prefill => sys::FA_OP_PREFILL,
        KernelOp::PrefillSm90 => sys::FA_OP_PREFILL_SM90,
        KernelOp::PagedPrefill => sys::FA_OP_PAGED_PREFILL,
        KernelOp::Decode => sys::FA_OP_DECODE,
    };
    let kv = fp8.map_or(sys::FA_KV_SAME as i32, Fp8Format::abi);
    let mut p = sys::FaTilePolicy::default();
    // SAFETY: a pure function of its arguments that writes only `*out` (kernels/host/tile_policy.cpp).
    let status = unsafe { sys::fa_tile_policy(op as i32, i32::try_from(head_dim).ok()?, variant as i32, kv, &mut p) };
    if status != sys::FA_OK {
        return None;
    }
    policy_from(&p)
}

/// The Rust view of a launcher's policy.
fn policy_from(p: &sys::FaTilePolicy) -> Option<TilePolicy> {
    // Sizes are never negative (a negative one would be a launcher bug: no policy rather than a wrap).
    let n = |x: i32| usize::try_from(x).ok();
    Some(TilePolicy {
        width: n(p.width)?,
        block_m: n(p.block_m)?,
        block_n: n(p.block_n)?,
        stages: n(p.stages)?,
        threads: n(p.threads)?,
        smem_bytes: n(p.smem_bytes)?,
        min_ctas_per_sm: n(p.min_ctas_per_sm)?,
        lean: p.lean != 0,
        score_splits: n(p.score_splits)?,
        narrow_rows: n(p.narrow_rows)?,
    })
}

/// The sm_80 prefill kernel's policy for Q·K head dim `head_dim` and V head dim `head_dim_v`
/// (`fa_prefill_tile_policy`: the wider one's width, or the next with predicated columns), or `None`.
pub fn prefill_tile_policy(head_dim: usize, head_dim_v: usize, variant: bool) -> Option<TilePolicy> {
    let mut p = sys::FaTilePolicy::default();
    let (d, dv) = (i32::try_from(head_dim).ok()?, i32::try_from(head_dim_v).ok()?);
    // SAFETY: a pure function of its arguments that writes only `*out` (kernels/host/tile_policy.cpp).
    let status = unsafe { sys::fa_prefill_tile_policy(d, dv, variant as i32, &mut p) };
    if status != sys::FA_OK {
        return None;
    }
    policy_from(&p)
}

/// The sm_90a prefill kernel's policy for Q·K head dim `head_dim` and V head dim `head_dim_v` (`masked`: a
/// causal or windowed call; `fa_prefill_sm90_tile_policy`): D 64, 128, 256 with Dv = D (the same as
/// [`tile_policy`]'s [`KernelOp::PrefillSm90`]) and 192 / 128; `None` for any other pair. `width` is Dqk.
pub fn prefill_sm90_tile_policy(head_dim: usize, head_dim_v: usize, masked: bool) -> Option<TilePolicy> {
    let mut p = sys::FaTilePolicy::default();
    let (d, dv) = (i32::try_from(head_dim).ok()?, i32::try_from(head_dim_v).ok()?);
    // SAFETY: a pure function of its arguments that writes only `*out` (kernels/host/tile_policy.cpp).
    let status = unsafe { sys::fa_prefill_sm90_tile_policy(d, dv, masked as i32, &mut p) };
    if status != sys::FA_OK {
        return None;
    }
    policy_from(&p)
}

/// The decode kernel's policy for `head_dim`, or, for a head dim decode does not take (whose call fails
/// with its own error), the widest kernel's: what occupancy and cost estimates made before validation use.
pub fn decode_tile_or_widest(head_dim: usize) -> Option<TilePolicy> {
    tile_policy(KernelOp::Decode, head_dim, false, None)
        .or_else(|| tile_policy(KernelOp::Decode, sys::FA_DECODE_MAX_HEAD_DIM as usize, false, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_are_the_kernels_traits() {
        let p = |op, d, variant, fp8| tile_policy(op, d, variant, fp8).unwrap();
        // prefill: fa/prefill/tile_config.cuh
        let d128 = p(KernelOp::Prefill, 128, false, None);
        assert_eq!((d128.width, d128.block_m, d128.block_n, d128.stages, d128.threads), (128, 128, 64, 2, 128));
        assert_eq!(d128.smem_bytes, 96 * 1024 + 4 * 48 + 128 * 16);
        assert!(d128.lean);
        let d128_mod = p(KernelOp::Prefill, 128, true, None);
        assert_eq!(
            (d128_mod.block_n, d128_mod.stages, d128_mod.smem_bytes, d128_mod.lean),
            (32, 3, 80 * 1024 + 4 * 48 + 128 * 16, true)
        );
        assert_eq!(p(KernelOp::Prefill, 112, false, None).width, 160);
        assert_eq!(p(KernelOp::Prefill, 200, false, None).smem_bytes, 96 * 1024);
        // decode: fa/decode/traits.cuh, 3 CTAs per SM
        let dec = p(KernelOp::Decode, 72, false, None);
        assert_eq!((dec.width, dec.block_m, dec.block_n, dec.stages, dec.threads), (128, 64, 32, 4, 128));
        assert_eq!((dec.min_ctas_per_sm, dec.narrow_rows), (3, 32));
        assert_eq!(dec, p(KernelOp::Decode, 128, true, None));
        assert_eq!([16, 32, 64].map(|r| dec.threads_for(r)), [128, 128, 256]);
        // FP8: twice the stages in the same stage area (4 more hole-slot words).
        let dec8 = p(KernelOp::Decode, 72, false, Some(Fp8Format::E4m3));
        assert_eq!((dec8.stages, dec8.smem_bytes), (8, dec.smem_bytes + 4 * 4));
        let d64 = p(KernelOp::Decode, 64, false, None);
        assert_eq!((d64.block_m, d64.narrow_rows, d64.threads_for(128)), (128, 64, 256));
        // D 512 (and 264 at that width): 16-token tiles, 2 stages, 2 CTAs per SM, < 99 KiB.
        let d512 = p(KernelOp::Decode, 264, false, None);
        assert_eq!((d512.width, d512.block_m, d512.block_n, d512.stages, d512.threads), (512, 16, 16, 2, 128));
        assert_eq!(d512.threads_for(16), 128);
        assert_eq!(p(KernelOp::Decode, 256, false, None).block_m, 16);
        assert_eq!(
            (d512.min_ctas_per_sm, d512.smem_bytes),
            (2, 16 * 1024 + 2 * 32 * 1024 + 2 * 16 * 16 + 16 * 2 * 4 + 3 * 4 + (4 * 16 + 2) * 4)
        );
        assert_eq!(d512, p(KernelOp::Decode, 512, true, None));
        let d512_8 = p(KernelOp::Decode, 512, false, Some(Fp8Format::E5m2));
        assert_eq!((d512_8.stages, d512_8.smem_bytes), (4, d512.smem_bytes + 2 * 4));
        assert_eq!((d512.score_splits, dec.score_splits, d128.score_splits), (4, 1, 0));
        // paged prefill: no 32 or 160/192 widths; FP8 stages its tiles in more shared memory
        assert_eq!(p(KernelOp::PagedPrefill, 40, false, None).width, 64);
        assert_eq!(p(KernelOp::PagedPrefill, 136, false, None).width, 256);
        assert_eq!(p(KernelOp::PagedPrefill, 96, false, None).block_m, 64);
        let (plain, fp8) =
            (p(KernelOp::PagedPrefill, 128, true, None), p(KernelOp::PagedPrefill, 128, true, Some(Fp8Format::E5m2)));
        assert_eq!((plain.block_m, plain.block_n), (fp8.block_m, fp8.block_n));
        assert_ne!(plain.smem_bytes, fp8.smem_bytes);
        // sm_90a: FA3's tiles
        let t = |d, masked| tile_policy(KernelOp::PrefillSm90, d, masked, None).map(|p| (p.block_m, p.block_n));
        assert_eq!(
            [t(64, true), t(128, true), t(128, false), t(256, false)].map(Option::unwrap),
            [(192, 128), (128, 128), (128, 176), (128, 64)]
        );
        assert_eq!(t(96, false), None);
        // A V head dim of its own: 192 / 128 alone, 128 x 128 (FA3's), 2 stages of K 192 + V 128 columns.
        for masked in [false, true] {
            let dv = prefill_sm90_tile_policy(192, 128, masked).unwrap();
            assert_eq!((dv.width, dv.block_m, dv.block_n, dv.stages, dv.threads), (192, 128, 128, 2, 384));
            assert_eq!(dv.smem_bytes, (48 + 2 * (48 + 32)) * 1024 + 8 * (2 + 4 * 2));
            for d in [64, 128, 256] {
                assert_eq!(prefill_sm90_tile_policy(d, d, masked), tile_policy(KernelOp::PrefillSm90, d, masked, None));
            }
            for (d, dv) in [(192, 192), (128, 64), (256, 128), (192, 64), (128, 192), (192, 0)] {
                assert_eq!(prefill_sm90_tile_policy(d, dv, masked), None, "{d}/{dv}");
            }
        }
    }

    #[test]
    fn unsupported_calls_have_no_policy() {
        for op in [KernelOp::Prefill, KernelOp::PrefillSm90, KernelOp::PagedPrefill, KernelOp::Decode] {
            for d in [0, 8, 24, 100, 516, 520, 1024, usize::MAX] {
                assert_eq!(tile_policy(op, d, false, None), None, "{op:?} D {d}");
            }
        }
        // Past their own maxima (abi.h): prefill and paged prefill stop at 256, decode at 512.
        for op in [KernelOp::Prefill, KernelOp::PrefillSm90, KernelOp::PagedPrefill] {
            assert_eq!(tile_policy(op, 264, false, None), None, "{op:?}");
            assert_eq!(tile_policy(op, 512, false, None), None, "{op:?}");
        }
        assert_eq!(tile_policy(KernelOp::Prefill, 128, false, Some(Fp8Format::E4m3)), None, "prefill has no FP8 cache");
    }
}
