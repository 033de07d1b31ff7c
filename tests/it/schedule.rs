//! Scheduled decode (fused_attn::schedule) and windowed paged prefill on the emulator: results against the
//! fp64 reference, balance and occupancy from the counters (per-CTA bytes read, CTAs with work), a
//! workspace made for the largest batch planning each call as a fresh one would, and the fixed-split-size
//! mode's batch invariance. Shapes are small (the emulator runs every CTA); the balance of production shapes
//! (a 128k sequence among 1k ones, long-tailed draws) is checked on the schedules themselves, whose per-CTA
//! token counts are what the kernel streams.

use fused_attn::counters::KernelCounters;
use fused_attn::schedule::{schedule_decode, SplitPolicy};
use fused_attn::testkit::cases::decode::{run_emulated_on, DecodeCase, PagedFixture};
use fused_attn::testkit::cases::kv::KvFormat;
use fused_attn::testkit::cases::paged_prefill::{PagedPrefillCase, PagedPrefillFixture};
use fused_attn::{DType, DecodeProblem, DecodeWorkspace, Emulator, PagedPrefillKernel, Stream};
use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SEED: u64 = 0x5c4e_d01e;

fn case(heads_q: usize, heads_kv: usize, seq_lens: Vec<usize>, window: Option<i32>) -> DecodeCase {
    let mut c = DecodeCase::new(DType::Bf16, 128, (heads_q, heads_kv), 16, &seq_lens, None);
    c.variants.window = window.map(|w| (w, 0));
    c
}

fn limits(c: &DecodeCase, batch: usize, max_seq_len: usize) -> DecodeProblem {
    DecodeProblem { batch, heads_q: c.heads_q, heads_kv: c.heads_kv, head_dim: c.head_dim, max_seq_len }
}

/// Runs `c` on `ws`; checks it against the reference and returns the decode kernel's counters.
fn run(emu: &Emulator, c: &DecodeCase, ws: &mut DecodeWorkspace) -> (KernelCounters, Vec<bf16>, Vec<f32>) {
    let f = PagedFixture::<bf16>::new(c, SEED).unwrap();
    let r = run_emulated_on(emu, &f, SEED, Some(ws)).unwrap();
    assert!(r.outcome.passed(), "{}: {}", c.label(), r.outcome.summary());
    let counters = emu.last_launch_counters().unwrap();
    (counters.kernel("paged_decode").unwrap().clone(), r.o, r.lse)
}

/// A skewed batch on a 16-slot GPU: right answers, every slot busy, the heaviest CTA's reads within 1.25
/// of the mean, and only the split sequences merged.
#[test]
fn skewed_batches_are_balanced_and_right() {
    let emu = Emulator::new();
    let c = case(8, 2, vec![3000, 64, 0, 200, 1029, 5], None);
    let mut ws =
        DecodeWorkspace::scheduled_on(&Stream::Emu(&emu), &limits(&c, 8, 4096), SplitPolicy::Balanced, 16).unwrap();
    let (k, _, _) = run(&emu, &c, &mut ws);
    let s = ws.schedule().unwrap();
    assert_eq!(k.blocks, 16, "the grid is one CTA per slot");
    assert_eq!(k.active_blocks, s.num_ctas() as u64);
    assert_eq!(k.active_blocks, 16, "{k}");
    assert!(k.read_imbalance() <= 1.25, "{k}");
    assert!(s.imbalance() <= 1.25, "{s:?}");
    let split: Vec<usize> = s.merge_rows.iter().map(|r| r.out_row as usize).collect();
    assert_eq!(split, [0, 4], "only the long sequences are cut: {:?}", s.splits);
    let merge = emu.last_launch_counters().unwrap();
    let merge = merge.kernel("merge_states").unwrap();
    // The merge writes exactly the split sequences' rows (8 heads × 128 bf16 + LSE each).
    assert_eq!(merge.written_of("o"), 2 * 8 * 128 * 2, "{merge}");
}

/// MQA 64:1 at D 128 on a scheduled workspace: wide CTAs (8 warps, the 64 query heads of the KV head in
/// one CTA), cut and balanced over the slots like any batch, right against the reference, and each visible
/// token's K and V rows read once for all 64 heads (they would be read twice by two 32-row CTAs).
#[test]
fn scheduled_mqa_runs_wide_ctas_reading_the_kv_head_once() {
    let emu = Emulator::new();
    let lens = vec![2000, 64, 0, 700, 5];
    let c = case(64, 1, lens.clone(), None);
    let mut ws =
        DecodeWorkspace::scheduled_on(&Stream::Emu(&emu), &limits(&c, 8, 4096), SplitPolicy::Balanced, 8).unwrap();
    let (k, _, _) = run(&emu, &c, &mut ws);
    let s = ws.schedule().unwrap();
    assert_eq!((k.blocks, k.block_threads), (8, 256), "{k}");
    assert_eq!(k.active_blocks, s.num_ctas() as u64);
    assert!(s.imbalance() <= 1.25, "{s:?}");
    let kv_bytes = lens.iter().sum::<usize>() as u64 * 128 * 2;
    assert_eq!((k.read_of("k_cache"), k.read_of("v_cache")), (kv_bytes, kv_bytes), "{k}");
}

/// The same workspace, made for the largest batch and the longest context, gives a batch of one long
/// sequence and a full batch of short ones the CTAs and balance a workspace made for that call gives.
#[test]
fn a_workspace_for_the_limits_plans_each_call_fresh() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let long = case(8, 2, vec![4096], None);
    let short = case(8, 2, vec![256; 8], None);
    let mut pinned =
        DecodeWorkspace::scheduled_on(&stream, &limits(&long, 8, 4096), SplitPolicy::Balanced, 16).unwrap();
    for c in [&long, &short] {
        let mut fresh =
            DecodeWorkspace::scheduled_on(&stream, &limits(c, c.batch(), c.max_seq_len()), SplitPolicy::Balanced, 16)
                .unwrap();
        let (a, _, _) = run(&emu, c, &mut pinned);
        let (b, _, _) = run(&emu, c, &mut fresh);
        assert_eq!(
            (a.active_blocks, a.max_block_bytes_read, a.active_bytes_read),
            (b.active_blocks, b.max_block_bytes_read, b.active_bytes_read),
            "{}: pinned {a} vs fresh {b}",
            c.label()
        );
        assert!(a.active_blocks >= 14, "{}: {a}", c.label());
        assert!(a.read_imbalance() <= 1.25, "{}: {a}", c.label());
    }
    // The production shapes (B = 64, 32k limits on an H100's 396 slots): batch 1 / 32k and batch 64 / 1k get
    // the fresh schedule's CTAs and balance (the schedule is the same function of the call's lengths).
    let big = DecodeProblem { batch: 64, heads_q: 32, heads_kv: 8, head_dim: 128, max_seq_len: 32768 };
    for lens in [vec![32768], vec![1024; 64]] {
        let call = DecodeProblem { batch: lens.len(), ..big };
        let a = schedule_decode(&big, &lens, None, 396, SplitPolicy::Balanced).unwrap();
        let b = schedule_decode(&call, &lens, None, 396, SplitPolicy::Balanced).unwrap();
        assert_eq!((a.num_ctas(), &a.cta_tokens), (b.num_ctas(), &b.cta_tokens));
        assert!(a.num_ctas() >= 370 && a.imbalance() <= 1.25, "{} CTAs, {}", a.num_ctas(), a.imbalance());
    }
}

/// Production-size skew, on the schedules: one 128k sequence among 63 of 1k, and lengths from a
/// long-tailed (Pareto) draw: the heaviest CTA within 1.25 of the mean and the slots filled.
#[test]
fn production_skew_is_balanced() {
    let p = DecodeProblem { batch: 64, heads_q: 32, heads_kv: 8, head_dim: 128, max_seq_len: 131072 };
    let mut lens = vec![131072];
    lens.extend([1024; 63]);
    let mut rng = StdRng::seed_from_u64(SEED);
    let tail: Vec<i32> =
        (0..64).map(|_| (128.0 / (1.0 - rng.random::<f64>()).powf(1.0 / 1.2)).min(131072.0) as i32).collect();
    for lens in [lens, tail] {
        for slots in [396, 264, 132] {
            let s = schedule_decode(&p, &lens, None, slots, SplitPolicy::Balanced).unwrap();
            assert!(s.imbalance() <= 1.25, "{slots} slots {lens:?}: imbalance {}", s.imbalance());
            assert!(s.num_ctas() == slots, "{slots} slots: {} CTAs", s.num_ctas());
            assert!(s.slot_efficiency() >= 0.8, "{slots} slots: {}", s.slot_efficiency());
        }
    }
}

/// Fixed split size: a sequence's bits are the same alone and among others, with a window too.
#[test]
fn fixed_split_size_is_batch_invariant_with_windows() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    for window in [None, Some(700)] {
        let alone = case(8, 2, vec![1500], window);
        let batch = case(8, 2, vec![700, 2048, 1500, 33], window);
        let policy = SplitPolicy::FixedSplitTokens(256);
        let mut ws = DecodeWorkspace::scheduled_on(&stream, &limits(&batch, 4, 2048), policy, 16).unwrap();
        // The same data for the target: a fixture's K/V/Q depend on the seed and the sequence's position, so
        // build the batch's fixture and run the target's rows alone by copying them into a batch of one.
        let fb = PagedFixture::<bf16>::new(&batch, SEED).unwrap();
        let mut fa = PagedFixture::<bf16>::new(&alone, SEED).unwrap();
        let (b2, hq, d) = (2, 8, 128);
        fa.q.copy_from_slice(&fb.q[b2 * hq * d..(b2 + 1) * hq * d]);
        for t in 0..1500 {
            for h in 0..2 {
                let (src, dst) = ((fb.slot(b2, t) * 2 + h) * d, (fa.slot(0, t) * 2 + h) * d);
                fa.k_cache[dst..dst + d].copy_from_slice(&fb.k_cache[src..src + d]);
                fa.v_cache[dst..dst + d].copy_from_slice(&fb.v_cache[src..src + d]);
            }
        }
        let ra = run_emulated_on(&emu, &fa, SEED, Some(&mut ws)).unwrap();
        assert!(ra.outcome.passed(), "{}", ra.outcome.summary());
        assert!(ws.schedule().unwrap().splits[0].0 > 1, "the target is split");
        let rb = run_emulated_on(&emu, &fb, SEED, Some(&mut ws)).unwrap();
        assert!(rb.outcome.passed(), "{}", rb.outcome.summary());
        let bits = |o: &[bf16]| o.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&ra.o), bits(&rb.o[b2 * hq * d..(b2 + 1) * hq * d]), "window {window:?}");
        let lb = |l: &[f32]| l.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(lb(&ra.lse), lb(&rb.lse[b2 * hq..(b2 + 1) * hq]), "window {window:?}");
    }
}

/// gpt-oss-style spec-verify under a window (q_len 4, 8k context, window 128, G = 8): one split, and every
/// CTA reads keys (none is left with only −inf partials).
#[test]
fn windowed_paged_prefill_plans_over_the_window() {
    let emu = Emulator::new();
    let mut c = PagedPrefillCase {
        dtype: DType::Bf16,
        head_dim: 64,
        head_dim_v: None,
        heads_q: 16,
        heads_kv: 2,
        page_size: 16,
        seqs: vec![(4, 8192)],
        causal: true,
        num_splits: None,
        shared_prefix: 0,
        variants: Default::default(),
        kv: KvFormat::Sixteen,
        rope: None,
        kernel: Default::default(),
        schedule: None,
    };
    c.variants.window = Some((128, 0));
    for kernel in [PagedPrefillKernel::Tiled, PagedPrefillKernel::Streaming] {
        c.kernel = kernel;
        let f = PagedPrefillFixture::<bf16>::new(&c, SEED);
        let (_, _, plan) = f.run(&Stream::Emu(&emu), None).unwrap();
        assert_eq!((plan.num_splits(), plan.kernel()), (1, kernel), "{plan:?}");
        let counters = emu.last_launch_counters().unwrap();
        let (family, max_keys) = match kernel {
            // Each of the 2 KV heads' CTAs reads only the window's keys and its 4 rows' (8 heads each)
            // neighbourhood: 132 keys, whole tiles (Bc = 32 at D = 64) around them.
            PagedPrefillKernel::Tiled => ("paged_prefill", 2 * 192),
            // 2 row blocks of 16 packed rows per KV head, each reading exactly those 132 keys.
            _ => ("paged_decode", 2 * 2 * 132),
        };
        let k = counters.kernel(family).unwrap();
        assert_eq!(k.active_blocks, k.blocks, "{k}");
        assert!(k.read_of("k_cache") <= max_keys * 64 * 2, "{kernel:?}: {k}");
    }
}

/// The predictions docs/scheduling.md quotes: per shape, the schedule's CTAs, balance and makespan
/// against the uniform plan's (a plan made for the call, and one pinned for B = 64 / 128k), in the
/// dispatch model of fused_attn::schedule (H100: 132 SMs × 3 CTAs). Printed with --nocapture.
#[test]
fn predictions_per_shape() {
    use fused_attn::plan::DecodePlan;
    use fused_attn::schedule::{schedule_makespan, uniform_makespan};
    let slots = 396;
    let limits = DecodeProblem { batch: 64, heads_q: 32, heads_kv: 8, head_dim: 128, max_seq_len: 131072 };
    let pinned = DecodePlan::new(&limits, 132, None).unwrap();
    let mut skew = vec![131072];
    skew.extend([1024; 63]);
    let shapes: Vec<(&str, Vec<i32>)> = vec![
        ("B=1 32k", vec![32768]),
        ("B=64 1k", vec![1024; 64]),
        ("B=64 4k", vec![4096; 64]),
        ("B=8 8k", vec![8192; 8]),
        ("128k + 63x1k", skew),
    ];
    for (name, lens) in shapes {
        let call = DecodeProblem { batch: lens.len(), max_seq_len: *lens.iter().max().unwrap() as usize, ..limits };
        let s = schedule_decode(&call, &lens, None, slots, SplitPolicy::Balanced).unwrap();
        let fresh = DecodePlan::new(&call, 132, None).unwrap();
        let (ms, mf, mp) = (
            schedule_makespan(&s),
            uniform_makespan(&fresh, &lens, None, slots),
            uniform_makespan(&pinned, &lens, None, slots),
        );
        println!(
            "{name:>14}: {} CTAs, {} units, max/mean {:.3}, longest cut {:?}, {} merged; makespan {ms} tokens; \
             uniform fresh plan {mf} ({:.2}x), pinned B=64/128k plan {mp} ({:.2}x)",
            s.num_ctas(),
            s.work.len(),
            s.imbalance(),
            s.splits.iter().max_by_key(|x| x.0).unwrap(),
            s.merge_rows.len(),
            mf as f64 / ms as f64,
            mp as f64 / ms as f64
        );
        assert!(ms as f64 <= 1.05 * mf.min(mp) as f64, "{name}: the schedule is not slower in the model");
    }
}

/// D = 512 under the work-list schedule with more units than slots (a CTA runs several in turn, its Q tile
/// serving as the D-split warps' S exchange in between), over a window, 16-bit and FP8 caches: right answers.
#[test]
fn scheduled_decode_at_512_runs_several_units_per_cta() {
    let emu = Emulator::new();
    let fp8 = KvFormat::Fp8 { format: fused_attn::Fp8Format::E5m2, scales: fused_attn::ScaleKind::PerHead };
    for kv in [KvFormat::Sixteen, fp8] {
        let c = DecodeCase { head_dim: 512, kv, ..case(8, 2, vec![1500, 64, 0, 200, 17], Some(700)) };
        let mut ws =
            DecodeWorkspace::scheduled_on(&Stream::Emu(&emu), &limits(&c, 8, 2048), SplitPolicy::Balanced, 4).unwrap();
        let (k, _, _) = run(&emu, &c, &mut ws);
        let s = ws.schedule().unwrap();
        assert!(s.work.len() > s.num_ctas(), "several units per CTA: {s:?}");
        assert_eq!(k.active_blocks, s.num_ctas() as u64, "{k}");
    }
}
