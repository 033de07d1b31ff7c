//! Paged decode: one new query token per sequence attending over its paged KV cache, GQA-aware, with
//! split-KV (flash-decoding) planned on the host ([`crate::plan`]) and the fp32 partials combined by the
//! merge kernel on the same stream. Kernel: kernels/decode.cu.
//!
//! Nothing on the launch path allocates: the split workspace is a [`DecodeWorkspace`] created once and reused
//! across calls and layers. Create it for a plan ([`DecodeWorkspace::for_plan`] or
//! [`DecodeWorkspace::for_limits`]) and every call follows that one plan: results are then bitwise
//! independent of what else is batched, and CUDA-graph replays stay correct as seq_lens grow within the
//! plan's max_seq_len. A workspace made by [`DecodeWorkspace::with_capacity`] instead plans each call from
//! its own shape (convenient, but the split geometry then depends on the batch).

use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};

use crate::device::{RawStream, Stream};
use crate::dtype::Element;
use crate::error::{to_i32, Error, ErrorKind, Result};
use crate::fp8::{self, KvCacheOf};
use crate::launch::Launch;
use crate::paged::PagedKvCache;
use crate::plan::{DecodePlan, DecodeProblem};
use crate::schedule::{decode_ctas_per_sm, schedule_decode, DecodeSchedule, SplitPolicy};
use crate::score_mod::ScoreMod;
use crate::sys;
use crate::tensor::{TensorView, TensorViewMut};
use crate::tile::KernelOp;

/// Head dims decode accepts: every multiple of 8 from 32 to 512 ([`crate::head_dim`]; the kernel is
/// instantiated for widths 64, 128, 256 and 512 and serves the dims below each with predicated columns).
pub use crate::head_dim::DECODE_HEAD_DIMS;

/// SM count the emulator backend plans for (an H100/H200-sized GPU), so emulated runs take the same split
/// decisions a real GPU of that size would.
pub const EMULATOR_SM_COUNT: usize = 132;

/// Options of one decode call: `DecodeOptions { num_splits: Some(4), ..Default::default() }`.
#[derive(Debug, Clone, Copy, Default)]
pub struct DecodeOptions<'a> {
    /// Softmax scale; `None` means 1/sqrt(D).
    pub scale: Option<f32>,
    /// Force this many KV splits (1 = no split); `None` lets the planner choose.
    pub num_splits: Option<usize>,
    /// Sliding window (its left bound; the right bound cannot exclude anything for the newest token),
    /// softcap, ALiBi, sinks. A window reads only the last `left + 1` tokens of each sequence, and plans
    /// split-KV over that span ([`DecodeProblem::windowed`]).
    pub score_mod: ScoreMod<'a>,
    /// Rotary embedding of q ([`crate::rope`]): each query rotated at `rope.positions[b]` (one per
    /// sequence) or, without positions, at its sequence's last position `seq_len − 1`; q is read once and
    /// never written back. The cache's K must already be rotated (append with RoPE).
    pub rope: Option<crate::rope::Rope<'a>>,
}

pub(crate) enum Buffer<T = f32> {
    Gpu(CudaSlice<T>),
    Device { ptr: u64, len: usize },
    Host(Vec<T>),
}

impl<T: DeviceRepr + ValidAsZeroBits + Copy + Default> Buffer<T> {
    /// `len` zeroed elements on `stream`'s backend; a [`Stream::Raw`] has no allocator: a Usage error whose
    /// message `on_raw` tells the caller of the workspace type what to do instead.
    pub(crate) fn new(stream: &Stream<'_>, len: usize, on_raw: &'static str) -> Result<Self> {
        Ok(match stream {
            // Allocated and zeroed on the caller's stream (stream-ordered, no synchronisation); cudarc frees
            // it on that stream too, after the work enqueued before the drop.
            Stream::Gpu(s) => Buffer::Gpu(s.alloc_zeros::<T>(len.max(1))?),
            Stream::Raw(_) => return Err(Error::new(ErrorKind::Usage, on_raw)),
            // A failed host allocation is an error, not an abort (limits can ask for any size).
            Stream::Emu(_) => {
                let mut v = Vec::new();
                v.try_reserve_exact(len).map_err(|_| {
                    Error::new(ErrorKind::OutOfMemory, format!("workspace: {len} elements of host memory"))
                })?;
                v.resize(len, T::default());
                Buffer::Host(v)
            }
        })
    }
    /// Writes `data` at the start, ordered on `stream` (a host-to-device copy from pageable memory: the
    /// driver has staged it when the call returns, so `data` may go at once).
    pub(crate) fn write(&mut self, stream: &Stream<'_>, data: &[T]) -> Result<()> {
        if data.len() > self.len() {
            return Err(Error::out_of_bounds("schedule", format!("{} entries for {}", data.len(), self.len())));
        }
        match (self, stream) {
            (Buffer::Gpu(buf), Stream::Gpu(s)) => s.memcpy_htod(data, &mut buf.slice_mut(0..data.len()))?,
            (Buffer::Host(v), Stream::Emu(_)) => v[..data.len()].copy_from_slice(data),
            _ => return Err(Error::backend("workspace", "made on another backend than this call's stream")),
        }
        Ok(())
    }
    /// `OutOfBounds` unless the buffer holds `len` elements: every view is bounded by the stored length, so
    /// no plan or schedule can make one reach past the memory (a raw workspace's contract covers only that).
    fn check_len(&self, len: usize) -> Result<()> {
        if len > self.len() {
            return Err(Error::out_of_bounds(
                "workspace",
                format!("a view of {len} elements of a buffer that holds {}", self.len()),
            ));
        }
        Ok(())
    }
    /// A read-only view of the first `len` elements (`OutOfBounds` past the buffer).
    pub(crate) fn input(&self, len: usize) -> Result<TensorView<'_, T, 1>> {
        self.check_len(len)?;
        match self {
            Buffer::Gpu(s) => TensorView::gpu(s.slice(0..len), [len]),
            // SAFETY: the memory's contract was accepted by DecodeWorkspace::from_device_ptrs.
            Buffer::Device { ptr, .. } => unsafe { TensorView::from_device_ptr(*ptr, len, [len]) },
            Buffer::Host(v) => TensorView::host(&v[..len], [len]),
        }
    }
    pub(crate) fn len(&self) -> usize {
        match self {
            Buffer::Gpu(s) => s.len(),
            Buffer::Device { len, .. } => *len,
            Buffer::Host(v) => v.len(),
        }
    }
}

impl Buffer<f32> {
    /// A writable view of the first `len` partials (fp32 O / LSE; `OutOfBounds` past the buffer).
    pub(crate) fn view(&mut self, len: usize) -> Result<TensorViewMut<'_, f32, 1>> {
        self.check_len(len)?;
        match self {
            Buffer::Gpu(s) => TensorViewMut::gpu(s.slice_mut(0..len), [len]),
            // SAFETY: the memory's contract was accepted by DecodeWorkspace::from_device_ptrs.
            Buffer::Device { ptr, .. } => unsafe { TensorViewMut::from_device_ptr(*ptr, len, [len]) },
            // The emulator's workspace is poisoned (NaN) before every launch: a merge that read a partial no
            // split wrote would fail loudly instead of reading the previous call's values
            // (docs/hidden-memory.md).
            Buffer::Host(v) => {
                v[..len].fill(f32::NAN);
                TensorViewMut::host(&mut v[..len], [len])
            }
        }
    }
}

/// The reusable split-KV workspace (fp32 partial O and LSE), the SM count plans are made for, and optionally
/// the one plan every call follows, or the scheduler every call is packed by. Create it once, outside the
/// decode loop.
pub struct DecodeWorkspace {
    partial_o: Buffer,
    partial_lse: Buffer,
    sm_count: usize,
    plan: Option<DecodePlan>,
    scheduler: Option<Scheduler>,
    /// The raw stream a workspace in the caller's memory is bound to ([`DecodeWorkspace::from_device_ptrs`]).
    raw_stream: Option<RawStream>,
}

/// A scheduled decode workspace's limits and its schedule table.
struct Scheduler {
    limits: DecodeProblem,
    table: ScheduleTable,
}

/// A scheduled launch's fixed geometry and the device copy of the current schedule (one int32 table: CTA
/// ranges [slots + 1], units [work_cap], merge rows [merge_cap]), shared by decode and paged prefill's
/// streaming path. The kernel reads only the units in its CTA's range, and the merge skips padding rows, so
/// a table rewritten for a smaller call leaves nothing stale in reach.
pub(crate) struct ScheduleTable {
    pub(crate) policy: SplitPolicy,
    pub(crate) slots: usize,
    pub(crate) work_cap: usize,
    pub(crate) partial_cap: usize,
    merge_cap: usize,
    table: Buffer<i32>,
    pub(crate) current: Option<DecodeSchedule>,
}

/// int32 words of one FaDecodeWork / FaMergeRow.
const WORK_WORDS: usize = 6;
const MERGE_WORDS: usize = 3;

impl ScheduleTable {
    /// A table for `slots` CTAs, `work_cap` units and `merge_cap` merge rows (none when no partial state
    /// can be written), on `stream`'s backend.
    pub(crate) fn new(
        stream: &Stream<'_>,
        policy: SplitPolicy,
        slots: usize,
        (work_cap, partial_cap, merge_cap): (usize, usize, usize),
        on_raw: &'static str,
    ) -> Result<Self> {
        if slots > i32::MAX as usize / 2 {
            return Err(Error::overflow("slots", format!("{slots} CTA slots")));
        }
        let merge_cap = if partial_cap == 0 { 0 } else { merge_cap };
        let mut t =
            Self { policy, slots, work_cap, partial_cap, merge_cap, table: Buffer::Host(Vec::new()), current: None };
        let len = t.table_len();
        if len > i32::MAX as usize {
            return Err(Error::overflow("workspace", format!("a schedule table of {len} int32")));
        }
        t.table = Buffer::new(stream, len, on_raw)?;
        Ok(t)
    }
    fn work_offset(&self) -> usize {
        self.slots + 1
    }
    // (Saturating: a table past i32::MAX words is refused by `new`, whatever the capacities.)
    fn merge_offset(&self) -> usize {
        self.work_offset().saturating_add(self.work_cap.saturating_mul(WORK_WORDS))
    }
    fn table_len(&self) -> usize {
        self.merge_offset().saturating_add(self.merge_cap.saturating_mul(MERGE_WORDS))
    }
    /// The table of `schedule`, padded to the fixed geometry: CTAs past its last have empty ranges, merge
    /// entries past its last are padding (out_row −1).
    fn encode(&self, schedule: &DecodeSchedule) -> Vec<i32> {
        let mut t = Vec::with_capacity(self.table_len());
        let last = schedule.cta_indptr.last().copied().unwrap_or(0);
        t.extend(schedule.cta_indptr.iter().copied().chain(std::iter::repeat(last)).take(self.slots + 1));
        for w in &schedule.work {
            t.extend([w.b, w.head_block, w.split, w.num_splits, w.split_tokens, w.partial_base]);
        }
        t.resize(self.merge_offset(), 0);
        for r in schedule
            .merge_rows
            .iter()
            .map(|r| [r.out_row, r.first_state, r.num_states])
            .chain(std::iter::repeat([-1, 0, 0]))
            .take(self.merge_cap)
        {
            t.extend(r);
        }
        t
    }
    /// Checks that `schedule` fits (else `OutOfBounds`, `what_past` naming the limit a call may have
    /// exceeded), writes it into the device table on `stream` and keeps it as the current one.
    pub(crate) fn install(
        &mut self,
        stream: &Stream<'_>,
        schedule: DecodeSchedule,
        what_past: &str,
    ) -> Result<&DecodeSchedule> {
        if schedule.work.len() > self.work_cap
            || schedule.num_partials > self.partial_cap
            || schedule.merge_rows.len() > self.merge_cap
            || schedule.num_ctas() > self.slots
        {
            return Err(Error::out_of_bounds(
                "workspace",
                format!(
                    "the schedule has {} units / {} partial states / {} merge rows, the workspace room for {} / {} / {} ({what_past}?)",
                    schedule.work.len(),
                    schedule.num_partials,
                    schedule.merge_rows.len(),
                    self.work_cap,
                    self.partial_cap,
                    self.merge_cap,
                ),
            ));
        }
        let table = self.encode(&schedule);
        self.table.write(stream, &table)?;
        Ok(self.current.insert(schedule))
    }
    /// A read-only view of the whole table, for the launch to take its pointer.
    pub(crate) fn view(&self) -> Result<TensorView<'_, i32, 1>> {
        self.table.input(self.table_len())
    }
    /// `params` with the scheduled launch's fields, the table at `table` (the view's pointer): the grid of
    /// one CTA per slot, the units, the merge rows and the partial states' bound.
    pub(crate) fn params(&self, params: sys::FaDecodeParams, table: *const i32) -> Result<sys::FaDecodeParams> {
        // SAFETY (pointer arithmetic only): the offsets lie inside the table (table_len).
        let (work, merge) = (table.wrapping_add(self.work_offset()), table.wrapping_add(self.merge_offset()));
        Ok(sys::FaDecodeParams {
            num_splits: 1,
            split_tokens: 0,
            work: work.cast(),
            work_indptr: table,
            merge_rows: if self.merge_cap > 0 { merge.cast() } else { std::ptr::null() },
            num_ctas: to_i32("slots", self.slots)?,
            num_work: to_i32("schedule", self.work_cap)?,
            num_merge_rows: to_i32("merge rows", self.merge_cap)?,
            num_partials: to_i32("partials", self.partial_cap)?,
            ..params
        })
    }
}

pub(crate) fn stream_sm_count(stream: &Stream<'_>) -> Result<usize> {
    match stream {
        Stream::Gpu(s) => crate::device::sm_count(s.context()),
        Stream::Raw(r) => r.sm_count(),
        Stream::Emu(_) => Ok(EMULATOR_SM_COUNT),
    }
}

/// Checks that a split-KV workspace's partial O / LSE buffers hold a plan's `o_len` / `lse_len` fp32
/// elements (else `OutOfBounds`, naming the plan's `num_splits`).
pub(crate) fn check_split_fits(
    (partial_o, partial_lse): (&Buffer, &Buffer),
    num_splits: usize,
    o_len: usize,
    lse_len: usize,
) -> Result<()> {
    if o_len > partial_o.len() || lse_len > partial_lse.len() {
        return Err(Error::out_of_bounds(
            "workspace",
            format!(
                "holds {} / {} fp32 partial O / LSE elements, the plan ({num_splits} splits) needs {o_len} / {lse_len}",
                partial_o.len(),
                partial_lse.len(),
            ),
        ));
    }
    Ok(())
}

/// fp32 partial O / LSE elements `num_splits` splits of `problem`'s rows write: `num_splits × B × Hq × dv`
/// and `num_splits × B × Hq` (`Overflow` past usize).
pub(crate) fn split_need(num_splits: usize, problem: &DecodeProblem, dv: usize) -> Result<(usize, usize)> {
    let lse = num_splits
        .checked_mul(problem.batch)
        .and_then(|x| x.checked_mul(problem.heads_q))
        .ok_or_else(|| Error::overflow("workspace", "partial LSE size overflows"))?;
    let o = lse.checked_mul(dv).ok_or_else(|| Error::overflow("workspace", "partial O size overflows"))?;
    Ok((o, lse))
}

/// Compute capability the emulator models (an H100/H200, with [`EMULATOR_SM_COUNT`] SMs).
pub const EMULATOR_COMPUTE_CAPABILITY: (u32, u32) = (9, 0);

/// CTA slots of `stream`'s device for decode at `head_dim` with `rows_per_cta` packed rows per CTA: SMs ×
/// resident CTAs per SM.
pub(crate) fn stream_slots(stream: &Stream<'_>, head_dim: usize, rows_per_cta: usize) -> Result<usize> {
    let cc = match stream {
        Stream::Gpu(s) => {
            let (major, minor) = s.context().compute_capability()?;
            (major.max(0) as u32, minor.max(0) as u32)
        }
        Stream::Raw(_) => return Err(Error::new(ErrorKind::Usage, ON_RAW_STREAM)),
        Stream::Emu(_) => EMULATOR_COMPUTE_CAPABILITY,
    };
    Ok(stream_sm_count(stream)? * decode_ctas_per_sm(cc, head_dim, rows_per_cta))
}

/// Buffer::new's error for a DecodeWorkspace allocated on a raw stream.
const ON_RAW_STREAM: &str =
    "a raw stream's decode workspace is the caller's memory: use DecodeWorkspace::from_device_ptrs";

impl DecodeWorkspace {
    /// A workspace of `partial_o_len` / `partial_lse_len` fp32 elements on `stream`'s backend that plans
    /// every call from its own shape.
    pub fn new(stream: &Stream<'_>, partial_o_len: usize, partial_lse_len: usize) -> Result<Self> {
        Ok(Self {
            partial_o: Buffer::new(stream, partial_o_len, ON_RAW_STREAM)?,
            partial_lse: Buffer::new(stream, partial_lse_len, ON_RAW_STREAM)?,
            sm_count: stream_sm_count(stream)?,
            plan: None,
            scheduler: None,
            raw_stream: None,
        })
    }

    /// A workspace in the caller's device memory (for [`Stream::Raw`] users with their own allocator),
    /// pinned to `plan` and to `stream`: every launch through it must be on that stream (else `Usage`), so
    /// the launches that share its partials are ordered by the stream itself (two raw streams sharing one
    /// workspace would race on them). Needs `plan.partial_o_len()` / `plan.partial_lse_len()` fp32
    /// elements (else `OutOfBounds`).
    ///
    /// # Safety
    /// For every launch made through this workspace (not only at construction): the two ranges are device
    /// memory of `stream`'s context, of at least the lengths given, and nobody else reads or writes them
    /// while work enqueued on `stream` through this workspace may be in flight (see
    /// [`TensorViewMut::from_device_ptr`]). docs/semantics.md, "Safety".
    pub unsafe fn from_device_ptrs(
        stream: RawStream,
        partial_o: (u64, usize),
        partial_lse: (u64, usize),
        plan: &DecodePlan,
        sm_count: usize,
    ) -> Result<Self> {
        plan.check_pinnable()?;
        let ws = Self {
            partial_o: Buffer::Device { ptr: partial_o.0, len: partial_o.1 },
            partial_lse: Buffer::Device { ptr: partial_lse.0, len: partial_lse.1 },
            sm_count,
            plan: Some(*plan),
            scheduler: None,
            raw_stream: Some(stream),
        };
        ws.check_fits(plan)?;
        Ok(ws)
    }

    /// A workspace pinned to the plan the planner makes for these limits (`limits.batch` the largest
    /// batch, `limits.max_seq_len` the longest context; `forced_splits` as in [`DecodePlan::new`]). Its
    /// size is at most `planned_splits · B · Hq · (D + 1)` fp32 elements, where the planner never plans
    /// more than [`crate::plan::MAX_PLANNED_SPLITS`] splits (nor more than max_seq_len / 256), and none
    /// when one split already fills the GPU. Every call follows this plan.
    pub fn for_limits(stream: &Stream<'_>, limits: &DecodeProblem, forced_splits: Option<usize>) -> Result<Self> {
        let plan = DecodePlan::new(limits, stream_sm_count(stream)?, forced_splits)?;
        Self::for_plan(stream, &plan)
    }

    /// Room for any plan over at most `max_batch` sequences of `heads_q` heads of `head_dim` with at most
    /// `max_splits` splits.
    pub fn with_capacity(
        stream: &Stream<'_>,
        max_batch: usize,
        heads_q: usize,
        head_dim: usize,
        max_splits: usize,
    ) -> Result<Self> {
        let lse = max_splits
            .checked_mul(max_batch)
            .and_then(|x| x.checked_mul(heads_q))
            .ok_or_else(|| Error::overflow("workspace", "size overflows"))?;
        let o = lse.checked_mul(head_dim).ok_or_else(|| Error::overflow("workspace", "size overflows"))?;
        Self::new(stream, o, lse)
    }

    /// Exactly the room `plan` needs, pinned to `plan`: every call follows it (and must fit its limits).
    pub fn for_plan(stream: &Stream<'_>, plan: &DecodePlan) -> Result<Self> {
        plan.check_pinnable()?;
        let mut ws = Self::new(stream, plan.partial_o_len, plan.partial_lse_len)?;
        ws.plan = Some(*plan);
        Ok(ws)
    }

    /// A scheduled workspace for calls within `limits` (the largest batch, the heads, the longest context):
    /// every call is cut and packed by [`crate::schedule`] from its own sequences' lengths (window-clipped)
    /// onto this device's CTA slots (SMs × [`decode_ctas_per_sm`]), so a small batch splits as a fresh plan
    /// would and a skewed one is balanced. The launch geometry is fixed (a grid of one CTA per slot, a merge
    /// over `limits.batch` rows whose unused entries are skipped), so a CUDA graph captured once replays any
    /// later schedule: call [`DecodeWorkspace::prepare`] with the step's host `seq_lens` before each replay
    /// (on the emulator, whose lengths are host memory, [`decode`] prepares by itself). Needs at most
    /// [`crate::schedule::partial_capacity`] · Hq · (D + 1) fp32 of partials.
    pub fn scheduled(stream: &Stream<'_>, limits: &DecodeProblem, policy: SplitPolicy) -> Result<Self> {
        let slots = stream_slots(stream, limits.head_dim, limits.rows_per_cta())?;
        Self::scheduled_on(stream, limits, policy, slots)
    }

    /// [`DecodeWorkspace::scheduled`] for `slots` CTA slots instead of the device's (tests and tools that
    /// model another GPU on the emulator).
    pub fn scheduled_on(
        stream: &Stream<'_>,
        limits: &DecodeProblem,
        policy: SplitPolicy,
        slots: usize,
    ) -> Result<Self> {
        let slots = slots.max(1);
        // A window may clip the spans, never lengthen them: size for the whole context.
        let partial_cap = crate::schedule::partial_capacity(limits, None, slots, policy);
        let work_cap = crate::schedule::work_capacity(limits, None, slots, policy);
        let rows = partial_cap
            .checked_mul(limits.heads_q)
            .ok_or_else(|| Error::overflow("workspace", "partial LSE size overflows"))?;
        let o = rows.checked_mul(limits.head_dim).ok_or_else(|| Error::overflow("workspace", "size overflows"))?;
        let table = ScheduleTable::new(stream, policy, slots, (work_cap, partial_cap, limits.batch), ON_RAW_STREAM)?;
        Ok(Self {
            partial_o: Buffer::new(stream, o, ON_RAW_STREAM)?,
            partial_lse: Buffer::new(stream, rows, ON_RAW_STREAM)?,
            sm_count: stream_sm_count(stream)?,
            plan: None,
            scheduler: Some(Scheduler { limits: *limits, table }),
            raw_stream: None,
        })
    }

    /// Plans the next call of a scheduled workspace from the host's copy of its `seq_lens` (and the window
    /// of `opts`) and writes the schedule into the workspace's device table, ordered on `stream`: before a
    /// CUDA-graph replay, or before each call on a GPU (where the kernel cannot read the host's lengths).
    /// The kernel takes each unit's token range from the device `seq_lens`, so lengths that grew since are
    /// still attended in full (the last chunk runs to the end), only less evenly. Errors: `Usage` for a
    /// workspace that is not scheduled, `Shape` for a batch or heads outside its limits.
    pub fn prepare(&mut self, stream: &Stream<'_>, seq_lens: &[i32], opts: &DecodeOptions) -> Result<&DecodeSchedule> {
        let sched = self.scheduler.as_mut().ok_or_else(|| {
            Error::usage("DecodeWorkspace::prepare: the workspace is not scheduled (DecodeWorkspace::scheduled)")
        })?;
        if seq_lens.len() > sched.limits.batch {
            return Err(Error::shape(
                "seq_lens",
                format!("{} sequences, the workspace's limit is {}", seq_lens.len(), sched.limits.batch),
            ));
        }
        let problem = DecodeProblem { batch: seq_lens.len(), ..sched.limits };
        let window = opts.score_mod.window_left();
        let schedule = schedule_decode(&problem, seq_lens, window, sched.table.slots, sched.table.policy)?;
        let past = format!("lengths past max_seq_len {}", sched.limits.max_seq_len);
        sched.table.install(stream, schedule, &past)
    }

    /// The schedule the last [`DecodeWorkspace::prepare`] (or emulated scheduled call) made.
    pub fn schedule(&self) -> Option<&DecodeSchedule> {
        self.scheduler.as_ref().and_then(|s| s.table.current.as_ref())
    }

    /// The SM count plans are made for (the device's, or [`EMULATOR_SM_COUNT`]).
    pub fn sm_count(&self) -> usize {
        self.sm_count
    }

    /// The pinned plan, if any.
    pub fn pinned_plan(&self) -> Option<&DecodePlan> {
        self.plan.as_ref()
    }

    /// The plan a decode of `problem` with `opts` follows: the pinned plan (checked to cover the call; a
    /// forced split count in `opts` must then match it), else one made for this call. `problem` is the
    /// attended span: for a sliding window, [`DecodeProblem::windowed`].
    pub fn plan(&self, problem: &DecodeProblem, opts: &DecodeOptions) -> Result<DecodePlan> {
        match &self.plan {
            Some(plan) => {
                plan.check_covers(problem)?;
                if opts.num_splits.is_some_and(|n| n != plan.num_splits) {
                    return Err(Error::shape(
                        "num_splits",
                        format!("{:?} differs from the workspace's pinned plan ({})", opts.num_splits, plan.num_splits),
                    ));
                }
                Ok(*plan)
            }
            None => DecodePlan::new(problem, self.sm_count, opts.num_splits),
        }
    }

    /// `Usage` unless a launch on `stream` may use this workspace: a workspace in the caller's memory only on
    /// the raw stream it was made for (the stream orders the launches that share its partials).
    pub(crate) fn check_stream(&self, stream: &Stream<'_>) -> Result<()> {
        match (self.raw_stream, stream) {
            (None, _) => Ok(()),
            (Some(own), Stream::Raw(r)) if own.cu_stream() == r.cu_stream() => Ok(()),
            (Some(_), _) => Err(Error::usage(
                "workspace: made by DecodeWorkspace::from_device_ptrs for another stream (a raw workspace is used \
                 only on its own stream, which orders the launches that share its partials)",
            )),
        }
    }

    /// The partial O / LSE buffers (other ops that split over this workspace: MLA decode).
    pub(crate) fn partials(&self) -> (&Buffer, &Buffer) {
        (&self.partial_o, &self.partial_lse)
    }
    pub(crate) fn partials_mut(&mut self) -> (&mut Buffer, &mut Buffer) {
        (&mut self.partial_o, &mut self.partial_lse)
    }

    fn check_fits(&self, plan: &DecodePlan) -> Result<()> {
        check_split_fits(
            (&self.partial_o, &self.partial_lse),
            plan.num_splits,
            plan.partial_o_len,
            plan.partial_lse_len,
        )
    }
}

/// Validates decode arguments and returns the problem they describe.
pub fn check_decode_args<T: Element, C: KvCacheOf<T>>(
    q: &TensorView<'_, T, 3>,
    cache: &PagedKvCache<'_, C>,
    o: &TensorViewMut<'_, T, 3>,
    lse: Option<&TensorViewMut<'_, f32, 2>>,
) -> Result<DecodeProblem> {
    let [batch, heads_q, head_dim] = q.shape();
    let g = cache.geometry();
    fp8::check_cache_dtype::<C>(T::DTYPE, cache.scales.is_some())?;
    crate::head_dim::check(KernelOp::Decode, head_dim)?;
    if g.head_dim != head_dim {
        return Err(Error::shape("k_cache", format!("head dim {} differs from q's {head_dim}", g.head_dim)));
    }
    check_v_head_dim::<C>(KernelOp::Decode, g)?;
    if heads_q == 0 || heads_q % g.heads_kv != 0 {
        return Err(Error::shape(
            "q",
            format!("{heads_q} query heads are not a positive multiple of the cache's {} KV heads", g.heads_kv),
        ));
    }
    if batch != cache.batch() {
        return Err(Error::shape("q", format!("batch {batch} differs from block_table's {}", cache.batch())));
    }
    o.expect_shape("o", [batch, heads_q, g.head_dim_v])?;
    q.check_rows("q", 16)?;
    o.check_rows("o", 16)?;
    o.check_disjoint("o")?;
    if let Some(lse) = lse {
        lse.expect_shape("lse", [batch, heads_q])?;
        lse.check_rows("lse", 4)?;
        lse.check_disjoint("lse")?;
    }
    to_i32("q (batch)", batch)?;
    to_i32("q (heads)", heads_q)?;
    // The plan's head dim is the wider of Dqk and Dv: the kernel width's, and what partials are sized by.
    let head_dim = g.widest_head_dim();
    Ok(DecodeProblem { batch, heads_q, heads_kv: g.heads_kv, head_dim, max_seq_len: cache.max_seq_len() })
}

/// A V head dim of its own (the cache's V pages narrower or wider than K's): one the op supports (else
/// `Unsupported`, naming `v_cache`), a multiple of 16 for an FP8 cache as K's is.
pub(crate) fn check_v_head_dim<C: crate::fp8::KvElement>(op: KernelOp, g: crate::paged::PageGeometry) -> Result<()> {
    let dv = g.head_dim_v;
    if crate::head_dim::check(op, dv).is_err() {
        return Err(Error::unsupported("v_cache", format!("V head dim {dv} is not a supported head dim")));
    }
    if C::KV_DTYPE.fp8().is_some() && (dv % 16 != 0 || g.head_dim % 16 != 0) {
        return Err(Error::unsupported(
            "v_cache",
            format!("head dims {} / {dv} (an FP8 cache needs multiples of 16)", g.head_dim),
        ));
    }
    Ok(())
}

/// Decode attention over a paged KV cache: `o[b, h] = softmax(q[b, h] · K_bᵀ · scale) V_b` over the first
/// `seq_lens[b]` tokens of sequence b's pages (with a sliding window of left bound w: the last w + 1), K/V
/// head `h / (Hq / Hkv)`, with the score variants of `opts.score_mod`.
///  - `q`: `[B, Hq, Dqk]`, `o`: `[B, Hq, Dv]` (the cache's K and V head dims: Dv = Dqk, or V's own, e.g.
///    DeepSeek's 192 / 128; the default scale is 1/√Dqk), head dims in [`DECODE_HEAD_DIMS`], unit innermost
///    stride, 16-byte aligned rows;
///  - `lse`: optional `[B, Hq]` natural-log LSE (fp32, unit head stride); seq_len 0 gives o = 0, lse = -inf;
///  - `workspace`: the split workspace, large enough for the plan (see [`DecodeWorkspace`]).
///
/// The cache may hold FP8 (`C` = [`crate::Fp8E4m3`] / [`crate::Fp8E5m2`], with its scales attached by
/// [`PagedKvCache::with_scales`] or [`PagedKvCache::with_scale_tensors`]): attention then uses stored value
/// x scale, the scales read on the device at run time; q and o stay 16-bit.
///
/// On the emulator the block table and `seq_lens` are checked first ([`PagedKvCache::validate`], unless the
/// emulator was built with [`crate::TableChecks::GpuMasking`]); on a GPU bad entries are masked
/// (docs/semantics.md).
///
/// Enqueues on `stream` and returns the plan it followed. Errors name the offending argument.
pub fn decode<T: Element, C: KvCacheOf<T>>(
    stream: &Stream<'_>,
    q: &TensorView<'_, T, 3>,
    cache: &PagedKvCache<'_, C>,
    o: &mut TensorViewMut<'_, T, 3>,
    lse: Option<&mut TensorViewMut<'_, f32, 2>>,
    workspace: &mut DecodeWorkspace,
    opts: &DecodeOptions,
) -> Result<DecodePlan> {
    opts.score_mod.check_values()?;
    workspace.check_stream(stream)?;
    let problem = check_decode_args(q, cache, o, lse.as_deref())?.windowed(opts.score_mod.window_left());
    if crate::paged::strict_tables(stream) {
        cache.validate(stream)?;
    }
    if workspace.scheduler.is_some() {
        return decode_scheduled(stream, q, cache, o, lse, workspace, opts, &problem);
    }
    let plan = workspace.plan(&problem, opts)?;
    let g = cache.geometry();
    // What this call writes, recomputed from the call (not the plan's own claim): the call's own batch
    // (<= the plan's), [num_splits, B, Hq, (Dv)] partials.
    let split = plan.num_splits > 1;
    let (o_need, lse_need) = if split { split_need(plan.num_splits, &problem, g.head_dim_v)? } else { (0, 0) };
    check_split_fits(workspace.partials(), plan.num_splits, o_need, lse_need)?;
    let scale = crate::launch::softmax_scale(opts.scale, g.head_dim)?; // 1/√Dqk by default

    if problem.batch == 0 {
        return Ok(plan);
    }
    let mut partial_o = workspace.partial_o.view(o_need)?;
    let mut partial_lse = workspace.partial_lse.view(lse_need)?;

    let mut launch = Launch::new(*stream);
    let partials = split.then_some((&mut partial_o, &mut partial_lse));
    let base = common_params(&mut launch, q, cache, o, lse, partials, &problem, opts, scale)?;
    let params = sys::FaDecodeParams {
        num_splits: to_i32("num_splits", plan.num_splits)?,
        split_tokens: to_i32("split_tokens", plan.split_tokens)?,
        ..base
    };
    launch.run("paged_decode", params, sys::fa_decode)?;
    Ok(plan)
}

/// The kernel parameters both decode paths share, their buffers taken into `launch`: q, o and the LSE, the
/// split partials (when the launch writes any), the cache, the problem's sizes, the scale and the variants
/// (RoPE included). The split and schedule fields are left at 0 for the caller.
#[allow(clippy::too_many_arguments)]
fn common_params<'l, T: Element, C: KvCacheOf<T>>(
    launch: &mut Launch<'l>,
    q: &'l TensorView<'_, T, 3>,
    cache: &'l PagedKvCache<'_, C>,
    o: &'l mut TensorViewMut<'_, T, 3>,
    lse: Option<&'l mut TensorViewMut<'_, f32, 2>>,
    partials: Option<(&'l mut TensorViewMut<'_, f32, 1>, &'l mut TensorViewMut<'_, f32, 1>)>,
    problem: &DecodeProblem,
    opts: &'l DecodeOptions,
    scale: f32,
) -> Result<sys::FaDecodeParams> {
    let score_mod = opts.score_mod.abi(launch, problem.batch, problem.heads_q)?;
    let g = cache.geometry(); // Dqk and Dv (problem.head_dim is the wider)
    let rope = match &opts.rope {
        Some(r) => r.abi(launch, g.head_dim, problem.batch, false)?,
        None => sys::FaRope::default(),
    };
    let q_ptr = launch.input(c"q", q, 16)?;
    let cache_abi = cache.launch_abi(launch)?;
    let (q_strides, o_strides) = (q.launch_strides(), o.launch_strides());
    let o_ptr = launch.output(c"o", o, 16)?;
    let (lse_ptr, lse_batch_stride) = match lse {
        Some(l) => {
            let stride = l.launch_strides()[0];
            (launch.output(c"lse", l, 4)? as *mut f32, stride)
        }
        None => (std::ptr::null_mut(), 0),
    };
    let (partial_o, partial_lse) = match partials {
        Some((po, plse)) => {
            (launch.output(c"partial_o", po, 16)? as *mut f32, launch.output(c"partial_lse", plse, 4)? as *mut f32)
        }
        None => (std::ptr::null_mut(), std::ptr::null_mut()),
    };
    Ok(sys::FaDecodeParams {
        q: q_ptr,
        o: o_ptr,
        lse: lse_ptr,
        partial_o,
        partial_lse,
        q_batch_stride: q_strides[0],
        q_head_stride: q_strides[1],
        o_batch_stride: o_strides[0],
        o_head_stride: o_strides[1],
        lse_batch_stride,
        cache: cache_abi,
        batch: to_i32("batch", problem.batch)?,
        heads_q: to_i32("heads_q", problem.heads_q)?,
        heads_kv: to_i32("heads_kv", problem.heads_kv)?,
        head_dim: to_i32("head_dim", g.head_dim)?,
        head_dim_v: to_i32("head_dim_v", g.head_dim_v)?,
        dtype: T::DTYPE.abi(),
        scale,
        scale_log2: scale * std::f32::consts::LOG2_E,
        score_mod,
        rope,
        // One query row per sequence (cu_seqlens_q NULL): row b, LSE [B, Hq].
        lse_head_stride: 1,
        total_q: to_i32("batch", problem.batch)?,
        max_seqlen_q: 1,
        causal: 1,
        rows_per_cta: to_i32("rows per CTA", problem.rows_per_cta())?,
        ..Default::default()
    })
}

/// [`decode`] on a scheduled workspace: the schedule prepared for this call (made here from the cache's
/// lengths when they are host memory), launched at the workspace's fixed geometry. Returns a summary plan:
/// the largest chunk count, the grid (slots, 1, 1) and the partials used.
#[allow(clippy::too_many_arguments)]
fn decode_scheduled<T: Element, C: KvCacheOf<T>>(
    stream: &Stream<'_>,
    q: &TensorView<'_, T, 3>,
    cache: &PagedKvCache<'_, C>,
    o: &mut TensorViewMut<'_, T, 3>,
    lse: Option<&mut TensorViewMut<'_, f32, 2>>,
    workspace: &mut DecodeWorkspace,
    opts: &DecodeOptions,
    problem: &DecodeProblem,
) -> Result<DecodePlan> {
    if opts.num_splits.is_some() {
        return Err(Error::usage("num_splits: a scheduled workspace cuts each sequence itself (SplitPolicy)"));
    }
    const NOT_SCHEDULED: &str = "decode: this workspace has no scheduler (DecodeWorkspace::scheduled)";
    let Some(limits) = workspace.scheduler.as_ref().map(|s| s.limits) else {
        return Err(Error::usage(NOT_SCHEDULED));
    };
    if (problem.heads_q, problem.heads_kv, problem.head_dim) != (limits.heads_q, limits.heads_kv, limits.head_dim)
        || problem.batch > limits.batch
    {
        return Err(Error::shape(
            "workspace",
            format!(
                "scheduled for B <= {} / Hq {} / Hkv {} / D {}, the call has B {} / Hq {} / Hkv {} / D {}",
                limits.batch,
                limits.heads_q,
                limits.heads_kv,
                limits.head_dim,
                problem.batch,
                problem.heads_q,
                problem.heads_kv,
                problem.head_dim
            ),
        ));
    }
    if let Some(lens) = crate::prefill::host_values(&cache.seq_lens) {
        let lens = lens.to_vec();
        workspace.prepare(stream, &lens, opts)?;
    }
    let g = cache.geometry();
    let sched = &workspace.scheduler.as_ref().ok_or_else(|| Error::usage(NOT_SCHEDULED))?.table;
    let schedule = sched.current.as_ref().ok_or_else(|| {
        Error::usage(
            "decode: a scheduled workspace on a GPU needs DecodeWorkspace::prepare with the host seq_lens first",
        )
    })?;
    if schedule.batch != problem.batch || schedule.window_left != opts.score_mod.window_left() {
        return Err(Error::shape(
            "workspace",
            format!(
                "the prepared schedule is for B {} / window {:?}, the call has B {} / window {:?}",
                schedule.batch,
                schedule.window_left,
                problem.batch,
                opts.score_mod.window_left()
            ),
        ));
    }
    let plan = DecodePlan {
        problem: *problem,
        num_splits: schedule.max_splits(),
        split_tokens: match sched.policy {
            SplitPolicy::FixedSplitTokens(t) => t,
            SplitPolicy::Balanced => 0,
        },
        grid: [sched.slots, 1, 1],
        partial_o_len: schedule.num_partials * problem.heads_q * g.head_dim_v,
        partial_lse_len: schedule.num_partials * problem.heads_q,
        summary: true,
    };
    if problem.batch == 0 {
        return Ok(plan);
    }
    launch_scheduled(stream, q, cache, o, lse, workspace, opts, problem)?;
    Ok(plan)
}

/// The launch of a scheduled decode at the workspace's fixed geometry, over whatever its device table holds
/// now (checked against the call by the caller, or not at all: what a CUDA graph captured from a call
/// replays after a later `prepare`, which the kernels bound, docs/semantics.md "Safety").
#[allow(clippy::too_many_arguments)]
fn launch_scheduled<T: Element, C: KvCacheOf<T>>(
    stream: &Stream<'_>,
    q: &TensorView<'_, T, 3>,
    cache: &PagedKvCache<'_, C>,
    o: &mut TensorViewMut<'_, T, 3>,
    lse: Option<&mut TensorViewMut<'_, f32, 2>>,
    workspace: &mut DecodeWorkspace,
    opts: &DecodeOptions,
    problem: &DecodeProblem,
) -> Result<()> {
    const NOT_SCHEDULED: &str = "decode: this workspace has no scheduler (DecodeWorkspace::scheduled)";
    let g = cache.geometry();
    let scale = crate::launch::softmax_scale(opts.scale, g.head_dim)?; // 1/√Dqk by default
    let sched = &workspace.scheduler.as_ref().ok_or_else(|| Error::usage(NOT_SCHEDULED))?.table;
    let partial_cap = sched.partial_cap;
    let table = sched.view()?;
    let mut partial_o = workspace.partial_o.view(partial_cap * problem.heads_q * g.head_dim_v)?;
    let mut partial_lse = workspace.partial_lse.view(partial_cap * problem.heads_q)?;

    let mut launch = Launch::new(*stream);
    let partials = (partial_cap > 0).then_some((&mut partial_o, &mut partial_lse));
    let base = common_params(&mut launch, q, cache, o, lse, partials, problem, opts, scale)?;
    let table_ptr = launch.input(c"schedule", &table, 4)? as *const i32;
    let params = sched.params(base, table_ptr)?;
    launch.run("paged_decode", params, sys::fa_decode)
}

/// What a CUDA graph captured from a scheduled [`decode`] of these arguments does when replayed: the launch
/// over the workspace's current table (prepared for any batch within its limits) with no check of the
/// table against the call. For tests of the kernels' bounds on the emulator (tests/it/safety.rs).
#[cfg(feature = "testkit")]
#[doc(hidden)]
pub fn replay_scheduled<T: Element, C: KvCacheOf<T>>(
    stream: &Stream<'_>,
    q: &TensorView<'_, T, 3>,
    cache: &PagedKvCache<'_, C>,
    o: &mut TensorViewMut<'_, T, 3>,
    lse: Option<&mut TensorViewMut<'_, f32, 2>>,
    workspace: &mut DecodeWorkspace,
    opts: &DecodeOptions,
) -> Result<()> {
    let problem = check_decode_args(q, cache, o, lse.as_deref())?.windowed(opts.score_mod.window_left());
    if workspace.scheduler.is_none() {
        return Err(Error::usage("replay_scheduled: the workspace is not scheduled"));
    }
    launch_scheduled(stream, q, cache, o, lse, workspace, opts, &problem)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 46 (S2): a workspace buffer's views are bounded by its stored length, on every backend: a view
    /// past it is `OutOfBounds` naming the workspace, never a slice panic (host), a cudarc panic or a raw
    /// view past the caller's memory. (Before the bound, the host buffer's `v[..len]` panicked.)
    #[test]
    fn workspace_views_are_bounded_by_their_stored_length() {
        let emu = crate::Emulator::new();
        let mut buf: Buffer = Buffer::new(&Stream::Emu(&emu), 8, ON_RAW_STREAM).unwrap();
        assert_eq!(buf.view(8).unwrap().shape(), [8]);
        assert_eq!(buf.input(8).unwrap().shape(), [8]);
        for r in [buf.view(9).err(), buf.input(9).err()] {
            let e = r.expect("a view past the buffer is an error");
            assert_eq!(e.kind(), &ErrorKind::OutOfBounds);
            assert!(e.message().starts_with("workspace:"), "{}", e.message());
        }
        // A raw buffer: the view is the caller's memory only up to the length it declared.
        let mut raw: Buffer = Buffer::Device { ptr: 1 << 20, len: 8 };
        assert_eq!(raw.view(9).err().map(|e| e.kind().clone()), Some(ErrorKind::OutOfBounds));
        assert_eq!(raw.input(9).err().map(|e| e.kind().clone()), Some(ErrorKind::OutOfBounds));
    }

    /// Issue 46 (S4): a workspace in the caller's memory is bound to its raw stream: a launch on another raw
    /// stream, a cudarc stream or the emulator is `Usage` (two raw streams sharing it would race on its
    /// partials). The handles are only compared, never used, so fake ones serve.
    #[test]
    fn raw_workspaces_are_bound_to_their_stream() {
        let fake = |s: usize| RawStream::from_raw_parts_for_tests(s as _, 0x10 as _);
        let plan = DecodePlan::new(
            &DecodeProblem { batch: 1, heads_q: 8, heads_kv: 1, head_dim: 64, max_seq_len: 64 },
            132,
            None,
        )
        .unwrap();
        // SAFETY: nothing is launched; the workspace is only checked against streams.
        let ws = unsafe { DecodeWorkspace::from_device_ptrs(fake(0x100), (1 << 20, 0), (1 << 21, 0), &plan, 132) };
        let ws = ws.unwrap();
        assert!(ws.check_stream(&Stream::Raw(fake(0x100))).is_ok());
        let emu = crate::Emulator::new();
        for other in [Stream::Raw(fake(0x200)), Stream::Emu(&emu)] {
            let e = ws.check_stream(&other).unwrap_err();
            assert_eq!(e.kind(), &ErrorKind::Usage);
            assert!(e.message().starts_with("workspace:"), "{}", e.message());
        }
        // cudarc and emulator workspaces order themselves (events, or synchronous launches).
        assert!(DecodeWorkspace::new(&Stream::Emu(&emu), 0, 0).unwrap().check_stream(&Stream::Raw(fake(1))).is_ok());
    }
}
