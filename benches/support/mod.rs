//! What both GPU benches share: GPU discovery that skips cleanly, criterion settings sized for scarce GPU
//! time, CUDA-event timing for `iter_custom`, device-side random fill, and the per-bench summary table that
//! quotes every row against a ceiling measured in the same process.
#![allow(dead_code)]

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use criterion::Criterion;
use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DeviceRepr};
use fused_attn::testkit::seed::FixtureRng;
use fused_attn::Element;
use rand::Rng;

/// The GPU a bench runs on.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub l2_bytes: usize,
    pub name: String,
}

/// The first usable GPU, or `None` after printing "no GPU: <reason>; skipping" (the bench then exits 0, so
/// `cargo bench` on a machine without a GPU is a clean no-op rather than a panic).
pub fn gpu_or_skip(bench: &str) -> Option<Gpu> {
    let ctx = match fused_attn::device::cuda_context(0) {
        Ok(ctx) => ctx,
        Err(e) => {
            println!("no GPU: {e}; skipping {bench}");
            return None;
        }
    };
    // Everything runs on the context's default stream: no second stream exists, so cudarc never enters its
    // multi-stream mode and launches carry no per-argument event records (which would dominate the
    // microsecond decodes).
    let stream = ctx.default_stream();
    let l2_bytes = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE).unwrap_or(0).max(0) as usize;
    let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
    println!("{bench}: {name}, L2 {} MiB", l2_bytes >> 20);
    Some(Gpu { ctx, stream, l2_bytes, name })
}

/// Samples per bench (criterion's minimum).
pub const SAMPLE_SIZE: usize = 10;

/// Criterion sized for a 15-minute GPU allowance: 10 samples, 0.3 s warm-up (excluded from the samples by
/// criterion itself), 1 s of measurement per bench; command-line flags (`--sample-size`, ...) still win.
pub fn criterion() -> Criterion {
    Criterion::default()
        .sample_size(SAMPLE_SIZE)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .nresamples(10_000)
        .without_plots()
        .configure_from_args()
}

/// Device time, from a CUDA event pair, of `iters` back-to-back `launch(i)` calls (each must only enqueue
/// on `stream`). `i` runs on across calls (`counter`) so the caller can rotate input sets. This is the
/// `iter_custom` routine: criterion divides by `iters` and does the statistics. Also records (launches, ms)
/// in `log` for the summary table.
pub fn time_iters(
    stream: &Arc<CudaStream>,
    iters: u64,
    counter: &mut usize,
    log: &Rc<RefCell<Vec<(u64, f64)>>>,
    mut launch: impl FnMut(usize),
) -> Duration {
    let ctx = stream.context();
    let start = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).expect("event");
    let end = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).expect("event");
    start.record(stream).expect("event record");
    for _ in 0..iters {
        launch(*counter);
        *counter += 1;
    }
    end.record(stream).expect("event record");
    let ms = start.elapsed_ms(&end).expect("event elapsed") as f64;
    log.borrow_mut().push((iters, ms));
    Duration::from_secs_f64(ms * 1e-3)
}

/// The sample size criterion runs with: [`SAMPLE_SIZE`] unless `--sample-size N` overrides it on the command line.
pub fn sample_size() -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.windows(2).find(|w| w[0] == "--sample-size").and_then(|w| w[1].parse().ok()).unwrap_or(SAMPLE_SIZE)
}

/// Milliseconds per launch over the measurement samples only: criterion calls the routine for warm-up
/// first, then exactly `sample_size` times, so the last [`sample_size`] entries of the log are the samples.
pub fn ms_per_launch(log: &[(u64, f64)]) -> Option<f64> {
    let tail = &log[log.len().saturating_sub(sample_size())..];
    let iters: u64 = tail.iter().map(|t| t.0).sum();
    (iters > 0).then(|| tail.iter().map(|t| t.1).sum::<f64>() / iters as f64)
}

/// Fills `buf` with values uniform in [lo, hi): 1 Mi random elements made on the host, uploaded once, then
/// doubled on the device (copy [0, n) to [n, 2n), ...). Values only need to be realistic, not independent
/// (kernel timing does not depend on them), and multi-GiB caches fill in milliseconds this way.
pub fn fill_random<T: Element>(stream: &Arc<CudaStream>, buf: &mut CudaSlice<T>, seed: u64, lo: f64, hi: f64) {
    fill_with(stream, buf, seed, |rng| T::from_f64(rng.random_range(lo..hi)));
}

/// [`fill_random`] with the elements drawn by `draw` (e.g. FP8 codes).
pub fn fill_with<T: DeviceRepr>(
    stream: &Arc<CudaStream>,
    buf: &mut CudaSlice<T>,
    seed: u64,
    mut draw: impl FnMut(&mut FixtureRng) -> T,
) {
    let len = buf.len();
    let chunk = len.min(1 << 20);
    if chunk == 0 {
        return;
    }
    let mut rng = fused_attn::testkit::seed::rng(seed);
    let host: Vec<T> = (0..chunk).map(|_| draw(&mut rng)).collect();
    stream.memcpy_htod(&host, &mut buf.slice_mut(0..chunk)).expect("upload");
    let mut filled = chunk;
    while filled < len {
        let n = filled.min(len - filled);
        let (head, mut tail) = buf.split_at_mut(filled);
        stream.memcpy_dtod(&head.slice(0..n), &mut tail.slice_mut(0..n)).expect("device copy");
        filled += n;
    }
}

/// How many input sets to rotate through so that consecutive launches do not find their inputs in L2:
/// enough sets that 3x L2 lies between two uses of the same set, at most `cap`.
pub fn rotation_sets(bytes_per_set: usize, l2_bytes: usize, cap: usize) -> usize {
    (3 * l2_bytes).div_ceil(bytes_per_set.max(1)).clamp(1, cap)
}

/// `FA_MATMUL_TFLOPS`: the bf16 matmul rate measured in the same run by tools/torch_compare.py (the bundle's
/// run.sh passes it on). The crate does not link cuBLAS, so without it the prefill table has no % column.
pub fn matmul_tflops() -> Option<f64> {
    std::env::var("FA_MATMUL_TFLOPS").ok()?.parse().ok().filter(|x: &f64| x.is_finite() && *x > 0.0)
}

/// True when criterion runs in its one-iteration test mode (`cargo test --benches`, or a bench binary run
/// without `--bench`): the benches then shrink their grids to a smoke test.
pub fn test_mode() -> bool {
    !std::env::args().any(|a| a == "--bench")
}
