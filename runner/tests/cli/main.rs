//! The runner's end-to-end tests, one binary: the `fused-attn` command line (`runner`) and the GPU bundle's
//! parts that can be checked without a GPU (`bundle`: run.sh against this runner).

mod bundle;
mod runner;
