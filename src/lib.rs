//! fused-attn: hand-written CUDA fused self-attention kernels for Rust inference engines.
//!
//! Layers (bottom to top): kernels/ (CUDA C++ through one intrinsics layer, also compiled for the host
//! emulator) → `sys` (bindgen of kernels/include/fa/abi.h) → `launch` (the only place raw pointers are
//! taken) → the safe ops over [`TensorView`]s on a [`Stream`] (GPU or emulator). `reference` is the fp64
//! CPU reference the tests (and downstream suites) compare against.
pub mod build_info;
pub mod device;
pub mod dtype;
pub mod emu;
#[doc(hidden)]
pub mod emu_selftest;
pub mod error;
mod launch;
pub mod prefill;
pub mod reference;
pub mod sys;
pub mod tensor;
pub mod timing;

pub use device::Stream;
pub use dtype::{DType, Element};
pub use emu::Emulator;
pub use error::{Error, ErrorKind, Result};
pub use tensor::{TensorView, TensorViewMut};
