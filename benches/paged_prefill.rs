//! Paged prefill on the GPU (bf16, D = 128, Hq = 32, Hkv = 8), two comparisons docs/performance.md states targets
//! for (not yet measured):
//!  - **paged vs dense prefill** on the same shapes: a full causal prefill (q_len = context = 2048, B = 4) and
//!    a chunk (q_len 512 at context 4096, B = 4), paged with page size 16 and 64 against
//!    `prefill::prefill` on dense K/V; target: paged within 10 % of dense. Throughput in FLOPs
//!    (`testkit::cases::paged_prefill::case_flops`, the causal pairs counted exactly).
//!  - **speculative verification** (q_len 4 and 8) against one decode step at the same context
//!    (B = 8, contexts 4096 and 16384, page 16); target: q_len ≤ 8 within 1.3 × the decode step.
//!    Caches are ≥ 128 MiB, above L2. Throughput in K/V bytes.
//!
//! Each sample is a CUDA-event pair around back-to-back launches (kernel + merge when split). Without a GPU:
//! prints "no GPU: <reason>; skipping" and exits 0. Without `--bench` (criterion's test mode) only the
//! first shape of each group runs.

mod support;

use std::cell::RefCell;
use std::rc::Rc;

use criterion::{BenchmarkId, Throughput};
use cudarc::driver::CudaSlice;
use fused_attn::paged_prefill::{paged_prefill, PagedPrefillOptions, PagedPrefillWorkspace};
use fused_attn::prefill::{prefill, PrefillOptions};
use fused_attn::testkit::cases::paged_prefill::{case_flops, PagedPrefillCase};
use fused_attn::{decode, DType, DecodeOptions, DecodeWorkspace, PagedKvCache, Stream, TensorView, TensorViewMut};
use half::bf16;
use rand::seq::SliceRandom;

const HQ: usize = 32;
const HKV: usize = 8;
const D: usize = 128;

type Group<'a> = criterion::BenchmarkGroup<'a, criterion::measurement::WallTime>;

/// A paged cache of `b` sequences of `ctx` tokens on the GPU (pages shuffled), with q for `q_len` new
/// tokens per sequence and the outputs.
struct PagedSetup {
    k: CudaSlice<bf16>,
    v: CudaSlice<bf16>,
    table: CudaSlice<i32>,
    lens: CudaSlice<i32>,
    cu_q: CudaSlice<i32>,
    q: CudaSlice<bf16>,
    o: CudaSlice<bf16>,
    lse: CudaSlice<f32>,
    b: usize,
    ctx: usize,
    q_len: usize,
    ps: usize,
}

impl PagedSetup {
    fn new(gpu: &support::Gpu, b: usize, ctx: usize, q_len: usize, ps: usize, seed: u64) -> Self {
        let s = &gpu.stream;
        let pages = b * ctx.div_ceil(ps);
        let len = pages * ps * HKV * D;
        // SAFETY (both): fill_random writes every element before any launch reads it.
        let mut k = unsafe { s.alloc::<bf16>(len) }.expect("alloc k cache");
        let mut v = unsafe { s.alloc::<bf16>(len) }.expect("alloc v cache");
        support::fill_random(s, &mut k, seed, -2.0, 2.0);
        support::fill_random(s, &mut v, seed + 1, -0.5, 1.5);
        let mut ids: Vec<i32> = (0..pages as i32).collect();
        ids.shuffle(&mut fused_attn::testkit::seed::rng(seed + 2));
        let total_q = b * q_len;
        let mut q = unsafe { s.alloc::<bf16>(total_q * HQ * D) }.expect("alloc q");
        support::fill_random(s, &mut q, seed + 3, -2.0, 2.0);
        Self {
            k,
            v,
            table: s.clone_htod(&ids).expect("upload block table"),
            lens: s.clone_htod(&vec![ctx as i32; b]).expect("upload seq_lens"),
            cu_q: s.clone_htod(&(0..=b).map(|i| (i * q_len) as i32).collect::<Vec<_>>()).expect("upload cu"),
            q,
            o: s.alloc_zeros::<bf16>(total_q * HQ * D).expect("alloc o"),
            lse: s.alloc_zeros::<f32>(total_q * HQ).expect("alloc lse"),
            b,
            ctx,
            q_len,
            ps,
        }
    }

    fn cache(&self) -> PagedKvCache<'_, bf16> {
        let shape = [self.b * self.ctx.div_ceil(self.ps), self.ps, HKV, D];
        PagedKvCache::new(
            TensorView::gpu(self.k.as_view(), shape).expect("k view"),
            TensorView::gpu(self.v.as_view(), shape).expect("v view"),
            TensorView::gpu(self.table.as_view(), [self.b, self.ctx.div_ceil(self.ps)]).expect("table view"),
            TensorView::gpu(self.lens.as_view(), [self.b]).expect("lens view"),
            self.ctx,
        )
        .expect("paged cache")
    }

    fn run_paged(&mut self, stream: &Stream<'_>, ws: &mut PagedPrefillWorkspace) {
        let total_q = self.b * self.q_len;
        // Views borrow the buffers; take the cache's first so that o / lse can be borrowed mutably after.
        let (o, lse) = (&mut self.o, &mut self.lse);
        let shape = [self.b * self.ctx.div_ceil(self.ps), self.ps, HKV, D];
        let cache = PagedKvCache::new(
            TensorView::gpu(self.k.as_view(), shape).expect("k view"),
            TensorView::gpu(self.v.as_view(), shape).expect("v view"),
            TensorView::gpu(self.table.as_view(), [self.b, self.ctx.div_ceil(self.ps)]).expect("table view"),
            TensorView::gpu(self.lens.as_view(), [self.b]).expect("lens view"),
            self.ctx,
        )
        .expect("paged cache");
        paged_prefill(
            stream,
            &TensorView::gpu(self.q.as_view(), [total_q, HQ, D]).expect("q view"),
            &TensorView::gpu(self.cu_q.as_view(), [self.b + 1]).expect("cu view"),
            self.q_len,
            &cache,
            &mut TensorViewMut::gpu(o.as_view_mut(), [total_q, HQ, D]).expect("o view"),
            Some(&mut TensorViewMut::gpu(lse.as_view_mut(), [HQ, total_q]).expect("lse view")),
            Some(ws),
            &PagedPrefillOptions::default(),
        )
        .expect("paged prefill launch");
    }

    /// Times the paged prefill (with its own workspace) as `id`; ms per launch.
    fn time(mut self, group: &mut Group<'_>, gpu: &support::Gpu, id: BenchmarkId) -> Option<f64> {
        let stream = Stream::Gpu(&gpu.stream);
        let mut ws = PagedPrefillWorkspace::with_capacity(&stream, self.b * self.q_len, HQ, D, 64).expect("workspace");
        time(group, gpu, id, || self.run_paged(&stream, &mut ws))
    }
}

fn case(b: usize, q_len: usize, ctx: usize, ps: usize) -> PagedPrefillCase {
    let mut c = fused_attn::testkit::cases::paged_prefill::case(D, (HQ, HKV), ps, &vec![(q_len, ctx); b]);
    c.dtype = DType::Bf16;
    c
}

/// Runs `body` in criterion group `name` on `gpu`'s stream, then prints criterion's summary; returns the
/// body's summary lines.
fn in_group(
    gpu: &support::Gpu,
    name: &str,
    body: impl FnOnce(&mut Group<'_>, &Stream<'_>) -> Vec<String>,
) -> Vec<String> {
    let stream = Stream::Gpu(&gpu.stream);
    let mut c = support::criterion();
    let mut group = c.benchmark_group(name);
    let lines = body(&mut group, &stream);
    group.finish();
    c.final_summary();
    lines
}

/// Times `launch` under criterion; returns ms per launch.
fn time(group: &mut Group<'_>, gpu: &support::Gpu, id: BenchmarkId, mut launch: impl FnMut()) -> Option<f64> {
    let log = Rc::new(RefCell::new(Vec::new()));
    let mut counter = 0usize;
    group.bench_function(id, |bencher| {
        bencher.iter_custom(|iters| support::time_iters(&gpu.stream, iters, &mut counter, &log, |_| launch()))
    });
    gpu.stream.synchronize().expect("synchronize");
    let samples = log.borrow().clone();
    support::ms_per_launch(&samples)
}

fn paged_vs_dense(gpu: &support::Gpu, smoke: bool) -> Vec<String> {
    in_group(gpu, "paged_vs_dense_prefill_bf16", |group, stream| {
        let s = &gpu.stream;
        let mut lines = Vec::new();
        for (i, &(b, q_len, ctx)) in [(4usize, 2048usize, 2048usize), (4, 512, 4096)].iter().enumerate() {
            if smoke && i > 0 {
                continue;
            }
            let flops = case_flops(&case(b, q_len, ctx, 16));
            group.throughput(Throughput::Elements(flops as u64));
            // Dense: q [B, q_len, Hq, D], k/v [B, ctx, Hkv, D], causal bottom-right (the same visible pairs).
            let mut dk = unsafe { s.alloc::<bf16>(b * ctx * HKV * D) }.expect("alloc k");
            let mut dv = unsafe { s.alloc::<bf16>(b * ctx * HKV * D) }.expect("alloc v");
            let mut dq = unsafe { s.alloc::<bf16>(b * q_len * HQ * D) }.expect("alloc q");
            for (buf, seed) in [(&mut dk, 11), (&mut dv, 12), (&mut dq, 13)] {
                support::fill_random(s, buf, seed, -1.0, 1.0);
            }
            let mut d_o = s.alloc_zeros::<bf16>(b * q_len * HQ * D).expect("alloc o");
            let label = format!("B{b}_q{q_len}_ctx{ctx}");
            let dense_ms = time(group, gpu, BenchmarkId::new("dense", &label), || {
                prefill(
                    stream,
                    &TensorView::gpu(dq.as_view(), [b, q_len, HQ, D]).expect("q view"),
                    &TensorView::gpu(dk.as_view(), [b, ctx, HKV, D]).expect("k view"),
                    &TensorView::gpu(dv.as_view(), [b, ctx, HKV, D]).expect("v view"),
                    &mut TensorViewMut::gpu(d_o.as_view_mut(), [b, q_len, HQ, D]).expect("o view"),
                    None,
                    &PrefillOptions { causal: true, ..Default::default() },
                )
                .expect("dense prefill launch");
            });
            for ps in [16, 64] {
                let setup = PagedSetup::new(gpu, b, ctx, q_len, ps, 100 + ps as u64);
                let paged_ms = setup.time(group, gpu, BenchmarkId::new(format!("paged_page{ps}"), &label));
                if let (Some(p), Some(dn)) = (paged_ms, dense_ms) {
                    lines.push(format!(
                        "{label} page {ps}: paged {:.1} us ({:.0} TFLOPS), dense {:.1} us: paged/dense = {:.2} (target <= 1.10)",
                        p * 1e3,
                        flops / (p * 1e-3) / 1e12,
                        dn * 1e3,
                        p / dn
                    ));
                }
            }
        }
        lines
    })
}

fn spec_verify_vs_decode(gpu: &support::Gpu, smoke: bool) -> Vec<String> {
    in_group(gpu, "spec_verify_vs_decode_bf16", |group, stream| {
        let s = &gpu.stream;
        let mut lines = Vec::new();
        let b = 8;
        for (i, &ctx) in [4096usize, 16384].iter().enumerate() {
            if smoke && i > 0 {
                continue;
            }
            let kv_bytes = (2 * b * ctx * HKV * D * 2) as u64;
            group.throughput(Throughput::Bytes(kv_bytes));
            let label = format!("B{b}_ctx{ctx}");
            // The decode step over the same cache geometry.
            let dec = PagedSetup::new(gpu, b, ctx, 1, 16, 200);
            let mut o = s.alloc_zeros::<bf16>(b * HQ * D).expect("alloc o");
            let problem =
                fused_attn::DecodeProblem { batch: b, heads_q: HQ, heads_kv: HKV, head_dim: D, max_seq_len: ctx };
            let mut dws = DecodeWorkspace::for_limits(stream, &problem, None).expect("decode workspace");
            let decode_ms = time(group, gpu, BenchmarkId::new("decode_step", &label), || {
                decode(
                    stream,
                    &TensorView::gpu(dec.q.as_view(), [b, HQ, D]).expect("q view"),
                    &dec.cache(),
                    &mut TensorViewMut::gpu(o.as_view_mut(), [b, HQ, D]).expect("o view"),
                    None,
                    &mut dws,
                    &DecodeOptions::default(),
                )
                .expect("decode launch");
            });
            for q_len in [4, 8] {
                let setup = PagedSetup::new(gpu, b, ctx, q_len, 16, 300 + q_len as u64);
                let ms = setup.time(group, gpu, BenchmarkId::new(format!("verify_q{q_len}"), &label));
                if let (Some(v), Some(dn)) = (ms, decode_ms) {
                    lines.push(format!(
                        "{label} q_len {q_len}: verify {:.1} us, decode step {:.1} us: ratio {:.2} (target <= 1.30)",
                        v * 1e3,
                        dn * 1e3,
                        v / dn
                    ));
                }
            }
        }
        lines
    })
}

fn main() {
    let Some(gpu) = support::gpu_or_skip("benches/paged_prefill") else { return };
    let smoke = support::test_mode();
    let mut lines = paged_vs_dense(&gpu, smoke);
    lines.extend(spec_verify_vs_decode(&gpu, smoke));
    println!("\npaged prefill summary on {} (us per launch over the measurement samples)", gpu.name);
    for l in lines {
        println!("{l}");
    }
}
