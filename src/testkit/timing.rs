//! GPU timing shared by the runner and the benches: CUDA events around launches on one stream, warm-up
//! excluded, median of many; and the ceilings every number is quoted against, measured in the same run
//! (device-to-device copy bandwidth).

use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::CudaStream;

use crate::error::{Error, Result};

/// Robust statistics of repeated launches, in milliseconds.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub median_ms: f64,
    pub min_ms: f64,
    pub iters: usize,
}

/// How many launches a timing makes: `warmup` untimed ones, then `iters` timed ones (their median is the
/// result).
#[derive(Clone, Copy, Debug)]
pub struct Runs {
    pub warmup: usize,
    pub iters: usize,
}

/// Times `launch(i)` (which must only enqueue work on `stream`) with a start/end event pair per iteration,
/// after `runs.warmup` untimed calls. `i` counts calls so the caller can rotate through several input sets
/// (larger than L2 together) and avoid measuring cache hits.
///
/// All events are created before the first timed launch and every iteration is enqueued back to back with
/// no synchronisation in between; the host waits once, at the end. (Waiting per iteration would let the GPU
/// idle while the host enqueues the next launch, and that host time would be counted as kernel time.)
pub fn time_launches(
    stream: &Arc<CudaStream>,
    runs: Runs,
    mut launch: impl FnMut(usize) -> Result<()>,
) -> Result<Timing> {
    let Runs { warmup, iters } = runs;
    if iters == 0 {
        return Err(Error::usage("time_launches: iters must be > 0"));
    }
    let ctx = stream.context();
    let events = (0..iters + 1)
        .map(|_| ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    for i in 0..warmup {
        launch(i)?;
    }
    // Event i marks the end of launch i - 1 and the start of launch i.
    events[0].record(stream)?;
    for i in 0..iters {
        launch(warmup + i)?;
        events[i + 1].record(stream)?;
    }
    events[iters].synchronize()?;
    let mut times = Vec::with_capacity(iters);
    for pair in events.windows(2) {
        times.push(pair[0].elapsed_ms(&pair[1])? as f64);
    }
    Ok(summarize(&mut times))
}

fn summarize(times: &mut [f64]) -> Timing {
    times.sort_by(f64::total_cmp);
    let n = times.len();
    let median_ms = if n % 2 == 1 { times[n / 2] } else { 0.5 * (times[n / 2 - 1] + times[n / 2]) };
    Timing { median_ms, min_ms: times[0], iters: n }
}

/// Device-to-device copy bandwidth in GB/s (bytes read + bytes written, 10^9), from a `bytes`-sized
/// cuMemcpyDtoDAsync: the memory ceiling decode is quoted against.
pub fn copy_bandwidth_gbps(stream: &Arc<CudaStream>, bytes: usize) -> Result<f64> {
    let n = bytes / 4;
    let src = stream.alloc_zeros::<u32>(n)?;
    let mut dst = stream.alloc_zeros::<u32>(n)?;
    let t = time_launches(stream, Runs { warmup: 3, iters: 20 }, |_| Ok(stream.memcpy_dtod(&src, &mut dst)?))?;
    Ok(2.0 * (n * 4) as f64 / (t.median_ms * 1e-3) / 1e9)
}

/// Prefill FLOPs per docs/semantics.md: 4·B·Hq·Tq·Tk·D, counting only the visible part of the causal mask
/// (exactly half for Tq = Tk, the convention FlashAttention's benchmarks use).
pub fn prefill_flops(
    batch: usize,
    heads_q: usize,
    seqlen_q: usize,
    seqlen_k: usize,
    head_dim: usize,
    causal: bool,
) -> f64 {
    let pairs = if causal {
        // Row i sees min(Tk, max(0, i + 1 + Tk - Tq)) keys (bottom-right alignment); Tq = Tk gives Tq·Tk/2
        // to within the diagonal, which the convention rounds to exactly half.
        if seqlen_q == seqlen_k {
            (seqlen_q * seqlen_k) as f64 / 2.0
        } else {
            (0..seqlen_q).map(|i| crate::reference::visible_keys(true, seqlen_q, seqlen_k, i) as f64).sum()
        }
    } else {
        (seqlen_q * seqlen_k) as f64
    };
    4.0 * batch as f64 * heads_q as f64 * pairs * head_dim as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(summarize(&mut [3.0, 1.0, 2.0]).median_ms, 2.0);
        let t = summarize(&mut [4.0, 1.0, 3.0, 2.0]);
        assert_eq!((t.median_ms, t.min_ms, t.iters), (2.5, 1.0, 4));
    }

    #[test]
    fn flops_follow_the_convention() {
        assert_eq!(prefill_flops(2, 16, 1024, 1024, 128, false), 4.0 * 2.0 * 16.0 * 1024.0 * 1024.0 * 128.0);
        assert_eq!(prefill_flops(2, 16, 1024, 1024, 128, true), 2.0 * 2.0 * 16.0 * 1024.0 * 1024.0 * 128.0);
        // Chunked prefill: 2 rows over 4 keys see 3 and 4 keys.
        assert_eq!(prefill_flops(1, 1, 2, 4, 1, true), 4.0 * 7.0);
    }
}
