//! The GPU bundle's parts that can be checked without a GPU (CI): run.sh, pointed at this machine, fails
//! fast with a clear message, a distinct exit code and a results directory holding that message; it never
//! passes on a machine that only pretends to have a GPU; tools/torch_compare.py parses and formats rows.
//! run.sh runs from the source tree (scripts/bundle-run.sh) against the runner cargo built for these tests,
//! so CI does not build the bundle a second time.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// The repository root (this package is runner/ in it).
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("runner/ has a parent").to_path_buf()
}

/// A fresh scratch directory under cargo's per-target tmp dir.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bundle-tests").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs scripts/bundle-run.sh with `env`; returns its output and how long it took.
fn run_sh(results: &Path, env: &[(&str, &str)]) -> (Output, Duration) {
    let mut cmd = Command::new("bash");
    cmd.arg(root().join("scripts/bundle-run.sh"))
        .env("RESULTS_DIR", results)
        .env("FA_RUNNER", env!("CARGO_BIN_EXE_fused-attn"))
        .env_remove("FA_RUN_SH_INNER");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let t = Instant::now();
    let out = cmd.output().expect("bash runs");
    (out, t.elapsed())
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// The last non-empty line run.sh printed (the summary's "total:" line must come last).
fn last_line(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").to_string()
}

fn this_machine_has_a_gpu() -> bool {
    fused_attn::device::cuda_context(0).is_ok()
}

#[test]
fn run_sh_fails_fast_without_a_gpu() {
    if this_machine_has_a_gpu() {
        eprintln!("skipped: this machine has a GPU, so run.sh would not take its no-GPU path");
        return;
    }
    let results = scratch("no-gpu").join("results"); // run.sh must create it
    let (out, took) = run_sh(&results, &[]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(2), "run.sh should exit 2 (no GPU):\n{all}");
    assert!(took < Duration::from_secs(10), "run.sh took {took:?} to notice there is no GPU:\n{all}");
    assert!(all.contains("run.sh: NO GPU: "), "no clear message:\n{all}");
    assert!(all.contains("NVIDIA GPU (sm_80 or newer) and driver >= 580"), "{all}");
    let log = std::fs::read_to_string(results.join("log.txt")).expect("log.txt in RESULTS_DIR");
    assert!(log.contains("run.sh: NO GPU: "), "the message is not in log.txt:\n{log}");
    let summary = std::fs::read_to_string(results.join("summary.txt")).expect("summary.txt in RESULTS_DIR");
    assert!(summary.contains("preflight") && summary.contains("FAIL") && summary.contains("exit 2"), "{summary}");
    assert!(last_line(&out).starts_with("total:"), "the summary is not printed last:\n{all}");
}

/// nvidia-smi answers and a libcuda file exists, but there is no GPU: whatever step notices first, the run
/// must fail (exit 2 from the runner probe, or 1 from the GPU tests), quickly, and still print its summary.
#[test]
fn run_sh_never_passes_on_a_pretend_gpu() {
    if this_machine_has_a_gpu() {
        eprintln!("skipped: this machine has a GPU");
        return;
    }
    let dir = scratch("pretend-gpu");
    let (bin, lib, bundle) = (dir.join("bin"), dir.join("lib"), dir.join("bundle"));
    for d in [&bin, &lib, &bundle] {
        std::fs::create_dir_all(d).unwrap();
    }
    let smi = bin.join("nvidia-smi");
    std::fs::write(
        &smi,
        "#!/bin/sh\ncase \"$*\" in\n  -L) echo 'GPU 0: NVIDIA Pretend (UUID: GPU-0)';;\n  \
         *driver_version*) echo 580.00;;\n  *compute_cap*) echo 9.0;;\n  *name*) echo 'NVIDIA Pretend';;\n  \
         *) echo pretend;;\nesac\n",
    )
    .unwrap();
    std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(lib.join("libcuda.so.1"), b"").unwrap(); // found by the file check, not loadable
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let results = dir.join("results");
    let (out, took) = run_sh(
        &results,
        &[
            ("PATH", &path),
            ("LD_LIBRARY_PATH", lib.to_str().unwrap()),
            ("BUNDLE_DIR", bundle.to_str().unwrap()),
            ("FA_BUNDLE_BUDGET_S", "60"),
        ],
    );
    let all = text(&out);
    let code = out.status.code();
    assert!(code == Some(1) || code == Some(2), "run.sh must fail without a real GPU, got {code:?}:\n{all}");
    assert!(took < Duration::from_secs(60), "took {took:?}:\n{all}");
    assert!(last_line(&out).starts_with("total:"), "the summary is not printed last:\n{all}");
    assert!(results.join("summary.txt").is_file() && results.join("log.txt").is_file());
}

#[test]
fn run_sh_reports_an_incomplete_bundle() {
    let dir = scratch("incomplete");
    let (out, _) = run_sh(&dir.join("results"), &[("FA_RUNNER", "/nonexistent/fused-attn")]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(text(&out).contains("bundle incomplete"), "{}", text(&out));
}

#[test]
fn scripts_parse() {
    for s in ["scripts/bundle-run.sh", "scripts/gpu-bundle"] {
        let out = Command::new("bash").arg("-n").arg(root().join(s)).output().expect("bash runs");
        assert!(out.status.success(), "{s}: {}", text(&out));
    }
}

#[test]
fn torch_compare_self_test() {
    let Ok(out) = Command::new("python3").arg(root().join("tools/torch_compare.py")).arg("--self-test").output() else {
        eprintln!("skipped: python3 not found");
        return;
    };
    assert!(out.status.success(), "torch_compare.py --self-test failed:\n{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("torch_compare self-test: ok"));
}

/// The bundle must ship (and its gpu-tests step run) the poisoned-memory tests: scripts/gpu-bundle requires
/// them, and tests/it/poison.rs has GPU twins (named gpu_*, the bundle's selection) of its emulated tests.
#[test]
fn bundle_runs_the_poisoned_memory_tests() {
    let script = std::fs::read_to_string(root().join("scripts/gpu-bundle")).unwrap();
    assert!(script.contains("for required in poison::gpu_"), "scripts/gpu-bundle does not require the poison tests");
    let tests = std::fs::read_to_string(root().join("tests/it/poison.rs")).unwrap();
    for twin in ["gpu_dense_prefill_window_edges", "gpu_paged_prefill_window_edges", "gpu_decode_hidden_slots"] {
        assert!(tests.contains(twin), "tests/it/poison.rs lost {twin}");
    }
}
