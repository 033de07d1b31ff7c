//! The sm_90a prefill kernel (kernels/prefill_sm90.cu) on the host emulator, forced with
//! `PrefillKernel::Sm90`, with every emulator check active (races, wgmma/TMA/mbarrier misuse, bounds):
//! a slice of the shared sweep chosen to cover each axis at small sizes (emulating wgmma is slow), the score
//! variants (window, softcap, ALiBi, sinks: the variant sweep's cases and every variant on every sm90 head
//! dim), varlen with NaN in the rows past the last sequence (which a TMA box of a ragged tile reads), the
//! kernel choice
//! (`Auto` on the emulator is the sm_80 kernel; forcing sm90 where it cannot run is a typed error), and
//! determinism across scheduling seeds. The whole emulated sweep runs with
//! `fused-attn report --backend emu --kernel sm90` (and FA_PREFILL_SWEEP=sm90-all here).
use crate::common;

use std::time::Instant;

use fused_attn::prefill::{
    prefill, prefill_varlen, PrefillKernel, PrefillOptions, Sm90Tile, SM90_HEAD_DIMS, SM90_SOFTCAP_RANGE,
};
use fused_attn::score_mod::{AlibiSlopes, ScoreMod};
use fused_attn::testkit::cases::prefill::{
    run_emulated, sweep_cases, variant_sweep_cases, CaseLayout, PrefillCase, PrefillFixture,
};
use fused_attn::testkit::variants::{CaseAlibi, CaseVariants};
use fused_attn::{DType, Element, Emulator, ErrorKind, Stream, TensorView, TensorViewMut};
use half::{bf16, f16};

fn sm90(mut c: PrefillCase) -> PrefillCase {
    c.kernel = PrefillKernel::Sm90;
    c
}

fn supported(c: &PrefillCase) -> bool {
    SM90_HEAD_DIMS.contains(&c.head_dim) && c.variants.softcap.is_none_or(|s| SM90_SOFTCAP_RANGE.contains(&s))
}

/// The emulated slice: from the emulation sweep, every case of D 64 and 256 and the structural ones (GQA,
/// batches, layouts, varlen, no LSE), and of the D = 128 (Tq, Tk) grid the pairs whose lengths sit on the
/// tile edges (1, 127, 128, 129, 255) — every case with FA_PREFILL_SWEEP=sm90-all.
fn slice() -> Vec<PrefillCase> {
    let all = std::env::var("FA_PREFILL_SWEEP").is_ok_and(|v| v == "sm90-all");
    let edge = |t: usize| [1, 127, 128, 129, 255].contains(&t);
    sweep_cases(false)
        .into_iter()
        .filter(supported)
        .filter(|c| {
            all || c.head_dim != 128
                || c.varlen.is_some()
                || c.batch > 1
                || c.heads_q != 2
                || c.heads_kv != 1
                || (edge(c.seqlen_q) && edge(c.seqlen_k))
        })
        .filter(|c| all || c.seqlen_q.max(c.seqlen_k) < 1000)
        .map(sm90)
        .collect()
}

fn check<T: Element>(emu: &Emulator, i: usize, case: &PrefillCase) -> Result<String, String> {
    let seed = common::case_seed(i);
    let f = PrefillFixture::<T>::new(case, seed).map_err(|e| e.to_string())?;
    let out = run_emulated(emu, &f).map_err(|e| format!("{e} (case seed {seed:#x})"))?;
    let counters = emu.last_launch_counters().ok_or("no counters")?;
    if let Some(k) = counters.kernels.iter().find(|k| !k.kernel.starts_with("fa_prefill_sm90")) {
        return Err(format!("ran {} instead of the sm90 kernel", k.kernel));
    }
    let outcome = f.evaluate(&out).map_err(|e| e.to_string())?;
    if outcome.passed() {
        Ok(outcome.summary())
    } else {
        Err(format!("{} (case seed {seed:#x})", outcome.summary()))
    }
}

#[test]
fn emulated_sm90_sweep() {
    run_cases("emulated_sm90_sweep", slice(), 60);
}

/// The score-variant sweep's cases of the sm90 head dims (every variant alone and combined, causal and not,
/// dense and varlen): window tiles skipped on both sides, left-edge masks, softcap and ALiBi on every score
/// (ALiBi per head and per sequence), the sink in the epilogue; then softcap and ALiBi on every sm90 head dim
/// (the sweep leaves some pairs out): softcap alone, and all four variants together, causal, GQA, varlen
/// with an empty sequence, Tq and Tk across the tile edges.
#[test]
fn emulated_sm90_variants() {
    let mut cases: Vec<PrefillCase> = variant_sweep_cases().into_iter().filter(supported).collect();
    assert!(
        cases.iter().any(|c| c.variants.softcap.is_some()) && cases.iter().any(|c| c.variants.alibi != CaseAlibi::None)
    );
    for (i, &d) in SM90_HEAD_DIMS.iter().enumerate() {
        let dtype = if i % 2 == 0 { DType::Bf16 } else { DType::F16 };
        let mut capped = PrefillCase::dense(dtype, d, false, 129, 70, (4, 2));
        capped.variants = CaseVariants { softcap: Some(5.0 + i as f32), ..Default::default() };
        cases.push(capped);
        let mut all = PrefillCase::varlen(dtype, d, true, (4, 1), vec![(130, 140), (0, 3), (20, 129)]);
        all.layout = CaseLayout::Padded;
        let alibi = if i == 1 { CaseAlibi::PerSequence } else { CaseAlibi::PerHead };
        all.variants = CaseVariants { window: Some((90, 0)), softcap: Some(3.0), alibi, sinks: true };
        cases.push(all);
    }
    run_cases("emulated_sm90_variants", cases.into_iter().map(sm90).collect(), 20);
}

/// D = 64 runs three consumer warpgroups (Br = 192, fa/hopper/traits.cuh): query lengths around one and two
/// query tiles (191, 192, 193, 385), causal and not, Tq > Tk and Tq < Tk, varlen with sequences ending on
/// both sides of a tile edge, GQA, and one case with every score variant: each consumer's rows, the
/// pingpong ring of three, the ragged last tile.
#[test]
fn emulated_sm90_d64_three_consumers() {
    assert_eq!(Sm90Tile::for_call(64, false).unwrap().block_m, 192);
    let mut cases = vec![
        PrefillCase::dense(DType::Bf16, 64, true, 193, 193, (2, 1)),
        PrefillCase::dense(DType::F16, 64, false, 191, 300, (4, 2)),
        PrefillCase::dense(DType::Bf16, 64, true, 385, 129, (2, 2)),
        PrefillCase::dense(DType::F16, 64, false, 192, 64, (3, 1)),
    ];
    let varlen = PrefillCase::varlen(DType::Bf16, 64, true, (4, 2), vec![(192, 192), (193, 250), (1, 5), (130, 61)]);
    let mut all = varlen.clone();
    (all.dtype, all.causal, all.layout) = (DType::F16, false, CaseLayout::Padded);
    all.variants = CaseVariants { window: Some((100, 30)), softcap: Some(8.0), alibi: CaseAlibi::PerHead, sinks: true };
    cases.extend([varlen, all]);
    run_cases("emulated_sm90_d64_three_consumers", cases.into_iter().map(sm90).collect(), 6);
}

/// D = 128 without a mask runs FA3's 128 x 176 tile (24 / 240 registers, 2 stages): key lengths around
/// one and two KV tiles (175, 176, 177, 353) and below one (40), Tq > Tk and Tq < Tk, GQA, varlen with
/// sequences ending on both sides of a 176-key edge, strided layouts, softcap, ALiBi and sinks (which keep
/// it; a window or causal mask takes 128 x 128: kernel_choice_and_typed_errors). Every case must run the
/// `_bc176` kernel.
#[test]
fn emulated_sm90_d128_wide_tile() {
    assert_eq!(Sm90Tile::for_call(128, false).unwrap().block_n, 176);
    let mut cases = vec![
        PrefillCase::dense(DType::Bf16, 128, false, 129, 177, (2, 1)),
        PrefillCase::dense(DType::F16, 128, false, 40, 353, (4, 2)),
        PrefillCase::dense(DType::Bf16, 128, false, 300, 175, (2, 2)),
        PrefillCase::dense(DType::F16, 128, false, 128, 176, (3, 1)),
        PrefillCase::dense(DType::Bf16, 128, false, 256, 40, (2, 1)),
    ];
    let varlen = PrefillCase::varlen(DType::Bf16, 128, false, (4, 2), vec![(128, 176), (129, 177), (1, 5), (200, 352)]);
    let mut all = varlen.clone();
    (all.dtype, all.layout) = (DType::F16, CaseLayout::Padded);
    all.variants = CaseVariants { window: None, softcap: Some(8.0), alibi: CaseAlibi::PerHead, sinks: true };
    cases.extend([varlen, all]);
    let emu = Emulator::new().with_multiprocessors(SWEEP_SMS);
    for (i, case) in cases.iter().map(|c| sm90(c.clone())).enumerate() {
        let r = match case.dtype {
            DType::F16 => check::<f16>(&emu, i, &case),
            DType::Bf16 => check::<bf16>(&emu, i, &case),
        };
        r.unwrap_or_else(|e| panic!("{}: {e}", case.label()));
        let kernel = &emu.last_launch_counters().unwrap().kernels[0].kernel;
        assert!(kernel.ends_with("_d128_bc176"), "{}: ran {kernel}", case.label());
    }
}

/// SMs of the emulated GPU in the sweeps: few, so that the persistent CTAs each run several work tiles
/// (causal, varlen, GQA, empty ones) with their barrier phases and KV ring carried across them.
const SWEEP_SMS: usize = 3;

fn run_cases(name: &str, cases: Vec<PrefillCase>, at_least: usize) {
    let emu = Emulator::new().with_multiprocessors(SWEEP_SMS);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    let start = Instant::now();
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(c) = cases.get(i) else { break };
                if !common::case_selected(i) {
                    continue;
                }
                let r = match c.dtype {
                    DType::F16 => check::<f16>(&emu, i, c),
                    DType::Bf16 => check::<bf16>(&emu, i, c),
                };
                match r {
                    Ok(msg) => eprintln!("ok   [{i}] {}: {msg}", c.label()),
                    Err(msg) => {
                        let msg = format!("[{i}] {}: {msg}", c.label());
                        eprintln!("FAIL {msg}");
                        failures.lock().unwrap().push(msg);
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    eprintln!("{name}: {} cases in {:.1} s", cases.len(), start.elapsed().as_secs_f64());
    assert!(cases.len() >= at_least, "{name}: the slice shrank to {} cases", cases.len());
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

/// Varlen: the last sequence's ragged top KV tile is one TMA box of 128 rows, which reads the packed rows
/// past it (here: rows no sequence owns, set to NaN). Its scores are masked, but P = 0 times a NaN of V
/// would still be NaN: the kernel zeroes those V rows. Outputs with NaN and with zeros there must be
/// bit-identical (and finite).
#[test]
fn varlen_rows_past_a_sequence_never_reach_the_output() {
    let (hq, hkv, d) = (2usize, 1usize, 128usize);
    let cu_q = [0i32, 20, 50];
    let cu_k = [0i32, 17, 40];
    let (total_q, total_k) = (50usize, 60usize); // k/v rows 40..60 belong to no sequence
    let mut rng = 0x1234_5678_u64;
    let mut val = || {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        bf16::from_f32(((rng >> 40) as f32 / (1u64 << 24) as f32) - 0.5)
    };
    let q: Vec<bf16> = (0..total_q * hq * d).map(|_| val()).collect();
    let k: Vec<bf16> = (0..total_k * hkv * d).map(|_| val()).collect();
    let v_clean: Vec<bf16> = (0..total_k * hkv * d).map(|_| val()).collect();
    let run = |fill: bf16| -> Vec<u16> {
        let mut k = k.clone();
        let mut v = v_clean.clone();
        for x in k[40 * hkv * d..].iter_mut().chain(v[40 * hkv * d..].iter_mut()) {
            *x = fill;
        }
        let emu = Emulator::new();
        let mut o = vec![bf16::NAN; total_q * hq * d];
        let mut lse = vec![f32::NAN; hq * total_q];
        let opts = PrefillOptions { kernel: PrefillKernel::Sm90, ..Default::default() };
        prefill_varlen(
            &Stream::Emu(&emu),
            &TensorView::host(&q, [total_q, hq, d]).unwrap(),
            &TensorView::host(&k, [total_k, hkv, d]).unwrap(),
            &TensorView::host(&v, [total_k, hkv, d]).unwrap(),
            &TensorView::host(&cu_q, [3]).unwrap(),
            &TensorView::host(&cu_k, [3]).unwrap(),
            30,
            23,
            &mut TensorViewMut::host(&mut o, [total_q, hq, d]).unwrap(),
            Some(&mut TensorViewMut::host(&mut lse, [hq, total_q]).unwrap()),
            &opts,
        )
        .unwrap();
        assert!(emu.last_launch_counters().unwrap().kernels[0].kernel.starts_with("fa_prefill_sm90"));
        assert!(o.iter().all(|x| x.is_finite()), "NaN or inf in o (fill {fill})");
        assert!(lse.iter().all(|x| x.is_finite()));
        o.iter().map(|x| x.to_bits()).collect()
    };
    assert_eq!(run(bf16::NAN), run(bf16::ZERO));
}

/// `Auto` on the emulator is the sm_80 kernel; `Sm80` too; `Sm90` the sm_90a one. Forcing sm90 where it
/// cannot run is a typed error, not a fallback.
#[test]
fn kernel_choice_and_typed_errors() {
    let run = |d: usize, opts: PrefillOptions| -> fused_attn::Result<String> {
        let emu = Emulator::new();
        let n = 2 * 40 * d;
        let q = vec![bf16::ONE; n];
        let mut o = vec![bf16::ZERO; n];
        prefill(
            &Stream::Emu(&emu),
            &TensorView::host(&q, [1, 40, 2, d])?,
            &TensorView::host(&q, [1, 40, 2, d])?,
            &TensorView::host(&q, [1, 40, 2, d])?,
            &mut TensorViewMut::host(&mut o, [1, 40, 2, d])?,
            None,
            &opts,
        )?;
        Ok(emu.last_launch_counters().unwrap().kernels[0].kernel.clone())
    };
    let with = |kernel| PrefillOptions { kernel, ..Default::default() };
    assert_eq!(run(128, with(PrefillKernel::Auto)).unwrap(), "fa_prefill_bf16_d128");
    assert_eq!(run(128, with(PrefillKernel::Sm80)).unwrap(), "fa_prefill_bf16_d128");
    // D 128: FA3's 128 x 176 tile unmasked, 128 x 128 causal or windowed.
    assert_eq!(run(128, with(PrefillKernel::Sm90)).unwrap(), "fa_prefill_sm90_bf16_d128_bc176");
    let causal = PrefillOptions { kernel: PrefillKernel::Sm90, causal: true, ..Default::default() };
    assert_eq!(run(128, causal).unwrap(), "fa_prefill_sm90_bf16_d128");
    assert_eq!(run(64, with(PrefillKernel::Sm90)).unwrap(), "fa_prefill_sm90_bf16_d64");
    // Head dims and variants the sm90 kernel lacks: Unsupported when forced, sm_80 under Auto.
    assert_eq!(run(96, with(PrefillKernel::Sm90)).unwrap_err().kind(), &ErrorKind::Unsupported);
    assert_eq!(run(96, with(PrefillKernel::Auto)).unwrap(), "fa_prefill_bf16_d96");
    // Every variant it has (window, softcap, ALiBi, sinks) ...
    let slopes = [0.25f32, 0.5];
    let slopes = TensorView::host(&slopes, [2]).unwrap();
    let sinks = [0.5f32, -1.0];
    let sinks = TensorView::host(&sinks, [2]).unwrap();
    let all = ScoreMod {
        window: Some((7, 0)),
        softcap: Some(20.0),
        alibi_slopes: Some(AlibiSlopes::PerHead(&slopes)),
        sinks: Some(&sinks),
    };
    let softcap = ScoreMod { softcap: Some(20.0), ..Default::default() };
    for (score_mod, sm90) in [(all, "fa_prefill_sm90_bf16_d128"), (softcap, "fa_prefill_sm90_bf16_d128_bc176")] {
        let r = run(128, PrefillOptions { score_mod, kernel: PrefillKernel::Sm90, ..Default::default() });
        assert_eq!(r.unwrap(), sm90);
        // ... and Auto keeps the sm_80 kernel on the emulator, with or without variants.
        let r = run(128, PrefillOptions { score_mod, ..Default::default() });
        assert_eq!(r.unwrap(), "fa_prefill_bf16_d128_mod");
    }
    // A softcap past the range its inline division is exact on: Unsupported when forced, sm_80 under Auto.
    let far = ScoreMod { softcap: Some(1e30), ..Default::default() };
    let e = run(128, PrefillOptions { score_mod: far, kernel: PrefillKernel::Sm90, ..Default::default() });
    assert_eq!(e.unwrap_err().kind(), &ErrorKind::Unsupported);
    assert_eq!(run(128, PrefillOptions { score_mod: far, ..Default::default() }).unwrap(), "fa_prefill_bf16_d128_mod");
}

/// Every scheduling seed gives bit-identical outputs (the producer/consumer interleaving is the seed's).
#[test]
fn emulated_sm90_results_do_not_depend_on_scheduling() {
    let mut case = sweep_cases(false).into_iter().find(|c| c.varlen.is_some() && c.causal && c.head_dim == 64).unwrap();
    case = sm90(case);
    let f = PrefillFixture::<bf16>::new(&case, common::base_seed()).unwrap();
    let r1 = run_emulated(&Emulator::with_seed(1), &f).unwrap();
    let r2 = run_emulated(&Emulator::with_seed(0xdead_beef), &f).unwrap();
    let bits = |o: &[bf16]| o.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&r1.o), bits(&r2.o));
    let lse_bits = |l: Option<Vec<f32>>| l.unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(lse_bits(r1.lse), lse_bits(r2.lse));
}

/// Prefetch slack, from the emulator's happens-before order (FaEmuCounters.tma_tiles_*): for every sm90
/// kernel, every K and V tile load after a stream's first is issued while the previous tile may still be in
/// use — the producer is never ordered after a consumer's wgmma read of tile w completing when it requests
/// tile w+1 — and with three stages every load from the third on while the two previous tiles may still be
/// (two tiles of slack: the whole ring in use); with two stages none can be (the exact count, so that the
/// check is seen to detect the limit). Freeing K and V of a stage together after the P·V of the next
/// iteration (the joint-release pipeline, scripts/mutants/sm90-joint-release.patch) makes the two-stage
/// kernels' K loads late and costs the three-stage kernels their second tile of slack. One CTA, one query
/// tile, six KV tiles: 5 loads per stream counted for one tile of slack and 4 for two, for K and V. Every
/// kernel: each head dim's unmasked tile, and D 128's causal 128 x 128 tile (causal, bottom-right: the
/// query tile sees all six KV tiles, the top one masked).
#[test]
fn emulated_sm90_tma_loads_prefetch_every_tile() {
    use fused_attn::tile::{tile_policy, KernelOp};
    let emu = Emulator::new();
    let kernels = SM90_HEAD_DIMS
        .iter()
        .flat_map(|&d| [(d, false), (d, true)])
        .filter(|&(d, causal)| !causal || Sm90Tile::for_call(d, true) != Sm90Tile::for_call(d, false));
    let mut wrong = Vec::new();
    for (i, (d, causal)) in kernels.enumerate() {
        let stages = tile_policy(KernelOp::PrefillSm90, d, causal, None).unwrap().stages;
        assert!(stages == 2 || stages == 3, "D {d}: {stages} stages");
        for dtype in [DType::F16, DType::Bf16] {
            let tile = Sm90Tile::for_call(d, causal).unwrap();
            let case = sm90(PrefillCase::dense(dtype, d, causal, tile.block_m, 6 * tile.block_n, (1, 1)));
            let r = match dtype {
                DType::F16 => check::<f16>(&emu, i, &case),
                DType::Bf16 => check::<bf16>(&emu, i, &case),
            };
            r.unwrap_or_else(|e| panic!("{}: {e}", case.label()));
            let k = emu.last_launch_counters().unwrap().total();
            assert_eq!(k.blocks, 1, "{}", case.label());
            let got = (k.tma_tiles_prefetched, k.tma_tiles_late, k.tma_tiles_two_ahead);
            let want = (10, 0, if stages == 3 { 8 } else { 0 });
            eprintln!("{} ({stages} stages): prefetched, late, two ahead = {got:?}", case.label());
            if got != want {
                wrong.push(format!("{} ({stages} stages): {got:?}, want {want:?}", case.label()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "K and V loads waiting for the consumers (prefetched, late, two ahead):\n{}",
        wrong.join("\n")
    );
}

/// The persistent grid, for every sm90 kernel: more work tiles than the emulated GPU's SMs run on SM count ×
/// occupancy CTAs (each CTA walks several tiles, its barrier phases and KV ring carried across them), with
/// the right answer; fewer tiles than SMs run one CTA per tile. Causal varlen with sequences of different
/// lengths runs the longest-first order over the longest sequence's tiles (the sweeps above run on 3 SMs,
/// so every CTA there walks several tiles of every kind).
#[test]
fn emulated_sm90_persistent_grid_is_the_resident_ctas() {
    use fused_attn::prefill::{persistent_ctas, EMULATED_SMS, SM90_OCCUPANCY};
    let emu = Emulator::new();
    let heads = EMULATED_SMS + 8;
    for (i, &d) in SM90_HEAD_DIMS.iter().enumerate() {
        let many = sm90(PrefillCase::dense(DType::Bf16, d, i % 2 == 1, 3, 100, (heads, heads / 4)));
        check::<bf16>(&emu, 10 + i, &many).unwrap_or_else(|e| panic!("{}: {e}", many.label()));
        let k = emu.last_launch_counters().unwrap().total();
        assert_eq!(k.blocks as usize, EMULATED_SMS * SM90_OCCUPANCY, "{}: CTAs of {heads} work tiles", many.label());
    }
    assert_eq!(persistent_ctas(heads, EMULATED_SMS), EMULATED_SMS);
    let few = sm90(PrefillCase::dense(DType::F16, 128, true, 300, 300, (2, 1)));
    check::<f16>(&emu, 1, &few).unwrap_or_else(|e| panic!("{}: {e}", few.label()));
    assert_eq!(emu.last_launch_counters().unwrap().total().blocks, 3 * 2);
    // Two SMs: 6 causal tiles of unequal length on 2 CTAs, and a varlen batch whose short sequences leave
    // tiles past their ends.
    let two = Emulator::new().with_multiprocessors(2);
    check::<f16>(&two, 2, &few).unwrap_or_else(|e| panic!("{}: {e}", few.label()));
    assert_eq!(two.last_launch_counters().unwrap().total().blocks, 2);
    for (i, &d) in SM90_HEAD_DIMS.iter().enumerate() {
        let varlen = sm90(PrefillCase::varlen(DType::Bf16, d, true, (2, 1), vec![(400, 420), (5, 3), (200, 130)]));
        check::<bf16>(&two, 20 + i, &varlen).unwrap_or_else(|e| panic!("{}: {e}", varlen.label()));
        assert_eq!(two.last_launch_counters().unwrap().total().blocks, 2, "{}", varlen.label());
    }
}

/// Varlen numbers only the work tiles that have rows (fa/hopper/tile_scheduler.cuh): a batch of one
/// 512-token sequence and three 1-token ones has 7 tiles at Br = 128 (6 at D 64's 192) against 16 (12)
/// counted over the longest sequence, and on 8 SMs every one of them lands on its own CTA — all 7 (6) CTAs
/// that have a tile store output (`active_blocks`). Numbered over the longest sequence, CTA b would run
/// indices b and b + 8, two real tiles on some CTAs and none on others: 5 active. Right answers too, causal
/// and not (the causal order reverses the query tiles within a sequence).
#[test]
fn emulated_sm90_varlen_tiles_are_only_those_with_rows() {
    let emu = Emulator::new().with_multiprocessors(8);
    let seqs = vec![(512, 512), (1, 1), (1, 1), (1, 1)];
    for (i, &d) in SM90_HEAD_DIMS.iter().enumerate() {
        for causal in [false, true] {
            let case = sm90(PrefillCase::varlen(DType::F16, d, causal, (1, 1), seqs.clone()));
            check::<f16>(&emu, 30 + 2 * i + causal as usize, &case).unwrap_or_else(|e| panic!("{}: {e}", case.label()));
            let block_m = Sm90Tile::for_call(d, causal).unwrap().block_m;
            let tiles: usize = seqs.iter().map(|s| s.0.div_ceil(block_m)).sum();
            let k = emu.last_launch_counters().unwrap().total();
            assert_eq!((k.blocks, k.active_blocks), (8, tiles as u64), "{}: {k}", case.label());
        }
    }
}

/// FA3's L2 hints and TMA-store epilogue, from the emulator's counters: every Q byte the TMA loads is under
/// evict_first and every K and V byte under evict_last (nothing unhinted); a dense call stores O by TMA,
/// one 16-row box per panel of each warp that has rows (whole boxes: the TMA unit clips rows past Tq, which
/// the fixture's NaN-poisoned output would show); varlen stores none (a box would reach into the next
/// sequence) and still gets the right answer with 16-byte stores.
#[test]
fn emulated_sm90_l2_hints_and_tma_store_epilogue() {
    let emu = Emulator::new().with_multiprocessors(SWEEP_SMS);
    for (i, &d) in SM90_HEAD_DIMS.iter().enumerate() {
        let tile = Sm90Tile::for_call(d, true).unwrap();
        let mut case = sm90(PrefillCase::dense(DType::Bf16, d, true, tile.block_m + 40, 2 * tile.block_n + 3, (4, 2)));
        case.batch = 2;
        check::<bf16>(&emu, i, &case).unwrap_or_else(|e| panic!("{}: {e}", case.label()));
        let k = emu.last_launch_counters().unwrap().total();
        let q_tiles = case.seqlen_q.div_ceil(tile.block_m) * case.heads_q * case.batch;
        assert_eq!(k.tma_load_bytes_evict_first as usize, q_tiles * tile.block_m * d * 2, "{}: Q", case.label());
        assert_eq!(k.tma_load_bytes_evict_first + k.tma_load_bytes_evict_last, k.tma_load_bytes, "{}", case.label());
        assert!(k.tma_load_bytes_evict_last > k.tma_load_bytes_evict_first, "{}: K and V", case.label());
        let warps_with_rows = case.seqlen_q.div_ceil(16) * case.heads_q * case.batch;
        assert_eq!(k.tma_store_bytes as usize, warps_with_rows * 16 * d * 2, "{}: O boxes", case.label());

        let varlen = sm90(PrefillCase::varlen(DType::Bf16, d, false, (2, 1), vec![(tile.block_m + 7, 50), (9, 130)]));
        check::<bf16>(&emu, 10 + i, &varlen).unwrap_or_else(|e| panic!("{}: {e}", varlen.label()));
        let k = emu.last_launch_counters().unwrap().total();
        assert_eq!(k.tma_store_bytes, 0, "{}: varlen O by TMA", varlen.label());
        assert_eq!(k.tma_load_bytes_evict_first + k.tma_load_bytes_evict_last, k.tma_load_bytes, "{}", varlen.label());
    }
}

/// The tuning steps' A/B switches (`Sm90Steps`, timed by `report` on an H100/H200) compute the same
/// attention: one CTA per tile instead of the persistent grid, 16-byte stores instead of the TMA-store
/// epilogue and evict_normal loads instead of the L2 hints give the same bits (a tile's arithmetic does not
/// depend on which CTA runs it, how O leaves shared memory or how long its inputs stay in L2); 128 × 128
/// instead of 128 × 176 sums in another order and passes the reference.
/// The counters show each switch took effect.
#[test]
fn emulated_sm90_steps_compute_the_same_attention() {
    use fused_attn::prefill::Sm90Steps;
    let emu = Emulator::new().with_multiprocessors(SWEEP_SMS);
    let base = sm90(PrefillCase { batch: 2, ..PrefillCase::dense(DType::Bf16, 128, false, 200, 190, (2, 1)) });
    let run = |steps: Sm90Steps| {
        let case = PrefillCase { sm90_steps: steps, ..base.clone() };
        let f = PrefillFixture::<bf16>::new(&case, common::case_seed(0)).unwrap();
        let out = run_emulated(&emu, &f).unwrap_or_else(|e| panic!("{}: {e}", case.label()));
        assert!(f.evaluate(&out).unwrap().passed(), "{}", case.label());
        let k = emu.last_launch_counters().unwrap().kernels.into_iter().next().unwrap();
        (out.o.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), k)
    };
    let on = Sm90Steps::default();
    let (all, k) = run(on);
    assert_eq!(k.kernel, "fa_prefill_sm90_bf16_d128_bc176");
    let tiles = 200usize.div_ceil(128) * 2 * 2; // 8 work tiles on 3 SMs: every CTA walks several
    assert_eq!(k.blocks as usize, SWEEP_SMS);
    assert!(k.tma_store_bytes > 0);

    let (o, k) = run(Sm90Steps { persistent: false, ..on });
    assert_eq!(k.blocks as usize, tiles, "one CTA per work tile");
    assert!(o == all, "the persistent grid changed the result");
    let (o, k) = run(Sm90Steps { tma_store: false, ..on });
    assert_eq!(k.tma_store_bytes, 0, "16-byte stores");
    assert!(o == all, "the TMA-store epilogue changed the result");
    let (_, k) = run(Sm90Steps { wide_tile: false, ..on });
    assert_eq!(k.kernel, "fa_prefill_sm90_bf16_d128");
    let (o, k) = run(Sm90Steps { l2_hints: false, ..on });
    assert_eq!((k.tma_load_bytes_evict_first, k.tma_load_bytes_evict_last), (0, 0), "evict_normal loads");
    assert!(o == all, "the L2 hints changed the result");
}
