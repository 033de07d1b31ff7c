//! One step of a serving engine, end to end, checked against the fp64 reference:
//!  1. prefill two prompts of different lengths (varlen, causal, GQA 8:2), with LSE;
//!  2. append their K/V into a paged cache (pages from a free list, in any order);
//!  3. append one new token per sequence and decode it over the cache (split-KV planned once, pinned).
//!
//! `cargo run --release --example engine_step` runs it on the host emulator (the same kernel sources, on the
//! CPU); on a machine with an NVIDIA GPU (sm_80+) add `-- --gpu`. README.md's "Using it" is this file.
use cudarc::driver::{CudaSlice, CudaStream};
use fused_attn::decode::DecodeWorkspace;
use fused_attn::plan::DecodeProblem;
use fused_attn::prefill::{prefill_varlen, PrefillOptions};
use fused_attn::reference::{self, PagedCache};
use fused_attn::{
    append, decode, DType, DecodeOptions, Emulator, PagedKvCache, PagedKvCacheMut, Result, Stream, TensorView,
    TensorViewMut,
};
use half::bf16;
use std::sync::Arc;

const HQ: usize = 8; // query heads
const HKV: usize = 2; // KV heads (GQA: 4 query heads per KV head)
const D: usize = 64; // head dim
const PAGE: usize = 16; // tokens per cache page
const PAGES: usize = 64; // pages in the pool
const MAX_LEN: usize = 512; // longest sequence the engine serves

/// A buffer on the backend in use: host memory for the emulator, device memory on a GPU.
enum Buf<T> {
    Host(Vec<T>),
    Gpu(CudaSlice<T>),
}

impl<T: cudarc::driver::DeviceRepr + Clone> Buf<T> {
    fn new(gpu: Option<&Arc<CudaStream>>, data: &[T]) -> Result<Self> {
        Ok(match gpu {
            Some(s) => Buf::Gpu(s.clone_htod(data)?),
            None => Buf::Host(data.to_vec()),
        })
    }
    fn view<const N: usize>(&self, shape: [usize; N]) -> Result<TensorView<'_, T, N>> {
        match self {
            Buf::Host(v) => TensorView::host(v, shape),
            Buf::Gpu(s) => TensorView::gpu(s.as_view(), shape),
        }
    }
    fn view_mut<const N: usize>(&mut self, shape: [usize; N]) -> Result<TensorViewMut<'_, T, N>> {
        match self {
            Buf::Host(v) => TensorViewMut::host(v, shape),
            Buf::Gpu(s) => TensorViewMut::gpu(s.as_view_mut(), shape),
        }
    }
    fn read(&self, gpu: Option<&Arc<CudaStream>>) -> Result<Vec<T>> {
        Ok(match (self, gpu) {
            (Buf::Gpu(s), Some(stream)) => stream.clone_dtoh(s)?,
            (Buf::Host(v), _) => v.clone(),
            (Buf::Gpu(_), None) => unreachable!("device buffers only exist with a stream"),
        })
    }
}

/// Deterministic test data in [-1, 1) + 0.25 (offset so outputs are not ~0).
fn data(n: usize, salt: u64) -> Vec<bf16> {
    (0..n as u64).map(|i| bf16::from_f32(((i * 2654435761 + salt * 40503) % 2000) as f32 / 1000.0 - 0.75)).collect()
}

fn f64s(x: &[bf16]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

fn check(what: &str, ours: &[bf16], reference: &[f64], naive: &[f64]) -> bool {
    let c = reference::compare(&f64s(ours), reference, naive);
    println!(
        "{what:<8} max |err| {:.2e} (tolerance {:.2e}) {}",
        c.max_abs_err,
        c.tolerance,
        if c.passed { "ok" } else { "FAILED" }
    );
    c.passed
}

fn main() -> Result<()> {
    let use_gpu = std::env::args().any(|a| a == "--gpu");
    let ctx = if use_gpu { Some(fused_attn::device::cuda_context(0)?) } else { None };
    let cuda = ctx.as_ref().map(|c| c.default_stream());
    let emu = Emulator::new();
    let stream = match &cuda {
        Some(s) => Stream::Gpu(s),
        None => Stream::Emu(&emu),
    };
    let gpu = cuda.as_ref();
    println!("backend: {}", if use_gpu { "GPU" } else { "host emulator (add -- --gpu for a GPU)" });

    // ---- 1. Prefill two prompts, packed (varlen): tokens [0, 37) are sequence 0, [37, 87) sequence 1.
    let lens = [37usize, 50];
    let cu_seqlens = [0i32, 37, 87];
    let total = 87;
    let (q, k, v) = (data(total * HQ * D, 1), data(total * HKV * D, 2), data(total * HKV * D, 3));
    let (dq, dk, dv) = (Buf::new(gpu, &q)?, Buf::new(gpu, &k)?, Buf::new(gpu, &v)?);
    let cu = Buf::new(gpu, &cu_seqlens)?;
    let mut o = Buf::new(gpu, &vec![bf16::NAN; total * HQ * D])?;
    let mut lse = Buf::new(gpu, &vec![f32::NAN; HQ * total])?;
    prefill_varlen(
        &stream,
        &dq.view([total, HQ, D])?,
        &dk.view([total, HKV, D])?,
        &dv.view([total, HKV, D])?,
        &cu.view([3])?,
        &cu.view([3])?,
        50,
        50,
        &mut o.view_mut([total, HQ, D])?,
        Some(&mut lse.view_mut([HQ, total])?),
        &PrefillOptions { causal: true, scale: None, ..Default::default() },
    )?;
    let scale = 1.0 / (D as f64).sqrt();
    let (fq, fk, fv) = (f64s(&q), f64s(&k), f64s(&v));
    let want = reference::varlen(HQ, HKV, D, true, scale, &cu_seqlens, &cu_seqlens, &fq, &fk, &fv)?;
    let naive =
        reference::naive_lowp_varlen(HQ, HKV, D, true, scale, &cu_seqlens, &cu_seqlens, &fq, &fk, &fv, DType::Bf16)?;
    let mut ok = check("prefill", &o.read(gpu)?, &want.out, &naive);

    // ---- 2. Append the prompts' K/V into the paged cache. The engine owns the page allocator: here a free
    // list handed out back to front, so page ids are in no particular order. slot = page * PAGE + offset.
    let mut free: Vec<i32> = (0..PAGES as i32).collect();
    let width = MAX_LEN / PAGE;
    let mut block_table = vec![-1i32; 2 * width];
    for (b, &len) in lens.iter().enumerate() {
        for p in 0..(len + 1).div_ceil(PAGE) {
            block_table[b * width + p] = free.pop().expect("page pool exhausted");
        }
    }
    let slot = |b: usize, t: usize| block_table[b * width + t / PAGE] as i64 * PAGE as i64 + (t % PAGE) as i64;
    let slots: Vec<i64> = (0..2).flat_map(|b| (0..lens[b]).map(move |t| (b, t))).map(|(b, t)| slot(b, t)).collect();
    let cache_len = PAGES * PAGE * HKV * D;
    let (mut k_cache, mut v_cache) =
        (Buf::new(gpu, &vec![bf16::ZERO; cache_len])?, Buf::new(gpu, &vec![bf16::ZERO; cache_len])?);
    let cache_shape = [PAGES, PAGE, HKV, D];
    {
        let mut cache = PagedKvCacheMut::new(k_cache.view_mut(cache_shape)?, v_cache.view_mut(cache_shape)?)?;
        let slots = Buf::new(gpu, &slots)?;
        append(&stream, &dk.view([total, HKV, D])?, &dv.view([total, HKV, D])?, &slots.view([total])?, &mut cache)?;

        // ---- 3. One new token per sequence: its K/V go into the cache first (append), then it attends.
        let (k_new, v_new) = (data(2 * HKV * D, 4), data(2 * HKV * D, 5));
        let new_slots = Buf::new(gpu, &[slot(0, lens[0]), slot(1, lens[1])])?;
        let (kn, vn) = (Buf::new(gpu, &k_new)?, Buf::new(gpu, &v_new)?);
        append(&stream, &kn.view([2, HKV, D])?, &vn.view([2, HKV, D])?, &new_slots.view([2])?, &mut cache)?;
    }
    let seq_lens = [lens[0] as i32 + 1, lens[1] as i32 + 1];
    let q_new = data(2 * HQ * D, 6);
    let (table, sl, qn) = (Buf::new(gpu, &block_table)?, Buf::new(gpu, &seq_lens)?, Buf::new(gpu, &q_new)?);
    let cache = PagedKvCache::new(
        k_cache.view(cache_shape)?,
        v_cache.view(cache_shape)?,
        table.view([2, width])?,
        sl.view([2])?,
        MAX_LEN,
    )?;
    // The split-KV plan is made once for the engine's limits and pinned in the workspace: every decode step
    // (and a CUDA graph captured from one) follows it, and a sequence's bits never depend on its batch.
    let limits = DecodeProblem { batch: 2, heads_q: HQ, heads_kv: HKV, head_dim: D, max_seq_len: MAX_LEN };
    let mut workspace = DecodeWorkspace::for_limits(&stream, &limits, Some(2))?;
    let mut o_dec = Buf::new(gpu, &vec![bf16::NAN; 2 * HQ * D])?;
    decode(
        &stream,
        &qn.view([2, HQ, D])?,
        &cache,
        &mut o_dec.view_mut([2, HQ, D])?,
        None,
        &mut workspace,
        &DecodeOptions::default(),
    )?;

    let (kc, vc) = (f64s(&k_cache.read(gpu)?), f64s(&v_cache.read(gpu)?));
    let paged = PagedCache {
        k_cache: &kc,
        v_cache: &vc,
        num_pages: PAGES,
        page_size: PAGE,
        heads_kv: HKV,
        head_dim: D,
        block_table: &block_table,
        max_pages_per_seq: width,
        seq_lens: &seq_lens,
    };
    let want = reference::paged_decode(HQ, scale, &f64s(&q_new), &paged)?;
    let naive = reference::naive_lowp_paged_decode(HQ, scale, &f64s(&q_new), &paged, DType::Bf16)?;
    ok &= check("decode", &o_dec.read(gpu)?, &want.out, &naive);
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}
