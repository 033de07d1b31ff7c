//! Typed views of a paged KV cache (vLLM / FlashInfer style) and their validation.
//!
//! Layout (docs/semantics.md): K `[num_pages, page_size, Hkv, Dqk]` and V `[num_pages, page_size, Hkv, Dv]`
//! (Dv = Dqk unless V has a head dim of its own, e.g. DeepSeek's 192 / 128), `page_size` any value in
//! 1..=[`MAX_PAGE_SIZE`] (vLLM's hybrid attention + Mamba models use sizes such as 528 or 1056);
//! `block_table` int32 `[B, max_pages_per_seq]`; `seq_lens` int32 `[B]`; a slot is `page * page_size + offset`.
//!
//! What is validated where. Shapes, strides, page size and the table's capacity are checked here, on the
//! host, when a view is built. `seq_lens` and the `block_table` entries are *data*, which on the GPU backend
//! lives in device memory the host cannot read without a synchronisation; instead the caller promises
//! `max_seq_len` (an upper bound on every `seq_lens[b]`, as vLLM / FlashInfer's trtllm path take it), which
//! is checked against the capacity `max_pages_per_seq * page_size` and used to plan split-KV. The kernels
//! never trust the data: a length is clamped into `[0, capacity]` (a length above `max_seq_len` is still
//! attended in full, the last split runs to the end), and the tokens of an out-of-range page id are masked
//! (weight exactly 0, never zero keys that would dilute the softmax).
//!
//! Engines debugging their own tables can opt in to checking the data: [`PagedKvCache::validate`] (block
//! table and lengths), [`validate_cu_seqlens`] and [`validate_slot_mapping`] read it back (a device-to-host
//! copy and a synchronisation on the GPU backend; direct on the emulator) and return a typed error naming
//! the first bad entry. Never on a GPU launch path. The emulator, where the data is host memory, runs the
//! same checks before every launch unless it was built with [`TableChecks::GpuMasking`].

use crate::device::Stream;
use crate::emu::TableChecks;
use crate::error::{to_i32, Error, Result};
use crate::fast_divmod;
use crate::fp8::{self, KvElement, KvScales, ScaleTensors};
use crate::launch::Launch;
use crate::sys;
use crate::tensor::{Mem, TensorView, TensorViewMut};

/// Largest supported context (tokens per sequence): int32 token indices in the kernel, with headroom for
/// a tile and a split granule past the end.
pub const MAX_TOKENS: usize = i32::MAX as usize - 4096;

/// Largest supported page size (tokens): the longest sequence. No kernel needs a smaller bound: they divide
/// by the page size with [`crate::fast_divmod`]'s constants, exact for every divisor below 2^31, and tile
/// keys independently of pages; a page larger than any sequence could fill would only waste memory.
pub const MAX_PAGE_SIZE: usize = MAX_TOKENS;

/// Page geometry shared by the read-only and the writable view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageGeometry {
    pub num_pages: usize,
    pub page_size: usize,
    pub heads_kv: usize,
    /// K's head dim (Dqk: q's too).
    pub head_dim: usize,
    /// V's head dim (Dv: o's too); `head_dim` unless the V pages are narrower or wider than the K pages.
    pub head_dim_v: usize,
}

impl PageGeometry {
    /// The wider of K's and V's head dims: the width the kernels run at and split partials are sized by.
    pub fn widest_head_dim(&self) -> usize {
        self.head_dim.max(self.head_dim_v)
    }
}

/// Checks K and V pages: the same pages, page size and heads, supported page size, 16-byte rows; V's head dim
/// may differ from K's (a V head dim of its own). Returns the geometry.
fn check_pages(k_shape: [usize; 4], v_shape: [usize; 4]) -> Result<PageGeometry> {
    if k_shape[..3] != v_shape[..3] {
        return Err(Error::shape(
            "v_cache",
            format!("shape {v_shape:?} differs from k_cache {k_shape:?} in pages, page size or heads"),
        ));
    }
    let [num_pages, page_size, heads_kv, head_dim] = k_shape;
    let head_dim_v = v_shape[3];
    if page_size == 0 || page_size > MAX_PAGE_SIZE {
        return Err(Error::unsupported(
            "k_cache",
            format!("page size {page_size} (dimension 1) is outside 1..={MAX_PAGE_SIZE}"),
        ));
    }
    if num_pages == 0 || heads_kv == 0 {
        return Err(Error::shape("k_cache", format!("shape {k_shape:?} has no pages or no heads")));
    }
    if head_dim == 0 || head_dim % 8 != 0 {
        return Err(Error::unsupported("k_cache", format!("head dim {head_dim} is not a positive multiple of 8")));
    }
    if head_dim_v == 0 || head_dim_v % 8 != 0 {
        return Err(Error::unsupported("v_cache", format!("head dim {head_dim_v} is not a positive multiple of 8")));
    }
    let slots = num_pages
        .checked_mul(page_size)
        .ok_or_else(|| Error::overflow("k_cache", "num_pages * page_size overflows"))?;
    to_i32("k_cache (num_pages)", num_pages)?;
    i64::try_from(slots).map_err(|_| Error::overflow("k_cache", "slot count does not fit in i64"))?;
    Ok(PageGeometry { num_pages, page_size, heads_kv, head_dim, head_dim_v })
}

/// The FaPagedCache for a launch: pointers from the caller, strides and geometry from the views.
pub(crate) fn abi_cache(
    g: &PageGeometry,
    k_strides: [i64; 4],
    v_strides: [i64; 4],
    pointers: (*mut std::ffi::c_void, *mut std::ffi::c_void),
    table: Option<(*const i32, *const i32, i64, usize)>,
) -> Result<sys::FaPagedCache> {
    let (block_table, seq_lens, block_table_stride, max_pages) =
        table.unwrap_or((std::ptr::null(), std::ptr::null(), 0, 1));
    let page_div = fast_divmod::divisor(g.page_size)
        .ok_or_else(|| Error::unsupported("page_size", format!("{} is outside 1..={MAX_PAGE_SIZE}", g.page_size)))?;
    Ok(sys::FaPagedCache {
        k_cache: pointers.0,
        v_cache: pointers.1,
        block_table,
        seq_lens,
        k_page_stride: k_strides[0],
        k_token_stride: k_strides[1],
        k_head_stride: k_strides[2],
        v_page_stride: v_strides[0],
        v_token_stride: v_strides[1],
        v_head_stride: v_strides[2],
        block_table_stride,
        page_div,
        num_pages: to_i32("num_pages", g.num_pages)?,
        page_size: to_i32("page_size", g.page_size)?,
        max_pages_per_seq: to_i32("block_table (max_pages_per_seq)", max_pages)?,
        // 16-bit; an FP8 cache's fields are set by crate::fp8::fill_abi.
        kv_dtype: sys::FA_KV_SAME as i32,
        scale_head_stride: 0,
        k_scale: std::ptr::null(),
        v_scale: std::ptr::null(),
        // The paged view (the contiguous ones are prefill's past 256: src/prefill/wide.rs).
        seq_lens_cumulative: 0,
    })
}

/// A read-only paged KV cache with its block table: what decode reads. `T` is the op's fp16/bf16 type, or an
/// FP8 code type ([`crate::fp8::Fp8E4m3`], [`crate::fp8::Fp8E5m2`]) whose dequantisation scales are attached
/// with [`PagedKvCache::with_scales`] (host floats) or [`PagedKvCache::with_scale_tensors`] (device data).
pub struct PagedKvCache<'a, T> {
    pub(crate) k: TensorView<'a, T, 4>,
    pub(crate) v: TensorView<'a, T, 4>,
    pub(crate) block_table: TensorView<'a, i32, 2>,
    pub(crate) seq_lens: TensorView<'a, i32, 1>,
    pub(crate) scales: Option<ScaleTensors<'a>>,
    geometry: PageGeometry,
    max_seq_len: usize,
}

impl<'a, T> PagedKvCache<'a, T> {
    /// Validates and wraps a cache.
    ///  - `k_cache`, `v_cache`: `[num_pages, page_size, Hkv, Dqk]` and `[num_pages, page_size, Hkv, Dv]` (the same
    ///    pages, page size and heads, else `Shape`; Dv = Dqk, or a V head dim of its own such as DeepSeek's
    ///    192 / 128), unit innermost stride, other strides multiples of 16 bytes; page size in
    ///    1..=[`MAX_PAGE_SIZE`] (else `Unsupported`).
    ///  - `block_table`: int32 `[B, max_pages_per_seq]`, unit innermost stride.
    ///  - `seq_lens`: int32 `[B]`, contiguous.
    ///  - `max_seq_len`: the caller's upper bound on `seq_lens` (see the module docs); must not exceed the
    ///    table's capacity `max_pages_per_seq * page_size` (else `Shape`: "block_table too narrow").
    pub fn new(
        k_cache: TensorView<'a, T, 4>,
        v_cache: TensorView<'a, T, 4>,
        block_table: TensorView<'a, i32, 2>,
        seq_lens: TensorView<'a, i32, 1>,
        max_seq_len: usize,
    ) -> Result<Self> {
        let geometry = check_pages(k_cache.shape(), v_cache.shape())?;
        k_cache.check_rows("k_cache", 16)?;
        v_cache.check_rows("v_cache", 16)?;
        if k_cache.is_gpu() != v_cache.is_gpu()
            || k_cache.is_gpu() != block_table.is_gpu()
            || k_cache.is_gpu() != seq_lens.is_gpu()
        {
            return Err(Error::backend(
                "block_table",
                "k_cache, v_cache, block_table and seq_lens must share a backend",
            ));
        }
        let [batch, max_pages] = block_table.shape();
        if max_pages == 0 {
            return Err(Error::shape("block_table", "has no columns (max_pages_per_seq = 0)"));
        }
        block_table.check_rows("block_table", 4)?;
        if seq_lens.shape() != [batch] {
            return Err(Error::shape(
                "seq_lens",
                format!("shape {:?} does not match block_table's {batch} sequences", seq_lens.shape()),
            ));
        }
        if batch > 1 && seq_lens.strides()[0] != 1 {
            return Err(Error::layout("seq_lens", "must be contiguous"));
        }
        let capacity = max_pages
            .checked_mul(geometry.page_size)
            // The kernel indexes tokens in int32, up to a tile and a split granule past the capacity.
            .filter(|&c| c <= MAX_TOKENS)
            .ok_or_else(|| {
                Error::overflow("block_table", format!("max_pages_per_seq * page_size exceeds {MAX_TOKENS}"))
            })?;
        if max_seq_len > capacity {
            return Err(Error::shape(
                "block_table",
                format!(
                    "too narrow: {max_pages} pages x {} tokens = {capacity} < max_seq_len {max_seq_len}",
                    geometry.page_size
                ),
            ));
        }
        to_i32("block_table (batch)", batch)?;
        Ok(Self { k: k_cache, v: v_cache, block_table, seq_lens, scales: None, geometry, max_seq_len })
    }

    /// Attaches the dequantisation scales of an FP8 cache given as host floats (validated and uploaded by
    /// [`KvScales`]): one per tensor or one per KV head (else `Shape`).
    pub fn with_scales(self, scales: &'a KvScales) -> Result<Self> {
        let (k, v) = scales.views()?;
        self.with_scale_tensors(k, v)
    }

    /// Attaches the dequantisation scales of an FP8 cache given as fp32 tensors the caller owns, in the pages'
    /// memory (device memory: a cudarc view or [`TensorView::from_device_ptr`], any stream kind; host slices
    /// on the emulator): `k_scale` and `v_scale` each `[1]` (per tensor) or `[Hkv]` (per KV head), the same
    /// length (else `Shape`), contiguous (else `Layout`), on the pages' backend (else `Backend`), 4-byte aligned
    /// (checked at launch). Their values are never read by the host: the kernels load them at run time, so
    /// an engine may compute or update them on its stream before each launch (or each graph replay). A value
    /// that is not finite and > 0 is not detected; it leaves the outputs of its KV head unspecified and
    /// touches nothing else (docs/semantics.md, "FP8 cache").
    pub fn with_scale_tensors(
        mut self,
        k_scale: TensorView<'a, f32, 1>,
        v_scale: TensorView<'a, f32, 1>,
    ) -> Result<Self> {
        let g = self.geometry;
        self.scales = Some(ScaleTensors::new(k_scale, v_scale, g.heads_kv, self.k.is_gpu())?);
        Ok(self)
    }

    /// The attached FP8 scales, if any.
    pub fn scales(&self) -> Option<&ScaleTensors<'a>> {
        self.scales.as_ref()
    }

    pub fn geometry(&self) -> PageGeometry {
        self.geometry
    }
    pub fn batch(&self) -> usize {
        self.block_table.dim(0)
    }
    pub fn max_pages_per_seq(&self) -> usize {
        self.block_table.dim(1)
    }
    pub fn max_seq_len(&self) -> usize {
        self.max_seq_len
    }
}

impl<T: KvElement> PagedKvCache<'_, T> {
    /// The FaPagedCache of a launch that reads this cache (decode, paged prefill): K, V, the block table,
    /// seq_lens and, for FP8, the scales, taken as inputs of `launch`.
    pub(crate) fn launch_abi<'l>(&'l self, launch: &mut Launch<'l>) -> Result<sys::FaPagedCache> {
        let k_ptr = launch.input(c"k_cache", &self.k, 16)?;
        let v_ptr = launch.input(c"v_cache", &self.v, 16)?;
        let table_ptr = launch.input(c"block_table", &self.block_table, 4)?;
        let lens_ptr = launch.input(c"seq_lens", &self.seq_lens, 4)?;
        let mut abi = abi_cache(
            &self.geometry,
            self.k.launch_strides(),
            self.v.launch_strides(),
            (k_ptr as *mut _, v_ptr as *mut _),
            Some((
                table_ptr as *const i32,
                lens_ptr as *const i32,
                self.block_table.launch_strides()[0],
                self.max_pages_per_seq(),
            )),
        )?;
        fp8::fill_abi(&mut abi, T::KV_DTYPE, self.scales.as_ref(), launch)?;
        Ok(abi)
    }
}

impl<T> PagedKvCache<'_, T> {
    /// Reads `seq_lens` and `block_table` back and checks them (opt-in, for debugging; synchronises `stream`
    /// on the GPU backend): every `seq_lens[b]` in `0..=max_seq_len` (else `Shape`), and every block-table
    /// entry a sequence uses (the first ⌈seq_len / page_size⌉ of its row) in `0..num_pages` (else
    /// `OutOfBounds`). The error names the first bad entry, e.g. `block_table: block_table[2][5] = 977 (tokens
    /// 80..96 of sequence 2) is outside 0..512`.
    pub fn validate(&self, stream: &Stream<'_>) -> Result<()> {
        let lens = read_back(stream, "seq_lens", &self.seq_lens)?;
        let table = read_back(stream, "block_table", &self.block_table)?;
        let (ps, np, width) = (self.geometry.page_size, self.geometry.num_pages, self.max_pages_per_seq());
        for (b, &len) in lens.iter().enumerate() {
            let n = usize::try_from(len).ok().filter(|&n| n <= self.max_seq_len).ok_or_else(|| {
                Error::shape(
                    "seq_lens",
                    format!("seq_lens[{b}] = {len} is outside 0..={} (max_seq_len)", self.max_seq_len),
                )
            })?;
            for p in 0..n.div_ceil(ps) {
                let id = table[b * width + p];
                if usize::try_from(id).map_or(true, |id| id >= np) {
                    let (t0, t1) = (p * ps, ((p + 1) * ps).min(n));
                    return Err(Error::out_of_bounds(
                        "block_table",
                        format!("block_table[{b}][{p}] = {id} (tokens {t0}..{t1} of sequence {b}) is outside 0..{np}"),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Whether a launch on `stream` checks its engine-owned tables first: an emulator with
/// [`TableChecks::Strict`] (the default). Never the GPU, whose tables are device data.
pub(crate) fn strict_tables(stream: &Stream<'_>) -> bool {
    matches!(stream, Stream::Emu(emu) if emu.table_checks() == TableChecks::Strict)
}

/// Reads `cu_seqlens` back and checks it (opt-in, for debugging; synchronises on the GPU backend): it starts
/// at 0, never decreases, ends at most at `total_tokens` (the packed rows of the tensor it indexes), and no
/// sequence is longer than `max_seqlen` (the bound passed to the varlen op). `Shape` error naming the first
/// bad entry otherwise.
pub fn validate_cu_seqlens(
    stream: &Stream<'_>,
    cu_seqlens: &TensorView<'_, i32, 1>,
    total_tokens: usize,
    max_seqlen: usize,
) -> Result<()> {
    let cu = read_back(stream, "cu_seqlens", cu_seqlens)?;
    match cu.first() {
        None => return Err(Error::shape("cu_seqlens", "is empty (needs batch + 1 entries)")),
        Some(&c) if c != 0 => return Err(Error::shape("cu_seqlens", format!("cu_seqlens[0] = {c}, must be 0"))),
        _ => {}
    }
    for (i, w) in cu.windows(2).enumerate() {
        let len = i64::from(w[1]) - i64::from(w[0]);
        if len < 0 || len as usize > max_seqlen || w[1] as usize > total_tokens {
            return Err(Error::shape(
                "cu_seqlens",
                format!(
                    "cu_seqlens[{}] = {} after {}: sequence {i} has length {len} (allowed 0..={max_seqlen}, \
                     ending at most at {total_tokens})",
                    i + 1,
                    w[1],
                    w[0]
                ),
            ));
        }
    }
    Ok(())
}

/// Reads a slot mapping back and checks it against the cache geometry (opt-in, for debugging; synchronises
/// on the GPU backend): every slot is negative (padding, skipped) or below `num_pages * page_size` (else
/// `OutOfBounds`), and no slot is written twice (else `Shape`: two tokens racing for one slot).
pub fn validate_slot_mapping(
    stream: &Stream<'_>,
    slot_mapping: &TensorView<'_, i64, 1>,
    geometry: &PageGeometry,
) -> Result<()> {
    let slots = read_back(stream, "slot_mapping", slot_mapping)?;
    let capacity = geometry.num_pages.saturating_mul(geometry.page_size); // a user-built geometry may be absurd
    let mut first_use = std::collections::HashMap::new();
    for (i, &s) in slots.iter().enumerate() {
        if s < 0 {
            continue;
        }
        if s as u64 >= capacity as u64 {
            return Err(Error::out_of_bounds(
                "slot_mapping",
                format!("slot_mapping[{i}] = {s} is outside 0..{capacity} (num_pages x page_size)"),
            ));
        }
        if let Some(j) = first_use.insert(s, i) {
            return Err(Error::shape("slot_mapping", format!("slot_mapping[{i}] = {s} repeats slot_mapping[{j}]")));
        }
    }
    Ok(())
}

/// The elements of a 1-D or 2-D int view in logical order, read from the host slice or copied from the
/// device (one synchronising copy of the span the view covers).
fn read_back<E, const N: usize>(stream: &Stream<'_>, name: &str, view: &TensorView<'_, E, N>) -> Result<Vec<E>>
where
    E: Copy + Default + cudarc::driver::DeviceRepr,
{
    let (shape, strides) = (view.shape(), view.strides());
    let span = if shape.contains(&0) {
        0
    } else {
        (0..N).map(|d| (shape[d] - 1) as i64 * strides[d]).sum::<i64>() as usize + 1
    };
    let data: Vec<E> = match (&view.mem, stream) {
        (Mem::Host(s), Stream::Emu(_)) => s[..span].to_vec(),
        (Mem::Gpu(v), Stream::Gpu(cu)) => {
            let host = cu.clone_dtoh(&v.slice(0..span))?;
            cu.synchronize()?;
            host
        }
        (Mem::Device(_), Stream::Gpu(_) | Stream::Raw(_)) => {
            return Err(Error::usage(format!(
                "{name}: a raw device view (TensorView::from_device_ptr) cannot be read back: fused-attn copies \
                 only cudarc views (on a GPU stream) or host slices (on the emulator)"
            )))
        }
        _ => return Err(Error::backend(name, "view and stream belong to different backends")),
    };
    Ok(crate::tensor::logical_elements(&data, shape, strides))
}

/// The writable pages of a paged KV cache: what append writes (it addresses slots directly, so it needs no
/// block table).
pub struct PagedKvCacheMut<'a, T> {
    pub(crate) k: TensorViewMut<'a, T, 4>,
    pub(crate) v: TensorViewMut<'a, T, 4>,
    pub(crate) scales: Option<ScaleTensors<'a>>,
    geometry: PageGeometry,
}

impl<'a, T> PagedKvCacheMut<'a, T> {
    /// Validates and wraps writable pages (same rules as [`PagedKvCache::new`] for K and V).
    pub fn new(k_cache: TensorViewMut<'a, T, 4>, v_cache: TensorViewMut<'a, T, 4>) -> Result<Self> {
        let geometry = check_pages(k_cache.shape(), v_cache.shape())?;
        k_cache.check_rows("k_cache", 16)?;
        v_cache.check_rows("v_cache", 16)?;
        // Append writes every slot's rows: two slots (or heads) at one address would race.
        k_cache.check_disjoint("k_cache")?;
        v_cache.check_disjoint("v_cache")?;
        if k_cache.is_gpu() != v_cache.is_gpu() {
            return Err(Error::backend("v_cache", "k_cache and v_cache must share a backend"));
        }
        Ok(Self { k: k_cache, v: v_cache, scales: None, geometry })
    }

    /// Attaches the quantisation scales of an FP8 cache as host floats (see [`PagedKvCache::with_scales`]).
    pub fn with_scales(self, scales: &'a KvScales) -> Result<Self> {
        let (k, v) = scales.views()?;
        self.with_scale_tensors(k, v)
    }

    /// Attaches the quantisation scales of an FP8 cache as tensors the caller owns (the rules of
    /// [`PagedKvCache::with_scale_tensors`]; append divides by them at run time).
    pub fn with_scale_tensors(
        mut self,
        k_scale: TensorView<'a, f32, 1>,
        v_scale: TensorView<'a, f32, 1>,
    ) -> Result<Self> {
        let g = self.geometry;
        self.scales = Some(ScaleTensors::new(k_scale, v_scale, g.heads_kv, self.k.is_gpu())?);
        Ok(self)
    }

    /// The attached FP8 scales, if any.
    pub fn scales(&self) -> Option<&ScaleTensors<'a>> {
        self.scales.as_ref()
    }

    pub fn geometry(&self) -> PageGeometry {
        self.geometry
    }

    /// A read-only cache over the same pages with a block table, e.g. to decode right after appending.
    pub fn with_table<'b>(
        &'b self,
        block_table: TensorView<'b, i32, 2>,
        seq_lens: TensorView<'b, i32, 1>,
        max_seq_len: usize,
    ) -> Result<PagedKvCache<'b, T>> {
        let cache = PagedKvCache::new(self.k.as_view(), self.v.as_view(), block_table, seq_lens, max_seq_len)?;
        match &self.scales {
            Some(s) => cache.with_scale_tensors(s.k().clone(), s.v().clone()),
            None => Ok(cache),
        }
    }
}

#[cfg(test)]
mod tests {

    /// Issue 46 (E3): tables in raw device memory cannot be read back (there is nothing to copy with): a
    /// `Usage` error saying so, naming the table, not "different backends". The handles are never used.
    #[test]
    fn raw_views_cannot_be_read_back() {
        let raw = crate::device::RawStream::from_raw_parts_for_tests(0x100 as _, 0x10 as _);
        // SAFETY: nothing is launched or read: the check refuses before touching the memory.
        let slots = unsafe { TensorView::<i64, 1>::from_device_ptr(1 << 20, 4, [4]) }.unwrap();
        let g = PageGeometry { num_pages: 4, page_size: 16, heads_kv: 1, head_dim: 64, head_dim_v: 64 };
        let e = validate_slot_mapping(&Stream::Raw(raw), &slots, &g).unwrap_err();
        assert_eq!(e.kind(), &crate::ErrorKind::Usage);
        assert!(e.message().starts_with("slot_mapping:"), "{}", e.message());
    }
    use super::*;
    use crate::ErrorKind;
    use half::bf16;

    /// `PagedKvCache::new` over zero bf16 pages (K `k_shape`, V `v_shape`), a zero block table `table` and
    /// `lens` zero lengths: the cache's batch and geometry, or its error.
    fn try_cache(
        k_shape: [usize; 4],
        v_shape: [usize; 4],
        table: [usize; 2],
        lens: usize,
        max_seq_len: usize,
    ) -> Result<(usize, PageGeometry)> {
        let (k, v) = (vec![bf16::ZERO; k_shape.iter().product()], vec![bf16::ZERO; v_shape.iter().product()]);
        let (t, l) = (vec![0i32; table[0] * table[1]], vec![0i32; lens]);
        let c = PagedKvCache::new(
            TensorView::host(&k, k_shape).unwrap(),
            TensorView::host(&v, v_shape).unwrap(),
            TensorView::host(&t, table).unwrap(),
            TensorView::host(&l, [lens]).unwrap(),
            max_seq_len,
        )?;
        Ok((c.batch(), c.geometry()))
    }

    #[test]
    fn valid_cache() {
        let (batch, geometry) = try_cache([5, 16, 2, 64], [5, 16, 2, 64], [3, 4], 3, 64).unwrap();
        assert_eq!(batch, 3);
        assert_eq!(geometry, PageGeometry { num_pages: 5, page_size: 16, heads_kv: 2, head_dim: 64, head_dim_v: 64 });
        let (_, geometry) = try_cache([5, 16, 2, 192], [5, 16, 2, 128], [3, 4], 3, 64).unwrap();
        assert_eq!((geometry.head_dim, geometry.head_dim_v, geometry.widest_head_dim()), (192, 128, 192));
    }

    #[test]
    fn bad_caches_are_typed_errors() {
        let make = |shape: [usize; 4], vshape: [usize; 4], max: usize| {
            try_cache(shape, vshape, [3, 4], 3, max).err().map(|e| e.kind().clone())
        };
        assert_eq!(make([2, 0, 1, 64], [2, 0, 1, 64], 0), Some(ErrorKind::Unsupported), "page size 0");
        assert_eq!(make([2, 48, 1, 64], [2, 48, 1, 64], 1), None, "page size 48");
        assert_eq!(make([2, 1056, 1, 64], [2, 1056, 1, 64], 4224), None, "page size 1056");
        assert_eq!(make([2, 3, 1, 64], [2, 3, 1, 64], 13), Some(ErrorKind::Shape), "4 pages x 3 < 13");
        assert_eq!(make([2, 16, 1, 64], [2, 16, 2, 64], 1), Some(ErrorKind::Shape), "K/V mismatch");
        assert_eq!(make([2, 16, 1, 64], [3, 16, 1, 64], 1), Some(ErrorKind::Shape), "K/V pages");
        assert_eq!(make([2, 16, 1, 64], [2, 16, 1, 100], 1), Some(ErrorKind::Unsupported), "Dv=100");
        assert_eq!(make([2, 16, 1, 64], [2, 16, 1, 32], 1), None, "Dv=32");
        assert_eq!(make([2, 16, 1, 64], [2, 16, 1, 64], 65), Some(ErrorKind::Shape), "table too narrow");
        assert_eq!(make([2, 16, 1, 64], [2, 16, 1, 64], 64), None);
        assert_eq!(make([2, 16, 1, 100], [2, 16, 1, 100], 1), Some(ErrorKind::Unsupported), "D=100");
    }

    #[test]
    fn seq_lens_must_match_the_table() {
        let e = try_cache([2, 8, 1, 64], [2, 8, 1, 64], [3, 2], 2, 1).err().unwrap();
        assert_eq!(e.kind(), &ErrorKind::Shape);
        assert!(e.message().starts_with("seq_lens"));
    }
}
