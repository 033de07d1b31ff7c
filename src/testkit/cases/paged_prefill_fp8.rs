//! Paged prefill over an FP8 cache (issue 17): the cases, the fixture (the 16-bit fixture of [`super::paged_prefill`]
//! quantised on the host with the Rust model of [`crate::fp8`], as decode's [`crate::testkit::cases::decode_fp8`]) and
//! the verdict. The kernel is judged against the fp64 reference over the *stored* cache (the dequantised
//! values) under the usual tolerance rule; the quantisation error against the 16-bit cache is reported beside
//! it and bounded by the tests, not judged here.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use half::{bf16, f16};

use super::paged_prefill::{case, GpuCase, PagedPrefillCase, PagedPrefillFixture, PagedPrefillOutcome};
use crate::dtype::{DType, Element};
use crate::emu::Emulator;
use crate::error::Result;
use crate::fp8::{Fp8E4m3, Fp8E5m2, Fp8Element, Fp8Format, KvCacheOf, ScaleKind};
use crate::paged::PagedKvCache;
use crate::paged_prefill::PagedPrefillPlan;
use crate::reference;
use crate::tensor::TensorView;
use crate::testkit::cases::decode_fp8::{scales_of, Fp8Cache};
use crate::testkit::timing::time_launches;
use crate::testkit::variants::{CaseAlibi, CaseVariants};
use crate::Stream;

/// A paged prefill case over an FP8 cache.
#[derive(Debug, Clone, PartialEq)]
pub struct Fp8PagedPrefillCase {
    /// Shape, 16-bit dtype (of q, o and the cache before quantisation), splits and variants.
    pub base: PagedPrefillCase,
    pub format: Fp8Format,
    pub scales: ScaleKind,
}

impl Fp8PagedPrefillCase {
    pub fn label(&self) -> String {
        format!("{} {} {}", self.format.name(), self.scales.name(), self.base.label())
    }
}

/// The emulated FP8 sweep: both formats x both scale kinds x both dtypes, page sizes 1..256, every
/// instantiated width (32..256), GQA groups 1..8, q_len 1..300 (short chunks packed into one CTA and a
/// multi-block chunk), an empty sequence, a q_len > seq_len one, forced and planned splits, a shared prefix,
/// and softcap / ALiBi / window + sinks on some. Sized for CI (a few seconds).
pub fn fp8_paged_prefill_sweep_emulated() -> Vec<Fp8PagedPrefillCase> {
    let with = |mut c: PagedPrefillCase, dtype: DType, format: Fp8Format, scales: ScaleKind| {
        c.dtype = dtype;
        Fp8PagedPrefillCase { base: c, format, scales }
    };
    let (e4, e5) = (Fp8Format::E4m3, Fp8Format::E5m2);
    let (pt, ph) = (ScaleKind::PerTensor, ScaleKind::PerHead);
    let mut split = case(64, (8, 2), 16, &[(5, 700), (17, 300), (0, 100), (1, 1)]);
    split.num_splits = Some(3);
    let mut shared = case(128, (4, 2), 8, &[(5, 40), (3, 24)]);
    shared.shared_prefix = 24;
    let mut softcap = case(64, (4, 1), 32, &[(5, 90), (17, 40), (3, 0)]);
    softcap.variants = CaseVariants { softcap: Some(5.0), ..Default::default() };
    softcap.num_splits = Some(2);
    let mut alibi = case(128, (8, 2), 16, &[(5, 90), (1, 1)]);
    alibi.variants = CaseVariants { alibi: CaseAlibi::PerHead, ..Default::default() };
    let mut window = case(64, (4, 2), 64, &[(17, 90), (2, 40)]);
    window.variants = CaseVariants { window: Some((20, 0)), sinks: true, ..Default::default() };
    vec![
        with(case(64, (4, 4), 1, &[(1, 1), (2, 9), (5, 5)]), DType::Bf16, e4, pt),
        with(case(128, (8, 1), 256, &[(2, 300), (5, 3)]), DType::F16, e5, ph),
        with(case(32, (4, 2), 4, &[(200, 200)]), DType::Bf16, e5, pt),
        with(case(96, (6, 3), 16, &[(17, 90), (2, 2)]), DType::F16, e4, ph),
        with(case(256, (8, 2), 16, &[(5, 80), (9, 9), (1, 33)]), DType::Bf16, e4, ph),
        with(case(48, (4, 1), 128, &[(16, 130), (3, 60)]), DType::F16, e5, pt),
        with(split, DType::Bf16, e5, ph),
        with(shared, DType::F16, e4, pt),
        with(softcap, DType::Bf16, e4, ph),
        with(alibi, DType::F16, e5, pt),
        with(window, DType::Bf16, e5, ph),
        with(case(128, (4, 2), 32, &[(300, 400), (2, 50)]), DType::Bf16, e4, ph),
    ]
}

/// The FP8 fixture: the 16-bit fixture it was quantised from and its FP8 cache.
pub struct Fp8PagedPrefillFixture<T> {
    pub sixteen: PagedPrefillFixture<T>,
    pub fp8: Fp8Cache,
}

impl<T: Element> Fp8PagedPrefillFixture<T> {
    /// The 16-bit fixture of `case.base` from `seed`, quantised. Per-tensor scales map the amax to the
    /// format's max; per-head scales leave 3% less room, so the largest values saturate, and grow with the
    /// head (x1 .. x2.5, K and V differently) so that a kernel reading another head's scale fails.
    pub fn new(case: &Fp8PagedPrefillCase, seed: u64) -> Self {
        let sixteen = PagedPrefillFixture::<T>::new(&case.base, seed);
        let (hkv, d, f) = (case.base.heads_kv, case.base.head_dim, case.format);
        let headroom = if case.scales == ScaleKind::PerHead { 0.97 } else { 1.0 };
        let spread = |mut s: Vec<f32>, step: f32| {
            if s.len() > 1 {
                s.iter_mut().enumerate().for_each(|(h, x)| *x *= 1.0 + step * h as f32 / (hkv - 1).max(1) as f32);
            }
            s
        };
        let k_scale = spread(scales_of(&sixteen.k_cache, hkv, d, f, case.scales, headroom), 1.5);
        let v_scale = spread(scales_of(&sixteen.v_cache, hkv, d, f, case.scales, headroom), 0.75);
        let fp8 = Fp8Cache::quantize(&sixteen.k_cache, &sixteen.v_cache, (hkv, d), f, k_scale, v_scale);
        Self { sixteen, fp8 }
    }

    /// Runs the kernel over the FP8 codes on `stream` (host memory: the emulator), outputs NaN-poisoned;
    /// `num_splits` overrides the case's.
    pub fn run<C: Fp8Element + KvCacheOf<T>>(
        &self,
        stream: &Stream<'_>,
        num_splits: Option<usize>,
    ) -> Result<(Vec<T>, Vec<f32>, PagedPrefillPlan)> {
        let s = &self.sixteen;
        let b = s.case.batch();
        let (k, v) = self.fp8.codes::<C>();
        let scales = self.fp8.scales(stream)?;
        let cache = PagedKvCache::new(
            TensorView::host(&k, s.cache_shape())?,
            TensorView::host(&v, s.cache_shape())?,
            TensorView::host(&s.block_table, [b, s.width])?,
            TensorView::host(&s.seq_lens, [b])?,
            s.case.max_seq_len(),
        )?
        .with_scales(&scales)?;
        s.run_on(stream, &cache, num_splits)
    }

    /// [`Self::run`] with the code type of the fixture's format.
    pub fn run_format(
        &self,
        stream: &Stream<'_>,
        num_splits: Option<usize>,
    ) -> Result<(Vec<T>, Vec<f32>, PagedPrefillPlan)> {
        match self.fp8.format {
            Fp8Format::E4m3 => self.run::<Fp8E4m3>(stream, num_splits),
            Fp8Format::E5m2 => self.run::<Fp8E5m2>(stream, num_splits),
        }
    }
}

/// The verdict on one FP8 case: against the stored cache (judged), and the quantisation error against the
/// 16-bit cache (reported).
#[derive(Debug, Clone)]
pub struct Fp8PagedPrefillOutcome {
    pub outcome: PagedPrefillOutcome,
    /// max |ours − reference over the 16-bit cache| and its relative L2 counterpart.
    pub quant_max_abs_err: f64,
    pub quant_rel_l2_err: f64,
}

impl Fp8PagedPrefillOutcome {
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
pub struct Fp8PagedPrefillRun<T> {
    pub fixture: Fp8PagedPrefillFixture<T>,
    pub o: Vec<T>,
    pub lse: Vec<f32>,
    pub outcome: Fp8PagedPrefillOutcome,
}

/// Judges outputs of fixture `f`: against the reference over the dequantised cache (the tolerance rule),
/// and the quantisation error against the reference over the 16-bit cache.
pub fn judge<T: Element>(
    f: &Fp8PagedPrefillFixture<T>,
    seed: u64,
    plan: PagedPrefillPlan,
    o: &[T],
    lse: &[f32],
) -> Result<Fp8PagedPrefillOutcome> {
    let (k, v) = f.fp8.dequantized();
    let (exact, naive) = f.sixteen.reference_kv(&k, &v)?;
    let ours: Vec<f64> = o.iter().map(|x| x.to_f64()).collect();
    let ours_lse: Vec<f64> = lse.iter().map(|&x| f64::from(x)).collect();
    let outcome = PagedPrefillOutcome {
        seed,
        plan,
        out: reference::compare(&ours, &exact.out, &naive),
        lse: reference::compare_lse(&ours_lse, &exact.lse, crate::testkit::cases::decode::lse_tolerance(&exact.lse)),
    };
    let (exact16, _) = f.sixteen.reference()?;
    let q = reference::compare(&ours, &exact16.out, &exact16.out);
    Ok(Fp8PagedPrefillOutcome { outcome, quant_max_abs_err: q.max_abs_err, quant_rel_l2_err: q.rel_l2_err })
}

/// Runs an FP8 case on the emulator (outputs poisoned with NaN) and judges it, handing back the data.
pub fn run_fp8_case_emulated<T: Element>(
    emu: &Emulator,
    case: &Fp8PagedPrefillCase,
    seed: u64,
) -> Result<Fp8PagedPrefillRun<T>> {
    let f = Fp8PagedPrefillFixture::<T>::new(case, seed);
    let (o, lse, plan) = f.run_format(&Stream::Emu(emu), None)?;
    let outcome = judge(&f, seed, plan, &o, &lse)?;
    Ok(Fp8PagedPrefillRun { fixture: f, o, lse, outcome })
}

/// [`run_fp8_case_emulated`] for the case's dtype, the verdict only.
pub fn check_fp8_case_emulated(
    emu: &Emulator,
    case: &Fp8PagedPrefillCase,
    seed: u64,
) -> Result<Fp8PagedPrefillOutcome> {
    match case.base.dtype {
        DType::F16 => run_fp8_case_emulated::<f16>(emu, case, seed).map(|r| r.outcome),
        DType::Bf16 => run_fp8_case_emulated::<bf16>(emu, case, seed).map(|r| r.outcome),
    }
}

/// Runs an FP8 case on the GPU behind `cu` (outputs poisoned with NaN) and judges it.
pub fn run_fp8_case_gpu<T: Element>(
    cu: &Arc<CudaStream>,
    case: &Fp8PagedPrefillCase,
    seed: u64,
) -> Result<Fp8PagedPrefillRun<T>> {
    fn go<T: Element, C: Fp8Element + KvCacheOf<T>>(
        cu: &Arc<CudaStream>,
        f: &Fp8PagedPrefillFixture<T>,
    ) -> Result<(Vec<T>, Vec<f32>, PagedPrefillPlan)> {
        let mut g = upload::<T, C>(cu, f)?;
        let plan = g.run(cu, &f.sixteen)?;
        let (o, lse) = g.outputs(cu, &f.sixteen.case)?;
        Ok((o, lse, plan))
    }
    let f = Fp8PagedPrefillFixture::<T>::new(case, seed);
    let (o, lse, plan) = match case.format {
        Fp8Format::E4m3 => go::<T, Fp8E4m3>(cu, &f)?,
        Fp8Format::E5m2 => go::<T, Fp8E5m2>(cu, &f)?,
    };
    let outcome = judge(&f, seed, plan, &o, &lse)?;
    Ok(Fp8PagedPrefillRun { fixture: f, o, lse, outcome })
}

fn upload<T: Element, C: Fp8Element + KvCacheOf<T>>(
    cu: &Arc<CudaStream>,
    f: &Fp8PagedPrefillFixture<T>,
) -> Result<GpuCase<T, C>> {
    let (k, v) = f.fp8.codes::<C>();
    GpuCase::upload(cu, &f.sixteen, &k, &v, Some(f.fp8.scales(&Stream::Gpu(cu))?))
}

/// GPU timing of an FP8 case (kernel + merge when split), as [`super::paged_prefill::time_case_gpu`].
pub fn time_fp8_case_gpu(
    cu: &Arc<CudaStream>,
    case: &Fp8PagedPrefillCase,
    seed: u64,
    warmup: usize,
    iters: usize,
) -> Result<super::paged_prefill::PagedPrefillTiming> {
    fn go<T: Element, C: Fp8Element + KvCacheOf<T>>(
        cu: &Arc<CudaStream>,
        case: &Fp8PagedPrefillCase,
        seed: u64,
        warmup: usize,
        iters: usize,
    ) -> Result<super::paged_prefill::PagedPrefillTiming> {
        let f = Fp8PagedPrefillFixture::<T>::new(case, seed);
        let mut g = upload::<T, C>(cu, &f)?;
        let plan = g.run(cu, &f.sixteen)?;
        let timing = time_launches(cu, warmup, iters, |_| g.run(cu, &f.sixteen).map(|_| ()))?;
        let tflops = super::paged_prefill::case_flops(&case.base) / (timing.median_ms * 1e-3) / 1e12;
        Ok(super::paged_prefill::PagedPrefillTiming { timing, plan, tflops })
    }
    match (case.base.dtype, case.format) {
        (DType::F16, Fp8Format::E4m3) => go::<f16, Fp8E4m3>(cu, case, seed, warmup, iters),
        (DType::F16, Fp8Format::E5m2) => go::<f16, Fp8E5m2>(cu, case, seed, warmup, iters),
        (DType::Bf16, Fp8Format::E4m3) => go::<bf16, Fp8E4m3>(cu, case, seed, warmup, iters),
        (DType::Bf16, Fp8Format::E5m2) => go::<bf16, Fp8E5m2>(cu, case, seed, warmup, iters),
    }
}
