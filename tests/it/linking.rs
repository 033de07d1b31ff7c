//! What an engine relies on when it links fused-attn: a pinned decode plan makes a sequence's result
//! independent of the rest of the batch (bitwise), plans refuse calls outside their limits, raw device views
//! are refused by the emulator. (That a build without GPU kernels says so with a typed error is a unit test of
//! src/build_info.rs, run again by the packaged crate's emulator-only build in scripts/test.)
use crate::common;

use fused_attn::decode::{DecodeOptions, DecodeWorkspace};
use fused_attn::plan::DecodeProblem;
use fused_attn::{Emulator, ErrorKind, PagedKvCache, Stream, TensorView, TensorViewMut};
use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const HQ: usize = 4;
const HKV: usize = 1;
const D: usize = 64;
const PAGE: usize = 16;
const PAGES: usize = 256;

/// A shared page pool and per-sequence (query, pages, length) entries.
struct Pool {
    k: Vec<bf16>,
    v: Vec<bf16>,
}

struct Seq {
    q: Vec<bf16>, // [Hq, D]
    pages: Vec<i32>,
    len: usize,
}

fn random(rng: &mut StdRng, n: usize) -> Vec<bf16> {
    (0..n).map(|_| bf16::from_f32(rng.random_range(-1.0f32..1.0) + 0.25)).collect()
}

fn seq(rng: &mut StdRng, len: usize) -> Seq {
    let mut pages: Vec<i32> = (0..PAGES as i32).collect();
    // Any pages, in any order (distinct within the sequence).
    for i in (1..pages.len()).rev() {
        pages.swap(i, rng.random_range(0..=i));
    }
    pages.truncate(len.div_ceil(PAGE));
    Seq { q: random(rng, HQ * D), pages, len }
}

/// Decodes `batch` under `ws` on the emulator; returns o [B, Hq, D] and lse [B, Hq].
fn run(
    emu: &Emulator,
    pool: &Pool,
    batch: &[&Seq],
    ws: &mut DecodeWorkspace,
    max_seq_len: usize,
) -> fused_attn::Result<(Vec<bf16>, Vec<f32>)> {
    let b = batch.len();
    let width = max_seq_len.div_ceil(PAGE);
    let mut table = vec![-1i32; b * width];
    for (i, s) in batch.iter().enumerate() {
        table[i * width..i * width + s.pages.len()].copy_from_slice(&s.pages);
    }
    let lens: Vec<i32> = batch.iter().map(|s| s.len as i32).collect();
    let q: Vec<bf16> = batch.iter().flat_map(|s| s.q.iter().copied()).collect();
    let mut o = vec![bf16::NAN; b * HQ * D];
    let mut lse = vec![f32::NAN; b * HQ];
    let stream = Stream::Emu(emu);
    let cache = PagedKvCache::new(
        TensorView::host(&pool.k, [PAGES, PAGE, HKV, D]).unwrap(),
        TensorView::host(&pool.v, [PAGES, PAGE, HKV, D]).unwrap(),
        TensorView::host(&table, [b, width]).unwrap(),
        TensorView::host(&lens, [b]).unwrap(),
        max_seq_len,
    )
    .unwrap();
    common::decode_host(&stream, [b, HQ, D], &q, &cache, (&mut o, Some(&mut lse)), ws, &DecodeOptions::default())?;
    Ok((o, lse))
}

fn bits(o: &[bf16], lse: &[f32], row: usize) -> (Vec<u16>, Vec<u32>) {
    (
        o[row * HQ * D..(row + 1) * HQ * D].iter().map(|x| x.to_bits()).collect(),
        lse[row * HQ..(row + 1) * HQ].iter().map(|x| x.to_bits()).collect(),
    )
}

/// The same sequence decoded alone, and at another position among other sequences of other lengths, under
/// one pinned plan (planned for the limits, and forced to 3 splits): identical bits. Without pinning, the
/// planner would choose the split count from the batch, and the bits could differ.
#[test]
fn a_pinned_plan_makes_results_independent_of_the_batch() {
    let mut rng = StdRng::seed_from_u64(0xba7c_5eed);
    let pool = Pool { k: random(&mut rng, PAGES * PAGE * HKV * D), v: random(&mut rng, PAGES * PAGE * HKV * D) };
    let max_seq_len = 2048;
    let target = seq(&mut rng, 1500);
    let others: Vec<Seq> = [700, 2048, 33].iter().map(|&n| seq(&mut rng, n)).collect();
    let emu = Emulator::new();
    let limits = DecodeProblem { batch: 4, heads_q: HQ, heads_kv: HKV, head_dim: D, max_seq_len };
    for forced in [None, Some(3)] {
        let mut ws = DecodeWorkspace::for_limits(&Stream::Emu(&emu), &limits, forced).unwrap();
        let splits = ws.pinned_plan().unwrap().num_splits();
        assert!(splits > 1, "the test needs a split plan ({forced:?} gave {splits})");
        let (o1, l1) = run(&emu, &pool, &[&target], &mut ws, max_seq_len).unwrap();
        let (o4, l4) = run(&emu, &pool, &[&others[0], &others[1], &target, &others[2]], &mut ws, max_seq_len).unwrap();
        assert_eq!(bits(&o1, &l1, 0), bits(&o4, &l4, 2), "plan with {splits} splits: the batch changed the bits");
        assert!(l1.iter().all(|x| x.is_finite()) && o1.iter().all(|x| x.is_finite()));
    }
}

#[test]
fn a_pinned_plan_refuses_calls_outside_its_limits() {
    let mut rng = StdRng::seed_from_u64(7);
    let pool = Pool { k: random(&mut rng, PAGES * PAGE * HKV * D), v: random(&mut rng, PAGES * PAGE * HKV * D) };
    let emu = Emulator::new();
    let limits = DecodeProblem { batch: 1, heads_q: HQ, heads_kv: HKV, head_dim: D, max_seq_len: 1024 };
    let mut ws = DecodeWorkspace::for_limits(&Stream::Emu(&emu), &limits, Some(2)).unwrap();
    let (a, b) = (seq(&mut rng, 100), seq(&mut rng, 200));
    // Two sequences under a plan for one.
    let e = run(&emu, &pool, &[&a, &b], &mut ws, 1024).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Shape, "{e}");
    assert!(e.message().contains("batch"), "{e}");
    let width = 4096usize.div_ceil(PAGE);
    let (table, lens, q) = (vec![0i32; width], vec![10i32], random(&mut rng, HQ * D));
    let mut o = vec![bf16::NAN; HQ * D];
    let cache = PagedKvCache::new(
        TensorView::host(&pool.k, [PAGES, PAGE, HKV, D]).unwrap(),
        TensorView::host(&pool.v, [PAGES, PAGE, HKV, D]).unwrap(),
        TensorView::host(&table, [1, width]).unwrap(),
        TensorView::host(&lens, [1]).unwrap(),
        4096,
    )
    .unwrap();
    let e = common::decode_host(
        &Stream::Emu(&emu),
        [1, HQ, D],
        &q,
        &cache,
        (&mut o, None),
        &mut ws,
        &DecodeOptions::default(),
    )
    .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Shape, "{e}");
    assert!(e.message().contains("max_seq_len"), "{e}");
}

/// Raw device views belong to a GPU stream; the emulator refuses them by kind, before touching anything.
#[test]
fn raw_device_views_are_refused_by_the_emulator() {
    let emu = Emulator::new();
    let host = vec![bf16::ZERO; 64];
    let mut out = vec![bf16::ZERO; 64];
    // SAFETY: never dereferenced: the launch is refused before any access.
    let raw = unsafe { TensorView::<bf16, 4>::from_device_ptr(0x1000, 64, [1, 1, 1, 64]) }.unwrap();
    let e = fused_attn::prefill::prefill(
        &Stream::Emu(&emu),
        &raw,
        &TensorView::host(&host, [1, 1, 1, 64]).unwrap(),
        &TensorView::host(&host, [1, 1, 1, 64]).unwrap(),
        &mut TensorViewMut::host(&mut out, [1, 1, 1, 64]).unwrap(),
        None,
        &fused_attn::prefill::PrefillOptions { causal: false, scale: None, ..Default::default() },
    )
    .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Backend, "{e}");
}
