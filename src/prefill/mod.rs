//! Fused prefill attention: `O = softmax(Q Kᵀ · scale) V` computed in one kernel that never materialises the
//! score matrix (kernels/prefill.cu, FlashAttention-2 forward on mma.sync tensor cores).
//!
//! - [`prefill`]: dense `q [B, Tq, Hq, D]`, `k`/`v [B, Tk, Hkv, D]`, `o` like `q`, optional `lse [B, Hq, Tq]`.
//! - [`prefill_varlen`]: packed `q [total_q, Hq, D]`, `k`/`v [total_k, Hkv, D]` with `cu_seqlens` (int32,
//!   B+1 prefix sums), `o` like `q`, optional `lse [Hq, total_q]`.
//!
//! V's head dim may differ from Q's and K's (issue 27; DeepSeek-V2/V3 prefill: Dqk 192, Dv 128): `v` and `o`
//! then have their own last dim Dv (`v [.., Dv]`, `o [.., Dv]`), the default scale stays 1/sqrt(Dqk). The
//! sm_80 kernel serves every pair of tiled head dims (Dv below or above Dqk) at the wider one's width
//! ([`TileConfig::for_pair`]), and the streaming path past 256 every pair whose wider dim is past it (the
//! decode kernel's V columns predicated at Dv); the sm_90a kernel takes Dv == Dqk only.
//!
//! Both: fp16 or bf16, D in [`PREFILL_HEAD_DIMS`], any non-negative strides with a unit innermost stride and
//! 16-byte aligned rows, GQA/MQA (`Hq` a multiple of `Hkv`), causal bottom-right aligned (row i sees key j
//! iff `j <= i + Tk - Tq`, per sequence), the score variants of [`ScoreMod`] (sliding window, softcap,
//! ALiBi, sinks), rows that see no key give `o = 0`, `lse = -inf` (with a sink: the sink's logit).
//!
//! The host policy the kernel follows — tile shape per head dim (the launcher's own, [`TileConfig`] from
//! [`crate::tile::tile_policy`]), the grid, which KV tiles a query tile visits and which of them are
//! masked ([`kv_block_range`], kernels/include/fa/prefill/block_range.cuh's rule) — is here, unit-tested.

pub mod sm90;
mod wide;

pub use sm90::{
    persistent_ctas, sm90_serves, PrefillKernel, Sm90Steps, Sm90Tile, EMULATED_SMS, SM90_HEAD_DIMS, SM90_OCCUPANCY,
    SM90_SOFTCAP_RANGE, SM90_V_HEAD_DIM_PAIRS,
};

use crate::device::Stream;
use crate::dtype::Element;
use crate::error::{to_i32, Error, Result};
use crate::launch::{softmax_scale, Launch};
pub use crate::mask::{kv_block_range, KvBlockRange, Window};
use crate::plan::MAX_GRID_YZ;
use crate::score_mod::{ScoreMod, VariantSet};
use crate::sys;
use crate::tensor::{Mem, TensorView, TensorViewMut};
use crate::tile::{prefill_tile_policy, KernelOp};

/// Head dims prefill accepts: every multiple of 8 from 32 to 512 ([`crate::head_dim`], which maps each to
/// the tile width of an instantiated kernel: the tiled sm_80 kernel up to 256, the decode kernel's streaming
/// path from 264 on).
pub use crate::head_dim::PREFILL_HEAD_DIMS;

/// Options of one prefill call: `PrefillOptions { causal: true, ..Default::default() }`.
#[derive(Debug, Clone, Copy, Default)]
pub struct PrefillOptions<'a> {
    /// Bottom-right aligned causal mask (row i sees key j iff j <= i + Tk - Tq): a window's right bound 0.
    pub causal: bool,
    /// Softmax scale; `None` means 1/sqrt(D) (D: Q's and K's head dim, also when V's differs). Must be
    /// finite and positive.
    pub scale: Option<f32>,
    /// Sliding window, softcap, ALiBi, sinks (none by default).
    pub score_mod: ScoreMod<'a>,
    /// Which kernel runs the call ([`PrefillKernel`]): `Auto` (the default) takes the sm_90a kernel on a
    /// compute capability 9.0 GPU when it supports the call, else the sm_80 one.
    pub kernel: PrefillKernel,
    /// The sm_90a kernel's tuning steps, all on by default ([`Sm90Steps`]: A/B switches for timing them).
    pub sm90_steps: Sm90Steps,
    /// Rotary embedding of q ([`crate::rope`], docs/rope.md), `None` by default: query row i of sequence b
    /// rotated at `rope.positions[q_row0_b + i]` (one int32 per query token: `[B·Tq]` dense, `b·Tq + i`;
    /// `[total_q]` varlen, `cu_seqlens_q[b] + i`) or, without positions, at its bottom-right position
    /// `i + Tk − Tq` (the causal mask's; clamped to 0 when negative). Fused in both kernels (the sm_90a one
    /// rotates each Q tile in shared memory once it has landed).
    pub rope: Option<crate::rope::Rope<'a>>,
    /// RoPE on K too ([`crate::RopeKeys`], needs `rope`: the same table, rotary dims and layout), `None` by
    /// default (K taken as already rotated): key j of sequence b rotated at `positions[k_row0_b + j]` (one
    /// int32 per key token: `[B·Tk]` dense, `[total_k]` varlen) or, without positions, at j. Rotated in shared
    /// memory as each K tile lands; K is read as without RoPE and never written back. Fused in the sm_80
    /// kernel only: `Auto` runs that kernel, `Sm90` is an Unsupported error.
    pub rope_k: Option<crate::rope::RopeKeys<'a>>,
}

/// Longest sequence prefill accepts (positions plus window bounds stay inside the kernel's int32).
pub const MAX_PREFILL_SEQLEN: usize = 1 << 30;

/// The kernel's tile shape for one head dim and kernel (plain or `_mod`: kernels/include/fa/prefill/
/// tile_config.cuh, which says why).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TileConfig {
    /// Q's and K's head dim.
    pub head_dim: usize,
    /// V's and O's head dim (`head_dim` unless the call's V is narrower or wider).
    pub head_dim_v: usize,
    /// The instantiated kernel's tile width (>= head_dim; [`crate::head_dim::prefill_width`]): the MMAs and
    /// shared-memory tiles are this wide, the columns past head_dim zero.
    pub width: usize,
    /// Warps per CTA; each owns `m_tiles` m16 tiles (16·m_tiles query rows).
    pub warps: usize,
    pub m_tiles: usize,
    /// Query rows per CTA (Br).
    pub block_m: usize,
    /// Keys per KV tile (Bc).
    pub block_n: usize,
    /// K/V tile buffers in shared memory (2 or 3).
    pub stages: usize,
    /// The register-lean KV loop (d128's plain kernel): K/V bases and epilogue offsets parked in shared
    /// memory (48 bytes per warp), the softmax row sums too (16 bytes per thread).
    pub lean: bool,
    /// Dynamic shared memory per CTA: the Q tile plus `stages` K and V tiles, 16-bit, `width` columns (and
    /// the lean loop's parked values).
    pub smem_bytes: usize,
}

impl TileConfig {
    /// The config the plain kernel uses for `head_dim`, or `None` if prefill does not support it.
    pub fn for_head_dim(head_dim: usize) -> Option<Self> {
        Self::for_kernel(head_dim, false)
    }
    /// The config of the plain (`variant` false) or `_mod` kernel (softcap, ALiBi or a left window bound:
    /// [`uses_variant_kernel`]) for `head_dim`, or `None` if prefill does not support it.
    pub fn for_kernel(head_dim: usize, variant: bool) -> Option<Self> {
        Self::for_pair(head_dim, head_dim, variant)
    }
    /// The config for Q·K head dim `head_dim` and V head dim `head_dim_v`: the kernel of the wider one's
    /// width (the next width with predicated columns where that one has none: 128/64 runs at 160), or
    /// `None` if the tiled kernel does not serve the pair.
    pub fn for_pair(head_dim: usize, head_dim_v: usize, variant: bool) -> Option<Self> {
        let p = prefill_tile_policy(head_dim, head_dim_v, variant)?;
        let m_tiles = p.block_m / (16 * p.warps());
        Some(Self {
            head_dim,
            head_dim_v,
            width: p.width,
            warps: p.warps(),
            m_tiles,
            block_m: p.block_m,
            block_n: p.block_n,
            stages: p.stages,
            lean: p.lean,
            smem_bytes: p.smem_bytes,
        })
    }
    pub fn threads(&self) -> usize {
        32 * self.warps
    }
    /// Launch grid `[query tiles, Hq, B]` for sequences of at most `max_seqlen_q` rows.
    pub fn grid(&self, max_seqlen_q: usize, heads_q: usize, batch: usize) -> [usize; 3] {
        [max_seqlen_q.div_ceil(self.block_m), heads_q, batch]
    }
}

/// Whether a launch with these variants runs the `_mod` kernel (kernels/prefill.cu, needs_variant_kernel):
/// softcap, ALiBi, or a left window bound below `max(seqlen_q, seqlen_k)` (the batch's maxima), which
/// excludes keys.
pub fn uses_variant_kernel(variants: &VariantSet, seqlen_q: usize, seqlen_k: usize) -> bool {
    let span = seqlen_q.max(seqlen_k);
    variants.softcap.is_some()
        || variants.alibi
        || matches!(variants.window, Some((left, _)) if left >= 0 && (left as usize) < span)
}

/// Checks the head layout shared by both entry points: D supported and equal for q and k, V's head dim
/// supported (any pair: the tiled kernel up to 256, the streaming path past it), Hq a positive multiple of Hkv.
fn check_heads(head_dim: usize, d_k: usize, d_v: usize, heads_q: usize, heads_kv: usize) -> Result<()> {
    crate::head_dim::check(KernelOp::Prefill, head_dim)?;
    if d_k != head_dim {
        return Err(Error::shape("k", format!("head dim {d_k} differs from q's {head_dim}")));
    }
    if d_v != head_dim && !crate::head_dim::supported(KernelOp::Prefill, d_v) {
        return Err(Error::unsupported(
            "v",
            format!("head dim {d_v} (prefill supports {})", crate::head_dim::describe(KernelOp::Prefill)),
        ));
    }
    if heads_kv == 0 || heads_q == 0 || heads_q % heads_kv != 0 {
        return Err(Error::shape(
            "q",
            format!("{heads_q} query heads are not a positive multiple of k's {heads_kv} KV heads"),
        ));
    }
    if heads_q > MAX_GRID_YZ {
        return Err(Error::unsupported("q", format!("{heads_q} query heads (at most {MAX_GRID_YZ})")));
    }
    Ok(())
}

/// Whether prefill runs Q·K head dim `head_dim` with V head dim `head_dim_v` on the decode kernel's
/// streaming path (the wider of the two past the tiled kernel's widths; V's columns predicated at Dv there).
pub fn runs_streaming(head_dim: usize, head_dim_v: usize) -> bool {
    head_dim.max(head_dim_v) > crate::head_dim::PREFILL_TILED_MAX_HEAD_DIM
}

fn check_rows_all<T, const N: usize>(
    q: &TensorView<'_, T, N>,
    k: &TensorView<'_, T, N>,
    v: &TensorView<'_, T, N>,
    o: &TensorViewMut<'_, T, N>,
) -> Result<()> {
    q.check_rows("q", 16)?;
    k.check_rows("k", 16)?;
    v.check_rows("v", 16)?;
    o.check_rows("o", 16)?;
    o.check_disjoint("o")
}

/// What both entry points derive alike from the options: the scale and the variants' values (both checked),
/// the sm_90a kernel choice, and the params fields of the head layout, dtype, mask and scale.
fn shared_params<T: Element>(
    stream: &Stream<'_>,
    opts: &PrefillOptions,
    (head_dim, head_dim_v): (usize, usize),
    heads_q: usize,
    heads_kv: usize,
) -> Result<(sm90::Choice, sys::FaPrefillParams)> {
    let scale = softmax_scale(opts.scale, head_dim)?;
    opts.score_mod.check_values()?;
    if opts.rope_k.is_some() && opts.rope.is_none() {
        return Err(Error::usage("rope_k: RoPE on K rotates with q's table; set `rope` too"));
    }
    // What only the sm_80 kernel does: RoPE on K. (A V head dim of its own runs on the sm_90a kernel for the
    // pairs it has a tile for, sm90::SM90_V_HEAD_DIM_PAIRS: sm90::choose decides.)
    let sm80_only =
        opts.rope_k.is_some().then(|| "RoPE on K is fused in the sm80 kernel only (docs/rope.md)".to_string());
    let kernel = match (sm80_only, opts.kernel) {
        (Some(why), PrefillKernel::Sm90) => return Err(Error::unsupported("prefill kernel sm90", why)),
        (Some(_), _) => PrefillKernel::Sm80,
        (None, kernel) => kernel,
    };
    let choice = sm90::choose(stream, kernel, (head_dim, head_dim_v), opts.causal, &opts.score_mod, opts.sm90_steps)?;
    let params = sys::FaPrefillParams {
        heads_q: to_i32("q (heads)", heads_q)?,
        heads_kv: to_i32("k (heads)", heads_kv)?,
        head_dim: head_dim as i32,
        head_dim_v: head_dim_v as i32,
        dtype: T::DTYPE.abi(),
        causal: opts.causal as i32,
        scale,
        scale_log2: scale * std::f32::consts::LOG2_E,
        ..Default::default()
    };
    Ok((choice, params))
}

/// Takes the pointers both entry points pass alike into `params`: q, then k and v (left null when there are
/// no keys at all: the kernel never touches them, every row being empty, and an empty view has no meaningful
/// address), o and the optional lse.
fn take_pointers<'a, T: Element, const N: usize, const L: usize>(
    launch: &mut Launch<'a>,
    [q, k, v]: [&'a TensorView<'_, T, N>; 3],
    has_keys: bool,
    o: &'a mut TensorViewMut<'_, T, N>,
    lse: Option<&'a mut TensorViewMut<'_, f32, L>>,
    params: sys::FaPrefillParams,
) -> Result<sys::FaPrefillParams> {
    let q = launch.input(c"q", q, 16)?;
    let (k, v) = if has_keys {
        (launch.input(c"k", k, 16)?, launch.input(c"v", v, 16)?)
    } else {
        (std::ptr::null(), std::ptr::null())
    };
    let o = launch.output(c"o", o, 16)?;
    let lse = match lse {
        Some(l) => launch.output(c"lse", l, 4)? as *mut f32,
        None => std::ptr::null_mut(),
    };
    Ok(sys::FaPrefillParams { q, k, v, o, lse, ..params })
}

/// Dense prefill attention, enqueued on `stream`:
/// `o[b, i, h] = softmax_j(q[b, i, h] · k[b, j, h / G] · scale) v[b, j, h / G]`, G = Hq / Hkv.
///  - `q [B, Tq, Hq, D]`, `k`/`v [B, Tk, Hkv, D]`, `o [B, Tq, Hq, D]`; D in [`PREFILL_HEAD_DIMS`];
///  - `lse`: optional `[B, Hq, Tq]` fp32 natural-log log-sum-exp of the scaled scores (unit stride along Tq);
///  - any non-negative strides with unit innermost stride and 16-byte aligned rows; `o` rows must not overlap.
///
/// Errors name the argument: Shape (mismatched shapes, Hq not a multiple of Hkv, slopes or sinks of the wrong
/// shape), Unsupported (head dim, scale, window bound below −1, softcap not finite and positive, non-finite
/// sinks or slopes in host memory), Layout (innermost stride, overlapping output), Alignment, Overflow,
/// Backend.
pub fn prefill<T: Element>(
    stream: &Stream<'_>,
    q: &TensorView<'_, T, 4>,
    k: &TensorView<'_, T, 4>,
    v: &TensorView<'_, T, 4>,
    o: &mut TensorViewMut<'_, T, 4>,
    lse: Option<&mut TensorViewMut<'_, f32, 3>>,
    opts: &PrefillOptions,
) -> Result<()> {
    let [batch, seqlen_q, heads_q, head_dim] = q.shape();
    let [batch_k, seqlen_k, heads_kv, d_k] = k.shape();
    let head_dim_v = v.dim(3);
    check_heads(head_dim, d_k, head_dim_v, heads_q, heads_kv)?;
    if batch_k != batch {
        return Err(Error::shape("k", format!("batch {batch_k} differs from q's {batch}")));
    }
    v.expect_shape("v", [batch, seqlen_k, heads_kv, head_dim_v])?;
    o.expect_shape("o", [batch, seqlen_q, heads_q, head_dim_v])?;
    check_rows_all(q, k, v, o)?;
    if let Some(l) = lse.as_deref() {
        l.expect_shape("lse", [batch, heads_q, seqlen_q])?;
        l.check_rows("lse", 4)?;
        l.check_disjoint("lse")?;
    }
    if batch > MAX_GRID_YZ {
        return Err(Error::unsupported("q", format!("batch {batch} (at most {MAX_GRID_YZ})")));
    }
    check_seqlens(&[("q", seqlen_q), ("k", seqlen_k)])?;
    let (choice, params) = shared_params::<T>(stream, opts, (head_dim, head_dim_v), heads_q, heads_kv)?;
    let params = sys::FaPrefillParams {
        batch: to_i32("q (batch)", batch)?,
        seqlen_q: to_i32("q (seqlen)", seqlen_q)?,
        seqlen_k: to_i32("k (seqlen)", seqlen_k)?,
        ..params
    };
    if batch == 0 || seqlen_q == 0 {
        return Ok(()); // no rows
    }

    let [qs, ks, vs, os] = [q.launch_strides(), k.launch_strides(), v.launch_strides(), o.launch_strides()];
    let lse_strides = lse.as_deref().map(|l| l.launch_strides()).unwrap_or_default();
    let mut launch = Launch::new(*stream);
    let score_mod = opts.score_mod.abi(&mut launch, batch, heads_q)?;
    let (rope, rope_k, rope_k_positions) = rope_abi(&mut launch, opts, head_dim, batch * seqlen_q, batch * seqlen_k)?;
    let params = take_pointers(&mut launch, [q, k, v], seqlen_k > 0, o, lse, params)?;
    let params = sys::FaPrefillParams {
        q_batch_stride: qs[0],
        q_row_stride: qs[1],
        q_head_stride: qs[2],
        k_batch_stride: ks[0],
        k_row_stride: ks[1],
        k_head_stride: ks[2],
        v_batch_stride: vs[0],
        v_row_stride: vs[1],
        v_head_stride: vs[2],
        o_batch_stride: os[0],
        o_row_stride: os[1],
        o_head_stride: os[2],
        lse_batch_stride: lse_strides[0],
        lse_head_stride: lse_strides[1],
        score_mod,
        rope,
        rope_k,
        rope_k_positions,
        ..params
    };
    if runs_streaming(head_dim, head_dim_v) {
        return wide::run(launch, "prefill", &params, wide::Keys::Dense);
    }
    let op = |ptr, head_dim, rows, heads, s: [i64; 4]| sm90::Operand {
        ptr,
        head_dim,
        rows,
        heads,
        batch,
        strides: [s[1], s[2], s[0]],
    };
    let ops = sm90::Operands {
        elem_bytes: std::mem::size_of::<T>(),
        q: op(params.q, head_dim, seqlen_q, heads_q, qs),
        kv: (seqlen_k > 0).then(|| {
            (op(params.k, head_dim, seqlen_k, heads_kv, ks), op(params.v, head_dim_v, seqlen_k, heads_kv, vs))
        }),
        o: Some(op(params.o.cast_const(), head_dim_v, seqlen_q, heads_q, os)),
    };
    sm90::run(launch, "prefill", stream, opts, choice, params, &ops)
}

/// The call's RoPE for the kernel (off without one): `query_rows` positions, optional; with `rope_k`, the K
/// switch and `key_rows` key positions, optional.
fn rope_abi<'l>(
    launch: &mut Launch<'l>,
    opts: &PrefillOptions<'l>,
    head_dim: usize,
    query_rows: usize,
    key_rows: usize,
) -> Result<(sys::FaRope, i32, *const i32)> {
    let Some(r) = &opts.rope else { return Ok((sys::FaRope::default(), 0, std::ptr::null())) };
    let rope = r.abi(launch, head_dim, query_rows, false)?;
    let Some(keys) = &opts.rope_k else { return Ok((rope, 0, std::ptr::null())) };
    let positions = match keys.positions {
        Some(p) => crate::rope::positions_abi(launch, c"rope_k_positions", p, key_rows, rope.max_pos as usize)?,
        None => std::ptr::null(),
    };
    Ok((rope, 1, positions))
}

/// Sequences (and packed totals) longer than [`MAX_PREFILL_SEQLEN`] are Overflow errors.
fn check_seqlens(lens: &[(&str, usize)]) -> Result<()> {
    for &(name, len) in lens {
        if len > MAX_PREFILL_SEQLEN {
            return Err(Error::overflow(name, format!("{len} rows (at most {MAX_PREFILL_SEQLEN})")));
        }
    }
    Ok(())
}

/// Reads a cu_seqlens tensor when it lives in host memory (emulator backend) so that its contents can be
/// validated; GPU tensors are not read (that would synchronise): the kernel clamps them to the tensors.
pub(crate) fn host_values<'a>(view: &'a TensorView<'_, i32, 1>) -> Option<&'a [i32]> {
    match &view.mem {
        Mem::Host(h) => Some(&h[..view.dim(0)]),
        Mem::Gpu(_) | Mem::Device(_) => None,
    }
}

/// Host-side check of one cu_seqlens array: starts at 0, non-decreasing, ends within `total`, and no
/// sequence longer than `max_seqlen`.
pub(crate) fn check_cu_seqlens(name: &str, cu: &[i32], total: usize, max_seqlen: usize) -> Result<()> {
    if cu[0] != 0 {
        return Err(Error::shape(name, format!("must start at 0, starts at {}", cu[0])));
    }
    for (b, w) in cu.windows(2).enumerate() {
        let len = i64::from(w[1]) - i64::from(w[0]);
        if len < 0 {
            return Err(Error::shape(name, format!("decreases at sequence {b} ({} -> {})", w[0], w[1])));
        }
        if len as u64 > max_seqlen as u64 {
            return Err(Error::shape(name, format!("sequence {b} has {len} rows, more than the maximum {max_seqlen}")));
        }
    }
    let last = *cu.last().unwrap(); // ok: cu[0] was read above, so cu is not empty
    if last as u64 > total as u64 {
        return Err(Error::shape(name, format!("ends at {last}, past the {total} packed rows")));
    }
    Ok(())
}

/// Variable-length prefill attention over packed sequences, enqueued on `stream`. Sequence b owns rows
/// `cu_seqlens_q[b]..cu_seqlens_q[b+1]` of `q`/`o` and `cu_seqlens_k[b]..cu_seqlens_k[b+1]` of `k`/`v`;
/// zero-length sequences are allowed (a query row with no key gives o = 0, lse = -inf).
///  - `q [total_q, Hq, D]`, `k`/`v [total_k, Hkv, D]`, `o [total_q, Hq, D]`;
///  - `cu_seqlens_q`, `cu_seqlens_k`: int32 `[B+1]`, contiguous;
///  - `max_seqlen_q` / `max_seqlen_k`: upper bounds of the sequence lengths (the grid covers
///    `max_seqlen_q` rows per sequence);
///  - `lse`: optional `[Hq, total_q]` fp32 natural log (unit stride along rows).
///
/// On the emulator backend the cu_seqlens contents are validated (Shape errors); on a GPU they are not read
/// on the host, and the kernel clamps them to the packed tensors, so inconsistent values give unspecified
/// (but in-bounds) results.
#[allow(clippy::too_many_arguments)]
pub fn prefill_varlen<T: Element>(
    stream: &Stream<'_>,
    q: &TensorView<'_, T, 3>,
    k: &TensorView<'_, T, 3>,
    v: &TensorView<'_, T, 3>,
    cu_seqlens_q: &TensorView<'_, i32, 1>,
    cu_seqlens_k: &TensorView<'_, i32, 1>,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    o: &mut TensorViewMut<'_, T, 3>,
    lse: Option<&mut TensorViewMut<'_, f32, 2>>,
    opts: &PrefillOptions,
) -> Result<()> {
    let [total_q, heads_q, head_dim] = q.shape();
    let [total_k, heads_kv, d_k] = k.shape();
    let head_dim_v = v.dim(2);
    check_heads(head_dim, d_k, head_dim_v, heads_q, heads_kv)?;
    v.expect_shape("v", [total_k, heads_kv, head_dim_v])?;
    o.expect_shape("o", [total_q, heads_q, head_dim_v])?;
    let entries = cu_seqlens_q.dim(0);
    if entries == 0 {
        return Err(Error::shape("cu_seqlens_q", "needs B + 1 >= 1 entries, has 0"));
    }
    if cu_seqlens_k.dim(0) != entries {
        return Err(Error::shape(
            "cu_seqlens_k",
            format!("has {} entries, cu_seqlens_q has {entries} (both must be B + 1)", cu_seqlens_k.dim(0)),
        ));
    }
    let batch = entries - 1;
    check_rows_all(q, k, v, o)?;
    cu_seqlens_q.check_rows("cu_seqlens_q", 4)?;
    cu_seqlens_k.check_rows("cu_seqlens_k", 4)?;
    if let Some(l) = lse.as_deref() {
        l.expect_shape("lse", [heads_q, total_q])?;
        l.check_rows("lse", 4)?;
        l.check_disjoint("lse")?;
    }
    if batch > MAX_GRID_YZ {
        return Err(Error::unsupported("cu_seqlens_q", format!("batch {batch} (at most {MAX_GRID_YZ})")));
    }
    if let (Some(cq), Some(ck)) = (host_values(cu_seqlens_q), host_values(cu_seqlens_k)) {
        check_cu_seqlens("cu_seqlens_q", cq, total_q, max_seqlen_q)?;
        check_cu_seqlens("cu_seqlens_k", ck, total_k, max_seqlen_k)?;
    }
    check_seqlens(&[("q", total_q), ("k", total_k), ("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)])?;
    let (choice, params) = shared_params::<T>(stream, opts, (head_dim, head_dim_v), heads_q, heads_kv)?;
    let params = sys::FaPrefillParams {
        batch: to_i32("cu_seqlens_q (batch)", batch)?,
        seqlen_q: to_i32("max_seqlen_q", max_seqlen_q)?,
        seqlen_k: to_i32("max_seqlen_k", max_seqlen_k)?,
        total_q: to_i32("q (rows)", total_q)?,
        total_k: to_i32("k (rows)", total_k)?,
        ..params
    };
    if batch == 0 || total_q == 0 || max_seqlen_q == 0 {
        return Ok(()); // no rows
    }

    let [qs, ks, vs, os] = [q.launch_strides(), k.launch_strides(), v.launch_strides(), o.launch_strides()];
    let lse_head_stride = lse.as_deref().map(|l| l.launch_strides()[0]).unwrap_or(0);
    let mut launch = Launch::new(*stream);
    let score_mod = opts.score_mod.abi(&mut launch, batch, heads_q)?;
    let (rope, rope_k, rope_k_positions) = rope_abi(&mut launch, opts, head_dim, total_q, total_k)?;
    let params = take_pointers(&mut launch, [q, k, v], total_k > 0, o, lse, params)?;
    let cu_q_ptr = launch.input(c"cu_seqlens_q", cu_seqlens_q, 4)?;
    let cu_k_ptr = launch.input(c"cu_seqlens_k", cu_seqlens_k, 4)?;
    let params = sys::FaPrefillParams {
        cu_seqlens_q: cu_q_ptr as *const i32,
        cu_seqlens_k: cu_k_ptr as *const i32,
        q_row_stride: qs[0],
        q_head_stride: qs[1],
        k_row_stride: ks[0],
        k_head_stride: ks[1],
        v_row_stride: vs[0],
        v_head_stride: vs[1],
        o_row_stride: os[0],
        o_head_stride: os[1],
        lse_head_stride,
        score_mod,
        rope,
        rope_k,
        rope_k_positions,
        ..params
    };
    if runs_streaming(head_dim, head_dim_v) {
        return wide::run(launch, "prefill_varlen", &params, wide::Keys::Varlen { total_k });
    }
    // Varlen maps: all packed rows, a batch of 1 (a sequence starts at its cu_seqlens row).
    let op = |ptr, head_dim, rows, heads, s: [i64; 3]| sm90::Operand {
        ptr,
        head_dim,
        rows,
        heads,
        batch: 1,
        strides: [s[0], s[1], 0],
    };
    let ops = sm90::Operands {
        elem_bytes: std::mem::size_of::<T>(),
        q: op(params.q, head_dim, total_q, heads_q, qs),
        kv: (total_k > 0)
            .then(|| (op(params.k, head_dim, total_k, heads_kv, ks), op(params.v, head_dim_v, total_k, heads_kv, vs))),
        o: None,
    };
    sm90::run(launch, "prefill_varlen", stream, opts, choice, params, &ops)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tile_configs_match_the_kernel() {
        let tiled = || PREFILL_HEAD_DIMS.into_iter().filter(|&d| !runs_streaming(d, d));
        for d in PREFILL_HEAD_DIMS {
            // Past 256 the decode kernel serves prefill: no tile config of its own.
            assert_eq!(TileConfig::for_head_dim(d).is_none(), runs_streaming(d, d), "D={d}");
        }
        for d in tiled() {
            let c = TileConfig::for_head_dim(d).unwrap();
            assert_eq!(c.threads(), 128);
            assert!(c.smem_bytes <= 99 * 1024, "D={d}: {} bytes", c.smem_bytes);
            assert_eq!(c.block_m % 16, 0);
            assert_eq!(c.block_n % 16, 0);
        }
        assert_eq!(TileConfig::for_head_dim(128).unwrap().smem_bytes, 96 * 1024 + 4 * 48 + 128 * 16);
        // The d128 _mod kernel: 128 x 32, 3 stages, the lean loop's parking (spill-free on sm_100/sm_120 too).
        assert_eq!(TileConfig::for_kernel(128, true).unwrap().smem_bytes, 80 * 1024 + 4 * 48 + 128 * 16);
        assert_eq!(TileConfig::for_kernel(128, true).unwrap().block_n, 32);
        assert_eq!(TileConfig::for_head_dim(128).unwrap().block_n, 64);
        for d in tiled() {
            let c = TileConfig::for_kernel(d, true).unwrap();
            assert!(c.smem_bytes <= 99 * 1024, "D={d} _mod: {} bytes", c.smem_bytes);
            if d != 128 {
                assert_eq!(c, TileConfig::for_head_dim(d).unwrap());
            }
        }
        assert_eq!(TileConfig::for_head_dim(256).unwrap().smem_bytes, 96 * 1024);
        assert_eq!(TileConfig::for_head_dim(200).unwrap().smem_bytes, 96 * 1024);
        assert_eq!(TileConfig::for_head_dim(160).unwrap().smem_bytes, 80 * 1024);
        assert_eq!(TileConfig::for_head_dim(192).unwrap().smem_bytes, 96 * 1024);
        assert_eq!(
            TileConfig::for_head_dim(80).unwrap(),
            TileConfig { head_dim: 80, head_dim_v: 80, ..TileConfig::for_head_dim(96).unwrap() }
        );
        // A V head dim different from Q·K's: the wider one's kernel, or the next with predicated columns.
        for ((d, dv), width) in
            [((192, 128), 192), ((128, 64), 160), ((64, 128), 160), ((96, 64), 96), ((256, 128), 256)]
        {
            for variant in [false, true] {
                let c = TileConfig::for_pair(d, dv, variant).unwrap();
                assert_eq!((c.head_dim, c.head_dim_v, c.width), (d, dv, width), "{d}/{dv}");
                let same = TileConfig::for_kernel(width, variant).unwrap();
                assert_eq!(c, TileConfig { head_dim: d, head_dim_v: dv, ..same }, "{d}/{dv}");
            }
        }
        assert!(TileConfig::for_pair(256, 264, false).is_none());
        assert!(TileConfig::for_pair(128, 100, false).is_none());
        assert_eq!(TileConfig::for_head_dim(112).unwrap().width, 160);
        assert!(TileConfig::for_head_dim(100).is_none());
        assert!(TileConfig::for_head_dim(24).is_none());
        assert!(TileConfig::for_head_dim(264).is_none());
        assert_eq!(TileConfig::for_head_dim(128).unwrap().grid(1000, 8, 3), [8, 8, 3]);
        assert_eq!(TileConfig::for_head_dim(256).unwrap().grid(65, 1, 1), [2, 1, 1]);
    }

    /// kv_block_range against the mask definition, exhaustively on small sizes: every visited tile
    /// holds a visible key, every tile past n_end holds none, tiles below n_mask_begin are fully visible to
    /// every valid row, and the first masked tile really needs the mask.
    #[test]
    fn kv_block_range_matches_the_mask() {
        let windows = [
            Window::causal(false),
            Window::causal(true),
            Window { left: Some(0), right: Some(0) },
            Window { left: Some(5), right: Some(0) },
            Window { left: Some(20), right: None },
            Window { left: None, right: Some(3) },
            Window { left: Some(40), right: Some(17) },
            Window { left: Some(100), right: Some(0) },
        ];
        for (br, bc) in [(16, 16), (32, 16), (16, 32), (128, 32), (64, 64)] {
            for tq in (1..70usize).step_by(3) {
                for tk in (0..70usize).step_by(2) {
                    for w in windows {
                        for m0 in (0..tq).step_by(br) {
                            let r = kv_block_range(m0, br, bc, tq, tk, w);
                            let rows = m0..(m0 + br).min(tq);
                            let tile_any =
                                |n: usize| rows.clone().any(|i| (n * bc..(n + 1) * bc).any(|j| w.sees(i, j, tq, tk)));
                            let tile_full =
                                |n: usize| rows.clone().all(|i| (n * bc..(n + 1) * bc).all(|j| w.sees(i, j, tq, tk)));
                            let ctx = format!("br={br} bc={bc} tq={tq} tk={tk} {w:?} m0={m0}: {r:?}");
                            assert!(r.n_begin <= r.n_interior_begin && r.n_interior_begin <= r.n_mask_begin, "{ctx}");
                            assert!(r.n_mask_begin <= r.n_end, "{ctx}");
                            if r.n_begin == r.n_end {
                                assert!((0..tk.div_ceil(bc)).all(|n| !tile_any(n)), "{ctx}: empty range");
                                continue;
                            }
                            for n in r.n_begin..r.n_end {
                                assert!(tile_any(n), "{ctx}: tile {n} visited but empty");
                            }
                            for n in (0..r.n_begin).chain(r.n_end..tk.div_ceil(bc) + 1) {
                                assert!(!tile_any(n), "{ctx}: tile {n} skipped but has visible keys");
                            }
                            for n in r.n_interior_begin..r.n_mask_begin {
                                assert!(tile_full(n), "{ctx}: tile {n} unmasked but needs the mask");
                            }
                            // Masked tiles at either edge really need the mask.
                            if r.n_mask_begin < r.n_end {
                                assert!(!tile_full(r.n_mask_begin), "{ctx}: first masked tile needs no mask");
                            }
                            if r.n_begin < r.n_interior_begin {
                                assert!(!tile_full(r.n_interior_begin - 1), "{ctx}: last left-edge tile needs no mask");
                            }
                            // Every row's visible keys are a range inside the visited tiles.
                            for i in rows.clone() {
                                let (lo, hi) = w.visible_range(i, tq, tk);
                                assert_eq!(
                                    (lo..hi).collect::<Vec<_>>(),
                                    (0..tk).filter(|&j| w.sees(i, j, tq, tk)).collect::<Vec<_>>()
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn causal_skips_tiles_above_the_diagonal() {
        // Tq = Tk = 1024, Br 128, Bc 32: query tile m sees keys up to 128 m + 127, i.e. 4 (m + 1) tiles, of
        // which only the 4 that cross the diagonal are masked.
        for m in 0..8 {
            let r = kv_block_range(128 * m, 128, 32, 1024, 1024, Window::causal(true));
            assert_eq!(r, range(0, 4 * (m + 1), 4 * m, 0));
        }
        // Non-causal, even Tk: no mask at all; ragged Tk: only the last tile.
        let plain = Window::causal(false);
        assert_eq!(kv_block_range(0, 128, 32, 1024, 1024, plain), range(0, 32, 32, 0));
        assert_eq!(kv_block_range(0, 128, 32, 1024, 1000, plain), range(0, 32, 31, 0));
        // Tq > Tk causal: the first Tq - Tk rows see nothing.
        let causal = Window::causal(true);
        assert_eq!(kv_block_range(0, 64, 32, 200, 50, causal).n_end, 0);
        assert_eq!(kv_block_range(128, 64, 32, 200, 50, causal), range(0, 2, 0, 0));
    }

    fn range(n_begin: usize, n_end: usize, n_mask_begin: usize, n_interior_begin: usize) -> KvBlockRange {
        KvBlockRange { n_begin, n_end, n_mask_begin, n_interior_begin }
    }

    #[test]
    fn sliding_window_skips_tiles_left_of_the_window() {
        // Tq = Tk = 4096, Br 128, Bc 32, causal window of 256 (left 255, right 0): query tile m (rows
        // 128m .. 128m + 127) sees keys 128m - 255 .. 128m + 127: tiles 4m - 8 .. 4m + 3 (12 of 32 keys),
        // masked at the diagonal (4m .. 4m+3) and at the left edge (4m - 8 .. 4m - 5), mask-free between.
        let w = Window { left: Some(255), right: Some(0) };
        for m in 2..32 {
            assert_eq!(kv_block_range(128 * m, 128, 32, 4096, 4096, w), range(4 * m - 8, 4 * m + 4, 4 * m, 4 * m - 4));
        }
        // Near the start the window is clipped at key 0.
        assert_eq!(kv_block_range(0, 128, 32, 4096, 4096, w), range(0, 4, 0, 0));
        // A window at least as long as the sequence is no window at all.
        for m0 in (0..1000).step_by(128) {
            let big = Window { left: Some(5000), right: Some(0) };
            assert_eq!(
                kv_block_range(m0, 128, 32, 1000, 1000, big),
                kv_block_range(m0, 128, 32, 1000, 1000, Window::causal(true))
            );
        }
    }

    #[test]
    fn cu_seqlens_checks() {
        assert!(check_cu_seqlens("cu", &[0, 3, 3, 10], 10, 7).is_ok());
        assert!(check_cu_seqlens("cu", &[1, 3], 10, 7).is_err());
        assert!(check_cu_seqlens("cu", &[0, 3, 2], 10, 7).is_err());
        assert!(check_cu_seqlens("cu", &[0, 11], 10, 20).is_err());
        assert!(check_cu_seqlens("cu", &[0, 9], 10, 7).is_err());
    }
}
