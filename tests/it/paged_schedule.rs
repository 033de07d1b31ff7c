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
                outcome.passed() && cut > 0 && plan.kernel == PagedPrefillKernel::Streaming,
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
                let shape = ShortQueryShape { heads_q, heads_kv: 8, max_seqlen_q: 4, window, causal: true };
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
/// each row block reads 132 keys, so nothing is cut, and no CTA's keys lie outside the window; on the
/// emulator (8k, 16 slots) every CTA reads only the window's keys.
#[test]
fn windowed_spec_verify_is_not_cut() {
    let shape = ShortQueryShape { heads_q: 64, heads_kv: 8, max_seqlen_q: 4, window: Some((128, -1)), causal: true };
    let s = schedule_short_queries(&shape, &[0, 4], &[32768], 396, SplitPolicy::Balanced).unwrap();
    assert_eq!((s.max_splits(), s.num_partials, s.work.len()), (1, 0, 16), "{s:?}");
    // Each row block: 2 tokens' windows of 129 keys, one apart.
    assert!(s.cta_tokens.iter().all(|&t| t == 130), "{:?}", s.cta_tokens);

    let emu = Emulator::new();
    let mut c = scheduled(case(64, (16, 2), 16, &[(4, 8192)]), SplitPolicy::Balanced, 16);
    c.variants.window = Some((128, 0));
    let f = PagedPrefillFixture::<bf16>::new(&c, common::base_seed());
    let mut ws = c.workspace(&Stream::Emu(&emu), None).unwrap();
    let (k, _, _, s) = run(&emu, &f, &mut ws);
    assert_eq!((s.num_ctas() as u64, s.num_partials), (k.active_blocks, 0), "{k}");
    // 2 KV heads × 2 row blocks, each reading its 130 keys.
    assert_eq!(k.read_of("k_cache"), 2 * 2 * 130 * 64 * 2, "{k}");
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
    let big = ShortQueryShape { heads_q: 32, heads_kv: 8, max_seqlen_q: 8, window: None, causal: true };
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
/// another slot count), with a window too.
#[test]
fn fixed_split_size_is_batch_invariant() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let policy = SplitPolicy::FixedSplitTokens(256);
    for window in [None, Some((700, 0))] {
        let (target, b2) = ((5, 1500), 2);
        let mut alone = scheduled(case(64, (8, 2), 16, &[target]), policy, 8);
        let mut batch = scheduled(case(64, (8, 2), 16, &[(3, 700), (8, 2048), target, (1, 33)]), policy, 16);
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
        let (_, oa, la, sa) = run(&emu, &fa, &mut wa);
        let (_, ob, lb, sb) = run(&emu, &fb, &mut wb);
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
    assert_eq!(plan.kernel, PagedPrefillKernel::Tiled);
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
