//! The runtime layer, bottom to top like cudarc's levels: `sys` (bindgen of the C ABI) → `launch` (the only
//! place raw pointers are taken: a call's buffers checked against its backend) and `kernels` (the embedded
//! fatbins, loaded per CUDA context; recorded launches enqueued through the driver API) or `emu` (the host
//! emulator running the same launch plan) → `device` (the [`Stream`](device::Stream) a call runs on, GPU
//! probing) and what the launches report (`counters`) or need (`tensor_map`, the sm_90a TMA descriptors).
//! It knows nothing of the ops above it; the crate root re-exports its modules under their short paths.

pub mod counters;
pub mod device;
pub mod emu;
pub(crate) mod kernels;
pub(crate) mod launch;
#[doc(hidden)]
pub mod sys;
pub mod tensor_map;
