//! Raw bindings to kernels/include/fa/abi.h (and, with `testkit`, to the self-test kernels' selftest_abi.h):
//! abi.rs and selftest_abi.rs are bindgen's output, committed so that building needs no libclang;
//! written by scripts/bless-abi (tools/abi-bindgen), stamped with their headers' digests, which
//! tests/it/abi_bindings.rs checks (a header changed since, or a hand edit, fails it).
//! Nothing here is hand-written; the safe layers above are the only callers.
#![allow(non_upper_case_globals, non_camel_case_types, non_snake_case, dead_code, clippy::all)]

include!("abi.rs");

/// The self-test kernels' ABI, beside abi.h's items (which it names).
#[cfg(feature = "testkit")]
pub mod selftest {
    pub use super::*;
    include!("selftest_abi.rs");
}
