//! FP8 KV cache: the dequantisation scales of an FP8 paged cache and their checks. The element types and the
//! scalar model of the conversions, written independently of the kernels' (kernels/include/fa/fp8_model.cuh)
//! and against which the tests check the emulator and the GPU bit for bit, are in [`crate::dtype`] (the
//! element types' one module) and re-exported here.
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
pub use crate::dtype::{Fp8E4m3, Fp8E5m2, Fp8Element, Fp8Format, KvCacheOf, KvDType, KvElement};
use crate::error::{Error, ErrorKind, Result};
use crate::launch::Launch;
use crate::sys;
use crate::tensor::TensorView;

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

/// Checks host-given scales: every one finite and > 0 (else `Unsupported`, naming `name[i]`).
pub(crate) fn check_scale_values(name: &str, scales: &[f32]) -> Result<()> {
    match scales.iter().enumerate().find(|(_, x)| !(x.is_finite() && **x > 0.0)) {
        Some((i, x)) => Err(Error::unsupported(name, format!("[{i}] = {x} (scales must be finite and > 0)"))),
        None => Ok(()),
    }
}

/// The dequantisation scales of an FP8 cache as its launches read them: two fp32 tensors in the memory of the
/// cache's backend (device memory on a GPU — a cudarc view or a raw device pointer —, host slices on the
/// emulator), K's and V's, each `[1]` (one scale per tensor) or `[Hkv]` (one per KV head), both the same
/// length. They are borrowed like the pages and never read by the host: the kernels load them at run time,
/// so values an engine writes between launches (or between replays of a CUDA graph) are the ones used, and
/// values the host cannot check are the caller's (docs/semantics.md, "FP8 cache": a scale that is not
/// finite and > 0 leaves its KV head's outputs unspecified and nothing else). Attach them with
/// [`crate::PagedKvCache::with_scale_tensors`] / [`crate::PagedKvCacheMut::with_scale_tensors`].
#[derive(Clone)]
pub struct ScaleTensors<'a> {
    k: TensorView<'a, f32, 1>,
    v: TensorView<'a, f32, 1>,
}

impl<'a> ScaleTensors<'a> {
    /// Checks `k_scale` / `v_scale` for a cache of `heads_kv` KV heads whose pages are GPU memory or not
    /// (`pages_on_gpu`): each `[1]` or `[Hkv]` and the same length (else `Shape`), contiguous (else `Layout`),
    /// on the pages' backend (else `Backend`). Alignment (4 bytes) is checked by the launch.
    pub(crate) fn new(
        k: TensorView<'a, f32, 1>,
        v: TensorView<'a, f32, 1>,
        heads_kv: usize,
        pages_on_gpu: bool,
    ) -> Result<Self> {
        let n = k.dim(0);
        if n != 1 && n != heads_kv {
            return Err(Error::shape(
                "k_scale",
                format!("length {n} for a cache of {heads_kv} KV heads (one scale per tensor, or one per KV head)"),
            ));
        }
        v.check_index_vector("v_scale", n, || format!("differs from k_scale's {n} (K and V take the same count)"))?;
        k.check_index_vector("k_scale", n, String::new)?;
        for (name, t) in [("k_scale", &k), ("v_scale", &v)] {
            if t.is_gpu() != pages_on_gpu {
                return Err(Error::backend(name, "must be memory of the cache pages' backend"));
            }
        }
        Ok(Self { k, v })
    }

    /// One scale per tensor or one per KV head (a single KV head's one scale counts as per tensor).
    pub fn kind(&self) -> ScaleKind {
        if self.k.dim(0) == 1 {
            ScaleKind::PerTensor
        } else {
            ScaleKind::PerHead
        }
    }
    /// The K scales, `[1]` or `[Hkv]`.
    pub fn k(&self) -> &TensorView<'a, f32, 1> {
        &self.k
    }
    /// The V scales, as many as K's.
    pub fn v(&self) -> &TensorView<'a, f32, 1> {
        &self.v
    }
}

/// The dequantisation scales of an FP8 cache (K and V separately) given as host floats: validated (each
/// finite and > 0, else `Unsupported`) and uploaded once on creation (engines with calibrated static scales), then
/// attached with [`crate::PagedKvCache::with_scales`] / [`crate::PagedKvCacheMut::with_scales`], which read
/// them as [`ScaleTensors`] of this buffer. Scales an engine keeps in its own device memory (computed at run
/// time, on a raw stream) go to `with_scale_tensors` directly.
pub struct KvScales {
    k: Vec<f32>,
    v: Vec<f32>,
    /// `[k..., v...]` where the kernels read it.
    mem: ScaleMem,
}

enum ScaleMem {
    Host(Vec<f32>),
    Gpu(CudaSlice<f32>),
}

/// `scales[h]`, or the one per-tensor scale, else `OutOfBounds` naming `arg`.
fn scale_of(arg: &str, scales: &[f32], h: usize) -> Result<f32> {
    match scales {
        [one] => Ok(*one),
        _ => scales
            .get(h)
            .copied()
            .ok_or_else(|| Error::out_of_bounds(arg, format!("KV head {h} of {} per-head scales", scales.len()))),
    }
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
        check_scale_values("k_scale", k)?;
        check_scale_values("v_scale", v)?;
        let all: Vec<f32> = k.iter().chain(v).copied().collect();
        let mem = match stream {
            Stream::Gpu(s) => ScaleMem::Gpu(s.clone_htod(&all)?),
            Stream::Emu(_) => ScaleMem::Host(all),
            Stream::Raw(_) => {
                return Err(Error::new(
                    ErrorKind::Usage,
                    "KvScales cannot upload on a raw stream (fused-attn allocates nothing there): keep the scales \
                     in your device memory and attach them with with_scale_tensors (TensorView::from_device_ptr)",
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
    /// K scale of KV head h (a per-tensor scale serves every head); `OutOfBounds` naming `h` past the heads.
    pub fn k_of(&self, h: usize) -> Result<f32> {
        scale_of("h", &self.k, h)
    }
    /// V scale of KV head h, as [`KvScales::k_of`].
    pub fn v_of(&self, h: usize) -> Result<f32> {
        scale_of("h", &self.v, h)
    }

    /// The K and V scales as views of the uploaded buffer.
    pub(crate) fn views(&self) -> Result<(TensorView<'_, f32, 1>, TensorView<'_, f32, 1>)> {
        let n = self.k.len();
        match &self.mem {
            ScaleMem::Host(h) => Ok((TensorView::host(&h[..n], [n])?, TensorView::host(&h[n..], [n])?)),
            ScaleMem::Gpu(g) => Ok((TensorView::gpu(g.slice(0..n), [n])?, TensorView::gpu(g.slice(n..2 * n), [n])?)),
        }
    }
}

/// Sets the FP8 fields of an FaPagedCache for a cache of `kv` elements: the dtype tag and, for FP8, the scale
/// pointers, taken into `launch` as its inputs `k_scale` / `v_scale` (fp32, 4-byte aligned).
pub(crate) fn fill_abi<'l>(
    cache: &mut sys::FaPagedCache,
    kv: KvDType,
    scales: Option<&'l ScaleTensors<'_>>,
    launch: &mut Launch<'l>,
) -> Result<()> {
    match (kv.fp8(), scales) {
        (Some(f), Some(s)) => {
            cache.kv_dtype = f.abi();
            cache.scale_head_stride = i32::from(s.kind() == ScaleKind::PerHead);
            cache.k_scale = launch.input(c"k_scale", &s.k, 4)?.cast();
            cache.v_scale = launch.input(c"v_scale", &s.v, 4)?.cast();
        }
        _ => cache.kv_dtype = sys::FA_KV_SAME as i32,
    }
    Ok(())
}

/// Checks that a cache of `C` elements serves an op on `T` (`op` names it in the error): a 16-bit cache of
/// the same dtype without scales, or an FP8 cache with them (their count was checked when attached).
pub(crate) fn check_cache_dtype<C: KvElement>(dtype: DType, has_scales: bool) -> Result<()> {
    match C::KV_DTYPE {
        KvDType::Sixteen(d) if d != dtype => Err(Error::shape(
            "k_cache",
            format!("element type {} differs from the queries' / new tokens' {}", d.name(), dtype.name()),
        )),
        KvDType::Sixteen(_) if has_scales => {
            Err(Error::unsupported("k_scale", "dequantisation scales apply to FP8 caches only"))
        }
        KvDType::Sixteen(_) => Ok(()),
        KvDType::Fp8(f) if !has_scales => Err(Error::shape(
            "k_scale",
            format!(
                "an {} cache needs its dequantisation scales (PagedKvCache::with_scales / with_scale_tensors)",
                f.name()
            ),
        )),
        KvDType::Fp8(_) => Ok(()),
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
