//! Score variants (docs/semantics.md, "Score variants": sliding window, softcap, ALiBi, sinks) in every
//! kernel, against the fp64 reference under the tolerance rule and the arithmetic bound: the prefill
//! (dense and varlen) and decode (forced split counts 1, 2, 7 and planned) variant sweeps on the emulator
//! (and on a GPU when there is one), merge with sinks, windows that exclude nothing (bitwise the plain
//! result), and bad input as typed errors. Closed-form checks are in tests/it/exact.rs
//! (`variants_over_constant_keys`), the window's savings in tests/it/cost.rs.
use crate::common;

use fused_attn::prefill::{prefill_varlen, PrefillOptions};
use fused_attn::score_mod::{AlibiSlopes, ScoreMod};
use fused_attn::testkit::cases::decode::{self as decode_cases, decode_variant_sweep, run_case_emulated, DecodeCase};
use fused_attn::testkit::cases::prefill::{self as prefill_cases, PrefillCase};
use fused_attn::testkit::cases::prefill::{run_emulated, variant_sweep_cases, PrefillFixture};
use fused_attn::testkit::variants::{CaseAlibi, CaseVariants};
use fused_attn::{
    decode, merge_states_with_sinks, DType, DecodeOptions, DecodeWorkspace, Emulator, ErrorKind, PagedKvCache, Stream,
    TensorView, TensorViewMut,
};
use half::{bf16, f16};

/// Runs the variant sweep `test` over `cases` on all cores ([`common::sweep`]): case i on the seed of
/// `seed_base + i`, judged by `check` (passed, summary); a failure names its seed.
fn sweep<C: Sync>(
    test: &str,
    cases: &[C],
    seed_base: usize,
    label: impl Fn(&C) -> String + Sync,
    check: impl Fn(&C, u64) -> fused_attn::Result<(bool, String)> + Sync,
) {
    common::sweep("variants", test, cases, common::all_cores(), label, |i, c| {
        let seed = common::case_seed(seed_base + i);
        match check(c, seed).map_err(|e| e.to_string())? {
            (true, summary) => Ok(summary),
            (false, summary) => Err(format!("{summary} (case seed {seed:#x})")),
        }
    });
}

/// The prefill variant sweep (`variant_sweep_cases`, seeds from 7000), each case judged by `check`.
fn prefill_sweep(
    test: &str,
    check: impl Fn(&PrefillCase, u64) -> fused_attn::Result<prefill_cases::CaseOutcome> + Sync,
) {
    sweep(test, &variant_sweep_cases(), 7000, PrefillCase::label, |c, seed| {
        check(c, seed).map(|o| (o.passed(), o.summary()))
    });
}

/// The decode variant sweep (`decode_variant_sweep`, seeds from 7100), each case judged by `check`.
fn decode_sweep(test: &str, check: impl Fn(&DecodeCase, u64) -> fused_attn::Result<decode_cases::CaseOutcome> + Sync) {
    sweep(test, &decode_variant_sweep(), 7100, DecodeCase::label, |c, seed| {
        check(c, seed).map(|o| (o.passed(), o.summary()))
    });
}

/// The two tests of one op's variant sweep: `$sweep` on the emulator (`$cases::check_case_emulated`) and on
/// the GPU (`$cases::check_case_gpu`, skipped without one).
macro_rules! variant_sweep_tests {
    ($sweep:ident, $cases:ident, $emulated:ident, $gpu:ident) => {
        #[test]
        fn $emulated() {
            let emu = Emulator::new();
            $sweep(stringify!($emulated), |c, seed| $cases::check_case_emulated(&emu, c, seed));
        }

        #[test]
        fn $gpu() {
            let Some(s) = common::gpu_stream_or_skip(concat!("variants::", stringify!($gpu))) else { return };
            $sweep(stringify!($gpu), |c, seed| $cases::check_case_gpu(&s, c, seed));
        }
    };
}

variant_sweep_tests!(prefill_sweep, prefill_cases, emulated_prefill_variant_sweep, gpu_prefill_variant_sweep);
variant_sweep_tests!(decode_sweep, decode_cases, emulated_decode_variant_sweep, gpu_decode_variant_sweep);

/// The sweeps cover what the issue asks for: every variant alone and the gpt-oss and Gemma 2 combinations,
/// decode with split counts 1, 2 and many.
#[test]
fn variant_sweeps_cover_every_variant() {
    let has = |vs: &[CaseVariants], f: &dyn Fn(&CaseVariants) -> bool| vs.iter().any(f);
    let pre: Vec<CaseVariants> = variant_sweep_cases().iter().map(|c| c.variants).collect();
    let dec: Vec<CaseVariants> = decode_variant_sweep().iter().map(|c| c.variants).collect();
    for vs in [&pre, &dec] {
        assert!(has(vs, &|v| v.window.is_some() && v.softcap.is_none() && !v.sinks && v.alibi == CaseAlibi::None));
        assert!(has(vs, &|v| v.softcap.is_some() && v.window.is_none() && !v.sinks && v.alibi == CaseAlibi::None));
        assert!(has(vs, &|v| v.alibi == CaseAlibi::PerHead && v.window.is_none() && v.softcap.is_none()));
        assert!(has(vs, &|v| v.alibi == CaseAlibi::PerSequence));
        assert!(has(vs, &|v| v.sinks && v.window.is_none() && v.softcap.is_none() && v.alibi == CaseAlibi::None));
        assert!(has(vs, &|v| v.window.is_some() && v.sinks && v.softcap.is_none()), "gpt-oss");
        assert!(has(vs, &|v| v.window.is_some() && v.softcap.is_some() && !v.sinks), "Gemma 2");
    }
    assert!(variant_sweep_cases().iter().any(|c| c.varlen.is_some() && !c.variants.is_plain()));
    for splits in [Some(1), Some(2), Some(7), None] {
        assert!(decode_variant_sweep().iter().any(|c| c.num_splits == splits && c.variants.sinks));
    }
}

// ------------------------------------------------------------------------------------------------ merge

/// merge_states_with_sinks against the reference: random states (some empty, one row all empty), the sink
/// entering once per row; an all-empty row gives o = 0 and lse = its sink.
#[test]
fn merge_with_sinks_matches_the_reference() {
    use rand::Rng;
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let (k, n, h, d) = (3usize, 2usize, 4usize, 64usize);
    let mut rng = fused_attn::testkit::seed::rng(common::case_seed(7200));
    let o: Vec<f32> = (0..k * n * h * d).map(|_| rng.random_range(-1.0..1.5)).collect();
    let mut lse: Vec<f32> = (0..k * n * h).map(|_| rng.random_range(-2.0..4.0)).collect();
    for s in 0..k {
        lse[s * n * h] = f32::NEG_INFINITY; // row (0, 0): every state empty
    }
    lse[n * h + 3] = f32::NEG_INFINITY;
    let sinks: Vec<f32> = (0..h).map(|_| rng.random_range(-1.0..3.0)).collect();
    let mut out = vec![f32::NAN; n * h * d];
    let mut out_lse = vec![f32::NAN; n * h];
    common::merge_host(&stream, [k, n, h, d], (&o, &lse), Some(&sinks), (&mut out, &mut out_lse)).unwrap();
    let wide = |x: &[f32]| x.iter().map(|&v| f64::from(v)).collect::<Vec<f64>>();
    let row_sinks: Vec<f64> = (0..n * h).map(|r| f64::from(sinks[r % h])).collect();
    let r =
        fused_attn::reference::merge_states_with_sinks(k, n * h, d, &wide(&o), &wide(&lse), Some(&row_sinks)).unwrap();
    let bound = r.out_bound(None, None);
    let c = fused_attn::reference::compare_within(&wide(&out), &r.out, &bound);
    assert!(c.passed, "{c:?}");
    let lc = fused_attn::reference::compare_lse(&wide(&out_lse), &r.lse, 1e-5);
    assert!(lc.passed, "{lc:?}");
    assert_eq!(out_lse[0], sinks[0], "an all-empty row's LSE is its sink");
    assert!(out[..d].iter().all(|&x| x == 0.0));
    // Plain merge_states is the same call without sinks: different results here.
    let mut plain = vec![f32::NAN; n * h];
    common::merge_host(&stream, [k, n, h, d], (&o, &lse), None, (&mut out, &mut plain)).unwrap();
    assert_eq!(plain[0], f32::NEG_INFINITY);
    assert!(plain[1..].iter().zip(&out_lse[1..]).all(|(p, s)| p < s));
}

// ----------------------------------------------------------------------------- windows that exclude nothing

fn prefill_bits(case: &PrefillCase, seed: u64) -> (Vec<u16>, Vec<u32>) {
    let emu = Emulator::new();
    let f = PrefillFixture::<bf16>::new(case, seed).unwrap();
    let out = run_emulated(&emu, &f).unwrap();
    (out.o.iter().map(|x| x.to_bits()).collect(), out.lse.unwrap().iter().map(|x| x.to_bits()).collect())
}

/// A window at least as long as the sequence gives bitwise the output of no window: dense causal and not
/// (the plain kernel), varlen whose max_seqlen bound is looser than its sequences (the variant kernel with
/// a window that excludes nothing), with ALiBi (variant kernels on both sides), and decode with 1 and 3
/// splits. The varlen case is D = 96: at D = 128 the plain and variant kernels have different key tiles (64
/// and 32 keys: fa/prefill/tile_config.cuh), so there the two agree only to rounding (docs/semantics.md).
#[test]
fn window_longer_than_the_sequence_is_no_window() {
    let seed = common::case_seed(7300);
    let mut cases = Vec::new();
    for causal in [false, true] {
        let mut c = PrefillCase::dense(DType::Bf16, 64, causal, 130, 97, (2, 1));
        cases.push((c.clone(), Some((200, if causal { 0 } else { 300 }))));
        c.variants.alibi = CaseAlibi::PerHead;
        cases.push((c, Some((130, -1))));
    }
    let mut varlen = PrefillCase::dense(DType::Bf16, 96, true, 0, 0, (4, 2));
    varlen.varlen = Some(vec![(100, 120), (0, 7), (60, 60)]);
    (varlen.batch, varlen.seqlen_q, varlen.seqlen_k) = (3, 400, 400); // loose bounds: span 400
    cases.push((varlen, Some((150, -1))));
    for (i, (plain, window)) in cases.into_iter().enumerate() {
        let mut windowed = plain.clone();
        windowed.variants.window = window;
        assert_eq!(
            prefill_bits(&plain, seed + i as u64),
            prefill_bits(&windowed, seed + i as u64),
            "{}",
            windowed.label()
        );
    }
    for splits in [Some(1), Some(3)] {
        let plain = DecodeCase::new(DType::F16, 128, (8, 2), 16, &[0, 5, 700, 1000], splits);
        let mut windowed = plain.clone();
        windowed.variants.window = Some((1000, 0));
        let emu = Emulator::new();
        let a = run_case_emulated::<f16>(&emu, &plain, seed).unwrap();
        let b = run_case_emulated::<f16>(&emu, &windowed, seed).unwrap();
        assert_eq!(a.outcome.plan, b.outcome.plan);
        let bits = |o: &[f16]| o.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a.o), bits(&b.o), "{}", windowed.label());
        assert_eq!(
            a.lse.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            b.lse.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }
}

// ------------------------------------------------------------------------------------------------ errors

#[test]
fn bad_variants_are_typed_errors() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let (b, t, hq, hkv, d) = (2, 16, 4, 2, 64);
    let q = vec![bf16::from_f32(0.1); b * t * hq * d];
    let kv = vec![bf16::from_f32(0.2); b * t * hkv * d];
    let mut o = vec![bf16::ZERO; b * t * hq * d];
    let good_slopes = vec![0.5f32; hq];
    let long_slopes = vec![0.5f32; hq + 1];
    let batch_slopes = vec![0.5f32; 3 * hq];
    let nan_sinks = vec![0.0, f32::NAN, 0.0, 0.0];
    let short_sinks = vec![0.0f32; hq - 1];
    let inf_slopes = vec![0.5, f32::INFINITY, 0.5, 0.5];
    fn v(x: &[f32], n: usize) -> TensorView<'_, f32, 1> {
        TensorView::host(&x[..n], [n]).unwrap()
    }
    let (good, long, nan, short, inf) =
        (v(&good_slopes, hq), v(&long_slopes, hq + 1), v(&nan_sinks, hq), v(&short_sinks, hq - 1), v(&inf_slopes, hq));
    let strided = TensorView::host(&batch_slopes[..], [hq]).unwrap().with_strides([2]).unwrap();
    let wrong_batch = TensorView::host(&batch_slopes[..], [3, hq]).unwrap();
    let mut run = |m: ScoreMod<'_>| -> Result<(), ErrorKind> {
        let opts = PrefillOptions { causal: true, score_mod: m, ..Default::default() };
        common::prefill_host(&stream, [b, t, t, hq, hkv, d], (&q, &kv, &kv), (&mut o, None), &opts)
            .map_err(|e| e.kind().clone())
    };
    let none = ScoreMod::default();
    assert_eq!(run(ScoreMod { window: Some((-2, 0)), ..none }), Err(ErrorKind::Unsupported));
    assert_eq!(run(ScoreMod { window: Some((3, -7)), ..none }), Err(ErrorKind::Unsupported));
    for c in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        assert_eq!(run(ScoreMod { softcap: Some(c), ..none }), Err(ErrorKind::Unsupported), "softcap {c}");
    }
    assert_eq!(run(ScoreMod { alibi_slopes: Some(AlibiSlopes::PerHead(&long)), ..none }), Err(ErrorKind::Shape));
    let per_sequence = ScoreMod { alibi_slopes: Some(AlibiSlopes::PerSequence(&wrong_batch)), ..none };
    assert_eq!(run(per_sequence), Err(ErrorKind::Shape));
    assert_eq!(run(ScoreMod { alibi_slopes: Some(AlibiSlopes::PerHead(&strided)), ..none }), Err(ErrorKind::Layout));
    assert_eq!(run(ScoreMod { alibi_slopes: Some(AlibiSlopes::PerHead(&inf)), ..none }), Err(ErrorKind::Unsupported));
    assert_eq!(run(ScoreMod { sinks: Some(&short), ..none }), Err(ErrorKind::Shape));
    assert_eq!(run(ScoreMod { sinks: Some(&nan), ..none }), Err(ErrorKind::Unsupported));
    // The good ones are accepted.
    let good_ones = ScoreMod {
        window: Some((4, 0)),
        softcap: Some(5.0),
        alibi_slopes: Some(AlibiSlopes::PerHead(&good)),
        sinks: Some(&good),
    };
    assert_eq!(run(good_ones), Ok(()));
    // Varlen checks the same way.
    let cu = [0i32, 10, 32];
    let e = prefill_varlen(
        &stream,
        &TensorView::host(&q, [b * t, hq, d]).unwrap(),
        &TensorView::host(&kv, [b * t, hkv, d]).unwrap(),
        &TensorView::host(&kv, [b * t, hkv, d]).unwrap(),
        &TensorView::host(&cu, [3]).unwrap(),
        &TensorView::host(&cu, [3]).unwrap(),
        22,
        22,
        &mut TensorViewMut::host(&mut o, [b * t, hq, d]).unwrap(),
        None,
        &PrefillOptions { score_mod: ScoreMod { sinks: Some(&short), ..none }, ..Default::default() },
    )
    .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Shape, "{e}");
    assert!(e.to_string().contains("sinks"), "{e}");

    // Decode.
    let (ps, pages) = (16, 4);
    let cache_k = vec![bf16::from_f32(0.1); pages * ps * hkv * d];
    let table = [0i32, 1, 2, 3];
    let lens = [20i32, 30];
    let cache = PagedKvCache::new(
        TensorView::host(&cache_k, [pages, ps, hkv, d]).unwrap(),
        TensorView::host(&cache_k, [pages, ps, hkv, d]).unwrap(),
        TensorView::host(&table, [2, 2]).unwrap(),
        TensorView::host(&lens, [2]).unwrap(),
        32,
    )
    .unwrap();
    let qd = vec![bf16::from_f32(0.1); b * hq * d];
    let mut od = vec![bf16::ZERO; b * hq * d];
    let mut ws = DecodeWorkspace::new(&stream, 1 << 16, 1 << 12).unwrap();
    let mut dec = |m: ScoreMod<'_>| {
        decode(
            &stream,
            &TensorView::host(&qd, [b, hq, d]).unwrap(),
            &cache,
            &mut TensorViewMut::host(&mut od, [b, hq, d]).unwrap(),
            None,
            &mut ws,
            &DecodeOptions { num_splits: Some(2), score_mod: m, ..Default::default() },
        )
        .map(|_| ())
        .map_err(|e| e.kind().clone())
    };
    assert_eq!(dec(ScoreMod { window: Some((-5, 0)), ..none }), Err(ErrorKind::Unsupported));
    assert_eq!(dec(ScoreMod { softcap: Some(-3.0), ..none }), Err(ErrorKind::Unsupported));
    assert_eq!(dec(ScoreMod { sinks: Some(&short), ..none }), Err(ErrorKind::Shape));
    assert_eq!(dec(ScoreMod { sinks: Some(&nan), ..none }), Err(ErrorKind::Unsupported));
    assert_eq!(dec(ScoreMod { alibi_slopes: Some(AlibiSlopes::PerHead(&long)), ..none }), Err(ErrorKind::Shape));
    assert_eq!(dec(ScoreMod { window: Some((8, 0)), sinks: Some(&good), ..none }), Ok(()));

    // Merge.
    let (k, n) = (2, 1);
    let os = vec![0f32; k * n * hq * d];
    let ls = vec![0f32; k * n * hq];
    let mut mo = vec![0f32; n * hq * d];
    let mut merge = |s: &TensorView<'_, f32, 1>| {
        merge_states_with_sinks(
            &stream,
            &TensorView::host(&os, [k, n, hq, d]).unwrap(),
            &TensorView::host(&ls, [k, n, hq]).unwrap(),
            Some(s),
            &mut TensorViewMut::host(&mut mo, [n, hq, d]).unwrap(),
            None,
        )
        .map_err(|e| e.kind().clone())
    };
    assert_eq!(merge(&short), Err(ErrorKind::Shape));
    assert_eq!(merge(&nan), Err(ErrorKind::Unsupported));
    assert_eq!(merge(&good), Ok(()));
}
