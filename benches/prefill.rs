//! Prefill throughput on the standard FlashAttention shape family, as `fused_attn::testkit::cases::prefill::perf_cases`
//! defines it for the runner's report (one source of truth for the shapes): B·T = 16k tokens, Hq·D = 2048
//! (every shape moves the same bytes), T in 512..16k, D in {64, 128, 256}, causal and not, MHA (Hkv = Hq,
//! as in the FA2/FA3 papers' forward benchmarks), plus the GQA shape (Hq 32, Hkv 8). Here: every bf16 shape,
//! the fp16 subset at D = 128 (fp16 and bf16 run the same instructions), and the GQA shapes — 50 benches,
//! about 80 s of GPU time.
//!
//! Throughput is `Throughput::Elements(FLOPs)` — criterion prints it as "elem/s", which here means FLOP/s
//! (the group names say so) — with FLOPs = 4·B·Hq·Tq·Tk·D, halved for causal (docs/semantics.md). Each sample
//! is one CUDA-event pair around back-to-back launches; criterion's warm-up is excluded; two input sets
//! (each 4 x 64 MiB, far past L2) alternate so a launch never finds its inputs cached by the previous one.
//! Launches write the LSE as the report's timed cases do. Without a GPU: prints "no GPU: <reason>;
//! skipping" and exits 0.
//!
//! Inputs are filled on the device (`support::fill_random`) rather than through the report's host fixture:
//! building 200 MB of host data per shape would cost more GPU-machine time than the measurements.
//!
//! The matmul ceiling: the crate does not link cuBLAS (and cudarc's dynamically loaded cuBLAS would need
//! the right libcublas on the library path of the GPU machine, which only PyTorch's wheels provide there),
//! so the bf16 matmul rate is measured by tools/torch_compare.py in the same bundle run and passed in as
//! FA_MATMUL_TFLOPS; the summary table then prints each row's fraction of it.
//!
//! Run: `cargo bench --bench prefill [-- FILTER]`, or `benches/prefill --bench [FILTER]` from the bundle.
//! Without `--bench` (criterion's test mode) only the smallest bf16 shape runs, once.

mod support;

use std::cell::RefCell;
use std::rc::Rc;

use criterion::{BenchmarkId, Throughput};
use cudarc::driver::CudaSlice;
use fused_attn::prefill::{prefill, PrefillOptions};
use fused_attn::testkit::cases::prefill::{perf_cases, PrefillCase};
use fused_attn::testkit::timing::prefill_flops;
use fused_attn::{DType, Element, Stream, TensorView, TensorViewMut};
use half::{bf16, f16};

/// Input sets rotated through: each set is 4 x 64 MiB, so two already keep the previous launch's data out
/// of any current L2 (50-60 MiB on H100/H200).
const SETS: usize = 2;

/// One set of device tensors, sized for the largest case.
struct Set<T> {
    q: CudaSlice<T>,
    k: CudaSlice<T>,
    v: CudaSlice<T>,
    o: CudaSlice<T>,
    lse: CudaSlice<f32>,
}

struct Row {
    name: String,
    flops: f64,
    ms: Option<f64>,
}

/// The shapes benched for `dtype`: bf16 all of them, fp16 the D = 128 ones; test mode only the first.
fn cases(dtype: DType, smoke: bool) -> Vec<PrefillCase> {
    let all: Vec<PrefillCase> = perf_cases().into_iter().filter(|c| c.dtype == dtype).collect();
    if smoke {
        return all.into_iter().take(usize::from(dtype == DType::Bf16)).collect();
    }
    all.into_iter().filter(|c| dtype == DType::Bf16 || c.head_dim == 128).collect()
}

fn bench_dtype<T: Element>(c: &mut criterion::Criterion, gpu: &support::Gpu, rows: &mut Vec<Row>, smoke: bool) {
    let cases = cases(T::DTYPE, smoke);
    if cases.is_empty() {
        return;
    }
    let s = &gpu.stream;
    let q_len = cases.iter().map(|c| c.batch * c.seqlen_q * c.heads_q * c.head_dim).max().unwrap_or(0);
    let kv_len = cases.iter().map(|c| c.batch * c.seqlen_k * c.heads_kv * c.head_dim).max().unwrap_or(0);
    let lse_len = cases.iter().map(|c| c.batch * c.heads_q * c.seqlen_q).max().unwrap_or(0);
    let mut sets: Vec<Set<T>> = (0..SETS)
        .map(|i| {
            let alloc = |n: usize, seed: u64, lo: f64, hi: f64| {
                // SAFETY: every element is written by fill_random before any launch reads it.
                let mut b = unsafe { s.alloc::<T>(n) }.expect("alloc");
                support::fill_random(s, &mut b, seed, lo, hi);
                b
            };
            // q, k in [-2, 2) (softmax far from uniform at 1/sqrt(D)), v offset so O is not ~ 0.
            Set {
                q: alloc(q_len, 10 * i as u64 + 1, -2.0, 2.0),
                k: alloc(kv_len, 10 * i as u64 + 2, -2.0, 2.0),
                v: alloc(kv_len, 10 * i as u64 + 3, -0.5, 1.5),
                o: s.alloc_zeros::<T>(q_len).expect("alloc"),
                lse: s.alloc_zeros::<f32>(lse_len).expect("alloc"),
            }
        })
        .collect();
    let dtype = T::DTYPE.name();
    let mut group = c.benchmark_group(format!("prefill_{dtype}_FLOP"));
    for case in &cases {
        let (b, tq, tk, hq, hkv, d) =
            (case.batch, case.seqlen_q, case.seqlen_k, case.heads_q, case.heads_kv, case.head_dim);
        let flops = prefill_flops(b, hq, tq, tk, d, case.causal);
        let id = format!("D{d}_Hq{hq}_Hkv{hkv}{}", if case.causal { "_causal" } else { "" });
        let opts = PrefillOptions { causal: case.causal, scale: None, ..Default::default() };
        let (qs, ks) = ([b, tq, hq, d], [b, tk, hkv, d]);
        let (nq, nk, nl) = (b * tq * hq * d, b * tk * hkv * d, b * hq * tq);
        let log = Rc::new(RefCell::new(Vec::new()));
        let mut counter = 0usize;
        group.throughput(Throughput::Elements(flops as u64));
        group.bench_function(BenchmarkId::new(id.clone(), format!("B{b}_T{tq}")), |bencher| {
            bencher.iter_custom(|iters| {
                support::time_iters(s, iters, &mut counter, &log, |i| {
                    let set = &mut sets[i % SETS];
                    let q = TensorView::gpu(set.q.slice(0..nq), qs).expect("q view");
                    let k = TensorView::gpu(set.k.slice(0..nk), ks).expect("k view");
                    let v = TensorView::gpu(set.v.slice(0..nk), ks).expect("v view");
                    let mut o = TensorViewMut::gpu(set.o.slice_mut(0..nq), qs).expect("o view");
                    let mut lse = TensorViewMut::gpu(set.lse.slice_mut(0..nl), [b, hq, tq]).expect("lse view");
                    let lse = if case.with_lse { Some(&mut lse) } else { None };
                    prefill(&Stream::Gpu(s), &q, &k, &v, &mut o, lse, &opts).expect("prefill launch");
                })
            })
        });
        let ms = support::ms_per_launch(&log.borrow());
        rows.push(Row { name: format!("{dtype} {id} B{b} T{tq}"), flops, ms });
    }
    group.finish();
    s.synchronize().expect("synchronize");
}

fn main() {
    let Some(gpu) = support::gpu_or_skip("benches/prefill") else { return };
    let smoke = support::test_mode();
    let mut c = support::criterion();
    let mut rows = Vec::new();
    bench_dtype::<bf16>(&mut c, &gpu, &mut rows, smoke);
    bench_dtype::<f16>(&mut c, &gpu, &mut rows, smoke);
    c.final_summary();

    // criterion's own estimates are in target/criterion (or $CRITERION_HOME); this table puts each row next
    // to the matmul ceiling of the same run.
    let ceiling = support::matmul_tflops();
    println!("\nprefill summary on {} (ms per launch over the measurement samples)", gpu.name);
    match ceiling {
        Some(x) => println!("bf16 matmul ceiling (FA_MATMUL_TFLOPS, same run): {x:.1} TFLOPS"),
        None => println!("bf16 matmul ceiling: not given (FA_MATMUL_TFLOPS unset; tools/torch_compare.py measures it)"),
    }
    println!("{:<40} {:>10} {:>9} {:>10}", "shape", "ms", "TFLOPS", "% matmul");
    for r in rows {
        let Some(ms) = r.ms else { continue };
        let tflops = r.flops / (ms * 1e-3) / 1e12;
        let pct = ceiling.map_or("-".to_string(), |x| format!("{:.0}%", 100.0 * tflops / x));
        println!("{:<40} {:>10.4} {:>9.1} {:>10}", r.name, ms, tflops, pct);
    }
}
