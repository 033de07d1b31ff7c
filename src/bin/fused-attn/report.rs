//! `report`: the standard sweep. Emulator: a representative subset of both correctness sweeps (or a few
//! cases with `--quick`). GPU: the copy-bandwidth ceiling, the timed performance shapes (prefill: the FA
//! family, TFLOPS; decode: contexts × batches, % of the copy bandwidth), then the full correctness sweeps of
//! both ops. Rows stream out in order as they complete.

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::time::Instant;

use fused_attn::decode::cases::{decode_sweep, decode_sweep_emulated, perf_cases as decode_perf, DecodeCase};
use fused_attn::prefill::cases::perf_cases as prefill_perf;
use fused_attn::prefill::sweep_cases;
use fused_attn::timing::copy_bandwidth_gbps;
use fused_attn::{DType, Result};

use crate::backend::Backend;
use crate::cases::{self, Case};
use crate::output::Output;
use crate::row::Row;

/// Per-case seed: the base seed (`--seed`) mixed with the case's index.
pub fn case_seed(base: u64, i: usize) -> u64 {
    base ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// The correctness cases of `report` on `backend`.
pub fn sweep(backend: &Backend, quick: bool) -> Vec<Case> {
    let gpu = matches!(backend, Backend::Gpu { .. });
    let prefill = sweep_cases(gpu && !quick);
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

pub fn report(backend: &Backend, base_seed: u64, quick: bool, out: &mut Output) -> Result<()> {
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
    let cases = sweep(backend, quick);
    // On a GPU the timed shapes run first: they carry the numbers the issues' bars are judged by (and a
    // sampled correctness check each), so a run cut short by a time budget still has them.
    if let (Backend::Gpu { stream, .. }, Some(copy)) = (backend, copy_gbps) {
        let mut pf = prefill_perf();
        let mut dp = decode_perf_cases();
        if quick {
            pf.retain(|c| c.dtype == DType::Bf16 && c.head_dim == 128 && matches!(c.seqlen_q, 1024 | 8192));
            dp.retain(|c| decode_perf().contains(c));
        }
        let start = Instant::now();
        out.note(&format!("performance: {} prefill and {} decode shapes (CUDA events, median)", pf.len(), dp.len()));
        let offset = cases.len(); // seeds continue after the sweep's
        for (i, c) in pf.iter().enumerate() {
            out.row(cases::time_prefill(stream, backend, c, case_seed(base_seed, offset + i), copy));
        }
        let offset = offset + pf.len();
        for (i, c) in dp.iter().enumerate() {
            out.row(cases::time_decode(stream, backend, c, case_seed(base_seed, offset + i), copy));
        }
        out.note(&format!("performance: done in {:.1} s", start.elapsed().as_secs_f64()));
    }

    let start = Instant::now();
    out.note(&format!("correctness: {} cases against the fp64 reference ({workers} threads)", cases.len()));
    ordered_parallel(&cases, workers, |i, c| cases::check(backend, c, case_seed(base_seed, i)), |row| out.row(row));
    out.note(&format!("correctness: done in {:.1} s", start.elapsed().as_secs_f64()));
    Ok(())
}

/// Rows for plotting: prefill TFLOPS vs seqlen per (D, causal, dtype[, GQA]); decode % of copy bandwidth
/// vs context per batch. `None` when there are no timed rows of that op.
pub fn plots(rows: &[Row]) -> (Option<crate::plot::Plot>, Option<crate::plot::Plot>) {
    use crate::plot::{Plot, Series};
    let mut pre: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut dec: BTreeMap<usize, Vec<(f64, f64)>> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.kind == "perf") {
        match (r.op, r.tflops, r.pct_of_copy_bw) {
            ("prefill", Some(t), _) if t.is_finite() => {
                let gqa =
                    if r.heads_q != r.heads_kv { format!(" GQA{}:{}", r.heads_q, r.heads_kv) } else { String::new() };
                let key = format!("{} D{}{}{}", r.dtype, r.head_dim, if r.causal { " causal" } else { "" }, gqa);
                pre.entry(key).or_default().push((r.seqlen_q as f64, t));
            }
            ("decode", _, Some(p)) if p.is_finite() => dec.entry(r.batch).or_default().push((r.seqlen_k as f64, p)),
            _ => {}
        }
    }
    let prefill = (!pre.is_empty()).then(|| Plot {
        title: "prefill TFLOPS vs seqlen (B*T = 16K, Hq*D = 2048)".into(),
        x_label: "seqlen".into(),
        y_label: "TFLOPS".into(),
        series: pre.into_iter().map(|(label, points)| Series { label, points }).collect(),
    });
    let decode = (!dec.is_empty()).then(|| Plot {
        title: "decode % of copy bandwidth vs context".into(),
        x_label: "context".into(),
        y_label: "% of copy BW".into(),
        series: dec.into_iter().map(|(b, points)| Series { label: format!("B={b}"), points }).collect(),
    });
    (prefill, decode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plots_group_timed_rows() {
        let perf = |op: &'static str, d: usize, causal: bool, t: usize, b: usize, y: f64| Row {
            kind: "perf",
            op,
            dtype: "bf16",
            head_dim: d,
            causal,
            seqlen_q: if op == "prefill" { t } else { 1 },
            seqlen_k: t,
            batch: b,
            heads_q: 16,
            heads_kv: 16,
            tflops: (op == "prefill").then_some(y),
            pct_of_copy_bw: (op == "decode").then_some(y),
            ..Default::default()
        };
        let rows = vec![
            perf("prefill", 128, true, 1024, 16, 100.0),
            perf("prefill", 128, true, 2048, 8, 150.0),
            perf("prefill", 64, false, 1024, 16, 90.0),
            perf("decode", 128, false, 4096, 64, 80.0),
            Row { kind: "sweep", op: "prefill", ..Default::default() },
        ];
        let (p, d) = plots(&rows);
        let p = p.expect("prefill plot");
        assert_eq!(p.series.len(), 2);
        assert!(p.series.iter().any(|s| s.label == "bf16 D128 causal" && s.points.len() == 2));
        let d = d.expect("decode plot");
        assert_eq!((d.series.len(), d.series[0].label.as_str()), (1, "B=64"));
        assert_eq!(plots(&rows[4..]).0.map(|p| p.series.len()), None);
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
