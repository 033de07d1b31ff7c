//! Shared test support: GPU discovery that skips visibly.
#![allow(dead_code)]

use std::io::Write;
use std::sync::Arc;

use cudarc::driver::CudaContext;

/// The first GPU, or `None` after recording `test` as skipped: the name goes to stderr and to the file named
/// by FA_SKIP_LOG (scripts/test counts and lists them). With FA_REQUIRE_GPU=1 (the GPU bundle) a missing GPU
/// fails the test instead.
pub fn gpu_or_skip(test: &str) -> Option<Arc<CudaContext>> {
    match fused_attn::device::cuda_context(0) {
        Ok(ctx) => Some(ctx),
        Err(e) => {
            if std::env::var("FA_REQUIRE_GPU").is_ok_and(|v| v == "1") {
                panic!("{test}: a GPU is required (FA_REQUIRE_GPU=1) but none is usable: {e}");
            }
            eprintln!("skipped: no GPU: {test} ({e})");
            if let Ok(path) = std::env::var("FA_SKIP_LOG") {
                if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
                    let _ = writeln!(f, "{test}");
                }
            }
            None
        }
    }
}

/// The run's base seed: FA_SEED (decimal or 0x hex) if set, else the fixed default, so two runs of the suite
/// use the same inputs (see `fused_attn::seed`).
pub fn base_seed() -> u64 {
    fused_attn::seed::base_seed()
}

/// The seed of case `index` of a sweep (derived from the base seed).
pub fn case_seed(index: usize) -> u64 {
    fused_attn::seed::case_seed(base_seed(), index as u64)
}

/// FA_CASE (a comma-separated list of case indices) restricts a sweep to those cases, to rerun one failure;
/// unset, every case runs.
pub fn case_selected(index: usize) -> bool {
    match std::env::var("FA_CASE") {
        Ok(list) => list.split(',').any(|x| x.trim().parse() == Ok(index)),
        Err(_) => true,
    }
}

/// The one-line command that reruns test `test` of `tests/<file>.rs` with this run's base seed (and only
/// case `case` of its sweep, when given).
pub fn rerun(file: &str, test: &str, case: Option<usize>) -> String {
    let case = case.map(|i| format!("FA_CASE={i} ")).unwrap_or_default();
    format!("rerun: FA_SEED={:#x} {case}cargo test --release --test {file} -- {test} --exact", base_seed())
}
