//! Emulation vs GPU: the same kernels, the same inputs, both backends, outputs compared element by element.
//! This is what makes the host emulator trustworthy: every emulated test elsewhere assumes that the
//! emulator computes what the GPU computes.
//!
//! - Prefill, decode (forced split counts, so both sides follow the same plan), merge: floating-point
//!   kernels whose GPU and emulated arithmetic may differ in the last bits (tensor-core accumulation order,
//!   ex2.approx): both must pass the tolerance rule against the fp64 reference, and they must agree with
//!   each other within that same tolerance. The share of bit-identical elements is printed.
//! - Append (a copy), and the intrinsics self-test kernels whose result is exact (ldmatrix, shuffles, votes,
//!   cp.async, atomics with integer addends, named barriers, the planted-bug kernels' correct twins): bitwise.
//! - mma, the tiled GEMM and fast_exp2: within the fp32 accumulation bound / 4 ulp, bitwise share printed.
//!
//! Every test is named gpu_* (the bundle runs `gpu` with FA_REQUIRE_GPU=1) and skips visibly without a GPU.
//! Run with --nocapture to see the agreement lines.

use crate::common;

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr};
use fused_attn::prefill::{prefill, PrefillKernel, PrefillOptions};
use fused_attn::reference::{self, Arith, Problem, Variants};
use fused_attn::testkit::cases::decode::{DecodeCase, PagedFixture};
use fused_attn::testkit::cases::kv::GpuPaged;
use fused_attn::testkit::cases::kv::KvFormat;
use fused_attn::testkit::emu_selftest::{self as st, BarrierMode, Bug, GemmBug, GemmShape, WarpOp};
use fused_attn::testkit::seed::FixtureRng;
use fused_attn::{
    decode, merge_states, sys::selftest as sys, DType, DecodeOptions, DecodeWorkspace, Element, Emulator, Stream,
    TensorView, TensorViewMut,
};
use half::{bf16, f16};
use rand::Rng;

/// The run's base seed (FA_SEED or the fixed default) mixed with this file's constant.
fn seed() -> u64 {
    fused_attn::testkit::seed::base_seed() ^ 0x6a75_e3a1
}

/// How far the GPU's and the emulator's outputs are apart.
#[derive(Debug)]
struct Agreement {
    max_diff: f64,
    bitwise: usize,
    total: usize,
}

/// Compares two outputs element by element: equal infinities and equal NaN bit patterns count as equal;
/// a NaN on one side only, or a difference above `bound(emu)`, fails. Prints the agreement.
fn agree(what: &str, gpu: &[f64], emu: &[f64], bound: impl Fn(f64) -> f64) -> Agreement {
    assert_eq!(gpu.len(), emu.len(), "{what}: lengths differ");
    let mut a = Agreement { max_diff: 0.0, bitwise: 0, total: gpu.len() };
    for (i, (&g, &e)) in gpu.iter().zip(emu).enumerate() {
        if g.to_bits() == e.to_bits() {
            a.bitwise += 1;
            continue;
        }
        assert!(!g.is_nan() && !e.is_nan(), "{what}[{i}]: GPU {g} vs emulator {e}");
        let d = if g == e { 0.0 } else { (g - e).abs() };
        assert!(d <= bound(e), "{what}[{i}]: GPU {g} vs emulator {e}: |diff| {d:.3e} > {:.3e}", bound(e));
        a.max_diff = a.max_diff.max(d);
    }
    eprintln!(
        "{what}: max|gpu - emu| = {:.2e}, {}/{} bit-identical ({:.1}%)",
        a.max_diff,
        a.bitwise,
        a.total,
        100.0 * a.bitwise as f64 / a.total.max(1) as f64
    );
    a
}

fn bitwise<T: Copy + PartialEq + std::fmt::Debug>(what: &str, gpu: &[T], emu: &[T]) {
    assert_eq!(gpu.len(), emu.len(), "{what}: lengths differ");
    if let Some(i) = (0..gpu.len()).find(|&i| gpu[i] != emu[i]) {
        panic!("{what}: element {i}: GPU {:?} vs emulator {:?} (must be bit-identical)", gpu[i], emu[i]);
    }
    eprintln!("{what}: {} elements bit-identical", gpu.len());
}

fn to_f64<T: Element>(x: &[T]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

fn f32s(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

fn random<T: Element>(rng: &mut FixtureRng, n: usize, lo: f64, hi: f64) -> Vec<T> {
    (0..n).map(|_| T::from_f64(rng.random_range(lo..hi))).collect()
}

// ------------------------------------------------------------------------------------------- prefill

#[derive(Debug, Clone, Copy)]
struct PrefillSpec {
    b: usize,
    tq: usize,
    tk: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    causal: bool,
}

fn prefill_pair<T: Element>(emu: &Emulator, cu: &Arc<CudaStream>, s: PrefillSpec, seed: u64) {
    prefill_pair_on::<T>(emu, cu, s, seed, PrefillKernel::Auto)
}

/// Both backends run `kernel` (`Auto`: the sm_80 kernel in emulation, whichever the GPU picks there).
fn prefill_pair_on<T: Element>(emu: &Emulator, cu: &Arc<CudaStream>, s: PrefillSpec, seed: u64, kernel: PrefillKernel) {
    let what = format!("prefill {} {s:?} {}", T::DTYPE.name(), kernel.name());
    let mut rng = fused_attn::testkit::seed::rng(seed);
    let (qs, ks) = ([s.b, s.tq, s.hq, s.d], [s.b, s.tk, s.hkv, s.d]);
    let q: Vec<T> = random(&mut rng, qs.iter().product(), -2.0, 2.0);
    let k: Vec<T> = random(&mut rng, ks.iter().product(), -2.0, 2.0);
    let v: Vec<T> = random(&mut rng, ks.iter().product(), -0.5, 1.5);
    let opts = PrefillOptions { causal: s.causal, scale: None, kernel, ..Default::default() };
    let lse_shape = [s.b, s.hq, s.tq];
    let (n_o, n_lse) = (q.len(), s.b * s.hq * s.tq);

    let mut emu_o = vec![T::nan(); n_o];
    let mut emu_lse = vec![f32::NAN; n_lse];
    prefill(
        &Stream::Emu(emu),
        &TensorView::host(&q, qs).unwrap(),
        &TensorView::host(&k, ks).unwrap(),
        &TensorView::host(&v, ks).unwrap(),
        &mut TensorViewMut::host(&mut emu_o, qs).unwrap(),
        Some(&mut TensorViewMut::host(&mut emu_lse, lse_shape).unwrap()),
        &opts,
    )
    .unwrap_or_else(|e| panic!("{what}: emulator: {e}"));

    let (dq, dk, dv) = (cu.clone_htod(&q).unwrap(), cu.clone_htod(&k).unwrap(), cu.clone_htod(&v).unwrap());
    let mut d_o = cu.clone_htod(&vec![T::nan(); n_o]).unwrap();
    let mut d_lse = cu.clone_htod(&vec![f32::NAN; n_lse]).unwrap();
    prefill(
        &Stream::Gpu(cu),
        &TensorView::gpu(dq.as_view(), qs).unwrap(),
        &TensorView::gpu(dk.as_view(), ks).unwrap(),
        &TensorView::gpu(dv.as_view(), ks).unwrap(),
        &mut TensorViewMut::gpu(d_o.as_view_mut(), qs).unwrap(),
        Some(&mut TensorViewMut::gpu(d_lse.as_view_mut(), lse_shape).unwrap()),
        &opts,
    )
    .unwrap_or_else(|e| panic!("{what}: GPU: {e}"));
    let gpu_o: Vec<T> = cu.clone_dtoh(&d_o).unwrap();
    let gpu_lse: Vec<f32> = cu.clone_dtoh(&d_lse).unwrap();

    // The kernel's scale is the f32 1/sqrt(D); the reference uses exactly that value.
    let mut p = Problem::new(s.b, s.hq, s.hkv, s.tq, s.tk, s.d, s.causal);
    p.scale = (1.0 / (s.d as f64).sqrt()) as f32 as f64;
    let (q64, k64, v64) = (to_f64(&q), to_f64(&k), to_f64(&v));
    let exact = reference::dense(&p, &Variants::default(), Arith::F64, &q64, &k64, &v64).unwrap();
    let naive = reference::dense(&p, &Variants::default(), Arith::Lowp(T::DTYPE), &q64, &k64, &v64).unwrap().out;
    let (go, eo) = (to_f64(&gpu_o), to_f64(&emu_o));
    let (gc, ec) = (reference::compare(&go, &exact.out, &naive), reference::compare(&eo, &exact.out, &naive));
    assert!(gc.passed, "{what}: GPU fails the tolerance rule: {gc:?}");
    assert!(ec.passed, "{what}: emulator fails the tolerance rule: {ec:?}");
    // Each side is within its tolerance of the fp64 reference, so they may differ by the sum.
    agree(&format!("{what} O"), &go, &eo, |_| gc.tolerance + ec.tolerance);
    let (gl, el) = (f32s(&gpu_lse), f32s(&emu_lse));
    for (side, l) in [("GPU", &gl), ("emulator", &el)] {
        let c = reference::compare_lse(l, &exact.lse, 1e-3);
        assert!(c.passed, "{what}: {side} LSE: {c:?}");
    }
    agree(&format!("{what} LSE"), &gl, &el, |_| 1e-3);
}

#[test]
fn gpu_vs_emu_prefill() {
    let Some(cu) = common::gpu_stream_or_skip("gpu_vs_emulator::gpu_vs_emu_prefill") else { return };
    let emu = Emulator::new();
    let spec = |b, tq, tk, hq, hkv, d, causal| PrefillSpec { b, tq, tk, hq, hkv, d, causal };
    // Tile edges, GQA, Tq != Tk both ways (Tq > Tk causal: the first rows see no key), every head dim class.
    prefill_pair::<bf16>(&emu, &cu, spec(1, 129, 129, 4, 2, 128, true), seed());
    prefill_pair::<f16>(&emu, &cu, spec(2, 65, 200, 2, 1, 64, true), seed() + 1);
    prefill_pair::<bf16>(&emu, &cu, spec(1, 70, 33, 2, 2, 256, true), seed() + 2);
    prefill_pair::<f16>(&emu, &cu, spec(1, 100, 37, 4, 1, 128, false), seed() + 3);
    prefill_pair::<bf16>(&emu, &cu, spec(1, 1, 300, 8, 2, 64, true), seed() + 4);
}

/// The sm_90a prefill kernel on the GPU and in emulation (compute capability 9.0 only).
#[test]
fn gpu_vs_emu_prefill_sm90() {
    let Some(ctx) = hopper_or_skip("gpu_vs_emulator::gpu_vs_emu_prefill_sm90") else { return };
    let cu = ctx.default_stream();
    let emu = Emulator::new();
    let spec = |b, tq, tk, hq, hkv, d, causal| PrefillSpec { b, tq, tk, hq, hkv, d, causal };
    let k = PrefillKernel::Sm90;
    prefill_pair_on::<bf16>(&emu, &cu, spec(1, 129, 129, 4, 2, 128, true), seed(), k);
    prefill_pair_on::<f16>(&emu, &cu, spec(2, 65, 200, 2, 1, 64, true), seed() + 1, k);
    prefill_pair_on::<bf16>(&emu, &cu, spec(1, 70, 33, 2, 2, 256, true), seed() + 2, k);
    prefill_pair_on::<f16>(&emu, &cu, spec(1, 300, 257, 4, 1, 128, false), seed() + 3, k);
    prefill_pair_on::<bf16>(&emu, &cu, spec(1, 1, 300, 8, 2, 64, true), seed() + 4, k);
}

// -------------------------------------------------------------------------------------------- decode

fn decode_pair<T: Element>(emu: &Emulator, cu: &Arc<CudaStream>, case: &DecodeCase, seed: u64) {
    let what = format!("decode {}", case.label());
    let f = PagedFixture::<T>::new(case, seed).unwrap();
    let (b, hq, d) = (case.batch(), case.heads_q, case.head_dim);
    let opts = DecodeOptions { scale: None, num_splits: case.num_splits, ..Default::default() };

    let emu_stream = Stream::Emu(emu);
    let mut emu_o = vec![T::nan(); b * hq * d];
    let mut emu_lse = vec![f32::NAN; b * hq];
    let emu_plan = {
        let cache = f.host_cache().unwrap();
        let plan = DecodeWorkspace::new(&emu_stream, 0, 0).unwrap().plan(&case.problem(), &opts).unwrap();
        let mut ws = DecodeWorkspace::for_plan(&emu_stream, &plan).unwrap();
        common::decode_host(&emu_stream, [b, hq, d], &f.q, &cache, (&mut emu_o, Some(&mut emu_lse)), &mut ws, &opts)
            .unwrap_or_else(|e| panic!("{what}: emulator: {e}"))
    };

    let gpu_stream = Stream::Gpu(cu);
    let inputs = GpuPaged::<T, T>::upload(cu, &f.host()).unwrap();
    let mut d_o = cu.clone_htod(&vec![T::nan(); b * hq * d]).unwrap();
    let mut d_lse = cu.clone_htod(&vec![f32::NAN; b * hq]).unwrap();
    let gpu_plan = {
        let cache = inputs.cache(case.max_seq_len()).unwrap();
        let plan = DecodeWorkspace::new(&gpu_stream, 0, 0).unwrap().plan(&case.problem(), &opts).unwrap();
        let mut ws = DecodeWorkspace::for_plan(&gpu_stream, &plan).unwrap();
        decode(
            &gpu_stream,
            &TensorView::gpu(inputs.q.as_view(), [b, hq, d]).unwrap(),
            &cache,
            &mut TensorViewMut::gpu(d_o.as_view_mut(), [b, hq, d]).unwrap(),
            Some(&mut TensorViewMut::gpu(d_lse.as_view_mut(), [b, hq]).unwrap()),
            &mut ws,
            &opts,
        )
        .unwrap_or_else(|e| panic!("{what}: GPU: {e}"))
    };
    // Forced split counts make the plan independent of the SM count (the emulator plans for 132 SMs).
    assert_eq!(gpu_plan, emu_plan, "{what}: the two backends planned differently");
    let gpu_o: Vec<T> = cu.clone_dtoh(&d_o).unwrap();
    let gpu_lse: Vec<f32> = cu.clone_dtoh(&d_lse).unwrap();

    let scale = 1.0 / (d as f64).sqrt();
    let (q, k, v) = (to_f64(&f.q), to_f64(&f.k_cache), to_f64(&f.v_cache));
    let cache = reference::PagedCache {
        k_cache: &k,
        v_cache: &v,
        num_pages: f.num_pages,
        page_size: case.page_size,
        heads_kv: case.heads_kv,
        head_dim: d,
        head_dim_v: d,
        block_table: &f.block_table,
        max_pages_per_seq: f.width,
        seq_lens: &f.seq_lens,
    };
    let exact = reference::paged_decode(hq, scale, &Variants::default(), Arith::F64, &q, &cache).unwrap();
    let naive =
        reference::paged_decode(hq, scale, &Variants::default(), Arith::Lowp(T::DTYPE), &q, &cache).unwrap().out;
    let (go, eo) = (to_f64(&gpu_o), to_f64(&emu_o));
    let (gc, ec) = (reference::compare(&go, &exact.out, &naive), reference::compare(&eo, &exact.out, &naive));
    assert!(gc.passed, "{what}: GPU fails the tolerance rule: {gc:?}");
    assert!(ec.passed, "{what}: emulator fails the tolerance rule: {ec:?}");
    // Each side is within its tolerance of the fp64 reference, so they may differ by the sum.
    agree(&format!("{what} O"), &go, &eo, |_| gc.tolerance + ec.tolerance);
    agree(&format!("{what} LSE"), &f32s(&gpu_lse), &f32s(&emu_lse), |_| 1e-3);
}

#[test]
fn gpu_vs_emu_decode() {
    let Some(cu) = common::gpu_stream_or_skip("gpu_vs_emulator::gpu_vs_emu_decode") else { return };
    let emu = Emulator::new();
    for (i, splits) in [Some(1), Some(3)].into_iter().enumerate() {
        let case = DecodeCase::new(DType::Bf16, 128, (8, 2), 16, &[0, 1, 17, 300], splits);
        decode_pair::<bf16>(&emu, &cu, &case, seed() + i as u64);
    }
    let case = DecodeCase::new(DType::F16, 64, (20, 1), 8, &[5, 129], Some(2));
    decode_pair::<f16>(&emu, &cu, &case, seed() + 7);
}

// --------------------------------------------------------------------------------------- merge, append

/// Merges the same fp32 states into `O` on both backends; returns (gpu o, emu o, gpu lse, emu lse).
fn merge_both<O: fused_attn::merge::MergeElement + DeviceRepr + Copy>(
    emu: &Emulator,
    cu: &Arc<CudaStream>,
    states: (&[f32], &[f32]),
    dims: [usize; 4],
    poison: O,
) -> (Vec<O>, Vec<O>, Vec<f32>, Vec<f32>) {
    let [k, n, h, d] = dims;
    let (os, ls) = states;
    let mut emu_o = vec![poison; n * h * d];
    let mut emu_lse = vec![f32::NAN; n * h];
    merge_states(
        &Stream::Emu(emu),
        &TensorView::host(os, dims).unwrap(),
        &TensorView::host(ls, [k, n, h]).unwrap(),
        &mut TensorViewMut::host(&mut emu_o, [n, h, d]).unwrap(),
        Some(&mut TensorViewMut::host(&mut emu_lse, [n, h]).unwrap()),
    )
    .unwrap();
    let (dos, dls) = (cu.clone_htod(os).unwrap(), cu.clone_htod(ls).unwrap());
    let mut d_o = cu.clone_htod(&vec![poison; n * h * d]).unwrap();
    let mut d_lse = cu.clone_htod(&vec![f32::NAN; n * h]).unwrap();
    merge_states(
        &Stream::Gpu(cu),
        &TensorView::gpu(dos.as_view(), dims).unwrap(),
        &TensorView::gpu(dls.as_view(), [k, n, h]).unwrap(),
        &mut TensorViewMut::gpu(d_o.as_view_mut(), [n, h, d]).unwrap(),
        Some(&mut TensorViewMut::gpu(d_lse.as_view_mut(), [n, h]).unwrap()),
    )
    .unwrap();
    (cu.clone_dtoh(&d_o).unwrap(), emu_o, cu.clone_dtoh(&d_lse).unwrap(), emu_lse)
}

#[test]
fn gpu_vs_emu_merge() {
    let Some(cu) = common::gpu_stream_or_skip("gpu_vs_emulator::gpu_vs_emu_merge") else { return };
    let emu = Emulator::new();
    let dims @ [k, n, h, d] = [5usize, 3, 4, 128];
    let mut rng = fused_attn::testkit::seed::rng(seed());
    // Row 0 has every state empty (O = 0, LSE = -inf), ~25% of the other (state, row) pairs are empty
    // (their O is NaN: it must never be read).
    let (mut os, mut ls) = (Vec::new(), Vec::new());
    for _ in 0..k {
        for row in 0..n * h {
            let empty = row == 0 || rng.random_range(0.0..1.0) < 0.25;
            ls.push(if empty { f32::NEG_INFINITY } else { rng.random_range(-6.0..6.0) as f32 });
            os.extend((0..d).map(|_| if empty { f32::NAN } else { rng.random_range(-1.0..2.0) as f32 }));
        }
    }
    // fp32 out: the GPU's libdevice exp/log and fma contraction against the host libm and separate roundings;
    // a few ulp either way.
    let (g, e, gl, el) = merge_both::<f32>(&emu, &cu, (&os, &ls), dims, f32::NAN);
    agree("merge fp32 -> fp32 O", &f32s(&g), &f32s(&e), |x| 1e-5 * (1.0 + x.abs()));
    agree("merge fp32 -> fp32 LSE", &f32s(&gl), &f32s(&el), |x| 1e-5 * (1.0 + x.abs()));
    // bf16 out: those fp32 differences may move a value across a rounding boundary: one bf16 ulp.
    let (g, e, _, _) = merge_both::<bf16>(&emu, &cu, (&os, &ls), dims, bf16::NAN);
    agree("merge fp32 -> bf16 O", &to_f64(&g), &to_f64(&e), |x| x.abs() / 128.0 + 1e-5);
}

#[test]
fn gpu_vs_emu_append() {
    let Some(cu) = common::gpu_stream_or_skip("gpu_vs_emulator::gpu_vs_emu_append") else { return };
    // The emulator with the GPU's semantics for the slot past the pool (skipped) below.
    let emu = Emulator::new().with_table_checks(fused_attn::TableChecks::GpuMasking);
    let case = DecodeCase::new(DType::Bf16, 128, (8, 2), 16, &[0, 1, 15, 17, 300], None);
    let f = PagedFixture::<bf16>::new(&case, seed()).unwrap();
    let row = case.heads_kv * case.head_dim;
    // Every owned token, plus a padding slot (-1) and one past the cache: both must be skipped.
    let (mut k, mut v, mut slots) = f.token_rows(|b| 0..case.seq_lens[b]);
    for bad in [-1i64, (f.num_pages * case.page_size + 3) as i64] {
        k.extend(std::iter::repeat_n(bf16::ONE, row));
        v.extend(std::iter::repeat_n(bf16::ONE, row));
        slots.push(bad);
    }
    let poison = vec![bf16::from_bits(0x7fc1); f.k_cache.len()];

    let (mut ek, mut ev) = (poison.clone(), poison.clone());
    common::append_host(&Stream::Emu(&emu), (&k, &v, &slots), (&mut ek, &mut ev), f.cache_shape(), None).unwrap();
    let (mut dkc, mut dvc) = (cu.clone_htod(&poison).unwrap(), cu.clone_htod(&poison).unwrap());
    common::append_gpu(&cu, (&k, &v, &slots), (&mut dkc, &mut dvc), f.cache_shape(), None).unwrap();
    let bits = |x: &[bf16]| x.iter().map(|v| v.to_bits()).collect::<Vec<u16>>();
    bitwise("append K cache", &bits(&cu.clone_dtoh(&dkc).unwrap()), &bits(&ek));
    bitwise("append V cache", &bits(&cu.clone_dtoh(&dvc).unwrap()), &bits(&ev));
}

// --------------------------------------------------------------------------- intrinsics self-test kernels

/// Device address of a buffer for a raw self-test launcher. The guard cudarc returns only matters with
/// several streams; these tests use the context's default stream alone, so it is dropped at once.
fn dptr<T>(cu: &CudaStream, s: &CudaSlice<T>) -> u64 {
    s.device_ptr(cu).0
}

/// Runs one `fa_selftest_*` launcher on `cu` (recorded, then enqueued through the driver API) and waits.
fn launch_gpu<P>(cu: &Arc<CudaStream>, name: &str, launcher: unsafe extern "C" fn(P, *mut sys::FaExec) -> i32, p: P) {
    // SAFETY: `p` holds device addresses of live allocations of the sizes the launcher's contract (abi.h)
    // requires.
    unsafe { fused_attn::testkit::emu_selftest::launch_gpu(cu, name, p, launcher) }
        .unwrap_or_else(|e| panic!("{name} (gpu): {e}"));
    cu.synchronize().unwrap();
}

fn dtype_abi(dtype: DType) -> i32 {
    match dtype {
        DType::F16 => sys::FA_DTYPE_F16 as i32,
        DType::Bf16 => sys::FA_DTYPE_BF16 as i32,
    }
}

fn half_bits(rng: &mut FixtureRng, dtype: DType) -> u32 {
    let x = rng.random_range(-2.0..2.0) as f32;
    (match dtype {
        DType::F16 => f16::from_f32(x).to_bits(),
        DType::Bf16 => bf16::from_f32(x).to_bits(),
    }) as u32
}

#[test]
fn gpu_vs_emu_selftest_intrinsics() {
    let Some(cu) = common::gpu_stream_or_skip("gpu_vs_emulator::gpu_vs_emu_selftest_intrinsics") else { return };
    let mut rng = fused_attn::testkit::seed::rng(seed());

    // mma.m16n8k16: 16 exact products summed in fp32; the tensor core's summation order may differ from the
    // emulator's k order, so: within 16 ulp of the magnitude bound (|a|, |b| <= 2, |c| <= 4: sum <= 68).
    for dtype in [DType::F16, DType::Bf16] {
        let a: [u32; 128] = std::array::from_fn(|_| half_bits(&mut rng, dtype) | half_bits(&mut rng, dtype) << 16);
        let b: [u32; 64] = std::array::from_fn(|_| half_bits(&mut rng, dtype) | half_bits(&mut rng, dtype) << 16);
        let c: [f32; 128] = std::array::from_fn(|_| rng.random_range(-4.0..4.0) as f32);
        let emu = st::mma(dtype, &a, &b, &c, seed()).unwrap();
        let (da, db, dc) = (cu.clone_htod(&a).unwrap(), cu.clone_htod(&b).unwrap(), cu.clone_htod(&c).unwrap());
        let dd = cu.clone_htod(&[f32::NAN; 128]).unwrap();
        let p = sys::FaSelftestMmaParams {
            a: dptr(&cu, &da) as *const u32,
            b: dptr(&cu, &db) as *const u32,
            c: dptr(&cu, &dc) as *const f32,
            d: dptr(&cu, &dd) as *mut f32,
            dtype: dtype_abi(dtype),
        };
        launch_gpu(&cu, "selftest_mma", sys::fa_selftest_mma, p);
        let gpu: Vec<f32> = cu.clone_dtoh(&dd).unwrap();
        agree(&format!("mma {dtype:?}"), &f32s(&gpu), &f32s(&emu), |_| 16.0 * 68.0 * f32::EPSILON as f64);
    }

    // ldmatrix x1/x2/x4, plain and transposed: data movement, bit for bit.
    let rows: Vec<[u16; 8]> = (0..64).map(|_| std::array::from_fn(|_| rng.random::<u64>() as u16)).collect();
    let row_of_lane: [i32; 32] = std::array::from_fn(|_| rng.random_range(0..64) as i32);
    let (drows, dlanes) = (cu.clone_htod(&rows).unwrap(), cu.clone_htod(&row_of_lane).unwrap());
    for count in [1u32, 2, 4] {
        for trans in [false, true] {
            let emu = st::ldmatrix(&rows, &row_of_lane, count, trans, seed()).unwrap();
            let dout = cu.clone_htod(&[0u32; 128]).unwrap();
            let p = sys::FaSelftestLdmatrixParams {
                rows_data: dptr(&cu, &drows) as *const u16,
                row_of_lane: dptr(&cu, &dlanes) as *const i32,
                out: dptr(&cu, &dout) as *mut u32,
                rows: rows.len() as i32,
                count: count as i32,
                trans: trans as i32,
            };
            launch_gpu(&cu, "selftest_ldmatrix", sys::fa_selftest_ldmatrix, p);
            bitwise(&format!("ldmatrix x{count} trans={trans}"), &cu.clone_dtoh(&dout).unwrap(), &emu);
        }
    }

    // Shuffles and votes (operands include out-of-range lanes/masks), and fast_exp2.
    let ops = [
        (WarpOp::ShflXor, sys::FA_SELFTEST_SHFL_XOR),
        (WarpOp::ShflIdx, sys::FA_SELFTEST_SHFL_IDX),
        (WarpOp::Ballot, sys::FA_SELFTEST_BALLOT),
        (WarpOp::Any, sys::FA_SELFTEST_ANY),
        (WarpOp::All, sys::FA_SELFTEST_ALL),
        (WarpOp::Exp2, sys::FA_SELFTEST_EXP2),
    ];
    for (op, abi) in ops {
        let values: [u32; 32] = match op {
            WarpOp::Exp2 => std::array::from_fn(|_| (rng.random_range(-126.0..127.0) as f32).to_bits()),
            // Mostly-true predicates so that all/any both see true and false warps across the two rounds.
            WarpOp::All | WarpOp::Any => std::array::from_fn(|_| (rng.random_range(0..16) != 0) as u32),
            _ => std::array::from_fn(|_| rng.random::<u64>() as u32),
        };
        let operands: [i32; 32] = std::array::from_fn(|_| rng.random_range(0..64) as i32);
        let emu = st::warp_op(op, &values, &operands, seed()).unwrap();
        let (dv, dop) = (cu.clone_htod(&values).unwrap(), cu.clone_htod(&operands).unwrap());
        let dout = cu.clone_htod(&[0u32; 32]).unwrap();
        let p = sys::FaSelftestWarpParams {
            values: dptr(&cu, &dv) as *const u32,
            operands: dptr(&cu, &dop) as *const i32,
            out: dptr(&cu, &dout) as *mut u32,
            op: abi as i32,
        };
        launch_gpu(&cu, "selftest_warp", sys::fa_selftest_warp, p);
        let gpu: Vec<u32> = cu.clone_dtoh(&dout).unwrap();
        if op == WarpOp::Exp2 {
            // ex2.approx is within 2 ulp of 2^x, the emulation too: at most 4 ulp apart.
            let to = |x: &[u32]| x.iter().map(|&b| f32::from_bits(b) as f64).collect::<Vec<_>>();
            agree("fast_exp2", &to(&gpu), &to(&emu), |x| 4.0 * x.abs() * f32::EPSILON as f64);
        } else {
            bitwise(&format!("{op:?}"), &gpu, &emu);
        }
    }

    // cp.async groups with zero-fill: everything waited for, then two of three groups.
    let groups = 3;
    let src: Vec<[u8; 16]> =
        (0..groups * st::CP_ASYNC_THREADS).map(|_| std::array::from_fn(|_| rng.random::<u64>() as u8)).collect();
    let preds: Vec<bool> = (0..src.len()).map(|_| rng.random_range(0..4) != 0).collect();
    for (wait_pending, read_groups) in [(0u32, 3u32), (1, 2)] {
        let emu = st::cp_async(&src, &preds, wait_pending, read_groups, seed()).unwrap();
        let pred_bytes: Vec<u8> = preds.iter().map(|&p| p as u8).collect();
        let (ds, dp) = (cu.clone_htod(&src).unwrap(), cu.clone_htod(&pred_bytes).unwrap());
        let dout = cu.clone_htod(&vec![[st::UNTOUCHED; 16]; src.len()]).unwrap();
        let p = sys::FaSelftestCpAsyncParams {
            src: dptr(&cu, &ds) as *const u8,
            preds: dptr(&cu, &dp) as *const u8,
            out: dptr(&cu, &dout) as *mut u8,
            groups: groups as i32,
            wait_pending: wait_pending as i32,
            read_groups: read_groups as i32,
        };
        launch_gpu(&cu, "selftest_cp_async", sys::fa_selftest_cp_async, p);
        bitwise(&format!("cp.async wait {wait_pending}"), &cu.clone_dtoh(&dout).unwrap(), &emu);
    }

    // Atomics: the counter and the float sum (small integers: exact in any order) bit for bit; the values
    // handed out are a permutation on both backends (their order is the scheduler's).
    let addends: Vec<f32> = (0..5 * st::BLOCK_THREADS).map(|i| (i % 17) as f32 - 8.0).collect();
    let emu = st::atomics(&addends, seed()).unwrap();
    let (dcounter, dsum) = (cu.clone_htod(&[0i32]).unwrap(), cu.clone_htod(&[0f32]).unwrap());
    let (dolds, dadd) = (cu.clone_htod(&vec![-1i32; addends.len()]).unwrap(), cu.clone_htod(&addends).unwrap());
    let p = sys::FaSelftestAtomicParams {
        counter: dptr(&cu, &dcounter) as *mut i32,
        olds: dptr(&cu, &dolds) as *mut i32,
        sum: dptr(&cu, &dsum) as *mut f32,
        addends: dptr(&cu, &dadd) as *const f32,
        blocks: 5,
    };
    launch_gpu(&cu, "selftest_atomic", sys::fa_selftest_atomic, p);
    bitwise("atomic counter", &cu.clone_dtoh(&dcounter).unwrap(), &[emu.counter]);
    bitwise("atomic sum", &cu.clone_dtoh(&dsum).unwrap(), &[emu.sum]);
    let (mut g, mut e) = (cu.clone_dtoh(&dolds).unwrap(), emu.olds.clone());
    g.sort_unstable();
    e.sort_unstable();
    bitwise("atomic values handed out (sorted)", &g, &e);

    // Named barriers: the orderly scenarios (the racy / mismatched ones are emulator fault tests).
    for (mode, abi) in
        [(BarrierMode::Pairs, sys::FA_SELFTEST_BARRIER_PAIRS), (BarrierMode::Block, sys::FA_SELFTEST_BARRIER_BLOCK)]
    {
        let emu = st::barriers(mode, seed()).unwrap();
        let dout = cu.clone_htod(&vec![i32::MIN; st::BLOCK_THREADS]).unwrap();
        let p = sys::FaSelftestBarrierParams { out: dptr(&cu, &dout) as *mut i32, mode: abi as i32 };
        launch_gpu(&cu, "selftest_barrier", sys::fa_selftest_barrier, p);
        bitwise(&format!("barriers {mode:?}"), &cu.clone_dtoh(&dout).unwrap(), &emu);
    }
}

#[test]
fn gpu_vs_emu_selftest_planted_bug_twins() {
    let Some(cu) = common::gpu_stream_or_skip("gpu_vs_emulator::gpu_vs_emu_selftest_planted_bug_twins") else { return };
    let input: Vec<f32> = (0..st::BUG_ELEMS).map(|i| 1.0 + i as f32 * 0.25).collect();
    let din = cu.clone_htod(&input).unwrap();
    for bug in Bug::ALL {
        // The GPU build rejects kernels with a stack frame, so this one exists in emulation only.
        if bug == Bug::StackOverflow {
            continue;
        }
        let emu = st::planted_bug(bug, false, true, &input, seed()).unwrap();
        // Twice the elements, as the emulated run's spare capacity: a stray write would land in the poison.
        let dout = cu.clone_htod(&vec![f32::NAN; 2 * st::BUG_ELEMS]).unwrap();
        let p = sys::FaSelftestBugParams {
            input: dptr(&cu, &din) as *const f32,
            out: dptr(&cu, &dout) as *mut f32,
            bug: bug.abi(),
            planted: 0,
            race_detection: 1,
        };
        launch_gpu(&cu, "selftest_bug", sys::fa_selftest_bug, p);
        let gpu: Vec<u32> = cu.clone_dtoh(&dout).unwrap().iter().map(|x| x.to_bits()).collect();
        let emu: Vec<u32> = emu.iter().map(|x| x.to_bits()).collect();
        bitwise(&format!("correct twin of {bug:?}"), &gpu[..st::BUG_ELEMS], &emu);
        assert!(gpu[st::BUG_ELEMS..].iter().all(|&b| b == f32::NAN.to_bits()), "{bug:?}: wrote past the output");
    }
}

#[test]
fn gpu_vs_emu_selftest_gemm() {
    let Some(cu) = common::gpu_stream_or_skip("gpu_vs_emulator::gpu_vs_emu_selftest_gemm") else { return };
    gemm_pair::<f16>(&cu, GemmShape { m: 64, n: 64, k: 64, b_k_major: false });
    gemm_pair::<bf16>(&cu, GemmShape { m: 72, n: 40, k: 96, b_k_major: true });
    gemm_pair::<f16>(&cu, GemmShape { m: 128, n: 128, k: 128, b_k_major: true });
}

fn gemm_pair<T: Element>(cu: &Arc<CudaStream>, s: GemmShape) {
    let mut rng = fused_attn::testkit::seed::rng(seed() ^ (s.m * s.n * s.k) as u64);
    let a: Vec<T> = random(&mut rng, s.m * s.k, -0.75, 1.25);
    let b: Vec<T> = random(&mut rng, s.n * s.k, -0.75, 1.25);
    let emu = st::gemm(&a, &b, s, GemmBug::None, seed()).unwrap();
    let (da, db) = (cu.clone_htod(&a).unwrap(), cu.clone_htod(&b).unwrap());
    let dc = cu.clone_htod(&vec![f32::NAN; s.m * s.n]).unwrap();
    let p = sys::FaSelftestGemmParams {
        a: dptr(cu, &da) as *const std::ffi::c_void,
        b: dptr(cu, &db) as *const std::ffi::c_void,
        c: dptr(cu, &dc) as *mut f32,
        m: s.m as i32,
        n: s.n as i32,
        k: s.k as i32,
        dtype: dtype_abi(T::DTYPE),
        b_k_major: s.b_k_major as i32,
        bug: sys::FA_SELFTEST_GEMM_CORRECT as i32,
    };
    launch_gpu(cu, "selftest_gemm", sys::fa_selftest_gemm, p);
    let gpu: Vec<f32> = cu.clone_dtoh(&dc).unwrap();
    // Per element: two fp32 summations of the same k exact products differ by at most k·eps·Σ|a b|.
    let magnitude = |i: usize, j: usize| -> f64 {
        (0..s.k)
            .map(|kk| {
                let bv = if s.b_k_major { b[kk * s.n + j] } else { b[j * s.k + kk] };
                (a[i * s.k + kk].to_f64() * bv.to_f64()).abs()
            })
            .sum()
    };
    let bounds: Vec<f64> =
        (0..s.m * s.n).map(|e| s.k as f64 * f32::EPSILON as f64 * magnitude(e / s.n, e % s.n)).collect();
    let mut worst = 0.0f64;
    for (e, (&g, &x)) in gpu.iter().zip(&emu).enumerate() {
        let d = (g as f64 - x as f64).abs();
        assert!(!g.is_nan() && d <= bounds[e], "gemm {s:?} c[{e}]: GPU {g} vs emulator {x} (bound {:.2e})", bounds[e]);
        worst = worst.max(d);
    }
    agree(&format!("gemm {} {s:?}", T::DTYPE.name()), &f32s(&gpu), &f32s(&emu), |_| worst);
}

// ------------------------------------------------------------------------------------ Hopper (sm_90a)

use crate::common::hopper_model;

/// A GPU of compute capability 9.0 with the sm_90a kernels built, or `None` (skipped visibly; with
/// FA_REQUIRE_GPU=1 an sm_90 GPU without the sm_90a kernels fails).
fn hopper_or_skip(test: &str) -> Option<Arc<cudarc::driver::CudaContext>> {
    let ctx = common::gpu_or_skip(test)?;
    let (major, minor) = ctx.compute_capability().unwrap();
    if (major, minor) != (9, 0) {
        eprintln!("skipped: {test} needs an sm_90 GPU (this one is sm_{major}{minor})");
        return None;
    }
    let built = fused_attn::build_info::CUDA_ARCHS.split(',').any(|a| a.trim() == "90a");
    if !built {
        assert!(
            !std::env::var("FA_REQUIRE_GPU").is_ok_and(|v| v == "1"),
            "{test}: an sm_90 GPU, but this build has no sm_90a kernels (FA_CUDA_ARCHS lacks 90a)"
        );
        eprintln!("skipped: {test}: this build has no sm_90a kernels");
        return None;
    }
    Some(ctx)
}

/// The wgmma, TMA and planted-bug-twin self-tests on the GPU and on the emulator, bit for bit: the guard
/// against the kernels and the emulator sharing one misreading of the PTX ISA. Inputs are small integers,
/// so every fp32 sum is exact and the tensor cores' summation order cannot matter. Also the
/// warp-specialised GEMM (exact inputs: bit for bit).
#[test]
fn gpu_vs_emu_selftest_hopper() {
    use fused_attn::testkit::emu_selftest::{Sm90Bug, WsGemmBug};
    use hopper_model::*;
    let Some(ctx) = hopper_or_skip("gpu_vs_emulator::gpu_vs_emu_selftest_hopper") else { return };
    let cu = ctx.default_stream();
    const SEED: u64 = 0x90a;
    let mut rng = fused_attn::testkit::seed::rng(seed() ^ SEED);

    // wgmma: every layout pair at N = 64, SS and RS, both dtypes; every N with a few layouts.
    let mut cases = 0;
    for WgmmaSweepCase { dtype, n, a_sw, b_sw, rs, accumulate } in wgmma_sweep() {
        let s = wgmma_setup(&mut rng, dtype, n, a_sw, b_sw, rs, true);
        let case = s.case(dtype, n, accumulate);
        let emu = st::wgmma(&case, SEED).unwrap();
        let (da, db) = (cu.clone_htod(&s.a_img.clone().max_len(16)).unwrap(), cu.clone_htod(&s.b_img).unwrap());
        let dr = cu.clone_htod(&s.a_regs.clone().unwrap_or_else(|| vec![0u32; 4])).unwrap();
        let (dc, dd) = (cu.clone_htod(&s.c).unwrap(), cu.clone_htod(&vec![f32::NAN; s.c.len()]).unwrap());
        let mut p = case.params(dptr(&cu, &dd) as *mut f32).unwrap();
        p.a_smem = dptr(&cu, &da) as *const u8;
        p.b_smem = dptr(&cu, &db) as *const u8;
        p.a_regs = if rs { dptr(&cu, &dr) as *const u32 } else { std::ptr::null() };
        p.c = dptr(&cu, &dc) as *const f32;
        launch_gpu(&cu, "selftest_wgmma", sys::fa_selftest_wgmma, p);
        let gpu: Vec<u32> = cu.clone_dtoh(&dd).unwrap().iter().map(|x| x.to_bits()).collect();
        let emu: Vec<u32> = emu.iter().map(|x| x.to_bits()).collect();
        bitwise(&format!("wgmma {dtype:?} n={n} A {a_sw:?} B {b_sw:?} rs={rs}"), &gpu, &emu);
        cases += 1;
    }
    assert!(cases >= 150);

    // TMA loads (ranks 1-5, out-of-bounds boxes, every swizzle; expect_tx = the whole box) and stores.
    for (spec, coords) in tma_cases() {
        let tensor = tensor_bytes(&mut rng, tensor_len(&spec));
        let emu = st::tma_load(&spec, &tensor, &coords, spec.box_bytes() as u32, SEED).unwrap();
        let dt = cu.clone_htod(&tensor).unwrap();
        let dimg = cu.clone_htod(&vec![0xA5u8; spec.box_bytes() as usize]).unwrap();
        let map = spec.encode_gpu(dptr(&cu, &dt)).unwrap();
        let p = st::tma_params(
            map,
            dptr(&cu, &dimg) as *mut u8,
            &coords,
            &spec,
            spec.box_bytes() as u32,
            sys::FA_SELFTEST_TMA_LOAD,
        )
        .unwrap();
        launch_gpu(&cu, "selftest_tma", sys::fa_selftest_tma, p);
        bitwise(&format!("TMA load {spec:?} at {coords:?}"), &cu.clone_dtoh(&dimg).unwrap(), &emu);

        let image = tensor_bytes(&mut rng, spec.box_bytes() as usize);
        let mut emu_tensor = tensor.clone();
        st::tma_store(&spec, &mut emu_tensor, &coords, &image, SEED).unwrap();
        let (dt, dimg) = (cu.clone_htod(&tensor).unwrap(), cu.clone_htod(&image).unwrap());
        let map = spec.encode_gpu(dptr(&cu, &dt)).unwrap();
        let p =
            st::tma_params(map, dptr(&cu, &dimg) as *mut u8, &coords, &spec, 0, sys::FA_SELFTEST_TMA_STORE).unwrap();
        launch_gpu(&cu, "selftest_tma", sys::fa_selftest_tma, p);
        bitwise(&format!("TMA store {spec:?} at {coords:?}"), &cu.clone_dtoh(&dt).unwrap(), &emu_tensor);
    }

    // The planted bugs' correct twins: what they write (and, for the TMA-store twins, the tile stored back).
    let input = exact_values(&mut rng, DType::F16, st::SM90_BUG_INPUT);
    for bug in Sm90Bug::ALL {
        let mut emu_input = input.clone();
        let emu = st::sm90_bug(bug, false, &mut emu_input, SEED).unwrap();
        let (din, dout) = (cu.clone_htod(&input).unwrap(), cu.clone_htod(&vec![f32::NAN; st::SM90_BUG_OUT]).unwrap());
        let p = sys::FaSelftestSm90BugParams {
            map: st::sm90_bug_map_spec().encode_gpu(dptr(&cu, &din)).unwrap(),
            input: dptr(&cu, &din) as *const u16,
            out: dptr(&cu, &dout) as *mut f32,
            bug: bug.abi(),
            planted: 0,
        };
        launch_gpu(&cu, "selftest_sm90_bug", sys::fa_selftest_sm90_bug, p);
        let gpu: Vec<u32> = cu.clone_dtoh(&dout).unwrap().iter().map(|x| x.to_bits()).collect();
        bitwise(&format!("correct twin of {bug:?}"), &gpu, &emu.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
        bitwise(&format!("input after the twin of {bug:?}"), &cu.clone_dtoh(&din).unwrap(), &emu_input);
    }

    // The warp-specialised GEMM, K- and N-major B, on exact data.
    for (m, n, k, mn) in [(256usize, 128usize, 320usize, false), (200, 136, 200, true)] {
        for dtype in [DType::F16, DType::Bf16] {
            let a = exact_values(&mut rng, dtype, m * k);
            let b = exact_values(&mut rng, dtype, n * k);
            let emu = match dtype {
                DType::F16 => {
                    st::ws_gemm(&as_elems::<f16>(&a), &as_elems::<f16>(&b), (m, n, k), mn, WsGemmBug::None, SEED)
                }
                DType::Bf16 => {
                    st::ws_gemm(&as_elems::<bf16>(&a), &as_elems::<bf16>(&b), (m, n, k), mn, WsGemmBug::None, SEED)
                }
            }
            .unwrap();
            let (sa, sb) = st::ws_gemm_map_specs(m, n, k, mn);
            let (da, db) = (cu.clone_htod(&a).unwrap(), cu.clone_htod(&b).unwrap());
            let dc = cu.clone_htod(&vec![f32::NAN; m * n]).unwrap();
            let p = st::ws_gemm_params(
                sa.encode_gpu(dptr(&cu, &da)).unwrap(),
                sb.encode_gpu(dptr(&cu, &db)).unwrap(),
                dptr(&cu, &dc) as *mut f32,
                (m, n, k),
                dtype,
                mn,
                WsGemmBug::None,
            )
            .unwrap();
            launch_gpu(&cu, "selftest_ws_gemm", sys::fa_selftest_ws_gemm, p);
            let gpu: Vec<u32> = cu.clone_dtoh(&dc).unwrap().iter().map(|x| x.to_bits()).collect();
            bitwise(
                &format!("ws gemm {dtype:?} {m}x{n}x{k} mn={mn}"),
                &gpu,
                &emu.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            );
        }
    }
}

/// Raw 16-bit values as elements of `T`.
fn as_elems<T: Element>(bits: &[u16]) -> Vec<T> {
    bits.iter().map(|&b| T::from_f64(hopper_model::to_f32(T::DTYPE, b) as f64)).collect()
}

trait MaxLen {
    fn max_len(self, n: usize) -> Self;
}
impl MaxLen for Vec<u8> {
    /// At least `n` bytes (an SS-less RS case has no A image; the device buffer may not be empty).
    fn max_len(mut self, n: usize) -> Self {
        if self.len() < n {
            self.resize(n, 0);
        }
        self
    }
}

// ------------------------------------------------------------------------------------ FP8 KV cache

/// FP8 conversions on the GPU (the hardware cvt on sm_89+, the software model on sm_80/86) against the
/// emulator's (the scalar model), bit for bit: all 256 codes of both formats (FP8 -> fp16), every fp16 and
/// bf16 value through the quantiser (fp32 -> FP8, RN, satfinite), plus infinities and NaNs.
#[test]
fn gpu_vs_emu_fp8_conversions() {
    let Some(cu) = common::gpu_stream_or_skip("gpu_vs_emulator::gpu_vs_emu_fp8_conversions") else { return };
    for format in [fused_attn::Fp8Format::E4m3, fused_attn::Fp8Format::E5m2] {
        let pairs: Vec<u16> = (0..=255u16).map(|c| c | (((c * 37 + 11) & 0xff) << 8)).collect();
        let emu = st::fp8_decode_emulated(format, &pairs, seed()).unwrap();
        let d_pairs = cu.clone_htod(&pairs).unwrap();
        let d_halves = cu.alloc_zeros::<u32>(pairs.len()).unwrap();
        let p = st::fp8_params(
            format,
            dptr(&cu, &d_pairs) as *const u16,
            std::ptr::null(),
            dptr(&cu, &d_halves) as *mut u32,
            std::ptr::null_mut(),
            pairs.len(),
            false,
        )
        .unwrap();
        launch_gpu(&cu, "selftest_fp8", sys::fa_selftest_fp8, p);
        bitwise(&format!("fp8 {format:?} -> fp16"), &cu.clone_dtoh(&d_halves).unwrap(), &emu);

        let mut x: Vec<f32> = (0..=u16::MAX).map(|b| f16::from_bits(b).to_f32()).collect();
        x.extend((0..=u16::MAX).map(|b| bf16::from_bits(b).to_f32()));
        x.extend([f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -f32::NAN]);
        let emu = st::fp8_encode_emulated(format, &x, seed()).unwrap();
        let d_x = cu.clone_htod(&x).unwrap();
        let d_codes = cu.alloc_zeros::<u16>(x.len() / 2).unwrap();
        let p = st::fp8_params(
            format,
            std::ptr::null(),
            dptr(&cu, &d_x) as *const f32,
            std::ptr::null_mut(),
            dptr(&cu, &d_codes) as *mut u16,
            x.len() / 2,
            true,
        )
        .unwrap();
        launch_gpu(&cu, "selftest_fp8", sys::fa_selftest_fp8, p);
        bitwise(&format!("fp32 -> fp8 {format:?}"), &cu.clone_dtoh(&d_codes).unwrap(), &emu);
    }
}

/// FP8 decode on both backends (forced splits: the same plan): each passes the tolerance rule against the
/// fp64 reference over the stored cache, and they agree within the sum of the tolerances (the softmax's
/// ex2.approx may differ in the last bits, as for 16-bit decode); the share of bit-identical outputs is
/// printed. The K/V codes the GPU's quantising append writes are compared with the emulator's bit for bit.
#[test]
fn gpu_vs_emu_fp8_decode() {
    use fused_attn::testkit::cases::decode::{run_case_emulated, run_case_gpu};
    use fused_attn::{Fp8E4m3, Fp8Format, ScaleKind};
    let Some(cu) = common::gpu_stream_or_skip("gpu_vs_emulator::gpu_vs_emu_fp8_decode") else { return };
    let emu = Emulator::new();
    let cases = [
        (DType::Bf16, Fp8Format::E4m3, ScaleKind::PerHead, 128, (8, 2), Some(1)),
        (DType::F16, Fp8Format::E5m2, ScaleKind::PerTensor, 64, (20, 1), Some(3)),
        (DType::Bf16, Fp8Format::E5m2, ScaleKind::PerHead, 256, (16, 2), Some(2)),
        (DType::F16, Fp8Format::E4m3, ScaleKind::PerTensor, 128, (4, 4), Some(1)),
    ];
    for (i, &(dtype, format, scales, d, (hq, hkv), splits)) in cases.iter().enumerate() {
        let case = DecodeCase {
            kv: KvFormat::Fp8 { format, scales },
            ..DecodeCase::new(dtype, d, (hq, hkv), [16, 1, 256, 8][i], &[0, 1, 17, 300], splits)
        };
        let what = format!("fp8 decode {}", case.label());
        let s = seed() + i as u64;
        macro_rules! pair {
            ($t:ty) => {{
                let g = run_case_gpu::<$t>(&cu, &case, s).unwrap_or_else(|e| panic!("{what}: GPU: {e}"));
                let e = run_case_emulated::<$t>(&emu, &case, s).unwrap_or_else(|e| panic!("{what}: emulator: {e}"));
                assert_eq!(g.outcome.plan, e.outcome.plan, "{what}: plans differ");
                assert!(g.outcome.passed(), "{what}: GPU: {}", g.outcome.summary());
                assert!(e.outcome.passed(), "{what}: emulator: {}", e.outcome.summary());
                let tol = g.outcome.out.tolerance + e.outcome.out.tolerance;
                agree(&format!("{what} O"), &to_f64(&g.o), &to_f64(&e.o), |_| tol);
                agree(&format!("{what} LSE"), &f32s(&g.lse), &f32s(&e.lse), |_| 1e-3);
            }};
        }
        match dtype {
            DType::F16 => pair!(f16),
            DType::Bf16 => pair!(bf16),
        }
    }

    // Quantising append: every token of a bf16 fixture into a zeroed E4M3 cache, on both backends.
    let case = DecodeCase {
        kv: KvFormat::Fp8 { format: Fp8Format::E4m3, scales: ScaleKind::PerHead },
        ..DecodeCase::new(DType::Bf16, 128, (8, 2), 16, &[1, 17, 300], Some(1))
    };
    let sx = PagedFixture::<bf16>::new(&case, seed()).unwrap();
    let fp8 = sx.fp8.as_ref().unwrap();
    let (k, v, slots) = sx.token_rows(|b| 0..case.seq_lens[b]);
    let (emu_k, emu_v) = {
        let stream = Stream::Emu(&emu);
        let scales = fp8.scales(&stream).unwrap();
        let (mut kc, mut vc) = (vec![Fp8E4m3(0); fp8.k_codes.len()], vec![Fp8E4m3(0); fp8.v_codes.len()]);
        common::append_host(&stream, (&k, &v, &slots), (&mut kc, &mut vc), sx.cache_shape(), Some(&scales)).unwrap();
        (kc, vc)
    };
    let scales = fp8.scales(&Stream::Gpu(&cu)).unwrap();
    let mut dkc = cu.alloc_zeros::<Fp8E4m3>(fp8.k_codes.len()).unwrap();
    let mut dvc = cu.alloc_zeros::<Fp8E4m3>(fp8.v_codes.len()).unwrap();
    common::append_gpu(&cu, (&k, &v, &slots), (&mut dkc, &mut dvc), sx.cache_shape(), Some(&scales)).unwrap();
    let (gk, gv): (Vec<Fp8E4m3>, Vec<Fp8E4m3>) = (cu.clone_dtoh(&dkc).unwrap(), cu.clone_dtoh(&dvc).unwrap());
    bitwise("fp8 append K", &gk, &emu_k);
    bitwise("fp8 append V", &gv, &emu_v);
}
