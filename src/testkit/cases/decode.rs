//! The decode sweep (shared by the tests and the runner's `report` / `run --op decode`) and the host-side
//! fixture it runs on: a paged cache built the adversarial way. Pages are handed out in shuffled order,
//! page 0 is a reserved null page, every slot no sequence owns (the null page, spare pages, the tail of
//! each partial last page) holds NaN, and block-table columns past a sequence's pages point at the null
//! page. A kernel that reads or lets any of that leak produces NaN.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use rand::seq::SliceRandom;
use rand::Rng;

use crate::decode::{decode, DecodeOptions, DecodeWorkspace};
use crate::dtype::{DType, Element};
use crate::dtype::{Fp8Format, KvCacheOf};
use crate::emu::Emulator;
use crate::error::Result;
use crate::fp8::ScaleKind;
use crate::paged::PagedKvCache;
use crate::plan::DecodePlan;
use crate::reference::{self, Arith, Comparison};
use crate::tensor::{TensorView, TensorViewMut};
use crate::testkit::cases::kv::{
    paged_host, with_cache_element, CacheElement, Fp8Cache, GpuPaged, KvFormat, PagedHost, QuantError,
};
use crate::testkit::cases::paged_prefill::CaseSchedule;
use crate::testkit::cases::prefill::VariantViews;
use crate::testkit::cases::with_dtype;
use crate::testkit::timing::{time_launches, Runs, Timing};
use crate::testkit::variants::CaseVariants;
use crate::Stream;

/// Sequence lengths of every sweep case: all of them in one batch (empty, single token, page and tile edges,
/// a long one that is not a multiple of anything).
pub const SWEEP_SEQ_LENS: [usize; 7] = [0, 1, 15, 16, 17, 1000, 4097];
pub const SWEEP_PAGE_SIZES: [usize; 5] = [1, 8, 16, 64, 256];
/// (Hq, Hkv): MHA, GQA 4, GQA 8, and MQA with 20 query heads (two 16-row CTA blocks, the second partial).
pub const SWEEP_HEADS: [(usize, usize); 4] = [(4, 4), (8, 2), (16, 2), (20, 1)];
pub const SWEEP_HEAD_DIMS: [usize; 3] = [64, 128, 256];
pub const SWEEP_DTYPES: [DType; 2] = [DType::F16, DType::Bf16];
/// Forced split counts, and `None` = the planner's choice.
pub const SWEEP_SPLITS: [Option<usize>; 4] = [Some(1), Some(2), Some(7), None];

/// One decode configuration: a batch of sequences of the given lengths over a paged cache.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodeCase {
    pub dtype: DType,
    /// Q·K's head dim Dqk (q and the K pages).
    pub head_dim: usize,
    /// V's and O's head dim Dv when it differs from `head_dim` (DeepSeek's 192/128: V pages `[.., Dv]`, o
    /// `[B, Hq, Dv]`; docs/head-dims.md); `None`: `head_dim`.
    pub head_dim_v: Option<usize>,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub page_size: usize,
    pub seq_lens: Vec<usize>,
    pub num_splits: Option<usize>,
    /// Score variants (sliding window, softcap, ALiBi, sinks).
    pub variants: CaseVariants,
    /// Rotary embedding of q ([`CaseRope`]); `None`: q is taken as already rotated.
    pub rope: Option<CaseRope>,
    /// The cache's element format: the 16-bit dtype, or FP8 quantised from it.
    pub kv: KvFormat,
    /// Run on a scheduled workspace ([`DecodeWorkspace::scheduled`], made for the case's own shape and
    /// prepared from its lengths; `num_splits` must then be `None`); `None`: the uniform plan.
    pub schedule: Option<CaseSchedule>,
}

/// RoPE on a case's queries (decode, paged prefill): the model's configuration, and whether the positions are
/// explicit (drawn from the seed: decode one per sequence, paged prefill one per query token) or the default
/// ones (decode: each sequence's last, seq_len − 1; paged prefill: each token's place in the cache). The fixture builds the table for
/// [`CaseRope::MAX_POS`] positions, with NaN in every row no position addresses and in 3 columns past
/// rotary_dim / 2 (`crate::testkit::rope::PoisonedTable`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CaseRope {
    pub config: crate::rope::RopeConfig,
    pub explicit_positions: bool,
}

impl CaseRope {
    /// Table rows (positions) of a case's table: past every sweep's lengths.
    pub const MAX_POS: usize = 1 << 15;

    pub fn label(&self) -> String {
        let c = &self.config;
        format!(
            "rope={:?} rd={} theta={} {:?}{}",
            c.style,
            c.rotary_dim,
            c.theta,
            c.scaling,
            if self.explicit_positions { " positions" } else { "" }
        )
    }
}

impl DecodeCase {
    /// A plain case: no score variant, no RoPE, a 16-bit cache (the sweeps' and tests' building block).
    pub fn new(
        dtype: DType,
        head_dim: usize,
        (heads_q, heads_kv): (usize, usize),
        page_size: usize,
        seq_lens: &[usize],
        num_splits: Option<usize>,
    ) -> Self {
        Self {
            dtype,
            head_dim,
            head_dim_v: None,
            heads_q,
            heads_kv,
            page_size,
            seq_lens: seq_lens.to_vec(),
            num_splits,
            variants: CaseVariants::default(),
            rope: None,
            kv: KvFormat::Sixteen,
            schedule: None,
        }
    }
    /// A workspace for this case on `stream`: scheduled ([`Self::schedule`]) and prepared for the case's
    /// lengths, or pinned to the uniform plan of `opts`.
    pub fn workspace(&self, stream: &Stream<'_>, opts: &DecodeOptions) -> Result<DecodeWorkspace> {
        let Some(s) = self.schedule else {
            let plan = DecodeWorkspace::new(stream, 0, 0)?.plan(&self.problem(), opts)?;
            return DecodeWorkspace::for_plan(stream, &plan);
        };
        let mut ws = match s.slots {
            Some(slots) => DecodeWorkspace::scheduled_on(stream, &self.problem(), s.policy, slots)?,
            None => DecodeWorkspace::scheduled(stream, &self.problem(), s.policy)?,
        };
        let lens: Vec<i32> = self.seq_lens.iter().map(|&l| l as i32).collect();
        ws.prepare(stream, &lens, opts)?;
        Ok(ws)
    }
    pub fn batch(&self) -> usize {
        self.seq_lens.len()
    }
    /// V's and O's head dim Dv.
    pub fn dv(&self) -> usize {
        self.head_dim_v.unwrap_or(self.head_dim)
    }
    pub fn max_seq_len(&self) -> usize {
        self.seq_lens.iter().copied().max().unwrap_or(0)
    }
    /// The sliding window's left bound, if any.
    pub fn window_left(&self) -> Option<usize> {
        self.variants.window.and_then(|(l, _)| usize::try_from(l).ok())
    }
    /// Tokens of a sequence of `len` the query sees (the last `left + 1` under a window).
    pub fn visible_tokens(&self, len: usize) -> usize {
        self.window_left().map_or(len, |w| len.min(w + 1))
    }
    /// K and V bytes the kernel must read (each visible cached token once per KV head: K's Dqk and V's Dv
    /// columns, at the cache's element size), for bandwidth accounting.
    pub fn kv_bytes(&self) -> usize {
        let tokens = self.seq_lens.iter().map(|&n| self.visible_tokens(n)).sum::<usize>();
        tokens * self.heads_kv * (self.head_dim + self.dv()) * self.kv.bytes()
    }
    /// The planner's view of this case (over the window, if any); its head dim is the wider of Dqk and Dv
    /// (the kernel's width, what workspaces are sized by).
    pub fn problem(&self) -> crate::plan::DecodeProblem {
        crate::plan::DecodeProblem {
            batch: self.batch(),
            heads_q: self.heads_q,
            heads_kv: self.heads_kv,
            head_dim: self.head_dim.max(self.dv()),
            max_seq_len: self.max_seq_len(),
        }
        .windowed(self.window_left())
    }
    pub fn label(&self) -> String {
        let splits = self.num_splits.map_or("planned".to_string(), |s| s.to_string());
        let mut variants = self.variants.label();
        if let Some(r) = &self.rope {
            variants = if variants.is_empty() { r.label() } else { format!("{variants} {}", r.label()) };
        }
        self.kv.label(
            format!(
                "{} D={}{} Hq={} Hkv={} page={} splits={} lens={:?}{}{}",
                self.dtype.name(),
                self.head_dim,
                self.head_dim_v.map_or(String::new(), |dv| format!(" Dv={dv}")),
                self.heads_q,
                self.heads_kv,
                self.page_size,
                splits,
                self.seq_lens,
                if variants.is_empty() { "" } else { " " },
                variants
            ) + &self.schedule.map_or(String::new(), |s| s.label()),
        )
    }
}

/// The full sweep: every page size x head layout x head dim x dtype x split choice (480 cases), each a
/// batch holding all of [`SWEEP_SEQ_LENS`]. What a GPU runs.
pub fn decode_sweep() -> Vec<DecodeCase> {
    let mut cases = Vec::new();
    for &page_size in &SWEEP_PAGE_SIZES {
        for &(heads_q, heads_kv) in &SWEEP_HEADS {
            for &head_dim in &SWEEP_HEAD_DIMS {
                for &dtype in &SWEEP_DTYPES {
                    for &num_splits in &SWEEP_SPLITS {
                        cases.push(DecodeCase::new(
                            dtype,
                            head_dim,
                            (heads_q, heads_kv),
                            page_size,
                            &SWEEP_SEQ_LENS,
                            num_splits,
                        ));
                    }
                }
            }
        }
    }
    cases
}

/// A representative subset for the host emulator, 48 of the 480 cases: every (page size, split choice) pair
/// appears (twice) and every (head layout, head dim, dtype) triple appears (twice), so every value of every
/// dimension meets every value of the others it interacts with most.
pub fn decode_sweep_emulated() -> Vec<DecodeCase> {
    (0..48)
        .map(|i| {
            DecodeCase::new(
                SWEEP_DTYPES[(i / 12) % 2],
                SWEEP_HEAD_DIMS[(i / 4) % 3],
                SWEEP_HEADS[i % 4],
                SWEEP_PAGE_SIZES[i % 5],
                &SWEEP_SEQ_LENS,
                SWEEP_SPLITS[(i / 5) % 4],
            )
        })
        .collect()
}

/// The score-variant decode sweep: each variant alone (a window shorter and longer than the sequences,
/// softcap, ALiBi per head and per sequence, sinks) and the gpt-oss (window + sinks) and Gemma 2 (window +
/// softcap) combinations and all at once, each with forced split counts 1, 2 and 7 and the planner's
/// choice; head dims, page sizes and dtypes rotate. The batch holds an empty sequence, sequences shorter
/// than the windows and longer ones.
pub fn decode_variant_sweep() -> Vec<DecodeCase> {
    use crate::testkit::variants::{CaseAlibi, CaseVariants as V};
    let none = V::default();
    let variants = [
        V { window: Some((100, 0)), ..none },
        V { window: Some((700, -1)), ..none },
        V { softcap: Some(2.0), ..none },
        V { alibi: CaseAlibi::PerHead, ..none },
        V { alibi: CaseAlibi::PerSequence, ..none },
        V { sinks: true, ..none },
        V { window: Some((127, 0)), sinks: true, ..none },
        V { window: Some((255, 0)), softcap: Some(3.0), ..none },
        V { window: Some((90, 0)), softcap: Some(4.0), alibi: CaseAlibi::PerHead, sinks: true },
    ];
    let mut cases = Vec::new();
    for (i, v) in variants.iter().enumerate() {
        for (j, &num_splits) in SWEEP_SPLITS.iter().enumerate() {
            let k = i * SWEEP_SPLITS.len() + j;
            cases.push(DecodeCase {
                variants: *v,
                ..DecodeCase::new(
                    SWEEP_DTYPES[k % 2],
                    SWEEP_HEAD_DIMS[(i + j) % 3],
                    SWEEP_HEADS[k % 4],
                    [1, 16, 256][k % 3],
                    &[0, 1, 17, 129, 1000, 2100],
                    num_splits,
                )
            });
        }
    }
    cases
}

/// The head dims the decode head-dim sweep runs (the widths 64, 128, 256 serve the others with predicated
/// columns, kernels/include/fa/head_dim.cuh): the smallest, each width's odd members and the model dims.
pub const HEAD_DIM_SWEEP_DIMS: [usize; 12] = [32, 40, 72, 80, 96, 112, 136, 160, 192, 200, 224, 248];

/// The decode head-dim sweep (issue 12): each of [`HEAD_DIM_SWEEP_DIMS`] with page sizes, split choices
/// (1, 2, 7, planned), head layouts and dtypes rotating, and a score variant on every third. The batch holds
/// an empty sequence, a short one and a full-page one; q, o, the cache and the split partials are tight
/// (the fixture puts a full page last in the cache: [`PagedFixture::with_inputs`]), so reading or writing a
/// column past D is out of bounds in the emulator. Sized to emulate in a few seconds on two cores.
pub fn decode_head_dim_sweep() -> Vec<DecodeCase> {
    use crate::testkit::variants::{CaseAlibi, CaseVariants as V};
    let variants = [
        V { window: Some((100, 0)), sinks: true, ..V::default() },
        V { softcap: Some(2.0), alibi: CaseAlibi::PerHead, ..V::default() },
        V { sinks: true, ..V::default() },
        V { window: Some((60, 0)), ..V::default() },
    ];
    HEAD_DIM_SWEEP_DIMS
        .iter()
        .enumerate()
        .map(|(i, &head_dim)| DecodeCase {
            variants: if i % 3 == 2 { variants[(i / 3) % 4] } else { V::default() },
            ..DecodeCase::new(
                SWEEP_DTYPES[i % 2],
                head_dim,
                SWEEP_HEADS[i % 4],
                [16, 1, 8, 64, 256][i % 5],
                &[0, 17, 256, 300],
                SWEEP_SPLITS[i % 4],
            )
        })
        .collect()
}

/// The head dims past 256 the large-head-dim sweep runs (issue 27; the width 512 serves 264-512): the
/// smallest, one per 64 between, and Gemma 4's 512.
pub const LARGE_HEAD_DIMS: [usize; 5] = [264, 320, 384, 448, 512];

/// (head dim, dtype, cache format, (Hq, Hkv), page size, forced splits, variants, RoPE) of a case of
/// [`decode_large_head_dim_sweep`].
type LargeDimCase = (usize, DType, KvFormat, (usize, usize), usize, Option<usize>, CaseVariants, Option<CaseRope>);

/// The decode sweep past 256 (issue 27): every dim of [`LARGE_HEAD_DIMS`], fp16 and bf16, 16-bit and FP8
/// caches (E4M3 and E5M2, per-tensor and per-head scales; FP8 needs D % 16 == 0, so not 264), forced split
/// counts 1, 2, 7 and the planner's, MHA/GQA/MQA layouts (20:1, two 16-row blocks), page sizes 1..256, the
/// score variants alone and together, and RoPE on q (Gemma 4's partial rotary at 512, and a full one). The
/// batch holds an empty sequence, a single token, a tile edge and a long one. Sized for the emulator (which
/// is slow at 512): 12 cases.
pub fn decode_large_head_dim_sweep() -> Vec<DecodeCase> {
    use crate::rope::{RopeConfig, RopeStyle};
    use crate::testkit::variants::{CaseAlibi, CaseVariants as V};
    let none = V::default();
    let fp8 = |format, scales| KvFormat::Fp8 { format, scales };
    let (e4, e5) = (Fp8Format::E4m3, Fp8Format::E5m2);
    let (tensor, head) = (ScaleKind::PerTensor, ScaleKind::PerHead);
    let gemma4 = CaseRope { config: RopeConfig::new(1_000_000.0, 128, RopeStyle::Neox), explicit_positions: false };
    let full = CaseRope { config: RopeConfig::new(10_000.0, 448, RopeStyle::Gptj), explicit_positions: true };
    let all = V { window: Some((90, 0)), softcap: Some(4.0), alibi: CaseAlibi::PerHead, sinks: true };
    #[rustfmt::skip]
    let cases: [LargeDimCase; 12] = [
        (264, DType::F16, KvFormat::Sixteen, (4, 4), 16, Some(1), none, None),
        (264, DType::Bf16, KvFormat::Sixteen, (8, 2), 64, Some(2), V { window: Some((255, 0)), softcap: Some(3.0), ..none }, None),
        (320, DType::Bf16, fp8(e4, tensor), (8, 2), 1, Some(2), V { softcap: Some(2.0), alibi: CaseAlibi::PerHead, ..none }, None),
        (384, DType::F16, KvFormat::Sixteen, (16, 2), 8, Some(7), V { window: Some((100, 0)), sinks: true, ..none }, None),
        (384, DType::Bf16, fp8(e5, head), (4, 4), 32, None, none, None),
        (448, DType::Bf16, fp8(e5, head), (20, 1), 64, None, V { sinks: true, ..none }, None),
        (448, DType::F16, KvFormat::Sixteen, (4, 4), 16, None, none, Some(full)),
        (512, DType::F16, KvFormat::Sixteen, (8, 2), 256, Some(1), none, None),
        (512, DType::Bf16, KvFormat::Sixteen, (20, 1), 16, Some(2), all, Some(gemma4)),
        (512, DType::F16, fp8(e4, head), (4, 4), 8, Some(7), V { alibi: CaseAlibi::PerSequence, ..none }, None),
        (512, DType::Bf16, fp8(e5, tensor), (16, 2), 1, None, V { window: Some((60, 0)), softcap: Some(3.0), ..none }, Some(gemma4)),
        (512, DType::Bf16, fp8(e4, head), (8, 2), 16, Some(1), none, None),
    ];
    cases
        .into_iter()
        .map(|(head_dim, dtype, kv, heads, page_size, num_splits, variants, rope)| DecodeCase {
            variants,
            rope,
            kv,
            ..DecodeCase::new(dtype, head_dim, heads, page_size, &[0, 1, 17, 700], num_splits)
        })
        .collect()
}

/// The emulated FP8 sweep: both formats x both scale kinds x both dtypes, every page size 1..256, head dims
/// 64/128/256, MHA/GQA/MQA layouts, forced and planned splits, and the score variants (window, softcap,
/// ALiBi, sinks) on some; 16 cases of a short batch (empty, 1, a page/tile edge, a few hundred tokens).
pub fn fp8_decode_sweep_emulated() -> Vec<DecodeCase> {
    use crate::testkit::variants::{CaseAlibi, CaseVariants as V};
    let page_sizes = [1, 8, 16, 32, 64, 128, 256, 4];
    let variants = [
        V::default(),
        V { softcap: Some(3.0), ..Default::default() },
        V { window: Some((100, 0)), sinks: true, ..Default::default() },
        V { alibi: CaseAlibi::PerHead, ..Default::default() },
    ];
    (0..16)
        .map(|i| DecodeCase {
            variants: if i % 4 == 3 { variants[(i / 4) % 4] } else { V::default() },
            kv: KvFormat::Fp8 {
                format: [Fp8Format::E4m3, Fp8Format::E5m2][i % 2],
                scales: [ScaleKind::PerTensor, ScaleKind::PerHead][(i / 4) % 2],
            },
            ..DecodeCase::new(
                SWEEP_DTYPES[(i / 2) % 2],
                SWEEP_HEAD_DIMS[i % 3],
                SWEEP_HEADS[i % 4],
                page_sizes[i % 8],
                &[0, 1, 33, 300],
                SWEEP_SPLITS[(i / 3) % 4],
            )
        })
        .collect()
}

/// How a case's inputs are drawn and laid out, beyond its shape ([`DecodeCase`]): the variations engines use.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeInputs {
    /// The softmax scale passed to the kernel; `None`: its default 1/sqrt(D).
    pub scale: Option<f32>,
    /// q and K are drawn from U(-m, m) and V from m/4 + U(-m/2, m/2) (so O is not ~ 0); 2 by default.
    /// Large values (e.g. 8) with a large scale make the softmax sharp.
    pub magnitude: f64,
    /// Memory layout of the cache pages.
    pub cache_layout: CacheLayout,
    /// q and o as head slices of packed `[B, 3·Hq, D]` tensors (non-contiguous batch stride) instead of
    /// contiguous `[B, Hq, D]`.
    pub strided_q_o: bool,
}

impl Default for DecodeInputs {
    fn default() -> Self {
        Self { scale: None, magnitude: 2.0, cache_layout: CacheLayout::TokenMajor, strided_q_o: false }
    }
}

impl DecodeInputs {
    pub fn label(&self) -> String {
        let mut s = format!("{:?}", self.cache_layout);
        if let Some(sc) = self.scale {
            s += &format!(" scale={sc}");
        }
        if self.magnitude != 2.0 {
            s += &format!(" |x|<{}", self.magnitude);
        }
        if self.strided_q_o {
            s += " strided-q/o";
        }
        s
    }
}

/// Layouts of the paged cache that engines use; all are the same logical `[num_pages, page_size, Hkv, D]`
/// view, through strides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheLayout {
    /// Separate K and V buffers, each `[num_pages, page_size, Hkv, D]` contiguous (vLLM's flash layout).
    TokenMajor,
    /// Separate buffers stored `[num_pages, Hkv, page_size, D]` (FlashInfer's HND): token stride D, head
    /// stride page_size·D.
    HeadMajor,
    /// One buffer `[num_pages, 2, page_size, Hkv, D]`: each page holds its K block then its V block.
    Interleaved,
}

/// A cache materialised in a [`CacheLayout`]: the buffers and, for K and V, (buffer index, element offset,
/// strides of the logical `[num_pages, page_size, Hkv, D]` view).
#[derive(Debug, Clone)]
pub struct CacheBuffers<T> {
    pub bufs: Vec<Vec<T>>,
    pub k: (usize, usize, [i64; 4]),
    pub v: (usize, usize, [i64; 4]),
}

/// Host data of one case: the paged cache (NaN wherever no sequence owns a slot), the block table, the
/// lengths and the queries. Element layouts: k_cache [num_pages, page_size, Hkv, Dqk], v_cache [.., Dv],
/// block_table [B, width], q [B, Hq, Dqk].
#[derive(Debug, Clone)]
pub struct PagedFixture<T> {
    pub case: DecodeCase,
    pub inputs: DecodeInputs,
    pub num_pages: usize,
    pub width: usize,
    pub k_cache: Vec<T>,
    pub v_cache: Vec<T>,
    pub block_table: Vec<i32>,
    pub seq_lens: Vec<i32>,
    pub q: Vec<T>,
    /// ALiBi slopes (`[Hq]` or `[B, Hq]`) and sinks (`[Hq]`) of the case's variants (empty when unused).
    pub alibi_slopes: Vec<f32>,
    pub sinks: Vec<f32>,
    /// The case's RoPE table (poisoned) and explicit positions `[B]` (empty when unused).
    pub rope_table: Option<crate::testkit::rope::PoisonedTable>,
    pub rope_positions: Vec<i32>,
    /// The FP8 cache quantised from `k_cache` / `v_cache` when the case's cache is FP8 (what the kernel
    /// reads then); `None` for a 16-bit case.
    pub fp8: Option<Fp8Cache>,
}

impl<T: Element> PagedFixture<T> {
    /// Builds the fixture from `seed` with the default inputs: q and K uniform in [-2, 2) (so softmax is far
    /// from uniform at scale 1/sqrt(D)), V uniform in [-0.5, 1.5) (offset so outputs are not ~ 0).
    pub fn new(case: &DecodeCase, seed: u64) -> Result<Self> {
        Self::with_inputs(case, &DecodeInputs::default(), seed)
    }

    /// Builds the fixture from `seed`, drawing values as `inputs` says (its layout is applied when the
    /// cache is materialised for a launch, [`PagedFixture::cache_buffers`]). A case whose RoPE
    /// configuration makes no table is the table's error.
    pub fn with_inputs(case: &DecodeCase, inputs: &DecodeInputs, seed: u64) -> Result<Self> {
        let mut rng = crate::testkit::seed::rng(seed);
        let mag = inputs.magnitude;
        let (ps, hkv, d, dv) = (case.page_size, case.heads_kv, case.head_dim, case.dv());
        let pages_of: Vec<usize> = case.seq_lens.iter().map(|&n| n.div_ceil(ps)).collect();
        // One spare column of table per sequence (pointing at the null page) and two spare pages.
        let width = pages_of.iter().copied().max().unwrap_or(0) + 1;
        let num_pages = 1 + pages_of.iter().sum::<usize>() + 2;
        let mut ids: Vec<i32> = (1..num_pages as i32).collect();
        ids.shuffle(&mut rng);
        // The cache's last page gets the first full page of a sequence, if there is one: then the last row
        // (and head) of the allocation is read, and a kernel reading past it (or past a row's D columns) is
        // out of bounds in the emulator, not in the spare pages' NaN.
        let full = case.seq_lens.iter().zip(&pages_of).scan(0, |first, (&len, &n)| {
            let at = *first;
            *first += n;
            Some((len >= ps).then_some(at))
        });
        if let Some(at) = full.flatten().next() {
            let last = ids.iter().position(|&id| id == num_pages as i32 - 1).unwrap_or(at);
            ids.swap(at, last);
        }
        let mut block_table = vec![0i32; case.batch() * width];
        let mut next = 0;
        for (b, &n) in pages_of.iter().enumerate() {
            block_table[b * width..][..n].copy_from_slice(&ids[next..next + n]);
            next += n;
        }
        let tokens = case.seq_lens.iter().enumerate().map(|(b, &len)| (b, 0..len));
        let (mut k_cache, mut v_cache) =
            fill_cache(&mut rng, ([num_pages, ps, hkv, d], dv), &block_table, width, tokens, mag);
        // Keys left of the window are hidden memory too: poisoned (after the draws, so the visible values do
        // not depend on the window).
        let seqs = case.seq_lens.iter().enumerate().map(|(b, &seq_len)| crate::testkit::poison::SeqRows {
            pages: &block_table[b * width..][..width],
            q_len: 1,
            seq_len,
        });
        let window = crate::mask::Window::new(case.variants.window, true);
        crate::testkit::poison::poison_unseen_slots(&mut k_cache, &mut v_cache, hkv * d, ps, seqs, window);
        // FP8: the scales from the values, not spread across heads (every_kv_head_reads_its_own_fp8_scale
        // in tests/it/fp8.rs checks per-head indexing).
        let fp8 = case.kv.fp8().map(|kv| Fp8Cache::of_cache(&k_cache, &v_cache, (hkv, d, dv), kv, (0.0, 0.0)));
        let q = (0..case.batch() * case.heads_q * d).map(|_| T::from_f64(rng.random_range(-mag..mag))).collect();
        let seq_lens: Vec<i32> = case.seq_lens.iter().map(|&n| n as i32).collect();
        // RoPE: positions drawn after everything else (the other inputs do not depend on them).
        let (rope_table, rope_positions) = match &case.rope {
            None => (None, Vec::new()),
            Some(r) => {
                let max_pos = CaseRope::MAX_POS;
                let positions: Vec<i32> = if r.explicit_positions {
                    (0..case.batch()).map(|_| rng.random_range(0..max_pos as i32)).collect()
                } else {
                    Vec::new()
                };
                let used: Vec<i64> = if r.explicit_positions {
                    positions.iter().map(|&p| i64::from(p)).collect()
                } else {
                    seq_lens.iter().map(|&n| i64::from(n) - 1).collect()
                };
                let table = crate::testkit::rope::PoisonedTable::new(&r.config, max_pos, &used)?;
                (Some(table), positions)
            }
        };
        Ok(Self {
            alibi_slopes: case.variants.slopes(case.batch(), case.heads_q),
            sinks: case.variants.sinks(case.heads_q, seed),
            case: case.clone(),
            inputs: *inputs,
            num_pages,
            width,
            k_cache,
            v_cache,
            block_table,
            seq_lens,
            q,
            rope_table,
            rope_positions,
            fp8,
        })
    }

    /// The reference's view of q: the fixture's, rotated as the kernels rotate it when the case has RoPE
    /// (fp32, rounded to T, at the explicit positions or seq_len − 1).
    pub fn reference_q(&self) -> Vec<f64> {
        let mut q = to_f64(&self.q);
        if let (Some(r), Some(t)) = (&self.case.rope, &self.rope_table) {
            let table = t.reference(r.config.rotary_dim, r.config.style);
            let positions: Vec<i64> = if r.explicit_positions {
                self.rope_positions.iter().map(|&p| i64::from(p)).collect()
            } else {
                self.seq_lens.iter().map(|&n| i64::from(n) - 1).collect()
            };
            table.rotate_lowp(&mut q, self.case.head_dim, self.case.heads_q, &positions, T::DTYPE);
        }
        q
    }

    /// The kernel's scale (fp32) as the reference uses it.
    pub fn scale(&self) -> f64 {
        f64::from(self.inputs.scale.unwrap_or(1.0 / (self.case.head_dim as f32).sqrt()))
    }

    /// The cache the kernel reads (`C`: the 16-bit values, or the FP8 codes of an FP8 case) in the
    /// fixture's [`CacheLayout`] (NaN, or the NaN code, wherever the logical cache has it and in any
    /// storage the layout leaves unused).
    pub fn cache_buffers<C: CacheElement<T>>(&self) -> Result<CacheBuffers<C>> {
        let [k, v] = C::cache(&self.k_cache, &self.v_cache, self.fp8.as_ref())?;
        let [np, ps, hkv, d] = self.cache_shape();
        let dv = self.case.dv();
        let (page, v_page) = ((ps * hkv * d) as i64, (ps * hkv * dv) as i64);
        let (ps_, hkv_, d_, dv_) = (ps as i64, hkv as i64, d as i64, dv as i64);
        Ok(match self.inputs.cache_layout {
            CacheLayout::TokenMajor => {
                let (st, v_st) = ([page, hkv_ * d_, d_, 1], [v_page, hkv_ * dv_, dv_, 1]);
                CacheBuffers { bufs: vec![k.into_owned(), v.into_owned()], k: (0, 0, st), v: (1, 0, v_st) }
            }
            CacheLayout::HeadMajor => {
                let (st, v_st) = ([page, d_, ps_ * d_, 1], [v_page, dv_, ps_ * dv_, 1]);
                let permute = |src: &[C], d: usize| {
                    let mut dst = vec![C::hidden(); src.len()];
                    for p in 0..np {
                        for t in 0..ps {
                            for h in 0..hkv {
                                let from = ((p * ps + t) * hkv + h) * d;
                                let to = ((p * hkv + h) * ps + t) * d;
                                dst[to..to + d].copy_from_slice(&src[from..from + d]);
                            }
                        }
                    }
                    dst
                };
                CacheBuffers { bufs: vec![permute(&k, d), permute(&v, dv)], k: (0, 0, st), v: (1, 0, v_st) }
            }
            CacheLayout::Interleaved => {
                // A page holds its K block then its V block (of Dv columns).
                let both = page + v_page;
                let (st, v_st) = ([both, hkv_ * d_, d_, 1], [both, hkv_ * dv_, dv_, 1]);
                let mut buf = vec![C::hidden(); k.len() + v.len()];
                let (page, v_page, both) = (page as usize, v_page as usize, both as usize);
                for p in 0..np {
                    buf[p * both..][..page].copy_from_slice(&k[p * page..][..page]);
                    buf[p * both + page..][..v_page].copy_from_slice(&v[p * v_page..][..v_page]);
                }
                CacheBuffers { bufs: vec![buf], k: (0, 0, st), v: (0, page, v_st) }
            }
        })
    }

    /// K's pages `[num_pages, page_size, Hkv, Dqk]`.
    pub fn cache_shape(&self) -> [usize; 4] {
        [self.num_pages, self.case.page_size, self.case.heads_kv, self.case.head_dim]
    }

    /// V's pages `[num_pages, page_size, Hkv, Dv]`.
    pub fn v_cache_shape(&self) -> [usize; 4] {
        [self.num_pages, self.case.page_size, self.case.heads_kv, self.case.dv()]
    }

    /// The fixture's 16-bit cache as host views (packed layout, no scales): what a test hands the ops
    /// directly ([`PagedHost::cache_of`] for other values, e.g. the FP8 codes).
    pub fn host_cache(&self) -> Result<PagedKvCache<'_, T>> {
        self.host().cache()
    }

    /// The fixture's data as a [`PagedHost`].
    pub fn host(&self) -> PagedHost<'_, T> {
        paged_host!(self)
    }

    /// Slot (page * page_size + offset) of token t of sequence b.
    pub fn slot(&self, b: usize, t: usize) -> usize {
        let ps = self.case.page_size;
        self.block_table[b * self.width + t / ps] as usize * ps + t % ps
    }

    /// The K and V rows (`[n, Hkv, Dqk]`, `[n, Hkv, Dv]`) and slots of tokens `tokens(b)` of every sequence b, in order: what
    /// an append of those tokens writes into the cache.
    pub fn token_rows(&self, tokens: impl Fn(usize) -> std::ops::Range<usize>) -> (Vec<T>, Vec<T>, Vec<i64>) {
        self.append_rows(tokens, false, None)
    }

    /// [`Self::token_rows`] with padding an append must skip: with `pad_each`, a NaN row at slot −1 after
    /// each sequence's tokens; with `past_pool`, a last NaN row at that slot (past the cache).
    pub fn append_rows(
        &self,
        tokens: impl Fn(usize) -> std::ops::Range<usize>,
        pad_each: bool,
        past_pool: Option<usize>,
    ) -> (Vec<T>, Vec<T>, Vec<i64>) {
        let (row, v_row) = (self.case.heads_kv * self.case.head_dim, self.case.heads_kv * self.case.dv());
        let (mut k, mut v, mut slots) = (Vec::new(), Vec::new(), Vec::new());
        let pad = |k: &mut Vec<T>, v: &mut Vec<T>, slots: &mut Vec<i64>, slot: i64| {
            k.extend(std::iter::repeat_n(T::nan(), row));
            v.extend(std::iter::repeat_n(T::nan(), v_row));
            slots.push(slot);
        };
        for b in 0..self.case.batch() {
            for t in tokens(b) {
                let s = self.slot(b, t);
                k.extend_from_slice(&self.k_cache[s * row..][..row]);
                v.extend_from_slice(&self.v_cache[s * v_row..][..v_row]);
                slots.push(s as i64);
            }
            if pad_each {
                pad(&mut k, &mut v, &mut slots, -1);
            }
        }
        if let Some(slot) = past_pool {
            pad(&mut k, &mut v, &mut slots, slot as i64);
        }
        (k, v, slots)
    }

    /// Dense K `[len, Hkv, Dqk]` and V `[len, Hkv, Dv]` of sequence b, gathered through the block table.
    pub fn dense_kv(&self, b: usize) -> (Vec<T>, Vec<T>) {
        let (row, v_row) = (self.case.heads_kv * self.case.head_dim, self.case.heads_kv * self.case.dv());
        let (mut k, mut v) = (Vec::new(), Vec::new());
        for t in 0..self.case.seq_lens[b] {
            let s = self.slot(b, t);
            k.extend_from_slice(&self.k_cache[s * row..][..row]);
            v.extend_from_slice(&self.v_cache[s * v_row..][..v_row]);
        }
        (k, v)
    }

    /// The values the kernel's cache stands for: the 16-bit cache, or the FP8 cache dequantised.
    pub fn stored_kv(&self) -> (Vec<f64>, Vec<f64>) {
        match &self.fp8 {
            Some(c) => c.dequantized(),
            None => (to_f64(&self.k_cache), to_f64(&self.v_cache)),
        }
    }

    /// The fp64 reference (and the naive low-precision one) over the cache values `k`, `v` (laid out as
    /// `k_cache`: the fixture's own, or a dequantised FP8 cache) with this fixture's queries, table and
    /// variants.
    pub fn reference_kv(&self, k: &[f64], v: &[f64]) -> Result<(reference::Output, Vec<f64>)> {
        let c = &self.case;
        let cache = reference_cache(k, v, (self.cache_shape(), c.dv()), &self.block_table, self.width, &self.seq_lens);
        let wide = |x: &[f32]| x.iter().map(|&v| f64::from(v)).collect::<Vec<f64>>();
        let (slopes, sinks) = (wide(&self.alibi_slopes), wide(&self.sinks));
        let var = c.variants.reference(&slopes, &sinks);
        let (scale, q) = (self.scale(), self.reference_q());
        let exact = reference::paged_decode(c.heads_q, scale, &var, Arith::F64, &q, &cache)?;
        let naive = reference::paged_decode(c.heads_q, scale, &var, Arith::Lowp(T::DTYPE), &q, &cache)?.out;
        Ok((exact, naive))
    }
}

/// A RoPE table's cos, sin and positions on the GPU (one spare position, so an empty list still allocates).
pub(crate) type GpuRope =
    (cudarc::driver::CudaSlice<f32>, cudarc::driver::CudaSlice<f32>, cudarc::driver::CudaSlice<i32>);

/// Uploads a fixture's RoPE table and positions, if it has a table.
pub(crate) fn upload_rope(
    cu: &Arc<CudaStream>,
    table: Option<&crate::testkit::rope::PoisonedTable>,
    positions: &[i32],
) -> Result<Option<GpuRope>> {
    let Some(t) = table else { return Ok(None) };
    let pos: Vec<i32> = positions.iter().copied().chain([0]).collect();
    Ok(Some((cu.clone_htod(&t.cos)?, cu.clone_htod(&t.sin)?, cu.clone_htod(&pos)?)))
}

/// The views of a fixture's RoPE table and positions on one backend.
pub(crate) struct RopeViews<'a> {
    pub(crate) cos: TensorView<'a, f32, 2>,
    pub(crate) sin: TensorView<'a, f32, 2>,
    pub(crate) positions: TensorView<'a, i32, 1>,
    /// The case's RoPE the views are of.
    pub(crate) case: CaseRope,
}

impl<'a> RopeViews<'a> {
    /// Host views of a fixture's table and explicit positions (`None` without a table or a case).
    pub(crate) fn host(
        table: Option<&'a crate::testkit::rope::PoisonedTable>,
        positions: &'a [i32],
        case: Option<CaseRope>,
    ) -> Result<Option<Self>> {
        let (Some(t), Some(case)) = (table, case) else { return Ok(None) };
        let (cos, sin) = t.views()?;
        Ok(Some(Self { cos, sin, positions: TensorView::host(positions, [positions.len()])?, case }))
    }

    /// GPU views of a table and positions uploaded by [`upload_rope`] (`positions`: their count).
    pub(crate) fn gpu(
        uploaded: Option<&'a GpuRope>,
        table: Option<&crate::testkit::rope::PoisonedTable>,
        positions: usize,
        case: Option<CaseRope>,
    ) -> Result<Option<Self>> {
        let (Some((cos, sin, pos)), Some(t), Some(case)) = (uploaded, table, case) else { return Ok(None) };
        Ok(Some(Self {
            cos: TensorView::gpu(cos.as_view(), t.shape())?,
            sin: TensorView::gpu(sin.as_view(), t.shape())?,
            positions: TensorView::gpu(pos.slice(0..positions), [positions])?,
            case,
        }))
    }

    /// The op's [`Rope`](crate::rope::Rope) of the fixture's case.
    pub(crate) fn rope(&'a self) -> crate::rope::Rope<'a> {
        let r = self.case;
        crate::rope::Rope {
            cos: &self.cos,
            sin: &self.sin,
            rotary_dim: r.config.rotary_dim,
            style: r.config.style,
            positions: r.explicit_positions.then_some(&self.positions),
        }
    }
}

impl<T> PagedFixture<T> {
    /// The op's options for the fixture's case: its scale, splits, the score variants of `variants` and the
    /// RoPE of `rope` (views on the backend that runs it).
    pub(crate) fn options<'a>(
        &self,
        variants: &'a VariantViews<'a>,
        rope: Option<&'a RopeViews<'a>>,
    ) -> DecodeOptions<'a> {
        DecodeOptions {
            scale: self.inputs.scale,
            num_splits: self.case.num_splits,
            score_mod: variants.score_mod(&self.case.variants),
            rope: rope.map(RopeViews::rope),
        }
    }

    /// Host views of the case's RoPE table and positions, if it has RoPE.
    pub(crate) fn rope_views_host(&self) -> Result<Option<RopeViews<'_>>> {
        RopeViews::host(self.rope_table.as_ref(), &self.rope_positions, self.case.rope)
    }
}

/// The reference's view of a fixture's paged cache: the values `k` (`[num_pages, page_size, Hkv, Dqk]` =
/// `shape`), `v` (`[.., Dv]`, `head_dim_v`) through `block_table` (`width` columns) and `seq_lens`.
pub(crate) fn reference_cache<'a>(
    k: &'a [f64],
    v: &'a [f64],
    ([num_pages, page_size, heads_kv, head_dim], head_dim_v): ([usize; 4], usize),
    block_table: &'a [i32],
    width: usize,
    seq_lens: &'a [i32],
) -> reference::PagedCache<'a> {
    reference::PagedCache {
        k_cache: k,
        v_cache: v,
        num_pages,
        page_size,
        heads_kv,
        head_dim,
        head_dim_v,
        block_table,
        max_pages_per_seq: width,
        seq_lens,
    }
}

/// A fixture's K and V caches (`shape` = K's `[num_pages, page_size, Hkv, Dqk]`, V's the same with
/// `Dv` columns): NaN except in the slots of the `tokens` (sequence b's token range, placed through its
/// `block_table` row of `width` columns), which get K uniform in [-mag, mag) and V uniform in
/// 0.25·mag + [-0.5·mag, 0.5·mag) (offset so outputs are not ~ 0), drawn from `rng` token by token, K and V
/// interleaved (element i of K then of V; past the narrower row only the wider one's, so Dv = Dqk draws as
/// one head dim always has).
pub(crate) fn fill_cache<T: Element>(
    rng: &mut impl Rng,
    (shape, dv): ([usize; 4], usize),
    block_table: &[i32],
    width: usize,
    tokens: impl IntoIterator<Item = (usize, std::ops::Range<usize>)>,
    mag: f64,
) -> (Vec<T>, Vec<T>) {
    let [num_pages, ps, hkv, d] = shape;
    // Slots nobody writes (past seq_len, spare pages) hold the poison (FA_POISON: NaN by default).
    let mut k_cache = vec![crate::testkit::poison::hidden::<T>(); num_pages * ps * hkv * d];
    let mut v_cache = vec![crate::testkit::poison::hidden::<T>(); num_pages * ps * hkv * dv];
    for (b, range) in tokens {
        for t in range {
            let page = block_table[b * width + t / ps] as usize;
            let slot = page * ps + t % ps;
            let (k_row, v_row) =
                (&mut k_cache[slot * hkv * d..][..hkv * d], &mut v_cache[slot * hkv * dv..][..hkv * dv]);
            for i in 0..hkv * d.max(dv) {
                if let Some(x) = k_row.get_mut(i) {
                    *x = T::from_f64(rng.random_range(-mag..mag));
                }
                if let Some(x) = v_row.get_mut(i) {
                    *x = T::from_f64(0.25 * mag + rng.random_range(-0.5 * mag..0.5 * mag));
                }
            }
        }
    }
    (k_cache, v_cache)
}

/// LSE tolerance (absolute, natural log): the kernel's LSE is fp32 from exactly the reference's inputs.
pub const LSE_ATOL: f64 = 1e-3;

/// The LSE tolerance of a result: [`LSE_ATOL`] plus 16u · max |LSE| (u = 2^-24) for large scores.
pub fn lse_tolerance(reference_lse: &[f64]) -> f64 {
    let max = reference_lse.iter().filter(|x| x.is_finite()).fold(0.0f64, |a, x| a.max(x.abs()));
    LSE_ATOL + 16.0 * max / (1u64 << 24) as f64
}

/// The verdict on one case.
#[derive(Debug, Clone)]
pub struct CaseOutcome {
    pub seed: u64,
    pub plan: DecodePlan,
    /// O against the fp64 reference (over the stored cache: an FP8 case's dequantised values) under the
    /// tolerance rule.
    pub out: Comparison,
    /// LSE against the reference (within [`lse_tolerance`]; −inf must match exactly).
    pub lse: Comparison,
    /// Every row of an empty sequence is exactly O = 0, LSE = −inf.
    pub empty_rows_exact: bool,
    /// An FP8 case: its quantisation error against the 16-bit cache (reported, not judged).
    pub quant: Option<QuantError>,
}

impl CaseOutcome {
    pub fn passed(&self) -> bool {
        self.out.passed && self.lse.passed && self.empty_rows_exact
    }
    pub fn summary(&self) -> String {
        format!(
            "seed={} splits={} max|err|={:.2e} (tol {:.2e}, naive {:.2e}, err/bound {:.2}) rel-L2={:.2e} lse max|err|={:.2e} {}{}",
            self.seed,
            self.plan.num_splits,
            self.out.max_abs_err,
            self.out.tolerance,
            self.out.naive_max_abs_err,
            self.out.bound_ratio,
            self.out.rel_l2_err,
            self.lse.max_abs_err,
            if self.passed() { "ok" } else { "FAILED" },
            QuantError::suffix(self.quant)
        )
    }
}

pub(crate) fn to_f64<T: Element>(x: &[T]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

/// Compares a kernel's outputs for fixture `f` with the reference over the cache it read
/// ([`PagedFixture::stored_kv`]): O under the tolerance rule and the arithmetic bound
/// ([`reference::compare_bounded`]), LSE within [`lse_tolerance`]; an FP8 case's quantisation error too.
pub fn evaluate<T: Element>(
    f: &PagedFixture<T>,
    seed: u64,
    plan: DecodePlan,
    o: &[T],
    lse: &[f32],
) -> Result<CaseOutcome> {
    let c = &f.case;
    let (k, v) = f.stored_kv();
    let (exact, naive) = f.reference_kv(&k, &v)?;
    let bound = exact.out_bound(Some(T::DTYPE), Some(T::DTYPE));
    let ours = to_f64(o);
    let ours_lse: Vec<f64> = lse.iter().map(|&x| x as f64).collect();
    let d = c.dv();
    let empty_rows_exact = (0..c.batch()).filter(|&b| c.seq_lens[b] == 0).all(|b| {
        (0..c.heads_q).all(|h| {
            let r = b * c.heads_q + h;
            let empty_lse = f.sinks.get(h).copied().unwrap_or(f32::NEG_INFINITY);
            lse[r] == empty_lse && ours[r * d..(r + 1) * d].iter().all(|&x| x == 0.0)
        })
    });
    let quant = match f.fp8 {
        Some(_) => Some(QuantError::of(&ours, &f.reference_kv(&to_f64(&f.k_cache), &to_f64(&f.v_cache))?.0.out)),
        None => None,
    };
    Ok(CaseOutcome {
        seed,
        plan,
        out: reference::compare_bounded(&ours, &exact.out, &naive, &bound),
        lse: reference::compare_lse(&ours_lse, &exact.lse, lse_tolerance(&exact.lse)),
        empty_rows_exact,
        quant,
    })
}

/// Runs `case` on the emulator with outputs poisoned with NaN, and judges it.
pub fn check_case_emulated(emu: &Emulator, case: &DecodeCase, seed: u64) -> Result<CaseOutcome> {
    with_dtype!(case.dtype, T => run_case_emulated::<T>(emu, case, seed).map(|r| r.outcome))
}

/// One judged run with its data: the fixture, the kernel's outputs (o [B, Hq, Dv], lse [B, Hq]) and the
/// verdict (the runner's `--dump` writes them out).
#[derive(Debug, Clone)]
pub struct DecodeRun<T> {
    pub fixture: PagedFixture<T>,
    pub o: Vec<T>,
    pub lse: Vec<f32>,
    pub outcome: CaseOutcome,
}

/// [`check_case_emulated`] for a static element type, handing back the data too.
pub fn run_case_emulated<T: Element>(emu: &Emulator, case: &DecodeCase, seed: u64) -> Result<DecodeRun<T>> {
    run_inputs_emulated(emu, &PagedFixture::<T>::new(case, seed)?, seed)
}

/// [`check_case_emulated`] with inputs drawn and laid out as `inputs` says.
pub fn check_inputs_emulated(
    emu: &Emulator,
    case: &DecodeCase,
    inputs: &DecodeInputs,
    seed: u64,
) -> Result<CaseOutcome> {
    with_dtype!(case.dtype, T => {
        run_inputs_emulated(emu, &PagedFixture::<T>::with_inputs(case, inputs, seed)?, seed).map(|r| r.outcome)
    })
}

/// Runs fixture `f` on the emulator (its cache — 16-bit or FP8 — in its layout, q/o strided if it says
/// so, outputs poisoned with NaN) and judges it. Strided o: the neighbouring head slices must still be NaN
/// afterwards.
pub fn run_inputs_emulated<T: Element>(emu: &Emulator, f: &PagedFixture<T>, seed: u64) -> Result<DecodeRun<T>> {
    run_emulated_on(emu, f, seed, None)
}

/// [`run_inputs_emulated`] on the caller's workspace (e.g. a scheduled one), or, with `None`, on one
/// pinned to the plan for the case.
pub fn run_emulated_on<T: Element>(
    emu: &Emulator,
    f: &PagedFixture<T>,
    seed: u64,
    workspace: Option<&mut DecodeWorkspace>,
) -> Result<DecodeRun<T>> {
    let case = &f.case;
    let stream = Stream::Emu(emu);
    let (b, hq, d, dv) = (case.batch(), case.heads_q, case.head_dim, case.dv());
    // Strided q/o: head slices [hq..2hq) (q) and [2hq..3hq) (o) of packed [B, 3·Hq, D] buffers (o's of Dv).
    let (rows, q_at, o_at) = if f.inputs.strided_q_o { (3 * hq, hq, 2 * hq) } else { (hq, 0, 0) };
    let strides = [(rows * d) as i64, d as i64, 1];
    let o_strides = [(rows * dv) as i64, dv as i64, 1];
    let mut q_buf = vec![T::nan(); b * rows * d];
    for i in 0..b {
        q_buf[(i * rows + q_at) * d..][..hq * d].copy_from_slice(&f.q[i * hq * d..][..hq * d]);
    }
    let q = TensorView::host(&q_buf[q_at * d..], [b, hq, d])?.with_strides(strides)?;
    let mut o_buf = vec![T::nan(); b * rows * dv];
    let mut lse = vec![f32::NAN; b * hq];
    let variants = VariantViews::new(&case.variants, b, hq, |sinks, n| {
        TensorView::host(&(if sinks { &f.sinks } else { &f.alibi_slopes })[..n], [n])
    })?;
    let rope_views = f.rope_views_host()?;
    let opts = f.options(&variants, rope_views.as_ref());
    let mut own;
    let ws = match workspace {
        Some(ws) => ws,
        None => {
            own = case.workspace(&stream, &opts)?;
            &mut own
        }
    };
    let mut o_view = TensorViewMut::host(&mut o_buf[o_at * dv..], [b, hq, dv])?.with_strides(o_strides)?;
    let mut lse_view = TensorViewMut::host(&mut lse, [b, hq])?;
    let plan =
        with_cache_element!(f.fp8.as_ref(), decode_host::<T>(&stream, f, &q, &mut o_view, &mut lse_view, ws, &opts))?;
    let mut o = Vec::with_capacity(b * hq * dv);
    let mut stray = 0;
    for i in 0..b {
        let row = &o_buf[i * rows * dv..][..rows * dv];
        o.extend_from_slice(&row[o_at * dv..][..hq * dv]);
        stray += row
            .iter()
            .enumerate()
            .filter(|&(x, v)| !(o_at * dv..(o_at + hq) * dv).contains(&x) && !v.to_f64().is_nan())
            .count();
    }
    let mut outcome = evaluate(f, seed, plan, &o, &lse)?;
    if stray > 0 {
        outcome.out.passed = false;
        outcome.out.max_abs_err = f64::INFINITY;
    }
    Ok(DecodeRun { fixture: f.clone(), o, lse, outcome })
}

/// One decode of `f` over its cache as `C`, in the fixture's layout, on host memory.
#[allow(clippy::too_many_arguments)]
fn decode_host<T: Element, C: CacheElement<T>>(
    stream: &Stream<'_>,
    f: &PagedFixture<T>,
    q: &TensorView<'_, T, 3>,
    o: &mut TensorViewMut<'_, T, 3>,
    lse: &mut TensorViewMut<'_, f32, 2>,
    ws: &mut DecodeWorkspace,
    opts: &DecodeOptions<'_>,
) -> Result<DecodePlan> {
    let cb = f.cache_buffers::<C>()?;
    let (shape, v_shape) = (f.cache_shape(), f.v_cache_shape());
    let scales = f.fp8.as_ref().map(|c| c.scales(stream)).transpose()?;
    let cache = PagedKvCache::new(
        TensorView::host(&cb.bufs[cb.k.0][cb.k.1..], shape)?.with_strides(cb.k.2)?,
        TensorView::host(&cb.bufs[cb.v.0][cb.v.1..], v_shape)?.with_strides(cb.v.2)?,
        TensorView::host(&f.block_table, [f.case.batch(), f.width])?,
        TensorView::host(&f.seq_lens, [f.case.batch()])?,
        f.case.max_seq_len(),
    )?;
    let cache = match &scales {
        Some(s) => cache.with_scales(s)?,
        None => cache,
    };
    decode(stream, q, &cache, o, Some(lse), ws, opts)
}

/// One decode on host memory (the emulator) into NaN-poisoned outputs: o `[B, Hq, Dv]` (the cache's V head
/// dim), lse `[B, Hq]`, and the plan it ran (what the tests' direct calls of the op share).
pub fn decode_on_host<T: Element, C: KvCacheOf<T>>(
    stream: &Stream<'_>,
    q: &TensorView<'_, T, 3>,
    cache: &PagedKvCache<'_, C>,
    ws: &mut DecodeWorkspace,
    opts: &DecodeOptions<'_>,
) -> Result<(Vec<T>, Vec<f32>, DecodePlan)> {
    let [b, hq, _] = q.shape();
    let d = cache.geometry().head_dim_v;
    let mut o = vec![T::nan(); b * hq * d];
    let mut lse = vec![f32::NAN; b * hq];
    let plan = decode(
        stream,
        q,
        cache,
        &mut TensorViewMut::host(&mut o, [b, hq, d])?,
        Some(&mut TensorViewMut::host(&mut lse, [b, hq])?),
        ws,
        opts,
    )?;
    Ok((o, lse, plan))
}

/// The fixture's data on the GPU (its cache as `C`: the fixture's own 16-bit values, or its FP8 codes with
/// their scales), the outputs (NaN-poisoned) and the workspace for its plan.
pub(crate) struct GpuCase<T: Element, C: KvCacheOf<T>> {
    inputs: GpuPaged<T, C>,
    pub(crate) o: cudarc::driver::CudaSlice<T>,
    pub(crate) lse: cudarc::driver::CudaSlice<f32>,
    /// RoPE: cos, sin and positions.
    rope: Option<GpuRope>,
    ws: DecodeWorkspace,
}

impl<T: Element, C: CacheElement<T>> GpuCase<T, C> {
    /// Uploads `f` with its cache as `C`.
    pub(crate) fn upload(cu: &Arc<CudaStream>, f: &PagedFixture<T>) -> Result<Self> {
        let c = &f.case;
        let (b, hq, dv) = (c.batch(), c.heads_q, c.dv());
        let stream = Stream::Gpu(cu);
        // The window is what planning and scheduling read of the options (the schedule clips spans to it).
        let score_mod = crate::ScoreMod { window: c.variants.window, ..Default::default() };
        let opts = DecodeOptions { scale: f.inputs.scale, num_splits: c.num_splits, score_mod, ..Default::default() };
        Ok(Self {
            inputs: GpuPaged::upload(cu, &f.host())?,
            o: cu.clone_htod(&vec![T::nan(); b * hq * dv])?,
            lse: cu.clone_htod(&vec![f32::NAN; b * hq])?,
            rope: upload_rope(cu, f.rope_table.as_ref(), &f.rope_positions)?,
            ws: c.workspace(&stream, &opts)?,
        })
    }

    pub(crate) fn run(&mut self, cu: &Arc<CudaStream>, f: &PagedFixture<T>) -> Result<DecodePlan> {
        let c = &f.case;
        let (b, hq, d) = (c.batch(), c.heads_q, c.head_dim);
        let cache = self.inputs.cache(c.max_seq_len())?;
        let variants = self.inputs.variants(&c.variants, b, hq)?;
        let rope_views = RopeViews::gpu(self.rope.as_ref(), f.rope_table.as_ref(), f.rope_positions.len(), c.rope)?;
        let opts = f.options(&variants, rope_views.as_ref());
        decode(
            &Stream::Gpu(cu),
            &TensorView::gpu(self.inputs.q.as_view(), [b, hq, d])?,
            &cache,
            &mut TensorViewMut::gpu(self.o.as_view_mut(), [b, hq, c.dv()])?,
            Some(&mut TensorViewMut::gpu(self.lse.as_view_mut(), [b, hq])?),
            &mut self.ws,
            &opts,
        )
    }
}

/// Runs `case` on the GPU behind `cu` with outputs poisoned with NaN, and judges it.
pub fn check_case_gpu(cu: &Arc<CudaStream>, case: &DecodeCase, seed: u64) -> Result<CaseOutcome> {
    with_dtype!(case.dtype, T => run_case_gpu::<T>(cu, case, seed).map(|r| r.outcome))
}

/// [`check_case_gpu`] for a static element type, handing back the data too.
pub fn run_case_gpu<T: Element>(cu: &Arc<CudaStream>, case: &DecodeCase, seed: u64) -> Result<DecodeRun<T>> {
    fn go<T: Element, C: CacheElement<T>>(
        cu: &Arc<CudaStream>,
        f: &PagedFixture<T>,
    ) -> Result<(Vec<T>, Vec<f32>, DecodePlan)> {
        let mut g = GpuCase::<T, C>::upload(cu, f)?;
        let plan = g.run(cu, f)?;
        Ok((cu.clone_dtoh(&g.o)?, cu.clone_dtoh(&g.lse)?, plan))
    }
    let f = PagedFixture::<T>::new(case, seed)?;
    let (o, lse, plan) = with_cache_element!(f.fp8.as_ref(), go::<T>(cu, &f))?;
    let outcome = evaluate(&f, seed, plan, &o, &lse)?;
    Ok(DecodeRun { fixture: f, o, lse, outcome })
}

/// Bytes a decode moves, per docs/semantics.md: K and V actually read (one byte per element and the
/// scales for an FP8 cache), Q (of Dqk columns), O (of Dv), LSE, and the split workspace (fp32 partial O
/// and LSE written once and read once by the merge).
pub fn decode_bytes(case: &DecodeCase, plan: &DecodePlan) -> usize {
    let elem = 2;
    let rows = case.batch() * case.heads_q;
    let workspace = if plan.num_splits > 1 { 2 * 4 * (plan.partial_o_len + plan.partial_lse_len) } else { 0 };
    let scales = if case.kv.fp8().is_some() { 2 * 4 * case.heads_kv } else { 0 };
    case.kv_bytes() + scales + rows * (case.head_dim + case.dv()) * elem + rows * 4 + workspace
}

/// GPU timing of one case: CUDA events, `warmup` untimed launches then the median of `iters`.
#[derive(Debug, Clone, Copy)]
pub struct DecodeTiming {
    pub timing: Timing,
    pub plan: DecodePlan,
    pub bytes: usize,
    pub gbps: f64,
}

/// Times `case` (decode + merge when split) on `cu`. Inputs are the fixture's; cases meant for bandwidth
/// should be larger than L2 (the perf shapes are hundreds of MB) so every launch streams from HBM.
pub fn time_case_gpu(cu: &Arc<CudaStream>, case: &DecodeCase, seed: u64, runs: Runs) -> Result<DecodeTiming> {
    fn go<T: Element, C: CacheElement<T>>(
        cu: &Arc<CudaStream>,
        f: &PagedFixture<T>,
        runs: Runs,
    ) -> Result<DecodeTiming> {
        let mut g = GpuCase::<T, C>::upload(cu, f)?;
        // The plan the launches follow (a scheduled case's: the summary of its schedule, from a first run).
        let plan = g.run(cu, f)?;
        let timing = time_launches(cu, runs, |_| g.run(cu, f).map(|_| ()))?;
        let bytes = decode_bytes(&f.case, &plan);
        Ok(DecodeTiming { timing, plan, bytes, gbps: bytes as f64 / (timing.median_ms * 1e-3) / 1e9 })
    }
    with_dtype!(case.dtype, T => {
        let f = PagedFixture::<T>::new(case, seed)?;
        with_cache_element!(f.fp8.as_ref(), go::<T>(cu, &f, runs))
    })
}

/// The performance shapes of issue 5 (bf16, D = 128, Hq = 32, Hkv = 8, page 16): B = 64 at 4096 tokens
/// (bar: 85% of copy bandwidth) and B = 1 at 32768 tokens with split-KV (bar: 60%).
pub fn perf_cases() -> Vec<DecodeCase> {
    [(64, 4096), (1, 32768)]
        .into_iter()
        .map(|(batch, ctx)| DecodeCase::new(DType::Bf16, 128, (32, 8), 16, &vec![ctx; batch], None))
        .collect()
}

/// One performance row: a perf case, its timing and the ratio of its bandwidth to the copy bandwidth
/// measured in the same run.
#[derive(Debug, Clone)]
pub struct PerfRow {
    pub case: DecodeCase,
    pub timing: DecodeTiming,
    pub copy_gbps: f64,
    pub ratio: f64,
}

/// Measures [`perf_cases`] on `cu` against a device-to-device copy of 1 GiB (the ceiling of docs/semantics.md).
pub fn perf_report(cu: &Arc<CudaStream>, seed: u64) -> Result<Vec<PerfRow>> {
    let copy_gbps = crate::testkit::timing::copy_bandwidth_gbps(cu, 1 << 30)?;
    perf_cases()
        .into_iter()
        .map(|case| {
            let timing = time_case_gpu(cu, &case, seed, Runs { warmup: 5, iters: 50 })?;
            Ok(PerfRow { ratio: timing.gbps / copy_gbps, case, timing, copy_gbps })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    #[test]
    fn sweep_sizes_and_coverage() {
        assert_eq!(decode_sweep().len(), 480);
        let emu = decode_sweep_emulated();
        assert_eq!(emu.len(), 48);
        for &h in &SWEEP_HEADS {
            for &d in &SWEEP_HEAD_DIMS {
                for &t in &SWEEP_DTYPES {
                    assert!(emu.iter().any(|c| (c.heads_q, c.heads_kv) == h && c.head_dim == d && c.dtype == t));
                }
            }
        }
        for &p in &SWEEP_PAGE_SIZES {
            for &s in &SWEEP_SPLITS {
                assert!(emu.iter().any(|c| c.page_size == p && c.num_splits == s), "page {p} splits {s:?}");
            }
        }
        for &h in &SWEEP_HEADS {
            assert!(emu.iter().any(|c| (c.heads_q, c.heads_kv) == h));
        }
        for &d in &SWEEP_HEAD_DIMS {
            for &t in &SWEEP_DTYPES {
                assert!(emu.iter().any(|c| c.head_dim == d && c.dtype == t));
            }
        }
    }

    #[test]
    fn fixture_poisons_everything_unowned() {
        let case = DecodeCase::new(DType::Bf16, 64, (4, 2), 8, &[0, 3, 17], None);
        let f = PagedFixture::<bf16>::new(&case, 1).unwrap();
        assert_eq!(f.width, 4);
        assert_eq!(f.num_pages, 1 + 1 + 3 + 2); // null page, pages of the sequences, two spares
        let owned: usize = case.seq_lens.iter().sum::<usize>() * 2 * 64;
        let finite = f.k_cache.iter().filter(|x| x.to_f64().is_finite()).count();
        assert_eq!(finite, owned);
        // Every page id is used at most once and page 0 only as padding.
        let mut used: Vec<i32> = f.block_table.iter().copied().filter(|&p| p != 0).collect();
        used.sort();
        used.dedup();
        assert_eq!(used.len(), 4);
        let (k, _) = f.dense_kv(2);
        assert_eq!(k.len(), 17 * 2 * 64);
        assert!(k.iter().all(|x| x.to_f64().is_finite()));
    }
}
