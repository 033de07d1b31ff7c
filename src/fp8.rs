//! FP8 KV cache (issue 17): the element types of an FP8 paged cache, their dequantisation scales, and a
//! scalar model of the conversions written independently of the kernels' (kernels/include/fa/fp8_model.cuh),
//! against which the tests check the emulator and the GPU bit for bit.
//!
//! Formats: OCP FP8 as CUDA's `__nv_fp8_e4m3` (4 exponent bits, bias 7, no infinities, largest finite 448)
//! and `__nv_fp8_e5m2` (5 exponent bits, bias 15, IEEE-like, largest finite 57344). A stored value times its
//! scale is the value attention uses; scales are fp32, one per tensor or one per KV head, for K and V
//! separately. Append quantises `stored = fp8_rn_satfinite(f32(x) / scale)`: an IEEE fp32 division, then
//! round to nearest even, |values| past the largest finite one (infinities included) saturate to it, NaN
//! stays NaN (code 0x7f). FP8 -> fp16/bf16 is exact, so decode reads the stored values unchanged and folds
//! the scales into its math.

use cudarc::driver::CudaSlice;

use crate::device::Stream;
use crate::dtype::DType;
use crate::error::{Error, ErrorKind, Result};
use crate::sys;
use crate::tensor::TensorView;

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

    /// The tag the C ABI uses (FA_KV_FP8_* in abi.h).
    pub(crate) fn abi(self) -> i32 {
        match self {
            Fp8Format::E4m3 => sys::FA_KV_FP8_E4M3 as i32,
            Fp8Format::E5m2 => sys::FA_KV_FP8_E5M2 as i32,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Fp8Format::E4m3 => "fp8_e4m3",
            Fp8Format::E5m2 => "fp8_e5m2",
        }
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
    pub fn bytes(self) -> usize {
        match self {
            KvDType::Sixteen(_) => 2,
            KvDType::Fp8(_) => 1,
        }
    }
}

/// One E4M3 code.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fp8E4m3(pub u8);
/// One E5M2 code.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fp8E5m2(pub u8);

// SAFETY: one plain byte, any bit pattern valid; passed to kernels only through pointers.
unsafe impl cudarc::driver::DeviceRepr for Fp8E4m3 {}
unsafe impl cudarc::driver::ValidAsZeroBits for Fp8E4m3 {}
unsafe impl cudarc::driver::DeviceRepr for Fp8E5m2 {}
unsafe impl cudarc::driver::ValidAsZeroBits for Fp8E5m2 {}

/// An element type a KV cache can hold: fp16/bf16 (the op's own dtype) or an FP8 code.
pub trait KvElement:
    Copy + Default + Send + Sync + std::fmt::Debug + cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits + 'static
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
impl KvElement for Fp8E4m3 {
    const KV_DTYPE: KvDType = KvDType::Fp8(Fp8Format::E4m3);
    fn stored_value(self) -> f64 {
        Fp8Format::E4m3.decode(self.0)
    }
}
impl KvElement for Fp8E5m2 {
    const KV_DTYPE: KvDType = KvDType::Fp8(Fp8Format::E5m2);
    fn stored_value(self) -> f64 {
        Fp8Format::E5m2.decode(self.0)
    }
}

/// A cache element type that serves queries / new tokens of type `T`: `T` itself (a 16-bit cache), or an
/// FP8 code type (either 16-bit `T`). A 16-bit cache of the other dtype does not compile; and since a 16-bit
/// cache type has one such `T`, callers' `T` is still inferred from the cache.
pub trait KvCacheOf<T>: KvElement {}
impl KvCacheOf<half::f16> for half::f16 {}
impl KvCacheOf<half::bf16> for half::bf16 {}
impl<T: crate::dtype::Element> KvCacheOf<T> for Fp8E4m3 {}
impl<T: crate::dtype::Element> KvCacheOf<T> for Fp8E5m2 {}

/// An FP8 code type: its format and the raw byte.
pub trait Fp8Element: KvElement {
    const FORMAT: Fp8Format;
    fn from_code(code: u8) -> Self;
    fn code(self) -> u8;
}
impl Fp8Element for Fp8E4m3 {
    const FORMAT: Fp8Format = Fp8Format::E4m3;
    fn from_code(code: u8) -> Self {
        Fp8E4m3(code)
    }
    fn code(self) -> u8 {
        self.0
    }
}
impl Fp8Element for Fp8E5m2 {
    const FORMAT: Fp8Format = Fp8Format::E5m2;
    fn from_code(code: u8) -> Self {
        Fp8E5m2(code)
    }
    fn code(self) -> u8 {
        self.0
    }
}

/// How many scales a cache has: one per tensor, or one per KV head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScaleKind {
    PerTensor,
    PerHead,
}

impl ScaleKind {
    /// Spelling of the runner's `--kv-scale`.
    pub fn name(self) -> &'static str {
        match self {
            ScaleKind::PerTensor => "per-tensor",
            ScaleKind::PerHead => "per-head",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "per-tensor" | "tensor" => Some(ScaleKind::PerTensor),
            "per-head" | "head" => Some(ScaleKind::PerHead),
            _ => None,
        }
    }
}

enum ScaleMem {
    Host(Vec<f32>),
    Gpu(CudaSlice<f32>),
}

/// The dequantisation scales of an FP8 cache (K and V separately), validated on the host and uploaded once
/// on creation (engines use calibrated static scales): pass them to [`crate::PagedKvCache::with_scales`] /
/// [`crate::PagedKvCacheMut::with_scales`]. Every scale must be finite and > 0 (else `Unsupported`).
pub struct KvScales {
    k: Vec<f32>,
    v: Vec<f32>,
    /// `[k..., v...]` where the kernels read it.
    mem: ScaleMem,
}

impl KvScales {
    /// One scale per tensor.
    pub fn per_tensor(stream: &Stream<'_>, k: f32, v: f32) -> Result<Self> {
        Self::new(stream, &[k], &[v])
    }

    /// One scale per KV head (`k.len() == v.len() == Hkv`).
    pub fn per_head(stream: &Stream<'_>, k: &[f32], v: &[f32]) -> Result<Self> {
        if k.len() != v.len() || k.is_empty() {
            return Err(Error::shape(
                "v_scale",
                format!("{} per-head V scales for {} K scales (need one per KV head, at least one)", v.len(), k.len()),
            ));
        }
        Self::new(stream, k, v)
    }

    fn new(stream: &Stream<'_>, k: &[f32], v: &[f32]) -> Result<Self> {
        for (name, s) in [("k_scale", k), ("v_scale", v)] {
            if let Some((i, x)) = s.iter().enumerate().find(|(_, x)| !(x.is_finite() && **x > 0.0)) {
                return Err(Error::unsupported(name, format!("[{i}] = {x} (scales must be finite and > 0)")));
            }
        }
        let all: Vec<f32> = k.iter().chain(v).copied().collect();
        let mem = match stream {
            Stream::Gpu(s) => ScaleMem::Gpu(s.clone_htod(&all)?),
            Stream::Emu(_) => ScaleMem::Host(all),
            Stream::Raw(_) => {
                return Err(Error::new(
                    ErrorKind::Usage,
                    "KvScales on a raw stream are not supported yet: use a cudarc stream or the emulator",
                ))
            }
        };
        Ok(Self { k: k.to_vec(), v: v.to_vec(), mem })
    }

    pub fn kind(&self) -> ScaleKind {
        if self.k.len() == 1 {
            ScaleKind::PerTensor
        } else {
            ScaleKind::PerHead
        }
    }
    /// The K scales (one, or one per KV head).
    pub fn k(&self) -> &[f32] {
        &self.k
    }
    pub fn v(&self) -> &[f32] {
        &self.v
    }
    /// K scale of KV head h.
    pub fn k_of(&self, h: usize) -> f32 {
        self.k[if self.k.len() == 1 { 0 } else { h }]
    }
    pub fn v_of(&self, h: usize) -> f32 {
        self.v[if self.v.len() == 1 { 0 } else { h }]
    }

    /// Checks the scales fit a cache of `heads_kv` heads (one scale, or `heads_kv`).
    pub(crate) fn check_heads(&self, heads_kv: usize) -> Result<()> {
        if self.k.len() != 1 && self.k.len() != heads_kv {
            return Err(Error::shape(
                "k_scale",
                format!("{} per-head scales for a cache of {heads_kv} KV heads", self.k.len()),
            ));
        }
        Ok(())
    }

    /// `[k..., v...]` as a view for a launch.
    pub(crate) fn view(&self) -> Result<TensorView<'_, f32, 1>> {
        let n = 2 * self.k.len();
        match &self.mem {
            ScaleMem::Host(h) => TensorView::host(h, [n]),
            ScaleMem::Gpu(g) => TensorView::gpu(g.slice(0..n), [n]),
        }
    }

    /// The ABI's head stride of the scales (0: per tensor, 1: per head).
    pub(crate) fn head_stride(&self) -> i32 {
        i32::from(self.k.len() != 1)
    }
}

/// Sets the FP8 fields of an FaPagedCache for a cache of `kv` elements: the dtype tag and, for FP8, the scale
/// pointers (`scales_ptr` the launch pointer of [`KvScales::view`]).
pub(crate) fn fill_abi(
    cache: &mut sys::FaPagedCache,
    kv: KvDType,
    scales: Option<(&KvScales, *const std::ffi::c_void)>,
) {
    match (kv.fp8(), scales) {
        (Some(f), Some((s, ptr))) => {
            cache.kv_dtype = f.abi();
            cache.scale_head_stride = s.head_stride();
            cache.k_scale = ptr as *const f32;
            // SAFETY: the view holds 2 * len scales; v starts after the k ones.
            cache.v_scale = unsafe { (ptr as *const f32).add(s.k.len()) };
        }
        _ => cache.kv_dtype = sys::FA_KV_SAME as i32,
    }
}

/// Checks that a cache of `C` elements serves an op on `T` (`op` names it in the error): a 16-bit cache of
/// the same dtype, or an FP8 cache with scales for its heads.
pub(crate) fn check_cache_dtype<C: KvElement>(dtype: DType, scales: Option<&KvScales>, heads_kv: usize) -> Result<()> {
    match C::KV_DTYPE {
        KvDType::Sixteen(d) if d != dtype => Err(Error::shape(
            "k_cache",
            format!("element type {} differs from the queries' / new tokens' {}", d.name(), dtype.name()),
        )),
        KvDType::Sixteen(_) if scales.is_some() => {
            Err(Error::unsupported("k_scale", "dequantisation scales apply to FP8 caches only"))
        }
        KvDType::Sixteen(_) => Ok(()),
        KvDType::Fp8(f) => match scales {
            None => Err(Error::shape(
                "k_scale",
                format!("an {} cache needs its dequantisation scales (PagedKvCache::with_scales)", f.name()),
            )),
            Some(s) => s.check_heads(heads_kv),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code's value, and encode(decode(c)) == c for every non-NaN code (-0 included).
    #[test]
    fn codes_round_trip() {
        for f in [Fp8Format::E4m3, Fp8Format::E5m2] {
            for c in 0..=255u8 {
                let x = f.decode(c);
                if x.is_nan() {
                    assert_eq!(f.encode(x as f32), Fp8Format::NAN_CODE);
                } else if x.is_infinite() {
                    assert_eq!(f.encode(x as f32) & 0x7f, 0x7b, "{f:?} inf saturates");
                } else {
                    assert_eq!(f.encode(x as f32), c, "{f:?} code {c:#x} = {x}");
                }
            }
        }
        assert_eq!(Fp8Format::E4m3.decode(0x7e), 448.0);
        assert_eq!(Fp8Format::E4m3.decode(0x01), 2f64.powi(-9));
        assert_eq!(Fp8Format::E5m2.decode(0x7b), 57344.0);
        assert_eq!(Fp8Format::E5m2.decode(0x01), 2f64.powi(-16));
    }

    /// The binade model against brute force (nearest finite value, ties to the even code) on a sweep.
    #[test]
    fn encode_is_nearest_even() {
        for f in [Fp8Format::E4m3, Fp8Format::E5m2] {
            let finite: Vec<(u8, f64)> = (0..=255u8).map(|c| (c, f.decode(c))).filter(|(_, x)| x.is_finite()).collect();
            for i in 0..20000 {
                let x = ((i as f64 - 10000.0) / 10000.0 * 1.1 * f.max()) as f32;
                let want = finite
                    .iter()
                    .min_by(|a, b| {
                        let (da, db) = ((a.1 - f64::from(x)).abs(), (b.1 - f64::from(x)).abs());
                        da.total_cmp(&db).then((a.0 & 1).cmp(&(b.0 & 1)))
                    })
                    .unwrap();
                assert_eq!(f.decode(f.encode(x)), want.1, "{f:?} {x}");
            }
        }
    }
}
