//! Any page size ≥ 1 (issue 30, item 5). The kernels divide token indices and cache slots by the page size
//! with a multiply-shift (kernels/include/fa/fast_divmod.cuh): its constants (Rust's and the launchers')
//! agree, and its 32-bit and 64-bit forms equal `/` and `%` at the boundaries where such a division would
//! first go wrong (the largest dividends, remainders d − 1) and exhaustively over small ranges. Then decode,
//! append and paged prefill at page sizes 1, 3, 12, 16, 48, 100, 256 and 1056 (a vLLM hybrid-model block
//! size) against the fp64 reference / exact expectations, over caches whose unused slots and spare pages
//! hold NaN, and page size 0 as a typed error.
use crate::common;

use fused_attn::decode::DecodeOptions;
use fused_attn::fast_divmod::divisor;
use fused_attn::testkit::cases::decode::{self as dc, DecodeCase, PagedFixture};
use fused_attn::testkit::cases::kv::KvFormat;
use fused_attn::testkit::cases::paged_prefill as ppc;
use fused_attn::{sys, DType, Emulator, ErrorKind, Fp8Format, PagedKvCache, ScaleKind, Stream, TensorView};
use half::bf16;

/// The page sizes every op is checked at.
const PAGE_SIZES: [usize; 8] = [1, 3, 12, 16, 48, 100, 256, 1056];

/// The launchers' constants for `d` (fa_host_divisor).
fn host_divisor(d: usize) -> sys::FaDivisor {
    let mut out = sys::FaDivisor { mul64: 0, mul: 0, shift: -1 };
    assert_eq!(unsafe { sys::fa_host_divisor(d as i32, &mut out) }, sys::FA_OK as i32, "d = {d}");
    out
}

/// `n / d` and `n % d` as the kernels compute them (the 64-bit form with `wide`), checked against Rust's;
/// returns the first mismatch.
fn check_divmod(d: usize, n: &[i64], wide: bool) -> Option<String> {
    let div = divisor(d).unwrap();
    let (mut q, mut r) = (vec![-1i64; n.len()], vec![-1i64; n.len()]);
    unsafe {
        sys::fa_host_divmod(div, d as i32, n.as_ptr(), q.as_mut_ptr(), r.as_mut_ptr(), n.len() as i64, wide as i32)
    };
    let d = d as i64;
    (0..n.len())
        .find(|&i| (q[i], r[i]) != (n[i] / d, n[i] % d))
        .map(|i| format!("d {d}, n {}: got ({}, {}), want ({}, {})", n[i], q[i], r[i], n[i] / d, n[i] % d))
}

/// The dividends where a multiply-shift division errs first if at all: the largest remainder (d − 1) of the
/// largest quotients below `top`, the top itself, and the first multiples.
fn boundary_dividends(d: i64, top: i64) -> Vec<i64> {
    let q_max = top / d;
    let mut n = vec![0, 1, d - 1, d, d + 1, 2 * d - 1, top, top - 1];
    for q in q_max.saturating_sub(3)..=q_max {
        n.extend([q * d - 1, q * d, q * d + d - 1].into_iter().filter(|&x| (0..=top).contains(&x)));
    }
    n
}

/// Divisors: every one up to 2^16, the powers of two and their neighbours, and a seeded spread up to 2^31 − 1.
fn divisors() -> Vec<usize> {
    let mut ds: Vec<usize> = (1..=1 << 16).collect();
    for l in 17..31 {
        ds.extend([(1 << l) - 1, 1 << l, (1 << l) + 1]);
    }
    ds.push(i32::MAX as usize);
    let mut x = common::base_seed() | 1;
    for _ in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ds.push(1 + (x % i32::MAX as u64) as usize);
    }
    ds
}

#[test]
fn rust_and_launcher_divisors_agree() {
    for d in divisors() {
        let (ours, theirs) = (divisor(d).unwrap(), host_divisor(d));
        assert_eq!((ours.mul64, ours.mul, ours.shift), (theirs.mul64, theirs.mul, theirs.shift), "d = {d}");
    }
    let mut out = sys::FaDivisor { mul64: 0, mul: 0, shift: 0 };
    assert_eq!(unsafe { sys::fa_host_divisor(0, &mut out) }, sys::FA_ERR_INVALID as i32);
}

/// Token indices (0 ≤ n < 2^31, the 32-bit form) and cache slots (0 ≤ n < 2^63, the 64-bit form; slots stay
/// below num_pages · page_size < 2^62).
#[test]
fn fast_divmod_is_exact_over_the_abi_range() {
    for d in divisors() {
        let top32 = i32::MAX as i64;
        let slots_top = (i32::MAX as i64) * d as i64; // num_pages < 2^31 pages of d slots
        let mut n64 = boundary_dividends(d as i64, i64::MAX);
        n64.extend(boundary_dividends(d as i64, slots_top));
        n64.extend(boundary_dividends(d as i64, top32));
        let failure = check_divmod(d, &boundary_dividends(d as i64, top32), false).or_else(|| check_divmod(d, &n64, true));
        assert!(failure.is_none(), "{}", failure.unwrap());
    }
    // Exhaustively over the first 2^20 token indices (and slots) for the page sizes the ops are tested at
    // and a few more that are not powers of two.
    let small: Vec<i64> = (0..1 << 20).collect();
    for d in PAGE_SIZES.into_iter().chain([5, 7, 528, 544, 2096, 3120, 12_345]) {
        for wide in [false, true] {
            let failure = check_divmod(d, &small, wide);
            assert!(failure.is_none(), "{}", failure.unwrap());
        }
    }
}

/// The case of decode at page size `ps`: ragged lengths that end inside a page, on a page boundary and
/// span pages past 1056 tokens, an empty sequence; forced splits (split edges inside pages).
fn decode_case(ps: usize, kv: KvFormat, splits: Option<usize>) -> DecodeCase {
    let lens = [0, 1, 37, 200, (2 * ps - 1).min(1099), 1100];
    DecodeCase { kv, ..DecodeCase::new(DType::Bf16, 64, (4, 2), ps, &lens, splits) }
}

/// Whether the fixture's cache poisons what it must not read: a page's slots past its sequence's end (when
/// a page has more than one slot) and the spare pages hold NaN.
fn poisoned<T: fused_attn::Element>(f: &PagedFixture<T>) -> bool {
    let nan = |v: &[T]| v.iter().filter(|x| x.to_f64().is_nan()).count();
    let (row, ps) = (f.case.heads_kv * f.case.head_dim, f.case.page_size);
    let tail = f.case.seq_lens.iter().map(|&n| n.div_ceil(ps) * ps - n).sum::<usize>();
    let unused = (f.num_pages * ps - f.case.seq_lens.iter().sum::<usize>()) * row;
    nan(&f.k_cache) == unused && nan(&f.v_cache) == unused && unused >= (tail + ps) * row
}

#[test]
fn decode_at_any_page_size() {
    let emu = Emulator::new();
    let fp8 = KvFormat::Fp8 { format: Fp8Format::E4m3, scales: ScaleKind::PerHead };
    let mut cases = Vec::new();
    for (i, &ps) in PAGE_SIZES.iter().enumerate() {
        cases.push(decode_case(ps, KvFormat::Sixteen, [None, Some(3)][i % 2]));
    }
    cases.extend([decode_case(3, fp8, Some(2)), decode_case(100, fp8, None), decode_case(1056, fp8, Some(3))]);
    for (i, case) in cases.iter().enumerate() {
        let seed = common::case_seed(7000 + i);
        assert!(poisoned(&PagedFixture::<bf16>::new(case, seed).unwrap()), "{}", case.label());
    }
    let cases: Vec<(usize, DecodeCase)> = cases.into_iter().enumerate().collect();
    common::sweep_in_order("page_sizes", "decode_at_any_page_size", &cases, DecodeCase::label, |i, case| {
        let outcome = dc::check_case_emulated(&emu, case, common::case_seed(7000 + i)).unwrap();
        (outcome.passed(), outcome.summary())
    });
}

#[test]
fn paged_prefill_at_any_page_size() {
    let emu = Emulator::new();
    let mut cases: Vec<(usize, ppc::PagedPrefillCase)> = Vec::new();
    for (i, &ps) in PAGE_SIZES.iter().enumerate() {
        // Chunked prefill starting mid-page, a speculative-verify row block, a whole prompt, a decode row.
        let mut c = ppc::case(64, (4, 2), ps, &[(5, 130), (17, 17), (40, 1100), (1, 37)]);
        c.num_splits = [None, Some(3)][i % 2];
        cases.push((i, c));
    }
    common::sweep_in_order("page_sizes", "paged_prefill_at_any_page_size", &cases, ppc::PagedPrefillCase::label, |i, c| {
        let outcome = ppc::check_case_emulated(&emu, c, common::case_seed(7100 + i)).unwrap();
        (outcome.passed(), outcome.summary())
    });
}

/// Append writes every token into exactly its slot (the whole cache, NaN slots included, equals the
/// fixture's bit for bit), skipping padding and a slot past the pool; decode then reads it back.
#[test]
fn append_at_any_page_size() {
    let emu = Emulator::new().with_table_checks(fused_attn::TableChecks::GpuMasking);
    let stream = Stream::Emu(&emu);
    for (i, &ps) in PAGE_SIZES.iter().enumerate() {
        let case = decode_case(ps, KvFormat::Sixteen, Some(2));
        let f = PagedFixture::<bf16>::new(&case, common::case_seed(7200 + i)).unwrap();
        let (k, v, slots) = f.append_rows(|b| 0..case.seq_lens[b], true, Some(f.num_pages * ps));
        let mut k_cache = vec![bf16::NAN; f.k_cache.len()];
        let mut v_cache = vec![bf16::NAN; f.v_cache.len()];
        common::append_host(&stream, (&k, &v, &slots), (&mut k_cache, &mut v_cache), f.cache_shape(), None).unwrap();
        let bits = |x: &[bf16]| x.iter().map(|e| e.to_bits()).collect::<Vec<u16>>();
        assert!(bits(&k_cache) == bits(&f.k_cache) && bits(&v_cache) == bits(&f.v_cache), "page size {ps}");
        let (b, hq, d) = (case.batch(), case.heads_q, case.head_dim);
        let cache = PagedKvCache::new(
            TensorView::host(&k_cache, f.cache_shape()).unwrap(),
            TensorView::host(&v_cache, f.cache_shape()).unwrap(),
            TensorView::host(&f.block_table, [b, f.width]).unwrap(),
            TensorView::host(&f.seq_lens, [b]).unwrap(),
            case.max_seq_len(),
        )
        .unwrap();
        let mut o = vec![bf16::NAN; b * hq * d];
        let mut ws = fused_attn::DecodeWorkspace::with_capacity(&stream, b, hq, d, 2).unwrap();
        let opts = DecodeOptions { num_splits: Some(2), ..Default::default() };
        common::decode_host(&stream, [b, hq, d], &f.q, &cache, (&mut o, None), &mut ws, &opts).unwrap();
        // Rows with a visible key are finite; the empty sequence's rows are exactly 0.
        assert!(o.iter().all(|x| x.is_finite()), "page size {ps}");
        assert!(o[..hq * d].iter().all(|x| x.to_bits() == 0), "page size {ps}");
    }
}

#[test]
fn page_size_zero_is_unsupported() {
    let (e, l, t) = (Vec::<bf16>::new(), vec![0i32; 1], vec![0i32; 1]);
    let err = PagedKvCache::new(
        TensorView::host(&e, [2, 0, 1, 64]).unwrap(),
        TensorView::host(&e, [2, 0, 1, 64]).unwrap(),
        TensorView::host(&t, [1, 1]).unwrap(),
        TensorView::host(&l, [1]).unwrap(),
        0,
    )
    .err()
    .unwrap();
    assert_eq!(err.kind(), &ErrorKind::Unsupported);
    assert!(err.message().contains("page size 0"), "{}", err.message());
    assert!(divisor(0).is_none());
}
