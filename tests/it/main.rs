//! The integration tests, one binary (one link instead of one per file): each module is what was a file
//! of tests/, named as before, so `cargo test --release --test it -- decode::` runs what `--test decode`
//! did. tests/emulator.rs and tests/candle.rs (feature `candle`) stay binaries of their own; the runner's
//! end-to-end tests and the GPU bundle's no-GPU checks are the runner package's (runner/tests/cli).

mod common;

mod abi_bindings;
mod append;
mod archs;
// The `cuda` build's fatbins (SASS per target, kernel lists, ptxas report).
#[cfg(feature = "cuda")]
mod build_artifacts;
mod cost;
mod decode;
mod downstream;
mod exact;
mod fp8;
mod fp8_scales;
mod gpu_graph;
mod gpu_raw;
mod gpu_streams;
mod gpu_vs_emulator;
mod hopper;
mod linking;
mod merge;
mod mla;
mod module_graph;
mod mutants;
mod page_sizes;
mod paged_prefill;
mod paged_schedule;
mod paged_v_head_dim;
mod plan;
mod poison;
mod prefill;
mod prefill_sm90;
mod prefill_sm90_dv;
mod rope;
mod rope_prefill;
mod rope_prefill_k;
mod rope_prefill_sm90;
mod safety;
mod schedule;
mod tile_policy;
mod validation_prop;
mod variants;
mod variants_long;
