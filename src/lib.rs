//! fused-attn: hand-written CUDA fused self-attention kernels for Rust inference engines.
pub mod dtype;
pub(crate) mod emu;
#[doc(hidden)]
pub mod emu_selftest;
pub mod error;
pub mod sys;

pub use dtype::{DType, Element};
pub use error::{Error, ErrorKind, Result};
