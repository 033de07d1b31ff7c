//! Paged prefill: the new query tokens of each sequence (chunked prefill, prefix caching, speculative
//! verification) attending over its paged KV cache. Kernel: kernels/paged_prefill.cu.
//!
//! Semantics (docs/semantics.md): sequence b has `q_len_b` new tokens, packed in `q [total_q, Hq, D]` at
//! rows `cu_seqlens_q[b]..cu_seqlens_q[b+1]`, and `seq_lens[b]` cached tokens that **include** the new ones
//! (append first). With `causal` (the default) row i of b sees key j iff `j <= i + (seq_len_b - q_len_b)`,
//! then the score variants; GQA reads KV head `h / (Hq / Hkv)`. `q_len_b > seq_len_b` is allowed: the first
//! `q_len_b - seq_len_b` rows see no key and give `o = 0`, `lse = -inf` (the sink's logit with sinks).
//! Decode is the case `q_len = 1` (kept as its own kernel, [`crate::decode()`]).
//!
//! Efficiency model. A CTA serves one sequence, one KV head and `Br` packed (token, query head) rows of
//! it (the dense prefill tile), so a chunk with `q_len · G <= Br` (G = Hq / Hkv; Br = [`PagedPrefillProblem::tile`]'s `block_m`: 128,
//! or 64 at widths 96 and 256) reads each K/V tile once per KV head, and a long chunk runs the dense prefill tiling.
//! When the grid would leave SMs idle (few rows, long context) [`PagedPrefillPlan`] splits the key range;
//! the fp32 partials are merged on the same stream (sinks enter there, once).
//!
//! Short queries (speculative verification, small chunks: `max_seqlen_q · G <=` [`STREAMING_MAX_ROWS`]) run
//! on the decode kernel instead ([`PagedPrefillKernel::Streaming`], docs/scheduling.md): its 16-row CTAs stream
//! K/V through a 4-stage cp.async pipeline (48 KB in flight per CTA, 3 CTAs per SM) where the tiled CTA waits
//! for every tile's copies (one CTA per SM at D = 128), the memory-bound regime these calls are in. On a
//! scheduled workspace ([`PagedPrefillWorkspace::scheduled`], [`PagedPrefillWorkspace::prepare`]) that path
//! is cut and packed by the work each sequence's row blocks have ([`crate::schedule::schedule_short_queries`],
//! decode's scheduler), graph-safe at the workspace's fixed geometry; the tiled path keeps a uniform plan.
//!
//! FP8 caches (issue 17): the cache may hold [`crate::Fp8E4m3`] / [`crate::Fp8E5m2`] codes with their
//! dequantisation scales attached ([`PagedKvCache::with_scales`] / [`PagedKvCache::with_scale_tensors`], per
//! tensor or per KV head, read on the device at run time), as decode
//! reads them: the kernel copies the FP8 rows (half the K/V bytes), converts them exactly to the query
//! dtype in shared memory and folds the scales into the math; q and o stay 16-bit. FP8 head dims are
//! multiples of 16.

use crate::decode::{check_split_fits, stream_slots, stream_sm_count, Buffer, ScheduleTable};
use crate::device::{RawStream, Stream};
use crate::dtype::Element;
use crate::error::{to_i32, Error, Result};
use crate::fp8::{self, KvCacheOf};
use crate::launch::{softmax_scale, Launch};
use crate::paged::PagedKvCache;
use crate::plan::{decode_rows_per_cta, MAX_GRID_YZ, ROWS_PER_CTA, SPLIT_GRANULE};
use crate::prefill::{check_cu_seqlens, host_values, MAX_PREFILL_SEQLEN};
use crate::schedule::{
    schedule_short_queries, short_query_partial_capacity, short_query_work_capacity, DecodeSchedule, ShortQueryShape,
    SplitPolicy,
};
use crate::score_mod::ScoreMod;
use crate::sys;
use crate::tensor::{TensorView, TensorViewMut};
use crate::tile::{tile_policy, KernelOp, TilePolicy};

/// Splits are planned only when each keeps at least this many keys (a split's fixed cost: its pipeline fill,
/// its fp32 partial rows written and merged).
pub const MIN_SPLIT_KEYS: usize = 512;
/// Upper bound on planned (not forced) splits.
pub const MAX_PLANNED_SPLITS: usize = 64;

/// Short queries run on the streaming (decode) kernel when their packed rows per KV head, `max_seqlen_q · G`,
/// are at most this: two of its 16-row CTAs, so each K/V byte is read from memory once and from L2 at most
/// twice (the CTAs of one KV head run side by side), against the tiled CTA's one read but its one-CTA-per-SM
/// pipeline. A prediction from the memory model (docs/scheduling.md), to be measured on a GPU.
pub const STREAMING_MAX_ROWS: usize = 2 * ROWS_PER_CTA;

/// Which kernel a paged prefill runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PagedPrefillKernel {
    /// Streaming when `max_seqlen_q · G <=` [`STREAMING_MAX_ROWS`], else tiled (the default).
    #[default]
    Auto,
    /// The prefill tile: `Br` packed rows per CTA (any query length).
    Tiled,
    /// The decode kernel over 16 packed rows per CTA (any query length; meant for short ones).
    Streaming,
}

/// Options of one paged prefill call. `Default` is causal with the default scale and an automatic split.
#[derive(Debug, Clone, Copy)]
pub struct PagedPrefillOptions<'a> {
    /// Bottom-right causal per sequence (default `true`); `false` is bidirectional over the whole context.
    pub causal: bool,
    /// Softmax scale; `None` means 1/sqrt(D).
    pub scale: Option<f32>,
    /// Force this many KV splits (1 = none); `None` lets [`PagedPrefillPlan::new`] choose. Without a
    /// workspace only one split is possible.
    pub num_splits: Option<usize>,
    /// Sliding window, softcap, ALiBi, sinks.
    pub score_mod: ScoreMod<'a>,
    /// The kernel (default: [`PagedPrefillKernel::Auto`]); the results agree within the tolerance either way.
    pub kernel: PagedPrefillKernel,
    /// Rotary embedding of q ([`crate::rope`], docs/rope.md), `None` by default: query token t of sequence b
    /// rotated at `rope.positions[cu_seqlens_q[b] + t]` (one int32 per packed query token, `[total_q]`) or,
    /// without positions, at its bottom-right position `t + seq_len_b − q_len_b` (its place in the cache).
    /// The cache's K must have been rotated by the same table ([`crate::AppendOptions::rope`]).
    pub rope: Option<crate::rope::Rope<'a>>,
}

impl Default for PagedPrefillOptions<'_> {
    fn default() -> Self {
        Self {
            causal: true,
            scale: None,
            num_splits: None,
            score_mod: ScoreMod::default(),
            kernel: PagedPrefillKernel::Auto,
            rope: None,
        }
    }
}

/// The shape of one paged prefill launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagedPrefillProblem {
    pub batch: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    /// The head dim, or with a V head dim of its own (the cache's V pages narrower or wider than its K pages)
    /// the wider of the two: the kernel's width, and what split partials are sized by.
    pub head_dim: usize,
    /// Packed query rows (tokens) of `q`.
    pub total_q: usize,
    /// Largest `q_len_b`.
    pub max_seqlen_q: usize,
    /// The caller's upper bound on `seq_lens` ([`PagedKvCache::max_seq_len`]).
    pub max_seq_len: usize,
}

impl PagedPrefillProblem {
    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.heads_q / self.heads_kv.max(1)
    }
    /// The instantiated width this head dim runs at.
    pub fn width(&self) -> Option<usize> {
        self.tile().map(|t| t.width)
    }
    /// The kernel's tile (the launcher's [`tile_policy`]): `block_m` packed rows per CTA (Br), 128, or 64
    /// at widths 96 (whose 128-row tile spills on sm_90a) and 256. The same for every variant and cache
    /// format.
    pub fn tile(&self) -> Option<TilePolicy> {
        tile_policy(KernelOp::PagedPrefill, self.head_dim, false, None)
    }
    fn block_rows(&self) -> usize {
        self.tile().map_or(128, |t| t.block_m)
    }
    /// Packed (token, query head) rows per KV head: `max_seqlen_q · G`.
    pub fn packed_rows(&self) -> usize {
        self.max_seqlen_q.saturating_mul(self.group())
    }
    /// The kernel `requested` resolves to (Auto: [`STREAMING_MAX_ROWS`]; past the tiled kernel's head dims,
    /// 264–512, always the streaming one, whose warps split D: [`crate::head_dim::PAGED_PREFILL_TILED_MAX_HEAD_DIM`]).
    pub fn kernel(&self, requested: PagedPrefillKernel) -> PagedPrefillKernel {
        match requested {
            PagedPrefillKernel::Auto if self.packed_rows() <= STREAMING_MAX_ROWS || self.tile().is_none() => {
                PagedPrefillKernel::Streaming
            }
            PagedPrefillKernel::Auto => PagedPrefillKernel::Tiled,
            k => k,
        }
    }
    /// Packed rows per CTA of `kernel` (resolved): the tile's `Br`, or the decode kernel's
    /// [`decode_rows_per_cta`] of the packed rows (each staged K/V byte serves them all).
    pub fn rows_per_cta(&self, kernel: PagedPrefillKernel) -> usize {
        match kernel {
            PagedPrefillKernel::Streaming => decode_rows_per_cta(self.head_dim, self.packed_rows()),
            _ => self.block_rows(),
        }
    }
    /// The problem a CTA's key range leaves under a sliding window: a CTA's rows are at most
    /// `min(max_seqlen_q, ⌈Br / G⌉ + 1)` consecutive tokens, and each sees `left + right + 1` keys around
    /// its diagonal (right = 0 when causal), so its keys span at most the sum; splits are planned over that
    /// (and laid out from the CTA's first visible tile by the kernel), not over the context left of the
    /// window. No left bound (or an unbounded right one without causal) leaves the problem as it is.
    pub fn windowed(self, window: Option<(i32, i32)>, causal: bool) -> Self {
        self.windowed_for(window, causal, PagedPrefillKernel::Tiled)
    }
    /// [`Self::windowed`] for the CTAs of `kernel` (resolved).
    pub fn windowed_for(self, window: Option<(i32, i32)>, causal: bool, kernel: PagedPrefillKernel) -> Self {
        let Some((left, right)) = window else { return self };
        let right = if causal { Some(0) } else { usize::try_from(right).ok() };
        let (Ok(left), Some(right)) = (usize::try_from(left), right) else { return self };
        let br = self.rows_per_cta(kernel);
        let tokens = self.max_seqlen_q.min(br.div_ceil(self.group().max(1)) + 1);
        let span = tokens.saturating_add(left).saturating_add(right);
        Self { max_seq_len: self.max_seq_len.min(span), ..self }
    }
    /// CTAs per split: row blocks of `Br` packed rows x KV heads x sequences (the tiled kernel).
    pub fn ctas_per_split(&self) -> usize {
        self.ctas_per_split_of(PagedPrefillKernel::Tiled)
    }
    fn ctas_per_split_of(&self, kernel: PagedPrefillKernel) -> usize {
        self.packed_rows().div_ceil(self.rows_per_cta(kernel)) * self.heads_kv * self.batch
    }
}

/// How one launch splits the keys, its kernel, grid and the workspace it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagedPrefillPlan {
    pub(crate) kernel: PagedPrefillKernel,
    pub(crate) num_splits: usize,
    pub(crate) split_tokens: usize,
    pub(crate) grid: [usize; 3],
    pub(crate) partial_o_len: usize,
    pub(crate) partial_lse_len: usize,
}

crate::plan::plan_getters!(PagedPrefillPlan {
    /// The kernel it runs: [`PagedPrefillKernel::Tiled`] or [`PagedPrefillKernel::Streaming`].
    kernel: PagedPrefillKernel,
    /// KV splits per row block.
    num_splits: usize,
    /// Keys per split, a multiple of [`SPLIT_GRANULE`] (meaningful when `num_splits > 1`).
    split_tokens: usize,
    /// Tiled: (row blocks · num_splits, Hkv, B); streaming: (num_splits, Hkv · row blocks, B).
    grid: [usize; 3],
    /// fp32 elements of partial O `[num_splits, total_q, Hq, D]` (0 without splitting).
    partial_o_len: usize,
    /// fp32 elements of partial LSE `[num_splits, total_q, Hq]` (0 without splitting).
    partial_lse_len: usize,
});

impl PagedPrefillPlan {
    /// The plan for `problem` on a GPU of `sm_count` SMs. `forced`: that many splits (capped so that no
    /// split is empty of its granule). Otherwise: one split when the grid already covers the SMs once (the
    /// kernel runs one CTA per SM at D = 128) or the context is short; else as many splits as it takes to
    /// cover the SMs, each at least [`MIN_SPLIT_KEYS`] keys, at most [`MAX_PLANNED_SPLITS`].
    pub fn new(problem: &PagedPrefillProblem, sm_count: usize, forced: Option<usize>) -> Result<Self> {
        Self::for_kernel(problem, PagedPrefillKernel::Tiled, sm_count, forced)
    }

    /// The plan for `problem` on `kernel` (Auto resolved by [`PagedPrefillProblem::kernel`]) with `slots`
    /// CTAs the GPU runs at once (tiled: the SM count, one CTA per SM; streaming: SMs x the decode kernel's
    /// CTAs per SM), by the rule of [`Self::new`].
    pub fn for_kernel(
        problem: &PagedPrefillProblem,
        kernel: PagedPrefillKernel,
        slots: usize,
        forced: Option<usize>,
    ) -> Result<Self> {
        crate::head_dim::check(KernelOp::PagedPrefill, problem.head_dim)?;
        let kernel = problem.kernel(kernel);
        if kernel == PagedPrefillKernel::Tiled && problem.tile().is_none() {
            return Err(Error::unsupported(
                "kernel",
                format!(
                    "head dim {}: the tiled paged prefill kernel stops at {} (the streaming one serves it)",
                    problem.head_dim,
                    crate::head_dim::PAGED_PREFILL_TILED_MAX_HEAD_DIM
                ),
            ));
        }
        let ctas = problem.ctas_per_split_of(kernel);
        let keys = problem.max_seq_len.max(1);
        let wanted = match forced {
            Some(0) => return Err(Error::shape("num_splits", "must be at least 1")),
            Some(n) => n,
            None if ctas == 0 || ctas >= slots || keys < 2 * MIN_SPLIT_KEYS => 1,
            None => slots.div_ceil(ctas).min(keys / MIN_SPLIT_KEYS).clamp(1, MAX_PLANNED_SPLITS),
        };
        let (num_splits, split_tokens) = if wanted <= 1 {
            (1, 0)
        } else {
            let split_tokens = keys.div_ceil(wanted).next_multiple_of(SPLIT_GRANULE);
            (keys.div_ceil(split_tokens).max(1), split_tokens)
        };
        let row_blocks = problem.packed_rows().div_ceil(problem.rows_per_cta(kernel));
        let rows = if num_splits > 1 { problem.total_q * problem.heads_q } else { 0 };
        let checked =
            |a: usize, b: usize| a.checked_mul(b).ok_or_else(|| Error::overflow("workspace", "size overflows"));
        let partial_lse_len = checked(rows, num_splits)?;
        Ok(Self {
            kernel,
            num_splits,
            split_tokens,
            grid: match kernel {
                PagedPrefillKernel::Streaming => [num_splits, problem.heads_kv * row_blocks, problem.batch],
                _ => [row_blocks * num_splits, problem.heads_kv, problem.batch],
            },
            partial_o_len: checked(partial_lse_len, problem.head_dim)?,
            partial_lse_len,
        })
    }
}

/// The reusable split-KV workspace of paged prefill (fp32 partial O and LSE) and the SM count plans are
/// made for. Create it once, outside the layer loop. Made by [`PagedPrefillWorkspace::with_capacity`], each
/// call follows a uniform plan ([`PagedPrefillPlan`]); made by [`PagedPrefillWorkspace::scheduled`], the
/// streaming kernel's calls are scheduled by the work each sequence has ([`crate::schedule`], as
/// [`crate::DecodeWorkspace::scheduled`] does for decode).
pub struct PagedPrefillWorkspace {
    partial_o: Buffer,
    partial_lse: Buffer,
    sm_count: usize,
    /// CTAs of the streaming (decode) kernel the GPU runs at once at this head dim (narrow CTAs; a uniform
    /// plan of wide ones fills one per SM).
    streaming_slots: usize,
    scheduler: Option<ShortQueryScheduler>,
    /// The raw stream a workspace in the caller's memory is bound to ([`PagedPrefillWorkspace::from_device_ptrs`]).
    raw_stream: Option<RawStream>,
}

/// A scheduled paged prefill workspace's limits, its schedule table, and what the current schedule was
/// prepared for.
struct ShortQueryScheduler {
    limits: PagedPrefillProblem,
    table: ScheduleTable,
    prepared: Option<Prepared>,
}

/// The call a schedule was prepared for: its batch, its query rows (`cu_seqlens_q[B]`), window and causal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Prepared {
    batch: usize,
    rows: usize,
    window: Option<(i32, i32)>,
    causal: bool,
}

/// Buffer::new's error for a PagedPrefillWorkspace on a raw stream (it has no device-pointer constructor).
const ON_RAW_STREAM: &str = "a raw stream has no allocator for a PagedPrefillWorkspace: \
    use PagedPrefillWorkspace::from_device_ptrs (your memory), or call paged_prefill without one (one split)";

impl PagedPrefillWorkspace {
    /// Room for any plan over at most `max_total_q` packed tokens of `heads_q` heads of `head_dim` with at
    /// most `max_splits` splits, on `stream`'s backend (a [`Stream::Raw`] has no allocator: Usage error).
    pub fn with_capacity(
        stream: &Stream<'_>,
        max_total_q: usize,
        heads_q: usize,
        head_dim: usize,
        max_splits: usize,
    ) -> Result<Self> {
        let lse = max_splits
            .checked_mul(max_total_q)
            .and_then(|x| x.checked_mul(heads_q))
            .ok_or_else(|| Error::overflow("workspace", "size overflows"))?;
        let o = lse.checked_mul(head_dim).ok_or_else(|| Error::overflow("workspace", "size overflows"))?;
        Ok(Self {
            partial_o: Buffer::new(stream, o, ON_RAW_STREAM)?,
            partial_lse: Buffer::new(stream, lse, ON_RAW_STREAM)?,
            sm_count: stream_sm_count(stream)?,
            streaming_slots: stream_slots(stream, head_dim, ROWS_PER_CTA)?,
            scheduler: None,
            raw_stream: None,
        })
    }

    /// A uniform-plan workspace in the caller's device memory, for [`Stream::Raw`] users with their own
    /// allocator: `partial_o` / `partial_lse` are (pointer, fp32 elements) ranges, `sm_count` the device's SMs
    /// and `streaming_slots` the CTAs of the streaming kernel it runs at once (SMs × resident CTAs; see
    /// [`crate::schedule::decode_ctas_per_sm`]). Bound to `stream`: a launch on another stream is `Usage`.
    /// Each call's split partials are checked against the lengths given (`OutOfBounds`). (A scheduled
    /// workspace needs the crate to write its table, which it cannot do on a raw stream.)
    ///
    /// # Safety
    /// As [`crate::DecodeWorkspace::from_device_ptrs`]: for every launch made through this workspace, both
    /// ranges are device memory of `stream`'s context, of at least the lengths given, used by nobody else
    /// while that work may be in flight.
    pub unsafe fn from_device_ptrs(
        stream: RawStream,
        partial_o: (u64, usize),
        partial_lse: (u64, usize),
        sm_count: usize,
        streaming_slots: usize,
    ) -> Result<Self> {
        Ok(Self {
            partial_o: Buffer::Device { ptr: partial_o.0, len: partial_o.1 },
            partial_lse: Buffer::Device { ptr: partial_lse.0, len: partial_lse.1 },
            sm_count: sm_count.max(1),
            streaming_slots: streaming_slots.max(1),
            scheduler: None,
            raw_stream: Some(stream),
        })
    }

    /// `Usage` unless a launch on `stream` may use this workspace (a raw one only on its own stream).
    fn check_stream(&self, stream: &Stream<'_>) -> Result<()> {
        match (self.raw_stream, stream) {
            (None, _) => Ok(()),
            (Some(own), Stream::Raw(r)) if own.cu_stream() == r.cu_stream() => Ok(()),
            (Some(_), _) => Err(Error::usage(
                "workspace: made by PagedPrefillWorkspace::from_device_ptrs for another stream (a raw workspace \
                 is used only on its own stream, which orders the launches that share its partials)",
            )),
        }
    }

    /// A scheduled workspace for calls within `limits`: at most `limits.batch` sequences, `limits.total_q`
    /// query tokens in all, `limits.max_seqlen_q` per sequence, contexts of at most `limits.max_seq_len`,
    /// these heads and head dim. Calls that run the streaming kernel (short queries,
    /// [`PagedPrefillKernel::Streaming`] or `Auto` with `max_seqlen_q · G <=` [`STREAMING_MAX_ROWS`]) are cut
    /// and packed by [`crate::schedule::schedule_short_queries`] from their own `q_len`s and `seq_lens`
    /// (window-clipped, each row block's real key range) onto this device's CTA slots, so a skewed batch is
    /// balanced and a small one splits as a fresh plan would; only the split sequences' query rows are merged.
    /// The launch geometry is fixed by the limits (one CTA per slot; a merge over `limits.total_q` rows whose
    /// unused entries are skipped; row blocks numbered by `limits.max_seqlen_q`), so a CUDA graph captured
    /// once replays any later schedule: call [`PagedPrefillWorkspace::prepare`] with the step's host
    /// `cu_seqlens_q` and `seq_lens` before each replay (on the emulator, whose arrays are host memory,
    /// [`paged_prefill`] prepares by itself). Calls on the tiled kernel follow the uniform plan within the
    /// room the workspace has. Needs [`crate::schedule::short_query_partial_capacity`] · Hq · (D + 1) fp32.
    pub fn scheduled(stream: &Stream<'_>, limits: &PagedPrefillProblem, policy: SplitPolicy) -> Result<Self> {
        let rows = decode_rows_per_cta(limits.head_dim, limits.max_seqlen_q.max(1).saturating_mul(limits.group()));
        let slots = stream_slots(stream, limits.head_dim, rows)?;
        Self::scheduled_on(stream, limits, policy, slots)
    }

    /// [`PagedPrefillWorkspace::scheduled`] for `slots` CTA slots instead of the device's (tests and tools
    /// that model another GPU on the emulator).
    pub fn scheduled_on(
        stream: &Stream<'_>,
        limits: &PagedPrefillProblem,
        policy: SplitPolicy,
        slots: usize,
    ) -> Result<Self> {
        crate::head_dim::check(KernelOp::PagedPrefill, limits.head_dim)?;
        if limits.heads_kv == 0 || limits.heads_q == 0 || limits.heads_q % limits.heads_kv != 0 {
            return Err(Error::shape(
                "limits",
                format!("{} query heads are not a positive multiple of {} KV heads", limits.heads_q, limits.heads_kv),
            ));
        }
        let slots = slots.max(1);
        let shape = ShortQueryShape {
            heads_q: limits.heads_q,
            heads_kv: limits.heads_kv,
            head_dim: limits.head_dim,
            max_seqlen_q: limits.max_seqlen_q.max(1),
            window: None,
            causal: true,
        };
        if limits.heads_kv * shape.row_blocks() > MAX_GRID_YZ || limits.batch > MAX_GRID_YZ {
            return Err(Error::unsupported(
                "limits",
                format!(
                    "{} KV heads x {} row blocks of the streaming kernel, batch {} (at most {MAX_GRID_YZ})",
                    limits.heads_kv,
                    shape.row_blocks(),
                    limits.batch
                ),
            ));
        }
        // A window may clip the keys, never add any: size for the whole context.
        let (total_q, keys) = (limits.total_q, limits.max_seq_len);
        let partial_cap = short_query_partial_capacity(&shape, total_q, keys, slots, policy);
        let work_cap = short_query_work_capacity(&shape, limits.batch, total_q, keys, slots, policy);
        let rows = partial_cap
            .checked_mul(limits.heads_q)
            .ok_or_else(|| Error::overflow("workspace", "partial LSE size overflows"))?;
        let o = rows.checked_mul(limits.head_dim).ok_or_else(|| Error::overflow("workspace", "size overflows"))?;
        let table = ScheduleTable::new(stream, policy, slots, (work_cap, partial_cap, total_q), ON_RAW_STREAM)?;
        Ok(Self {
            partial_o: Buffer::new(stream, o, ON_RAW_STREAM)?,
            partial_lse: Buffer::new(stream, rows, ON_RAW_STREAM)?,
            sm_count: stream_sm_count(stream)?,
            streaming_slots: slots,
            scheduler: Some(ShortQueryScheduler { limits: *limits, table, prepared: None }),
            raw_stream: None,
        })
    }

    /// Plans the next streaming call of a scheduled workspace from the host's copies of its `cu_seqlens_q`
    /// (`[B + 1]`) and `seq_lens` (`[B]`), with the window and causal flag of `opts`, and writes the schedule
    /// into the workspace's device table, ordered on `stream`: before a CUDA-graph replay, or before each
    /// call on a GPU (where the kernel cannot read the host's arrays). The kernel takes each unit's key range
    /// from the device `seq_lens`, so contexts that grew since are still attended in full (a block's last
    /// chunk runs to its end), only less evenly; the query rows are the schedule's own, so `cu_seqlens_q`
    /// must be the call's. Errors: `Usage` for a workspace that is not scheduled, `Shape` for a batch, a
    /// query length or query rows outside its limits, `OutOfBounds` for contexts past `max_seq_len`.
    pub fn prepare(
        &mut self,
        stream: &Stream<'_>,
        cu_seqlens_q: &[i32],
        seq_lens: &[i32],
        opts: &PagedPrefillOptions,
    ) -> Result<&DecodeSchedule> {
        let sched = self.scheduler.as_mut().ok_or_else(|| {
            Error::usage(
                "PagedPrefillWorkspace::prepare: the workspace is not scheduled (PagedPrefillWorkspace::scheduled)",
            )
        })?;
        let limits = sched.limits;
        if seq_lens.len() > limits.batch {
            return Err(Error::shape(
                "seq_lens",
                format!("{} sequences, the workspace's limit is {}", seq_lens.len(), limits.batch),
            ));
        }
        let rows = cu_seqlens_q.last().map_or(0, |&r| r.max(0) as usize);
        if rows > limits.total_q {
            return Err(Error::shape(
                "cu_seqlens_q",
                format!("{rows} query rows, the workspace's limit is {}", limits.total_q),
            ));
        }
        let shape = ShortQueryShape {
            heads_q: limits.heads_q,
            heads_kv: limits.heads_kv,
            head_dim: limits.head_dim,
            max_seqlen_q: limits.max_seqlen_q.max(1),
            window: opts.score_mod.window,
            causal: opts.causal,
        };
        let schedule = schedule_short_queries(&shape, cu_seqlens_q, seq_lens, sched.table.slots, sched.table.policy)?;
        let past = format!("contexts past max_seq_len {}", limits.max_seq_len);
        let prepared = Prepared { batch: seq_lens.len(), rows, window: opts.score_mod.window, causal: opts.causal };
        sched.prepared = None;
        let schedule = sched.table.install(stream, schedule, &past)?;
        sched.prepared = Some(prepared);
        Ok(schedule)
    }

    /// The schedule the last [`PagedPrefillWorkspace::prepare`] (or emulated scheduled call) made.
    pub fn schedule(&self) -> Option<&DecodeSchedule> {
        self.scheduler.as_ref().and_then(|s| s.table.current.as_ref())
    }

    /// CTA slots a plan of `problem` on `kernel` (resolved) fills: SMs (tiled), or SMs x decode CTAs per SM
    /// (streaming: the narrow CTAs' slots, at most what the registers leave a wide launch's CTAs).
    fn slots(&self, problem: &PagedPrefillProblem, kernel: PagedPrefillKernel) -> usize {
        match kernel {
            PagedPrefillKernel::Streaming if self.scheduler.is_none() => {
                let rows = problem.rows_per_cta(kernel);
                let by_registers = crate::tile::decode_tile_or_widest(problem.head_dim)
                    .map_or(usize::MAX, |t| self.sm_count * t.ctas_per_sm_by_registers(rows));
                self.streaming_slots.min(by_registers)
            }
            PagedPrefillKernel::Streaming => self.streaming_slots,
            _ => self.sm_count,
        }
    }

    /// The SM count plans are made for.
    pub fn sm_count(&self) -> usize {
        self.sm_count
    }

    fn check_fits(&self, plan: &PagedPrefillPlan) -> Result<()> {
        check_split_fits(
            (&self.partial_o, &self.partial_lse),
            plan.num_splits,
            plan.partial_o_len,
            plan.partial_lse_len,
        )
    }

    /// The uniform plan of a call on a workspace (`problem` windowed): the planner's, or, on a scheduled
    /// workspace whose room it exceeds (its tiled calls), the most splits the room holds.
    fn uniform_plan(
        &self,
        problem: &PagedPrefillProblem,
        kernel: PagedPrefillKernel,
        forced: Option<usize>,
    ) -> Result<PagedPrefillPlan> {
        let plan = PagedPrefillPlan::for_kernel(problem, kernel, self.slots(problem, kernel), forced)?;
        if self.scheduler.is_none() || forced.is_some() || plan.num_splits == 1 || self.check_fits(&plan).is_ok() {
            return Ok(plan);
        }
        let per_split = (problem.total_q * problem.heads_q).max(1);
        let fit = (self.partial_lse.len() / per_split).max(1);
        PagedPrefillPlan::for_kernel(problem, kernel, self.slots(problem, kernel), Some(fit))
    }

    /// Checks a streaming call against a scheduled workspace's limits and its prepared schedule; returns the
    /// summary plan (the largest chunk count, the grid (slots, 1, 1), the partials used).
    fn scheduled_plan(
        &self,
        problem: &PagedPrefillProblem,
        opts: &PagedPrefillOptions,
        replay: bool,
    ) -> Result<PagedPrefillPlan> {
        const NOT_SCHEDULED: &str = "paged_prefill: this workspace has no scheduler";
        let sched = self.scheduler.as_ref().ok_or_else(|| Error::usage(NOT_SCHEDULED))?;
        let schedule = sched.table.current.as_ref().zip(sched.prepared).ok_or_else(|| {
            Error::usage(
                "paged_prefill: a scheduled workspace on a GPU needs PagedPrefillWorkspace::prepare with the host \
                 cu_seqlens_q and seq_lens first",
            )
        })?;
        let (schedule, prepared) = schedule;
        if !replay
            && (prepared.batch != problem.batch
                || prepared.rows > problem.total_q
                || prepared.window != opts.score_mod.window
                || prepared.causal != opts.causal)
        {
            return Err(Error::shape(
                "workspace",
                format!(
                    "the prepared schedule is for B {} / {} query rows / window {:?} / causal {}, the call has B {} / \
                     {} rows / window {:?} / causal {}",
                    prepared.batch,
                    prepared.rows,
                    prepared.window,
                    prepared.causal,
                    problem.batch,
                    problem.total_q,
                    opts.score_mod.window,
                    opts.causal
                ),
            ));
        }
        Ok(PagedPrefillPlan {
            kernel: PagedPrefillKernel::Streaming,
            num_splits: schedule.max_splits(),
            split_tokens: match sched.table.policy {
                SplitPolicy::FixedSplitTokens(t) => t,
                SplitPolicy::Balanced => 0,
            },
            grid: [sched.table.slots, 1, 1],
            partial_o_len: schedule.num_partials * problem.heads_q * problem.head_dim,
            partial_lse_len: schedule.num_partials * problem.heads_q,
        })
    }

    /// Checks a call's shape against a scheduled workspace's limits (`Shape`), and that it forces no split
    /// count (`Usage`: the schedule cuts each sequence itself).
    fn check_scheduled_call(&self, problem: &PagedPrefillProblem, opts: &PagedPrefillOptions) -> Result<()> {
        let Some(limits) = self.scheduler.as_ref().map(|s| s.limits) else { return Ok(()) };
        if opts.num_splits.is_some() {
            return Err(Error::usage("num_splits: a scheduled workspace cuts each sequence itself (SplitPolicy)"));
        }
        let heads = |p: &PagedPrefillProblem| (p.heads_q, p.heads_kv, p.head_dim);
        if heads(problem) != heads(&limits)
            || problem.batch > limits.batch
            || problem.total_q > limits.total_q
            || problem.max_seqlen_q > limits.max_seqlen_q
        {
            return Err(Error::shape(
                "workspace",
                format!(
                    "scheduled for {limits:?}, the call is {problem:?} (heads and head dim equal, the rest at most)"
                ),
            ));
        }
        Ok(())
    }
}

/// Validates paged prefill arguments and returns the problem they describe.
pub fn check_paged_prefill_args<T: Element, C: KvCacheOf<T>>(
    q: &TensorView<'_, T, 3>,
    cu_seqlens_q: &TensorView<'_, i32, 1>,
    max_seqlen_q: usize,
    cache: &PagedKvCache<'_, C>,
    o: &TensorViewMut<'_, T, 3>,
    lse: Option<&TensorViewMut<'_, f32, 2>>,
) -> Result<PagedPrefillProblem> {
    let [total_q, heads_q, head_dim] = q.shape();
    let g = cache.geometry();
    fp8::check_cache_dtype::<C>(T::DTYPE, cache.scales().is_some())?;
    crate::head_dim::check(KernelOp::PagedPrefill, head_dim)?;
    if C::KV_DTYPE.fp8().is_some() && head_dim % 16 != 0 {
        return Err(Error::unsupported(
            "k_cache",
            format!("head dim {head_dim} (an FP8 cache needs a multiple of 16)"),
        ));
    }
    if g.head_dim != head_dim {
        return Err(Error::shape("k_cache", format!("head dim {} differs from q's {head_dim}", g.head_dim)));
    }
    crate::decode::check_v_head_dim::<C>(KernelOp::PagedPrefill, g)?;
    if heads_q == 0 || heads_q % g.heads_kv != 0 {
        return Err(Error::shape(
            "q",
            format!("{heads_q} query heads are not a positive multiple of the cache's {} KV heads", g.heads_kv),
        ));
    }
    let batch = cache.batch();
    if cu_seqlens_q.dim(0) != batch + 1 {
        return Err(Error::shape(
            "cu_seqlens_q",
            format!("has {} entries, expected B + 1 = {} (block_table's batch + 1)", cu_seqlens_q.dim(0), batch + 1),
        ));
    }
    o.expect_shape("o", [total_q, heads_q, g.head_dim_v])?;
    q.check_rows("q", 16)?;
    o.check_rows("o", 16)?;
    o.check_disjoint("o")?;
    cu_seqlens_q.check_rows("cu_seqlens_q", 4)?;
    if let Some(lse) = lse {
        lse.expect_shape("lse", [heads_q, total_q])?;
        lse.check_rows("lse", 4)?;
        lse.check_disjoint("lse")?;
    }
    if batch > MAX_GRID_YZ || g.heads_kv > MAX_GRID_YZ {
        return Err(Error::unsupported(
            "block_table",
            format!("batch {batch} or {} KV heads (at most {MAX_GRID_YZ})", g.heads_kv),
        ));
    }
    let group = heads_q / g.heads_kv;
    for (name, rows) in [("q (rows)", total_q), ("max_seqlen_q", max_seqlen_q)] {
        if rows.saturating_mul(group) > MAX_PREFILL_SEQLEN {
            return Err(Error::overflow(
                name,
                format!("{rows} tokens x {group} heads per KV head exceed {MAX_PREFILL_SEQLEN} rows"),
            ));
        }
    }
    if let Some(cu) = host_values(cu_seqlens_q) {
        check_cu_seqlens("cu_seqlens_q", cu, total_q, max_seqlen_q)?;
    }
    Ok(PagedPrefillProblem {
        batch,
        heads_q,
        heads_kv: g.heads_kv,
        head_dim: g.widest_head_dim(), // the kernel's width is the wider of Dqk and Dv
        total_q,
        max_seqlen_q,
        max_seq_len: cache.max_seq_len(),
    })
}

/// Paged prefill attention, enqueued on `stream`: for sequence b and its new token i (row
/// `cu_seqlens_q[b] + i` of `q`), `o = softmax(q · K_bᵀ · scale) V_b` over the visible keys of its first
/// `seq_lens[b]` cached tokens (see the module docs), K/V head `h / (Hq / Hkv)`, with `opts.score_mod`.
///  - `q`: `[total_q, Hq, Dqk]`, `o`: `[total_q, Hq, Dv]` (the cache's K and V head dims: Dv = Dqk, or V's
///    own, e.g. DeepSeek's 192 / 128, the default scale 1/√Dqk), head dims in
///    [`crate::head_dim::PAGED_PREFILL_HEAD_DIMS`], unit innermost stride, 16-byte rows;
///  - `cu_seqlens_q`: int32 `[B + 1]` (B = the cache's batch), contiguous; `max_seqlen_q` bounds every
///    `q_len_b` (checked on the emulator; on a GPU the kernel clamps cu_seqlens_q to `total_q`);
///  - `lse`: optional `[Hq, total_q]` natural-log LSE (fp32, unit row stride);
///  - `workspace`: needed only for split-KV; `None` runs one split.
///
/// The cache may hold FP8 (`C` = [`crate::Fp8E4m3`] / [`crate::Fp8E5m2`], with its scales attached by
/// [`PagedKvCache::with_scales`] or [`PagedKvCache::with_scale_tensors`], head dim a multiple of 16):
/// attention then uses stored value x scale.
///
/// On the emulator the block table and `seq_lens` are checked first, as for [`crate::decode()`].
///
/// Returns the plan it followed. Errors name the offending argument.
#[allow(clippy::too_many_arguments)]
pub fn paged_prefill<T: Element, C: KvCacheOf<T>>(
    stream: &Stream<'_>,
    q: &TensorView<'_, T, 3>,
    cu_seqlens_q: &TensorView<'_, i32, 1>,
    max_seqlen_q: usize,
    cache: &PagedKvCache<'_, C>,
    o: &mut TensorViewMut<'_, T, 3>,
    lse: Option<&mut TensorViewMut<'_, f32, 2>>,
    workspace: Option<&mut PagedPrefillWorkspace>,
    opts: &PagedPrefillOptions,
) -> Result<PagedPrefillPlan> {
    paged_prefill_impl(stream, q, cu_seqlens_q, max_seqlen_q, cache, o, lse, workspace, opts, false)
}

/// What a CUDA graph captured from a scheduled [`paged_prefill`] of these arguments does when replayed: the
/// launch over the workspace's current table (prepared for any rows within its limits), with no check of
/// the table against the call and no prepare. For tests of the kernels' bounds on the emulator
/// (tests/it/safety.rs).
#[cfg(feature = "testkit")]
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn replay_scheduled<T: Element, C: KvCacheOf<T>>(
    stream: &Stream<'_>,
    q: &TensorView<'_, T, 3>,
    cu_seqlens_q: &TensorView<'_, i32, 1>,
    max_seqlen_q: usize,
    cache: &PagedKvCache<'_, C>,
    o: &mut TensorViewMut<'_, T, 3>,
    lse: Option<&mut TensorViewMut<'_, f32, 2>>,
    workspace: &mut PagedPrefillWorkspace,
    opts: &PagedPrefillOptions,
) -> Result<PagedPrefillPlan> {
    paged_prefill_impl(stream, q, cu_seqlens_q, max_seqlen_q, cache, o, lse, Some(workspace), opts, true)
}

/// [`paged_prefill`]; `replay`: a scheduled call uses the table as it is (no prepare, no check against the
/// call), as a graph replay does.
#[allow(clippy::too_many_arguments)]
fn paged_prefill_impl<T: Element, C: KvCacheOf<T>>(
    stream: &Stream<'_>,
    q: &TensorView<'_, T, 3>,
    cu_seqlens_q: &TensorView<'_, i32, 1>,
    max_seqlen_q: usize,
    cache: &PagedKvCache<'_, C>,
    o: &mut TensorViewMut<'_, T, 3>,
    lse: Option<&mut TensorViewMut<'_, f32, 2>>,
    workspace: Option<&mut PagedPrefillWorkspace>,
    opts: &PagedPrefillOptions,
    replay: bool,
) -> Result<PagedPrefillPlan> {
    opts.score_mod.check_values()?;
    if let Some(ws) = workspace.as_deref() {
        ws.check_stream(stream)?;
    }
    let problem = check_paged_prefill_args(q, cu_seqlens_q, max_seqlen_q, cache, o, lse.as_deref())?;
    if crate::paged::strict_tables(stream) {
        cache.validate(stream)?;
    }
    let g = cache.geometry(); // Dqk and Dv (problem.head_dim is the wider)
    let scale = softmax_scale(opts.scale, g.head_dim)?; // 1/√Dqk by default
    let kernel = problem.kernel(opts.kernel);
    let mut workspace = workspace;
    // A scheduled workspace runs the streaming kernel from its work list (prepared here from host arrays on
    // the emulator; on a GPU by the caller's PagedPrefillWorkspace::prepare).
    let scheduled =
        kernel == PagedPrefillKernel::Streaming && workspace.as_ref().is_some_and(|w| w.scheduler.is_some());
    let plan = match workspace.as_deref_mut() {
        Some(ws) if scheduled => {
            ws.check_scheduled_call(&problem, opts)?;
            if let (Some(cu), Some(lens), false) = (host_values(cu_seqlens_q), host_values(&cache.seq_lens), replay) {
                let (cu, lens) = (cu.to_vec(), lens.to_vec());
                ws.prepare(stream, &cu, &lens, opts)?;
            }
            ws.scheduled_plan(&problem, opts, replay)?
        }
        Some(ws) => {
            ws.uniform_plan(&problem.windowed_for(opts.score_mod.window, opts.causal, kernel), kernel, opts.num_splits)?
        }
        None if opts.num_splits.is_some_and(|n| n > 1) => {
            return Err(Error::usage("paged_prefill: num_splits > 1 needs a PagedPrefillWorkspace"))
        }
        None => PagedPrefillPlan::for_kernel(&problem, kernel, 1, Some(1))?,
    };
    if !scheduled && kernel == PagedPrefillKernel::Streaming && plan.grid[1] > MAX_GRID_YZ {
        return Err(Error::unsupported(
            "max_seqlen_q",
            format!(
                "{} x {} KV heads row blocks of the streaming kernel (at most {MAX_GRID_YZ})",
                plan.grid[1] / problem.heads_kv,
                problem.heads_kv
            ),
        ));
    }
    if problem.batch == 0 || problem.total_q == 0 || max_seqlen_q == 0 {
        return Ok(plan);
    }
    // The partials the launch may write (a uniform split: the plan's; a schedule: the workspace's room, as
    // the fixed geometry of a graph needs), and the schedule table.
    let (mut partial_o, mut partial_lse, table) = match workspace {
        Some(PagedPrefillWorkspace { partial_o, partial_lse, scheduler: Some(sched), .. }) if scheduled => {
            let cap = sched.table.partial_cap;
            let (po, pl) =
                (partial_o.view(cap * problem.heads_q * g.head_dim_v)?, partial_lse.view(cap * problem.heads_q)?);
            let with_partials = cap > 0;
            (
                with_partials.then_some(po),
                with_partials.then_some(pl),
                Some((&sched.table, sched.table.view()?, sched.limits)),
            )
        }
        Some(ws) if plan.num_splits > 1 => {
            ws.check_fits(&plan)?;
            // [num_splits, total_q, Hq, Dv] (the plan sizes them by the wider head dim)
            let po = ws.partial_o.view(plan.partial_lse_len * g.head_dim_v)?;
            (Some(po), Some(ws.partial_lse.view(plan.partial_lse_len)?), None)
        }
        _ => (None, None, None),
    };

    let mut launch = Launch::new(*stream);
    let score_mod = opts.score_mod.abi(&mut launch, problem.batch, problem.heads_q)?;
    let rope = match &opts.rope {
        Some(r) => r.abi(&mut launch, g.head_dim, problem.total_q, false)?,
        None => sys::FaRope::default(),
    };
    let q_ptr = launch.input(c"q", q, 16)?;
    let cu_ptr = launch.input(c"cu_seqlens_q", cu_seqlens_q, 4)?;
    let cache_abi = cache.launch_abi(&mut launch)?;
    let o_strides = o.launch_strides();
    let o_ptr = launch.output(c"o", o, 16)?;
    let (lse_ptr, lse_head_stride) = match lse {
        Some(l) => {
            let stride = l.launch_strides()[0];
            (launch.output(c"lse", l, 4)? as *mut f32, stride)
        }
        None => (std::ptr::null_mut(), 0),
    };
    let (po_ptr, plse_ptr) = match (partial_o.as_mut(), partial_lse.as_mut()) {
        (Some(po), Some(pl)) => {
            (launch.output(c"partial_o", po, 16)? as *mut f32, launch.output(c"partial_lse", pl, 4)? as *mut f32)
        }
        _ => (std::ptr::null_mut(), std::ptr::null_mut()),
    };
    let q_strides = q.launch_strides();
    // The launch's shape, for either kernel's parameters.
    let (batch, heads_q, heads_kv, head_dim) = (
        to_i32("batch", problem.batch)?,
        to_i32("heads_q", problem.heads_q)?,
        to_i32("heads_kv", problem.heads_kv)?,
        to_i32("head_dim", g.head_dim)?,
    );
    let head_dim_v = to_i32("head_dim_v", g.head_dim_v)?;
    // A schedule numbers row blocks by the workspace's max_seqlen_q (the launch's, fixed for graphs).
    let max_seqlen_q = table.as_ref().map_or(max_seqlen_q, |t| t.2.max_seqlen_q.max(1));
    let (total_q, max_seqlen_q) = (to_i32("q (rows)", problem.total_q)?, to_i32("max_seqlen_q", max_seqlen_q)?);
    let (num_splits, split_tokens) =
        (to_i32("num_splits", plan.num_splits)?, to_i32("split_tokens", plan.split_tokens)?);
    let (dtype, causal, scale_log2) = (T::DTYPE.abi(), opts.causal as i32, scale * std::f32::consts::LOG2_E);
    if kernel == PagedPrefillKernel::Streaming {
        // The decode kernel over packed rows (fa/abi.h FaDecodeParams, "Short queries"): q/o rows
        // through cu_seqlens_q, LSE [Hq, total_q], the same partial layout [num_splits, total_q, Hq, D].
        let params = sys::FaDecodeParams {
            q: q_ptr,
            o: o_ptr,
            lse: lse_ptr,
            partial_o: po_ptr,
            partial_lse: plse_ptr,
            q_batch_stride: q_strides[0],
            q_head_stride: q_strides[1],
            o_batch_stride: o_strides[0],
            o_head_stride: o_strides[1],
            lse_batch_stride: 1,
            lse_head_stride,
            cache: cache_abi,
            batch,
            heads_q,
            heads_kv,
            head_dim,
            head_dim_v,
            num_splits,
            split_tokens,
            dtype,
            scale,
            scale_log2,
            score_mod,
            cu_seqlens_q: cu_ptr as *const i32,
            total_q,
            max_seqlen_q,
            causal,
            rope,
            // The launch's max_seqlen_q (a schedule's: the workspace's) sets the rows per CTA too.
            rows_per_cta: to_i32(
                "rows per CTA",
                decode_rows_per_cta(problem.head_dim, max_seqlen_q as usize * problem.group()),
            )?,
            ..Default::default()
        };
        let params = match &table {
            Some((sched, view, _)) => sched.params(params, launch.input(c"schedule", view, 4)? as *const i32)?,
            None => params,
        };
        launch.run("paged_prefill", params, sys::fa_decode)?;
        return Ok(plan);
    }
    let params = sys::FaPagedPrefillParams {
        q: q_ptr,
        o: o_ptr,
        lse: lse_ptr,
        cu_seqlens_q: cu_ptr as *const i32,
        partial_o: po_ptr,
        partial_lse: plse_ptr,
        q_row_stride: q_strides[0],
        q_head_stride: q_strides[1],
        o_row_stride: o_strides[0],
        o_head_stride: o_strides[1],
        lse_head_stride,
        cache: cache_abi,
        batch,
        heads_q,
        heads_kv,
        head_dim,
        total_q,
        max_seqlen_q,
        num_splits,
        split_tokens,
        dtype,
        causal,
        scale,
        scale_log2,
        score_mod,
        rope,
        head_dim_v,
    };
    launch.run("paged_prefill", params, sys::fa_paged_prefill)?;
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 46 (item 4): raw streams get a paged prefill workspace in their own memory, bound to their
    /// stream (another stream or backend is `Usage`). The handles are only compared, never used.
    #[test]
    fn raw_workspaces_are_bound_to_their_stream() {
        let fake = |s: usize| RawStream::from_raw_parts_for_tests(s as _, 0x10 as _);
        // SAFETY: nothing is launched; the workspace is only checked against streams.
        let ws = unsafe { PagedPrefillWorkspace::from_device_ptrs(fake(0x100), (1 << 20, 64), (1 << 21, 8), 132, 396) };
        let ws = ws.unwrap();
        assert_eq!(ws.sm_count(), 132);
        assert!(ws.check_stream(&Stream::Raw(fake(0x100))).is_ok());
        let emu = crate::Emulator::new();
        for other in [Stream::Raw(fake(0x200)), Stream::Emu(&emu)] {
            let e = ws.check_stream(&other).unwrap_err();
            assert_eq!(e.kind(), &crate::ErrorKind::Usage);
            assert!(e.message().starts_with("workspace:"), "{}", e.message());
        }
        // A call over it on the emulator stops at the stream check, before anything reads its memory.
        let mut ws = ws;
        let q = vec![half::bf16::ZERO; 64];
        let cu = [0i32, 1];
        let (k, t, l) = (vec![half::bf16::ZERO; 64], [0i32], [1i32]);
        let cache = PagedKvCache::new(
            TensorView::host(&k, [1, 1, 1, 64]).unwrap(),
            TensorView::host(&k, [1, 1, 1, 64]).unwrap(),
            TensorView::host(&t, [1, 1]).unwrap(),
            TensorView::host(&l, [1]).unwrap(),
            1,
        )
        .unwrap();
        let mut o = vec![half::bf16::NAN; 64];
        let e = paged_prefill(
            &Stream::Emu(&emu),
            &TensorView::host(&q, [1, 1, 64]).unwrap(),
            &TensorView::host(&cu, [2]).unwrap(),
            1,
            &cache,
            &mut TensorViewMut::host(&mut o, [1, 1, 64]).unwrap(),
            None,
            Some(&mut ws),
            &PagedPrefillOptions::default(),
        )
        .unwrap_err();
        assert_eq!(e.kind(), &crate::ErrorKind::Usage);
    }

    fn problem(batch: usize, hq: usize, hkv: usize, d: usize, q: usize, ctx: usize) -> PagedPrefillProblem {
        PagedPrefillProblem {
            batch,
            heads_q: hq,
            heads_kv: hkv,
            head_dim: d,
            total_q: batch * q,
            max_seqlen_q: q,
            max_seq_len: ctx,
        }
    }

    #[test]
    fn widths_round_up() {
        assert_eq!(problem(1, 1, 1, 32, 1, 1).width(), Some(64));
        assert_eq!(problem(1, 1, 1, 40, 1, 1).width(), Some(64));
        assert_eq!(problem(1, 1, 1, 96, 1, 1).width(), Some(96));
        assert_eq!(problem(1, 1, 1, 136, 1, 1).width(), Some(256));
        assert_eq!(problem(1, 1, 1, 264, 1, 1).width(), None);
    }

    #[test]
    fn short_chunks_pack_the_group_into_one_cta() {
        // q_len 4 x G 8 = 32 rows <= Br 128: one row block per KV head.
        let p = problem(2, 32, 4, 128, 4, 4096);
        assert_eq!(p.ctas_per_split(), 2 * 4);
        // 17 x 8 = 136 rows: two row blocks.
        assert_eq!(problem(1, 8, 1, 128, 17, 64).ctas_per_split(), 2);
        // D = 256: Br 64.
        assert_eq!(problem(1, 8, 1, 256, 8, 64).ctas_per_split(), 1);
        assert_eq!(problem(1, 8, 1, 256, 9, 64).ctas_per_split(), 2);
    }

    #[test]
    fn windows_plan_over_a_ctas_span() {
        // gpt-oss spec-verify: q_len 4, 32k context, window 128, G = 8: a CTA's keys span 4 + 128 tokens,
        // one split (the context would make 17, 16 of them all −inf).
        let p = problem(1, 64, 8, 64, 4, 32768);
        assert_eq!(PagedPrefillPlan::new(&p, 132, None).unwrap().num_splits, 17);
        let w = p.windowed(Some((128, -1)), true);
        assert_eq!(w.max_seq_len, 4 + 128);
        assert_eq!(PagedPrefillPlan::new(&w, 132, None).unwrap().num_splits, 1);
        // Long chunks: a CTA's 128 packed rows at G = 8 are 17 tokens at most.
        assert_eq!(problem(1, 64, 8, 64, 2048, 32768).windowed(Some((4096, 0)), true).max_seq_len, 17 + 4096);
        // Unbounded on one side without causal, or no window: unchanged.
        assert_eq!(p.windowed(Some((128, -1)), false), p);
        assert_eq!(p.windowed(Some((-1, 0)), true), p);
        assert_eq!(p.windowed(None, true), p);
    }

    #[test]
    fn split_policy() {
        // Few CTAs, long context: split to cover the SMs, at least MIN_SPLIT_KEYS keys each.
        let p = problem(1, 8, 1, 128, 4, 8192);
        let plan = PagedPrefillPlan::new(&p, 132, None).unwrap();
        assert_eq!(plan.num_splits, 8192 / MIN_SPLIT_KEYS);
        assert_eq!(plan.split_tokens % SPLIT_GRANULE, 0);
        assert!(plan.split_tokens * plan.num_splits >= 8192);
        assert!(plan.split_tokens * (plan.num_splits - 1) < 8192, "no empty split");
        assert_eq!(plan.grid, [plan.num_splits, 1, 1]);
        assert_eq!(plan.partial_lse_len, plan.num_splits * 4 * 8);
        assert_eq!(plan.partial_o_len, plan.partial_lse_len * 128);
        // A grid that covers the SMs, or a short context: no split, no workspace.
        let big = problem(64, 32, 8, 128, 512, 8192);
        assert_eq!(PagedPrefillPlan::new(&big, 132, None).unwrap().num_splits, 1);
        let short = problem(1, 8, 1, 128, 4, 1000);
        let plan = PagedPrefillPlan::new(&short, 132, None).unwrap();
        assert_eq!((plan.num_splits, plan.partial_o_len), (1, 0));
        // Forced: honoured up to one granule per split.
        let plan = PagedPrefillPlan::new(&short, 132, Some(3)).unwrap();
        assert_eq!((plan.num_splits, plan.split_tokens), (3, 384));
        assert_eq!(PagedPrefillPlan::new(&problem(1, 1, 1, 64, 1, 100), 132, Some(8)).unwrap().num_splits, 2);
        assert!(PagedPrefillPlan::new(&short, 132, Some(0)).is_err());
        // Never more than MAX_PLANNED_SPLITS.
        let huge = problem(1, 1, 1, 64, 1, 1 << 24);
        assert_eq!(PagedPrefillPlan::new(&huge, 1000, None).unwrap().num_splits, MAX_PLANNED_SPLITS);
    }
}
