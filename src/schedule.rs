//! Work-balanced scheduling of split-KV decode from the batch's real lengths (the FlashInfer-scheduler
//! class: plan on the host from `seq_lens`, run a fixed-size grid that reads the plan). Pure functions, unit
//! tested here; the kernel's side is `FaDecodeWork` in kernels/include/fa/abi.h and the scheduled loop of
//! kernels/decode.cu.
//!
//! The uniform plan ([`crate::plan::DecodePlan`]) splits every sequence alike, from `max_seq_len` and the
//! batch: one long sequence among short ones gets the short ones' split (none), and a plan pinned for a
//! large batch never splits a small one. A schedule instead cuts each sequence's attended span (its window,
//! if any) into chunks of its own and packs the units (sequence, KV-head row block, chunk) onto the GPU's
//! CTA slots:
//!  1. chunk size: [`SplitPolicy::Balanced`] tries no split and chunks of `total / (slots · f)` tokens for
//!     f = 1..=[`MAX_UNITS_PER_SLOT`] (each sequence then evens its chunks out, in [`SPLIT_GRANULE`]s), and
//!     keeps the one whose packing has the lightest heaviest CTA (merging costs [`MERGE_OVERHEAD_TOKENS`]);
//!     [`SplitPolicy::FixedSplitTokens`] cuts every sequence into chunks of exactly that size, so a
//!     sequence's units, and its bits, depend on nothing but its own length (batch invariance);
//!  2. packing: longest-processing-time first (units by decreasing cost onto the least loaded of `slots`
//!     CTAs, [`UNIT_OVERHEAD_TOKENS`] each), so the heaviest CTA is within one unit of the mean;
//!  3. only sequences cut in more than one chunk write partials and are merged.
//!
//! The kernel computes each unit's token range on the device from the sequence's `seq_len` (the window's
//! start, `split · split_tokens`, the last split running to the end), so a schedule made from lengths that
//! have since grown is still correct, only less balanced; and the launch geometry is fixed by the workspace's
//! capacity, so a CUDA graph captured once replays any schedule written into the same buffer.
//!
//! One scheduler serves both users of the decode kernel: decode (one query row per sequence,
//! [`schedule_decode`]) and paged prefill's streaming path (short queries, [`schedule_short_queries`]), whose
//! CTAs serve 16-128 packed (token, query head) rows (`ShortQueryShape::rows_per_cta`) of a sequence and KV head, each row block reading its own
//! key range (its first row's window start to its last row's causal end, [`short_query_key_range`]). Both
//! describe their sequences as [`SeqWork`] (rows, row blocks and the keys each reads) and share the cutting,
//! packing and encoding below.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::error::{Error, Result};
use crate::plan::{decode_rows_per_cta, DecodeProblem, MIN_SPLIT_TOKENS, SPLIT_GRANULE};
use crate::sys;
use crate::tile::{decode_tile_or_widest, TilePolicy};

/// A unit's fixed cost in tokens streamed: its pipeline fill (three tiles' latency before the first math),
/// the Q load and the epilogue. Only the packing's choices depend on it.
pub const UNIT_OVERHEAD_TOKENS: u64 = 32;
/// What merging costs, in tokens one CTA streams in the same time: the merge kernel's launch and its pass
/// over the partials (a few microseconds against ~40 ns per token and KV head at D = 128 per CTA slot).
pub const MERGE_OVERHEAD_TOKENS: u64 = 128;
/// The balanced policy's chunks are at least `total work / (slots · MAX_UNITS_PER_SLOT)` tokens: at most
/// about this many units per CTA (plus one tail per sequence), which bounds the workspace (see
/// [`partial_capacity`]).
pub const MAX_UNITS_PER_SLOT: usize = 4;

/// How a schedule cuts sequences into chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SplitPolicy {
    /// Chunk size chosen per call from the batch's work (the default).
    #[default]
    Balanced,
    /// Every sequence's span cut into chunks of exactly this many tokens (a multiple of [`SPLIT_GRANULE`])
    /// from its window's start, the last chunk running to the end: a sequence's result is bitwise the same
    /// whatever else is in the batch (FlashInfer's `fixed_split_size`).
    FixedSplitTokens(usize),
}

impl SplitPolicy {
    fn check(&self) -> Result<()> {
        match *self {
            SplitPolicy::FixedSplitTokens(t) if t == 0 || t % SPLIT_GRANULE != 0 || t > i32::MAX as usize => Err(
                Error::shape("split policy", format!("{t} tokens per split: a positive multiple of {SPLIT_GRANULE}")),
            ),
            _ => Ok(()),
        }
    }
}

/// Resident decode CTAs per SM on compute capability `(major, minor)` for a launch of `rows_per_cta` packed
/// rows per CTA ([`crate::plan::decode_rows_per_cta`]): the shared memory an SM can give blocks (228 KiB on
/// sm_90/sm_100, 164 KiB on sm_80/87, 100 KiB on sm_86/89/120) over the CTA's need (the launcher's
/// [`tile_policy`](crate::tile::tile_policy): Q, 4 stages of 16 KiB of K/V, the row-offset ring, the warp
/// slots' (m, l), the hole words) plus the 1 KiB the hardware reserves per block, at most what the register
/// cap is built for (3: 168 registers a thread, which fits three CTAs in any SM's 64 K registers, so
/// registers never bind first). So: 3 on sm_90/sm_100, 2 on sm_80, 1 on sm_86/89/120 (the uniform planner assumes 2
/// everywhere). Head dims 264-512 (width 512: Q and 2 stages of 32 KiB, 81 KiB; built for 2): 2 on sm_90/sm_100
/// and sm_80, 1 on sm_86/89/120. A wide launch (more rows than the policy's `narrow_rows`: 8 warps at the same
/// registers a thread) holds 1 CTA per SM: two would need 2 x 256 x 168 registers.
pub fn decode_ctas_per_sm(compute_capability: (u32, u32), head_dim: usize, rows_per_cta: usize) -> usize {
    // (No policy at all would be a launcher without decode kernels: one CTA per SM, the safe assumption.)
    decode_tile_or_widest(head_dim).map_or(1, |tile| ctas_per_sm_of(compute_capability, &tile, rows_per_cta))
}

/// [`decode_ctas_per_sm`] for a given decode `tile` policy (e.g. an FP8 cache's): shared memory over the
/// CTA's need, at most [`TilePolicy::ctas_per_sm_by_registers`].
pub fn ctas_per_sm_of(compute_capability: (u32, u32), tile: &TilePolicy, rows_per_cta: usize) -> usize {
    // The CUDA programming guide's shared memory per SM: 228 KiB on 9.0 and 10.x (H100/H200, B200/B300),
    // 164 KiB on 8.0 / 8.7, 100 KiB on 8.6 / 8.9 and 12.x (RTX 30/40/50, RTX PRO 6000, DGX Spark); an
    // unknown arch gets the smallest.
    let smem_per_sm = match compute_capability {
        (9, _) | (10, _) => 228 * 1024,
        (8, 0) | (8, 7) => 164 * 1024,
        _ => 100 * 1024,
    };
    (smem_per_sm / (tile.smem_bytes + 1024)).clamp(1, tile.ctas_per_sm_by_registers(rows_per_cta))
}

/// One schedule of the decode kernel (a decode, or a streaming paged prefill's short queries): which units
/// each CTA runs, which query rows are merged, and what each CTA is predicted to stream.
#[derive(Debug, Clone)]
pub struct DecodeSchedule {
    /// CTA slots the schedule was packed for (SMs × resident CTAs per SM).
    pub slots: usize,
    /// The CTAs that have work (≤ slots): CTA x runs `work[cta_indptr[x] .. cta_indptr[x + 1])`.
    pub cta_indptr: Vec<i32>,
    pub work: Vec<sys::FaDecodeWork>,
    /// One entry per query row of a sequence cut in more than one chunk (decode: per sequence), in row order.
    pub merge_rows: Vec<sys::FaMergeRow>,
    /// Partial states (rows of `[num_partials, Hq, D]` fp32) the split sequences write: `q_len · chunks`
    /// each.
    pub num_partials: usize,
    /// Per sequence: (chunks, tokens per chunk; 0 when unsplit).
    pub splits: Vec<(usize, usize)>,
    /// K/V tokens each CTA is predicted to stream (from the lengths planned for), per CTA.
    pub cta_tokens: Vec<u64>,
    /// The window's left bound the spans were clipped by.
    pub window_left: Option<usize>,
    /// The batch planned for.
    pub batch: usize,
}

impl DecodeSchedule {
    /// CTAs with work.
    pub fn num_ctas(&self) -> usize {
        self.cta_indptr.len().saturating_sub(1)
    }
    /// The heaviest CTA's predicted tokens.
    pub fn max_cta_tokens(&self) -> u64 {
        self.cta_tokens.iter().copied().max().unwrap_or(0)
    }
    /// The mean over CTAs with work.
    pub fn mean_cta_tokens(&self) -> f64 {
        self.cta_tokens.iter().sum::<u64>() as f64 / self.cta_tokens.len().max(1) as f64
    }
    /// Heaviest over mean (1 = perfect balance; 1 with no work).
    pub fn imbalance(&self) -> f64 {
        let mean = self.mean_cta_tokens();
        if mean == 0.0 {
            1.0
        } else {
            self.max_cta_tokens() as f64 / mean
        }
    }
    /// Total tokens over the GPU's slots times the heaviest CTA's: the fraction of the slots' time spent
    /// streaming (1 = every slot busy for the whole launch).
    pub fn slot_efficiency(&self) -> f64 {
        let max = self.max_cta_tokens();
        if max == 0 {
            return 1.0;
        }
        self.cta_tokens.iter().sum::<u64>() as f64 / (self.slots as f64 * max as f64)
    }
    /// Largest chunk count of any sequence.
    pub fn max_splits(&self) -> usize {
        self.splits.iter().map(|s| s.0).max().unwrap_or(1)
    }
}

/// Tokens sequence `len` attends to under a window of left bound `window_left`: the kernel's
/// `[max(0, len − 1 − w), len)`.
pub fn attended_span(len: usize, window_left: Option<usize>) -> usize {
    window_left.map_or(len, |w| len.min(w.saturating_add(1)))
}

/// The most partial states a schedule for these limits can write: with the balanced policy at most
/// `MAX_UNITS_PER_SLOT · slots / head_blocks + batch` chunks in all (chunks are at least total / (slots · 4)
/// tokens, and each sequence adds at most one tail); with fixed splits, every sequence at `max_seq_len`.
pub fn partial_capacity(
    limits: &DecodeProblem,
    window_left: Option<usize>,
    slots: usize,
    policy: SplitPolicy,
) -> usize {
    let span = attended_span(limits.max_seq_len, window_left);
    let per_seq = match policy {
        SplitPolicy::Balanced => {
            // (Saturating: absurd limits give a capacity no allocation meets, an error there, never an overflow.)
            let bound = MAX_UNITS_PER_SLOT.saturating_mul(slots) / limits.head_blocks().max(1);
            return bound
                .saturating_add(limits.batch)
                .min(limits.batch.saturating_mul(span.div_ceil(MIN_SPLIT_TOKENS).max(1)));
        }
        SplitPolicy::FixedSplitTokens(t) => span.div_ceil(t.max(1)).max(1),
    };
    limits.batch.saturating_mul(per_seq)
}

/// The most units a schedule for these limits can hold: every chunk times the head blocks.
pub fn work_capacity(limits: &DecodeProblem, window_left: Option<usize>, slots: usize, policy: SplitPolicy) -> usize {
    partial_capacity(limits, window_left, slots, policy)
        .saturating_add(limits.batch)
        .saturating_mul(limits.head_blocks())
}

/// One sequence as a schedule sees it: the query rows whose states its chunks write and, per CTA row block
/// that has rows, the keys the block reads. Its chunks are laid over the widest block's keys (every block
/// of a sequence is cut alike, so a query row's states line up across its KV heads and row blocks), and
/// each unit costs the keys its own block reads in that chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqWork {
    /// The output row of its first query token (decode: the sequence; short queries: `cu_seqlens_q[b]`).
    pub first_row: usize,
    /// Query tokens: each writes one partial state per chunk when the sequence is cut (decode: 1).
    pub q_len: usize,
    /// (row block in the kernel's numbering, keys it reads), for the row blocks that have rows.
    pub blocks: Vec<(usize, usize)>,
}

impl SeqWork {
    /// The keys its chunks are laid over: the widest block's.
    pub fn span(&self) -> usize {
        self.blocks.iter().map(|b| b.1).max().unwrap_or(0)
    }
}

/// Row blocks (units per chunk) a short-query schedule within these limits has at most: `Hkv` per started
/// block of R packed rows (R = rows per CTA) of every sequence, `Hkv · min(B · row_blocks, ⌈TQ · G / R⌉ + B)` for `B`
/// sequences of `TQ` query tokens in all.
fn short_query_blocks(shape: &ShortQueryShape, batch: usize, total_q: usize) -> usize {
    let packed = (total_q * shape.group()).div_ceil(shape.rows_per_cta()) + batch;
    shape.heads_kv * packed.min(batch * shape.row_blocks())
}

/// The most partial states a short-query schedule within these limits (`batch` sequences, `total_q` query
/// tokens in all, keys at most `max_seq_len`) writes. A query token of a sequence cut in n writes n states.
/// Balanced: the chunk is at least the blocks' work over `MAX_UNITS_PER_SLOT · slots` and a sequence's
/// tokens are at most `R / Hq` of its blocks (R rows per CTA), so `Σ q_len · n ≤ R · MAX_UNITS_PER_SLOT · slots / Hq +
/// total_q` (and never more than `total_q · ⌈max_seq_len / MIN_SPLIT_TOKENS⌉`); fixed splits:
/// `total_q · ⌈max_seq_len / t⌉`.
pub fn short_query_partial_capacity(
    shape: &ShortQueryShape,
    total_q: usize,
    max_seq_len: usize,
    slots: usize,
    policy: SplitPolicy,
) -> usize {
    match policy {
        SplitPolicy::Balanced => {
            let bound = (shape.rows_per_cta() * MAX_UNITS_PER_SLOT * slots).div_ceil(shape.heads_q.max(1)) + total_q;
            bound.min(total_q * max_seq_len.div_ceil(MIN_SPLIT_TOKENS).max(1))
        }
        SplitPolicy::FixedSplitTokens(t) => total_q * max_seq_len.div_ceil(t.max(1)).max(1),
    }
}

/// The most units a short-query schedule within these limits holds: every block once per chunk
/// (balanced: at most `MAX_UNITS_PER_SLOT · slots` more than the blocks).
pub fn short_query_work_capacity(
    shape: &ShortQueryShape,
    batch: usize,
    total_q: usize,
    max_seq_len: usize,
    slots: usize,
    policy: SplitPolicy,
) -> usize {
    let blocks = short_query_blocks(shape, batch, total_q);
    match policy {
        SplitPolicy::Balanced => {
            (MAX_UNITS_PER_SLOT * slots + blocks).min(blocks * max_seq_len.div_ceil(MIN_SPLIT_TOKENS).max(1))
        }
        SplitPolicy::FixedSplitTokens(t) => blocks * max_seq_len.div_ceil(t.max(1)).max(1),
    }
}

/// Cuts of one candidate: per sequence (chunks, tokens per chunk).
fn cuts(spans: &[usize], chunk: Option<usize>, fixed: bool) -> Vec<(usize, usize)> {
    spans
        .iter()
        .map(|&span| match chunk {
            Some(c) if span > c => {
                if fixed {
                    return (span.div_ceil(c), c);
                }
                // Even chunks of whole granules, no empty one.
                let n = span.div_ceil(c);
                let per = span.div_ceil(n).next_multiple_of(SPLIT_GRANULE);
                let n = span.div_ceil(per);
                if n == 1 {
                    (1, 0)
                } else {
                    (n, per)
                }
            }
            _ => (1, 0),
        })
        .collect()
}

/// One unit before packing: (tokens, sequence, head block, split).
type Unit = (u64, usize, usize, usize);

/// Keys a block reading `keys` keys streams in chunk `s` of `(n, per)`: the kernel's range, laid from the
/// block's first key, the last chunk running to its end (an earlier block may leave a chunk empty).
fn chunk_keys(keys: usize, s: usize, (n, per): (usize, usize)) -> usize {
    if n == 1 {
        return keys;
    }
    let rest = keys.saturating_sub(s * per);
    if s == n - 1 {
        rest
    } else {
        rest.min(per)
    }
}

fn units_of(seqs: &[SeqWork], cuts: &[(usize, usize)]) -> Vec<Unit> {
    let mut units = Vec::new();
    for (b, (seq, &cut)) in seqs.iter().zip(cuts).enumerate() {
        for s in 0..cut.0 {
            for &(y, keys) in &seq.blocks {
                units.push((chunk_keys(keys, s, cut) as u64, b, y, s));
            }
        }
    }
    // Longest first; ties in (sequence, head block, split) order, so a schedule is a pure function.
    units.sort_by_key(|&(t, b, y, s)| (Reverse(t), b, s, y));
    units
}

/// Longest-processing-time packing of `units` (sorted) onto up to `slots` CTAs: per CTA its units and its
/// cost (tokens + UNIT_OVERHEAD_TOKENS each).
fn pack(units: &[Unit], slots: usize) -> Vec<(u64, Vec<usize>)> {
    let ctas = slots.min(units.len()).max(1);
    let mut bins: Vec<(u64, Vec<usize>)> = vec![(0, Vec::new()); ctas];
    let mut heap: BinaryHeap<Reverse<(u64, usize)>> = (0..ctas).map(|x| Reverse((0, x))).collect();
    for (i, u) in units.iter().enumerate() {
        let Reverse((load, x)) = heap.pop().expect("at least one CTA");
        let load = load + u.0 + UNIT_OVERHEAD_TOKENS;
        bins[x].0 = load;
        bins[x].1.push(i);
        heap.push(Reverse((load, x)));
    }
    bins
}

/// Schedules a decode of `problem`'s heads over sequences of `seq_lens` tokens (the host's copy of what
/// the launch's `seq_lens` hold; negative entries count as 0) on `slots` CTA slots.
pub fn schedule_decode(
    problem: &DecodeProblem,
    seq_lens: &[i32],
    window_left: Option<usize>,
    slots: usize,
    policy: SplitPolicy,
) -> Result<DecodeSchedule> {
    let blocks = problem.head_blocks();
    let seqs: Vec<SeqWork> = seq_lens
        .iter()
        .enumerate()
        .map(|(b, &l)| {
            let span = attended_span(l.max(0) as usize, window_left);
            SeqWork { first_row: b, q_len: 1, blocks: (0..blocks).map(|y| (y, span)).collect() }
        })
        .collect();
    schedule_work(&seqs, window_left, slots, policy)
}

/// The shape of a streaming paged prefill launch a schedule is made for (paged prefill's short queries on
/// the decode kernel).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShortQueryShape {
    pub heads_q: usize,
    pub heads_kv: usize,
    /// The head dim: its decode width sets the rows per CTA ([`Self::rows_per_cta`]).
    pub head_dim: usize,
    /// The launch's `max_seqlen_q`: the kernel numbers a sequence's row blocks by it (KV head h, block r
    /// of its packed rows is `h · ⌈max_seqlen_q · G / rows per CTA⌉ + r`), so a schedule is made for the value
    /// the launch passes.
    pub max_seqlen_q: usize,
    /// The sliding window `(left, right)` (−1 = unbounded), as [`crate::ScoreMod::window`].
    pub window: Option<(i32, i32)>,
    pub causal: bool,
}

impl ShortQueryShape {
    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.heads_q / self.heads_kv.max(1)
    }
    /// Packed rows per CTA of the launch: [`decode_rows_per_cta`] of `max_seqlen_q · G` (16, 32, 64 or 128).
    pub fn rows_per_cta(&self) -> usize {
        decode_rows_per_cta(self.head_dim, self.max_seqlen_q.saturating_mul(self.group()))
    }
    /// Row blocks per KV head the kernel numbers: `⌈max_seqlen_q · G / rows per CTA⌉`.
    pub fn row_blocks(&self) -> usize {
        (self.max_seqlen_q * self.group()).div_ceil(self.rows_per_cta()).max(1)
    }
    fn window_left(&self) -> Option<i64> {
        self.window.and_then(|(l, _)| (l >= 0).then_some(i64::from(l)))
    }
    /// How far right of its own position a row sees (the kernel's `right_bound`): 0 with causal, else the
    /// window's right bound, else unbounded.
    fn right_bound(&self) -> i64 {
        match self.window {
            _ if self.causal => 0,
            Some((_, r)) if r >= 0 => i64::from(r),
            _ => i64::from(i32::MAX),
        }
    }
}

/// The keys `[begin, end)` the streaming kernel's CTA reads for row block `block` (of the sequence's
/// `⌈q_len · G / R⌉`, R the rows per CTA) of a sequence with `q_len` new tokens and `seq_len` cached ones: from its first
/// row's window start to its last row's causal end (kernels/decode.cu, `decode_unit`: `window_begin`,
/// `span_end`), clipped to `[0, seq_len)`. `None` for a block past the sequence's rows.
pub fn short_query_key_range(
    shape: &ShortQueryShape,
    q_len: usize,
    seq_len: usize,
    block: usize,
) -> Option<(usize, usize)> {
    let group = shape.group().max(1);
    let packed0 = block * shape.rows_per_cta();
    let packed = q_len * group;
    if packed0 >= packed {
        return None;
    }
    let rows = (packed - packed0).min(shape.rows_per_cta());
    let pos_base = seq_len as i64 - q_len as i64;
    let first_pos = pos_base + (packed0 / group) as i64;
    let last_pos = pos_base + ((packed0 + rows - 1) / group) as i64;
    let begin = shape.window_left().map_or(0, |w| (first_pos - w).max(0));
    let end = (last_pos + shape.right_bound() + 1).clamp(0, seq_len as i64);
    Some((begin.min(end) as usize, end as usize))
}

/// Keys unit `w` of a short-query schedule reads, for a sequence of `q_len` new tokens and `seq_len` cached
/// ones: its row block's key range cut as the kernel cuts it (0 for a block past the sequence's rows, or a
/// chunk an earlier row block leaves empty).
pub fn short_query_unit_keys(shape: &ShortQueryShape, q_len: usize, seq_len: usize, w: &sys::FaDecodeWork) -> usize {
    let block = w.head_block.max(0) as usize % shape.row_blocks();
    let cut = (w.num_splits.max(1) as usize, w.split_tokens.max(0) as usize);
    short_query_key_range(shape, q_len, seq_len, block)
        .map_or(0, |(begin, end)| chunk_keys(end - begin, w.split.max(0) as usize, cut))
}

/// Schedules a streaming paged prefill (short queries on the decode kernel) of sequences with the host's
/// copies of `cu_seqlens_q` (`[B + 1]`) and `seq_lens` (`[B]`; negative entries count as 0) on `slots` CTA
/// slots: units of (sequence, KV head × packed row block, chunk of the keys the block reads), the chunks
/// laid over the widest block's keys, one merge row per query token of a cut sequence. Errors (`Shape`):
/// lengths that disagree, a `cu_seqlens_q` that decreases, a `q_len` past `shape.max_seqlen_q`.
pub fn schedule_short_queries(
    shape: &ShortQueryShape,
    cu_seqlens_q: &[i32],
    seq_lens: &[i32],
    slots: usize,
    policy: SplitPolicy,
) -> Result<DecodeSchedule> {
    if cu_seqlens_q.len() != seq_lens.len() + 1 {
        return Err(Error::shape(
            "cu_seqlens_q",
            format!("{} entries for {} sequences (B + 1 expected)", cu_seqlens_q.len(), seq_lens.len()),
        ));
    }
    let blocks = shape.row_blocks();
    let mut seqs = Vec::with_capacity(seq_lens.len());
    for (b, &len) in seq_lens.iter().enumerate() {
        let (start, stop) = (cu_seqlens_q[b], cu_seqlens_q[b + 1]);
        if start < 0 || stop < start || (stop - start) as usize > shape.max_seqlen_q {
            return Err(Error::shape(
                "cu_seqlens_q",
                format!(
                    "sequence {b}: rows {start}..{stop} (non-negative, non-decreasing, at most max_seqlen_q {})",
                    shape.max_seqlen_q
                ),
            ));
        }
        let q_len = (stop - start) as usize;
        let seq_len = len.max(0) as usize;
        let mut work = SeqWork { first_row: start as usize, q_len, blocks: Vec::new() };
        for h in 0..shape.heads_kv {
            for r in 0..blocks {
                if let Some((begin, end)) = short_query_key_range(shape, q_len, seq_len, r) {
                    work.blocks.push((h * blocks + r, end - begin));
                }
            }
        }
        seqs.push(work);
    }
    schedule_work(&seqs, shape.window_left().map(|w| w as usize), slots, policy)
}

/// The scheduler both [`schedule_decode`] and [`schedule_short_queries`] are: cuts each sequence's span
/// (by `policy`), packs the units onto `slots` CTAs, and lays out the split sequences' partial states (query
/// token i of a sequence cut in n: states `partial_base + i · n ..`, one merge row each).
pub fn schedule_work(
    seqs: &[SeqWork],
    window_left: Option<usize>,
    slots: usize,
    policy: SplitPolicy,
) -> Result<DecodeSchedule> {
    policy.check()?;
    let slots = slots.max(1);
    let spans: Vec<usize> = seqs.iter().map(SeqWork::span).collect();
    // The work the candidates divide: every block at its sequence's span (an upper bound on what the blocks
    // read, which bounds the units and states a candidate makes: see partial_capacity).
    let total: u64 = seqs.iter().zip(&spans).map(|(q, &s)| (s * q.blocks.len()) as u64).sum();
    let cut = match policy {
        SplitPolicy::FixedSplitTokens(t) => cuts(&spans, Some(t), true),
        SplitPolicy::Balanced => {
            let longest = spans.iter().copied().max().unwrap_or(0);
            let mut candidates: Vec<Option<usize>> = vec![None];
            for f in 1..=MAX_UNITS_PER_SLOT {
                let c =
                    (total.div_ceil((slots * f) as u64) as usize).next_multiple_of(SPLIT_GRANULE).max(MIN_SPLIT_TOKENS);
                if c < longest && !candidates.contains(&Some(c)) {
                    candidates.push(Some(c));
                }
            }
            let mut best: Option<(u64, Vec<(usize, usize)>)> = None;
            for c in candidates {
                let cut = cuts(&spans, c, false);
                let bins = pack(&units_of(seqs, &cut), slots);
                let merges = cut.iter().any(|&(n, _)| n > 1);
                let cost = bins.iter().map(|b| b.0).max().unwrap_or(0) + if merges { MERGE_OVERHEAD_TOKENS } else { 0 };
                if best.as_ref().is_none_or(|(c0, _)| cost < *c0) {
                    best = Some((cost, cut));
                }
            }
            best.map(|b| b.1).unwrap_or_default()
        }
    };
    let units = units_of(seqs, &cut);
    let bins = pack(&units, slots);

    let mut merge_rows = Vec::new();
    let mut base = vec![0usize; seqs.len()];
    let mut num_partials = 0usize;
    for (b, (seq, &(n, _))) in seqs.iter().zip(&cut).enumerate() {
        if n > 1 {
            base[b] = num_partials;
            for i in 0..seq.q_len {
                merge_rows.push(sys::FaMergeRow {
                    out_row: to_i32(seq.first_row + i)?,
                    first_state: to_i32(num_partials + i * n)?,
                    num_states: to_i32(n)?,
                });
            }
            num_partials += n * seq.q_len;
        }
    }
    let mut cta_indptr = vec![0i32];
    let mut work = Vec::with_capacity(units.len());
    let mut cta_tokens = Vec::with_capacity(bins.len());
    for (_, members) in bins.iter().filter(|b| !b.1.is_empty()) {
        let mut tokens = 0u64;
        for &i in members {
            let (t, b, y, s) = units[i];
            tokens += t;
            let (n, per) = cut[b];
            work.push(sys::FaDecodeWork {
                b: to_i32(b)?,
                head_block: to_i32(y)?,
                split: to_i32(s)?,
                num_splits: to_i32(n)?,
                split_tokens: to_i32(per)?,
                partial_base: to_i32(base[b])?,
            });
        }
        cta_indptr.push(to_i32(work.len())?);
        cta_tokens.push(tokens);
    }
    Ok(DecodeSchedule {
        slots,
        cta_indptr,
        work,
        merge_rows,
        num_partials,
        splits: cut,
        cta_tokens,
        window_left,
        batch: seqs.len(),
    })
}

/// The makespan, in tokens (with [`UNIT_OVERHEAD_TOKENS`] per CTA), of the uniform grid of `plan` over
/// these lengths on `slots` CTA slots, modelling the hardware's block dispatch: CTAs in launch order (split
/// fastest, then row block, then sequence), each onto the slot that frees first. The schedule's own
/// makespan is its heaviest CTA; the ratio of the two is the predicted speed-up.
pub fn uniform_makespan(
    plan: &crate::plan::DecodePlan,
    seq_lens: &[i32],
    window_left: Option<usize>,
    slots: usize,
) -> u64 {
    let blocks = plan.grid[1];
    let mut heap: BinaryHeap<Reverse<u64>> = (0..slots.max(1)).map(|_| Reverse(0)).collect();
    let mut makespan = 0;
    for &len in seq_lens {
        let len = len.max(0) as usize;
        for _ in 0..blocks {
            for s in 0..plan.num_splits {
                let (b, e) = plan.split_range_windowed(s, len, window_left);
                let Reverse(free) = heap.pop().expect("a slot");
                let done = free + (e - b) as u64 + UNIT_OVERHEAD_TOKENS;
                makespan = makespan.max(done);
                heap.push(Reverse(done));
            }
        }
    }
    makespan
}

/// The schedule's makespan in the same model: its heaviest CTA, [`UNIT_OVERHEAD_TOKENS`] per unit, plus
/// [`MERGE_OVERHEAD_TOKENS`] when it merges.
pub fn schedule_makespan(s: &DecodeSchedule) -> u64 {
    let mut per_cta = vec![0u64; s.num_ctas()];
    for (x, w) in s.cta_indptr.windows(2).enumerate() {
        per_cta[x] = s.cta_tokens[x] + (w[1] - w[0]) as u64 * UNIT_OVERHEAD_TOKENS;
    }
    per_cta.into_iter().max().unwrap_or(0) + if s.merge_rows.is_empty() { 0 } else { MERGE_OVERHEAD_TOKENS }
}

fn to_i32(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::overflow("schedule", format!("{v} does not fit in i32")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tile::{tile_policy, KernelOp};

    fn problem(batch: usize, hq: usize, hkv: usize, len: usize) -> DecodeProblem {
        DecodeProblem { batch, heads_q: hq, heads_kv: hkv, head_dim: 128, max_seq_len: len }
    }
    const H100_SLOTS: usize = 132 * 3;

    /// Every sequence's chunks tile its span exactly once per head block.
    fn check_covers(s: &DecodeSchedule, lens: &[i32], blocks: usize) {
        let mut seen = vec![vec![0usize; blocks]; lens.len()];
        for w in &s.work {
            let (n, per) = s.splits[w.b as usize];
            assert_eq!((w.num_splits as usize, w.split_tokens as usize), (n, per));
            seen[w.b as usize][w.head_block as usize] += 1;
        }
        assert!(seen.iter().enumerate().all(|(b, v)| v.iter().all(|&c| c == s.splits[b].0)), "{seen:?}");
        for (b, &(n, per)) in s.splits.iter().enumerate() {
            if n > 1 {
                let span = attended_span(lens[b] as usize, s.window_left);
                assert!((n - 1) * per < span && n * per >= span, "seq {b}: {n} x {per} for {span}");
            }
        }
        assert_eq!(s.num_partials, s.splits.iter().filter(|x| x.0 > 1).map(|x| x.0).sum::<usize>());
    }

    #[test]
    fn one_long_sequence_fills_the_slots() {
        let p = problem(1, 32, 8, 32768);
        let s = schedule_decode(&p, &[32768], None, H100_SLOTS, SplitPolicy::Balanced).unwrap();
        check_covers(&s, &[32768], 8);
        assert!(s.num_ctas() as f64 >= 0.9 * H100_SLOTS as f64, "{} CTAs", s.num_ctas());
        assert!(s.imbalance() <= 1.25 && s.slot_efficiency() >= 0.85, "{} {}", s.imbalance(), s.slot_efficiency());
    }

    #[test]
    fn skewed_batches_are_balanced() {
        let p = problem(64, 32, 8, 131072);
        let mut lens = vec![131072];
        lens.extend([1024; 63]);
        let s = schedule_decode(&p, &lens, None, H100_SLOTS, SplitPolicy::Balanced).unwrap();
        check_covers(&s, &lens, 8);
        assert!(s.imbalance() <= 1.25, "imbalance {}", s.imbalance());
        assert_eq!(s.num_ctas(), H100_SLOTS);
        // Only the long sequence was split, so only it is merged.
        assert_eq!(s.merge_rows.len(), 1);
        assert!(s.work.len() <= work_capacity(&p, None, H100_SLOTS, SplitPolicy::Balanced));
        assert!(s.num_partials <= partial_capacity(&p, None, H100_SLOTS, SplitPolicy::Balanced));
    }

    #[test]
    fn uniform_full_batches_are_cut_only_when_the_packing_gains() {
        let p = problem(64, 32, 8, 8192);
        let s = schedule_decode(&p, &[8192; 64], None, H100_SLOTS, SplitPolicy::Balanced).unwrap();
        check_covers(&s, &[8192; 64], 8);
        assert!(s.imbalance() <= 1.1 && s.slot_efficiency() >= 0.9, "{} {}", s.imbalance(), s.slot_efficiency());
        // Enough work per slot already, evenly divided: no split.
        let s = schedule_decode(&problem(132, 8, 3, 4096), &[4096; 132], None, 132, SplitPolicy::Balanced).unwrap();
        assert_eq!((s.max_splits(), s.merge_rows.len()), (1, 0));
    }

    #[test]
    fn fixed_split_size_depends_only_on_the_sequence() {
        let p = problem(4, 8, 2, 5000);
        let pol = SplitPolicy::FixedSplitTokens(512);
        let a = schedule_decode(&p, &[1500], Some(1000), 16, pol).unwrap();
        let b = schedule_decode(&p, &[700, 5000, 1500, 33], Some(1000), 16, pol).unwrap();
        assert_eq!(a.splits[0], b.splits[2]);
        assert_eq!(a.splits[0], (2, 512)); // window of 1001 tokens
        assert_eq!(b.splits[3], (1, 0));
        check_covers(&b, &[700, 5000, 1500, 33], 2);
        assert!(schedule_decode(&p, &[1], None, 16, SplitPolicy::FixedSplitTokens(100)).is_err());
    }

    #[test]
    fn empty_and_zero_length_batches() {
        let p = problem(3, 8, 1, 100);
        let s = schedule_decode(&p, &[0, 0, 5], None, 8, SplitPolicy::Balanced).unwrap();
        // Every sequence still gets its unit (a zero-length one writes o = 0, lse = −inf).
        assert_eq!(s.work.len(), 3);
        let s = schedule_decode(&p, &[], None, 8, SplitPolicy::Balanced).unwrap();
        assert_eq!((s.work.len(), s.num_ctas()), (0, 0));
    }

    #[test]
    fn occupancy_per_arch() {
        // Stages 64 KiB (Q overlays the last one), ring 1 KiB, (m, l) of 4 warp slots 512 B, hole words 20 B,
        // facts of 64 rows.
        assert_eq!(
            tile_policy(KernelOp::Decode, 128, false, None).unwrap().smem_bytes,
            65_536 + 1024 + 512 + 20 + 1032
        );
        assert_eq!(decode_ctas_per_sm((9, 0), 128, 16), 3);
        assert_eq!(decode_ctas_per_sm((8, 0), 128, 32), 2);
        assert_eq!(decode_ctas_per_sm((8, 9), 64, 64), 1);
        assert_eq!(decode_ctas_per_sm((8, 6), 256, 16), 1);
        // Wide CTAs (8 warps at the narrow CTA's registers a thread): one per SM everywhere.
        assert_eq!([(9, 0), (8, 0), (8, 6), (8, 9)].map(|cc| decode_ctas_per_sm(cc, 128, 64)), [1, 1, 1, 1]);
        assert_eq!([(9, 0), (8, 0)].map(|cc| decode_ctas_per_sm(cc, 64, 128)), [1, 1]);
        // D 264-512: 2 stages of 32 KiB + the Q tile (82,836 B), launch bounds for 2 CTAs.
        assert_eq!(tile_policy(KernelOp::Decode, 512, false, None).unwrap().smem_bytes, 82_836);
        assert_eq!([(9, 0), (8, 0), (8, 6), (8, 9)].map(|cc| decode_ctas_per_sm(cc, 264, 16)), [2, 2, 1, 1]);
        // Blackwell: 10.x has Hopper's 228 KiB an SM, 12.x Ada's 100 KiB (the sm_80 tile configs fit its 99 KiB
        // a block); an arch the table does not know gets the smallest.
        let blackwell = [(10, 0), (10, 3), (12, 0), (12, 1), (11, 0)];
        assert_eq!(blackwell.map(|cc| decode_ctas_per_sm(cc, 128, 16)), [3, 3, 1, 1, 1]);
        assert_eq!(blackwell.map(|cc| decode_ctas_per_sm(cc, 264, 16)), [2, 2, 1, 1, 1]);
    }

    fn shape(hq: usize, hkv: usize, max_q: usize, window: Option<(i32, i32)>, causal: bool) -> ShortQueryShape {
        // Width 256: 16 rows per CTA (the row-block arithmetic below counts in 16s).
        ShortQueryShape { heads_q: hq, heads_kv: hkv, head_dim: 256, max_seqlen_q: max_q, window, causal }
    }

    #[test]
    fn short_query_key_ranges_follow_the_kernel() {
        // One token per sequence: decode's span, window-clipped.
        let s = shape(8, 2, 1, Some((100, 0)), true);
        assert_eq!(short_query_key_range(&s, 1, 1000, 0), Some((899, 1000)));
        assert_eq!(short_query_key_range(&s, 1, 50, 0), Some((0, 50)));
        assert_eq!(short_query_key_range(&s, 1, 0, 0), Some((0, 0)));
        // q_len 4 at G = 8: two row blocks of 2 tokens each, each to its last row's causal end.
        let s = shape(16, 2, 4, None, true);
        assert_eq!(s.row_blocks(), 2);
        assert_eq!(short_query_key_range(&s, 4, 1000, 0), Some((0, 998)));
        assert_eq!(short_query_key_range(&s, 4, 1000, 1), Some((0, 1000)));
        assert_eq!(short_query_key_range(&s, 3, 1000, 1), Some((0, 1000)));
        assert_eq!(short_query_key_range(&s, 2, 1000, 1), None, "past the sequence's rows");
        // A window: from the first row's window start; bidirectional windows reach right, clipped at seq_len.
        let s = shape(16, 2, 4, Some((128, 3)), true);
        assert_eq!(short_query_key_range(&s, 4, 1000, 1), Some((998 - 128, 1000)));
        let s = shape(16, 2, 4, Some((128, 3)), false);
        assert_eq!(short_query_key_range(&s, 4, 1000, 0), Some((996 - 128, 1000)));
        assert_eq!(short_query_key_range(&s, 4, 10, 0), Some((0, 10)));
        // q_len > seq_len: rows before the cache's start see nothing.
        let s = shape(8, 1, 3, None, true);
        assert_eq!(short_query_key_range(&s, 3, 2, 0), Some((0, 1)));
        assert_eq!(short_query_key_range(&s, 3, 2, 1), Some((0, 2)));
        let s = shape(16, 1, 3, None, true);
        assert_eq!(short_query_key_range(&s, 3, 1, 0), Some((0, 0)));
    }

    /// Every (sequence, existing row block) is cut into its sequence's chunks once; each query token of a cut
    /// sequence has one merge row over its own run of states, the runs disjoint and within num_partials.
    fn check_short_covers(s: &DecodeSchedule, sh: &ShortQueryShape, cu: &[i32], lens: &[i32]) {
        let mut seen = std::collections::HashMap::new();
        for w in &s.work {
            assert_eq!((w.num_splits as usize, w.split_tokens as usize), s.splits[w.b as usize]);
            *seen.entry((w.b, w.head_block)).or_insert(0usize) += 1;
        }
        for (b, &len) in lens.iter().enumerate() {
            let q_len = (cu[b + 1] - cu[b]) as usize;
            for y in 0..sh.heads_kv * sh.row_blocks() {
                let exists = short_query_key_range(sh, q_len, len as usize, y % sh.row_blocks()).is_some();
                let want = if exists { s.splits[b].0 } else { 0 };
                assert_eq!(seen.get(&(b as i32, y as i32)).copied().unwrap_or(0), want, "seq {b} block {y}");
            }
        }
        let mut owner = vec![None; s.num_partials];
        for r in &s.merge_rows {
            for st in r.first_state..r.first_state + r.num_states {
                assert!(owner[st as usize].replace(r.out_row).is_none(), "state {st} shared");
            }
        }
        assert!(owner.iter().all(Option::is_some), "every state merged");
        let rows: usize =
            s.splits.iter().zip(cu.windows(2)).filter(|(c, _)| c.0 > 1).map(|(_, w)| (w[1] - w[0]) as usize).sum();
        assert_eq!(s.merge_rows.len(), rows);
    }

    #[test]
    fn short_queries_are_cut_per_sequence_and_merged_per_row() {
        let sh = shape(16, 2, 8, None, true);
        let cu = [0, 4, 6, 6, 14, 15];
        let lens = [9000, 300, 70, 2000, 3];
        for policy in [SplitPolicy::Balanced, SplitPolicy::FixedSplitTokens(512)] {
            let s = schedule_short_queries(&sh, &cu, &lens, 24, policy).unwrap();
            check_short_covers(&s, &sh, &cu, &lens);
            assert!(s.splits[0].0 > 1, "{policy:?}: the long sequence is cut: {:?}", s.splits);
            assert!(s.work.len() <= short_query_work_capacity(&sh, 5, 15, 9000, 24, policy));
            assert!(s.num_partials <= short_query_partial_capacity(&sh, 15, 9000, 24, policy));
            // Each unit's predicted keys are what it reads.
            let keys: u64 = s
                .work
                .iter()
                .map(|w| {
                    let b = w.b as usize;
                    short_query_unit_keys(&sh, (cu[b + 1] - cu[b]) as usize, lens[b] as usize, w) as u64
                })
                .sum();
            assert_eq!(keys, s.cta_tokens.iter().sum::<u64>());
        }
        // Errors: a q_len past max_seqlen_q, a decreasing cu_seqlens_q, a length mismatch.
        assert!(schedule_short_queries(&sh, &[0, 9], &[100], 8, SplitPolicy::Balanced).is_err());
        assert!(schedule_short_queries(&sh, &[0, 4, 3], &[100, 100], 8, SplitPolicy::Balanced).is_err());
        assert!(schedule_short_queries(&sh, &[0, 4], &[100, 100], 8, SplitPolicy::Balanced).is_err());
    }

    /// The capacity bounds hold over random batches, windows and slot counts (a workspace sized by them never
    /// refuses a call within its limits).
    #[test]
    fn short_query_capacities_bound_every_schedule() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for _ in 0..300 {
            let hkv = 1 + next(4) as usize;
            let g = [1, 2, 3, 4, 8, 16, 32][next(7) as usize];
            let max_q = 1 + next(12) as usize;
            let batch = 1 + next(12) as usize;
            let max_len = 1 + next(20_000) as usize;
            let slots = 1 + next(400) as usize;
            let window = match next(3) {
                0 => None,
                1 => Some((next(3000) as i32, -1)),
                _ => Some((next(500) as i32, next(20) as i32)),
            };
            let sh = shape(hkv * g, hkv, max_q, window, next(2) == 0);
            let mut cu = vec![0i32];
            let mut lens = Vec::new();
            for _ in 0..batch {
                cu.push(cu.last().unwrap() + next(max_q as u64 + 1) as i32);
                lens.push(next(max_len as u64 + 1) as i32);
            }
            let total_q = *cu.last().unwrap() as usize;
            for policy in [SplitPolicy::Balanced, SplitPolicy::FixedSplitTokens(64 * (1 + next(8) as usize))] {
                let s = schedule_short_queries(&sh, &cu, &lens, slots, policy).unwrap();
                check_short_covers(&s, &sh, &cu, &lens);
                let limits_shape = ShortQueryShape { window: None, causal: true, ..sh };
                let (pc, wc) = (
                    short_query_partial_capacity(&limits_shape, total_q, max_len, slots, policy),
                    short_query_work_capacity(&limits_shape, batch, total_q, max_len, slots, policy),
                );
                assert!(s.num_partials <= pc, "{sh:?} {cu:?} {lens:?} {policy:?}: {} > {pc}", s.num_partials);
                assert!(s.work.len() <= wc, "{sh:?} {cu:?} {lens:?} {policy:?}: {} > {wc}", s.work.len());
                assert!(s.num_ctas() <= slots);
            }
        }
    }
}
