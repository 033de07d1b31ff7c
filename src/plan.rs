//! Host-side policy for the paged decode kernel: how many KV splits (flash-decoding) a batch gets, how long
//! each split is, the grid and the size of the split workspace. Pure functions of the problem shape and the
//! SM count, so a given (problem, device, options) always yields the same plan, and a fixed plan gives
//! bitwise-reproducible results (the kernels' summation orders are fixed).
//!
//! The kernel's side of the contract (kernels/include/fa/decode/traits.cuh): a CTA serves one sequence, one
//! KV head, up to [`DecodeProblem::rows_per_cta`] of its query heads and one split; `split_tokens` is a multiple of
//! [`SPLIT_GRANULE`]; split `s` covers tokens `[s * split_tokens, (s + 1) * split_tokens)` and the last split
//! runs to the sequence's end.

use crate::error::{Error, Result};

/// `split_tokens` must be a multiple of this (abi.h's `FA_SPLIT_GRANULE`: every head dim's KV tile divides it).
pub const SPLIT_GRANULE: usize = crate::sys::FA_SPLIT_GRANULE as usize;
/// Rows of one decode row group: the M = 16 rows of the tensor-core tile. A CTA serves 1, 2, 4 or 8 groups
/// ([`decode_rows_per_cta`]).
pub const ROWS_PER_CTA: usize = crate::sys::FA_DECODE_ROWS as usize;

/// Packed query rows one decode CTA serves when each (sequence, KV head) has `rows` of them (decode: the
/// group G; short queries: q_len · G): the fewest 16-row groups that hold them, rounded up to a power of two,
/// at most the width's `block_m` (128 at width 64, 64 at 128, 16 above: the warp slots the kernel can give
/// row groups, kernels/include/fa/decode/traits.cuh; past the policy's `narrow_rows`, 64 and 32, the launch
/// runs wide CTAs of 8 warps). Every K/V byte a CTA stages serves all its rows, so a KV head is read
/// `ceil(rows / rows_per_cta)` times: once up to G = 128 at D <= 64 (Falcon-7B's 71:1), once up to G = 64 at
/// D <= 128 (MQA 64:1; issue 30, item 4).
pub fn decode_rows_per_cta(head_dim: usize, rows: usize) -> usize {
    let most = crate::tile::decode_tile_or_widest(head_dim).map_or(ROWS_PER_CTA, |t| t.block_m.max(ROWS_PER_CTA));
    // (Groups capped before rounding up: no overflow for any `rows`.)
    let groups = rows.max(1).div_ceil(ROWS_PER_CTA).min(most / ROWS_PER_CTA);
    (groups.next_power_of_two() * ROWS_PER_CTA).min(most)
}
/// The planner never splits below this many tokens per split: a split's fixed cost (pipeline fill, the
/// epilogue, 16 x D fp32 of partials written and merged) must stay small against its K/V traffic
/// (256 tokens x D = 128 x 2 x 2 bytes = 128 KiB per KV head).
pub const MIN_SPLIT_TOKENS: usize = 256;
/// Upper bound on planned (not forced) splits; FA2 uses the same cap.
pub const MAX_PLANNED_SPLITS: usize = 128;
/// Resident decode CTAs per SM the planner assumes (the kernel fits 3 on sm_90 / 2 on sm_80 by shared
/// memory; 2 is the conservative choice across targets). Only the wave arithmetic depends on it.
pub const CTAS_PER_SM: usize = 2;
/// A split count is good enough once its wave efficiency reaches this fraction of the best (FA2's rule:
/// fewer splits mean less partial traffic and a cheaper merge).
pub const WAVE_EFFICIENCY_SLACK: f64 = 0.85;
/// Hardware grid limit on gridDim.y / gridDim.z (and the kernel puts splits on x, capped likewise).
pub const MAX_GRID_YZ: usize = 65_535;

/// The shape of one decode launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeProblem {
    pub batch: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    /// The head dim, or with a V head dim of its own (a cache whose V pages are narrower or wider than its K
    /// pages, e.g. DeepSeek's 192 / 128) the wider of the two: the kernel's width, and what the split
    /// partials are sized by (the call writes `[.., Dv]` partials inside them).
    pub head_dim: usize,
    /// Upper bound on the sequence lengths the caller promises (seq_lens may live on the device).
    pub max_seq_len: usize,
}

impl DecodeProblem {
    /// The problem a sliding window of left bound `window_left` leaves: each query attends to at most
    /// `window_left + 1` tokens (the newest ones), so splits are planned over that span, not the context.
    /// `None` (no window) leaves the problem as it is.
    pub fn windowed(self, window_left: Option<usize>) -> Self {
        let span = window_left.map_or(self.max_seq_len, |w| self.max_seq_len.min(w.saturating_add(1)));
        Self { max_seq_len: span, ..self }
    }
    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.heads_q / self.heads_kv.max(1)
    }
    /// Query heads one CTA serves ([`decode_rows_per_cta`] of the group).
    pub fn rows_per_cta(&self) -> usize {
        decode_rows_per_cta(self.head_dim, self.group())
    }
    /// CTA row blocks per sequence: KV heads x blocks of [`Self::rows_per_cta`] query heads.
    /// (Saturating, as every count of a problem: absurd sizes are the plan's `Overflow`, never a panic.)
    pub fn head_blocks(&self) -> usize {
        self.heads_kv.saturating_mul(self.group().div_ceil(self.rows_per_cta()))
    }
    /// CTAs per split: sequences x [`Self::head_blocks`].
    pub fn ctas_per_split(&self) -> usize {
        self.batch.saturating_mul(self.head_blocks())
    }
}

/// The plan the decode launch follows: built once on the host, for a problem's limits, and reusable for any
/// call within them ([`DecodePlan::check_covers`]). A sequence's split geometry depends only on its own
/// length and `split_tokens`, so with one plan a sequence's result is bitwise the same whatever else is in
/// the batch, and a captured CUDA graph stays correct when seq_lens change within `problem.max_seq_len`.
///
/// A plan is a value the crate made ([`DecodePlan::new`], or returned by a call): its fields are read through
/// getters and cannot be set, so a plan pinned in a workspace is one the planner checked (docs/semantics.md,
/// "Safety"). A forged plan does not compile:
/// ```compile_fail,E0451
/// # use fused_attn::{DecodePlan, DecodeProblem};
/// let limits = DecodeProblem { batch: 1, heads_q: 8, heads_kv: 1, head_dim: 128, max_seq_len: 64 };
/// let plan = DecodePlan::new(&limits, 132, None).unwrap();
/// let forged = DecodePlan { num_splits: 8, split_tokens: 512, ..plan };
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodePlan {
    pub(crate) problem: DecodeProblem,
    pub(crate) num_splits: usize,
    pub(crate) split_tokens: usize,
    pub(crate) grid: [usize; 3],
    pub(crate) partial_o_len: usize,
    pub(crate) partial_lse_len: usize,
    /// A scheduled call's summary (its largest chunk count, the slot grid, the partials it used): a record,
    /// not a uniform plan, so no workspace pins it.
    pub(crate) summary: bool,
}

/// Read-only getters of a plan's fields (plans are values the crate made: no field is public).
macro_rules! plan_getters {
    ($ty:ty { $($(#[$doc:meta])* $field:ident: $t:ty),* $(,)? }) => {
        impl $ty {
            $(
                $(#[$doc])*
                pub fn $field(&self) -> $t {
                    self.$field
                }
            )*
        }
    };
}
pub(crate) use plan_getters;

plan_getters!(DecodePlan {
    /// The limits the plan was made for: largest batch, head counts, head dim, largest sequence length.
    problem: DecodeProblem,
    /// KV splits per sequence.
    num_splits: usize,
    /// Tokens per split (a multiple of [`SPLIT_GRANULE`]); meaningful only when `num_splits > 1`.
    split_tokens: usize,
    /// Grid of the decode kernel: (num_splits, Hkv * ceil(G / rows per CTA), B).
    grid: [usize; 3],
    /// fp32 elements of the split workspace's partial O [num_splits, B, Hq, D] (0 without splitting).
    partial_o_len: usize,
    /// fp32 elements of the split workspace's partial LSE [num_splits, B, Hq] (0 without splitting).
    partial_lse_len: usize,
});

impl DecodePlan {
    /// Whether this is the summary a scheduled call returns (not a plan a workspace can pin).
    pub fn is_schedule_summary(&self) -> bool {
        self.summary
    }
    /// `Usage` for a schedule summary: only uniform plans are pinned.
    pub(crate) fn check_pinnable(&self) -> Result<()> {
        if self.summary {
            return Err(Error::usage(
                "plan: the summary a scheduled call returns is not a uniform plan (use DecodePlan::new, or \
                 DecodeWorkspace::scheduled)",
            ));
        }
        Ok(())
    }
}

/// Fraction of the SM slots a grid of `ctas` keeps busy over its waves: ctas / (waves * slots).
pub fn wave_efficiency(ctas: usize, slots: usize) -> f64 {
    if ctas == 0 || slots == 0 {
        return 0.0;
    }
    ctas as f64 / ctas.div_ceil(slots).saturating_mul(slots) as f64
}

/// The planner's split count for a problem on `sm_count` SMs (no forcing):
///  - no split when one split already fills the GPU (ctas >= slots) or the context is short
///    (max_seq_len < 2 * MIN_SPLIT_TOKENS);
///  - otherwise the smallest count, at most min(MAX_PLANNED_SPLITS, max_seq_len / MIN_SPLIT_TOKENS), whose
///    wave efficiency is within WAVE_EFFICIENCY_SLACK of the best such count.
pub fn planned_splits(problem: &DecodeProblem, sm_count: usize) -> usize {
    let ctas = problem.ctas_per_split();
    // Wide CTAs (8 warps, more rows than a narrow CTA serves) hold one per SM (their register share).
    let per_sm = crate::tile::decode_tile_or_widest(problem.head_dim)
        .map_or(CTAS_PER_SM, |t| CTAS_PER_SM.min(t.ctas_per_sm_by_registers(problem.rows_per_cta())));
    let slots = sm_count.max(1).saturating_mul(per_sm);
    let max_splits = (problem.max_seq_len / MIN_SPLIT_TOKENS).min(MAX_PLANNED_SPLITS);
    if ctas == 0 || ctas >= slots || max_splits < 2 {
        return 1;
    }
    let eff = |s: usize| wave_efficiency(ctas.saturating_mul(s), slots);
    let best = (1..=max_splits).map(eff).fold(0.0, f64::max);
    (1..=max_splits).find(|&s| eff(s) >= WAVE_EFFICIENCY_SLACK * best).unwrap_or(1)
}

impl DecodePlan {
    /// Plans a launch. `forced_splits`: use exactly this many splits (some may be empty when the context is
    /// short: they produce empty partials the merge ignores); `None`: [`planned_splits`], after which the
    /// count is normalised to ceil(max_seq_len / split_tokens) so that no planned split is empty.
    pub fn new(problem: &DecodeProblem, sm_count: usize, forced_splits: Option<usize>) -> Result<Self> {
        let requested = match forced_splits {
            Some(0) => return Err(Error::shape("num_splits", "must be at least 1")),
            Some(s) => s,
            None => planned_splits(problem, sm_count),
        };
        let (num_splits, split_tokens) = if requested == 1 {
            (1, 0)
        } else {
            let per_split = problem
                .max_seq_len
                .div_ceil(requested)
                .checked_next_multiple_of(SPLIT_GRANULE)
                .ok_or_else(|| Error::overflow("max_seq_len", format!("{} tokens", problem.max_seq_len)))?
                .max(SPLIT_GRANULE);
            let n = if forced_splits.is_some() { requested } else { problem.max_seq_len.div_ceil(per_split).max(1) };
            (n, if n == 1 { 0 } else { per_split })
        };
        if split_tokens > i32::MAX as usize {
            return Err(Error::overflow("max_seq_len", format!("split of {split_tokens} tokens does not fit in i32")));
        }
        let grid_y = problem.head_blocks();
        for (what, v) in [("num_splits", num_splits), ("heads_kv x row blocks", grid_y), ("batch", problem.batch)] {
            if v > MAX_GRID_YZ {
                return Err(Error::overflow(what, format!("{v} exceeds the grid limit {MAX_GRID_YZ}")));
            }
        }
        let rows = problem
            .batch
            .checked_mul(problem.heads_q)
            .ok_or_else(|| Error::overflow("workspace", "batch x heads_q overflows"))?;
        let (partial_o_len, partial_lse_len) = if num_splits > 1 {
            let lse = num_splits
                .checked_mul(rows)
                .ok_or_else(|| Error::overflow("workspace", "partial LSE size overflows"))?;
            let o = lse
                .checked_mul(problem.head_dim)
                .ok_or_else(|| Error::overflow("workspace", "partial O size overflows"))?;
            (o, lse)
        } else {
            (0, 0)
        };
        Ok(DecodePlan {
            problem: *problem,
            num_splits,
            split_tokens,
            grid: [num_splits, grid_y, problem.batch],
            partial_o_len,
            partial_lse_len,
            summary: false,
        })
    }

    /// Whether a call of shape `call` can run under this plan: same heads and head dim, batch and
    /// max_seq_len within the plan's. Errors name what does not fit.
    pub fn check_covers(&self, call: &DecodeProblem) -> Result<()> {
        let p = &self.problem;
        if (call.heads_q, call.heads_kv, call.head_dim) != (p.heads_q, p.heads_kv, p.head_dim) {
            return Err(Error::shape(
                "plan",
                format!(
                    "made for Hq {} / Hkv {} / D {}, the call has Hq {} / Hkv {} / D {}",
                    p.heads_q, p.heads_kv, p.head_dim, call.heads_q, call.heads_kv, call.head_dim
                ),
            ));
        }
        if call.batch > p.batch {
            return Err(Error::shape("plan", format!("made for batch <= {}, the call has {}", p.batch, call.batch)));
        }
        if call.max_seq_len > p.max_seq_len {
            return Err(Error::shape(
                "plan",
                format!("made for max_seq_len <= {}, the cache promises {}", p.max_seq_len, call.max_seq_len),
            ));
        }
        Ok(())
    }

    /// Token range `[begin, end)` split `s` covers for a sequence of `seq_len` tokens: the kernel's rule,
    /// mirrored for tests and tools.
    pub fn split_range(&self, s: usize, seq_len: usize) -> (usize, usize) {
        self.split_range_windowed(s, seq_len, None)
    }

    /// [`split_range`](Self::split_range) under a sliding window of left bound `window_left`: the splits
    /// are laid out from the window's first token, `max(0, seq_len − 1 − window_left)`.
    pub fn split_range_windowed(&self, s: usize, seq_len: usize, window_left: Option<usize>) -> (usize, usize) {
        let start = window_left.map_or(0, |w| seq_len.saturating_sub(1).saturating_sub(w));
        if self.num_splits == 1 {
            return (start, seq_len);
        }
        let begin = (start + s * self.split_tokens).min(seq_len);
        let end = if s == self.num_splits - 1 { seq_len } else { (begin + self.split_tokens).min(seq_len) };
        (begin, end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(batch: usize, heads_q: usize, heads_kv: usize, max_seq_len: usize) -> DecodeProblem {
        DecodeProblem { batch, heads_q, heads_kv, head_dim: 128, max_seq_len }
    }

    #[test]
    fn full_gpu_is_not_split() {
        // B=64, Hkv=8: 512 CTAs fill 132 SMs x 2 slots: one split (the 85%-of-copy-bandwidth shape).
        let p = DecodePlan::new(&problem(64, 32, 8, 4096), 132, None).unwrap();
        assert_eq!(p.num_splits, 1);
        assert_eq!(p.grid, [1, 8, 64]);
        assert_eq!((p.partial_o_len, p.partial_lse_len), (0, 0));
    }

    #[test]
    fn single_long_sequence_is_split_to_fill_the_gpu() {
        // B=1, Hkv=8, 32k context on 132 SMs: 8 CTAs per split, 264 slots.
        let p = DecodePlan::new(&problem(1, 32, 8, 32768), 132, None).unwrap();
        assert!(p.num_splits >= 28 && p.num_splits <= 33, "{p:?}");
        assert_eq!(p.split_tokens % SPLIT_GRANULE, 0);
        assert!(p.num_splits * p.split_tokens >= 32768);
        assert!((p.num_splits - 1) * p.split_tokens < 32768, "no empty planned split: {p:?}");
        assert!(wave_efficiency(8 * p.num_splits, 264) >= 0.85);
        assert_eq!(p.partial_lse_len, p.num_splits * 32);
        assert_eq!(p.partial_o_len, p.num_splits * 32 * 128);
    }

    #[test]
    fn short_contexts_are_not_split() {
        for len in [0, 1, 100, 511] {
            assert_eq!(DecodePlan::new(&problem(1, 8, 1, len), 132, None).unwrap().num_splits, 1, "len {len}");
        }
        // 512 tokens may split in two (each >= MIN_SPLIT_TOKENS).
        assert!(DecodePlan::new(&problem(1, 8, 1, 512), 132, None).unwrap().num_splits <= 2);
    }

    #[test]
    fn splits_respect_the_minimum_length_and_the_cap() {
        for len in [600, 1000, 4097, 100_000, 1 << 20] {
            let p = DecodePlan::new(&problem(1, 8, 1, len), 132, None).unwrap();
            assert!(p.num_splits <= MAX_PLANNED_SPLITS);
            if p.num_splits > 1 {
                assert!(p.split_tokens >= MIN_SPLIT_TOKENS - SPLIT_GRANULE, "{len}: {p:?}");
                assert!((p.num_splits - 1) * p.split_tokens < len);
            }
        }
    }

    #[test]
    fn forced_splits_are_exact_even_when_some_are_empty() {
        let p = DecodePlan::new(&problem(2, 8, 2, 15), 132, Some(7)).unwrap();
        assert_eq!(p.num_splits, 7);
        assert_eq!(p.split_tokens, SPLIT_GRANULE);
        assert_eq!(p.split_range(0, 15), (0, 15));
        assert_eq!(p.split_range(3, 15), (15, 15));
        assert_eq!(p.split_range(6, 15), (15, 15));
        let p = DecodePlan::new(&problem(2, 8, 2, 1000), 132, Some(2)).unwrap();
        assert_eq!((p.num_splits, p.split_tokens), (2, 512));
        // The last split runs to the end even past the promised maximum.
        assert_eq!(p.split_range(1, 1200), (512, 1200));
        assert_eq!(DecodePlan::new(&problem(2, 8, 2, 1000), 132, Some(1)).unwrap().num_splits, 1);
        assert_eq!(DecodePlan::new(&problem(2, 8, 2, 0), 132, Some(2)).unwrap().split_tokens, SPLIT_GRANULE);
        let e = DecodePlan::new(&problem(2, 8, 2, 1000), 132, Some(0)).unwrap_err();
        assert_eq!(e.kind(), &crate::ErrorKind::Shape);
    }

    #[test]
    fn split_ranges_tile_the_sequence() {
        for (len, forced) in [(4097, Some(7)), (4097, None), (32768, None), (17, Some(2)), (100_000, Some(3))] {
            let p = DecodePlan::new(&problem(1, 4, 1, len), 132, forced).unwrap();
            let mut next = 0;
            for s in 0..p.num_splits {
                let (b, e) = p.split_range(s, len);
                assert_eq!(b, next.min(len));
                assert!(e >= b);
                next = e;
            }
            assert_eq!(next, len);
        }
    }

    #[test]
    fn plans_are_deterministic_and_grid_counts_head_blocks() {
        let a = DecodePlan::new(&problem(3, 64, 2, 9000), 108, None).unwrap();
        let b = DecodePlan::new(&problem(3, 64, 2, 9000), 108, None).unwrap();
        assert_eq!(a, b);
        // G = 32 query heads per KV head at width 128: one CTA of two 16-row groups per KV head.
        assert_eq!(a.grid[1], 2);
        assert_eq!(problem(3, 64, 2, 9000).ctas_per_split(), 6);
        // At width 256 (one row group per CTA): two CTAs of 16 rows per KV head.
        let d256 = DecodeProblem { head_dim: 256, ..problem(3, 64, 2, 9000) };
        assert_eq!((d256.rows_per_cta(), d256.ctas_per_split()), (16, 12));
        // Rows per CTA: the fewest 16-row groups, a power of two, at most the width's (128, 64, 16, 16: wide
        // CTAs past 64 and 32).
        let rows = |d, g| decode_rows_per_cta(d, g);
        assert_eq!([1, 16, 17, 33, 48, 64, 65, 200].map(|g| rows(64, g)), [16, 16, 32, 64, 64, 64, 128, 128]);
        assert_eq!([1, 16, 17, 32, 33, 64, 65].map(|g| rows(128, g)), [16, 16, 32, 32, 64, 64, 64]);
        assert_eq!([rows(256, 64), rows(512, 64), rows(40, 64), rows(72, 20)], [16, 16, 64, 32]);
        assert_eq!([rows(64, usize::MAX), rows(128, usize::MAX), rows(256, usize::MAX)], [128, 64, 16]);
        // MQA 64:1 at width 128: one wide CTA per sequence and split, and the planner counts one per SM.
        let mqa = DecodeProblem { heads_q: 64, heads_kv: 1, head_dim: 128, ..problem(4, 64, 1, 32_768) };
        assert_eq!((mqa.rows_per_cta(), mqa.ctas_per_split()), (64, 4));
        // 4 x 29 = 116 wide CTAs: 88 % of one wave of one per SM (the first count within the slack of the best).
        assert_eq!(planned_splits(&mqa, 132), 29);
    }

    #[test]
    fn grid_limits_are_overflow_errors() {
        let e = DecodePlan::new(&problem(70_000, 8, 1, 10), 132, None).unwrap_err();
        assert_eq!(e.kind(), &crate::ErrorKind::Overflow);
    }

    /// The workspace bound of docs/usage.md: for B <= 64, Hq = 32 (Hkv = 8), D = 128 and contexts up to 128k
    /// on 132 SMs, the largest planned workspace (num_splits * B * Hq * (D + 1) fp32) is at most 3.1 MiB.
    #[test]
    fn planned_workspace_worst_case_for_the_readme() {
        let mut worst = 0usize;
        for batch in 1..=64 {
            for ctx in (256..=131_072).step_by(256) {
                let p = DecodePlan::new(&problem(batch, 32, 8, ctx), 132, None).unwrap();
                worst = worst.max((p.partial_o_len + p.partial_lse_len) * 4);
            }
        }
        assert!(worst <= (3.1 * 1048576.0) as usize && worst > 3 * 1048576, "worst case {worst} bytes");
    }

    #[test]
    fn windows_plan_over_the_window() {
        // B = 1, 32k context, window 256: the window's 257 tokens are one split, not ~30.
        let full = problem(1, 32, 8, 32768);
        let w = full.windowed(Some(256));
        assert_eq!(w.max_seq_len, 257);
        assert_eq!(full.windowed(None), full);
        assert_eq!(problem(1, 32, 8, 100).windowed(Some(256)).max_seq_len, 100);
        let p = DecodePlan::new(&w, 132, None).unwrap();
        assert_eq!(p.num_splits, 1);
        assert_eq!(p.split_range_windowed(0, 32768, Some(256)), (32768 - 257, 32768));
        assert_eq!(p.split_range_windowed(0, 100, Some(256)), (0, 100));
        // Forced splits tile the window.
        let p = DecodePlan::new(&problem(1, 32, 8, 32768).windowed(Some(4095)), 132, Some(4)).unwrap();
        assert_eq!(p.split_tokens, 1024);
        assert_eq!(p.split_range_windowed(0, 10_000, Some(4095)), (5904, 6928));
        assert_eq!(p.split_range_windowed(3, 10_000, Some(4095)), (8976, 10_000));
    }

    #[test]
    fn wave_efficiency_examples() {
        assert_eq!(wave_efficiency(264, 264), 1.0);
        assert_eq!(wave_efficiency(265, 264), 265.0 / 528.0);
        assert_eq!(wave_efficiency(0, 264), 0.0);
    }
}
