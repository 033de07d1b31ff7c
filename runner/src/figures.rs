//! What the two report plots show, from the timed (`"kind":"perf"`) rows of a report, live or recorded:
//! - prefill.png: TFLOPS vs sequence length, one panel per dtype; colour and marker by head dim (and GQA),
//!   dashed lines and hollow markers for causal; the bf16 matmul ceiling when known, and the targets.
//! - decode.png: % of the copy bandwidth vs context, one series per batch (and per other shape, dashed);
//!   100 % is the copy bandwidth measured in the same run; the targets.
//!
//! Both carry the device, commit, date and the ceilings in their header.

use std::collections::BTreeMap;

use plotters::style::RGBColor;

use crate::plot::{Chart, Marker, Panel, RefLine, Series, Style};
use crate::row::Row;

/// Okabe–Ito colours (distinguishable with the common colour-vision deficiencies), then extras.
const PALETTE: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(230, 159, 0),
    RGBColor(120, 80, 30),
    RGBColor(0, 0, 0),
];
const MARKERS: [Marker; 5] = [Marker::Circle, Marker::Triangle, Marker::Square, Marker::Diamond, Marker::Plus];
const CEILING: RGBColor = RGBColor(110, 110, 110);
const TARGET: RGBColor = RGBColor(200, 0, 0);

/// The bars docs/performance.md's predictions table judges the kernels by (set in the issues that asked for the kernels).
const PREFILL_TARGET_TFLOPS: f64 = 350.0; // bf16, D = 128, B·T = 16k, Hq = 16, T = 8k, non-causal
const PREFILL_CAUSAL_TARGET: f64 = 0.9; // causal ≥ 0.9 × the non-causal rate of the same shape
const DECODE_TARGETS: [(usize, usize, f64); 2] = [(64, 4096, 85.0), (1, 32768, 60.0)]; // (B, context, % of copy)

fn style(i: usize, dashed: bool) -> Style {
    Style { color: PALETTE[i % PALETTE.len()], dashed, marker: Some(MARKERS[i % MARKERS.len()]), hollow: dashed }
}

fn line(y: f64, tag: String, label: String, color: RGBColor, dashed: bool) -> RefLine {
    RefLine { y, tag, label, style: Style { color, dashed, marker: None, hollow: false } }
}

fn finite(v: Option<f64>) -> Option<f64> {
    v.filter(|x| x.is_finite())
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// The header lines: where and when, and the ceilings (the matmul rate only for prefill: `matmul` None
/// leaves it out).
fn caption(perf: &[&Row], matmul: Option<Option<f64>>) -> Vec<String> {
    let first =
        |f: fn(&Row) -> &str| perf.iter().map(|r| f(r)).find(|s| !s.is_empty()).unwrap_or("unknown").to_string();
    let copy = median(perf.iter().filter_map(|r| finite(r.copy_gbps)).collect());
    let copy = copy.map_or("copy bandwidth: not measured".into(), |c| {
        format!("copy bandwidth {c:.0} GB/s (1 GiB device-to-device, same run)")
    });
    let matmul = match matmul {
        None => String::new(),
        Some(None) => "; bf16 matmul: not given (--matmul-tflops)".into(),
        Some(Some(m)) => format!("; bf16 matmul {m:.0} TFLOPS (tools/torch_compare.py)"),
    };
    vec![
        format!("{}  ·  commit {}  ·  {}", first(|r| &r.device), first(|r| &r.commit), first(|r| &r.date)),
        format!("ceilings: {copy}{matmul}  ·  CUDA events, median"),
    ]
}

/// The prefill chart, or None without timed prefill rows.
pub fn prefill(rows: &[Row], matmul_tflops: Option<f64>) -> Option<Chart> {
    // The FA family (Tq = Tk); the dense baselines of the paged prefill rows (Tq < Tk) are not on this axis.
    let perf: Vec<&Row> = rows
        .iter()
        .filter(|r| r.kind == "perf" && r.op == "prefill" && r.seqlen_q == r.seqlen_k && finite(r.tflops).is_some())
        .collect();
    if perf.is_empty() {
        return None;
    }
    // Shape families (head dim, GQA ratio) get one colour and marker each, in the same order in every panel.
    let family = |r: &Row| (r.head_dim, r.heads_q != r.heads_kv, r.heads_q, r.heads_kv);
    let mut families: Vec<_> = perf.iter().map(|r| family(r)).collect();
    families.sort();
    families.dedup();
    let mut dtypes: Vec<&str> = perf.iter().map(|r| r.dtype.as_str()).collect();
    dtypes.sort_by_key(|d| (*d != "bf16", *d)); // bf16 first: the targets are bf16's
    dtypes.dedup();
    let noncausal_8k = perf
        .iter()
        .find(|r| r.dtype == "bf16" && r.head_dim == 128 && !r.causal && r.seqlen_q == 8192 && r.heads_q == r.heads_kv)
        .and_then(|r| r.tflops);
    let panels = dtypes
        .iter()
        .map(|&dtype| {
            let mut groups: BTreeMap<(usize, bool), Vec<(f64, f64)>> = BTreeMap::new();
            for r in perf.iter().filter(|r| r.dtype == dtype) {
                let fi = families.iter().position(|f| *f == family(r)).unwrap_or(0);
                groups.entry((fi, r.causal)).or_default().push((r.seqlen_q as f64, r.tflops.unwrap_or(0.0)));
            }
            let series = groups
                .into_iter()
                .map(|((fi, causal), points)| {
                    let (d, gqa, hq, hkv) = families[fi];
                    let gqa = if gqa { format!(" GQA {hq}:{hkv}") } else { String::new() };
                    let label = format!("D={d}{gqa}{}", if causal { " causal" } else { "" });
                    Series { label, style: style(fi, causal), points }
                })
                .collect();
            let mut lines = Vec::new();
            if let Some(m) = matmul_tflops {
                let (tag, label) = (format!("matmul {m:.0}"), format!("bf16 matmul ceiling {m:.0} TFLOPS (measured)"));
                lines.push(line(m, tag, label, CEILING, false));
            }
            if dtype == "bf16" {
                let t = PREFILL_TARGET_TFLOPS;
                let label = format!("target: D=128 T=8K non-causal ≥ {t:.0} TFLOPS");
                lines.push(line(t, format!("target {t:.0}"), label, TARGET, true));
                if let Some(n) = noncausal_8k {
                    let c = PREFILL_CAUSAL_TARGET * n;
                    let label = format!("target: D=128 T=8K causal ≥ 0.9 × non-causal = {c:.0} TFLOPS");
                    lines.push(line(c, format!("causal target {c:.0}"), label, TARGET, true));
                }
            }
            Panel { title: dtype.to_string(), series, lines }
        })
        .collect();
    Some(Chart {
        title: "prefill: TFLOPS vs sequence length (B·T = 16K, Hq·D = 2048)".into(),
        caption: caption(&perf, Some(matmul_tflops)),
        x_label: "sequence length T (Tq = Tk)".into(),
        y_label: "TFLOPS (4·B·Hq·T²·D, halved for causal)".into(),
        panels,
    })
}

/// The decode chart, or None without timed decode rows.
pub fn decode(rows: &[Row]) -> Option<Chart> {
    let perf: Vec<&Row> =
        rows.iter().filter(|r| r.kind == "perf" && r.op == "decode" && finite(r.pct_of_copy_bw).is_some()).collect();
    if perf.is_empty() {
        return None;
    }
    // One series per batch size and shape; shapes other than the most common one are dashed.
    // The cache's element type is part of the shape: FP8 rows are their own (dashed) series.
    let shape = |r: &Row| {
        let kv = r.kv_dtype.clone().filter(|k| *k != r.dtype).map_or(String::new(), |k| format!(" kv={k}"));
        (r.dtype.clone(), r.head_dim, r.heads_q, r.heads_kv, r.page_size, kv)
    };
    let mut counts: BTreeMap<_, usize> = BTreeMap::new();
    for r in &perf {
        *counts.entry(shape(r)).or_default() += 1;
    }
    let common = counts.iter().max_by_key(|(_, n)| **n).map(|(s, _)| s.clone());
    let mut groups: BTreeMap<(usize, bool, String), Vec<(f64, f64)>> = BTreeMap::new();
    for r in &perf {
        let s = shape(r);
        let odd = Some(&s) != common.as_ref();
        let desc =
            format!("{} D={} {}:{} page={}{}", s.0, s.1, s.2, s.3, s.4.map_or("-".into(), |p| p.to_string()), s.5);
        groups.entry((r.batch, odd, desc)).or_default().push((r.seqlen_k as f64, r.pct_of_copy_bw.unwrap_or(0.0)));
    }
    let copy = median(perf.iter().filter_map(|r| finite(r.copy_gbps)).collect());
    let tag = copy.map_or("100 % = copy".into(), |c| format!("100 % = copy {c:.0} GB/s"));
    let mut lines = vec![line(100.0, tag, "100\u{a0}% = copy bandwidth (measured)".into(), CEILING, false)];
    let mut batch_style = BTreeMap::new();
    let series: Vec<Series> = groups
        .into_iter()
        .enumerate()
        .map(|(i, ((batch, odd, desc), points))| {
            let st = style(i, odd);
            if !odd {
                batch_style.insert(batch, st.color);
            }
            let label = if odd { format!("B={batch} {desc}") } else { format!("B={batch}") };
            Series { label, style: st, points }
        })
        .collect();
    for (batch, ctx, pct) in DECODE_TARGETS {
        let color = batch_style.get(&batch).copied().unwrap_or(TARGET);
        let ctx = crate::plot::pow2_label(ctx as f64);
        let label = format!("target: B={batch}, context {ctx} ≥\u{a0}{pct:.0}\u{a0}%");
        lines.push(line(pct, format!("target B={batch} {ctx}: {pct:.0} %"), label, color, true));
    }
    let shape_note = common
        .map_or(String::new(), |s| format!(" ({} D={} Hq:Hkv={}:{} page={})", s.0, s.1, s.2, s.3, s.4.unwrap_or(0)));
    Some(Chart {
        title: format!("decode: % of copy bandwidth vs context{shape_note}"),
        caption: caption(&perf, None),
        x_label: "context length (tokens per sequence)".into(),
        y_label: "% of copy bandwidth (GB/s ÷ measured copy GB/s)".into(),
        panels: vec![Panel { title: String::new(), series, lines }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn perf(
        op: &str,
        dtype: &str,
        d: usize,
        causal: bool,
        (t, b): (usize, usize),
        heads: (usize, usize),
        y: f64,
    ) -> Row {
        Row {
            kind: "perf".into(),
            op: op.into(),
            dtype: dtype.into(),
            head_dim: d,
            causal,
            seqlen_q: if op == "prefill" { t } else { 1 },
            seqlen_k: t,
            batch: b,
            heads_q: heads.0,
            heads_kv: heads.1,
            page_size: (op == "decode").then_some(16),
            tflops: (op == "prefill").then_some(y),
            pct_of_copy_bw: (op == "decode").then_some(y),
            copy_gbps: Some(3000.0),
            device: "GPU X".into(),
            ..Default::default()
        }
    }

    #[test]
    fn groups_timed_rows_into_panels_series_and_lines() {
        let rows = vec![
            perf("prefill", "bf16", 128, true, (1024, 16), (16, 16), 100.0),
            perf("prefill", "bf16", 128, true, (2048, 8), (16, 16), 150.0),
            perf("prefill", "bf16", 128, false, (8192, 2), (16, 16), 300.0),
            perf("prefill", "bf16", 128, false, (4096, 4), (32, 8), 280.0),
            perf("prefill", "fp16", 64, false, (1024, 16), (32, 32), 90.0),
            perf("decode", "bf16", 128, false, (4096, 64), (32, 8), 80.0),
            perf("decode", "bf16", 128, false, (1024, 64), (32, 8), 60.0),
            perf("decode", "bf16", 128, false, (32768, 1), (32, 8), 55.0),
            Row { kind: "sweep".into(), op: "prefill".into(), tflops: Some(1.0), ..Default::default() },
            Row { kind: "perf".into(), op: "prefill".into(), tflops: Some(f64::NAN), ..Default::default() },
        ];
        let p = prefill(&rows, Some(700.0)).expect("prefill chart");
        assert_eq!(p.panels.iter().map(|p| p.title.as_str()).collect::<Vec<_>>(), ["bf16", "fp16"]);
        let bf16 = &p.panels[0];
        let labels: Vec<&str> = bf16.series.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(labels.len(), 3, "{labels:?}");
        let causal = bf16.series.iter().find(|s| s.label == "D=128 causal").expect("causal series");
        let plain = bf16.series.iter().find(|s| s.label == "D=128").expect("non-causal series");
        let gqa = bf16.series.iter().find(|s| s.label == "D=128 GQA 32:8").expect("GQA series");
        assert_eq!(causal.points.len(), 2);
        // Causal differs from non-causal by line style, and the GQA family by colour and marker.
        assert!(causal.style.dashed && !plain.style.dashed && causal.style.color == plain.style.color);
        assert!(gqa.style.color != plain.style.color && gqa.style.marker != plain.style.marker);
        // Ceiling and both targets (the causal one from the measured non-causal 8k rate) in the bf16 panel.
        let ys: Vec<f64> = bf16.lines.iter().map(|l| l.y).collect();
        assert_eq!(ys, [700.0, 350.0, 270.0]);
        assert_eq!(p.panels[1].lines.len(), 1, "fp16: the ceiling only");
        assert!(p.caption[0].starts_with("GPU X") && p.caption[1].contains("3000 GB/s"), "{:?}", p.caption);

        let d = decode(&rows).expect("decode chart");
        let s = &d.panels[0].series;
        assert_eq!(s.iter().map(|s| (s.label.as_str(), s.points.len())).collect::<Vec<_>>(), [("B=1", 1), ("B=64", 2)]);
        assert_eq!(d.panels[0].lines.iter().map(|l| l.y).collect::<Vec<_>>(), [100.0, 85.0, 60.0]);
        assert_eq!(d.panels[0].lines[1].style.color, s[1].style.color, "the B=64 target in B=64's colour");

        assert!(prefill(&rows[8..], None).is_none() && decode(&rows[8..]).is_none());
    }

    #[test]
    fn comparison_rows_keep_the_charts_apart() {
        let mut rows = vec![
            perf("prefill", "bf16", 128, false, (4096, 4), (32, 8), 280.0),
            perf("decode", "bf16", 128, false, (4096, 64), (32, 8), 80.0),
            perf("decode", "bf16", 128, false, (2048, 64), (32, 8), 75.0),
        ];
        rows[1].kv_dtype = Some("bf16".into()); // as the runner writes it; older reports lack it
                                                // report's comparison rows: a dense baseline (Tq < Tk), a paged prefill row, an FP8 decode row.
        let mut dense = perf("prefill", "bf16", 128, true, (4096, 4), (32, 8), 250.0);
        dense.seqlen_q = 512;
        let paged = Row { op: "paged-prefill".into(), ..dense.clone() };
        let mut fp8 = perf("decode", "bf16", 128, false, (4096, 64), (32, 8), 78.0);
        fp8.kv_dtype = Some("fp8_e4m3".into());
        rows.extend([dense, paged, fp8]);
        let p = prefill(&rows, None).expect("prefill chart");
        let series: Vec<(&str, usize)> =
            p.panels[0].series.iter().map(|s| (s.label.as_str(), s.points.len())).collect();
        assert_eq!(series, [("D=128 GQA 32:8", 1)]);
        let d = decode(&rows).expect("decode chart");
        let s = &d.panels[0].series;
        let labels: Vec<(&str, usize, bool)> =
            s.iter().map(|s| (s.label.as_str(), s.points.len(), s.style.dashed)).collect();
        assert_eq!(labels, [("B=64", 2, false), ("B=64 bf16 D=128 32:8 page=16 kv=fp8_e4m3", 1, true)]);
    }
}
