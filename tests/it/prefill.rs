//! Prefill attention against the fp64 reference, on the host emulator (always) and the GPU (when present):
//! the shared sweep (`prefill::sweep_cases`), the emulation budget case, determinism across scheduling
//! seeds, and invalid input -> typed errors.
//!
//! Tolerance (docs/semantics.md): max|ours − ref64| ≤ 2 · max|naive − ref64| + 1e-5, where naive is a plain
//! same-dtype implementation (scores, softmax output and P·V rounded to the input dtype, fp32 inside). LSE:
//! the same rule against a naive LSE over the dtype-rounded scores, and -inf exactly where the reference
//! row is empty. NaN never passes; outputs are poisoned with NaN before every launch, and elements outside
//! the logical tensor (padding) must still be NaN afterwards.
use crate::common;

use std::time::Instant;

use fused_attn::prefill::{prefill, prefill_varlen, PrefillOptions};
use fused_attn::testkit::cases::prefill::{
    head_dim_sweep_cases, run_emulated, run_gpu, v_head_dim_cases, wide_head_dim_cases, PrefillFixture,
};
use fused_attn::testkit::cases::prefill::{sweep_cases, CaseLayout, PrefillCase};
use fused_attn::{DType, Element, Emulator, ErrorKind, Stream, TensorView, TensorViewMut};
use half::{bf16, f16};

/// Base seed: FA_SEED if set, else fixed; each case derives its own from it and its index.
fn base_seed() -> u64 {
    common::base_seed()
}

// ---------------------------------------------------------------------------------------------- running
// Inputs, NaN poisoning, the launch and the comparison with the fp64 reference are the library's
// (`fused_attn::testkit::cases::prefill`, shared with the runner); this file drives them.

/// Runs the selected (FA_CASE) `cases` on `workers` threads with `run`, collecting failures; panics listing
/// them all, each with the command that reruns it (`test`: the calling test's name).
fn sweep(
    test: &str,
    cases: Vec<PrefillCase>,
    workers: usize,
    run: &(dyn Fn(usize, &PrefillCase) -> Result<String, String> + Sync),
) {
    let name = test;
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..workers.max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(case) = cases.get(i) else { break };
                if !common::case_selected(i) {
                    continue;
                }
                match run(i, case) {
                    Ok(msg) => eprintln!("ok   [{i}] {}: {msg}", case.label()),
                    Err(msg) => {
                        let msg =
                            format!("[{i}] {}: {msg}\n    {}", case.label(), common::rerun("prefill", test, Some(i)));
                        eprintln!("FAIL {msg}");
                        failures.lock().unwrap().push(msg);
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    eprintln!("{name}: {} cases in {:.1} s, {} failed", cases.len(), start.elapsed().as_secs_f64(), failures.len());
    assert!(
        failures.is_empty(),
        "{name}: {} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

fn case_seed(i: usize) -> u64 {
    common::case_seed(i)
}

/// Builds, runs and judges one case on `run`; Ok(summary) or Err(summary with the seed to rerun).
fn check_case<T: Element>(
    i: usize,
    case: &PrefillCase,
    run: impl FnOnce(&PrefillFixture<T>) -> fused_attn::Result<fused_attn::testkit::cases::prefill::PrefillOutputs<T>>,
) -> Result<String, String> {
    let seed = case_seed(i);
    let result = PrefillFixture::<T>::new(case, seed)
        .and_then(|f| {
            let out = run(&f)?;
            f.evaluate(&out)
        })
        .map_err(|e| e.to_string())
        .and_then(|outcome| {
            if outcome.passed() {
                Ok(format!("{}, launch {:.2} s", outcome.summary(), outcome.launch_secs))
            } else {
                Err(outcome.summary())
            }
        });
    result.map_err(|e| format!("{e} (case seed {seed:#x}, base seed {:#x})", base_seed()))
}

fn emu_case(emu: &Emulator, i: usize, case: &PrefillCase) -> Result<String, String> {
    match case.dtype {
        DType::F16 => check_case::<f16>(i, case, |f| run_emulated(emu, f)),
        DType::Bf16 => check_case::<bf16>(i, case, |f| run_emulated(emu, f)),
    }
}

fn gpu_case(s: &std::sync::Arc<cudarc::driver::CudaStream>, i: usize, case: &PrefillCase) -> Result<String, String> {
    match case.dtype {
        DType::F16 => check_case::<f16>(i, case, |f| run_gpu(s, f)),
        DType::Bf16 => check_case::<bf16>(i, case, |f| run_gpu(s, f)),
    }
}

fn workers() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

// ---------------------------------------------------------------------------------------------- tests

/// The emulation subset of the sweep (FA_PREFILL_SWEEP=full runs the GPU's full sweep in emulation).
#[test]
fn emulated_sweep() {
    let emu = Emulator::new();
    let full = std::env::var("FA_PREFILL_SWEEP").is_ok_and(|v| v == "full");
    sweep("emulated_sweep", sweep_cases(full), workers(), &|i, c| emu_case(&emu, i, c));
}

/// Every supported head dim that is not a kernel width (issue 12), on tight buffers: dense, varlen,
/// causal, GQA, variants (`testkit::cases::prefill::head_dim_sweep_cases`).
#[test]
fn emulated_head_dim_sweep() {
    let emu = Emulator::new();
    sweep("emulated_head_dim_sweep", head_dim_sweep_cases(), workers(), &|i, c| emu_case(&emu, 7000 + i, c));
}

/// Head dims 264–512 (issue 27: the decode kernel's streaming path serves them), on tight buffers: dense,
/// batched padded, varlen with empty sequences, GQA/MQA, every variant
/// (`testkit::cases::prefill::wide_head_dim_cases`).
#[test]
fn emulated_wide_head_dims() {
    let emu = Emulator::new();
    sweep("emulated_wide_head_dims", wide_head_dim_cases(), workers(), &|i, c| emu_case(&emu, 27_000 + i, c));
}

/// A V head dim different from Q·K's (issue 27: DeepSeek's 192/128 and other pairs, Dv below and above
/// Dqk), dense and varlen, causal, variants, RoPE, tight and padded NaN-poisoned buffers
/// (`testkit::cases::prefill::v_head_dim_cases`).
#[test]
fn emulated_v_head_dims() {
    let emu = Emulator::new();
    sweep("emulated_v_head_dims", v_head_dim_cases(), workers(), &|i, c| emu_case(&emu, 27_500 + i, c));
}

#[test]
fn gpu_v_head_dims() {
    let Some(s) = common::gpu_stream_or_skip("prefill::gpu_v_head_dims") else { return };
    sweep("gpu_v_head_dims", v_head_dim_cases(), workers(), &|i, c| gpu_case(&s, 27_500 + i, c));
}

#[test]
fn gpu_wide_head_dims() {
    let Some(s) = common::gpu_stream_or_skip("prefill::gpu_wide_head_dims") else { return };
    sweep("gpu_wide_head_dims", wide_head_dim_cases(), workers(), &|i, c| gpu_case(&s, 27_000 + i, c));
}

#[test]
fn gpu_head_dim_sweep() {
    let Some(s) = common::gpu_stream_or_skip("prefill::gpu_head_dim_sweep") else { return };
    sweep("gpu_head_dim_sweep", head_dim_sweep_cases(), workers(), &|i, c| gpu_case(&s, 7000 + i, c));
}

#[test]
fn gpu_sweep() {
    let Some(s) = common::gpu_stream_or_skip("prefill::gpu_sweep") else { return };
    // Launches from several threads share the one stream (each case synchronises it before reading back);
    // the threads are there for the fp64 reference, which dominates.
    sweep("gpu_sweep", sweep_cases(true), workers(), &|i, c| gpu_case(&s, i, c));
}

/// Custom scales (0.01, 1, 3) and large magnitudes (|x| up to 8 at scale 3: a softmax so sharp that the naive
/// rule allows ~0.1) on dense, varlen and strided layouts, held to the tolerance rule and the arithmetic bound.
#[test]
fn emulated_scales_and_magnitudes() {
    use fused_attn::testkit::cases::prefill::{check_inputs_emulated, PrefillInputs};
    let emu = Emulator::new();
    let base = sweep_cases(false);
    let pick = |f: &dyn Fn(&PrefillCase) -> bool| base.iter().find(|c| f(c)).cloned().unwrap();
    let mut cases = Vec::new();
    let mut inputs = Vec::new();
    let specs: [(f32, f64); 5] = [(0.01, 1.7), (1.0, 1.7), (3.0, 1.7), (3.0, 8.0), (1.0, 8.0)];
    for (n, &(scale, magnitude)) in specs.iter().enumerate() {
        let mut dense = pick(&|c| c.varlen.is_none() && c.layout == CaseLayout::Contiguous);
        (dense.dtype, dense.head_dim, dense.seqlen_q, dense.seqlen_k, dense.causal) =
            ([DType::Bf16, DType::F16][n % 2], [64, 128, 256][n % 3], 100, 129, n % 2 == 0);
        let varlen = pick(&|c| c.varlen.is_some() && c.causal);
        let strided = pick(&|c| c.layout == CaseLayout::PackedQkv);
        for c in [dense, varlen, strided] {
            cases.push(c);
            inputs.push(PrefillInputs { scale: Some(scale), magnitude });
        }
    }
    let inputs = &inputs;
    sweep("emulated_scales_and_magnitudes", cases, workers(), &|i, c| {
        let seed = case_seed(5000 + i);
        let outcome = check_inputs_emulated(&emu, c, &inputs[i], seed).map_err(|e| e.to_string())?;
        let msg = format!("{:?}: {}", inputs[i], outcome.summary());
        if outcome.passed() {
            Ok(msg)
        } else {
            Err(format!("{msg} (case seed {seed:#x})"))
        }
    });
}

/// The emulation budget case: causal bf16, B=1, H=2, T=256, D=128 must emulate in under 5 s.
#[test]
fn emulated_budget_case() {
    let emu = Emulator::new();
    let mut case = sweep_cases(false)[0].clone();
    case.dtype = DType::Bf16;
    (case.batch, case.seqlen_q, case.seqlen_k, case.heads_q, case.heads_kv, case.head_dim) = (1, 256, 256, 2, 2, 128);
    case.causal = true;
    case.varlen = None;
    case.layout = CaseLayout::Contiguous;
    case.with_lse = true;
    let f = PrefillFixture::<bf16>::new(&case, base_seed()).unwrap();
    let out = run_emulated(&emu, &f).unwrap();
    let secs = out.launch_secs;
    let outcome = f.evaluate(&out).unwrap();
    assert!(outcome.passed(), "budget case {}: {}", case.label(), outcome.summary());
    let msg = outcome.summary();
    eprintln!("budget case {}: {msg}; emulated in {secs:.2} s", case.label());
    assert!(secs <= 5.0, "budget case took {secs:.2} s emulated (limit 5 s)");
}

/// The kernel is deterministic: every scheduling seed gives bit-identical outputs.
#[test]
fn emulated_results_do_not_depend_on_scheduling() {
    let mut case = sweep_cases(false).into_iter().find(|c| c.varlen.is_some() && c.causal).unwrap();
    case.dtype = DType::F16;
    let f = PrefillFixture::<f16>::new(&case, base_seed()).unwrap();
    let r1 = run_emulated(&Emulator::with_seed(1), &f).unwrap();
    let r2 = run_emulated(&Emulator::with_seed(0xdead_beef), &f).unwrap();
    let bits = |o: &[f16]| o.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let (o1, o2, l1, l2) = (bits(&r1.o), bits(&r2.o), r1.lse, r2.lse);
    assert_eq!(o1, o2);
    assert_eq!(
        l1.unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        l2.unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
}

// ---------------------------------------------------------------------------------------------- bad input

/// Dense arguments for the invalid-input tests, all contiguous bf16 on the emulator.
struct Dense {
    q: Vec<bf16>,
    k: Vec<bf16>,
    v: Vec<bf16>,
    o: Vec<bf16>,
    lse: Vec<f32>,
    qs: [usize; 4],
    ks: [usize; 4],
}

impl Dense {
    fn new(qs: [usize; 4], ks: [usize; 4]) -> Self {
        let n = |s: [usize; 4]| 2 * s.iter().product::<usize>() + 64;
        Dense {
            q: vec![bf16::ONE; n(qs)],
            k: vec![bf16::ONE; n(ks)],
            v: vec![bf16::ONE; n(ks)],
            o: vec![bf16::ZERO; n(qs)],
            lse: vec![0.0; n(qs)],
            qs,
            ks,
        }
    }
    fn run(&mut self, os: [usize; 4], ls: Option<[usize; 3]>, opts: PrefillOptions) -> fused_attn::Result<()> {
        let emu = Emulator::new();
        let q = TensorView::host(&self.q, self.qs)?;
        let k = TensorView::host(&self.k, self.ks)?;
        let v = TensorView::host(&self.v, self.ks)?;
        let mut o = TensorViewMut::host(&mut self.o, os)?;
        let mut lse = match ls {
            Some(s) => Some(TensorViewMut::host(&mut self.lse, s)?),
            None => None,
        };
        prefill(&Stream::Emu(&emu), &q, &k, &v, &mut o, lse.as_mut(), &opts)
    }
}

fn kind(r: fused_attn::Result<()>) -> ErrorKind {
    r.expect_err("expected an error").kind().clone()
}

#[test]
fn invalid_dense_inputs_are_typed_errors() {
    let o = PrefillOptions::default();
    // Baseline works.
    Dense::new([1, 16, 4, 64], [1, 20, 2, 64]).run([1, 16, 4, 64], Some([1, 4, 16]), o).unwrap();
    // D = 100 (not a multiple of 8), 24 and 520 (outside 32..=512): unsupported.
    for d in [100, 24, 520] {
        let e = Dense::new([1, 16, 4, d], [1, 20, 2, d]).run([1, 16, 4, d], None, o);
        assert_eq!(kind(e), ErrorKind::Unsupported, "D = {d}");
    }
    // Hq % Hkv != 0.
    let e = Dense::new([1, 16, 3, 64], [1, 20, 2, 64]).run([1, 16, 3, 64], None, o).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Shape);
    assert!(e.message().starts_with("q:"), "{e}");
    // K head dim, batch, O shape, LSE shape mismatches.
    assert_eq!(kind(Dense::new([1, 16, 4, 64], [1, 20, 2, 128]).run([1, 16, 4, 64], None, o)), ErrorKind::Shape);
    assert_eq!(kind(Dense::new([2, 16, 4, 64], [1, 20, 2, 64]).run([2, 16, 4, 64], None, o)), ErrorKind::Shape);
    let e = Dense::new([1, 16, 4, 64], [1, 20, 2, 64]).run([1, 17, 4, 64], None, o).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Shape);
    assert!(e.message().starts_with("o:"), "{e}");
    let e = Dense::new([1, 16, 4, 64], [1, 20, 2, 64]).run([1, 16, 4, 64], Some([1, 16, 4]), o).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Shape);
    assert!(e.message().starts_with("lse:"), "{e}");
    // Scale must be finite and positive.
    let bad = PrefillOptions { causal: false, scale: Some(-1.0), ..Default::default() };
    assert_eq!(kind(Dense::new([1, 16, 4, 64], [1, 20, 2, 64]).run([1, 16, 4, 64], None, bad)), ErrorKind::Unsupported);
}

#[test]
fn invalid_layouts_are_typed_errors() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let opts = PrefillOptions::default();
    let data = vec![bf16::ONE; 4096 + 64];
    let mut out = vec![bf16::ZERO; 4096 + 64];
    let k = TensorView::host(&data, [1, 8, 1, 64]).unwrap();
    // Non-unit innermost stride.
    let q = TensorView::host(&data, [1, 8, 2, 64]).unwrap().with_strides([2048, 256, 128, 2]).unwrap();
    let mut o = TensorViewMut::host(&mut out, [1, 8, 2, 64]).unwrap();
    let e = prefill(&stream, &q, &k, &k, &mut o, None, &opts).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Layout);
    assert!(e.message().starts_with("q:"), "{e}");
    // Row stride not a multiple of 16 bytes.
    let q = TensorView::host(&data, [1, 8, 2, 64]).unwrap().with_strides([2048, 132, 64, 1]).unwrap();
    assert_eq!(prefill(&stream, &q, &k, &k, &mut o, None, &opts).unwrap_err().kind(), &ErrorKind::Alignment);
    // Misaligned base pointer (one element in).
    let q = TensorView::host(&data[1..], [1, 8, 2, 64]).unwrap();
    assert_eq!(prefill(&stream, &q, &k, &k, &mut o, None, &opts).unwrap_err().kind(), &ErrorKind::Alignment);
    // Overlapping output rows.
    let q = TensorView::host(&data, [1, 8, 2, 64]).unwrap();
    let mut o = TensorViewMut::host(&mut out, [1, 8, 2, 64]).unwrap().with_strides([1024, 64, 0, 1]).unwrap();
    assert_eq!(prefill(&stream, &q, &k, &k, &mut o, None, &opts).unwrap_err().kind(), &ErrorKind::Layout);
}

#[test]
fn invalid_varlen_inputs_are_typed_errors() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let opts = PrefillOptions { causal: true, scale: None, ..Default::default() };
    let q_data = vec![f16::ONE; 30 * 2 * 64];
    let k_data = vec![f16::ONE; 40 * 64];
    let mut o_data = vec![f16::ZERO; 30 * 2 * 64];
    let q = TensorView::host(&q_data, [30, 2, 64]).unwrap();
    let k = TensorView::host(&k_data, [40, 1, 64]).unwrap();
    let cu_q_ok = [0, 10, 10, 30];
    let cu_k_ok = [0, 5, 25, 40];
    let run = |cu_q: &[i32], cu_k: &[i32], max_q: usize, o: &mut Vec<f16>| {
        let cq = TensorView::host(cu_q, [cu_q.len()]).unwrap();
        let ck = TensorView::host(cu_k, [cu_k.len()]).unwrap();
        let mut ov = TensorViewMut::host(o, [30, 2, 64]).unwrap();
        prefill_varlen(&stream, &q, &k, &k, &cq, &ck, max_q, 20, &mut ov, None, &opts)
    };
    run(&cu_q_ok, &cu_k_ok, 20, &mut o_data).unwrap();
    // cu_seqlens of different lengths (B + 1 disagree).
    let e = run(&cu_q_ok, &[0, 5, 40], 20, &mut o_data).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Shape);
    assert!(e.message().starts_with("cu_seqlens_k:"), "{e}");
    // Empty cu_seqlens.
    assert_eq!(run(&[], &[], 20, &mut o_data).unwrap_err().kind(), &ErrorKind::Shape);
    // Contents: past the packed rows, decreasing, longer than max_seqlen_q.
    assert_eq!(run(&[0, 10, 10, 31], &cu_k_ok, 21, &mut o_data).unwrap_err().kind(), &ErrorKind::Shape);
    assert_eq!(run(&[0, 10, 5, 30], &cu_k_ok, 25, &mut o_data).unwrap_err().kind(), &ErrorKind::Shape);
    assert_eq!(run(&cu_q_ok, &cu_k_ok, 19, &mut o_data).unwrap_err().kind(), &ErrorKind::Shape);
    // D = 100 and Hq % Hkv.
    let q100 = TensorView::host(&q_data, [30, 1, 100]).unwrap();
    let k100 = TensorView::host(&k_data, [40, 1, 64]).unwrap().with_strides([64, 64, 1]).unwrap();
    let cq = TensorView::host(&cu_q_ok, [4]).unwrap();
    let ck = TensorView::host(&cu_k_ok, [4]).unwrap();
    let mut o100 = TensorViewMut::host(&mut o_data, [30, 1, 100]).unwrap();
    let e = prefill_varlen(&stream, &q100, &k100, &k100, &cq, &ck, 20, 20, &mut o100, None, &opts).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Unsupported);
    let k2 = TensorView::host(&k_data, [20, 2, 64]).unwrap();
    let q3 = TensorView::host(&q_data, [20, 3, 64]).unwrap();
    let mut o3 = TensorViewMut::host(&mut o_data, [20, 3, 64]).unwrap();
    let cq = TensorView::host(&[0, 20], [2]).unwrap();
    let ck = TensorView::host(&[0, 20], [2]).unwrap();
    let e = prefill_varlen(&stream, &q3, &k2, &k2, &cq, &ck, 20, 20, &mut o3, None, &opts).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Shape);
}

/// A V head dim of its own (issue 27): o must match v's head dim (Shape, naming o), v's head dim must be one
/// prefill takes (Unsupported, naming v), and the sm_90a kernel takes one head dim or the pair 192 / 128 (any
/// other pair forced: Unsupported; Auto runs the sm_80 kernel). Pairs past 256 run on the streaming path.
#[test]
fn invalid_v_head_dims_are_typed_errors() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let run = |d: usize, dv: usize, o_dv: usize, opts: &PrefillOptions| {
        let (q, k) = (vec![bf16::ONE; 16 * 2 * d], vec![bf16::ONE; 20 * d]);
        let v = vec![bf16::ONE; 20 * dv];
        let mut o = vec![bf16::ZERO; 16 * 2 * o_dv];
        let q = TensorView::host(&q, [1, 16, 2, d])?;
        let k = TensorView::host(&k, [1, 20, 1, d])?;
        let v = TensorView::host(&v, [1, 20, 1, dv])?;
        let mut o = TensorViewMut::host(&mut o, [1, 16, 2, o_dv])?;
        prefill(&stream, &q, &k, &v, &mut o, None, opts)
    };
    let opts = PrefillOptions { causal: true, ..Default::default() };
    run(192, 128, 128, &opts).unwrap();
    run(64, 128, 128, &opts).unwrap();
    let e = run(192, 128, 192, &opts).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Shape);
    assert!(e.message().starts_with("o:"), "{e}");
    run(320, 256, 256, &opts).unwrap();
    run(128, 264, 264, &opts).unwrap();
    for (d, dv) in [(192, 100), (192, 24), (512, 520)] {
        let e = run(d, dv, dv, &opts).unwrap_err();
        assert_eq!(e.kind(), &ErrorKind::Unsupported, "{d}/{dv}: {e}");
        assert!(e.message().starts_with("v:"), "{d}/{dv}: {e}");
    }
    // The sm_90a kernel has 192 / 128 (tests/it/prefill_sm90_dv.rs) and no other pair of different dims.
    let sm90 = PrefillOptions { kernel: fused_attn::prefill::PrefillKernel::Sm90, ..opts };
    run(192, 128, 128, &sm90).unwrap();
    let e = run(256, 128, 128, &sm90).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Unsupported);
    assert!(e.message().contains("V head dim"), "{e}");
    // Varlen: o's head dim is v's.
    let (q, k, v) = (vec![bf16::ONE; 10 * 2 * 192], vec![bf16::ONE; 12 * 192], vec![bf16::ONE; 12 * 128]);
    let mut o = vec![bf16::ZERO; 10 * 2 * 192];
    let (cq, ck) = ([0, 4, 10], [0, 5, 12]);
    let views = |o: &mut Vec<bf16>, o_dv: usize| {
        let q = TensorView::host(&q, [10, 2, 192]).unwrap();
        let k = TensorView::host(&k, [12, 1, 192]).unwrap();
        let v = TensorView::host(&v, [12, 1, 128]).unwrap();
        let (cq, ck) = (TensorView::host(&cq, [3]).unwrap(), TensorView::host(&ck, [3]).unwrap());
        let mut o = TensorViewMut::host(o, [10, 2, o_dv]).unwrap();
        prefill_varlen(&stream, &q, &k, &v, &cq, &ck, 6, 7, &mut o, None, &opts)
    };
    views(&mut o, 128).unwrap();
    assert_eq!(views(&mut o, 192).unwrap_err().kind(), &ErrorKind::Shape);
}
