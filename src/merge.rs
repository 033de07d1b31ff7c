//! merge_states: combine k partial attention results of the same rows over disjoint key sets into the
//! result over all keys (split-KV's reduction, cascade attention, ring attention across GPUs):
//!   lse = log(Σ_s exp(lse_s)),  o = Σ_s exp(lse_s − lse) · o_s.
//! Empty partials (lse_s = −inf) weigh nothing and their o_s is never read; a row whose partials are all
//! empty gets o = 0, lse = −inf. Kernel: kernels/merge.cu.

use half::{bf16, f16};

use crate::device::Stream;
use crate::error::{to_i32, Error, Result};
use crate::launch::Launch;
use crate::sys;
use crate::tensor::{TensorView, TensorViewMut};

/// Element types of merge states and outputs: fp32 (as split-KV writes them), fp16, bf16.
///
/// Sealed (its `ABI` picks the kernel's bytes per element, see [`crate::Element`]); each impl asserts at
/// compile time that its size is that of its `ABI`. A downstream impl does not compile:
/// ```compile_fail,E0277
/// #[derive(Clone, Copy)]
/// struct B8(u8);
/// impl fused_attn::merge::MergeElement for B8 {
///     const ABI: i32 = fused_attn::sys::FA_DTYPE_F32 as i32; // 4 bytes per element in the kernel
/// }
/// ```
pub trait MergeElement: crate::dtype::sealed::Sealed + Copy + Send + Sync + 'static {
    /// FA_DTYPE_* of abi.h.
    const ABI: i32;
}

/// Bytes per element of an `FA_DTYPE_*` tag (0 for an unknown tag, which no impl has).
const fn abi_bytes(abi: i32) -> usize {
    if abi == sys::FA_DTYPE_F32 as i32 {
        4
    } else if abi == sys::FA_DTYPE_F16 as i32 || abi == sys::FA_DTYPE_BF16 as i32 {
        2
    } else {
        0
    }
}
crate::dtype::impl_sealed!(f32 => abi_bytes(<f32 as MergeElement>::ABI));
const _: () = assert!(abi_bytes(<f16 as MergeElement>::ABI) == std::mem::size_of::<f16>());
const _: () = assert!(abi_bytes(<bf16 as MergeElement>::ABI) == std::mem::size_of::<bf16>());
impl MergeElement for f32 {
    const ABI: i32 = sys::FA_DTYPE_F32 as i32;
}
impl MergeElement for f16 {
    const ABI: i32 = sys::FA_DTYPE_F16 as i32;
}
impl MergeElement for bf16 {
    const ABI: i32 = sys::FA_DTYPE_BF16 as i32;
}

/// Merges `k` states. Shapes: `o_states [k, N, H, D]`, `lse_states [k, N, H]` (natural log, fp32),
/// `o [N, H, D]`, `lse [N, H]` (optional). For plain rows use H = 1. Any non-negative strides with a unit
/// innermost stride; D a multiple of 8 and 16-byte aligned rows (so every access is 16 bytes wide).
pub fn merge_states<S: MergeElement, O: MergeElement>(
    stream: &Stream<'_>,
    o_states: &TensorView<'_, S, 4>,
    lse_states: &TensorView<'_, f32, 3>,
    o: &mut TensorViewMut<'_, O, 3>,
    lse: Option<&mut TensorViewMut<'_, f32, 2>>,
) -> Result<()> {
    merge_states_with_sinks(stream, o_states, lse_states, None, o, lse)
}

/// [`merge_states`] with attention sinks (docs/semantics.md, "Score variants"): `sinks [H]` fp32 (finite;
/// checked when in host memory), row (n, h)'s denominator gains `exp(sinks[h])` exactly once, as one more
/// state with o = 0: `lse = log(exp(sink) + Σ_s exp(lse_s))`, `o = Σ_s exp(lse_s − lse) · o_s`. A row whose
/// states are all empty gets o = 0, lse = sink. This is how split-KV applies sinks: the partials never
/// include them.
pub fn merge_states_with_sinks<S: MergeElement, O: MergeElement>(
    stream: &Stream<'_>,
    o_states: &TensorView<'_, S, 4>,
    lse_states: &TensorView<'_, f32, 3>,
    sinks: Option<&TensorView<'_, f32, 1>>,
    o: &mut TensorViewMut<'_, O, 3>,
    lse: Option<&mut TensorViewMut<'_, f32, 2>>,
) -> Result<()> {
    let [k, n, h, d] = o_states.shape();
    if d == 0 || d % 8 != 0 {
        return Err(Error::unsupported("o_states", format!("head dim {d} is not a positive multiple of 8")));
    }
    lse_states.expect_shape("lse_states", [k, n, h])?;
    o.expect_shape("o", [n, h, d])?;
    o_states.check_rows("o_states", 16)?;
    o.check_rows("o", 16)?;
    o.check_disjoint("o")?;
    if let Some(l) = lse.as_deref() {
        l.expect_shape("lse", [n, h])?;
        l.check_disjoint("lse")?;
    }
    if let Some(sk) = sinks {
        sk.expect_shape("sinks", [h])?;
        sk.check_rows("sinks", 4)?;
        if let crate::tensor::Mem::Host(values) = &sk.mem {
            if let Some(x) = values[..h].iter().find(|x| !x.is_finite()) {
                return Err(Error::unsupported("sinks", format!("{x} (must be finite)")));
            }
        }
    }
    if n * h == 0 {
        return Ok(());
    }
    let (s_strides, ls_strides, o_strides) =
        (o_states.launch_strides(), lse_states.launch_strides(), o.launch_strides());
    let mut launch = Launch::new(*stream);
    // With no states the (empty) state buffers are never touched; their dangling pointers need no alignment.
    let os_ptr = launch.input(c"o_states", o_states, if k == 0 { 1 } else { 16 })?;
    let ls_ptr = launch.input(c"lse_states", lse_states, 4)?;
    let sinks_ptr = match sinks {
        Some(sk) => launch.input(c"sinks", sk, 4)? as *const f32,
        None => std::ptr::null(),
    };
    let o_ptr = launch.output(c"o", o, 16)?;
    let (lse_ptr, lse_strides) = match lse {
        Some(l) => {
            let st = l.launch_strides();
            (launch.output(c"lse", l, 4)? as *mut f32, st)
        }
        None => (std::ptr::null_mut(), [0, 0]),
    };
    let params = sys::FaMergeParams {
        o_states: os_ptr,
        lse_states: ls_ptr as *const f32,
        o: o_ptr,
        lse: lse_ptr,
        o_state_stride: s_strides[0],
        o_outer_stride: s_strides[1],
        o_inner_stride: s_strides[2],
        lse_state_stride: ls_strides[0],
        lse_outer_stride: ls_strides[1],
        lse_inner_stride: ls_strides[2],
        o_out_outer_stride: o_strides[0],
        o_out_inner_stride: o_strides[1],
        lse_out_outer_stride: lse_strides[0],
        lse_out_inner_stride: lse_strides[1],
        num_states: to_i32("o_states (states)", k)?,
        rows_outer: to_i32("o_states (rows)", n)?,
        rows_inner: to_i32("o_states (heads)", h)?,
        head_dim: to_i32("o_states (head dim)", d)?,
        states_dtype: S::ABI,
        out_dtype: O::ABI,
        sinks: sinks_ptr,
        row_list: std::ptr::null(),
        out_rows: to_i32("o (rows)", n)?,
    };
    launch.run("merge_states", params, sys::fa_merge)
}
