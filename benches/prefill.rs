//! Prefill throughput on the standard FlashAttention shape family: B·T = 16k tokens, Hq·D = 2048 (so every
//! shape moves the same bytes), T in 512..16k, D in {64, 128, 256}, causal and not, MHA (Hkv = Hq, as the
//! FA2/FA3 papers' forward benchmarks), bf16 everywhere plus an fp16 subset (D = 128).
//!
//! Throughput is `Throughput::Elements(FLOPs)` — criterion prints it as "elem/s", which here means FLOP/s
//! (the group names say so) — with FLOPs = 4·B·Hq·Tq·Tk·D, halved for causal (CONVENTIONS.md). Each sample
//! is a CUDA-event pair around back-to-back launches; criterion's warm-up is excluded; two input sets (each
//! 4 x 64 MiB, far past L2) alternate so a launch never finds its inputs cached by the previous one.
//! Without a GPU: prints "no GPU: <reason>; skipping" and exits 0.
//!
//! The matmul ceiling: the crate does not link cuBLAS (and cudarc's dynamically loaded cuBLAS would need
//! the right libcublas on the library path of the GPU machine, which only PyTorch's wheels provide there),
//! so the bf16 matmul rate is measured by tools/torch_compare.py in the same bundle run and passed in as
//! FA_MATMUL_TFLOPS; the summary table then prints each row's fraction of it.
//!
//! Runner: `cargo bench --bench prefill [-- FILTER]`, or `benches/prefill --bench [FILTER]` from the bundle.
//! Without `--bench` (criterion's test mode) only a smoke subset runs once.

mod support;

use std::cell::RefCell;
use std::rc::Rc;

use criterion::{BenchmarkId, Throughput};
use cudarc::driver::CudaSlice;
use fused_attn::prefill::{prefill, PrefillOptions};
use fused_attn::timing::prefill_flops;
use fused_attn::{DType, Element, Stream, TensorView, TensorViewMut};
use half::{bf16, f16};

/// Tokens per batch (B·T) and Hq·D of the shape family.
const TOKENS: usize = 16 * 1024;
const HIDDEN: usize = 2048;
const SEQLENS: [usize; 6] = [512, 1024, 2048, 4096, 8192, 16384];
const HEAD_DIMS: [usize; 3] = [64, 128, 256];
/// Input sets rotated through: each set is 4 x 64 MiB, so two already keep the previous launch's data out
/// of any current L2 (50-60 MiB on H100/H200).
const SETS: usize = 2;

/// One set of device tensors, each TOKENS x HIDDEN elements (every shape of the family fits exactly).
struct Set<T> {
    q: CudaSlice<T>,
    k: CudaSlice<T>,
    v: CudaSlice<T>,
    o: CudaSlice<T>,
}

struct Row {
    name: String,
    flops: f64,
    ms: Option<f64>,
}

fn bench_dtype<T: Element>(c: &mut criterion::Criterion, gpu: &support::Gpu, rows: &mut Vec<Row>, smoke: bool) {
    let s = &gpu.stream;
    let n = TOKENS * HIDDEN;
    let mut sets: Vec<Set<T>> = (0..SETS)
        .map(|i| {
            let alloc = |seed: u64, lo: f64, hi: f64| {
                // SAFETY: every element is written by fill_random before any launch reads it.
                let mut b = unsafe { s.alloc::<T>(n) }.expect("alloc");
                support::fill_random(s, &mut b, seed, lo, hi);
                b
            };
            // q, k in [-2, 2) (softmax far from uniform at 1/sqrt(D)), v offset so O is not ~ 0.
            Set {
                q: alloc(10 * i as u64 + 1, -2.0, 2.0),
                k: alloc(10 * i as u64 + 2, -2.0, 2.0),
                v: alloc(10 * i as u64 + 3, -0.5, 1.5),
                o: s.alloc_zeros::<T>(n).expect("alloc"),
            }
        })
        .collect();
    let dtype = T::DTYPE.name();
    let mut group = c.benchmark_group(format!("prefill_{dtype}_FLOP"));
    let head_dims: &[usize] = match (T::DTYPE, smoke) {
        (_, true) => &[128],
        (DType::Bf16, false) => &HEAD_DIMS,
        (DType::F16, false) => &[128],
    };
    let seqlens: &[usize] = if smoke { &[512] } else { &SEQLENS };
    for &d in head_dims {
        for causal in [false, true] {
            for &t in seqlens {
                let (b, h) = (TOKENS / t, HIDDEN / d);
                let flops = prefill_flops(b, h, t, t, d, causal);
                let id = format!("D{d}{}", if causal { "_causal" } else { "" });
                let opts = PrefillOptions { causal, scale: None };
                let log = Rc::new(RefCell::new(Vec::new()));
                let mut counter = 0usize;
                group.throughput(Throughput::Elements(flops as u64));
                group.bench_function(BenchmarkId::new(id.clone(), format!("T{t}")), |bencher| {
                    bencher.iter_custom(|iters| {
                        support::time_iters(s, iters, &mut counter, &log, |i| {
                            let set = &mut sets[i % SETS];
                            let shape_q = [b, t, h, d];
                            let q = TensorView::gpu(set.q.slice(0..n), shape_q).expect("q view");
                            let k = TensorView::gpu(set.k.slice(0..n), shape_q).expect("k view");
                            let v = TensorView::gpu(set.v.slice(0..n), shape_q).expect("v view");
                            let mut o = TensorViewMut::gpu(set.o.slice_mut(0..n), shape_q).expect("o view");
                            prefill(&Stream::Gpu(s), &q, &k, &v, &mut o, None, &opts).expect("prefill launch");
                        })
                    })
                });
                let ms = support::ms_per_launch(&log.borrow());
                rows.push(Row { name: format!("{dtype} {id} B{b} H{h} T{t}"), flops, ms });
            }
        }
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

    // The summary: criterion's estimates are in target/criterion (or $CRITERION_HOME); this table puts each
    // row next to the matmul ceiling of the same run.
    let ceiling = support::matmul_tflops();
    println!("\nprefill summary on {} (ms per launch over the measurement samples)", gpu.name);
    match ceiling {
        Some(x) => println!("bf16 matmul ceiling (FA_MATMUL_TFLOPS, same run): {x:.1} TFLOPS"),
        None => println!("bf16 matmul ceiling: not given (FA_MATMUL_TFLOPS unset; tools/torch_compare.py measures it)"),
    }
    println!("{:<34} {:>10} {:>9} {:>10}", "shape", "ms", "TFLOPS", "% matmul");
    for r in rows {
        let Some(ms) = r.ms else { continue };
        let tflops = r.flops / (ms * 1e-3) / 1e12;
        let pct = ceiling.map_or("-".to_string(), |x| format!("{:.0}%", 100.0 * tflops / x));
        println!("{:<34} {:>10.4} {:>9.1} {:>10}", r.name, ms, tflops, pct);
    }
}
