//! fused-attn: hand-written CUDA fused self-attention kernels for Rust inference engines.
//!
//! Layers (bottom to top): kernels/ (CUDA C++ through one intrinsics layer: fatbins for the GPU, and the
//! same sources as host C++ for the emulator and the launchers) → `sys` (bindgen of
//! kernels/include/fa/abi.h) → `launch` (the only place raw pointers are taken) and `kernels` (fatbins loaded
//! per context, launches through the driver API) → the safe ops over [`TensorView`]s on a [`Stream`] (a
//! cudarc stream, a raw `CUstream`, or the emulator). `reference` is the fp64
//! CPU reference the tests (and downstream suites) compare against. `testkit` (feature `testkit`, off by
//! default) is what verifies rather than ships: fixtures, case harnesses, timing, the cost model and the
//! emulator's self-test kernels.
//!
//! ```
//! use fused_attn::{prefill::{prefill, PrefillOptions}, Emulator, Stream, TensorView, TensorViewMut};
//! use half::bf16;
//!
//! // B=1, T=32, 4 query heads sharing 2 KV heads, D=64, on the host emulator (a GPU run differs only in
//! // the stream, `Stream::Gpu(&cuda_stream)`, and the views, `TensorView::gpu(slice.as_view(), shape)`).
//! let (b, t, hq, hkv, d) = (1, 32, 4, 2, 64);
//! let q: Vec<bf16> = (0..b * t * hq * d).map(|i| bf16::from_f32((i % 7) as f32 * 0.1)).collect();
//! let kv: Vec<bf16> = (0..b * t * hkv * d).map(|i| bf16::from_f32((i % 5) as f32 * 0.1)).collect();
//! let mut o = vec![bf16::ZERO; b * t * hq * d];
//! let mut lse = vec![0f32; b * hq * t];
//! let emu = Emulator::new();
//! prefill(
//!     &Stream::Emu(&emu),
//!     &TensorView::host(&q, [b, t, hq, d])?,
//!     &TensorView::host(&kv, [b, t, hkv, d])?,
//!     &TensorView::host(&kv, [b, t, hkv, d])?,
//!     &mut TensorViewMut::host(&mut o, [b, t, hq, d])?,
//!     Some(&mut TensorViewMut::host(&mut lse, [b, hq, t])?),
//!     &PrefillOptions { causal: true, ..Default::default() },
//! )?;
//! // Row 0 of a causal mask sees only key 0: its output is V's row 0 of KV head 0.
//! assert_eq!(o[..d], kv[..d]);
//! # Ok::<(), fused_attn::Error>(())
//! ```
pub mod append;
pub mod build_info;
#[cfg(feature = "candle")]
pub mod candle;
pub mod decode;
pub mod dtype;
pub mod error;
pub mod fast_divmod;
pub mod fp8;
pub mod head_dim;
pub mod mask;
pub mod merge;
pub mod mla;
pub mod paged;
pub mod paged_prefill;
pub mod plan;
pub mod prefill;
pub mod reference;
pub mod rope;
pub mod runtime;
pub mod schedule;
pub mod score_mod;
pub mod tensor;
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod tile;

// The runtime layer's modules keep their crate-root paths (`fused_attn::device`, `crate::launch`, ...).
pub use runtime::{counters, device, emu, sys, tensor_map};
pub(crate) use runtime::{kernels, launch};

/// The `half` and `cudarc` versions this crate's API uses (bf16/f16 elements, streams and views).
pub use cudarc;
pub use half;

pub use counters::{KernelCounters, LaunchCounters};
pub use device::{RawStream, Stream};
pub use dtype::{DType, Element};
pub use emu::{Emulator, TableChecks};
pub use error::{Error, ErrorKind, Result};
pub use fp8::{Fp8E4m3, Fp8E5m2, Fp8Format, KvCacheOf, KvDType, KvElement, KvScales, ScaleKind, ScaleTensors};
pub use tensor::{TensorView, TensorViewMut};

pub use append::{append, append_with, AppendOptions};
pub use decode::{decode, DecodeOptions, DecodeWorkspace};
pub use merge::{merge_states, merge_states_with_sinks};
pub use mla::{latent_cache, latent_cache_fp8, mla_append, mla_decode, MlaAppendOptions, MlaDecodeOptions};
pub use mla::{MlaDims, MlaPlan, MlaQueries};
pub use paged::{PagedKvCache, PagedKvCacheMut};
pub use paged_prefill::{paged_prefill, PagedPrefillKernel, PagedPrefillOptions, PagedPrefillWorkspace};
pub use plan::{DecodePlan, DecodeProblem};
pub use rope::{Rope, RopeConfig, RopeKeys, RopeScaling, RopeStyle, RopeTable};
pub use schedule::{DecodeSchedule, SplitPolicy};
pub use score_mod::{AlibiSlopes, ScoreMod};

/// Every Rust snippet of the README and of docs/ compiles (and the ones not marked `no_run` run) as a
/// doctest.
#[cfg(doctest)]
mod doc_pages {
    #[doc = include_str!("../README.md")]
    pub struct Readme;
    #[doc = include_str!("../docs/usage.md")]
    pub struct Usage;
    #[doc = include_str!("../docs/integration.md")]
    pub struct Integration;
    #[doc = include_str!("../docs/runner.md")]
    pub struct Runner;
    #[doc = include_str!("../docs/build.md")]
    pub struct Build;
    #[doc = include_str!("../docs/correctness.md")]
    pub struct Correctness;
    #[doc = include_str!("../docs/performance.md")]
    pub struct Performance;
    #[doc = include_str!("../docs/scheduling.md")]
    pub struct Scheduling;
    #[doc = include_str!("../docs/semantics.md")]
    pub struct Semantics;
    #[doc = include_str!("../docs/emulator.md")]
    pub struct Emulator;
    #[doc = include_str!("../docs/architecture.md")]
    pub struct Architecture;
    #[doc = include_str!("../docs/mla.md")]
    pub struct Mla;
}
