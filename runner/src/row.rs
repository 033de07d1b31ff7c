//! One result row of the runner: the configuration, its accuracy against the fp64 reference, and (on a
//! GPU) its timing. Printed as a table line or as one JSON object (serde); unmeasured values are JSON null,
//! non-finite numbers are strings ("NaN", "inf", "-inf") because JSON has no literal for them. The same
//! struct reads rows back (`fused-attn plot REPORT.jsonl`), tolerating the fields older runners lacked.

use std::fmt::Write;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Row {
    pub op: String,
    pub backend: String,
    pub dtype: String,
    pub head_dim: usize,
    /// V's head dim (O's columns): `head_dim` unless the case has one of its own (DeepSeek's 192 / 128); MLA:
    /// the latent rank. None in rows of runners before it.
    pub head_dim_v: Option<usize>,
    pub batch: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub seqlen_q: usize,
    /// Decode: the longest sequence of the batch.
    pub seqlen_k: usize,
    pub causal: bool,
    /// Score variants (docs/semantics.md): window bounds (-1 = unbounded), softcap (0 = off), ALiBi with
    /// the standard slopes, sinks.
    #[serde(default = "unbounded")]
    pub window_left: i32,
    #[serde(default = "unbounded")]
    pub window_right: i32,
    pub softcap: f64,
    pub alibi: bool,
    pub sinks: bool,
    pub page_size: Option<usize>,
    /// Decode and paged prefill: the cache's element type (`dtype`, or `fp8_e4m3` / `fp8_e5m2`).
    pub kv_dtype: Option<String>,
    /// Decode: the split-KV count the launch used.
    pub num_splits: Option<usize>,
    #[serde(with = "finite_or_string")]
    pub max_abs_err: Option<f64>,
    #[serde(with = "finite_or_string")]
    pub rel_l2_err: Option<f64>,
    #[serde(with = "finite_or_string")]
    pub tolerance: Option<f64>,
    #[serde(with = "finite_or_string")]
    pub lse_max_abs_err: Option<f64>,
    pub passed: Option<bool>,
    #[serde(with = "finite_or_string")]
    pub ms: Option<f64>,
    #[serde(with = "finite_or_string")]
    pub tflops: Option<f64>,
    #[serde(with = "finite_or_string")]
    pub gbps: Option<f64>,
    /// Device-to-device copy bandwidth measured in the same run, and this row's fraction of it (decode).
    #[serde(with = "finite_or_string")]
    pub copy_gbps: Option<f64>,
    #[serde(with = "finite_or_string")]
    pub pct_of_copy_bw: Option<f64>,
    /// A timed comparison row (`report` on a GPU): the row it is compared with ("<op> <label>", timed in the
    /// same run) and this row's median time over that row's (paged / dense prefill, spec-verify / one
    /// decode step, FP8 / 16-bit decode).
    pub baseline: Option<String>,
    #[serde(with = "finite_or_string")]
    pub vs_baseline: Option<f64>,
    /// How the output was checked: "full" (every row against the fp64 reference), "sampled" (some rows, for
    /// shapes too large for the reference), or None (timing only).
    pub check: Option<String>,
    /// "sweep" (a correctness case), "perf" (a timed shape of the standard family) or "run".
    pub kind: String,
    pub seed: u64,
    /// The case in words (layout, varlen lengths, decode lengths, ...).
    pub label: String,
    pub error: Option<String>,
    /// Where and when: the GPU's name (or "host emulator"), the runner's git commit, the UTC time the
    /// command started. The plots print them.
    pub device: String,
    pub commit: String,
    pub date: String,
    /// Per-backend counters (e.g. the emulator's cost counters), when the backend reports any.
    pub counters: Option<serde_json::Map<String, serde_json::Value>>,
}

fn unbounded() -> i32 {
    -1
}

/// `Option<f64>` as a JSON number, null, or a string for the non-finite values; reads all three back.
mod finite_or_string {
    use super::*;

    pub fn serialize<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(x) if x.is_finite() => s.serialize_f64(*x),
            Some(x) if x.is_nan() => s.serialize_str("NaN"),
            Some(x) => s.serialize_str(&x.to_string()),
            None => s.serialize_none(),
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum NumOrText {
        Num(f64),
        Text(String),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        Ok(match Option::<NumOrText>::deserialize(d)? {
            None => None,
            Some(NumOrText::Num(x)) => Some(x),
            Some(NumOrText::Text(t)) => Some(t.parse::<f64>().map_err(serde::de::Error::custom)?),
        })
    }
}

/// What the table's `passed` column shows, and what the legend under the table says about it.
pub fn verdict(passed: Option<bool>, check: Option<&str>) -> &'static str {
    match (passed, check) {
        (Some(true), Some("sampled")) => "pass*",
        (Some(true), _) => "PASS",
        (Some(false), _) => "FAIL",
        (None, _) => "-",
    }
}

impl Row {
    pub fn json(&self) -> String {
        // ok: a struct of plain fields, strings and numbers always serialises.
        serde_json::to_string(self).expect("a Row serialises to JSON")
    }

    pub const HEADER: &'static str = "op      backend dtype  D    B    Hq  Hkv  Tq     Tk     causal page split \
max_abs_err  tolerance    rel_l2       passed  ms        TFLOPS   GB/s     %copy  case";

    /// The header of a table without the timing columns (ms, TFLOPS, GB/s, %copy).
    pub fn header(timing: bool) -> String {
        if timing {
            Self::HEADER.to_string()
        } else {
            Self::HEADER.replace("ms        TFLOPS   GB/s     %copy  ", "")
        }
    }

    /// [`Self::table_line`], with the timing columns only when `timing` (a backend that times: a GPU).
    pub fn table_line_with(&self, timing: bool) -> String {
        if timing {
            return self.table_line();
        }
        Row { ms: None, tflops: None, gbps: None, pct_of_copy_bw: None, ..self.clone() }.table_line().replacen(
            &format!("{:>9} {:>8} {:>8} {:>6}  ", "-", "-", "-", "-"),
            "",
            1,
        )
    }

    pub fn table_line(&self) -> String {
        let f = |v: Option<f64>, w: usize| v.map_or(format!("{:>w$}", "-"), |x| format!("{x:>w$.3e}"));
        let g = |v: Option<f64>, w: usize, p: usize| v.map_or(format!("{:>w$}", "-"), |x| format!("{x:>w$.p$}"));
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
            verdict(self.passed, self.check.as_deref()),
            g(self.ms, 9, 4),
            g(self.tflops, 8, 1),
            g(self.gbps, 8, 1),
            g(self.pct_of_copy_bw, 6, 1),
            self.label,
        );
        if let (Some(x), Some(b)) = (self.vs_baseline, &self.baseline) {
            let op = b.split(' ').next().unwrap_or_default();
            let _ = write!(s, "  [{x:.2}x the time of its {op} baseline]");
        }
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
    fn json_has_every_field_nulls_and_non_finite_strings() {
        let r = Row {
            op: "prefill".into(),
            backend: "emu".into(),
            dtype: "bf16".into(),
            passed: Some(true),
            max_abs_err: Some(1e-3),
            rel_l2_err: Some(f64::NAN),
            tolerance: Some(f64::INFINITY),
            ..Default::default()
        };
        let j = r.json();
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        for key in crate::row_fields::ROW_FIELDS {
            assert!(v.get(key).is_some(), "{key} missing in {j}");
        }
        assert_eq!((&v["ms"], &v["passed"], &v["max_abs_err"]), (&serde_json::Value::Null, &true.into(), &1e-3.into()));
        assert_eq!((v["rel_l2_err"].as_str(), v["tolerance"].as_str()), (Some("NaN"), Some("inf")));
        // And back: the non-finite strings become numbers again; absent fields take their defaults.
        let back: Row = serde_json::from_str(&j).unwrap();
        assert!(back.rel_l2_err.is_some_and(f64::is_nan) && back.tolerance == Some(f64::INFINITY));
        let old: Row = serde_json::from_str(r#"{"op":"decode","gbps":"-inf","passed":null}"#).unwrap();
        assert_eq!((old.op.as_str(), old.gbps, old.device.as_str()), ("decode", Some(f64::NEG_INFINITY), ""));
        assert!(serde_json::from_str::<Row>(r#"{"ms":"fast"}"#).is_err());
    }

    #[test]
    fn verdicts() {
        assert_eq!(verdict(Some(true), Some("sampled")), "pass*");
        assert_eq!(verdict(Some(true), Some("full")), "PASS");
        assert_eq!(verdict(Some(false), Some("sampled")), "FAIL");
        assert_eq!(verdict(None, None), "-");
    }
}
