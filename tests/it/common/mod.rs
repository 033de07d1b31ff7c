//! Shared test support: GPU discovery that skips visibly.
#![allow(dead_code)]

pub mod hopper_model;

use std::io::Write;
use std::sync::Arc;

use cudarc::driver::CudaContext;
use cudarc::driver::{CudaSlice, CudaStream};
use fused_attn::merge::{merge_states_with_sinks, MergeElement};
use fused_attn::prefill::{prefill, PrefillOptions};
use fused_attn::{
    append, decode, DecodeOptions, DecodePlan, DecodeWorkspace, Element, KvCacheOf, KvScales, PagedKvCache,
    PagedKvCacheMut, Stream, TensorView, TensorViewMut,
};

/// The first GPU, or `None` after recording `test` as skipped: the name goes to stderr and to the file named
/// by FA_SKIP_LOG (scripts/test counts and lists them). With FA_REQUIRE_GPU=1 (the GPU bundle) a missing GPU
/// fails the test instead.
pub fn gpu_or_skip(test: &str) -> Option<Arc<CudaContext>> {
    match fused_attn::device::cuda_context(0) {
        Ok(ctx) => Some(ctx),
        Err(e) => {
            if std::env::var("FA_REQUIRE_GPU").is_ok_and(|v| v == "1") {
                panic!("{test}: a GPU is required (FA_REQUIRE_GPU=1) but none is usable: {e}");
            }
            eprintln!("skipped: no GPU: {test} ({e})");
            if let Ok(path) = std::env::var("FA_SKIP_LOG") {
                if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
                    let _ = writeln!(f, "{test}");
                }
            }
            None
        }
    }
}

/// The first GPU's default stream, or `None` after recording `test` as skipped ([`gpu_or_skip`]).
pub fn gpu_stream_or_skip(test: &str) -> Option<Arc<CudaStream>> {
    gpu_or_skip(test).map(|ctx| ctx.default_stream())
}

/// The run's base seed: FA_SEED (decimal or 0x hex) if set, else the fixed default, so two runs of the suite
/// use the same inputs (see `fused_attn::testkit::seed`).
pub fn base_seed() -> u64 {
    fused_attn::testkit::seed::base_seed()
}

/// The seed of case `index` of a sweep (derived from the base seed).
pub fn case_seed(index: usize) -> u64 {
    fused_attn::testkit::seed::case_seed(base_seed(), index as u64)
}

/// FA_CASE (a comma-separated list of case indices) restricts a sweep to those cases, to rerun one failure;
/// unset, every case runs.
pub fn case_selected(index: usize) -> bool {
    match std::env::var("FA_CASE") {
        Ok(list) => list.split(',').any(|x| x.trim().parse() == Ok(index)),
        Err(_) => true,
    }
}

/// The one-line command that reruns test `test` of `tests/<file>.rs` with this run's base seed (and only
/// case `case` of its sweep, when given).
pub fn rerun(file: &str, test: &str, case: Option<usize>) -> String {
    let case = case.map(|i| format!("FA_CASE={i} ")).unwrap_or_default();
    format!("rerun: FA_SEED={:#x} {case}cargo test --release --test it -- {file}::{test} --exact", base_seed())
}

/// [`sweep`] in order, on this thread, over `(sweep index, case)` pairs: `check(sweep index, case)` gives
/// (passed, summary), and the failures name the cases by their position in `cases`.
pub fn sweep_in_order<C: Sync>(
    file: &str,
    test: &str,
    cases: &[(usize, C)],
    label: impl Fn(&C) -> String + Sync,
    check: impl Fn(usize, &C) -> (bool, String) + Sync,
) {
    sweep(
        file,
        test,
        cases,
        1,
        |(_, c)| label(c),
        |_, (i, c)| {
            let (passed, summary) = check(*i, c);
            verdict(passed, summary)
        },
    );
}

/// Runs the selected cases of a sweep (FA_CASE: positions in `cases`) with `check` (position, case) →
/// Ok(summary) or Err(summary), on `workers` threads (1: in order, on this thread), printing every verdict;
/// then fails listing every failure with the command that reruns it (test `test` of tests/<file>.rs).
pub fn sweep<C: Sync>(
    file: &str,
    test: &str,
    cases: &[C],
    workers: usize,
    label: impl Fn(&C) -> String + Sync,
    check: impl Fn(usize, &C) -> Result<String, String> + Sync,
) {
    let failures = std::sync::Mutex::new(Vec::new());
    let run = |i: usize, case: &C| match check(i, case) {
        Ok(msg) => eprintln!("ok   [{i}] {}: {msg}", label(case)),
        Err(msg) => {
            let msg = format!("[{i}] {}: {msg}\n    {}", label(case), rerun(file, test, Some(i)));
            eprintln!("FAIL {msg}");
            failures.lock().unwrap().push(msg);
        }
    };
    let start = std::time::Instant::now();
    if workers <= 1 {
        cases.iter().enumerate().filter(|&(i, _)| case_selected(i)).for_each(|(i, c)| run(i, c));
    } else {
        let next = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(case) = cases.get(i) else { break };
                    if case_selected(i) {
                        run(i, case);
                    }
                });
            }
        });
    }
    let failures = failures.into_inner().unwrap();
    eprintln!("{test}: {} cases in {:.1} s, {} failed", cases.len(), start.elapsed().as_secs_f64(), failures.len());
    assert!(failures.is_empty(), "{test}: {} of {} failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

/// A sweep verdict from a pass flag and the case's summary.
pub fn verdict(passed: bool, summary: String) -> Result<String, String> {
    if passed {
        Ok(summary)
    } else {
        Err(summary)
    }
}

/// Every available core, for sweeps of independent cases.
pub fn all_cores() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// Worst err/bound over one output, where (index) and its |err|; NaN and a one-sided infinity count as ∞.
pub fn worst(ours: &[f64], want: &[f64], bound: &[f64]) -> (f64, usize, f64) {
    let mut w = (0.0, 0, 0.0);
    for (i, ((&x, &y), &b)) in ours.iter().zip(want).zip(bound).enumerate() {
        let r = if x == y {
            0.0
        } else if x.is_finite() && y.is_finite() {
            (x - y).abs() / b
        } else {
            f64::INFINITY
        };
        if r > w.0 || r.is_nan() {
            w = (r, i, (x - y).abs());
        }
    }
    w
}

/// `merge_states_with_sinks` over host buffers on `stream`: states `os [k, n, h, d]` with LSEs `ls [k, n, h]`,
/// `sinks [h]` if given, into `o [n, h, d]` and `lse [n, h]`.
pub fn merge_host<S: MergeElement, O: MergeElement>(
    stream: &Stream<'_>,
    [k, n, h, d]: [usize; 4],
    (os, ls): (&[S], &[f32]),
    sinks: Option<&[f32]>,
    (o, lse): (&mut [O], &mut [f32]),
) -> fused_attn::Result<()> {
    merge_states_with_sinks(
        stream,
        &TensorView::host(os, [k, n, h, d])?,
        &TensorView::host(ls, [k, n, h])?,
        sinks.map(|s| TensorView::host(s, [h])).transpose()?.as_ref(),
        &mut TensorViewMut::host(o, [n, h, d])?,
        Some(&mut TensorViewMut::host(lse, [n, h])?),
    )
}

/// `prefill` over contiguous host buffers on `stream`: q and o `[b, tq, hq, d]`, k and v `[b, tk, hkv, d]`,
/// lse `[b, hq, tq]` if given.
pub fn prefill_host<T: Element>(
    stream: &Stream<'_>,
    [b, tq, tk, hq, hkv, d]: [usize; 6],
    (q, k, v): (&[T], &[T], &[T]),
    (o, lse): (&mut [T], Option<&mut [f32]>),
    opts: &PrefillOptions<'_>,
) -> fused_attn::Result<()> {
    let mut lse = lse.map(|l| TensorViewMut::host(l, [b, hq, tq])).transpose()?;
    prefill(
        stream,
        &TensorView::host(q, [b, tq, hq, d])?,
        &TensorView::host(k, [b, tk, hkv, d])?,
        &TensorView::host(v, [b, tk, hkv, d])?,
        &mut TensorViewMut::host(o, [b, tq, hq, d])?,
        lse.as_mut(),
        opts,
    )
}

/// `decode` of host queries `q [b, hq, d]` over `cache` on `stream`, into `o [b, hq, d]` and `lse [b, hq]` if
/// given.
pub fn decode_host<T: Element, C: KvCacheOf<T>>(
    stream: &Stream<'_>,
    [b, hq, d]: [usize; 3],
    q: &[T],
    cache: &PagedKvCache<'_, C>,
    (o, lse): (&mut [T], Option<&mut [f32]>),
    ws: &mut DecodeWorkspace,
    opts: &DecodeOptions,
) -> fused_attn::Result<DecodePlan> {
    let mut lse = lse.map(|l| TensorViewMut::host(l, [b, hq])).transpose()?;
    decode(
        stream,
        &TensorView::host(q, [b, hq, d])?,
        cache,
        &mut TensorViewMut::host(o, [b, hq, d])?,
        lse.as_mut(),
        ws,
        opts,
    )
}

/// `append` of host tokens `k`, `v` (`[n, Hkv, D]`, n = `slots.len()`) at `slots` into the host cache
/// `(k_cache, v_cache)` of `shape` `[pages, page_size, Hkv, D]`, with `scales` for an FP8 cache.
pub fn append_host<T: Element, C: KvCacheOf<T>>(
    stream: &Stream<'_>,
    (k, v, slots): (&[T], &[T], &[i64]),
    (k_cache, v_cache): (&mut [C], &mut [C]),
    shape: [usize; 4],
    scales: Option<&KvScales>,
) -> fused_attn::Result<()> {
    let mut cache = PagedKvCacheMut::new(TensorViewMut::host(k_cache, shape)?, TensorViewMut::host(v_cache, shape)?)?;
    if let Some(s) = scales {
        cache = cache.with_scales(s)?;
    }
    let tokens = [slots.len(), shape[2], shape[3]];
    append(
        stream,
        &TensorView::host(k, tokens)?,
        &TensorView::host(v, tokens)?,
        &TensorView::host(slots, [slots.len()])?,
        &mut cache,
    )
}

/// [`append_host`] on the GPU `cu`: the tokens and slots uploaded, the cache in device memory.
pub fn append_gpu<T: Element, C: KvCacheOf<T>>(
    cu: &Arc<CudaStream>,
    (k, v, slots): (&[T], &[T], &[i64]),
    (k_cache, v_cache): (&mut CudaSlice<C>, &mut CudaSlice<C>),
    shape: [usize; 4],
    scales: Option<&KvScales>,
) -> fused_attn::Result<()> {
    let (k, v, slots) = (cu.clone_htod(k)?, cu.clone_htod(v)?, cu.clone_htod(slots)?);
    let mut cache = PagedKvCacheMut::new(
        TensorViewMut::gpu(k_cache.as_view_mut(), shape)?,
        TensorViewMut::gpu(v_cache.as_view_mut(), shape)?,
    )?;
    if let Some(s) = scales {
        cache = cache.with_scales(s)?;
    }
    let tokens = [slots.len(), shape[2], shape[3]];
    append(
        &Stream::Gpu(cu),
        &TensorView::gpu(k.as_view(), tokens)?,
        &TensorView::gpu(v.as_view(), tokens)?,
        &TensorView::gpu(slots.as_view(), [slots.len()])?,
        &mut cache,
    )
}
