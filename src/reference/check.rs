//! One-call checks of an op's outputs against the fp64 reference, over the same views the op took: the
//! inputs are widened to f64 (an FP8 cache as stored value × its scale), the reference and the naive
//! same-dtype implementation run with the op's options (scale, causal, score variants), and O is judged by
//! the tolerance rule and the arithmetic bound ([`compare_bounded`]), LSE within 1e-4 (prefill) / 1e-3
//! (paged ops) plus 16 u·|LSE| (docs/semantics.md, "Tolerance"). Host views only: copy GPU outputs back first
//! (the inputs too, or build host views of the same data).

use std::fmt;

use super::{
    compare_bounded, compare_lse, dense, paged_decode, paged_prefill, varlen, Arith, Comparison, Output, PagedCache,
    Problem, Variants,
};
use crate::decode::DecodeOptions;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::fp8::KvElement;
use crate::paged::PagedKvCache;
use crate::paged_prefill::PagedPrefillOptions;
use crate::prefill::PrefillOptions;
use crate::score_mod::{AlibiSlopes, ScoreMod};
use crate::tensor::{Mem, TensorView};

/// The verdict of a one-call check: O, and LSE when it was given.
#[derive(Clone, Copy, Debug)]
pub struct Check {
    pub out: Comparison,
    pub lse: Option<Comparison>,
}

impl Check {
    pub fn passed(&self) -> bool {
        self.out.passed && self.lse.is_none_or(|l| l.passed)
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.out;
        write!(f, "max |err| {:.2e} (tolerance {:.2e}, bound ratio {:.2})", o.max_abs_err, o.tolerance, o.bound_ratio)?;
        if let Some(l) = &self.lse {
            write!(f, ", lse max |err| {:.2e} (tolerance {:.2e})", l.max_abs_err, l.tolerance)?;
        }
        write!(f, " {}", if self.passed() { "ok" } else { "FAILED" })
    }
}

/// A paged cache's contents in f64 (FP8 codes × their head's scale), with its block table and lengths: what
/// [`PagedCache`] borrows. Build it from the cache view an op took with [`PagedCacheData::from_host`].
#[derive(Clone, Debug)]
pub struct PagedCacheData {
    pub k_cache: Vec<f64>,
    pub v_cache: Vec<f64>,
    pub num_pages: usize,
    pub page_size: usize,
    pub heads_kv: usize,
    pub head_dim: usize,
    /// V's head dim (`head_dim` unless V has one of its own).
    pub head_dim_v: usize,
    pub block_table: Vec<i32>,
    pub max_pages_per_seq: usize,
    pub seq_lens: Vec<i32>,
}

impl PagedCacheData {
    /// Reads a host cache view (any strides; 16-bit or FP8 with its scales attached).
    pub fn from_host<C: KvElement>(cache: &PagedKvCache<'_, C>) -> Result<Self> {
        let g = cache.geometry();
        // The scale tensors' values, read from the host views the kernel read (none: 16-bit, all 1).
        let (k_scales, v_scales) = match cache.scales() {
            Some(s) => (host_elements("k_scale", s.k())?, host_elements("v_scale", s.v())?),
            None => (vec![1.0], vec![1.0]),
        };
        // The dequantisation scale of KV head `h`, K's or V's (one per tensor or one per head).
        let scale = |is_k: bool, h: usize| {
            let s = if is_k { &k_scales } else { &v_scales };
            s[if s.len() == 1 { 0 } else { h }]
        };
        let scaled = |name: &str, view: &TensorView<'_, C, 4>, is_k: bool| -> Result<Vec<f64>> {
            let raw = host_elements(name, view)?;
            let row = if is_k { g.head_dim } else { g.head_dim_v };
            Ok(raw
                .into_iter()
                .enumerate()
                .map(|(i, x)| x.stored_value() * f64::from(scale(is_k, (i / row) % g.heads_kv)))
                .collect())
        };
        Ok(Self {
            k_cache: scaled("k_cache", &cache.k, true)?,
            v_cache: scaled("v_cache", &cache.v, false)?,
            num_pages: g.num_pages,
            page_size: g.page_size,
            heads_kv: g.heads_kv,
            head_dim: g.head_dim,
            head_dim_v: g.head_dim_v,
            block_table: host_elements("block_table", &cache.block_table)?,
            max_pages_per_seq: cache.max_pages_per_seq(),
            seq_lens: host_elements("seq_lens", &cache.seq_lens)?,
        })
    }

    pub fn cache(&self) -> PagedCache<'_> {
        PagedCache {
            k_cache: &self.k_cache,
            v_cache: &self.v_cache,
            num_pages: self.num_pages,
            page_size: self.page_size,
            heads_kv: self.heads_kv,
            head_dim: self.head_dim,
            head_dim_v: self.head_dim_v,
            block_table: &self.block_table,
            max_pages_per_seq: self.max_pages_per_seq,
            seq_lens: &self.seq_lens,
        }
    }
}

/// Checks a [`crate::prefill::prefill`] call: `q [B, Tq, Hq, D]`, `k [B, Tk, Hkv, D]`, `v [B, Tk, Hkv, Dv]`,
/// its outputs `o [B, Tq, Hq, Dv]` and `lse [B, Hq, Tq]`, and the options it ran with.
pub fn check_prefill<T: Element>(
    q: &TensorView<'_, T, 4>,
    k: &TensorView<'_, T, 4>,
    v: &TensorView<'_, T, 4>,
    o: &TensorView<'_, T, 4>,
    lse: Option<&TensorView<'_, f32, 3>>,
    opts: &PrefillOptions<'_>,
) -> Result<Check> {
    let [b, tq, hq, d] = q.shape();
    let [_, tk, hkv, _] = k.shape();
    let p = Problem {
        scale: scale_of(opts.scale, d),
        head_dim_v: v.dim(3),
        ..Problem::new(b, hq, hkv, tq, tk, d, opts.causal)
    };
    let var = HostVariants::read(&opts.score_mod, b, hq)?;
    let (mut fq, mut fk, fv) = (host_f64("q", q)?, host_f64("k", k)?, host_f64("v", v)?);
    // RoPE: token (b, i) at positions[b·Tq + i], or at its bottom-right position i + Tk − Tq; with rope_k,
    // key (b, j) at its positions[b·Tk + j], or at j.
    rotate_q::<T>(opts.rope.as_ref(), &mut fq, d, hq, || {
        (0..b * tq).map(|t| (t % tq) as i64 + tk as i64 - tq as i64).collect()
    })?;
    rotate_k::<T>(opts, &mut fk, d, hkv, || (0..b * tk).map(|t| (t % tk) as i64).collect())?;
    judge(|ar| dense(&p, &var.view(), ar, &fq, &fk, &fv), o, lse, PREFILL_LSE_ATOL)
}

/// Checks a [`crate::prefill::prefill_varlen`] call: packed `q [total_q, Hq, D]`, `k [total_k, Hkv, D]`,
/// `v [total_k, Hkv, Dv]`, `cu_seqlens_q` / `cu_seqlens_k [B + 1]`, its outputs `o [total_q, Hq, Dv]` and
/// `lse [Hq, total_q]`.
#[allow(clippy::too_many_arguments)]
pub fn check_prefill_varlen<T: Element>(
    q: &TensorView<'_, T, 3>,
    k: &TensorView<'_, T, 3>,
    v: &TensorView<'_, T, 3>,
    cu_seqlens_q: &TensorView<'_, i32, 1>,
    cu_seqlens_k: &TensorView<'_, i32, 1>,
    o: &TensorView<'_, T, 3>,
    lse: Option<&TensorView<'_, f32, 2>>,
    opts: &PrefillOptions<'_>,
) -> Result<Check> {
    let [_, hq, d] = q.shape();
    let hkv = k.dim(1);
    let (cq, ck) = (host_elements("cu_seqlens_q", cu_seqlens_q)?, host_elements("cu_seqlens_k", cu_seqlens_k)?);
    let var = HostVariants::read(&opts.score_mod, cq.len().saturating_sub(1), hq)?;
    let scale = scale_of(opts.scale, d);
    let (mut fq, mut fk, fv) = (host_f64("q", q)?, host_f64("k", k)?, host_f64("v", v)?);
    // RoPE: packed token t of sequence b at positions[t], or at t − cu_q[b] + Tk_b − Tq_b; with rope_k, packed
    // key t of sequence b at its positions[t], or at t − cu_k[b] (the bottom-right rule with Tq = Tk).
    rotate_q::<T>(opts.rope.as_ref(), &mut fq, d, hq, || bottom_right_positions(&cq, |b| ck[b + 1] - ck[b], q.dim(0)))?;
    rotate_k::<T>(opts, &mut fk, d, hkv, || bottom_right_positions(&ck, |b| ck[b + 1] - ck[b], k.dim(0)))?;
    let run = |ar| varlen(hq, hkv, (d, v.dim(2)), opts.causal, scale, &var.view(), ar, &cq, &ck, &fq, &fk, &fv);
    judge(run, o, lse, PREFILL_LSE_ATOL)
}

/// Checks a [`crate::decode()`] call: `q [B, Hq, D]`, the cache it read (16-bit or FP8), its outputs `o`
/// (as `q`) and `lse [B, Hq]`, and the options it ran with.
pub fn check_decode<T: Element, C: KvElement>(
    q: &TensorView<'_, T, 3>,
    cache: &PagedKvCache<'_, C>,
    o: &TensorView<'_, T, 3>,
    lse: Option<&TensorView<'_, f32, 2>>,
    opts: &DecodeOptions<'_>,
) -> Result<Check> {
    let [b, hq, d] = q.shape();
    let (data, var, mut fq) = paged_inputs(q, cache, &opts.score_mod, b)?;
    // RoPE: q rotated at each sequence's position (explicit, or seq_len - 1).
    rotate_q::<T>(opts.rope.as_ref(), &mut fq, d, hq, || data.seq_lens.iter().map(|&n| i64::from(n) - 1).collect())?;
    let scale = scale_of(opts.scale, d);
    judge(|ar| paged_decode(hq, scale, &var.view(), ar, &fq, &data.cache()), o, lse, PAGED_LSE_ATOL)
}

/// Checks a [`crate::paged_prefill()`] call: packed `q [total_q, Hq, D]`, `cu_seqlens_q [B + 1]`, the cache
/// it read, its outputs `o` (as `q`) and `lse [Hq, total_q]`, and the options it ran with.
pub fn check_paged_prefill<T: Element, C: KvElement>(
    q: &TensorView<'_, T, 3>,
    cu_seqlens_q: &TensorView<'_, i32, 1>,
    cache: &PagedKvCache<'_, C>,
    o: &TensorView<'_, T, 3>,
    lse: Option<&TensorView<'_, f32, 2>>,
    opts: &PagedPrefillOptions<'_>,
) -> Result<Check> {
    let [_, hq, d] = q.shape();
    let (data, var, mut fq) = paged_inputs(q, cache, &opts.score_mod, cache.batch())?;
    let cu = host_elements("cu_seqlens_q", cu_seqlens_q)?;
    // RoPE: packed token t of sequence b at positions[t], or at its place in the cache t − cu[b] + seq_len_b
    // − q_len_b.
    rotate_q::<T>(opts.rope.as_ref(), &mut fq, d, hq, || bottom_right_positions(&cu, |b| data.seq_lens[b], q.dim(0)))?;
    let scale = scale_of(opts.scale, d);
    let run = |ar| paged_prefill(hq, opts.causal, scale, &var.view(), ar, &cu, &fq, &data.cache());
    judge(run, o, lse, PAGED_LSE_ATOL)
}

/// What both paged checks read first: the cache in f64, the variants (for `batch` sequences) and `q`.
fn paged_inputs<T: Element, C: KvElement>(
    q: &TensorView<'_, T, 3>,
    cache: &PagedKvCache<'_, C>,
    score_mod: &ScoreMod<'_>,
    batch: usize,
) -> Result<(PagedCacheData, HostVariants, Vec<f64>)> {
    let data = PagedCacheData::from_host(cache)?;
    let var = HostVariants::read(score_mod, batch, q.dim(1))?;
    Ok((data, var, host_f64("q", q)?))
}

/// Rotates the query rows `q` (tokens of `heads` rows of `d`) as the ops define it: in fp32 from the table,
/// rounded to T (the attention's operand; docs/rope.md), at `rope.positions` (one per token) or else at
/// `default_positions()`. Nothing without RoPE. Both the reference and the naive twin attend over that q, so
/// the rotation adds no slack to the tolerance.
fn rotate_q<T: Element>(
    rope: Option<&crate::rope::Rope<'_>>,
    q: &mut [f64],
    d: usize,
    heads: usize,
    default_positions: impl FnOnce() -> Vec<i64>,
) -> Result<()> {
    let Some(rope) = rope else { return Ok(()) };
    let table = super::RopeRef::from_view(rope)?;
    let positions: Vec<i64> = match rope.positions {
        Some(p) => host_elements("rope_positions", p)?.into_iter().map(i64::from).collect(),
        None => default_positions(),
    };
    table.rotate_lowp(q, d, heads, &positions, T::DTYPE);
    Ok(())
}

/// With `opts.rope_k`, rotates the key rows `k` (tokens of `heads` rows of `d`) as prefill does: like q
/// ([`rotate_q`]: fp32, rounded to T), at `rope_k.positions` (one per key token) or `default_positions()`.
fn rotate_k<T: Element>(
    opts: &PrefillOptions<'_>,
    k: &mut [f64],
    d: usize,
    heads: usize,
    default_positions: impl FnOnce() -> Vec<i64>,
) -> Result<()> {
    let (Some(rope), Some(keys)) = (opts.rope.as_ref(), opts.rope_k.as_ref()) else { return Ok(()) };
    rotate_q::<T>(Some(&crate::rope::Rope { positions: keys.positions, ..*rope }), k, d, heads, default_positions)
}

/// The bottom-right position of each of `rows` packed query tokens: token t of sequence b (`cu[b] <= t <
/// cu[b + 1]`) at `t − cu[b] + keys(b) − q_len_b`; tokens outside every sequence at 0.
fn bottom_right_positions(cu: &[i32], keys: impl Fn(usize) -> i32, rows: usize) -> Vec<i64> {
    let mut positions = vec![0i64; rows];
    for b in 0..cu.len().saturating_sub(1) {
        let (q0, q1) = (cu[b].max(0) as usize, (cu[b + 1].max(0) as usize).min(rows));
        let delta = i64::from(keys(b)) - i64::from(cu[b + 1] - cu[b]);
        for (t, pos) in positions.iter_mut().enumerate().take(q1).skip(q0) {
            *pos = (t - q0) as i64 + delta;
        }
    }
    positions
}

const PREFILL_LSE_ATOL: f64 = 1e-4;
const PAGED_LSE_ATOL: f64 = 1e-3;

/// Runs the reference (`run(Arith::F64)`) and its naive twin (`run(Arith::Lowp(T))`), then judges `o` under
/// [`compare_bounded`] (P and O rounded to `T`, as the kernels do) and `lse` within `atol + 16 u·|LSE|`.
fn judge<T: Element, const N: usize, const M: usize>(
    run: impl Fn(Arith) -> Result<Output>,
    o: &TensorView<'_, T, N>,
    lse: Option<&TensorView<'_, f32, M>>,
    atol: f64,
) -> Result<Check> {
    let exact = run(Arith::F64)?;
    let naive = run(Arith::Lowp(T::DTYPE))?.out;
    let bound = exact.out_bound(Some(T::DTYPE), Some(T::DTYPE));
    let out = compare_bounded(&host_f64("o", o)?, &exact.out, &naive, &bound);
    let lse = lse.map(|l| host_f32("lse", l)).transpose()?.map(|l| {
        let max = exact.lse.iter().filter(|x| x.is_finite()).fold(0.0f64, |a, x| a.max(x.abs()));
        compare_lse(&l, &exact.lse, atol + 16.0 * max / (1u64 << 24) as f64)
    });
    Ok(Check { out, lse })
}

/// The scale the kernels use: the caller's, or 1/sqrt(D) rounded to fp32 as the launchers compute it.
fn scale_of(scale: Option<f32>, head_dim: usize) -> f64 {
    f64::from(scale.unwrap_or(1.0 / (head_dim as f32).sqrt()))
}

/// A [`ScoreMod`]'s variants read back to the host and widened: what [`Variants`] borrows.
struct HostVariants {
    window: Option<(i64, i64)>,
    softcap: Option<f64>,
    /// `[Hq]` or `[B·Hq]`.
    alibi: Option<Vec<f64>>,
    /// `[Hq]`.
    sinks: Option<Vec<f64>>,
}

impl HostVariants {
    /// Reads `m` for `batch` sequences of `heads_q` query heads.
    fn read(m: &ScoreMod<'_>, batch: usize, heads_q: usize) -> Result<Self> {
        let alibi = match m.alibi_slopes {
            None => None,
            Some(AlibiSlopes::PerHead(s)) => Some(host_f32("alibi_slopes", s)?),
            Some(AlibiSlopes::PerSequence(s)) => {
                let v = host_f32("alibi_slopes", s)?;
                if s.shape() != [batch, heads_q] {
                    return Err(Error::shape(
                        "alibi_slopes",
                        format!("shape {:?}, expected [{batch}, {heads_q}]", s.shape()),
                    ));
                }
                Some(v)
            }
        };
        Ok(Self {
            window: m.window.map(|(l, r)| (i64::from(l), i64::from(r))),
            softcap: m.softcap.map(f64::from),
            alibi,
            sinks: m.sinks.map(|s| host_f32("sinks", s)).transpose()?,
        })
    }

    fn view(&self) -> Variants<'_> {
        Variants {
            window: self.window,
            softcap: self.softcap,
            alibi: self.alibi.as_deref(),
            sinks: self.sinks.as_deref(),
        }
    }
}

fn host_f64<T: Element, const N: usize>(name: &str, view: &TensorView<'_, T, N>) -> Result<Vec<f64>> {
    Ok(host_elements(name, view)?.into_iter().map(Element::to_f64).collect())
}

fn host_f32<const N: usize>(name: &str, view: &TensorView<'_, f32, N>) -> Result<Vec<f64>> {
    Ok(host_elements(name, view)?.into_iter().map(f64::from).collect())
}

/// A host view's elements in logical (row-major) order, whatever its strides.
pub(super) fn host_elements<E: Copy, const N: usize>(name: &str, view: &TensorView<'_, E, N>) -> Result<Vec<E>> {
    let Mem::Host(data) = &view.mem else {
        return Err(Error::backend(name, "the reference checks read host views: copy device data back first"));
    };
    Ok(crate::tensor::logical_elements(data, view.shape(), view.strides()))
}
