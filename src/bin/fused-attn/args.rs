//! Command-line flags of the runner, spelled as the README documents them. Every invalid flag or value is a
//! one-line `Usage` error, never a panic.

use std::path::PathBuf;

use fused_attn::{DType, Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Prefill,
    Decode,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    Gpu,
    Emu,
    Auto,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    Report,
    Run,
}

/// One configuration (`run`), or the options of the sweep (`report`: backend, json, seed, quick, plot).
#[derive(Clone, Debug)]
pub struct Args {
    pub verb: Verb,
    pub op: Op,
    pub dtype: DType,
    pub head_dim: usize,
    pub batch: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub causal: bool,
    pub page_size: usize,
    pub backend: BackendChoice,
    pub json: bool,
    pub seed: u64,
    pub dump: Option<PathBuf>,
    pub num_splits: Option<usize>,
    pub quick: bool,
    pub plot: Option<PathBuf>,
    /// `run` on a GPU: check only, no timing (e.g. under compute-sanitizer).
    pub no_timing: bool,
}

pub const USAGE: &str = "usage: fused-attn <report|run> [--op prefill|decode] [--dtype fp16|bf16] [--head-dim N] \
[--batch N] [--heads N] [--kv-heads N] [--seqlen-q N] [--seqlen-k N] [--causal] [--page-size N] \
[--num-splits N] [--backend gpu|emu|auto] [--json] [--seed N] [--dump DIR] [--quick] [--plot DIR] [--no-timing]";

fn number(flag: &str, value: Option<String>) -> Result<usize> {
    let v = value.ok_or_else(|| Error::usage(format!("{flag} needs a value")))?;
    v.parse::<usize>().map_err(|_| Error::usage(format!("{flag}: '{v}' is not a non-negative integer")))
}

pub fn parse(argv: impl IntoIterator<Item = String>) -> Result<Args> {
    let mut it = argv.into_iter();
    let verb = match it.next().as_deref() {
        Some("report") => Verb::Report,
        Some("run") => Verb::Run,
        Some("-h" | "--help") | None => return Err(Error::usage(USAGE)),
        Some(other) => return Err(Error::usage(format!("unknown verb '{other}'; {USAGE}"))),
    };
    let mut a = Args {
        verb,
        op: Op::Prefill,
        dtype: DType::Bf16,
        head_dim: 128,
        batch: 1,
        heads: 8,
        kv_heads: 0,
        seqlen_q: 128,
        seqlen_k: 0,
        causal: false,
        page_size: 16,
        backend: BackendChoice::Auto,
        json: false,
        seed: 0,
        dump: None,
        num_splits: None,
        quick: false,
        plot: None,
        no_timing: false,
    };
    let (mut kv_heads, mut seqlen_k) = (None, None);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--op" => {
                a.op = match it.next().as_deref() {
                    Some("prefill") => Op::Prefill,
                    Some("decode") => Op::Decode,
                    other => return Err(Error::usage(format!("--op must be prefill or decode, got {other:?}"))),
                }
            }
            "--dtype" => {
                let v = it.next().unwrap_or_default();
                a.dtype =
                    DType::parse(&v).ok_or_else(|| Error::usage(format!("--dtype must be fp16 or bf16, got '{v}'")))?;
            }
            "--head-dim" => a.head_dim = number(&flag, it.next())?,
            "--batch" => a.batch = number(&flag, it.next())?,
            "--heads" => a.heads = number(&flag, it.next())?,
            "--kv-heads" => kv_heads = Some(number(&flag, it.next())?),
            "--seqlen-q" => a.seqlen_q = number(&flag, it.next())?,
            "--seqlen-k" => seqlen_k = Some(number(&flag, it.next())?),
            "--causal" => a.causal = true,
            "--page-size" => a.page_size = number(&flag, it.next())?,
            "--num-splits" => a.num_splits = Some(number(&flag, it.next())?),
            "--backend" => {
                a.backend = match it.next().as_deref() {
                    Some("gpu") => BackendChoice::Gpu,
                    Some("emu") => BackendChoice::Emu,
                    Some("auto") => BackendChoice::Auto,
                    other => return Err(Error::usage(format!("--backend must be gpu, emu or auto, got {other:?}"))),
                }
            }
            "--json" => a.json = true,
            "--seed" => a.seed = number(&flag, it.next())? as u64,
            "--dump" => a.dump = Some(it.next().ok_or_else(|| Error::usage("--dump needs a directory"))?.into()),
            "--quick" => a.quick = true,
            "--no-timing" => a.no_timing = true,
            "--plot" => a.plot = Some(it.next().ok_or_else(|| Error::usage("--plot needs a directory"))?.into()),
            "-h" | "--help" => return Err(Error::usage(USAGE)),
            other => return Err(Error::usage(format!("unknown flag '{other}'; {USAGE}"))),
        }
    }
    if a.verb == Verb::Report && a.dump.is_some() {
        return Err(Error::usage("--dump applies to `run` only"));
    }
    if a.verb == Verb::Run && (a.plot.is_some() || a.quick) {
        return Err(Error::usage("--plot and --quick apply to `report` only"));
    }
    if a.verb == Verb::Report && a.no_timing {
        return Err(Error::usage("--no-timing applies to `run` only"));
    }
    if a.op == Op::Prefill && a.num_splits.is_some() {
        return Err(Error::usage("--num-splits applies to --op decode only"));
    }
    a.kv_heads = kv_heads.unwrap_or(a.heads);
    a.seqlen_k = seqlen_k.unwrap_or(a.seqlen_q);
    if a.op == Op::Decode {
        // Decode is one new token per sequence over a cache of --seqlen-k tokens.
        a.seqlen_q = 1;
    }
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Args> {
        parse(s.split_whitespace().map(String::from))
    }

    #[test]
    fn parses_a_full_run_line() {
        let a = p("run --op decode --dtype fp16 --head-dim 64 --batch 3 --heads 8 --kv-heads 2 --seqlen-k 100 \
                   --page-size 8 --backend emu --json --seed 7")
        .unwrap();
        assert_eq!((a.op, a.dtype, a.head_dim, a.batch, a.heads, a.kv_heads), (Op::Decode, DType::F16, 64, 3, 8, 2));
        assert_eq!((a.seqlen_q, a.seqlen_k, a.page_size, a.seed), (1, 100, 8, 7));
        assert!(a.json && a.backend == BackendChoice::Emu);
    }

    #[test]
    fn bad_flags_are_usage_errors() {
        for line in [
            "",
            "frobnicate",
            "run --head-dim",
            "run --head-dim x",
            "run --dtype fp8",
            "run --op sort",
            "run --backend tpu",
            "run --wat",
            "run --plot x",
            "report --dump x",
            "run --op prefill --num-splits 2",
            "run --batch -1",
        ] {
            let e = p(line).unwrap_err();
            assert_eq!(e.kind(), &fused_attn::ErrorKind::Usage, "{line}");
        }
    }
}
