//! Paged prefill against the fp64 reference on the emulator: the sweep (page sizes 1..256, q_len 1..1000,
//! contexts to 4k+, GQA groups 1..16, ragged batches, shuffled and shared pages, splits), the score variants,
//! q_len = 1 against decode, and bad input -> typed errors. FP8 caches (issue 17): the emulated FP8 sweep
//! against the fp64 reference over the stored cache (quantisation error against the 16-bit cache bounded),
//! the halved K/V reads, and FP8 bad input -> typed errors.
use crate::common;

use fused_attn::paged_prefill::{
    paged_prefill, PagedPrefillKernel, PagedPrefillOptions, PagedPrefillWorkspace, STREAMING_MAX_ROWS,
};
use fused_attn::testkit::cases::decode::decode_on_host;
use fused_attn::testkit::cases::kv::KvFormat;
use fused_attn::testkit::cases::paged_prefill::{
    case, check_case_emulated, check_case_gpu, fp8_paged_prefill_sweep_emulated, paged_prefill_kernel_sweep,
    paged_prefill_sweep_emulated, paged_prefill_variant_sweep, paged_prefill_wide_head_dim_sweep, PagedPrefillCase,
    PagedPrefillFixture, PagedPrefillOutcome,
};
use fused_attn::tile::{tile_policy, KernelOp};
use fused_attn::{
    DType, DecodeOptions, DecodeWorkspace, Emulator, ErrorKind, Fp8E4m3, Fp8Format, KvScales, PagedKvCache, ScaleKind,
    Stream, TensorView, TensorViewMut,
};
use half::{bf16, f16};

/// Runs every selected case (FA_CASE) and panics listing the failures, each with its rerun command.
fn sweep(test: &str, cases: &[(usize, PagedPrefillCase)]) {
    let emu = Emulator::new();
    common::sweep_in_order("paged_prefill", test, cases, PagedPrefillCase::label, |i, c| {
        let outcome = check_case_emulated(&emu, c, common::case_seed(i)).unwrap();
        (outcome.passed(), outcome.summary())
    });
}

fn part(cases: Vec<PagedPrefillCase>, first: usize, step: usize) -> Vec<(usize, PagedPrefillCase)> {
    cases.into_iter().enumerate().skip(first).step_by(step).collect()
}

#[test]
fn emulated_paged_prefill_sweep_even() {
    sweep("emulated_paged_prefill_sweep_even", &part(paged_prefill_sweep_emulated(), 0, 2));
}

#[test]
fn emulated_paged_prefill_sweep_odd() {
    sweep("emulated_paged_prefill_sweep_odd", &part(paged_prefill_sweep_emulated(), 1, 2));
}

#[test]
fn emulated_paged_prefill_variants() {
    sweep("emulated_paged_prefill_variants", &part(paged_prefill_variant_sweep(), 0, 1));
}

/// Head dims 264–512 on the streaming kernel at every query length (issue 27), against the fp64 reference;
/// the tiled kernel refuses them (Unsupported).
#[test]
fn emulated_paged_prefill_wide_head_dims() {
    let cases = part(paged_prefill_wide_head_dim_sweep(), 0, 1);
    sweep("emulated_paged_prefill_wide_head_dims", &cases);
    let emu = Emulator::new();
    let tiled = PagedPrefillCase { kernel: PagedPrefillKernel::Tiled, ..cases[0].1.clone() };
    let err = check_case_emulated(&emu, &tiled, 1).expect_err("the tiled kernel stops at 256");
    assert_eq!(*err.kind(), ErrorKind::Unsupported, "{err}");
}

/// Short queries on both kernels (streaming and tiled), every case against the fp64 reference.
#[test]
fn emulated_paged_prefill_both_kernels() {
    let cases = part(paged_prefill_kernel_sweep(), 0, 1);
    assert!(cases.iter().any(|(_, c)| c.kernel == PagedPrefillKernel::Streaming));
    sweep("emulated_paged_prefill_both_kernels", &cases);
}

/// Which kernel runs, and what it keeps in flight (issue 25, item 4). Speculative verification (q_len 4, G 4:
/// 16 packed rows; and G 8: 32) runs on the decode kernel under Auto, 128 threads, decode's shared memory; the
/// plan's grid is decode's (splits, Hkv x row blocks, B), and a CTA serves all 32 rows of G 8 at D 128 (two
/// row groups: issue 30, item 4), so each KV head's keys are read once. Bytes in flight per SM from the two tile policies
/// (stages - 1 K+V tiles per CTA, times CTAs per SM): the streaming kernel keeps at least twice the tiled
/// one's, and at least the H200's bandwidth-delay product per SM (4.8 TB/s x ~0.7 us / 132 SMs ~ 26 KB).
#[test]
fn short_queries_stream_like_decode() {
    let emu = Emulator::new();
    // (G, packed rows, rows per CTA)
    for (g, rows, cta_rows) in [(4, 16, 16), (8, 32, 32)] {
        let c = case(128, (8 * g, 8), 16, &[(4, 2000), (4, 700)]);
        let outcome = check_case_emulated(&emu, &c, common::case_seed(0)).unwrap();
        assert!(outcome.passed(), "{}", outcome.summary());
        let plan = outcome.plan;
        assert_eq!(plan.kernel(), PagedPrefillKernel::Streaming, "G {g}");
        assert!(rows <= STREAMING_MAX_ROWS);
        assert_eq!(plan.grid(), [plan.num_splits(), 8, 2], "G {g}: one CTA per (KV head, split, sequence)");
        let counters = emu.last_launch_counters().unwrap();
        let k = &counters.kernels[0];
        let p = tile_policy(KernelOp::Decode, 128, false, None).unwrap();
        assert_eq!(k.kernel, "fa_paged_decode_bf16_d128");
        assert_eq!((k.block_threads, k.smem_bytes), (p.threads as u64, p.smem_bytes as u64));
        assert_eq!(k.blocks, (plan.num_splits() * 8 * 2) as u64);
        // Each CTA reads the keys up to its last row's position once (causal: the range ends there), exactly:
        // per sequence and KV head, Σ over row blocks of (last position + 1) keys of K.
        let per_key = (8 * 128 * 2) as u64;
        let keys: u64 = c
            .seqs
            .iter()
            .flat_map(|&(q, len)| {
                (0..(q * g).div_ceil(cta_rows))
                    .map(move |blk| (len - q + ((blk * cta_rows + cta_rows - 1).min(q * g - 1)) / g + 1) as u64)
            })
            .sum();
        assert_eq!(k.read_of("k_cache"), keys * per_key, "G {g}");
    }
    // Past the threshold: tiled.
    let long = case(128, (32, 8), 16, &[(9, 300)]);
    let (_, _, plan) = PagedPrefillFixture::<bf16>::new(&long, 1).run(&Stream::Emu(&emu), None).unwrap();
    assert_eq!(plan.kernel(), PagedPrefillKernel::Tiled);
    let in_flight = |op: KernelOp| {
        let p = tile_policy(op, 128, false, None).unwrap();
        (p.stages - 1) * p.block_n * 128 * 2 * 2 * p.min_ctas_per_sm
    };
    let (streaming, tiled) = (in_flight(KernelOp::Decode), in_flight(KernelOp::PagedPrefill));
    println!("bytes in flight per SM at D = 128: streaming {streaming}, tiled {tiled}");
    assert!(streaming >= 2 * tiled && streaming >= 26 * 1024, "streaming {streaming} B vs tiled {tiled} B per SM");
}

/// A case with a shared prefix gives every sequence exactly the result of the same sequence laid out on
/// private pages (the kernel reads pages by id, whoever else names them).
#[test]
fn shared_prefix_pages_match_private_pages() {
    let emu = Emulator::new();
    let mut shared = case(64, (4, 2), 16, &[(5, 64), (5, 64)]);
    shared.shared_prefix = 64; // the whole context shared: both sequences are the same keys
    let f = PagedPrefillFixture::<bf16>::new(&shared, common::case_seed(0));
    let mut f2 = PagedPrefillFixture::<bf16>::new(&shared, common::case_seed(0));
    f2.q = f.q.clone();
    // Same queries for both sequences: their outputs must then be bitwise equal.
    let tok = 5 * 4 * 64;
    let (a, b) = f2.q.split_at_mut(tok);
    b.copy_from_slice(a);
    let (o, lse, _) = f2.run(&Stream::Emu(&emu), Some(1)).unwrap();
    assert!(o.iter().all(|x| !x.is_nan()));
    assert_eq!(o[..tok], o[tok..], "the two sequences share every page and query");
    for h in 0..4 {
        assert_eq!(lse[h * 10..h * 10 + 5], lse[h * 10 + 5..h * 10 + 10]);
    }
}

/// Block-table entries out of range inside a sequence (holes) mask their page's tokens (weight exactly 0,
/// as decode does), on masked and interior tiles alike, unsplit and split.
#[test]
fn holes_in_the_block_table_are_masked() {
    let emu = Emulator::new().with_table_checks(fused_attn::TableChecks::GpuMasking);
    for (i, splits) in [(0usize, 1usize), (1, 2)] {
        let c = case(64, (8, 2), 16, &[(5, 200), (17, 150)]);
        let mut f = PagedPrefillFixture::<bf16>::new(&c, common::case_seed(10 + i));
        f.block_table[1] = -1; // sequence 0, tokens 16..32: an interior tile
        f.block_table[f.width + 9] = 1 << 20; // sequence 1, tokens 144..150: the diagonal's tiles
        let (o, lse, plan) = f.run(&Stream::Emu(&emu), Some(splits)).unwrap();
        assert_eq!(plan.num_splits(), splits);
        let (exact, naive) = f.reference().unwrap();
        let ours: Vec<f64> = o.iter().map(|v| f64::from(v.to_f32())).collect();
        let c_out = fused_attn::reference::compare(&ours, &exact.out, &naive);
        let ours_lse: Vec<f64> = lse.iter().map(|&x| f64::from(x)).collect();
        let c_lse = fused_attn::reference::compare_lse(&ours_lse, &exact.lse, 1e-4);
        assert!(c_out.passed && c_lse.passed, "splits={splits}: {c_out:?} {c_lse:?}");
    }
}

/// q_len = 1 paged prefill is decode: the same cache and query give the same result (within fp32
/// reassociation: the kernels tile differently).
#[test]
fn q_len_one_matches_decode() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let c = case(128, (8, 2), 16, &[(1, 1), (1, 77), (1, 300), (1, 0)]);
    let f = PagedPrefillFixture::<bf16>::new(&c, common::case_seed(1));
    let (o, lse, _) = f.run(&stream, Some(1)).unwrap();
    let (b, hq, d) = (4, 8, 128);
    let cache = f.host_cache().unwrap(); // max_seq_len 300
    let mut ws = DecodeWorkspace::with_capacity(&stream, b, hq, d, 1).unwrap();
    let opts = DecodeOptions { num_splits: Some(1), ..Default::default() };
    let (od, lsed, _) =
        decode_on_host(&stream, &TensorView::host(&f.q, [b, hq, d]).unwrap(), &cache, &mut ws, &opts).unwrap();
    for (x, y) in o.iter().zip(&od) {
        let (x, y) = (x.to_f32(), y.to_f32());
        assert!((x - y).abs() <= 1e-2 * (1.0 + y.abs()), "paged prefill {x} vs decode {y}");
    }
    // lse: paged prefill [Hq, total_q], decode [B, Hq].
    for bb in 0..b {
        for h in 0..hq {
            let (x, y) = (lse[h * b + bb], lsed[bb * hq + h]);
            assert!(x == y || (x - y).abs() <= 1e-4 * (1.0 + y.abs()), "lse b={bb} h={h}: {x} vs {y}");
        }
    }
}

/// Bad input: each kind of mistake gives its typed error.
#[test]
fn bad_input_gives_typed_errors() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let (b, hq, hkv, d, ps, pages) = (2usize, 4usize, 2usize, 64usize, 16usize, 8usize);
    let kc = vec![bf16::ZERO; pages * ps * hkv * d];
    let table = vec![0i32; b * 8];
    let lens = vec![20i32, 5];
    let cache = PagedKvCache::new(
        TensorView::host(&kc, [pages, ps, hkv, d]).unwrap(),
        TensorView::host(&kc, [pages, ps, hkv, d]).unwrap(),
        TensorView::host(&table, [b, 8]).unwrap(),
        TensorView::host(&lens, [b]).unwrap(),
        128,
    )
    .unwrap();
    let q = vec![bf16::ZERO; 8 * hq * d];
    let mut o = vec![bf16::ZERO; 8 * hq * d];
    let cu_good = [0i32, 5, 8];
    let run =
        |q_shape: [usize; 3], cu: &[i32], max_q: usize, o: &mut [bf16], o_shape: [usize; 3], splits: Option<usize>| {
            let opts = PagedPrefillOptions { num_splits: splits, ..Default::default() };
            paged_prefill(
                &stream,
                &TensorView::host(&q[..q_shape.iter().product()], q_shape).unwrap(),
                &TensorView::host(cu, [cu.len()]).unwrap(),
                max_q,
                &cache,
                &mut TensorViewMut::host(&mut o[..o_shape.iter().product()], o_shape).unwrap(),
                None,
                None,
                &opts,
            )
            .map(|_| ())
            .unwrap_err()
            .kind()
            .clone()
        };
    // cu_seqlens_q of the wrong length.
    assert_eq!(run([8, hq, d], &[0, 8], 8, &mut o, [8, hq, d], None), ErrorKind::Shape);
    // cu_seqlens_q decreasing / a sequence longer than max_seqlen_q / past the packed rows.
    assert_eq!(run([8, hq, d], &[0, 5, 3], 8, &mut o, [8, hq, d], None), ErrorKind::Shape);
    assert_eq!(run([8, hq, d], &cu_good, 4, &mut o, [8, hq, d], None), ErrorKind::Shape);
    assert_eq!(run([8, hq, d], &[0, 5, 9], 8, &mut o, [8, hq, d], None), ErrorKind::Shape);
    // o of another shape.
    assert_eq!(run([8, hq, d], &cu_good, 8, &mut o, [7, hq, d], None), ErrorKind::Shape);
    // Query heads not a multiple of the KV heads; a head dim that differs from the cache's.
    assert_eq!(run([8, 3, d], &cu_good, 8, &mut o, [8, 3, d], None), ErrorKind::Shape);
    assert_eq!(run([8, hq, 32], &cu_good, 8, &mut o, [8, hq, 32], None), ErrorKind::Shape);
    // Splits without a workspace.
    assert_eq!(run([8, hq, d], &cu_good, 8, &mut o, [8, hq, d], Some(2)), ErrorKind::Usage);
    // The good arguments with a workspace and options.
    let mut good = |ws: Option<&mut PagedPrefillWorkspace>, opts: &PagedPrefillOptions| {
        paged_prefill(
            &stream,
            &TensorView::host(&q, [8, hq, d]).unwrap(),
            &TensorView::host(&cu_good, [3]).unwrap(),
            8,
            &cache,
            &mut TensorViewMut::host(&mut o, [8, hq, d]).unwrap(),
            None,
            ws,
            opts,
        )
    };
    // A workspace too small for the forced split count.
    let mut ws = PagedPrefillWorkspace::with_capacity(&stream, 8, hq, d, 1).unwrap();
    let err = good(Some(&mut ws), &PagedPrefillOptions { num_splits: Some(2), ..Default::default() }).unwrap_err();
    assert_eq!(*err.kind(), ErrorKind::OutOfBounds);
    // And the good call works (a test that cannot fail is a defect: the errors above are the arguments').
    good(None, &PagedPrefillOptions::default()).unwrap();
}

/// The emulated sweep and variant cases on a GPU (skipped visibly without one; the GPU bundle requires it).
#[test]
fn gpu_paged_prefill_sweep() {
    let Some(cu) = common::gpu_stream_or_skip("paged_prefill::gpu_paged_prefill_sweep") else { return };
    let cases: Vec<PagedPrefillCase> =
        paged_prefill_sweep_emulated().into_iter().chain(paged_prefill_variant_sweep()).collect();
    common::sweep("paged_prefill", "gpu_paged_prefill_sweep", &cases, 1, PagedPrefillCase::label, |i, c| {
        let outcome = check_case_gpu(&cu, c, common::case_seed(i)).unwrap();
        common::verdict(outcome.passed(), outcome.summary())
    });
}

/// The FP8 sweep (both formats and scale kinds, page sizes 1..256, every width, GQA, splits, variants)
/// against the fp64 reference over the stored (dequantised) cache; the quantisation error against the
/// 16-bit cache must stay small against the outputs (|O| ~ 0.25): a wrong scale or a dropped token shows there
/// even if the kernel matched a wrong reference.
#[test]
fn emulated_fp8_paged_prefill_sweep() {
    let emu = Emulator::new();
    fp8_sweep("emulated_fp8_paged_prefill_sweep", |c, seed| check_case_emulated(&emu, c, seed));
}

/// The FP8 sweep on a GPU (skips visibly without one), judged as on the emulator.
#[test]
fn gpu_fp8_paged_prefill_sweep() {
    let Some(cu) = common::gpu_stream_or_skip("paged_prefill::gpu_fp8_paged_prefill_sweep") else { return };
    fp8_sweep("gpu_fp8_paged_prefill_sweep", |c, seed| check_case_gpu(&cu, c, seed));
}

/// The FP8 sweep judged by `check`: against the reference over the stored cache, and the quantisation error
/// against the 16-bit cache small against the outputs.
fn fp8_sweep(test: &str, check: impl Fn(&PagedPrefillCase, u64) -> fused_attn::Result<PagedPrefillOutcome> + Sync) {
    let cases = fp8_paged_prefill_sweep_emulated();
    common::sweep("paged_prefill", test, &cases, 1, PagedPrefillCase::label, |i, c| {
        let o = check(c, common::case_seed(i)).unwrap_or_else(|e| panic!("[{i}] {}: {e}", c.label()));
        common::verdict(o.passed() && o.quant.is_some_and(|q| q.rel_l2_err < 0.1), o.summary())
    });
}

fn fp8_case(format: Fp8Format, scales: ScaleKind) -> PagedPrefillCase {
    let mut c = case(64, (4, 2), 16, &[(5, 200), (17, 100)]);
    c.dtype = DType::F16;
    c.kv = KvFormat::Fp8 { format, scales };
    c
}

/// Over an FP8 cache the kernel reads exactly half the K/V bytes of the 16-bit cache (same fixture, same
/// pages, one split), and its global reads overall drop accordingly.
#[test]
fn fp8_paged_prefill_reads_half_the_kv_bytes() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let f = PagedPrefillFixture::<f16>::new(&fp8_case(Fp8Format::E5m2, ScaleKind::PerHead), 3);
    let (o8, _, _) = f.run(&stream, Some(1)).unwrap();
    assert!(o8.iter().all(|x| !x.is_nan()));
    let fp8 = emu.last_launch_counters().unwrap();
    f.run_on(&stream, &f.host_cache().unwrap(), Some(1)).unwrap();
    let sixteen = emu.last_launch_counters().unwrap();
    let kv = |l: &fused_attn::LaunchCounters| l.kernels[0].read_of("k_cache") + l.kernels[0].read_of("v_cache");
    let (kv8, kv16) = (kv(&fp8), kv(&sixteen));
    assert!(kv16 > 0 && 2 * kv8 == kv16, "FP8 K/V reads {kv8} B, 16-bit {kv16} B");
    let (all8, all16) = (fp8.kernels[0].global_bytes_read(), sixteen.kernels[0].global_bytes_read());
    eprintln!("global reads: FP8 {all8} B, 16-bit {all16} B (K/V {kv8} vs {kv16})");
    let (k_scale_reads, v_scale_reads) = (fp8.kernels[0].read_of("k_scale"), fp8.kernels[0].read_of("v_scale"));
    assert!(k_scale_reads > 0 && v_scale_reads > 0, "the kernel reads its K and V scales");
    let scale_reads = k_scale_reads + v_scale_reads;
    assert_eq!(all8 - scale_reads, all16 - (kv16 - kv8), "only the K/V reads differ, and the scales are read");
}

/// FP8 bad input: a cache without scales, scales for the wrong head count, scales on a 16-bit cache.
#[test]
fn bad_fp8_paged_prefill_inputs_are_typed_errors() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let s = PagedPrefillFixture::<f16>::new(&fp8_case(Fp8Format::E4m3, ScaleKind::PerTensor), 4);
    let c = &s.case;
    let (b, hq, d, tq) = (c.batch(), c.heads_q, c.head_dim, c.total_q());
    let fp8 = s.fp8.as_ref().unwrap();
    let (k, v) = fp8.codes::<Fp8E4m3>();
    let cache = || s.host().cache_of([&k, &v], None).unwrap();
    let three = KvScales::per_head(&stream, &[1.0; 3], &[1.0; 3]).unwrap();
    assert_eq!(cache().with_scales(&three).err().unwrap().kind(), &ErrorKind::Shape);
    let q = TensorView::host(&s.q, [tq, hq, d]).unwrap();
    let cu = TensorView::host(&s.cu_seqlens_q, [b + 1]).unwrap();
    let mut o = vec![f16::NAN; tq * hq * d];
    // The call under test over `cache`, into `o`.
    fn call<C: fused_attn::fp8::KvCacheOf<f16>>(
        stream: &Stream<'_>,
        (q, cu, max_q): (&TensorView<'_, f16, 3>, &TensorView<'_, i32, 1>, usize),
        cache: &PagedKvCache<'_, C>,
        o: &mut [f16],
    ) -> fused_attn::Result<()> {
        let shape = q.shape();
        let mut o = TensorViewMut::host(o, shape).unwrap();
        paged_prefill(stream, q, cu, max_q, cache, &mut o, None, None, &PagedPrefillOptions::default()).map(|_| ())
    }
    let args = (&q, &cu, c.max_seqlen_q());
    let e = call(&stream, args, &cache(), &mut o).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Shape, "FP8 cache without scales: {e}");
    let per_tensor = KvScales::per_tensor(&stream, 0.5, 0.5).unwrap();
    let cache16 = s.host_cache().unwrap().with_scales(&per_tensor).unwrap();
    let e = call(&stream, args, &cache16, &mut o).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Unsupported, "scales on a 16-bit cache: {e}");
    // And with its scales the FP8 call works.
    let scales = fp8.scales(&stream).unwrap();
    call(&stream, args, &cache().with_scales(&scales).unwrap(), &mut o).unwrap();
    assert!(o.iter().all(|x| !x.is_nan()));
}
