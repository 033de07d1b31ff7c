//! Element types the kernels accept: fp16 and bf16 (half::f16 / half::bf16) for every tensor, with the
//! conversions the tests and the reference need (round to nearest even, as the GPU's cvt.rn does), and the
//! FP8 codes (E4M3, E5M2) a KV cache may hold instead, with a scalar model of their conversions
//! ([`Fp8Format`]). The caches' scales and their checks are in [`crate::fp8`].

use half::{bf16, f16};

use crate::sys;

/// Runtime tag of a 16-bit floating-point element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F16,
    Bf16,
}

/// The C ABI tag (`abi`, a constant of kernels/include/fa/abi.h) and the runner's spelling (`name`, of its
/// `--dtype` / `--kv-dtype` flags and JSON rows) of each variant of an element-type enum, listed once.
macro_rules! tags {
    ($ty:ident { $($variant:ident => ($abi:path, $name:literal)),* $(,)? }) => {
        impl $ty {
            /// The tag the C ABI uses.
            pub(crate) fn abi(self) -> i32 {
                match self {
                    $($ty::$variant => $abi as i32,)*
                }
            }
            /// Spelling used by the runner's flags and JSON rows.
            pub fn name(self) -> &'static str {
                match self {
                    $($ty::$variant => $name,)*
                }
            }
        }
    };
}

tags!(DType { F16 => (sys::FA_DTYPE_F16, "fp16"), Bf16 => (sys::FA_DTYPE_BF16, "bf16") });
tags!(Fp8Format { E4m3 => (sys::FA_KV_FP8_E4M3, "fp8_e4m3"), E5m2 => (sys::FA_KV_FP8_E5M2, "fp8_e5m2") });

impl DType {
    /// Bytes per element (2: both are 16-bit types).
    pub const fn bytes(self) -> usize {
        2
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "fp16" | "f16" | "float16" => Some(DType::F16),
            "bf16" | "bfloat16" => Some(DType::Bf16),
            _ => None,
        }
    }
    /// Round an f64 to this type and back (f64 -> f32 -> 16-bit, both round-to-nearest-even; the double
    /// rounding matches what a framework computing in fp32 then casting does).
    pub fn round(self, x: f64) -> f64 {
        match self {
            DType::F16 => f16::from_f32(x as f32).to_f64(),
            DType::Bf16 => bf16::from_f32(x as f32).to_f64(),
        }
    }
}

/// The seal of the element traits ([`Element`], [`KvElement`], [`KvCacheOf`], [`Fp8Element`],
/// [`crate::merge::MergeElement`]). Their constants pick the kernel, and so the bytes per element the kernel
/// reads and writes, while views count extents in `size_of::<T>()`: a type whose size differed from its
/// constant's would let a safe call reach memory it was not given. So only this crate implements them, and
/// every impl asserts at compile time that its size is the kernel's (`impl_sealed!`). Not nameable outside
/// the crate (`mod sealed` is private to it).
pub(crate) mod sealed {
    /// Implemented only by this crate's element types.
    pub trait Sealed {}
    /// [`super::KvCacheOf`]'s seal: the pairs (cache element, query element) this crate implements.
    pub trait SealedCacheOf<T> {}
}

/// Seals `$t` with the compile-time check that its size is `$bytes`, the bytes per element of the kernel
/// its constant picks.
macro_rules! impl_sealed {
    ($($t:ty => $bytes:expr),* $(,)?) => {$(
        impl $crate::dtype::sealed::Sealed for $t {}
        const _: () = assert!(::std::mem::size_of::<$t>() == $bytes, "an element type's size must be the kernel's");
    )*};
}
pub(crate) use impl_sealed;

impl_sealed!(f16 => DType::F16.bytes(), bf16 => DType::Bf16.bytes());

/// A 16-bit element type usable in kernel views (and as a 16-bit KV cache's element).
///
/// Sealed: only fp16 and bf16 implement it (its `DTYPE` picks the kernel, so a type of another size could
/// reach memory its view was not given). A downstream impl does not compile:
/// ```compile_fail,E0277
/// use fused_attn::cudarc::driver::{DeviceRepr, ValidAsZeroBits};
/// #[derive(Clone, Copy, Default, Debug)]
/// #[repr(transparent)]
/// struct B8(u8);
/// unsafe impl DeviceRepr for B8 {}
/// unsafe impl ValidAsZeroBits for B8 {}
/// impl fused_attn::KvElement for B8 {
///     const KV_DTYPE: fused_attn::KvDType = fused_attn::KvDType::Sixteen(fused_attn::DType::Bf16);
///     fn stored_value(self) -> f64 { 0.0 }
/// }
/// impl fused_attn::KvCacheOf<B8> for B8 {}
/// impl fused_attn::Element for B8 {
///     const DTYPE: fused_attn::DType = fused_attn::DType::Bf16; // 2 bytes per element in the kernel
///     fn from_f64(_: f64) -> Self { B8(0) }
///     fn to_f64(self) -> f64 { 0.0 }
///     fn nan() -> Self { B8(0) }
/// }
/// ```
pub trait Element:
    sealed::Sealed
    + KvCacheOf<Self>
    + Copy
    + Default
    + Send
    + Sync
    + std::fmt::Debug
    + cudarc::driver::DeviceRepr
    + cudarc::driver::ValidAsZeroBits
    + 'static
{
    const DTYPE: DType;
    fn from_f64(x: f64) -> Self;
    fn to_f64(self) -> f64;
    fn nan() -> Self;
}

/// The two 16-bit types take their conversions from `half` by the same names, so one impl serves both.
macro_rules! element {
    ($($t:ident => $dtype:expr),*) => {$(
        impl Element for $t {
            const DTYPE: DType = $dtype;
            fn from_f64(x: f64) -> Self { $t::from_f64(x) }
            fn to_f64(self) -> f64 { $t::to_f64(self) }
            fn nan() -> Self { $t::NAN }
        }
    )*};
}
element!(f16 => DType::F16, bf16 => DType::Bf16);

/// An FP8 format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8Format {
    E4m3,
    E5m2,
}

impl Fp8Format {
    /// Exponent bias and mantissa bits.
    fn layout(self) -> (i32, i32) {
        match self {
            Fp8Format::E4m3 => (7, 3),
            Fp8Format::E5m2 => (15, 2),
        }
    }
    /// The largest finite value (448 or 57344).
    pub fn max(self) -> f64 {
        match self {
            Fp8Format::E4m3 => 448.0,
            Fp8Format::E5m2 => 57344.0,
        }
    }
    /// The canonical NaN code both formats' conversions produce.
    pub const NAN_CODE: u8 = 0x7f;

    /// The value of a code (the model: sign, biased exponent, mantissa; NaN and infinities by format).
    pub fn decode(self, code: u8) -> f64 {
        let (bias, mant) = self.layout();
        let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
        let e = i32::from((code & 0x7f) >> mant);
        let m = f64::from(code & ((1 << mant) - 1));
        let all_ones = (1 << (7 - mant)) - 1;
        match self {
            Fp8Format::E4m3 if code & 0x7f == 0x7f => return f64::NAN,
            Fp8Format::E5m2 if e == all_ones => return if m == 0.0 { sign * f64::INFINITY } else { f64::NAN },
            _ => {}
        }
        let frac = m / f64::from(1 << mant);
        if e == 0 {
            sign * frac * 2f64.powi(1 - bias)
        } else {
            sign * (1.0 + frac) * 2f64.powi(e - bias)
        }
    }

    /// The code of `x` (the model, computed in f64 from the value's binade rather than from bits): round to
    /// nearest even, saturate to ±max (infinities included), NaN -> 0x7f, -0 -> 0x80.
    pub fn encode(self, x: f32) -> u8 {
        if x.is_nan() {
            return Self::NAN_CODE;
        }
        let (bias, mant) = self.layout();
        let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
        let a = f64::from(x).abs();
        let max = self.max();
        // The spacing of representable values around a: 2^(max(exponent, 1 - bias) - mant).
        let exp = if a == 0.0 { 1 - bias } else { (a.log2().floor() as i32).max(1 - bias) };
        let ulp = 2f64.powi(exp - mant);
        let q = (a / ulp).round_ties_even() * ulp; // exact: a / ulp is a scaling by a power of two
        let q = if a > max || q > max { max } else { q };
        // The code of the (now representable) value q.
        let e = if q == 0.0 { 0 } else { (q.log2().floor() as i32).max(1 - bias) };
        let code = if q < 2f64.powi(1 - bias) {
            (q / 2f64.powi(1 - bias - mant)) as u8 // subnormal (or zero): the mantissa alone
        } else {
            (((e + bias) << mant) as u8) | (((q / 2f64.powi(e) - 1.0) * f64::from(1 << mant)) as u8)
        };
        sign | code
    }
}

/// The element type of a KV cache: the op's 16-bit dtype, or FP8.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvDType {
    Sixteen(DType),
    Fp8(Fp8Format),
}

impl KvDType {
    /// Spelling of the runner's `--kv-dtype` (fp16, bf16, fp8_e4m3, fp8_e5m2).
    pub fn name(self) -> &'static str {
        match self {
            KvDType::Sixteen(d) => d.name(),
            KvDType::Fp8(f) => f.name(),
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "fp8_e4m3" | "e4m3" => Some(KvDType::Fp8(Fp8Format::E4m3)),
            "fp8_e5m2" | "e5m2" => Some(KvDType::Fp8(Fp8Format::E5m2)),
            _ => DType::parse(s).map(KvDType::Sixteen),
        }
    }
    pub fn fp8(self) -> Option<Fp8Format> {
        match self {
            KvDType::Fp8(f) => Some(f),
            KvDType::Sixteen(_) => None,
        }
    }
    /// Bytes per element.
    pub const fn bytes(self) -> usize {
        match self {
            KvDType::Sixteen(_) => 2,
            KvDType::Fp8(_) => 1,
        }
    }
}

/// The code type of each FP8 format: a byte newtype that a KV cache can hold ([`KvElement`], [`KvCacheOf`]
/// any 16-bit `T`) and that knows its format ([`Fp8Element`]).
macro_rules! fp8_code_types {
    ($($(#[$doc:meta])* $ty:ident => $format:ident),* $(,)?) => {$(
        $(#[$doc])*
        #[repr(transparent)]
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct $ty(pub u8);

        // SAFETY: one plain byte, any bit pattern valid; passed to kernels only through pointers.
        unsafe impl cudarc::driver::DeviceRepr for $ty {}
        unsafe impl cudarc::driver::ValidAsZeroBits for $ty {}

        impl_sealed!($ty => KvDType::Fp8(Fp8Format::$format).bytes());
        impl<T: Element> sealed::SealedCacheOf<T> for $ty {}
        impl KvElement for $ty {
            const KV_DTYPE: KvDType = KvDType::Fp8(Fp8Format::$format);
            fn stored_value(self) -> f64 {
                Fp8Format::$format.decode(self.0)
            }
        }
        impl<T: Element> KvCacheOf<T> for $ty {}
        impl Fp8Element for $ty {
            const FORMAT: Fp8Format = Fp8Format::$format;
            fn from_code(code: u8) -> Self {
                $ty(code)
            }
            fn code(self) -> u8 {
                self.0
            }
        }
    )*};
}

fp8_code_types! {
    /// One E4M3 code.
    Fp8E4m3 => E4m3,
    /// One E5M2 code.
    Fp8E5m2 => E5m2,
}

/// An element type a KV cache can hold: fp16/bf16 (the op's own dtype) or an FP8 code. Sealed, as
/// [`Element`] is (a downstream impl does not compile):
/// ```compile_fail,E0277
/// use fused_attn::cudarc::driver::{DeviceRepr, ValidAsZeroBits};
/// #[derive(Clone, Copy, Default, Debug)]
/// #[repr(transparent)]
/// struct B8(u8);
/// unsafe impl DeviceRepr for B8 {}
/// unsafe impl ValidAsZeroBits for B8 {}
/// impl fused_attn::KvElement for B8 {
///     const KV_DTYPE: fused_attn::KvDType = fused_attn::KvDType::Sixteen(fused_attn::DType::F16);
///     fn stored_value(self) -> f64 { 0.0 }
/// }
/// ```
pub trait KvElement:
    sealed::Sealed
    + Copy
    + Default
    + Send
    + Sync
    + std::fmt::Debug
    + cudarc::driver::DeviceRepr
    + cudarc::driver::ValidAsZeroBits
    + 'static
{
    const KV_DTYPE: KvDType;
    /// The value stored, before any dequantisation scale: the 16-bit value, or the FP8 code decoded
    /// (NaN / ±inf codes included). The reference checks read caches through it.
    fn stored_value(self) -> f64;
}
impl KvElement for half::f16 {
    const KV_DTYPE: KvDType = KvDType::Sixteen(DType::F16);
    fn stored_value(self) -> f64 {
        self.to_f64()
    }
}
impl KvElement for half::bf16 {
    const KV_DTYPE: KvDType = KvDType::Sixteen(DType::Bf16);
    fn stored_value(self) -> f64 {
        self.to_f64()
    }
}

/// A cache element type that serves queries / new tokens of type `T`: `T` itself (a 16-bit cache), or an
/// FP8 code type (either 16-bit `T`). A 16-bit cache of the other dtype does not compile; and since a 16-bit
/// cache type has one such `T`, callers' `T` is still inferred from the cache.
///
/// Sealed: a downstream pair (e.g. an FP8 cache of its own query type, or f16 serving another type) does not
/// compile:
/// ```compile_fail,E0277
/// struct Q;
/// impl fused_attn::KvCacheOf<Q> for fused_attn::half::f16 {}
/// ```
pub trait KvCacheOf<T>: KvElement + sealed::SealedCacheOf<T> {}
impl sealed::SealedCacheOf<half::f16> for half::f16 {}
impl sealed::SealedCacheOf<half::bf16> for half::bf16 {}
impl KvCacheOf<half::f16> for half::f16 {}
impl KvCacheOf<half::bf16> for half::bf16 {}

/// An FP8 code type: its format and the raw byte.
pub trait Fp8Element: KvElement {
    const FORMAT: Fp8Format;
    fn from_code(code: u8) -> Self;
    fn code(self) -> u8;
}
