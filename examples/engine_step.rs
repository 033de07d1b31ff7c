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
use fused_attn::reference::{check_decode, check_prefill_varlen, Check};
use fused_attn::{
    append, decode, DecodeOptions, Emulator, PagedKvCache, PagedKvCacheMut, Result, Stream, TensorView, TensorViewMut,
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

fn report(what: &str, check: Check) -> bool {
    println!("{what:<8} {check}");
    check.passed()
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
    let opts = PrefillOptions { causal: true, scale: None, ..Default::default() };
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
        &opts,
    )?;
    // One call checks the outputs against the fp64 reference (and the naive bf16 implementation the
    // tolerance rule compares with), with the options the op ran with. It reads host views.
    let (o_host, lse_host) = (o.read(gpu)?, lse.read(gpu)?);
    let cu_host = TensorView::host(&cu_seqlens, [3])?;
    let mut ok = report(
        "prefill",
        check_prefill_varlen(
            &TensorView::host(&q, [total, HQ, D])?,
            &TensorView::host(&k, [total, HKV, D])?,
            &TensorView::host(&v, [total, HKV, D])?,
            &cu_host,
            &cu_host,
            &TensorView::host(&o_host, [total, HQ, D])?,
            Some(&TensorView::host(&lse_host, [HQ, total])?),
            &opts,
        )?,
    );

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

    // The cache as the kernel read it, on the host.
    let (kc, vc, o_host) = (k_cache.read(gpu)?, v_cache.read(gpu)?, o_dec.read(gpu)?);
    let host_cache = PagedKvCache::new(
        TensorView::host(&kc, cache_shape)?,
        TensorView::host(&vc, cache_shape)?,
        TensorView::host(&block_table, [2, width])?,
        TensorView::host(&seq_lens, [2])?,
        MAX_LEN,
    )?;
    let q_view = TensorView::host(&q_new, [2, HQ, D])?;
    let o_view = TensorView::host(&o_host, [2, HQ, D])?;
    ok &= report("decode", check_decode(&q_view, &host_cache, &o_view, None, &DecodeOptions::default())?);
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}
