//! The raw entry points an engine with its own allocator and streams uses: a driver-API stream wrapped in
//! `RawStream`, device memory by raw pointer (`TensorView::from_device_ptr`), and a decode workspace in the
//! caller's memory (`DecodeWorkspace::from_device_ptrs`). Prefill and split-KV decode through them must
//! match the cudarc-view path bit for bit (which the library's harness judges against fp64 elsewhere).
use crate::common;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use fused_attn::plan::DecodePlan;
use fused_attn::prefill::{prefill, PrefillOptions};
use fused_attn::testkit::cases::decode::{DecodeCase, PagedFixture};
use fused_attn::testkit::cases::kv::GpuPaged;
use fused_attn::{
    decode, DType, DecodeOptions, DecodeWorkspace, PagedKvCache, RawStream, Stream, TensorView, TensorViewMut,
};
use half::bf16;
use std::sync::Arc;

const SEED: u64 = 0x4a77_0001;

fn ptr<T>(cu: &CudaStream, s: &CudaSlice<T>) -> u64 {
    s.device_ptr(cu).0
}

fn bits(v: &[bf16]) -> Vec<u16> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Reads both paths' outputs back: the cudarc path's `o1` is finite and the raw path's `o2` the same bits.
fn assert_same_bits(cu: &Arc<CudaStream>, o1: &CudaSlice<bf16>, o2: &CudaSlice<bf16>) {
    let (r1, r2) = (cu.clone_dtoh(o1).unwrap(), cu.clone_dtoh(o2).unwrap());
    cu.synchronize().unwrap();
    assert!(r1.iter().all(|x| x.is_finite()), "cudarc path left NaN");
    assert_eq!(bits(&r1), bits(&r2), "raw path differs from the cudarc path");
}

/// Prefill through cudarc views on `cu`, then through raw pointers on the same stream wrapped raw.
#[test]
fn gpu_raw_stream_prefill_matches_the_cudarc_path() {
    let Some(ctx) = common::gpu_or_skip("gpu_raw::gpu_raw_stream_prefill_matches_the_cudarc_path") else { return };
    let cu: Arc<CudaStream> = ctx.new_stream().unwrap();
    let (b, t, hq, hkv, d) = (2, 300, 8, 2, 128);
    let gen = |n: usize, salt: u64| -> Vec<bf16> {
        (0..n as u64).map(|i| bf16::from_f32((((i * 2654435761 + salt) % 2001) as f32 / 1000.0 - 1.0) + 0.2)).collect()
    };
    let (q, k, v) = (gen(b * t * hq * d, SEED), gen(b * t * hkv * d, SEED + 1), gen(b * t * hkv * d, SEED + 2));
    let (dq, dk, dv) = (cu.clone_htod(&q).unwrap(), cu.clone_htod(&k).unwrap(), cu.clone_htod(&v).unwrap());
    let mut o1 = cu.clone_htod(&vec![bf16::NAN; q.len()]).unwrap();
    let o2 = cu.clone_htod(&vec![bf16::NAN; q.len()]).unwrap();
    let opts = PrefillOptions { causal: true, scale: None, ..Default::default() };
    // The cudarc-view call, on `stream`.
    let with_views = |stream: &Stream<'_>, o: &mut CudaSlice<bf16>| {
        prefill(
            stream,
            &TensorView::gpu(dq.as_view(), [b, t, hq, d]).unwrap(),
            &TensorView::gpu(dk.as_view(), [b, t, hkv, d]).unwrap(),
            &TensorView::gpu(dv.as_view(), [b, t, hkv, d]).unwrap(),
            &mut TensorViewMut::gpu(o.as_view_mut(), [b, t, hq, d]).unwrap(),
            None,
            &opts,
        )
    };
    with_views(&Stream::Gpu(&cu), &mut o1).unwrap();
    // SAFETY: the stream and every buffer outlive the launch (synchronised below).
    let raw = unsafe { RawStream::new(cu.cu_stream()) }.unwrap();
    unsafe {
        prefill(
            &Stream::Raw(raw),
            &TensorView::<bf16, 4>::from_device_ptr(ptr(&cu, &dq), q.len(), [b, t, hq, d]).unwrap(),
            &TensorView::from_device_ptr(ptr(&cu, &dk), k.len(), [b, t, hkv, d]).unwrap(),
            &TensorView::from_device_ptr(ptr(&cu, &dv), v.len(), [b, t, hkv, d]).unwrap(),
            &mut TensorViewMut::from_device_ptr(ptr(&cu, &o2), q.len(), [b, t, hq, d]).unwrap(),
            None,
            &opts,
        )
        .unwrap();
    }
    assert_same_bits(&cu, &o1, &o2);
    // A cudarc view on a raw stream is refused by kind (no stream-ordering guard could be kept).
    let e = with_views(&Stream::Raw(raw), &mut o1).unwrap_err();
    assert_eq!(e.kind(), &fused_attn::ErrorKind::Backend, "{e}");
}

/// Split-KV decode with the workspace in caller-owned memory, on a raw stream, against the cudarc path.
#[test]
fn gpu_raw_stream_decode_with_caller_workspace_matches_the_cudarc_path() {
    let Some(ctx) = common::gpu_or_skip("gpu_raw::gpu_raw_stream_decode_with_caller_workspace") else { return };
    let cu: Arc<CudaStream> = ctx.new_stream().unwrap();
    let case = DecodeCase::new(DType::Bf16, 128, (16, 2), 16, &[1, 700, 4097], Some(3));
    let f = PagedFixture::<bf16>::new(&case, SEED).unwrap();
    let (b, hq, d) = (case.batch(), case.heads_q, case.head_dim);
    let sm = fused_attn::device::sm_count(&ctx).unwrap();
    let plan = DecodePlan::new(&case.problem(), sm, case.num_splits).unwrap();
    let g = GpuPaged::<bf16, bf16>::upload(&cu, &f.host()).unwrap();
    let mut o1 = cu.clone_htod(&vec![bf16::NAN; b * hq * d]).unwrap();
    let o2 = cu.clone_htod(&vec![bf16::NAN; b * hq * d]).unwrap();
    let mut ws1 = DecodeWorkspace::for_plan(&Stream::Gpu(&cu), &plan).unwrap();
    let cache = g.cache(case.max_seq_len()).unwrap();
    let opts = DecodeOptions { scale: None, num_splits: case.num_splits, ..Default::default() };
    decode(
        &Stream::Gpu(&cu),
        &TensorView::gpu(g.q.as_view(), [b, hq, d]).unwrap(),
        &cache,
        &mut TensorViewMut::gpu(o1.as_view_mut(), [b, hq, d]).unwrap(),
        None,
        &mut ws1,
        &opts,
    )
    .unwrap();
    let po = cu.alloc_zeros::<f32>(plan.partial_o_len()).unwrap();
    let pl = cu.alloc_zeros::<f32>(plan.partial_lse_len()).unwrap();
    // SAFETY: every buffer and the stream outlive the work (synchronised below).
    unsafe {
        let raw = RawStream::new(cu.cu_stream()).unwrap();
        let mut ws2 = DecodeWorkspace::from_device_ptrs(
            raw,
            (ptr(&cu, &po), plan.partial_o_len()),
            (ptr(&cu, &pl), plan.partial_lse_len()),
            &plan,
            sm,
        )
        .unwrap();
        let cache = PagedKvCache::new(
            TensorView::<bf16, 4>::from_device_ptr(ptr(&cu, &g.k), f.k_cache.len(), f.cache_shape()).unwrap(),
            TensorView::from_device_ptr(ptr(&cu, &g.v), f.v_cache.len(), f.cache_shape()).unwrap(),
            TensorView::from_device_ptr(ptr(&cu, &g.table), f.block_table.len(), [b, f.width]).unwrap(),
            TensorView::from_device_ptr(ptr(&cu, &g.lens), b, [b]).unwrap(),
            case.max_seq_len(),
        )
        .unwrap();
        decode(
            &Stream::Raw(raw),
            &TensorView::from_device_ptr(ptr(&cu, &g.q), f.q.len(), [b, hq, d]).unwrap(),
            &cache,
            &mut TensorViewMut::from_device_ptr(ptr(&cu, &o2), b * hq * d, [b, hq, d]).unwrap(),
            None,
            &mut ws2,
            &opts,
        )
        .unwrap();
    }
    assert_same_bits(&cu, &o1, &o2);
}
