//! Cost tests: the emulator's counters (fused_attn::counters) against the cost models the kernels are
//! designed to (fused_attn::testkit::cost_model), so a kernel that gets the right answer by doing the wrong amount of
//! work — reading the cache twice, visiting tiles the causal mask hides — fails. First the counters' own
//! semantics on self-test kernels whose counts are known by hand, then the design's promises:
//!  - decode reads each visible K/V byte once per KV head (exactly), and everything it reads stays within
//!    1.02 × the K/V bytes + Q + tables; O is written once;
//!  - prefill visits ⌈Tq/Br⌉ passes over K/V per query head (exactly, the ragged edge zero-filled, not
//!    read), reads Q once, writes O once, and its mma / exp2 / barrier counts follow the tile model;
//!  - causal prefill at T = 4096 issues ≤ ½ + Br/T + 2% of the non-causal mma count.
//!
//! The counts do not depend on the data; the seed (fixed, FA_SEED varies it) only feeds the correctness
//! check each case also passes.

use fused_attn::counters::{KernelCounters, LaunchCounters};
use fused_attn::prefill::TileConfig;
use fused_attn::testkit::cases::decode::{run_case_emulated, DecodeCase};
use fused_attn::testkit::cases::prefill::{run_emulated, PrefillCase, PrefillFixture};
use fused_attn::testkit::cost_model::{decode_cost, decode_ratios, prefill_cost, prefill_ratios, DecodeCost};
use fused_attn::testkit::emu_selftest::{self as st, BarrierMode, GemmBug, GemmShape, WarpOp};
use fused_attn::{DType, Emulator};
use half::{bf16, f16};

fn base_seed() -> u64 {
    std::env::var("FA_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0xc057_5eed)
}

/// How to rerun one failing test with the same seed.
fn rerun(test: &str) -> String {
    format!("seed {:#x}; rerun: FA_SEED={} cargo test --release --test it -- cost::{test}", base_seed(), base_seed())
}

fn only_kernel<'a>(c: &'a LaunchCounters, name: &str) -> &'a KernelCounters {
    assert_eq!(c.kernels.len(), 1, "expected one kernel launch:\n{c}");
    let k = &c.kernels[0];
    assert!(k.is(name), "expected a {name} kernel, got {}", k.kernel);
    k
}

// ------------------------------------------------------------------------------ the counters themselves

#[test]
fn counters_count_one_mma_per_warp_and_bytes_per_buffer() {
    let (a, b, c) = ([0u32; 128], [0u32; 64], [0f32; 128]);
    st::mma(DType::F16, &a, &b, &c, 1).unwrap();
    let counters = st::last_counters().unwrap();
    let k = only_kernel(&counters, "selftest_mma");
    // One warp: each lane loads 4 + 2 registers and 4 accumulators, stores 4 floats.
    assert_eq!((k.blocks, k.mma, k.exp2, k.barriers, k.shuffles, k.ldmatrix), (1, 1, 0, 0, 0, 0));
    let traffic: Vec<(&str, u64, u64)> = k.buffers.iter().map(|b| (b.name.as_str(), b.read, b.written)).collect();
    assert_eq!(traffic, [("a", 512, 0), ("b", 256, 0), ("c", 512, 0), ("d", 0, 512)]);
    assert_eq!((k.global_bytes_read(), k.global_bytes_written()), (1280, 512));
}

#[test]
fn exp2_counts_per_lane_and_shuffles_per_warp() {
    let values = [0x3f80_0000u32; 32]; // 1.0f
    st::warp_op(WarpOp::Exp2, &values, &[0; 32], 1).unwrap();
    let k = st::last_counters().unwrap().kernels[0].clone();
    assert_eq!((k.exp2, k.shuffles), (32, 0));
    st::warp_op(WarpOp::ShflXor, &values, &[1; 32], 1).unwrap();
    let k = st::last_counters().unwrap().kernels[0].clone();
    assert_eq!((k.exp2, k.shuffles), (0, 1));
}

#[test]
fn ldmatrix_counts_instructions_and_128_shared_bytes_per_matrix() {
    let rows: Vec<[u16; 8]> = (0..32).map(|r| [r as u16; 8]).collect();
    let lanes: [i32; 32] = std::array::from_fn(|l| l as i32);
    st::ldmatrix(&rows, &lanes, 4, true, 1).unwrap();
    let k = st::last_counters().unwrap().kernels[0].clone();
    // Staging: 32 rows of 16 bytes stored to shared; then one sync_threads (one warp) and one ldmatrix.x4.
    assert_eq!((k.ldmatrix, k.shared_bytes_written, k.shared_bytes_read), (1, 32 * 16, 4 * 128));
    assert_eq!((k.barriers, k.barrier_arrivals), (1, 1));
}

/// (requests, wavefronts, ideal wavefronts) of `repeat` warp-wide accesses of `kind` at `offsets`.
fn bank_counts(kind: st::BankAccess, bytes: u32, offsets: [i32; 32], repeat: u32) -> (u64, u64, u64) {
    st::bank_access(kind, bytes, &offsets, repeat, 65536).unwrap();
    let k = st::last_counters().unwrap().kernels[0].clone();
    assert_eq!(k.shared_uncounted, 0);
    (k.shared_requests, k.shared_wavefronts, k.shared_ideal_wavefronts)
}

/// Lane offsets `f(lane)`.
fn lanes(f: impl Fn(i32) -> i32) -> [i32; 32] {
    std::array::from_fn(|l| f(l as i32))
}

/// Byte offset of 16-byte chunk `c` of row `r` in rows of 128 bytes, XOR-swizzled like the decode tiles.
fn swizzled(r: i32, c: i32) -> i32 {
    r * 128 + 16 * (c ^ (r & 7))
}

#[test]
fn bank_conflicts_of_32_bit_accesses() {
    use st::BankAccess::{Load, Store};
    // Lane l at word l: 32 banks, one wavefront. Stride 2 words: lanes l and l + 16 share a bank (2-way).
    // Stride 32 words: all 32 lanes in bank 0 (32-way). One word for all: a broadcast, one wavefront.
    assert_eq!(bank_counts(Load, 4, lanes(|l| 4 * l), 1), (1, 1, 1));
    assert_eq!(bank_counts(Load, 4, lanes(|l| 8 * l), 1), (1, 2, 1));
    assert_eq!(bank_counts(Store, 4, lanes(|l| 8 * l), 1), (1, 2, 1));
    assert_eq!(bank_counts(Load, 4, lanes(|l| 128 * l), 1), (1, 32, 1));
    assert_eq!(bank_counts(Store, 4, lanes(|l| 128 * l), 1), (1, 32, 1));
    assert_eq!(bank_counts(Load, 4, lanes(|_| 64), 1), (1, 1, 1));
    // Pairs of lanes on one word, 16 words in 16 banks: still one wavefront.
    assert_eq!(bank_counts(Load, 4, lanes(|l| 4 * (l / 2)), 1), (1, 1, 1));
    // Sub-word accesses: four lanes per word, 8 words.
    assert_eq!(bank_counts(Load, 1, lanes(|l| l), 1), (1, 1, 1));
    assert_eq!(bank_counts(Load, 2, lanes(|l| 2 * l + 128 * (l % 2)), 1), (1, 2, 1));
    // Each repetition is its own instruction (one source line, executed again).
    assert_eq!(bank_counts(Load, 4, lanes(|l| 8 * l), 3), (3, 6, 3));
    // Only half the lanes take part (divergence around the access): one phase, conflict-free.
    assert_eq!(bank_counts(Load, 4, lanes(|l| if l < 16 { 4 * l } else { -1 }), 1), (1, 1, 1));
}

#[test]
fn bank_conflicts_of_64_and_128_bit_accesses() {
    use st::BankAccess::{CpAsync, Load, Store};
    // 8 bytes per lane: two half-warp phases; consecutive: no conflict. 16-byte stride: each half-warp spans
    // 256 bytes, two words per bank: 2-way.
    assert_eq!(bank_counts(Load, 8, lanes(|l| 8 * l), 1), (1, 2, 2));
    assert_eq!(bank_counts(Load, 8, lanes(|l| 16 * l), 1), (1, 4, 2));
    // 16 bytes per lane: four quarter-warp phases. Consecutive: 4. A column of a 128-byte-row tile, unswizzled:
    // 8 rows in the same 4 banks per phase (8-way). The XOR swizzle spreads them: conflict-free.
    assert_eq!(bank_counts(Load, 16, lanes(|l| 16 * l), 1), (1, 4, 4));
    assert_eq!(bank_counts(Store, 16, lanes(|l| 128 * l), 1), (1, 32, 4));
    assert_eq!(bank_counts(Store, 16, lanes(|l| swizzled(l, 0)), 1), (1, 4, 4));
    // cp.async destinations count like 16-byte stores: rows of 64 bytes, 2 rows per 128 bytes: 4-way.
    assert_eq!(bank_counts(CpAsync, 16, lanes(|l| 64 * l), 1), (1, 16, 4));
    assert_eq!(bank_counts(CpAsync, 16, lanes(|l| 16 * l), 2), (2, 8, 8));
    // One quarter-warp only.
    assert_eq!(bank_counts(Store, 16, lanes(|l| if l < 8 { 128 * l } else { -1 }), 1), (1, 8, 1));
}

#[test]
fn bank_conflicts_of_ldmatrix() {
    use st::BankAccess::LdmatrixX4;
    // ldmatrix.x4: one phase per matrix (lanes 8i .. 8i+7 address its rows). Rows of one column of a tile
    // with 128-byte rows: 8-way per matrix; swizzled: conflict-free; consecutive rows: conflict-free.
    assert_eq!(bank_counts(LdmatrixX4, 16, lanes(|l| 128 * l), 1), (1, 32, 4));
    assert_eq!(bank_counts(LdmatrixX4, 16, lanes(|l| swizzled(l % 8, l / 8)), 1), (1, 4, 4));
    assert_eq!(bank_counts(LdmatrixX4, 16, lanes(|l| 16 * l), 1), (1, 4, 4));
    // Rows 0-3 and 8-11 (the swizzle repeats every 8 rows): rows r and r + 8 share a bank group, 2-way;
    // rows 0-3 twice over: the same addresses, broadcast.
    assert_eq!(bank_counts(LdmatrixX4, 16, lanes(|l| swizzled(l % 4 + 8 * (l % 8 / 4), l / 8)), 2), (2, 16, 8));
    assert_eq!(bank_counts(LdmatrixX4, 16, lanes(|l| swizzled(l % 4, l / 8)), 1), (1, 4, 4));
}

#[test]
fn named_barriers_count_completions_and_warp_arrivals() {
    st::barriers(BarrierMode::Pairs, 1).unwrap();
    let k = st::last_counters().unwrap().kernels[0].clone();
    // Barrier 1 (warps 0, 1) and barrier 2 (warps 2, 3), 64 threads each.
    assert_eq!((k.barriers, k.barrier_arrivals), (2, 4));
    st::barriers(BarrierMode::Block, 1).unwrap();
    let k = st::last_counters().unwrap().kernels[0].clone();
    assert_eq!((k.barriers, k.barrier_arrivals), (1, 4));
}

#[test]
fn cp_async_counts_reads_zero_fills_and_landings() {
    // 3 groups of 64 16-byte chunks, every third predicated off; wait for all, read two groups back.
    let groups = 3;
    let src: Vec<[u8; 16]> = (0..groups * 64).map(|i| [i as u8; 16]).collect();
    let preds: Vec<bool> = (0..groups * 64).map(|j| j % 3 != 0).collect();
    st::cp_async(&src, &preds, 0, 2, 1).unwrap();
    let k = st::last_counters().unwrap().kernels[0].clone();
    let on = preds.iter().filter(|&&p| p).count() as u64;
    let all = (groups * 64) as u64;
    assert_eq!((k.cp_async_bytes, k.cp_async_zfill_bytes), (16 * on, 16 * (all - on)));
    assert_eq!(k.read_of("src"), 16 * on, "a false predicate reads nothing");
    assert_eq!(k.read_of("preds"), all);
    assert_eq!(k.shared_bytes_written, 16 * all, "every copy lands, zero-fills included");
    assert_eq!((k.shared_bytes_read, k.written_of("out")), (2 * 64 * 16, 2 * 64 * 16));
}

#[test]
fn atomics_count_as_read_and_write() {
    let addends = vec![1.0f32; 2 * 128];
    st::atomics(&addends, 1).unwrap();
    let k = st::last_counters().unwrap().kernels[0].clone();
    let n = addends.len() as u64;
    assert_eq!((k.read_of("counter"), k.written_of("counter")), (4 * n, 4 * n));
    assert_eq!((k.read_of("sum"), k.written_of("sum")), (4 * n, 4 * n));
    assert_eq!((k.read_of("addends"), k.written_of("olds")), (4 * n, 4 * n));
}

#[test]
fn tiled_gemm_issues_one_mma_per_16x8x16_step() {
    // 64×64 block tiles of 4 warps (32×32 each), k tiles of 32: per block and k step of 16,
    // (64/16)·(64/8) = 32 mma. m = 100 → 2 block rows; n = 72 → 2 block columns.
    let shape = GemmShape { m: 100, n: 72, k: 64, b_k_major: false };
    let a = vec![f16::ONE; shape.m * shape.k];
    let b = vec![f16::ONE; shape.n * shape.k];
    st::gemm(&a, &b, shape, GemmBug::None, 1).unwrap();
    let k = st::last_counters().unwrap().kernels[0].clone();
    assert_eq!(k.blocks, 4);
    assert_eq!(k.mma, 4 * 32 * (64 / 16));
    // Ragged rows and columns are zero-filled: A and B are each read once per block column / row.
    assert_eq!(k.read_of("a"), 2 * (shape.m * shape.k * 2) as u64);
    assert_eq!(k.read_of("b"), 2 * (shape.n * shape.k * 2) as u64);
}

#[test]
fn ops_record_every_kernel_they_launch_per_thread() {
    // Split-KV decode is two kernels on one stream: decode, then merge.
    let emu = Emulator::new();
    assert!(emu.last_launch_counters().is_none());
    let case = decode_case(4, 16, 3, vec![300]);
    run_case_emulated::<bf16>(&emu, &case, base_seed()).unwrap();
    let c = emu.last_launch_counters().unwrap();
    let names: Vec<&str> = c.kernels.iter().map(|k| k.kernel.as_str()).collect();
    assert_eq!(names, ["fa_paged_decode_bf16_d64", "fa_merge_states_f32_bf16"]);
    let total = c.total();
    assert_eq!(total.global_bytes_read(), c.kernels.iter().map(|k| k.global_bytes_read()).sum::<u64>());
    assert_eq!(c.values()[0], ("global_bytes_read", total.global_bytes_read()));
    assert!(format!("{c}").contains("fa_paged_decode_bf16_d64: 6 blocks"), "{c}");
    // Another thread's view of the same emulator is its own.
    std::thread::scope(|s| s.spawn(|| assert!(emu.last_launch_counters().is_none())).join().unwrap());
}

// ---------------------------------------------------------------------------------------------- decode

fn decode_case(group: usize, page_size: usize, splits: usize, seq_lens: Vec<usize>) -> DecodeCase {
    DecodeCase::new(DType::Bf16, 64, (2 * group, 2), page_size, &seq_lens, Some(splits))
}

/// Runs `case` (checked against the fp64 reference) and returns its counters and model.
fn decode_counters(case: &DecodeCase) -> (LaunchCounters, DecodeCost, usize) {
    let emu = Emulator::new();
    let run = run_case_emulated::<bf16>(&emu, case, base_seed()).unwrap();
    assert!(run.outcome.passed(), "{}: {} ({})", case.label(), run.outcome.summary(), rerun("decode"));
    let plan = run.outcome.plan;
    (emu.last_launch_counters().unwrap(), decode_cost(case, &plan), plan.num_splits())
}

/// Model: the decode kernel reads each visible token's K and V rows once per KV head — for G ≤ 16 the G
/// query heads of a KV head are the 16 rows of one tensor-core tile, so one CTA per (sequence, KV head,
/// split) — and never a slot past seq_len; so
///     k_cache bytes = v_cache bytes = Σ_b seq_len_b · Hkv · D · 2          (exact)
///     everything read ≤ 1.02 · (K + V bytes) + Q (once per split) + block table + seq_lens.
/// O and LSE are written exactly once (by the merge after a split; the decode kernel then writes each
/// split's fp32 partial once, and the merge reads each at most once).
#[test]
fn decode_reads_each_kv_byte_once_per_kv_head() {
    let lens = vec![1000, 17, 0, 4097, 64];
    let mut failures = Vec::new();
    for group in [1, 4, 8] {
        for page_size in [16, 1] {
            for splits in [1, 3, 7] {
                failures.extend(decode_model_mismatches(&decode_case(group, page_size, splits, lens.clone()), splits));
            }
        }
    }
    // A page size that is not a power of two (issue 30: the page divided by multiply-shift, still one table
    // read per key row).
    failures.extend(decode_model_mismatches(&decode_case(4, 48, 3, lens.clone()), 3));
    assert!(failures.is_empty(), "{} mismatches ({}):\n{}", failures.len(), rerun("decode"), failures.join("\n"));
}

/// The same model at D = 512 and 264 (the width 512: 16-token tiles, 2 stages, each warp a quarter of S):
/// 16-bit and FP8 caches, split and not.
#[test]
fn decode_at_512_reads_each_kv_byte_once_per_kv_head() {
    use fused_attn::testkit::cases::kv::KvFormat;
    let fp8 = KvFormat::Fp8 { format: fused_attn::Fp8Format::E4m3, scales: fused_attn::ScaleKind::PerHead };
    let mut failures = Vec::new();
    for (d, group, page_size, splits, kv) in
        [(512, 8, 16, 3, KvFormat::Sixteen), (264, 4, 1, 1, KvFormat::Sixteen), (512, 1, 16, 1, fp8)]
    {
        let case = DecodeCase { head_dim: d, kv, ..decode_case(group, page_size, splits, vec![300, 17, 0, 129]) };
        failures.extend(decode_model_mismatches(&case, splits));
    }
    assert!(failures.is_empty(), "{} mismatches ({}):\n{}", failures.len(), rerun("decode"), failures.join("\n"));
}

/// Where `case`'s counters (run with `splits` forced) differ from the decode cost model.
fn decode_model_mismatches(case: &DecodeCase, splits: usize) -> Vec<String> {
    let mut failures = Vec::new();
    let (c, model, planned_splits) = decode_counters(case);
    assert_eq!(planned_splits, splits);
    let dec = c.kernel("paged_decode").expect("decode kernel launched");
    let mut check = |what: &str, measured: u64, expected: u64| {
        if measured != expected {
            failures.push(format!("{}: {what} {measured} B, model {expected} B", case.label()));
        }
    };
    check("k_cache read", dec.read_of("k_cache"), model.k_bytes_read);
    check("v_cache read", dec.read_of("v_cache"), model.v_bytes_read);
    check("q read", dec.read_of("q"), model.q_bytes_read);
    check("seq_lens read", dec.read_of("seq_lens"), model.seq_lens_bytes_read);
    check("mma", dec.mma, model.mma);
    let total = c.total();
    check("o written", total.written_of("o"), model.o_bytes_written);
    check("lse written", total.written_of("lse"), model.lse_bytes_written);
    if splits > 1 {
        check("partial_o written", dec.written_of("partial_o"), model.partial_o_bytes_written);
        check("partial_lse written", dec.written_of("partial_lse"), model.partial_lse_bytes_written);
        check("o written by the decode kernel", dec.written_of("o"), 0);
    }
    let mut at_most = |what: &str, measured: f64, bound: f64| {
        if measured > bound {
            failures.push(format!("{}: {what} {measured} B > {bound} B", case.label()));
        }
    };
    at_most("block_table read", dec.read_of("block_table") as f64, model.block_table_bytes_max as f64);
    // (The score variants' small per-head tables, ALiBi slopes and sinks, are read per CTA on top.)
    let variant_tables = dec.read_of("alibi_slopes") + dec.read_of("sinks");
    at_most(
        "decode read (bound: 1.02 x K/V + Q + tables)",
        (dec.global_bytes_read() - variant_tables) as f64,
        model.read_budget(),
    );
    if splits > 1 {
        let merge = c.kernel("merge_states").expect("merge kernel after a split");
        at_most("merge partial_o read", merge.read_of("partial_o") as f64, model.partial_o_bytes_written as f64);
    } else {
        assert_eq!(c.kernels.len(), 1, "{}: no merge without a split", case.label());
    }
    failures
}

/// Head dims below the kernel's width (fa/head_dim.cuh): K/V/Q bytes of D columns, O written of D columns,
/// mma of the width W (4·(W/8 + 8) per tile; 4·(16 + 16) at 512), for each decode width and with a split.
#[test]
fn decode_head_dims_below_the_width_read_only_d_columns() {
    let mut failures = Vec::new();
    for (d, splits) in [(40, 1), (80, 3), (200, 2), (264, 2), (512, 1)] {
        let case = DecodeCase { head_dim: d, ..decode_case(4, 16, splits, vec![300, 17]) };
        let (c, model, _) = decode_counters(&case);
        let dec = c.kernel("paged_decode").expect("decode kernel launched");
        assert_eq!(model.k_bytes_read, (317 * 2 * d * 2) as u64);
        for (what, measured, expected) in [
            ("k_cache read", dec.read_of("k_cache"), model.k_bytes_read),
            ("v_cache read", dec.read_of("v_cache"), model.v_bytes_read),
            ("q read", dec.read_of("q"), model.q_bytes_read),
            ("mma", dec.mma, model.mma),
            ("o written", c.total().written_of("o"), model.o_bytes_written),
            ("partial_o written", dec.written_of("partial_o"), model.partial_o_bytes_written),
        ] {
            if measured != expected {
                failures.push(format!("{}: {what} {measured}, model {expected}", case.label()));
            }
        }
    }
    assert!(failures.is_empty(), "{} mismatches ({}):\n{}", failures.len(), rerun("decode"), failures.join("\n"));
}

/// Model (issue 30, item 4): a decode CTA serves up to 8 row groups of 16 query heads from each staged K/V
/// byte, as many as the width has warp slots for (the policy's block_m: 128 rows at width 64 and 64 at 128,
/// in wide CTAs of 8 warps past 64 / 32; 16 at 256 and 512), so a KV head's cache is read ⌈G / rows per CTA⌉
/// times, rows per CTA being the fewest 16-row groups that hold G, rounded up to a power of two:
///     K/V bytes = reads · Σ_b visible_b · Hkv · D · elem,
/// G ≤ 128 (Falcon-7B's 71:1) at D ≤ 64 and MQA 64:1 at D ≤ 128 once. The reads are literal per case (not
/// the model's own function), the rest of the model (Q, mma, partials) is held by decode_model_mismatches,
/// and every case passes the fp64 reference with the variants that read per-row facts (per-head ALiBi,
/// sinks, window).
#[test]
fn decode_reads_a_kv_head_once_for_all_the_rows_a_cta_serves() {
    use fused_attn::testkit::cases::kv::KvFormat;
    use fused_attn::testkit::variants::{CaseAlibi, CaseVariants as V};
    let fp8 = KvFormat::Fp8 { format: fused_attn::Fp8Format::E4m3, scales: fused_attn::ScaleKind::PerHead };
    let none = V::default();
    let all = V { window: Some((200, 0)), softcap: Some(5.0), alibi: CaseAlibi::PerHead, sinks: true };
    let lens = vec![300, 65, 0, 1];
    let visible = |w: Option<usize>| -> u64 { lens.iter().map(|&l| w.map_or(l, |w| l.min(w + 1)) as u64).sum() };
    let mut failures = Vec::new();
    // (head dim, G, page size, splits, cache, variants, reads of each KV head, CTAs per (sequence, split))
    #[rustfmt::skip]
    let cases = [
        (64, 64, 16, 1, KvFormat::Sixteen, none, 1, 1),  // MQA 64:1: 4 row groups, K/V once
        (64, 64, 3, 3, fp8, all, 1, 1),
        (40, 48, 16, 2, KvFormat::Sixteen, all, 1, 1),   // 3 groups of rows in a 4-group CTA
        (64, 20, 12, 1, KvFormat::Sixteen, all, 1, 1),   // 2 groups, the second partial
        (64, 65, 16, 1, KvFormat::Sixteen, none, 1, 1),  // past 64 rows: a wide CTA (8 warps, 128 rows)
        (64, 71, 3, 2, fp8, all, 1, 1),                  // Falcon-7B's 71:1, FP8 (Q in two halves)
        (64, 129, 16, 1, KvFormat::Sixteen, none, 2, 2), // past 128 rows: a second CTA
        (128, 32, 16, 3, KvFormat::Sixteen, all, 1, 1),
        (96, 20, 16, 1, fp8, none, 1, 1),
        (128, 64, 16, 2, KvFormat::Sixteen, none, 1, 1), // MQA 64:1 at width 128: a wide CTA
        (128, 64, 12, 3, fp8, all, 1, 1),
        (128, 48, 16, 1, KvFormat::Sixteen, all, 1, 1),  // StarCoder's 48:1: 3 row groups of a wide CTA's 4
        (120, 65, 16, 1, KvFormat::Sixteen, none, 2, 2), // past 64 rows at width 128
        (256, 32, 16, 1, KvFormat::Sixteen, none, 2, 2), // one row group from width 256 on
    ];
    for (d, g, ps, splits, kv, variants, reads, ctas) in cases {
        let case = DecodeCase {
            head_dim: d,
            heads_q: g,
            heads_kv: 1,
            kv,
            variants,
            ..decode_case(1, ps, splits, lens.clone())
        };
        failures.extend(decode_model_mismatches(&case, splits));
        let (c, _, _) = decode_counters(&case);
        let dec = c.kernel("paged_decode").expect("decode kernel launched");
        let kv_bytes = reads * visible(variants.window.map(|w| w.0 as usize)) * (d * kv.bytes()) as u64;
        for (what, measured, expected) in [
            ("k_cache read", dec.read_of("k_cache"), kv_bytes),
            ("v_cache read", dec.read_of("v_cache"), kv_bytes),
            ("CTAs", dec.blocks, (splits * lens.len() * ctas) as u64),
        ] {
            if measured != expected {
                failures.push(format!("{}: {what} {measured}, expected {expected}", case.label()));
            }
        }
    }
    assert!(failures.is_empty(), "{} mismatches ({}):\n{}", failures.len(), rerun("decode"), failures.join("\n"));
}

// --------------------------------------------------------------------------------------------- prefill

fn prefill_case(tq: usize, tk: usize, d: usize, heads: (usize, usize), causal: bool) -> PrefillCase {
    PrefillCase::dense(DType::Bf16, d, causal, tq, tk, heads)
}

/// Runs `case` on the emulator (no reference check: tests/it/prefill.rs owns correctness) and returns the
/// prefill kernel's counters.
fn prefill_counters(case: &PrefillCase) -> KernelCounters {
    let emu = Emulator::new();
    let f = PrefillFixture::<bf16>::new(case, base_seed()).unwrap();
    run_emulated(&emu, &f).unwrap();
    only_kernel(&emu.last_launch_counters().unwrap(), "prefill").clone()
}

/// Model (the FA2 tiling, fused_attn::testkit::cost_model::prefill_cost): one CTA per (query tile of Br rows, query
/// head); it visits KV tiles [0, n_end) of Bc keys (kv_block_range: all ⌈Tk/Bc⌉, or up to the last key its
/// last row sees when causal) and loads each once, only the rows below Tk. So per query head
///     K bytes = V bytes = Σ_query tiles min(n_end·Bc, Tk) · D · 2      (non-causal: ⌈Tq/Br⌉ · Tk · D · 2)
///     Q bytes = Tq · D · 2 (once), O bytes = Tq · D · 2 (once), LSE = Tq · 4 (once)
/// (with a V head dim Dv of its own, V and O bytes have Dv for D, and W serves both),
///     mma = tiles · 2·Br·Bc·W / 2048,  exp2 = tiles · Br · (Bc + 4),  barriers = tiles (3 buffers) or 2·tiles.
/// All exact: the ragged edge is zero-filled by cp.async without a read, and so are the columns past D of a
/// head dim below its kernel's tile width W (fa/head_dim.cuh: bytes are of D columns, mma of W).
#[test]
fn prefill_traffic_and_work_follow_the_tiling_model() {
    let mut cases = vec![
        prefill_case(1000, 1000, 64, (1, 1), false),
        prefill_case(1000, 1000, 64, (1, 1), true),
        prefill_case(300, 1000, 128, (1, 1), true), // chunked prefill over a longer cache
        prefill_case(129, 65, 96, (1, 1), true),    // Tq > Tk: the first rows see nothing
        prefill_case(200, 200, 256, (1, 1), true),  // 2 K/V buffers: two barriers per tile
        prefill_case(255, 255, 32, (4, 1), false),  // GQA: each query head makes its own passes
        prefill_case(130, 150, 80, (2, 1), true),   // head dims below their width: D columns read,
        prefill_case(70, 100, 136, (1, 1), false),  // W columns multiplied
        prefill_case(65, 90, 200, (2, 2), true),
        PrefillCase { batch: 2, ..prefill_case(130, 70, 64, (2, 2), true) },
        PrefillCase { varlen: Some(vec![(70, 200), (0, 5), (129, 129)]), ..prefill_case(129, 200, 64, (2, 1), true) },
        // A V head dim of its own (issue 27): V and O bytes of Dv columns, Q and K of Dqk, mma of the width.
        PrefillCase { head_dim_v: Some(128), ..prefill_case(130, 150, 192, (2, 1), true) },
        PrefillCase { head_dim_v: Some(64), ..prefill_case(100, 90, 128, (1, 1), false) }, // runs at 160
        PrefillCase { head_dim_v: Some(128), ..prefill_case(70, 100, 64, (2, 2), true) },  // Dv > Dqk, at 160
        PrefillCase {
            head_dim_v: Some(128),
            varlen: Some(vec![(40, 70), (0, 5), (65, 65)]),
            ..prefill_case(65, 70, 256, (2, 1), true)
        },
    ];
    cases.push(PrefillCase { with_lse: false, ..cases[0].clone() });
    let mut failures = Vec::new();
    for case in &cases {
        let k = prefill_counters(case);
        let model = prefill_cost(case).unwrap();
        for (what, measured, expected) in [
            ("k read", k.read_of("k"), model.k_bytes_read),
            ("v read", k.read_of("v"), model.v_bytes_read),
            ("q read", k.read_of("q"), model.q_bytes_read),
            ("o written", k.written_of("o"), model.o_bytes_written),
            ("lse written", k.written_of("lse"), model.lse_bytes_written),
            ("mma", k.mma, model.mma),
            ("exp2", k.exp2, model.exp2),
            ("barriers", k.barriers, model.barriers),
        ] {
            if measured != expected {
                failures.push(format!("{}: {what} {measured}, model {expected}", case.label()));
            }
        }
        let reads = ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k"].iter().map(|b| k.read_of(b)).sum::<u64>();
        assert_eq!(k.global_bytes_read(), reads, "{}: reads nothing else\n{k}", case.label());
    }
    assert!(failures.is_empty(), "{} mismatches ({}):\n{}", failures.len(), rerun("prefill"), failures.join("\n"));
}

/// Prefill past the tiled kernel's head dims (issue 27) runs on the decode kernel's streaming path: one
/// CTA per 16 packed (token, query head) rows of a KV head (token-major), reading the keys its rows see
/// together once — [first row's position − left, last row's position + 1) with causal (all Tk without, the
/// window's left edge still cut) — so per KV head
///     K bytes = V bytes = Σ_CTAs keys(CTA) · D · 2,   Q bytes = O bytes = Tq · Hq · D · 2,  LSE = Tq · Hq · 4,
/// D the head dim (columns past it zero-filled, never read), every byte exactly once per CTA; nothing else is
/// read. Dense, causal and not, GQA 1, 2 and 4, a window's left edge.
#[test]
fn wide_prefill_reads_the_keys_each_16_row_block_sees_once() {
    // (tq, tk, d, heads, causal, left window)
    let shapes = [
        (40, 40, 512, (2, 1), true, None),
        (33, 70, 264, (8, 2), true, None),
        (25, 30, 384, (4, 4), false, None),
        (50, 64, 512, (4, 1), true, Some(9usize)),
    ];
    let mut failures = Vec::new();
    for (tq, tk, d, (hq, hkv), causal, left) in shapes {
        let mut case = prefill_case(tq, tk, d, (hq, hkv), causal);
        if let Some(l) = left {
            case.variants.window = Some((l as i32, if causal { 0 } else { -1 }));
        }
        let emu = Emulator::new();
        let f = PrefillFixture::<bf16>::new(&case, base_seed()).unwrap();
        run_emulated(&emu, &f).unwrap();
        let launch = emu.last_launch_counters().unwrap();
        let k = only_kernel(&launch, "paged_decode");
        let group = hq / hkv;
        let rows = tq * group;
        let mut keys = 0u64;
        for cta in 0..rows.div_ceil(16) {
            let (t0, t1) = (16 * cta / group, ((16 * cta + 15).min(rows - 1)) / group);
            let (p0, p1) = ((tk + t0) as i64 - tq as i64, (tk + t1) as i64 - tq as i64);
            let end = if causal { (p1 + 1).clamp(0, tk as i64) } else { tk as i64 };
            let begin = left.map_or(0, |l| (p0 - l as i64).clamp(0, end));
            keys += (end - begin) as u64;
        }
        let kv = keys * (hkv * d * 2) as u64;
        let qo = (tq * hq * d * 2) as u64;
        for (what, measured, expected) in [
            ("k read", k.read_of("k"), kv),
            ("v read", k.read_of("v"), kv),
            ("q read", k.read_of("q"), qo),
            ("o written", k.written_of("o"), qo),
            ("lse written", k.written_of("lse"), (tq * hq * 4) as u64),
        ] {
            if measured != expected {
                failures.push(format!("{}: {what} {measured}, model {expected}", case.label()));
            }
        }
        let reads = ["q", "k", "v"].iter().map(|b| k.read_of(b)).sum::<u64>();
        assert_eq!(k.global_bytes_read(), reads, "{}: reads nothing else\n{k}", case.label());
    }
    assert!(failures.is_empty(), "{} mismatches ({}):\n{}", failures.len(), rerun("wide_prefill"), failures.join("\n"));
}

/// Model: at Tq = Tk = T the causal query tile m (rows [m·Br, (m+1)·Br)) visits ⌈(m+1)·Br/Bc⌉ KV tiles
/// against ⌈T/Bc⌉ without the mask, so causal/non-causal mma = Σ_m (m+1)·Br / (T/Br · T)
/// = ½ + Br/(2T) ≤ ½ + Br/T. The bound allows 2% on top. And non-causal K/V traffic is exactly ⌈T/Br⌉
/// passes over K and V. (D = 64, one head: the ratio depends on neither.)
#[test]
fn causal_prefill_at_4096_issues_half_the_mma() {
    let t = 4096;
    let br = TileConfig::for_head_dim(64).unwrap().block_m;
    let full = prefill_counters(&prefill_case(t, t, 64, (1, 1), false));
    let causal = prefill_counters(&prefill_case(t, t, 64, (1, 1), true));
    let ratio = causal.mma as f64 / full.mma as f64;
    let bound = 0.5 + br as f64 / t as f64 + 0.02;
    eprintln!("causal / non-causal mma at T = {t}: {ratio:.4} (bound {bound:.4}); {} / {}", causal.mma, full.mma);
    assert!(ratio <= bound, "causal mma {} / non-causal {} = {ratio:.4} > {bound:.4}", causal.mma, full.mma);
    let passes = t.div_ceil(br) as u64;
    let kv_bytes = (t * 64 * 2) as u64;
    assert_eq!((full.read_of("k"), full.read_of("v")), (passes * kv_bytes, passes * kv_bytes));
    let model = prefill_cost(&prefill_case(t, t, 64, (1, 1), true)).unwrap();
    assert_eq!((causal.mma, causal.read_of("k")), (model.mma, model.k_bytes_read));
}

/// The measured/model view the runner's `report` prints per case: 1.0 for every exact quantity, and the
/// decode read below its budget.
#[test]
fn ratios_are_one_for_the_kernels_as_designed() {
    let case = prefill_case(200, 300, 128, (2, 1), true);
    let emu = Emulator::new();
    run_emulated(&emu, &PrefillFixture::<bf16>::new(&case, base_seed()).unwrap()).unwrap();
    let ratios = prefill_ratios(&case, &emu.last_launch_counters().unwrap()).unwrap();
    assert!(ratios.iter().all(|&(_, r)| r == 1.0), "{}: {ratios:?}", case.label());

    let case = decode_case(8, 16, 2, vec![700, 5]);
    let run = run_case_emulated::<bf16>(&emu, &case, base_seed()).unwrap();
    let ratios = decode_ratios(&case, &run.outcome.plan, &emu.last_launch_counters().unwrap()).unwrap();
    for (name, r) in &ratios {
        let ok = if *name == "read_vs_budget" { *r > 0.9 && *r <= 1.0 } else { *r == 1.0 };
        assert!(ok, "{}: {name} = {r} ({ratios:?})", case.label());
    }
}

// ------------------------------------------------------------------------------------------ score variants

/// Every variant's model is exact too: windows (left, right, both, with causal) change the visited tiles
/// and the K/V traffic, a softcap adds one exp2 per score, sinks two per row and lane (the epilogue), ALiBi
/// nothing countable.
#[test]
fn prefill_variants_follow_the_tiling_model() {
    use fused_attn::testkit::variants::{CaseAlibi, CaseVariants as V};
    let none = V::default();
    let cases = [
        (prefill_case(300, 300, 64, (1, 1), true), V { window: Some((70, 0)), ..none }),
        (prefill_case(300, 200, 128, (1, 1), false), V { window: Some((40, 25)), ..none }),
        (prefill_case(200, 300, 64, (2, 1), false), V { window: Some((-1, 9)), softcap: Some(3.0), ..none }),
        (prefill_case(200, 200, 256, (1, 1), true), V { alibi: CaseAlibi::PerHead, sinks: true, ..none }),
        (
            PrefillCase {
                varlen: Some(vec![(70, 200), (0, 5), (129, 129)]),
                ..prefill_case(129, 200, 64, (2, 1), true)
            },
            V { window: Some((33, 0)), sinks: true, softcap: Some(2.0), ..none },
        ),
    ];
    let mut failures = Vec::new();
    for (case, v) in cases {
        let case = PrefillCase { variants: v, ..case };
        let k = prefill_counters(&case);
        let model = prefill_cost(&case).unwrap();
        for (what, measured, expected) in [
            ("k read", k.read_of("k"), model.k_bytes_read),
            ("v read", k.read_of("v"), model.v_bytes_read),
            ("q read", k.read_of("q"), model.q_bytes_read),
            ("mma", k.mma, model.mma),
            ("exp2", k.exp2, model.exp2),
            ("barriers", k.barriers, model.barriers),
        ] {
            if measured != expected {
                failures.push(format!("{}: {what} {measured}, model {expected}", case.label()));
            }
        }
    }
    assert!(failures.is_empty(), "{} mismatches ({}):\n{}", failures.len(), rerun("prefill"), failures.join("\n"));
}

/// The issue's window saving: causal prefill with a sliding window of w keys at T = 4096 issues about
/// (w + Br) / T of the dense (non-causal) mma count — each query tile visits the ⌈(w + Br)/Bc⌉ (+1 for
/// alignment) KV tiles its window band touches, fewer near the start — and reads K/V in proportion.
/// (D = 64: Br 128, Bc 64.)
#[test]
fn sliding_window_prefill_at_4096_issues_the_window_share_of_the_mma() {
    let t = 4096;
    let br = TileConfig::for_head_dim(64).unwrap().block_m;
    let dense = prefill_cost(&prefill_case(t, t, 64, (1, 1), false)).unwrap();
    for w in [256usize, 1024] {
        let case = PrefillCase {
            variants: fused_attn::testkit::variants::CaseVariants {
                window: Some((w as i32 - 1, 0)),
                ..Default::default()
            },
            ..prefill_case(t, t, 64, (1, 1), true)
        };
        let k = prefill_counters(&case);
        let model = prefill_cost(&case).unwrap();
        assert_eq!((k.mma, k.read_of("k")), (model.mma, model.k_bytes_read), "{}", case.label());
        let ratio = k.mma as f64 / dense.mma as f64;
        let expected = (w + br) as f64 / t as f64;
        eprintln!("window {w}: mma {} / dense {} = {ratio:.4} (≈ (w + Br)/T = {expected:.4})", k.mma, dense.mma);
        // At most one extra KV tile per query tile (the band is not tile-aligned); the first w / Br query
        // tiles' windows are clipped at key 0, which saves up to a fraction w / T more.
        let (hi, lo) = (expected + 64.0 / t as f64, expected * (1.0 - w as f64 / t as f64));
        assert!(ratio <= hi && ratio >= lo, "window {w}: ratio {ratio:.4} outside [{lo:.4}, {hi:.4}]");
        let kv_ratio = k.read_of("k") as f64 / dense.k_bytes_read as f64;
        assert!((kv_ratio - ratio).abs() < 0.01, "K traffic follows the tiles: {kv_ratio:.4} vs {ratio:.4}");
    }
}

/// The issue's decode saving: a sliding window of 256 over 32k-token contexts reads at most 1.1 × the K/V
/// bytes of 256 tokens plus one page per sequence (the tokens left of the window are never loaded, the
/// split planner plans over the window), and matches the reference. Forced splits 1 and 3 and planned.
#[test]
fn sliding_window_decode_reads_only_the_window() {
    let (w, ctx, ps) = (256usize, 32_768usize, 16usize);
    for splits in [Some(1), Some(3), None] {
        let case = DecodeCase {
            num_splits: splits,
            variants: fused_attn::testkit::variants::CaseVariants {
                window: Some((w as i32 - 1, 0)),
                ..Default::default()
            },
            ..decode_case(4, ps, 1, vec![ctx, ctx - 7])
        };
        let (c, model, planned) = decode_counters(&case);
        let dec = c.kernel("paged_decode").expect("decode kernel");
        let kv = dec.read_of("k_cache") + dec.read_of("v_cache");
        let per_token = (case.heads_kv * case.head_dim * 2 * 2) as u64;
        let budget = 1.1 * ((w + ps) * case.batch()) as f64 * per_token as f64;
        eprintln!(
            "splits {planned}: K/V read {kv} B, budget {budget} B (the whole context: {} B)",
            ctx as u64 * 2 * per_token
        );
        assert!(kv as f64 <= budget, "{}: K/V read {kv} B > {budget} B", case.label());
        assert_eq!((dec.read_of("k_cache"), dec.read_of("v_cache")), (model.k_bytes_read, model.v_bytes_read));
        assert!(dec.global_bytes_read() as f64 <= model.read_budget(), "{}", case.label());
        if splits.is_none() {
            assert_eq!(planned, 1, "the planner plans over the 256-token window, not the 32k context");
        }
    }
}

// ------------------------------------------------------------------------------ paged prefill

/// Runs a paged prefill case on the tiled kernel (the model below is its; the streaming kernel's is in
/// tests/it/paged_prefill.rs), checked against the fp64 reference, and returns its kernel's counters.
fn paged_prefill_counters(case: &fused_attn::testkit::cases::paged_prefill::PagedPrefillCase) -> KernelCounters {
    let case = &fused_attn::testkit::cases::paged_prefill::PagedPrefillCase {
        kernel: fused_attn::PagedPrefillKernel::Tiled,
        ..case.clone()
    };
    let emu = Emulator::new();
    let run = fused_attn::testkit::cases::paged_prefill::run_case_emulated::<bf16>(&emu, case, base_seed()).unwrap();
    assert!(run.outcome.passed(), "{}: {} ({})", case.label(), run.outcome.summary(), rerun("paged_prefill"));
    let c = emu.last_launch_counters().unwrap();
    c.kernel("paged_prefill").expect("paged prefill kernel launched").clone()
}

/// Model: a CTA serves Br packed (token, query head) rows of one KV head (Br = `block_rows`: 128, or 64 at D = 96 and 256),
/// so when q_len · G ≤ Br the whole chunk of a KV head is one CTA per (sequence, KV head, split), which
/// reads every visible key's K and V rows once; each split reads its own key range. With causal alignment
/// the last new token sees the whole context, so
///     k_cache bytes = v_cache bytes = Σ_b seq_len_b · Hkv · D · 2              (exact)
///     block_table bytes = Σ_b seq_len_b · Hkv · 4                             (one lookup per key row)
///     everything read ≤ 1.05 · (K + V bytes) + tables + Q + cu_seqlens_q.
/// With q_len · G > Br the rows take ⌈q_len · G / Br⌉ CTAs, each reading the keys its tokens see.
#[test]
fn paged_prefill_reads_kv_once_per_kv_head_for_short_chunks() {
    use fused_attn::testkit::cases::paged_prefill::case;
    let mut failures = Vec::new();
    // (head dim, (Hq, Hkv), page size, q_len, splits): q_len · G ≤ Br in every case.
    for (d, heads, ps, q_len, splits) in [
        (128, (16, 2), 16, 1, 1),
        (128, (16, 2), 16, 4, 1),
        (128, (16, 2), 1, 16, 1),
        (64, (16, 1), 64, 8, 3),
        (256, (8, 2), 16, 16, 1),
        (64, (4, 4), 16, 16, 2),
        (96, (8, 2), 16, 16, 1),
        (64, (8, 2), 100, 8, 2), // not a power of two: still one table read per key row
    ] {
        let lens = [300usize, 77, 1000, 16];
        let seqs: Vec<(usize, usize)> = lens.iter().map(|&k| (q_len.min(k), k)).collect();
        let mut c = case(d, heads, ps, &seqs);
        c.num_splits = Some(splits);
        let k = paged_prefill_counters(&c);
        let keys: u64 = lens.iter().sum::<usize>() as u64;
        let kv = keys * heads.1 as u64 * d as u64 * 2;
        let q_bytes = (c.total_q() * heads.0 * d * 2) as u64;
        let table = keys * heads.1 as u64 * 4;
        let mut check = |what: &str, measured: u64, expected: u64| {
            if measured != expected {
                failures.push(format!("{}: {what} {measured} B, model {expected} B", c.label()));
            }
        };
        check("k_cache read", k.read_of("k_cache"), kv);
        check("v_cache read", k.read_of("v_cache"), kv);
        check("block_table read", k.read_of("block_table"), table);
        // Q: once per split that holds keys of the sequence (a split past a short sequence loads nothing).
        if k.read_of("q") < q_bytes
            || k.read_of("q") > q_bytes * splits as u64
            || (splits == 1 && k.read_of("q") != q_bytes)
        {
            failures.push(format!("{}: q read {} B, model {q_bytes} B per split", c.label(), k.read_of("q")));
        }
        let budget = 1.05 * (2 * kv) as f64
            + (table + q_bytes * splits as u64) as f64
            + (k.read_of("cu_seqlens_q") + k.read_of("seq_lens")) as f64;
        if k.global_bytes_read() as f64 > budget {
            failures.push(format!("{}: read {} B, budget {budget:.0} B\n{k}", c.label(), k.global_bytes_read()));
        }
    }
    assert!(
        failures.is_empty(),
        "{}\n{}",
        failures.join("\n"),
        rerun("paged_prefill_reads_kv_once_per_kv_head_for_short_chunks")
    );
}

/// Past the condition (q_len · G > Br) the packed rows take two CTAs per KV head, and K/V are read once per
/// CTA for the keys its tokens see: here both see the whole (non-causal) context, so exactly twice.
#[test]
fn paged_prefill_past_one_cta_reads_kv_per_row_block() {
    use fused_attn::testkit::cases::paged_prefill::case;
    let mut c = case(128, (8, 1), 16, &[(17, 200)]); // 136 rows > Br = 128
    c.causal = false;
    c.num_splits = Some(1);
    let k = paged_prefill_counters(&c);
    assert_eq!(k.blocks, 2);
    assert_eq!(k.read_of("k_cache"), 2 * 200 * 128 * 2);
}

/// A V head dim of its own (issue 27; DeepSeek's Dqk 192 / Dv 128, and Dv above Dqk): the models count K
/// bytes of Dqk columns and V, O and the fp32 partials of Dv (the literal counts below: a model that
/// regresses fails here, not only against the kernel), and the kernels' counters match them exactly:
/// decode split and not (every quantity of `decode_model_mismatches`: K, V, Q, seq_lens, mma of the wider
/// dim's width, O, LSE, partials, the read budget), paged prefill's short chunks on both kernels
/// (`cost_model::paged_prefill_short_chunk_bytes`), and append into 16-bit and FP8 pages (`append_cost`).
#[test]
fn v_head_dim_traffic_follows_the_models() {
    use fused_attn::testkit::cases::append::{self as ac, AppendCase};
    use fused_attn::testkit::cases::kv::KvFormat;
    use fused_attn::testkit::cases::paged_prefill::{self as ppc, case};
    use fused_attn::testkit::cost_model::{append_cost, paged_prefill_short_chunk_bytes};
    let fp8 = KvFormat::Fp8 { format: fused_attn::Fp8Format::E4m3, scales: fused_attn::ScaleKind::PerHead };
    let mut failures = Vec::new();
    // Decode: 317 tokens x 2 KV heads; 2 x 8 query rows.
    for (dqk, dv, splits) in [(192, 128, 3), (192, 128, 1), (64, 128, 2)] {
        let case = DecodeCase { head_dim: dqk, head_dim_v: Some(dv), ..decode_case(4, 16, splits, vec![300, 17]) };
        let model = decode_cost(&case, &run_case_emulated::<bf16>(&Emulator::new(), &case, 1).unwrap().outcome.plan);
        let want = ((317 * 2 * dqk * 2) as u64, (317 * 2 * dv * 2) as u64, (2 * 8 * dv * 2) as u64);
        assert_eq!((model.k_bytes_read, model.v_bytes_read, model.o_bytes_written), want, "{}", case.label());
        assert_eq!(model.partial_o_bytes_written, if splits > 1 { (splits * 16 * dv * 4) as u64 } else { 0 });
        failures.extend(decode_model_mismatches(&case, splits));
    }
    // Paged prefill: chunks of 2, 1 and 0 new tokens (G = 4: at most 8 packed rows) over 300, 17 and 5 keys.
    for (kernel, splits, kv) in [
        (fused_attn::PagedPrefillKernel::Tiled, 1, KvFormat::Sixteen),
        (fused_attn::PagedPrefillKernel::Streaming, 2, KvFormat::Sixteen),
        (fused_attn::PagedPrefillKernel::Tiled, 2, fp8),
    ] {
        let mut c = case(192, (8, 2), 16, &[(2, 300), (1, 17), (0, 5)]);
        (c.head_dim_v, c.kernel, c.num_splits, c.kv) = (Some(128), kernel, Some(splits), kv);
        let model = paged_prefill_short_chunk_bytes(&c).expect("short chunks without a window");
        let elem = kv.bytes() as u64;
        let want = (317 * 2 * 192 * elem, 317 * 2 * 128 * elem, 3 * 8 * 128 * 2);
        assert_eq!((model.k_bytes_read, model.v_bytes_read, model.o_bytes_written), want, "{}", c.label());
        let emu = Emulator::new();
        let run = ppc::run_case_emulated::<bf16>(&emu, &c, base_seed()).unwrap();
        assert!(run.outcome.passed(), "{}: {} ({})", c.label(), run.outcome.summary(), rerun("cost"));
        for (what, r) in model.ratios(&emu.last_launch_counters().unwrap()).unwrap() {
            if r != 1.0 {
                failures.push(format!("{}: {what} measured / model = {r}", c.label()));
            }
        }
    }
    // Append: 14 new tokens x 2 KV heads.
    for kv in [KvFormat::Sixteen, fp8] {
        let c = AppendCase {
            dtype: DType::Bf16,
            head_dim: 192,
            head_dim_v: Some(128),
            heads_kv: 2,
            page_size: 16,
            seqs: vec![(5, 20), (9, 9)],
            kv,
            rope: None,
        };
        let model = append_cost(&c);
        let cache = kv.kv_dtype(DType::Bf16).bytes() as u64;
        let want = (28 * 192 * 2, 28 * 128 * 2, 28 * 192 * cache, 28 * 128 * cache);
        let got = (model.k_bytes_read, model.v_bytes_read, model.k_cache_bytes_written, model.v_cache_bytes_written);
        assert_eq!(got, want, "{}", c.label());
        let emu = Emulator::new();
        let f = ac::AppendFixture::<bf16>::new(&c, base_seed()).unwrap();
        assert!(f.evaluate(&ac::run_emulated(&emu, &f).unwrap()).passed(), "{}", c.label());
        for (what, r) in model.ratios(&emu.last_launch_counters().unwrap()) {
            if r != 1.0 {
                failures.push(format!("{}: {what} measured / model = {r}", c.label()));
            }
        }
    }
    assert!(failures.is_empty(), "{} mismatches ({}):\n{}", failures.len(), rerun("cost"), failures.join("\n"));
}
