//! Paged append alone (the runner's `run --op append`, docs/runner.md): new tokens' K/V scattered into a
//! paged cache (pages handed out in shuffled order, every other slot NaN), 16-bit or FP8, with or without K
//! rotated on the way (RoPE, docs/rope.md). The check is exact: the whole cache after the launch must hold,
//! bit for bit, what the Rust model of the kernel stores (K rotated in fp32 with the kernels' fma formula,
//! then rounded to the 16-bit dtype or quantised `fp8_rn_satfinite(x / scale)`; V copied or quantised) in
//! the new tokens' slots, and the poison everywhere else.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use rand::seq::SliceRandom;
use rand::Rng;

use crate::append::{append_with, AppendOptions};
use crate::dtype::{DType, Element, Fp8E4m3, Fp8E5m2, Fp8Format, KvCacheOf};
use crate::emu::Emulator;
use crate::error::{Error, Result};
use crate::fp8::{KvScales, ScaleKind};
use crate::paged::PagedKvCacheMut;
use crate::rope::{rotate_row_f32, Rope};
use crate::tensor::{TensorView, TensorViewMut};
use crate::testkit::cases::decode::CaseRope;
use crate::testkit::cases::kv::KvFormat;
use crate::testkit::rope::PoisonedTable;
use crate::Stream;

/// One append: `seqs` are (new tokens, context length including them) per sequence; the new tokens are
/// each sequence's last, at positions `seq_len − q_len + i` (the default RoPE positions).
#[derive(Debug, Clone, PartialEq)]
pub struct AppendCase {
    pub dtype: DType,
    /// K's head dim Dqk.
    pub head_dim: usize,
    /// V's head dim Dv when it differs from `head_dim` (v `[N, Hkv, Dv]` into V pages `[.., Dv]`;
    /// docs/head-dims.md); `None`: `head_dim`.
    pub head_dim_v: Option<usize>,
    pub heads_kv: usize,
    pub page_size: usize,
    pub seqs: Vec<(usize, usize)>,
    pub kv: KvFormat,
    /// K rotated on its way into the cache ([`CaseRope`]: explicit positions drawn from the seed, or each
    /// token's place in its sequence).
    pub rope: Option<CaseRope>,
}

impl AppendCase {
    /// New tokens in all.
    pub fn tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.0).sum()
    }
    /// V's head dim Dv.
    pub fn dv(&self) -> usize {
        self.head_dim_v.unwrap_or(self.head_dim)
    }
    pub fn label(&self) -> String {
        let rope = self.rope.map_or(String::new(), |r| format!(" {}", r.label()));
        self.kv.label(format!(
            "append {} D={}{} Hkv={} page={} seqs={:?}{rope}",
            self.dtype.name(),
            self.head_dim,
            self.head_dim_v.map_or(String::new(), |dv| format!(" Dv={dv}")),
            self.heads_kv,
            self.page_size,
            self.seqs
        ))
    }
}

/// A case's host data: the new K rows `[N, Hkv, Dqk]` and V rows `[N, Hkv, Dv]`, their slots and positions,
/// the caches' shapes, the
/// FP8 scales (one, or one per KV head; empty for a 16-bit cache) and the poisoned RoPE table.
#[derive(Debug, Clone)]
pub struct AppendFixture<T> {
    pub case: AppendCase,
    pub seed: u64,
    pub k: Vec<T>,
    pub v: Vec<T>,
    pub slots: Vec<i64>,
    /// The position of every new token (explicit, or its place in its sequence): what K is rotated at.
    pub positions: Vec<i32>,
    /// K's pages `[num_pages, page_size, Hkv, Dqk]`.
    pub cache_shape: [usize; 4],
    /// V's pages `[num_pages, page_size, Hkv, Dv]`.
    pub v_cache_shape: [usize; 4],
    pub k_scales: Vec<f32>,
    pub v_scales: Vec<f32>,
    pub rope_table: Option<PoisonedTable>,
}

/// What one append left: the stored values of the K and V caches (f64: 16-bit values, or FP8 codes
/// decoded, before scaling; NaN where nothing was written) and the launch's wall time.
pub struct AppendOutputs {
    pub k_cache: Vec<f64>,
    pub v_cache: Vec<f64>,
    pub launch_secs: f64,
}

/// The verdict: elements of the two caches whose stored value differs from the model's (bit for bit; NaN
/// equals NaN), and the largest absolute difference among finite ones.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AppendOutcome {
    pub mismatches: usize,
    pub max_abs_err: f64,
    pub elements: usize,
}

impl AppendOutcome {
    pub fn passed(&self) -> bool {
        self.mismatches == 0
    }
}

impl<T: Element> AppendFixture<T> {
    pub fn new(case: &AppendCase, seed: u64) -> Result<Self> {
        let (hkv, d, dv, ps) = (case.heads_kv, case.head_dim, case.dv(), case.page_size);
        if ps == 0 || hkv == 0 {
            return Err(Error::shape("cache", "page size and KV heads must be positive"));
        }
        let mut rng = crate::testkit::seed::rng(seed);
        let per_seq: Vec<usize> = case.seqs.iter().map(|&(_, len)| len.div_ceil(ps)).collect();
        // One spare page nobody owns; pages in shuffled order.
        let num_pages = per_seq.iter().sum::<usize>() + 1;
        let mut order: Vec<usize> = (0..num_pages).collect();
        order.shuffle(&mut rng);
        let (mut slots, mut default_positions) = (Vec::new(), Vec::new());
        let mut next = 0;
        for (&(q_len, len), &pages) in case.seqs.iter().zip(&per_seq) {
            if q_len > len {
                return Err(Error::shape("seqs", format!("{q_len} new tokens in a sequence of {len}")));
            }
            let own = &order[next..next + pages];
            next += pages;
            for p in len - q_len..len {
                slots.push((own[p / ps] * ps + p % ps) as i64);
                default_positions.push(crate::error::to_i32("position", p)?);
            }
        }
        let n = slots.len();
        let k: Vec<T> = (0..n * hkv * d).map(|_| T::from_f64(rng.random_range(-1.7..1.7))).collect();
        let v: Vec<T> = (0..n * hkv * dv).map(|_| T::from_f64(0.7 + rng.random_range(-1.7..1.7))).collect();
        let (k_scales, v_scales) = match case.kv {
            KvFormat::Sixteen => (vec![], vec![]),
            KvFormat::Fp8 { format, scales } => {
                let count = if scales == ScaleKind::PerHead { hkv } else { 1 };
                // About amax / the format's max (|k| < 1.7 + RoPE's attention factor, |v| < 2.4), varied.
                let mut draw = |amax: f64| -> Vec<f32> {
                    (0..count).map(|_| (amax * rng.random_range(0.8..1.2) / format.max()) as f32).collect()
                };
                (draw(1.7), draw(2.4))
            }
        };
        let positions = match case.rope {
            Some(r) if r.explicit_positions => (0..n).map(|_| rng.random_range(0..CaseRope::MAX_POS as i32)).collect(),
            _ => default_positions,
        };
        let rope_table = case
            .rope
            .map(|r| {
                let used: Vec<i64> = positions.iter().map(|&p| i64::from(p)).collect();
                let max_pos = CaseRope::MAX_POS.max(case.seqs.iter().map(|s| s.1).max().unwrap_or(0) + 1);
                PoisonedTable::new(&r.config, max_pos, &used)
            })
            .transpose()?;
        Ok(Self {
            case: case.clone(),
            seed,
            k,
            v,
            slots,
            positions,
            cache_shape: [num_pages, ps, hkv, d],
            v_cache_shape: [num_pages, ps, hkv, dv],
            k_scales,
            v_scales,
            rope_table,
        })
    }

    /// The caches' stored values the kernel must leave (NaN in every slot no new token owns).
    pub fn expected(&self) -> (Vec<f64>, Vec<f64>) {
        let (hkv, d, dv) = (self.case.heads_kv, self.case.head_dim, self.case.dv());
        let (len, v_len) = (self.cache_shape.iter().product(), self.v_cache_shape.iter().product());
        let (mut kc, mut vc) = (vec![f64::NAN; len], vec![f64::NAN; v_len]);
        let table = match (&self.rope_table, self.case.rope) {
            (Some(t), Some(r)) => Some((t.reference(r.config.rotary_dim, r.config.style), r.config)),
            _ => None,
        };
        let store = |x: f32, scales: &[f32], h: usize| -> f64 {
            match self.case.kv.fp8() {
                None => self.case.dtype.round(f64::from(x)),
                Some((f, _)) => f.decode(f.encode(x / scales[if scales.len() == 1 { 0 } else { h }])),
            }
        };
        for (t, &slot) in self.slots.iter().enumerate() {
            if slot < 0 {
                continue;
            }
            for h in 0..hkv {
                let row = (t * hkv + h) * d;
                let mut kr: Vec<f32> = self.k[row..row + d].iter().map(|x| x.to_f64() as f32).collect();
                if let Some((tab, cfg)) = &table {
                    let pos = i64::from(self.positions[t]);
                    rotate_row_f32(&mut kr, cfg.rotary_dim, cfg.style, |i| tab.cos_sin(pos, i));
                }
                let at = (slot as usize * hkv + h) * d;
                for j in 0..d {
                    kc[at + j] = store(kr[j], &self.k_scales, h);
                }
                let (v_row, v_at) = ((t * hkv + h) * dv, (slot as usize * hkv + h) * dv);
                for j in 0..dv {
                    vc[v_at + j] = store(self.v[v_row + j].to_f64() as f32, &self.v_scales, h);
                }
            }
        }
        (kc, vc)
    }

    /// The cache's outputs against [`Self::expected`].
    pub fn evaluate(&self, out: &AppendOutputs) -> AppendOutcome {
        let (ek, ev) = self.expected();
        let (mut mismatches, mut max_abs_err) = (0, 0.0f64);
        for (ours, want) in out.k_cache.iter().zip(&ek).chain(out.v_cache.iter().zip(&ev)) {
            let same = ours.to_bits() == want.to_bits() || (ours.is_nan() && want.is_nan());
            if !same {
                mismatches += 1;
                let diff = (ours - want).abs();
                max_abs_err = if diff.is_nan() { f64::NAN } else { max_abs_err.max(diff) };
            }
        }
        AppendOutcome { mismatches, max_abs_err, elements: ek.len() + ev.len() }
    }

    /// The op's RoPE over `cos`, `sin` and `positions` views (None without RoPE).
    fn rope<'a>(
        &self,
        views: Option<&'a (TensorView<'a, f32, 2>, TensorView<'a, f32, 2>, TensorView<'a, i32, 1>)>,
    ) -> Option<Rope<'a>> {
        let (r, (cos, sin, positions)) = (self.case.rope?, views?);
        Some(Rope { cos, sin, rotary_dim: r.config.rotary_dim, style: r.config.style, positions: Some(positions) })
    }
}

/// The NaN a cache of element type C starts with (16-bit NaN; the FP8 formats' 0x7f NaN code).
pub trait Poison: Copy {
    fn poison() -> Self;
}
impl Poison for half::f16 {
    fn poison() -> Self {
        half::f16::NAN
    }
}
impl Poison for half::bf16 {
    fn poison() -> Self {
        half::bf16::NAN
    }
}
impl Poison for Fp8E4m3 {
    fn poison() -> Self {
        Fp8E4m3(0x7f)
    }
}
impl Poison for Fp8E5m2 {
    fn poison() -> Self {
        Fp8E5m2(0x7f)
    }
}

/// The fixture's scales as the op takes them: one per tensor, or one per KV head.
fn scales_of(stream: &Stream<'_>, k: &[f32], v: &[f32]) -> Result<KvScales> {
    match k.len() {
        1 => KvScales::per_tensor(stream, k[0], v[0]),
        _ => KvScales::per_head(stream, k, v),
    }
}

/// Runs `$run::<T, C>(args)` with C the case's cache element type (T for a 16-bit cache).
macro_rules! with_kv {
    ($kv:expr, $run:ident::<$t:ty>($($arg:expr),* $(,)?)) => {
        match $kv.fp8() {
            None => $run::<$t, $t>($($arg),*),
            Some((Fp8Format::E4m3, _)) => $run::<$t, Fp8E4m3>($($arg),*),
            Some((Fp8Format::E5m2, _)) => $run::<$t, Fp8E5m2>($($arg),*),
        }
    };
}

/// Runs the fixture's append once on the emulator over a NaN cache.
pub fn run_emulated<T: Element + Poison>(emu: &Emulator, f: &AppendFixture<T>) -> Result<AppendOutputs> {
    fn go<T: Element, C: KvCacheOf<T> + Poison>(emu: &Emulator, f: &AppendFixture<T>) -> Result<AppendOutputs> {
        let stream = Stream::Emu(emu);
        let (n, hkv, d, dv) = (f.slots.len(), f.case.heads_kv, f.case.head_dim, f.case.dv());
        let (len, v_len) = (f.cache_shape.iter().product(), f.v_cache_shape.iter().product());
        let (mut kc, mut vc) = (vec![C::poison(); len], vec![C::poison(); v_len]);
        let scales = match f.k_scales.is_empty() {
            true => None,
            false => Some(scales_of(&stream, &f.k_scales, &f.v_scales)?),
        };
        let table = f.rope_table.as_ref().map(|t| t.views()).transpose()?;
        let positions = TensorView::host(&f.positions, [n])?;
        let views = table.map(|(c, s)| (c, s, positions));
        let start = std::time::Instant::now();
        {
            let mut cache = PagedKvCacheMut::new(
                TensorViewMut::host(&mut kc, f.cache_shape)?,
                TensorViewMut::host(&mut vc, f.v_cache_shape)?,
            )?;
            if let Some(s) = &scales {
                cache = cache.with_scales(s)?;
            }
            append_with(
                &stream,
                &TensorView::host(&f.k, [n, hkv, d])?,
                &TensorView::host(&f.v, [n, hkv, dv])?,
                &TensorView::host(&f.slots, [n])?,
                &mut cache,
                &AppendOptions { rope: f.rope(views.as_ref()) },
            )?;
        }
        let launch_secs = start.elapsed().as_secs_f64();
        let stored = |x: &[C]| x.iter().map(|c| c.stored_value()).collect();
        Ok(AppendOutputs { k_cache: stored(&kc), v_cache: stored(&vc), launch_secs })
    }
    with_kv!(f.case.kv, go::<T>(emu, f))
}

/// Runs the fixture's append on the GPU behind `cu` over a NaN cache, `iters` times after `warmup` (all
/// writing the same values), and reads the caches back; the per-launch times if timed.
pub fn run_gpu<T: Element + Poison>(
    cu: &Arc<CudaStream>,
    f: &AppendFixture<T>,
    runs: Option<crate::testkit::timing::Runs>,
) -> Result<(AppendOutputs, Option<crate::testkit::timing::Timing>)> {
    fn go<T: Element, C: KvCacheOf<T> + Poison>(
        cu: &Arc<CudaStream>,
        f: &AppendFixture<T>,
        runs: Option<crate::testkit::timing::Runs>,
    ) -> Result<(AppendOutputs, Option<crate::testkit::timing::Timing>)> {
        let stream = Stream::Gpu(cu);
        let (n, hkv, d, dv) = (f.slots.len(), f.case.heads_kv, f.case.head_dim, f.case.dv());
        let (len, v_len) = (f.cache_shape.iter().product(), f.v_cache_shape.iter().product());
        let (mut kc, mut vc) = (cu.clone_htod(&vec![C::poison(); len])?, cu.clone_htod(&vec![C::poison(); v_len])?);
        let (k, v) = (cu.clone_htod(&f.k)?, cu.clone_htod(&f.v)?);
        let slots = cu.clone_htod(&f.slots)?;
        let positions = cu.clone_htod(&f.positions.iter().copied().chain([0]).collect::<Vec<_>>())?;
        let scales = match f.k_scales.is_empty() {
            true => None,
            false => Some(scales_of(&stream, &f.k_scales, &f.v_scales)?),
        };
        let table = match &f.rope_table {
            Some(t) => Some((cu.clone_htod(&t.cos)?, cu.clone_htod(&t.sin)?, t.shape())),
            None => None,
        };
        let launch = |kc: &mut cudarc::driver::CudaSlice<C>, vc: &mut cudarc::driver::CudaSlice<C>| -> Result<()> {
            let views = match &table {
                Some((c, s, shape)) => Some((
                    TensorView::gpu(c.as_view(), *shape)?,
                    TensorView::gpu(s.as_view(), *shape)?,
                    TensorView::gpu(positions.slice(0..n), [n])?,
                )),
                None => None,
            };
            let mut cache = PagedKvCacheMut::new(
                TensorViewMut::gpu(kc.as_view_mut(), f.cache_shape)?,
                TensorViewMut::gpu(vc.as_view_mut(), f.v_cache_shape)?,
            )?;
            if let Some(s) = &scales {
                cache = cache.with_scales(s)?;
            }
            append_with(
                &stream,
                &TensorView::gpu(k.as_view(), [n, hkv, d])?,
                &TensorView::gpu(v.as_view(), [n, hkv, dv])?,
                &TensorView::gpu(slots.as_view(), [n])?,
                &mut cache,
                &AppendOptions { rope: f.rope(views.as_ref()) },
            )
        };
        let start = std::time::Instant::now();
        launch(&mut kc, &mut vc)?;
        cu.synchronize()?;
        let launch_secs = start.elapsed().as_secs_f64();
        let timing = match runs {
            Some(r) => Some(crate::testkit::timing::time_launches(cu, r, |_| launch(&mut kc, &mut vc))?),
            None => None,
        };
        let (kh, vh) = (cu.clone_dtoh(&kc)?, cu.clone_dtoh(&vc)?);
        cu.synchronize()?;
        let stored = |x: &[C]| x.iter().map(|c| c.stored_value()).collect();
        Ok((AppendOutputs { k_cache: stored(&kh), v_cache: stored(&vh), launch_secs }, timing))
    }
    with_kv!(f.case.kv, go::<T>(cu, f, runs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rope::{RopeConfig, RopeScaling, RopeStyle};

    /// Every format passes with and without RoPE; the check sees one flipped element, and a RoPE append
    /// judged as if unrotated.
    #[test]
    fn emulated_appends_match_the_model_and_the_check_can_fail() {
        let emu = Emulator::new();
        let rope = CaseRope {
            config: RopeConfig { scaling: RopeScaling::llama31(), ..RopeConfig::new(5e5, 48, RopeStyle::Gptj) },
            explicit_positions: true,
        };
        let fp8 = |format| KvFormat::Fp8 { format, scales: ScaleKind::PerHead };
        for (kv, rope) in [
            (KvFormat::Sixteen, None),
            (KvFormat::Sixteen, Some(CaseRope { explicit_positions: false, ..rope })),
            (fp8(Fp8Format::E4m3), Some(rope)),
            (fp8(Fp8Format::E5m2), None),
        ] {
            let case = AppendCase {
                dtype: DType::Bf16,
                head_dim: 64,
                head_dim_v: None,
                heads_kv: 2,
                page_size: 8,
                seqs: vec![(5, 20), (9, 9)],
                kv,
                rope,
            };
            let f = AppendFixture::<half::bf16>::new(&case, 28).unwrap();
            let mut out = run_emulated(&emu, &f).unwrap();
            let o = f.evaluate(&out);
            assert!(o.passed(), "{}: {o:?}", case.label());
            if rope.is_some() {
                let plain = AppendFixture::<half::bf16>::new(&AppendCase { rope: None, ..case.clone() }, 28).unwrap();
                assert_eq!((plain.k.clone(), plain.slots.clone()), (f.k.clone(), f.slots.clone()));
                assert!(!plain.evaluate(&out).passed(), "{}: passes as if unrotated", case.label());
            }
            let at = f.slots[3] as usize * 2 * 64 + 7;
            out.k_cache[at] = if out.k_cache[at] == 0.5 { 0.25 } else { 0.5 };
            assert_eq!(f.evaluate(&out).mismatches, 1, "{}", case.label());
        }
    }
}
