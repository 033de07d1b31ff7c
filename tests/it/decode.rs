//! Paged decode against the fp64 reference: the emulated sweep (a representative subset of
//! `testkit::cases::decode::decode_sweep`), the full sweep on a GPU (skipped visibly without one), bitwise
//! reproducibility of a fixed plan, strided q/o, and bad input -> typed errors.
use crate::common;

use fused_attn::decode::{DecodeOptions, DecodeWorkspace};
use fused_attn::plan::DecodePlan;
use fused_attn::reference::{Arith, Variants};
use fused_attn::testkit::cases::decode::{
    check_case_emulated, check_case_gpu, check_inputs_emulated, decode_head_dim_sweep, decode_large_head_dim_sweep,
    decode_on_host, decode_sweep, decode_sweep_emulated, CaseOutcome, DecodeCase, DecodeInputs, PagedFixture,
};
use fused_attn::{decode, DType, Element, Emulator, ErrorKind, PagedKvCache, Stream, TensorView, TensorViewMut};
use half::bf16;

/// Decodes the fixture with NaN-poisoned outputs; `lse_stride` lays the LSE out with a padded batch stride.
fn run_decode<T: Element>(
    stream: &Stream<'_>,
    f: &PagedFixture<T>,
    opts: Option<DecodeOptions>,
) -> (Vec<T>, Vec<f32>, DecodePlan) {
    let c = &f.case;
    let (b, hq, d) = (c.batch(), c.heads_q, c.head_dim);
    let opts = opts.unwrap_or(DecodeOptions { scale: None, num_splits: c.num_splits, ..Default::default() });
    let cache = f.host_cache().unwrap();
    let q = TensorView::host(&f.q, [b, hq, d]).unwrap();
    let mut o = vec![T::nan(); b * hq * d];
    let mut lse = vec![f32::NAN; b * hq];
    let probe = DecodeWorkspace::new(stream, 0, 0).unwrap();
    let problem =
        fused_attn::decode::check_decode_args(&q, &cache, &TensorViewMut::host(&mut o, [b, hq, d]).unwrap(), None)
            .unwrap();
    let plan = probe.plan(&problem, &opts).unwrap();
    let mut ws = DecodeWorkspace::for_plan(stream, &plan).unwrap();
    let mut o_view = TensorViewMut::host(&mut o, [b, hq, d]).unwrap();
    let mut lse_view = TensorViewMut::host(&mut lse, [b, hq]).unwrap();
    let used = decode(stream, &q, &cache, &mut o_view, Some(&mut lse_view), &mut ws, &opts).unwrap();
    assert_eq!(used, plan);
    (o, lse, plan)
}

/// Seed of case i (from the run's base seed: FA_SEED or the fixed default).
fn seed_for(i: usize) -> u64 {
    common::case_seed(i)
}

/// Checks the selected cases (FA_CASE: positions in `cases`) in order with `check_case`, each on the seed of
/// its sweep index plus `seed_base`, and fails listing every failure with its rerun command.
fn check_sweep(
    test: &str,
    cases: &[(usize, DecodeCase)],
    seed_base: usize,
    check_case: impl Fn(&DecodeCase, u64) -> fused_attn::Result<CaseOutcome> + Sync,
) {
    common::sweep_in_order("decode", test, cases, DecodeCase::label, |i, case| {
        let outcome = check_case(case, seed_for(seed_base + i)).unwrap();
        (outcome.passed(), outcome.summary())
    });
}

/// Checks every `part`-th case of the emulated sweep starting at `first` (the sweep is split over tests so
/// they run in parallel).
fn emulated_sweep_part(test: &str, first: usize, part: usize) {
    let emu = Emulator::new();
    let cases: Vec<(usize, DecodeCase)> =
        decode_sweep_emulated().into_iter().enumerate().skip(first).step_by(part).collect();
    check_sweep(test, &cases, 0, |c, seed| check_case_emulated(&emu, c, seed));
}

/// Every head dim of `testkit::cases::decode::decode_head_dim_sweep` (issue 12: widths 64/128/256 serving the dims
/// below them with predicated columns) on tight q, o, cache and split partials.
#[test]
fn emulated_head_dim_sweep() {
    let emu = Emulator::new();
    let cases: Vec<(usize, DecodeCase)> = decode_head_dim_sweep().into_iter().enumerate().collect();
    check_sweep("emulated_head_dim_sweep", &cases, 9000, |c, seed| check_case_emulated(&emu, c, seed));
}

/// Head dims 264-512 (issue 27: the width 512, whose D-split warps each compute a quarter of S and sum
/// the quarters through shared memory): `testkit::cases::decode::decode_large_head_dim_sweep`, 16-bit and
/// FP8 caches, every score variant, RoPE, forced and planned splits, on tight buffers.
#[test]
fn emulated_large_head_dim_sweep() {
    let emu = Emulator::new();
    let cases: Vec<(usize, DecodeCase)> = decode_large_head_dim_sweep().into_iter().enumerate().collect();
    check_sweep("emulated_large_head_dim_sweep", &cases, 9500, |c, seed| check_case_emulated(&emu, c, seed));
}

#[test]
fn emulated_decode_sweep_even() {
    emulated_sweep_part("emulated_decode_sweep_even", 0, 2);
}

#[test]
fn emulated_decode_sweep_odd() {
    emulated_sweep_part("emulated_decode_sweep_odd", 1, 2);
}

/// The layouts and value ranges engines use, each against the reference under the tolerance rule and the
/// arithmetic bound: head-major pages ([num_pages, Hkv, page_size, D] through strides), K and V interleaved
/// per page in one allocation, q/o as head slices of packed tensors, scales 0.01 / 1 / 3, and large
/// magnitudes (|q|, |k| up to 8 at scale 3: a softmax sharp enough that the naive rule allows ~0.1).
fn layout_cases() -> Vec<(DecodeCase, DecodeInputs)> {
    use fused_attn::testkit::cases::decode::CacheLayout::*;
    let case = |dtype, head_dim, heads: (usize, usize), page_size, num_splits| {
        DecodeCase::new(dtype, head_dim, heads, page_size, &[0, 1, 17, 300, 1029], num_splits)
    };
    let inputs =
        |cache_layout, scale, magnitude, strided_q_o| DecodeInputs { scale, magnitude, cache_layout, strided_q_o };
    vec![
        (case(DType::Bf16, 128, (8, 2), 16, Some(3)), inputs(HeadMajor, None, 2.0, false)),
        (case(DType::F16, 64, (4, 4), 1, Some(2)), inputs(HeadMajor, Some(1.0), 2.0, true)),
        (case(DType::F16, 128, (16, 2), 64, None), inputs(Interleaved, None, 2.0, false)),
        (case(DType::Bf16, 256, (4, 1), 256, Some(2)), inputs(Interleaved, Some(0.01), 2.0, true)),
        (case(DType::Bf16, 128, (8, 2), 16, Some(2)), inputs(TokenMajor, Some(3.0), 8.0, true)),
        (case(DType::F16, 64, (8, 1), 8, Some(3)), inputs(HeadMajor, Some(3.0), 8.0, false)),
        (case(DType::Bf16, 64, (20, 1), 16, Some(1)), inputs(Interleaved, Some(3.0), 4.0, false)),
        (case(DType::F16, 256, (4, 2), 16, None), inputs(TokenMajor, Some(1.0), 8.0, false)),
    ]
}

#[test]
fn emulated_layouts_scales_and_magnitudes() {
    let emu = Emulator::new();
    let cases = layout_cases();
    common::sweep(
        "decode",
        "emulated_layouts_scales_and_magnitudes",
        &cases,
        1,
        |(c, inp)| format!("{} {}", c.label(), inp.label()),
        |i, (case, inputs)| {
            let outcome = check_inputs_emulated(&emu, case, inputs, seed_for(1000 + i)).unwrap();
            common::verdict(
                outcome.passed(),
                format!(
                    "{} (naive/bound {:.1})",
                    outcome.summary(),
                    outcome.out.naive_max_abs_err / (outcome.out.max_abs_err / outcome.out.bound_ratio)
                ),
            )
        },
    );
}

/// Every case of `cases` on the GPU (skipped visibly without one), seeds from `seed_base` on.
fn gpu_sweep(test: &str, cases: Vec<DecodeCase>, seed_base: usize) {
    let Some(ctx) = common::gpu_or_skip(&format!("decode::{test}")) else { return };
    let cu = ctx.default_stream();
    let cases: Vec<(usize, DecodeCase)> = cases.into_iter().enumerate().collect();
    check_sweep(test, &cases, seed_base, |c, seed| check_case_gpu(&cu, c, seed));
}

#[test]
fn gpu_decode_sweep() {
    gpu_sweep("gpu_decode_sweep", decode_sweep(), 0);
}

#[test]
fn gpu_head_dim_sweep() {
    gpu_sweep("gpu_head_dim_sweep", decode_head_dim_sweep(), 9000);
}

#[test]
fn gpu_large_head_dim_sweep() {
    gpu_sweep("gpu_large_head_dim_sweep", decode_large_head_dim_sweep(), 9500);
}

/// Bandwidth of the performance shapes (printed; the bars are judged in the report, not asserted
/// here, since a shared or throttled GPU would make the test flaky).
#[test]
fn gpu_decode_bandwidth() {
    let Some(cu) = common::gpu_stream_or_skip("decode::gpu_decode_bandwidth") else { return };
    let rows = fused_attn::testkit::cases::decode::perf_report(&cu, seed_for(0)).unwrap();
    assert!(!rows.is_empty(), "no bandwidth rows");
    for row in rows {
        // Sanity, not a performance bar: a positive time, and no more bytes per second than the copy
        // ceiling allows (with slack for L2 hits), else the byte accounting or the timing is wrong.
        assert!(row.timing.timing.median_ms > 0.0 && row.copy_gbps > 0.0, "{row:?}");
        assert!(row.ratio.is_finite() && row.ratio < 1.5, "{:.0}% of copy bandwidth is implausible", 100.0 * row.ratio);
        eprintln!(
            "{}: {:.1} us, {:.0} GB/s = {:.0}% of copy bandwidth ({:.0} GB/s), plan {:?}",
            row.case.label().split(" lens=").next().unwrap(),
            row.timing.timing.median_ms * 1e3,
            row.timing.gbps,
            100.0 * row.ratio,
            row.copy_gbps,
            row.timing.plan
        );
    }
}

fn small_case(num_splits: Option<usize>) -> DecodeCase {
    DecodeCase::new(DType::Bf16, 128, (8, 2), 16, &[300, 0, 77, 1029], num_splits)
}

/// The bf16 fixture of [`small_case`] on the seed of case `index`.
fn small_fixture(num_splits: Option<usize>, index: usize) -> PagedFixture<bf16> {
    PagedFixture::new(&small_case(num_splits), seed_for(index)).unwrap()
}

#[test]
fn fixed_plan_is_bitwise_reproducible() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let f = small_fixture(Some(3), 0);
    let (o1, l1, p1) = run_decode(&stream, &f, None);
    let (o2, l2, p2) = run_decode(&stream, &f, None);
    assert_eq!(p1, p2);
    assert_eq!(p1.num_splits(), 3);
    assert!(o1.iter().zip(&o2).all(|(a, b)| a.to_bits() == b.to_bits()));
    assert!(l1.iter().zip(&l2).all(|(a, b)| a.to_bits() == b.to_bits()));
}

#[test]
fn strided_q_and_o_and_no_lse() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let f = small_fixture(Some(2), 1);
    let (b, hq, d) = (f.case.batch(), f.case.heads_q, f.case.head_dim);
    let (want, _, _) = run_decode(&stream, &f, None);
    // q and o as head slices of packed [B, 3*Hq, D] tensors.
    let mut q_packed = vec![bf16::NAN; b * 3 * hq * d];
    for i in 0..b {
        for h in 0..hq {
            let src = &f.q[(i * hq + h) * d..][..d];
            q_packed[(i * 3 * hq + hq + h) * d..][..d].copy_from_slice(src);
        }
    }
    let strides = [(3 * hq * d) as i64, d as i64, 1];
    let q = TensorView::host(&q_packed[hq * d..], [b, hq, d]).unwrap().with_strides(strides).unwrap();
    let mut o_packed = vec![bf16::NAN; b * 3 * hq * d];
    let cache = f.host_cache().unwrap();
    let mut ws = DecodeWorkspace::with_capacity(&stream, b, hq, d, 2).unwrap();
    {
        let mut o =
            TensorViewMut::host(&mut o_packed[2 * hq * d..], [b, hq, d]).unwrap().with_strides(strides).unwrap();
        decode(
            &stream,
            &q,
            &cache,
            &mut o,
            None,
            &mut ws,
            &DecodeOptions { scale: None, num_splits: Some(2), ..Default::default() },
        )
        .unwrap();
    }
    for i in 0..b {
        for h in 0..hq {
            let got = &o_packed[(i * 3 * hq + 2 * hq + h) * d..][..d];
            let exp = &want[(i * hq + h) * d..][..d];
            assert!(got.iter().zip(exp).all(|(a, b)| a.to_bits() == b.to_bits()), "row {i},{h}");
        }
    }
    // Untouched neighbours stay NaN.
    assert!(o_packed[..2 * hq * d].iter().all(|x| x.is_nan()));
}

#[test]
fn bad_inputs_are_typed_errors() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let (b, hq, hkv, d, ps, pages, width) = (2usize, 8usize, 2usize, 64usize, 16usize, 4usize, 2usize);
    let kv = vec![bf16::ZERO; pages * ps * hkv * d];
    let table = vec![0i32; b * width];
    let lens = vec![0i32; b];
    let cache_with = |max_seq_len: usize| {
        PagedKvCache::new(
            TensorView::host(&kv, [pages, ps, hkv, d]).unwrap(),
            TensorView::host(&kv, [pages, ps, hkv, d]).unwrap(),
            TensorView::host(&table, [b, width]).unwrap(),
            TensorView::host(&lens, [b]).unwrap(),
            max_seq_len,
        )
    };
    // Table too narrow for the promised length.
    assert_eq!(cache_with(33).err().unwrap().kind(), &ErrorKind::Shape);
    let cache = cache_with(32).unwrap();
    // Page size 0 (any size >= 1 is taken: tests/it/page_sizes.rs).
    let kv0: Vec<bf16> = Vec::new();
    let e = PagedKvCache::new(
        TensorView::host(&kv0, [2, 0, hkv, d]).unwrap(),
        TensorView::host(&kv0, [2, 0, hkv, d]).unwrap(),
        TensorView::host(&table, [b, width]).unwrap(),
        TensorView::host(&lens, [b]).unwrap(),
        1,
    )
    .err()
    .unwrap();
    assert_eq!(e.kind(), &ErrorKind::Unsupported);

    let mut ws = DecodeWorkspace::new(&stream, 0, 0).unwrap();
    let opts = DecodeOptions::default();
    let run = |hq: usize, dq: usize, ob: usize, ws: &mut DecodeWorkspace, opts: &DecodeOptions| {
        let qd = vec![bf16::ZERO; b * hq * dq];
        let mut od = vec![bf16::ZERO; ob * hq * dq];
        let q = TensorView::host(&qd, [b, hq, dq]).unwrap();
        let mut o = TensorViewMut::host(&mut od, [ob, hq, dq]).unwrap();
        decode(&stream, &q, &cache, &mut o, None, ws, opts).err().map(|e| (e.kind().clone(), e.message().to_string()))
    };
    assert_eq!(run(hq, d, b, &mut ws, &opts), None);
    // Hq % Hkv != 0.
    assert_eq!(run(7, d, b, &mut ws, &opts).unwrap().0, ErrorKind::Shape);
    // Head dims 100, 24, 520 (and a q/cache head-dim mismatch); the error names decode's own range.
    for dq in [100, 24, 520] {
        let (kind, msg) = run(hq, dq, b, &mut ws, &opts).unwrap();
        assert_eq!(kind, ErrorKind::Unsupported, "D = {dq}");
        assert!(msg.contains("decode supports multiples of 8 from 32 to 512"), "{msg}");
    }
    assert_eq!(run(hq, 512, b, &mut ws, &opts).unwrap().0, ErrorKind::Shape);
    assert_eq!(run(hq, 128, b, &mut ws, &opts).unwrap().0, ErrorKind::Shape);
    // o of the wrong batch.
    let (kind, msg) = run(hq, d, b + 1, &mut ws, &opts).unwrap();
    assert_eq!(kind, ErrorKind::Shape);
    assert!(msg.starts_with("o:"), "{msg}");
    // Forced splits without a workspace.
    let split = DecodeOptions { scale: None, num_splits: Some(2), ..Default::default() };
    assert_eq!(run(hq, d, b, &mut ws, &split).unwrap().0, ErrorKind::OutOfBounds);
    // Misaligned q rows: a batch stride of Hq*D + 4 elements (8 bytes past a 16-byte multiple).
    let qd = vec![bf16::ZERO; b * (hq * d + 4)];
    let q = TensorView::host(&qd, [b, hq, d]).unwrap().with_strides([(hq * d + 4) as i64, d as i64, 1]).unwrap();
    let mut od = vec![bf16::ZERO; b * hq * d];
    let mut o = TensorViewMut::host(&mut od, [b, hq, d]).unwrap();
    let e = decode(&stream, &q, &cache, &mut o, None, &mut ws, &opts).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Alignment);
    assert!(e.message().starts_with("q"), "{}", e.message());
    // lse of the wrong shape.
    let qd = vec![bf16::ZERO; b * hq * d];
    let q = TensorView::host(&qd, [b, hq, d]).unwrap();
    let mut od = vec![bf16::ZERO; b * hq * d];
    let mut o = TensorViewMut::host(&mut od, [b, hq, d]).unwrap();
    let mut ld = vec![0f32; b * hq];
    let mut l = TensorViewMut::host(&mut ld, [hq, b]).unwrap();
    let e = decode(&stream, &q, &cache, &mut o, Some(&mut l), &mut ws, &opts).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Shape);
    assert!(e.message().starts_with("lse"));
}

#[test]
fn empty_batch_is_a_no_op() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let kv = vec![bf16::ZERO; 2 * 16 * 64];
    let (table, lens, q): (Vec<i32>, Vec<i32>, Vec<bf16>) = (vec![], vec![], vec![]);
    let cache = PagedKvCache::new(
        TensorView::host(&kv, [2, 16, 1, 64]).unwrap(),
        TensorView::host(&kv, [2, 16, 1, 64]).unwrap(),
        TensorView::host(&table, [0, 1]).unwrap(),
        TensorView::host(&lens, [0]).unwrap(),
        16,
    )
    .unwrap();
    let mut o: Vec<bf16> = vec![];
    let mut ws = DecodeWorkspace::new(&stream, 0, 0).unwrap();
    let plan = common::decode_host(&stream, [0, 4, 64], &q, &cache, (&mut o, None), &mut ws, &DecodeOptions::default())
        .unwrap();
    assert_eq!(plan.num_splits(), 1);
}

/// seq_lens and block-table entries are device data the host cannot validate: the kernel clamps a length
/// into [0, capacity] and treats the tokens of an out-of-range page id as masked (weight exactly 0, the
/// reference does the same), never faulting (the emulator checks every access against the buffers).
#[test]
fn clamps_device_data_it_cannot_validate() {
    use fused_attn::reference;
    let emu = Emulator::new().with_table_checks(fused_attn::TableChecks::GpuMasking);
    let stream = Stream::Emu(&emu);
    let case = DecodeCase { seq_lens: vec![48, 48, 48], num_splits: Some(2), ..small_case(None) };
    let f = PagedFixture::<bf16>::new(&case, seed_for(3)).unwrap();
    let (b, hq, d, ps) = (case.batch(), case.heads_q, case.head_dim, case.page_size);
    assert_eq!(f.width, 4); // capacity 64 tokens
                            // Kernel view: seq 0 has length -3, seq 1 claims 1000 (clamped to 64; its spare column is pointed at a
                            // real page so the clamped tokens are data), seq 2's second page id is out of range (masked).
    let mut table = f.block_table.clone();
    table[f.width + 3] = table[f.width];
    table[2 * f.width + 1] = 12_345;
    let lens = vec![-3, 1000, 48];
    // Reference view: the same table (the reference masks the bad page too), lengths clamped.
    let to64 = |v: &[bf16]| v.iter().map(|x| x.to_f64()).collect::<Vec<f64>>();
    let (k, v) = (to64(&f.k_cache), to64(&f.v_cache));
    let ref_table = table.clone();
    let ref_lens = vec![0, 64, 48];
    let q = to64(&f.q);
    let scale = 1.0 / (d as f64).sqrt();
    let ref_cache = reference::PagedCache {
        k_cache: &k,
        v_cache: &v,
        num_pages: f.num_pages,
        page_size: ps,
        heads_kv: case.heads_kv,
        head_dim: d,
        head_dim_v: d,
        block_table: &ref_table,
        max_pages_per_seq: f.width,
        seq_lens: &ref_lens,
    };
    let exact = reference::paged_decode(hq, scale, &Variants::default(), Arith::F64, &q, &ref_cache).unwrap();
    let naive =
        reference::paged_decode(hq, scale, &Variants::default(), Arith::Lowp(DType::Bf16), &q, &ref_cache).unwrap().out;

    let cache = PagedKvCache::new(
        TensorView::host(&f.k_cache, f.cache_shape()).unwrap(),
        TensorView::host(&f.v_cache, f.cache_shape()).unwrap(),
        TensorView::host(&table, [b, f.width]).unwrap(),
        TensorView::host(&lens, [b]).unwrap(),
        48,
    )
    .unwrap();
    let mut ws = DecodeWorkspace::with_capacity(&stream, b, hq, d, 2).unwrap();
    let (o, lse, _) = decode_on_host(
        &stream,
        &TensorView::host(&f.q, [b, hq, d]).unwrap(),
        &cache,
        &mut ws,
        &DecodeOptions { scale: None, num_splits: Some(2), ..Default::default() },
    )
    .unwrap();
    let bound = exact.out_bound(Some(DType::Bf16), Some(DType::Bf16));
    let cmp = reference::compare_bounded(&to64(&o), &exact.out, &naive, &bound);
    let rerun = common::rerun("decode", "clamps_device_data_it_cannot_validate", None);
    assert!(cmp.passed, "{cmp:?}; {rerun}");
    let lse64: Vec<f64> = lse.iter().map(|&x| x as f64).collect();
    let lse_cmp = reference::compare_lse(&lse64, &exact.lse, 1e-3);
    assert!(lse_cmp.passed, "{lse_cmp:?}; {rerun}");
}

/// Out-of-range page ids inside [0, seq_len) are masked keys (weight exactly 0), for every split choice and
/// page size: the kernel matches the reference (which leaves those tokens out) under the tolerance rule and
/// the arithmetic bound, and is far from the old behaviour (zero keys, score 0, diluting the softmax).
/// `PagedKvCache::validate` names the first bad entry.
#[test]
fn out_of_range_page_ids_are_masked_keys() {
    use fused_attn::reference;
    let emu = Emulator::new().with_table_checks(fused_attn::TableChecks::GpuMasking);
    let stream = Stream::Emu(&emu);
    let test = "out_of_range_page_ids_are_masked_keys";
    for (i, (ps, splits)) in
        [(16usize, Some(1usize)), (16, Some(2)), (1, Some(3)), (64, None), (256, Some(2))].into_iter().enumerate()
    {
        let case =
            DecodeCase { page_size: ps, seq_lens: vec![700, 300, 40, 1029], num_splits: splits, ..small_case(None) };
        let seed = seed_for(2000 + i);
        let f = PagedFixture::<bf16>::new(&case, seed).unwrap();
        let (b, hq, d) = (case.batch(), case.heads_q, case.head_dim);
        // Seq 0: bad pages (negative ids) covering >= 64 tokens in the middle; seq 1: its first pages past
        // the end; seq 2: every page bad (an empty row: O = 0, LSE = -inf); seq 3 untouched.
        let mut table = f.block_table.clone();
        let w = f.width;
        let run = 64usize.div_ceil(ps);
        for p in 0..run {
            table[(700 / ps) / 2 + p] = -7;
            table[w + p] = f.num_pages as i32 + 5;
        }
        for p in 0..40usize.div_ceil(ps) {
            table[2 * w + p] = i32::MAX;
        }
        let (o, lse, _) = {
            let mut g = f.clone();
            g.block_table = table.clone();
            run_decode(&stream, &g, None)
        };
        let to64 = |v: &[bf16]| v.iter().map(|x| x.to_f64()).collect::<Vec<f64>>();
        let (q, k, v) = (to64(&f.q), to64(&f.k_cache), to64(&f.v_cache));
        let scale = 1.0 / (d as f64).sqrt();
        let cache = |ar: Arith, table: &'_ [i32], k: &'_ [f64], v: &'_ [f64], num_pages: usize| {
            let cache = reference::PagedCache {
                k_cache: k,
                v_cache: v,
                num_pages,
                page_size: ps,
                heads_kv: case.heads_kv,
                head_dim: d,
                head_dim_v: d,
                block_table: table,
                max_pages_per_seq: w,
                seq_lens: &f.seq_lens,
            };
            reference::paged_decode(hq, scale, &Variants::default(), ar, &q, &cache).unwrap()
        };
        let exact = cache(Arith::F64, &table, &k, &v, f.num_pages);
        let naive = cache(Arith::Lowp(DType::Bf16), &table, &k, &v, f.num_pages).out;
        let bound = exact.out_bound(Some(DType::Bf16), Some(DType::Bf16));
        let cmp = reference::compare_bounded(&to64(&o), &exact.out, &naive, &bound);
        let ctx = format!("page {ps} splits {splits:?} seed {seed:#x}; {}", common::rerun("decode", test, None));
        assert!(cmp.passed, "{ctx}: {cmp:?}");
        let lse64: Vec<f64> = lse.iter().map(|&x| x as f64).collect();
        let lse_cmp = reference::compare_lse(&lse64, &exact.lse, 1e-3);
        assert!(lse_cmp.passed, "{ctx}: lse {lse_cmp:?}");
        assert!(lse[2 * hq..3 * hq].iter().all(|&x| x == f32::NEG_INFINITY), "{ctx}: all-bad sequence not empty");
        assert!(o[2 * hq * d..3 * hq * d].iter().all(|x| x.to_f64() == 0.0), "{ctx}: all-bad sequence not 0");
        // The old behaviour (bad pages read as zero keys and values) is far outside the bound.
        let zero_page = f.num_pages as i32;
        let zeroed: Vec<i32> =
            table.iter().map(|&p| if p < 0 || p >= f.num_pages as i32 { zero_page } else { p }).collect();
        let page_len = ps * case.heads_kv * d;
        let (mut kz, mut vz) = (k.clone(), v.clone());
        kz.extend(std::iter::repeat_n(0.0, page_len));
        vz.extend(std::iter::repeat_n(0.0, page_len));
        let diluted = cache(Arith::F64, &zeroed, &kz, &vz, f.num_pages + 1);
        let old = reference::compare_within(&diluted.out, &exact.out, &bound);
        assert!(old.bound_ratio > 1.5, "{ctx}: zero keys would pass too ({:.2})", old.bound_ratio);
        assert!(diluted.lse[2 * hq].is_finite(), "{ctx}: zero keys make the all-bad sequence non-empty");
        // validate() names the first bad entry.
        let bad = PagedKvCache::new(
            TensorView::host(&f.k_cache, f.cache_shape()).unwrap(),
            TensorView::host(&f.v_cache, f.cache_shape()).unwrap(),
            TensorView::host(&table, [b, w]).unwrap(),
            TensorView::host(&f.seq_lens, [b]).unwrap(),
            case.max_seq_len(),
        )
        .unwrap();
        let e = bad.validate(&stream).unwrap_err();
        assert_eq!(e.kind(), &ErrorKind::OutOfBounds, "{ctx}: {e}");
        assert!(e.message().contains(&format!("block_table[0][{}] = -7", (700 / ps) / 2)), "{ctx}: {e}");
    }
}

/// The opt-in validation of engine-owned tables: a good fixture passes; a length above max_seq_len, a bad
/// page id, bad cu_seqlens and bad slot mappings are typed errors naming the first bad entry.
#[test]
fn validate_reports_the_first_bad_entry() {
    use fused_attn::paged::{validate_cu_seqlens, validate_slot_mapping};
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let f = small_fixture(Some(2), 4);
    let case = &f.case;
    let (b, w) = (case.batch(), f.width);
    let cache = |table: &'_ [i32], lens: &'_ [i32]| {
        PagedKvCache::new(
            TensorView::host(&f.k_cache, f.cache_shape()).unwrap(),
            TensorView::host(&f.v_cache, f.cache_shape()).unwrap(),
            TensorView::host(table, [b, w]).unwrap(),
            TensorView::host(lens, [b]).unwrap(),
            case.max_seq_len(),
        )
        .unwrap()
        .validate(&stream)
    };
    assert!(cache(&f.block_table, &f.seq_lens).is_ok());
    // Columns past a sequence's pages are not used: anything goes there.
    let mut table = f.block_table.clone();
    table[w - 1] = -1;
    assert!(cache(&table, &f.seq_lens).is_ok());
    let mut lens = f.seq_lens.clone();
    lens[2] = case.max_seq_len() as i32 + 1;
    let e = cache(&f.block_table, &lens).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Shape);
    assert!(e.message().contains("seq_lens[2]"), "{e}");
    lens[2] = -1;
    assert!(cache(&f.block_table, &lens).unwrap_err().message().contains("seq_lens[2] = -1"));
    let mut table = f.block_table.clone();
    table[3 * w + 40] = 99_999; // sequence 3 (1029 tokens) uses 65 pages of 16
    table[3 * w + 50] = -2;
    let e = cache(&table, &f.seq_lens).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::OutOfBounds);
    assert!(e.message().contains("block_table[3][40] = 99999 (tokens 640..656 of sequence 3)"), "{e}");

    let cu = |v: &[i32], total: usize, max: usize| {
        validate_cu_seqlens(&stream, &TensorView::host(v, [v.len()]).unwrap(), total, max)
    };
    assert!(cu(&[0, 5, 5, 12], 12, 7).is_ok());
    for (bad, what) in
        [(&[1, 5][..], "cu_seqlens[0] = 1"), (&[0, 5, 4], "cu_seqlens[2] = 4"), (&[0, 13], "cu_seqlens[1] = 13")]
    {
        let e = cu(bad, 12, 20).unwrap_err();
        assert_eq!(e.kind(), &ErrorKind::Shape);
        assert!(e.message().contains(what), "{e}");
    }
    assert!(cu(&[0, 8], 12, 7).unwrap_err().message().contains("length 8"));

    let geometry = PagedKvCache::new(
        TensorView::host(&f.k_cache, f.cache_shape()).unwrap(),
        TensorView::host(&f.v_cache, f.cache_shape()).unwrap(),
        TensorView::host(&f.block_table, [b, w]).unwrap(),
        TensorView::host(&f.seq_lens, [b]).unwrap(),
        case.max_seq_len(),
    )
    .unwrap()
    .geometry();
    let slots = |v: &[i64]| validate_slot_mapping(&stream, &TensorView::host(v, [v.len()]).unwrap(), &geometry);
    let capacity = (f.num_pages * case.page_size) as i64;
    assert!(slots(&[0, 5, -1, capacity - 1, -1]).is_ok());
    let e = slots(&[0, 5, capacity, 7]).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::OutOfBounds);
    assert!(e.message().contains(&format!("slot_mapping[2] = {capacity}")), "{e}");
    let e = slots(&[0, 5, 9, 5]).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Shape);
    assert!(e.message().contains("slot_mapping[3] = 5 repeats slot_mapping[1]"), "{e}");
}

/// The emulator checks engine-owned tables before every launch by default (`TableChecks::Strict`): each bad
/// table is a typed error naming its entry and nothing runs (the NaN-poisoned output stays NaN); with
/// `TableChecks::GpuMasking` the same launches run with the GPU's masking semantics.
#[test]
fn the_emulator_rejects_bad_tables_by_default() {
    use fused_attn::testkit::cases::paged_prefill::{case as paged_case, PagedPrefillFixture};
    use fused_attn::{append, PagedKvCacheMut, TableChecks};
    let strict = Emulator::new();
    let masking = Emulator::new().with_table_checks(TableChecks::GpuMasking);
    assert_eq!(strict.table_checks(), TableChecks::Strict);
    let f = small_fixture(Some(2), 5);
    let c = &f.case;
    let (b, hq, d, w) = (c.batch(), c.heads_q, c.head_dim, f.width);
    let run = |emu: &Emulator, table: &[i32], lens: &[i32]| {
        let stream = Stream::Emu(emu);
        let cache = PagedKvCache::new(
            TensorView::host(&f.k_cache, f.cache_shape()).unwrap(),
            TensorView::host(&f.v_cache, f.cache_shape()).unwrap(),
            TensorView::host(table, [b, w]).unwrap(),
            TensorView::host(lens, [b]).unwrap(),
            c.max_seq_len(),
        )
        .unwrap();
        let mut o = vec![bf16::NAN; b * hq * d];
        let mut ws = DecodeWorkspace::with_capacity(&stream, b, hq, d, 2).unwrap();
        let opts = DecodeOptions { num_splits: Some(2), ..Default::default() };
        let r = common::decode_host(&stream, [b, hq, d], &f.q, &cache, (&mut o, None), &mut ws, &opts);
        (r.map(|_| ()), o)
    };
    assert!(run(&strict, &f.block_table, &f.seq_lens).0.is_ok());
    // (table, lens, kind, the entry the message names)
    let mut hole = f.block_table.clone();
    hole[3 * w + 10] = -1; // sequence 3 (1029 tokens) uses 65 pages of 16
    let mut past = f.block_table.clone();
    past[2 * w + 4] = f.num_pages as i32; // sequence 2 (77 tokens): its fifth page, tokens 64..77
    let mut unused = f.block_table.clone();
    unused[2 * w + 5] = -1; // past sequence 2's 5 pages: not checked
    let (mut negative, mut long) = (f.seq_lens.clone(), f.seq_lens.clone());
    negative[1] = -4;
    long[0] = c.max_seq_len() as i32 + 1;
    let bad: [(&[i32], &[i32], ErrorKind, String); 4] = [
        (&hole, &f.seq_lens, ErrorKind::OutOfBounds, "block_table[3][10] = -1 (tokens 160..176 of sequence 3)".into()),
        (&past, &f.seq_lens, ErrorKind::OutOfBounds, format!("block_table[2][4] = {} (tokens 64..77", f.num_pages)),
        (&f.block_table, &negative, ErrorKind::Shape, "seq_lens[1] = -4 is outside 0..=1029".into()),
        (&f.block_table, &long, ErrorKind::Shape, "seq_lens[0] = 1030 is outside 0..=1029".into()),
    ];
    for (table, lens, kind, entry) in &bad {
        let (r, o) = run(&strict, table, lens);
        let e = r.unwrap_err();
        assert_eq!(e.kind(), kind, "{e}");
        assert!(e.message().contains(entry.as_str()), "{e}");
        assert!(o.iter().all(|x| x.is_nan()), "{entry}: the launch ran");
        let (r, o) = run(&masking, table, lens);
        assert!(r.is_ok() && o.iter().all(|x| !x.is_nan()), "GpuMasking: {entry}: {r:?}");
    }
    assert!(run(&strict, &unused, &f.seq_lens).0.is_ok());

    // Paged prefill: the same check of its cache.
    let pc = paged_case(64, (4, 2), 16, &[(5, 40), (3, 70)]);
    let mut pf = PagedPrefillFixture::<bf16>::new(&pc, seed_for(6));
    pf.block_table[pf.width + 4] = 1 << 20; // sequence 1, tokens 64..70
    let e = pf.run(&Stream::Emu(&strict), Some(1)).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::OutOfBounds, "{e}");
    assert!(e.message().contains("block_table[1][4] = 1048576 (tokens 64..70 of sequence 1)"), "{e}");
    assert!(pf.run(&Stream::Emu(&masking), Some(1)).is_ok());

    // Append: a slot past the pool, a slot written twice.
    let (pages, ps, hkv, hd) = (4, 8, 2, 64);
    let kv = vec![bf16::ONE; 3 * hkv * hd];
    let try_append = |emu: &Emulator, slots: &[i64]| {
        let (mut kc, mut vc) = (vec![bf16::NAN; pages * ps * hkv * hd], vec![bf16::NAN; pages * ps * hkv * hd]);
        let mut cache = PagedKvCacheMut::new(
            TensorViewMut::host(&mut kc, [pages, ps, hkv, hd]).unwrap(),
            TensorViewMut::host(&mut vc, [pages, ps, hkv, hd]).unwrap(),
        )
        .unwrap();
        let view = TensorView::host(&kv, [3, hkv, hd]).unwrap();
        let r = append(&Stream::Emu(emu), &view, &view, &TensorView::host(slots, [3]).unwrap(), &mut cache);
        (r, kc.iter().any(|x| !x.is_nan()))
    };
    assert!(try_append(&strict, &[0, -1, 31]).0.is_ok());
    for (slots, kind, entry) in [
        ([0i64, 32, 5], ErrorKind::OutOfBounds, "slot_mapping[1] = 32 is outside 0..32"),
        ([7, 3, 7], ErrorKind::Shape, "slot_mapping[2] = 7 repeats slot_mapping[0]"),
    ] {
        let (r, wrote) = try_append(&strict, &slots);
        let e = r.unwrap_err();
        assert_eq!(e.kind(), &kind, "{e}");
        assert!(e.message().contains(entry), "{e}");
        assert!(!wrote, "{entry}: the launch ran");
        assert!(try_append(&masking, &slots).0.is_ok(), "GpuMasking: {entry}");
    }
}
