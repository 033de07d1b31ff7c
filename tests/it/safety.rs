//! Issue 46, "safe means safe": what a safe call (or a CUDA graph replay of one) can make a kernel touch, on
//! the emulator, whose region checks fault on any access outside the buffers a launch was given
//! (docs/emulator.md). The compile-time findings (sealed element traits, plans the crate made) are
//! `compile_fail` doctests on the items themselves (src/dtype.rs, src/merge.rs, src/plan.rs).
use fused_attn::append::{append_with, AppendOptions};
use fused_attn::decode::{replay_scheduled, DecodeOptions, DecodeWorkspace};
use fused_attn::plan::{DecodePlan, DecodeProblem};
use fused_attn::testkit::cases::decode::{evaluate, DecodeCase, PagedFixture};
use fused_attn::{
    merge_states, mla_append, DType, Emulator, ErrorKind, KvScales, MlaAppendOptions, MlaDims, MlaPlan,
    PagedKvCacheMut, Rope, RopeConfig, RopeStyle, SplitPolicy, Stream, TensorView, TensorViewMut,
};
use half::bf16;

/// A CUDA graph captured from a scheduled decode of B0 = 2 sequences and replayed after `prepare` for 4
/// (within the workspace's limit of 16, so `prepare` accepts it): the table then names merge rows 2 and 3 and units of
/// sequences 2 and 3, which the launch (the captured one: o has 2 rows) has no output for. The kernels skip
/// them; the launch writes o's 2 rows only, each its own sequence's attention over its device seq_len (the
/// units of sequences 0 and 1 are the new schedule's, which covers each sequence whole). Before the merge
/// bounded its rows (merge.cu: out_rows), the emulator faulted on the store of row 2 past o.
#[test]
fn graph_replay_after_prepare_for_more_rows_writes_only_its_output() {
    let seed = 0x46_0003;
    let (hq, hkv, d) = (8, 2, 64);
    let case = DecodeCase::new(DType::Bf16, d, (hq, hkv), 16, &[600, 1000], None);
    let f = PagedFixture::<bf16>::new(&case, seed).unwrap();
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let limits = DecodeProblem { batch: 16, heads_q: hq, heads_kv: hkv, head_dim: d, max_seq_len: 1024 };
    // 64 CTA slots for 4 x 2 (sequence, KV head) pairs: each of the 4 sequences is cut into several units, so the merge has a row per sequence.
    let mut ws = DecodeWorkspace::scheduled_on(&stream, &limits, SplitPolicy::Balanced, 64).unwrap();
    let opts = DecodeOptions::default();
    let schedule = ws.prepare(&stream, &[1000; 4], &opts).unwrap().clone();
    assert!(
        schedule.merge_rows.iter().any(|r| r.out_row >= 2),
        "the table must name rows past the output: {:?}",
        schedule.merge_rows
    );

    // o and lse: the captured call's 2 rows at the front of 16 rows of NaN; the views hold the 2 rows only.
    let (rows, captured) = (16, case.batch());
    let mut o_buf = vec![bf16::NAN; rows * hq * d];
    let mut lse_buf = vec![f32::NAN; rows * hq];
    let cache = f.host_cache().unwrap();
    let q = TensorView::host(&f.q, [captured, hq, d]).unwrap();
    {
        let mut o = TensorViewMut::host(&mut o_buf[..captured * hq * d], [captured, hq, d]).unwrap();
        let mut lse = TensorViewMut::host(&mut lse_buf[..captured * hq], [captured, hq]).unwrap();
        let r = replay_scheduled(&stream, &q, &cache, &mut o, Some(&mut lse), &mut ws, &opts);
        assert!(r.is_ok(), "the replay touched memory outside its buffers: {:?}", r.err());
    }
    assert!(o_buf[captured * hq * d..].iter().all(|x| x.is_nan()), "rows past the output were written");
    assert!(lse_buf[captured * hq..].iter().all(|x| x.is_nan()), "LSE rows past the output were written");
    let plan = DecodePlan::new(&case.problem(), 132, None).unwrap();
    let outcome = evaluate(&f, seed, plan, &o_buf[..captured * hq * d], &lse_buf[..captured * hq]).unwrap();
    assert!(outcome.passed(), "rows 0..2 against the reference: {}", outcome.summary());
}

/// `(kind, message)` of a result's error, for one-line asserts.
fn err<T>(r: fused_attn::Result<T>) -> (ErrorKind, String) {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => (e.kind().clone(), e.message().to_string()),
    }
}

/// B1: a cache append writes must not alias (a page or head stride of 0 makes distinct slots one address, a
/// silent write race): `Layout`, naming the cache, when the cache is built. Before, both were accepted
/// (and append raced on the GPU, silently on the emulator).
#[test]
fn append_caches_must_be_disjoint() {
    let (pages, ps, hkv, d) = (4, 8, 2, 64);
    let (mut kc, mut vc) = (vec![bf16::ZERO; pages * ps * hkv * d], vec![bf16::ZERO; pages * ps * hkv * d]);
    let aliased = [[0, (hkv * d) as i64, d as i64, 1], [(ps * hkv * d) as i64, (hkv * d) as i64, 0, 1]];
    for strides in aliased {
        let k = TensorViewMut::host(&mut kc, [pages, ps, hkv, d]).unwrap().with_strides(strides).unwrap();
        let v = TensorViewMut::host(&mut vc, [pages, ps, hkv, d]).unwrap();
        let (kind, msg) = err(PagedKvCacheMut::new(k, v));
        assert_eq!(kind, ErrorKind::Layout, "{strides:?}: {msg}");
        assert!(msg.starts_with("k_cache:"), "{msg}");
        let k = TensorViewMut::host(&mut kc, [pages, ps, hkv, d]).unwrap();
        let v = TensorViewMut::host(&mut vc, [pages, ps, hkv, d]).unwrap().with_strides(strides).unwrap();
        let (kind, msg) = err(PagedKvCacheMut::new(k, v));
        assert_eq!(kind, ErrorKind::Layout, "{strides:?}: {msg}");
        assert!(msg.starts_with("v_cache:"), "{msg}");
    }
    // The latent cache of mla_append likewise (one head: a page stride of 0 aliases the pages).
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let (n, rank, rope) = (2, 512, 64);
    let latent = vec![bf16::ONE; n * rank];
    let k_pe = vec![bf16::ONE; n * rope];
    let slots = [0i64, 9];
    let mut cache = vec![bf16::NAN; pages * ps * (rank + rope)];
    let mut view = TensorViewMut::host(&mut cache, [pages, ps, 1, rank + rope])
        .unwrap()
        .with_strides([0, (rank + rope) as i64, (rank + rope) as i64, 1])
        .unwrap();
    let opts = MlaAppendOptions { dims: MlaDims { kv_lora_rank: rank, rope_dim: rope }, rope: None, scale: None };
    let (kind, msg) = err(mla_append(
        &stream,
        &TensorView::host(&latent, [n, rank]).unwrap(),
        &TensorView::host(&k_pe, [n, rope]).unwrap(),
        &TensorView::host(&slots, [n]).unwrap(),
        &mut view,
        &opts,
    ));
    assert_eq!(kind, ErrorKind::Layout, "{msg}");
    assert!(msg.starts_with("latent_cache:"), "{msg}");
}

/// E4: `mla_append` with rope_dim 0 (which `MlaDims` allows): k_pe `[n, 0]` has no columns, and the call
/// stores the latent rows. Before, a contiguous `[n, 0]` k_pe (strides [1, 1]) was a `Layout` error.
#[test]
fn mla_append_without_rope_columns() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let (pages, ps, n, rank) = (2, 4, 3, 64);
    let latent: Vec<bf16> = (0..n * rank).map(|i| bf16::from_f32(0.25 + (i % 13) as f32)).collect();
    let k_pe: Vec<bf16> = Vec::new();
    let slots = [5i64, -1, 0];
    let mut cache = vec![bf16::NAN; pages * ps * rank];
    let opts = MlaAppendOptions { dims: MlaDims { kv_lora_rank: rank, rope_dim: 0 }, rope: None, scale: None };
    mla_append(
        &stream,
        &TensorView::host(&latent, [n, rank]).unwrap(),
        &TensorView::host(&k_pe, [n, 0]).unwrap(),
        &TensorView::host(&slots, [n]).unwrap(),
        &mut TensorViewMut::host(&mut cache, [pages, ps, 1, rank]).unwrap(),
        &opts,
    )
    .unwrap();
    for (t, &slot) in slots.iter().enumerate() {
        if slot >= 0 {
            let at = slot as usize * rank;
            assert_eq!(&cache[at..at + rank], &latent[t * rank..][..rank], "token {t}");
        }
    }
    let written = [0usize, 5];
    for s in (0..pages * ps).filter(|s| !written.contains(s)) {
        assert!(cache[s * rank..][..rank].iter().all(|x| x.is_nan()), "slot {s} was written");
    }
}

/// B3 / E2: the strides a launcher rejects are rejected first in Rust, naming the argument: a negative
/// stride on an empty view (before: accepted, then "launcher rejected its parameters" at the launch), a RoPE
/// table whose rows overlap the rotary_dim/2 columns the kernels read (before: the launcher's nameless
/// `Shape`).
#[test]
fn launcher_rejections_are_named_in_rust() {
    let data: Vec<bf16> = Vec::new();
    let (kind, msg) = err(TensorView::host(&data, [0, 2, 64]).unwrap().with_strides([-8, 64, 1]));
    assert_eq!(kind, ErrorKind::Layout, "{msg}");
    let mut out: Vec<bf16> = Vec::new();
    let (kind, _) = err(TensorViewMut::host(&mut out, [2, 0, 64]).unwrap().with_strides([-64, 64, 1]));
    assert_eq!(kind, ErrorKind::Layout);

    // append_with over a RoPE table of rows 8 floats apart, for rotary_dim 64 (32 columns read).
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let (pages, ps, hkv, d) = (2, 8, 1, 64);
    let (mut kc, mut vc) = (vec![bf16::NAN; pages * ps * hkv * d], vec![bf16::NAN; pages * ps * hkv * d]);
    let mut cache = PagedKvCacheMut::new(
        TensorViewMut::host(&mut kc, [pages, ps, hkv, d]).unwrap(),
        TensorViewMut::host(&mut vc, [pages, ps, hkv, d]).unwrap(),
    )
    .unwrap();
    let table = RopeConfig::new(1e4, d, RopeStyle::Neox).table(8).unwrap();
    let positions = [1i32, 2];
    let (k, slots) = (vec![bf16::ONE; 2 * hkv * d], [0i64, 1]);
    for overlapped in ["rope_cos", "rope_sin"] {
        // [8, 32] views of the [8, 32] tables, one with rows 8 floats apart.
        let stride = |name| if name == overlapped { [8, 1] } else { [32, 1] };
        let cos = TensorView::host(&table.cos, [8, 32]).unwrap().with_strides(stride("rope_cos")).unwrap();
        let sin = TensorView::host(&table.sin, [8, 32]).unwrap().with_strides(stride("rope_sin")).unwrap();
        let pos = TensorView::host(&positions, [2]).unwrap();
        let rope = Rope { cos: &cos, sin: &sin, positions: Some(&pos), rotary_dim: d, style: RopeStyle::Neox };
        let (kind, msg) = err(append_with(
            &stream,
            &TensorView::host(&k, [2, hkv, d]).unwrap(),
            &TensorView::host(&k, [2, hkv, d]).unwrap(),
            &TensorView::host(&slots, [2]).unwrap(),
            &mut cache,
            &AppendOptions { rope: Some(rope) },
        ));
        assert_eq!(kind, ErrorKind::Layout, "{msg}");
        assert!(msg.starts_with(&format!("{overlapped}:")), "{msg}");
    }
}

/// E1: public functions that panicked on bad input return a typed error naming the argument. (Before:
/// `table_row(p, 0)` panicked in `clamp`, `table(usize::MAX)` on a capacity overflow, `k_of` on an index;
/// these return `Result` now, so the old calls do not compile against the new signatures.)
#[test]
fn reachable_panics_are_typed_errors() {
    let (kind, msg) = err(fused_attn::rope::table_row(5, 0));
    assert_eq!((kind, msg.starts_with("max_pos:")), (ErrorKind::Shape, true), "{msg}");
    assert_eq!(fused_attn::rope::table_row(-3, 4).unwrap(), 0);
    assert_eq!(fused_attn::rope::table_row(i64::MAX, 4).unwrap(), 3);
    let cfg = RopeConfig::new(1e4, 64, RopeStyle::Neox);
    let (kind, msg) = err(cfg.table(usize::MAX));
    assert_eq!((kind, msg.starts_with("max_pos:")), (ErrorKind::Overflow, true), "{msg}");
    let (kind, msg) = err(cfg.table(0));
    assert_eq!((kind, msg.starts_with("max_pos:")), (ErrorKind::Shape, true), "{msg}");

    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let scales = KvScales::per_head(&stream, &[0.5, 0.25], &[1.0, 2.0]).unwrap();
    assert_eq!((scales.k_of(1).unwrap(), scales.v_of(1).unwrap()), (0.25, 2.0));
    let (kind, msg) = err(scales.k_of(2));
    assert_eq!((kind, msg.starts_with("h:")), (ErrorKind::OutOfBounds, true), "{msg}");
    assert_eq!(err(scales.v_of(7)).0, ErrorKind::OutOfBounds);
    let one = KvScales::per_tensor(&stream, 0.5, 2.0).unwrap();
    assert_eq!((one.k_of(1000).unwrap(), one.v_of(1000).unwrap()), (0.5, 2.0));
    // A workspace the host cannot allocate (found by tests/it/validation_prop.rs: the allocation failure
    // aborted the process): `OutOfMemory`, naming the workspace.
    let (kind, msg) = err(DecodeWorkspace::new(&stream, 1 << 45, 0));
    assert_eq!((kind, msg.starts_with("workspace:")), (ErrorKind::OutOfMemory, true), "{msg}");
}

/// E1 (debug builds): absurd sizes in the planners are `Overflow` errors or saturate, never an arithmetic
/// overflow. MLA's `max_seqlen_q · Hq` wrapped (release) into a small grid before: an `Unsupported` grid
/// error then, or a panic in a debug build.
#[test]
fn absurd_plan_sizes_are_overflow_errors() {
    let (kind, msg) = err(MlaPlan::new(1, 2, usize::MAX, 1, 4096, 512, 132, None));
    assert_eq!(kind, ErrorKind::Overflow, "{msg}");
    let (kind, _) = err(MlaPlan::new(2, 16, 1, usize::MAX / 2, 1 << 20, 512, 132, Some(4)));
    assert_eq!(kind, ErrorKind::Overflow);
    let huge = DecodeProblem { batch: usize::MAX, heads_q: 4, heads_kv: 2, head_dim: 128, max_seq_len: usize::MAX };
    assert_eq!(huge.ctas_per_split(), usize::MAX);
    assert_eq!(fused_attn::plan::planned_splits(&huge, usize::MAX), 1);
    assert_eq!(err(DecodePlan::new(&huge, 132, None)).0, ErrorKind::Overflow);
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    for policy in [SplitPolicy::Balanced, SplitPolicy::FixedSplitTokens(256)] {
        let r = DecodeWorkspace::scheduled_on(&stream, &huge, policy, usize::MAX / 4);
        assert_eq!(err(r).0, ErrorKind::Overflow, "{policy:?}");
    }
}

/// E5 (GPU): a launch reports only its own driver error. An error other code left in cudarc's context (one
/// sticky slot, cleared by `check_err`) is neither blamed on the launch nor taken from its owner. Before,
/// the launch called `check_err()` and returned that error as its own (and cleared it).
#[test]
fn gpu_launch_reports_only_its_own_error() {
    let Some(cu) = crate::common::gpu_stream_or_skip("safety::gpu_launch_reports_only_its_own_error") else { return };
    let stream = Stream::Gpu(&cu);
    let (k, n, h, d) = (2usize, 4usize, 2usize, 64usize);
    let states = cu.clone_htod(&vec![0.5f32; k * n * h * d]).unwrap();
    let lse = cu.clone_htod(&vec![0f32; k * n * h]).unwrap();
    let mut o = cu.clone_htod(&vec![f32::NAN; n * h * d]).unwrap();
    let someone_elses = cudarc::driver::DriverError(cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_HANDLE);
    cu.context().record_err::<()>(Err(someone_elses));
    let r = fused_attn::merge_states::<f32, f32>(
        &stream,
        &TensorView::gpu(states.as_view(), [k, n, h, d]).unwrap(),
        &TensorView::gpu(lse.as_view(), [k, n, h]).unwrap(),
        &mut TensorViewMut::gpu(o.as_view_mut(), [n, h, d]).unwrap(),
        None,
    );
    assert!(r.is_ok(), "the launch was blamed for another's error: {:?}", r.err());
    assert_eq!(cu.context().check_err().err().map(|e| e.0), Some(someone_elses.0), "the owner's error was taken");
    assert!(cu.clone_dtoh(&o).unwrap().iter().all(|&x| x == 0.5));
}

/// A1 (GPU): memory of another `CudaContext` value over the same driver context (candle's device and an
/// engine's own `CudaContext::new(0)` share the primary context) is the launch's context's memory. Before,
/// the contexts were compared as `Arc`s and the call was a `Backend` error.
#[test]
fn gpu_contexts_are_compared_by_their_driver_context() {
    let Some(ctx) = crate::common::gpu_or_skip("safety::gpu_contexts_are_compared_by_their_driver_context") else {
        return;
    };
    let other = cudarc::driver::CudaContext::new(0).unwrap();
    assert_eq!(ctx.cu_ctx(), other.cu_ctx(), "both are the primary context");
    let (ours, theirs) = (ctx.default_stream(), other.default_stream());
    let (k, n, h, d) = (1usize, 2usize, 1usize, 64usize);
    let states = theirs.clone_htod(&vec![0.5f32; k * n * h * d]).unwrap();
    let lse = theirs.clone_htod(&vec![0f32; k * n * h]).unwrap();
    let mut o = ours.clone_htod(&vec![f32::NAN; n * h * d]).unwrap();
    fused_attn::merge_states::<f32, f32>(
        &Stream::Gpu(&ours),
        &TensorView::gpu(states.as_view(), [k, n, h, d]).unwrap(),
        &TensorView::gpu(lse.as_view(), [k, n, h]).unwrap(),
        &mut TensorViewMut::gpu(o.as_view_mut(), [n, h, d]).unwrap(),
        None,
    )
    .unwrap();
    assert!(ours.clone_dtoh(&o).unwrap().iter().all(|&x| x == 0.5));
}

/// Found by tests/it/validation_prop.rs: a dimension of extent 1 addresses only index 0, so Rust's layout
/// checks ignore its stride, but the launchers checked every stride (16-byte rows) and rejected the call
/// without a name ("launcher rejected its parameters"). Launches now pass such strides as 0.
#[test]
fn strides_of_single_element_dimensions_are_not_rejected() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let (k, n, h, d) = (1usize, 2usize, 1usize, 64usize);
    let states = vec![0.5f32; k * n * h * d + 8];
    let lses = vec![0f32; k * n * h + 8];
    let mut o = vec![bf16::NAN; n * h * d];
    merge_states::<f32, bf16>(
        &stream,
        &TensorView::host(&states, [k, n, h, d]).unwrap().with_strides([7, 64, 3, 1]).unwrap(),
        &TensorView::host(&lses, [k, n, h]).unwrap().with_strides([5, 1, 3]).unwrap(),
        &mut TensorViewMut::host(&mut o, [n, h, d]).unwrap().with_strides([64, 3, 1]).unwrap(),
        None,
    )
    .unwrap();
    assert!(o.iter().all(|x| x.to_f32() == 0.5));
    // Dense prefill, one sequence: q / o batch strides of 5 elements (10 bytes) for a batch of 1.
    let (t, hq, dd) = (4usize, 2usize, 64usize);
    let q = vec![bf16::from_f32(0.25); t * hq * dd + 8];
    let mut out = vec![bf16::NAN; t * hq * dd + 8];
    let st = [5, (hq * dd) as i64, dd as i64, 1];
    fused_attn::prefill::prefill(
        &stream,
        &TensorView::host(&q, [1, t, hq, dd]).unwrap().with_strides(st).unwrap(),
        &TensorView::host(&q, [1, t, hq, dd]).unwrap().with_strides(st).unwrap(),
        &TensorView::host(&q, [1, t, hq, dd]).unwrap().with_strides(st).unwrap(),
        &mut TensorViewMut::host(&mut out, [1, t, hq, dd]).unwrap().with_strides(st).unwrap(),
        None,
        &Default::default(),
    )
    .unwrap();
    assert!(out[..t * hq * dd].iter().all(|x| (x.to_f32() - 0.25).abs() < 1e-3));
}

/// Paged prefill's scheduled path (the decode kernel over packed query rows, then the merge over a row list)
/// replayed after `prepare` for more query rows than it was captured with: 2 sequences of 4 new tokens (8
/// rows) captured, the table then prepared for 4 sequences (16 rows). Rows 8..15 are skipped; rows 0..7 are
/// their tokens' attention (against the fp64 reference, LSE included: a stray LSE store of row 9 would land
/// inside the [Hq, 8] LSE of another head). Before the merge bounded its rows the emulator faulted on the
/// store of row 8 past `o`.
#[test]
fn paged_prefill_replay_after_prepare_for_more_rows_writes_only_its_output() {
    use fused_attn::paged_prefill::{replay_scheduled, PagedPrefillProblem};
    use fused_attn::testkit::cases::paged_prefill::{case, evaluate, PagedPrefillFixture};
    use fused_attn::{PagedPrefillKernel, PagedPrefillOptions, PagedPrefillWorkspace};
    let seed = 0x46_0004;
    let (hq, hkv, d) = (4, 2, 64);
    let c = case(d, (hq, hkv), 16, &[(4, 600), (4, 1000)]);
    let f = PagedPrefillFixture::<bf16>::new(&c, seed);
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let limits = PagedPrefillProblem {
        batch: 8,
        heads_q: hq,
        heads_kv: hkv,
        head_dim: d,
        total_q: 32,
        max_seqlen_q: 4,
        max_seq_len: 1024,
    };
    let mut ws = PagedPrefillWorkspace::scheduled_on(&stream, &limits, SplitPolicy::Balanced, 64).unwrap();
    let opts = PagedPrefillOptions { kernel: PagedPrefillKernel::Streaming, ..Default::default() };
    let schedule = ws.prepare(&stream, &[0, 4, 8, 12, 16], &[1000; 4], &opts).unwrap().clone();
    assert!(schedule.merge_rows.iter().any(|r| r.out_row >= 8), "rows past the output: {:?}", schedule.merge_rows);

    let (rows, total_q) = (16, c.total_q());
    let mut o_buf = vec![bf16::NAN; rows * hq * d];
    let mut lse = vec![f32::NAN; hq * total_q];
    let cache = f.host_cache().unwrap();
    let q = TensorView::host(&f.q, [total_q, hq, d]).unwrap();
    let cu = TensorView::host(&f.cu_seqlens_q, [c.batch() + 1]).unwrap();
    let plan = {
        let mut o = TensorViewMut::host(&mut o_buf[..total_q * hq * d], [total_q, hq, d]).unwrap();
        let mut l = TensorViewMut::host(&mut lse, [hq, total_q]).unwrap();
        let r = replay_scheduled(&stream, &q, &cu, c.max_seqlen_q(), &cache, &mut o, Some(&mut l), &mut ws, &opts);
        r.unwrap_or_else(|e| panic!("the replay touched memory outside its buffers: {e:?}"))
    };
    assert!(o_buf[total_q * hq * d..].iter().all(|x| x.is_nan()), "rows past the output were written");
    let outcome = evaluate(&f, seed, plan, &o_buf[..total_q * hq * d], &lse).unwrap();
    assert!(outcome.passed(), "rows 0..8 against the reference: {}", outcome.summary());
}

/// Found by tests/it/validation_prop.rs: `mla_append` into a latent cache of no pages, or of page size 0,
/// with only padding slots (which no table check rejects) reached the launcher, whose rejection named
/// nothing. Now `Shape` / `Unsupported` naming `latent_cache`, as `PagedKvCacheMut` names its caches.
#[test]
fn mla_append_pool_rules_are_named() {
    let emu = Emulator::new().with_table_checks(fused_attn::TableChecks::GpuMasking);
    let stream = Stream::Emu(&emu);
    let (n, rank, rope) = (2, 64, 16);
    let latent = vec![bf16::ONE; n * rank];
    let k_pe = vec![bf16::ONE; n * rope];
    let slots = [-1i64, -1];
    let opts = MlaAppendOptions { dims: MlaDims { kv_lora_rank: rank, rope_dim: rope }, rope: None, scale: None };
    for (pages, ps, want) in [(0, 16, ErrorKind::Shape), (2, 0, ErrorKind::Unsupported)] {
        let mut cache: Vec<bf16> = vec![bf16::NAN; pages * ps * (rank + rope)];
        let (kind, msg) = err(mla_append(
            &stream,
            &TensorView::host(&latent, [n, rank]).unwrap(),
            &TensorView::host(&k_pe, [n, rope]).unwrap(),
            &TensorView::host(&slots, [n]).unwrap(),
            &mut TensorViewMut::host(&mut cache, [pages, ps, 1, rank + rope]).unwrap(),
            &opts,
        ));
        assert_eq!(kind, want, "{pages} pages of {ps}: {msg}");
        assert!(msg.starts_with("latent_cache:"), "{msg}");
    }
}

/// S2 (the last way to a plan the planner did not make): the plan a scheduled decode returns is a summary
/// (its largest chunk count, the slot grid, split_tokens 0 under the balanced policy), not a uniform plan;
/// pinning it is `Usage`. Before, `for_plan` took it and a later call reached the launcher's nameless
/// rejection of split_tokens 0.
#[test]
fn a_schedule_summary_is_not_pinned() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let case = DecodeCase::new(DType::Bf16, 64, (8, 2), 16, &[600, 1000], None);
    let f = PagedFixture::<bf16>::new(&case, 0x46_0005).unwrap();
    let mut ws = DecodeWorkspace::scheduled_on(&stream, &case.problem(), SplitPolicy::Balanced, 64).unwrap();
    let (b, hq, d) = (case.batch(), 8, 64);
    let mut o = vec![bf16::NAN; b * hq * d];
    let plan = fused_attn::decode(
        &stream,
        &TensorView::host(&f.q, [b, hq, d]).unwrap(),
        &f.host_cache().unwrap(),
        &mut TensorViewMut::host(&mut o, [b, hq, d]).unwrap(),
        None,
        &mut ws,
        &DecodeOptions::default(),
    )
    .unwrap();
    assert!(plan.is_schedule_summary() && plan.num_splits() > 1, "{plan:?}");
    let (kind, msg) = err(DecodeWorkspace::for_plan(&stream, &plan));
    assert_eq!(kind, ErrorKind::Usage, "{msg}");
    assert!(msg.starts_with("plan:"), "{msg}");
    let uniform = DecodePlan::new(&case.problem(), 132, Some(2)).unwrap();
    assert!(!uniform.is_schedule_summary() && DecodeWorkspace::for_plan(&stream, &uniform).is_ok());
}
