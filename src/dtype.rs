//! Element types the kernels accept: fp16 and bf16 (half::f16 / half::bf16), with the conversions the
//! tests and the reference need. Conversions round to nearest even, as the GPU's cvt.rn does.

use half::{bf16, f16};

/// Runtime tag of a 16-bit floating-point element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F16,
    Bf16,
}

impl DType {
    /// The tag the C ABI uses (FA_DTYPE_* in kernels/include/fa/abi.h).
    pub(crate) fn abi(self) -> i32 {
        match self {
            DType::F16 => crate::sys::FA_DTYPE_F16 as i32,
            DType::Bf16 => crate::sys::FA_DTYPE_BF16 as i32,
        }
    }
    /// Spelling used by the runner's `--dtype` flag and JSON rows.
    pub fn name(self) -> &'static str {
        match self {
            DType::F16 => "fp16",
            DType::Bf16 => "bf16",
        }
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

/// A 16-bit element type usable in kernel views (and as a 16-bit KV cache's element).
pub trait Element:
    crate::fp8::KvCacheOf<Self>
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

impl Element for f16 {
    const DTYPE: DType = DType::F16;
    fn from_f64(x: f64) -> Self {
        f16::from_f64(x)
    }
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
    fn nan() -> Self {
        f16::NAN
    }
}

impl Element for bf16 {
    const DTYPE: DType = DType::Bf16;
    fn from_f64(x: f64) -> Self {
        bf16::from_f64(x)
    }
    fn to_f64(self) -> f64 {
        bf16::to_f64(self)
    }
    fn nan() -> Self {
        bf16::NAN
    }
}
