//! The page size as a multiply-shift divisor (`sys::FaDivisor`): the constants with which the kernels divide
//! a token index or a cache slot by the page size without a divide instruction. kernels/include/fa/
//! fast_divmod.cuh proves the division exact (every token index below 2^31, every slot below 2^63) and holds
//! the launchers' definition of the same constants, which they check these against; tests/it/page_sizes.rs
//! compares the two and runs the kernels' division against `/` and `%`.

use crate::sys;

/// The divisor constants of `d` (1 ≤ d < 2^31; `None` outside): `shift = ⌈log2 d⌉`,
/// `mul = ⌈2^(32+shift) / d⌉ − 2^32`, `mul64 = ⌈2^(64+shift) / d⌉ − 2^64`.
pub fn divisor(d: usize) -> Option<sys::FaDivisor> {
    if d == 0 || d > i32::MAX as usize {
        return None;
    }
    let shift = d.next_power_of_two().trailing_zeros();
    // ⌈2^(32+shift) / d⌉ is in [2^32, 2^33) and ⌈2^(64+shift) / d⌉ in [2^64, 2^65), as 2^(shift-1) < d ≤ 2^shift.
    let m32 = (1u64 << (32 + shift)).div_ceil(d as u64);
    let m64 = (1u128 << (64 + shift)).div_ceil(d as u128);
    Some(sys::FaDivisor { mul64: (m64 - (1u128 << 64)) as u64, mul: (m32 - (1u64 << 32)) as u32, shift: shift as i32 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn powers_of_two_are_plain_shifts() {
        for l in 0..31 {
            let d = divisor(1 << l).unwrap();
            assert_eq!((d.mul, d.mul64, d.shift), (0, 0, l), "d = 2^{l}");
        }
    }

    #[test]
    fn known_constants_and_the_range() {
        // d = 3: shift 2, ⌈2^34 / 3⌉ = 5726623062 = 2^32 + 1431655766.
        let d = divisor(3).unwrap();
        assert_eq!((d.mul, d.shift), (1_431_655_766, 2));
        assert_eq!(d.mul64, ((1u128 << 66).div_ceil(3) - (1u128 << 64)) as u64);
        assert!(divisor(0).is_none());
        assert!(divisor(1 << 31).is_none());
        assert_eq!(divisor(i32::MAX as usize).unwrap().shift, 31);
    }
}
