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
