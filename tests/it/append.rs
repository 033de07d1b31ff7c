//! Append into the paged cache: a whole prompt per sequence (with padding rows), one token per sequence (the
//! decode step), the round trip through decode, and bad input -> typed errors. Emulated; the GPU variant
//! skips visibly without a GPU.
use crate::common;

use fused_attn::decode::{DecodeOptions, DecodeWorkspace};
use fused_attn::testkit::cases::decode::{DecodeCase, PagedFixture};
use fused_attn::{
    append, DType, Element, Emulator, ErrorKind, PagedKvCache, PagedKvCacheMut, Stream, TensorView, TensorViewMut,
};
use half::bf16;

/// The shared case's fixture on the run's base seed (FA_SEED or the fixed default) and, for failure
/// messages, the line that reruns `test` with it.
fn fixture(test: &str) -> (PagedFixture<bf16>, String) {
    (PagedFixture::new(&case(), common::base_seed()).unwrap(), common::rerun("append", test, None))
}

fn case() -> DecodeCase {
    DecodeCase::new(DType::Bf16, 128, (8, 2), 16, &[0, 1, 15, 17, 300], Some(2))
}

/// The tokens of every sequence as one packed [N, Hkv, D] batch plus its slot mapping, with a NaN padding
/// row (slot -1) after every sequence and one row aimed past the end of the cache (skipped, as on a GPU:
/// the emulators of these tests keep the GPU's masking semantics, `TableChecks::GpuMasking`).
fn packed_tokens<T: Element>(
    f: &PagedFixture<T>,
    tokens: impl Fn(usize) -> std::ops::Range<usize>,
) -> (Vec<T>, Vec<T>, Vec<i64>) {
    f.append_rows(tokens, true, Some(f.num_pages * f.case.page_size + 3))
}

fn append_host(
    stream: &Stream<'_>,
    f: &PagedFixture<bf16>,
    k_cache: &mut [bf16],
    v_cache: &mut [bf16],
    k: &[bf16],
    v: &[bf16],
    slots: &[i64],
) {
    common::append_host(stream, (k, v, slots), (k_cache, v_cache), f.cache_shape(), None).unwrap();
}

fn same_bits(a: &[bf16], b: &[bf16]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

fn decode_host(stream: &Stream<'_>, f: &PagedFixture<bf16>, k_cache: &[bf16], v_cache: &[bf16]) -> Vec<bf16> {
    let c = &f.case;
    let (b, hq, d) = (c.batch(), c.heads_q, c.head_dim);
    let cache = PagedKvCache::new(
        TensorView::host(k_cache, f.cache_shape()).unwrap(),
        TensorView::host(v_cache, f.cache_shape()).unwrap(),
        TensorView::host(&f.block_table, [b, f.width]).unwrap(),
        TensorView::host(&f.seq_lens, [b]).unwrap(),
        c.max_seq_len(),
    )
    .unwrap();
    let mut o = vec![bf16::NAN; b * hq * d];
    let mut ws = DecodeWorkspace::with_capacity(stream, b, hq, d, 2).unwrap();
    common::decode_host(
        stream,
        [b, hq, d],
        &f.q,
        &cache,
        (&mut o, None),
        &mut ws,
        &DecodeOptions { scale: None, num_splits: c.num_splits, ..Default::default() },
    )
    .unwrap();
    o
}

/// At D = 128 and 512 (Gemma 4's global layers: append has no width of its own, decode's widest).
#[test]
fn prompt_append_then_decode_round_trip() {
    let emu = Emulator::new().with_table_checks(fused_attn::TableChecks::GpuMasking);
    let stream = Stream::Emu(&emu);
    let rerun = common::rerun("append", "prompt_append_then_decode_round_trip", None);
    for head_dim in [128, 512] {
        let f = PagedFixture::<bf16>::new(&DecodeCase { head_dim, ..case() }, common::base_seed()).unwrap();
        let (k, v, slots) = packed_tokens(&f, |b| 0..f.case.seq_lens[b]);
        let mut k_cache = vec![bf16::NAN; f.k_cache.len()];
        let mut v_cache = vec![bf16::NAN; f.v_cache.len()];
        append_host(&stream, &f, &mut k_cache, &mut v_cache, &k, &v, &slots);
        // Every owned slot now holds the fixture's data; every other slot (and padding) stayed NaN: the whole
        // cache equals the fixture's, bit for bit.
        assert!(same_bits(&k_cache, &f.k_cache), "D {head_dim}: {rerun}");
        assert!(same_bits(&v_cache, &f.v_cache), "D {head_dim}: {rerun}");
        let want = decode_host(&stream, &f, &f.k_cache, &f.v_cache);
        let got = decode_host(&stream, &f, &k_cache, &v_cache);
        assert!(same_bits(&got, &want), "D {head_dim}: {rerun}");
    }
}

#[test]
fn one_token_per_sequence_append() {
    let emu = Emulator::new().with_table_checks(fused_attn::TableChecks::GpuMasking);
    let stream = Stream::Emu(&emu);
    let (f, rerun) = fixture("one_token_per_sequence_append");
    let lens = &f.case.seq_lens;
    // Cache holding all but the last token of every sequence; the decode step appends that token.
    let (k, v, slots) = packed_tokens(&f, |b| 0..lens[b].saturating_sub(1));
    let mut k_cache = vec![bf16::NAN; f.k_cache.len()];
    let mut v_cache = vec![bf16::NAN; f.v_cache.len()];
    append_host(&stream, &f, &mut k_cache, &mut v_cache, &k, &v, &slots);
    let (k, v, slots) = packed_tokens(&f, |b| lens[b].saturating_sub(1)..lens[b]);
    append_host(&stream, &f, &mut k_cache, &mut v_cache, &k, &v, &slots);
    assert!(same_bits(&k_cache, &f.k_cache), "{rerun}");
    assert!(same_bits(&v_cache, &f.v_cache), "{rerun}");
}

#[test]
fn bad_inputs_are_typed_errors() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let (pages, ps, hkv, d) = (4, 8, 2, 64);
    let mut kc = vec![bf16::ZERO; pages * ps * hkv * d];
    let mut vc = kc.clone();
    let mut cache = PagedKvCacheMut::new(
        TensorViewMut::host(&mut kc, [pages, ps, hkv, d]).unwrap(),
        TensorViewMut::host(&mut vc, [pages, ps, hkv, d]).unwrap(),
    )
    .unwrap();
    let data = vec![bf16::ZERO; 4 * hkv * d + 64];
    let slots = [0i64, 1, 2, 3];
    let kv = |n: usize, h: usize| TensorView::host(&data, [n, h, d]).unwrap();
    let sl = |n: usize| TensorView::host(&slots[..n], [n]).unwrap();
    assert!(append(&stream, &kv(4, hkv), &kv(4, hkv), &sl(4), &mut cache).is_ok());
    // Slot mapping length mismatch.
    let e = append(&stream, &kv(4, hkv), &kv(4, hkv), &sl(3), &mut cache).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Shape);
    assert!(e.message().starts_with("slot_mapping"), "{}", e.message());
    // K/V disagree, or disagree with the cache's heads.
    assert_eq!(append(&stream, &kv(4, hkv), &kv(3, hkv), &sl(4), &mut cache).unwrap_err().kind(), &ErrorKind::Shape);
    assert_eq!(append(&stream, &kv(4, 1), &kv(4, 1), &sl(4), &mut cache).unwrap_err().kind(), &ErrorKind::Shape);
    // Rows not 16-byte aligned (token stride of Hkv*D + 4 elements).
    let k = TensorView::host(&data, [4, hkv, d]).unwrap().with_strides([(hkv * d + 4) as i64, d as i64, 1]).unwrap();
    assert_eq!(append(&stream, &k, &k, &sl(4), &mut cache).unwrap_err().kind(), &ErrorKind::Alignment);
    // Page size 0 is rejected when the cache is built (any size >= 1 is taken: tests/it/page_sizes.rs).
    let (mut k0, mut v0) = (Vec::<bf16>::new(), Vec::<bf16>::new());
    let e = PagedKvCacheMut::new(
        TensorViewMut::host(&mut k0, [1, 0, 1, d]).unwrap(),
        TensorViewMut::host(&mut v0, [1, 0, 1, d]).unwrap(),
    )
    .err()
    .unwrap();
    assert_eq!(e.kind(), &ErrorKind::Unsupported);
}

#[test]
fn gpu_append_round_trip() {
    let Some(cu) = common::gpu_stream_or_skip("append::gpu_append_round_trip") else { return };
    let (f, rerun) = fixture("gpu_append_round_trip");
    let c = &f.case;
    let (k, v, slots) = packed_tokens(&f, |b| 0..c.seq_lens[b]);
    let mut kc = cu.clone_htod(&vec![bf16::NAN; f.k_cache.len()]).unwrap();
    let mut vc = cu.clone_htod(&vec![bf16::NAN; f.v_cache.len()]).unwrap();
    common::append_gpu(&cu, (&k, &v, &slots), (&mut kc, &mut vc), f.cache_shape(), None).unwrap();
    let k_back: Vec<bf16> = cu.clone_dtoh(&kc).unwrap();
    let v_back: Vec<bf16> = cu.clone_dtoh(&vc).unwrap();
    assert!(same_bits(&k_back, &f.k_cache), "{rerun}");
    assert!(same_bits(&v_back, &f.v_cache), "{rerun}");
}
