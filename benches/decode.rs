//! Paged decode bandwidth: bf16, D = 128, Hq = 32 with Hkv = 8 and 4 (GQA 4 and 8), batch {1, 8, 64} x
//! context {1k, 4k, 32k} tokens x page size {16, 64}; the planner chooses the split. At page size 16 each
//! shape also runs over an FP8 (E4M3, per-head scales) cache of the same tokens: half the K/V bytes, and the
//! summary prints its time against the bf16 cache's (the prediction: ~1.9x faster where K/V dominate the
//! bytes, i.e. everywhere but the smallest, launch-bound shapes).
//!
//! Throughput is `Throughput::Bytes(bytes)` with the bytes a decode actually moves
//! (`fused_attn::testkit::cases::decode::decode_bytes`: K and V read once per KV head, Q, O, LSE, and the split
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
use cudarc::driver::CudaSlice;
use fused_attn::fp8::{Fp8Element, KvCacheOf};
use fused_attn::testkit::cases::decode::{decode_bytes, DecodeCase};
use fused_attn::{
    decode, DType, DecodeOptions, DecodeWorkspace, Fp8E4m3, Fp8Format, KvScales, PagedKvCache, Stream, TensorView,
    TensorViewMut,
};
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
    /// "bf16" or "fp8_e4m3": the cache's element type.
    kv: &'static str,
    bytes: usize,
    splits: usize,
    ms: Option<f64>,
}

/// A cache element the bench fills: bf16 values as the 16-bit cache, or the FP8 codes of the same
/// distributions (quantised with per-head scales amax / 448).
trait BenchKv: KvCacheOf<bf16> + cudarc::driver::DeviceRepr {
    const NAME: &'static str;
    /// The element holding `x`, for values of magnitude at most `amax`.
    fn of(x: f64, amax: f64) -> Self;
    fn scales(stream: &Stream<'_>, hkv: usize) -> Option<KvScales>;
}
impl BenchKv for bf16 {
    const NAME: &'static str = "bf16";
    fn of(x: f64, _: f64) -> Self {
        <bf16 as fused_attn::Element>::from_f64(x)
    }
    fn scales(_: &Stream<'_>, _: usize) -> Option<KvScales> {
        None
    }
}
impl BenchKv for Fp8E4m3 {
    const NAME: &'static str = "fp8_e4m3";
    fn of(x: f64, amax: f64) -> Self {
        let scale = amax / Fp8Format::E4m3.max();
        Fp8E4m3::from_code(Fp8Format::E4m3.encode((x / scale) as f32))
    }
    fn scales(stream: &Stream<'_>, hkv: usize) -> Option<KvScales> {
        Some(KvScales::per_head(stream, &vec![2.0 / 448.0; hkv], &vec![1.5 / 448.0; hkv]).expect("scales"))
    }
}

/// Fills `buf` with `C` values uniform in [lo, hi) ([`support::fill_with`]).
fn fill<C: BenchKv>(
    stream: &std::sync::Arc<cudarc::driver::CudaStream>,
    buf: &mut CudaSlice<C>,
    seed: u64,
    lo: f64,
    hi: f64,
) {
    let amax = lo.abs().max(hi.abs());
    support::fill_with(stream, buf, seed, |rng| C::of(rng.random_range(lo..hi), amax));
}

fn bench_case<C: BenchKv>(
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
    let elem = std::mem::size_of::<C>();
    let sets = support::rotation_sets(case.kv_bytes() * elem / 2, gpu.l2_bytes, MAX_SETS);
    let num_pages = sets * pages_per_set;
    let cache_len = num_pages * ps * hkv * d;

    // SAFETY (both): every element is written by fill before any launch reads it.
    let mut k = unsafe { s.alloc::<C>(cache_len) }.expect("alloc k cache");
    let mut v = unsafe { s.alloc::<C>(cache_len) }.expect("alloc v cache");
    fill(s, &mut k, seed, -2.0, 2.0);
    fill(s, &mut v, seed + 1, -0.5, 1.5);
    let scales = C::scales(&stream, hkv);
    // One block table per set, each a shuffled permutation of that set's pages.
    let mut rng = fused_attn::testkit::seed::rng(seed + 2);
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
    // K/V at `elem` bytes per element (decode_bytes counts 2).
    let bytes = decode_bytes(case, &plan) - case.kv_bytes() + case.kv_bytes() * elem / 2;
    s.synchronize().expect("synchronize");

    let id = format!("Hq{hq}_Hkv{hkv}_page{ps}_{}", C::NAME);
    let name = format!("B{b} ctx{ctx_len} Hq{hq}_Hkv{hkv}_page{ps}");
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
                let cache = match &scales {
                    Some(sc) => cache.with_scales(sc).expect("scales"),
                    None => cache,
                };
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
    Row { name, kv: C::NAME, bytes, splits: plan.num_splits(), ms }
}

fn main() {
    let Some(gpu) = support::gpu_or_skip("benches/decode") else { return };
    let smoke = support::test_mode();
    // The memory ceiling, measured first in the same process: a 1 GiB device-to-device copy (bytes read +
    // written).
    let copy_gbps = fused_attn::testkit::timing::copy_bandwidth_gbps(&gpu.stream, 1 << 30).expect("copy bandwidth");
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
                    let case = DecodeCase::new(DType::Bf16, HEAD_DIM, (hq, hkv), ps, &vec![ctx_len; b], None);
                    seed += 3;
                    rows.push(bench_case::<bf16>(&mut group, &gpu, &case, seed));
                    if ps == 16 {
                        rows.push(bench_case::<Fp8E4m3>(&mut group, &gpu, &case, seed));
                    }
                }
            }
        }
    }
    group.finish();
    c.final_summary();

    println!("\ndecode summary on {} (us per launch over the measurement samples)", gpu.name);
    println!("copy bandwidth ceiling (same run): {copy_gbps:.0} GB/s");
    println!(
        "{:<32} {:>9} {:>7} {:>10} {:>9} {:>8} {:>7} {:>12}",
        "shape", "cache", "splits", "MB moved", "us", "GB/s", "% copy", "vs bf16"
    );
    for (i, r) in rows.iter().enumerate() {
        let Some(ms) = r.ms else { continue };
        let gbps = r.bytes as f64 / (ms * 1e-3) / 1e9;
        // An FP8 row follows its shape's bf16 row: the speed-up over it.
        let speedup = match (r.kv, i.checked_sub(1).map(|j| &rows[j])) {
            ("fp8_e4m3", Some(prev)) if prev.name == r.name => prev.ms.map(|b| format!("{:.2}x", b / ms)),
            _ => None,
        };
        println!(
            "{:<32} {:>9} {:>7} {:>10.1} {:>9.2} {:>8.0} {:>6.0}% {:>12}",
            r.name,
            r.kv,
            r.splits,
            r.bytes as f64 / 1e6,
            ms * 1e3,
            gbps,
            100.0 * gbps / copy_gbps,
            speedup.unwrap_or_default()
        );
    }
}
