//! fused-attn as candle ops over `candle_core::Tensor` (feature `candle`): a drop-in for candle-flash-attn's
//! [`flash_attn`] / [`flash_attn_varlen`] (same arguments, shapes and `CustomOp3` form), plus the paged-cache
//! ops an engine's decode loop needs: [`paged_append`], [`paged_decode`] and [`merge_states`], MLA's
//! [`mla_decode`] (docs/mla.md); with fused
//! rotary embeddings ([`CandleRope`], docs/rope.md): [`paged_append_rope`], [`paged_decode_rope`], and q
//! and k rotated in prefill ([`flash_attn_rope`], [`flash_attn_varlen_rope`], k with a [`KeyRope`]).
//!
//! - **CUDA tensors** (feature `candle-cuda`): the GPU kernels on candle's stream, reading candle's
//!   `CudaSlice`s in place and writing new ones; no copies, no synchronisation.
//! - **CPU tensors**: the same kernel sources on the host emulator ([`emulator`]), reading candle's `Vec`s in
//!   place. Slow, exact, and what CI tests the integration with: both backends accept the same layouts
//!   (unit innermost stride, 16-byte aligned rows, no broadcast dimensions; anything else is an error
//!   naming the argument — call `.contiguous()` first).
//!
//! Errors are `candle_core::Error`s whose message starts with fused-attn's [`crate::ErrorKind`]
//! (`"Shape error: q: ..."`), through `impl From<fused_attn::Error> for candle_core::Error`.
//!
//! The paged cache of one layer is one tensor `kv_cache [2, num_pages, page_size, Hkv, D]` (K pages, then V
//! pages: vLLM's flash-attention layout), f16 or bf16, any page size >= 1 (`paged::MAX_PAGE_SIZE`). Index tensors
//! (`block_table`, `seq_lens`, `seqlens_q/k`) are int32 (`DType::I32`, or `U32` read as int32, as
//! candle-flash-attn takes them); `slot_mapping` is `DType::I64`.

mod bridge;
mod variants;

pub use variants::Variants;

use std::sync::OnceLock;

use candle_core::op::BackpropOp;
use candle_core::{CpuStorage, CustomOp3, DType, Device, InplaceOp3, Layout, Shape, Storage, Tensor};

use crate::append::{append_with, AppendOptions};
use crate::decode::{decode, DecodeOptions, DecodeWorkspace};
use crate::dtype::{Fp8E4m3, Fp8E5m2, Fp8Format};
use crate::emu::Emulator;
use crate::error::Error;
use crate::paged::{PagedKvCache, PagedKvCacheMut};
use crate::plan::DecodeProblem;
use crate::prefill::{prefill, prefill_varlen, PrefillOptions};
use crate::rope::{Rope, RopeConfig, RopeStyle};
use crate::tensor::TensorView;
use bridge::{dims, kv_halves, same_storage, Backing, Fill};

impl From<Error> for candle_core::Error {
    /// Keeps the kind and the argument's name in the message (`"Shape error: q: ..."`).
    fn from(e: Error) -> Self {
        candle_core::Error::wrap(e)
    }
}

/// The emulator every op on CPU tensors runs on (one per process; its counters are per thread).
pub fn emulator() -> &'static Emulator {
    static EMULATOR: OnceLock<Emulator> = OnceLock::new();
    EMULATOR.get_or_init(Emulator::new)
}

/// Runs `$body` with `$T` the attention element type of `$dtype` (f16 or bf16).
macro_rules! attention_dtype {
    ($name:expr, $dtype:expr, |$T:ident| $body:block) => {
        match $dtype {
            DType::F16 => {
                type $T = half::f16;
                $body
            }
            DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            other => Err(Error::unsupported($name, format!("dtype {other:?} (attention takes f16 or bf16)")).into()),
        }
    };
}

/// Runs `$body` with `$S` the storage type of the candle backend `$storage` is on.
macro_rules! backend_of {
    ($name:expr, $storage:expr, |$S:ident| $body:block) => {
        match $storage {
            Storage::Cpu(_) => {
                type $S = CpuStorage;
                $body
            }
            #[cfg(feature = "candle-cuda")]
            Storage::Cuda(_) => {
                type $S = candle_core::CudaStorage;
                $body
            }
            other => Err(Error::backend(
                $name,
                format!(
                    "{:?} tensors are not supported (CPU tensors run on the emulator; CUDA tensors need the \
                     candle-cuda feature)",
                    other.device().location()
                ),
            )
            .into()),
        }
    };
}

/// Dense prefill attention as a candle op (candle-flash-attn's `FlashAttn`; its window / ALiBi / softcap
/// options, and sinks, are [`Variants`]).
pub struct FlashAttn {
    pub softmax_scale: f32,
    pub causal: bool,
    pub variants: Variants,
    /// RoPE on q ([`flash_attn_rope`]), `None`: q taken as already rotated.
    pub rope: Option<PrefillRope>,
}

/// RoPE in the prefill ops: the table, and int32 positions of q (one per query token: `[B·Tq]` dense,
/// `[total_q]` varlen), or `None` for each row's bottom-right position `i + Tk − Tq` (docs/rope.md); with
/// `k`, K rotated too.
#[derive(Clone, Debug)]
pub struct PrefillRope {
    pub rope: CandleRope,
    pub positions: Option<Tensor>,
    /// RoPE on K ([`KeyRope`]), `None`: K taken as already rotated.
    pub k: Option<KeyRope>,
}

/// RoPE on K in the prefill ops ([`crate::RopeKeys`]): key j of sequence b rotated with the q table at
/// `positions` (int32, one per key token: `[B·Tk]` dense, `[total_k]` varlen) or, with `None`, at j.
#[derive(Clone, Debug, Default)]
pub struct KeyRope {
    pub positions: Option<Tensor>,
}

/// Runs `f` with the prefill options of a call on backend `S`: its mask and scale, the score variants of
/// `variants` and the RoPE of `rope` (as views on that backend).
fn with_prefill_options<S: Backing, R>(
    variants: &Variants,
    rope: Option<&PrefillRope>,
    causal: bool,
    scale: f32,
    f: impl FnOnce(&PrefillOptions<'_>) -> candle_core::Result<R>,
) -> candle_core::Result<R> {
    variants.with_score_mod::<S, _>(|score_mod| {
        let opts = PrefillOptions { causal, scale: Some(scale), score_mod, ..Default::default() };
        match rope {
            None => f(&opts),
            Some(r) => r.rope.with_rope::<S, _>(r.positions.as_ref(), |rope| {
                let opts = PrefillOptions { rope: Some(rope), ..opts };
                let Some(keys) = &r.k else { return f(&opts) };
                let pos = keys.positions.as_ref().map(|t| t.storage_and_layout());
                let pos_view = match &pos {
                    Some((st, l)) => Some(S::of(st, "rope_k_positions")?.index_view::<1>("rope_k_positions", l)?),
                    None => None,
                };
                f(&PrefillOptions { rope_k: Some(crate::RopeKeys { positions: pos_view.as_ref() }), ..opts })
            }),
        }
    })
}

impl FlashAttn {
    fn fwd<S: Backing>(
        &self,
        q: &S,
        q_l: &Layout,
        k: &S,
        k_l: &Layout,
        v: &S,
        v_l: &Layout,
    ) -> candle_core::Result<(S, Shape)> {
        attention_dtype!("q", q.dtype(), |T| {
            let backend = q.backend();
            let (q, k, v) = (q.view::<T, 4>("q", q_l)?, k.view::<T, 4>("k", k_l)?, v.view::<T, 4>("v", v_l)?);
            // o: q's rows, v's head dim (a V head dim of its own: DeepSeek's 192 / 128).
            let [b, tq, hq, _] = q.shape();
            let shape = [b, tq, hq, v.dim(3)];
            let mut o = backend.alloc::<T>(shape.iter().product(), Fill::Poison)?;
            let (causal, scale) = (self.causal, self.softmax_scale);
            with_prefill_options::<S, _>(&self.variants, self.rope.as_ref(), causal, scale, |opts| {
                Ok(prefill(&backend.stream(), &q, &k, &v, &mut o.view(shape)?, None, opts)?)
            })?;
            Ok((S::from_out(o)?, Shape::from(shape.to_vec())))
        })
    }
}

impl CustomOp3 for FlashAttn {
    fn name(&self) -> &'static str {
        "fused-attn-prefill"
    }
    fn cpu_fwd(
        &self,
        q: &CpuStorage,
        q_l: &Layout,
        k: &CpuStorage,
        k_l: &Layout,
        v: &CpuStorage,
        v_l: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        self.fwd(q, q_l, k, k_l, v, v_l)
    }
    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(
        &self,
        q: &candle_core::CudaStorage,
        q_l: &Layout,
        k: &candle_core::CudaStorage,
        k_l: &Layout,
        v: &candle_core::CudaStorage,
        v_l: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        self.fwd(q, q_l, k, k_l, v, v_l)
    }
}

/// Prefill attention, `softmax(Q Kᵀ · softmax_scale) V`, as candle-flash-attn's `flash_attn`:
/// `q [B, Tq, Hq, D]`, `k`/`v [B, Tk, Hkv, D]` (Hq a multiple of Hkv), f16 or bf16, D in
/// [`crate::prefill::PREFILL_HEAD_DIMS`]; returns `[B, Tq, Hq, D]`. `v` may have a head dim Dv of its own
/// (FA3's `hdim_v`, DeepSeek's 192 / 128; docs/semantics.md): the result is then `[B, Tq, Hq, Dv]`. `causal` is bottom-right aligned (row i
/// sees key j iff `j <= i + Tk - Tq`), as in FlashAttention ≥ 2.1.
pub fn flash_attn(q: &Tensor, k: &Tensor, v: &Tensor, softmax_scale: f32, causal: bool) -> candle_core::Result<Tensor> {
    flash_attn_with(q, k, v, softmax_scale, causal, &Variants::default())
}

/// [`flash_attn`] with score variants (window, softcap, ALiBi, sinks: [`Variants`]).
pub fn flash_attn_with(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    softmax_scale: f32,
    causal: bool,
    variants: &Variants,
) -> candle_core::Result<Tensor> {
    q.apply_op3(k, v, FlashAttn { softmax_scale, causal, variants: variants.clone(), rope: None })
}

/// [`flash_attn_with`] with q rotated by `rope` (the sm_80 kernel's fused RoPE, docs/rope.md) at `positions`
/// (int32 `[B·Tq]`, row i of sequence b at `b·Tq + i`) or, with `None`, at each row's bottom-right position
/// `i + Tk − Tq`; with `k_rope`, k rotated too (at its positions `[B·Tk]`, or key j at j), else k is taken as
/// already rotated.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_rope(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    softmax_scale: f32,
    causal: bool,
    variants: &Variants,
    rope: &CandleRope,
    positions: Option<&Tensor>,
    k_rope: Option<&KeyRope>,
) -> candle_core::Result<Tensor> {
    let rope = Some(PrefillRope { rope: rope.clone(), positions: positions.cloned(), k: k_rope.cloned() });
    q.apply_op3(k, v, FlashAttn { softmax_scale, causal, variants: variants.clone(), rope })
}

/// Variable-length prefill attention as a candle op (candle-flash-attn's `FlashAttnVarLen`, its window /
/// ALiBi / softcap options and sinks as [`Variants`]; paged K/V is [`paged_decode`]'s).
pub struct FlashAttnVarLen {
    pub softmax_scale: f32,
    pub causal: bool,
    pub max_seqlen_q: usize,
    pub max_seqlen_k: usize,
    pub seqlens_q: Tensor,
    pub seqlens_k: Tensor,
    pub variants: Variants,
    /// RoPE on q ([`flash_attn_varlen_rope`]), `None`: q taken as already rotated.
    pub rope: Option<PrefillRope>,
}

impl FlashAttnVarLen {
    fn fwd<S: Backing>(
        &self,
        q: &S,
        q_l: &Layout,
        k: &S,
        k_l: &Layout,
        v: &S,
        v_l: &Layout,
    ) -> candle_core::Result<(S, Shape)> {
        let (cu_q, cu_q_l) = self.seqlens_q.storage_and_layout();
        let (cu_k, cu_k_l) = self.seqlens_k.storage_and_layout();
        let cu_q = S::of(&cu_q, "seqlens_q")?.index_view::<1>("seqlens_q", cu_q_l)?;
        let cu_k = S::of(&cu_k, "seqlens_k")?.index_view::<1>("seqlens_k", cu_k_l)?;
        attention_dtype!("q", q.dtype(), |T| {
            let backend = q.backend();
            let (q, k, v) = (q.view::<T, 3>("q", q_l)?, k.view::<T, 3>("k", k_l)?, v.view::<T, 3>("v", v_l)?);
            let [total_q, hq, _] = q.shape();
            let shape = [total_q, hq, v.dim(2)]; // v's head dim, as the dense op

            // Rows past seqlens_q[B] are not written by the kernel: they read as zeros.
            let mut o = backend.alloc::<T>(shape.iter().product(), Fill::Zero)?;
            let (causal, scale) = (self.causal, self.softmax_scale);
            with_prefill_options::<S, _>(&self.variants, self.rope.as_ref(), causal, scale, |opts| {
                let (max_q, max_k) = (self.max_seqlen_q, self.max_seqlen_k);
                let mut o = o.view(shape)?;
                Ok(prefill_varlen(&backend.stream(), &q, &k, &v, &cu_q, &cu_k, max_q, max_k, &mut o, None, opts)?)
            })?;
            Ok((S::from_out(o)?, Shape::from(shape.to_vec())))
        })
    }
}

impl CustomOp3 for FlashAttnVarLen {
    fn name(&self) -> &'static str {
        "fused-attn-prefill-varlen"
    }
    fn cpu_fwd(
        &self,
        q: &CpuStorage,
        q_l: &Layout,
        k: &CpuStorage,
        k_l: &Layout,
        v: &CpuStorage,
        v_l: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        self.fwd(q, q_l, k, k_l, v, v_l)
    }
    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(
        &self,
        q: &candle_core::CudaStorage,
        q_l: &Layout,
        k: &candle_core::CudaStorage,
        k_l: &Layout,
        v: &candle_core::CudaStorage,
        v_l: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        self.fwd(q, q_l, k, k_l, v, v_l)
    }
}

/// Variable-length prefill attention, as candle-flash-attn's `flash_attn_varlen`: packed
/// `q [total_q, Hq, D]`, `k`/`v [total_k, Hkv, D]`; `seqlens_q`/`seqlens_k` the `B + 1` cumulative lengths
/// (int32: `I32` or `U32`); returns `[total_q, Hq, D]` (rows past `seqlens_q[B]` are zero; `v [.., Dv]` of
/// its own head dim gives `[total_q, Hq, Dv]`).
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    causal: bool,
) -> candle_core::Result<Tensor> {
    let lens = VarlenLengths { seqlens_q, seqlens_k, max_seqlen_q, max_seqlen_k };
    flash_attn_varlen_with(q, k, v, &lens, softmax_scale, causal, &Variants::default())
}

/// The sequence lengths of a varlen call: the `B + 1` cumulative lengths of q and of k/v (int32) and
/// upper bounds of each sequence's length.
pub struct VarlenLengths<'t> {
    pub seqlens_q: &'t Tensor,
    pub seqlens_k: &'t Tensor,
    pub max_seqlen_q: usize,
    pub max_seqlen_k: usize,
}

/// [`flash_attn_varlen`] with score variants ([`Variants`]; ALiBi slopes `[Hq]` or `[B, Hq]`).
pub fn flash_attn_varlen_with(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    lens: &VarlenLengths<'_>,
    softmax_scale: f32,
    causal: bool,
    variants: &Variants,
) -> candle_core::Result<Tensor> {
    apply_varlen(q, k, v, lens, softmax_scale, causal, variants, None)
}

/// [`flash_attn_varlen_with`] with q rotated by `rope` at `positions` (int32 `[total_q]`, one per packed
/// query token) or, with `None`, at each row's bottom-right position `i + Tk_b − Tq_b` of its sequence; with
/// `k_rope`, k rotated too (at its positions `[total_k]`, or key j of a sequence at j), else k is taken as
/// already rotated.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_rope(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    lens: &VarlenLengths<'_>,
    softmax_scale: f32,
    causal: bool,
    variants: &Variants,
    rope: &CandleRope,
    positions: Option<&Tensor>,
    k_rope: Option<&KeyRope>,
) -> candle_core::Result<Tensor> {
    let rope = Some(PrefillRope { rope: rope.clone(), positions: positions.cloned(), k: k_rope.cloned() });
    apply_varlen(q, k, v, lens, softmax_scale, causal, variants, rope)
}

/// The [`FlashAttnVarLen`] op of a call.
#[allow(clippy::too_many_arguments)]
fn apply_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    lens: &VarlenLengths<'_>,
    softmax_scale: f32,
    causal: bool,
    variants: &Variants,
    rope: Option<PrefillRope>,
) -> candle_core::Result<Tensor> {
    let op = FlashAttnVarLen {
        softmax_scale,
        causal,
        max_seqlen_q: lens.max_seqlen_q,
        max_seqlen_k: lens.max_seqlen_k,
        seqlens_q: lens.seqlens_q.clone(),
        seqlens_k: lens.seqlens_k.clone(),
        variants: variants.clone(),
        rope,
    };
    q.apply_op3(k, v, op)
}

/// A rotary embedding for the candle ops (docs/rope.md): the fp32 tables `cos`, `sin` `[max_pos, ≥
/// rotary_dim/2]` on the op's device, the rotated dims and the pair layout.
#[derive(Clone, Debug)]
pub struct CandleRope {
    pub cos: Tensor,
    pub sin: Tensor,
    pub rotary_dim: usize,
    pub style: RopeStyle,
}

impl CandleRope {
    /// The table of `config` for positions `0..max_pos` ([`RopeConfig::table`]: f64, rounded once to f32) on
    /// `device`.
    pub fn new(config: &RopeConfig, max_pos: usize, device: &Device) -> candle_core::Result<Self> {
        let t = config.table(max_pos)?;
        Ok(Self {
            cos: Tensor::from_vec(t.cos, (max_pos, t.half), device)?,
            sin: Tensor::from_vec(t.sin, (max_pos, t.half), device)?,
            rotary_dim: config.rotary_dim,
            style: config.style,
        })
    }

    /// Runs `f` with this table (and `positions`, int32, if given) as views on backend `S`.
    fn with_rope<S: Backing, R>(
        &self,
        positions: Option<&Tensor>,
        f: impl FnOnce(Rope<'_>) -> candle_core::Result<R>,
    ) -> candle_core::Result<R> {
        let (cs, cl) = self.cos.storage_and_layout();
        let (ss, sl) = self.sin.storage_and_layout();
        let cos = S::of(&cs, "rope_cos")?.view::<f32, 2>("rope_cos", cl)?;
        let sin = S::of(&ss, "rope_sin")?.view::<f32, 2>("rope_sin", sl)?;
        let pos = positions.map(|t| t.storage_and_layout());
        let pos_view = match &pos {
            Some((st, l)) => Some(S::of(st, "rope_positions")?.index_view::<1>("rope_positions", l)?),
            None => None,
        };
        f(Rope { cos: &cos, sin: &sin, rotary_dim: self.rotary_dim, style: self.style, positions: pos_view.as_ref() })
    }
}

/// An FP8 paged cache for the candle ops (docs/semantics.md, "Layouts": FP8 cache): the format of its codes and
/// its dequantisation scales, two f32 tensors (K's and V's) on the cache's device, each one scale (`[]` or
/// `[1]`: per tensor) or `[Hkv]` (per KV head), the same count. The ops read the tensors in place, on the
/// device, when they run: scales the engine keeps as tensors ([`Fp8Kv::from_tensors`]; e.g. computed at
/// run time, or updated between steps) are used as they are then, never copied or read back by the host;
/// [`Fp8Kv::per_tensor`] / [`Fp8Kv::per_head`] make such tensors from host floats (checked, uploaded once).
/// The cache tensor `[2, num_pages, page_size, Hkv, D]` holds the codes as `U8` (either format, as vLLM
/// keeps FP8 caches) or as candle's `F8E4M3` (E4M3 codes only); q, new K/V rows and the output stay
/// f16/bf16.
#[derive(Clone)]
pub struct Fp8Kv {
    pub format: Fp8Format,
    k_scale: Tensor,
    v_scale: Tensor,
}

impl Fp8Kv {
    /// One K and one V scale for the whole cache (finite, > 0, else `Unsupported`).
    pub fn per_tensor(device: &Device, format: Fp8Format, k_scale: f32, v_scale: f32) -> candle_core::Result<Self> {
        Self::from_host(device, format, &[k_scale], &[v_scale])
    }

    /// One K and one V scale per KV head (`Hkv` each, finite, > 0).
    pub fn per_head(
        device: &Device,
        format: Fp8Format,
        k_scales: &[f32],
        v_scales: &[f32],
    ) -> candle_core::Result<Self> {
        if k_scales.len() != v_scales.len() || k_scales.is_empty() {
            return Err(Error::shape(
                "v_scale",
                format!("{} per-head V scales for {} K scales (need one per KV head)", v_scales.len(), k_scales.len()),
            )
            .into());
        }
        Self::from_host(device, format, k_scales, v_scales)
    }

    fn from_host(device: &Device, format: Fp8Format, k: &[f32], v: &[f32]) -> candle_core::Result<Self> {
        crate::fp8::check_scale_values("k_scale", k)?;
        crate::fp8::check_scale_values("v_scale", v)?;
        Self::from_tensors(format, &Tensor::new(k, device)?, &Tensor::new(v, device)?)
    }

    /// Scales the engine keeps as tensors (vLLM's `k_scale` / `v_scale`): f32 (else `Unsupported`), `[]`,
    /// `[1]` or `[Hkv]` with as many V scales as K scales (else `Shape`), on one device (else `Backend`).
    /// The tensors are shared, not copied: the ops read their values on the device when they run. Values
    /// are not checked (they are device data): a scale that is not finite and > 0 leaves its KV head's
    /// outputs unspecified (docs/semantics.md). Whether the count fits the cache's Hkv, and the device the
    /// cache's, is checked by each op.
    pub fn from_tensors(format: Fp8Format, k_scale: &Tensor, v_scale: &Tensor) -> candle_core::Result<Self> {
        let as_vector = |name: &str, t: &Tensor| -> candle_core::Result<Tensor> {
            if t.dtype() != DType::F32 {
                return Err(Error::unsupported(name, format!("dtype {:?} (scales are f32)", t.dtype())).into());
            }
            match t.rank() {
                0 => Ok(t.reshape(1)?),
                1 => Ok(t.clone()),
                _ => Err(Error::shape(name, format!("shape {:?} (expected [], [1] or [Hkv])", t.dims())).into()),
            }
        };
        let (k, v) = (as_vector("k_scale", k_scale)?, as_vector("v_scale", v_scale)?);
        if k.dims() != v.dims() {
            return Err(Error::shape(
                "v_scale",
                format!("{} scales for {} K scales (K and V take the same count)", v.elem_count(), k.elem_count()),
            )
            .into());
        }
        if !k.device().same_device(v.device()) {
            return Err(Error::backend("v_scale", "on another device than k_scale").into());
        }
        Ok(Self { format, k_scale: k, v_scale: v })
    }

    /// The K scales, `[1]` or `[Hkv]` f32 (a `[]` tensor given to [`Fp8Kv::from_tensors`] reshaped).
    pub fn k_scale(&self) -> &Tensor {
        &self.k_scale
    }
    /// The V scales, shaped as the K scales.
    pub fn v_scale(&self) -> &Tensor {
        &self.v_scale
    }

    /// The scale tensors' storages, held for one op (see [`ScaleStorages::views`]).
    fn storages(&self) -> ScaleStorages<'_, impl std::ops::Deref<Target = Storage> + '_> {
        ScaleStorages { k: self.k_scale.storage_and_layout(), v: self.v_scale.storage_and_layout() }
    }
}

impl std::fmt::Debug for Fp8Kv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fp8Kv").field("format", &self.format).field("scales", &self.k_scale.elem_count()).finish()
    }
}

/// An FP8 cache's K and V scales as views, for [`PagedKvCache::with_scale_tensors`].
type ScaleViews<'a> = (TensorView<'a, f32, 1>, TensorView<'a, f32, 1>);

/// The K and V scale storages of an [`Fp8Kv`], read-locked while an op holds views of them.
struct ScaleStorages<'t, G> {
    k: (G, &'t Layout),
    v: (G, &'t Layout),
}

impl<G: std::ops::Deref<Target = Storage>> ScaleStorages<'_, G> {
    /// The K and V scales as views on backend `S` (a scale tensor on another backend is a `Backend` error).
    fn views<'a, S: Backing + 'a>(&'a self) -> candle_core::Result<ScaleViews<'a>> {
        let k = S::of(&self.k.0, "k_scale")?.view::<f32, 1>("k_scale", self.k.1)?;
        let v = S::of(&self.v.0, "v_scale")?.view::<f32, 1>("v_scale", self.v.1)?;
        Ok((k, v))
    }
}

/// Runs `f` on the stream of `device`: the emulator for the CPU, candle's stream for CUDA.
fn on_device<R>(device: &Device, f: impl FnOnce(&crate::Stream<'_>) -> crate::Result<R>) -> candle_core::Result<R> {
    match device {
        Device::Cpu => Ok(f(&crate::Stream::Emu(emulator()))?),
        #[cfg(feature = "candle-cuda")]
        Device::Cuda(dev) => {
            let stream = dev.cuda_stream();
            Ok(f(&crate::Stream::Gpu(&stream))?)
        }
        other => Err(Error::backend(
            "device",
            format!("{:?}: fused-attn runs on the CPU (emulator) or, with candle-cuda, CUDA", other.location()),
        )
        .into()),
    }
}

/// What a paged op does beyond plain attention over a 16-bit cache; `PagedOptions::default()` is none of
/// it. [`paged_append_opts`] and [`paged_decode_opts`] take every option; the other paged ops are their
/// shorthands.
#[derive(Clone, Copy, Debug, Default)]
pub struct PagedOptions<'a> {
    /// Score variants (decode; the query is each sequence's newest token, so a window keeps its last
    /// `left + 1` tokens).
    pub variants: Option<&'a Variants>,
    /// Rotary embedding: the append rotates K at `positions` (required there); the decode rotates q at
    /// `positions` or, without them, at each sequence's last position `seq_lens[b] − 1`.
    pub rope: Option<&'a CandleRope>,
    /// int32 positions: `[num_tokens]` for the append, `[B]` for the decode.
    pub positions: Option<&'a Tensor>,
    /// The cache holds FP8 codes: required for a `U8` / `F8E4M3` cache, refused for a 16-bit one.
    pub fp8: Option<&'a Fp8Kv>,
}

/// A cache of FP8 codes read as 16-bit data would be garbage: say what is missing.
fn check_codes_have_fp8(name: &str, dtype: DType, fp8: Option<&Fp8Kv>) -> crate::Result<()> {
    if fp8.is_none() && matches!(dtype, DType::U8 | DType::F8E4M3) {
        return Err(Error::unsupported(
            name,
            format!("dtype {dtype:?} holds FP8 codes: pass PagedOptions::fp8 (an Fp8Kv: their format and scales)"),
        ));
    }
    Ok(())
}

/// Runs `$body` with `$C` the cache element type: `$T` for a 16-bit cache, the FP8 code type of `$fp8`'s
/// format otherwise.
macro_rules! cache_element {
    ($fp8:expr, $T:ty, |$C:ident| $body:block) => {
        match $fp8 {
            None => {
                type $C = $T;
                $body
            }
            Some(fp8) => match fp8.format {
                Fp8Format::E4m3 => {
                    type $C = Fp8E4m3;
                    $body
                }
                Fp8Format::E5m2 => {
                    type $C = Fp8E5m2;
                    $body
                }
            },
        }
    };
}

/// Appends k and v at `slots` into `cache` (FP8 scales from `scale_views`, RoPE on K at each token's
/// position from `opts`): both paged append ops once they hold their cache views.
fn append_into<'a, S: Backing, T: crate::Element, C: crate::KvCacheOf<T>>(
    stream: &crate::Stream<'_>,
    k: &TensorView<'_, T, 3>,
    v: &TensorView<'_, T, 3>,
    slots: &TensorView<'_, i64, 1>,
    mut cache: PagedKvCacheMut<'a, C>,
    scale_views: Option<ScaleViews<'a>>,
    opts: &PagedOptions<'_>,
) -> candle_core::Result<()> {
    if let Some((k_scale, v_scale)) = scale_views {
        cache = cache.with_scale_tensors(k_scale, v_scale)?;
    }
    let mut run = |rope: Option<Rope<'_>>| -> candle_core::Result<()> {
        Ok(append_with(stream, k, v, slots, &mut cache, &AppendOptions { rope })?)
    };
    match opts.rope {
        None => run(None),
        Some(rope) => {
            let positions = opts
                .positions
                .ok_or_else(|| Error::usage("rope_positions: a RoPE append needs each token's position"))?;
            rope.with_rope::<S, _>(Some(positions), |r| run(Some(r)))
        }
    }
}

/// Writes new tokens' K/V rows into a paged cache in place (an `InplaceOp3` on the cache tensor).
pub struct PagedAppend<'a> {
    /// `[num_tokens]` int64 slots (`page * page_size + offset`); negative slots are skipped.
    pub slot_mapping: &'a Tensor,
    /// RoPE on K (with its `[num_tokens]` positions) and the FP8 format and scales of the cache.
    pub opts: PagedOptions<'a>,
}

impl PagedAppend<'_> {
    fn fwd<S: Backing>(
        &self,
        kv_cache: &mut S,
        kv_l: &Layout,
        k: &S,
        k_l: &Layout,
        v: &S,
        v_l: &Layout,
    ) -> candle_core::Result<()> {
        let (slots, slots_l) = self.slot_mapping.storage_and_layout();
        let slots = S::of(&slots, "slot_mapping")?.view::<i64, 1>("slot_mapping", slots_l)?;
        let halves = kv_halves(kv_l)?;
        check_codes_have_fp8("kv_cache", kv_cache.dtype(), self.opts.fp8)?;
        let scales = self.opts.fp8.map(Fp8Kv::storages);
        let scale_views = scales.as_ref().map(ScaleStorages::views::<S>).transpose()?;
        attention_dtype!("k", k.dtype(), |T| {
            let backend = k.backend();
            let stream = backend.stream();
            let (k, v) = (k.view::<T, 3>("k", k_l)?, v.view::<T, 3>("v", v_l)?);
            cache_element!(self.opts.fp8, T, |C| {
                kv_cache.with_kv_mut::<C, _>(&halves, |k_cache, v_cache| {
                    let cache = PagedKvCacheMut::new(k_cache, v_cache)?;
                    append_into::<S, T, C>(&stream, &k, &v, &slots, cache, scale_views, &self.opts)
                })
            })
        })
    }
}

impl InplaceOp3 for PagedAppend<'_> {
    fn name(&self) -> &'static str {
        "fused-attn-paged-append"
    }
    fn cpu_fwd(
        &self,
        kv_cache: &mut CpuStorage,
        kv_l: &Layout,
        k: &CpuStorage,
        k_l: &Layout,
        v: &CpuStorage,
        v_l: &Layout,
    ) -> candle_core::Result<()> {
        self.fwd(kv_cache, kv_l, k, k_l, v, v_l)
    }
    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(
        &self,
        kv_cache: &mut candle_core::CudaStorage,
        kv_l: &Layout,
        k: &candle_core::CudaStorage,
        k_l: &Layout,
        v: &candle_core::CudaStorage,
        v_l: &Layout,
    ) -> candle_core::Result<()> {
        self.fwd(kv_cache, kv_l, k, k_l, v, v_l)
    }
}

/// Appends `k`, `v` (`[num_tokens, Hkv, D]`) to `kv_cache` (`[2, num_pages, page_size, Hkv, D]`, same dtype)
/// at `slot_mapping` (int64 `[num_tokens]`), in place. Slots must be distinct; negative slots are padding.
pub fn paged_append(k: &Tensor, v: &Tensor, slot_mapping: &Tensor, kv_cache: &Tensor) -> candle_core::Result<()> {
    paged_append_opts(k, v, slot_mapping, kv_cache, &PagedOptions::default())
}

/// [`paged_append`] with K rotated by `rope` at `positions` (int32 `[num_tokens]`) on its way into the cache
/// (fp32, then rounded to the cache's dtype); V as is.
pub fn paged_append_rope(
    k: &Tensor,
    v: &Tensor,
    slot_mapping: &Tensor,
    positions: &Tensor,
    kv_cache: &Tensor,
    rope: &CandleRope,
) -> candle_core::Result<()> {
    let opts = PagedOptions { rope: Some(rope), positions: Some(positions), ..Default::default() };
    paged_append_opts(k, v, slot_mapping, kv_cache, &opts)
}

/// [`paged_append`] with every option: K rotated by `opts.rope` at `opts.positions`, and, with `opts.fp8`,
/// K and V (f16/bf16) quantised into a cache of FP8 codes (`fp8_rn_satfinite(x / scale)`, after the
/// rotation: one pass).
pub fn paged_append_opts(
    k: &Tensor,
    v: &Tensor,
    slot_mapping: &Tensor,
    kv_cache: &Tensor,
    opts: &PagedOptions<'_>,
) -> candle_core::Result<()> {
    kv_cache.inplace_op3(k, v, &PagedAppend { slot_mapping, opts: *opts })
}

/// Writes new tokens' K/V rows into a K and a V cache tensor of their own (an `InplaceOp3` on the K cache;
/// the V cache is written in place by an in-place op of its own inside it).
struct PagedAppendKv<'a> {
    slot_mapping: &'a Tensor,
    v_cache: &'a Tensor,
    opts: PagedOptions<'a>,
}

impl PagedAppendKv<'_> {
    #[allow(clippy::too_many_arguments)]
    fn fwd<S: Backing>(
        &self,
        k_cache: &mut S,
        k_cache_l: &Layout,
        k: &S,
        k_l: &Layout,
        v: &S,
        v_l: &Layout,
    ) -> candle_core::Result<()> {
        S::with_tensor_mut(self.v_cache, |v_cache, v_cache_l| {
            let (slots, slots_l) = self.slot_mapping.storage_and_layout();
            let slots = S::of(&slots, "slot_mapping")?.view::<i64, 1>("slot_mapping", slots_l)?;
            check_codes_have_fp8("k_cache", k_cache.dtype(), self.opts.fp8)?;
            check_codes_have_fp8("v_cache", v_cache.dtype(), self.opts.fp8)?;
            let scales = self.opts.fp8.map(Fp8Kv::storages);
            let scale_views = scales.as_ref().map(ScaleStorages::views::<S>).transpose()?;
            attention_dtype!("k", k.dtype(), |T| {
                let backend = k.backend();
                let stream = backend.stream();
                let (k, v) = (k.view::<T, 3>("k", k_l)?, v.view::<T, 3>("v", v_l)?);
                cache_element!(self.opts.fp8, T, |C| {
                    k_cache.with_view_mut::<C, _>("k_cache", k_cache_l, |k_pages| {
                        v_cache.with_view_mut::<C, _>("v_cache", v_cache_l, |v_pages| {
                            let cache = PagedKvCacheMut::new(k_pages, v_pages)?;
                            append_into::<S, T, C>(&stream, &k, &v, &slots, cache, scale_views, &self.opts)
                        })
                    })
                })
            })
        })
    }
}

impl InplaceOp3 for PagedAppendKv<'_> {
    fn name(&self) -> &'static str {
        "fused-attn-paged-append-kv"
    }
    fn cpu_fwd(
        &self,
        k_cache: &mut CpuStorage,
        k_cache_l: &Layout,
        k: &CpuStorage,
        k_l: &Layout,
        v: &CpuStorage,
        v_l: &Layout,
    ) -> candle_core::Result<()> {
        self.fwd(k_cache, k_cache_l, k, k_l, v, v_l)
    }
    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(
        &self,
        k_cache: &mut candle_core::CudaStorage,
        k_cache_l: &Layout,
        k: &candle_core::CudaStorage,
        k_l: &Layout,
        v: &candle_core::CudaStorage,
        v_l: &Layout,
    ) -> candle_core::Result<()> {
        self.fwd(k_cache, k_cache_l, k, k_l, v, v_l)
    }
}

/// [`paged_append_opts`] into a K cache and a V cache of their own (mistral.rs's and vLLM's
/// `reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)` form): `k [num_tokens, Hkv, Dqk]`
/// into `k_cache [num_pages, page_size, Hkv, Dqk]`, `v [num_tokens, Hkv, Dv]` into `v_cache [num_pages,
/// page_size, Hkv, Dv]` (the same pages, page size and heads; Dv may differ from Dqk: DeepSeek's 192 / 128,
/// docs/head-dims.md), both in place, with every option of [`PagedOptions`] (RoPE on K: rotary_dim ≤ Dqk;
/// FP8 codes with their scales). The two caches must be separate storages (two halves of one tensor are
/// [`paged_append_opts`]'s `[2, ...]` cache), and no input may share storage with `v_cache`.
pub fn paged_append_kv(
    k: &Tensor,
    v: &Tensor,
    slot_mapping: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    opts: &PagedOptions<'_>,
) -> candle_core::Result<()> {
    // The V cache is written under its own lock inside the K cache's op: no tensor the op reads or writes
    // may share its storage (that lock would never be granted).
    let mut others = vec![("k_cache", k_cache), ("k", k), ("v", v), ("slot_mapping", slot_mapping)];
    others.extend(opts.positions.map(|p| ("rope_positions", p)));
    if let Some(r) = opts.rope {
        others.extend([("rope_cos", &r.cos), ("rope_sin", &r.sin)]);
    }
    if let Some(f) = opts.fp8 {
        others.extend([("k_scale", f.k_scale()), ("v_scale", f.v_scale())]);
    }
    if let Some((name, _)) = others.iter().find(|(_, t)| same_storage(t, v_cache)) {
        return Err(Error::usage(format!(
            "v_cache: shares its storage with {name} (two halves of one cache tensor: paged_append_opts)"
        ))
        .into());
    }
    k_cache.inplace_op3(k, v, &PagedAppendKv { slot_mapping, v_cache, opts: *opts })
}

/// A decode workspace (the split-KV partials) on `device`, pinned to the plan for `limits` (the largest
/// batch and longest context the decode loop will see): create it once, outside the loop, and pass it to
/// every [`paged_decode`] call of every layer.
pub fn decode_workspace(
    device: &Device,
    limits: &DecodeProblem,
    forced_splits: Option<usize>,
) -> candle_core::Result<DecodeWorkspace> {
    on_device(device, |stream| DecodeWorkspace::for_limits(stream, limits, forced_splits))
}

/// Paged decode: `o[b, h] = softmax(q[b, h] · K_bᵀ · softmax_scale) V_b` over the first `seq_lens[b]` tokens
/// of sequence b's pages. `q [B, Hq, D]` (f16/bf16, D in {64, 128, 256}), `kv_cache [2, num_pages,
/// page_size, Hkv, D]`, `block_table` int32 `[B, max_pages_per_seq]`, `seq_lens` int32 `[B]` (read on the
/// device only), `max_seq_len` ≥ every `seq_lens[b]`; `workspace` from [`decode_workspace`]. Returns
/// `o [B, Hq, D]`.
#[allow(clippy::too_many_arguments)]
pub fn paged_decode(
    q: &Tensor,
    kv_cache: &Tensor,
    block_table: &Tensor,
    seq_lens: &Tensor,
    max_seq_len: usize,
    softmax_scale: f32,
    workspace: &mut DecodeWorkspace,
) -> candle_core::Result<Tensor> {
    let args =
        DecodeArgs { q, cache: CacheTensors::Joint(kv_cache), block_table, seq_lens, max_seq_len, softmax_scale };
    Ok(args.run(&PagedOptions::default(), workspace, false)?.0)
}

/// [`paged_decode_opts`] over a K cache and a V cache of their own (mistral.rs's `paged_attention(q,
/// key_cache, value_cache, ..)` form): `q [B, Hq, Dqk]`, `k_cache [num_pages, page_size, Hkv, Dqk]`,
/// `v_cache [num_pages, page_size, Hkv, Dv]` (the same pages, page size and heads; Dv may differ from Dqk:
/// DeepSeek's 192 / 128, docs/head-dims.md), with every option of [`PagedOptions`]. `workspace`: sized for
/// the wider of Dqk and Dv ([`decode_workspace`] with `DecodeProblem::head_dim` = that). Returns
/// `o [B, Hq, Dv]` and the LSE `[B, Hq]` (f32).
#[allow(clippy::too_many_arguments)]
pub fn paged_decode_kv(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    block_table: &Tensor,
    seq_lens: &Tensor,
    max_seq_len: usize,
    softmax_scale: f32,
    opts: &PagedOptions<'_>,
    workspace: &mut DecodeWorkspace,
) -> candle_core::Result<(Tensor, Tensor)> {
    let cache = CacheTensors::Split(k_cache, v_cache);
    let args = DecodeArgs { q, cache, block_table, seq_lens, max_seq_len, softmax_scale };
    let (o, lse) = args.run(opts, workspace, true)?;
    let lse = lse.ok_or_else(|| Error::backend("lse", "not produced"))?;
    Ok((o, lse))
}

/// [`paged_decode`] with q rotated by `rope` at `positions` (int32 `[B]`) or, with `None`, at each sequence's
/// last position `seq_lens[b] − 1` (its K must be in the cache rotated by the same table:
/// [`paged_append_rope`]). Returns `o [B, Hq, D]`.
#[allow(clippy::too_many_arguments)]
pub fn paged_decode_rope(
    q: &Tensor,
    kv_cache: &Tensor,
    block_table: &Tensor,
    seq_lens: &Tensor,
    max_seq_len: usize,
    softmax_scale: f32,
    rope: &CandleRope,
    positions: Option<&Tensor>,
    workspace: &mut DecodeWorkspace,
) -> candle_core::Result<Tensor> {
    let opts = PagedOptions { rope: Some(rope), positions, ..Default::default() };
    let args =
        DecodeArgs { q, cache: CacheTensors::Joint(kv_cache), block_table, seq_lens, max_seq_len, softmax_scale };
    Ok(args.run(&opts, workspace, false)?.0)
}

/// [`paged_decode`] that also returns the natural-log LSE `[B, Hq]` (f32), e.g. to [`merge_states`] it with
/// attention over other keys (cascade / shared-prefix attention).
#[allow(clippy::too_many_arguments)]
pub fn paged_decode_with_lse(
    q: &Tensor,
    kv_cache: &Tensor,
    block_table: &Tensor,
    seq_lens: &Tensor,
    max_seq_len: usize,
    softmax_scale: f32,
    workspace: &mut DecodeWorkspace,
) -> candle_core::Result<(Tensor, Tensor)> {
    let opts = PagedOptions::default();
    paged_decode_opts(q, kv_cache, block_table, seq_lens, max_seq_len, softmax_scale, &opts, workspace)
}

/// [`paged_decode_with_lse`] with score variants ([`Variants`]; the query is each sequence's newest token,
/// so a window keeps its last `left + 1` tokens). Returns `o [B, Hq, D]` and the LSE `[B, Hq]` (f32; with
/// sinks, the sink is in it).
#[allow(clippy::too_many_arguments)]
pub fn paged_decode_with(
    q: &Tensor,
    kv_cache: &Tensor,
    block_table: &Tensor,
    seq_lens: &Tensor,
    max_seq_len: usize,
    softmax_scale: f32,
    variants: &Variants,
    workspace: &mut DecodeWorkspace,
) -> candle_core::Result<(Tensor, Tensor)> {
    let opts = PagedOptions { variants: Some(variants), ..Default::default() };
    paged_decode_opts(q, kv_cache, block_table, seq_lens, max_seq_len, softmax_scale, &opts, workspace)
}

/// [`paged_decode_with_lse`] with every option ([`PagedOptions`]): score variants, q rotated by a RoPE
/// table, a cache of FP8 codes (dequantised by its scales as it is read). Returns `o [B, Hq, D]` and the
/// LSE `[B, Hq]` (f32).
#[allow(clippy::too_many_arguments)]
pub fn paged_decode_opts(
    q: &Tensor,
    kv_cache: &Tensor,
    block_table: &Tensor,
    seq_lens: &Tensor,
    max_seq_len: usize,
    softmax_scale: f32,
    opts: &PagedOptions<'_>,
    workspace: &mut DecodeWorkspace,
) -> candle_core::Result<(Tensor, Tensor)> {
    let args =
        DecodeArgs { q, cache: CacheTensors::Joint(kv_cache), block_table, seq_lens, max_seq_len, softmax_scale };
    let (o, lse) = args.run(opts, workspace, true)?;
    let lse = lse.ok_or_else(|| Error::backend("lse", "not produced"))?;
    Ok((o, lse))
}

/// A paged cache as the decode ops take it: one tensor `[2, num_pages, page_size, Hkv, D]` (K pages then V
/// pages), or a K and a V tensor `[num_pages, page_size, Hkv, Dqk / Dv]` of their own.
#[derive(Clone, Copy)]
enum CacheTensors<'t> {
    Joint(&'t Tensor),
    Split(&'t Tensor, &'t Tensor),
}

struct DecodeArgs<'t> {
    q: &'t Tensor,
    cache: CacheTensors<'t>,
    block_table: &'t Tensor,
    seq_lens: &'t Tensor,
    max_seq_len: usize,
    softmax_scale: f32,
}

impl DecodeArgs<'_> {
    fn run(
        &self,
        opts: &PagedOptions<'_>,
        workspace: &mut DecodeWorkspace,
        want_lse: bool,
    ) -> candle_core::Result<(Tensor, Option<Tensor>)> {
        let (q, q_l) = self.q.storage_and_layout();
        let (b, hq, _) =
            q_l.shape().dims3().map_err(|_| Error::shape("q", format!("expected [B, Hq, D], got {:?}", q_l.dims())))?;
        let (o, lse, dv) = backend_of!("q", &*q, |S| { self.run_on::<S>(&q, q_l, opts, workspace, want_lse) })?;
        let o = Tensor::from_storage(o, (b, hq, dv), BackpropOp::none(), false);
        let lse = lse.map(|l| Tensor::from_storage(l, (b, hq), BackpropOp::none(), false));
        Ok((o, lse))
    }

    fn run_on<S: Backing>(
        &self,
        q: &Storage,
        q_l: &Layout,
        opts: &PagedOptions<'_>,
        workspace: &mut DecodeWorkspace,
        want_lse: bool,
    ) -> candle_core::Result<(Storage, Option<Storage>, usize)> {
        // K's storage and layout (the joint tensor's), and V's when it is a tensor of its own.
        let (k_tensor, k_name) = match self.cache {
            CacheTensors::Joint(kv) => (kv, "kv_cache"),
            CacheTensors::Split(k, _) => (k, "k_cache"),
        };
        let (kv, kv_l) = k_tensor.storage_and_layout();
        let v_own = match self.cache {
            CacheTensors::Split(_, v) => Some(v.storage_and_layout()),
            CacheTensors::Joint(_) => None,
        };
        let (table, table_l) = self.block_table.storage_and_layout();
        let (lens, lens_l) = self.seq_lens.storage_and_layout();
        let (q, kv) = (S::of(q, "q")?, S::of(&kv, k_name)?);
        let vs = match &v_own {
            Some((s, _)) => S::of(s, "v_cache")?,
            None => kv,
        };
        let table = S::of(&table, "block_table")?.index_view::<2>("block_table", table_l)?;
        let lens = S::of(&lens, "seq_lens")?.index_view::<1>("seq_lens", lens_l)?;
        // (offset, shape, strides) of the K pages and of the V pages, and the name of V's tensor.
        let (k_at, v_at, v_name) = match &v_own {
            None => {
                let h = kv_halves(kv_l)?;
                ((h.k_offset, h.shape, h.strides), (h.v_offset, h.shape, h.strides), "kv_cache")
            }
            Some((_, v_l)) => {
                let ((ks, kst), (vs, vst)) = (dims::<4>("k_cache", kv_l)?, dims::<4>("v_cache", v_l)?);
                ((kv_l.start_offset(), ks, kst), (v_l.start_offset(), vs, vst), "v_cache")
            }
        };
        check_codes_have_fp8(k_name, kv.dtype(), opts.fp8)?;
        check_codes_have_fp8(v_name, vs.dtype(), opts.fp8)?;
        let dv = v_at.1[3];
        let scales = opts.fp8.map(Fp8Kv::storages);
        let scale_views = scales.as_ref().map(ScaleStorages::views::<S>).transpose()?;
        attention_dtype!("q", q.dtype(), |T| {
            let backend = q.backend();
            let q = q.view::<T, 3>("q", q_l)?;
            let [b, hq, _] = q.shape();
            let mut o = backend.alloc::<T>(b * hq * dv, Fill::Poison)?;
            let mut lse = if want_lse { Some(backend.alloc::<f32>(b * hq, Fill::Poison)?) } else { None };
            cache_element!(opts.fp8, T, |C| {
                let k_cache = kv.view_at::<C, 4>(k_name, k_at.0, k_at.1, k_at.2)?;
                let v_cache = vs.view_at::<C, 4>(v_name, v_at.0, v_at.1, v_at.2)?;
                let mut cache = PagedKvCache::new(k_cache, v_cache, table, lens, self.max_seq_len)?;
                if let Some((k_scale, v_scale)) = scale_views {
                    cache = cache.with_scale_tensors(k_scale, v_scale)?;
                }
                let mut lse_view = match lse.as_mut() {
                    Some(l) => Some(l.view([b, hq])?),
                    None => None,
                };
                let no_variants = Variants::default();
                opts.variants.unwrap_or(&no_variants).with_score_mod::<S, _>(|score_mod| {
                    let mut run = |rope: Option<Rope<'_>>| -> candle_core::Result<crate::DecodePlan> {
                        let dopts =
                            DecodeOptions { scale: Some(self.softmax_scale), num_splits: None, score_mod, rope };
                        let mut o_view = o.view([b, hq, dv])?;
                        Ok(decode(&backend.stream(), &q, &cache, &mut o_view, lse_view.as_mut(), workspace, &dopts)?)
                    };
                    match opts.rope {
                        None => run(None),
                        Some(rope) => rope.with_rope::<S, _>(opts.positions, |r| run(Some(r))),
                    }
                })?;
            });
            Ok((o.into_storage(), lse.map(|l| l.into_storage()), dv))
        })
    }
}

/// Multi-head latent attention decode (docs/mla.md; DeepSeek-V2/V3, Kimi K2), absorbed form, one query
/// token per sequence: `q [B, Hq, rank + rope]` (the latent query `q_nope · W_UK`, then the rotated `q_pe`;
/// f16 or bf16) over `latent_cache [num_pages, page_size, 1, rank + rope]` (the rows `[c | k_pe]`: the
/// queries' dtype, or FP8 codes with `fp8` — its K scale dequantises the scores, its V scale the output; one
/// scale per tensor, the same tensor for both as `mla_append` quantised), `block_table [B, W]`, `seq_lens
/// [B]` (int32). Returns `o [B, Hq, rank]` (still to be multiplied by `W_UV`) and the natural-log LSE `[B,
/// Hq]` (f32). `dims`: the row split (`MlaDims::default()`: 512 + 64); `workspace`: room for the split
/// partials (`DecodeWorkspace::with_capacity(.., B, Hq, rank, splits)`).
#[allow(clippy::too_many_arguments)]
pub fn mla_decode(
    q: &Tensor,
    latent_cache: &Tensor,
    block_table: &Tensor,
    seq_lens: &Tensor,
    max_seq_len: usize,
    softmax_scale: f32,
    dims: crate::mla::MlaDims,
    fp8: Option<&Fp8Kv>,
    workspace: &mut DecodeWorkspace,
) -> candle_core::Result<(Tensor, Tensor)> {
    let (qs, q_l) = q.storage_and_layout();
    let (b, hq, _) = q_l
        .shape()
        .dims3()
        .map_err(|_| Error::shape("q", format!("expected [B, Hq, rank + rope], got {:?}", q_l.dims())))?;
    let args = MlaArgs { latent_cache, block_table, seq_lens, max_seq_len, softmax_scale, dims, fp8 };
    let (o, lse) = backend_of!("q", &*qs, |S| { args.run_on::<S>(&qs, q_l, workspace) })?;
    Ok((
        Tensor::from_storage(o, (b, hq, dims.kv_lora_rank), BackpropOp::none(), false),
        Tensor::from_storage(lse, (b, hq), BackpropOp::none(), false),
    ))
}

struct MlaArgs<'t> {
    latent_cache: &'t Tensor,
    block_table: &'t Tensor,
    seq_lens: &'t Tensor,
    max_seq_len: usize,
    softmax_scale: f32,
    dims: crate::mla::MlaDims,
    fp8: Option<&'t Fp8Kv>,
}

impl MlaArgs<'_> {
    fn run_on<S: Backing>(
        &self,
        q: &Storage,
        q_l: &Layout,
        workspace: &mut DecodeWorkspace,
    ) -> candle_core::Result<(Storage, Storage)> {
        let (lc, lc_l) = self.latent_cache.storage_and_layout();
        let (table, table_l) = self.block_table.storage_and_layout();
        let (lens, lens_l) = self.seq_lens.storage_and_layout();
        let (q, lc) = (S::of(q, "q")?, S::of(&lc, "latent_cache")?);
        let table = S::of(&table, "block_table")?.index_view::<2>("block_table", table_l)?;
        let lens = S::of(&lens, "seq_lens")?.index_view::<1>("seq_lens", lens_l)?;
        check_codes_have_fp8("kv_cache", lc.dtype(), self.fp8)?;
        let scales = self.fp8.map(Fp8Kv::storages);
        let scale_views = scales.as_ref().map(ScaleStorages::views::<S>).transpose()?;
        let rank = self.dims.kv_lora_rank;
        attention_dtype!("q", q.dtype(), |T| {
            let backend = q.backend();
            let q = q.view::<T, 3>("q", q_l)?;
            let [b, hq, _] = q.shape();
            let mut o = backend.alloc::<T>(b * hq * rank, Fill::Poison)?;
            let mut lse = backend.alloc::<f32>(b * hq, Fill::Poison)?;
            cache_element!(self.fp8, T, |C| {
                let pages = lc.view::<C, 4>("latent_cache", lc_l)?;
                let mut cache = crate::mla::latent_cache(pages, table, lens, self.max_seq_len)?;
                if let Some((k_scale, v_scale)) = scale_views {
                    cache = cache.with_scale_tensors(k_scale, v_scale)?;
                }
                let mut opts = crate::mla::MlaDecodeOptions::new(self.softmax_scale);
                opts.dims = self.dims;
                crate::mla::mla_decode(
                    &backend.stream(),
                    &q,
                    &cache,
                    &mut o.view([b, hq, rank])?,
                    Some(&mut lse.view([b, hq])?),
                    workspace,
                    &opts,
                )?;
            });
            Ok((o.into_storage(), lse.into_storage()))
        })
    }
}

/// Merges `k` partial attention results over disjoint key sets: `o_states [k, N, H, D]` (f32, f16 or bf16)
/// with their natural-log `lse_states [k, N, H]` (f32) into `o [N, H, D]` (o_states' dtype) and
/// `lse [N, H]`: `lse = log Σ_s exp(lse_s)`, `o = Σ_s exp(lse_s − lse) · o_s` (empty states, lse = −inf,
/// weigh nothing; a row with only empty states gives o = 0, lse = −inf).
pub fn merge_states(o_states: &Tensor, lse_states: &Tensor) -> candle_core::Result<(Tensor, Tensor)> {
    let (os, os_l) = o_states.storage_and_layout();
    let (_, n, h, d) = os_l
        .shape()
        .dims4()
        .map_err(|_| Error::shape("o_states", format!("expected [k, N, H, D], got {:?}", os_l.dims())))?;
    let (o, lse) = backend_of!("o_states", &*os, |S| { merge_on::<S>(&os, os_l, lse_states) })?;
    Ok((
        Tensor::from_storage(o, (n, h, d), BackpropOp::none(), false),
        Tensor::from_storage(lse, (n, h), BackpropOp::none(), false),
    ))
}

fn merge_on<S: Backing>(
    o_states: &Storage,
    os_l: &Layout,
    lse_states: &Tensor,
) -> candle_core::Result<(Storage, Storage)> {
    let (ls, ls_l) = lse_states.storage_and_layout();
    let os = S::of(o_states, "o_states")?;
    let ls = S::of(&ls, "lse_states")?.view::<f32, 3>("lse_states", ls_l)?;
    let backend = os.backend();
    macro_rules! merge_as {
        ($T:ty) => {{
            let states = os.view::<$T, 4>("o_states", os_l)?;
            let [_, n, h, d] = states.shape();
            let mut o = backend.alloc::<$T>(n * h * d, Fill::Poison)?;
            let mut lse = backend.alloc::<f32>(n * h, Fill::Poison)?;
            crate::merge::merge_states(
                &backend.stream(),
                &states,
                &ls,
                &mut o.view([n, h, d])?,
                Some(&mut lse.view([n, h])?),
            )?;
            Ok((o.into_storage(), lse.into_storage()))
        }};
    }
    match os.dtype() {
        DType::F32 => merge_as!(f32),
        DType::F16 => merge_as!(half::f16),
        DType::BF16 => merge_as!(half::bf16),
        other => Err(Error::unsupported("o_states", format!("dtype {other:?} (merge takes f32, f16 or bf16)")).into()),
    }
}
