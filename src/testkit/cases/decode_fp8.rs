//! Decode over an FP8 cache (issue 17): the cases, the fixture (the 16-bit fixture of [`super::decode`],
//! quantised on the host with the Rust model of [`crate::fp8`]) and the verdict. The kernel is judged against
//! the fp64 reference over the *stored* cache (the dequantised values, exactly representable), under the
//! usual tolerance rule; the quantisation error against the 16-bit cache is reported beside it (what users
//! care about), not judged.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use half::{bf16, f16};

use super::decode::{
    decode_bytes, evaluate_kv, to_f64, CaseOutcome, DecodeCase, DecodeTiming, GpuCase, PagedFixture, SWEEP_HEADS,
    SWEEP_SPLITS,
};
use crate::decode::{decode, DecodeWorkspace};
use crate::dtype::{DType, Element};
use crate::emu::Emulator;
use crate::error::Result;
use crate::fp8::{Fp8E4m3, Fp8E5m2, Fp8Element, Fp8Format, KvCacheOf, KvScales, ScaleKind};
use crate::paged::PagedKvCache;
use crate::plan::DecodePlan;
use crate::reference;
use crate::tensor::{TensorView, TensorViewMut};
use crate::testkit::cases::prefill::VariantViews;
use crate::testkit::timing::time_launches;
use crate::testkit::variants::{CaseAlibi, CaseVariants};
use crate::Stream;

/// A decode case over an FP8 cache.
#[derive(Debug, Clone, PartialEq)]
pub struct Fp8DecodeCase {
    /// Shape, 16-bit dtype (of q, o and the cache before quantisation), splits and variants.
    pub base: DecodeCase,
    pub format: Fp8Format,
    pub scales: ScaleKind,
}

impl Fp8DecodeCase {
    pub fn label(&self) -> String {
        format!("{} {} {}", self.format.name(), self.scales.name(), self.base.label())
    }
}

/// The emulated FP8 sweep: both formats x both scale kinds x both dtypes, every page size 1..256, head dims
/// 64/128/256, MHA/GQA/MQA layouts, forced and planned splits, and the score variants (window, softcap,
/// ALiBi, sinks) on some; 16 cases of a short batch (empty, 1, a page/tile edge, a few hundred tokens).
pub fn fp8_decode_sweep_emulated() -> Vec<Fp8DecodeCase> {
    let page_sizes = [1, 8, 16, 32, 64, 128, 256, 4];
    let variants = [
        CaseVariants::default(),
        CaseVariants { softcap: Some(3.0), ..Default::default() },
        CaseVariants { window: Some((100, 0)), sinks: true, ..Default::default() },
        CaseVariants { alibi: CaseAlibi::PerHead, ..Default::default() },
    ];
    (0..16)
        .map(|i| Fp8DecodeCase {
            base: DecodeCase {
                dtype: [DType::F16, DType::Bf16][(i / 2) % 2],
                head_dim: [64, 128, 256][i % 3],
                heads_q: SWEEP_HEADS[i % 4].0,
                heads_kv: SWEEP_HEADS[i % 4].1,
                page_size: page_sizes[i % 8],
                seq_lens: vec![0, 1, 33, 300],
                num_splits: SWEEP_SPLITS[(i / 3) % 4],
                variants: if i % 4 == 3 { variants[(i / 4) % 4] } else { CaseVariants::default() },
                rope: None,
            },
            format: [Fp8Format::E4m3, Fp8Format::E5m2][i % 2],
            scales: [ScaleKind::PerTensor, ScaleKind::PerHead][(i / 4) % 2],
        })
        .collect()
}

/// A 16-bit paged cache quantised to FP8 (shared by the decode and paged prefill FP8 fixtures): the stored
/// codes (laid out as the 16-bit cache `[num_pages, page_size, Hkv, D]`; NaN slots hold the NaN code) and
/// the scales.
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
}

impl Fp8Cache {
    /// Quantises K and V (`[.., Hkv, D]`) with the given scales ([`quantize`]).
    pub fn quantize<T: Element>(
        k: &[T],
        v: &[T],
        (hkv, d): (usize, usize),
        format: Fp8Format,
        k_scale: Vec<f32>,
        v_scale: Vec<f32>,
    ) -> Self {
        Self {
            k_codes: quantize(k, hkv, d, format, &k_scale),
            v_codes: quantize(v, hkv, d, format, &v_scale),
            format,
            k_scale,
            v_scale,
            heads_kv: hkv,
            head_dim: d,
        }
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
        let (hkv, d) = (self.heads_kv, self.head_dim);
        (
            dequantize(&self.k_codes, hkv, d, self.format, &self.k_scale),
            dequantize(&self.v_codes, hkv, d, self.format, &self.v_scale),
        )
    }

    /// The codes as the cache element type `C` (of this cache's format) for a launch.
    pub fn codes<C: Fp8Element>(&self) -> (Vec<C>, Vec<C>) {
        let typed = |codes: &[u8]| codes.iter().map(|&x| C::from_code(x)).collect();
        (typed(&self.k_codes), typed(&self.v_codes))
    }
}

/// The FP8 fixture: the 16-bit fixture it was quantised from and its FP8 cache.
#[derive(Debug, Clone)]
pub struct Fp8Fixture<T> {
    pub sixteen: PagedFixture<T>,
    pub fp8: Fp8Cache,
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

impl<T: Element> Fp8Fixture<T> {
    /// The 16-bit fixture of `case.base` from `seed`, quantised. Per-tensor scales map the amax to the
    /// format's max; per-head scales leave 3% less room, so the largest values saturate.
    pub fn new(case: &Fp8DecodeCase, seed: u64) -> Result<Self> {
        let sixteen = PagedFixture::<T>::new(&case.base, seed)?;
        let (hkv, d, f) = (case.base.heads_kv, case.base.head_dim, case.format);
        let headroom = if case.scales == ScaleKind::PerHead { 0.97 } else { 1.0 };
        let k_scale = scales_of(&sixteen.k_cache, hkv, d, f, case.scales, headroom);
        let v_scale = scales_of(&sixteen.v_cache, hkv, d, f, case.scales, headroom);
        let fp8 = Fp8Cache::quantize(&sixteen.k_cache, &sixteen.v_cache, (hkv, d), f, k_scale, v_scale);
        Ok(Self { sixteen, fp8 })
    }
}

/// The verdict on one FP8 case: against the stored cache (judged), and the quantisation error against the
/// 16-bit cache (reported).
#[derive(Debug, Clone)]
pub struct Fp8Outcome {
    pub outcome: CaseOutcome,
    /// max |ours − reference over the 16-bit cache| and its relative L2 counterpart.
    pub quant_max_abs_err: f64,
    pub quant_rel_l2_err: f64,
}

impl Fp8Outcome {
    pub fn passed(&self) -> bool {
        self.outcome.passed()
    }
    pub fn summary(&self) -> String {
        format!(
            "{} | vs 16-bit cache: max|err|={:.2e} rel-L2={:.2e}",
            self.outcome.summary(),
            self.quant_max_abs_err,
            self.quant_rel_l2_err
        )
    }
}

/// One judged FP8 run with its data.
#[derive(Debug, Clone)]
pub struct Fp8DecodeRun<T> {
    pub fixture: Fp8Fixture<T>,
    pub o: Vec<T>,
    pub lse: Vec<f32>,
    pub outcome: Fp8Outcome,
}

fn judge<T: Element>(f: &Fp8Fixture<T>, seed: u64, plan: DecodePlan, o: &[T], lse: &[f32]) -> Result<Fp8Outcome> {
    let (k, v) = f.fp8.dequantized();
    let outcome = evaluate_kv(&f.sixteen, &k, &v, seed, plan, o, lse)?;
    // The quantisation error: the same outputs against attention over the 16-bit cache.
    let s = &f.sixteen;
    let (exact16, _) = s.reference_kv(&to_f64(&s.k_cache), &to_f64(&s.v_cache))?;
    let q = reference::compare(&to_f64(o), &exact16.out, &exact16.out);
    Ok(Fp8Outcome { outcome, quant_max_abs_err: q.max_abs_err, quant_rel_l2_err: q.rel_l2_err })
}

/// Runs an FP8 case on the emulator (outputs poisoned with NaN) and judges it.
pub fn check_fp8_case_emulated(emu: &Emulator, case: &Fp8DecodeCase, seed: u64) -> Result<Fp8Outcome> {
    match case.base.dtype {
        DType::F16 => run_fp8_case_emulated::<f16>(emu, case, seed).map(|r| r.outcome),
        DType::Bf16 => run_fp8_case_emulated::<bf16>(emu, case, seed).map(|r| r.outcome),
    }
}

/// [`check_fp8_case_emulated`] for a static element type, handing back the data too.
pub fn run_fp8_case_emulated<T: Element>(emu: &Emulator, case: &Fp8DecodeCase, seed: u64) -> Result<Fp8DecodeRun<T>> {
    let f = Fp8Fixture::<T>::new(case, seed)?;
    let (o, lse, plan) = match case.format {
        Fp8Format::E4m3 => decode_fp8::<T, Fp8E4m3>(&Stream::Emu(emu), &f)?,
        Fp8Format::E5m2 => decode_fp8::<T, Fp8E5m2>(&Stream::Emu(emu), &f)?,
    };
    let outcome = judge(&f, seed, plan, &o, &lse)?;
    Ok(Fp8DecodeRun { fixture: f, o, lse, outcome })
}

/// Runs an FP8 case on the GPU behind `cu` and judges it (the data comes back for bitwise comparisons).
pub fn run_fp8_case_gpu<T: Element>(cu: &Arc<CudaStream>, case: &Fp8DecodeCase, seed: u64) -> Result<Fp8DecodeRun<T>> {
    let f = Fp8Fixture::<T>::new(case, seed)?;
    let (o, lse, plan) = match case.format {
        Fp8Format::E4m3 => decode_fp8::<T, Fp8E4m3>(&Stream::Gpu(cu), &f)?,
        Fp8Format::E5m2 => decode_fp8::<T, Fp8E5m2>(&Stream::Gpu(cu), &f)?,
    };
    let outcome = judge(&f, seed, plan, &o, &lse)?;
    Ok(Fp8DecodeRun { fixture: f, o, lse, outcome })
}

/// Decodes fixture `f` from its FP8 codes on `stream` (the emulator, or a GPU stream: then uploaded first);
/// returns o, lse and the plan.
pub fn decode_fp8<T: Element, C: Fp8Element + KvCacheOf<T>>(
    stream: &Stream<'_>,
    f: &Fp8Fixture<T>,
) -> Result<(Vec<T>, Vec<f32>, DecodePlan)> {
    if let Stream::Gpu(cu) = stream {
        let mut g = upload::<T, C>(cu, f)?;
        let plan = g.run(cu, &f.sixteen)?;
        return Ok((cu.clone_dtoh(&g.o)?, cu.clone_dtoh(&g.lse)?, plan));
    }
    let s = &f.sixteen;
    let c = &s.case;
    let (b, hq, d) = (c.batch(), c.heads_q, c.head_dim);
    let shape = s.cache_shape();
    let (k, v) = f.fp8.codes::<C>();
    let scales = f.fp8.scales(stream)?;
    let cache = PagedKvCache::new(
        TensorView::host(&k, shape)?,
        TensorView::host(&v, shape)?,
        TensorView::host(&s.block_table, [b, s.width])?,
        TensorView::host(&s.seq_lens, [b])?,
        c.max_seq_len(),
    )?
    .with_scales(&scales)?;
    let variants = VariantViews::new(&c.variants, b, hq, |sinks, n| {
        TensorView::host(&(if sinks { &s.sinks } else { &s.alibi_slopes })[..n], [n])
    })?;
    let rope_views = s.rope_views_host()?;
    let opts = s.options(&variants, rope_views.as_ref());
    let plan = DecodeWorkspace::new(stream, 0, 0)?.plan(&c.problem(), &opts)?;
    let mut ws = DecodeWorkspace::for_plan(stream, &plan)?;
    let mut o = vec![T::nan(); b * hq * d];
    let mut lse = vec![f32::NAN; b * hq];
    decode(
        stream,
        &TensorView::host(&s.q, [b, hq, d])?,
        &cache,
        &mut TensorViewMut::host(&mut o, [b, hq, d])?,
        Some(&mut TensorViewMut::host(&mut lse, [b, hq])?),
        &mut ws,
        &opts,
    )?;
    Ok((o, lse, plan))
}

/// Uploads fixture `f` with its FP8 codes as `C` and its scales.
fn upload<T: Element, C: Fp8Element + KvCacheOf<T>>(cu: &Arc<CudaStream>, f: &Fp8Fixture<T>) -> Result<GpuCase<T, C>> {
    let (k, v) = f.fp8.codes::<C>();
    GpuCase::upload(cu, &f.sixteen, &k, &v, Some(f.fp8.scales(&Stream::Gpu(cu))?))
}

/// Bytes an FP8 decode moves: [`decode_bytes`] with K and V at one byte per element, plus the scales.
pub fn fp8_decode_bytes(case: &Fp8DecodeCase, plan: &DecodePlan) -> usize {
    decode_bytes(&case.base, plan) - case.base.kv_bytes() / 2 + 2 * 4 * case.base.heads_kv
}

/// GPU timing of an FP8 case (decode + merge when split), as [`super::decode::time_case_gpu`].
pub fn time_fp8_case_gpu(
    cu: &Arc<CudaStream>,
    case: &Fp8DecodeCase,
    seed: u64,
    warmup: usize,
    iters: usize,
) -> Result<DecodeTiming> {
    fn go<T: Element, C: Fp8Element + KvCacheOf<T>>(
        cu: &Arc<CudaStream>,
        case: &Fp8DecodeCase,
        seed: u64,
        warmup: usize,
        iters: usize,
    ) -> Result<DecodeTiming> {
        let f = Fp8Fixture::<T>::new(case, seed)?;
        let mut g = upload::<T, C>(cu, &f)?;
        let plan = g.plan;
        let timing = time_launches(cu, warmup, iters, |_| g.run(cu, &f.sixteen).map(|_| ()))?;
        let bytes = fp8_decode_bytes(case, &plan);
        Ok(DecodeTiming { timing, plan, bytes, gbps: bytes as f64 / (timing.median_ms * 1e-3) / 1e9 })
    }
    match (case.base.dtype, case.format) {
        (DType::F16, Fp8Format::E4m3) => go::<f16, Fp8E4m3>(cu, case, seed, warmup, iters),
        (DType::F16, Fp8Format::E5m2) => go::<f16, Fp8E5m2>(cu, case, seed, warmup, iters),
        (DType::Bf16, Fp8Format::E4m3) => go::<bf16, Fp8E4m3>(cu, case, seed, warmup, iters),
        (DType::Bf16, Fp8Format::E5m2) => go::<bf16, Fp8E5m2>(cu, case, seed, warmup, iters),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
