//! RoPE on K fused into dense and varlen prefill (`PrefillOptions::rope_k`, docs/rope.md), on the emulator:
//!  - sweeps against the fp64 reference (which rotates q and k as the op defines it: fp32 from the table,
//!    rounded to the dtype): both layouts, full and partial rotary (20 of 80, 32 of 80, 128 of 160), the
//!    default, linear, NTK, Llama-3 and YaRN tables, explicit and default key positions (0..Tk) beside
//!    explicit and bottom-right query positions, chunked prefill and Tq > Tk, causal and bidirectional, a left
//!    window that moves the kernel's first key (the skip), a softcap beside RoPE, an empty varlen sequence,
//!    every prefill width class; and the same output judged with K unrotated must fail;
//!  - relative position: shifting every q and k position by the same offset leaves the output the same
//!    bits with a quarter-turn table and integer vectors (dense and varlen), and within the tolerance with
//!    a Llama-3 table; shifting k alone changes it;
//!  - poison: table rows no position addresses and 3 columns past rotary_dim/2 are NaN, outputs start NaN;
//!  - cost: K is read from global memory exactly as without RoPE (each K tile once per CTA that visits it)
//!    and never written; the table adds rotary_dim/2 cos and sin per rotated q row and per K row per CTA;
//!  - errors: rope_k without rope (Usage), bad key positions (Shape, OutOfBounds), the sm_90a kernel
//!    (Unsupported).

use crate::common;

use fused_attn::prefill::{prefill, prefill_varlen, PrefillKernel, PrefillOptions, TileConfig};
use fused_attn::reference::{check_prefill, check_prefill_varlen, Check};
use fused_attn::testkit::rope::PoisonedTable;
use fused_attn::testkit::seed::rng;
use fused_attn::{
    DType, Element, Emulator, ErrorKind, Rope, RopeConfig, RopeKeys, RopeScaling, RopeStyle, ScoreMod, Stream,
    TensorView, TensorViewMut,
};
use half::{bf16, f16};
use rand::Rng;

/// Table positions of every test (explicit positions are drawn below it).
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
    /// Explicit query positions (else bottom-right), explicit key positions (else 0..Tk).
    explicit_q: bool,
    explicit_k: bool,
    window: Option<(i32, i32)>,
    softcap: bool,
}

fn cfg(theta: f64, rotary_dim: usize, style: RopeStyle, scaling: RopeScaling) -> RopeConfig {
    RopeConfig { theta, rotary_dim, style, scaling }
}

fn cases() -> Vec<Case> {
    use RopeStyle::{Gptj, Neox};
    let c = |dtype, head_dim, heads, seqs: &[(usize, usize)], varlen, causal, rope, explicit: (bool, bool)| Case {
        dtype,
        head_dim,
        heads,
        seqs: seqs.to_vec(),
        varlen,
        causal,
        rope,
        explicit_q: explicit.0,
        explicit_k: explicit.1,
        window: None,
        softcap: false,
    };
    let (bf, f) = (DType::Bf16, DType::F16);
    let none = (false, false);
    vec![
        // Dense: a Llama-style prompt at d128 (the 128 x 32 _mod tile), default positions.
        c(bf, 128, (4, 2), &[(100, 100), (100, 100)], false, true, cfg(1e4, 128, Neox, RopeScaling::None), none),
        // Chunked prefill (Tq < Tk): q at Tk − Tq + i, keys at j; a ragged top K tile.
        c(f, 64, (4, 1), &[(64, 201)], false, true, cfg(1e4, 64, Gptj, RopeScaling::yarn(4.0, 2048)), none),
        // Phi-2: 32 of 80 (the 96 kernel), bidirectional, explicit q and k positions.
        c(
            bf,
            80,
            (2, 2),
            &[(70, 70), (70, 70)],
            false,
            false,
            cfg(1e4, 32, Neox, RopeScaling::Linear { factor: 2.0 }),
            (true, true),
        ),
        c(bf, 256, (2, 1), &[(40, 90)], false, true, cfg(5e5, 256, Neox, RopeScaling::llama31()), (false, true)),
        // Tq > Tk, bidirectional: the first rows' bottom-right positions are negative (clamped to 0).
        c(f, 32, (2, 2), &[(150, 100)], false, false, cfg(1e4, 32, Gptj, RopeScaling::Ntk { factor: 2.0 }), none),
        // Varlen: an empty sequence, a chunk, Llama 3.1.
        c(
            bf,
            128,
            (8, 2),
            &[(17, 17), (0, 5), (64, 150), (33, 33)],
            true,
            true,
            cfg(5e5, 128, Neox, RopeScaling::llama31()),
            none,
        ),
        c(
            f,
            160,
            (3, 1),
            &[(40, 40), (9, 100)],
            true,
            true,
            cfg(1e4, 128, Gptj, RopeScaling::yarn(8.0, 4096)),
            (true, true),
        ),
        c(
            bf,
            64,
            (2, 2),
            &[(1, 1), (70, 70), (5, 0)],
            true,
            false,
            cfg(1e4, 64, Neox, RopeScaling::None),
            (false, true),
        ),
        // Pythia / StableLM: 20 of 80.
        c(f, 80, (4, 4), &[(50, 60), (3, 80)], true, true, cfg(1e4, 20, Neox, RopeScaling::None), none),
        // A left window that hides the first keys of every row: the kernel starts the sequence at its first
        // visible key (skip = Tk − Tq − left), so the keys' default positions must count the skipped ones.
        Case {
            window: Some((30, 0)),
            ..c(bf, 96, (2, 1), &[(40, 200)], false, true, cfg(1e4, 96, Neox, RopeScaling::llama31()), none)
        },
        Case {
            window: Some((20, 0)),
            softcap: true,
            ..c(f, 128, (4, 2), &[(30, 130), (12, 12)], true, true, cfg(1e4, 64, Gptj, RopeScaling::None), (true, true))
        },
        // RoPE beside a softcap (GLM-style half rotary, interleaved), explicit q, default k.
        Case {
            softcap: true,
            ..c(bf, 128, (2, 1), &[(130, 130)], false, true, cfg(1e4, 64, Gptj, RopeScaling::None), (true, false))
        },
    ]
}

/// Random `n` elements in [lo, hi) of T.
fn random<T: Element>(r: &mut impl Rng, n: usize, lo: f64, hi: f64) -> Vec<T> {
    (0..n).map(|_| T::from_f64(r.random_range(lo..hi))).collect()
}

/// `n` random multiples of 1/4 in [-3/4, 3/4] (every product and sum of a score exact in fp32).
fn quarters(r: &mut impl Rng, n: usize) -> Vec<bf16> {
    (0..n).map(|_| bf16::from_f32(r.random_range(-3i32..=3) as f32 / 4.0)).collect()
}

/// (cu_seqlens_q, cu_seqlens_k) of `seqs`.
fn cu_seqlens(seqs: &[(usize, usize)]) -> (Vec<i32>, Vec<i32>) {
    let cu = |f: fn(&(usize, usize)) -> usize| -> Vec<i32> {
        std::iter::once(0)
            .chain(seqs.iter().scan(0, |s, x| {
                *s += f(x) as i32;
                Some(*s)
            }))
            .collect()
    };
    (cu(|s| s.0), cu(|s| s.1))
}

/// Inputs and positions of one run: `q_pos` / `k_pos` are `None` for the default positions.
struct Inputs<'a, T> {
    seqs: &'a [(usize, usize)],
    heads: (usize, usize),
    head_dim: usize,
    varlen: bool,
    q: &'a [T],
    k: &'a [T],
    v: &'a [T],
    q_pos: Option<&'a [i32]>,
    k_pos: Option<&'a [i32]>,
}

/// Runs prefill with RoPE on q and k (`base` gives the rest of the options; outputs start NaN) and returns
/// `o`, and the verdicts of the reference with the call's options and with K unrotated.
fn run<T: Element>(
    stream: &Stream<'_>,
    inp: &Inputs<'_, T>,
    table: (&TensorView<'_, f32, 2>, &TensorView<'_, f32, 2>),
    rope_cfg: &RopeConfig,
    base: PrefillOptions<'_>,
) -> Result<(Vec<T>, Check, Check), fused_attn::Error> {
    let ((hq, hkv), d) = (inp.heads, inp.head_dim);
    let rows_q: usize = inp.seqs.iter().map(|s| s.0).sum();
    let rows_k: usize = inp.seqs.iter().map(|s| s.1).sum();
    let qp = inp.q_pos.map(|p| TensorView::host(p, [rows_q])).transpose()?;
    let kp = inp.k_pos.map(|p| TensorView::host(p, [rows_k])).transpose()?;
    let rope = Rope {
        cos: table.0,
        sin: table.1,
        rotary_dim: rope_cfg.rotary_dim,
        style: rope_cfg.style,
        positions: qp.as_ref(),
    };
    let opts = PrefillOptions { rope: Some(rope), rope_k: Some(RopeKeys { positions: kp.as_ref() }), ..base };
    let unrotated_k = PrefillOptions { rope_k: None, ..opts };
    let mut o = vec![T::nan(); rows_q * hq * d];
    let mut lse = vec![f32::NAN; hq * rows_q];
    if inp.varlen {
        let (cq, ck) = cu_seqlens(inp.seqs);
        let b = inp.seqs.len();
        let max_q = inp.seqs.iter().map(|s| s.0).max().unwrap_or(0);
        let max_k = inp.seqs.iter().map(|s| s.1).max().unwrap_or(0);
        let (qv, kv, vv) = (
            TensorView::host(inp.q, [rows_q, hq, d])?,
            TensorView::host(inp.k, [rows_k, hkv, d])?,
            TensorView::host(inp.v, [rows_k, hkv, d])?,
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
        let (with, without) = (check(&opts)?, check(&unrotated_k)?);
        Ok((o, with, without))
    } else {
        let (b, (tq, tk)) = (inp.seqs.len(), inp.seqs[0]);
        let (qv, kv, vv) = (
            TensorView::host(inp.q, [b, tq, hq, d])?,
            TensorView::host(inp.k, [b, tk, hkv, d])?,
            TensorView::host(inp.v, [b, tk, hkv, d])?,
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
        let (with, without) = (check(&opts)?, check(&unrotated_k)?);
        Ok((o, with, without))
    }
}

/// The bottom-right position of every query row and the default position of every key (sequence by
/// sequence): row i of (Tq, Tk) at i + Tk − Tq, key j at j.
fn default_positions(seqs: &[(usize, usize)]) -> (Vec<i64>, Vec<i64>) {
    let q = seqs.iter().flat_map(|&(tq, tk)| (0..tq).map(move |i| i as i64 + tk as i64 - tq as i64)).collect();
    let k = seqs.iter().flat_map(|&(_, tk)| 0..tk as i64).collect();
    (q, k)
}

/// Runs one sweep case (NaN-poisoned outputs and table): it must pass the reference, and fail it when
/// judged with K unrotated.
fn run_case<T: Element>(stream: &Stream<'_>, c: &Case, seed: u64) -> Result<String, String> {
    let mut r = rng(seed);
    let ((hq, hkv), d) = (c.heads, c.head_dim);
    let rows_q: usize = c.seqs.iter().map(|s| s.0).sum();
    let rows_k: usize = c.seqs.iter().map(|s| s.1).sum();
    let q = random::<T>(&mut r, rows_q * hq * d, -1.0, 1.0);
    let k = random::<T>(&mut r, rows_k * hkv * d, -1.0, 1.0);
    let v = random::<T>(&mut r, rows_k * hkv * d, -0.5, 1.5);
    let q_pos: Vec<i32> = (0..rows_q).map(|_| r.random_range(0..MAX_POS as i32)).collect();
    let k_pos: Vec<i32> = (0..rows_k).map(|_| r.random_range(0..MAX_POS as i32)).collect();
    let (dq, dk) = default_positions(&c.seqs);
    let wide = |p: &[i32]| p.iter().map(|&x| i64::from(x)).collect::<Vec<i64>>();
    let mut used = if c.explicit_q { wide(&q_pos) } else { dq };
    used.extend(if c.explicit_k { wide(&k_pos) } else { dk });
    let table = PoisonedTable::new(&c.rope, MAX_POS, &used).map_err(|e| e.to_string())?;
    let (cos, sin) = table.views().map_err(|e| e.to_string())?;
    let inp = Inputs {
        seqs: &c.seqs,
        heads: c.heads,
        head_dim: d,
        varlen: c.varlen,
        q: &q,
        k: &k,
        v: &v,
        q_pos: c.explicit_q.then_some(&q_pos[..]),
        k_pos: c.explicit_k.then_some(&k_pos[..]),
    };
    let score_mod = ScoreMod { softcap: c.softcap.then_some(30.0), window: c.window, ..Default::default() };
    let base = PrefillOptions { causal: c.causal, score_mod, ..Default::default() };
    let (o, with, without) =
        run(stream, &inp, (&cos, &sin), &c.rope, base).map_err(|e| format!("failed to run: {e}"))?;
    if o.iter().any(|x| !x.to_f64().is_finite()) {
        return Err("an output element is not finite (unwritten, or a poisoned read)".into());
    }
    crate::rope::with_and_without(with, without)
}

#[test]
fn prefill_rope_k_sweep_against_the_reference() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let mut failed = Vec::new();
    for (i, c) in cases().iter().enumerate() {
        if !common::case_selected(i) {
            continue;
        }
        let seed = common::case_seed(28_650 + i);
        let res = match c.dtype {
            DType::Bf16 => run_case::<bf16>(&stream, c, seed),
            DType::F16 => run_case::<f16>(&stream, c, seed),
        };
        eprintln!("case {i} {c:?} (seed {seed:#x}): {res:?}");
        if res.is_err() {
            failed.push(i);
        }
    }
    assert!(
        failed.is_empty(),
        "cases {failed:?} failed; {}",
        common::rerun("rope_prefill_k", "prefill_rope_k_sweep_against_the_reference", None)
    );
}

/// Relative position: with q and k rotated in the kernel, the output depends only on the positions'
/// differences. Exactly, with a table of quarter turns (pair i turns by (i + 1)·π/2 per position: cos, sin
/// in {0, ±1}, so rotation permutes and negates) and integer vectors (every score exact in fp32): shifting
/// every q and k position by s gives the same output bits, dense and varlen, both layouts. With Llama 3.1's
/// table and random vectors, the shifted outputs stay within the reference's tolerance of each other (and
/// each passes the reference). Shifting k alone changes the output.
#[test]
fn prefill_rope_k_output_depends_only_on_relative_positions() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let (hq, hkv, d, rd) = (4, 2, 64, 48);
    let mut r = rng(common::case_seed(28_680));
    for (varlen, seqs) in [(false, vec![(70usize, 70usize)]), (true, vec![(20, 50), (45, 45)])] {
        let rows_q: usize = seqs.iter().map(|s| s.0).sum();
        let rows_k: usize = seqs.iter().map(|s| s.1).sum();
        let (dq, dk) = default_positions(&seqs);
        let shifted = |p: &[i64], s: i64| p.iter().map(|&x| (x + s) as i32).collect::<Vec<i32>>();
        for style in [RopeStyle::Neox, RopeStyle::Gptj] {
            let half = rd / 2;
            // Quarter turns, exactly; integer vectors.
            let max_pos = 256;
            let quarter = [(1.0f32, 0.0f32), (0.0, 1.0), (-1.0, 0.0), (0.0, -1.0)];
            let (mut cos, mut sin) = (vec![0f32; max_pos * half], vec![0f32; max_pos * half]);
            for p in 0..max_pos {
                for i in 0..half {
                    (cos[p * half + i], sin[p * half + i]) = quarter[(p * (i + 1)) % 4];
                }
            }
            let (cv, sv) =
                (TensorView::host(&cos, [max_pos, half]).unwrap(), TensorView::host(&sin, [max_pos, half]).unwrap());
            let (q, k) = (quarters(&mut r, rows_q * hq * d), quarters(&mut r, rows_k * hkv * d));
            let v = random::<bf16>(&mut r, rows_k * hkv * d, -0.5, 1.5);
            let cfg = RopeConfig::new(1e4, rd, style); // rotary_dim and style only (the table is the quarter turns)
            let at = |sq: i64, sk: i64| {
                let (qp, kp) = (shifted(&dq, sq), shifted(&dk, sk));
                let inp = Inputs {
                    seqs: &seqs,
                    heads: (hq, hkv),
                    head_dim: d,
                    varlen,
                    q: &q,
                    k: &k,
                    v: &v,
                    q_pos: Some(&qp),
                    k_pos: Some(&kp),
                };
                let opts = PrefillOptions { causal: true, ..Default::default() };
                run(&stream, &inp, (&cv, &sv), &cfg, opts).unwrap()
            };
            let bits = |o: &[bf16]| o.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let (base, with, without) = at(0, 0);
            assert!(with.passed(), "varlen {varlen} {style:?}: {with}");
            assert!(!without.passed(), "varlen {varlen} {style:?}: passes with K unrotated: {without}");
            for s in [1, 2, 3, 17, 101] {
                assert_eq!(bits(&base), bits(&at(s, s).0), "varlen {varlen} {style:?}: shift {s} changed the output");
            }
            assert_ne!(bits(&base), bits(&at(0, 1).0), "varlen {varlen} {style:?}: shifting k alone changed nothing");

            // Llama 3.1's table, random vectors: within the reference's tolerance.
            let cfg = RopeConfig { theta: 500000.0, rotary_dim: rd, style, scaling: RopeScaling::llama31() };
            let max_pos = 20000;
            let t = cfg.table(max_pos).unwrap();
            let (cv, sv) = (
                TensorView::host(&t.cos, [max_pos, half]).unwrap(),
                TensorView::host(&t.sin, [max_pos, half]).unwrap(),
            );
            let q = random::<bf16>(&mut r, rows_q * hq * d, -1.0, 1.0);
            let k = random::<bf16>(&mut r, rows_k * hkv * d, -1.0, 1.0);
            let at = |s: i64| {
                let (qp, kp) = (shifted(&dq, s), shifted(&dk, s));
                let inp = Inputs {
                    seqs: &seqs,
                    heads: (hq, hkv),
                    head_dim: d,
                    varlen,
                    q: &q,
                    k: &k,
                    v: &v,
                    q_pos: Some(&qp),
                    k_pos: Some(&kp),
                };
                run(&stream, &inp, (&cv, &sv), &cfg, PrefillOptions { causal: true, ..Default::default() }).unwrap()
            };
            let (base, with, _) = at(0);
            assert!(with.passed(), "varlen {varlen} {style:?} llama3: {with}");
            for s in [1000, 9000, 19000] {
                let (o, with, _) = at(s);
                assert!(with.passed(), "varlen {varlen} {style:?} llama3 shift {s}: {with}");
                let diff = o.iter().zip(&base).map(|(a, b)| (a.to_f64() - b.to_f64()).abs()).fold(0.0, f64::max);
                assert!(
                    diff <= with.out.tolerance,
                    "varlen {varlen} {style:?} llama3 shift {s}: outputs differ by {diff:.2e} (tolerance {:.2e})",
                    with.out.tolerance
                );
            }
        }
    }
}

/// Cost: with RoPE on q and k, dense prefill reads q exactly once and K, V exactly as without RoPE (each K
/// tile once per CTA that visits it), writes neither, and writes the same O; the table adds rotary_dim/2 cos
/// and sin per query row and head and per K row each CTA rotates (bidirectional: every CTA visits every key;
/// Br query rows per CTA); explicit key positions are one warp-uniform int32 per rotated K row and lane.
#[test]
fn prefill_rope_k_reads_k_once_and_writes_it_nowhere() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let (b, tq, tk, hq, hkv, d, rd) = (2, 96, 160, 4, 2, 128, 64);
    let mut r = rng(28_690);
    let q = random::<bf16>(&mut r, b * tq * hq * d, -1.0, 1.0);
    let k = random::<bf16>(&mut r, b * tk * hkv * d, -1.0, 1.0);
    let v = random::<bf16>(&mut r, b * tk * hkv * d, -0.5, 1.5);
    let table = RopeConfig::new(1e4, rd, RopeStyle::Neox).table(MAX_POS).unwrap();
    let (cos, sin) = (
        TensorView::host(&table.cos, [MAX_POS, rd / 2]).unwrap(),
        TensorView::host(&table.sin, [MAX_POS, rd / 2]).unwrap(),
    );
    let k_positions: Vec<i32> = (0..(b * tk) as i32).map(|t| 2 * t + 1).collect();
    let kpv = TensorView::host(&k_positions, [b * tk]).unwrap();
    let rope = Rope { cos: &cos, sin: &sin, rotary_dim: rd, style: RopeStyle::Neox, positions: None };
    let mut seen = Vec::new();
    let keys = [None, Some(RopeKeys { positions: None }), Some(RopeKeys { positions: Some(&kpv) })];
    // Bidirectional: the plain and _mod kernels visit the same K/V tiles. First without RoPE at all.
    for (rope, rope_k) in [(None, None), (Some(rope), keys[0]), (Some(rope), keys[1]), (Some(rope), keys[2])] {
        let mut o = vec![bf16::NAN; b * tq * hq * d];
        prefill(
            &stream,
            &TensorView::host(&q, [b, tq, hq, d]).unwrap(),
            &TensorView::host(&k, [b, tk, hkv, d]).unwrap(),
            &TensorView::host(&v, [b, tk, hkv, d]).unwrap(),
            &mut TensorViewMut::host(&mut o, [b, tq, hq, d]).unwrap(),
            None,
            &PrefillOptions { rope, rope_k, ..Default::default() },
        )
        .unwrap();
        let c = emu.last_launch_counters().unwrap().kernels[0].clone();
        eprintln!(
            "prefill rope={} rope_k={:?}: q {} bytes read, k {} v {}, table {} + {}, k positions {}",
            rope.is_some(),
            rope_k,
            c.read_of("q"),
            c.read_of("k"),
            c.read_of("v"),
            c.read_of("rope_cos"),
            c.read_of("rope_sin"),
            c.read_of("rope_k_positions")
        );
        assert!(o.iter().all(|x| x.is_finite()), "every output element written");
        seen.push((
            [c.read_of("q"), c.written_of("q"), c.read_of("k"), c.written_of("k"), c.read_of("v"), c.written_of("o")],
            [c.read_of("rope_cos"), c.read_of("rope_sin"), c.read_of("rope_k_positions")],
        ));
    }
    let q_rows = (b * tq * hq) as u64; // query rows over all heads
    assert_eq!(seen[0].0[0], q_rows * (d * 2) as u64, "q not read exactly once");
    assert_eq!((seen[0].0[1], seen[0].0[3]), (0, 0));
    // Each CTA (query tile, query head, sequence) reads every K row once.
    let br = TileConfig::for_kernel(d, true).unwrap().block_m;
    let ctas = (b * tq.div_ceil(br) * hq) as u64;
    assert_eq!(seen[0].0[2], ctas * (tk * d * 2) as u64, "K not read once per CTA");
    for s in &seen[1..] {
        assert_eq!(s.0, seen[0].0, "q/k/v/o traffic differs with RoPE");
    }
    let half = (rd / 2 * 4) as u64;
    let k_rows = ctas * tk as u64; // K rows rotated over all CTAs
    assert_eq!(seen[1].1, [q_rows * half, q_rows * half, 0], "q only: rotary_dim/2 cos and sin per query row");
    let both = (q_rows + k_rows) * half;
    assert_eq!(seen[2].1, [both, both, 0], "q and k: rotary_dim/2 cos and sin per query row and per K row and CTA");
    // Every lane of the rotating warp reads its row's position (one warp-uniform request per row on a GPU;
    // the emulator counts the lanes' bytes).
    assert_eq!(seen[3].1, [both, both, k_rows * 32 * 4], "one key position per K row, CTA and lane");
}

/// rope_k without rope is a Usage error; key positions of the wrong length a Shape error, outside the table
/// OutOfBounds (naming them); the sm_90a kernel refuses RoPE on K (Unsupported), all before any launch.
#[test]
fn prefill_rope_k_errors_are_typed() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let (tq, tk, d, rd) = (8, 12, 64, 64);
    let q = vec![bf16::ONE; tq * d];
    let kv = vec![bf16::ONE; tk * d];
    let t = RopeConfig::new(1e4, rd, RopeStyle::Neox).table(16).unwrap();
    let (cos, sin) = (TensorView::host(&t.cos, [16, rd / 2]).unwrap(), TensorView::host(&t.sin, [16, rd / 2]).unwrap());
    let good: Vec<i32> = (0..tk as i32).collect();
    let far: Vec<i32> = (0..tk as i32).map(|p| if p == 5 { 16 } else { p }).collect();
    let (gv, fv, short) = (
        TensorView::host(&good, [tk]).unwrap(),
        TensorView::host(&far, [tk]).unwrap(),
        TensorView::host(&good[..tq], [tq]).unwrap(),
    );
    let rope = Rope { cos: &cos, sin: &sin, rotary_dim: rd, style: RopeStyle::Neox, positions: None };
    let run = |opts: PrefillOptions<'_>| {
        let mut o = vec![bf16::NAN; tq * d];
        let (qv, kvv) = (TensorView::host(&q, [1, tq, 1, d]).unwrap(), TensorView::host(&kv, [1, tk, 1, d]).unwrap());
        prefill(&stream, &qv, &kvv, &kvv, &mut TensorViewMut::host(&mut o, [1, tq, 1, d]).unwrap(), None, &opts)
    };
    let with =
        |positions| PrefillOptions { rope: Some(rope), rope_k: Some(RopeKeys { positions }), ..Default::default() };
    assert!(run(with(Some(&gv))).is_ok());
    let err = |opts| run(opts).unwrap_err();
    assert_eq!(err(PrefillOptions { rope: None, ..with(None) }).kind().clone(), ErrorKind::Usage);
    let e = err(with(Some(&fv)));
    assert_eq!(e.kind().clone(), ErrorKind::OutOfBounds);
    assert!(e.to_string().contains("rope_k_positions"), "{e}");
    assert_eq!(err(with(Some(&short))).kind().clone(), ErrorKind::Shape);
    assert_eq!(
        err(PrefillOptions { kernel: PrefillKernel::Sm90, ..with(None) }).kind().clone(),
        ErrorKind::Unsupported
    );
}
