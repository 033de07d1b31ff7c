//! RoPE on q fused into dense, varlen and paged prefill (docs/rope.md), on the emulator:
//!  - sweeps against the fp64 reference (which rotates q as the op defines it: fp32 from the table, rounded
//!    to the dtype): both layouts, full and partial rotary (20 of 80, 32 of 80, 64 of 128, 128 of 256), the
//!    default, linear, NTK, Llama-3 and YaRN tables, explicit positions and the bottom-right default
//!    (chunked prefill, Tq > Tk's clamped negative positions), causal and bidirectional, with and without a
//!    score variant, every prefill width class; and the same output judged without RoPE must fail;
//!  - paged prefill: the adversarial paged fixtures (shuffled pages, NaN in every unowned slot), 16-bit and
//!    FP8 caches, splits; append with RoPE then paged prefill with RoPE, end to end;
//!  - poison: table rows no position addresses and 3 columns past rotary_dim/2 are NaN, outputs start NaN;
//!  - cost: q is read exactly once and never written; the table adds rotary_dim·4 bytes per query row and
//!    head, the positions 4; K/V traffic is the same as without RoPE;
//!  - errors: bad positions are typed errors (the sm_90a kernel's RoPE: tests/it/rope_prefill_sm90.rs).

use crate::common;

use fused_attn::paged_prefill::{PagedPrefillKernel, PagedPrefillOptions};
use fused_attn::prefill::{prefill, prefill_varlen, PrefillKernel, PrefillOptions};
use fused_attn::reference::{check_prefill, check_prefill_varlen, Check};
use fused_attn::testkit::cases::kv::KvFormat;
use fused_attn::testkit::cases::paged_prefill::{case as paged_case, PagedPrefillCase, PagedPrefillFixture};
use fused_attn::testkit::rope::PoisonedTable;
use fused_attn::testkit::seed::rng;
use fused_attn::{
    DType, Element, Emulator, ErrorKind, Fp8Format, Rope, RopeConfig, RopeScaling, RopeStyle, ScaleKind, ScoreMod,
    Stream, TensorView, TensorViewMut,
};
use half::{bf16, f16};
use rand::Rng;

/// Table positions of every test (explicit positions are drawn below it; bottom-right ones lie below it).
const MAX_POS: usize = 4096;

/// One dense or varlen case: `seqs` are (Tq, Tk) per sequence (dense: all alike).
#[derive(Clone, Debug)]
struct Case {
    dtype: DType,
    head_dim: usize,
    heads: (usize, usize),
    seqs: Vec<(usize, usize)>,
    varlen: bool,
    causal: bool,
    rope: RopeConfig,
    explicit: bool,
    /// A softcap beside RoPE (the same _mod kernel, its score variant on).
    softcap: bool,
}

fn cfg(theta: f64, rotary_dim: usize, style: RopeStyle, scaling: RopeScaling) -> RopeConfig {
    RopeConfig { theta, rotary_dim, style, scaling }
}

fn cases() -> Vec<Case> {
    use RopeStyle::{Gptj, Neox};
    let c = |dtype, head_dim, heads, seqs: &[(usize, usize)], varlen, causal, rope, explicit| Case {
        dtype,
        head_dim,
        heads,
        seqs: seqs.to_vec(),
        varlen,
        causal,
        rope,
        explicit,
        softcap: false,
    };
    let (bf, f) = (DType::Bf16, DType::F16);
    vec![
        // Dense. Llama at d128 (the 128 x 32 _mod tile), bottom-right positions.
        c(bf, 128, (4, 2), &[(100, 100), (100, 100)], false, true, cfg(1e4, 128, Neox, RopeScaling::None), false),
        // Chunked prefill (Tq < Tk): positions start at Tk − Tq.
        c(f, 64, (4, 1), &[(64, 200)], false, true, cfg(1e4, 64, Gptj, RopeScaling::yarn(4.0, 2048)), false),
        // Phi-2: 32 of 80 (the 96 kernel), bidirectional, explicit positions.
        c(
            bf,
            80,
            (2, 2),
            &[(70, 70), (70, 70)],
            false,
            false,
            cfg(1e4, 32, Neox, RopeScaling::Linear { factor: 2.0 }),
            true,
        ),
        c(bf, 256, (2, 1), &[(40, 90)], false, true, cfg(5e5, 256, Neox, RopeScaling::llama31()), true),
        // Tq > Tk, bidirectional: the first rows' bottom-right positions are negative (clamped to 0).
        c(f, 32, (2, 2), &[(150, 100)], false, false, cfg(1e4, 32, Gptj, RopeScaling::Ntk { factor: 2.0 }), false),
        // Varlen: an empty sequence, a chunk, Llama 3.1.
        c(
            bf,
            128,
            (8, 2),
            &[(17, 17), (0, 5), (64, 150), (33, 33)],
            true,
            true,
            cfg(5e5, 128, Neox, RopeScaling::llama31()),
            false,
        ),
        c(f, 160, (3, 1), &[(40, 40), (9, 100)], true, true, cfg(1e4, 128, Gptj, RopeScaling::yarn(8.0, 4096)), true),
        c(bf, 64, (2, 2), &[(1, 1), (70, 70)], true, false, cfg(1e4, 64, Neox, RopeScaling::None), true),
        // Pythia / StableLM: 20 of 80.
        c(f, 80, (4, 4), &[(50, 60), (3, 80)], true, true, cfg(1e4, 20, Neox, RopeScaling::None), false),
        // Head dims past the tiled kernel (issue 27: the decode kernel's streaming path): Gemma 4-style
        // partial rotary at 512 over a chunk (explicit positions), varlen at 320 with an empty sequence.
        c(bf, 512, (4, 2), &[(40, 90), (40, 90)], false, true, cfg(1e6, 128, Neox, RopeScaling::None), true),
        c(
            f,
            320,
            (2, 1),
            &[(20, 20), (0, 3), (9, 40)],
            true,
            true,
            cfg(1e4, 320, Gptj, RopeScaling::yarn(4.0, 2048)),
            false,
        ),
        // RoPE beside a softcap (GLM-style half rotary, interleaved).
        Case {
            softcap: true,
            ..c(bf, 128, (2, 1), &[(130, 130)], false, true, cfg(1e4, 64, Gptj, RopeScaling::None), true)
        },
    ]
}

/// Random `n` elements in [lo, hi) of T.
fn random<T: Element>(r: &mut impl Rng, n: usize, lo: f64, hi: f64) -> Vec<T> {
    (0..n).map(|_| T::from_f64(r.random_range(lo..hi))).collect()
}

/// The bottom-right position of every query row (sequence by sequence): row i of (Tq, Tk) at i + Tk − Tq.
fn bottom_right(seqs: &[(usize, usize)]) -> Vec<i64> {
    seqs.iter().flat_map(|&(tq, tk)| (0..tq).map(move |i| i as i64 + tk as i64 - tq as i64)).collect()
}

/// Runs one case with RoPE (NaN-poisoned outputs and table) and judges it with and without RoPE.
fn run_case<T: Element>(stream: &Stream<'_>, c: &Case, seed: u64) -> Result<(Check, Check), fused_attn::Error> {
    let mut r = rng(seed);
    let ((hq, hkv), d) = (c.heads, c.head_dim);
    let rows_q: usize = c.seqs.iter().map(|s| s.0).sum();
    let rows_k: usize = c.seqs.iter().map(|s| s.1).sum();
    let q = random::<T>(&mut r, rows_q * hq * d, -1.0, 1.0);
    let k = random::<T>(&mut r, rows_k * hkv * d, -1.0, 1.0);
    let v = random::<T>(&mut r, rows_k * hkv * d, -0.5, 1.5);
    let positions: Vec<i32> = (0..rows_q).map(|_| r.random_range(0..MAX_POS as i32)).collect();
    let used = if c.explicit { positions.iter().map(|&p| i64::from(p)).collect() } else { bottom_right(&c.seqs) };
    let table = PoisonedTable::new(&c.rope, MAX_POS, &used)?;
    let (cos, sin) = table.views()?;
    let pv = TensorView::host(&positions, [rows_q])?;
    let rope = Rope {
        cos: &cos,
        sin: &sin,
        rotary_dim: c.rope.rotary_dim,
        style: c.rope.style,
        positions: c.explicit.then_some(&pv),
    };
    let score_mod = ScoreMod { softcap: c.softcap.then_some(30.0), ..Default::default() };
    let opts = PrefillOptions { causal: c.causal, score_mod, rope: Some(rope), ..Default::default() };
    let without = PrefillOptions { rope: None, ..opts };
    let mut o = vec![T::nan(); rows_q * hq * d];
    let mut lse = vec![f32::NAN; hq * rows_q];
    if c.varlen {
        let cu = |f: fn(&(usize, usize)) -> usize| -> Vec<i32> {
            std::iter::once(0)
                .chain(c.seqs.iter().scan(0, |s, x| {
                    *s += f(x) as i32;
                    Some(*s)
                }))
                .collect()
        };
        let (cq, ck) = (cu(|s| s.0), cu(|s| s.1));
        let b = c.seqs.len();
        let (max_q, max_k) = (c.seqs.iter().map(|s| s.0).max().unwrap(), c.seqs.iter().map(|s| s.1).max().unwrap());
        let (qv, kv, vv) = (
            TensorView::host(&q, [rows_q, hq, d])?,
            TensorView::host(&k, [rows_k, hkv, d])?,
            TensorView::host(&v, [rows_k, hkv, d])?,
        );
        let (cqv, ckv) = (TensorView::host(&cq, [b + 1])?, TensorView::host(&ck, [b + 1])?);
        prefill_varlen(
            stream,
            &qv,
            &kv,
            &vv,
            &cqv,
            &ckv,
            max_q,
            max_k,
            &mut TensorViewMut::host(&mut o, [rows_q, hq, d])?,
            Some(&mut TensorViewMut::host(&mut lse, [hq, rows_q])?),
            &opts,
        )?;
        let (ov, lv) = (TensorView::host(&o, [rows_q, hq, d])?, TensorView::host(&lse, [hq, rows_q])?);
        let check = |opts| check_prefill_varlen(&qv, &kv, &vv, &cqv, &ckv, &ov, Some(&lv), opts);
        Ok((check(&opts)?, check(&without)?))
    } else {
        let (b, (tq, tk)) = (c.seqs.len(), c.seqs[0]);
        let (qv, kv, vv) = (
            TensorView::host(&q, [b, tq, hq, d])?,
            TensorView::host(&k, [b, tk, hkv, d])?,
            TensorView::host(&v, [b, tk, hkv, d])?,
        );
        prefill(
            stream,
            &qv,
            &kv,
            &vv,
            &mut TensorViewMut::host(&mut o, [b, tq, hq, d])?,
            Some(&mut TensorViewMut::host(&mut lse, [b, hq, tq])?),
            &opts,
        )?;
        let (ov, lv) = (TensorView::host(&o, [b, tq, hq, d])?, TensorView::host(&lse, [b, hq, tq])?);
        let check = |opts| check_prefill(&qv, &kv, &vv, &ov, Some(&lv), opts);
        Ok((check(&opts)?, check(&without)?))
    }
}

/// A pair of verdicts (as run, as if unrotated) as a case result: the first must pass, the second fail.
fn verdict(res: Result<(Check, Check), fused_attn::Error>) -> Result<String, String> {
    let (with, without) = res.map_err(|e| format!("failed to run: {e}"))?;
    crate::rope::with_and_without(with, without)
}

#[test]
fn prefill_rope_sweep_against_the_reference() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let mut failed = Vec::new();
    for (i, c) in cases().iter().enumerate() {
        let seed = common::case_seed(28_600 + i);
        let res = verdict(match c.dtype {
            DType::Bf16 => run_case::<bf16>(&stream, c, seed),
            DType::F16 => run_case::<f16>(&stream, c, seed),
        });
        eprintln!("case {i} {c:?} (seed {seed:#x}): {res:?}");
        if res.is_err() {
            failed.push(i);
        }
    }
    assert!(
        failed.is_empty(),
        "cases {failed:?} failed; {}",
        common::rerun("rope_prefill", "prefill_rope_sweep_against_the_reference", None)
    );
}

#[test]
fn paged_prefill_rope_sweep_against_the_reference() {
    use RopeStyle::{Gptj, Neox};
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let fp8 = |c: PagedPrefillCase, format| {
        let kv = KvFormat::Fp8 { format, scales: ScaleKind::PerHead };
        PagedPrefillCase { kv, ..c }
    };
    let f16_case = |c: PagedPrefillCase| PagedPrefillCase { dtype: DType::F16, ..c };
    let split = |c: PagedPrefillCase, n| PagedPrefillCase { num_splits: Some(n), ..c };
    let cases = [
        (
            paged_case(128, (8, 2), 16, &[(17, 60), (0, 9), (40, 40)]),
            cfg(5e5, 128, Neox, RopeScaling::llama31()),
            false,
        ),
        (
            f16_case(paged_case(64, (4, 4), 1, &[(5, 5), (30, 90)])),
            cfg(1e4, 64, Gptj, RopeScaling::yarn(4.0, 2048)),
            true,
        ),
        (paged_case(80, (4, 1), 8, &[(24, 100), (3, 3)]), cfg(1e4, 32, Neox, RopeScaling::None), true),
        (
            split(paged_case(256, (2, 1), 32, &[(8, 300)]), 3),
            cfg(1e4, 256, Neox, RopeScaling::Ntk { factor: 2.0 }),
            false,
        ),
        (
            fp8(paged_case(128, (8, 2), 16, &[(20, 70), (9, 9)]), Fp8Format::E4m3),
            cfg(5e5, 128, Neox, RopeScaling::llama31()),
            false,
        ),
        (
            fp8(f16_case(paged_case(96, (3, 1), 4, &[(12, 40)])), Fp8Format::E5m2),
            cfg(1e4, 48, Gptj, RopeScaling::Linear { factor: 2.0 }),
            true,
        ),
        // D 512 (issue 27): the streaming kernel at any query length, partial rotary.
        (paged_case(512, (4, 2), 16, &[(30, 90), (2, 2)]), cfg(1e6, 128, Neox, RopeScaling::None), true),
    ];
    let mut failed = Vec::new();
    // Every case on both kernels: the tiled prefill CTA and the streaming (decode) kernel short queries run
    // on under Auto; both rotate each query row at its position (past D 256 only the streaming one runs).
    let kernels = [PagedPrefillKernel::Tiled, PagedPrefillKernel::Streaming];
    let cases: Vec<_> = cases
        .iter()
        .flat_map(|(c, r, e)| kernels.map(|kernel| (PagedPrefillCase { kernel, ..c.clone() }, *r, *e)))
        .filter(|(c, _, _)| c.kernel == PagedPrefillKernel::Streaming || c.head_dim <= 256)
        .collect();
    for (i, (case, rope_cfg, explicit)) in cases.iter().enumerate() {
        let seed = common::case_seed(28_700 + i / 2);
        let res = verdict(match case.dtype {
            DType::Bf16 => paged_rope::<bf16>(&stream, case, rope_cfg, *explicit, seed),
            DType::F16 => paged_rope::<f16>(&stream, case, rope_cfg, *explicit, seed),
        });
        eprintln!(
            "case {i} {} rd {} {:?} {:?} explicit {explicit} (seed {seed:#x}): {res:?}",
            case.label(),
            rope_cfg.rotary_dim,
            rope_cfg.style,
            rope_cfg.scaling
        );
        if res.is_err() {
            failed.push(i);
        }
    }
    assert!(
        failed.is_empty(),
        "cases {failed:?} failed; {}",
        common::rerun("rope_prefill", "paged_prefill_rope_sweep_against_the_reference", None)
    );
}

/// Paged prefill with RoPE over a fixture's cache (its K taken as already rotated): explicit positions, or
/// each token's place in the cache.
fn paged_rope<T: Element>(
    stream: &Stream<'_>,
    case: &PagedPrefillCase,
    rope_cfg: &RopeConfig,
    explicit: bool,
    seed: u64,
) -> Result<(Check, Check), fused_attn::Error> {
    let f = PagedPrefillFixture::<T>::new(case, seed);
    let mut r = rng(seed ^ 0x5eed);
    let positions: Vec<i32> = (0..case.total_q()).map(|_| r.random_range(0..MAX_POS as i32)).collect();
    let used = if explicit { positions.iter().map(|&p| i64::from(p)).collect() } else { bottom_right(&case.seqs) };
    let table = PoisonedTable::new(rope_cfg, MAX_POS, &used)?;
    let (cos, sin) = table.views()?;
    let pv = TensorView::host(&positions, [case.total_q()])?;
    let rope = Rope {
        cos: &cos,
        sin: &sin,
        rotary_dim: rope_cfg.rotary_dim,
        style: rope_cfg.style,
        positions: explicit.then_some(&pv),
    };
    f.check_rope(stream, rope)
}

/// Cost: with RoPE, dense prefill reads q exactly once (B·Tq·Hq·D·2 bytes) and writes it nowhere, reads the
/// same K/V bytes and writes the same O as without; the table adds rotary_dim·4 bytes (rotary_dim/2 cos and
/// sin) per query row and head, explicit positions one warp-uniform int32 per row and head. Paged prefill
/// alike (q read once, per packed row).
#[test]
fn prefill_rope_reads_q_once_and_writes_it_nowhere() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let (b, tq, tk, hq, hkv, d, rd) = (2, 96, 160, 4, 2, 128, 64);
    let mut r = rng(28_800);
    let q = random::<bf16>(&mut r, b * tq * hq * d, -1.0, 1.0);
    let k = random::<bf16>(&mut r, b * tk * hkv * d, -1.0, 1.0);
    let v = random::<bf16>(&mut r, b * tk * hkv * d, -0.5, 1.5);
    let table = RopeConfig::new(1e4, rd, RopeStyle::Neox).table(MAX_POS).unwrap();
    let (cos, sin) = (
        TensorView::host(&table.cos, [MAX_POS, rd / 2]).unwrap(),
        TensorView::host(&table.sin, [MAX_POS, rd / 2]).unwrap(),
    );
    let positions: Vec<i32> = (0..(b * tq) as i32).map(|t| 3 * t).collect();
    let pv = TensorView::host(&positions, [b * tq]).unwrap();
    let rope = Rope { cos: &cos, sin: &sin, rotary_dim: rd, style: RopeStyle::Neox, positions: None };
    let mut seen = Vec::new();
    // Bidirectional: the plain and _mod kernels (a call without / with RoPE) then visit the same K/V tiles.
    for rope in [None, Some(rope), Some(Rope { positions: Some(&pv), ..rope })] {
        let mut o = vec![bf16::NAN; b * tq * hq * d];
        prefill(
            &stream,
            &TensorView::host(&q, [b, tq, hq, d]).unwrap(),
            &TensorView::host(&k, [b, tk, hkv, d]).unwrap(),
            &TensorView::host(&v, [b, tk, hkv, d]).unwrap(),
            &mut TensorViewMut::host(&mut o, [b, tq, hq, d]).unwrap(),
            None,
            &PrefillOptions { rope, ..Default::default() },
        )
        .unwrap();
        let c = emu.last_launch_counters().unwrap().kernels[0].clone();
        eprintln!(
            "prefill rope={} explicit={}: q {} bytes read, k {} v {}, table {} + {}, positions {}",
            rope.is_some(),
            rope.is_some_and(|r| r.positions.is_some()),
            c.read_of("q"),
            c.read_of("k"),
            c.read_of("v"),
            c.read_of("rope_cos"),
            c.read_of("rope_sin"),
            c.read_of("rope_positions")
        );
        assert!(o.iter().all(|x| x.is_finite()), "every output element written");
        seen.push((
            [c.read_of("q"), c.written_of("q"), c.read_of("k"), c.read_of("v"), c.written_of("o")],
            [c.read_of("rope_cos"), c.read_of("rope_sin"), c.read_of("rope_positions")],
        ));
    }
    let rows = (b * tq * hq) as u64; // query rows over all heads
    assert_eq!(seen[0].0[0], rows * (d * 2) as u64, "q not read exactly once");
    assert_eq!(seen[0].0[1], 0);
    for s in &seen[1..] {
        assert_eq!(s.0, seen[0].0, "q/k/v/o traffic differs with RoPE");
    }
    assert_eq!(seen[0].1, [0, 0, 0]);
    let half = (rd / 2 * 4) as u64;
    assert_eq!(seen[1].1, [rows * half, rows * half, 0], "the table: rotary_dim/2 cos and sin per query row");
    // Every lane of the rotating warp reads its row's position (one warp-uniform request per row on a GPU;
    // the emulator counts the lanes' bytes).
    assert_eq!(seen[2].1, [rows * half, rows * half, rows * 32 * 4], "one position per query row, head and lane");

    // Paged prefill: q read once per packed row, with and without RoPE, over the same cache bytes.
    let case = paged_case(128, (8, 2), 16, &[(20, 60), (7, 7)]);
    let f = PagedPrefillFixture::<bf16>::new(&case, 28_801);
    let cache = f.host_cache().unwrap();
    let total_q = case.total_q();
    let cu = TensorView::host(&f.cu_seqlens_q, [3]).unwrap();
    let rope_q = Rope { positions: None, ..rope };
    let mut paged = Vec::new();
    for rope in [None, Some(rope_q)] {
        let mut o = vec![bf16::NAN; total_q * 8 * d];
        fused_attn::paged_prefill(
            &stream,
            &TensorView::host(&f.q, [total_q, 8, d]).unwrap(),
            &cu,
            20,
            &cache,
            &mut TensorViewMut::host(&mut o, [total_q, 8, d]).unwrap(),
            None,
            None,
            &PagedPrefillOptions { rope, kernel: PagedPrefillKernel::Tiled, ..Default::default() },
        )
        .unwrap();
        let c = emu.last_launch_counters().unwrap().kernels[0].clone();
        paged.push((
            [c.read_of("q"), c.written_of("q"), c.read_of("k_cache"), c.read_of("v_cache"), c.written_of("o")],
            c.read_of("rope_cos") + c.read_of("rope_sin"),
        ));
    }
    let rows = (total_q * 8) as u64;
    assert_eq!(paged[0].0[0], rows * (d * 2) as u64, "paged: q not read exactly once");
    assert_eq!(paged[0].0, paged[1].0, "paged: traffic differs with RoPE");
    assert_eq!((paged[0].1, paged[1].1), (0, rows * 2 * half));
}

/// The end-to-end path: prompt K/V appended with RoPE into the cache at each token's position (16-bit and
/// FP8), then paged prefill of the last tokens (a chunk) with RoPE on q at their default positions, on the
/// tiled and the streaming kernel: against the reference over the appended cache. Poisoned table rows must
/// not leak.
#[test]
fn append_then_paged_prefill_with_rope() {
    use fused_attn::reference::check_paged_prefill;
    use fused_attn::{append_with, AppendOptions, KvCacheOf, PagedKvCache, PagedKvCacheMut};
    fn go<C: KvCacheOf<bf16> + Copy>(stream: &Stream<'_>, nan: C, scales: Option<&fused_attn::KvScales>) {
        let (ps, pages, hq, hkv, d, rd) = (8, 12, 4, 2, 64, 64);
        let seqs = [(10usize, 30usize), (16, 16)]; // (q_len, seq_len): the last q_len tokens are the chunk
        let cfg =
            RopeConfig { theta: 1e4, rotary_dim: rd, style: RopeStyle::Gptj, scaling: RopeScaling::yarn(4.0, 2048) };
        let used: Vec<i64> = (0..30).collect();
        let table = PoisonedTable::new(&cfg, 64, &used).unwrap();
        let (cos, sin) = table.views().unwrap();
        let mut r = rng(28_900);
        // Sequence 0 in pages 5, 2, 9, 0; sequence 1 in 7, 11.
        let block_table = [5i32, 2, 9, 0, 7, 11, 0, 0];
        let seq_lens = [30i32, 16];
        let tokens: usize = 46;
        let k = random::<bf16>(&mut r, tokens * hkv * d, -1.0, 1.0);
        let v = random::<bf16>(&mut r, tokens * hkv * d, -0.5, 1.5);
        let mut slots = Vec::new();
        let mut positions = Vec::new();
        for (b, &(_, len)) in seqs.iter().enumerate() {
            for t in 0..len {
                slots.push(i64::from(block_table[b * 4 + t / ps]) * ps as i64 + (t % ps) as i64);
                positions.push(t as i32);
            }
        }
        let shape = [pages, ps, hkv, d];
        let (mut kc, mut vc) = (vec![nan; pages * ps * hkv * d], vec![nan; pages * ps * hkv * d]);
        {
            let mut cache = PagedKvCacheMut::new(
                TensorViewMut::host(&mut kc, shape).unwrap(),
                TensorViewMut::host(&mut vc, shape).unwrap(),
            )
            .unwrap();
            if let Some(s) = scales {
                cache = cache.with_scales(s).unwrap();
            }
            let pv = TensorView::host(&positions, [tokens]).unwrap();
            let rope = Rope { cos: &cos, sin: &sin, rotary_dim: rd, style: cfg.style, positions: Some(&pv) };
            append_with(
                stream,
                &TensorView::host(&k, [tokens, hkv, d]).unwrap(),
                &TensorView::host(&v, [tokens, hkv, d]).unwrap(),
                &TensorView::host(&slots, [tokens]).unwrap(),
                &mut cache,
                &AppendOptions { rope: Some(rope) },
            )
            .unwrap();
        }
        let mut cache = PagedKvCache::new(
            TensorView::host(&kc, shape).unwrap(),
            TensorView::host(&vc, shape).unwrap(),
            TensorView::host(&block_table, [2, 4]).unwrap(),
            TensorView::host(&seq_lens, [2]).unwrap(),
            30,
        )
        .unwrap();
        if let Some(s) = scales {
            cache = cache.with_scales(s).unwrap();
        }
        let total_q = 26;
        let q = random::<bf16>(&mut r, total_q * hq * d, -1.0, 1.0);
        let cu = [0i32, 10, 26];
        let (qv, cuv) = (TensorView::host(&q, [total_q, hq, d]).unwrap(), TensorView::host(&cu, [3]).unwrap());
        let rope = Rope { cos: &cos, sin: &sin, rotary_dim: rd, style: cfg.style, positions: None };
        for kernel in [PagedPrefillKernel::Tiled, PagedPrefillKernel::Streaming] {
            let opts = PagedPrefillOptions { rope: Some(rope), kernel, ..Default::default() };
            let mut o = vec![bf16::NAN; total_q * hq * d];
            let mut lse = vec![f32::NAN; hq * total_q];
            fused_attn::paged_prefill(
                stream,
                &qv,
                &cuv,
                16,
                &cache,
                &mut TensorViewMut::host(&mut o, [total_q, hq, d]).unwrap(),
                Some(&mut TensorViewMut::host(&mut lse, [hq, total_q]).unwrap()),
                None,
                &opts,
            )
            .unwrap();
            let (ov, lv) =
                (TensorView::host(&o, [total_q, hq, d]).unwrap(), TensorView::host(&lse, [hq, total_q]).unwrap());
            let with = check_paged_prefill(&qv, &cuv, &cache, &ov, Some(&lv), &opts).unwrap();
            let without =
                check_paged_prefill(&qv, &cuv, &cache, &ov, Some(&lv), &PagedPrefillOptions { rope: None, ..opts })
                    .unwrap();
            eprintln!(
                "append -> paged prefill ({kernel:?}, {}): {with}; without RoPE: {without}",
                std::any::type_name::<C>()
            );
            assert!(with.passed(), "{kernel:?}: {with}");
            assert!(!without.passed(), "{kernel:?}: passes without RoPE too: {without}");
        }
    }
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    go::<bf16>(&stream, bf16::NAN, None);
    let scales = fused_attn::KvScales::per_head(&stream, &[0.02, 0.03], &[0.015, 0.01]).unwrap();
    go::<fused_attn::Fp8E4m3>(&stream, fused_attn::Fp8E4m3(0x7f), Some(&scales));
}

/// Bad positions are typed errors; the sm_90a kernel takes RoPE on q.
#[test]
fn prefill_rope_errors_are_typed() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let (tq, d, rd) = (8, 64, 64);
    let q = vec![bf16::ONE; tq * d];
    let t = RopeConfig::new(1e4, rd, RopeStyle::Neox).table(16).unwrap();
    let (cos, sin) = (TensorView::host(&t.cos, [16, rd / 2]).unwrap(), TensorView::host(&t.sin, [16, rd / 2]).unwrap());
    let good: Vec<i32> = (0..tq as i32).collect();
    let far: Vec<i32> = (0..tq as i32).map(|p| if p == 5 { 16 } else { p }).collect();
    let (gv, fv, short) = (
        TensorView::host(&good, [tq]).unwrap(),
        TensorView::host(&far, [tq]).unwrap(),
        TensorView::host(&good[..tq - 1], [tq - 1]).unwrap(),
    );
    let rope = Rope { cos: &cos, sin: &sin, rotary_dim: rd, style: RopeStyle::Neox, positions: Some(&gv) };
    let run = |opts: PrefillOptions<'_>| {
        let mut o = vec![bf16::NAN; tq * d];
        let view = TensorView::host(&q, [1, tq, 1, d]).unwrap();
        prefill(&stream, &view, &view, &view, &mut TensorViewMut::host(&mut o, [1, tq, 1, d]).unwrap(), None, &opts)
    };
    assert!(run(PrefillOptions { rope: Some(rope), ..Default::default() }).is_ok());
    let kind = |opts| run(opts).unwrap_err().kind().clone();
    fn with(r: Rope<'_>) -> PrefillOptions<'_> {
        PrefillOptions { rope: Some(r), ..Default::default() }
    }
    // The sm_90a kernel rotates q too (tests/it/rope_prefill_sm90.rs); RoPE on K it refuses (rope_prefill_k.rs).
    assert!(run(PrefillOptions { kernel: PrefillKernel::Sm90, ..with(rope) }).is_ok());
    assert_eq!(kind(with(Rope { positions: Some(&fv), ..rope })), ErrorKind::OutOfBounds);
    assert_eq!(kind(with(Rope { positions: Some(&short), ..rope })), ErrorKind::Shape);
    assert_eq!(kind(with(Rope { rotary_dim: 66, ..rope })), ErrorKind::Unsupported);
}
