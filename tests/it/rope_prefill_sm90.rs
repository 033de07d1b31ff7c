//! RoPE on q in the sm_90a prefill kernel (kernels/include/fa/hopper/rope_q.cuh, docs/rope.md), forced with
//! `PrefillKernel::Sm90` on the emulator (every check active: races, the async-proxy fence, wgmma/TMA/mbarrier
//! misuse, bounds), on 3 emulated SMs so that every CTA walks several work tiles:
//!  - a sweep against the fp64 reference over D 64 (three consumers, Br 192), D 128 (both tiles: causal
//!    128 × 128, unmasked 128 × 176) and D 256; NeoX and GPT-J, full and partial rotary, the default, linear,
//!    NTK, Llama-3 and YaRN tables, explicit and bottom-right positions (chunks, Tq > Tk's clamped negative
//!    ones), dense and varlen (an empty sequence, sequences across the tile edges), RoPE beside a softcap
//!    and a window; each case judged without RoPE must fail, must match the sm_80 kernel's output within
//!    the reference tolerance, and must be bit for bit the sm90 kernel's output over q rotated on the host
//!    by the Rust model (`rope::rotate_row_f32`, the rotation every RoPE path computes);
//!  - relative position: with q rotated in the kernel and k by the model, shifting every position leaves
//!    the output bits unchanged (quarter-turn table, quarter vectors), shifting q alone does not;
//!  - poison: table rows no position addresses and 3 columns past rotary_dim/2 are NaN, outputs start NaN;
//!    explicit positions are exactly as long as q (a rotated padding row would read past them);
//!  - cost: q read exactly once and never written, K/V/O traffic and the TMA prefetch-slack counters as
//!    without RoPE, the table exactly rotary_dim/2 cos and sin per query row and head.
use crate::common;

use std::time::Instant;

use fused_attn::prefill::{prefill, prefill_varlen, PrefillKernel, PrefillOptions};
use fused_attn::reference::{check_prefill, check_prefill_varlen, Check};
use fused_attn::rope::{rotate_row_f32, table_row};
use fused_attn::testkit::rope::PoisonedTable;
use fused_attn::testkit::seed::rng;
use fused_attn::{
    DType, Element, Emulator, ErrorKind, Rope, RopeConfig, RopeKeys, RopeScaling, RopeStyle, ScoreMod, Stream,
    TensorView, TensorViewMut,
};
use half::{bf16, f16};
use rand::Rng;

/// Table positions of every test (explicit positions are drawn below it; bottom-right ones lie below it).
const MAX_POS: usize = 4096;
/// Emulated SMs: fewer CTAs than work tiles, so the persistent loop carries the Q barriers across tiles.
const SMS: usize = 3;

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
    /// A softcap and a sliding window beside RoPE.
    variants: bool,
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
        variants: false,
    };
    let (bf, f) = (DType::Bf16, DType::F16);
    vec![
        // D 128, causal (128 x 128): two query tiles, bottom-right positions, GQA.
        c(bf, 128, (4, 2), &[(130, 130), (130, 130)], false, true, cfg(1e4, 128, Neox, RopeScaling::None), false),
        // D 64 (three consumers, Br 192): a chunk (Tq < Tk) across the tile edge, positions from Tk − Tq.
        c(f, 64, (2, 1), &[(193, 260)], false, false, cfg(1e4, 64, Gptj, RopeScaling::yarn(4.0, 2048)), false),
        // D 128 unmasked (128 x 176), half rotary, explicit positions.
        c(bf, 128, (2, 2), &[(150, 300)], false, false, cfg(5e5, 64, Neox, RopeScaling::llama31()), true),
        c(
            f,
            256,
            (2, 1),
            &[(70, 90), (70, 90)],
            false,
            true,
            cfg(1e4, 256, Neox, RopeScaling::Linear { factor: 2.0 }),
            true,
        ),
        // Tq > Tk, bidirectional: the first rows' bottom-right positions are negative (clamped to 0).
        c(bf, 64, (2, 2), &[(200, 100)], false, false, cfg(1e4, 32, Gptj, RopeScaling::Ntk { factor: 2.0 }), false),
        // Varlen: an empty sequence, a chunk, a sequence over two query tiles.
        c(
            bf,
            128,
            (4, 2),
            &[(17, 17), (0, 5), (140, 150), (33, 33)],
            true,
            true,
            cfg(5e5, 128, Neox, RopeScaling::llama31()),
            false,
        ),
        c(
            f,
            128,
            (3, 1),
            &[(40, 40), (9, 100), (130, 130)],
            true,
            false,
            cfg(1e4, 128, Gptj, RopeScaling::yarn(8.0, 4096)),
            true,
        ),
        c(bf, 64, (2, 1), &[(1, 1), (192, 192), (193, 250)], true, true, cfg(1e4, 48, Neox, RopeScaling::None), true),
        c(
            f,
            256,
            (2, 2),
            &[(20, 20), (0, 3), (70, 129)],
            true,
            true,
            cfg(1e4, 160, Gptj, RopeScaling::Ntk { factor: 4.0 }),
            false,
        ),
        // RoPE beside a softcap and a sliding window (GLM-style half rotary, interleaved).
        Case {
            variants: true,
            ..c(bf, 128, (2, 1), &[(140, 140)], false, true, cfg(1e4, 64, Gptj, RopeScaling::None), true)
        },
        Case {
            variants: true,
            ..c(f, 64, (2, 1), &[(50, 80), (200, 210)], true, true, cfg(1e4, 64, Neox, RopeScaling::llama31()), false)
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

/// q rotated by the model: token t's heads at table row `positions[t]` of (cos, sin) `[max_pos, cols]`, in
/// fp32, rounded to T (what the kernels hold in shared memory).
fn rotate_q<T: Element>(
    q: &[T],
    heads: usize,
    d: usize,
    rope: &RopeConfig,
    table: (&[f32], &[f32], usize),
    positions: &[i64],
) -> Vec<T> {
    let (cos, sin, cols) = table;
    let max_pos = cos.len() / cols;
    let mut out = q.to_vec();
    for (t, &pos) in positions.iter().enumerate() {
        let row = table_row(pos, max_pos).unwrap();
        for h in 0..heads {
            let x = &mut out[(t * heads + h) * d..][..d];
            let mut f: Vec<f32> = x.iter().map(|v| v.to_f64() as f32).collect();
            rotate_row_f32(&mut f, rope.rotary_dim, rope.style, |i| (cos[row * cols + i], sin[row * cols + i]));
            // Rounded from f32 (half's bf16::from_f64 truncates an f64 to 32 bits first, so it does not
            // round an f32 value correctly); the rounded value is exact in T.
            for (o, v) in x.iter_mut().zip(&f) {
                *o = T::from_f64(T::DTYPE.round(f64::from(*v)));
            }
        }
    }
    out
}

/// The inputs of one prefill call (dense: every sequence alike).
struct Inputs<'a, T> {
    seqs: &'a [(usize, usize)],
    heads: (usize, usize),
    head_dim: usize,
    varlen: bool,
    q: &'a [T],
    k: &'a [T],
    v: &'a [T],
}

/// Output, LSE and the reference's verdicts with `opts` and with `judge` (None: not judged).
struct Run<T> {
    o: Vec<T>,
    lse: Vec<f32>,
    checks: Option<(Check, Check)>,
}

fn run<T: Element>(
    stream: &Stream<'_>,
    inp: &Inputs<'_, T>,
    opts: &PrefillOptions<'_>,
    judge: Option<(&PrefillOptions<'_>, &PrefillOptions<'_>)>,
) -> Result<Run<T>, fused_attn::Error> {
    let ((hq, hkv), d, seqs) = (inp.heads, inp.head_dim, inp.seqs);
    let rows_q: usize = seqs.iter().map(|s| s.0).sum();
    let rows_k: usize = seqs.iter().map(|s| s.1).sum();
    let mut o = vec![T::nan(); rows_q * hq * d];
    let mut lse = vec![f32::NAN; hq * rows_q];
    let checks = if inp.varlen {
        let (cq, ck) = cu_seqlens(seqs);
        let b = seqs.len();
        let (max_q, max_k) = (seqs.iter().map(|s| s.0).max().unwrap(), seqs.iter().map(|s| s.1).max().unwrap());
        let (qv, kv, vv) = (
            TensorView::host(inp.q, [rows_q, hq, d])?,
            TensorView::host(inp.k, [rows_k, hkv, d])?,
            TensorView::host(inp.v, [rows_k, hkv, d])?,
        );
        let (cqv, ckv) = (TensorView::host(&cq, [b + 1])?, TensorView::host(&ck, [b + 1])?);
        let mut ov = TensorViewMut::host(&mut o, [rows_q, hq, d])?;
        let mut lv = TensorViewMut::host(&mut lse, [hq, rows_q])?;
        prefill_varlen(stream, &qv, &kv, &vv, &cqv, &ckv, max_q, max_k, &mut ov, Some(&mut lv), opts)?;
        match judge {
            None => None,
            Some((with, without)) => {
                let (ov, lv) = (TensorView::host(&o, [rows_q, hq, d])?, TensorView::host(&lse, [hq, rows_q])?);
                let check = |opts| check_prefill_varlen(&qv, &kv, &vv, &cqv, &ckv, &ov, Some(&lv), opts);
                Some((check(with)?, check(without)?))
            }
        }
    } else {
        let (b, (tq, tk)) = (seqs.len(), seqs[0]);
        let (qv, kv, vv) = (
            TensorView::host(inp.q, [b, tq, hq, d])?,
            TensorView::host(inp.k, [b, tk, hkv, d])?,
            TensorView::host(inp.v, [b, tk, hkv, d])?,
        );
        let mut ov = TensorViewMut::host(&mut o, [b, tq, hq, d])?;
        let mut lv = TensorViewMut::host(&mut lse, [b, hq, tq])?;
        prefill(stream, &qv, &kv, &vv, &mut ov, Some(&mut lv), opts)?;
        match judge {
            None => None,
            Some((with, without)) => {
                let (ov, lv) = (TensorView::host(&o, [b, tq, hq, d])?, TensorView::host(&lse, [b, hq, tq])?);
                let check = |opts| check_prefill(&qv, &kv, &vv, &ov, Some(&lv), opts);
                Some((check(with)?, check(without)?))
            }
        }
    };
    Ok(Run { o, lse, checks })
}

/// The kernel the emulator's last launch ran.
fn last_kernel(emu: &Emulator) -> String {
    emu.last_launch_counters().map(|c| c.kernels[0].kernel.clone()).unwrap_or_default()
}

fn bits<T: Element>(x: &[T]) -> Vec<u64> {
    x.iter().map(|v| v.to_f64().to_bits()).collect()
}

/// One sweep case on the sm90 kernel: against the reference (with RoPE it passes, judged without it fails),
/// against the sm_80 kernel (within the tolerance), and bit for bit against the sm90 kernel without RoPE
/// over q rotated by the model.
fn run_case<T: Element>(emu: &Emulator, c: &Case, seed: u64) -> Result<String, String> {
    let stream = Stream::Emu(emu);
    let e = |e: fused_attn::Error| format!("failed to run: {e}");
    let mut r = rng(seed);
    let ((hq, hkv), d) = (c.heads, c.head_dim);
    let rows_q: usize = c.seqs.iter().map(|s| s.0).sum();
    let rows_k: usize = c.seqs.iter().map(|s| s.1).sum();
    let q = random::<T>(&mut r, rows_q * hq * d, -1.0, 1.0);
    let k = random::<T>(&mut r, rows_k * hkv * d, -1.0, 1.0);
    let v = random::<T>(&mut r, rows_k * hkv * d, -0.5, 1.5);
    let positions: Vec<i32> = (0..rows_q).map(|_| r.random_range(0..MAX_POS as i32)).collect();
    let used = if c.explicit { positions.iter().map(|&p| i64::from(p)).collect() } else { bottom_right(&c.seqs) };
    let table = PoisonedTable::new(&c.rope, MAX_POS, &used).map_err(e)?;
    let (cos, sin) = table.views().map_err(e)?;
    let pv = TensorView::host(&positions, [rows_q]).map_err(e)?;
    let rope = Rope {
        cos: &cos,
        sin: &sin,
        rotary_dim: c.rope.rotary_dim,
        style: c.rope.style,
        positions: c.explicit.then_some(&pv),
    };
    let score_mod = if c.variants {
        ScoreMod { softcap: Some(30.0), window: Some((90, 0)), ..Default::default() }
    } else {
        ScoreMod::default()
    };
    let opts = PrefillOptions {
        causal: c.causal,
        score_mod,
        rope: Some(rope),
        kernel: PrefillKernel::Sm90,
        ..Default::default()
    };
    let without = PrefillOptions { rope: None, ..opts };
    let inp = Inputs { seqs: &c.seqs, heads: c.heads, head_dim: d, varlen: c.varlen, q: &q, k: &k, v: &v };

    let sm90 = run(&stream, &inp, &opts, Some((&opts, &without))).map_err(e)?;
    let kernel = last_kernel(emu);
    if !kernel.starts_with("fa_prefill_sm90") {
        return Err(format!("ran {kernel} instead of the sm90 kernel"));
    }
    let (with, unrotated) = sm90.checks.unwrap();
    let summary = crate::rope::with_and_without(with, unrotated)?;

    // The sm_80 kernel's output: within the reference tolerance of the sm90 kernel's.
    let sm80 = run(&stream, &inp, &PrefillOptions { kernel: PrefillKernel::Sm80, ..opts }, None).map_err(e)?;
    let diff = sm90.o.iter().zip(&sm80.o).map(|(a, b)| (a.to_f64() - b.to_f64()).abs()).fold(0.0, f64::max);
    if diff.is_nan() || diff > with.out.tolerance {
        return Err(format!("sm90 and sm80 outputs differ by {diff:.2e} (tolerance {:.2e})", with.out.tolerance));
    }

    // q rotated by the model, then the same sm90 kernel without RoPE: the same bits.
    let rotated = rotate_q(&q, hq, d, &c.rope, (&table.cos, &table.sin, table.cols), &used);
    let pre = Inputs { q: &rotated, ..inp };
    let host = run(&stream, &pre, &without, None).map_err(e)?;
    let lse_bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    if bits(&host.o) != bits(&sm90.o) || lse_bits(&host.lse) != lse_bits(&sm90.lse) {
        let n = host.o.iter().zip(&sm90.o).filter(|(a, b)| a.to_f64().to_bits() != b.to_f64().to_bits()).count();
        return Err(format!("{n} output elements differ from the kernel over q rotated by the model"));
    }
    Ok(format!("{summary}; |sm90 - sm80| {diff:.2e}; bit for bit the model's rotation"))
}

#[test]
fn emulated_sm90_rope_sweep() {
    let emu = Emulator::new().with_multiprocessors(SMS);
    let cases = cases();
    let start = Instant::now();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failed = std::sync::Mutex::new(Vec::new());
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(c) = cases.get(i) else { break };
                if !common::case_selected(i) {
                    continue;
                }
                let seed = common::case_seed(28_900 + i);
                let res = match c.dtype {
                    DType::Bf16 => run_case::<bf16>(&emu, c, seed),
                    DType::F16 => run_case::<f16>(&emu, c, seed),
                };
                eprintln!("case {i} {c:?} (seed {seed:#x}): {res:?}");
                if res.is_err() {
                    failed.lock().unwrap().push(i);
                }
            });
        }
    });
    eprintln!("emulated_sm90_rope_sweep: {} cases in {:.1} s", cases.len(), start.elapsed().as_secs_f64());
    let failed = failed.into_inner().unwrap();
    assert!(
        failed.is_empty(),
        "cases {failed:?} failed; {}",
        common::rerun("rope_prefill_sm90", "emulated_sm90_rope_sweep", None)
    );
}

/// `n` random multiples of 1/4 in [-3/4, 3/4] (every product and sum of a score exact in fp32).
fn quarters(r: &mut impl Rng, n: usize) -> Vec<bf16> {
    (0..n).map(|_| bf16::from_f32(r.random_range(-3i32..=3) as f32 / 4.0)).collect()
}

/// Relative position: q rotated by the sm90 kernel at explicit positions, k by the model at its keys'
/// positions, both shifted by s: the output depends only on the differences. Exactly, with a table of quarter
/// turns (pair i turns by (i + 1)·π/2 per position: cos, sin in {0, ±1}, so rotation permutes and negates)
/// and quarter vectors (every score exact in fp32): the same output bits for every shift, dense and varlen,
/// both layouts; shifting q alone changes them.
#[test]
fn emulated_sm90_rope_output_depends_only_on_relative_positions() {
    let emu = Emulator::new().with_multiprocessors(SMS);
    let stream = Stream::Emu(&emu);
    let (hq, hkv, d, rd) = (4, 2, 64, 48);
    let half = rd / 2;
    let mut r = rng(common::case_seed(28_950));
    let max_pos = 512;
    let quarter = [(1.0f32, 0.0f32), (0.0, 1.0), (-1.0, 0.0), (0.0, -1.0)];
    let (mut cos, mut sin) = (vec![0f32; max_pos * half], vec![0f32; max_pos * half]);
    for p in 0..max_pos {
        for i in 0..half {
            (cos[p * half + i], sin[p * half + i]) = quarter[(p * (i + 1)) % 4];
        }
    }
    let (cv, sv) = (TensorView::host(&cos, [max_pos, half]).unwrap(), TensorView::host(&sin, [max_pos, half]).unwrap());
    for (varlen, seqs) in [(false, vec![(200usize, 200usize)]), (true, vec![(20, 50), (195, 195)])] {
        let rows_q: usize = seqs.iter().map(|s| s.0).sum();
        let rows_k: usize = seqs.iter().map(|s| s.1).sum();
        let q_pos = bottom_right(&seqs);
        let k_pos: Vec<i64> = seqs.iter().flat_map(|&(_, tk)| 0..tk as i64).collect();
        for style in [RopeStyle::Neox, RopeStyle::Gptj] {
            let cfg = RopeConfig::new(1e4, rd, style); // rotary_dim and style only (the table is the quarter turns)
            let (q, k) = (quarters(&mut r, rows_q * hq * d), quarters(&mut r, rows_k * hkv * d));
            let v = random::<bf16>(&mut r, rows_k * hkv * d, -0.5, 1.5);
            let at = |sq: i64, sk: i64| {
                let qp: Vec<i32> = q_pos.iter().map(|&p| (p + sq) as i32).collect();
                let kp: Vec<i64> = k_pos.iter().map(|&p| p + sk).collect();
                let k_rot = rotate_q(&k, hkv, d, &cfg, (&cos, &sin, half), &kp);
                let pv = TensorView::host(&qp, [rows_q]).unwrap();
                let rope = Rope { cos: &cv, sin: &sv, rotary_dim: rd, style, positions: Some(&pv) };
                let opts = PrefillOptions {
                    causal: true,
                    rope: Some(rope),
                    kernel: PrefillKernel::Sm90,
                    ..Default::default()
                };
                let inp = Inputs { seqs: &seqs, heads: (hq, hkv), head_dim: d, varlen, q: &q, k: &k_rot, v: &v };
                let out = run(&stream, &inp, &opts, None).unwrap();
                assert!(last_kernel(&emu).starts_with("fa_prefill_sm90"));
                bits(&out.o)
            };
            let base = at(0, 0);
            for s in [1, 17, 101] {
                assert_eq!(base, at(s, s), "varlen {varlen} {style:?}: shift {s} changed the output");
            }
            assert_ne!(base, at(1, 0), "varlen {varlen} {style:?}: shifting q alone changed nothing");
        }
    }
}

/// Cost: with RoPE, the sm90 kernel reads q exactly once (B·Tq·Hq·D·2 bytes, the TMA's boxes; Tq = 96 leaves
/// 32 rows of the 128-row tile past the sequence, which are neither read nor rotated) and writes it
/// nowhere, reads the same K/V bytes and writes the same O as without; the table adds rotary_dim·4 bytes
/// per query row and head, explicit positions one int32 per row, head and lane; the K/V loads are
/// prefetched exactly as without RoPE (the rotation happens before the mainloop, whose loads it does not
/// delay in the synchronisation).
#[test]
fn emulated_sm90_rope_reads_q_once_and_writes_it_nowhere() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let (b, tq, tk, hq, hkv, d, rd) = (2, 96, 640, 4, 2, 128, 64);
    let mut r = rng(28_960);
    let q = random::<bf16>(&mut r, b * tq * hq * d, -1.0, 1.0);
    let k = random::<bf16>(&mut r, b * tk * hkv * d, -1.0, 1.0);
    let v = random::<bf16>(&mut r, b * tk * hkv * d, -0.5, 1.5);
    let cfg = RopeConfig::new(1e4, rd, RopeStyle::Neox);
    let positions: Vec<i32> = (0..(b * tq) as i32).map(|t| 3 * t).collect();
    let used: Vec<i64> =
        bottom_right(&[(tq, tk); 2]).into_iter().chain(positions.iter().map(|&p| i64::from(p))).collect();
    let table = PoisonedTable::new(&cfg, MAX_POS, &used).unwrap();
    let (cos, sin) = table.views().unwrap();
    let pv = TensorView::host(&positions, [b * tq]).unwrap();
    let rope = Rope { cos: &cos, sin: &sin, rotary_dim: rd, style: RopeStyle::Neox, positions: None };
    let seqs = [(tq, tk); 2];
    let inp = Inputs { seqs: &seqs, heads: (hq, hkv), head_dim: d, varlen: false, q: &q, k: &k, v: &v };
    let mut seen = Vec::new();
    for causal in [false, true] {
        for rope in [None, Some(rope), Some(Rope { positions: Some(&pv), ..rope })] {
            let opts = PrefillOptions { causal, rope, kernel: PrefillKernel::Sm90, ..Default::default() };
            let out = run(&stream, &inp, &opts, None).unwrap();
            assert!(out.o.iter().all(|x| x.is_finite()), "every output element written");
            let counters = emu.last_launch_counters().unwrap();
            let c = counters.kernels[0].clone();
            assert!(c.kernel.starts_with("fa_prefill_sm90"), "{}", c.kernel);
            let t = counters.total();
            eprintln!(
                "sm90 causal={causal} rope={} explicit={}: q {} bytes read, k {} v {}, table {} + {}, positions {}; \
                 TMA tiles prefetched {} late {} two ahead {}",
                rope.is_some(),
                rope.is_some_and(|r| r.positions.is_some()),
                c.read_of("q"),
                c.read_of("k"),
                c.read_of("v"),
                c.read_of("rope_cos"),
                c.read_of("rope_sin"),
                c.read_of("rope_positions"),
                t.tma_tiles_prefetched,
                t.tma_tiles_late,
                t.tma_tiles_two_ahead
            );
            seen.push((
                [c.read_of("q"), c.written_of("q"), c.read_of("k"), c.read_of("v"), c.written_of("o")],
                [c.read_of("rope_cos"), c.read_of("rope_sin"), c.read_of("rope_positions")],
                (t.tma_tiles_prefetched, t.tma_tiles_late, t.tma_tiles_two_ahead),
            ));
        }
    }
    let rows = (b * tq * hq) as u64; // query rows over all heads
    let half = (rd / 2 * 4) as u64;
    for (i, s) in seen.iter().enumerate() {
        let plain = &seen[i / 3 * 3];
        assert_eq!(s.0, plain.0, "q/k/v/o traffic differs with RoPE ({i})");
        assert_eq!(s.2, plain.2, "prefetch slack differs with RoPE ({i})");
        let want = match i % 3 {
            0 => [0, 0, 0],
            1 => [rows * half, rows * half, 0],
            _ => [rows * half, rows * half, rows * 32 * 4],
        };
        assert_eq!(s.1, want, "table and positions bytes ({i}): rotary_dim/2 cos and sin per query row and head");
    }
    assert_eq!(seen[0].0[0], rows * (d * 2) as u64, "q not read exactly once");
    assert_eq!(seen[0].0[1], 0, "q written");
    assert!(seen[0].2 .0 > 0 && seen[0].2 .1 == 0, "every K/V tile prefetched: {:?}", seen[0].2);
}

/// The sm90 kernel takes RoPE on q (dense and varlen; above) but not on K: `Sm90` with `rope_k` is an
/// Unsupported error before any launch, `Auto` runs the sm_80 kernel. Positions out of the table and of
/// the wrong length are the same typed errors as on the sm_80 kernel.
#[test]
fn emulated_sm90_rope_errors_are_typed() {
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
            .map(|()| last_kernel(&emu))
    };
    fn sm90(r: Rope<'_>) -> PrefillOptions<'_> {
        PrefillOptions { rope: Some(r), kernel: PrefillKernel::Sm90, ..Default::default() }
    }
    assert!(run(sm90(rope)).unwrap().starts_with("fa_prefill_sm90"));
    let keys = RopeKeys { positions: None };
    let kind = |opts| run(opts).unwrap_err().kind().clone();
    assert_eq!(kind(PrefillOptions { rope_k: Some(keys), ..sm90(rope) }), ErrorKind::Unsupported);
    let auto = PrefillOptions { rope_k: Some(keys), kernel: PrefillKernel::Auto, ..sm90(rope) };
    assert!(!run(auto).unwrap().starts_with("fa_prefill_sm90"));
    assert_eq!(kind(sm90(Rope { positions: Some(&fv), ..rope })), ErrorKind::OutOfBounds);
    assert_eq!(kind(sm90(Rope { positions: Some(&short), ..rope })), ErrorKind::Shape);
    assert_eq!(kind(sm90(Rope { rotary_dim: 66, ..rope })), ErrorKind::Unsupported);
}
