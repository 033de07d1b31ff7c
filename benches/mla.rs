//! MLA decode (issue 29, docs/mla.md): DeepSeek-V3's shape (512 + 64 latent cache, one latent head, bf16
//! q/o, softmax scale 1/sqrt(192)), Hq {16, 128} x batch {1, 64} x context {4k, 32k} at page 64 (FlashMLA's),
//! q_len 1, over a bf16 latent cache and an FP8 (E4M3, one scale) one of the same tokens; the planner
//! chooses the split.
//!
//! Throughput is `Throughput::Bytes(bytes)` with the bytes a launch must move from HBM
//! ([`MlaCase::bytes`]: each sequence's cache rows once — the row blocks of a sequence share them through
//! L2 —, q, o, LSE and the split workspace), quoted against the device-to-device copy bandwidth measured at
//! the start of the same run; the summary also prints the tensor TFLOPS of the visible (row, key) pairs
//! ([`MlaCase::flops`], 2 · (576 + 512) per pair and head) and the FP8 row's time against the bf16 row's.
//! The roofline (docs/mla.md) predicts Hq 16 memory-bound (bandwidth is the number) and Hq 128 tensor-bound
//! (TFLOPS is). Each sample is a CUDA-event pair around back-to-back launches; consecutive launches use
//! different block tables into disjoint page sets (~3x L2 between two uses of the same pages), pages
//! shuffled. Without a GPU: prints "no GPU: <reason>; skipping" and exits 0. Without `--bench` (criterion's
//! test mode) only the smallest shape runs once.

mod support;

use std::cell::RefCell;
use std::rc::Rc;

use criterion::{BenchmarkId, Throughput};
use fused_attn::fp8::{Fp8Element, KvCacheOf};
use fused_attn::mla::{latent_cache, latent_cache_fp8, mla_decode, MlaDecodeOptions, MlaPlan};
use fused_attn::testkit::cases::mla::{MlaCase, DEEPSEEK_SCALE};
use fused_attn::{DType, DecodeWorkspace, Fp8E4m3, Fp8Format, Stream, TensorView, TensorViewMut};
use half::bf16;
use rand::seq::SliceRandom;
use rand::Rng;

const BATCHES: [usize; 2] = [1, 64];
const CONTEXTS: [usize; 2] = [4096, 32768];
const HEADS: [usize; 2] = [16, 128];
const PAGE: usize = 64;
/// Most block-table sets a case rotates through.
const MAX_SETS: usize = 64;
/// The FP8 cache's scale: the bench's values (|x| <= 1) over E4M3's range.
const FP8_SCALE: f32 = 1.0 / 448.0;

struct Row {
    name: String,
    kv: &'static str,
    bytes: usize,
    flops: f64,
    splits: usize,
    ms: Option<f64>,
}

/// A latent cache element the bench fills: bf16 values, or the E4M3 codes of the same distribution.
trait BenchKv: KvCacheOf<bf16> + cudarc::driver::DeviceRepr {
    const NAME: &'static str;
    const FP8: Option<Fp8Format>;
    fn of(x: f64) -> Self;
}
impl BenchKv for bf16 {
    const NAME: &'static str = "bf16";
    const FP8: Option<Fp8Format> = None;
    fn of(x: f64) -> Self {
        <bf16 as fused_attn::Element>::from_f64(x)
    }
}
impl BenchKv for Fp8E4m3 {
    const NAME: &'static str = "fp8_e4m3";
    const FP8: Option<Fp8Format> = Some(Fp8Format::E4m3);
    fn of(x: f64) -> Self {
        Fp8E4m3::from_code(Fp8Format::E4m3.encode(x as f32 / FP8_SCALE))
    }
}

fn bench_case<C: BenchKv>(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    gpu: &support::Gpu,
    case: &MlaCase,
    seed: u64,
) -> Row {
    let s = &gpu.stream;
    let stream = Stream::Gpu(s);
    let (b, hq, row, rank) = (case.batch(), case.heads_q, case.dims.row_dim(), case.dims.kv_lora_rank);
    let ctx_len = case.max_seq_len();
    let pages_per_seq = ctx_len.div_ceil(PAGE);
    let pages_per_set = b * pages_per_seq;
    let set_bytes = pages_per_set * PAGE * case.row_bytes();
    let sets = support::rotation_sets(set_bytes, gpu.l2_bytes, MAX_SETS);
    let num_pages = sets * pages_per_set;

    // SAFETY: every element is written by fill_with before any launch reads it.
    let mut cache = unsafe { s.alloc::<C>(num_pages * PAGE * row) }.expect("alloc latent cache");
    support::fill_with(s, &mut cache, seed, |rng| C::of(rng.random_range(-1.0..1.0)));
    let scale = s.clone_htod(&[FP8_SCALE]).expect("upload scale");
    let mut rng = fused_attn::testkit::seed::rng(seed + 2);
    let mut tables = Vec::with_capacity(sets);
    for set in 0..sets {
        let mut ids: Vec<i32> = (0..pages_per_set).map(|p| (set * pages_per_set + p) as i32).collect();
        ids.shuffle(&mut rng);
        tables.push(s.clone_htod(&ids).expect("upload block table"));
    }
    let lens = s.clone_htod(&vec![ctx_len as i32; b]).expect("upload seq_lens");
    let q_host: Vec<bf16> = (0..b * hq * row).map(|_| bf16::from_f64(rng.random_range(-1.0..1.0))).collect();
    let q = s.clone_htod(&q_host).expect("upload q");
    let mut o = s.alloc_zeros::<bf16>(b * hq * rank).expect("alloc o");
    let mut lse = s.alloc_zeros::<f32>(b * hq).expect("alloc lse");
    let mut ws = DecodeWorkspace::with_capacity(&stream, b, hq, rank, 64).expect("workspace");
    let opts = MlaDecodeOptions::new(DEEPSEEK_SCALE);
    let plan: MlaPlan = MlaPlan::new(b, hq, 1, b, ctx_len, rank, ws.sm_count(), None).expect("plan");
    let case = MlaCase { fp8: C::FP8, ..case.clone() };
    let bytes = case.bytes(&plan);
    s.synchronize().expect("synchronize");

    let id = format!("Hq{hq}_page{PAGE}_{}", C::NAME);
    let name = format!("B{b} ctx{ctx_len} Hq{hq}");
    let log = Rc::new(RefCell::new(Vec::new()));
    let mut counter = 0usize;
    group.throughput(Throughput::Bytes(bytes as u64));
    group.bench_function(BenchmarkId::new(id, format!("B{b}_ctx{ctx_len}")), |bencher| {
        bencher.iter_custom(|iters| {
            support::time_iters(s, iters, &mut counter, &log, |i| {
                let pages = TensorView::gpu(cache.as_view(), [num_pages, PAGE, 1, row]).expect("cache view");
                let table = TensorView::gpu(tables[i % sets].as_view(), [b, pages_per_seq]).expect("table view");
                let lens = TensorView::gpu(lens.as_view(), [b]).expect("lens view");
                let lc = match C::FP8 {
                    Some(_) => latent_cache_fp8(
                        pages,
                        table,
                        lens,
                        ctx_len,
                        TensorView::gpu(scale.as_view(), [1]).expect("scale"),
                    ),
                    None => latent_cache(pages, table, lens, ctx_len),
                }
                .expect("latent cache");
                mla_decode(
                    &stream,
                    &TensorView::gpu(q.as_view(), [b, hq, row]).expect("q view"),
                    &lc,
                    &mut TensorViewMut::gpu(o.as_view_mut(), [b, hq, rank]).expect("o view"),
                    Some(&mut TensorViewMut::gpu(lse.as_view_mut(), [b, hq]).expect("lse view")),
                    &mut ws,
                    &opts,
                )
                .expect("mla_decode launch");
            })
        })
    });
    s.synchronize().expect("synchronize");
    let ms = support::ms_per_launch(&log.borrow());
    Row { name, kv: C::NAME, bytes, flops: case.flops(), splits: plan.num_splits(), ms }
}

fn main() {
    let Some(gpu) = support::gpu_or_skip("benches/mla") else { return };
    let smoke = support::test_mode();
    let copy_gbps = fused_attn::testkit::timing::copy_bandwidth_gbps(&gpu.stream, 1 << 30).expect("copy bandwidth");
    println!("device-to-device copy bandwidth (read + write, same run): {copy_gbps:.0} GB/s");

    let mut c = support::criterion();
    let mut group = c.benchmark_group("mla_decode_bytes");
    let mut rows = Vec::new();
    let mut seed = 0x5eed_0a1au64;
    for &hq in &HEADS {
        for &b in &BATCHES {
            for &ctx_len in &CONTEXTS {
                if smoke && (hq, b, ctx_len) != (16, 1, 4096) {
                    continue;
                }
                let case = MlaCase { page_size: PAGE, ..MlaCase::new(DType::Bf16, hq, &vec![ctx_len; b], None) };
                seed += 3;
                rows.push(bench_case::<bf16>(&mut group, &gpu, &case, seed));
                rows.push(bench_case::<Fp8E4m3>(&mut group, &gpu, &case, seed));
            }
        }
    }
    group.finish();
    c.final_summary();

    println!("\nMLA decode summary on {} (us per launch over the measurement samples)", gpu.name);
    println!("copy bandwidth ceiling (same run): {copy_gbps:.0} GB/s");
    println!(
        "{:<24} {:>9} {:>7} {:>10} {:>9} {:>8} {:>7} {:>8} {:>9}",
        "shape", "cache", "splits", "MB moved", "us", "GB/s", "% copy", "TFLOPS", "vs bf16"
    );
    for (i, r) in rows.iter().enumerate() {
        let Some(ms) = r.ms else { continue };
        let gbps = r.bytes as f64 / (ms * 1e-3) / 1e9;
        let speedup = match (r.kv, i.checked_sub(1).map(|j| &rows[j])) {
            ("fp8_e4m3", Some(prev)) if prev.name == r.name => prev.ms.map(|b| format!("{:.2}x", b / ms)),
            _ => None,
        };
        println!(
            "{:<24} {:>9} {:>7} {:>10.1} {:>9.2} {:>8.0} {:>6.0}% {:>8.0} {:>9}",
            r.name,
            r.kv,
            r.splits,
            r.bytes as f64 / 1e6,
            ms * 1e3,
            gbps,
            100.0 * gbps / copy_gbps,
            r.flops / (ms * 1e-3) / 1e12,
            speedup.unwrap_or_default()
        );
    }
}
