//! Multi-head latent attention (MLA: DeepSeek-V2/V3/R1, Kimi K2) over a paged latent cache, in the absorbed
//! form (docs/mla.md; kernels: kernels/mla.cu).
//!
//! Each token caches one row of `kv_lora_rank` latent columns (512) followed by `rope_dim` columns of its
//! rotated decoupled key (64), shared by every query head. The cache is a [`PagedKvCache`] of **one KV head**
//! whose rows are `kv_lora_rank + rope_dim` wide and whose K and V are the same pages
//! (`[num_pages, page_size, 1, 576]`, FlashMLA's layout): [`latent_cache`] builds it from one view. The
//! decode query of head h is `[q_nope_h · W_UK_h | rope(q_pe_h)]` (576 wide); the output is the latent
//! `softmax(q · rowsᵀ · scale) · rows[:, :kv_lora_rank]` (512 wide), still to be multiplied by `W_UV_h`.
//!
//! - [`mla_append`]: writes new tokens' latent and rope key rows into their slots (RoPE optional, on the rope
//!   key only).
//! - [`mla_decode`]: one or more query tokens per sequence (speculative / MTP verification with causal
//!   offsets), split-KV planned by [`MlaPlan::new`] and merged by the merge kernel.

use crate::decode::DecodeWorkspace;
use crate::device::Stream;
use crate::dtype::{Element, KvCacheOf, KvElement};
use crate::error::{to_i32, Error, Result};
use crate::fp8::ScaleTensors;
use crate::launch::Launch;
use crate::paged::{abi_cache, PagedKvCache};
use crate::sys;
use crate::tensor::{TensorView, TensorViewMut};

/// Packed query rows (token, head) per decode CTA: a sequence's `q_len · Hq` rows are cut into blocks of this
/// many, each reading the sequence's cache rows once.
pub const MLA_ROWS_PER_CTA: usize = sys::FA_MLA_ROWS as usize;
/// Widest latent (`kv_lora_rank`) and rope key the kernels take.
pub const MLA_MAX_LATENT_DIM: usize = sys::FA_MLA_MAX_LATENT_DIM as usize;
pub const MLA_MAX_ROPE_DIM: usize = sys::FA_MLA_MAX_ROPE_DIM as usize;

/// The split of a latent cache row: `kv_lora_rank` latent columns, then `rope_dim` rope-key columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlaDims {
    pub kv_lora_rank: usize,
    pub rope_dim: usize,
}

impl Default for MlaDims {
    /// DeepSeek-V2/V3/R1 and Kimi K2: 512 + 64.
    fn default() -> Self {
        Self { kv_lora_rank: 512, rope_dim: 64 }
    }
}

impl MlaDims {
    /// Columns of a cache row (and of a query head): `kv_lora_rank + rope_dim`.
    pub fn row_dim(&self) -> usize {
        self.kv_lora_rank + self.rope_dim
    }
    /// `Unsupported` unless `kv_lora_rank` is a multiple of 8 in 8..=512 and `rope_dim` one in 0..=64.
    pub fn check(&self) -> Result<()> {
        if self.kv_lora_rank == 0 || self.kv_lora_rank % 8 != 0 || self.kv_lora_rank > MLA_MAX_LATENT_DIM {
            return Err(Error::unsupported(
                "kv_lora_rank",
                format!("{} (must be a multiple of 8 in 8..={MLA_MAX_LATENT_DIM})", self.kv_lora_rank),
            ));
        }
        if self.rope_dim % 8 != 0 || self.rope_dim > MLA_MAX_ROPE_DIM {
            return Err(Error::unsupported(
                "rope_dim",
                format!("{} (must be a multiple of 8 in 0..={MLA_MAX_ROPE_DIM})", self.rope_dim),
            ));
        }
        Ok(())
    }
}

/// The latent cache as a [`PagedKvCache`]: `latent` `[num_pages, page_size, 1, kv_lora_rank + rope_dim]`
/// serves as both K and V (the kernels read it once; V is its first `kv_lora_rank` columns).
pub fn latent_cache<'a, T>(
    latent: TensorView<'a, T, 4>,
    block_table: TensorView<'a, i32, 2>,
    seq_lens: TensorView<'a, i32, 1>,
    max_seq_len: usize,
) -> Result<PagedKvCache<'a, T>> {
    PagedKvCache::new(latent.clone(), latent, block_table, seq_lens, max_seq_len)
}

/// An FP8 latent cache (`C` = [`crate::Fp8E4m3`] or [`crate::Fp8E5m2`]) with its one dequantisation scale
/// `scale` (fp32 `[1]`, the cache's memory, read when the kernels run): attached as both the K scale (the
/// scores read `code · scale` over all `kv_lora_rank + rope_dim` columns) and the V scale (the output reads
/// the latent as `code · scale`), the scale [`mla_append`] quantised with. ([`latent_cache`] followed by
/// [`PagedKvCache::with_scale_tensors`] with two different tensors dequantises K and V separately: the
/// kernels honour it, the append does not make such a cache.)
pub fn latent_cache_fp8<'a, C>(
    latent: TensorView<'a, C, 4>,
    block_table: TensorView<'a, i32, 2>,
    seq_lens: TensorView<'a, i32, 1>,
    max_seq_len: usize,
    scale: TensorView<'a, f32, 1>,
) -> Result<PagedKvCache<'a, C>> {
    latent_cache(latent, block_table, seq_lens, max_seq_len)?.with_scale_tensors(scale.clone(), scale)
}

/// Checks that `cache` is a latent cache of `dims`: one KV head, rows of `dims.row_dim()` columns.
fn check_latent_geometry(heads_kv: usize, head_dim: usize, dims: &MlaDims) -> Result<()> {
    dims.check()?;
    if heads_kv != 1 || head_dim != dims.row_dim() {
        return Err(Error::shape(
            "latent_cache",
            format!(
                "{heads_kv} heads x {head_dim} columns; a latent cache has 1 head of kv_lora_rank + rope_dim = {}",
                dims.row_dim()
            ),
        ));
    }
    Ok(())
}

/// Options of [`mla_append`].
#[derive(Clone, Copy, Default)]
pub struct MlaAppendOptions<'a> {
    /// The row split (default 512 + 64).
    pub dims: MlaDims,
    /// Rotate the rope key of token t at `rope.positions[t]` (required; `rotary_dim <= rope_dim`) on its way
    /// in, in fp32, rounded once (fa/rope.cuh, docs/rope.md). The latent is never rotated.
    pub rope: Option<crate::rope::Rope<'a>>,
    /// FP8 cache only (required there, refused for a 16-bit one): the cache's one quantisation scale, fp32
    /// `[1]` in the cache's memory, read when the kernel runs: `stored = fp8_rn_satfinite(f32(x) / scale)`
    /// for the latent and the (rotated) rope key alike. Decode reads the cache with the same value attached
    /// as its `k_scale` and `v_scale` ([`latent_cache_fp8`]).
    pub scale: Option<&'a TensorView<'a, f32, 1>>,
}

impl std::fmt::Debug for MlaAppendOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MlaAppendOptions")
            .field("dims", &self.dims)
            .field("rope", &self.rope)
            .field("scale", &self.scale.map(|s| s.shape()))
            .finish()
    }
}

/// An FP8 latent cache needs both parts in whole 16-column chunks (16 codes per 16-byte copy).
fn check_fp8_dims<C: KvElement>(dims: &MlaDims) -> Result<()> {
    if C::KV_DTYPE.fp8().is_some() && (dims.kv_lora_rank % 16 != 0 || dims.rope_dim % 16 != 0) {
        return Err(Error::unsupported(
            "kv_lora_rank",
            format!("{} + {}: an FP8 latent cache needs both parts multiples of 16", dims.kv_lora_rank, dims.rope_dim),
        ));
    }
    Ok(())
}

/// Writes token t's `latent[t]` (`[N, kv_lora_rank]`) and `k_pe[t]` (`[N, rope_dim]`) into the row of cache
/// slot `slot_mapping[t]` (int64, `page · page_size + offset`; negative = padding, skipped) of `cache`
/// (`[num_pages, page_size, 1, kv_lora_rank + rope_dim]`). Slots must be distinct. On the emulator a slot past
/// the pool or a repeated one is an error naming it (unless [`crate::TableChecks::GpuMasking`]).
///
/// `C` is `T` (a 16-bit cache: the latent copied bit for bit, the rope key rounded once when rotated) or an
/// FP8 code type ([`crate::Fp8E4m3`], [`crate::Fp8E5m2`]) with `opts.scale`: every element of the row is
/// quantised with that one scale, the rope key after its rotation in fp32 (rotate, then quantise, in one
/// pass; both parts multiples of 16 columns).
pub fn mla_append<T: Element, C: KvCacheOf<T>>(
    stream: &Stream<'_>,
    latent: &TensorView<'_, T, 2>,
    k_pe: &TensorView<'_, T, 2>,
    slot_mapping: &TensorView<'_, i64, 1>,
    cache: &mut TensorViewMut<'_, C, 4>,
    opts: &MlaAppendOptions<'_>,
) -> Result<()> {
    let dims = opts.dims;
    let [num_pages, page_size, heads, row] = cache.shape();
    check_latent_geometry(heads, row, &dims)?;
    // The pool's rules, as PagedKvCacheMut's (the launcher's, named here).
    if page_size == 0 || page_size > crate::paged::MAX_PAGE_SIZE {
        return Err(Error::unsupported(
            "latent_cache",
            format!("page size {page_size} (dimension 1) is outside 1..={}", crate::paged::MAX_PAGE_SIZE),
        ));
    }
    if num_pages == 0 {
        return Err(Error::shape("latent_cache", "has no pages"));
    }
    check_fp8_dims::<C>(&dims)?;
    crate::fp8::check_cache_dtype::<C>(T::DTYPE, opts.scale.is_some())?;
    let scales = match opts.scale {
        Some(s) => Some(ScaleTensors::new(s.clone(), s.clone(), 1, cache.is_gpu())?),
        None => None,
    };
    let [n, rank] = latent.shape();
    if rank != dims.kv_lora_rank {
        return Err(Error::shape("latent", format!("{rank} columns, kv_lora_rank is {}", dims.kv_lora_rank)));
    }
    k_pe.expect_shape("k_pe", [n, dims.rope_dim])?;
    slot_mapping.check_index_vector("slot_mapping", n, || format!("differs from the {n} tokens of latent"))?;
    latent.check_rows("latent", 16)?;
    // With rope_dim 0 k_pe has no columns: nothing of it is read, so its strides do not matter.
    if dims.rope_dim > 0 && (k_pe.strides()[1] != 1 || k_pe.strides()[0] % 2 != 0) {
        return Err(Error::layout("k_pe", "needs unit column stride and an even row stride"));
    }
    cache.check_rows("latent_cache", 16)?;
    cache.check_disjoint("latent_cache")?;
    to_i32("latent (tokens)", n)?;
    let g = crate::paged::PageGeometry { num_pages, page_size, heads_kv: 1, head_dim: row, head_dim_v: row };
    if crate::paged::strict_tables(stream) {
        crate::paged::validate_slot_mapping(stream, slot_mapping, &g)?;
    }
    if n == 0 {
        return Ok(());
    }
    let c_strides = cache.launch_strides();
    let mut launch = Launch::new(*stream);
    let rope = match &opts.rope {
        Some(r) => r.abi(&mut launch, dims.rope_dim, n, true)?,
        None => sys::FaRope::default(),
    };
    let latent_ptr = launch.input(c"latent", latent, 16)?;
    // rope_dim 0: the launcher still wants a 4-byte aligned k_pe; latent's pointer stands in (never read as
    // k_pe: a token has no rope columns), with a row stride of 0.
    let (k_pe_ptr, k_pe_stride) =
        if dims.rope_dim > 0 { (launch.input(c"k_pe", k_pe, 4)?, k_pe.launch_strides()[0]) } else { (latent_ptr, 0) };
    let slots_ptr = launch.input(c"slot_mapping", slot_mapping, 8)?;
    let cache_ptr = launch.output(c"latent_cache", cache, 16)?;
    let mut cache_abi = abi_cache(&g, c_strides, c_strides, (cache_ptr, cache_ptr), None)?;
    crate::fp8::fill_abi(&mut cache_abi, C::KV_DTYPE, scales.as_ref(), &mut launch)?;
    let params = sys::FaMlaAppendParams {
        latent: latent_ptr,
        k_pe: k_pe_ptr,
        slot_mapping: slots_ptr as *const i64,
        latent_token_stride: latent.launch_strides()[0],
        k_pe_token_stride: k_pe_stride,
        cache: cache_abi,
        num_tokens: to_i32("num_tokens", n)?,
        kv_lora_rank: to_i32("kv_lora_rank", dims.kv_lora_rank)?,
        rope_dim: to_i32("rope_dim", dims.rope_dim)?,
        dtype: T::DTYPE.abi(),
        rope,
    };
    launch.run("mla_append", params, sys::fa_mla_append)
}

/// Several query tokens per sequence (speculative / MTP verification): sequence b owns q rows
/// `cu_seqlens_q[b]..cu_seqlens_q[b+1]` (int32 `[B + 1]`), at most `max_seqlen_q` of them, whose positions
/// are the last `q_len_b` of its `seq_len_b` cached tokens (append runs first).
#[derive(Clone, Copy)]
pub struct MlaQueries<'a> {
    pub cu_seqlens_q: &'a TensorView<'a, i32, 1>,
    pub max_seqlen_q: usize,
}

impl std::fmt::Debug for MlaQueries<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MlaQueries")
            .field("cu_seqlens_q", &self.cu_seqlens_q.shape())
            .field("max_seqlen_q", &self.max_seqlen_q)
            .finish()
    }
}

/// Options of [`mla_decode`].
#[derive(Debug, Clone, Copy)]
pub struct MlaDecodeOptions<'a> {
    /// Softmax scale: the model's (DeepSeek-V3: `1/sqrt(128 + 64)`, times YaRN's mscale² where it applies).
    /// Finite and positive.
    pub scale: f32,
    /// The row split (default 512 + 64).
    pub dims: MlaDims,
    /// Force this many KV splits (1 = none); `None` lets [`MlaPlan::new`] choose.
    pub num_splits: Option<usize>,
    /// Packed query tokens (`None`: one per sequence, q/o `[B, Hq, ..]`).
    pub queries: Option<MlaQueries<'a>>,
}

impl MlaDecodeOptions<'_> {
    /// One query token per sequence at `scale`, 512 + 64, planned splits.
    pub fn new(scale: f32) -> Self {
        Self { scale, dims: MlaDims::default(), num_splits: None, queries: None }
    }
}

/// The split-KV plan of one MLA decode (a pure function of the shape and the SM count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlaPlan {
    pub(crate) num_splits: usize,
    pub(crate) split_tokens: usize,
    pub(crate) grid: [usize; 3],
    pub(crate) partial_o_len: usize,
    pub(crate) partial_lse_len: usize,
}

crate::plan::plan_getters!(MlaPlan {
    /// KV splits per sequence.
    num_splits: usize,
    /// Keys per split (a multiple of 64; the last split runs to the end).
    split_tokens: usize,
    /// (splits, row blocks per sequence, B).
    grid: [usize; 3],
    /// fp32 partial O the workspace must hold (0 with one split).
    partial_o_len: usize,
    /// fp32 partial LSE the workspace must hold (0 with one split).
    partial_lse_len: usize,
});

/// Most splits the planner makes (a forced count may be larger).
pub const MLA_MAX_PLANNED_SPLITS: usize = 64;
/// Fewest keys per planned split: below this the merge and the per-CTA prologue outweigh what a split saves.
pub const MLA_MIN_SPLIT_TOKENS: usize = 256;

impl MlaPlan {
    /// The plan for `batch` sequences of up to `max_seq_len` keys and `max_seqlen_q` query tokens
    /// (`total_q` in all) of `heads_q` heads and `kv_lora_rank` output columns, on `sm_count` SMs. Without
    /// `forced_splits`: one split when the CTAs (`batch · ⌈max_seqlen_q · Hq / 32⌉`, one per SM: the kernel's
    /// occupancy) already fill the SMs, else enough splits of at least [`MLA_MIN_SPLIT_TOKENS`] keys to
    /// fill them (at most [`MLA_MAX_PLANNED_SPLITS`]).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        batch: usize,
        heads_q: usize,
        max_seqlen_q: usize,
        total_q: usize,
        max_seq_len: usize,
        kv_lora_rank: usize,
        sm_count: usize,
        forced_splits: Option<usize>,
    ) -> Result<Self> {
        let granule = sys::FA_SPLIT_GRANULE as usize;
        let overflow = |what: &str| Error::overflow(what, "the plan's sizes overflow");
        let row_blocks = max_seqlen_q
            .max(1)
            .checked_mul(heads_q)
            .ok_or_else(|| overflow("max_seqlen_q"))?
            .div_ceil(MLA_ROWS_PER_CTA);
        let ctas = batch.saturating_mul(row_blocks);
        let n = match forced_splits {
            Some(0) => return Err(Error::unsupported("num_splits", "0 (must be at least 1)")),
            Some(n) => n,
            None if ctas == 0 || ctas >= sm_count => 1,
            None => sm_count.div_ceil(ctas).min(max_seq_len / MLA_MIN_SPLIT_TOKENS).clamp(1, MLA_MAX_PLANNED_SPLITS),
        };
        let split_tokens =
            max_seq_len.max(1).div_ceil(n).checked_next_multiple_of(granule).ok_or_else(|| overflow("max_seq_len"))?;
        // A planned count never leaves a split past the longest sequence; a forced one is kept as given.
        let n = if forced_splits.is_some() { n } else { max_seq_len.max(1).div_ceil(split_tokens).max(1) };
        let rows = if n > 1 {
            n.checked_mul(total_q).and_then(|x| x.checked_mul(heads_q)).ok_or_else(|| overflow("workspace"))?
        } else {
            0
        };
        if n > 65535 || row_blocks > 65535 || batch > 65535 {
            return Err(Error::unsupported(
                "mla_decode",
                format!("a grid of {n} splits x {row_blocks} row blocks x {batch} sequences (each <= 65535)"),
            ));
        }
        Ok(Self {
            num_splits: n,
            split_tokens,
            grid: [n, row_blocks, batch],
            partial_o_len: rows.checked_mul(kv_lora_rank).ok_or_else(|| overflow("workspace"))?,
            partial_lse_len: rows,
        })
    }
}

/// MLA decode over a latent cache ([`latent_cache`]): for each query row (token i of sequence b, head h),
/// `o = softmax(q · rowsᵀ · scale) · rows[:, :kv_lora_rank]` over the keys `j ≤ seq_len_b − q_len_b + i`.
///  - `q`: `[total_q, Hq, kv_lora_rank + rope_dim]` (latent query first, then the rotated rope query),
///    `total_q = B` without `opts.queries`; unit innermost stride, 16-byte aligned rows;
///  - `o`: `[total_q, Hq, kv_lora_rank]`; `lse`: optional `[total_q, Hq]` (natural log, unit head stride); a
///    row with no visible key gives o = 0, lse = −inf;
///  - `workspace`: room for the plan's partials ([`DecodeWorkspace::with_capacity`] with head dim
///    `kv_lora_rank`, or more).
///
/// Enqueues on `stream` and returns the plan it followed. On the emulator the block table and lengths
/// (and `cu_seqlens_q`) are checked first, as for decode.
pub fn mla_decode<T: Element, C: KvCacheOf<T>>(
    stream: &Stream<'_>,
    q: &TensorView<'_, T, 3>,
    cache: &PagedKvCache<'_, C>,
    o: &mut TensorViewMut<'_, T, 3>,
    lse: Option<&mut TensorViewMut<'_, f32, 2>>,
    workspace: &mut DecodeWorkspace,
    opts: &MlaDecodeOptions<'_>,
) -> Result<MlaPlan> {
    workspace.check_stream(stream)?;
    let dims = opts.dims;
    let g = cache.geometry();
    check_latent_geometry(g.heads_kv, g.head_dim, &dims)?;
    if g.head_dim_v != g.head_dim {
        return Err(Error::shape("v_cache", "a latent cache's V is its K rows (the same head dim)"));
    }
    check_fp8_dims::<C>(&dims)?;
    crate::fp8::check_cache_dtype::<C>(T::DTYPE, cache.scales().is_some())?;
    let [total_q, heads_q, row] = q.shape();
    if row != dims.row_dim() {
        return Err(Error::shape("q", format!("{row} columns per head, kv_lora_rank + rope_dim = {}", dims.row_dim())));
    }
    if heads_q == 0 {
        return Err(Error::shape("q", "no query heads"));
    }
    let batch = cache.batch();
    let max_seqlen_q = match &opts.queries {
        None => {
            if total_q != batch {
                return Err(Error::shape("q", format!("{total_q} rows for {batch} sequences (one token each)")));
            }
            1
        }
        Some(qs) => {
            qs.cu_seqlens_q.check_index_vector("cu_seqlens_q", batch + 1, || format!("B + 1 = {}", batch + 1))?;
            if qs.max_seqlen_q == 0 {
                return Err(Error::shape("max_seqlen_q", "must be at least 1"));
            }
            if matches!(stream, Stream::Emu(_)) {
                crate::paged::validate_cu_seqlens(stream, qs.cu_seqlens_q, total_q, qs.max_seqlen_q)?;
            }
            qs.max_seqlen_q
        }
    };
    o.expect_shape("o", [total_q, heads_q, dims.kv_lora_rank])?;
    q.check_rows("q", 16)?;
    o.check_rows("o", 16)?;
    o.check_disjoint("o")?;
    if let Some(l) = lse.as_deref() {
        l.expect_shape("lse", [total_q, heads_q])?;
        l.check_rows("lse", 4)?;
        l.check_disjoint("lse")?;
    }
    if !(opts.scale.is_finite() && opts.scale > 0.0) {
        return Err(Error::unsupported("scale", format!("{} (must be finite and positive)", opts.scale)));
    }
    if crate::paged::strict_tables(stream) {
        cache.validate(stream)?;
    }
    let plan = MlaPlan::new(
        batch,
        heads_q,
        max_seqlen_q,
        total_q,
        cache.max_seq_len(),
        dims.kv_lora_rank,
        workspace.sm_count(),
        opts.num_splits,
    )?;
    crate::decode::check_split_fits(workspace.partials(), plan.num_splits, plan.partial_o_len, plan.partial_lse_len)?;
    if batch == 0 || total_q == 0 {
        return Ok(plan);
    }
    let (po, plse) = workspace.partials_mut();
    let mut partial_o = po.view(plan.partial_o_len)?;
    let mut partial_lse = plse.view(plan.partial_lse_len)?;

    let mut launch = Launch::new(*stream);
    let q_ptr = launch.input(c"q", q, 16)?;
    let cu_ptr = match &opts.queries {
        Some(qs) => launch.input(c"cu_seqlens_q", qs.cu_seqlens_q, 4)? as *const i32,
        None => std::ptr::null(),
    };
    let cache_abi = cache.launch_abi(&mut launch)?;
    let (q_strides, o_strides) = (q.launch_strides(), o.launch_strides());
    let o_ptr = launch.output(c"o", o, 16)?;
    let (lse_ptr, lse_row_stride) = match lse {
        Some(l) => {
            let stride = l.launch_strides()[0];
            (launch.output(c"lse", l, 4)? as *mut f32, stride)
        }
        None => (std::ptr::null_mut(), 0),
    };
    let (partial_o_ptr, partial_lse_ptr) = if plan.num_splits > 1 {
        (
            launch.output(c"partial_o", &mut partial_o, 16)? as *mut f32,
            launch.output(c"partial_lse", &mut partial_lse, 4)? as *mut f32,
        )
    } else {
        (std::ptr::null_mut(), std::ptr::null_mut())
    };
    let params = sys::FaMlaDecodeParams {
        q: q_ptr,
        o: o_ptr,
        lse: lse_ptr,
        partial_o: partial_o_ptr,
        partial_lse: partial_lse_ptr,
        cu_seqlens_q: cu_ptr,
        q_row_stride: q_strides[0],
        q_head_stride: q_strides[1],
        o_row_stride: o_strides[0],
        o_head_stride: o_strides[1],
        lse_row_stride,
        cache: cache_abi,
        batch: to_i32("batch", batch)?,
        heads_q: to_i32("heads_q", heads_q)?,
        kv_lora_rank: to_i32("kv_lora_rank", dims.kv_lora_rank)?,
        rope_dim: to_i32("rope_dim", dims.rope_dim)?,
        total_q: to_i32("total_q", total_q)?,
        max_seqlen_q: to_i32("max_seqlen_q", max_seqlen_q)?,
        num_splits: to_i32("num_splits", plan.num_splits)?,
        split_tokens: to_i32("split_tokens", plan.split_tokens)?,
        dtype: T::DTYPE.abi(),
        scale: opts.scale,
        scale_log2: opts.scale * std::f32::consts::LOG2_E,
    };
    launch.run("mla_decode", params, sys::fa_mla_decode)?;
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_fills_the_sms_and_covers_the_context() {
        // B 1, Hq 128, 4k keys: 4 row blocks on 132 SMs -> 16 splits of 256.
        let p = MlaPlan::new(1, 128, 1, 1, 4096, 512, 132, None).unwrap();
        assert_eq!(p.grid, [16, 4, 1]);
        assert_eq!(p.split_tokens, 256);
        assert_eq!(p.partial_lse_len, 16 * 128);
        assert_eq!(p.partial_o_len, 16 * 128 * 512);
        // A batch that fills the SMs: no split, no workspace.
        let p = MlaPlan::new(64, 128, 1, 64, 4096, 512, 132, None).unwrap();
        assert_eq!((p.num_splits, p.partial_o_len), (1, 0));
        // Short contexts are not split below MLA_MIN_SPLIT_TOKENS.
        assert_eq!(MlaPlan::new(1, 16, 1, 1, 300, 512, 132, None).unwrap().num_splits, 1);
        // Every planned split starts inside the context, and together they cover it.
        for len in [1, 63, 64, 65, 1000, 4097, 65536] {
            let p = MlaPlan::new(2, 16, 2, 4, len, 512, 132, None).unwrap();
            assert_eq!(p.split_tokens % 64, 0);
            assert!(p.num_splits * p.split_tokens >= len);
            assert!((p.num_splits - 1) * p.split_tokens < len.max(1), "{len}: {p:?}");
        }
        // Forced counts are kept; 0 is an error.
        assert_eq!(MlaPlan::new(1, 16, 1, 1, 100, 512, 132, Some(5)).unwrap().num_splits, 5);
        assert!(MlaPlan::new(1, 16, 1, 1, 100, 512, 132, Some(0)).is_err());
    }

    #[test]
    fn dims_are_checked() {
        assert!(MlaDims::default().check().is_ok());
        assert_eq!(MlaDims::default().row_dim(), 576);
        for (r, p) in [(0, 64), (520, 64), (512, 72), (100, 64), (512, 12)] {
            assert!(MlaDims { kv_lora_rank: r, rope_dim: p }.check().is_err(), "{r} {p}");
        }
    }
}
