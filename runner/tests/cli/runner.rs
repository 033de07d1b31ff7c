//! The `fused-attn` binary end to end: `--help` and `--version` exit 0 and list every flag; bad flags
//! (including a flag the chosen op does not use) and bad shapes give one-line typed errors and the right exit
//! status (never a panic, never Rust debug text); `run` on the emulator prints a valid JSON row in either
//! flag spelling; `--dump` writes .npy files with the documented names, dtypes and shapes; `--backend gpu`
//! without a GPU names what is missing and `auto` says what it chose; `report --quick --json` prints only
//! passing JSON rows; `plot` renders the recorded fixture report into PNGs of the documented size.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value as Json;

/// The documented row fields, the list the runner's own unit test checks too.
#[path = "../../src/row_fields.rs"]
mod row_fields;
use row_fields::ROW_FIELDS;

fn fused_attn(args: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fused-attn"))
        .args(args.split_whitespace())
        .output()
        .expect("the fused-attn binary runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Every stdout line as a JSON object holding every documented field (serde_json rejects NaN and inf
/// literals, so a row with a bare non-finite number fails here).
fn json_rows(o: &Output) -> Vec<Json> {
    stdout(o)
        .lines()
        .map(|l| serde_json::from_str::<Json>(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .inspect(|row| {
            for f in ROW_FIELDS {
                assert!(row.get(f).is_some(), "no {f} in {row}");
            }
        })
        .collect()
}

fn assert_one_line_error(o: &Output, code: i32, contains: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(code), "stderr: {err}");
    assert_eq!(err.lines().count(), 1, "want one stderr line, got: {err}");
    assert!(err.starts_with("fused-attn: ") && err.contains(contains), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn help_and_version_exit_0_and_list_every_flag_with_its_default() {
    let o = fused_attn("--help");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    for cmd in ["report", "run", "plot"] {
        assert!(stdout(&o).contains(cmd), "{cmd} missing from --help");
    }
    let o = fused_attn("run --help");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let help = stdout(&o);
    for (flag, default) in [
        ("--op <OP>", "[default: prefill]"),
        ("--dtype <DTYPE>", "[default: bf16]"),
        ("--head-dim <N>", "[default: 128]"),
        ("--batch <N>", "[default: 1]"),
        ("--heads <N>", "[default: 8]"),
        ("--kv-heads <N>", "[default: --heads]"),
        ("--seqlen-q <N>", "[default: 128]"),
        ("--seqlen-k <N>", "--seqlen-q]"),
        ("--causal", "[prefill; paged-prefill, where it is the default]"),
        ("--no-causal", "[paged-prefill only"),
        ("--page-size <N>", "[default: 16]"),
        ("--page-size <N>", "[decode, paged-prefill,"),
        ("--num-splits <N>", "[default: the planner's choice]"),
        ("--backend <BACKEND>", "[default: auto]"),
        ("--json", ""),
        ("--seed <N>", "[default: 0]"),
        ("--dump <DIR>", ""),
        ("--no-timing", ""),
        ("--window-left <N>", "[default: -1]"),
        ("--window-right <N>", "[default: -1]"),
        ("--softcap <X>", "[default: 0]"),
        ("--alibi", "[prefill, decode]"),
        ("--sinks", "[prefill, decode]"),
        ("--kv-lora-rank <N>", "[default: 512]"),
        ("--rope-dim <N>", "[default: 64]"),
        ("--q-len <N>", "[mla-decode]"),
    ] {
        let at = help.find(flag).unwrap_or_else(|| panic!("{flag} missing from run --help:\n{help}"));
        // The flag's own paragraph (up to the next flag) names its default or the ops it applies to.
        let para = &help[at..];
        let para = &para[..para[2..].find("\n      --").map_or(para.len(), |i| i + 2)];
        assert!(para.contains(default), "{flag}: no '{default}' in:\n{para}");
    }
    for only in ["[paged-prefill only", "[decode, paged-prefill]", "[prefill, decode]", "pass*"] {
        assert!(help.contains(only), "run --help lacks {only}");
    }
    let o = fused_attn("report --help");
    assert_eq!(o.status.code(), Some(0));
    for flag in ["--backend <BACKEND>", "--json", "--seed <N>", "--quick", "--plot <DIR>", "--matmul-tflops <TFLOPS>"] {
        assert!(stdout(&o).contains(flag), "{flag} missing from report --help");
    }
    for v in ["--version", "-V"] {
        let o = fused_attn(v);
        assert_eq!(o.status.code(), Some(0));
        assert!(
            stdout(&o).starts_with(&format!("fused-attn {} (commit ", env!("CARGO_PKG_VERSION"))),
            "{}",
            stdout(&o)
        );
    }
    // No command: the help on stderr, exit 2.
    let o = fused_attn("");
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("Usage: fused-attn <COMMAND>"), "{}", stderr(&o));
}

#[test]
fn bad_flags_are_usage_errors() {
    for (args, msg) in [
        ("frobnicate", "unrecognized subcommand 'frobnicate'"),
        ("run --wat", "unexpected argument '--wat'"),
        ("run --head-dim", "a value is required for '--head-dim <N>'"),
        ("run --head-dim x", "invalid value 'x' for '--head-dim <N>'"),
        ("run --batch -1", "invalid value '-1' for '--batch <N>'"),
        ("run --heads=-3", "invalid value '-3' for '--heads <N>'"),
        ("run --dtype fp8", "invalid value 'fp8' for '--dtype <DTYPE>' [possible values: fp16, bf16]"),
        ("run --op sort", "[possible values: prefill, decode, paged-prefill, append, mla-decode]"),
        ("run --backend tpu", "[possible values: gpu, emu, auto]"),
        ("report --dump /tmp/x", "unexpected argument '--dump'"),
        ("report --no-timing", "unexpected argument '--no-timing'"),
        ("report --op decode", "unexpected argument '--op'"),
        ("run --plot /tmp/x", "unexpected argument '--plot'"),
        ("run --quick", "unexpected argument '--quick'"),
        // Flags of the other op are errors naming the flag, not silently ignored.
        ("run --op decode --causal", "--causal applies to --op prefill or --op paged-prefill only"),
        ("run --op decode --seqlen-q 4", "--seqlen-q applies to --op prefill or --op paged-prefill or --op append"),
        ("run --op=decode --seqlen-q=4", "--seqlen-q applies to --op prefill or --op paged-prefill or --op append"),
        (
            "run --page-size 8",
            "--page-size applies to --op decode or --op paged-prefill or --op append or --op mla-decode",
        ),
        (
            "run --op append --heads 4",
            "--heads applies to --op prefill or --op decode or --op paged-prefill or --op mla",
        ),
        (
            "run --op prefill --num-splits 2",
            "--num-splits applies to --op decode or --op paged-prefill or --op mla-decode",
        ),
        ("run --op decode --q-len 2", "--q-len applies to --op mla-decode only"),
        ("run --op decode --no-causal", "--no-causal applies to --op paged-prefill only"),
        ("plot", "<REPORT.jsonl>"),
    ] {
        let o = fused_attn(args);
        assert_one_line_error(&o, 2, msg);
        let err = stderr(&o);
        assert!(!err.contains("Some(") && !err.contains("None"), "{args}: Rust debug text in {err}");
    }
}

#[test]
fn bad_shapes_are_typed_errors() {
    for (args, error) in [
        ("run --backend emu --head-dim 100 --seqlen-q 16", "Unsupported error: q: head dim 100"),
        (
            "run --backend emu --heads 6 --kv-heads 4 --seqlen-q 16",
            "Shape error: q: 6 query heads are not a positive multiple of k's 4 KV heads",
        ),
        ("run --backend emu --op decode --head-dim 100 --seqlen-k 16", "Unsupported error: "),
        ("run --backend emu --op paged-prefill --page-size 0 --seqlen-k 16", "Unsupported error: page_size: 0"),
        ("run --backend emu --op decode --page-size 0 --seqlen-k 16", "Unsupported error: page_size: 0"),
        ("run --backend emu --seqlen-q 100000000 --heads 1000", "more than the runner builds"),
    ] {
        assert_one_line_error(&fused_attn(args), 1, error);
    }
}

#[test]
fn run_emulated_prefill_and_decode_print_a_passing_json_row() {
    for (args, op) in [
        ("run --backend emu --op prefill --causal --heads 8 --kv-heads 2 --seqlen-q 70 --seqlen-k 100 --head-dim 64", "prefill"),
        ("run --backend emu --op prefill --dtype fp16 --batch 2 --heads 4 --seqlen-q 33 --head-dim 128", "prefill"),
        ("run --backend emu --op decode --dtype fp16 --heads 8 --kv-heads 2 --seqlen-k 100 --batch 3 --page-size 8 --num-splits 2", "decode"),
        // Head dims below their kernel's width (issue 12): any multiple of 8 from 32 to 256, for every op.
        ("run --backend emu --op prefill --causal --heads 4 --kv-heads 2 --seqlen-q 40 --seqlen-k 70 --head-dim 80", "prefill"),
        ("run --backend emu --op decode --heads 4 --kv-heads 1 --seqlen-k 90 --batch 2 --num-splits 2 --head-dim 200", "decode"),
        // A skewed batch on a scheduled (work-balanced) workspace (issue 25).
        ("run --backend emu --op decode --heads 8 --kv-heads 2 --seq-lens 3000,64,64,64 --split-policy balanced --sched-slots 8", "decode"),
    ] {
        let o = fused_attn(&format!("{args} --json --seed 5"));
        assert_eq!(o.status.code(), Some(0), "{args}: {}", stderr(&o));
        let rows = json_rows(&o);
        assert_eq!(rows.len(), 1, "{args}");
        let r = &rows[0];
        assert_eq!(r["op"], op);
        assert_eq!(r["backend"], "emu");
        assert_eq!(r["device"], "host emulator");
        assert_eq!(r["passed"], true, "{args}: {r}");
        for t in ["ms", "tflops", "gbps"] {
            assert_eq!(r[t], Json::Null, "{args}: emulation is not timed");
        }
        assert!(r["max_abs_err"].as_f64().is_some_and(|x| x >= 0.0), "{r}");
        assert_eq!(r["seed"], 5);
        // The emulator's cost counters, and measured/model ratios of exactly 1 for the kernels as designed.
        let c = &r["counters"];
        for k in ["global_bytes_read", "global_bytes_written", "mma", "barriers"] {
            assert!(c[k].as_u64().is_some_and(|v| v > 0), "{args}: counters.{k} missing or 0: {c}");
        }
        if args.contains("--split-policy") {
            // A scheduled launch cuts sequences its own way: no uniform-plan model to compare with.
            assert!(c.get("model_ratios").is_none_or(|v| v.is_null()), "{args}: {c}");
            continue;
        }
        let ratios = c["model_ratios"].as_object().unwrap_or_else(|| panic!("{args}: no model_ratios: {c}"));
        assert!(ratios.contains_key("mma"), "{ratios:?}");
        for (k, v) in ratios {
            let v = v.as_f64().unwrap();
            let ok = if k == "read_vs_budget" { v <= 1.0 } else { v == 1.0 };
            assert!(ok, "{args}: model ratio {k} = {v}");
        }
    }
    // The `--flag=value` spelling, and the decode row's page size (any, not only a power of two) and forced
    // split count.
    let o = fused_attn(
        "run --backend=emu --op=decode --heads=4 --kv-heads=2 --seqlen-k=40 --page-size=12 --num-splits=3 --json",
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let r = &json_rows(&o)[0];
    assert_eq!(
        (&r["heads_q"], &r["seqlen_k"], &r["page_size"], &r["num_splits"]),
        (&4.into(), &40.into(), &12.into(), &3.into())
    );
    // The table form: a header and one PASS line; --counters adds one line per counter.
    let o = fused_attn("run --backend emu --seqlen-q 20 --heads 2 --head-dim 64 --counters");
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0));
    assert!(out.lines().next().is_some_and(|l| l.starts_with("op ")), "{out}");
    assert!(out.lines().nth(1).is_some_and(|l| l.contains("PASS")), "{out}");
    assert!(out.lines().any(|l| l.trim_start().starts_with("global_bytes_read: ")), "{out}");
}

/// The score-variant flags: every variant alone and together, both ops, as passing JSON rows that carry the
/// variant fields; --dump adds alibi_slopes.npy and sinks.npy; bad values are usage errors.
/// Uneven batches: `--seq-lens` (decode, paged prefill) and `--q-lens` (paged prefill); the row carries the
/// batch, the longest context and the per-kernel balance counters.
#[test]
fn uneven_batches_run_from_seq_lens() {
    for (args, batch) in [
        ("run --backend emu --op decode --heads 4 --kv-heads 2 --head-dim 64 --seq-lens 700,20,0,65", 4),
        ("run --backend emu --op paged-prefill --heads 4 --kv-heads 2 --head-dim 64 --seq-lens 300,9 --q-lens 5,9", 2),
    ] {
        let o = fused_attn(&format!("{args} --json"));
        assert_eq!(o.status.code(), Some(0), "{args}: {}", stderr(&o));
        let r = &json_rows(&o)[0];
        assert_eq!(r["passed"], true, "{args}: {r}");
        assert_eq!(
            (&r["batch"], r["seqlen_k"].as_u64()),
            (&batch.into(), Some(if batch == 4 { 700 } else { 300 })),
            "{r}"
        );
        let k = &r["counters"]["per_kernel"][0];
        assert!(
            k["active_blocks"].as_u64().is_some_and(|n| n > 0) && k["max_block_bytes_read"].as_u64().is_some(),
            "{k}"
        );
        assert!(k["mean_block_bytes_read"].as_f64().is_some_and(|m| m > 0.0), "{k}");
    }
    assert_one_line_error(
        &fused_attn("run --backend emu --op paged-prefill --seq-lens 30,40 --q-lens 3"),
        2,
        "--q-lens has 1 entries",
    );
}

#[test]
fn variant_flags_run_and_are_recorded() {
    for (args, want) in [
        ("--op prefill --seqlen-q 90 --causal --window-left 40", (40, -1, 0.0, false, false)),
        (
            "--op prefill --seqlen-q 90 --window-left 20 --window-right 7 --softcap 2.5 --alibi --sinks",
            (20, 7, 2.5, true, true),
        ),
        ("--op decode --seqlen-k 300 --window-left 100 --sinks --num-splits 3", (100, -1, 0.0, false, true)),
        ("--op decode --seqlen-k 200 --softcap 3 --alibi", (-1, -1, 3.0, true, false)),
    ] {
        let o = fused_attn(&format!("run --backend emu --heads 4 --kv-heads 2 --head-dim 64 {args} --json"));
        assert_eq!(o.status.code(), Some(0), "{args}: {}", stderr(&o));
        let r = &json_rows(&o)[0];
        assert_eq!(r["passed"], true, "{args}: {r}");
        let got = (&r["window_left"], &r["window_right"], r["softcap"].as_f64().unwrap(), &r["alibi"], &r["sinks"]);
        assert_eq!(got, (&want.0.into(), &want.1.into(), want.2, &want.3.into(), &want.4.into()), "{args}");
        let ratios = r["counters"]["model_ratios"].as_object().unwrap();
        for (k, v) in ratios {
            let v = v.as_f64().unwrap();
            assert!(if k == "read_vs_budget" { v <= 1.0 } else { v == 1.0 }, "{args}: model ratio {k} = {v}");
        }
    }
    // A plain row says so.
    let o = fused_attn("run --backend emu --heads 2 --head-dim 64 --seqlen-q 20 --json");
    let r = &json_rows(&o)[0];
    assert_eq!(
        (&r["window_left"], &r["window_right"], &r["alibi"], &r["sinks"]),
        (&(-1).into(), &(-1).into(), &false.into(), &false.into())
    );
    // --dump writes the slopes and sinks.
    let dir = std::env::temp_dir().join(format!("fa-runner-variants-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for op in ["prefill", "decode"] {
        let d = dir.join(op);
        let o = fused_attn(&format!(
            "run --backend emu --op {op} --heads 6 --kv-heads 2 --head-dim 64 --seqlen-k 40 --alibi --sinks --json --dump {}",
            d.display()
        ));
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        assert_eq!(npy_header(&d.join("alibi_slopes.npy")), ("<f4".to_string(), vec![6]), "{op}");
        assert_eq!(npy_header(&d.join("sinks.npy")), ("<f4".to_string(), vec![6]), "{op}");
        // The standard slopes: 2^(-8/6), ..., 2^(-8).
        let b = std::fs::read(d.join("alibi_slopes.npy")).unwrap();
        let last = f32::from_le_bytes(b[b.len() - 4..].try_into().unwrap());
        assert_eq!(last, 1.0 / 256.0);
    }
    let o = fused_attn(&format!(
        "run --backend emu --heads 2 --head-dim 64 --seqlen-q 20 --json --dump {}",
        dir.join("plain").display()
    ));
    assert_eq!(o.status.code(), Some(0));
    assert!(!dir.join("plain/sinks.npy").exists() && !dir.join("plain/alibi_slopes.npy").exists());
    let _ = std::fs::remove_dir_all(&dir);
    assert_one_line_error(&fused_attn("run --window-left -3"), 2, "--window-left -3");
    assert_one_line_error(&fused_attn("run --softcap -1"), 2, "--softcap -1");
}

/// `run --op paged-prefill --rope-theta …`: q rotated in the kernel (default and explicit positions, a
/// partial-rotary YaRN table) passes against the reference, the label says so, and --dump writes the
/// poisoned table and each query token's position `[B, Tq]` (q unrotated).
#[test]
fn run_emulated_paged_prefill_with_rope_passes_and_dumps_positions() {
    let dir = std::env::temp_dir().join(format!("fa-runner-pp-rope-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for positions in ["last", "explicit"] {
        let o = fused_attn(&format!(
            "run --backend emu --op paged-prefill --batch 2 --heads 4 --kv-heads 2 --seqlen-q 6 --seqlen-k 90 \
             --head-dim 64 --page-size 16 --rope-theta 10000 --rope-style gptj --rotary-dim 32 \
             --rope-scaling yarn:4:2048 --rope-positions {positions} --json --seed 5 --dump {}",
            dir.display()
        ));
        assert_eq!(o.status.code(), Some(0), "{positions}: {}", stderr(&o));
        let r = &json_rows(&o)[0];
        assert_eq!((&r["op"], &r["passed"]), (&"paged-prefill".into(), &true.into()), "{r}");
        assert!(r["label"].as_str().unwrap_or_default().contains("rope=Gptj rd=32"), "{r}");
        assert_eq!(npy_header(&dir.join("rope_cos.npy")), ("<f4".to_string(), vec![1 << 15, 16 + 3]));
        assert_eq!(npy_header(&dir.join("rope_positions.npy")), ("<i4".to_string(), vec![2, 6]));
        if positions == "last" {
            // Each query token's place in its cache: 84..89 for both sequences.
            let b = std::fs::read(dir.join("rope_positions.npy")).unwrap();
            let pos: Vec<i32> =
                b[b.len() - 48..].chunks(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect();
            assert_eq!(pos, [84, 85, 86, 87, 88, 89, 84, 85, 86, 87, 88, 89]);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `run --op prefill --rope-theta …`: q and k rotated in the kernel (default and explicit positions, a
/// partial-rotary Llama-3 table, dense and a sliding window) pass against the reference (which rotates both),
/// the label says so, and --dump writes the poisoned table, each query row's position `[B, Tq]` and each
/// key's `[B, Tk]` (q and k unrotated); the JSON row's counters show K read as without RoPE.
#[test]
fn run_emulated_prefill_with_rope_on_q_and_k() {
    let dir = std::env::temp_dir().join(format!("fa-runner-prefill-rope-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let line = "run --backend emu --op prefill --batch 2 --heads 4 --kv-heads 2 --seqlen-q 40 --seqlen-k 70 \
                --head-dim 64 --causal --json --seed 3";
    let plain = fused_attn(line);
    assert_eq!(plain.status.code(), Some(0), "{}", stderr(&plain));
    let plain_k = json_rows(&plain)[0]["counters"]["buffers"]["k"].clone();
    assert!(plain_k["read"].as_u64().unwrap_or(0) > 0, "{plain_k}");
    for (positions, extra) in [("last", ""), ("explicit", " --window-left 20")] {
        let o = fused_attn(&format!(
            "{line} --rope-theta 500000 --rotary-dim 48 --rope-scaling llama3 --rope-positions {positions}{extra} \
             --dump {}",
            dir.display()
        ));
        assert_eq!(o.status.code(), Some(0), "{positions}: {}", stderr(&o));
        let r = &json_rows(&o)[0];
        assert_eq!((&r["op"], &r["passed"]), (&"prefill".into(), &true.into()), "{r}");
        assert!(r["label"].as_str().unwrap_or_default().contains("rope=Neox rd=48"), "{r}");
        if extra.is_empty() {
            assert_eq!(r["counters"]["buffers"]["k"], plain_k, "K traffic differs with RoPE: {r}");
        }
        assert_eq!(npy_header(&dir.join("rope_positions.npy")), ("<i4".to_string(), vec![2, 40]));
        assert_eq!(npy_header(&dir.join("rope_k_positions.npy")), ("<i4".to_string(), vec![2, 70]));
        if positions == "last" {
            let ints = |name: &str, n: usize| -> Vec<i32> {
                let b = std::fs::read(dir.join(name)).unwrap();
                b[b.len() - 4 * n..].chunks(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect()
            };
            // Sequence 1's last query rows sit at the bottom right (.., 68, 69); its keys at 0..70.
            assert_eq!(ints("rope_positions.npy", 2), [68, 69]);
            assert_eq!(ints("rope_k_positions.npy", 3), [67, 68, 69]);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `run --op prefill --kernel sm90` with RoPE (emulated sm_90a): q alone is rotated (the sm90 kernel has no
/// RoPE on K), the row passes against the reference, its label says `q`, and --dump writes q's positions but
/// no key positions.
#[test]
fn run_emulated_sm90_prefill_with_rope_on_q() {
    let dir = std::env::temp_dir().join(format!("fa-runner-sm90-rope-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let o = fused_attn(&format!(
        "run --backend emu --kernel sm90 --op prefill --batch 2 --heads 4 --kv-heads 2 --seqlen-q 40 --seqlen-k 70 \
         --head-dim 64 --causal --json --seed 3 --rope-theta 500000 --rotary-dim 48 --rope-scaling llama3 \
         --dump {}",
        dir.display()
    ));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let r = &json_rows(&o)[0];
    assert_eq!((&r["op"], &r["passed"]), (&"prefill".into(), &true.into()), "{r}");
    let label = r["label"].as_str().unwrap_or_default();
    assert!(label.starts_with("sm90") && label.contains("rope=Neox rd=48") && label.ends_with(" q"), "{r}");
    assert_eq!(npy_header(&dir.join("rope_positions.npy")), ("<i4".to_string(), vec![2, 40]));
    assert!(!dir.join("rope_k_positions.npy").exists(), "key positions dumped for a q-only RoPE call");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `run --op append`: 16-bit and FP8 caches, with and without RoPE (default and explicit positions), pass
/// the exact check; the JSON row's counters show K and V read once and the cache rows written once (with or
/// without RoPE); --dump writes the unrotated k, the slots, the positions and the caches after the append.
#[test]
fn run_emulated_append_checks_the_cache_bit_for_bit() {
    let dir = std::env::temp_dir().join(format!("fa-runner-append-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (n, hkv, d) = (2 * 6, 2, 64);
    for (extra, cache_bytes) in [
        ("", 2),
        (" --rope-theta 10000 --rotary-dim 32 --rope-style gptj", 2),
        (" --kv-dtype fp8_e4m3 --kv-scale per-head --rope-theta 500000 --rope-scaling llama3 --rope-positions explicit", 1),
        (" --kv-dtype fp8_e5m2", 1),
    ] {
        let o = fused_attn(&format!(
            "run --backend emu --op append --batch 2 --kv-heads {hkv} --seqlen-q 6 --seqlen-k 40 --head-dim {d} \
             --page-size 16 --json --seed 9 --dump {}{extra}",
            dir.display()
        ));
        assert_eq!(o.status.code(), Some(0), "{extra}: {}", stderr(&o));
        let r = &json_rows(&o)[0];
        assert_eq!((&r["op"], &r["passed"], &r["check"]), (&"append".into(), &true.into(), &"exact".into()), "{r}");
        let b = &r["counters"]["buffers"];
        let row_bytes = (n * hkv * d) as u64;
        assert_eq!((b["k"]["read"].as_u64(), b["v"]["read"].as_u64()), (Some(2 * row_bytes), Some(2 * row_bytes)), "{r}");
        assert_eq!(b["k"]["written"].as_u64(), Some(0), "{r}");
        assert_eq!(b["k_cache"]["written"].as_u64(), Some(cache_bytes * row_bytes), "{r}");
        assert_eq!(b["v_cache"]["written"].as_u64(), Some(cache_bytes * row_bytes), "{r}");
        assert_eq!(npy_header(&dir.join("slot_mapping.npy")), ("<i8".to_string(), vec![n]));
        if extra.contains("rope") {
            assert!(r["label"].as_str().unwrap_or_default().contains("rope="), "{r}");
            assert_eq!(npy_header(&dir.join("rope_positions.npy")), ("<i4".to_string(), vec![n]));
        }
        if extra == " --rope-theta 10000 --rotary-dim 32 --rope-style gptj" {
            // The default positions: each new token's place in its sequence, 34..39 for both.
            let bytes = std::fs::read(dir.join("rope_positions.npy")).unwrap();
            let pos: Vec<i32> =
                bytes[bytes.len() - 4 * n..].chunks(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect();
            assert_eq!(pos, [34, 35, 36, 37, 38, 39, 34, 35, 36, 37, 38, 39]);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    assert_one_line_error(&fused_attn("run --op append --softcap 30"), 2, "--softcap applies to");
}

/// Reads a .npy header: (descr, shape), and checks the file length against them.
fn npy_header(path: &Path) -> (String, Vec<usize>) {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&b[..8], b"\x93NUMPY\x01\x00", "{}", path.display());
    let hlen = u16::from_le_bytes([b[8], b[9]]) as usize;
    assert_eq!((10 + hlen) % 64, 0);
    let h = std::str::from_utf8(&b[10..10 + hlen]).unwrap();
    assert!(h.contains("'fortran_order': False"), "{h}");
    let descr = h.split("'descr': '").nth(1).unwrap().split('\'').next().unwrap().to_string();
    let shape_txt = h.split("'shape': (").nth(1).unwrap().split(')').next().unwrap();
    let shape: Vec<usize> =
        shape_txt.split(',').map(str::trim).filter(|s| !s.is_empty()).map(|s| s.parse().unwrap()).collect();
    let item = match descr.as_str() {
        "<f2" => 2,
        "<f4" | "<i4" => 4,
        "<i8" => 8,
        d => panic!("unexpected descr {d}"),
    };
    assert_eq!(b.len() - 10 - hlen, item * shape.iter().product::<usize>(), "{}", path.display());
    (descr, shape)
}

/// `run --op paged-prefill`: a passing JSON row with its shape, page size and split count, causal by
/// default (`--no-causal` bidirectional), over an FP8 cache (`--kv-dtype`), and its --dump files (of the
/// last, FP8 run: the stored values as float32 and the scales).
#[test]
fn run_emulated_paged_prefill_prints_a_passing_row_and_dumps() {
    let dir = std::env::temp_dir().join(format!("fa-runner-pp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let fp8 = "--num-splits 2 --kv-dtype fp8_e5m2 --kv-scale per-head";
    for (extra, causal) in [("--num-splits 2", true), ("--no-causal", false), (fp8, true)] {
        let o = fused_attn(&format!(
            "run --backend emu --op paged-prefill --batch 2 --heads 8 --kv-heads 2 --seqlen-q 5 --seqlen-k 300 \
             --head-dim 64 --page-size 16 {extra} --json --seed 3 --dump {}",
            dir.display()
        ));
        assert_eq!(o.status.code(), Some(0), "{extra}: {}", stderr(&o));
        let r = &json_rows(&o)[0];
        assert_eq!(
            (&r["op"], &r["passed"], &r["causal"]),
            (&"paged-prefill".into(), &true.into(), &causal.into()),
            "{r}"
        );
        assert_eq!((&r["seqlen_q"], &r["seqlen_k"], &r["page_size"]), (&5.into(), &300.into(), &16.into()), "{r}");
        if causal {
            assert_eq!(r["num_splits"], 2, "{r}");
        }
        let label = r["label"].as_str().unwrap_or_default();
        assert_eq!(extra == fp8, label.starts_with("fp8_e5m2 per-head"), "{r}");
    }
    for (name, descr, shape) in [
        ("q", "<f4", vec![2, 5, 8, 64]),
        ("out", "<f4", vec![2, 5, 8, 64]),
        ("lse", "<f4", vec![2, 8, 5]),
        ("k", "<f4", vec![2, 300, 2, 64]),
        ("k_cache", "<f4", vec![19 * 2 + 4, 16, 2, 64]),
        ("k_scale", "<f4", vec![2]),
        ("v_scale", "<f4", vec![2]),
        ("block_table", "<i4", vec![2, 19]),
        ("seq_lens", "<i4", vec![2]),
    ] {
        assert_eq!(npy_header(&dir.join(format!("{name}.npy"))), (descr.to_string(), shape), "{name}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `run --op mla-decode`: passing JSON rows over a 16-bit and an FP8 latent cache (MTP q_len 3, a forced
/// split), and the --dump files of the FP8 run (stored values as float32 and the one scale).
#[test]
fn run_emulated_mla_decode_prints_a_passing_row_and_dumps() {
    let dir = std::env::temp_dir().join(format!("fa-runner-mla-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for extra in ["--num-splits 2", "--kv-dtype fp8_e4m3 --dtype fp16"] {
        let o = fused_attn(&format!(
            "run --backend emu --op mla-decode --heads 16 --q-len 3 --seq-lens 70,20 --page-size 16 {extra} \
             --json --seed 4 --dump {}",
            dir.display()
        ));
        assert_eq!(o.status.code(), Some(0), "{extra}: {}", stderr(&o));
        let r = &json_rows(&o)[0];
        assert_eq!((&r["op"], &r["passed"], &r["heads_kv"]), (&"mla-decode".into(), &true.into(), &1.into()), "{r}");
        assert_eq!((&r["seqlen_q"], &r["seqlen_k"], &r["head_dim"]), (&3.into(), &70.into(), &576.into()), "{r}");
        assert_eq!(r["head_dim_v"], 512, "the latent rank: {r}");
        let fp8 = extra.contains("fp8");
        assert_eq!(r["kv_dtype"], if fp8 { "fp8_e4m3" } else { "bf16" }, "{r}");
        assert_eq!(r["label"].as_str().unwrap_or_default().contains("vs the 16-bit cache"), fp8, "{r}");
        if !fp8 {
            assert_eq!(r["num_splits"], 2, "{r}");
        }
    }
    for (name, descr, shape) in [
        ("q", "<f2", vec![6, 16, 576]),
        ("out", "<f2", vec![6, 16, 512]),
        ("lse", "<f4", vec![6, 16]),
        ("latent_cache", "<f4", vec![8, 16, 1, 576]),
        ("latent_scale", "<f4", vec![1]),
        ("block_table", "<i4", vec![2, 5]),
        ("seq_lens", "<i4", vec![2]),
        ("cu_seqlens_q", "<i4", vec![3]),
    ] {
        assert_eq!(npy_header(&dir.join(format!("{name}.npy"))), (descr.to_string(), shape), "{name}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dump_writes_every_tensor_as_npy() {
    let dir = std::env::temp_dir().join(format!("fa-runner-dump-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let p = dir.join("prefill");
    let o = fused_attn(&format!(
        "run --backend emu --op prefill --dtype fp16 --causal --batch 2 --heads 4 --kv-heads 2 --seqlen-q 50 \
         --seqlen-k 70 --head-dim 64 --json --dump {}",
        p.display()
    ));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    for (name, descr, shape) in [
        ("q", "<f2", vec![2, 50, 4, 64]),
        ("k", "<f2", vec![2, 70, 2, 64]),
        ("v", "<f2", vec![2, 70, 2, 64]),
        ("out", "<f2", vec![2, 50, 4, 64]),
        ("lse", "<f4", vec![2, 4, 50]),
    ] {
        assert_eq!(npy_header(&p.join(format!("{name}.npy"))), (descr.to_string(), shape), "{name}");
    }
    let d = dir.join("decode");
    let o = fused_attn(&format!(
        "run --backend emu --op decode --dtype bf16 --batch 3 --heads 8 --kv-heads 2 --seqlen-k 37 --head-dim 64 \
         --page-size 8 --json --dump {}",
        d.display()
    ));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // 37 tokens in pages of 8: 5 pages per sequence, a spare table column, the null page and two spares.
    for (name, descr, shape) in [
        ("q", "<f4", vec![3, 8, 64]),
        ("k", "<f4", vec![3, 37, 2, 64]),
        ("v", "<f4", vec![3, 37, 2, 64]),
        ("out", "<f4", vec![3, 8, 64]),
        ("lse", "<f4", vec![3, 8]),
        ("k_cache", "<f4", vec![18, 8, 2, 64]),
        ("v_cache", "<f4", vec![18, 8, 2, 64]),
        ("block_table", "<i4", vec![3, 6]),
        ("seq_lens", "<i4", vec![3]),
    ] {
        assert_eq!(npy_header(&d.join(format!("{name}.npy"))), (descr.to_string(), shape), "{name}");
    }
    // seq_lens holds the context length; the bf16 values are exactly representable (low 16 bits zero).
    let lens = std::fs::read(d.join("seq_lens.npy")).unwrap();
    assert_eq!(&lens[lens.len() - 12..], [37i32, 37, 37].map(i32::to_le_bytes).concat().as_slice());
    let q = std::fs::read(d.join("q.npy")).unwrap();
    assert!(q[128..].chunks(4).all(|c| c[0] == 0 && c[1] == 0));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn gpu_backend_without_a_gpu_names_what_is_missing() {
    if fused_attn::device::cuda_context(0).is_ok() {
        eprintln!("a GPU is present: the missing-GPU message is not checked here");
        return;
    }
    let o = fused_attn("run --backend gpu --seqlen-q 16");
    let err = stderr(&o);
    assert_ne!(o.status.code(), Some(0));
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("NoDriver error") || err.contains("NoDevice error") || err.contains("Arch error"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // `auto` falls back to the emulator.
    let o = fused_attn("run --backend auto --seqlen-q 16 --heads 2 --head-dim 64 --json");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(json_rows(&o)[0]["backend"], "emu");
    assert!(stderr(&o).contains("--backend auto: no usable GPU") && stderr(&o).contains("using emu"), "{}", stderr(&o));
}

#[test]
fn quick_emulated_report_is_all_passing_json() {
    let dir = std::env::temp_dir().join(format!("fa-runner-plot-{}", std::process::id()));
    let o = fused_attn(&format!("report --backend emu --quick --json --plot {}", dir.display()));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let rows = json_rows(&o);
    assert!(rows.len() >= 10, "{} rows", rows.len());
    for r in &rows {
        assert_eq!(r["passed"], true, "{r}");
        assert_eq!(r["ms"], Json::Null);
    }
    for op in ["prefill", "decode", "paged-prefill"] {
        assert!(rows.iter().any(|r| r["op"] == op), "no {op} rows");
    }
    // The cache's element type on the cache ops' rows (their 16-bit dtype, or an FP8 format: both
    // appear); none on prefill rows; no comparison rows off a GPU.
    for r in &rows {
        let kv = r["kv_dtype"].as_str();
        if r["op"] == "prefill" {
            assert_eq!(kv, None, "{r}");
        } else {
            assert!(kv == r["dtype"].as_str() || kv.is_some_and(|k| k.starts_with("fp8_e")), "{r}");
        }
        assert_eq!((&r["baseline"], &r["vs_baseline"]), (&Json::Null, &Json::Null), "{r}");
    }
    assert!(rows.iter().any(|r| r["kv_dtype"].as_str().is_some_and(|k| k.starts_with("fp8"))), "no FP8 rows");
    // No timed rows on the emulator: no plots, and a note saying so and what to do instead.
    assert!(!dir.join("prefill.png").exists());
    assert!(stderr(&o).contains("no plots") && stderr(&o).contains("plots need a GPU run"), "{}", stderr(&o));
    assert!(stderr(&o).contains(&format!("{} passed / 0 failed", rows.len())), "{}", stderr(&o));
}

/// Width, height of a PNG from its IHDR chunk, after checking the signature.
fn png_size(path: &Path) -> (u32, u32, usize) {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&b[..8], b"\x89PNG\r\n\x1a\n", "{}", path.display());
    assert_eq!(&b[12..16], b"IHDR");
    let be = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap());
    (be(16), be(20), b.len())
}

#[test]
fn plot_renders_the_recorded_report() {
    let dir = std::env::temp_dir().join(format!("fa-runner-fixture-plot-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/report-illustrative.jsonl");
    let o = fused_attn(&format!("plot {} --out {} --matmul-tflops 650", fixture.display(), dir.display()));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    for name in ["prefill.png", "decode.png"] {
        let (w, h, bytes) = png_size(&dir.join(name));
        assert_eq!((w, h), (1800, 1000), "{name}");
        // A blank or text-free chart compresses to a few kB; the real one with its curves and text is larger.
        assert!(bytes > 60_000, "{name}: only {bytes} bytes");
        assert!(stdout(&o).contains(name), "{}", stdout(&o));
    }
    // A line that is not a row is an error naming the file and line.
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"op\":\"prefill\"}\n{\"op\": 3}\n").unwrap();
    assert_one_line_error(&fused_attn(&format!("plot {} --out {}", bad.display(), dir.display())), 2, "bad.jsonl:2");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--head-dim-v` on the paged ops (issue 27, DeepSeek's Dqk 192 / Dv 128): decode (16-bit and FP8 caches,
/// split), paged prefill (both kernels) and append pass (against the fp64 reference; append bit for bit),
/// their rows' head_dim_v and labels name Dv, their measured/model byte ratios are 1 (K of Dqk, V and O of Dv columns), and
/// --dump writes q, k and k_cache of 192 columns, v, v_cache and out of 128. A Dv no kernel takes is a
/// typed error naming v_cache (exit 1); MLA takes none (exit 2).
#[test]
fn paged_ops_take_a_v_head_dim_of_their_own() {
    let dir = std::env::temp_dir().join(format!("fa-runner-dv-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let dims = "--head-dim 192 --head-dim-v 128 --heads 8 --kv-heads 2 --page-size 16";
    for (name, args) in [
        ("decode", "--op decode --seq-lens 300,17 --num-splits 2"),
        ("decode-fp8", "--op decode --seq-lens 300,17 --kv-dtype fp8_e4m3 --kv-scale per-head"),
        ("tiled", "--op paged-prefill --batch 2 --seqlen-q 2 --seqlen-k 100 --paged-kernel tiled"),
        ("streaming", "--op paged-prefill --batch 2 --seqlen-q 2 --seqlen-k 100 --paged-kernel streaming"),
        ("append", "--op append --batch 2 --seqlen-q 6 --seqlen-k 40"),
    ] {
        let dims = if name == "append" { dims.replace("--heads 8 ", "") } else { dims.to_string() };
        let o =
            fused_attn(&format!("run --backend emu {args} {dims} --json --seed 7 --dump {}", dir.join(name).display()));
        assert_eq!(o.status.code(), Some(0), "{name}: {}", stderr(&o));
        let r = &json_rows(&o)[0];
        assert_eq!(
            (&r["passed"], &r["head_dim"], &r["head_dim_v"]),
            (&true.into(), &192.into(), &128.into()),
            "{name}: {r}"
        );
        assert!(r["label"].as_str().unwrap_or_default().contains("Dv=128"), "{name}: {r}");
        let ratios = r["counters"]["model_ratios"].as_object().unwrap_or_else(|| panic!("{name}: {r}"));
        assert!(ratios.contains_key("v_read") && ratios.contains_key("k_read"), "{name}: {ratios:?}");
        for (k, v) in ratios {
            let v = v.as_f64().unwrap();
            assert!(if k == "read_vs_budget" { v <= 1.0 } else { v == 1.0 }, "{name}: model ratio {k} = {v}");
        }
    }
    // 300 and 17 tokens in pages of 16: 19 + 2 pages, the null page and two spares; a spare table column.
    let (d, pp, ap) = (dir.join("decode"), dir.join("tiled"), dir.join("append"));
    for (path, name, shape) in [
        (&d, "q", vec![2, 8, 192]),
        (&d, "out", vec![2, 8, 128]),
        (&d, "k", vec![2, 300, 2, 192]),
        (&d, "v", vec![2, 300, 2, 128]),
        (&d, "k_cache", vec![24, 16, 2, 192]),
        (&d, "v_cache", vec![24, 16, 2, 128]),
        (&d, "block_table", vec![2, 20]),
        // 2 x 100 tokens: 7 pages each, the null page and three spares.
        (&pp, "q", vec![2, 2, 8, 192]),
        (&pp, "out", vec![2, 2, 8, 128]),
        (&pp, "lse", vec![2, 8, 2]),
        (&pp, "k", vec![2, 100, 2, 192]),
        (&pp, "v", vec![2, 100, 2, 128]),
        (&pp, "k_cache", vec![18, 16, 2, 192]),
        (&pp, "v_cache", vec![18, 16, 2, 128]),
        // 12 new tokens into 2 x 3 pages and a spare.
        (&ap, "k", vec![12, 2, 192]),
        (&ap, "v", vec![12, 2, 128]),
        (&ap, "k_cache", vec![7, 16, 2, 192]),
        (&ap, "v_cache", vec![7, 16, 2, 128]),
    ] {
        let descr = if name == "block_table" { "<i4" } else { "<f4" };
        assert_eq!(npy_header(&path.join(format!("{name}.npy"))), (descr.to_string(), shape), "{name}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert_one_line_error(
        &fused_attn("run --backend emu --op decode --head-dim 192 --head-dim-v 100 --seqlen-k 20"),
        1,
        "v_cache",
    );
    assert_one_line_error(&fused_attn("run --op mla-decode --head-dim-v 128"), 2, "--head-dim-v applies to");
}
