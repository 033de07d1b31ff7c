//! The element format of a paged case's KV cache, shared by the decode and paged-prefill harnesses: the
//! case's own 16-bit dtype, or FP8 codes with their dequantisation scales ([`KvFormat`]). An FP8 cache is the
//! 16-bit fixture's cache quantised on the host with the Rust model of [`crate::fp8`] ([`Fp8Cache`]); the
//! kernel is judged against the fp64 reference over the *stored* cache (the dequantised values, exactly
//! representable) under the usual tolerance rule, and its quantisation error against the 16-bit cache is
//! reported beside the verdict ([`QuantError`]), not judged. [`CacheElement`] and
//! [`with_cache_element!`] let one generic launch serve every format; [`GpuPaged`] is a paged fixture's data
//! on the GPU.

use std::borrow::Cow;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use crate::dtype::{DType, Element, Fp8E4m3, Fp8E5m2, Fp8Element, Fp8Format, KvCacheOf, KvDType};
use crate::error::{Error, Result};
use crate::fp8::{KvScales, ScaleKind};
use crate::paged::PagedKvCache;
use crate::reference;
use crate::tensor::TensorView;
use crate::testkit::cases::prefill::VariantViews;
use crate::testkit::variants::CaseVariants;
use crate::Stream;

/// What a case's KV cache holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvFormat {
    /// The case's 16-bit dtype (that of q and o).
    #[default]
    Sixteen,
    /// FP8 codes of `format` with `scales` (one per tensor or per KV head), quantised from the 16-bit cache.
    Fp8 { format: Fp8Format, scales: ScaleKind },
}

impl KvFormat {
    pub fn fp8(self) -> Option<(Fp8Format, ScaleKind)> {
        match self {
            KvFormat::Sixteen => None,
            KvFormat::Fp8 { format, scales } => Some((format, scales)),
        }
    }
    /// The cache's element type for queries of `dtype`.
    pub fn kv_dtype(self, dtype: DType) -> KvDType {
        match self {
            KvFormat::Sixteen => KvDType::Sixteen(dtype),
            KvFormat::Fp8 { format, .. } => KvDType::Fp8(format),
        }
    }
    /// Bytes per cache element.
    pub fn bytes(self) -> usize {
        self.kv_dtype(DType::Bf16).bytes()
    }
    /// A case's label with this format in front (FP8 only: "fp8_e4m3 per-head ...").
    pub fn label(self, case_label: String) -> String {
        match self {
            KvFormat::Sixteen => case_label,
            KvFormat::Fp8 { format, scales } => format!("{} {} {case_label}", format.name(), scales.name()),
        }
    }
}

/// A 16-bit paged cache quantised to FP8: the stored codes (laid out as the 16-bit caches, K
/// `[num_pages, page_size, Hkv, Dqk]` and V `[.., Dv]`; NaN slots hold the NaN code) and the scales.
#[derive(Debug, Clone)]
pub struct Fp8Cache {
    pub format: Fp8Format,
    pub k_codes: Vec<u8>,
    pub v_codes: Vec<u8>,
    /// One scale, or one per KV head.
    pub k_scale: Vec<f32>,
    pub v_scale: Vec<f32>,
    heads_kv: usize,
    head_dim: usize,
    head_dim_v: usize,
}

impl Fp8Cache {
    /// Quantises K (`[.., Hkv, Dqk]`) and V (`[.., Hkv, Dv]`) with the given scales ([`quantize`]).
    pub fn quantize<T: Element>(
        k: &[T],
        v: &[T],
        (hkv, d, dv): (usize, usize, usize),
        format: Fp8Format,
        k_scale: Vec<f32>,
        v_scale: Vec<f32>,
    ) -> Self {
        Self {
            k_codes: quantize(k, hkv, d, format, &k_scale),
            v_codes: quantize(v, hkv, dv, format, &v_scale),
            format,
            k_scale,
            v_scale,
            heads_kv: hkv,
            head_dim: d,
            head_dim_v: dv,
        }
    }

    /// A fixture's cache quantised with scales of `kind` taken from its values: per-tensor scales map the
    /// amax to the format's max; per-head scales leave 3% less room, so the largest values saturate, and
    /// grow with the head by `spread` (K, V: head h's scale times 1 + spread · h / (Hkv − 1); 0 = none) so
    /// that a kernel reading another head's scale fails.
    pub fn of_cache<T: Element>(
        k: &[T],
        v: &[T],
        (hkv, d, dv): (usize, usize, usize),
        (format, kind): (Fp8Format, ScaleKind),
        spread: (f32, f32),
    ) -> Self {
        let headroom = if kind == ScaleKind::PerHead { 0.97 } else { 1.0 };
        let scales = |x: &[T], d: usize, step: f32| {
            let mut s = scales_of(x, hkv, d, format, kind, headroom);
            if s.len() > 1 && step != 0.0 {
                s.iter_mut().enumerate().for_each(|(h, x)| *x *= 1.0 + step * h as f32 / (hkv - 1).max(1) as f32);
            }
            s
        };
        let (k_scale, v_scale) = (scales(k, d, spread.0), scales(v, dv, spread.1));
        Self::quantize(k, v, (hkv, d, dv), format, k_scale, v_scale)
    }

    /// The scales for a launch on `stream`'s backend.
    pub fn scales(&self, stream: &Stream<'_>) -> Result<KvScales> {
        if self.k_scale.len() == 1 {
            KvScales::per_tensor(stream, self.k_scale[0], self.v_scale[0])
        } else {
            KvScales::per_head(stream, &self.k_scale, &self.v_scale)
        }
    }

    /// The dequantised caches (what the reference reads).
    pub fn dequantized(&self) -> (Vec<f64>, Vec<f64>) {
        let hkv = self.heads_kv;
        (
            dequantize(&self.k_codes, hkv, self.head_dim, self.format, &self.k_scale),
            dequantize(&self.v_codes, hkv, self.head_dim_v, self.format, &self.v_scale),
        )
    }

    /// The stored values before scaling (the codes decoded; NaN codes NaN).
    pub fn stored(&self) -> (Vec<f64>, Vec<f64>) {
        let decoded = |codes: &[u8]| codes.iter().map(|&c| self.format.decode(c)).collect();
        (decoded(&self.k_codes), decoded(&self.v_codes))
    }

    /// The codes as the cache element type `C` (of this cache's format) for a launch.
    pub fn codes<C: Fp8Element>(&self) -> (Vec<C>, Vec<C>) {
        let typed = |codes: &[u8]| codes.iter().map(|&x| C::from_code(x)).collect();
        (typed(&self.k_codes), typed(&self.v_codes))
    }
}

/// Scales of one tensor ([pages, page_size, Hkv, D] with NaN in unused slots): amax / max of each head
/// (or of all), times `headroom` (< 1 saturates the largest values), never 0.
pub(crate) fn scales_of<T: Element>(
    x: &[T],
    hkv: usize,
    d: usize,
    format: Fp8Format,
    kind: ScaleKind,
    headroom: f64,
) -> Vec<f32> {
    let mut amax = vec![0f64; hkv];
    for (i, v) in x.iter().enumerate() {
        let v = v.to_f64();
        if v.is_finite() {
            let h = (i / d) % hkv;
            amax[h] = amax[h].max(v.abs());
        }
    }
    if kind == ScaleKind::PerTensor {
        amax = vec![amax.iter().copied().fold(0.0, f64::max)];
    }
    amax.iter().map(|&a| ((a * headroom / format.max()) as f32).max(f32::MIN_POSITIVE)).collect()
}

/// Quantises a 16-bit tensor as the append kernel defines it: `fp8_rn_satfinite(f32(x) / scale[h])`.
pub fn quantize<T: Element>(x: &[T], hkv: usize, d: usize, format: Fp8Format, scales: &[f32]) -> Vec<u8> {
    let code = |i: usize, v: T| {
        let s = scales[if scales.len() == 1 { 0 } else { (i / d) % hkv }];
        format.encode(v.to_f64() as f32 / s)
    };
    // `encode` costs ~100 ns; the timed caches (`fused-attn report`'s FP8 rows, the benches' sizes) hold
    // hundreds of millions of elements, so large inputs are quantised on every core (same codes, in order).
    let workers = if x.len() < 1 << 20 { 1 } else { std::thread::available_parallelism().map_or(1, |n| n.get()) };
    let chunk = x.len().div_ceil(workers).max(1);
    let mut out = vec![0u8; x.len()];
    std::thread::scope(|scope| {
        for (c, (xs, os)) in x.chunks(chunk).zip(out.chunks_mut(chunk)).enumerate() {
            let code = &code;
            scope.spawn(move || {
                for (j, (&v, o)) in xs.iter().zip(os).enumerate() {
                    *o = code(c * chunk + j, v);
                }
            });
        }
    });
    out
}

/// The values attention uses: `decode(code) * scale[h]` (exact in f64).
pub fn dequantize(codes: &[u8], hkv: usize, d: usize, format: Fp8Format, scales: &[f32]) -> Vec<f64> {
    codes
        .iter()
        .enumerate()
        .map(|(i, &c)| format.decode(c) * f64::from(scales[if scales.len() == 1 { 0 } else { (i / d) % hkv }]))
        .collect()
}

/// The quantisation error of an FP8 case's outputs: against the reference over the 16-bit cache it was
/// quantised from (what users care about; reported, not judged).
#[derive(Debug, Clone, Copy)]
pub struct QuantError {
    /// max |ours − reference over the 16-bit cache| and its relative L2 counterpart.
    pub max_abs_err: f64,
    pub rel_l2_err: f64,
}

impl QuantError {
    /// `ours` against `exact16`, the fp64 reference over the 16-bit cache.
    pub fn of(ours: &[f64], exact16: &[f64]) -> Self {
        let q = reference::compare(ours, exact16, exact16);
        Self { max_abs_err: q.max_abs_err, rel_l2_err: q.rel_l2_err }
    }
    /// What a verdict's summary appends (nothing for a 16-bit case).
    pub fn suffix(q: Option<Self>) -> String {
        q.map_or(String::new(), |q| {
            format!(" | vs 16-bit cache: max|err|={:.2e} rel-L2={:.2e}", q.max_abs_err, q.rel_l2_err)
        })
    }
}

/// A cache element type a case's kernel reads: the case's 16-bit dtype `T` itself, or an FP8 code type.
pub trait CacheElement<T: Element>: KvCacheOf<T> {
    /// What a layout leaves in storage no slot maps to: NaN, or the NaN code.
    fn hidden() -> Self;
    /// A fixture's K and V as this type: its 16-bit values `k16`, `v16` themselves, or the codes of its FP8
    /// cache `fp8` (which must be of this type's format).
    fn cache<'a>(k16: &'a [T], v16: &'a [T], fp8: Option<&Fp8Cache>) -> Result<[Cow<'a, [Self]>; 2]>;
}

impl<T: Element> CacheElement<T> for T {
    fn hidden() -> Self {
        T::nan()
    }
    fn cache<'a>(k16: &'a [T], v16: &'a [T], _: Option<&Fp8Cache>) -> Result<[Cow<'a, [Self]>; 2]> {
        Ok([Cow::Borrowed(k16), Cow::Borrowed(v16)])
    }
}

fn fp8_codes<C: Fp8Element + Clone>(fp8: Option<&Fp8Cache>) -> Result<[Cow<'static, [C]>; 2]> {
    match fp8 {
        Some(c) if c.format == C::FORMAT => {
            let (k, v) = c.codes::<C>();
            Ok([Cow::Owned(k), Cow::Owned(v)])
        }
        _ => Err(Error::usage(format!("a {} cache needs the fixture's {0} codes", C::FORMAT.name()))),
    }
}

impl<T: Element> CacheElement<T> for Fp8E4m3 {
    fn hidden() -> Self {
        Fp8E4m3(Fp8Format::NAN_CODE)
    }
    fn cache<'a>(_: &'a [T], _: &'a [T], fp8: Option<&Fp8Cache>) -> Result<[Cow<'a, [Self]>; 2]> {
        fp8_codes(fp8)
    }
}

impl<T: Element> CacheElement<T> for Fp8E5m2 {
    fn hidden() -> Self {
        Fp8E5m2(Fp8Format::NAN_CODE)
    }
    fn cache<'a>(_: &'a [T], _: &'a [T], fp8: Option<&Fp8Cache>) -> Result<[Cow<'a, [Self]>; 2]> {
        fp8_codes(fp8)
    }
}

/// `$run::<T, C>(args...)` with `C` the cache element type of `$fp8` (an `Option<&Fp8Cache>`): `T` itself
/// for `None`, else the code type of that cache's format. Rust closures cannot be generic, so the harnesses
/// write their launch once as a generic function and dispatch here.
macro_rules! with_cache_element {
    ($fp8:expr, $run:ident::<$t:ty>($($arg:expr),* $(,)?)) => {
        match $fp8.map(|c: &$crate::testkit::cases::kv::Fp8Cache| c.format) {
            None => $run::<$t, $t>($($arg),*),
            Some($crate::dtype::Fp8Format::E4m3) => $run::<$t, $crate::dtype::Fp8E4m3>($($arg),*),
            Some($crate::dtype::Fp8Format::E5m2) => $run::<$t, $crate::dtype::Fp8E5m2>($($arg),*),
        }
    };
}
pub(crate) use with_cache_element;

/// The paged cache over host memory: `k`, `v` (`shape` = K's `[num_pages, page_size, Hkv, Dqk]` and V's
/// `[.., Dv]`) through `block_table` (`width` columns) and `seq_lens` (the longest `max`), with the FP8
/// scales if any.
pub(crate) fn host_cache<'a, C: crate::fp8::KvElement>(
    [k, v]: [&'a [C]; 2],
    [k_shape, v_shape]: [[usize; 4]; 2],
    (block_table, width): (&'a [i32], usize),
    (seq_lens, max): (&'a [i32], usize),
    scales: Option<&'a KvScales>,
) -> Result<PagedKvCache<'a, C>> {
    let b = seq_lens.len();
    let cache = PagedKvCache::new(
        TensorView::host(k, k_shape)?,
        TensorView::host(v, v_shape)?,
        TensorView::host(block_table, [b, width])?,
        TensorView::host(seq_lens, [b])?,
        max,
    )?;
    match scales {
        Some(s) => cache.with_scales(s),
        None => Ok(cache),
    }
}

/// A paged fixture's inputs on the GPU: the cache as `C` (the 16-bit values or the FP8 codes, with their
/// scales), the block table and lengths, q, and the ALiBi slopes and sinks (one spare element each, so an
/// empty list still allocates).
pub struct GpuPaged<T: Element, C: KvCacheOf<T>> {
    pub k: CudaSlice<C>,
    pub v: CudaSlice<C>,
    pub table: CudaSlice<i32>,
    pub lens: CudaSlice<i32>,
    pub q: CudaSlice<T>,
    slopes: CudaSlice<f32>,
    sinks: CudaSlice<f32>,
    scales: Option<KvScales>,
    shape: [usize; 4],
    v_shape: [usize; 4],
    width: usize,
}

/// A paged fixture's host data, borrowed (what [`GpuPaged`] uploads and the runner's `--dump` writes): the
/// 16-bit cache and its FP8 quantisation if any (`shape` = K's `[num_pages, page_size, Hkv, Dqk]`,
/// `v_shape` = V's `[.., Dv]`), the block table (`width` columns), the lengths, q and the variant arrays.
pub struct PagedHost<'a, T> {
    pub k_cache: &'a [T],
    pub v_cache: &'a [T],
    pub fp8: Option<&'a Fp8Cache>,
    pub shape: [usize; 4],
    pub v_shape: [usize; 4],
    pub block_table: &'a [i32],
    pub width: usize,
    pub seq_lens: &'a [i32],
    /// The case's longest sequence (what the cache views are told).
    pub max_seq_len: usize,
    pub q: &'a [T],
    pub alibi_slopes: &'a [f32],
    pub sinks: &'a [f32],
}

/// The [`PagedHost`] of a paged fixture (decode's and paged prefill's have these fields by the same names).
macro_rules! paged_host {
    ($f:expr) => {
        $crate::testkit::cases::kv::PagedHost {
            k_cache: &$f.k_cache,
            v_cache: &$f.v_cache,
            fp8: $f.fp8.as_ref(),
            shape: $f.cache_shape(),
            v_shape: $f.v_cache_shape(),
            block_table: &$f.block_table,
            width: $f.width,
            seq_lens: &$f.seq_lens,
            max_seq_len: $f.case.max_seq_len(),
            q: &$f.q,
            alibi_slopes: &$f.alibi_slopes,
            sinks: &$f.sinks,
        }
    };
}
pub(crate) use paged_host;

impl<'a, T: Element> PagedHost<'a, T> {
    /// The 16-bit cache as host views (packed layout, no scales): what a test hands the ops directly.
    pub fn cache(&self) -> Result<PagedKvCache<'a, T>> {
        self.cache_of([self.k_cache, self.v_cache], None)
    }

    /// The cache values `k`, `v` (laid out as `k_cache`: e.g. the FP8 codes) through the fixture's block
    /// table and lengths as host views, with `scales` if given.
    pub fn cache_of<C: crate::fp8::KvElement>(
        &self,
        kv: [&'a [C]; 2],
        scales: Option<&'a KvScales>,
    ) -> Result<PagedKvCache<'a, C>> {
        let lens = (self.seq_lens, self.max_seq_len);
        host_cache(kv, [self.shape, self.v_shape], (self.block_table, self.width), lens, scales)
    }
}

impl<T: Element, C: CacheElement<T>> GpuPaged<T, C> {
    pub fn upload(cu: &Arc<CudaStream>, f: &PagedHost<'_, T>) -> Result<Self> {
        let [k, v] = C::cache(f.k_cache, f.v_cache, f.fp8)?;
        let spare = |x: &[f32]| x.iter().copied().chain([0.0]).collect::<Vec<_>>();
        Ok(Self {
            k: cu.clone_htod(&k[..])?,
            v: cu.clone_htod(&v[..])?,
            table: cu.clone_htod(f.block_table)?,
            lens: cu.clone_htod(f.seq_lens)?,
            q: cu.clone_htod(f.q)?,
            slopes: cu.clone_htod(&spare(f.alibi_slopes))?,
            sinks: cu.clone_htod(&spare(f.sinks))?,
            scales: f.fp8.map(|c| c.scales(&Stream::Gpu(cu))).transpose()?,
            shape: f.shape,
            v_shape: f.v_shape,
            width: f.width,
        })
    }

    /// The cache's views (with its scales), `max_seq_len` its longest sequence.
    pub fn cache(&self, max_seq_len: usize) -> Result<PagedKvCache<'_, C>> {
        let b = self.lens.len();
        let cache = PagedKvCache::new(
            TensorView::gpu(self.k.as_view(), self.shape)?,
            TensorView::gpu(self.v.as_view(), self.v_shape)?,
            TensorView::gpu(self.table.as_view(), [b, self.width])?,
            TensorView::gpu(self.lens.as_view(), [b])?,
            max_seq_len,
        )?;
        match &self.scales {
            Some(s) => cache.with_scales(s),
            None => Ok(cache),
        }
    }

    /// The views of the case's slopes and sinks.
    pub(crate) fn variants(&self, v: &CaseVariants, batch: usize, heads_q: usize) -> Result<VariantViews<'_>> {
        let (slopes, sinks) = (&self.slopes, &self.sinks);
        VariantViews::new(v, batch, heads_q, |sink, n| {
            TensorView::gpu((if sink { sinks } else { slopes }).slice(0..n), [n])
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    #[test]
    fn parallel_quantize_is_the_elementwise_definition() {
        // Past the parallel threshold, with per-head scales whose head index crosses the chunk boundaries.
        let (hkv, d, n) = (3, 16, (1 << 20) + 37);
        let x: Vec<bf16> = (0..n).map(|i| bf16::from_f64(((i * 7919) % 2001) as f64 / 100.0 - 10.0)).collect();
        let scales = [0.01f32, 0.02, 0.05];
        let codes = quantize(&x, hkv, d, Fp8Format::E4m3, &scales);
        assert_eq!(codes.len(), n);
        for (i, (&v, &c)) in x.iter().zip(&codes).enumerate() {
            assert_eq!(c, Fp8Format::E4m3.encode(v.to_f64() as f32 / scales[(i / d) % hkv]), "element {i}");
        }
    }
}
