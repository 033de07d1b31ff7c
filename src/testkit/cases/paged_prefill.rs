//! Paged prefill test cases and the fixture they run on: a paged cache built the adversarial way (as
//! decode's, [`crate::testkit::cases::decode`]): pages handed out in shuffled order, page 0 a reserved null page,
//! every slot no sequence owns holding NaN, block-table columns past a sequence's pages pointing at the null
//! page; optionally a prefix of whole pages *shared* by every sequence (prefix caching: the same page ids
//! in every row of the block table). A kernel that reads or lets any of that leak produces NaN.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use rand::seq::SliceRandom;
use rand::Rng;

use crate::dtype::{DType, Element, Fp8Format, KvCacheOf};
use crate::emu::Emulator;
use crate::error::Result;
use crate::fp8::ScaleKind;
use crate::paged::PagedKvCache;
use crate::paged_prefill::{
    paged_prefill, PagedPrefillKernel, PagedPrefillOptions, PagedPrefillPlan, PagedPrefillProblem,
    PagedPrefillWorkspace, MAX_PLANNED_SPLITS,
};
use crate::reference::{self, Arith, Comparison};
use crate::schedule::SplitPolicy;
use crate::tensor::{TensorView, TensorViewMut};
use crate::testkit::cases::decode::{
    fill_cache, lse_tolerance, reference_cache, to_f64, upload_rope, CaseRope, GpuRope, RopeViews,
};
use crate::testkit::cases::kv::{
    paged_host, with_cache_element, CacheElement, Fp8Cache, GpuPaged, KvFormat, PagedHost, QuantError,
};
use crate::testkit::cases::prefill::VariantViews;
use crate::testkit::cases::with_dtype;
use crate::testkit::timing::{time_launches, Runs, Timing};
use crate::testkit::variants::CaseVariants;
use crate::Stream;

/// One paged prefill case: a ragged batch of (q_len, seq_len) sequences over a paged cache.
#[derive(Debug, Clone, PartialEq)]
pub struct PagedPrefillCase {
    pub dtype: DType,
    /// Q·K's head dim Dqk (q and the K pages).
    pub head_dim: usize,
    /// V's and O's head dim Dv when it differs from `head_dim` (V pages `[.., Dv]`, o `[total_q, Hq, Dv]`;
    /// docs/head-dims.md); `None`: `head_dim`.
    pub head_dim_v: Option<usize>,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub page_size: usize,
    /// (q_len, seq_len) per sequence; seq_len includes the q_len new tokens (q_len > seq_len is allowed).
    pub seqs: Vec<(usize, usize)>,
    pub causal: bool,
    /// Forced split count (`None`: the planner's choice for the emulator's SM count).
    pub num_splits: Option<usize>,
    /// Tokens (a multiple of page_size, at most every seq_len) whose pages every sequence shares.
    pub shared_prefix: usize,
    pub variants: CaseVariants,
    /// The cache's element format: the 16-bit dtype, or FP8 quantised from it.
    pub kv: KvFormat,
    /// The kernel asked for (Auto: streaming for short queries).
    pub kernel: PagedPrefillKernel,
    /// Rotary embedding of q ([`CaseRope`]: explicit positions, one per query token, or each token's place
    /// in the cache); `None`: q is taken as already rotated (so is the cache's K either way).
    pub rope: Option<CaseRope>,
    /// Run on a scheduled workspace ([`PagedPrefillWorkspace::scheduled`], made for the case's own shape);
    /// `None`: a uniform plan.
    pub schedule: Option<CaseSchedule>,
}

/// How a case's scheduled workspace is made: the split policy and the CTA slots it packs onto.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaseSchedule {
    pub policy: SplitPolicy,
    /// CTA slots (`None`: the device's, or the emulated H100's 396).
    pub slots: Option<usize>,
}

impl CaseSchedule {
    pub fn label(&self) -> String {
        let policy = match self.policy {
            SplitPolicy::Balanced => "balanced".to_string(),
            SplitPolicy::FixedSplitTokens(t) => format!("fixed:{t}"),
        };
        format!(" sched={policy}{}", self.slots.map_or(String::new(), |s| format!("/{s}")))
    }
}

impl PagedPrefillCase {
    pub fn batch(&self) -> usize {
        self.seqs.len()
    }
    /// V's and O's head dim Dv.
    pub fn dv(&self) -> usize {
        self.head_dim_v.unwrap_or(self.head_dim)
    }
    /// The wider of Dqk and Dv: the kernel's width, what plans and workspaces are sized by.
    pub fn widest_head_dim(&self) -> usize {
        self.head_dim.max(self.dv())
    }
    pub fn total_q(&self) -> usize {
        self.seqs.iter().map(|s| s.0).sum()
    }
    pub fn max_seqlen_q(&self) -> usize {
        self.seqs.iter().map(|s| s.0).max().unwrap_or(0)
    }
    pub fn max_seq_len(&self) -> usize {
        self.seqs.iter().map(|s| s.1).max().unwrap_or(0)
    }
    /// The case's shape as the limits of a workspace made for it.
    pub fn limits(&self) -> PagedPrefillProblem {
        PagedPrefillProblem {
            batch: self.batch(),
            heads_q: self.heads_q,
            heads_kv: self.heads_kv,
            head_dim: self.widest_head_dim(),
            total_q: self.total_q(),
            max_seqlen_q: self.max_seqlen_q(),
            max_seq_len: self.max_seq_len(),
        }
    }
    /// A workspace for this case on `stream`: scheduled ([`Self::schedule`]) or room for `num_splits` (at
    /// least the planner's most) uniform splits.
    pub fn workspace(&self, stream: &Stream<'_>, num_splits: Option<usize>) -> Result<PagedPrefillWorkspace> {
        match self.schedule {
            Some(s) => match s.slots {
                Some(slots) => PagedPrefillWorkspace::scheduled_on(stream, &self.limits(), s.policy, slots),
                None => PagedPrefillWorkspace::scheduled(stream, &self.limits(), s.policy),
            },
            None => {
                let cap = num_splits.unwrap_or(1).max(MAX_PLANNED_SPLITS);
                PagedPrefillWorkspace::with_capacity(stream, self.total_q(), self.heads_q, self.widest_head_dim(), cap)
            }
        }
    }
    pub fn cu_seqlens_q(&self) -> Vec<i32> {
        let mut cu = vec![0i32];
        for &(q, _) in &self.seqs {
            cu.push(cu.last().unwrap() + q as i32); // ok: starts as [0]
        }
        cu
    }
    pub fn label(&self) -> String {
        let seqs: Vec<String> = self.seqs.iter().map(|(q, k)| format!("{q}/{k}")).collect();
        self.kv.label(format!(
            "{} D={}{} Hq={} Hkv={} page={} q/k=[{}]{}{}{}{}{}",
            self.dtype.name(),
            self.head_dim,
            self.head_dim_v.map_or(String::new(), |dv| format!(" Dv={dv}")),
            self.heads_q,
            self.heads_kv,
            self.page_size,
            seqs.join(","),
            if self.causal { "" } else { " bidirectional" },
            self.num_splits.map_or(String::new(), |n| format!(" splits={n}")),
            if self.shared_prefix > 0 { format!(" shared={}", self.shared_prefix) } else { String::new() },
            if self.variants.is_plain() { "" } else { " " },
            self.variants.label()
        )) + match self.kernel {
            PagedPrefillKernel::Auto => "",
            PagedPrefillKernel::Tiled => " tiled",
            PagedPrefillKernel::Streaming => " streaming",
        } + &self.rope.map_or(String::new(), |r| format!(" {}", r.label()))
            + &self.schedule.map_or(String::new(), |s| s.label())
    }
}

/// A plain causal bf16 case (the sweep's building block).
pub fn case(head_dim: usize, heads: (usize, usize), page_size: usize, seqs: &[(usize, usize)]) -> PagedPrefillCase {
    PagedPrefillCase {
        dtype: DType::Bf16,
        head_dim,
        head_dim_v: None,
        heads_q: heads.0,
        heads_kv: heads.1,
        page_size,
        seqs: seqs.to_vec(),
        causal: true,
        num_splits: None,
        shared_prefix: 0,
        variants: CaseVariants::default(),
        kv: KvFormat::Sixteen,
        rope: None,
        kernel: PagedPrefillKernel::Auto,
        schedule: None,
    }
}

/// The emulated sweep: page sizes 1..256, q_len in {1, 2, 5, 16, 17, 100, 1000}, contexts from q_len to
/// 4k+, GQA groups 1..16, ragged batches (with an empty sequence and a q_len > seq_len one), shuffled pages,
/// shared prefixes, splits, both dtypes, the head-dim widths and a non-instantiated head dim. Sized for CI:
/// the 1000-token and 4k cases are one each, with one KV head.
pub fn paged_prefill_sweep_emulated() -> Vec<PagedPrefillCase> {
    let mut v = vec![
        case(64, (4, 4), 1, &[(1, 1), (2, 9), (5, 5)]),
        case(64, (8, 2), 8, &[(5, 40), (0, 13), (16, 16), (17, 50)]),
        case(128, (16, 1), 16, &[(2, 100), (16, 200), (1, 17)]),
        case(128, (8, 1), 64, &[(17, 300), (5, 3), (100, 130)]),
        case(64, (2, 1), 256, &[(100, 600), (1, 300)]),
        case(32, (4, 2), 16, &[(1000, 1000)]),
        case(64, (2, 1), 32, &[(16, 4100), (5, 700)]),
        case(256, (8, 2), 16, &[(5, 80), (9, 9), (1, 33)]),
        case(96, (6, 3), 16, &[(17, 90), (2, 2)]),
        case(40, (4, 1), 16, &[(5, 70), (16, 33)]),
    ];
    // Shared prefixes (prefix caching): every sequence's first pages are the same pages.
    let mut shared = case(64, (8, 2), 16, &[(5, 100), (17, 64), (1, 48), (16, 200)]);
    shared.shared_prefix = 48;
    v.push(shared);
    let mut shared1 = case(128, (4, 1), 1, &[(2, 20), (5, 9)]);
    shared1.shared_prefix = 7;
    v.push(shared1);
    // fp16, bidirectional.
    let mut f16 = case(64, (4, 2), 16, &[(5, 40), (16, 20), (3, 1)]);
    f16.dtype = DType::F16;
    f16.causal = false;
    v.push(f16);
    // Split-KV: forced and planned (few rows, long context).
    let mut split = case(64, (8, 2), 16, &[(5, 700), (17, 300), (0, 100), (1, 1)]);
    split.num_splits = Some(3);
    v.push(split);
    v.push(case(128, (4, 1), 64, &[(4, 2100)]));
    v
}

/// The score-variant cases (window, softcap, ALiBi, sinks; unsplit and split).
pub fn paged_prefill_variant_sweep() -> Vec<PagedPrefillCase> {
    use crate::testkit::variants::CaseAlibi;
    let with = |mut c: PagedPrefillCase, variants: CaseVariants, splits: Option<usize>| {
        c.variants = variants;
        c.num_splits = splits;
        c
    };
    let seqs = [(5, 90), (17, 40), (1, 1), (3, 0)];
    vec![
        with(case(64, (8, 2), 16, &seqs), CaseVariants { window: Some((20, 0)), ..Default::default() }, None),
        with(case(64, (4, 1), 8, &seqs), CaseVariants { softcap: Some(5.0), ..Default::default() }, Some(2)),
        with(case(128, (8, 2), 16, &seqs), CaseVariants { alibi: CaseAlibi::PerSequence, ..Default::default() }, None),
        with(case(64, (8, 4), 16, &seqs), CaseVariants { sinks: true, ..Default::default() }, None),
        with(
            case(64, (8, 4), 16, &seqs),
            CaseVariants { sinks: true, alibi: CaseAlibi::PerHead, ..Default::default() },
            Some(2),
        ),
        {
            let mut c = with(
                case(64, (4, 2), 16, &seqs),
                CaseVariants { window: Some((7, 3)), softcap: Some(10.0), sinks: true, ..Default::default() },
                None,
            );
            c.causal = false;
            c
        },
    ]
}

/// Both kernels on the short queries (issue 25): every case of the sweep and the variant sweep whose
/// `max_seqlen_q · G` is at most 4 streaming row blocks, forced onto the streaming (decode) kernel and onto the
/// tiled one, plus streaming's own edges: 16 / 17 / 32 / 33 packed rows, windows whose per-row starts cut
/// tiles and splits, a bidirectional window, ALiBi at per-row distances, q_len > seq_len, head dims at the
/// decode widths' edges (40 -> 64, 96 -> 128, 136 -> 256), FP8 of both formats, forced splits.
pub fn paged_prefill_kernel_sweep() -> Vec<PagedPrefillCase> {
    use crate::testkit::variants::CaseAlibi;
    let short = |c: &PagedPrefillCase| c.max_seqlen_q() * (c.heads_q / c.heads_kv) <= 64;
    let mut base: Vec<PagedPrefillCase> =
        paged_prefill_sweep_emulated().into_iter().chain(paged_prefill_variant_sweep()).filter(short).collect();
    let with = |mut c: PagedPrefillCase, variants: CaseVariants, splits: Option<usize>| {
        c.variants = variants;
        c.num_splits = splits;
        c
    };
    let window = |l: i32, r: i32| CaseVariants { window: Some((l, r)), ..Default::default() };
    base.extend([
        case(64, (4, 1), 16, &[(4, 300), (5, 77), (8, 8)]), // 16, 20, 32 packed rows
        case(128, (8, 1), 8, &[(2, 130), (4, 97), (3, 2)]), // 16, 32, 24 (q_len > seq_len)
        with(case(128, (4, 2), 16, &[(8, 500), (3, 64)]), window(37, 0), None),
        with(case(64, (8, 2), 16, &[(4, 900), (9, 200)]), window(100, 0), Some(3)),
        with(case(64, (2, 1), 1, &[(6, 60), (2, 7)]), window(5, 2), None),
        with(
            case(256, (4, 1), 16, &[(4, 150), (1, 40)]),
            CaseVariants { alibi: CaseAlibi::PerHead, softcap: Some(20.0), ..Default::default() },
            Some(2),
        ),
        case(40, (2, 1), 16, &[(7, 50)]),
        case(96, (3, 3), 16, &[(11, 70), (16, 16)]),
        case(136, (4, 2), 32, &[(5, 90)]),
    ]);
    let mut bidirectional = with(case(64, (4, 2), 16, &[(6, 80), (3, 30)]), window(9, 4), None);
    bidirectional.causal = false;
    base.push(bidirectional);
    for (format, scales) in [(Fp8Format::E4m3, ScaleKind::PerHead), (Fp8Format::E5m2, ScaleKind::PerTensor)] {
        let mut c = with(case(128, (8, 2), 16, &[(4, 260), (2, 33)]), window(64, 0), Some(2));
        c.kv = KvFormat::Fp8 { format, scales };
        base.push(c);
    }
    base.into_iter()
        .flat_map(|c| {
            [PagedPrefillKernel::Streaming, PagedPrefillKernel::Tiled]
                .map(|kernel| PagedPrefillCase { kernel, ..c.clone() })
        })
        .collect()
}

/// Scheduled streaming paged prefill (issue 25): skewed batches of short queries on a scheduled workspace
/// of 12-16 CTA slots (so the long sequences are cut and merged per query row): GQA groups 1, 2, 4 and 8,
/// q_len 0..8 (one and two row blocks per KV head), a causal window, a bidirectional one with a right
/// bound, q_len > seq_len at page size 1, sinks with ALiBi and softcap (the merge adds the sink once), FP8
/// of both formats, fixed split sizes, a shared prefix.
pub fn scheduled_paged_prefill_sweep() -> Vec<PagedPrefillCase> {
    use crate::testkit::variants::CaseAlibi;
    let sched = |mut c: PagedPrefillCase, policy: SplitPolicy, slots: usize, variants: CaseVariants| {
        c.schedule = Some(CaseSchedule { policy, slots: Some(slots) });
        c.kernel = PagedPrefillKernel::Streaming;
        c.variants = variants;
        c
    };
    let bal = SplitPolicy::Balanced;
    let plain = CaseVariants::default;
    let window = |l: i32, r: i32| CaseVariants { window: Some((l, r)), ..Default::default() };
    let mut v = vec![
        sched(case(64, (2, 2), 16, &[(8, 2000), (1, 40), (3, 300), (0, 50), (5, 3), (2, 700)]), bal, 16, plain()),
        sched(case(128, (8, 2), 16, &[(4, 3000), (2, 64), (8, 500), (1, 1), (6, 900)]), bal, 16, plain()),
        sched(case(64, (16, 2), 8, &[(4, 2500), (1, 100), (3, 7), (4, 1200)]), bal, 16, plain()),
        sched(case(128, (8, 2), 16, &[(4, 3000), (6, 200), (2, 1000)]), bal, 12, window(1000, 0)),
        sched(case(64, (4, 1), 1, &[(6, 4), (4, 900), (8, 2)]), bal, 16, plain()),
        sched(
            case(64, (8, 2), 16, &[(4, 1800), (2, 50), (3, 600)]),
            bal,
            16,
            CaseVariants { sinks: true, alibi: CaseAlibi::PerHead, softcap: Some(20.0), ..Default::default() },
        ),
        sched(case(64, (8, 2), 16, &[(4, 1500), (3, 260), (1, 5)]), SplitPolicy::FixedSplitTokens(256), 16, plain()),
        sched(case(64, (8, 2), 16, &[(4, 1500), (7, 900)]), SplitPolicy::FixedSplitTokens(192), 16, window(500, 0)),
    ];
    let mut bidirectional = sched(case(64, (4, 2), 16, &[(5, 1500), (3, 90), (7, 640)]), bal, 16, window(600, 5));
    bidirectional.causal = false;
    v.push(bidirectional);
    for (format, scales, c, w) in [
        (Fp8Format::E4m3, ScaleKind::PerHead, case(128, (8, 2), 16, &[(4, 2600), (2, 33), (5, 700)]), window(640, 0)),
        (Fp8Format::E5m2, ScaleKind::PerTensor, case(64, (4, 1), 16, &[(8, 2100), (1, 20)]), plain()),
    ] {
        let mut c = sched(c, bal, 16, w);
        c.kv = KvFormat::Fp8 { format, scales };
        v.push(c);
    }
    let mut shared = sched(case(64, (8, 2), 16, &[(4, 1200), (2, 64), (3, 800)]), bal, 16, plain());
    shared.shared_prefix = 64;
    v.push(shared);
    v
}

/// The emulated FP8 sweep: both formats x both scale kinds x both dtypes, page sizes 1..256, every
/// instantiated width (32..256), GQA groups 1..8, q_len 1..300 (short chunks packed into one CTA and a
/// multi-block chunk), an empty sequence, a q_len > seq_len one, forced and planned splits, a shared prefix,
/// and softcap / ALiBi / window + sinks on some. Sized for CI (a few seconds).
pub fn fp8_paged_prefill_sweep_emulated() -> Vec<PagedPrefillCase> {
    use crate::testkit::variants::CaseAlibi;
    let with = |mut c: PagedPrefillCase, dtype: DType, format: Fp8Format, scales: ScaleKind| {
        c.dtype = dtype;
        c.kv = KvFormat::Fp8 { format, scales };
        c
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

/// Head dims 264–512 (issue 27), which paged prefill runs on the streaming (decode) kernel at every query
/// length: each of 264, 320, 384, 448, 512 with chunked prefill (q_len up to 60 over contexts to 300),
/// spec-verify rows, q_len > seq_len, an empty sequence, page sizes 1, 12, 16, 64, GQA/MQA, forced splits,
/// bidirectional, the score variants, both dtypes, and FP8 caches of both formats at the multiples of 16.
pub fn paged_prefill_wide_head_dim_sweep() -> Vec<PagedPrefillCase> {
    use crate::testkit::variants::CaseAlibi;
    let mut v = Vec::new();
    for (i, d) in [264, 320, 384, 448, 512].into_iter().enumerate() {
        let page = [1, 12, 16, 64, 16][i];
        let heads = [(2, 1), (4, 2), (8, 1), (4, 4), (8, 2)][i];
        let mut c = case(d, heads, page, &[(60, 150), (4, 300), (0, 9), (7, 3)]);
        c.dtype = if i % 2 == 0 { DType::Bf16 } else { DType::F16 };
        c.causal = i != 3;
        v.push(c);
    }
    let mut split = case(512, (4, 1), 16, &[(20, 400), (3, 90)]);
    split.num_splits = Some(3);
    v.push(split);
    let mut variants = case(384, (8, 2), 12, &[(30, 120), (5, 5)]);
    variants.variants =
        CaseVariants { window: Some((25, 0)), sinks: true, alibi: CaseAlibi::PerHead, ..Default::default() };
    v.push(variants);
    let mut softcap = case(264, (4, 2), 16, &[(17, 80)]);
    (softcap.variants, softcap.causal) =
        (CaseVariants { window: Some((9, 6)), softcap: Some(8.0), ..Default::default() }, false);
    v.push(softcap);
    for (d, format, scales) in
        [(512, Fp8Format::E4m3, ScaleKind::PerHead), (320, Fp8Format::E5m2, ScaleKind::PerTensor)]
    {
        let mut c = case(d, (4, 2), 16, &[(24, 100), (2, 2)]);
        c.kv = KvFormat::Fp8 { format, scales };
        v.push(c);
    }
    v
}

/// A case's inputs on the host: the adversarial paged cache, q, the variant arrays.
pub struct PagedPrefillFixture<T> {
    pub case: PagedPrefillCase,
    pub num_pages: usize,
    /// Block-table width (max pages per sequence).
    pub width: usize,
    pub k_cache: Vec<T>,
    pub v_cache: Vec<T>,
    pub block_table: Vec<i32>,
    pub seq_lens: Vec<i32>,
    pub cu_seqlens_q: Vec<i32>,
    pub q: Vec<T>,
    pub alibi_slopes: Vec<f32>,
    pub sinks: Vec<f32>,
    /// The FP8 cache quantised from `k_cache` / `v_cache` when the case's cache is FP8 (what the kernel
    /// reads then); `None` for a 16-bit case.
    pub fp8: Option<Fp8Cache>,
    /// The case's RoPE table (poisoned) and explicit positions `[total_q]` (empty when unused).
    pub rope_table: Option<crate::testkit::rope::PoisonedTable>,
    pub rope_positions: Vec<i32>,
}

impl<T: Element> PagedPrefillFixture<T> {
    pub fn new(case: &PagedPrefillCase, seed: u64) -> Self {
        let mut rng = crate::testkit::seed::rng(seed);
        let (ps, hkv, d, dv) = (case.page_size, case.heads_kv, case.head_dim, case.dv());
        assert!(case.shared_prefix % ps == 0, "the shared prefix is whole pages");
        assert!(case.seqs.iter().all(|s| s.1 >= case.shared_prefix), "every sequence holds the shared prefix");
        let shared_pages = case.shared_prefix / ps;
        let pages_of: Vec<usize> = case.seqs.iter().map(|s| s.1.div_ceil(ps)).collect();
        let own: usize = pages_of.iter().map(|&n| n - shared_pages).sum();
        // Page 0 is the null page; 3 spare pages no one owns.
        let num_pages = 1 + shared_pages + own + 3;
        let width = pages_of.iter().copied().max().unwrap_or(0).max(1);
        let mut ids: Vec<i32> = (1..num_pages as i32).collect();
        ids.shuffle(&mut rng);
        let shared_ids: Vec<i32> = ids[..shared_pages].to_vec();
        let mut next = shared_pages;
        let mut block_table = vec![0i32; case.batch() * width];
        for (b, &n) in pages_of.iter().enumerate() {
            for p in 0..n {
                block_table[b * width + p] = if p < shared_pages {
                    shared_ids[p]
                } else {
                    next += 1;
                    ids[next - 1]
                };
            }
        }
        let mag = 1.0;
        // Shared slots are written by sequence 0 only (same values for everyone).
        let tokens =
            case.seqs.iter().enumerate().map(|(b, &(_, len))| (b, if b == 0 { 0 } else { case.shared_prefix }..len));
        let (mut k_cache, mut v_cache) =
            fill_cache(&mut rng, ([num_pages, ps, hkv, d], dv), &block_table, width, tokens, mag);
        // Keys no row sees (left of every row's window) are hidden memory: poisoned, as the unused slots are.
        let seqs = case.seqs.iter().enumerate().map(|(b, &(q_len, seq_len))| crate::testkit::poison::SeqRows {
            pages: &block_table[b * width..][..width],
            q_len,
            seq_len,
        });
        let window = crate::mask::Window::new(case.variants.window, case.causal);
        crate::testkit::poison::poison_unseen_slots(&mut k_cache, &mut v_cache, hkv * d, ps, seqs, window);
        // FP8: per-head scales grow with the head (x1 .. x2.5 for K, x1 .. x1.75 for V).
        let fp8 = case.kv.fp8().map(|kv| Fp8Cache::of_cache(&k_cache, &v_cache, (hkv, d, dv), kv, (1.5, 0.75)));
        let q = (0..case.total_q() * case.heads_q * d).map(|_| T::from_f64(rng.random_range(-mag..mag))).collect();
        // RoPE: positions drawn after everything else (the other inputs do not depend on them).
        let rope_positions: Vec<i32> = match &case.rope {
            Some(r) if r.explicit_positions => {
                (0..case.total_q()).map(|_| rng.random_range(0..CaseRope::MAX_POS as i32)).collect()
            }
            _ => Vec::new(),
        };
        let rope_table = case.rope.map(|r| {
            let used = rope_positions_of(case, &rope_positions);
            crate::testkit::rope::PoisonedTable::new(&r.config, CaseRope::MAX_POS, &used)
                .expect("a case's RoPE config makes a table") // ok: the cases' configs are valid
        });
        Self {
            alibi_slopes: case.variants.slopes(case.batch(), case.heads_q),
            sinks: case.variants.sinks(case.heads_q, seed),
            case: case.clone(),
            num_pages,
            width,
            k_cache,
            v_cache,
            block_table,
            seq_lens: case.seqs.iter().map(|s| s.1 as i32).collect(),
            cu_seqlens_q: case.cu_seqlens_q(),
            q,
            fp8,
            rope_table,
            rope_positions,
        }
    }

    /// The reference's view of q: the fixture's, rotated as the kernels rotate it when the case has RoPE
    /// (fp32, rounded to T, at the explicit positions or each token's place in the cache).
    pub fn reference_q(&self) -> Vec<f64> {
        let mut q = to_f64(&self.q);
        if let (Some(r), Some(t)) = (&self.case.rope, &self.rope_table) {
            let table = t.reference(r.config.rotary_dim, r.config.style);
            let positions = rope_positions_of(&self.case, &self.rope_positions);
            table.rotate_lowp(&mut q, self.case.head_dim, self.case.heads_q, &positions, T::DTYPE);
        }
        q
    }

    /// K's pages `[num_pages, page_size, Hkv, Dqk]`.
    pub fn cache_shape(&self) -> [usize; 4] {
        [self.num_pages, self.case.page_size, self.case.heads_kv, self.case.head_dim]
    }

    /// V's pages `[num_pages, page_size, Hkv, Dv]`.
    pub fn v_cache_shape(&self) -> [usize; 4] {
        [self.num_pages, self.case.page_size, self.case.heads_kv, self.case.dv()]
    }

    pub fn scale(&self) -> f64 {
        let scale = crate::launch::softmax_scale(None, self.case.head_dim);
        f64::from(scale.expect("a harness head dim")) // ok: the cases use valid head dims
    }

    /// The fp64 reference over the cache the kernel reads (the 16-bit cache, or the FP8 cache dequantised).
    pub fn reference(&self) -> Result<(reference::Output, Vec<f64>)> {
        let (k, v) = match &self.fp8 {
            Some(c) => c.dequantized(),
            None => (to_f64(&self.k_cache), to_f64(&self.v_cache)),
        };
        self.reference_kv(&k, &v)
    }

    /// The fp64 reference (and the naive low-precision one) over the cache values `k`, `v` (laid out as
    /// `k_cache`, e.g. a dequantised FP8 cache) with this fixture's queries, table and variants.
    pub fn reference_kv(&self, k: &[f64], v: &[f64]) -> Result<(reference::Output, Vec<f64>)> {
        let c = &self.case;
        let q = self.reference_q();
        let cache = reference_cache(k, v, (self.cache_shape(), c.dv()), &self.block_table, self.width, &self.seq_lens);
        let wide = |x: &[f32]| x.iter().map(|&v| f64::from(v)).collect::<Vec<f64>>();
        let (slopes, sinks) = (wide(&self.alibi_slopes), wide(&self.sinks));
        let var = c.variants.reference(&slopes, &sinks);
        let scale = self.scale();
        let exact =
            reference::paged_prefill(c.heads_q, c.causal, scale, &var, Arith::F64, &self.cu_seqlens_q, &q, &cache)?;
        let naive = reference::paged_prefill(
            c.heads_q,
            c.causal,
            scale,
            &var,
            Arith::Lowp(T::DTYPE),
            &self.cu_seqlens_q,
            &q,
            &cache,
        )?
        .out;
        Ok((exact, naive))
    }

    /// The fixture's 16-bit cache as host views (no scales; [`PagedHost::cache_of`] for other values).
    pub fn host_cache(&self) -> Result<PagedKvCache<'_, T>> {
        self.host().cache()
    }

    /// The fixture's data as a [`PagedHost`].
    pub fn host(&self) -> PagedHost<'_, T> {
        paged_host!(self)
    }

    /// Runs the kernel over the case's cache (16-bit, or the FP8 codes with their scales) on `stream` (host
    /// memory: the emulator) with NaN-poisoned outputs; `num_splits` overrides the case's. Returns o
    /// `[total_q, Hq, Dv]`, lse `[Hq, total_q]` and the plan.
    pub fn run(&self, stream: &Stream<'_>, num_splits: Option<usize>) -> Result<(Vec<T>, Vec<f32>, PagedPrefillPlan)> {
        let mut ws = self.case.workspace(stream, num_splits.or(self.case.num_splits))?;
        self.run_in(stream, num_splits, &mut ws)
    }

    /// [`Self::run`] on the caller's workspace (e.g. a scheduled one made for larger limits, or one reused
    /// from an earlier call).
    pub fn run_in(
        &self,
        stream: &Stream<'_>,
        num_splits: Option<usize>,
        ws: &mut PagedPrefillWorkspace,
    ) -> Result<(Vec<T>, Vec<f32>, PagedPrefillPlan)> {
        fn go<T: Element, C: CacheElement<T>>(
            f: &PagedPrefillFixture<T>,
            stream: &Stream<'_>,
            num_splits: Option<usize>,
            ws: &mut PagedPrefillWorkspace,
        ) -> Result<(Vec<T>, Vec<f32>, PagedPrefillPlan)> {
            let [k, v] = C::cache(&f.k_cache, &f.v_cache, f.fp8.as_ref())?;
            let scales = f.fp8.as_ref().map(|c| c.scales(stream)).transpose()?;
            let cache = f.host().cache_of([&k, &v], scales.as_ref())?;
            let rope = RopeViews::host(f.rope_table.as_ref(), &f.rope_positions, f.case.rope)?;
            f.run_on_with(stream, &cache, num_splits, rope.as_ref().map(RopeViews::rope), Some(ws))
        }
        with_cache_element!(self.fp8.as_ref(), go::<T>(self, stream, num_splits, ws))
    }

    /// [`Self::run`] over `cache` (host memory) in place of the fixture's own: e.g. its 16-bit cache for an
    /// FP8 case.
    pub fn run_on<C: KvCacheOf<T>>(
        &self,
        stream: &Stream<'_>,
        cache: &PagedKvCache<'_, C>,
        num_splits: Option<usize>,
    ) -> Result<(Vec<T>, Vec<f32>, PagedPrefillPlan)> {
        let rope = RopeViews::host(self.rope_table.as_ref(), &self.rope_positions, self.case.rope)?;
        self.run_on_with(stream, cache, num_splits, rope.as_ref().map(RopeViews::rope), None)
    }

    /// Runs the kernel with RoPE on q (`rope`) over the case's cache (16-bit, or the FP8 codes with their
    /// scales; its K taken as already rotated) and judges the output with [`reference::check_paged_prefill`]
    /// twice: as run, and as if q had not been rotated (which must fail for the check to mean anything).
    pub fn check_rope(
        &self,
        stream: &Stream<'_>,
        rope: crate::rope::Rope<'_>,
    ) -> Result<(reference::Check, reference::Check)> {
        fn go<T: Element, C: CacheElement<T>>(
            f: &PagedPrefillFixture<T>,
            stream: &Stream<'_>,
            rope: crate::rope::Rope<'_>,
        ) -> Result<(reference::Check, reference::Check)> {
            let c = &f.case;
            let (b, hq, d, tq) = (c.batch(), c.heads_q, c.head_dim, c.total_q());
            let [k, v] = C::cache(&f.k_cache, &f.v_cache, f.fp8.as_ref())?;
            let scales = f.fp8.as_ref().map(|c| c.scales(stream)).transpose()?;
            let cache = f.host().cache_of([&k, &v], scales.as_ref())?;
            let (o, lse, _) = f.run_on_with(stream, &cache, None, Some(rope), None)?;
            let (q, cu) = (TensorView::host(&f.q, [tq, hq, d])?, TensorView::host(&f.cu_seqlens_q, [b + 1])?);
            let (o, lse) = (TensorView::host(&o, [tq, hq, c.dv()])?, TensorView::host(&lse, [hq, tq])?);
            let views = VariantViews::new(&c.variants, b, hq, |sinks, n| {
                TensorView::host(if sinks { &f.sinks[..n] } else { &f.alibi_slopes[..n] }, [n])
            })?;
            let opts = PagedPrefillOptions {
                causal: c.causal,
                score_mod: views.score_mod(&c.variants),
                rope: Some(rope),
                ..Default::default()
            };
            let with = reference::check_paged_prefill(&q, &cu, &cache, &o, Some(&lse), &opts)?;
            let without = reference::check_paged_prefill(
                &q,
                &cu,
                &cache,
                &o,
                Some(&lse),
                &PagedPrefillOptions { rope: None, ..opts },
            )?;
            Ok((with, without))
        }
        with_cache_element!(self.fp8.as_ref(), go::<T>(self, stream, rope))
    }

    /// [`Self::run_on`] with RoPE on q, on `ws` (`None`: the case's own workspace).
    fn run_on_with<C: KvCacheOf<T>>(
        &self,
        stream: &Stream<'_>,
        cache: &PagedKvCache<'_, C>,
        num_splits: Option<usize>,
        rope: Option<crate::rope::Rope<'_>>,
        ws: Option<&mut PagedPrefillWorkspace>,
    ) -> Result<(Vec<T>, Vec<f32>, PagedPrefillPlan)> {
        let c = &self.case;
        let (b, hq, d, dv, tq) = (c.batch(), c.heads_q, c.head_dim, c.dv(), c.total_q());
        let q = TensorView::host(&self.q, [tq, hq, d])?;
        let cu = TensorView::host(&self.cu_seqlens_q, [b + 1])?;
        let mut o = vec![T::nan(); tq * hq * dv];
        let mut lse = vec![f32::NAN; hq * tq];
        let views = VariantViews::new(&c.variants, b, hq, |sinks, n| {
            TensorView::host(if sinks { &self.sinks[..n] } else { &self.alibi_slopes[..n] }, [n])
        })?;
        let opts = PagedPrefillOptions {
            causal: c.causal,
            scale: None,
            num_splits: num_splits.or(c.num_splits),
            score_mod: views.score_mod(&c.variants),
            rope,
            kernel: c.kernel,
        };
        let mut own;
        let ws = match ws {
            Some(ws) => ws,
            None => {
                own = c.workspace(stream, opts.num_splits)?;
                &mut own
            }
        };
        let plan = paged_prefill(
            stream,
            &q,
            &cu,
            c.max_seqlen_q(),
            cache,
            &mut TensorViewMut::host(&mut o, [tq, hq, dv])?,
            Some(&mut TensorViewMut::host(&mut lse, [hq, tq])?),
            Some(ws),
            &opts,
        )?;
        Ok((o, lse, plan))
    }
}

/// The verdict on one case.
#[derive(Debug, Clone)]
pub struct PagedPrefillOutcome {
    pub seed: u64,
    pub plan: PagedPrefillPlan,
    /// O against the fp64 reference (over the stored cache: an FP8 case's dequantised values) under the
    /// tolerance rule.
    pub out: Comparison,
    /// LSE against the reference (within [`lse_tolerance`]; −inf must match exactly).
    pub lse: Comparison,
    /// An FP8 case: its quantisation error against the 16-bit cache (reported, not judged).
    pub quant: Option<QuantError>,
}

impl PagedPrefillOutcome {
    pub fn passed(&self) -> bool {
        self.out.passed && self.lse.passed
    }
    pub fn summary(&self) -> String {
        format!(
            "seed={} splits={} max|err|={:.2e} (tol {:.2e}, naive {:.2e}) rel-L2={:.2e} lse max|err|={:.2e} {}{}",
            self.seed,
            self.plan.num_splits,
            self.out.max_abs_err,
            self.out.tolerance,
            self.out.naive_max_abs_err,
            self.out.rel_l2_err,
            self.lse.max_abs_err,
            if self.passed() { "ok" } else { "FAILED" },
            QuantError::suffix(self.quant)
        )
    }
}

/// One case run: its fixture, the kernel's outputs (o `[total_q, Hq, Dv]`, lse `[Hq, total_q]`) and the verdict.
pub struct PagedPrefillRun<T> {
    pub fixture: PagedPrefillFixture<T>,
    pub o: Vec<T>,
    pub lse: Vec<f32>,
    pub outcome: PagedPrefillOutcome,
}

/// Judges a kernel's outputs for fixture `f` against the fp64 reference over the cache it read; an FP8
/// case's quantisation error too.
pub fn evaluate<T: Element>(
    f: &PagedPrefillFixture<T>,
    seed: u64,
    plan: PagedPrefillPlan,
    o: &[T],
    lse: &[f32],
) -> Result<PagedPrefillOutcome> {
    let (exact, naive) = f.reference()?;
    let ours = to_f64(o);
    let ours_lse: Vec<f64> = lse.iter().map(|&x| f64::from(x)).collect();
    let quant = match f.fp8 {
        Some(_) => Some(QuantError::of(&ours, &f.reference_kv(&to_f64(&f.k_cache), &to_f64(&f.v_cache))?.0.out)),
        None => None,
    };
    Ok(PagedPrefillOutcome {
        seed,
        plan,
        out: reference::compare(&ours, &exact.out, &naive),
        lse: reference::compare_lse(&ours_lse, &exact.lse, lse_tolerance(&exact.lse)),
        quant,
    })
}

/// The positions a case's queries are rotated at: `explicit` (one per packed token) when the case draws
/// them, else each token's place in its cache, `t + seq_len_b − q_len_b`.
fn rope_positions_of(case: &PagedPrefillCase, explicit: &[i32]) -> Vec<i64> {
    match case.rope {
        Some(r) if r.explicit_positions => explicit.iter().map(|&p| i64::from(p)).collect(),
        _ => case.seqs.iter().flat_map(|&(q, k)| (0..q).map(move |t| t as i64 + k as i64 - q as i64)).collect(),
    }
}

/// Runs `case` on the emulator (outputs poisoned with NaN) and judges it.
pub fn run_case_emulated<T: Element>(emu: &Emulator, case: &PagedPrefillCase, seed: u64) -> Result<PagedPrefillRun<T>> {
    let f = PagedPrefillFixture::<T>::new(case, seed);
    let (o, lse, plan) = f.run(&Stream::Emu(emu), None)?;
    let outcome = evaluate(&f, seed, plan, &o, &lse)?;
    Ok(PagedPrefillRun { fixture: f, o, lse, outcome })
}

/// [`run_case_emulated`] for the case's dtype, the verdict only.
pub fn check_case_emulated(emu: &Emulator, case: &PagedPrefillCase, seed: u64) -> Result<PagedPrefillOutcome> {
    with_dtype!(case.dtype, T => run_case_emulated::<T>(emu, case, seed).map(|r| r.outcome))
}

/// The fixture's data on the GPU (its cache as `C`: the fixture's own 16-bit values, or its FP8 codes with
/// their scales), the outputs (NaN-poisoned) and a workspace for its plan.
pub(crate) struct GpuCase<T: Element, C: KvCacheOf<T>> {
    inputs: GpuPaged<T, C>,
    cu_q: CudaSlice<i32>,
    rope: Option<GpuRope>,
    o: CudaSlice<T>,
    lse: CudaSlice<f32>,
    ws: PagedPrefillWorkspace,
}

impl<T: Element, C: CacheElement<T>> GpuCase<T, C> {
    /// Uploads `f` with its cache as `C`.
    pub(crate) fn upload(cu: &Arc<CudaStream>, f: &PagedPrefillFixture<T>) -> Result<Self> {
        let c = &f.case;
        let (hq, d, tq) = (c.heads_q, c.dv(), c.total_q());
        Ok(Self {
            inputs: GpuPaged::upload(cu, &f.host())?,
            cu_q: cu.clone_htod(&f.cu_seqlens_q)?,
            rope: upload_rope(cu, f.rope_table.as_ref(), &f.rope_positions)?,
            o: cu.clone_htod(&vec![T::nan(); (tq * hq * d).max(1)])?,
            lse: cu.clone_htod(&vec![f32::NAN; (hq * tq).max(1)])?,
            ws: c.workspace(&Stream::Gpu(cu), c.num_splits)?,
        })
    }

    pub(crate) fn run(&mut self, cu: &Arc<CudaStream>, f: &PagedPrefillFixture<T>) -> Result<PagedPrefillPlan> {
        let c = &f.case;
        let (b, hq, d, tq) = (c.batch(), c.heads_q, c.head_dim, c.total_q());
        let cache = self.inputs.cache(c.max_seq_len())?;
        let variants = self.inputs.variants(&c.variants, b, hq)?;
        let rope = RopeViews::gpu(self.rope.as_ref(), f.rope_table.as_ref(), f.rope_positions.len(), c.rope)?;
        let opts = PagedPrefillOptions {
            causal: c.causal,
            scale: None,
            num_splits: c.num_splits,
            score_mod: variants.score_mod(&c.variants),
            rope: rope.as_ref().map(RopeViews::rope),
            kernel: c.kernel,
        };
        if c.schedule.is_some() {
            // The host's copies of the lengths, as an engine has them before a step.
            self.ws.prepare(&Stream::Gpu(cu), &f.cu_seqlens_q, &f.seq_lens, &opts)?;
        }
        paged_prefill(
            &Stream::Gpu(cu),
            &TensorView::gpu(self.inputs.q.slice(0..tq * hq * d), [tq, hq, d])?,
            &TensorView::gpu(self.cu_q.as_view(), [b + 1])?,
            c.max_seqlen_q(),
            &cache,
            &mut TensorViewMut::gpu(self.o.slice_mut(0..tq * hq * c.dv()), [tq, hq, c.dv()])?,
            Some(&mut TensorViewMut::gpu(self.lse.slice_mut(0..hq * tq), [hq, tq])?),
            Some(&mut self.ws),
            &opts,
        )
    }

    /// o `[total_q, Hq, Dv]` and lse `[Hq, total_q]` back on the host.
    pub(crate) fn outputs(&self, cu: &Arc<CudaStream>, case: &PagedPrefillCase) -> Result<(Vec<T>, Vec<f32>)> {
        let n = case.total_q() * case.heads_q;
        let mut o: Vec<T> = cu.clone_dtoh(&self.o)?;
        let mut lse: Vec<f32> = cu.clone_dtoh(&self.lse)?;
        o.truncate(n * case.dv());
        lse.truncate(n);
        Ok((o, lse))
    }
}

/// Runs `case` on the GPU behind `cu` (outputs poisoned with NaN) and judges it.
pub fn run_case_gpu<T: Element>(
    cu: &Arc<CudaStream>,
    case: &PagedPrefillCase,
    seed: u64,
) -> Result<PagedPrefillRun<T>> {
    fn go<T: Element, C: CacheElement<T>>(
        cu: &Arc<CudaStream>,
        f: &PagedPrefillFixture<T>,
    ) -> Result<(Vec<T>, Vec<f32>, PagedPrefillPlan)> {
        let mut g = GpuCase::<T, C>::upload(cu, f)?;
        let plan = g.run(cu, f)?;
        let (o, lse) = g.outputs(cu, &f.case)?;
        Ok((o, lse, plan))
    }
    let f = PagedPrefillFixture::<T>::new(case, seed);
    let (o, lse, plan) = with_cache_element!(f.fp8.as_ref(), go::<T>(cu, &f))?;
    let outcome = evaluate(&f, seed, plan, &o, &lse)?;
    Ok(PagedPrefillRun { fixture: f, o, lse, outcome })
}

/// [`run_case_gpu`] for the case's dtype, the verdict only.
pub fn check_case_gpu(cu: &Arc<CudaStream>, case: &PagedPrefillCase, seed: u64) -> Result<PagedPrefillOutcome> {
    with_dtype!(case.dtype, T => run_case_gpu::<T>(cu, case, seed).map(|r| r.outcome))
}

/// Attention FLOPs of a case: 2 · Hq · (Dqk + Dv) · (visible (row, key) pairs) (4 · Hq · D with one head
/// dim), the pairs counted exactly from the causal rule (no window).
pub fn case_flops(case: &PagedPrefillCase) -> f64 {
    let pairs: usize = case
        .seqs
        .iter()
        .map(|&(q, k)| {
            if !case.causal {
                return q * k;
            }
            (0..q).map(|i| if i + k >= q { (i + k - q + 1).min(k) } else { 0 }).sum::<usize>()
        })
        .sum();
    2.0 * (case.heads_q * (case.head_dim + case.dv())) as f64 * pairs as f64
}

/// GPU timing of one case: CUDA events, `warmup` untimed launches then the median of `iters`.
#[derive(Debug, Clone, Copy)]
pub struct PagedPrefillTiming {
    pub timing: Timing,
    pub plan: PagedPrefillPlan,
    pub tflops: f64,
}

/// Times `case` (kernel + merge when split) on `cu`.
pub fn time_case_gpu(
    cu: &Arc<CudaStream>,
    case: &PagedPrefillCase,
    seed: u64,
    runs: Runs,
) -> Result<PagedPrefillTiming> {
    fn go<T: Element, C: CacheElement<T>>(
        cu: &Arc<CudaStream>,
        f: &PagedPrefillFixture<T>,
        runs: Runs,
    ) -> Result<PagedPrefillTiming> {
        let mut g = GpuCase::<T, C>::upload(cu, f)?;
        let plan = g.run(cu, f)?;
        let timing = time_launches(cu, runs, |_| g.run(cu, f).map(|_| ()))?;
        Ok(PagedPrefillTiming { timing, plan, tflops: case_flops(&f.case) / (timing.median_ms * 1e-3) / 1e12 })
    }
    with_dtype!(case.dtype, T => {
        let f = PagedPrefillFixture::<T>::new(case, seed);
        with_cache_element!(f.fp8.as_ref(), go::<T>(cu, &f, runs))
    })
}
