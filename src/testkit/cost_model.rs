//! The cost models the kernels are designed to: for a case, the global bytes, mma instructions, exp2 calls
//! and barriers each kernel should issue. The emulator's counters ([`crate::counters`]) measure what the
//! kernel really did; tests/it/cost.rs asserts the two agree, so a kernel that reads the cache twice or visits
//! tiles the causal mask hides fails even when its answer is right.
//!
//! The models take the kernels' tiles from the launchers ([`tile_policy`](crate::tile::tile_policy), [`TileConfig`]) and their walk
//! from the host policy ([`kv_block_range`], [`DecodePlan`]); each formula says which design decision it
//! encodes.

use crate::counters::{KernelCounters, LaunchCounters};
use crate::mask::{kv_block_range, Window};
use crate::plan::DecodePlan;
use crate::prefill::{uses_variant_kernel, TileConfig};
use crate::testkit::cases::append::AppendCase;
use crate::testkit::cases::decode::DecodeCase;
use crate::testkit::cases::paged_prefill::PagedPrefillCase;
use crate::testkit::cases::prefill::PrefillCase;
use crate::tile::{decode_tile_or_widest, KernelOp, TilePolicy};

/// Multiply-accumulates of one `mma.m16n8k16`.
const MMA_MACS: u64 = 16 * 8 * 16;
/// Bytes per fp16/bf16 element.
const ELEM: u64 = 2;

/// What one prefill launch should cost (kernels/prefill.cu).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrefillCost {
    /// (query tile, head) × KV tile visits: tiles past the last key a query tile's last row sees are never
    /// visited (causal, a window's right bound), nor tiles before the first key its first row sees (a
    /// window's left bound); the ragged top tile is.
    pub kv_tiles: u64,
    /// Each visited tile is loaded once per (query tile, query head) — ⌈Tq/Br⌉ passes over K and V per query
    /// head — and only its rows below Tk (the ragged rows are zero-filled, not read).
    /// With a sliding window of w keys a query tile visits about (w + Br) / Bc tiles, not Tk / Bc.
    pub k_bytes_read: u64,
    pub v_bytes_read: u64,
    /// Q read exactly once (by the query tiles that see any key).
    pub q_bytes_read: u64,
    /// O written exactly once; LSE too when requested.
    pub o_bytes_written: u64,
    pub lse_bytes_written: u64,
    /// Q·Kᵀ and P·V of a Br × Bc tile over the kernel's tile width W ≥ D (the zero columns past D are
    /// multiplied too: fa/head_dim.cuh): 2·Br·Bc·W multiply-adds, 2048 per mma. Bytes are of D columns.
    pub mma: u64,
    /// One exp2 per score of a visited tile, plus one rescale factor per row per lane of its quad (4) per tile;
    /// a softcap adds one per score (its tanh); sinks add two per row per lane of its quad (the epilogue).
    pub exp2: u64,
    /// One barrier per visited tile with 3 K/V buffers, two with 2 (the refill waits for every reader).
    pub barriers: u64,
}

/// The prefill model of `case` (dense or varlen), or `None` if its head dim has no kernel.
pub fn prefill_cost(case: &PrefillCase) -> Option<PrefillCost> {
    let seqs: Vec<(usize, usize)> = match &case.varlen {
        Some(s) => s.clone(),
        None => vec![(case.seqlen_q, case.seqlen_k); case.batch],
    };
    // The plain or the _mod kernel (their tiles differ at d128), chosen as the launcher does: on seqlen_q /
    // seqlen_k (varlen: the maxima the call passes).
    let variant = uses_variant_kernel(&case.variants.set(), case.seqlen_q, case.seqlen_k);
    // Q and K bytes are of Dqk columns, V and O bytes of Dv (a V head dim of its own, issue 27); the mma are
    // of the kernel's width (>= both).
    let cfg = TileConfig::for_pair(case.head_dim, case.dv(), variant)?;
    let (br, bc, w) = (cfg.block_m, cfg.block_n, cfg.width as u64);
    let (d, dv) = (case.head_dim as u64, case.dv() as u64);
    let mut c = PrefillCost::default();
    let window = Window::new(case.variants.window, case.causal);
    let mut ctas = 0u64;
    for &(tq, tk) in &seqs {
        // The `_mod` kernels start a windowed sequence at its first visible key (no load of hidden keys).
        let tk = if variant { tk - window.hidden_prefix(tq, tk) } else { tk };
        for m0 in (0..tq).step_by(br) {
            let rows = (tq - m0).min(br) as u64;
            let range = kv_block_range(m0, br, bc, tq, tk, window);
            ctas += 1;
            c.o_bytes_written += rows * dv * ELEM;
            if case.with_lse {
                c.lse_bytes_written += rows * 4;
            }
            if range.n_end == range.n_begin {
                continue; // no row sees a key: nothing is loaded, O = 0 is stored
            }
            let keys = ((range.n_end * bc).min(tk) - range.n_begin * bc) as u64;
            c.kv_tiles += (range.n_end - range.n_begin) as u64;
            c.q_bytes_read += rows * d * ELEM;
            c.k_bytes_read += keys * d * ELEM;
            c.v_bytes_read += keys * dv * ELEM;
        }
    }
    let heads = case.heads_q as u64;
    for x in [
        &mut c.kv_tiles,
        &mut c.k_bytes_read,
        &mut c.v_bytes_read,
        &mut c.q_bytes_read,
        &mut c.o_bytes_written,
        &mut c.lse_bytes_written,
    ] {
        *x *= heads;
    }
    let (br, bc) = (br as u64, bc as u64);
    c.mma = c.kv_tiles * 2 * br * bc * w / MMA_MACS;
    let softcap = u64::from(case.variants.softcap.is_some());
    c.exp2 = c.kv_tiles * br * (bc + 4 + softcap * bc);
    if case.variants.sinks {
        c.exp2 += ctas * heads * 8 * br; // 128 threads x Br/32 rows each x 2
    }
    c.barriers = c.kv_tiles * if cfg.stages == 2 { 2 } else { 1 };
    Some(c)
}

impl PrefillCost {
    /// measured / model for each modelled quantity of a `prefill` kernel's counters (1.0 = as designed;
    /// a model of 0 gives 1.0 when nothing was measured either, else infinity).
    pub fn ratios(&self, k: &KernelCounters) -> Vec<(&'static str, f64)> {
        vec![
            ("k_read", ratio(k.read_of("k"), self.k_bytes_read)),
            ("v_read", ratio(k.read_of("v"), self.v_bytes_read)),
            ("q_read", ratio(k.read_of("q"), self.q_bytes_read)),
            ("o_written", ratio(k.written_of("o"), self.o_bytes_written)),
            ("mma", ratio(k.mma, self.mma)),
            ("exp2", ratio(k.exp2, self.exp2)),
            ("barriers", ratio(k.barriers, self.barriers)),
        ]
    }
}

/// The decode kernel's tile for a head dim (the launcher's [`tile_policy`](crate::tile::tile_policy); the widest kernel's for a head
/// dim no kernel takes, whose call fails anyway).
/// A test-harness precondition: the host library has decode kernels.
fn decode_tile(head_dim: usize) -> TilePolicy {
    decode_tile_or_widest(head_dim).expect("the host library has decode kernels")
}

/// The decode kernel's KV tile (tokens) for a head dim: 16 tokens per warp times the token groups of the
/// kernel width serving it (kTileTokens in kernels/include/fa/decode/traits.cuh).
pub fn decode_tile_tokens(head_dim: usize) -> usize {
    decode_tile(head_dim).block_n
}

/// What one paged decode should cost (kernels/decode.cu, then merge.cu for split-KV).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DecodeCost {
    /// CTAs of the decode kernel: splits × B × Hkv × ⌈G / rows per CTA⌉ ([`crate::plan::decode_rows_per_cta`]:
    /// up to 64 rows at width 64, 32 at 128, 16 above).
    pub ctas: u64,
    /// K and V tiles walked, over all CTAs.
    pub kv_tiles: u64,
    /// Each visible token's K and V row read once per CTA of a KV head (one for G ≤ rows per CTA: the G query
    /// heads of a KV head are the row groups of one CTA), never a slot past `seq_len` (zero-filled instead), nor
    /// one left of a sliding window (the last w + 1 tokens are the visible ones).
    pub k_bytes_read: u64,
    pub v_bytes_read: u64,
    /// Q read once per split (every split's CTA needs the query rows).
    pub q_bytes_read: u64,
    /// The block table: at most one entry per visible token per CTA, plus the speculative first
    /// pipeline stages' tiles of each CTA (an upper bound, not exact).
    pub block_table_bytes_max: u64,
    /// seq_lens: one read per thread per CTA.
    pub seq_lens_bytes_read: u64,
    /// FP8 cache: the K and V dequantisation scales of the CTA's KV head, one fp32 each per thread.
    pub scale_bytes_read: u64,
    /// O (and LSE) written exactly once — by the decode kernel, or by the merge after a split.
    pub o_bytes_written: u64,
    pub lse_bytes_written: u64,
    /// Split-KV: the decode kernel writes one fp32 partial O row and LSE per (split, sequence, head).
    pub partial_o_bytes_written: u64,
    pub partial_lse_bytes_written: u64,
    /// Per tile each of the 4 warps runs S = Q·Kᵀ over its 16 tokens (2 mma per 16 of the kernel width W ≥ D,
    /// or of W / 4 at W = 512, where the 4 D-split warps each compute a quarter of S: the policy's
    /// `score_splits`) and P·V over its output columns (64, or 128 at W = 512: 2 mma per 16):
    /// 4·(W/8 + 8) up to W = 256, 4·(16 + 16) at 512. Bytes are of D columns (the chunks past D are
    /// zero-filled, not read). With a V head dim of its own (docs/head-dims.md) W is the width of the wider
    /// of Dqk and Dv, and K and Q bytes are of Dqk columns, V, O and the fp32 partials of Dv.
    pub mma: u64,
}

/// The decode model of `case` under `plan` (over an FP8 cache: K/V one byte per element, plus the scales).
pub fn decode_cost(case: &DecodeCase, plan: &DecodePlan) -> DecodeCost {
    let mut c = decode_cost_kv(case, plan, case.kv.bytes() as u64);
    if case.kv.fp8().is_some() {
        c.scale_bytes_read = c.ctas * decode_threads(case) as u64 * 2 * 4;
    }
    c
}

/// Threads per CTA of `case`'s decode launch (the kernel of the wider head dim's width; wide CTAs past its
/// narrow rows).
fn decode_threads(case: &DecodeCase) -> usize {
    let wide = case.head_dim.max(case.dv());
    let rows_per_cta = crate::plan::decode_rows_per_cta(wide, case.heads_q / case.heads_kv.max(1));
    decode_tile(wide).threads_for(rows_per_cta)
}

/// The decode model with K/V elements of `kv_elem` bytes.
fn decode_cost_kv(case: &DecodeCase, plan: &DecodePlan, kv_elem: u64) -> DecodeCost {
    let (d, dv) = (case.head_dim as u64, case.dv() as u64);
    // The kernel of the wider dim's width serves the pair (its tiles, rows per CTA and mma).
    let wide = case.head_dim.max(case.dv());
    let w = crate::head_dim::decode_width(wide).unwrap_or(wide) as u64;
    let group = case.heads_q / case.heads_kv.max(1);
    let rows_per_cta = crate::plan::decode_rows_per_cta(wide, group);
    let kv_ctas = (case.heads_kv * group.div_ceil(rows_per_cta)) as u64; // CTAs per (sequence, split)
                                                                         // The speculative page lookups cover the first kStages tiles: the cache format's stages (FP8 has twice).
    let policy = crate::tile::tile_policy(KernelOp::Decode, wide, false, case.kv.fp8().map(|f| f.0))
        .unwrap_or_else(|| decode_tile(wide));
    let tile = policy.block_n;
    let splits = plan.num_splits as u64;
    let rows = (case.batch() * case.heads_q) as u64;
    let mut c = DecodeCost { ctas: splits * case.batch() as u64 * kv_ctas, ..Default::default() };
    let mut table_entries = 0u64;
    let window_left = case.window_left();
    let mut visible_rows = 0u64; // (visible token, CTA) pairs: each reads the token's K and V rows once
    for &len in &case.seq_lens {
        let mut visible = 0;
        for s in 0..plan.num_splits {
            let (begin, end) = plan.split_range_windowed(s, len, window_left);
            c.kv_tiles += (end - begin).div_ceil(tile) as u64 * kv_ctas;
            table_entries += ((end - begin) + policy.stages * tile) as u64 * kv_ctas;
            visible += end - begin;
        }
        visible_rows += visible as u64 * kv_ctas;
    }
    c.k_bytes_read = visible_rows * d * kv_elem;
    c.v_bytes_read = visible_rows * dv * kv_elem;
    c.q_bytes_read = splits * rows * d * ELEM;
    c.block_table_bytes_max = table_entries * 4;
    c.seq_lens_bytes_read = c.ctas * decode_threads(case) as u64 * 4;
    c.o_bytes_written = rows * dv * ELEM;
    c.lse_bytes_written = rows * 4;
    if plan.num_splits > 1 {
        c.partial_o_bytes_written = splits * rows * dv * 4;
        c.partial_lse_bytes_written = splits * rows * 4;
    }
    let warps = policy.warps() as u64;
    let d_splits = warps / (tile as u64 / 16); // warps per token group
                                               // Per KV tile every 16-row group with rows runs the whole CTA's worth of chunks (its warps take the tile's
                                               // chunks between them); a CTA's empty row groups (its last rows) run none. So per (sequence, KV head):
                                               // ceil(G / 16) groups, however many CTAs hold them.
    let groups = (case.heads_kv * group.div_ceil(crate::plan::ROWS_PER_CTA)) as u64;
    c.mma = c.kv_tiles / kv_ctas.max(1) * groups * warps * (w / 8 / policy.score_splits as u64 + w / d_splits / 8);
    c
}

impl DecodeCost {
    /// The budget for everything the decode kernel reads: K/V within 2% of the model, plus Q and
    /// the tables (block table bound, seq_lens).
    pub fn read_budget(&self) -> f64 {
        1.02 * (self.k_bytes_read + self.v_bytes_read) as f64
            + (self.q_bytes_read + self.block_table_bytes_max + self.seq_lens_bytes_read + self.scale_bytes_read) as f64
    }

    /// measured / model for the `paged_decode` kernel's counters (see [`PrefillCost::ratios`]).
    pub fn ratios(&self, k: &KernelCounters) -> Vec<(&'static str, f64)> {
        vec![
            ("k_read", ratio(k.read_of("k_cache"), self.k_bytes_read)),
            ("v_read", ratio(k.read_of("v_cache"), self.v_bytes_read)),
            ("q_read", ratio(k.read_of("q"), self.q_bytes_read)),
            ("read_vs_budget", k.global_bytes_read() as f64 / self.read_budget()),
            ("mma", ratio(k.mma, self.mma)),
        ]
    }
}

/// What a paged prefill of short chunks should move, on either kernel (the tiled one, or the streaming
/// path's decode kernel): when every sequence's q_len · G is at most 16 packed rows (one row group) and no
/// window hides keys, one CTA per (sequence, KV head, split) holds all of a KV head's rows, and with
/// causal alignment the last new token sees the whole context, so each cached token's K row (Dqk columns)
/// and V row (Dv columns) of a sequence with new tokens is read once per KV head, exactly, on a uniform
/// plan or a schedule (each split or chunk reads its own keys); O (Dv columns) is written once, by the
/// kernel or by the merge after a split. (The tiled kernel's block-table reads and Q bounds are in
/// tests/it/cost.rs.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PagedPrefillBytes {
    pub k_bytes_read: u64,
    pub v_bytes_read: u64,
    pub o_bytes_written: u64,
}

/// The short-chunk model of `case` ([`PagedPrefillBytes`]), or `None` when the case is outside it (a
/// window, or a chunk of more than 16 packed rows per KV head: then the rows take several CTAs, each
/// reading the keys its tokens see).
pub fn paged_prefill_short_chunk_bytes(case: &PagedPrefillCase) -> Option<PagedPrefillBytes> {
    let group = case.heads_q / case.heads_kv.max(1);
    if case.variants.window.is_some() || case.seqs.iter().any(|&(q, _)| q * group > crate::plan::ROWS_PER_CTA) {
        return None;
    }
    let keys = case.seqs.iter().filter(|s| s.0 > 0).map(|s| s.1).sum::<usize>() as u64;
    let rows = keys * case.heads_kv as u64 * case.kv.bytes() as u64;
    Some(PagedPrefillBytes {
        k_bytes_read: rows * case.head_dim as u64,
        v_bytes_read: rows * case.dv() as u64,
        o_bytes_written: (case.total_q() * case.heads_q * case.dv()) as u64 * ELEM,
    })
}

impl PagedPrefillBytes {
    /// measured / model for a paged prefill's counters: its kernel's K/V reads (`paged_prefill`, or the
    /// streaming path's `paged_decode`) and O written over the launch.
    pub fn ratios(&self, counters: &LaunchCounters) -> Option<Vec<(&'static str, f64)>> {
        let k = counters.kernel("paged_prefill").or_else(|| counters.kernel("paged_decode"))?;
        Some(vec![
            ("k_read", ratio(k.read_of("k_cache"), self.k_bytes_read)),
            ("v_read", ratio(k.read_of("v_cache"), self.v_bytes_read)),
            ("o_written", ratio(counters.total().written_of("o"), self.o_bytes_written)),
        ])
    }
}

/// What one paged append moves (kernels/append.cu): every new token's K row (Dqk columns) and V row (Dv
/// columns) read once from k / v (16-bit) and written once into its slot (16-bit, or one byte per FP8
/// element); padding rows (slot < 0) are neither read nor written (the fixtures have none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AppendCost {
    pub k_bytes_read: u64,
    pub v_bytes_read: u64,
    pub k_cache_bytes_written: u64,
    pub v_cache_bytes_written: u64,
}

pub fn append_cost(case: &AppendCase) -> AppendCost {
    let rows = (case.tokens() * case.heads_kv) as u64;
    let cache_elem = case.kv.kv_dtype(case.dtype).bytes() as u64;
    let (d, dv) = (case.head_dim as u64, case.dv() as u64);
    AppendCost {
        k_bytes_read: rows * d * ELEM,
        v_bytes_read: rows * dv * ELEM,
        k_cache_bytes_written: rows * d * cache_elem,
        v_cache_bytes_written: rows * dv * cache_elem,
    }
}

impl AppendCost {
    /// Bytes moved: everything read and written.
    pub fn total(&self) -> u64 {
        self.k_bytes_read + self.v_bytes_read + self.k_cache_bytes_written + self.v_cache_bytes_written
    }

    /// measured / model for an append's counters (over the launch).
    pub fn ratios(&self, counters: &LaunchCounters) -> Vec<(&'static str, f64)> {
        let t = counters.total();
        vec![
            ("k_read", ratio(t.read_of("k"), self.k_bytes_read)),
            ("v_read", ratio(t.read_of("v"), self.v_bytes_read)),
            ("k_cache_written", ratio(t.written_of("k_cache"), self.k_cache_bytes_written)),
            ("v_cache_written", ratio(t.written_of("v_cache"), self.v_cache_bytes_written)),
        ]
    }
}

/// measured / model for a prefill op's counters (`Emulator::last_launch_counters` after running `case`), or
/// `None` if the case has no kernel or no `prefill` kernel ran: what the runner's `report` shows per case.
pub fn prefill_ratios(case: &PrefillCase, counters: &LaunchCounters) -> Option<Vec<(&'static str, f64)>> {
    Some(prefill_cost(case)?.ratios(counters.kernel("prefill")?))
}

/// measured / model for a decode op's counters under the `plan` it followed (see [`prefill_ratios`]).
pub fn decode_ratios(
    case: &DecodeCase,
    plan: &DecodePlan,
    counters: &LaunchCounters,
) -> Option<Vec<(&'static str, f64)>> {
    Some(decode_cost(case, plan).ratios(counters.kernel("paged_decode")?))
}

fn ratio(measured: u64, model: u64) -> f64 {
    match (measured, model) {
        (0, 0) => 1.0,
        (m, 0) => m as f64 / 0.0,
        (m, n) => m as f64 / n as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    fn prefill_case(t: usize, causal: bool) -> PrefillCase {
        PrefillCase::dense(DType::Bf16, 64, causal, t, t, (1, 1))
    }

    #[test]
    fn causal_prefill_visits_the_lower_triangle_of_tiles() {
        // D = 64: Br = 128, Bc = 64. T = 4096: 32 query tiles; tile m visits 2(m + 1) KV tiles of 64.
        let full = prefill_cost(&prefill_case(4096, false)).unwrap();
        let causal = prefill_cost(&prefill_case(4096, true)).unwrap();
        assert_eq!(full.kv_tiles, 32 * 64);
        assert_eq!(causal.kv_tiles, (1..=32).map(|m| 2 * m).sum::<u64>());
        assert_eq!(full.mma, 2048 * 512); // 2·128·64·64 / 2048 = 512 per tile
        assert_eq!(full.k_bytes_read, 32 * 4096 * 64 * 2);
    }

    #[test]
    fn ragged_prefill_reads_only_rows_below_tk() {
        // Tq = Tk = 65 at D = 64: one query tile, two KV tiles, the second holding one key.
        let c = prefill_cost(&prefill_case(65, false)).unwrap();
        assert_eq!((c.kv_tiles, c.k_bytes_read, c.q_bytes_read), (2, 65 * 128, 65 * 128));
    }

    #[test]
    fn ratio_of_nothing_is_one() {
        assert_eq!(ratio(0, 0), 1.0);
        assert_eq!(ratio(3, 0), f64::INFINITY);
        assert_eq!(ratio(3, 2), 1.5);
    }
}
