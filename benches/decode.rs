//! Paged decode bandwidth: bf16, D = 128, Hq = 32 with Hkv = 8 and 4 (GQA 4 and 8), batch {1, 8, 64} x
//! context {1k, 4k, 32k} tokens x page size {16, 64}; the planner chooses the split.
//!
//! Throughput is `Throughput::Bytes(bytes)` with the bytes a decode actually moves
//! (`fused_attn::decode::cases::decode_bytes`: K and V read once per KV head, Q, O, LSE, and the split
//! workspace written and read back by the merge), and each row is quoted against the device-to-device copy
//! bandwidth measured at the start of the same run. Each sample is a CUDA-event pair around back-to-back
//! launches (decode + merge when split); criterion's warm-up is excluded. Small caches would sit in L2, so
//! the cache pool holds several sets of pages and consecutive launches use different block tables into
//! disjoint pages (enough sets that ~3x L2 lies between two uses of the same pages). Pages are handed out
//! in shuffled order, as a real allocator would after some churn.
//!
//! The smallest shapes (B = 1, 1k tokens) take a few microseconds, near the launch rate: their numbers are
//! what an engine sees without CUDA graphs, not the kernel's bandwidth.
//! Without a GPU: prints "no GPU: <reason>; skipping" and exits 0. Without `--bench` (criterion's test
//! mode) only the smallest shape runs once.

mod support;

use std::cell::RefCell;
use std::rc::Rc;

use criterion::{BenchmarkId, Throughput};
use fused_attn::decode::cases::{decode_bytes, DecodeCase};
use fused_attn::{decode, DType, DecodeOptions, DecodeWorkspace, PagedKvCache, Stream, TensorView, TensorViewMut};
use half::bf16;
use rand::seq::SliceRandom;
use rand::Rng;

const BATCHES: [usize; 3] = [1, 8, 64];
const CONTEXTS: [usize; 3] = [1024, 4096, 32768];
const PAGE_SIZES: [usize; 2] = [16, 64];
const HEADS: [(usize, usize); 2] = [(32, 8), (32, 4)];
const HEAD_DIM: usize = 128;
/// Most block-table sets a case rotates through (the smallest cache is 2 MiB).
const MAX_SETS: usize = 64;

struct Row {
    name: String,
    bytes: usize,
    splits: usize,
    ms: Option<f64>,
}

fn bench_case(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    gpu: &support::Gpu,
    case: &DecodeCase,
    seed: u64,
) -> Row {
    let s = &gpu.stream;
    let stream = Stream::Gpu(s);
    let (b, hq, hkv, d, ps) = (case.batch(), case.heads_q, case.heads_kv, case.head_dim, case.page_size);
    let ctx_len = case.max_seq_len();
    let pages_per_seq = ctx_len.div_ceil(ps);
    let pages_per_set = b * pages_per_seq;
    let sets = support::rotation_sets(case.kv_bytes(), gpu.l2_bytes, MAX_SETS);
    let num_pages = sets * pages_per_set;
    let cache_len = num_pages * ps * hkv * d;

    // SAFETY (both): every element is written by fill_random before any launch reads it.
    let mut k = unsafe { s.alloc::<bf16>(cache_len) }.expect("alloc k cache");
    let mut v = unsafe { s.alloc::<bf16>(cache_len) }.expect("alloc v cache");
    support::fill_random(s, &mut k, seed, -2.0, 2.0);
    support::fill_random(s, &mut v, seed + 1, -0.5, 1.5);
    // One block table per set, each a shuffled permutation of that set's pages.
    let mut rng = fused_attn::seed::rng(seed + 2);
    let mut tables = Vec::with_capacity(sets);
    for set in 0..sets {
        let mut ids: Vec<i32> = (0..pages_per_set).map(|p| (set * pages_per_set + p) as i32).collect();
        ids.shuffle(&mut rng);
        tables.push(s.clone_htod(&ids).expect("upload block table"));
    }
    let lens = s.clone_htod(&vec![ctx_len as i32; b]).expect("upload seq_lens");
    let q_host: Vec<bf16> = (0..b * hq * d).map(|_| bf16::from_f64(rng.random_range(-2.0..2.0))).collect();
    let q = s.clone_htod(&q_host).expect("upload q");
    let mut o = s.alloc_zeros::<bf16>(b * hq * d).expect("alloc o");
    let mut lse = s.alloc_zeros::<f32>(b * hq).expect("alloc lse");
    let opts = DecodeOptions { scale: None, num_splits: case.num_splits, ..Default::default() };
    let plan = DecodeWorkspace::new(&stream, 0, 0).and_then(|w| w.plan(&case.problem(), &opts)).expect("plan");
    let mut ws = DecodeWorkspace::for_plan(&stream, &plan).expect("workspace");
    let bytes = decode_bytes(case, &plan);
    s.synchronize().expect("synchronize");

    let id = format!("Hq{hq}_Hkv{hkv}_page{ps}");
    let name = format!("B{b} ctx{ctx_len} {id}");
    let log = Rc::new(RefCell::new(Vec::new()));
    let mut counter = 0usize;
    group.throughput(Throughput::Bytes(bytes as u64));
    group.bench_function(BenchmarkId::new(id, format!("B{b}_ctx{ctx_len}")), |bencher| {
        bencher.iter_custom(|iters| {
            support::time_iters(s, iters, &mut counter, &log, |i| {
                let shape = [num_pages, ps, hkv, d];
                let cache = PagedKvCache::new(
                    TensorView::gpu(k.as_view(), shape).expect("k view"),
                    TensorView::gpu(v.as_view(), shape).expect("v view"),
                    TensorView::gpu(tables[i % sets].as_view(), [b, pages_per_seq]).expect("table view"),
                    TensorView::gpu(lens.as_view(), [b]).expect("lens view"),
                    ctx_len,
                )
                .expect("paged cache");
                decode(
                    &stream,
                    &TensorView::gpu(q.as_view(), [b, hq, d]).expect("q view"),
                    &cache,
                    &mut TensorViewMut::gpu(o.as_view_mut(), [b, hq, d]).expect("o view"),
                    Some(&mut TensorViewMut::gpu(lse.as_view_mut(), [b, hq]).expect("lse view")),
                    &mut ws,
                    &opts,
                )
                .expect("decode launch");
            })
        })
    });
    s.synchronize().expect("synchronize");
    let ms = support::ms_per_launch(&log.borrow());
    Row { name, bytes, splits: plan.num_splits, ms }
}

fn main() {
    let Some(gpu) = support::gpu_or_skip("benches/decode") else { return };
    let smoke = support::test_mode();
    // The memory ceiling, measured first in the same process: a 1 GiB device-to-device copy (bytes read +
    // written).
    let copy_gbps = fused_attn::timing::copy_bandwidth_gbps(&gpu.stream, 1 << 30).expect("copy bandwidth");
    println!("device-to-device copy bandwidth (read + write, same run): {copy_gbps:.0} GB/s");

    let mut c = support::criterion();
    let mut group = c.benchmark_group("decode_bf16_bytes");
    let mut rows = Vec::new();
    let mut seed = 0x5eed_dec0u64;
    for &(hq, hkv) in &HEADS {
        for &ps in &PAGE_SIZES {
            for &b in &BATCHES {
                for &ctx_len in &CONTEXTS {
                    if smoke && (b, ctx_len, ps, hkv) != (1, 1024, 16, 8) {
                        continue;
                    }
                    let case = DecodeCase {
                        dtype: DType::Bf16,
                        head_dim: HEAD_DIM,
                        heads_q: hq,
                        heads_kv: hkv,
                        page_size: ps,
                        seq_lens: vec![ctx_len; b],
                        num_splits: None,
                        variants: Default::default(),
                    };
                    seed += 3;
                    rows.push(bench_case(&mut group, &gpu, &case, seed));
                }
            }
        }
    }
    group.finish();
    c.final_summary();

    println!("\ndecode summary on {} (us per launch over the measurement samples)", gpu.name);
    println!("copy bandwidth ceiling (same run): {copy_gbps:.0} GB/s");
    println!("{:<32} {:>7} {:>10} {:>9} {:>8} {:>7}", "shape", "splits", "MB moved", "us", "GB/s", "% copy");
    for r in rows {
        let Some(ms) = r.ms else { continue };
        let gbps = r.bytes as f64 / (ms * 1e-3) / 1e9;
        println!(
            "{:<32} {:>7} {:>10.1} {:>9.2} {:>8.0} {:>6.0}%",
            r.name,
            r.splits,
            r.bytes as f64 / 1e6,
            ms * 1e3,
            gbps,
            100.0 * gbps / copy_gbps
        );
    }
}
