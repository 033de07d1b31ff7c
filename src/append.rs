//! Append: write new tokens' K/V rows into their paged-cache slots (kernel: kernels/append.cu). The same
//! call serves one token per sequence (decode) and whole prompts (prefill into the cache).

use crate::device::Stream;
use crate::dtype::Element;
use crate::error::{to_i32, Error, Result};
use crate::fp8::{self, KvCacheOf};
use crate::launch::Launch;
use crate::paged::{abi_cache, PagedKvCacheMut};
use crate::sys;
use crate::tensor::TensorView;

/// Validates append arguments; returns the token count.
pub fn check_append_args<T: Element, C: KvCacheOf<T>>(
    k: &TensorView<'_, T, 3>,
    v: &TensorView<'_, T, 3>,
    slot_mapping: &TensorView<'_, i64, 1>,
    cache: &PagedKvCacheMut<'_, C>,
) -> Result<usize> {
    let g = cache.geometry();
    fp8::check_cache_dtype::<C>(T::DTYPE, cache.scales.is_some())?;
    for (name, d) in [("k_cache", g.head_dim), ("v_cache", g.head_dim_v)] {
        if C::KV_DTYPE.fp8().is_some() && d % 16 != 0 {
            return Err(Error::unsupported(name, format!("head dim {d} (an FP8 cache needs a multiple of 16)")));
        }
    }
    let [num_tokens, heads_kv, head_dim] = k.shape();
    if heads_kv != g.heads_kv || head_dim != g.head_dim {
        return Err(Error::shape(
            "k",
            format!("shape {:?} does not match the cache's {} KV heads x {} dims", k.shape(), g.heads_kv, g.head_dim),
        ));
    }
    // V: the cache's V head dim (Dv: its own when the V pages are narrower or wider than K's).
    v.expect_shape("v", [num_tokens, heads_kv, g.head_dim_v])?;
    slot_mapping
        .check_index_vector("slot_mapping", num_tokens, || format!("differs from the {num_tokens} tokens of k/v"))?;
    k.check_rows("k", 16)?;
    v.check_rows("v", 16)?;
    to_i32("k (tokens)", num_tokens)?;
    Ok(num_tokens)
}

/// Options of one append call: `AppendOptions { rope: Some(rope) }`.
#[derive(Debug, Clone, Copy, Default)]
pub struct AppendOptions<'a> {
    /// Rotate K at `rope.positions[t]` (one int32 per token, required) on its way into the cache, in fp32,
    /// then round (16-bit cache) or quantise (FP8) once (docs/rope.md). V is never rotated.
    pub rope: Option<crate::rope::Rope<'a>>,
}

/// Writes `k[t]`, `v[t]` (`[num_tokens, Hkv, Dqk]` and `[num_tokens, Hkv, Dv]`, the cache's K and V head dims)
/// into cache slot `slot_mapping[t]` (int64,
/// `page * page_size + offset`). A negative slot is padding and is skipped; so is a slot past the cache
/// (device data the host does not read; documented in abi.h). Slots must be distinct. On the emulator a slot
/// past the cache or a repeated one is an error naming it ([`crate::TableChecks`], unless `GpuMasking`).
///
/// An FP8 cache (`C` = [`crate::Fp8E4m3`] / [`crate::Fp8E5m2`], scales attached with
/// [`PagedKvCacheMut::with_scales`] or [`PagedKvCacheMut::with_scale_tensors`], read on the device at run
/// time) receives the quantised values: `fp8_rn_satfinite(f32(x) / scale)` with the head's K or V scale
/// (round to nearest even, saturating to the largest finite value, NaN stays NaN).
pub fn append<T: Element, C: KvCacheOf<T>>(
    stream: &Stream<'_>,
    k: &TensorView<'_, T, 3>,
    v: &TensorView<'_, T, 3>,
    slot_mapping: &TensorView<'_, i64, 1>,
    cache: &mut PagedKvCacheMut<'_, C>,
) -> Result<()> {
    append_with(stream, k, v, slot_mapping, cache, &AppendOptions::default())
}

/// [`append`] with options: with `opts.rope`, K row t is stored rotated at position
/// `opts.rope.positions[t]` ([`crate::rope`]); rows of padding slots are neither rotated nor stored.
pub fn append_with<T: Element, C: KvCacheOf<T>>(
    stream: &Stream<'_>,
    k: &TensorView<'_, T, 3>,
    v: &TensorView<'_, T, 3>,
    slot_mapping: &TensorView<'_, i64, 1>,
    cache: &mut PagedKvCacheMut<'_, C>,
    opts: &AppendOptions<'_>,
) -> Result<()> {
    let num_tokens = check_append_args(k, v, slot_mapping, cache)?;
    if crate::paged::strict_tables(stream) {
        crate::paged::validate_slot_mapping(stream, slot_mapping, &cache.geometry())?;
    }
    if num_tokens == 0 {
        return Ok(());
    }
    let g = cache.geometry();
    let (k_strides, v_strides) = (k.launch_strides(), v.launch_strides());
    let (kc_strides, vc_strides) = (cache.k.launch_strides(), cache.v.launch_strides());
    let mut launch = Launch::new(*stream);
    let rope = match &opts.rope {
        Some(r) => r.abi(&mut launch, g.head_dim, num_tokens, true)?,
        None => sys::FaRope::default(),
    };
    let k_ptr = launch.input(c"k", k, 16)?;
    let v_ptr = launch.input(c"v", v, 16)?;
    let slots_ptr = launch.input(c"slot_mapping", slot_mapping, 8)?;
    let kc_ptr = launch.output(c"k_cache", &mut cache.k, 16)?;
    let vc_ptr = launch.output(c"v_cache", &mut cache.v, 16)?;
    let mut cache_abi = abi_cache(&g, kc_strides, vc_strides, (kc_ptr, vc_ptr), None)?;
    fp8::fill_abi(&mut cache_abi, C::KV_DTYPE, cache.scales.as_ref(), &mut launch)?;
    let params = sys::FaAppendParams {
        k: k_ptr,
        v: v_ptr,
        slot_mapping: slots_ptr as *const i64,
        k_token_stride: k_strides[0],
        k_head_stride: k_strides[1],
        v_token_stride: v_strides[0],
        v_head_stride: v_strides[1],
        cache: cache_abi,
        num_tokens: to_i32("num_tokens", num_tokens)?,
        heads_kv: to_i32("heads_kv", g.heads_kv)?,
        head_dim: to_i32("head_dim", g.head_dim)?,
        dtype: T::DTYPE.abi(),
        rope,
        head_dim_v: to_i32("head_dim_v", g.head_dim_v)?,
    };
    launch.run("paged_append", params, sys::fa_append)
}
