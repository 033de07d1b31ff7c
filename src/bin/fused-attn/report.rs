//! `report`: the standard sweep. Emulator: a representative subset of both correctness sweeps (or a few
//! cases with `--quick`). GPU: the copy-bandwidth ceiling, the timed performance shapes (prefill: the FA
//! family, TFLOPS; decode: contexts × batches, % of the copy bandwidth), then the full correctness sweeps of
//! both ops. Rows stream out in order as they complete.

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::time::Instant;

use fused_attn::decode::cases::{decode_sweep, decode_sweep_emulated, perf_cases as decode_perf, DecodeCase};
use fused_attn::prefill::cases::perf_cases as prefill_perf;
use fused_attn::prefill::{sweep_cases, PrefillCase, PrefillKernel, Sm90Tile, SM90_SOFTCAP_RANGE};
use fused_attn::timing::copy_bandwidth_gbps;
use fused_attn::{DType, Result};

use crate::backend::Backend;
use crate::cases::{self, Case};
use crate::output::Output;
use crate::progress::Progress;

/// Per-case seed: the base seed (`--seed`) mixed with the case's index.
pub fn case_seed(base: u64, i: usize) -> u64 {
    base ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Whether the sm90 kernel runs `c` (head dim and softcap range; the GPU's compute capability aside).
fn sm90_runs(c: &PrefillCase) -> bool {
    Sm90Tile::for_head_dim(c.head_dim).is_some() && c.variants.softcap.is_none_or(|s| SM90_SOFTCAP_RANGE.contains(&s))
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
        return out;
    }
    prefill.into_iter().map(Case::Prefill).chain(decode.into_iter().map(Case::Decode)).collect()
}

/// Decode shapes timed by `report`: the issue-5 shapes (B = 64 at 4k, B = 1 at 32k) plus more contexts per
/// batch for the plot; every cache is ≥ 128 MB so launches stream from HBM, not L2.
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
    cases
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
        let mut pf = prefill_perf();
        let mut dp = decode_perf_cases();
        if quick {
            pf.retain(|c| c.dtype == DType::Bf16 && c.head_dim == 128 && matches!(c.seqlen_q, 1024 | 8192));
            dp.retain(|c| decode_perf().contains(c));
        }
        // On a compute capability 9.0 GPU with `--kernel auto`, every timed prefill shape the sm90 kernel
        // supports runs on both kernels, side by side (rows labelled sm80 / sm90); elsewhere on the kernel
        // asked for.
        let hopper = stream.context().compute_capability().is_ok_and(|cc| cc == (9, 0));
        let pf: Vec<PrefillCase> = pf
            .into_iter()
            .flat_map(|c| {
                if kernel == PrefillKernel::Auto && hopper && sm90_runs(&c) {
                    vec![with_kernel(c.clone(), PrefillKernel::Sm80), with_kernel(c, PrefillKernel::Sm90)]
                } else {
                    vec![with_kernel(c, kernel)]
                }
            })
            .collect();
        let start = Instant::now();
        out.note(&format!("performance: {} prefill and {} decode shapes (CUDA events, median)", pf.len(), dp.len()));
        let progress = Progress::counter(pf.len() + dp.len(), "timing");
        out.set_progress(progress.clone());
        let offset = cases.len(); // seeds continue after the sweep's
        for (i, c) in pf.iter().enumerate() {
            progress.message(format!("prefill {}", c.label()));
            out.row(cases::time_prefill(stream, backend, c, case_seed(base_seed, offset + i), copy));
            progress.inc();
        }
        let offset = offset + pf.len();
        for (i, c) in dp.iter().enumerate() {
            progress.message(format!("decode {}", c.label()));
            out.row(cases::time_decode(stream, backend, c, case_seed(base_seed, offset + i), copy));
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
