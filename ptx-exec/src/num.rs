//! Number formats and rounding as the PTX ISA defines them ("Floating-point instructions", "cvt"): fp32
//! arithmetic in the four IEEE rounding modes, `.ftz`, the canonical NaN, and the 16-bit and 8-bit formats
//! of `cvt`. Written from the ISA, not from the emulator's host conversions.

/// An IEEE rounding mode of a PTX instruction (`.rn`, `.rz`, `.rm`, `.rp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rnd {
    Rn,
    Rz,
    Rm,
    Rp,
}

/// The canonical NaN every fp32 arithmetic instruction returns for a NaN result (the ISA: "NaN payloads
/// are not preserved").
pub const CANONICAL_NAN_F32: u32 = 0x7fff_ffff;

/// Sign-preserving flush of an fp32 subnormal to zero (`.ftz`).
pub fn ftz(x: f32) -> f32 {
    if x.is_subnormal() {
        if x.is_sign_negative() {
            -0.0
        } else {
            0.0
        }
    } else {
        x
    }
}

fn next_up(x: f32) -> f32 {
    if x.is_nan() || x == f32::INFINITY {
        return x;
    }
    if x == 0.0 {
        return f32::from_bits(1);
    }
    let b = x.to_bits();
    f32::from_bits(if x > 0.0 { b + 1 } else { b - 1 })
}

fn next_down(x: f32) -> f32 {
    -next_up(-x)
}

/// The exact real value `hi + lo` (an f64 and an error term smaller than half its ulp, as TwoSum gives)
/// rounded to fp32 in `mode`.
pub fn round_f32(hi: f64, lo: f64, mode: Rnd) -> f32 {
    let n = hi as f32; // round to nearest even of hi; hi + lo rounds the same way unless hi is a tie
    if mode == Rnd::Rn {
        // hi is a tie between two fp32 only if it lies on the midpoint, then lo decides.
        let nd = n as f64;
        if nd != hi && lo != 0.0 && n.is_finite() {
            let other = if nd < hi { next_up(n) } else { next_down(n) };
            let mid = (nd + other as f64) / 2.0; // exact: fp32 neighbours' midpoint fits an f64
            if mid == hi {
                return if (lo > 0.0) == (other as f64 > nd) { other } else { n };
            }
        }
        return n;
    }
    if hi.is_nan() {
        return f32::NAN;
    }
    let nd = n as f64;
    // Below or above the exact value hi + lo?
    let below = nd < hi || (nd == hi && lo > 0.0);
    let above = nd > hi || (nd == hi && lo < 0.0);
    let toward_zero_down = hi + lo > 0.0 || (hi + lo == 0.0 && hi > 0.0);
    match mode {
        Rnd::Rm => {
            if above {
                next_down(n)
            } else {
                n
            }
        }
        Rnd::Rp => {
            if below {
                next_up(n)
            } else {
                n
            }
        }
        Rnd::Rz => {
            if toward_zero_down {
                if above {
                    next_down(n)
                } else {
                    n
                }
            } else if below {
                next_up(n)
            } else {
                n
            }
        }
        Rnd::Rn => unreachable!(),
    }
    .clamp_inf(n, mode, hi)
}

trait ClampInf {
    fn clamp_inf(self, n: f32, mode: Rnd, hi: f64) -> f32;
}
impl ClampInf for f32 {
    /// Directed rounding never overflows to an infinity it rounds away from: RZ of a huge value is MAX.
    fn clamp_inf(self, n: f32, mode: Rnd, hi: f64) -> f32 {
        if n.is_infinite() && hi.is_finite() {
            let max = f32::MAX;
            return match (mode, hi > 0.0) {
                (Rnd::Rz, true) | (Rnd::Rm, true) => max,
                (Rnd::Rz, false) | (Rnd::Rp, false) => -max,
                _ => n,
            };
        }
        self
    }
}

/// Exact sum of two f64 as (rounded sum, error) (Knuth's TwoSum).
pub fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    if !s.is_finite() {
        return (s, 0.0);
    }
    let bb = s - a;
    let e = (a - (s - bb)) + (b - bb);
    (s, e)
}

/// a + b in fp32 with `mode` (exact sum rounded once).
pub fn add_f32(a: f32, b: f32, mode: Rnd) -> f32 {
    let (s, e) = two_sum(a as f64, b as f64);
    fix_nan(round_f32(s, e, mode))
}

/// a · b in fp32 with `mode` (the product of two fp32 is exact in f64).
pub fn mul_f32(a: f32, b: f32, mode: Rnd) -> f32 {
    fix_nan(round_f32(a as f64 * b as f64, 0.0, mode))
}

/// a · b + c in fp32, rounded once in `mode` (fma).
pub fn fma_f32(a: f32, b: f32, c: f32, mode: Rnd) -> f32 {
    if mode == Rnd::Rn {
        return fix_nan(a.mul_add(b, c));
    }
    let p = a as f64 * b as f64; // exact
    let (s, e) = two_sum(p, c as f64);
    fix_nan(round_f32(s, e, mode))
}

/// a / b in fp32, IEEE (div.rn / div.full is not this). Rounding an f64 quotient to fp32 is innocuous for
/// division (53 >= 2·24 + 2), so .rn is exact; the directed modes use the f64 remainder's sign.
pub fn div_f32(a: f32, b: f32, mode: Rnd) -> f32 {
    let q = a as f64 / b as f64;
    if mode == Rnd::Rn || !q.is_finite() || q == 0.0 {
        return fix_nan(q as f32);
    }
    // The f64 quotient's own error: r = a - q·b exactly (fma), sign of the true quotient minus q.
    let r = (-q).mul_add(b as f64, a as f64);
    // Only the sign of the remainder matters to a directed rounding (q itself is not an fp32 tie).
    let lo = if r == 0.0 { 0.0 } else { r.signum() * (b as f64).signum() * f64::MIN_POSITIVE };
    fix_nan(round_f32(q, lo, mode))
}

/// The canonical NaN for any NaN result.
pub fn fix_nan(x: f32) -> f32 {
    if x.is_nan() {
        f32::from_bits(CANONICAL_NAN_F32)
    } else {
        x
    }
}

/// fp32 -> fp16 bits, IEEE round to nearest even (cvt.rn.f16.f32); NaN -> canonical 0x7fff.
pub fn f32_to_f16(x: f32, mode: Rnd) -> u16 {
    if x.is_nan() {
        return 0x7fff;
    }
    let sign = if x.is_sign_negative() { 0x8000u16 } else { 0 };
    let a = x.abs() as f64;
    // fp16: 10 fraction bits, exponents -14..15, subnormal quantum 2^-24.
    if a == 0.0 {
        return sign;
    }
    let max = 65504.0f64;
    let e = a.log2().floor() as i32;
    let exp = e.clamp(-14, 15);
    let quantum = 2f64.powi(exp - 10);
    let q = a / quantum; // exact: power-of-two scaling
    let up_away = |q: f64| match mode {
        Rnd::Rn => {
            let f = q.floor();
            let d = q - f;
            if d > 0.5 || (d == 0.5 && (f as u64) % 2 == 1) {
                f + 1.0
            } else {
                f
            }
        }
        Rnd::Rz => q.floor(),
        Rnd::Rp => {
            if sign == 0 {
                q.ceil()
            } else {
                q.floor()
            }
        }
        Rnd::Rm => {
            if sign == 0 {
                q.floor()
            } else {
                q.ceil()
            }
        }
    };
    let m = up_away(q) * quantum;
    if m > max {
        let inf = matches!((mode, sign == 0), (Rnd::Rn, _) | (Rnd::Rp, true) | (Rnd::Rm, false));
        return sign | if inf { 0x7c00 } else { 0x7bff };
    }
    sign | f64_to_f16_bits_exact(m)
}

/// Bits of a non-negative value exactly representable in fp16 (normal or subnormal).
fn f64_to_f16_bits_exact(m: f64) -> u16 {
    if m == 0.0 {
        return 0;
    }
    let e = m.log2().floor() as i32;
    if e < -14 {
        return (m / 2f64.powi(-24)) as u16;
    }
    let frac = (m / 2f64.powi(e) - 1.0) * 1024.0;
    (((e + 15) as u16) << 10) | frac as u16
}

/// The exact value `hi + lo` (as [`two_sum`] gives) rounded once to fp16 or bf16, nearest even; NaN gives
/// the canonical 0x7fff. Rounded to odd at fp32 first (exact or sticky in the last bit), which is innocuous
/// before a rounding to 11 or 8 bits (24 >= 11 + 2).
pub fn round_to_16(hi: f64, lo: f64, bf16: bool) -> u16 {
    if hi.is_nan() {
        return 0x7fff;
    }
    let t = round_f32(hi, lo, Rnd::Rz);
    let exact = t as f64 == hi && lo == 0.0 || (t as f64 - hi) - lo == 0.0;
    let t = if exact || t.is_infinite() { t } else { f32::from_bits(t.to_bits() | 1) };
    if bf16 {
        f32_to_bf16(t, Rnd::Rn)
    } else {
        f32_to_f16(t, Rnd::Rn)
    }
}

/// fp16 bits -> fp32 (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0f32 } else { 1.0 };
    let e = ((h >> 10) & 0x1f) as i32;
    let f = (h & 0x3ff) as f32;
    match e {
        0 => sign * f * 2f32.powi(-24),
        31 => {
            if f == 0.0 {
                sign * f32::INFINITY
            } else {
                f32::NAN
            }
        }
        _ => sign * (1.0 + f / 1024.0) * 2f32.powi(e - 15),
    }
}

/// fp32 -> bf16 bits (cvt.rn.bf16.f32): the top 16 bits rounded to nearest even; NaN -> canonical 0x7fff.
pub fn f32_to_bf16(x: f32, mode: Rnd) -> u16 {
    if x.is_nan() {
        return 0x7fff;
    }
    let b = x.to_bits();
    let low = b & 0xffff;
    let hi = b >> 16;
    let neg = b >> 31 == 1;
    let round_up = match mode {
        Rnd::Rn => low > 0x8000 || (low == 0x8000 && hi & 1 == 1),
        Rnd::Rz => false,
        Rnd::Rp => !neg && low != 0,
        Rnd::Rm => neg && low != 0,
    };
    (hi + round_up as u32) as u16
}

/// bf16 bits -> fp32 (exact).
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// An FP8 format of `cvt` (`.e4m3x2`, `.e5m2x2`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp8 {
    E4m3,
    E5m2,
}

/// fp32 -> FP8 code, round to nearest even, `.satfinite`: finite values beyond the largest finite code
/// give that code (±448 for E4M3, ±57344 for E5M2), ±Inf too; NaN gives the format's NaN (0x7f).
pub fn f32_to_fp8(x: f32, f: Fp8) -> u8 {
    let (man_bits, bias, max) = match f {
        Fp8::E4m3 => (3i32, 7i32, 448.0f64),
        Fp8::E5m2 => (2, 15, 57344.0),
    };
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = (x as f64).abs();
    if a == 0.0 {
        return sign;
    }
    let min_exp = 1 - bias;
    let e = a.log2().floor() as i32;
    let exp = e.max(min_exp);
    let quantum = 2f64.powi(exp - man_bits);
    let q = a / quantum;
    let f = q.floor();
    let d = q - f;
    let r = if d > 0.5 || (d == 0.5 && (f as u64) % 2 == 1) { f + 1.0 } else { f };
    let m = (r * quantum).min(max);
    if m == 0.0 {
        return sign;
    }
    let e = m.log2().floor() as i32;
    let code = if e < min_exp {
        (m / 2f64.powi(min_exp - man_bits)) as u8
    } else {
        let frac = ((m / 2f64.powi(e) - 1.0) * (1 << man_bits) as f64) as u8;
        (((e + bias) as u8) << man_bits) | frac
    };
    sign | code
}

/// FP8 code -> fp16 bits (exact: both formats embed in fp16). E4M3 has no infinities; its NaN codes
/// (S.1111.111) and E5M2's NaNs give fp16's canonical NaN 0x7fff.
pub fn fp8_to_f16(c: u8, f: Fp8) -> u16 {
    let sign = ((c & 0x80) as u16) << 8;
    match f {
        Fp8::E5m2 => {
            let h = (c as u16) << 8;
            if h & 0x7c00 == 0x7c00 && h & 0x3ff != 0 {
                0x7fff
            } else {
                h
            }
        }
        Fp8::E4m3 => {
            let e = ((c >> 3) & 0xf) as i32;
            let m = (c & 7) as f64;
            if e == 15 && c & 7 == 7 {
                return 0x7fff;
            }
            let v = if e == 0 { m / 8.0 * 2f64.powi(-6) } else { (1.0 + m / 8.0) * 2f64.powi(e - 7) };
            sign | f64_to_f16_bits_exact(v)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directed_rounding_brackets_the_exact_value() {
        let a = 1.0f32;
        let b = f32::EPSILON / 4.0; // a + b lies strictly between 1 and next_up(1)
        assert_eq!(add_f32(a, b, Rnd::Rn), 1.0);
        assert_eq!(add_f32(a, b, Rnd::Rz), 1.0);
        assert_eq!(add_f32(a, b, Rnd::Rm), 1.0);
        assert_eq!(add_f32(a, b, Rnd::Rp), next_up(1.0));
        assert_eq!(add_f32(-a, -b, Rnd::Rm), -next_up(1.0));
        assert_eq!(add_f32(-a, -b, Rnd::Rz), -1.0);
        // A tie (exactly half an ulp above 1) rounds to even with .rn.
        assert_eq!(add_f32(1.0, f32::EPSILON / 2.0, Rnd::Rn), 1.0);
        assert_eq!(fma_f32(3.0, 1.0 / 3.0, -1.0, Rnd::Rn), 3.0f32.mul_add(1.0 / 3.0, -1.0));
    }

    #[test]
    fn sixteen_bit_conversions_match_ieee() {
        for bits in 0..=u16::MAX {
            let f = f16_to_f32(bits);
            if f.is_nan() {
                continue;
            }
            assert_eq!(f32_to_f16(f, Rnd::Rn), bits, "{bits:#x}");
            let g = bf16_to_f32(bits);
            if !g.is_nan() {
                assert_eq!(f32_to_bf16(g, Rnd::Rn), bits);
            }
        }
        assert_eq!(f32_to_f16(65520.0, Rnd::Rn), 0x7c00); // the midpoint past 65504 overflows
        assert_eq!(f32_to_f16(65519.0, Rnd::Rn), 0x7bff);
        assert_eq!(f32_to_f16(2f32.powi(-25), Rnd::Rn), 0); // tie to even subnormal
        assert_eq!(f32_to_f16(2f32.powi(-25) * 1.5, Rnd::Rn), 1);
    }

    #[test]
    fn fp8_round_trips_and_saturates() {
        for c in 0..=255u8 {
            for f in [Fp8::E4m3, Fp8::E5m2] {
                let h = fp8_to_f16(c, f);
                let v = f16_to_f32(h);
                if v.is_nan() || v.is_infinite() {
                    continue;
                }
                assert_eq!(f32_to_fp8(v, f), c, "{c:#x} {f:?}");
            }
        }
        assert_eq!(f32_to_fp8(1e9, Fp8::E4m3), 0x7e);
        assert_eq!(f32_to_fp8(-f32::INFINITY, Fp8::E5m2), 0xfb);
    }
}
