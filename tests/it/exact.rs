//! Exact-answer tests: inputs whose result is known in closed form, so each output can be held to a bound
//! derived from the arithmetic (fp32 accumulation, the output dtype's one rounding) rather than from a naive
//! implementation's error. The bounds are tight enough that dropping or duplicating **one** token of 4,097
//! (a relative change of ≈ 2.4e-4 in the softmax denominator) fails, in O and in the LSE.
//!
//! Two kinds of input, for prefill (dense and varlen), paged decode (every split choice) and merge:
//!
//! - **Constant keys** (uniform softmax). Every key a query row sees is the same vector `k0` (per sequence
//!   and KV head), so every score is `t = scale · q·k0` and, with `n` visible keys, exactly
//!   `LSE = t + ln n` and `O = mean of the n visible V rows` (fp64). V is drawn from U(-1, 1), so O is small
//!   and one token's share `|v_j − O| / n` stands out against O's rounding.
//! - **A dominant token**: one key `k_dom` with a much larger score (weight ~0.03–0.99) among constant keys,
//!   placed at every boundary the kernels have: first/last key of a KV tile, of a page (page sizes 1, 16,
//!   256), of a split (forced split counts 1, 2, 3 and the maximum), of the sequence, and prefill's query /
//!   key tiles and causal diagonal. Closed form: with `n` visible keys, `Δ = t_dom − t0`,
//!   `O = (e^Δ v_dom + Σ_{j≠dom} v_j) / (e^Δ + n − 1)`, `LSE = t0 + ln(e^Δ + n − 1)`. A kernel that skips,
//!   repeats or mis-addresses the key at a boundary moves O by ~|v_dom − O| and the LSE by up to ln 2.
//!
//! # Bounds (u = 2^-24, `γ(n) = 2u(⌈n/16⌉ + 8)` from `reference::fp32_chain_gamma`)
//!
//! Constant keys. All scores of a row are the *same* fp32 number, so the kernel's P = exp2(s − max) is
//! exactly 1 for every key and P needs no rounding; the row sum is an integer below 2^24, exact in fp32.
//! What remains:
//! - O: the fp32 sums of the V rows, `γ(n) · mean|v|`; the split-KV merge, whose weights come from fp32 LSEs
//!   (relative error `8u(|LSE| + 1)`, times `mean|v| + |O|`); then one rounding to the output dtype,
//!   `half_ulp(dtype, |O| + ε)`.
//! - LSE: the fp32 score `s = fl(q·k0) · fl(scale·log2 e)`: `scale · γ_D · Σ|q_i k0_i|` (`γ_D = 2u(⌈D/16⌉+2)`)
//!   plus `4u|t|`; `(m + log2 n) · ln 2` and the merges in fp32: `8u(|LSE| + ln n + 1)`.
//!
//! Dominant token. O is held to the fp64 reference's arithmetic bound (`reference::Output::out_bound`,
//! which the reference derives for these inputs: P rounding of the non-dominant keys, score and exp2
//! errors, fp32 accumulation, output rounding), and the reference itself to the closed form (1e-12). The
//! LSE bound adds to the constant-key one the row sum's fp32 error `γ(n)` and two exp2 rescalings `2·2^-21`.
//!
//! One token of 4,097 moves the LSE by ln(4097/4096) = 2.4e-4 against a bound of ~1e-5, and O by
//! |v_j − O|/4097 (up to ~2.4e-4) against a bound of ~3e-5 for O ≈ 0.01 (bf16).
//!
//! Reproducible: inputs come from the run's base seed (FA_SEED or the fixed default); a failure prints the
//! seed and the command that reruns the test.
use crate::common;

use fused_attn::plan::DecodePlan;
use fused_attn::prefill::{PrefillKernel, TileConfig};
use fused_attn::reference::{self, fp32_chain_gamma, half_ulp, Arith, Variants};
use fused_attn::testkit::cases::decode::{run_inputs_emulated, DecodeCase, DecodeInputs, PagedFixture};
use fused_attn::testkit::cases::prefill::{run_emulated, PrefillFixture};
use fused_attn::testkit::cases::prefill::{CaseLayout, PrefillCase};
use fused_attn::testkit::cost_model::decode_tile_tokens;
use fused_attn::testkit::variants::{CaseAlibi, CaseVariants};
use fused_attn::{DType, Element, Emulator};
use half::{bf16, f16};
use rand::Rng;

const U: f64 = 1.0 / (1u64 << 24) as f64;
const EXP2_REL_ERR: f64 = 1.0 / (1u64 << 21) as f64;

/// `$f::<T>(args)` for `T` the 16-bit type of the runtime dtype `$dtype`.
macro_rules! by_dtype {
    ($dtype:expr, $f:ident($($arg:expr),* $(,)?)) => {
        match $dtype {
            DType::F16 => $f::<f16>($($arg),*),
            DType::Bf16 => $f::<bf16>($($arg),*),
        }
    };
}

// ------------------------------------------------------------------------------------------------ bounds

/// The score arithmetic's error on `t = scale · q·k` (fp32 dot on tensor cores, fp32 scale·log2 e).
fn score_err(scale: f64, q: &[f64], k: &[f64]) -> f64 {
    let gamma_d = 2.0 * U * (q.len().div_ceil(16) + 2) as f64;
    let abs_dot: f64 = q.iter().zip(k).map(|(a, b)| (a * b).abs()).sum();
    scale.abs() * gamma_d * abs_dot + 4.0 * U * (scale * abs_dot).abs()
}

/// LSE bound (see the module docs): `score` the score error, `n` the visible keys, `sum_exact` whether the
/// row sum is exact (constant keys).
fn lse_bound(lse: f64, score: f64, n: usize, sum_exact: bool) -> f64 {
    let sum = if sum_exact { 0.0 } else { fp32_chain_gamma(n) + 2.0 * EXP2_REL_ERR };
    score + sum + 8.0 * U * (lse.abs() + (n as f64).ln() + 1.0)
}

/// O bound for constant keys (see the module docs).
fn uniform_out_bound(dtype: DType, o: f64, mean_abs_v: f64, n: usize, lse: f64) -> f64 {
    let eps = fp32_chain_gamma(n) * mean_abs_v + 8.0 * U * (lse.abs() + 1.0) * (mean_abs_v + o.abs());
    eps + half_ulp(Some(dtype), o.abs() + eps)
}

/// The closed form of a constant-key row with a sink and a softcap (exact for plain rows too): `n` keys
/// of raw score `t` (before the softcap `c`), sink logit `sink`. Returns (the score after the softcap,
/// LSE = log(e^σ + n e^t'), the keys' total weight n e^t' / (e^σ + n e^t')).
fn uniform_closed_form(t: f64, n: usize, softcap: Option<f64>, sink: Option<f64>) -> (f64, f64, f64) {
    let t = softcap.map_or(t, |c| c * (t / c).tanh());
    let keys = t + (n as f64).ln();
    match sink {
        None => (t, keys, 1.0),
        Some(s) => {
            let m = keys.max(s);
            let lse = m + ((keys - m).exp() + (s - m).exp()).ln();
            (t, lse, (keys - lse).exp())
        }
    }
}

/// What a softcap and a sink add to the constant-key bounds (relative weight error and LSE error): the
/// softcap's tanh (a few ulp of c, see reference::Output::out_bound), the sink's fp32 logit and the two
/// exp2 of its rescaling, the row sum no longer exact.
fn variant_err(t: f64, n: usize, softcap: Option<f64>, sink: Option<f64>) -> f64 {
    let mut e = softcap.map_or(0.0, |c| c / (1u64 << 20) as f64);
    if let Some(s) = sink {
        e += fp32_chain_gamma(n) + 4.0 * EXP2_REL_ERR + 16.0 * U * (t.abs() + s.abs() + 1.0);
    }
    e
}

/// The verdict on one exact case: worst O and LSE error against their bounds.
struct Verdict {
    label: String,
    o: (f64, usize),
    lse: (f64, usize),
    o_err: f64,
    lse_err: f64,
}

impl Verdict {
    fn new(label: String, o: (&[f64], &[f64], &[f64]), lse: (&[f64], &[f64], &[f64])) -> Self {
        let ((wo, io, _), (wl, il, _)) = (common::worst(o.0, o.1, o.2), common::worst(lse.0, lse.1, lse.2));
        let (wo, wl) = ((wo, io), (wl, il));
        let err = |a: &[f64], b: &[f64], i: usize| if a.is_empty() { 0.0 } else { (a[i] - b[i]).abs() };
        Verdict { o_err: err(o.0, o.1, wo.1), lse_err: err(lse.0, lse.1, wl.1), label, o: wo, lse: wl }
    }
    fn passed(&self) -> bool {
        self.o.0 <= 1.0 && self.lse.0 <= 1.0
    }
    fn line(&self) -> String {
        format!(
            "{}: O err/bound {:.3} (|err| {:.2e} at {}), LSE err/bound {:.3} (|err| {:.2e} at {})",
            self.label, self.o.0, self.o_err, self.o.1, self.lse.0, self.lse_err, self.lse.1
        )
    }
}

/// Prints every verdict and fails listing those over their bounds, with the command that reruns `test`.
fn judge(test: &str, verdicts: &[Verdict]) {
    let mut failed = Vec::new();
    for v in verdicts {
        eprintln!("{} {}", if v.passed() { "ok  " } else { "FAIL" }, v.line());
        if !v.passed() {
            failed.push(v.line());
        }
    }
    assert!(
        failed.is_empty(),
        "{test}: {} exact cases over their bounds (base seed {:#x}):\n{}\n{}",
        failed.len(),
        common::base_seed(),
        failed.join("\n"),
        common::rerun("exact", test, None)
    );
}

fn f64s<T: Element>(x: &[T]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

// ------------------------------------------------------------------------------------------------ decode

/// What to place in a decode cache: constant keys, or constant keys with one dominant key per sequence.
#[derive(Clone, Debug)]
enum Keys {
    Uniform,
    /// Position of the dominant key in each sequence.
    Dominant(Vec<usize>),
}

/// Fills the fixture's owned cache slots: per (sequence, KV head) a constant key k0 (U(-1, 1)), the dominant
/// key `k0 + 2·1` where asked, V from U(-1, 1); q = 0.3 + U(-1, 1) (positive mean, so the dominant key's
/// score `t0 + 2·scale·Σq` is well above t0). Unowned slots stay NaN.
fn fill_decode<T: Element>(f: &mut PagedFixture<T>, keys: &Keys, seed: u64) {
    let mut rng = fused_attn::testkit::seed::rng(seed);
    let c = f.case.clone();
    let (hkv, d) = (c.heads_kv, c.head_dim);
    for x in f.q.iter_mut() {
        *x = T::from_f64(0.3 + rng.random_range(-1.0..1.0));
    }
    for b in 0..c.batch() {
        let k0: Vec<T> = (0..hkv * d).map(|_| T::from_f64(rng.random_range(-1.0..1.0))).collect();
        for t in 0..c.seq_lens[b] {
            let at = f.slot(b, t) * hkv * d;
            let dominant = matches!(keys, Keys::Dominant(p) if p[b] == t);
            for (i, &k) in k0.iter().enumerate() {
                f.k_cache[at + i] = if dominant { T::from_f64(k.to_f64() + 2.0) } else { k };
                f.v_cache[at + i] = T::from_f64(rng.random_range(-1.0..1.0));
            }
        }
    }
}

/// Runs one exact decode configuration on the emulator and judges it against the closed forms.
fn decode_exact<T: Element>(emu: &Emulator, label: &str, case: &DecodeCase, keys: &Keys, seed: u64) -> Verdict {
    let inputs = DecodeInputs::default();
    let mut f = PagedFixture::<T>::with_inputs(case, &inputs, seed).unwrap();
    fill_decode(&mut f, keys, seed ^ 0xe8ac7);
    let run = run_inputs_emulated(emu, &f, seed).unwrap();
    let (hq, hkv, d) = (case.heads_q, case.heads_kv, case.head_dim);
    let scale = f.scale();
    let q = f64s(&f.q);
    let (mut want_o, mut want_lse, mut o_bound, mut lse_bd) = (vec![], vec![], vec![], vec![]);
    // The reference's arithmetic bound (dominant keys) from the gathered cache.
    let (kc, vc) = (f64s(&f.k_cache), f64s(&f.v_cache));
    let cache = reference::PagedCache {
        k_cache: &kc,
        v_cache: &vc,
        num_pages: f.num_pages,
        page_size: case.page_size,
        heads_kv: hkv,
        head_dim: d,
        head_dim_v: d,
        block_table: &f.block_table,
        max_pages_per_seq: f.width,
        seq_lens: &f.seq_lens,
    };
    let r = reference::paged_decode(hq, scale, &Variants::default(), Arith::F64, &q, &cache).unwrap();
    let ref_bound = r.out_bound(Some(T::DTYPE), Some(T::DTYPE));
    // Windows, softcaps and sinks keep the constant-key closed forms (see prefill_exact).
    assert!(case.variants.alibi == CaseAlibi::None && (matches!(keys, Keys::Uniform) || case.variants.is_plain()));
    let softcap = case.variants.softcap.map(f64::from);
    for b in 0..case.batch() {
        let len = case.seq_lens[b];
        let n = case.visible_tokens(len);
        let lo = len - n; // the window's first token
        let (k, v) = f.dense_kv(b);
        let (k, v) = (f64s(&k), f64s(&v));
        for h in 0..hq {
            let g = h / (hq / hkv);
            let qr = &q[(b * hq + h) * d..][..d];
            let row = |j: usize, x: &[f64]| x[(j * hkv + g) * d..][..d].to_vec();
            let sink = f.sinks.get(h).map(|&x| f64::from(x));
            if n == 0 {
                want_o.extend(std::iter::repeat_n(0.0, d));
                o_bound.extend(std::iter::repeat_n(f64::MIN_POSITIVE, d));
                want_lse.push(sink.unwrap_or(f64::NEG_INFINITY));
                lse_bd.push(sink.map_or(f64::MIN_POSITIVE, |sk| 8.0 * U * sk.abs().max(1.0)));
                continue;
            }
            let k0 = row(if matches!(keys, Keys::Dominant(p) if p[b] == 0) { 1.min(n - 1) } else { lo }, &k);
            let t0 = scale * dot(qr, &k0);
            let err0 = score_err(scale, qr, &k0);
            match keys {
                Keys::Uniform => {
                    let (t, lse, weight) = uniform_closed_form(t0, n, softcap, sink);
                    let extra = variant_err(t, n, softcap, sink);
                    for x in 0..d {
                        let col: Vec<f64> = (lo..len).map(|j| v[(j * hkv + g) * d + x]).collect();
                        let o = weight * col.iter().sum::<f64>() / n as f64;
                        let mean_abs = col.iter().map(|y| y.abs()).sum::<f64>() / n as f64;
                        want_o.push(o);
                        o_bound.push(
                            uniform_out_bound(T::DTYPE, o, mean_abs, n, lse) + 2.0 * extra * (mean_abs + o.abs()),
                        );
                    }
                    want_lse.push(lse);
                    lse_bd.push(lse_bound(lse, err0, n, sink.is_none()) + extra);
                }
                Keys::Dominant(pos) => {
                    let p = pos[b];
                    let kd = row(p, &k);
                    let delta = scale * dot(qr, &kd) - t0;
                    let (e, denom) = (delta.exp(), delta.exp() + (n - 1) as f64);
                    let first = want_o.len();
                    for x in 0..d {
                        let others: f64 = (0..n).filter(|&j| j != p).map(|j| v[(j * hkv + g) * d + x]).sum();
                        want_o.push((e * v[(p * hkv + g) * d + x] + others) / denom);
                    }
                    // The reference agrees with the closed form, and its bound is the one O is held to.
                    let at = (b * hq + h) * d;
                    for x in 0..d {
                        assert!((r.out[at + x] - want_o[first + x]).abs() < 1e-12, "reference vs closed form");
                    }
                    o_bound.extend_from_slice(&ref_bound[at..at + d]);
                    let lse = t0 + denom.ln();
                    assert!((r.lse[b * hq + h] - lse).abs() < 1e-10, "reference LSE vs closed form");
                    let err = err0 + score_err(scale, qr, &kd);
                    want_lse.push(lse);
                    lse_bd.push(lse_bound(lse, err, n, false));
                }
            }
        }
    }
    let (o, lse) = (f64s(&run.o), run.lse.iter().map(|&x| x as f64).collect::<Vec<f64>>());
    let label = format!("{label} [{} splits={}]", case.label(), run.outcome.plan.num_splits());
    Verdict::new(label, (&o, &want_o, &o_bound), (&lse, &want_lse, &lse_bd))
}

/// (dtype, head dim, (Hq, Hkv), page size, forced splits) of a decode configuration.
type DecodeConfig = (DType, usize, (usize, usize), usize, Option<usize>);

/// Forced split count that gives every split one 64-token granule (the most a sequence of `n` can use).
fn max_splits(n: usize) -> usize {
    n.div_ceil(fused_attn::plan::SPLIT_GRANULE)
}

/// Constant keys at 4,097 tokens (and 4,096, 1, 17 in the same batch) for split counts 1, 2, 3 and the
/// maximum, page sizes 1, 16 and 256.
#[test]
fn decode_uniform_4097() {
    let emu = Emulator::new();
    let lens = vec![4097, 1, 4096, 17];
    let configs: [DecodeConfig; 4] = [
        (DType::Bf16, 128, (8, 2), 16, Some(1)),
        (DType::F16, 128, (4, 1), 1, Some(2)),
        (DType::Bf16, 64, (16, 2), 256, Some(3)),
        (DType::Bf16, 256, (2, 1), 16, Some(max_splits(4097))),
    ];
    let verdicts: Vec<Verdict> = configs
        .iter()
        .enumerate()
        .map(|(i, &(dt, d, heads, ps, s))| {
            let case = DecodeCase::new(dt, d, heads, ps, &lens, s);
            by_dtype!(dt, decode_exact(&emu, "uniform", &case, &Keys::Uniform, common::case_seed(i)))
        })
        .collect();
    judge("decode_uniform_4097", &verdicts);
}

/// Constant keys over a 128k-token context (planned split-KV), and 32k with the maximum split count.
#[test]
fn decode_uniform_long_contexts() {
    let emu = Emulator::new();
    let long = DecodeCase::new(DType::Bf16, 128, (8, 1), 256, &[131_072, 3], None);
    let many = DecodeCase::new(DType::F16, 64, (4, 1), 16, &[32_768], Some(max_splits(32_768)));
    let verdicts = vec![
        by_dtype!(DType::Bf16, decode_exact(&emu, "uniform 128k", &long, &Keys::Uniform, common::case_seed(10))),
        by_dtype!(DType::F16, decode_exact(&emu, "uniform 32k", &many, &Keys::Uniform, common::case_seed(11))),
    ];
    judge("decode_uniform_long_contexts", &verdicts);
}

/// Every boundary position of a decode configuration: the first and last key of the sequence, of the KV
/// tiles, pages and splits around the middle, one sequence per position.
fn boundary_positions(n: usize, tile: usize, page: usize, split: usize) -> Vec<usize> {
    let mut p = vec![0, n - 1, tile - 1, tile, n / 2 / tile * tile - 1, n / 2 / tile * tile];
    for unit in [page, split] {
        if unit > 1 && unit < n {
            p.extend([unit - 1, unit, (n / unit - 1) * unit - 1, (n / unit - 1) * unit]);
        } else if unit == 1 {
            p.push(n / 3);
        }
    }
    p.retain(|&x| x < n);
    p.sort_unstable();
    p.dedup();
    p
}

/// A dominant key at every boundary (tile, page 1/16/256, split 1/2/3/max, sequence ends).
#[test]
fn decode_dominant_token_at_every_boundary() {
    let emu = Emulator::new();
    let n = 1000;
    let configs: [DecodeConfig; 4] = [
        (DType::Bf16, 128, (8, 2), 16, Some(1)),
        (DType::F16, 64, (4, 1), 1, Some(3)),
        (DType::Bf16, 128, (16, 2), 256, Some(2)),
        (DType::F16, 256, (4, 2), 16, Some(max_splits(n))),
    ];
    let verdicts: Vec<Verdict> = configs
        .iter()
        .enumerate()
        .map(|(i, &config)| decode_dominant_at_boundaries(&emu, config, n, common::case_seed(20 + i)))
        .collect();
    judge("decode_dominant_token_at_every_boundary", &verdicts);
}

/// One sequence of `n` tokens per boundary position of `config` (KV tile, page, split), each with its dominant
/// key there.
fn decode_dominant_at_boundaries(emu: &Emulator, (dt, d, heads, ps, s): DecodeConfig, n: usize, seed: u64) -> Verdict {
    let probe = DecodeCase::new(dt, d, heads, ps, &[n], s);
    let plan = DecodePlan::new(&probe.problem(), 1, s).unwrap();
    let split = if plan.num_splits() > 1 { plan.split_tokens() } else { n };
    let pos = boundary_positions(n, decode_tile_tokens(d), ps, split);
    let case = DecodeCase::new(dt, d, heads, ps, &vec![n; pos.len()], s);
    let label = format!("dominant at {pos:?}");
    by_dtype!(dt, decode_exact(emu, &label, &case, &Keys::Dominant(pos), seed))
}

/// D = 512 (Gemma 4's global layers; the width-512 kernel, whose 4 D-split warps each compute a quarter of
/// S and sum the quarters through shared memory) and 264 (the smallest dim it serves): constant keys at
/// 2,049 tokens unsplit and with the maximum split count, and a dominant key at every boundary (16-token
/// tile, page 1 / 16, split), fp16 and bf16. (Shorter than the 4,097 of the other widths: the emulator
/// takes ~4 s of CPU for all of it at D = 512.)
#[test]
fn decode_exact_at_512() {
    let emu = Emulator::new();
    let lens = vec![2049, 1, 17];
    let mut verdicts = Vec::new();
    let uniform: [DecodeConfig; 2] =
        [(DType::Bf16, 512, (8, 2), 16, Some(1)), (DType::F16, 264, (4, 1), 256, Some(max_splits(2049)))];
    for (i, &(dt, d, heads, ps, s)) in uniform.iter().enumerate() {
        let case = DecodeCase::new(dt, d, heads, ps, &lens, s);
        verdicts.push(by_dtype!(dt, decode_exact(&emu, "uniform", &case, &Keys::Uniform, common::case_seed(40 + i))));
    }
    let n = 333;
    let dominant: [DecodeConfig; 2] =
        [(DType::F16, 512, (16, 2), 16, Some(2)), (DType::Bf16, 512, (4, 4), 1, Some(max_splits(n)))];
    for (i, &config) in dominant.iter().enumerate() {
        verdicts.push(decode_dominant_at_boundaries(&emu, config, n, common::case_seed(42 + i)));
    }
    judge("decode_exact_at_512", &verdicts);
}

// ------------------------------------------------------------------------------------------------ prefill

/// Fills a prefill fixture: per (sequence, KV head) constant keys k0 = U(-1, 1) (the dominant key of
/// sequence b at `dominant[b]` is `k0 + 2·1`), V = U(-1, 1), q = 0.3 + U(-1, 1).
fn fill_prefill<T: Element>(f: &mut PrefillFixture<T>, dominant: Option<&[usize]>, seed: u64) {
    let mut rng = fused_attn::testkit::seed::rng(seed);
    let c = f.case.clone();
    let seqs: Vec<(usize, usize)> = match &c.varlen {
        Some(s) => {
            let mut k0 = 0;
            s.iter()
                .map(|&(_, tk)| {
                    k0 += tk;
                    (k0 - tk, tk)
                })
                .collect()
        }
        None => (0..c.batch).map(|_| (0, c.seqlen_k)).collect(),
    };
    let set = |f: &mut PrefillFixture<T>, which: char, idx: [usize; 4], val: f64| {
        let p = if which == 'k' {
            f.k
        } else if which == 'v' {
            f.v
        } else {
            f.q
        };
        let at = p.at(idx);
        f.bufs[p.buf][at] = T::from_f64(val);
    };
    let [qb, qt, qh, d] = f.q.shape;
    for b in 0..qb {
        for t in 0..qt {
            for h in 0..qh {
                for x in 0..d {
                    set(f, 'q', [b, t, h, x], 0.3 + rng.random_range(-1.0..1.0));
                }
            }
        }
    }
    for (s, &(k_start, tk)) in seqs.iter().enumerate() {
        let b = if c.varlen.is_some() { 0 } else { s };
        for h in 0..c.heads_kv {
            let k0: Vec<f64> = (0..d).map(|_| T::from_f64(rng.random_range(-1.0..1.0)).to_f64()).collect();
            for j in 0..tk {
                let dom = dominant.is_some_and(|p| p[s] == j);
                for (x, &k) in k0.iter().enumerate() {
                    set(f, 'k', [b, k_start + j, h, x], k + if dom { 2.0 } else { 0.0 });
                    set(f, 'v', [b, k_start + j, h, x], rng.random_range(-1.0..1.0));
                }
            }
        }
    }
}

/// Runs one exact prefill configuration (dense or varlen) on the emulator and judges it.
fn prefill_exact<T: Element>(
    emu: &Emulator,
    label: &str,
    case: &PrefillCase,
    dominant: Option<&[usize]>,
    seed: u64,
) -> Verdict {
    let mut f = PrefillFixture::<T>::new(case, seed).unwrap();
    fill_prefill(&mut f, dominant, seed ^ 0x5eed);
    let out = run_emulated(emu, &f).unwrap();
    let (hq, hkv, d) = (case.heads_q, case.heads_kv, case.head_dim);
    let scale = f.scale();
    // Score variants keep the closed forms for constant keys: a window changes the visible keys, a softcap
    // the common score, a sink the denominator (ALiBi would make the scores differ: not here).
    assert!(case.variants.alibi == CaseAlibi::None && (dominant.is_none() || case.variants.is_plain()));
    let (slopes, sinks) = f.variant_values();
    let var = case.variants.reference(&slopes, &sinks);
    let softcap = var.softcap;
    let (q, k, v) = (f.logical(&f.q), f.logical(&f.k), f.logical(&f.v));
    // (q offset, tq, k offset, tk) per sequence, in tokens of the logical [B·T] / packed layout.
    let seqs: Vec<(usize, usize, usize, usize)> = match &case.varlen {
        Some(s) => {
            let (mut q0, mut k0) = (0, 0);
            s.iter()
                .map(|&(tq, tk)| {
                    let r = (q0, tq, k0, tk);
                    q0 += tq;
                    k0 += tk;
                    r
                })
                .collect()
        }
        None => (0..case.batch).map(|b| (b * case.seqlen_q, case.seqlen_q, b * case.seqlen_k, case.seqlen_k)).collect(),
    };
    let total_q: usize = seqs.iter().map(|s| s.1).sum();
    let mut want_o = vec![0.0; total_q * hq * d];
    let mut o_bound = vec![0.0; total_q * hq * d];
    // LSE in the fixture's logical order: [B, Hq, Tq] dense, [Hq, total_q] varlen.
    let mut want_lse = vec![f64::NEG_INFINITY; total_q * hq];
    let mut lse_bd = vec![f64::MIN_POSITIVE; total_q * hq];
    let lse_at = |s: usize, i: usize, h: usize| match &case.varlen {
        Some(_) => h * total_q + seqs[s].0 + i,
        None => (s * hq + h) * case.seqlen_q + i,
    };
    for (s, &(q0, tq, k0, tk)) in seqs.iter().enumerate() {
        for h in 0..hq {
            let g = h / (hq / hkv);
            let krow = |j: usize| &k[((k0 + j) * hkv + g) * d..][..d];
            let vrow = |j: usize| &v[((k0 + j) * hkv + g) * d..][..d];
            let sink = var.sinks.map(|sk| sk[h]);
            for i in 0..tq {
                let (lo, hi) = var.visible_range(case.causal, tq, tk, i);
                let n = hi - lo;
                let at = ((q0 + i) * hq + h) * d;
                let li = lse_at(s, i, h);
                if n == 0 {
                    o_bound[at..at + d].fill(f64::MIN_POSITIVE);
                    if let Some(sk) = sink {
                        (want_lse[li], lse_bd[li]) = (sk, 8.0 * U * sk.abs().max(1.0));
                    }
                    continue;
                }
                let qr = &q[at..at + d];
                let dom = dominant.map(|p| p[s]).filter(|&p| p < n);
                let base_key = if dom == Some(0) { 1.min(n - 1) } else { lo };
                let t0 = scale * dot(qr, krow(base_key));
                let err0 = score_err(scale, qr, krow(base_key));
                match dom {
                    None => {
                        let (t, lse, weight) = uniform_closed_form(t0, n, softcap, sink);
                        let extra = variant_err(t, n, softcap, sink);
                        for x in 0..d {
                            let mean = (lo..hi).map(|j| vrow(j)[x]).sum::<f64>() / n as f64;
                            want_o[at + x] = weight * mean;
                            let mean_abs = (lo..hi).map(|j| vrow(j)[x].abs()).sum::<f64>() / n as f64;
                            o_bound[at + x] = uniform_out_bound(case.dtype, want_o[at + x], mean_abs, n, lse)
                                + 2.0 * extra * (mean_abs + want_o[at + x].abs());
                        }
                        want_lse[li] = lse;
                        lse_bd[li] = lse_bound(lse, err0, n, sink.is_none()) + extra;
                    }
                    Some(p) => {
                        let delta = scale * dot(qr, krow(p)) - t0;
                        let (e, denom) = (delta.exp(), delta.exp() + (n - 1) as f64);
                        for x in 0..d {
                            let others: f64 = (0..n).filter(|&j| j != p).map(|j| vrow(j)[x]).sum();
                            want_o[at + x] = (e * vrow(p)[x] + others) / denom;
                        }
                        // The reference's bound for this row (its own fp64 computation of the same row).
                        let mut pr = reference::Problem::new(1, 1, 1, 1, n, d, false);
                        pr.scale = scale;
                        let ks: Vec<f64> = (0..n).flat_map(|j| krow(j).to_vec()).collect();
                        let vs: Vec<f64> = (0..n).flat_map(|j| vrow(j).to_vec()).collect();
                        let r = reference::dense(&pr, &Variants::default(), Arith::F64, qr, &ks, &vs).unwrap();
                        for x in 0..d {
                            assert!((r.out[x] - want_o[at + x]).abs() < 1e-12, "reference vs closed form");
                        }
                        o_bound[at..at + d].copy_from_slice(&r.out_bound(Some(case.dtype), Some(case.dtype)));
                        let lse = t0 + denom.ln();
                        want_lse[li] = lse;
                        lse_bd[li] = lse_bound(lse, err0 + score_err(scale, qr, krow(p)), n, false);
                    }
                }
            }
        }
    }
    let o = f.logical_o(&out);
    let lse: Vec<f64> = f.logical_lse(&out).unwrap().iter().map(|&x| x as f64).collect();
    let label = format!("{label} [{}]", case.label());
    Verdict::new(label, (&o, &want_o, &o_bound), (&lse, &want_lse, &lse_bd))
}

fn prefill_case(
    dtype: DType,
    d: usize,
    heads: (usize, usize),
    b: usize,
    tq: usize,
    tk: usize,
    causal: bool,
) -> PrefillCase {
    PrefillCase { batch: b, ..PrefillCase::dense(dtype, d, causal, tq, tk, heads) }
}

/// Constant keys: dense causal and not, a chunked-prefill shape with Tk = 8192 (rows see 8,129..8,192 keys),
/// Tq > Tk (empty rows), and varlen batches (each sequence its own k0, so a key leaking across sequences
/// changes the score).
#[test]
fn prefill_uniform() {
    let emu = Emulator::new();
    let varlen = PrefillCase::varlen(DType::Bf16, 128, true, (4, 2), vec![(65, 4097), (0, 7), (130, 130), (1, 33)]);
    let mut varlen_nc = varlen.clone();
    (varlen_nc.dtype, varlen_nc.head_dim, varlen_nc.causal, varlen_nc.layout) =
        (DType::F16, 64, false, CaseLayout::Padded);
    let cases = [
        prefill_case(DType::Bf16, 128, (2, 1), 1, 64, 8192, true),
        prefill_case(DType::F16, 64, (2, 2), 1, 256, 4097, false),
        prefill_case(DType::Bf16, 256, (2, 1), 2, 200, 200, true),
        prefill_case(DType::F16, 128, (4, 1), 1, 150, 97, true),
        varlen,
        varlen_nc,
    ];
    let verdicts: Vec<Verdict> = cases
        .iter()
        .enumerate()
        .map(|(i, c)| by_dtype!(c.dtype, prefill_exact(&emu, "uniform", c, None, common::case_seed(30 + i))))
        .collect();
    judge("prefill_uniform", &verdicts);
}

/// A dominant key at the first/last key of KV tiles (Bc), around query-tile (Br) edges and the causal
/// diagonal, and at the sequence ends, one batch entry per position.
#[test]
fn prefill_dominant_token_at_every_boundary() {
    let emu = Emulator::new();
    let mut verdicts = Vec::new();
    for (i, &(dt, d, causal)) in
        [(DType::Bf16, 128, true), (DType::F16, 64, false), (DType::Bf16, 256, true)].iter().enumerate()
    {
        let cfg = TileConfig::for_head_dim(d).unwrap();
        let (tq, tk) = (cfg.block_m + 1, 3 * cfg.block_n + 1 + cfg.block_m);
        let (bn, bm, delta) = (cfg.block_n, cfg.block_m, tk - tq);
        let mut pos = vec![0, tk - 1, bn - 1, bn, 2 * bn - 1, 2 * bn, delta, delta + bm - 1, delta + bm];
        pos.retain(|&p| p < tk);
        pos.sort_unstable();
        pos.dedup();
        let mut case = prefill_case(dt, d, (2, 1), 0, 0, 0, causal);
        case.varlen = Some(vec![(tq, tk); pos.len()]);
        (case.batch, case.seqlen_q, case.seqlen_k) = (pos.len(), tq, tk);
        let label = format!("dominant at {pos:?}");
        verdicts.push(by_dtype!(case.dtype, prefill_exact(&emu, &label, &case, Some(&pos), common::case_seed(40 + i))));
        // The same positions in a dense batch (B = positions).
        let dense = prefill_case(dt, d, (2, 1), pos.len(), tq, tk, causal);
        verdicts
            .push(by_dtype!(dense.dtype, prefill_exact(&emu, &label, &dense, Some(&pos), common::case_seed(50 + i))));
    }
    judge("prefill_dominant_token_at_every_boundary", &verdicts);
}

// ------------------------------------------------------------------------------------------------ merge

/// `merge_states` of `sv`/`lv` into `o` (`[rows, 1, d]`) and `lo`, its elements widened by `wide`.
fn merged<O: fused_attn::merge::MergeElement>(
    stream: &fused_attn::Stream<'_>,
    sv: &fused_attn::TensorView<'_, f32, 4>,
    lv: &fused_attn::TensorView<'_, f32, 3>,
    lo: &mut fused_attn::TensorViewMut<'_, f32, 2>,
    mut o: Vec<O>,
    d: usize,
    wide: impl Fn(O) -> f64,
) -> Vec<f64> {
    let rows = o.len() / d;
    let mut ov = fused_attn::TensorViewMut::host(&mut o, [rows, 1, d]).unwrap();
    fused_attn::merge::merge_states(stream, sv, lv, &mut ov, Some(lo)).unwrap();
    o.into_iter().map(wide).collect()
}

/// Merging the partial states of a constant-key problem split into chunks gives exactly the whole problem's
/// state: O = the mean of all V rows, LSE = t + ln n. Chunks of a 4,097-token context in 1, 2, 3 and 21
/// states (fp32 states, the split-KV workspace's type), into bf16, f16 and fp32 outputs.
#[test]
fn merge_uniform_chunks() {
    use fused_attn::{Stream, TensorView, TensorViewMut};
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let (n, rows, d) = (4097usize, 6usize, 64usize);
    let mut verdicts = Vec::new();
    for (ci, &states) in [1usize, 2, 3, 21].iter().enumerate() {
        let mut rng = fused_attn::testkit::seed::rng(common::case_seed(60 + ci));
        // Chunk boundaries: random cuts, one chunk possibly tiny.
        let mut cuts: Vec<usize> = (1..states).map(|_| rng.random_range(1..n)).collect();
        cuts.extend([0, n]);
        cuts.sort_unstable();
        let v: Vec<f64> = (0..rows * n * d).map(|_| rng.random_range(-1.0..1.0)).collect();
        let t: Vec<f64> = (0..rows).map(|_| rng.random_range(-3.0..3.0)).collect();
        let (mut os, mut ls) = (vec![0f32; states * rows * d], vec![0f32; states * rows]);
        for s in 0..states {
            let (a, b) = (cuts[s], cuts[s + 1]);
            for r in 0..rows {
                ls[s * rows + r] = if b > a { (t[r] + ((b - a) as f64).ln()) as f32 } else { f32::NEG_INFINITY };
                for x in 0..d {
                    let sum: f64 = (a..b).map(|j| v[(r * n + j) * d + x]).sum();
                    os[(s * rows + r) * d + x] = if b > a { (sum / (b - a) as f64) as f32 } else { f32::NAN };
                }
            }
        }
        let want_lse: Vec<f64> = t.iter().map(|x| x + (n as f64).ln()).collect();
        let want_o: Vec<f64> =
            (0..rows * d).map(|e| (0..n).map(|j| v[((e / d) * n + j) * d + e % d]).sum::<f64>() / n as f64).collect();
        let mean_abs = v.iter().map(|x| x.abs()).sum::<f64>() / v.len() as f64;
        // States rounded to fp32 (u·|O_s| and u·|lse_s|), merged with fp32 weights, rounded once.
        let run = |out_dt: Option<DType>| -> Verdict {
            let mut lse = vec![f32::NAN; rows];
            let sv = TensorView::host(&os, [states, rows, 1, d]).unwrap();
            let lv = TensorView::host(&ls, [states, rows, 1]).unwrap();
            let mut lo = TensorViewMut::host(&mut lse, [rows, 1]).unwrap();
            // Merged into a NaN-poisoned O of the output type, widened.
            let o: Vec<f64> = match out_dt {
                None => merged(&stream, &sv, &lv, &mut lo, vec![f32::NAN; rows * d], d, f64::from),
                Some(DType::Bf16) => merged(&stream, &sv, &lv, &mut lo, vec![bf16::NAN; rows * d], d, bf16::to_f64),
                Some(DType::F16) => merged(&stream, &sv, &lv, &mut lo, vec![f16::NAN; rows * d], d, f16::to_f64),
            };
            let o_bound: Vec<f64> = want_o
                .iter()
                .enumerate()
                .map(|(e, &w)| {
                    let l = want_lse[e / d];
                    let eps = (states as f64 + 2.0) * U * (mean_abs + w.abs())
                        + 8.0 * U * (l.abs() + 1.0) * (mean_abs + w.abs());
                    eps + half_ulp(out_dt, w.abs() + eps)
                })
                .collect();
            let lse_bd: Vec<f64> =
                want_lse.iter().map(|&l| 8.0 * U * (l.abs() + (n as f64).ln() + states as f64 + 1.0)).collect();
            let lse64: Vec<f64> = lse.iter().map(|&x| x as f64).collect();
            let label = format!("merge {states} chunks of {n} tokens {cuts:?} -> {out_dt:?}");
            Verdict::new(label, (&o, &want_o, &o_bound), (&lse64, &want_lse, &lse_bd))
        };
        for out_dt in [None, Some(DType::Bf16), Some(DType::F16)] {
            verdicts.push(run(out_dt));
        }
    }
    judge("merge_uniform_chunks", &verdicts);
}

// ------------------------------------------------------------------------------------------------ self-check

/// The bounds are tight enough to matter: the closed forms with one token of 4,097 dropped or duplicated
/// differ from the true ones by more than the bounds allow (for the LSE in every row; for O in the rows
/// where the token's V is not close to the mean), so a kernel making that mistake cannot pass.
#[test]
fn one_token_of_4097_exceeds_the_bounds() {
    let mut rng = fused_attn::testkit::seed::rng(common::case_seed(70));
    let (n, d) = (4097usize, 128usize);
    let v: Vec<f64> = (0..n * d).map(|_| bf16::from_f64(rng.random_range(-1.0..1.0)).to_f64()).collect();
    let t = 1.7;
    let mean =
        |m: usize| -> Vec<f64> { (0..d).map(|x| (0..m).map(|j| v[j * d + x]).sum::<f64>() / m as f64).collect() };
    let mean_abs = v.iter().map(|x| x.abs()).sum::<f64>() / v.len() as f64;
    let (o, lse) = (mean(n), t + (n as f64).ln());
    let lse_b = lse_bound(lse, 1e-6, n, true);
    let dropped = mean(n - 1);
    // Dropping one token.
    let lse2 = t + ((n - 1) as f64).ln();
    assert!((lse2 - lse).abs() > 10.0 * lse_b, "dropped: LSE moves {:.2e}, bound {lse_b:.2e}", (lse2 - lse).abs());
    let over =
        (0..d).filter(|&x| (dropped[x] - o[x]).abs() > uniform_out_bound(DType::Bf16, o[x], mean_abs, n, lse)).count();
    assert!(over > d / 2, "dropped: only {over} of {d} columns of O move past the bound");
    // Duplicating token 0 (n + 1 rows with v_0 twice).
    let dup: Vec<f64> = (0..d).map(|x| (o[x] * n as f64 + v[x]) / (n + 1) as f64).collect();
    let over =
        (0..d).filter(|&x| (dup[x] - o[x]).abs() > uniform_out_bound(DType::Bf16, o[x], mean_abs, n, lse)).count();
    assert!(over > d / 2, "duplicated: only {over} of {d} columns of O move past the bound");
}

// ------------------------------------------------------------------------------------------------ variants

/// The variants of [`variants_over_constant_keys`] (ALiBi has no constant-key closed form).
const CONSTANT_KEY_VARIANTS: [CaseVariants; 5] = [
    CaseVariants { window: Some((100, 0)), softcap: None, alibi: CaseAlibi::None, sinks: false },
    CaseVariants { window: Some((37, 20)), softcap: None, alibi: CaseAlibi::None, sinks: false },
    CaseVariants { window: None, softcap: None, alibi: CaseAlibi::None, sinks: true },
    CaseVariants { window: Some((64, -1)), softcap: None, alibi: CaseAlibi::None, sinks: true },
    CaseVariants { window: Some((50, 0)), softcap: Some(0.5), alibi: CaseAlibi::None, sinks: false },
];

/// The prefill cases of [`variants_over_constant_keys`] for variant `i`, run with `kernel`: dense causal
/// or not, and varlen with Tq > Tk (empty rows under causal) and Tq < Tk.
fn prefill_constant_key_variant_verdicts(emu: &Emulator, i: usize, kernel: PrefillKernel) -> [Verdict; 2] {
    let v = CONSTANT_KEY_VARIANTS[i];
    let causal = v.window.is_some_and(|w| w.1 == 0);
    let mut dense = prefill_case(DType::Bf16, 128, (2, 1), 1, 300, 300, causal);
    dense.variants = v;
    dense.kernel = kernel;
    let mut varlen = prefill_case(DType::F16, 64, (4, 2), 3, 150, 260, causal);
    varlen.varlen = Some(vec![(150, 20), (0, 5), (70, 260)]);
    varlen.variants = v;
    varlen.kernel = kernel;
    [
        by_dtype!(dense.dtype, prefill_exact(emu, "constant keys", &dense, None, common::case_seed(70 + i))),
        by_dtype!(varlen.dtype, prefill_exact(emu, "constant keys", &varlen, None, common::case_seed(80 + i))),
    ]
}

/// Score variants over constant keys (docs/semantics.md, "Score variants"): a window of w keys gives
/// LSE = t + ln w and O = the mean of those w V rows; a sink gives LSE = log(e^σ + n e^t) and O scaled by
/// n e^t / (e^σ + n e^t) (an empty row: O = 0, LSE = σ); a softcap c replaces t by c·tanh(t/c). Prefill
/// (dense causal and not, varlen with empty rows) and decode (split counts 1, 2 and many, windows longer
/// and shorter than the sequences).
#[test]
fn variants_over_constant_keys() {
    let emu = Emulator::new();
    let mut verdicts = Vec::new();
    for (i, v) in CONSTANT_KEY_VARIANTS.iter().enumerate() {
        verdicts.extend(prefill_constant_key_variant_verdicts(&emu, i, PrefillKernel::Auto));
        for (j, splits) in [Some(1), Some(2), Some(max_splits(2100))].into_iter().enumerate() {
            let mut case = DecodeCase::new(DType::Bf16, 128, (8, 2), 16, &[0, 1, 40, 2100], splits);
            case.variants = *v;
            let dtype = if j == 1 { DType::F16 } else { DType::Bf16 };
            case.dtype = dtype;
            verdicts.push(by_dtype!(
                dtype,
                decode_exact(&emu, "constant keys", &case, &Keys::Uniform, common::case_seed(90 + 3 * i + j))
            ));
        }
    }
    judge("variants_over_constant_keys", &verdicts);
}

/// The same prefill closed forms on the sm_90a kernel (emulated): every constant-key variant, the softcap's
/// c·tanh(t/c) included.
#[test]
fn sm90_variants_over_constant_keys() {
    let emu = Emulator::new();
    let verdicts: Vec<Verdict> = (0..CONSTANT_KEY_VARIANTS.len())
        .flat_map(|i| prefill_constant_key_variant_verdicts(&emu, i, PrefillKernel::Sm90))
        .collect();
    judge("sm90_variants_over_constant_keys", &verdicts);
}

// ------------------------------------------------------------------------------------------ paged prefill

/// Runs one exact paged prefill configuration on the emulator: constant keys per (sequence, KV head), with
/// sequence b's key at `dominant[b]` made dominant (`k0 + 2·1`) when given; V = U(-1, 1), q = 0.3 + U(-1, 1).
/// Each new token i of sequence b sees the n = min(seq_len, i + seq_len − q_len + 1) first keys (causal),
/// so the closed forms are decode's with that n per row.
fn paged_prefill_exact<T: Element>(
    emu: &Emulator,
    label: &str,
    case: &fused_attn::testkit::cases::paged_prefill::PagedPrefillCase,
    dominant: Option<&[usize]>,
    seed: u64,
) -> Verdict {
    use fused_attn::testkit::cases::paged_prefill::PagedPrefillFixture;
    let mut f = PagedPrefillFixture::<T>::new(case, seed);
    let (hq, hkv, d, ps) = (case.heads_q, case.heads_kv, case.head_dim, case.page_size);
    let slot = |f: &PagedPrefillFixture<T>, b: usize, t: usize| {
        (f.block_table[b * f.width + t / ps] as usize * ps + t % ps) * hkv * d
    };
    let mut rng = fused_attn::testkit::seed::rng(seed ^ 0xe8ac7);
    for x in f.q.iter_mut() {
        *x = T::from_f64(0.3 + rng.random_range(-1.0..1.0));
    }
    for (b, &(_, len)) in case.seqs.iter().enumerate() {
        let k0: Vec<T> = (0..hkv * d).map(|_| T::from_f64(rng.random_range(-1.0..1.0))).collect();
        for t in 0..len {
            let at = slot(&f, b, t);
            let dom = dominant.is_some_and(|p| p[b] == t);
            for (i, &k) in k0.iter().enumerate() {
                f.k_cache[at + i] = if dom { T::from_f64(k.to_f64() + 2.0) } else { k };
                f.v_cache[at + i] = T::from_f64(rng.random_range(-1.0..1.0));
            }
        }
    }
    let (o, lse, plan) = f.run(&fused_attn::Stream::Emu(emu), None).unwrap();
    let (r, _) = f.reference().unwrap();
    let ref_bound = r.out_bound(Some(T::DTYPE), Some(T::DTYPE));
    let scale = f.scale();
    let q = f64s(&f.q);
    let total_q = case.total_q();
    let (mut want_o, mut o_bound) = (vec![0.0; total_q * hq * d], vec![0.0; total_q * hq * d]);
    let (mut want_lse, mut lse_bd) = (vec![0.0; hq * total_q], vec![0.0; hq * total_q]);
    let (kc, vc) = (f64s(&f.k_cache), f64s(&f.v_cache));
    let cu = case.cu_seqlens_q();
    for (b, &(q_len, len)) in case.seqs.iter().enumerate() {
        let key = |t: usize, g: usize| kc[slot(&f, b, t) + g * d..][..d].to_vec();
        let val = |t: usize, g: usize, x: usize| vc[slot(&f, b, t) + g * d + x];
        for i in 0..q_len {
            let row = cu[b] as usize + i;
            let n = if case.causal { (i + len + 1).saturating_sub(q_len).min(len) } else { len };
            for h in 0..hq {
                let g = h / (hq / hkv);
                let (at, l_at) = ((row * hq + h) * d, h * total_q + row);
                if n == 0 {
                    want_lse[l_at] = f64::NEG_INFINITY;
                    lse_bd[l_at] = f64::MIN_POSITIVE;
                    o_bound[at..at + d].fill(f64::MIN_POSITIVE);
                    continue;
                }
                let qr = &q[at..at + d];
                let p = dominant.map(|p| p[b]).filter(|&p| p < n);
                let k0 = key(if p == Some(0) { 1.min(n - 1) } else { 0 }, g);
                let t0 = scale * dot(qr, &k0);
                let err0 = score_err(scale, qr, &k0);
                match p {
                    None => {
                        let lse = t0 + (n as f64).ln();
                        for x in 0..d {
                            let col: Vec<f64> = (0..n).map(|j| val(j, g, x)).collect();
                            let o = col.iter().sum::<f64>() / n as f64;
                            let mean_abs = col.iter().map(|y| y.abs()).sum::<f64>() / n as f64;
                            want_o[at + x] = o;
                            o_bound[at + x] = uniform_out_bound(T::DTYPE, o, mean_abs, n, lse);
                        }
                        want_lse[l_at] = lse;
                        lse_bd[l_at] = lse_bound(lse, err0, n, true);
                    }
                    Some(p) => {
                        let kd = key(p, g);
                        let delta = scale * dot(qr, &kd) - t0;
                        let (e, denom) = (delta.exp(), delta.exp() + (n - 1) as f64);
                        for x in 0..d {
                            let others: f64 = (0..n).filter(|&j| j != p).map(|j| val(j, g, x)).sum();
                            want_o[at + x] = (e * val(p, g, x) + others) / denom;
                            assert!((r.out[at + x] - want_o[at + x]).abs() < 1e-12, "reference vs closed form");
                        }
                        o_bound[at..at + d].copy_from_slice(&ref_bound[at..at + d]);
                        let lse = t0 + denom.ln();
                        assert!((r.lse[l_at] - lse).abs() < 1e-10, "reference LSE vs closed form");
                        want_lse[l_at] = lse;
                        lse_bd[l_at] = lse_bound(lse, err0 + score_err(scale, qr, &kd), n, false);
                    }
                }
            }
        }
    }
    let (o, lse) = (f64s(&o), lse.iter().map(|&x| x as f64).collect::<Vec<f64>>());
    let label = format!("{label} [{} splits={}]", case.label(), plan.num_splits());
    Verdict::new(label, (&o, &want_o, &o_bound), (&lse, &want_lse, &lse_bd))
}

/// Constant keys over contexts of 4,097 and 4,096 tokens (and short ones in the same batch), chunks of
/// 1..17 new tokens, page sizes 1, 16 and 256, split counts 1, 2, 3 and the maximum.
#[test]
fn paged_prefill_uniform_4097() {
    use fused_attn::testkit::cases::paged_prefill::case;
    let emu = Emulator::new();
    let seqs = [(5, 4097), (16, 4096), (1, 1), (17, 17)];
    let configs = [
        (DType::Bf16, 128, (8, 2), 16, 1),
        (DType::F16, 64, (4, 1), 1, 2),
        (DType::Bf16, 64, (16, 2), 256, 3),
        (DType::Bf16, 256, (2, 1), 16, max_splits(4097)),
    ];
    let verdicts: Vec<Verdict> = configs
        .iter()
        .enumerate()
        .map(|(i, &(dt, d, heads, ps, s))| {
            let mut c = case(d, heads, ps, &seqs);
            c.dtype = dt;
            c.num_splits = Some(s);
            by_dtype!(c.dtype, paged_prefill_exact(&emu, "uniform", &c, None, common::case_seed(40 + i)))
        })
        .collect();
    judge("paged_prefill_uniform_4097", &verdicts);
}

/// A dominant key at every boundary: KV tile, page, split, the sequence's ends and each new token's
/// causal edge (the first keys past the context: positions len − q_len .. len).
#[test]
fn paged_prefill_dominant_token_at_every_boundary() {
    use fused_attn::testkit::cases::paged_prefill::case;
    let emu = Emulator::new();
    let (n, q_len) = (1000usize, 5usize);
    let configs = [(DType::Bf16, 128, (8, 2), 16, 1, 16), (DType::F16, 64, (4, 1), 1, 3, 32)];
    let verdicts: Vec<Verdict> = configs
        .iter()
        .enumerate()
        .map(|(i, &(dt, d, heads, ps, s, tile))| {
            let split = if s > 1 { n.div_ceil(s).next_multiple_of(fused_attn::plan::SPLIT_GRANULE) } else { n };
            let mut pos = boundary_positions(n, tile, ps, split);
            pos.extend(n - q_len..n);
            pos.sort_unstable();
            pos.dedup();
            let mut c = case(d, heads, ps, &vec![(q_len, n); pos.len()]);
            c.dtype = dt;
            c.num_splits = Some(s);
            let label = format!("dominant at {pos:?}");
            by_dtype!(c.dtype, paged_prefill_exact(&emu, &label, &c, Some(&pos), common::case_seed(50 + i)))
        })
        .collect();
    judge("paged_prefill_dominant_token_at_every_boundary", &verdicts);
}
