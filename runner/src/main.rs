//! fused-attn runner: `report` (the standard sweep: correctness against the fp64 reference, and on a GPU
//! timing against ceilings measured in the same run), `run` (one configuration) and `plot` (the report's
//! plots from a recorded JSON report). Exit status: 0 when every row passed, 1 when a row failed or the run
//! hit an error, 2 for invalid command-line input. Errors are one line on stderr, never a panic.
mod args;
mod backend;
mod cases;
mod dump;
mod figures;
mod output;
mod plot;
mod progress;
mod report;
mod row;
#[cfg(test)]
mod row_fields;

use std::io::BufRead;
use std::path::Path;

use fused_attn::mla::MlaDims;
use fused_attn::prefill::PrefillKernel;
use fused_attn::testkit::cases::append::AppendCase;
use fused_attn::testkit::cases::decode::DecodeCase;
use fused_attn::testkit::cases::mla::MlaCase;
use fused_attn::testkit::cases::paged_prefill::{CaseSchedule, PagedPrefillCase};
use fused_attn::testkit::cases::prefill::PrefillCase;
use fused_attn::testkit::timing::copy_bandwidth_gbps;
use fused_attn::{Error, ErrorKind, Result};

use args::{Command, Op, Parsed, PlotArgs, ReportArgs, RunArgs};
use backend::Backend;
use output::{Output, RunInfo};
use progress::Progress;
use row::Row;

fn run(a: &RunArgs, backend: &Backend, out: &mut Output) -> Result<()> {
    let dump = a.dump.as_deref().map(dump::Dump::new).transpose()?;
    let progress = Progress::stages();
    out.set_progress(progress.clone());
    let copy = match backend {
        Backend::Gpu { stream, .. } if !a.no_timing => {
            progress.message("measuring the copy bandwidth (1 GiB device-to-device)");
            Some(copy_bandwidth_gbps(stream, 1 << 30)?)
        }
        _ => None,
    };
    let row = match a.op {
        Op::Prefill => {
            let case = PrefillCase {
                batch: a.batch,
                variants: a.variants(),
                kernel: a.common.kernel,
                sm90_steps: a.sm90_off,
                rope: a.rope()?,
                // --op prefill rotates q and k, q alone on the sm90 kernel (no RoPE on K there; docs/runner.md).
                rope_k: a.common.kernel != PrefillKernel::Sm90,
                head_dim_v: a.head_dim_v,
                ..PrefillCase::dense(
                    a.dtype.into(),
                    a.head_dim,
                    a.causal,
                    a.seqlen_q,
                    a.seqlen_k(),
                    (a.heads, a.kv_heads()),
                )
            };
            cases::run_prefill(backend, &case, a.common.seed, copy, dump.as_ref(), &progress)
        }
        Op::Decode => {
            let case = DecodeCase {
                dtype: a.dtype.into(),
                head_dim: a.head_dim,
                head_dim_v: a.head_dim_v,
                heads_q: a.heads,
                heads_kv: a.kv_heads(),
                page_size: a.page_size,
                seq_lens: a.context_lens(),
                num_splits: a.num_splits,
                variants: a.variants(),
                rope: a.rope()?,
                kv: a.kv_format(),
                schedule: a.split_policy.map(|policy| CaseSchedule { policy, slots: a.sched_slots }),
            };
            cases::run_decode(backend, &case, a.common.seed, copy, dump.as_ref(), &progress)
        }
        Op::PagedPrefill => {
            let case = PagedPrefillCase {
                dtype: a.dtype.into(),
                head_dim: a.head_dim,
                head_dim_v: a.head_dim_v,
                heads_q: a.heads,
                heads_kv: a.kv_heads(),
                page_size: a.page_size,
                seqs: a.paged_seqs()?,
                causal: !a.no_causal,
                num_splits: a.num_splits,
                shared_prefix: 0,
                variants: a.variants(),
                kv: a.kv_format(),
                rope: a.rope()?,
                kernel: a.paged_kernel.into(),
                schedule: a.split_policy.map(|policy| CaseSchedule { policy, slots: a.sched_slots }),
            };
            cases::run_paged_prefill(backend, &case, a.common.seed, copy, dump.as_ref(), &progress)
        }
        Op::MlaDecode => {
            let case = MlaCase {
                dtype: a.dtype.into(),
                heads_q: a.heads,
                dims: MlaDims { kv_lora_rank: a.kv_lora_rank, rope_dim: a.rope_dim },
                q_len: a.q_len,
                page_size: a.page_size,
                seq_lens: a.context_lens(),
                num_splits: a.num_splits,
                fp8: a.kv_dtype().fp8(),
            };
            cases::run_mla(backend, &case, a.common.seed, copy, dump.as_ref(), &progress)
        }
        Op::Append => {
            let case = AppendCase {
                dtype: a.dtype.into(),
                head_dim: a.head_dim,
                head_dim_v: a.head_dim_v,
                heads_kv: a.kv_heads(),
                page_size: a.page_size,
                seqs: a.paged_seqs()?,
                kv: a.kv_format(),
                rope: a.rope()?,
            };
            cases::run_append(backend, &case, a.common.seed, copy, dump.as_ref(), &progress)
        }
    };
    progress.finish();
    out.set_progress(Progress::hidden());
    let row = row?;
    let counters = row.counters.clone();
    out.row(row);
    out.legend();
    if a.counters && !a.common.json {
        match counters {
            Some(c) => {
                for (k, v) in c {
                    println!("  {k:>22}: {v}");
                }
            }
            None => out.note("--counters: no counters (they come from the emulator backend)"),
        }
    }
    Ok(())
}

/// Writes DIR/prefill.png and DIR/decode.png from the timed rows; says which it wrote (or why none).
fn write_plots(rows: &[Row], matmul_tflops: Option<f64>, dir: &Path, out: &mut Output) -> Result<()> {
    let charts = [("prefill.png", figures::prefill(rows, matmul_tflops)), ("decode.png", figures::decode(rows))];
    if charts.iter().all(|(_, c)| c.is_none()) {
        out.note(&format!("--plot: no timed rows, so no plots written to {}", dir.display()));
        return Ok(());
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::usage(format!("--plot: cannot create {}: {e}", dir.display())))?;
    for (name, chart) in charts {
        match chart {
            Some(c) => {
                c.write_png(&dir.join(name))?;
                out.note(&format!("plot: wrote {}", dir.join(name).display()));
            }
            None => out.note(&format!("plot: no timed {} rows, so no {name}", name.trim_end_matches(".png"))),
        }
    }
    Ok(())
}

fn report(a: &ReportArgs, backend: &Backend, out: &mut Output) -> Result<()> {
    if let (Some(dir), Backend::Emu(_)) = (&a.plot, backend) {
        eprintln!(
            "fused-attn: --plot: no plots on the emulator, which checks but does not time; plots need a GPU run \
             (`report --backend gpu --plot {}`, or `fused-attn plot REPORT.jsonl` on a GPU run's JSON)",
            dir.display()
        );
    }
    report::report(backend, a.common.seed, a.quick, a.common.kernel, out)?;
    out.summary();
    match (&a.plot, backend) {
        (Some(dir), Backend::Gpu { .. }) => write_plots(&out.rows.clone(), a.matmul_tflops, dir, out),
        _ => Ok(()),
    }
}

/// `plot REPORT.jsonl`: the rows of a recorded `report --json` (lines that are not JSON objects, such as
/// notes captured with the rows, are skipped).
fn plot(a: &PlotArgs, out: &mut Output) -> Result<()> {
    let name = a.report.display();
    let file = std::fs::File::open(&a.report).map_err(|e| Error::usage(format!("cannot read {name}: {e}")))?;
    let mut rows = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| Error::usage(format!("cannot read {name}: {e}")))?;
        if line.trim_start().starts_with('{') {
            let row: Row = serde_json::from_str(&line)
                .map_err(|e| Error::usage(format!("{name}:{}: not a report row: {e}", i + 1)))?;
            rows.push(row);
        }
    }
    write_plots(&rows, a.matmul_tflops, &a.out, out)
}

fn main_inner(command: Command) -> Result<bool> {
    let date = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let info = |backend: &Backend| RunInfo { device: backend.device(), commit: args::COMMIT.to_string(), date };
    match command {
        Command::Run(a) => {
            let backend = Backend::resolve(a.common.backend)?;
            let mut out = Output::new(a.common.json, info(&backend));
            out.set_timing(matches!(backend, Backend::Gpu { .. }) && !a.no_timing);
            run(&a, &backend, &mut out)?;
            Ok(out.failed() == 0)
        }
        Command::Report(a) => {
            let backend = Backend::resolve(a.common.backend)?;
            let mut out = Output::new(a.common.json, info(&backend));
            out.set_timing(matches!(backend, Backend::Gpu { .. }));
            report(&a, &backend, &mut out)?;
            Ok(out.failed() == 0)
        }
        Command::Plot(a) => {
            // Notes go to stdout, like a table run's.
            let info = RunInfo { device: String::new(), commit: String::new(), date: String::new() };
            plot(&a, &mut Output::new(false, info))?;
            Ok(true)
        }
    }
}

/// Errors are reported on one line.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn main() {
    let result = args::parse(std::env::args_os()).and_then(|parsed| match parsed {
        Parsed::Print(text) => {
            print!("{text}");
            Ok(true)
        }
        Parsed::Help(text) => {
            eprint!("{text}");
            Err(Error::usage(""))
        }
        Parsed::Command(c) => main_inner(*c),
    });
    let code = match result {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) if e.kind() == &ErrorKind::Usage => {
            if !e.message().is_empty() {
                eprintln!("fused-attn: {}", one_line(e.message()));
            }
            2
        }
        Err(e) => {
            eprintln!("fused-attn: {}", one_line(&e.to_string()));
            1
        }
    };
    std::process::exit(code);
}
