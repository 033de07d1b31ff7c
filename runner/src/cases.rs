//! Runner cases: one prefill or decode case, run on a backend and turned into a [`Row`]. Correctness comes
//! from the library harnesses (`fused_attn::testkit::cases::prefill`, `fused_attn::testkit::cases::decode`), timing from
//! their GPU timers.

use std::sync::Arc;

use fused_attn::cudarc::driver::CudaStream;
use fused_attn::half::{bf16, f16};
use fused_attn::paged::MAX_PAGE_SIZE;
use fused_attn::reference::Comparison;
use fused_attn::testkit::cases::append::{self as ac, AppendCase};
use fused_attn::testkit::cases::decode::{self as dc, DecodeCase};
use fused_attn::testkit::cases::kv::{KvFormat, QuantError};
use fused_attn::testkit::cases::mla::{self as mc, MlaCase};
use fused_attn::testkit::cases::paged_prefill::{self as ppc, PagedPrefillCase};
use fused_attn::testkit::cases::prefill::{self as pc, PrefillCase, PrefillFixture, PrefillOutputs};
use fused_attn::testkit::cost_model;
use fused_attn::testkit::timing::Runs;
use fused_attn::testkit::variants::{CaseAlibi, CaseVariants};
use fused_attn::{DType, Element, Error, LaunchCounters, Result};

use crate::backend::Backend;
use crate::dump::Dump;
use crate::progress::Progress;
use crate::row::Row;

/// One unit of work.
#[derive(Clone, Debug)]
pub enum Case {
    Prefill(PrefillCase),
    /// Decode over a 16-bit or FP8 cache.
    Decode(DecodeCase),
    /// Chunked prefill / speculative verification over the paged cache (16-bit or FP8).
    PagedPrefill(PagedPrefillCase),
    /// MLA decode over a 16-bit or FP8 latent cache.
    Mla(MlaCase),
}

/// Largest full fp64 check: B·Hq·Tq·Tk·D multiply-adds (a few seconds of reference); larger shapes are
/// checked on [`SAMPLE_ROWS`] sampled rows.
pub const FULL_CHECK_LIMIT: usize = 1 << 31;
pub const SAMPLE_ROWS: usize = 256;
/// Largest problem the runner builds host data for (elements of q + k + v + o, or of the two caches).
pub const MAX_ELEMENTS: usize = 1 << 32;

pub fn prefill_row(kind: &str, backend: &Backend, c: &PrefillCase, seed: u64) -> Row {
    Row {
        kind: kind.into(),
        label: c.label(),
        seed,
        op: "prefill".into(),
        backend: backend.name().into(),
        dtype: c.dtype.name().into(),
        head_dim: c.head_dim,
        head_dim_v: Some(c.dv()),
        batch: c.varlen.as_ref().map_or(c.batch, |s| s.len()),
        heads_q: c.heads_q,
        heads_kv: c.heads_kv,
        seqlen_q: c.seqlen_q,
        seqlen_k: c.seqlen_k,
        causal: c.causal,
        ..variant_fields(&c.variants)
    }
}

/// A row's variant fields (the rest default).
fn variant_fields(v: &CaseVariants) -> Row {
    let (window_left, window_right) = v.window.unwrap_or((-1, -1));
    Row {
        window_left,
        window_right,
        softcap: v.softcap.map_or(0.0, f64::from),
        alibi: v.alibi != CaseAlibi::None,
        sinks: v.sinks,
        ..Default::default()
    }
}

/// The fields a paged op's row (decode, paged prefill) takes from its case: the dtypes, the cache, the
/// splits and the variants (the rest default).
fn paged_fields(dtype: DType, kv: KvFormat, page_size: usize, num_splits: Option<usize>, v: &CaseVariants) -> Row {
    Row {
        dtype: dtype.name().into(),
        page_size: Some(page_size),
        kv_dtype: Some(kv.kv_dtype(dtype).name().into()),
        num_splits,
        ..variant_fields(v)
    }
}

pub fn decode_row(kind: &str, backend: &Backend, c: &DecodeCase, seed: u64) -> Row {
    Row {
        kind: kind.into(),
        label: c.label(),
        seed,
        op: "decode".into(),
        backend: backend.name().into(),
        head_dim: c.head_dim,
        head_dim_v: Some(c.dv()),
        batch: c.batch(),
        heads_q: c.heads_q,
        heads_kv: c.heads_kv,
        seqlen_q: 1,
        seqlen_k: c.max_seq_len(),
        causal: false,
        ..paged_fields(c.dtype, c.kv, c.page_size, c.num_splits, &c.variants)
    }
}

fn with_prefill_outcome(mut row: Row, o: &pc::CaseOutcome) -> Row {
    row.max_abs_err = Some(o.out.max_abs_err);
    row.rel_l2_err = Some(o.out.rel_l2_err);
    row.tolerance = Some(o.out.tolerance);
    row.lse_max_abs_err = o.lse.as_ref().map(|l| l.max_abs_err);
    row.passed = Some(o.passed());
    row.check = Some(if o.sampled() { "sampled" } else { "full" }.into());
    if !o.passed() {
        row.error = Some(format!("{} (seed {})", o.summary(), o.seed));
    }
    row
}

fn with_decode_outcome(row: Row, o: &dc::CaseOutcome) -> Row {
    with_full_check(row, &o.out, &o.lse, o.plan.num_splits(), o.quant, o.passed(), || o.summary())
}

fn with_paged_prefill_outcome(row: Row, o: &ppc::PagedPrefillOutcome) -> Row {
    with_full_check(row, &o.out, &o.lse, o.plan.num_splits(), o.quant, o.passed(), || o.summary())
}

/// A paged op's row with its full check: O and LSE against the reference, the split count it ran with, the
/// quantisation error of an FP8 cache against the 16-bit one (in the label), and the verdict (its summary as
/// the error when it failed).
fn with_full_check(
    mut row: Row,
    out: &Comparison,
    lse: &Comparison,
    num_splits: usize,
    quant: Option<QuantError>,
    passed: bool,
    summary: impl FnOnce() -> String,
) -> Row {
    if let Some(q) = quant {
        row.label =
            format!("{} (vs the 16-bit cache: max|err|={:.2e} rel-L2={:.2e})", row.label, q.max_abs_err, q.rel_l2_err);
    }
    row.max_abs_err = Some(out.max_abs_err);
    row.rel_l2_err = Some(out.rel_l2_err);
    row.tolerance = Some(out.tolerance);
    row.lse_max_abs_err = Some(lse.max_abs_err);
    row.num_splits = Some(num_splits);
    row.passed = Some(passed);
    row.check = Some("full".into());
    if !passed {
        row.error = Some(summary());
    }
    row
}

/// A row for a case that could not run: the error, passed = false.
pub fn failed(mut row: Row, e: &Error) -> Row {
    row.passed = Some(false);
    row.error = Some(e.to_string());
    row
}

/// Checks one sweep case (full fp64 reference) on `backend`.
pub fn check(backend: &Backend, case: &Case, seed: u64) -> Row {
    match case {
        Case::Prefill(c) => {
            let row = prefill_row("sweep", backend, c, seed);
            let r = match backend {
                Backend::Emu(emu) => pc::check_case_emulated(emu, c, seed),
                Backend::Gpu { stream, .. } => pc::check_case_gpu(stream, c, seed),
            };
            let row = r.map_or_else(|e| failed(row.clone(), &e), |o| with_prefill_outcome(row.clone(), &o));
            with_counters(row, backend, |k| cost_model::prefill_ratios(c, k))
        }
        // The `run` paths with no dump, no timing and no progress messages (the sweep runs in parallel).
        Case::Decode(c) => {
            let row = run_decode(backend, c, seed, None, None, &Progress::hidden());
            as_sweep(row, || decode_row("sweep", backend, c, seed))
        }
        Case::PagedPrefill(c) => {
            let row = run_paged_prefill(backend, c, seed, None, None, &Progress::hidden());
            as_sweep(row, || paged_prefill_row("sweep", backend, c, seed))
        }
        Case::Mla(c) => {
            let row = run_mla(backend, c, seed, None, None, &Progress::hidden());
            as_sweep(row, || mla_row("sweep", backend, c, seed))
        }
    }
}

pub fn mla_row(kind: &str, backend: &Backend, c: &MlaCase, seed: u64) -> Row {
    Row {
        kind: kind.into(),
        label: c.label(),
        seed,
        op: "mla-decode".into(),
        backend: backend.name().into(),
        dtype: c.dtype.name().into(),
        head_dim: c.dims.row_dim(),
        head_dim_v: Some(c.dims.kv_lora_rank),
        batch: c.batch(),
        heads_q: c.heads_q,
        heads_kv: 1,
        seqlen_q: c.q_len,
        seqlen_k: c.max_seq_len(),
        causal: c.q_len > 1,
        page_size: Some(c.page_size),
        kv_dtype: Some(c.kv_name().into()),
        num_splits: c.num_splits,
        window_left: -1,
        window_right: -1,
        ..Default::default()
    }
}

/// An MLA row with its check: O and LSE against the reference over the stored cache (sampled: the first
/// sequences), the FP8 quantisation error in the label.
fn with_mla_outcome(mut row: Row, o: &mc::MlaOutcome) -> Row {
    row = with_full_check(row, &o.out, &o.lse, o.plan.num_splits(), o.quant, o.passed(), || o.summary());
    if o.sampled() {
        row.check = Some("sampled".into());
        row.label = format!("{} (checked: the first {} of {} sequences)", row.label, o.checked_seqs, o.seqs);
    }
    row
}

/// `run --op mla-decode`: builds, runs and checks one MLA case (the fp64 check on the first sequences up to
/// [`mc::CHECK_LIMIT`]); on a GPU also times it (GB/s of [`MlaCase::bytes`], TFLOPS of [`MlaCase::flops`]).
pub fn run_mla(
    backend: &Backend,
    c: &MlaCase,
    seed: u64,
    copy_gbps: Option<f64>,
    dump: Option<&Dump>,
    progress: &Progress,
) -> Result<Row> {
    check_page_size(c.page_size)?;
    c.check()?;
    let row = match c.dtype {
        DType::F16 => run_mla_t::<f16>(backend, c, seed, dump, progress)?,
        DType::Bf16 => run_mla_t::<bf16>(backend, c, seed, dump, progress)?,
    };
    Ok(timed_on_gpu(row, backend, copy_gbps, |s, copy, row| {
        progress.message(format!("mla-decode: timing on the GPU (CUDA events, median of {})", DECODE_RUNS.iters));
        with_mla_timing(row, mc::time_case_gpu(s, c, seed, DECODE_RUNS), copy)
    }))
}

fn run_mla_t<T: Element>(
    backend: &Backend,
    c: &MlaCase,
    seed: u64,
    dump: Option<&Dump>,
    progress: &Progress,
) -> Result<Row> {
    progress.message(format!("mla-decode: running on {} and checking against the fp64 reference", backend.describe()));
    let r = match backend {
        Backend::Emu(emu) => mc::run_case_emulated::<T>(emu, c, seed)?,
        Backend::Gpu { stream, .. } => mc::run_case_gpu::<T>(stream, c, seed)?,
    };
    if let Some(dump) = dump {
        progress.message("mla-decode: writing the .npy dump");
        dump.mla(&r)?;
    }
    let row = with_mla_outcome(mla_row("run", backend, c, seed), &r.outcome);
    Ok(with_counters(row, backend, |_| None))
}

/// Times one MLA case on the GPU: GB/s of the bytes it must move (each sequence's cache rows once), TFLOPS
/// of its visible pairs; the first launch's outputs checked (the first sequences).
pub fn time_mla(cu: &Arc<CudaStream>, backend: &Backend, c: &MlaCase, seed: u64, copy_gbps: f64) -> Row {
    let row = mla_row("perf", backend, c, seed);
    with_mla_timing(row, mc::time_case_gpu(cu, c, seed, DECODE_RUNS), copy_gbps)
}

fn with_mla_timing(row: Row, t: Result<mc::MlaTiming>, copy_gbps: f64) -> Row {
    match t {
        Ok(t) => {
            let mut row = with_mla_outcome(row, &t.outcome);
            row.ms = Some(t.timing.median_ms);
            row.gbps = Some(t.gbps);
            row.tflops = Some(t.tflops);
            row.copy_gbps = Some(copy_gbps);
            row.pct_of_copy_bw = Some(100.0 * t.gbps / copy_gbps);
            row.num_splits = Some(t.plan.num_splits());
            row
        }
        Err(e) => failed(row, &e),
    }
}

/// A `run` row as a sweep row, or the case's row failed with the error.
fn as_sweep(row: Result<Row>, case_row: impl FnOnce() -> Row) -> Row {
    match row {
        Ok(row) => Row { kind: "sweep".into(), ..row },
        Err(e) => failed(case_row(), &e),
    }
}

/// The launches each op's GPU timing makes, in `run` and in `report` alike.
const PREFILL_RUNS: Runs = Runs { warmup: 3, iters: 20 };
const DECODE_RUNS: Runs = Runs { warmup: 5, iters: 30 };
const PAGED_PREFILL_RUNS: Runs = Runs { warmup: 3, iters: 20 };

/// Times one prefill case on the GPU (its output checked on sampled rows).
pub fn time_prefill(cu: &Arc<CudaStream>, backend: &Backend, c: &PrefillCase, seed: u64, copy_gbps: f64) -> Row {
    let row = prefill_row("perf", backend, c, seed);
    match pc::time_case_gpu(cu, c, seed, PREFILL_RUNS) {
        Ok(t) => {
            let mut row = with_prefill_outcome(row, &t.outcome);
            row.ms = Some(t.timing.median_ms);
            row.tflops = Some(t.tflops);
            row.copy_gbps = Some(copy_gbps);
            row
        }
        Err(e) => failed(row, &e),
    }
}

/// Times one decode case on the GPU (timing only: correctness comes from the sweep rows): GB/s of the bytes
/// it actually moves (over an FP8 cache K/V at one byte per element and the scales; Q, O, LSE, the split
/// workspace).
pub fn time_decode(cu: &Arc<CudaStream>, backend: &Backend, c: &DecodeCase, seed: u64, copy_gbps: f64) -> Row {
    let mut row = decode_row("perf", backend, c, seed);
    let t = dc::time_case_gpu(cu, c, seed, DECODE_RUNS);
    if let Ok(t) = &t {
        row.num_splits = Some(t.plan.num_splits());
    }
    with_decode_timing(row, t, copy_gbps)
}

/// Times one paged prefill case on the GPU (timing only: correctness comes from the test suites' sweeps):
/// TFLOPS of the visible (query, key) pairs ([`ppc::case_flops`]).
pub fn time_paged_prefill(
    cu: &Arc<CudaStream>,
    backend: &Backend,
    c: &PagedPrefillCase,
    seed: u64,
    copy_gbps: f64,
) -> Row {
    let mut row = paged_prefill_row("perf", backend, c, seed);
    let t = ppc::time_case_gpu(cu, c, seed, PAGED_PREFILL_RUNS);
    if let Ok(t) = &t {
        row.num_splits = Some(t.plan.num_splits());
    }
    with_paged_prefill_timing(row, t, copy_gbps)
}

/// `row` passed to `time` (GPU stream, copy bandwidth, row) when it ran on a GPU and a copy bandwidth was
/// measured; as it is otherwise.
fn timed_on_gpu(
    row: Row,
    backend: &Backend,
    copy_gbps: Option<f64>,
    time: impl FnOnce(&Arc<CudaStream>, f64, Row) -> Row,
) -> Row {
    match (backend, copy_gbps) {
        (Backend::Gpu { stream, .. }, Some(copy)) => time(stream, copy, row),
        _ => row,
    }
}

/// A decode row with its GPU timing, or failed with the timing's error.
fn with_decode_timing(mut row: Row, t: Result<dc::DecodeTiming>, copy_gbps: f64) -> Row {
    match t {
        Ok(t) => {
            row.ms = Some(t.timing.median_ms);
            row.gbps = Some(t.gbps);
            row.copy_gbps = Some(copy_gbps);
            row.pct_of_copy_bw = Some(100.0 * t.gbps / copy_gbps);
            row
        }
        Err(e) => failed(row, &e),
    }
}

/// A paged prefill row with its GPU timing, or failed with the timing's error.
fn with_paged_prefill_timing(mut row: Row, t: Result<ppc::PagedPrefillTiming>, copy_gbps: f64) -> Row {
    match t {
        Ok(t) => {
            (row.ms, row.tflops, row.copy_gbps) = (Some(t.timing.median_ms), Some(t.tflops), Some(copy_gbps));
            row
        }
        Err(e) => failed(row, &e),
    }
}

/// A page size the paged cache takes (any in 1..=MAX_PAGE_SIZE), checked before a case's host data is built.
fn check_page_size(page_size: usize) -> Result<()> {
    if page_size == 0 || page_size > MAX_PAGE_SIZE {
        return Err(Error::unsupported("page_size", format!("{page_size} (must be in 1..={MAX_PAGE_SIZE})")));
    }
    Ok(())
}

/// The checks `run --op decode` makes before building a case's host data.
fn check_decode_size(c: &DecodeCase) -> Result<()> {
    check_page_size(c.page_size)?;
    let tokens = c.seq_lens.iter().sum::<usize>();
    checked_elements(&[&[tokens, c.heads_kv, c.head_dim], &[tokens, c.heads_kv, c.dv()]])?;
    Ok(())
}

/// The checks `run --op paged-prefill` makes before building a case's host data.
fn check_paged_prefill_size(c: &PagedPrefillCase) -> Result<()> {
    check_page_size(c.page_size)?;
    let tokens = c.seqs.iter().map(|s| s.1).sum::<usize>();
    checked_elements(&[
        &[tokens, c.heads_kv, c.head_dim],
        &[tokens, c.heads_kv, c.dv()],
        &[c.total_q(), c.heads_q, c.head_dim],
        &[c.total_q(), c.heads_q, c.dv()],
    ])?;
    Ok(())
}

fn checked_elements(dims: &[&[usize]]) -> Result<usize> {
    let mut total = 0usize;
    for d in dims {
        let n = d.iter().try_fold(1usize, |a, &x| a.checked_mul(x)).and_then(|n| total.checked_add(n));
        total = n.ok_or_else(|| Error::overflow("shape", format!("{d:?} overflows")))?;
    }
    if total > MAX_ELEMENTS {
        return Err(Error::unsupported(
            "shape",
            format!("{total} elements of host data is more than the runner builds ({MAX_ELEMENTS})"),
        ));
    }
    Ok(total)
}

/// `run --op prefill`: builds, runs and checks one case (sampled check above [`FULL_CHECK_LIMIT`]); on a
/// GPU also times it. Writes the tensors to `dump` if given; names each stage on `progress`.
pub fn run_prefill(
    backend: &Backend,
    c: &PrefillCase,
    seed: u64,
    copy_gbps: Option<f64>,
    dump: Option<&Dump>,
    progress: &Progress,
) -> Result<Row> {
    let (b, tq, tk, hq, hkv, d) = (c.batch, c.seqlen_q, c.seqlen_k, c.heads_q, c.heads_kv, c.head_dim);
    checked_elements(&[&[b, tq, hq, d], &[b, tk, hkv, d], &[b, tk, hkv, d], &[b, tq, hq, d]])?;
    let mut row = match c.dtype {
        DType::F16 => run_prefill_t::<f16>(backend, c, seed, dump, progress)?,
        DType::Bf16 => run_prefill_t::<bf16>(backend, c, seed, dump, progress)?,
    };
    if let (Backend::Gpu { stream, .. }, Some(copy)) = (backend, copy_gbps) {
        progress.message(format!("prefill: timing on the GPU (CUDA events, median of {})", PREFILL_RUNS.iters));
        let t = time_prefill(stream, backend, c, seed, copy);
        (row.ms, row.tflops, row.copy_gbps) = (t.ms, t.tflops, t.copy_gbps);
        if t.passed == Some(false) {
            row.passed = Some(false);
            row.error = t.error;
        }
    }
    Ok(row)
}

fn run_prefill_t<T: Element>(
    backend: &Backend,
    c: &PrefillCase,
    seed: u64,
    dump: Option<&Dump>,
    progress: &Progress,
) -> Result<Row> {
    progress.message("prefill: building the inputs");
    let f = PrefillFixture::<T>::new(c, seed)?;
    progress.message(format!("prefill: running the kernel on {}", backend.describe()));
    let out: PrefillOutputs<T> = match backend {
        Backend::Emu(emu) => pc::run_emulated(emu, &f)?,
        Backend::Gpu { stream, .. } => pc::run_gpu(stream, &f)?,
    };
    if let Some(dump) = dump {
        progress.message("prefill: writing the .npy dump");
        dump.prefill(&f, &out)?;
    }
    let work =
        [c.batch, c.heads_q, c.seqlen_q, c.seqlen_k, c.head_dim].iter().try_fold(1usize, |a, &x| a.checked_mul(x));
    let outcome = match work {
        Some(w) if w <= FULL_CHECK_LIMIT => {
            progress.message("prefill: checking every row against the fp64 reference");
            f.evaluate(&out)?
        }
        _ => {
            progress.message(format!("prefill: checking {SAMPLE_ROWS} sampled rows against the fp64 reference"));
            f.evaluate_sampled(&out, SAMPLE_ROWS)?
        }
    };
    let row = with_prefill_outcome(prefill_row("run", backend, c, seed), &outcome);
    Ok(with_counters(row, backend, |k| cost_model::prefill_ratios(c, k)))
}

/// `run --op decode`: one batch of `batch` sequences of the same context length over a paged cache (16-bit
/// or FP8: then the row's error columns are against the stored cache, and the label carries the
/// quantisation error against the 16-bit cache).
pub fn run_decode(
    backend: &Backend,
    c: &DecodeCase,
    seed: u64,
    copy_gbps: Option<f64>,
    dump: Option<&Dump>,
    progress: &Progress,
) -> Result<Row> {
    check_decode_size(c)?;
    let row = match c.dtype {
        DType::F16 => run_decode_t::<f16>(backend, c, seed, dump, progress)?,
        DType::Bf16 => run_decode_t::<bf16>(backend, c, seed, dump, progress)?,
    };
    Ok(timed_on_gpu(row, backend, copy_gbps, |s, copy, row| {
        progress.message(format!("decode: timing on the GPU (CUDA events, median of {})", DECODE_RUNS.iters));
        with_decode_timing(row, dc::time_case_gpu(s, c, seed, DECODE_RUNS), copy)
    }))
}

fn run_decode_t<T: Element>(
    backend: &Backend,
    c: &DecodeCase,
    seed: u64,
    dump: Option<&Dump>,
    progress: &Progress,
) -> Result<Row> {
    progress.message(format!("decode: running on {} and checking against the fp64 reference", backend.describe()));
    let r = match backend {
        Backend::Emu(emu) => dc::run_case_emulated::<T>(emu, c, seed)?,
        Backend::Gpu { stream, .. } => dc::run_case_gpu::<T>(stream, c, seed)?,
    };
    if let Some(dump) = dump {
        progress.message("decode: writing the .npy dump");
        dump.decode(&r)?;
    }
    let row = with_decode_outcome(decode_row("run", backend, c, seed), &r.outcome);
    let plan = r.outcome.plan;
    // The cost model is the uniform plan's: a scheduled launch (its own cuts) reports counters, not ratios.
    let scheduled = c.schedule.is_some();
    Ok(with_counters(row, backend, |k| if scheduled { None } else { cost_model::decode_ratios(c, &plan, k) }))
}

pub fn paged_prefill_row(kind: &str, backend: &Backend, c: &PagedPrefillCase, seed: u64) -> Row {
    Row {
        kind: kind.into(),
        label: c.label(),
        seed,
        op: "paged-prefill".into(),
        backend: backend.name().into(),
        head_dim: c.head_dim,
        head_dim_v: Some(c.dv()),
        batch: c.batch(),
        heads_q: c.heads_q,
        heads_kv: c.heads_kv,
        seqlen_q: c.max_seqlen_q(),
        seqlen_k: c.max_seq_len(),
        causal: c.causal,
        ..paged_fields(c.dtype, c.kv, c.page_size, c.num_splits, &c.variants)
    }
}

/// `run --op paged-prefill`: `batch` sequences of `seqlen_q` new tokens over contexts of `seqlen_k` tokens
/// (the new ones included) in a paged cache (16-bit or FP8, as for decode); full fp64 check; on a GPU also
/// timed.
pub fn run_paged_prefill(
    backend: &Backend,
    c: &PagedPrefillCase,
    seed: u64,
    copy_gbps: Option<f64>,
    dump: Option<&Dump>,
    progress: &Progress,
) -> Result<Row> {
    check_paged_prefill_size(c)?;
    progress
        .message(format!("paged-prefill: running on {} and checking against the fp64 reference", backend.describe()));
    let row = match c.dtype {
        DType::F16 => run_paged_prefill_t::<f16>(backend, c, seed, dump, progress)?,
        DType::Bf16 => run_paged_prefill_t::<bf16>(backend, c, seed, dump, progress)?,
    };
    Ok(timed_on_gpu(row, backend, copy_gbps, |s, copy, row| {
        progress
            .message(format!("paged-prefill: timing on the GPU (CUDA events, median of {})", PAGED_PREFILL_RUNS.iters));
        with_paged_prefill_timing(row, ppc::time_case_gpu(s, c, seed, PAGED_PREFILL_RUNS), copy)
    }))
}

fn run_paged_prefill_t<T: Element>(
    backend: &Backend,
    c: &PagedPrefillCase,
    seed: u64,
    dump: Option<&Dump>,
    progress: &Progress,
) -> Result<Row> {
    let r = match backend {
        Backend::Emu(emu) => ppc::run_case_emulated::<T>(emu, c, seed)?,
        Backend::Gpu { stream, .. } => ppc::run_case_gpu::<T>(stream, c, seed)?,
    };
    if let Some(dump) = dump {
        progress.message("paged-prefill: writing the .npy dump");
        dump.paged_prefill(&r)?;
    }
    let row = with_paged_prefill_outcome(paged_prefill_row("run", backend, c, seed), &r.outcome);
    // The short-chunk byte model (at most 16 packed rows per KV head, no window); others report counters only.
    let model = cost_model::paged_prefill_short_chunk_bytes(c);
    Ok(with_counters(row, backend, |k| model.and_then(|m| m.ratios(k))))
}

/// On the emulator: the cost counters of the op this thread just ran (totals over its kernels, then
/// `model_ratios`: measured / the kernel's cost model per quantity, 1.0 = as designed).
fn with_counters(
    mut row: Row,
    backend: &Backend,
    ratios: impl FnOnce(&LaunchCounters) -> Option<Vec<(&'static str, f64)>>,
) -> Row {
    let Backend::Emu(emu) = backend else { return row };
    let Some(c) = emu.last_launch_counters() else { return row };
    let mut map = serde_json::Map::new();
    for (name, v) in c.values() {
        map.insert(name.to_string(), v.into());
    }
    // Balance per kernel (the totals' maxima mix kernels): CTAs, those with work, per-CTA reads and mma.
    let per_kernel: Vec<serde_json::Value> = c
        .kernels
        .iter()
        .map(|k| {
            serde_json::json!({
                "kernel": k.kernel,
                "blocks": k.blocks,
                "active_blocks": k.active_blocks,
                "max_block_bytes_read": k.max_block_bytes_read,
                "mean_block_bytes_read": k.mean_block_bytes_read(),
                "max_block_mma": k.max_block_mma,
                "mean_block_mma": k.mean_block_mma(),
            })
        })
        .collect();
    map.insert("per_kernel".into(), per_kernel.into());
    // Bytes read and written per argument ("q", "k", "rope_cos", "k_cache", ...), over the op's kernels.
    let buffers: serde_json::Map<String, serde_json::Value> = c
        .total()
        .buffers
        .iter()
        .map(|b| (b.name.clone(), serde_json::json!({ "read": b.read, "written": b.written })))
        .collect();
    map.insert("buffers".into(), buffers.into());
    if let Some(r) = ratios(&c) {
        let r: serde_json::Map<String, serde_json::Value> =
            r.into_iter().map(|(k, v)| (k.to_string(), serde_json::json!(v))).collect();
        map.insert("model_ratios".into(), r.into());
    }
    row.counters = Some(map);
    row
}

/// Launches an append is timed over on a GPU (each writes the same slots).
const APPEND_RUNS: Runs = Runs { warmup: 5, iters: 50 };

/// `run --op append`: the new tokens' K/V (the last q_len tokens of each sequence) scattered into a paged
/// cache (16-bit or FP8, pages in shuffled order, NaN elsewhere), K rotated on the way with RoPE; checked
/// bit for bit against the Rust model of the kernel (every cache element, the untouched ones included);
/// on a GPU also timed (bytes moved: K/V read, cache rows written).
pub fn run_append(
    backend: &Backend,
    c: &AppendCase,
    seed: u64,
    copy_gbps: Option<f64>,
    dump: Option<&Dump>,
    progress: &Progress,
) -> Result<Row> {
    check_page_size(c.page_size)?;
    let elements = c.seqs.iter().map(|s| s.1.div_ceil(c.page_size.max(1)) + 1).sum::<usize>()
        * c.page_size
        * c.heads_kv
        * (c.head_dim + c.dv());
    if elements > MAX_ELEMENTS {
        return Err(Error::unsupported(
            "case",
            format!("{elements} cache elements (the runner builds at most {MAX_ELEMENTS})"),
        ));
    }
    progress.message(format!("append: running on {} and checking the cache bit for bit", backend.describe()));
    match c.dtype {
        DType::F16 => run_append_t::<f16>(backend, c, seed, copy_gbps, dump),
        DType::Bf16 => run_append_t::<bf16>(backend, c, seed, copy_gbps, dump),
    }
}

/// Times one append on the GPU for `report` (its whole cache checked bit for bit against the model, as
/// `run --op append` does).
pub fn time_append(backend: &Backend, c: &AppendCase, seed: u64, copy_gbps: f64) -> Row {
    let row = match c.dtype {
        DType::F16 => run_append_t::<f16>(backend, c, seed, Some(copy_gbps), None),
        DType::Bf16 => run_append_t::<bf16>(backend, c, seed, Some(copy_gbps), None),
    };
    match row {
        Ok(row) => Row { kind: "perf".into(), ..row },
        Err(e) => failed(
            Row {
                kind: "perf".into(),
                label: c.label(),
                seed,
                op: "append".into(),
                backend: backend.name().into(),
                head_dim: c.head_dim,
                head_dim_v: Some(c.dv()),
                heads_kv: c.heads_kv,
                ..Row::default()
            },
            &e,
        ),
    }
}

fn run_append_t<T: Element + ac::Poison>(
    backend: &Backend,
    c: &AppendCase,
    seed: u64,
    copy_gbps: Option<f64>,
    dump: Option<&Dump>,
) -> Result<Row> {
    let f = ac::AppendFixture::<T>::new(c, seed)?;
    let (out, timing) = match backend {
        Backend::Emu(emu) => (ac::run_emulated(emu, &f)?, None),
        Backend::Gpu { stream, .. } => ac::run_gpu(stream, &f, copy_gbps.map(|_| APPEND_RUNS))?,
    };
    if let Some(dump) = dump {
        dump.append(&f, &out)?;
    }
    let o = f.evaluate(&out);
    let mut row = Row {
        kind: "run".into(),
        label: c.label(),
        seed,
        op: "append".into(),
        backend: backend.name().into(),
        head_dim: c.head_dim,
        head_dim_v: Some(c.dv()),
        batch: c.seqs.len(),
        heads_q: 0,
        heads_kv: c.heads_kv,
        seqlen_q: c.seqs.iter().map(|s| s.0).max().unwrap_or(0),
        seqlen_k: c.seqs.iter().map(|s| s.1).max().unwrap_or(0),
        causal: false,
        ..paged_fields(c.dtype, c.kv, c.page_size, None, &CaseVariants::default())
    };
    row.max_abs_err = Some(o.max_abs_err);
    row.tolerance = Some(0.0);
    row.passed = Some(o.passed());
    row.check = Some("exact".into());
    if !o.passed() {
        row.error = Some(format!(
            "{} of {} cache elements differ from the model (max |diff| {:.3e}; seed {seed})",
            o.mismatches, o.elements, o.max_abs_err
        ));
    }
    if let (Some(t), Some(copy)) = (timing, copy_gbps) {
        // Bytes moved: K (Dqk) and V (Dv) rows read once, the cache rows written once (16-bit or FP8).
        let gbps = cost_model::append_cost(c).total() as f64 / (t.median_ms * 1e-3) / 1e9;
        (row.ms, row.gbps, row.copy_gbps, row.pct_of_copy_bw) =
            (Some(t.median_ms), Some(gbps), Some(copy), Some(100.0 * gbps / copy));
    }
    Ok(with_counters(row, backend, |k| Some(cost_model::append_cost(c).ratios(k))))
}
