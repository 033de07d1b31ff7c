//! One result row of the runner: the configuration, its accuracy against the fp64 reference, and (on a
//! GPU) its timing. Printed as a table line or as one JSON object; unmeasured values are JSON null.

use std::fmt::Write;

#[derive(Clone, Debug, Default)]
pub struct Row {
    /// "sweep" (a correctness case), "perf" (a timed shape of the standard family) or "run".
    pub kind: &'static str,
    /// The case in words (layout, varlen lengths, decode lengths, ...).
    pub label: String,
    pub seed: u64,
    pub op: &'static str,
    pub backend: &'static str,
    pub dtype: &'static str,
    pub head_dim: usize,
    pub batch: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub causal: bool,
    pub page_size: Option<usize>,
    pub num_splits: Option<usize>,
    pub max_abs_err: Option<f64>,
    pub rel_l2_err: Option<f64>,
    pub tolerance: Option<f64>,
    pub lse_max_abs_err: Option<f64>,
    pub passed: Option<bool>,
    pub ms: Option<f64>,
    pub tflops: Option<f64>,
    pub gbps: Option<f64>,
    /// Device-to-device copy bandwidth measured in the same run, and this row's fraction of it (decode).
    pub copy_gbps: Option<f64>,
    pub pct_of_copy_bw: Option<f64>,
    /// How the output was checked: "full" (every row against the fp64 reference), "sampled" (some rows, for
    /// shapes too large for the reference), or None (timing only).
    pub check: Option<&'static str>,
    pub error: Option<String>,
}

fn num(v: Option<f64>) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.6e}"),
        Some(x) if x.is_nan() => "\"NaN\"".into(),
        Some(x) => format!("\"{x}\""),
        None => "null".into(),
    }
}

fn int(v: Option<usize>) -> String {
    v.map_or("null".into(), |x| x.to_string())
}

fn string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl Row {
    pub fn json(&self) -> String {
        format!(
            "{{\"op\":{},\"backend\":{},\"dtype\":{},\"head_dim\":{},\"batch\":{},\"heads_q\":{},\"heads_kv\":{},\
             \"seqlen_q\":{},\"seqlen_k\":{},\"causal\":{},\"page_size\":{},\"num_splits\":{},\"max_abs_err\":{},\
             \"rel_l2_err\":{},\"tolerance\":{},\"lse_max_abs_err\":{},\"passed\":{},\"ms\":{},\"tflops\":{},\
             \"gbps\":{},\"copy_gbps\":{},\"pct_of_copy_bw\":{},\"check\":{},\"kind\":{},\"seed\":{},\"label\":{},\
             \"error\":{}}}",
            string(self.op),
            string(self.backend),
            string(self.dtype),
            self.head_dim,
            self.batch,
            self.heads_q,
            self.heads_kv,
            self.seqlen_q,
            self.seqlen_k,
            self.causal,
            int(self.page_size),
            int(self.num_splits),
            num(self.max_abs_err),
            num(self.rel_l2_err),
            num(self.tolerance),
            num(self.lse_max_abs_err),
            self.passed.map_or("null".into(), |p| p.to_string()),
            num(self.ms),
            num(self.tflops),
            num(self.gbps),
            num(self.copy_gbps),
            num(self.pct_of_copy_bw),
            self.check.map_or("null".into(), string),
            string(self.kind),
            self.seed,
            string(&self.label),
            self.error.as_deref().map_or("null".into(), string),
        )
    }

    pub const HEADER: &'static str = "op      backend dtype  D    B    Hq  Hkv  Tq     Tk     causal page split \
max_abs_err  tolerance    rel_l2       passed  ms        TFLOPS   GB/s     %copy  case";

    pub fn table_line(&self) -> String {
        let f = |v: Option<f64>, w: usize| v.map_or(format!("{:>w$}", "-"), |x| format!("{x:>w$.3e}"));
        let g = |v: Option<f64>, w: usize, p: usize| v.map_or(format!("{:>w$}", "-"), |x| format!("{x:>w$.p$}"));
        let passed = match (self.passed, self.check) {
            (Some(true), Some("sampled")) => "pass*",
            (Some(true), _) => "PASS",
            (Some(false), _) => "FAIL",
            (None, _) => "-",
        };
        let mut s = format!(
            "{:<7} {:<7} {:<6} {:<4} {:<4} {:<3} {:<4} {:<6} {:<6} {:<6} {:<4} {:<5} {} {} {} {:<7} {} {} {} {}  {}",
            self.op,
            self.backend,
            self.dtype,
            self.head_dim,
            self.batch,
            self.heads_q,
            self.heads_kv,
            self.seqlen_q,
            self.seqlen_k,
            self.causal,
            self.page_size.map_or("-".into(), |p| p.to_string()),
            self.num_splits.map_or("-".into(), |p| p.to_string()),
            f(self.max_abs_err, 12),
            f(self.tolerance, 12),
            f(self.rel_l2_err, 12),
            passed,
            g(self.ms, 9, 4),
            g(self.tflops, 8, 1),
            g(self.gbps, 8, 1),
            g(self.pct_of_copy_bw, 6, 1),
            self.label,
        );
        if let Some(e) = &self.error {
            let _ = write!(s, "  error: {e}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_every_field_and_nulls() {
        let r = Row {
            op: "prefill",
            backend: "emu",
            dtype: "bf16",
            passed: Some(true),
            max_abs_err: Some(1e-3),
            ..Default::default()
        };
        let j = r.json();
        for key in [
            "op",
            "backend",
            "dtype",
            "head_dim",
            "batch",
            "heads_q",
            "heads_kv",
            "seqlen_q",
            "seqlen_k",
            "causal",
            "page_size",
            "max_abs_err",
            "rel_l2_err",
            "tolerance",
            "passed",
            "ms",
            "tflops",
            "gbps",
            "copy_gbps",
            "pct_of_copy_bw",
            "kind",
            "seed",
            "label",
        ] {
            assert!(j.contains(&format!("\"{key}\":")), "{key} missing in {j}");
        }
        assert!(
            j.contains("\"ms\":null") && j.contains("\"passed\":true") && j.contains("\"max_abs_err\":1.000000e-3")
        );
    }
}
