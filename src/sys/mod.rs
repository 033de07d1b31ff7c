//! Raw bindings to kernels/include/fa/abi.h: abi.rs is bindgen's output, committed so that building needs no
//! libclang; tests/abi_bindings.rs regenerates it and fails when it is stale (`FA_BLESS=1` rewrites it).
//! Nothing here is hand-written; the safe layers above are the only callers.
#![allow(non_upper_case_globals, non_camel_case_types, non_snake_case, dead_code, clippy::all)]

include!("abi.rs");
