//! Score variants where models use them: long contexts (BLOOM/MPT ALiBi at 2k–32k, gpt-oss sinks and
//! windows, Gemma 2 softcap) and every head's own parameter at the head counts models have (Hq up to 128,
//! Hkv up to 16), in every op that takes the variants — dense and varlen prefill on the sm_80 and the
//! sm_90a kernel (both emulated), paged prefill, decode (one split and several) and merge with sinks.
//!
//! # Inputs
//! Structured so that every weight is a known function of the distance and the bounds stay tight:
//! - q and the keys are multiples of 1/16 (q in [3/8, 5/8], the constant key k0 of each (sequence, KV
//!   head) in [−1/4, 1/4]) with |Σ q·k| < 2^15, so every product and partial sum of q·k is exact in fp32: the
//!   only score rounding is the scale's (`4u|t|`).
//! - **Constant keys**: every key of a (sequence, KV head) is k0, except a **probe** key k0 + c·1 where a
//!   test places one, whose score is higher by Δ = scale·c·Σq ≈ 64. With ALiBi slope m the weights are
//!   then `e^{t0 − m·d}` (a geometric sequence in the distance d) and the probe's `e^{t0 + Δ − m·d_p}`;
//!   with a window, a uniform block; with a sink, one extra term `e^σ`; with a softcap, `t ← c·tanh(t/c)`,
//!   a known constant.
//! - **V row j encodes j**: column x < 16 is ±1/2 by bit x of j, the others identify the KV head and the
//!   sequence; so a weight moved from any key to another shows in O, at every distance.
//!
//! The expected O and LSE are those closed-form weights summed in fp64 (`closed_form`), checked against
//! the fp64 reference (`reference::dense_row`) to 1e-9.
//!
//! # Bounds (u = 2^-24)
//! O: the reference's arithmetic bound for the row (`reference::Output::out_bound`: score, exp2 and P
//! rounding, fp32 accumulation, the output's one rounding). LSE, per row, with w the fp64 weights (the sink
//! one of them), W_rest the weight of the keys below the row's max score, n the visible keys:
//! - scores: `Σ w_j (4u|t_j| + 3u·m·d_j)` (scale, ALiBi's fp32 slope·log2 e and FMA), softcap `c·2^-20`;
//! - exp2: `2^-21 · W_rest` (a key at the running max has P = exp2(0) = 1 exactly);
//! - the row sum: exact when W_rest = 0 (a sum of ones); else `min(2u(n + 16), 1.01·W_rest + 2u·(n_max + 16))`
//!   (a sum of positive terms in any order, or: an addition of a term below the max to a partial that holds
//!   the max loses at most that term), plus `(n/16 + 4)·2^-21·W_rest` for the online rescales (only before
//!   the max is seen);
//! - the sink `16u(|t| + |σ| + 1) + 2·2^-21`, and `8u(|LSE| + ln n + 1)` for the log and the split merges.
//!
//! A probe row (W_rest ≈ 1e-10) has an LSE bound of ~1e-5 at 32k keys, so the probe's distance is
//! measured to m·1 ≥ 2.4e-4 (a distance off by one is 10× over); a geometric row's bound grows with n
//! (3.7e-4 at 4k keys) and still separates two heads' slopes (their LSEs differ by ≥ 0.01).
use crate::common;

use fused_attn::prefill::{prefill_varlen, PrefillKernel, PrefillOptions};
use fused_attn::reference::{self, Arith};
use fused_attn::score_mod::{AlibiSlopes, ScoreMod};
use fused_attn::testkit::cases::kv::KvFormat;
use fused_attn::testkit::variants::{CaseAlibi, CaseVariants};
use fused_attn::{
    paged_prefill, DType, DecodeOptions, DecodeWorkspace, Element, Emulator, PagedKvCache, PagedPrefillOptions,
    PagedPrefillWorkspace, Stream, TensorView, TensorViewMut,
};
use half::{bf16, f16};
use rand::seq::SliceRandom;
use rand::Rng;

const U: f64 = 1.0 / (1u64 << 24) as f64;
const EXP2_REL_ERR: f64 = 1.0 / (1u64 << 21) as f64;

// ------------------------------------------------------------------------------------------------ problems

/// Which op runs a problem (and how).
#[derive(Clone, Copy, Debug)]
enum Op {
    Dense(PrefillKernel),
    Varlen(PrefillKernel),
    Paged { page_size: usize, splits: Option<usize> },
    Decode { page_size: usize, splits: Option<usize> },
}

/// One problem in packed form: sequences of (Tq, Tk), q `[total_q, Hq, D]`, k and v `[total_k, Hkv, D]`
/// (values exact in the dtype), the variants with per-head slopes and sinks (empty: none).
#[derive(Clone, Debug)]
struct Problem {
    dtype: DType,
    seqs: Vec<(usize, usize)>,
    hq: usize,
    hkv: usize,
    d: usize,
    causal: bool,
    scale: f32,
    window: Option<(i32, i32)>,
    softcap: Option<f32>,
    slopes: Vec<f32>,
    sinks: Vec<f32>,
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
}

impl Problem {
    /// Constant keys (one k0 per sequence and KV head), V row j encoding j, q from `seed`; no variants;
    /// scale 1. `probes[s]`: the key of sequence s made a probe (score higher by ≈ 64), if any.
    fn constant_keys(
        dtype: DType,
        seqs: &[(usize, usize)],
        (hq, hkv, d): (usize, usize, usize),
        causal: bool,
        probes: &[Option<usize>],
        seed: u64,
    ) -> Self {
        let mut rng = fused_attn::testkit::seed::rng(seed);
        let total_q: usize = seqs.iter().map(|s| s.0).sum();
        let total_k: usize = seqs.iter().map(|s| s.1).sum();
        let q: Vec<f64> = (0..total_q * hq * d).map(|_| f64::from(rng.random_range(6i32..=10)) / 16.0).collect();
        let (mut k, mut v) = (vec![0.0; total_k * hkv * d], vec![0.0; total_k * hkv * d]);
        // The probe's offset c: Δ = c·Σq ≈ c·D/2 = 64.
        let c = 128.0 / d as f64;
        let mut k_start = 0;
        for (s, &(_, tk)) in seqs.iter().enumerate() {
            for g in 0..hkv {
                let k0: Vec<f64> = (0..d).map(|_| f64::from(rng.random_range(-4i32..=4)) / 16.0).collect();
                for j in 0..tk {
                    let at = ((k_start + j) * hkv + g) * d;
                    let probe = probes.get(s).copied().flatten() == Some(j);
                    for x in 0..d {
                        k[at + x] = k0[x] + if probe { c } else { 0.0 };
                        v[at + x] = if x < 16 {
                            if (j >> x) & 1 == 1 {
                                0.5
                            } else {
                                -0.5
                            }
                        } else {
                            ((x + 3 * g + 5 * s) % 7) as f64 / 8.0 - 0.375
                        };
                    }
                }
            }
            k_start += tk;
        }
        Problem {
            dtype,
            seqs: seqs.to_vec(),
            hq,
            hkv,
            d,
            causal,
            scale: 1.0,
            window: None,
            softcap: None,
            slopes: vec![],
            sinks: vec![],
            q,
            k,
            v,
        }
    }

    fn total_q(&self) -> usize {
        self.seqs.iter().map(|s| s.0).sum()
    }

    /// (first q row, first key) of each sequence in the packed layout.
    fn starts(&self) -> Vec<(usize, usize)> {
        let (mut q0, mut k0) = (0, 0);
        self.seqs
            .iter()
            .map(|&(tq, tk)| {
                let r = (q0, k0);
                (q0, k0) = (q0 + tq, k0 + tk);
                r
            })
            .collect()
    }

    /// The keys `[lo, hi)` row i of sequence s sees, and its diagonal position i + Tk − Tq.
    fn visible(&self, s: usize, i: usize) -> (usize, usize, i64) {
        let (tq, tk) = self.seqs[s];
        let pos = (i + tk) as i64 - tq as i64;
        let (l, r) = self.window.unwrap_or((-1, -1));
        let r = if self.causal { 0 } else { r };
        let lo = if l < 0 { 0 } else { (pos - i64::from(l)).max(0) }.min(tk as i64);
        let hi = if r < 0 { tk as i64 } else { (pos + i64::from(r) + 1).clamp(0, tk as i64) };
        (lo as usize, hi.max(lo) as usize, pos)
    }

    fn label(&self) -> String {
        let (tq, tk) = (self.seqs.iter().map(|s| s.0).max(), self.seqs.iter().map(|s| s.1).max());
        let mut v = Vec::new();
        if let Some(w) = self.window {
            v.push(format!("window={w:?}"));
        }
        if let Some(c) = self.softcap {
            v.push(format!("softcap={c}"));
        }
        if !self.slopes.is_empty() {
            v.push("alibi".into());
        }
        if !self.sinks.is_empty() {
            v.push("sinks".into());
        }
        format!(
            "{:?} D={} Hq={} Hkv={} B={} Tq<={} Tk<={} {}{}",
            self.dtype,
            self.d,
            self.hq,
            self.hkv,
            self.seqs.len(),
            tq.unwrap_or(0),
            tk.unwrap_or(0),
            if self.causal { "causal " } else { "" },
            v.join(" ")
        )
    }
}

/// Per-head values `lo · ratio^(π(h)/Hq)` with π(h) = 37h mod Hq (a permutation for Hq a power of two):
/// distinct, neighbours far apart in value, any two at least a factor ratio^(1/Hq) apart.
fn per_head(hq: usize, lo: f64, ratio: f64) -> Vec<f32> {
    (0..hq).map(|h| (lo * ratio.powf(((37 * h) % hq) as f64 / hq as f64)) as f32).collect()
}

// ------------------------------------------------------------------------------------------------ running

/// A run's outputs: o `[total_q, Hq, D]` and lse `[total_q, Hq]`, as f64.
struct Outputs {
    o: Vec<f64>,
    lse: Vec<f64>,
    splits: usize,
}

fn run(emu: &Emulator, p: &Problem, op: Op, seed: u64) -> Outputs {
    match p.dtype {
        DType::F16 => run_as::<f16>(emu, p, op, seed),
        DType::Bf16 => run_as::<bf16>(emu, p, op, seed),
    }
}

/// The paged cache of `p`: every sequence's pages shuffled over the pool (one spare NaN page), NaN in
/// every slot no sequence owns. Returns (k, v, block table, width, seq_lens, pages).
type Paged<T> = (Vec<T>, Vec<T>, Vec<i32>, usize, Vec<i32>, usize);
fn paged_cache<T: Element>(p: &Problem, k: &[T], v: &[T], ps: usize, seed: u64) -> Paged<T> {
    let (hkv, d) = (p.hkv, p.d);
    let pages_of: Vec<usize> = p.seqs.iter().map(|s| s.1.div_ceil(ps)).collect();
    let width = pages_of.iter().copied().max().unwrap_or(0).max(1);
    let num_pages = pages_of.iter().sum::<usize>() + 1;
    let mut ids: Vec<i32> = (0..num_pages as i32).collect();
    ids.shuffle(&mut fused_attn::testkit::seed::rng(seed ^ 0x9a6e));
    let (mut kc, mut vc) = (vec![T::nan(); num_pages * ps * hkv * d], vec![T::nan(); num_pages * ps * hkv * d]);
    let mut table = vec![0i32; p.seqs.len() * width];
    let mut next = 0;
    for (s, ((&(_, tk), &np), &(_, k0))) in p.seqs.iter().zip(&pages_of).zip(&p.starts()).enumerate() {
        table[s * width..][..np].copy_from_slice(&ids[next..next + np]);
        next += np;
        for j in 0..tk {
            let slot = table[s * width + j / ps] as usize * ps + j % ps;
            let (from, to) = ((k0 + j) * hkv * d, slot * hkv * d);
            kc[to..to + hkv * d].copy_from_slice(&k[from..from + hkv * d]);
            vc[to..to + hkv * d].copy_from_slice(&v[from..from + hkv * d]);
        }
    }
    let lens = p.seqs.iter().map(|s| s.1 as i32).collect();
    (kc, vc, table, width, lens, num_pages)
}

fn run_as<T: Element>(emu: &Emulator, p: &Problem, op: Op, seed: u64) -> Outputs {
    let stream = Stream::Emu(emu);
    let cast = |x: &[f64]| -> Vec<T> {
        x.iter()
            .map(|&x| {
                let t = T::from_f64(x);
                assert_eq!(t.to_f64(), x, "inputs are exact in the dtype");
                t
            })
            .collect()
    };
    let (q, k, v) = (cast(&p.q), cast(&p.k), cast(&p.v));
    let (b, hq, hkv, d, tq_all) = (p.seqs.len(), p.hq, p.hkv, p.d, p.total_q());
    let slopes = (!p.slopes.is_empty()).then(|| TensorView::host(&p.slopes, [hq]).unwrap());
    let sinks = (!p.sinks.is_empty()).then(|| TensorView::host(&p.sinks, [hq]).unwrap());
    let score_mod = ScoreMod {
        window: p.window,
        softcap: p.softcap,
        alibi_slopes: slopes.as_ref().map(AlibiSlopes::PerHead),
        sinks: sinks.as_ref(),
    };
    let mut o = vec![T::nan(); tq_all * hq * d];
    let mut lse = vec![f32::NAN; tq_all * hq];
    // lse_at(row, h): where the op's LSE layout keeps (packed row, head).
    let mut splits = 1;
    let lse_at: Box<dyn Fn(usize, usize) -> usize> = match op {
        Op::Dense(kernel) => {
            let (tq, tk) = p.seqs[0];
            assert!(p.seqs.iter().all(|&s| s == (tq, tk)), "dense: equal sequences");
            let opts =
                PrefillOptions { causal: p.causal, scale: Some(p.scale), score_mod, kernel, ..Default::default() };
            common::prefill_host(&stream, [b, tq, tk, hq, hkv, d], (&q, &k, &v), (&mut o, Some(&mut lse)), &opts)
                .unwrap();
            Box::new(move |row, h| ((row / tq) * hq + h) * tq + row % tq)
        }
        Op::Varlen(kernel) => {
            let cu = |f: fn(&(usize, usize)) -> usize| -> Vec<i32> {
                std::iter::once(0)
                    .chain(p.seqs.iter().scan(0, |a, s| {
                        *a += f(s) as i32;
                        Some(*a)
                    }))
                    .collect()
            };
            let (cq, ck) = (cu(|s| s.0), cu(|s| s.1));
            let total_k = *ck.last().unwrap() as usize;
            prefill_varlen(
                &stream,
                &TensorView::host(&q, [tq_all, hq, d]).unwrap(),
                &TensorView::host(&k, [total_k, hkv, d]).unwrap(),
                &TensorView::host(&v, [total_k, hkv, d]).unwrap(),
                &TensorView::host(&cq, [b + 1]).unwrap(),
                &TensorView::host(&ck, [b + 1]).unwrap(),
                p.seqs.iter().map(|s| s.0).max().unwrap(),
                p.seqs.iter().map(|s| s.1).max().unwrap(),
                &mut TensorViewMut::host(&mut o, [tq_all, hq, d]).unwrap(),
                Some(&mut TensorViewMut::host(&mut lse, [hq, tq_all]).unwrap()),
                &PrefillOptions { causal: p.causal, scale: Some(p.scale), score_mod, kernel, ..Default::default() },
            )
            .unwrap();
            Box::new(move |row, h| h * tq_all + row)
        }
        Op::Paged { page_size, splits: forced } => {
            let (kc, vc, table, width, lens, np) = paged_cache(p, &k, &v, page_size, seed);
            let shape = [np, page_size, hkv, d];
            let cache = PagedKvCache::new(
                TensorView::host(&kc, shape).unwrap(),
                TensorView::host(&vc, shape).unwrap(),
                TensorView::host(&table, [b, width]).unwrap(),
                TensorView::host(&lens, [b]).unwrap(),
                p.seqs.iter().map(|s| s.1).max().unwrap(),
            )
            .unwrap();
            let cq: Vec<i32> = std::iter::once(0)
                .chain(p.seqs.iter().scan(0, |a, s| {
                    *a += s.0 as i32;
                    Some(*a)
                }))
                .collect();
            let cap = forced.unwrap_or(1).max(fused_attn::paged_prefill::MAX_PLANNED_SPLITS);
            let mut ws = PagedPrefillWorkspace::with_capacity(&stream, tq_all, hq, d, cap).unwrap();
            let plan = paged_prefill(
                &stream,
                &TensorView::host(&q, [tq_all, hq, d]).unwrap(),
                &TensorView::host(&cq, [b + 1]).unwrap(),
                p.seqs.iter().map(|s| s.0).max().unwrap(),
                &cache,
                &mut TensorViewMut::host(&mut o, [tq_all, hq, d]).unwrap(),
                Some(&mut TensorViewMut::host(&mut lse, [hq, tq_all]).unwrap()),
                Some(&mut ws),
                &PagedPrefillOptions {
                    causal: p.causal,
                    scale: Some(p.scale),
                    num_splits: forced,
                    score_mod,
                    ..Default::default()
                },
            )
            .unwrap();
            splits = plan.num_splits();
            Box::new(move |row, h| h * tq_all + row)
        }
        Op::Decode { page_size, splits: forced } => {
            assert!(p.causal && p.seqs.iter().all(|s| s.0 == 1), "decode: one causal row per sequence");
            let (kc, vc, table, width, lens, np) = paged_cache(p, &k, &v, page_size, seed);
            let shape = [np, page_size, hkv, d];
            let max_len = p.seqs.iter().map(|s| s.1).max().unwrap();
            let cache = PagedKvCache::new(
                TensorView::host(&kc, shape).unwrap(),
                TensorView::host(&vc, shape).unwrap(),
                TensorView::host(&table, [b, width]).unwrap(),
                TensorView::host(&lens, [b]).unwrap(),
                max_len,
            )
            .unwrap();
            let opts = DecodeOptions { scale: Some(p.scale), num_splits: forced, score_mod, rope: None };
            let problem =
                fused_attn::DecodeProblem { batch: b, heads_q: hq, heads_kv: hkv, head_dim: d, max_seq_len: max_len }
                    .windowed(p.window.and_then(|w| usize::try_from(w.0).ok()));
            let plan = DecodeWorkspace::new(&stream, 0, 0).unwrap().plan(&problem, &opts).unwrap();
            splits = plan.num_splits();
            let mut ws = DecodeWorkspace::for_plan(&stream, &plan).unwrap();
            common::decode_host(&stream, [b, hq, d], &q, &cache, (&mut o, Some(&mut lse)), &mut ws, &opts).unwrap();
            Box::new(move |row, h| row * hq + h)
        }
    };
    let lse = (0..tq_all * hq).map(|e| f64::from(lse[lse_at(e / hq, e % hq)])).collect();
    Outputs { o: o.iter().map(|x| x.to_f64()).collect(), lse, splits }
}

// ------------------------------------------------------------------------------------------------ closed forms

/// The expected outputs of `p` and their bounds (module docs), all `[total_q, Hq, (D)]`.
struct Expected {
    o: Vec<f64>,
    o_bound: Vec<f64>,
    lse: Vec<f64>,
    lse_bound: Vec<f64>,
}

/// The closed-form weights of every row of `p` summed in fp64, and the bounds; each row also checked
/// against the fp64 reference (to 1e-9), whose arithmetic bound O is held to.
fn closed_form(p: &Problem) -> Expected {
    let (hq, hkv, d) = (p.hq, p.hkv, p.d);
    let tq_all = p.total_q();
    let mut e = Expected {
        o: vec![0.0; tq_all * hq * d],
        o_bound: vec![0.0; tq_all * hq * d],
        lse: vec![0.0; tq_all * hq],
        lse_bound: vec![0.0; tq_all * hq],
    };
    let scale = f64::from(p.scale);
    let slopes: Vec<f64> = p.slopes.iter().map(|&x| f64::from(x)).collect();
    let sinks: Vec<f64> = p.sinks.iter().map(|&x| f64::from(x)).collect();
    let var = reference::Variants {
        window: p.window.map(|(l, r)| (i64::from(l), i64::from(r))),
        softcap: p.softcap.map(f64::from),
        alibi: (!slopes.is_empty()).then_some(&slopes[..]),
        sinks: (!sinks.is_empty()).then_some(&sinks[..]),
    };
    // Rows in parallel: (sequence, row) pairs.
    let rows: Vec<(usize, usize)> =
        p.seqs.iter().enumerate().flat_map(|(s, &(tq, _))| (0..tq).map(move |i| (s, i))).collect();
    let starts = p.starts();
    type Row = (usize, Vec<(Vec<f64>, Vec<f64>, f64, f64)>);
    let results: Vec<Row> = parallel_map(&rows, |&(s, i)| {
        let (q0, k0) = starts[s];
        let (tq, tk) = p.seqs[s];
        let row = q0 + i;
        let (lo, hi, pos) = p.visible(s, i);
        let n = hi - lo;
        let kseq = &p.k[k0 * hkv * d..(k0 + tk) * hkv * d];
        let vseq = &p.v[k0 * hkv * d..(k0 + tk) * hkv * d];
        let mut rp = reference::Problem::new(1, hq, hkv, tq, tk, d, p.causal);
        rp.scale = scale;
        let heads = (0..hq)
            .map(|h| {
                let g = h / (hq / hkv);
                let qr = &p.q[(row * hq + h) * d..][..d];
                let m = slopes.get(h).copied().unwrap_or(0.0);
                let sink = sinks.get(h).copied();
                // Exact dot products (module docs): dyadic inputs of 1/16 with a small |Σ q·k|.
                let dot = |j: usize| -> f64 {
                    let kr = &kseq[(j * hkv + g) * d..][..d];
                    let abs: f64 = qr.iter().zip(kr).map(|(a, b)| (a * b).abs()).sum();
                    assert!(abs < 32768.0);
                    qr.iter().zip(kr).map(|(a, b)| a * b).sum()
                };
                let t: Vec<(f64, f64)> = (lo..hi)
                    .map(|j| {
                        let s0 = scale * dot(j);
                        let s1 = p.softcap.map_or(s0, |c| f64::from(c) * (s0 / f64::from(c)).tanh());
                        let dist = (pos - j as i64).abs() as f64;
                        (s1 - m * dist, dist)
                    })
                    .collect();
                let tmax = t.iter().map(|x| x.0).fold(f64::NEG_INFINITY, f64::max);
                let top = tmax.max(sink.unwrap_or(f64::NEG_INFINITY));
                let mut denom: f64 = t.iter().map(|x| (x.0 - top).exp()).sum();
                if let Some(sk) = sink {
                    denom += (sk - top).exp();
                }
                let lse = if denom > 0.0 { top + denom.ln() } else { f64::NEG_INFINITY };
                let mut o = vec![0.0; d];
                if n > 0 {
                    for (jj, &(tj, _)) in t.iter().enumerate() {
                        let w = (tj - lse).exp();
                        let vr = &vseq[((lo + jj) * hkv + g) * d..][..d];
                        for x in 0..d {
                            o[x] += w * vr[x];
                        }
                    }
                }
                // The reference: the same row, and the bound O is held to.
                let r = reference::dense_row(&rp, &var, Arith::F64, qr, kseq, vseq, (0, i, h)).unwrap();
                let o_bound =
                    if n == 0 { vec![f64::MIN_POSITIVE; d] } else { r.out_bound(Some(p.dtype), Some(p.dtype)) };
                for (mine, theirs) in o.iter().zip(&r.out) {
                    assert!((theirs - mine).abs() < 1e-9, "closed form vs reference: O {mine} vs {theirs}");
                }
                assert!(
                    r.lse[0] == lse || (r.lse[0] - lse).abs() < 1e-9,
                    "closed form vs reference: LSE {lse} vs {}",
                    r.lse[0]
                );
                let lse_bound = if n == 0 {
                    sink.map_or(f64::MIN_POSITIVE, |sk| 8.0 * U * sk.abs().max(1.0))
                } else {
                    let w = |tj: f64| (tj - lse).exp();
                    let w_rest: f64 = t.iter().filter(|x| x.0 < tmax).map(|x| w(x.0)).sum();
                    let n_max = t.iter().filter(|x| x.0 == tmax).count();
                    let scores: f64 =
                        t.iter().map(|&(tj, dist)| w(tj) * (4.0 * U * tj.abs() + 3.0 * U * m * dist)).sum();
                    let softcap = p.softcap.map_or(0.0, |c| f64::from(c) / (1u64 << 20) as f64);
                    let sum = if w_rest == 0.0 {
                        0.0
                    } else {
                        (2.0 * U * (n + 16) as f64).min(1.01 * w_rest + 2.0 * U * (n_max + 16) as f64)
                            + (n / 16 + 4) as f64 * EXP2_REL_ERR * w_rest
                    };
                    let sink_err = sink.map_or(0.0, |sk| 16.0 * U * (tmax.abs() + sk.abs() + 1.0) + 2.0 * EXP2_REL_ERR);
                    scores
                        + softcap
                        + EXP2_REL_ERR * w_rest
                        + sum
                        + sink_err
                        + 8.0 * U * (lse.abs() + (n as f64).ln() + 1.0)
                };
                (o, o_bound, lse, lse_bound)
            })
            .collect();
        (row, heads)
    });
    for (row, heads) in results {
        for (h, (o, ob, l, lb)) in heads.into_iter().enumerate() {
            let at = (row * hq + h) * d;
            e.o[at..at + d].copy_from_slice(&o);
            e.o_bound[at..at + d].copy_from_slice(&ob);
            e.lse[row * hq + h] = l;
            e.lse_bound[row * hq + h] = lb;
        }
    }
    e
}

/// `f` over `items` on all cores, results in order.
fn parallel_map<I: Sync, R: Send>(items: &[I], f: impl Fn(&I) -> R + Sync) -> Vec<R> {
    let threads = common::all_cores().clamp(1, items.len().max(1));
    let per = items.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = items.chunks(per).map(|ch| s.spawn(|| ch.iter().map(&f).collect::<Vec<R>>())).collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    })
}

// ------------------------------------------------------------------------------------------------ verdicts

/// Runs `p` through `op` and judges it against the closed forms: a line, and whether it passed.
fn check(emu: &Emulator, p: &Problem, want: &Expected, op: Op, seed: u64) -> (bool, String) {
    let start = std::time::Instant::now();
    let out = run(emu, p, op, seed);
    let (wo, wl) = (common::worst(&out.o, &want.o, &want.o_bound), common::worst(&out.lse, &want.lse, &want.lse_bound));
    let (hq, d) = (p.hq, p.d);
    let line = format!(
        "{op:?} splits={} [{}]: O err/bound {:.3} (|err| {:.2e} at row {} head {}), LSE err/bound {:.3} (|err| {:.2e} at row {} head {}), {:.1} s",
        out.splits,
        p.label(),
        wo.0,
        wo.2,
        wo.1 / (hq * d),
        wo.1 / d % hq,
        wl.0,
        wl.2,
        wl.1 / hq,
        wl.1 % hq,
        start.elapsed().as_secs_f64()
    );
    (wo.0 <= 1.0 && wl.0 <= 1.0, line)
}

/// Prints every verdict and fails listing those over their bounds, with the command that reruns `test`.
fn judge(test: &str, verdicts: &[(bool, String)]) {
    let failed: Vec<&String> = verdicts.iter().filter(|v| !v.0).map(|v| &v.1).collect();
    for (ok, line) in verdicts {
        eprintln!("{} {line}", if *ok { "ok  " } else { "FAIL" });
    }
    assert!(
        failed.is_empty(),
        "{test}: {} cases over their bounds (base seed {:#x}):\n{}\n{}",
        failed.len(),
        common::base_seed(),
        failed.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n"),
        common::rerun("variants_long", test, None)
    );
}

/// Each problem through each of its ops.
fn check_all(test: &str, cases: &[(Problem, Vec<Op>)], seed: u64) {
    let emu = Emulator::new();
    let mut verdicts = Vec::new();
    for (p, ops) in cases {
        let want = closed_form(p);
        for &op in ops {
            verdicts.push(check(&emu, p, &want, op, seed));
        }
    }
    judge(test, &verdicts);
}

// ------------------------------------------------------------------------------------------------ ALiBi

/// ALiBi slopes for the probe tests: per head in [2^-12, 2^-10) (BLOOM's 64–128-head range), so that over
/// 32k keys m·d ≤ 32 stays well under the probe's Δ ≈ 64 and the probe outweighs the rest by e^-20.
fn probe_slopes(hq: usize) -> Vec<f32> {
    per_head(hq, 1.0 / 4096.0, 4.0)
}

/// Sequences (Tq, Tk) whose rows meet a probe at the distances `dists[s] + i` (i < Tq): the probe of
/// sequence s sits at key Tk − Tq − dists[s].
fn probed(tq: usize, tk: usize, dists: &[usize]) -> (Vec<(usize, usize)>, Vec<Option<usize>>) {
    (vec![(tq, tk); dists.len()], dists.iter().map(|&d| Some(tk - tq - d)).collect())
}

/// ALiBi at long range in every op. Probes (one key scoring Δ ≈ 64 higher) at distances straddling
/// 1024, 4096, 16384 and the far end of a 32k context: each probe row's LSE is t + Δ − m_h·d to ~1e-5, so
/// one unit of distance (m_h ≥ 2.4e-4) anywhere shows; the rows that do not see their probe yet are
/// geometric sums in the distance. Prefill rows cover 16 consecutive distances per probe; decode one.
#[test]
fn alibi_probes_at_every_range() {
    let seed = common::case_seed(31_000);
    let mut cases = Vec::new();
    // Prefill: dense over 8k keys, varlen over 32k, 2k and 5k (no probe: a geometric row), sm_80 and sm_90a.
    let (seqs, probes) = probed(16, 8192, &[1016, 8176]);
    let mut p = Problem::constant_keys(DType::Bf16, &seqs, (2, 1, 64), true, &probes, seed);
    p.slopes = probe_slopes(2);
    cases.push((p, vec![Op::Dense(PrefillKernel::Sm80), Op::Dense(PrefillKernel::Sm90)]));
    let seqs = [(16, 32_768), (16, 2048), (1, 5000)];
    let probes = [Some(0), Some(2048 - 16 - 1016), None];
    let mut p = Problem::constant_keys(DType::F16, &seqs, (2, 1, 64), true, &probes, seed + 1);
    p.slopes = probe_slopes(2);
    cases.push((p, vec![Op::Varlen(PrefillKernel::Sm80)]));
    // sm_90a without the 32k sequence (its ALiBi at 32k: window_sinks_softcap_at_long_range, all four).
    let mut p = Problem::constant_keys(DType::F16, &seqs[1..], (2, 1, 64), true, &probes[1..], seed + 4);
    p.slopes = probe_slopes(2);
    cases.push((p, vec![Op::Varlen(PrefillKernel::Sm90)]));
    // Paged prefill: chunks of 16 new tokens over 32k and 2k contexts, one split and several.
    let seqs = [(16, 32_768), (16, 2048)];
    let probes = [Some(0), Some(2048 - 16 - 1016)];
    let mut p = Problem::constant_keys(DType::Bf16, &seqs, (8, 1, 64), true, &probes, seed + 2);
    p.slopes = probe_slopes(8);
    cases.push((p, vec![Op::Paged { page_size: 16, splits: Some(1) }, Op::Paged { page_size: 64, splits: Some(5) }]));
    // Decode: one row per sequence, probes at distances 0 .. 32767 (each sequence up to 64 keys longer than
    // its probe's distance: 64 to 32,768 keys).
    let dists = [0usize, 1, 63, 64, 1023, 1024, 1025, 1040, 4095, 16_000, 32_767];
    let seqs: Vec<(usize, usize)> = dists.iter().map(|&d| (1, (d + 64).min(32_768))).collect();
    let probes: Vec<Option<usize>> = seqs.iter().zip(&dists).map(|(s, &d)| Some(s.1 - 1 - d)).collect();
    let mut p = Problem::constant_keys(DType::Bf16, &seqs, (8, 1, 64), true, &probes, seed + 3);
    p.slopes = probe_slopes(8);
    cases.push((
        p,
        vec![
            Op::Decode { page_size: 16, splits: Some(1) },
            Op::Decode { page_size: 256, splits: Some(3) },
            Op::Decode { page_size: 1, splits: None },
        ],
    ));
    check_all("alibi_probes_at_every_range", &cases, seed);
}

// ------------------------------------------------------------------------------------------------ window, sinks, softcap

/// Sinks per head in [ln n − 2, ln n + 2): about as heavy as the n keys' e^t (t ≈ ±1), so each head's LSE
/// moves by ≥ 0.4 · 4/Hq with its sink (any two heads' differ by far more than the bound).
fn sinks_for(hq: usize, n: usize) -> Vec<f32> {
    let base = (n as f64).ln() - 2.0;
    (0..hq).map(|h| (base + 4.0 * ((37 * h) % hq) as f64 / hq as f64) as f32).collect()
}

/// Windows, sinks and softcaps at long range in every op, over constant keys: a window of w keys is a
/// uniform block (LSE = t + ln w, O the mean of those V rows, each encoding its key: a block shifted by
/// one key moves O and the LSE by ~1/w), a sink one extra term, a softcap the constant c·tanh(t/c)
/// (with a probe: c·tanh((t + Δ)/c), far from t + Δ). gpt-oss (a 128-key and an 8k window, sinks),
/// Gemma 2 (softcap 30 and 50 with a 4k window), bidirectional windows, and all four variants together.
#[test]
fn window_sinks_softcap_at_long_range() {
    let seed = common::case_seed(31_100);
    // Every prefill and decode op, dealt round-robin over the cases of each variant (each case runs
    // three prefill ops or two decode ones; each variant meets every op).
    let prefill_ops = [
        Op::Dense(PrefillKernel::Sm80),
        Op::Varlen(PrefillKernel::Sm90),
        Op::Paged { page_size: 16, splits: Some(1) },
        Op::Dense(PrefillKernel::Sm90),
        Op::Varlen(PrefillKernel::Sm80),
        Op::Paged { page_size: 32, splits: Some(4) },
    ];
    let decode_ops = [
        Op::Decode { page_size: 16, splits: Some(1) },
        Op::Decode { page_size: 64, splits: Some(2) },
        Op::Decode { page_size: 256, splits: None },
        Op::Decode { page_size: 1, splits: Some(3) },
    ];
    let pre = |i: usize| prefill_ops[3 * (i % 2)..3 * (i % 2) + 3].to_vec();
    let dec = |i: usize| vec![decode_ops[(2 * i) % 4], decode_ops[(2 * i + 1) % 4]];
    let mut cases = Vec::new();
    // gpt-oss: windows of 8k (far from the diagonal's tiles) and 128 with sinks, over 32k keys.
    for (i, window) in [(8191, 0), (127, 0)].into_iter().enumerate() {
        let seqs = [(16, 32_768)];
        let mut p = Problem::constant_keys(DType::Bf16, &seqs, (2, 1, 64), true, &[], seed + i as u64);
        (p.window, p.sinks) = (Some(window), sinks_for(2, window.0 as usize + 1));
        cases.push((p, pre(i)));
        let seqs = [(1, 32_768), (1, 8192), (1, 8191), (1, 100)];
        let mut p = Problem::constant_keys(DType::F16, &seqs, (8, 1, 128), true, &[], seed + 10 + i as u64);
        (p.window, p.sinks) = (Some(window), sinks_for(8, window.0 as usize + 1));
        cases.push((p, dec(i)));
    }
    // Gemma 2: softcaps over probes at far distances, inside a 4k window.
    for (i, cap) in [30.0f32, 50.0].into_iter().enumerate() {
        let (seqs, probes) = probed(16, 16_384, &[1016, 4064]);
        let mut p = Problem::constant_keys(DType::Bf16, &seqs, (2, 1, 64), true, &probes, seed + 20 + i as u64);
        (p.window, p.softcap) = (Some((4095, 0)), Some(cap));
        cases.push((p, pre(i)));
        let dists = [0usize, 1025, 4095, 4096];
        let seqs: Vec<(usize, usize)> = dists.iter().map(|_| (1, 16_384)).collect();
        let probes: Vec<Option<usize>> = dists.iter().map(|&d| Some(16_383 - d)).collect();
        let mut p = Problem::constant_keys(DType::Bf16, &seqs, (4, 1, 64), true, &probes, seed + 30 + i as u64);
        (p.window, p.softcap) = (Some((4095, 0)), Some(cap));
        cases.push((p, dec(i)));
    }
    // Bidirectional windows (prefill and paged prefill): blocks [pos − 1000, pos + 3000].
    let seqs = [(64, 16_384)];
    let mut p = Problem::constant_keys(DType::F16, &seqs, (2, 2, 64), false, &[], seed + 40);
    p.window = Some((1000, 3000));
    cases.push((p, pre(0)));
    // All four: a 12k (prefill) or 16k (decode) window, softcap 30, ALiBi, sinks; probes near and far.
    let (seqs, probes) = probed(16, 32_768, &[12_000]);
    let mut p = Problem::constant_keys(DType::Bf16, &seqs, (2, 1, 64), true, &probes, seed + 50);
    (p.window, p.softcap, p.slopes, p.sinks) = (Some((12_287, 0)), Some(30.0), probe_slopes(2), sinks_for(2, 1 << 20));
    cases.push((p, pre(1)));
    let dists = [3usize, 1500, 16_000];
    let seqs: Vec<(usize, usize)> = dists.iter().map(|_| (1, 32_768)).collect();
    let probes: Vec<Option<usize>> = dists.iter().map(|&d| Some(32_767 - d)).collect();
    let mut p = Problem::constant_keys(DType::Bf16, &seqs, (8, 1, 64), true, &probes, seed + 51);
    (p.window, p.softcap, p.slopes, p.sinks) = (Some((16_383, 0)), Some(30.0), probe_slopes(8), sinks_for(8, 1 << 20));
    cases.push((p, dec(2)));
    check_all("window_sinks_softcap_at_long_range", &cases, seed);
}

// ------------------------------------------------------------------------------------------------ every head

/// Every head its own slope and sink at the head counts models use (Hq = 64 with Hkv = 8, Hq = 128 with
/// Hkv = 16): slopes and sinks distinct per head and permuted (neighbours far apart), measured per head —
/// a probe at distance ≥ 1,500 moves head h's LSE by (m_h − m_h')·d ≥ 4e-3 if it took head h''s slope
/// (bound ~1e-5), a sink by ≥ 0.01 (module docs) — in decode (one split and several), paged prefill,
/// and prefill (sm_80 and sm_90a).
#[test]
fn every_head_its_own_slope_and_sink() {
    let seed = common::case_seed(31_200);
    let mut cases = Vec::new();
    for (i, &(hq, hkv)) in [(64usize, 8usize), (128, 16)].iter().enumerate() {
        let s = seed + 10 * i as u64;
        // Slopes: decode and paged prefill over 2k contexts, probes at distances 1500..1515 (paged: 4 rows).
        let dists = [1500usize, 1505, 2000];
        let seqs: Vec<(usize, usize)> = dists.iter().map(|_| (1, 2048)).collect();
        let probes: Vec<Option<usize>> = dists.iter().map(|&d| Some(2047 - d)).collect();
        let mut p = Problem::constant_keys(DType::Bf16, &seqs, (hq, hkv, 64), true, &probes, s);
        p.slopes = probe_slopes(hq);
        cases.push((
            p,
            vec![Op::Decode { page_size: 16, splits: Some(1) }, Op::Decode { page_size: 16, splits: Some(3) }],
        ));
        let (seqs, probes) = probed(4, 2048, &[1500, 1800]);
        let mut p = Problem::constant_keys(DType::F16, &seqs, (hq, hkv, 64), true, &probes, s + 1);
        p.slopes = probe_slopes(hq);
        cases
            .push((p, vec![Op::Paged { page_size: 16, splits: Some(1) }, Op::Paged { page_size: 8, splits: Some(2) }]));
        // Sinks: constant keys, n ≈ ln n − 2 .. ln n + 2 heavy.
        let seqs = [(1, 2048), (1, 1500), (1, 1)];
        let mut p = Problem::constant_keys(DType::Bf16, &seqs, (hq, hkv, 64), true, &[], s + 2);
        p.sinks = sinks_for(hq, 2048);
        cases.push((
            p,
            vec![Op::Decode { page_size: 16, splits: Some(1) }, Op::Decode { page_size: 32, splits: Some(4) }],
        ));
        let seqs = [(4, 2048), (3, 1200)];
        let mut p = Problem::constant_keys(DType::Bf16, &seqs, (hq, hkv, 64), true, &[], s + 3);
        p.sinks = sinks_for(hq, 2048);
        cases.push((
            p,
            vec![Op::Paged { page_size: 16, splits: Some(1) }, Op::Paged { page_size: 16, splits: Some(3) }],
        ));
    }
    // Prefill: slopes and sinks together, a probe at distances 200..215 ((m_h − m_h')·d ≥ 5e-4, 50× the
    // bound) and sinks as heavy as the probe (σ_h within ±2 of its score), so each head's LSE depends on
    // both. Hq = 64 / Hkv = 8 on sm_80, Hq = 32 / Hkv = 4 on sm_90a (whose emulation costs twice as much).
    for (i, (hq, hkv, op)) in
        [(64, 8, Op::Dense(PrefillKernel::Sm80)), (32, 4, Op::Varlen(PrefillKernel::Sm90))].into_iter().enumerate()
    {
        let (seqs, probes) = probed(16, 256, &[200]);
        let mut p = Problem::constant_keys(DType::Bf16, &seqs, (hq, hkv, 64), true, &probes, seed + 50 + i as u64);
        p.slopes = probe_slopes(hq);
        p.sinks = sinks_for(hq, 1).iter().map(|&s| s + 63.0).collect();
        cases.push((p, vec![op]));
    }
    check_all("every_head_its_own_slope_and_sink", &cases, seed);
}

// ------------------------------------------------------------------------------------------------ merge

/// merge_states_with_sinks over 128 heads, each its own sink: the fp32 states of a constant-key row of
/// n = 32,768 keys split into 1, 2 and 7 chunks (o_s the mean of its chunk's V, lse_s = t + ln n_s) merge to
/// LSE = log(e^σ_h + n e^t), O = n e^t / (e^σ_h + n e^t) · mean V; a head merged with its neighbour's sink
/// moves its LSE by ≥ 0.01.
#[test]
fn merge_with_every_heads_sink() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let (n, rows, h, d) = (32_768usize, 2usize, 128usize, 32usize);
    let mut rng = fused_attn::testkit::seed::rng(common::case_seed(31_300));
    let sinks = sinks_for(h, n);
    let mut verdicts = Vec::new();
    for states in [1usize, 2, 7] {
        let mut cuts: Vec<usize> = (1..states).map(|_| rng.random_range(1..n)).collect();
        cuts.extend([0, n]);
        cuts.sort_unstable();
        // Per (row, head): score t and the mean of each chunk's V (V row j encodes j as in Problem).
        let t: Vec<f64> = (0..rows * h).map(|_| f64::from(rng.random_range(-16i32..=16)) / 16.0).collect();
        let v = |j: usize, x: usize, rh: usize| -> f64 {
            if x < 16 {
                if (j >> x) & 1 == 1 {
                    0.5
                } else {
                    -0.5
                }
            } else {
                ((x + rh) % 7) as f64 / 8.0 - 0.375
            }
        };
        let (mut os, mut ls) = (vec![0f32; states * rows * h * d], vec![0f32; states * rows * h]);
        for s in 0..states {
            let (a, b) = (cuts[s], cuts[s + 1]);
            for rh in 0..rows * h {
                ls[s * rows * h + rh] = (t[rh] + ((b - a) as f64).ln()) as f32;
                for x in 0..d {
                    let mean = (a..b).map(|j| v(j, x, rh)).sum::<f64>() / (b - a) as f64;
                    os[(s * rows * h + rh) * d + x] = mean as f32;
                }
            }
        }
        let mut o = vec![f32::NAN; rows * h * d];
        let mut lse = vec![f32::NAN; rows * h];
        common::merge_host(&stream, [states, rows, h, d], (&os, &ls), Some(&sinks), (&mut o, &mut lse)).unwrap();
        let (mut want_o, mut o_bd, mut want_l, mut l_bd) = (vec![], vec![], vec![], vec![]);
        for rh in 0..rows * h {
            let sk = f64::from(sinks[rh % h]);
            let keys = t[rh] + (n as f64).ln();
            let top = keys.max(sk);
            let l = top + ((keys - top).exp() + (sk - top).exp()).ln();
            let weight = (keys - l).exp();
            // The states' fp32 rounding (u·|o_s|, u·|lse_s|), the merge's fp32 weights and the sink's.
            let extra = 16.0 * U * (t[rh].abs() + sk.abs() + 1.0) + 4.0 * EXP2_REL_ERR;
            for x in 0..d {
                let mean = (0..n).map(|j| v(j, x, rh)).sum::<f64>() / n as f64;
                let w = weight * mean;
                let eps = (states as f64 + 2.0) * U * (0.5 + w.abs())
                    + 8.0 * U * (l.abs() + 1.0) * (0.5 + w.abs())
                    + 2.0 * extra * (0.5 + w.abs());
                want_o.push(w);
                o_bd.push(eps + reference::half_ulp(None, w.abs() + eps));
            }
            want_l.push(l);
            l_bd.push(8.0 * U * (l.abs() + (n as f64).ln() + states as f64 + 1.0) + extra);
        }
        let o64: Vec<f64> = o.iter().map(|&x| f64::from(x)).collect();
        let l64: Vec<f64> = lse.iter().map(|&x| f64::from(x)).collect();
        let (wo, wl) = (common::worst(&o64, &want_o, &o_bd), common::worst(&l64, &want_l, &l_bd));
        let line = format!(
            "merge {states} chunks of {n} keys {cuts:?}, {h} heads: O err/bound {:.3} (|err| {:.2e}), LSE err/bound {:.3} (|err| {:.2e} at head {})",
            wo.0,
            wo.2,
            wl.0,
            wl.2,
            wl.1 % h
        );
        verdicts.push((wo.0 <= 1.0 && wl.0 <= 1.0, line));
    }
    judge("merge_with_every_heads_sink", &verdicts);
}

// ------------------------------------------------------------------------------------------------ random sweeps

/// The variants of the random sweeps: each alone and all four together (gpt-oss's window + sinks with
/// Gemma 2's softcap and ALiBi).
fn sweep_variants() -> Vec<CaseVariants> {
    let none = CaseVariants::default();
    vec![
        CaseVariants { window: Some((2047, 0)), ..none },
        CaseVariants { softcap: Some(30.0), ..none },
        CaseVariants { alibi: CaseAlibi::PerHead, ..none },
        CaseVariants { sinks: true, ..none },
        CaseVariants { window: Some((6000, 0)), softcap: Some(50.0), alibi: CaseAlibi::PerHead, sinks: true },
    ]
}

/// Long-context random sweeps against the fp64 reference under the tolerance rule (and the arithmetic
/// bound for prefill): every variant alone and all four together, at 4k–32k keys, in dense prefill (sm_80
/// and sm_90a), paged prefill (one split and several) and decode (one split, several, planned). Random
/// q, k, v; the ALiBi slopes are BLOOM's small ones (probe_slopes), so keys thousands of tokens away keep
/// weight.
#[test]
fn random_long_context_sweeps() {
    use fused_attn::testkit::cases::decode::{run_inputs_emulated, DecodeCase, DecodeInputs, PagedFixture};
    use fused_attn::testkit::cases::paged_prefill::{case as paged_case, evaluate, PagedPrefillFixture};
    use fused_attn::testkit::cases::prefill::{run_emulated, PrefillCase, PrefillFixture};
    let emu = Emulator::new();
    let base = common::case_seed(31_400);
    let mut verdicts = Vec::new();
    let mut record = |label: String, passed: bool, summary: String, secs: f64| {
        verdicts.push((passed, format!("{label}: {summary}, {secs:.1} s")));
    };
    for (i, v) in sweep_variants().into_iter().enumerate() {
        let seed = base + 10 * i as u64;
        // Prefill: 16 query rows over 4k–32k keys.
        let tk = [4096, 4096, 8192, 4096, 32_768][i];
        let kernel = if i % 2 == 0 { PrefillKernel::Sm80 } else { PrefillKernel::Sm90 };
        let mut c = PrefillCase::dense(DType::Bf16, if i == 2 { 128 } else { 64 }, true, 16, tk, (2, 1));
        (c.variants, c.kernel) = (v, kernel);
        let start = std::time::Instant::now();
        let mut f = PrefillFixture::<bf16>::new(&c, seed).unwrap();
        if v.alibi != CaseAlibi::None {
            f.alibi_slopes = probe_slopes(2);
        }
        let out = run_emulated(&emu, &f).unwrap();
        let o = f.evaluate(&out).unwrap();
        record(format!("prefill {kernel:?} {}", c.label()), o.passed(), o.summary(), start.elapsed().as_secs_f64());
        // Paged prefill: chunks of 8 and 3 new tokens over 4k–32k contexts.
        let len = [8192, 4096, 16_384, 4096, 32_768][i];
        let mut c = paged_case(64, (4, 1), [16, 64, 1, 256, 16][i], &[(8, len), (3, 4100)]);
        (c.variants, c.num_splits, c.dtype) = (v, Some([1, 3, 1, 2, 5][i]), DType::F16);
        let start = std::time::Instant::now();
        let mut f = PagedPrefillFixture::<f16>::new(&c, seed + 1);
        if v.alibi != CaseAlibi::None {
            f.alibi_slopes = probe_slopes(4);
        }
        let (po, pl, plan) = f.run(&Stream::Emu(&emu), None).unwrap();
        let o = evaluate(&f, seed + 1, plan, &po, &pl).unwrap();
        record(format!("paged prefill {}", c.label()), o.passed(), o.summary(), start.elapsed().as_secs_f64());
        // Decode: 4k–32k contexts, one split, several, planned.
        let c = DecodeCase {
            dtype: DType::Bf16,
            head_dim: 64,
            head_dim_v: None,
            heads_q: 8,
            heads_kv: 1,
            page_size: [16, 256, 1, 64, 16][i],
            seq_lens: if i == 4 { vec![32_768, 4100] } else { vec![[16_384, 4096, 8192, 12_000][i], 5000] },
            num_splits: [Some(1), Some(4), None, Some(2), None][i],
            variants: v,
            rope: None,
            kv: KvFormat::Sixteen,
            schedule: None,
        };
        let start = std::time::Instant::now();
        let mut f = PagedFixture::<bf16>::with_inputs(&c, &DecodeInputs::default(), seed + 2).unwrap();
        if v.alibi != CaseAlibi::None {
            f.alibi_slopes = probe_slopes(8);
        }
        let r = run_inputs_emulated(&emu, &f, seed + 2).unwrap();
        record(format!("decode {}", c.label()), r.outcome.passed(), r.outcome.summary(), start.elapsed().as_secs_f64());
    }
    judge("random_long_context_sweeps", &verdicts);
}
