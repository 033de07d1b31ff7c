//! A V head dim of its own in the paged cache (issue 27 item 2: DeepSeek's Dqk 192 / Dv 128 and other pairs,
//! Dv below and above Dqk): append writes K rows of Dqk and V rows of Dv into K pages `[.., Dqk]` and V pages
//! `[.., Dv]`; decode (split and not) and paged prefill (the tiled and the streaming kernel, split and not)
//! read them into `o [.., Dv]`, 16-bit and FP8 caches (E4M3, E5M2), GQA/MQA, score variants, page sizes 1,
//! 12 (not a power of two) and 16, against the fp64 reference (`reference::check_decode` /
//! `check_paged_prefill`, which read the same views). Hidden memory is NaN: every V row of the pages is
//! padded past Dv with NaN (a strided V view), every slot no sequence owns and the spare pages hold NaN in K
//! and V, and so do the appended padding rows (slot −1); o and lse start as NaN. Then bad shapes are typed
//! errors naming the tensor.
use crate::common;

use fused_attn::decode::{DecodeOptions, DecodeWorkspace};
use fused_attn::dtype::Fp8Element;
use fused_attn::paged_prefill::PagedPrefillProblem;
use fused_attn::reference::{check_decode, check_paged_prefill};
use fused_attn::testkit::cases::decode::DecodeCase;
use fused_attn::testkit::cases::kv::KvFormat;
use fused_attn::testkit::cases::paged_prefill as ppc;
use fused_attn::testkit::cost_model;
use fused_attn::testkit::seed::rng;
use fused_attn::{
    append, decode, paged_prefill, AlibiSlopes, DType, DecodeProblem, Element, Emulator, ErrorKind, Fp8E4m3, Fp8E5m2,
    Fp8Format, KvCacheOf, KvScales, PagedKvCacheMut, PagedPrefillKernel, PagedPrefillOptions, PagedPrefillWorkspace,
    ScaleKind, ScoreMod, SplitPolicy, Stream, TensorView, TensorViewMut,
};
use half::{bf16, f16};
use rand::seq::SliceRandom;
use rand::Rng;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kv {
    Sixteen,
    E4m3,
    E5m2,
}

#[derive(Debug, Clone)]
struct Case {
    dtype: DType,
    kv: Kv,
    dqk: usize,
    dv: usize,
    heads: (usize, usize),
    page_size: usize,
    seq_lens: Vec<usize>,
    /// Paged prefill: new tokens per sequence (`None`: decode, one query per sequence).
    q_lens: Option<Vec<usize>>,
    splits: Option<usize>,
    variants: bool,
    kernel: PagedPrefillKernel,
    /// On a scheduled workspace (balanced chunks over 12 CTA slots; `splits` then `None`, paged prefill on
    /// the streaming kernel): the schedule's merge rows over Dv.
    scheduled: bool,
}

impl Case {
    fn label(&self) -> String {
        format!(
            "{:?} {:?} {}/{} H {}:{} ps {} lens {:?} q {:?} splits {:?}{}{} {:?}",
            self.dtype,
            self.kv,
            self.dqk,
            self.dv,
            self.heads.0,
            self.heads.1,
            self.page_size,
            self.seq_lens,
            self.q_lens,
            self.splits,
            if self.variants { " variants" } else { "" },
            if self.scheduled { " scheduled" } else { "" },
            self.kernel
        )
    }
}

/// Elements of a V row in the pages past Dv (NaN): whole 16-byte units of the cache's element.
fn v_pad(kv: Kv) -> usize {
    if kv == Kv::Sixteen {
        8
    } else {
        16
    }
}

fn cases() -> Vec<Case> {
    let pairs = [(192, 128), (128, 64), (64, 128), (256, 128), (96, 64)];
    let fp8_pairs = [(192, 128), (128, 64), (64, 128)];
    let lens: [&[usize]; 3] = [&[0, 1, 37, 300], &[130, 5], &[64, 0, 200]];
    let mut out = Vec::new();
    let base = |dtype, kv, (dqk, dv), i: usize| Case {
        dtype,
        kv,
        dqk,
        dv,
        heads: [(8, 2), (4, 4), (6, 1)][i % 3],
        page_size: [16, 12, 1][i % 3],
        seq_lens: lens[i % 3].to_vec(),
        q_lens: None,
        splits: [Some(1), Some(3), None][(i / 3) % 3],
        variants: i % 2 == 1,
        kernel: PagedPrefillKernel::Auto,
        scheduled: false,
    };
    let mut i = 0;
    for (n, &pair) in pairs.iter().enumerate() {
        for dtype in [DType::Bf16, DType::F16] {
            // decode
            out.push(base(dtype, Kv::Sixteen, pair, i));
            i += 1;
            // paged prefill: chunked prefill (long chunks: the tiled kernel) and spec-verify rows (streaming)
            let kernel = [PagedPrefillKernel::Tiled, PagedPrefillKernel::Streaming][(n + i) % 2];
            let mut c = base(dtype, Kv::Sixteen, pair, i);
            c.q_lens = Some(c.seq_lens.iter().enumerate().map(|(b, &l)| [l, l.min(3), l.min(40)][b % 3]).collect());
            c.kernel = kernel;
            out.push(c);
            i += 1;
        }
    }
    for (n, &pair) in fp8_pairs.iter().enumerate() {
        for kv in [Kv::E4m3, Kv::E5m2] {
            out.push(base(DType::Bf16, kv, pair, i));
            i += 1;
            let mut c = base(DType::F16, kv, pair, i);
            c.q_lens = Some(c.seq_lens.iter().map(|&l| l.min(5)).collect());
            c.kernel = [PagedPrefillKernel::Tiled, PagedPrefillKernel::Streaming][(n + i) % 2];
            out.push(c);
            i += 1;
        }
    }
    // Short chunks (q_len · G <= 16: one CTA per KV head on either kernel), no window: the bytes-exact check.
    for (n, (pair, kv, kernel)) in [
        ((192, 128), Kv::Sixteen, PagedPrefillKernel::Tiled),
        ((192, 128), Kv::Sixteen, PagedPrefillKernel::Streaming),
        ((64, 128), Kv::E5m2, PagedPrefillKernel::Tiled),
        ((128, 64), Kv::E4m3, PagedPrefillKernel::Streaming),
    ]
    .into_iter()
    .enumerate()
    {
        let mut c = base([DType::Bf16, DType::F16][n % 2], kv, pair, 0);
        (c.q_lens, c.kernel, c.splits) = (Some(vec![0, 1, 4, 4]), kernel, Some(1 + n % 2));
        out.push(c);
    }
    // Scheduled workspaces (decode; paged prefill's streaming kernel), 16-bit and FP8.
    for (n, (pair, kv)) in [((192, 128), Kv::Sixteen), ((64, 128), Kv::E4m3)].into_iter().enumerate() {
        let mut c = base(DType::Bf16, kv, pair, 0);
        (c.splits, c.scheduled, c.seq_lens) = (None, true, vec![700, 3, 0, 129]);
        out.push(c.clone());
        (c.q_lens, c.kernel, c.variants) = (Some(vec![4, 3, 0, 2]), PagedPrefillKernel::Streaming, n == 0);
        out.push(c);
    }
    // Past 256 (decode's width 512; paged prefill's streaming kernel), Dv below and above Dqk.
    let mut wide = base(DType::Bf16, Kv::Sixteen, (320, 128), 0);
    wide.seq_lens = vec![40, 3];
    out.push(wide.clone());
    wide.q_lens = Some(vec![7, 3]);
    (wide.dqk, wide.dv, wide.splits) = (128, 264, Some(2));
    out.push(wide);
    out
}

/// NaN in the cache's element type.
trait CacheNan: Copy {
    fn nan_code() -> Self;
    fn bits(self) -> u16;
}
impl CacheNan for bf16 {
    fn nan_code() -> Self {
        bf16::NAN
    }
    fn bits(self) -> u16 {
        self.to_bits()
    }
}
impl CacheNan for f16 {
    fn nan_code() -> Self {
        f16::NAN
    }
    fn bits(self) -> u16 {
        self.to_bits()
    }
}
impl CacheNan for Fp8E4m3 {
    fn nan_code() -> Self {
        Fp8E4m3::from_code(0x7f)
    }
    fn bits(self) -> u16 {
        self.code().into()
    }
}
impl CacheNan for Fp8E5m2 {
    fn nan_code() -> Self {
        Fp8E5m2::from_code(0x7f)
    }
    fn bits(self) -> u16 {
        self.code().into()
    }
}

fn run_case(i: usize, c: &Case) -> Result<String, String> {
    match (c.dtype, c.kv) {
        (DType::Bf16, Kv::Sixteen) => run::<bf16, bf16>(i, c),
        (DType::F16, Kv::Sixteen) => run::<f16, f16>(i, c),
        (DType::Bf16, Kv::E4m3) => run::<bf16, Fp8E4m3>(i, c),
        (DType::F16, Kv::E4m3) => run::<f16, Fp8E4m3>(i, c),
        (DType::Bf16, Kv::E5m2) => run::<bf16, Fp8E5m2>(i, c),
        (DType::F16, Kv::E5m2) => run::<f16, Fp8E5m2>(i, c),
    }
    .map_err(|e| e.to_string())
    .and_then(|(passed, msg)| common::verdict(passed, msg))
}

/// Appends every sequence's tokens into NaN pages (K `[.., Dqk]`, V `[.., Dv]` in rows padded with NaN),
/// checks what append wrote, then runs decode or paged prefill over the cache and checks it.
fn run<T: Element, C: KvCacheOf<T> + CacheNan>(i: usize, c: &Case) -> fused_attn::Result<(bool, String)> {
    let emu = Emulator::new().with_table_checks(fused_attn::TableChecks::GpuMasking);
    let stream = Stream::Emu(&emu);
    let mut rng = rng(common::case_seed(27_800 + i));
    let (ps, (hq, hkv), dqk, dv) = (c.page_size, c.heads, c.dqk, c.dv);
    let dvp = dv + v_pad(c.kv);
    let batch = c.seq_lens.len();
    let pages_of: Vec<usize> = c.seq_lens.iter().map(|&n| n.div_ceil(ps)).collect();
    let width = pages_of.iter().copied().max().unwrap_or(0) + 1;
    let num_pages = pages_of.iter().sum::<usize>() + 2; // two spare pages, never named by a used entry
    let mut ids: Vec<i32> = (0..num_pages as i32).collect();
    ids.shuffle(&mut rng);
    let mut table = vec![ids[num_pages - 1]; batch * width]; // unused entries: a spare (NaN) page
    let mut next = 0;
    for (b, &n) in pages_of.iter().enumerate() {
        table[b * width..][..n].copy_from_slice(&ids[next..next + n]);
        next += n;
    }
    let mut k_cache = vec![C::nan_code(); num_pages * ps * hkv * dqk];
    let mut v_pages = vec![C::nan_code(); num_pages * ps * hkv * dvp];
    // New tokens: every sequence's, then a NaN padding row at slot -1.
    let (mut k, mut v, mut slots) = (Vec::new(), Vec::new(), Vec::new());
    for (b, &len) in c.seq_lens.iter().enumerate() {
        for t in 0..len {
            k.extend((0..hkv * dqk).map(|_| T::from_f64(rng.random_range(-1.5..1.5))));
            v.extend((0..hkv * dv).map(|_| T::from_f64(rng.random_range(-0.5..1.5))));
            slots.push(i64::from(table[b * width + t / ps]) * ps as i64 + (t % ps) as i64);
        }
    }
    k.extend(std::iter::repeat_n(T::nan(), hkv * dqk));
    v.extend(std::iter::repeat_n(T::nan(), hkv * dv));
    slots.push(-1);
    let n = slots.len();
    let scales = match c.kv {
        Kv::Sixteen => None,
        _ => Some(KvScales::per_head(
            &stream,
            &(0..hkv).map(|h| 0.01 + 0.002 * h as f32).collect::<Vec<_>>(),
            &(0..hkv).map(|h| 0.005 + 0.001 * h as f32).collect::<Vec<_>>(),
        )?),
    };
    let v_strides = [(ps * hkv * dvp) as i64, (hkv * dvp) as i64, dvp as i64, 1];
    let mut cache = PagedKvCacheMut::new(
        TensorViewMut::host(&mut k_cache, [num_pages, ps, hkv, dqk])?,
        TensorViewMut::host(&mut v_pages, [num_pages, ps, hkv, dv])?.with_strides(v_strides)?,
    )?;
    if let Some(s) = &scales {
        cache = cache.with_scales(s)?;
    }
    append(
        &stream,
        &TensorView::host(&k, [n, hkv, dqk])?,
        &TensorView::host(&v, [n, hkv, dv])?,
        &TensorView::host(&slots, [n])?,
        &mut cache,
    )?;
    let seq_lens: Vec<i32> = c.seq_lens.iter().map(|&l| l as i32).collect();
    let max_len = c.seq_lens.iter().copied().max().unwrap_or(0);
    let table_view = TensorView::host(&table, [batch, width])?;
    let lens_view = TensorView::host(&seq_lens, [batch])?;
    let read = cache.with_table(table_view, lens_view, max_len)?;
    let slopes: Vec<f32> = (0..hq).map(|h| 0.02 + 0.01 * h as f32).collect();
    let sinks: Vec<f32> = (0..hq).map(|h| 0.3 * h as f32 - 0.5).collect();
    let (slopes_view, sinks_view) = (TensorView::host(&slopes, [hq])?, TensorView::host(&sinks, [hq])?);
    let score_mod = if c.variants {
        ScoreMod {
            window: Some((90, if c.q_lens.is_some() { 2 } else { 0 })),
            softcap: Some(20.0),
            alibi_slopes: Some(AlibiSlopes::PerHead(&slopes_view)),
            sinks: Some(&sinks_view),
        }
    } else {
        ScoreMod::default()
    };
    let widest = dqk.max(dv);
    let cost; // the launch's byte counts against the model (decode, short paged prefill chunks)
    let check = match &c.q_lens {
        None => {
            let q: Vec<T> = (0..batch * hq * dqk).map(|_| T::from_f64(rng.random_range(-2.0..2.0))).collect();
            let (mut o, mut lse) = (vec![T::nan(); batch * hq * dv], vec![f32::NAN; batch * hq]);
            let opts = DecodeOptions { num_splits: c.splits, score_mod, ..Default::default() };
            let mut ws = if c.scheduled {
                let limits =
                    DecodeProblem { batch, heads_q: hq, heads_kv: hkv, head_dim: widest, max_seq_len: max_len };
                DecodeWorkspace::scheduled_on(&stream, &limits, SplitPolicy::Balanced, 12)?
            } else {
                DecodeWorkspace::with_capacity(&stream, batch, hq, widest, 8)?
            };
            let q_view = TensorView::host(&q, [batch, hq, dqk])?;
            let plan = decode(
                &stream,
                &q_view,
                &read,
                &mut TensorViewMut::host(&mut o, [batch, hq, dv])?,
                Some(&mut TensorViewMut::host(&mut lse, [batch, hq])?),
                &mut ws,
                &opts,
            )?;
            cost = decode_cost_mismatches(&emu, c, &plan);
            let (o_view, lse_view) = (TensorView::host(&o, [batch, hq, dv])?, TensorView::host(&lse, [batch, hq])?);
            check_decode(&q_view, &read, &o_view, Some(&lse_view), &opts)?
        }
        Some(q_lens) => {
            let mut cu = vec![0i32];
            for &l in q_lens {
                cu.push(cu.last().unwrap() + l as i32);
            }
            let total_q = *cu.last().unwrap() as usize;
            let max_q = q_lens.iter().copied().max().unwrap_or(0);
            let q: Vec<T> = (0..total_q * hq * dqk).map(|_| T::from_f64(rng.random_range(-2.0..2.0))).collect();
            let (mut o, mut lse) = (vec![T::nan(); total_q * hq * dv], vec![f32::NAN; hq * total_q]);
            let opts = PagedPrefillOptions { num_splits: c.splits, score_mod, kernel: c.kernel, ..Default::default() };
            let mut ws = if c.scheduled {
                let limits = PagedPrefillProblem {
                    batch,
                    heads_q: hq,
                    heads_kv: hkv,
                    head_dim: widest,
                    total_q,
                    max_seqlen_q: max_q,
                    max_seq_len: max_len,
                };
                PagedPrefillWorkspace::scheduled_on(&stream, &limits, SplitPolicy::Balanced, 12)?
            } else {
                PagedPrefillWorkspace::with_capacity(&stream, total_q, hq, widest, 8)?
            };
            let (q_view, cu_view) = (TensorView::host(&q, [total_q, hq, dqk])?, TensorView::host(&cu, [batch + 1])?);
            paged_prefill(
                &stream,
                &q_view,
                &cu_view,
                max_q,
                &read,
                &mut TensorViewMut::host(&mut o, [total_q, hq, dv])?,
                Some(&mut TensorViewMut::host(&mut lse, [hq, total_q])?),
                Some(&mut ws),
                &opts,
            )?;
            cost = paged_prefill_cost_mismatches(&emu, c);
            let o_view = TensorView::host(&o, [total_q, hq, dv])?;
            let lse_view = TensorView::host(&lse, [hq, total_q])?;
            check_paged_prefill(&q_view, &cu_view, &read, &o_view, Some(&lse_view), &opts)?
        }
    };
    // What append wrote: the V pages' columns past Dv are still NaN (never written), and a 16-bit cache holds
    // the new rows bit for bit.
    let pad_ok = v_pages.chunks(dvp).all(|row| row[dv..].iter().all(|x| x.bits() == C::nan_code().bits()));
    let mut rows_ok = true;
    if c.kv == Kv::Sixteen {
        for (t, &slot) in slots.iter().enumerate().filter(|&(_, &s)| s >= 0) {
            let s = slot as usize;
            let k_row = &k_cache[s * hkv * dqk..][..hkv * dqk];
            rows_ok &= k_row.iter().zip(&k[t * hkv * dqk..]).all(|(a, b)| a.bits() == b.to_bits());
            for h in 0..hkv {
                let v_row = &v_pages[(s * hkv + h) * dvp..][..dv];
                rows_ok &= v_row.iter().zip(&v[(t * hkv + h) * dv..]).all(|(a, b)| a.bits() == b.to_bits());
            }
        }
    }
    let passed = check.passed() && pad_ok && rows_ok && cost.is_empty();
    Ok((passed, format!("{check}; V padding NaN: {pad_ok}; appended rows exact: {rows_ok}; cost {cost:?}")))
}

impl Case {
    /// The cache format as the testkit names it (FP8 with per-head scales, as `run` makes them).
    fn kv_format(&self) -> KvFormat {
        let fp8 = |format| KvFormat::Fp8 { format, scales: ScaleKind::PerHead };
        match self.kv {
            Kv::Sixteen => KvFormat::Sixteen,
            Kv::E4m3 => fp8(Fp8Format::E4m3),
            Kv::E5m2 => fp8(Fp8Format::E5m2),
        }
    }
}

/// Paged prefill's traffic with a V head dim of its own against the testkit's short-chunk model
/// (`cost_model::paged_prefill_short_chunk_bytes`: chunks of at most 16 packed rows per KV head without a
/// window, either kernel): K bytes of Dqk and V bytes of Dv columns of every cached token once per KV head,
/// O of Dv written once. Cases outside the model (a window, longer chunks) are not counted.
fn paged_prefill_cost_mismatches(emu: &Emulator, c: &Case) -> Vec<String> {
    let Some(q_lens) = &c.q_lens else { return Vec::new() };
    let seqs: Vec<(usize, usize)> = q_lens.iter().copied().zip(c.seq_lens.iter().copied()).collect();
    let mut case = ppc::case(c.dqk, c.heads, c.page_size, &seqs);
    (case.dtype, case.head_dim_v, case.kv) = (c.dtype, Some(c.dv), c.kv_format());
    if c.variants {
        case.variants.window = Some((90, 2));
    }
    let Some(model) = cost_model::paged_prefill_short_chunk_bytes(&case) else { return Vec::new() };
    let counters = emu.last_launch_counters().expect("a launch");
    let ratios = model.ratios(&counters).expect("a paged prefill kernel ran");
    ratios.into_iter().filter(|&(_, r)| r != 1.0).map(|(what, r)| format!("{what}: measured / model = {r}")).collect()
}

/// Decode's traffic with a V head dim of its own (the last launch on `emu`, which followed `plan`) against
/// the testkit's decode model (`cost_model::decode_cost`; cases without a window, which would hide keys): K
/// bytes of Dqk and V bytes of Dv columns of every token once per KV head, Q of Dqk read once per split, O
/// of Dv written once (by the merge after a split, whose fp32 partials are of Dv columns too, written once
/// per split and read at most once), the mma of the kernel's width. A scheduled launch (its own cuts) is
/// held to the K/V reads and O alone.
fn decode_cost_mismatches(emu: &Emulator, c: &Case, plan: &fused_attn::DecodePlan) -> Vec<String> {
    if c.variants {
        return Vec::new();
    }
    let case = DecodeCase {
        head_dim_v: Some(c.dv),
        kv: c.kv_format(),
        ..DecodeCase::new(c.dtype, c.dqk, c.heads, c.page_size, &c.seq_lens, c.splits)
    };
    let model = cost_model::decode_cost(&case, plan);
    let counters = emu.last_launch_counters().expect("a launch");
    let dec = counters.kernel("paged_decode").expect("the decode kernel");
    let mut checks = vec![
        ("k_cache read", dec.read_of("k_cache"), model.k_bytes_read),
        ("v_cache read", dec.read_of("v_cache"), model.v_bytes_read),
        ("o written", counters.total().written_of("o"), model.o_bytes_written),
    ];
    if !c.scheduled {
        checks.extend([("q read", dec.read_of("q"), model.q_bytes_read), ("mma", dec.mma, model.mma)]);
        checks.push(("partial_o written", dec.written_of("partial_o"), model.partial_o_bytes_written));
    }
    let mut out: Vec<String> = checks
        .into_iter()
        .filter(|&(_, measured, want)| measured != want)
        .map(|(what, measured, want)| format!("{what} {measured} B, model {want} B"))
        .collect();
    if let Some(merge) = counters.kernel("merge_states") {
        if merge.read_of("partial_o") > dec.written_of("partial_o") {
            out.push(format!(
                "merge read {} B of partials, {} B written",
                merge.read_of("partial_o"),
                dec.written_of("partial_o")
            ));
        }
    }
    out
}

/// The bit pattern of a 16-bit element (append's copies are bitwise).
trait Bits {
    fn to_bits(&self) -> u16;
}
impl<T: Element> Bits for T {
    fn to_bits(&self) -> u16 {
        let mut b = [0u8; 2];
        // SAFETY: T is a 16-bit element (f16 / bf16), two plain bytes.
        unsafe { std::ptr::copy_nonoverlapping(self as *const T as *const u8, b.as_mut_ptr(), 2) };
        u16::from_ne_bytes(b)
    }
}

#[test]
fn emulated_v_head_dim_sweep() {
    let cases = cases();
    common::sweep(
        "paged_v_head_dim",
        "emulated_v_head_dim_sweep",
        &cases,
        common::all_cores().min(4),
        Case::label,
        run_case,
    );
}

/// Wrong shapes against a 192/128 cache are typed errors naming the tensor: o as wide as q (decode, paged
/// prefill), v rows as wide as k (append), a V head dim no op takes, an FP8 V head dim not a multiple of 16.
#[test]
fn v_head_dim_shapes_are_typed_errors() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let (np, ps, hkv, hq, dqk, dv) = (3, 16, 2, 4, 192, 128);
    let mut k_cache = vec![bf16::ZERO; np * ps * hkv * dqk];
    let mut v_cache = vec![bf16::ZERO; np * ps * hkv * dv];
    let mut cache = PagedKvCacheMut::new(
        TensorViewMut::host(&mut k_cache, [np, ps, hkv, dqk]).unwrap(),
        TensorViewMut::host(&mut v_cache, [np, ps, hkv, dv]).unwrap(),
    )
    .unwrap();
    let (k, v, slots) = (vec![bf16::ONE; hkv * dqk], vec![bf16::ONE; hkv * dqk], vec![0i64]);
    let e = append(
        &stream,
        &TensorView::host(&k, [1, hkv, dqk]).unwrap(),
        &TensorView::host(&v, [1, hkv, dqk]).unwrap(),
        &TensorView::host(&slots, [1]).unwrap(),
        &mut cache,
    )
    .unwrap_err();
    assert_eq!((e.kind(), e.message().starts_with("v")), (&ErrorKind::Shape, true), "{e}");
    let (table, lens) = (vec![0i32, 1], vec![20i32]);
    let read =
        cache.with_table(TensorView::host(&table, [1, 2]).unwrap(), TensorView::host(&lens, [1]).unwrap(), 20).unwrap();
    let q = vec![bf16::ONE; hq * dqk];
    let mut o = vec![bf16::NAN; hq * dqk];
    let mut ws = DecodeWorkspace::with_capacity(&stream, 1, hq, dqk, 2).unwrap();
    let e = decode(
        &stream,
        &TensorView::host(&q, [1, hq, dqk]).unwrap(),
        &read,
        &mut TensorViewMut::host(&mut o, [1, hq, dqk]).unwrap(),
        None,
        &mut ws,
        &DecodeOptions::default(),
    )
    .unwrap_err();
    assert_eq!((e.kind(), e.message().starts_with("o")), (&ErrorKind::Shape, true), "{e}");
    let cu = vec![0i32, 1];
    let e = paged_prefill(
        &stream,
        &TensorView::host(&q, [1, hq, dqk]).unwrap(),
        &TensorView::host(&cu, [2]).unwrap(),
        1,
        &read,
        &mut TensorViewMut::host(&mut o, [1, hq, dqk]).unwrap(),
        None,
        None,
        &PagedPrefillOptions::default(),
    )
    .unwrap_err();
    assert_eq!((e.kind(), e.message().starts_with("o")), (&ErrorKind::Shape, true), "{e}");
    // A V head dim outside every op's range (16: below 32) is Unsupported, naming v_cache.
    let mut v16 = vec![bf16::ZERO; np * ps * hkv * 16];
    let mut k2 = vec![bf16::ZERO; np * ps * hkv * dqk];
    let narrow = PagedKvCacheMut::new(
        TensorViewMut::host(&mut k2, [np, ps, hkv, dqk]).unwrap(),
        TensorViewMut::host(&mut v16, [np, ps, hkv, 16]).unwrap(),
    )
    .unwrap();
    let read = narrow
        .with_table(TensorView::host(&table, [1, 2]).unwrap(), TensorView::host(&lens, [1]).unwrap(), 20)
        .unwrap();
    let mut o16 = vec![bf16::NAN; hq * 16];
    let e = decode(
        &stream,
        &TensorView::host(&q, [1, hq, dqk]).unwrap(),
        &read,
        &mut TensorViewMut::host(&mut o16, [1, hq, 16]).unwrap(),
        None,
        &mut ws,
        &DecodeOptions::default(),
    )
    .unwrap_err();
    assert_eq!((e.kind(), e.message().starts_with("v_cache")), (&ErrorKind::Unsupported, true), "{e}");
    // FP8: Dv 136 (a multiple of 8, not 16; its rows padded to 144 bytes) is Unsupported for append, naming
    // v_cache.
    let mut k8 = vec![Fp8E4m3::from_code(0); np * ps * hkv * dqk];
    let mut v8 = vec![Fp8E4m3::from_code(0); np * ps * hkv * 144];
    let scales = KvScales::per_tensor(&stream, 1.0, 1.0).unwrap();
    let v8_strides = [(ps * hkv * 144) as i64, (hkv * 144) as i64, 144, 1];
    let v8_view = TensorViewMut::host(&mut v8, [np, ps, hkv, 136]).unwrap().with_strides(v8_strides).unwrap();
    let mut fp8 = PagedKvCacheMut::new(TensorViewMut::host(&mut k8, [np, ps, hkv, dqk]).unwrap(), v8_view)
        .unwrap()
        .with_scales(&scales)
        .unwrap();
    let v136 = vec![bf16::ONE; hkv * 136];
    let e = append(
        &stream,
        &TensorView::host(&k, [1, hkv, dqk]).unwrap(),
        &TensorView::host(&v136, [1, hkv, 136]).unwrap(),
        &TensorView::host(&slots, [1]).unwrap(),
        &mut fp8,
    )
    .unwrap_err();
    assert_eq!((e.kind(), e.message().starts_with("v_cache")), (&ErrorKind::Unsupported, true), "{e}");
}

/// The testkit's paged fixtures with a V head dim of their own (what the runner's `--head-dim-v` and the
/// sweeps build: K pages of Dqk, V pages of Dv, q of Dqk, o of Dv): decode over every cache layout
/// (token-major, head-major, one interleaved buffer of K and V blocks of their own sizes), q/o strided head
/// slices, 16-bit and FP8 caches, split and not; paged prefill on both kernels, split, with variants; append
/// of K rows of Dqk and V rows of Dv, with RoPE on K, checked bit for bit against the model of the kernel.
/// Each decode and paged prefill is judged against the fp64 reference (over a cache whose V is of Dv) on
/// NaN-poisoned outputs.
#[test]
fn testkit_fixtures_take_a_v_head_dim_of_their_own() {
    use fused_attn::testkit::cases::append::{self as ac, AppendCase};
    use fused_attn::testkit::cases::decode::{self as dc, CacheLayout, DecodeInputs, PagedFixture};
    let emu = Emulator::new();
    let fp8 = |format| KvFormat::Fp8 { format, scales: ScaleKind::PerHead };
    let mut failures = Vec::new();
    for (i, (layout, kv, (dqk, dv))) in [
        (CacheLayout::TokenMajor, KvFormat::Sixteen, (192, 128)),
        (CacheLayout::HeadMajor, KvFormat::Sixteen, (64, 128)),
        (CacheLayout::Interleaved, fp8(Fp8Format::E4m3), (192, 128)),
        (CacheLayout::Interleaved, KvFormat::Sixteen, (128, 64)),
    ]
    .into_iter()
    .enumerate()
    {
        let case = DecodeCase {
            head_dim_v: Some(dv),
            kv,
            ..DecodeCase::new(DType::Bf16, dqk, (8, 2), 16, &[0, 17, 300], [Some(2), None][i % 2])
        };
        let inputs = DecodeInputs { cache_layout: layout, strided_q_o: i % 2 == 0, ..Default::default() };
        let seed = common::case_seed(27_900 + i);
        let f = PagedFixture::<bf16>::with_inputs(&case, &inputs, seed).unwrap();
        assert_eq!((f.k_cache.len(), f.v_cache.len()), (f.num_pages * 16 * 2 * dqk, f.num_pages * 16 * 2 * dv));
        let r = dc::run_inputs_emulated(&emu, &f, seed).unwrap();
        assert_eq!(r.o.len(), 3 * 8 * dv, "{}", case.label());
        if !r.outcome.passed() {
            failures.push(format!("decode {} {layout:?}: {}", case.label(), r.outcome.summary()));
        }
    }
    for (i, (kernel, (dqk, dv), kv, splits, variants)) in [
        (PagedPrefillKernel::Tiled, (192, 128), KvFormat::Sixteen, Some(2), false),
        (PagedPrefillKernel::Streaming, (192, 128), fp8(Fp8Format::E5m2), None, true),
        (PagedPrefillKernel::Tiled, (96, 64), KvFormat::Sixteen, None, true),
        (PagedPrefillKernel::Streaming, (64, 128), KvFormat::Sixteen, Some(3), false),
    ]
    .into_iter()
    .enumerate()
    {
        let mut case = ppc::case(dqk, (8, 2), [16, 12][i % 2], &[(5, 90), (3, 3), (0, 7), (2, 40)]);
        (case.head_dim_v, case.kv, case.kernel, case.num_splits) = (Some(dv), kv, kernel, splits);
        if variants {
            case.variants = fused_attn::testkit::variants::CaseVariants {
                window: Some((30, 0)),
                softcap: Some(20.0),
                sinks: true,
                ..Default::default()
            };
        }
        let seed = common::case_seed(27_950 + i);
        let r = ppc::run_case_emulated::<bf16>(&emu, &case, seed).unwrap();
        assert_eq!(r.o.len(), case.total_q() * 8 * dv, "{}", case.label());
        if !r.outcome.passed() {
            failures.push(format!("paged prefill {}: {}", case.label(), r.outcome.summary()));
        }
    }
    let rope = fused_attn::testkit::cases::decode::CaseRope {
        config: fused_attn::RopeConfig::new(10_000.0, 64, fused_attn::RopeStyle::Neox),
        explicit_positions: false,
    };
    for (i, (kv, (dqk, dv), rope)) in [
        (KvFormat::Sixteen, (192, 128), Some(rope)),
        (fp8(Fp8Format::E4m3), (192, 128), None),
        (KvFormat::Sixteen, (64, 128), None),
    ]
    .into_iter()
    .enumerate()
    {
        let case = AppendCase {
            dtype: DType::Bf16,
            head_dim: dqk,
            head_dim_v: Some(dv),
            heads_kv: 2,
            page_size: 16,
            seqs: vec![(5, 20), (9, 9)],
            kv,
            rope,
        };
        let f = ac::AppendFixture::<bf16>::new(&case, common::case_seed(27_980 + i)).unwrap();
        assert_eq!((f.k.len(), f.v.len(), f.v_cache_shape[3]), (14 * 2 * dqk, 14 * 2 * dv, dv));
        let out = ac::run_emulated(&emu, &f).unwrap();
        let o = f.evaluate(&out);
        if !o.passed() {
            failures.push(format!("{}: {o:?}", case.label()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
