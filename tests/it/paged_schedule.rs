//! Paged prefill's streaming path on the work-list scheduler (issue 25): results against the fp64 reference
//! on skewed batches of short queries, balance and occupancy from the emulator's counters and the schedules,
//! a workspace made for the largest call scheduling each call as a fresh one would, the fixed-split-size
//! mode's batch invariance, and a reused (stale) workspace with NaN-poisoned partials. Emulated shapes are
//! small (the emulator runs every CTA) on 12-16 CTA slots; production shapes (a 128k sequence among 63 of
//! 1k at q_len 4) are checked on the schedules, whose per-CTA key counts are what the kernel streams.

use crate::common;

use fused_attn::counters::KernelCounters;
use fused_attn::paged_prefill::{PagedPrefillOptions, PagedPrefillProblem, PagedPrefillWorkspace};
use fused_attn::schedule::{
    schedule_short_queries, short_query_unit_keys, DecodeSchedule, ShortQueryShape, SplitPolicy,
};
use fused_attn::testkit::cases::paged_prefill::{
    case, evaluate, scheduled_paged_prefill_sweep, CaseSchedule, PagedPrefillCase, PagedPrefillFixture,
};
use fused_attn::{DType, Emulator, ErrorKind, PagedPrefillKernel, Stream};
use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A bf16 streaming case scheduled by `policy` on `slots` CTA slots.
fn scheduled(c: PagedPrefillCase, policy: SplitPolicy, slots: usize) -> PagedPrefillCase {
    PagedPrefillCase {
        schedule: Some(CaseSchedule { policy, slots: Some(slots) }),
        kernel: PagedPrefillKernel::Streaming,
        ..c
    }
}

/// Runs `f` on `ws` on the emulator, checks it against the fp64 reference, and returns the decode kernel's
/// counters, the outputs and the schedule it ran.
fn run(
    emu: &Emulator,
    f: &PagedPrefillFixture<bf16>,
    ws: &mut PagedPrefillWorkspace,
) -> (KernelCounters, Vec<bf16>, Vec<f32>, DecodeSchedule) {
    let (o, lse, plan) = f.run_in(&Stream::Emu(emu), None, ws).unwrap();
    let outcome = evaluate(f, common::base_seed(), plan, &o, &lse).unwrap();
    assert!(outcome.passed(), "{}: {}", f.case.label(), outcome.summary());
    let counters = emu.last_launch_counters().unwrap();
    let k = counters.kernel("paged_decode").expect("the streaming kernel ran").clone();
    (k, o, lse, ws.schedule().expect("a scheduled call").clone())
}

/// Every case of the scheduled sweep against the fp64 reference (outputs NaN-poisoned, the emulator's
/// partials NaN before each launch), each with its long sequences cut and merged per query row.
#[test]
fn scheduled_streaming_matches_the_reference_on_skewed_batches() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let cases: Vec<(usize, PagedPrefillCase)> = scheduled_paged_prefill_sweep().into_iter().enumerate().collect();
    common::sweep_in_order(
        "paged_schedule",
        "scheduled_streaming_matches_the_reference_on_skewed_batches",
        &cases,
        PagedPrefillCase::label,
        |i, c| {
            assert_eq!(c.dtype, DType::Bf16);
            let seed = common::case_seed(i);
            let f = PagedPrefillFixture::<bf16>::new(c, seed);
            let mut ws = c.workspace(&stream, None).unwrap();
            let (o, lse, plan) = f.run_in(&stream, None, &mut ws).unwrap();
            let outcome = evaluate(&f, seed, plan, &o, &lse).unwrap();
            let s = ws.schedule().expect("scheduled");
            let cut = s.splits.iter().filter(|x| x.0 > 1).count();
            let rows: usize = s.merge_rows.len();
            (
                outcome.passed() && cut > 0 && plan.kernel() == PagedPrefillKernel::Streaming,
                format!("{} ({cut} sequences cut, {rows} rows merged, {} CTAs)", outcome.summary(), s.num_ctas()),
            )
        },
    );
}

/// A skewed batch on a 16-slot GPU: every slot busy, the heaviest CTA's reads within 1.25 of the mean
/// (the emulator's counters: every byte a CTA reads, Q and the tables included), only the long sequences
/// merged, one merge row per query token of theirs. G = 4 (one row block of 16 packed rows per KV head)
/// and G = 8 (two).
#[test]
fn skewed_short_queries_are_balanced_on_the_emulator() {
    let emu = Emulator::new();
    for (heads, q_len) in [((8, 2), 4), ((16, 2), 4)] {
        let mut seqs = vec![(q_len, 4096)];
        seqs.extend([(q_len, 256); 7]);
        let c = scheduled(case(64, heads, 16, &seqs), SplitPolicy::Balanced, 16);
        let f = PagedPrefillFixture::<bf16>::new(&c, common::base_seed());
        let mut ws = c.workspace(&Stream::Emu(&emu), None).unwrap();
        let (k, _, _, s) = run(&emu, &f, &mut ws);
        assert_eq!(k.blocks, 16, "the grid is one CTA per slot");
        assert_eq!((k.active_blocks, s.num_ctas()), (16, 16), "{k}");
        assert!(k.read_imbalance() <= 1.25, "{}: {k}", c.label());
        assert!(s.imbalance() <= 1.25, "{}: {s:?}", c.label());
        let cut: Vec<usize> = s.splits.iter().map(|x| x.0).collect();
        assert!(cut[0] > 1 && cut[1..].iter().all(|&n| n == 1), "only the long sequence is cut: {cut:?}");
        let rows: Vec<i32> = s.merge_rows.iter().map(|r| r.out_row).collect();
        assert_eq!(rows, (0..q_len as i32).collect::<Vec<_>>());
        let merge = emu.last_launch_counters().unwrap();
        let merge = merge.kernel("merge_states").unwrap();
        // The merge writes exactly the long sequence's rows (Hq heads × 64 bf16 each).
        assert_eq!(merge.written_of("o"), (q_len * heads.0 * 64 * 2) as u64, "{merge}");
    }
}

/// Production skew, on the schedules (Hq 32 / 64, Hkv 8, q_len 4: one and two row blocks per KV head): one
/// 128k sequence among 63 of 1k, and lengths from a long-tailed (Pareto) draw, on an H100's 396, 264 and
/// 132 slots: the heaviest CTA within 1.25 of the mean and every slot given work; with a window (gpt-oss:
/// 128) every slot given work, nothing cut, and no unit without keys.
#[test]
fn production_skew_is_balanced() {
    let mut skew = vec![131072];
    skew.extend([1024; 63]);
    let mut rng = StdRng::seed_from_u64(common::base_seed());
    let tail: Vec<i32> =
        (0..64).map(|_| (128.0 / (1.0 - rng.random::<f64>()).powf(1.0 / 1.2)).clamp(4.0, 131072.0) as i32).collect();
    let cu: Vec<i32> = (0..=64).map(|b| 4 * b).collect();
    for heads_q in [32, 64] {
        for (name, lens) in [("128k + 63 x 1k", &skew), ("long-tailed", &tail)] {
            for window in [None, Some((128, -1))] {
                let shape =
                    ShortQueryShape { heads_q, heads_kv: 8, head_dim: 128, max_seqlen_q: 4, window, causal: true };
                for slots in [396, 264, 132] {
                    let s = schedule_short_queries(&shape, &cu, lens, slots, SplitPolicy::Balanced).unwrap();
                    let what = format!("Hq {heads_q} {name} window {window:?} on {slots} slots");
                    assert_eq!(s.num_ctas(), slots, "{what}");
                    if window.is_none() {
                        assert!(s.imbalance() <= 1.25, "{what}: imbalance {}", s.imbalance());
                        assert!(s.slot_efficiency() >= 0.8, "{what}: {}", s.slot_efficiency());
                    } else {
                        // Every row block reads ~130 keys, under the smallest chunk: 512 or 1024 equal units,
                        // no cut (wave quantisation is all that is left), and none without keys.
                        assert_eq!(s.num_partials, 0, "{what}");
                        assert!(
                            s.work.iter().all(|w| short_query_unit_keys(&shape, 4, lens[w.b as usize] as usize, w) > 0),
                            "{what}: a unit without keys"
                        );
                    }
                }
            }
        }
    }
}

/// gpt-oss spec-verify under a window (q_len 4, 32k context, window 128, G = 8) on an H100's 396 slots:
/// the 32 packed rows of a KV head are one CTA (two row groups at D 128), which reads 132 keys (4 tokens'
/// windows of 129, one apart), so nothing is cut, and no CTA's keys lie outside the window; on the emulator
/// (8k, 16 slots) every CTA reads only the window's keys.
#[test]
fn windowed_spec_verify_is_not_cut() {
    let shape = ShortQueryShape {
        heads_q: 64,
        heads_kv: 8,
        head_dim: 128,
        max_seqlen_q: 4,
        window: Some((128, -1)),
        causal: true,
    };
    let s = schedule_short_queries(&shape, &[0, 4], &[32768], 396, SplitPolicy::Balanced).unwrap();
    assert_eq!((s.max_splits(), s.num_partials, s.work.len()), (1, 0, 8), "{s:?}");
    assert!(s.cta_tokens.iter().all(|&t| t == 132), "{:?}", s.cta_tokens);

    let emu = Emulator::new();
    let mut c = scheduled(case(64, (16, 2), 16, &[(4, 8192)]), SplitPolicy::Balanced, 16);
    c.variants.window = Some((128, 0));
    let f = PagedPrefillFixture::<bf16>::new(&c, common::base_seed());
    let mut ws = c.workspace(&Stream::Emu(&emu), None).unwrap();
    let (k, _, _, s) = run(&emu, &f, &mut ws);
    assert_eq!((s.num_ctas() as u64, s.num_partials), (k.active_blocks, 0), "{k}");
    // 2 KV heads, each one CTA of 32 rows (D 64) reading its 132 keys.
    assert_eq!(k.read_of("k_cache"), 2 * 132 * 64 * 2, "{k}");
}

/// A workspace made for the largest call (batch 8, 32 query rows, q_len 8, 4k contexts) gives a batch of
/// one long sequence and a full batch of short ones the CTAs, per-CTA reads and results a workspace made
/// for that call gives; and on production limits (B = 64, q_len 8, 32k) batch 1 / 32k and batch 64 / 1k
/// get the fresh schedule.
#[test]
fn a_workspace_for_the_limits_plans_each_call_fresh() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let limits = PagedPrefillProblem {
        batch: 8,
        heads_q: 8,
        heads_kv: 2,
        head_dim: 64,
        total_q: 32,
        max_seqlen_q: 8,
        max_seq_len: 4096,
    };
    let mut pinned = PagedPrefillWorkspace::scheduled_on(&stream, &limits, SplitPolicy::Balanced, 16).unwrap();
    for seqs in [vec![(4, 4096)], vec![(4, 256); 8]] {
        let c = scheduled(case(64, (8, 2), 16, &seqs), SplitPolicy::Balanced, 16);
        let f = PagedPrefillFixture::<bf16>::new(&c, common::base_seed());
        let mut fresh = c.workspace(&stream, None).unwrap();
        let (a, oa, la, sa) = run(&emu, &f, &mut pinned);
        let (b, ob, lb, sb) = run(&emu, &f, &mut fresh);
        assert_eq!(
            (a.active_blocks, a.max_block_bytes_read, a.active_bytes_read),
            (b.active_blocks, b.max_block_bytes_read, b.active_bytes_read),
            "{}: pinned {a} vs fresh {b}",
            c.label()
        );
        assert_eq!((sa.num_ctas(), &sa.cta_tokens, &sa.splits), (sb.num_ctas(), &sb.cta_tokens, &sb.splits));
        assert!(a.active_blocks >= 14 && a.read_imbalance() <= 1.25, "{}: {a}", c.label());
        let bits = |o: &[bf16]| o.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&oa), bits(&ob), "{}", c.label());
        assert_eq!(
            la.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            lb.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }
    let big = ShortQueryShape { heads_q: 32, heads_kv: 8, head_dim: 128, max_seqlen_q: 8, window: None, causal: true };
    for (q_len, lens) in [(4, vec![32768]), (4, vec![1024; 64]), (8, vec![1024; 64])] {
        let cu: Vec<i32> = (0..=lens.len() as i32).map(|b| q_len * b).collect();
        let call = ShortQueryShape { max_seqlen_q: q_len as usize, ..big };
        let a = schedule_short_queries(&big, &cu, &lens, 396, SplitPolicy::Balanced).unwrap();
        let b = schedule_short_queries(&call, &cu, &lens, 396, SplitPolicy::Balanced).unwrap();
        assert_eq!((a.num_ctas(), &a.cta_tokens, &a.splits), (b.num_ctas(), &b.cta_tokens, &b.splits));
        assert!(a.num_ctas() >= 370 && a.imbalance() <= 1.25, "{} CTAs, {}", a.num_ctas(), a.imbalance());
    }
}

/// Fixed split size: a sequence's bits are the same alone and among others (other lengths, other q_lens,
/// another slot count), with a window too; and when a longer query in the batch makes the launch's CTAs
/// wide (q_len 20 x G 4 = 80 rows: 8 warps, 128 rows per CTA at D 64) while the target's 20 rows alone run
/// in a narrow one.
#[test]
fn fixed_split_size_is_batch_invariant() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let policy = SplitPolicy::FixedSplitTokens(256);
    for (window, other_q) in [(None, 8), (Some((700, 0)), 8), (None, 20)] {
        let (target, b2) = ((5, 1500), 2);
        let mut alone = scheduled(case(64, (8, 2), 16, &[target]), policy, 8);
        let mut batch = scheduled(case(64, (8, 2), 16, &[(3, 700), (other_q, 2048), target, (1, 33)]), policy, 16);
        alone.variants.window = window;
        batch.variants.window = window;
        let fb = PagedPrefillFixture::<bf16>::new(&batch, common::base_seed());
        let mut fa = PagedPrefillFixture::<bf16>::new(&alone, common::base_seed());
        // The same data for the target: its q rows and its K/V rows copied from the batch's fixture.
        let (hq, hkv, d, ps) = (8, 2, 64, 16);
        let q0 = fb.cu_seqlens_q[b2] as usize;
        fa.q.copy_from_slice(&fb.q[q0 * hq * d..(q0 + target.0) * hq * d]);
        let slot = |f: &PagedPrefillFixture<bf16>, b: usize, t: usize| {
            f.block_table[b * f.width + t / ps] as usize * ps + t % ps
        };
        for t in 0..target.1 {
            let (src, dst) = (slot(&fb, b2, t) * hkv * d, slot(&fa, 0, t) * hkv * d);
            fa.k_cache[dst..dst + hkv * d].copy_from_slice(&fb.k_cache[src..src + hkv * d]);
            fa.v_cache[dst..dst + hkv * d].copy_from_slice(&fb.v_cache[src..src + hkv * d]);
        }
        let mut wa = alone.workspace(&stream, None).unwrap();
        let mut wb = batch.workspace(&stream, None).unwrap();
        let (ka, oa, la, sa) = run(&emu, &fa, &mut wa);
        let (kb, ob, lb, sb) = run(&emu, &fb, &mut wb);
        assert_eq!((ka.block_threads, kb.block_threads), (128, if other_q == 20 { 256 } else { 128 }));
        assert_eq!(sa.splits[0], sb.splits[b2]);
        assert!(sa.splits[0].0 > 1, "the target is cut: {:?}", sa.splits);
        let bits = |o: &[bf16]| o.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&oa), bits(&ob[q0 * hq * d..(q0 + target.0) * hq * d]), "window {window:?}");
        // LSE [Hq, total_q]: the target's columns of each head.
        let total = batch.total_q();
        for h in 0..hq {
            let want: Vec<u32> = lb[h * total + q0..h * total + q0 + target.0].iter().map(|x| x.to_bits()).collect();
            let got: Vec<u32> = la[h * target.0..(h + 1) * target.0].iter().map(|x| x.to_bits()).collect();
            assert_eq!(got, want, "window {window:?} head {h}");
        }
    }
}

/// One workspace reused across calls of different shapes (a long skewed batch, a short one, a batch of
/// one, the first again): its table and partials hold the previous call's schedule and states (and the
/// emulator poisons the partials with NaN before every launch), and every call is still right.
#[test]
fn a_reused_workspace_leaves_nothing_stale() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let limits = PagedPrefillProblem {
        batch: 6,
        heads_q: 8,
        heads_kv: 2,
        head_dim: 64,
        total_q: 30,
        max_seqlen_q: 8,
        max_seq_len: 3000,
    };
    let mut ws = PagedPrefillWorkspace::scheduled_on(&stream, &limits, SplitPolicy::Balanced, 12).unwrap();
    let calls = [
        vec![(8, 3000), (2, 40), (5, 900), (8, 1200), (1, 7), (6, 2)],
        vec![(1, 100), (3, 64)],
        vec![(8, 2900)],
        vec![(8, 3000), (2, 40), (5, 900), (8, 1200), (1, 7), (6, 2)],
    ];
    let mut merged = 0;
    for seqs in calls {
        let c = scheduled(case(64, (8, 2), 16, &seqs), SplitPolicy::Balanced, 12);
        let f = PagedPrefillFixture::<bf16>::new(&c, common::base_seed() ^ seqs.len() as u64);
        let (_, _, _, s) = run(&emu, &f, &mut ws);
        merged += s.merge_rows.len();
    }
    assert!(merged > 0);
}

/// Bad calls on a scheduled workspace, by kind: a forced split count (`Usage`), a batch, query rows or a
/// q_len past the limits (`Shape`), contexts whose fixed-size chunks overflow the room (`OutOfBounds`),
/// `prepare` on a workspace that is not scheduled (`Usage`); the tiled kernel on it runs the uniform plan.
#[test]
fn scheduled_workspace_bad_calls() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let limits = PagedPrefillProblem {
        batch: 2,
        heads_q: 8,
        heads_kv: 2,
        head_dim: 64,
        total_q: 8,
        max_seqlen_q: 4,
        max_seq_len: 1024,
    };
    let policy = SplitPolicy::FixedSplitTokens(256);
    let mut ws = PagedPrefillWorkspace::scheduled_on(&stream, &limits, policy, 8).unwrap();
    let kind = |c: PagedPrefillCase, ws: &mut PagedPrefillWorkspace| {
        let f = PagedPrefillFixture::<bf16>::new(&c, 1);
        f.run_in(&stream, c.num_splits, ws).map(|_| ()).map_err(|e| e.kind().clone())
    };
    let ok = scheduled(case(64, (8, 2), 16, &[(4, 1024), (4, 100)]), policy, 8);
    assert_eq!(kind(ok.clone(), &mut ws), Ok(()));
    assert_eq!(kind(PagedPrefillCase { num_splits: Some(2), ..ok.clone() }, &mut ws), Err(ErrorKind::Usage));
    assert_eq!(kind(scheduled(case(64, (8, 2), 16, &[(1, 10); 3]), policy, 8), &mut ws), Err(ErrorKind::Shape));
    assert_eq!(kind(scheduled(case(64, (8, 2), 16, &[(5, 10)]), policy, 8), &mut ws), Err(ErrorKind::Shape));
    assert_eq!(kind(scheduled(case(64, (8, 4), 16, &[(4, 10)]), policy, 8), &mut ws), Err(ErrorKind::Shape));
    assert_eq!(
        kind(scheduled(case(64, (8, 2), 16, &[(4, 1500), (4, 1500)]), policy, 8), &mut ws),
        Err(ErrorKind::OutOfBounds)
    );
    // The tiled kernel on a scheduled workspace: a uniform plan within its room, right answers.
    let tiled = PagedPrefillCase { kernel: PagedPrefillKernel::Tiled, ..ok.clone() };
    let f = PagedPrefillFixture::<bf16>::new(&tiled, 2);
    let (o, lse, plan) = f.run_in(&stream, None, &mut ws).unwrap();
    assert_eq!(plan.kernel(), PagedPrefillKernel::Tiled);
    assert!(evaluate(&f, 2, plan, &o, &lse).unwrap().passed());
    // prepare on a uniform workspace; a workspace for a GQA ratio the kernel cannot take.
    let mut uniform = PagedPrefillWorkspace::with_capacity(&stream, 8, 8, 64, 4).unwrap();
    let err = uniform.prepare(&stream, &[0, 4], &[100], &PagedPrefillOptions::default()).unwrap_err();
    assert_eq!(err.kind(), &ErrorKind::Usage);
    let bad = PagedPrefillProblem { heads_q: 6, heads_kv: 4, ..limits };
    assert_eq!(
        PagedPrefillWorkspace::scheduled_on(&stream, &bad, policy, 8).err().map(|e| e.kind().clone()),
        Some(ErrorKind::Shape)
    );
}

/// The makespan, in keys (with `UNIT_OVERHEAD_TOKENS` per CTA), of the streaming kernel's uniform grid of
/// `plan` (splits fastest, then KV head × row block, then sequence) in the dispatch model of
/// `fused_attn::schedule::uniform_makespan`: each CTA onto the slot that frees first; plus
/// `MERGE_OVERHEAD_TOKENS` when it splits (its merge, as the schedule's makespan counts one). A CTA past its
/// sequence's rows costs nothing (it exits at once).
fn uniform_short_query_makespan(
    shape: &ShortQueryShape,
    plan: &fused_attn::paged_prefill::PagedPrefillPlan,
    cu: &[i32],
    lens: &[i32],
    slots: usize,
) -> u64 {
    use fused_attn::schedule::{MERGE_OVERHEAD_TOKENS, UNIT_OVERHEAD_TOKENS};
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let mut heap: BinaryHeap<Reverse<u64>> = (0..slots).map(|_| Reverse(0)).collect();
    let mut makespan = 0;
    for (b, &len) in lens.iter().enumerate() {
        let q_len = (cu[b + 1] - cu[b]) as usize;
        for y in 0..shape.heads_kv * shape.row_blocks() {
            if fused_attn::schedule::short_query_key_range(shape, q_len, len as usize, y % shape.row_blocks()).is_none()
            {
                continue;
            }
            for s in 0..plan.num_splits() {
                let w = fused_attn::sys::FaDecodeWork {
                    b: b as i32,
                    head_block: y as i32,
                    split: s as i32,
                    num_splits: plan.num_splits() as i32,
                    split_tokens: plan.split_tokens() as i32,
                    partial_base: 0,
                };
                let keys = short_query_unit_keys(shape, q_len, len as usize, &w) as u64;
                let Reverse(free) = heap.pop().expect("a slot");
                let done = free + keys + UNIT_OVERHEAD_TOKENS;
                makespan = makespan.max(done);
                heap.push(Reverse(done));
            }
        }
    }
    makespan + if plan.num_splits() > 1 { MERGE_OVERHEAD_TOKENS } else { 0 }
}

/// The predictions docs/scheduling.md quotes for short queries (q_len 4, D = 128, Hkv = 8, an H100's 396
/// slots): per shape, the schedule's CTAs, balance and makespan against the uniform streaming plan's (made
/// for the call, and one made for B = 64 / 128k limits), in the dispatch model. Printed with --nocapture.
#[test]
fn predictions_per_shape() {
    use fused_attn::paged_prefill::{PagedPrefillKernel as K, PagedPrefillPlan};
    use fused_attn::schedule::schedule_makespan;
    let slots = 396;
    let mut skew = vec![131072];
    skew.extend([1024; 63]);
    // (name, Hq, seq_lens, window)
    type Shape = (&'static str, usize, Vec<i32>, Option<(i32, i32)>);
    let shapes: Vec<Shape> = vec![
        ("B=1 32k", 32, vec![32768], None),
        ("B=64 1k", 32, vec![1024; 64], None),
        ("B=64 4k", 32, vec![4096; 64], None),
        ("128k + 63x1k", 32, skew.clone(), None),
        ("128k + 63x1k G=8", 64, skew, None),
        ("B=64 32k w128 G=8", 64, vec![32768; 64], Some((128, -1))),
    ];
    for (name, heads_q, lens, window) in shapes {
        let shape = ShortQueryShape { heads_q, heads_kv: 8, head_dim: 128, max_seqlen_q: 4, window, causal: true };
        let cu: Vec<i32> = (0..=lens.len() as i32).map(|b| 4 * b).collect();
        let s = schedule_short_queries(&shape, &cu, &lens, slots, SplitPolicy::Balanced).unwrap();
        // Host cost of one schedule (the mean of 20; a shared machine's, so indicative only).
        let start = std::time::Instant::now();
        for _ in 0..20 {
            std::hint::black_box(schedule_short_queries(&shape, &cu, &lens, slots, SplitPolicy::Balanced).unwrap());
        }
        let host_us = start.elapsed().as_secs_f64() * 1e6 / 20.0;
        // The decode schedule of the same lengths, timed alike (its units: one per KV head × head block).
        let decode = fused_attn::DecodeProblem {
            batch: lens.len(),
            heads_q,
            heads_kv: 8,
            head_dim: 128,
            max_seq_len: *lens.iter().max().unwrap() as usize,
        };
        let window_left = window.map(|w| w.0 as usize);
        let start = std::time::Instant::now();
        for _ in 0..20 {
            std::hint::black_box(
                fused_attn::schedule::schedule_decode(&decode, &lens, window_left, slots, SplitPolicy::Balanced)
                    .unwrap(),
            );
        }
        let decode_us = start.elapsed().as_secs_f64() * 1e6 / 20.0;
        let problem = |batch: usize, max_seq_len: usize| {
            PagedPrefillProblem {
                batch,
                heads_q,
                heads_kv: 8,
                head_dim: 128,
                total_q: 4 * batch,
                max_seqlen_q: 4,
                max_seq_len,
            }
            .windowed_for(window, true, K::Streaming)
        };
        let longest = *lens.iter().max().unwrap() as usize;
        let fresh = PagedPrefillPlan::for_kernel(&problem(lens.len(), longest), K::Streaming, slots, None).unwrap();
        let pinned = PagedPrefillPlan::for_kernel(&problem(64, 131072), K::Streaming, slots, None).unwrap();
        let (ms, mf, mp) = (
            schedule_makespan(&s),
            uniform_short_query_makespan(&shape, &fresh, &cu, &lens, slots),
            uniform_short_query_makespan(&shape, &pinned, &cu, &lens, slots),
        );
        println!(
            "{name:>18}: {} CTAs, {} units, max/mean {:.3}, longest cut {:?}, {} rows merged; makespan {ms}; \
             uniform fresh plan ({} splits) {mf} ({:.2}x), pinned B=64/128k plan ({} splits) {mp} ({:.2}x); \
             host {host_us:.0} us (decode of the same lengths {decode_us:.0} us)",
            s.num_ctas(),
            s.work.len(),
            s.imbalance(),
            s.splits.iter().max_by_key(|x| x.0).unwrap(),
            s.merge_rows.len(),
            fresh.num_splits(),
            mf as f64 / ms as f64,
            pinned.num_splits(),
            mp as f64 / ms as f64
        );
        assert!(ms as f64 <= 1.05 * mf.min(mp) as f64, "{name}: the schedule is not slower in the model");
    }
}
