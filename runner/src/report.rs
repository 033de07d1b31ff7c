//! `report`: the standard sweep. Emulator: a representative subset of both correctness sweeps (or a few
//! cases with `--quick`). GPU: the copy-bandwidth ceiling, the timed performance shapes (prefill: the FA
//! family, TFLOPS; decode: contexts × batches, % of the copy bandwidth; decode over an FP8 cache; paged
//! prefill — chunks and speculative verification —, fused RoPE in prefill, decode and append, each against
//! its baseline timed in the same run: see
//! [`perf_plan`]), then the full correctness sweeps of both ops. Rows stream out in order as they complete.

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::time::Instant;

use fused_attn::prefill::{sm90_serves, PrefillKernel, Sm90Steps, SM90_SOFTCAP_RANGE};
use fused_attn::testkit::cases::append::AppendCase;
use fused_attn::testkit::cases::decode::{
    decode_sweep, decode_sweep_emulated, decode_variant_sweep, fp8_decode_sweep_emulated, perf_cases as decode_perf,
    DecodeCase,
};
use fused_attn::testkit::cases::kv::KvFormat;
use fused_attn::testkit::cases::mla::{perf_cases as mla_perf, sweep_emulated as mla_sweep_emulated, MlaCase};
use fused_attn::testkit::cases::paged_prefill::{self as ppc, CaseSchedule, PagedPrefillCase};
use fused_attn::testkit::cases::prefill::{perf_cases as prefill_perf, variant_sweep_cases};
use fused_attn::testkit::cases::prefill::{sweep_cases, PrefillCase};
use fused_attn::testkit::timing::copy_bandwidth_gbps;
use fused_attn::{DType, Fp8Format, PagedPrefillKernel, Result, ScaleKind};

use crate::backend::Backend;
use crate::cases::{self, Case};
use crate::output::Output;
use crate::progress::Progress;
use crate::row::Row;

/// Per-case seed: the base seed (`--seed`) mixed with the case's index.
pub fn case_seed(base: u64, i: usize) -> u64 {
    base ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Whether the sm90 kernel runs `c` (head dims, 192/128 among them, and softcap range; the GPU's compute
/// capability aside).
fn sm90_runs(c: &PrefillCase) -> bool {
    sm90_serves(c.head_dim, c.dv()) && c.variants.softcap.is_none_or(|s| SM90_SOFTCAP_RANGE.contains(&s))
}

/// The prefill case run with `kernel` (`--kernel`). The sm90 kernel lacks some head dims:
/// those cases keep `auto` (the sm_80 kernel), as a call with `auto` would.
fn with_kernel(mut c: PrefillCase, kernel: PrefillKernel) -> PrefillCase {
    if kernel != PrefillKernel::Sm90 || sm90_runs(&c) {
        c.kernel = kernel;
    }
    c
}

/// The correctness cases of `report` on `backend`, prefill run with `kernel`.
pub fn sweep(backend: &Backend, quick: bool, kernel: PrefillKernel) -> Vec<Case> {
    let gpu = matches!(backend, Backend::Gpu { .. });
    let prefill: Vec<PrefillCase> = sweep_cases(gpu && !quick).into_iter().map(|c| with_kernel(c, kernel)).collect();
    let decode = if gpu && !quick { decode_sweep() } else { decode_sweep_emulated() };
    if quick {
        // A few seconds of emulation: the first small prefill case of every (D, causal, layout, varlen,
        // GQA, LSE) combination, and a decode case per page size.
        let mut seen = Vec::new();
        let mut out: Vec<Case> = Vec::new();
        for c in prefill.into_iter().filter(|c| c.score_count() <= 40_000) {
            let key = (c.head_dim, c.causal, c.layout, c.varlen.is_some(), c.heads_q != c.heads_kv, c.with_lse);
            if !seen.contains(&key) {
                seen.push(key);
                out.push(Case::Prefill(c));
            }
        }
        let mut pages = Vec::new();
        for c in decode {
            if !pages.contains(&c.page_size) {
                pages.push(c.page_size);
                out.push(Case::Decode(c));
            }
        }
        out.extend(other_op_quick(kernel));
        return out;
    }
    let mut out: Vec<Case> =
        prefill.into_iter().map(Case::Prefill).chain(decode.into_iter().map(Case::Decode)).collect();
    out.extend(other_op_cases(kernel));
    out
}

/// Every op and cache type beyond the plain prefill and decode sweeps, from the test suites' own case
/// lists: the score variants alone and combined (prefill dense and varlen; decode with every split
/// choice), paged prefill (chunks of 1 to 1000 tokens, speculative-verification-sized q_len 2 to 17 over long
/// contexts, shared prefixes, splits) with its variants, and FP8 caches (E4M3 and E5M2, per-tensor and
/// per-head scales) for decode and paged prefill.
fn other_op_cases(kernel: PrefillKernel) -> Vec<Case> {
    let mut v: Vec<Case> = variant_sweep_cases().into_iter().map(|c| Case::Prefill(with_kernel(c, kernel))).collect();
    v.extend(decode_variant_sweep().into_iter().map(Case::Decode));
    v.extend(ppc::paged_prefill_sweep_emulated().into_iter().map(Case::PagedPrefill));
    v.extend(ppc::paged_prefill_variant_sweep().into_iter().map(Case::PagedPrefill));
    v.extend(fp8_decode_sweep_emulated().into_iter().map(Case::Decode));
    v.extend(ppc::fp8_paged_prefill_sweep_emulated().into_iter().map(Case::PagedPrefill));
    v.extend(mla_sweep_emulated().into_iter().map(Case::Mla));
    v
}

/// One of each kind [`other_op_cases`] has, for `--quick`: the first case of each op and cache type, and
/// the first prefill and decode cases with a variant.
fn other_op_quick(kernel: PrefillKernel) -> Vec<Case> {
    let mut seen = Vec::new();
    other_op_cases(kernel)
        .into_iter()
        .filter(|c| {
            let key = match c {
                Case::Prefill(_) => "prefill variant",
                Case::Decode(c) if c.kv != KvFormat::Sixteen => "fp8 decode",
                Case::Decode(_) => "decode variant",
                Case::PagedPrefill(c) if c.kv != KvFormat::Sixteen => "fp8 paged prefill",
                Case::PagedPrefill(c) if c.variants.is_plain() => "paged prefill",
                Case::PagedPrefill(_) => "paged prefill variant",
                Case::Mla(c) if c.fp8.is_some() => "fp8 mla decode",
                Case::Mla(_) => "mla decode",
            };
            let new = !seen.contains(&key);
            seen.push(key);
            new
        })
        .collect()
}

/// Decode shapes timed by `report`: the issue-5 shapes (B = 64 at 4k, B = 1 at 32k) plus more contexts per
/// batch for the plot, and MQA 64:1 at D 64 / 128 (16 × 32k); every cache is ≥ 128 MB so launches stream
/// from HBM, not L2.
pub fn decode_perf_cases() -> Vec<DecodeCase> {
    let base = decode_perf();
    let Some(proto) = base.first().cloned() else { return base };
    let mut cases = Vec::new();
    for (batch, contexts) in
        [(1usize, &[32768usize, 65536, 131072][..]), (8, &[4096, 8192, 16384]), (64, &[1024, 2048, 4096])]
    {
        for &ctx in contexts {
            cases.push(DecodeCase { seq_lens: vec![ctx; batch], ..proto.clone() });
        }
    }
    for c in base {
        if !cases.contains(&c) {
            cases.push(c);
        }
    }
    // MQA 64:1 (issue 30, item 4): one CTA per KV head and split, of four row groups at D 64, and at D 128 a
    // wide one (8 warps).
    for head_dim in [64, 128] {
        cases.push(DecodeCase { head_dim, heads_q: 64, heads_kv: 1, seq_lens: vec![32768; 16], ..proto.clone() });
    }
    cases
}

/// The FP8-against-bf16 decode grid (issue 30): batch 1 / 8 / 64 x context 4k / 32k x D 128 / 256, the perf
/// shapes' GQA 32:8 and pages of 16 (each timed over a bf16 and an E4M3 cache; the largest, 64 x 32k at
/// D 256, is a 17 GB bf16 cache built on the host). `--quick` keeps the predictions row (64 x 4k, D 128).
pub fn fp8_decode_shapes(quick: bool) -> Vec<DecodeCase> {
    let Some(proto) = decode_perf().first().cloned() else { return Vec::new() };
    if quick {
        return vec![proto];
    }
    let mut cases = Vec::new();
    for head_dim in [128, 256] {
        for batch in [1, 8, 64] {
            for ctx in [4096, 32768] {
                cases.push(DecodeCase { head_dim, seq_lens: vec![ctx; batch], ..proto.clone() });
            }
        }
    }
    cases
}

/// One shape `report` times on a GPU.
#[derive(Clone, Debug, PartialEq)]
pub enum Timed {
    Prefill(PrefillCase),
    /// Decode over a 16-bit or FP8 cache.
    Decode(DecodeCase),
    /// Chunked prefill or speculative verification over the paged cache.
    PagedPrefill(PagedPrefillCase),
    /// MLA decode over a 16-bit or FP8 latent cache.
    Mla(MlaCase),
    /// The paged KV append (16-bit or FP8 cache), with or without RoPE on K.
    Append(AppendCase),
}

/// A timed shape and, for a comparison row, the index (into the same plan, always earlier) of the shape
/// whose median time its own is divided by.
#[derive(Clone, Debug, PartialEq)]
pub struct TimedShape {
    pub case: Timed,
    pub baseline: Option<usize>,
}

/// Paged prefill against dense prefill (docs/performance.md's "paged prefill vs dense prefill, same shapes" row):
/// B = 4 chunks of `q_len` new tokens at the end of a `context`-token sequence, bf16, D = 128, GQA 32:8,
/// causal, over pages of [`PAGED_CHUNK_PAGES`]. (q_len, context).
pub const PAGED_CHUNKS: [(usize, usize); 2] = [(512, 4096), (2048, 4096)];
pub const PAGED_CHUNK_BATCH: usize = 4;
pub const PAGED_CHUNK_PAGES: [usize; 2] = [16, 64];
/// Speculative verification (q_len tokens per sequence) against one decode step over the same cache: the
/// decode perf shapes (B = 64 at 4096 tokens, B = 1 at 32768; page 16). (batch, context).
pub const SPEC_VERIFY_CONTEXTS: [(usize, usize); 2] = [(64, 4096), (1, 32768)];
pub const SPEC_VERIFY_Q_LENS: [usize; 2] = [4, 8];

/// The paged prefill case of `report`'s timed shapes: `batch` sequences of `q_len` new tokens over
/// `context` tokens (bf16, D = 128, Hq = 32, Hkv = 8, causal).
pub fn paged_perf_case(batch: usize, q_len: usize, context: usize, page_size: usize) -> PagedPrefillCase {
    ppc::case(128, (32, 8), page_size, &vec![(q_len, context); batch])
}

/// Dense prefill over the same visible (query, key) pairs as the uniform paged case `c`: B sequences of
/// Tq = q_len queries over Tk = context keys, causal bottom-right (docs/semantics.md).
pub fn dense_equivalent(c: &PagedPrefillCase) -> PrefillCase {
    let (q_len, context) = c.seqs.first().copied().unwrap_or((0, 0));
    let mut d = PrefillCase::dense(c.dtype, c.head_dim, c.causal, q_len, context, (c.heads_q, c.heads_kv));
    d.batch = c.batch();
    d
}

/// The decode step a spec-verify case is compared with: the same sequences, one query token each.
pub fn decode_step(c: &PagedPrefillCase) -> DecodeCase {
    DecodeCase {
        dtype: c.dtype,
        head_dim: c.head_dim,
        head_dim_v: c.head_dim_v,
        heads_q: c.heads_q,
        heads_kv: c.heads_kv,
        page_size: c.page_size,
        seq_lens: c.seqs.iter().map(|s| s.1).collect(),
        num_splits: None,
        variants: c.variants,
        rope: None,
        kv: KvFormat::Sixteen,
        schedule: None,
    }
}

/// Llama 3.1's rotary embedding (θ 500,000, NeoX, full rotary at D 128, its frequency scaling) at each
/// token's own position: what the RoPE rows time.
pub fn llama_rope() -> fused_attn::testkit::cases::decode::CaseRope {
    use fused_attn::{RopeConfig, RopeScaling, RopeStyle};
    let config = RopeConfig { scaling: RopeScaling::llama31(), ..RopeConfig::new(500_000.0, 128, RopeStyle::Neox) };
    fused_attn::testkit::cases::decode::CaseRope { config, explicit_positions: false }
}

/// The shapes the RoPE rows time with and without it: the family's Llama-like causal GQA prefill (32/8 heads,
/// D 128, 4 × 4096), and the decode predictions row (B 64 × 4k).
pub fn rope_shapes() -> (PrefillCase, DecodeCase) {
    let prefill = prefill_perf()
        .into_iter()
        .find(|c| c.causal && (c.heads_q, c.heads_kv, c.head_dim) == (32, 8, 128))
        .expect("the family's GQA row");
    let decode = decode_perf().first().cloned().expect("the perf shapes");
    (prefill, decode)
}

/// The appends the RoPE rows time with and without RoPE on K (bf16 K/V, the perf shapes' Hkv 8, D 128, pages
/// of 16), each into a 16-bit and an E4M3 (per-head scales) cache: a decode step (64 sequences, one new
/// token each at 4096) and a prompt (4 sequences of 4096 new tokens). Predicted (docs/rope.md "Not yet"):
/// within ~10 % of the plain append.
pub fn append_rope_shapes() -> Vec<AppendCase> {
    let fp8 = KvFormat::Fp8 { format: Fp8Format::E4m3, scales: ScaleKind::PerHead };
    let shape = |seqs: Vec<(usize, usize)>, kv| AppendCase {
        dtype: DType::Bf16,
        head_dim: 128,
        head_dim_v: None,
        heads_kv: 8,
        page_size: 16,
        seqs,
        kv,
        rope: None,
    };
    let (step, prompt) = (vec![(1, 4096); 64], vec![(4096, 4096); 4]);
    vec![
        shape(step.clone(), KvFormat::Sixteen),
        shape(step, fp8),
        shape(prompt.clone(), KvFormat::Sixteen),
        shape(prompt, fp8),
    ]
}

/// Head dims past the tiled prefill kernel (issue 27): a causal GQA prefill (16/8 heads, 1 × 4096) at D 512,
/// which runs on the decode kernel's streaming path, and the same shape at D 256 on the tiled kernel, its
/// baseline (predicted ~3.7× the time: twice the FLOPs at about half the rate, docs/head-dims.md).
pub fn wide_head_dim_shapes() -> (PrefillCase, PrefillCase) {
    let base = PrefillCase::dense(DType::Bf16, 256, true, 4096, 4096, (16, 8));
    (base.clone(), PrefillCase { head_dim: 512, ..base })
}

/// A V head dim of its own (issue 27 item 2): DeepSeek-V2/V3's Dqk 192 / Dv 128 on the shape of
/// [`wide_head_dim_shapes`], against its D 256 row. The pair runs on the width-192 sm_80 kernel, whose MMAs
/// are of the width: predicted ~0.75x the D 256 time at the same MMA rate (192 / 256), reported TFLOPS
/// (of (192 + 128) / 2 per pair) ~0.83x the D 256 row's (docs/head-dims.md: 17% of the MMAs on zero columns).
pub fn v_head_dim_shape() -> PrefillCase {
    PrefillCase { head_dim: 192, head_dim_v: Some(128), ..wide_head_dim_shapes().0 }
}

/// The paged ops with a V head dim of their own (issue 27 item 2, DeepSeek's Dqk 192 / Dv 128), each
/// (baseline, row) against the same shape at D 256, whose kernel width (256) the pair runs at:
/// - decode on the predictions shape (B 64 × 4096, GQA 32:8, pages of 16): memory-bound, K of 192 and V of
///   128 columns per token and KV head against 2 × 256, so predicted ~0.63× the D 256 time (320 / 512
///   bytes), and ~1.25× that of the D 128 row of the same shape (320 / 256), timed earlier in the plan;
/// - paged prefill of the chunk shape (B 4 × 512 new tokens at 4096, page 16, tiled kernel): the same
///   width-256 tiles and MMAs, so predicted ~1.0× the D 256 time, its TFLOPS (of (192 + 128) / 2 per pair)
///   ~0.63× the D 256 row's (docs/head-dims.md).
pub fn v_head_dim_paged_shapes() -> [(Timed, Timed); 2] {
    let decode = decode_perf().first().cloned().expect("the perf shapes");
    let decode_base = DecodeCase { head_dim: 256, ..decode.clone() };
    let decode_dv = DecodeCase { head_dim: 192, head_dim_v: Some(128), ..decode };
    let chunk = paged_perf_case(PAGED_CHUNK_BATCH, PAGED_CHUNKS[0].0, PAGED_CHUNKS[0].1, PAGED_CHUNK_PAGES[0]);
    let chunk = PagedPrefillCase { kernel: PagedPrefillKernel::Tiled, ..chunk };
    let chunk_base = PagedPrefillCase { head_dim: 256, ..chunk.clone() };
    let chunk_dv = PagedPrefillCase { head_dim: 192, head_dim_v: Some(128), ..chunk };
    [
        (Timed::Decode(decode_base), Timed::Decode(decode_dv)),
        (Timed::PagedPrefill(chunk_base), Timed::PagedPrefill(chunk_dv)),
    ]
}

/// Skewed decode (issue 25): one 128k sequence and 63 of 1k (the perf shapes' GQA 32:8, D 128, pages of 16),
/// on the uniform plan and on a balanced schedule (the device's slots), each against a uniform batch of the
/// same total tokens (64 × 3,056): the balanced row should match it, the uniform plan's should not.
pub fn skew_decode_shapes() -> (DecodeCase, Vec<DecodeCase>) {
    let proto = decode_perf().first().cloned().expect("the perf shapes");
    let mut lens = vec![1024; 63];
    lens.insert(0, 131072);
    let total: usize = lens.iter().sum();
    let uniform = DecodeCase { seq_lens: vec![total / 64; 64], ..proto.clone() };
    let skewed = DecodeCase { seq_lens: lens, ..proto };
    let balanced = CaseSchedule { policy: fused_attn::SplitPolicy::Balanced, slots: None };
    (uniform, vec![skewed.clone(), DecodeCase { schedule: Some(balanced), ..skewed }])
}

/// Everything `report` times on a GPU, in order: the prefill family (on both kernels on a compute
/// capability 9.0 GPU with `--kernel auto`: `hopper`), the decode contexts × batches, then the comparison
/// rows, each after its baseline — decode over an FP8 (E4M3, per-head scales) cache vs the bf16 row of the
/// same shape, paged chunks (page 16 and 64) vs the dense prefill of the same pairs (the sm80 row when both
/// kernels run: paged prefill is an sm_80-class kernel), and spec-verify q_len 4 / 8 vs one decode step (on the
/// streaming kernel Auto picks, and again on the tiled one).
/// `quick`: one shape of each kind.
pub fn perf_plan(quick: bool, kernel: PrefillKernel, hopper: bool) -> Vec<TimedShape> {
    let mut pf = prefill_perf();
    let mut dp = decode_perf_cases();
    if quick {
        pf.retain(|c| c.dtype == DType::Bf16 && c.head_dim == 128 && matches!(c.seqlen_q, 1024 | 8192));
        dp.retain(|c| decode_perf().contains(c));
    }
    // On a compute capability 9.0 GPU with `--kernel auto`, every timed prefill shape the sm90 kernel
    // supports runs on both kernels, side by side (rows labelled sm80 / sm90); elsewhere on the kernel asked
    // for.
    let kernels = |c: PrefillCase| -> Vec<PrefillCase> {
        if kernel == PrefillKernel::Auto && hopper && sm90_runs(&c) {
            vec![with_kernel(c.clone(), PrefillKernel::Sm80), with_kernel(c, PrefillKernel::Sm90)]
        } else {
            vec![with_kernel(c, kernel)]
        }
    };
    let plain = |case| TimedShape { case, baseline: None };
    let mut plan: Vec<TimedShape> = pf.into_iter().flat_map(kernels).map(|c| plain(Timed::Prefill(c))).collect();
    // The sm90 kernel's tuning steps A/B (docs/hopper.md): each D 128 sm90 row of the family again with one
    // step off, compared with the row that has them all (one shape in `quick`).
    let sm90_rows: Vec<usize> = (0..plan.len())
        .filter(|&i| matches!(&plan[i].case, Timed::Prefill(c) if c.kernel == PrefillKernel::Sm90 && c.head_dim == 128))
        .take(if quick { 1 } else { usize::MAX })
        .collect();
    for i in sm90_rows {
        let Timed::Prefill(full) = plan[i].case.clone() else { continue };
        let on = Sm90Steps::default();
        let mut offs = vec![
            Sm90Steps { persistent: false, ..on },
            Sm90Steps { tma_store: false, ..on },
            Sm90Steps { l2_hints: false, ..on },
        ];
        if !full.causal && full.variants.window.is_none() {
            offs.push(Sm90Steps { wide_tile: false, ..on });
        }
        for sm90_steps in offs {
            let case = PrefillCase { sm90_steps, ..full.clone() };
            plan.push(TimedShape { case: Timed::Prefill(case), baseline: Some(i) });
        }
    }
    plan.extend(dp.into_iter().map(|c| plain(Timed::Decode(c))));
    // The index of `case`'s row, timed (appended) first if the plan lacks it.
    fn index_of(plan: &mut Vec<TimedShape>, case: Timed) -> usize {
        plan.iter().position(|s| s.case == case).unwrap_or_else(|| {
            plan.push(TimedShape { case, baseline: None });
            plan.len() - 1
        })
    }

    if !quick {
        // RoPE fused (issue 28) against the same shape without: decode rotates q in the prologue; prefill on the
        // sm_80 kernel rotates q and every K tile as it lands (the family row's kernel: sm_80 on Hopper, none if
        // sm90 is forced); on the sm_90a kernel (Hopper, or forced) q alone, each Q tile once it has landed
        // (K is taken as rotated: the sm_90a kernel has no RoPE on K); append rotates K on its way into a
        // 16-bit and an FP8 cache.
        let rope_kernel = match kernel {
            PrefillKernel::Sm90 => None,
            _ if hopper => Some(PrefillKernel::Sm80),
            k => Some(k),
        };
        let sm90_rope = kernel == PrefillKernel::Sm90 || (hopper && kernel == PrefillKernel::Auto);
        let (prefill_base, decode_base) = rope_shapes();
        let sm90_base = sm90_rope.then(|| Timed::Prefill(with_kernel(prefill_base.clone(), PrefillKernel::Sm90)));
        let prefill_base = rope_kernel.map(|k| Timed::Prefill(with_kernel(prefill_base, k)));
        let appends = append_rope_shapes().into_iter().map(Timed::Append);
        for base in prefill_base.into_iter().chain(sm90_base).chain([Timed::Decode(decode_base)]).chain(appends) {
            let rope = Some(llama_rope());
            let with_rope = match &base {
                Timed::Prefill(c) => {
                    Timed::Prefill(PrefillCase { rope, rope_k: c.kernel != PrefillKernel::Sm90, ..c.clone() })
                }
                Timed::Decode(c) => Timed::Decode(DecodeCase { rope, ..c.clone() }),
                Timed::Append(c) => Timed::Append(AppendCase { rope, ..c.clone() }),
                Timed::PagedPrefill(_) | Timed::Mla(_) => unreachable!("the RoPE rows are prefill, decode and append"),
            };
            let baseline = index_of(&mut plan, base);
            plan.push(TimedShape { case: with_rope, baseline: Some(baseline) });
        }
        // D 512 prefill (the streaming path) against D 256 (the tiled kernel), on the RoPE rows' kernel.
        if let Some(k) = rope_kernel {
            let (base, wide) = wide_head_dim_shapes();
            let baseline = index_of(&mut plan, Timed::Prefill(with_kernel(base, k)));
            plan.push(TimedShape { case: Timed::Prefill(with_kernel(wide, k)), baseline: Some(baseline) });
            // 192/128 against the same D 256 row (sm_80: sm_90a takes one head dim).
            plan.push(TimedShape {
                case: Timed::Prefill(with_kernel(v_head_dim_shape(), k)),
                baseline: Some(baseline),
            });
        }
        // Decode and paged prefill at 192/128 against D 256.
        for (base, row) in v_head_dim_paged_shapes() {
            let baseline = index_of(&mut plan, base);
            plan.push(TimedShape { case: row, baseline: Some(baseline) });
        }
        let (uniform, skewed) = skew_decode_shapes();
        let baseline = index_of(&mut plan, Timed::Decode(uniform));
        plan.extend(skewed.into_iter().map(|c| TimedShape { case: Timed::Decode(c), baseline: Some(baseline) }));
    }
    for base in fp8_decode_shapes(quick) {
        let baseline = index_of(&mut plan, Timed::Decode(base.clone()));
        let case = DecodeCase { kv: KvFormat::Fp8 { format: Fp8Format::E4m3, scales: ScaleKind::PerHead }, ..base };
        plan.push(TimedShape { case: Timed::Decode(case), baseline: Some(baseline) });
    }

    let (chunks, pages) =
        if quick { (&PAGED_CHUNKS[..1], &PAGED_CHUNK_PAGES[..1]) } else { (&PAGED_CHUNKS[..], &PAGED_CHUNK_PAGES[..]) };
    for &(q_len, context) in chunks {
        let dense = dense_equivalent(&paged_perf_case(PAGED_CHUNK_BATCH, q_len, context, pages[0]));
        let first = plan.len();
        let dense_rows = kernels(dense);
        let sm80 = dense_rows.iter().position(|c| c.kernel == PrefillKernel::Sm80).unwrap_or(0);
        plan.extend(dense_rows.into_iter().map(|c| plain(Timed::Prefill(c))));
        for &page in pages {
            let case = paged_perf_case(PAGED_CHUNK_BATCH, q_len, context, page);
            plan.push(TimedShape { case: Timed::PagedPrefill(case), baseline: Some(first + sm80) });
        }
    }

    // MLA decode (issue 29): Hq 16 (memory-bound) and 128 (tensor-bound) at B 64 x 4k, bf16 then the E4M3
    // latent cache compared with the bf16 row of the same shape.
    // `quick`: Hq 128 alone.
    for base in mla_perf().into_iter().filter(|c| c.fp8.is_none() && (!quick || c.heads_q == 128)) {
        let baseline = index_of(&mut plan, Timed::Mla(base.clone()));
        let case = MlaCase { fp8: Some(Fp8Format::E4m3), ..base };
        plan.push(TimedShape { case: Timed::Mla(case), baseline: Some(baseline) });
    }

    let (contexts, q_lens) = if quick {
        (&SPEC_VERIFY_CONTEXTS[..1], &SPEC_VERIFY_Q_LENS[1..])
    } else {
        (&SPEC_VERIFY_CONTEXTS[..], &SPEC_VERIFY_Q_LENS[..])
    };
    for &(batch, context) in contexts {
        for &q_len in q_lens {
            let case = paged_perf_case(batch, q_len, context, 16);
            let baseline = index_of(&mut plan, Timed::Decode(decode_step(&case)));
            // The A/B of paged prefill's two kernels (docs/scheduling.md): these shapes stream under Auto;
            // the same shape forced onto the tiled kernel, against the same decode step.
            let tiled = PagedPrefillCase { kernel: PagedPrefillKernel::Tiled, ..case.clone() };
            plan.push(TimedShape { case: Timed::PagedPrefill(case), baseline: Some(baseline) });
            plan.push(TimedShape { case: Timed::PagedPrefill(tiled), baseline: Some(baseline) });
        }
    }
    plan
}

/// `row` as a comparison with `base`: the baseline's op and label, and the ratio of the median times (None
/// when either was not measured).
fn compared(mut row: Row, base: &Row) -> Row {
    row.baseline = Some(format!("{} {}", base.op, base.label));
    row.vs_baseline = match (row.ms, base.ms) {
        (Some(a), Some(b)) if a.is_finite() && b.is_finite() && a > 0.0 && b > 0.0 => Some(a / b),
        _ => None,
    };
    row
}

/// Runs `f` over `items` on `workers` threads, handing results to `emit` in order as soon as they are ready.
fn ordered_parallel<I: Sync, R: Send>(
    items: &[I],
    workers: usize,
    f: impl Fn(usize, &I) -> R + Sync,
    mut emit: impl FnMut(R),
) {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let (tx, rx) = mpsc::channel::<(usize, R)>();
    std::thread::scope(|s| {
        for _ in 0..workers.max(1) {
            let tx = tx.clone();
            let (next, f) = (&next, &f);
            s.spawn(move || loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                if tx.send((i, f(i, item))).is_err() {
                    break;
                }
            });
        }
        drop(tx);
        let mut pending = BTreeMap::new();
        let mut want = 0;
        for (i, r) in rx {
            pending.insert(i, r);
            while let Some(r) = pending.remove(&want) {
                emit(r);
                want += 1;
            }
        }
    });
}

pub fn report(backend: &Backend, base_seed: u64, quick: bool, kernel: PrefillKernel, out: &mut Output) -> Result<()> {
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    out.note(&format!("fused-attn report on {}", backend.describe()));
    let copy_gbps = match backend {
        Backend::Gpu { stream, .. } => {
            let c = copy_bandwidth_gbps(stream, 1 << 30)?;
            out.note(&format!("ceiling: device-to-device copy {c:.1} GB/s (1 GiB, bytes read + written)"));
            Some(c)
        }
        Backend::Emu(_) => None,
    };
    let cases = sweep(backend, quick, kernel);
    // On a GPU the timed shapes run first: they carry the numbers the issues' bars are judged by (and a
    // sampled correctness check each), so a run cut short by a time budget still has them.
    if let (Backend::Gpu { stream, .. }, Some(copy)) = (backend, copy_gbps) {
        let hopper = stream.context().compute_capability().is_ok_and(|cc| cc == (9, 0));
        let plan = perf_plan(quick, kernel, hopper);
        let start = Instant::now();
        let count = |f: fn(&Timed) -> bool| plan.iter().filter(|s| f(&s.case)).count();
        out.note(&format!(
            "performance: {} prefill, {} decode, {} FP8 decode, {} paged prefill, {} MLA decode and {} append shapes \
             (CUDA events, median; comparison rows carry vs_baseline = their time / their baseline's)",
            count(|c| matches!(c, Timed::Prefill(_))),
            count(|c| matches!(c, Timed::Decode(d) if d.kv == KvFormat::Sixteen)),
            count(|c| matches!(c, Timed::Decode(d) if d.kv != KvFormat::Sixteen)),
            count(|c| matches!(c, Timed::PagedPrefill(_))),
            count(|c| matches!(c, Timed::Mla(_))),
            count(|c| matches!(c, Timed::Append(_))),
        ));
        let progress = Progress::counter(plan.len(), "timing");
        out.set_progress(progress.clone());
        let offset = cases.len(); // seeds continue after the sweep's
        let mut timed: Vec<Row> = Vec::with_capacity(plan.len());
        for (i, s) in plan.iter().enumerate() {
            let seed = case_seed(base_seed, offset + i);
            let row = match &s.case {
                Timed::Prefill(c) => {
                    progress.message(format!("prefill {}", c.label()));
                    cases::time_prefill(stream, backend, c, seed, copy)
                }
                Timed::Decode(c) => {
                    progress.message(format!("decode {}", c.label()));
                    cases::time_decode(stream, backend, c, seed, copy)
                }
                Timed::PagedPrefill(c) => {
                    progress.message(format!("paged-prefill {}", c.label()));
                    cases::time_paged_prefill(stream, backend, c, seed, copy)
                }
                Timed::Mla(c) => {
                    progress.message(c.label());
                    cases::time_mla(stream, backend, c, seed, copy)
                }
                Timed::Append(c) => {
                    progress.message(c.label());
                    cases::time_append(backend, c, seed, copy)
                }
            };
            let row = match s.baseline.and_then(|b| timed.get(b)) {
                Some(base) => compared(row, base),
                None => row,
            };
            out.row(row.clone());
            timed.push(row);
            progress.inc();
        }
        progress.finish();
        out.note(&format!("performance: done in {:.1} s", start.elapsed().as_secs_f64()));
    }

    let start = Instant::now();
    out.note(&format!("correctness: {} cases against the fp64 reference ({workers} threads)", cases.len()));
    let progress = Progress::counter(cases.len(), "checked");
    out.set_progress(progress.clone());
    ordered_parallel(
        &cases,
        workers,
        |i, c| cases::check(backend, c, case_seed(base_seed, i)),
        |row| {
            progress.message(format!("{} {}", row.op, row.label));
            out.row(row);
            progress.inc();
        },
    );
    progress.finish();
    out.set_progress(Progress::hidden());
    out.note(&format!("correctness: done in {:.1} s", start.elapsed().as_secs_f64()));
    for line in op_summary(out.rows.iter().filter(|r| r.kind == "sweep")) {
        out.note(&line);
    }
    Ok(())
}

/// One line per op (and cache type) of the correctness rows: how many passed, how many had a score
/// variant, and the worst error as a fraction of its tolerance.
pub fn op_summary<'a>(rows: impl Iterator<Item = &'a Row>) -> Vec<String> {
    #[derive(Default)]
    struct Tally {
        rows: usize,
        passed: usize,
        variants: usize,
        worst: f64,
    }
    let mut by_op: Vec<(String, Tally)> = Vec::new();
    for r in rows {
        let fp8 = r.kv_dtype.as_deref().is_some_and(|k| k.starts_with("fp8"));
        let op = if fp8 { format!("{} (FP8 cache)", r.op) } else { r.op.clone() };
        let i = by_op.iter().position(|(o, _)| *o == op).unwrap_or_else(|| {
            by_op.push((op, Tally::default()));
            by_op.len() - 1
        });
        let t = &mut by_op[i].1;
        t.rows += 1;
        t.passed += usize::from(r.passed == Some(true));
        let plain = (r.window_left, r.window_right) == (-1, -1) && r.softcap == 0.0 && !r.alibi && !r.sinks;
        t.variants += usize::from(!plain);
        if let (Some(e), Some(tol)) = (r.max_abs_err, r.tolerance) {
            t.worst = t.worst.max(if e.is_nan() { f64::INFINITY } else { e / tol });
        }
    }
    by_op
        .into_iter()
        .map(|(op, t)| {
            format!(
                "summary: {op:<26} {:>4} / {:<4} passed ({} with score variants; worst max|err| / tolerance {:.2})",
                t.passed, t.rows, t.variants, t.worst
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The comparison rows of a plan: (row, its baseline), checked to be earlier in the plan.
    fn comparisons(plan: &[TimedShape]) -> Vec<(&Timed, &Timed)> {
        plan.iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let b = s.baseline?;
                assert!(b < i, "row {i}'s baseline {b} is not timed before it");
                assert!(plan[b].baseline.is_none(), "a baseline is itself a comparison row");
                Some((&s.case, &plan[b].case))
            })
            .collect()
    }

    #[test]
    fn every_comparison_row_follows_its_baseline_of_the_same_work() {
        for (quick, hopper) in [(false, false), (false, true), (true, false), (true, true)] {
            let plan = perf_plan(quick, PrefillKernel::Auto, hopper);
            let pairs = comparisons(&plan);
            let (mut fp8, mut chunks, mut spec, mut skew, mut rope, mut wide) = (0, 0, 0, 0, 0, 0);
            let (mut v_head_dim, mut paged_v_head_dim) = (0, 0);
            let mut mla = 0;
            for (row, base) in &pairs {
                match (row, base) {
                    (Timed::Decode(c), Timed::Decode(b)) if c.rope.is_some() => {
                        assert_eq!(&DecodeCase { rope: None, ..c.clone() }, b);
                        rope += 1;
                    }
                    (Timed::Prefill(c), Timed::Prefill(d)) if c.rope.is_some() => {
                        assert_eq!(&PrefillCase { rope: None, rope_k: false, ..c.clone() }, d);
                        // q and k on the sm_80 kernel, q alone on the sm_90a one (no RoPE on K there).
                        assert_eq!(c.rope_k, c.kernel != PrefillKernel::Sm90);
                        assert!(hopper || c.kernel != PrefillKernel::Sm90);
                        rope += 1;
                    }
                    (Timed::Append(c), Timed::Append(b)) => {
                        assert!(c.rope.is_some() && append_rope_shapes().contains(b));
                        assert_eq!(&AppendCase { rope: None, ..c.clone() }, b);
                        rope += 1;
                    }
                    (Timed::Decode(c), Timed::Decode(b)) if c.head_dim_v.is_some() => {
                        // 192/128 against the same shape at D 256.
                        let shape = decode_perf()[0].clone();
                        assert_eq!(b, &DecodeCase { head_dim: 256, ..shape.clone() });
                        assert_eq!(c, &DecodeCase { head_dim: 192, head_dim_v: Some(128), ..shape });
                        paged_v_head_dim += 1;
                    }
                    (Timed::PagedPrefill(c), Timed::PagedPrefill(b)) => {
                        assert_eq!((c.head_dim, c.head_dim_v, b.head_dim), (192, Some(128), 256));
                        assert_eq!(&PagedPrefillCase { head_dim: 256, head_dim_v: None, ..c.clone() }, b);
                        assert_eq!(
                            (c.kernel, c.max_seqlen_q(), c.max_seq_len()),
                            (PagedPrefillKernel::Tiled, 512, 4096)
                        );
                        paged_v_head_dim += 1;
                    }
                    (Timed::Decode(c), Timed::Decode(b)) if c.kv == KvFormat::Sixteen => {
                        // A skewed batch against a uniform one of the same total tokens and shape.
                        assert_eq!(c.seq_lens.iter().sum::<usize>(), b.seq_lens.iter().sum::<usize>());
                        assert!(b.schedule.is_none() && b.seq_lens.iter().all(|&l| l == b.seq_lens[0]));
                        assert!(c.seq_lens.iter().max() > b.seq_lens.iter().max());
                        assert_eq!((c.heads_q, c.heads_kv, c.head_dim), (b.heads_q, b.heads_kv, b.head_dim));
                        skew += 1;
                    }
                    (Timed::Decode(c), Timed::Decode(b)) => {
                        let e4m3 = KvFormat::Fp8 { format: Fp8Format::E4m3, scales: ScaleKind::PerHead };
                        assert_eq!((&DecodeCase { kv: KvFormat::Sixteen, ..c.clone() }, c.kv), (b, e4m3));
                        assert!(fp8_decode_shapes(quick).contains(b) && b.dtype == DType::Bf16);
                        // --quick keeps the predictions row's shape.
                        assert!(!quick || (b.batch(), b.max_seq_len()) == (64, 4096));
                        fp8 += 1;
                    }
                    (Timed::PagedPrefill(c), Timed::Prefill(d)) => {
                        // The same visible (query, key) pairs: FLOPs and so TFLOPS compare directly.
                        let dense = fused_attn::testkit::timing::prefill_flops(
                            d.batch, d.heads_q, d.seqlen_q, d.seqlen_k, d.head_dim, d.causal,
                        );
                        assert_eq!(ppc::case_flops(c), dense, "{}", c.label());
                        assert_eq!((d.heads_q, d.heads_kv, d.head_dim, d.dtype), (c.heads_q, c.heads_kv, 128, c.dtype));
                        assert!(c.causal && d.causal && d.seqlen_q < d.seqlen_k);
                        assert_eq!(d.kernel, if hopper { PrefillKernel::Sm80 } else { PrefillKernel::Auto });
                        chunks += 1;
                    }
                    (Timed::PagedPrefill(c), Timed::Decode(b)) => {
                        assert!(c.max_seqlen_q() <= 8 && c.seqs.iter().all(|s| s.0 == c.max_seqlen_q()));
                        assert_eq!(b, &decode_step(c));
                        assert_eq!((c.heads_q / c.heads_kv, c.head_dim, c.page_size), (4, 128, 16));
                        assert!(matches!(c.kernel, PagedPrefillKernel::Auto | PagedPrefillKernel::Tiled));
                        spec += 1;
                    }
                    (Timed::Prefill(c), Timed::Prefill(d)) if c.head_dim_v.is_some() => {
                        // 192/128 against the D 256 shape, on the same (sm_80) kernel.
                        let (base, _) = wide_head_dim_shapes();
                        assert_eq!(&PrefillCase { kernel: base.kernel, ..(*d).clone() }, &base);
                        assert_eq!(&PrefillCase { kernel: c.kernel, ..v_head_dim_shape() }, c);
                        assert!(c.kernel == d.kernel && c.kernel != PrefillKernel::Sm90);
                        v_head_dim += 1;
                    }
                    (Timed::Prefill(c), Timed::Prefill(d)) if c.head_dim > 256 => {
                        // D 512 (the streaming path) against the same shape at D 256 (the tiled kernel).
                        let (base, d512) = wide_head_dim_shapes();
                        assert_eq!((&PrefillCase { kernel: base.kernel, ..(*d).clone() }, d.head_dim), (&base, 256));
                        assert_eq!(&PrefillCase { kernel: d512.kernel, ..(*c).clone() }, &d512);
                        assert!(c.kernel == d.kernel && c.kernel != PrefillKernel::Sm90);
                        wide += 1;
                    }
                    (Timed::Prefill(c), Timed::Prefill(d)) => {
                        // An sm90 tuning step off against the same shape with every step on.
                        assert!(hopper && c.kernel == PrefillKernel::Sm90 && c.sm90_steps != Sm90Steps::default());
                        assert_eq!(&PrefillCase { sm90_steps: Sm90Steps::default(), ..c.clone() }, d);
                    }
                    (Timed::Mla(c), Timed::Mla(b)) => {
                        // The E4M3 latent cache against the bf16 one of the same shape.
                        assert_eq!((&MlaCase { fp8: None, ..c.clone() }, c.fp8), (b, Some(Fp8Format::E4m3)));
                        assert_eq!((b.batch(), b.max_seq_len(), b.dtype), (64, 4096, DType::Bf16));
                        mla += 1;
                    }
                    _ => panic!("unexpected comparison {row:?} vs {base:?}"),
                }
            }
            // MLA: Hq 16 and 128 (Hq 128 alone in --quick).
            assert_eq!(mla, if quick { 1 } else { 2 });
            // FP8: B 1/8/64 × 4k/32k × D 128/256; chunks: 2 × 2 pages; spec-verify: 2 contexts × 2 q_lens ×
            // both paged kernels.
            // Skew: the uniform plan and a balanced schedule (full report only).
            // RoPE: prefill (sm_80; and sm_90a on Hopper), decode and 4 appends against the same shapes
            // without; D 512 prefill against D 256 (full report only).
            let rope_rows = 2 + usize::from(hopper) + append_rope_shapes().len();
            let want = if quick { (1, 1, 2, 0, 0, 0) } else { (12, 4, 8, 2, rope_rows, 1) };
            assert_eq!((fp8, chunks, spec, skew, rope, wide), want, "quick {quick} hopper {hopper}");
            assert_eq!(v_head_dim, wide, "the 192/128 row follows the D 512 one");
            // Decode and paged prefill at 192/128 (full report only).
            assert_eq!(paged_v_head_dim, if quick { 0 } else { 2 });
            // The baselines are rows the plan times anyway (the decode perf shapes), plus one dense prefill
            // per chunk shape (two kernels on Hopper).
            let decode_rows = plan
                .iter()
                .filter(|s| matches!(&s.case, Timed::Decode(c) if c.kv == KvFormat::Sixteen && c.rope.is_none()))
                .count();
            let mut dp = decode_perf_cases();
            if quick {
                dp.retain(|c| decode_perf().contains(c));
            }
            let skew = if quick { Vec::new() } else { [vec![skew_decode_shapes().0], skew_decode_shapes().1].concat() };
            let dv: Vec<DecodeCase> = v_head_dim_paged_shapes()
                .into_iter()
                .flat_map(|(b, r)| [b, r])
                .filter_map(|c| if let Timed::Decode(c) = c { Some(c) } else { None })
                .filter(|_| !quick)
                .collect();
            let skew = [skew, dv].concat();
            for c in fp8_decode_shapes(quick).into_iter().chain(skew) {
                if !dp.contains(&c) {
                    dp.push(c);
                }
            }
            assert_eq!(decode_rows, dp.len());
            let dense =
                plan.iter().filter(|s| matches!(&s.case, Timed::Prefill(c) if c.seqlen_q != c.seqlen_k)).count();
            let (shapes, kernels) = (if quick { 1 } else { 2 }, if hopper { 2 } else { 1 });
            assert_eq!(dense, shapes * kernels);
        }
        // Both predictions rows' page sizes and q_lens, and their contexts.
        let full = perf_plan(false, PrefillKernel::Auto, false);
        let paged: Vec<&PagedPrefillCase> =
            full.iter().filter_map(|s| if let Timed::PagedPrefill(c) = &s.case { Some(c) } else { None }).collect();
        for page in [16, 64] {
            assert!(paged.iter().any(|c| c.page_size == page && c.max_seqlen_q() >= 512));
        }
        for (q, ctx) in [(4, 4096), (8, 4096), (4, 32768), (8, 32768)] {
            assert!(paged.iter().any(|c| (c.max_seqlen_q(), c.max_seq_len()) == (q, ctx)), "q_len {q} ctx {ctx}");
        }
    }

    #[test]
    fn the_prefill_and_decode_rows_are_as_before() {
        let plan = perf_plan(false, PrefillKernel::Auto, true);
        let prefill: Vec<&PrefillCase> =
            plan.iter().filter_map(|s| if let Timed::Prefill(c) = &s.case { Some(c) } else { None }).collect();
        let (wide_base, _) = wide_head_dim_shapes();
        let family: Vec<&&PrefillCase> = prefill
            .iter()
            .filter(|c| c.seqlen_q == c.seqlen_k && c.sm90_steps == Sm90Steps::default() && c.rope.is_none())
            .filter(|c| c.head_dim_v.is_none())
            .filter(|c| c.head_dim <= 256 && PrefillCase { kernel: wide_base.kernel, ..(**c).clone() } != wide_base)
            .collect();
        let both = prefill_perf().iter().filter(|c| sm90_runs(c)).count();
        assert_eq!(family.len(), prefill_perf().len() + both);
        assert!(plan[..family.len()].iter().all(|s| matches!(&s.case, Timed::Prefill(c) if c.seqlen_q == c.seqlen_k)));
        let sm80 = perf_plan(false, PrefillKernel::Sm80, true);
        assert!(sm80.iter().all(|s| !matches!(&s.case, Timed::Prefill(c) if c.kernel != PrefillKernel::Sm80)));
    }

    /// On Hopper every D 128 sm90 row of the prefill family is timed again with each tuning step off,
    /// against itself; nowhere else.
    #[test]
    fn sm90_steps_are_timed_against_the_full_kernel() {
        for quick in [false, true] {
            let plan = perf_plan(quick, PrefillKernel::Auto, true);
            let ab: Vec<(&PrefillCase, usize)> = plan
                .iter()
                .filter_map(|s| match &s.case {
                    Timed::Prefill(c) if c.sm90_steps != Sm90Steps::default() => Some((c, s.baseline.unwrap())),
                    _ => None,
                })
                .collect();
            let full: Vec<usize> = (0..plan.len())
                .filter(|&i| {
                    matches!(&plan[i].case, Timed::Prefill(c) if c.kernel == PrefillKernel::Sm90
                        && c.head_dim == 128 && c.seqlen_q == c.seqlen_k && c.sm90_steps == Sm90Steps::default()
                        && c.rope.is_none())
                })
                .collect();
            assert!(!full.is_empty());
            for &i in full.iter().take(if quick { 1 } else { full.len() }) {
                let Timed::Prefill(f) = &plan[i].case else { unreachable!() };
                let against: Vec<&PrefillCase> = ab.iter().filter(|(_, b)| *b == i).map(|(c, _)| *c).collect();
                assert_eq!(against.len(), if f.causal { 3 } else { 4 }, "{}", f.label());
                for c in against {
                    assert_eq!(PrefillCase { sm90_steps: Sm90Steps::default(), ..c.clone() }, *f);
                    assert!(c.label().starts_with("sm90-no-"), "{}", c.label());
                }
            }
        }
        let elsewhere = perf_plan(false, PrefillKernel::Auto, false);
        assert!(elsewhere
            .iter()
            .all(|s| !matches!(&s.case, Timed::Prefill(c) if c.sm90_steps != Sm90Steps::default())));
    }

    #[test]
    fn comparison_rows_carry_the_time_ratio() {
        let base = Row { op: "decode".into(), label: "bf16 step".into(), ms: Some(0.2), ..Default::default() };
        let r = compared(Row { ms: Some(0.11), ..Default::default() }, &base);
        assert_eq!(r.baseline.as_deref(), Some("decode bf16 step"));
        assert!((r.vs_baseline.unwrap() - 0.55).abs() < 1e-12);
        assert!(r.table_line().contains("[0.55x the time of its decode baseline]"), "{}", r.table_line());
        // Unmeasured or failed on either side: no ratio.
        for (a, b) in [(None, Some(0.2)), (Some(0.1), None), (Some(f64::NAN), Some(0.2)), (Some(0.1), Some(0.0))] {
            let base = Row { ms: b, ..base.clone() };
            assert_eq!(compared(Row { ms: a, ..Default::default() }, &base).vs_baseline, None);
        }
    }

    #[test]
    fn the_sweep_covers_every_op_cache_type_and_variant() {
        let ops = |cases: &[Case]| {
            let mut kinds = Vec::new();
            for c in cases {
                let k = match c {
                    Case::Prefill(c) if !c.variants.is_plain() => "prefill variant",
                    Case::Prefill(_) => "prefill",
                    Case::Decode(DecodeCase { kv: KvFormat::Fp8 { format, .. }, .. }) => {
                        ["fp8 decode e4m3", "fp8 decode e5m2"][*format as usize]
                    }
                    Case::Decode(c) if !c.variants.is_plain() => "decode variant",
                    Case::Decode(_) => "decode",
                    Case::PagedPrefill(PagedPrefillCase { kv: KvFormat::Fp8 { format, .. }, .. }) => {
                        ["fp8 paged e4m3", "fp8 paged e5m2"][*format as usize]
                    }
                    Case::PagedPrefill(c) if !c.variants.is_plain() => "paged prefill variant",
                    Case::PagedPrefill(_) => "paged prefill",
                    Case::Mla(c) if c.fp8.is_some() => "fp8 mla decode",
                    Case::Mla(_) => "mla decode",
                };
                if !kinds.contains(&k) {
                    kinds.push(k);
                }
            }
            kinds.len()
        };
        let emu = Backend::Emu(fused_attn::Emulator::new());
        let full = sweep(&emu, false, PrefillKernel::Auto);
        assert_eq!(ops(&full), 12);
        assert!(ops(&sweep(&emu, true, PrefillKernel::Auto)) >= 10);
        // Paged prefill: long chunks and spec-verify-sized q_len over longer contexts.
        let paged: Vec<&PagedPrefillCase> =
            full.iter().filter_map(|c| if let Case::PagedPrefill(c) = c { Some(c) } else { None }).collect();
        assert!(paged.iter().any(|c| c.seqs.iter().any(|&(q, k)| q >= 1000 && k >= 1000)));
        assert!(paged.iter().any(|c| c.seqs.iter().any(|&(q, k)| (2..=17).contains(&q) && k >= 100)));
        // FP8: both scale kinds for each format.
        for scales in [ScaleKind::PerTensor, ScaleKind::PerHead] {
            assert!(full.iter().any(|c| matches!(c, Case::Decode(f) if f.kv.fp8().is_some_and(|k| k.1 == scales))));
            assert!(full
                .iter()
                .any(|c| matches!(c, Case::PagedPrefill(f) if f.kv.fp8().is_some_and(|k| k.1 == scales))));
        }
        // Variants alone and combined.
        let prefill_variants: Vec<_> = full
            .iter()
            .filter_map(|c| if let Case::Prefill(c) = c { Some(c.variants) } else { None })
            .filter(|v| !v.is_plain())
            .collect();
        let count = |v: &fused_attn::testkit::variants::CaseVariants| {
            usize::from(v.window.is_some())
                + usize::from(v.softcap.is_some())
                + usize::from(v.alibi != fused_attn::testkit::variants::CaseAlibi::None)
                + usize::from(v.sinks)
        };
        assert!(prefill_variants.iter().any(|v| count(v) == 1) && prefill_variants.iter().any(|v| count(v) >= 3));
    }

    #[test]
    fn the_summary_has_a_line_per_op_and_cache_type() {
        let row = |op: &str, kv: Option<&str>, passed: bool, err: f64, sinks: bool| Row {
            op: op.into(),
            kv_dtype: kv.map(Into::into),
            passed: Some(passed),
            max_abs_err: Some(err),
            tolerance: Some(1e-2),
            sinks,
            window_left: -1,
            window_right: -1,
            kind: "sweep".into(),
            ..Default::default()
        };
        let rows = [
            row("prefill", None, true, 1e-3, false),
            row("prefill", None, true, 5e-3, true),
            row("decode", Some("bf16"), true, 1e-3, false),
            row("decode", Some("fp8_e4m3"), false, f64::NAN, false),
        ];
        let lines = op_summary(rows.iter());
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[0].contains("prefill") && lines[0].contains("2 / 2") && lines[0].contains("1 with score"));
        assert!(lines[0].contains("0.50"), "{}", lines[0]);
        assert!(lines[2].contains("decode (FP8 cache)") && lines[2].contains("0 / 1") && lines[2].contains("inf"));
    }

    #[test]
    fn decode_perf_shapes_stream_from_memory() {
        let cases = decode_perf_cases();
        for c in decode_perf() {
            assert!(cases.contains(&c));
        }
        for c in &cases {
            assert!(c.kv_bytes() >= 128 << 20, "{}", c.label());
        }
    }
}
