//! Paged decode against the fp64 reference: the emulated sweep (a representative subset of
//! `decode::cases::decode_sweep`), the full sweep on a GPU (skipped visibly without one), bitwise
//! reproducibility of a fixed plan, strided q/o, and bad input -> typed errors.
mod common;

use fused_attn::decode::cases::{decode_sweep, decode_sweep_emulated, DecodeCase, PagedFixture};
use fused_attn::decode::{DecodeOptions, DecodeWorkspace};
use fused_attn::plan::DecodePlan;
use fused_attn::{decode, DType, Element, Emulator, ErrorKind, PagedKvCache, Stream, TensorView, TensorViewMut};
use half::{bf16, f16};

/// fp64 reference and the "naive low precision" model of the tolerance rule, over the fixture's pages.
mod reference {
    use super::*;

    pub struct Outputs {
        pub o: Vec<f64>,   // [B, Hq, D]
        pub lse: Vec<f64>, // [B, Hq]
    }

    /// `lowp`: None = exact fp64. Some(dtype) = what a framework computes in the input dtype: fp32 dot
    /// products rounded to dtype (scores), an fp32 softmax rounded to dtype (P), fp32 P.V rounded to dtype.
    pub fn decode<T: Element>(f: &PagedFixture<T>, scale: f64, lowp: Option<DType>) -> Outputs {
        let c = &f.case;
        let (hq, d, g) = (c.heads_q, c.head_dim, c.heads_q / c.heads_kv);
        let mut o = vec![0.0; c.batch() * hq * d];
        let mut lse = vec![f64::NEG_INFINITY; c.batch() * hq];
        for b in 0..c.batch() {
            let (k, v) = f.dense_kv(b);
            let n = c.seq_lens[b];
            if n == 0 {
                continue;
            }
            for h in 0..hq {
                let kvh = h / g;
                let q: Vec<f64> = f.q[(b * hq + h) * d..][..d].iter().map(|x| x.to_f64()).collect();
                let krow = |t: usize| &k[(t * c.heads_kv + kvh) * d..][..d];
                let vval = |t: usize, j: usize| v[(t * c.heads_kv + kvh) * d + j].to_f64();
                let row = &mut o[(b * hq + h) * d..][..d];
                match lowp {
                    None => {
                        let s: Vec<f64> =
                            (0..n).map(|t| q.iter().zip(krow(t)).map(|(a, b)| a * b.to_f64()).sum::<f64>() * scale).collect();
                        let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                        let sum: f64 = e.iter().sum();
                        lse[b * hq + h] = m + sum.ln();
                        for (j, out) in row.iter_mut().enumerate() {
                            *out = (0..n).map(|t| e[t] * vval(t, j)).sum::<f64>() / sum;
                        }
                    }
                    Some(dt) => {
                        let s: Vec<f32> = (0..n)
                            .map(|t| {
                                let dot = q.iter().zip(krow(t)).fold(0f32, |acc, (a, b)| acc + (*a as f32) * (b.to_f64() as f32));
                                dt.round((dot * scale as f32) as f64) as f32
                            })
                            .collect();
                        let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                        let e: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
                        let sum: f32 = e.iter().sum();
                        lse[b * hq + h] = (m + sum.ln()) as f64;
                        let p: Vec<f32> = e.iter().map(|x| dt.round((x / sum) as f64) as f32).collect();
                        for (j, out) in row.iter_mut().enumerate() {
                            *out = dt.round((0..n).fold(0f32, |acc, t| acc + p[t] * vval(t, j) as f32) as f64);
                        }
                    }
                }
            }
        }
        Outputs { o, lse }
    }
}

fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| if x.is_nan() || y.is_nan() { f64::INFINITY } else { (x - y).abs() }).fold(0.0, f64::max)
}

/// Runs one case on `stream` with a fresh seed; checks O against the tolerance rule, LSE against the
/// reference, and empty sequences exactly. Returns the kernel's outputs and plan.
fn check_case<T: Element>(stream: &Stream<'_>, case: &DecodeCase, seed: u64) -> (Vec<T>, Vec<f32>, DecodePlan) {
    let f = PagedFixture::<T>::new(case, seed);
    let (b, hq, d) = (case.batch(), case.heads_q, case.head_dim);
    let (o, lse, plan) = run_decode(stream, &f, None);
    let scale = 1.0 / (d as f64).sqrt();
    let exact = reference::decode(&f, scale, None);
    let naive = reference::decode(&f, scale, Some(T::DTYPE));
    let ours: Vec<f64> = o.iter().map(|x| x.to_f64()).collect();
    let err = max_abs_diff(&ours, &exact.o);
    let naive_err = max_abs_diff(&naive.o, &exact.o);
    let l2 = (ours.iter().zip(&exact.o).map(|(a, b)| (a - b).powi(2)).sum::<f64>()
        / exact.o.iter().map(|b| b * b).sum::<f64>().max(1e-30))
    .sqrt();
    let ctx = format!("{} seed={seed} plan={plan:?}", case.label());
    assert!(err <= 2.0 * naive_err + 1e-5, "{ctx}: max|ours-ref| = {err:.3e} > 2 x naive {naive_err:.3e} + 1e-5 (rel-L2 {l2:.2e})");
    for i in 0..b * hq {
        let (got, want) = (lse[i] as f64, exact.lse[i]);
        if want == f64::NEG_INFINITY {
            assert_eq!(got, f64::NEG_INFINITY, "{ctx}: lse[{i}] of an empty sequence");
            assert!(ours[i * d..(i + 1) * d].iter().all(|&x| x == 0.0), "{ctx}: o row {i} of an empty sequence");
        } else {
            assert!((got - want).abs() <= 1e-3 * want.abs().max(1.0), "{ctx}: lse[{i}] = {got}, reference {want}");
        }
    }
    eprintln!("ok {ctx}: max err {err:.2e} (naive {naive_err:.2e}), rel-L2 {l2:.2e}");
    (o, lse, plan)
}

/// Decodes the fixture with NaN-poisoned outputs; `lse_stride` lays the LSE out with a padded batch stride.
fn run_decode<T: Element>(stream: &Stream<'_>, f: &PagedFixture<T>, opts: Option<DecodeOptions>) -> (Vec<T>, Vec<f32>, DecodePlan) {
    let c = &f.case;
    let (b, hq, d) = (c.batch(), c.heads_q, c.head_dim);
    let opts = opts.unwrap_or(DecodeOptions { scale: None, num_splits: c.num_splits });
    let cache = PagedKvCache::new(
        TensorView::host(&f.k_cache, f.cache_shape()).unwrap(),
        TensorView::host(&f.v_cache, f.cache_shape()).unwrap(),
        TensorView::host(&f.block_table, [b, f.width]).unwrap(),
        TensorView::host(&f.seq_lens, [b]).unwrap(),
        c.max_seq_len(),
    )
    .unwrap();
    let q = TensorView::host(&f.q, [b, hq, d]).unwrap();
    let mut o = vec![T::nan(); b * hq * d];
    let mut lse = vec![f32::NAN; b * hq];
    let probe = DecodeWorkspace::new(stream, 0, 0).unwrap();
    let problem = fused_attn::decode::check_decode_args(&q, &cache, &TensorViewMut::host(&mut o, [b, hq, d]).unwrap(), None).unwrap();
    let plan = probe.plan(&problem, &opts).unwrap();
    let mut ws = DecodeWorkspace::for_plan(stream, &plan).unwrap();
    let mut o_view = TensorViewMut::host(&mut o, [b, hq, d]).unwrap();
    let mut lse_view = TensorViewMut::host(&mut lse, [b, hq]).unwrap();
    let used = decode(stream, &q, &cache, &mut o_view, Some(&mut lse_view), &mut ws, &opts).unwrap();
    assert_eq!(used, plan);
    (o, lse, plan)
}

fn seed_for(i: usize) -> u64 {
    let base: u64 = std::env::var("FA_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    base.wrapping_add(i as u64 * 0x9e37_79b9)
}

fn check_any(stream: &Stream<'_>, case: &DecodeCase, seed: u64) {
    match case.dtype {
        DType::F16 => drop(check_case::<f16>(stream, case, seed)),
        DType::Bf16 => drop(check_case::<bf16>(stream, case, seed)),
    }
}

#[test]
fn emulated_decode_sweep() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    for (i, case) in decode_sweep_emulated().iter().enumerate() {
        check_any(&stream, case, seed_for(i));
    }
}

#[test]
fn gpu_decode_sweep() {
    let Some(ctx) = common::gpu_or_skip("decode::gpu_decode_sweep") else { return };
    let cu = ctx.default_stream();
    for (i, case) in decode_sweep().iter().enumerate() {
        gpu::check_case(&cu, case, seed_for(i));
    }
}

mod gpu {
    use super::*;
    use cudarc::driver::CudaStream;
    use std::sync::Arc;

    pub fn check_case(cu: &Arc<CudaStream>, case: &DecodeCase, seed: u64) {
        match case.dtype {
            DType::F16 => run::<f16>(cu, case, seed),
            DType::Bf16 => run::<bf16>(cu, case, seed),
        }
    }

    fn run<T: Element>(cu: &Arc<CudaStream>, case: &DecodeCase, seed: u64) {
        let f = PagedFixture::<T>::new(case, seed);
        let (b, hq, d) = (case.batch(), case.heads_q, case.head_dim);
        let stream = Stream::Gpu(cu);
        let k = cu.clone_htod(&f.k_cache).unwrap();
        let v = cu.clone_htod(&f.v_cache).unwrap();
        let table = cu.clone_htod(&f.block_table).unwrap();
        let lens = cu.clone_htod(&f.seq_lens).unwrap();
        let qd = cu.clone_htod(&f.q).unwrap();
        let mut od = cu.clone_htod(&vec![T::nan(); b * hq * d]).unwrap();
        let mut lsed = cu.clone_htod(&vec![f32::NAN; b * hq]).unwrap();
        let cache = PagedKvCache::new(
            TensorView::gpu(k.as_view(), f.cache_shape()).unwrap(),
            TensorView::gpu(v.as_view(), f.cache_shape()).unwrap(),
            TensorView::gpu(table.as_view(), [b, f.width]).unwrap(),
            TensorView::gpu(lens.as_view(), [b]).unwrap(),
            case.max_seq_len(),
        )
        .unwrap();
        let q = TensorView::gpu(qd.as_view(), [b, hq, d]).unwrap();
        let opts = DecodeOptions { scale: None, num_splits: case.num_splits };
        let mut ws = DecodeWorkspace::with_capacity(&stream, b, hq, d, 128).unwrap();
        {
            let mut o = TensorViewMut::gpu(od.as_view_mut(), [b, hq, d]).unwrap();
            let mut l = TensorViewMut::gpu(lsed.as_view_mut(), [b, hq]).unwrap();
            decode(&stream, &q, &cache, &mut o, Some(&mut l), &mut ws, &opts).unwrap();
        }
        let o: Vec<T> = cu.clone_dtoh(&od).unwrap();
        let lse: Vec<f32> = cu.clone_dtoh(&lsed).unwrap();
        let scale = 1.0 / (d as f64).sqrt();
        let exact = reference::decode(&f, scale, None);
        let naive = reference::decode(&f, scale, Some(T::DTYPE));
        let ours: Vec<f64> = o.iter().map(|x| x.to_f64()).collect();
        let err = max_abs_diff(&ours, &exact.o);
        let naive_err = max_abs_diff(&naive.o, &exact.o);
        assert!(err <= 2.0 * naive_err + 1e-5, "{} seed={seed}: {err:.3e} vs naive {naive_err:.3e}", case.label());
        for i in 0..b * hq {
            let (got, want) = (lse[i] as f64, exact.lse[i]);
            if want == f64::NEG_INFINITY {
                assert_eq!(got, want, "{} seed={seed}: lse[{i}]", case.label());
            } else {
                assert!((got - want).abs() <= 1e-3 * want.abs().max(1.0), "{} seed={seed}: lse[{i}]", case.label());
            }
        }
    }
}

fn small_case(num_splits: Option<usize>) -> DecodeCase {
    DecodeCase {
        dtype: DType::Bf16,
        head_dim: 128,
        heads_q: 8,
        heads_kv: 2,
        page_size: 16,
        seq_lens: vec![300, 0, 77, 1029],
        num_splits,
    }
}

#[test]
fn fixed_plan_is_bitwise_reproducible() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let f = PagedFixture::<bf16>::new(&small_case(Some(3)), seed_for(0));
    let (o1, l1, p1) = run_decode(&stream, &f, None);
    let (o2, l2, p2) = run_decode(&stream, &f, None);
    assert_eq!(p1, p2);
    assert_eq!(p1.num_splits, 3);
    assert!(o1.iter().zip(&o2).all(|(a, b)| a.to_bits() == b.to_bits()));
    assert!(l1.iter().zip(&l2).all(|(a, b)| a.to_bits() == b.to_bits()));
}

#[test]
fn strided_q_and_o_and_no_lse() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let case = small_case(Some(2));
    let f = PagedFixture::<bf16>::new(&case, seed_for(1));
    let (b, hq, d) = (case.batch(), case.heads_q, case.head_dim);
    let (want, _, _) = run_decode(&stream, &f, None);
    // q and o as head slices of packed [B, 3*Hq, D] tensors.
    let mut q_packed = vec![bf16::NAN; b * 3 * hq * d];
    for i in 0..b {
        for h in 0..hq {
            let src = &f.q[(i * hq + h) * d..][..d];
            q_packed[(i * 3 * hq + hq + h) * d..][..d].copy_from_slice(src);
        }
    }
    let strides = [(3 * hq * d) as i64, d as i64, 1];
    let q = TensorView::host(&q_packed[hq * d..], [b, hq, d]).unwrap().with_strides(strides).unwrap();
    let mut o_packed = vec![bf16::NAN; b * 3 * hq * d];
    let cache = PagedKvCache::new(
        TensorView::host(&f.k_cache, f.cache_shape()).unwrap(),
        TensorView::host(&f.v_cache, f.cache_shape()).unwrap(),
        TensorView::host(&f.block_table, [b, f.width]).unwrap(),
        TensorView::host(&f.seq_lens, [b]).unwrap(),
        case.max_seq_len(),
    )
    .unwrap();
    let mut ws = DecodeWorkspace::with_capacity(&stream, b, hq, d, 2).unwrap();
    {
        let mut o = TensorViewMut::host(&mut o_packed[2 * hq * d..], [b, hq, d]).unwrap().with_strides(strides).unwrap();
        decode(&stream, &q, &cache, &mut o, None, &mut ws, &DecodeOptions { scale: None, num_splits: Some(2) }).unwrap();
    }
    for i in 0..b {
        for h in 0..hq {
            let got = &o_packed[(i * 3 * hq + 2 * hq + h) * d..][..d];
            let exp = &want[(i * hq + h) * d..][..d];
            assert!(got.iter().zip(exp).all(|(a, b)| a.to_bits() == b.to_bits()), "row {i},{h}");
        }
    }
    // Untouched neighbours stay NaN.
    assert!(o_packed[..2 * hq * d].iter().all(|x| x.is_nan()));
}

#[test]
fn bad_inputs_are_typed_errors() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let (b, hq, hkv, d, ps, pages, width) = (2usize, 8usize, 2usize, 64usize, 16usize, 4usize, 2usize);
    let kv = vec![bf16::ZERO; pages * ps * hkv * d];
    let table = vec![0i32; b * width];
    let lens = vec![0i32; b];
    let cache_with = |max_seq_len: usize| {
        PagedKvCache::new(
            TensorView::host(&kv, [pages, ps, hkv, d]).unwrap(),
            TensorView::host(&kv, [pages, ps, hkv, d]).unwrap(),
            TensorView::host(&table, [b, width]).unwrap(),
            TensorView::host(&lens, [b]).unwrap(),
            max_seq_len,
        )
    };
    // Table too narrow for the promised length.
    assert_eq!(cache_with(33).err().unwrap().kind(), &ErrorKind::Shape);
    let cache = cache_with(32).unwrap();
    // Page size 48.
    let kv48 = vec![bf16::ZERO; 2 * 48 * hkv * d];
    let e = PagedKvCache::new(
        TensorView::host(&kv48, [2, 48, hkv, d]).unwrap(),
        TensorView::host(&kv48, [2, 48, hkv, d]).unwrap(),
        TensorView::host(&table, [b, width]).unwrap(),
        TensorView::host(&lens, [b]).unwrap(),
        1,
    )
    .err()
    .unwrap();
    assert_eq!(e.kind(), &ErrorKind::Unsupported);

    let mut ws = DecodeWorkspace::new(&stream, 0, 0).unwrap();
    let opts = DecodeOptions::default();
    let run = |hq: usize, dq: usize, ob: usize, ws: &mut DecodeWorkspace, opts: &DecodeOptions| {
        let qd = vec![bf16::ZERO; b * hq * dq];
        let mut od = vec![bf16::ZERO; ob * hq * dq];
        let q = TensorView::host(&qd, [b, hq, dq]).unwrap();
        let mut o = TensorViewMut::host(&mut od, [ob, hq, dq]).unwrap();
        decode(&stream, &q, &cache, &mut o, None, ws, opts).err().map(|e| (e.kind().clone(), e.message().to_string()))
    };
    assert_eq!(run(hq, d, b, &mut ws, &opts), None);
    // Hq % Hkv != 0.
    assert_eq!(run(7, d, b, &mut ws, &opts).unwrap().0, ErrorKind::Shape);
    // Head dim 100 (and a q/cache head-dim mismatch).
    assert_eq!(run(hq, 96, b, &mut ws, &opts).unwrap().0, ErrorKind::Unsupported);
    assert_eq!(run(hq, 128, b, &mut ws, &opts).unwrap().0, ErrorKind::Shape);
    // o of the wrong batch.
    let (kind, msg) = run(hq, d, b + 1, &mut ws, &opts).unwrap();
    assert_eq!(kind, ErrorKind::Shape);
    assert!(msg.starts_with("o:"), "{msg}");
    // Forced splits without a workspace.
    let split = DecodeOptions { scale: None, num_splits: Some(2) };
    assert_eq!(run(hq, d, b, &mut ws, &split).unwrap().0, ErrorKind::OutOfBounds);
    // Misaligned q rows: a batch stride of Hq*D + 4 elements (8 bytes past a 16-byte multiple).
    let qd = vec![bf16::ZERO; b * (hq * d + 4)];
    let q = TensorView::host(&qd, [b, hq, d]).unwrap().with_strides([(hq * d + 4) as i64, d as i64, 1]).unwrap();
    let mut od = vec![bf16::ZERO; b * hq * d];
    let mut o = TensorViewMut::host(&mut od, [b, hq, d]).unwrap();
    let e = decode(&stream, &q, &cache, &mut o, None, &mut ws, &opts).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Alignment);
    assert!(e.message().starts_with("q"), "{}", e.message());
    // lse of the wrong shape.
    let qd = vec![bf16::ZERO; b * hq * d];
    let q = TensorView::host(&qd, [b, hq, d]).unwrap();
    let mut od = vec![bf16::ZERO; b * hq * d];
    let mut o = TensorViewMut::host(&mut od, [b, hq, d]).unwrap();
    let mut ld = vec![0f32; b * hq];
    let mut l = TensorViewMut::host(&mut ld, [hq, b]).unwrap();
    let e = decode(&stream, &q, &cache, &mut o, Some(&mut l), &mut ws, &opts).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Shape);
    assert!(e.message().starts_with("lse"));
}

#[test]
fn empty_batch_is_a_no_op() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let kv = vec![bf16::ZERO; 2 * 16 * 64];
    let (table, lens, q): (Vec<i32>, Vec<i32>, Vec<bf16>) = (vec![], vec![], vec![]);
    let cache = PagedKvCache::new(
        TensorView::host(&kv, [2, 16, 1, 64]).unwrap(),
        TensorView::host(&kv, [2, 16, 1, 64]).unwrap(),
        TensorView::host(&table, [0, 1]).unwrap(),
        TensorView::host(&lens, [0]).unwrap(),
        16,
    )
    .unwrap();
    let mut o: Vec<bf16> = vec![];
    let mut ws = DecodeWorkspace::new(&stream, 0, 0).unwrap();
    let plan = decode(
        &stream,
        &TensorView::host(&q, [0, 4, 64]).unwrap(),
        &cache,
        &mut TensorViewMut::host(&mut o, [0, 4, 64]).unwrap(),
        None,
        &mut ws,
        &DecodeOptions::default(),
    )
    .unwrap();
    assert_eq!(plan.num_splits, 1);
}
