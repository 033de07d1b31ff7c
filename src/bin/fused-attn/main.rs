//! fused-attn runner: `report` (the standard sweep: correctness against the fp64 reference, and on a GPU
//! timing against ceilings measured in the same run) and `run` (one configuration). Exit status: 0 when
//! every row passed, 1 when a row failed or the run hit an error, 2 for invalid command-line input. Errors
//! are one line on stderr, never a panic.
mod args;
mod backend;
mod cases;
mod dump;
mod npy;
mod output;
mod plot;
mod report;
mod row;

use fused_attn::decode::cases::DecodeCase;
use fused_attn::prefill::{CaseLayout, PrefillCase};
use fused_attn::timing::copy_bandwidth_gbps;
use fused_attn::{Error, ErrorKind, Result};

use args::{Args, Op, Verb};
use backend::Backend;
use output::Output;

fn run(a: &Args, backend: &Backend, out: &mut Output) -> Result<()> {
    let dump = a.dump.as_deref().map(dump::Dump::new).transpose()?;
    let copy = match backend {
        Backend::Gpu { stream, .. } if !a.no_timing => Some(copy_bandwidth_gbps(stream, 1 << 30)?),
        _ => None,
    };
    let row = match a.op {
        Op::Prefill => {
            let case = PrefillCase {
                dtype: a.dtype,
                batch: a.batch,
                seqlen_q: a.seqlen_q,
                seqlen_k: a.seqlen_k,
                heads_q: a.heads,
                heads_kv: a.kv_heads,
                head_dim: a.head_dim,
                causal: a.causal,
                varlen: None,
                layout: CaseLayout::Contiguous,
                with_lse: true,
            };
            cases::run_prefill(backend, &case, a.seed, copy, dump.as_ref())?
        }
        Op::Decode => {
            let case = DecodeCase {
                dtype: a.dtype,
                head_dim: a.head_dim,
                heads_q: a.heads,
                heads_kv: a.kv_heads,
                page_size: a.page_size,
                seq_lens: vec![a.seqlen_k; a.batch],
                num_splits: a.num_splits,
            };
            cases::run_decode(backend, &case, a.seed, copy, dump.as_ref())?
        }
    };
    out.row(row);
    Ok(())
}

fn main_inner(argv: Vec<String>) -> Result<bool> {
    let a = args::parse(argv)?;
    let backend = Backend::resolve(a.backend)?;
    let mut out = Output::new(a.json);
    match a.verb {
        Verb::Run => run(&a, &backend, &mut out)?,
        Verb::Report => {
            report::report(&backend, a.seed, a.quick, &mut out)?;
            out.summary();
            if let Some(dir) = &a.plot {
                let (prefill, decode) = report::plots(&out.rows);
                if prefill.is_none() && decode.is_none() {
                    eprintln!("fused-attn: no timed rows (emulator backend), so no plots written to {}", dir.display());
                } else {
                    std::fs::create_dir_all(dir)
                        .map_err(|e| Error::usage(format!("--plot: cannot create {}: {e}", dir.display())))?;
                    for (name, plot) in [("prefill.png", prefill), ("decode.png", decode)] {
                        if let Some(p) = plot {
                            p.write(&dir.join(name))?;
                        }
                    }
                }
            }
        }
    }
    Ok(out.failed() == 0)
}

/// Errors are reported on one line.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let code = match main_inner(argv) {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) if e.kind() == &ErrorKind::Usage => {
            eprintln!("fused-attn: {}", one_line(e.message()));
            2
        }
        Err(e) => {
            eprintln!("fused-attn: {}", one_line(&e.to_string()));
            1
        }
    };
    std::process::exit(code);
}
