//! The fp64 CPU reference every kernel is tested against, and the "naive low precision" implementation the
//! tolerance rule compares it with (see docs/semantics.md). Pure Rust, no `unsafe`; also meant for downstream
//! correctness suites.
//!
//! Semantics, shared by every entry point:
//! - S = Q Kᵀ · scale, O = softmax(S) V, computed row by row with the max-subtracted softmax in f64.
//! - Causal masking is bottom-right aligned: query row `i` (of `Tq`) sees key `j` (of `Tk`) iff
//!   `j <= i + (Tk - Tq)`, so the visible keys of a row are always a prefix `0..visible_keys(..)`.
//! - A row with no visible key (causal with `Tq > Tk`, a zero-length sequence, `seq_len` 0 in decode) gives
//!   output 0 and LSE = −inf, never NaN.
//! - LSE is the natural log of Σ exp(S) over the visible keys.
//! - GQA/MQA: query head `h` reads KV head `h / (Hq / Hkv)`.
//! - Score variants ([`Variants`], an argument of every entry point): per score `t = s · scale`, then softcap
//!   `c · tanh(t / c)`, then ALiBi `t − m_h · |i + δ − j|` (δ = Tk − Tq), then the window mask
//!   (`i + δ − left ≤ j ≤ i + δ + right`, combined with causal as right = 0), then the softmax with the sink
//!   `σ_h` in the denominator: `LSE = log(e^σ + Σ e^t)`; an empty row gives 0 and LSE = σ.
//!
//! Every op is one function, `op(shape…, &Variants, Arith, data…)`: [`dense`], [`dense_row`], [`varlen`],
//! [`paged_decode`], [`paged_prefill`]. The variants ([`Variants::default`]: plain attention) and the
//! arithmetic ([`Arith::F64`], the reference; [`Arith::Lowp`], the naive low-precision twin of the tolerance
//! rule) are plain arguments rather than a builder or twin functions, so the two sides of the rule are the
//! same call with one argument changed and share every line of masking, gathering and validation. Both
//! return an [`Output`]; only the fp64 one fills its bound terms.
//!
//! All tensors are flat row-major `f64` slices; the layout of each is given on the function. Bad input
//! (mismatched lengths, bad `cu_seqlens`, out-of-range block table entries, ...) is an [`Error`], never a
//! panic. Sizes whose product overflows `usize` give [`ErrorKind::Overflow`](crate::error::ErrorKind).

mod tolerance;

pub use tolerance::{compare, compare_bounded, compare_lse, compare_within, Comparison};

use crate::dtype::DType;
use crate::error::{Error, Result};

mod check;
pub mod mla;
mod rope;
pub use check::{check_decode, check_paged_prefill, check_prefill, check_prefill_varlen, Check, PagedCacheData};
pub use rope::RopeRef;

/// A dense (padded-batch) attention problem.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Problem {
    pub batch: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    /// Q's and K's head dim (Dqk).
    pub head_dim: usize,
    /// V's and O's head dim (Dv; [`Problem::new`] makes it `head_dim`).
    pub head_dim_v: usize,
    pub causal: bool,
    /// Multiplies Q Kᵀ. Not validated: a non-finite scale simply propagates into the result.
    pub scale: f64,
}

impl Problem {
    /// A problem with the default scale `1 / sqrt(head_dim)` and V as wide as Q and K (set `head_dim_v` for a
    /// V head dim of its own; the scale stays Q·K's).
    pub fn new(
        batch: usize,
        heads_q: usize,
        heads_kv: usize,
        seqlen_q: usize,
        seqlen_k: usize,
        head_dim: usize,
        causal: bool,
    ) -> Self {
        let scale = 1.0 / (head_dim as f64).sqrt();
        Self { batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, head_dim_v: head_dim, causal, scale }
    }

    /// Checks the head configuration (`heads_kv >= 1`, `heads_q % heads_kv == 0`, `head_dim >= 1`,
    /// `head_dim_v >= 1`) and that the tensor sizes fit in `usize`. Zero batch or sequence lengths are valid
    /// (empty problems).
    pub fn validate(&self) -> Result<()> {
        self.attn(Variants::default())?;
        for (arg, t) in [("q", self.seqlen_q), ("k", self.seqlen_k)] {
            numel(arg, &[self.batch, t, self.heads_q.max(self.heads_kv), self.head_dim.max(self.head_dim_v)])?;
        }
        Ok(())
    }

    fn attn<'a>(&self, var: Variants<'a>) -> Result<Attn<'a>> {
        let a = Attn::new(self.heads_q, self.heads_kv, self.head_dim, self.causal, self.scale)?
            .with_head_dim_v(self.head_dim_v)?;
        var.check(self.batch, self.heads_q)?;
        Ok(Attn { var, ..a })
    }
}

/// The score variants of a reference computation (docs/semantics.md, "Score variants"); the default is plain
/// attention. Values are fp64 (give the fp32 values a kernel uses, widened).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Variants<'a> {
    /// Sliding window `(left, right)`, each ≥ 0 or −1 (unbounded). Causal is `right = 0`.
    pub window: Option<(i64, i64)>,
    /// Logit softcap `c > 0`.
    pub softcap: Option<f64>,
    /// ALiBi slopes: `[Hq]` (every sequence) or `[B · Hq]` (per sequence), chosen by length.
    pub alibi: Option<&'a [f64]>,
    /// Attention sinks `[Hq]`.
    pub sinks: Option<&'a [f64]>,
}

impl Variants<'_> {
    /// The keys `[lo, hi)` row `i` (of `tq`) sees among `tk` under the window and `causal`.
    pub fn visible_range(&self, causal: bool, tq: usize, tk: usize, i: usize) -> (usize, usize) {
        let (l, r) = self.window.unwrap_or((-1, -1));
        crate::mask::Window {
            left: usize::try_from(l).ok(),
            right: if causal { Some(0) } else { usize::try_from(r).ok() },
        }
        .visible_range(i, tq, tk)
    }

    /// The ALiBi slope of query head `h` of sequence `b` (0 without ALiBi).
    fn slope(&self, b: usize, h: usize, heads_q: usize) -> f64 {
        match self.alibi {
            None => 0.0,
            Some(s) if s.len() == heads_q => s[h],
            Some(s) => s[b * heads_q + h],
        }
    }

    fn check(&self, batch: usize, heads_q: usize) -> Result<()> {
        if let Some((l, r)) = self.window {
            if l < -1 || r < -1 {
                return Err(Error::unsupported("window", format!("({l}, {r}): bounds are >= 0 or -1")));
            }
        }
        if let Some(c) = self.softcap {
            if !(c.is_finite() && c > 0.0) {
                return Err(Error::unsupported("softcap", format!("{c} (must be finite and positive)")));
            }
        }
        if let Some(a) = self.alibi {
            if a.len() != heads_q && a.len() != batch * heads_q {
                return Err(Error::shape("alibi", format!("{} slopes, expected Hq = {heads_q} or B·Hq", a.len())));
            }
        }
        if let Some(sk) = self.sinks {
            check_len("sinks", sk.len(), heads_q)?;
        }
        Ok(())
    }
}

/// What a row's scores go through besides the dot product: softcap, its ALiBi slope, its sink.
#[derive(Clone, Copy, Debug, Default)]
struct RowMod {
    softcap: Option<f64>,
    slope: f64,
    sink: Option<f64>,
}

/// Result of a reference computation. Layouts are given by the producing function.
#[derive(Clone, Debug, PartialEq)]
pub struct Output {
    pub out: Vec<f64>,
    pub lse: Vec<f64>,
    /// The ingredients of the arithmetic bound, one per element of `out` (empty for the naive low-precision
    /// results, which have no bound). See [`Output::out_bound`].
    pub terms: Vec<ErrorTerms>,
}

/// What the arithmetic bound ([`Output::out_bound`]) needs to know about one output element `O_c` of a row
/// with visible keys `j`, softmax weights `w_j` (fp64) and unnormalised weights `p̂_j = exp(t_j − max t)`.
/// For a merge, the "keys" are the partial states and `w_i = exp(lse_i − lse)`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ErrorTerms {
    /// `Σ_j w_j |v_jc|`: the output of the softmax applied to |V|.
    pub abs_out: f64,
    /// The same sum over the keys strictly below the row's max score only (the keys whose P a kernel rounds:
    /// a key at the running max has P = exp2(0) = 1, exact in every format).
    pub abs_out_below_max: f64,
    /// `Σ_j w_j |v_jc − O_c|`: how far the output moves when the weights move by a common relative error.
    pub spread: f64,
    /// `Σ_{j: p̂_j < 2^-14} |v_jc| / Σ_j p̂_j`: the keys whose fp16 P may be subnormal (absolute rounding).
    pub tiny: f64,
    /// Bound on the relative error of every weight from the score arithmetic (see [`Output::out_bound`]).
    pub eta: f64,
    /// `max_j |t_j|`, the largest score magnitude of the row: a kernel that subtracts an fp32-rounded
    /// `max·scale·log2 e` inside an FMA sees the row max's P off 1 by up to `u·|t|` (see the bound).
    pub score_mag: f64,
    /// Visible keys (merge: states) of the row.
    pub keys: usize,
}

/// Unit roundoff of fp32.
const U32: f64 = 1.0 / (1u64 << 24) as f64;
/// Relative error bound of the kernels' exp2 (PTX `ex2.approx.ftz.f32`: ~2^-22; doubled for margin).
const EXP2_REL_ERR: f64 = 1.0 / (1u64 << 21) as f64;
/// Absolute error of the kernels' softcap, relative to c: tanh through ex2.approx (2^-22) and fp32 division
/// and subtraction, log2 e folded in (a few ulp of c), with a factor 2 of margin.
const SOFTCAP_REL_ERR: f64 = 1.0 / (1u64 << 20) as f64;
/// fp16's smallest normal number: below it a P value loses relative precision (subnormal spacing 2^-24).
const F16_MIN_NORMAL: f64 = 1.0 / (1u64 << 14) as f64;

/// `γ(n) = 2u · (⌈n/16⌉ + 8)`: the relative error bound of an fp32 sum of `n` terms the way the kernels
/// form it — chains of m16n8k16 accumulations (each adds 16 exact products into fp32; 2u per step allows
/// for the tensor cores' truncating adder) plus a few merges (token groups, splits, quad shuffles).
pub fn fp32_chain_gamma(n: usize) -> f64 {
    2.0 * U32 * (n.div_ceil(16) + 8) as f64
}

/// Half the spacing of the format around `x` (the largest rounding error of one store): `fmt` `None` is
/// fp32, else the 16-bit dtype (subnormals included, so the spacing never goes below the format's least).
pub fn half_ulp(fmt: Option<DType>, x: f64) -> f64 {
    let (mantissa_bits, min_exp) = match fmt {
        None => (24, -126),
        Some(DType::F16) => (11, -14),
        Some(DType::Bf16) => (8, -126),
    };
    // The spacing only grows with |x|, so an upper bound on the stored value's magnitude gives a bound.
    let x = x.abs();
    let e = if x > 0.0 { (x.log2().floor() as i32).max(min_exp) } else { min_exp };
    2f64.powi(e - mantissa_bits)
}

impl Output {
    /// The **arithmetic bound**: per element of `out`, how far a correct kernel's result may be from this
    /// fp64 reference, derived from the arithmetic every kernel of this crate performs (fp32 scores and
    /// accumulation on tensor cores, P rounded to the input dtype for P·V, output rounded once), for
    /// `p_dtype` the format of P (`None`: fp32, e.g. a merge) and `out_dtype` the output's (`None`: fp32).
    ///
    /// With the row's terms ([`ErrorTerms`]), `u = 2^-24`, `u_P` the unit roundoff of `p_dtype` (bf16 2^-8,
    /// fp16 2^-11, fp32 `u`) and `a_P` its absolute error below the smallest normal (fp16 2^-25, else 0):
    ///
    /// ```text
    /// ε = η · spread                   every weight off by a relative η (scores, scale, exp2; see below)
    ///   + u_P · abs_out_below_max      P rounded to p_dtype before P·V (keys below the row max)
    ///   + 2u · score_mag · abs_out     the row max's P: exp2(fma(s, c, −fl(m·c))) = 2^±u|m·c|, which the
    ///                                  rounding to p_dtype turns into exactly 1 while the row sum keeps it
    ///   + a_P · tiny                   fp16 P in the subnormal range
    ///   + γ(n) · (abs_out + |O|)       fp32 accumulation of P·V and of the row sum (fp32_chain_gamma)
    /// bound = 2ε + half_ulp(out_dtype, |O| + 2ε)    the one rounding of the stored output
    /// ```
    ///
    /// (ε doubled for what the model leaves out: the tensor cores' internal order and the split merges'
    /// exact arithmetic.)
    ///
    /// `η = |scale| · γ_D · ‖q‖ · max_j ‖k_j‖ + 8u · max_j |t_j| + 2^-21` bounds the relative error of each
    /// softmax weight: the fp32 dot product (`γ_D = 2u(⌈D/16⌉ + 2)` times `Σ|q_i k_i| ≤ ‖q‖‖k‖`), the fp32
    /// scale·log2(e) and max subtraction (`8u·|t|`), and exp2. The online softmax's rescaling multiplies the
    /// accumulator and the row sum by the same factor, so it cancels in O. A merge has η from fp32
    /// `exp(lse_i − lse)`.
    ///
    /// The bound does not grow with the sharpness of the softmax the way the naive error does (scale 3 or
    /// large inputs make the naive low-precision error ~0.1–0.3, this bound stays a few output ulps), and it
    /// is tight enough that losing or duplicating one of 4,097 uniformly weighted tokens exceeds it.
    pub fn out_bound(&self, p_dtype: Option<DType>, out_dtype: Option<DType>) -> Vec<f64> {
        let (u_p, a_p) = match p_dtype {
            None => (U32, 0.0),
            Some(DType::F16) => (1.0 / 2048.0, 1.0 / (1u64 << 25) as f64),
            Some(DType::Bf16) => (1.0 / 256.0, 0.0),
        };
        self.out
            .iter()
            .zip(&self.terms)
            .map(|(&o, t)| {
                let eps = t.eta * t.spread
                    + u_p * t.abs_out_below_max
                    + 2.0 * U32 * t.score_mag * t.abs_out
                    + a_p * t.tiny
                    + fp32_chain_gamma(t.keys) * (t.abs_out + o.abs());
                2.0 * eps + half_ulp(out_dtype, o.abs() + 2.0 * eps)
            })
            .collect()
    }
}

/// Number of keys query row `i` (of `tq`) sees out of `tk`: all `tk` when not causal, otherwise the prefix
/// `j <= i + tk - tq` (bottom-right alignment), clamped to `0..=tk`.
pub fn visible_keys(causal: bool, tq: usize, tk: usize, i: usize) -> usize {
    if causal {
        (i + tk + 1).saturating_sub(tq).min(tk)
    } else {
        tk
    }
}

/// Dense attention.
///
/// - `q`: `[B, Tq, Hq, D]`, `k`: `[B, Tk, Hkv, D]`, `v`: `[B, Tk, Hkv, Dv]`, contiguous (Dv = `p.head_dim_v`).
/// - Returns `out`: `[B, Tq, Hq, Dv]`, `lse`: `[B, Hq, Tq]` (and, for [`Arith::F64`], the bound's `terms`).
///
/// `var` are the score variants ([`Variants::default`] for plain attention), `ar` the arithmetic: the fp64
/// reference or its naive low-precision twin ([`Arith`]).
pub fn dense(p: &Problem, var: &Variants<'_>, ar: Arith, q: &[f64], k: &[f64], v: &[f64]) -> Result<Output> {
    let a = p.attn(*var)?;
    let (tq, tk, hq, d, dv) = (p.seqlen_q, p.seqlen_k, a.heads_q, a.head_dim, a.head_dim_v);
    check_dense_len(p, "q", q, tq, hq, d)?;
    check_dense_len(p, "k", k, tk, a.heads_kv, d)?;
    check_dense_len(p, "v", v, tk, a.heads_kv, dv)?;
    let (q_seq, k_seq, v_seq, o_seq) = (tq * hq * d, tk * a.heads_kv * d, tk * a.heads_kv * dv, tq * hq * dv);
    let mut out = vec![0.0; p.batch * o_seq];
    let mut terms = ar.terms(out.len());
    let mut lse = vec![f64::NEG_INFINITY; p.batch * hq * tq];
    for b in 0..p.batch {
        let (ks, vs) = (&k[b * k_seq..][..k_seq], &v[b * v_seq..][..v_seq]);
        let lse_b = &mut lse[b * hq * tq..][..hq * tq];
        let terms_b = terms.as_mut().map(|t| &mut t[b * o_seq..][..o_seq]);
        let (qs, os) = (&q[b * q_seq..][..q_seq], &mut out[b * o_seq..][..o_seq]);
        a.attend_seq(ar, b, tq, tk, None, qs, ks, vs, os, terms_b, |h, i, l| lse_b[h * tq + i] = l);
    }
    Ok(Output { out, lse, terms: terms.unwrap_or_default() })
}

/// One row of [`dense`]: query row `i` of head `h` of sequence `b`, for checking a sample of a problem too
/// large to compute whole.
///
/// - `q_row`: `[D]`; `k`: sequence b's `[Tk, Hkv, D]`, `v`: its `[Tk, Hkv, Dv]`, contiguous.
/// - Returns `out` `[Dv]`, `lse` `[1]` (and the bound's terms for [`Arith::F64`]).
#[allow(clippy::too_many_arguments)]
pub fn dense_row(
    p: &Problem,
    var: &Variants<'_>,
    ar: Arith,
    q_row: &[f64],
    k: &[f64],
    v: &[f64],
    (b, i, h): (usize, usize, usize),
) -> Result<Output> {
    let a = p.attn(*var)?;
    let (d, dv) = (a.head_dim, a.head_dim_v);
    check_len("q_row", q_row.len(), d)?;
    check_len("k", k.len(), numel("k", &[p.seqlen_k, a.heads_kv, d])?)?;
    check_len("v", v.len(), numel("v", &[p.seqlen_k, a.heads_kv, dv])?)?;
    check_row_index(p, b, h, i)?;
    let kv = a.kv_rows(k, v, h);
    let rm = RowMod { softcap: var.softcap, slope: var.slope(b, h, a.heads_q), sink: var.sinks.map(|sk| sk[h]) };
    let (tq, tk) = (p.seqlen_q, p.seqlen_k);
    let (lo, hi) = var.visible_range(a.causal, tq, tk, i);
    let diag = (i + tk) as f64 - tq as f64;
    let keys: Vec<(usize, f64)> = (lo..hi).map(|j| (j, (diag - j as f64).abs())).collect();
    let (mut out, mut terms) = (vec![0.0; dv], ar.terms(dv));
    let row = Row { q: q_row, kv: &kv, keys: &keys, scale: a.scale, rm: &rm };
    let l = row.attend(ar, &mut RowScratch::default(), &mut out, terms.as_deref_mut());
    Ok(Output { out, lse: vec![l], terms: terms.unwrap_or_default() })
}

/// Variable-length (packed) attention.
///
/// - `q`: `[total_q, Hq, D]`, `k`: `[total_k, Hkv, D]`, `v`: `[total_k, Hkv, Dv]` (`head_dims` = (D, Dv));
///   sequence `b` owns tokens `cu_seqlens_q[b]..cu_seqlens_q[b+1]` of `q` and
///   `cu_seqlens_k[b]..cu_seqlens_k[b+1]` of `k`/`v`.
/// - `cu_seqlens_q`, `cu_seqlens_k`: `[B + 1]` prefix sums, starting at 0, non-decreasing, ending at
///   `total_q` / `total_k`.
/// - Causal alignment uses each sequence's own lengths; `var.alibi` has length Hq or B·Hq.
/// - Returns `out`: `[total_q, Hq, Dv]`, `lse`: `[Hq, total_q]`.
#[allow(clippy::too_many_arguments)]
pub fn varlen(
    heads_q: usize,
    heads_kv: usize,
    (head_dim, head_dim_v): (usize, usize),
    causal: bool,
    scale: f64,
    var: &Variants<'_>,
    ar: Arith,
    cu_seqlens_q: &[i32],
    cu_seqlens_k: &[i32],
    q: &[f64],
    k: &[f64],
    v: &[f64],
) -> Result<Output> {
    let a = Attn::new(heads_q, heads_kv, head_dim, causal, scale)?
        .with_head_dim_v(head_dim_v)?
        .with(*var, cu_seqlens_q.len().saturating_sub(1))?;
    let cu_q = parse_cu("cu_seqlens_q", cu_seqlens_q)?;
    let cu_k = parse_cu("cu_seqlens_k", cu_seqlens_k)?;
    if cu_k.len() != cu_q.len() {
        return Err(Error::shape(
            "cu_seqlens_k",
            format!("has {} entries but cu_seqlens_q has {}", cu_k.len(), cu_q.len()),
        ));
    }
    let (tok_q, tok_k, tok_v) = (a.heads_q * head_dim, a.heads_kv * head_dim, a.heads_kv * head_dim_v);
    let total_q = packed_total("q", "cu_seqlens_q", q, tok_q, &cu_q)?;
    packed_total("k", "cu_seqlens_k", k, tok_k, &cu_k)?;
    packed_total("v", "cu_seqlens_k", v, tok_v, &cu_k)?;
    let seqs = cu_k.windows(2).map(|w| {
        let (k0, tk) = (w[0], w[1] - w[0]);
        KvSeq { k: &k[k0 * tok_k..][..tk * tok_k], v: &v[k0 * tok_v..][..tk * tok_v], pos: None, len: tk }
    });
    Ok(a.attend_packed(ar, &cu_q, total_q, q, seqs))
}

/// Gathers each sequence's K and V out of a paged cache.
///
/// - Token `t` of sequence `b` lives in page `block_table[b][t / page_size]` at offset `t % page_size`. Only
///   the first `ceil(seq_len / page_size)` entries of a row are read (the rest may hold anything, e.g. −1),
///   and only the first `seq_len` slots are read (other slots may hold anything, NaN included).
/// - Returns one `(K, V)` pair per sequence, each `[seq_len, Hkv, D]`.
///
/// Errors: `page_size == 0`, wrong slice lengths, or a negative `seq_len` or one above
/// `max_pages_per_seq * page_size` → `Shape`; a used block table entry outside `0..num_pages` → `OutOfBounds`.
/// A paged KV cache as the reference reads it (f64 values; layouts as in docs/semantics.md).
///
/// - `k_cache`: `[num_pages, page_size, heads_kv, head_dim]`, `v_cache`: `[num_pages, page_size, heads_kv,
///   head_dim_v]` (V's head dim may differ from K's: DeepSeek's 192 / 128).
/// - `block_table`: `[B, max_pages_per_seq]` row-major; `seq_lens`: `[B]`.
#[derive(Clone, Copy, Debug)]
pub struct PagedCache<'a> {
    pub k_cache: &'a [f64],
    pub v_cache: &'a [f64],
    pub num_pages: usize,
    pub page_size: usize,
    pub heads_kv: usize,
    pub head_dim: usize,
    pub head_dim_v: usize,
    pub block_table: &'a [i32],
    pub max_pages_per_seq: usize,
    pub seq_lens: &'a [i32],
}

pub fn gather_paged(cache: &PagedCache<'_>) -> Result<Vec<(Vec<f64>, Vec<f64>)>> {
    Ok(gather_impl(cache, false)?.into_iter().map(|s| (s.k, s.v)).collect())
}

/// One sequence as the kernels read it from the cache: K and V of the tokens they attend to, each token's
/// position in the sequence, and the sequence length.
struct GatheredSeq {
    k: Vec<f64>,
    v: Vec<f64>,
    pos: Vec<usize>,
    len: usize,
}

impl GatheredSeq {
    fn rows(&self) -> KvSeq<'_> {
        KvSeq { k: &self.k, v: &self.v, pos: Some(&self.pos), len: self.len }
    }
}

/// The keys of one sequence as [`Attn::attend_seq`] takes them: `k`/`v` `[rows, Hkv, D]`, the position of
/// each row among the sequence's `len` keys (`None`: row r is key r, rows = len).
struct KvSeq<'a> {
    k: &'a [f64],
    v: &'a [f64],
    pos: Option<&'a [usize]>,
    len: usize,
}

/// [`gather_paged`] as the kernels read the cache: the tokens of a used block-table entry outside
/// `0..num_pages` are *masked* (left out: weight exactly 0), not an error; the others keep their positions
/// (which the window and ALiBi use).
fn gather_visible(cache: &PagedCache<'_>) -> Result<Vec<GatheredSeq>> {
    gather_impl(cache, true)
}

fn gather_impl(cache: &PagedCache<'_>, mask_bad_pages: bool) -> Result<Vec<GatheredSeq>> {
    let PagedCache {
        k_cache,
        v_cache,
        num_pages,
        page_size,
        heads_kv,
        head_dim,
        head_dim_v,
        block_table,
        max_pages_per_seq,
        seq_lens,
    } = *cache;
    if page_size == 0 {
        return Err(Error::shape("page_size", "must be at least 1"));
    }
    check_len("k_cache", k_cache.len(), numel("k_cache", &[num_pages, page_size, heads_kv, head_dim])?)?;
    check_len("v_cache", v_cache.len(), numel("v_cache", &[num_pages, page_size, heads_kv, head_dim_v])?)?;
    let batch = seq_lens.len();
    check_len("block_table", block_table.len(), numel("block_table", &[batch, max_pages_per_seq])?)?;
    let (token, token_v) = (heads_kv * head_dim, heads_kv * head_dim_v);
    let capacity = max_pages_per_seq.saturating_mul(page_size);
    let mut seqs = Vec::with_capacity(batch);
    for (b, &len) in seq_lens.iter().enumerate() {
        let len =
            usize::try_from(len).map_err(|_| Error::shape("seq_lens", format!("seq_lens[{b}] = {len} is negative")))?;
        if len > capacity {
            return Err(Error::shape(
                "seq_lens",
                format!("seq_lens[{b}] = {len} exceeds the table capacity {max_pages_per_seq} x {page_size}"),
            ));
        }
        let row = &block_table[b * max_pages_per_seq..][..max_pages_per_seq];
        let (mut ks, mut vs) = (Vec::with_capacity(len * token), Vec::with_capacity(len * token_v));
        let mut pos = Vec::with_capacity(len);
        for t in 0..len {
            let entry = row[t / page_size];
            let page = usize::try_from(entry).ok().filter(|&pg| pg < num_pages);
            if page.is_none() && mask_bad_pages {
                continue;
            }
            let page = page.ok_or_else(|| {
                Error::out_of_bounds(
                    "block_table",
                    format!("block_table[{b}][{}] = {entry} is outside 0..{num_pages}", t / page_size),
                )
            })?;
            let slot = page * page_size + t % page_size;
            ks.extend_from_slice(&k_cache[slot * token..][..token]);
            vs.extend_from_slice(&v_cache[slot * token_v..][..token_v]);
            pos.push(t);
        }
        seqs.push(GatheredSeq { k: ks, v: vs, pos, len });
    }
    Ok(seqs)
}

/// Decode attention over a paged cache: one query token per sequence, seeing its whole context (causal with
/// `Tq = 1` is the same as bidirectional).
///
/// - `q`: `[B, Hq, D]`; the cache as in [`PagedCache`] / [`gather_paged`], `B = seq_lens.len()`.
/// - Returns `out`: `[B, Hq, Dv]`, `lse`: `[B, Hq]` (a sequence with `seq_len` 0 gives 0 / −inf).
/// - A used block-table entry outside `0..num_pages` masks its page's tokens (weight exactly 0), as the
///   decode kernel does: a bad table entry never becomes zero keys that dilute the softmax. (A sequence
///   whose every page is bad is empty: 0 / −inf.)
/// - Score variants: the query is the sequence's newest token (position seq_len − 1), so a window keeps the
///   last `left + 1` tokens and ALiBi weighs token t by `|seq_len − 1 − t|`.
pub fn paged_decode(
    heads_q: usize,
    scale: f64,
    var: &Variants<'_>,
    ar: Arith,
    q: &[f64],
    cache: &PagedCache<'_>,
) -> Result<Output> {
    let a = Attn::new(heads_q, cache.heads_kv, cache.head_dim, false, scale)?
        .with_head_dim_v(cache.head_dim_v)?
        .with(*var, cache.seq_lens.len())?;
    let kv = gather_visible(cache)?;
    decode_gathered(ar, &a, q, &kv)
}

/// Paged prefill: each sequence's new query tokens (packed, `cu_seqlens_q`) over its paged cache, whose
/// `seq_lens[b]` tokens include the `q_len_b` new ones. With `causal`, row `i` of sequence `b` sees key `j`
/// iff `j <= i + (seq_len_b − q_len_b)` (bottom-right), then the variants (window on token positions).
///
/// - `q`: `[total_q, Hq, D]`; `cu_seqlens_q`: `[B + 1]` prefix sums (starting at 0, non-decreasing, ending at
///   `total_q`), `B = seq_lens.len()`; the cache as in [`PagedCache`].
/// - Returns `out`: `[total_q, Hq, Dv]`, `lse`: `[Hq, total_q]`. A row that sees no key (`q_len_b > seq_len_b`
///   and causal, or a window) gives 0 / −inf (0 / σ with a sink). Bad block-table entries mask their
///   page's tokens, as in [`paged_decode`].
#[allow(clippy::too_many_arguments)]
pub fn paged_prefill(
    heads_q: usize,
    causal: bool,
    scale: f64,
    var: &Variants<'_>,
    ar: Arith,
    cu_seqlens_q: &[i32],
    q: &[f64],
    cache: &PagedCache<'_>,
) -> Result<Output> {
    let a = Attn::new(heads_q, cache.heads_kv, cache.head_dim, causal, scale)?
        .with_head_dim_v(cache.head_dim_v)?
        .with(*var, cache.seq_lens.len())?;
    let kv = gather_visible(cache)?;
    let cu_q = parse_cu("cu_seqlens_q", cu_seqlens_q)?;
    if cu_q.len() != kv.len() + 1 {
        return Err(Error::shape(
            "cu_seqlens_q",
            format!("has {} entries, expected B + 1 = {} (seq_lens)", cu_q.len(), kv.len() + 1),
        ));
    }
    let total_q = packed_total("q", "cu_seqlens_q", q, a.heads_q * a.head_dim, &cu_q)?;
    Ok(a.attend_packed(ar, &cu_q, total_q, q, kv.iter().map(GatheredSeq::rows)))
}

/// Merges partial attention states (e.g. split-K chunks of the same rows).
///
/// - `o`: `[S, N, D]` (S states of N rows each; a row is e.g. one (b, h) pair), `lse`: `[S, N]` natural log.
/// - Returns `out`: `[N, D]`, `lse`: `[N]` with `lse = log Σ_i exp(lse_i)` and
///   `out = Σ_i exp(lse_i − lse) · o_i`.
/// - A partial with `lse_i = −inf` is empty and contributes nothing (its `o_i` is not read, so it may be
///   NaN); a row whose partials are all empty gives 0 / −inf.
pub fn merge_states(num_states: usize, rows: usize, head_dim: usize, o: &[f64], lse: &[f64]) -> Result<Output> {
    merge_states_with_sinks(num_states, rows, head_dim, o, lse, None)
}

/// [`merge_states`] with a sink per row (`[N]`): the sink joins as one more state with o = 0, so
/// `lse = log(e^σ + Σ_i e^{lse_i})`, `out = Σ_i exp(lse_i − lse) · o_i`, and an all-empty row gives 0 / σ.
pub fn merge_states_with_sinks(
    num_states: usize,
    rows: usize,
    head_dim: usize,
    o: &[f64],
    lse: &[f64],
    sinks: Option<&[f64]>,
) -> Result<Output> {
    check_len("o", o.len(), numel("o", &[num_states, rows, head_dim])?)?;
    check_len("lse", lse.len(), numel("lse", &[num_states, rows])?)?;
    if let Some(sk) = sinks {
        check_len("sinks", sk.len(), rows)?;
    }
    let mut out = vec![0.0; rows * head_dim];
    let mut terms = vec![ErrorTerms { keys: num_states, ..ErrorTerms::default() }; rows * head_dim];
    let mut lse_out = vec![f64::NEG_INFINITY; rows];
    for r in 0..rows {
        let part = |s: usize| lse[s * rows + r];
        let sink = sinks.map_or(f64::NEG_INFINITY, |sk| sk[r]);
        let m = (0..num_states).map(part).fold(sink, f64::max);
        if m == f64::NEG_INFINITY {
            continue;
        }
        let sum: f64 = (0..num_states).map(|s| (part(s) - m).exp()).sum::<f64>() + (sink - m).exp();
        let sink_mag = if sink.is_finite() { (sink - m).abs() + sink.abs() } else { 0.0 };
        let total = m + sum.ln();
        let row_out = &mut out[r * head_dim..][..head_dim];
        let live: Vec<usize> = (0..num_states).filter(|&s| part(s) != f64::NEG_INFINITY).collect();
        for &s in &live {
            let w = (part(s) - total).exp();
            axpy64(row_out, w, &o[(s * rows + r) * head_dim..][..head_dim]);
        }
        // Bound terms: the weights exp(lse_s − lse_max) are fp32 (relative error ~u·|lse_s − lse_max| plus
        // the exp itself); no P rounding (the states are the inputs).
        let spread_lse = live.iter().map(|&s| (part(s) - m).abs() + part(s).abs()).fold(sink_mag, f64::max);
        let eta = 8.0 * U32 * (spread_lse + 1.0);
        let row_terms = &mut terms[r * head_dim..][..head_dim];
        for &s in &live {
            let w = (part(s) - total).exp();
            let state = &o[(s * rows + r) * head_dim..][..head_dim];
            for ((t, &x), &y) in row_terms.iter_mut().zip(state).zip(row_out.iter()) {
                t.abs_out += w * x.abs();
                t.spread += w * (x - y).abs();
                t.eta = eta;
            }
        }
        if sink > f64::NEG_INFINITY {
            // The sink is a state with o = 0: its weight moves the output by w · |0 − O|.
            let w = (sink - total).exp();
            for (t, &y) in row_terms.iter_mut().zip(row_out.iter()) {
                t.spread += w * y.abs();
                t.eta = eta;
            }
        }
        lse_out[r] = total;
    }
    Ok(Output { out, lse: lse_out, terms })
}

/// The softmax probabilities of one query row, for inspection: `[Tk]`, masked keys exactly 0, all zeros for
/// an empty row. `q`, `k` as in [`dense`]; `b`, `h`, `i` index batch, query head and query row.
pub fn probabilities(p: &Problem, q: &[f64], k: &[f64], b: usize, h: usize, i: usize) -> Result<Vec<f64>> {
    let a = p.attn(Variants::default())?;
    check_dense_len(p, "q", q, p.seqlen_q, p.heads_q, p.head_dim)?;
    check_dense_len(p, "k", k, p.seqlen_k, p.heads_kv, p.head_dim)?;
    check_row_index(p, b, h, i)?;
    let d = a.head_dim;
    let q_row = &q[((b * p.seqlen_q + i) * a.heads_q + h) * d..][..d];
    let k_seq = &k[b * p.seqlen_k * a.heads_kv * d..][..p.seqlen_k * a.heads_kv * d];
    let kv = KvRows::new((k_seq, a.kv_head(h) * d, a.heads_kv * d, d), (k_seq, 0, 0, 0));
    let n = visible_keys(a.causal, p.seqlen_q, p.seqlen_k, i);
    let keys: Vec<(usize, f64)> = (0..n).map(|j| (j, 0.0)).collect();
    let mut sc = RowScratch::with_capacity(p.seqlen_k);
    if n > 0 {
        Row { q: q_row, kv: &kv, keys: &keys, scale: a.scale, rm: &RowMod::default() }.softmax(Arith::F64, &mut sc);
    }
    let mut probs = sc.probs;
    probs.resize(p.seqlen_k, 0.0);
    Ok(probs)
}

/// Validated head configuration and score variants shared by dense, varlen and paged.
#[derive(Clone, Copy, Debug)]
struct Attn<'a> {
    heads_q: usize,
    heads_kv: usize,
    /// Q's and K's head dim, and V's and O's.
    head_dim: usize,
    head_dim_v: usize,
    causal: bool,
    scale: f64,
    var: Variants<'a>,
}

impl<'a> Attn<'a> {
    /// The same configuration with score variants, checked for `batch` sequences.
    fn with(self, var: Variants<'a>, batch: usize) -> Result<Self> {
        var.check(batch, self.heads_q)?;
        Ok(Self { var, ..self })
    }

    fn new(heads_q: usize, heads_kv: usize, head_dim: usize, causal: bool, scale: f64) -> Result<Self> {
        if heads_kv == 0 {
            return Err(Error::shape("heads_kv", "must be at least 1"));
        }
        if heads_q % heads_kv != 0 {
            return Err(Error::shape("heads_q", format!("{heads_q} is not a multiple of heads_kv = {heads_kv}")));
        }
        if head_dim == 0 {
            return Err(Error::shape("head_dim", "must be at least 1"));
        }
        Ok(Self { heads_q, heads_kv, head_dim, head_dim_v: head_dim, causal, scale, var: Variants::default() })
    }

    /// The same configuration with V (and O) `head_dim_v` wide.
    fn with_head_dim_v(self, head_dim_v: usize) -> Result<Self> {
        if head_dim_v == 0 {
            return Err(Error::shape("head_dim_v", "must be at least 1"));
        }
        Ok(Self { head_dim_v, ..self })
    }

    fn kv_head(&self, h: usize) -> usize {
        h / (self.heads_q / self.heads_kv)
    }

    /// The K and V rows query head `h` reads out of one sequence's `k` `[rows, Hkv, D]` and `v`
    /// `[rows, Hkv, Dv]`.
    fn kv_rows<'k>(&self, k: &'k [f64], v: &'k [f64], h: usize) -> KvRows<'k> {
        let (d, dv, kh) = (self.head_dim, self.head_dim_v, self.kv_head(h));
        KvRows::new((k, kh * d, self.heads_kv * d, d), (v, kh * dv, self.heads_kv * dv, dv))
    }

    /// Packed sequences: sequence `b` owns rows `cu_q[b]..cu_q[b + 1]` of `q` `[total_q, Hq, D]` and attends to
    /// the `b`-th of `kv` → `out` `[total_q, Hq, Dv]`, `lse` `[Hq, total_q]`.
    fn attend_packed<'s>(
        &self,
        ar: Arith,
        cu_q: &[usize],
        total_q: usize,
        q: &[f64],
        kv: impl Iterator<Item = KvSeq<'s>>,
    ) -> Output {
        let (tok, tok_o) = (self.heads_q * self.head_dim, self.heads_q * self.head_dim_v);
        let mut out = vec![0.0; total_q * tok_o];
        let mut terms = ar.terms(out.len());
        let mut lse = vec![f64::NEG_INFINITY; self.heads_q * total_q];
        for (b, (w, seq)) in cu_q.windows(2).zip(kv).enumerate() {
            let (q0, tq) = (w[0], w[1] - w[0]);
            let terms_s = terms.as_mut().map(|t| &mut t[q0 * tok_o..][..tq * tok_o]);
            let (qs, os) = (&q[q0 * tok..][..tq * tok], &mut out[q0 * tok_o..][..tq * tok_o]);
            self.attend_seq(ar, b, tq, seq.len, seq.pos, qs, seq.k, seq.v, os, terms_s, |h, i, l| {
                lse[h * total_q + q0 + i] = l
            });
        }
        Output { out, lse, terms: terms.unwrap_or_default() }
    }

    /// One sequence (index `b` of its batch): `q` `[tq, Hq, D]`, `k` `[rows, Hkv, D]`, `v` `[rows, Hkv, Dv]` →
    /// `out` `[tq, Hq, Dv]`; `lse(h, i, value)` is called for every (head, row). `key_pos[r]` is the position among
    /// the `tk` keys of K/V row r (`None`: row r is key r, rows = tk); positions decide the window and ALiBi.
    /// `terms` (same layout as `out`) receives the arithmetic-bound terms when given (fp64 only).
    #[allow(clippy::too_many_arguments)]
    fn attend_seq(
        &self,
        ar: Arith,
        b: usize,
        tq: usize,
        tk: usize,
        key_pos: Option<&[usize]>,
        q: &[f64],
        k: &[f64],
        v: &[f64],
        out: &mut [f64],
        mut terms: Option<&mut [ErrorTerms]>,
        mut lse: impl FnMut(usize, usize, f64),
    ) {
        let (d, dv) = (self.head_dim, self.head_dim_v);
        let mut scratch = RowScratch::with_capacity(tk);
        let mut keys: Vec<(usize, f64)> = Vec::with_capacity(tk);
        // |k_j| of the current KV head's rows (for the bound terms), computed once per KV head.
        let mut norms: (Option<usize>, Vec<f64>) = (None, Vec::new());
        // Head-major so one KV head's rows stay in cache across the query rows.
        for h in 0..self.heads_q {
            let mut kv = self.kv_rows(k, v, h);
            if terms.is_some() {
                if norms.0 != Some(self.kv_head(h)) {
                    norms = (Some(self.kv_head(h)), kv.k_norms());
                }
                kv.norms = Some(&norms.1);
            }
            let rm = RowMod {
                softcap: self.var.softcap,
                slope: self.var.slope(b, h, self.heads_q),
                sink: self.var.sinks.map(|sk| sk[h]),
            };
            for i in 0..tq {
                let (lo, hi) = self.var.visible_range(self.causal, tq, tk, i);
                let diag = (i + tk) as f64 - tq as f64;
                keys.clear();
                match key_pos {
                    None => keys.extend((lo..hi).map(|j| (j, (diag - j as f64).abs()))),
                    Some(pos) => keys.extend(
                        pos.iter()
                            .enumerate()
                            .filter(|(_, &p)| (lo..hi).contains(&p))
                            .map(|(r, &p)| (r, (diag - p as f64).abs())),
                    ),
                }
                let (at, at_o) = ((i * self.heads_q + h) * d, (i * self.heads_q + h) * dv);
                let row = Row { q: &q[at..at + d], kv: &kv, keys: &keys, scale: self.scale, rm: &rm };
                let terms_row = terms.as_deref_mut().map(|t| &mut t[at_o..at_o + dv]);
                lse(h, i, row.attend(ar, &mut scratch, &mut out[at_o..at_o + dv], terms_row));
            }
        }
    }
}

/// The K/V rows of one KV head: key `j` is `k[base + j * stride..][..d]`, its value `v[v_base + j *
/// v_stride..][..dv]` (V's head dim may differ from K's).
struct KvRows<'a> {
    k: &'a [f64],
    v: &'a [f64],
    base: usize,
    stride: usize,
    d: usize,
    v_base: usize,
    v_stride: usize,
    dv: usize,
    /// `|k_j|` of every row, when the caller computed them once for many query rows.
    norms: Option<&'a [f64]>,
}

impl<'a> KvRows<'a> {
    /// K's and V's (slice, base, row stride, head dim).
    fn new(
        (k, base, stride, d): (&'a [f64], usize, usize, usize),
        (v, v_base, v_stride, dv): (&'a [f64], usize, usize, usize),
    ) -> Self {
        Self { k, v, base, stride, d, v_base, v_stride, dv, norms: None }
    }
    /// The rows' `|k_j|`, one per row of this head.
    fn k_norms(&self) -> Vec<f64> {
        let rows = (self.k.len().saturating_sub(self.base) + self.stride - self.d) / self.stride;
        (0..rows).map(|j| dot64(self.k(j), self.k(j)).sqrt()).collect()
    }
    fn k_norm(&self, j: usize) -> f64 {
        self.norms.map_or_else(|| dot64(self.k(j), self.k(j)).sqrt(), |n| n[j])
    }
    fn k(&self, j: usize) -> &[f64] {
        &self.k[self.base + j * self.stride..][..self.d]
    }
    fn v(&self, j: usize) -> &[f64] {
        &self.v[self.v_base + j * self.v_stride..][..self.dv]
    }
}

/// fp64 score of one key after every variant: `softcap(q·k · scale) − slope · dist`.
fn score64(q_row: &[f64], k: &[f64], scale: f64, rm: &RowMod, dist: f64) -> f64 {
    modded64(dot64(q_row, k) * scale, rm, dist)
}

/// The variants applied to a scaled fp64 score `t`: `softcap(t) − slope · dist`.
fn modded64(t: f64, rm: &RowMod, dist: f64) -> f64 {
    let t = rm.softcap.map_or(t, |c| c * (t / c).tanh());
    t - rm.slope * dist
}

/// One query row's attention: its query `q` (`[D]`), the K/V rows of its KV head, the keys it sees (K/V row
/// index, distance |i + δ − j| for ALiBi), the scale and the row's variants.
struct Row<'r> {
    q: &'r [f64],
    kv: &'r KvRows<'r>,
    keys: &'r [(usize, f64)],
    scale: f64,
    rm: &'r RowMod,
}

impl Row<'_> {
    /// The one attention row routine: writes `out` (`[D]`) and returns the LSE; no keys give 0 and −inf (or
    /// the sink). `terms` (`[D]`, fp64 only) receives the arithmetic-bound terms when given.
    fn attend(&self, ar: Arith, sc: &mut RowScratch, out: &mut [f64], terms: Option<&mut [ErrorTerms]>) -> f64 {
        out.fill(0.0);
        let lse = if self.keys.is_empty() {
            sc.probs.clear();
            sc.raw.clear();
            self.rm.sink.unwrap_or(f64::NEG_INFINITY)
        } else {
            let lse = self.softmax(ar, sc);
            for (&(j, _), &p) in self.keys.iter().zip(sc.probs.iter()) {
                ar.axpy(out, p, self.kv.v(j));
            }
            for o in out.iter_mut() {
                *o = ar.store(*o);
            }
            lse
        };
        if let Some(t) = terms {
            self.terms(lse, sc, out, t);
        }
        lse
    }

    /// Fills `sc.probs` with the softmax over the keys (non-empty) and the sink, and returns the LSE.
    fn softmax(&self, ar: Arith, sc: &mut RowScratch) -> f64 {
        let (q, kv, rm) = (self.q, self.kv, self.rm);
        sc.probs.clear();
        sc.raw.clear();
        match ar {
            // The scaled scores before the variants are kept for `terms` (one q·k per key in all).
            Arith::F64 => {
                sc.raw.extend(self.keys.iter().map(|&(j, _)| dot64(q, kv.k(j)) * self.scale));
                sc.probs.extend(sc.raw.iter().zip(self.keys).map(|(&t, &(_, dist))| modded64(t, rm, dist)));
            }
            Arith::Lowp(_) => {
                sc.probs.extend(self.keys.iter().map(|&(j, dist)| ar.score(q, kv.k(j), self.scale, rm, dist)))
            }
        }
        ar.softmax(&mut sc.probs, rm.sink)
    }

    /// The arithmetic-bound terms of the row (see [`ErrorTerms`], [`Output::out_bound`]) from its fp64
    /// softmax `sc.probs` (normalised weights of the keys), output `out` and LSE.
    fn terms(&self, lse: f64, sc: &RowScratch, out: &[f64], terms: &mut [ErrorTerms]) {
        let (q_row, kv, keys, scale, rm) = (self.q, self.kv, self.keys, self.scale, self.rm);
        let probs = &sc.probs;
        terms.fill(ErrorTerms { keys: keys.len(), ..ErrorTerms::default() });
        if keys.is_empty() {
            return;
        }
        let d = q_row.len();
        let q_norm = dot64(q_row, q_row).sqrt();
        let (mut k_norm, mut t_abs, mut t_max) = (0.0f64, 0.0f64, f64::NEG_INFINITY);
        for (&(j, dist), &raw) in keys.iter().zip(&sc.raw) {
            let t = modded64(raw, rm, dist);
            k_norm = k_norm.max(kv.k_norm(j));
            // fp32 rounding of every intermediate: the scaled score, the result, the bias (which may cancel
            // against the score), the sink's logit.
            t_abs = t_abs.max(raw.abs()).max(t.abs()).max((rm.slope * dist).abs());
            t_max = t_max.max(t);
        }
        if let Some(sk) = rm.sink {
            t_abs = t_abs.max(sk.abs());
        }
        let gamma_d = 2.0 * U32 * (d.div_ceil(16) + 2) as f64;
        // The softcap's tanh through exp2 and an fp32 division: a few ulp of c, absolutely (fa/score_mod.cuh).
        let softcap_err = rm.softcap.map_or(0.0, |c| c * SOFTCAP_REL_ERR);
        let eta = scale.abs() * gamma_d * q_norm * k_norm + 8.0 * U32 * t_abs + EXP2_REL_ERR + softcap_err;
        // w_j = p̂_j / l with l = exp(lse − max t) = Σ p̂_j (+ the sink's e^(σ − max t)), so p̂_j = w_j · l.
        let l = (lse - t_max).exp();
        for (&(j, _), &w) in keys.iter().zip(probs) {
            let p_hat = w * l;
            let below_max = p_hat < 1.0;
            let tiny = p_hat < F16_MIN_NORMAL;
            for ((t, &vx), &o) in terms.iter_mut().zip(kv.v(j)).zip(out) {
                t.abs_out += w * vx.abs();
                t.spread += w * (vx - o).abs();
                if below_max {
                    t.abs_out_below_max += w * vx.abs();
                }
                if tiny {
                    t.tiny += vx.abs() / l;
                }
            }
        }
        if let Some(sk) = rm.sink {
            // The sink is a key with v = 0: its weight moves the output by w_σ · |0 − O|.
            let w = (sk - lse).exp();
            for (t, &o) in terms.iter_mut().zip(out) {
                t.spread += w * o.abs();
            }
        }
        terms.iter_mut().for_each(|t| {
            t.eta = eta;
            t.score_mag = t_abs;
        });
    }
}

/// Per-row scratch of the row routines: the softmax weights of the keys and (fp64) their scaled scores.
#[derive(Default)]
struct RowScratch {
    probs: Vec<f64>,
    raw: Vec<f64>,
}

impl RowScratch {
    fn with_capacity(n: usize) -> Self {
        Self { probs: Vec::with_capacity(n), raw: Vec::with_capacity(n) }
    }
}

/// The arithmetic an entry point computes in: the argument that makes each op one function for both sides
/// of the tolerance rule (`max|ours − ref64| ≤ 2 · max|naive_lowp − ref64| + 1e-5`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arith {
    /// The fp64 reference: scores, softmax and P·V in f64 with the max-subtracted softmax. The [`Output`]
    /// carries the LSE and the arithmetic bound's [`ErrorTerms`].
    F64,
    /// The naive low-precision twin, computed like a plain framework in this dtype: inputs are taken as given
    /// (already representable); S = Q Kᵀ accumulated in f32 and rounded to the dtype; scaled in f32 and
    /// rounded; softcap and the ALiBi bias each computed in f32 and rounded (as a framework applies them to a
    /// score tensor); softmax in f32 from the rounded scores with the sink in its denominator, probabilities
    /// rounded to the dtype; O = P V accumulated in f32 and rounded to the dtype. Same masking and empty-row
    /// rules. The [`Output`]'s LSE is that f32 softmax's; `terms` is empty (no bound).
    Lowp(DType),
}

impl Arith {
    /// Storage for the arithmetic-bound terms of `n` outputs: only the fp64 computation has them.
    fn terms(self, n: usize) -> Option<Vec<ErrorTerms>> {
        matches!(self, Arith::F64).then(|| vec![ErrorTerms::default(); n])
    }

    /// Score of one key after every variant (`dist` = |i + δ − j| for ALiBi).
    fn score(self, q: &[f64], k: &[f64], scale: f64, rm: &RowMod, dist: f64) -> f64 {
        match self {
            Arith::F64 => score64(q, k, scale, rm, dist),
            Arith::Lowp(dt) => {
                let s = q.iter().zip(k).fold(0f32, |acc, (&x, &y)| acc + x as f32 * y as f32);
                let s = dt.round(f64::from(s)) as f32;
                let mut t = dt.round(f64::from(s * scale as f32));
                if let Some(c) = rm.softcap {
                    let c = c as f32;
                    t = dt.round(f64::from(c * (t as f32 / c).tanh()));
                }
                if rm.slope != 0.0 {
                    t = dt.round(f64::from(t as f32 - rm.slope as f32 * dist as f32));
                }
                t
            }
        }
    }

    /// Scores → probabilities in place (non-empty, max-subtracted), the sink's e^σ in the denominator;
    /// returns the LSE.
    fn softmax(self, s: &mut [f64], sink: Option<f64>) -> f64 {
        match self {
            Arith::F64 => {
                let m = s.iter().copied().fold(sink.unwrap_or(f64::NEG_INFINITY), f64::max);
                let mut sum = sink.map_or(0.0, |sk| (sk - m).exp());
                for x in s.iter_mut() {
                    *x = (*x - m).exp();
                    sum += *x;
                }
                s.iter_mut().for_each(|x| *x /= sum);
                m + sum.ln()
            }
            Arith::Lowp(dt) => {
                let sink = sink.map(|sk| sk as f32);
                let m = s.iter().map(|&x| x as f32).fold(sink.unwrap_or(f32::NEG_INFINITY), f32::max);
                let mut sum = sink.map_or(0f32, |sk| (sk - m).exp());
                for x in s.iter_mut() {
                    let e = (*x as f32 - m).exp();
                    *x = f64::from(e);
                    sum += e;
                }
                s.iter_mut().for_each(|x| *x = dt.round(f64::from(*x as f32 / sum)));
                f64::from(m + sum.ln())
            }
        }
    }

    /// `out += p · v` in the accumulator type.
    fn axpy(self, out: &mut [f64], p: f64, v: &[f64]) {
        match self {
            Arith::F64 => axpy64(out, p, v),
            Arith::Lowp(_) => {
                for (o, &x) in out.iter_mut().zip(v) {
                    *o = f64::from(*o as f32 + p as f32 * x as f32);
                }
            }
        }
    }

    /// Rounds a finished output to the storage type.
    fn store(self, x: f64) -> f64 {
        match self {
            Arith::F64 => x,
            Arith::Lowp(dt) => dt.round(x),
        }
    }
}

/// f64 dot product with four independent accumulators (vectorises; the order differs from a sequential sum
/// only by f64 rounding). Plain indexing keeps it tolerable in unoptimised test builds too.
fn dot64(a: &[f64], b: &[f64]) -> f64 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut s = [0.0f64; 4];
    let mut i = 0;
    while i + 4 <= n {
        s[0] += a[i] * b[i];
        s[1] += a[i + 1] * b[i + 1];
        s[2] += a[i + 2] * b[i + 2];
        s[3] += a[i + 3] * b[i + 3];
        i += 4;
    }
    while i < n {
        s[0] += a[i] * b[i];
        i += 1;
    }
    (s[0] + s[1]) + (s[2] + s[3])
}

/// `out += p · v`.
fn axpy64(out: &mut [f64], p: f64, v: &[f64]) {
    let n = out.len().min(v.len());
    let (out, v) = (&mut out[..n], &v[..n]);
    for i in 0..n {
        out[i] += p * v[i];
    }
}

/// Decode over gathered per-sequence K/V: `q` `[B, Hq, D]` → out `[B, Hq, D]`, lse `[B, Hq]`. Each sequence
/// is a packed one with a single query row (whose diagonal is its newest token).
fn decode_gathered(ar: Arith, a: &Attn, q: &[f64], kv: &[GatheredSeq]) -> Result<Output> {
    let batch = kv.len();
    check_len("q", q.len(), numel("q", &[batch, a.heads_q, a.head_dim])?)?;
    let cu_q: Vec<usize> = (0..=batch).collect();
    let mut r = a.attend_packed(ar, &cu_q, batch, q, kv.iter().map(GatheredSeq::rows));
    // The packed LSE is [Hq, B]; decode's is [B, Hq].
    r.lse = (0..batch * a.heads_q).map(|x| r.lse[(x % a.heads_q) * batch + x / a.heads_q]).collect();
    Ok(r)
}

// ---------------------------------------------------------------------------------------------------------
// Validation helpers

fn numel(arg: &str, dims: &[usize]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |acc, &x| acc.checked_mul(x))
        .ok_or_else(|| Error::overflow(arg, format!("element count of {dims:?} overflows usize")))
}

fn check_len(arg: &str, got: usize, want: usize) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(Error::shape(arg, format!("has {got} elements, expected {want}")))
    }
}

/// Batch `b`, query head `h` and query row `i` are inside the problem.
fn check_row_index(p: &Problem, b: usize, h: usize, i: usize) -> Result<()> {
    for (arg, idx, n) in [("b", b, p.batch), ("h", h, p.heads_q), ("i", i, p.seqlen_q)] {
        if idx >= n {
            return Err(Error::out_of_bounds(arg, format!("{idx} is outside 0..{n}")));
        }
    }
    Ok(())
}

fn check_dense_len(p: &Problem, arg: &str, x: &[f64], t: usize, heads: usize, d: usize) -> Result<()> {
    check_len(arg, x.len(), numel(arg, &[p.batch, t, heads, d])?)
}

/// `cu_seqlens`: at least one entry, starting at 0, non-decreasing.
fn parse_cu(arg: &str, cu: &[i32]) -> Result<Vec<usize>> {
    match cu.first() {
        None => return Err(Error::shape(arg, "must have batch + 1 >= 1 entries")),
        Some(&c) if c != 0 => return Err(Error::shape(arg, format!("must start at 0, starts at {c}"))),
        _ => {}
    }
    if let Some(i) = cu.windows(2).position(|w| w[1] < w[0]) {
        return Err(Error::shape(arg, format!("decreases at index {}: {} -> {}", i + 1, cu[i], cu[i + 1])));
    }
    Ok(cu.iter().map(|&c| c as usize).collect())
}

/// Token count of a packed `[total, H, D]` tensor, which must equal the last `cu` entry.
fn packed_total(arg: &str, cu_arg: &str, x: &[f64], token: usize, cu: &[usize]) -> Result<usize> {
    let last = *cu.last().unwrap_or(&0);
    if x.len() % token != 0 {
        return Err(Error::shape(arg, format!("{} elements is not a multiple of H * D = {token}", x.len())));
    }
    if x.len() / token != last {
        return Err(Error::shape(cu_arg, format!("ends at {last} but {arg} holds {} tokens", x.len() / token)));
    }
    Ok(last)
}

// With `testkit` (its rand): the packaged crate, built without it, leaves these out; the main build runs them.
#[cfg(all(test, feature = "testkit"))]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use rand::rngs::StdRng;
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};

    const NEG_INF: f64 = f64::NEG_INFINITY;

    fn rand_vec(rng: &mut StdRng, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n).map(|_| rng.random_range(lo..hi)).collect()
    }

    /// Random (q, k, v) for a dense problem; v is offset so outputs are not ≈ 0.
    fn inputs(p: &Problem, seed: u64) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let mut rng = StdRng::seed_from_u64(seed);
        let nq = p.batch * p.seqlen_q * p.heads_q * p.head_dim;
        let nk = p.batch * p.seqlen_k * p.heads_kv * p.head_dim;
        (rand_vec(&mut rng, nq, -1.0, 1.0), rand_vec(&mut rng, nk, -1.0, 1.0), rand_vec(&mut rng, nk, -0.5, 1.5))
    }

    /// max |a − b| with equal values (incl. −inf == −inf) counting 0 and anything else non-finite counting ∞.
    fn max_diff(a: &[f64], b: &[f64]) -> f64 {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .map(|(&x, &y)| {
                if x == y {
                    0.0
                } else if (x - y).is_finite() {
                    (x - y).abs()
                } else {
                    f64::INFINITY
                }
            })
            .fold(0.0, f64::max)
    }

    /// A V head dim different from Q·K's (issue 27): O's columns are those of the square problem whose V
    /// holds the narrow V in its first Dv columns (the softmax weights depend on Q and K only), bitwise, for
    /// dense, varlen and one row, both arithmetics, with variants; Dv > Dqk too (Q and K zero-padded to Dv,
    /// scale kept); wrong V lengths are Shape errors.
    #[test]
    fn v_head_dim_of_its_own_is_the_square_problem_sliced() {
        let var = Variants { window: Some((5, 0)), softcap: Some(4.0), ..Default::default() };
        for (d, dv) in [(24, 16), (16, 24)] {
            let wide = d.max(dv);
            let sq = Problem { scale: 0.4, ..Problem::new(2, 4, 2, 7, 9, wide, true) };
            let mut rng = StdRng::seed_from_u64(27);
            let (mut q, mut k, mut v) = inputs(&sq, 27);
            // Columns past d of q and k are zero (Dv > Dqk: the square problem pads Q and K), and v keeps
            // random values past dv, which the narrow problem never sees.
            for row in q.chunks_mut(wide).chain(k.chunks_mut(wide)) {
                row[d..].fill(0.0);
            }
            v.iter_mut().for_each(|x| *x += rng.random_range(-0.1..0.1));
            let narrow = |x: &[f64], w: usize| x.chunks(wide).flat_map(|r| r[..w].to_vec()).collect::<Vec<f64>>();
            let (qn, kn, vn) = (narrow(&q, d), narrow(&k, d), narrow(&v, dv));
            let p = Problem { head_dim: d, head_dim_v: dv, ..sq };
            for ar in [Arith::F64, Arith::Lowp(DType::Bf16)] {
                let full = dense(&sq, &var, ar, &q, &k, &v).unwrap();
                let ours = dense(&p, &var, ar, &qn, &kn, &vn).unwrap();
                assert_eq!(ours.out, narrow(&full.out, dv), "{d}/{dv} {ar:?}");
                assert_eq!(max_diff(&ours.lse, &full.lse), 0.0);
                if ar == Arith::F64 {
                    assert_eq!(ours.terms.len(), ours.out.len());
                }
                // Varlen over the same two sequences.
                let (cq, ck) = ([0, 7, 14], [0, 9, 18]);
                let vl = varlen(4, 2, (d, dv), true, 0.4, &var, ar, &cq, &ck, &qn, &kn, &vn).unwrap();
                assert_eq!(vl.out, ours.out, "{d}/{dv} varlen {ar:?}");
                // One row.
                let kv_seq = 9 * 2;
                let row = dense_row(
                    &p,
                    &var,
                    ar,
                    &qn[((7 + 6) * 4 + 3) * d..][..d],
                    &kn[kv_seq * d..][..kv_seq * d],
                    &vn[kv_seq * dv..][..kv_seq * dv],
                    (1, 6, 3),
                )
                .unwrap();
                assert_eq!(row.out, ours.out[((7 + 6) * 4 + 3) * dv..][..dv], "{d}/{dv} row {ar:?}");
            }
            let short = &vn[1..];
            assert_eq!(dense(&p, &var, Arith::F64, &qn, &kn, short).unwrap_err().kind(), &ErrorKind::Shape);
            assert_eq!(dense(&p, &var, Arith::F64, &qn, &kn, &kn).unwrap_err().kind(), &ErrorKind::Shape);
        }
        let bad = Problem { head_dim_v: 0, ..Problem::new(1, 1, 1, 1, 1, 8, false) };
        assert_eq!(bad.validate().unwrap_err().kind(), &ErrorKind::Shape);
    }

    /// A deliberately different formulation: the full [Tq, Tk] score matrix with an explicit −inf mask,
    /// softmax as exp / sum without max subtraction, then P·V. Returns (out, lse) in dense layouts.
    fn naive_dense(p: &Problem, q: &[f64], k: &[f64], v: &[f64]) -> (Vec<f64>, Vec<f64>) {
        let (b_, hq, hkv, tq, tk, d) = (p.batch, p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_k, p.head_dim);
        let qi = |b: usize, i: usize, h: usize, x: usize| ((b * tq + i) * hq + h) * d + x;
        let ki = |b: usize, j: usize, h: usize, x: usize| ((b * tk + j) * hkv + h) * d + x;
        let mut out = vec![0.0; b_ * tq * hq * d];
        let mut lse = vec![0.0; b_ * hq * tq];
        for b in 0..b_ {
            for h in 0..hq {
                let g = h * hkv / hq;
                let mut s = vec![vec![NEG_INF; tk]; tq];
                for (i, row) in s.iter_mut().enumerate() {
                    for (j, sij) in row.iter_mut().enumerate() {
                        let masked = p.causal && (j as i64) > i as i64 + tk as i64 - tq as i64;
                        if !masked {
                            *sij = (0..d).map(|x| q[qi(b, i, h, x)] * k[ki(b, j, g, x)]).sum::<f64>() * p.scale;
                        }
                    }
                }
                for (i, row) in s.iter().enumerate() {
                    let e: Vec<f64> = row.iter().map(|x| x.exp()).collect();
                    let sum: f64 = e.iter().sum();
                    lse[(b * hq + h) * tq + i] = sum.ln();
                    if sum == 0.0 {
                        continue;
                    }
                    for x in 0..d {
                        out[qi(b, i, h, x)] = (0..tk).map(|j| e[j] / sum * v[ki(b, j, g, x)]).sum();
                    }
                }
            }
        }
        (out, lse)
    }

    fn shapes() -> Vec<Problem> {
        let mut v = Vec::new();
        for causal in [false, true] {
            for (b, hq, hkv, tq, tk, d) in [
                (2, 4, 4, 5, 5, 8),
                (1, 8, 2, 3, 9, 16), // Tq < Tk, GQA 4:1
                (2, 4, 1, 9, 4, 8),  // Tq > Tk, MQA
                (1, 2, 2, 1, 7, 5),  // decode-like, D not a multiple of 4
                (3, 3, 1, 6, 6, 3),
                (1, 4, 1, 13, 17, 32),
            ] {
                v.push(Problem::new(b, hq, hkv, tq, tk, d, causal));
            }
        }
        v
    }

    /// Each of [`shapes`] with its seed (`base` + index), random inputs and their fp64 [`dense`] result.
    #[allow(clippy::type_complexity)]
    fn shape_cases(base: u64) -> impl Iterator<Item = (u64, Problem, (Vec<f64>, Vec<f64>, Vec<f64>), Output)> {
        shapes().into_iter().enumerate().map(move |(n, p)| {
            let seed = base + n as u64;
            let (q, k, v) = inputs(&p, seed);
            let r = dense(&p, &Variants::default(), Arith::F64, &q, &k, &v).unwrap();
            (seed, p, (q, k, v), r)
        })
    }

    #[test]
    fn dense_matches_naive_formulation() {
        for (seed, ref p, (q, k, v), got) in shape_cases(1000) {
            let (out, lse) = naive_dense(p, &q, &k, &v);
            let (eo, el) = (max_diff(&got.out, &out), max_diff(&got.lse, &lse));
            assert!(eo < 1e-12 && el < 1e-12, "seed {seed} {p:?}: out err {eo}, lse err {el}");
        }
    }

    #[test]
    fn probabilities_sum_to_one_and_masked_are_zero() {
        for (seed, ref p, (q, k, v), full) in shape_cases(2000) {
            let d = p.head_dim;
            for b in 0..p.batch {
                for h in 0..p.heads_q {
                    for i in 0..p.seqlen_q {
                        let probs = probabilities(p, &q, &k, b, h, i).unwrap();
                        assert_eq!(probs.len(), p.seqlen_k);
                        let mut any = false;
                        for (j, &pr) in probs.iter().enumerate() {
                            let visible = !p.causal || j + p.seqlen_q <= i + p.seqlen_k;
                            any |= visible;
                            if visible {
                                assert!(pr > 0.0, "seed {seed} {p:?} ({b},{h},{i},{j}): {pr}");
                            } else {
                                assert_eq!(pr, 0.0, "seed {seed} {p:?} ({b},{h},{i},{j}) masked");
                            }
                        }
                        let sum: f64 = probs.iter().sum();
                        let want = if any { 1.0 } else { 0.0 };
                        assert!((sum - want).abs() < 1e-12, "seed {seed} {p:?} ({b},{h},{i}): sum {sum}");
                        // P·V reproduces the output row.
                        let g = h / (p.heads_q / p.heads_kv);
                        for x in 0..d {
                            let o: f64 = (0..p.seqlen_k)
                                .map(|j| probs[j] * v[((b * p.seqlen_k + j) * p.heads_kv + g) * d + x])
                                .sum();
                            let got = full.out[((b * p.seqlen_q + i) * p.heads_q + h) * d + x];
                            assert!((o - got).abs() < 1e-12, "seed {seed} {p:?}: P·V {o} vs out {got}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn key_permutation_invariance() {
        let seed = 3000;
        for causal in [false, true] {
            let p = Problem::new(2, 4, 2, 6, 11, 8, causal);
            let (q, k, v) = inputs(&p, seed);
            let mut perm: Vec<usize> = (0..p.seqlen_k).collect();
            perm.shuffle(&mut StdRng::seed_from_u64(seed + 1));
            let tok = p.heads_kv * p.head_dim;
            let permute = |x: &[f64]| {
                let mut y = x.to_vec();
                for b in 0..p.batch {
                    for (j, &pj) in perm.iter().enumerate() {
                        let (dst, src) = ((b * p.seqlen_k + j) * tok, (b * p.seqlen_k + pj) * tok);
                        y[dst..dst + tok].copy_from_slice(&x[src..src + tok]);
                    }
                }
                y
            };
            let a = dense(&p, &Variants::default(), Arith::F64, &q, &k, &v).unwrap();
            let b = dense(&p, &Variants::default(), Arith::F64, &q, &permute(&k), &permute(&v)).unwrap();
            let (eo, el) = (max_diff(&a.out, &b.out), max_diff(&a.lse, &b.lse));
            if causal {
                assert!(eo > 1e-3, "seed {seed}: causal output should change under key permutation ({eo})");
            } else {
                assert!(eo < 1e-12 && el < 1e-12, "seed {seed}: out err {eo}, lse err {el}");
            }
        }
    }

    #[test]
    fn empty_rows_give_zero_and_neg_inf() {
        let seed = 4000;
        // Causal with Tq > Tk: the first Tq − Tk rows see nothing.
        let p = Problem::new(2, 4, 2, 7, 3, 8, true);
        let (q, k, v) = inputs(&p, seed);
        let r = dense(&p, &Variants::default(), Arith::F64, &q, &k, &v).unwrap();
        let d = p.head_dim;
        for b in 0..p.batch {
            for h in 0..p.heads_q {
                for i in 0..p.seqlen_q {
                    let l = r.lse[(b * p.heads_q + h) * p.seqlen_q + i];
                    let row = &r.out[((b * p.seqlen_q + i) * p.heads_q + h) * d..][..d];
                    if i < 4 {
                        assert_eq!(l, NEG_INF, "seed {seed} row {i}");
                        assert!(row.iter().all(|&x| x == 0.0), "seed {seed} row {i}: {row:?}");
                    } else {
                        assert!(l.is_finite() && row.iter().all(|x| x.is_finite() && *x != 0.0), "seed {seed} row {i}");
                    }
                }
            }
        }
        // Tk = 0 (bidirectional): every row is empty.
        let p = Problem::new(1, 2, 1, 3, 0, 4, false);
        let (q, k, v) = inputs(&p, seed);
        let r = dense(&p, &Variants::default(), Arith::F64, &q, &k, &v).unwrap();
        assert!(r.out.iter().all(|&x| x == 0.0) && r.lse.iter().all(|&x| x == NEG_INF));
        // Varlen: sequence 1 has no keys, sequence 2 has no tokens at all.
        let (hq, hkv, d) = (2, 1, 4);
        let (cu_q, cu_k) = ([0, 2, 5, 5, 6], [0, 3, 3, 4, 6]);
        let mut rng = StdRng::seed_from_u64(seed);
        let q = rand_vec(&mut rng, 6 * hq * d, -1.0, 1.0);
        let k = rand_vec(&mut rng, 6 * hkv * d, -1.0, 1.0);
        let v = rand_vec(&mut rng, 6 * hkv * d, 0.5, 1.5);
        for causal in [false, true] {
            let r = varlen(hq, hkv, (d, d), causal, 0.5, &Variants::default(), Arith::F64, &cu_q, &cu_k, &q, &k, &v)
                .unwrap();
            for t in 0..6 {
                let empty = (2..5).contains(&t);
                for h in 0..hq {
                    let l = r.lse[h * 6 + t];
                    let row = &r.out[(t * hq + h) * d..][..d];
                    assert_eq!(empty, l == NEG_INF, "seed {seed} token {t} head {h}: lse {l}");
                    assert_eq!(empty, row.iter().all(|&x| x == 0.0), "seed {seed} token {t}: {row:?}");
                    assert!(row.iter().all(|x| x.is_finite()));
                }
            }
        }
    }

    #[test]
    fn varlen_equals_dense_per_sequence() {
        let seed = 5000;
        let mut rng = StdRng::seed_from_u64(seed);
        let (hq, hkv, d) = (8, 2, 12);
        let lens: [(usize, usize); 5] = [(3, 3), (1, 9), (6, 2), (0, 4), (5, 11)];
        let cu = |f: fn(&(usize, usize)) -> usize| -> Vec<i32> {
            let mut v = vec![0];
            for l in &lens {
                v.push(v[v.len() - 1] + f(l) as i32);
            }
            v
        };
        let (cu_q, cu_k) = (cu(|l| l.0), cu(|l| l.1));
        let (tot_q, tot_k) = (*cu_q.last().unwrap() as usize, *cu_k.last().unwrap() as usize);
        let q = rand_vec(&mut rng, tot_q * hq * d, -1.0, 1.0);
        let k = rand_vec(&mut rng, tot_k * hkv * d, -1.0, 1.0);
        let v = rand_vec(&mut rng, tot_k * hkv * d, -0.5, 1.5);
        for causal in [false, true] {
            let r = varlen(hq, hkv, (d, d), causal, 0.3, &Variants::default(), Arith::F64, &cu_q, &cu_k, &q, &k, &v)
                .unwrap();
            for (s, &(tq, tk)) in lens.iter().enumerate() {
                let (q0, k0) = (cu_q[s] as usize, cu_k[s] as usize);
                let p = Problem { scale: 0.3, ..Problem::new(1, hq, hkv, tq, tk, d, causal) };
                let want = dense(
                    &p,
                    &Variants::default(),
                    Arith::F64,
                    &q[q0 * hq * d..(q0 + tq) * hq * d],
                    &k[k0 * hkv * d..(k0 + tk) * hkv * d],
                    &v[k0 * hkv * d..(k0 + tk) * hkv * d],
                )
                .unwrap();
                assert_eq!(&r.out[q0 * hq * d..(q0 + tq) * hq * d], &want.out[..], "seed {seed} seq {s}");
                for h in 0..hq {
                    assert_eq!(&r.lse[h * tot_q + q0..][..tq], &want.lse[h * tq..][..tq], "seed {seed} seq {s}");
                }
            }
        }
    }

    /// A paged cache with shuffled pages, NaN in every slot no sequence uses and −1 in unused table entries.
    /// A random paged cache and, per sequence, the dense K/V it holds.
    struct Paged {
        data: PagedCacheData,
        dense_kv: Vec<(Vec<f64>, Vec<f64>)>,
    }

    impl Paged {
        /// The reference's view of this cache (tests vary one field with `..c.cache()`).
        fn cache(&self) -> PagedCache<'_> {
            self.data.cache()
        }
    }

    fn paged(seed: u64, hkv: usize, d: usize, page_size: usize, seq_lens: &[usize]) -> Paged {
        let mut rng = StdRng::seed_from_u64(seed);
        let tok = hkv * d;
        let max_pages = seq_lens.iter().map(|l| l.div_ceil(page_size)).max().unwrap_or(0) + 1;
        let used: usize = seq_lens.iter().map(|l| l.div_ceil(page_size)).sum();
        let num_pages = used + 3; // spare pages never referenced
        let mut pages: Vec<usize> = (0..num_pages).collect();
        pages.shuffle(&mut rng);
        let mut k_cache = vec![f64::NAN; num_pages * page_size * tok];
        let mut v_cache = k_cache.clone();
        let mut table = vec![-1; seq_lens.len() * max_pages];
        let mut next = 0;
        let mut dense_kv = Vec::new();
        for (b, &len) in seq_lens.iter().enumerate() {
            let ks = rand_vec(&mut rng, len * tok, -1.0, 1.0);
            let vs = rand_vec(&mut rng, len * tok, -0.5, 1.5);
            for t in 0..len {
                if t % page_size == 0 {
                    table[b * max_pages + t / page_size] = pages[next] as i32;
                    next += 1;
                }
                let slot = (table[b * max_pages + t / page_size] as usize * page_size + t % page_size) * tok;
                k_cache[slot..slot + tok].copy_from_slice(&ks[t * tok..][..tok]);
                v_cache[slot..slot + tok].copy_from_slice(&vs[t * tok..][..tok]);
            }
            dense_kv.push((ks, vs));
        }
        let seq_lens = seq_lens.iter().map(|&l| l as i32).collect();
        let data = PagedCacheData {
            k_cache,
            v_cache,
            num_pages,
            page_size,
            heads_kv: hkv,
            head_dim: d,
            head_dim_v: d,
            block_table: table,
            max_pages_per_seq: max_pages,
            seq_lens,
        };
        Paged { data, dense_kv }
    }

    #[test]
    fn paged_decode_equals_dense_on_gathered_kv() {
        let seed = 5500;
        let (hq, hkv, d) = (8, 2, 16);
        for page_size in [1, 4, 16] {
            let c = paged(seed, hkv, d, page_size, &[5, 0, 17, 8, 16]);
            let kv = gather_paged(&c.cache()).unwrap();
            assert_eq!(kv, c.dense_kv, "seed {seed} page_size {page_size}");
            let q = rand_vec(&mut StdRng::seed_from_u64(seed + 7), c.data.seq_lens.len() * hq * d, -1.0, 1.0);
            let scale = 0.25;
            let r = paged_decode(hq, scale, &Variants::default(), Arith::F64, &q, &c.cache()).unwrap();
            assert!(r.out.iter().all(|x| x.is_finite()), "seed {seed}: NaN leaked from unused cache slots");
            for (b, (ks, vs)) in c.dense_kv.iter().enumerate() {
                for causal in [false, true] {
                    let tk = ks.len() / (hkv * d);
                    let p = Problem { scale, ..Problem::new(1, hq, hkv, 1, tk, d, causal) };
                    let want = dense(&p, &Variants::default(), Arith::F64, &q[b * hq * d..][..hq * d], ks, vs).unwrap();
                    assert_eq!(&r.out[b * hq * d..][..hq * d], &want.out[..], "seed {seed} seq {b}");
                    assert_eq!(&r.lse[b * hq..][..hq], &want.lse[..], "seed {seed} seq {b}");
                }
            }
            let naive =
                paged_decode(hq, scale, &Variants::default(), Arith::Lowp(DType::Bf16), &q, &c.cache()).unwrap().out;
            assert!(naive.iter().all(|x| x.is_finite()), "seed {seed}: NaN leaked into the naive decode");
        }
    }

    /// A V head dim of its own in the paged cache (K pages of d, V pages of dv, either wider): paged decode
    /// equals the dense reference over the gathered keys with `head_dim_v`, exactly.
    #[test]
    fn paged_decode_with_a_v_head_dim_of_its_own_equals_dense() {
        let (hq, hkv, scale) = (4, 2, 0.3);
        for (d, dv) in [(16, 24), (24, 16)] {
            let wide = d.max(dv);
            let c = paged(5600, hkv, wide, 4, &[5, 0, 9]);
            let narrow = |x: &[f64], n: usize| x.chunks(wide).flat_map(|r| r[..n].to_vec()).collect::<Vec<f64>>();
            let (kc, vc) = (narrow(&c.data.k_cache, d), narrow(&c.data.v_cache, dv));
            let cache = PagedCache { k_cache: &kc, v_cache: &vc, head_dim: d, head_dim_v: dv, ..c.cache() };
            let q = rand_vec(&mut StdRng::seed_from_u64(5601), 3 * hq * d, -1.0, 1.0);
            let r = paged_decode(hq, scale, &Variants::default(), Arith::F64, &q, &cache).unwrap();
            assert_eq!(r.out.len(), 3 * hq * dv);
            for (b, (ks, vs)) in c.dense_kv.iter().enumerate() {
                let tk = ks.len() / (hkv * wide);
                let p = Problem { scale, head_dim_v: dv, ..Problem::new(1, hq, hkv, 1, tk, d, false) };
                let (ks, vs) = (narrow(ks, d), narrow(vs, dv));
                let want = dense(&p, &Variants::default(), Arith::F64, &q[b * hq * d..][..hq * d], &ks, &vs).unwrap();
                assert_eq!(&r.out[b * hq * dv..][..hq * dv], &want.out[..], "{d}/{dv} seq {b}");
            }
            // A V cache of the wrong width is a Shape error naming it.
            let bad = PagedCache { head_dim_v: d + dv, ..cache };
            let e = paged_decode(hq, scale, &Variants::default(), Arith::F64, &q, &bad).unwrap_err();
            assert!(e.message().starts_with("v_cache"), "{e}");
        }
    }

    #[test]
    fn merge_of_key_chunks_reproduces_full_attention() {
        let seed = 6000;
        let (b, hq, hkv, tq, tk, d) = (2, 4, 2, 3, 20, 8);
        let full_p = Problem::new(b, hq, hkv, tq, tk, d, false);
        let (q, k, v) = inputs(&full_p, seed);
        let full = dense(&full_p, &Variants::default(), Arith::F64, &q, &k, &v).unwrap();
        let rows = b * tq * hq; // row order (b, i, h), as in out
                                // lse [B, Hq, Tq] -> row order (b, i, h)
        let lse_rows = |l: &[f64]| -> Vec<f64> {
            let mut r = vec![0.0; rows];
            for bb in 0..b {
                for h in 0..hq {
                    for i in 0..tq {
                        r[(bb * tq + i) * hq + h] = l[(bb * hq + h) * tq + i];
                    }
                }
            }
            r
        };
        let slice_keys = |x: &[f64], j0: usize, j1: usize| -> Vec<f64> {
            (0..b).flat_map(|bb| x[(bb * tk + j0) * hkv * d..(bb * tk + j1) * hkv * d].to_vec()).collect()
        };
        let bounds = [0, 7, 7, 15, 20]; // includes an empty chunk
        let (mut o, mut l) = (Vec::new(), Vec::new());
        for w in bounds.windows(2) {
            let p = Problem { seqlen_k: w[1] - w[0], ..full_p };
            let part = dense(
                &p,
                &Variants::default(),
                Arith::F64,
                &q,
                &slice_keys(&k, w[0], w[1]),
                &slice_keys(&v, w[0], w[1]),
            )
            .unwrap();
            let mut po = part.out;
            if w[0] == w[1] {
                po.fill(f64::NAN); // an empty partial's o must not be read
            }
            o.extend(po);
            l.extend(lse_rows(&part.lse));
        }
        let m = merge_states(bounds.len() - 1, rows, d, &o, &l).unwrap();
        let (eo, el) = (max_diff(&m.out, &full.out), max_diff(&m.lse, &lse_rows(&full.lse)));
        assert!(eo < 1e-12 && el < 1e-12, "seed {seed}: out err {eo}, lse err {el}");

        // One state only: the identity.
        let one = merge_states(1, rows, d, &full.out, &lse_rows(&full.lse)).unwrap();
        assert!(max_diff(&one.out, &full.out) < 1e-15);
        // All empty: 0 / −inf, even with NaN garbage in o.
        let empty = merge_states(3, 2, d, &vec![f64::NAN; 3 * 2 * d], &[NEG_INF; 6]).unwrap();
        assert!(empty.out.iter().all(|&x| x == 0.0) && empty.lse.iter().all(|&x| x == NEG_INF));
        // Row 0 has one non-empty state, row 1 none.
        let o = [1.0, 2.0, f64::NAN, f64::NAN, f64::NAN, f64::NAN, f64::NAN, f64::NAN];
        let r = merge_states(2, 2, 2, &o, &[0.5, NEG_INF, NEG_INF, NEG_INF]).unwrap();
        assert_eq!(r.out, [1.0, 2.0, 0.0, 0.0]);
        assert_eq!(r.lse, [0.5, NEG_INF]);
    }

    fn round_all(x: &[f64], dt: DType) -> Vec<f64> {
        x.iter().map(|&v| dt.round(v)).collect()
    }

    #[test]
    fn naive_lowp_error_is_small_and_tolerance_rule_works() {
        let seed = 7000;
        let p = Problem::new(2, 4, 2, 17, 33, 64, true);
        let (q, k, v) = inputs(&p, seed);
        let mut errs = Vec::new();
        for dt in [DType::F16, DType::Bf16] {
            let (q, k, v) = (round_all(&q, dt), round_all(&k, dt), round_all(&v, dt));
            let r = dense(&p, &Variants::default(), Arith::F64, &q, &k, &v).unwrap();
            let naive = dense(&p, &Variants::default(), Arith::Lowp(dt), &q, &k, &v).unwrap().out;
            let err = max_diff(&naive, &r.out);
            let eps = if dt == DType::F16 { 2f64.powi(-10) } else { 2f64.powi(-7) };
            assert!(err > 0.0 && err < 8.0 * eps, "seed {seed} {dt:?}: naive err {err}");
            errs.push(err);

            let c = compare(&r.out, &r.out, &naive);
            assert!(c.passed && c.max_abs_err == 0.0 && c.rel_l2_err == 0.0, "{c:?}");
            assert_eq!(c.naive_max_abs_err, err);
            assert_eq!(c.tolerance, 2.0 * err + 1e-5);
            // The naive result itself passes, and so does a slightly perturbed reference.
            assert!(compare(&naive, &r.out, &naive).passed);
            let mut ours = r.out.clone();
            ours[5] += 1.5 * err;
            assert!(compare(&ours, &r.out, &naive).passed);
            ours[5] += 1.0;
            let c = compare(&ours, &r.out, &naive);
            assert!(!c.passed && c.rel_l2_err > 0.0, "{c:?}");
            ours[5] = f64::NAN;
            assert!(!compare(&ours, &r.out, &naive).passed);
            // A NaN in the naive result must not widen the tolerance to "anything goes".
            let mut bad_naive = naive.clone();
            bad_naive[0] = f64::NAN;
            assert!(!compare(&r.out, &r.out, &bad_naive).passed);
            // Length mismatch fails.
            assert!(!compare(&r.out[1..], &r.out, &naive).passed);

            // varlen lowp agrees with dense lowp on the same single sequence.
            let cu_q = [0, p.seqlen_q as i32];
            let cu_k = [0, p.seqlen_k as i32];
            let b0 = |x: &[f64], t: usize, h: usize| x[..t * h * p.head_dim].to_vec();
            let vl = varlen(
                p.heads_q,
                p.heads_kv,
                (p.head_dim, p.head_dim),
                p.causal,
                p.scale,
                &Variants::default(),
                Arith::Lowp(dt),
                &cu_q,
                &cu_k,
                &b0(&q, p.seqlen_q, p.heads_q),
                &b0(&k, p.seqlen_k, p.heads_kv),
                &b0(&v, p.seqlen_k, p.heads_kv),
            )
            .unwrap()
            .out;
            assert_eq!(vl, b0(&naive, p.seqlen_q, p.heads_q));
        }
        assert!(errs[1] > errs[0], "seed {seed}: bf16 err {} should exceed f16 err {}", errs[1], errs[0]);
        // Empty rows stay 0 in the naive path too.
        let p = Problem::new(1, 1, 1, 4, 2, 8, true);
        let (q, k, v) = inputs(&p, seed);
        let naive = dense(&p, &Variants::default(), Arith::Lowp(DType::Bf16), &q, &k, &v).unwrap().out;
        assert!(naive[..2 * 8].iter().all(|&x| x == 0.0) && naive.iter().all(|x| x.is_finite()));
    }

    /// The low-precision path written out like a framework would, with f32 tensors and explicit casts
    /// through `half`; must agree with `dense` under `Arith::Lowp` bit for bit.
    #[test]
    fn naive_lowp_matches_framework_style_formulation() {
        let seed = 7100;
        // D = 12: the scale is not a power of two, so rounding before and after scaling differ.
        let p = Problem::new(1, 4, 2, 6, 9, 12, true);
        let (q, k, v) = inputs(&p, seed);
        for dt in [DType::F16, DType::Bf16] {
            let cast = |x: f32| -> f32 {
                match dt {
                    DType::F16 => half::f16::from_f32(x).to_f32(),
                    DType::Bf16 => half::bf16::from_f32(x).to_f32(),
                }
            };
            let (q, k, v) = (round_all(&q, dt), round_all(&k, dt), round_all(&v, dt));
            let got = dense(&p, &Variants::default(), Arith::Lowp(dt), &q, &k, &v).unwrap().out;
            let (hq, hkv, tq, tk, d) = (p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_k, p.head_dim);
            for h in 0..hq {
                let g = h / (hq / hkv);
                for i in 0..tq {
                    let vis: Vec<usize> = (0..tk).filter(|&j| j + tq <= i + tk).collect();
                    let s: Vec<f32> = vis
                        .iter()
                        .map(|&j| {
                            let mut acc = 0f32;
                            for x in 0..d {
                                acc += q[(i * hq + h) * d + x] as f32 * k[(j * hkv + g) * d + x] as f32;
                            }
                            cast(cast(acc) * p.scale as f32)
                        })
                        .collect();
                    let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let e: Vec<f32> = s.iter().map(|&x| (x - m).exp()).collect();
                    let sum: f32 = e.iter().fold(0.0, |a, &x| a + x);
                    for x in 0..d {
                        let mut o = 0f32;
                        for (&j, &ej) in vis.iter().zip(&e) {
                            o += cast(ej / sum) * v[(j * hkv + g) * d + x] as f32;
                        }
                        let want = f64::from(cast(o));
                        let have = got[(i * hq + h) * d + x];
                        assert_eq!(have, want, "seed {seed} {dt:?} (h {h}, i {i}, x {x})");
                    }
                }
            }
        }
    }

    #[test]
    fn compare_lse_rules() {
        let r = [0.5, NEG_INF, 2.0];
        assert!(compare_lse(&r, &r, 1e-6).passed);
        assert!(compare_lse(&[0.5 + 1e-7, NEG_INF, 2.0], &r, 1e-6).passed);
        assert!(!compare_lse(&[0.5 + 1e-5, NEG_INF, 2.0], &r, 1e-6).passed);
        assert!(!compare_lse(&[0.5, -1e30, 2.0], &r, 1e-6).passed, "finite where −inf expected");
        assert!(!compare_lse(&[NEG_INF, NEG_INF, 2.0], &r, 1e-6).passed, "−inf where finite expected");
        assert!(!compare_lse(&[0.5, f64::NAN, 2.0], &r, 1e-6).passed);
        assert!(!compare_lse(&[0.5, NEG_INF], &r, 1e-6).passed);
    }

    #[test]
    fn visible_keys_is_bottom_right() {
        assert_eq!((0..4).map(|i| visible_keys(true, 4, 4, i)).collect::<Vec<_>>(), [1, 2, 3, 4]);
        assert_eq!((0..2).map(|i| visible_keys(true, 2, 5, i)).collect::<Vec<_>>(), [4, 5]);
        assert_eq!((0..5).map(|i| visible_keys(true, 5, 2, i)).collect::<Vec<_>>(), [0, 0, 0, 1, 2]);
        assert_eq!(visible_keys(false, 5, 2, 0), 2);
        assert_eq!(visible_keys(true, 3, 0, 2), 0);
    }

    #[test]
    fn bad_input_gives_the_right_error_kind() {
        let kind = |r: Result<Output>| r.unwrap_err().kind().clone();
        let p = Problem::new(1, 4, 2, 3, 5, 8, false);
        let (q, k, v) = inputs(&p, 8000);
        assert_eq!(kind(dense(&p, &Variants::default(), Arith::F64, &q[1..], &k, &v)), ErrorKind::Shape);
        assert_eq!(kind(dense(&p, &Variants::default(), Arith::F64, &q, &k, &v[..8])), ErrorKind::Shape);
        assert_eq!(
            kind(dense(&Problem { heads_kv: 3, ..p }, &Variants::default(), Arith::F64, &q, &k, &v)),
            ErrorKind::Shape
        );
        assert_eq!(
            kind(dense(&Problem { heads_kv: 0, ..p }, &Variants::default(), Arith::F64, &q, &k, &v)),
            ErrorKind::Shape
        );
        assert_eq!(
            kind(dense(&Problem { head_dim: 0, ..p }, &Variants::default(), Arith::F64, &[], &[], &[])),
            ErrorKind::Shape
        );
        assert_eq!(Problem { batch: usize::MAX / 2, ..p }.validate().unwrap_err().kind(), &ErrorKind::Overflow);
        assert!(p.validate().is_ok());
        let e = probabilities(&p, &q, &k, 0, 4, 0).unwrap_err();
        assert_eq!(e.kind(), &ErrorKind::OutOfBounds);

        // varlen: 2 sequences of (q, k) lengths (1, 2) and (2, 3); token sizes Hq·D = 32, Hkv·D = 16.
        let (q, k) = (vec![0.0; 3 * 32], vec![0.0; 5 * 16]);
        let vl = |cq: &[i32], ck: &[i32], q: &[f64], k: &[f64]| {
            kind(varlen(4, 2, (8, 8), true, 1.0, &Variants::default(), Arith::F64, cq, ck, q, k, k))
        };
        assert!(varlen(4, 2, (8, 8), true, 1.0, &Variants::default(), Arith::F64, &[0, 1, 3], &[0, 2, 5], &q, &k, &k)
            .is_ok());
        assert_eq!(vl(&[0, 1, 3], &[0, 5], &q, &k), ErrorKind::Shape, "cu lengths differ");
        assert_eq!(vl(&[], &[], &[], &[]), ErrorKind::Shape, "empty cu");
        assert_eq!(vl(&[1, 1, 3], &[0, 2, 5], &q, &k), ErrorKind::Shape, "not starting at 0");
        assert_eq!(vl(&[0, 2, 1], &[0, 2, 5], &q, &k), ErrorKind::Shape, "decreasing");
        assert_eq!(vl(&[0, 1, 2], &[0, 2, 5], &q, &k), ErrorKind::Shape, "last != total_q");
        assert_eq!(vl(&[0, 1, 3], &[0, 2, 6], &q, &k), ErrorKind::Shape, "last != total_k");
        assert_eq!(vl(&[0, 1, 3], &[0, 2, 5], &q[1..], &k), ErrorKind::Shape, "ragged q");
        let e = varlen(4, 3, (8, 8), true, 1.0, &Variants::default(), Arith::F64, &[0, 1, 3], &[0, 2, 5], &q, &k, &k)
            .unwrap_err();
        assert_eq!(e.kind(), &ErrorKind::Shape);

        // paged
        let (hkv, d) = (2, 4);
        let c = paged(8001, hkv, d, 4, &[5, 3]);
        let g = |table: &[i32], lens: &[i32], ps: usize| {
            gather_paged(&PagedCache { page_size: ps, block_table: table, seq_lens: lens, ..c.cache() })
                .unwrap_err()
                .kind()
                .clone()
        };
        let mut t = c.data.block_table.clone();
        t[1] = c.data.num_pages as i32; // page of token 4 of sequence 0
        assert_eq!(g(&t, &c.data.seq_lens, 4), ErrorKind::OutOfBounds);
        t[1] = -1;
        assert_eq!(g(&t, &c.data.seq_lens, 4), ErrorKind::OutOfBounds);
        assert_eq!(
            g(&c.data.block_table, &[5, (c.data.max_pages_per_seq * 4 + 1) as i32], 4),
            ErrorKind::Shape,
            "over capacity"
        );
        assert_eq!(g(&c.data.block_table, &[5, -1], 4), ErrorKind::Shape, "negative seq_len");
        assert_eq!(g(&c.data.block_table[1..], &c.data.seq_lens, 4), ErrorKind::Shape, "table length");
        assert_eq!(g(&c.data.block_table, &c.data.seq_lens, 0), ErrorKind::Shape, "page_size 0");
        let q = vec![0.0; 2 * 4 * d];
        let pd = |q: &[f64], hq: usize| kind(paged_decode(hq, 1.0, &Variants::default(), Arith::F64, q, &c.cache()));
        assert_eq!(pd(&q[1..], 4), ErrorKind::Shape);
        assert_eq!(pd(&q, 3), ErrorKind::Shape);
        let e = paged_decode(
            4,
            1.0,
            &Variants::default(),
            Arith::F64,
            &q,
            &PagedCache { k_cache: &c.data.k_cache[1..], max_pages_per_seq: 3, seq_lens: &[5, 3], ..c.cache() },
        );
        assert_eq!(kind(e), ErrorKind::Shape);

        // merge
        assert_eq!(kind(merge_states(2, 3, 4, &[0.0; 24], &[0.0; 5])), ErrorKind::Shape);
        assert_eq!(kind(merge_states(2, 3, 4, &[0.0; 23], &[0.0; 6])), ErrorKind::Shape);
        assert_eq!(kind(merge_states(usize::MAX, 3, 4, &[], &[])), ErrorKind::Overflow);
    }

    /// A model of the kernels' arithmetic (fp32 scores and accumulation, online softmax over 16-key tiles
    /// in the exp2 domain, P rounded to the dtype for P·V, one rounding of O) stays within the arithmetic
    /// bound on random inputs, sharp softmaxes included, and far inside the naive rule's slack there.
    fn kernel_model(dt: DType, scale: f64, q: &[f64], k: &[Vec<f64>], v: &[Vec<f64>]) -> Vec<f64> {
        let d = q.len();
        let scale_log2 = scale as f32 * std::f32::consts::LOG2_E;
        let (mut m, mut l, mut o) = (f32::NEG_INFINITY, 0f32, vec![0f32; d]);
        for tile in (0..k.len()).collect::<Vec<_>>().chunks(16) {
            let s: Vec<f32> = tile
                .iter()
                .map(|&j| q.iter().zip(&k[j]).fold(0f32, |a, (&x, &y)| a + x as f32 * y as f32) * scale_log2)
                .collect();
            let m_new = s.iter().copied().fold(m, f32::max);
            let corr = (m - m_new).exp2();
            l *= corr;
            o.iter_mut().for_each(|x| *x *= corr);
            for (&j, &sj) in tile.iter().zip(&s) {
                let p = (sj - m_new).exp2();
                l += p;
                let p_low = dt.round(f64::from(p)) as f32;
                for (x, &vx) in o.iter_mut().zip(&v[j]) {
                    *x += p_low * vx as f32;
                }
            }
            m = m_new;
        }
        o.iter().map(|&x| dt.round(f64::from(x / l))).collect()
    }

    #[test]
    fn kernel_model_stays_within_the_arithmetic_bound() {
        let mut worst: f64 = 0.0;
        for (n, (scale, mag, dt)) in [
            (0.125, 1.0, DType::Bf16),
            (1.0, 2.0, DType::F16),
            (3.0, 8.0, DType::Bf16),
            (3.0, 4.0, DType::F16),
            (0.01, 2.0, DType::Bf16),
        ]
        .into_iter()
        .enumerate()
        {
            let seed = 9100 + n as u64;
            let mut rng = StdRng::seed_from_u64(seed);
            let (d, keys) = (64, 300);
            let draw = |rng: &mut StdRng, lo: f64, hi: f64| dt.round(rng.random_range(lo..hi));
            let q: Vec<f64> = (0..d).map(|_| draw(&mut rng, -mag, mag)).collect();
            let k: Vec<Vec<f64>> = (0..keys).map(|_| (0..d).map(|_| draw(&mut rng, -mag, mag)).collect()).collect();
            let v: Vec<Vec<f64>> =
                (0..keys).map(|_| (0..d).map(|_| draw(&mut rng, -0.5 * mag, mag)).collect()).collect();
            let p = Problem { scale, ..Problem::new(1, 1, 1, 1, keys, d, false) };
            let (kf, vf): (Vec<f64>, Vec<f64>) = (k.concat(), v.concat());
            let exact = dense(&p, &Variants::default(), Arith::F64, &q, &kf, &vf).unwrap();
            let naive = dense(&p, &Variants::default(), Arith::Lowp(dt), &q, &kf, &vf).unwrap().out;
            let ours = kernel_model(dt, scale, &q, &k, &v);
            let c = compare_bounded(&ours, &exact.out, &naive, &exact.out_bound(Some(dt), Some(dt)));
            assert!(c.passed, "seed {seed} scale {scale} |x|<{mag} {dt:?}: {c:?}");
            worst = worst.max(c.bound_ratio);
            if mag == 8.0 {
                // Sharp softmax, large magnitudes: the naive rule's slack is far wider than the bound.
                let widest = exact.out_bound(Some(dt), Some(dt)).into_iter().fold(0.0, f64::max);
                assert!(c.tolerance > 4.0 * widest, "seed {seed}: naive tol {} vs bound {widest}", c.tolerance);
            }
        }
        assert!(worst > 0.05, "the bound is loose enough to be meaningless ({worst})");
    }

    #[test]
    fn bound_terms_of_constant_keys_and_one_token() {
        // Constant keys: no key is below the max, so P needs no rounding; the bound is a few output ulps and
        // dropping one of 4,097 tokens exceeds it.
        let (n, d) = (4097, 16);
        let mut rng = StdRng::seed_from_u64(9200);
        let q: Vec<f64> = (0..d).map(|_| rng.random_range(-1.0..1.0)).collect();
        let k0: Vec<f64> = (0..d).map(|_| rng.random_range(-1.0..1.0)).collect();
        let k: Vec<f64> = (0..n).flat_map(|_| k0.clone()).collect();
        let v: Vec<f64> = (0..n * d).map(|_| DType::Bf16.round(rng.random_range(-1.0..1.0))).collect();
        let p = Problem::new(1, 1, 1, 1, n, d, false);
        let r = dense(&p, &Variants::default(), Arith::F64, &q, &k, &v).unwrap();
        assert!(r.terms.iter().all(|t| t.abs_out_below_max == 0.0 && t.keys == n && t.tiny == 0.0));
        let bound = r.out_bound(Some(DType::Bf16), Some(DType::Bf16));
        let dropped =
            dense(&Problem { seqlen_k: n - 1, ..p }, &Variants::default(), Arith::F64, &q, &k[d..], &v[d..]).unwrap();
        let c = compare_within(&dropped.out, &r.out, &bound);
        assert!(!c.passed && c.bound_ratio > 2.0, "{c:?}");
        assert!(compare_within(&r.out, &r.out, &bound).passed);
        assert_eq!(half_ulp(Some(DType::Bf16), 1.0), 1.0 / 256.0);
        assert_eq!(half_ulp(Some(DType::F16), 1.5), 1.0 / 2048.0);
        assert_eq!(half_ulp(Some(DType::F16), 0.0), 1.0 / (1u64 << 25) as f64);
        assert_eq!(half_ulp(None, 1.0), 1.0 / (1u64 << 24) as f64);
        // Empty rows have a (next to) zero bound: only an exact 0 passes.
        let e = dense(
            &Problem { seqlen_q: 3, seqlen_k: 1, causal: true, ..p },
            &Variants::default(),
            Arith::F64,
            &[q.clone(), q.clone(), q.clone()].concat(),
            &k[..d],
            &v[..d],
        )
        .unwrap();
        assert!(e.out_bound(Some(DType::Bf16), Some(DType::Bf16))[..d].iter().all(|&b| b < 1e-30));
    }

    #[test]
    fn paged_decode_masks_out_of_range_pages() {
        let (hkv, d, ps) = (2, 8, 4);
        let c = paged(9300, hkv, d, ps, &[13, 9]);
        let q: Vec<f64> = (0..2 * 4 * d).map(|i| (i % 7) as f64 * 0.3 - 1.0).collect();
        let mut table = c.data.block_table.clone();
        table[1] = -3; // tokens 4..8 of sequence 0
        table[c.data.max_pages_per_seq] = c.data.num_pages as i32; // tokens 0..4 of sequence 1
        let cache = PagedCache { block_table: &table, ..c.cache() };
        let got = paged_decode(4, 0.5, &Variants::default(), Arith::F64, &q, &cache).unwrap();
        assert_eq!(gather_paged(&cache).unwrap_err().kind(), &ErrorKind::OutOfBounds);
        // The same as attending to the remaining tokens only.
        let tok = hkv * d;
        let keep = |x: &[f64], drop: std::ops::Range<usize>| -> Vec<f64> {
            x.chunks(tok).enumerate().filter(|(t, _)| !drop.contains(t)).flat_map(|(_, r)| r.to_vec()).collect()
        };
        let (k0, v0) = (keep(&c.dense_kv[0].0, 4..8), keep(&c.dense_kv[0].1, 4..8));
        let (k1, v1) = (keep(&c.dense_kv[1].0, 0..4), keep(&c.dense_kv[1].1, 0..4));
        let a = Attn::new(4, hkv, d, false, 0.5).unwrap();
        let seq = |k: Vec<f64>, v: Vec<f64>| {
            let n = k.len() / tok;
            GatheredSeq { k, v, pos: (0..n).collect(), len: n }
        };
        let want = decode_gathered(Arith::F64, &a, &q, &[seq(k0, v0), seq(k1, v1)]).unwrap();
        assert!(max_diff(&got.out, &want.out) < 1e-15 && max_diff(&got.lse, &want.lse) < 1e-15);
        let naive = paged_decode(4, 0.5, &Variants::default(), Arith::Lowp(DType::F16), &q, &cache).unwrap().out;
        assert!(max_diff(&naive, &got.out) < 1e-2);
    }
}
