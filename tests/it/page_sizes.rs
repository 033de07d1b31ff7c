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
    assert_eq!(unsafe { sys::fa_host_divisor(d as i32, &mut out) }, sys::FA_OK, "d = {d}");
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
    assert_eq!(unsafe { sys::fa_host_divisor(0, &mut out) }, sys::FA_ERR_INVALID);
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
        let failure =
            check_divmod(d, &boundary_dividends(d as i64, top32), false).or_else(|| check_divmod(d, &n64, true));
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

/// Decode at every page size (16-bit, planned and forced splits alternating) and over FP8 caches at three.
fn decode_cases() -> Vec<(usize, DecodeCase)> {
    let fp8 = KvFormat::Fp8 { format: Fp8Format::E4m3, scales: ScaleKind::PerHead };
    let mut cases: Vec<DecodeCase> = PAGE_SIZES
        .iter()
        .enumerate()
        .map(|(i, &ps)| decode_case(ps, KvFormat::Sixteen, [None, Some(3)][i % 2]))
        .collect();
    cases.extend([decode_case(3, fp8, Some(2)), decode_case(100, fp8, None), decode_case(1056, fp8, Some(3))]);
    cases.into_iter().enumerate().collect()
}

/// Paged prefill at every page size: chunked prefill starting mid-page, a speculative-verify row block, a
/// whole prompt past 1056 tokens, a decode row; planned and forced splits alternating.
fn paged_prefill_cases() -> Vec<(usize, ppc::PagedPrefillCase)> {
    let case = |i: usize, ps| ppc::PagedPrefillCase {
        num_splits: [None, Some(3)][i % 2],
        ..ppc::case(64, (4, 2), ps, &[(5, 130), (17, 17), (40, 1100), (1, 37)])
    };
    PAGE_SIZES.iter().enumerate().map(|(i, &ps)| (i, case(i, ps))).collect()
}

fn check_decode(test: &str, check: impl Fn(&DecodeCase, u64) -> fused_attn::Result<dc::CaseOutcome> + Sync) {
    common::sweep_in_order("page_sizes", test, &decode_cases(), DecodeCase::label, |i, case| {
        let outcome = check(case, common::case_seed(7000 + i)).unwrap();
        (outcome.passed(), outcome.summary())
    });
}

fn check_paged_prefill(
    test: &str,
    check: impl Fn(&ppc::PagedPrefillCase, u64) -> fused_attn::Result<ppc::PagedPrefillOutcome> + Sync,
) {
    common::sweep_in_order("page_sizes", test, &paged_prefill_cases(), ppc::PagedPrefillCase::label, |i, c| {
        let outcome = check(c, common::case_seed(7100 + i)).unwrap();
        (outcome.passed(), outcome.summary())
    });
}

#[test]
fn decode_at_any_page_size() {
    for (i, case) in decode_cases() {
        assert!(poisoned(&PagedFixture::<bf16>::new(&case, common::case_seed(7000 + i)).unwrap()), "{}", case.label());
    }
    let emu = Emulator::new();
    check_decode("decode_at_any_page_size", |c, seed| dc::check_case_emulated(&emu, c, seed));
}

/// The same cases on a GPU, where the division is __umulhi (skips visibly without one).
#[test]
fn gpu_decode_at_any_page_size() {
    let Some(cu) = common::gpu_stream_or_skip("page_sizes::gpu_decode_at_any_page_size") else { return };
    check_decode("gpu_decode_at_any_page_size", |c, seed| dc::check_case_gpu(&cu, c, seed));
}

#[test]
fn paged_prefill_at_any_page_size() {
    let emu = Emulator::new();
    check_paged_prefill("paged_prefill_at_any_page_size", |c, seed| ppc::check_case_emulated(&emu, c, seed));
}

#[test]
fn gpu_paged_prefill_at_any_page_size() {
    let Some(cu) = common::gpu_stream_or_skip("page_sizes::gpu_paged_prefill_at_any_page_size") else { return };
    check_paged_prefill("gpu_paged_prefill_at_any_page_size", |c, seed| ppc::check_case_gpu(&cu, c, seed));
}

/// K rows, V rows and slots of an append.
type AppendRows = (Vec<bf16>, Vec<bf16>, Vec<i64>);

/// Append's input at page size `ps` (case i): every token of the decode case, a NaN padding row (slot −1)
/// after each sequence and one at the first slot past the pool (num_pages · ps), all to be skipped.
fn append_input(i: usize, ps: usize) -> (PagedFixture<bf16>, AppendRows) {
    let f =
        PagedFixture::<bf16>::new(&decode_case(ps, KvFormat::Sixteen, Some(2)), common::case_seed(7200 + i)).unwrap();
    let rows = f.append_rows(|b| 0..f.case.seq_lens[b], true, Some(f.num_pages * ps));
    (f, rows)
}

/// Whether an append into all-NaN pages wrote every token into exactly its slot and nothing else: the whole
/// cache equals the fixture's bit for bit (NaN slots included).
fn appended_exactly(f: &PagedFixture<bf16>, k_cache: &[bf16], v_cache: &[bf16]) -> bool {
    let bits = |x: &[bf16]| x.iter().map(|e| e.to_bits()).collect::<Vec<u16>>();
    bits(k_cache) == bits(&f.k_cache) && bits(v_cache) == bits(&f.v_cache)
}

/// Append at every page size; decode then reads the appended cache (finite rows; the empty sequence's rows
/// exactly 0).
#[test]
fn append_at_any_page_size() {
    let emu = Emulator::new().with_table_checks(fused_attn::TableChecks::GpuMasking);
    let stream = Stream::Emu(&emu);
    for (i, &ps) in PAGE_SIZES.iter().enumerate() {
        let (f, (k, v, slots)) = append_input(i, ps);
        let mut k_cache = vec![bf16::NAN; f.k_cache.len()];
        let mut v_cache = vec![bf16::NAN; f.v_cache.len()];
        common::append_host(&stream, (&k, &v, &slots), (&mut k_cache, &mut v_cache), f.cache_shape(), None).unwrap();
        assert!(appended_exactly(&f, &k_cache, &v_cache), "page size {ps}");
        let (b, hq, d) = (f.case.batch(), f.case.heads_q, f.case.head_dim);
        let cache = PagedKvCache::new(
            TensorView::host(&k_cache, f.cache_shape()).unwrap(),
            TensorView::host(&v_cache, f.cache_shape()).unwrap(),
            TensorView::host(&f.block_table, [b, f.width]).unwrap(),
            TensorView::host(&f.seq_lens, [b]).unwrap(),
            f.case.max_seq_len(),
        )
        .unwrap();
        let mut o = vec![bf16::NAN; b * hq * d];
        let mut ws = fused_attn::DecodeWorkspace::with_capacity(&stream, b, hq, d, 2).unwrap();
        let opts = DecodeOptions { num_splits: Some(2), ..Default::default() };
        common::decode_host(&stream, [b, hq, d], &f.q, &cache, (&mut o, None), &mut ws, &opts).unwrap();
        assert!(o.iter().all(|x| x.is_finite()), "page size {ps}");
        assert!(o[..hq * d].iter().all(|x| x.to_bits() == 0), "page size {ps}");
    }
}

/// The same appends on a GPU, where the slot division is __umul64hi (skips visibly without one).
#[test]
fn gpu_append_at_any_page_size() {
    let Some(cu) = common::gpu_stream_or_skip("page_sizes::gpu_append_at_any_page_size") else { return };
    for (i, &ps) in PAGE_SIZES.iter().enumerate() {
        let (f, (k, v, slots)) = append_input(i, ps);
        let mut kc = cu.clone_htod(&vec![bf16::NAN; f.k_cache.len()]).unwrap();
        let mut vc = cu.clone_htod(&vec![bf16::NAN; f.v_cache.len()]).unwrap();
        common::append_gpu(&cu, (&k, &v, &slots), (&mut kc, &mut vc), f.cache_shape(), None).unwrap();
        let (k_cache, v_cache) = (cu.clone_dtoh(&kc).unwrap(), cu.clone_dtoh(&vc).unwrap());
        cu.synchronize().unwrap();
        assert!(appended_exactly(&f, &k_cache, &v_cache), "page size {ps}");
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

/// The kernels never divide by the page size with `/` or `%` (on the GPU a ~20-instruction sequence per
/// division, 64-bit a subroutine call): every token → page and slot → page goes through fa/fast_divmod.cuh.
/// A static check over the kernel sources (comments left out).
#[test]
fn kernels_divide_by_the_page_size_only_through_fast_divmod() {
    fn sources(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "cu" || e == "cuh" || e == "h" || e == "cpp") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    sources(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels"), &mut files);
    assert!(files.len() > 20, "{files:?}");
    let mut divisions = Vec::new();
    for file in &files {
        for (i, line) in std::fs::read_to_string(file).unwrap().lines().enumerate() {
            let code = line.split("//").next().unwrap();
            for (at, _) in code.match_indices("page_size") {
                // What the divisor expression follows: skip `c.`, `p.cache.`, `cache.`, `->`, `(` and spaces.
                let before = code[..at].trim_end_matches(|ch: char| ch.is_alphanumeric() || "_.>-() ".contains(ch));
                if before.ends_with('/') || before.ends_with('%') || before.ends_with("/=") || before.ends_with("%=") {
                    divisions.push(format!("{}:{}: {}", file.display(), i + 1, line.trim()));
                }
            }
        }
    }
    assert!(divisions.is_empty(), "division by the page size outside fa/fast_divmod.cuh:\n{}", divisions.join("\n"));
}
