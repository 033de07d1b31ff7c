//! fused-attn: hand-written CUDA fused self-attention kernels for Rust inference engines.
pub mod dtype;
pub mod error;
pub mod sys;

pub use dtype::{DType, Element};
pub use error::{Error, ErrorKind, Result};
