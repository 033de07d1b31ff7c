//! MLA decode cases (docs/mla.md) for the runner (`run --op mla-decode`) and the report: a case (heads,
//! latent / rope dims, query tokens per sequence, page size, contexts, a 16-bit or FP8 latent cache), the
//! fixture its seed makes, the run on the emulator or a GPU judged against the fp64 absorbed reference (on
//! the first sequences when the whole batch is too large for an fp64 check), and the GPU timing.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::decode::DecodeWorkspace;
use crate::device::Stream;
use crate::dtype::{DType, Element, Fp8E4m3, Fp8E5m2, Fp8Element, Fp8Format, KvCacheOf};
use crate::emu::Emulator;
use crate::error::{Error, Result};
use crate::mla::{latent_cache_fp8, mla_decode, MlaDecodeOptions, MlaDims, MlaPlan, MlaQueries};
use crate::paged::PagedKvCache;
use crate::reference::{compare_bounded, compare_lse, mla as mla_ref, Arith, Comparison, PagedCache};
use crate::tensor::{TensorView, TensorViewMut};
use crate::testkit::cases::kv::QuantError;
use crate::testkit::cases::with_dtype;
use crate::testkit::timing::{time_launches, Runs, Timing};

/// DeepSeek-V3's softmax scale: 1/sqrt(128 + 64) (the nope and rope dims of its un-absorbed heads).
pub const DEEPSEEK_SCALE: f32 = 0.072_168_78;

/// Largest fp64 check (query rows × visible keys × row columns, the naive twin's pass doubles it): the
/// evaluation covers the batch's first sequences up to it (at least one).
pub const CHECK_LIMIT: usize = 1 << 29;

/// One MLA decode case: `seq_lens.len()` sequences of `q_len` query tokens each (the last `q_len` of their
/// contexts), `heads_q` heads over the latent cache.
#[derive(Clone, Debug, PartialEq)]
pub struct MlaCase {
    pub dtype: DType,
    pub heads_q: usize,
    pub dims: MlaDims,
    pub q_len: usize,
    pub page_size: usize,
    pub seq_lens: Vec<usize>,
    /// Forced split count (`None`: the planner's).
    pub num_splits: Option<usize>,
    /// `None`: a cache of `dtype`; else FP8 of this format with one scale per tensor.
    pub fp8: Option<Fp8Format>,
}

impl MlaCase {
    /// DeepSeek's 512 + 64, one query token, page 64 (FlashMLA's).
    pub fn new(dtype: DType, heads_q: usize, seq_lens: &[usize], fp8: Option<Fp8Format>) -> Self {
        MlaCase {
            dtype,
            heads_q,
            dims: MlaDims::default(),
            q_len: 1,
            page_size: 64,
            seq_lens: seq_lens.to_vec(),
            num_splits: None,
            fp8,
        }
    }
    pub fn batch(&self) -> usize {
        self.seq_lens.len()
    }
    pub fn max_seq_len(&self) -> usize {
        self.seq_lens.iter().copied().max().unwrap_or(0)
    }
    pub fn total_q(&self) -> usize {
        self.batch() * self.q_len
    }
    /// The cache's element type name (the dtype's, or the FP8 format's).
    pub fn kv_name(&self) -> &'static str {
        match self.fp8 {
            None => self.dtype.name(),
            Some(Fp8Format::E4m3) => "fp8_e4m3",
            Some(Fp8Format::E5m2) => "fp8_e5m2",
        }
    }
    pub fn label(&self) -> String {
        let lens = if self.seq_lens.iter().all(|&l| l == self.max_seq_len()) {
            format!("B{}x{}", self.batch(), self.max_seq_len())
        } else {
            format!("lens {:?}", self.seq_lens)
        };
        let splits = self.num_splits.map_or(String::new(), |n| format!(" splits {n}"));
        format!(
            "mla Hq{} {}+{} q_len {} {lens} page {} {} kv {}{splits}",
            self.heads_q,
            self.dims.kv_lora_rank,
            self.dims.rope_dim,
            self.q_len,
            self.page_size,
            self.dtype.name(),
            self.kv_name()
        )
    }
    /// Bytes of one cache row (one byte per element for FP8).
    pub fn row_bytes(&self) -> usize {
        self.dims.row_dim() * if self.fp8.is_some() { 1 } else { 2 }
    }
    /// Bytes a launch must move at the least (HBM): each sequence's visible cache rows once (the row blocks
    /// of a sequence share them through L2), the scale, q, o, LSE and the split workspace (fp32 partials
    /// written once and read once by the merge).
    pub fn bytes(&self, plan: &MlaPlan) -> usize {
        let rows = self.total_q() * self.heads_q;
        let cache: usize = self.seq_lens.iter().map(|&l| l * self.row_bytes()).sum();
        let workspace = if plan.num_splits > 1 { 2 * 4 * (plan.partial_o_len + plan.partial_lse_len) } else { 0 };
        let scale = if self.fp8.is_some() { 4 } else { 0 };
        cache + scale + rows * (self.dims.row_dim() + self.dims.kv_lora_rank) * 2 + rows * 4 + workspace
    }
    /// Tensor FLOPs of the visible (query row, key) pairs: 2 · (rank + rope) for S, 2 · rank for P·V.
    pub fn flops(&self) -> f64 {
        let per_pair = 2.0 * (self.dims.row_dim() + self.dims.kv_lora_rank) as f64;
        let pairs: usize = self
            .seq_lens
            .iter()
            .map(|&l| (0..self.q_len).map(|i| (l + i + 1).saturating_sub(self.q_len).min(l)).sum::<usize>())
            .sum();
        per_pair * (pairs * self.heads_q) as f64
    }
    /// The case's checks before host data is built: dims, page size, a query token per cached one.
    pub fn check(&self) -> Result<()> {
        self.dims.check()?;
        if self.page_size == 0 || self.heads_q == 0 || self.q_len == 0 {
            return Err(Error::usage("mla-decode: --page-size, --heads and --q-len must be at least 1"));
        }
        let tokens: usize = self.seq_lens.iter().sum();
        if tokens.checked_mul(self.dims.row_dim()).is_none_or(|n| n > 1 << 32) {
            return Err(Error::unsupported("seq_lens", "more cache than the runner builds (2^32 elements)"));
        }
        Ok(())
    }
}

/// xorshift64*: uniform in [-1, 1). The MLA fixtures' generator (the runner's cases and tests/it/mla.rs
/// draw from it, so a seed gives the same cache everywhere).
pub struct Rng(u64);
impl Rng {
    /// A generator for a seed (any value; zero is fine).
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1)
    }
    /// The next value, uniform in [-1, 1).
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
    /// A value in 0..n (0 when n is 0).
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next() + 1.0) * 0.5 * n as f64) as usize % n.max(1)
    }
}

/// The scale of an FP8 fixture: it spreads the cache's values (|x| ≤ 1) over the format's range without
/// saturating, and is not a power of two.
pub fn fp8_scale(f: Fp8Format) -> f32 {
    match f {
        Fp8Format::E4m3 => 0.003_7,
        Fp8Format::E5m2 => 0.000_123,
    }
}

/// A case's inputs: q, the latent cache (16-bit values, and for FP8 the codes), its block table (pages
/// shuffled; slots no sequence owns hold NaN / the NaN code), seq_lens, cu_seqlens_q.
pub struct MlaFixture<T> {
    pub case: MlaCase,
    /// `[total_q, Hq, rank + rope]`.
    pub q: Vec<T>,
    /// `[num_pages, page_size, 1, rank + rope]`: the 16-bit values (the FP8 cache quantises them).
    pub cache16: Vec<T>,
    /// FP8 only: the codes of the cache (the format's quantisation of `cache16` by `fp8_scale`).
    pub codes: Vec<u8>,
    pub fp8_scale: f32,
    pub num_pages: usize,
    pub table: Vec<i32>,
    pub width: usize,
    pub lens: Vec<i32>,
    pub cu: Vec<i32>,
}

impl<T: Element> MlaFixture<T> {
    pub fn new(case: &MlaCase, seed: u64) -> Result<Self> {
        case.check()?;
        let mut rng = Rng::new(seed);
        let c = case;
        let row = c.dims.row_dim();
        let b = c.batch();
        let pages: Vec<usize> = c.seq_lens.iter().map(|&l| l.div_ceil(c.page_size).max(1)).collect();
        let width = pages.iter().copied().max().unwrap_or(1);
        let num_pages = pages.iter().sum::<usize>() + 1; // one page no table names
        let mut order: Vec<usize> = (0..num_pages).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i + 1));
        }
        let mut table = vec![0i32; b * width];
        let mut cache16 = vec![T::nan(); num_pages * c.page_size * row];
        let mut next = 0;
        for s in 0..b {
            for p in 0..width {
                // Columns past the sequence's pages name the unused page: never read.
                table[s * width + p] = if p < pages[s] { order[next + p] as i32 } else { order[num_pages - 1] as i32 };
            }
            for j in 0..c.seq_lens[s] {
                let page = table[s * width + j / c.page_size] as usize;
                let at = (page * c.page_size + j % c.page_size) * row;
                for (e, x) in cache16[at..at + row].iter_mut().enumerate() {
                    *x = T::from_f64(if e < c.dims.kv_lora_rank { 0.4 + 0.6 * rng.next() } else { 0.8 * rng.next() });
                }
            }
            next += pages[s];
        }
        let fp8_scale = c.fp8.map_or(1.0, fp8_scale);
        let codes = match c.fp8 {
            None => Vec::new(),
            Some(f) => cache16
                .iter()
                .map(
                    |x| if x.to_f64().is_nan() { Fp8Format::NAN_CODE } else { f.encode(x.to_f64() as f32 / fp8_scale) },
                )
                .collect(),
        };
        let cu: Vec<i32> = (0..=b).map(|i| (i * c.q_len) as i32).collect();
        let q = (0..c.total_q() * c.heads_q * row).map(|_| T::from_f64(0.1 + 0.9 * rng.next())).collect();
        let lens = c.seq_lens.iter().map(|&l| l as i32).collect();
        Ok(Self { case: c.clone(), q, cache16, codes, fp8_scale, num_pages, table, width, lens, cu })
    }

    /// The cache values as the kernel reads them (the 16-bit values, or the codes times the scale; NaN in
    /// slots no sequence owns).
    fn stored(&self, i: usize) -> f64 {
        match self.case.fp8 {
            None => self.cache16[i].to_f64(),
            Some(f) => f.decode(self.codes[i]) * f64::from(self.fp8_scale),
        }
    }
}

/// The verdict of one run: O and LSE against the fp64 reference over the stored cache (on the first
/// `checked_seqs` of `seqs` sequences), and for FP8 the error against the reference over the 16-bit cache.
#[derive(Debug, Clone)]
pub struct MlaOutcome {
    pub out: Comparison,
    pub lse: Comparison,
    pub quant: Option<QuantError>,
    pub plan: MlaPlan,
    pub checked_seqs: usize,
    pub seqs: usize,
    pub seed: u64,
}

impl MlaOutcome {
    /// The tolerance rule and the bound for O, the LSE within its tolerance, and (FP8) the quantisation
    /// error under 0.1 relative (|O| ~ 0.7: a wrong scale or a lost token shows there).
    pub fn passed(&self) -> bool {
        self.out.passed && self.lse.passed && self.quant.is_none_or(|q| q.rel_l2_err < 0.1)
    }
    pub fn sampled(&self) -> bool {
        self.checked_seqs < self.seqs
    }
    pub fn summary(&self) -> String {
        format!(
            "o max|err| {:.2e} (tol {:.2e}, bound ratio {:.2}, rel-L2 {:.2e}); lse max|err| {:.2e}; {} of {} \
             sequences checked (seed {}){}",
            self.out.max_abs_err,
            self.out.tolerance,
            self.out.bound_ratio,
            self.out.rel_l2_err,
            self.lse.max_abs_err,
            self.checked_seqs,
            self.seqs,
            self.seed,
            QuantError::suffix(self.quant)
        )
    }
}

/// One run's outputs and verdict.
pub struct MlaRun<T> {
    pub fixture: MlaFixture<T>,
    pub o: Vec<T>,
    pub lse: Vec<f32>,
    pub outcome: MlaOutcome,
}

/// Judges `o` / `lse` of fixture `f` against the fp64 absorbed reference and its naive twin, on the first
/// sequences up to [`CHECK_LIMIT`] (their pages gathered into a small pool).
pub fn evaluate<T: Element>(f: &MlaFixture<T>, plan: MlaPlan, o: &[T], lse: &[f32], seed: u64) -> Result<MlaOutcome> {
    let c = &f.case;
    let row = c.dims.row_dim();
    let rank = c.dims.kv_lora_rank;
    let per_seq = |l: usize| c.q_len * c.heads_q * l.max(1) * row;
    let mut nb = 0;
    let mut work = 0;
    while nb < c.batch() && (nb == 0 || work + per_seq(c.seq_lens[nb]) <= CHECK_LIMIT) {
        work += per_seq(c.seq_lens[nb]);
        nb += 1;
    }
    // The checked sequences' pages, gathered (page p of sequence s -> s * width + p).
    let pool_pages = nb * f.width;
    let mut stored = vec![f64::NAN; pool_pages * c.page_size * row];
    let mut sixteen = vec![f64::NAN; pool_pages * c.page_size * row];
    let mut table = vec![0i32; nb * f.width];
    for s in 0..nb {
        for p in 0..f.width {
            let new = s * f.width + p;
            table[new] = new as i32;
            let old = f.table[s * f.width + p] as usize;
            for i in 0..c.page_size * row {
                stored[new * c.page_size * row + i] = f.stored(old * c.page_size * row + i);
                sixteen[new * c.page_size * row + i] = f.cache16[old * c.page_size * row + i].to_f64();
            }
        }
    }
    let q: Vec<f64> = f.q[..nb * c.q_len * c.heads_q * row].iter().map(|x| x.to_f64()).collect();
    let cu = &f.cu[..=nb];
    let lens = &f.lens[..nb];
    let pc_stored = PagedCache {
        k_cache: &stored,
        v_cache: &stored,
        num_pages: pool_pages,
        page_size: c.page_size,
        heads_kv: 1,
        head_dim: row,
        head_dim_v: row,
        block_table: &table,
        max_pages_per_seq: f.width,
        seq_lens: lens,
    };
    let s = f64::from(DEEPSEEK_SCALE);
    let r64 = mla_ref::mla_decode(rank, c.heads_q, s, Arith::F64, cu, &q, &pc_stored)?;
    let naive = mla_ref::mla_decode(rank, c.heads_q, s, Arith::Lowp(T::DTYPE), cu, &q, &pc_stored)?;
    let n = nb * c.q_len * c.heads_q;
    let ours: Vec<f64> = o[..n * rank].iter().map(|x| x.to_f64()).collect();
    let bound = r64.out_bound(Some(T::DTYPE), Some(T::DTYPE));
    let out = compare_bounded(&ours, &r64.out, &naive.out, &bound);
    let lse64: Vec<f64> = lse[..n].iter().map(|&x| f64::from(x)).collect();
    let tol = 1e-3
        + 16.0 * f64::from(f32::EPSILON) * r64.lse.iter().filter(|x| x.is_finite()).fold(0.0f64, |a, x| a.max(x.abs()));
    let lse = compare_lse(&lse64, &r64.lse, tol);
    let quant = match c.fp8 {
        None => None,
        Some(_) => {
            let pc16 = PagedCache { k_cache: &sixteen, v_cache: &sixteen, ..pc_stored };
            let r16 = mla_ref::mla_decode(rank, c.heads_q, s, Arith::F64, cu, &q, &pc16)?;
            Some(QuantError::of(&ours, &r16.out))
        }
    };
    Ok(MlaOutcome { out, lse, quant, plan, checked_seqs: nb, seqs: c.batch(), seed })
}

/// Launches one MLA decode of fixture `f` over its cache as `C` elements (the views in the stream's memory).
#[allow(clippy::too_many_arguments)]
fn launch<T: Element, C: KvCacheOf<T>>(
    stream: &Stream<'_>,
    case: &MlaCase,
    q: &TensorView<'_, T, 3>,
    cache: &PagedKvCache<'_, C>,
    cu: &TensorView<'_, i32, 1>,
    o: &mut TensorViewMut<'_, T, 3>,
    lse: &mut TensorViewMut<'_, f32, 2>,
    ws: &mut DecodeWorkspace,
) -> Result<MlaPlan> {
    let mut opts = MlaDecodeOptions::new(DEEPSEEK_SCALE);
    opts.dims = case.dims;
    opts.num_splits = case.num_splits;
    if case.q_len > 1 {
        opts.queries = Some(MlaQueries { cu_seqlens_q: cu, max_seqlen_q: case.q_len });
    }
    mla_decode(stream, q, cache, o, Some(lse), ws, &opts)
}

/// A latent cache element type: the case's 16-bit `T` itself, or an FP8 code type.
pub trait LatentElement<T: Element>: KvCacheOf<T> {
    /// The fixture's cache as this type: its 16-bit values, or its codes.
    fn elements(f: &MlaFixture<T>) -> Vec<Self>;
}
impl<T: Element> LatentElement<T> for T {
    fn elements(f: &MlaFixture<T>) -> Vec<T> {
        f.cache16.clone()
    }
}
impl<T: Element> LatentElement<T> for Fp8E4m3 {
    fn elements(f: &MlaFixture<T>) -> Vec<Self> {
        f.codes.iter().map(|&c| Fp8E4m3::from_code(c)).collect()
    }
}
impl<T: Element> LatentElement<T> for Fp8E5m2 {
    fn elements(f: &MlaFixture<T>) -> Vec<Self> {
        f.codes.iter().map(|&c| Fp8E5m2::from_code(c)).collect()
    }
}

/// `$run::<T, C>(args...)` with `C` the cache element type of `$fp8`: `T` itself, `Fp8E4m3` or `Fp8E5m2`.
macro_rules! with_cache {
    ($fp8:expr, $run:ident::<$t:ty>($($arg:expr),* $(,)?)) => {
        match $fp8 {
            None => $run::<$t, $t>($($arg),*),
            Some(Fp8Format::E4m3) => $run::<$t, Fp8E4m3>($($arg),*),
            Some(Fp8Format::E5m2) => $run::<$t, Fp8E5m2>($($arg),*),
        }
    };
}

/// Runs `case` on the emulator (outputs NaN-poisoned first) and judges it.
pub fn run_case_emulated<T: Element>(emu: &Emulator, case: &MlaCase, seed: u64) -> Result<MlaRun<T>> {
    fn go<T: Element, C: LatentElement<T>>(emu: &Emulator, f: &MlaFixture<T>) -> Result<(Vec<T>, Vec<f32>, MlaPlan)> {
        let c = &f.case;
        let stream = Stream::Emu(emu);
        let row = c.dims.row_dim();
        let cache: Vec<C> = C::elements(f);
        let scale = vec![f.fp8_scale];
        let cache_v = TensorView::host(&cache, [f.num_pages, c.page_size, 1, row])?;
        let table_v = TensorView::host(&f.table, [c.batch(), f.width])?;
        let lens_v = TensorView::host(&f.lens, [c.batch()])?;
        let lc = if c.fp8.is_some() {
            latent_cache_fp8(cache_v, table_v, lens_v, c.max_seq_len(), TensorView::host(&scale, [1])?)?
        } else {
            crate::mla::latent_cache(cache_v, table_v, lens_v, c.max_seq_len())?
        };
        let cu = TensorView::host(&f.cu, [c.batch() + 1])?;
        let mut o = vec![T::nan(); c.total_q() * c.heads_q * c.dims.kv_lora_rank];
        let mut lse = vec![f32::NAN; c.total_q() * c.heads_q];
        let mut ws = DecodeWorkspace::with_capacity(&stream, c.total_q(), c.heads_q, c.dims.kv_lora_rank, 64)?;
        let plan = launch(
            &stream,
            c,
            &TensorView::host(&f.q, [c.total_q(), c.heads_q, row])?,
            &lc,
            &cu,
            &mut TensorViewMut::host(&mut o, [c.total_q(), c.heads_q, c.dims.kv_lora_rank])?,
            &mut TensorViewMut::host(&mut lse, [c.total_q(), c.heads_q])?,
            &mut ws,
        )?;
        Ok((o, lse, plan))
    }
    let f = MlaFixture::<T>::new(case, seed)?;
    let (o, lse, plan) = with_cache!(case.fp8, go::<T>(emu, &f))?;
    let outcome = evaluate(&f, plan, &o, &lse, seed)?;
    Ok(MlaRun { fixture: f, o, lse, outcome })
}

/// The device buffers of a case on a GPU.
struct GpuMla<T, C> {
    q: cudarc::driver::CudaSlice<T>,
    cache: cudarc::driver::CudaSlice<C>,
    table: cudarc::driver::CudaSlice<i32>,
    lens: cudarc::driver::CudaSlice<i32>,
    cu: cudarc::driver::CudaSlice<i32>,
    scale: cudarc::driver::CudaSlice<f32>,
    o: cudarc::driver::CudaSlice<T>,
    lse: cudarc::driver::CudaSlice<f32>,
}

/// What a GPU run returns: o, lse, the plan, and the timing when asked for.
type GpuOutputs<T> = (Vec<T>, Vec<f32>, MlaPlan, Option<Timing>);

/// Runs (and with `runs` times) `case` on the GPU of `cu`; returns the outputs, the plan and the timing.
fn gpu_go<T: Element, C: LatentElement<T>>(
    cs: &Arc<CudaStream>,
    f: &MlaFixture<T>,
    runs: Option<Runs>,
) -> Result<GpuOutputs<T>> {
    let c = &f.case;
    let stream = Stream::Gpu(cs);
    let row = c.dims.row_dim();
    let cache: Vec<C> = C::elements(f);
    let mut g = GpuMla {
        q: cs.clone_htod(&f.q)?,
        cache: cs.clone_htod(&cache)?,
        table: cs.clone_htod(&f.table)?,
        lens: cs.clone_htod(&f.lens)?,
        cu: cs.clone_htod(&f.cu)?,
        scale: cs.clone_htod(&[f.fp8_scale])?,
        o: cs.alloc_zeros::<T>(c.total_q() * c.heads_q * c.dims.kv_lora_rank)?,
        lse: cs.alloc_zeros::<f32>(c.total_q() * c.heads_q)?,
    };
    let mut ws = DecodeWorkspace::with_capacity(&stream, c.total_q(), c.heads_q, c.dims.kv_lora_rank, 64)?;
    let once = |g: &mut GpuMla<T, C>, ws: &mut DecodeWorkspace| -> Result<MlaPlan> {
        let q = TensorView::gpu(g.q.as_view(), [c.total_q(), c.heads_q, row])?;
        let cache_v = TensorView::gpu(g.cache.as_view(), [f.num_pages, c.page_size, 1, row])?;
        let table_v = TensorView::gpu(g.table.as_view(), [c.batch(), f.width])?;
        let lens_v = TensorView::gpu(g.lens.as_view(), [c.batch()])?;
        let lc = if c.fp8.is_some() {
            latent_cache_fp8(cache_v, table_v, lens_v, c.max_seq_len(), TensorView::gpu(g.scale.as_view(), [1])?)?
        } else {
            crate::mla::latent_cache(cache_v, table_v, lens_v, c.max_seq_len())?
        };
        let cu = TensorView::gpu(g.cu.as_view(), [c.batch() + 1])?;
        let mut o = TensorViewMut::gpu(g.o.as_view_mut(), [c.total_q(), c.heads_q, c.dims.kv_lora_rank])?;
        let mut lse = TensorViewMut::gpu(g.lse.as_view_mut(), [c.total_q(), c.heads_q])?;
        launch(&stream, c, &q, &lc, &cu, &mut o, &mut lse, ws)
    };
    let plan = once(&mut g, &mut ws)?;
    let timing = match runs {
        Some(r) => Some(time_launches(cs, r, |_| once(&mut g, &mut ws).map(|_| ()))?),
        None => None,
    };
    let o: Vec<T> = cs.clone_dtoh(&g.o)?;
    let lse = cs.clone_dtoh(&g.lse)?;
    Ok((o, lse, plan, timing))
}

/// Runs `case` on the GPU and judges it.
pub fn run_case_gpu<T: Element>(cs: &Arc<CudaStream>, case: &MlaCase, seed: u64) -> Result<MlaRun<T>> {
    let f = MlaFixture::<T>::new(case, seed)?;
    let (o, lse, plan, _) = with_cache!(case.fp8, gpu_go::<T>(cs, &f, None))?;
    let outcome = evaluate(&f, plan, &o, &lse, seed)?;
    Ok(MlaRun { fixture: f, o, lse, outcome })
}

/// GPU timing of one case: CUDA events, warm-up then the median; bandwidth of [`MlaCase::bytes`] and
/// TFLOPS of [`MlaCase::flops`]; the outputs of the first launch judged as [`run_case_gpu`] does.
#[derive(Debug, Clone)]
pub struct MlaTiming {
    pub timing: Timing,
    pub plan: MlaPlan,
    pub bytes: usize,
    pub gbps: f64,
    pub tflops: f64,
    pub outcome: MlaOutcome,
}

pub fn time_case_gpu(cs: &Arc<CudaStream>, case: &MlaCase, seed: u64, runs: Runs) -> Result<MlaTiming> {
    with_dtype!(case.dtype, T => {
        let f = MlaFixture::<T>::new(case, seed)?;
        let (o, lse, plan, timing) = with_cache!(case.fp8, gpu_go::<T>(cs, &f, Some(runs)))?;
        let timing = timing.ok_or_else(|| Error::usage("mla timing: gpu_go was given runs but returned no timing"))?;
        let outcome = evaluate(&f, plan, &o, &lse, seed)?;
        let bytes = case.bytes(&plan);
        let secs = timing.median_ms * 1e-3;
        let (gbps, tflops) = (bytes as f64 / secs / 1e9, case.flops() / secs / 1e12);
        Ok(MlaTiming { timing, plan, bytes, gbps, tflops, outcome })
    })
}

/// The report's timed MLA shapes (issue 29): Hq 16 and 128 at B 64 × 4096 (page 64), bf16 and an E4M3 cache.
pub fn perf_cases() -> Vec<MlaCase> {
    let mut v = Vec::new();
    for hq in [16, 128] {
        for fp8 in [None, Some(Fp8Format::E4m3)] {
            v.push(MlaCase::new(DType::Bf16, hq, &[4096; 64], fp8));
        }
    }
    v
}

/// The report's emulated correctness cases: both dtypes and cache formats, Hq 16 / 128, q_len 1 and 3,
/// pages 1 / 16 / 64, a forced split.
pub fn sweep_emulated() -> Vec<MlaCase> {
    vec![
        MlaCase { page_size: 16, ..MlaCase::new(DType::Bf16, 16, &[300, 1, 77], None) },
        MlaCase { q_len: 3, num_splits: Some(2), ..MlaCase::new(DType::F16, 128, &[150], None) },
        MlaCase { page_size: 1, ..MlaCase::new(DType::Bf16, 32, &[90, 40], Some(Fp8Format::E4m3)) },
        MlaCase { q_len: 2, ..MlaCase::new(DType::F16, 16, &[200, 65], Some(Fp8Format::E5m2)) },
    ]
}
