//! The integration tests, one binary (one link instead of one per file): each module is what was a file
//! of tests/, named as before, so `cargo test --release --test it -- decode::` runs what `--test decode`
//! did. tests/emulator.rs, tests/linking.rs (also run by the emulator-only build), tests/candle.rs (feature
//! `candle`) and tests/build_artifacts.rs (the `cuda` build's fatbins and runner) stay binaries of their own.

mod common;

mod abi_bindings;
mod append;
mod bundle;
mod cost;
mod decode;
mod downstream;
mod exact;
mod fp8;
mod gpu_graph;
mod gpu_raw;
mod gpu_streams;
mod gpu_vs_emulator;
mod hopper;
mod merge;
mod module_graph;
mod paged_prefill;
mod plan;
mod poison;
mod prefill;
mod prefill_sm90;
mod runner;
mod schedule;
mod variants;
mod variants_long;
