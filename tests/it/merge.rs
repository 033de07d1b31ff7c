//! merge_states against an fp64 reference: fp32 and 16-bit states into 16-bit and fp32 outputs, empty
//! partials (LSE = -inf, with NaN garbage in their O), all-empty rows, a single state, no states at all,
//! strided (transposed) LSE layouts, and bad input -> typed errors.
use crate::common;

use fused_attn::merge::{merge_states, MergeElement};
use fused_attn::testkit::seed::FixtureRng;
use fused_attn::{DType, Element, Emulator, ErrorKind, Stream, TensorView, TensorViewMut};
use half::{bf16, f16};
use rand::Rng;

/// Conversions the test needs for every merge element type: the 16-bit ones through [`Element`], f32 itself.
trait Val: MergeElement + Copy {
    /// The storage format (`None`: fp32), for the arithmetic bound.
    const DTYPE: Option<DType>;
    fn from_f64(x: f64) -> Self;
    fn to_f64(self) -> f64;
    fn nan() -> Self;
    fn round(x: f64) -> f64 {
        Self::DTYPE.map_or(x as f32 as f64, |dt| dt.round(x))
    }
}
impl Val for f32 {
    const DTYPE: Option<DType> = None;
    fn from_f64(x: f64) -> Self {
        x as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn nan() -> Self {
        f32::NAN
    }
}
macro_rules! val_of_element {
    ($($t:ty),*) => {$(
        impl Val for $t {
            const DTYPE: Option<DType> = Some(<$t as Element>::DTYPE);
            fn from_f64(x: f64) -> Self { <$t as Element>::from_f64(x) }
            fn to_f64(self) -> f64 { Element::to_f64(self) }
            fn nan() -> Self { <$t as Element>::nan() }
        }
    )*};
}
val_of_element!(f16, bf16);

/// Seed of one check: the run's base seed (FA_SEED or the fixed default) mixed with the check's shape, so
/// every check of a test draws its own inputs and the same ones on every run.
fn seed_of(tag: u64) -> u64 {
    fused_attn::testkit::seed::case_seed(common::base_seed(), tag)
}

/// States [k, n, h, d] and LSEs [k, n, h]; row (n, h) = (0, 0) has every state empty, row (0, 1) all but one,
/// and a random ~25% of the remaining (state, row) pairs are empty. Empty states carry NaN in their O.
fn states<S: Val>(rng: &mut FixtureRng, k: usize, n: usize, h: usize, d: usize) -> (Vec<S>, Vec<f32>) {
    let mut o = Vec::with_capacity(k * n * h * d);
    let mut lse = Vec::with_capacity(k * n * h);
    for s in 0..k {
        for row in 0..n * h {
            let empty = row == 0 || (row == 1 && s != k / 2) || rng.random_range(0.0..1.0) < 0.25;
            lse.push(if empty { f32::NEG_INFINITY } else { rng.random_range(-6.0..6.0) as f32 });
            for _ in 0..d {
                o.push(if empty { S::nan() } else { S::from_f64(rng.random_range(-1.0..2.0)) });
            }
        }
    }
    (o, lse)
}

/// fp64 reference of the merge (`fused_attn::reference::merge_states` over the given, already rounded,
/// inputs), the "naive" fp32 model of it rounded to the output type (for the tolerance rule), the LSE and
/// the arithmetic bound for an output of type `O`.
type MergeRef = (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>);
fn reference<S: Val, O: Val>(o: &[S], lse: &[f32], k: usize, rows: usize, d: usize) -> MergeRef {
    let o64: Vec<f64> = o.iter().map(|x| x.to_f64()).collect();
    let lse64: Vec<f64> = lse.iter().map(|&x| x as f64).collect();
    let exact = fused_attn::reference::merge_states(k, rows, d, &o64, &lse64).unwrap();
    let bound = exact.out_bound(None, O::DTYPE);
    let mut naive = vec![0.0; rows * d];
    for r in 0..rows {
        if exact.lse[r] == f64::NEG_INFINITY {
            continue;
        }
        let w: Vec<f32> = (0..k).map(|s| ((lse64[s * rows + r] - exact.lse[r]).exp()) as f32).collect();
        for j in 0..d {
            let acc: f32 = (0..k).filter(|&s| w[s] > 0.0).map(|s| w[s] * o64[(s * rows + r) * d + j] as f32).sum();
            naive[r * d + j] = O::round(acc as f64);
        }
    }
    (exact.out, naive, exact.lse, bound)
}

/// Merges random states (see `states`) on the emulator and holds the result to the tolerance rule and the
/// arithmetic bound (fp32 weights, no P rounding, one rounding to O's type). `test` names the calling test
/// for the rerun command.
fn check<S: Val, O: Val>(test: &str, k: usize, n: usize, h: usize, d: usize) {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let seed = seed_of((k * 1_000_000 + n * 10_000 + h * 1000 + d) as u64);
    let mut rng = fused_attn::testkit::seed::rng(seed);
    let (os, ls) = states::<S>(&mut rng, k, n, h, d);
    let mut o = vec![O::nan(); n * h * d];
    let mut lse = vec![f32::NAN; n * h];
    common::merge_host(&stream, [k, n, h, d], (&os, &ls), None, (&mut o, &mut lse)).unwrap();
    let (exact, naive, want_lse, bound) = reference::<S, O>(&os, &ls, k, n * h, d);
    let ours: Vec<f64> = o.iter().map(|x| x.to_f64()).collect();
    let ctx = format!("k={k} n={n} h={h} d={d} seed={seed:#x}; {}", common::rerun("merge", test, None));
    let cmp = fused_attn::reference::compare_bounded(&ours, &exact, &naive, &bound);
    assert!(cmp.passed, "{ctx}: {cmp:?}");
    for r in 0..n * h {
        if want_lse[r] == f64::NEG_INFINITY {
            assert_eq!(lse[r], f32::NEG_INFINITY, "{ctx}: row {r}");
            assert!(ours[r * d..(r + 1) * d].iter().all(|&x| x == 0.0), "{ctx}: row {r} must be 0");
        } else {
            assert!((lse[r] as f64 - want_lse[r]).abs() <= 1e-5 * want_lse[r].abs().max(1.0), "{ctx}: lse row {r}");
        }
    }
}

#[test]
fn fp32_states_into_16_bit_and_fp32() {
    const TEST: &str = "fp32_states_into_16_bit_and_fp32";
    check::<f32, bf16>(TEST, 5, 3, 4, 64);
    check::<f32, f16>(TEST, 7, 2, 3, 128);
    check::<f32, f32>(TEST, 3, 5, 2, 256);
    // More states than one batch of loads (the kernel takes 8 at a time), as split-KV produces.
    check::<f32, bf16>(TEST, 21, 2, 3, 128);
}

#[test]
fn sixteen_bit_states() {
    const TEST: &str = "sixteen_bit_states";
    check::<bf16, bf16>(TEST, 4, 3, 2, 128);
    check::<f16, f32>(TEST, 2, 4, 2, 64);
    check::<bf16, f16>(TEST, 3, 2, 2, 8);
}

#[test]
fn one_state_and_no_states() {
    const TEST: &str = "one_state_and_no_states";
    check::<f32, bf16>(TEST, 1, 3, 2, 64);
    // k = 0: every row is empty.
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let (os, ls): (Vec<f32>, Vec<f32>) = (vec![], vec![]);
    let mut o = vec![bf16::NAN; 2 * 3 * 64];
    let mut lse = vec![f32::NAN; 6];
    common::merge_host(&stream, [0, 2, 3, 64], (&os, &ls), None, (&mut o, &mut lse)).unwrap();
    assert!(o.iter().all(|x| x.to_f64() == 0.0));
    assert!(lse.iter().all(|&x| x == f32::NEG_INFINITY));
}

#[test]
fn transposed_lse_layout_and_no_lse_output() {
    // LSE states stored [k, h, n] (prefill's [B, Hq, Tq] order) and passed as a [k, n, h] view with strides.
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let (k, n, h, d) = (3usize, 4usize, 2usize, 64usize);
    let mut rng = fused_attn::testkit::seed::rng(seed_of(1));
    let (os, ls) = states::<f32>(&mut rng, k, n, h, d);
    let mut ls_t = vec![0f32; k * h * n];
    for s in 0..k {
        for i in 0..n {
            for j in 0..h {
                ls_t[(s * h + j) * n + i] = ls[(s * n + i) * h + j];
            }
        }
    }
    let run = |lse_view: TensorView<'_, f32, 3>| {
        let mut o = vec![bf16::NAN; n * h * d];
        merge_states(
            &stream,
            &TensorView::host(&os, [k, n, h, d]).unwrap(),
            &lse_view,
            &mut TensorViewMut::host(&mut o, [n, h, d]).unwrap(),
            None,
        )
        .unwrap();
        o
    };
    let a = run(TensorView::host(&ls, [k, n, h]).unwrap());
    let b = run(TensorView::host(&ls_t, [k, n, h]).unwrap().with_strides([(h * n) as i64, 1, n as i64]).unwrap());
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
}

#[test]
fn bad_inputs_are_typed_errors() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let os = vec![0f32; 2 * 3 * 12];
    let ls = vec![0f32; 2 * 3];
    let mut o = vec![bf16::ZERO; 3 * 12];
    let e = merge_states(
        &stream,
        &TensorView::host(&os, [2, 3, 1, 12]).unwrap(),
        &TensorView::host(&ls, [2, 3, 1]).unwrap(),
        &mut TensorViewMut::host(&mut o, [3, 1, 12]).unwrap(),
        None,
    )
    .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Unsupported);
    let os = vec![0f32; 2 * 3 * 16];
    let mut o = vec![bf16::ZERO; 3 * 16];
    let e = merge_states(
        &stream,
        &TensorView::host(&os, [2, 3, 1, 16]).unwrap(),
        &TensorView::host(&ls[..4], [2, 2, 1]).unwrap(),
        &mut TensorViewMut::host(&mut o, [3, 1, 16]).unwrap(),
        None,
    )
    .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Shape);
    assert!(e.message().starts_with("lse_states"));
}

#[test]
fn gpu_merge() {
    let Some(cu) = common::gpu_stream_or_skip("merge::gpu_merge") else { return };
    let stream = Stream::Gpu(&cu);
    let (k, n, h, d) = (5usize, 3usize, 4usize, 128usize);
    let mut rng = fused_attn::testkit::seed::rng(seed_of(2));
    let (os, ls) = states::<f32>(&mut rng, k, n, h, d);
    let (osd, lsd) = (cu.clone_htod(&os).unwrap(), cu.clone_htod(&ls).unwrap());
    let mut od = cu.clone_htod(&vec![bf16::NAN; n * h * d]).unwrap();
    merge_states(
        &stream,
        &TensorView::gpu(osd.as_view(), [k, n, h, d]).unwrap(),
        &TensorView::gpu(lsd.as_view(), [k, n, h]).unwrap(),
        &mut TensorViewMut::gpu(od.as_view_mut(), [n, h, d]).unwrap(),
        None,
    )
    .unwrap();
    let o: Vec<bf16> = cu.clone_dtoh(&od).unwrap();
    let (exact, naive, _, bound) = reference::<f32, bf16>(&os, &ls, k, n * h, d);
    let ours: Vec<f64> = o.iter().map(|x| x.to_f64()).collect();
    let cmp = fused_attn::reference::compare_bounded(&ours, &exact, &naive, &bound);
    assert!(cmp.passed, "{cmp:?}; {}", common::rerun("merge", "gpu_merge", None));
}
